/* super_impl.h — what the supervisor's files share (super.c: the thread, the job table,
 * launching and states; super_preempt.c: priorities, preemption, time limits and the
 * queue view). Only they include it. */
#ifndef DDPD_SUPER_IMPL_H
#define DDPD_SUPER_IMPL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "../schema/job_state.h"
#include "evpipe.h"
#include "launch.h"
#include "sched.h"
#include "super.h"

#define POLL_MS             50
#define RANK_EXIT_CANCELLED 5 /* a worker's exit code for a cancel (CONTRACT.md §6) */
#define MAX_FDS             4096

enum cmd_kind { CMD_SUBMIT, CMD_CANCEL, CMD_DELETE, CMD_PREEMPT };

/* A command whose caller waits for its answer (CMD_DELETE): on the caller's stack; the
 * supervisor sets `done` under the lock and signals `cv`. */
struct answer {
    pthread_cond_t cv;
    bool done;
    ddpd_err rc;
    struct ddpd_error *err;
};

struct cmd {
    enum cmd_kind kind;
    int64_t job;
    char *spec_text; /* CMD_SUBMIT from super_submit: the stored spec (owned), or NULL */
    int world_size, max_restarts;
    device_kind device;
    double created_at;     /* with spec_text: the store has its queued event (seq 1) */
    struct answer *answer; /* CMD_DELETE: borrowed from the waiting caller */
    char who[96];          /* CMD_PREEMPT: who asked */
    struct cmd *next;
};

/* A job the supervisor holds: queued, starting or running. Tens of thousands can wait
 * in the queue, so a queued job is small: its spec stays the stored text (what the
 * workers are given) until it starts. */
struct active {
    int64_t job;
    job_state state;
    char *spec_text; /* the spec as stored (canonical JSON) */
    int world_size;
    device_kind device;
    int attempt, restarts, max_restarts;
    int failed_rank, failed_exit_code; /* what ended the last attempt, for its restart's
                                          entry: a rank and its exit code, rank -1 for none */
    int64_t resumed_from, resume_step; /* a job made by resume: where it continues from */
    bool resume_force;                 /* ... even on data changed since that checkpoint */
    int64_t stop_at;                   /* a pause (an ASHA rung): the job document's stop_at; 0 none */
    /* What the scheduler weighs (super_preempt.c: the spec's and the store's) */
    int priority;
    bool preemptible;
    double time_limit, grace;    /* seconds; grace 0: the server's --preempt-grace */
    char owner[72];              /* "" none */
    int max_gpus, max_cpu_ranks; /* the owner's limits when last read, -1 none */
    int preemptions;
    double run_s;        /* seconds run over its ended attempts */
    double started_mono; /* this attempt's start (monotonic), 0 when not running */
    /* A preemption in progress: asked at preempt_mono (monotonic) for job preempt_by (0:
     * by a user or Slurm's signal), to be forced at preempt_deadline; forced once the
     * grace passed (the ranks stopped: it restarts from its last checkpoint). */
    int64_t preempt_by;
    double preempt_mono, preempt_deadline;
    bool preempting, preempt_forced;
    char preempt_who[96];    /* who asked: "job 15 (priority 80)", "alice" */
    struct evpipe_source ev; /* its events' numbering: evpipe_publish */
    int *slots;
    const char **gpu; /* cuda jobs: the device of each rank's slot (launch_opts.gpus) */
    struct launch *l; /* set with set_launch() only */
    bool cancel_requested;
    char cancel_reason[128];
    char *pending; /* the pending reason last stored, NULL for none */
    char *out_dir;
    char *quota_error;                /* the job folder went over the disk quota: why it failed */
    double next_quota_check;          /* monotonic time of its next measurement */
    struct store_rank *unsaved_ranks; /* the ranks' end rows the store did not take, */
    int n_unsaved_ranks;              /* of this attempt and earlier ones */
    struct super *s;
    struct active *prev, *next;   /* every job */
    struct active *lprev, *lnext; /* the jobs with a launch (their pipes are polled) */
};

struct super {
    struct super_opts o;
    pthread_t thread;
    bool thread_started;
    int wake_fd;
    pthread_mutex_t lock;      /* cmds, sched, stopping, on_end */
    void (*on_end)(void *ctx); /* super_on_end's, called under lock */
    void *on_end_ctx;
    struct cmd *head, *tail;
    struct sched *sched;
    bool stopping;
    struct active *jobs;     /* supervisor thread only */
    struct active *launched; /* the jobs with a launch, linked by lnext */
    struct idmap *index;     /* jobs by id */
    struct evpipe *pipe;     /* events: stored, committed, then published */
};

/* super.c's, for super_preempt.c */
struct active *super__find(struct super *s, int64_t job);

/* super_preempt.c's, for super.c */
/* Reads what the scheduler weighs of a job (its stored spec's priority, preemptible,
 * time_limit and preempt_grace; the store's owner, limits, preemptions and run_s). */
void super__weigh(struct super *s, struct active *a);
/* Puts a job in the scheduler's queue (under the lock). */
void super__enqueue(struct super *s, struct active *a);
/* After sched_next: preemptions for the jobs that wait, time limits, graces. */
void super__cluster_turn(struct super *s);
/* An attempt of a job that was asked to stop at a checkpoint, or whose ranks stopped at
 * one on a signal (res->preempted), has ended: true when it went back to the queue as
 * preempted (or failed for good); false when ended() goes on as for any end. */
bool super__preempt_ended(struct super *s, struct active *a, const struct launch_result *res);
/* The attempt that started at a->started_mono ended: its seconds are added to run_s. */
void super__attempt_ran(struct active *a);
/* Recovery: a job the earlier server was preempting (its preempt_by stored) waits again as
 * preempted, from its newest checkpoint. */
void super__preempt_recovered(struct super *s, struct active *a);
/* CMD_PREEMPT: a user's (`who`) preemption of a running job. */
void super__preempt_cmd(struct super *s, int64_t job, const char *who);

#endif
