/* super.c — the supervisor thread: scheduling, launching, job states, restarts,
 * cancellation and recovery after a crash. The only thread that changes a running job;
 * HTTP threads hand it commands through a locked queue and an eventfd. A rank's events go
 * from its launcher straight into the event pipeline (evpipe.h); a rank's `start` comes
 * back here (rank_started). */
#include "super.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../base/alloc.h"
#include "../base/clock.h"
#include "../base/file.h"
#include "../schema/event.h"
#include "../schema/jobdir.h"
#include "../schema/jobdoc.h"
#include "evpipe.h"
#include "hub.h"
#include "idmap.h"
#include "launch.h"
#include "proc.h"
#include "sched.h"
#include "store.h"
#include "super_impl.h"

static void wake(struct super *s)
{
    uint64_t one = 1;
    ssize_t w = write(s->wake_fd, &one, sizeof one);
    (void)w;
}

/* ---- events and states -------------------------------------------------------------- */

/* The state event is appended before the job row changes: a stream that finds the row
 * final can rely on the final event being in the store already. Sets *out (may be NULL)
 * to the event as published. */
static void publish_state(struct active *a, job_state st, const char *error, struct event *out)
{
    struct event ev = {.kind = EVENT_STATE, .rank = -1};
    snprintf(ev.state, sizeof ev.state, "%s", job_state_name(st));
    if (error)
        snprintf(ev.message, sizeof ev.message, "%s", error);
    evpipe_publish(&a->ev, &ev);
    if (out)
        *out = ev;
}

/* The job's row is updated after its state event is queued. False when the store did
 * not take the row (logged). *ev (may be NULL) is set to the state event. `error` is the
 * event's message; the row keeps it as its error in a final state, and in the others as
 * the reason of a restart of attempt `ended` (restart_history): only a final state has an
 * error, so a job that succeeds after a restart shows none. */
static bool set_state_full(struct super *s, struct active *a, job_state st, const char *error, int ended,
                           struct event *ev)
{
    publish_state(a, st, error, ev);

    struct store_job_update u = {.fields = STORE_SET_STATE | STORE_SET_ATTEMPT | STORE_SET_RESTARTS |
                                           STORE_SET_PENDING,
                                 .state = st,
                                 .attempt = a->attempt,
                                 .restarts = a->restarts,
                                 .pending_reason = ""};
    if (error && (JOB_STATE_BIT(st) & JOB_STATES_FINAL)) {
        u.fields |= STORE_SET_ERROR;
        u.error = error;
    } else if (error) {
        u.fields |= STORE_SET_RESTART | STORE_SET_ERROR;
        u.error = NULL;
        u.restart_reason = error;
        u.restart_attempt = ended;
        u.restart_by_rank = a->failed_rank >= 0;
        u.restart_rank = a->failed_rank;
        u.restart_exit_code = a->failed_exit_code;
    }
    if (st != JOB_STATE_STARTING)
        u.fields &= ~(unsigned)STORE_SET_ATTEMPT; /* keep the progress the attempt reported */
    struct ddpd_error err;
    bool stored = store_job_update(s->o.store, a->job, &u, NULL, &err) == DDPD_OK;
    if (!stored)
        fprintf(stderr, "ddpd: job %" PRId64 ": state %s not stored: %s\n", a->job, job_state_name(st),
                err.message);
    a->state = st;
    free(a->pending);
    a->pending = NULL;
    return stored;
}

static bool set_state_ev(struct super *s, struct active *a, job_state st, const char *error, struct event *ev)
{
    return set_state_full(s, a, st, error, a->attempt, ev);
}

static bool set_state(struct super *s, struct active *a, job_state st, const char *error)
{
    return set_state_ev(s, a, st, error, NULL);
}

/* A restart of attempt `ended`, for `why`: the job goes to `st` (starting, or queued). */
static bool set_state_restart(struct super *s, struct active *a, job_state st, const char *why, int ended)
{
    return set_state_full(s, a, st, why, ended, NULL);
}

/* Replaces `a`'s pending reason; false when it is the same (or out of memory). */
static bool set_pending(struct active *a, const char *why)
{
    if (strcmp(why, a->pending ? a->pending : "") == 0)
        return false;
    char *d = strdup(why);
    if (!d)
        return false;
    free(a->pending);
    a->pending = d;
    return true;
}

/* ---- the job table -------------------------------------------------------------------- */

/* The table is a list (for walking every job) and an index by id (thousands of jobs can
 * wait in the queue, and every submission and event looks one up). */

static struct active *find(struct super *s, int64_t job)
{
    return idmap_get(s->index, job);
}

static void link_job(struct super *s, struct active *a)
{
    a->prev = NULL;
    a->next = s->jobs;
    if (s->jobs)
        s->jobs->prev = a;
    s->jobs = a;
    idmap_put(s->index, a->job, a);
}

/* Sets (or with NULL ends and frees) the job's launch, keeping the list of launched
 * jobs whose pipes the loop polls. */
static void set_launch(struct super *s, struct active *a, struct launch *l)
{
    if (a->l) {
        launch_free(a->l);
        if (a->lprev)
            a->lprev->lnext = a->lnext;
        else
            s->launched = a->lnext;
        if (a->lnext)
            a->lnext->lprev = a->lprev;
        a->lprev = a->lnext = NULL;
    }
    a->l = l;
    if (l) {
        a->lnext = s->launched;
        if (s->launched)
            s->launched->lprev = a;
        s->launched = a;
    }
}

/* A job for the table, not linked yet; takes spec_text. */
static void rank_started(void *ctx, int rank);

static struct active *new_active(struct super *s, int64_t job, char *spec_text)
{
    struct active *a = calloc(1, sizeof *a);
    char dir[PATH_MAX];
    jobdir_job_path(dir, sizeof dir, s->o.jobs_dir, job);
    if (!a || !(a->out_dir = strdup(dir))) {
        free(a);
        return NULL;
    }
    a->s = s;
    a->job = job;
    a->spec_text = spec_text;
    a->failed_rank = -1;
    a->ev = (struct evpipe_source){
        .pipe = s->pipe, .job = job, .next_seq = 1, .on_start = rank_started, .ctx = a};
    return a;
}

static void free_active(struct active *a)
{
    free(a->slots);
    free(a->gpu);
    free(a->pending);
    free(a->out_dir);
    free(a->quota_error);
    free(a->spec_text);
    free(a->unsaved_ranks);
    free(a);
}

static void drop(struct super *s, struct active *a)
{
    set_launch(s, a, NULL);
    if (a->prev)
        a->prev->next = a->next;
    else
        s->jobs = a->next;
    if (a->next)
        a->next->prev = a->prev;
    idmap_del(s->index, a->job);
    free_active(a);
}

/* Loads a stored job into the table (queued). NULL when it is gone or unreadable. */
static struct active *load(struct super *s, int64_t job)
{
    struct store_job j;
    struct ddpd_error err;
    memset(&j, 0, sizeof j);
    if (store_job_get(s->o.store, job, &j, &err) != DDPD_OK) {
        fprintf(stderr, "ddpd: job %" PRId64 ": cannot load: %s\n", job, err.message);
        return NULL;
    }
    /* The stored spec must still be valid (an older server may have stored it). */
    struct spec *spec = malloc(sizeof *spec);
    json_t *js = j.spec ? json_loads(j.spec, 0, NULL) : NULL;
    struct active *a =
        spec && js && spec_from_json(js, NULL, spec, &err) == DDPD_OK ? new_active(s, job, j.spec) : NULL;
    json_decref(js);
    if (!a) {
        fprintf(stderr, "ddpd: job %" PRId64 ": stored spec unreadable\n", job);
        free(spec);
        store_job_clear(&j);
        return NULL;
    }
    j.spec = NULL; /* a has it */
    a->world_size = spec->world_size;
    a->device = spec->device;
    free(spec);
    a->state = j.state;
    a->attempt = a->ev.attempt = j.attempt;
    a->restarts = j.restarts;
    a->max_restarts = j.max_restarts;
    a->resumed_from = j.resumed_from;
    a->resume_step = j.resume_step;
    a->resume_force = j.resume_force;
    a->stop_at = j.stop_at;
    super__weigh(s, a);
    int64_t seq = 0;
    store_flush(s->o.store, NULL); /* queued events of the job count too */
    store_event_max_seq(s->o.store, job, &seq, NULL);
    a->ev.next_seq = seq + 1;
    store_job_clear(&j);
    link_job(s, a);
    return a;
}

/* ---- launching -------------------------------------------------------------------------- */

/* A rank's `start` event has been queued (evpipe_source.on_start): its rank row, and the
 * job is running. */
static void rank_started(void *ctx, int rank)
{
    struct active *a = ctx;
    struct super *s = a->s;
    struct store_rank r = {.attempt = a->attempt, .rank = rank};
    r.pid = launch_pid(a->l, rank);
    r.start_time = proc_start_time((pid_t)r.pid);
    snprintf(r.state, sizeof r.state, "running");
    store_rank_put(s->o.store, a->job, &r, NULL);
    if (a->state == JOB_STATE_QUEUED) /* the launcher started it before it said so */
        set_state(s, a, JOB_STATE_STARTING, NULL);
    if (a->state == JOB_STATE_STARTING)
        set_state(s, a, JOB_STATE_RUNNING, NULL);
}

static void finish(struct super *s, struct active *a, job_state st, const char *error);

/* The devices of the slots a cuda job was given (slot i is not GPU i under --gpus 2,3).
 * NULL when out of memory: then the ranks see every GPU and pick by rank. */
static const char *const *gpus_of_slots(struct super *s, struct active *a)
{
    if (!a->gpu && !(a->gpu = calloc((size_t)a->world_size, sizeof *a->gpu)))
        return NULL;
    for (int r = 0; r < a->world_size; r++)
        a->gpu[r] = sched_gpu_device(s->sched, a->slots[r]);
    return a->gpu;
}

static void start(struct super *s, struct active *a, bool restart, const char *why)
{
    struct ddpd_error err;
    char resume[PATH_MAX];
    mkdir(s->o.jobs_dir, 0700);
    /* A job made by resume starts from the other job's checkpoint, linked into its own
     * folder (jobdir_ckpt_link): from then on it is this job's like any other, which a
     * restart resumes from until a newer one exists, and deleting the other job cannot
     * take it away. */
    bool linked = true;
    if (a->resumed_from > 0 && !jobdir_latest_ckpt(a->out_dir, resume, sizeof resume)) {
        char src_job[PATH_MAX], src[PATH_MAX], dst[PATH_MAX];
        /* The step's checkpoint ckpt-S, or the best one best-S (checkpoint.keep_best). */
        linked = jobdir_job_path(src_job, sizeof src_job, s->o.jobs_dir, a->resumed_from) &&
                 (jobdir_step_dir(src, sizeof src, src_job, a->resume_step) ||
                  jobdir_ckpt_path(src, sizeof src, src_job, a->resume_step)) &&
                 jobdir_ckpt_path(dst, sizeof dst, a->out_dir, a->resume_step);
        if (!linked)
            ddpd_error_set(&err, DDPD_EIO, "", "the jobs folder's name is too long");
        else if (jobdir_ckpt_link(src, dst, &err) != DDPD_OK) {
            char why[sizeof err.message];
            snprintf(why, sizeof why, "%s",
                     err.code == DDPD_EDATA
                         ? "it is gone (deleted with its job, or pruned by checkpoint.keep_last)"
                         : err.message);
            ddpd_error_set(&err, DDPD_EDATA, "",
                           "job %" PRId64 "'s checkpoint at step %" PRId64 " to resume from: %s",
                           a->resumed_from, a->resume_step, why);
            linked = false;
        }
        /* The other job's best checkpoint comes along when it is no later than the step:
         * then it is the best that the checkpoint's keep_best state names. */
        int64_t best;
        if (linked && jobdir_best_find(src_job, &best) && best <= a->resume_step &&
            jobdir_best_path(src, sizeof src, src_job, best) &&
            jobdir_best_path(dst, sizeof dst, a->out_dir, best) &&
            jobdir_ckpt_link(src, dst, &err) != DDPD_OK)
            fprintf(stderr,
                    "ddpd: job %" PRId64 ": the best checkpoint of job %" PRId64 " was not linked: %s\n",
                    a->job, a->resumed_from, err.message);
    }
    bool has_resume = jobdir_latest_ckpt(a->out_dir, resume, sizeof resume);
    a->ev.attempt = ++a->attempt;
    a->started_mono = base_mono_s();
    struct jobdoc *jd = linked ? calloc(1, sizeof *jd) : NULL, *doc = NULL;
    if (!linked)
        ; /* err says why */
    else if (!jd)
        ddpd_error_set(&err, DDPD_ENOMEM, "", "out of memory building the job document");
    else if (spec_parse(a->spec_text, strlen(a->spec_text), NULL, &jd->spec, &err) == DDPD_OK) {
        jd->job = a->job;
        jd->attempt = a->attempt;
        jd->world_size = a->world_size;
        jd->rank = -1; /* each launcher names the rank its own way */
        jd->disk_quota = s->o.job_disk_quota;
        jd->max_rank_memory = s->o.max_rank_memory; /* each rank checks itself against it at start */
        jd->stop_at = a->stop_at;
        snprintf(jd->data_dir, sizeof jd->data_dir, "%s", s->o.data_dir);
        snprintf(jd->out_dir, sizeof jd->out_dir, "%s", a->out_dir);
        if (has_resume)
            snprintf(jd->resume, sizeof jd->resume, "%s", resume);
        /* The force of a resume covers the checkpoint it named; the job's own later ones
         * record the data it trains on, and a restart from them is checked. */
        char linked_ckpt[PATH_MAX];
        jd->resume_force = has_resume && a->resume_force &&
                           jobdir_ckpt_path(linked_ckpt, sizeof linked_ckpt, a->out_dir, a->resume_step) &&
                           !strcmp(linked_ckpt, resume);
        doc = jd;
        /* init.from_job: the other job's weights as they are now (checked at submit; a
         * checkpoint pruned or a job deleted since fails this one, saying so). */
        char src[PATH_MAX];
        int64_t from = jd->spec.init_from_job, step = jd->spec.init_from_step;
        if (!has_resume && from > 0 &&
            !(jobdir_job_path(src, sizeof src, s->o.jobs_dir, from) &&
              jobdir_init_weights(src, step, jd->init_path, sizeof jd->init_path))) {
            doc = NULL;
            if (step >= 0)
                ddpd_error_set(&err, DDPD_EDATA, "init.step",
                               "init.step: job %" PRId64 "'s checkpoint at step %" PRId64
                               " is gone (deleted with its job, or pruned by checkpoint.keep_last)",
                               from, step);
            else
                ddpd_error_set(&err, DDPD_EDATA, "init.from_job",
                               "init.from_job: job %" PRId64 "'s weights are gone (the job was deleted)",
                               from);
        }
    }
    struct launch_opts lo = {
        .worker = s->o.worker,
        .world_size = a->world_size,
        .out_dir = a->out_dir,
        .doc = doc,
        .grace_s = s->o.grace_s,
        .preempt_grace_s = s->o.preempt_grace,
        .die_with_parent = true,
        .gpus = a->device == DEVICE_CUDA ? gpus_of_slots(s, a) : NULL,
        .cuda = a->device == DEVICE_CUDA,
        .job = a->job,
        .attempt = a->attempt,
        .on_line = evpipe_rank_line, /* a rank's events go straight into the pipeline */
        .ctx = &a->ev,
        .launcher = s->o.launcher,
    };
    store_attempt_begin(s->o.store, a->job, a->attempt, NULL, NULL);
    /* A launcher with a queue of its own keeps the job queued (with its pending reason)
     * until it starts it: see launcher_waiting(). */
    if (!launcher_queues(s->o.launcher)) {
        set_state_restart(s, a, JOB_STATE_STARTING, restart ? why : NULL, a->attempt - 1);
    } else {
        if (restart)
            set_state_restart(s, a, JOB_STATE_QUEUED, why, a->attempt - 1);
        /* The attempt has begun (its name in the launcher's queue and attempts row are taken). */
        struct store_job_update u = {.fields = STORE_SET_ATTEMPT, .attempt = a->attempt};
        store_job_update(s->o.store, a->job, &u, NULL, NULL);
    }
    if (doc)
        set_launch(s, a, launch_start(&lo, &err));
    free(jd);
    if (!a->l) {
        char msg[1200];
        snprintf(msg, sizeof msg, "cannot start the job: %s", err.message);
        finish(s, a, JOB_STATE_FAILED, msg);
        return;
    }
    for (int r = 0; r < a->world_size; r++) {
        struct store_rank sr = {.attempt = a->attempt, .rank = r};
        sr.pid = launch_pid(a->l, r);
        sr.start_time = proc_start_time((pid_t)sr.pid);
        snprintf(sr.state, sizeof sr.state, "starting");
        store_rank_put(s->o.store, a->job, &sr, NULL);
    }
}

/* A job leaves the table in a final state; its slots are freed. */
static void finish(struct super *s, struct active *a, job_state st, const char *error)
{
    set_launch(s, a, NULL);
    /* A job that never started (cancelled queued) has no attempt to end. */
    bool saved = a->attempt == 0 ||
                 store_attempt_end(s->o.store, a->job, a->attempt, job_state_name(st), NULL) == DDPD_OK;
    pthread_mutex_lock(&s->lock);
    sched_release(s->sched, a->job);
    sched_dequeue(s->sched, a->job);
    pthread_mutex_unlock(&s->lock);
    struct event ev;
    if (!set_state_ev(s, a, st, error, &ev))
        saved = false;
    if (!saved || a->unsaved_ranks) {
        evpipe_end_unsaved(s->pipe, &ev, saved, a->restarts, error, a->unsaved_ranks, a->n_unsaved_ranks);
        a->unsaved_ranks = NULL;
        a->n_unsaved_ranks = 0;
    }
    pthread_mutex_lock(&s->lock);
    if (s->on_end)
        s->on_end(s->on_end_ctx); /* non-blocking by its contract: safe under the lock */
    pthread_mutex_unlock(&s->lock);
    drop(s, a);
}

/* What a rank's end row says. Of a job being cancelled, a rank that the cancel ended reads
 * `cancelled`: its own exit for a cancel (5, CONTRACT.md §6) or the launcher's SIGTERM or
 * SIGKILL; a rank that had finished (0) or failed on its own before reads as it ended. */
static const char *rank_state(const struct active *a, int exit_code)
{
    if (exit_code == 0)
        return job_state_name(JOB_STATE_SUCCEEDED);
    if (exit_code == RANK_EXIT_PREEMPTED)
        return job_state_name(JOB_STATE_PREEMPTED);
    if (a->cancel_requested &&
        (exit_code == RANK_EXIT_CANCELLED || exit_code == 128 + SIGTERM || exit_code == 128 + SIGKILL))
        return job_state_name(JOB_STATE_CANCELLED);
    return job_state_name(JOB_STATE_FAILED);
}

/* Every process of the attempt has exited. */
static void ended(struct super *s, struct active *a)
{
    struct launch_result res;
    launch_result(a->l, &res);
    /* The ranks' last loss events first, so the job's final row shows their progress. */
    store_flush(s->o.store, NULL);
    /* The ranks' end rows: those the store refuses are kept, with any an earlier attempt's
     * end could not store (tried once more here), for finish() to hand to the retries. */
    int kept = a->n_unsaved_ranks, n = 0;
    struct store_rank *rows = malloc((size_t)(kept + a->world_size) * sizeof *rows);
    for (int i = 0; i < kept; i++)
        if (store_rank_put(s->o.store, a->job, &a->unsaved_ranks[i], NULL) != DDPD_OK && rows)
            rows[n++] = a->unsaved_ranks[i];
    for (int r = 0; r < a->world_size; r++) {
        struct store_rank sr = {.attempt = a->attempt, .rank = r, .has_exit_code = true};
        sr.exit_code = launch_exit_code(a->l, r);
        sr.pid = launch_pid(a->l, r);
        snprintf(sr.state, sizeof sr.state, "%s", rank_state(a, sr.exit_code));
        if (store_rank_put(s->o.store, a->job, &sr, NULL) != DDPD_OK && rows)
            rows[n++] = sr;
    }
    if (!rows)
        fprintf(stderr,
                "ddpd: job %" PRId64 ": out of memory: the ranks' end rows the store refused "
                "are not retried\n",
                a->job);
    free(a->unsaved_ranks);
    a->unsaved_ranks = n ? rows : NULL;
    a->n_unsaved_ranks = n;
    if (!n)
        free(rows);
    set_launch(s, a, NULL);
    super__attempt_ran(a);
    if (a->quota_error) { /* stopped by check_quotas(): a restart would only go over it again */
        finish(s, a, JOB_STATE_FAILED, a->quota_error);
        return;
    }
    if (a->cancel_requested) {
        finish(s, a, JOB_STATE_CANCELLED, a->cancel_reason);
        return;
    }
    if (super__preempt_ended(s, a, &res))
        return;
    if (res.ok) {
        finish(s, a, JOB_STATE_SUCCEEDED, NULL);
        return;
    }
    char msg[1400];
    if (res.rank < 0) /* the cluster manager failed or ended it (srun, Slurm) */
        snprintf(msg, sizeof msg, "%s", res.message);
    else
        snprintf(msg, sizeof msg, "rank %d failed (exit code %d): %s", res.rank, res.exit_code, res.message);
    if (a->restarts < a->max_restarts) {
        a->restarts++;
        a->failed_rank = res.rank; /* -1: the cluster manager ended it */
        a->failed_exit_code = res.exit_code;
        char why[1600];
        snprintf(why, sizeof why, "restart %d of %d after %s", a->restarts, a->max_restarts, msg);
        store_attempt_end(s->o.store, a->job, a->attempt, "failed", NULL);
        start(s, a, true, why); /* same slots, fresh id, from the latest checkpoint */
        return;
    }
    finish(s, a, JOB_STATE_FAILED, msg);
}

/* ---- commands, scheduling ----------------------------------------------------------------- */

/* A job just inserted by the API, as the store holds it: queued, attempt 0, no events.
 * Takes c->spec_text. */
static struct active *fresh(struct super *s, struct cmd *c)
{
    struct active *a = new_active(s, c->job, c->spec_text);
    if (!a)
        return NULL;
    c->spec_text = NULL;
    a->state = JOB_STATE_QUEUED;
    a->world_size = c->world_size;
    a->device = c->device;
    a->max_restarts = c->max_restarts;
    super__weigh(s, a);
    link_job(s, a);
    return a;
}

/* A job the API has just inserted: from what the command carries (no store round trip),
 * or loaded from the store when it carries no spec. */
static void submit(struct super *s, struct cmd *c)
{
    int64_t job = c->job;
    bool known = c->spec_text != NULL;
    if (find(s, job))
        return;
    struct active *a = known ? fresh(s, c) : load(s, job);
    if (!a)
        return;
    a->slots = calloc((size_t)a->world_size, sizeof(int));
    super__enqueue(s, a);
    if (known) { /* stored queued, with its queued event: the hub is what is new */
        struct event ev;
        store_job_queued_event(job, c->created_at, &ev);
        a->ev.next_seq = ev.seq + 1;
        evpipe_add(s->pipe, &ev, true);
    } else {
        set_state(s, a, JOB_STATE_QUEUED, NULL);
    }
}

static void cancel(struct super *s, int64_t job, const char *reason)
{
    struct active *a = find(s, job);
    if (!a)
        return;
    if (!a->l) { /* still queued */
        finish(s, a, JOB_STATE_CANCELLED, reason);
        return;
    }
    a->cancel_requested = true;
    snprintf(a->cancel_reason, sizeof a->cancel_reason, "%s", reason);
    launch_cancel(a->l);
}

static void schedule(struct super *s)
{
    for (;;) {
        int64_t job;
        device_kind kind;
        int world;
        int slots[SCHED_MAX_SLOTS];
        pthread_mutex_lock(&s->lock);
        bool go = !s->stopping && sched_next(s->sched, base_mono_s(), &job, &kind, slots, &world);
        pthread_mutex_unlock(&s->lock);
        if (!go)
            break;
        struct active *a = find(s, job);
        if (!a)
            continue;
        memcpy(a->slots, slots, (size_t)world * sizeof(int));
        start(s, a, false, NULL);
    }
    if (!s->stopping)
        super__cluster_turn(s);
}

/* The disk quota of running jobs: every SUPER_QUOTA_CHECK_S each job folder is measured
 * and the bytes of the job's stored events added (rank 0 checks its folder before its
 * checkpoints; this catches what it cannot see, such as a rank that logs without end or
 * the events of a job that logs eval or loss events at every step past what
 * --job-events-max thins), and a job over the quota is stopped and fails naming it. */
static void check_quotas(struct super *s)
{
    if (s->o.job_disk_quota <= 0)
        return;
    double now = base_mono_s();
    for (struct active *a = s->launched; a; a = a->lnext) {
        if (a->quota_error || a->cancel_requested || now < a->next_quota_check)
            continue;
        a->next_quota_check = now + SUPER_QUOTA_CHECK_S;
        int64_t bytes = 0;
        struct store_usage u = {0};
        /* An unreadable folder (a stale mount) is not a quota matter: the ranks fail on it;
         * an unreadable usage (a busy database) counts as none until the next check. */
        if (jobdir_bytes(a->out_dir, &bytes, NULL) != DDPD_OK)
            continue;
        if (store_job_usage(s->o.store, a->job, &u, NULL) != DDPD_OK)
            u.bytes = 0;
        if (bytes + u.bytes <= s->o.job_disk_quota)
            continue;
        char msg[1200];
        if (u.bytes == 0)
            snprintf(msg, sizeof msg,
                     "the job folder %s holds %" PRId64 " bytes, over the job disk quota of %" PRId64
                     " bytes (ddpd serve --job-disk-quota); its ranks were stopped",
                     a->out_dir, bytes, s->o.job_disk_quota);
        else
            snprintf(msg, sizeof msg,
                     "the job folder %s holds %" PRId64 " bytes and the job's %" PRId64
                     " stored events %" PRId64 " bytes, %" PRId64
                     " in all, over the job disk quota of %" PRId64
                     " bytes (ddpd serve --job-disk-quota); its ranks were stopped",
                     a->out_dir, bytes, u.events, u.bytes, bytes + u.bytes, s->o.job_disk_quota);
        a->quota_error = strdup(msg);
        if (!a->quota_error)
            continue; /* measured again next time */
        fprintf(stderr, "ddpd: job %" PRId64 ": %s\n", a->job, msg);
        launch_cancel(a->l);
    }
}

/* Jobs handed to a launcher that queues (Slurm) but not started by it yet: queued with
 * its reason; starting once it has placed them. Local jobs are never queued with a launch. */
static void launcher_waiting(struct super *s)
{
    for (struct active *a = s->launched, *n; a; a = n) {
        n = a->lnext;
        if (a->state != JOB_STATE_QUEUED)
            continue;
        char why[STORE_TEXT_MAX];
        if (!launch_waiting(a->l, why, sizeof why)) {
            set_state(s, a, JOB_STATE_STARTING, NULL);
            continue;
        }
        if (!set_pending(a, why))
            continue;
        struct store_job_update u = {.fields = STORE_SET_PENDING, .pending_reason = why};
        store_job_update(s->o.store, a->job, &u, NULL, NULL);
    }
}

/* A finished job leaves the server: its rows and events, its history in the hub and its
 * folder. On the supervisor's thread, between turns, so that no end of the job is being
 * stored or published while it goes (the final event of a job that ends in this turn is
 * published before the next turn reads the command). */
static void delete_job(struct super *s, struct cmd *c)
{
    struct answer *ans = c->answer;
    ddpd_err rc = store_job_delete(s->o.store, c->job, JOB_STATES_FINAL, ans->err);
    if (rc == DDPD_OK) {
        hub_job_forget(s->o.hub, c->job);
        char dir[PATH_MAX];
        if (jobdir_job_path(dir, sizeof dir, s->o.jobs_dir, c->job))
            base_remove_tree(dir);
    }
    pthread_mutex_lock(&s->lock);
    ans->rc = rc;
    ans->done = true;
    pthread_cond_broadcast(&ans->cv);
    pthread_mutex_unlock(&s->lock);
}

static void *run(void *arg)
{
    struct super *s = arg;
    pthread_setname_np(pthread_self(), "ddpd-super");
    struct pollfd *fds = calloc(MAX_FDS, sizeof *fds);
    bool shutting = false;
    for (;;) {
        pthread_mutex_lock(&s->lock);
        struct cmd *c = s->head;
        s->head = s->tail = NULL;
        bool stopping = s->stopping;
        pthread_mutex_unlock(&s->lock);
        while (c) {
            struct cmd *next = c->next;
            if (c->kind == CMD_SUBMIT)
                submit(s, c);
            else if (c->kind == CMD_DELETE)
                delete_job(s, c);
            else if (c->kind == CMD_PREEMPT)
                super__preempt_cmd(s, c->job, c->who);
            else
                cancel(s, c->job, "cancelled");
            free(c->spec_text);
            free(c);
            c = next;
        }
        if (stopping && !shutting) {
            shutting = true;
            /* Running jobs are cancelled (or left to finish); queued ones stay queued in
             * the store, and the next server queues them again in their order. */
            for (struct active *a = s->jobs, *n; a; a = n) {
                n = a->next;
                if (a->l && a->state == JOB_STATE_QUEUED) {
                    /* Still in the launcher's queue (Slurm's): taken out of it, and
                     * queued again by the next server like any queued job. */
                    set_launch(s, a, NULL);
                    struct store_job_update u = {.fields = STORE_SET_PENDING, .pending_reason = ""};
                    store_job_update(s->o.store, a->job, &u, NULL, NULL);
                } else if (a->l && !s->o.finish_on_shutdown) {
                    cancel(s, a->job, "cancelled: the server is shutting down");
                }
            }
        }
        schedule(s);

        int nf = 1;
        fds[0] = (struct pollfd){.fd = s->wake_fd, .events = POLLIN};
        bool any = false;
        for (struct active *a = s->launched; a; a = a->lnext) {
            nf += launch_fds(a->l, fds + nf, MAX_FDS - nf);
            any = true;
        }
        if (shutting && !any)
            break;
        poll(fds, (nfds_t)nf, POLL_MS);
        if (fds[0].revents & POLLIN) {
            uint64_t v;
            ssize_t r = read(s->wake_fd, &v, sizeof v);
            (void)r;
        }
        for (struct active *a = s->launched, *n; a; a = n) {
            n = a->lnext;
            if (launch_poll(a->l, 0))
                ended(s, a);
        }
        launcher_waiting(s);
        check_quotas(s);
        evpipe_drain(s->pipe);
        evpipe_retry(s->pipe, false);
    }
    evpipe_drain(s->pipe);
    evpipe_retry(s->pipe, true);
    evpipe_report_unsaved(s->pipe);
    free(fds);
    return NULL;
}

/* ---- recovery ------------------------------------------------------------------------------ */

/* Notes the ranks an earlier server started of a job, for the launcher to end. */
static void add_orphans(const struct store_job *j, struct launch_orphan **o, size_t *n, size_t *cap)
{
    for (size_t i = 0; i < j->n_ranks; i++) {
        if (*n == *cap) {
            *cap = *cap ? 2 * *cap : 64;
            struct launch_orphan *no = xrealloc(*o, *cap * sizeof **o);
            *o = no;
        }
        const struct store_rank *r = &j->ranks[i];
        (*o)[(*n)++] =
            (struct launch_orphan){.job = j->id, .rank = r->rank, .pid = r->pid, .start_time = r->start_time};
    }
}

/* The rank rows of an attempt whose server died: none of its ranks runs any more (they
 * died with it, or launcher_recover_orphans ends them), so none may still read `starting` or
 * `running` with a pid that is gone. Each that had not ended reads `failed`, its exit
 * code unknown. */
static void ranks_lost(struct super *s, const struct store_job *j)
{
    for (size_t i = 0; i < j->n_ranks; i++) {
        struct store_rank r = j->ranks[i];
        if (r.has_exit_code || job_state_name_is_final(r.state))
            continue;
        snprintf(r.state, sizeof r.state, "failed");
        struct ddpd_error err;
        if (store_rank_put(s->o.store, j->id, &r, &err) != DDPD_OK)
            fprintf(stderr, "ddpd: job %" PRId64 ": rank %d's row still says it runs: %s\n", j->id, r.rank,
                    err.message);
    }
}

static ddpd_err recover(struct super *s, struct ddpd_error *err)
{
    struct store_job_list l;
    struct store_job_query q = {
        .states = JOB_STATES_ACTIVE | JOB_STATES_WAITING, .limit = STORE_LIST_MAX, .with_ranks = true};
    int64_t *queued = NULL;
    size_t nq = 0, capq = 0, no = 0, capo = 0;
    struct launch_orphan *orphans = NULL;
    for (;;) {
        ddpd_err rc = store_job_list(s->o.store, &q, &l, err);
        if (rc) {
            free(queued);
            free(orphans);
            return rc;
        }
        for (size_t i = 0; i < l.n; i++) {
            const struct store_job *j = &l.jobs[i];
            if (!(JOB_STATE_BIT(j->state) & JOB_STATES_WAITING)) {
                add_orphans(j, &orphans, &no, &capo);
                ranks_lost(s, j);
            }
            if (nq == capq) {
                capq = capq ? 2 * capq : 64;
                int64_t *nqp = xrealloc(queued, capq * sizeof *queued);
                queued = nqp;
            }
            queued[nq++] = j->id;
        }
        int64_t next = l.next;
        store_job_list_free(&l);
        if (!next)
            break;
        q.before = next;
    }
    /* Before anything starts again: what the earlier server left running is ended. */
    launcher_recover_orphans(s->o.launcher, orphans, no);
    free(orphans);
    /* Oldest first, so the queue keeps its order. */
    for (size_t i = nq; i-- > 0;) {
        struct active *a = load(s, queued[i]);
        if (!a)
            continue;
        a->slots = calloc((size_t)a->world_size, sizeof(int));
        if ((a->state == JOB_STATE_STARTING || a->state == JOB_STATE_RUNNING) && a->preempt_by) {
            /* It was being preempted when the server died: it waits as preempted and
             * resumes from its newest checkpoint (a preemption never spends max_restarts). */
            super__preempt_recovered(s, a);
            continue;
        }
        if (a->state == JOB_STATE_STARTING || a->state == JOB_STATE_RUNNING) {
            store_attempt_end(s->o.store, a->job, a->attempt, "server restarted", NULL);
            if (a->restarts >= a->max_restarts) {
                finish(s, a, JOB_STATE_FAILED, "server restarted");
                continue;
            }
            a->restarts++;
        }
        super__enqueue(s, a);
        a->failed_rank = -1; /* no rank's failure: the server's */
        if (a->state != JOB_STATE_QUEUED && a->state != JOB_STATE_PREEMPTED)
            set_state_restart(s, a, JOB_STATE_QUEUED, "server restarted; the job was queued again",
                              a->attempt);
    }
    free(queued);
    return DDPD_OK;
}

/* ---- public --------------------------------------------------------------------------------- */

struct super *super_start(const struct super_opts *o, struct ddpd_error *err)
{
    struct super *s = calloc(1, sizeof *s);
    if (!s) {
        ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory");
        return NULL;
    }
    s->o = *o;
    if (s->o.grace_s <= 0)
        s->o.grace_s = 5;
    pthread_mutex_init(&s->lock, NULL);
    s->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    s->pipe = evpipe_new(o->store, o->hub);
    s->index = idmap_new();
    /* A launcher with its own queue counts its own devices: every job starts (is handed to
     * it) at once. */
    bool counted = !launcher_queues(o->launcher);
    s->sched = counted ? sched_new(o->gpus, o->cpu_slots) : sched_new(SCHED_MAX_SLOTS, SCHED_MAX_SLOTS);
    if (s->sched)
        sched_set_aging(s->sched, o->priority_age_s < 0   ? 0
                                  : o->priority_age_s > 0 ? o->priority_age_s
                                                          : SCHED_AGING_S);
    if (s->o.preempt_grace <= 0)
        s->o.preempt_grace = SUPER_PREEMPT_GRACE_S;
    if (s->sched && counted) {
        sched_name_gpus(s->sched, o->gpu_ids);
        sched_describe_gpus(s->sched, o->gpu_info);
    }
    if (s->wake_fd < 0 || !s->sched || !s->pipe || !s->index) {
        ddpd_error_set(err, DDPD_ENOMEM, "", "cannot create the supervisor: %s", strerror(errno));
        super_stop(s);
        return NULL;
    }
    mkdir(o->jobs_dir, 0700);
    ddpd_err rc = recover(s, err);
    evpipe_drain(s->pipe);
    if (rc != DDPD_OK || pthread_create(&s->thread, NULL, run, s) != 0) {
        super_stop(s);
        return NULL;
    }
    s->thread_started = true;
    return s;
}

void super_stop(struct super *s)
{
    if (!s)
        return;
    if (s->thread_started) {
        pthread_mutex_lock(&s->lock);
        s->stopping = true;
        pthread_mutex_unlock(&s->lock);
        wake(s);
        pthread_join(s->thread, NULL);
    }
    if (s->pipe)
        evpipe_drain(s->pipe);
    while (s->jobs)
        drop(s, s->jobs);
    evpipe_free(s->pipe);
    while (s->head) {
        struct cmd *n = s->head->next;
        if (s->head->kind == CMD_DELETE) /* came after the loop's last turn: its caller waits */
            delete_job(s, s->head);
        free(s->head->spec_text);
        free(s->head);
        s->head = n;
    }
    idmap_free(s->index);
    if (s->o.store)
        store_flush(s->o.store, NULL);
    sched_free(s->sched);
    if (s->wake_fd >= 0)
        close(s->wake_fd);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

static void push_cmd(struct super *s, struct cmd *c)
{
    pthread_mutex_lock(&s->lock);
    bool first = s->head == NULL; /* the loop takes the whole queue: one wake-up serves */
    if (s->tail)
        s->tail->next = c;
    else
        s->head = c;
    s->tail = c;
    pthread_mutex_unlock(&s->lock);
    if (first)
        wake(s);
}

static void push(struct super *s, enum cmd_kind k, int64_t job)
{
    struct cmd *c = xcalloc(1, sizeof *c);
    c->kind = k;
    c->job = job;
    push_cmd(s, c);
}

void super_on_end(struct super *s, void (*fn)(void *ctx), void *ctx)
{
    pthread_mutex_lock(&s->lock);
    s->on_end = fn;
    s->on_end_ctx = ctx;
    pthread_mutex_unlock(&s->lock);
}

void super_submit(struct super *s, int64_t job, char *spec_text, int world_size, device_kind device,
                  int max_restarts, double created_at)
{
    struct cmd *c = xcalloc(1, sizeof *c);
    c->kind = CMD_SUBMIT;
    c->job = job;
    c->spec_text = spec_text; /* NULL: the supervisor loads the job from the store */
    c->world_size = world_size;
    c->device = device;
    c->max_restarts = max_restarts;
    c->created_at = created_at;
    push_cmd(s, c);
}

/* Job `job`'s state as the store has it (DDPD_ENOTFOUND for none). */
static ddpd_err stored_state(struct super *s, int64_t job, job_state *st, struct ddpd_error *err)
{
    struct store_job j;
    memset(&j, 0, sizeof j);
    ddpd_err rc = store_job_get(s->o.store, job, &j, err);
    *st = j.state;
    store_job_clear(&j);
    return rc;
}

ddpd_err super_cancel(struct super *s, int64_t job, struct ddpd_error *err)
{
    job_state st;
    ddpd_err rc = stored_state(s, job, &st, err);
    if (rc)
        return rc;
    if (JOB_STATE_BIT(st) & JOB_STATES_FINAL)
        return ddpd_error_set(err, DDPD_ECONFLICT, "", "job %" PRId64 " has already finished (%s)", job,
                              job_state_name(st));
    push(s, CMD_CANCEL, job);
    return DDPD_OK;
}

ddpd_err super_preempt(struct super *s, int64_t job, const char *by, struct ddpd_error *err)
{
    job_state st;
    ddpd_err rc = stored_state(s, job, &st, err);
    if (rc)
        return rc;
    if (!(JOB_STATE_BIT(st) & JOB_STATES_ACTIVE))
        return ddpd_error_set(err, DDPD_ECONFLICT, "",
                              "job %" PRId64 " is %s: only a starting or running job can be preempted", job,
                              job_state_name(st));
    if (launcher_queues(s->o.launcher))
        return ddpd_error_set(err, DDPD_ECONFLICT, "",
                              "this server's launcher (Slurm) schedules and preempts its jobs itself");
    struct cmd *c = xcalloc(1, sizeof *c);
    c->kind = CMD_PREEMPT;
    c->job = job;
    snprintf(c->who, sizeof c->who, "%s%s", by && *by ? "user " : "a user", by ? by : "");
    push_cmd(s, c);
    return DDPD_OK;
}

ddpd_err super_delete(struct super *s, int64_t job, struct ddpd_error *err)
{
    struct answer ans = {.err = err};
    struct cmd *c = calloc(1, sizeof *c);
    if (!c)
        return ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory deleting job %" PRId64, job);
    pthread_cond_init(&ans.cv, NULL);
    c->kind = CMD_DELETE;
    c->job = job;
    c->answer = &ans;
    push_cmd(s, c);
    pthread_mutex_lock(&s->lock);
    while (!ans.done)
        pthread_cond_wait(&ans.cv, &s->lock);
    pthread_mutex_unlock(&s->lock);
    pthread_cond_destroy(&ans.cv);
    return ans.rc;
}

bool super_pending_reason(struct super *s, int64_t job, char *buf, size_t cap)
{
    pthread_mutex_lock(&s->lock);
    bool known = launcher_pending_reason(s->o.launcher, s->sched, job, buf, cap);
    pthread_mutex_unlock(&s->lock);
    return known;
}

bool super_fits(struct super *s, device_kind kind, int world, char *why, size_t cap, const char **path)
{
    pthread_mutex_lock(&s->lock);
    bool ok = launcher_fits(s->o.launcher, s->sched, kind, world, why, cap);
    /* No slot of the kind, or enough of them but not enough with code: the device is the
     * cause; too few altogether: the world size. */
    const int n = sched_slots(s->sched, kind);
    *path = n == 0 || world <= n ? "device" : "world_size";
    pthread_mutex_unlock(&s->lock);
    return ok;
}

device_kind super_default_device(const struct super *s)
{
    return s->o.gpus > 0 ? DEVICE_CUDA : DEVICE_CPU;
}

int super_gpu_take(struct super *s, int64_t job, int *slot, char *device, size_t cap, char *why,
                   size_t whycap)
{
    int ok = -1;
    pthread_mutex_lock(&s->lock);
    if (launcher_queues(s->o.launcher))
        snprintf(why, whycap,
                 "device cuda: inference on a GPU needs the local launcher (with --launcher slurm, Slurm "
                 "places the GPUs)");
    else if (sched_usable_slots(s->sched, DEVICE_CUDA) == 0)
        snprintf(why, whycap, "device cuda: this server has no GPU it may use");
    else if (!sched_take(s->sched, DEVICE_CUDA, -job, slot)) {
        snprintf(why, whycap, "no GPU is free for inference now (jobs hold them, or wait for them)");
        ok = 0;
    } else {
        snprintf(device, cap, "%s", sched_gpu_device(s->sched, *slot));
        ok = 1;
    }
    pthread_mutex_unlock(&s->lock);
    return ok;
}

bool super_gpu_wanted(struct super *s)
{
    pthread_mutex_lock(&s->lock);
    bool w = !launcher_queues(s->o.launcher) && sched_waiting(s->sched, DEVICE_CUDA) > 0;
    pthread_mutex_unlock(&s->lock);
    return w;
}

void super_gpu_give(struct super *s, int slot)
{
    pthread_mutex_lock(&s->lock);
    sched_release_slot(s->sched, DEVICE_CUDA, slot);
    pthread_mutex_unlock(&s->lock);
    wake(s);
}

json_t *super_devices(struct super *s)
{
    pthread_mutex_lock(&s->lock);
    json_t *out = launcher_devices_json(s->o.launcher, s->sched);
    pthread_mutex_unlock(&s->lock);
    return out;
}

/* ---- for super_preempt.c (super_impl.h) ----------------------------------------------------- */

struct active *super__find(struct super *s, int64_t job)
{
    return find(s, job);
}
