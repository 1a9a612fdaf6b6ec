/* data/npy.c — the .npy reader of the data sets (CONTRACT.md §2): the header's Python
 * literal, the shape and dtype checks against the model, and the values as float32 rows or
 * int32 class ids. Every size read from the header is checked before it is used. */
#include "data_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../base/file.h"

#define NPY_MAX_HEADER (64 * 1024)
#define NPY_MAX_DIMS   8
/* Class ids the planner reads before a job is accepted (it answers within 30 s); larger
 * label files are checked by the ranks as they load them. */
#define DATA_MAX_CHECK (1LL << 30)
#define IO_CHUNK       (1 << 20)
/* Files with more bytes of values than this are memory-mapped, not loaded. */
#define DATA_MAP_MIN (64LL << 20)

/* ---- .npy ---- */

struct npy {
    char descr[32];
    char order; /* '<', '>', '|', '=' */
    char kind;  /* 'f', 'i', 'u', ... */
    int size;   /* bytes per value */
    bool fortran;
    int ndim;
    int64_t shape[NPY_MAX_DIMS];
    int64_t data_off; /* first byte of the data */
    int64_t numel;
};

/* A cursor over the header's Python literal; `base` is the header's offset in the file. */
struct lit {
    const char *p, *start, *end;
    int64_t base;
};

static void lit_ws(struct lit *l)
{
    while (l->p < l->end && (*l->p == ' ' || *l->p == '\t' || *l->p == '\n' || *l->p == '\r'))
        l->p++;
}

static int64_t lit_off(const struct lit *l)
{
    return l->base + (l->p - l->start);
}

static ddpd_err lit_fail(struct lit *l, const char *name, const char *what, struct ddpd_error *err)
{
    return data__fail(err, DDPD_EDATA, name, "bad .npy header at byte %" PRId64 ": %s", lit_off(l), what);
}

/* A quoted string without escapes (all .npy header strings are). */
static ddpd_err lit_str(struct lit *l, char *out, size_t cap, const char *name, struct ddpd_error *err)
{
    lit_ws(l);
    if (l->p >= l->end || (*l->p != '\'' && *l->p != '"'))
        return lit_fail(l, name, "expected a quoted string", err);
    char q = *l->p++;
    size_t n = 0;
    while (l->p < l->end && *l->p != q) {
        if (*l->p == '\\' || n + 1 >= cap)
            return lit_fail(l, name, "unsupported string", err);
        out[n++] = *l->p++;
    }
    if (l->p >= l->end)
        return lit_fail(l, name, "unterminated string", err);
    l->p++;
    out[n] = '\0';
    return DDPD_OK;
}

static bool lit_word(struct lit *l, const char *w)
{
    size_t n = strlen(w);
    if ((size_t)(l->end - l->p) >= n && memcmp(l->p, w, n) == 0) {
        l->p += n;
        return true;
    }
    return false;
}

/* A shape tuple: "()", "(3,)", "(3, 4)", also Python 2's "(3L, 4L)". */
static ddpd_err lit_shape(struct lit *l, struct npy *h, const char *name, struct ddpd_error *err)
{
    lit_ws(l);
    if (l->p >= l->end || *l->p != '(')
        return lit_fail(l, name, "'shape' must be a tuple", err);
    l->p++;
    h->ndim = 0;
    for (;;) {
        lit_ws(l);
        if (l->p < l->end && *l->p == ')') {
            l->p++;
            return DDPD_OK;
        }
        if (l->p >= l->end || *l->p < '0' || *l->p > '9')
            return lit_fail(l, name, "expected a non-negative integer in 'shape'", err);
        if (h->ndim == NPY_MAX_DIMS)
            return lit_fail(l, name, "too many dimensions in 'shape'", err);
        int64_t v = 0;
        while (l->p < l->end && *l->p >= '0' && *l->p <= '9') {
            if (v > (INT64_MAX - 9) / 10)
                return lit_fail(l, name, "dimension too large", err);
            v = v * 10 + (*l->p++ - '0');
        }
        if (l->p < l->end && *l->p == 'L')
            l->p++;
        h->shape[h->ndim++] = v;
        lit_ws(l);
        if (l->p < l->end && *l->p == ',')
            l->p++;
        else if (l->p >= l->end || *l->p != ')')
            return lit_fail(l, name, "expected ',' or ')' in 'shape'", err);
    }
}

/* Parses the header dict {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }. */
static ddpd_err npy_dict(struct lit *l, struct npy *h, const char *name, struct ddpd_error *err)
{
    bool seen_descr = false, seen_order = false, seen_shape = false;
    ddpd_err rc;
    lit_ws(l);
    if (l->p >= l->end || *l->p != '{')
        return lit_fail(l, name, "expected '{'", err);
    l->p++;
    for (;;) {
        char key[32];
        lit_ws(l);
        if (l->p < l->end && *l->p == '}') {
            l->p++;
            break;
        }
        if ((rc = lit_str(l, key, sizeof key, name, err)))
            return rc;
        lit_ws(l);
        if (l->p >= l->end || *l->p != ':')
            return lit_fail(l, name, "expected ':'", err);
        l->p++;
        lit_ws(l);
        if (strcmp(key, "descr") == 0 && !seen_descr) {
            seen_descr = true;
            if (l->p < l->end && (*l->p == '[' || *l->p == '{'))
                return data__fail(err, DDPD_EDATA, name,
                                  "structured arrays are not supported (a plain numeric array is)");
            if ((rc = lit_str(l, h->descr, sizeof h->descr, name, err)))
                return rc;
        } else if (strcmp(key, "fortran_order") == 0 && !seen_order) {
            seen_order = true;
            if (lit_word(l, "True"))
                h->fortran = true;
            else if (lit_word(l, "False"))
                h->fortran = false;
            else
                return lit_fail(l, name, "'fortran_order' must be True or False", err);
        } else if (strcmp(key, "shape") == 0 && !seen_shape) {
            seen_shape = true;
            if ((rc = lit_shape(l, h, name, err)))
                return rc;
        } else {
            return data__fail(err, DDPD_EDATA, name,
                              "bad .npy header at byte %" PRId64 ": unexpected or repeated key '%s'",
                              lit_off(l), key);
        }
        lit_ws(l);
        if (l->p < l->end && *l->p == ',')
            l->p++;
        else if (l->p >= l->end || *l->p != '}')
            return lit_fail(l, name, "expected ',' or '}'", err);
    }
    lit_ws(l);
    if (l->p != l->end)
        return lit_fail(l, name, "unexpected text after the header dict", err);
    if (!seen_descr || !seen_order || !seen_shape)
        return data__fail(err, DDPD_EDATA, name, "bad .npy header: missing '%s'",
                          !seen_descr   ? "descr"
                          : !seen_order ? "fortran_order"
                                        : "shape");
    return DDPD_OK;
}

static const char *npy_type_name(const struct npy *h)
{
    static const struct {
        char kind;
        int size;
        const char *name;
    } names[] = {{'f', 4, "float32"}, {'f', 8, "float64"}, {'i', 1, "int8"},  {'i', 2, "int16"},
                 {'i', 4, "int32"},   {'i', 8, "int64"},   {'u', 1, "uint8"}, {'u', 2, "uint16"},
                 {'u', 4, "uint32"},  {'u', 8, "uint64"}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (names[i].kind == h->kind && names[i].size == h->size)
            return names[i].name;
    return h->descr;
}

/* Reads and checks the preamble and header of an open .npy file: everything but the
 * values. Checks the data is all there. */
static ddpd_err npy_header(const struct dfile *f, struct npy *h, struct ddpd_error *err)
{
    unsigned char pre[12];
    char *text = NULL;
    ddpd_err rc;
    memset(h, 0, sizeof *h);
    int64_t got = base_read_at(f->fd, pre, sizeof pre, 0);
    if (got < 0)
        return data__fail(err, DDPD_EDATA, f->name, "cannot read: %s", strerror(errno));
    if (got < 8 || memcmp(pre, "\x93NUMPY", 6) != 0)
        return data__fail(err, DDPD_EDATA, f->name,
                          "not a .npy file (it does not start with \"\\x93NUMPY\")");
    if (pre[6] < 1 || pre[6] > 3 || pre[7] != 0)
        return data__fail(err, DDPD_EDATA, f->name, "unsupported .npy version %d.%d (1.0 and 2.0 are)",
                          pre[6], pre[7]);
    int64_t pl = pre[6] == 1 ? 10 : 12, hl;
    if (got < pl)
        return data__fail(err, DDPD_EDATA, f->name,
                          "truncated header: the file is %" PRId64 " bytes, shorter than the %" PRId64
                          "-byte .npy preamble",
                          f->size, pl);
    if (pre[6] == 1)
        hl = (int64_t)pre[8] | (int64_t)pre[9] << 8;
    else
        hl = (int64_t)pre[8] | (int64_t)pre[9] << 8 | (int64_t)pre[10] << 16 | (int64_t)pre[11] << 24;
    if (hl > NPY_MAX_HEADER)
        return data__fail(err, DDPD_EDATA, f->name, "header too large: %" PRId64 " bytes (the limit is %d)",
                          hl, NPY_MAX_HEADER);
    if (pl + hl > f->size)
        return data__fail(err, DDPD_EDATA, f->name,
                          "truncated header: the header says it is %" PRId64
                          " bytes but the file ends at byte %" PRId64,
                          hl, f->size);
    text = malloc((size_t)hl + 1);
    if (!text)
        return data__fail(err, DDPD_ENOMEM, f->name, "out of memory reading the header");
    errno = 0;
    if (base_read_at(f->fd, text, hl, pl) != hl) {
        rc = data__fail(err, DDPD_EDATA, f->name, "cannot read the header: %s",
                        errno ? strerror(errno) : "short read");
        goto out;
    }
    struct lit l = {text, text, text + hl, pl};
    if ((rc = npy_dict(&l, h, f->name, err)))
        goto out;

    /* descr: byte order, kind, size, e.g. "<f4", "|i1". */
    const char *d = h->descr;
    size_t dl = strlen(d);
    h->order = dl ? d[0] : 0;
    h->kind = dl > 1 ? d[1] : 0;
    h->size = 0;
    if (dl == 3 && d[2] >= '1' && d[2] <= '8')
        h->size = d[2] - '0';
    bool known = (h->kind == 'f' && (h->size == 4 || h->size == 8)) ||
                 ((h->kind == 'i' || h->kind == 'u') &&
                  (h->size == 1 || h->size == 2 || h->size == 4 || h->size == 8));
    bool le = h->order == '<' || (h->order == '|' && h->size == 1);
    if (known && h->order == '>' && h->size > 1) {
        rc = data__fail(err, DDPD_EDATA, f->name,
                        "dtype '%s' is big-endian; save it little-endian (arr.astype('<%c%d'))", d, h->kind,
                        h->size);
        goto out;
    }
    if (!known || !le) {
        rc = data__fail(err, DDPD_EDATA, f->name, "unsupported dtype '%s'", d);
        goto out;
    }
    if (h->fortran) {
        rc = data__fail(err, DDPD_EDATA, f->name,
                        "fortran_order is True; save a C-ordered array (np.ascontiguousarray)");
        goto out;
    }
    h->data_off = pl + hl;
    int64_t avail = f->size - h->data_off, bytes = 0;
    bool zero = false, over = false;
    h->numel = 1;
    for (int i = 0; i < h->ndim; i++)
        zero |= h->shape[i] == 0;
    for (int i = 0; i < h->ndim && !zero && !over; i++)
        over = __builtin_mul_overflow(h->numel, h->shape[i], &h->numel);
    if (zero)
        h->numel = 0;
    over = over || __builtin_mul_overflow(h->numel, (int64_t)h->size, &bytes);
    if (over) {
        rc = data__fail(err, DDPD_EDATA, f->name,
                        "truncated: the header's shape is larger than the %" PRId64
                        " bytes that follow the header at offset %" PRId64,
                        avail, h->data_off);
        goto out;
    }
    if (bytes > avail) {
        rc = data__fail(err, DDPD_EDATA, f->name,
                        "truncated: header says %" PRId64 " %s values (%" PRId64 " bytes) but only %" PRId64
                        " bytes follow the header at offset %" PRId64,
                        h->numel, npy_type_name(h), bytes, avail, h->data_off);
        goto out;
    }
    rc = DDPD_OK;
out:
    free(text);
    return rc;
}

static void shape_text(char *out, size_t cap, const struct npy *h)
{
    size_t o = 0;
    o += (size_t)snprintf(out, cap, "(");
    for (int i = 0; i < h->ndim && o < cap; i++)
        o += (size_t)snprintf(out + o, cap - o, i ? ", %" PRId64 : "%" PRId64, h->shape[i]);
    if (o < cap)
        snprintf(out + o, cap - o, h->ndim == 1 ? ",)" : ")");
}

enum npy_role { NPY_X, NPY_Y_MSE, NPY_Y_CE };

/* The sample shape of an .npy array (its shape after N) against `want`: equal, or a 1-D
 * array for a sample of one value. */
static bool sample_shape_is(const struct npy *h, int rank, const int64_t *want)
{
    if (h->ndim == 1)
        return rank == 1 && want[0] == 1;
    if (h->ndim - 1 != rank)
        return false;
    for (int i = 0; i < rank; i++)
        if (h->shape[i + 1] != want[i])
            return false;
    return true;
}

/* Checks an .npy header's dtype and shape against its role and the model. Sets *rows.
 * `empty_ok`: zero rows are allowed (a rank's own {rank} file: that rank joins at once
 * and shadows the others, as PyTorch's DDP runs a rank without inputs). */
static ddpd_err npy_check(const struct dfile *f, const struct npy *h, enum npy_role role,
                          const struct spec *s, bool empty_ok, int64_t *rows, struct ddpd_error *err)
{
    int fi = data__first_linear(s), li = data__last_linear(s);
    int64_t in = fi >= 0 ? s->layers[fi].in : 0, out = li >= 0 ? s->layers[li].out : 0;
    bool ids = role == NPY_X && spec_input_ids(s);
    char sh[160], want[160];
    shape_text(sh, sizeof sh, h);
    if (ids && !((h->kind == 'u' && (h->size == 1 || h->size == 2)) ||
                 (h->kind == 'i' && (h->size == 4 || h->size == 8))))
        return data__fail(err, DDPD_EDATA, f->name,
                          "dtype '%s' is not supported; x holds token ids for model[0] (embedding): "
                          "uint8 ('|u1'), uint16 ('<u2'), int32 ('<i4') or int64 ('<i8')",
                          h->descr);
    if (!ids && role != NPY_Y_CE && h->kind != 'f')
        return data__fail(err, DDPD_EDATA, f->name,
                          "dtype '%s' is not supported; %s must be float32 ('<f4') or float64 ('<f8')",
                          h->descr, role == NPY_X ? "x" : "mse targets");
    if (role == NPY_Y_CE && h->kind == 'f')
        return data__fail(err, DDPD_EDATA, f->name,
                          "dtype '%s': cross_entropy targets are integer class ids "
                          "(int32 '<i4' or int64 '<i8')",
                          h->descr);
    if (h->ndim < 1 || (h->shape[0] < 1 && !empty_ok))
        return data__fail(err, DDPD_EDATA, f->name, "no samples: shape %s", sh);
    *rows = h->shape[0];
    int64_t oshape[SPEC_MAX_RANK];
    int orank = data__out_shape(s, oshape);
    if (role == NPY_X && s->input_shape_set) {
        if (sample_shape_is(h, s->input_rank, s->input_shape))
            return DDPD_OK;
        char got[160];
        data_shape_text(want, sizeof want, s->input_rank, s->input_shape);
        data_shape_text(got, sizeof got, h->ndim - 1, h->shape + 1);
        return data__fail(err, DDPD_EDATA, f->name,
                          "x's samples have shape %s (x is %s) but input_shape is %s", got, sh, want);
    } else if (role == NPY_X) {
        if (h->ndim == 1 && in == 1)
            return DDPD_OK;
        if (h->ndim != 2)
            return data__fail(err, DDPD_EDATA, f->name,
                              "x must be 2-dimensional [N, %" PRId64 "], got shape %s", in, sh);
        if (h->shape[1] != in)
            return data__fail(err, DDPD_EDATA, f->name,
                              "x has %" PRId64 " columns but model[%d].in is %" PRId64, h->shape[1], fi, in);
    } else if (role == NPY_Y_MSE && orank > 1) {
        if (sample_shape_is(h, orank, oshape))
            return DDPD_OK;
        data_shape_text(want, sizeof want, orank, oshape);
        return data__fail(err, DDPD_EDATA, f->name,
                          "mse targets must be [N] + the model's output shape %s, got shape %s", want, sh);
    } else if (role == NPY_Y_MSE) {
        if (h->ndim == 1 && out == 1)
            return DDPD_OK;
        if (h->ndim != 2)
            return data__fail(err, DDPD_EDATA, f->name,
                              "mse targets must be 2-dimensional [N, %" PRId64 "], got shape %s", out, sh);
        if (h->shape[1] != out)
            return data__fail(err, DDPD_EDATA, f->name,
                              "y has %" PRId64 " columns but model[%d].out is %" PRId64, h->shape[1], li,
                              out);
    } else if (orank > 1) { /* sequence cross_entropy: [N, T] targets for [T, C] logits */
        if (h->ndim > 1 && sample_shape_is(h, orank - 1, oshape))
            return DDPD_OK;
        data_shape_text(want, sizeof want, orank, oshape);
        return data__fail(err, DDPD_EDATA, f->name,
                          "cross_entropy targets must be class ids of shape [N] + the model's output "
                          "shape %s without its last dimension, got shape %s",
                          want, sh);
    } else if (h->ndim != 1) {
        return data__fail(err, DDPD_EDATA, f->name,
                          "cross_entropy targets must be 1-dimensional [N] class ids, got shape %s", sh);
    }
    return DDPD_OK;
}

static uint64_t load_le(const unsigned char *p, int size)
{
    uint64_t v = 0;
    for (int i = size - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* Reads all values of an .npy file into f32[numel] (float files) or, checking each is an
 * id in [0, classes), into i32[numel] (integer files; i32 NULL only checks them). `what`
 * names the ids ("class id"); `sample` is the values per sample, for the message. */
static ddpd_err npy_values(const struct dfile *f, const struct npy *h, float *f32, int32_t *i32,
                           int64_t classes, const char *what, int64_t sample, struct ddpd_error *err)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    if (h->kind == 'f' && h->size == 4) { /* the common case needs no conversion */
        errno = 0;
        if (base_read_at(f->fd, f32, h->numel * 4, h->data_off) != h->numel * 4)
            return data__fail(err, DDPD_EDATA, f->name, "cannot read at offset %" PRId64 ": %s", h->data_off,
                              errno ? strerror(errno) : "file shrank while reading");
        return DDPD_OK;
    }
#endif
    unsigned char *buf = malloc(IO_CHUNK);
    ddpd_err rc = DDPD_OK;
    if (!buf)
        return data__fail(err, DDPD_ENOMEM, f->name, "out of memory");
    const int64_t per = IO_CHUNK / h->size;
    for (int64_t done = 0; done < h->numel;) {
        int64_t n = h->numel - done < per ? h->numel - done : per;
        int64_t off = h->data_off + done * h->size;
        errno = 0;
        if (base_read_at(f->fd, buf, n * h->size, off) != n * h->size) {
            rc = data__fail(err, DDPD_EDATA, f->name, "cannot read at offset %" PRId64 ": %s", off,
                            errno ? strerror(errno) : "file shrank while reading");
            goto out;
        }
        for (int64_t i = 0; i < n; i++) {
            const unsigned char *p = buf + i * h->size;
            uint64_t bits = load_le(p, h->size);
            if (h->kind == 'f') {
                if (h->size == 4) {
                    uint32_t b32 = (uint32_t)bits;
                    memcpy(&f32[done + i], &b32, 4);
                } else {
                    double dv;
                    memcpy(&dv, &bits, 8);
                    f32[done + i] = data__to_f32(dv);
                }
                continue;
            }
            int64_t v;
            bool neg = false;
            if (h->kind == 'i') {
                int sh = 64 - 8 * h->size; /* sign-extend */
                v = (int64_t)(bits << sh) >> sh;
                neg = v < 0;
            } else {
                v = bits > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)bits;
            }
            if ((neg || v >= classes) && sample <= 1) {
                rc = data__fail(err, DDPD_EDATA, f->name,
                                "%s %" PRId64 " at row %" PRId64 " is out of range [0, %" PRId64 ")", what, v,
                                done + i, classes);
                goto out;
            }
            if (neg || v >= classes) {
                rc = data__fail(err, DDPD_EDATA, f->name,
                                "%s %" PRId64 " at sample %" PRId64 ", position %" PRId64
                                " is out of range [0, %" PRId64 ")",
                                what, v, (done + i) / sample, (done + i) % sample, classes);
                goto out;
            }
            if (i32)
                i32[done + i] = (int32_t)v;
        }
        done += n;
    }
out:
    free(buf);
    return rc;
}

/* Maps the values of a large file (ranks check them as they read them) into src. */
static ddpd_err npy_map(struct dataset *ds, int slot, const struct dfile *f, const struct npy *h, int64_t per,
                        struct dsrc *src, struct ddpd_error *err)
{
    const unsigned char *m;
    ddpd_err rc = data__map(ds, slot, f, &m, err);
    if (rc)
        return rc;
    src->p = m + h->data_off;
    src->stride = per * h->size;
    src->kind = h->kind;
    src->size = h->size;
    src->mapped = true;
    src->file_off = h->data_off;
    snprintf(src->name, sizeof src->name, "%s", f->name);
    return DDPD_OK;
}

ddpd_err data__npy_open(struct dataset *ds, const struct spec *s, const char *data_dir,
                        struct ddpd_error *err)
{
    struct dfile fx = {.fd = -1}, fy = {.fd = -1};
    struct npy hx, hy;
    int64_t nx, ny;
    ddpd_err rc;
    bool rx = data__has_rank(s->data.x), ry = data__has_rank(s->data.y);
    if (rx != ry)
        return data__fail(err, DDPD_ESPEC, rx ? "data.y" : "data.x",
                          "x and y must both hold {rank} or neither");
    ds->hold = rx ? HOLD_PER_RANK : HOLD_WHOLE;
    if ((rc = data__file_open_fp(ds, &fx, data_dir, "data.x", s->data.x, err)) ||
        (rc = npy_header(&fx, &hx, err)) || (rc = npy_check(&fx, &hx, NPY_X, s, rx, &nx, err)))
        goto out;
    if ((rc = data__file_open_fp(ds, &fy, data_dir, "data.y", s->data.y, err)) ||
        (rc = npy_header(&fy, &hy, err)) ||
        (rc = npy_check(&fy, &hy, ds->ce ? NPY_Y_CE : NPY_Y_MSE, s, ry, &ny, err)))
        goto out;
    if (nx != ny) {
        rc = data__fail(err, DDPD_EDATA, fy.name, "y has %" PRId64 " rows but %s has %" PRId64, ny, fx.name,
                        nx);
        goto out;
    }
    /* Small files are loaded and checked whole; large ones stay in the file. */
    bool map_x = nx > 0 && hx.numel * hx.size > DATA_MAP_MIN,
         map_y = ny > 0 && hy.numel * hy.size > DATA_MAP_MIN;
    if ((rc = data__alloc_cols(ds, nx, !map_x, !map_y, DDPD_EDATA, fx.name, err)))
        goto out;
    if (map_x ? (rc = npy_map(ds, 0, &fx, &hx, ds->xn, &ds->sx, err))
              : (rc = npy_values(&fx, &hx, ds->ids ? NULL : ds->x, ds->ids ? (int32_t *)(void *)ds->x : NULL,
                                 ds->vocab, "id", ds->xn, err)))
        goto out;
    if (map_y ? (rc = npy_map(ds, 1, &fy, &hy, ds->yn, &ds->sy, err))
              : (rc = npy_values(&fy, &hy, ds->y, ds->labels, ds->classes, "class id", ds->yn, err)))
        goto out;
    ds->n_total = nx;
out:
    data__file_close(&fx);
    data__file_close(&fy);
    return rc;
}

ddpd_err data__npy_rows(const struct spec *s, const char *data_dir, bool check, int64_t *rows,
                        struct ddpd_error *err)
{
    struct dfile f = {.fd = -1}, g = {.fd = -1};
    struct npy h, hy;
    int64_t ny;
    ddpd_err rc;
    if ((rc = data__file_open(&f, data_dir, "data.x", s->data.x, 0, err)) || (rc = npy_header(&f, &h, err)) ||
        (rc = npy_check(&f, &h, NPY_X, s, false, rows, err)) ||
        (rc = data__file_open(&g, data_dir, "data.y", s->data.y, 0, err)) ||
        (rc = npy_header(&g, &hy, err)) ||
        (rc = npy_check(&g, &hy, s->loss == LOSS_CROSS_ENTROPY ? NPY_Y_CE : NPY_Y_MSE, s, false, &ny, err)))
        goto out;
    if (ny != *rows) {
        rc = data__fail(err, DDPD_EDATA, g.name, "y has %" PRId64 " rows but %s has %" PRId64, ny, f.name,
                        *rows);
        goto out;
    }
    if (check && spec_input_ids(s) && h.numel * h.size <= DATA_MAX_CHECK &&
        (rc = npy_values(&f, &h, NULL, NULL, spec_vocab(s), "id", spec_sample_numel(s), err)))
        goto out;
    if (check && s->loss == LOSS_CROSS_ENTROPY && hy.numel * hy.size <= DATA_MAX_CHECK)
        rc = npy_values(&g, &hy, NULL, NULL, spec_classes(s), "class id", spec_target_numel(s), err);
out:
    data__file_close(&f);
    data__file_close(&g);
    return rc;
}

ddpd_err data_npy_inputs(const struct spec *s, const char *path, const char *field, int64_t max_rows,
                         void **x, int64_t *rows, struct ddpd_error *err)
{
    struct dfile f = {.fd = -1};
    struct npy h;
    struct stat st;
    void *buf = NULL;
    ddpd_err rc;
    *x = NULL;
    *rows = 0;
    snprintf(f.name, sizeof f.name, "%s", field);
    /* O_NONBLOCK: a FIFO put there is refused below, never waited on. */
    f.fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (f.fd < 0)
        return data__fail(err, errno == ENOENT ? DDPD_ENOTFOUND : DDPD_EDATA, field, "cannot open %s: %s",
                          path, strerror(errno));
    if (fstat(f.fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        rc = data__fail(err, DDPD_EDATA, field, "%s is not a regular file", path);
        goto out;
    }
    f.size = st.st_size;
    if ((rc = npy_header(&f, &h, err)) || (rc = npy_check(&f, &h, NPY_X, s, false, rows, err)))
        goto out;
    if (*rows > max_rows) {
        rc = data__fail(err, DDPD_ETOOBIG, field,
                        "%" PRId64 " samples, more than the %" PRId64 " one request may hold", *rows,
                        max_rows);
        goto out;
    }
    const bool ids = spec_input_ids(s);
    if (!(buf = malloc((size_t)(h.numel > 0 ? h.numel : 1) * 4))) {
        rc = data__fail(err, DDPD_ENOMEM, field, "out of memory reading %" PRId64 " values", h.numel);
        goto out;
    }
    rc = npy_values(&f, &h, ids ? NULL : buf, ids ? buf : NULL, spec_vocab(s), "id", spec_sample_numel(s),
                    err);
out:
    data__file_close(&f);
    if (rc) {
        free(buf);
        *rows = 0;
        return rc;
    }
    *x = buf;
    return DDPD_OK;
}
