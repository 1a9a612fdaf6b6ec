/* data/tokens.c — tokens files (CONTRACT.md §2a): a flat little-endian file of uint16 or
 * int32 token ids, as nanoGPT's train.bin. Sample i is x = ids[i·T : i·T+T] and
 * y = ids[i·T+1 : i·T+T+1] for i < ⌊(n−1)/T⌋. The file is memory-mapped and read window by
 * window as batches are copied (data.c drops the pages read), never loaded whole. A path
 * with {rank} is one file per rank, each that rank's whole shard, as for .npy and CSV. */
#include "data_impl.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../base/file.h"

/* Ids the planner reads before a job is accepted; larger files are checked by the ranks
 * as they read them. */
#define TOKENS_MAX_CHECK (1LL << 30)
#define TOKENS_CHUNK     (1 << 20)

static const char *dtype_name(tokens_dtype d)
{
    return d == TOKENS_INT32 ? "int32" : "uint16";
}

/* Checks the spec's side of a tokens data set and the file's size; sets the id width and
 * the number of samples (windows). `empty_ok`: a rank's own {rank} file, which may hold
 * no window (empty, or at most block_size ids): that rank has no samples and joins at
 * once, as with an empty .npy or CSV {rank} file. */
static ddpd_err tokens_shape(const struct spec *s, const struct dfile *f, bool empty_ok, int *width,
                             int64_t *rows, struct ddpd_error *err)
{
    const int64_t T = s->data.block_size;
    char shape[160];
    if (T < 1)
        return data__fail(err, DDPD_ESPEC, "data.block_size", "must be at least 1, got %" PRId64, T);
    if (!spec_input_ids(s))
        return data__fail(err, DDPD_ESPEC, "data.type",
                          "tokens data feeds token ids: the model must start with an embedding layer");
    if (s->loss != LOSS_CROSS_ENTROPY)
        return data__fail(err, DDPD_ESPEC, "loss",
                          "tokens data has the next token ids as targets: the loss must be cross_entropy");
    if (s->input_rank != 1 || s->input_shape[0] != T) {
        data_shape_text(shape, sizeof shape, s->input_rank, s->input_shape);
        return data__fail(err, DDPD_ESPEC, "data.block_size",
                          "is %" PRId64 " but input_shape is %s (it must be [%" PRId64 "])", T, shape, T);
    }
    if (spec_target_numel(s) != T)
        return data__fail(err, DDPD_ESPEC, "data.block_size",
                          "is %" PRId64 " but the model's output has %" PRId64 " positions", T,
                          spec_target_numel(s));
    *width = s->data.dtype == TOKENS_INT32 ? 4 : 2;
    if (f->size % *width)
        return data__fail(err, DDPD_EDATA, f->name,
                          "its size, %" PRId64 " bytes, is not a multiple of %d (dtype %s)", f->size, *width,
                          dtype_name(s->data.dtype));
    const int64_t n = f->size / *width;
    if (n < T + 1 && empty_ok) {
        *rows = 0;
        return DDPD_OK;
    }
    if (n < T + 1)
        return data__fail(err, DDPD_EDATA, f->name,
                          "too short: %" PRId64 " tokens, fewer than one window of block_size + 1 = %" PRId64,
                          n, T + 1);
    *rows = (n - 1) / T;
    return DDPD_OK;
}

/* Checks the ids of the windows (ids[0 .. rows·T]) in order: as inputs against the
 * vocabulary, as targets against the classes, with the message a rank would give. */
static ddpd_err tokens_values(const struct spec *s, const struct dfile *f, int width, int64_t rows,
                              struct ddpd_error *err)
{
    const int64_t T = s->data.block_size, used = rows * T + 1;
    const int64_t vocab = spec_vocab(s), classes = spec_classes(s);
    const int64_t per = TOKENS_CHUNK / width;
    unsigned char *buf = malloc(TOKENS_CHUNK);
    ddpd_err rc = DDPD_OK;
    if (!buf)
        return data__fail(err, DDPD_ENOMEM, f->name, "out of memory");
    for (int64_t done = 0; done < used;) {
        int64_t n = used - done < per ? used - done : per;
        errno = 0;
        if (base_read_at(f->fd, buf, n * width, done * width) != n * width) {
            rc = data__fail(err, DDPD_EDATA, f->name, "cannot read at offset %" PRId64 ": %s", done * width,
                            errno ? strerror(errno) : "file shrank while reading");
            goto out;
        }
        for (int64_t i = 0; i < n; i++) {
            const unsigned char *p = buf + i * width;
            int64_t k = done + i, v;
            if (width == 4) {
                uint32_t u =
                    (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
                v = (int32_t)u;
            } else {
                v = (int64_t)p[0] | (int64_t)p[1] << 8;
            }
            if (k < rows * T && (v < 0 || v >= vocab)) {
                rc = data__fail(err, DDPD_EDATA, f->name,
                                "id %" PRId64 " at sample %" PRId64 ", position %" PRId64
                                " is out of range [0, %" PRId64 ")",
                                v, k / T, k % T, vocab);
                goto out;
            }
            if (k >= 1 && (v < 0 || v >= classes)) {
                rc = data__fail(err, DDPD_EDATA, f->name,
                                "class id %" PRId64 " at sample %" PRId64 ", position %" PRId64
                                " is out of range [0, %" PRId64 ")",
                                v, (k - 1) / T, (k - 1) % T, classes);
                goto out;
            }
        }
        done += n;
    }
out:
    free(buf);
    return rc;
}

ddpd_err data__tokens_open(struct dataset *ds, const struct spec *s, const char *data_dir,
                           struct ddpd_error *err)
{
    struct dfile f = {.fd = -1};
    const unsigned char *m;
    int width = 2;
    int64_t rows = 0;
    ddpd_err rc;
    ds->hold = data__has_rank(s->data.path) ? HOLD_PER_RANK : HOLD_WHOLE;
    const bool own = ds->hold == HOLD_PER_RANK;
    if ((rc = data__file_open_fp(ds, &f, data_dir, "data.path", s->data.path, err)) ||
        (rc = tokens_shape(s, &f, own, &width, &rows, err)))
        goto out;
    /* The planner checks the ids of a shared file; only this rank sees its own, so it
     * checks them here, before the first step, as the planner would have (up to 1 GiB;
     * past it, batch by batch as it reads them). */
    if (own && f.size <= TOKENS_MAX_CHECK && rows > 0 && (rc = tokens_values(s, &f, width, rows, err)))
        goto out;
    ds->n = rows;
    ds->n_total = rows;
    if (rows == 0) /* nothing to map: this rank joins at once */
        goto out;
    if ((rc = data__map(ds, 0, &f, &m, err)))
        goto out;
    const int64_t T = s->data.block_size;
    struct dsrc src = {
        .p = m, .stride = T * width, .kind = width == 4 ? 'i' : 'u', .size = width, .mapped = true};
    snprintf(src.name, sizeof src.name, "%s", f.name);
    ds->sx = src;
    ds->sy = src;
    ds->sy.p = m + width;
    ds->sy.file_off = width;
out:
    data__file_close(&f);
    return rc;
}

ddpd_err data__tokens_rows(const struct spec *s, const char *data_dir, bool check, int64_t *rows,
                           struct ddpd_error *err)
{
    struct dfile f = {.fd = -1};
    int width = 2;
    ddpd_err rc;
    if ((rc = data__file_open(&f, data_dir, "data.path", s->data.path, 0, err)) ||
        (rc = tokens_shape(s, &f, false, &width, rows, err)))
        goto out;
    if (check && f.size <= TOKENS_MAX_CHECK)
        rc = tokens_values(s, &f, width, *rows, err);
out:
    data__file_close(&f);
    return rc;
}
