/* cuda/reduce.cu — the reductions of the CUDA backend: the losses (mse, cross_entropy) and
 * the sums of squares (sumsq, and sumsq_group: gradient clipping's norms of every gradient
 * in one pass). Each is two launches over a grid of blocks: every block writes the double
 * sum of its share into the context's scratch (`partials`), then one block per result adds
 * those partials in index order. The grid is a function of the sizes alone, never of the
 * device or of timing, and there are no atomics: a run and its resumed or joined twin, on
 * any GPU, get the same bits. The CPU twins (dev/cpu.c) sum sequentially, so the two agree
 * to the rounding of a double sum (test_cuda's tolerances say how far). */
#include "cuda_impl.h"

#define SUM_PER_THREAD 16   /* elements per thread before a sum's grid grows */
#define SUM_BLOCKS     1024 /* blocks of one sum at most: enough to fill the largest GPU */
#define PARTIALS       (GROUP_MAX * SUM_BLOCKS)
#define ONE_BLOCK      1024 /* DDPD_CUDA_ONE_BLOCK_REDUCTIONS: the old launch, one block of this */

static unsigned reduce_threads(const struct cuda *c)
{
    return c->one_block ? ONE_BLOCK : THREADS;
}

/* Blocks of a sum over n elements: SUM_PER_THREAD elements per thread or more, at most
 * SUM_BLOCKS, at least 1 (one block writes a sum of nothing). */
static unsigned sum_blocks(const struct cuda *c, int64_t n)
{
    const int64_t per = (int64_t)THREADS * SUM_PER_THREAD, b = (n + per - 1) / per;
    return c->one_block ? 1u : (unsigned)(b < 1 ? 1 : b > SUM_BLOCKS ? SUM_BLOCKS : b);
}

/* The partial sums' scratch: PARTIALS doubles (512 KiB), one allocation per context. */
static double *partials(struct cuda *c)
{
    if (!c->partials)
        check(c, cudaMalloc((void **)&c->partials, PARTIALS * sizeof(double)), "reduce");
    return c->partials;
}

void cuda__reduce_free(struct cuda *c)
{
    if (c->partials)
        cudaFree(c->partials);
    if (c->sums)
        cudaFree(c->sums);
    c->partials = c->sums = NULL;
    c->sums_n = 0;
}

/* *out = (float)(the sum of part[0..g) / denom), one block adding in index order; NaN for
 * denom 0, PyTorch's mean over nothing. */
__global__ void k_mean_of_partials(const double *part, unsigned g, double denom, float *out)
{
    double s = 0.0;
    for (unsigned i = threadIdx.x; i < g; i += blockDim.x)
        s += part[i];
    s = block_sum(s);
    if (threadIdx.x == 0)
        *out = denom > 0.0 ? (float)(s / denom) : NAN;
}

/* ---- mse: a grid-stride pass writes the gradient and each block's sum of squares ---- */

__global__ void k_mse(const float *pred, const float *target, int64_t total, float norm, float *dpred,
                      double *part)
{
    double s = 0.0;
    FOR_EACH(i, total)
    {
        const float d = pred[i] - target[i];
        s += (double)d * (double)d;
        dpred[i] = norm * d;
    }
    s = block_sum(s);
    if (threadIdx.x == 0)
        part[blockIdx.x] = s;
}

void cuda__mse(void *ctx, const float *pred, const float *target, int64_t m, int64_t n, float *dpred,
               float *loss)
{
    struct cuda *c = (struct cuda *)ctx;
    const int64_t total = m * n;
    const float norm = (float)(2.0 / (double)total);
    const unsigned g = sum_blocks(c, total), threads = reduce_threads(c);
    double *part = partials(c);
    LAUNCH(k_mse, g, threads, 0, c->stream, pred, target, total, norm, dpred, part);
    LAUNCHED(c, "mse");
    LAUNCH(k_mean_of_partials, 1, threads, 0, c->stream, part, g, total > 0 ? (double)total : 0.0, loss);
    LAUNCHED(c, "mse");
}

/* ---- cross_entropy: a warp per row, rows spread over the grid ----
 * Per row: max, sum of exp in double, log-softmax, gradient (dev/cpu.c's formula); lane 0
 * of each warp keeps its rows' negative log-likelihoods, and the block adds them into its
 * partial. A row's own arithmetic depends only on the warp's 32 lanes, so the gradient's
 * bits do not depend on the grid. */
__global__ void k_cross_entropy(const float *logits, const int32_t *labels, int64_t m, int64_t n,
                                float *dlogits, double *part)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const float g = -(1.0f / (float)m);
    double nll = 0.0;
    for (int64_t r = (int64_t)blockIdx.x * warps + warp; r < m && n > 0; r += (int64_t)gridDim.x * warps) {
        const float *x = logits + r * n;
        float *dx = dlogits + r * n;
        const int32_t label = labels[r];
        if (label < 0 || label >= n) {
            for (int64_t j = lane; j < n; j += 32)
                dx[j] = NAN;
            nll += lane == 0 ? (double)NAN : 0.0;
            continue;
        }
        float mx = x[0];
        for (int64_t j = lane; j < n; j += 32)
            mx = x[j] > mx ? x[j] : mx;
        for (int o = 16; o > 0; o >>= 1) {
            const float other = __shfl_xor_sync(0xffffffffu, mx, o);
            mx = other > mx ? other : mx;
        }
        double s = 0.0;
        for (int64_t j = lane; j < n; j += 32)
            s += (double)expf(x[j] - mx);
        for (int o = 16; o > 0; o >>= 1)
            s += __shfl_xor_sync(0xffffffffu, s, o);
        const float lse = (float)log(s);
        for (int64_t j = lane; j < n; j += 32)
            dx[j] = __fmul_rn(-expf((x[j] - mx) - lse), g);
        __syncwarp();
        if (lane == 0) {
            /* The label's entry adds g itself: g - exp(logp) * g in one fused step. */
            const float logp = (x[label] - mx) - lse;
            dx[label] = fmaf(-expf(logp), g, g);
            nll -= (double)logp;
        }
        __syncwarp();
    }
    nll = block_sum(nll);
    if (threadIdx.x == 0)
        part[blockIdx.x] = nll;
}

void cuda__cross_entropy(void *ctx, const float *logits, const int32_t *labels, int64_t m, int64_t n,
                         float *dlogits, float *loss)
{
    struct cuda *c = (struct cuda *)ctx;
    m = m < 0 ? 0 : m;
    const unsigned threads = reduce_threads(c), rows = threads / 32;
    const int64_t want = (m + rows - 1) / rows;
    const unsigned g = c->one_block ? 1u : (unsigned)(want < 1 ? 1 : want > SUM_BLOCKS ? SUM_BLOCKS : want);
    double *part = partials(c);
    LAUNCH(k_cross_entropy, g, threads, 0, c->stream, logits, labels, m, n, dlogits, part);
    LAUNCHED(c, "cross_entropy");
    LAUNCH(k_mean_of_partials, 1, threads, 0, c->stream, part, g, m > 0 && n > 0 ? (double)m : 0.0, loss);
    LAUNCHED(c, "cross_entropy");
}

/* ---- sums of squares: up to GROUP_MAX tensors a launch ----
 * Tensor t owns blocks (and partials) [first[t], first[t+1]), sum_blocks(n[t]) of them;
 * block b of those reads elements b*blockDim.x + threadIdx.x, stepping by the tensor's
 * blocks times blockDim.x. */
struct sum_group {
    int count;
    const float *x[GROUP_MAX];
    int64_t n[GROUP_MAX];
    unsigned first[GROUP_MAX + 1];
};
static_assert(sizeof(struct sum_group) + 2 * sizeof(void *) <= 4096,
              "a sum launch's arguments fit the 4 KiB every CUDA device takes");

__device__ int sum_tensor(const struct sum_group &gr, unsigned b)
{
    int t = 0;
    while (t + 1 < gr.count && gr.first[t + 1] <= b)
        t++;
    return t;
}

__global__ void k_sumsq(struct sum_group gr, double *part)
{
    const unsigned b = blockIdx.x;
    const int t = sum_tensor(gr, b);
    const float *x = gr.x[t];
    const int64_t step = (int64_t)(gr.first[t + 1] - gr.first[t]) * blockDim.x;
    double s = 0.0;
    for (int64_t i = (int64_t)(b - gr.first[t]) * blockDim.x + threadIdx.x; i < gr.n[t]; i += step)
        s += (double)x[i] * (double)x[i];
    s = block_sum(s);
    if (threadIdx.x == 0)
        part[b] = s;
}

/* out[t] = the sum of tensor t's partials in index order, block t for tensor t. */
__global__ void k_sum_partials(struct sum_group gr, const double *part, double *out)
{
    const unsigned lo = gr.first[blockIdx.x], hi = gr.first[blockIdx.x + 1];
    double s = 0.0;
    for (unsigned i = lo + threadIdx.x; i < hi; i += blockDim.x)
        s += part[i];
    s = block_sum(s);
    if (threadIdx.x == 0)
        out[blockIdx.x] = s;
}

/* Room for `count` sums on the device; grows by a fresh allocation, once the stream no
 * longer reads the old one. */
static double *sums(struct cuda *c, int count)
{
    if (count > c->sums_n) {
        if (c->sums) {
            check(c, cudaStreamSynchronize(c->stream), "sumsq");
            check(c, cudaFree(c->sums), "sumsq");
            c->sums = NULL;
        }
        check(c, cudaMalloc((void **)&c->sums, (size_t)count * sizeof(double)), "sumsq");
        c->sums_n = count;
    }
    return c->sums;
}

/* Every tensor's sum of squares in two launches per GROUP_MAX tensors (the partials'
 * scratch is reused launch after launch, in stream order), then one copy of the `count`
 * sums to the host: the only wait. */
void cuda__sumsq_group(void *ctx, int count, const float *const *x, const int64_t *n, double *out)
{
    struct cuda *c = (struct cuda *)ctx;
    if (count <= 0)
        return;
    double *part = partials(c), *dev_sums = sums(c, count);
    const unsigned threads = reduce_threads(c);
    for (int from = 0; from < count; from += GROUP_MAX) {
        struct sum_group gr;
        memset(&gr, 0, sizeof gr);
        gr.count = count - from < GROUP_MAX ? count - from : GROUP_MAX;
        for (int t = 0; t < gr.count; t++) {
            gr.x[t] = x[from + t];
            gr.n[t] = n[from + t] > 0 ? n[from + t] : 0;
            gr.first[t + 1] = gr.first[t] + sum_blocks(c, gr.n[t]);
        }
        LAUNCH(k_sumsq, gr.first[gr.count], threads, 0, c->stream, gr, part);
        LAUNCHED(c, "sumsq");
        LAUNCH(k_sum_partials, (unsigned)gr.count, threads, 0, c->stream, gr, part, dev_sums + from);
        LAUNCHED(c, "sumsq");
    }
    check(c,
          cudaMemcpyAsync(out, dev_sums, (size_t)count * sizeof(double), cudaMemcpyDeviceToHost, c->stream),
          "sumsq");
    check(c, cudaStreamSynchronize(c->stream), "sumsq");
}

/* One tensor: the group of one, so the same bits as its entry in any group. */
double cuda__sumsq(void *ctx, const float *x, int64_t n)
{
    double h = 0.0;
    if (n > 0)
        cuda__sumsq_group(ctx, 1, &x, &n, &h);
    return h;
}
