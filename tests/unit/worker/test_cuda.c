/* test_cuda.c — every op of the CUDA backend against the same op of the CPU backend (the
 * reference, itself tested in test_dev.c) on random shapes: 1x1, odd sizes, sizes past
 * one block or one optimizer chunk. The tolerance of each op is written where it is
 * checked, with the reason. Also: device memory, the pinned fetch, the group optimizer
 * launches, TF32, the v2 ops (transformer and conv-net: each skipped with a message while
 * its CPU reference is missing), and that an out-of-memory is the worker's device-failure
 * exit. The reductions at scale are test_cuda_reduce.c's. CUDA's rules for which code a
 * GPU runs (cuda_code_pick) are checked first, with or without a device; on the emulated
 * device a GPU whose compute capability the module has no code for is refused when it is
 * opened. Exits 77 (skipped) where no CUDA device is visible. */
#include <float.h>
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "cuda_bufs.h"
#include "worker/cuda/plugin.h"
#include "worker/dev.h"
#include "worker/optim.h"
#include "worker/rng.h"

struct shape {
    int64_t m, n, k;
};
static const struct shape shapes[] = {
    {1, 1, 1},      {1, 7, 3},       {3, 1, 5},     {2, 3, 1},    {17, 33, 9},
    {64, 128, 255}, {513, 257, 129}, {5, 1000, 31}, {1031, 3, 2},
};
#define NSHAPES (int)(sizeof shapes / sizeof shapes[0])

/* ---- memory ---- */

static void test_memory(void)
{
    float *d = G.ops->alloc(G.ctx, 1001 * sizeof(float));
    float *h = down(d, 1001);
    int zero = 1;
    for (int i = 0; i < 1001; i++)
        zero &= h[i] == 0.0f;
    CHECK(zero); /* alloc returns zeroed memory */
    free(h);
    float src[5] = {1, -2, 3.5f, NAN, 1e-30f}, *back = down(up(src, 5), 5);
    CHECK(memcmp(src, back, sizeof src) == 0);
    free(back);
    void *z = G.ops->alloc(G.ctx, 0);
    CHECK(z != NULL);
    G.ops->free(G.ctx, z);
    CHECK_EQ_STR(G.ops->name, "cuda");
    CHECK(!G.ops->host_memory && C.ops->host_memory);
    CHECK(dev_cuda_stream(G) != NULL && dev_cuda_stream(C) == NULL);
    CHECK_EQ_INT(dev_cuda_device(G), 0);
    /* Pinned host memory round trip. */
    float *pin = G.ops->host_alloc(G.ctx, 3 * sizeof(float));
    pin[0] = 4, pin[1] = 5, pin[2] = 6;
    float *pd = up(pin, 3);
    memset(pin, 0, 3 * sizeof(float)); /* to_device has consumed the source */
    back = down(pd, 3);
    CHECK(back[0] == 4 && back[1] == 5 && back[2] == 6);
    free(back);
    G.ops->host_free(G.ctx, pin);
}

/* ---- matrix products ---- */

/* cuBLAS and OpenBLAS add the k products in different orders: each partial sum may
 * round differently, so the error grows with k and with the size of the terms. The
 * inputs are N(0,1), so a sum of k products is about sqrt(k) and its rounding about
 * k * 2^-24 * sqrt(k); 4e-6 * k covers it with room for alpha, beta and C. TF32 keeps
 * 10 mantissa bits of each input: 2e-3 * sqrt(k) relative to the terms' size. */
static void gemm_case(const struct shape *s, bool ta, bool tb, bool tf32, struct dev g)
{
    const int64_t m = s->m, n = s->n, k = s->k;
    const int64_t lda = ta ? m : k, ldb = tb ? k : n, ldc = n;
    float *a = host_randn(m * k, 1), *b = host_randn(k * n, 1), *c = host_randn(m * n, 1);
    const float alpha = (float)(0.5 + rng_uniform(&R)), beta = rng_uniform(&R) < 0.5 ? 0.0f : 0.75f;
    float *dc = up(c, m * n), *da = up(a, m * k), *db = up(b, k * n);
    /* `g` may be a second backend with a stream of its own (TF32): it must not start
     * before G's uploads are done, nor G's download before its product. */
    G.ops->synchronize(G.ctx);
    g.ops->gemm(g.ctx, ta, tb, m, n, k, alpha, da, lda, db, ldb, beta, dc, ldc);
    g.ops->synchronize(g.ctx);
    C.ops->gemm(C.ctx, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    float *gc = down(dc, m * n);
    G.ops->free(G.ctx, da);
    G.ops->free(G.ctx, db);
    char what[96];
    snprintf(what, sizeof what, "gemm%s %lldx%lldx%lld ta=%d tb=%d", tf32 ? " tf32" : "", (long long)m,
             (long long)n, (long long)k, ta, tb);
    if (tf32)
        close_to(what, gc, c, m * n, 2e-3 * sqrt((double)k) * 4, 2e-3);
    else
        close_to(what, gc, c, m * n, 4e-6 * (double)k, 1e-5);
    free(a), free(b), free(c), free(gc);
}

static void test_gemm(struct dev tf32)
{
    for (int i = 0; i < NSHAPES; i++)
        for (int t = 0; t < 4; t++) {
            gemm_case(&shapes[i], t & 1, t & 2, false, G);
            if (tf32.ops)
                gemm_case(&shapes[i], t & 1, t & 2, true, tf32);
        }
}

/* ---- bias ---- */

static void test_bias(void)
{
    for (int i = 0; i < NSHAPES; i++) {
        const int64_t m = shapes[i].m, n = shapes[i].n;
        float *y = host_randn(m * n, 1), *b = host_randn(n, 1), *dy = host_randn(m * n, 1);
        float *db = host_randn(n, 1);
        float *gy = up(y, m * n), *gb = up(b, n), *gdy = up(dy, m * n), *gdb = up(db, n);
        G.ops->add_bias(G.ctx, gy, gb, m, n);
        C.ops->add_bias(C.ctx, y, b, m, n);
        G.ops->bias_grad(G.ctx, gdb, gdy, m, n);
        C.ops->bias_grad(C.ctx, db, dy, m, n);
        float *hy = down(gy, m * n), *hdb = down(gdb, n);
        /* One addition per entry, the same on both: exact. */
        close_to("add_bias", hy, y, m * n, 0, 0);
        /* A sum of m N(0,1) terms in another order: rounding about m * 2^-24 * sqrt(m). */
        close_to("bias_grad", hdb, db, n, 1e-6 * (double)m + 1e-6, 1e-5);
        G.ops->free(G.ctx, gb);
        G.ops->free(G.ctx, gdy);
        free(y), free(b), free(dy), free(db), free(hy), free(hdb);
    }
}

/* ---- activations ---- */

static void test_activations(void)
{
    const layer_kind kinds[] = {LAYER_RELU, LAYER_TANH, LAYER_SIGMOID, LAYER_GELU, LAYER_GELU_TANH};
    const int64_t sizes[] = {1, 2, 31, 257, 100003};
    for (size_t a = 0; a < sizeof kinds / sizeof kinds[0]; a++)
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
            const layer_kind k = kinds[a];
            const int64_t n = sizes[s];
            float *x = host_randn(n, 3), *dy = host_randn(n, 1);
            if (n > 2)
                x[0] = 0.0f, x[1] = -0.0f; /* ReLU's edge: zero passes, its gradient is 0 */
            float *y = malloc((size_t)n * sizeof(float)), *dx = malloc((size_t)n * sizeof(float));
            float *gx = up(x, n), *gdy = up(dy, n);
            float *gy = G.ops->alloc(G.ctx, (size_t)n * sizeof(float));
            float *gdx = G.ops->alloc(G.ctx, (size_t)n * sizeof(float));
            C.ops->act_forward(C.ctx, k, y, x, n);
            G.ops->act_forward(G.ctx, k, gy, gx, n);
            /* Backward from the CPU's y on both sides, so only the op itself differs. */
            float *gyc = up(y, n);
            C.ops->act_backward(C.ctx, k, dx, dy, x, y, n);
            G.ops->act_backward(G.ctx, k, gdx, gdy, gx, gyc, n);
            float *hy = down(gy, n), *hdx = down(gdx, n);
            char what[64];
            /* ReLU is a select: exact. tanhf, expf and erff differ between glibc and CUDA's
             * libdevice by up to 2 ulp, which the backward formulas carry through. */
            const double tol = k == LAYER_RELU ? 0 : 4e-7;
            /* GELU tanh: where tanh is near -1 (x down to -10 here), 1 + tanh and 1 - tanh^2
             * cancel, so 2 ulp of tanhf (1.2e-7 absolute) come out times 0.5|x| in y, and
             * times 0.5|x| * sqrt(2/pi) (1 + 3 * 0.044715 x^2) (about 60) in dx. */
            const double fwd_tol = k == LAYER_GELU_TANH ? 1e-6 : tol;
            const double bwd_tol = k == LAYER_GELU_TANH ? 1e-5 : tol;
            snprintf(what, sizeof what, "act_forward %s n=%lld",
                     k == LAYER_GELU_TANH ? "gelu_tanh" : layer_kind_name(k), (long long)n);
            close_to(what, hy, y, n, fwd_tol, 4 * tol);
            snprintf(what, sizeof what, "act_backward %s n=%lld",
                     k == LAYER_GELU_TANH ? "gelu_tanh" : layer_kind_name(k), (long long)n);
            close_to(what, hdx, dx, n, bwd_tol, 4 * tol);
            G.ops->free(G.ctx, gx);
            G.ops->free(G.ctx, gdy);
            G.ops->free(G.ctx, gyc);
            free(x), free(dy), free(y), free(dx), free(hy), free(hdx);
        }
}

/* ---- losses ---- */

static void test_mse(void)
{
    for (int i = 0; i < NSHAPES; i++) {
        const int64_t m = shapes[i].m, n = shapes[i].n, t = m * n;
        float *p = host_randn(t, 1), *y = host_randn(t, 1), *dp = malloc((size_t)t * sizeof(float));
        float loss;
        float *gp = up(p, t), *gy = up(y, t), *gdp = G.ops->alloc(G.ctx, (size_t)t * sizeof(float));
        float *gl = G.ops->alloc(G.ctx, sizeof(float));
        C.ops->mse(C.ctx, p, y, m, n, dp, &loss);
        G.ops->mse(G.ctx, gp, gy, m, n, gdp, gl);
        float *hdp = down(gdp, t), *hl = down(gl, 1);
        /* The gradient is one subtraction and one product on both: exact. The loss sums
         * in double in another order, then rounds once to float. */
        close_to("mse grad", hdp, dp, t, 0, 0);
        close_to("mse loss", hl, &loss, 1, 0, 2e-7);
        G.ops->free(G.ctx, gp);
        G.ops->free(G.ctx, gy);
        free(p), free(y), free(dp), free(hdp), free(hl);
    }
}

static void ce_case(int64_t m, int64_t n, double scale, bool bad_label)
{
    float *x = host_randn(m * n, scale), *dx = malloc((size_t)(m * n + 1) * sizeof(float));
    int32_t *lab = malloc((size_t)(m > 0 ? m : 1) * sizeof(int32_t));
    for (int64_t r = 0; r < m; r++)
        lab[r] = (int32_t)rng_below(&R, (uint64_t)n);
    if (bad_label && m > 1)
        lab[1] = (int32_t)n; /* that row's gradient and the loss become NaN on both */
    float loss;
    float *gx = up(x, m * n), *gdx = G.ops->alloc(G.ctx, (size_t)(m * n + 1) * sizeof(float));
    int32_t *glab = G.ops->alloc(G.ctx, (size_t)(m > 0 ? m : 1) * sizeof(int32_t));
    G.ops->to_device(G.ctx, glab, lab, (size_t)m * sizeof(int32_t));
    float *gl = G.ops->alloc(G.ctx, sizeof(float));
    C.ops->cross_entropy(C.ctx, x, lab, m, n, dx, &loss);
    G.ops->cross_entropy(G.ctx, gx, glab, m, n, gdx, gl);
    float *hdx = down(gdx, m * n), *hl = down(gl, 1);
    char what[80];
    /* expf differs by up to 2 ulp and the exp sum is in double on both: the gradient
     * (at most 1/m in size) within a few ulp of 1/m, the loss within a few ulp. */
    snprintf(what, sizeof what, "cross_entropy grad %lldx%lld", (long long)m, (long long)n);
    close_to(what, hdx, dx, m * n, 4e-7 / (double)(m > 0 ? m : 1), 1e-6);
    snprintf(what, sizeof what, "cross_entropy loss %lldx%lld", (long long)m, (long long)n);
    close_to(what, hl, &loss, 1, 1e-6, 1e-6);
    G.ops->free(G.ctx, gx);
    G.ops->free(G.ctx, glab);
    free(x), free(dx), free(lab), free(hdx), free(hl);
}

static void test_cross_entropy(void)
{
    for (int i = 0; i < NSHAPES; i++)
        if (shapes[i].n >= 2)
            ce_case(shapes[i].m, shapes[i].n, 2, false);
    ce_case(8, 10, 40, false); /* large logits: the max keeps exp in range */
    ce_case(5, 3, 1, true);
    ce_case(0, 4, 1, false); /* no rows: NaN, as PyTorch's mean over nothing */
    ce_case(3, 1, 1, false); /* one class: loss 0, gradient 0 */
    /* Rows over many blocks: 8,203 rows pass the grid's 1,024 blocks of 8 rows, so blocks
     * take a second row each; GPT-2's vocabulary (odd) over rows a warp strides 1,571 times. */
    ce_case(8203, 3, 2, false);
    ce_case(37, 50257, 2, false);
    ce_case(2051, 5, 1, true);
}

/* ---- optimizers: single tensors and groups ---- */

/* The update formulas are the CPU's fused path (fmaf where it fuses), so the results
 * agree to the last bit where the CPU fuses too; where it does not (no FMA), one
 * rounding of a*b+c differs: 1 ulp of the parameter per step. */
#define OPT_RTOL 4e-7
#define OPT_ATOL 1e-8

static void test_sgd(void)
{
    const int64_t sizes[] = {1, 7, 4096, 4097, 20001};
    for (int flags = 0; flags < 16; flags++)
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
            const int64_t n = sizes[s];
            struct spec_optim o = {.kind = OPTIM_SGD, .lr = 0.05};
            o.weight_decay = flags & 1 ? 0.01 : 0;
            o.momentum = flags & 2 ? 0.9 : 0;
            o.nesterov = (flags & 6) == 6;
            o.dampening = (flags & 8) && !o.nesterov ? 0.1 : 0;
            float *p = host_randn(n, 1), *g = host_randn(n, 1), *buf = host_randn(n, 1);
            float *gp = up(p, n), *gg = up(g, n), *gbuf = up(buf, n);
            for (int step = 0; step < 3; step++) {
                const struct sgd_hyper h = optim_sgd_hyper(&o, step == 0);
                C.ops->sgd_step(C.ctx, &h, p, g, o.momentum ? buf : NULL, n);
                G.ops->sgd_step(G.ctx, &h, gp, gg, o.momentum ? gbuf : NULL, n);
            }
            float *hp = down(gp, n), *hb = down(gbuf, n);
            char what[64];
            snprintf(what, sizeof what, "sgd flags=%d n=%lld", flags, (long long)n);
            close_to(what, hp, p, n, OPT_ATOL, OPT_RTOL);
            if (o.momentum)
                close_to(what, hb, buf, n, OPT_ATOL, OPT_RTOL);
            G.ops->free(G.ctx, gg);
            free(p), free(g), free(buf), free(hp), free(hb);
        }
}

static void test_adamw(void)
{
    const int64_t sizes[] = {1, 3, 4096, 4099, 70001};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        const int64_t n = sizes[s];
        struct spec_optim o = {
            .kind = OPTIM_ADAMW, .lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01};
        float *p = host_randn(n, 1), *g = host_randn(n, 1);
        float *m = calloc((size_t)n, sizeof(float)), *v = calloc((size_t)n, sizeof(float));
        float *gp = up(p, n), *gg = up(g, n), *gm = up(m, n), *gv = up(v, n);
        for (int64_t step = 1; step <= 3; step++) {
            const struct adamw_hyper h = optim_adamw_hyper(&o, step);
            C.ops->adamw_step(C.ctx, &h, p, g, m, v, n);
            G.ops->adamw_step(G.ctx, &h, gp, gg, gm, gv, n);
        }
        float *hp = down(gp, n), *hm = down(gm, n), *hv = down(gv, n);
        close_to("adamw param", hp, p, n, OPT_ATOL, OPT_RTOL);
        close_to("adamw exp_avg", hm, m, n, OPT_ATOL, OPT_RTOL);
        close_to("adamw exp_avg_sq", hv, v, n, OPT_ATOL, OPT_RTOL);
        G.ops->free(G.ctx, gg);
        free(p), free(g), free(m), free(v), free(hp), free(hm), free(hv);
    }
}

/* A group of 70 tensors (more than one launch holds: 64) of odd sizes, one of them
 * larger than a chunk: the group update equals the per-tensor CPU updates. */
#define NT 70
static void test_groups(void)
{
    int64_t numel[NT];
    float *hp[NT], *hg[NT], *s1[NT], *s2[NT], *s3[NT];
    float *dp[NT], *ds1[NT], *ds2[NT], *ds3[NT];
    const float *dg[NT];
    for (int t = 0; t < NT; t++) {
        numel[t] = t == 5 ? 9000 : 1 + (int64_t)rng_below(&R, 300);
        hp[t] = host_randn(numel[t], 1);
        hg[t] = host_randn(numel[t], 1);
        s1[t] = calloc((size_t)numel[t], sizeof(float));
        s2[t] = calloc((size_t)numel[t], sizeof(float));
        s3[t] = calloc((size_t)numel[t], sizeof(float));
        dp[t] = up(hp[t], numel[t]);
        dg[t] = up(hg[t], numel[t]);
        ds1[t] = up(s1[t], numel[t]);
        ds2[t] = up(s2[t], numel[t]);
        ds3[t] = up(s3[t], numel[t]);
    }
    struct spec_optim a = {
        .kind = OPTIM_ADAMW, .lr = 1e-2, .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-6, .weight_decay = 0.1};
    struct spec_optim s = {.kind = OPTIM_SGD, .lr = 0.1, .momentum = 0.5, .weight_decay = 0.01};
    for (int64_t step = 1; step <= 2; step++) {
        const struct adamw_hyper ha = optim_adamw_hyper(&a, step);
        const struct sgd_hyper hs = optim_sgd_hyper(&s, step == 1);
        G.ops->adamw_group(G.ctx, &ha, NT, dp, dg, ds1, ds2, numel);
        G.ops->sgd_group(G.ctx, &hs, NT, dp, dg, ds3, numel);
        for (int t = 0; t < NT; t++) {
            C.ops->adamw_step(C.ctx, &ha, hp[t], hg[t], s1[t], s2[t], numel[t]);
            C.ops->sgd_step(C.ctx, &hs, hp[t], hg[t], s3[t], numel[t]);
        }
    }
    for (int t = 0; t < NT; t++) {
        float *p = down(dp[t], numel[t]), *m = down(ds1[t], numel[t]), *v = down(ds2[t], numel[t]);
        float *b = down(ds3[t], numel[t]);
        char what[64];
        snprintf(what, sizeof what, "group tensor %d (n=%lld)", t, (long long)numel[t]);
        close_to(what, p, hp[t], numel[t], OPT_ATOL, OPT_RTOL);
        close_to(what, m, s1[t], numel[t], OPT_ATOL, OPT_RTOL);
        close_to(what, v, s2[t], numel[t], OPT_ATOL, OPT_RTOL);
        close_to(what, b, s3[t], numel[t], OPT_ATOL, OPT_RTOL);
        G.ops->free(G.ctx, (float *)dg[t]);
        free(p), free(m), free(v), free(b), free(hp[t]), free(hg[t]), free(s1[t]), free(s2[t]);
        free(s3[t]);
    }
}

/* ---- helpers and the fetch ---- */

static void test_helpers(void)
{
    /* 4,194,311: past one tensor's 1,024 blocks of 4,096 elements, so blocks stride. */
    const int64_t sizes[] = {1, 5, 1000, 300001, 4194311};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        const int64_t n = sizes[s];
        float *x = host_randn(n, 1), *y = malloc((size_t)n * sizeof(float));
        float *gx = up(x, n), *gy = G.ops->alloc(G.ctx, (size_t)n * sizeof(float));
        G.ops->scale_copy(G.ctx, gy, gx, 0.3f, n);
        C.ops->scale_copy(C.ctx, y, x, 0.3f, n);
        G.ops->scale(G.ctx, gx, -1.5f, n);
        C.ops->scale(C.ctx, x, -1.5f, n);
        float *hy = down(gy, n), *hx = dup_host(x, n);
        float *gx2 = G.ops->alloc(G.ctx, (size_t)n * sizeof(float));
        G.ops->copy(G.ctx, gx2, gx, n);
        /* gx stays on the device for sumsq below (down() would free it). */
        float *hx2 = down(gx2, n), *hxs = malloc((size_t)n * sizeof(float));
        G.ops->to_host(G.ctx, hxs, gx, (size_t)n * sizeof(float));
        /* One product per entry on both: exact. */
        close_to("scale_copy", hy, y, n, 0, 0);
        close_to("scale", hxs, x, n, 0, 0);
        close_to("copy", hx2, hx, n, 0, 0);
        float *gf = G.ops->alloc(G.ctx, (size_t)n * sizeof(float));
        G.ops->fill(G.ctx, gf, 2.5f, n);
        C.ops->fill(C.ctx, y, 2.5f, n);
        float *hf = down(gf, n);
        close_to("fill", hf, y, n, 0, 0);
        /* sumsq: double sums in another order, so equal to rounding of a double */
        const double gs = G.ops->sumsq(G.ctx, gx, n), cs = C.ops->sumsq(C.ctx, x, n);
        if (!(fabs(gs - cs) <= 1e-12 * cs)) {
            fprintf(stderr, "sumsq of %lld: cuda %.17g, cpu %.17g\n", (long long)n, gs, cs);
            CHECK(0);
        }
        G.ops->free(G.ctx, gx);
        free(x), free(y), free(hy), free(hx), free(hx2), free(hxs), free(hf);
    }
    /* fetch: queued behind the work, read later; a larger read grows the buffer. */
    float v[40], got[40];
    for (int i = 0; i < 40; i++)
        v[i] = (float)i * 0.25f;
    float *gv = up(v, 40);
    G.ops->fetch_start(G.ctx, gv, 3);
    G.ops->scale(G.ctx, gv, 2.0f, 40); /* after the fetch on the stream: not seen by it */
    G.ops->fetch_wait(G.ctx, got, 3);
    CHECK(got[0] == 0.0f && got[1] == 0.25f && got[2] == 0.5f);
    G.ops->fetch_start(G.ctx, gv, 40);
    G.ops->fetch_wait(G.ctx, got, 40);
    CHECK(got[39] == 19.5f && got[1] == 0.5f);
    G.ops->free(G.ctx, gv);
}

/* add_i64 (BatchNorm's num_batches_tracked, counted on the device): the CPU's sums. */
static void test_add_i64(void)
{
    int64_t h = (int64_t)1 << 40, c = h;
    int64_t *d = G.ops->alloc(G.ctx, sizeof h);
    G.ops->to_device(G.ctx, d, &h, sizeof h);
    for (int i = 0; i < 3; i++) {
        G.ops->add_i64(G.ctx, d, 1);
        C.ops->add_i64(C.ctx, &c, 1);
    }
    G.ops->add_i64(G.ctx, d, -5);
    C.ops->add_i64(C.ctx, &c, -5);
    G.ops->to_host(G.ctx, &h, d, sizeof h);
    CHECK(h == c && c == ((int64_t)1 << 40) - 2);
    G.ops->free(G.ctx, d);
}

/* ---- which code a GPU runs (cuda_code_pick): CUDA's rules, no device needed ---- */

static void pick(const char *list, int major, int minor, const char *want)
{
    char got[16];
    const bool ok = cuda_code_pick(list, major, minor, got, sizeof got);
    check__count++;
    if (ok != (want[0] != '\0') || strcmp(got, want))
        CHECK__FAIL("cuda_code_pick(\"%s\", %d.%d): got \"%s\" (%d), want \"%s\"", list, major, minor, got,
                    ok, want);
}

static void test_code_pick(void)
{
    const char *rel = "sm_75 sm_80 sm_86 sm_89 sm_90 sm_100 sm_120 compute_120";
    pick(rel, 7, 5, "sm_75");   /* T4 */
    pick(rel, 8, 0, "sm_80");   /* A100 */
    pick(rel, 8, 6, "sm_86");   /* A10, RTX 3090 */
    pick(rel, 8, 7, "sm_86");   /* Orin: a cubin of its major, older minor */
    pick(rel, 8, 9, "sm_89");   /* L4, L40S, RTX 4090 */
    pick(rel, 9, 0, "sm_90");   /* H100, H200 */
    pick(rel, 12, 0, "sm_120"); /* RTX 5090 */
    pick(rel, 12, 1, "sm_120");
    pick(rel, 11, 0, "");                          /* Thor: no 11.x cubin, PTX 12.0 too new */
    pick(rel, 7, 0, "");                           /* V100 under CUDA 13 */
    pick("sm_90", 8, 0, "");                       /* the build before issue 34 on an A100 */
    pick("sm_90", 8, 9, "");                       /* ... on an L40S */
    pick("sm_90", 10, 0, "");                      /* a cubin never runs on the next major version */
    pick("sm_86", 8, 0, "");                       /* nor on an older minor */
    pick("sm_90 compute_90", 10, 0, "compute_90"); /* PTX runs on newer GPUs */
    pick("compute_80 sm_90", 9, 0, "sm_90");       /* a cubin is preferred */
    pick("compute_80,compute_86", 8, 9, "compute_86");
    pick("sm_90a", 9, 0, "sm_90a");
    pick("sm_90a", 9, 1, "");
    pick("", 9, 0, "");
    pick("sm_ compute_x sm_9 sm_90b", 9, 0, "");
}

/* `test_cuda --nocode`, a fresh process on an emulated device of compute capability 7.0
 * whose module holds "sm_80 compute_90": --devices' view says so, and opening the device
 * fails naming both instead of the first kernel failing. */
static int nocode_main(void)
{
    struct dev_cuda_info info;
    memset(&info, 0, sizeof info);
    if (!dev_cuda_device_info(0, &info) || info.cc_major != 7 || info.cc_minor != 0 || info.has_code ||
        info.code[0]) {
        fprintf(stderr, "nocode: device info %d.%d has_code %d code '%s'\n", info.cc_major, info.cc_minor,
                info.has_code, info.code);
        return 1;
    }
    if (strcmp(dev_cuda_module_code(), "sm_80 compute_90")) {
        fprintf(stderr, "nocode: module code '%s'\n", dev_cuda_module_code());
        return 1;
    }
    struct ddpd_error err;
    ddpd_error_clear(&err);
    struct dev g = dev_cuda_new(0, false, &err);
    const char *want[] = {"compute capability 7.0", "sm_80 compute_90", "DDPD_CUDA_ARCHS", "no kernel image"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (!strstr(err.message, want[i])) {
            fprintf(stderr, "nocode: no '%s' in '%s'\n", want[i], err.message);
            return 1;
        }
    return g.ops == NULL && err.code == DDPD_EDEVICE ? 0 : 1;
}

static void test_nocode(void)
{
    struct dev_cuda_info info;
    memset(&info, 0, sizeof info);
    if (!dev_cuda_device_info(0, &info) || !info.emulated) {
        fprintf(stderr, "nocode: a real GPU: its compute capability cannot be chosen, skipped\n");
        return;
    }
    CHECK(info.has_code); /* the default emulated module runs on the default 9.0 */
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        setenv("DDPD_CUDA_EMU_CC", "7.0", 1);
        setenv("DDPD_CUDA_EMU_CODE", "sm_80 compute_90", 1);
        execl("/proc/self/exe", "test_cuda", "--nocode", (char *)NULL);
        _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* ---- v2 ops (CONTRACT.md §2a) ----
 * Each runs only where the CPU backend has its reference: a NULL CPU slot skips that op
 * with a message (a NULL CUDA slot fails). */

static bool have_op(const char *name, const void *cpu_slot, const void *gpu_slot)
{
    CHECK(gpu_slot != NULL);
    if (!gpu_slot)
        fprintf(stderr, "cuda: %s is NULL\n", name);
    if (!cpu_slot)
        fprintf(stderr, "%s: no CPU reference yet: not compared\n", name);
    return cpu_slot && gpu_slot;
}

#define HAVE(op) have_op(#op, (const void *)C.ops->op, (const void *)G.ops->op)

static int32_t *up_ids(const int32_t *h, int64_t n)
{
    int32_t *d = G.ops->alloc(G.ctx, (size_t)(n > 0 ? n : 1) * sizeof(int32_t));
    G.ops->to_device(G.ctx, d, h, (size_t)n * sizeof(int32_t));
    return d;
}

/* Attention's shapes: batch of heads, odd sizes, padded strides between the matrices. */
static void test_gemm_batched(void)
{
    if (!HAVE(gemm_batched))
        return;
    const int64_t cases[][4] = {{1, 1, 1, 1}, {1, 7, 3, 5}, {3, 1, 5, 2}, {4, 17, 33, 9}, {7, 64, 64, 16}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
        for (int t = 0; t < 4; t++) {
            const bool ta = t & 1, tb = t & 2;
            const int64_t batch = cases[ci][0], m = cases[ci][1], n = cases[ci][2], k = cases[ci][3];
            const int64_t lda = ta ? m : k, ldb = tb ? k : n, ldc = n;
            const int64_t sa = m * k + 3, sb = k * n + 1, sc = m * n + 2; /* gaps between matrices */
            float *a = host_randn(sa * batch, 1), *b = host_randn(sb * batch, 1),
                  *c = host_randn(sc * batch, 1);
            const float alpha = 0.125f, beta = t == 3 ? 0.5f : 0.0f;
            float *da = up(a, sa * batch), *db = up(b, sb * batch), *dc = up(c, sc * batch);
            G.ops->gemm_batched(G.ctx, ta, tb, m, n, k, alpha, da, lda, sa, db, ldb, sb, beta, dc, ldc, sc,
                                batch);
            C.ops->gemm_batched(C.ctx, ta, tb, m, n, k, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc,
                                batch);
            float *gc = down(dc, sc * batch);
            char what[96];
            snprintf(what, sizeof what, "gemm_batched %lldx%lldx%lldx%lld ta=%d tb=%d", (long long)batch,
                     (long long)m, (long long)n, (long long)k, ta, tb);
            /* As gemm: another summation order over k. The gaps are untouched on both. */
            close_to(what, gc, c, sc * batch, 4e-6 * (double)k, 1e-5);
            G.ops->free(G.ctx, da);
            G.ops->free(G.ctx, db);
            free(a), free(b), free(c), free(gc);
        }
}

static void test_embedding(void)
{
    if (!HAVE(embedding_forward) || !HAVE(embedding_backward))
        return;
    /* {ids, vocabulary, dim}: one id, one row, one column, many repeats of few rows. */
    const int64_t cases[][3] = {{1, 1, 1}, {5, 1, 3}, {7, 11, 1}, {1000, 7, 33}, {333, 500, 64}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int64_t n = cases[ci][0], v = cases[ci][1], dim = cases[ci][2];
        int32_t *ids = malloc((size_t)n * sizeof(int32_t));
        for (int64_t i = 0; i < n; i++)
            ids[i] = (int32_t)rng_below(&R, (uint64_t)v);
        float *w = host_randn(v * dim, 1), *dy = host_randn(n * dim, 1), *dw = host_randn(v * dim, 1);
        float *y = malloc((size_t)(n * dim) * sizeof(float));
        int32_t *gids = up_ids(ids, n);
        float *gw = up(w, v * dim), *gdy = up(dy, n * dim), *gdw = up(dw, v * dim);
        float *gy = G.ops->alloc(G.ctx, (size_t)(n * dim) * sizeof(float));
        C.ops->embedding_forward(C.ctx, y, w, ids, n, dim);
        G.ops->embedding_forward(G.ctx, gy, gw, gids, n, dim);
        C.ops->embedding_backward(C.ctx, dw, dy, ids, n, dim);
        G.ops->embedding_backward(G.ctx, gdw, gdy, gids, n, dim);
        float *hy = down(gy, n * dim), *hdw = down(gdw, v * dim);
        char what[80];
        /* A copy: exact. The backward adds each row's dy in position order onto dw, as the
         * CPU does (sorted runs, no atomics): exact too. */
        snprintf(what, sizeof what, "embedding_forward n=%lld dim=%lld", (long long)n, (long long)dim);
        close_to(what, hy, y, n * dim, 0, 0);
        snprintf(what, sizeof what, "embedding_backward n=%lld v=%lld dim=%lld", (long long)n, (long long)v,
                 (long long)dim);
        close_to(what, hdw, dw, v * dim, 0, 0);
        G.ops->free(G.ctx, gids);
        G.ops->free(G.ctx, gw);
        G.ops->free(G.ctx, gdy);
        free(ids), free(w), free(dy), free(dw), free(y), free(hy), free(hdw);
    }
}

static void test_layernorm(void)
{
    if (!HAVE(layernorm_forward) || !HAVE(layernorm_backward))
        return;
    /* {rows, dim}: rows not a multiple of a warp or of a block's 8 rows, dim 1 (var 0). */
    const int64_t cases[][2] = {{1, 1}, {3, 1}, {1, 5}, {33, 7}, {257, 64}, {9, 769}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
        for (int has_b = 0; has_b < 2; has_b++) {
            const int64_t rows = cases[ci][0], dim = cases[ci][1], t = rows * dim;
            const float eps = 1e-5f;
            float *x = host_randn(t, 2), *w = host_randn(dim, 1), *b = has_b ? host_randn(dim, 1) : NULL;
            for (int64_t i = 0; i < t; i++)
                x[i] += 1.5f; /* a mean away from 0 */
            float *dy = host_randn(t, 1), *dw = host_randn(dim, 1), *db = host_randn(dim, 1);
            float *y = malloc((size_t)t * sizeof(float)), *dx = malloc((size_t)t * sizeof(float));
            float *mean = malloc((size_t)rows * sizeof(float)), *rstd = malloc((size_t)rows * sizeof(float));
            float *gx = up(x, t), *gw = up(w, dim), *gb = b ? up(b, dim) : NULL, *gdy = up(dy, t);
            float *gdw = up(dw, dim), *gdb = up(db, dim);
            float *gy = G.ops->alloc(G.ctx, (size_t)t * sizeof(float));
            float *gdx = G.ops->alloc(G.ctx, (size_t)t * sizeof(float));
            float *gmean = G.ops->alloc(G.ctx, (size_t)rows * sizeof(float));
            float *grstd = G.ops->alloc(G.ctx, (size_t)rows * sizeof(float));
            C.ops->layernorm_forward(C.ctx, y, mean, rstd, x, w, b, rows, dim, eps);
            G.ops->layernorm_forward(G.ctx, gy, gmean, grstd, gx, gw, gb, rows, dim, eps);
            /* Backward from the CPU's saved statistics on both sides. */
            float *cmean = up(mean, rows), *crstd = up(rstd, rows);
            C.ops->layernorm_backward(C.ctx, dx, dw, b ? db : NULL, dy, x, mean, rstd, w, rows, dim);
            G.ops->layernorm_backward(G.ctx, gdx, gdw, b ? gdb : NULL, gdy, gx, cmean, crstd, gw, rows, dim);
            float *hy = down(gy, t), *hdx = down(gdx, t), *hm = down(gmean, rows), *hr = down(grstd, rows);
            float *hdw = down(gdw, dim), *hdb = down(gdb, dim);
            char what[96];
#define LN_WHAT(s)                                                                                           \
    snprintf(what, sizeof what, "layernorm %s %lldx%lld bias=%d", s, (long long)rows, (long long)dim, has_b)
            /* The statistics are sums of dim terms, in double here; the CPU may sum in float,
             * off by up to about dim/2 ulp (sum_err, relative). y = xhat * w + b carries them:
             * a few ulp of |xhat * w| + |b| (~ 10) more. */
            const double sum_err = 6e-8 * (double)dim;
            LN_WHAT("mean");
            close_to(what, hm, mean, rows, 1e-6 + 2 * sum_err, 1e-6);
            LN_WHAT("rstd");
            close_to(what, hr, rstd, rows, 0, 2e-6 + 2 * sum_err);
            LN_WHAT("y");
            close_to(what, hy, y, t, 1e-5 + 10 * sum_err, 1e-5);
            /* dx subtracts two row means of dy * w terms: errors of a few ulp of the terms'
             * size (rstd * |dy * w|: about 1, but 1/sqrt(eps) ~ 316 times |dy * w| where
             * dim 1 makes the variance 0) plus the means' sum_err, whatever the result's
             * size. */
            double term = 0;
            for (int64_t i = 0; i < t; i++)
                term = fmax(term, fabs((double)rstd[i / dim] * dy[i] * w[i % dim]));
            LN_WHAT("dx");
            close_to(what, hdx, dx, t, 1e-5 + 4 * sum_err + 8 * FLT_EPSILON * term, 1e-5);
            /* dw, db: sums over rows, as bias_grad. */
            LN_WHAT("dw");
            close_to(what, hdw, dw, dim, 2e-6 * (double)rows + 1e-6, 1e-5);
            if (b) {
                LN_WHAT("db");
                close_to(what, hdb, db, dim, 1e-6 * (double)rows + 1e-6, 1e-5);
            } else {
                LN_WHAT("db untouched");
                close_to(what, hdb, db, dim, 0, 0);
            }
#undef LN_WHAT
            G.ops->free(G.ctx, gx);
            G.ops->free(G.ctx, gw);
            G.ops->free(G.ctx, gb);
            G.ops->free(G.ctx, gdy);
            G.ops->free(G.ctx, cmean);
            G.ops->free(G.ctx, crstd);
            free(x), free(w), free(b), free(dy), free(dw), free(db), free(y), free(dx), free(mean),
                free(rstd);
            free(hy), free(hdx), free(hm), free(hr), free(hdw), free(hdb);
        }
}

static void test_softmax(void)
{
    if (!HAVE(softmax_forward) || !HAVE(softmax_backward))
        return;
    /* {rows, n}: causal rows come in blocks of n (rows = blocks * n); T = 1, odd lengths,
     * rows past a block of 8, a row longer than a warp many times over. */
    const int64_t cases[][2] = {{1, 1}, {3, 1}, {7, 5}, {99, 33}, {256, 128}, {3, 1000}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
        for (int causal = 0; causal < 2; causal++) {
            const int64_t n = cases[ci][1], rows = causal ? 2 * n : cases[ci][0], t = rows * n;
            const float scale = causal ? 0.125f : 1.0f;
            float *x = host_randn(t, 3), *dy = host_randn(t, 1);
            float *y = malloc((size_t)t * sizeof(float)), *dx = malloc((size_t)t * sizeof(float));
            float *gx = up(x, t), *gdy = up(dy, t);
            float *gy = G.ops->alloc(G.ctx, (size_t)t * sizeof(float));
            float *gdx = G.ops->alloc(G.ctx, (size_t)t * sizeof(float));
            C.ops->softmax_forward(C.ctx, y, x, rows, n, scale, causal);
            G.ops->softmax_forward(G.ctx, gy, gx, rows, n, scale, causal);
            float *cy = up(y, t); /* backward from the CPU's y on both sides */
            C.ops->softmax_backward(C.ctx, dx, dy, y, rows, n, scale);
            G.ops->softmax_backward(G.ctx, gdx, gdy, cy, rows, n, scale);
            float *hy = down(gy, t), *hdx = down(gdx, t);
            char what[96];
            /* expf within 2 ulp, the sum in another order (double here; the CPU may sum in
             * float, off by up to about n/2 ulp: sum_err): a few ulp of y (<= 1) more.
             * Masked entries are 0 on both (checked exactly below for the GPU). */
            const double sum_err = 6e-8 * (double)n;
            snprintf(what, sizeof what, "softmax_forward %lldx%lld causal=%d", (long long)rows, (long long)n,
                     causal);
            close_to(what, hy, y, t, 1e-7, 2e-6 + sum_err);
            if (causal) {
                int64_t nonzero = 0;
                for (int64_t r = 0; r < rows; r++)
                    for (int64_t j = r % n + 1; j < n; j++)
                        nonzero += hy[r * n + j] != 0.0f;
                CHECK_EQ_INT(nonzero, 0);
            }
            /* dy - dot cancels: a few ulp of |dy| + |dot| (about 1), and dot's sum_err,
             * times y * scale. */
            snprintf(what, sizeof what, "softmax_backward %lldx%lld causal=%d", (long long)rows, (long long)n,
                     causal);
            close_to(what, hdx, dx, t, 1e-6 + 3 * sum_err, 1e-5);
            G.ops->free(G.ctx, gx);
            G.ops->free(G.ctx, gdy);
            G.ops->free(G.ctx, cy);
            free(x), free(dy), free(y), free(dx), free(hy), free(hdx);
        }
}

static void test_heads(void)
{
    if (!HAVE(heads_split) || !HAVE(heads_split_backward) || !HAVE(heads_merge) ||
        !HAVE(heads_merge_backward))
        return;
    const int64_t cases[][4] = {{1, 1, 1, 1}, {2, 3, 1, 5}, {1, 1, 4, 8}, {3, 7, 4, 8}, {2, 33, 3, 1}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int64_t b = cases[ci][0], t = cases[ci][1], h = cases[ci][2], hd = cases[ci][3];
        const int64_t one = b * t * h * hd, three = 3 * one;
        float *qkv = host_randn(three, 1), *d3 = host_randn(three, 1), *y1 = host_randn(one, 1);
        float *q = malloc((size_t)one * sizeof(float)), *k = malloc((size_t)one * sizeof(float));
        float *v = malloc((size_t)one * sizeof(float)), *m = malloc((size_t)one * sizeof(float));
        float *mb = malloc((size_t)one * sizeof(float)), *sb = malloc((size_t)three * sizeof(float));
        float *gqkv = up(qkv, three), *gy1 = up(y1, one);
        float *gq = G.ops->alloc(G.ctx, (size_t)one * sizeof(float));
        float *gk = G.ops->alloc(G.ctx, (size_t)one * sizeof(float));
        float *gv = G.ops->alloc(G.ctx, (size_t)one * sizeof(float));
        float *gm = G.ops->alloc(G.ctx, (size_t)one * sizeof(float));
        float *gmb = G.ops->alloc(G.ctx, (size_t)one * sizeof(float));
        float *gsb = up(d3, three); /* overwritten entirely */
        C.ops->heads_split(C.ctx, q, k, v, qkv, b, t, h, hd);
        G.ops->heads_split(G.ctx, gq, gk, gv, gqkv, b, t, h, hd);
        /* The backwards of what split and merge produced: round trips on both sides. */
        C.ops->heads_split_backward(C.ctx, sb, q, k, v, b, t, h, hd);
        G.ops->heads_split_backward(G.ctx, gsb, gq, gk, gv, b, t, h, hd);
        C.ops->heads_merge(C.ctx, m, y1, b, t, h, hd);
        G.ops->heads_merge(G.ctx, gm, gy1, b, t, h, hd);
        C.ops->heads_merge_backward(C.ctx, mb, m, b, t, h, hd);
        G.ops->heads_merge_backward(G.ctx, gmb, gm, b, t, h, hd);
        float *hq = down(gq, one), *hk = down(gk, one), *hv = down(gv, one), *hm = down(gm, one);
        float *hmb = down(gmb, one), *hsb = down(gsb, three);
        char what[96];
        /* Copies: exact; and the backwards undo the forwards exactly. */
#define H_WHAT(s)                                                                                            \
    snprintf(what, sizeof what, "%s b=%lld t=%lld h=%lld hd=%lld", s, (long long)b, (long long)t,            \
             (long long)h, (long long)hd)
        H_WHAT("heads_split q");
        close_to(what, hq, q, one, 0, 0);
        H_WHAT("heads_split k");
        close_to(what, hk, k, one, 0, 0);
        H_WHAT("heads_split v");
        close_to(what, hv, v, one, 0, 0);
        H_WHAT("heads_split_backward");
        close_to(what, hsb, sb, three, 0, 0);
        close_to(what, hsb, qkv, three, 0, 0);
        H_WHAT("heads_merge");
        close_to(what, hm, m, one, 0, 0);
        H_WHAT("heads_merge_backward");
        close_to(what, hmb, mb, one, 0, 0);
        close_to(what, hmb, y1, one, 0, 0);
#undef H_WHAT
        G.ops->free(G.ctx, gqkv);
        G.ops->free(G.ctx, gy1);
        free(qkv), free(d3), free(y1), free(q), free(k), free(v), free(m), free(mb), free(sb);
        free(hq), free(hk), free(hv), free(hm), free(hmb), free(hsb);
    }
}

static void test_elementwise(void)
{
    if (!HAVE(add) || !HAVE(mul))
        return;
    const int64_t sizes[] = {1, 31, 300001};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        const int64_t n = sizes[s];
        float *a = host_randn(n, 1), *b = host_randn(n, 1), *y = malloc((size_t)n * sizeof(float));
        float *ga = up(a, n), *gb = up(b, n), *gy = G.ops->alloc(G.ctx, (size_t)n * sizeof(float));
        /* One rounding per entry on both: exact. y aliasing a is allowed. */
        C.ops->add(C.ctx, y, a, b, n);
        G.ops->add(G.ctx, gy, ga, gb, n);
        float *hy = down(gy, n);
        close_to("add", hy, y, n, 0, 0);
        C.ops->mul(C.ctx, a, a, b, n);
        G.ops->mul(G.ctx, ga, ga, gb, n);
        float *ha = down(ga, n);
        close_to("mul (aliased)", ha, a, n, 0, 0);
        G.ops->free(G.ctx, gb);
        free(a), free(b), free(y), free(hy), free(ha);
    }
}

static void test_dropout_mask(void)
{
    if (!HAVE(dropout_mask))
        return;
    const int64_t sizes[] = {1, 1000, 100003};
    const float ps[] = {0.0f, 0.1f, 0.5f, 0.9f};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
        for (size_t pi = 0; pi < sizeof ps / sizeof ps[0]; pi++) {
            const int64_t n = sizes[s];
            const uint64_t seed = 0x1234567890abcdefull + s * 31 + pi;
            float *mask = malloc((size_t)n * sizeof(float));
            float *gm = G.ops->alloc(G.ctx, (size_t)n * sizeof(float));
            C.ops->dropout_mask(C.ctx, mask, n, ps[pi], seed);
            G.ops->dropout_mask(G.ctx, gm, n, ps[pi], seed);
            float *hm = down(gm, n);
            char what[80];
            /* The same draw, so the same zeros (atol 0: a 0 matches only 0); the kept
             * value 1/(1-p) within one rounding of each other. */
            snprintf(what, sizeof what, "dropout_mask n=%lld p=%g", (long long)n, (double)ps[pi]);
            close_to(what, hm, mask, n, 0, 2.5e-7);
            free(mask), free(hm);
        }
}

/* ---- v2 conv-net ops (issue 18) ---- */

struct wcase {
    int64_t b, c, h, w;
    struct dev_window win;
};
/* 1x1, gaps (stride > kernel), overlaps with padding, non-square, one of conv-net size. */
static const struct wcase WCASES[] = {
    {1, 1, 1, 1, {1, 1, 1, 1, 0, 0}}, {2, 3, 5, 4, {2, 2, 2, 2, 0, 0}},   {1, 2, 7, 6, {3, 2, 2, 1, 1, 1}},
    {3, 1, 6, 9, {3, 3, 1, 2, 1, 0}}, {2, 2, 8, 5, {2, 3, 3, 1, 0, 1}},   {1, 3, 4, 4, {1, 1, 2, 2, 0, 0}},
    {2, 1, 9, 7, {5, 3, 2, 2, 2, 1}}, {4, 8, 32, 32, {3, 3, 1, 1, 1, 1}},
};

static int64_t out_dim(int64_t in, int64_t k, int64_t s, int64_t p)
{
    return (in + 2 * p - k) / s + 1;
}

static float *down_ids_as_float(int32_t *d, int64_t n)
{
    int32_t *h = malloc((size_t)(n > 0 ? n : 1) * sizeof(int32_t));
    float *f = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    G.ops->to_host(G.ctx, h, d, (size_t)n * sizeof(int32_t));
    G.ops->free(G.ctx, d);
    for (int64_t i = 0; i < n; i++)
        f[i] = (float)h[i];
    free(h);
    return f;
}

static void test_conv_windows(void)
{
    if (!HAVE(im2col) || !HAVE(col2im) || !HAVE(maxpool2d_forward) || !HAVE(maxpool2d_backward) ||
        !HAVE(avgpool2d_forward) || !HAVE(avgpool2d_backward))
        return;
    for (size_t t = 0; t < sizeof WCASES / sizeof WCASES[0]; t++) {
        const struct wcase *k = &WCASES[t];
        const struct dev_window *win = &k->win;
        const int64_t planes = k->b * k->c, nx = planes * k->h * k->w;
        const int64_t oh = out_dim(k->h, win->kh, win->sh, win->ph),
                      ow = out_dim(k->w, win->kw, win->sw, win->pw);
        const int64_t ny = planes * oh * ow, ncol = ny * win->kh * win->kw;
        char what[128];
#define W_WHAT(s)                                                                                            \
    snprintf(what, sizeof what, "%s b=%lld c=%lld %lldx%lld k%lldx%lld s%lldx%lld p%lldx%lld", s,            \
             (long long)k->b, (long long)k->c, (long long)k->h, (long long)k->w, (long long)win->kh,         \
             (long long)win->kw, (long long)win->sh, (long long)win->sw, (long long)win->ph,                 \
             (long long)win->pw)
        float *x = host_randn(nx, 1), *g = host_randn(ncol, 1), *dx = host_randn(nx, 1),
              *dy = host_randn(ny, 1);
        if (nx > 4)
            x[3] = NAN, x[nx - 1] = x[nx - 2]; /* a NaN wins its windows; a tie keeps the first */
        float *col = malloc((size_t)ncol * sizeof(float));
        float *gx = up(x, nx), *gg = up(g, ncol), *gdx = up(dx, nx), *gdy = up(dy, ny);
        float *gcol = G.ops->alloc(G.ctx, (size_t)ncol * sizeof(float));
        C.ops->im2col(C.ctx, col, x, k->b, k->c, k->h, k->w, win);
        G.ops->im2col(G.ctx, gcol, gx, k->b, k->c, k->h, k->w, win);
        C.ops->col2im(C.ctx, dx, g, k->b, k->c, k->h, k->w, win);
        G.ops->col2im(G.ctx, gdx, gg, k->b, k->c, k->h, k->w, win);
        float *hcol = down(gcol, ncol), *hdx = down(gdx, nx);
        /* Copies, and the CPU's additions in the CPU's order (onto dx): exact. */
        W_WHAT("im2col");
        close_to(what, hcol, col, ncol, 0, 0);
        W_WHAT("col2im");
        close_to(what, hdx, dx, nx, 0, 0);
        free(hcol), free(hdx);
        if (win->ph * 2 <= win->kh && win->pw * 2 <= win->kw) {
            float *y = malloc((size_t)ny * sizeof(float)), *fidx = malloc((size_t)ny * sizeof(float));
            int32_t *idx = malloc((size_t)ny * sizeof(int32_t));
            float *gy = G.ops->alloc(G.ctx, (size_t)ny * sizeof(float));
            int32_t *gidx = G.ops->alloc(G.ctx, (size_t)ny * sizeof(int32_t));
            gdx = G.ops->alloc(G.ctx, (size_t)nx * sizeof(float));
            C.ops->maxpool2d_forward(C.ctx, y, idx, x, planes, k->h, k->w, win);
            G.ops->maxpool2d_forward(G.ctx, gy, gidx, gx, planes, k->h, k->w, win);
            /* The backward from the CPU's indices on both sides. */
            int32_t *cidx = G.ops->alloc(G.ctx, (size_t)ny * sizeof(int32_t));
            G.ops->to_device(G.ctx, cidx, idx, (size_t)ny * sizeof(int32_t));
            C.ops->maxpool2d_backward(C.ctx, dx, dy, idx, planes, k->h, k->w, win);
            G.ops->maxpool2d_backward(G.ctx, gdx, gdy, cidx, planes, k->h, k->w, win);
            for (int64_t i = 0; i < ny; i++)
                fidx[i] = (float)idx[i];
            float *hy = down(gy, ny), *hidx = down_ids_as_float(gidx, ny);
            hdx = down(gdx, nx);
            /* Selections, and sums onto 0 in output order on both: exact. */
            W_WHAT("maxpool2d y");
            close_to(what, hy, y, ny, 0, 0);
            W_WHAT("maxpool2d indices");
            close_to(what, hidx, fidx, ny, 0, 0);
            W_WHAT("maxpool2d dx");
            close_to(what, hdx, dx, nx, 0, 0);
            free(hy), free(hidx), free(hdx);
            /* avgpool on finite inputs */
            if (nx > 4)
                x[3] = 0.5f;
            G.ops->free(G.ctx, gx);
            gx = up(x, nx);
            gy = G.ops->alloc(G.ctx, (size_t)ny * sizeof(float));
            gdx = G.ops->alloc(G.ctx, (size_t)nx * sizeof(float));
            C.ops->avgpool2d_forward(C.ctx, y, x, planes, k->h, k->w, win);
            G.ops->avgpool2d_forward(G.ctx, gy, gx, planes, k->h, k->w, win);
            C.ops->avgpool2d_backward(C.ctx, dx, dy, planes, k->h, k->w, win);
            G.ops->avgpool2d_backward(G.ctx, gdx, gdy, planes, k->h, k->w, win);
            hy = down(gy, ny);
            hdx = down(gdx, nx);
            /* The same sums in the same order, the same divisions: exact. */
            W_WHAT("avgpool2d y");
            close_to(what, hy, y, ny, 0, 0);
            W_WHAT("avgpool2d dx");
            close_to(what, hdx, dx, nx, 0, 0);
            G.ops->free(G.ctx, cidx);
            free(y), free(fidx), free(idx), free(hy), free(hdx);
        }
#undef W_WHAT
        G.ops->free(G.ctx, gx);
        G.ops->free(G.ctx, gg);
        G.ops->free(G.ctx, gdy);
        free(x), free(g), free(dx), free(dy), free(col);
    }
}

static void test_batchnorm(void)
{
    if (!HAVE(batchnorm_forward_train) || !HAVE(batchnorm_forward_eval) || !HAVE(batchnorm_backward))
        return;
    /* {n, c, s}: [B,C] (s = 1), one channel, a channel of 16384 entries (past one block). */
    const int64_t shapes[][3] = {{2, 1, 1}, {4, 3, 1}, {2, 3, 20}, {5, 2, 7}, {16, 8, 1024}, {33, 1, 1}};
    for (size_t t = 0; t < sizeof shapes / sizeof shapes[0]; t++)
        for (int affine = 0; affine < 2; affine++) {
            const int64_t n = shapes[t][0], c = shapes[t][1], s = shapes[t][2], tot = n * c * s;
            float *x = host_randn(tot, 2), *w = affine ? host_randn(c, 1) : NULL,
                  *b = affine ? host_randn(c, 1) : NULL;
            float *rm = host_randn(c, 1), *rv = host_randn(c, 1), *dy = host_randn(tot, 1);
            float *dw = host_randn(c, 1), *db = host_randn(c, 1);
            for (int64_t i = 0; i < tot; i++)
                x[i] += 0.75f; /* a mean away from 0 */
            for (int64_t i = 0; i < c; i++)
                rv[i] = 0.5f + fabsf(rv[i]);
            float *y = malloc((size_t)tot * sizeof(float)), *ye = malloc((size_t)tot * sizeof(float));
            float *dx = malloc((size_t)tot * sizeof(float));
            float *mean = malloc((size_t)c * sizeof(float)), *invstd = malloc((size_t)c * sizeof(float));
            float *gx = up(x, tot), *gw = affine ? up(w, c) : NULL, *gb = affine ? up(b, c) : NULL;
            float *grm = up(rm, c), *grv = up(rv, c), *gdy = up(dy, tot), *gdw = up(dw, c), *gdb = up(db, c);
            float *gy = G.ops->alloc(G.ctx, (size_t)tot * sizeof(float));
            float *gye = G.ops->alloc(G.ctx, (size_t)tot * sizeof(float));
            float *gdx = G.ops->alloc(G.ctx, (size_t)tot * sizeof(float));
            float *gmean = G.ops->alloc(G.ctx, (size_t)c * sizeof(float));
            float *ginv = G.ops->alloc(G.ctx, (size_t)c * sizeof(float));
            C.ops->batchnorm_forward_train(C.ctx, y, mean, invstd, rm, rv, x, w, b, n, c, s, 1e-5, 0.1);
            G.ops->batchnorm_forward_train(G.ctx, gy, gmean, ginv, grm, grv, gx, gw, gb, n, c, s, 1e-5, 0.1);
            /* Eval and backward from the CPU's statistics on both sides. */
            float *crm = up(rm, c), *crv = up(rv, c), *cmean = up(mean, c), *cinv = up(invstd, c);
            C.ops->batchnorm_forward_eval(C.ctx, ye, x, w, b, rm, rv, n, c, s, 1e-5);
            G.ops->batchnorm_forward_eval(G.ctx, gye, gx, gw, gb, crm, crv, n, c, s, 1e-5);
            C.ops->batchnorm_backward(C.ctx, dx, affine ? dw : NULL, affine ? db : NULL, dy, x, mean, invstd,
                                      w, n, c, s);
            G.ops->batchnorm_backward(G.ctx, gdx, affine ? gdw : NULL, affine ? gdb : NULL, gdy, gx, cmean,
                                      cinv, gw, n, c, s);
            float *hy = down(gy, tot), *hye = down(gye, tot), *hdx = down(gdx, tot), *hm = down(gmean, c);
            float *hi = down(ginv, c), *hrm = down(grm, c), *hrv = down(grv, c), *hdw = down(gdw, c);
            float *hdb = down(gdb, c);
            char what[96];
#define B_WHAT(str)                                                                                          \
    snprintf(what, sizeof what, "batchnorm %s n=%lld c=%lld s=%lld affine=%d", str, (long long)n,            \
             (long long)c, (long long)s, affine)
            /* The statistics are double sums in another order, rounded to float: equal
             * but for a rare last-bit tie; y carries that ulp of invstd times |xhat*w|. */
            B_WHAT("mean");
            close_to(what, hm, mean, c, 1e-7, 2.5e-7);
            B_WHAT("invstd");
            close_to(what, hi, invstd, c, 0, 2.5e-7);
            B_WHAT("running_mean");
            close_to(what, hrm, rm, c, 1e-7, 2.5e-7);
            B_WHAT("running_var");
            close_to(what, hrv, rv, c, 0, 2.5e-7);
            B_WHAT("y");
            close_to(what, hy, y, tot, 2e-6, 1e-6);
            /* Eval: the same float operations on the same statistics: exact. */
            B_WHAT("eval y");
            close_to(what, hye, ye, tot, 0, 0);
            /* dx: double math from sums in another order, rounded once: within an ulp. */
            B_WHAT("dx");
            close_to(what, hdx, dx, tot, 1e-7, 2.5e-7);
            B_WHAT("dweight");
            close_to(what, hdw, dw, c, 1e-7, 2.5e-7);
            B_WHAT("dbias");
            close_to(what, hdb, db, c, 1e-7, 2.5e-7);
#undef B_WHAT
            G.ops->free(G.ctx, gx);
            G.ops->free(G.ctx, gw);
            G.ops->free(G.ctx, gb);
            G.ops->free(G.ctx, gdy);
            G.ops->free(G.ctx, crm);
            G.ops->free(G.ctx, crv);
            G.ops->free(G.ctx, cmean);
            G.ops->free(G.ctx, cinv);
            free(x), free(w), free(b), free(rm), free(rv), free(dy), free(dw), free(db), free(y), free(ye);
            free(dx), free(mean), free(invstd), free(hy), free(hye), free(hdx), free(hm), free(hi), free(hrm);
            free(hrv), free(hdw), free(hdb);
        }
}

/* ---- a device failure is exit code 4 with an error event that names op and GPU ---- */

/* `test_cuda --oom`: a fresh process (CUDA does not survive fork) that asks for a
 * petabyte. */
static int oom_main(void)
{
    struct ddpd_error err;
    struct dev g = dev_cuda_new(0, false, &err);
    if (!g.ops)
        return 1;
    g.ops->alloc(g.ctx, (size_t)1 << 50);
    return 0; /* not reached: alloc ends the process */
}

static void test_oom_exit(void)
{
    int fds[2];
    CHECK(pipe(fds) == 0);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], 1);
        close(fds[0]);
        execl("/proc/self/exe", "test_cuda", "--oom", (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    char out[4096] = "";
    size_t len = 0;
    ssize_t r;
    while (len < sizeof out - 1 && (r = read(fds[0], out + len, sizeof out - 1 - len)) > 0)
        len += (size_t)r;
    out[len] = '\0';
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status));
    CHECK_EQ_INT(WEXITSTATUS(status), 4);
    CHECK(strstr(out, "\"event\":\"error\"") != NULL);
    CHECK(strstr(out, "\"device\"") != NULL);
    CHECK(strstr(out, "cuda: alloc on GPU 0 (") != NULL);
    CHECK(strstr(out, "out of memory") != NULL);
    if (!strstr(out, "cuda: alloc on GPU 0 ("))
        fprintf(stderr, "the child printed: %s\n", out);
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "--oom"))
        return oom_main();
    if (argc > 1 && !strcmp(argv[1], "--nocode"))
        return nocode_main();
    test_code_pick();
    if (!dev_cuda_available()) {
        fprintf(stderr, "no CUDA device visible: skipped\n");
        return check__failures ? 1 : SKIP;
    }
    struct ddpd_error err;
    ddpd_error_clear(&err);
    rng_seed(&R, 7);
    C = dev_cpu_new(1);
    G = dev_cuda_new(0, false, &err);
    if (!G.ops) {
        fprintf(stderr, "dev_cuda_new: %s\n", err.message);
        return 1;
    }
    struct dev tf32 = dev_cuda_new(0, true, &err);
    CHECK(tf32.ops != NULL);
    fprintf(stderr, "GPU 0: %s\n", dev_cuda_name(G));
    test_memory();
    test_gemm(tf32);
    test_bias();
    test_activations();
    test_mse();
    test_cross_entropy();
    test_sgd();
    test_adamw();
    test_groups();
    test_helpers();
    test_add_i64();
    test_nocode();
    test_gemm_batched();
    test_embedding();
    test_layernorm();
    test_softmax();
    test_heads();
    test_elementwise();
    test_dropout_mask();
    test_conv_windows();
    test_batchnorm();
    test_oom_exit();
    dev_cuda_free(tf32);
    dev_cuda_free(G);
    dev_cpu_free(C);
    CHECK_DONE();
}
