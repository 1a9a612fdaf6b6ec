/* launch.h — starts one job attempt's processes and watches them, through a launcher: a
 * backend that runs the ranks (launch_local.c: child processes of this host; launch_slurm.c:
 * the tasks of one srun) behind one table (launch_impl.h). launch.c keeps what every backend
 * shares: the id issuer (`ddpd-worker --issue-id`, on this host, leading the attempt's
 * process group) and the dispatch. Each rank gets its stdin document (CONTRACT.md §5), its
 * stdout is read as NDJSON events and its stderr goes to OUT/rank-R.log; the first rank
 * that fails takes the attempt down (SIGTERM, SIGKILL after a grace period).
 * Shared by `ddpd run` and the server's supervisor; single-threaded, except the launcher
 * policy functions, which are pure and take the caller's scheduler. */
#ifndef DDPD_LAUNCH_H
#define DDPD_LAUNCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <poll.h>
#include <sys/types.h>

#include "../schema/err.h"
#include "../schema/spec.h"

struct json_t;
struct jobdoc;
struct sched;
struct launcher;

struct launch_opts {
    const struct launcher *launcher; /* borrowed; NULL: launch_local, ranks as child processes */
    const char *worker;              /* path of ddpd-worker */
    int world_size;
    const char *out_dir;      /* created; rank logs go to OUT/rank-R.log */
    const struct jobdoc *doc; /* borrowed: the stdin document; its rank and comm are the
                                 launcher's to set (schema/jobdoc.h) */
    double grace_s;           /* SIGTERM -> SIGKILL; default 5 */
    double preempt_grace_s;   /* a cluster manager's signal before its preemption or time limit
                                 (Slurm's --signal=USR1@G): seconds, the server's default for a
                                 spec whose preempt_grace is 0; 0 here: LAUNCH_PREEMPT_GRACE_S */
    bool die_with_parent;     /* workers get SIGKILL when this process dies (ddpd run) */
    const char *const *gpus;  /* cuda jobs: rank r sees only GPU gpus[r] (its CUDA_VISIBLE_DEVICES:
                                 a device number or UUID; borrowed, valid until launch_free);
                                 NULL leaves the environment as it is. A launcher that places
                                 the ranks itself (launcher_queues) ignores it. */
    bool cuda;                /* the job runs on GPUs (a cluster manager gives each rank one) */
    int64_t job;              /* the job and attempt, for a cluster manager's job name; */
    int attempt;              /* 0 for `ddpd run` */
    /* Called for every complete stdout line of a rank, in arrival order (line without
     * the newline, not NUL-terminated). May be NULL. */
    void (*on_line)(void *ctx, int rank, const char *line, size_t len);
    void *ctx;
};

/* The preemption grace when neither the spec nor the caller names one: seconds a rank
 * has between SIGUSR1 and the end of its time (its next optimizer step and checkpoint). */
#define LAUNCH_PREEMPT_GRACE_S 60

struct launch;

/* Starts every rank. NULL with `err` set when a process cannot be started. */
struct launch *launch_start(const struct launch_opts *o, struct ddpd_error *err);
/* Frees; kills (SIGKILL) and reaps whatever is still running. NULL is a no-op. */
void launch_free(struct launch *l);

/* Reads output, reaps exits, enforces the kill deadline. Waits up to timeout_ms for
 * something to happen. Returns true once every process has exited and every output
 * line has been delivered. */
bool launch_poll(struct launch *l, int timeout_ms);

/* Adds the file descriptors launch_poll reads (POLLIN) to fds[0..cap) and returns how
 * many, so that one thread can wait on several launches at once and then call
 * launch_poll(l, 0) on each. */
int launch_fds(const struct launch *l, struct pollfd *fds, int cap);

/* Asks every rank to stop (SIGTERM to the group; SIGKILL after the grace period). */
void launch_cancel(struct launch *l);

/* Asks every rank of the attempt to checkpoint and exit (a preemption): SIGUSR1 to each
 * rank (local: each rank's process, never the id issuer; Slurm: srun, which forwards it
 * to every task). The ranks agree on the next optimizer step S, write ckpt-S, and end
 * with RANK_EXIT_PREEMPTED; launch_result then says `preempted`. Arms no deadline: the
 * caller cancels (launch_cancel) a job that has not stopped within its grace. Nothing is
 * sent while the attempt is pending in a cluster manager, or once its ranks have ended.
 * NULL is a no-op. */
void launch_preempt(struct launch *l);

/* After launch_poll returned true: `ok` when every rank exited 0; `preempted` (and not
 * ok) when every rank exited 0 or RANK_EXIT_PREEMPTED and at least one the latter: the
 * attempt stopped at a preemption's checkpoint, rank -1, exit_code RANK_EXIT_PREEMPTED,
 * `message` says so; else the rank where the
 * failure began (cause.h: its own error, not a peer's echo of it, whichever exit came
 * first), the exit code that failure stands for (its error event's kind's, CONTRACT.md
 * §6; without an event its exit code, 128+signal when killed) and the message of its
 * last `error` event (or a description of how it died). rank -1: the cluster manager
 * failed or ended the attempt, `message` says how. */
struct launch_result {
    bool ok;
    bool preempted;
    int rank;
    int exit_code;
    char message[1024];
};
void launch_result(const struct launch *l, struct launch_result *r);

/* The attempt's process group (led by the id issuer, or by the first process started). */
pid_t launch_pgid(const struct launch *l);
/* The pid of rank r on this host (0 before it started, or when it runs elsewhere). */
pid_t launch_pid(const struct launch *l, int rank);
/* Rank r's exit code once it has exited (128+signal when killed), else -1. */
int launch_exit_code(const struct launch *l, int rank);
/* True while a cluster manager holds the attempt pending, with its reason in `why`;
 * always false for local processes. */
bool launch_waiting(const struct launch *l, char *why, size_t cap);

/* ---- launchers: one per server, chosen at startup ---------------------------------------- */

/* Ranks as child processes of this host, on the scheduler's slots. New reference; NULL
 * when out of memory. */
struct launcher *launcher_local_new(void);
/* Releases a launcher (after every launch of it is freed). NULL is a no-op. */
void launcher_free(struct launcher *L);
/* The launcher's name, as `GET /v1/devices` and the logs say it ("local", "slurm"). */
const char *launcher_name(const struct launcher *L);

/* Whether the launcher keeps a queue of its own and places the ranks itself (a cluster
 * manager): then the server counts no slots (every job starts as soon as it is queued)
 * and a started attempt stays `queued` while launch_waiting says so. */
bool launcher_queues(const struct launcher *L);
/* False with `why` when a job of `world` ranks on `kind` can never run (`s`: the
 * server's slots, borrowed for the call). */
bool launcher_fits(const struct launcher *L, const struct sched *s, device_kind kind, int world, char *why,
                   size_t cap);
/* Why queued job `job` waits now, when the server's scheduler holds it (true with `buf`);
 * false when the launcher's own reasons are stored instead. */
bool launcher_pending_reason(const struct launcher *L, const struct sched *s, int64_t job, char *buf,
                             size_t cap);
/* GET /v1/devices: {"gpus":[{"index":0,"job":7|null,"device":"2","name":...,"memory":...,
 * "uuid":...,"emulated":false},...],"cpu_slots":[...]} (a GPU's name, memory and uuid as
 * sched_gpu_info knows them, else null; a cluster manager's: empty lists and "launcher").
 * A new reference. */
struct json_t *launcher_devices_json(const struct launcher *L, const struct sched *s);

/* A rank an earlier server started and recorded (store_rank), perhaps still running. */
struct launch_orphan {
    int64_t job;
    int rank;
    int64_t pid;
    uint64_t start_time; /* proc_start_time when it started; 0 unknown */
};
/* After a server restart: ends what an earlier server's attempts left running (the
 * ranks in o[0..n), or whatever the cluster manager still runs under this server's
 * names). Blocks a few seconds at most. */
void launcher_recover_orphans(const struct launcher *L, const struct launch_orphan *o, size_t n);

#endif
