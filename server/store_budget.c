/* store_budget.c — what a job's stored events take, and the bound on them: the usage of
 * each job (rows, bytes of their bodies, loss events; what --job-disk-quota counts), kept
 * in the transactions that store events, and the thinning of a job's older loss events
 * past its budget (store_opts.job_events_max), which keeps the curve's shape and every
 * other event. The usage's writes and the thinning run on the writer connection inside
 * the transaction that stores the events (the writer thread's batches, the inserter's
 * groups); store_job_usage reads on a reader. Knows nothing of HTTP or the hub: live
 * streams get every event from the hub, whatever this keeps.
 *
 * The thinning. A job's newest job_events_max/2 loss events are never touched. Below the
 * smallest step among them, the loss series is cut into buckets of equal width (a power of
 * two, aligned, so that a wider bucket is two narrower ones and keeps a subset of what they
 * kept), few enough that what they keep fits a quarter of the budget; each bucket keeps its
 * first and last step, the steps of its smallest and largest mean loss (a spike is part of
 * the shape) and its first step whose loss was not finite, with every rank's row and
 * every attempt's event of those steps. A round runs when the job's loss events pass the
 * budget; it leaves at most three quarters of it, so the next comes a quarter of the budget
 * later: each round reads O(budget) rows, O(1) per event stored. */
#include <sqlite3.h>
#include <stdint.h>
#include <stdlib.h>
#include "../base/alloc.h"
#include "store.h"
#include "store_impl.h"

/* What one bucket keeps at most: first, last, smallest, largest, first not finite. */
#define KEEP_PER_BUCKET 5

ddpd_err store_job_usage(struct store *s, int64_t id, struct store_usage *out, struct ddpd_error *err)
{
    *out = (struct store_usage){0};
    struct conn *c = reader_get(s, err);
    if (!c)
        return err ? err->code : DDPD_EIO;
    ddpd_err e = DDPD_OK;
    sqlite3_stmt *st = stmt(c, R_USAGE, err);
    if (!st) {
        e = err ? err->code : DDPD_EINTERNAL;
        goto out;
    }
    sqlite3_bind_int64(st, 1, id);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        out->events = sqlite3_column_int64(st, 0);
        out->bytes = sqlite3_column_int64(st, 1);
        out->loss_events = sqlite3_column_int64(st, 2);
    } else if (rc != SQLITE_DONE) { /* no row: a job without events, or none */
        e = sq_fail(err, c->db, rc, "read event usage");
    }
    stmt_done(st);
out:
    reader_put(s, c);
    return e;
}

/* Adds rows (of which `loss` loss events) and their bytes to job's usage; sets *loss_now
 * and *thinned (may be NULL) to its loss events now and what the latest round left. */
int store__usage_add(struct conn *c, int64_t job, int64_t rows, int64_t bytes, int64_t loss,
                     int64_t *loss_now, int64_t *thinned)
{
    sqlite3_stmt *st = stmt(c, W_USAGE_ADD, NULL);
    if (!st)
        return SQLITE_ERROR;
    sqlite3_bind_int64(st, 1, job);
    sqlite3_bind_int64(st, 2, rows);
    sqlite3_bind_int64(st, 3, bytes);
    sqlite3_bind_int64(st, 4, loss);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        if (loss_now)
            *loss_now = sqlite3_column_int64(st, 0);
        if (thinned)
            *thinned = sqlite3_column_int64(st, 1);
        rc = sqlite3_step(st);
    }
    stmt_done(st);
    return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

/* Runs the prepared statement `id` with the int64 arguments a[0..n) and reads its first
 * row's columns into out[0..nout) (NULL reads as 0); *has_row says whether the first
 * column of that row was not NULL. */
static int query_ints(struct conn *c, int id, const int64_t *a, int n, int64_t *out, int nout, bool *has_row)
{
    sqlite3_stmt *st = stmt(c, id, NULL);
    if (!st)
        return SQLITE_ERROR;
    for (int i = 0; i < n; i++)
        sqlite3_bind_int64(st, i + 1, a[i]);
    *has_row = false;
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        *has_row = sqlite3_column_type(st, 0) != SQLITE_NULL;
        for (int i = 0; i < nout; i++)
            out[i] = sqlite3_column_int64(st, i);
        rc = SQLITE_OK;
    } else if (rc == SQLITE_DONE) {
        rc = SQLITE_OK;
    }
    stmt_done(st);
    return rc;
}

/* ---- the steps a round keeps ---- */

/* ddpd_kept(step): whether `step` is among the steps the running round keeps (s->keep,
 * ascending). Registered on the writer connection only, for W_THIN_*. */
static void kept_fn(sqlite3_context *ctx, int argc, sqlite3_value **argv)
{
    (void)argc;
    const struct store *s = sqlite3_user_data(ctx);
    const int64_t step = sqlite3_value_int64(argv[0]);
    size_t lo = 0, hi = s->nkeep;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (s->keep[mid] < step)
            lo = mid + 1;
        else
            hi = mid;
    }
    sqlite3_result_int(ctx, lo < s->nkeep && s->keep[lo] == step);
}

int store__budget_open(struct store *s)
{
    return sqlite3_create_function_v2(s->w->db, "ddpd_kept", 1, SQLITE_UTF8 | SQLITE_DIRECTONLY, s, kept_fn,
                                      NULL, NULL, NULL);
}

static void keep_push(struct store *s, int64_t step)
{
    if (s->nkeep > 0 && s->keep[s->nkeep - 1] >= step)
        return; /* a step that is two of the bucket's kinds at once */
    if (s->nkeep == s->keep_cap) {
        s->keep_cap = s->keep_cap ? 2 * s->keep_cap : 1024;
        s->keep = xrealloc(s->keep, s->keep_cap * sizeof *s->keep);
    }
    s->keep[s->nkeep++] = step;
}

/* One bucket of the series as it is read, in step order. */
struct bucket {
    int64_t id, n;
    int64_t first, last, min_step, max_step, nonfinite; /* nonfinite: 0 = none yet */
    double min, max;
};

/* Closes bucket `b`: its kept steps, ascending, onto s->keep. */
static void bucket_keep(struct store *s, const struct bucket *b)
{
    if (b->n == 0)
        return;
    int64_t k[KEEP_PER_BUCKET] = {b->first, b->last, b->min_step, b->max_step, b->nonfinite};
    int nk = 0;
    for (int i = 0; i < KEEP_PER_BUCKET; i++)
        if (k[i] != 0 || i < 2) /* min/max/nonfinite 0: none (steps count from 1) */
            k[nk++] = k[i];
    for (int i = 1; i < nk; i++) /* insertion sort of at most 5 */
        for (int j = i; j > 0 && k[j - 1] > k[j]; j--) {
            int64_t t = k[j];
            k[j] = k[j - 1];
            k[j - 1] = t;
        }
    for (int i = 0; i < nk; i++)
        keep_push(s, k[i]);
}

static int64_t floor_div(int64_t a, int64_t w)
{
    return a >= 0 ? a / w : -((-a + w - 1) / w);
}

/* Reads the job's loss series below `cut_step` and sets s->keep to the steps that stay in
 * buckets of width w: each bucket's first and last step, the steps of its smallest and
 * largest mean loss (the first of equals) and its first step whose loss was not finite. */
static int pick_kept(struct store *s, int64_t job, int64_t cut_step, int64_t w)
{
    sqlite3_stmt *st = stmt(s->w, W_THIN_SCAN, NULL);
    if (!st)
        return SQLITE_ERROR;
    sqlite3_bind_int64(st, 1, job);
    sqlite3_bind_int64(st, 2, cut_step);
    s->nkeep = 0;
    struct bucket b = {.n = 0};
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        const int64_t step = sqlite3_column_int64(st, 0), id = floor_div(step, w);
        const bool finite = sqlite3_column_type(st, 1) != SQLITE_NULL;
        const double v = sqlite3_column_double(st, 1);
        if (b.n > 0 && id != b.id) {
            bucket_keep(s, &b);
            b.n = 0;
        }
        if (b.n == 0)
            b = (struct bucket){.id = id, .first = step};
        b.n++;
        b.last = step;
        if (!finite) {
            if (!b.nonfinite)
                b.nonfinite = step;
        } else {
            if (!b.min_step || v < b.min) {
                b.min = v;
                b.min_step = step;
            }
            if (!b.max_step || v > b.max) {
                b.max = v;
                b.max_step = step;
            }
        }
    }
    stmt_done(st);
    if (rc != SQLITE_DONE)
        return rc;
    bucket_keep(s, &b);
    return SQLITE_OK;
}

/* ---- a thinning round ---- */

/* Runs the prepared writer statement `id` with the int64 arguments a[0..n) to its end. */
static int exec_ints(struct conn *c, int id, const int64_t *a, int n)
{
    sqlite3_stmt *st = stmt(c, id, NULL);
    if (!st)
        return SQLITE_ERROR;
    for (int i = 0; i < n; i++)
        sqlite3_bind_int64(st, i + 1, a[i]);
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW)
        ;
    stmt_done(st);
    return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

/* One thinning round of `job`, which has `loss_now` loss events; adds the events it
 * deleted to *deleted. */
static int thin(struct store *s, int64_t job, int64_t loss_now, uint64_t *deleted)
{
    struct conn *c = s->w;
    int64_t jobinfo[2], cut[3], size[2] = {0, 0};
    bool any;
    int rc = query_ints(c, W_THIN_JOB, &job, 1, jobinfo, 2, &any);
    if (rc != SQLITE_OK || !any)
        return rc;
    /* Each rank logs a step once per attempt: a step kept is world_size rows. A budget too
     * small for one bucket per quarter is raised to what the job's ranks need. */
    const int64_t world = jobinfo[0] > 0 ? jobinfo[0] : 1, lo = jobinfo[1];
    int64_t budget = s->o.job_events_max;
    if (budget < 8 * KEEP_PER_BUCKET * world)
        budget = 8 * KEEP_PER_BUCKET * world;
    bool thin_now = loss_now > budget;
    int64_t cut_args[2] = {job, budget / 2};
    if (thin_now && (rc = query_ints(c, W_THIN_CUT, cut_args, 2, cut, 3, &any)) != SQLITE_OK)
        return rc;
    /* cut[0]: the first seq of the newest budget/2 loss events, cut[1] their smallest step. */
    thin_now = thin_now && any && cut[2] == budget / 2 && cut[1] > lo;
    if (thin_now) {
        /* Buckets of width w over lo .. cut[1]-1: at most nb + 1 of them (the first may
         * start before lo), each keeping at most KEEP_PER_BUCKET steps of `world` rows. */
        const int64_t nb = budget / (4 * KEEP_PER_BUCKET * world) - 1, span = cut[1] - lo;
        int64_t w = 1;
        while (w < span / nb + (span % nb != 0))
            w *= 2;
        const int64_t loss_args[2] = {job, cut[1]}, ev_args[3] = {job, cut[0], cut[1]};
        if ((rc = pick_kept(s, job, cut[1], w)) != SQLITE_OK ||
            (rc = exec_ints(c, W_THIN_LOSS, loss_args, 2)) != SQLITE_OK ||
            (rc = query_ints(c, W_THIN_SIZE, ev_args, 3, size, 2, &any)) != SQLITE_OK ||
            (size[0] > 0 && (rc = exec_ints(c, W_THIN_EVENTS, ev_args, 3)) != SQLITE_OK))
            return rc;
    }
    /* Also when nothing could go (all of it is newer than the cut, or the budget was
     * raised): the next round waits for a quarter of the budget more. */
    const int64_t usage_args[3] = {job, size[0], size[1]};
    if ((rc = exec_ints(c, W_THIN_USAGE, usage_args, 3)) == SQLITE_OK)
        *deleted += (uint64_t)size[0];
    return rc;
}

static int cmp_job(const void *a, const void *b)
{
    const struct qev *x = *(const struct qev *const *)a, *y = *(const struct qev *const *)b;
    if (x->job != y->job)
        return x->job < y->job ? -1 : 1;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

int store__budget_batch(struct store *s, struct qev *b, int n, struct qev **scratch, uint64_t *thinned)
{
    int m = 0;
    for (int i = 0; i < n; i++)
        if (b[i].stored)
            scratch[m++] = &b[i];
    qsort(scratch, (size_t)m, sizeof *scratch, cmp_job);
    const int64_t budget = s->o.job_events_max;
    for (int i = 0, j; i < m; i = j) {
        int64_t bytes = 0, loss = 0, loss_now = 0, last_thin = 0;
        for (j = i; j < m && scratch[j]->job == scratch[i]->job; j++) {
            bytes += (int64_t)scratch[j]->len;
            loss += scratch[j]->kind == EVENT_LOSS;
        }
        int rc = store__usage_add(s->w, scratch[i]->job, j - i, bytes, loss, &loss_now, &last_thin);
        if (rc == SQLITE_OK && budget > 0 && loss > 0 && loss_now > budget &&
            loss_now >= last_thin + budget / 4)
            rc = thin(s, scratch[i]->job, loss_now, thinned);
        if (rc != SQLITE_OK)
            return rc;
    }
    return SQLITE_OK;
}
