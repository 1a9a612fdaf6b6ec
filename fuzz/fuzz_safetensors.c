/* fuzz_safetensors.c — the safetensors reader (schema/safetensors.c) on any file, as
 * `init.from` and checkpoint restores call it. A file either fails with DDPD_EDATA naming
 * it, or every tensor it lists can be read in full (ASan checks the bounds) and found by
 * its name. init.format "gpt2" (schema/gpt2.c) too: a file that reads is matched to a tiny
 * GPT-2's tensors, and the same bytes are checked as its config.json; each either passes
 * or fails with DDPD_ESPEC and a sentence. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_files.h"
#include "schema/gpt2.h"
#include "schema/safetensors.h"

/* One block of dim 4, 2 heads, vocabulary 5, 3 positions, lm_head tied: the make-seeds.py
 * seeds gpt2.safetensors and gpt2-config.json are its files. */
static const char GPT2_SPEC[] =
    "{\"model\":[{\"type\":\"embedding\",\"num\":5,\"dim\":4},{\"type\":\"position\",\"max\":3,\"dim\":4},"
    "{\"type\":\"residual\",\"layers\":[{\"type\":\"layernorm\",\"dim\":4},{\"type\":\"attention\",\"dim\":4,"
    "\"heads\":2}]},{\"type\":\"residual\",\"layers\":[{\"type\":\"layernorm\",\"dim\":4},{\"type\":"
    "\"linear\","
    "\"in\":4,\"out\":16},{\"type\":\"gelu\",\"approximate\":\"tanh\"},{\"type\":\"linear\",\"in\":16,"
    "\"out\":4}]},"
    "{\"type\":\"layernorm\",\"dim\":4},{\"type\":\"linear\",\"in\":4,\"out\":5,\"bias\":false,\"tie\":\"0\"}"
    "],"
    "\"input_shape\":[3],\"loss\":\"cross_entropy\",\"optimizer\":{\"type\":\"sgd\",\"lr\":0.1},"
    "\"data\":{\"type\":\"tokens\",\"path\":\"t.bin\",\"block_size\":3},\"batch_size\":2,\"epochs\":1,"
    "\"init\":{\"from\":\"gpt2/model.safetensors\",\"format\":\"gpt2\"}}";

static const struct gpt2_model *gpt2(void)
{
    static struct gpt2_model *g;
    if (!g) {
        struct spec *s = malloc(sizeof *s);
        struct ddpd_error err;
        g = malloc(sizeof *g);
        if (!s || !g || spec_parse(GPT2_SPEC, strlen(GPT2_SPEC), NULL, s, &err) ||
            gpt2_model_of(s, g, &err) || !g->tied) {
            fprintf(stderr, "fuzz_safetensors: the GPT-2 spec: %s\n", err.message);
            abort();
        }
        free(s);
    }
    return g;
}

static void check_gpt2_error(ddpd_err rc, const struct ddpd_error *err, const char *what)
{
    if (rc != DDPD_OK && (rc != DDPD_ESPEC || strncmp(err->message, "init.from: ", 11) != 0)) {
        fprintf(stderr, "fuzz_safetensors: %s: unexpected %s: %s\n", what, ddpd_err_name(rc), err->message);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[1024];
    struct ddpd_error err;
    fuzz_write("f.safetensors", data, size);
    snprintf(path, sizeof path, "%s/f.safetensors", fuzz_dir());
    const struct gpt2_model *g = gpt2();
    check_gpt2_error(gpt2_config_check((const char *)data, size, g, "init.from", "config.json", &err), &err,
                     "gpt2_config_check");
    struct safetensors_file *f = safetensors_read(path, &err);
    if (!f) {
        if (err.code != DDPD_EDATA || !strstr(err.message, "f.safetensors")) {
            fprintf(stderr, "fuzz_safetensors: unexpected %s: %s\n", ddpd_err_name(err.code), err.message);
            abort();
        }
        return 0;
    }
    float sum = 0; /* read every value: ASan checks each one is inside the tensor's block */
    for (int i = 0; i < safetensors_count(f); i++) {
        const struct safetensors_tensor *t = safetensors_at(f, i);
        int64_t numel = 1;
        if (t->ndim < 0 || t->ndim > SAFETENSORS_MAX_DIMS)
            abort();
        for (int d = 0; d < t->ndim; d++)
            numel *= t->shape[d];
        for (int64_t k = 0; k < numel; k++)
            sum += t->data[k];
        if (safetensors_get(f, t->name) == NULL) {
            fprintf(stderr, "fuzz_safetensors: tensor \"%s\" is listed but not found\n", t->name);
            abort();
        }
    }
    if (sum != sum && safetensors_count(f) < 0) /* keeps the reads; never true */
        abort();
    (void)safetensors_meta_get(f, "step");
    const struct safetensors_tensor *src[GPT2_MAX_TENSORS];
    ddpd_err rc = gpt2_file_match(g, f, "init.from", "f.safetensors", src, &err);
    check_gpt2_error(rc, &err, "gpt2_file_match");
    for (int i = 0; rc == DDPD_OK && i < g->n; i++)
        if (!src[i] || src[i]->ndim != g->t[i].ndim || src[i]->shape[0] != g->t[i].shape[0]) {
            fprintf(stderr, "fuzz_safetensors: %s matched to a tensor of another shape\n", g->t[i].hf);
            abort();
        }
    safetensors_free(f);
    return 0;
}
