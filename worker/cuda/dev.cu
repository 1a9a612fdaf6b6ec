/* cuda/dev.cu — the CUDA compute backend: cuBLAS for the matrix products, one kernel per
 * op for the rest, all queued on one compute stream per rank. Each op computes what its
 * dev/cpu.c twin computes, in the same order where that order decides the bits (the
 * losses sum in double, multiply-adds are fused as the CPU's AVX2 path fuses them), and
 * tests/unit/worker/test_cuda.c compares them. Nothing here synchronises except to_host,
 * synchronize and fetch_wait (and reduce.cu's sumsq). The reductions (losses, sums of
 * squares) are reduce.cu's. Device code lives only in the .cu files of worker/cuda,
 * behind dev.h; this file is built into libddpd-cuda.so only (cuda/plugin.h). */
#include "cuda_impl.h"

/* cuda/sort.cu: CUB's stable radix sort of int32 pairs on a stream. */
cudaError_t cuda_sort_pairs_i32(void *temp, size_t *temp_bytes, const int32_t *keys_in, int32_t *keys_out,
                                const int32_t *vals_in, int32_t *vals_out, int n, cudaStream_t stream);

#define GROUP_CHUNK 4096 /* elements per block in an optimizer launch */

/* ---- memory ---- */

static void *cu_alloc(void *ctx, size_t bytes)
{
    struct cuda *c = (struct cuda *)ctx;
    void *p = NULL;
    size_t n = bytes ? bytes : 4;
    cudaError_t e = cudaMalloc(&p, n);
    if (e != cudaSuccess) {
        char why[160];
        snprintf(why, sizeof why, "%s (%zu bytes)", cudaGetErrorString(e), n);
        die(c, "alloc", why);
    }
    /* On the stream, so later ops see zeros without a device-wide wait. */
    check(c, cudaMemsetAsync(p, 0, n, c->stream), "alloc");
    return p;
}

static void cu_free(void *ctx, void *p)
{
    if (p)
        check((struct cuda *)ctx, cudaFree(p), "free");
}

static void cu_to_device(void *ctx, void *dst, const void *src, size_t bytes)
{
    struct cuda *c = (struct cuda *)ctx;
    if (!bytes)
        return;
    check(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream), "to_device");
    /* From pageable memory the source is consumed before the call returns; from pinned
     * memory the copy is truly asynchronous, and the caller may reuse src on return. */
    cudaPointerAttributes a;
    cudaError_t pe = cudaPointerGetAttributes(&a, src);
    if (pe == cudaSuccess && a.type == cudaMemoryTypeHost)
        check(c, cudaStreamSynchronize(c->stream), "to_device");
    else if (pe != cudaSuccess)
        (void)cudaGetLastError(); /* its own failure only (CUDA 10 fails on pageable memory):
                                   * an error pending from before stays for LAUNCHED to report */
}

static void cu_to_host(void *ctx, void *dst, const void *src, size_t bytes)
{
    struct cuda *c = (struct cuda *)ctx;
    if (!bytes)
        return;
    check(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream), "to_host");
    check(c, cudaStreamSynchronize(c->stream), "to_host");
}

static void cu_synchronize(void *ctx)
{
    struct cuda *c = (struct cuda *)ctx;
    check(c, cudaStreamSynchronize(c->stream), "synchronize");
}

/* ---- matrix products ----
 * Row-major C[M,N] is column-major C^T[N,M], so C = op(A) op(B) is computed as
 * C^T = op(B)^T op(A)^T: cuBLAS gets B first, with the same transposition flags. */
static void cu_gemm(void *ctx, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                    const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *cm,
                    int64_t ldc)
{
    struct cuda *c = (struct cuda *)ctx;
    if (m == 0 || n == 0)
        return;
    if (m > INT32_MAX || n > INT32_MAX || k > INT32_MAX || lda > INT32_MAX || ldb > INT32_MAX ||
        ldc > INT32_MAX)
        die(c, "gemm", "a dimension exceeds 2^31-1");
    /* cuBLAS refuses a leading dimension below 1 even where k = 0 makes it unused. */
    const int la = lda < 1 ? 1 : (int)lda, lb = ldb < 1 ? 1 : (int)ldb;
    check_blas(c,
               cublasSgemm(c->blas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                           (int)n, (int)m, (int)k, &alpha, b, lb, a, la, &beta, cm, (int)ldc),
               "gemm");
}

__global__ void k_add_bias(float *y, const float *b, int64_t m, int64_t n)
{
    FOR_EACH(i, m * n)
    y[i] += b[i % n];
}

static void cu_add_bias(void *ctx, float *y, const float *b, int64_t m, int64_t n)
{
    struct cuda *c = (struct cuda *)ctx;
    if (m <= 0 || n <= 0)
        return;
    LAUNCH(k_add_bias, blocks_for(m * n), THREADS, 0, c->stream, y, b, m, n);
    LAUNCHED(c, "add_bias");
}

__global__ void k_set_bias(float *y, const float *b, int64_t m, int64_t n)
{
    FOR_EACH(i, m * n)
    y[i] = 0.0f + b[i % n];
}

static void cu_set_bias(void *ctx, float *y, const float *b, int64_t m, int64_t n)
{
    struct cuda *c = (struct cuda *)ctx;
    if (m <= 0 || n <= 0)
        return;
    LAUNCH(k_set_bias, blocks_for(m * n), THREADS, 0, c->stream, y, b, m, n);
    LAUNCHED(c, "set_bias");
}

/* db[j] += sum_i dy[i,j]: a block owns 32 columns; its 8 thread rows sum strided rows
 * (coalesced across the 32 columns), then one row adds the 8 partial sums. */
__global__ void k_bias_grad(float *db, const float *dy, int64_t m, int64_t n)
{
    __shared__ float part[8][33];
    const int64_t j = (int64_t)blockIdx.x * 32 + threadIdx.x;
    float s = 0.0f;
    if (j < n)
        for (int64_t i = threadIdx.y; i < m; i += 8)
            s += dy[i * n + j];
    part[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && j < n) {
        for (int r = 1; r < 8; r++)
            s += part[r][threadIdx.x];
        db[j] += s;
    }
}

static void cu_bias_grad(void *ctx, float *db, const float *dy, int64_t m, int64_t n)
{
    struct cuda *c = (struct cuda *)ctx;
    if (m <= 0 || n <= 0)
        return;
    LAUNCH(k_bias_grad, (unsigned)((n + 31) / 32), dim3(32, 8), 0, c->stream, db, dy, m, n);
    LAUNCHED(c, "bias_grad");
}

/* ---- activations (formulas of dev/cpu.c; GELU's constants as PyTorch rounds them) ---- */

#define GELU_ALPHA 0.70710678118654752440f /* (float)M_SQRT1_2 */
#define GELU_BETA  ((float)(1.12837916709551257390 * 0.70710678118654752440 * 0.5))
/* gelu(approximate="tanh"): 0.5 x (1 + tanh(K_BETA (x + K_KAPPA x^3))), K_BETA =
 * sqrt(2) * 2/sqrt(pi) * 0.5 = sqrt(2/pi), PyTorch's GeluKernel constants. */
#define GELU_K_BETA  ((float)(1.41421356237309504880 * 1.12837916709551257390 * 0.5))
#define GELU_K_KAPPA 0.044715f

__global__ void k_act_forward(int kind, float *y, const float *x, int64_t n)
{
    FOR_EACH(i, n)
    {
        const float v = x[i];
        switch (kind) {
        case LAYER_RELU: y[i] = v < 0.0f ? 0.0f : v; break;
        case LAYER_TANH: y[i] = tanhf(v); break;
        case LAYER_SIGMOID: y[i] = 1.0f / (1.0f + expf(-v)); break;
        case LAYER_GELU_TANH: {
            const float cube = __fmul_rn(__fmul_rn(v, v), v);
            const float inner = __fmul_rn(GELU_K_BETA, v + __fmul_rn(GELU_K_KAPPA, cube));
            y[i] = __fmul_rn(__fmul_rn(0.5f, v), 1.0f + tanhf(inner));
            break;
        }
        default: y[i] = v * 0.5f * (1.0f + erff(v * GELU_ALPHA)); break; /* LAYER_GELU */
        }
    }
}

__global__ void k_act_backward(int kind, float *dx, const float *dy, const float *x, const float *y,
                               int64_t n)
{
    FOR_EACH(i, n)
    {
        switch (kind) {
        case LAYER_RELU: dx[i] = y[i] <= 0.0f ? 0.0f : dy[i]; break;
        case LAYER_TANH: dx[i] = dy[i] * fmaf(-y[i], y[i], 1.0f); break;
        case LAYER_SIGMOID: dx[i] = __fmul_rn(__fmul_rn(dy[i], 1.0f - y[i]), y[i]); break;
        case LAYER_GELU_TANH: {
            /* PyTorch's GeluBackward (tanh): left' + right', as its kernel names them. */
            const float v = x[i], sq = __fmul_rn(v, v), cube = __fmul_rn(sq, v);
            const float inner = __fmul_rn(GELU_K_BETA, v + __fmul_rn(GELU_K_KAPPA, cube));
            const float th = tanhf(inner);
            const float left = __fmul_rn(0.5f, v), right = 1.0f + th;
            const float left_d = __fmul_rn(0.5f, right);
            const float tanh_d = 1.0f - __fmul_rn(th, th);
            const float inner_d = __fmul_rn(GELU_K_BETA, 1.0f + __fmul_rn(3.0f * GELU_K_KAPPA, sq));
            const float right_d = __fmul_rn(__fmul_rn(left, tanh_d), inner_d);
            dx[i] = __fmul_rn(dy[i], left_d + right_d);
            break;
        }
        default: { /* LAYER_GELU */
            const float cdf = 0.5f * (1.0f + erff(x[i] * GELU_ALPHA));
            const float pdf = GELU_BETA * expf(__fmul_rn(x[i], x[i]) * -0.5f);
            dx[i] = dy[i] * fmaf(x[i], pdf, cdf);
        }
        }
    }
}

static void check_act(const struct cuda *c, layer_kind k, const char *op)
{
    if (k != LAYER_RELU && k != LAYER_TANH && k != LAYER_SIGMOID && k != LAYER_GELU && k != LAYER_GELU_TANH)
        die(c, op, "not an activation layer");
}

static void cu_act_forward(void *ctx, layer_kind k, float *y, const float *x, int64_t n)
{
    struct cuda *c = (struct cuda *)ctx;
    check_act(c, k, "act_forward");
    if (n <= 0)
        return;
    LAUNCH(k_act_forward, blocks_for(n), THREADS, 0, c->stream, (int)k, y, x, n);
    LAUNCHED(c, "act_forward");
}

static void cu_act_backward(void *ctx, layer_kind k, float *dx, const float *dy, const float *x,
                            const float *y, int64_t n)
{
    struct cuda *c = (struct cuda *)ctx;
    check_act(c, k, "act_backward");
    if (n <= 0)
        return;
    LAUNCH(k_act_backward, blocks_for(n), THREADS, 0, c->stream, (int)k, dx, dy, x, y, n);
    LAUNCHED(c, "act_backward");
}

/* ---- optimizers: one launch per parameter group ----
 * A launch covers up to GROUP_MAX tensors; block b works on one GROUP_CHUNK of the
 * tensor whose chunk range [first[t], first[t+1]) holds b. */
struct group {
    int count;
    float *p[GROUP_MAX];
    const float *g[GROUP_MAX];
    float *s1[GROUP_MAX]; /* momentum buffer / exp_avg */
    float *s2[GROUP_MAX]; /* exp_avg_sq */
    int64_t n[GROUP_MAX];
    int64_t first[GROUP_MAX + 1];
};
static_assert(sizeof(struct group) + sizeof(struct adamw_hyper) <= 4096,
              "an optimizer launch's arguments fit the 4 KiB every CUDA device takes");

/* Which tensor block b belongs to, and the element range [lo, hi) of its chunk. */
__device__ int group_chunk(const struct group &gr, int64_t *lo, int64_t *hi)
{
    const int64_t b = blockIdx.x;
    int t = 0;
    while (t + 1 < gr.count && gr.first[t + 1] <= b)
        t++;
    *lo = (b - gr.first[t]) * GROUP_CHUNK;
    *hi = *lo + GROUP_CHUNK < gr.n[t] ? *lo + GROUP_CHUNK : gr.n[t];
    return t;
}

__global__ void k_sgd(struct sgd_hyper h, struct group gr)
{
    int64_t lo, hi;
    const int t = group_chunk(gr, &lo, &hi);
    float *p = gr.p[t], *buf = gr.s1[t];
    const float *g = gr.g[t];
    const bool has_wd = h.weight_decay != 0.0f, has_mom = h.momentum != 0.0f;
    for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        float d = g[i];
        if (has_wd)
            d = fmaf(p[i], h.weight_decay, d);
        if (has_mom) {
            const float b = h.first ? d : fmaf(d, h.one_minus_dampening, __fmul_rn(buf[i], h.momentum));
            buf[i] = b;
            d = h.nesterov ? fmaf(b, h.momentum, d) : b;
        }
        p[i] = fmaf(d, -h.lr, p[i]);
    }
}

__global__ void k_adamw(struct adamw_hyper h, struct group gr)
{
    int64_t lo, hi;
    const int t = group_chunk(gr, &lo, &hi);
    float *p = gr.p[t], *m = gr.s1[t], *v = gr.s2[t];
    const float *g = gr.g[t];
    for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        const float gi = g[i];
        const float pi = __fmul_rn(p[i], h.decay);
        const float mi = fmaf(gi, h.one_minus_beta1, __fmul_rn(m[i], h.beta1));
        const float vi = fmaf(__fmul_rn(h.one_minus_beta2, gi), gi, __fmul_rn(v[i], h.beta2));
        const float denom = __fdiv_rn(__fsqrt_rn(vi), h.bc2_sqrt) + h.eps;
        m[i] = mi;
        v[i] = vi;
        p[i] = pi + __fdiv_rn(__fmul_rn(h.neg_step_size, mi), denom);
    }
}

/* Fills gr with tensors [from, from + count) of the arrays; returns the block count. */
static unsigned group_fill(struct group *gr, int from, int count, float *const *p, const float *const *g,
                           float *const *s1, float *const *s2, const int64_t *n)
{
    memset(gr, 0, sizeof *gr);
    gr->count = count;
    for (int i = 0; i < count; i++) {
        gr->p[i] = p[from + i];
        gr->g[i] = g[from + i];
        gr->s1[i] = s1 ? s1[from + i] : NULL;
        gr->s2[i] = s2 ? s2[from + i] : NULL;
        gr->n[i] = n[from + i];
        gr->first[i + 1] = gr->first[i] + (n[from + i] + GROUP_CHUNK - 1) / GROUP_CHUNK;
    }
    return (unsigned)gr->first[count];
}

static void cu_sgd_group(void *ctx, const struct sgd_hyper *h, int count, float *const *param,
                         const float *const *grad, float *const *buf, const int64_t *numel)
{
    struct cuda *c = (struct cuda *)ctx;
    for (int i = 0; i < count; i += GROUP_MAX) {
        struct group gr;
        unsigned blocks = group_fill(&gr, i, count - i < GROUP_MAX ? count - i : GROUP_MAX, param, grad,
                                     h->momentum != 0.0f ? buf : NULL, NULL, numel);
        if (blocks)
            LAUNCH(k_sgd, blocks, THREADS, 0, c->stream, *h, gr);
        LAUNCHED(c, "sgd_step");
    }
}

static void cu_adamw_group(void *ctx, const struct adamw_hyper *h, int count, float *const *param,
                           const float *const *grad, float *const *exp_avg, float *const *exp_avg_sq,
                           const int64_t *numel)
{
    struct cuda *c = (struct cuda *)ctx;
    for (int i = 0; i < count; i += GROUP_MAX) {
        struct group gr;
        unsigned blocks = group_fill(&gr, i, count - i < GROUP_MAX ? count - i : GROUP_MAX, param, grad,
                                     exp_avg, exp_avg_sq, numel);
        if (blocks)
            LAUNCH(k_adamw, blocks, THREADS, 0, c->stream, *h, gr);
        LAUNCHED(c, "adamw_step");
    }
}

static void cu_sgd_step(void *ctx, const struct sgd_hyper *h, float *param, const float *grad, float *buf,
                        int64_t n)
{
    cu_sgd_group(ctx, h, 1, &param, &grad, &buf, &n);
}

static void cu_adamw_step(void *ctx, const struct adamw_hyper *h, float *param, const float *grad,
                          float *exp_avg, float *exp_avg_sq, int64_t n)
{
    cu_adamw_group(ctx, h, 1, &param, &grad, &exp_avg, &exp_avg_sq, &n);
}

/* ---- small helpers ---- */

__global__ void k_fill(float *x, float v, int64_t n)
{
    FOR_EACH(i, n)
    x[i] = v;
}

__global__ void k_scale_copy(float *dst, const float *src, float a, int64_t n)
{
    FOR_EACH(i, n)
    dst[i] = src[i] * a;
}

static void cu_fill(void *ctx, float *x, float v, int64_t n)
{
    struct cuda *c = (struct cuda *)ctx;
    if (n <= 0)
        return;
    LAUNCH(k_fill, blocks_for(n), THREADS, 0, c->stream, x, v, n);
    LAUNCHED(c, "fill");
}

static void cu_copy(void *ctx, float *dst, const float *src, int64_t n)
{
    struct cuda *c = (struct cuda *)ctx;
    if (n <= 0 || dst == src)
        return;
    check(c, cudaMemcpyAsync(dst, src, (size_t)n * sizeof(float), cudaMemcpyDeviceToDevice, c->stream),
          "copy");
}

static void cu_scale_copy(void *ctx, float *dst, const float *src, float a, int64_t n)
{
    struct cuda *c = (struct cuda *)ctx;
    if (n <= 0)
        return;
    LAUNCH(k_scale_copy, blocks_for(n), THREADS, 0, c->stream, dst, src, a, n);
    LAUNCHED(c, "scale");
}

static void cu_scale(void *ctx, float *x, float a, int64_t n)
{
    cu_scale_copy(ctx, x, x, a, n);
}

/* ---- reads that do not stall the queue, and pinned host memory ---- */

static void cu_fetch_start(void *ctx, const float *src, int64_t n)
{
    struct cuda *c = (struct cuda *)ctx;
    if (n > c->pinned_n) {
        /* Grows once, to the largest read; waits for the previous read first. */
        check(c, cudaEventSynchronize(c->fetched), "fetch");
        check(c, cudaFreeHost(c->pinned), "fetch");
        c->pinned = NULL;
        check(c, cudaHostAlloc((void **)&c->pinned, (size_t)n * sizeof(float), cudaHostAllocDefault),
              "fetch");
        c->pinned_n = n;
    }
    if (n > 0)
        check(c,
              cudaMemcpyAsync(c->pinned, src, (size_t)n * sizeof(float), cudaMemcpyDeviceToHost, c->stream),
              "fetch");
    check(c, cudaEventRecord(c->fetched, c->stream), "fetch");
}

static void cu_fetch_wait(void *ctx, float *dst, int64_t n)
{
    struct cuda *c = (struct cuda *)ctx;
    check(c, cudaEventSynchronize(c->fetched), "fetch");
    if (n > 0)
        memcpy(dst, c->pinned, (size_t)(n < c->pinned_n ? n : c->pinned_n) * sizeof(float));
}

static void *cu_host_alloc(void *ctx, size_t bytes)
{
    struct cuda *c = (struct cuda *)ctx;
    void *p = NULL;
    check(c, cudaHostAlloc(&p, bytes ? bytes : 4, cudaHostAllocDefault), "host_alloc");
    return p;
}

static void cu_host_free(void *ctx, void *p)
{
    if (p)
        check((struct cuda *)ctx, cudaFreeHost(p), "host_free");
}

/* ---- v2 ops (CONTRACT.md §2a): the transformer's building blocks ---- */

/* The same product per batch entry as cu_gemm (B first, the flags as they are), i in
 * [0, batch) at X + i * stride_x. */
static void cu_gemm_batched(void *ctx, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                            float alpha, const float *a, int64_t lda, int64_t stride_a, const float *b,
                            int64_t ldb, int64_t stride_b, float beta, float *cm, int64_t ldc,
                            int64_t stride_c, int64_t batch)
{
    struct cuda *c = (struct cuda *)ctx;
    if (m == 0 || n == 0 || batch <= 0)
        return;
    if (m > INT32_MAX || n > INT32_MAX || k > INT32_MAX || lda > INT32_MAX || ldb > INT32_MAX ||
        ldc > INT32_MAX || batch > INT32_MAX)
        die(c, "gemm_batched", "a dimension exceeds 2^31-1");
    const int la = lda < 1 ? 1 : (int)lda, lb = ldb < 1 ? 1 : (int)ldb;
    check_blas(c,
               cublasSgemmStridedBatched(c->blas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                         trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, (int)n, (int)m, (int)k, &alpha,
                                         b, lb, (long long)stride_b, a, la, (long long)stride_a, &beta, cm,
                                         (int)ldc, (long long)stride_c, (int)batch),
               "gemm_batched");
}

__global__ void k_embedding_forward(float *y, const float *w, const int32_t *ids, int64_t n, int64_t dim)
{
    FOR_EACH(i, n * dim)
    y[i] = w[(int64_t)ids[i / dim] * dim + i % dim];
}

static void cu_embedding_forward(void *ctx, float *y, const float *w, const int32_t *ids, int64_t n,
                                 int64_t dim)
{
    struct cuda *c = (struct cuda *)ctx;
    if (n <= 0 || dim <= 0)
        return;
    LAUNCH(k_embedding_forward, blocks_for(n * dim), THREADS, 0, c->stream, y, w, ids, n, dim);
    LAUNCHED(c, "embedding_forward");
}

__global__ void k_iota(int32_t *x, int64_t n)
{
    FOR_EACH(i, n)
    x[i] = (int32_t)i;
}

/* Entry (r, j) with r the first of a run of equal ids in the sorted order adds the run's
 * rows of dy to dw[id, j], one after another in increasing position: the CPU's additions
 * in the CPU's order, so the same bits, and no two threads touch the same entry. */
__global__ void k_embedding_backward(float *dw, const float *dy, const int32_t *sorted_ids,
                                     const int32_t *pos, int64_t n, int64_t dim)
{
    FOR_EACH(i, n * dim)
    {
        const int64_t r = i / dim, j = i % dim;
        const int32_t id = sorted_ids[r];
        if (r > 0 && sorted_ids[r - 1] == id)
            continue;
        float s = dw[(int64_t)id * dim + j];
        for (int64_t q = r; q < n && sorted_ids[q] == id; q++)
            s += dy[(int64_t)pos[q] * dim + j];
        dw[(int64_t)id * dim + j] = s;
    }
}

/* Deterministic, without atomics: a stable radix sort of (id, position) pairs (CUB, cuda/sort.cu, on
 * the stream, scratch from the stream-ordered allocator), then one thread per run of
 * equal ids and column (k_embedding_backward). */
static void cu_embedding_backward(void *ctx, float *dw, const float *dy, const int32_t *ids, int64_t n,
                                  int64_t dim)
{
    struct cuda *c = (struct cuda *)ctx;
    if (n <= 0 || dim <= 0)
        return;
    if (n > INT32_MAX)
        die(c, "embedding_backward", "more than 2^31-1 ids");
    size_t temp = 0;
    check(c, cuda_sort_pairs_i32(NULL, &temp, NULL, NULL, NULL, NULL, (int)n, c->stream),
          "embedding_backward");
    const size_t ints = ((size_t)n * 3 * sizeof(int32_t) + 255) & ~(size_t)255;
    char *scratch = NULL;
    check(c, cudaMallocAsync((void **)&scratch, ints + temp, c->stream), "embedding_backward");
    int32_t *pos_in = (int32_t *)scratch, *keys = pos_in + n, *pos = keys + n;
    LAUNCH(k_iota, blocks_for(n), THREADS, 0, c->stream, pos_in, n);
    LAUNCHED(c, "embedding_backward");
    check(c, cuda_sort_pairs_i32(scratch + ints, &temp, ids, keys, pos_in, pos, (int)n, c->stream),
          "embedding_backward");
    LAUNCH(k_embedding_backward, blocks_for(n * dim), THREADS, 0, c->stream, dw, dy, keys, pos, n, dim);
    LAUNCHED(c, "embedding_backward");
    check(c, cudaFreeAsync(scratch, c->stream), "embedding_backward");
}

/* LayerNorm: a warp per row (LN_ROWS rows a block). Mean and variance are two passes over
 * the row summed in double, so both are the row's float statistics correctly rounded;
 * then rstd = 1/sqrt(var + eps) in float, and y = (x - mean) * rstd * w + b as dev.h
 * writes it (a constant row gives exactly b). */
#define LN_ROWS 8

__device__ double warp_allsum(double v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ float warp_allmax(float v)
{
    for (int o = 16; o > 0; o >>= 1) {
        const float other = __shfl_xor_sync(0xffffffffu, v, o);
        v = other > v ? other : v;
    }
    return v;
}

__global__ void k_layernorm_forward(float *y, float *mean, float *rstd, const float *x, const float *w,
                                    const float *b, int64_t rows, int64_t dim, float eps)
{
    const int lane = threadIdx.x & 31;
    const int64_t r = (int64_t)blockIdx.x * LN_ROWS + (threadIdx.x >> 5);
    if (r >= rows)
        return; /* the whole warp: no shuffle is left waiting */
    const float *xr = x + r * dim;
    double s = 0.0;
    for (int64_t j = lane; j < dim; j += 32)
        s += (double)xr[j];
    const double mu = warp_allsum(s) / (double)dim;
    double q = 0.0;
    for (int64_t j = lane; j < dim; j += 32) {
        const double d = (double)xr[j] - mu;
        q += d * d;
    }
    const float var = (float)(warp_allsum(q) / (double)dim);
    const float m = (float)mu, rs = 1.0f / sqrtf(var + eps);
    float *yr = y + r * dim;
    for (int64_t j = lane; j < dim; j += 32) {
        const float v = __fmul_rn(__fmul_rn(xr[j] - m, rs), w[j]);
        yr[j] = b ? v + b[j] : v;
    }
    if (lane == 0) {
        mean[r] = m;
        rstd[r] = rs;
    }
}

static void cu_layernorm_forward(void *ctx, float *y, float *mean, float *rstd, const float *x,
                                 const float *w, const float *b, int64_t rows, int64_t dim, float eps)
{
    struct cuda *c = (struct cuda *)ctx;
    if (rows <= 0 || dim <= 0)
        return;
    LAUNCH(k_layernorm_forward, (unsigned)((rows + LN_ROWS - 1) / LN_ROWS), 32 * LN_ROWS, 0, c->stream, y,
           mean, rstd, x, w, b, rows, dim, eps);
    LAUNCHED(c, "layernorm_forward");
}

/* dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * w, xhat = (x - mean) * rstd:
 * a warp per row, the two means summed in double. */
__global__ void k_layernorm_dx(float *dx, const float *dy, const float *x, const float *mean,
                               const float *rstd, const float *w, int64_t rows, int64_t dim)
{
    const int lane = threadIdx.x & 31;
    const int64_t r = (int64_t)blockIdx.x * LN_ROWS + (threadIdx.x >> 5);
    if (r >= rows)
        return;
    const float *xr = x + r * dim, *dyr = dy + r * dim;
    const float m = mean[r], rs = rstd[r];
    double sg = 0.0, sgx = 0.0;
    for (int64_t j = lane; j < dim; j += 32) {
        const float g = __fmul_rn(dyr[j], w[j]), xh = __fmul_rn(xr[j] - m, rs);
        sg += (double)g;
        sgx += (double)g * (double)xh;
    }
    const float a = (float)(warp_allsum(sg) / (double)dim), bx = (float)(warp_allsum(sgx) / (double)dim);
    float *dxr = dx + r * dim;
    for (int64_t j = lane; j < dim; j += 32) {
        const float g = __fmul_rn(dyr[j], w[j]), xh = __fmul_rn(xr[j] - m, rs);
        dxr[j] = __fmul_rn(rs, fmaf(-xh, bx, g - a));
    }
}

/* dw[j] += sum over rows of dy * xhat: k_bias_grad's layout (32 columns a block, 8 thread
 * rows, a fixed order). */
__global__ void k_layernorm_dw(float *dw, const float *dy, const float *x, const float *mean,
                               const float *rstd, int64_t rows, int64_t dim)
{
    __shared__ float part[8][33];
    const int64_t j = (int64_t)blockIdx.x * 32 + threadIdx.x;
    float s = 0.0f;
    if (j < dim)
        for (int64_t i = threadIdx.y; i < rows; i += 8)
            s = fmaf(dy[i * dim + j], __fmul_rn(x[i * dim + j] - mean[i], rstd[i]), s);
    part[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && j < dim) {
        for (int r = 1; r < 8; r++)
            s += part[r][threadIdx.x];
        dw[j] += s;
    }
}

static void cu_layernorm_backward(void *ctx, float *dx, float *dw, float *db, const float *dy, const float *x,
                                  const float *mean, const float *rstd, const float *w, int64_t rows,
                                  int64_t dim)
{
    struct cuda *c = (struct cuda *)ctx;
    if (rows <= 0 || dim <= 0)
        return;
    LAUNCH(k_layernorm_dx, (unsigned)((rows + LN_ROWS - 1) / LN_ROWS), 32 * LN_ROWS, 0, c->stream, dx, dy, x,
           mean, rstd, w, rows, dim);
    LAUNCHED(c, "layernorm_backward");
    LAUNCH(k_layernorm_dw, (unsigned)((dim + 31) / 32), dim3(32, 8), 0, c->stream, dw, dy, x, mean, rstd,
           rows, dim);
    LAUNCHED(c, "layernorm_backward");
    if (db)
        cu_bias_grad(ctx, db, dy, rows, dim);
}

/* Softmax: a warp per row (SM_ROWS rows a block). Attention's rows are T keys long, a few
 * thousand at most, so every reduction stays in shuffles. v = scale * x (masked keys of a
 * causal row are left out, their y 0); y = exp(v - max) / sum, the sum in double. */
#define SM_ROWS 8

__global__ void k_softmax_forward(float *y, const float *x, int64_t rows, int64_t n, float scale, bool causal)
{
    const int lane = threadIdx.x & 31;
    const int64_t r = (int64_t)blockIdx.x * SM_ROWS + (threadIdx.x >> 5);
    if (r >= rows)
        return;
    const float *xr = x + r * n;
    float *yr = y + r * n;
    const int64_t len = causal ? r % n + 1 : n; /* keys [0, len) count */
    float mx = -INFINITY;
    for (int64_t j = lane; j < len; j += 32) {
        const float v = __fmul_rn(xr[j], scale);
        mx = v > mx ? v : mx;
    }
    mx = warp_allmax(mx);
    double s = 0.0;
    for (int64_t j = lane; j < len; j += 32)
        s += (double)expf(__fmul_rn(xr[j], scale) - mx);
    const float sum = (float)warp_allsum(s);
    for (int64_t j = lane; j < n; j += 32)
        yr[j] = j < len ? expf(__fmul_rn(xr[j], scale) - mx) / sum : 0.0f;
}

static void cu_softmax_forward(void *ctx, float *y, const float *x, int64_t rows, int64_t n, float scale,
                               bool causal)
{
    struct cuda *c = (struct cuda *)ctx;
    if (rows <= 0 || n <= 0)
        return;
    LAUNCH(k_softmax_forward, (unsigned)((rows + SM_ROWS - 1) / SM_ROWS), 32 * SM_ROWS, 0, c->stream, y, x,
           rows, n, scale, causal);
    LAUNCHED(c, "softmax_forward");
}

/* dx = (y * (dy - dot)) * scale, dot = sum_j dy_j * y_j in double: softmax's backward,
 * then the chain rule through v = scale * x. */
__global__ void k_softmax_backward(float *dx, const float *dy, const float *y, int64_t rows, int64_t n,
                                   float scale)
{
    const int lane = threadIdx.x & 31;
    const int64_t r = (int64_t)blockIdx.x * SM_ROWS + (threadIdx.x >> 5);
    if (r >= rows)
        return;
    const float *dyr = dy + r * n, *yr = y + r * n;
    float *dxr = dx + r * n;
    double s = 0.0;
    for (int64_t j = lane; j < n; j += 32)
        s += (double)dyr[j] * (double)yr[j];
    const float dot = (float)warp_allsum(s);
    for (int64_t j = lane; j < n; j += 32)
        dxr[j] = __fmul_rn(__fmul_rn(yr[j], dyr[j] - dot), scale);
}

static void cu_softmax_backward(void *ctx, float *dx, const float *dy, const float *y, int64_t rows,
                                int64_t n, float scale)
{
    struct cuda *c = (struct cuda *)ctx;
    if (rows <= 0 || n <= 0)
        return;
    LAUNCH(k_softmax_backward, (unsigned)((rows + SM_ROWS - 1) / SM_ROWS), 32 * SM_ROWS, 0, c->stream, dx, dy,
           y, rows, n, scale);
    LAUNCHED(c, "softmax_backward");
}

/* Head layouts: a thread per element of the [b,t,3,h,hd] (or [b,t,h,hd]) tensor, which is
 * read (split, merge) or written (their backwards) in order; `back` swaps the direction. */
__global__ void k_heads_split(float *q, float *k, float *v, float *qkv, int64_t b, int64_t t, int64_t h,
                              int64_t hd, bool back)
{
    FOR_EACH(i, b * t * 3 * h * hd)
    {
        int64_t rest = i;
        const int64_t d = rest % hd;
        rest /= hd;
        const int64_t hh = rest % h;
        rest /= h;
        const int64_t s = rest % 3;
        rest /= 3;
        const int64_t tt = rest % t, bb = rest / t;
        float *dst = (s == 0 ? q : s == 1 ? k : v) + ((bb * h + hh) * t + tt) * hd + d;
        if (back)
            qkv[i] = *dst;
        else
            *dst = qkv[i];
    }
}

__global__ void k_heads_merge(float *y, float *yh, int64_t b, int64_t t, int64_t h, int64_t hd, bool back)
{
    FOR_EACH(i, b * t * h * hd)
    {
        int64_t rest = i;
        const int64_t d = rest % hd;
        rest /= hd;
        const int64_t hh = rest % h;
        rest /= h;
        const int64_t tt = rest % t, bb = rest / t;
        const int64_t o = ((bb * h + hh) * t + tt) * hd + d;
        if (back)
            yh[o] = y[i];
        else
            y[i] = yh[o];
    }
}

static void cu_heads_split(void *ctx, float *q, float *k, float *v, const float *qkv, int64_t b, int64_t t,
                           int64_t h, int64_t hd)
{
    struct cuda *c = (struct cuda *)ctx;
    const int64_t n = b * t * 3 * h * hd;
    if (b <= 0 || t <= 0 || h <= 0 || hd <= 0)
        return;
    LAUNCH(k_heads_split, blocks_for(n), THREADS, 0, c->stream, q, k, v, (float *)qkv, b, t, h, hd, false);
    LAUNCHED(c, "heads_split");
}

static void cu_heads_split_backward(void *ctx, float *dqkv, const float *dq, const float *dk, const float *dv,
                                    int64_t b, int64_t t, int64_t h, int64_t hd)
{
    struct cuda *c = (struct cuda *)ctx;
    const int64_t n = b * t * 3 * h * hd;
    if (b <= 0 || t <= 0 || h <= 0 || hd <= 0)
        return;
    LAUNCH(k_heads_split, blocks_for(n), THREADS, 0, c->stream, (float *)dq, (float *)dk, (float *)dv, dqkv,
           b, t, h, hd, true);
    LAUNCHED(c, "heads_split_backward");
}

static void cu_heads_merge(void *ctx, float *y, const float *yh, int64_t b, int64_t t, int64_t h, int64_t hd)
{
    struct cuda *c = (struct cuda *)ctx;
    if (b <= 0 || t <= 0 || h <= 0 || hd <= 0)
        return;
    LAUNCH(k_heads_merge, blocks_for(b * t * h * hd), THREADS, 0, c->stream, y, (float *)yh, b, t, h, hd,
           false);
    LAUNCHED(c, "heads_merge");
}

static void cu_heads_merge_backward(void *ctx, float *dyh, const float *dy, int64_t b, int64_t t, int64_t h,
                                    int64_t hd)
{
    struct cuda *c = (struct cuda *)ctx;
    if (b <= 0 || t <= 0 || h <= 0 || hd <= 0)
        return;
    LAUNCH(k_heads_merge, blocks_for(b * t * h * hd), THREADS, 0, c->stream, (float *)dy, dyh, b, t, h, hd,
           true);
    LAUNCHED(c, "heads_merge_backward");
}

__global__ void k_add(float *y, const float *a, const float *b, int64_t n)
{
    FOR_EACH(i, n)
    y[i] = a[i] + b[i];
}

__global__ void k_mul(float *y, const float *a, const float *b, int64_t n)
{
    FOR_EACH(i, n)
    y[i] = __fmul_rn(a[i], b[i]);
}

static void cu_add(void *ctx, float *y, const float *a, const float *b, int64_t n)
{
    struct cuda *c = (struct cuda *)ctx;
    if (n <= 0)
        return;
    LAUNCH(k_add, blocks_for(n), THREADS, 0, c->stream, y, a, b, n);
    LAUNCHED(c, "add");
}

static void cu_mul(void *ctx, float *y, const float *a, const float *b, int64_t n)
{
    struct cuda *c = (struct cuda *)ctx;
    if (n <= 0)
        return;
    LAUNCH(k_mul, blocks_for(n), THREADS, 0, c->stream, y, a, b, n);
    LAUNCHED(c, "mul");
}

/* rng_hash_uniform is the CPU's draw, so the kept positions are the CPU's. */
__global__ void k_dropout_mask(float *mask, int64_t n, float p, float keep, uint64_t seed)
{
    FOR_EACH(i, n)
    mask[i] = rng_hash_uniform(seed, (uint64_t)i) >= p ? keep : 0.0f;
}

static void cu_dropout_mask(void *ctx, float *mask, int64_t n, float p, uint64_t seed)
{
    struct cuda *c = (struct cuda *)ctx;
    if (n <= 0)
        return;
    const float keep = 1.0f / (1.0f - p); /* p < 1 (the validator's range) */
    LAUNCH(k_dropout_mask, blocks_for(n), THREADS, 0, c->stream, mask, n, p, keep, seed);
    LAUNCHED(c, "dropout_mask");
}

/* ---- v2 conv-net ops (issue 18): dev.h's contract, dev/cpu_conv.c's order ----
 * The scatters of the CPU (col2im, the pools' backwards) are gathers here: a thread per
 * input entry adds its terms in the order the CPU's loops add them, so the results are
 * the same bits, with no atomics. */

/* The outputs o in [lo, hi] whose window (o*s - p, k wide) holds input position i. */
__device__ void win_range(int64_t i, int64_t k, int64_t s, int64_t p, int64_t out, int64_t *lo, int64_t *hi)
{
    const int64_t first = i + p - k + 1; /* o*s >= first */
    *lo = first <= 0 ? 0 : (first + s - 1) / s;
    const int64_t last = (i + p) / s; /* o*s <= i + p, i + p >= 0 */
    *hi = last < out - 1 ? last : out - 1;
}

static void win_check(const struct cuda *c, const struct dev_window *win, int64_t h, int64_t w,
                      const char *op)
{
    if (win->kh < 1 || win->kw < 1 || win->sh < 1 || win->sw < 1 || win->ph < 0 || win->pw < 0 ||
        (h + 2 * win->ph - win->kh) < 0 || (w + 2 * win->pw - win->kw) < 0)
        die(c, op, "a window with no output");
}

__global__ void k_im2col(float *col, const float *x, int64_t planes, int64_t h, int64_t w,
                         struct dev_window win)
{
    const int64_t oh = dev_window_out(h, win.kh, win.sh, win.ph),
                  ow = dev_window_out(w, win.kw, win.sw, win.pw);
    const int64_t l = oh * ow, kk = win.kh * win.kw;
    FOR_EACH(i, planes * kk * l)
    {
        const int64_t p = i % l, r = (i / l) % kk, plane = i / (l * kk);
        const int64_t iy = p / ow * win.sh - win.ph + r / win.kw, ix = p % ow * win.sw - win.pw + r % win.kw;
        col[i] = iy >= 0 && iy < h && ix >= 0 && ix < w ? x[(plane * h + iy) * w + ix] : 0.0f;
    }
}

static void cu_im2col(void *ctx, float *col, const float *x, int64_t b, int64_t ch, int64_t h, int64_t w,
                      const struct dev_window *win)
{
    struct cuda *c = (struct cuda *)ctx;
    win_check(c, win, h, w, "im2col");
    const int64_t n = b * ch * win->kh * win->kw * ((h + 2 * win->ph - win->kh) / win->sh + 1) *
                      ((w + 2 * win->pw - win->kw) / win->sw + 1);
    if (n <= 0)
        return;
    LAUNCH(k_im2col, blocks_for(n), THREADS, 0, c->stream, col, x, b * ch, h, w, *win);
    LAUNCHED(c, "im2col");
}

/* dx entry += its col terms in (ki, kj) order. */
__global__ void k_col2im(float *dx, const float *col, int64_t planes, int64_t h, int64_t w,
                         struct dev_window win)
{
    const int64_t oh = dev_window_out(h, win.kh, win.sh, win.ph),
                  ow = dev_window_out(w, win.kw, win.sw, win.pw);
    const int64_t l = oh * ow, kk = win.kh * win.kw;
    FOR_EACH(i, planes * h * w)
    {
        const int64_t ix = i % w, iy = (i / w) % h, plane = i / (h * w);
        float s = dx[i];
        for (int64_t ki = 0; ki < win.kh; ki++) {
            const int64_t ty = iy + win.ph - ki;
            if (ty < 0 || ty % win.sh || ty / win.sh >= oh)
                continue;
            for (int64_t kj = 0; kj < win.kw; kj++) {
                const int64_t tx = ix + win.pw - kj;
                if (tx < 0 || tx % win.sw || tx / win.sw >= ow)
                    continue;
                s += col[(plane * kk + ki * win.kw + kj) * l + ty / win.sh * ow + tx / win.sw];
            }
        }
        dx[i] = s;
    }
}

static void cu_col2im(void *ctx, float *dx, const float *col, int64_t b, int64_t ch, int64_t h, int64_t w,
                      const struct dev_window *win)
{
    struct cuda *c = (struct cuda *)ctx;
    win_check(c, win, h, w, "col2im");
    if (b * ch * h * w <= 0)
        return;
    LAUNCH(k_col2im, blocks_for(b * ch * h * w), THREADS, 0, c->stream, dx, col, b * ch, h, w, *win);
    LAUNCHED(c, "col2im");
}

__global__ void k_maxpool_forward(float *y, int32_t *idx, const float *x, int64_t planes, int64_t h,
                                  int64_t w, struct dev_window win)
{
    const int64_t oh = dev_window_out(h, win.kh, win.sh, win.ph),
                  ow = dev_window_out(w, win.kw, win.sw, win.pw);
    FOR_EACH(o, planes * oh * ow)
    {
        const int64_t ox = o % ow, oy = (o / ow) % oh, plane = o / (oh * ow);
        const float *xp = x + plane * h * w;
        int64_t best;
        y[o] = dev_window_max(&win, xp, oy, ox, h, w, &best);
        idx[o] = (int32_t)best;
    }
}

static void cu_maxpool2d_forward(void *ctx, float *y, int32_t *idx, const float *x, int64_t planes, int64_t h,
                                 int64_t w, const struct dev_window *win)
{
    struct cuda *c = (struct cuda *)ctx;
    win_check(c, win, h, w, "maxpool2d_forward");
    if (h * w > INT32_MAX)
        die(c, "maxpool2d_forward", "a plane of more than 2^31-1 entries");
    const int64_t n =
        planes * dev_window_out(h, win->kh, win->sh, win->ph) * dev_window_out(w, win->kw, win->sw, win->pw);
    if (n <= 0)
        return;
    LAUNCH(k_maxpool_forward, blocks_for(n), THREADS, 0, c->stream, y, idx, x, planes, h, w, *win);
    LAUNCHED(c, "maxpool2d_forward");
}

/* dx entry = 0 + the dy of every output (in order) whose argmax it is. */
__global__ void k_maxpool_backward(float *dx, const float *dy, const int32_t *idx, int64_t planes, int64_t h,
                                   int64_t w, struct dev_window win)
{
    const int64_t oh = dev_window_out(h, win.kh, win.sh, win.ph),
                  ow = dev_window_out(w, win.kw, win.sw, win.pw);
    FOR_EACH(i, planes * h * w)
    {
        const int64_t ix = i % w, iy = (i / w) % h, plane = i / (h * w), self = iy * w + ix;
        int64_t ylo, yhi, xlo, xhi;
        win_range(iy, win.kh, win.sh, win.ph, oh, &ylo, &yhi);
        win_range(ix, win.kw, win.sw, win.pw, ow, &xlo, &xhi);
        float s = 0.0f;
        for (int64_t oy = ylo; oy <= yhi; oy++)
            for (int64_t ox = xlo; ox <= xhi; ox++) {
                const int64_t o = (plane * oh + oy) * ow + ox;
                if (idx[o] == self)
                    s += dy[o];
            }
        dx[i] = s;
    }
}

static void cu_maxpool2d_backward(void *ctx, float *dx, const float *dy, const int32_t *idx, int64_t planes,
                                  int64_t h, int64_t w, const struct dev_window *win)
{
    struct cuda *c = (struct cuda *)ctx;
    win_check(c, win, h, w, "maxpool2d_backward");
    if (planes * h * w <= 0)
        return;
    LAUNCH(k_maxpool_backward, blocks_for(planes * h * w), THREADS, 0, c->stream, dx, dy, idx, planes, h, w,
           *win);
    LAUNCHED(c, "maxpool2d_backward");
}

__global__ void k_avgpool_forward(float *y, const float *x, int64_t planes, int64_t h, int64_t w,
                                  struct dev_window win)
{
    const int64_t oh = dev_window_out(h, win.kh, win.sh, win.ph),
                  ow = dev_window_out(w, win.kw, win.sw, win.pw);
    FOR_EACH(o, planes * oh * ow)
    {
        const int64_t ox = o % ow, oy = (o / ow) % oh, plane = o / (oh * ow);
        const float *xp = x + plane * h * w;
        y[o] =
            __fdiv_rn(dev_window_sum(&win, xp, oy, ox, h, w), (float)dev_window_divisor(&win, oy, ox, h, w));
    }
}

static void cu_avgpool2d_forward(void *ctx, float *y, const float *x, int64_t planes, int64_t h, int64_t w,
                                 const struct dev_window *win)
{
    struct cuda *c = (struct cuda *)ctx;
    win_check(c, win, h, w, "avgpool2d_forward");
    const int64_t n =
        planes * dev_window_out(h, win->kh, win->sh, win->ph) * dev_window_out(w, win->kw, win->sw, win->pw);
    if (n <= 0)
        return;
    LAUNCH(k_avgpool_forward, blocks_for(n), THREADS, 0, c->stream, y, x, planes, h, w, *win);
    LAUNCHED(c, "avgpool2d_forward");
}

/* dx entry = 0 + dy / divisor of every window holding it, in output order. */
__global__ void k_avgpool_backward(float *dx, const float *dy, int64_t planes, int64_t h, int64_t w,
                                   struct dev_window win)
{
    const int64_t oh = dev_window_out(h, win.kh, win.sh, win.ph),
                  ow = dev_window_out(w, win.kw, win.sw, win.pw);
    FOR_EACH(i, planes * h * w)
    {
        const int64_t ix = i % w, iy = (i / w) % h, plane = i / (h * w);
        int64_t ylo, yhi, xlo, xhi;
        win_range(iy, win.kh, win.sh, win.ph, oh, &ylo, &yhi);
        win_range(ix, win.kw, win.sw, win.pw, ow, &xlo, &xhi);
        float s = 0.0f;
        for (int64_t oy = ylo; oy <= yhi; oy++)
            for (int64_t ox = xlo; ox <= xhi; ox++)
                s +=
                    __fdiv_rn(dy[(plane * oh + oy) * ow + ox], (float)dev_window_divisor(&win, oy, ox, h, w));
        dx[i] = s;
    }
}

static void cu_avgpool2d_backward(void *ctx, float *dx, const float *dy, int64_t planes, int64_t h, int64_t w,
                                  const struct dev_window *win)
{
    struct cuda *c = (struct cuda *)ctx;
    win_check(c, win, h, w, "avgpool2d_backward");
    if (planes * h * w <= 0)
        return;
    LAUNCH(k_avgpool_backward, blocks_for(planes * h * w), THREADS, 0, c->stream, dx, dy, planes, h, w, *win);
    LAUNCHED(c, "avgpool2d_backward");
}

/* BatchNorm: a block per channel takes its statistics over the m = n*s entries in double
 * (block_sum: a fixed order), as cpu_conv.c does; then y = x * a + k in float with two
 * roundings (no contraction), a thread per entry. The backward's dx is written by the
 * channel's block itself, after its two sums: enough for conv nets' channel counts. */
#define BN_THREADS 512

/* Entry q in [0, m) of channel ch of x[n,c,s]. */
__device__ int64_t bn_at(int64_t q, int64_t ch, int64_t c, int64_t s)
{
    return (q / s * c + ch) * s + q % s;
}

__global__ void k_bn_stats(float *mean, float *invstd, float *running_mean, float *running_var,
                           const float *x, int64_t n, int64_t c, int64_t s, double eps, double momentum)
{
    __shared__ double mu_shared;
    const int64_t ch = blockIdx.x, m = n * s;
    double sum = 0.0;
    for (int64_t q = threadIdx.x; q < m; q += blockDim.x)
        sum += (double)x[bn_at(q, ch, c, s)];
    sum = block_sum(sum);
    if (threadIdx.x == 0)
        mu_shared = sum / (double)m;
    __syncthreads(); /* mu_shared is set, and block_sum's scratch is free again */
    const double mu = mu_shared;
    double sq = 0.0;
    for (int64_t q = threadIdx.x; q < m; q += blockDim.x) {
        const double d = (double)x[bn_at(q, ch, c, s)] - mu;
        sq += d * d;
    }
    sq = block_sum(sq);
    if (threadIdx.x == 0) {
        mean[ch] = (float)mu;
        invstd[ch] = (float)(1.0 / sqrt(sq / (double)m + eps));
        if (running_mean)
            running_mean[ch] = (float)__dadd_rn(__dmul_rn(momentum, mu),
                                                __dmul_rn(1.0 - momentum, (double)running_mean[ch]));
        if (running_var)
            running_var[ch] = (float)__dadd_rn(__dmul_rn(momentum, sq / (double)(m - 1)),
                                               __dmul_rn(1.0 - momentum, (double)running_var[ch]));
    }
}

/* y = x * a + k; with `eval` the statistics are the running ones (invstd in float). */
__global__ void k_bn_apply(float *y, const float *x, const float *w, const float *b, const float *mean,
                           const float *invstd_or_var, bool eval, float eps, int64_t n, int64_t c, int64_t s)
{
    FOR_EACH(e, n * c * s)
    {
        const int64_t ch = e / s % c;
        const float is = eval ? 1.0f / sqrtf(invstd_or_var[ch] + eps) : invstd_or_var[ch];
        const float a = __fmul_rn(is, w ? w[ch] : 1.0f);
        const float k = __fsub_rn(b ? b[ch] : 0.0f, __fmul_rn(mean[ch], a));
        y[e] = __fadd_rn(__fmul_rn(x[e], a), k);
    }
}

/* Sizes a kernel could not take: a negative one (a caller's bug), or more channels than a
 * grid has blocks (one block per channel). Each is named as it is. */
static void bn_check(const struct cuda *c, int64_t n, int64_t ch, int64_t s, const char *op)
{
    char why[160];
    if (n < 0 || ch < 0 || s < 0) {
        snprintf(why, sizeof why, "a negative size: batch %lld, channels %lld, spatial size %lld",
                 (long long)n, (long long)ch, (long long)s);
        die(c, op, why);
    }
    if (ch > INT32_MAX) {
        snprintf(why, sizeof why, "%lld channels, over 2^31-1 (a block per channel)", (long long)ch);
        die(c, op, why);
    }
}

static void cu_batchnorm_forward_train(void *ctx, float *y, float *mean, float *invstd, float *running_mean,
                                       float *running_var, const float *x, const float *w, const float *b,
                                       int64_t n, int64_t ch, int64_t s, double eps, double momentum)
{
    struct cuda *c = (struct cuda *)ctx;
    bn_check(c, n, ch, s, "batchnorm_forward_train");
    if (n * ch * s <= 0)
        return;
    LAUNCH(k_bn_stats, (unsigned)ch, BN_THREADS, 0, c->stream, mean, invstd, running_mean, running_var, x, n,
           ch, s, eps, momentum);
    LAUNCHED(c, "batchnorm_forward_train");
    LAUNCH(k_bn_apply, blocks_for(n * ch * s), THREADS, 0, c->stream, y, x, w, b, mean, invstd, false, 0.0f,
           n, ch, s);
    LAUNCHED(c, "batchnorm_forward_train");
}

static void cu_batchnorm_forward_eval(void *ctx, float *y, const float *x, const float *w, const float *b,
                                      const float *running_mean, const float *running_var, int64_t n,
                                      int64_t ch, int64_t s, double eps)
{
    struct cuda *c = (struct cuda *)ctx;
    bn_check(c, n, ch, s, "batchnorm_forward_eval");
    if (n * ch * s <= 0)
        return;
    LAUNCH(k_bn_apply, blocks_for(n * ch * s), THREADS, 0, c->stream, y, x, w, b, running_mean, running_var,
           true, (float)eps, n, ch, s);
    LAUNCHED(c, "batchnorm_forward_eval");
}

/* A block per channel: the two sums in double, then the channel's dx entries. */
__global__ void k_bn_backward(float *dx, float *dw, float *db, const float *dy, const float *x,
                              const float *mean, const float *invstd, const float *w, int64_t n, int64_t c,
                              int64_t s)
{
    __shared__ double sums[2];
    const int64_t ch = blockIdx.x, m = n * s;
    const double mu = mean[ch], is = invstd[ch];
    double sdy = 0.0, dot = 0.0;
    for (int64_t q = threadIdx.x; q < m; q += blockDim.x) {
        const int64_t e = bn_at(q, ch, c, s);
        sdy += (double)dy[e];
        dot += ((double)x[e] - mu) * (double)dy[e];
    }
    sdy = block_sum(sdy);
    if (threadIdx.x == 0)
        sums[0] = sdy;
    __syncthreads();
    dot = block_sum(dot);
    if (threadIdx.x == 0)
        sums[1] = dot;
    __syncthreads();
    sdy = sums[0];
    dot = sums[1];
    const double gmean = sdy / (double)m, k = dot * is * is / (double)m;
    const double scale = is * (w ? (double)w[ch] : 1.0);
    for (int64_t q = threadIdx.x; q < m; q += blockDim.x) {
        const int64_t e = bn_at(q, ch, c, s);
        /* Two roundings where the CPU rounds twice (nvcc would fuse them). */
        dx[e] = (float)(((double)dy[e] - gmean - __dmul_rn((double)x[e] - mu, k)) * scale);
    }
    if (threadIdx.x == 0) {
        if (dw)
            dw[ch] += (float)(dot * is);
        if (db)
            db[ch] += (float)sdy;
    }
}

static void cu_batchnorm_backward(void *ctx, float *dx, float *dw, float *db, const float *dy, const float *x,
                                  const float *mean, const float *invstd, const float *w, int64_t n,
                                  int64_t ch, int64_t s)
{
    struct cuda *c = (struct cuda *)ctx;
    bn_check(c, n, ch, s, "batchnorm_backward");
    if (n * ch * s <= 0)
        return;
    LAUNCH(k_bn_backward, (unsigned)ch, BN_THREADS, 0, c->stream, dx, dw, db, dy, x, mean, invstd, w, n, ch,
           s);
    LAUNCHED(c, "batchnorm_backward");
}

/* num_batches_tracked += v: one thread, queued behind the forward pass, so that the counter
 * never travels to the host and back (a stream synchronisation per BatchNorm layer). */
__global__ void k_add_i64(int64_t *x, int64_t v)
{
    *x += v;
}

static void cu_add_i64(void *ctx, int64_t *x, int64_t v)
{
    struct cuda *c = (struct cuda *)ctx;
    LAUNCH(k_add_i64, 1, 1, 0, c->stream, x, v);
    LAUNCHED(c, "add_i64");
}

static const struct dev_ops cuda_ops = {
    .name = "cuda",
    .alloc = cu_alloc,
    .free = cu_free,
    .to_device = cu_to_device,
    .to_host = cu_to_host,
    .synchronize = cu_synchronize,
    .gemm = cu_gemm,
    .add_bias = cu_add_bias,
    .set_bias = cu_set_bias,
    .bias_grad = cu_bias_grad,
    .act_forward = cu_act_forward,
    .act_backward = cu_act_backward,
    .mse = cuda__mse,
    .cross_entropy = cuda__cross_entropy,
    .sgd_step = cu_sgd_step,
    .adamw_step = cu_adamw_step,
    .fill = cu_fill,
    .copy = cu_copy,
    .scale = cu_scale,
    .scale_copy = cu_scale_copy,
    .gemm_batched = cu_gemm_batched,
    .embedding_forward = cu_embedding_forward,
    .embedding_backward = cu_embedding_backward,
    .layernorm_forward = cu_layernorm_forward,
    .layernorm_backward = cu_layernorm_backward,
    .softmax_forward = cu_softmax_forward,
    .softmax_backward = cu_softmax_backward,
    .heads_split = cu_heads_split,
    .heads_split_backward = cu_heads_split_backward,
    .heads_merge = cu_heads_merge,
    .heads_merge_backward = cu_heads_merge_backward,
    .add = cu_add,
    .mul = cu_mul,
    .dropout_mask = cu_dropout_mask,
    .sumsq = cuda__sumsq,
    .im2col = cu_im2col,
    .col2im = cu_col2im,
    .maxpool2d_forward = cu_maxpool2d_forward,
    .maxpool2d_backward = cu_maxpool2d_backward,
    .avgpool2d_forward = cu_avgpool2d_forward,
    .avgpool2d_backward = cu_avgpool2d_backward,
    .batchnorm_forward_train = cu_batchnorm_forward_train,
    .batchnorm_forward_eval = cu_batchnorm_forward_eval,
    .batchnorm_backward = cu_batchnorm_backward,
    .add_i64 = cu_add_i64,
    .sgd_group = cu_sgd_group,
    .adamw_group = cu_adamw_group,
    .sumsq_group = cuda__sumsq_group,
    .fetch_start = cu_fetch_start,
    .fetch_wait = cu_fetch_wait,
    .gemv = NULL, /* cuBLAS's gemm does not pack: one row goes through gemm */
    .host_alloc = cu_host_alloc,
    .host_free = cu_host_free,
    .host_memory = false,
};

/* ---- the backend and the devices ---- */

/* True when the CUDA runtime works and sees at least one device; any error (no driver,
 * no device, a runtime too new for the driver) reads as "no". */
extern "C" int cuda__device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError(); /* clear the sticky error for later callers */
        return 0;
    }
    return n;
}

extern "C" bool cuda__device_info(int i, struct dev_cuda_info *out)
{
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    snprintf(out->name, sizeof out->name, "%s", p.name);
    out->memory = (uint64_t)p.totalGlobalMem;
    const unsigned char *u = (const unsigned char *)p.uuid.bytes;
    snprintf(out->uuid, sizeof out->uuid,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1], u[2],
             u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
    out->cc_major = p.major;
    out->cc_minor = p.minor;
    /* The emulated module (cuda/emu) is this file built by g++ with DDPD_CUDA_EMULATED. */
#ifdef DDPD_CUDA_EMULATED
    out->emulated = true;
#else
    out->emulated = false;
#endif
    return true;
}

/* What the kernels were compiled for: the list CMake's DDPD_CUDA_ARCHS resolved to
 * (DDPD_CUDA_CODE, "sm_80 sm_90 compute_90"); in the emulated module, the code its
 * emulated fat binary holds (DDPD_CUDA_EMU_CODE, emu/runtime.cc), which the emulated
 * driver also launches by. */
extern "C" const char *cuda__module_code(void)
{
#ifdef DDPD_CUDA_EMULATED
    return emuModuleCode();
#else
    return DDPD_CUDA_CODE;
#endif
}

/* Opening the device reports failures through `err` (the caller owns the exit). */
static bool open_failed(struct cuda *c, cudaError_t e, const char *what, struct ddpd_error *err)
{
    if (e == cudaSuccess)
        return false;
    (void)cudaGetLastError();
    ddpd_error_set(err, DDPD_EDEVICE, "device", "cuda: %s on GPU %d (%s): %s", what, c->device, c->name,
                   cudaGetErrorString(e));
    return true;
}

extern "C" struct dev cuda__dev_new(int device, bool tf32, struct ddpd_error *err)
{
    struct cuda *c = (struct cuda *)calloc(1, sizeof *c);
    if (!c) {
        ddpd_error_set(err, DDPD_ENOMEM, "device", "out of memory opening GPU %d", device);
        return (struct dev){NULL, NULL};
    }
    c->device = device;
    snprintf(c->name, sizeof c->name, "unknown");
    cudaDeviceProp p;
    if (open_failed(c, cudaSetDevice(device), "cudaSetDevice", err) ||
        open_failed(c, cudaGetDeviceProperties(&p, device), "cudaGetDeviceProperties", err))
        goto fail;
    snprintf(c->name, sizeof c->name, "%s", p.name);
    {
        /* A device the module has no code for fails at its first kernel launch with
         * cudaErrorNoKernelImageForDevice, in the middle of a job: ask the runtime now,
         * and say what the device is and what the module carries. */
        cudaFuncAttributes fa;
        cudaError_t e = cudaFuncGetAttributes(&fa, reinterpret_cast<const void *>(k_fill));
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            ddpd_error_set(err, DDPD_EDEVICE, "device",
                           "cuda: GPU %d (%s) has compute capability %d.%d, but this libddpd-cuda.so holds "
                           "no code it runs (%s): it was built for %s; rebuild it with -DDDPD_CUDA_ARCHS=all "
                           "(every architecture) or with %d%d in the list",
                           device, c->name, p.major, p.minor, cudaGetErrorString(e), cuda__module_code(),
                           p.major, p.minor);
            goto fail;
        }
    }
    {
        const char *one = getenv("DDPD_CUDA_ONE_BLOCK_REDUCTIONS");
        c->one_block = one && !strcmp(one, "1");
    }
    if (open_failed(c, cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking), "cudaStreamCreate",
                    err) ||
        open_failed(c, cudaEventCreateWithFlags(&c->fetched, cudaEventDisableTiming), "cudaEventCreate", err))
        goto fail;
    if (cublasCreate(&c->blas) != CUBLAS_STATUS_SUCCESS ||
        cublasSetStream(c->blas, c->stream) != CUBLAS_STATUS_SUCCESS ||
        /* Exact float32 unless the spec asks for TF32; PyTorch's default is the same. */
        cublasSetMathMode(c->blas, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH) !=
            CUBLAS_STATUS_SUCCESS) {
        ddpd_error_set(err, DDPD_EDEVICE, "device", "cuda: cublasCreate on GPU %d (%s) failed", device,
                       c->name);
        goto fail;
    }
    return (struct dev){&cuda_ops, c};
fail:
    cuda__dev_free((struct dev){&cuda_ops, c});
    return (struct dev){NULL, NULL};
}

extern "C" void cuda__dev_free(struct dev d)
{
    if (d.ops != &cuda_ops || !d.ctx)
        return;
    struct cuda *c = (struct cuda *)d.ctx;
    if (c->stream)
        cudaStreamSynchronize(c->stream);
    if (c->blas)
        cublasDestroy(c->blas);
    if (c->pinned)
        cudaFreeHost(c->pinned);
    cuda__reduce_free(c);
    if (c->fetched)
        cudaEventDestroy(c->fetched);
    if (c->stream)
        cudaStreamDestroy(c->stream);
    free(c);
}

extern "C" void *cuda__dev_stream(struct dev d)
{
    return d.ops == &cuda_ops ? (void *)((struct cuda *)d.ctx)->stream : NULL;
}

extern "C" int cuda__dev_device(struct dev d)
{
    return d.ops == &cuda_ops ? ((struct cuda *)d.ctx)->device : -1;
}

extern "C" const char *cuda__dev_name(struct dev d)
{
    return d.ops == &cuda_ops ? ((struct cuda *)d.ctx)->name : "";
}
