/* api_sweeps.c — the sweep routes: POST /v1/sweeps (the request checked and expanded by
 * sweep/sweep_plan.c, each trial checked as a job's submission is, trial 0's files read by
 * a planner, then stored with its trials and the controller woken), GET /v1/sweeps, GET
 * /v1/sweeps/{id} (the trials ranked by the metric, the best one's spec) and POST
 * /v1/sweeps/{id}/cancel. The jobs themselves are the controller's (sweep/sweep.h). */
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api_impl.h"
#include "http.h"
#include "planner.h"
#include "store.h"
#include "super.h"
#include "sweep/sweep.h"
#include "users.h"

/* Who submits a sweep, for its trials' checks. */
struct trial_ctx {
    struct api *a;
    const struct user *u;
};

/* Each trial's own checks beside spec_from_json, as a job's submission makes them: the
 * server can run it (super_fits), the submitter's limits allow it (priority,
 * preemptible, world size: api_users.c), and a spec without files fits
 * --max-rank-memory. */
static ddpd_err trial_check(void *ctx, const struct spec *spec, struct ddpd_error *err)
{
    const struct trial_ctx *tc = ctx;
    struct api *a = tc->a;
    char why[512];
    const char *blame;
    ddpd_err rc;
    if (!super_fits(a->super, spec->device, spec->world_size, why, sizeof why, &blame))
        return ddpd_error_set(err, DDPD_ESPEC, blame, "%s", why);
    if ((rc = api__user_limits(a, tc->u, spec, false, err)))
        return rc;
    return api__spec_has_files(spec) ? DDPD_OK : api__memory_check(a, spec, err);
}

/* A sweep checked, from its request until it is stored and answered. */
struct sweep_submission {
    struct http_request *req; /* deferred while a planner reads trial 0's files */
    struct api *a;
    struct sweep_plan p;
    char *text;        /* the request as stored */
    struct spec spec0; /* trial 0's spec, for the planner's counts */
    char owner[STORE_OWNER_MAX];
};

static void submission_free(struct sweep_submission *sub)
{
    sweep_plan_free(&sub->p);
    free(sub->text);
    free(sub);
}

/* Stores the sweep and its trials, wakes the controller and answers 201. */
static ddpd_err sweep_store(struct sweep_submission *sub, struct ddpd_error *err)
{
    const struct sweep_plan *p = &sub->p;
    const char *mode = p->maximize ? "max" : "min";
    struct store_sweep_new sn = {.body = sub->text,
                                 .method = sweep_method_name(p->method),
                                 .metric = sweep_metric_name(p->metric),
                                 .mode = mode,
                                 .max_parallel = p->max_parallel,
                                 .n = p->n,
                                 .params = p->params,
                                 .specs = p->specs,
                                 .owner = sub->owner[0] ? sub->owner : NULL};
    int64_t id = 0;
    ddpd_err rc = store_sweep_insert(sub->a->store, &sn, &id, err);
    if (rc)
        return rc;
    sweeper_kick(sub->a->sweeper);
    char loc[64];
    snprintf(loc, sizeof loc, "/v1/sweeps/%" PRId64, id);
    http_response_header(sub->req, "Location", loc);
    return http_respond_json(sub->req, 201,
                             json_pack("{sI ss ss ss ss si sI}", "id", (json_int_t)id, "state", "running",
                                       "method", sn.method, "metric", sn.metric, "mode", mode, "max_parallel",
                                       p->max_parallel, "trials", (json_int_t)p->n));
}

/* The planner's answer on trial 0's files, on a planner thread. Its errors name the
 * trial, as the spec checks do: the base spec's files are every trial's. */
static void sweep_planned(void *ctx, ddpd_err rc, const int64_t *counts, bool known,
                          const struct ddpd_error *perr)
{
    struct sweep_submission *sub = ctx;
    struct ddpd_error err, e;
    ddpd_error_clear(&err);
    if (rc != DDPD_OK)
        api__plan_error(rc, perr, &e);
    else if (known)
        rc = spec_check_batch_counts(&sub->spec0, counts, &e);
    if (rc != DDPD_OK) {
        ddpd_error_set(&err, rc, "", "trial 0 %s: %s%s%s", sub->p.params[0], e.path, e.path[0] ? ": " : "",
                       e.message);
        snprintf(err.path, sizeof err.path, "trials[0]");
    } else {
        rc = sweep_store(sub, &err);
    }
    http_deferred_done(sub->req, rc, &err);
    submission_free(sub);
}

ddpd_err api__sweep_submit(struct http_request *req, struct ddpd_error *err)
{
    struct api *a = api__ctx(req);
    struct spec_parse_opts po = {.default_device = super_default_device(a->super)};
    struct sweep_submission *sub = calloc(1, sizeof *sub); /* a spec: not on an HTTP thread's stack */
    if (!sub)
        return ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory checking the sweep");
    sub->req = req;
    sub->a = a;
    json_t *body = http_request_json(req);
    const struct user *u = http_request_user(req);
    snprintf(sub->owner, sizeof sub->owner, "%s", u ? u->name : "");
    struct trial_ctx tc = {a, u};
    ddpd_err rc = sweep_plan_from_json(body, &po, trial_check, &tc, &sub->p, err);
    if (rc == DDPD_OK && !(sub->text = json_dumps(body, JSON_COMPACT | JSON_PRESERVE_ORDER)))
        rc = ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory storing the sweep");
    if (rc == DDPD_OK) {
        json_t *doc0 = json_loads(sub->p.specs[0], 0, NULL);
        struct ddpd_error e;
        if (!doc0 || spec_from_json(doc0, &po, &sub->spec0, &e) != DDPD_OK)
            rc = ddpd_error_set(err, DDPD_EINTERNAL, "", "trial 0's spec no longer parses");
        json_decref(doc0);
    }
    /* The submitter's queued jobs: a sweep adds to them (max_queued). */
    if (rc == DDPD_OK)
        rc = api__user_limits(a, u, &sub->spec0, true, err);
    if (rc)
        goto out;
    if (!api__spec_has_files(&sub->spec0)) {
        rc = sweep_store(sub, err);
        goto out;
    }
    /* The data, eval data, init weights or tokenizer of trial 0 read by a planner, as a
     * job's are at its submit: a missing or unreadable file is a 422 now, not a failed job
     * per trial. Trials whose values change the files are checked when their jobs run. */
    char init_path[PATH_MAX] = "";
    if (sub->spec0.init_from_job > 0 &&
        (rc = api__resolve_init_job(a, &sub->spec0, init_path, sizeof init_path, err)))
        goto out;
    json_t *doc = api__plan_doc(a, &sub->spec0, init_path, NULL, false);
    if (!doc) {
        rc = ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory checking the sweep's data");
        goto out;
    }
    http_defer(req);
    if ((rc = planner_plan_async(a->planner, doc, sub->spec0.world_size, a->plan_timeout_s, sweep_planned,
                                 sub, err))) {
        http_deferred_done(req, rc, err); /* nothing queued: answered now */
        submission_free(sub);
    }
    return DDPD_OK; /* sub is the planner's now */
out:
    submission_free(sub);
    return rc;
}

static json_t *time_or_null(double t)
{
    return t > 0 ? json_real(t) : json_null();
}

/* The fields a sweep shows in the list and in its own page. */
static json_t *sweep_head(const struct store_sweep *sw)
{
    return json_pack("{sI ss ss ss ss si so so}", "id", (json_int_t)sw->id, "state", sw->state, "method",
                     sw->method, "metric", sw->metric, "mode", sw->mode, "max_parallel", sw->max_parallel,
                     "created_at", time_or_null(sw->created_at), "finished_at",
                     time_or_null(sw->finished_at));
}

/* The rungs trial t completed (asha; 0 for grid and random trials). */
static size_t rungs_done(const struct store_trial *t)
{
    json_t *a = json_loads(t->rungs ? t->rungs : "[]", 0, NULL);
    size_t n = json_array_size(a);
    json_decref(a);
    return n;
}

/* Whether trial a ranks before trial b: more rungs completed (asha) first, then a metric
 * before none, then the better metric (the lower for mode min), then the lower index.
 * done[] are the trials' rungs_done by index. */
static bool ranks_before(const struct store_trial *a, const struct store_trial *b, const size_t *done,
                         bool maximize)
{
    if (done[a->idx] != done[b->idx])
        return done[a->idx] > done[b->idx];
    if (a->has_metric != b->has_metric)
        return a->has_metric;
    if (a->has_metric && a->metric != b->metric)
        return maximize ? a->metric > b->metric : a->metric < b->metric;
    return a->idx < b->idx;
}

static json_t *trial_json(const struct store_trial *t, int rank)
{
    json_t *params = json_loads(t->params, 0, NULL);
    json_t *o = json_pack("{si si so ss so}", "index", t->idx, "rank", rank, "params",
                          params ? params : json_object(), "state", t->state, "metric",
                          t->has_metric ? json_real(t->metric) : json_null());
    if (o) {
        json_object_set_new(o, "job", t->job > 0 ? json_integer(t->job) : json_null());
        /* asha: the rung its latest job runs to, and each rung it completed with its job. */
        json_t *rungs = json_loads(t->rungs ? t->rungs : "[]", 0, NULL);
        json_object_set_new(o, "rung", json_integer(t->rung));
        json_object_set_new(o, "rungs", rungs ? rungs : json_array());
    }
    return o;
}

ddpd_err api__sweep_get(struct http_request *req, struct ddpd_error *err)
{
    struct api *a = api__ctx(req);
    struct store_sweep sw;
    size_t *order = NULL, *done = NULL;
    ddpd_err rc = store_sweep_get(a->store, http_request_id(req, 0), true, &sw, err);
    if (rc)
        goto out;
    bool maximize = !strcmp(sw.mode, "max");
    if (sw.n_trials &&
        (!(order = calloc(sw.n_trials, sizeof *order)) || !(done = calloc(sw.n_trials, sizeof *done)))) {
        rc = ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory showing the sweep");
        goto out;
    }
    for (size_t i = 0; i < sw.n_trials; i++)
        if (sw.trials[i].idx >= 0 && (size_t)sw.trials[i].idx < sw.n_trials)
            done[sw.trials[i].idx] = rungs_done(&sw.trials[i]);
    /* Insertion sort: stable, and a sweep has at most SWEEP_MAX_TRIALS trials. */
    for (size_t i = 0; i < sw.n_trials; i++) {
        size_t k = i;
        while (k > 0 && ranks_before(&sw.trials[i], &sw.trials[order[k - 1]], done, maximize)) {
            order[k] = order[k - 1];
            k--;
        }
        order[k] = i;
    }
    json_t *o = sweep_head(&sw), *trials = json_array(), *counts = json_object(), *best = json_null();
    /* Its owner (the dashboard shows Cancel to the owner and admins only). */
    char owner[STORE_OWNER_MAX] = "";
    if (store_owner_get(a->store, true, sw.id, owner, sizeof owner, NULL) == DDPD_OK)
        json_object_set_new(o, "owner", owner[0] ? json_string(owner) : json_null());
    for (size_t r = 0; r < sw.n_trials; r++) {
        const struct store_trial *t = &sw.trials[order[r]];
        json_array_append_new(trials, trial_json(t, (int)r + 1));
        json_t *c = json_object_get(counts, t->state);
        json_object_set_new(counts, t->state, json_integer(c ? json_integer_value(c) + 1 : 1));
        /* The best: the first ranked trial that succeeded with a metric. */
        if (json_is_null(best) && t->has_metric && !strcmp(t->state, "succeeded")) {
            json_decref(best);
            best = trial_json(t, (int)r + 1);
            json_t *spec = json_loads(t->spec ? t->spec : "", 0, NULL);
            json_object_set_new(best, "spec", spec ? spec : json_null());
        }
    }
    json_t *request = json_loads(sw.body ? sw.body : "", 0, NULL);
    json_object_set_new(o, "trials", trials);
    json_object_set_new(o, "counts", counts);
    json_object_set_new(o, "best", best);
    json_object_set_new(o, "request", request ? request : json_null());
    rc = http_respond_json(req, 200, o);
out:
    free(done);
    free(order);
    store_sweep_clear(&sw);
    return rc;
}

static const char *const sweep_states[] = {"running", "succeeded", "cancelled", NULL};

ddpd_err api__sweep_list(struct http_request *req, struct ddpd_error *err)
{
    struct api *a = api__ctx(req);
    int st = -1;
    int64_t limit, before;
    ddpd_err rc;
    if ((rc = http_query_enum(req, "state", sweep_states, -1, &st, err)) ||
        (rc = http_query_int(req, "limit", 1, STORE_LIST_MAX, 50, &limit, err)) ||
        (rc = http_query_int(req, "before", 1, INT64_MAX, 0, &before, err)))
        return rc;
    struct store_sweep *l = NULL;
    size_t n = 0;
    if ((rc = store_sweep_list(a->store, st >= 0 ? sweep_states[st] : NULL, (int)limit, before, &l, &n, err)))
        goto out;
    json_t *arr = json_array();
    for (size_t i = 0; i < n; i++) {
        json_t *o = sweep_head(&l[i]);
        json_object_set_new(o, "trials", json_integer((json_int_t)l[i].n_trials));
        json_array_append_new(arr, o);
    }
    json_t *next = n == (size_t)limit && n > 0 ? json_integer(l[n - 1].id) : json_null();
    rc = http_respond_json(req, 200, json_pack("{so so}", "sweeps", arr, "next", next));
out:
    store_sweep_list_free(l, n);
    return rc;
}

ddpd_err api__sweep_cancel(struct http_request *req, struct ddpd_error *err)
{
    ddpd_err rc = sweeper_cancel(api__ctx(req)->sweeper, http_request_id(req, 0), err);
    return rc ? rc : http_respond_empty(req, 202);
}
