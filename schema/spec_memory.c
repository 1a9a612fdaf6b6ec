/* spec_memory.c — what a parsed spec costs: its parameters (spec_param_count) and the memory one
 * rank needs (spec_memory_estimate), figure for figure as the worker allocates it, and the check
 * against a limit whose message blames the heaviest part (spec_memory_check). */
#include "spec_impl.h"

/* Saturating arithmetic for sizes: a size that would not fit in int64_t is INT64_MAX,
 * which no limit admits, instead of a wrapped small number. Arguments are >= 0. */
static int64_t sat_mul(int64_t a, int64_t b)
{
    int64_t r;
    return __builtin_mul_overflow(a, b, &r) ? INT64_MAX : r;
}

static int64_t sat_add(int64_t a, int64_t b)
{
    int64_t r;
    return __builtin_add_overflow(a, b, &r) ? INT64_MAX : r;
}

/* Parameters of one layer (weights and biases; batchnorm's running statistics are
 * buffers, not parameters). */
static int64_t layer_params(const struct spec *s, int i)
{
    const struct spec_layer *l = &s->layers[i];
    switch (l->kind) {
    case LAYER_LINEAR: /* a tied weight is the embedding's: counted there, once */
        return sat_add(spec_layer_tie(s, i) >= 0 ? 0 : sat_mul(l->in, l->out), l->bias ? l->out : 0);
    case LAYER_EMBEDDING:
    case LAYER_POSITION: return sat_mul(l->num, l->dim);
    case LAYER_LAYERNORM: return l->bias ? sat_mul(2, l->dim) : l->dim;
    case LAYER_ATTENTION: /* qkv [3·dim, dim] and proj [dim, dim], and their biases */
        return sat_add(sat_mul(4, sat_mul(l->dim, l->dim)), l->bias ? sat_mul(4, l->dim) : 0);
    case LAYER_CONV2D:
        return sat_add(sat_mul(sat_mul(l->out, l->in), sat_mul(l->kernel[0], l->kernel[1])),
                       l->bias ? l->out : 0);
    case LAYER_BATCHNORM: return sat_mul(2, l->dim);
    default: return 0;
    }
}

int64_t spec_param_count(const struct spec *s)
{
    int64_t n = 0;
    for (int i = 0; i < s->n_layers; i++)
        n = sat_add(n, layer_params(s, i));
    return n;
}

/* Elements of a layer's input or output for one sample; a list built in code without
 * spec_flat_layers has widths only. */
static int64_t layer_in_numel(const struct spec_layer *l)
{
    return l->in_rank ? shape_numel(l->in_rank, l->in_shape) : l->in;
}

static int64_t layer_out_numel(const struct spec_layer *l)
{
    return l->out_rank ? shape_numel(l->out_rank, l->out_shape) : l->out;
}

/* Attention's B (rows of [T, dim] sequences), T, dim and heads for `rows` samples. */
static void attention_dims(const struct spec_layer *l, int64_t rows, int64_t *b, int64_t *t, int64_t *h)
{
    *t = l->in_rank >= 2 ? l->in_shape[l->in_rank - 2] : 1;
    *h = l->heads > 0 ? l->heads : 1;
    const int64_t td = sat_mul(*t, l->dim);
    *b = sat_mul(rows, td > 0 ? layer_in_numel(l) / td : 0);
}

/* What a layer keeps from forward for backward, in floats, for `rows` samples: the
 * worker's layer_ops.saved (worker/layers/), figure for figure. Attention: q, k, v and
 * the merged heads, and the probabilities; layernorm: mean and rstd per position;
 * batchnorm: the batch's mean and invstd; dropout: its mask; max pooling: the argmax. */
static int64_t layer_saved(const struct spec_layer *l, int64_t rows)
{
    switch (l->kind) {
    case LAYER_ATTENTION: {
        int64_t b, t, h;
        attention_dims(l, rows, &b, &t, &h);
        return sat_add(sat_mul(4, sat_mul(b, sat_mul(t, l->dim))), sat_mul(b, sat_mul(h, sat_mul(t, t))));
    }
    case LAYER_LAYERNORM: return l->dim > 0 ? sat_mul(2, sat_mul(rows, layer_in_numel(l) / l->dim)) : 0;
    case LAYER_BATCHNORM: return sat_mul(2, l->dim);
    case LAYER_DROPOUT: return l->p > 0.0 ? sat_mul(rows, layer_in_numel(l)) : 0;
    case LAYER_MAXPOOL2D: return sat_mul(rows, layer_out_numel(l));
    default: return 0;
    }
}

/* A layer's scratch for one forward or backward, in floats, for `rows` samples (the
 * worker's layer_ops.work; the model allocates the largest one, shared): attention's
 * qkv, scores and backward's eight [B,T,dim] and two [B,H,T,T] tensors; layernorm's and
 * batchnorm's dx when no layer below needs the gradient; conv2d's im2col buffer and the
 * row of ones for its bias. */
static int64_t layer_work(const struct spec_layer *l, int64_t rows)
{
    switch (l->kind) {
    case LAYER_ATTENTION: {
        int64_t b, t, h;
        attention_dims(l, rows, &b, &t, &h);
        return sat_add(sat_mul(8, sat_mul(b, sat_mul(t, l->dim))),
                       sat_mul(2, sat_mul(b, sat_mul(h, sat_mul(t, t)))));
    }
    case LAYER_LAYERNORM:
    case LAYER_BATCHNORM: return sat_mul(rows, layer_in_numel(l));
    case LAYER_CONV2D: {
        const int64_t k = sat_mul(l->in_shape[0], sat_mul(l->kernel[0], l->kernel[1]));
        const int64_t n = sat_mul(l->out_shape[1], l->out_shape[2]);
        return sat_add(sat_mul(rows, sat_mul(k, n)), n);
    }
    default: return 0;
    }
}

/* The model's tensors for micro-batches of `rows` rows, in floats, as model_new_err
 * (worker/model.c) allocates them: every layer's output, what the layers save for
 * backward, the largest layer scratch, and backward's dy ping-pong (two buffers of the
 * widest layer per residual depth). */
static int64_t model_floats(const struct spec *s, int64_t rows)
{
    int64_t outs = 0, saved = 0, work = 0, widest = 1, depths = 1;
    int depth[SPEC_MAX_LAYERS];
    for (int i = 0; i < s->n_layers && i < SPEC_MAX_LAYERS; i++) {
        const struct spec_layer *l = &s->layers[i];
        const int64_t li = layer_in_numel(l), lo = layer_out_numel(l);
        depth[i] = l->parent >= 0 && l->parent < i ? depth[l->parent] + 1 : 0;
        depths = depth[i] + 1 > depths ? depth[i] + 1 : depths;
        outs = sat_add(outs, sat_mul(rows, lo));
        saved = sat_add(saved, layer_saved(l, rows));
        const int64_t w = layer_work(l, rows);
        work = w > work ? w : work;
        widest = li > widest ? li : widest;
        widest = lo > widest ? lo : widest;
    }
    return sat_add(sat_add(outs, saved), sat_add(work, sat_mul(sat_mul(2, depths), sat_mul(rows, widest))));
}

/* What one data set (the data, or eval.data as `d`) holds in a rank, in bytes: its
 * samples as 4-byte values (synthetic, CSV, an .npy file of at most SPEC_DATA_MAP_MIN
 * bytes of values; a tokens file and a larger .npy file are memory-mapped and read
 * window by window), the shard's order, the permutation when it shuffles, and the
 * synthetic teacher. `held`: the rows the rank keeps; `shard`: its shard's rows; `rows`:
 * the whole set's. */
static int64_t data_bytes(const struct spec *s, const struct spec_data *d, int64_t rows, int64_t shard,
                          int64_t held, int64_t width)
{
    const int64_t F = (int64_t)sizeof(float);
    const int64_t xs = sat_mul(sat_mul(held, F), spec_sample_numel(s));
    const int64_t ys = sat_mul(sat_mul(held, F), spec_target_numel(s));
    int64_t b = 0;
    if (d->kind == DATA_SYNTHETIC || d->kind == DATA_CSV)
        b = sat_add(xs, ys);
    else if (d->kind == DATA_NPY)
        b = sat_add(xs > SPEC_DATA_MAP_MIN ? 0 : xs, ys > SPEC_DATA_MAP_MIN ? 0 : ys);
    b = sat_add(b, sat_mul(shard, 8));                 /* the shard's order */
    b = sat_add(b, d->shuffle ? sat_mul(rows, 8) : 0); /* the permutation */
    if (d->kind == DATA_SYNTHETIC) {
        int64_t teacher = 0; /* the teacher keeps its weights in double */
        for (int i = 0; i < s->n_layers; i++) {
            const struct spec_layer *l = &s->layers[i];
            if (l->kind == LAYER_LINEAR)
                teacher = sat_add(teacher, sat_mul(8, sat_add(sat_mul(l->in, l->out), l->out)));
        }
        b = sat_add(b, sat_add(teacher, sat_mul(2 * 64 * 8, width)));
    }
    return b;
}

void spec_memory_estimate(const struct spec *s, const struct spec_memory_in *mi, struct spec_memory *m)
{
    const int64_t F = (int64_t)sizeof(float), P = spec_param_count(s);
    const int64_t in = spec_sample_numel(s);
    const struct spec_layer *ol = spec_output_layer(s);
    const int64_t out = ol && ol->out_rank ? shape_numel(ol->out_rank, ol->out_shape) : spec_out_width(s);
    const int64_t target = spec_target_numel(s);
    const bool cuda = s->device == DEVICE_CUDA;
    const int per = s->optim.kind == OPTIM_ADAMW ? 2 : s->optim.momentum != 0.0 ? 1 : 0;
    const int world = s->world_size > 0 ? s->world_size : 1;
    const bool eval = s->eval.every_steps > 0;
    const int64_t rows = mi->rows > 0 ? mi->rows : 0;
    const int64_t erows = eval && mi->eval_rows > 0 ? mi->eval_rows : 0;
    memset(m, 0, sizeof *m);

    /* The largest shard (rank 0's) and the rows a rank keeps: the whole set when it
     * shuffles it or reads a shared file; synthetic data without shuffling generates
     * only its own shard. eval.data is never shuffled. */
    const int64_t shard = mi->rank_file ? rows : spec_shard_rows(rows, 0, world);
    const int64_t held = mi->rank_file || (s->data.kind == DATA_SYNTHETIC && !s->data.shuffle) ? shard : rows;
    const int64_t eshard = mi->eval_rank_file ? erows : spec_shard_rows(erows, 0, world);
    const int64_t eheld = mi->eval_rank_file || s->eval.data.kind == DATA_SYNTHETIC ? eshard : erows;
    /* One set of batch buffers and one model serve both, sized by the larger batch. */
    int64_t R = spec_batch_rows(s, shard);
    if (eval && spec_batch_rows(s, eshard) > R)
        R = spec_batch_rows(s, eshard);
    int64_t width = 1, bn = 0;
    for (int i = 0; i < s->n_layers; i++) {
        const struct spec_layer *l = &s->layers[i];
        const int64_t li = layer_in_numel(l), lo = layer_out_numel(l);
        width = li > width ? li : width;
        width = lo > width ? lo : width;
        if (l->kind == LAYER_BATCHNORM) /* running mean and var, num_batches_tracked */
            bn = sat_add(bn, sat_add(sat_mul(2 * F, l->dim), 8));
    }
    m->rows = R;
    m->params = sat_mul(P, F);
    m->grads = m->params;
    m->optim = sat_mul(m->params, per);
    if (world > 1) {
        /* The buckets hold every gradient once more; the zero bucket is the largest one. */
        int64_t cap = (int64_t)(s->ddp.bucket_cap_mb * 1024 * 1024);
        cap = cap > (1 << 20) ? cap : (1 << 20);
        m->buckets = sat_add(m->params, m->params < cap ? m->params : cap);
    }
    m->activations = sat_add(sat_mul(F, model_floats(s, R)), bn);
    /* A step's micro-batches (their losses): at most grad_accum, at most the batches. */
    const int64_t nb = spec_batches(shard, s->batch_size, s->data.drop_last);
    const int64_t k = s->grad_accum < nb ? s->grad_accum : nb > 0 ? nb : 1;
    /* Host: x, y, the labels, the step's losses twice (read and on_nonfinite's copy),
     * eval's logits. Device: x, y, the labels, the loss gradient, the step's losses,
     * eval's loss. */
    const int64_t per_row = sat_add(in, sat_mul(2, target));
    const int64_t batch_host =
        sat_mul(F, sat_add(sat_add(sat_mul(R, per_row), sat_mul(2, k)), eval ? sat_mul(R, out) : 0));
    const int64_t batch_dev =
        sat_mul(F, sat_add(sat_add(sat_mul(R, sat_add(per_row, out)), k), eval ? 1 : 0));
    m->batch = sat_add(batch_host, batch_dev);
    m->data = data_bytes(s, &s->data, rows, shard, held, width);
    m->data = sat_add(m->data, mi->file_bytes > 0 ? mi->file_bytes : 0);
    if (eval)
        m->eval = data_bytes(s, &s->eval.data, erows, eshard, eheld, width);
    m->staging = sat_mul(m->params, 1 + per);

    const int64_t on_dev = sat_add(sat_add(sat_add(m->params, m->grads), sat_add(m->optim, m->buckets)),
                                   sat_add(m->activations, batch_dev));
    m->total = sat_add(sat_add(on_dev, batch_host), sat_add(sat_add(m->data, m->eval), m->staging));
    m->device = cuda ? on_dev : 0;
    m->host = cuda ? sat_add(batch_host, sat_add(sat_add(m->data, m->eval), m->staging)) : m->total;
}

/* "12.3 MiB", "4.0 TiB": sizes for messages. */
static void fmt_bytes(char *dst, size_t cap, int64_t b)
{
    static const char *const units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    double x = (double)b;
    int u = 0;
    while (x >= 1024 && u < 6) {
        x /= 1024;
        u++;
    }
    if (u == 0)
        snprintf(dst, cap, "%lld bytes", (long long)b);
    else
        snprintf(dst, cap, "%.1f %s", x, units[u]);
}

ddpd_err spec_memory_check(const struct spec *s, const struct spec_memory *m, int64_t limit,
                           const char *limit_name, ddpd_err code, struct ddpd_error *err)
{
    if (limit <= 0 || m->host <= limit)
        return DDPD_OK;
    /* Blame the part of the host's share that weighs most. On cuda the model and the
     * activations live on the GPU and only their host copies count here. */
    const bool cuda = s->device == DEVICE_CUDA;
    const int64_t model =
        cuda ? m->staging
             : sat_add(sat_add(sat_add(m->params, m->grads), sat_add(m->optim, m->buckets)), m->staging);
    const int64_t batch = cuda ? m->host - model - m->data - m->eval : sat_add(m->activations, m->batch);
    const char *path = model >= batch && model >= m->data && model >= m->eval ? "model"
                       : batch >= m->data && batch >= m->eval                 ? "batch_size"
                       : m->data >= m->eval ? (s->data.kind == DATA_SYNTHETIC ? "data.samples" : "data")
                       : s->eval.data.kind == DATA_SYNTHETIC ? "eval.data.samples"
                                                             : "eval.data";
    char need[32], lim[32], pa[32], gr[32], op[32], bu[32], ac[32], ba[32], da[32], ev[32], st[32];
    fmt_bytes(need, sizeof need, m->host);
    fmt_bytes(lim, sizeof lim, limit);
    fmt_bytes(pa, sizeof pa, m->params);
    fmt_bytes(gr, sizeof gr, m->grads);
    fmt_bytes(op, sizeof op, m->optim);
    fmt_bytes(bu, sizeof bu, m->buckets);
    fmt_bytes(ac, sizeof ac, m->activations);
    fmt_bytes(ba, sizeof ba, m->batch);
    fmt_bytes(da, sizeof da, m->data);
    fmt_bytes(ev, sizeof ev, m->eval);
    fmt_bytes(st, sizeof st, m->staging);
    return ddpd_error_set(
        err, code, path,
        "the job needs about %s of %smemory per rank (parameters %s, gradients %s, "
        "optimizer state %s, DDP buckets %s, activations %s and batch %s for micro-batches "
        "of %lld rows, data %s%s%s, checkpoint copies %s), more than the limit of %s per rank "
        "(%s)",
        need, cuda ? "host " : "", pa, gr, op, bu, ac, ba, (long long)m->rows, da,
        s->eval.every_steps > 0 ? ", eval data " : "", s->eval.every_steps > 0 ? ev : "", st, lim,
        limit_name);
}
