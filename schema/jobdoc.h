/* jobdoc.h — what `ddpd-worker` reads on stdin and the planner's answer to it
 * (CONTRACT.md §5, schema/README.md "Worker input" and "Planner"): the document a launcher
 * hands every rank, which is also the planner's request, and the planner's answer line.
 * One encoder and one decoder for each. Knows no processes, no files, no sockets. */
#ifndef DDPD_JOBDOC_H
#define DDPD_JOBDOC_H

#include <stdbool.h>
#include <stddef.h>
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
    /* Resume even where a data file changed since that checkpoint (its fingerprints,
     * worker/fingerprint.h); false (left out of the document) checks them. */
    bool resume_force;
    int64_t disk_quota;      /* bytes the job folder may hold; 0 for no quota (null) */
    int64_t max_rank_memory; /* bytes one rank may need; 0 for no limit (absent) */
    /* init.from_job's weights: a model.safetensors in the server's jobs folder, resolved by
     * the server (never a path from the spec); "" for none (left out of the document). */
    char init_path[JOBDOC_PATH_MAX];
    /* A pause (a sweep's ASHA rung): the ranks stop after this step with its checkpoint
     * written (OUT/ckpt-S) and no final model, the schedules still those of the spec's
     * steps; 0 for none (left out of the document). */
    int64_t stop_at;
};

/* The document as a JSON object: a new reference, or NULL when memory ran out. `rank` is
 * left out when -1, `comm` is null when comm_backend is "", `resume` and `disk_quota` are
 * null when unset, `max_rank_memory` and `stop_at` are left out when 0, `resume_force` when false. */
struct json_t *jobdoc_to_json(const struct jobdoc *d);

/* Decodes `obj` (borrowed) into *out. DDPD_ESPEC with err->path naming the key ("rank",
 * "spec", "comm", or the spec's own path) and a message that names it too, for a value of
 * the wrong type or out of range, a missing spec, a world_size the spec disagrees with, or
 * more than one rank without {"backend": "cpu" or "nccl", "id": "<hex>"} in `comm` (read
 * only then); the spec's errors are spec_from_json's. Unknown keys are ignored. On error
 * the keys decoded before the bad one are set (world_size, then rank), so the worker can
 * say which rank failed. */
ddpd_err jobdoc_from_json(const struct json_t *obj, struct jobdoc *out, struct ddpd_error *err);

/* ---- the planner's request (ddpd-worker --plan's stdin) ------------------------------------
 * The request is a job document, one per line: the server sends world_size, spec, data_dir,
 * max_rank_memory and init_path, with rank -1, no comm, out_dir "" and resume "" (the
 * keys the planner does not need, at their "none" values); for POST .../resume it sends
 * the checkpoint as `resume` (and resume_force), and the planner checks the files every
 * rank reads against the checkpoint's data fingerprints (and skips init.from, which a
 * resume does not start from). `ddpd run` sends the document its ranks get, before it
 * has a group. The rule that tells the two readings apart is the
 * decoder's, not the rank's (a Slurm document has rank -1 and needs its comm):
 * jobdoc_plan_from_json never reads `comm` (comm_backend and comm_id stay ""), so a
 * request of more than one rank needs no group; every other key is read and checked as
 * jobdoc_from_json does, the world_size the spec's included. An empty data_dir is the
 * planner's working folder. */
ddpd_err jobdoc_plan_from_json(const struct json_t *obj, struct jobdoc *out, struct ddpd_error *err);

/* ---- the planner's answer (ddpd-worker --plan's stdout) ------------------------------------
 * Every rank's batches per epoch ({"batches":[...]}), or "only the ranks can tell"
 * ({"batches":null}: {rank} files), or the error a rank would die of (an `error` event
 * line, with "path": the spec field of a spec error or a changed file, and "code": the API
 * code of the error, read back when it is one of a rank's, exit code 2). */
struct jobdoc_plan_answer {
    ddpd_err code; /* DDPD_OK, or the error (DDPD_ESPEC / DDPD_EDATA / DDPD_EDATACHANGED) */
    bool known;    /* with DDPD_OK: batches[0..world_size) are set */
    int world_size;
    int64_t batches[SPEC_MAX_WORLD];
    char path[256];     /* with an error: the spec field, or "" */
    char message[1024]; /* with an error: the sentence */
};

/* The answer as one line without its newline: a new string the caller frees, or NULL when
 * memory ran out (or an error's line cannot be encoded). `ts` stamps an error event. */
char *jobdoc_plan_answer_encode(const struct jobdoc_plan_answer *a, double ts);

/* Decodes an answer line (len bytes) of a plan of `world_size` ranks. False when it is
 * none of the three forms: not JSON, batches of another length or not counts, or an
 * event other than `error`. An error event's "code" reads as that error when it is a
 * rank's (exit code 2); without one, kind "data" reads as DDPD_EDATA, any other as
 * DDPD_ESPEC. */
bool jobdoc_plan_answer_decode(const char *line, size_t len, int world_size, struct jobdoc_plan_answer *out);

#endif
