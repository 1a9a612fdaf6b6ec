/* conv.c — the image layers on NCHW tensors: nn.Conv2d (im2col, then one GEMM per image
 * through gemm_batched; bias added first, as addmm does), nn.MaxPool2d, nn.AvgPool2d
 * (count_include_pad true) and nn.Flatten. One sample's shapes come from the validator
 * (in_shape [C,H,W], out_shape [O,OH,OW]). */
#include "layers.h"

static struct dev_window window_of(const struct spec_layer *sl)
{
    return (struct dev_window){sl->kernel[0], sl->kernel[1],  sl->stride[0],
                               sl->stride[1], sl->padding[0], sl->padding[1]};
}

/* K = C*kh*kw rows of a column matrix, L = OH*OW columns. */
static int64_t conv_k(const struct spec_layer *sl)
{
    return sl->in_shape[0] * sl->kernel[0] * sl->kernel[1];
}
static int64_t conv_l(const struct spec_layer *sl)
{
    return sl->out_shape[1] * sl->out_shape[2];
}

static int conv_params(const struct spec_layer *sl, struct lparam *out)
{
    out[0] = (struct lparam){"weight", 4, {sl->out, sl->in, sl->kernel[0], sl->kernel[1]}};
    if (!sl->bias)
        return 1;
    out[1] = (struct lparam){"bias", 1, {sl->out, 0, 0, 0}};
    return 2;
}

/* The column matrices of the micro-batch, then a row of L ones (the bias GEMM's). */
static int64_t conv_work(const struct lnode *n, int64_t rows)
{
    return rows * conv_k(n->sl) * conv_l(n->sl) + conv_l(n->sl);
}

/* nn.Conv2d's reset_parameters: kaiming_uniform(a=√5) gives U(±1/√fan_in) for the
 * weight, and the bias U(±1/√fan_in) too, fan_in = in*kh*kw. */
static void conv_init(const struct lnode *n, int k, float *h, int64_t numel, struct rng *r)
{
    (void)k;
    layer_init_uniform(h, numel, (double)conv_k(n->sl), r);
}

static void conv_forward(struct lnode *n, const struct layer_env *e, const void *x)
{
    const struct spec_layer *sl = n->sl;
    const struct dev_ops *o = e->dev.ops;
    const struct dev_window win = window_of(sl);
    const int64_t K = conv_k(sl), L = conv_l(sl), O = sl->out, B = e->batch;
    float *col = e->work, *ones = e->work + B * K * L;
    o->im2col(e->dev.ctx, col, x, B, sl->in_shape[0], sl->in_shape[1], sl->in_shape[2], &win);
    float beta = 0.0f;
    if (sl->bias) {
        /* y_i = b 1^T first, then the product added onto it (addmm's order). */
        o->fill(e->dev.ctx, ones, 1.0f, L);
        o->gemm_batched(e->dev.ctx, false, false, O, L, 1, 1.0f, e->params[n->p0 + 1].data, 1, 0, ones, L, 0,
                        0.0f, n->y, L, O * L, B);
        beta = 1.0f;
    }
    o->gemm_batched(e->dev.ctx, false, false, O, L, K, 1.0f, e->params[n->p0].data, K, 0, col, L, K * L, beta,
                    n->y, L, O * L, B);
}

static void conv_backward(struct lnode *n, const struct layer_env *e, const void *x, const float *dy,
                          float *dx)
{
    const struct spec_layer *sl = n->sl;
    const struct dev_ops *o = e->dev.ops;
    void *ctx = e->dev.ctx;
    const struct dev_window win = window_of(sl);
    const int64_t K = conv_k(sl), L = conv_l(sl), O = sl->out, B = e->batch;
    float *col = e->work, *ones = e->work + B * K * L;
    struct param *w = &e->params[n->p0];
    o->im2col(ctx, col, x, B, sl->in_shape[0], sl->in_shape[1], sl->in_shape[2], &win);
    /* dW += sum_i dy_i col_i^T, image by image. */
    for (int64_t i = 0; i < B; i++)
        o->gemm(ctx, false, true, O, K, L, 1.0f, dy + i * O * L, L, col + i * K * L, L,
                i == 0 && e->grad_write ? 0.0f : 1.0f, w->grad, K);
    if (B == 0)
        layer_grad_begin(e, w);
    if (sl->bias) {
        struct param *b = &e->params[n->p0 + 1];
        layer_grad_begin(e, b);
        o->fill(ctx, ones, 1.0f, L);
        for (int64_t i = 0; i < B; i++)
            o->gemm(ctx, false, false, O, 1, L, 1.0f, dy + i * O * L, L, ones, 1, 1.0f, b->grad, 1);
        layer_ready(e, b->index);
    }
    layer_ready(e, w->index);
    if (!dx)
        return;
    /* dcol_i = W^T dy_i (into the column matrices), then their adjoint into dx. */
    o->gemm_batched(ctx, true, false, K, L, O, 1.0f, w->data, K, 0, dy, L, O * L, 0.0f, col, L, K * L, B);
    o->fill(ctx, dx, 0.0f, B * n->in_numel);
    o->col2im(ctx, dx, col, B, sl->in_shape[0], sl->in_shape[1], sl->in_shape[2], &win);
}

const struct layer_ops layer_conv2d = {
    .params = conv_params,
    .saved = layer_none,
    .work = conv_work,
    .init = conv_init,
    .forward = conv_forward,
    .backward = conv_backward,
};

/* ---- pooling ---- */

static int64_t pool_planes(const struct lnode *n, int64_t batch)
{
    return batch * n->sl->in_shape[0];
}

static int64_t maxpool_saved(const struct lnode *n, int64_t rows)
{
    return rows * n->out_numel; /* the argmax of each output, int32 in float slots */
}

static void maxpool_forward(struct lnode *n, const struct layer_env *e, const void *x)
{
    const struct dev_window win = window_of(n->sl);
    e->dev.ops->maxpool2d_forward(e->dev.ctx, n->y, (int32_t *)(void *)n->save, x, pool_planes(n, e->batch),
                                  n->sl->in_shape[1], n->sl->in_shape[2], &win);
}

static void maxpool_backward(struct lnode *n, const struct layer_env *e, const void *x, const float *dy,
                             float *dx)
{
    (void)x;
    if (!dx)
        return;
    const struct dev_window win = window_of(n->sl);
    e->dev.ops->maxpool2d_backward(e->dev.ctx, dx, dy, (const int32_t *)(const void *)n->save,
                                   pool_planes(n, e->batch), n->sl->in_shape[1], n->sl->in_shape[2], &win);
}

const struct layer_ops layer_maxpool2d = {
    .params = layer_no_params,
    .saved = maxpool_saved,
    .work = layer_none,
    .forward = maxpool_forward,
    .backward = maxpool_backward,
};

static void avgpool_forward(struct lnode *n, const struct layer_env *e, const void *x)
{
    const struct dev_window win = window_of(n->sl);
    e->dev.ops->avgpool2d_forward(e->dev.ctx, n->y, x, pool_planes(n, e->batch), n->sl->in_shape[1],
                                  n->sl->in_shape[2], &win);
}

static void avgpool_backward(struct lnode *n, const struct layer_env *e, const void *x, const float *dy,
                             float *dx)
{
    (void)x;
    if (!dx)
        return;
    const struct dev_window win = window_of(n->sl);
    e->dev.ops->avgpool2d_backward(e->dev.ctx, dx, dy, pool_planes(n, e->batch), n->sl->in_shape[1],
                                   n->sl->in_shape[2], &win);
}

const struct layer_ops layer_avgpool2d = {
    .params = layer_no_params,
    .saved = layer_none,
    .work = layer_none,
    .forward = avgpool_forward,
    .backward = avgpool_backward,
};

/* ---- flatten: the same values, one row per sample ---- */

static void flatten_forward(struct lnode *n, const struct layer_env *e, const void *x)
{
    e->dev.ops->copy(e->dev.ctx, n->y, x, e->batch * n->out_numel);
}

static void flatten_backward(struct lnode *n, const struct layer_env *e, const void *x, const float *dy,
                             float *dx)
{
    (void)x;
    if (dx)
        e->dev.ops->copy(e->dev.ctx, dx, dy, e->batch * n->in_numel);
}

const struct layer_ops layer_flatten = {
    .params = layer_no_params,
    .saved = layer_none,
    .work = layer_none,
    .forward = flatten_forward,
    .backward = flatten_backward,
};
