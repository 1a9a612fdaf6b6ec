/* dropout.c — nn.Dropout(p): in training y = x * mask, mask[i] = 1/(1-p) or 0 drawn by
 * dropout_mask from the forward's seed (model.c derives it from the init seed, the rank,
 * the forward count and the layer's index), so a run is reproducible on any backend. At
 * p = 0 and in eval it passes x through. */
#include "layers.h"

/* An odd 64-bit multiplier that spreads the layer's index over the forward's seed, so
 * that two layers of one forward draw different masks. */
#define STREAM_MUL 0xD6E8FEB86659FD93ull

static bool active(const struct lnode *n, const struct layer_env *e)
{
    return e->training && n->sl->p > 0.0;
}

static int64_t dropout_saved(const struct lnode *n, int64_t rows)
{
    return n->sl->p > 0.0 ? rows * n->in_numel : 0; /* the mask */
}

static void dropout_forward(struct lnode *n, const struct layer_env *e, const void *x)
{
    const struct dev_ops *ops = e->dev.ops;
    const int64_t len = e->batch * n->in_numel;
    if (!active(n, e)) {
        ops->copy(e->dev.ctx, n->y, x, len);
        return;
    }
    /* One stream per layer of this forward. */
    uint64_t z = e->seed ^ ((uint64_t)(n->index + 1) * STREAM_MUL);
    z = (z ^ (z >> 32)) * STREAM_MUL;
    z ^= z >> 32;
    ops->dropout_mask(e->dev.ctx, n->save, len, (float)n->sl->p, z);
    ops->mul(e->dev.ctx, n->y, x, n->save, len);
}

static void dropout_backward(struct lnode *n, const struct layer_env *e, const void *x, const float *dy,
                             float *dx)
{
    (void)x;
    if (!dx)
        return;
    const int64_t len = e->batch * n->in_numel;
    if (!active(n, e))
        e->dev.ops->copy(e->dev.ctx, dx, dy, len);
    else
        e->dev.ops->mul(e->dev.ctx, dx, dy, n->save, len);
}

const struct layer_ops layer_dropout = {
    .params = layer_no_params,
    .saved = dropout_saved,
    .work = layer_none,
    .forward = dropout_forward,
    .backward = dropout_backward,
};
