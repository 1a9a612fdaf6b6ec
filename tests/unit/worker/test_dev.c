/* test_dev.c — the CPU backend's ops against straightforward double-precision
 * references on random shapes (1x1 and odd sizes included), losses on inputs with known
 * values, and the places where the backend promises PyTorch's exact bits (the bias
 * gradient's summation order). Every op runs with fused multiply-adds off and on. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "worker/dev.h"
#include "worker/optim.h"
#include "worker/rng.h"

static struct dev D;
#define OPS D.ops
#define CTX D.ctx

static float *dalloc(int64_t n)
{
    return OPS->alloc(CTX, (size_t)(n > 0 ? n : 1) * sizeof(float));
}
static void dfree(void *p)
{
    OPS->free(CTX, p);
}

static void randn(struct rng *r, float *x, int64_t n, double scale)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)(scale * rng_normal(r));
}

/* Largest |a - b| relative to atol + rtol*|b| over n entries; <= 1 means all close. */
static double worst(const float *a, const double *b, int64_t n, double atol, double rtol)
{
    double w = 0;
    for (int64_t i = 0; i < n; i++) {
        double diff = fabs((double)a[i] - b[i]);
        double e = diff == 0 ? 0 : diff / (atol + rtol * fabs(b[i]));
        if (!(e <= w)) /* NaN counts as worst */
            w = isnan(e) ? INFINITY : e;
    }
    return w;
}

static void test_memory(void)
{
    float *p = OPS->alloc(CTX, 1000 * sizeof(float));
    CHECK(p != NULL);
    CHECK_EQ_INT((uintptr_t)p % 64, 0);
    int zero = 1;
    for (int i = 0; i < 1000; i++)
        zero &= p[i] == 0.0f;
    CHECK(zero);
    float h[3] = {1, 2, 3}, back[3] = {0};
    OPS->to_device(CTX, p, h, sizeof h);
    OPS->synchronize(CTX);
    OPS->to_host(CTX, back, p, sizeof back);
    CHECK(back[0] == 1 && back[1] == 2 && back[2] == 3);
    dfree(p);
    void *z = OPS->alloc(CTX, 0);
    CHECK(z != NULL);
    dfree(z);
    CHECK_EQ_STR(OPS->name, "cpu");
    /* No GPU is required; the call must simply answer. */
    (void)dev_cuda_available();
}

static void test_gemm(struct rng *r)
{
    static const int64_t shapes[][3] = {{1, 1, 1}, {1, 7, 1},    {3, 5, 7},     {17, 1, 9},
                                        {8, 8, 8}, {33, 65, 17}, {64, 10, 130}, {5, 129, 3}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        for (int t = 0; t < 4; t++) {
            const bool ta = t & 1, tb = t & 2;
            /* Stored shapes: A is [M,K] or [K,M], B is [K,N] or [N,K]; padded strides
             * check that lda/ldb/ldc are honoured. */
            const int64_t lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 2, ldc = N + 1;
            const int64_t arows = ta ? K : M, brows = tb ? N : K;
            float *a = dalloc(arows * lda), *b = dalloc(brows * ldb), *c = dalloc(M * ldc);
            randn(r, a, arows * lda, 1);
            randn(r, b, brows * ldb, 1);
            randn(r, c, M * ldc, 1);
            double *ref = malloc((size_t)(M * N) * sizeof(double));
            float got[200 * 200];
            const float alpha = 0.75f, beta = t == 3 ? 0.0f : -1.5f;
            for (int64_t i = 0; i < M; i++)
                for (int64_t j = 0; j < N; j++) {
                    double acc = 0;
                    for (int64_t k = 0; k < K; k++) {
                        double av = ta ? a[k * lda + i] : a[i * lda + k];
                        double bv = tb ? b[j * ldb + k] : b[k * ldb + j];
                        acc += av * bv;
                    }
                    ref[i * N + j] = alpha * acc + (beta != 0.0f ? beta * c[i * ldc + j] : 0.0);
                }
            OPS->gemm(CTX, ta, tb, M, N, K, alpha, a, lda, b, ldb, beta, c, ldc);
            for (int64_t i = 0; i < M; i++)
                for (int64_t j = 0; j < N; j++)
                    got[i * N + j] = c[i * ldc + j];
            double w = worst(got, ref, M * N, 1e-5 * sqrt((double)K), 1e-5);
            if (!(w <= 1))
                fprintf(stderr, "gemm %" PRId64 "x%" PRId64 "x%" PRId64 " ta=%d tb=%d: worst %g\n", M, N, K,
                        ta, tb, w);
            CHECK(w <= 1);
            free(ref);
            dfree(a);
            dfree(b);
            dfree(c);
        }
    }
}

static void test_bias(struct rng *r)
{
    static const int64_t shapes[][2] = {{1, 1},    {1, 7},    {2, 1},    {5, 1},   {9, 1},
                                        {1000, 1}, {3, 5},    {37, 4},   {16, 9},  {17, 33},
                                        {128, 40}, {300, 13}, {70, 100}, {4100, 3}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int64_t M = shapes[s][0], N = shapes[s][1];
        float *y = dalloc(M * N), *b = dalloc(N), *db = dalloc(N);
        randn(r, y, M * N, 1);
        randn(r, b, N, 1);
        randn(r, db, N, 1);
        double *ref = malloc((size_t)(M * N + N) * sizeof(double));
        for (int64_t i = 0; i < M * N; i++)
            ref[i] = y[i] + b[i % N]; /* one float add: the op must give exactly this */
        for (int64_t j = 0; j < N; j++) {
            double acc = db[j];
            for (int64_t i = 0; i < M; i++)
                acc += y[i * N + j];
            ref[M * N + j] = acc;
        }
        /* bias_grad reads dy = y before add_bias changes it. */
        OPS->bias_grad(CTX, db, y, M, N);
        CHECK(worst(db, ref + M * N, N, 1e-6 * sqrt((double)M), 1e-6) <= 1);
        OPS->add_bias(CTX, y, b, M, N);
        CHECK(worst(y, ref, M * N, 0, 0) <= 1);
        /* set_bias: the bits of fill(y, 0) then add_bias, -0.0 in b included (0 + -0 = +0). */
        float *z = dalloc(M * N);
        b[N - 1] = -0.0f;
        OPS->fill(CTX, y, 0.0f, M * N);
        OPS->add_bias(CTX, y, b, M, N);
        OPS->set_bias(CTX, z, b, M, N);
        CHECK(memcmp(y, z, (size_t)(M * N) * sizeof(float)) == 0);
        CHECK(!signbit(z[N - 1]));
        dfree(z);
        free(ref);
        dfree(y);
        dfree(b);
        dfree(db);
    }
}

/* dy[i,j] = float((i*37 + j*11) % 101 - 50) / 7; the expected sums are PyTorch 1.13's
 * dy.sum(0) on this machine, produced by
 *   k = ((i*37 + j*11) % 101 - 50).astype(np.float32); t = torch.from_numpy(k / np.float32(7))
 *   torch.set_num_threads(1); print(t.sum(0)[cols])
 * with "%.9g". A plain running sum gives different bits for every case below, so this
 * pins the cascade order (dev/cpu.c). */
static void test_bias_grad_torch_bits(void)
{
    static const struct {
        int64_t m, n;
        int cols[5];
        float want[5];
        int k;
    } cases[] = {
        {128, 40, {0, 7, 31, 32, 39}, {-11.2857113f, 11.5714273f, 5.42856884f, 4.57142544f, -1.42857218f}, 5},
        {1000, 1, {0}, {1.42856979f}, 1},
        {37, 5, {0, 1, 2, 3, 4}, {-4.85714245f, -4.4285717f, -4.00000095f, -3.57142925f, -3.14285731f}, 5},
        {300, 13, {0, 3, 4, 8, 12}, {-4.57143164f, -4.28572083f, 5.42856503f, 0.999998093f, -3.42857456f}, 5},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int64_t M = cases[c].m, N = cases[c].n;
        float *dy = dalloc(M * N), *db = dalloc(N);
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++)
                dy[i * N + j] = (float)((i * 37 + j * 11) % 101 - 50) / 7.0f;
        OPS->bias_grad(CTX, db, dy, M, N);
        for (int k = 0; k < cases[c].k; k++) {
            uint32_t got, want;
            memcpy(&got, &db[cases[c].cols[k]], 4);
            memcpy(&want, &cases[c].want[k], 4);
            CHECK_EQ_INT(got, want);
        }
        dfree(dy);
        dfree(db);
    }
}

static double ref_act(layer_kind k, double x)
{
    switch (k) {
    case LAYER_RELU: return x > 0 ? x : 0;
    case LAYER_TANH: return tanh(x);
    case LAYER_SIGMOID: return 1 / (1 + exp(-x));
    case LAYER_GELU: return 0.5 * x * (1 + erf(x / sqrt(2.0)));
    default: return NAN;
    }
}

static double ref_dact(layer_kind k, double x)
{
    switch (k) {
    case LAYER_RELU: return x > 0 ? 1 : 0;
    case LAYER_TANH: return 1 - tanh(x) * tanh(x);
    case LAYER_SIGMOID: {
        double s = 1 / (1 + exp(-x));
        return s * (1 - s);
    }
    case LAYER_GELU: return 0.5 * (1 + erf(x / sqrt(2.0))) + x * exp(-0.5 * x * x) / sqrt(2 * M_PI);
    default: return NAN;
    }
}

static void test_activations(struct rng *r)
{
    static const layer_kind kinds[] = {LAYER_RELU, LAYER_TANH, LAYER_SIGMOID, LAYER_GELU};
    static const int64_t sizes[] = {1, 7, 64, 1001};
    for (size_t ki = 0; ki < 4; ki++)
        for (size_t si = 0; si < 4; si++) {
            const layer_kind k = kinds[ki];
            const int64_t n = sizes[si];
            float *x = dalloc(n), *y = dalloc(n), *dy = dalloc(n), *dx = dalloc(n);
            double *ry = malloc((size_t)n * sizeof(double)), *rdx = malloc((size_t)n * sizeof(double));
            randn(r, x, n, 3);
            randn(r, dy, n, 1);
            for (int64_t i = 0; i < n; i++) {
                ry[i] = ref_act(k, x[i]);
                rdx[i] = dy[i] * ref_dact(k, x[i]);
            }
            OPS->act_forward(CTX, k, y, x, n);
            OPS->act_backward(CTX, k, dx, dy, x, y, n);
            CHECK(worst(y, ry, n, 1e-6, 1e-5) <= 1);
            CHECK(worst(dx, rdx, n, 1e-6, 1e-5) <= 1);
            free(ry);
            free(rdx);
            dfree(x);
            dfree(y);
            dfree(dy);
            dfree(dx);
        }

    /* ReLU at and around zero: PyTorch's threshold_backward gives 0 where y <= 0. */
    float x[5] = {0.0f, -0.0f, -1.0f, 1e-30f, 2.0f}, y[5], dy[5] = {1, 1, 1, 1, 1}, dx[5];
    OPS->act_forward(CTX, LAYER_RELU, y, x, 5);
    OPS->act_backward(CTX, LAYER_RELU, dx, dy, x, y, 5);
    CHECK(y[0] == 0 && y[1] == 0 && y[2] == 0 && y[3] == 1e-30f && y[4] == 2);
    CHECK(dx[0] == 0 && dx[1] == 0 && dx[2] == 0 && dx[3] == 1 && dx[4] == 1);
    /* NaN passes through relu as in torch.relu. */
    float xn = NAN, yn;
    OPS->act_forward(CTX, LAYER_RELU, &yn, &xn, 1);
    CHECK(isnan(yn));
    /* Saturation stays finite. */
    float xs[2] = {-100.0f, 100.0f}, ys[2];
    OPS->act_forward(CTX, LAYER_SIGMOID, ys, xs, 2);
    CHECK(ys[0] >= 0 && ys[0] < 1e-30f && ys[1] == 1.0f);
    OPS->act_forward(CTX, LAYER_TANH, ys, xs, 2);
    CHECK(ys[0] == -1.0f && ys[1] == 1.0f);
}

/* GELU of PyTorch 1.13 on this machine (torch.nn.functional.gelu, then backward(dy)),
 * printed with "%.9g". PyTorch's AVX2 kernel uses a polynomial erf accurate to ~1.5e-7
 * where we call erff, hence the absolute tolerance. */
static void test_gelu_torch(void)
{
    static const float x[11] = {-3, -1.5f, -0.5f, -0.1f, 0, 0.2f, 0.7f, 1, 2.5f, 4, -6};
    static const float dy[11] = {1, -0.5f, 2, 1.5f, 1, -1, 0.25f, 3, -2, 1, 1};
    static const float want_y[11] = {
        -0.00404986739f, -0.10021086f, -0.154268786f, -0.0460172109f, 0.0f, 0.115851954f,
        0.530625463f,    0.841344714f, 2.48447585f,   3.99987316f,    0.0f};
    static const float want_dx[11] = {-0.0119456053f, 0.0637345761f, 0.26500982f,     0.630715251f,
                                      0.5f,           -0.657468319f, 0.244153529f,    3.24994612f,
                                      -2.07522202f,   1.00050366f,   -2.98023224e-08f};
    float y[11], dx[11];
    OPS->act_forward(CTX, LAYER_GELU, y, x, 11);
    OPS->act_backward(CTX, LAYER_GELU, dx, dy, x, y, 11);
    for (int i = 0; i < 11; i++) {
        CHECK_NEAR(y[i], want_y[i], 3e-7, 1e-6);
        CHECK_NEAR(dx[i], want_dx[i], 3e-7 * fabsf(dy[i]) + 1e-7, 1e-6);
    }
}

static void test_mse(struct rng *r)
{
    /* Known values: pred - target = [1, -2, 0.5, 0] over 2x2: loss = 5.25 / 4. */
    float p[4] = {1, 0, 2.5f, 3}, t[4] = {0, 2, 2, 3}, d[4], loss;
    OPS->mse(CTX, p, t, 2, 2, d, &loss);
    CHECK_NEAR(loss, 1.3125, 0, 1e-7);
    CHECK(d[0] == 0.5f && d[1] == -1.0f && d[2] == 0.25f && d[3] == 0.0f);

    static const int64_t shapes[][2] = {{1, 1}, {3, 1}, {7, 5}, {64, 33}};
    for (int s = 0; s < 4; s++) {
        const int64_t M = shapes[s][0], N = shapes[s][1], n = M * N;
        float *pr = dalloc(n), *tg = dalloc(n), *dp = dalloc(n), *l = dalloc(1);
        double *ref = malloc((size_t)n * sizeof(double)), sum = 0;
        randn(r, pr, n, 1);
        randn(r, tg, n, 1);
        for (int64_t i = 0; i < n; i++) {
            double e = (double)pr[i] - tg[i];
            sum += e * e;
            ref[i] = 2 * e / (double)n;
        }
        OPS->mse(CTX, pr, tg, M, N, dp, l);
        CHECK_NEAR(*l, sum / (double)n, 0, 1e-6);
        CHECK(worst(dp, ref, n, 1e-7, 1e-6) <= 1);
        free(ref);
        dfree(pr);
        dfree(tg);
        dfree(dp);
        dfree(l);
    }
}

static void test_cross_entropy(struct rng *r)
{
    /* Zeros: every row's loss is log(C); the gradient is (1/C - onehot) / M. */
    {
        const int64_t M = 3, C = 7;
        float x[21] = {0}, d[21], loss;
        int32_t lab[3] = {0, 6, 3};
        OPS->cross_entropy(CTX, x, lab, M, C, d, &loss);
        CHECK_NEAR(loss, log(7.0), 0, 1e-7);
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < C; j++)
                CHECK_NEAR(d[i * C + j], ((j == lab[i]) ? 1.0 / 7 - 1 : 1.0 / 7) / 3, 1e-8, 1e-6);
    }
    /* Large logits: no overflow. */
    {
        float x[4] = {1000, -1000, -1000, 1000}, d[4], loss;
        int32_t lab[2] = {0, 0};
        OPS->cross_entropy(CTX, x, lab, 2, 2, d, &loss);
        CHECK_NEAR(loss, 1000.0, 0, 1e-7); /* (0 + 2000) / 2 */
        CHECK(d[0] == 0.0f && d[1] == 0.0f);
        CHECK_NEAR(d[2], -0.5, 0, 1e-7);
        CHECK_NEAR(d[3], 0.5, 0, 1e-7);
    }
    /* One class: loss 0, gradient 0. */
    {
        float x[2] = {3, -4}, d[2], loss;
        int32_t lab[2] = {0, 0};
        OPS->cross_entropy(CTX, x, lab, 2, 1, d, &loss);
        CHECK(loss == 0.0f && d[0] == 0.0f && d[1] == 0.0f);
    }
    /* An out-of-range label poisons the loss instead of reading outside the row. */
    {
        float x[3] = {1, 2, 3}, d[3], loss;
        int32_t lab[1] = {3};
        OPS->cross_entropy(CTX, x, lab, 1, 3, d, &loss);
        CHECK(isnan(loss));
    }
    static const int64_t shapes[][2] = {{1, 2}, {5, 3}, {7, 10}, {64, 33}};
    for (int s = 0; s < 4; s++) {
        const int64_t M = shapes[s][0], C = shapes[s][1], n = M * C;
        float *x = dalloc(n), *d = dalloc(n), *l = dalloc(1);
        int32_t *lab = OPS->alloc(CTX, (size_t)M * sizeof(int32_t));
        double *ref = malloc((size_t)n * sizeof(double)), total = 0;
        randn(r, x, n, 4);
        for (int64_t i = 0; i < M; i++) {
            lab[i] = (int32_t)rng_below(r, (uint64_t)C);
            double mx = -INFINITY, s2 = 0;
            for (int64_t j = 0; j < C; j++)
                mx = fmax(mx, x[i * C + j]);
            for (int64_t j = 0; j < C; j++)
                s2 += exp(x[i * C + j] - mx);
            double lse = mx + log(s2);
            total += lse - x[i * C + lab[i]];
            for (int64_t j = 0; j < C; j++)
                ref[i * C + j] = (exp(x[i * C + j] - lse) - (j == lab[i])) / (double)M;
        }
        OPS->cross_entropy(CTX, x, lab, M, C, d, l);
        CHECK_NEAR(*l, total / (double)M, 0, 1e-6);
        CHECK(worst(d, ref, n, 1e-7, 1e-5) <= 1);
        free(ref);
        dfree(x);
        dfree(d);
        dfree(l);
        dfree(lab);
    }
}

/* One optimizer update per element against the formulas of PyTorch's optimizers in
 * double (the float op is within a few ulps of that). */
static void test_optim_ops(struct rng *r)
{
    const int64_t n = 37;
    float *p = dalloc(n), *g = dalloc(n), *b = dalloc(n), *v = dalloc(n);
    double rp[37], rb[37], rv[37];
    for (int variant = 0; variant < 6; variant++) {
        struct spec_optim so = {
            .kind = OPTIM_SGD, .lr = 0.1, .momentum = 0.9, .dampening = 0.25, .weight_decay = 0.01};
        bool first = variant == 1;
        so.nesterov = variant == 2;
        if (variant == 2)
            so.dampening = 0;
        if (variant == 3)
            so.momentum = 0;
        if (variant == 4)
            so.weight_decay = 0;
        if (variant == 5)
            so.momentum = so.weight_decay = 0;
        struct sgd_hyper h = optim_sgd_hyper(&so, first);
        randn(r, p, n, 1);
        randn(r, g, n, 1);
        randn(r, b, n, 1);
        for (int64_t i = 0; i < n; i++) {
            double d = (double)g[i] + so.weight_decay * p[i];
            double buf = b[i];
            if (so.momentum != 0) {
                buf = first ? d : so.momentum * buf + (1 - so.dampening) * d;
                d = so.nesterov ? d + so.momentum * buf : buf;
            }
            rp[i] = p[i] - so.lr * d;
            rb[i] = so.momentum != 0 ? buf : b[i];
        }
        OPS->sgd_step(CTX, &h, p, g, so.momentum != 0 ? b : NULL, n);
        CHECK(worst(p, rp, n, 1e-7, 1e-6) <= 1);
        CHECK(worst(b, rb, n, 1e-7, 1e-6) <= 1);
    }
    for (int step = 1; step <= 3; step++) {
        struct spec_optim so = {
            .kind = OPTIM_ADAMW, .lr = 0.01, .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-6, .weight_decay = 0.1};
        struct adamw_hyper h = optim_adamw_hyper(&so, step);
        randn(r, p, n, 1);
        randn(r, g, n, 1);
        randn(r, b, n, 0.1);
        for (int64_t i = 0; i < n; i++) {
            v[i] = (float)fabs(0.01 * rng_normal(r));
            double m = 0.9 * b[i] + 0.1 * g[i];
            double s = 0.99 * v[i] + 0.01 * (double)g[i] * g[i];
            double denom = sqrt(s) / sqrt(1 - pow(0.99, step)) + 1e-6;
            rp[i] = p[i] * (1 - 0.01 * 0.1) - 0.01 / (1 - pow(0.9, step)) * m / denom;
            rb[i] = m;
            rv[i] = s;
        }
        OPS->adamw_step(CTX, &h, p, g, b, v, n);
        CHECK(worst(p, rp, n, 1e-7, 1e-6) <= 1);
        CHECK(worst(b, rb, n, 1e-8, 1e-6) <= 1);
        CHECK(worst(v, rv, n, 1e-10, 1e-6) <= 1);
    }
    dfree(p);
    dfree(g);
    dfree(b);
    dfree(v);
}

static void test_helpers(void)
{
    float x[5] = {1, -2, 3, -4, 5}, y[5];
    OPS->scale(CTX, x, 0.5f, 5);
    CHECK(x[0] == 0.5f && x[1] == -1.0f && x[4] == 2.5f);
    OPS->scale_copy(CTX, y, x, -2.0f, 5);
    CHECK(y[0] == -1.0f && y[3] == 4.0f && x[3] == -2.0f);
    OPS->copy(CTX, x, y, 5);
    CHECK(x[0] == -1.0f && x[4] == -5.0f);
    OPS->fill(CTX, y, 7.0f, 4);
    CHECK(y[0] == 7.0f && y[3] == 7.0f && y[4] == -5.0f);
    OPS->fill(CTX, y, 1.0f, 0); /* n = 0 is a no-op */
    CHECK(y[0] == 7.0f);
    /* sumsq: in double, so float squares that would round away still count */
    const float z[3] = {3.0f, -4.0f, 1e-4f};
    CHECK(OPS->sumsq(CTX, z, 3) == 9.0 + 16.0 + (double)1e-4f * (double)1e-4f);
    CHECK(OPS->sumsq(CTX, z, 0) == 0.0);
}

int main(void)
{
    D = dev_cpu_new(1);
    struct rng r;
    rng_seed(&r, 42);
    const bool fused_default = dev_cpu_set_fused(D, false);
    dev_cpu_set_fused(D, fused_default);
    fprintf(stderr, "fused multiply-add by default: %s\n", fused_default ? "yes" : "no");
    test_memory();
    /* The fused path only where the CPU has FMA (set_fused refuses it elsewhere). */
    for (int fused = 0; fused < (fused_default ? 2 : 1); fused++) {
        dev_cpu_set_fused(D, fused);
        test_gemm(&r);
        test_bias(&r);
        test_bias_grad_torch_bits();
        test_activations(&r);
        test_gelu_torch();
        test_mse(&r);
        test_cross_entropy(&r);
        test_optim_ops(&r);
        test_helpers();
    }
    dev_cpu_free(D);
    CHECK_DONE();
}
