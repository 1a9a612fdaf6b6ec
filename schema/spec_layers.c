/* spec_layers.c — the spec's `model` and `input_shape` (CONTRACT.md §2a): each layer's keys, the
 * layer tree with its residuals, and the shapes inferred as one sample flows through it, checked
 * layer by layer; and the questions the rest of ddpd asks about the model's shape
 * (spec_output_layer, spec_classes, ...). Knows jansson and nothing else. */
#include "spec_impl.h"

/* By layer_kind: LAYER_GELU_TANH is "gelu" too (its "approximate" says which). */
static const char *const layer_names[] = {"linear",    "relu",      "tanh",     "sigmoid",   "gelu",
                                          "gelu",      "embedding", "position", "layernorm", "attention",
                                          "residual",  "dropout",   "conv2d",   "maxpool2d", "avgpool2d",
                                          "batchnorm", "flatten"};

static const char *const linear_keys[] = {"type", "in", "out", "bias", "tie"};
static const char *const activation_keys[] = {"type"};

/* ---- the model's shape, which the other sections ask about ---- */

int64_t last_linear(const struct spec *s)
{
    for (int i = s->n_layers - 1; i >= 0; i--)
        if (s->layers[i].kind == LAYER_LINEAR)
            return i;
    return -1;
}

/* A model of linear layers and activations alone: what v1 took, and what synthetic and
 * CSV data can feed. */
static bool is_mlp_kind(layer_kind k)
{
    return k == LAYER_LINEAR || k == LAYER_RELU || k == LAYER_TANH || k == LAYER_SIGMOID || k == LAYER_GELU ||
           k == LAYER_GELU_TANH;
}

/* The first layer that is not linear or an activation, or -1. */
int first_non_mlp(const struct spec *s)
{
    for (int i = 0; i < s->n_layers; i++)
        if (!is_mlp_kind(s->layers[i].kind))
            return i;
    return -1;
}

/* "model[2].layers[1]" for the layer whose key is "2.1". */
void layer_path(char *dst, const struct spec *s, int i)
{
    int o = snprintf(dst, PATH_CAP, "model");
    for (const char *k = s->layers[i].key; *k && o < (int)PATH_CAP;) {
        size_t n = strcspn(k, ".");
        o += snprintf(dst + o, PATH_CAP - (size_t)o, "%s[%.*s]", k == s->layers[i].key ? "" : ".layers",
                      (int)n, k);
        k += n;
        k += (*k == '.');
    }
}

void spec_layer_path(const struct spec *s, int i, char *dst, size_t cap)
{
    char path[PATH_CAP];
    layer_path(path, s, i);
    snprintf(dst, cap, "%s", path);
}

/* "[32,4,4]" */
void shape_str(char *dst, size_t cap, int rank, const int64_t *shape)
{
    size_t o = (size_t)snprintf(dst, cap, "[");
    for (int i = 0; i < rank && o < cap; i++)
        o += (size_t)snprintf(dst + o, cap - o, "%s%lld", i ? "," : "", (long long)shape[i]);
    if (o < cap)
        snprintf(dst + o, cap - o, "]");
}

int64_t shape_numel(int rank, const int64_t *shape)
{
    int64_t n = 1;
    for (int i = 0; i < rank; i++)
        if (__builtin_mul_overflow(n, shape[i], &n))
            return INT64_MAX;
    return n;
}

/* ---- the model: layers, their keys, and the shapes flowing through them ---- */

/* The names `type` takes, and the kind each one is (gelu's approximation is a key). */
static const char *const type_names[] = {
    "linear",    "relu",     "tanh",    "sigmoid", "gelu",      "embedding", "position",  "layernorm",
    "attention", "residual", "dropout", "conv2d",  "maxpool2d", "avgpool2d", "batchnorm", "flatten"};
static const layer_kind type_kinds[] = {LAYER_LINEAR,    LAYER_RELU,      LAYER_TANH,      LAYER_SIGMOID,
                                        LAYER_GELU,      LAYER_EMBEDDING, LAYER_POSITION,  LAYER_LAYERNORM,
                                        LAYER_ATTENTION, LAYER_RESIDUAL,  LAYER_DROPOUT,   LAYER_CONV2D,
                                        LAYER_MAXPOOL2D, LAYER_AVGPOOL2D, LAYER_BATCHNORM, LAYER_FLATTEN};
static const char *const gelu_approx_names[] = {"none", "tanh"};

static const char *const gelu_keys[] = {"type", "approximate"};
static const char *const embedding_keys[] = {"type", "num", "dim"};
static const char *const position_keys[] = {"type", "max", "dim"};
static const char *const layernorm_keys[] = {"type", "dim", "eps", "bias"};
static const char *const attention_keys[] = {"type", "dim", "heads", "causal", "bias"};
static const char *const residual_keys[] = {"type", "layers"};
static const char *const dropout_keys[] = {"type", "p"};
static const char *const conv2d_keys[] = {"type", "in", "out", "kernel", "stride", "padding", "bias"};
static const char *const pool_keys[] = {"type", "kernel", "stride", "padding"};
static const char *const batchnorm_keys[] = {"type", "features", "eps", "momentum"};

static ddpd_err parse_layer_list(struct ddpd_error *err, struct spec *s, json_t *list, const char *lpath,
                                 int parent, int depth);

/* A linear's `tie` (issue 30): the state_dict key of an embedding layer before it ("0"; an
 * integer is a top-level index), whose [num, dim] table the linear uses as its [out, in]
 * weight, as `lm_head.weight = wte.weight` does in PyTorch. Its bias stays its own. Several
 * linears may tie to one embedding (PyTorch allows it). */
static ddpd_err parse_tie(struct ddpd_error *err, struct spec *s, int idx, json_t *layer, const char *lp)
{
    struct spec_layer *l = &s->layers[idx];
    json_t *v = json_object_get(layer, "tie");
    char path[PATH_CAP], key[sizeof l->key], ep[PATH_CAP];
    const char *want = "the key of an embedding layer before it, such as \"0\"";
    if (!v)
        return DDPD_OK;
    path_key(path, lp, "tie");
    if (json_is_integer(v) && json_integer_value(v) >= 0)
        snprintf(key, sizeof key, "%lld", (long long)json_integer_value(v));
    else if (!json_is_string(v))
        return fail_type(err, path, want, v);
    else if (get_str_value(err, v, path, key, sizeof key) != DDPD_OK)
        return DDPD_ESPEC;
    int t = -1;
    for (int j = 0; j < idx && t < 0; j++)
        if (strcmp(s->layers[j].key, key) == 0)
            t = j;
    if (t < 0)
        return fail(err, path, "expected %s, got \"%s\": no layer before %s has that key", want, key, lp);
    const struct spec_layer *e = &s->layers[t];
    layer_path(ep, s, t);
    if (e->kind != LAYER_EMBEDDING)
        return fail(err, path, "expected %s, got \"%s\": %s is %s, not embedding", want, key, ep,
                    layer_kind_name(e->kind));
    if (l->out != e->num || l->in != e->dim)
        return fail(err, path,
                    "a tied linear uses the embedding's [num, dim] table as its [out, in] weight: %s is "
                    "[%lld, %lld], this linear's [out, in] is [%lld, %lld]",
                    ep, (long long)e->num, (long long)e->dim, (long long)l->out, (long long)l->in);
    l->tie = t;
    return DDPD_OK;
}

static ddpd_err parse_layer(struct ddpd_error *err, struct spec *s, int idx, json_t *layer, const char *lp,
                            int depth)
{
    struct spec_layer *l = &s->layers[idx];
    char path[PATH_CAP], only[64];
    int t = 0;
    ddpd_err rc;
    if (!json_is_object(layer))
        return fail_type(err, lp, "a layer object such as {\"type\": \"relu\"}", layer);
    rc = get_enum_hint(err, layer, lp, "type", type_names, COUNT(type_names), true, &t);
    if (rc != DDPD_OK)
        return rc;
    l->kind = type_kinds[t];
    l->tie = -1;
    l->bias = true;
    l->causal = true;
    l->eps = NORM_EPS_DEFAULT;
    l->momentum = BN_MOMENTUM_DEFAULT;
    switch (l->kind) {
    case LAYER_LINEAR:
        rc = check_keys(err, layer, lp, linear_keys, COUNT(linear_keys), NULL);
        if (rc == DDPD_OK)
            rc = get_int(err, layer, lp, "in", 1, SPEC_MAX_WIDTH, true, &l->in);
        if (rc == DDPD_OK)
            rc = get_int(err, layer, lp, "out", 1, SPEC_MAX_WIDTH, true, &l->out);
        if (rc == DDPD_OK)
            rc = get_bool(err, layer, lp, "bias", &l->bias);
        if (rc == DDPD_OK)
            rc = parse_tie(err, s, idx, layer, lp);
        return rc;
    case LAYER_RELU:
    case LAYER_TANH:
    case LAYER_SIGMOID:
    case LAYER_FLATTEN:
        snprintf(only, sizeof only, "a %s layer takes only \"type\"", type_names[t]);
        return check_keys(err, layer, lp, activation_keys, COUNT(activation_keys), only);
    case LAYER_GELU:
    case LAYER_GELU_TANH: {
        int a = 0;
        rc = check_keys(err, layer, lp, gelu_keys, COUNT(gelu_keys), NULL);
        if (rc == DDPD_OK)
            rc = get_enum(err, layer, lp, "approximate", gelu_approx_names, COUNT(gelu_approx_names), false,
                          &a);
        l->kind = a ? LAYER_GELU_TANH : LAYER_GELU;
        return rc;
    }
    case LAYER_EMBEDDING:
        rc = check_keys(err, layer, lp, embedding_keys, COUNT(embedding_keys), NULL);
        if (rc == DDPD_OK)
            rc = get_int(err, layer, lp, "num", 1, SPEC_MAX_WIDTH, true, &l->num);
        if (rc == DDPD_OK)
            rc = get_int(err, layer, lp, "dim", 1, SPEC_MAX_WIDTH, true, &l->dim);
        return rc;
    case LAYER_POSITION:
        rc = check_keys(err, layer, lp, position_keys, COUNT(position_keys), NULL);
        if (rc == DDPD_OK)
            rc = get_int(err, layer, lp, "max", 1, SPEC_MAX_T, true, &l->num);
        if (rc == DDPD_OK)
            rc = get_int(err, layer, lp, "dim", 1, SPEC_MAX_WIDTH, true, &l->dim);
        return rc;
    case LAYER_LAYERNORM:
        rc = check_keys(err, layer, lp, layernorm_keys, COUNT(layernorm_keys), NULL);
        if (rc == DDPD_OK)
            rc = get_int(err, layer, lp, "dim", 1, SPEC_MAX_WIDTH, true, &l->dim);
        if (rc == DDPD_OK)
            rc =
                get_num(err, layer, lp, "eps", 0, true, INFINITY, false, "a positive number", false, &l->eps);
        if (rc == DDPD_OK)
            rc = get_bool(err, layer, lp, "bias", &l->bias);
        return rc;
    case LAYER_ATTENTION:
        rc = check_keys(err, layer, lp, attention_keys, COUNT(attention_keys), NULL);
        if (rc == DDPD_OK)
            rc = get_int(err, layer, lp, "dim", 1, SPEC_MAX_WIDTH, true, &l->dim);
        if (rc == DDPD_OK)
            rc = get_int(err, layer, lp, "heads", 1, SPEC_MAX_HEADS, true, &l->heads);
        if (rc == DDPD_OK)
            rc = get_bool(err, layer, lp, "causal", &l->causal);
        if (rc == DDPD_OK)
            rc = get_bool(err, layer, lp, "bias", &l->bias);
        if (rc == DDPD_OK && l->dim % l->heads != 0) {
            path_key(path, lp, "heads");
            return fail(err, path, "expected a divisor of dim %lld, got %lld", (long long)l->dim,
                        (long long)l->heads);
        }
        return rc;
    case LAYER_RESIDUAL: {
        rc = check_keys(err, layer, lp, residual_keys, COUNT(residual_keys), NULL);
        if (rc != DDPD_OK)
            return rc;
        path_key(path, lp, "layers");
        json_t *inner = json_object_get(layer, "layers");
        if (depth >= SPEC_MAX_DEPTH)
            return fail(err, path, "residuals nest at most %d deep", SPEC_MAX_DEPTH);
        if (!inner)
            return missing(err, path, "a non-empty list of layers");
        rc = parse_layer_list(err, s, inner, path, idx, depth + 1);
        s->layers[idx].end = s->n_layers;
        return rc;
    }
    case LAYER_DROPOUT:
        rc = check_keys(err, layer, lp, dropout_keys, COUNT(dropout_keys), NULL);
        if (rc == DDPD_OK)
            rc = get_num(err, layer, lp, "p", 0, false, 1, true, "a number in [0, 1)", true, &l->p);
        return rc;
    case LAYER_CONV2D:
        rc = check_keys(err, layer, lp, conv2d_keys, COUNT(conv2d_keys), NULL);
        l->stride[0] = l->stride[1] = 1;
        if (rc == DDPD_OK)
            rc = get_int(err, layer, lp, "in", 1, SPEC_MAX_WIDTH, true, &l->in);
        if (rc == DDPD_OK)
            rc = get_int(err, layer, lp, "out", 1, SPEC_MAX_WIDTH, true, &l->out);
        if (rc == DDPD_OK)
            rc = get_pair(err, layer, lp, "kernel", 1, SPEC_MAX_KERNEL, true, l->kernel);
        if (rc == DDPD_OK)
            rc = get_pair(err, layer, lp, "stride", 1, SPEC_MAX_KERNEL, false, l->stride);
        if (rc == DDPD_OK)
            rc = get_pair(err, layer, lp, "padding", 0, SPEC_MAX_KERNEL, false, l->padding);
        if (rc == DDPD_OK)
            rc = get_bool(err, layer, lp, "bias", &l->bias);
        return rc;
    case LAYER_MAXPOOL2D:
    case LAYER_AVGPOOL2D:
        rc = check_keys(err, layer, lp, pool_keys, COUNT(pool_keys), NULL);
        if (rc == DDPD_OK)
            rc = get_pair(err, layer, lp, "kernel", 1, SPEC_MAX_KERNEL, true, l->kernel);
        l->stride[0] = l->kernel[0];
        l->stride[1] = l->kernel[1];
        if (rc == DDPD_OK)
            rc = get_pair(err, layer, lp, "stride", 1, SPEC_MAX_KERNEL, false, l->stride);
        if (rc == DDPD_OK)
            rc = get_pair(err, layer, lp, "padding", 0, SPEC_MAX_KERNEL, false, l->padding);
        /* PyTorch's own rule: "pad should be at most half of effective kernel size", that is
         * padding <= kernel / 2 in integers; the message shows that limit, not the kernel. */
        if (rc == DDPD_OK && (2 * l->padding[0] > l->kernel[0] || 2 * l->padding[1] > l->kernel[1])) {
            path_key(path, lp, "padding");
            return fail(err, path,
                        "expected at most [%lld,%lld] (half the kernel [%lld,%lld]), got [%lld,%lld]",
                        (long long)(l->kernel[0] / 2), (long long)(l->kernel[1] / 2), (long long)l->kernel[0],
                        (long long)l->kernel[1], (long long)l->padding[0], (long long)l->padding[1]);
        }
        l->bias = false;
        return rc;
    case LAYER_BATCHNORM:
        rc = check_keys(err, layer, lp, batchnorm_keys, COUNT(batchnorm_keys), NULL);
        if (rc == DDPD_OK)
            rc = get_int(err, layer, lp, "features", 1, SPEC_MAX_WIDTH, true, &l->dim);
        if (rc == DDPD_OK)
            rc =
                get_num(err, layer, lp, "eps", 0, true, INFINITY, false, "a positive number", false, &l->eps);
        if (rc == DDPD_OK)
            rc = get_num(err, layer, lp, "momentum", 0, false, 1, false, "a number in [0, 1]", false,
                         &l->momentum);
        l->bias = true; /* its affine shift */
        return rc;
    }
    return DDPD_OK;
}

static ddpd_err parse_layer_list(struct ddpd_error *err, struct spec *s, json_t *list, const char *lpath,
                                 int parent, int depth)
{
    if (!json_is_array(list))
        return fail_type(err, lpath, "a list of layers", list);
    size_t n = json_array_size(list);
    if (n == 0)
        return fail(err, lpath, "expected at least one layer, got an empty list");
    if (n > SPEC_MAX_LIST)
        return fail(err, lpath, "at most %d layers, got %zu", SPEC_MAX_LIST, n);
    for (size_t i = 0; i < n; i++) {
        char lp[PATH_CAP];
        path_index(lp, lpath, i);
        if (s->n_layers >= SPEC_MAX_LAYERS)
            return fail(err, lp, "at most %d layers in the whole model, the residuals' layers counted",
                        SPEC_MAX_LAYERS);
        int idx = s->n_layers++;
        struct spec_layer *l = &s->layers[idx];
        l->parent = parent;
        l->end = idx + 1;
        if (parent < 0)
            snprintf(l->key, sizeof l->key, "%zu", i);
        else {
            char pk[sizeof l->key];
            memcpy(pk, s->layers[parent].key, sizeof pk);
            /* at most 9 levels of "63.": never cut short */
            if (snprintf(l->key, sizeof l->key, "%s.%zu", pk, i) >= (int)sizeof l->key)
                return fail(err, lp, "residuals nest too deep");
        }
        ddpd_err rc = parse_layer(err, s, idx, json_array_get(list, i), lp, depth);
        if (rc != DDPD_OK)
            return rc;
    }
    return DDPD_OK;
}

/* The shape of one sample flowing through the model, and where its last dimension
 * came from, for messages ("model[0].out", "flatten of [32,4,4]"). */
struct flow {
    int rank;
    int64_t shape[SPEC_MAX_RANK];
    char src[PATH_CAP + 64];
};

static ddpd_err flow_fail_rank(struct ddpd_error *err, const char *lp, const char *what, const struct flow *f)
{
    char sh[128];
    shape_str(sh, sizeof sh, f->rank, f->shape);
    return fail(err, lp, "%s, got %s", what, sh);
}

/* A key that must equal a dimension of the tensor entering the layer. */
static ddpd_err expect_dim(struct ddpd_error *err, const char *lp, const char *key, int64_t want,
                           const char *why, int64_t got)
{
    char path[PATH_CAP];
    if (want == got)
        return DDPD_OK;
    path_key(path, lp, key);
    return fail(err, path, "expected %lld (%s), got %lld", (long long)want, why, (long long)got);
}

/* Output height and width of a conv2d or pooling layer on [C,H,W]; an error at the
 * kernel when the padded input is smaller than it. */
static ddpd_err window_out(struct ddpd_error *err, const char *lp, const struct spec_layer *l,
                           const struct flow *f, int64_t hw[2])
{
    for (int d = 0; d < 2; d++) {
        int64_t padded = f->shape[1 + d] + 2 * l->padding[d];
        if (padded < l->kernel[d]) {
            char path[PATH_CAP], sh[128];
            path_key(path, lp, "kernel");
            shape_str(sh, sizeof sh, f->rank, f->shape);
            return fail(err, path,
                        "kernel [%lld,%lld] does not fit the input %s with padding [%lld,%lld]: the output "
                        "would be smaller than 1",
                        (long long)l->kernel[0], (long long)l->kernel[1], sh, (long long)l->padding[0],
                        (long long)l->padding[1]);
        }
        hw[d] = (padded - l->kernel[d]) / l->stride[d] + 1;
    }
    return DDPD_OK;
}

/* Layer i with the tensor `f` entering it: checks its keys against f, records its
 * shapes and leaves in f what comes out. */
static ddpd_err infer_layer(struct ddpd_error *err, struct spec *s, int i, struct flow *f)
{
    struct spec_layer *l = &s->layers[i];
    char lp[PATH_CAP], sh[128];
    const int r = f->rank;
    int64_t *last = &f->shape[r - 1];
    ddpd_err rc = DDPD_OK;
    layer_path(lp, s, i);
    l->in_rank = r;
    memcpy(l->in_shape, f->shape, sizeof l->in_shape);
    switch (l->kind) {
    case LAYER_LINEAR:
        if (l->in != *last) {
            char path[PATH_CAP];
            path_key(path, lp, "in");
            return fail(err, path, "expected %lld (%s), got %lld", (long long)*last,
                        f->src[0] ? f->src : "the width entering it", (long long)l->in);
        }
        *last = l->out;
        snprintf(f->src, sizeof f->src, "%s.out", lp);
        break;
    case LAYER_RELU:
    case LAYER_TANH:
    case LAYER_SIGMOID:
    case LAYER_GELU:
    case LAYER_GELU_TANH:
    case LAYER_DROPOUT: l->in = l->out = *last; break;
    case LAYER_EMBEDDING:
        if (i != 0) {
            char path[PATH_CAP];
            path_key(path, lp, "type");
            return fail(err, path,
                        "embedding must be the first layer of the model (it reads the input's ids)");
        }
        if (r + 1 > SPEC_MAX_RANK)
            return flow_fail_rank(
                err, lp, "embedding adds a dimension: it takes the ids of one sample in at most 3 dimensions",
                f);
        f->shape[r] = l->dim;
        f->rank = r + 1;
        l->in = l->num;
        l->out = l->dim;
        snprintf(f->src, sizeof f->src, "%s.dim", lp);
        break;
    case LAYER_POSITION:
    case LAYER_ATTENTION:
        if (r != 2)
            return flow_fail_rank(err, lp,
                                  l->kind == LAYER_POSITION
                                      ? "a position layer acts on [T,dim] (one sample)"
                                      : "an attention layer acts on [T,dim] (one sample)",
                                  f);
        if ((rc = expect_dim(err, lp, "dim", *last, "the width entering it", l->dim)))
            return rc;
        if (l->kind == LAYER_POSITION && f->shape[0] > l->num) {
            char path[PATH_CAP];
            path_key(path, lp, "max");
            shape_str(sh, sizeof sh, r, f->shape);
            return fail(err, path, "expected at least %lld (T of the input %s), got %lld",
                        (long long)f->shape[0], sh, (long long)l->num);
        }
        if (f->shape[0] > SPEC_MAX_T) {
            shape_str(sh, sizeof sh, r, f->shape);
            return fail(err, lp, "at most %d positions, got %s", SPEC_MAX_T, sh);
        }
        l->in = l->out = l->dim;
        break;
    case LAYER_LAYERNORM:
        if ((rc = expect_dim(err, lp, "dim", *last, "the width entering it", l->dim)))
            return rc;
        l->in = l->out = l->dim;
        break;
    case LAYER_BATCHNORM:
        if (r != 1 && r != 3)
            return flow_fail_rank(err, lp,
                                  "a batchnorm layer acts on [features] or [features,H,W] (one sample)", f);
        if ((rc = expect_dim(err, lp, "features", f->shape[0],
                             r == 1 ? "the width entering it" : "the channels entering it", l->dim)))
            return rc;
        l->in = l->out = l->dim;
        break;
    case LAYER_CONV2D:
    case LAYER_MAXPOOL2D:
    case LAYER_AVGPOOL2D: {
        int64_t hw[2] = {0, 0};
        char what[64];
        snprintf(what, sizeof what, "%s %s layer acts on [C,H,W] (one sample)",
                 l->kind == LAYER_AVGPOOL2D ? "an" : "a", layer_kind_name(l->kind));
        if (r != 3)
            return flow_fail_rank(err, lp, what, f);
        if (l->kind == LAYER_CONV2D &&
            (rc = expect_dim(err, lp, "in", f->shape[0], "the channels entering it", l->in)))
            return rc;
        if ((rc = window_out(err, lp, l, f, hw)))
            return rc;
        if (l->kind == LAYER_CONV2D)
            f->shape[0] = l->out;
        else
            l->in = l->out = f->shape[0];
        f->shape[1] = hw[0];
        f->shape[2] = hw[1];
        f->src[0] = '\0';
        break;
    }
    case LAYER_FLATTEN: {
        int64_t n = shape_numel(r, f->shape);
        shape_str(sh, sizeof sh, r, f->shape);
        snprintf(f->src, sizeof f->src, "flatten of %s", sh);
        f->rank = 1;
        f->shape[0] = n;
        l->in = l->out = n;
        break;
    }
    case LAYER_RESIDUAL: {
        struct flow in = *f;
        for (int j = i + 1; j < l->end; j = s->layers[j].end)
            if ((rc = infer_layer(err, s, j, f)))
                return rc;
        if (f->rank != in.rank || memcmp(f->shape, in.shape, sizeof f->shape) != 0) {
            char a[128];
            shape_str(sh, sizeof sh, in.rank, in.shape);
            shape_str(a, sizeof a, f->rank, f->shape);
            return fail(err, lp,
                        "the output of its layers %s must have the shape of its input %s (x + layers(x))", a,
                        sh);
        }
        *f = in; /* the same shape, and the same source of its width */
        l->in = l->out = in.shape[in.rank - 1];
        break;
    }
    }
    if (shape_numel(f->rank, f->shape) > SPEC_MAX_NUMEL) {
        shape_str(sh, sizeof sh, f->rank, f->shape);
        return fail(err, lp, "one sample's output %s has more than %lld elements", sh, SPEC_MAX_NUMEL);
    }
    l->out_rank = f->rank;
    memset(l->out_shape, 0, sizeof l->out_shape);
    memcpy(l->out_shape, f->shape, sizeof(int64_t) * (size_t)f->rank);
    return DDPD_OK;
}

/* input_shape: 1..SPEC_MAX_RANK positive integers. */
static ddpd_err parse_input_shape(struct ddpd_error *err, json_t *root, struct spec *s)
{
    json_t *v = json_object_get(root, "input_shape");
    char want[96];
    snprintf(want, sizeof want, "a list of 1 to %d integers from 1 to %d", SPEC_MAX_RANK, SPEC_MAX_WIDTH);
    if (!v)
        return DDPD_OK;
    if (!json_is_array(v) || json_array_size(v) < 1 || json_array_size(v) > SPEC_MAX_RANK) {
        if (json_is_array(v))
            return fail(err, "input_shape", "expected %s, got a list of %zu", want, json_array_size(v));
        return fail_type(err, "input_shape", want, v);
    }
    for (size_t i = 0; i < json_array_size(v); i++) {
        char path[PATH_CAP];
        json_t *x = json_array_get(v, i);
        path_index(path, "input_shape", i);
        if (!json_is_integer(x) || json_integer_value(x) < 1 || json_integer_value(x) > SPEC_MAX_WIDTH)
            return fail_type(err, path, "an integer from 1 to 1048576", x);
        s->input_shape[i] = json_integer_value(x);
    }
    s->input_rank = (int)json_array_size(v);
    s->input_shape_set = true;
    if (shape_numel(s->input_rank, s->input_shape) > SPEC_MAX_NUMEL) {
        char sh[128];
        shape_str(sh, sizeof sh, s->input_rank, s->input_shape);
        return fail(err, "input_shape", "one sample of %s has more than %lld elements", sh, SPEC_MAX_NUMEL);
    }
    return DDPD_OK;
}

ddpd_err parse_layers(struct ddpd_error *err, struct spec *s, json_t *list, const char *path)
{
    s->n_layers = 0;
    return parse_layer_list(err, s, list, path, -1, 0);
}

ddpd_err parse_model(struct ddpd_error *err, json_t *root, struct spec *s)
{
    json_t *model = json_object_get(root, "model"), *expansion = NULL;
    char lp[PATH_CAP], path[PATH_CAP];
    ddpd_err rc;
    if (!model)
        return fail(err, "model",
                    "missing (expected a list of layers such as "
                    "[{\"type\": \"linear\", \"in\": 10, \"out\": 1}], or a preset such as "
                    "{\"preset\": \"gpt\", ...})");
    /* A preset (spec_preset.c) is the list it expands to; its input is one window of ids. */
    if (json_is_object(model) && !json_object_get(model, "preset"))
        return fail(
            err, "model",
            "expected a list of layers, or a preset such as {\"preset\": \"gpt\", ...}, got an object "
            "without \"preset\"");
    if (json_is_object(model) && (rc = parse_preset(err, model, s, &expansion)) != DDPD_OK)
        return rc;
    rc = parse_layers(err, s, expansion ? expansion : model, "model");
    json_decref(expansion);
    if (rc == DDPD_OK && s->preset.name[0])
        rc = check_expanded(err, model, s);
    if (rc != DDPD_OK)
        return rc;
    if ((rc = parse_input_shape(err, root, s)) != DDPD_OK)
        return rc;
    if (s->preset.name[0] && !s->input_shape_set) {
        s->input_rank = 1;
        s->input_shape[0] = s->preset.block_size;
        s->input_shape_set = true;
    }

    const struct spec_layer *l0 = &s->layers[0];
    const int odd = first_non_mlp(s);
    if (odd < 0 && l0->kind != LAYER_LINEAR) {
        path_key(path, "model[0]", "type");
        return fail(err, path,
                    "the first layer must be \"linear\" (an activation takes its width from the layer "
                    "before it), got \"%s\"",
                    layer_kind_name(l0->kind));
    }
    if (odd < 0 && s->input_shape_set && (s->input_rank != 1 || s->input_shape[0] != l0->in)) {
        char sh[128];
        shape_str(sh, sizeof sh, s->input_rank, s->input_shape);
        return fail(err, "input_shape",
                    "expected [%lld] (model[0].in) for a model of linear layers and activations, got %s",
                    (long long)l0->in, sh);
    }
    if (!s->input_shape_set) {
        int needs = -1;
        for (int i = 0; i < s->n_layers && needs < 0; i++) {
            layer_kind k = s->layers[i].kind;
            if (k == LAYER_CONV2D || k == LAYER_MAXPOOL2D || k == LAYER_AVGPOOL2D || k == LAYER_FLATTEN)
                needs = i;
        }
        if (l0->kind == LAYER_EMBEDDING)
            return fail(err, "input_shape",
                        "missing (expected the shape of one sample's ids, such as [64]: the model starts "
                        "with embedding)");
        if (needs >= 0) {
            layer_path(lp, s, needs);
            return fail(err, "input_shape",
                        "missing (expected the shape of one sample without the batch dimension, such as "
                        "[1,28,28]: %s is %s)",
                        lp, layer_kind_name(s->layers[needs].kind));
        }
        if (l0->kind != LAYER_LINEAR)
            return fail(err, "input_shape",
                        "missing (expected the shape of one sample without the batch dimension, such as "
                        "[64]: model[0] is %s, which takes its shape from its input)",
                        layer_kind_name(l0->kind));
        s->input_rank = 1;
        s->input_shape[0] = l0->in;
    }

    struct flow f = {.rank = s->input_rank};
    memcpy(f.shape, s->input_shape, sizeof f.shape);
    if (s->input_shape_set) {
        char sh[128];
        shape_str(sh, sizeof sh, s->input_rank, s->input_shape);
        snprintf(f.src, sizeof f.src, "input_shape %s", sh);
    }
    for (int i = 0; i < s->n_layers; i = s->layers[i].end)
        if ((rc = infer_layer(err, s, i, &f)) != DDPD_OK)
            return rc;
    return DDPD_OK;
}

const struct spec_layer *spec_output_layer(const struct spec *s)
{
    int i = 0, last = -1;
    while (i < s->n_layers) {
        last = i;
        i = s->layers[i].end > i ? s->layers[i].end : i + 1;
    }
    return last >= 0 ? &s->layers[last] : NULL;
}

/* ---- questions about the model of a parsed spec ---- */

int64_t spec_in_width(const struct spec *s)
{
    return s->n_layers > 0 ? s->layers[0].in : 0;
}

int64_t spec_out_width(const struct spec *s)
{
    const struct spec_layer *o = spec_output_layer(s);
    if (o && o->out_rank > 0) /* the last dimension of the output: the last linear's out in v1 */
        return o->out_shape[o->out_rank - 1];
    int64_t i = last_linear(s);
    return i >= 0 ? s->layers[i].out : 0;
}

void spec_flat_layers(struct spec *s)
{
    for (int i = 0; i < s->n_layers; i++) {
        struct spec_layer *l = &s->layers[i];
        l->parent = -1;
        l->end = i + 1;
        l->tie = -1;
        snprintf(l->key, sizeof l->key, "%d", i);
        l->in_rank = l->out_rank = 1;
        l->in_shape[0] = l->in;
        l->out_shape[0] = l->out;
    }
    s->input_rank = s->n_layers > 0 ? 1 : 0;
    s->input_shape[0] = s->n_layers > 0 ? s->layers[0].in : 0;
    s->input_shape_set = false;
}

int spec_layer_tie(const struct spec *s, int i)
{
    if (i < 0 || i >= s->n_layers)
        return -1;
    const struct spec_layer *l = &s->layers[i];
    if (l->kind != LAYER_LINEAR || l->tie < 0 || l->tie >= i)
        return -1;
    const struct spec_layer *e = &s->layers[l->tie];
    return e->kind == LAYER_EMBEDDING && e->num == l->out && e->dim == l->in ? l->tie : -1;
}

int64_t spec_sample_numel(const struct spec *s)
{
    return s->input_rank > 0 ? shape_numel(s->input_rank, s->input_shape) : spec_in_width(s);
}

bool spec_input_ids(const struct spec *s)
{
    return s->n_layers > 0 && s->layers[0].kind == LAYER_EMBEDDING;
}

int64_t spec_vocab(const struct spec *s)
{
    return spec_input_ids(s) ? s->layers[0].num : 0;
}

int64_t spec_target_numel(const struct spec *s)
{
    const struct spec_layer *l = spec_output_layer(s);
    if (!l || l->out_rank < 1)
        return s->loss == LOSS_CROSS_ENTROPY ? 1 : spec_out_width(s);
    if (s->loss == LOSS_CROSS_ENTROPY)
        return shape_numel(l->out_rank - 1, l->out_shape);
    return shape_numel(l->out_rank, l->out_shape);
}

int64_t spec_classes(const struct spec *s)
{
    const struct spec_layer *l = spec_output_layer(s);
    return l && l->out_rank > 0 ? l->out_shape[l->out_rank - 1] : spec_out_width(s);
}

const char *layer_kind_name(layer_kind k)
{
    return (unsigned)k < COUNT(layer_names) ? layer_names[k] : "unknown";
}
