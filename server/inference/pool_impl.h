/* pool_impl.h — what the inference pool's files share (not part of pool.h's contract):
 * the model key, the choices of policy.c (which process takes a request, which idle
 * model goes to make room), one worker process's life and lines (worker.c), and the
 * pool's slots, tasks and state that pool.c (the queue, the threads, the public calls)
 * and run.c (one request on one slot) share. Nothing outside server/inference/ includes
 * this but the pool's unit test. */
#ifndef DDPD_INFER_POOL_IMPL_H
#define DDPD_INFER_POOL_IMPL_H

#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "../../schema/err.h"
#include "pool.h"

/* ---- the choices (policy.c): pure functions of a snapshot, no locks, no processes ----- */

/* A model as the pool tells them apart: the same weights file on the same kind of device. */
struct infer_key {
    int64_t job;
    int64_t step; /* -1: the final model */
    bool cuda;
};
bool infer__key_eq(const struct infer_key *a, const struct infer_key *b);

/* One process slot as the choices see it. */
struct infer_view {
    bool free;    /* neither running a request nor ending: it may take one */
    bool running; /* a process exists (started for cuda or not: `cuda`) */
    bool cuda;    /* its process was started on a GPU */
    bool loaded;  /* it holds a model: `key` */
    struct infer_key key;
    double last_used; /* monotonic seconds */
};

/* The slot that takes a request for model `want`, among the free ones: one that holds
 * it; else one without a model whose process (if any) is of want's device kind; else one
 * without a model of the other kind (its process is ended first); else the least recently
 * used one holding another model (its model is replaced; ties by the lower index). -1
 * when none is free. */
int infer__pick(const struct infer_view *v, int n, const struct infer_key *want);

/* The model to unload to make room: the least recently used free slot holding one, other
 * than slot `keep` (-1: none kept). -1 when there is none. */
int infer__victim(const struct infer_view *v, int n, int keep);

/* ---- one worker process (worker.c) ------------------------------------------------------ */

struct infer_proc {
    pid_t pid; /* 0: none */
    int in_fd, out_fd;
    char *buf;              /* what was read: buf[0 .. len), of which the first `taken` bytes are the */
    size_t len, cap, taken; /* line handed out last */
};

/* Starts `worker --infer` with stdin and stdout piped, stderr appended to `log` (the
 * previous log kept as LOG.1), the allow-listed environment (env.h) plus
 * OPENBLAS_NUM_THREADS=1 and OMP_NUM_THREADS=1 and, when `gpu_device` is not NULL,
 * CUDA_VISIBLE_DEVICES=gpu_device; niced by `nice`. DDPD_EIO naming the worker. */
ddpd_err infer__proc_start(struct infer_proc *c, const char *worker, const char *log, const char *gpu_device,
                           int nice, struct ddpd_error *err);

/* Writes `line` (a JSON object's text, without its newline) and a newline. False when
 * the process no longer reads (it died). */
bool infer__proc_send(struct infer_proc *c, const char *line);

/* The outcome of infer__proc_read. */
enum infer_read {
    INFER_READ_LINE,    /* *line is the next line (NUL-terminated, valid until the next read) */
    INFER_READ_NONE,    /* nothing within wait_s */
    INFER_READ_EOF,     /* the process closed its stdout (it ended) */
    INFER_READ_TOOLONG, /* a line longer than `max` bytes */
};
/* The next line of the process's stdout, waiting up to wait_s. */
enum infer_read infer__proc_read(struct infer_proc *c, double wait_s, size_t max, char **line);

/* Ends the process: its stdin closed (EOF ends its loop), then SIGKILL if it has not
 * exited within `grace_s`; reaped. Its exit in why[cap] ("exited with status 3", "was
 * killed by signal 9 (Killed)"). A no-op without a process. */
void infer__proc_end(struct infer_proc *c, double grace_s, char *why, size_t cap);

/* ---- the pool (pool.c) and a request on a slot (run.c) ------------------------------------ */

#define HOUSEKEEP_S    0.25 /* the housekeeper's period: queue deadlines, idle and doomed models */
#define READ_SLICE_S   0.1  /* how often a running request looks whether its client has gone */
#define END_GRACE_S    2.0  /* EOF on stdin to SIGKILL, for a process that is ended */
#define FORGOTTEN      64   /* deleted jobs remembered, so a request racing the delete is refused */
#define SIZES          64   /* models whose resident bytes are remembered, for the room to make */
#define LOAD_MAX_BATCH 64   /* predict's batch bound, the load request's max_batch */
#define GPU_RETRY_S    5    /* Retry-After when no GPU is free */

enum slot_state { SLOT_FREE, SLOT_BUSY, SLOT_ENDING };

/* A request, queued or running. */
struct task {
    struct infer_key key;
    char *weights, *spec;
    char *data_dir; /* the tokenizer's data folder for load; NULL: none */
    char *request;  /* the worker's request line, without its newline */
    char *upload;   /* a file of the pool's folder, removed with the task; NULL: none */
    char op[16];    /* the request's "op", for the status */
    struct infer_sink sink;
    double deadline; /* monotonic: it must have started by then */
    struct task *next;
};

struct slot {
    int index;
    enum slot_state state;
    struct infer_proc proc; /* the owner's alone (see the file's comment) */
    /* Under mu: */
    pid_t pid;
    bool cuda_proc; /* its process was started on a GPU (gpu) */
    int gpu;        /* the GPU slot (super_gpu_take) it holds, -1 none */
    bool loaded;    /* it holds a model: key */
    bool doomed;    /* its job was deleted: end it, never give it a request */
    struct infer_key key;
    int64_t resident; /* the model's resident_bytes */
    double last_used; /* monotonic */
    double used_wall; /* the same, wall clock (status) */
    double loaded_wall;
    const char *op; /* the running request's op (points into its task), NULL when none */
    uint64_t served;
};

struct infer_pool {
    struct infer_pool_opts o;
    char *worker, *dir;
    pthread_mutex_t mu;
    pthread_cond_t cv;    /* runners: a task queued, a slot freed, stopping */
    pthread_cond_t hk_cv; /* the housekeeper: something to end, stopping */
    struct slot *slots;
    struct task *head, *tail;
    int waiting, running;
    pthread_t *threads;
    int nthreads;
    pthread_t hk;
    bool hk_started;
    bool stop;         /* infer_pool_stop: no new request, the running ones cancelled */
    bool stop_threads; /* infer_pool_free: the threads end */
    struct infer_pool_stats st;
    int64_t forgotten[FORGOTTEN];
    unsigned nforgotten;
    struct {
        struct infer_key key;
        int64_t bytes;
    } sizes[SIZES];
    unsigned nsizes;
    unsigned upload_seq;
};

/* pool.c: whether t's client has gone (or the pool stops). Not under mu. */
bool infer__task_gone(struct infer_pool *p, struct task *t);
/* pool.c: "job 3's final model" / "job 3's checkpoint at step 40" into buf[cap]. */
const char *infer__model_name(const struct infer_key *k, char *buf, size_t cap);
/* pool.c: ends slot s's process (the caller owns s: BUSY or ENDING), gives its GPU back;
 * its exit into why[cap] (may be NULL). Not under mu. */
void infer__end_process(struct infer_pool *p, struct slot *s, double grace, char *why, size_t cap);
/* pool.c: makes room for `need` more bytes beside the other loaded models (slot s's own
 * not counted): idle ones ended, least recently used first. Not under mu. */
void infer__make_room(struct infer_pool *p, struct slot *s, int64_t need);

/* run.c: slot s (owned by the caller) holds t's model when this returns DDPD_OK: its
 * process started (on a GPU it took for a cuda model), the model loaded. *retry set for a
 * 503 the client may retry (no GPU free). */
ddpd_err infer__ensure_model(struct infer_pool *p, struct slot *s, struct task *t, int *retry,
                             struct ddpd_error *err);
/* run.c: t's request on slot s (which holds its model): its stream lines to the sink, the
 * final answer into *answer (a new reference, without "ok" and "op"). */
ddpd_err infer__exchange(struct infer_pool *p, struct slot *s, struct task *t, json_t **answer,
                         struct ddpd_error *err);

#endif
