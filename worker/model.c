/* model.c — an nn.Sequential of linear layers and activations with hand-written backward,
 * computed through the backend table so that it runs on any device. Issues the same
 * products PyTorch's autograd issues for nn.Linear (addmm forward, mm backward), so the
 * numbers agree with it. Knows nothing of data, DDP or the optimizer: backward only
 * reports, through a callback, each parameter whose gradient is complete. */
#include "model.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rng.h"
#include "../base/check.h"

struct layer {
    layer_kind kind;
    int64_t in, out;
    int w, b; /* param indices of weight and bias; -1 if none */
    float *y; /* output [max_batch,out] (device) */
};

struct model {
    struct dev dev;
    int n_layers;
    struct layer layers[SPEC_MAX_LAYERS];
    int first_linear; /* backward stops there: nothing before it has parameters */
    int n_params;
    struct param params[2 * SPEC_MAX_LAYERS];
    int64_t numel, max_batch;
    float *data, *grads; /* all parameters / their own gradients, registration order */
    float *acts;         /* every layer's output */
    float *scratch[2];   /* [max_batch,max_width] each: dy ping-pong of backward */
    const float *x;      /* input of the last forward (borrowed) */
    int64_t batch;       /* rows of the last forward */
    /* model_zero_grad only sets this: the next backward then writes gradients instead
     * of adding to them (gemm beta 0), which gives the same bits as adding to zeros
     * and saves a pass over every gradient per step. */
    bool grad_zero;
    bool training; /* model_set_training; no layer here acts on it yet */
};

static void add_param(struct model *m, int layer, const char *what, int ndim, int64_t rows, int64_t cols)
{
    struct param *p = &m->params[m->n_params];
    snprintf(p->name, sizeof p->name, "%d.%s", layer, what);
    p->index = m->n_params++;
    p->layer = layer;
    p->ndim = ndim;
    p->shape[0] = rows;
    p->shape[1] = ndim == 2 ? cols : 0;
    p->numel = ndim == 2 ? rows * cols : rows;
}

/* PyTorch's nn.Linear init (kaiming_uniform_ with a = sqrt(5), which works out to
 * U(-1/sqrt(in), 1/sqrt(in)) for the weight, and the same bound for the bias) drawn from
 * ddpd's own generator: one stream seeded with init_seed, consumed layer by layer, the
 * weight [out,in] in row-major order and then the bias [out]. The values differ from
 * PyTorch's (another generator); the distribution is the same, and `init.from` loads
 * PyTorch's exact weights when they matter. */
static void init_params(struct model *m, uint64_t seed, float *host)
{
    struct rng r;
    rng_seed(&r, seed);
    for (int i = 0; i < m->n_params; i++) {
        const struct param *p = &m->params[i];
        const double bound = 1.0 / sqrt((double)m->layers[p->layer].in);
        float *h = host + (p->data - m->data);
        for (int64_t j = 0; j < p->numel; j++)
            h[j] = (float)((2.0 * rng_uniform(&r) - 1.0) * bound);
    }
}

/* Allocates `n` floats on the device for `what`; a count whose bytes do not fit, or an
 * allocation that fails, is DDPD_EDEVICE (exit 4) naming the tensor and the bytes. */
static float *alloc_floats(struct dev dev, int64_t n, const char *what, struct ddpd_error *err)
{
    int64_t bytes;
    float *p = NULL;
    if (n < 1)
        n = 1;
    if (!__builtin_mul_overflow(n, (int64_t)sizeof(float), &bytes) && (uint64_t)bytes <= SIZE_MAX)
        p = dev.ops->alloc(dev.ctx, (size_t)bytes);
    if (!p)
        ddpd_error_set(err, DDPD_EDEVICE, "model",
                       "out of memory: cannot allocate the %s (%" PRId64 " floats, %.0f bytes, %.1f MiB)",
                       what, n, (double)n * sizeof(float), (double)n * sizeof(float) / (1 << 20));
    return p;
}

struct model *model_new(struct dev dev, const struct spec *spec, int64_t max_batch)
{
    return model_new_err(dev, spec, max_batch, NULL);
}

struct model *model_new_err(struct dev dev, const struct spec *spec, int64_t max_batch,
                            struct ddpd_error *err)
{
    const struct dev_ops *ops = dev.ops;
    struct model *m = calloc(1, sizeof *m);
    float *host = NULL;
    if (!m) {
        ddpd_error_set(err, DDPD_EDEVICE, "model", "out of memory: cannot allocate the model");
        return NULL;
    }
    ASSERT(spec->n_layers >= 0 && spec->n_layers <= SPEC_MAX_LAYERS);
    m->dev = dev;
    m->training = true;
    m->n_layers = spec->n_layers;
    m->max_batch = max_batch > 0 ? max_batch : 1;
    m->first_linear = spec->n_layers;

    /* Every size here comes from the spec: checked, so that a batch or a width near the
     * caps is an allocation that fails, never a product that wraps into a small buffer. */
    int64_t acts = 0, width = 1, acts_n, scratch_n;
    bool over = false;
    for (int i = 0; i < spec->n_layers; i++) {
        const struct spec_layer *sl = &spec->layers[i];
        struct layer *l = &m->layers[i];
        l->kind = sl->kind;
        l->in = sl->in;
        l->out = sl->out;
        l->w = l->b = -1;
        if (sl->kind == LAYER_LINEAR) {
            if (m->first_linear == spec->n_layers)
                m->first_linear = i;
            l->w = m->n_params;
            add_param(m, i, "weight", 2, sl->out, sl->in);
            if (sl->bias) {
                l->b = m->n_params;
                add_param(m, i, "bias", 1, sl->out, 0);
            }
        }
        over |= __builtin_add_overflow(acts, sl->out, &acts);
        width = sl->in > width ? sl->in : width;
        width = sl->out > width ? sl->out : width;
    }
    for (int i = 0; i < m->n_params; i++)
        over |= m->params[i].numel < 0 || __builtin_add_overflow(m->numel, m->params[i].numel, &m->numel);
    over |= __builtin_mul_overflow(m->max_batch, acts ? acts : 1, &acts_n);
    over |= __builtin_mul_overflow(m->max_batch, width, &scratch_n);
    if (over) {
        ddpd_error_set(err, DDPD_EDEVICE, "model",
                       "out of memory: the model's tensors for micro-batches of %" PRId64
                       " rows are larger than any memory",
                       m->max_batch);
        goto fail;
    }

    const size_t fsz = sizeof(float);
    if (!(m->data = alloc_floats(dev, m->numel, "parameters", err)) ||
        !(m->grads = alloc_floats(dev, m->numel, "gradients", err)) ||
        !(m->acts = alloc_floats(dev, acts_n, "activations", err)) ||
        !(m->scratch[0] = alloc_floats(dev, scratch_n, "backward scratch", err)) ||
        !(m->scratch[1] = alloc_floats(dev, scratch_n, "backward scratch", err)))
        goto fail;
    host = malloc((size_t)(m->numel ? m->numel : 1) * fsz);
    if (!host) {
        ddpd_error_set(err, DDPD_EDEVICE, "model",
                       "out of memory: cannot allocate the host copy of the parameters (%" PRId64
                       " floats, %.1f MiB)",
                       m->numel, (double)m->numel * fsz / (1 << 20));
        goto fail;
    }

    int64_t off = 0;
    for (int i = 0; i < m->n_params; i++) {
        m->params[i].data = m->data + off;
        m->params[i].grad = m->grads + off; /* alloc zeroed it */
        off += m->params[i].numel;
    }
    off = 0;
    for (int i = 0; i < m->n_layers; i++) {
        m->layers[i].y = m->acts + off;
        off += m->max_batch * m->layers[i].out;
    }
    init_params(m, spec->init_seed, host);
    ops->to_device(dev.ctx, m->data, host, (size_t)m->numel * fsz);
    ops->synchronize(dev.ctx);
    free(host);
    return m;
fail:
    free(host);
    model_free(m);
    return NULL;
}

int model_spec_params(const struct spec *spec, struct param *out)
{
    struct model *m = calloc(1, sizeof *m);
    if (!m)
        return -1;
    ASSERT(spec->n_layers >= 0 && spec->n_layers <= SPEC_MAX_LAYERS);
    for (int i = 0; i < spec->n_layers; i++) {
        const struct spec_layer *sl = &spec->layers[i];
        if (sl->kind != LAYER_LINEAR)
            continue;
        add_param(m, i, "weight", 2, sl->out, sl->in);
        if (sl->bias)
            add_param(m, i, "bias", 1, sl->out, 0);
    }
    int n = m->n_params;
    memcpy(out, m->params, (size_t)n * sizeof *out);
    free(m);
    return n;
}

void model_free(struct model *m)
{
    if (!m)
        return;
    const struct dev_ops *ops = m->dev.ops;
    void *ctx = m->dev.ctx;
    if (m->data)
        ops->free(ctx, m->data);
    if (m->grads)
        ops->free(ctx, m->grads);
    if (m->acts)
        ops->free(ctx, m->acts);
    for (int i = 0; i < 2; i++)
        if (m->scratch[i])
            ops->free(ctx, m->scratch[i]);
    free(m);
}

struct dev model_dev(const struct model *m)
{
    return m->dev;
}
int model_param_count(const struct model *m)
{
    return m->n_params;
}
int64_t model_numel(const struct model *m)
{
    return m->numel;
}

struct param *model_param(struct model *m, int i)
{
    ASSERT(i >= 0 && i < m->n_params);
    return &m->params[i];
}

/* Linear: y[B,out] = x[B,in] W[out,in]^T + b. PyTorch's addmm(b, x, W^T) first fills
 * the output with the broadcast bias and then runs sgemm with beta = 1, so the bias
 * joins the sum before the partial products of later k-blocks; doing the same keeps
 * its rounding for any `in`. */
void model_set_training(struct model *m, bool training)
{
    m->training = training;
}

const float *model_forward(struct model *m, const float *x, int64_t batch)
{
    const struct dev_ops *ops = m->dev.ops;
    void *ctx = m->dev.ctx;
    ASSERT(batch >= 0 && batch <= m->max_batch);
    m->x = x;
    m->batch = batch;
    const float *in = x;
    for (int i = 0; i < m->n_layers; i++) {
        struct layer *l = &m->layers[i];
        if (l->kind == LAYER_LINEAR) {
            float beta = 0.0f;
            if (l->b >= 0) {
                ops->fill(ctx, l->y, 0.0f, batch * l->out);
                ops->add_bias(ctx, l->y, m->params[l->b].data, batch, l->out);
                beta = 1.0f;
            }
            ops->gemm(ctx, false, true, batch, l->out, l->in, 1.0f, in, l->in, m->params[l->w].data, l->in,
                      beta, l->y, l->out);
        } else {
            ops->act_forward(ctx, l->kind, l->y, in, batch * l->out);
        }
        in = l->y;
    }
    return in;
}

/* Reverse walk. For a linear layer the parameter gradients come first (dW += dy^T x as
 * PyTorch's mm_mat2_backward computes it, db += dy summed over rows), are reported
 * (bias, then weight, the order PyTorch's hooks fire in), and only then is dx = dy W
 * computed, so DDP can reduce them while the rest of backward runs. dy alternates
 * between the two scratch buffers; the caller's dy is never written.
 * dW accumulates through gemm's beta = 1 rather than PyTorch's mm-then-add: after
 * zero_grad the two are the same bits; when micro-batches accumulate they differ only
 * if B spans several of OpenBLAS's k-blocks (hundreds of rows), by float rounding. */
void model_backward(struct model *m, const float *dy, model_grad_ready_fn ready, void *ctx)
{
    const struct dev_ops *ops = m->dev.ops;
    void *dctx = m->dev.ctx;
    const int64_t B = m->batch;
    const float *cur = dy;
    for (int i = m->n_layers - 1; i >= m->first_linear; i--) {
        struct layer *l = &m->layers[i];
        const float *in = i ? m->layers[i - 1].y : m->x;
        float *next = cur == m->scratch[0] ? m->scratch[1] : m->scratch[0];
        if (l->kind == LAYER_LINEAR) {
            struct param *w = &m->params[l->w];
            ops->gemm(dctx, true, false, l->out, l->in, B, 1.0f, cur, l->out, in, l->in,
                      m->grad_zero ? 0.0f : 1.0f, w->grad, l->in);
            if (l->b >= 0) {
                struct param *b = &m->params[l->b];
                if (m->grad_zero)
                    ops->fill(dctx, b->grad, 0.0f, b->numel);
                ops->bias_grad(dctx, b->grad, cur, B, l->out);
                if (ready)
                    ready(ctx, l->b);
            }
            if (ready)
                ready(ctx, l->w);
            if (i == m->first_linear)
                break; /* nothing below needs dx */
            ops->gemm(dctx, false, false, B, l->in, l->out, 1.0f, cur, l->out, w->data, l->in, 0.0f, next,
                      l->in);
        } else {
            ops->act_backward(dctx, l->kind, next, cur, in, l->y, B * l->out);
        }
        cur = next;
    }
    m->grad_zero = false;
}

void model_zero_grad(struct model *m)
{
    m->grad_zero = true;
}

void model_set_grad_storage(struct model *m, int i, float *grad)
{
    struct param *p = model_param(m, i);
    if (m->grad_zero)
        m->dev.ops->fill(m->dev.ctx, grad, 0.0f, p->numel);
    else
        m->dev.ops->copy(m->dev.ctx, grad, p->grad, p->numel);
    p->grad = grad;
}
