/* test_nn.c — the model (model.c): gradients of every layer kind and both losses against finite
 * differences, numbers PyTorch produced for the same weights, the order and timing of
 * the gradient-ready callback, accumulation, zero_grad, re-pointed gradient storage and
 * the init distribution. */
#include <stdint.h>

#include "check.h"
#include "worker/dev.h"
#include "worker/model.h"
#include "worker/rng.h"

static struct dev D;

struct net {
    int n;
    layer_kind kind[8];
    int64_t width[9]; /* width[0] = input, width[i+1] = output of layer i */
    bool nobias[8];
};

static void make_spec(struct spec *s, const struct net *t)
{
    memset(s, 0, sizeof *s);
    s->n_layers = t->n;
    for (int i = 0; i < t->n; i++)
        s->layers[i] = (struct spec_layer){
            .kind = t->kind[i], .in = t->width[i], .out = t->width[i + 1], .bias = !t->nobias[i]};
    spec_flat_layers(s);
}

static void get(float *h, const float *dptr, int64_t n)
{
    D.ops->to_host(D.ctx, h, dptr, (size_t)n * sizeof(float));
}
static void put(float *dptr, const float *h, int64_t n)
{
    D.ops->to_device(D.ctx, dptr, h, (size_t)n * sizeof(float));
}

/* ---- a double-precision reference of the same network ---- */

static double act(layer_kind k, double x)
{
    switch (k) {
    case LAYER_RELU: return x > 0 ? x : 0;
    case LAYER_TANH: return tanh(x);
    case LAYER_SIGMOID: return 1 / (1 + exp(-x));
    case LAYER_GELU: return 0.5 * x * (1 + erf(x / sqrt(2.0)));
    default: return NAN;
    }
}

enum { MAXW = 8, MAXB = 6 };

/* Loss of the network with weights w[param][...] (double) on x[B,in]. */
static double ref_loss(const struct net *t, double **w, const double *x, int64_t B, loss_kind loss,
                       const double *target, const int32_t *labels, double *out)
{
    double a[MAXB][MAXW], b[MAXB][MAXW];
    for (int64_t r = 0; r < B; r++)
        for (int64_t j = 0; j < t->width[0]; j++)
            a[r][j] = x[r * t->width[0] + j];
    int p = 0;
    for (int i = 0; i < t->n; i++) {
        const int64_t in = t->width[i], o = t->width[i + 1];
        if (t->kind[i] == LAYER_LINEAR) {
            const double *W = w[p++], *bias = t->nobias[i] ? NULL : w[p++];
            for (int64_t r = 0; r < B; r++)
                for (int64_t j = 0; j < o; j++) {
                    double s = bias ? bias[j] : 0;
                    for (int64_t k = 0; k < in; k++)
                        s += W[j * in + k] * a[r][k];
                    b[r][j] = s;
                }
        } else {
            for (int64_t r = 0; r < B; r++)
                for (int64_t j = 0; j < o; j++)
                    b[r][j] = act(t->kind[i], a[r][j]);
        }
        memcpy(a, b, sizeof a);
    }
    const int64_t C = t->width[t->n];
    double total = 0;
    for (int64_t r = 0; r < B; r++) {
        if (out)
            for (int64_t j = 0; j < C; j++)
                out[r * C + j] = a[r][j];
        if (loss == LOSS_MSE) {
            for (int64_t j = 0; j < C; j++)
                total += (a[r][j] - target[r * C + j]) * (a[r][j] - target[r * C + j]);
        } else {
            double mx = a[r][0], s = 0;
            for (int64_t j = 1; j < C; j++)
                mx = fmax(mx, a[r][j]);
            for (int64_t j = 0; j < C; j++)
                s += exp(a[r][j] - mx);
            total += mx + log(s) - a[r][labels[r]];
        }
    }
    return loss == LOSS_MSE ? total / (double)(B * C) : total / (double)B;
}

/* Runs forward, the loss op and backward on the model; returns the float loss. */
static float model_loss_backward(struct model *m, const float *x, int64_t B, int64_t in, int64_t C,
                                 loss_kind loss, const float *target, const int32_t *labels)
{
    float *dx = D.ops->alloc(D.ctx, (size_t)(B * in) * sizeof(float));
    float *dt = D.ops->alloc(D.ctx, (size_t)(B * C) * sizeof(float));
    float *dp = D.ops->alloc(D.ctx, (size_t)(B * C) * sizeof(float));
    int32_t *dl = D.ops->alloc(D.ctx, (size_t)B * sizeof(int32_t));
    float *l = D.ops->alloc(D.ctx, sizeof(float));
    put(dx, x, B * in);
    const float *pred = model_forward(m, dx, B);
    if (loss == LOSS_MSE) {
        put(dt, target, B * C);
        D.ops->mse(D.ctx, pred, dt, B, C, dp, l);
    } else {
        D.ops->to_device(D.ctx, dl, labels, (size_t)B * sizeof(int32_t));
        D.ops->cross_entropy(D.ctx, pred, dl, B, C, dp, l);
    }
    model_backward(m, dp, NULL, NULL);
    float lv;
    get(&lv, l, 1);
    D.ops->free(D.ctx, dx);
    D.ops->free(D.ctx, dt);
    D.ops->free(D.ctx, dp);
    D.ops->free(D.ctx, dl);
    D.ops->free(D.ctx, l);
    return lv;
}

/* Gradient check. The analytic gradients are the model's (float32 throughout); the
 * numeric ones are central differences of the double-precision reference above at the
 * model's own weights, with h = 1e-6: in double the truncation error (~h^2) and the
 * cancellation error (~1e-16/h) are both below 1e-9, so the comparison measures only the
 * float32 rounding of the model (~1e-6 relative), not the noise of differencing float32
 * losses, which at any usable h would swamp it. */
static void grad_check(const struct net *t, loss_kind loss, uint64_t seed)
{
    struct spec s;
    make_spec(&s, t);
    s.init_seed = seed;
    const int64_t B = 5, in = t->width[0], C = t->width[t->n];
    struct model *m = model_new(D, &s, MAXB);
    CHECK(m != NULL);
    struct rng r;
    rng_seed2(&r, seed, 7);
    float x[MAXB * 8], target[MAXB * MAXW];
    int32_t labels[MAXB];
    double xd[MAXB * 8];
    for (int i = 0; i < B * in; i++)
        xd[i] = x[i] = (float)rng_normal(&r);
    for (int i = 0; i < B * C; i++)
        target[i] = (float)rng_normal(&r);
    for (int i = 0; i < B; i++)
        labels[i] = (int32_t)rng_below(&r, (uint64_t)C);
    double td[MAXB * MAXW];
    for (int i = 0; i < B * C; i++)
        td[i] = target[i];

    const int np = model_param_count(m);
    double *w[16];
    for (int i = 0; i < np; i++) {
        struct param *p = model_param(m, i);
        float h[64];
        get(h, p->data, p->numel);
        w[i] = malloc((size_t)p->numel * sizeof(double));
        for (int64_t j = 0; j < p->numel; j++)
            w[i][j] = h[j];
    }
    float lf = model_loss_backward(m, x, B, in, C, loss, target, labels);
    double outd[MAXB * MAXW];
    double ld = ref_loss(t, w, xd, B, loss, td, labels, outd);
    CHECK_NEAR(lf, ld, 1e-6, 1e-5);

    int bad = 0;
    for (int i = 0; i < np; i++) {
        struct param *p = model_param(m, i);
        float g[64];
        get(g, p->grad, p->numel);
        for (int64_t j = 0; j < p->numel; j++) {
            const double h = 1e-6, keep = w[i][j];
            w[i][j] = keep + h;
            double lp = ref_loss(t, w, xd, B, loss, td, labels, NULL);
            w[i][j] = keep - h;
            double lm = ref_loss(t, w, xd, B, loss, td, labels, NULL);
            w[i][j] = keep;
            double num = (lp - lm) / (2 * h);
            if (!(fabs(g[j] - num) <= 2e-6 + 1e-4 * fabs(num))) {
                if (bad++ < 5)
                    fprintf(stderr, "  %s[%" PRId64 "]: analytic %.9g numeric %.9g\n", p->name, j, g[j], num);
            }
        }
    }
    if (bad)
        fprintf(stderr, "grad_check: %d mismatches (%d layers, loss %d)\n", bad, t->n, (int)loss);
    CHECK_EQ_INT(bad, 0);
    for (int i = 0; i < np; i++)
        free(w[i]);
    model_free(m);
}

static void test_grad_checks(void)
{
    static const layer_kind acts[] = {LAYER_RELU, LAYER_TANH, LAYER_SIGMOID, LAYER_GELU};
    for (int l = 0; l < 2; l++) {
        const loss_kind loss = l ? LOSS_CROSS_ENTROPY : LOSS_MSE;
        /* One linear layer. */
        grad_check(&(struct net){1, {LAYER_LINEAR}, {4, 3}, {false}}, loss, 1);
        /* Two linear layers: layer 0's gradient needs dx of layer 1. */
        grad_check(&(struct net){2, {LAYER_LINEAR, LAYER_LINEAR}, {4, 5, 3}, {false}}, loss, 2);
        /* A linear layer without bias. */
        grad_check(&(struct net){3, {LAYER_LINEAR, LAYER_TANH, LAYER_LINEAR}, {3, 4, 4, 2}, {true}}, loss, 3);
        for (int a = 0; a < 4; a++) {
            grad_check(&(struct net){3, {LAYER_LINEAR, acts[a], LAYER_LINEAR}, {4, 6, 6, 3}, {false}}, loss,
                       10 + (uint64_t)a);
            /* Activation last, then straight into the loss. */
            grad_check(&(struct net){2, {LAYER_LINEAR, acts[a]}, {3, 4, 4}, {false}}, loss, 20 + (uint64_t)a);
        }
        /* Everything in one deep net. */
        grad_check(&(struct net){8,
                                 {LAYER_LINEAR, LAYER_RELU, LAYER_LINEAR, LAYER_GELU, LAYER_LINEAR,
                                  LAYER_SIGMOID, LAYER_LINEAR, LAYER_TANH},
                                 {4, 7, 7, 5, 5, 6, 6, 3, 3},
                                 {false}},
                   loss, 30);
    }
}

/* ---- numbers from PyTorch ----
 * Weights, inputs and targets are exact binary fractions from these formulas (k counts
 * across all parameters in registration order for the weights):
 *   w = ((k*7) % 13 - 6) / 8,  x[b,j] = ((k*5) % 9 - 4) / 4 with k = 4b + j,
 *   mse target = ((k*3) % 7 - 3) / 2 with k = 2b + j,  label[b] = b % 4,  B = 5.
 * The expected values are PyTorch 1.13's on this machine (torch.set_num_threads(1)):
 *   m = nn.Sequential(...); fill every m.named_parameters() from the formula
 *   out = m(x); l = F.mse_loss(out, t)  (or F.cross_entropy(out, labels)); l.backward()
 *   print each p.grad with "%.9g". */
static void set_formula_weights(struct model *m)
{
    int64_t k = 0;
    for (int i = 0; i < model_param_count(m); i++) {
        struct param *p = model_param(m, i);
        float h[64];
        for (int64_t j = 0; j < p->numel; j++, k++)
            h[j] = (float)(((k * 7) % 13 - 6) / 8.0);
        put(p->data, h, p->numel);
    }
}

static void formula_inputs(float *x, float *t, int32_t *labels)
{
    for (int k = 0; k < 20; k++)
        x[k] = (float)(((k * 5) % 9 - 4) / 4.0);
    for (int k = 0; k < 10; k++)
        t[k] = (float)(((k * 3) % 7 - 3) / 2.0);
    for (int b = 0; b < 5; b++)
        labels[b] = b % 4;
}

static void check_grads(struct model *m, int i, const float *want, int64_t n)
{
    struct param *p = model_param(m, i);
    CHECK_EQ_INT(p->numel, n);
    float g[64];
    get(g, p->grad, p->numel);
    for (int64_t j = 0; j < n; j++) {
        if (!(fabsf(g[j] - want[j]) <= 1e-7f + 2e-6f * fabsf(want[j])))
            fprintf(stderr, "  %s[%" PRId64 "]\n", p->name, j);
        CHECK_NEAR(g[j], want[j], 1e-7, 2e-6);
    }
}

static void test_torch_tanh_mse(void)
{
    /* nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2)), mse_loss */
    static const float out[10] = {-1.0910995f,  1.20134807f,  -1.05292583f, 1.20715475f, 0.192183793f,
                                  0.407203704f, 0.253709614f, 0.423419297f, -0.4624421f, 0.9324404f};
    static const float g0w[12] = {-0.0678941756f,  -0.034178514f,  0.0213763975f, 0.0892446339f,
                                  0.171814859f,    -0.14817223f,   0.0662085339f, -0.227677345f,
                                  -0.00420902763f, -0.0920194238f, 0.102605686f,  -0.00804375485f};
    static const float g0b[3] = {0.493692577f, -0.318020523f, 0.335902691f};
    static const float g2w[6] = {-0.174192145f, 0.0991863385f, -0.261812329f,
                                 0.0479703881f, -0.332762063f, 0.0414603353f};
    static const float g2b[2] = {-0.732114851f, 1.13431323f};
    struct spec s;
    make_spec(&s, &(struct net){3, {LAYER_LINEAR, LAYER_TANH, LAYER_LINEAR}, {4, 3, 3, 2}, {false}});
    struct model *m = model_new(D, &s, 5);
    set_formula_weights(m);
    float x[20], t[10], o[10];
    int32_t lab[5];
    formula_inputs(x, t, lab);
    float loss = model_loss_backward(m, x, 5, 4, 2, LOSS_MSE, t, lab);
    CHECK_NEAR(loss, 1.79712105, 0, 1e-6);
    float *dxx = D.ops->alloc(D.ctx, sizeof x);
    put(dxx, x, 20);
    get(o, model_forward(m, dxx, 5), 10);
    D.ops->free(D.ctx, dxx);
    for (int i = 0; i < 10; i++)
        CHECK_NEAR(o[i], out[i], 1e-7, 1e-6);
    check_grads(m, 0, g0w, 12);
    check_grads(m, 1, g0b, 3);
    check_grads(m, 2, g2w, 6);
    check_grads(m, 3, g2b, 2);
    model_free(m);
}

static void test_torch_deep_ce(void)
{
    /* nn.Sequential(Linear(4,6), ReLU(), Linear(6,5), GELU(), Linear(5,3), Sigmoid(),
     * Linear(3,4)), cross_entropy; the first layer's gradient depends on all of it. */
    static const float g0w[24] = {
        -0.0029110671f,  0.037342526f,    -0.0238862671f, 0.032589443f,   0.0112832841f,   0.00965108071f,
        0.0109568434f,   0.00932464004f,  -0.0100425892f, 0.00320828054f, -0.00739241531f, 0.00585845485f,
        0.00737122539f,  -0.0221320689f,  0.0147470487f,  -0.0147562437f, -0.00518591283f, -0.00554718962f,
        -0.00509559363f, -0.00545687042f, 0.0234600287f,  -0.0249299146f, 0.00400084816f,  -0.0128324283f};
    static const float g0b[6] = {-0.019012332f, -0.00130576268f, 0.0106006963f,
                                 0.0295032933f, 0.00036127679f,  0.0483899415f};
    static const float g6w[12] = {-0.140867844f,   -0.0803179294f, -0.0627991036f, 0.0371536538f,
                                  0.12564756f,     0.0457184836f,  0.0203734376f,  -0.0488000996f,
                                  -0.00677494286f, 0.0833407342f,  0.00347044552f, 0.0238555521f};
    static const float g6b[4] = {-0.252128243f, 0.176877379f, -0.0279835984f, 0.10323444f};
    struct spec s;
    make_spec(&s, &(struct net){7,
                                {LAYER_LINEAR, LAYER_RELU, LAYER_LINEAR, LAYER_GELU, LAYER_LINEAR,
                                 LAYER_SIGMOID, LAYER_LINEAR},
                                {4, 6, 6, 5, 5, 3, 3, 4},
                                {false}});
    struct model *m = model_new(D, &s, 5);
    CHECK_EQ_INT(model_param_count(m), 8);
    set_formula_weights(m);
    float x[20], t[10];
    int32_t lab[5];
    formula_inputs(x, t, lab);
    float loss = model_loss_backward(m, x, 5, 4, 4, LOSS_CROSS_ENTROPY, t, lab);
    CHECK_NEAR(loss, 1.60650539, 0, 1e-6);
    check_grads(m, 0, g0w, 24);
    check_grads(m, 1, g0b, 6);
    check_grads(m, 6, g6w, 12);
    check_grads(m, 7, g6b, 4);
    model_free(m);
}

/* ---- the ready callback ---- */

struct ready_log {
    struct model *m;
    int n, order[16];
    int twice;
    int early_nonzero; /* grads of earlier layers already written when a later one fired */
    float snap[16][64];
};

static void on_ready(void *ctx, int index)
{
    struct ready_log *lg = ctx;
    for (int i = 0; i < lg->n; i++)
        lg->twice += lg->order[i] == index;
    struct param *p = model_param(lg->m, index);
    get(lg->snap[index], p->grad, p->numel);
    /* Parameters of earlier layers must not have been touched yet. */
    for (int i = 0; i < model_param_count(lg->m); i++) {
        struct param *q = model_param(lg->m, i);
        if (q->layer >= p->layer)
            continue;
        float g[64];
        get(g, q->grad, q->numel);
        for (int64_t j = 0; j < q->numel; j++)
            lg->early_nonzero += g[j] != 0.0f;
    }
    lg->order[lg->n++] = index;
}

static void test_ready_order(void)
{
    /* 0.weight 0.bias | relu | 2.weight (no bias) | tanh | 4.weight 4.bias */
    struct spec s;
    make_spec(&s, &(struct net){5,
                                {LAYER_LINEAR, LAYER_RELU, LAYER_LINEAR, LAYER_TANH, LAYER_LINEAR},
                                {3, 4, 4, 5, 5, 2},
                                {false, false, true, false, false}});
    struct model *m = model_new(D, &s, 4);
    CHECK_EQ_INT(model_param_count(m), 5);
    static const char *names[] = {"0.weight", "0.bias", "2.weight", "4.weight", "4.bias"};
    for (int i = 0; i < 5; i++) {
        CHECK_EQ_STR(model_param(m, i)->name, names[i]);
        CHECK_EQ_INT(model_param(m, i)->index, i);
    }
    float x[12] = {1, -2, 3, 0.5f, 0.25f, -1, 2, 2, -3, 1, 1, 1};
    float *dx = D.ops->alloc(D.ctx, sizeof x), *dy = D.ops->alloc(D.ctx, 8 * sizeof(float));
    float hy[8] = {1, -1, 0.5f, 2, -0.25f, 1, 3, -2};
    put(dx, x, 12);
    put(dy, hy, 8);
    model_forward(m, dx, 4);
    struct ready_log lg = {.m = m};
    model_backward(m, dy, on_ready, &lg);
    CHECK_EQ_INT(lg.n, 5);
    static const int want[] = {4, 3, 2, 1, 0}; /* last layer first, bias before weight */
    for (int i = 0; i < 5 && i < lg.n; i++)
        CHECK_EQ_INT(lg.order[i], want[i]);
    CHECK_EQ_INT(lg.twice, 0);
    CHECK_EQ_INT(lg.early_nonzero, 0);
    /* What a parameter held when it was reported is its final gradient. */
    for (int i = 0; i < 5; i++) {
        struct param *p = model_param(m, i);
        float g[64];
        get(g, p->grad, p->numel);
        CHECK(memcmp(g, lg.snap[i], (size_t)p->numel * sizeof(float)) == 0);
    }
    /* The caller's dy is read, never written. */
    float back[8];
    get(back, dy, 8);
    CHECK(memcmp(back, hy, sizeof hy) == 0);
    /* NULL callback is fine. */
    model_backward(m, dy, NULL, NULL);
    D.ops->free(D.ctx, dx);
    D.ops->free(D.ctx, dy);
    model_free(m);
}

/* ---- accumulation, zero_grad, set_grad_storage ---- */

static void test_accumulate(void)
{
    struct spec s;
    make_spec(&s, &(struct net){3, {LAYER_LINEAR, LAYER_GELU, LAYER_LINEAR}, {3, 4, 4, 2}, {false}});
    struct model *m = model_new(D, &s, 4);
    const int np = model_param_count(m);
    float x[12] = {1, -2, 3, 0.5f, 0.25f, -1, 2, 2, -3, 1, 1, 1}, hy[8] = {1, -1, 0.5f, 2, -0.25f, 1, 3, -2};
    float *dx = D.ops->alloc(D.ctx, sizeof x), *dy = D.ops->alloc(D.ctx, sizeof hy);
    put(dx, x, 12);
    put(dy, hy, 8);
    float once[4][64], g[64];

    model_forward(m, dx, 4);
    model_backward(m, dy, NULL, NULL);
    for (int i = 0; i < np; i++)
        get(once[i], model_param(m, i)->grad, model_param(m, i)->numel);
    /* A second backward adds the same again: exactly twice (x + x is exact). */
    model_forward(m, dx, 4);
    model_backward(m, dy, NULL, NULL);
    for (int i = 0; i < np; i++) {
        struct param *p = model_param(m, i);
        get(g, p->grad, p->numel);
        for (int64_t j = 0; j < p->numel; j++)
            CHECK(g[j] == 2 * once[i][j]);
    }
    /* After zero_grad the next backward starts from zero: exactly `once` again. */
    model_zero_grad(m);
    model_forward(m, dx, 4);
    model_backward(m, dy, NULL, NULL);
    for (int i = 0; i < np; i++) {
        struct param *p = model_param(m, i);
        get(g, p->grad, p->numel);
        CHECK(memcmp(g, once[i], (size_t)p->numel * sizeof(float)) == 0);
    }
    model_zero_grad(m);
    /* Fewer rows than max_batch. */
    model_forward(m, dx, 1);
    model_backward(m, dy, NULL, NULL);
    get(g, model_param(m, 3)->grad, 2);
    CHECK(g[0] == hy[0] && g[1] == hy[1]); /* last bias: dy of row 0 */

    /* Re-pointed storage: the current gradient moves along, later work lands there. */
    model_zero_grad(m);
    model_forward(m, dx, 4);
    model_backward(m, dy, NULL, NULL);
    struct param *p0 = model_param(m, 0);
    float *old = p0->grad;
    float *mine = D.ops->alloc(D.ctx, (size_t)p0->numel * sizeof(float));
    model_set_grad_storage(m, 0, mine);
    CHECK(p0->grad == mine);
    get(g, mine, p0->numel);
    CHECK(memcmp(g, once[0], (size_t)p0->numel * sizeof(float)) == 0);
    model_forward(m, dx, 4);
    model_backward(m, dy, NULL, NULL);
    get(g, mine, p0->numel);
    for (int64_t j = 0; j < p0->numel; j++)
        CHECK(g[j] == 2 * once[0][j]);
    /* zero_grad: the next backward writes one backward's gradient into the new storage
     * (not added to the two before), bitwise what a fresh model's first backward gives. */
    model_zero_grad(m);
    float o[64];
    get(o, old, p0->numel);
    model_forward(m, dx, 4);
    model_backward(m, dy, NULL, NULL);
    get(g, mine, p0->numel);
    CHECK(memcmp(g, once[0], (size_t)p0->numel * sizeof(float)) == 0);
    /* The old storage no longer changes. */
    get(g, old, p0->numel);
    CHECK(memcmp(g, o, (size_t)p0->numel * sizeof(float)) == 0);
    /* Re-pointed while zeroed: the new storage holds zeros until the next backward. */
    model_zero_grad(m);
    model_set_grad_storage(m, 0, old);
    get(g, old, p0->numel);
    for (int64_t j = 0; j < p0->numel; j++)
        CHECK(g[j] == 0.0f);
    model_set_grad_storage(m, 0, mine);
    model_free(m);
    D.ops->free(D.ctx, mine); /* the caller's, freed after the model */
    D.ops->free(D.ctx, dx);
    D.ops->free(D.ctx, dy);
}

/* ---- init ---- */

static void test_init(void)
{
    struct spec s;
    make_spec(&s, &(struct net){3, {LAYER_LINEAR, LAYER_RELU, LAYER_LINEAR}, {300, 200, 200, 10}, {false}});
    s.init_seed = 5;
    struct model *a = model_new(D, &s, 2), *b = model_new(D, &s, 3);
    s.init_seed = 6;
    struct model *c = model_new(D, &s, 2);
    CHECK(a && b && c);
    CHECK_EQ_INT(model_param_count(a), 4);
    CHECK_EQ_INT(model_numel(a), 300 * 200 + 200 + 200 * 10 + 10);
    CHECK(model_dev(a).ops == D.ops);
    static const int64_t shape[4][2] = {{200, 300}, {200, 0}, {10, 200}, {10, 0}};
    static const int64_t fan_in[4] = {300, 300, 200, 200};
    float *ha = malloc(60000 * sizeof(float)), *hb = malloc(60000 * sizeof(float)),
          *hc = malloc(60000 * sizeof(float));
    for (int i = 0; i < 4; i++) {
        struct param *pa = model_param(a, i), *pb = model_param(b, i), *pc = model_param(c, i);
        CHECK_EQ_INT(pa->ndim, i % 2 ? 1 : 2);
        CHECK_EQ_INT(pa->shape[0], shape[i][0]);
        if (pa->ndim == 2)
            CHECK_EQ_INT(pa->shape[1], shape[i][1]);
        CHECK_EQ_INT(pa->layer, i < 2 ? 0 : 2);
        get(ha, pa->data, pa->numel);
        get(hb, pb->data, pb->numel);
        get(hc, pc->data, pc->numel);
        CHECK(memcmp(ha, hb, (size_t)pa->numel * sizeof(float)) == 0); /* same seed */
        CHECK(memcmp(ha, hc, (size_t)pa->numel * sizeof(float)) != 0); /* other seed */
        const float bound = (float)(1.0 / sqrt((double)fan_in[i]));
        double sum = 0, sq = 0, mx = 0;
        int outside = 0;
        for (int64_t j = 0; j < pa->numel; j++) {
            outside += !(fabsf(ha[j]) <= bound);
            sum += ha[j];
            sq += (double)ha[j] * ha[j];
            mx = fmax(mx, fabs(ha[j]));
        }
        CHECK_EQ_INT(outside, 0);
        const double n = (double)pa->numel;
        /* U(-b, b): mean 0 (sd b/sqrt(3n)), variance b^2/3, max close to b. */
        CHECK(fabs(sum / n) < 5 * bound / sqrt(3 * n));
        if (n >= 1000) {
            CHECK_NEAR(sq / n, bound * bound / 3.0, 0, 0.05);
            CHECK(mx > 0.99 * bound);
        }
        /* Gradients start at zero. */
        get(ha, pa->grad, pa->numel);
        int nz = 0;
        for (int64_t j = 0; j < pa->numel; j++)
            nz += ha[j] != 0.0f;
        CHECK_EQ_INT(nz, 0);
    }
    /* Parameters are one contiguous block in registration order (DDP broadcasts it). */
    for (int i = 0; i + 1 < 4; i++)
        CHECK(model_param(a, i)->data + model_param(a, i)->numel == model_param(a, i + 1)->data);
    free(ha);
    free(hb);
    free(hc);
    model_free(a);
    model_free(b);
    model_free(c);
    model_free(NULL);
}

/* Sizes near the caps: a max_batch whose activations cannot be counted in 64 bits is an
 * error naming the model, never a wrapped small buffer (model_new sized them with
 * unchecked products); the widest layers allowed fail cleanly or succeed, never
 * half-allocate. */
static void test_huge_sizes(void)
{
    struct spec s;
    struct ddpd_error err = {0};
    struct net t = {.n = 2, .kind = {LAYER_LINEAR, LAYER_RELU}, .width = {4, 3, 3}};
    make_spec(&s, &t);
    const int64_t huge[] = {4611686018427387904LL, INT64_MAX / 2, INT64_MAX};
    for (size_t i = 0; i < sizeof huge / sizeof huge[0]; i++) {
        struct model *m = model_new_err(D, &s, huge[i], &err);
        CHECK(m == NULL);
        model_free(m);
        CHECK_EQ_STR(ddpd_err_name(err.code), "EDEVICE");
        CHECK_EQ_STR(err.path, "model");
        CHECK(strstr(err.message, "out of memory") != NULL);
    }
    /* 2^62 / 8 rows: the products fit, the allocation cannot: named with its size. */
    struct model *m = model_new_err(D, &s, (INT64_C(1) << 59), &err);
    CHECK(m == NULL);
    CHECK_EQ_STR(ddpd_err_name(err.code), "EDEVICE");
    CHECK(strstr(err.message, "cannot allocate the activations (") != NULL);
    /* The parameters model_spec_params lists are the ones model_new makes. */
    struct param ps[2 * SPEC_MAX_LAYERS];
    t = (struct net){.n = 3,
                     .kind = {LAYER_LINEAR, LAYER_TANH, LAYER_LINEAR},
                     .width = {5, 4, 4, 2},
                     .nobias = {false, false, true}};
    make_spec(&s, &t);
    m = model_new_err(D, &s, 3, &err);
    CHECK(m != NULL);
    CHECK_EQ_INT(model_spec_params(&s, ps), 3);
    for (int i = 0; m && i < 3; i++) {
        CHECK_EQ_STR(ps[i].name, model_param(m, i)->name);
        CHECK_EQ_INT(ps[i].numel, model_param(m, i)->numel);
        CHECK_EQ_INT(ps[i].shape[0], model_param(m, i)->shape[0]);
        CHECK_EQ_INT(ps[i].shape[1], model_param(m, i)->shape[1]);
        CHECK(ps[i].data == NULL);
    }
    CHECK_EQ_STR(ps[2].name, "2.weight");
    model_free(m);
}

int main(void)
{
    D = dev_cpu_new(1);
    test_huge_sizes();
    test_grad_checks();
    test_torch_tanh_mse();
    test_torch_deep_ce();
    test_ready_order();
    test_accumulate();
    test_init();
    dev_cpu_free(D);
    CHECK_DONE();
}
