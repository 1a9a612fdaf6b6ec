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

#include "safetensors.h"

#define CKPT_FORMAT "ddpd-checkpoint-1"

static float *host_buffer(int64_t n) { return malloc((size_t)n * sizeof(float)); }

static ddpd_err write_pair(const char *model_path, const char *optim_path, struct model *m,
                           struct optim *o, const struct train_pos *pos, struct ddpd_error *err)
{
    struct dev dev = model_dev(m);
    int np = model_param_count(m);
    int ns = optim_state_count(o);
    struct st_tensor *t = calloc((size_t)(np > ns ? np : ns) + 1, sizeof *t);
    float **host = calloc((size_t)(np + ns) + 1, sizeof *host);
    ddpd_err rc = DDPD_ENOMEM;
    if (!t || !host)
        goto out;

    for (int i = 0; i < np; i++) {
        struct param *p = model_param(m, i);
        host[i] = host_buffer(p->numel);
        if (!host[i])
            goto out;
        dev.ops->to_host(dev.ctx, host[i], p->data, (size_t)p->numel * sizeof(float));
        snprintf(t[i].name, sizeof t[i].name, "%s", p->name);
        t[i].ndim = p->ndim;
        t[i].shape[0] = p->shape[0];
        t[i].shape[1] = p->shape[1];
        t[i].data = host[i];
    }
    char step[32], epoch[32], estep[32], osteps[32];
    snprintf(step, sizeof step, "%" PRId64, pos->step);
    snprintf(epoch, sizeof epoch, "%" PRId64, pos->epoch);
    snprintf(estep, sizeof estep, "%" PRId64, pos->epoch_step);
    snprintf(osteps, sizeof osteps, "%" PRId64, optim_steps(o));
    struct st_meta meta[] = {
        {"format", CKPT_FORMAT}, {"step", step}, {"epoch", epoch}, {"epoch_step", estep},
        {"optim_steps", osteps},
    };
    int nmeta = (int)(sizeof meta / sizeof meta[0]);
    rc = st_write(model_path, t, np, meta, nmeta, err);
    if (rc)
        goto out;

    for (int i = 0; i < ns; i++) {
        const struct param *like;
        char name[128];
        float *d = optim_state_at(o, i, name, sizeof name, &like);
        float **h = &host[np + i];
        *h = host_buffer(like->numel);
        rc = DDPD_ENOMEM;
        if (!*h)
            goto out;
        dev.ops->to_host(dev.ctx, *h, d, (size_t)like->numel * sizeof(float));
        snprintf(t[i].name, sizeof t[i].name, "%s", name);
        t[i].ndim = like->ndim;
        t[i].shape[0] = like->shape[0];
        t[i].shape[1] = like->shape[1];
        t[i].data = *h;
    }
    rc = st_write(optim_path, t, ns, meta, nmeta, err);
out:
    if (rc == DDPD_ENOMEM)
        ddpd_error_set(err, rc, model_path, "out of memory while writing a checkpoint");
    if (host)
        for (int i = 0; i < np + ns; i++)
            free(host[i]);
    free(host);
    free(t);
    return rc;
}

/* dir/file into out; false when it does not fit. */
static bool join_path(char *out, size_t cap, const char *dir, const char *file)
{
    int n = snprintf(out, cap, "%s/%s", dir, file);
    return n >= 0 && (size_t)n < cap;
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

ddpd_err ckpt_save_files(const char *dir, struct model *m, struct optim *o,
                         const struct train_pos *pos, struct ddpd_error *err)
{
    char mp[4096], op[4096];
    if (!join_path(mp, sizeof mp, dir, "model.safetensors") ||
        !join_path(op, sizeof op, dir, "optim.safetensors"))
        return ddpd_error_set(err, DDPD_EIO, dir, "checkpoint directory name too long");
    return write_pair(mp, op, m, o, pos, err);
}

ddpd_err ckpt_save_dir(const char *dir, struct model *m, struct optim *o,
                       const struct train_pos *pos, struct ddpd_error *err)
{
    char tmp[4096], parent[4096];
    if (!join_path(tmp, sizeof tmp - 4, dir, "") )
        return ddpd_error_set(err, DDPD_EIO, dir, "checkpoint directory name too long");
    snprintf(tmp, sizeof tmp, "%s.tmp", dir);
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
    if (mkdir(tmp, 0755) != 0)
        return ddpd_error_set(err, DDPD_EIO, tmp, "%s: cannot create: %s", tmp, strerror(errno));
    ddpd_err rc = ckpt_save_files(tmp, m, o, pos, err);
    if (rc)
        return rc;
    if (rename(tmp, dir) != 0)
        return ddpd_error_set(err, DDPD_EIO, dir, "%s: cannot rename from %s: %s", dir, tmp,
                              strerror(errno));
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
static ddpd_err load_params(struct model *m, const struct st_file *f, const char *path,
                            struct ddpd_error *err)
{
    struct dev dev = model_dev(m);
    int np = model_param_count(m);
    for (int i = 0; i < np; i++) {
        struct param *p = model_param(m, i);
        const struct st_tensor *t = st_get(f, p->name);
        if (!t)
            return ddpd_error_set(err, DDPD_EDATA, path, "%s: tensor \"%s\" is missing", path,
                                  p->name);
        int same = t->ndim == p->ndim;
        for (int d = 0; same && d < p->ndim; d++)
            same = t->shape[d] == p->shape[d];
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
    for (int i = 0; i < st_count(f); i++) {
        const char *name = st_at(f, i)->name;
        int known = 0;
        for (int j = 0; j < np && !known; j++)
            known = strcmp(model_param(m, j)->name, name) == 0;
        if (!known)
            return ddpd_error_set(err, DDPD_EDATA, path,
                                  "%s: tensor \"%s\" is not a parameter of this model", path, name);
    }
    return DDPD_OK;
}

ddpd_err ckpt_load_weights_fd(struct model *m, int fd, const char *name, struct ddpd_error *err)
{
    struct st_file *f = st_read_fd(fd, name, err);
    if (!f)
        return err ? err->code : DDPD_EDATA;
    ddpd_err rc = load_params(m, f, name, err);
    st_free(f);
    return rc;
}

ddpd_err ckpt_load_weights(struct model *m, const char *path, struct ddpd_error *err)
{
    struct st_file *f = st_read(path, err);
    if (!f)
        return err ? err->code : DDPD_EDATA;
    ddpd_err rc = load_params(m, f, path, err);
    st_free(f);
    return rc;
}

static int meta_i64(const struct st_file *f, const char *key, int64_t *out)
{
    const char *v = st_meta_get(f, key);
    if (!v)
        return -1;
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || end == v || *end || x < 0)
        return -1;
    *out = x;
    return 0;
}

ddpd_err ckpt_load_dir(const char *dir, struct model *m, struct optim *o, struct train_pos *pos,
                       struct ddpd_error *err)
{
    char mp[4096], op[4096];
    if (!join_path(mp, sizeof mp, dir, "model.safetensors") ||
        !join_path(op, sizeof op, dir, "optim.safetensors"))
        return ddpd_error_set(err, DDPD_EIO, dir, "checkpoint directory name too long");
    struct st_file *mf = NULL, *of = NULL;
    ddpd_err rc;
    int64_t osteps = 0;

    mf = st_read(mp, err);
    if (!mf) {
        rc = err ? err->code : DDPD_EDATA;
        goto out;
    }
    rc = load_params(m, mf, mp, err);
    if (rc)
        goto out;
    const char *fmt = st_meta_get(mf, "format");
    if (!fmt || strcmp(fmt, CKPT_FORMAT) != 0 || meta_i64(mf, "step", &pos->step) ||
        meta_i64(mf, "epoch", &pos->epoch) || meta_i64(mf, "epoch_step", &pos->epoch_step) ||
        meta_i64(mf, "optim_steps", &osteps)) {
        rc = ddpd_error_set(err, DDPD_EDATA, mp,
                            "%s: not a ddpd checkpoint (metadata format/step/epoch/epoch_step missing)", mp);
        goto out;
    }

    of = st_read(op, err);
    if (!of) {
        rc = err ? err->code : DDPD_EDATA;
        goto out;
    }
    struct dev dev = model_dev(m);
    for (int i = 0; i < optim_state_count(o); i++) {
        const struct param *like;
        char name[128];
        float *d = optim_state_at(o, i, name, sizeof name, &like);
        const struct st_tensor *t = st_get(of, name);
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
    st_free(mf);
    st_free(of);
    return rc;
}
