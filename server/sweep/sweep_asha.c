/* sweep_asha.c — the asha method's rule: its request's "asha" object, its rungs, and
 * which trials a completed rung promotes (synchronous successive halving, Li et al. 2018:
 * docs/api.md "Sweeps"). Pure: the controller (sweep_control.c) stores the rungs' results
 * and calls it again after a restart with the same inputs. */
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sweep.h"

static ddpd_err asha_int(const json_t *v, const char *key, int64_t lo, int64_t hi, int64_t dflt, int64_t *out,
                         struct ddpd_error *err)
{
    json_t *x = json_object_get(v, key);
    char path[64];
    snprintf(path, sizeof path, "asha.%s", key);
    if (!x && dflt >= lo) {
        *out = dflt;
        return DDPD_OK;
    }
    if (!json_is_integer(x) || json_integer_value(x) < lo || json_integer_value(x) > hi)
        return ddpd_error_set(err, DDPD_ESPEC, path, "%s an integer %" PRId64 "..%" PRId64,
                              x ? "expected" : "required:", lo, hi);
    *out = json_integer_value(x);
    return DDPD_OK;
}

ddpd_err sweep_asha_from_json(const json_t *v, struct sweep_asha *out, struct ddpd_error *err)
{
    if (!json_is_object(v))
        return ddpd_error_set(
            err, DDPD_ESPEC, "asha",
            "required for method \"asha\": {\"min_steps\", \"reduction_factor\", \"max_steps\"}");
    const char *key;
    json_t *x;
    json_object_foreach ((json_t *)v, key, x) {
        if (strcmp(key, "min_steps") && strcmp(key, "reduction_factor") && strcmp(key, "max_steps"))
            return ddpd_error_set(err, DDPD_ESPEC, "asha",
                                  "unknown key \"%s\" (expected min_steps, reduction_factor, max_steps)",
                                  key);
    }
    int64_t rf;
    ddpd_err rc;
    if ((rc = asha_int(v, "min_steps", 1, INT64_MAX / SWEEP_ASHA_MAX_RF, 0, &out->min_steps, err)) ||
        (rc = asha_int(v, "reduction_factor", 2, SWEEP_ASHA_MAX_RF, 3, &rf, err)) ||
        (rc = asha_int(v, "max_steps", 1, INT64_MAX / SWEEP_ASHA_MAX_RF, 0, &out->max_steps, err)))
        return rc;
    out->rf = (int)rf;
    if (out->max_steps <= out->min_steps)
        return ddpd_error_set(err, DDPD_ESPEC, "asha.max_steps", "expected more than min_steps (%" PRId64 ")",
                              out->min_steps);
    return DDPD_OK;
}

int sweep_asha_rungs(const struct sweep_asha *a, int64_t *steps)
{
    int n = 0;
    for (int64_t r = a->min_steps; r < a->max_steps && n < SWEEP_ASHA_MAX_RUNGS - 1; r *= a->rf)
        steps[n++] = r;
    steps[n++] = a->max_steps;
    return n;
}

/* Whether a ranks before b: the better metric, then the lower index. */
static bool before(const struct sweep_rung_result *a, const struct sweep_rung_result *b, bool maximize)
{
    if (a->metric != b->metric)
        return maximize ? a->metric > b->metric : a->metric < b->metric;
    return a->idx < b->idx;
}

size_t sweep_asha_promote(const struct sweep_rung_result *res, size_t n, size_t entered, int rf,
                          bool maximize, bool *promote)
{
    struct sweep_rung_result *c = malloc((n ? n : 1) * sizeof *c);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        promote[i] = false;
        if (c && res[i].has_metric && isfinite(res[i].metric))
            c[m++] = res[i];
    }
    if (!c)
        return 0;
    size_t keep = entered / (size_t)rf;
    if (keep < 1)
        keep = 1;
    if (keep > m)
        keep = m;
    /* Insertion sort: a sweep has at most SWEEP_MAX_TRIALS trials. */
    for (size_t i = 1; i < m; i++) {
        struct sweep_rung_result x = c[i];
        size_t k = i;
        for (; k > 0 && before(&x, &c[k - 1], maximize); k--)
            c[k] = c[k - 1];
        c[k] = x;
    }
    for (size_t k = 0; k < keep; k++)
        for (size_t i = 0; i < n; i++)
            if (res[i].idx == c[k].idx)
                promote[i] = true;
    free(c);
    return keep;
}
