/* gpu_step.c — time per training step of ddpd's compute path on one device, for
 * scripts/gpu-check.sh and its PyTorch twin bench/gpu_step_torch.py: the worker's own
 * model, loss and optimizer (model.c, optim.c, the dev backend), one step = batch copied from
 * host memory, forward, MSE loss, backward, SGD update, as train.c runs it for one rank
 * (one rank needs no DDP, as PyTorch's DDP at world size 1 reduces nothing). Warm-up
 * steps first, then `steps` steps between two synchronisations.
 *
 *   bench_gpu_step --model tiny|mlp [--steps N] [--warmup N] [--cpu] [--tf32]
 *
 * Prints one JSON line: {"model", "device", "batch", "params", "step_ms", "tflops"}. */
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
    float *hx, *hy, *x, *y, *dpred, *loss;
    int64_t in, out;
};

static void one_step(struct dev d, struct model *m, struct optim *o, const struct spec *s,
                     struct step_bufs *b)
{
    const int64_t B = s->batch_size;
    d.ops->to_device(d.ctx, b->x, b->hx, (size_t)(B * b->in) * sizeof(float));
    d.ops->to_device(d.ctx, b->y, b->hy, (size_t)(B * b->out) * sizeof(float));
    model_zero_grad(m);
    const float *pred = model_forward(m, b->x, B);
    d.ops->mse(d.ctx, pred, b->y, B, b->out, b->dpred, b->loss);
    model_backward(m, b->dpred, NULL, NULL);
    optim_step(o);
}

int main(int argc, char **argv)
{
    const char *model = "tiny";
    int steps = 0, warmup = 20;
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
                    "usage: bench_gpu_step --model tiny|mlp [--steps N] [--warmup N] [--cpu] [--tf32]\n");
            return 2;
        }
    }
    const bool tiny = !strcmp(model, "tiny");
    if (!tiny && strcmp(model, "mlp")) {
        fprintf(stderr, "bench_gpu_step: --model: tiny or mlp, not '%s'\n", model);
        return 2;
    }
    if (steps <= 0)
        steps = tiny ? 2000 : 50;

    char text[1024];
    snprintf(text, sizeof text, tiny ? tiny_spec : mlp_spec, cpu ? "cpu" : "cuda");
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
    struct step_bufs b = {.in = spec_in_width(&s), .out = spec_out_width(&s)};
    b.hx = malloc((size_t)(B * b.in) * sizeof(float));
    b.hy = malloc((size_t)(B * b.out) * sizeof(float));
    struct rng r;
    rng_seed(&r, 1);
    for (int64_t i = 0; i < B * b.in; i++)
        b.hx[i] = (float)rng_normal(&r);
    for (int64_t i = 0; i < B * b.out; i++)
        b.hy[i] = (float)rng_normal(&r);
    b.x = d.ops->alloc(d.ctx, (size_t)(B * b.in) * sizeof(float));
    b.y = d.ops->alloc(d.ctx, (size_t)(B * b.out) * sizeof(float));
    b.dpred = d.ops->alloc(d.ctx, (size_t)(B * b.out) * sizeof(float));
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
           "\"tflops\":%.3f,\"loss\":%.6g}\n",
           model, d.ops->name, (long long)B, (long long)model_numel(m), dt * 1e3, step_flops(&s) / dt / 1e12,
           loss);

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
