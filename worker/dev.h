/* dev.h — the compute backend table. Every tensor the model, loss and optimizer touch
 * lives in the backend's memory and is changed only through these ops, so the CPU
 * backend (dev/cpu.c, OpenBLAS) and the CUDA backend (cuda/dev.cu) are interchangeable.
 * The CPU ops are the reference every CUDA op is tested against.
 * Matrices are row-major float32; shapes are written [rows,cols]. */
#ifndef DDPD_DEV_H
#define DDPD_DEV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../schema/err.h"
#include "../schema/spec.h"

/* Hyper-parameters of one optimizer update, as PyTorch names them. */
/* Fill them with optim_sgd_hyper / optim_adamw_hyper (optim.h): the derived scalars at
 * the end are computed in double from the spec's values, as PyTorch's Python computes
 * them, and rounded to float once, which is what its float kernels then apply. */
struct sgd_hyper {
    float lr, momentum, dampening, weight_decay;
    bool nesterov;
    bool first;                /* first step for this parameter: buf = grad (no dampening) */
    float one_minus_dampening; /* 1 - dampening */
};
struct adamw_hyper {
    float lr, beta1, beta2, eps, weight_decay;
    int64_t step;                           /* 1-based step count after increment */
    float decay;                            /* 1 - lr * weight_decay */
    float one_minus_beta1, one_minus_beta2; /* 1 - beta1, 1 - beta2 */
    float neg_step_size;                    /* -lr / (1 - beta1^step) */
    float bc2_sqrt;                         /* sqrt(1 - beta2^step) */
};

/* A 2d window (conv2d, max/avg pool2d): kernel, stride and zero padding per dim (h, w),
 * no dilation, floor mode. An input plane [H,W] gives the output plane [OH,OW] with
 * OH = (H + 2*ph - kh) / sh + 1, OW = (W + 2*pw - kw) / sw + 1 (the caller has checked
 * that both are >= 1 and, for the pools, that ph <= kh/2 and pw <= kw/2, as PyTorch). */
struct dev_window {
    int64_t kh, kw, sh, sw, ph, pw;
};

struct dev_ops {
    const char *name;
    /* Memory. alloc returns zeroed memory or NULL. */
    void *(*alloc)(void *ctx, size_t bytes);
    void (*free)(void *ctx, void *p);
    void (*to_device)(void *ctx, void *dst, const void *src, size_t bytes);
    void (*to_host)(void *ctx, void *dst, const void *src, size_t bytes);
    void (*synchronize)(void *ctx); /* wait for all queued work */

    /* C[M,N] = alpha * op(A) * op(B) + beta * C, op(X) = X or X^T; lda/ldb/ldc are
     * row strides. (cblas_sgemm with CblasRowMajor.) */
    void (*gemm)(void *ctx, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                 const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc);
    /* y[M,N] += b[N] broadcast over rows. */
    void (*add_bias)(void *ctx, float *y, const float *b, int64_t m, int64_t n);
    /* y[M,N] = 0 + b[N] broadcast over rows: the bits of fill(y, 0) then add_bias, in one
     * pass over y. */
    void (*set_bias)(void *ctx, float *y, const float *b, int64_t m, int64_t n);
    /* db[N] += sum over rows of dy[M,N]. */
    void (*bias_grad)(void *ctx, float *db, const float *dy, int64_t m, int64_t n);
    /* y = f(x) elementwise; dx = f'(x) * dy (y is f(x), for tanh/sigmoid). */
    void (*act_forward)(void *ctx, layer_kind k, float *y, const float *x, int64_t n);
    void (*act_backward)(void *ctx, layer_kind k, float *dx, const float *dy, const float *x, const float *y,
                         int64_t n);
    /* Losses (means, as PyTorch): write the loss into *loss (one device float) and the
     * gradient of the loss w.r.t. pred into dpred (overwritten).
     * mse: pred/target [M,N]; cross_entropy: logits [M,N], labels [M] int32 in [0,N). */
    void (*mse)(void *ctx, const float *pred, const float *target, int64_t m, int64_t n, float *dpred,
                float *loss);
    void (*cross_entropy)(void *ctx, const float *logits, const int32_t *labels, int64_t m, int64_t n,
                          float *dlogits, float *loss);
    /* Optimizer updates of one parameter tensor of n elements, in place. */
    void (*sgd_step)(void *ctx, const struct sgd_hyper *h, float *param, const float *grad, float *buf,
                     int64_t n);
    void (*adamw_step)(void *ctx, const struct adamw_hyper *h, float *param, const float *grad,
                       float *exp_avg, float *exp_avg_sq, int64_t n);
    /* Small helpers. */
    void (*fill)(void *ctx, float *x, float v, int64_t n);
    void (*copy)(void *ctx, float *dst, const float *src, int64_t n);
    void (*scale)(void *ctx, float *x, float a, int64_t n);                          /* x *= a */
    void (*scale_copy)(void *ctx, float *dst, const float *src, float a, int64_t n); /* dst = src*a */

    /* v2 ops (CONTRACT.md §2a). Every one has a CPU reference here and a CUDA version in
     * cuda/dev.cu, compared by unit.test_cuda. Gradients of parameters (dw, db) are added
     * to (+=), as autograd accumulates; the model zeroes them when a step starts afresh.
     * Gradients of inputs (dx) are overwritten. */
    /* Batched GEMM: for i < batch, C_i = alpha * op(A_i) * op(B_i) + beta * C_i, with
     * X_i = X + i * stride_x (cblas_sgemm per i on the CPU; cublasSgemmStridedBatched). */
    void (*gemm_batched)(void *ctx, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                         const float *a, int64_t lda, int64_t stride_a, const float *b, int64_t ldb,
                         int64_t stride_b, float beta, float *c, int64_t ldc, int64_t stride_c,
                         int64_t batch);
    /* y[n,dim] = w[ids[i], :] (ids int32, already checked to be in range). */
    void (*embedding_forward)(void *ctx, float *y, const float *w, const int32_t *ids, int64_t n,
                              int64_t dim);
    /* dw[ids[i], :] += dy[i, :], rows in order i = 0..n-1 on the CPU. */
    void (*embedding_backward)(void *ctx, float *dw, const float *dy, const int32_t *ids, int64_t n,
                               int64_t dim);
    /* LayerNorm over the last dim of x[rows,dim]: y = (x - mean) * rstd * w + b, rstd =
     * 1/sqrt(biased var + eps); b may be NULL (no bias). Saves mean[rows], rstd[rows]. */
    void (*layernorm_forward)(void *ctx, float *y, float *mean, float *rstd, const float *x, const float *w,
                              const float *b, int64_t rows, int64_t dim, float eps);
    /* dx (overwritten), dw += , db += (db may be NULL). */
    void (*layernorm_backward)(void *ctx, float *dx, float *dw, float *db, const float *dy, const float *x,
                               const float *mean, const float *rstd, const float *w, int64_t rows,
                               int64_t dim);
    /* Row softmax of scale * x over x[rows, n]. With `causal` the rows are square blocks
     * of n query positions: row r is query r % n and keys j > r % n count as -inf (y 0).
     * y may be x (each entry is read before it is written, by the same thread). */
    void (*softmax_forward)(void *ctx, float *y, const float *x, int64_t rows, int64_t n, float scale,
                            bool causal);
    /* dx = scale * y * (dy - sum_j dy_j * y_j), row by row (dx overwritten). */
    void (*softmax_backward)(void *ctx, float *dx, const float *dy, const float *y, int64_t rows, int64_t n,
                             float scale);
    /* Attention's head layout: qkv [b,t,3,h,hd] -> q, k, v [b,h,t,hd] each; its backward
     * writes dqkv [b,t,3,h,hd] from dq, dk, dv. merge: yh [b,h,t,hd] -> y [b,t,h,hd];
     * its backward writes dyh from dy. All outputs overwritten. */
    void (*heads_split)(void *ctx, float *q, float *k, float *v, const float *qkv, int64_t b, int64_t t,
                        int64_t h, int64_t hd);
    void (*heads_split_backward)(void *ctx, float *dqkv, const float *dq, const float *dk, const float *dv,
                                 int64_t b, int64_t t, int64_t h, int64_t hd);
    void (*heads_merge)(void *ctx, float *y, const float *yh, int64_t b, int64_t t, int64_t h, int64_t hd);
    void (*heads_merge_backward)(void *ctx, float *dyh, const float *dy, int64_t b, int64_t t, int64_t h,
                                 int64_t hd);
    /* Elementwise: y = a + b, y = a * b (y may alias a or b). */
    void (*add)(void *ctx, float *y, const float *a, const float *b, int64_t n);
    void (*mul)(void *ctx, float *y, const float *a, const float *b, int64_t n);
    /* Dropout's mask: mask[i] = 1/(1-p) where rng_hash_uniform(seed, i) >= p, else 0
     * (rng_hash.h: the same draw on every backend). */
    void (*dropout_mask)(void *ctx, float *mask, int64_t n, float p, uint64_t seed);
    /* The sum of squares of x[n], accumulated in double, returned to the host (waits for
     * the queued work): gradient clipping's per-tensor norm is sqrt of it. */
    double (*sumsq)(void *ctx, const float *x, int64_t n);

    /* v2 conv-net ops (issue 18). Images are NCHW float32: x[b,c,H,W]; output sizes OH,
     * OW as struct dev_window says. A conv2d is im2col, then per image the gemm
     * y_i[O, OH*OW] = w[O, c*kh*kw] col_i (gemm_batched with stride_a 0); its backward is
     * dcol_i = w^T dy_i, then col2im, and dw += dy_i col_i^T. */
    /* col[b, c*kh*kw, OH*OW]: col[i, (ci*kh + ki)*kw + kj, oy*OW + ox] =
     * x[i, ci, oy*sh - ph + ki, ox*sw - pw + kj], 0 where that falls in the padding
     * (PyTorch's im2col layout). col is overwritten. */
    void (*im2col)(void *ctx, float *col, const float *x, int64_t b, int64_t c, int64_t h, int64_t w,
                   const struct dev_window *win);
    /* Its adjoint, accumulating: every entry of col[b, c*kh*kw, OH*OW] is added to the
     * entry of dx[b,c,H,W] that im2col read it from (padding entries are dropped). Each
     * dx entry receives its terms one by one in increasing (ki, kj) order, added onto
     * its current value (a sequential float sum, the same bits on every backend). */
    void (*col2im)(void *ctx, float *dx, const float *col, int64_t b, int64_t c, int64_t h, int64_t w,
                   const struct dev_window *win);
    /* Max pooling over `planes` = b*c planes x[planes,H,W] -> y[planes,OH,OW], padding
     * as -inf. idx[planes,OH,OW] (int32) is the argmax's index iy*W + ix inside its plane,
     * PyTorch's `indices`: the window is scanned row by row, a value replaces the maximum
     * when greater than it or NaN, so ties keep the first; a window of -inf only keeps
     * its first in-image position. H*W < 2^31. */
    void (*maxpool2d_forward)(void *ctx, float *y, int32_t *idx, const float *x, int64_t planes, int64_t h,
                              int64_t w, const struct dev_window *win);
    /* dx[planes,H,W] (overwritten) = sum of dy over the outputs whose idx points at the
     * entry, added onto 0 in increasing output order (oy, then ox). */
    void (*maxpool2d_backward)(void *ctx, float *dx, const float *dy, const int32_t *idx, int64_t planes,
                               int64_t h, int64_t w, const struct dev_window *win);
    /* Average pooling, count_include_pad true: y = (float sum of the window's in-image
     * entries, row by row from 0) / (kh*kw as PyTorch clips it: the window's extent
     * inside [-ph, H+ph) x [-pw, W+pw)). */
    void (*avgpool2d_forward)(void *ctx, float *y, const float *x, int64_t planes, int64_t h, int64_t w,
                              const struct dev_window *win);
    /* dx[planes,H,W] (overwritten) = sum over the windows holding the entry of dy / that
     * window's divisor (one division per term), added onto 0 in increasing output order. */
    void (*avgpool2d_backward)(void *ctx, float *dx, const float *dy, int64_t planes, int64_t h, int64_t w,
                               const struct dev_window *win);
    /* BatchNorm over x[n,c,s] (s = H*W; [B,C] is s = 1), per channel ch over its m = n*s
     * entries, as PyTorch 1.13's CPU kernel (statistics in double):
     * training: mean = sum(x)/m and var = sum((x - mean)^2)/m (biased) in double; saves
     * mean[c] = (float)mean and invstd[c] = (float)(1/sqrt(var + eps)) (double math);
     * running_mean = momentum*mean + (1-momentum)*running_mean and running_var =
     * momentum*var*m/(m-1) + (1-momentum)*running_var (UNBIASED), in double, stored as
     * float (both skipped when running_mean / running_var are NULL; the caller ensures
     * m > 1, PyTorch's "Expected more than 1 value per channel"). Then, in float,
     * a = invstd[ch] * w[ch], k = b[ch] - mean[ch] * a, y = x * a + k (two roundings,
     * no fused multiply-add); w, b NULL mean 1, 0 (affine false). y is overwritten. */
    void (*batchnorm_forward_train)(void *ctx, float *y, float *mean, float *invstd, float *running_mean,
                                    float *running_var, const float *x, const float *w, const float *b,
                                    int64_t n, int64_t c, int64_t s, double eps, double momentum);
    /* Eval: the same y with mean = running_mean[ch] and invstd = 1/sqrtf(running_var[ch] +
     * (float)eps) in float (PyTorch's opmath); nothing is saved or updated. */
    void (*batchnorm_forward_eval)(void *ctx, float *y, const float *x, const float *w, const float *b,
                                   const float *running_mean, const float *running_var, int64_t n, int64_t c,
                                   int64_t s, double eps);
    /* Training-mode backward from the saved mean/invstd, per channel in double:
     * sdy = sum(dy), dot = sum((x - mean) * dy); dx = (float)((dy - sdy/m - (x - mean) *
     * dot*invstd*invstd/m) * (invstd * w)) (dx overwritten; w NULL is 1); dw += (float)(dot *
     * invstd) and db += (float)sdy, each skipped when NULL. */
    void (*batchnorm_backward)(void *ctx, float *dx, float *dw, float *db, const float *dy, const float *x,
                               const float *mean, const float *invstd, const float *w, int64_t n, int64_t c,
                               int64_t s);
    /* x[0] += v on one int64 in the backend's memory (BatchNorm's num_batches_tracked),
     * queued like any op: the count never makes a round trip to the host. */
    void (*add_i64)(void *ctx, int64_t *x, int64_t v);

    /* Optional slots (NULL on the CPU, where the plain ops are already the fast path). */
    /* One optimizer update over a parameter group of `count` tensors in one launch:
     * tensor i is param[i], grad[i] (and buf[i] / exp_avg[i], exp_avg_sq[i]) of numel[i]
     * elements. Same result as one sgd_step / adamw_step per tensor. */
    void (*sgd_group)(void *ctx, const struct sgd_hyper *h, int count, float *const *param,
                      const float *const *grad, float *const *buf, const int64_t *numel);
    void (*adamw_group)(void *ctx, const struct adamw_hyper *h, int count, float *const *param,
                        const float *const *grad, float *const *exp_avg, float *const *exp_avg_sq,
                        const int64_t *numel);
    /* The sums of squares of `count` tensors x[i][n[i]] in one pass, written to the host's
     * out[count]; waits for the queued work once. out[i] is sumsq(x[i], n[i]), bit for bit:
     * gradient clipping reads every gradient with one synchronisation, not one a tensor. */
    void (*sumsq_group)(void *ctx, int count, const float *const *x, const int64_t *n, double *out);
    /* A read of n floats that does not stall the queue: fetch_start copies them into
     * pinned host memory behind the work queued so far and returns at once; fetch_wait
     * waits for that copy only and writes them into dst. One fetch in flight at a time. */
    void (*fetch_start)(void *ctx, const float *src, int64_t n);
    void (*fetch_wait)(void *ctx, float *dst, int64_t n);
    /* A matrix-vector product, y = alpha * op(A) x + beta * y with A [m,n] row-major (lda
     * its row stride), op(A) = A (x [n], y [m]) or A^T (x [m], y [n]): one token's linear
     * layers and attention in generation (infer/cache.c), which BLAS runs without gemm's
     * packing of A. NULL: the caller uses gemm with one row (CUDA, where cuBLAS's gemm
     * does not pack). Not used by training. */
    void (*gemv)(void *ctx, bool trans, int64_t m, int64_t n, float alpha, const float *a, int64_t lda,
                 const float *x, float beta, float *y);
    /* Host memory the backend copies to and from fastest (pinned on CUDA). */
    void *(*host_alloc)(void *ctx, size_t bytes);
    void (*host_free)(void *ctx, void *p);
    /* True when the backend's tensors are host memory that host code may read directly. */
    bool host_memory;
};

/* A backend instance: its table and its state. */
struct dev {
    const struct dev_ops *ops;
    void *ctx;
};

/* The CPU backend. `threads` sets OpenBLAS's thread count (1 = one thread per rank). */
struct dev dev_cpu_new(int threads);
void dev_cpu_free(struct dev d);
/* Whether the CPU backend fuses a*b+c into one rounding where PyTorch's kernels do. It
 * does by default when the CPU has AVX2 and FMA, because PyTorch 1.13 then runs its
 * AVX2 kernels, whose multiply-adds are fused; elsewhere PyTorch rounds twice and so do
 * we. Tests switch it to check both paths. Returns the previous setting. */
bool dev_cpu_set_fused(struct dev d, bool fused);

/* The CUDA backend (cuda/dev.cu) lives in the module libddpd-cuda.so, which the functions
 * below load on first need (cuda/plugin.h); ddpd-worker itself links no CUDA library.
 * dev_cuda_load loads it: false with `err` set (DDPD_EDEVICE: the module's path and
 * dlerror(), or "built without CUDA") when it cannot be loaded. */
bool dev_cuda_load(struct ddpd_error *err);
/* Whether an NVIDIA driver is installed (/proc/driver/nvidia/version, /dev/nvidiactl, or
 * WSL's /dev/dxg), or emulated devices are asked for (DDPD_CUDA_EMU set to a positive
 * number: the emulated module needs no driver). Without either there is no device, and the
 * functions below answer "none" without loading the module. */
bool dev_cuda_driver_present(void);
/* False when there is no NVIDIA driver, no module, or no device. */
bool dev_cuda_available(void);

/* The CUDA backend on visible device `device` (cudaSetDevice'd for the calling thread),
 * with one compute stream and one cuBLAS handle. `tf32` lets cuBLAS round GEMM inputs to
 * TF32 (the spec's "precision": "tf32"); otherwise GEMMs are exact float32.
 * Every CUDA or cuBLAS failure inside an op, out of memory included, is a device failure:
 * worker_die(DDPD_EDEVICE, "cuda: <op> on GPU <n> (<name>): <reason>"), exit code 4.
 * Returns {NULL, NULL} with `err` set (DDPD_EDEVICE) when the device cannot be opened. */
struct dev dev_cuda_new(int device, bool tf32, struct ddpd_error *err);
void dev_cuda_free(struct dev d); /* a no-op on any other backend */
/* The compute stream (a cudaStream_t) of a CUDA backend, NULL for any other. */
void *dev_cuda_stream(struct dev d);
/* The backend's device index and name, for messages ("GPU 0 (NVIDIA H200)"). */
int dev_cuda_device(struct dev d);
const char *dev_cuda_name(struct dev d);
/* The visible CUDA devices (0 when there is no driver, no module or no device), and what
 * `ddpd-worker --devices` prints of device i. False when i cannot be queried. */
struct dev_cuda_info {
    char name[256];
    uint64_t memory;        /* bytes */
    char uuid[48];          /* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi writes it */
    bool emulated;          /* a device of the emulated module (libddpd-cuda-emu.so), for tests */
    int cc_major, cc_minor; /* compute capability: 8.6 is {8, 6} */
    /* Filled by dev_cuda_device_info from the module's code list (cuda_code_pick):
     * whether the module has code this device runs, and which ("sm_80": a cubin of that
     * architecture; "compute_90": PTX the driver compiles for it), "" when none. */
    bool has_code;
    char code[16];
};
int dev_cuda_device_count(void);
bool dev_cuda_device_info(int i, struct dev_cuda_info *out);
/* What the loaded module was compiled for, as nvcc's code names separated by spaces
 * ("sm_75 sm_80 sm_86 sm_89 sm_90 sm_100 sm_120 compute_120": cubins of those
 * architectures and the PTX of the newest); "" when no module can be loaded. Borrowed,
 * valid for the process's life. */
const char *dev_cuda_module_code(void);

#endif
