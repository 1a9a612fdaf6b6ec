/* spec.c — parses and validates the job spec of CONTRACT.md §2 and §2a (v2: the layer
 * tree, input_shape and the shapes inferred from it, tokens data, eval, the lr schedule,
 * grad_clip) into a struct spec, and prints it back. Every error names the JSON path and says what was
 * expected and what came. Knows jansson and nothing else: it opens no files (paths are only checked for shape
 * here; the worker resolves them against the data directory). */
#include "spec.h"

#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))
#define PATH_CAP sizeof(((struct ddpd_error *)0)->path)

/* By layer_kind: LAYER_GELU_TANH is "gelu" too (its "approximate" says which). */
static const char *const layer_names[] = {"linear",    "relu",      "tanh",     "sigmoid",   "gelu",
                                          "gelu",      "embedding", "position", "layernorm", "attention",
                                          "residual",  "dropout",   "conv2d",   "maxpool2d", "avgpool2d",
                                          "batchnorm", "flatten"};
static const char *const loss_names[] = {"mse", "cross_entropy"};
static const char *const optim_names[] = {"sgd", "adamw"};
static const char *const data_names[] = {"synthetic", "npy", "csv", "tokens"};
static const char *const dtype_names[] = {"uint16", "int32"};
static const char *const sched_names[] = {"constant", "linear", "cosine"};
static const char *const device_names[] = {"cpu", "cuda"};
static const char *const backend_names[] = {"cpu", "nccl"};
static const char *const precision_names[] = {"fp32", "tf32"};
static const char *const nonfinite_names[] = {"fail", "continue"}; /* nonfinite_mode order */

/* The keys each object may hold, in the order error messages list them. */
static const char *const top_keys[] = {
    "name",      "world_size", "device", "precision",  "model",     "input_shape",  "loss",
    "optimizer", "data",       "eval",   "batch_size", "epochs",    "steps",        "grad_accum",
    "grad_clip", "ddp",        "init",   "checkpoint", "log_every", "max_restarts", "on_nonfinite"};
static const char *const linear_keys[] = {"type", "in", "out", "bias"};
static const char *const activation_keys[] = {"type"};
static const char *const sgd_keys[] = {"type",         "lr",       "momentum", "dampening",
                                       "weight_decay", "nesterov", "schedule"};
static const char *const adamw_keys[] = {"type", "lr", "betas", "eps", "weight_decay", "schedule"};
static const char *const schedule_keys[] = {"type", "warmup_steps", "min_lr", "total_steps"};
static const char *const synthetic_keys[] = {"type", "samples", "seed", "shuffle", "drop_last"};
static const char *const npy_keys[] = {"type", "x", "y", "seed", "shuffle", "drop_last"};
static const char *const csv_keys[] = {"type", "path", "target", "seed", "shuffle", "drop_last"};
static const char *const tokens_keys[] = {"type", "path",    "block_size", "dtype",
                                          "seed", "shuffle", "drop_last"};
static const char *const eval_keys[] = {"data", "every_steps", "max_batches"};
static const char *const ddp_keys[] = {"bucket_cap_mb", "join", "divide_by_initial_world_size", "backend",
                                       "timeout_s"};
static const char *const init_keys[] = {"seed", "from", "from_job", "step"};
static const char *const checkpoint_keys[] = {"every_steps", "keep_last"};

/* ---- paths and descriptions for error messages ---- */

/* Length of the longest prefix of s (at most max bytes) that does not split a UTF-8
 * sequence, so truncated text stays valid UTF-8 for the JSON error body. */
static size_t utf8_prefix(const char *s, size_t len, size_t max)
{
    if (len <= max)
        return len;
    while (max > 0 && ((unsigned char)s[max] & 0xC0) == 0x80)
        max--;
    return max;
}

static int is_ident(const char *key)
{
    if (!*key)
        return 0;
    for (const char *p = key; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '_'))
            return 0;
    return 1;
}

/* Writes `s` as the inside of a JSON string, at most `max` bytes of input, and adds
 * "..." when it had to stop early. */
static void quote_into(char *dst, size_t cap, const char *s, size_t len, size_t max)
{
    size_t n = utf8_prefix(s, len, max), o = 0;
    for (size_t i = 0; i < n && o + 8 < cap; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '"' || ch == '\\') {
            dst[o++] = '\\';
            dst[o++] = (char)ch;
        } else if (ch < 0x20) {
            o += (size_t)snprintf(dst + o, cap - o, "\\u%04x", ch);
        } else {
            dst[o++] = (char)ch;
        }
    }
    if (n < len && o + 4 < cap) {
        memcpy(dst + o, "...", 3);
        o += 3;
    }
    dst[o < cap ? o : cap - 1] = '\0';
}

/* `parent.key`, or `key` at the top; keys that are not identifiers are written
 * `parent["key"]` so the path stays unambiguous. */
static void path_key(char *dst, const char *parent, const char *key)
{
    if (is_ident(key) && strlen(key) <= 64) {
        snprintf(dst, PATH_CAP, "%s%s%s", parent, *parent ? "." : "", key);
    } else {
        char q[160];
        quote_into(q, sizeof q, key, strlen(key), 64);
        snprintf(dst, PATH_CAP, "%s[\"%s\"]", parent, q);
    }
}

static void path_index(char *dst, const char *parent, size_t i)
{
    if (snprintf(dst, PATH_CAP, "%s[%zu]", parent, i) >= (int)PATH_CAP)
        dst[PATH_CAP - 1] = '\0'; /* cut short: residuals nest at most SPEC_MAX_DEPTH deep */
}

/* Shortest %g that reads back as the same double. */
static void fmt_real(char *dst, size_t cap, double x)
{
    if (isfinite(x) && x == floor(x) && fabs(x) < 1e15) {
        snprintf(dst, cap, "%.1f", x); /* 3.0, so a real is not mistaken for an integer */
        return;
    }
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(dst, cap, "%.*g", prec, x);
        if (strtod(dst, NULL) == x)
            return;
    }
}

/* What the user gave, for "got ..." in messages: "3", 3.5, true, null, an array. */
static const char *describe(const json_t *v, char *buf, size_t cap)
{
    switch (json_typeof(v)) {
    case JSON_STRING: {
        char q[160];
        quote_into(q, sizeof q, json_string_value(v), json_string_length(v), 40);
        snprintf(buf, cap, "\"%s\"", q);
        break;
    }
    case JSON_INTEGER: snprintf(buf, cap, "%" JSON_INTEGER_FORMAT, json_integer_value(v)); break;
    case JSON_REAL: fmt_real(buf, cap, json_real_value(v)); break;
    case JSON_TRUE: snprintf(buf, cap, "true"); break;
    case JSON_FALSE: snprintf(buf, cap, "false"); break;
    case JSON_NULL: snprintf(buf, cap, "null"); break;
    case JSON_ARRAY: snprintf(buf, cap, "an array"); break;
    case JSON_OBJECT: snprintf(buf, cap, "an object"); break;
    }
    return buf;
}

static ddpd_err fail(struct ddpd_error *err, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static ddpd_err fail(struct ddpd_error *err, const char *path, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ddpd_error_vset(err, DDPD_ESPEC, path, fmt, ap);
    va_end(ap);
    return DDPD_ESPEC;
}

static ddpd_err fail_type(struct ddpd_error *err, const char *path, const char *want, const json_t *got)
{
    char d[200];
    return fail(err, path, "expected %s, got %s", want, describe(got, d, sizeof d));
}

/* "a, b, c" */
static void join_names(char *dst, size_t cap, const char *const *names, size_t n)
{
    size_t o = 0;
    dst[0] = '\0';
    for (size_t i = 0; i < n && o < cap; i++)
        o += (size_t)snprintf(dst + o, cap - o, "%s%s", i ? ", " : "", names[i]);
}

/* Levenshtein distance of two short keys, for "did you mean". */
static size_t edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b), row[65];
    if (la > 64 || lb > 64)
        return 99;
    for (size_t j = 0; j <= lb; j++)
        row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j];
            size_t best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

/* Unknown keys are an error (CONTRACT.md §2): the first one, in document order, is
 * reported with the keys this object takes. `only` replaces the list for objects that
 * take a single key ("a relu layer takes only \"type\""). */
static ddpd_err check_keys(struct ddpd_error *err, json_t *obj, const char *parent,
                           const char *const *allowed, size_t n, const char *only)
{
    const char *key;
    json_t *v;
    json_object_foreach (obj, key, v) {
        size_t i, best = 0, best_d = 99;
        for (i = 0; i < n && strcmp(key, allowed[i]) != 0; i++)
            ;
        if (i < n)
            continue;
        /* Unknown: the nearest allowed key, for the hint. */
        for (i = 0; i < n; i++) {
            size_t d = edit_distance(key, allowed[i]);
            if (d < best_d) {
                best_d = d;
                best = i;
            }
        }
        char path[PATH_CAP], list[512];
        path_key(path, parent, key);
        if (only)
            return fail(err, path, "unknown key (%s)", only);
        join_names(list, sizeof list, allowed, n);
        if (best_d <= 2 && best_d < strlen(key))
            return fail(err, path, "unknown key (did you mean \"%s\"? expected one of %s)", allowed[best],
                        list);
        return fail(err, path, "unknown key (expected one of %s)", list);
    }
    return DDPD_OK;
}

/* ---- typed getters: each leaves *out alone when the key is absent and not required ---- */

static ddpd_err missing(struct ddpd_error *err, const char *path, const char *want)
{
    return fail(err, path, "missing (expected %s)", want);
}

static void int_phrase(char *dst, size_t cap, int64_t lo, int64_t hi)
{
    if (hi == INT64_MAX && lo == 1)
        snprintf(dst, cap, "a positive integer");
    else if (hi == INT64_MAX && lo == 0)
        snprintf(dst, cap, "a non-negative integer");
    else
        snprintf(dst, cap, "an integer from %lld to %lld", (long long)lo, (long long)hi);
}

static ddpd_err get_int(struct ddpd_error *err, json_t *obj, const char *parent, const char *key, int64_t lo,
                        int64_t hi, bool required, int64_t *out)
{
    char path[PATH_CAP], want[96];
    json_t *v = json_object_get(obj, key);
    path_key(path, parent, key);
    int_phrase(want, sizeof want, lo, hi);
    if (!v)
        return required ? missing(err, path, want) : DDPD_OK;
    /* Reals are refused even when whole (3.0): counts are integers in PyTorch too. */
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return fail_type(err, path, want, v);
    *out = json_integer_value(v);
    return DDPD_OK;
}

static ddpd_err get_int32(struct ddpd_error *err, json_t *obj, const char *parent, const char *key, int lo,
                          int hi, int *out)
{
    int64_t x = *out;
    ddpd_err rc = get_int(err, obj, parent, key, lo, hi, false, &x);
    if (rc == DDPD_OK)
        *out = (int)x;
    return rc;
}

/* A finite number with lo < x (lo_open) or lo <= x, and x <= hi; `want` is the phrase
 * for messages ("a positive number"). Integers are numbers too. */
static ddpd_err get_num(struct ddpd_error *err, json_t *obj, const char *parent, const char *key, double lo,
                        bool lo_open, double hi, bool hi_open, const char *want, bool required, double *out)
{
    char path[PATH_CAP];
    json_t *v = json_object_get(obj, key);
    path_key(path, parent, key);
    if (!v)
        return required ? missing(err, path, want) : DDPD_OK;
    if (!json_is_number(v))
        return fail_type(err, path, want, v);
    double x = json_number_value(v);
    if (!isfinite(x) || (lo_open ? !(x > lo) : !(x >= lo)) || (hi_open ? !(x < hi) : !(x <= hi)))
        return fail_type(err, path, want, v);
    *out = x;
    return DDPD_OK;
}

static ddpd_err get_bool(struct ddpd_error *err, json_t *obj, const char *parent, const char *key, bool *out)
{
    char path[PATH_CAP];
    json_t *v = json_object_get(obj, key);
    if (!v)
        return DDPD_OK;
    if (!json_is_boolean(v)) {
        path_key(path, parent, key);
        return fail_type(err, path, "true or false", v);
    }
    *out = json_is_true(v);
    return DDPD_OK;
}

/* A string that fits in dst (cap bytes with the NUL) and holds no NUL byte. */
static ddpd_err get_str_value(struct ddpd_error *err, json_t *v, const char *path, char *dst, size_t cap)
{
    if (!json_is_string(v))
        return fail_type(err, path, "a string", v);
    size_t len = json_string_length(v);
    if (len >= cap)
        return fail(err, path, "expected a string of at most %zu bytes, got %zu bytes", cap - 1, len);
    if (strlen(json_string_value(v)) != len)
        return fail(err, path, "must not contain NUL bytes");
    memcpy(dst, json_string_value(v), len + 1);
    return DDPD_OK;
}

/* One of names[]; *out is the index. A missing required key lists the choices. */
static ddpd_err get_enum(struct ddpd_error *err, json_t *obj, const char *parent, const char *key,
                         const char *const *names, size_t n, bool required, int *out)
{
    char path[PATH_CAP], list[256], want[300];
    json_t *v = json_object_get(obj, key);
    path_key(path, parent, key);
    join_names(list, sizeof list, names, n);
    snprintf(want, sizeof want, "one of %s", list);
    if (!v)
        return required ? missing(err, path, want) : DDPD_OK;
    if (json_is_string(v))
        for (size_t i = 0; i < n; i++)
            if (strcmp(json_string_value(v), names[i]) == 0 && strlen(names[i]) == json_string_length(v)) {
                *out = (int)i;
                return DDPD_OK;
            }
    return fail_type(err, path, want, v);
}

/* An object member that must itself be an object; *out is NULL when absent. */
static ddpd_err get_obj(struct ddpd_error *err, json_t *obj, const char *key, bool required,
                        const char *example, json_t **out)
{
    char path[PATH_CAP];
    json_t *v = json_object_get(obj, key);
    path_key(path, "", key);
    *out = NULL;
    if (!v)
        return required ? fail(err, path, "missing (expected an object such as %s)", example) : DDPD_OK;
    if (!json_is_object(v))
        return fail_type(err, path, "an object", v);
    *out = v;
    return DDPD_OK;
}

/* Data and weight paths are relative to the server's --data-dir and may not leave it
 * (CONTRACT.md §2). Symbolic links inside the data directory are the operator's business. */
static ddpd_err get_path_value(struct ddpd_error *err, json_t *v, const char *path, char *dst)
{
    ddpd_err rc = get_str_value(err, v, path, dst, SPEC_PATH_MAX);
    if (rc != DDPD_OK)
        return rc;
    if (!dst[0])
        return fail(err, path, "expected a file path, got an empty string");
    if (dst[0] == '/') {
        char d[200];
        return fail(err, path, "must be relative to the data directory, got %s", describe(v, d, sizeof d));
    }
    for (const char *p = dst; *p;) {
        size_t n = strcspn(p, "/");
        if (n == 2 && p[0] == '.' && p[1] == '.')
            return fail(err, path, "must stay inside the data directory (\"..\" not allowed)");
        p += n;
        p += (*p == '/');
    }
    return DDPD_OK;
}

static ddpd_err get_path(struct ddpd_error *err, json_t *obj, const char *parent, const char *key,
                         bool required, char *dst)
{
    char path[PATH_CAP];
    json_t *v = json_object_get(obj, key);
    path_key(path, parent, key);
    if (!v)
        return required ? missing(err, path, "a file path relative to the data directory") : DDPD_OK;
    return get_path_value(err, v, path, dst);
}

/* ---- the sections of the spec ---- */

static int64_t last_linear(const struct spec *s)
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
static int first_non_mlp(const struct spec *s)
{
    for (int i = 0; i < s->n_layers; i++)
        if (!is_mlp_kind(s->layers[i].kind))
            return i;
    return -1;
}

/* "model[2].layers[1]" for the layer whose key is "2.1". */
static void layer_path(char *dst, const struct spec *s, int i)
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

/* "[32,4,4]" */
static void shape_str(char *dst, size_t cap, int rank, const int64_t *shape)
{
    size_t o = (size_t)snprintf(dst, cap, "[");
    for (int i = 0; i < rank && o < cap; i++)
        o += (size_t)snprintf(dst + o, cap - o, "%s%lld", i ? "," : "", (long long)shape[i]);
    if (o < cap)
        snprintf(dst + o, cap - o, "]");
}

static int64_t shape_numel(int rank, const int64_t *shape)
{
    int64_t n = 1;
    for (int i = 0; i < rank; i++)
        if (__builtin_mul_overflow(n, shape[i], &n))
            return INT64_MAX;
    return n;
}

/* An int, or a list of two ints, each in [lo, hi] (kernel, stride, padding: [h, w]). */
static ddpd_err get_pair(struct ddpd_error *err, json_t *obj, const char *parent, const char *key, int64_t lo,
                         int64_t hi, bool required, int64_t out[2])
{
    char path[PATH_CAP], one[96], want[200];
    json_t *v = json_object_get(obj, key);
    path_key(path, parent, key);
    int_phrase(one, sizeof one, lo, hi);
    snprintf(want, sizeof want, "%s or a list of 2 of them [h, w]", one);
    if (!v)
        return required ? missing(err, path, want) : DDPD_OK;
    if (json_is_integer(v) && json_integer_value(v) >= lo && json_integer_value(v) <= hi) {
        out[0] = out[1] = json_integer_value(v);
        return DDPD_OK;
    }
    if (!json_is_array(v))
        return fail_type(err, path, want, v);
    if (json_array_size(v) != 2)
        return fail(err, path, "expected a list of 2 integers [h, w], got %zu", json_array_size(v));
    for (size_t i = 0; i < 2; i++) {
        char ip[PATH_CAP];
        json_t *x = json_array_get(v, i);
        path_index(ip, path, i);
        if (!json_is_integer(x) || json_integer_value(x) < lo || json_integer_value(x) > hi)
            return fail_type(err, ip, one, x);
        out[i] = json_integer_value(x);
    }
    return DDPD_OK;
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

/* An .npy file with more bytes of values than this is memory-mapped by the ranks, not
 * loaded (worker/data/npy.c's DATA_MAP_MIN): the memory estimate counts it as not held. */
#define SPEC_DATA_MAP_MIN   (64LL << 20)
#define SPEC_MAX_DEPTH      8           /* residuals inside residuals */
#define SPEC_MAX_KERNEL     1024        /* kernel, stride and padding of conv2d and pooling */
#define SPEC_MAX_HEADS      1024        /* attention heads */
#define SPEC_MAX_T          65536       /* positions entering an attention or position layer */
#define SPEC_MAX_NUMEL      (1LL << 32) /* elements of one sample entering or leaving a layer */
#define NORM_EPS_DEFAULT    1e-5        /* layernorm's and batchnorm's eps, PyTorch's default */
#define BN_MOMENTUM_DEFAULT 0.1         /* batchnorm's momentum, PyTorch's default */

static ddpd_err parse_layer_list(struct ddpd_error *err, struct spec *s, json_t *list, const char *lpath,
                                 int parent, int depth);

static ddpd_err parse_layer(struct ddpd_error *err, struct spec *s, int idx, json_t *layer, const char *lp,
                            int depth)
{
    struct spec_layer *l = &s->layers[idx];
    char path[PATH_CAP], only[64];
    int t = 0;
    ddpd_err rc;
    if (!json_is_object(layer))
        return fail_type(err, lp, "a layer object such as {\"type\": \"relu\"}", layer);
    rc = get_enum(err, layer, lp, "type", type_names, COUNT(type_names), true, &t);
    if (rc != DDPD_OK)
        return rc;
    l->kind = type_kinds[t];
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
        /* PyTorch's own rule: "pad should be at most half of effective kernel size". */
        if (rc == DDPD_OK && (2 * l->padding[0] > l->kernel[0] || 2 * l->padding[1] > l->kernel[1])) {
            path_key(path, lp, "padding");
            return fail(err, path, "expected at most half the kernel [%lld,%lld], got [%lld,%lld]",
                        (long long)l->kernel[0], (long long)l->kernel[1], (long long)l->padding[0],
                        (long long)l->padding[1]);
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

static ddpd_err parse_model(struct ddpd_error *err, json_t *root, struct spec *s)
{
    json_t *model = json_object_get(root, "model");
    char lp[PATH_CAP], path[PATH_CAP];
    ddpd_err rc;
    if (!model)
        return fail(err, "model",
                    "missing (expected a list of layers such as "
                    "[{\"type\": \"linear\", \"in\": 10, \"out\": 1}])");
    s->n_layers = 0;
    if ((rc = parse_layer_list(err, s, model, "model", -1, 0)) != DDPD_OK)
        return rc;
    if ((rc = parse_input_shape(err, root, s)) != DDPD_OK)
        return rc;

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

static ddpd_err parse_loss(struct ddpd_error *err, json_t *root, struct spec *s)
{
    int k = 0;
    ddpd_err rc = get_enum(err, root, "", "loss", loss_names, COUNT(loss_names), true, &k);
    if (rc != DDPD_OK)
        return rc;
    s->loss = (loss_kind)k;
    if (s->loss != LOSS_CROSS_ENTROPY)
        return DDPD_OK; /* mse: any output shape */
    const struct spec_layer *o = spec_output_layer(s);
    char sh[128];
    shape_str(sh, sizeof sh, o->out_rank, o->out_shape);
    if (o->out_rank > 2)
        return fail(err, "loss",
                    "cross_entropy needs logits [C] or [T,C] per sample, the model's output is %s", sh);
    /* Cross entropy over one class is always zero: surely a mistake. */
    if (spec_classes(s) < 2) {
        int64_t ll = last_linear(s);
        if (o->out_rank == 1 && ll >= 0 && s->layers[ll].parent < 0 && s->layers[ll].out == spec_classes(s))
            return fail(err, "loss", "cross_entropy needs at least 2 outputs (model[%lld].out is %lld)",
                        (long long)ll, (long long)s->layers[ll].out);
        return fail(err, "loss", "cross_entropy needs at least 2 classes, the model's output is %s", sh);
    }
    return DDPD_OK;
}

static ddpd_err parse_optimizer_kind(struct ddpd_error *err, json_t *root, struct spec *s)
{
    struct spec_optim *o = &s->optim;
    const char *P = "optimizer";
    json_t *obj;
    int k = 0;
    ddpd_err rc = get_obj(err, root, "optimizer", true, "{\"type\": \"sgd\", \"lr\": 0.01}", &obj);
    if (rc == DDPD_OK)
        rc = get_enum(err, obj, P, "type", optim_names, COUNT(optim_names), true, &k);
    if (rc != DDPD_OK)
        return rc;
    o->kind = (optim_kind)k;
    if (o->kind == OPTIM_SGD) {
        o->lr = 0;
        o->momentum = o->dampening = o->weight_decay = 0;
        o->nesterov = false;
        rc = check_keys(err, obj, P, sgd_keys, COUNT(sgd_keys), NULL);
        if (rc == DDPD_OK)
            rc = get_num(err, obj, P, "lr", 0, true, INFINITY, false, "a positive number", true, &o->lr);
        if (rc == DDPD_OK)
            rc = get_num(err, obj, P, "momentum", 0, false, INFINITY, false, "a non-negative number", false,
                         &o->momentum);
        if (rc == DDPD_OK)
            rc = get_num(err, obj, P, "dampening", 0, false, INFINITY, false, "a non-negative number", false,
                         &o->dampening);
        if (rc == DDPD_OK)
            rc = get_num(err, obj, P, "weight_decay", 0, false, INFINITY, false, "a non-negative number",
                         false, &o->weight_decay);
        if (rc == DDPD_OK)
            rc = get_bool(err, obj, P, "nesterov", &o->nesterov);
        if (rc != DDPD_OK)
            return rc;
        /* PyTorch's own check, in its words. */
        if (o->nesterov && (o->momentum <= 0 || o->dampening != 0))
            return fail(err, "optimizer.nesterov",
                        "nesterov momentum requires a momentum and zero dampening");
        return DDPD_OK;
    }

    o->lr = 0.001;
    o->beta1 = 0.9;
    o->beta2 = 0.999;
    o->eps = 1e-8;
    o->weight_decay = 0.01;
    rc = check_keys(err, obj, P, adamw_keys, COUNT(adamw_keys), NULL);
    if (rc == DDPD_OK)
        rc = get_num(err, obj, P, "lr", 0, true, INFINITY, false, "a positive number", false, &o->lr);
    if (rc != DDPD_OK)
        return rc;
    json_t *betas = json_object_get(obj, "betas");
    if (betas) {
        if (!json_is_array(betas))
            return fail_type(err, "optimizer.betas", "a list of 2 numbers", betas);
        if (json_array_size(betas) != 2)
            return fail(err, "optimizer.betas", "expected a list of 2 numbers, got %zu",
                        json_array_size(betas));
        for (size_t i = 0; i < 2; i++) {
            char path[PATH_CAP];
            json_t *b = json_array_get(betas, i);
            double x;
            path_index(path, "optimizer.betas", i);
            if (!json_is_number(b) || !isfinite(x = json_number_value(b)) || x < 0 || x >= 1)
                return fail_type(err, path, "a number in [0, 1)", b);
            *(i ? &o->beta2 : &o->beta1) = x;
        }
    }
    rc = get_num(err, obj, P, "eps", 0, true, INFINITY, false, "a positive number", false, &o->eps);
    if (rc == DDPD_OK)
        rc = get_num(err, obj, P, "weight_decay", 0, false, INFINITY, false, "a non-negative number", false,
                     &o->weight_decay);
    return rc;
}

/* optimizer.schedule (§2a); warmup_steps < total_steps is checked once `steps` is known
 * (check_schedule). */
static ddpd_err parse_optimizer(struct ddpd_error *err, json_t *root, struct spec *s)
{
    struct spec_optim *o = &s->optim;
    const char *P = "optimizer.schedule";
    int k = 0;
    ddpd_err rc = parse_optimizer_kind(err, root, s);
    if (rc != DDPD_OK)
        return rc;
    json_t *obj = json_object_get(json_object_get(root, "optimizer"), "schedule");
    if (!obj)
        return DDPD_OK;
    if (!json_is_object(obj))
        return fail_type(err, P, "an object such as {\"type\": \"cosine\", \"warmup_steps\": 100}", obj);
    rc = check_keys(err, obj, P, schedule_keys, COUNT(schedule_keys), NULL);
    if (rc == DDPD_OK)
        rc = get_enum(err, obj, P, "type", sched_names, COUNT(sched_names), true, &k);
    o->schedule = (sched_kind)k;
    if (rc == DDPD_OK)
        rc = get_int(err, obj, P, "warmup_steps", 0, INT64_MAX, false, &o->warmup_steps);
    if (rc == DDPD_OK)
        rc = get_num(err, obj, P, "min_lr", 0, false, INFINITY, false, "a non-negative number", false,
                     &o->min_lr);
    if (rc == DDPD_OK && o->min_lr > o->lr) {
        char lr[40];
        fmt_real(lr, sizeof lr, o->lr);
        json_t *v = json_object_get(obj, "min_lr");
        char want[80], d[200];
        snprintf(want, sizeof want, "a number from 0 to optimizer.lr (%s)", lr);
        return fail(err, "optimizer.schedule.min_lr", "expected %s, got %s", want, describe(v, d, sizeof d));
    }
    if (rc == DDPD_OK)
        rc = get_int(err, obj, P, "total_steps", 1, INT64_MAX, false, &o->total_steps);
    return rc;
}

/* warmup_steps < total_steps when both are known: the schedule divides by their
 * difference after the warmup. */
static ddpd_err check_schedule(struct ddpd_error *err, const struct spec *s)
{
    const struct spec_optim *o = &s->optim;
    if (o->warmup_steps == 0)
        return DDPD_OK;
    if (o->total_steps > 0 && o->warmup_steps >= o->total_steps)
        return fail(err, "optimizer.schedule.warmup_steps",
                    "expected fewer than total_steps (%lld), got %lld", (long long)o->total_steps,
                    (long long)o->warmup_steps);
    if (o->total_steps == 0 && s->steps > 0 && o->warmup_steps >= s->steps)
        return fail(err, "optimizer.schedule.warmup_steps",
                    "expected fewer than the job's steps (%lld: total_steps defaults to them), got %lld",
                    (long long)s->steps, (long long)o->warmup_steps);
    return DDPD_OK;
}

static ddpd_err parse_targets(struct ddpd_error *err, json_t *data, const char *P, struct spec *s,
                              struct spec_data *d)
{
    json_t *t = json_object_get(data, "target");
    char tp[PATH_CAP];
    ddpd_err rc;
    path_key(tp, P, "target");
    if (!t)
        return missing(err, tp, "a column name or a list of column names");
    if (json_is_string(t)) {
        rc = get_str_value(err, t, tp, d->targets[0], sizeof d->targets[0]);
        if (rc != DDPD_OK)
            return rc;
        if (!d->targets[0][0])
            return fail(err, tp, "expected a column name, got an empty string");
        d->n_targets = 1;
    } else if (json_is_array(t)) {
        size_t n = json_array_size(t);
        if (n == 0)
            return fail(err, tp, "expected at least one column name, got an empty list");
        if (n > SPEC_MAX_TARGETS)
            return fail(err, tp, "at most %d target columns, got %zu", SPEC_MAX_TARGETS, n);
        for (size_t i = 0; i < n; i++) {
            char path[PATH_CAP];
            path_index(path, tp, i);
            rc = get_str_value(err, json_array_get(t, i), path, d->targets[i], sizeof d->targets[i]);
            if (rc != DDPD_OK)
                return rc;
            if (!d->targets[i][0])
                return fail(err, path, "expected a column name, got an empty string");
            for (size_t j = 0; j < i; j++)
                if (strcmp(d->targets[i], d->targets[j]) == 0)
                    return fail(err, path, "column \"%s\" is already %s[%zu]", d->targets[i], tp, j);
        }
        d->n_targets = (int)n;
    } else {
        return fail_type(err, tp, "a column name or a list of column names", t);
    }

    /* The targets' shape is known here, so check it against the loss (CONTRACT.md §2:
     * mse wants [N,out], cross_entropy wants class ids [N]). */
    int64_t out = spec_out_width(s);
    if (s->loss == LOSS_CROSS_ENTROPY && d->n_targets != 1)
        return fail(err, tp, "cross_entropy needs exactly one target column (the class id), got %d",
                    d->n_targets);
    if (s->loss == LOSS_MSE && d->n_targets != out)
        return fail(err, tp, "mse needs %lld target columns (model[%lld].out), got %d", (long long)out,
                    (long long)last_linear(s), d->n_targets);
    return DDPD_OK;
}

/* tokens data (§2a): ids for a model that starts with embedding, samples [block_size]
 * = input_shape, next-token targets [T] for cross_entropy on logits [T,C]. */
static ddpd_err check_tokens(struct ddpd_error *err, const char *P, const struct spec *s,
                             const struct spec_data *d)
{
    char path[PATH_CAP], sh[128];
    const struct spec_layer *o = spec_output_layer(s);
    path_key(path, P, "type");
    if (s->layers[0].kind != LAYER_EMBEDDING)
        return fail(err, path,
                    "tokens data holds integer ids: the model must start with embedding (model[0] is %s)",
                    layer_kind_name(s->layers[0].kind));
    shape_str(sh, sizeof sh, s->input_rank, s->input_shape);
    if (s->input_rank != 1 || s->input_shape[0] != d->block_size) {
        path_key(path, P, "block_size");
        return fail(err, path,
                    "expected input_shape [%lld] for samples of block_size %lld, got input_shape %s",
                    (long long)d->block_size, (long long)d->block_size, sh);
    }
    if (s->loss != LOSS_CROSS_ENTROPY || o->out_rank != 2 || o->out_shape[0] != d->block_size) {
        shape_str(sh, sizeof sh, o->out_rank, o->out_shape);
        return fail(err, path,
                    "tokens data gives each sample [%lld] next-token targets: it needs loss cross_entropy on "
                    "logits [%lld,C] (the loss is %s, the model's output %s)",
                    (long long)d->block_size, (long long)d->block_size, loss_kind_name(s->loss), sh);
    }
    return DDPD_OK;
}

/* A data object at P ("data" or "eval.data"), into d. */
static ddpd_err parse_data_obj(struct ddpd_error *err, json_t *obj, const char *P, struct spec *s,
                               struct spec_data *d)
{
    char path[PATH_CAP];
    int k = 0;
    int64_t seed = 0;
    ddpd_err rc = get_enum(err, obj, P, "type", data_names, COUNT(data_names), true, &k);
    if (rc != DDPD_OK)
        return rc;
    d->kind = (data_kind)k;
    d->shuffle = true;
    d->drop_last = false;
    /* Synthetic data comes from a teacher MLP, and a CSV row is a vector: both feed
     * models of linear layers and activations alone. */
    const int odd = first_non_mlp(s);
    if ((d->kind == DATA_SYNTHETIC || d->kind == DATA_CSV) && odd >= 0) {
        char lp[PATH_CAP];
        layer_path(lp, s, odd);
        path_key(path, P, "type");
        return fail(err, path,
                    "%s data feeds only models of linear layers and activations (%s is %s); use npy%s data",
                    data_names[k], lp, layer_kind_name(s->layers[odd].kind),
                    spec_input_ids(s) ? " or tokens" : "");
    }
    switch (d->kind) {
    case DATA_TOKENS:
        rc = check_keys(err, obj, P, tokens_keys, COUNT(tokens_keys), NULL);
        if (rc == DDPD_OK)
            rc = get_path(err, obj, P, "path", true, d->path);
        if (rc == DDPD_OK)
            rc = get_int(err, obj, P, "block_size", 1, SPEC_MAX_T, true, &d->block_size);
        if (rc == DDPD_OK) {
            int dt = 0;
            rc = get_enum(err, obj, P, "dtype", dtype_names, COUNT(dtype_names), false, &dt);
            d->dtype = (tokens_dtype)dt;
        }
        if (rc == DDPD_OK)
            rc = check_tokens(err, P, s, d);
        break;
    case DATA_SYNTHETIC:
        rc = check_keys(err, obj, P, synthetic_keys, COUNT(synthetic_keys), NULL);
        if (rc == DDPD_OK)
            rc = get_int(err, obj, P, "samples", 1, INT64_MAX, true, &d->samples);
        if (rc == DDPD_OK) { /* the teacher's cap, found here rather than by every rank */
            int64_t weights = 0;
            for (int i = 0; i < s->n_layers; i++)
                if (s->layers[i].kind == LAYER_LINEAR)
                    weights += s->layers[i].in * s->layers[i].out; /* <= 64 * 2^40: no overflow */
            path_key(path, P, "type");
            if (weights > SPEC_MAX_SYNTHETIC_WEIGHTS)
                rc =
                    fail(err, path,
                         "synthetic data is drawn from a teacher of the model's shape, at most %lld weights; "
                         "the model has %lld (use npy or csv data)",
                         SPEC_MAX_SYNTHETIC_WEIGHTS, (long long)weights);
        }
        break;
    case DATA_NPY: {
        char xp[PATH_CAP], yp[PATH_CAP];
        path_key(xp, P, "x");
        path_key(yp, P, "y");
        rc = check_keys(err, obj, P, npy_keys, COUNT(npy_keys), NULL);
        if (rc == DDPD_OK)
            rc = get_path(err, obj, P, "x", true, d->x);
        if (rc == DDPD_OK)
            rc = get_path(err, obj, P, "y", true, d->y);
        /* A {rank} x is one rank's file, so its y must be one too (and the other way round):
         * found here, not by every rank after the job was accepted. */
        if (rc == DDPD_OK && !strstr(d->x, "{rank}") != !strstr(d->y, "{rank}"))
            rc = fail(err, strstr(d->x, "{rank}") ? yp : xp,
                      "x and y must both hold {rank} (one file per rank) or neither (got x \"%.100s\", "
                      "y \"%.100s\")",
                      d->x, d->y);
        break;
    }
    case DATA_CSV:
        rc = check_keys(err, obj, P, csv_keys, COUNT(csv_keys), NULL);
        if (rc == DDPD_OK)
            rc = get_path(err, obj, P, "path", true, d->path);
        if (rc == DDPD_OK)
            rc = parse_targets(err, obj, P, s, d);
        break;
    }
    if (rc == DDPD_OK)
        rc = get_int(err, obj, P, "seed", 0, INT64_MAX, false, &seed);
    if (rc == DDPD_OK)
        rc = get_bool(err, obj, P, "shuffle", &d->shuffle);
    if (rc == DDPD_OK)
        rc = get_bool(err, obj, P, "drop_last", &d->drop_last);
    d->seed = (uint64_t)seed;
    return rc;
}

static ddpd_err parse_data(struct ddpd_error *err, json_t *root, struct spec *s)
{
    json_t *obj;
    ddpd_err rc = get_obj(err, root, "data", true, "{\"type\": \"synthetic\", \"samples\": 1000}", &obj);
    if (rc != DDPD_OK)
        return rc;
    return parse_data_obj(err, obj, "data", s, &s->data);
}

/* eval (§2a): a data object evaluated every every_steps optimizer steps, never shuffled. */
static ddpd_err parse_eval(struct ddpd_error *err, json_t *root, struct spec *s)
{
    struct spec_eval *e = &s->eval;
    const char *P = "eval";
    json_t *obj;
    ddpd_err rc = get_obj(err, root, "eval", false, "", &obj);
    if (rc != DDPD_OK || !obj)
        return rc;
    rc = check_keys(err, obj, P, eval_keys, COUNT(eval_keys), NULL);
    if (rc != DDPD_OK)
        return rc;
    json_t *data = json_object_get(obj, "data");
    if (!data)
        return fail(
            err, "eval.data",
            "missing (expected a data object such as {\"type\": \"npy\", \"x\": \"val_x.npy\", \"y\": "
            "\"val_y.npy\"})");
    if (!json_is_object(data))
        return fail_type(err, "eval.data", "a data object", data);
    if ((rc = parse_data_obj(err, data, "eval.data", s, &e->data)) != DDPD_OK)
        return rc;
    /* Eval data is never shuffled (§2a): false by default, and true is refused. */
    json_t *shuffle = json_object_get(data, "shuffle");
    if (json_is_true(shuffle))
        return fail(err, "eval.data.shuffle", "expected false (eval data is never shuffled), got true");
    e->data.shuffle = false;
    rc = get_int(err, obj, P, "every_steps", 1, INT64_MAX, true, &e->every_steps);
    if (rc == DDPD_OK)
        rc = get_int(err, obj, P, "max_batches", 1, INT64_MAX, false, &e->max_batches);
    return rc;
}

static ddpd_err parse_ddp(struct ddpd_error *err, json_t *root, struct spec *s)
{
    struct spec_ddp *d = &s->ddp;
    const char *P = "ddp";
    json_t *obj;
    int backend = -1;
    d->bucket_cap_mb = 25;
    d->join = JOIN_AUTO;
    d->divide_by_initial_world_size = true;
    d->timeout_s = 300;
    ddpd_err rc = get_obj(err, root, "ddp", false, "", &obj);
    if (rc != DDPD_OK)
        return rc;
    if (obj) {
        rc = check_keys(err, obj, P, ddp_keys, COUNT(ddp_keys), NULL);
        if (rc == DDPD_OK)
            rc = get_num(err, obj, P, "bucket_cap_mb", 0, true, 1024, false,
                         "a number greater than 0 and at most 1024", false, &d->bucket_cap_mb);
        if (rc != DDPD_OK)
            return rc;
        json_t *join = json_object_get(obj, "join");
        if (join) {
            if (json_is_boolean(join))
                d->join = json_is_true(join) ? JOIN_TRUE : JOIN_FALSE;
            else if (json_is_string(join) && strcmp(json_string_value(join), "auto") == 0 &&
                     json_string_length(join) == 4)
                d->join = JOIN_AUTO;
            else
                return fail_type(err, "ddp.join", "true, false or \"auto\"", join);
        }
        rc = get_bool(err, obj, P, "divide_by_initial_world_size", &d->divide_by_initial_world_size);
        if (rc == DDPD_OK)
            rc = get_enum(err, obj, P, "backend", backend_names, COUNT(backend_names), false, &backend);
        if (rc == DDPD_OK)
            rc = get_num(err, obj, P, "timeout_s", 0, true, 86400, false,
                         "a number of seconds greater than 0 and at most 86400", false, &d->timeout_s);
        if (rc != DDPD_OK)
            return rc;
    }
    if (backend >= 0) {
        d->backend = (comm_backend)backend;
        d->backend_set = true;
        /* cpu with cuda is fine (host-staged); NCCL has no CPU tensors. */
        if (d->backend == BACKEND_NCCL && s->device == DEVICE_CPU)
            return fail(err, "ddp.backend", "nccl needs device \"cuda\" (device is \"cpu\")");
    } else {
        d->backend = s->device == DEVICE_CUDA ? BACKEND_NCCL : BACKEND_CPU;
    }
    return DDPD_OK;
}

static ddpd_err parse_init(struct ddpd_error *err, json_t *root, struct spec *s)
{
    json_t *obj;
    int64_t seed = 0;
    ddpd_err rc = get_obj(err, root, "init", false, "", &obj);
    if (rc != DDPD_OK || !obj)
        return rc;
    rc = check_keys(err, obj, "init", init_keys, COUNT(init_keys), NULL);
    if (rc != DDPD_OK)
        return rc;
    bool has_seed = json_object_get(obj, "seed") != NULL;
    bool has_from = json_object_get(obj, "from") != NULL;
    bool has_job = json_object_get(obj, "from_job") != NULL;
    if (has_seed + has_from + has_job > 1)
        return fail(err, has_job ? "init.from_job" : "init.from",
                    "give one of seed, from and from_job, not %s",
                    has_seed + has_from + has_job == 3 ? "all three" : "two");
    if (!has_seed && !has_from && !has_job)
        return fail(err, "init.seed", "missing (give one of seed, from and from_job)");
    if (json_object_get(obj, "step") && !has_job)
        return fail(err, "init.step", "a checkpoint's step goes with from_job only");
    if (has_from)
        return get_path(err, obj, "init", "from", true, s->init_from);
    if (has_job) {
        /* Another job of the same server: the server finds its weights (the final model or
         * the newest checkpoint, or the checkpoint at init.step) in its own jobs folder. */
        s->init_from_step = -1;
        if ((rc = get_int(err, obj, "init", "from_job", 1, INT64_MAX, true, &s->init_from_job)))
            return rc;
        return json_object_get(obj, "step")
                   ? get_int(err, obj, "init", "step", 0, INT64_MAX, true, &s->init_from_step)
                   : DDPD_OK;
    }
    rc = get_int(err, obj, "init", "seed", 0, INT64_MAX, true, &seed);
    s->init_seed = (uint64_t)seed;
    return rc;
}

static ddpd_err parse_spec(json_t *root, const struct spec_parse_opts *opts, struct spec *s,
                           struct ddpd_error *err)
{
    json_t *obj;
    int k = 0;
    ddpd_err rc;

    s->world_size = 1;
    s->device = opts ? opts->default_device : DEVICE_CPU;
    s->grad_accum = 1;
    s->log_every = 1;
    s->checkpoint_keep_last = 3;

    rc = check_keys(err, root, "", top_keys, COUNT(top_keys), NULL);
    if (rc != DDPD_OK)
        return rc;
    json_t *name = json_object_get(root, "name");
    if (name && (rc = get_str_value(err, name, "name", s->name, sizeof s->name)) != DDPD_OK)
        return rc;
    if ((rc = get_int32(err, root, "", "world_size", 1, SPEC_MAX_WORLD, &s->world_size)))
        return rc;
    if (json_object_get(root, "device")) {
        if ((rc = get_enum(err, root, "", "device", device_names, COUNT(device_names), true, &k)))
            return rc;
        s->device = (device_kind)k;
        s->device_set = true;
    }
    if (json_object_get(root, "precision")) {
        if ((rc = get_enum(err, root, "", "precision", precision_names, COUNT(precision_names), true, &k)))
            return rc;
        s->precision = (precision_kind)k;
        /* TF32 is a GPU tensor-core format; the CPU backend has no such mode. */
        if (s->precision == PRECISION_TF32 && s->device != DEVICE_CUDA)
            return fail(err, "precision", "tf32 needs device \"cuda\" (device is \"cpu\")");
    }
    if ((rc = parse_model(err, root, s)) || (rc = parse_loss(err, root, s)) ||
        (rc = parse_optimizer(err, root, s)) || (rc = parse_data(err, root, s)) ||
        (rc = parse_eval(err, root, s)))
        return rc;
    if ((rc = get_int(err, root, "", "batch_size", 1, INT64_MAX, true, &s->batch_size)))
        return rc;
    bool has_epochs = json_object_get(root, "epochs") != NULL;
    bool has_steps = json_object_get(root, "steps") != NULL;
    if (has_epochs && has_steps)
        return fail(err, "steps", "give either epochs or steps, not both");
    if (!has_epochs && !has_steps)
        return fail(err, "epochs", "missing (give either epochs or steps)");
    if ((rc = get_int(err, root, "", "epochs", 1, INT64_MAX, false, &s->epochs)) ||
        (rc = get_int(err, root, "", "steps", 1, INT64_MAX, false, &s->steps)) ||
        (rc = get_int(err, root, "", "grad_accum", 1, INT64_MAX, false, &s->grad_accum)) ||
        (rc = check_schedule(err, s)) ||
        (rc = get_num(err, root, "", "grad_clip", 0, true, INFINITY, false, "a positive number", false,
                      &s->grad_clip)))
        return rc;
    if ((rc = parse_ddp(err, root, s)) || (rc = parse_init(err, root, s)))
        return rc;
    if ((rc = get_obj(err, root, "checkpoint", false, "", &obj)))
        return rc;
    if (obj &&
        ((rc = check_keys(err, obj, "checkpoint", checkpoint_keys, COUNT(checkpoint_keys), NULL)) ||
         (rc = get_int(err, obj, "checkpoint", "every_steps", 0, INT64_MAX, false, &s->checkpoint_every)) ||
         (rc = get_int(err, obj, "checkpoint", "keep_last", 1, INT64_MAX, false, &s->checkpoint_keep_last))))
        return rc;
    if ((rc = get_int(err, root, "", "log_every", 1, INT64_MAX, false, &s->log_every)) ||
        (rc = get_int32(err, root, "", "max_restarts", 0, 100, &s->max_restarts)))
        return rc;
    if (json_object_get(root, "on_nonfinite")) {
        if ((rc = get_enum(err, root, "", "on_nonfinite", nonfinite_names, COUNT(nonfinite_names), true, &k)))
            return rc;
        s->on_nonfinite = (nonfinite_mode)k;
    }
    return DDPD_OK;
}

ddpd_err spec_from_json(struct json_t *obj, const struct spec_parse_opts *opts, struct spec *out,
                        struct ddpd_error *err)
{
    char d[200];
    memset(out, 0, sizeof *out);
    ddpd_error_clear(err);
    if (!obj)
        return fail(err, "", "expected a JSON object, got nothing");
    if (!json_is_object(obj))
        return fail(err, "", "expected a JSON object at the top level, got %s", describe(obj, d, sizeof d));
    return parse_spec(obj, opts, out, err);
}

/* jansson reports a duplicate key without naming it when the key is long; the key is the
 * string that ends just before the error position, so find its opening quote (the first
 * one before it that is not escaped) and decode it. */
static void duplicate_key_text(const char *text, size_t len, size_t pos, char *dst, size_t cap)
{
    snprintf(dst, cap, "duplicate key");
    if (pos < 2 || pos > len || text[pos - 1] != '"')
        return;
    for (size_t i = pos - 1; i-- > 0;) {
        size_t bs = 0;
        if (text[i] != '"')
            continue;
        while (bs < i && text[i - 1 - bs] == '\\')
            bs++;
        if (bs % 2)
            continue;
        json_t *key = json_loadb(text + i, pos - i, JSON_DECODE_ANY, NULL);
        if (json_is_string(key)) {
            char q[160];
            quote_into(q, sizeof q, json_string_value(key), json_string_length(key), 64);
            snprintf(dst, cap, "duplicate key \"%s\"", q);
        }
        json_decref(key);
        return;
    }
}

ddpd_err spec_parse(const char *text, size_t len, const struct spec_parse_opts *opts, struct spec *out,
                    struct ddpd_error *err)
{
    json_error_t jerr;
    json_t *root = NULL;
    ddpd_err rc;

    memset(out, 0, sizeof *out);
    ddpd_error_clear(err);
    if (len > SPEC_MAX_BODY) {
        rc = ddpd_error_set(err, DDPD_ETOOBIG, "", "the spec is %zu bytes; the limit is %d bytes (1 MiB)",
                            len, SPEC_MAX_BODY);
        goto out;
    }
    root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        /* jansson does not always say that it ran out of memory: it may report an empty
         * message, or a syntax error where an allocation failed. A genuine syntax error
         * comes back the same from a second parse; anything else was memory. */
        json_error_t again;
        root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &again);
        if (!root && (json_error_code(&jerr) == json_error_out_of_memory || !jerr.text[0] ||
                      again.position != jerr.position || strcmp(again.text, jerr.text) != 0)) {
            rc = ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory reading the spec");
            goto out;
        }
    }
    if (!root) {
        char what[200];
        if (json_error_code(&jerr) == json_error_duplicate_key)
            duplicate_key_text(text, len, (size_t)jerr.position, what, sizeof what);
        else
            snprintf(what, sizeof what, "%s", jerr.text);
        int line = jerr.line > 0 ? jerr.line : 1, column = jerr.column > 0 ? jerr.column : 1;
        rc = ddpd_error_set(err, DDPD_EJSON, "", "malformed JSON at line %d, column %d: %s", line, column,
                            what);
        if (err) {
            err->line = line;
            err->column = column;
        }
        goto out;
    }
    rc = spec_from_json(root, opts, out, err);
out:
    json_decref(root);
    return rc;
}

/* ---- printing ---- */

static json_t *optim_to_json(const struct spec_optim *o)
{
    json_t *j, *sched = json_pack("{s:s, s:I, s:f}", "type", sched_names[o->schedule], "warmup_steps",
                                  (json_int_t)o->warmup_steps, "min_lr", o->min_lr);
    if (sched && o->total_steps > 0 &&
        json_object_set_new(sched, "total_steps", json_integer(o->total_steps)))
        goto fail;
    if (!sched)
        return NULL;
    if (o->kind == OPTIM_SGD)
        j = json_pack("{s:s, s:f, s:f, s:f, s:f, s:b}", "type", "sgd", "lr", o->lr, "momentum", o->momentum,
                      "dampening", o->dampening, "weight_decay", o->weight_decay, "nesterov", o->nesterov);
    else
        j = json_pack("{s:s, s:f, s:[f, f], s:f, s:f}", "type", "adamw", "lr", o->lr, "betas", o->beta1,
                      o->beta2, "eps", o->eps, "weight_decay", o->weight_decay);
    if (!j)
        goto fail;
    if (json_object_set_new(j, "schedule", sched) == 0) /* steals sched, even when it fails */
        return j;
    json_decref(j);
    return NULL;
fail:
    json_decref(sched);
    return NULL;
}

/* Sets o[key] = v (stolen); clears *ok when an allocation failed (v or the member), so
 * that an object missing a member is never taken for a whole spec. */
static void put(json_t *o, const char *key, json_t *v, bool *ok)
{
    if (!v || json_object_set_new(o, key, v) != 0)
        *ok = false;
}

static json_t *data_to_json(const struct spec_data *d, bool *ok)
{
    json_t *j = json_pack("{s:s}", "type", data_names[d->kind]);
    if (!j) {
        *ok = false;
        return NULL;
    }
    switch (d->kind) {
    case DATA_SYNTHETIC: put(j, "samples", json_integer(d->samples), ok); break;
    case DATA_TOKENS:
        put(j, "path", json_string(d->path), ok);
        put(j, "block_size", json_integer(d->block_size), ok);
        put(j, "dtype", json_string(dtype_names[d->dtype]), ok);
        break;
    case DATA_NPY:
        put(j, "x", json_string(d->x), ok);
        put(j, "y", json_string(d->y), ok);
        break;
    case DATA_CSV:
        put(j, "path", json_string(d->path), ok);
        if (d->n_targets == 1) {
            put(j, "target", json_string(d->targets[0]), ok);
        } else {
            json_t *t = json_array();
            for (int i = 0; t && i < d->n_targets; i++)
                if (json_array_append_new(t, json_string(d->targets[i])) != 0)
                    *ok = false;
            put(j, "target", t, ok);
        }
        break;
    }
    put(j, "seed", json_integer((json_int_t)d->seed), ok);
    put(j, "shuffle", json_boolean(d->shuffle), ok);
    put(j, "drop_last", json_boolean(d->drop_last), ok);
    return j;
}

/* [kh, kw] */
static json_t *pair_json(const int64_t v[2])
{
    return json_pack("[I, I]", (json_int_t)v[0], (json_int_t)v[1]);
}

/* The top-level layers from `from` to `to` (and, inside residuals, theirs), every key
 * written out. */
static json_t *layers_to_json(const struct spec *s, int from, int to, bool *ok)
{
    json_t *list = json_array();
    if (!list) {
        *ok = false;
        return NULL;
    }
    for (int i = from; i<to; i = s->layers[i].end> i ? s->layers[i].end : i + 1) {
        const struct spec_layer *l = &s->layers[i];
        json_t *lj = NULL;
        switch (l->kind) {
        case LAYER_LINEAR:
            lj = json_pack("{s:s, s:I, s:I, s:b}", "type", "linear", "in", (json_int_t)l->in, "out",
                           (json_int_t)l->out, "bias", l->bias);
            break;
        case LAYER_RELU:
        case LAYER_TANH:
        case LAYER_SIGMOID:
        case LAYER_FLATTEN: lj = json_pack("{s:s}", "type", layer_kind_name(l->kind)); break;
        case LAYER_GELU:
        case LAYER_GELU_TANH:
            lj = json_pack("{s:s, s:s}", "type", "gelu", "approximate",
                           l->kind == LAYER_GELU_TANH ? "tanh" : "none");
            break;
        case LAYER_EMBEDDING:
            lj = json_pack("{s:s, s:I, s:I}", "type", "embedding", "num", (json_int_t)l->num, "dim",
                           (json_int_t)l->dim);
            break;
        case LAYER_POSITION:
            lj = json_pack("{s:s, s:I, s:I}", "type", "position", "max", (json_int_t)l->num, "dim",
                           (json_int_t)l->dim);
            break;
        case LAYER_LAYERNORM:
            lj = json_pack("{s:s, s:I, s:f, s:b}", "type", "layernorm", "dim", (json_int_t)l->dim, "eps",
                           l->eps, "bias", l->bias);
            break;
        case LAYER_ATTENTION:
            lj = json_pack("{s:s, s:I, s:I, s:b, s:b}", "type", "attention", "dim", (json_int_t)l->dim,
                           "heads", (json_int_t)l->heads, "causal", l->causal, "bias", l->bias);
            break;
        case LAYER_RESIDUAL: {
            json_t *inner = layers_to_json(s, i + 1, l->end, ok);
            lj = inner ? json_pack("{s:s, s:o}", "type", "residual", "layers", inner) : NULL;
            break;
        }
        case LAYER_DROPOUT: lj = json_pack("{s:s, s:f}", "type", "dropout", "p", l->p); break;
        case LAYER_CONV2D:
            lj = json_pack("{s:s, s:I, s:I, s:o, s:o, s:o, s:b}", "type", "conv2d", "in", (json_int_t)l->in,
                           "out", (json_int_t)l->out, "kernel", pair_json(l->kernel), "stride",
                           pair_json(l->stride), "padding", pair_json(l->padding), "bias", l->bias);
            break;
        case LAYER_MAXPOOL2D:
        case LAYER_AVGPOOL2D:
            lj = json_pack("{s:s, s:o, s:o, s:o}", "type", layer_kind_name(l->kind), "kernel",
                           pair_json(l->kernel), "stride", pair_json(l->stride), "padding",
                           pair_json(l->padding));
            break;
        case LAYER_BATCHNORM:
            lj = json_pack("{s:s, s:I, s:f, s:f}", "type", "batchnorm", "features", (json_int_t)l->dim, "eps",
                           l->eps, "momentum", l->momentum);
            break;
        }
        if (!lj || json_array_append_new(list, lj) != 0)
            *ok = false;
    }
    return list;
}

struct json_t *spec_to_json(const struct spec *s)
{
    bool ok = true;
    json_t *j = json_object(), *model = layers_to_json(s, 0, s->n_layers, &ok);
    if (!j || !model) {
        json_decref(j);
        json_decref(model);
        return NULL;
    }
    put(j, "name", json_string(s->name), &ok);
    put(j, "world_size", json_integer(s->world_size), &ok);
    put(j, "device", json_string(device_kind_name(s->device)), &ok);
    put(j, "precision", json_string(precision_names[s->precision]), &ok);
    put(j, "model", model, &ok);
    if (s->input_shape_set) {
        json_t *shape = json_array();
        for (int i = 0; shape && i < s->input_rank; i++)
            if (json_array_append_new(shape, json_integer(s->input_shape[i])) != 0)
                ok = false;
        put(j, "input_shape", shape, &ok);
    }
    put(j, "loss", json_string(loss_kind_name(s->loss)), &ok);
    put(j, "optimizer", optim_to_json(&s->optim), &ok);
    put(j, "data", data_to_json(&s->data, &ok), &ok);
    if (s->eval.every_steps > 0) {
        json_t *ev = json_pack("{s:o, s:I}", "data", data_to_json(&s->eval.data, &ok), "every_steps",
                               (json_int_t)s->eval.every_steps);
        if (ev && s->eval.max_batches > 0)
            put(ev, "max_batches", json_integer(s->eval.max_batches), &ok);
        put(j, "eval", ev, &ok);
    }
    put(j, "batch_size", json_integer(s->batch_size), &ok);
    if (s->steps > 0)
        put(j, "steps", json_integer(s->steps), &ok);
    else
        put(j, "epochs", json_integer(s->epochs), &ok);
    put(j, "grad_accum", json_integer(s->grad_accum), &ok);
    if (s->grad_clip > 0)
        put(j, "grad_clip", json_real(s->grad_clip), &ok);
    json_t *join = s->ddp.join == JOIN_AUTO ? json_string("auto") : json_boolean(s->ddp.join == JOIN_TRUE);
    if (!join)
        ok = false;
    put(j, "ddp",
        join ? json_pack("{s:f, s:o, s:b, s:s, s:f}", "bucket_cap_mb", s->ddp.bucket_cap_mb, "join", join,
                         "divide_by_initial_world_size", s->ddp.divide_by_initial_world_size, "backend",
                         backend_names[s->ddp.backend], "timeout_s", s->ddp.timeout_s)
             : NULL,
        &ok);
    if (s->init_from[0])
        put(j, "init", json_pack("{s:s}", "from", s->init_from), &ok);
    else if (s->init_from_job > 0 && s->init_from_step >= 0)
        put(j, "init",
            json_pack("{s:I, s:I}", "from_job", (json_int_t)s->init_from_job, "step",
                      (json_int_t)s->init_from_step),
            &ok);
    else if (s->init_from_job > 0)
        put(j, "init", json_pack("{s:I}", "from_job", (json_int_t)s->init_from_job), &ok);
    else
        put(j, "init", json_pack("{s:I}", "seed", (json_int_t)s->init_seed), &ok);
    put(j, "checkpoint",
        json_pack("{s:I, s:I}", "every_steps", (json_int_t)s->checkpoint_every, "keep_last",
                  (json_int_t)s->checkpoint_keep_last),
        &ok);
    put(j, "log_every", json_integer(s->log_every), &ok);
    put(j, "max_restarts", json_integer(s->max_restarts), &ok);
    put(j, "on_nonfinite", json_string(nonfinite_names[s->on_nonfinite]), &ok);
    if (!ok) {
        json_decref(j);
        return NULL;
    }
    return j;
}

/* json_dump_callback's sink for spec_dumps: a growing buffer that remembers a failure
 * (jansson ignores the callback's answer for object keys). */
struct dump_buf {
    char *p;
    size_t len, cap;
    bool failed;
};

static int dump_append(const char *b, size_t n, void *arg)
{
    struct dump_buf *d = arg;
    if (d->failed)
        return -1;
    if (d->len + n + 1 > d->cap) {
        size_t cap = d->cap ? d->cap : 1024;
        while (cap < d->len + n + 1)
            cap *= 2;
        char *p = realloc(d->p, cap);
        if (!p) {
            d->failed = true;
            return -1;
        }
        d->p = p;
        d->cap = cap;
    }
    memcpy(d->p + d->len, b, n);
    d->len += n;
    d->p[d->len] = '\0';
    return 0;
}

char *spec_dumps(const struct spec *s)
{
    json_t *j = spec_to_json(s);
    struct dump_buf d = {0};
    if (!j || json_dump_callback(j, dump_append, &d, JSON_COMPACT) != 0 || d.failed || !d.p) {
        free(d.p);
        d.p = NULL;
    }
    json_decref(j);
    return d.p;
}

/* ---- questions about a parsed spec ---- */

/* Saturating arithmetic for sizes: a size that would not fit in int64_t is INT64_MAX,
 * which no limit admits, instead of a wrapped small number. Arguments are >= 0. */
static int64_t sat_mul(int64_t a, int64_t b)
{
    int64_t r;
    return __builtin_mul_overflow(a, b, &r) ? INT64_MAX : r;
}

static int64_t sat_add(int64_t a, int64_t b)
{
    int64_t r;
    return __builtin_add_overflow(a, b, &r) ? INT64_MAX : r;
}

/* Parameters of one layer (weights and biases; batchnorm's running statistics are
 * buffers, not parameters). */
static int64_t layer_params(const struct spec_layer *l)
{
    switch (l->kind) {
    case LAYER_LINEAR: return sat_add(sat_mul(l->in, l->out), l->bias ? l->out : 0);
    case LAYER_EMBEDDING:
    case LAYER_POSITION: return sat_mul(l->num, l->dim);
    case LAYER_LAYERNORM: return l->bias ? sat_mul(2, l->dim) : l->dim;
    case LAYER_ATTENTION: /* qkv [3·dim, dim] and proj [dim, dim], and their biases */
        return sat_add(sat_mul(4, sat_mul(l->dim, l->dim)), l->bias ? sat_mul(4, l->dim) : 0);
    case LAYER_CONV2D:
        return sat_add(sat_mul(sat_mul(l->out, l->in), sat_mul(l->kernel[0], l->kernel[1])),
                       l->bias ? l->out : 0);
    case LAYER_BATCHNORM: return sat_mul(2, l->dim);
    default: return 0;
    }
}

int64_t spec_param_count(const struct spec *s)
{
    int64_t n = 0;
    for (int i = 0; i < s->n_layers; i++)
        n = sat_add(n, layer_params(&s->layers[i]));
    return n;
}

int64_t spec_batch_rows(const struct spec *s, int64_t shard_rows)
{
    int64_t r = s->batch_size < shard_rows ? s->batch_size : shard_rows;
    return r > 0 ? r : 1;
}

/* Elements of a layer's input or output for one sample; a list built in code without
 * spec_flat_layers has widths only. */
static int64_t layer_in_numel(const struct spec_layer *l)
{
    return l->in_rank ? shape_numel(l->in_rank, l->in_shape) : l->in;
}

static int64_t layer_out_numel(const struct spec_layer *l)
{
    return l->out_rank ? shape_numel(l->out_rank, l->out_shape) : l->out;
}

/* Attention's B (rows of [T, dim] sequences), T, dim and heads for `rows` samples. */
static void attention_dims(const struct spec_layer *l, int64_t rows, int64_t *b, int64_t *t, int64_t *h)
{
    *t = l->in_rank >= 2 ? l->in_shape[l->in_rank - 2] : 1;
    *h = l->heads > 0 ? l->heads : 1;
    const int64_t td = sat_mul(*t, l->dim);
    *b = sat_mul(rows, td > 0 ? layer_in_numel(l) / td : 0);
}

/* What a layer keeps from forward for backward, in floats, for `rows` samples: the
 * worker's layer_ops.saved (worker/layers/), figure for figure. Attention: q, k, v and
 * the merged heads, and the probabilities; layernorm: mean and rstd per position;
 * batchnorm: the batch's mean and invstd; dropout: its mask; max pooling: the argmax. */
static int64_t layer_saved(const struct spec_layer *l, int64_t rows)
{
    switch (l->kind) {
    case LAYER_ATTENTION: {
        int64_t b, t, h;
        attention_dims(l, rows, &b, &t, &h);
        return sat_add(sat_mul(4, sat_mul(b, sat_mul(t, l->dim))), sat_mul(b, sat_mul(h, sat_mul(t, t))));
    }
    case LAYER_LAYERNORM: return l->dim > 0 ? sat_mul(2, sat_mul(rows, layer_in_numel(l) / l->dim)) : 0;
    case LAYER_BATCHNORM: return sat_mul(2, l->dim);
    case LAYER_DROPOUT: return l->p > 0.0 ? sat_mul(rows, layer_in_numel(l)) : 0;
    case LAYER_MAXPOOL2D: return sat_mul(rows, layer_out_numel(l));
    default: return 0;
    }
}

/* A layer's scratch for one forward or backward, in floats, for `rows` samples (the
 * worker's layer_ops.work; the model allocates the largest one, shared): attention's
 * qkv, scores and backward's eight [B,T,dim] and two [B,H,T,T] tensors; layernorm's and
 * batchnorm's dx when no layer below needs the gradient; conv2d's im2col buffer and the
 * row of ones for its bias. */
static int64_t layer_work(const struct spec_layer *l, int64_t rows)
{
    switch (l->kind) {
    case LAYER_ATTENTION: {
        int64_t b, t, h;
        attention_dims(l, rows, &b, &t, &h);
        return sat_add(sat_mul(8, sat_mul(b, sat_mul(t, l->dim))),
                       sat_mul(2, sat_mul(b, sat_mul(h, sat_mul(t, t)))));
    }
    case LAYER_LAYERNORM:
    case LAYER_BATCHNORM: return sat_mul(rows, layer_in_numel(l));
    case LAYER_CONV2D: {
        const int64_t k = sat_mul(l->in_shape[0], sat_mul(l->kernel[0], l->kernel[1]));
        const int64_t n = sat_mul(l->out_shape[1], l->out_shape[2]);
        return sat_add(sat_mul(rows, sat_mul(k, n)), n);
    }
    default: return 0;
    }
}

/* The model's tensors for micro-batches of `rows` rows, in floats, as model_new_err
 * (worker/model.c) allocates them: every layer's output, what the layers save for
 * backward, the largest layer scratch, and backward's dy ping-pong (two buffers of the
 * widest layer per residual depth). */
static int64_t model_floats(const struct spec *s, int64_t rows)
{
    int64_t outs = 0, saved = 0, work = 0, widest = 1, depths = 1;
    int depth[SPEC_MAX_LAYERS];
    for (int i = 0; i < s->n_layers && i < SPEC_MAX_LAYERS; i++) {
        const struct spec_layer *l = &s->layers[i];
        const int64_t li = layer_in_numel(l), lo = layer_out_numel(l);
        depth[i] = l->parent >= 0 && l->parent < i ? depth[l->parent] + 1 : 0;
        depths = depth[i] + 1 > depths ? depth[i] + 1 : depths;
        outs = sat_add(outs, sat_mul(rows, lo));
        saved = sat_add(saved, layer_saved(l, rows));
        const int64_t w = layer_work(l, rows);
        work = w > work ? w : work;
        widest = li > widest ? li : widest;
        widest = lo > widest ? lo : widest;
    }
    return sat_add(sat_add(outs, saved), sat_add(work, sat_mul(sat_mul(2, depths), sat_mul(rows, widest))));
}

/* What one data set (the data, or eval.data as `d`) holds in a rank, in bytes: its
 * samples as 4-byte values (synthetic, CSV, an .npy file of at most SPEC_DATA_MAP_MIN
 * bytes of values; a tokens file and a larger .npy file are memory-mapped and read
 * window by window), the shard's order, the permutation when it shuffles, and the
 * synthetic teacher. `held`: the rows the rank keeps; `shard`: its shard's rows; `rows`:
 * the whole set's. */
static int64_t data_bytes(const struct spec *s, const struct spec_data *d, int64_t rows, int64_t shard,
                          int64_t held, int64_t width)
{
    const int64_t F = (int64_t)sizeof(float);
    const int64_t xs = sat_mul(sat_mul(held, F), spec_sample_numel(s));
    const int64_t ys = sat_mul(sat_mul(held, F), spec_target_numel(s));
    int64_t b = 0;
    if (d->kind == DATA_SYNTHETIC || d->kind == DATA_CSV)
        b = sat_add(xs, ys);
    else if (d->kind == DATA_NPY)
        b = sat_add(xs > SPEC_DATA_MAP_MIN ? 0 : xs, ys > SPEC_DATA_MAP_MIN ? 0 : ys);
    b = sat_add(b, sat_mul(shard, 8));                 /* the shard's order */
    b = sat_add(b, d->shuffle ? sat_mul(rows, 8) : 0); /* the permutation */
    if (d->kind == DATA_SYNTHETIC) {
        int64_t teacher = 0; /* the teacher keeps its weights in double */
        for (int i = 0; i < s->n_layers; i++) {
            const struct spec_layer *l = &s->layers[i];
            if (l->kind == LAYER_LINEAR)
                teacher = sat_add(teacher, sat_mul(8, sat_add(sat_mul(l->in, l->out), l->out)));
        }
        b = sat_add(b, sat_add(teacher, sat_mul(2 * 64 * 8, width)));
    }
    return b;
}

void spec_memory_estimate(const struct spec *s, const struct spec_memory_in *mi, struct spec_memory *m)
{
    const int64_t F = (int64_t)sizeof(float), P = spec_param_count(s);
    const int64_t in = spec_sample_numel(s);
    const struct spec_layer *ol = spec_output_layer(s);
    const int64_t out = ol && ol->out_rank ? shape_numel(ol->out_rank, ol->out_shape) : spec_out_width(s);
    const int64_t target = spec_target_numel(s);
    const bool cuda = s->device == DEVICE_CUDA;
    const int per = s->optim.kind == OPTIM_ADAMW ? 2 : s->optim.momentum != 0.0 ? 1 : 0;
    const int world = s->world_size > 0 ? s->world_size : 1;
    const bool eval = s->eval.every_steps > 0;
    const int64_t rows = mi->rows > 0 ? mi->rows : 0;
    const int64_t erows = eval && mi->eval_rows > 0 ? mi->eval_rows : 0;
    memset(m, 0, sizeof *m);

    /* The largest shard (rank 0's) and the rows a rank keeps: the whole set when it
     * shuffles it or reads a shared file; synthetic data without shuffling generates
     * only its own shard. eval.data is never shuffled. */
    const int64_t shard = mi->rank_file ? rows : spec_shard_rows(rows, 0, world);
    const int64_t held = mi->rank_file || (s->data.kind == DATA_SYNTHETIC && !s->data.shuffle) ? shard : rows;
    const int64_t eshard = mi->eval_rank_file ? erows : spec_shard_rows(erows, 0, world);
    const int64_t eheld = mi->eval_rank_file || s->eval.data.kind == DATA_SYNTHETIC ? eshard : erows;
    /* One set of batch buffers and one model serve both, sized by the larger batch. */
    int64_t R = spec_batch_rows(s, shard);
    if (eval && spec_batch_rows(s, eshard) > R)
        R = spec_batch_rows(s, eshard);
    int64_t width = 1, bn = 0;
    for (int i = 0; i < s->n_layers; i++) {
        const struct spec_layer *l = &s->layers[i];
        const int64_t li = layer_in_numel(l), lo = layer_out_numel(l);
        width = li > width ? li : width;
        width = lo > width ? lo : width;
        if (l->kind == LAYER_BATCHNORM) /* running mean and var, num_batches_tracked */
            bn = sat_add(bn, sat_add(sat_mul(2 * F, l->dim), 8));
    }
    m->rows = R;
    m->params = sat_mul(P, F);
    m->grads = m->params;
    m->optim = sat_mul(m->params, per);
    if (world > 1) {
        /* The buckets hold every gradient once more; the zero bucket is the largest one. */
        int64_t cap = (int64_t)(s->ddp.bucket_cap_mb * 1024 * 1024);
        cap = cap > (1 << 20) ? cap : (1 << 20);
        m->buckets = sat_add(m->params, m->params < cap ? m->params : cap);
    }
    m->activations = sat_add(sat_mul(F, model_floats(s, R)), bn);
    /* A step's micro-batches (their losses): at most grad_accum, at most the batches. */
    const int64_t nb = spec_batches(shard, s->batch_size, s->data.drop_last);
    const int64_t k = s->grad_accum < nb ? s->grad_accum : nb > 0 ? nb : 1;
    /* Host: x, y, the labels, the step's losses twice (read and on_nonfinite's copy),
     * eval's logits. Device: x, y, the labels, the loss gradient, the step's losses,
     * eval's loss. */
    const int64_t per_row = sat_add(in, sat_mul(2, target));
    const int64_t batch_host =
        sat_mul(F, sat_add(sat_add(sat_mul(R, per_row), sat_mul(2, k)), eval ? sat_mul(R, out) : 0));
    const int64_t batch_dev =
        sat_mul(F, sat_add(sat_add(sat_mul(R, sat_add(per_row, out)), k), eval ? 1 : 0));
    m->batch = sat_add(batch_host, batch_dev);
    m->data = data_bytes(s, &s->data, rows, shard, held, width);
    m->data = sat_add(m->data, mi->file_bytes > 0 ? mi->file_bytes : 0);
    if (eval)
        m->eval = data_bytes(s, &s->eval.data, erows, eshard, eheld, width);
    m->staging = sat_mul(m->params, 1 + per);

    const int64_t on_dev = sat_add(sat_add(sat_add(m->params, m->grads), sat_add(m->optim, m->buckets)),
                                   sat_add(m->activations, batch_dev));
    m->total = sat_add(sat_add(on_dev, batch_host), sat_add(sat_add(m->data, m->eval), m->staging));
    m->device = cuda ? on_dev : 0;
    m->host = cuda ? sat_add(batch_host, sat_add(sat_add(m->data, m->eval), m->staging)) : m->total;
}

/* "12.3 MiB", "4.0 TiB": sizes for messages. */
static void fmt_bytes(char *dst, size_t cap, int64_t b)
{
    static const char *const units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    double x = (double)b;
    int u = 0;
    while (x >= 1024 && u < 6) {
        x /= 1024;
        u++;
    }
    if (u == 0)
        snprintf(dst, cap, "%lld bytes", (long long)b);
    else
        snprintf(dst, cap, "%.1f %s", x, units[u]);
}

ddpd_err spec_memory_check(const struct spec *s, const struct spec_memory *m, int64_t limit,
                           const char *limit_name, ddpd_err code, struct ddpd_error *err)
{
    if (limit <= 0 || m->host <= limit)
        return DDPD_OK;
    /* Blame the part of the host's share that weighs most. On cuda the model and the
     * activations live on the GPU and only their host copies count here. */
    const bool cuda = s->device == DEVICE_CUDA;
    const int64_t model =
        cuda ? m->staging
             : sat_add(sat_add(sat_add(m->params, m->grads), sat_add(m->optim, m->buckets)), m->staging);
    const int64_t batch = cuda ? m->host - model - m->data - m->eval : sat_add(m->activations, m->batch);
    const char *path = model >= batch && model >= m->data && model >= m->eval ? "model"
                       : batch >= m->data && batch >= m->eval                 ? "batch_size"
                       : m->data >= m->eval ? (s->data.kind == DATA_SYNTHETIC ? "data.samples" : "data")
                       : s->eval.data.kind == DATA_SYNTHETIC ? "eval.data.samples"
                                                             : "eval.data";
    char need[32], lim[32], pa[32], gr[32], op[32], bu[32], ac[32], ba[32], da[32], ev[32], st[32];
    fmt_bytes(need, sizeof need, m->host);
    fmt_bytes(lim, sizeof lim, limit);
    fmt_bytes(pa, sizeof pa, m->params);
    fmt_bytes(gr, sizeof gr, m->grads);
    fmt_bytes(op, sizeof op, m->optim);
    fmt_bytes(bu, sizeof bu, m->buckets);
    fmt_bytes(ac, sizeof ac, m->activations);
    fmt_bytes(ba, sizeof ba, m->batch);
    fmt_bytes(da, sizeof da, m->data);
    fmt_bytes(ev, sizeof ev, m->eval);
    fmt_bytes(st, sizeof st, m->staging);
    return ddpd_error_set(
        err, code, path,
        "the job needs about %s of %smemory per rank (parameters %s, gradients %s, "
        "optimizer state %s, DDP buckets %s, activations %s and batch %s for micro-batches "
        "of %lld rows, data %s%s%s, checkpoint copies %s), more than the limit of %s per rank "
        "(%s)",
        need, cuda ? "host " : "", pa, gr, op, bu, ac, ba, (long long)m->rows, da,
        s->eval.every_steps > 0 ? ", eval data " : "", s->eval.every_steps > 0 ? ev : "", st, lim,
        limit_name);
}

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
        snprintf(l->key, sizeof l->key, "%d", i);
        l->in_rank = l->out_rank = 1;
        l->in_shape[0] = l->in;
        l->out_shape[0] = l->out;
    }
    s->input_rank = s->n_layers > 0 ? 1 : 0;
    s->input_shape[0] = s->n_layers > 0 ? s->layers[0].in : 0;
    s->input_shape_set = false;
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

const char *loss_kind_name(loss_kind k)
{
    return (unsigned)k < COUNT(loss_names) ? loss_names[k] : "unknown";
}

const char *device_kind_name(device_kind k)
{
    return (unsigned)k < COUNT(device_names) ? device_names[k] : "unknown";
}

int64_t spec_shard_rows(int64_t rows, int rank, int world)
{
    return rows / world + (rank < rows % world ? 1 : 0);
}

int64_t spec_batches(int64_t rows, int64_t batch, bool drop_last)
{
    /* Not (rows + batch - 1) / batch: that overflows for sizes near INT64_MAX. */
    return rows / batch + (!drop_last && rows % batch != 0);
}

ddpd_err spec_check_batch_counts(const struct spec *s, const int64_t *counts, struct ddpd_error *err)
{
    int uneven = -1, empty = -1, busy = -1;
    for (int r = 0; r < s->world_size; r++) {
        if (counts[r] != counts[0] && uneven < 0)
            uneven = r;
        if (counts[r] == 0 && empty < 0)
            empty = r;
        if (counts[r] > 0 && busy < 0)
            busy = r;
    }
    if (uneven < 0 || s->ddp.join != JOIN_FALSE)
        return DDPD_OK;
    /* PyTorch runs a rank without inputs under join: it joins at once and shadows every
     * step of the others. */
    if (empty >= 0 && busy >= 0)
        return ddpd_error_set(
            err, DDPD_ESPEC, "ddp.join",
            "ddp.join: rank %d has no batch of %" PRId64 " (its shard is empty%s) while rank %d "
            "has %" PRId64 "; with join \"auto\" or true it would join at once and shadow the "
            "others' steps, but join is false",
            empty, s->batch_size, s->data.drop_last ? " or smaller than a batch" : "", busy, counts[busy]);
    return ddpd_error_set(err, DDPD_ESPEC, "ddp.join",
                          "ddp.join: the ranks have uneven batch counts per epoch (rank 0: %" PRId64
                          ", rank %d: %" PRId64 ") but join is false; use \"auto\" or true",
                          counts[0], uneven, counts[uneven]);
}
