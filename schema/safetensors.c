/* safetensors.c — the safetensors format of CONTRACT.md §4: an 8-byte little-endian header
 * length, a JSON header, raw little-endian data. Writes are atomic (temporary file, fsync,
 * rename, fsync of the directory). Knows nothing of models or optimizers, and trusts
 * nothing it reads: every length, offset and shape is checked before it is used. Linked
 * by the worker and the server (schema/). */
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../base/file.h"

#define SAFETENSORS_MAX_FILE (64LL << 30)
#define IO_CHUNK             (1 << 20)

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define HOST_LE 1
#else
#define HOST_LE 0
#endif

struct safetensors_file {
    int n;
    struct safetensors_tensor *t; /* [n], in the header's order */
    float *block;                 /* every tensor's data */
    json_t *root;                 /* the header; "__metadata__" strings are borrowed from it */
    json_t *meta;
};

/* Sets `err` to "<path>: <message>" with `path` also as the error's path. */
static ddpd_err fail(struct ddpd_error *err, ddpd_err code, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static ddpd_err fail(struct ddpd_error *err, ddpd_err code, const char *path, const char *fmt, ...)
{
    char msg[640];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return ddpd_error_set(err, code, path, "%s: %s", path, msg);
}

void safetensors_shape_text(char *out, size_t cap, int ndim, const int64_t *shape)
{
    size_t o = (size_t)snprintf(out, cap, "[");
    for (int i = 0; i < ndim && o < cap; i++)
        o += (size_t)snprintf(out + o, cap - o, i ? ", %" PRId64 : "%" PRId64, shape[i]);
    if (o < cap)
        snprintf(out + o, cap - o, "]");
}

/* numel of a shape, false on overflow. */
static bool shape_numel(int ndim, const int64_t *shape, int64_t *numel)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0 || __builtin_mul_overflow(n, shape[i], &n))
            return false;
    }
    *numel = n;
    return true;
}

/* ---- writing ---- */

static int by_name(const void *a, const void *b)
{
    const struct safetensors_tensor *x = *(const struct safetensors_tensor *const *)a;
    const struct safetensors_tensor *y = *(const struct safetensors_tensor *const *)b;
    return strcmp(x->name, y->name);
}

/* Writes n floats little-endian. */
static bool put_f32(FILE *fp, const float *v, int64_t n)
{
    if (HOST_LE)
        return n == 0 || fwrite(v, sizeof(float), (size_t)n, fp) == (size_t)n;
    unsigned char buf[4096];
    for (int64_t i = 0; i < n;) {
        int64_t k = 0;
        for (; k < (int64_t)sizeof buf / 4 && i < n; k++, i++) {
            uint32_t u;
            memcpy(&u, &v[i], 4);
            for (int j = 0; j < 4; j++)
                buf[4 * k + j] = (unsigned char)(u >> (8 * j));
        }
        if (fwrite(buf, 4, (size_t)k, fp) != (size_t)k)
            return false;
    }
    return true;
}

static bool put_i64(FILE *fp, const int64_t *v, int64_t n)
{
    unsigned char buf[4096];
    for (int64_t i = 0; i < n;) {
        int64_t k = 0;
        for (; k < (int64_t)sizeof buf / 8 && i < n; k++, i++)
            for (int j = 0; j < 8; j++)
                buf[8 * k + j] = (unsigned char)((uint64_t)v[i] >> (8 * j));
        if (fwrite(buf, 8, (size_t)k, fp) != (size_t)k)
            return false;
    }
    return true;
}

/* fsyncs the directory holding `path`, so that the rename survives a crash. */
static int fsync_parent(const char *path)
{
    char dir[4096];
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else if (slash == path)
        snprintf(dir, sizeof dir, "/");
    else
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    int rc = fsync(fd);
    if (rc != 0 && errno == EINVAL) /* some file systems cannot sync a directory */
        rc = 0;
    close(fd);
    return rc;
}

/* The header JSON: "__metadata__" first, then the tensors in data order. */
static json_t *header_json(const struct safetensors_tensor **sorted, int n,
                           const struct safetensors_meta *meta, int n_meta, const char *path,
                           struct ddpd_error *err)
{
    json_t *root = json_object(), *m = NULL;
    int64_t off = 0;
    if (!root)
        goto nomem;
    if (n_meta > 0) {
        m = json_object();
        if (!m || json_object_set_new(root, "__metadata__", m) != 0)
            goto nomem;
        for (int i = 0; i < n_meta; i++) {
            json_t *v = meta[i].key && meta[i].value ? json_string(meta[i].value) : NULL;
            if (!v || json_object_set_new(m, meta[i].key, v) != 0) {
                json_decref(root);
                fail(err, DDPD_EINTERNAL, path, "metadata %d is not a UTF-8 key and value", i);
                return NULL;
            }
        }
    }
    for (int i = 0; i < n; i++) {
        const struct safetensors_tensor *t = sorted[i];
        int64_t numel = 0;
        shape_numel(t->ndim, t->shape, &numel);
        json_t *e = json_object(), *shape = json_array(), *offs = json_array();
        if (!e || !shape || !offs) {
            json_decref(e);
            json_decref(shape);
            json_decref(offs);
            goto nomem;
        }
        const int64_t size = t->i64 ? 8 : 4;
        json_object_set_new(e, "dtype", json_string(t->i64 ? "I64" : "F32"));
        json_object_set_new(e, "shape", shape);
        json_object_set_new(e, "data_offsets", offs);
        for (int d = 0; d < t->ndim; d++)
            json_array_append_new(shape, json_integer(t->shape[d]));
        json_array_append_new(offs, json_integer(off));
        json_array_append_new(offs, json_integer(off + numel * size));
        off += numel * size;
        if (json_object_set_new(root, t->name, e) != 0) {
            json_decref(root);
            fail(err, DDPD_EINTERNAL, path, "tensor name \"%s\" is not UTF-8", t->name);
            return NULL;
        }
    }
    return root;
nomem:
    json_decref(root);
    fail(err, DDPD_ENOMEM, path, "out of memory building the header");
    return NULL;
}

ddpd_err safetensors_header(const char *path, const struct safetensors_tensor *t, int n,
                            const struct safetensors_meta *meta, int n_meta, char **out, size_t *len,
                            int *order, struct ddpd_error *err)
{
    const struct safetensors_tensor **sorted = NULL;
    json_t *root = NULL;
    char *hdr = NULL;
    ddpd_err rc = DDPD_OK;
    int64_t total = 0;

    *out = NULL;
    *len = 0;
    if (n < 0 || n_meta < 0 || (n > 0 && !t) || (n_meta > 0 && !meta))
        return fail(err, DDPD_EINTERNAL, path, "bad arguments to safetensors_write");
    for (int i = 0; i < n; i++) {
        int64_t numel;
        if (!memchr(t[i].name, '\0', sizeof t[i].name) || !t[i].name[0] ||
            strcmp(t[i].name, "__metadata__") == 0 || t[i].ndim < 0 || t[i].ndim > SAFETENSORS_MAX_DIMS ||
            !shape_numel(t[i].ndim, t[i].shape, &numel) || (numel > 0 && !t[i].data && !t[i].i64) ||
            numel > (INT64_MAX - total) / 8)
            return fail(err, DDPD_EINTERNAL, path, "tensor %d is not a valid tensor", i);
        total += numel * (t[i].i64 ? 8 : 4);
    }
    sorted = malloc((size_t)(n > 0 ? n : 1) * sizeof *sorted);
    if (!sorted) {
        rc = fail(err, DDPD_ENOMEM, path, "out of memory");
        goto out;
    }
    for (int i = 0; i < n; i++)
        sorted[i] = &t[i];
    qsort(sorted, (size_t)n, sizeof *sorted, by_name);
    for (int i = 1; i < n; i++)
        if (strcmp(sorted[i - 1]->name, sorted[i]->name) == 0) {
            rc = fail(err, DDPD_EINTERNAL, path, "tensor \"%s\" is given twice", sorted[i]->name);
            goto out;
        }
    root = header_json(sorted, n, meta, n_meta, path, err);
    if (!root) {
        rc = err ? err->code : DDPD_ENOMEM;
        goto out;
    }
    hdr = json_dumps(root, JSON_COMPACT);
    /* The reference implementation pads the header with spaces to a multiple of 8 so
     * that the data that follows is aligned. */
    size_t hl = hdr ? strlen(hdr) : 0, pad = (8 - hl % 8) % 8;
    uint64_t padded = hl + pad;
    if (!hdr || !(*out = malloc(8 + padded))) {
        rc = fail(err, DDPD_ENOMEM, path, "out of memory building the header");
        goto out;
    }
    for (int i = 0; i < 8; i++)
        (*out)[i] = (char)(unsigned char)(padded >> (8 * i));
    memcpy(*out + 8, hdr, hl);
    memset(*out + 8 + hl, ' ', pad);
    *len = 8 + padded;
    for (int i = 0; i < n; i++)
        order[i] = (int)(sorted[i] - t);
out:
    free(hdr);
    json_decref(root);
    free(sorted);
    return rc;
}

ddpd_err safetensors_write(const char *path, const struct safetensors_tensor *t, int n,
                           const struct safetensors_meta *meta, int n_meta, struct ddpd_error *err)
{
    int *order = NULL;
    char *hdr = NULL, tmp[4096];
    size_t hl = 0;
    FILE *fp = NULL;
    bool made_tmp = false;
    ddpd_err rc = DDPD_OK;

    int tl = snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    if (tl < 0 || (size_t)tl >= sizeof tmp)
        return fail(err, DDPD_EIO, path, "path is too long");
    if (!(order = malloc((size_t)(n > 0 ? n : 1) * sizeof *order)))
        return fail(err, DDPD_ENOMEM, path, "out of memory");
    if ((rc = safetensors_header(path, t, n, meta, n_meta, &hdr, &hl, order, err)))
        goto out;

    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600); /* weights are the owner's */
    if (fd < 0)
        goto io;
    made_tmp = true;
    fp = fdopen(fd, "wb");
    if (!fp) {
        close(fd);
        goto io;
    }
    if (fwrite(hdr, 1, hl, fp) != hl)
        goto io;
    for (int i = 0; i < n; i++) {
        const struct safetensors_tensor *x = &t[order[i]];
        int64_t numel = 0;
        shape_numel(x->ndim, x->shape, &numel);
        if (x->i64 ? !put_i64(fp, x->i64, numel) : !put_f32(fp, x->data, numel))
            goto io;
    }
    if (fflush(fp) != 0 || fsync(fileno(fp)) != 0)
        goto io;
    int cr = fclose(fp);
    fp = NULL;
    if (cr != 0 || rename(tmp, path) != 0)
        goto io;
    made_tmp = false;
    if (fsync_parent(path) != 0)
        goto io;
    goto out;
io:
    rc = fail(err, DDPD_EIO, path, "cannot write: %s", strerror(errno));
out:
    if (fp)
        fclose(fp);
    if (made_tmp)
        unlink(tmp);
    free(hdr);
    free(order);
    return rc;
}

/* ---- reading ---- */

struct dtype {
    const char *name;
    int size;
};

/* BOOL and U8 come as 0/1 and 0..255 (the causal mask buffers some GPT-2 files carry). */
static const struct dtype dtypes[] = {{"F32", 4}, {"F64", 8},  {"F16", 2}, {"BF16", 2},
                                      {"I64", 8}, {"BOOL", 1}, {"U8", 1}};

/* What safetensors_read learns of one tensor before reading its data. */
struct entry {
    int index; /* into safetensors_file.t */
    int64_t begin, end, numel;
    const struct dtype *dt;
};

static float f16_to_f32(uint16_t h)
{
    int exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    float v;
    if (exp == 0)
        v = ldexpf((float)man, -24);
    else if (exp == 31)
        v = man ? NAN : INFINITY;
    else
        v = ldexpf((float)(man | 0x400), exp - 25);
    return (h & 0x8000) ? -v : v;
}

static float f64_to_f32(double d)
{
    /* As an IEEE cast rounds, without C's undefined behaviour beyond FLT_MAX. */
    if (d >= 0x1.ffffffp+127)
        return INFINITY;
    if (d <= -0x1.ffffffp+127)
        return -INFINITY;
    return (float)d;
}

static void convert(const struct dtype *dt, const unsigned char *p, float *out, int64_t n)
{
    for (int64_t i = 0; i < n; i++, p += dt->size) {
        uint64_t bits = 0;
        for (int j = dt->size - 1; j >= 0; j--)
            bits = bits << 8 | p[j];
        if (dt->name[0] == 'I') {
            out[i] = (float)(int64_t)bits;
        } else if (dt->size == 1) {
            out[i] = (float)bits;
        } else if (dt->size == 8) {
            double d;
            memcpy(&d, &bits, 8);
            out[i] = f64_to_f32(d);
        } else if (dt->size == 4) {
            uint32_t u = (uint32_t)bits;
            memcpy(&out[i], &u, 4);
        } else if (dt->name[0] == 'B') {
            uint32_t u = (uint32_t)bits << 16;
            memcpy(&out[i], &u, 4);
        } else {
            out[i] = f16_to_f32((uint16_t)bits);
        }
    }
}

static bool get_i64(json_t *v, int64_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return false;
    *out = json_integer_value(v);
    return true;
}

/* Checks one header entry and fills the tensor's name and shape. */
static ddpd_err parse_entry(const char *path, const char *name, json_t *v, int64_t data_len,
                            struct safetensors_tensor *t, struct entry *e, struct ddpd_error *err)
{
    char sh[128];
    if (strlen(name) >= sizeof t->name)
        return fail(err, DDPD_EDATA, path, "tensor name \"%.64s...\" is longer than %zu bytes", name,
                    sizeof t->name - 1);
    snprintf(t->name, sizeof t->name, "%s", name);
    if (!json_is_object(v))
        return fail(err, DDPD_EDATA, path, "tensor \"%s\": expected an object", name);
    json_t *dt = json_object_get(v, "dtype"), *shape = json_object_get(v, "shape"),
           *offs = json_object_get(v, "data_offsets");
    if (!json_is_string(dt))
        return fail(err, DDPD_EDATA, path, "tensor \"%s\": \"dtype\" is missing or not a string", name);
    e->dt = NULL;
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (strcmp(json_string_value(dt), dtypes[i].name) == 0)
            e->dt = &dtypes[i];
    if (!e->dt)
        return fail(
            err, DDPD_EDATA, path,
            "tensor \"%s\": dtype \"%.32s\" is not supported (F32, F64, F16, BF16, I64, BOOL and U8 are)",
            name, json_string_value(dt));
    t->was_i64 = e->dt->name[0] == 'I';
    t->dtype = e->dt->name;
    if (!json_is_array(shape))
        return fail(err, DDPD_EDATA, path, "tensor \"%s\": \"shape\" is missing or not an array", name);
    if (json_array_size(shape) > SAFETENSORS_MAX_DIMS)
        return fail(err, DDPD_EDATA, path, "tensor \"%s\": %zu dimensions (at most %d are supported)", name,
                    json_array_size(shape), SAFETENSORS_MAX_DIMS);
    t->ndim = (int)json_array_size(shape);
    for (int d = 0; d < t->ndim; d++)
        if (!get_i64(json_array_get(shape, (size_t)d), &t->shape[d]))
            return fail(err, DDPD_EDATA, path, "tensor \"%s\": shape entries must be non-negative integers",
                        name);
    if (!json_is_array(offs) || json_array_size(offs) != 2 || !get_i64(json_array_get(offs, 0), &e->begin) ||
        !get_i64(json_array_get(offs, 1), &e->end))
        return fail(err, DDPD_EDATA, path,
                    "tensor \"%s\": \"data_offsets\" must be [begin, end] of non-negative integers", name);
    safetensors_shape_text(sh, sizeof sh, t->ndim, t->shape);
    int64_t bytes;
    if (!shape_numel(t->ndim, t->shape, &e->numel) ||
        __builtin_mul_overflow(e->numel, (int64_t)e->dt->size, &bytes))
        return fail(err, DDPD_EDATA, path, "tensor \"%s\": shape %s is too large", name, sh);
    if (e->end < e->begin || e->end - e->begin != bytes)
        return fail(err, DDPD_EDATA, path,
                    "tensor \"%s\": data_offsets [%" PRId64 ", %" PRId64
                    "] do not match shape %s of %s (%" PRId64 " bytes expected)",
                    name, e->begin, e->end, sh, e->dt->name, bytes);
    if (e->end > data_len)
        return fail(err, DDPD_EDATA, path,
                    "tensor \"%s\": data_offsets [%" PRId64 ", %" PRId64
                    "] run past the end of the data (%" PRId64 " bytes)",
                    name, e->begin, e->end, data_len);
    return DDPD_OK;
}

static int by_offset(const void *a, const void *b)
{
    const struct entry *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return x->index - y->index;
}

/* The tensors must tile the data section: no overlaps, no gaps, nothing left over (as the
 * reference implementation checks). `e` is sorted by offset. */
static ddpd_err check_layout(const char *path, const struct safetensors_file *f, const struct entry *e, int n,
                             int64_t data_len, struct ddpd_error *err)
{
    int64_t at = 0;
    for (int i = 0; i < n; i++) {
        if (e[i].begin < at)
            return fail(err, DDPD_EDATA, path,
                        "tensor \"%s\": data_offsets [%" PRId64 ", %" PRId64 "] overlap tensor \"%s\"",
                        f->t[e[i].index].name, e[i].begin, e[i].end, f->t[e[i - 1].index].name);
        if (e[i].begin > at)
            return fail(err, DDPD_EDATA, path,
                        "tensor \"%s\": data_offsets [%" PRId64 ", %" PRId64
                        "] leave a gap: no tensor covers bytes [%" PRId64 ", %" PRId64 ")",
                        f->t[e[i].index].name, e[i].begin, e[i].end, at, e[i].begin);
        at = e[i].end;
    }
    if (at != data_len)
        return fail(err, DDPD_EDATA, path,
                    "the data section is %" PRId64 " bytes but the tensors cover only %" PRId64, data_len,
                    at);
    return DDPD_OK;
}

static struct safetensors_file *read_file(int fd_in, const char *path, bool values, struct ddpd_error *err);

struct safetensors_file *safetensors_read(const char *path, struct ddpd_error *err)
{
    return safetensors_read_fd(open(path, O_RDONLY | O_CLOEXEC), path, err);
}

struct safetensors_file *safetensors_read_header(const char *path, struct ddpd_error *err)
{
    return read_file(open(path, O_RDONLY | O_CLOEXEC), path, false, err);
}

struct safetensors_file *safetensors_read_fd(int fd_in, const char *path, struct ddpd_error *err)
{
    return read_file(fd_in, path, true, err);
}

/* Steals fd_in (-1: the open failed, with errno). */
static struct safetensors_file *read_file(int fd_in, const char *path, bool values, struct ddpd_error *err)
{
    int open_errno = errno;
    struct safetensors_file *f = NULL;
    struct entry *e = NULL;
    unsigned char *chunk = NULL, len8[8];
    char *hdr = NULL;
    int fd = fd_in;
    ddpd_err rc = DDPD_OK;
    struct stat st;

    f = calloc(1, sizeof *f);
    if (!f) {
        rc = fail(err, DDPD_ENOMEM, path, "out of memory");
        goto out;
    }
    errno = open_errno;
    if (fd < 0 || fstat(fd, &st) != 0) {
        rc = fail(err, DDPD_EDATA, path, "cannot open: %s", strerror(errno));
        goto out;
    }
    int64_t size = (int64_t)st.st_size;
    if (!S_ISREG(st.st_mode)) {
        rc = fail(err, DDPD_EDATA, path, "not a regular file");
        goto out;
    }
    if (size > SAFETENSORS_MAX_FILE) {
        rc = fail(err, DDPD_EDATA, path, "too large: %" PRId64 " bytes (the limit is %lld GiB)", size,
                  SAFETENSORS_MAX_FILE >> 30);
        goto out;
    }
    if (size < 8 || base_read_at(fd, len8, 8, 0) != 8) {
        rc = fail(err, DDPD_EDATA, path,
                  "truncated: the file is %" PRId64 " bytes, shorter than the 8-byte header length", size);
        goto out;
    }
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--)
        hl = hl << 8 | len8[i];
    if (hl > SAFETENSORS_MAX_HEADER) {
        rc = fail(err, DDPD_EDATA, path, "header length %" PRIu64 " is too large (the limit is %d bytes)", hl,
                  SAFETENSORS_MAX_HEADER);
        goto out;
    }
    if ((int64_t)hl > size - 8) {
        rc = fail(err, DDPD_EDATA, path,
                  "truncated: the header length is %" PRIu64 " bytes but only %" PRId64 " bytes follow it",
                  hl, size - 8);
        goto out;
    }
    int64_t data_len = size - 8 - (int64_t)hl;
    hdr = malloc(hl + 1);
    if (!hdr) {
        rc = fail(err, DDPD_ENOMEM, path, "out of memory");
        goto out;
    }
    if (base_read_at(fd, hdr, (int64_t)hl, 8) != (int64_t)hl) {
        rc = fail(err, DDPD_EDATA, path, "cannot read the header: %s", strerror(errno));
        goto out;
    }
    json_error_t jerr;
    f->root = json_loadb(hdr, hl, JSON_REJECT_DUPLICATES, &jerr);
    if (!f->root) {
        rc = fail(err, DDPD_EDATA, path, "the header is not valid JSON: %s (at byte %d)", jerr.text,
                  8 + jerr.position);
        goto out;
    }
    if (!json_is_object(f->root)) {
        rc = fail(err, DDPD_EDATA, path, "the header is not a JSON object");
        goto out;
    }

    size_t cap = json_object_size(f->root);
    f->t = calloc(cap + 1, sizeof *f->t);
    e = calloc(cap + 1, sizeof *e);
    if (!f->t || !e) {
        rc = fail(err, DDPD_ENOMEM, path, "out of memory");
        goto out;
    }
    const char *key;
    json_t *v;
    json_object_foreach (f->root, key, v) {
        if (strcmp(key, "__metadata__") == 0) {
            const char *mk;
            json_t *mv;
            if (!json_is_object(v)) {
                rc = fail(err, DDPD_EDATA, path, "\"__metadata__\" is not an object");
                goto out;
            }
            json_object_foreach (v, mk, mv) {
                if (!json_is_string(mv)) {
                    rc = fail(err, DDPD_EDATA, path, "\"__metadata__\" value of \"%.64s\" is not a string",
                              mk);
                    goto out;
                }
            }
            f->meta = v;
            continue;
        }
        e[f->n].index = f->n;
        if ((rc = parse_entry(path, key, v, data_len, &f->t[f->n], &e[f->n], err)))
            goto out;
        f->n++;
    }
    qsort(e, (size_t)f->n, sizeof *e, by_offset);
    if ((rc = check_layout(path, f, e, f->n, data_len, err)))
        goto out;
    for (int i = 0; i < f->n; i++)
        f->t[e[i].index].file_offset = 8 + (int64_t)hl + e[i].begin;

    if (!values)
        goto out;
    /* The floats: numel of each tensor (at most 4 times the data section). */
    int64_t total = 0;
    for (int i = 0; i < f->n; i++)
        total += e[i].numel;
    f->block = malloc((size_t)(total > 0 ? total : 1) * sizeof(float));
    chunk = malloc(IO_CHUNK);
    if (!f->block || !chunk) {
        rc = fail(err, DDPD_ENOMEM, path, "out of memory for %" PRId64 " values", total);
        goto out;
    }
    int64_t at = 0;
    for (int i = 0; i < f->n; i++) {
        struct safetensors_tensor *t = &f->t[e[i].index];
        const struct dtype *dt = e[i].dt;
        int64_t off = 8 + (int64_t)hl + e[i].begin, per = IO_CHUNK / dt->size;
        t->data = f->block + at;
        at += e[i].numel;
        for (int64_t done = 0; done < e[i].numel;) {
            int64_t k = e[i].numel - done < per ? e[i].numel - done : per;
            errno = 0;
            if (HOST_LE && dt->size == 4) {
                if (base_read_at(fd, t->data + done, k * 4, off + done * 4) != k * 4)
                    goto short_read;
            } else {
                if (base_read_at(fd, chunk, k * dt->size, off + done * dt->size) != k * dt->size)
                    goto short_read;
                convert(dt, chunk, t->data + done, k);
            }
            done += k;
        }
    }
    goto out;
short_read:
    rc = fail(err, DDPD_EDATA, path, "cannot read the data: %s",
              errno ? strerror(errno) : "the file shrank while reading");
out:
    free(chunk);
    free(e);
    free(hdr);
    if (fd >= 0)
        close(fd);
    if (rc) {
        safetensors_free(f);
        return NULL;
    }
    return f;
}

void safetensors_free(struct safetensors_file *f)
{
    if (!f)
        return;
    free(f->t);
    free(f->block);
    json_decref(f->root);
    free(f);
}

int safetensors_count(const struct safetensors_file *f)
{
    return f->n;
}

const struct safetensors_tensor *safetensors_at(const struct safetensors_file *f, int i)
{
    return i >= 0 && i < f->n ? &f->t[i] : NULL;
}

const struct safetensors_tensor *safetensors_get(const struct safetensors_file *f, const char *name)
{
    for (int i = 0; i < f->n; i++)
        if (strcmp(f->t[i].name, name) == 0)
            return &f->t[i];
    return NULL;
}

const char *safetensors_meta_get(const struct safetensors_file *f, const char *key)
{
    return f->meta ? json_string_value(json_object_get(f->meta, key)) : NULL;
}
