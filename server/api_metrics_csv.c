/* api_metrics_csv.c — GET /v1/jobs/{id}/metrics?format=csv: the curves of
 * store_metrics_get as one table for a spreadsheet or pandas, one row per step that any
 * series has, a column per series (empty where a series has no point at that step).
 * Numbers in their shortest round-trip form (schema/jsonnum.h). Reads nothing itself. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../schema/jsonnum.h"
#include "api_impl.h"
#include "http.h"
#include "store.h"

/* The most a CSV answer may take: past it, a 413 asks for fewer points. */
#define CSV_MAX_BYTES (64u << 20)

struct csv {
    char *p;
    size_t n, cap;
    bool over; /* past CSV_MAX_BYTES, or out of memory */
};

static void put(struct csv *c, const char *s, size_t n)
{
    if (c->over)
        return;
    if (c->n + n + 1 > c->cap) {
        size_t cap = c->cap ? c->cap : 65536;
        while (cap < c->n + n + 1)
            cap *= 2;
        char *p = cap <= CSV_MAX_BYTES ? realloc(c->p, cap) : NULL;
        if (!p) {
            c->over = true;
            return;
        }
        c->p = p;
        c->cap = cap;
    }
    memcpy(c->p + c->n, s, n);
    c->n += n;
}

static void put_str(struct csv *c, const char *s)
{
    put(c, s, strlen(s));
}

/* ",V" with V the shortest form of v; "," alone for no value or a value not finite. */
static void put_cell(struct csv *c, bool has, double v)
{
    char b[40];
    b[0] = ',';
    size_t n = 1;
    if (has && isfinite(v))
        n += jsonnum_shortest(v, b + 1, sizeof b - 1);
    put(c, b, n);
}

/* One column's cursor: the series' steps and values, and where it is. */
struct col {
    const int64_t *step;
    size_t n, at;
};

static bool col_at(struct col *k, int64_t step)
{
    return k->at < k->n && k->step[k->at] == step;
}

ddpd_err api__metrics_csv(struct http_request *req, const struct store_metrics *m, struct ddpd_error *err)
{
    /* Columns: the mean loss, each rank's, rank 0's lr, gradient norm (with grad_clip) and
     * wall time of its loss event, the eval loss, accuracy and samples. */
    size_t nser = m->n_series, ncol = nser + 4;
    const struct store_series *rank0[] = {&m->lr, &m->grad_norm, &m->time};
    struct col *cols = calloc(ncol, sizeof *cols);
    if (!cols)
        return ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory for the metrics CSV");
    struct csv c = {0};
    put_str(&c, "step,loss");
    for (size_t i = 0; i < nser; i++) {
        cols[i] = (struct col){.step = m->series[i].step, .n = m->series[i].n};
        if (m->series[i].rank >= 0) {
            char h[40];
            snprintf(h, sizeof h, ",loss_rank_%d", m->series[i].rank);
            put_str(&c, h);
        }
    }
    put_str(&c, ",lr,grad_norm,time,eval_loss,eval_accuracy,eval_samples\n");
    for (size_t k = 0; k < 3; k++)
        cols[nser + k] = (struct col){.step = rank0[k]->step, .n = rank0[k]->n};
    int64_t *ev_step = m->n_eval ? malloc(m->n_eval * sizeof *ev_step) : NULL;
    for (size_t k = 0; ev_step && k < m->n_eval; k++)
        ev_step[k] = m->eval[k].step;
    cols[nser + 3] = (struct col){.step = ev_step, .n = ev_step ? m->n_eval : 0};
    bool mean_first = nser > 0 && m->series[0].rank < 0; /* store.h: series[0] is the mean */
    for (;;) {
        int64_t step = INT64_MAX;
        for (size_t i = 0; i < ncol; i++)
            if (cols[i].at < cols[i].n && cols[i].step[cols[i].at] < step)
                step = cols[i].step[cols[i].at];
        if (step == INT64_MAX || c.over)
            break;
        char s[24];
        put(&c, s, (size_t)snprintf(s, sizeof s, "%" PRId64, step));
        if (!mean_first)
            put_cell(&c, false, 0);
        for (size_t i = 0; i < nser; i++) {
            bool here = col_at(&cols[i], step);
            put_cell(&c, here, here ? m->series[i].loss[cols[i].at++] : 0);
        }
        for (size_t k = 0; k < 3; k++) {
            bool here = col_at(&cols[nser + k], step);
            put_cell(&c, here, here ? rank0[k]->loss[cols[nser + k].at++] : 0);
        }
        const struct store_eval *e = col_at(&cols[nser + 3], step) ? &m->eval[cols[nser + 3].at++] : NULL;
        put_cell(&c, e, e ? e->loss : 0);
        put_cell(&c, e && e->has_accuracy, e ? e->accuracy : 0);
        put_cell(&c, e, e ? (double)e->samples : 0);
        put(&c, "\n", 1);
    }
    free(cols);
    ddpd_err rc;
    if (m->n_eval && !ev_step)
        rc = ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory for the metrics CSV");
    else if (c.over)
        rc = ddpd_error_set(
            err, DDPD_ETOOBIG, "max_points",
            "the metrics CSV would be larger than %u MiB; ask for fewer points with max_points",
            CSV_MAX_BYTES >> 20);
    else
        rc = http_respond_bytes(req, 200, "text/csv", c.p, c.n);
    free(ev_step);
    free(c.p);
    return rc;
}
