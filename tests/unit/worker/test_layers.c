/* test_layers.c — the layer-tree engine (model.c, worker/layers/): gradients of every v2
 * layer (layernorm, attention causal and not, embedding, position, gelu tanh, nested
 * residuals, linear on rank-3 tensors) against central finite differences on odd
 * shapes; parameter names and the ready-callback order; dropout's masks; the activation
 * plan allocating nothing per step; a backend without an op failing at model_new. */
#include <stdint.h>

#include "check.h"
#include "worker/dev.h"
#include "worker/model.h"
#include "worker/rng.h"

static struct dev D;

/* ---- building a spec tree in code (what the validator fills from JSON) ---- */

static int add_layer(struct spec *s, int parent, layer_kind k)
{
    int i = s->n_layers++, child = 0;
    for (int j = 0; j < i; j++)
        child += s->layers[j].parent == parent;
    struct spec_layer *l = &s->layers[i];
    memset(l, 0, sizeof *l);
    l->kind = k;
    l->parent = parent;
    l->end = i + 1;
    l->tie = -1;
    l->bias = true;
    l->causal = true;
    l->eps = 1e-5;
    if (parent < 0)
        snprintf(l->key, sizeof l->key, "%d", child);
    else {
        char pk[32];
        snprintf(pk, sizeof pk, "%.24s", s->layers[parent].key);
        snprintf(l->key, sizeof l->key, "%s.%d", pk, child & 0xff);
    }
    return i;
}

static int add_linear(struct spec *s, int parent, int64_t in, int64_t out)
{
    int i = add_layer(s, parent, LAYER_LINEAR);
    s->layers[i].in = in;
    s->layers[i].out = out;
    return i;
}

static int add_dim(struct spec *s, int parent, layer_kind k, int64_t dim)
{
    int i = add_layer(s, parent, k);
    s->layers[i].dim = dim;
    return i;
}

static void end_residual(struct spec *s, int i)
{
    s->layers[i].end = s->n_layers;
}

/* Fills in/out shapes of [begin, end) from `shape` (rank r); returns the output rank. */
static int infer(struct spec *s, int begin, int end, int r, int64_t *shape)
{
    for (int i = begin; i < end; i = s->layers[i].end) {
        struct spec_layer *l = &s->layers[i];
        l->in_rank = r;
        memcpy(l->in_shape, shape, sizeof l->in_shape);
        if (l->kind == LAYER_RESIDUAL) {
            int64_t inner[SPEC_MAX_RANK];
            memcpy(inner, shape, sizeof inner);
            infer(s, i + 1, l->end, r, inner);
        } else if (l->kind == LAYER_EMBEDDING) {
            shape[r++] = l->dim;
        } else if (l->kind == LAYER_LINEAR) {
            shape[r - 1] = l->out;
        }
        if (l->kind != LAYER_LINEAR)
            l->in = l->out = shape[r - 1];
        l->out_rank = r;
        memcpy(l->out_shape, shape, sizeof l->out_shape);
    }
    return r;
}

static void finish(struct spec *s, int rank, const int64_t *input)
{
    int64_t shape[SPEC_MAX_RANK] = {0};
    memcpy(shape, input, (size_t)rank * sizeof *shape);
    s->input_rank = rank;
    memcpy(s->input_shape, input, (size_t)rank * sizeof *input);
    s->input_shape_set = true;
    infer(s, 0, s->n_layers, rank, shape);
}

static int64_t numel_of(int rank, const int64_t *shape)
{
    int64_t n = 1;
    for (int i = 0; i < rank; i++)
        n *= shape[i];
    return n;
}

/* ---- gradient checks ---- */

/* L = sum(out * R) in double, R fixed: dL/dout = R. */
static double loss_of(struct model *m, const void *x, int64_t B, const float *R, int64_t n)
{
    const float *y = model_forward(m, x, B);
    double l = 0;
    for (int64_t i = 0; i < n; i++)
        l += (double)y[i] * R[i];
    return l;
}

/* Every parameter's gradient (a sample of up to 40 entries each) against central
 * differences of step 1e-2 (float forward, double sum). */
static void grad_check(const char *what, const struct spec *s, int64_t B, uint64_t seed)
{
    struct model *m = model_new(D, s, B);
    CHECK(m != NULL);
    if (!m)
        return;
    struct rng r;
    rng_seed(&r, seed);
    const int64_t in = numel_of(s->input_rank, s->input_shape) * B;
    const struct spec_layer *last = &s->layers[0];
    for (int i = 0; i < s->n_layers; i = s->layers[i].end)
        last = &s->layers[i];
    const int64_t n = numel_of(last->out_rank, last->out_shape) * B;
    float *x = malloc((size_t)in * sizeof *x), *R = malloc((size_t)n * sizeof *R);
    int32_t *ids = (int32_t *)x;
    const bool use_ids = spec_input_ids(s);
    for (int64_t i = 0; i < in; i++) {
        if (use_ids)
            ids[i] = (int32_t)rng_below(&r, (uint64_t)s->layers[0].num);
        else
            x[i] = (float)(2 * rng_uniform(&r) - 1);
    }
    for (int64_t i = 0; i < n; i++)
        R[i] = (float)(2 * rng_uniform(&r) - 1);
    /* Non-trivial layernorm weights and biases. */
    for (int p = 0; p < model_param_count(m); p++) {
        struct param *pa = model_param(m, p);
        if (strstr(pa->name, "weight") && pa->ndim == 1)
            for (int64_t j = 0; j < pa->numel; j++)
                pa->data[j] = (float)(0.5 + rng_uniform(&r));
        else if (pa->ndim == 1)
            for (int64_t j = 0; j < pa->numel; j++)
                pa->data[j] = (float)(rng_uniform(&r) - 0.5);
    }
    model_zero_grad(m);
    model_forward(m, x, B);
    model_backward(m, R, NULL, NULL);
    int bad = 0;
    for (int p = 0; p < model_param_count(m); p++) {
        struct param *pa = model_param(m, p);
        const int64_t stride = pa->numel > 40 ? pa->numel / 40 : 1;
        for (int64_t j = 0; j < pa->numel; j += stride) {
            const float keep = pa->data[j], h = 1e-2f;
            pa->data[j] = keep + h;
            double lp = loss_of(m, x, B, R, n);
            pa->data[j] = keep - h;
            double lm = loss_of(m, x, B, R, n);
            pa->data[j] = keep;
            double num = (lp - lm) / (2.0 * (double)h), ana = pa->grad[j];
            if (!(fabs(num - ana) <= 5e-4 + 3e-3 * fabs(num)) && bad++ < 5)
                fprintf(stderr, "%s: %s[%" PRId64 "]: backward %.6g, finite differences %.6g\n", what,
                        pa->name, j, ana, num);
        }
    }
    if (bad)
        fprintf(stderr, "%s: %d gradient entries off\n", what, bad);
    CHECK_EQ_INT(bad, 0);
    free(x);
    free(R);
    model_free(m);
}

static struct spec *new_spec(void)
{
    struct spec *s = calloc(1, sizeof *s);
    s->init_seed = 7;
    return s;
}

static void test_layernorm_gelu_rank3(void)
{
    struct spec *s = new_spec();
    add_linear(s, -1, 5, 7);
    add_dim(s, -1, LAYER_LAYERNORM, 7);
    add_layer(s, -1, LAYER_GELU_TANH);
    add_linear(s, -1, 7, 3);
    finish(s, 2, (int64_t[]){3, 5});
    grad_check("linear/layernorm/gelu tanh on [B,3,5]", s, 2, 1);
    s->layers[1].bias = false;
    grad_check("layernorm without bias", s, 3, 2);
    free(s);
}

static void attention_case(const char *what, int64_t T, int64_t dim, int64_t heads, bool causal, int64_t B)
{
    struct spec *s = new_spec();
    add_linear(s, -1, 3, dim);
    int a = add_dim(s, -1, LAYER_ATTENTION, dim);
    s->layers[a].heads = heads;
    s->layers[a].causal = causal;
    add_linear(s, -1, dim, 2);
    finish(s, 2, (int64_t[]){T, 3});
    grad_check(what, s, B, (uint64_t)(T * 31 + dim));
    free(s);
}

static void test_attention(void)
{
    attention_case("attention causal T 5 dim 6 heads 2", 5, 6, 2, true, 2);
    attention_case("attention not causal T 5 dim 6 heads 3", 5, 6, 3, false, 3);
    attention_case("attention T 1", 1, 4, 2, true, 2);
    attention_case("attention one head T 3", 3, 5, 1, true, 1);
}

/* A small GPT: embedding, position, two pre-norm blocks, final layernorm, head. */
static struct spec *gpt(int64_t vocab, int64_t T, int64_t dim, int64_t heads, int blocks)
{
    struct spec *s = new_spec();
    int e = add_dim(s, -1, LAYER_EMBEDDING, dim);
    s->layers[e].num = vocab;
    int p = add_dim(s, -1, LAYER_POSITION, dim);
    s->layers[p].num = T + 2;
    for (int b = 0; b < blocks; b++) {
        int r1 = add_layer(s, -1, LAYER_RESIDUAL);
        add_dim(s, r1, LAYER_LAYERNORM, dim);
        int a = add_dim(s, r1, LAYER_ATTENTION, dim);
        s->layers[a].heads = heads;
        end_residual(s, r1);
        int r2 = add_layer(s, -1, LAYER_RESIDUAL);
        add_dim(s, r2, LAYER_LAYERNORM, dim);
        add_linear(s, r2, dim, 4 * dim);
        add_layer(s, r2, LAYER_GELU_TANH);
        add_linear(s, r2, 4 * dim, dim);
        int d = add_layer(s, r2, LAYER_DROPOUT);
        s->layers[d].p = 0.0;
        end_residual(s, r2);
    }
    add_dim(s, -1, LAYER_LAYERNORM, dim);
    add_linear(s, -1, dim, vocab);
    finish(s, 1, (int64_t[]){T});
    return s;
}

static void test_gpt_and_nesting(void)
{
    struct spec *s = gpt(11, 5, 8, 2, 2);
    grad_check("gpt vocab 11 T 5 dim 8 heads 2 blocks 2", s, 3, 3);
    free(s);

    /* Residuals nested two deep, a residual first (its input gradient unused). */
    s = new_spec();
    int r0 = add_layer(s, -1, LAYER_RESIDUAL);
    add_linear(s, r0, 4, 4);
    add_layer(s, r0, LAYER_TANH);
    int r1 = add_layer(s, r0, LAYER_RESIDUAL);
    add_dim(s, r1, LAYER_LAYERNORM, 4);
    int r2 = add_layer(s, r1, LAYER_RESIDUAL);
    add_linear(s, r2, 4, 4);
    add_layer(s, r2, LAYER_GELU_TANH);
    end_residual(s, r2);
    end_residual(s, r1);
    end_residual(s, r0);
    add_linear(s, -1, 4, 3);
    finish(s, 2, (int64_t[]){2, 4});
    CHECK_EQ_STR(s->layers[6].key, "0.2.1.0");
    grad_check("nested residuals", s, 2, 4);
    free(s);
}

/* A v1 list longer than a residual may hold (SPEC_MAX_LIST): every layer runs backward. */
static void test_long_flat_list(void)
{
    struct spec *s = new_spec();
    s->n_layers = 101;
    for (int i = 0; i < 101; i++)
        s->layers[i] =
            (struct spec_layer){.kind = i % 2 ? LAYER_TANH : LAYER_LINEAR, .in = 3, .out = 3, .bias = true};
    spec_flat_layers(s);
    grad_check("101 flat layers", s, 2, 9);
    free(s);
}

static void ready_cb(void *ctx, int index)
{
    int *log = ctx;
    log[1 + log[0]++] = index;
}

static void test_names_and_order(void)
{
    struct spec *s = gpt(13, 4, 6, 3, 1);
    struct param ps[SPEC_MAX_PARAMS];
    int np = model_spec_params(s, ps);
    const char *want[] = {"0.weight",     "1.weight",        "2.0.weight",    "2.0.bias",   "2.1.qkv.weight",
                          "2.1.qkv.bias", "2.1.proj.weight", "2.1.proj.bias", "3.0.weight", "3.0.bias",
                          "3.1.weight",   "3.1.bias",        "3.3.weight",    "3.3.bias",   "4.weight",
                          "4.bias",       "5.weight",        "5.bias"};
    CHECK_EQ_INT(np, (int)(sizeof want / sizeof want[0]));
    for (int i = 0; i < np && i < (int)(sizeof want / sizeof want[0]); i++)
        CHECK_EQ_STR(ps[i].name, want[i]);
    CHECK_EQ_INT(ps[4].shape[0], 18);
    CHECK_EQ_INT(ps[4].shape[1], 6);
    CHECK_EQ_INT(ps[1].shape[0], 6); /* position: max = T + 2 */

    struct model *m = model_new(D, s, 2);
    CHECK(m != NULL);
    int32_t ids[8] = {0, 1, 2, 3, 12, 11, 10, 9};
    int log[1 + 2 * SPEC_MAX_PARAMS] = {0};
    const float *y = model_forward(m, ids, 2);
    float dy[2 * 4 * 13];
    for (int i = 0; i < 2 * 4 * 13; i++)
        dy[i] = (float)(i % 7) * 0.1f - 0.3f;
    (void)y;
    model_zero_grad(m);
    model_backward(m, dy, ready_cb, log);
    CHECK_EQ_INT(log[0], np);
    for (int i = 0; i < log[0]; i++)
        CHECK_EQ_INT(log[1 + i], np - 1 - i);
    /* Init: layernorm 1 and 0; embedding and position N(0,1); linear within ±1/sqrt(in). */
    const struct param *ln = model_param(m, 2), *lnb = model_param(m, 3), *emb = model_param(m, 0);
    CHECK(ln->data[0] == 1.0f && ln->data[5] == 1.0f && lnb->data[3] == 0.0f);
    double ss = 0;
    for (int64_t i = 0; i < emb->numel; i++)
        ss += (double)emb->data[i] * emb->data[i];
    CHECK(ss / (double)emb->numel > 0.4 && ss / (double)emb->numel < 2.0);
    const struct param *qkv = model_param(m, 4);
    for (int64_t i = 0; i < qkv->numel; i++)
        CHECK(fabsf(qkv->data[i]) <= 1.0f / sqrtf(6.0f));
    model_free(m);
    free(s);
}

/* ---- dropout ---- */

static void test_dropout(void)
{
    struct spec *s = new_spec();
    add_linear(s, -1, 3, 64);
    int d = add_layer(s, -1, LAYER_DROPOUT);
    s->layers[d].p = 0.25;
    finish(s, 2, (int64_t[]){5, 3});
    struct model *m = model_new(D, s, 2);
    CHECK(m != NULL);
    float x[30];
    for (int i = 0; i < 30; i++)
        x[i] = (float)i * 0.01f + 0.5f;
    const int64_t n = 2 * 5 * 64;
    float *y1 = malloc((size_t)n * sizeof *y1), *pre = malloc((size_t)n * sizeof *pre);
    model_set_training(m, false);
    memcpy(pre, model_forward(m, x, 2), (size_t)n * sizeof *pre);
    model_set_training(m, true);
    memcpy(y1, model_forward(m, x, 2), (size_t)n * sizeof *y1);
    int zeros = 0, bad = 0;
    for (int64_t i = 0; i < n; i++) {
        if (y1[i] == 0.0f)
            zeros++;
        else if (y1[i] != pre[i] * (1.0f / 0.75f))
            bad++;
    }
    CHECK_EQ_INT(bad, 0);
    CHECK(zeros > n / 8 && zeros < n * 3 / 8); /* about a quarter of 640 */
    /* The next training forward draws another mask; a model with the same seed the same. */
    const float *y2 = model_forward(m, x, 2);
    CHECK(memcmp(y1, y2, (size_t)n * sizeof *y1) != 0);
    struct model *m2 = model_new(D, s, 2);
    const float *z1 = model_forward(m2, x, 2);
    CHECK(memcmp(y1, z1, (size_t)n * sizeof *y1) == 0);
    /* Another rank draws other masks. */
    struct model *m3 = model_new(D, s, 2);
    model_set_rank(m3, 1);
    CHECK(memcmp(y1, model_forward(m3, x, 2), (size_t)n * sizeof *y1) != 0);
    /* A set position draws the same masks again (a resumed run), another one others. */
    model_set_position(m, 5, 1);
    memcpy(y1, model_forward(m, x, 2), (size_t)n * sizeof *y1);
    model_set_position(m2, 5, 1);
    CHECK(memcmp(y1, model_forward(m2, x, 2), (size_t)n * sizeof *y1) == 0);
    model_set_position(m2, 5, 0);
    CHECK(memcmp(y1, model_forward(m2, x, 2), (size_t)n * sizeof *y1) != 0);
    /* Backward through the mask of the last forward: with dy = 1 the linear's bias
     * gradient is, per output, the sum of the mask over the rows. */
    memcpy(y1, model_forward(m, x, 2), (size_t)n * sizeof *y1);
    float *ones = malloc((size_t)n * sizeof *ones);
    for (int64_t i = 0; i < n; i++)
        ones[i] = 1.0f;
    model_zero_grad(m);
    model_backward(m, ones, NULL, NULL);
    const struct param *bias = model_param(m, 1);
    int off = 0;
    for (int o = 0; o < 64; o++) {
        double want = 0;
        for (int r = 0; r < 10; r++)
            want += y1[r * 64 + o] != 0.0f ? 1.0 / 0.75 : 0.0;
        off += fabs(bias->grad[o] - want) > 1e-5;
    }
    CHECK_EQ_INT(off, 0);
    free(ones);
    model_free(m3);
    model_free(m2);
    model_free(m);
    free(y1);
    free(pre);
    free(s);
}

/* ---- memory: nothing allocated per step; the NULL-op error ---- */

static struct dev_ops counting_ops;
static int allocs;

static void *counting_alloc(void *ctx, size_t bytes)
{
    allocs++;
    return D.ops->alloc(ctx, bytes);
}

static void test_memory_and_missing_op(void)
{
    counting_ops = *D.ops;
    counting_ops.alloc = counting_alloc;
    struct dev cd = {&counting_ops, D.ctx};
    struct spec *s = gpt(9, 6, 8, 2, 2);
    struct model *m = model_new(cd, s, 4);
    CHECK(m != NULL);
    const int after_new = allocs;
    const int64_t bytes = model_activation_bytes(m);
    CHECK(bytes > 0);
    /* At least every layer output and attention's probabilities for 4 x 6 tokens. */
    CHECK(bytes >= (int64_t)sizeof(float) * 4 * 6 * (9 + 2 * 2 * 6));
    int32_t ids[24];
    float dy[4 * 6 * 9];
    for (int i = 0; i < 24; i++)
        ids[i] = i % 9;
    for (int i = 0; i < 4 * 6 * 9; i++)
        dy[i] = 0.01f * (float)(i % 5);
    for (int step = 0; step < 5; step++) {
        model_zero_grad(m);
        model_forward(m, ids, step % 2 ? 4 : 3);
        model_backward(m, dy, NULL, NULL);
    }
    CHECK_EQ_INT(allocs, after_new);
    CHECK_EQ_INT(model_activation_bytes(m), bytes);
    model_free(m);

    /* A backend whose slot is still NULL: DDPD_EDEVICE at model_new naming the op. */
    counting_ops.layernorm_forward = NULL;
    struct ddpd_error err = {0};
    m = model_new_err(cd, s, 4, &err);
    CHECK(m == NULL);
    CHECK_EQ_INT(err.code, DDPD_EDEVICE);
    CHECK(strstr(err.message, "layernorm_forward") != NULL);
    CHECK(strstr(err.message, "layer 2.0") != NULL);
    counting_ops = *D.ops;
    counting_ops.gemm_batched = NULL;
    memset(&err, 0, sizeof err);
    CHECK(model_new_err((struct dev){&counting_ops, D.ctx}, s, 4, &err) == NULL);
    CHECK(strstr(err.message, "gemm_batched") != NULL);
    free(s);
}

/* gelu tanh against PyTorch's formula in double, forward and backward, over [-12, 12]. */
static void test_gelu_tanh_values(void)
{
    enum { N = 4801 };
    static float x[N], y[N], dy[N], dx[N];
    for (int i = 0; i < N; i++) {
        x[i] = -12.0f + 24.0f * (float)i / (N - 1);
        dy[i] = 1.0f;
    }
    D.ops->act_forward(D.ctx, LAYER_GELU_TANH, y, x, N);
    D.ops->act_backward(D.ctx, LAYER_GELU_TANH, dx, dy, x, y, N);
    int bad = 0;
    const double beta = sqrt(2.0) * (2.0 / sqrt(M_PI)) * 0.5, kappa = 0.044715;
    for (int i = 0; i < N; i++) {
        const double v = x[i], u = beta * (v + kappa * v * v * v), t = tanh(u);
        const double want = 0.5 * v * (1 + t);
        const double dwant = 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * beta * (1 + 3 * kappa * v * v);
        if (!(fabs(y[i] - want) <= 1e-6 + 1e-6 * fabs(want)) ||
            !(fabs(dx[i] - dwant) <= 1e-6 + 1e-6 * fabs(dwant)))
            if (bad++ < 5)
                fprintf(stderr, "gelu tanh at %.9g: y %.9g (want %.9g), dx %.9g (want %.9g)\n", v, y[i], want,
                        dx[i], dwant);
    }
    CHECK_EQ_INT(bad, 0);
    float big[3] = {NAN, 200.0f, -200.0f}, out[3];
    D.ops->act_forward(D.ctx, LAYER_GELU_TANH, out, big, 3);
    CHECK(isnan(out[0]) && out[1] == 200.0f && fabsf(out[2]) < 1e-30f);
}

/* ---- the conv-net layers (issue 18) ---- */

static void set_shapes(struct spec_layer *l, int ir, const int64_t *in, int orank, const int64_t *out)
{
    l->in_rank = ir;
    l->out_rank = orank;
    memcpy(l->in_shape, in, (size_t)ir * sizeof *in);
    memcpy(l->out_shape, out, (size_t)orank * sizeof *out);
}

/* conv2d(2->3, k3, s1, p1) -> batchnorm(3) -> max or avg pool(2) -> flatten -> linear(12->4) ->
 * batchnorm(4) -> linear(4->2) on [2,5,4] images. */
static struct spec *conv_net(layer_kind pool, bool bn1d)
{
    struct spec *s = new_spec();
    const int64_t img[] = {2, 5, 4}, c3[] = {3, 5, 4}, p3[] = {3, 2, 2}, f12[] = {12}, f4[] = {4}, f2[] = {2};
    int i = add_layer(s, -1, LAYER_CONV2D);
    struct spec_layer *l = &s->layers[i];
    l->in = 2;
    l->out = 3;
    l->kernel[0] = l->kernel[1] = 3;
    l->stride[0] = l->stride[1] = 1;
    l->padding[0] = l->padding[1] = 1;
    set_shapes(l, 3, img, 3, c3);
    i = add_dim(s, -1, LAYER_BATCHNORM, 3);
    s->layers[i].momentum = 0.1;
    set_shapes(&s->layers[i], 3, c3, 3, c3);
    i = add_layer(s, -1, pool);
    l = &s->layers[i];
    l->kernel[0] = l->kernel[1] = l->stride[0] = l->stride[1] = 2;
    set_shapes(l, 3, c3, 3, p3);
    i = add_layer(s, -1, LAYER_FLATTEN);
    set_shapes(&s->layers[i], 3, p3, 1, f12);
    i = add_linear(s, -1, 12, 4);
    set_shapes(&s->layers[i], 1, f12, 1, f4);
    if (bn1d) {
        i = add_dim(s, -1, LAYER_BATCHNORM, 4);
        s->layers[i].momentum = 0.1;
        set_shapes(&s->layers[i], 1, f4, 1, f4);
    }
    i = add_linear(s, -1, 4, 2);
    set_shapes(&s->layers[i], 1, f4, 1, f2);
    s->input_rank = 3;
    memcpy(s->input_shape, img, sizeof img);
    s->input_shape_set = true;
    return s;
}

/* Copies between host and backend, and waits for the backend (test_conv_net's forwards). */
static struct dev_ops copy_counting_ops;
static int copies;
static void count_to_host(void *ctx, void *dst, const void *src, size_t bytes)
{
    copies++;
    D.ops->to_host(ctx, dst, src, bytes);
}
static void count_to_device(void *ctx, void *dst, const void *src, size_t bytes)
{
    copies++;
    D.ops->to_device(ctx, dst, src, bytes);
}
static void count_synchronize(void *ctx)
{
    copies++;
    D.ops->synchronize(ctx);
}

static void test_conv_net(void)
{
    /* Finite differences need a smooth net: avgpool (maxpool's argmax flips within h), and
     * no BatchNorm1d over 3 rows (its curvature is beyond central differences of 1e-2;
     * tests/parity/test_conv.py checks it against autograd). */
    struct spec *s = conv_net(LAYER_AVGPOOL2D, false);
    grad_check("conv net", s, 3, 11);
    free(s);
    s = conv_net(LAYER_MAXPOOL2D, true);

    /* A forward pass stays on the backend: BatchNorm's num_batches_tracked is counted
     * there, not copied to the host and back (on CUDA each copy waits for the queue). */
    copy_counting_ops = *D.ops;
    copy_counting_ops.to_host = count_to_host;
    copy_counting_ops.to_device = count_to_device;
    copy_counting_ops.synchronize = count_synchronize;
    struct model *m = model_new((struct dev){&copy_counting_ops, D.ctx}, s, 4);
    CHECK(m != NULL);
    if (!m) {
        free(s);
        return;
    }
    CHECK_EQ_STR(model_param(m, 0)->name, "0.weight");
    CHECK_EQ_INT(model_param(m, 0)->ndim, 4);
    CHECK(model_param(m, 0)->numel == 3 * 2 * 3 * 3);
    CHECK_EQ_INT(model_buffer_count(m), 6);
    const char *names[] = {"1.running_mean", "1.running_var", "1.num_batches_tracked",
                           "5.running_mean", "5.running_var", "5.num_batches_tracked"};
    for (int i = 0; i < 6 && i < model_buffer_count(m); i++)
        CHECK_EQ_STR(model_buffer(m, i)->name, names[i]);
    struct model_buffer *rm = model_buffer(m, 0), *rv = model_buffer(m, 1), *nb = model_buffer(m, 2);
    CHECK(nb->i64 && !rm->i64);
    CHECK(((float *)rm->data)[0] == 0.0f && ((float *)rv->data)[2] == 1.0f && *(int64_t *)nb->data == 0);

    float x[4 * 40];
    for (int i = 0; i < 4 * 40; i++)
        x[i] = (float)((i * 37) % 11) / 5.0f - 1.0f;
    copies = 0;
    model_forward(m, x, 4);
    model_forward(m, x, 4);
    CHECK_EQ_INT(copies, 0);
    CHECK(*(int64_t *)nb->data == 2);
    CHECK(*(int64_t *)model_buffer(m, 5)->data == 2);
    CHECK(((float *)rm->data)[0] != 0.0f);
    /* Eval: running statistics are used and left alone; a batch of one row is fine. */
    float keep = ((float *)rm->data)[0];
    model_set_training(m, false);
    struct ddpd_error err = {0};
    CHECK_EQ_INT(model_check_batch(m, 1, &err), DDPD_OK);
    model_forward(m, x, 1);
    CHECK(*(int64_t *)nb->data == 2 && ((float *)rm->data)[0] == keep);
    model_set_training(m, true);
    /* Training: one row gives BatchNorm1d (layer 5) one value per channel. */
    CHECK_EQ_INT(model_check_batch(m, 2, &err), DDPD_OK);
    CHECK_EQ_INT(model_check_batch(m, 1, &err), DDPD_EDATA);
    CHECK_EQ_STR(err.message,
                 "model layer 5 (batchnorm): Expected more than 1 value per channel when training, "
                 "got input size [1, 4]");
    model_free(m);
    free(s);
}

int main(void)
{
    D = dev_cpu_new(1);
    test_gelu_tanh_values();
    test_layernorm_gelu_rank3();
    test_attention();
    test_gpt_and_nesting();
    test_long_flat_list();
    test_names_and_order();
    test_dropout();
    test_memory_and_missing_op();
    test_conv_net();
    dev_cpu_free(D);
    CHECK_DONE();
}
