/* checkpoint.c — model/optimizer state <-> safetensors files. Knows the model and the
 * optimizer's state tensors and the file format; nothing of data, DDP or the loop. */
#include "checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../base/parse.h"
#include "../schema/jobdir.h"
#include "fingerprint.h"
#include "../schema/safetensors.h"

#define CKPT_FORMAT "ddpd-checkpoint-1"

static float *host_buffer(int64_t n)
{
    return malloc((size_t)n * sizeof(float));
}

/* dir/file into out; false when it does not fit. */
static bool join_path(char *out, size_t cap, const char *dir, const char *file)
{
    int n = snprintf(out, cap, "%s/%s", dir, file);
    return n >= 0 && (size_t)n < cap;
}

/* The metadata every file of a checkpoint holds (strings in `buf`). */
struct meta_text {
    char step[32], epoch[32], estep[32], osteps[32], ws[32], rk[32], watch[192];
    struct safetensors_meta kv[11];
};

static int meta_fill(struct meta_text *t, struct optim *o, const struct train_pos *pos, int rank, int world,
                     bool per_rank, bool replicas, const char *data_record)
{
    snprintf(t->step, sizeof t->step, "%" PRId64, pos->step);
    snprintf(t->epoch, sizeof t->epoch, "%" PRId64, pos->epoch);
    snprintf(t->estep, sizeof t->estep, "%" PRId64, pos->epoch_step);
    snprintf(t->osteps, sizeof t->osteps, "%" PRId64, optim_steps(o));
    snprintf(t->ws, sizeof t->ws, "%d", world);
    snprintf(t->rk, sizeof t->rk, "%d", rank);
    snprintf(t->watch, sizeof t->watch, "%" PRId64 " %" PRId64 " %.17g %" PRId64 " %" PRId64 " %.17g",
             pos->stop.step, pos->stop.wait, pos->stop.best, pos->best.step, pos->best.wait, pos->best.best);
    const struct safetensors_meta kv[] = {
        {"format", CKPT_FORMAT},
        {"step", t->step},
        {"epoch", t->epoch},
        {"epoch_step", t->estep},
        {"optim_steps", t->osteps},
        {"world_size", t->ws},
        {"rank", t->rk},
        {"per_rank", per_rank ? "true" : "false"},
        {"replicas", replicas ? "true" : "false"},
        {"watch", t->watch},
        {FINGERPRINT_META_KEY, data_record},
    };
    memcpy(t->kv, kv, sizeof kv);
    /* Synthetic data has no files to record. */
    return (int)(sizeof kv / sizeof kv[0]) - (data_record ? 0 : 1);
}

/* Writes the model's weights (state = false) or the optimizer's state tensors to path.
 * The model file names a tied weight twice, as PyTorch's state_dict does (model_alias):
 * the same host copy under both names. The optimizer's state is per parameter: once. */
static ddpd_err write_one(const char *path, struct model *m, struct optim *o, bool state,
                          const struct meta_text *meta, int nmeta, struct ddpd_error *err)
{
    struct dev dev = model_dev(m);
    const int nt = state ? optim_state_count(o) : model_param_count(m);
    const int na = state ? 0 : model_alias_count(m);
    const int nb = state ? 0 : model_buffer_count(m); /* the model file holds the buffers too */
    int n = nt + na + nb;
    struct safetensors_tensor *t = calloc((size_t)n + 1, sizeof *t);
    float **host = calloc((size_t)n + 1, sizeof *host);
    ddpd_err rc = DDPD_ENOMEM;
    if (!t || !host)
        goto out;
    for (int i = nt + na; i < n; i++) {
        struct model_buffer *b = model_buffer(m, i - nt - na);
        snprintf(t[i].name, sizeof t[i].name, "%s", b->name);
        host[i] = malloc((size_t)(b->numel > 0 ? b->numel : 1) * 8);
        if (!host[i])
            goto out;
        dev.ops->to_host(dev.ctx, host[i], b->data, (size_t)b->numel * (b->i64 ? 8 : 4));
        /* running_mean, running_var [F] as F32; num_batches_tracked a scalar I64 */
        t[i].ndim = b->i64 ? 0 : 1;
        t[i].shape[0] = b->numel;
        if (b->i64)
            t[i].i64 = (const int64_t *)(const void *)host[i];
        else
            t[i].data = host[i];
    }
    for (int i = 0; i < nt; i++) {
        const struct param *like;
        float *d;
        if (state) {
            d = optim_state_at(o, i, t[i].name, sizeof t[i].name, &like);
        } else {
            struct param *p = model_param(m, i);
            like = p;
            d = p->data;
            snprintf(t[i].name, sizeof t[i].name, "%s", p->name);
        }
        host[i] = host_buffer(like->numel);
        if (!host[i])
            goto out;
        dev.ops->to_host(dev.ctx, host[i], d, (size_t)like->numel * sizeof(float));
        t[i].ndim = like->ndim;
        for (int d = 0; d < like->ndim && d < SAFETENSORS_MAX_DIMS; d++)
            t[i].shape[d] = like->shape[d];
        t[i].data = host[i];
    }
    for (int i = nt; i < nt + na; i++) {
        const struct model_alias *a = model_alias(m, i - nt);
        t[i] = t[a->param]; /* host[i] stays NULL: the data is host[a->param]'s */
        snprintf(t[i].name, sizeof t[i].name, "%s", a->name);
    }
    rc = safetensors_write(path, t, n, meta->kv, nmeta, err);
out:
    if (rc == DDPD_ENOMEM)
        ddpd_error_set(err, rc, path, "%s: out of memory while writing a checkpoint", path);
    if (host)
        for (int i = 0; i < n; i++)
            free(host[i]);
    free(host);
    free(t);
    return rc;
}

ddpd_err checkpoint_write_rank(const char *dir, struct model *m, struct optim *o, const struct train_pos *pos,
                               int rank, int world, bool with_model, bool per_rank, bool replicas,
                               const char *data_record, struct ddpd_error *err)
{
    char path[4096], file[64];
    struct meta_text meta;
    replicas = replicas && per_rank;
    int nmeta = meta_fill(&meta, o, pos, rank, world, per_rank, replicas, data_record);
    ddpd_err rc = DDPD_OK;
    if (with_model) {
        if (!jobdir_model_path(path, sizeof path, dir))
            goto long_name;
        if ((rc = write_one(path, m, o, false, &meta, nmeta, err)))
            return rc;
    }
    if (rank == 0 || per_rank) {
        if (!jobdir_rank_file(file, sizeof file, JOBDIR_OPTIM, rank) ||
            !join_path(path, sizeof path, dir, file))
            goto long_name;
        if ((rc = write_one(path, m, o, true, &meta, nmeta, err)))
            return rc;
    }
    if (rank > 0 && replicas) {
        if (!jobdir_rank_file(file, sizeof file, JOBDIR_MODEL, rank) ||
            !join_path(path, sizeof path, dir, file))
            goto long_name;
        rc = write_one(path, m, o, false, &meta, nmeta, err);
    }
    return rc;
long_name:
    return ddpd_error_set(err, DDPD_EIO, dir, "checkpoint directory name too long");
}

static int fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0)
        return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

ddpd_err checkpoint_dir_begin(const char *dir, char *tmp, size_t cap, struct ddpd_error *err)
{
    if (!jobdir_tmp_path(tmp, cap, dir) || strlen(dir) + 64 >= 4096)
        return ddpd_error_set(err, DDPD_EIO, dir, "checkpoint directory name too long");
    struct stat st;
    if (stat(dir, &st) == 0)
        return ddpd_error_set(err, DDPD_EIO, dir, "%s: checkpoint directory already exists", dir);
    /* A leftover from a crash in the middle of a write is garbage: start over. */
    if (stat(tmp, &st) == 0) {
        DIR *d = opendir(tmp);
        struct dirent *e;
        while (d && (e = readdir(d))) {
            char f[4400];
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && join_path(f, sizeof f, tmp, e->d_name))
                unlink(f);
        }
        if (d)
            closedir(d);
        if (rmdir(tmp) != 0)
            return ddpd_error_set(err, DDPD_EIO, tmp, "%s: cannot remove a torn checkpoint: %s", tmp,
                                  strerror(errno));
    }
    /* Only the job's owner reads its checkpoints (the files inside are 0600 too). */
    if (mkdir(tmp, 0700) != 0)
        return ddpd_error_set(err, DDPD_EIO, tmp, "%s: cannot create: %s", tmp, strerror(errno));
    return DDPD_OK;
}

ddpd_err checkpoint_dir_commit(const char *tmp, const char *dir, struct ddpd_error *err)
{
    char parent[4096];
    if (rename(tmp, dir) != 0)
        return ddpd_error_set(err, DDPD_EIO, dir, "%s: cannot rename from %s: %s", dir, tmp, strerror(errno));
    snprintf(parent, sizeof parent, "%s", dir);
    char *slash = strrchr(parent, '/');
    if (slash && slash != parent)
        *slash = '\0';
    else
        snprintf(parent, sizeof parent, "%s", slash ? "/" : ".");
    fsync_dir(parent);
    return DDPD_OK;
}

/* Copies the tensors of `f` into the model's parameters, checking that the names and
 * shapes are exactly the model's. */
static ddpd_err load_params(struct model *m, const struct safetensors_file *f, const char *path,
                            struct ddpd_error *err)
{
    struct dev dev = model_dev(m);
    int np = model_param_count(m);
    for (int i = 0; i < np; i++) {
        struct param *p = model_param(m, i);
        const struct safetensors_tensor *t = safetensors_get(f, p->name);
        if (!t)
            return ddpd_error_set(err, DDPD_EDATA, path, "%s: tensor \"%s\" is missing", path, p->name);
        int same = t->ndim == p->ndim;
        for (int d = 0; same && d < p->ndim; d++)
            same = t->shape[d] == p->shape[d];
        if (!same && p->ndim == 4)
            return ddpd_error_set(err, DDPD_EDATA, path,
                                  "%s: tensor \"%s\" has the wrong shape (the model's is [%" PRId64
                                  ", %" PRId64 ", %" PRId64 ", %" PRId64 "])",
                                  path, p->name, p->shape[0], p->shape[1], p->shape[2], p->shape[3]);
        if (!same) {
            if (p->ndim == 2)
                return ddpd_error_set(err, DDPD_EDATA, path,
                                      "%s: tensor \"%s\" has the wrong shape (the model's is [%" PRId64
                                      ", %" PRId64 "])",
                                      path, p->name, p->shape[0], p->shape[1]);
            return ddpd_error_set(err, DDPD_EDATA, path,
                                  "%s: tensor \"%s\" has the wrong shape (the model's is [%" PRId64 "])",
                                  path, p->name, p->shape[0]);
        }
        dev.ops->to_device(dev.ctx, p->data, t->data, (size_t)p->numel * sizeof(float));
    }
    /* A tied weight's second name: there, of the same shape, with the same values. */
    const int na = model_alias_count(m);
    for (int i = 0; i < na; i++) {
        const struct model_alias *a = model_alias(m, i);
        const struct param *p = model_param(m, a->param);
        const struct safetensors_tensor *t = safetensors_get(f, a->name), *e = safetensors_get(f, p->name);
        bool same = t && t->ndim == p->ndim;
        for (int d = 0; same && d < p->ndim; d++)
            same = t->shape[d] == p->shape[d];
        if (!t)
            return ddpd_error_set(err, DDPD_EDATA, path,
                                  "%s: tensor \"%s\" is missing: layer %s ties its weight to \"%s\", and the "
                                  "file must hold it under both names (as PyTorch's state_dict does)",
                                  path, a->name, model_layer(m, a->layer)->key, p->name);
        if (!same || memcmp(t->data, e->data, (size_t)p->numel * sizeof(float)) != 0)
            return ddpd_error_set(err, DDPD_EDATA, path,
                                  "%s: tensors \"%s\" and \"%s\" differ: layer %s ties its weight to \"%s\", "
                                  "so they must be one tensor, equal in shape and values",
                                  path, p->name, a->name, model_layer(m, a->layer)->key, p->name);
    }
    /* Buffers (BatchNorm's running statistics), as load_state_dict(strict=True) wants
     * them: each with its shape ([F], num_batches_tracked a scalar). */
    const int nb = model_buffer_count(m);
    for (int i = 0; i < nb; i++) {
        struct model_buffer *b = model_buffer(m, i);
        const struct safetensors_tensor *t = safetensors_get(f, b->name);
        if (!t)
            return ddpd_error_set(err, DDPD_EDATA, path, "%s: buffer \"%s\" is missing", path, b->name);
        int64_t numel = 1;
        for (int d = 0; d < t->ndim; d++)
            numel *= t->shape[d];
        /* A scalar may come as [1]: load_state_dict takes that too (its 0.3 compatibility). */
        if (numel != b->numel || (b->i64 ? t->ndim > 1 : t->ndim != 1)) {
            if (b->i64)
                return ddpd_error_set(err, DDPD_EDATA, path,
                                      "%s: buffer \"%s\" has the wrong shape (the model's is a scalar, [])",
                                      path, b->name);
            return ddpd_error_set(err, DDPD_EDATA, path,
                                  "%s: buffer \"%s\" has the wrong shape (the model's is [%" PRId64 "])",
                                  path, b->name, b->numel);
        }
        if (b->i64) {
            const int64_t v = (int64_t)t->data[0];
            dev.ops->to_device(dev.ctx, b->data, &v, sizeof v);
        } else {
            dev.ops->to_device(dev.ctx, b->data, t->data, (size_t)b->numel * sizeof(float));
        }
    }
    for (int i = 0; i < safetensors_count(f); i++) {
        const char *name = safetensors_at(f, i)->name;
        int known = 0;
        for (int j = 0; j < np && !known; j++)
            known = strcmp(model_param(m, j)->name, name) == 0;
        for (int j = 0; j < na && !known; j++)
            known = strcmp(model_alias(m, j)->name, name) == 0;
        for (int j = 0; j < nb && !known; j++)
            known = strcmp(model_buffer(m, j)->name, name) == 0;
        if (!known)
            return ddpd_error_set(err, DDPD_EDATA, path, "%s: tensor \"%s\" is not a parameter of this model",
                                  path, name);
    }
    return DDPD_OK;
}

ddpd_err checkpoint_load_weights_fd(struct model *m, int fd, const char *name, struct ddpd_error *err)
{
    struct safetensors_file *f = safetensors_read_fd(fd, name, err);
    if (!f)
        return err ? err->code : DDPD_EDATA;
    ddpd_err rc = load_params(m, f, name, err);
    safetensors_free(f);
    return rc;
}

ddpd_err checkpoint_load_weights(struct model *m, const char *path, struct ddpd_error *err)
{
    struct safetensors_file *f = safetensors_read(path, err);
    if (!f)
        return err ? err->code : DDPD_EDATA;
    ddpd_err rc = load_params(m, f, path, err);
    safetensors_free(f);
    return rc;
}

static int meta_i64(const struct safetensors_file *f, const char *key, int64_t *out)
{
    const char *v = safetensors_meta_get(f, key);
    if (!v)
        return -1;
    return base_parse_i64(v, 0, INT64_MAX, out);
}

/* Reads a file of the checkpoint `dir` whose metadata must say rank `rank`, step `step`. */
static struct safetensors_file *read_rank_file(const char *dir, const char *what, int rank, int64_t step,
                                               char *path, size_t cap, struct ddpd_error *err)
{
    char file[64];
    if (!jobdir_rank_file(file, sizeof file, what, rank) || !join_path(path, cap, dir, file)) {
        ddpd_error_set(err, DDPD_EIO, dir, "checkpoint directory name too long");
        return NULL;
    }
    struct safetensors_file *f = safetensors_read(path, err);
    int64_t frank = -1, fstep = -1;
    if (f && (meta_i64(f, "rank", &frank) || meta_i64(f, "step", &fstep) || frank != rank || fstep != step)) {
        ddpd_error_set(err, DDPD_EDATA, path,
                       "%s: not rank %d's state of step %" PRId64
                       " (metadata rank/step missing or different)",
                       path, rank, step);
        safetensors_free(f);
        return NULL;
    }
    return f;
}

ddpd_err checkpoint_load_dir(const char *dir, struct model *m, struct optim *o, int rank, int world,
                             struct train_pos *pos, struct ddpd_error *err)
{
    char mp[4096], op[4096], rp[4096];
    struct safetensors_file *mf = NULL, *ofile = NULL, *rf = NULL;
    ddpd_err rc;
    int64_t osteps = 0, ws = 0;
    struct stat dst;

    if (stat(dir, &dst) != 0 && errno == ENOENT) /* pruned by checkpoint.keep_last, or a typo */
        return jobdir_missing_ckpt(dir, err);
    if (!jobdir_model_path(mp, sizeof mp, dir)) {
        rc = ddpd_error_set(err, DDPD_EIO, dir, "checkpoint directory name too long");
        goto out;
    }
    mf = safetensors_read(mp, err);
    if (!mf) {
        rc = err ? err->code : DDPD_EDATA;
        goto out;
    }
    const char *fmt = safetensors_meta_get(mf, "format");
    if (!fmt || strcmp(fmt, CKPT_FORMAT) != 0 || meta_i64(mf, "step", &pos->step) ||
        meta_i64(mf, "epoch", &pos->epoch) || meta_i64(mf, "epoch_step", &pos->epoch_step) ||
        meta_i64(mf, "optim_steps", &osteps)) {
        rc = ddpd_error_set(err, DDPD_EDATA, mp,
                            "%s: not a ddpd checkpoint (metadata format/step/epoch/epoch_step missing)", mp);
        goto out;
    }
    pos->stop = pos->best = (struct watch_state){0};
    const char *wv = safetensors_meta_get(mf, "watch");
    if (wv &&
        sscanf(wv, "%" SCNd64 " %" SCNd64 " %lf %" SCNd64 " %" SCNd64 " %lf", &pos->stop.step,
               &pos->stop.wait, &pos->stop.best, &pos->best.step, &pos->best.wait, &pos->best.best) != 6) {
        rc = ddpd_error_set(err, DDPD_EDATA, mp, "%s: metadata watch is not 6 numbers", mp);
        goto out;
    }
    /* A checkpoint from before world_size was recorded holds rank 0's state only, which
     * every rank then loads, as it always did. */
    bool legacy = safetensors_meta_get(mf, "world_size") == NULL;
    if (!legacy && (meta_i64(mf, "world_size", &ws) || ws < 1)) {
        rc = ddpd_error_set(err, DDPD_EDATA, mp, "%s: metadata world_size is not a positive integer", mp);
        goto out;
    }
    if (!legacy && ws != world) {
        rc = ddpd_error_set(err, DDPD_ESPEC, "world_size",
                            "world_size: the checkpoint %s was written by %" PRId64
                            " rank%s; resuming needs the same world size, got %d",
                            dir, ws, ws == 1 ? "" : "s", world);
        goto out;
    }
    /* With per-rank state each rank continues from its own replica and optimizer state:
     * ranks that joined early stepped less often (DDP.md §4.5). */
    const char *pr = safetensors_meta_get(mf, "per_rank"), *rr = safetensors_meta_get(mf, "replicas");
    bool per_rank = !legacy && pr && strcmp(pr, "true") == 0;
    bool replicas = per_rank && rr && strcmp(rr, "true") == 0;
    int from = per_rank ? rank : 0;
    if (replicas && rank > 0) {
        rf = read_rank_file(dir, JOBDIR_MODEL, rank, pos->step, rp, sizeof rp, err);
        if (!rf) {
            rc = err ? err->code : DDPD_EDATA;
            goto out;
        }
        rc = load_params(m, rf, rp, err);
    } else {
        rc = load_params(m, mf, mp, err);
    }
    if (rc)
        goto out;
    ofile = legacy ? NULL : read_rank_file(dir, JOBDIR_OPTIM, from, pos->step, op, sizeof op, err);
    if (legacy && join_path(op, sizeof op, dir, JOBDIR_OPTIM ".safetensors"))
        ofile = safetensors_read(op, err);
    if (!ofile) {
        rc = err ? err->code : DDPD_EDATA;
        goto out;
    }
    if (!legacy && meta_i64(ofile, "optim_steps", &osteps)) {
        rc = ddpd_error_set(err, DDPD_EDATA, op, "%s: metadata optim_steps missing", op);
        goto out;
    }
    struct dev dev = model_dev(m);
    for (int i = 0; i < optim_state_count(o); i++) {
        const struct param *like;
        char name[128];
        float *d = optim_state_at(o, i, name, sizeof name, &like);
        const struct safetensors_tensor *t = safetensors_get(ofile, name);
        int64_t n = 1;
        for (int k = 0; t && k < t->ndim; k++)
            n *= t->shape[k];
        if (!t || n != like->numel) {
            rc = ddpd_error_set(err, DDPD_EDATA, op, "%s: optimizer state \"%s\" is %s", op, name,
                                t ? "of the wrong size" : "missing (different optimizer?)");
            goto out;
        }
        dev.ops->to_device(dev.ctx, d, t->data, (size_t)n * sizeof(float));
    }
    optim_restore(o, osteps);
    rc = DDPD_OK;
out:
    safetensors_free(mf);
    safetensors_free(rf);
    safetensors_free(ofile);
    return rc;
}

ddpd_err checkpoint_data_record(const char *dir, char **record, int64_t *step, struct ddpd_error *err)
{
    char mp[4096];
    *record = NULL;
    if (!jobdir_model_path(mp, sizeof mp, dir))
        return ddpd_error_set(err, DDPD_EIO, dir, "checkpoint directory name too long");
    struct safetensors_file *f = safetensors_read_header(mp, err);
    if (!f)
        return err ? err->code : DDPD_EDATA;
    const char *v = safetensors_meta_get(f, FINGERPRINT_META_KEY);
    ddpd_err rc = DDPD_OK;
    if (step && meta_i64(f, "step", step))
        rc = ddpd_error_set(err, DDPD_EDATA, mp, "%s: not a ddpd checkpoint (metadata step missing)", mp);
    else if (v && !(*record = strdup(v)))
        rc = ddpd_error_set(err, DDPD_ENOMEM, mp, "%s: out of memory reading its metadata", mp);
    safetensors_free(f);
    return rc;
}

/* Retention (checkpoint.keep_last, the job disk quota): an upper bound of what one
 * checkpoint writes, so that the quota is checked before a byte of it is. */
#define CKPT_HEADER_PER_TENSOR 512  /* name <= 127 bytes, dtype, shape, offsets, JSON */
#define CKPT_HEADER_FIXED      4096 /* length word, metadata, padding */

int64_t checkpoint_bytes_bound(struct model *m, struct optim *o, const char *data_record)
{
    int64_t sum = 2 * CKPT_HEADER_FIXED;
    /* The data record is metadata of both files, a JSON string inside the header: at most
     * 6 bytes ("\u00XX") for each of its own. */
    if (data_record)
        sum += 2 * 6 * (int64_t)strlen(data_record);
    for (int i = 0; i < model_param_count(m); i++) {
        const struct param *p = model_param(m, i);
        sum += p->numel * (int64_t)sizeof(float) + CKPT_HEADER_PER_TENSOR;
    }
    for (int i = 0; i < model_alias_count(m); i++)
        sum +=
            model_param(m, model_alias(m, i)->param)->numel * (int64_t)sizeof(float) + CKPT_HEADER_PER_TENSOR;
    for (int i = 0; i < model_buffer_count(m); i++)
        sum += model_buffer(m, i)->numel * 8 + CKPT_HEADER_PER_TENSOR;
    for (int i = 0; i < optim_state_count(o); i++) {
        const struct param *like;
        char name[128];
        optim_state_at(o, i, name, sizeof name, &like);
        sum += like->numel * (int64_t)sizeof(float) + CKPT_HEADER_PER_TENSOR;
    }
    return sum;
}
