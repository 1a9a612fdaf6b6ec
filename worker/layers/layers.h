/* layers.h — the model engine's table of layer families (model.c runs the tree, each
 * file here runs one family). A family declares its parameters, the device memory its
 * forward keeps for backward (beyond its output) and the scratch it borrows, its init
 * draws, and its forward and backward on tensors whose first dimension is the batch.
 * Adding a family is one file and one row of layer_ops_of (conv.c added conv2d, the
 * pools and flatten that way, batchnorm.c BatchNorm). */
#ifndef DDPD_LAYERS_H
#define DDPD_LAYERS_H

#include <stdbool.h>
#include <stdint.h>

#include "../model.h"
#include "../rng.h"

/* One layer of the tree as the engine holds it. */
struct lnode {
    const struct layer_ops *ops;
    const struct spec_layer *sl; /* the spec's (the model keeps its own copy of the spec) */
    int index;                   /* position in the preorder list */
    int depth;                   /* residuals around it */
    int64_t in_numel, out_numel; /* one sample's elements entering and leaving */
    int p0, np;                  /* its parameters: params[p0 .. p0+np) */
    int b0, nb;                  /* its buffers: the model's buffers[b0 .. b0+nb) */
    int tied_p;                  /* a tied linear (`tie`): the parameter it uses as its weight, the
                                    embedding's, which it does not own; else -1 */
    bool shared;                 /* an embedding whose weight a later tied linear uses: that linear's
                                    backward runs first and writes the gradient, this one adds */
    float *y;                    /* output [max_batch, out_numel] (device) */
    float *save;                 /* what its forward keeps for backward (ops->saved floats) */
};

/* What a forward or backward call sees of the model. */
struct layer_env {
    struct dev dev;
    struct param *params; /* the model's, registration order */
    struct model_buffer *buffers;
    float *work;     /* scratch shared by all layers, ops->work floats at least */
    int64_t batch;   /* rows of this forward */
    bool training;   /* dropout active */
    uint64_t seed;   /* this forward's dropout stream (model.c derives it) */
    bool grad_write; /* first backward after zero_grad: write gradients, don't add */
    model_grad_ready_fn ready;
    void *ready_ctx;
};

/* The most parameters (or buffers) one family declares: attention's four parameters
 * (qkv and proj, weight and bias) are the most; BatchNorm's three buffers fit too. */
#define LAYER_MAX_TENSORS 4

/* A parameter a family declares: its name under the layer's key, its shape. */
struct lparam {
    const char *suffix; /* "weight", "qkv.bias" */
    int ndim;
    int64_t shape[4];
};

struct layer_ops {
    /* Fills out[] (at most LAYER_MAX_TENSORS) and returns the count. */
    int (*params)(const struct spec_layer *sl, struct lparam *out);
    /* Optional (NULL: none): the layer's buffers, as params declares parameters; `i64`
     * marks int64 ones. Their initial values come from init_buffer (device memory is
     * zeroed before). */
    int (*buffers)(const struct spec_layer *sl, struct lparam *out, bool *i64);
    void (*init_buffer)(const struct lnode *n, int k, void *h, int64_t numel);
    /* Floats kept per forward for backward beyond the output, for `rows` samples. */
    int64_t (*saved)(const struct lnode *n, int64_t rows);
    /* Floats of scratch forward or backward borrow, for `rows` samples. */
    int64_t (*work)(const struct lnode *n, int64_t rows);
    /* Initial values of parameter `k` of the layer (numel floats, host memory), drawing
     * from the model's one init stream in registration order. */
    void (*init)(const struct lnode *n, int k, float *h, int64_t numel, struct rng *r);
    /* y = f(x) for e->batch samples; x is the input (int32 ids for embedding). */
    void (*forward)(struct lnode *n, const struct layer_env *e, const void *x);
    /* Gradients of the parameters (reported through layer_ready, last registered first)
     * and, when dx is not NULL, dx (overwritten) from dy. */
    void (*backward)(struct lnode *n, const struct layer_env *e, const void *x, const float *dy, float *dx);
};

/* The family of a layer kind; NULL for residual (model.c runs it) and for kinds this
 * build does not run yet. */
const struct layer_ops *layer_ops_of(layer_kind k);

extern const struct layer_ops layer_linear, layer_activation, layer_embedding, layer_position,
    layer_layernorm, layer_attention, layer_dropout, layer_conv2d, layer_maxpool2d, layer_avgpool2d,
    layer_batchnorm, layer_flatten;

/* ---- helpers the families share ---- */

/* Reports parameter i's gradient complete. */
static inline void layer_ready(const struct layer_env *e, int i)
{
    if (e->ready)
        e->ready(e->ready_ctx, i);
}
/* Zeroes a gradient before a family adds into it, on the first backward after zero_grad. */
static inline void layer_grad_begin(const struct layer_env *e, struct param *p)
{
    if (e->grad_write)
        e->dev.ops->fill(e->dev.ctx, p->grad, 0.0f, p->numel);
}
/* Rows of the last dimension `last` in one sample of `numel` elements. */
static inline int64_t layer_rows(int64_t numel, int64_t last)
{
    return last > 0 ? numel / last : 0;
}

/* nn.Linear on [M, in] rows: y[M,out] = x W^T + b, as addmm (bias first, then sgemm
 * with beta 1). */
void linear_forward_rows(struct dev d, float *y, const float *x, const struct param *w, const struct param *b,
                         int64_t m, int64_t in, int64_t out);
/* Its backward: dW (+)= dy^T x, db (+)= column sums, reported bias then weight, then
 * dx = dy W when dx is not NULL. A tied weight (`report_w` false) is not reported here: its
 * gradient is complete only after the embedding's backward adds its own part. */
void linear_backward_rows(const struct layer_env *e, const float *x, const float *dy, float *dx,
                          struct param *w, struct param *b, int64_t m, int64_t in, int64_t out,
                          bool report_w);
/* For families without parameters, saved floats or scratch. */
int layer_no_params(const struct spec_layer *sl, struct lparam *out);
int64_t layer_none(const struct lnode *n, int64_t rows);
/* U(-bound, bound) from the init stream, bound = 1/sqrt(fan_in). */
void layer_init_uniform(float *h, int64_t numel, double fan_in, struct rng *r);
/* A norm layer's affine parameters as PyTorch makes them: weight (k 0) ones, bias zeros
 * (LayerNorm and BatchNorm; layernorm.c). */
void layer_init_norm_affine(const struct lnode *n, int k, float *h, int64_t numel, struct rng *r);

#endif
