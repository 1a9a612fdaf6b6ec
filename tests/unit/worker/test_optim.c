/* test_optim.c — SGD (plain, momentum, dampening, nesterov, weight decay) and AdamW over
 * three steps against PyTorch 1.13's update formulas evaluated in double here, against
 * numbers PyTorch itself produced, and the optimizer's state tensors (names, counts,
 * restore); the lr schedules of CONTRACT.md §2a and clip_grad_norm_. */
#include <math.h>
#include <stdint.h>

#include "check.h"
#include "worker/dev.h"
#include "worker/model.h"
#include "worker/optim.h"

enum { N = 11 };

static const float P0[N] = {0.5f, -1.25f, 2.0f, 0.1f, -0.3f, 0.75f, -2.5f, 1.5f, 0.0f, -0.05f, 3.0f};
static float G[3][N];

/* The three gradients, as the PyTorch script below builds them (float32 of these). */
static void make_grads(void)
{
    for (int i = 0; i < N; i++) {
        G[0][i] = (float)(0.1 * (i + 1) * (i % 2 ? -1 : 1));
        G[1][i] = (float)(0.3 - 0.07 * i);
        G[2][i] = (float)((-0.2 + 0.05 * i) * (i % 3 ? 1 : -2));
    }
}

/* A model whose only parameter is 0.weight [1,11]. */
static struct model *one_param_model(struct dev d)
{
    static struct spec s;
    memset(&s, 0, sizeof s);
    s.n_layers = 1;
    s.layers[0] = (struct spec_layer){.kind = LAYER_LINEAR, .in = N, .out = 1, .bias = false};
    spec_flat_layers(&s);
    struct model *m = model_new(d, &s, 1);
    CHECK(m != NULL);
    CHECK_EQ_INT(model_param_count(m), 1);
    struct param *p = model_param(m, 0);
    d.ops->to_device(d.ctx, p->data, P0, sizeof P0);
    return m;
}

/* Runs three steps of `so` from P0 with gradients G; returns the parameter and the state. */
static void run3(struct dev d, const struct spec_optim *so, float param[N], float st[2][N], int *n_state)
{
    struct model *m = one_param_model(d);
    struct optim *o = optim_new(so, m);
    struct param *p = model_param(m, 0);
    for (int s = 0; s < 3; s++) {
        d.ops->to_device(d.ctx, p->grad, G[s], sizeof G[s]);
        optim_step(o);
    }
    CHECK_EQ_INT(optim_steps(o), 3);
    d.ops->to_host(d.ctx, param, p->data, sizeof(float) * N);
    *n_state = optim_state_count(o);
    for (int i = 0; i < *n_state && i < 2; i++) {
        const struct param *like;
        float *t = optim_state_at(o, i, NULL, 0, &like);
        CHECK(like == p);
        d.ops->to_host(d.ctx, st[i], t, sizeof(float) * N);
    }
    optim_free(o);
    model_free(m);
}

/* PyTorch's _single_tensor_sgd in double. */
static void ref_sgd(const struct spec_optim *so, double p[N], double buf[N])
{
    for (int i = 0; i < N; i++)
        p[i] = P0[i];
    for (int s = 0; s < 3; s++)
        for (int i = 0; i < N; i++) {
            double d = G[s][i];
            if (so->weight_decay != 0)
                d += so->weight_decay * p[i];
            if (so->momentum != 0) {
                buf[i] = s == 0 ? d : so->momentum * buf[i] + (1 - so->dampening) * d;
                d = so->nesterov ? d + so->momentum * buf[i] : buf[i];
            }
            p[i] -= so->lr * d;
        }
}

/* PyTorch 1.13's _single_tensor_adamw in double. */
static void ref_adamw(const struct spec_optim *so, double p[N], double m[N], double v[N])
{
    for (int i = 0; i < N; i++) {
        p[i] = P0[i];
        m[i] = v[i] = 0;
    }
    for (int s = 1; s <= 3; s++) {
        const double bc1 = 1 - pow(so->beta1, s), bc2 = 1 - pow(so->beta2, s);
        for (int i = 0; i < N; i++) {
            const double g = G[s - 1][i];
            p[i] *= 1 - so->lr * so->weight_decay;
            m[i] = m[i] * so->beta1 + (1 - so->beta1) * g;
            v[i] = v[i] * so->beta2 + (1 - so->beta2) * g * g;
            const double denom = sqrt(v[i]) / sqrt(bc2) + so->eps;
            p[i] -= so->lr / bc1 * m[i] / denom;
        }
    }
}

static void check_close(const char *what, const float *got, const double *want)
{
    for (int i = 0; i < N; i++) {
        if (!(fabs(got[i] - want[i]) <= 1e-7 + 1e-6 * fabs(want[i])))
            fprintf(stderr, "%s[%d]\n", what, i);
        CHECK_NEAR(got[i], want[i], 1e-7, 1e-6);
    }
}

static void test_sgd_formulas(struct dev d)
{
    static const struct spec_optim cases[] = {
        {.kind = OPTIM_SGD, .lr = 0.1},
        {.kind = OPTIM_SGD, .lr = 0.05, .momentum = 0.9},
        {.kind = OPTIM_SGD, .lr = 0.05, .momentum = 0.8, .dampening = 0.3},
        {.kind = OPTIM_SGD, .lr = 0.1, .momentum = 0.9, .nesterov = true},
        {.kind = OPTIM_SGD, .lr = 0.2, .weight_decay = 0.05},
        {.kind = OPTIM_SGD, .lr = 0.1, .momentum = 0.9, .nesterov = true, .weight_decay = 0.01},
        {.kind = OPTIM_SGD, .lr = 0.05, .momentum = 0.8, .dampening = 0.3, .weight_decay = 0.1},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        float p[N], st[2][N];
        double rp[N], rb[N] = {0};
        int ns;
        run3(d, &cases[c], p, st, &ns);
        ref_sgd(&cases[c], rp, rb);
        check_close("sgd param", p, rp);
        CHECK_EQ_INT(ns, cases[c].momentum != 0 ? 1 : 0);
        if (ns)
            check_close("sgd momentum_buffer", st[0], rb);
    }
    /* The first momentum step is buf = grad, undamped: with dampening 0.3, after one
     * step the buffer is exactly the gradient. */
    struct spec_optim so = {.kind = OPTIM_SGD, .lr = 0.1, .momentum = 0.9, .dampening = 0.3};
    struct model *m = one_param_model(d);
    struct optim *o = optim_new(&so, m);
    struct param *p = model_param(m, 0);
    d.ops->to_device(d.ctx, p->grad, G[0], sizeof G[0]);
    optim_step(o);
    float buf[N];
    d.ops->to_host(d.ctx, buf, optim_state_at(o, 0, NULL, 0, NULL), sizeof buf);
    CHECK(memcmp(buf, G[0], sizeof buf) == 0);
    optim_free(o);
    model_free(m);
}

static void test_adamw_formulas(struct dev d)
{
    static const struct spec_optim cases[] = {
        {.kind = OPTIM_ADAMW, .lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 1e-2},
        {.kind = OPTIM_ADAMW, .lr = 0.1, .beta1 = 0.8, .beta2 = 0.9, .eps = 1e-3, .weight_decay = 0.5},
        {.kind = OPTIM_ADAMW, .lr = 0.01, .beta1 = 0.5, .beta2 = 0.99, .eps = 1e-6},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        float p[N], st[2][N];
        double rp[N], rm[N], rv[N];
        int ns;
        run3(d, &cases[c], p, st, &ns);
        ref_adamw(&cases[c], rp, rm, rv);
        check_close("adamw param", p, rp);
        CHECK_EQ_INT(ns, 2);
        check_close("adamw exp_avg", st[0], rm);
        check_close("adamw exp_avg_sq", st[1], rv);
    }
}

/* Numbers from PyTorch 1.13 itself (python3-torch 1.13.1 on this x86-64 host, AVX2
 * kernels, one thread), printed with "%.9g":
 *   p0 = [0.5, -1.25, 2.0, 0.1, -0.3, 0.75, -2.5, 1.5, 0.0, -0.05, 3.0]
 *   G = [[0.1*(i+1)*(-1)**i for i in range(11)], [0.3 - 0.07*i for i in range(11)],
 *        [(-0.2 + 0.05*i)*(1 if i%3 else -2) for i in range(11)]]
 *   p = torch.nn.Parameter(torch.tensor(p0)); opt = <optimizer>([p])
 *   for g in G: p.grad = torch.tensor(g); opt.step()
 * With 11 elements PyTorch runs both its vector loop (8) and its scalar tail (3). Where
 * our fused path is on (a CPU with AVX2+FMA, like the one that made these) the results
 * must be the same bits; otherwise within float rounding. */
struct torch_case {
    const char *what;
    struct spec_optim so;
    float param[N], state[2][N];
};

static const struct torch_case TORCH[] = {
    {"SGD(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)",
     {.kind = OPTIM_SGD, .lr = 0.1, .momentum = 0.9, .nesterov = true, .weight_decay = 0.01},
     {0.304503649f, -1.20512891f, 1.85676634f, 0.192987353f, -0.474437684f, 0.953728139f, -2.6494453f,
      1.78516555f, -0.276217639f, 0.477583498f, 2.64999247f},
     {{0.76350677f, -0.138349771f, 0.339444757f, -0.138700753f, 0.412642747f, -0.457977563f, 0.188544437f,
       -0.624550521f, 0.691519201f, -1.60330844f, 0.908012509f}}},
    {"SGD(lr=0.05, momentum=0.8, dampening=0.3, weight_decay=0.1)",
     {.kind = OPTIM_SGD, .lr = 0.05, .momentum = 0.8, .dampening = 0.3, .weight_decay = 0.1},
     {0.444037288f, -1.20753169f, 1.9131788f, 0.137196794f, -0.355365396f, 0.807772636f, -2.51560211f,
      1.57090604f, -0.0998853967f, 0.110716432f, 2.81536913f},
     {{0.604779363f, -0.339003742f, 0.58617413f, -0.113300793f, 0.269953281f, -0.229790211f, -0.237382993f,
       -0.222395003f, 0.562858045f, -1.17434609f, 1.24752212f}}},
    {"AdamW(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2)",
     {.kind = OPTIM_ADAMW, .lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 1e-2},
     {0.497126162f, -1.24888694f, 1.99748063f, 0.101703919f, -0.302230805f, 0.752216101f, -2.50168371f,
      1.50229073f, -0.00190097024f, -0.0472476371f, 2.99809504f},
     {{0.0750999972f, -0.0105000008f, 0.0286999997f, -0.0143000009f, 0.0422999971f, -0.0480999984f,
       0.0259000007f, -0.0669f, 0.0694999918f, -0.160699993f, 0.083100006f},
      {0.000259890017f, 0.000115267154f, 0.000125394508f, 0.000177772075f, 0.000249899866f, 0.00036427789f,
       0.000543406117f, 0.000697284588f, 0.000915913202f, 0.00135679217f, 0.00145742134f}}},
    {"AdamW(lr=0.1, betas=(0.8, 0.9), eps=1e-3, weight_decay=0.5)",
     {.kind = OPTIM_ADAMW, .lr = 0.1, .beta1 = 0.8, .beta2 = 0.9, .eps = 1e-3, .weight_decay = 0.5},
     {0.157000825f, -0.979212105f, 1.49067461f, 0.233238369f, -0.461601436f, 0.846658409f, -2.29614782f,
      1.49893951f, -0.171549767f, 0.216912597f, 2.40893078f},
     {{0.140800014f, -0.0188000016f, 0.0440000035f, -0.0168000031f, 0.0672000051f, -0.074800007f,
       0.0304000061f, -0.102800012f, 0.113599993f, -0.280800015f, 0.136800021f},
      {0.0249100011f, 0.0102509996f, 0.0105940001f, 0.0146890003f, 0.0202859994f, 0.029635001f, 0.0449859984f,
       0.0573390014f, 0.0756939873f, 0.115800992f, 0.121410005f}}},
};

static void test_torch_numbers(struct dev d, bool fused)
{
    for (size_t c = 0; c < sizeof TORCH / sizeof TORCH[0]; c++) {
        const struct torch_case *t = &TORCH[c];
        float p[N], st[2][N];
        int ns;
        run3(d, &t->so, p, st, &ns);
        for (int i = 0; i < N; i++) {
            CHECK_NEAR(p[i], t->param[i], 1e-7, 1e-6);
            for (int k = 0; k < ns; k++)
                CHECK_NEAR(st[k][i], t->state[k][i], 1e-10, 1e-6);
        }
        if (fused) {
            bool same = memcmp(p, t->param, sizeof p) == 0;
            for (int k = 0; k < ns; k++)
                same &= memcmp(st[k], t->state[k], sizeof st[k]) == 0;
            if (!same)
                fprintf(stderr, "%s: not PyTorch's bits\n", t->what);
            CHECK(same);
        }
    }
}

static struct model *mlp(struct dev d)
{
    static struct spec s;
    memset(&s, 0, sizeof s);
    s.n_layers = 3;
    s.layers[0] = (struct spec_layer){.kind = LAYER_LINEAR, .in = 4, .out = 3, .bias = true};
    s.layers[1] = (struct spec_layer){.kind = LAYER_RELU, .in = 3, .out = 3};
    s.layers[2] = (struct spec_layer){.kind = LAYER_LINEAR, .in = 3, .out = 2, .bias = true};
    spec_flat_layers(&s);
    return model_new(d, &s, 8);
}

static void test_state(struct dev d)
{
    struct model *m = mlp(d);
    char name[64];
    const struct param *like;

    struct spec_optim plain = {.kind = OPTIM_SGD, .lr = 0.1};
    struct optim *o = optim_new(&plain, m);
    CHECK_EQ_INT(optim_state_count(o), 0);
    CHECK_EQ_INT(optim_steps(o), 0);
    optim_step(o);
    CHECK_EQ_INT(optim_steps(o), 1);
    CHECK_EQ_INT(optim_state_count(o), 0);
    optim_free(o);

    struct spec_optim mom = {.kind = OPTIM_SGD, .lr = 0.1, .momentum = 0.9};
    o = optim_new(&mom, m);
    CHECK_EQ_INT(optim_state_count(o), 4);
    static const char *sgd_names[] = {"0.weight.momentum_buffer", "0.bias.momentum_buffer",
                                      "2.weight.momentum_buffer", "2.bias.momentum_buffer"};
    for (int i = 0; i < 4; i++) {
        float *t = optim_state_at(o, i, name, sizeof name, &like);
        CHECK(t != NULL);
        CHECK_EQ_STR(name, sgd_names[i]);
        CHECK(like == model_param(m, i));
    }
    /* Truncation of a short name buffer is safe. */
    optim_state_at(o, 0, name, 5, NULL);
    CHECK_EQ_STR(name, "0.we");
    optim_free(o);

    struct spec_optim aw = {.kind = OPTIM_ADAMW, .lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8};
    o = optim_new(&aw, m);
    CHECK_EQ_INT(optim_state_count(o), 8);
    static const char *aw_names[] = {"0.weight.exp_avg",  "0.weight.exp_avg_sq", "0.bias.exp_avg",
                                     "0.bias.exp_avg_sq", "2.weight.exp_avg",    "2.weight.exp_avg_sq",
                                     "2.bias.exp_avg",    "2.bias.exp_avg_sq"};
    float *seen[8];
    for (int i = 0; i < 8; i++) {
        seen[i] = optim_state_at(o, i, name, sizeof name, &like);
        CHECK_EQ_STR(name, aw_names[i]);
        CHECK(like == model_param(m, i / 2));
        for (int j = 0; j < i; j++)
            CHECK(seen[j] != seen[i]);
    }
    optim_free(o);
    optim_free(NULL);
    model_free(m);
}

/* optim_restore: buffers restored from a checkpoint count as existing, so the next step
 * is buf = momentum*buf + (1-dampening)*grad, not buf = grad; and AdamW's bias
 * corrections continue from the restored step. Both must equal an uninterrupted run. */
static void test_restore(struct dev d)
{
    static const struct spec_optim cases[] = {
        {.kind = OPTIM_SGD, .lr = 0.05, .momentum = 0.8, .dampening = 0.3, .weight_decay = 0.1},
        {.kind = OPTIM_ADAMW, .lr = 0.1, .beta1 = 0.8, .beta2 = 0.9, .eps = 1e-3, .weight_decay = 0.5},
    };
    for (int c = 0; c < 2; c++) {
        float full[N], st_full[2][N];
        int ns;
        run3(d, &cases[c], full, st_full, &ns);

        /* Two steps, "checkpoint", a fresh optimizer restored from it, the third step. */
        struct model *m = one_param_model(d);
        struct param *p = model_param(m, 0);
        struct optim *o = optim_new(&cases[c], m);
        float saved[2][N];
        for (int s = 0; s < 2; s++) {
            d.ops->to_device(d.ctx, p->grad, G[s], sizeof G[s]);
            optim_step(o);
        }
        for (int k = 0; k < ns; k++)
            d.ops->to_host(d.ctx, saved[k], optim_state_at(o, k, NULL, 0, NULL), sizeof saved[k]);
        optim_free(o);
        o = optim_new(&cases[c], m);
        CHECK_EQ_INT(optim_state_count(o), ns);
        for (int k = 0; k < ns; k++)
            d.ops->to_device(d.ctx, optim_state_at(o, k, NULL, 0, NULL), saved[k], sizeof saved[k]);
        optim_restore(o, 2);
        CHECK_EQ_INT(optim_steps(o), 2);
        d.ops->to_device(d.ctx, p->grad, G[2], sizeof G[2]);
        optim_step(o);
        CHECK_EQ_INT(optim_steps(o), 3);
        float got[N];
        d.ops->to_host(d.ctx, got, p->data, sizeof got);
        CHECK(memcmp(got, full, sizeof got) == 0);
        optim_free(o);

        /* optim_restore(o, 0) means no buffer yet: the next SGD step sets buf = grad. */
        if (cases[c].kind == OPTIM_SGD) {
            o = optim_new(&cases[c], m);
            float junk[N];
            for (int i = 0; i < N; i++)
                junk[i] = 100.0f;
            d.ops->to_device(d.ctx, optim_state_at(o, 0, NULL, 0, NULL), junk, sizeof junk);
            optim_restore(o, 0);
            optim_step(o);
            float buf[N];
            d.ops->to_host(d.ctx, buf, optim_state_at(o, 0, NULL, 0, NULL), sizeof buf);
            for (int i = 0; i < N; i++)
                CHECK(fabsf(buf[i]) < 50.0f); /* grad + wd*param, not 0.8*100 + ... */
            optim_free(o);
        }
        model_free(m);
    }
}

/* The schedule formula of §2a, each type, with its edges. */
static void test_schedule(void)
{
    struct spec_optim o = {.kind = OPTIM_SGD, .lr = 0.1};
    /* constant, no warmup: lr at every step, also past the end */
    for (int64_t st = 1; st <= 12; st++)
        CHECK_NEAR(optim_schedule_lr(&o, st, 10), 0.1, 0, 0);
    /* warmup: lr*s/W up to and including W, then the schedule from there */
    o.warmup_steps = 4;
    CHECK_NEAR(optim_schedule_lr(&o, 1, 10), 0.1 * 1 / 4, 0, 0);
    CHECK_NEAR(optim_schedule_lr(&o, 3, 10), 0.1 * 3 / 4, 0, 0);
    CHECK_NEAR(optim_schedule_lr(&o, 4, 10), 0.1, 0, 0);
    CHECK_NEAR(optim_schedule_lr(&o, 5, 10), 0.1, 0, 0);
    /* linear from lr at W to min_lr at S, S from the job when total_steps is 0 */
    o.schedule = SCHED_LINEAR;
    o.min_lr = 0.01;
    CHECK_NEAR(optim_schedule_lr(&o, 4, 10), 0.1, 0, 0);
    CHECK_NEAR(optim_schedule_lr(&o, 7, 10), 0.1 + (0.01 - 0.1) * 0.5, 1e-15, 0);
    CHECK_NEAR(optim_schedule_lr(&o, 10, 10), 0.01, 1e-15, 0);
    CHECK_NEAR(optim_schedule_lr(&o, 25, 10), 0.01, 1e-15, 0); /* s > S: p stays 1 */
    o.total_steps = 24;                                        /* the spec's S wins */
    CHECK_NEAR(optim_schedule_lr(&o, 14, 10), 0.1 + (0.01 - 0.1) * 0.5, 1e-15, 0);
    /* cosine: lr at p = 0, the midpoint at p = 1/2, min_lr from p = 1 on */
    o.schedule = SCHED_COSINE;
    o.total_steps = 0;
    CHECK_NEAR(optim_schedule_lr(&o, 4, 10), 0.1, 1e-15, 0);
    CHECK_NEAR(optim_schedule_lr(&o, 7, 10), 0.055, 1e-15, 0);
    CHECK_NEAR(optim_schedule_lr(&o, 5, 10), 0.01 + 0.09 * (1 + cos(M_PI / 6)) / 2, 1e-15, 0);
    CHECK_NEAR(optim_schedule_lr(&o, 10, 10), 0.01, 1e-15, 0);
    CHECK_NEAR(optim_schedule_lr(&o, 11, 10), 0.01, 1e-15, 0);
    /* S <= W: nothing after the warmup to schedule over, min_lr right after it */
    CHECK_NEAR(optim_schedule_lr(&o, 4, 3), 0.1, 0, 0);
    CHECK_NEAR(optim_schedule_lr(&o, 5, 3), 0.01, 1e-15, 0);
    /* warmup 1: full lr at the first step */
    o.warmup_steps = 1;
    CHECK_NEAR(optim_schedule_lr(&o, 1, 10), 0.1, 0, 0);
}

/* optim_set_lr feeds the update: AdamW's decay and step size take the step's lr. */
static void test_set_lr(struct dev d)
{
    struct spec_optim so = {
        .kind = OPTIM_ADAMW, .lr = 0.5, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.1};
    struct spec_optim at = so;
    at.lr = 0.02;
    const struct adamw_hyper want = optim_adamw_hyper(&at, 1);
    struct model *m = one_param_model(d);
    struct optim *o = optim_new(&so, m);
    struct param *p = model_param(m, 0);
    d.ops->to_device(d.ctx, p->grad, G[0], sizeof G[0]);
    optim_set_lr(o, 0.02);
    optim_step(o);
    float got[N];
    d.ops->to_host(d.ctx, got, p->data, sizeof got);
    for (int i = 0; i < N; i++) {
        /* the first AdamW step: p*decay - step_size * g/|g|-ish, from the same scalars */
        const float g = G[0][i], ea = want.one_minus_beta1 * g, es = want.one_minus_beta2 * g * g;
        const float expect =
            P0[i] * want.decay + want.neg_step_size * (ea / (sqrtf(es) / want.bc2_sqrt + want.eps));
        CHECK_NEAR(got[i], expect, 1e-6, 1e-5);
    }
    optim_free(o);
    model_free(m);
}

/* clip_grad_norm_ against PyTorch 1.13's own numbers: weight [1,11] with G[0] and a bias
 * of 2.5, max_norm 1 (clips), then max_norm 10 (leaves the gradients alone). */
static void test_clip(struct dev d)
{
    static struct spec s;
    memset(&s, 0, sizeof s);
    s.n_layers = 1;
    s.layers[0] = (struct spec_layer){.kind = LAYER_LINEAR, .in = N, .out = 1, .bias = true};
    spec_flat_layers(&s);
    struct model *m = model_new(d, &s, 1);
    CHECK(m != NULL);
    struct spec_optim so = {.kind = OPTIM_SGD, .lr = 0.1};
    struct optim *o = optim_new(&so, m);
    struct param *w = model_param(m, 0), *b = model_param(m, 1);
    const float bias = 2.5f;
    static const float want_w[N] = {0.02973504364490509f,  -0.05947008728981018f, 0.08920513093471527f,
                                    -0.11894017457962036f, 0.14867521822452545f,  -0.17841026186943054f,
                                    0.20814530551433563f,  -0.23788034915924072f, 0.2676153779029846f,
                                    -0.2973504364490509f,  0.3270854949951172f};
    float gw[N], gb;
    for (int round = 0; round < 2; round++) {
        d.ops->to_device(d.ctx, w->grad, G[0], sizeof G[0]);
        d.ops->to_device(d.ctx, b->grad, &bias, sizeof bias);
        const double norm = optim_clip_grad_norm(o, round == 0 ? 1.0 : 10.0);
        CHECK_NEAR(norm, 3.363034248352051, 1e-6, 0);
        d.ops->to_host(d.ctx, gw, w->grad, sizeof gw);
        d.ops->to_host(d.ctx, &gb, b->grad, sizeof gb);
        for (int i = 0; i < N; i++)
            CHECK_NEAR(gw[i], round == 0 ? want_w[i] : G[0][i], 1e-7, 1e-6);
        CHECK_NEAR(gb, round == 0 ? 0.7433760762214661 : 2.5, 1e-7, 1e-6);
    }
    optim_free(o);
    model_free(m);
}

int main(void)
{
    make_grads();
    struct dev d = dev_cpu_new(1);
    const bool fused = dev_cpu_set_fused(d, true);
    dev_cpu_set_fused(d, fused);
    for (int f = 0; f < (fused ? 2 : 1); f++) {
        dev_cpu_set_fused(d, f == 0 ? fused : false);
        test_sgd_formulas(d);
        test_adamw_formulas(d);
        test_torch_numbers(d, f == 0 && fused);
    }
    dev_cpu_set_fused(d, fused);
    test_state(d);
    test_restore(d);
    test_schedule();
    test_set_lr(d);
    test_clip(d);
    dev_cpu_free(d);
    CHECK_DONE();
}
