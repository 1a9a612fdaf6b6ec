/* loss.c — the two reductions of issue 34 on one device, for scripts/gpu-check.sh and its
 * PyTorch twin bench/loss_torch.py: the cross entropy of [rows, vocab] logits (the loss and
 * its gradient, dev_ops.cross_entropy: GPT-2's head is [8192, 50304] at batch 8, T 1024),
 * and gradient clipping's norm over the gradients of bench_gpu_step's GPT-2-small
 * (optim_clip_grad_norm: 150 tensors, 163 M floats), each timed between two
 * synchronisations after a warm-up.
 *
 *   bench_loss [--rows R] [--vocab V] [--model gpt2s|gptmini] [--iters N] [--before] [--cpu]
 *
 * --before measures the launch shape the code had before issue 34 with today's kernels:
 * the reductions as one block of 1,024 threads (DDPD_CUDA_ONE_BLOCK_REDUCTIONS=1, the
 * module's switch for this) and the clip norm as one sum of squares and one wait per
 * tensor (sumsq_group left out). On the emulated device (DDPD_CUDA_PLUGIN=
 * libddpd-cuda-emu.so) the times mean nothing: use small --rows, --vocab and gptmini
 * there, as a smoke test of the program.
 *
 * Prints two JSON lines: {"bench":"cross_entropy","rows","vocab","device","variant","ms",
 * "gb_per_s" (bytes read and written per second: logits read three times, the gradient
 * written once),"loss"} and {"bench":"clip_norm","model","tensors","params","device",
 * "variant","ms","norm"}. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../schema/spec.h"
#include "../worker/dev.h"
#include "../worker/model.h"
#include "../worker/optim.h"
#include "../worker/rng.h"
#include "gpt_spec.h"

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int bench_cross_entropy(struct dev d, int64_t rows, int64_t vocab, int iters, const char *variant)
{
    const int64_t n = rows * vocab;
    float *hx = malloc((size_t)n * sizeof(float));
    int32_t *hl = malloc((size_t)rows * sizeof(int32_t));
    if (!hx || !hl) {
        fprintf(stderr, "bench_loss: out of memory for [%lld, %lld] logits\n", (long long)rows,
                (long long)vocab);
        return 1;
    }
    struct rng r;
    rng_seed(&r, 1);
    for (int64_t i = 0; i < n; i++)
        hx[i] = (float)(2.0 * rng_normal(&r));
    for (int64_t i = 0; i < rows; i++)
        hl[i] = (int32_t)rng_below(&r, (uint64_t)vocab);
    float *x = d.ops->alloc(d.ctx, (size_t)n * sizeof(float)),
          *dx = d.ops->alloc(d.ctx, (size_t)n * sizeof(float));
    int32_t *lab = d.ops->alloc(d.ctx, (size_t)rows * sizeof(int32_t));
    float *loss = d.ops->alloc(d.ctx, sizeof(float));
    d.ops->to_device(d.ctx, x, hx, (size_t)n * sizeof(float));
    d.ops->to_device(d.ctx, lab, hl, (size_t)rows * sizeof(int32_t));
    d.ops->cross_entropy(d.ctx, x, lab, rows, vocab, dx, loss); /* warm-up */
    d.ops->synchronize(d.ctx);
    const double t0 = now_s();
    for (int i = 0; i < iters; i++)
        d.ops->cross_entropy(d.ctx, x, lab, rows, vocab, dx, loss);
    d.ops->synchronize(d.ctx);
    const double dt = (now_s() - t0) / iters;
    float l;
    d.ops->to_host(d.ctx, &l, loss, sizeof l);
    printf("{\"bench\":\"cross_entropy\",\"rows\":%lld,\"vocab\":%lld,\"device\":\"%s\",\"variant\":\"%s\","
           "\"ms\":%.6f,\"gb_per_s\":%.1f,\"loss\":%.6g}\n",
           (long long)rows, (long long)vocab, d.ops->name, variant, dt * 1e3, 4.0 * (double)n * 4 / dt / 1e9,
           l);
    d.ops->free(d.ctx, x);
    d.ops->free(d.ctx, dx);
    d.ops->free(d.ctx, lab);
    d.ops->free(d.ctx, loss);
    free(hx);
    free(hl);
    return 0;
}

static int bench_clip(struct dev d, const char *name, const struct gpt_shape *g, int iters,
                      const char *variant)
{
    char text[16384];
    struct spec s;
    struct ddpd_error err = {0};
    if (gpt_spec_text(text, sizeof text, g, d.ops->host_memory ? "cpu" : "cuda") ||
        spec_parse(text, strlen(text), NULL, &s, &err)) {
        fprintf(stderr, "bench_loss: the GPT spec: %s\n", err.message);
        return 1;
    }
    struct model *m = model_new(d, &s, 1);
    struct optim *o = m ? optim_new(&s.optim, m) : NULL;
    if (!o) {
        fprintf(stderr, "bench_loss: out of memory building the GPT\n");
        return 1;
    }
    /* Gradients of a norm well over 1, so that every call also scales them. */
    struct rng r;
    rng_seed(&r, 2);
    for (int i = 0; i < model_param_count(m); i++) {
        struct param *p = model_param(m, i);
        float *h = malloc((size_t)p->numel * sizeof(float));
        for (int64_t j = 0; h && j < p->numel; j++)
            h[j] = (float)(0.01 * rng_normal(&r));
        if (h)
            d.ops->to_device(d.ctx, p->grad, h, (size_t)p->numel * sizeof(float));
        free(h);
    }
    double norm = optim_clip_grad_norm(o, 1.0); /* warm-up */
    d.ops->synchronize(d.ctx);
    const double t0 = now_s();
    for (int i = 0; i < iters; i++)
        norm = optim_clip_grad_norm(o, 1.0);
    d.ops->synchronize(d.ctx);
    const double dt = (now_s() - t0) / iters;
    printf("{\"bench\":\"clip_norm\",\"model\":\"%s\",\"tensors\":%d,\"params\":%lld,\"device\":\"%s\","
           "\"variant\":\"%s\",\"ms\":%.6f,\"norm\":%.6g}\n",
           name, model_param_count(m), (long long)model_numel(m), d.ops->name, variant, dt * 1e3, norm);
    optim_free(o);
    model_free(m);
    return 0;
}

int main(int argc, char **argv)
{
    int64_t rows = 8192, vocab = 50304;
    int iters = 20;
    const char *model = "gpt2s";
    bool before = false, cpu = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--rows") && i + 1 < argc)
            rows = strtoll(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--vocab") && i + 1 < argc)
            vocab = strtoll(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc)
            iters = (int)strtol(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--model") && i + 1 < argc)
            model = argv[++i];
        else if (!strcmp(argv[i], "--before"))
            before = true;
        else if (!strcmp(argv[i], "--cpu"))
            cpu = true;
        else {
            fprintf(stderr, "usage: bench_loss [--rows R] [--vocab V] [--model gpt2s|gptmini] [--iters N] "
                            "[--before] [--cpu]\n");
            return 2;
        }
    }
    const struct gpt_shape *g = !strcmp(model, "gpt2s")     ? &gpt2s
                                : !strcmp(model, "gptmini") ? &gptmini
                                                            : NULL;
    if (!g || rows < 1 || vocab < 2 || iters < 1) {
        fprintf(stderr, "bench_loss: --model gpt2s|gptmini, --rows >= 1, --vocab >= 2, --iters >= 1\n");
        return 2;
    }
    /* Read by the module when it opens the device (cuda/cuda_impl.h). */
    if (before)
        setenv("DDPD_CUDA_ONE_BLOCK_REDUCTIONS", "1", 1);
    struct ddpd_error err;
    struct dev d = cpu ? dev_cpu_new(1) : dev_cuda_new(0, false, &err);
    if (!d.ops) {
        fprintf(stderr, "bench_loss: %s\n", err.message);
        return 1;
    }
    const char *variant = before ? "before" : "after";
    /* Before: one sumsq and one wait per tensor, as optim_clip_grad_norm ran them. */
    struct dev_ops per_tensor = *d.ops;
    per_tensor.sumsq_group = NULL;
    struct dev dc = before ? (struct dev){&per_tensor, d.ctx} : d;
    int rc = bench_cross_entropy(d, rows, vocab, iters, variant);
    if (rc == 0)
        rc = bench_clip(dc, model, g, iters, variant);
    if (cpu)
        dev_cpu_free(d);
    else
        dev_cuda_free(d);
    return rc;
}
