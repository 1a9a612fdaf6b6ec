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

/* The activations of a forward of `rows` rows, laid out in one slab (work_floats). */
struct work {
    int64_t rows;
    float *slab;
    float *pair[2 * SPEC_MAX_LAYERS]; /* two buffers per residual depth, [rows, its widest] */
    float *q;                         /* [rows, widest attention dim]: queries, then heads' outputs */
    float *scores;                    /* [heads, rows, T] */
    float *mean, *rstd;               /* [rows]: layernorm's statistics (written, not needed) */
    int32_t *ids;                     /* [rows] on the device */
};

struct kv {
    struct model *m;
    struct dev dev;
    int n_layers;
    int64_t T, vocab;
    bool causal; /* every attention causal: the cache can be reused token after token */
    int tail;    /* the first top-level layer after the last attention: rows independent */
    float *k[SPEC_MAX_LAYERS], *v[SPEC_MAX_LAYERS]; /* per attention layer, [T, dim] */
    float *cache;                                   /* all of them */
    int64_t cache_floats;
    int depths;
    int64_t pair_floats[SPEC_MAX_LAYERS]; /* the widest row of each depth */
    int64_t att_dim, att_heads;
    /* A token's step needs one row of activations, kept with the cache; a window's forward
     * needs T rows, allocated by the request that needs them and given back by kv_release,
     * so that a loaded model holds its parameters, its cache and little more. */
    struct work one, window;
    struct work *w; /* the one the current forward uses */
    float *logits;  /* [vocab], host */
    int64_t len;    /* positions in the cache */
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

/* Floats of a workspace of `rows` rows. */
static int64_t work_floats(const struct kv *g, int64_t rows)
{
    int64_t n = 0;
    for (int d = 0; d < g->depths; d++)
        n += 2 * rows * g->pair_floats[d];
    return n + rows * g->att_dim + g->att_heads * rows * g->T + 3 * rows; /* ids: 4 bytes each */
}

/* Allocates the workspace w of `rows` rows and lays it out. */
static bool work_alloc(struct kv *g, struct work *w, int64_t rows)
{
    if (w->slab)
        return true;
    float *p = g->dev.ops->alloc(g->dev.ctx, (size_t)work_floats(g, rows) * sizeof(float));
    if (!p)
        return false;
    w->rows = rows;
    w->slab = p;
    for (int d = 0; d < g->depths; d++) {
        w->pair[2 * d] = p, p += rows * g->pair_floats[d];
        w->pair[2 * d + 1] = p, p += rows * g->pair_floats[d];
    }
    w->q = p, p += rows * g->att_dim;
    w->scores = p, p += g->att_heads * rows * g->T;
    w->mean = p, p += rows;
    w->rstd = p, p += rows;
    w->ids = (int32_t *)(void *)p;
    return true;
}

static void work_free(struct kv *g, struct work *w)
{
    if (w->slab)
        g->dev.ops->free(g->dev.ctx, w->slab);
    w->slab = NULL;
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
    g->att_dim = g->att_heads = 1;
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
        g->att_dim = l->dim > g->att_dim ? l->dim : g->att_dim;
        g->att_heads = l->heads > g->att_heads ? l->heads : g->att_heads;
        g->cache_floats += 2 * g->T * l->dim;
        last_attention = i;
    }
    /* From the top-level layer after the one holding the last attention on, each row is
     * computed from its own row alone: only the last one is needed. */
    int top = last_attention;
    while (top >= 0 && layer(g, top)->parent >= 0)
        top = layer(g, top)->parent;
    g->tail = top >= 0 ? next_layer(g, top) : 0;

    /* Sizes come from a validated spec (T, widths and heads are capped), so these products
     * are far from overflowing. */
    g->cache =
        g->dev.ops->alloc(g->dev.ctx, (size_t)(g->cache_floats > 0 ? g->cache_floats : 1) * sizeof(float));
    g->logits = malloc((size_t)g->vocab * sizeof(float));
    if (!g->cache || !g->logits || !work_alloc(g, &g->one, 1)) {
        ddpd_error_set(err, DDPD_EDEVICE, "model", "out of memory: cannot allocate the KV cache (%.1f MiB)",
                       (double)g->cache_floats * sizeof(float) / (1 << 20));
        kv_free(g);
        return NULL;
    }
    float *p = g->cache;
    for (int i = 0; i < g->n_layers; i++) {
        const struct spec_layer *l = layer(g, i);
        if (l->kind == LAYER_ATTENTION) {
            g->k[i] = p, p += g->T * l->dim;
            g->v[i] = p, p += g->T * l->dim;
        }
    }
    return g;
}

void kv_free(struct kv *g)
{
    if (!g)
        return;
    work_free(g, &g->one);
    work_free(g, &g->window);
    if (g->cache)
        g->dev.ops->free(g->dev.ctx, g->cache);
    free(g->logits);
    free(g);
}

void kv_release(struct kv *g)
{
    work_free(g, &g->window);
}

int64_t kv_cache_bytes(const struct kv *g)
{
    return g->cache_floats * (int64_t)sizeof(float);
}

int64_t kv_work_bytes(const struct kv *g)
{
    return (work_floats(g, 1) + work_floats(g, g->T) + g->vocab) * (int64_t)sizeof(float);
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
    const struct work *w = g->w;
    const float *a = w->pair[2 * d], *f = x;
    return f >= a && f < a + w->rows * g->pair_floats[d] ? w->pair[2 * d + 1] : w->pair[2 * d];
}

/* y[n, out] = x[n, in] W^T + b (W [out, in], b may be NULL): nn.Linear on the rows, one
 * row by gemv where the backend has it (a token's step: BLAS's gemm would pack W first). */
static void linear(const struct kv *g, float *y, const float *x, const float *w, const float *b, int64_t n,
                   int64_t in, int64_t out)
{
    const struct dev_ops *ops = g->dev.ops;
    if (n == 1 && ops->gemv) {
        if (b)
            ops->copy(g->dev.ctx, y, b, out);
        ops->gemv(g->dev.ctx, false, out, in, 1.0f, w, in, x, b ? 1.0f : 0.0f, y);
        return;
    }
    const struct param pw = {.data = (float *)w}, pb = {.data = (float *)b};
    linear_forward_rows(g->dev, y, x, &pw, b ? &pb : NULL, n, in, out);
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
    const float *qw = p[0].data, *qb = bias ? p[1].data : NULL, *pw = p[bias ? 2 : 1].data,
                *pb = bias ? p[3].data : NULL;
    const int64_t d = l->dim, h = l->heads > 0 ? l->heads : 1, hd = d / h, L = off + n;
    const float scale = (float)(1.0 / sqrt((double)hd));
    ASSERT(off == 0 || n == 1);
    /* qkv's weight [3d, d] holds q's rows, then k's, then v's (as its output's columns). */
    for (int part = 0; part < 3; part++) {
        float *dst = part == 0 ? g->w->q : (part == 1 ? g->k[i] : g->v[i]) + off * d;
        linear(g, dst, x, qw + part * d * d, qb ? qb + part * d : NULL, n, d, d);
    }
    if (n == 1 && ops->gemv) {
        /* One query: per head, scores[L] = K_h q_h, then y_h[hd] = V_h^T P_h. */
        for (int64_t j = 0; j < h; j++)
            ops->gemv(c, false, L, hd, 1.0f, g->k[i] + j * hd, d, g->w->q + j * hd, 0.0f,
                      g->w->scores + j * L);
        ops->softmax_forward(c, g->w->scores, g->w->scores, h, L, scale, false);
        for (int64_t j = 0; j < h; j++)
            ops->gemv(c, true, L, hd, 1.0f, g->v[i] + j * hd, d, g->w->scores + j * L, 0.0f,
                      g->w->q + j * hd);
    } else {
        /* scores[h, n, L] = q_h k_h^T: head j's rows are hd columns at j*hd, rows d apart. */
        ops->gemm_batched(c, false, true, n, L, hd, 1.0f, g->w->q, d, hd, g->k[i], d, hd, 0.0f, g->w->scores,
                          L, n * L, h);
        ops->softmax_forward(c, g->w->scores, g->w->scores, h * n, L, scale, l->causal && n > 1);
        /* y_h[n, hd] = P_h v_h, into [n, h, hd] (q's buffer: q is no longer needed). */
        ops->gemm_batched(c, false, false, n, hd, L, 1.0f, g->w->scores, L, n * L, g->v[i], d, hd, 0.0f,
                          g->w->q, d, hd, h);
    }
    linear(g, y, g->w->q, pw, pb, n, d, d);
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
            ops->layernorm_forward(c, y, g->w->mean, g->w->rstd, x, p[0].data, np > 1 ? p[1].data : NULL, n,
                                   l->dim, (float)l->eps);
            break;
        case LAYER_LINEAR: {
            const struct param *tw = model_layer_tied(g->m, i); /* the embedding's table, or its own */
            const int own = tw ? 0 : 1;
            linear(g, y, x, tw ? tw->data : p[0].data, np > own ? p[own].data : NULL, n, l->in, l->out);
            break;
        }
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
    g->dev.ops->to_device(g->dev.ctx, g->w->ids, ids, (size_t)n * sizeof(int32_t));
    const float *y = run(g, 0, g->n_layers, g->w->ids, n, off, 0);
    g->len = off + n;
    /* Past the tail one row is left; when the last top-level layer holds an attention
     * there is no tail and every row came out. */
    if (g->tail >= g->n_layers)
        y += (n - 1) * g->vocab;
    g->dev.ops->to_host(g->dev.ctx, g->logits, y, (size_t)g->vocab * sizeof(float));
    return g->logits;
}

const float *kv_window(struct kv *g, const int32_t *ids, int64_t n, struct ddpd_error *err)
{
    ASSERT(n >= 1 && n <= g->T);
    if (n > 1 && !work_alloc(g, &g->window, g->T)) {
        ddpd_error_set(err, DDPD_EDEVICE, "model",
                       "out of memory: cannot allocate the activations of a window of %" PRId64
                       " tokens (%.1f MiB)",
                       g->T, (double)work_floats(g, g->T) * sizeof(float) / (1 << 20));
        return NULL;
    }
    g->w = n > 1 ? &g->window : &g->one;
    return forward(g, ids, n, 0);
}

const float *kv_step(struct kv *g, int32_t id)
{
    ASSERT(kv_can_step(g));
    g->w = &g->one;
    return forward(g, &id, 1, g->len);
}
