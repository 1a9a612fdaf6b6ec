/* event.c — the events of CONTRACT.md §6: one encoder and one decoder. The encoder runs
 * every training step, so it writes straight into the caller's buffer with snprintf and
 * allocates nothing; the decoder (server side) uses jansson. */
#include "event.h"
#include "job_state.h"

#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

static const char *const kind_names[] = {"start", "loss",  "join", "checkpoint",
                                         "done",  "error", "eval", "state"};

const char *event_kind_name(event_kind k)
{
    return (unsigned)k < COUNT(kind_names) ? kind_names[k] : "unknown";
}

bool event_is_final(const struct event *ev)
{
    return ev->kind == EVENT_STATE && job_state_name_is_final(ev->state);
}

/* ---- encoding ---- */

/* A cursor over the caller's buffer; once anything does not fit, `len` exceeds `cap`
 * and every later write is skipped. */
struct out {
    char *buf;
    size_t cap, len;
};

static void put_raw(struct out *o, const char *s, size_t n)
{
    if (o->len + n < o->cap)
        memcpy(o->buf + o->len, s, n);
    o->len += n;
}

static void put_fmt(struct out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put_fmt(struct out *o, const char *fmt, ...)
{
    va_list ap;
    size_t room = o->len < o->cap ? o->cap - o->len : 0;
    va_start(ap, fmt);
    int n = vsnprintf(room ? o->buf + o->len : NULL, room, fmt, ap);
    va_end(ap);
    o->len += n > 0 ? (size_t)n : 0;
}

/* Length of a valid UTF-8 sequence starting at s (at most n bytes), or 0 if invalid. */
static size_t utf8_len(const unsigned char *s, size_t n)
{
    size_t len;
    unsigned min;
    unsigned cp;
    if (s[0] < 0x80)
        return 1;
    if ((s[0] & 0xE0) == 0xC0) {
        len = 2, min = 0x80, cp = s[0] & 0x1F;
    } else if ((s[0] & 0xF0) == 0xE0) {
        len = 3, min = 0x800, cp = s[0] & 0x0F;
    } else if ((s[0] & 0xF8) == 0xF0) {
        len = 4, min = 0x10000, cp = s[0] & 0x07;
    } else {
        return 0;
    }
    if (len > n)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return len;
}

/* A JSON string. The field may be unterminated (read at most `max` bytes); UTF-8 passes
 * through, and bytes that are not valid UTF-8 (a message cut mid-character) become
 * U+FFFD so that the line stays valid JSON. */
static void put_str(struct out *o, const char *s, size_t max)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t n = strnlen(s, max), run = 0;
    put_raw(o, "\"", 1);
    for (size_t i = 0; i < n;) {
        unsigned char c = p[i];
        size_t u = c >= 0x20 && c != '"' && c != '\\' ? utf8_len(p + i, n - i) : 0;
        if (u) {
            i += u;
            run += u;
            continue;
        }
        put_raw(o, (const char *)p + i - run, run);
        run = 0;
        switch (c) {
        case '"': put_raw(o, "\\\"", 2); break;
        case '\\': put_raw(o, "\\\\", 2); break;
        case '\n': put_raw(o, "\\n", 2); break;
        case '\r': put_raw(o, "\\r", 2); break;
        case '\t': put_raw(o, "\\t", 2); break;
        default:
            if (c < 0x20)
                put_fmt(o, "\\u%04x", c);
            else
                put_raw(o, "\\ufffd", 6);
        }
        i++;
    }
    put_raw(o, (const char *)p + n - run, run);
    put_raw(o, "\"", 1);
}

/* The shortest of %.15g..%.17g that reads back as the same double. -0.0 keeps its sign
 * (jansson would read "-0" as the integer 0). */
static void put_double(struct out *o, double x)
{
    char tmp[32];
    if (x == 0 && signbit(x)) {
        put_raw(o, "-0.0", 4);
        return;
    }
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*g", prec, x);
        if (prec == 17 || strtod(tmp, NULL) == x)
            break;
    }
    put_raw(o, tmp, strlen(tmp));
}

/* A number with fixed decimals (ts, samples_per_s); null when not finite, and the
 * round-trip form when %f would print hundreds of digits. */
static void put_fixed(struct out *o, double x, int decimals)
{
    if (!isfinite(x))
        put_raw(o, "null", 4);
    else if (fabs(x) < 1e15)
        put_fmt(o, "%.*f", decimals, x);
    else
        put_double(o, x);
}

/* put_double, or null when not finite (JSON has no NaN; null reads back as NaN). */
static void put_num(struct out *o, double x)
{
    if (isfinite(x))
        put_double(o, x);
    else
        put_raw(o, "null", 4);
}

static void put_loss(struct out *o, const struct event *ev)
{
    put_raw(o, ",\"loss\":", 8);
    if (ev->nonfinite || !isfinite(ev->loss))
        put_raw(o, "null,\"nonfinite\":true", 21);
    else
        put_double(o, ev->loss);
}

int event_encode(const struct event *ev, char *buf, size_t cap)
{
    struct out o = {buf, cap, 0};
    put_raw(&o, "{\"event\":", 9);
    put_str(&o, event_kind_name(ev->kind), 16);
    if (ev->has_server_fields)
        put_fmt(&o, ",\"job\":%lld,\"attempt\":%lld,\"seq\":%lld", (long long)ev->job, (long long)ev->attempt,
                (long long)ev->seq);
    if (ev->kind != EVENT_STATE)
        put_fmt(&o, ",\"rank\":%d", ev->rank);
    switch (ev->kind) {
    case EVENT_START:
        put_fmt(&o, ",\"world_size\":%d,\"device\":", ev->world_size);
        put_str(&o, ev->device, sizeof ev->device);
        put_fmt(&o, ",\"params\":%lld,\"batches\":%lld", (long long)ev->params, (long long)ev->batches);
        if (ev->activation_bytes > 0) /* a worker before v2 sent none */
            put_fmt(&o, ",\"activation_bytes\":%lld", (long long)ev->activation_bytes);
        break;
    case EVENT_LOSS:
        put_fmt(&o, ",\"step\":%lld,\"epoch\":%lld", (long long)ev->step, (long long)ev->epoch);
        put_loss(&o, ev);
        put_raw(&o, ",\"samples_per_s\":", 17);
        put_fixed(&o, ev->samples_per_s, 1);
        if (ev->has_lr) {
            put_raw(&o, ",\"lr\":", 6);
            put_num(&o, ev->lr);
        }
        if (ev->has_grad_norm) {
            put_raw(&o, ",\"grad_norm\":", 13);
            put_num(&o, ev->grad_norm);
        }
        break;
    case EVENT_EVAL:
        put_fmt(&o, ",\"step\":%lld", (long long)ev->step);
        put_loss(&o, ev);
        if (ev->has_accuracy) {
            put_raw(&o, ",\"accuracy\":", 12);
            put_num(&o, ev->accuracy);
        }
        put_fmt(&o, ",\"samples\":%lld", (long long)ev->samples);
        break;
    case EVENT_JOIN: put_fmt(&o, ",\"step\":%lld", (long long)ev->step); break;
    case EVENT_CHECKPOINT:
        put_fmt(&o, ",\"step\":%lld,\"path\":", (long long)ev->step);
        put_str(&o, ev->path, sizeof ev->path);
        break;
    case EVENT_DONE:
        put_fmt(&o, ",\"steps\":%lld", (long long)ev->steps);
        put_loss(&o, ev);
        put_raw(&o, ",\"seconds\":", 11);
        if (isfinite(ev->seconds))
            put_double(&o, ev->seconds);
        else
            put_raw(&o, "null", 4);
        if (ev->stop_reason[0]) { /* optional: a job that ran to its end has none */
            put_raw(&o, ",\"stop_reason\":", 15);
            put_str(&o, ev->stop_reason, sizeof ev->stop_reason);
        }
        break;
    case EVENT_ERROR:
        put_raw(&o, ",\"kind\":", 8);
        put_str(&o, ev->error_kind, sizeof ev->error_kind);
        put_raw(&o, ",\"message\":", 11);
        put_str(&o, ev->message, sizeof ev->message);
        if (ev->secondary) /* optional: readers before it see the error as they always did */
            put_raw(&o, ",\"secondary\":true", 17);
        break;
    case EVENT_STATE:
        put_raw(&o, ",\"state\":", 9);
        put_str(&o, ev->state, sizeof ev->state);
        if (ev->message[0]) {
            put_raw(&o, ",\"error\":", 9);
            put_str(&o, ev->message, sizeof ev->message);
        }
        break;
    default: return -1;
    }
    put_raw(&o, ",\"ts\":", 6);
    put_fixed(&o, ev->ts, 6);
    put_raw(&o, "}", 1);
    if (o.len >= cap)
        return -1;
    buf[o.len] = '\0';
    return (int)o.len;
}

/* ---- decoding ---- */

static ddpd_err bad(struct ddpd_error *err, const char *key, const char *want, json_t *v)
{
    const char *got;
    switch (json_typeof(v)) {
    case JSON_STRING: got = "a string"; break;
    case JSON_INTEGER: got = "an integer"; break;
    case JSON_REAL: got = "a real number"; break;
    case JSON_TRUE:
    case JSON_FALSE: got = "a boolean"; break;
    case JSON_NULL: got = "null"; break;
    case JSON_ARRAY: got = "an array"; break;
    default: got = "an object"; break;
    }
    return ddpd_error_set(err, DDPD_EJSON, key, "expected %s, got %s", want, got);
}

static ddpd_err need(struct ddpd_error *err, json_t *obj, const char *key, const char *want, json_t **v)
{
    *v = json_object_get(obj, key);
    if (!*v)
        return ddpd_error_set(err, DDPD_EJSON, key, "missing (expected %s)", want);
    return DDPD_OK;
}

static ddpd_err get_i64(struct ddpd_error *err, json_t *obj, const char *key, int64_t *out)
{
    json_t *v;
    ddpd_err rc = need(err, obj, key, "an integer", &v);
    if (rc != DDPD_OK)
        return rc;
    if (!json_is_integer(v))
        return bad(err, key, "an integer", v);
    *out = json_integer_value(v);
    return DDPD_OK;
}

static ddpd_err get_int(struct ddpd_error *err, json_t *obj, const char *key, int lo, int *out)
{
    int64_t x = 0;
    ddpd_err rc = get_i64(err, obj, key, &x);
    if (rc != DDPD_OK)
        return rc;
    if (x < lo || x > INT_MAX)
        return ddpd_error_set(err, DDPD_EJSON, key, "expected an integer from %d to %d, got %lld", lo,
                              INT_MAX, (long long)x);
    *out = (int)x;
    return DDPD_OK;
}

/* A number, or null: the encoder writes a non-finite number as null (JSON has no NaN),
 * and null reads back as NaN. */
static ddpd_err get_num(struct ddpd_error *err, json_t *obj, const char *key, double *out)
{
    json_t *v;
    ddpd_err rc = need(err, obj, key, "a number or null", &v);
    if (rc != DDPD_OK)
        return rc;
    if (json_is_null(v))
        *out = NAN;
    else if (json_is_number(v))
        *out = json_number_value(v);
    else
        return bad(err, key, "a number or null", v);
    return DDPD_OK;
}

/* An optional number (or null): *has says whether the key was there. */
static ddpd_err get_opt_num(struct ddpd_error *err, json_t *obj, const char *key, double *out, bool *has)
{
    *has = json_object_get(obj, key) != NULL;
    return *has ? get_num(err, obj, key, out) : DDPD_OK;
}

/* An optional boolean: false when the key is absent. */
static ddpd_err get_opt_bool(struct ddpd_error *err, json_t *obj, const char *key, bool *out)
{
    json_t *v = json_object_get(obj, key);
    if (v && !json_is_boolean(v))
        return bad(err, key, "true or false", v);
    *out = json_is_true(v);
    return DDPD_OK;
}

static ddpd_err get_str(struct ddpd_error *err, json_t *obj, const char *key, bool required, char *dst,
                        size_t cap)
{
    json_t *v = json_object_get(obj, key);
    if (!v)
        return required ? ddpd_error_set(err, DDPD_EJSON, key, "missing (expected a string)") : DDPD_OK;
    if (!json_is_string(v))
        return bad(err, key, "a string", v);
    size_t len = json_string_length(v);
    if (len >= cap)
        return ddpd_error_set(err, DDPD_EJSON, key, "expected a string of at most %zu bytes, got %zu bytes",
                              cap - 1, len);
    memcpy(dst, json_string_value(v), len + 1);
    return DDPD_OK;
}

/* loss: a number, or null with "nonfinite": true (CONTRACT.md §6). */
static ddpd_err get_loss(struct ddpd_error *err, json_t *obj, struct event *ev)
{
    json_t *nf = json_object_get(obj, "nonfinite");
    ddpd_err rc = get_num(err, obj, "loss", &ev->loss);
    if (rc != DDPD_OK)
        return rc;
    if (nf && !json_is_boolean(nf))
        return bad(err, "nonfinite", "true or false", nf);
    ev->nonfinite = isnan(ev->loss);
    if (json_is_true(nf) && !ev->nonfinite)
        return ddpd_error_set(err, DDPD_EJSON, "nonfinite", "is true but loss is a number");
    return DDPD_OK;
}

static ddpd_err decode_fields(json_t *root, struct event *ev, struct ddpd_error *err)
{
    json_t *v;
    ddpd_err rc;
    int k;

    if ((rc = need(err, root, "event", "the event's kind", &v)))
        return rc;
    if (!json_is_string(v))
        return bad(err, "event", "a string", v);
    for (k = 0; k < (int)COUNT(kind_names); k++)
        if (strcmp(json_string_value(v), kind_names[k]) == 0)
            break;
    if (k == (int)COUNT(kind_names)) {
        /* At most 40 bytes of it, not cut inside a UTF-8 character. */
        char q[48];
        size_t n = json_string_length(v) < 40 ? json_string_length(v) : 40;
        while (n > 0 && n < json_string_length(v) && ((unsigned char)json_string_value(v)[n] & 0xC0) == 0x80)
            n--;
        memcpy(q, json_string_value(v), n);
        q[n] = '\0';
        return ddpd_error_set(err, DDPD_EJSON, "event",
                              "unknown event \"%s\" (expected one of start, loss, join, "
                              "checkpoint, done, error, eval, state)",
                              q);
    }
    ev->kind = (event_kind)k;

    /* The server's fields come as a set. */
    if (json_object_get(root, "job") || json_object_get(root, "attempt") || json_object_get(root, "seq")) {
        ev->has_server_fields = true;
        if ((rc = get_i64(err, root, "job", &ev->job)) ||
            (rc = get_i64(err, root, "attempt", &ev->attempt)) || (rc = get_i64(err, root, "seq", &ev->seq)))
            return rc;
    }
    ev->rank = -1;
    if (ev->kind != EVENT_STATE && (rc = get_int(err, root, "rank", 0, &ev->rank)))
        return rc;

    switch (ev->kind) {
    case EVENT_START:
        rc = get_int(err, root, "world_size", 1, &ev->world_size);
        if (!rc)
            rc = get_str(err, root, "device", true, ev->device, sizeof ev->device);
        if (!rc)
            rc = get_i64(err, root, "params", &ev->params);
        if (!rc)
            rc = get_i64(err, root, "batches", &ev->batches);
        /* Optional: start events of workers before v2 lack it. */
        if (!rc && json_object_get(root, "activation_bytes"))
            rc = get_i64(err, root, "activation_bytes", &ev->activation_bytes);
        break;
    case EVENT_LOSS:
        rc = get_i64(err, root, "step", &ev->step);
        if (!rc)
            rc = get_i64(err, root, "epoch", &ev->epoch);
        if (!rc)
            rc = get_loss(err, root, ev);
        if (!rc)
            rc = get_num(err, root, "samples_per_s", &ev->samples_per_s);
        if (!rc)
            rc = get_opt_num(err, root, "lr", &ev->lr, &ev->has_lr);
        if (!rc)
            rc = get_opt_num(err, root, "grad_norm", &ev->grad_norm, &ev->has_grad_norm);
        break;
    case EVENT_EVAL:
        rc = get_i64(err, root, "step", &ev->step);
        if (!rc)
            rc = get_loss(err, root, ev);
        if (!rc)
            rc = get_opt_num(err, root, "accuracy", &ev->accuracy, &ev->has_accuracy);
        if (!rc)
            rc = get_i64(err, root, "samples", &ev->samples);
        break;
    case EVENT_JOIN: rc = get_i64(err, root, "step", &ev->step); break;
    case EVENT_CHECKPOINT:
        rc = get_i64(err, root, "step", &ev->step);
        if (!rc)
            rc = get_str(err, root, "path", true, ev->path, sizeof ev->path);
        break;
    case EVENT_DONE:
        rc = get_i64(err, root, "steps", &ev->steps);
        if (!rc)
            rc = get_loss(err, root, ev);
        if (!rc)
            rc = get_num(err, root, "seconds", &ev->seconds);
        if (!rc)
            rc = get_str(err, root, "stop_reason", false, ev->stop_reason, sizeof ev->stop_reason);
        break;
    case EVENT_ERROR:
        rc = get_str(err, root, "kind", true, ev->error_kind, sizeof ev->error_kind);
        if (!rc)
            rc = get_str(err, root, "message", true, ev->message, sizeof ev->message);
        if (!rc)
            rc = get_opt_bool(err, root, "secondary", &ev->secondary);
        break;
    case EVENT_STATE:
        rc = get_str(err, root, "state", true, ev->state, sizeof ev->state);
        if (!rc)
            rc = get_str(err, root, "error", false, ev->message, sizeof ev->message);
        break;
    }
    if (!rc)
        rc = get_num(err, root, "ts", &ev->ts);
    return rc;
}

ddpd_err event_decode(const char *line, size_t len, struct event *out, struct ddpd_error *err)
{
    json_error_t jerr;
    json_t *root = NULL;
    ddpd_err rc;

    memset(out, 0, sizeof *out);
    ddpd_error_clear(err);
    root = json_loadb(line, len, 0, &jerr);
    if (!root) {
        int l = jerr.line > 0 ? jerr.line : 1, c = jerr.column > 0 ? jerr.column : 1;
        rc = ddpd_error_set(err, DDPD_EJSON, "", "malformed JSON at line %d, column %d: %s", l, c, jerr.text);
        if (err) {
            err->line = l;
            err->column = c;
        }
        goto out;
    }
    if (!json_is_object(root)) {
        rc = ddpd_error_set(err, DDPD_EJSON, "", "expected an event object, got an array");
        goto out;
    }
    rc = decode_fields(root, out, err);
out:
    json_decref(root);
    return rc;
}

bool event_error_decode(const char *line, size_t len, struct event *out)
{
    /* The string "error" is in the raw line as such, or spelled with a \u escape. */
    if (!memmem(line, len, "\"error\"", 7) && !memmem(line, len, "\\u", 2))
        return false;
    return event_decode(line, len, out, NULL) == DDPD_OK && out->kind == EVENT_ERROR;
}

bool event_error_message(const char *line, size_t len, char *out, size_t cap)
{
    struct event ev;
    if (!event_error_decode(line, len, &ev))
        return false;
    snprintf(out, cap, "%s", ev.message);
    return true;
}
