/* layernorm.c — nn.LayerNorm(dim, eps) over the last dimension of any rank (weight 1,
 * bias 0). Keeps each row's mean and rstd for backward. */
#include "layers.h"

static int layernorm_params(const struct spec_layer *sl, struct lparam *out)
{
    out[0] = (struct lparam){"weight", 1, {sl->dim, 0}};
    if (!sl->bias)
        return 1;
    out[1] = (struct lparam){"bias", 1, {sl->dim, 0}};
    return 2;
}

static int64_t layernorm_saved(const struct lnode *n, int64_t rows)
{
    return 2 * rows * layer_rows(n->in_numel, n->sl->dim); /* mean, rstd */
}

void layer_init_norm_affine(const struct lnode *n, int k, float *h, int64_t numel, struct rng *r)
{
    (void)n;
    (void)r;
    for (int64_t j = 0; j < numel; j++)
        h[j] = k == 0 ? 1.0f : 0.0f;
}

static void layernorm_forward(struct lnode *n, const struct layer_env *e, const void *x)
{
    const int64_t rows = e->batch * layer_rows(n->in_numel, n->sl->dim);
    float *mean = n->save, *rstd = n->save + rows;
    e->dev.ops->layernorm_forward(e->dev.ctx, n->y, mean, rstd, x, e->params[n->p0].data,
                                  n->np > 1 ? e->params[n->p0 + 1].data : NULL, rows, n->sl->dim,
                                  (float)n->sl->eps);
}

static void layernorm_backward(struct lnode *n, const struct layer_env *e, const void *x, const float *dy,
                               float *dx)
{
    const int64_t rows = e->batch * layer_rows(n->in_numel, n->sl->dim);
    struct param *w = &e->params[n->p0], *b = n->np > 1 ? &e->params[n->p0 + 1] : NULL;
    float *ddx = dx ? dx : e->work; /* the op always writes dx */
    layer_grad_begin(e, w);
    if (b)
        layer_grad_begin(e, b);
    e->dev.ops->layernorm_backward(e->dev.ctx, ddx, w->grad, b ? b->grad : NULL, dy, x, n->save,
                                   n->save + rows, w->data, rows, n->sl->dim);
    if (b)
        layer_ready(e, b->index);
    layer_ready(e, w->index);
}

static int64_t layernorm_work(const struct lnode *n, int64_t rows)
{
    return rows * n->in_numel; /* dx when nothing below needs it */
}

const struct layer_ops layer_layernorm = {
    .params = layernorm_params,
    .saved = layernorm_saved,
    .work = layernorm_work,
    .init = layer_init_norm_affine,
    .forward = layernorm_forward,
    .backward = layernorm_backward,
};
