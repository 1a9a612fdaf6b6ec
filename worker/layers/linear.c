/* linear.c — nn.Linear on the last dimension of a tensor of any rank (one GEMM with M =
 * batch times the leading dims), and the activations (relu, tanh, sigmoid, gelu, gelu
 * tanh), elementwise. Issues the products PyTorch's autograd issues for nn.Linear
 * (addmm forward, mm backward), so the v1 MLP numbers stay exactly as they were. */
#include <math.h>

#include "layers.h"

void layer_init_uniform(float *h, int64_t numel, double fan_in, struct rng *r)
{
    const double bound = 1.0 / sqrt(fan_in);
    for (int64_t j = 0; j < numel; j++)
        h[j] = (float)((2.0 * rng_uniform(r) - 1.0) * bound);
}

/* PyTorch's addmm(b, x, W^T) first fills the output with the broadcast bias and then
 * runs sgemm with beta = 1, so the bias joins the sum before the partial products of
 * later k-blocks; doing the same keeps its rounding for any `in`. */
void linear_forward_rows(struct dev d, float *y, const float *x, const struct param *w, const struct param *b,
                         int64_t m, int64_t in, int64_t out)
{
    float beta = 0.0f;
    if (b) {
        d.ops->set_bias(d.ctx, y, b->data, m, out); /* fill 0 + add_bias in one pass */
        beta = 1.0f;
    }
    d.ops->gemm(d.ctx, false, true, m, out, in, 1.0f, x, in, w->data, in, beta, y, out);
}

/* dW += dy^T x as PyTorch's mm_mat2_backward computes it, db += dy summed over rows;
 * reported bias then weight (the order PyTorch's hooks fire in), and only then dx = dy W,
 * so DDP reduces them while the rest of backward runs. dW accumulates through gemm's
 * beta = 1 (after zero_grad beta 0: the same bits as adding to zeros). */
void linear_backward_rows(const struct layer_env *e, const float *x, const float *dy, float *dx,
                          struct param *w, struct param *b, int64_t m, int64_t in, int64_t out, bool report_w)
{
    const struct dev_ops *ops = e->dev.ops;
    void *ctx = e->dev.ctx;
    ops->gemm(ctx, true, false, out, in, m, 1.0f, dy, out, x, in, e->grad_write ? 0.0f : 1.0f, w->grad, in);
    if (b) {
        layer_grad_begin(e, b);
        ops->bias_grad(ctx, b->grad, dy, m, out);
        layer_ready(e, b->index);
    }
    if (report_w)
        layer_ready(e, w->index);
    if (dx)
        ops->gemm(ctx, false, false, m, in, out, 1.0f, dy, out, w->data, in, 0.0f, dx, in);
}

/* A tied linear (the model keeps `tie` only where spec_layer_tie allows it) owns its bias
 * alone: its weight is the embedding's parameter. */
static int linear_params(const struct spec_layer *sl, struct lparam *out)
{
    int n = 0;
    if (sl->tie < 0)
        out[n++] = (struct lparam){"weight", 2, {sl->out, sl->in}};
    if (sl->bias)
        out[n++] = (struct lparam){"bias", 1, {sl->out, 0}};
    return n;
}

/* The weight a linear node multiplies by (its own, or the embedding's when tied) and its
 * bias (NULL without one). */
static void linear_tensors(const struct lnode *n, const struct layer_env *e, struct param **w,
                           struct param **b)
{
    const int own_w = n->tied_p < 0;
    *w = own_w ? &e->params[n->p0] : &e->params[n->tied_p];
    *b = n->np > own_w ? &e->params[n->p0 + own_w] : NULL;
}

int64_t layer_none(const struct lnode *n, int64_t rows)
{
    (void)n;
    (void)rows;
    return 0;
}

static void linear_init(const struct lnode *n, int k, float *h, int64_t numel, struct rng *r)
{
    (void)k;
    layer_init_uniform(h, numel, (double)n->sl->in, r);
}

static void linear_forward(struct lnode *n, const struct layer_env *e, const void *x)
{
    const int64_t m = e->batch * layer_rows(n->in_numel, n->sl->in);
    struct param *w, *b;
    linear_tensors(n, e, &w, &b);
    linear_forward_rows(e->dev, n->y, x, w, b, m, n->sl->in, n->sl->out);
}

/* A tied weight's gradient: this backward runs before the embedding's (which comes first
 * in the model), so it writes or adds dW = dy^T x as any linear does; the embedding then
 * adds its own part and reports the parameter ready, once (DDP.md §1.1: a shared
 * parameter's hook fires once, after autograd has summed both uses). */
static void linear_backward(struct lnode *n, const struct layer_env *e, const void *x, const float *dy,
                            float *dx)
{
    const int64_t m = e->batch * layer_rows(n->in_numel, n->sl->in);
    struct param *w, *b;
    linear_tensors(n, e, &w, &b);
    linear_backward_rows(e, x, dy, dx, w, b, m, n->sl->in, n->sl->out, n->tied_p < 0);
}

const struct layer_ops layer_linear = {
    .params = linear_params,
    .saved = layer_none,
    .work = layer_none,
    .init = linear_init,
    .forward = linear_forward,
    .backward = linear_backward,
};

/* ---- activations ---- */

int layer_no_params(const struct spec_layer *sl, struct lparam *out)
{
    (void)sl;
    (void)out;
    return 0;
}

static void act_forward(struct lnode *n, const struct layer_env *e, const void *x)
{
    e->dev.ops->act_forward(e->dev.ctx, n->sl->kind, n->y, x, e->batch * n->out_numel);
}

static void act_backward(struct lnode *n, const struct layer_env *e, const void *x, const float *dy,
                         float *dx)
{
    if (dx)
        e->dev.ops->act_backward(e->dev.ctx, n->sl->kind, dx, dy, x, n->y, e->batch * n->out_numel);
}

const struct layer_ops layer_activation = {
    .params = layer_no_params,
    .saved = layer_none,
    .work = layer_none,
    .forward = act_forward,
    .backward = act_backward,
};
