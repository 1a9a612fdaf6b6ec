/* batchnorm.c — nn.BatchNorm1d on [B,F] and nn.BatchNorm2d on [B,F,H,W] (by the input's
 * rank), weight 1, bias 0. Training normalises with the batch's biased variance and
 * moves the running statistics with the unbiased one (the backend's batchnorm ops hold
 * PyTorch's rules); eval normalises with the running statistics. Buffers running_mean
 * (0), running_var (1) and num_batches_tracked (0, int64), which DDP broadcasts
 * (ddp.c) and checkpoints save. */
#include "layers.h"

/* Entries of one channel in one sample: 1 for [F], H*W for [F,H,W]. */
static int64_t bn_spatial(const struct lnode *n)
{
    return n->sl->dim > 0 ? n->in_numel / n->sl->dim : 1;
}

static int bn_params(const struct spec_layer *sl, struct lparam *out)
{
    out[0] = (struct lparam){"weight", 1, {sl->dim, 0, 0, 0}};
    out[1] = (struct lparam){"bias", 1, {sl->dim, 0, 0, 0}};
    return 2;
}

static int bn_buffers(const struct spec_layer *sl, struct lparam *out, bool *i64)
{
    out[0] = (struct lparam){"running_mean", 1, {sl->dim, 0, 0, 0}};
    out[1] = (struct lparam){"running_var", 1, {sl->dim, 0, 0, 0}};
    out[2] = (struct lparam){"num_batches_tracked", 0, {1, 0, 0, 0}}; /* a scalar */
    i64[0] = i64[1] = false;
    i64[2] = true;
    return 3;
}

static void bn_init_buffer(const struct lnode *n, int k, void *h, int64_t numel)
{
    (void)n;
    if (k == 1)
        for (int64_t j = 0; j < numel; j++)
            ((float *)h)[j] = 1.0f; /* running_var; the others start at 0 */
}

static int64_t bn_saved(const struct lnode *n, int64_t rows)
{
    (void)rows;
    return 2 * n->sl->dim; /* the batch's mean and invstd per channel */
}

static int64_t bn_work(const struct lnode *n, int64_t rows)
{
    return rows * n->in_numel; /* dx when nothing below needs it */
}

static void bn_forward(struct lnode *n, const struct layer_env *e, const void *x)
{
    const struct dev_ops *o = e->dev.ops;
    const int64_t F = n->sl->dim, s = bn_spatial(n);
    const float *w = e->params[n->p0].data, *b = e->params[n->p0 + 1].data;
    float *rm = e->buffers[n->b0].data, *rv = e->buffers[n->b0 + 1].data;
    if (!e->training) {
        o->batchnorm_forward_eval(e->dev.ctx, n->y, x, w, b, rm, rv, e->batch, F, s, n->sl->eps);
        return;
    }
    o->batchnorm_forward_train(e->dev.ctx, n->y, n->save, n->save + F, rm, rv, x, w, b, e->batch, F, s,
                               n->sl->eps, n->sl->momentum);
    /* num_batches_tracked += 1 where it lives: on CUDA a copy to the host and back would
     * wait for the whole queue, once per layer and forward pass. */
    o->add_i64(e->dev.ctx, e->buffers[n->b0 + 2].data, 1);
}

static void bn_backward(struct lnode *n, const struct layer_env *e, const void *x, const float *dy, float *dx)
{
    const int64_t F = n->sl->dim;
    struct param *w = &e->params[n->p0], *b = &e->params[n->p0 + 1];
    layer_grad_begin(e, w);
    layer_grad_begin(e, b);
    e->dev.ops->batchnorm_backward(e->dev.ctx, dx ? dx : e->work, w->grad, b->grad, dy, x, n->save,
                                   n->save + F, w->data, e->batch, F, bn_spatial(n));
    layer_ready(e, b->index);
    layer_ready(e, w->index);
}

const struct layer_ops layer_batchnorm = {
    .params = bn_params,
    .buffers = bn_buffers,
    .init_buffer = bn_init_buffer,
    .saved = bn_saved,
    .work = bn_work,
    .init = layer_init_norm_affine,
    .forward = bn_forward,
    .backward = bn_backward,
};
