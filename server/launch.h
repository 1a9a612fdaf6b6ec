/* launch.h — starts one job attempt's processes and watches them: (later) the id issuer,
 * and one ddpd-worker per rank in one process group, each with its stdin document
 * (CONTRACT.md §5), its stdout read as NDJSON events and its stderr in OUT/rank-R.log.
 * The first rank that fails takes the group down (SIGTERM, SIGKILL after a grace
 * period). Shared by `ddpd run` and the server's supervisor; single-threaded. */
#ifndef DDPD_LAUNCH_H
#define DDPD_LAUNCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <poll.h>
#include <sys/types.h>

#include "../schema/err.h"

struct json_t;
struct slurm_opts;

struct launch_opts {
    const char *worker;        /* path of ddpd-worker */
    int world_size;
    const char *out_dir;       /* created; rank logs go to OUT/rank-R.log */
    struct json_t *doc;        /* borrowed: the stdin document without rank (added per rank) */
    double grace_s;            /* SIGTERM -> SIGKILL; default 5 */
    bool die_with_parent;      /* workers get SIGKILL when this process dies (ddpd run) */
    const char *const *gpus;   /* cuda jobs: rank r sees only GPU gpus[r] (its CUDA_VISIBLE_DEVICES:
                                  a device number or UUID; borrowed, valid until launch_free);
                                  NULL leaves the environment as it is */
    /* Called for every complete stdout line of a rank, in arrival order (line without
     * the newline, not NUL-terminated). May be NULL. */
    void (*on_line)(void *ctx, int rank, const char *line, size_t len);
    void *ctx;
    /* The Slurm backend (slurm.h): NULL runs the ranks here as child processes; else one
     * srun runs them as the tasks of Slurm job `slurm_name` (the issuer stays here), and
     * `cuda` asks Slurm for one GPU per task. */
    const struct slurm_opts *slurm;
    const char *slurm_name;
    bool cuda;
};

struct launch;

/* Starts every rank. NULL with `err` set when a process cannot be started. */
struct launch *launch_start(const struct launch_opts *o, struct ddpd_error *err);
/* Frees; kills (SIGKILL) and reaps whatever is still running. NULL is a no-op. */
void launch_free(struct launch *l);

/* Reads output, reaps exits, enforces the kill deadline. Waits up to timeout_ms for
 * something to happen. Returns true once every process has exited and every output
 * line has been delivered. */
bool launch_poll(struct launch *l, int timeout_ms);

/* Asks every rank to stop (SIGTERM to the group; SIGKILL after the grace period). */
void launch_cancel(struct launch *l);

/* After launch_poll returned true: DDPD_OK when every rank exited 0; else the first rank
 * that failed, its exit code (128+signal when killed) and the message of its last
 * `error` event (or a description of how it died). */
struct launch_result {
    bool ok;
    int rank;
    int exit_code;
    char message[1024];
};
void launch_result(const struct launch *l, struct launch_result *r);

pid_t launch_pgid(const struct launch *l);

/* True while a cluster manager holds the attempt pending (Slurm's queue), with its reason
 * in `why`; always false for local processes. */
bool launch_waiting(const struct launch *l, char *why, size_t cap);

#endif

/* The pid of rank r (0 before it started). */
pid_t launch_pid(const struct launch *l, int rank);

/* Adds the file descriptors launch_poll reads (POLLIN) to fds[0..cap) and returns how
 * many, so that one thread can wait on several launches at once and then call
 * launch_poll(l, 0) on each. */
int launch_fds(const struct launch *l, struct pollfd *fds, int cap);

/* Rank r's exit code once it has exited (128+signal when killed), else -1. */
int launch_exit_code(const struct launch *l, int rank);
