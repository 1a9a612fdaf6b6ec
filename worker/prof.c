/* prof.c — the per-op profile of prof.h: a copy of the backend's table whose ops time
 * the inner op (and wait for the device after it), a small table of (scope, op) totals,
 * and the JSON file bench/profile reads. Used only when DDPD_PROFILE is set; never
 * changes what an op computes. */
#include "prof.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/clock.h"

bool prof__on = false;

#define PROF_ROWS 512

struct row {
    int scope;
    const char *op;
    int64_t calls;
    double seconds;
};

static struct {
    int rank;
    char dir[4096];
    struct dev inner;
    struct dev_ops table;
    int scope;
    int64_t steps;  /* steps ended, warm-up included */
    double t_start; /* when the first counted step began */
    double t_last;  /* when the last step ended */
    struct row rows[PROF_ROWS];
    int n;
    bool overflow;
} P;

bool prof_init(int rank)
{
    const char *dir = getenv("DDPD_PROFILE");
    if (!dir || !*dir || strlen(dir) >= sizeof P.dir)
        return false;
    memset(&P, 0, sizeof P);
    snprintf(P.dir, sizeof P.dir, "%s", dir);
    P.rank = rank;
    prof__on = true;
    return true;
}

double prof__now(void)
{
    return base_mono_s();
}

int prof__scope(int scope)
{
    const int prev = P.scope;
    P.scope = scope;
    return prev;
}

void prof__add(const char *name, double t0)
{
    const double dt = base_mono_s() - t0;
    for (int i = 0; i < P.n; i++)
        if (P.rows[i].scope == P.scope && P.rows[i].op == name) {
            P.rows[i].calls++;
            P.rows[i].seconds += dt;
            return;
        }
    if (P.n == PROF_ROWS) {
        P.overflow = true;
        return;
    }
    P.rows[P.n++] = (struct row){P.scope, name, 1, dt};
}

void prof__step(void)
{
    const double now = base_mono_s();
    if (++P.steps == PROF_WARMUP) {
        P.n = 0; /* the warm-up's rows go */
        P.t_start = now;
    }
    P.t_last = now;
}

/* ---- the wrapped table: each op runs the inner one, waits for it, files the time ---- */

#define IN     P.inner.ops
#define DONE() (IN->host_memory ? (void)0 : IN->synchronize(c))
#define TIMED(name, call)                                                                                    \
    do {                                                                                                     \
        const double t0_ = base_mono_s();                                                                    \
        call;                                                                                                \
        DONE();                                                                                              \
        prof__add(name, t0_);                                                                                \
    } while (0)

static void w_gemm(void *c, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float al, const float *a,
                   int64_t lda, const float *b, int64_t ldb, float be, float *y, int64_t ldc)
{
    TIMED("gemm", IN->gemm(c, ta, tb, m, n, k, al, a, lda, b, ldb, be, y, ldc));
}
static void w_add_bias(void *c, float *y, const float *b, int64_t m, int64_t n)
{
    TIMED("add_bias", IN->add_bias(c, y, b, m, n));
}
static void w_set_bias(void *c, float *y, const float *b, int64_t m, int64_t n)
{
    TIMED("set_bias", IN->set_bias(c, y, b, m, n));
}
static void w_bias_grad(void *c, float *db, const float *dy, int64_t m, int64_t n)
{
    TIMED("bias_grad", IN->bias_grad(c, db, dy, m, n));
}
static void w_act_forward(void *c, layer_kind k, float *y, const float *x, int64_t n)
{
    TIMED("act_forward", IN->act_forward(c, k, y, x, n));
}
static void w_act_backward(void *c, layer_kind k, float *dx, const float *dy, const float *x, const float *y,
                           int64_t n)
{
    TIMED("act_backward", IN->act_backward(c, k, dx, dy, x, y, n));
}
static void w_mse(void *c, const float *p, const float *t, int64_t m, int64_t n, float *dp, float *loss)
{
    TIMED("mse", IN->mse(c, p, t, m, n, dp, loss));
}
static void w_cross_entropy(void *c, const float *x, const int32_t *l, int64_t m, int64_t n, float *dx,
                            float *loss)
{
    TIMED("cross_entropy", IN->cross_entropy(c, x, l, m, n, dx, loss));
}
static void w_sgd_step(void *c, const struct sgd_hyper *h, float *p, const float *g, float *buf, int64_t n)
{
    TIMED("sgd_step", IN->sgd_step(c, h, p, g, buf, n));
}
static void w_adamw_step(void *c, const struct adamw_hyper *h, float *p, const float *g, float *m, float *v,
                         int64_t n)
{
    TIMED("adamw_step", IN->adamw_step(c, h, p, g, m, v, n));
}
static void w_fill(void *c, float *x, float v, int64_t n)
{
    TIMED("fill", IN->fill(c, x, v, n));
}
static void w_copy(void *c, float *d, const float *s, int64_t n)
{
    TIMED("copy", IN->copy(c, d, s, n));
}
static void w_scale(void *c, float *x, float a, int64_t n)
{
    TIMED("scale", IN->scale(c, x, a, n));
}
static void w_scale_copy(void *c, float *d, const float *s, float a, int64_t n)
{
    TIMED("scale_copy", IN->scale_copy(c, d, s, a, n));
}
static void w_gemm_batched(void *c, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float al,
                           const float *a, int64_t lda, int64_t sa, const float *b, int64_t ldb, int64_t sb,
                           float be, float *y, int64_t ldc, int64_t sc, int64_t batch)
{
    TIMED("gemm_batched",
          IN->gemm_batched(c, ta, tb, m, n, k, al, a, lda, sa, b, ldb, sb, be, y, ldc, sc, batch));
}
static void w_embedding_forward(void *c, float *y, const float *w, const int32_t *ids, int64_t n, int64_t dim)
{
    TIMED("embedding_forward", IN->embedding_forward(c, y, w, ids, n, dim));
}
static void w_embedding_backward(void *c, float *dw, const float *dy, const int32_t *ids, int64_t n,
                                 int64_t dim)
{
    TIMED("embedding_backward", IN->embedding_backward(c, dw, dy, ids, n, dim));
}
static void w_layernorm_forward(void *c, float *y, float *mean, float *rstd, const float *x, const float *w,
                                const float *b, int64_t rows, int64_t dim, float eps)
{
    TIMED("layernorm_forward", IN->layernorm_forward(c, y, mean, rstd, x, w, b, rows, dim, eps));
}
static void w_layernorm_backward(void *c, float *dx, float *dw, float *db, const float *dy, const float *x,
                                 const float *mean, const float *rstd, const float *w, int64_t rows,
                                 int64_t dim)
{
    TIMED("layernorm_backward", IN->layernorm_backward(c, dx, dw, db, dy, x, mean, rstd, w, rows, dim));
}
static void w_softmax_forward(void *c, float *y, const float *x, int64_t rows, int64_t n, float scale,
                              bool causal)
{
    TIMED("softmax_forward", IN->softmax_forward(c, y, x, rows, n, scale, causal));
}
static void w_softmax_backward(void *c, float *dx, const float *dy, const float *y, int64_t rows, int64_t n,
                               float scale)
{
    TIMED("softmax_backward", IN->softmax_backward(c, dx, dy, y, rows, n, scale));
}
static void w_heads_split(void *c, float *q, float *k, float *v, const float *qkv, int64_t b, int64_t t,
                          int64_t h, int64_t hd)
{
    TIMED("heads_split", IN->heads_split(c, q, k, v, qkv, b, t, h, hd));
}
static void w_heads_split_backward(void *c, float *dqkv, const float *dq, const float *dk, const float *dv,
                                   int64_t b, int64_t t, int64_t h, int64_t hd)
{
    TIMED("heads_split_backward", IN->heads_split_backward(c, dqkv, dq, dk, dv, b, t, h, hd));
}
static void w_heads_merge(void *c, float *y, const float *yh, int64_t b, int64_t t, int64_t h, int64_t hd)
{
    TIMED("heads_merge", IN->heads_merge(c, y, yh, b, t, h, hd));
}
static void w_heads_merge_backward(void *c, float *dyh, const float *dy, int64_t b, int64_t t, int64_t h,
                                   int64_t hd)
{
    TIMED("heads_merge_backward", IN->heads_merge_backward(c, dyh, dy, b, t, h, hd));
}
static void w_add(void *c, float *y, const float *a, const float *b, int64_t n)
{
    TIMED("add", IN->add(c, y, a, b, n));
}
static void w_mul(void *c, float *y, const float *a, const float *b, int64_t n)
{
    TIMED("mul", IN->mul(c, y, a, b, n));
}
static void w_dropout_mask(void *c, float *mask, int64_t n, float p, uint64_t seed)
{
    TIMED("dropout_mask", IN->dropout_mask(c, mask, n, p, seed));
}
static double w_sumsq(void *c, const float *x, int64_t n)
{
    double r = 0.0;
    TIMED("sumsq", r = IN->sumsq(c, x, n));
    return r;
}
static void w_im2col(void *c, float *col, const float *x, int64_t b, int64_t ch, int64_t h, int64_t w,
                     const struct dev_window *win)
{
    TIMED("im2col", IN->im2col(c, col, x, b, ch, h, w, win));
}
static void w_col2im(void *c, float *dx, const float *col, int64_t b, int64_t ch, int64_t h, int64_t w,
                     const struct dev_window *win)
{
    TIMED("col2im", IN->col2im(c, dx, col, b, ch, h, w, win));
}
static void w_maxpool2d_forward(void *c, float *y, int32_t *idx, const float *x, int64_t planes, int64_t h,
                                int64_t w, const struct dev_window *win)
{
    TIMED("maxpool2d_forward", IN->maxpool2d_forward(c, y, idx, x, planes, h, w, win));
}
static void w_maxpool2d_backward(void *c, float *dx, const float *dy, const int32_t *idx, int64_t planes,
                                 int64_t h, int64_t w, const struct dev_window *win)
{
    TIMED("maxpool2d_backward", IN->maxpool2d_backward(c, dx, dy, idx, planes, h, w, win));
}
static void w_avgpool2d_forward(void *c, float *y, const float *x, int64_t planes, int64_t h, int64_t w,
                                const struct dev_window *win)
{
    TIMED("avgpool2d_forward", IN->avgpool2d_forward(c, y, x, planes, h, w, win));
}
static void w_avgpool2d_backward(void *c, float *dx, const float *dy, int64_t planes, int64_t h, int64_t w,
                                 const struct dev_window *win)
{
    TIMED("avgpool2d_backward", IN->avgpool2d_backward(c, dx, dy, planes, h, w, win));
}
static void w_batchnorm_forward_train(void *c, float *y, float *mean, float *invstd, float *rm, float *rv,
                                      const float *x, const float *w, const float *b, int64_t n, int64_t ch,
                                      int64_t s, double eps, double mom)
{
    TIMED("batchnorm_forward",
          IN->batchnorm_forward_train(c, y, mean, invstd, rm, rv, x, w, b, n, ch, s, eps, mom));
}
static void w_batchnorm_forward_eval(void *c, float *y, const float *x, const float *w, const float *b,
                                     const float *rm, const float *rv, int64_t n, int64_t ch, int64_t s,
                                     double eps)
{
    TIMED("batchnorm_forward_eval", IN->batchnorm_forward_eval(c, y, x, w, b, rm, rv, n, ch, s, eps));
}
static void w_batchnorm_backward(void *c, float *dx, float *dw, float *db, const float *dy, const float *x,
                                 const float *mean, const float *invstd, const float *w, int64_t n,
                                 int64_t ch, int64_t s)
{
    TIMED("batchnorm_backward", IN->batchnorm_backward(c, dx, dw, db, dy, x, mean, invstd, w, n, ch, s));
}
static void w_sgd_group(void *c, const struct sgd_hyper *h, int count, float *const *p, const float *const *g,
                        float *const *buf, const int64_t *numel)
{
    TIMED("sgd_group", IN->sgd_group(c, h, count, p, g, buf, numel));
}
static void w_adamw_group(void *c, const struct adamw_hyper *h, int count, float *const *p,
                          const float *const *g, float *const *m, float *const *v, const int64_t *numel)
{
    TIMED("adamw_group", IN->adamw_group(c, h, count, p, g, m, v, numel));
}
static void w_sumsq_group(void *c, int count, const float *const *x, const int64_t *n, double *out)
{
    TIMED("sumsq_group", IN->sumsq_group(c, count, x, n, out));
}

/* A slot the inner table fills gets its timed twin; an empty optional slot stays empty. */
#define WRAP(slot)                                                                                           \
    do {                                                                                                     \
        if (t->slot)                                                                                         \
            t->slot = w_##slot;                                                                              \
    } while (0)

struct dev prof_wrap(struct dev d)
{
    if (!prof__on)
        return d;
    P.inner = d;
    P.table = *d.ops;
    struct dev_ops *t = &P.table;
    WRAP(gemm);
    WRAP(add_bias);
    WRAP(set_bias);
    WRAP(bias_grad);
    WRAP(act_forward);
    WRAP(act_backward);
    WRAP(mse);
    WRAP(cross_entropy);
    WRAP(sgd_step);
    WRAP(adamw_step);
    WRAP(fill);
    WRAP(copy);
    WRAP(scale);
    WRAP(scale_copy);
    WRAP(gemm_batched);
    WRAP(embedding_forward);
    WRAP(embedding_backward);
    WRAP(layernorm_forward);
    WRAP(layernorm_backward);
    WRAP(softmax_forward);
    WRAP(softmax_backward);
    WRAP(heads_split);
    WRAP(heads_split_backward);
    WRAP(heads_merge);
    WRAP(heads_merge_backward);
    WRAP(add);
    WRAP(mul);
    WRAP(dropout_mask);
    WRAP(sumsq);
    WRAP(im2col);
    WRAP(col2im);
    WRAP(maxpool2d_forward);
    WRAP(maxpool2d_backward);
    WRAP(avgpool2d_forward);
    WRAP(avgpool2d_backward);
    WRAP(batchnorm_forward_train);
    WRAP(batchnorm_forward_eval);
    WRAP(batchnorm_backward);
    WRAP(sgd_group);
    WRAP(adamw_group);
    WRAP(sumsq_group);
    return (struct dev){t, d.ctx};
}

/* ---- the file ---- */

static const char *const fixed_names[PROF_SCOPES_FIXED] = {
    [PROF_NONE] = "other",        [PROF_DATA] = "data",           [PROF_LOSS] = "loss",
    [PROF_RESIDUAL] = "residual", [PROF_ZERO_GRAD] = "zero_grad", [PROF_DDP] = "ddp",
    [PROF_CLIP] = "clip",         [PROF_OPTIM] = "optimizer",     [PROF_LOG] = "log",
};

static void scope_name(int s, char *out, size_t cap)
{
    if (s >= 0 && s < PROF_SCOPES_FIXED)
        snprintf(out, cap, "%s", fixed_names[s]);
    else
        snprintf(out, cap, "%s %s", layer_kind_name((layer_kind)((s - PROF_SCOPES_FIXED) / 2)),
                 (s - PROF_SCOPES_FIXED) % 2 ? "backward" : "forward");
}

void prof_finish(void)
{
    if (!prof__on)
        return;
    prof__on = false;
    char path[4200], name[64];
    snprintf(path, sizeof path, "%s/profile-rank-%d.json", P.dir, P.rank);
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "ddpd-worker: profile: cannot write %s: %s\n", path, strerror(errno));
        return;
    }
    const int64_t counted = P.steps > PROF_WARMUP ? P.steps - PROF_WARMUP : 0;
    fprintf(f,
            "{\"rank\": %d, \"backend\": \"%s\", \"steps\": %lld, \"seconds\": %.9f, \"overflow\": %s,\n "
            "\"rows\": [",
            P.rank, P.inner.ops ? P.inner.ops->name : "", (long long)counted,
            counted ? P.t_last - P.t_start : 0.0, P.overflow ? "true" : "false");
    for (int i = 0; i < P.n; i++) {
        scope_name(P.rows[i].scope, name, sizeof name);
        fprintf(f, "%s\n  {\"scope\": \"%s\", \"op\": \"%s\", \"calls\": %lld, \"seconds\": %.9f}",
                i ? "," : "", name, P.rows[i].op, (long long)P.rows[i].calls, P.rows[i].seconds);
    }
    fprintf(f, "\n]}\n");
    if (fclose(f) != 0)
        fprintf(stderr, "ddpd-worker: profile: cannot write %s: %s\n", path, strerror(errno));
}
