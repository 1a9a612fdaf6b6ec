/* dev.h — the compute backend table. Every tensor the model, loss and optimizer touch
 * lives in the backend's memory and is changed only through these ops, so the CPU
 * backend (dev/cpu.c, OpenBLAS) and the CUDA backend (dev/cuda.cu) are interchangeable.
 * The CPU ops are the reference every CUDA op is tested against.
 * Matrices are row-major float32; shapes are written [rows,cols]. */
#ifndef DDPD_DEV_H
#define DDPD_DEV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../schema/spec.h"

/* Hyper-parameters of one optimizer update, as PyTorch names them. */
/* Fill them with optim_sgd_hyper / optim_adamw_hyper (optim.h): the derived scalars at
 * the end are computed in double from the spec's values, as PyTorch's Python computes
 * them, and rounded to float once, which is what its float kernels then apply. */
struct sgd_hyper {
    float lr, momentum, dampening, weight_decay;
    bool nesterov;
    bool first; /* first step for this parameter: buf = grad (no dampening) */
    float one_minus_dampening; /* 1 - dampening */
};
struct adamw_hyper {
    float lr, beta1, beta2, eps, weight_decay;
    int64_t step; /* 1-based step count after increment */
    float decay;                            /* 1 - lr * weight_decay */
    float one_minus_beta1, one_minus_beta2; /* 1 - beta1, 1 - beta2 */
    float neg_step_size;                    /* -lr / (1 - beta1^step) */
    float bc2_sqrt;                         /* sqrt(1 - beta2^step) */
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
    void (*gemm)(void *ctx, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                 float alpha, const float *a, int64_t lda, const float *b, int64_t ldb,
                 float beta, float *c, int64_t ldc);
    /* y[M,N] += b[N] broadcast over rows. */
    void (*add_bias)(void *ctx, float *y, const float *b, int64_t m, int64_t n);
    /* db[N] += sum over rows of dy[M,N]. */
    void (*bias_grad)(void *ctx, float *db, const float *dy, int64_t m, int64_t n);
    /* y = f(x) elementwise; dx = f'(x) * dy (y is f(x), for tanh/sigmoid). */
    void (*act_forward)(void *ctx, layer_kind k, float *y, const float *x, int64_t n);
    void (*act_backward)(void *ctx, layer_kind k, float *dx, const float *dy, const float *x,
                         const float *y, int64_t n);
    /* Losses (means, as PyTorch): write the loss into *loss (one device float) and the
     * gradient of the loss w.r.t. pred into dpred (overwritten).
     * mse: pred/target [M,N]; cross_entropy: logits [M,N], labels [M] int32 in [0,N). */
    void (*mse)(void *ctx, const float *pred, const float *target, int64_t m, int64_t n,
                float *dpred, float *loss);
    void (*cross_entropy)(void *ctx, const float *logits, const int32_t *labels, int64_t m,
                          int64_t n, float *dlogits, float *loss);
    /* Optimizer updates of one parameter tensor of n elements, in place. */
    void (*sgd_step)(void *ctx, const struct sgd_hyper *h, float *param, const float *grad,
                     float *buf, int64_t n);
    void (*adamw_step)(void *ctx, const struct adamw_hyper *h, float *param,
                       const float *grad, float *exp_avg, float *exp_avg_sq, int64_t n);
    /* Small helpers. */
    void (*fill)(void *ctx, float *x, float v, int64_t n);
    void (*copy)(void *ctx, float *dst, const float *src, int64_t n);
    void (*scale)(void *ctx, float *x, float a, int64_t n);             /* x *= a */
    void (*scale_copy)(void *ctx, float *dst, const float *src, float a, int64_t n); /* dst = src*a */
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

/* The CUDA backend (dev/cuda.cu); false when not compiled in or no device. */
bool dev_cuda_available(void);

#endif
