/* infer/cache.c — generation's incremental forward: a KV cache per attention layer sized
 * to the window (K and V [block_size, dim], every head's hd columns side by side, the
 * layout qkv's output has), and a walk of the spec's layer tree over the rows of one
 * sequence at positions [off, off + n): the prompt's window fills the cache in one
 * forward (n rows, causal), each new token then costs one row (its position's embedding,
 * layernorm, linears, one query against the cached keys, unmasked). Every step goes
 * through the model's device table, so the CPU, the CUDA module and the emulated GPU all
 * run it. Knows the model only through model.h's tree walk; nothing of the protocol. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../base/check.h"
#include "../layers/layers.h"
#include "infer_impl.h"

struct kv {
    struct model *m;
    struct dev dev;
    int n_layers;
    int64_t T, vocab;
    bool causal; /* every attention causal: the cache can be reused token after token */
    int tail;    /* the first top-level layer after the last attention: rows independent */
    float *k[SPEC_MAX_LAYERS], *v[SPEC_MAX_LAYERS]; /* per attention layer, [T, dim] */
    int64_t cache_floats, work_floats;
    /* the workspace: two activation buffers per residual depth, [T, that depth's widest] */
    int depths;
    float *pair[2 * SPEC_MAX_LAYERS];
    int64_t pair_floats[SPEC_MAX_LAYERS];
    float *q;           /* [T, widest attention dim]: the queries, then the heads' outputs */
    float *scores;      /* [heads, T, T] */
    float *mean, *rstd; /* [T]: layernorm's statistics (written, not needed) */
    int32_t *ids;       /* [T] on the device */
    float *slab;        /* all of the above */
    float *logits;      /* [vocab], host */
    int64_t len;        /* positions in the cache */
};

static const struct spec_layer *layer(const struct kv *g, int i)
{
    return model_layer(g->m, i);
}

static int next_layer(const struct kv *g, int i)
{
    const int end = layer(g, i)->end;
    return end > i ? end : i + 1;
}

/* The width of one row entering or leaving a layer: the last dimension of its shape. */
static int64_t row_width(int rank, const int64_t *shape)
{
    return rank > 0 ? shape[rank - 1] : 1;
}

const char *kv_why_not(const struct spec *s, char *why, size_t cap)
{
    const struct spec_layer *o = spec_output_layer(s);
    if (!spec_input_ids(s) || s->input_rank != 1) {
        snprintf(why, cap,
                 "generate needs a model that starts with embedding and ends in logits over the "
                 "vocabulary; this model starts with %s",
                 s->n_layers > 0 ? layer_kind_name(s->layers[0].kind) : "nothing");
        return why;
    }
    const int64_t T = s->input_shape[0], num = s->layers[0].num;
    if (!o || s->loss != LOSS_CROSS_ENTROPY || o->out_rank != 2 || o->out_shape[0] != T ||
        o->out_shape[1] != num) {
        char shape[96];
        int k = snprintf(shape, sizeof shape, "[");
        for (int d = 0; o && d < o->out_rank && k > 0 && (size_t)k < sizeof shape; d++)
            k +=
                snprintf(shape + k, sizeof shape - (size_t)k, d ? ", %" PRId64 : "%" PRId64, o->out_shape[d]);
        if (k > 0 && (size_t)k < sizeof shape - 1)
            snprintf(shape + k, sizeof shape - (size_t)k, "]");
        snprintf(why, cap,
                 "generate needs a model that starts with embedding and ends in logits over the "
                 "vocabulary ([%" PRId64 ", %" PRId64
                 "] with cross_entropy); this model ends in %s %s with %s",
                 T, num, o ? layer_kind_name(o->kind) : "nothing", shape, loss_kind_name(s->loss));
        return why;
    }
    for (int i = 0; i < s->n_layers; i++) {
        const struct spec_layer *l = &s->layers[i];
        switch (l->kind) {
        case LAYER_EMBEDDING:
            if (i == 0)
                continue;
            break;
        case LAYER_POSITION:
        case LAYER_LAYERNORM:
        case LAYER_LINEAR:
        case LAYER_RELU:
        case LAYER_TANH:
        case LAYER_SIGMOID:
        case LAYER_GELU:
        case LAYER_GELU_TANH:
        case LAYER_DROPOUT:
        case LAYER_RESIDUAL:
        case LAYER_ATTENTION:
            if (l->in_rank == 2 && l->in_shape[0] == T && l->out_rank == 2 && l->out_shape[0] == T)
                continue;
            snprintf(why, cap,
                     "generate runs a model position by position: layer %s (%s) does not act on [%" PRId64
                     ", width] rows",
                     l->key, layer_kind_name(l->kind), T);
            return why;
        default: break;
        }
        snprintf(why, cap,
                 "generate cannot run layer %s (%s): the incremental forward runs embedding (first), "
                 "position, layernorm, linear, activations, dropout, residual and attention",
                 l->key, layer_kind_name(l->kind));
        return why;
    }
    return NULL;
}

/* ---- building ---- */

static int depth_of(const struct kv *g, int i)
{
    int d = 0;
    for (int p = layer(g, i)->parent; p >= 0; p = layer(g, p)->parent)
        d++;
    return d;
}

struct kv *kv_new(struct model *m, const struct spec *s, struct ddpd_error *err)
{
    struct kv *g = calloc(1, sizeof *g);
    if (!g) {
        ddpd_error_set(err, DDPD_EDEVICE, "model", "out of memory: cannot allocate the KV cache");
        return NULL;
    }
    g->m = m;
    g->dev = model_dev(m);
    g->n_layers = model_layer_count(m);
    g->T = s->input_shape[0];
    g->vocab = s->layers[0].num;
    g->causal = true;
    int64_t att_dim = 1, att_heads = 1;
    int last_attention = -1;
    for (int i = 0; i < g->n_layers; i++) {
        const struct spec_layer *l = layer(g, i);
        const int d = depth_of(g, i);
        g->depths = d + 1 > g->depths ? d + 1 : g->depths;
        int64_t w = row_width(l->out_rank, l->out_shape);
        g->pair_floats[d] = w > g->pair_floats[d] ? w : g->pair_floats[d];
        if (l->kind != LAYER_ATTENTION)
            continue;
        g->causal &= l->causal;
        att_dim = l->dim > att_dim ? l->dim : att_dim;
        att_heads = l->heads > att_heads ? l->heads : att_heads;
        g->cache_floats += 2 * g->T * l->dim;
        last_attention = i;
    }
    /* From the top-level layer after the one holding the last attention on, each row is
     * computed from its own row alone: only the last one is needed. */
    int top = last_attention;
    while (top >= 0 && layer(g, top)->parent >= 0)
        top = layer(g, top)->parent;
    g->tail = top >= 0 ? next_layer(g, top) : 0;

    /* One slab: the caches, the activation pairs, q, scores, the layernorm statistics and
     * the ids. Sizes come from a validated spec (T, widths and heads are capped), so these
     * products are far from overflowing. */
    int64_t total = g->cache_floats;
    for (int d = 0; d < g->depths; d++)
        total += 2 * g->T * g->pair_floats[d];
    total += g->T * att_dim + att_heads * g->T * g->T + 2 * g->T + g->T; /* ids: 4 bytes each */
    g->work_floats = total - g->cache_floats;
    g->slab = g->dev.ops->alloc(g->dev.ctx, (size_t)total * sizeof(float));
    g->logits = malloc((size_t)g->vocab * sizeof(float));
    if (!g->slab || !g->logits) {
        ddpd_error_set(err, DDPD_EDEVICE, "model",
                       "out of memory: cannot allocate the KV cache and the generation workspace (%.1f MiB)",
                       (double)total * sizeof(float) / (1 << 20));
        kv_free(g);
        return NULL;
    }
    float *p = g->slab;
    for (int i = 0; i < g->n_layers; i++) {
        const struct spec_layer *l = layer(g, i);
        if (l->kind == LAYER_ATTENTION) {
            g->k[i] = p, p += g->T * l->dim;
            g->v[i] = p, p += g->T * l->dim;
        }
    }
    for (int d = 0; d < g->depths; d++) {
        g->pair[2 * d] = p, p += g->T * g->pair_floats[d];
        g->pair[2 * d + 1] = p, p += g->T * g->pair_floats[d];
    }
    g->q = p, p += g->T * att_dim;
    g->scores = p, p += att_heads * g->T * g->T;
    g->mean = p, p += g->T;
    g->rstd = p, p += g->T;
    g->ids = (int32_t *)(void *)p;
    return g;
}

void kv_free(struct kv *g)
{
    if (!g)
        return;
    if (g->slab)
        g->dev.ops->free(g->dev.ctx, g->slab);
    free(g->logits);
    free(g);
}

int64_t kv_cache_bytes(const struct kv *g)
{
    return g->cache_floats * (int64_t)sizeof(float);
}

int64_t kv_work_bytes(const struct kv *g)
{
    return g->work_floats * (int64_t)sizeof(float) + g->vocab * (int64_t)sizeof(float);
}

int64_t kv_block(const struct kv *g)
{
    return g->T;
}

int64_t kv_vocab(const struct kv *g)
{
    return g->vocab;
}

int64_t kv_len(const struct kv *g)
{
    return g->len;
}

bool kv_can_step(const struct kv *g)
{
    return g->causal && g->len > 0 && g->len < g->T;
}

/* ---- the forward ---- */

/* The buffer of depth d's pair that does not hold x (x may point inside one of them). */
static float *other(const struct kv *g, int d, const void *x)
{
    const float *a = g->pair[2 * d], *f = x;
    return f >= a && f < a + g->T * g->pair_floats[d] ? g->pair[2 * d + 1] : g->pair[2 * d];
}

/* Attention of rows x[n, dim] at positions [off, off + n) (off 0, or n 1): q, k and v by
 * qkv's three row blocks (k and v straight into the cache at their positions), scores of
 * every head against the L = off + n cached keys (causal for a window, unmasked for the
 * one new query, which sees them all), P v into the merged heads' layout, proj. */
static void attend(struct kv *g, int i, float *y, const float *x, int64_t n, int64_t off)
{
    const struct dev_ops *ops = g->dev.ops;
    void *c = g->dev.ctx;
    const struct spec_layer *l = layer(g, i);
    struct param *p;
    model_layer_params(g->m, i, &p);
    const bool bias = l->bias;
    const struct param *qw = &p[0], *qb = bias ? &p[1] : NULL, *pw = &p[bias ? 2 : 1],
                       *pb = bias ? &p[3] : NULL;
    const int64_t d = l->dim, h = l->heads > 0 ? l->heads : 1, hd = d / h, L = off + n;
    ASSERT(off == 0 || n == 1);
    /* qkv's weight [3d, d] holds q's rows, then k's, then v's (as its output's columns). */
    for (int part = 0; part < 3; part++) {
        struct param w = *qw, b;
        w.data = qw->data + part * d * d;
        if (qb) {
            b = *qb;
            b.data = qb->data + part * d;
        }
        float *dst = part == 0 ? g->q : (part == 1 ? g->k[i] : g->v[i]) + off * d;
        linear_forward_rows(g->dev, dst, x, &w, qb ? &b : NULL, n, d, d);
    }
    /* scores[h, n, L] = q_h k_h^T: head j's rows are hd columns at j*hd, rows d apart. */
    ops->gemm_batched(c, false, true, n, L, hd, 1.0f, g->q, d, hd, g->k[i], d, hd, 0.0f, g->scores, L, n * L,
                      h);
    ops->softmax_forward(c, g->scores, g->scores, h * n, L, (float)(1.0 / sqrt((double)hd)),
                         l->causal && n > 1);
    /* y_h[n, hd] = P_h v_h, written into [n, h, hd] (q's buffer: q is no longer needed). */
    ops->gemm_batched(c, false, false, n, hd, L, 1.0f, g->scores, L, n * L, g->v[i], d, hd, 0.0f, g->q, d, hd,
                      h);
    linear_forward_rows(g->dev, y, g->q, pw, pb, n, d, d);
}

/* Runs the layers of [begin, end) (one level of the tree, depth `depth`) on the rows
 * x[n] at positions [off, off + n); returns the output (a buffer of the workspace). At
 * the top level, from g->tail on, only the last row goes on. */
static const float *run(struct kv *g, int begin, int end, const void *x, int64_t n, int64_t off, int depth)
{
    const struct dev_ops *ops = g->dev.ops;
    void *c = g->dev.ctx;
    for (int i = begin; i < end; i = next_layer(g, i)) {
        const struct spec_layer *l = layer(g, i);
        /* A row of ids (embedding's input) is one id; 4 bytes, as a float. */
        const int64_t win = l->kind == LAYER_EMBEDDING ? 1 : row_width(l->in_rank, l->in_shape),
                      wout = row_width(l->out_rank, l->out_shape);
        if (depth == 0 && i >= g->tail && n > 1) {
            x = (const char *)x + (n - 1) * win * 4;
            off += n - 1;
            n = 1;
        }
        struct param *p = NULL;
        const int np = model_layer_params(g->m, i, &p);
        float *y = other(g, depth, x);
        switch (l->kind) {
        case LAYER_EMBEDDING: ops->embedding_forward(c, y, p[0].data, x, n, l->dim); break;
        case LAYER_POSITION: ops->add(c, y, x, p[0].data + off * l->dim, n * l->dim); break;
        case LAYER_LAYERNORM:
            ops->layernorm_forward(c, y, g->mean, g->rstd, x, p[0].data, np > 1 ? p[1].data : NULL, n, l->dim,
                                   (float)l->eps);
            break;
        case LAYER_LINEAR:
            linear_forward_rows(g->dev, y, x, &p[0], np > 1 ? &p[1] : NULL, n, l->in, l->out);
            break;
        case LAYER_DROPOUT: continue; /* eval: the identity */
        case LAYER_ATTENTION: attend(g, i, y, x, n, off); break;
        case LAYER_RESIDUAL: {
            const float *inner = run(g, i + 1, l->end, x, n, off, depth + 1);
            ops->add(c, y, x, inner, n * wout);
            break;
        }
        default: /* the activations (kv_why_not let nothing else through) */
            ops->act_forward(c, l->kind, y, x, n * wout);
            break;
        }
        x = y;
    }
    return x;
}

/* The logits of the last row of the forward of ids[0..n) at positions [off, off + n). */
static const float *forward(struct kv *g, const int32_t *ids, int64_t n, int64_t off)
{
    g->dev.ops->to_device(g->dev.ctx, g->ids, ids, (size_t)n * sizeof(int32_t));
    const float *y = run(g, 0, g->n_layers, g->ids, n, off, 0);
    g->len = off + n;
    /* Past the tail one row is left; when the last top-level layer holds an attention
     * there is no tail and every row came out. */
    if (g->tail >= g->n_layers)
        y += (n - 1) * g->vocab;
    g->dev.ops->to_host(g->dev.ctx, g->logits, y, (size_t)g->vocab * sizeof(float));
    return g->logits;
}

const float *kv_window(struct kv *g, const int32_t *ids, int64_t n)
{
    ASSERT(n >= 1 && n <= g->T);
    return forward(g, ids, n, 0);
}

const float *kv_step(struct kv *g, int32_t id)
{
    ASSERT(kv_can_step(g));
    return forward(g, &id, 1, g->len);
}
