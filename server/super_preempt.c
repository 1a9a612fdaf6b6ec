/* super_preempt.c — the supervisor's part of the shared cluster (docs/scheduling.md): what
 * the scheduler weighs of a job, preemption (the ranks asked to stop at their next
 * optimizer step with a checkpoint, the job queued again as `preempted`, stopped after its
 * grace when it does not), time limits, and the queue as a view. On the supervisor's
 * thread, with super.c's job table (super_impl.h); super_queue and super_preempt are
 * called from any thread. */
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/alloc.h"
#include "../base/clock.h"
#include "../schema/event.h"
#include "../schema/jobdir.h"
#include "store.h"
#include "super_impl.h"

#define MAX_VICTIMS 64

void super__weigh(struct super *s, struct active *a)
{
    a->priority = SPEC_PRIORITY_DEFAULT;
    a->preemptible = true;
    a->time_limit = a->grace = 0;
    a->max_gpus = a->max_cpu_ranks = -1;
    json_t *j = a->spec_text ? json_loads(a->spec_text, 0, NULL) : NULL, *v;
    if ((v = json_object_get(j, "priority")) && json_is_integer(v))
        a->priority = (int)json_integer_value(v);
    if ((v = json_object_get(j, "preemptible")) && json_is_boolean(v))
        a->preemptible = json_is_true(v);
    if ((v = json_object_get(j, "time_limit")) && json_is_number(v))
        a->time_limit = json_number_value(v);
    if ((v = json_object_get(j, "preempt_grace")) && json_is_number(v))
        a->grace = json_number_value(v);
    json_decref(j);
    struct store_job_weight w;
    struct ddpd_error err;
    if (store_job_weight(s->o.store, a->job, &w, &err) != DDPD_OK) {
        fprintf(stderr, "ddpd: job %" PRId64 ": its owner and limits were not read: %s\n", a->job,
                err.message);
        return;
    }
    snprintf(a->owner, sizeof a->owner, "%s", w.owner);
    a->max_gpus = w.max_gpus;
    a->max_cpu_ranks = w.max_cpu_ranks;
    a->preemptions = w.preemptions;
    a->run_s = w.run_s;
    a->preempt_by = w.preempt_by;
}

void super__enqueue(struct super *s, struct active *a)
{
    struct sched_job j = {.job = a->job,
                          .kind = a->device,
                          .world = a->world_size,
                          .priority = a->priority,
                          .preemptible = a->preemptible,
                          .owner = a->owner,
                          .time_limit = a->time_limit,
                          .run_s = a->run_s};
    pthread_mutex_lock(&s->lock);
    /* An owner's limits as the store says now: an admin's change applies from the owner's
     * next job that enters the queue. */
    if (a->owner[0])
        sched_set_limits(s->sched, a->owner, a->max_gpus, a->max_cpu_ranks);
    sched_enqueue(s->sched, &j, base_mono_s());
    pthread_mutex_unlock(&s->lock);
}

void super__attempt_ran(struct active *a)
{
    if (a->started_mono > 0)
        a->run_s += base_mono_s() - a->started_mono;
    a->started_mono = 0;
}

/* The step of the newest checkpoint the job can resume from; 0 when it has none. */
static int64_t ckpt_step(const struct active *a)
{
    char path[PATH_MAX];
    if (!jobdir_latest_ckpt(a->out_dir, path, sizeof path))
        return 0;
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    long long step = 0;
    return sscanf(base, "ckpt-%lld", &step) == 1 ? (int64_t)step : 0;
}

/* Asks a running job's ranks to stop at their next optimizer step with a checkpoint
 * (launch_preempt: SIGUSR1); `by` is the job it makes room for (0: a user's request),
 * `who` says who asked. Stored (preempt_by) before the ranks are told, so a server that
 * dies while they stop requeues the job as preempted. */
static void preempt(struct super *s, struct active *a, int64_t by, const char *who)
{
    if (!a->l || a->preempting || a->cancel_requested)
        return;
    double now = base_mono_s();
    double grace = a->grace > 0 ? a->grace : s->o.preempt_grace;
    a->preempting = true;
    a->preempt_forced = false;
    a->preempt_by = by > 0 ? by : -1;
    a->preempt_mono = now;
    a->preempt_deadline = now + grace;
    snprintf(a->preempt_who, sizeof a->preempt_who, "%s", who);
    struct store_job_update u = {.fields = STORE_SET_PREEMPT_BY, .preempt_by = a->preempt_by};
    struct ddpd_error err;
    if (store_job_update(s->o.store, a->job, &u, NULL, &err) != DDPD_OK)
        fprintf(stderr, "ddpd: job %" PRId64 ": its preemption was not stored: %s\n", a->job, err.message);
    fprintf(stderr, "ddpd: job %" PRId64 ": preempted by %s: its ranks checkpoint and stop (grace %g s)\n",
            a->job, who, grace);
    launch_preempt(a->l);
}

/* The attempt has ended at a checkpoint (or was stopped after its grace): the job waits
 * again as preempted, its slots free, and resumes from its newest checkpoint when the
 * scheduler starts it. Not a restart: max_restarts is not spent. */
static void requeue(struct super *s, struct active *a, bool forced, int64_t last_step)
{
    int64_t step = ckpt_step(a);
    char msg[400], extra[400];
    int n = snprintf(msg, sizeof msg, "preempted by %s", a->preempt_who);
    if (n < 0 || (size_t)n >= sizeof msg)
        n = (int)sizeof msg - 1;
    int64_t lost = forced && last_step > step ? last_step - step : 0;
    if (forced)
        snprintf(msg + n, sizeof msg - (size_t)n,
                 ": no checkpoint within its grace, so it was stopped; it resumes from %s%" PRId64
                 ", losing %" PRId64 " step%s",
                 step ? "its checkpoint at step " : "the start, step ", step, lost, lost == 1 ? "" : "s");
    else
        snprintf(msg + n, sizeof msg - (size_t)n, ": it resumes from its checkpoint at step %" PRId64, step);
    json_t *x = json_pack("{s:I, s:I, s:s, s:b}", "step", (json_int_t)step, "lost_steps", (json_int_t)lost,
                          "message", msg, "forced", forced);
    if (x && a->preempt_by > 0)
        json_object_set_new(x, "by", json_integer(a->preempt_by));
    char *xs = x ? json_dumps(x, JSON_COMPACT) : NULL;
    snprintf(extra, sizeof extra, "%s", xs ? xs : "{}");
    free(xs);
    json_decref(x);

    store_attempt_end(s->o.store, a->job, a->attempt, "preempted", NULL);
    a->preemptions++;
    a->preempting = a->preempt_forced = false;
    a->preempt_by = 0;
    a->failed_rank = -1;
    struct event ev = {.kind = EVENT_STATE, .rank = -1};
    snprintf(ev.state, sizeof ev.state, "%s", job_state_name(JOB_STATE_PREEMPTED));
    snprintf(ev.message, sizeof ev.message, "%s", msg);
    evpipe_publish(&a->ev, &ev);
    struct store_job_update u = {.fields = STORE_SET_STATE | STORE_SET_PENDING | STORE_SET_RESTART |
                                           STORE_SET_RUN | STORE_SET_PREEMPT_BY,
                                 .state = JOB_STATE_PREEMPTED,
                                 .pending_reason = "",
                                 .restart_attempt = a->attempt,
                                 .restart_reason = "preempted",
                                 .restart_extra = extra,
                                 .preemptions = a->preemptions,
                                 .run_s = a->run_s,
                                 .preempt_by = 0};
    struct ddpd_error err;
    if (store_job_update(s->o.store, a->job, &u, NULL, &err) != DDPD_OK)
        fprintf(stderr, "ddpd: job %" PRId64 ": state preempted not stored: %s\n", a->job, err.message);
    a->state = JOB_STATE_PREEMPTED;
    free(a->pending);
    a->pending = NULL;
    pthread_mutex_lock(&s->lock);
    sched_release(s->sched, a->job);
    pthread_mutex_unlock(&s->lock);
    super__enqueue(s, a);
}

bool super__preempt_ended(struct super *s, struct active *a, const struct launch_result *res)
{
    if (res->preempted) { /* every rank stopped at a checkpoint (asked, or Slurm's signal) */
        if (!a->preempting) {
            a->preempt_by = -1;
            snprintf(a->preempt_who, sizeof a->preempt_who, "a signal to its ranks (Slurm's --signal)");
        }
        requeue(s, a, false, 0);
        return true;
    }
    if (!a->preempting || res->ok)
        return false; /* it ended on its own before the checkpoint: as any end */
    if (!a->preempt_forced)
        return false; /* a failure while it stopped: a failure */
    struct store_job j;
    memset(&j, 0, sizeof j);
    int64_t last = store_job_get(s->o.store, a->job, &j, NULL) == DDPD_OK ? j.step : 0;
    store_job_clear(&j);
    requeue(s, a, true, last);
    return true;
}

/* Preemptions the scheduler asks for, per device kind at most one set at a time. */
static void preemptions(struct super *s, double now)
{
    for (;;) {
        int64_t for_job = 0, victims[MAX_VICTIMS];
        pthread_mutex_lock(&s->lock);
        int n = sched_preempt(s->sched, now, &for_job, victims, MAX_VICTIMS);
        pthread_mutex_unlock(&s->lock);
        if (n <= 0)
            return;
        struct active *f = super__find(s, for_job);
        char who[96];
        snprintf(who, sizeof who, "job %" PRId64 " (priority %d)", for_job, f ? f->priority : 0);
        for (int i = 0; i < n; i++) {
            struct active *v = super__find(s, victims[i]);
            if (v)
                preempt(s, v, for_job, who);
        }
    }
}

/* A preempted job whose grace passed without its checkpoint is stopped (SIGTERM, then
 * SIGKILL): it restarts from its newest checkpoint (requeue, forced). */
static void graces(struct super *s, double now)
{
    for (struct active *a = s->launched; a; a = a->lnext) {
        if (!a->preempting || a->preempt_forced || now < a->preempt_deadline)
            continue;
        a->preempt_forced = true;
        fprintf(stderr, "ddpd: job %" PRId64 ": no checkpoint within its preemption grace: stopping it\n",
                a->job);
        launch_cancel(a->l);
    }
}

/* Jobs past their time_limit are cancelled: their state `cancelled`, their error says
 * time_limit (as Slurm's TIMEOUT). */
static void time_limits(struct super *s, double now)
{
    int64_t jobs[64];
    pthread_mutex_lock(&s->lock);
    int n = sched_expired(s->sched, now, jobs, 64);
    pthread_mutex_unlock(&s->lock);
    for (int i = 0; i < n; i++) {
        struct active *a = super__find(s, jobs[i]);
        if (!a || !a->l || a->cancel_requested)
            continue;
        a->cancel_requested = true;
        snprintf(a->cancel_reason, sizeof a->cancel_reason,
                 "time_limit: the job ran its time_limit of %g s; it was cancelled", a->time_limit);
        launch_cancel(a->l);
    }
}

void super__cluster_turn(struct super *s)
{
    if (launcher_queues(s->o.launcher))
        return; /* Slurm schedules, preempts and times its jobs (--nice, --signal, --time) */
    double now = base_mono_s();
    time_limits(s, now);
    graces(s, now);
    preemptions(s, now);
}

void super__preempt_recovered(struct super *s, struct active *a)
{
    snprintf(a->preempt_who, sizeof a->preempt_who, "job %" PRId64 " (the server restarted while it stopped)",
             a->preempt_by);
    struct store_job j;
    memset(&j, 0, sizeof j);
    int64_t last = store_job_get(s->o.store, a->job, &j, NULL) == DDPD_OK ? j.step : 0;
    store_job_clear(&j);
    requeue(s, a, true, last);
}

void super__preempt_cmd(struct super *s, int64_t job, const char *who)
{
    struct active *a = super__find(s, job);
    if (a)
        preempt(s, a, 0, who);
}
