/* fuzz_spec.c — the job spec parser and validator (schema/spec.c) on any bytes, as
 * POST /v1/jobs and `ddpd run` hand them over. Every input either fails with an error that
 * names a code and a sentence, or parses; a parsed spec must print and parse back to the
 * same text (spec_to_json's promise), under both default devices. */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "schema/spec.h"

static void check_error(ddpd_err rc, const struct ddpd_error *err)
{
    if (rc != DDPD_EJSON && rc != DDPD_ESPEC && rc != DDPD_ETOOBIG) {
        fprintf(stderr, "spec_parse returned %s\n", ddpd_err_name(rc));
        abort();
    }
    if (err->code != rc || !err->message[0] || !memchr(err->message, '\0', sizeof err->message)) {
        fprintf(stderr, "spec_parse: error %s without its detail\n", ddpd_err_name(rc));
        abort();
    }
    if (rc == DDPD_EJSON && (err->line < 1 || err->column < 1)) {
        fprintf(stderr, "malformed JSON without a line and column: %s\n", err->message);
        abort();
    }
}

static char *print(const struct spec *s)
{
    json_t *j = spec_to_json(s);
    char *text = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(j);
    if (!text)
        abort();
    return text;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct spec s, back; /* about 200 KiB each: not on the stack */
    struct ddpd_error err;
    for (int dev = 0; dev < 2; dev++) {
        struct spec_parse_opts opts = {.default_device = dev ? DEVICE_CUDA : DEVICE_CPU};
        ddpd_err rc = spec_parse((const char *)data, size, &opts, &s, &err);
        if (rc != DDPD_OK) {
            check_error(rc, &err);
            continue;
        }
        char *text = print(&s);
        rc = spec_parse(text, strlen(text), &opts, &back, &err);
        if (rc != DDPD_OK) {
            fprintf(stderr, "a printed spec does not parse back: %s: %s\n%s\n", ddpd_err_name(rc),
                    err.message, text);
            abort();
        }
        char *again = print(&back);
        if (strcmp(text, again) != 0) {
            fprintf(stderr, "the spec changed on a round trip:\n%s\n%s\n", text, again);
            abort();
        }
        free(again);
        free(text);
    }
    return 0;
}
