/* gpu_step.c — time per training step of ddpd's compute path on one device, for
 * scripts/gpu-check.sh and its PyTorch twin bench/gpu_step_torch.py: the worker's own
 * model, loss and optimizer (model.c, optim.c, the dev backend), one step = batch copied from
 * host memory, forward, loss, backward, update, as train.c runs it for one rank
 * (one rank needs no DDP, as PyTorch's DDP at world size 1 reduces nothing). Warm-up
 * steps first, then `steps` steps between two synchronisations.
 *
 *   bench_gpu_step --model tiny|mlp|gpt2s|gptmini [--steps N] [--warmup N] [--cpu] [--tf32]
 *
 * tiny and mlp: MSE loss and SGD on float inputs. gpt2s: a GPT-2-small-shaped GPT (12
 * blocks, dim 768, 12 heads, T 1024, vocab 50304, batch 4) and gptmini (2 blocks, dim 64,
 * 4 heads, T 32, vocab 256, batch 2: the same code path in a size the CPU side runs), with
 * int32 token ids, cross_entropy over the B·T positions and AdamW.
 *
 * Prints one JSON line: {"model", "device", "batch", "params", "step_ms", "tflops",
 * "tokens_per_s" (GPTs only), "loss"}. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../schema/spec.h"
#include "../worker/dev.h"
#include "../worker/model.h"
#include "../worker/optim.h"
#include "../worker/rng.h"

/* The two models of the check: PyTorch's smallest useful step, and one that is all GEMM. */
static const char *const tiny_spec =
    "{\"model\":[{\"type\":\"linear\",\"in\":10,\"out\":5}],\"loss\":\"mse\","
    "\"optimizer\":{\"type\":\"sgd\",\"lr\":0.01},\"data\":{\"type\":\"synthetic\",\"samples\":3},"
    "\"batch_size\":3,\"steps\":1,\"device\":\"%s\"}";
static const char *const mlp_spec =
    "{\"model\":[{\"type\":\"linear\",\"in\":4096,\"out\":4096},{\"type\":\"relu\"},"
    "{\"type\":\"linear\",\"in\":4096,\"out\":4096},{\"type\":\"relu\"},"
    "{\"type\":\"linear\",\"in\":4096,\"out\":10}],\"loss\":\"mse\","
    "\"optimizer\":{\"type\":\"sgd\",\"lr\":0.01},\"data\":{\"type\":\"synthetic\",\"samples\":512},"
    "\"batch_size\":512,\"steps\":1,\"device\":\"%s\"}";

#include "gpt_spec.h"

/* A GPT step's floating-point operations: forward 2·rows·in·out per matrix (qkv, proj, the
 * MLP, the head) plus attention's two products (2·B·T·T·dim each, the causal half not
 * subtracted, as is usual), backward twice the forward. */
static double gpt_flops(const struct gpt_shape *g)
{
    const double rows = (double)g->batch * g->t, d = g->dim;
    const double per_block =
        2 * rows * d * (3 * d + d + 4 * d + 4 * d) + 2 * 2 * (double)g->batch * g->t * g->t * d;
    return 3 * (g->blocks * per_block + 2 * rows * d * g->vocab);
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Floating-point operations of one step: forward 2*B*in*out per linear layer, backward
 * the same for dW and again for dx except below the first layer (model.c skips that dx). */
static double step_flops(const struct spec *s)
{
    double f = 0;
    bool first = true;
    for (int i = 0; i < s->n_layers; i++) {
        const struct spec_layer *l = &s->layers[i];
        if (l->kind != LAYER_LINEAR)
            continue;
        const double mm = 2.0 * (double)s->batch_size * (double)l->in * (double)l->out;
        f += first ? 2 * mm : 3 * mm;
        first = false;
    }
    return f;
}

struct step_bufs {
    void *hx, *hy, *x, *y; /* float (mse), or int32 ids and labels (GPTs) */
    float *dpred, *loss;
    int64_t in, out; /* per sample: inputs; mse targets or cross_entropy positions */
    int64_t classes; /* cross_entropy's C, 0 for mse */
};

static void one_step(struct dev d, struct model *m, struct optim *o, const struct spec *s,
                     struct step_bufs *b)
{
    const int64_t B = s->batch_size;
    d.ops->to_device(d.ctx, b->x, b->hx, (size_t)(B * b->in) * 4); /* float or int32 */
    d.ops->to_device(d.ctx, b->y, b->hy, (size_t)(B * b->out) * 4);
    model_zero_grad(m);
    const float *pred = model_forward(m, b->x, B);
    if (b->classes)
        d.ops->cross_entropy(d.ctx, pred, b->y, B * b->out, b->classes, b->dpred, b->loss);
    else
        d.ops->mse(d.ctx, pred, b->y, B, b->out, b->dpred, b->loss);
    model_backward(m, b->dpred, NULL, NULL);
    optim_step(o);
}

int main(int argc, char **argv)
{
    const char *model = "tiny";
    int steps = 0, warmup = -1; /* default: 20, 3 for gpt2s */
    bool cpu = false, tf32 = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc)
            model = argv[++i];
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc)
            steps = (int)strtol(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--warmup") && i + 1 < argc)
            warmup = (int)strtol(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--cpu"))
            cpu = true;
        else if (!strcmp(argv[i], "--tf32"))
            tf32 = true;
        else {
            fprintf(stderr,
                    "usage: bench_gpu_step --model tiny|mlp|gpt2s|gptmini [--steps N] [--warmup N] [--cpu] "
                    "[--tf32]\n");
            return 2;
        }
    }
    const bool tiny = !strcmp(model, "tiny");
    const struct gpt_shape *gpt = !strcmp(model, "gpt2s")     ? &gpt2s
                                  : !strcmp(model, "gptmini") ? &gptmini
                                                              : NULL;
    if (!tiny && !gpt && strcmp(model, "mlp")) {
        fprintf(stderr, "bench_gpu_step: --model: tiny, mlp, gpt2s or gptmini, not '%s'\n", model);
        return 2;
    }
    if (steps <= 0)
        steps = tiny ? 2000 : gpt == &gpt2s ? 20 : 50;
    if (warmup < 0)
        warmup = gpt == &gpt2s ? 3 : 20;

    char text[16384];
    if (gpt) {
        if (gpt_spec_text(text, sizeof text, gpt, cpu ? "cpu" : "cuda")) {
            fprintf(stderr, "bench_gpu_step: the GPT spec does not fit in %zu bytes\n", sizeof text);
            return 1;
        }
    } else {
        snprintf(text, sizeof text, tiny ? tiny_spec : mlp_spec, cpu ? "cpu" : "cuda");
    }
    struct spec s;
    struct ddpd_error err;
    if (spec_parse(text, strlen(text), NULL, &s, &err) != DDPD_OK) {
        fprintf(stderr, "bench_gpu_step: spec: %s\n", err.message);
        return 1;
    }
    struct dev d = cpu ? dev_cpu_new(1) : dev_cuda_new(0, tf32, &err);
    if (!d.ops) {
        fprintf(stderr, "bench_gpu_step: %s\n", err.message);
        return 1;
    }
    struct model *m = model_new(d, &s, s.batch_size);
    struct optim *o = m ? optim_new(&s.optim, m) : NULL;
    if (!o) {
        fprintf(stderr, "bench_gpu_step: out of memory building the model\n");
        return 1;
    }
    const int64_t B = s.batch_size;
    struct step_bufs b = {.in = spec_sample_numel(&s), .out = spec_target_numel(&s)};
    if (gpt)
        b.classes = spec_classes(&s);
    const int64_t pred_n = B * (gpt ? b.out * b.classes : b.out);
    b.hx = malloc((size_t)(B * b.in) * 4);
    b.hy = malloc((size_t)(B * b.out) * 4);
    if (!b.hx || !b.hy) {
        fprintf(stderr, "bench_gpu_step: out of memory for the batch\n");
        return 1;
    }
    struct rng r;
    rng_seed(&r, 1);
    for (int64_t i = 0; i < B * b.in; i++) {
        if (gpt)
            ((int32_t *)b.hx)[i] = (int32_t)(rng_below(&r, (uint64_t)spec_vocab(&s)));
        else
            ((float *)b.hx)[i] = (float)rng_normal(&r);
    }
    for (int64_t i = 0; i < B * b.out; i++) {
        if (gpt)
            ((int32_t *)b.hy)[i] = (int32_t)(rng_below(&r, (uint64_t)b.classes));
        else
            ((float *)b.hy)[i] = (float)rng_normal(&r);
    }
    b.x = d.ops->alloc(d.ctx, (size_t)(B * b.in) * 4);
    b.y = d.ops->alloc(d.ctx, (size_t)(B * b.out) * 4);
    b.dpred = d.ops->alloc(d.ctx, (size_t)pred_n * sizeof(float));
    b.loss = d.ops->alloc(d.ctx, sizeof(float));

    for (int i = 0; i < warmup; i++)
        one_step(d, m, o, &s, &b);
    d.ops->synchronize(d.ctx);
    const double t0 = now_s();
    for (int i = 0; i < steps; i++)
        one_step(d, m, o, &s, &b);
    d.ops->synchronize(d.ctx);
    const double dt = (now_s() - t0) / steps;
    float loss;
    d.ops->to_host(d.ctx, &loss, b.loss, sizeof loss);
    printf("{\"model\":\"%s\",\"device\":\"%s\",\"batch\":%lld,\"params\":%lld,\"step_ms\":%.6f,"
           "\"tflops\":%.3f,",
           model, d.ops->name, (long long)B, (long long)model_numel(m), dt * 1e3,
           (gpt ? gpt_flops(gpt) : step_flops(&s)) / dt / 1e12);
    if (gpt)
        printf("\"tokens_per_s\":%.1f,", (double)(B * b.in) / dt);
    printf("\"loss\":%.6g}\n", loss);

    d.ops->free(d.ctx, b.x);
    d.ops->free(d.ctx, b.y);
    d.ops->free(d.ctx, b.dpred);
    d.ops->free(d.ctx, b.loss);
    free(b.hx);
    free(b.hy);
    optim_free(o);
    model_free(m);
    if (cpu)
        dev_cpu_free(d);
    else
        dev_cuda_free(d);
    return 0;
}
