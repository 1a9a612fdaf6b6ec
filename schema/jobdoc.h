/* jobdoc.h — the worker's stdin document (CONTRACT.md §5, schema/README.md "Worker
 * input"): what a launcher hands every rank. One encoder (the server's supervisor and
 * `ddpd run`), one decoder (the worker). Knows no processes, no files, no sockets. */
#ifndef DDPD_JOBDOC_H
#define DDPD_JOBDOC_H

#include <stdint.h>

#include "err.h"
#include "spec.h"

struct json_t;

/* The longest path the document carries, and the longest group id (hex), with the NUL. */
#define JOBDOC_PATH_MAX    4096
#define JOBDOC_COMM_ID_MAX 512

/* A plain value. Strings are "" when the document has null or nothing there. */
struct jobdoc {
    int64_t job;                      /* 0 under `ddpd run` */
    int64_t attempt;                  /* from 1 */
    int world_size;                   /* 1..SPEC_MAX_WORLD, equal to spec.world_size */
    int rank;                         /* -1: none (under Slurm every task gets the same document) */
    char comm_backend[8];             /* "cpu" or "nccl": the group to join; "" (null) for one rank */
    char comm_id[JOBDOC_COMM_ID_MAX]; /* the group's id as hex; "" with no group */
    struct spec spec;
    char data_dir[JOBDOC_PATH_MAX];
    char out_dir[JOBDOC_PATH_MAX];
    char resume[JOBDOC_PATH_MAX]; /* the checkpoint folder to resume from; "" for none */
    int64_t disk_quota;           /* bytes the job folder may hold; 0 for no quota (null) */
    int64_t max_rank_memory;      /* bytes one rank may need; 0 for no limit (absent) */
    /* init.from_job's weights: a model.safetensors in the server's jobs folder, resolved by
     * the server (never a path from the spec); "" for none (left out of the document). */
    char init_path[JOBDOC_PATH_MAX];
};

/* The document as a JSON object: a new reference, or NULL when memory ran out. `rank` is
 * left out when -1, `comm` is null when comm_backend is "", `resume` and `disk_quota` are
 * null when unset, `max_rank_memory` is left out when 0. */
struct json_t *jobdoc_to_json(const struct jobdoc *d);

/* Decodes `obj` (borrowed) into *out. DDPD_ESPEC with err->path naming the key ("rank",
 * "spec", "comm", or the spec's own path) and a message that names it too, for a value of
 * the wrong type or out of range, a missing spec, a world_size the spec disagrees with, or
 * more than one rank without {"backend": "cpu" or "nccl", "id": "<hex>"} in `comm` (read
 * only then); the spec's errors are spec_from_json's. Unknown keys are ignored. On error
 * the keys decoded before the bad one are set (world_size, then rank), so the worker can
 * say which rank failed. */
ddpd_err jobdoc_from_json(const struct json_t *obj, struct jobdoc *out, struct ddpd_error *err);

#endif
