/* data/data.c — the data sets of CONTRACT.md §2/§3: a dataset opened from the spec by its
 * format's reader (npy.c, csv.c, synthetic.c; files only through path.c), rank sharding,
 * per-epoch shuffling and batching, and the rows the planner counts before a job starts.
 * Everything lives in host memory as float32 rows (int32 class ids). Knows nothing of
 * devices, the model or the optimizer. Every size read from a file or a spec is capped
 * before it is allocated. */
#include "data_impl.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../rng.h"

#define DATA_MAX_MEMORY (64LL << 30) /* bytes of rows one rank may hold */

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

static ddpd_err check_spec(const struct spec *s, int world, struct ddpd_error *err)
{
    int f = data__first_linear(s), l = data__last_linear(s);
    if (s->n_layers < 1 || s->n_layers > SPEC_MAX_LAYERS || f < 0)
        return data__fail(err, DDPD_ESPEC, "model", "needs at least one linear layer");
    if (s->layers[f].in < 1 || s->layers[f].in > SPEC_MAX_WIDTH || s->layers[l].out < 1 ||
        s->layers[l].out > SPEC_MAX_WIDTH)
        return data__fail(err, DDPD_ESPEC, "model", "layer widths must be in [1, %d]", SPEC_MAX_WIDTH);
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

/* Room for n rows; `what` names the file (EDATA) or the spec field (ESPEC) that sized it. */
ddpd_err data__alloc_rows(struct dataset *ds, int64_t n, ddpd_err code, const char *what,
                          struct ddpd_error *err)
{
    int64_t per = (ds->in + (ds->ce ? 1 : ds->out)) * 4;
    if (n > DATA_MAX_MEMORY / per)
        return data__fail(err, code, what,
                          "too large: %" PRId64 " rows of %" PRId64 " bytes exceed the limit of %lld GiB", n,
                          per, DATA_MAX_MEMORY >> 30);
    ds->n = n;
    if (n == 0)
        n = 1; /* a rank with an empty shard still gets valid pointers */
    ds->x = malloc((size_t)(n * ds->in) * sizeof(float));
    if (ds->ce)
        ds->labels = malloc((size_t)n * sizeof(int32_t));
    else
        ds->y = malloc((size_t)(n * ds->out) * sizeof(float));
    if (!ds->x || (ds->ce ? !ds->labels : !ds->y))
        return data__fail(err, DDPD_EDEVICE, what,
                          "out of memory: cannot allocate the data set (%" PRId64 " rows of %" PRId64
                          " bytes, %.1f MiB)",
                          n, per, (double)n * (double)per / (1 << 20));
    return DDPD_OK;
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
    ds->in = spec->layers[data__first_linear(spec)].in;
    ds->out = spec->layers[data__last_linear(spec)].out;
    ds->ce = spec->loss == LOSS_CROSS_ENTROPY;
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
    default: rc = data__fail(err, DDPD_ESPEC, "data.type", "unknown data type"); break;
    }
    if (rc)
        goto out;

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

int64_t dataset_batch(const struct dataset *ds, int64_t b, float *x, float *y, int32_t *labels)
{
    /* b < the batch count (partial last batch included) keeps b * batch below the shard:
     * batch_size may be near INT64_MAX. */
    if (b < 0 || b >= spec_batches(ds->shard, ds->batch, false))
        return 0;
    int64_t first = b * ds->batch;
    int64_t rows = ds->shard - first < ds->batch ? ds->shard - first : ds->batch;
    for (int64_t k = 0; k < rows; k++) {
        int64_t i = ds->idx[first + k];
        memcpy(x + k * ds->in, ds->x + i * ds->in, (size_t)ds->in * sizeof(float));
        if (ds->ce)
            labels[k] = ds->labels[i];
        else
            memcpy(y + k * ds->out, ds->y + i * ds->out, (size_t)ds->out * sizeof(float));
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
