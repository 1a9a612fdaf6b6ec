/* store_curve.c — the loss curve of GET /v1/jobs/{id}/metrics, downsampled in one pass
 * over the store's rows: min/max-preserving buckets per series (store.h,
 * store_metrics_get). Knows no SQL (store.c feeds it the rows) and nothing of HTTP. */
#include <stdlib.h>
#include <string.h>

#include "../base/alloc.h"
#include "store.h"
#include "store_impl.h"

struct pt {
    int64_t step;
    double v;
};

/* One series being downsampled: the open bucket and the points already kept. */
struct acc {
    int64_t bucket; /* index of the open bucket; -1 before the first point */
    int n;          /* points seen in the open bucket */
    int keep;       /* the most a bucket keeps: 4, or max_points when that is 2 or 3 */
    struct pt buf[4], first, min, max, last;
    size_t n_out, cap;
    int64_t *step;
    double *loss;
};

static void acc_put(struct acc *a, struct pt p)
{
    if (a->n_out == a->cap) {
        a->cap = a->cap ? 2 * a->cap : 64;
        a->step = xrealloc(a->step, a->cap * sizeof *a->step);
        a->loss = xrealloc(a->loss, a->cap * sizeof *a->loss);
    }
    a->step[a->n_out] = p.step;
    a->loss[a->n_out] = p.v;
    a->n_out++;
}

/* Closes the open bucket: all its points when it has at most `keep`, else its first,
 * minimum, maximum and last point, distinct and in step order (with keep 3 the first,
 * the minimum (the maximum when the minimum is the first or last) and the last; with
 * keep 2 the first and the last). */
static void acc_emit(struct acc *a)
{
    if (a->n <= a->keep) {
        for (int i = 0; i < a->n; i++)
            acc_put(a, a->buf[i]);
    } else if (a->keep < 4) {
        acc_put(a, a->first);
        struct pt mid = a->min;
        if (mid.step == a->first.step || mid.step == a->last.step)
            mid = a->max;
        if (a->keep == 3 && mid.step != a->first.step && mid.step != a->last.step)
            acc_put(a, mid);
        acc_put(a, a->last);
    } else {
        struct pt mid[2] = {a->min, a->max};
        if (mid[1].step < mid[0].step) {
            struct pt t = mid[0];
            mid[0] = mid[1];
            mid[1] = t;
        }
        int64_t prev = a->first.step;
        acc_put(a, a->first);
        for (int i = 0; i < 2; i++)
            if (mid[i].step != prev && mid[i].step != a->last.step) {
                acc_put(a, mid[i]);
                prev = mid[i].step;
            }
        acc_put(a, a->last);
    }
    a->n = 0;
}

static void acc_add(struct acc *a, int64_t bucket, struct pt p)
{
    if (bucket != a->bucket) {
        acc_emit(a);
        a->bucket = bucket;
    }
    if (a->n < 4)
        a->buf[a->n] = p;
    if (a->n == 0) {
        a->first = a->min = a->max = p;
    } else {
        if (p.v < a->min.v)
            a->min = p;
        if (p.v > a->max.v)
            a->max = p;
    }
    a->last = p;
    a->n++;
}

struct store__curve {
    int64_t lo, hi;
    int keep;           /* acc.keep */
    uint64_t width;     /* steps per bucket */
    struct acc mean;    /* the mean over ranks per step */
    struct acc **ranks; /* [nranks], NULL where a rank has no points */
    int nranks;
    int64_t cur; /* the step whose mean is being summed */
    double sum;
    int cnt;
    int64_t points;
};

static int64_t bucket_of(const struct store__curve *c, int64_t step)
{
    return (int64_t)((uint64_t)(step - c->lo) / c->width);
}

struct store__curve *store__curve_new(int64_t lo, int64_t hi, int max_points)
{
    struct store__curve *c = xcalloc(1, sizeof *c);
    /* Buckets of equal width over [lo, hi], each keeping at most 4 points (so at most
     * max_points in all); one step per bucket when that fits. Fewer than 4 points: one
     * bucket keeping max_points. */
    c->keep = max_points < 4 ? max_points : 4;
    uint64_t range = (uint64_t)(hi - lo) + 1, nb = (uint64_t)(max_points / c->keep);
    c->lo = lo;
    c->hi = hi;
    c->width = range <= (uint64_t)max_points ? 1 : (range + nb - 1) / nb;
    c->mean.bucket = -1;
    c->mean.keep = c->keep;
    c->cur = INT64_MIN;
    return c;
}

/* The mean of the step summed so far goes into its series. */
static void mean_close(struct store__curve *c)
{
    if (c->cnt)
        acc_add(&c->mean, bucket_of(c, c->cur), (struct pt){c->cur, c->sum / c->cnt});
}

void store__curve_add(struct store__curve *c, int64_t step, int rank, bool has_value, double v)
{
    if (step != c->cur) {
        mean_close(c);
        c->cur = step;
        c->sum = 0;
        c->cnt = 0;
    }
    if (!has_value || rank < 0 || rank >= STORE_METRICS_MAX_RANKS)
        return;
    c->sum += v;
    c->cnt++;
    c->points++;
    if (rank >= c->nranks) {
        c->ranks = xrealloc(c->ranks, (size_t)(rank + 1) * sizeof *c->ranks);
        memset(c->ranks + c->nranks, 0, (size_t)(rank + 1 - c->nranks) * sizeof *c->ranks);
        c->nranks = rank + 1;
    }
    if (!c->ranks[rank]) {
        c->ranks[rank] = xcalloc(1, sizeof **c->ranks);
        c->ranks[rank]->bucket = -1;
        c->ranks[rank]->keep = c->keep;
    }
    acc_add(c->ranks[rank], bucket_of(c, step), (struct pt){step, v});
}

void store__curve_finish(struct store__curve *c, struct store_metrics *out)
{
    mean_close(c);
    c->cnt = 0;
    out->points = c->points;
    out->first_step = c->lo;
    out->last_step = c->hi;
    /* series[0] is the mean, then every rank that has points. */
    out->series = xcalloc((size_t)c->nranks + 1, sizeof *out->series);
    acc_emit(&c->mean);
    out->series[0] = (struct store_series){-1, c->mean.n_out, c->mean.step, c->mean.loss};
    c->mean.step = NULL;
    c->mean.loss = NULL;
    out->n_series = 1;
    for (int r = 0; r < c->nranks; r++) {
        if (!c->ranks[r])
            continue;
        acc_emit(c->ranks[r]);
        out->series[out->n_series++] =
            (struct store_series){r, c->ranks[r]->n_out, c->ranks[r]->step, c->ranks[r]->loss};
        c->ranks[r]->step = NULL;
        c->ranks[r]->loss = NULL;
    }
}

void store__curve_free(struct store__curve *c)
{
    if (!c)
        return;
    free(c->mean.step);
    free(c->mean.loss);
    for (int r = 0; r < c->nranks; r++) {
        if (c->ranks[r]) {
            free(c->ranks[r]->step);
            free(c->ranks[r]->loss);
            free(c->ranks[r]);
        }
    }
    free(c->ranks);
    free(c);
}

void store_metrics_free(struct store_metrics *m)
{
    if (!m)
        return;
    for (size_t i = 0; i < m->n_series; i++) {
        free(m->series[i].step);
        free(m->series[i].loss);
    }
    free(m->series);
    struct store_series *one[] = {&m->lr, &m->grad_norm, &m->time};
    for (size_t i = 0; i < sizeof one / sizeof *one; i++) {
        free(one[i]->step);
        free(one[i]->loss);
    }
    free(m->eval);
    memset(m, 0, sizeof *m);
}
