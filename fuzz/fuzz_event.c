/* fuzz_event.c — the NDJSON event decoder (schema/event.c) on any line, as the server reads
 * a worker's stdout. A line is either an error with its detail, or an event whose encoding
 * fits EVENT_LINE_MAX and decodes again; from there encoding is a fixed point. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "schema/event.h"

static void encode(const struct event *ev, char *buf, const char *what)
{
    if (event_encode(ev, buf, EVENT_LINE_MAX) < 0) {
        fprintf(stderr, "%s: a decoded event does not encode within EVENT_LINE_MAX\n", what);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct event ev, ev2;
    static char line[EVENT_LINE_MAX], line2[EVENT_LINE_MAX];
    struct ddpd_error err;
    ddpd_err rc = event_decode((const char *)data, size, &ev, &err);
    /* The launchers' shortcut agrees with the decoder: true exactly for error events. */
    static char msg[EVENT_TEXT_MAX];
    bool is_error = event_error_message((const char *)data, size, msg, sizeof msg);
    if (is_error != (rc == DDPD_OK && ev.kind == EVENT_ERROR) || (is_error && strcmp(msg, ev.message))) {
        fprintf(stderr, "event_error_message says %d, event_decode %s\n", is_error, ddpd_err_name(rc));
        abort();
    }
    if (rc != DDPD_OK) {
        if ((rc != DDPD_EJSON && rc != DDPD_ESPEC) || err.code != rc || !err.message[0]) {
            fprintf(stderr, "event_decode: %s without its detail\n", ddpd_err_name(rc));
            abort();
        }
        return 0;
    }
    /* Also without an error struct, as the launcher calls it. */
    if (event_decode((const char *)data, size, &ev2, NULL) != DDPD_OK)
        abort();
    encode(&ev, line, "first");
    /* Strings may hold \u0000, which the encoder ends at: one round trip settles that. */
    rc = event_decode(line, strlen(line), &ev2, &err);
    if (rc != DDPD_OK) {
        fprintf(stderr, "an encoded event does not decode: %s\n%s\n", err.message, line);
        abort();
    }
    encode(&ev2, line2, "second");
    rc = event_decode(line2, strlen(line2), &ev, &err);
    if (rc != DDPD_OK)
        abort();
    encode(&ev, line, "third");
    if (strcmp(line, line2) != 0) {
        fprintf(stderr, "encoding is not a fixed point:\n%s\n%s\n", line2, line);
        abort();
    }
    return 0;
}
