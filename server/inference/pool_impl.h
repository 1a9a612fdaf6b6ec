/* pool_impl.h — what the inference pool's files share (not part of pool.h's contract):
 * the model key, the choices of policy.c (which process takes a request, which idle
 * model goes to make room), and one worker process's life and lines (worker.c). Nothing
 * outside server/inference/ includes this but the pool's unit test. */
#ifndef DDPD_INFER_POOL_IMPL_H
#define DDPD_INFER_POOL_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "../../schema/err.h"

struct json_t;

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

#endif
