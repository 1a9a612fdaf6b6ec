/* data/data.c — the data sets of CONTRACT.md §2/§3: a dataset opened from the spec by its
 * format's reader (npy.c, csv.c, synthetic.c; files only through path.c), rank sharding,
 * per-epoch shuffling and batching, and the rows the planner counts before a job starts.
 * Rows live in host memory as float32 (int32 ids and class ids), or stay in a memory-mapped
 * file (tokens, large .npy) and are converted batch by batch. Knows nothing of
 * devices, the model or the optimizer. Every size read from a file or a spec is capped
 * before it is allocated. */
#include "data_impl.h"

#include <inttypes.h>
#include <math.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "../../base/check.h"
#include "../mapguard.h"
#include "../rng.h"

#define DATA_MAX_MEMORY (64LL << 30) /* bytes of rows one rank may hold */
#define DATA_MAX_SAMPLE (1LL << 28)  /* values in one sample */
#define DATA_DROP_BYTES (8LL << 20)  /* mapped bytes read before their pages are dropped */

/* ---- errors ---- */

/* Sets `err` to "<path>: <message>" with `path` also as the error's path. */
ddpd_err data__fail(struct ddpd_error *err, ddpd_err code, const char *path, const char *fmt, ...)
{
    char msg[640];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return ddpd_error_set(err, code, path, "%s: %s", path, msg);
}

/* ---- the model's shape ---- */

int data__first_linear(const struct spec *s)
{
    for (int i = 0; i < s->n_layers; i++)
        if (s->layers[i].kind == LAYER_LINEAR)
            return i;
    return -1;
}

int data__last_linear(const struct spec *s)
{
    for (int i = s->n_layers - 1; i >= 0; i--)
        if (s->layers[i].kind == LAYER_LINEAR)
            return i;
    return -1;
}

int data__out_shape(const struct spec *s, int64_t *shape)
{
    const struct spec_layer *l = spec_output_layer(s);
    if (!l || l->out_rank < 1 || l->out_rank > SPEC_MAX_RANK)
        return 0;
    memcpy(shape, l->out_shape, (size_t)l->out_rank * sizeof *shape);
    return l->out_rank;
}

void data_shape_text(char *out, size_t cap, int rank, const int64_t *shape)
{
    size_t o = (size_t)snprintf(out, cap, "[");
    for (int i = 0; i < rank && o < cap; i++)
        o += (size_t)snprintf(out + o, cap - o, i ? ", %" PRId64 : "%" PRId64, shape[i]);
    if (o < cap)
        snprintf(out + o, cap - o, "]");
}

static ddpd_err check_spec(const struct spec *s, int world, struct ddpd_error *err)
{
    if (s->n_layers < 1 || s->n_layers > SPEC_MAX_LAYERS)
        return data__fail(err, DDPD_ESPEC, "model", "needs at least one layer");
    /* CSV and synthetic data are tables of rows for a list of linear layers. */
    int f = data__first_linear(s), l = data__last_linear(s);
    bool table = s->data.kind == DATA_CSV || s->data.kind == DATA_SYNTHETIC;
    if (table && f < 0)
        return data__fail(err, DDPD_ESPEC, "model", "needs at least one linear layer");
    if (table && (s->layers[f].in < 1 || s->layers[f].in > SPEC_MAX_WIDTH || s->layers[l].out < 1 ||
                  s->layers[l].out > SPEC_MAX_WIDTH))
        return data__fail(err, DDPD_ESPEC, "model", "layer widths must be in [1, %d]", SPEC_MAX_WIDTH);
    if (table && (spec_input_ids(s) || spec_sample_numel(s) != s->layers[f].in))
        return data__fail(err, DDPD_ESPEC, "data.type",
                          "%s data is rows of float inputs for a list of linear layers; a model on %s "
                          "needs npy%s data",
                          s->data.kind == DATA_CSV ? "csv" : "synthetic",
                          spec_input_ids(s) ? "token ids" : "samples of another shape",
                          spec_input_ids(s) ? " or tokens" : "");
    int64_t xn = spec_sample_numel(s), yn = spec_target_numel(s), c = spec_classes(s);
    if (xn < 1 || xn > DATA_MAX_SAMPLE || yn < 1 || yn > DATA_MAX_SAMPLE || c < 1)
        return data__fail(err, DDPD_ESPEC, "input_shape",
                          "a sample of %" PRId64 " values with %" PRId64 " target values (%" PRId64
                          " classes) is out of range [1, %lld]",
                          xn, yn, c, DATA_MAX_SAMPLE);
    if (spec_input_ids(s) && (spec_vocab(s) < 1 || spec_vocab(s) > INT32_MAX))
        return data__fail(err, DDPD_ESPEC, "model[0].num", "must be in [1, %d], got %" PRId64, INT32_MAX,
                          spec_vocab(s));
    if (s->batch_size < 1)
        return data__fail(err, DDPD_ESPEC, "batch_size", "must be at least 1, got %" PRId64, s->batch_size);
    if (world < 1 || world > SPEC_MAX_WORLD)
        return data__fail(err, DDPD_ESPEC, "world_size", "must be in [1, %d], got %d", SPEC_MAX_WORLD, world);
    return DDPD_OK;
}

/* float32 of a double as an IEEE cast does, without the undefined behaviour C gives a
 * cast of a value beyond FLT_MAX. */
float data__to_f32(double d)
{
    if (d >= 0x1.ffffffp+127)
        return INFINITY;
    if (d <= -0x1.ffffffp+127)
        return -INFINITY;
    return (float)d;
}

/* ---- the data set ---- */

/* Room for n rows of the inputs (x) and/or the targets (y); `what` names the file (EDATA)
 * or the spec field (ESPEC) that sized it. */
ddpd_err data__alloc_cols(struct dataset *ds, int64_t n, bool x, bool y, ddpd_err code, const char *what,
                          struct ddpd_error *err)
{
    int64_t per = ((x ? ds->xn : 0) + (y ? ds->yn : 0)) * 4;
    if (per > 0 && n > DATA_MAX_MEMORY / per)
        return data__fail(err, code, what,
                          "too large: %" PRId64 " rows of %" PRId64 " bytes exceed the limit of %lld GiB", n,
                          per, DATA_MAX_MEMORY >> 30);
    ds->n = n;
    if (n == 0)
        n = 1; /* a rank with an empty shard still gets valid pointers */
    if (x)
        ds->x = malloc((size_t)(n * ds->xn) * sizeof(float));
    if (y && ds->ce)
        ds->labels = malloc((size_t)(n * ds->yn) * sizeof(int32_t));
    else if (y)
        ds->y = malloc((size_t)(n * ds->yn) * sizeof(float));
    if ((x && !ds->x) || (y && (ds->ce ? !ds->labels : !ds->y)))
        return data__fail(err, DDPD_EDEVICE, what,
                          "out of memory: cannot allocate the data set (%" PRId64 " rows of %" PRId64
                          " bytes, %.1f MiB)",
                          n, per, (double)n * (double)per / (1 << 20));
    return DDPD_OK;
}

ddpd_err data__alloc_rows(struct dataset *ds, int64_t n, ddpd_err code, const char *what,
                          struct ddpd_error *err)
{
    return data__alloc_cols(ds, n, true, true, code, what, err);
}

ddpd_err data__map(struct dataset *ds, int slot, const struct dfile *f, const unsigned char **p,
                   struct ddpd_error *err)
{
    if (f->size < 1 || (uint64_t)f->size > SIZE_MAX)
        return data__fail(err, DDPD_EDATA, f->name, "cannot map a file of %" PRId64 " bytes", f->size);
    void *m = mmap(NULL, (size_t)f->size, PROT_READ, MAP_SHARED, f->fd, 0);
    if (m == MAP_FAILED)
        return data__fail(err, DDPD_EDATA, f->name, "cannot map %" PRId64 " bytes: %s", f->size,
                          strerror(errno));
    ds->map[slot] = m;
    ds->map_len[slot] = (size_t)f->size;
    *p = m;
    /* Reading a page past the end of a file truncated meanwhile raises SIGBUS: the rank
     * then ends with this error (mapguard.h) instead of dying of the signal. */
    struct ddpd_error why;
    data__fail(&why, DDPD_EDATA, f->name,
               "the file changed while the job was running: it is now shorter than the %" PRId64
               " bytes it had when the job started, or can no longer be read (a data file must not be "
               "truncated or rewritten in place while a job reads it; write a new file and rename it "
               "over the old one instead)",
               f->size);
    /* A rank maps at most four files (MAPGUARD_SLOTS is 8); were the registry full, the
     * mapping would only stay unguarded. */
    (void)NEVER(!mapguard_add(m, (size_t)f->size, &why));
    return DDPD_OK;
}

ddpd_err data__file_open_fp(struct dataset *ds, struct dfile *f, const char *data_dir, const char *field,
                            const char *given, struct ddpd_error *err)
{
    ddpd_err rc = data__file_open(f, data_dir, field, given, ds->rank, err);
    if (rc || NEVER(ds->nfp >= (int)(sizeof ds->fp / sizeof ds->fp[0])))
        return rc;
    struct fingerprint *fp = &ds->fp[ds->nfp];
    memset(fp, 0, sizeof *fp);
    snprintf(fp->field, sizeof fp->field, "%s", field);
    snprintf(fp->file, sizeof fp->file, "%s", f->name);
    fp->rank = data__has_rank(given) ? ds->rank : -1;
    if ((rc = fingerprint_fd(f->fd, f->name, fp, err)) == DDPD_OK)
        ds->nfp++;
    return rc;
}

/* The column of rows held in memory: 4-byte floats, or int32 ids and class ids. */
static void src_memory(struct dsrc *src, const void *p, int64_t per, bool ints, const char *name)
{
    if (src->p)
        return; /* mapped by the reader */
    src->p = p;
    src->stride = per * 4;
    src->kind = ints ? 'i' : 'f';
    src->size = 4;
    src->mapped = false;
    snprintf(src->name, sizeof src->name, "%s", name);
}

struct dataset *dataset_open(const struct spec *spec, const char *data_dir, int rank, int world_size,
                             struct ddpd_error *err)
{
    struct dataset *ds = NULL;
    ddpd_err rc;
    if ((rc = check_spec(spec, world_size, err)))
        goto out;
    if (rank < 0 || rank >= world_size) {
        rc = data__fail(err, DDPD_EINTERNAL, "data", "rank %d is not in [0, %d)", rank, world_size);
        goto out;
    }
    rc = DDPD_ENOMEM;
    ds = calloc(1, sizeof *ds);
    if (!ds) {
        data__fail(err, rc, "data", "out of memory");
        goto out;
    }
    ds->ce = spec->loss == LOSS_CROSS_ENTROPY;
    ds->xn = spec_sample_numel(spec);
    ds->yn = spec_target_numel(spec);
    ds->ids = spec_input_ids(spec);
    ds->vocab = spec_vocab(spec);
    ds->classes = spec_classes(spec);
    ds->rank = rank;
    ds->world = world_size;
    ds->batch = spec->batch_size;
    ds->shuffle = spec->data.shuffle;
    ds->drop_last = spec->data.drop_last;
    ds->seed = spec->data.seed;
    switch (spec->data.kind) {
    case DATA_SYNTHETIC: rc = data__synthetic_open(ds, spec, err); break;
    case DATA_NPY: rc = data__npy_open(ds, spec, data_dir, err); break;
    case DATA_CSV: rc = data__csv_open(ds, spec, data_dir, err); break;
    case DATA_TOKENS: rc = data__tokens_open(ds, spec, data_dir, err); break;
    default: rc = data__fail(err, DDPD_ESPEC, "data.type", "unknown data type"); break;
    }
    if (rc)
        goto out;
    src_memory(&ds->sx, ds->x, ds->xn, ds->ids, "data");
    src_memory(&ds->sy, ds->ce ? (const void *)ds->labels : (const void *)ds->y, ds->yn, ds->ce, "data");

    if (ds->hold == HOLD_PER_RANK) {
        ds->n_total = ds->n;
        ds->shard = ds->n;
    } else {
        ds->shard = spec_shard_rows(ds->n_total, rank, world_size);
    }
    rc = DDPD_ENOMEM;
    ds->idx = malloc((size_t)(ds->shard > 0 ? ds->shard : 1) * sizeof *ds->idx);
    if (ds->shuffle)
        ds->perm = malloc((size_t)ds->n_total * sizeof *ds->perm);
    if (!ds->idx || (ds->shuffle && !ds->perm)) {
        data__fail(err, rc, "data", "out of memory for the sample order");
        goto out;
    }
    dataset_set_epoch(ds, 0);
    /* A fingerprint counts the samples of the data set its file makes (of this rank's own
     * file for {rank} files): a file of another length is other data, even at equal size. */
    for (int i = 0; i < ds->nfp; i++) {
        ds->fp[i].samples = ds->n_total;
        snprintf(ds->fp[i].unit, sizeof ds->fp[i].unit, "%s",
                 spec->data.kind == DATA_TOKENS ? "windows" : "rows");
    }
    rc = DDPD_OK;
out:
    if (rc) {
        dataset_free(ds);
        return NULL;
    }
    return ds;
}

void dataset_free(struct dataset *ds)
{
    if (!ds)
        return;
    free(ds->x);
    free(ds->y);
    free(ds->labels);
    free(ds->perm);
    free(ds->idx);
    for (int i = 0; i < 2; i++)
        if (ds->map[i]) {
            mapguard_remove(ds->map[i]);
            munmap(ds->map[i], ds->map_len[i]);
        }
    free(ds);
}

int64_t dataset_rows(const struct dataset *ds)
{
    return ds->n_total;
}

bool dataset_rank_file(const struct dataset *ds)
{
    return ds->hold == HOLD_PER_RANK;
}

const struct fingerprint *dataset_fingerprints(const struct dataset *ds, int *n)
{
    *n = ds->nfp;
    return ds->fp;
}

int64_t dataset_shard_size(const struct dataset *ds)
{
    return ds->shard;
}

int64_t dataset_batches(const struct dataset *ds)
{
    return spec_batches(ds->shard, ds->batch, ds->drop_last);
}

void dataset_set_epoch(struct dataset *ds, int64_t epoch)
{
    if (ds->shuffle) {
        struct rng r;
        for (int64_t i = 0; i < ds->n_total; i++)
            ds->perm[i] = i;
        rng_seed2(&r, ds->seed, (uint64_t)epoch);
        rng_shuffle(&r, ds->perm, ds->n_total);
    }
    for (int64_t k = 0; k < ds->shard; k++) {
        int64_t pos = ds->hold == HOLD_PER_RANK ? k : ds->rank + k * ds->world;
        int64_t row = ds->shuffle ? ds->perm[pos] : pos;
        ds->idx[k] = ds->hold == HOLD_SHARD_ONLY ? k : row;
    }
}

const struct ddpd_error *dataset_error(const struct dataset *ds)
{
    return &ds->err;
}

/* Drops the pages of the mappings this process has read from (they stay in the page
 * cache): a rank reading a 10 GB file window by window keeps only the last few MiB of it. */
static void drop_pages(struct dataset *ds)
{
    for (int i = 0; i < 2; i++)
        if (ds->map[i])
            madvise(ds->map[i], ds->map_len[i], MADV_DONTNEED);
    ds->touched = 0;
}

static uint64_t load_le(const unsigned char *p, int size)
{
    uint64_t v = 0;
    for (int i = size - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* Copies the n values of sample i from `src` into out: float32, or with `ints` int32 ids
 * checked to be in [0, limit) (`what` says which ids). False with ds->err set (naming the
 * file, the sample and the position) for an id out of range. */
static bool src_copy(struct dataset *ds, const struct dsrc *src, int64_t i, int64_t n, void *out, bool ints,
                     int64_t limit, const char *what)
{
    const unsigned char *p = src->p + i * src->stride;
    if (src->mapped)
        ds->touched += n * src->size;
    if (!ints && src->kind == 'f' && src->size == 4) {
        memcpy(out, p, (size_t)n * 4);
        return true;
    }
    if (!ints) { /* float64, converted */
        float *o = out;
        for (int64_t k = 0; k < n; k++) {
            uint64_t bits = load_le(p + k * 8, 8);
            double d;
            memcpy(&d, &bits, 8);
            o[k] = data__to_f32(d);
        }
        return true;
    }
    int32_t *o = out;
    for (int64_t k = 0; k < n; k++) {
        uint64_t bits = load_le(p + k * src->size, src->size);
        int64_t v;
        if (src->kind == 'i') {
            int sh = 64 - 8 * src->size; /* sign-extend */
            v = (int64_t)(bits << sh) >> sh;
        } else {
            v = bits > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)bits;
        }
        if (v < 0 || v >= limit) {
            if (n == 1)
                data__fail(&ds->err, DDPD_EDATA, src->name,
                           "%s %" PRId64 " at row %" PRId64 " is out of range [0, %" PRId64 ")", what, v, i,
                           limit);
            else
                data__fail(&ds->err, DDPD_EDATA, src->name,
                           "%s %" PRId64 " at sample %" PRId64 ", position %" PRId64
                           " is out of range [0, %" PRId64 ")",
                           what, v, i, k, limit);
            return false;
        }
        o[k] = (int32_t)v;
    }
    return true;
}

int64_t dataset_batch(struct dataset *ds, int64_t b, void *x, float *y, int32_t *labels)
{
    /* b < the batch count (partial last batch included) keeps b * batch below the shard:
     * batch_size may be near INT64_MAX. */
    if (b < 0 || b >= spec_batches(ds->shard, ds->batch, false))
        return 0;
    int64_t first = b * ds->batch;
    int64_t rows = ds->shard - first < ds->batch ? ds->shard - first : ds->batch;
    for (int64_t k = 0; k < rows; k++) {
        int64_t i = ds->idx[first + k];
        if (!src_copy(ds, &ds->sx, i, ds->xn, (char *)x + k * ds->xn * 4, ds->ids, ds->vocab, "id"))
            return -1;
        if (ds->ce ? !src_copy(ds, &ds->sy, i, ds->yn, labels + k * ds->yn, true, ds->classes, "class id")
                   : !src_copy(ds, &ds->sy, i, ds->yn, y + k * ds->yn, false, 0, NULL))
            return -1;
        if (ds->touched >= DATA_DROP_BYTES)
            drop_pages(ds);
    }
    return rows;
}

/* ---- batch counts before any rank starts ---- */

/* Rows of the whole data set, read from the files' headers (or the spec). With `check`
 * the values are read too, for what a rank would otherwise find only after the job was
 * accepted: class ids out of range, CSV cells that are not numbers. *file_bytes is the
 * size of a file a rank reads whole (CSV), else 0. */
static ddpd_err count_rows(const struct spec *s, const char *data_dir, bool check, int64_t *rows,
                           int64_t *file_bytes, struct ddpd_error *err)
{
    switch (s->data.kind) {
    case DATA_SYNTHETIC:
        if (s->data.samples < 1)
            return data__fail(err, DDPD_ESPEC, "data.samples", "must be at least 1, got %" PRId64,
                              s->data.samples);
        *rows = s->data.samples;
        return DDPD_OK;
    case DATA_NPY:
        if (data__has_rank(s->data.x) || data__has_rank(s->data.y))
            break;
        return data__npy_rows(s, data_dir, check, rows, err);
    case DATA_CSV:
        if (data__has_rank(s->data.path))
            break;
        return data__csv_rows(s, data_dir, check, rows, file_bytes, err);
    case DATA_TOKENS:
        if (data__has_rank(s->data.path))
            break;
        return data__tokens_rows(s, data_dir, check, rows, err);
    default: return data__fail(err, DDPD_ESPEC, "data.type", "unknown data type");
    }
    return ddpd_error_set(err, DDPD_ENOTFOUND, "data",
                          "batch counts of {rank} files are known only to the ranks");
}

ddpd_err dataset_batch_counts(const struct spec *spec, const char *data_dir, int world_size, int64_t *out,
                              struct ddpd_error *err)
{
    int64_t rows = 0, file_bytes = 0;
    ddpd_err rc;
    if ((rc = check_spec(spec, world_size, err)) ||
        (rc = count_rows(spec, data_dir, false, &rows, &file_bytes, err)))
        return rc;
    for (int r = 0; r < world_size; r++)
        out[r] = spec_batches(spec_shard_rows(rows, r, world_size), spec->batch_size, spec->data.drop_last);
    return DDPD_OK;
}

ddpd_err dataset_check(const struct spec *spec, const char *data_dir, int world_size, int64_t *rows,
                       int64_t *file_bytes, struct ddpd_error *err)
{
    ddpd_err rc;
    *rows = *file_bytes = 0;
    if ((rc = check_spec(spec, world_size, err)))
        return rc;
    return count_rows(spec, data_dir, true, rows, file_bytes, err);
}

ddpd_err dataset_fingerprint_files(const struct spec *spec, const char *data_dir, int64_t rows,
                                   struct fingerprint *out, int *n, struct ddpd_error *err)
{
    const struct spec_data *d = &spec->data;
    const char *fields[2] = {"data.x", "data.y"}, *given[2] = {d->x, d->y};
    int nf = 2;
    *n = 0;
    if (d->kind == DATA_SYNTHETIC)
        return DDPD_OK;
    if (d->kind != DATA_NPY) {
        fields[0] = "data.path";
        given[0] = d->path;
        nf = 1;
    }
    for (int i = 0; i < nf; i++) {
        if (data__has_rank(given[i])) /* each rank checks its own */
            continue;
        struct dfile f = {.fd = -1};
        struct fingerprint *fp = &out[*n];
        memset(fp, 0, sizeof *fp);
        ddpd_err rc = data__file_open(&f, data_dir, fields[i], given[i], 0, err);
        if (rc == DDPD_OK)
            rc = fingerprint_fd(f.fd, f.name, fp, err);
        data__file_close(&f);
        if (rc)
            return rc;
        snprintf(fp->field, sizeof fp->field, "%s", fields[i]);
        snprintf(fp->file, sizeof fp->file, "%s", given[i]);
        snprintf(fp->unit, sizeof fp->unit, "%s", d->kind == DATA_TOKENS ? "windows" : "rows");
        fp->rank = -1;
        fp->samples = rows;
        (*n)++;
    }
    return DDPD_OK;
}
