/* event.h — the events of CONTRACT.md §6: workers write them to stdout as NDJSON, the
 * server decodes them, stores them and forwards them. One encoder, one decoder. */
#ifndef DDPD_EVENT_H
#define DDPD_EVENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"

typedef enum {
    EVENT_START,
    EVENT_LOSS,
    EVENT_JOIN,
    EVENT_CHECKPOINT,
    EVENT_DONE,
    EVENT_ERROR,
    EVENT_EVAL,  /* held-out metrics (CONTRACT.md §2a) */
    EVENT_STATE, /* the server's own */
} event_kind;

#define EVENT_TEXT_MAX 1024
/* An encoded event never exceeds this (with its NUL): one 1023-byte string escaped
 * entirely as \u00XX takes 6138 bytes, and the other fields well under 2 KiB. */
#define EVENT_LINE_MAX 8192

/* Fields that a kind does not use are ignored by the encoder. `rank` is -1 for the
 * server's events. job/attempt/seq are added by the server: encoded only when
 * `has_server_fields`. */
struct event {
    event_kind kind;
    int rank;
    double ts; /* seconds since the epoch */
    /* start */
    int world_size;
    char device[16];
    int64_t params, batches;
    int64_t activation_bytes; /* the model's activation plan (0: not reported) */
    /* loss, join, checkpoint, done */
    int64_t step;         /* loss/join/checkpoint/eval: optimizer step (from 1) */
    int64_t epoch;        /* loss */
    double loss;          /* loss, done, eval */
    bool nonfinite;       /* loss/done: loss is NaN or inf, sent as null */
    double samples_per_s; /* loss */
    double lr;            /* loss: the lr that step used (when has_lr) */
    double grad_norm;     /* loss: the gradients' L2 norm before clipping (when has_grad_norm) */
    bool has_lr, has_grad_norm;
    double accuracy; /* eval, cross_entropy only (when has_accuracy) */
    bool has_accuracy;
    int64_t samples;           /* eval: rows evaluated over all ranks */
    int64_t steps;             /* done */
    double seconds;            /* done */
    char stop_reason[256];     /* done: why it ended before its last step ("early_stopped at
                                * step S (best S' = v)"); "" when it ran to its end: absent */
    char path[EVENT_TEXT_MAX]; /* checkpoint */
    /* error */
    char error_kind[16];          /* "spec", "data", "comm", "device", "cancelled", "nonfinite",
                                   * "io", "internal" */
    char message[EVENT_TEXT_MAX]; /* error; state: error text if any */
    bool secondary;               /* error: a consequence of another rank's failure (a peer's
                                   * notice or hang-up), not a cause: sent only when true */
    /* state */
    char state[16];
    /* added by the server */
    bool has_server_fields;
    int64_t job, attempt, seq;
};

const char *event_kind_name(event_kind k); /* "loss" */

/* True for the event that ends a job's stream: a `state` event whose state is final
 * (succeeded, failed or cancelled; job_state.h). */
bool event_is_final(const struct event *ev);

/* Writes one JSON object (no newline) into buf and returns its length, or -1 when
 * cap is too small. Strings are escaped; a non-finite loss is written as null with
 * "nonfinite": true. */
int event_encode(const struct event *ev, char *buf, size_t cap);

/* Decodes one line (len bytes, no newline needed). Unknown keys are ignored (forward
 * compatible); missing required keys, wrong types or an unknown "event" are DDPD_EJSON
 * or DDPD_ESPEC with err->path naming the key. */
ddpd_err event_decode(const char *line, size_t len, struct event *out, struct ddpd_error *err);

/* When the line is an error event, decodes it into *out and returns true. Any valid JSON
 * counts: spaces, key order, escapes. Cheap on the other kinds, which it does not decode
 * unless they hold the string "error" or a \u escape. */
bool event_error_decode(const char *line, size_t len, struct event *out);

/* When the line is an error event, copies its message into out (cap bytes) and returns
 * true. Any valid JSON counts: spaces, key order, escapes. Cheap on the other kinds, which
 * it does not decode unless they hold the string "error" or a \u escape. */
bool event_error_message(const char *line, size_t len, char *out, size_t cap);

#endif
