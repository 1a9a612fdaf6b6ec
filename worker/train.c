/* train.c — the training loop of one rank, top to bottom like the algorithm:
 *   for each epoch: for each optimizer step: the step's lr from the schedule; zero grads;
 *   k micro-batches of forward, loss, backward (the first k-1 under no_sync, so gradients
 *   add up locally; the k-th reduces them across ranks); clip the gradients' norm
 *   (grad_clip); one optimizer update; log; eval (eval.every_steps); checkpoint.
 * The last step of an epoch takes the micro-batches that are left when grad_accum does
 * not divide the batch count. With uneven batch counts (join), a rank out of batches
 * shadows the others' steps until the epoch ends on every rank; then all replicas are
 * made equal again. Steps are counted globally: shadowed steps count too. */
#include "train.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../base/check.h"
#include "../base/clock.h"
#include "../base/file.h"
#include "../schema/jobdir.h"
#include "checkpoint.h"
#include "watch.h"
#include "data.h"
#include "ddp.h"
#include "prof.h"
#include "gpt2_init.h"
#include "dev.h"
#include "emit.h"
#include "fingerprint.h"
#include "model.h"
#include "optim.h"

/* The spec's ddp.comm_hook as the reducer's. */
static ddp_hook hook_of(comm_hook_kind k)
{
    return k == COMM_HOOK_FP16 ? DDP_HOOK_FP16 : k == COMM_HOOK_BF16 ? DDP_HOOK_BF16 : DDP_HOOK_NONE;
}

/* Optimizer steps in one epoch of `batches` micro-batches with grad_accum k: the last
 * step of an epoch takes the remaining micro-batches when k does not divide them. */
static int64_t steps_per_epoch(int64_t batches, int64_t grad_accum)
{
    /* Not (batches + grad_accum - 1) / grad_accum: grad_accum may be near INT64_MAX. */
    return batches / grad_accum + (batches % grad_accum != 0);
}

/* Optimizer steps of the whole job when the most batches a rank has per epoch is max_nb
 * (with join, ranks with fewer shadow the rest of the epoch's steps). Saturated: epochs
 * near INT64_MAX is a job that runs until it is cancelled. */
static int64_t job_steps(const struct spec *s, int64_t max_nb)
{
    int64_t total;
    if (s->steps)
        return s->steps;
    if (__builtin_mul_overflow(s->epochs, steps_per_epoch(max_nb, s->grad_accum), &total))
        return INT64_MAX;
    return total;
}

/* "model[2].layers[1]" for the layer whose key is "2.1": the JSON path the validator's
 * messages use. */
static void layer_path(char *out, size_t cap, const char *key)
{
    size_t o = (size_t)snprintf(out, cap, "model");
    for (const char *k = key; *k && o < cap;) {
        size_t n = strcspn(k, ".");
        o += (size_t)snprintf(out + o, cap - o, "%s[%.*s]", k == key ? "" : ".layers", (int)n, k);
        k += n;
        k += (*k == '.');
    }
}

/* The first batchnorm layer that a training batch of `rows` rows gives one value per
 * channel, or -1. PyTorch's rule (_verify_batch_size): the batch times the sizes past the
 * channel, N for BatchNorm1d on [N,C] and N·H·W for BatchNorm2d on [N,C,H,W], must be more
 * than 1. */
static int batchnorm_one_value(const struct spec *s, int64_t rows)
{
    for (int i = 0; i < s->n_layers; i++) {
        const struct spec_layer *l = &s->layers[i];
        if (l->kind != LAYER_BATCHNORM || l->dim < 1)
            continue;
        int64_t numel = 1;
        for (int d = 0; d < l->in_rank; d++)
            numel *= l->in_shape[d]; /* the validator bounds one sample's size */
        if (rows == 1 && numel / l->dim == 1)
            return i;
    }
    return -1;
}

/* Refuses, before any batch is trained, a rank whose shard of `shard` samples has a
 * training batch that would end the rank when the model reaches it (model_check_batch):
 * one that gives a batchnorm layer one value per channel. A batch is trained at step
 * b / grad_accum of every epoch (a joined rank's shadowed steps count too), so one the
 * job's `total` steps end before is never trained. The error names the layer (its JSON
 * path), the rank, the batch and its size, and what would avoid it. */
static ddpd_err check_rank_batches(const struct spec *s, int rank, int64_t shard, int64_t total,
                                   struct ddpd_error *err)
{
    const int64_t B = s->batch_size, nb = spec_batches(shard, B, s->data.drop_last);
    if (nb < 1)
        return DDPD_OK;
    /* Full batches of B, and a last one of what is left (B with drop_last). */
    const int64_t last = shard - (nb - 1) * B, first = nb > 1 ? B : last;
    int64_t b = 0, rows = first;
    int i = batchnorm_one_value(s, first);
    if (i < 0) {
        b = nb - 1;
        rows = last;
        i = batchnorm_one_value(s, last);
    }
    if (i < 0 || b / s->grad_accum >= total)
        return DDPD_OK;
    const struct spec_layer *l = &s->layers[i];
    char path[96], size[96];
    layer_path(path, sizeof path, l->key);
    int o = snprintf(size, sizeof size, "[%" PRId64, rows);
    for (int d = 0; d < l->in_rank && o > 0 && (size_t)o < sizeof size; d++)
        o += snprintf(size + o, sizeof size - (size_t)o, ", %" PRId64, l->in_shape[d]);
    if (o > 0 && (size_t)o < sizeof size - 1)
        snprintf(size + o, sizeof size - (size_t)o, "]");
    static const char torch[] = "which PyTorch refuses in training (\"Expected more than 1 value per channel "
                                "when training\")";
    if (B == 1) /* every batch */
        return ddpd_error_set(err, DDPD_ESPEC, path,
                              "%s (batchnorm): batches of batch_size 1 give it input size %s, 1 value per "
                              "channel, %s; set batch_size to 2 or more",
                              path, size, torch);
    return ddpd_error_set(err, DDPD_ESPEC, path,
                          "%s (batchnorm): rank %d's last batch of every epoch (batch %" PRId64 " of %" PRId64
                          ", in step %" PRId64 " of the epoch) holds 1 of its %" PRId64
                          " samples, so the layer's input size is %s, 1 value per channel, %s; set "
                          "data.drop_last to true to leave that batch out, or choose a batch_size that "
                          "leaves more than 1 sample over",
                          path, rank, nb, nb, b / s->grad_accum + 1, shard, size, torch);
}

ddpd_err train_check_batches(const struct spec *s, int64_t rows, int world_size, struct ddpd_error *err)
{
    int64_t max_nb = 0;
    for (int r = 0; r < world_size; r++) {
        const int64_t nb =
            spec_batches(spec_shard_rows(rows, r, world_size), s->batch_size, s->data.drop_last);
        max_nb = nb > max_nb ? nb : max_nb;
    }
    const int64_t total = job_steps(s, max_nb);
    ddpd_err rc = DDPD_OK;
    for (int r = 0; r < world_size && !rc; r++)
        rc = check_rank_batches(s, r, spec_shard_rows(rows, r, world_size), total, err);
    return rc;
}

/* Room for `n` elements of `size` bytes for the tensor `what` (device memory with `dev`,
 * else host memory). The byte count is checked, never wrapped; NULL with DDPD_EDEVICE
 * (exit 4) in `err`, naming the tensor and the bytes, when it cannot be had. */
static void *alloc_tensor(const struct dev *dev, int64_t n, size_t size, const char *what,
                          struct ddpd_error *err)
{
    int64_t bytes;
    void *p = NULL;
    if (n < 1)
        n = 1;
    if (!__builtin_mul_overflow(n, (int64_t)size, &bytes) && (uint64_t)bytes <= SIZE_MAX)
        p = dev ? dev->ops->alloc(dev->ctx, (size_t)bytes) : malloc((size_t)bytes);
    if (!p)
        ddpd_error_set(err, DDPD_EDEVICE, "batch_size",
                       "out of memory: cannot allocate the %s (%" PRId64 " x %zu bytes, %.1f MiB)", what, n,
                       size, (double)n * (double)size / (1 << 20));
    return p;
}

/* The batch buffers setup allocates, in 4-byte elements (floats and int32 labels), for
 * micro-batches of `rows` rows, `kmax` micro-batches a step, with or without eval: host
 * x, y and labels; device x, y, labels and the loss gradient; the step's losses on the
 * device and twice on the host; eval's loss and host logits. One list for setup and for
 * train_batch_bytes, so that what the estimate is tested against is what is allocated. */
enum {
    BB_HX,
    BB_HY,
    BB_HL,
    BB_X,
    BB_Y,
    BB_LABELS,
    BB_DPRED,
    BB_DLOSS,
    BB_HLOSS,
    BB_HCHECK,
    BB_ELOSS,
    BB_HPRED,
    BB_COUNT
};

static int64_t sat_mul64(int64_t a, int64_t b)
{
    int64_t r;
    return __builtin_mul_overflow(a, b, &r) ? INT64_MAX : r;
}

static void batch_sizes(const struct spec *s, int64_t rows, int64_t kmax, bool eval, int64_t n[BB_COUNT])
{
    const int64_t tn = spec_target_numel(s);
    const int64_t out = s->loss == LOSS_CROSS_ENTROPY ? sat_mul64(tn, spec_classes(s)) : tn;
    n[BB_HX] = n[BB_X] = sat_mul64(rows, spec_sample_numel(s));
    n[BB_HY] = n[BB_HL] = n[BB_Y] = n[BB_LABELS] = sat_mul64(rows, tn);
    n[BB_DPRED] = sat_mul64(rows, out);
    n[BB_DLOSS] = n[BB_HLOSS] = n[BB_HCHECK] = kmax;
    n[BB_ELOSS] = eval ? 1 : 0;
    n[BB_HPRED] = eval ? n[BB_DPRED] : 0;
}

int64_t train_batch_bytes(const struct spec *s, int64_t rows, int64_t kmax, bool eval)
{
    int64_t n[BB_COUNT], bytes = 0;
    batch_sizes(s, rows, kmax, eval, n);
    for (int i = 0; i < BB_COUNT; i++) {
        const bool allocated = eval || (i != BB_ELOSS && i != BB_HPRED);
        const int64_t b = allocated ? sat_mul64(n[i] > 1 ? n[i] : 1, 4) : 0; /* alloc_tensor: at least 1 */
        bytes = bytes > INT64_MAX - b ? INT64_MAX : bytes + b;
    }
    return bytes;
}

/* Where a rank's memory must fit: the server's --max-rank-memory (the job document's
 * max_rank_memory, 0 = none) and this machine's memory; the smaller one and its name. */
static int64_t memory_limit(const struct train_config *cfg, const char **name)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    int64_t phys = pages > 0 && page > 0 && pages <= INT64_MAX / page ? (int64_t)pages * page : 0;
    *name = "this machine's memory";
    if (cfg->max_rank_memory > 0 && (phys <= 0 || cfg->max_rank_memory <= phys)) {
        *name = "the server's --max-rank-memory";
        return cfg->max_rank_memory;
    }
    return phys;
}

static void emit_simple(event_kind kind, int rank, int64_t step)
{
    struct event ev = {.kind = kind, .rank = rank};
    ev.step = step;
    emit_event(&ev);
}

static void emit_checkpoint(int rank, int64_t step, const char *dir)
{
    struct event ev = {.kind = EVENT_CHECKPOINT, .rank = rank};
    ev.step = step;
    if (!jobdir_model_path(ev.path, sizeof ev.path, dir))
        ev.path[0] = '\0'; /* a path that long is refused earlier by the writer */
    emit_event(&ev);
}

/* The memory estimate of this rank for the data sets `in` describes against
 * memory_limit: DDPD_EDEVICE naming the largest part's field and the rank. */
static ddpd_err check_memory(const struct train_config *cfg, const struct spec_memory_in *in,
                             struct spec_memory *mem, struct ddpd_error *err)
{
    const char *limit_name;
    const int64_t limit = memory_limit(cfg, &limit_name);
    spec_memory_estimate(cfg->spec, in, mem);
    ddpd_err rc = spec_memory_check(cfg->spec, mem, limit, limit_name, DDPD_EDEVICE, err);
    if (rc) {
        char msg[sizeof err->message], path[sizeof err->path];
        snprintf(msg, sizeof msg, "%s", err->message);
        snprintf(path, sizeof path, "%s", err->path);
        ddpd_error_set(err, rc, path, "%s: rank %d: %s", path, cfg->rank, msg);
    }
    return rc;
}

/* Everything one rank trains with. */
struct run {
    const struct train_config *cfg;
    const struct spec *s;
    struct dev dev;
    struct dataset *ds;
    struct model *m;
    struct optim *o;
    struct ddp *ddp;
    bool join;
    bool said_pruned;  /* the keep_last note is logged once per run */
    char *data_record; /* every rank's data files (fingerprint.h), for checkpoints; NULL: none */
    /* Per sample: in, the input's 4-byte values (float32, or int32 ids for a model that
     * starts with embedding); tn, the target's values (mse: the output's elements;
     * cross_entropy: its class ids, 1 or T); out, the output's elements; classes, C. */
    int64_t in, tn, out, classes, nb, max_nb, total;
    float *hx, *hy, *x, *y, *dpred, *dloss; /* dloss: one loss per micro-batch of a step */
    float *hloss, *hcheck;                  /* hcheck: the step's losses read for on_nonfinite */
    int32_t *hl, *labels;
    /* eval (spec->eval.every_steps > 0): this rank's shard of eval.data, its batch count
     * (after max_batches), a device float for a batch's loss and the host logits */
    struct dataset *eds;
    int64_t enb;
    float *eloss, *hpred;
    /* early_stop's and checkpoint.keep_best's state (watch.h), the same on every rank;
     * stop_reason is set at the eval that stops the job, or at the pause (stop_at) */
    struct watch_state stop, best;
    char stop_reason[256];
    bool paused; /* stopped at cfg->stop_at or a preemption: its checkpoint written, no final model */
    int64_t preempted_at; /* the step of a preemption's checkpoint, 0 when none */
};

/* A logged step whose losses are on their way to the host. On CUDA the copy is queued
 * behind the step and read after the next step is queued, so the GPU never waits for
 * the host; on the CPU it is read at once. */
struct pending_log {
    bool on;
    int64_t step, epoch, micro, samples;
    double lr, grad_norm; /* grad_norm: NAN without grad_clip */
};

/* Agrees with the other ranks on the batch counts: join on or off, and the global
 * number of steps. */
static ddpd_err agree_on_batches(struct run *r, struct ddpd_error *err)
{
    const struct train_config *cfg = r->cfg;
    const struct spec *s = r->s;
    r->max_nb = r->nb;
    if (cfg->comm) {
        int64_t counts[SPEC_MAX_WORLD];
        ddpd_err rc = comm_allgather(cfg->comm, &r->nb, sizeof r->nb, counts, err);
        if (rc)
            return rc;
        int uneven_rank = -1;
        for (int i = 0; i < cfg->world_size; i++) {
            if (counts[i] > r->max_nb)
                r->max_nb = counts[i];
            if (counts[i] != counts[0] && uneven_rank < 0)
                uneven_rank = i;
        }
        if ((rc = spec_check_batch_counts(s, counts, err)))
            return rc;
        r->join = s->ddp.join == JOIN_TRUE || (s->ddp.join == JOIN_AUTO && uneven_rank >= 0);
    }
    if (r->max_nb == 0)
        return ddpd_error_set(err, DDPD_EDATA, "data",
                              "data: not one batch of %" PRId64 " in %s (%" PRId64
                              " samples on rank %d, drop_last %s)",
                              s->batch_size, cfg->world_size > 1 ? "any rank's shard" : "the data set",
                              dataset_shard_size(r->ds), cfg->rank, s->data.drop_last ? "on" : "off");
    r->total = job_steps(s, r->max_nb);
    /* The planner checked the batches of files it could read; {rank} files only the rank
     * sees, and it says now, not at the batch. */
    return check_rank_batches(s, cfg->rank, dataset_shard_size(r->ds), r->total, err);
}

/* One micro-batch: forward, loss (into dloss[j], on the device), backward. Adds the rows. */
static ddpd_err micro_batch(struct run *r, int64_t b, int64_t j, bool sync, int64_t *rows_out,
                            struct ddpd_error *err)
{
    const struct dev_ops *ops = r->dev.ops;
    void *ctx = r->dev.ctx;
    int ps = prof_scope(PROF_DATA);
    double t0 = prof_now();
    int64_t rows = dataset_batch(r->ds, b, r->hx, r->hy, r->hl);
    prof_add("dataset_batch", t0);
    prof_scope_restore(ps);
    if (rows < 0) {
        *rows_out = 0;
        if (err)
            *err = *dataset_error(r->ds);
        return dataset_error(r->ds)->code;
    }
    ddpd_err brc = model_check_batch(r->m, rows, err);
    if (brc)
        return brc;
    ps = prof_scope(PROF_DATA);
    t0 = prof_now();
    ops->to_device(ctx, r->x, r->hx, (size_t)(rows * r->in) * sizeof(float));
    prof_add("to_device", t0);
    prof_scope_restore(ps);

    bool prev = false;
    if (r->ddp && !sync)
        prev = ddp_no_sync_enter(r->ddp);
    if (r->ddp) {
        ps = prof_scope(PROF_DDP);
        t0 = prof_now();
        ddpd_err rc = ddp_forward_begin(r->ddp, err);
        prof_add("forward_begin", t0);
        prof_scope_restore(ps);
        if (rc)
            return rc;
    }
    const float *pred = model_forward(r->m, r->x, rows);
    ps = prof_scope(PROF_LOSS);
    if (r->s->loss == LOSS_CROSS_ENTROPY) {
        /* Sequence logits [B,T,C] with targets [B,T]: cross_entropy over B·T rows, the
         * mean over all positions (CONTRACT.md §2a). */
        ops->to_device(ctx, r->labels, r->hl, (size_t)(rows * r->tn) * sizeof(int32_t));
        ops->cross_entropy(ctx, pred, r->labels, rows * r->tn, r->classes, r->dpred, r->dloss + j);
    } else {
        ops->to_device(ctx, r->y, r->hy, (size_t)(rows * r->tn) * sizeof(float));
        ops->mse(ctx, pred, r->y, rows, r->tn, r->dpred, r->dloss + j);
    }
    prof_scope_restore(ps);
    model_backward(r->m, r->dpred, r->ddp ? ddp_grad_ready : NULL, r->ddp);
    /* A lone rank has no DDP, but PyTorch's runs its comm hook all the same. */
    if (!r->ddp && sync)
        ddp_hook_lone(hook_of(r->s->ddp.comm_hook), r->m);
    if (r->ddp) {
        ps = prof_scope(PROF_DDP);
        t0 = prof_now();
        ddpd_err rc = ddp_backward_end(r->ddp, err);
        prof_add("allreduce_wait", t0);
        prof_scope_restore(ps);
        if (!sync)
            ddp_no_sync_exit(r->ddp, prev);
        if (rc)
            return rc;
    }
    *rows_out = rows;
    return DDPD_OK;
}

/* Waits for the pending losses and emits the step's `loss` event. */
static void log_finish(struct run *r, struct pending_log *p, double *t_log, double *last_loss)
{
    if (!p->on)
        return;
    p->on = false;
    if (r->dev.ops->fetch_wait)
        r->dev.ops->fetch_wait(r->dev.ctx, r->hloss, p->micro);
    double loss_sum = 0;
    for (int64_t j = 0; j < p->micro; j++)
        loss_sum += r->hloss[j];
    *last_loss = loss_sum / (double)p->micro;
    double now = base_mono_s(), dt = now - *t_log;
    struct event ev = {.kind = EVENT_LOSS, .rank = r->cfg->rank};
    ev.step = p->step;
    ev.epoch = p->epoch;
    ev.loss = *last_loss;
    ev.nonfinite = !isfinite(*last_loss);
    ev.samples_per_s = dt > 0 ? (double)p->samples / dt : 0;
    ev.lr = p->lr;
    ev.has_lr = true;
    ev.grad_norm = p->grad_norm;
    ev.has_grad_norm = r->s->grad_clip > 0;
    emit_event(&ev);
    *t_log = now;
}

/* Starts reading a logged step's micro-batch losses; emits at once where reads are
 * immediate anyway (the CPU). */
static void log_start(struct run *r, struct pending_log *p, const struct pending_log *now, double *t_log,
                      double *last_loss)
{
    const struct dev_ops *ops = r->dev.ops;
    *p = *now;
    p->on = true;
    if (ops->fetch_start) {
        ops->fetch_start(r->dev.ctx, r->dloss, p->micro);
        return;
    }
    ops->to_host(r->dev.ctx, r->hloss, r->dloss, (size_t)p->micro * sizeof(float));
    log_finish(r, p, t_log, last_loss);
}

/* Deletes the oldest checkpoints beyond checkpoint.keep_last, newest = the one just
 * written. A failure is only a warning: the disk quota is the hard limit. */
static void prune_checkpoints(struct run *r, int64_t newest)
{
    struct ddpd_error perr;
    int pruned = 0;
    if (jobdir_prune(r->cfg->out_dir, r->s->checkpoint_keep_last, newest, &pruned, &perr) != DDPD_OK)
        emit_log("warning: old checkpoints not pruned (the disk quota still holds): %s", perr.message);
    if (pruned && !r->said_pruned) { /* once per run: a line per checkpoint would grow the log */
        r->said_pruned = true;
        emit_log("checkpoint.keep_last %" PRId64 ": older checkpoints are deleted as newer ones are written",
                 r->s->checkpoint_keep_last);
    }
}

/* A collective's failure, after which the caller's own error (if any) stays in err. */
static ddpd_err comm_failed(ddpd_err rc, const struct ddpd_error *cerr, struct ddpd_error *err)
{
    if (err)
        *err = *cerr;
    return rc;
}

/* What write_checkpoint writes: a checkpoint OUT/ckpt-STEP, the best one OUT/best-STEP
 * (checkpoint.keep_best), or the run's final files in OUT. */
enum ckpt_kind { CKPT_STEP, CKPT_BEST, CKPT_FINAL };

/* Writes a checkpoint of `kind` at `pos`. Collective (every rank calls it at the same
 * point): rank 0 makes the temporary folder; every rank writes its own optimizer state
 * (ranks that joined early stepped less often, so theirs differs: DDP.md §4.5); the lowest
 * rank that ran this step itself writes the weights (a joined rank's are stale until the
 * final sync); once every rank has reported success, rank 0 renames the folder into place
 * and emits the event. A failure on any rank fails every rank, naming it. */
static ddpd_err write_checkpoint(struct run *r, const struct train_pos *pos, bool live, enum ckpt_kind kind,
                                 struct ddpd_error *err)
{
    const struct train_config *cfg = r->cfg;
    const int rank = cfg->rank, W = cfg->world_size;
    const bool final = kind == CKPT_FINAL;
    struct train_pos at = *pos;
    at.stop = r->stop;
    at.best = r->best;
    struct ddpd_error cerr;
    char dir[4096], tmp[4096 + 8];
    int64_t *all = NULL;
    int writer = 0;
    ddpd_err rc = DDPD_OK, crc;

    /* A checkpoint taken as the epoch ends resumes at the start of the next one, after
     * the join's final sync has made the replicas equal: each rank then resumes from
     * the weights of the writer, one of the last joiners. Inside an epoch a rank that
     * stepped less often holds a replica of its own. */
    bool replicas = !final;
    if (!final && at.epoch_step >= steps_per_epoch(r->max_nb, r->s->grad_accum)) {
        at.epoch++;
        at.epoch_step = 0;
        replicas = false;
    }
    if (final)
        snprintf(dir, sizeof dir, "%s", cfg->out_dir);
    else if (!(kind == CKPT_BEST ? jobdir_best_path(dir, sizeof dir - 8, cfg->out_dir, at.step)
                                 : jobdir_ckpt_path(dir, sizeof dir - 8, cfg->out_dir, at.step)))
        rc = ddpd_error_set(err, DDPD_EIO, cfg->out_dir, "%s: output directory name too long", cfg->out_dir);
    if (final)
        snprintf(tmp, sizeof tmp, "%s", dir);
    else
        jobdir_tmp_path(tmp, sizeof tmp, dir);
    /* The disk quota is checked before a byte is written; with per-rank state every
     * rank adds its own files, so the bound counts every rank. */
    if (!rc && rank == 0) {
        char what[64];
        if (final)
            snprintf(what, sizeof what, "the final model");
        else
            snprintf(what, sizeof what, "checkpoint %s", strrchr(dir, '/') + 1);
        int64_t bound = checkpoint_bytes_bound(r->m, r->o, r->data_record);
        if (r->join && W > 1)
            bound = bound > INT64_MAX / W ? INT64_MAX : bound * W;
        rc = jobdir_check_quota(cfg->out_dir, cfg->disk_quota, bound, what, err);
    }
    if (!rc && !final && rank == 0)
        rc = checkpoint_dir_begin(dir, tmp, sizeof tmp, err);
    if (cfg->comm) {
        all = calloc((size_t)W * 2, sizeof *all);
        if (!all)
            return ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory writing a checkpoint");
        int64_t mine[2] = {live || final, rc};
        if ((crc = comm_allgather(cfg->comm, mine, sizeof mine, all, &cerr))) {
            rc = comm_failed(crc, &cerr, err);
            goto out;
        }
        while (writer < W && !all[2 * writer])
            writer++;
        if (NEVER(writer == W)) /* the step was run by some rank */
            writer = 0;
        if (!rc && all[1] != DDPD_OK)
            rc = ddpd_error_set(err, DDPD_EIO, tmp,
                                "checkpoint of step %" PRId64
                                ": rank 0 could not start %s (rank 0's error says why)",
                                at.step, tmp);
    }
    if (rc)
        goto out;
    rc = checkpoint_write_rank(tmp, r->m, r->o, &at, rank, W, rank == writer, r->join, replicas,
                               r->data_record, err);
    if (cfg->comm) {
        int64_t mine = rc;
        if ((crc = comm_allgather(cfg->comm, &mine, sizeof mine, all, &cerr))) {
            rc = rc ? rc : comm_failed(crc, &cerr, err);
            goto out;
        }
        for (int q = 0; !rc && q < W; q++)
            if (all[q] != DDPD_OK)
                rc = ddpd_error_set(err, DDPD_EIO, dir,
                                    "checkpoint of step %" PRId64 ": rank %d could not write its part of %s",
                                    at.step, q, dir);
    }
    if (!rc && !final && rank == 0)
        rc = checkpoint_dir_commit(tmp, dir, err);
    if (!rc && rank == 0)
        emit_checkpoint(rank, at.step, dir);
    /* Only now, with the new one complete, are the oldest beyond checkpoint.keep_last
     * deleted: there are never fewer than keep_last. */
    if (!rc && kind == CKPT_STEP && rank == 0)
        prune_checkpoints(r, at.step);
    /* The best one replaces the one before only once it is whole. */
    struct ddpd_error perr;
    if (!rc && kind == CKPT_BEST && rank == 0 && jobdir_best_prune(cfg->out_dir, at.step, &perr) != DDPD_OK)
        emit_log("warning: the previous best checkpoint was not removed: %s", perr.message);
out:
    free(all);
    return rc;
}

/* Whether the losses of the step just run (micro of them, on the device) hold a NaN or
 * an infinity. */
static bool step_nonfinite(struct run *r, int64_t micro)
{
    r->dev.ops->to_host(r->dev.ctx, r->hcheck, r->dloss, (size_t)micro * sizeof(float));
    double sum = 0;
    for (int64_t j = 0; j < micro; j++)
        sum += r->hcheck[j];
    return !isfinite(sum);
}

/* Whether eval runs after optimizer step `step`: every eval.every_steps-th and the last
 * (once when both). */
static bool eval_due(const struct run *r, int64_t step)
{
    const int64_t every = r->s->eval.every_steps;
    return every > 0 && (step % every == 0 || step == r->total);
}

/* One rank's eval sums, all-gathered as bytes and added in rank order on every rank, so
 * the counts stay exact integers however large the eval set. */
struct eval_sums {
    double loss;     /* sum of the per-element losses */
    int64_t elems;   /* loss elements: positions (cross_entropy: rows, or rows x T) or rows x outputs (mse) */
    int64_t correct; /* cross_entropy: positions whose argmax is the label */
    int64_t samples; /* rows */
};

/* The eval of step `step` (CONTRACT.md §2a), collective: every rank, live or joined,
 * runs its shard of eval.data (at most max_batches batches) forward in eval mode with no
 * gradients and no buffer broadcast, then the ranks all-gather their sums and rank 0
 * emits the `eval` event. With join, the joined ranks first take the replica of the
 * highest live rank (ddp_eval_params), so every shard is scored with the model of this
 * step. The loss of a batch is the backend's loss op (its mean times its elements); the
 * argmax is taken on the host from the logits, on every backend. */
static ddpd_err run_eval(struct run *r, int64_t step, bool live, double *loss_out, double *acc_out,
                         struct ddpd_error *err)
{
    const struct train_config *cfg = r->cfg;
    const struct dev_ops *ops = r->dev.ops;
    void *ctx = r->dev.ctx;
    const bool ce = r->s->loss == LOSS_CROSS_ENTROPY;
    struct eval_sums mine = {0}, *all = NULL;
    ddpd_err rc;
    if (r->ddp && (rc = ddp_eval_params(r->ddp, live, err)))
        return rc;
    model_set_training(r->m, false);
    for (int64_t b = 0; b < r->enb; b++) {
        const int64_t rows = dataset_batch(r->eds, b, r->hx, r->hy, r->hl);
        if (rows < 0) { /* a bad id in a mapped eval file, named by the data layer */
            if (err)
                *err = *dataset_error(r->eds);
            return dataset_error(r->eds)->code;
        }
        ops->to_device(ctx, r->x, r->hx, (size_t)(rows * r->in) * sizeof(float));
        const float *pred = model_forward(r->m, r->x, rows);
        float loss;
        const int64_t positions = rows * r->tn; /* cross_entropy rows: B, or B·T for sequences */
        if (ce) {
            ops->to_device(ctx, r->labels, r->hl, (size_t)positions * sizeof(int32_t));
            ops->cross_entropy(ctx, pred, r->labels, positions, r->classes, r->dpred, r->eloss);
            ops->to_host(ctx, r->hpred, pred, (size_t)(rows * r->out) * sizeof(float));
            for (int64_t i = 0; i < positions; i++) {
                const float *row = r->hpred + i * r->classes;
                int64_t best = 0; /* the first maximum, as torch.argmax */
                for (int64_t j = 1; j < r->classes; j++)
                    if (row[j] > row[best] || (isnan(row[j]) && !isnan(row[best])))
                        best = j;
                mine.correct += best == r->hl[i];
            }
            mine.elems += positions;
        } else {
            ops->to_device(ctx, r->y, r->hy, (size_t)(rows * r->out) * sizeof(float));
            ops->mse(ctx, pred, r->y, rows, r->out, r->dpred, r->eloss);
            mine.elems += rows * r->out;
        }
        ops->to_host(ctx, &loss, r->eloss, sizeof loss);
        mine.loss += (double)loss * (double)(ce ? positions : rows * r->out);
        mine.samples += rows;
    }
    model_set_training(r->m, true);

    struct eval_sums sum = mine;
    if (cfg->comm) {
        if (!(all = calloc((size_t)cfg->world_size, sizeof *all)))
            return ddpd_error_set(err, DDPD_ENOMEM, "eval", "out of memory gathering the eval sums");
        struct ddpd_error cerr;
        if ((rc = comm_allgather(cfg->comm, &mine, sizeof mine, all, &cerr))) {
            free(all);
            return comm_failed(rc, &cerr, err);
        }
        sum = (struct eval_sums){0};
        for (int q = 0; q < cfg->world_size; q++) {
            sum.loss += all[q].loss;
            sum.elems += all[q].elems;
            sum.correct += all[q].correct;
            sum.samples += all[q].samples;
        }
        free(all);
    }
    /* Every rank holds the same sums (added in rank order), so the same metric. */
    *loss_out = sum.elems > 0 ? sum.loss / (double)sum.elems : NAN;
    *acc_out = sum.elems > 0 ? (double)sum.correct / (double)sum.elems : NAN;
    if (cfg->rank == 0) {
        struct event ev = {.kind = EVENT_EVAL, .rank = 0};
        ev.step = step;
        ev.loss = *loss_out;
        ev.nonfinite = !isfinite(ev.loss);
        ev.has_accuracy = ce;
        ev.accuracy = *acc_out;
        ev.samples = sum.samples;
        emit_event(&ev);
    }
    return DDPD_OK;
}

/* What the ranks agree on after each optimizer step: the lowest rank whose loss of the
 * step is NaN or infinite (with on_nonfinite "fail"; -1 for none), and whether any rank
 * was asked to stop (SIGUSR1, cfg->preempt). */
struct step_vote {
    int nonfinite_rank;
    bool preempt;
};

/* The vote of the step just run (or shadowed: nonfinite false), in one collective for
 * both questions, so that a step costs no more collectives than the nonfinite check did
 * and one tiny all-reduce without it (none for a single rank): a MAX over one int64 that
 * is 2 * (W - rank) for a rank with a non-finite loss, plus 1 for a rank asked to stop.
 * The signal reaches ranks at different times; the MAX makes every rank stop after the
 * same step. Every rank calls it at the same point of the collective order, live or
 * shadowing (shadow_step). */
static ddpd_err step_vote(struct run *r, bool nonfinite, struct step_vote *v, struct ddpd_error *err)
{
    const struct train_config *cfg = r->cfg;
    const bool fail = r->s->on_nonfinite == NONFINITE_FAIL;
    int64_t x = (fail && nonfinite ? 2 * (int64_t)(cfg->world_size - cfg->rank) : 0) +
                (cfg->preempt && *cfg->preempt ? 1 : 0);
    if (cfg->comm) {
        struct ddpd_error cerr;
        ddpd_err rc = comm_allreduce_max_i64(cfg->comm, &x, 1, &cerr);
        if (rc)
            return comm_failed(rc, &cerr, err);
    }
    /* A non-finite loss hides the stop bit of lower values; the job fails then anyway. */
    v->nonfinite_rank = x >= 2 ? (int)(cfg->world_size - x / 2) : -1;
    v->preempt = x == 1;
    return DDPD_OK;
}

/* What every rank does after each optimizer step of the job, whether it ran the step
 * (live) or shadowed it (joined: called from ddp_join_each), at the same point of the
 * collective order, so that the ranks' collectives pair up, with the step's vote
 * (step_vote, already agreed):
 *   1. if some rank's loss of this step is NaN or infinite (on_nonfinite "fail"), fail
 *      every rank at this step;
 *   2. at an eval step, run the eval (every rank takes part), then decide early_stop and
 *      keep_best from its metric (the same on every rank) and write the best checkpoint
 *      when it improved; when early_stop stops here, this step becomes the last;
 *   3. at the pause's step (stop_at), this step becomes the last, with its checkpoint;
 *   4. when a rank was asked to stop (a preemption) and this is not the last step, the
 *      same, and the run reports the step (cfg->preempted_at): the checkpoint is the one
 *      checkpoint.every_steps writes at this step, so a resume goes on bit-exactly;
 *   5. at a checkpoint step, write the checkpoint. */
static ddpd_err after_step(struct run *r, const struct train_pos *pos, bool live, const struct step_vote *v,
                           struct ddpd_error *err)
{
    const struct train_config *cfg = r->cfg;
    const struct spec *s = r->s;
    if (v->nonfinite_rank >= 0)
        return ddpd_error_set(err, DDPD_ENONFINITE, "on_nonfinite",
                              "the loss of step %" PRId64 " on rank %d is not finite (NaN or infinite): "
                              "training diverged; the job fails (on_nonfinite is \"fail\"; "
                              "\"continue\" would train on)",
                              pos->step, v->nonfinite_rank);
    if (eval_due(r, pos->step)) {
        double loss = NAN, acc = NAN;
        ddpd_err rc = run_eval(r, pos->step, live, &loss, &acc, err);
        if (rc)
            return rc;
        bool stop = s->early_stop.on && watch_early_stop(&s->early_stop, &r->stop, pos->step,
                                                         watch_metric_of(&s->early_stop, loss, acc),
                                                         r->stop_reason, sizeof r->stop_reason);
        if (s->keep_best.on &&
            watch_keep_best(&s->keep_best, &r->best, pos->step, watch_metric_of(&s->keep_best, loss, acc)) &&
            (rc = write_checkpoint(r, pos, live, CKPT_BEST, err)))
            return rc;
        if (stop) {
            emit_log("%s: the job ends here", r->stop_reason);
            r->total = pos->step; /* every rank leaves its loop after this step */
        }
    }
    if (cfg->stop_at > 0 && pos->step == cfg->stop_at && pos->step < r->total) {
        /* A pause: this step is the last, and its checkpoint is where a resume goes on
         * (an early stop at the same eval wins: the job has ended for good). */
        snprintf(r->stop_reason, sizeof r->stop_reason, "paused at step %" PRId64, pos->step);
        emit_log("%s: the job ends here with its checkpoint", r->stop_reason);
        r->total = pos->step;
        r->paused = true;
        return write_checkpoint(r, pos, live, CKPT_STEP, err);
    }
    if (v->preempt && pos->step < r->total) {
        /* One checkpoint, whether or not this step is a checkpoint step anyway: with the
         * step now the last, step 5 writes none. */
        snprintf(r->stop_reason, sizeof r->stop_reason, "preempted at step %" PRId64, pos->step);
        r->total = pos->step;
        r->paused = true;
        ddpd_err rc = write_checkpoint(r, pos, live, CKPT_STEP, err);
        if (rc)
            return rc;
        r->preempted_at = pos->step;
        emit_log("preempted: checkpoint at step %" PRId64 ", exiting", pos->step);
        return DDPD_OK;
    }
    if (s->checkpoint_every && pos->step % s->checkpoint_every == 0 && pos->step != r->total)
        return write_checkpoint(r, pos, live, CKPT_STEP, err);
    return DDPD_OK;
}

/* A joined rank's after_step for each step it shadows (ddp_join_each's hook). */
struct shadow {
    struct run *r;
    struct train_pos at; /* where this rank joined */
};

static ddpd_err shadow_step(void *ctx, int64_t n, struct ddpd_error *err)
{
    struct shadow *sh = ctx;
    struct train_pos pos = {
        .step = sh->at.step + n, .epoch = sh->at.epoch, .epoch_step = sh->at.epoch_step + n};
    struct step_vote v;
    ddpd_err rc = step_vote(sh->r, false, &v, err);
    return rc ? rc : after_step(sh->r, &pos, false, &v, err);
}

/* A copy of the spec whose data is eval.data, never shuffled (heap: a spec is large);
 * NULL when out of memory. */
static struct spec *eval_spec(const struct spec *s)
{
    struct spec *es = malloc(sizeof *es);
    if (es) {
        *es = *s;
        es->data = s->eval.data;
        es->data.shuffle = false;
    }
    return es;
}

/* An error of the data layer about eval.data: its path "data.x" becomes "eval.data.x"
 * and its message says it is the eval data (the file alone would not). */
static void eval_error(struct ddpd_error *err)
{
    if (!err)
        return;
    if (strncmp(err->path, "data", 4) == 0) {
        const size_t n = strnlen(err->path, sizeof err->path - 6); /* room for "eval." */
        memmove(err->path + 5, err->path, n);
        memcpy(err->path, "eval.", 5);
        err->path[n + 5] = '\0';
    }
    static const char pre[] = "eval.data: ";
    const size_t n = strnlen(err->message, sizeof err->message - sizeof pre);
    memmove(err->message + sizeof pre - 1, err->message, n);
    memcpy(err->message, pre, sizeof pre - 1);
    err->message[n + sizeof pre - 1] = '\0';
}

ddpd_err train_check_eval_data(const struct spec *s, const char *data_dir, int world_size,
                               struct spec_memory_in *mem, struct ddpd_error *err)
{
    mem->eval_rows = 0;
    mem->eval_rank_file = false;
    if (s->eval.every_steps <= 0)
        return DDPD_OK;
    struct spec *es = eval_spec(s);
    if (!es)
        return ddpd_error_set(err, DDPD_ENOMEM, "eval", "out of memory checking eval.data");
    int64_t rows = 0, file_bytes = 0;
    ddpd_err rc = dataset_check(es, data_dir, world_size, &rows, &file_bytes, err);
    free(es);
    if (rc == DDPD_ENOTFOUND) /* {rank} files: the ranks check them */
        return DDPD_OK;
    if (rc) {
        eval_error(err);
        return rc;
    }
    mem->eval_rows = rows;
    if (file_bytes > mem->file_bytes) /* one file is read whole at a time */
        mem->file_bytes = file_bytes;
    return DDPD_OK;
}

/* This rank's shard of eval.data, opened like the training data but never shuffled;
 * its batch count capped by eval.max_batches. An error names the eval.data field. */
static ddpd_err open_eval(struct run *r, struct ddpd_error *err)
{
    const struct spec *s = r->s;
    if (s->eval.every_steps <= 0)
        return DDPD_OK;
    struct spec *es = eval_spec(s);
    if (!es)
        return ddpd_error_set(err, DDPD_ENOMEM, "eval", "out of memory opening eval.data");
    r->eds = dataset_open(es, r->cfg->data_dir, r->cfg->rank, r->cfg->world_size, err);
    free(es);
    if (!r->eds) {
        eval_error(err);
        return err ? err->code : DDPD_EDATA;
    }
    dataset_set_epoch(r->eds, 0);
    r->enb = dataset_batches(r->eds);
    if (s->eval.max_batches > 0 && r->enb > s->eval.max_batches)
        r->enb = s->eval.max_batches;
    return DDPD_OK;
}

/* This rank's data files as it opened them: the data's, then eval.data's (named so). */
static int my_fingerprints(const struct run *r, struct fingerprint out[FINGERPRINT_MAX])
{
    int n = 0, k;
    const struct fingerprint *fp = dataset_fingerprints(r->ds, &k);
    for (int i = 0; i < k && n < FINGERPRINT_MAX; i++)
        out[n++] = fp[i];
    fp = r->eds ? dataset_fingerprints(r->eds, &k) : NULL;
    for (int i = 0; fp && i < k && n < FINGERPRINT_MAX; i++, n++) {
        out[n] = fp[i];
        snprintf(out[n].field, sizeof out[n].field, "eval.%.18s", fp[i].field); /* "eval.data.x" */
    }
    return n;
}

static void note_log(const char *sentence)
{
    emit_log("%s", sentence);
}

/* A resume goes on only on the data its checkpoint was written on (or with resume_force):
 * each rank checks its own files against the record, so a restart and `ddpd run --resume`
 * are checked as a resume through the server is. */
static ddpd_err check_resume_data(struct run *r, int64_t step, struct ddpd_error *err)
{
    struct fingerprint fp[FINGERPRINT_MAX];
    int n = my_fingerprints(r, fp);
    char *record = NULL;
    if (n == 0) /* synthetic data */
        return DDPD_OK;
    ddpd_err rc = checkpoint_data_record(r->cfg->resume, &record, NULL, err);
    if (rc == DDPD_OK)
        rc = fingerprint_check(record, fp, n, step, r->cfg->resume_force, note_log, err);
    free(record);
    return rc;
}

/* The record every checkpoint of this run carries: the files every rank reads, and each
 * rank's own {rank} files, which only their rank sees (gathered once, here). */
static ddpd_err record_data(struct run *r, struct ddpd_error *err)
{
    const struct train_config *cfg = r->cfg;
    struct rank_files {
        int32_t n, pad;
        struct fingerprint fp[FINGERPRINT_MAX];
    } mine = {0}, *all = NULL;
    mine.n = my_fingerprints(r, mine.fp);
    bool own = false;
    for (int i = 0; i < mine.n; i++)
        own = own || mine.fp[i].rank >= 0;
    if (mine.n == 0)
        return DDPD_OK;
    const int W = own && cfg->comm ? cfg->world_size : 1;
    struct fingerprint *list = malloc(sizeof *list * (size_t)(W * FINGERPRINT_MAX));
    ddpd_err rc = DDPD_OK;
    int n = 0;
    if (!list || (W > 1 && !(all = malloc(sizeof *all * (size_t)W)))) {
        rc = ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory recording the data files");
        goto out;
    }
    if (W > 1 && (rc = comm_allgather(cfg->comm, &mine, sizeof mine, all, err)))
        goto out;
    for (int i = 0; i < mine.n; i++)
        if (mine.fp[i].rank < 0)
            list[n++] = mine.fp[i];
    for (int q = 0; q < W; q++) {
        const struct rank_files *f = W > 1 ? &all[q] : &mine;
        for (int i = 0; i < f->n && i < FINGERPRINT_MAX; i++)
            if (f->fp[i].rank >= 0)
                list[n++] = f->fp[i];
    }
    if (!(r->data_record = fingerprint_record(list, n)))
        rc = ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory recording the data files");
out:
    free(all);
    free(list);
    return rc;
}

static ddpd_err setup(struct run *r, struct train_pos *pos, struct ddpd_error *err)
{
    const struct train_config *cfg = r->cfg;
    const struct spec *s = r->s;
    ddpd_err rc;

    /* This rank's memory before anything large is allocated: a job that cannot fit ends
     * here with the sizes (exit 4), not in the OOM killer. Synthetic data is sized by the
     * spec, so it is checked before it is generated; files once their rows are known. */
    struct spec_memory mem;
    struct spec_memory_in mi = {.rows = s->data.samples};
    if (s->eval.data.kind == DATA_SYNTHETIC) /* eval files: counted once they are open */
        mi.eval_rows = s->eval.data.samples;
    if (s->data.kind == DATA_SYNTHETIC && (rc = check_memory(cfg, &mi, &mem, err)))
        return rc;
    r->ds = dataset_open(s, cfg->data_dir, cfg->rank, cfg->world_size, err);
    if (!r->ds)
        return err ? err->code : DDPD_EDATA;
    r->nb = dataset_batches(r->ds);
    r->in = spec_sample_numel(s);
    r->tn = spec_target_numel(s);
    r->classes = spec_classes(s);
    if (s->loss != LOSS_CROSS_ENTROPY)
        r->out = r->tn;
    else if (__builtin_mul_overflow(r->tn, r->classes, &r->out))
        r->out = INT64_MAX; /* fails the size check below */
    if ((rc = open_eval(r, err)))
        return rc;
    mi.rows = dataset_rows(r->ds);
    mi.rank_file = dataset_rank_file(r->ds);
    if (r->eds) {
        mi.eval_rows = dataset_rows(r->eds);
        mi.eval_rank_file = dataset_rank_file(r->eds);
    }
    if ((rc = check_memory(cfg, &mi, &mem, err)))
        return rc;
    const char *limit_name;
    const int64_t limit = memory_limit(cfg, &limit_name);
    emit_log("memory: about %.1f MiB on the host and %.1f MiB on the device (limit %.1f MiB, %s); "
             "micro-batches of at most %" PRId64 " rows",
             (double)mem.host / (1 << 20), (double)mem.device / (1 << 20), (double)limit / (1 << 20),
             limit_name, mem.rows);

    /* A micro-batch is at most the shard: batch_size alone (which may be near INT64_MAX
     * on a small data set) sizes nothing. An eval batch is at most the eval shard. */
    int64_t rows = spec_batch_rows(s, dataset_shard_size(r->ds));
    if (r->eds && spec_batch_rows(s, dataset_shard_size(r->eds)) > rows)
        rows = spec_batch_rows(s, dataset_shard_size(r->eds));
    int64_t rows_in, rows_out, rows_xn, rows_yn; /* host batches: a sample's values (data.h) */
    if (__builtin_mul_overflow(rows, r->in, &rows_in) || __builtin_mul_overflow(rows, r->out, &rows_out) ||
        __builtin_mul_overflow(rows, spec_sample_numel(s), &rows_xn) ||
        __builtin_mul_overflow(rows, spec_target_numel(s), &rows_yn))
        return ddpd_error_set(err, DDPD_EDEVICE, "batch_size",
                              "batch_size: micro-batches of %" PRId64 " rows are larger than any memory",
                              rows);
    r->m = model_new_err(r->dev, s, rows, err);
    if (!r->m)
        return err ? err->code : DDPD_EDEVICE;
    model_set_rank(r->m, cfg->rank);
    r->o = optim_new(&s->optim, r->m);
    if (!r->o)
        return ddpd_error_set(err, DDPD_EDEVICE, "optimizer",
                              "out of memory: cannot allocate the optimizer state (%.1f MiB)",
                              (double)mem.optim / (1 << 20));
    const struct dev *dv = &r->dev;
    /* A step has at most min(grad_accum, batches) micro-batches. */
    const int64_t kmax = s->grad_accum < r->nb ? s->grad_accum : r->nb > 0 ? r->nb : 1;
    int64_t n[BB_COUNT];
    batch_sizes(s, rows, kmax, r->eds != NULL, n);
    if (!(r->hx = alloc_tensor(NULL, n[BB_HX], sizeof(float), "batch inputs (host)", err)) ||
        !(r->hy = alloc_tensor(NULL, n[BB_HY], sizeof(float), "batch targets (host)", err)) ||
        !(r->hl = alloc_tensor(NULL, n[BB_HL], sizeof(int32_t), "batch labels (host)", err)) ||
        !(r->x = alloc_tensor(dv, n[BB_X], sizeof(float), "batch inputs", err)) ||
        !(r->y = alloc_tensor(dv, n[BB_Y], sizeof(float), "batch targets", err)) ||
        !(r->labels = alloc_tensor(dv, n[BB_LABELS], sizeof(int32_t), "batch labels", err)) ||
        !(r->dpred = alloc_tensor(dv, n[BB_DPRED], sizeof(float), "loss gradient", err)) ||
        !(r->dloss = alloc_tensor(dv, n[BB_DLOSS], sizeof(float), "micro-batch losses", err)) ||
        !(r->hloss = alloc_tensor(NULL, n[BB_HLOSS], sizeof(float), "micro-batch losses (host)", err)) ||
        !(r->hcheck =
              alloc_tensor(NULL, n[BB_HCHECK], sizeof(float), "micro-batch losses (on_nonfinite)", err)))
        return DDPD_EDEVICE;
    if (r->eds && (!(r->eloss = alloc_tensor(dv, n[BB_ELOSS], sizeof(float), "eval loss", err)) ||
                   !(r->hpred = alloc_tensor(NULL, n[BB_HPRED], sizeof(float), "eval outputs (host)", err))))
        return DDPD_EDEVICE;

    memset(pos, 0, sizeof *pos);
    if (cfg->resume) {
        rc = checkpoint_load_dir(cfg->resume, r->m, r->o, cfg->rank, cfg->world_size, pos, err);
        if (rc || (rc = check_resume_data(r, pos->step, err)))
            return rc;
        emit_log("resumed from %s at step %" PRId64 " (epoch %" PRId64 ", step %" PRId64 " of the epoch)",
                 cfg->resume, pos->step, pos->epoch, pos->epoch_step);
        r->stop = pos->stop;
        r->best = pos->best;
        /* A rank killed between a checkpoint's commit and its prune left keep_last + 1
         * of them (and perhaps a torn ckpt-N.tmp): the restart finishes that prune, so
         * a job ended before its next checkpoint still keeps keep_last. */
        if (cfg->rank == 0)
            prune_checkpoints(r, pos->step);
        /* A best checkpoint written after this one (by the run that is resumed) is the
         * future's: the run writes it again when it gets there. Only the best this
         * checkpoint knows stays. */
        struct ddpd_error perr;
        if (cfg->rank == 0 && s->keep_best.on &&
            jobdir_best_prune(cfg->out_dir, r->best.step, &perr) != DDPD_OK)
            emit_log("warning: best checkpoints past the resumed step not removed: %s", perr.message);
    } else if (s->init_from_job > 0) {
        /* Another job's weights: a path the server resolved in its own jobs folder (never
         * one from the spec), handed over in the stdin document. */
        char name[64];
        snprintf(name, sizeof name, "job %" PRId64 "'s weights", s->init_from_job);
        if (!cfg->init_path || !cfg->init_path[0])
            return ddpd_error_set(err, DDPD_ESPEC, "init.from_job",
                                  "init.from_job: only ddpd serve can find another job's weights (ddpd run "
                                  "takes init.from with a file)");
        int fd = open(cfg->init_path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0)
            return ddpd_error_set(err, DDPD_EDATA, "init.from_job", "init.from_job: %s: %s", name,
                                  errno == ENOENT ? "gone (the job was deleted, or its checkpoint pruned)"
                                                  : strerror(errno));
        if ((rc = checkpoint_load_weights_fd(r->m, fd, name, err)))
            return rc;
    } else if (s->init_from[0] && s->init_format == INIT_FORMAT_GPT2) {
        /* A Hugging Face GPT-2: its names and layout, and its config.json (gpt2_init.h). */
        if ((rc = gpt2_init_load(r->m, s, cfg->data_dir, err)))
            return rc;
    } else if (s->init_from[0]) {
        /* Opened beneath the data directory in one step, as the data files are: nothing
         * swapped in between a check and the open can lead out of it. */
        int fd = data_path_open(cfg->data_dir, "init.from", s->init_from, err);
        if (fd < 0)
            return err ? err->code : DDPD_EDATA;
        rc = checkpoint_load_weights_fd(r->m, fd, s->init_from, err);
        if (rc)
            return rc;
    }
    /* Checkpoints are the job owner's: folders 0700, files 0600 (checkpoint.h). */
    int en = cfg->rank == 0 ? base_mkdirs(cfg->out_dir, true) : 0;
    if (en)
        return ddpd_error_set(err, DDPD_EIO, cfg->out_dir, "%s: cannot create: %s", cfg->out_dir,
                              strerror(en));
    if ((rc = agree_on_batches(r, err)) || (rc = record_data(r, err)))
        return rc;
    if (cfg->comm) {
        struct ddp_opts opts = {
            .bucket_cap_mb = s->ddp.bucket_cap_mb,
            .join = r->join,
            .divide_by_initial_world_size = s->ddp.divide_by_initial_world_size,
            .hook = hook_of(s->ddp.comm_hook),
            /* PyTorch's first iteration, before its bucket rebuild; a resumed job is past it. */
            .initial_plan = cfg->resume == NULL,
            /* Resumed replicas are the checkpoint's, each rank its own: no broadcast. */
            .keep_params = cfg->resume != NULL,
        };
        r->ddp = ddp_new(r->m, cfg->comm, &opts, err);
        if (!r->ddp)
            return err ? err->code : DDPD_EINTERNAL;
    }
    return DDPD_OK;
}

ddpd_err train_run(const struct train_config *cfg, struct ddpd_error *err)
{
    const struct spec *s = cfg->spec;
    const int rank = cfg->rank;
    const int64_t k = s->grad_accum;
    if (!cfg->dev.ops)
        return ddpd_error_set(err, DDPD_EINTERNAL, "device",
                              "train_run: no compute backend (the caller opens it)");
    /* DDPD_PROFILE (bench/profile): every op of the run timed, per layer and part of the step. */
    prof_init(rank);
    struct run r = {.cfg = cfg, .s = s, .dev = prof_wrap(cfg->dev)};
    if (cfg->preempted_at)
        *cfg->preempted_at = 0;
    struct pending_log pend = {0};
    struct train_pos pos;
    ddpd_err rc = setup(&r, &pos, err);
    if (rc)
        goto out;

    struct event start = {.kind = EVENT_START, .rank = rank};
    start.world_size = cfg->world_size;
    snprintf(start.device, sizeof start.device, "%s", device_kind_name(s->device));
    start.params = model_numel(r.m);
    start.activation_bytes = model_activation_bytes(r.m);
    start.batches = r.nb;
    emit_event(&start);
    emit_log("training %" PRId64 " steps: %" PRId64 " parameters, %" PRId64 " samples in %" PRId64
             " batches of %" PRId64 " per epoch, %d rank%s%s",
             r.total, model_numel(r.m), dataset_shard_size(r.ds), r.nb, s->batch_size, cfg->world_size,
             cfg->world_size > 1 ? "s" : "", r.join ? ", join on" : "");

    const double t0 = base_mono_s();
    double t_log = t0, last_loss = NAN;
    int64_t samples_since_log = 0;
    /* The latest step this rank ran, and the latest it logged: a cancel between two steps
     * logs the step it ends after, so that the job's step is the one the rank's log names
     * (issue 31: the log said 1774, the job 1770, with log_every 10). */
    struct pending_log ran = {.step = pos.step};
    int64_t logged = pos.step;
    /* The bytes this rank sends per step (bench/: compressed gradients), from here on. */
    const uint64_t sent0 = comm_bytes_sent(cfg->comm);
    const int64_t step0 = pos.step;
    if (cfg->in_loop)
        *cfg->in_loop = 1;
    if (cfg->stop_at > 0 && pos.step >= cfg->stop_at && pos.step < r.total) {
        /* Resumed at its pause's own checkpoint (a rank killed after it wrote it, before it
         * ended: a server SIGKILLed at that moment restarts the attempt): it has paused. */
        snprintf(r.stop_reason, sizeof r.stop_reason, "paused at step %" PRId64, pos.step);
        emit_log("%s (resumed at its pause's checkpoint): the job ends here", r.stop_reason);
        r.total = pos.step;
        r.paused = true;
    }
    while (pos.step < r.total) {
        dataset_set_epoch(r.ds, pos.epoch);
        int64_t b;
        if (__builtin_mul_overflow(pos.epoch_step, k, &b) || b > r.nb)
            b = r.nb; /* grad_accum may be near INT64_MAX */

        /* This rank's steps of the epoch. */
        while (pos.step < r.total && b < r.nb) {
            const int64_t epoch = pos.epoch, micro = k < r.nb - b ? k : r.nb - b;
            int64_t step_samples = 0;
            const double lr = optim_schedule_lr(&s->optim, pos.step + 1, r.total);
            double grad_norm = NAN;
            model_zero_grad(r.m);
            for (int64_t j = 0; j < micro; j++, b++) {
                if (cfg->cancel && *cfg->cancel) {
                    /* Before this step's first micro-batch the last step's losses are still
                     * on the device: log it, if it was not. */
                    if (j == 0 && ran.step > logged) {
                        log_finish(&r, &pend, &t_log, &last_loss);
                        log_start(&r, &pend, &ran, &t_log, &last_loss);
                        log_finish(&r, &pend, &t_log, &last_loss);
                    }
                    rc = ddpd_error_set(err, DDPD_ECANCELED, "", "cancelled by SIGTERM after step %" PRId64,
                                        pos.step);
                    goto out;
                }
                int64_t rows;
                model_set_position(r.m, pos.step, j); /* dropout's masks: resumes draw the same */
                rc = micro_batch(&r, b, j, j == micro - 1, &rows, err);
                if (rc)
                    goto out;
                step_samples += rows;
            }
            /* After the all-reduce of the step's last micro-batch, before the update. */
            int ps = prof_scope(PROF_CLIP);
            if (s->grad_clip > 0)
                grad_norm = optim_clip_grad_norm(r.o, s->grad_clip);
            prof_scope(PROF_OPTIM);
            optim_set_lr(r.o, lr);
            optim_step(r.o);
            prof_scope(PROF_LOG);
            pos.step++;
            pos.epoch_step++;
            samples_since_log += step_samples;
            /* With on_nonfinite "fail" each step's losses are read at once (on CUDA this
             * waits for the step), so that every rank stops at the same step. */
            const bool nonfinite = s->on_nonfinite == NONFINITE_FAIL && step_nonfinite(&r, micro);
            ran = (struct pending_log){.step = pos.step,
                                       .epoch = epoch,
                                       .micro = micro,
                                       .samples = samples_since_log,
                                       .lr = lr,
                                       .grad_norm = grad_norm};

            /* What every rank agrees on after the step: a non-finite loss, a preemption. */
            struct step_vote vote;
            if ((rc = step_vote(&r, nonfinite, &vote, err)))
                goto out;

            /* The previous logged step's losses have arrived while this one was queued. */
            log_finish(&r, &pend, &t_log, &last_loss);
            /* With early_stop every eval step may be the last, so its loss is logged too;
             * so is a preemption's, the step the job stops at. */
            if (pos.step % s->log_every == 0 || pos.step == r.total || nonfinite ||
                (s->early_stop.on && eval_due(&r, pos.step)) || pos.step == cfg->stop_at || vote.preempt) {
                const struct pending_log now = {.step = pos.step,
                                                .epoch = epoch,
                                                .micro = micro,
                                                .samples = samples_since_log,
                                                .lr = lr,
                                                .grad_norm = grad_norm};
                log_start(&r, &pend, &now, &t_log, &last_loss);
                samples_since_log = 0;
                logged = pos.step;
            }
            if (nonfinite || (s->checkpoint_every && pos.step % s->checkpoint_every == 0) ||
                eval_due(&r, pos.step) || pos.step == cfg->stop_at || vote.preempt)
                log_finish(&r, &pend, &t_log, &last_loss); /* its loss event comes first */
            if ((rc = after_step(&r, &pos, true, &vote, err)))
                goto out;
            prof_scope_restore(ps);
            prof_step();
        }

        log_finish(&r, &pend, &t_log, &last_loss);
        if (r.join) {
            /* Out of batches (or out of steps): shadow the others, then resync. */
            int64_t shadowed;
            struct shadow sh = {.r = &r, .at = pos};
            if (b == r.nb && r.nb < r.max_nb)
                emit_simple(EVENT_JOIN, rank, pos.step);
            if ((rc = ddp_join_each(r.ddp, shadow_step, &sh, &shadowed, err)))
                goto out;
            pos.step += shadowed;
            pos.epoch_step += shadowed;
        }
        if (b < r.nb)
            break; /* the step budget ended inside the epoch */
        pos.epoch++;
        pos.epoch_step = 0;
    }
    log_finish(&r, &pend, &t_log, &last_loss);
    const double seconds = base_mono_s() - t0;
    prof_finish();

    if (!r.paused && (rc = write_checkpoint(&r, &pos, true, CKPT_FINAL, err)))
        goto out;
    if (r.preempted_at > 0) {
        /* Not done: the job goes on from ckpt-S when it is resumed. */
        if (cfg->preempted_at)
            *cfg->preempted_at = r.preempted_at;
        rc = DDPD_OK;
        goto out;
    }
    struct event done = {.kind = EVENT_DONE, .rank = rank};
    snprintf(done.stop_reason, sizeof done.stop_reason, "%s", r.stop_reason);
    done.steps = pos.step;
    done.loss = last_loss;
    done.nonfinite = !isfinite(last_loss);
    done.seconds = seconds;
    emit_event(&done);
    emit_log("done: %" PRId64 " steps in %.3f s, last loss %g", pos.step, seconds, last_loss);
    if (cfg->comm && comm_bytes_sent(cfg->comm) > 0 && pos.step > step0) {
        const uint64_t sent = comm_bytes_sent(cfg->comm) - sent0;
        emit_log("comm: %" PRIu64 " bytes sent in %" PRId64 " steps (%.0f per step)", sent, pos.step - step0,
                 (double)sent / (double)(pos.step - step0));
    }
    rc = DDPD_OK;
out:
    if (r.dev.ops) {
        r.dev.ops->free(r.dev.ctx, r.x);
        r.dev.ops->free(r.dev.ctx, r.y);
        r.dev.ops->free(r.dev.ctx, r.labels);
        r.dev.ops->free(r.dev.ctx, r.dpred);
        r.dev.ops->free(r.dev.ctx, r.dloss);
        r.dev.ops->free(r.dev.ctx, r.eloss);
    }
    free(r.hpred);
    dataset_free(r.eds);
    free(r.hx);
    free(r.hy);
    free(r.hl);
    free(r.hloss);
    free(r.hcheck);
    ddp_free(r.ddp);
    free(r.data_record);
    optim_free(r.o);
    model_free(r.m);
    dataset_free(r.ds);
    return rc;
}
