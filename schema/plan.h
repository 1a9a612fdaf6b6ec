/* plan.h (schema) — the planner's two lines (schema/README.md "Planner"): the server
 * writes one request line to `ddpd-worker --plan` and reads one answer line back. One
 * encoder and one decoder for each; the processes and deadlines are server/plan.c's.
 * Knows no processes, no files. */
#ifndef DDPD_SCHEMA_PLAN_H
#define DDPD_SCHEMA_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "jobdoc.h"
#include "spec.h"

struct json_t;

/* {world_size, spec, data_dir, max_rank_memory}: a job's spec and data to check before it
 * is queued. A job document (jobdoc.h) is a valid request too (its other keys ignored). */
struct plan_request {
    int world_size; /* 1..SPEC_MAX_WORLD */
    struct spec spec;
    char data_dir[JOBDOC_PATH_MAX]; /* "" reads as "." */
    int64_t max_rank_memory;        /* 0: no limit */
    /* init.from_job's weights as the server found them in its jobs folder; "" for none */
    char init_path[JOBDOC_PATH_MAX];
};

/* A new reference, or NULL when memory ran out. */
struct json_t *plan_request_to_json(const struct plan_request *r);

/* Decodes `obj` (borrowed). DDPD_ESPEC naming the key for a wrong or missing value; the
 * spec's errors are spec_from_json's. */
ddpd_err plan_request_from_json(const struct json_t *obj, struct plan_request *out, struct ddpd_error *err);

/* The answer: every rank's batches per epoch ({"batches":[...]}), or "only the ranks can
 * tell" ({"batches":null}: {rank} files), or the error a rank would die of (an `error`
 * event line, with "path": the spec field of a spec error). */
struct plan_answer {
    ddpd_err code; /* DDPD_OK, or the error (DDPD_ESPEC / DDPD_EDATA as read back) */
    bool known;    /* with DDPD_OK: batches[0..world_size) are set */
    int world_size;
    int64_t batches[SPEC_MAX_WORLD];
    char path[256];     /* with an error: the spec field, or "" */
    char message[1024]; /* with an error: the sentence */
};

/* The answer as one line without its newline: a new string the caller frees, or NULL when
 * memory ran out (or an error's line cannot be encoded). `ts` stamps an error event. */
char *plan_answer_encode(const struct plan_answer *a, double ts);

/* Decodes an answer line (len bytes) of a plan of `world_size` ranks. False when it is
 * none of the three forms: not JSON, batches of another length or not counts, or an
 * event other than `error`. An error event's kind "data" reads as DDPD_EDATA, any other
 * as DDPD_ESPEC. */
bool plan_answer_decode(const char *line, size_t len, int world_size, struct plan_answer *out);

#endif
