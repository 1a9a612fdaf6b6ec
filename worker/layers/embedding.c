/* embedding.c — nn.Embedding (the first layer: int32 ids in, rows of its table out) and
 * `position`, a learned table added over the positions: x[B,T,dim] + W[0:T], which is
 * add_bias over [B, T*dim] with the table's first T rows as the bias. Both N(0,1). */
#include "layers.h"

static void normal_init(const struct lnode *n, int k, float *h, int64_t numel, struct rng *r)
{
    (void)n;
    (void)k;
    for (int64_t j = 0; j < numel; j++)
        h[j] = (float)rng_normal(r);
}

static int embedding_params(const struct spec_layer *sl, struct lparam *out)
{
    out[0] = (struct lparam){"weight", 2, {sl->num, sl->dim}};
    return 1;
}

static void embedding_forward(struct lnode *n, const struct layer_env *e, const void *x)
{
    e->dev.ops->embedding_forward(e->dev.ctx, n->y, e->params[n->p0].data, x, e->batch * n->in_numel,
                                  n->sl->dim);
}

/* Ids have no gradient: dx is never asked for (embedding is first). A table a tied linear
 * shares already holds that linear's part of this backward: added to, never zeroed. */
static void embedding_backward(struct lnode *n, const struct layer_env *e, const void *x, const float *dy,
                               float *dx)
{
    (void)dx;
    struct param *w = &e->params[n->p0];
    if (!n->shared)
        layer_grad_begin(e, w);
    e->dev.ops->embedding_backward(e->dev.ctx, w->grad, dy, x, e->batch * n->in_numel, n->sl->dim);
    layer_ready(e, w->index);
}

const struct layer_ops layer_embedding = {
    .params = embedding_params,
    .saved = layer_none,
    .work = layer_none,
    .init = normal_init,
    .forward = embedding_forward,
    .backward = embedding_backward,
};

static int position_params(const struct spec_layer *sl, struct lparam *out)
{
    out[0] = (struct lparam){"weight", 2, {sl->num, sl->dim}};
    return 1;
}

static void position_forward(struct lnode *n, const struct layer_env *e, const void *x)
{
    const struct dev_ops *ops = e->dev.ops;
    ops->copy(e->dev.ctx, n->y, x, e->batch * n->out_numel);
    ops->add_bias(e->dev.ctx, n->y, e->params[n->p0].data, e->batch, n->out_numel);
}

/* dW[0:T] += dy summed over the batch (the broadcast's sum_to_size); dx = dy. */
static void position_backward(struct lnode *n, const struct layer_env *e, const void *x, const float *dy,
                              float *dx)
{
    (void)x;
    const struct dev_ops *ops = e->dev.ops;
    struct param *w = &e->params[n->p0];
    layer_grad_begin(e, w);
    ops->bias_grad(e->dev.ctx, w->grad, dy, e->batch, n->out_numel);
    layer_ready(e, w->index);
    if (dx)
        ops->copy(e->dev.ctx, dx, dy, e->batch * n->out_numel);
}

const struct layer_ops layer_position = {
    .params = position_params,
    .saved = layer_none,
    .work = layer_none,
    .init = normal_init,
    .forward = position_forward,
    .backward = position_backward,
};
