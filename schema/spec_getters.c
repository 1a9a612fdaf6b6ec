/* spec_getters.c — reads one value of the spec's JSON and, when it is wrong, says at its JSON
 * path what was expected and what came ("model[2].kernel: expected ..."): the typed getters, the
 * unknown-key check with its "did you mean", the quoting of user text in messages. Knows jansson
 * and struct ddpd_error, nothing of the spec's sections. */
#include "spec_impl.h"

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
 * "..." when it had to stop early. Control characters (C0, DEL, C1) come out as \\u escapes,
 * so a key echoed in a message cannot reach a terminal or a log as an escape sequence. */
void quote_into(char *dst, size_t cap, const char *s, size_t len, size_t max)
{
    size_t n = utf8_prefix(s, len, max), o = 0;
    for (size_t i = 0; i < n && o + 8 < cap; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '"' || ch == '\\') {
            dst[o++] = '\\';
            dst[o++] = (char)ch;
        } else if (ch < 0x20 || ch == 0x7F) {
            o += (size_t)snprintf(dst + o, cap - o, "\\u%04x", ch);
        } else if (ch == 0xC2 && i + 1 < n && ((unsigned char)s[i + 1] & 0xE0) == 0x80) {
            /* a C1 control (U+0080..U+009F) is as much a terminal escape as ESC */
            o += (size_t)snprintf(dst + o, cap - o, "\\u%04x", (unsigned char)s[++i]);
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
void path_key(char *dst, const char *parent, const char *key)
{
    if (is_ident(key) && strlen(key) <= 64) {
        snprintf(dst, PATH_CAP, "%s%s%s", parent, *parent ? "." : "", key);
    } else {
        char q[160];
        quote_into(q, sizeof q, key, strlen(key), 64);
        snprintf(dst, PATH_CAP, "%s[\"%s\"]", parent, q);
    }
}

void path_index(char *dst, const char *parent, size_t i)
{
    if (snprintf(dst, PATH_CAP, "%s[%zu]", parent, i) >= (int)PATH_CAP)
        dst[PATH_CAP - 1] = '\0'; /* cut short: residuals nest at most SPEC_MAX_DEPTH deep */
}

/* Shortest %g that reads back as the same double. */
void fmt_real(char *dst, size_t cap, double x)
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
const char *describe(const json_t *v, char *buf, size_t cap)
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

ddpd_err fail(struct ddpd_error *err, const char *path, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ddpd_error_vset(err, DDPD_ESPEC, path, fmt, ap);
    va_end(ap);
    return DDPD_ESPEC;
}

ddpd_err fail_type(struct ddpd_error *err, const char *path, const char *want, const json_t *got)
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

/* The name of names[0..n) nearest to `s` when it is near enough to be a typo of it (an edit
 * distance of at most 2, and less than its own length), else NULL: for "did you mean". */
static const char *nearest_name(const char *s, const char *const *names, size_t n)
{
    size_t best = 0, best_d = 99;
    for (size_t i = 0; i < n; i++) {
        size_t d = edit_distance(s, names[i]);
        if (d < best_d) {
            best_d = d;
            best = i;
        }
    }
    return n > 0 && best_d <= 2 && best_d < strlen(s) ? names[best] : NULL;
}

/* Unknown keys are an error (CONTRACT.md §2): the first one, in document order, is
 * reported with the keys this object takes. `only` replaces the list for objects that
 * take a single key ("a relu layer takes only \"type\""). */
ddpd_err check_keys(struct ddpd_error *err, json_t *obj, const char *parent, const char *const *allowed,
                    size_t n, const char *only)
{
    const char *key;
    json_t *v;
    json_object_foreach (obj, key, v) {
        size_t i;
        for (i = 0; i < n && strcmp(key, allowed[i]) != 0; i++)
            ;
        if (i < n)
            continue;
        /* Unknown: the nearest allowed key, for the hint. */
        const char *near = nearest_name(key, allowed, n);
        char path[PATH_CAP], list[512];
        path_key(path, parent, key);
        if (only)
            return fail(err, path, "unknown key (%s)", only);
        join_names(list, sizeof list, allowed, n);
        if (near)
            return fail(err, path, "unknown key (did you mean \"%s\"? expected one of %s)", near, list);
        return fail(err, path, "unknown key (expected one of %s)", list);
    }
    return DDPD_OK;
}

/* ---- typed getters: each leaves *out alone when the key is absent and not required ---- */

ddpd_err missing(struct ddpd_error *err, const char *path, const char *want)
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

ddpd_err get_int(struct ddpd_error *err, json_t *obj, const char *parent, const char *key, int64_t lo,
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

ddpd_err get_int32(struct ddpd_error *err, json_t *obj, const char *parent, const char *key, int lo, int hi,
                   int *out)
{
    int64_t x = *out;
    ddpd_err rc = get_int(err, obj, parent, key, lo, hi, false, &x);
    if (rc == DDPD_OK)
        *out = (int)x;
    return rc;
}

/* A finite number with lo < x (lo_open) or lo <= x, and x <= hi; `want` is the phrase
 * for messages ("a positive number"). Integers are numbers too. */
ddpd_err get_num(struct ddpd_error *err, json_t *obj, const char *parent, const char *key, double lo,
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

ddpd_err get_bool(struct ddpd_error *err, json_t *obj, const char *parent, const char *key, bool *out)
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

/* A string that fits in dst (cap bytes with the NUL) and holds no NUL byte and no control
 * character (text.h). */
ddpd_err get_str_value(struct ddpd_error *err, json_t *v, const char *path, char *dst, size_t cap)
{
    if (!json_is_string(v))
        return fail_type(err, path, "a string", v);
    size_t len = json_string_length(v);
    if (len >= cap)
        return fail(err, path, "expected a string of at most %zu bytes, got %zu bytes", cap - 1, len);
    if (strlen(json_string_value(v)) != len)
        return fail(err, path, "must not contain NUL bytes");
    /* Every string of a spec is shown somewhere (`ddpd jobs`, the dashboard, an error
     * naming a file or a column): none may hold what a terminal would obey. */
    ddpd_err rc = text_check_showable(json_string_value(v), len, path, err);
    if (rc != DDPD_OK)
        return rc;
    memcpy(dst, json_string_value(v), len + 1);
    return DDPD_OK;
}

/* One of names[]; *out is the index. A missing required key lists the choices. */
/* get_enum, and with `hint` a "did you mean" for a near miss. */
static ddpd_err enum_value(struct ddpd_error *err, json_t *obj, const char *parent, const char *key,
                           const char *const *names, size_t n, bool required, bool hint, int *out)
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
    const char *near = hint && json_is_string(v) ? nearest_name(json_string_value(v), names, n) : NULL;
    if (near) {
        char d[200];
        return fail(err, path, "expected %s, got %s (did you mean \"%s\"?)", want, describe(v, d, sizeof d),
                    near);
    }
    return fail_type(err, path, want, v);
}

ddpd_err get_enum(struct ddpd_error *err, json_t *obj, const char *parent, const char *key,
                  const char *const *names, size_t n, bool required, int *out)
{
    return enum_value(err, obj, parent, key, names, n, required, false, out);
}

/* A misspelt layer type ("lineer", "layer_norm") gets the hint an unknown key gets. Only
 * where the names are all one family: for a loss or a precision a near name is another
 * thing ("fp16" is not a misspelt "fp32"). */
ddpd_err get_enum_hint(struct ddpd_error *err, json_t *obj, const char *parent, const char *key,
                       const char *const *names, size_t n, bool required, int *out)
{
    return enum_value(err, obj, parent, key, names, n, required, true, out);
}

/* An object member that must itself be an object; *out is NULL when absent. */
ddpd_err get_obj(struct ddpd_error *err, json_t *obj, const char *key, bool required, const char *example,
                 json_t **out)
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

ddpd_err get_path(struct ddpd_error *err, json_t *obj, const char *parent, const char *key, bool required,
                  char *dst)
{
    char path[PATH_CAP];
    json_t *v = json_object_get(obj, key);
    path_key(path, parent, key);
    if (!v)
        return required ? missing(err, path, "a file path relative to the data directory") : DDPD_OK;
    return get_path_value(err, v, path, dst);
}

/* An int, or a list of two ints, each in [lo, hi] (kernel, stride, padding: [h, w]). */
ddpd_err get_pair(struct ddpd_error *err, json_t *obj, const char *parent, const char *key, int64_t lo,
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
