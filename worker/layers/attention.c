/* attention.c — multi-head self-attention exactly as CONTRACT.md §2a writes it
 * (nanoGPT's CausalSelfAttention without dropout): qkv linear, heads_split into q, k, v
 * [B,H,T,hd], scores q k^T by one batched GEMM over (batch, head), softmax fused with
 * the 1/sqrt(hd) scale and the causal mask, P v by another batched GEMM, heads_merge,
 * proj linear. Keeps q, k, v, P and the merged heads for backward. */
#include <math.h>

#include "layers.h"

struct dims {
    int64_t b, t, d, h, hd; /* b counts every [T, dim] block: batch times leading dims */
};

static struct dims dims_of(const struct lnode *n, int64_t rows)
{
    const struct spec_layer *sl = n->sl;
    struct dims g;
    g.d = sl->dim;
    g.h = sl->heads > 0 ? sl->heads : 1;
    g.hd = g.d / g.h;
    g.t = sl->in_rank >= 2 ? sl->in_shape[sl->in_rank - 2] : 1;
    g.b = rows * layer_rows(n->in_numel, g.t * g.d);
    return g;
}

static int attention_params(const struct spec_layer *sl, struct lparam *out)
{
    int k = 0;
    out[k++] = (struct lparam){"qkv.weight", 2, {3 * sl->dim, sl->dim}};
    if (sl->bias)
        out[k++] = (struct lparam){"qkv.bias", 1, {3 * sl->dim, 0}};
    out[k++] = (struct lparam){"proj.weight", 2, {sl->dim, sl->dim}};
    if (sl->bias)
        out[k++] = (struct lparam){"proj.bias", 1, {sl->dim, 0}};
    return k;
}

/* q, k, v, the merged heads (proj's input): 4 BTD; the probabilities: B H T T. */
static int64_t attention_saved(const struct lnode *n, int64_t rows)
{
    struct dims g = dims_of(n, rows);
    return 4 * g.b * g.t * g.d + g.b * g.h * g.t * g.t;
}

/* forward: qkv 3 BTD, then scores B H T T; backward: dYm, dYh, dq, dk, dv, dqkv (8 BTD)
 * and dP, dS (2 B H T T). */
static int64_t attention_work(const struct lnode *n, int64_t rows)
{
    struct dims g = dims_of(n, rows);
    return 8 * g.b * g.t * g.d + 2 * g.b * g.h * g.t * g.t;
}

static void attention_init(const struct lnode *n, int k, float *h, int64_t numel, struct rng *r)
{
    (void)k;
    layer_init_uniform(h, numel, (double)n->sl->dim, r); /* both linears have in = dim */
}

struct saved {
    float *q, *k, *v, *ym, *p;
};

static struct saved saved_of(const struct lnode *n, const struct dims *g)
{
    const int64_t btd = g->b * g->t * g->d;
    struct saved s = {n->save, n->save + btd, n->save + 2 * btd, n->save + 3 * btd, n->save + 4 * btd};
    return s;
}

static void params_of(const struct lnode *n, const struct layer_env *e, struct param **qw, struct param **qb,
                      struct param **pw, struct param **pb)
{
    struct param *p = &e->params[n->p0];
    const bool bias = n->sl->bias;
    *qw = &p[0];
    *qb = bias ? &p[1] : NULL;
    *pw = &p[bias ? 2 : 1];
    *pb = bias ? &p[3] : NULL;
}

static float scale_of(const struct dims *g)
{
    return (float)(1.0 / sqrt((double)g->hd));
}

static void attention_forward(struct lnode *n, const struct layer_env *e, const void *x)
{
    const struct dev_ops *ops = e->dev.ops;
    void *c = e->dev.ctx;
    const struct dims g = dims_of(n, e->batch);
    const struct saved s = saved_of(n, &g);
    const int64_t T = g.t, hd = g.hd, bh = g.b * g.h, btd = g.b * g.t * g.d;
    struct param *qw, *qb, *pw, *pb;
    params_of(n, e, &qw, &qb, &pw, &pb);
    float *qkv = e->work, *scores = e->work + 3 * btd, *yh = e->work;
    linear_forward_rows(e->dev, qkv, x, qw, qb, g.b * T, g.d, 3 * g.d);
    ops->heads_split(c, s.q, s.k, s.v, qkv, g.b, T, g.h, hd);
    ops->gemm_batched(c, false, true, T, T, hd, 1.0f, s.q, hd, T * hd, s.k, hd, T * hd, 0.0f, scores, T,
                      T * T, bh);
    ops->softmax_forward(c, s.p, scores, bh * T, T, scale_of(&g), n->sl->causal);
    ops->gemm_batched(c, false, false, T, hd, T, 1.0f, s.p, T, T * T, s.v, hd, T * hd, 0.0f, yh, hd, T * hd,
                      bh);
    ops->heads_merge(c, s.ym, yh, g.b, T, g.h, hd);
    linear_forward_rows(e->dev, n->y, s.ym, pw, pb, g.b * T, g.d, g.d);
}

static void attention_backward(struct lnode *n, const struct layer_env *e, const void *x, const float *dy,
                               float *dx)
{
    const struct dev_ops *ops = e->dev.ops;
    void *c = e->dev.ctx;
    const struct dims g = dims_of(n, e->batch);
    const struct saved s = saved_of(n, &g);
    const int64_t T = g.t, hd = g.hd, bh = g.b * g.h, btd = g.b * g.t * g.d, bhtt = bh * T * T;
    struct param *qw, *qb, *pw, *pb;
    params_of(n, e, &qw, &qb, &pw, &pb);
    float *dym = e->work, *dyh = dym + btd, *dq = dyh + btd, *dk = dq + btd, *dv = dk + btd, *dqkv = dv + btd,
          *dp = dqkv + 3 * btd, *ds = dp + bhtt;
    linear_backward_rows(e, s.ym, dy, dym, pw, pb, g.b * T, g.d, g.d, true);
    ops->heads_merge_backward(c, dyh, dym, g.b, T, g.h, hd);
    /* y = P v: dP = dY v^T, dv = P^T dY. */
    ops->gemm_batched(c, false, true, T, T, hd, 1.0f, dyh, hd, T * hd, s.v, hd, T * hd, 0.0f, dp, T, T * T,
                      bh);
    ops->gemm_batched(c, true, false, T, hd, T, 1.0f, s.p, T, T * T, dyh, hd, T * hd, 0.0f, dv, hd, T * hd,
                      bh);
    ops->softmax_backward(c, ds, dp, s.p, bh * T, T, scale_of(&g));
    /* S = q k^T: dq = dS k, dk = dS^T q. */
    ops->gemm_batched(c, false, false, T, hd, T, 1.0f, ds, T, T * T, s.k, hd, T * hd, 0.0f, dq, hd, T * hd,
                      bh);
    ops->gemm_batched(c, true, false, T, hd, T, 1.0f, ds, T, T * T, s.q, hd, T * hd, 0.0f, dk, hd, T * hd,
                      bh);
    ops->heads_split_backward(c, dqkv, dq, dk, dv, g.b, T, g.h, hd);
    linear_backward_rows(e, x, dqkv, dx, qw, qb, g.b * T, g.d, 3 * g.d, true);
}

const struct layer_ops layer_attention = {
    .params = attention_params,
    .saved = attention_saved,
    .work = attention_work,
    .init = attention_init,
    .forward = attention_forward,
    .backward = attention_backward,
};
