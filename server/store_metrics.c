/* store_metrics.c — GET /v1/jobs/{id}/metrics' reads: the loss series and the lr,
 * gradient-norm and time series streamed from SQL into store_curve.c's downsampler, and the eval points.
 * Knows nothing of HTTP. */
#include <math.h>
#include <sqlite3.h>
#include <string.h>
#include "../base/alloc.h"
#include "store.h"
#include "store_impl.h"

/* ---- metrics: the loss curve, downsampled by store_curve.c ---- */

/* The eval events of `job` into out->eval, in step order: a restart that runs a step
 * again replaces the points from that step on (the current attempt's history wins). At
 * most max_points: beyond, every k-th is kept, and the last. */
static ddpd_err eval_scan(struct conn *c, int64_t job, int max_points, struct store_metrics *out,
                          struct ddpd_error *err)
{
    size_t cap = 0;
    sqlite3_stmt *st = stmt(c, R_EVAL_SCAN, err);
    if (!st)
        return err ? err->code : DDPD_EINTERNAL;
    sqlite3_bind_int64(st, 1, job);
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        struct event ev;
        const char *body = (const char *)sqlite3_column_text(st, 0);
        if (!body || event_decode(body, (size_t)sqlite3_column_bytes(st, 0), &ev, NULL) != DDPD_OK ||
            ev.kind != EVENT_EVAL)
            continue; /* the writer stored only events that decode */
        while (out->n_eval > 0 && out->eval[out->n_eval - 1].step >= ev.step)
            out->n_eval--;
        if (out->n_eval == cap) {
            cap = cap ? 2 * cap : 64;
            out->eval = xrealloc(out->eval, cap * sizeof *out->eval);
        }
        out->eval[out->n_eval++] = (struct store_eval){.step = ev.step,
                                                       .loss = ev.nonfinite ? NAN : ev.loss,
                                                       .accuracy = ev.accuracy,
                                                       .has_accuracy = ev.has_accuracy,
                                                       .samples = ev.samples};
    }
    stmt_done(st);
    if (rc != SQLITE_DONE)
        return sq_fail(err, c->db, rc, "read eval series");
    if (out->n_eval > (size_t)max_points) {
        const size_t k = (out->n_eval + (size_t)max_points - 1) / (size_t)max_points, last = out->n_eval - 1;
        size_t n = 0;
        for (size_t i = 0; i < last; i += k)
            out->eval[n++] = out->eval[i];
        out->eval[n++] = out->eval[last];
        out->n_eval = n;
    }
    return DDPD_OK;
}

/* Rank 0's lr, gradient norm and time per step in [lo, hi] into out->lr, grad_norm and
 * time, each downsampled like a loss curve of one rank, in one pass (R_STEP_SCAN). */
static ddpd_err step_scan(struct conn *c, int64_t job, int64_t lo, int64_t hi, int max_points,
                          struct store_metrics *out, struct ddpd_error *err)
{
    sqlite3_stmt *st = stmt(c, R_STEP_SCAN, err);
    if (!st)
        return err ? err->code : DDPD_EINTERNAL;
    sqlite3_bind_int64(st, 1, job);
    struct store_series *dst[3] = {&out->lr, &out->grad_norm, &out->time};
    struct store__curve *curve[3];
    for (int k = 0; k < 3; k++)
        curve[k] = store__curve_new(lo, hi, max_points);
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        const int64_t step = sqlite3_column_int64(st, 0);
        if (step < lo || step > hi) /* a loss event's step always is in: it has a loss row */
            continue;
        for (int k = 0; k < 3; k++)
            store__curve_add(curve[k], step, 0, sqlite3_column_type(st, k + 1) != SQLITE_NULL,
                             sqlite3_column_double(st, k + 1));
    }
    ddpd_err e = DDPD_OK;
    if (rc != SQLITE_DONE)
        e = sq_fail(err, c->db, rc, "read the lr, grad_norm and time series");
    stmt_done(st);
    for (int k = 0; k < 3; k++) {
        if (e == DDPD_OK) {
            struct store_metrics one = {0};
            store__curve_finish(curve[k], &one);
            *dst[k] = one.series[0]; /* the mean over one rank: its own values */
            one.series[0] = (struct store_series){0};
            store_metrics_free(&one);
        }
        store__curve_free(curve[k]);
    }
    return e;
}

ddpd_err store_metrics_get(struct store *s, int64_t job, int max_points, struct store_metrics *out,
                           struct ddpd_error *err)
{
    memset(out, 0, sizeof *out);
    if (max_points == 0)
        max_points = 1000;
    if (max_points < 2)
        max_points = 2;
    if (max_points > STORE_METRICS_MAX_POINTS)
        max_points = STORE_METRICS_MAX_POINTS;
    struct store__curve *curve = NULL;
    ddpd_err e = DDPD_OK;
    struct conn *c = read_begin(s, err, &e);
    if (!c)
        return e;
    sqlite3_stmt *st = stmt(c, R_LOSS_RANGE, err);
    if (!st) {
        e = err ? err->code : DDPD_EINTERNAL;
        goto end;
    }
    sqlite3_bind_int64(st, 1, job);
    int rc = sqlite3_step(st);
    if (rc != SQLITE_ROW) {
        e = sq_fail(err, c->db, rc, "read loss range");
        stmt_done(st);
        goto end;
    }
    bool any = sqlite3_column_type(st, 0) != SQLITE_NULL;
    int64_t lo = sqlite3_column_int64(st, 0), hi = sqlite3_column_int64(st, 1);
    stmt_done(st);
    if (!any)
        goto end;

    st = stmt(c, R_LOSS_SCAN, err);
    if (!st) {
        e = err ? err->code : DDPD_EINTERNAL;
        goto end;
    }
    sqlite3_bind_int64(st, 1, job);
    curve = store__curve_new(lo, hi, max_points);
    while ((rc = sqlite3_step(st)) == SQLITE_ROW)
        store__curve_add(curve, sqlite3_column_int64(st, 0), sqlite3_column_int(st, 1),
                         sqlite3_column_type(st, 2) != SQLITE_NULL, sqlite3_column_double(st, 2));
    if (rc != SQLITE_DONE) {
        e = sq_fail(err, c->db, rc, "read loss series");
        stmt_done(st);
        goto end;
    }
    stmt_done(st);
    store__curve_finish(curve, out);
    store__curve_free(curve);
    curve = NULL;

    /* The lr, gradient-norm and time series, downsampled like a loss curve of one rank
     * over the same steps. */
    if ((e = step_scan(c, job, lo, hi, max_points, out, err)))
        goto end;
    e = eval_scan(c, job, max_points, out, err);
end:
    read_end(s, c);
    store__curve_free(curve);
    return e;
}
