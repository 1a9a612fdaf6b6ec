/* launch_slurm.h — the Slurm launcher backend (launch_impl.h's table): one job attempt as one
 * `srun --ntasks=W --kill-on-bad-exit=1 --input=all --label ... ddpd-worker` whose tasks are
 * the ranks (rank = SLURM_PROCID). Reads srun's labelled stdout/stderr back into per-rank
 * event lines and rank logs, asks squeue why the job waits, cancels with scancel, and maps
 * how srun and Slurm ended to a result that names the rank. launch.c drives it (the id
 * issuer stays there, on the server host); single-threaded; no shell anywhere. */
#ifndef DDPD_LAUNCH_SLURM_H
#define DDPD_LAUNCH_SLURM_H

#include <stdbool.h>
#include <stddef.h>
#include <poll.h>
#include <sys/types.h>

#include "../schema/err.h"

struct launch_opts;
struct launch_result;
struct launcher;

#define SLURM_MAX_EXTRA 32

/* Chosen per server (`ddpd serve --launcher slurm --slurm-...`). Strings are borrowed for
 * the server's life; NULL or "" leaves the option out. */
struct slurm_opts {
    const char *partition;              /* --partition */
    const char *account;                /* --account */
    const char *time_limit;             /* --time (Slurm's formats: MIN, MIN:SEC, H:M:S, D-H) */
    const char *extra[SLURM_MAX_EXTRA]; /* more srun arguments, each one argv element */
    int n_extra;
    int cpus_per_task;                   /* cpu jobs: --cpus-per-task (default 1) */
    const char *srun, *squeue, *scancel; /* programs, found on PATH (default the names) */
    const char *name_prefix;             /* Slurm job names are PREFIX<job>.<attempt> */
    double poll_s;                       /* squeue at most this often while pending (default 2) */
};

/* What srun is told of one job, from its spec (docs: README's Slurm section):
 *   - its priority as --nice=slurm_nice(priority): (100 - priority) * 10, so 100 -> 0,
 *     50 -> 500, 0 -> 1000; never negative (only Slurm's operators may ask for that);
 *   - its time_limit (seconds, 0 none) as --time=MINUTES, rounded up, over the server's
 *     --slurm-time;
 *   - --signal=USR1@G: Slurm sends the ranks SIGUSR1 G seconds before the time limit (and,
 *     with PreemptParameters=send_user_signal, at a preemption), G the job's
 *     preempt_grace or the server's default, rounded up, in [1, 65535]; a rank that gets
 *     it checkpoints at its next optimizer step and ends with exit code 6. */
struct slurm_job {
    int priority;          /* 0..100 */
    double time_limit_s;   /* > 0: --time */
    double signal_grace_s; /* > 0: --signal=USR1@G */
};

/* Seconds of a Slurm time ("M", "M:S", "H:M:S", "D-H", "D-H:M", "D-H:M:S"); 0 for none. */
double slurm_time_s(const char *v);

/* The --nice of a job of `priority` (clamped to 0..100): (100 - priority) * 10. */
int slurm_nice(int priority);

/* srun's argv for one attempt (no shell: each element is one argument). */
struct slurm_argv {
    char *argv[SLURM_MAX_EXTRA + 24];
    int argc;
    char buf[8192]; /* the formatted options live here */
};

/* Fills `a` for `world` ranks running `worker`, as Slurm job `name`; cuda jobs get one GPU
 * per task, cpu jobs cpus_per_task CPUs; `job` (NULL: none) adds its --nice, --time and
 * --signal. DDPD_ETOOBIG (naming the option) when the options do not fit. */
ddpd_err slurm_srun_argv(const struct slurm_opts *o, const char *name, int world, bool cuda,
                         const struct slurm_job *job, const char *worker, struct slurm_argv *a,
                         struct ddpd_error *err);

/* The Slurm launcher: every job is one srun as soon as it is queued (launcher_queues):
 * Slurm queues it and places its ranks, squeue's reason is its pending reason, and the
 * orphans of an earlier server are the Slurm jobs with this server's name prefix. `o` is
 * copied; its strings are borrowed for the launcher's life. NULL when out of memory. */
struct launcher *launcher_slurm_new(const struct slurm_opts *o);

/* The Slurm job name of a job's attempt: PREFIX<job>.<attempt>. */
void slurm_job_name(const struct slurm_opts *o, long long job, int attempt, char *buf, size_t cap);

/* After a server restart: cancels every Slurm job whose name has this server's prefix
 * (the earlier server's sruns are gone, their Slurm jobs may not be). Waits at most
 * timeout_s for each of squeue and scancel. */
void slurm_cancel_orphans(const struct slurm_opts *o, double timeout_s);

/* False with `why` when srun, squeue or scancel is not on PATH (checked at startup). */
bool slurm_programs_found(const struct slurm_opts *o, char *why, size_t cap);

struct slurm_run;

/* Starts srun for one attempt of lo->world_size ranks as Slurm job `name` with `so`'s
 * options and, when lo->doc is set, its spec's priority, time limit and preemption grace
 * (struct slurm_job; the grace defaults to lo->preempt_grace_s): `doc` (the stdin document without a rank,
 * with the comm id) goes to a file in lo->out_dir that is srun's stdin (--input=all: every task reads it
 * whole). `pgid`: the process group to join (the issuer's), 0 for a new one. NULL with `err` set, naming the
 * Slurm job. */
struct slurm_run *slurm_run_start(const struct slurm_opts *so, const char *name, const struct launch_opts *lo,
                                  const char *doc, pid_t pgid, struct ddpd_error *err);
/* Reads srun's output, reaps, runs the squeue/scancel helpers; true once srun has exited,
 * its output is delivered and the final look at the Slurm job is done. */
bool slurm_run_poll(struct slurm_run *r, int timeout_ms);
int slurm_run_fds(const struct slurm_run *r, struct pollfd *fds, int cap);
/* scancel (repeated until srun ends; srun SIGKILLed after the grace period plus Slurm's
 * own kill wait). */
void slurm_run_cancel(struct slurm_run *r);
/* A preemption: SIGUSR1 to srun, which forwards it to every task, at once when Slurm has
 * started the tasks, else as soon as it does. */
void slurm_run_preempt(struct slurm_run *r);
/* True while Slurm holds the attempt pending; `why` is squeue's reason in a sentence. */
bool slurm_run_waiting(const struct slurm_run *r, char *why, size_t cap);
void slurm_run_result(const struct slurm_run *r, struct launch_result *res);
/* Rank r's exit code as srun reported it (128+signal when killed), 0 for ranks of an
 * srun that exited 0, else -1. */
int slurm_run_exit_code(const struct slurm_run *r, int rank);
pid_t slurm_run_pid(const struct slurm_run *r);
/* Kills srun (SIGKILL) and cancels the Slurm job when srun still ran; reaps. NULL: no-op. */
void slurm_run_free(struct slurm_run *r);

/* ---- parsers, exposed for the unit test ---- */

/* One line of srun's stderr: "srun: error: NODE: task 1: Killed", "... tasks 0,2-3:
 * Exited with exit code 5", "... Terminated". Sets codes[rank] (128+signal for a signal
 * name) for the ranks listed below `world`; returns how many, 0 when the line is not one
 * of these. */
int slurm_parse_task_exit(const char *line, int world, int *codes);

/* A labelled line "R: payload" or " R: payload" (--label pads to the widest rank). Returns
 * the rank and sets *payload and *plen, or -1 for an unlabelled line. */
int slurm_parse_label(const char *line, size_t len, const char **payload, size_t *plen);

/* srun splits a task's line into labelled pieces of this many bytes; a piece of exactly
 * this length always continues in the next piece of the same rank (possibly empty). */
#define SLURM_IO_PIECE 1024

#endif
