/* stcheck.c — the safetensors check of a download (stcheck.h): the header is read and
 * parsed with jansson, then every tensor's entry and the layout are checked, each number
 * before it is used (checked multiplication for a shape's bytes). Allocates what the
 * header's length asks for, capped at STCHECK_MAX_HEADER and at the file's size. */
#include "stcheck.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/file.h"
#include "termsafe.h"

/* The dtypes of the format and their bytes per element. */
static const struct {
    const char *name;
    int bytes;
} dtypes[] = {
    {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2},
    {"BF16", 2}, {"I32", 4}, {"U32", 4}, {"F32", 4},     {"I64", 8},     {"U64", 8}, {"F64", 8},
};

struct span {
    int64_t begin, end;
    const char *name; /* borrowed from the header */
};

static bool say(char *why, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static bool say(char *why, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, cap, fmt, ap);
    va_end(ap);
    return false;
}

static int dtype_bytes(const char *name)
{
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (!strcmp(dtypes[i].name, name))
            return dtypes[i].bytes;
    return 0;
}

static bool get_count(const json_t *v, int64_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return false;
    *out = json_integer_value(v);
    return true;
}

/* One tensor's entry: its dtype, shape and data_offsets, within data_len bytes. */
static bool check_entry(const char *name, const json_t *v, int64_t data_len, struct span *sp, char *why,
                        size_t cap)
{
    char nm[96];
    termsafe_line(nm, sizeof nm, name);
    const json_t *dt = json_object_get(v, "dtype"), *shape = json_object_get(v, "shape"),
                 *offs = json_object_get(v, "data_offsets");
    if (!json_is_object(v) || !json_is_string(dt) || !json_is_array(shape) || !json_is_array(offs))
        return say(why, cap,
                   "tensor \"%s\": expected an object with \"dtype\", \"shape\" and \"data_offsets\"", nm);
    int size = dtype_bytes(json_string_value(dt));
    if (!size) {
        char d[48];
        return say(why, cap, "tensor \"%s\": unknown dtype \"%s\"", nm,
                   termsafe_line(d, sizeof d, json_string_value(dt)));
    }
    /* A dimension of 0 makes the tensor empty, however large the others. */
    int64_t bytes = size, dim;
    bool empty = false;
    for (size_t i = 0; i < json_array_size(shape); i++) {
        if (!get_count(json_array_get(shape, i), &dim))
            return say(why, cap, "tensor \"%s\": shape[%zu] is not a non-negative integer", nm, i);
        empty |= dim == 0;
    }
    for (size_t i = 0; i < json_array_size(shape) && !empty; i++)
        if (__builtin_mul_overflow(bytes, json_integer_value(json_array_get(shape, i)), &bytes))
            return say(why, cap, "tensor \"%s\": its shape's bytes do not fit in 64 bits", nm);
    if (empty)
        bytes = 0;
    if (json_array_size(offs) != 2 || !get_count(json_array_get(offs, 0), &sp->begin) ||
        !get_count(json_array_get(offs, 1), &sp->end))
        return say(why, cap, "tensor \"%s\": \"data_offsets\" is not [begin, end] of non-negative integers",
                   nm);
    sp->name = name;
    if (sp->end < sp->begin)
        return say(why, cap, "tensor \"%s\": data_offsets [%" PRId64 ", %" PRId64 "] end before they begin",
                   nm, sp->begin, sp->end);
    if (sp->end - sp->begin != bytes)
        return say(why, cap,
                   "tensor \"%s\": data_offsets [%" PRId64 ", %" PRId64 "] span %" PRId64
                   " bytes, but its dtype %s and shape need %" PRId64,
                   nm, sp->begin, sp->end, sp->end - sp->begin, json_string_value(dt), bytes);
    if (sp->end > data_len)
        return say(why, cap,
                   "tensor \"%s\": data_offsets [%" PRId64 ", %" PRId64
                   "] run past the data section (%" PRId64 " bytes)",
                   nm, sp->begin, sp->end, data_len);
    return true;
}

static int by_begin(const void *a, const void *b)
{
    const struct span *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* The spans, sorted, must tile [0, data_len). */
static bool check_layout(struct span *sp, size_t n, int64_t data_len, char *why, size_t cap)
{
    qsort(sp, n, sizeof *sp, by_begin);
    int64_t at = 0;
    for (size_t i = 0; i < n; i++) {
        char a[96], b[96];
        if (sp[i].begin < at)
            return say(why, cap,
                       "tensor \"%s\": data_offsets [%" PRId64 ", %" PRId64 "] overlap tensor \"%s\"",
                       termsafe_line(a, sizeof a, sp[i].name), sp[i].begin, sp[i].end,
                       termsafe_line(b, sizeof b, sp[i - 1].name));
        if (sp[i].begin > at)
            return say(why, cap, "no tensor covers bytes [%" PRId64 ", %" PRId64 ") of the data section", at,
                       sp[i].begin);
        at = sp[i].end;
    }
    if (at != data_len)
        return say(why, cap, "the data section is %" PRId64 " bytes but the tensors cover %" PRId64, data_len,
                   at);
    return true;
}

bool stcheck_fd(int fd, int64_t size, char *why, size_t cap)
{
    unsigned char len8[8];
    char *hdr = NULL;
    json_t *root = NULL;
    struct span *sp = NULL;
    bool ok = false;
    if (size < 8 || base_read_at(fd, len8, 8, 0) != 8)
        return say(why, cap, "%" PRId64 " bytes, fewer than the 8 of the header's length", size);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--)
        hl = hl << 8 | len8[i];
    if (hl > (uint64_t)(size - 8))
        return say(why, cap, "the header's length is %" PRIu64 " bytes, but only %" PRId64 " follow it", hl,
                   size - 8);
    if (hl > STCHECK_MAX_HEADER)
        return say(why, cap, "the header's length is %" PRIu64 " bytes, more than the format's %d", hl,
                   STCHECK_MAX_HEADER);
    int64_t data_len = size - 8 - (int64_t)hl;
    if (!(hdr = malloc(hl + 1))) {
        say(why, cap, "out of memory for a header of %" PRIu64 " bytes", hl);
        goto out;
    }
    errno = 0;
    if (base_read_at(fd, hdr, (int64_t)hl, 8) != (int64_t)hl) {
        say(why, cap, "cannot read the header: %s", errno ? strerror(errno) : "the file is shorter");
        goto out;
    }
    json_error_t je;
    if (!(root = json_loadb(hdr, hl, JSON_REJECT_DUPLICATES, &je)) || !json_is_object(root)) {
        char t[160];
        if (root)
            say(why, cap, "the header is not a JSON object");
        else
            say(why, cap, "the header is not JSON: %s (at byte %d of the file)",
                termsafe_line(t, sizeof t, je.text), 8 + je.position);
        goto out;
    }
    if (!(sp = calloc(json_object_size(root) + 1, sizeof *sp))) {
        say(why, cap, "out of memory");
        goto out;
    }
    size_t n = 0;
    const char *key;
    json_t *v;
    json_object_foreach (root, key, v) {
        if (!strcmp(key, "__metadata__")) {
            const char *mk;
            json_t *mv;
            if (!json_is_object(v)) {
                say(why, cap, "\"__metadata__\" is not an object");
                goto out;
            }
            json_object_foreach (v, mk, mv)
                if (!json_is_string(mv)) {
                    char m[96];
                    say(why, cap, "\"__metadata__\": the value of \"%s\" is not a string",
                        termsafe_line(m, sizeof m, mk));
                    goto out;
                }
            continue;
        }
        if (!check_entry(key, v, data_len, &sp[n], why, cap))
            goto out;
        n++;
    }
    ok = check_layout(sp, n, data_len, why, cap);
out:
    free(sp);
    json_decref(root);
    free(hdr);
    return ok;
}
