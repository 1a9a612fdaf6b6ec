/* pool.h — the inference pool: long-lived `ddpd-worker --infer` processes (the protocol:
 * docs/architecture.md, "How an inference request flows"), each holding at most one job's
 * model, and the requests that run on them. It routes a request to a process that holds
 * its model, else to an idle one (whose model it replaces), else starts one, up to
 * `procs`; past `queue` waiting requests it refuses (503); it keeps the loaded models'
 * resident bytes under `memory` by ending the least recently used idle ones, ends a
 * model idle for `idle_s`, kills a worker silent for `timeout_s` with a request, replaces
 * one that died, sends `cancel` when the client has gone, and holds a GPU slot of the
 * supervisor (super_gpu_take) while a cuda model is loaded, giving it up when idle as soon
 * as a job waits for a GPU.
 *
 * Knows no HTTP and no SQL: the caller (api_infer.c) resolves the job's model, builds the
 * worker's request and binds the answer to its HTTP request through a sink of callbacks.
 * Thread-safe; nothing here blocks its caller on a process: the pool's own threads (one
 * per process, and a housekeeper) talk to the workers. The program ignores SIGPIPE (ddpd
 * serve does): a worker that died is a failed write. */
#ifndef DDPD_INFER_POOL_H
#define DDPD_INFER_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../../schema/err.h"

struct json_t;
struct super;
struct infer_pool;

/* Bounds of the options (`ddpd serve --infer-*`). */
#define INFER_PROCS_MAX 64
#define INFER_QUEUE_MAX 4096

struct infer_pool_opts {
    const char *worker; /* the program, run as `WORKER --infer` (copied) */
    const char *dir;    /* the processes' logs (worker-N.log) and uploads; made 0700 (copied) */
    int procs;          /* processes at most, 1 .. INFER_PROCS_MAX: the concurrency bound */
    int queue;          /* requests that may wait beyond the running ones, 0 .. INFER_QUEUE_MAX */
    int64_t memory;     /* cap on the loaded models' resident_bytes, > 0 */
    double idle_s;      /* a model unused this long is unloaded (its process ended), > 0 */
    /* A worker that writes nothing this long while it has a request (a load, the next
     * token, a prediction) is hung: it is killed and the request answered 504. Also the
     * longest a request waits in the queue (then 503). > 0. */
    double timeout_s;
    size_t line_max;     /* the longest line a worker may answer (bytes) */
    int nice;            /* added to the workers' niceness (0 .. 19) */
    struct super *super; /* GPU slots for device cuda (borrowed); NULL: no cuda */
};

/* Which model a request runs on. Strings borrowed for the call. */
struct infer_model {
    int64_t job;
    int64_t step; /* the checkpoint's step, or -1 for the final model */
    bool cuda;
    const char *weights;  /* absolute path of its model.safetensors */
    const char *spec;     /* the job's spec as stored (JSON text) */
    const char *data_dir; /* the data folder of the spec's tokenizer files; NULL without one */
};

/* How the caller hears of its request, on a pool thread. */
struct infer_sink {
    /* A line the worker streamed before its answer (a token), borrowed for the call; may
     * be NULL. */
    void (*line)(void *ctx, struct json_t *line);
    /* Polled while the request waits and between the worker's lines: true once the client
     * has gone. A waiting request is then dropped; a running one gets `cancel`. */
    bool (*gone)(void *ctx);
    /* Called exactly once, last: DDPD_OK with the worker's answer (borrowed, without its
     * "ok" and "op"), or the error (`err` borrowed; `retry_after_s` > 0 for a 503 the
     * client may retry then). The pool never uses ctx afterwards. */
    void (*done)(void *ctx, ddpd_err rc, struct json_t *answer, const struct ddpd_error *err,
                 int retry_after_s);
    void *ctx;
};

/* Makes the pool's folder and the pool; starts no process or thread yet. On DDPD_OK *out
 * is the pool (infer_pool_free). DDPD_EIO naming the folder, DDPD_ENOMEM. */
ddpd_err infer_pool_new(const struct infer_pool_opts *o, struct infer_pool **out, struct ddpd_error *err);

/* No new request from now on (503); those waiting are answered 503 and the running ones
 * get `cancel`. Returns at once: each is answered within its deadline. Any thread. */
void infer_pool_stop(struct infer_pool *p);

/* Stops (infer_pool_stop), waits for the pool's threads (each running request within its
 * deadline), ends every process and gives its GPU back. NULL is a no-op. */
void infer_pool_free(struct infer_pool *p);

/* Queues a request on model `m`: `request` (malloc'd, stolen, also on error) is the
 * worker's request line without its newline ({"op": "generate", ...}: one JSON object),
 * `op` its op (for the status); `upload` (NULL: none) is a file in the pool's folder
 * (infer_pool_upload_path) the request names, removed once the request is done (the caller
 * removes it when this fails). On DDPD_OK
 * the sink's done is called exactly once, on a pool thread, possibly before this returns
 * (answer-ready first: http_defer). Errors, done never called: DDPD_EBUSY with
 * *retry_after_s when `queue` requests wait already or the pool stops; DDPD_ENOTFOUND when
 * job m->job was deleted (infer_pool_forget_job); DDPD_ENOMEM, DDPD_EINTERNAL. */
ddpd_err infer_pool_submit(struct infer_pool *p, const struct infer_model *m, char *request, const char *op,
                           const char *upload, const struct infer_sink *sink, int *retry_after_s,
                           struct ddpd_error *err);

/* A fresh file name for an upload in the pool's folder, into path[cap], and the file
 * created (0600, empty) and open for writing: its descriptor, or -1 with errno. */
int infer_pool_upload_path(struct infer_pool *p, char *path, size_t cap);

/* Job `job` was deleted: its waiting requests are answered 404, its models unloaded
 * (each process ended once its running request is done), and a later submit for it is
 * refused. Returns at once. Any thread. */
void infer_pool_forget_job(struct infer_pool *p, int64_t job);

/* GET /v1/inference: the processes (state, pid, the model each holds), the queue, the
 * memory, the counters. A new reference. */
struct json_t *infer_pool_status(struct infer_pool *p);

/* The pool's lines of /metrics (Prometheus text with # HELP and # TYPE): a new string the
 * caller frees, NULL when out of memory. */
char *infer_pool_metrics(struct infer_pool *p);

/* The counters (status and metrics). */
struct infer_pool_stats {
    uint64_t requests;  /* accepted by infer_pool_submit */
    uint64_t rejected;  /* refused with 503 (queue full, no GPU, shutting down) */
    uint64_t evictions; /* models unloaded for room, for idleness or a deleted job */
    uint64_t cancels;   /* requests whose client went away (cancel sent, or dropped waiting) */
    uint64_t failures;  /* workers that died or hung with a request */
    uint64_t loads;     /* models loaded */
};
void infer_pool_stats_get(struct infer_pool *p, struct infer_pool_stats *out);

#endif
