/* sweep_plan.c — a POST /v1/sweeps body checked and expanded into its trials: the
 * parameters' paths set in copies of the base spec, the grid's product or the random
 * method's draws, every trial's spec validated as a job's would be. Pure: no store, no
 * HTTP, no threads. */
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sweep.h"

static const char *const method_names[] = {"grid", "random", "asha"};
static const char *const metric_names[] = {"eval_loss", "eval_accuracy", "loss"};

const char *sweep_method_name(sweep_method m)
{
    return method_names[m];
}

const char *sweep_metric_name(sweep_metric m)
{
    return metric_names[m];
}

bool sweep_metric_parse(const char *name, sweep_metric *out)
{
    for (int i = 0; i < 3; i++)
        if (!strcmp(name, metric_names[i])) {
            *out = (sweep_metric)i;
            return true;
        }
    return false;
}

/* ---- the random method's generator ---- */

uint64_t sweep_rand_next(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double sweep_rand_unit(uint64_t *state)
{
    return (double)(sweep_rand_next(state) >> 11) * 0x1.0p-53;
}

/* ---- paths ---- */

bool sweep_path_set(json_t *root, const char *path, json_t *value, char *why, size_t cap)
{
    json_t *cur = root;
    char seen[SWEEP_PATH_MAX + 1] = "the spec"; /* what cur is, for the messages */
    const char *p = path;
    bool ok = false;
    if (!*p || strlen(path) > SWEEP_PATH_MAX) {
        snprintf(why, cap, "expected a dotted path of at most %d bytes, such as \"optimizer.lr\"",
                 SWEEP_PATH_MAX);
        goto out;
    }
    while (*p) {
        /* One key, then its [i] indexes. */
        size_t k = strcspn(p, ".[");
        if (k == 0) {
            snprintf(why, cap, "expected a key at byte %zu", (size_t)(p - path));
            goto out;
        }
        char key[SWEEP_PATH_MAX + 1];
        memcpy(key, p, k);
        key[k] = '\0';
        p += k;
        if (!json_is_object(cur)) {
            snprintf(why, cap, "%s is not an object", seen);
            goto out;
        }
        json_t *next = json_object_get(cur, key);
        if (!next) {
            snprintf(why, cap, "no key \"%s\" in %s", key, seen);
            goto out;
        }
        snprintf(seen, sizeof seen, "%.*s", (int)(p - path), path);
        /* The last step sets; every other one descends. */
        json_t *parent = cur;
        const char *last_key = NULL;
        size_t last_index = 0;
        if (*p == '\0') {
            last_key = key;
        }
        cur = next;
        while (*p == '[') {
            char *end;
            long long i = strtoll(p + 1, &end, 10);
            if (end == p + 1 || *end != ']' || i < 0 || p[1] == '-' || p[1] == '+') {
                snprintf(why, cap, "expected [index] at byte %zu", (size_t)(p - path));
                goto out;
            }
            if (!json_is_array(cur)) {
                snprintf(why, cap, "%s is not a list", seen);
                goto out;
            }
            if ((size_t)i >= json_array_size(cur)) {
                snprintf(why, cap, "%s has %zu items, no [%lld]", seen, json_array_size(cur), i);
                goto out;
            }
            p = end + 1;
            snprintf(seen, sizeof seen, "%.*s", (int)(p - path), path);
            parent = cur;
            cur = json_array_get(cur, (size_t)i);
            if (*p == '\0') {
                last_index = (size_t)i;
                last_key = NULL;
            }
        }
        if (*p == '\0') {
            int rc = last_key ? json_object_set(parent, last_key, value)
                              : json_array_set(parent, last_index, value);
            if (rc) {
                snprintf(why, cap, "out of memory");
                goto out;
            }
            ok = true;
            goto out;
        }
        if (*p != '.' || p[1] == '\0') {
            snprintf(why, cap, "expected \".key\" or \"[index]\" at byte %zu", (size_t)(p - path));
            goto out;
        }
        p++;
    }
out:
    json_decref(value);
    return ok;
}

/* ---- the request ---- */

/* One parameter: its path and its values (a list) or its range. */
struct param {
    const char *path; /* borrowed from the body */
    json_t *values;   /* borrowed; NULL for a range */
    double min, max;
    bool log, is_int;
};

static int param_cmp(const void *a, const void *b)
{
    return strcmp(((const struct param *)a)->path, ((const struct param *)b)->path);
}

static bool is_num(const json_t *v)
{
    return json_is_number(v) && isfinite(json_number_value(v));
}

/* parameters["<path>"] as a list or a range into *p. */
static ddpd_err param_parse(const char *path, json_t *v, sweep_method method, struct param *p,
                            struct ddpd_error *err)
{
    char where[SWEEP_PATH_MAX + 32];
    snprintf(where, sizeof where, "parameters[\"%.*s\"]", SWEEP_PATH_MAX, path);
    *p = (struct param){.path = path};
    size_t len = strlen(path);
    if (len == 0 || len > SWEEP_PATH_MAX ||
        strspn(path, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                     "0123456789_.[]") != len)
        return ddpd_error_set(err, DDPD_ESPEC, "parameters",
                              "a path of 1..%d letters, digits, '_', '.', '[' and ']' expected, such as "
                              "\"optimizer.lr\" or \"model[2].out\"",
                              SWEEP_PATH_MAX);
    if (json_is_array(v)) {
        if (json_array_size(v) < 1 || json_array_size(v) > SWEEP_MAX_VALUES)
            return ddpd_error_set(err, DDPD_ESPEC, where, "expected a list of 1..%d values, got %zu",
                                  SWEEP_MAX_VALUES, json_array_size(v));
        p->values = v;
        return DDPD_OK;
    }
    if (!json_is_object(v))
        return ddpd_error_set(err, DDPD_ESPEC, where,
                              "expected a list of values or a range {\"min\", \"max\", \"log\", \"type\"}");
    if (method == SWEEP_GRID)
        return ddpd_error_set(err, DDPD_ESPEC, where, "a grid needs a list of values, not a range");
    const char *key;
    json_t *x;
    json_object_foreach (v, key, x) {
        if (strcmp(key, "min") && strcmp(key, "max") && strcmp(key, "log") && strcmp(key, "type"))
            return ddpd_error_set(err, DDPD_ESPEC, where, "unknown key \"%s\" (expected min, max, log, type)",
                                  key);
    }
    json_t *mn = json_object_get(v, "min"), *mx = json_object_get(v, "max"), *lg = json_object_get(v, "log"),
           *ty = json_object_get(v, "type");
    if (ty && !(json_is_string(ty) &&
                (!strcmp(json_string_value(ty), "int") || !strcmp(json_string_value(ty), "float"))))
        return ddpd_error_set(err, DDPD_ESPEC, where, "type: expected \"int\" or \"float\"");
    p->is_int = ty && !strcmp(json_string_value(ty), "int");
    if (!is_num(mn) || !is_num(mx))
        return ddpd_error_set(err, DDPD_ESPEC, where, "expected finite numbers min and max");
    if (p->is_int && !(json_is_integer(mn) && json_is_integer(mx)))
        return ddpd_error_set(err, DDPD_ESPEC, where, "type int: expected integers min and max");
    if (lg && !json_is_boolean(lg))
        return ddpd_error_set(err, DDPD_ESPEC, where, "log: expected true or false");
    p->min = json_number_value(mn);
    p->max = json_number_value(mx);
    p->log = json_is_true(lg);
    if (p->min > p->max)
        return ddpd_error_set(err, DDPD_ESPEC, where, "expected min <= max, got %g > %g", p->min, p->max);
    if (p->log && p->min <= 0)
        return ddpd_error_set(err, DDPD_ESPEC, where, "log: expected min > 0, got %g", p->min);
    return DDPD_OK;
}

/* One random draw of parameter p (a new reference). */
static json_t *draw(const struct param *p, uint64_t *rng)
{
    double u = sweep_rand_unit(rng);
    if (p->values) {
        size_t n = json_array_size(p->values), i = (size_t)(u * (double)n);
        return json_incref(json_array_get(p->values, i < n ? i : n - 1));
    }
    if (p->is_int) {
        double hi = p->max + 1;
        double x = p->log ? exp(log(p->min) + u * (log(hi) - log(p->min))) : p->min + u * (hi - p->min);
        double f = floor(x);
        return json_integer((json_int_t)(f > p->max ? p->max : f < p->min ? p->min : f));
    }
    double x = p->log ? exp(log(p->min) + u * (log(p->max) - log(p->min))) : p->min + u * (p->max - p->min);
    return json_real(x > p->max ? p->max : x < p->min ? p->min : x);
}

static const char *const body_keys[] = {"spec",         "parameters", "method", "metric", "mode",
                                        "max_parallel", "count",      "seed",   "asha"};

static ddpd_err check_keys(json_t *body, struct ddpd_error *err)
{
    const char *key;
    json_t *v;
    json_object_foreach (body, key, v) {
        bool known = false;
        for (size_t i = 0; i < sizeof body_keys / sizeof body_keys[0]; i++)
            known |= !strcmp(key, body_keys[i]);
        if (!known)
            return ddpd_error_set(err, DDPD_ESPEC, key,
                                  "unknown key (expected one of spec, parameters, method, metric, mode, "
                                  "max_parallel, count, seed, asha)");
    }
    return DDPD_OK;
}

/* An integer member of the body in [lo, hi], or dflt when absent (required: dflt < lo). */
static ddpd_err get_int(json_t *body, const char *key, int64_t lo, int64_t hi, int64_t dflt, int64_t *out,
                        struct ddpd_error *err)
{
    json_t *v = json_object_get(body, key);
    if (!v && dflt >= lo) {
        *out = dflt;
        return DDPD_OK;
    }
    if (!v)
        return ddpd_error_set(err, DDPD_ESPEC, key, "required: an integer %" PRId64 "..%" PRId64, lo, hi);
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return ddpd_error_set(err, DDPD_ESPEC, key, "expected an integer %" PRId64 "..%" PRId64, lo, hi);
    *out = json_integer_value(v);
    return DDPD_OK;
}

/* Trial `t`'s spec from the base and its values vals[np] (borrowed): validated, its
 * texts stored in p. */
static ddpd_err make_trial(json_t *base, const struct param *ps, json_t **vals, size_t np, size_t t,
                           const struct spec_parse_opts *po, sweep_trial_check_fn check, void *ctx,
                           struct spec *spec, struct sweep_plan *p, struct ddpd_error *err)
{
    ddpd_err rc = DDPD_OK;
    json_t *doc = json_deep_copy(base), *params = json_object();
    char why[256];
    if (!doc || !params) {
        rc = ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory expanding the sweep");
        goto out;
    }
    for (size_t i = 0; i < np; i++) {
        if (!sweep_path_set(doc, ps[i].path, json_incref(vals[i]), why, sizeof why)) {
            rc = ddpd_error_set(err, DDPD_ESPEC, "", "%s", why);
            snprintf(err->path, sizeof err->path, "parameters[\"%.*s\"]", SWEEP_PATH_MAX, ps[i].path);
            goto out;
        }
        json_object_set(params, ps[i].path, vals[i]);
    }
    char *ptext = json_dumps(params, JSON_COMPACT | JSON_PRESERVE_ORDER);
    struct ddpd_error e;
    ddpd_error_clear(&e);
    rc = spec_from_json(doc, po, spec, &e);
    if (rc == DDPD_OK && check)
        rc = check(ctx, spec, &e);
    if (rc) {
        rc = ddpd_error_set(err, rc == DDPD_ENOMEM || rc == DDPD_EFORBIDDEN ? rc : DDPD_ESPEC, "",
                            "trial %zu %s: %s%s%s", t, ptext ? ptext : "", e.path, e.path[0] ? ": " : "",
                            e.message);
        snprintf(err->path, sizeof err->path, "trials[%zu]", t);
        free(ptext);
        goto out;
    }
    p->params[t] = ptext;
    p->specs[t] = json_dumps(doc, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!p->params[t] || !p->specs[t])
        rc = ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory expanding the sweep");
    else if ((p->bytes += strlen(p->specs[t]) + strlen(p->params[t])) > SWEEP_MAX_BYTES)
        rc = ddpd_error_set(err, DDPD_ETOOBIG, "parameters",
                            "the trials' specs take more than %u MiB together: too large (fewer trials, or a "
                            "smaller spec)",
                            SWEEP_MAX_BYTES >> 20);
out:
    json_decref(params);
    json_decref(doc);
    return rc;
}

/* asha's rungs must each have the metric: with an eval metric, each rung's step is an
 * eval step of the base spec. */
static ddpd_err asha_check(const struct sweep_plan *p, const struct spec *spec, struct ddpd_error *err)
{
    if (p->metric == SWEEP_METRIC_LOSS)
        return DDPD_OK;
    int64_t steps[SWEEP_ASHA_MAX_RUNGS], every = spec->eval.every_steps;
    if (every <= 0)
        return ddpd_error_set(err, DDPD_ESPEC, "metric",
                              "%s needs the spec's eval (eval.every_steps): each rung's step is an eval step",
                              sweep_metric_name(p->metric));
    int n = sweep_asha_rungs(&p->asha, steps);
    for (int k = 0; k < n; k++)
        if (steps[k] % every)
            return ddpd_error_set(err, DDPD_ESPEC, k == n - 1 ? "asha.max_steps" : "asha.min_steps",
                                  "rung %d's step %" PRId64
                                  " is not an eval step (eval.every_steps is %" PRId64
                                  "): %s is measured at each rung's step",
                                  k, steps[k], every, sweep_metric_name(p->metric));
    return DDPD_OK;
}

ddpd_err sweep_plan_from_json(json_t *body, const struct spec_parse_opts *po, sweep_trial_check_fn check,
                              void *ctx, struct sweep_plan *out, struct ddpd_error *err)
{
    memset(out, 0, sizeof *out);
    struct param ps[SWEEP_MAX_PARAMS];
    json_t *vals[SWEEP_MAX_PARAMS];
    struct spec *spec = NULL;
    json_t *own = NULL; /* asha: the base with its steps set */
    ddpd_err rc;
    size_t np = 0;
    int64_t v;

    if (!json_is_object(body))
        return ddpd_error_set(err, DDPD_ESPEC, "",
                              "expected an object {\"spec\", \"parameters\", \"method\", ...}");
    if ((rc = check_keys(body, err)))
        return rc;

    json_t *m = json_object_get(body, "method");
    const char *ms = json_string_value(m);
    if (ms && !strcmp(ms, "grid"))
        out->method = SWEEP_GRID;
    else if (ms && !strcmp(ms, "random"))
        out->method = SWEEP_RANDOM;
    else if (ms && !strcmp(ms, "asha"))
        out->method = SWEEP_ASHA;
    else
        return ddpd_error_set(err, DDPD_ESPEC, "method", "required: \"grid\", \"random\" or \"asha\"");
    if (out->method != SWEEP_ASHA && json_object_get(body, "asha"))
        return ddpd_error_set(err, DDPD_ESPEC, "asha", "only for method \"asha\"");
    if (out->method == SWEEP_ASHA &&
        (rc = sweep_asha_from_json(json_object_get(body, "asha"), &out->asha, err)))
        return rc;

    json_t *mt = json_object_get(body, "metric");
    if (!mt)
        out->metric = SWEEP_METRIC_EVAL_LOSS;
    else if (!json_is_string(mt) || !sweep_metric_parse(json_string_value(mt), &out->metric))
        return ddpd_error_set(err, DDPD_ESPEC, "metric",
                              "expected \"eval_loss\", \"eval_accuracy\" or \"loss\"");
    json_t *md = json_object_get(body, "mode");
    if (!md)
        out->maximize = out->metric == SWEEP_METRIC_EVAL_ACCURACY;
    else if (json_is_string(md) && !strcmp(json_string_value(md), "min"))
        out->maximize = false;
    else if (json_is_string(md) && !strcmp(json_string_value(md), "max"))
        out->maximize = true;
    else
        return ddpd_error_set(err, DDPD_ESPEC, "mode", "expected \"min\" or \"max\"");

    if ((rc = get_int(body, "max_parallel", 1, SWEEP_MAX_PARALLEL, 1, &v, err)))
        return rc;
    out->max_parallel = (int)v;
    int64_t count = 0, seed = 0;
    /* asha draws its trials as random does with a count, else as a grid of lists. */
    sweep_method draws = out->method == SWEEP_ASHA
                             ? (json_object_get(body, "count") ? SWEEP_RANDOM : SWEEP_GRID)
                             : out->method;
    if (draws == SWEEP_RANDOM) {
        if ((rc = get_int(body, "count", 1, SWEEP_MAX_TRIALS, 0, &count, err)) ||
            (rc = get_int(body, "seed", 0, INT64_MAX, 0, &seed, err)))
            return rc;
    } else if (json_object_get(body, "count") || json_object_get(body, "seed")) {
        return ddpd_error_set(err, DDPD_ESPEC, json_object_get(body, "count") ? "count" : "seed",
                              "only for method \"random\" (or \"asha\" with a count)");
    }

    json_t *base = json_object_get(body, "spec");
    if (!json_is_object(base))
        return ddpd_error_set(err, DDPD_ESPEC, "spec", "required: the base job spec (an object)");
    /* asha: every trial runs the spec's schedules over max_steps, pausing at its rungs. */
    if (out->method == SWEEP_ASHA) {
        if (!(own = json_deep_copy(base)) ||
            json_object_set_new(own, "steps", json_integer(out->asha.max_steps))) {
            json_decref(own);
            return ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory checking the sweep");
        }
        json_object_del(own, "epochs"); /* steps decide: absent is fine */
        base = own;
    }
    if (!(spec = malloc(sizeof *spec))) {
        json_decref(own);
        return ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory checking the sweep");
    }
    struct ddpd_error e;
    ddpd_error_clear(&e);
    if ((rc = spec_from_json(base, po, spec, &e))) {
        rc = ddpd_error_set(err, DDPD_ESPEC, "", "%s", e.message);
        snprintf(err->path, sizeof err->path, "spec%s%.*s", e.path[0] && e.path[0] != '[' ? "." : "",
                 (int)sizeof err->path - 6, e.path);
        goto out;
    }
    if (out->method == SWEEP_ASHA && (rc = asha_check(out, spec, err)))
        goto out;

    json_t *params = json_object_get(body, "parameters");
    if (!json_is_object(params) || json_object_size(params) < 1 ||
        json_object_size(params) > SWEEP_MAX_PARAMS) {
        rc = ddpd_error_set(err, DDPD_ESPEC, "parameters",
                            "required: an object of 1..%d \"<dotted.path>\": [values] or {range}",
                            SWEEP_MAX_PARAMS);
        goto out;
    }
    const char *key;
    json_t *pv;
    json_object_foreach (params, key, pv) {
        if (out->method == SWEEP_ASHA && (!strcmp(key, "steps") || !strcmp(key, "epochs"))) {
            rc = ddpd_error_set(err, DDPD_ESPEC, "", "asha sets every trial's steps to asha.max_steps");
            snprintf(err->path, sizeof err->path, "parameters[\"%s\"]", key);
            goto out;
        }
        if ((rc = param_parse(key, pv, draws, &ps[np], err)))
            goto out;
        np++;
    }
    /* In path order, so a sweep's trials do not depend on how the client ordered keys. */
    qsort(ps, np, sizeof ps[0], param_cmp);

    size_t n = 1;
    if (draws == SWEEP_GRID) {
        for (size_t i = 0; i < np; i++) {
            n *= json_array_size(ps[i].values);
            if (n > SWEEP_MAX_TRIALS) {
                rc = ddpd_error_set(err, DDPD_ESPEC, "parameters",
                                    "the grid has more than %d trials: too large", SWEEP_MAX_TRIALS);
                goto out;
            }
        }
    } else {
        n = (size_t)count;
    }
    out->params = calloc(n, sizeof *out->params);
    out->specs = calloc(n, sizeof *out->specs);
    if (!out->params || !out->specs) {
        rc = ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory expanding the sweep");
        goto out;
    }
    out->n = n;
    uint64_t rng = (uint64_t)seed;
    for (size_t t = 0; t < n; t++) {
        if (draws == SWEEP_GRID) {
            /* The product with the last path's values changing fastest. */
            size_t rest = t;
            for (size_t i = np; i-- > 0;) {
                size_t k = json_array_size(ps[i].values);
                vals[i] = json_incref(json_array_get(ps[i].values, rest % k));
                rest /= k;
            }
        } else {
            for (size_t i = 0; i < np; i++)
                vals[i] = draw(&ps[i], &rng);
        }
        rc = DDPD_OK;
        for (size_t i = 0; i < np; i++)
            if (!vals[i])
                rc = ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory expanding the sweep");
        if (rc == DDPD_OK)
            rc = make_trial(base, ps, vals, np, t, po, check, ctx, spec, out, err);
        for (size_t i = 0; i < np; i++)
            json_decref(vals[i]);
        if (rc)
            goto out;
    }
out:
    free(spec);
    json_decref(own);
    return rc;
}

void sweep_plan_free(struct sweep_plan *p)
{
    if (!p)
        return;
    for (size_t i = 0; i < p->n; i++) {
        if (p->params)
            free(p->params[i]);
        if (p->specs)
            free(p->specs[i]);
    }
    free(p->params);
    free(p->specs);
    memset(p, 0, sizeof *p);
}
