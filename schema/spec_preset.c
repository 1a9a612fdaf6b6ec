/* spec_preset.c — model presets (issue 30): `"model": {"preset": "gpt", ...}` instead of a
 * layer list. A preset's fields are checked here, each error at `model.<field>`, and expand
 * to the JSON layer list that spec_layers.c then parses as if the user had written it; the
 * spec keeps the fields (struct spec_preset) so that it prints back as the preset, with the
 * expansion beside it (`expanded`, which a parse checks against its own). Knows jansson and
 * the spec module's helpers, nothing else. */
#include "spec_impl.h"

/* The gpt preset's fields; `expanded` is what spec_to_json adds (output, checked on input). */
static const char *const gpt_keys[] = {"preset",     "layers",  "dim",  "heads", "vocab",
                                       "block_size", "dropout", "bias", "tie",   "expanded"};
static const char *const preset_names[] = {"gpt"};

/* Layers of one gpt block (two residuals: 1 + layernorm, attention; 1 + layernorm, linear,
 * gelu, linear) and of the rest (embedding, position, dropout, layernorm, head): at most
 * SPEC_MAX_LAYERS in all and SPEC_MAX_LIST at the top level. */
#define GPT_BLOCK_LAYERS 8
#define GPT_OTHER_LAYERS 5
#define GPT_MAX_BLOCKS                                                                                       \
    ((SPEC_MAX_LAYERS - GPT_OTHER_LAYERS) / GPT_BLOCK_LAYERS < (SPEC_MAX_LIST - GPT_OTHER_LAYERS) / 2        \
         ? (SPEC_MAX_LAYERS - GPT_OTHER_LAYERS) / GPT_BLOCK_LAYERS                                           \
         : (SPEC_MAX_LIST - GPT_OTHER_LAYERS) / 2)

/* The fields of a gpt preset, each checked where it stands. */
static ddpd_err gpt_fields(struct ddpd_error *err, json_t *m, struct spec_preset *p)
{
    ddpd_err rc = check_keys(err, m, "model", gpt_keys, COUNT(gpt_keys), NULL);
    p->bias = p->tie = true;
    if (rc == DDPD_OK)
        rc = get_int(err, m, "model", "layers", 1, GPT_MAX_BLOCKS, true, &p->layers);
    if (rc == DDPD_OK) /* the MLP's linear is 4·dim wide */
        rc = get_int(err, m, "model", "dim", 1, SPEC_MAX_WIDTH / 4, true, &p->dim);
    if (rc == DDPD_OK)
        rc = get_int(err, m, "model", "heads", 1, SPEC_MAX_HEADS, true, &p->heads);
    if (rc == DDPD_OK && p->dim % p->heads != 0)
        return fail(err, "model.heads", "dim %lld is not a multiple of heads %lld", (long long)p->dim,
                    (long long)p->heads);
    if (rc == DDPD_OK)
        rc = get_int(err, m, "model", "vocab", 1, SPEC_MAX_WIDTH, true, &p->vocab);
    if (rc == DDPD_OK)
        rc = get_int(err, m, "model", "block_size", 1, SPEC_MAX_T, true, &p->block_size);
    if (rc == DDPD_OK)
        rc = get_num(err, m, "model", "dropout", 0, false, 1, true, "a number in [0, 1)", false, &p->dropout);
    /* nanoGPT also drops attention probabilities (attn_dropout), which ddpd's attention
     * layer does not do: a gpt with dropout would not be nanoGPT's, so none is made. */
    if (rc == DDPD_OK && p->dropout > 0)
        return fail(err, "model.dropout",
                    "the gpt preset takes only 0: nanoGPT's dropout also drops attention probabilities "
                    "(attn_dropout), which ddpd's attention layer does not do; write the layer list "
                    "by hand for dropout layers alone");
    if (rc == DDPD_OK)
        rc = get_bool(err, m, "model", "bias", &p->bias);
    if (rc == DDPD_OK)
        rc = get_bool(err, m, "model", "tie", &p->tie);
    return rc;
}

/* Appends the layer `l` (stolen) to `list`; false when memory ran out. */
static bool add(json_t *list, json_t *l)
{
    if (!list) {
        json_decref(l);
        return false;
    }
    return l && json_array_append_new(list, l) == 0;
}

/* nanoGPT's GPT in ddpd's layers: wte, wpe, drop, the blocks (ln_1, attn; ln_2, c_fc,
 * gelu tanh, c_proj: pre-norm residuals), ln_f and lm_head (no bias; the embedding's table
 * when tied). A new reference, or NULL when memory ran out. */
static json_t *gpt_layers(const struct spec_preset *p)
{
    const json_int_t d = (json_int_t)p->dim;
    json_t *list = json_array();
    bool ok =
        add(list, json_pack("{s:s, s:I, s:I}", "type", "embedding", "num", (json_int_t)p->vocab, "dim", d)) &&
        add(list,
            json_pack("{s:s, s:I, s:I}", "type", "position", "max", (json_int_t)p->block_size, "dim", d)) &&
        add(list, json_pack("{s:s, s:f}", "type", "dropout", "p", p->dropout));
    for (int64_t b = 0; ok && b < p->layers; b++) {
        json_t *attn = json_pack("[{s:s, s:I, s:b}, {s:s, s:I, s:I, s:b, s:b}]", "type", "layernorm", "dim",
                                 d, "bias", p->bias, "type", "attention", "dim", d, "heads",
                                 (json_int_t)p->heads, "causal", 1, "bias", p->bias);
        json_t *mlp = json_pack("[{s:s, s:I, s:b}, {s:s, s:I, s:I, s:b}, {s:s, s:s}, {s:s, s:I, s:I, s:b}]",
                                "type", "layernorm", "dim", d, "bias", p->bias, "type", "linear", "in", d,
                                "out", 4 * d, "bias", p->bias, "type", "gelu", "approximate", "tanh", "type",
                                "linear", "in", 4 * d, "out", d, "bias", p->bias);
        /* "o" steals its value, also when the pack fails */
        ok = add(list, attn ? json_pack("{s:s, s:o}", "type", "residual", "layers", attn) : NULL);
        ok = add(list, mlp ? json_pack("{s:s, s:o}", "type", "residual", "layers", mlp) : NULL) && ok;
    }
    json_t *head =
        json_pack("{s:s, s:I, s:I, s:b}", "type", "linear", "in", d, "out", (json_int_t)p->vocab, "bias", 0);
    if (head && p->tie && json_object_set_new(head, "tie", json_string("0")) != 0)
        ok = false;
    ok = add(list, json_pack("{s:s, s:I, s:b}", "type", "layernorm", "dim", d, "bias", p->bias)) && ok;
    ok = add(list, head) && ok;
    if (!ok) {
        json_decref(list);
        return NULL;
    }
    return list;
}

ddpd_err parse_preset(struct ddpd_error *err, json_t *model, struct spec *s, json_t **list)
{
    int k = 0;
    ddpd_err rc = get_enum(err, model, "model", "preset", preset_names, COUNT(preset_names), true, &k);
    if (rc != DDPD_OK)
        return rc;
    struct spec_preset *p = &s->preset;
    snprintf(p->name, sizeof p->name, "%s", preset_names[k]);
    if ((rc = gpt_fields(err, model, p)) != DDPD_OK)
        return rc;
    if (!(*list = gpt_layers(p)))
        return ddpd_error_set(err, DDPD_ENOMEM, "model", "out of memory expanding the preset");
    return DDPD_OK;
}

ddpd_err check_expanded(struct ddpd_error *err, json_t *model, const struct spec *s)
{
    json_t *given = json_object_get(model, "expanded");
    if (!given)
        return DDPD_OK;
    struct spec *t = calloc(1, sizeof *t);
    if (!t)
        return ddpd_error_set(err, DDPD_ENOMEM, "model.expanded", "out of memory checking model.expanded");
    ddpd_err rc = parse_layers(err, t, given, "model.expanded");
    if (rc == DDPD_OK && (t->n_layers != s->n_layers ||
                          memcmp(t->layers, s->layers, (size_t)s->n_layers * sizeof s->layers[0]) != 0))
        rc = fail(err, "model.expanded",
                  "differs from the %s preset's layers (it is written by ddpd, to show them: leave it out "
                  "or give the preset's own)",
                  s->preset.name);
    free(t);
    return rc;
}

json_t *preset_to_json(const struct spec *s, json_t *expanded)
{
    const struct spec_preset *p = &s->preset;
    json_t *j = json_pack("{s:s, s:I, s:I, s:I, s:I, s:I, s:f, s:b, s:b, s:o}", "preset", p->name, "layers",
                          (json_int_t)p->layers, "dim", (json_int_t)p->dim, "heads", (json_int_t)p->heads,
                          "vocab", (json_int_t)p->vocab, "block_size", (json_int_t)p->block_size, "dropout",
                          p->dropout, "bias", p->bias, "tie", p->tie, "expanded", expanded);
    return j;
}
