/* gpt2.c — a spec's model read as Hugging Face's GPT-2 (gpt2.h): the walk over the layer
 * tree that says whether it is GPT-2-shaped and lists the tensors, the config.json written
 * and checked, and a file's tensors matched to the list. Names follow Hugging Face's
 * modeling_gpt2.py (GPT2Model: wte, wpe, h.N.{ln_1, attn.c_attn, attn.c_proj, ln_2,
 * mlp.c_fc, mlp.c_proj}, ln_f; GPT2LMHeadModel: lm_head). Opens no file. */
#include "gpt2.h"

#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PREFIX "transformer."

/* "a" or "an" before a kind's name. */
static const char *an(const char *word)
{
    return strchr("aeiou", word[0]) ? "an" : "a";
}

/* model[i]'s kind as a person reads it ("gelu (tanh)" for gpt's activation). */
static const char *kind_text(const struct spec_layer *l)
{
    return l->kind == LAYER_GELU_TANH ? "gelu (tanh)" : layer_kind_name(l->kind);
}

/* Why s's model is not GPT-2, at layer i (its path in the spec's JSON; -1: the model). */
static ddpd_err not_gpt2(struct ddpd_error *err, const struct spec *s, int i, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static ddpd_err not_gpt2(struct ddpd_error *err, const struct spec *s, int i, const char *fmt, ...)
{
    char path[sizeof err->path], msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (i >= 0)
        spec_layer_path(s, i, path, sizeof path);
    else
        snprintf(path, sizeof path, "model");
    return ddpd_error_set(err, DDPD_ESPEC, path, "%s %s", path, msg);
}

/* The layers directly inside `parent` (-1: the top level), in order, into idx (at most
 * SPEC_MAX_LAYERS). Returns how many. */
static int children(const struct spec *s, int parent, int *idx)
{
    int n = 0, first = parent < 0 ? 0 : parent + 1, end = parent < 0 ? s->n_layers : s->layers[parent].end;
    for (int i = first; i < end; i = s->layers[i].end)
        idx[n++] = i;
    return n;
}

static void add(struct gpt2_model *g, const struct spec *s, int layer, const char *hf, const char *param,
                int ndim, int64_t d0, int64_t d1, bool conv1d)
{
    struct gpt2_tensor *t = &g->t[g->n++];
    snprintf(t->hf, sizeof t->hf, "%s", hf);
    snprintf(t->key, sizeof t->key, "%s.%s", s->layers[layer].key, param);
    t->layer = layer;
    spec_layer_path(s, layer, t->where, sizeof t->where);
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = ndim == 2 ? d1 : 0;
    t->conv1d = conv1d;
    t->tied = false;
}

/* Where GPT-2 has layer kind `want` (`what` says which) the list must have it. */
static ddpd_err expect(const struct spec *s, const int *idx, int n, int k, layer_kind want, const char *what,
                       struct ddpd_error *err)
{
    if (k >= n)
        return not_gpt2(err, s, -1, "ends where GPT-2 has %s %s (%s)", an(layer_kind_name(want)),
                        layer_kind_name(want), what);
    const struct spec_layer *l = &s->layers[idx[k]];
    bool ok = l->kind == want || (want == LAYER_GELU && l->kind == LAYER_GELU_TANH);
    if (!ok)
        return not_gpt2(err, s, idx[k], "is %s %s where GPT-2 has %s %s (%s)", an(kind_text(l)), kind_text(l),
                        an(layer_kind_name(want)), layer_kind_name(want), what);
    return DDPD_OK;
}

static ddpd_err check_ln(const struct spec *s, struct gpt2_model *g, int i, const char *hf,
                         struct ddpd_error *err)
{
    const struct spec_layer *l = &s->layers[i];
    char name[48];
    if (l->dim != g->n_embd)
        return not_gpt2(err, s, i,
                        "(%s) has dim %" PRId64 " but the embedding's is %" PRId64 " (GPT-2 has one n_embd)",
                        hf, l->dim, g->n_embd);
    if (!l->bias)
        return not_gpt2(err, s, i, "(%s) has no bias; GPT-2's layernorms have one", hf);
    if (g->layer_norm_epsilon < 0)
        g->layer_norm_epsilon = l->eps;
    else if (l->eps != g->layer_norm_epsilon)
        return not_gpt2(err, s, i,
                        "(%s) has eps %g but the first layernorm's is %g (GPT-2 has one layer_norm_epsilon)",
                        hf, l->eps, g->layer_norm_epsilon);
    snprintf(name, sizeof name, "%s.weight", hf);
    add(g, s, i, name, "weight", 1, l->dim, 0, false);
    snprintf(name, sizeof name, "%s.bias", hf);
    add(g, s, i, name, "bias", 1, l->dim, 0, false);
    return DDPD_OK;
}

/* A linear of a block: in -> out with a bias, untied; Hugging Face's Conv1D `hf`. */
static ddpd_err check_conv1d(const struct spec *s, struct gpt2_model *g, int i, const char *hf, int64_t in,
                             int64_t out, struct ddpd_error *err)
{
    const struct spec_layer *l = &s->layers[i];
    char name[48];
    if (l->in != in || (out > 0 && l->out != out))
        return not_gpt2(err, s, i,
                        "(%s) is a linear %" PRId64 " -> %" PRId64 "; GPT-2 has %" PRId64 " -> %" PRId64
                        " there",
                        hf, l->in, l->out, in, out > 0 ? out : l->out);
    if (!l->bias)
        return not_gpt2(err, s, i, "(%s) has no bias; GPT-2's Conv1D layers have one", hf);
    if (spec_layer_tie(s, i) >= 0)
        return not_gpt2(err, s, i, "(%s) is tied; in GPT-2 only the output layer is", hf);
    snprintf(name, sizeof name, "%s.weight", hf);
    add(g, s, i, name, "weight", 2, l->in, l->out, true);
    snprintf(name, sizeof name, "%s.bias", hf);
    add(g, s, i, name, "bias", 1, l->out, 0, false);
    return DDPD_OK;
}

/* The dropouts GPT-2 has a place for: p into *slot, the same wherever it recurs. */
static ddpd_err take_dropout(const struct spec *s, int i, double *slot, int *first, const char *what,
                             struct ddpd_error *err)
{
    double p = s->layers[i].p;
    if (*first >= 0 && p != *slot)
        return not_gpt2(err, s, i, "is a dropout of p %g but an earlier one's is %g (GPT-2 has one %s)", p,
                        *slot, what);
    if (*first < 0)
        *first = i;
    *slot = p;
    return DDPD_OK;
}

/* What follows a block's layers inside its residual, from idx[from]: dropouts only (`after`
 * names the place for the message). */
static ddpd_err resid_tail(const struct spec *s, struct gpt2_model *g, const int *idx, int n, int from,
                           const char *after, int *resid_first, struct ddpd_error *err)
{
    for (int k = from; k < n; k++) {
        const struct spec_layer *l = &s->layers[idx[k]];
        if (l->kind != LAYER_DROPOUT)
            return not_gpt2(err, s, idx[k], "is %s %s after %s; GPT-2 has at most a dropout there",
                            an(kind_text(l)), kind_text(l), after);
        ddpd_err rc = take_dropout(s, idx[k], &g->resid_pdrop, resid_first, "resid_pdrop", err);
        if (rc)
            return rc;
    }
    return DDPD_OK;
}

/* One block: residual `ra` [layernorm, attention, dropout?] and `rm` [layernorm, linear,
 * gelu, linear, dropout?]. */
static ddpd_err check_block(const struct spec *s, struct gpt2_model *g, int ra, int rm, int b,
                            int *resid_first, struct ddpd_error *err)
{
    int idx[SPEC_MAX_LAYERS], n;
    char hf[32], w[48];
    ddpd_err rc;
    /* attention: h.b.ln_1, h.b.attn */
    n = children(s, ra, idx);
    snprintf(hf, sizeof hf, "h.%d.ln_1", b);
    if ((rc = expect(s, idx, n, 0, LAYER_LAYERNORM, hf, err)) || (rc = check_ln(s, g, idx[0], hf, err)))
        return rc;
    snprintf(hf, sizeof hf, "h.%d.attn", b);
    if ((rc = expect(s, idx, n, 1, LAYER_ATTENTION, hf, err)))
        return rc;
    const struct spec_layer *a = &s->layers[idx[1]];
    if (a->dim != g->n_embd)
        return not_gpt2(err, s, idx[1], "(%s) has dim %" PRId64 " but the embedding's is %" PRId64, hf,
                        a->dim, g->n_embd);
    if (!a->causal || !a->bias)
        return not_gpt2(err, s, idx[1], "(%s) is %s; GPT-2's attention is causal with biases", hf,
                        a->causal ? "without biases" : "not causal");
    if (g->n_head == 0)
        g->n_head = a->heads;
    else if (a->heads != g->n_head)
        return not_gpt2(err, s, idx[1],
                        "(%s) has %" PRId64 " heads but block 0's has %" PRId64 " (GPT-2 has one n_head)", hf,
                        a->heads, g->n_head);
    snprintf(w, sizeof w, "%s.c_attn.weight", hf);
    add(g, s, idx[1], w, "qkv.weight", 2, g->n_embd, 3 * g->n_embd, true);
    snprintf(w, sizeof w, "%s.c_attn.bias", hf);
    add(g, s, idx[1], w, "qkv.bias", 1, 3 * g->n_embd, 0, false);
    snprintf(w, sizeof w, "%s.c_proj.weight", hf);
    add(g, s, idx[1], w, "proj.weight", 2, g->n_embd, g->n_embd, true);
    snprintf(w, sizeof w, "%s.c_proj.bias", hf);
    add(g, s, idx[1], w, "proj.bias", 1, g->n_embd, 0, false);
    if ((rc = resid_tail(s, g, idx, n, 2, hf, resid_first, err)))
        return rc;
    /* mlp: h.b.ln_2, h.b.mlp.c_fc, gelu, h.b.mlp.c_proj */
    n = children(s, rm, idx);
    snprintf(hf, sizeof hf, "h.%d.ln_2", b);
    if ((rc = expect(s, idx, n, 0, LAYER_LAYERNORM, hf, err)) || (rc = check_ln(s, g, idx[0], hf, err)))
        return rc;
    snprintf(hf, sizeof hf, "h.%d.mlp.c_fc", b);
    if ((rc = expect(s, idx, n, 1, LAYER_LINEAR, hf, err)))
        return rc;
    if (g->n_inner == 0)
        g->n_inner = s->layers[idx[1]].out;
    if ((rc = check_conv1d(s, g, idx[1], hf, g->n_embd, g->n_inner, err)))
        return rc;
    snprintf(hf, sizeof hf, "h.%d.mlp.act", b);
    if ((rc = expect(s, idx, n, 2, LAYER_GELU, hf, err)))
        return rc;
    bool tanh = s->layers[idx[2]].kind == LAYER_GELU_TANH;
    if (b == 0)
        g->gelu_tanh = tanh;
    else if (tanh != g->gelu_tanh)
        return not_gpt2(err, s, idx[2],
                        "is a %s but block 0's activation is not (GPT-2 has one activation_function)",
                        kind_text(&s->layers[idx[2]]));
    snprintf(hf, sizeof hf, "h.%d.mlp.c_proj", b);
    if ((rc = expect(s, idx, n, 3, LAYER_LINEAR, hf, err)) ||
        (rc = check_conv1d(s, g, idx[3], hf, g->n_inner, g->n_embd, err)))
        return rc;
    snprintf(hf, sizeof hf, "h.%d.mlp", b);
    return resid_tail(s, g, idx, n, 4, hf, resid_first, err);
}

ddpd_err gpt2_model_of(const struct spec *s, struct gpt2_model *g, struct ddpd_error *err)
{
    int idx[SPEC_MAX_LAYERS], resid_first = -1, embd_first = -1;
    ddpd_err rc;
    memset(g, 0, sizeof *g);
    g->layer_norm_epsilon = -1;
    int n = children(s, -1, idx), k = 0;
    if ((rc = expect(s, idx, n, k, LAYER_EMBEDDING, "wte", err)))
        return rc;
    const int e = idx[k++];
    g->vocab_size = s->layers[e].num;
    g->n_embd = s->layers[e].dim;
    add(g, s, e, "wte.weight", "weight", 2, g->vocab_size, g->n_embd, false);
    if ((rc = expect(s, idx, n, k, LAYER_POSITION, "wpe", err)))
        return rc;
    const struct spec_layer *p = &s->layers[idx[k]];
    if (p->dim != g->n_embd)
        return not_gpt2(err, s, idx[k], "(wpe) has dim %" PRId64 " but the embedding's is %" PRId64, p->dim,
                        g->n_embd);
    g->n_positions = p->num;
    add(g, s, idx[k++], "wpe.weight", "weight", 2, g->n_positions, g->n_embd, false);
    if (k < n && s->layers[idx[k]].kind == LAYER_DROPOUT &&
        (rc = take_dropout(s, idx[k++], &g->embd_pdrop, &embd_first, "embd_pdrop", err)))
        return rc;
    for (; k + 1 < n && s->layers[idx[k]].kind == LAYER_RESIDUAL; k += 2) {
        if (s->layers[idx[k + 1]].kind != LAYER_RESIDUAL)
            return not_gpt2(
                err, s, idx[k + 1], "is %s %s where GPT-2 has block %" PRId64 "'s MLP (a residual)",
                an(kind_text(&s->layers[idx[k + 1]])), kind_text(&s->layers[idx[k + 1]]), g->n_layer);
        if ((rc = check_block(s, g, idx[k], idx[k + 1], (int)g->n_layer, &resid_first, err)))
            return rc;
        g->n_layer++;
    }
    if (g->n_layer == 0)
        return k < n ? not_gpt2(err, s, idx[k], "is %s %s where GPT-2 has its first block (a residual)",
                                an(kind_text(&s->layers[idx[k]])), kind_text(&s->layers[idx[k]]))
                     : not_gpt2(err, s, -1, "has no blocks after wpe; GPT-2 has at least one");
    if ((rc = expect(s, idx, n, k, LAYER_LAYERNORM, "ln_f", err)) ||
        (rc = check_ln(s, g, idx[k++], "ln_f", err)) ||
        (rc = expect(s, idx, n, k, LAYER_LINEAR, "lm_head", err)))
        return rc;
    const int h = idx[k++];
    const struct spec_layer *l = &s->layers[h];
    if (l->in != g->n_embd || l->out != g->vocab_size)
        return not_gpt2(err, s, h,
                        "(lm_head) is a linear %" PRId64 " -> %" PRId64
                        "; GPT-2 has n_embd -> vocab_size, %" PRId64 " -> %" PRId64,
                        l->in, l->out, g->n_embd, g->vocab_size);
    if (l->bias)
        return not_gpt2(err, s, h, "(lm_head) has a bias; GPT-2's has none (\"bias\": false)");
    const int tie = spec_layer_tie(s, h);
    if (tie >= 0 && tie != e)
        return not_gpt2(err, s, h,
                        "(lm_head) is tied to a layer other than the embedding; GPT-2 ties it to wte");
    g->tied = tie == e;
    add(g, s, h, "lm_head.weight", "weight", 2, g->vocab_size, g->n_embd, false);
    g->t[g->n - 1].tied = g->tied;
    if (k < n)
        return not_gpt2(err, s, idx[k], "is %s %s after lm_head; GPT-2 ends there",
                        an(kind_text(&s->layers[idx[k]])), kind_text(&s->layers[idx[k]]));
    return DDPD_OK;
}

const struct gpt2_tensor *gpt2_tensor_find(const struct gpt2_model *g, const char *name)
{
    if (!strncmp(name, PREFIX, strlen(PREFIX)) && strcmp(name, PREFIX "lm_head.weight") != 0)
        name += strlen(PREFIX);
    for (int i = 0; i < g->n; i++)
        if (!strcmp(g->t[i].hf, name))
            return &g->t[i];
    return NULL;
}

const struct gpt2_tensor *gpt2_tensor_by_key(const struct gpt2_model *g, const char *key)
{
    for (int i = 0; i < g->n; i++)
        if (!strcmp(g->t[i].key, key))
            return &g->t[i];
    return NULL;
}

json_t *gpt2_config_json(const struct gpt2_model *g)
{
    /* bos and eos: GPT-2's <|endoftext|> is its vocabulary's last id (50256). */
    json_t *j = json_pack(
        "{s:[s], s:s, s:s, s:f, s:f, s:f, s:f, s:f, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:b, s:b, s:b, "
        "s:b, "
        "s:b, s:s, s:I}",
        "architectures", "GPT2LMHeadModel", "model_type", "gpt2", "activation_function",
        g->gelu_tanh ? "gelu_new" : "gelu", "attn_pdrop", 0.0, "embd_pdrop", g->embd_pdrop, "resid_pdrop",
        g->resid_pdrop, "layer_norm_epsilon", g->layer_norm_epsilon, "initializer_range", 0.02, "n_layer",
        (json_int_t)g->n_layer, "n_head", (json_int_t)g->n_head, "n_embd", (json_int_t)g->n_embd,
        "vocab_size", (json_int_t)g->vocab_size, "n_positions", (json_int_t)g->n_positions, "n_ctx",
        (json_int_t)g->n_positions, "bos_token_id", (json_int_t)(g->vocab_size - 1), "eos_token_id",
        (json_int_t)(g->vocab_size - 1), "tie_word_embeddings", g->tied, "scale_attn_weights", 1,
        "scale_attn_by_inverse_layer_idx", 0, "reorder_and_upcast_attn", 0, "use_cache", 1, "torch_dtype",
        "float32", "n_inner", (json_int_t)g->n_inner);
    /* null: 4 * n_embd, as Hugging Face writes it */
    if (j && g->n_inner == 4 * g->n_embd && json_object_set_new(j, "n_inner", json_null()) != 0) {
        json_decref(j);
        return NULL;
    }
    return j;
}

static ddpd_err config_fail(struct ddpd_error *err, const char *field, const char *shown, const char *fmt,
                            ...) __attribute__((format(printf, 4, 5)));
static ddpd_err config_fail(struct ddpd_error *err, const char *field, const char *shown, const char *fmt,
                            ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return ddpd_error_set(err, DDPD_ESPEC, field, "%s: %s: %s", field, shown, msg);
}

ddpd_err gpt2_config_check(const char *text, size_t len, const struct gpt2_model *g, const char *field,
                           const char *shown, struct ddpd_error *err)
{
    const struct {
        const char *key;
        int64_t want;
        const char *what;
    } ints[] = {
        {"n_layer", g->n_layer, "blocks"},
        {"n_head", g->n_head, "attention heads"},
        {"n_embd", g->n_embd, "dim"},
        {"vocab_size", g->vocab_size, "embedding num"},
        {"n_positions", g->n_positions, "position max"},
    };
    json_error_t jerr;
    ddpd_err rc = DDPD_OK;
    if (len > GPT2_CONFIG_MAX)
        return config_fail(err, field, shown, "too large: %zu bytes (the limit is %d)", len, GPT2_CONFIG_MAX);
    json_t *c = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr), *v;
    if (!c)
        return config_fail(err, field, shown, "line %d: %s", jerr.line, jerr.text);
    if (!json_is_object(c)) {
        rc = config_fail(err, field, shown, "not a JSON object");
        goto out;
    }
    for (size_t i = 0; i < sizeof ints / sizeof ints[0] && !rc; i++) {
        v = json_object_get(c, ints[i].key);
        if (!v)
            rc = config_fail(err, field, shown, "%s is missing (the spec's model has %" PRId64 " %s)",
                             ints[i].key, ints[i].want, ints[i].what);
        else if (!json_is_integer(v))
            rc = config_fail(err, field, shown, "%s is not an integer", ints[i].key);
        else if (json_integer_value(v) != ints[i].want)
            rc = config_fail(err, field, shown,
                             "%s is %" JSON_INTEGER_FORMAT " but the spec's model has %" PRId64 " %s",
                             ints[i].key, json_integer_value(v), ints[i].want, ints[i].what);
    }
    if (rc)
        goto out;
    v = json_object_get(c, "layer_norm_epsilon");
    if (!json_is_number(v)) {
        rc = config_fail(err, field, shown, "layer_norm_epsilon is %s (the spec's layernorms have eps %g)",
                         v ? "not a number" : "missing", g->layer_norm_epsilon);
        goto out;
    }
    double eps = json_number_value(v);
    if (!(fabs(eps - g->layer_norm_epsilon) <= 1e-12 * fabs(g->layer_norm_epsilon))) {
        rc = config_fail(err, field, shown, "layer_norm_epsilon is %g but the spec's layernorms have eps %g",
                         eps, g->layer_norm_epsilon);
        goto out;
    }
    v = json_object_get(c, "n_inner");
    int64_t inner = v && !json_is_null(v) ? (json_is_integer(v) ? json_integer_value(v) : -1) : 4 * g->n_embd;
    if (inner != g->n_inner) {
        rc = json_is_integer(v) || !v || json_is_null(v)
                 ? config_fail(err, field, shown,
                               "n_inner is %" PRId64 "%s but the spec's MLP is %" PRId64 " wide", inner,
                               v && !json_is_null(v) ? "" : " (4 * n_embd)", g->n_inner)
                 : config_fail(err, field, shown, "n_inner is not an integer or null");
        goto out;
    }
    v = json_object_get(c, "activation_function");
    if (v) {
        const char *a = json_string_value(v);
        bool tanh = a && (!strcmp(a, "gelu_new") || !strcmp(a, "gelu_pytorch_tanh"));
        if (!a || (!tanh && strcmp(a, "gelu") != 0)) {
            rc = config_fail(err, field, shown,
                             "activation_function is not one ddpd has (gelu_new, gelu_pytorch_tanh or gelu)");
            goto out;
        }
        if (tanh != g->gelu_tanh) {
            rc = config_fail(err, field, shown, "activation_function is \"%s\" but the spec's MLP has %s", a,
                             g->gelu_tanh ? "gelu with approximate tanh (gelu_new)" : "exact gelu (gelu)");
            goto out;
        }
    }
    v = json_object_get(c, "model_type");
    if (v && (!json_is_string(v) || strcmp(json_string_value(v), "gpt2") != 0)) {
        rc = config_fail(err, field, shown, "model_type is not \"gpt2\"");
        goto out;
    }
    /* The attention's scaling: ddpd's is 1/sqrt(head dim), as GPT-2's default. */
    v = json_object_get(c, "scale_attn_weights");
    if (v && !json_is_true(v)) {
        rc = config_fail(err, field, shown,
                         "scale_attn_weights is not true (ddpd scales by 1/sqrt(head dim))");
        goto out;
    }
    v = json_object_get(c, "scale_attn_by_inverse_layer_idx");
    if (v && !json_is_false(v))
        rc = config_fail(err, field, shown,
                         "scale_attn_by_inverse_layer_idx is not false (ddpd has no such scaling)");
out:
    json_decref(c);
    return rc;
}

/* h.N.attn.bias and h.N.attn.masked_bias: the causal mask buffers older files carry. */
static bool mask_buffer(const char *name)
{
    if (strncmp(name, "h.", 2) != 0 || name[2] < '0' || name[2] > '9')
        return false;
    name += 2;
    while (*name >= '0' && *name <= '9')
        name++;
    return !strcmp(name, ".attn.bias") || !strcmp(name, ".attn.masked_bias");
}

ddpd_err gpt2_file_match(const struct gpt2_model *g, const struct safetensors_file *f, const char *field,
                         const char *shown, const struct safetensors_tensor **src, struct ddpd_error *err)
{
    char got[96], want[96];
    const int nf = safetensors_count(f);
    for (int i = 0; i < g->n; i++)
        src[i] = NULL;
    for (int k = 0; k < nf; k++) {
        const struct safetensors_tensor *t = safetensors_at(f, k);
        const char *name = t->name;
        if (!strncmp(name, PREFIX, strlen(PREFIX)))
            name += strlen(PREFIX);
        if (mask_buffer(name))
            continue;
        const struct gpt2_tensor *e = gpt2_tensor_find(g, t->name);
        if (!e)
            return ddpd_error_set(err, DDPD_ESPEC, field,
                                  "%s: %s: tensor \"%.100s\" has no place in the spec's GPT-2 (%" PRId64
                                  " blocks)",
                                  field, shown, t->name, g->n_layer);
        const int i = (int)(e - g->t);
        if (src[i])
            return ddpd_error_set(err, DDPD_ESPEC, field,
                                  "%s: %s: tensor \"%s\" is there twice (as \"%.100s\" and \"%.100s\")",
                                  field, shown, e->hf, src[i]->name, t->name);
        safetensors_shape_text(got, sizeof got, t->ndim, t->shape);
        safetensors_shape_text(want, sizeof want, e->ndim, e->shape);
        bool same = t->ndim == e->ndim;
        for (int d = 0; same && d < e->ndim; d++)
            same = t->shape[d] == e->shape[d];
        if (!same)
            return ddpd_error_set(err, DDPD_ESPEC, field,
                                  "%s: %s: tensor \"%.100s\" has shape %s in the file; the spec needs %s "
                                  "(%s, ddpd's \"%s\"%s)",
                                  field, shown, t->name, got, want, e->where, e->key,
                                  e->conv1d ? ", a Conv1D weight stored [in, out]" : "");
        src[i] = t;
    }
    for (int i = 0; i < g->n; i++) {
        if (src[i] || !strcmp(g->t[i].hf, "lm_head.weight"))
            continue;
        safetensors_shape_text(want, sizeof want, g->t[i].ndim, g->t[i].shape);
        return ddpd_error_set(err, DDPD_ESPEC, field,
                              "%s: %s has no tensor \"%s\" (the spec needs %s for %s, ddpd's \"%s\")", field,
                              shown, g->t[i].hf, want, g->t[i].where, g->t[i].key);
    }
    /* lm_head: Hugging Face's files leave the tied copy out; wte's values stand for it. */
    if (!src[g->n - 1])
        src[g->n - 1] = src[0];
    return DDPD_OK;
}
