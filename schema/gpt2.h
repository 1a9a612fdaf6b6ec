/* gpt2.h — the GPT-2 shape of a spec, in the one place both programs use: whether a model
 * is Hugging Face's GPT2LMHeadModel (and if not, why), each of Hugging Face's tensor names
 * with its ddpd name, its shape in their file and whether it is a Conv1D weight stored
 * [in, out] (ddpd keeps [out, in]); the config.json that goes with it, written and checked;
 * a Hugging Face file's tensors matched to the model. The worker reads such a file
 * (init.format "gpt2"), the server writes one (GET .../checkpoint?format=gpt2). Knows the
 * spec, the safetensors header and jansson; nothing of devices, HTTP or the store. */
#ifndef DDPD_GPT2_H
#define DDPD_GPT2_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "safetensors.h"
#include "spec.h"

/* A block takes at least 8 layers (two residuals, two layernorms, attention, two linears
 * and an activation) and has 12 tensors; wte, wpe, ln_f's two and lm_head come beside. */
#define GPT2_MAX_TENSORS (5 + 12 * (SPEC_MAX_LAYERS / 8))
/* The most of a config.json that is read (Hugging Face's are about 1 KB). */
#define GPT2_CONFIG_MAX (1024 * 1024)

struct gpt2_tensor {
    char hf[48];      /* Hugging Face's name without "transformer.": "h.3.attn.c_attn.weight" */
    char key[64];     /* ddpd's state_dict name: "5.1.qkv.weight" */
    int layer;        /* its layer's index in the spec's flat list */
    char where[32];   /* the layer in the spec's JSON: "model[5].layers[1]" */
    int ndim;         /* 1 or 2 */
    int64_t shape[2]; /* in Hugging Face's file: a Conv1D weight is [in, out] */
    bool conv1d;      /* c_attn, c_proj, c_fc and mlp.c_proj weights: ddpd's [out, in] transposed */
    bool tied;        /* lm_head.weight of a tied model: ddpd's key holds wte's values */
};

/* A spec's model read as GPT-2: the config's numbers and every tensor, in Hugging Face's
 * order (wte, wpe, h.0 ... h.N-1, ln_f, lm_head). */
struct gpt2_model {
    int64_t n_layer, n_head, n_embd, vocab_size, n_positions, n_inner;
    double layer_norm_epsilon;
    bool gelu_tanh;                 /* "gelu_new"; else exact "gelu" */
    bool tied;                      /* lm_head shares wte's weight (tie_word_embeddings) */
    double embd_pdrop, resid_pdrop; /* the dropouts' p, 0 where there is none */
    int n;
    struct gpt2_tensor t[GPT2_MAX_TENSORS];
};

/* Reads `s`'s model as GPT-2 into *g: embedding, position, [dropout], then per block a
 * residual [layernorm, attention (causal, bias), [dropout]] and a residual [layernorm,
 * linear, gelu (tanh or exact), linear, [dropout]], then layernorm and linear (no bias,
 * out = vocab), with one dim, one eps and biases everywhere else. DDPD_ESPEC with the
 * layer as err->path ("model[5].layers[1]") and a sentence saying why it is not GPT-2-shaped. */
ddpd_err gpt2_model_of(const struct spec *s, struct gpt2_model *g, struct ddpd_error *err);

/* The entry of Hugging Face name `name` (with or without "transformer."), NULL when none.
 * Borrowed from g. */
const struct gpt2_tensor *gpt2_tensor_find(const struct gpt2_model *g, const char *name);
/* The entry whose ddpd name is `key` (the first: a tied lm_head's key holds wte's), NULL when
 * none. Borrowed from g. */
const struct gpt2_tensor *gpt2_tensor_by_key(const struct gpt2_model *g, const char *key);

/* config.json for g as Hugging Face's GPT2LMHeadModel reads it. Returns a new reference,
 * NULL when memory ran out. */
struct json_t *gpt2_config_json(const struct gpt2_model *g);

/* Checks the config.json text (len bytes, not NUL-terminated; `shown` names the file in
 * messages) against g: n_layer, n_head, n_embd, vocab_size, n_positions and
 * layer_norm_epsilon must be there and equal; n_inner, activation_function and the
 * attention's scaling flags, when given, must be the model's. DDPD_ESPEC at `field`
 * naming the file, the line of bad JSON, or the key with both values. */
ddpd_err gpt2_config_check(const char *text, size_t len, const struct gpt2_model *g, const char *field,
                           const char *shown, struct ddpd_error *err);

/* Matches a Hugging Face file's tensors (its header is enough) to g: src[i] (g->n of them,
 * the caller's) is the file's tensor for g->t[i]: lm_head.weight is wte's when the file
 * has none (Hugging Face's own files leave a tied copy out), NULL for a tied lm_head the
 * file has too (the caller checks that it equals wte). The h.N.attn.bias and
 * attn.masked_bias buffers of older files are skipped. DDPD_ESPEC at `field` for a tensor
 * missing, of another shape (both shapes given, and the ddpd layer it is for), or that
 * the model has no place for. */
ddpd_err gpt2_file_match(const struct gpt2_model *g, const struct safetensors_file *f, const char *field,
                         const char *shown, const struct safetensors_tensor **src, struct ddpd_error *err);

#endif
