/* train.c — the training loop of one rank, top to bottom like the algorithm:
 *   for each optimizer step: zero grads; k micro-batches of forward, loss, backward
 *   (gradients add up); one optimizer update; log; checkpoint.
 * An epoch is a pass over this rank's shard; its last step takes the micro-batches that
 * are left when grad_accum does not divide the batch count. */
#include "train.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "checkpoint.h"
#include "data.h"
#include "dev.h"
#include "emit.h"
#include "nn.h"
#include "optim.h"

int64_t train_steps_per_epoch(int64_t batches, int64_t grad_accum)
{
    return (batches + grad_accum - 1) / grad_accum;
}

static ddpd_err mkdir_p(const char *path, struct ddpd_error *err)
{
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return ddpd_error_set(err, DDPD_EIO, path, "%s: cannot create: %s", buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST)
        return ddpd_error_set(err, DDPD_EIO, path, "%s: cannot create: %s", buf, strerror(errno));
    return DDPD_OK;
}

/* Joins data_dir and a spec path that the parser has already kept inside it. */
static void data_path(char *out, size_t cap, const char *data_dir, const char *rel)
{
    snprintf(out, cap, "%s/%s", data_dir && data_dir[0] ? data_dir : ".", rel);
}

static void emit_loss(int rank, const struct train_pos *pos, int64_t epoch, double loss,
                      double samples_per_s)
{
    struct event ev = {.kind = EVENT_LOSS, .rank = rank};
    ev.step = pos->step;
    ev.epoch = epoch;
    ev.loss = loss;
    ev.nonfinite = !isfinite(loss);
    ev.samples_per_s = samples_per_s;
    emit_event(&ev);
}

static void emit_checkpoint(int rank, int64_t step, const char *dir)
{
    struct event ev = {.kind = EVENT_CHECKPOINT, .rank = rank};
    ev.step = step;
    if (snprintf(ev.path, sizeof ev.path, "%s/model.safetensors", dir) >= (int)sizeof ev.path)
        ev.path[0] = '\0'; /* a path that long is refused earlier by the writer */
    emit_event(&ev);
}

ddpd_err train_run(const struct train_config *cfg, struct ddpd_error *err)
{
    const struct spec *s = cfg->spec;
    const int rank = cfg->rank;
    const int64_t k = s->grad_accum;
    const bool ce = s->loss == LOSS_CROSS_ENTROPY;
    const int64_t in = spec_in_width(s), out = spec_out_width(s);
    const int64_t bs = s->batch_size;
    struct dev dev = dev_cpu_new(1);
    struct dataset *ds = NULL;
    struct model *m = NULL;
    struct optim *o = NULL;
    float *hx = NULL, *hy = NULL, *x = NULL, *y = NULL, *dpred = NULL, *dloss = NULL;
    int32_t *hl = NULL, *labels = NULL;
    ddpd_err rc;

    ds = dataset_open(s, cfg->data_dir, rank, cfg->world_size, err);
    if (!ds) {
        rc = err ? err->code : DDPD_EDATA;
        goto out;
    }
    const int64_t nb = dataset_batches(ds);
    if (nb == 0 && cfg->world_size == 1) {
        rc = ddpd_error_set(err, DDPD_EDATA, "data",
                            "the data set has %" PRId64 " samples: not one batch of %" PRId64
                            " (drop_last is %s)",
                            dataset_shard_size(ds), bs, s->data.drop_last ? "on" : "off");
        goto out;
    }

    rc = DDPD_ENOMEM;
    m = model_new(dev, s, bs);
    if (!m)
        goto out;
    o = optim_new(&s->optim, m);
    if (!o)
        goto out;
    hx = malloc((size_t)(bs * in) * sizeof(float));
    hy = malloc((size_t)(bs * out) * sizeof(float));
    hl = malloc((size_t)bs * sizeof(int32_t));
    x = dev.ops->alloc(dev.ctx, (size_t)(bs * in) * sizeof(float));
    y = dev.ops->alloc(dev.ctx, (size_t)(bs * out) * sizeof(float));
    labels = dev.ops->alloc(dev.ctx, (size_t)bs * sizeof(int32_t));
    dpred = dev.ops->alloc(dev.ctx, (size_t)(bs * out) * sizeof(float));
    dloss = dev.ops->alloc(dev.ctx, sizeof(float));
    if (!hx || !hy || !hl || !x || !y || !labels || !dpred || !dloss)
        goto out;

    struct train_pos pos = {0, 0, 0};
    if (cfg->resume) {
        rc = ckpt_load_dir(cfg->resume, m, o, &pos, err);
        if (rc)
            goto out;
        emit_log("resumed from %s at step %" PRId64 " (epoch %" PRId64 ", batch %" PRId64 ")",
                 cfg->resume, pos.step, pos.epoch, pos.batch);
    } else if (s->init_from[0]) {
        char path[4096];
        data_path(path, sizeof path, cfg->data_dir, s->init_from);
        rc = ckpt_load_weights(m, path, err);
        if (rc)
            goto out;
    }
    if (rank == 0) {
        rc = mkdir_p(cfg->out_dir, err);
        if (rc)
            goto out;
    }

    const int64_t per_epoch = train_steps_per_epoch(nb, k);
    const int64_t total = s->steps ? s->steps : s->epochs * per_epoch;
    struct event start = {.kind = EVENT_START, .rank = rank};
    start.world_size = cfg->world_size;
    snprintf(start.device, sizeof start.device, "%s", device_kind_name(s->device));
    start.params = model_numel(m);
    start.batches = nb;
    emit_event(&start);

    const double t0 = emit_monotonic();
    double t_log = t0, last_loss = NAN;
    int64_t samples_since_log = 0, epoch_set = -1;
    while (pos.step < total) {
        if (pos.epoch != epoch_set) {
            dataset_set_epoch(ds, pos.epoch);
            epoch_set = pos.epoch;
        }
        const int64_t epoch = pos.epoch;
        const int64_t micro = k < nb - pos.batch ? k : nb - pos.batch;
        double loss_sum = 0;

        model_zero_grad(m);
        for (int64_t j = 0; j < micro; j++) {
            if (cfg->cancel && *cfg->cancel) {
                rc = ddpd_error_set(err, DDPD_ECANCELED, "", "cancelled by SIGTERM at step %" PRId64,
                                    pos.step + 1);
                goto out;
            }
            int64_t rows = dataset_batch(ds, pos.batch, hx, hy, hl);
            dev.ops->to_device(dev.ctx, x, hx, (size_t)(rows * in) * sizeof(float));
            const float *pred = model_forward(m, x, rows);
            if (ce) {
                dev.ops->to_device(dev.ctx, labels, hl, (size_t)rows * sizeof(int32_t));
                dev.ops->cross_entropy(dev.ctx, pred, labels, rows, out, dpred, dloss);
            } else {
                dev.ops->to_device(dev.ctx, y, hy, (size_t)(rows * out) * sizeof(float));
                dev.ops->mse(dev.ctx, pred, y, rows, out, dpred, dloss);
            }
            model_backward(m, dpred, NULL, NULL);
            float l;
            dev.ops->to_host(dev.ctx, &l, dloss, sizeof l);
            loss_sum += l;
            samples_since_log += rows;
            pos.batch++;
        }
        optim_step(o);
        pos.step++;
        if (pos.batch == nb) {
            pos.epoch++;
            pos.batch = 0;
        }
        last_loss = loss_sum / (double)micro;

        if (pos.step % s->log_every == 0 || pos.step == total) {
            double now = emit_monotonic();
            double dt = now - t_log;
            emit_loss(rank, &pos, epoch, last_loss, dt > 0 ? (double)samples_since_log / dt : 0);
            t_log = now;
            samples_since_log = 0;
        }
        if (rank == 0 && s->checkpoint_every && pos.step % s->checkpoint_every == 0 &&
            pos.step != total) {
            char dir[4096];
            snprintf(dir, sizeof dir, "%s/ckpt-%" PRId64, cfg->out_dir, pos.step);
            rc = ckpt_save_dir(dir, m, o, &pos, err);
            if (rc)
                goto out;
            emit_checkpoint(rank, pos.step, dir);
        }
    }
    const double seconds = emit_monotonic() - t0;

    if (rank == 0) {
        rc = ckpt_save_files(cfg->out_dir, m, o, &pos, err);
        if (rc)
            goto out;
        emit_checkpoint(rank, pos.step, cfg->out_dir);
    }
    struct event done = {.kind = EVENT_DONE, .rank = rank};
    done.steps = pos.step;
    done.loss = last_loss;
    done.nonfinite = !isfinite(last_loss);
    done.seconds = seconds;
    emit_event(&done);
    rc = DDPD_OK;
out:
    if (rc == DDPD_ENOMEM)
        ddpd_error_set(err, rc, "", "out of memory building the model for batch %" PRId64, bs);
    if (dev.ops) {
        dev.ops->free(dev.ctx, x);
        dev.ops->free(dev.ctx, y);
        dev.ops->free(dev.ctx, labels);
        dev.ops->free(dev.ctx, dpred);
        dev.ops->free(dev.ctx, dloss);
    }
    free(hx);
    free(hy);
    free(hl);
    optim_free(o);
    model_free(m);
    dataset_free(ds);
    dev_cpu_free(dev);
    return rc;
}
