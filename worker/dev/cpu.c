/* dev/cpu.c — the CPU compute backend: OpenBLAS for matrix products, plain C loops for
 * the rest, one thread per rank. Every op reproduces PyTorch 1.13's CPU float32 kernels
 * operation by operation (same BLAS calls, same rounding order, fused multiply-adds
 * where PyTorch's AVX2 kernels fuse them), so that training here and in PyTorch stays
 * bit-close. It is the reference the CUDA ops are tested against. */

/* GCC 12 at -O2 vectorizes only loops whose trip count is a known multiple of the vector
 * width; these kernels have arbitrary lengths, so let the cost model decide. Contraction
 * stays off even under -std=gnu11: which multiply-adds are fused is decided explicitly
 * below (madd), to round where PyTorch rounds. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("vect-cost-model=dynamic", "fp-contract=off")
#endif

#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../dev.h"
#include "../rng_hash.h"
#include "cpu_conv.h"
#include "../../base/alloc.h"
#include "../../base/check.h"

/* OpenBLAS declares this in its cblas.h; repeated here for builds against a cblas.h
 * that lacks it (a compatible redeclaration is harmless). */
void openblas_set_num_threads(int num_threads);

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define DDPD_CPU_X86 1
#define FMA_TARGET   __attribute__((target("avx2,fma")))
#else
/* Elsewhere the fused kernels are never selected (dev_cpu_new), only compiled. */
#define DDPD_CPU_X86 0
#define FMA_TARGET
#endif
#define ALWAYS_INLINE inline __attribute__((always_inline))
/* Comparisons that cannot trap, so that a clamp in a loop becomes a vector select (the
 * results are the same: no code here reads the floating-point exception flags). */
#if defined(__GNUC__) && !defined(__clang__)
#define NO_TRAP __attribute__((optimize("no-trapping-math")))
#else
#define NO_TRAP
#endif

struct cpu {
    bool has_fma; /* the CPU can run the *_fused kernels */
    bool fused;   /* and they are selected (see dev_cpu_set_fused) */
};

/* a*b + c with one rounding (PyTorch's AVX2 kernels: explicit vec::fmadd, and gcc's
 * contraction of their intrinsic code) or two (its scalar DEFAULT kernels). `fused` is a
 * constant in every caller, so each kernel below compiles into a plain and a fused copy. */
static ALWAYS_INLINE float madd(bool fused, float a, float b, float c)
{
    return fused ? __builtin_fmaf(a, b, c) : a * b + c;
}

/* ---- memory ---- */

static void *cpu_alloc(void *ctx, size_t bytes)
{
    (void)ctx;
    /* 64-byte aligned (a cache line, an AVX-512 vector); aligned_alloc wants a multiple. */
    size_t n = (bytes + 63) & ~(size_t)63;
    if (n < bytes)
        return NULL;
    void *p = aligned_alloc(64, n ? n : 64);
    if (p)
        memset(p, 0, n ? n : 64);
    return p;
}

static void cpu_free(void *ctx, void *p)
{
    (void)ctx;
    free(p);
}

static void cpu_memcpy(void *ctx, void *dst, const void *src, size_t bytes)
{
    (void)ctx;
    if (bytes && dst != src)
        memcpy(dst, src, bytes);
}

static void cpu_synchronize(void *ctx)
{
    (void)ctx;
}

/* ---- matrix products ---- */

/* The same cblas call for the same product as PyTorch's addmm/mm make (they call the
 * column-major sgemm_ of this OpenBLAS with the mirrored arguments, which is what
 * cblas_sgemm(RowMajor) turns into), so the results are bitwise PyTorch's -- provided
 * both run OpenBLAS with the same thread count (its blocking, and so its summation
 * order, depends on it; the parity tests and bench/step use 1 on both sides). */
static void cpu_gemm(void *ctx, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                     const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                     int64_t ldc)
{
    (void)ctx;
    ASSERT(m >= 0 && n >= 0 && k >= 0 && m <= INT_MAX && n <= INT_MAX && k <= INT_MAX);
    ASSERT(lda <= INT_MAX && ldb <= INT_MAX && ldc <= INT_MAX);
    if (m == 0 || n == 0)
        return;
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
                (int)m, (int)n, (int)k, alpha, a, (int)lda, b, (int)ldb, beta, c, (int)ldc);
}

static void cpu_gemv(void *ctx, bool trans, int64_t m, int64_t n, float alpha, const float *a, int64_t lda,
                     const float *x, float beta, float *y)
{
    (void)ctx;
    ASSERT(m >= 0 && n >= 0 && m <= INT_MAX && n <= INT_MAX && lda <= INT_MAX);
    if (m == 0 || n == 0)
        return;
    cblas_sgemv(CblasRowMajor, trans ? CblasTrans : CblasNoTrans, (int)m, (int)n, alpha, a, (int)lda, x, 1,
                beta, y, 1);
}

static void cpu_add_bias(void *ctx, float *restrict y, const float *restrict b, int64_t m, int64_t n)
{
    (void)ctx;
    for (int64_t i = 0; i < m; i++) {
        float *restrict row = y + i * n;
        for (int64_t j = 0; j < n; j++)
            row[j] += b[j];
    }
}

static void cpu_set_bias(void *ctx, float *restrict y, const float *restrict b, int64_t m, int64_t n)
{
    (void)ctx;
    for (int64_t i = 0; i < m; i++) {
        float *restrict row = y + i * n;
        for (int64_t j = 0; j < n; j++)
            row[j] = 0.0f + b[j]; /* 0 + b, not b: -0.0 becomes +0.0 as fill + add_bias makes it */
    }
}

/* ---- bias gradient: PyTorch's cascade sum over rows ----
 * The bias gradient is grad.sum(0) of dy[M,N], which PyTorch 1.13 computes with
 * cascade_sum (aten/src/ATen/native/cpu/SumKernel.cpp, one thread): float
 * accumulators, rows added in chunks of 16 or more, chunk sums carried up through four
 * levels, and a layout that depends on N (blocks of 32 columns, of 8 columns with four
 * interleaved row accumulators, single columns). Copying that structure gives its bits. */

static int64_t ceil_log2(int64_t x)
{
    if (x <= 2)
        return 1;
    return 64 - __builtin_clzll((unsigned long long)(x - 1));
}

/* multi_row_sum: `size` rows, row r at base + r*rstride; each holds nk*nc accumulated
 * entries, entry (k, c) at + k*kstride + c. out[k*nc + c] gets the sums (nk*nc <= 32). */
static void multi_row_sum(float *restrict out, const float *restrict base, int64_t rstride, int64_t size,
                          int nk, int64_t kstride, int nc)
{
    enum { LEVELS = 4 };
    float acc[LEVELS][32];
    const int w = nk * nc;
    memset(acc, 0, sizeof acc);
    int64_t lp = ceil_log2(size) / LEVELS;
    if (lp < 4)
        lp = 4;
    const int64_t step = (int64_t)1 << lp, mask = step - 1;
    int64_t i = 0;
    while (i + step <= size) {
        for (int64_t j = 0; j < step; j++, i++)
            for (int k = 0; k < nk; k++) {
                const float *restrict row = base + i * rstride + k * kstride;
                float *restrict a = acc[0] + k * nc;
                for (int c = 0; c < nc; c++)
                    a[c] += row[c];
            }
        for (int l = 1; l < LEVELS; l++) {
            for (int c = 0; c < w; c++) {
                acc[l][c] += acc[l - 1][c];
                acc[l - 1][c] = 0.0f;
            }
            if (i & (mask << (l * lp)))
                break;
        }
    }
    for (; i < size; i++)
        for (int k = 0; k < nk; k++) {
            const float *restrict row = base + i * rstride + k * kstride;
            float *restrict a = acc[0] + k * nc;
            for (int c = 0; c < nc; c++)
                a[c] += row[c];
        }
    for (int l = 1; l < LEVELS; l++)
        for (int c = 0; c < w; c++)
            acc[0][c] += acc[l][c];
    memcpy(out, acc[0], (size_t)w * sizeof(float));
}

/* row_sum: sums `size` rows of nc (<= 8) entries, row r at base + r*rstride, with four
 * interleaved accumulators (rows r, r+1, r+2, r+3 go to different ones). */
static void row_sum(float *restrict out, const float *restrict base, int64_t rstride, int64_t size, int nc)
{
    float p[4 * 8];
    const int64_t size_ilp = size / 4;
    multi_row_sum(p, base, 4 * rstride, size_ilp, 4, rstride, nc);
    for (int64_t i = size_ilp * 4; i < size; i++)
        for (int c = 0; c < nc; c++)
            p[c] += base[i * rstride + c];
    for (int k = 1; k < 4; k++)
        for (int c = 0; c < nc; c++)
            p[c] += p[k * nc + c];
    memcpy(out, p, (size_t)nc * sizeof(float));
}

static void cpu_bias_grad(void *ctx, float *restrict db, const float *restrict dy, int64_t m, int64_t n)
{
    (void)ctx;
    float s[32];
    if (m <= 0)
        return;
    if (n == 1) {
        /* [M,1] is a contiguous inner reduction: eight lanes of vectors, the tail, then
         * the lanes in order. */
        float fin = 0.0f;
        int64_t vs = m >= 8 ? m / 8 : 0;
        if (vs) {
            row_sum(s, dy, 8, vs, 8);
            for (int64_t k = vs * 8; k < m; k++)
                fin += dy[k];
            for (int l = 0; l < 8; l++)
                fin += s[l];
        } else {
            row_sum(s, dy, 1, m, 1);
            fin = s[0];
        }
        db[0] += fin;
        return;
    }
    int64_t j = 0;
    if (n >= 8) {
        for (; j + 32 <= n; j += 32) {
            multi_row_sum(s, dy + j, n, m, 1, 0, 32);
            for (int c = 0; c < 32; c++)
                db[j + c] += s[c];
        }
        for (; j + 8 <= n; j += 8) {
            row_sum(s, dy + j, n, m, 8);
            for (int c = 0; c < 8; c++)
                db[j + c] += s[c];
        }
    } else {
        for (; j + 4 <= n; j += 4) {
            multi_row_sum(s, dy + j, n, m, 1, 0, 4);
            for (int c = 0; c < 4; c++)
                db[j + c] += s[c];
        }
    }
    for (; j < n; j++) {
        row_sum(s, dy + j, n, m, 1);
        db[j] += s[0];
    }
}

/* ---- activations ---- */

/* PyTorch's GELU constants, computed in double and rounded to float as its kernel does. */
#define GELU_ALPHA ((float)M_SQRT1_2)
#define GELU_BETA  ((float)(M_2_SQRTPI * M_SQRT1_2 * 0.5))
/* approximate='tanh': kBeta = sqrt(2) * (2/sqrt(pi)) * 0.5 and kKappa, as floats. */
#define GELU_TANH_BETA  ((float)(M_SQRT2 * M_2_SQRTPI * 0.5))
#define GELU_TANH_KAPPA 0.044715f

/* e^x without a call, so that loops over it vectorize: Cody-Waite reduction x = k ln2 + r
 * (k rounded to nearest by the 1.5 * 2^23 trick), Cephes' degree-6 polynomial for e^r
 * (about 1 ulp), 2^k built in the exponent bits. x is clamped to [-87.3, 88.3], where e^x
 * is a normal float; NaN stays NaN. */
static ALWAYS_INLINE NO_TRAP float exp_poly(float x)
{
    float c = x < -87.3f ? -87.3f : x > 88.3f ? 88.3f : x;
    c = x == x ? c : 0.0f; /* k must be a number whatever x is; NaN is put back below */
    const float k = (c * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    const float r = (c - k * 0.693359375f) - k * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    union {
        int32_t i;
        float f;
    } scale = {.i = ((int32_t)k + 127) * (1 << 23)};
    return x == x ? p * scale.f : x;
}

/* e^x for the softmaxes: exp_poly, and 0 below its range (where expf gives a subnormal
 * or 0), so that a far smaller logit than the row's max contributes nothing, as there. */
static ALWAYS_INLINE NO_TRAP float exp_soft(float x)
{
    const float e = exp_poly(x);
    return x < -87.3f ? 0.0f : e;
}

/* Row reductions in a fixed order of lanes, so that they vectorize (a sequential sum is one
 * chain of dependent adds, latency-bound) and give the same bits on every run: eight float
 * lanes or eight double lanes (as two vectors of four), added up pairwise at the end. The
 * order differs from a sequential sum's by a few ulp of the sum, as PyTorch's own
 * vectorized reductions do. GCC's vector extensions: AVX in the FMA_TARGET copies, two
 * SSE halves in the plain ones. */
/* The helpers are always inlined, so the vector ABI warning (passing a 32-byte vector
 * without AVX) concerns no real call. */
#if defined(__clang__)
#pragma clang diagnostic ignored "-Wpsabi"
#elif defined(__GNUC__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef float v4f __attribute__((vector_size(16)));
typedef double v4d __attribute__((vector_size(32)));

static ALWAYS_INLINE v8f load8(const float *p)
{
    v8f v;
    memcpy(&v, p, sizeof v);
    return v;
}
static ALWAYS_INLINE float hsum8(v8f a)
{
    return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}
static ALWAYS_INLINE double hsum4d(v4d a)
{
    return (a[0] + a[2]) + (a[1] + a[3]);
}
/* sum of x[n] in float, eight lanes. */
static ALWAYS_INLINE float sum_f(const float *restrict x, int64_t n)
{
    v8f acc = {0};
    int64_t j = 0;
    for (; j + 8 <= n; j += 8)
        acc += load8(x + j);
    float s = hsum8(acc);
    for (; j < n; j++)
        s += x[j];
    return s;
}
/* sum of a[j] * b[j] in float (products rounded, no fused multiply-add), eight lanes. */
static ALWAYS_INLINE float dot_f(const float *restrict a, const float *restrict b, int64_t n)
{
    v8f acc = {0};
    int64_t j = 0;
    for (; j + 8 <= n; j += 8)
        acc += load8(a + j) * load8(b + j);
    float s = hsum8(acc);
    for (; j < n; j++)
        s += a[j] * b[j];
    return s;
}
/* Widen eight floats to two vectors of four doubles. */
static ALWAYS_INLINE void widen8(const float *p, v4d *lo, v4d *hi)
{
    v4f a, b;
    memcpy(&a, p, sizeof a);
    memcpy(&b, p + 4, sizeof b);
    *lo = __builtin_convertvector(a, v4d);
    *hi = __builtin_convertvector(b, v4d);
}
/* sum of x[n] in double, eight lanes. */
static ALWAYS_INLINE double sum_d(const float *restrict x, int64_t n)
{
    v4d a0 = {0}, a1 = {0};
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        v4d lo, hi;
        widen8(x + j, &lo, &hi);
        a0 += lo;
        a1 += hi;
    }
    double s = hsum4d(a0 + a1);
    for (; j < n; j++)
        s += x[j];
    return s;
}
/* sum of (x[j] - mu)^2 in double, eight lanes. */
static ALWAYS_INLINE double sumsq_dev_d(const float *restrict x, double mu, int64_t n)
{
    v4d a0 = {0}, a1 = {0};
    const v4d m = {mu, mu, mu, mu};
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        v4d lo, hi;
        widen8(x + j, &lo, &hi);
        lo -= m;
        hi -= m;
        a0 += lo * lo;
        a1 += hi * hi;
    }
    double s = hsum4d(a0 + a1);
    for (; j < n; j++)
        s += ((double)x[j] - mu) * ((double)x[j] - mu);
    return s;
}
/* max of x[n] (n >= 1), eight lanes; NaN propagates as in a sequential scan only when it
 * is first, as before: training never sees a NaN logit it goes on with. */
static ALWAYS_INLINE NO_TRAP float max_f(const float *restrict x, int64_t n)
{
    float mx = x[0];
    int64_t j = 0;
    if (n >= 8) {
        v8f m = load8(x);
        for (j = 8; j + 8 <= n; j += 8) {
            const v8f v = load8(x + j);
            const v8i gt = v > m; /* all ones where v > m */
            m = (v8f)(((v8i)v & gt) | ((v8i)m & ~gt));
        }
        mx = m[0];
        for (int l = 1; l < 8; l++)
            mx = m[l] > mx ? m[l] : mx;
    }
    for (; j < n; j++)
        mx = x[j] > mx ? x[j] : mx;
    return mx;
}

/* gelu with approximate='tanh', y = 0.5 x (1 + tanh(u)), u = beta (x + kappa x^3), as
 * x * s with s = 0.5 (1 + tanh(u)) = 1 / (1 + e^(-2u)): the same function without tanh's
 * cancellation near -1, in a loop that vectorizes (tanhf does not; PyTorch's kernel
 * runs Sleef's vector tanh, within an ulp of tanhf). Backward, PyTorch's terms in s:
 * left' = 0.5 (1 + t) = s and 0.5 x (1 - t^2) u' = 2 x s (1 - s) u'. */
static ALWAYS_INLINE NO_TRAP void gelu_tanh_forward(float *restrict y, const float *restrict x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        const float u = GELU_TANH_BETA * (x[i] + GELU_TANH_KAPPA * (x[i] * x[i] * x[i]));
        y[i] = x[i] / (1.0f + exp_poly(-2.0f * u));
    }
}

static ALWAYS_INLINE NO_TRAP void gelu_tanh_backward(float *restrict dx, const float *restrict dy,
                                                     const float *restrict x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        const float x_sq = x[i] * x[i];
        const float u = GELU_TANH_BETA * (x[i] + GELU_TANH_KAPPA * (x_sq * x[i]));
        const float s = 1.0f / (1.0f + exp_poly(-2.0f * u));
        const float du = GELU_TANH_BETA * (1.0f + 3.0f * GELU_TANH_KAPPA * x_sq);
        dx[i] = dy[i] * (s + 2.0f * x[i] * s * (1.0f - s) * du);
    }
}

static NO_TRAP void gelu_tanh_forward_plain(float *y, const float *x, int64_t n)
{
    gelu_tanh_forward(y, x, n);
}
static FMA_TARGET NO_TRAP void gelu_tanh_forward_fused(float *y, const float *x, int64_t n)
{
    gelu_tanh_forward(y, x, n);
}
static NO_TRAP void gelu_tanh_backward_plain(float *dx, const float *dy, const float *x, int64_t n)
{
    gelu_tanh_backward(dx, dy, x, n);
}
static FMA_TARGET NO_TRAP void gelu_tanh_backward_fused(float *dx, const float *dy, const float *x, int64_t n)
{
    gelu_tanh_backward(dx, dy, x, n);
}

static void cpu_act_forward(void *ctx, layer_kind k, float *restrict y, const float *restrict x, int64_t n)
{
    const struct cpu *c = ctx;
    switch (k) {
    case LAYER_RELU:
        /* clamp_min(x, 0): NaN and -0 pass through, as in PyTorch. */
        for (int64_t i = 0; i < n; i++)
            y[i] = x[i] < 0.0f ? 0.0f : x[i];
        break;
    case LAYER_TANH:
        for (int64_t i = 0; i < n; i++)
            y[i] = tanhf(x[i]);
        break;
    case LAYER_SIGMOID:
        for (int64_t i = 0; i < n; i++)
            y[i] = 1.0f / (1.0f + expf(-x[i]));
        break;
    case LAYER_GELU:
        for (int64_t i = 0; i < n; i++)
            y[i] = x[i] * 0.5f * (1.0f + erff(x[i] * GELU_ALPHA));
        break;
    case LAYER_GELU_TANH: (c->fused ? gelu_tanh_forward_fused : gelu_tanh_forward_plain)(y, x, n); break;
    default: ASSERT(!"act_forward on a layer that is not an activation");
    }
}

static ALWAYS_INLINE void tanh_backward(bool fused, float *restrict dx, const float *restrict dy,
                                        const float *restrict y, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        dx[i] = dy[i] * madd(fused, -y[i], y[i], 1.0f);
}

static ALWAYS_INLINE void gelu_backward(bool fused, float *restrict dx, const float *restrict dy,
                                        const float *restrict x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        const float cdf = 0.5f * (1.0f + erff(x[i] * GELU_ALPHA));
        const float pdf = GELU_BETA * expf(x[i] * x[i] * -0.5f);
        dx[i] = dy[i] * madd(fused, x[i], pdf, cdf);
    }
}

static void tanh_backward_plain(float *dx, const float *dy, const float *y, int64_t n)
{
    tanh_backward(false, dx, dy, y, n);
}
static FMA_TARGET void tanh_backward_fused(float *dx, const float *dy, const float *y, int64_t n)
{
    tanh_backward(true, dx, dy, y, n);
}
static void gelu_backward_plain(float *dx, const float *dy, const float *x, int64_t n)
{
    gelu_backward(false, dx, dy, x, n);
}
static FMA_TARGET void gelu_backward_fused(float *dx, const float *dy, const float *x, int64_t n)
{
    gelu_backward(true, dx, dy, x, n);
}

static void cpu_act_backward(void *ctx, layer_kind k, float *restrict dx, const float *restrict dy,
                             const float *restrict x, const float *restrict y, int64_t n)
{
    const struct cpu *c = ctx;
    switch (k) {
    case LAYER_RELU:
        /* threshold_backward(dy, y, 0): zero where y <= 0 (also at exactly 0). As a bit
         * mask, so that the loop has no branch to mispredict on random signs. */
        for (int64_t i = 0; i < n; i++) {
            uint32_t g;
            memcpy(&g, &dy[i], sizeof g);
            g &= y[i] <= 0.0f ? 0u : ~0u;
            memcpy(&dx[i], &g, sizeof g);
        }
        break;
    case LAYER_TANH: (c->fused ? tanh_backward_fused : tanh_backward_plain)(dx, dy, y, n); break;
    case LAYER_SIGMOID:
        for (int64_t i = 0; i < n; i++)
            dx[i] = dy[i] * (1.0f - y[i]) * y[i];
        break;
    case LAYER_GELU: (c->fused ? gelu_backward_fused : gelu_backward_plain)(dx, dy, x, n); break;
    case LAYER_GELU_TANH:
        (c->fused ? gelu_tanh_backward_fused : gelu_tanh_backward_plain)(dx, dy, x, n);
        break;
    default: ASSERT(!"act_backward on a layer that is not an activation");
    }
}

/* ---- losses ---- */

/* mse_loss(pred, target) with reduction mean. The value is summed in double (PyTorch
 * sums in float; the difference is below float resolution of the mean); the gradient is
 * mse_loss_backward's norm * (p - t) * grad_output with norm = (float)(2 / numel). */
static void cpu_mse(void *ctx, const float *restrict pred, const float *restrict target, int64_t m, int64_t n,
                    float *restrict dpred, float *restrict loss)
{
    (void)ctx;
    const int64_t total = m * n;
    const float norm = (float)(2.0 / (double)total);
    double sum = 0.0;
    for (int64_t i = 0; i < total; i++) {
        const float d = pred[i] - target[i];
        sum += (double)d * (double)d;
        dpred[i] = norm * d;
    }
    *loss = (float)(sum / (double)total);
}

/* cross_entropy = log_softmax + nll_loss, reduction mean. Per row: logp = (x - max) -
 * log(sum exp(x - max)) in that order (PyTorch's _vec_log_softmax_lastdim keeps it for
 * large logits); the exp sum is taken in double. Backward is log_softmax_backward of
 * nll's gradient g (g[label] = -(1/M)): dx = g - exp(logp) * sum(g), fused on AVX2.
 * One row at a time in vectorized passes (max, exp into dx, the double sum, the gradient),
 * with exp_soft for e^x (within an ulp or two of expf, as PyTorch's Sleef exp is). */
static ALWAYS_INLINE NO_TRAP void cross_entropy(bool fused, const float *restrict logits,
                                                const int32_t *restrict labels, int64_t m, int64_t n,
                                                float *restrict dlogits, float *restrict loss)
{
    const float g = -(1.0f / (float)m);
    double total = 0.0;
    for (int64_t r = 0; r < m; r++) {
        const float *restrict x = logits + r * n;
        float *restrict dx = dlogits + r * n;
        const int32_t label = labels[r];
        if (label < 0 || label >= n) {
            /* The data module rejects such labels; never read outside the row. */
            for (int64_t j = 0; j < n; j++)
                dx[j] = NAN;
            total += NAN;
            continue;
        }
        const float mx = max_f(x, n);
        for (int64_t j = 0; j < n; j++)
            dx[j] = exp_soft(x[j] - mx);
        const float lse = (float)log(sum_d(dx, n));
        for (int64_t j = 0; j < n; j++) {
            const float logp = (x[j] - mx) - lse;
            dx[j] = madd(fused, -exp_soft(logp), g, 0.0f);
        }
        /* The label's entry adds g itself: g - exp(logp) * g in one fused step. */
        const float logp_label = (x[label] - mx) - lse;
        dx[label] = madd(fused, -exp_soft(logp_label), g, g);
        total -= (double)logp_label;
    }
    *loss = (float)(total / (double)m);
}

static NO_TRAP void cross_entropy_plain(const float *logits, const int32_t *labels, int64_t m, int64_t n,
                                        float *dlogits, float *loss)
{
    cross_entropy(false, logits, labels, m, n, dlogits, loss);
}
static FMA_TARGET NO_TRAP void cross_entropy_fused(const float *logits, const int32_t *labels, int64_t m,
                                                   int64_t n, float *dlogits, float *loss)
{
    cross_entropy(true, logits, labels, m, n, dlogits, loss);
}

static void cpu_cross_entropy(void *ctx, const float *logits, const int32_t *labels, int64_t m, int64_t n,
                              float *dlogits, float *loss)
{
    const struct cpu *c = ctx;
    if (m <= 0 || n <= 0) {
        *loss = NAN; /* PyTorch's mean over no rows */
        return;
    }
    (c->fused ? cross_entropy_fused : cross_entropy_plain)(logits, labels, m, n, dlogits, loss);
}

/* ---- optimizers ----
 * PyTorch's _single_tensor_sgd / _single_tensor_adamw apply one tensor op after another;
 * here one loop does them per element in the same order with the same roundings
 * (tensor.add(other, alpha=a) is other*a + tensor, fused on AVX2). */

/* One SGD loop with its flags as constants, so that each of the cases below is a
 * straight-line loop the compiler vectorizes. */
static ALWAYS_INLINE void sgd_loop(bool fused, bool has_wd, bool has_mom, bool first, bool nesterov,
                                   const struct sgd_hyper *h, float *restrict p, const float *restrict g,
                                   float *restrict buf, int64_t n)
{
    const float neg_lr = -h->lr, wd = h->weight_decay, mom = h->momentum;
    const float damp1 = h->one_minus_dampening;
    for (int64_t i = 0; i < n; i++) {
        float d = g[i];
        if (has_wd)
            d = madd(fused, p[i], wd, d); /* d_p = d_p.add(param, alpha=weight_decay) */
        if (has_mom) {
            /* First step: buf = clone(d_p); then buf.mul_(momentum).add_(d_p, 1-dampening). */
            const float b = first ? d : madd(fused, d, damp1, buf[i] * mom);
            buf[i] = b;
            d = nesterov ? madd(fused, b, mom, d) : b; /* d_p.add(buf, alpha=momentum) */
        }
        p[i] = madd(fused, d, neg_lr, p[i]); /* param.add_(d_p, alpha=-lr) */
    }
}

static ALWAYS_INLINE void sgd(bool fused, const struct sgd_hyper *h, float *restrict p,
                              const float *restrict g, float *restrict buf, int64_t n)
{
#define SGD_CASE(wd, mom, first, nest) sgd_loop(fused, wd, mom, first, nest, h, p, g, buf, n)
    const bool wd = h->weight_decay != 0.0f;
    if (h->momentum == 0.0f) {
        if (wd)
            SGD_CASE(true, false, false, false);
        else
            SGD_CASE(false, false, false, false);
        return;
    }
    switch ((wd ? 1 : 0) | (h->first ? 2 : 0) | (h->nesterov ? 4 : 0)) {
    case 0: SGD_CASE(false, true, false, false); break;
    case 1: SGD_CASE(true, true, false, false); break;
    case 2: SGD_CASE(false, true, true, false); break;
    case 3: SGD_CASE(true, true, true, false); break;
    case 4: SGD_CASE(false, true, false, true); break;
    case 5: SGD_CASE(true, true, false, true); break;
    case 6: SGD_CASE(false, true, true, true); break;
    default: SGD_CASE(true, true, true, true); break;
    }
#undef SGD_CASE
}

static void sgd_plain(const struct sgd_hyper *h, float *p, const float *g, float *buf, int64_t n)
{
    sgd(false, h, p, g, buf, n);
}
static FMA_TARGET void sgd_fused(const struct sgd_hyper *h, float *p, const float *g, float *buf, int64_t n)
{
    sgd(true, h, p, g, buf, n);
}

static void cpu_sgd_step(void *ctx, const struct sgd_hyper *h, float *param, const float *grad, float *buf,
                         int64_t n)
{
    const struct cpu *c = ctx;
    ASSERT(h->momentum == 0.0f || buf);
    (c->fused ? sgd_fused : sgd_plain)(h, param, grad, buf, n);
}

static ALWAYS_INLINE void adamw(bool fused, const struct adamw_hyper *h, float *restrict p,
                                const float *restrict g, float *restrict m, float *restrict v, int64_t n)
{
    const float decay = h->decay, b1 = h->beta1, b2 = h->beta2;
    const float omb1 = h->one_minus_beta1, omb2 = h->one_minus_beta2;
    const float nss = h->neg_step_size, bc2s = h->bc2_sqrt, eps = h->eps;
    for (int64_t i = 0; i < n; i++) {
        const float gi = g[i];
        const float pi = p[i] * decay;                          /* param.mul_(1 - lr*wd) */
        const float mi = madd(fused, gi, omb1, m[i] * b1);      /* exp_avg.mul_.add_ */
        const float vi = madd(fused, omb2 * gi, gi, v[i] * b2); /* exp_avg_sq.mul_.addcmul_ */
        const float denom = sqrtf(vi) / bc2s + eps;
        m[i] = mi;
        v[i] = vi;
        p[i] = pi + nss * mi / denom; /* param.addcdiv_(exp_avg, denom, value=-step_size) */
    }
}

static void adamw_plain(const struct adamw_hyper *h, float *p, const float *g, float *m, float *v, int64_t n)
{
    adamw(false, h, p, g, m, v, n);
}
/* The fused path runs on AVX2 only, so it may say so: with errno semantics (C's default)
 * gcc will not vectorize sqrtf, and this loop is memory-bound enough that scalar code
 * costs 5x. The same IEEE operations in the same order as adamw() above: equal bits. */
static FMA_TARGET void adamw_fused(const struct adamw_hyper *h, float *p, const float *g, float *m, float *v,
                                   int64_t n)
{
    int64_t i = 0;
#if DDPD_CPU_X86
    const __m256 decay = _mm256_set1_ps(h->decay), b1 = _mm256_set1_ps(h->beta1);
    const __m256 b2 = _mm256_set1_ps(h->beta2), omb1 = _mm256_set1_ps(h->one_minus_beta1);
    const __m256 omb2 = _mm256_set1_ps(h->one_minus_beta2), nss = _mm256_set1_ps(h->neg_step_size);
    const __m256 bc2s = _mm256_set1_ps(h->bc2_sqrt), eps = _mm256_set1_ps(h->eps);
    for (; i + 8 <= n; i += 8) {
        const __m256 gi = _mm256_loadu_ps(g + i);
        const __m256 pi = _mm256_mul_ps(_mm256_loadu_ps(p + i), decay);
        const __m256 mi = _mm256_fmadd_ps(gi, omb1, _mm256_mul_ps(_mm256_loadu_ps(m + i), b1));
        const __m256 vi =
            _mm256_fmadd_ps(_mm256_mul_ps(omb2, gi), gi, _mm256_mul_ps(_mm256_loadu_ps(v + i), b2));
        const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vi), bc2s), eps);
        _mm256_storeu_ps(m + i, mi);
        _mm256_storeu_ps(v + i, vi);
        _mm256_storeu_ps(p + i, _mm256_add_ps(pi, _mm256_div_ps(_mm256_mul_ps(nss, mi), denom)));
    }
#endif
    adamw(true, h, p + i, g + i, m + i, v + i, n - i);
}

static void cpu_adamw_step(void *ctx, const struct adamw_hyper *h, float *param, const float *grad,
                           float *exp_avg, float *exp_avg_sq, int64_t n)
{
    const struct cpu *c = ctx;
    (c->fused ? adamw_fused : adamw_plain)(h, param, grad, exp_avg, exp_avg_sq, n);
}

/* ---- small helpers ---- */

static void cpu_fill(void *ctx, float *restrict x, float v, int64_t n)
{
    (void)ctx;
    for (int64_t i = 0; i < n; i++)
        x[i] = v;
}

static void cpu_copy(void *ctx, float *dst, const float *src, int64_t n)
{
    (void)ctx;
    if (n > 0 && dst != src)
        memmove(dst, src, (size_t)n * sizeof(float));
}

static void cpu_scale(void *ctx, float *restrict x, float a, int64_t n)
{
    (void)ctx;
    for (int64_t i = 0; i < n; i++)
        x[i] *= a;
}

static void cpu_scale_copy(void *ctx, float *restrict dst, const float *restrict src, float a, int64_t n)
{
    (void)ctx;
    for (int64_t i = 0; i < n; i++)
        dst[i] = src[i] * a;
}

/* ---- v2 ops (CONTRACT.md §2a) ---- */

static void cpu_gemm_batched(void *ctx, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                             float alpha, const float *a, int64_t lda, int64_t stride_a, const float *b,
                             int64_t ldb, int64_t stride_b, float beta, float *c, int64_t ldc,
                             int64_t stride_c, int64_t batch)
{
    /* One sgemm per batch item (per (batch, head) in attention), as PyTorch's bmm on the
     * CPU does with MKL/OpenBLAS absent a batched BLAS. */
    for (int64_t i = 0; i < batch; i++)
        cpu_gemm(ctx, trans_a, trans_b, m, n, k, alpha, a + i * stride_a, lda, b + i * stride_b, ldb, beta,
                 c + i * stride_c, ldc);
}

static void cpu_embedding_forward(void *ctx, float *restrict y, const float *restrict w,
                                  const int32_t *restrict ids, int64_t n, int64_t dim)
{
    (void)ctx;
    for (int64_t i = 0; i < n; i++)
        memcpy(y + i * dim, w + (int64_t)ids[i] * dim, (size_t)dim * sizeof(float));
}

static void cpu_embedding_backward(void *ctx, float *restrict dw, const float *restrict dy,
                                   const int32_t *restrict ids, int64_t n, int64_t dim)
{
    (void)ctx;
    for (int64_t i = 0; i < n; i++) {
        float *restrict row = dw + (int64_t)ids[i] * dim;
        const float *restrict g = dy + i * dim;
        for (int64_t j = 0; j < dim; j++)
            row[j] += g[j];
    }
}

/* PyTorch's LayerNormKernelImpl: mean and biased variance of the row (here summed in
 * double, eight lanes, then rounded once), rstd = 1 / sqrt(max(var, 0) + eps), and
 * y = (x * rstd + (-rstd * mean)) * w + b. */
static ALWAYS_INLINE void layernorm_forward(float *restrict y, float *restrict mean, float *restrict rstd,
                                            const float *restrict x, const float *restrict w,
                                            const float *restrict b, int64_t rows, int64_t dim, float eps)
{
    for (int64_t r = 0; r < rows; r++) {
        const float *restrict xr = x + r * dim;
        float *restrict yr = y + r * dim;
        const double mu = sum_d(xr, dim) / (double)dim;
        const double v = sumsq_dev_d(xr, mu, dim);
        const float fm = (float)mu, fv = (float)(v / (double)dim);
        const float rs = 1.0f / sqrtf((fv > 0.0f ? fv : 0.0f) + eps);
        const float bias = -rs * fm;
        if (b)
            for (int64_t j = 0; j < dim; j++)
                yr[j] = (xr[j] * rs + bias) * w[j] + b[j];
        else
            for (int64_t j = 0; j < dim; j++)
                yr[j] = (xr[j] * rs + bias) * w[j];
        mean[r] = fm;
        rstd[r] = rs;
    }
}

/* LayerNormBackwardKernelImplInternal: ds = sum(dy w x), db = sum(dy w) (float, eight
 * lanes); b' = (db mean - ds) rstd^3 / N, c' = -b' mean - db rstd / N;
 * dx = rstd dy w + b' x + c'. dw += dy (x - mean) rstd, db += dy. */
static ALWAYS_INLINE void layernorm_backward(float *restrict dx, float *restrict dw, float *restrict db,
                                             const float *restrict dy, const float *restrict x,
                                             const float *restrict mean, const float *restrict rstd,
                                             const float *restrict w, int64_t rows, int64_t dim)
{
    const float scale = 1.0f / (float)dim;
    for (int64_t r = 0; r < rows; r++) {
        const float *restrict xr = x + r * dim, *restrict gr = dy + r * dim;
        float *restrict dxr = dx + r * dim;
        const float mu = mean[r], rs = rstd[r];
        v8f va = {0}, vb = {0};
        int64_t j = 0;
        for (; j + 8 <= dim; j += 8) {
            const v8f gw = load8(gr + j) * load8(w + j);
            va += gw * load8(xr + j);
            vb += gw;
        }
        float ds = hsum8(va), dbs = hsum8(vb);
        for (; j < dim; j++) {
            ds += gr[j] * w[j] * xr[j];
            dbs += gr[j] * w[j];
        }
        const float a = rs;
        const float bb = (dbs * mu - ds) * a * a * a * scale;
        const float c = -bb * mu - dbs * a * scale;
        for (j = 0; j < dim; j++)
            dxr[j] = a * gr[j] * w[j] + bb * xr[j] + c;
        for (j = 0; j < dim; j++)
            dw[j] += gr[j] * (xr[j] - mu) * rs;
        if (db)
            for (j = 0; j < dim; j++)
                db[j] += gr[j];
    }
}

static void layernorm_forward_plain(float *y, float *mean, float *rstd, const float *x, const float *w,
                                    const float *b, int64_t rows, int64_t dim, float eps)
{
    layernorm_forward(y, mean, rstd, x, w, b, rows, dim, eps);
}
static FMA_TARGET void layernorm_forward_avx(float *y, float *mean, float *rstd, const float *x,
                                             const float *w, const float *b, int64_t rows, int64_t dim,
                                             float eps)
{
    layernorm_forward(y, mean, rstd, x, w, b, rows, dim, eps);
}
static void layernorm_backward_plain(float *dx, float *dw, float *db, const float *dy, const float *x,
                                     const float *mean, const float *rstd, const float *w, int64_t rows,
                                     int64_t dim)
{
    layernorm_backward(dx, dw, db, dy, x, mean, rstd, w, rows, dim);
}
static FMA_TARGET void layernorm_backward_avx(float *dx, float *dw, float *db, const float *dy,
                                              const float *x, const float *mean, const float *rstd,
                                              const float *w, int64_t rows, int64_t dim)
{
    layernorm_backward(dx, dw, db, dy, x, mean, rstd, w, rows, dim);
}

/* The AVX copies (FMA_TARGET, contraction off: no multiply-add is fused) compute what the
 * plain ones do lane for lane, so they give the same bits; they are only faster. */
static void cpu_layernorm_forward(void *ctx, float *y, float *mean, float *rstd, const float *x,
                                  const float *w, const float *b, int64_t rows, int64_t dim, float eps)
{
    const struct cpu *c = ctx;
    (c->has_fma ? layernorm_forward_avx : layernorm_forward_plain)(y, mean, rstd, x, w, b, rows, dim, eps);
}

static void cpu_layernorm_backward(void *ctx, float *dx, float *dw, float *db, const float *dy,
                                   const float *x, const float *mean, const float *rstd, const float *w,
                                   int64_t rows, int64_t dim)
{
    const struct cpu *c = ctx;
    (c->has_fma ? layernorm_backward_avx : layernorm_backward_plain)(dx, dw, db, dy, x, mean, rstd, w, rows,
                                                                     dim);
}

/* One row at a time: scale (the `/ sqrt(hd)` PyTorch applies to the scores), the causal
 * mask (only the row's first len entries are read; the rest of y is 0), the max, exp(x -
 * max) and its sum (eight lanes), then y *= 1/sum as _vec_softmax_lastdim does; each in a
 * pass that vectorizes. y may be x (each entry is read before it is written). */
static ALWAYS_INLINE NO_TRAP void softmax_forward(float *y, const float *x, int64_t rows, int64_t n,
                                                  float scale, bool causal)
{
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        float *yr = y + r * n;
        const int64_t len = causal ? r % n + 1 : n;
        for (int64_t j = 0; j < len; j++)
            yr[j] = xr[j] * scale;
        const float mx = max_f(yr, len);
        for (int64_t j = 0; j < len; j++)
            yr[j] = exp_soft(yr[j] - mx);
        const float inv = 1.0f / sum_f(yr, len);
        for (int64_t j = 0; j < len; j++)
            yr[j] *= inv;
        for (int64_t j = len; j < n; j++)
            yr[j] = 0.0f;
    }
}

/* dx = scale * y * (dy - sum_j dy_j * y_j): the dot in eight lanes, then one pass. */
static ALWAYS_INLINE void softmax_backward(float *restrict dx, const float *restrict dy,
                                           const float *restrict y, int64_t rows, int64_t n, float scale)
{
    for (int64_t r = 0; r < rows; r++) {
        const float *restrict gr = dy + r * n, *restrict yr = y + r * n;
        float *restrict dxr = dx + r * n;
        const float dot = dot_f(gr, yr, n);
        for (int64_t j = 0; j < n; j++)
            dxr[j] = yr[j] * (gr[j] - dot) * scale;
    }
}

static NO_TRAP void softmax_forward_plain(float *y, const float *x, int64_t rows, int64_t n, float scale,
                                          bool causal)
{
    softmax_forward(y, x, rows, n, scale, causal);
}
static FMA_TARGET NO_TRAP void softmax_forward_avx(float *y, const float *x, int64_t rows, int64_t n,
                                                   float scale, bool causal)
{
    softmax_forward(y, x, rows, n, scale, causal);
}
static void softmax_backward_plain(float *dx, const float *dy, const float *y, int64_t rows, int64_t n,
                                   float scale)
{
    softmax_backward(dx, dy, y, rows, n, scale);
}
static FMA_TARGET void softmax_backward_avx(float *dx, const float *dy, const float *y, int64_t rows,
                                            int64_t n, float scale)
{
    softmax_backward(dx, dy, y, rows, n, scale);
}

static void cpu_softmax_forward(void *ctx, float *y, const float *x, int64_t rows, int64_t n, float scale,
                                bool causal)
{
    const struct cpu *c = ctx;
    (c->has_fma ? softmax_forward_avx : softmax_forward_plain)(y, x, rows, n, scale, causal);
}

static void cpu_softmax_backward(void *ctx, float *dx, const float *dy, const float *y, int64_t rows,
                                 int64_t n, float scale)
{
    const struct cpu *c = ctx;
    (c->has_fma ? softmax_backward_avx : softmax_backward_plain)(dx, dy, y, rows, n, scale);
}

/* qkv [b,t,3,h,hd] <-> q, k, v [b,h,t,hd]. */
static void cpu_heads_split(void *ctx, float *q, float *k, float *v, const float *qkv, int64_t b, int64_t t,
                            int64_t h, int64_t hd)
{
    (void)ctx;
    float *out[3] = {q, k, v};
    for (int64_t i = 0; i < b; i++)
        for (int64_t s = 0; s < t; s++)
            for (int w = 0; w < 3; w++)
                for (int64_t j = 0; j < h; j++)
                    memcpy(out[w] + ((i * h + j) * t + s) * hd, qkv + (((i * t + s) * 3 + w) * h + j) * hd,
                           (size_t)hd * sizeof(float));
}

static void cpu_heads_split_backward(void *ctx, float *dqkv, const float *dq, const float *dk,
                                     const float *dv, int64_t b, int64_t t, int64_t h, int64_t hd)
{
    (void)ctx;
    const float *in[3] = {dq, dk, dv};
    for (int64_t i = 0; i < b; i++)
        for (int64_t s = 0; s < t; s++)
            for (int w = 0; w < 3; w++)
                for (int64_t j = 0; j < h; j++)
                    memcpy(dqkv + (((i * t + s) * 3 + w) * h + j) * hd, in[w] + ((i * h + j) * t + s) * hd,
                           (size_t)hd * sizeof(float));
}

/* yh [b,h,t,hd] -> y [b,t,h,hd], and back for the gradient. */
static void cpu_heads_merge(void *ctx, float *y, const float *yh, int64_t b, int64_t t, int64_t h, int64_t hd)
{
    (void)ctx;
    for (int64_t i = 0; i < b; i++)
        for (int64_t j = 0; j < h; j++)
            for (int64_t s = 0; s < t; s++)
                memcpy(y + ((i * t + s) * h + j) * hd, yh + ((i * h + j) * t + s) * hd,
                       (size_t)hd * sizeof(float));
}

static void cpu_heads_merge_backward(void *ctx, float *dyh, const float *dy, int64_t b, int64_t t, int64_t h,
                                     int64_t hd)
{
    (void)ctx;
    for (int64_t i = 0; i < b; i++)
        for (int64_t j = 0; j < h; j++)
            for (int64_t s = 0; s < t; s++)
                memcpy(dyh + ((i * h + j) * t + s) * hd, dy + ((i * t + s) * h + j) * hd,
                       (size_t)hd * sizeof(float));
}

static void cpu_add(void *ctx, float *y, const float *a, const float *b, int64_t n)
{
    (void)ctx;
    for (int64_t i = 0; i < n; i++)
        y[i] = a[i] + b[i];
}

static void cpu_mul(void *ctx, float *y, const float *a, const float *b, int64_t n)
{
    (void)ctx;
    for (int64_t i = 0; i < n; i++)
        y[i] = a[i] * b[i];
}

static void cpu_dropout_mask(void *ctx, float *restrict mask, int64_t n, float p, uint64_t seed)
{
    (void)ctx;
    const float keep = 1.0f / (1.0f - p);
    for (int64_t i = 0; i < n; i++)
        mask[i] = rng_hash_uniform(seed, (uint64_t)i) >= p ? keep : 0.0f;
}

static double cpu_sumsq(void *ctx, const float *x, int64_t n)
{
    (void)ctx;
    double s = 0.0;
    for (int64_t i = 0; i < n; i++)
        s += (double)x[i] * (double)x[i];
    return s;
}

static void cpu_add_i64(void *ctx, int64_t *x, int64_t v)
{
    (void)ctx;
    *x += v;
}

static const struct dev_ops cpu_ops = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .to_device = cpu_memcpy,
    .to_host = cpu_memcpy,
    .synchronize = cpu_synchronize,
    .gemm = cpu_gemm,
    .add_bias = cpu_add_bias,
    .set_bias = cpu_set_bias,
    .bias_grad = cpu_bias_grad,
    .act_forward = cpu_act_forward,
    .act_backward = cpu_act_backward,
    .mse = cpu_mse,
    .cross_entropy = cpu_cross_entropy,
    .sgd_step = cpu_sgd_step,
    .adamw_step = cpu_adamw_step,
    .fill = cpu_fill,
    .copy = cpu_copy,
    .scale = cpu_scale,
    .scale_copy = cpu_scale_copy,
    .gemm_batched = cpu_gemm_batched,
    .embedding_forward = cpu_embedding_forward,
    .embedding_backward = cpu_embedding_backward,
    .layernorm_forward = cpu_layernorm_forward,
    .layernorm_backward = cpu_layernorm_backward,
    .softmax_forward = cpu_softmax_forward,
    .softmax_backward = cpu_softmax_backward,
    .heads_split = cpu_heads_split,
    .heads_split_backward = cpu_heads_split_backward,
    .heads_merge = cpu_heads_merge,
    .heads_merge_backward = cpu_heads_merge_backward,
    .add = cpu_add,
    .mul = cpu_mul,
    .dropout_mask = cpu_dropout_mask,
    .sumsq = cpu_sumsq,
    .add_i64 = cpu_add_i64,
    /* The conv-net ops: dev/cpu_conv.c. */
    .im2col = cpu__im2col,
    .col2im = cpu__col2im,
    .maxpool2d_forward = cpu__maxpool2d_forward,
    .maxpool2d_backward = cpu__maxpool2d_backward,
    .avgpool2d_forward = cpu__avgpool2d_forward,
    .avgpool2d_backward = cpu__avgpool2d_backward,
    .batchnorm_forward_train = cpu__batchnorm_forward_train,
    .batchnorm_forward_eval = cpu__batchnorm_forward_eval,
    .batchnorm_backward = cpu__batchnorm_backward,
    .gemv = cpu_gemv,
    .host_memory = true,
};

struct dev dev_cpu_new(int threads)
{
    struct cpu *c = xcalloc(1, sizeof *c); /* a few bytes: out of memory here is fatal */
#if DDPD_CPU_X86
    __builtin_cpu_init();
    /* PyTorch 1.13 picks its AVX2 kernels exactly when the CPU has AVX2 and FMA. */
    c->has_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    c->has_fma = false;
#endif
    c->fused = c->has_fma;
    openblas_set_num_threads(threads > 0 ? threads : 1);
    return (struct dev){&cpu_ops, c};
}

void dev_cpu_free(struct dev d)
{
    if (d.ops == &cpu_ops)
        free(d.ctx);
}

bool dev_cpu_set_fused(struct dev d, bool fused)
{
    ASSERT(d.ops == &cpu_ops);
    struct cpu *c = d.ctx;
    bool was = c->fused;
    c->fused = fused && c->has_fma; /* never run FMA instructions on a CPU without them */
    return was;
}
