/* model.c — the engine of the layer tree: builds the parameters and the activation plan
 * from the spec's flat preorder tree (schema/spec.h), runs forward and backward through
 * the layer families of worker/layers/ and the backend table, so it runs on any device.
 * Residuals are run here: x + inner(x), nested. Knows nothing of data, DDP or the
 * optimizer: backward only reports, through a callback, each parameter whose gradient is
 * complete. Every tensor is allocated once, in model_new; a step allocates nothing. */
#include "model.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layers/layers.h"
#include "prof.h"
#include "rng.h"
#include "rng_hash.h"
#include "../base/check.h"

/* Bytes a buffer entry takes in device memory: room for an int64 (num_batches_tracked). */
#define BUFFER_SLOT 8

enum { MAX_DEPTH = SPEC_MAX_LAYERS };

struct model {
    struct dev dev;
    int n_layers;
    struct spec_layer sl[SPEC_MAX_LAYERS];
    struct lnode nodes[SPEC_MAX_LAYERS];
    int first_param; /* the first layer (preorder) with parameters: nothing before needs dx */
    int n_params;
    struct param params[SPEC_MAX_PARAMS];
    int n_buffers;
    struct model_buffer buffers[SPEC_MAX_PARAMS];
    int n_aliases; /* tied weights' second names (model_alias) */
    struct model_alias aliases[SPEC_MAX_LAYERS];
    int64_t numel, max_batch;
    int64_t act_floats;  /* outputs, saved tensors, scratch: model_activation_bytes / 4 */
    float *data, *grads; /* all parameters / their own gradients, registration order */
    float *acts;         /* every layer's output and what it keeps for backward */
    float *work;         /* the layers' shared scratch */
    float *scratch;      /* backward's dy ping-pong: two buffers per residual depth */
    int64_t scratch_n;   /* floats of one of them */
    int depths;
    const void *x; /* input of the last forward (borrowed) */
    int64_t batch; /* rows of the last forward */
    bool training; /* dropout on (default) */
    bool last_training;
    uint64_t init_seed, rank;
    uint64_t forwards; /* dropout's position: counted, or model_set_position's */
    /* model_zero_grad only sets this: the next backward writes gradients instead of
     * adding to them (gemm beta 0), which gives the same bits as adding to zeros and
     * saves a pass over every gradient per step. */
    bool grad_zero;
};

const struct layer_ops *layer_ops_of(layer_kind k)
{
    switch (k) {
    case LAYER_LINEAR: return &layer_linear;
    case LAYER_RELU:
    case LAYER_TANH:
    case LAYER_SIGMOID:
    case LAYER_GELU:
    case LAYER_GELU_TANH: return &layer_activation;
    case LAYER_EMBEDDING: return &layer_embedding;
    case LAYER_POSITION: return &layer_position;
    case LAYER_LAYERNORM: return &layer_layernorm;
    case LAYER_ATTENTION: return &layer_attention;
    case LAYER_DROPOUT: return &layer_dropout;
    case LAYER_CONV2D: return &layer_conv2d;
    case LAYER_MAXPOOL2D: return &layer_maxpool2d;
    case LAYER_AVGPOOL2D: return &layer_avgpool2d;
    case LAYER_BATCHNORM: return &layer_batchnorm;
    case LAYER_FLATTEN: return &layer_flatten;
    default: return NULL; /* residual: run here */
    }
}

static int64_t shape_numel(int rank, const int64_t *shape, int64_t fallback)
{
    if (rank < 1)
        return fallback;
    int64_t n = 1;
    for (int i = 0; i < rank; i++)
        if (__builtin_mul_overflow(n, shape[i], &n))
            return -1;
    return n;
}

/* The layer's parameters, named "<key>.<suffix>", appended to out[*n]. */
static void layer_params(const struct spec_layer *sl, int index, struct param *out, int *n)
{
    const struct layer_ops *ops = layer_ops_of(sl->kind);
    struct lparam lp[LAYER_MAX_TENSORS];
    int k = ops ? ops->params(sl, lp) : 0;
    for (int j = 0; j < k; j++) {
        struct param *p = &out[*n];
        memset(p, 0, sizeof *p);
        snprintf(p->name, sizeof p->name, "%s.%s", sl->key[0] ? sl->key : "?", lp[j].suffix);
        p->index = (*n)++;
        p->layer = index;
        p->ndim = lp[j].ndim;
        p->shape[0] = lp[j].shape[0];
        p->numel = 1;
        for (int d = 0; d < 4; d++) {
            p->shape[d] = d < lp[j].ndim ? lp[j].shape[d] : 0;
            if (d < lp[j].ndim)
                p->numel *= lp[j].shape[d];
        }
    }
}

/* Layer i of `spec` as the model holds it: `tie` kept only where spec_layer_tie allows it
 * (-1 elsewhere), so that the families may read it as it stands. */
static struct spec_layer model_layer_of(const struct spec *spec, int i)
{
    struct spec_layer sl = spec->layers[i];
    sl.tie = spec_layer_tie(spec, i);
    return sl;
}

/* The parameters of `spec` into out[] (NULL: counted only) and, when `aliases` is not
 * NULL, the second names of tied weights: "<key>.weight" of each tied linear, naming the
 * embedding's parameter (registered at the embedding, the first occurrence, as PyTorch's
 * DDP keeps a shared parameter). Returns the parameter count; *n_aliases the aliases'. */
static int spec_params(const struct spec *spec, struct param *out, struct model_alias *aliases,
                       int *n_aliases)
{
    ASSERT(spec->n_layers >= 0 && spec->n_layers <= SPEC_MAX_LAYERS);
    int n = 0, first[SPEC_MAX_LAYERS], na = 0;
    for (int i = 0; i < spec->n_layers; i++) {
        const struct spec_layer sl = model_layer_of(spec, i);
        const struct layer_ops *ops = layer_ops_of(sl.kind);
        struct lparam lp[LAYER_MAX_TENSORS];
        first[i] = n;
        if (out)
            layer_params(&sl, i, out, &n);
        else
            n += ops ? ops->params(&sl, lp) : 0;
        if (sl.tie < 0 || !aliases)
            continue;
        struct model_alias *a = &aliases[na++];
        memset(a, 0, sizeof *a);
        snprintf(a->name, sizeof a->name, "%s.weight", sl.key);
        a->param = first[sl.tie]; /* the embedding's one parameter, its table */
        a->layer = i;
    }
    if (n_aliases)
        *n_aliases = na;
    return n;
}

int model_spec_params(const struct spec *spec, struct param *out)
{
    return spec_params(spec, out, NULL, NULL);
}

int model_spec_aliases(const struct spec *spec, struct model_alias *out)
{
    int na = 0;
    spec_params(spec, NULL, out, &na);
    return na;
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

/* The backend ops a layer needs beyond the v1 set: a backend whose slot is still NULL
 * cannot run it, which model_new says naming the op and the layer. */
static const char *missing_op(const struct dev_ops *o, const struct spec_layer *sl)
{
    switch (sl->kind) {
    case LAYER_EMBEDDING:
        return !o->embedding_forward    ? "embedding_forward"
               : !o->embedding_backward ? "embedding_backward"
                                        : NULL;
    case LAYER_LAYERNORM:
        return !o->layernorm_forward    ? "layernorm_forward"
               : !o->layernorm_backward ? "layernorm_backward"
                                        : NULL;
    case LAYER_ATTENTION:
        return !o->gemm_batched           ? "gemm_batched"
               : !o->softmax_forward      ? "softmax_forward"
               : !o->softmax_backward     ? "softmax_backward"
               : !o->heads_split          ? "heads_split"
               : !o->heads_split_backward ? "heads_split_backward"
               : !o->heads_merge          ? "heads_merge"
               : !o->heads_merge_backward ? "heads_merge_backward"
                                          : NULL;
    case LAYER_RESIDUAL: return !o->add ? "add" : NULL;
    case LAYER_DROPOUT:
        return sl->p <= 0.0 ? NULL : !o->dropout_mask ? "dropout_mask" : !o->mul ? "mul" : NULL;
    case LAYER_CONV2D:
        return !o->gemm_batched ? "gemm_batched" : !o->im2col ? "im2col" : !o->col2im ? "col2im" : NULL;
    case LAYER_MAXPOOL2D:
        return !o->maxpool2d_forward    ? "maxpool2d_forward"
               : !o->maxpool2d_backward ? "maxpool2d_backward"
                                        : NULL;
    case LAYER_AVGPOOL2D:
        return !o->avgpool2d_forward    ? "avgpool2d_forward"
               : !o->avgpool2d_backward ? "avgpool2d_backward"
                                        : NULL;
    case LAYER_BATCHNORM:
        return !o->batchnorm_forward_train  ? "batchnorm_forward_train"
               : !o->batchnorm_forward_eval ? "batchnorm_forward_eval"
               : !o->batchnorm_backward     ? "batchnorm_backward"
               : !o->add_i64                ? "add_i64"
                                            : NULL;
    default: return NULL;
    }
}

/* The init stream: one generator seeded with init_seed, consumed parameter by parameter
 * in registration order, each family drawing its own way (linear, qkv, proj: PyTorch's
 * nn.Linear U(±1/sqrt(in)), weight [out,in] row-major then bias; embedding, position:
 * N(0,1); layernorm: 1 and 0, no draws). For a v1 MLP this is the stream ddpd has always
 * drawn. The values differ from PyTorch's (another generator); `init.from` loads
 * PyTorch's exact weights when they matter. */
static void init_params(struct model *m, uint64_t seed, float *host)
{
    struct rng r;
    rng_seed(&r, seed);
    for (int i = 0; i < m->n_params; i++) {
        const struct param *p = &m->params[i];
        const struct lnode *n = &m->nodes[p->layer];
        float *h = host + (p->data - m->data);
        if (n->ops->init)
            n->ops->init(n, i - n->p0, h, p->numel, &r);
    }
}

struct model *model_new(struct dev dev, const struct spec *spec, int64_t max_batch)
{
    return model_new_err(dev, spec, max_batch, NULL);
}

/* a += b * c, saturating into `over`. */
static void add_mul(int64_t *a, int64_t b, int64_t c, bool *over)
{
    int64_t t;
    *over |= b < 0 || c < 0 || __builtin_mul_overflow(b, c, &t) || __builtin_add_overflow(*a, t, a);
}

/* The buffers layer node n declares, named "<key>.<suffix>", appended to the model's. */
static void node_buffers(struct model *m, struct lnode *n)
{
    n->b0 = m->n_buffers;
    if (n->ops && n->ops->buffers) {
        struct lparam lb[LAYER_MAX_TENSORS];
        bool i64[LAYER_MAX_TENSORS] = {false};
        const int k = n->ops->buffers(n->sl, lb, i64);
        for (int j = 0; j < k && m->n_buffers < SPEC_MAX_PARAMS; j++) {
            struct model_buffer *b = &m->buffers[m->n_buffers];
            snprintf(b->name, sizeof b->name, "%s.%s", n->sl->key, lb[j].suffix);
            b->index = m->n_buffers++;
            b->layer = n->index;
            b->i64 = i64[j];
            b->numel = lb[j].shape[0]; /* buffers are vectors or scalars */
        }
    }
    n->nb = m->n_buffers - n->b0;
}

/* Layer i's node: its family (which the backend must be able to run), its sizes, and its
 * parameters and buffers appended to the model's. false with err set when it cannot run. */
static bool node_register(struct model *m, int i, struct ddpd_error *err)
{
    const struct dev_ops *ops = m->dev.ops;
    const struct spec_layer *sl = &m->sl[i];
    struct lnode *n = &m->nodes[i];
    n->sl = sl;
    n->index = i;
    n->depth = sl->parent >= 0 ? m->nodes[sl->parent].depth + 1 : 0;
    n->ops = layer_ops_of(sl->kind);
    n->tied_p = -1;
    n->in_numel = shape_numel(sl->in_rank, sl->in_shape, sl->in);
    n->out_numel = shape_numel(sl->out_rank, sl->out_shape, sl->out);
    if (!n->ops && sl->kind != LAYER_RESIDUAL) {
        ddpd_error_set(err, DDPD_ESPEC, "model", "model (layer %s): %s layers are not supported yet", sl->key,
                       layer_kind_name(sl->kind));
        return false;
    }
    const char *op = missing_op(ops, sl);
    if (op) {
        ddpd_error_set(err, DDPD_EDEVICE, "model", "the %s backend has no %s op: it cannot run %s layer %s",
                       ops->name, op, layer_kind_name(sl->kind), sl->key);
        return false;
    }
    n->p0 = m->n_params;
    if (m->n_params + LAYER_MAX_TENSORS > SPEC_MAX_PARAMS) {
        ddpd_error_set(err, DDPD_ESPEC, "model", "model: more than %d parameter tensors", SPEC_MAX_PARAMS);
        return false;
    }
    layer_params(sl, i, m->params, &m->n_params);
    n->np = m->n_params - n->p0;
    node_buffers(m, n);
    return true;
}

/* Points each parameter (and gradient, when the model has them) into the model's slabs. */
static void lay_out_params(struct model *m)
{
    int64_t off = 0;
    for (int i = 0; i < m->n_params; i++) {
        m->params[i].data = m->data + off;
        m->params[i].grad = m->grads ? m->grads + off : NULL; /* alloc zeroed it */
        off += m->params[i].numel;
    }
}

/* Points each layer's output into acts[0, outs) and what it keeps for backward after them. */
static void lay_out_acts(struct model *m, int64_t outs)
{
    int64_t off = 0;
    for (int i = 0; i < m->n_layers; i++) {
        struct lnode *n = &m->nodes[i];
        n->y = m->acts + off;
        off += m->max_batch * n->out_numel;
    }
    int64_t soff = outs;
    for (int i = 0; i < m->n_layers; i++) {
        struct lnode *n = &m->nodes[i];
        if (n->ops) {
            n->save = m->acts + soff;
            soff += n->ops->saved(n, m->max_batch);
        }
    }
}

/* Each buffer in device memory with its family's initial values (BUFFER_SLOT bytes an
 * entry, so an int64 fits; a float buffer uses the first half). */
static bool init_buffers(struct model *m, struct ddpd_error *err)
{
    const struct dev_ops *ops = m->dev.ops;
    for (int i = 0; i < m->n_buffers; i++) {
        struct model_buffer *b = &m->buffers[i];
        const struct lnode *n = &m->nodes[b->layer];
        const size_t bytes = (size_t)(b->numel > 0 ? b->numel : 1) * BUFFER_SLOT;
        void *h = calloc(1, bytes);
        if (!h || !(b->data = ops->alloc(m->dev.ctx, bytes))) {
            free(h);
            ddpd_error_set(err, DDPD_EDEVICE, "model", "out of memory: cannot allocate the buffer %s",
                           b->name);
            return false;
        }
        if (n->ops->init_buffer)
            n->ops->init_buffer(n, i - n->b0, h, b->numel);
        ops->to_device(m->dev.ctx, b->data, h, (size_t)b->numel * (b->i64 ? 8 : 4));
        free(h);
    }
    return true;
}

/* Registers every layer of `spec` (its family, sizes, parameters and buffers) into a new
 * model on `dev`, allocating no device memory yet. NULL with err set when a layer cannot
 * run here or the sizes overflow. */
static struct model *model_shell(struct dev dev, const struct spec *spec, int64_t max_batch,
                                 struct ddpd_error *err)
{
    struct model *m = calloc(1, sizeof *m);
    if (!m) {
        ddpd_error_set(err, DDPD_EDEVICE, "model", "out of memory: cannot allocate the model");
        return NULL;
    }
    ASSERT(spec->n_layers >= 0 && spec->n_layers <= SPEC_MAX_LAYERS);
    m->dev = dev;
    m->n_layers = spec->n_layers;
    m->max_batch = max_batch > 0 ? max_batch : 1;
    m->first_param = spec->n_layers;
    m->training = true;
    m->init_seed = spec->init_seed;
    for (int i = 0; i < m->n_layers; i++)
        m->sl[i] = model_layer_of(spec, i);
    bool over = false;
    for (int i = 0; i < m->n_layers && !over; i++) {
        struct lnode *n = &m->nodes[i];
        if (!node_register(m, i, err)) {
            model_free(m);
            return NULL;
        }
        over |= n->in_numel < 0 || n->out_numel < 0;
        if (n->np && m->first_param == m->n_layers)
            m->first_param = i;
        if (n->depth + 1 > m->depths)
            m->depths = n->depth + 1;
    }
    /* Tied linears use their embedding's table, which then gets its gradient from both. */
    spec_params(spec, NULL, m->aliases, &m->n_aliases);
    for (int j = 0; j < m->n_aliases; j++) {
        const struct model_alias *a = &m->aliases[j];
        struct lnode *e = &m->nodes[m->params[a->param].layer];
        ASSERT(e->np == 1 && e->p0 == a->param && e->index < a->layer);
        m->nodes[a->layer].tied_p = a->param;
        e->shared = true;
    }
    for (int i = 0; i < m->n_params; i++)
        over |= m->params[i].numel < 0 || __builtin_add_overflow(m->numel, m->params[i].numel, &m->numel);
    if (over) {
        ddpd_error_set(err, DDPD_EDEVICE, "model",
                       "out of memory: the model's tensors for micro-batches of %" PRId64
                       " rows are larger than any memory",
                       m->max_batch);
        model_free(m);
        return NULL;
    }
    return m;
}

/* The activation plan's sizes in floats for micro-batches of `rows` rows: every layer's
 * output, what the layers keep (`saved`), their shared scratch and, with `backward`,
 * backward's dy ping-pong (two buffers of scratch_n per residual depth). Every size comes
 * from the spec: checked, so that a batch or a width near the caps is an allocation that
 * fails, never a product that wraps into a small buffer. false when they overflow. */
struct plan {
    int64_t outs, saved, work, scratch_n, scratch_all, total;
};

static bool plan_sizes(const struct model *m, int64_t rows, bool backward, struct plan *p)
{
    int64_t widest = 1;
    bool over = false;
    memset(p, 0, sizeof *p);
    for (int i = 0; i < m->n_layers && !over; i++) {
        const struct lnode *n = &m->nodes[i];
        add_mul(&p->outs, rows, n->out_numel, &over);
        if (n->ops) {
            add_mul(&p->saved, n->ops->saved(n, rows), 1, &over);
            int64_t w = n->ops->work(n, rows);
            p->work = w > p->work ? w : p->work;
        }
        widest = n->in_numel > widest ? n->in_numel : widest;
        widest = n->out_numel > widest ? n->out_numel : widest;
    }
    if (backward) {
        add_mul(&p->scratch_n, rows, widest, &over);
        add_mul(&p->scratch_all, p->scratch_n, 2 * (int64_t)(m->depths ? m->depths : 1), &over);
    }
    add_mul(&p->total, p->outs, 1, &over);
    add_mul(&p->total, p->saved, 1, &over);
    add_mul(&p->total, p->work, 1, &over);
    add_mul(&p->total, p->scratch_all, 1, &over);
    return !over;
}

/* plan_sizes for the model's max_batch, kept in the model; DDPD_EDEVICE when too large. */
static bool plan_set(struct model *m, bool backward, struct plan *p, struct ddpd_error *err)
{
    if (!plan_sizes(m, m->max_batch, backward, p)) {
        ddpd_error_set(err, DDPD_EDEVICE, "model",
                       "out of memory: the model's tensors for micro-batches of %" PRId64
                       " rows are larger than any memory",
                       m->max_batch);
        return false;
    }
    m->scratch_n = p->scratch_n;
    m->act_floats = p->total;
    return true;
}

int64_t model_plan_bytes(const struct model *m, int64_t max_batch)
{
    struct plan p;
    if (!plan_sizes(m, max_batch > 0 ? max_batch : 1, false, &p) || p.total > INT64_MAX / 4)
        return INT64_MAX;
    return p.total * 4;
}

/* Allocates the plan `p` sized and points every layer's output and saved tensors into it. */
static bool plan_alloc(struct model *m, const struct plan *p, struct ddpd_error *err)
{
    if (!(m->acts = alloc_floats(m->dev, p->outs + p->saved, "activations", err)) ||
        !(m->work = alloc_floats(m->dev, p->work, "layers' scratch", err)) ||
        (p->scratch_all > 0 && !(m->scratch = alloc_floats(m->dev, p->scratch_all, "backward scratch", err))))
        return false;
    lay_out_acts(m, p->outs);
    return true;
}

struct model *model_new_err(struct dev dev, const struct spec *spec, int64_t max_batch,
                            struct ddpd_error *err)
{
    const struct dev_ops *ops = dev.ops;
    struct plan plan;
    float *host = NULL;
    struct model *m = model_shell(dev, spec, max_batch, err);
    if (!m)
        return NULL;
    if (!plan_set(m, true, &plan, err))
        goto fail;

    const size_t fsz = sizeof(float);
    if (!(m->data = alloc_floats(dev, m->numel, "parameters", err)) ||
        !(m->grads = alloc_floats(dev, m->numel, "gradients", err)) || !plan_alloc(m, &plan, err))
        goto fail;
    host = malloc((size_t)(m->numel ? m->numel : 1) * fsz);
    if (!host) {
        ddpd_error_set(err, DDPD_EDEVICE, "model",
                       "out of memory: cannot allocate the host copy of the parameters (%" PRId64
                       " floats, %.1f MiB)",
                       m->numel, (double)m->numel * fsz / (1 << 20));
        goto fail;
    }

    lay_out_params(m);
    init_params(m, spec->init_seed, host);
    ops->to_device(dev.ctx, m->data, host, (size_t)m->numel * fsz);
    if (!init_buffers(m, err))
        goto fail;
    ops->synchronize(dev.ctx);
    free(host);
    return m;
fail:
    free(host);
    model_free(m);
    return NULL;
}

struct model *model_new_eval(struct dev dev, const struct spec *spec, struct ddpd_error *err)
{
    struct model *m = model_shell(dev, spec, 1, err);
    if (!m)
        return NULL;
    m->training = false;
    /* No init draws: the caller loads every parameter (checkpoint_load_weights). */
    if (!(m->data = alloc_floats(dev, m->numel, "parameters", err))) {
        model_free(m);
        return NULL;
    }
    lay_out_params(m);
    if (!init_buffers(m, err)) {
        model_free(m);
        return NULL;
    }
    dev.ops->synchronize(dev.ctx);
    return m;
}

void model_plan_free(struct model *m)
{
    float **bufs[] = {&m->acts, &m->work, &m->scratch};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        if (*bufs[i])
            m->dev.ops->free(m->dev.ctx, *bufs[i]);
        *bufs[i] = NULL;
    }
    for (int i = 0; i < m->n_layers; i++)
        m->nodes[i].y = m->nodes[i].save = NULL;
    m->act_floats = 0;
}

ddpd_err model_plan(struct model *m, int64_t max_batch, struct ddpd_error *err)
{
    struct plan plan;
    ASSERT(!m->grads); /* a training model keeps the plan model_new made */
    model_plan_free(m);
    m->max_batch = max_batch > 0 ? max_batch : 1;
    if (plan_set(m, false, &plan, err) && plan_alloc(m, &plan, err))
        return DDPD_OK;
    model_plan_free(m);
    return err ? err->code : DDPD_EDEVICE;
}

int model_layer_count(const struct model *m)
{
    return m->n_layers;
}

const struct spec_layer *model_layer(const struct model *m, int i)
{
    ASSERT(i >= 0 && i < m->n_layers);
    return &m->sl[i];
}

int model_layer_params(struct model *m, int i, struct param **first)
{
    ASSERT(i >= 0 && i < m->n_layers);
    *first = &m->params[m->nodes[i].p0];
    return m->nodes[i].np;
}

struct param *model_layer_tied(struct model *m, int i)
{
    ASSERT(i >= 0 && i < m->n_layers);
    return m->nodes[i].tied_p >= 0 ? &m->params[m->nodes[i].tied_p] : NULL;
}

int model_alias_count(const struct model *m)
{
    return m->n_aliases;
}

const struct model_alias *model_alias(const struct model *m, int i)
{
    ASSERT(i >= 0 && i < m->n_aliases);
    return &m->aliases[i];
}

void model_free(struct model *m)
{
    if (!m)
        return;
    const struct dev_ops *ops = m->dev.ops;
    void *ctx = m->dev.ctx;
    float *bufs[] = {m->data, m->grads, m->acts, m->work, m->scratch};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i])
            ops->free(ctx, bufs[i]);
    for (int i = 0; i < m->n_buffers; i++)
        if (m->buffers[i].data)
            ops->free(ctx, m->buffers[i].data);
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
int64_t model_activation_bytes(const struct model *m)
{
    return m->act_floats > INT64_MAX / 4 ? INT64_MAX : m->act_floats * 4;
}

struct param *model_param(struct model *m, int i)
{
    ASSERT(i >= 0 && i < m->n_params);
    return &m->params[i];
}

int model_buffer_count(const struct model *m)
{
    return m->n_buffers;
}

struct model_buffer *model_buffer(struct model *m, int i)
{
    ASSERT(i >= 0 && i < m->n_buffers);
    return &m->buffers[i];
}

void model_set_training(struct model *m, bool training)
{
    m->training = training;
}

ddpd_err model_check_batch(const struct model *m, int64_t batch, struct ddpd_error *err)
{
    if (!m->training)
        return DDPD_OK;
    for (int i = 0; i < m->n_layers; i++) {
        const struct spec_layer *sl = &m->sl[i];
        const int64_t per_channel = sl->dim > 0 ? batch * (m->nodes[i].in_numel / sl->dim) : 0;
        if (sl->kind != LAYER_BATCHNORM || per_channel > 1)
            continue;
        char size[96];
        int o = snprintf(size, sizeof size, "[%" PRId64, batch);
        for (int d = 0; d < sl->in_rank && o > 0 && (size_t)o < sizeof size; d++)
            o += snprintf(size + o, sizeof size - (size_t)o, ", %" PRId64, sl->in_shape[d]);
        if (o > 0 && (size_t)o < sizeof size - 1)
            snprintf(size + o, sizeof size - (size_t)o, "]");
        return ddpd_error_set(err, DDPD_EDATA, "model",
                              "model layer %s (batchnorm): Expected more than 1 value per channel when "
                              "training, got input size %s",
                              sl->key, size);
    }
    return DDPD_OK;
}

void model_set_rank(struct model *m, int rank)
{
    m->rank = (uint64_t)rank;
}

void model_set_position(struct model *m, int64_t step, int64_t micro)
{
    m->forwards = rng_hash_mix64((uint64_t)step) ^ ((uint64_t)micro * RNG_HASH_GOLDEN);
}

static struct layer_env env_of(struct model *m)
{
    struct layer_env e = {
        .dev = m->dev,
        .params = m->params,
        .buffers = m->buffers,
        .work = m->work,
        .batch = m->batch,
        .training = m->last_training,
        /* this forward's dropout stream, before the count moves on */
        .seed = rng_hash_mix64(rng_hash_mix64(rng_hash_mix64(m->init_seed) ^ m->rank) ^ m->forwards),
        .grad_write = m->grad_zero,
    };
    return e;
}

/* The layer after i at i's level of the tree (past a residual's inner layers). */
static int next_layer(const struct model *m, int i)
{
    return m->sl[i].end > i ? m->sl[i].end : i + 1;
}

/* Runs the layers of [begin, end) (one level of the tree) on x; returns the output. */
static const void *forward_range(struct model *m, const struct layer_env *e, int begin, int end,
                                 const void *x)
{
    for (int i = begin; i < end; i = next_layer(m, i)) {
        struct lnode *n = &m->nodes[i];
        if (n->sl->kind == LAYER_RESIDUAL) {
            const float *inner = forward_range(m, e, i + 1, n->sl->end, x);
            const int ps = prof_scope(PROF_RESIDUAL);
            m->dev.ops->add(m->dev.ctx, n->y, x, inner, e->batch * n->out_numel);
            prof_scope_restore(ps);
        } else {
            const int ps = prof_scope(PROF_LAYER(n->sl->kind, false));
            n->ops->forward(n, e, x);
            prof_scope_restore(ps);
        }
        x = n->y;
    }
    return x;
}

const float *model_forward(struct model *m, const void *x, int64_t batch)
{
    ASSERT(batch >= 0 && batch <= m->max_batch);
    ASSERT(m->acts != NULL); /* an eval model (model_new_eval) needs model_plan first */
    m->x = x;
    m->batch = batch;
    m->last_training = m->training;
    struct layer_env e = env_of(m);
    const void *y = forward_range(m, &e, 0, m->n_layers, x);
    if (m->training)
        m->forwards++; /* the next forward's masks differ unless a position is set */
    return y;
}

static float *other_scratch(struct model *m, int depth, const float *cur)
{
    float *a = m->scratch + (int64_t)2 * depth * m->scratch_n;
    return cur == a ? a + m->scratch_n : a;
}

/* Backward of the layers of [begin, end) at `depth` given dy of their output; x is the
 * input of the range. Returns dx of that input, or NULL where nothing below needs it. */
static const float *backward_range(struct model *m, const struct layer_env *e, int begin, int end,
                                   const void *x, const float *dy, int depth)
{
    int idx[SPEC_MAX_LAYERS], k = 0; /* a v1 list may hold every layer */
    for (int i = begin; i < end && k < SPEC_MAX_LAYERS; i = next_layer(m, i))
        idx[k++] = i;
    const float *cur = dy;
    for (int j = k - 1; j >= 0; j--) {
        struct lnode *n = &m->nodes[idx[j]];
        if (n->index < m->first_param && n->sl->kind != LAYER_RESIDUAL)
            return NULL; /* no parameters at or below this layer */
        const void *in = j ? (const void *)m->nodes[idx[j - 1]].y : x;
        float *dx = m->first_param < n->index ? other_scratch(m, depth, cur) : NULL;
        if (n->sl->kind == LAYER_RESIDUAL) {
            const float *inner = backward_range(m, e, n->index + 1, n->sl->end, in, cur, depth + 1);
            const int ps = prof_scope(PROF_RESIDUAL);
            if (dx && inner)
                m->dev.ops->add(m->dev.ctx, dx, cur, inner, e->batch * n->in_numel);
            else if (dx)
                m->dev.ops->copy(m->dev.ctx, dx, cur, e->batch * n->in_numel);
            prof_scope_restore(ps);
        } else {
            const int ps = prof_scope(PROF_LAYER(n->sl->kind, true));
            n->ops->backward(n, e, in, cur, dx);
            prof_scope_restore(ps);
        }
        if (!dx)
            return NULL;
        cur = dx;
    }
    return cur;
}

/* Reverse walk. Each family computes its parameters' gradients first and reports them
 * (last registered first, the order PyTorch's hooks fire in), and only then dx, so DDP
 * can reduce them while the rest of backward runs. dy alternates between two scratch
 * buffers per residual depth; the caller's dy is never written. */
void model_backward(struct model *m, const float *dy, model_grad_ready_fn ready, void *ctx)
{
    ASSERT(m->grads != NULL && m->scratch != NULL); /* not an eval model */
    struct layer_env e = env_of(m);
    e.ready = ready;
    e.ready_ctx = ctx;
    backward_range(m, &e, 0, m->n_layers, m->x, dy, 0);
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
