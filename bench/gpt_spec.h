/* bench/gpt_spec.h — the GPT of the GPU benchmarks (bench_gpu_step, bench_loss) as a job
 * spec: a nanoGPT tree in §2a layers (tests/pylib/torch_models.py builds the same one, and
 * bench/gpu_step_torch.py's GPTS lists the same shapes), AdamW. Header-only: each
 * benchmark is one C file. */
#ifndef DDPD_BENCH_GPT_SPEC_H
#define DDPD_BENCH_GPT_SPEC_H

#include <stdio.h>

struct gpt_shape {
    int blocks, dim, heads, t, vocab, batch;
};
static const struct gpt_shape gpt2s __attribute__((unused)) = {12, 768, 12, 1024, 50304, 4};
static const struct gpt_shape gptmini __attribute__((unused)) = {2, 64, 4, 32, 256, 2};

static inline int gpt_spec_text(char *out, size_t cap, const struct gpt_shape *g, const char *device)
{
    size_t o = 0;
    int n = snprintf(out, cap,
                     "{\"model\":[{\"type\":\"embedding\",\"num\":%d,\"dim\":%d},"
                     "{\"type\":\"position\",\"max\":%d,\"dim\":%d}",
                     g->vocab, g->dim, g->t, g->dim);
    for (int b = 0; n >= 0 && (o += (size_t)n) < cap && b < g->blocks; b++)
        n = snprintf(
            out + o, cap - o,
            ",{\"type\":\"residual\",\"layers\":[{\"type\":\"layernorm\",\"dim\":%d},"
            "{\"type\":\"attention\",\"dim\":%d,\"heads\":%d}]},"
            "{\"type\":\"residual\",\"layers\":[{\"type\":\"layernorm\",\"dim\":%d},"
            "{\"type\":\"linear\",\"in\":%d,\"out\":%d},{\"type\":\"gelu\",\"approximate\":\"tanh\"},"
            "{\"type\":\"linear\",\"in\":%d,\"out\":%d}]}",
            g->dim, g->dim, g->heads, g->dim, g->dim, 4 * g->dim, 4 * g->dim, g->dim);
    if (n < 0 || o >= cap)
        return -1;
    n = snprintf(out + o, cap - o,
                 ",{\"type\":\"layernorm\",\"dim\":%d},{\"type\":\"linear\",\"in\":%d,\"out\":%d}],"
                 "\"input_shape\":[%d],\"loss\":\"cross_entropy\","
                 "\"optimizer\":{\"type\":\"adamw\",\"lr\":0.0003,\"weight_decay\":0.1},"
                 "\"data\":{\"type\":\"tokens\",\"path\":\"unused.bin\",\"block_size\":%d},"
                 "\"batch_size\":%d,\"steps\":1,\"device\":\"%s\"}",
                 g->dim, g->dim, g->vocab, g->t, g->t, g->batch, device);
    return n < 0 || (size_t)n >= cap - o ? -1 : 0;
}

#endif
