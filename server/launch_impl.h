/* launch_impl.h — what a launcher backend implements (launch.h is what its users see), in
 * the style of worker/dev.h's `struct dev_ops`: a `static const` table with designated
 * initialisers, an instance is {ops, ctx}, optional slots may be NULL and launch.c
 * supplies the default. A new backend (Kubernetes, say) is one file with its table and
 * its constructor; launch.c, the supervisor and the API stay as they are. */
#ifndef DDPD_LAUNCH_IMPL_H
#define DDPD_LAUNCH_IMPL_H

#include <jansson.h>

#include "../schema/jobdoc.h"
#include "cause.h"
#include "launch.h"

struct launch_ops {
    const char *name;
    bool queues; /* launcher_queues */

    /* One attempt of o->world_size ranks. `doc` (borrowed for the call, the backend's to
     * change): the stdin document every rank gets, with its comm set and rank -1 (the
     * backend names each rank or leaves it to the cluster manager). `*pgid`: the process
     * group to join (the issuer's), 0 for a new one, which the backend then sets. Returns
     * the backend's attempt (freed with `free`), or NULL with `err` set. */
    void *(*start)(void *ctx, const struct launch_opts *o, struct jobdoc *doc, pid_t *pgid,
                   struct ddpd_error *err);
    bool (*poll)(void *run, int timeout_ms);                    /* launch_poll */
    int (*fds)(const void *run, struct pollfd *fds, int cap);   /* launch_fds */
    void (*cancel)(void *run);                                  /* launch_cancel */
    void (*preempt)(void *run);                                 /* launch_preempt */
    void (*result)(const void *run, struct launch_result *res); /* launch_result */
    int (*exit_code)(const void *run, int rank);                /* launch_exit_code */
    pid_t (*pid)(const void *run, int rank);                    /* optional: 0 */
    bool (*waiting)(const void *run, char *why, size_t cap);    /* optional: never waits */
    void (*free)(void *run);                                    /* kills what still runs */

    /* The policy the supervisor asks of its launcher (launch.h's launcher_*); only
     * recover_orphans is optional (NULL: nothing to recover). */
    bool (*fits)(void *ctx, const struct sched *s, device_kind kind, int world, char *why, size_t cap);
    bool (*pending_reason)(void *ctx, const struct sched *s, int64_t job, char *buf, size_t cap);
    json_t *(*devices_json)(void *ctx, const struct sched *s);
    void (*recover_orphans)(void *ctx, const struct launch_orphan *o, size_t n);
    void (*free_ctx)(void *ctx); /* optional */
};

struct launcher {
    const struct launch_ops *ops;
    void *ctx;
};

/* A launcher for a backend's table and context (steals ctx); NULL when out of memory. */
struct launcher *launch__new(const struct launch_ops *ops, void *ctx);

/* What every backend does with one complete line of a rank's stdout (without its
 * newline): notes it in `end` when it is an `error` event (cause_note_line), for
 * launch_result's choice and message, and hands it to o->on_line. An empty line is
 * dropped. */
void launch__deliver(const struct launch_opts *o, int rank, const char *line, size_t len,
                     struct cause_rank *end);

/* The local backend's table: launch_opts.launcher NULL means it. */
extern const struct launch_ops launch__local_ops;

#endif
