/* api_sweeps.c — the sweep routes: POST /v1/sweeps (the request checked and expanded by
 * sweep/sweep_plan.c, stored with its trials, the controller woken), GET /v1/sweeps, GET
 * /v1/sweeps/{id} (the trials ranked by the metric, the best one's spec) and POST
 * /v1/sweeps/{id}/cancel. The jobs themselves are the controller's (sweep/sweep.h). */
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api_impl.h"
#include "http.h"
#include "store.h"
#include "super.h"
#include "sweep/sweep.h"

ddpd_err api__sweep_submit(struct http_request *req, struct ddpd_error *err)
{
    struct api *a = api__ctx(req);
    json_t *body = http_request_json(req);
    struct spec_parse_opts po = {.default_device = super_default_device(a->super)};
    struct sweep_plan p;
    char *text = NULL;
    ddpd_err rc = sweep_plan_from_json(body, &po, &p, err);
    for (size_t i = 0; rc == DDPD_OK && i < p.n; i++) {
        char why[512];
        const char *blame;
        if (!super_fits(a->super, p.device[i], p.world[i], why, sizeof why, &blame)) {
            rc = ddpd_error_set(err, DDPD_ESPEC, "", "trial %zu %s: %s: %s", i, p.params[i], blame, why);
            snprintf(err->path, sizeof err->path, "trials[%zu]", i);
        }
    }
    if (rc)
        goto out;
    if (!(text = json_dumps(body, JSON_COMPACT | JSON_PRESERVE_ORDER))) {
        rc = ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory storing the sweep");
        goto out;
    }
    const char *mode = p.maximize ? "max" : "min";
    struct store_sweep_new sn = {.body = text,
                                 .method = sweep_method_name(p.method),
                                 .metric = sweep_metric_name(p.metric),
                                 .mode = mode,
                                 .max_parallel = p.max_parallel,
                                 .n = p.n,
                                 .params = p.params,
                                 .specs = p.specs};
    int64_t id = 0;
    if ((rc = store_sweep_insert(a->store, &sn, &id, err)))
        goto out;
    sweeper_kick(a->sweeper);
    char loc[64];
    snprintf(loc, sizeof loc, "/v1/sweeps/%" PRId64, id);
    http_response_header(req, "Location", loc);
    rc = http_respond_json(req, 201,
                           json_pack("{sI ss ss ss ss si sI}", "id", (json_int_t)id, "state", "running",
                                     "method", sn.method, "metric", sn.metric, "mode", mode, "max_parallel",
                                     p.max_parallel, "trials", (json_int_t)p.n));
out:
    free(text);
    sweep_plan_free(&p);
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

/* Whether trial a ranks before trial b: a metric before none, then the better metric
 * (the lower for mode min), then the lower index. */
static bool ranks_before(const struct store_trial *a, const struct store_trial *b, bool maximize)
{
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
    if (o)
        json_object_set_new(o, "job", t->job > 0 ? json_integer(t->job) : json_null());
    return o;
}

ddpd_err api__sweep_get(struct http_request *req, struct ddpd_error *err)
{
    struct api *a = api__ctx(req);
    struct store_sweep sw;
    size_t *order = NULL;
    ddpd_err rc = store_sweep_get(a->store, http_request_id(req, 0), true, &sw, err);
    if (rc)
        goto out;
    bool maximize = !strcmp(sw.mode, "max");
    if (sw.n_trials && !(order = calloc(sw.n_trials, sizeof *order))) {
        rc = ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory showing the sweep");
        goto out;
    }
    /* Insertion sort: stable, and a sweep has at most SWEEP_MAX_TRIALS trials. */
    for (size_t i = 0; i < sw.n_trials; i++) {
        size_t k = i;
        while (k > 0 && ranks_before(&sw.trials[i], &sw.trials[order[k - 1]], maximize)) {
            order[k] = order[k - 1];
            k--;
        }
        order[k] = i;
    }
    json_t *o = sweep_head(&sw), *trials = json_array(), *counts = json_object(), *best = json_null();
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
