/* sweep_control.c — the sweep controller: one thread that keeps every running sweep
 * moving. Each turn it reads the sweep and its trials from the store, records the end and
 * the metric of each trial's job, submits pending trials as ordinary jobs (named
 * "sweep-N-I", tagged "sweep-N") while fewer than max_parallel of the sweep's jobs are
 * queued or running, and ends the sweep when every trial has ended. It keeps nothing in memory between turns:
 * a server killed mid-sweep finds the same state in the store at its restart (the
 * supervisor requeues or restarts the jobs themselves). Knows nothing of HTTP. */
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../base/clock.h"
#include "../../schema/job_state.h"
#include "../store.h"
#include "../super.h"
#include "sweep.h"

/* How often a turn runs without a kick: a job's end is seen within this. */
#define TURN_S 0.25

struct sweeper {
    struct store *store;
    struct super *super;
    pthread_mutex_t mu; /* held for a whole turn and a cancel: neither sees half of the other */
    pthread_cond_t cv;
    bool kicked, stop;
    atomic_bool ended; /* a job ended (super_on_end): another turn at once */
    pthread_t thread;
};

/* Trial `idx` of sweep `sweep`'s job name. */
static void trial_name(char *buf, size_t cap, int64_t sweep, int idx)
{
    snprintf(buf, cap, "sweep-%" PRId64 "-%d", sweep, idx);
}

/* Job `job`'s value of `metric` (its last eval event's loss or accuracy, or its last
 * step's mean loss); false when it has none. */
static bool job_metric(struct store *s, const struct store_job *j, sweep_metric metric, double *out)
{
    if (metric == SWEEP_METRIC_LOSS) {
        *out = j->loss;
        return j->has_progress && j->loss_finite;
    }
    struct store_metrics m;
    memset(&m, 0, sizeof m);
    struct ddpd_error e;
    bool ok = false;
    if (store_metrics_get(s, j->id, 2, &m, &e) == DDPD_OK && m.n_eval > 0) {
        const struct store_eval *last = &m.eval[m.n_eval - 1];
        if (metric == SWEEP_METRIC_EVAL_ACCURACY) {
            ok = last->has_accuracy && isfinite(last->accuracy);
            *out = last->accuracy;
        } else {
            ok = isfinite(last->loss);
            *out = last->loss;
        }
    }
    store_metrics_free(&m);
    return ok;
}

/* How an asha trial's job runs (all zero for grid and random): to rung `rung`, pausing
 * at stop_at (0: to its last step), resumed from job `resumed_from`'s checkpoint at
 * resume_step (0: afresh). */
struct trial_run {
    int rung;
    int64_t stop_at, resumed_from, resume_step;
};

/* Submits trial t of sweep sw as a job into *job; the trial is linked to it (state
 * queued, its rung) in the job's insert (store_job_new.sweep). */
static ddpd_err submit_trial(struct sweeper *w, const struct store_sweep *sw, const struct store_trial *t,
                             const struct trial_run *run, int64_t *job, struct ddpd_error *err)
{
    char name[STORE_NAME_MAX];
    trial_name(name, sizeof name, sw->id, t->idx);
    ddpd_err rc;
    struct spec *spec = malloc(sizeof *spec);
    json_t *doc = json_loads(t->spec, 0, NULL);
    char *text = NULL;
    if (!spec || !doc || json_object_set_new(doc, "name", json_string(name))) {
        rc = ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory submitting a trial");
        goto out;
    }
    struct spec_parse_opts po = {.default_device = super_default_device(w->super)};
    if ((rc = spec_from_json(doc, &po, spec, err)))
        goto out;
    if (!(text = spec_dumps(spec))) {
        rc = ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory submitting a trial");
        goto out;
    }
    struct store_job_new jn = {.name = name,
                               .spec = text,
                               .world_size = spec->world_size,
                               .device = spec->device,
                               .max_restarts = spec->max_restarts,
                               .total_steps = spec->steps > 0 ? spec->steps : 0,
                               .sweep = sw->id,
                               .sweep_trial = t->idx,
                               .sweep_rung = run->rung,
                               .stop_at = run->stop_at,
                               .resumed_from = run->resumed_from,
                               .resume_step = run->resume_step,
                               /* A job the supervisor loads (its pause and its resume) stores
                                * its queued event itself. */
                               .queued_event = !run->stop_at && !run->resumed_from};
    /* Tagged with its sweep (GET /v1/jobs?tag=sweep-N lists them): a tag jobmeta.h takes. */
    char tags[64];
    snprintf(tags, sizeof tags, "[\"sweep-%" PRId64 "\"]", sw->id);
    jn.tags = tags;
    double created_at = 0;
    if ((rc = store_job_insert(w->store, &jn, job, &created_at, err)))
        goto out;
    if (jn.queued_event) {
        super_submit(w->super, *job, text, spec->world_size, spec->device, spec->max_restarts, created_at);
        text = NULL; /* the supervisor's now */
    } else {
        super_submit(w->super, *job, NULL, spec->world_size, spec->device, spec->max_restarts, created_at);
    }
out:
    free(text);
    json_decref(doc);
    free(spec);
    return rc;
}

/* ---- asha: trials as chains of paused jobs, promoted by sweep_asha_promote ---- */

/* Whether an asha trial in `state` waits between its jobs: its rung completed and not yet
 * decided (paused), or promoted and not yet resumed. */
static bool asha_waiting(const char *state)
{
    return !strcmp(state, "paused") || !strcmp(state, "promoted");
}

/* Whether a trial in `state` has ended for good (stopped: not promoted at a rung). */
static bool trial_ended(const char *state)
{
    return job_state_name_is_final(state) || !strcmp(state, "deleted") || !strcmp(state, "stopped");
}

/* Trial t's completed rungs (its JSON text) with {"rung", "step", "job", "metric",
 * "paused"} appended: a new string, or NULL when out of memory. */
static char *rungs_append(const struct store_trial *t, int64_t step, int64_t job, bool has, double m,
                          bool paused)
{
    json_t *a = json_loads(t->rungs ? t->rungs : "[]", 0, NULL);
    if (!json_is_array(a)) {
        json_decref(a);
        a = json_array();
    }
    json_t *e =
        json_pack("{si sI sI so sb}", "rung", t->rung, "step", (json_int_t)step, "job", (json_int_t)job,
                  "metric", has && isfinite(m) ? json_real(m) : json_null(), "paused", paused);
    char *out = a && e && !json_array_append_new(a, e) ? json_dumps(a, JSON_COMPACT) : NULL;
    json_decref(a);
    return out;
}

/* Trial t's record of rung k: false when it has none. */
static bool rung_entry(const struct store_trial *t, int k, int64_t *step, int64_t *job, bool *has, double *m,
                       bool *paused)
{
    json_t *a = json_loads(t->rungs ? t->rungs : "[]", 0, NULL), *e;
    size_t i;
    bool found = false;
    json_array_foreach (a, i, e) {
        if (json_integer_value(json_object_get(e, "rung")) != k)
            continue;
        json_t *mv = json_object_get(e, "metric");
        *step = json_integer_value(json_object_get(e, "step"));
        *job = json_integer_value(json_object_get(e, "job"));
        *has = json_is_number(mv);
        *m = *has ? json_number_value(mv) : NAN;
        *paused = json_is_true(json_object_get(e, "paused"));
        found = true;
    }
    json_decref(a);
    return found;
}

/* Records the end of trial t's job j: a pause completes its rung (paused, waiting for the
 * rung's decision); any other end is the trial's (its rung recorded too when it has a
 * metric). Updates t->state. */
static void asha_job_ended(struct sweeper *w, const struct store_sweep *sw, struct store_trial *t,
                           const struct store_job *j, sweep_metric metric)
{
    struct ddpd_error e;
    double m = 0;
    bool has = job_metric(w->store, j, metric, &m);
    bool paused =
        j->state == JOB_STATE_SUCCEEDED && j->stop_at > 0 && !strncmp(j->stop_reason, "paused at", 9);
    const char *state = paused ? "paused" : job_state_name(j->state);
    char *rungs = rungs_append(t, paused ? j->stop_at : j->step, j->id, has, m, paused);
    if (rungs && store_trial_set_rungs(w->store, sw->id, t->idx, state, has, m, rungs, &e) == DDPD_OK) {
        /* As stored: this turn's decisions read them. */
        snprintf(t->state, sizeof t->state, "%s", state);
        free(t->rungs);
        t->rungs = rungs;
        t->has_metric = has;
        t->metric = m;
        return;
    }
    free(rungs);
}

/* Decides each rung whose trials have all ended their jobs there: the paused ones are
 * promoted or stopped (sweep_asha_promote over the rung's records, which a restart finds
 * the same, so a decision half stored is completed the same way). */
static void asha_decide(struct sweeper *w, struct store_sweep *sw, int n_rungs, int rf, bool maximize)
{
    struct sweep_rung_result *res = calloc(sw->n_trials ? sw->n_trials : 1, sizeof *res);
    bool *promote = calloc(sw->n_trials ? sw->n_trials : 1, sizeof *promote);
    int *at = calloc(sw->n_trials ? sw->n_trials : 1, sizeof *at);
    for (int k = 0; res && promote && at && k < n_rungs - 1; k++) {
        size_t entered = 0, n = 0;
        bool done = true, undecided = false;
        for (size_t i = 0; i < sw->n_trials; i++) {
            const struct store_trial *t = &sw->trials[i];
            /* A promoted trial has entered the next rung, though its job is not made yet. */
            int in = t->rung + !strcmp(t->state, "promoted");
            if (in < k)
                continue;
            entered++;
            if (in == k && !trial_ended(t->state) && strcmp(t->state, "paused"))
                done = false; /* pending or promoted, or its job still queued or running */
            undecided |= t->rung == k && !strcmp(t->state, "paused");
            int64_t step, job;
            bool paused;
            if (rung_entry(t, k, &step, &job, &res[n].has_metric, &res[n].metric, &paused) && paused) {
                res[n].idx = t->idx;
                at[n++] = (int)i;
            }
        }
        if (!done || !undecided)
            continue;
        sweep_asha_promote(res, n, entered, rf, maximize, promote);
        struct ddpd_error e;
        for (size_t r = 0; r < n; r++) {
            struct store_trial *t = &sw->trials[at[r]];
            if (t->rung != k || strcmp(t->state, "paused"))
                continue;
            const char *state = promote[r] ? "promoted" : "stopped";
            if (store_trial_set(w->store, sw->id, t->idx, 0, state, t->has_metric, t->metric, &e) == DDPD_OK)
                snprintf(t->state, sizeof t->state, "%s", state);
        }
    }
    free(at);
    free(promote);
    free(res);
}

/* One turn over asha sweep *sw (read without the trials' specs). */
static void turn_asha(struct sweeper *w, struct store_sweep *sw)
{
    struct sweep_asha asha;
    struct ddpd_error e;
    json_t *body = json_loads(sw->body ? sw->body : "", 0, NULL);
    ddpd_err arc = sweep_asha_from_json(json_object_get(body, "asha"), &asha, &e);
    json_decref(body);
    if (arc) {
        fprintf(stderr, "ddpd: sweep %" PRId64 ": its asha no longer reads: %s: %s\n", sw->id, e.path,
                e.message);
        return;
    }
    int64_t steps[SWEEP_ASHA_MAX_RUNGS];
    int n_rungs = sweep_asha_rungs(&asha, steps);
    sweep_metric metric = SWEEP_METRIC_EVAL_LOSS;
    sweep_metric_parse(sw->metric, &metric);
    int active = 0;
    for (size_t i = 0; i < sw->n_trials; i++) {
        struct store_trial *t = &sw->trials[i];
        if (!strcmp(t->state, "pending") || asha_waiting(t->state) || trial_ended(t->state))
            continue;
        struct store_job j;
        memset(&j, 0, sizeof j);
        ddpd_err rc = store_job_get(w->store, t->job, &j, &e);
        if (rc == DDPD_ENOTFOUND) {
            if (store_trial_set(w->store, sw->id, t->idx, 0, "deleted", false, 0, &e) == DDPD_OK)
                snprintf(t->state, sizeof t->state, "deleted");
        } else if (rc == DDPD_OK && job_state_is_final(j.state)) {
            asha_job_ended(w, sw, t, &j, metric);
        } else {
            if (rc == DDPD_OK && strcmp(job_state_name(j.state), t->state))
                store_trial_set(w->store, sw->id, t->idx, 0, job_state_name(j.state), t->has_metric,
                                t->metric, &e);
            active++;
        }
        store_job_clear(&j);
    }
    asha_decide(w, sw, n_rungs, asha.rf, !strcmp(sw->mode, "max"));
    bool submits = false;
    size_t ended = 0;
    for (size_t i = 0; i < sw->n_trials; i++) {
        submits |= !strcmp(sw->trials[i].state, "pending") || !strcmp(sw->trials[i].state, "promoted");
        ended += trial_ended(sw->trials[i].state);
    }
    if (ended == sw->n_trials) {
        store_sweep_set_state(w->store, sw->id, "succeeded", "running", &e);
        return;
    }
    if (!submits || active >= sw->max_parallel)
        return;
    /* Room and a trial to start: the trials' specs are read now (states as just written). */
    struct store_sweep full;
    if (store_sweep_get(w->store, sw->id, true, &full, &e) == DDPD_OK) {
        for (size_t i = 0; i < full.n_trials && active < full.max_parallel; i++) {
            const struct store_trial *t = &full.trials[i];
            struct trial_run run = {0};
            bool paused;
            bool has;
            double m;
            if (!strcmp(t->state, "promoted")) {
                run.rung = t->rung + 1;
                if (!rung_entry(t, t->rung, &run.resume_step, &run.resumed_from, &has, &m, &paused))
                    continue;
            } else if (strcmp(t->state, "pending")) {
                continue;
            }
            run.stop_at = run.rung < n_rungs - 1 ? steps[run.rung] : 0;
            int64_t job = 0;
            if (submit_trial(w, &full, t, &run, &job, &e) == DDPD_OK) {
                active++;
            } else if (e.code == DDPD_ESPEC) {
                fprintf(stderr, "ddpd: sweep %" PRId64 " trial %d: %s: %s\n", full.id, t->idx, e.path,
                        e.message);
                store_trial_set(w->store, full.id, t->idx, 0, "failed", false, 0, &e);
            } else {
                break; /* the store is busy: the next turn tries again */
            }
        }
    }
    store_sweep_clear(&full);
}

/* One turn over sweep `id`. */
static void turn_sweep(struct sweeper *w, int64_t id)
{
    struct store_sweep sw;
    struct ddpd_error e;
    /* Without the trials' specs: most turns submit nothing (see below). */
    if (store_sweep_get(w->store, id, false, &sw, &e)) {
        store_sweep_clear(&sw);
        return;
    }
    if (!strcmp(sw.method, "asha")) {
        turn_asha(w, &sw);
        store_sweep_clear(&sw);
        return;
    }
    sweep_metric metric = SWEEP_METRIC_EVAL_LOSS;
    sweep_metric_parse(sw.metric, &metric);
    int active = 0;
    size_t ended = 0;
    for (size_t i = 0; i < sw.n_trials; i++) {
        struct store_trial *t = &sw.trials[i];
        if (!strcmp(t->state, "pending") || job_state_name_is_final(t->state) ||
            !strcmp(t->state, "deleted")) {
            ended += strcmp(t->state, "pending") != 0;
            continue;
        }
        struct store_job j;
        memset(&j, 0, sizeof j);
        ddpd_err rc = store_job_get(w->store, t->job, &j, &e);
        if (rc == DDPD_ENOTFOUND) {
            store_trial_set(w->store, sw.id, t->idx, 0, "deleted", false, 0, &e);
            ended++;
        } else if (rc == DDPD_OK) {
            const char *now = job_state_name(j.state);
            double m = 0;
            bool has = job_metric(w->store, &j, metric, &m);
            if (job_state_is_final(j.state)) {
                store_trial_set(w->store, sw.id, t->idx, 0, now, has, m, &e);
                ended++;
            } else {
                if (strcmp(now, t->state))
                    store_trial_set(w->store, sw.id, t->idx, 0, now, has, m, &e);
                active++;
            }
        } else {
            active++; /* unknown for now: counted as running, looked at next turn */
        }
        store_job_clear(&j);
    }
    bool submits = false;
    for (size_t i = 0; i < sw.n_trials; i++)
        submits |= !strcmp(sw.trials[i].state, "pending");
    /* A trial to submit and room for it: the trials again, with their specs. Their states
     * are the ones this turn just wrote (only this thread writes them while it holds mu),
     * so `active` and `ended` still count them right. */
    if (submits && active < sw.max_parallel) {
        store_sweep_clear(&sw);
        if (store_sweep_get(w->store, id, true, &sw, &e)) {
            store_sweep_clear(&sw);
            return;
        }
    }
    for (size_t i = 0; i < sw.n_trials && active < sw.max_parallel && sw.trials[i].spec; i++) {
        struct store_trial *t = &sw.trials[i];
        if (strcmp(t->state, "pending"))
            continue;
        int64_t job = 0;
        const struct trial_run fresh = {0};
        if (submit_trial(w, &sw, t, &fresh, &job, &e) == DDPD_OK) {
            active++;
        } else if (e.code == DDPD_ESPEC) {
            /* A spec that passed at the sweep's submit and not now (a changed server):
             * the trial fails, the sweep goes on. */
            fprintf(stderr, "ddpd: sweep %" PRId64 " trial %d: %s: %s\n", sw.id, t->idx, e.path, e.message);
            store_trial_set(w->store, sw.id, t->idx, 0, "failed", false, 0, &e);
            ended++;
        } else {
            break; /* the store is busy: the next turn tries again */
        }
    }
    if (ended == sw.n_trials)
        store_sweep_set_state(w->store, sw.id, "succeeded", "running", &e);
    store_sweep_clear(&sw);
}

static void turn(struct sweeper *w)
{
    struct store_sweep *l = NULL;
    size_t n = 0;
    struct ddpd_error e;
    if (store_sweep_list(w->store, "running", STORE_LIST_MAX, 0, &l, &n, &e) == DDPD_OK)
        for (size_t i = n; i-- > 0;) /* oldest first: an earlier sweep's trials go first */
            turn_sweep(w, l[i].id);
    store_sweep_list_free(l, n);
}

static void *sweeper_main(void *arg)
{
    struct sweeper *w = arg;
    pthread_mutex_lock(&w->mu);
    while (!w->stop) {
        turn(w);
        if (!w->kicked && !w->stop && !atomic_exchange(&w->ended, false)) {
            struct timespec until = base_timespec_after(CLOCK_MONOTONIC, TURN_S);
            pthread_cond_timedwait(&w->cv, &w->mu, &until);
        }
        w->kicked = false;
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

/* super_on_end's hook: a job ended, so a trial may have (and a slot is free). Never
 * blocks: when the thread holds mu (a turn), the flag makes it turn again after that turn
 * (or, in the moment between its check of the flag and its wait, after TURN_S). */
static void job_ended(void *ctx)
{
    struct sweeper *w = ctx;
    atomic_store(&w->ended, true);
    if (pthread_mutex_trylock(&w->mu) == 0) {
        pthread_cond_signal(&w->cv);
        pthread_mutex_unlock(&w->mu);
    }
}

struct sweeper *sweeper_start(struct store *store, struct super *super, struct ddpd_error *err)
{
    struct sweeper *w = calloc(1, sizeof *w);
    if (!w) {
        ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory for the sweep controller");
        return NULL;
    }
    w->store = store;
    w->super = super;
    pthread_mutex_init(&w->mu, NULL);
    base_cond_init_mono(&w->cv);
    if (pthread_create(&w->thread, NULL, sweeper_main, w)) {
        pthread_cond_destroy(&w->cv);
        pthread_mutex_destroy(&w->mu);
        free(w);
        ddpd_error_set(err, DDPD_EINTERNAL, "", "cannot start the sweep controller's thread");
        return NULL;
    }
    super_on_end(super, job_ended, w);
    return w;
}

void sweeper_kick(struct sweeper *w)
{
    if (!w)
        return;
    pthread_mutex_lock(&w->mu);
    w->kicked = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

ddpd_err sweeper_cancel(struct sweeper *w, int64_t id, struct ddpd_error *err)
{
    pthread_mutex_lock(&w->mu);
    struct store_sweep sw;
    memset(&sw, 0, sizeof sw);
    ddpd_err rc = store_sweep_set_state(w->store, id, "cancelled", "running", err);
    if (rc == DDPD_OK && (rc = store_sweep_get(w->store, id, false, &sw, err)) == DDPD_OK) {
        struct ddpd_error e;
        for (size_t i = 0; i < sw.n_trials; i++) {
            struct store_trial *t = &sw.trials[i];
            if (!strcmp(t->state, "pending") || asha_waiting(t->state)) {
                store_trial_set(w->store, id, t->idx, 0, "cancelled", t->has_metric, t->metric, &e);
            } else if (t->job > 0 && !trial_ended(t->state)) {
                /* Its end (cancelled) is recorded by the job's own state: the trial is
                 * marked so now, as the supervisor will have it. */
                ddpd_err c = super_cancel(w->super, t->job, &e);
                struct store_job j;
                memset(&j, 0, sizeof j);
                if (c == DDPD_OK)
                    store_trial_set(w->store, id, t->idx, 0, "cancelled", t->has_metric, t->metric, &e);
                else if (c == DDPD_ECONFLICT && store_job_get(w->store, t->job, &j, &e) == DDPD_OK)
                    store_trial_set(w->store, id, t->idx, 0, job_state_name(j.state), t->has_metric,
                                    t->metric, &e); /* it ended before the cancel came */
                store_job_clear(&j);
            }
        }
    }
    store_sweep_clear(&sw);
    pthread_mutex_unlock(&w->mu);
    return rc;
}

void sweeper_stop(struct sweeper *w)
{
    if (!w)
        return;
    super_on_end(w->super, NULL, NULL);
    pthread_mutex_lock(&w->mu);
    w->stop = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    free(w);
}
