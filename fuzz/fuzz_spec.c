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

/* The size questions of a parsed spec, with its own sizes and at the extremes: no
 * overflow (UBSan), every figure in range, a batch never larger than the shard. */
static void check_sizes(const struct spec *s)
{
    const int64_t rows_cases[] = {0, 1, s->batch_size, s->data.samples, INT64_MAX};
    for (size_t i = 0; i < sizeof rows_cases / sizeof rows_cases[0]; i++) {
        const int64_t rows = rows_cases[i];
        for (int r = 0; r<s->world_size; r += s->world_size> 8 ? s->world_size / 4 : 1) {
            int64_t shard = spec_shard_rows(rows, r, s->world_size);
            int64_t nb = spec_batches(shard, s->batch_size, s->data.drop_last);
            int64_t br = spec_batch_rows(s, shard);
            if (shard < 0 || shard > rows || nb < 0 || nb > shard || br < 1 || br > s->batch_size ||
                (shard > 0 && br > shard)) {
                fprintf(stderr, "sizes out of range: rows %lld rank %d shard %lld batches %lld rows %lld\n",
                        (long long)rows, r, (long long)shard, (long long)nb, (long long)br);
                abort();
            }
        }
        for (int rank_file = 0; rank_file < 2; rank_file++) {
            struct spec_memory m;
            struct ddpd_error err;
            spec_memory_estimate(s, &(struct spec_memory_in){rows, rank_file, rows, rows, rank_file}, &m);
            const int64_t *f = &m.rows;
            for (size_t k = 0; k < sizeof m / sizeof m.rows; k++)
                if (f[k] < 0) {
                    fprintf(stderr, "memory estimate field %zu is negative\n", k);
                    abort();
                }
            if (m.host > m.total || m.device > m.total) {
                fprintf(stderr, "memory estimate: host %lld device %lld total %lld\n", (long long)m.host,
                        (long long)m.device, (long long)m.total);
                abort();
            }
            ddpd_err rc = spec_memory_check(s, &m, 1 << 30, "limit", DDPD_ESPEC, &err);
            if (rc != DDPD_OK && (rc != DDPD_ESPEC || !err.path[0] || !err.message[0]))
                abort();
        }
    }
    if (spec_param_count(s) < 0)
        abort();
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
        check_sizes(&s);
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
