/* ddp.c — the reducer: buckets of gradient views, gradient-ready hooks that launch
 * bucket all-reduces in index order during backward, no_sync, join shadowing and the
 * final model sync (../shared/DDP.md §1–§4). Knows the model's parameters, the compute
 * backend and comm; nothing of data, the loop or the optimizer. */
#include "ddp.h"
#include "half.h"
#include "prof.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FIRST_BUCKET_BYTES (1 << 20) /* dist._DEFAULT_FIRST_BUCKET_BYTES */

struct bucket {
    float *buf; /* flat gradient storage; each parameter's grad is a view */
    int64_t numel;
    int nparams;
    int *params;    /* parameter indices in layout order */
    uint16_t *half; /* with a comm hook: the compressed bucket that is all-reduced */
    int pending;    /* gradients not yet ready in this backward */
    struct comm_req *req;
};

struct ddp {
    struct model *m;
    struct comm *comm;
    struct dev dev;
    struct ddp_opts opts;
    int world, rank;
    int nbuckets;
    struct bucket *buckets;
    int *bucket_of; /* parameter index -> bucket */
    /* per backward */
    bool require_sync; /* no_sync sets it false */
    bool armed;        /* the last forward decided to reduce */
    int next_bucket;   /* next bucket to launch, in index order */
    float scale;       /* float(1/divisor) for this backward */
    ddpd_err hook_rc;  /* first failure inside a hook */
    struct ddpd_error hook_err;
    /* join */
    float *zeros;         /* scratch for shadowed buckets */
    uint16_t *zeros_half; /* the same, compressed (with a comm hook) */
    /* With a hook and opts.initial_plan, until the first synced step is done: that step's
     * one all-reduce of every gradient in registration order (DDP.md §2.2). */
    bool initial_plan;
    uint16_t *whole;
    struct comm_req *whole_req;
    float *live; /* one tensor float: join's count of live ranks (a collective's
                  * tensors are the compute backend's memory, comm.h) */
    int64_t max_bucket;
    int64_t steps; /* synced steps this rank ran itself since the last join */
    /* buffers (DDP.md §1.3): PyTorch's require_forward_param_sync, true at the start and
     * after a synced training forward; the next training forward broadcasts them. */
    bool buf_sync;
    float live_votes; /* live ranks counted by this forward's notify_live */
};

int ddp_assign_buckets(const int64_t *bytes, int n, const int64_t *limits, int nlim, int *bucket_of)
{
    int b = 0, li = 0;
    int64_t acc = 0;
    for (int i = 0; i < n; i++) {
        bucket_of[i] = b;
        acc += bytes[i];
        if (acc >= limits[li]) {
            /* Closed on reaching the limit, so a bucket may exceed it by one tensor. */
            if (i + 1 < n)
                b++;
            acc = 0;
            if (li + 1 < nlim)
                li++;
        }
    }
    return n ? b + 1 : 0;
}

/* DDP.md §1.2 steps 1-2 with all-gathers instead of a broadcast, so that every rank,
 * rank 0 included, sees the mismatch and reports the same sentence. */
static ddpd_err check_same_model(struct ddp *d, struct ddpd_error *err)
{
    const int W = d->world, np = model_param_count(d->m);
    int64_t *counts = calloc((size_t)W, sizeof *counts);
    int64_t mine = np;
    ddpd_err rc = comm_allgather(d->comm, &mine, sizeof mine, counts, err);
    if (rc)
        goto out;
    for (int r = 0; r < W; r++)
        if (counts[r] != counts[0]) {
            rc = ddpd_error_set(err, DDPD_ESPEC, "model",
                                "DDP expects the same model on every rank: rank 0 has %" PRId64
                                " parameter tensors, rank %d has %" PRId64,
                                counts[0], r, counts[r]);
            goto out;
        }
    /* Shapes: [ndim, d0, d1] per parameter. */
    size_t bytes = (size_t)np * 3 * sizeof(int64_t);
    int64_t *shapes = malloc(bytes), *all = malloc(bytes * (size_t)W);
    if (!shapes || !all) {
        free(shapes);
        free(all);
        rc = ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory checking the model across ranks");
        goto out;
    }
    for (int i = 0; i < np; i++) {
        const struct param *p = model_param(d->m, i);
        shapes[3 * i] = p->ndim;
        shapes[3 * i + 1] = p->shape[0];
        shapes[3 * i + 2] = p->ndim > 1 ? p->numel / p->shape[0] : 0; /* the rest of the shape */
    }
    rc = comm_allgather(d->comm, shapes, bytes, all, err);
    for (int r = 1; !rc && r < W; r++) {
        const int64_t *a = all, *b = all + (size_t)r * 3 * (size_t)np;
        for (int i = 0; i < np; i++) {
            if (memcmp(a + 3 * i, b + 3 * i, 3 * sizeof(int64_t)) == 0)
                continue;
            char sa[64], sb[64];
            snprintf(sa, sizeof sa, a[3 * i] > 1 ? "[%" PRId64 ", %" PRId64 "]" : "[%" PRId64 "]",
                     a[3 * i + 1], a[3 * i + 2]);
            snprintf(sb, sizeof sb, b[3 * i] > 1 ? "[%" PRId64 ", %" PRId64 "]" : "[%" PRId64 "]",
                     b[3 * i + 1], b[3 * i + 2]);
            rc = ddpd_error_set(err, DDPD_ESPEC, "model",
                                "DDP expects the same model on every rank: parameter %s is %s on "
                                "rank 0 but %s on rank %d",
                                model_param(d->m, i)->name, sa, sb, r);
            break;
        }
    }
    free(shapes);
    free(all);
out:
    free(counts);
    return rc;
}

/* Rank `root`'s buffers (BatchNorm's running statistics) to every rank, in
 * registration order. A model without buffers sends nothing. */
static ddpd_err broadcast_buffers(struct ddp *d, int root, struct ddpd_error *err)
{
    for (int i = 0; i < model_buffer_count(d->m); i++) {
        struct model_buffer *b = model_buffer(d->m, i);
        ddpd_err rc = comm_broadcast(d->comm, b->data, (size_t)b->numel * (b->i64 ? 8 : 4), root, err);
        if (rc)
            return rc;
    }
    return DDPD_OK;
}

static ddpd_err broadcast_params_only(struct ddp *d, int root, struct ddpd_error *err);

/* Rank `root`'s module state (parameters, then buffers) to every rank (DDP.md §1.2 step 3
 * and the final sync of §4.5). */
static ddpd_err broadcast_params(struct ddp *d, int root, struct ddpd_error *err)
{
    ddpd_err rc = broadcast_params_only(d, root, err);
    return rc ? rc : broadcast_buffers(d, root, err);
}

/* Rank `root`'s parameters to every rank: one broadcast when they are contiguous. */
static ddpd_err broadcast_params_only(struct ddp *d, int root, struct ddpd_error *err)
{
    const int np = model_param_count(d->m);
    bool contiguous = true;
    for (int i = 0; i + 1 < np; i++) {
        const struct param *p = model_param(d->m, i);
        contiguous &= p->data + p->numel == model_param(d->m, i + 1)->data;
    }
    if (contiguous)
        return comm_broadcast(d->comm, model_param(d->m, 0)->data, (size_t)model_numel(d->m) * sizeof(float),
                              root, err);
    for (int i = 0; i < np; i++) {
        struct param *p = model_param(d->m, i);
        ddpd_err rc = comm_broadcast(d->comm, p->data, (size_t)p->numel * sizeof(float), root, err);
        if (rc)
            return rc;
    }
    return DDPD_OK;
}

/* Buckets over the parameters in reverse registration order, which is the order their
 * gradients become ready in backward (last layer first, bias before weight): the plan
 * PyTorch arrives at after its one-time rebuild (DDP.md §2.3). Same on every rank: it
 * depends on shapes only. */
static ddpd_err build_buckets(struct ddp *d, struct ddpd_error *err)
{
    const int np = model_param_count(d->m);
    int64_t *bytes = malloc((size_t)np * sizeof *bytes);
    int *order = malloc((size_t)np * sizeof *order), *bucket_of = malloc((size_t)np * sizeof(int));
    d->bucket_of = calloc((size_t)np, sizeof(int));
    ddpd_err rc = DDPD_ENOMEM;
    if (!bytes || !order || !bucket_of || !d->bucket_of)
        goto out;
    for (int j = 0; j < np; j++) {
        order[j] = np - 1 - j;
        bytes[j] = model_param(d->m, order[j])->numel * (int64_t)sizeof(float);
    }
    double cap = d->opts.bucket_cap_mb > 0 ? d->opts.bucket_cap_mb : 25;
    int64_t limits[2] = {FIRST_BUCKET_BYTES, (int64_t)(cap * 1024 * 1024)};
    if (limits[1] < 1)
        limits[1] = 1;
    d->nbuckets = ddp_assign_buckets(bytes, np, limits, 2, bucket_of);
    d->buckets = calloc((size_t)d->nbuckets, sizeof *d->buckets);
    if (!d->buckets)
        goto out;
    for (int j = 0; j < np; j++) {
        struct bucket *b = &d->buckets[bucket_of[j]];
        b->numel += bytes[j] / (int64_t)sizeof(float);
        b->nparams++;
    }
    for (int b = 0; b < d->nbuckets; b++) {
        struct bucket *bk = &d->buckets[b];
        bk->params = malloc((size_t)bk->nparams * sizeof(int));
        bk->buf = d->dev.ops->alloc(d->dev.ctx, (size_t)bk->numel * sizeof(float));
        if (d->opts.hook != DDP_HOOK_NONE)
            bk->half = malloc((size_t)bk->numel * sizeof(uint16_t));
        if (!bk->params || !bk->buf || (d->opts.hook != DDP_HOOK_NONE && !bk->half))
            goto out;
        if (bk->numel > d->max_bucket)
            d->max_bucket = bk->numel;
        bk->nparams = 0;
    }
    int64_t *offset = calloc((size_t)d->nbuckets, sizeof *offset);
    if (!offset)
        goto out;
    for (int j = 0; j < np; j++) {
        int b = bucket_of[j], i = order[j];
        struct bucket *bk = &d->buckets[b];
        struct param *p = model_param(d->m, i);
        bk->params[bk->nparams++] = i;
        d->bucket_of[i] = b;
        model_set_grad_storage(d->m, i, bk->buf + offset[b]);
        offset[b] += p->numel;
    }
    free(offset);
    d->zeros = d->dev.ops->alloc(d->dev.ctx, (size_t)(d->max_bucket ? d->max_bucket : 1) * sizeof(float));
    d->live = d->dev.ops->alloc(d->dev.ctx, 2 * sizeof(float));
    if (d->opts.hook != DDP_HOOK_NONE)
        d->zeros_half = calloc((size_t)(d->max_bucket ? d->max_bucket : 1), sizeof(uint16_t));
    rc = d->zeros && d->live && (d->opts.hook == DDP_HOOK_NONE || d->zeros_half) ? DDPD_OK : DDPD_ENOMEM;
out:
    if (rc) /* a rank out of memory: exit 4 naming the tensor and its size */
        rc = ddpd_error_set(err, DDPD_EDEVICE, "model",
                            "out of memory: cannot allocate the DDP gradient buckets (%" PRId64
                            " floats, %.1f MiB)",
                            model_numel(d->m), (double)model_numel(d->m) * sizeof(float) / (1 << 20));
    free(bytes);
    free(order);
    free(bucket_of);
    return rc;
}

struct ddp *ddp_new(struct model *model, struct comm *comm, const struct ddp_opts *opts,
                    struct ddpd_error *err)
{
    struct ddp *d = calloc(1, sizeof *d);
    if (!d) {
        ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory creating DDP");
        return NULL;
    }
    d->m = model;
    d->comm = comm;
    d->dev = model_dev(model);
    d->opts = *opts;
    d->world = comm_world(comm);
    d->rank = comm_rank(comm);
    d->require_sync = true;
    d->buf_sync = true;
    d->initial_plan = opts->initial_plan && opts->hook != DDP_HOOK_NONE;
    if (model_param_count(model) == 0) {
        ddpd_error_set(err, DDPD_ESPEC, "model", "DDP needs a model with trainable parameters");
        goto fail;
    }
    /* The hook casts and sums on the host (half.c); the spec refuses it with device cuda. */
    if (opts->hook != DDP_HOOK_NONE && (!d->dev.ops->host_memory || !comm_has_half(comm))) {
        ddpd_error_set(err, DDPD_ESPEC, "ddp.comm_hook",
                       "a comm hook needs device \"cpu\" and the cpu collectives (ddp.backend \"cpu\")");
        goto fail;
    }
    if (check_same_model(d, err) || (!opts->keep_params && broadcast_params(d, 0, err)) ||
        build_buckets(d, err))
        goto fail;
    return d;
fail:
    ddp_free(d);
    return NULL;
}

void ddp_free(struct ddp *d)
{
    if (!d)
        return;
    for (int b = 0; b < d->nbuckets; b++) {
        /* Gradients point into the buckets: the model must not be used after this,
         * except to be freed. */
        free(d->buckets[b].params);
        free(d->buckets[b].half);
        d->dev.ops->free(d->dev.ctx, d->buckets[b].buf);
    }
    free(d->zeros_half);
    free(d->whole);
    if (d->zeros)
        d->dev.ops->free(d->dev.ctx, d->zeros);
    if (d->live)
        d->dev.ops->free(d->dev.ctx, d->live);
    free(d->buckets);
    free(d->bucket_of);
    free(d);
}

/* One small all-reduce, started and waited for. */
static ddpd_err allreduce_now(struct ddp *d, float *v, int64_t n, struct ddpd_error *err)
{
    struct comm_req *req;
    ddpd_err rc = comm_allreduce_start(d->comm, v, n, &req, err);
    return rc ? rc : comm_wait(d->comm, req, err);
}

/* Join's count of live ranks: this rank's vote (1 live, 0 joined) summed over ranks. */
static ddpd_err count_live(struct ddp *d, float vote, float *live, struct ddpd_error *err)
{
    d->dev.ops->fill(d->dev.ctx, d->live, vote, 1);
    ddpd_err rc = allreduce_now(d, d->live, 1, err);
    if (rc == DDPD_OK)
        d->dev.ops->to_host(d->dev.ctx, live, d->live, sizeof *live);
    return rc;
}

/* With buffers, join notifies at every training forward, synced or not, since a no_sync
 * forward may broadcast buffers too: one all-reduce of [live vote, synced vote] (N1 and
 * N5 of DDP.md §4.2 in one), paired with a joined rank's [0, 0]. */
static ddpd_err notify_live(struct ddp *d, float vote, bool synced, float out[2], struct ddpd_error *err)
{
    d->dev.ops->fill(d->dev.ctx, d->live, vote, 1);
    d->dev.ops->fill(d->dev.ctx, d->live + 1, synced ? 1.0f : 0.0f, 1);
    ddpd_err rc = allreduce_now(d, d->live, 2, err);
    if (rc == DDPD_OK)
        d->dev.ops->to_host(d->dev.ctx, out, d->live, 2 * sizeof(float));
    return rc;
}

/* DDP.md §1.3: the buffer broadcast at the start of a training forward, from rank 0 or,
 * in join mode, from the highest rank that has not joined (all-reduce MAX of the rank,
 * -1 from a joined rank, which receives). Only when the previous training forward was a
 * synced one; the flag then follows this forward. */
static ddpd_err sync_buffers(struct ddp *d, bool live, bool synced, struct ddpd_error *err)
{
    ddpd_err rc = DDPD_OK;
    if (d->buf_sync) {
        int64_t root = 0;
        if (d->opts.join) {
            root = live ? d->rank : -1;
            rc = comm_allreduce_max_i64(d->comm, &root, 1, err);
        }
        if (rc == DDPD_OK)
            rc = broadcast_buffers(d, (int)root, err);
    }
    d->buf_sync = synced;
    return rc;
}

ddpd_err ddp_forward_begin(struct ddp *d, struct ddpd_error *err)
{
    d->armed = d->require_sync;
    if (model_buffer_count(d->m) > 0) {
        float live[2] = {0, 0};
        ddpd_err rc = d->opts.join ? notify_live(d, 1.0f, d->armed, live, err) : DDPD_OK;
        if (rc || (rc = sync_buffers(d, true, d->armed, err)))
            return rc;
        d->live_votes = live[0];
    }
    if (!d->armed)
        return DDPD_OK;
    /* With a comm hook the hook divides, by the group size (DDP.md §4.3): the live count
     * is still exchanged (the joined ranks pair with it) but not used. */
    const bool by_live = !d->opts.divide_by_initial_world_size && d->opts.hook == DDP_HOOK_NONE;
    int divisor = d->world;
    if (d->opts.join && model_buffer_count(d->m) > 0) {
        if (by_live)
            divisor = (int)(d->live_votes + 0.5f);
    } else if (d->opts.join) {
        /* N1 of DDP.md §4.2, paired with the joined ranks' J1: the count of live ranks. */
        float live;
        ddpd_err rc = count_live(d, 1.0f, &live, err);
        if (rc)
            return rc;
        if (by_live)
            divisor = (int)(live + 0.5f);
    }
    d->scale = (float)(1.0 / (double)divisor);
    d->next_bucket = 0;
    d->hook_rc = DDPD_OK;
    for (int b = 0; b < d->nbuckets; b++) {
        d->buckets[b].pending = d->buckets[b].nparams;
        d->buckets[b].req = NULL;
    }
    d->steps++;
    return DDPD_OK;
}

static half_kind kind_of(ddp_hook h)
{
    return h == DDP_HOOK_BF16 ? HALF_BF16 : HALF_FP16;
}

static void launch(struct ddp *d, int b)
{
    struct bucket *bk = &d->buckets[b];
    if (d->hook_rc)
        return;
    if (d->opts.hook != DDP_HOOK_NONE && d->initial_plan) {
        /* PyTorch's first iteration has one bucket of everything, in registration order:
         * nothing goes until the last bucket is ready, then it all goes at once. */
        if (b + 1 < d->nbuckets)
            return;
        const half_kind k = kind_of(d->opts.hook);
        const int64_t total = model_numel(d->m);
        d->whole = malloc((size_t)(total ? total : 1) * sizeof(uint16_t));
        if (!d->whole) {
            d->hook_rc =
                ddpd_error_set(&d->hook_err, DDPD_ENOMEM, "", "out of memory for the comm hook's bucket");
            return;
        }
        int64_t off = 0;
        for (int i = 0; i < model_param_count(d->m); i++) {
            const struct param *p = model_param(d->m, i);
            half_compress(k, d->whole + off, p->grad, p->numel, d->world);
            off += p->numel;
        }
        d->hook_rc = comm_allreduce_half_start(d->comm, d->whole, total, k, &d->whole_req, &d->hook_err);
        return;
    }
    if (d->opts.hook != DDP_HOOK_NONE) {
        /* fp16_compress_hook: buffer.to(float16).div_(W), all-reduced in float16; copied
         * back in ddp_backward_end. No float(1/W) pre-scaling: the hook replaces it. */
        const half_kind k = kind_of(d->opts.hook);
        half_compress(k, bk->half, bk->buf, bk->numel, d->world);
        d->hook_rc = comm_allreduce_half_start(d->comm, bk->half, bk->numel, k, &bk->req, &d->hook_err);
        return;
    }
    /* Divide before the sum (DDP.md §2.4): each rank contributes grad * float(1/W). */
    const int ps = prof_scope(PROF_DDP);
    d->dev.ops->scale(d->dev.ctx, bk->buf, d->scale, bk->numel);
    const double t0 = prof_now();
    d->hook_rc = comm_allreduce_start(d->comm, bk->buf, bk->numel, &bk->req, &d->hook_err);
    prof_add("allreduce_start", t0);
    prof_scope_restore(ps);
}

void ddp_hook_lone(ddp_hook hook, struct model *m)
{
    if (hook == DDP_HOOK_NONE)
        return;
    for (int i = 0; i < model_param_count(m); i++) {
        struct param *p = model_param(m, i);
        /* In pieces, through a small stack buffer: cast, divide by 1 (exact), back. */
        uint16_t tmp[1024];
        for (int64_t o = 0; o < p->numel; o += 1024) {
            int64_t n = p->numel - o < 1024 ? p->numel - o : 1024;
            half_compress(kind_of(hook), tmp, p->grad + o, n, 1);
            half_decompress(kind_of(hook), p->grad + o, tmp, n);
        }
    }
}

void ddp_grad_ready(void *ctx, int index)
{
    struct ddp *d = ctx;
    if (!d->armed)
        return;
    struct bucket *bk = &d->buckets[d->bucket_of[index]];
    if (--bk->pending > 0)
        return;
    /* Launch strictly in bucket order, whatever order buckets complete in. */
    while (d->next_bucket < d->nbuckets && d->buckets[d->next_bucket].pending == 0)
        launch(d, d->next_bucket++);
}

/* ddp_backward_end of the first synced step under opts.initial_plan: waits for the one
 * all-reduce and copies each parameter's part back; later steps use the buckets. */
static ddpd_err end_initial_plan(struct ddp *d, ddpd_err rc, struct ddpd_error *err)
{
    if (d->whole_req) {
        ddpd_err w = comm_wait(d->comm, d->whole_req, rc ? NULL : err);
        d->whole_req = NULL;
        if (!rc)
            rc = w;
    }
    if (!rc) {
        int64_t off = 0;
        for (int i = 0; i < model_param_count(d->m); i++) {
            struct param *p = model_param(d->m, i);
            half_decompress(kind_of(d->opts.hook), p->grad, d->whole + off, p->numel);
            off += p->numel;
        }
    }
    free(d->whole);
    d->whole = NULL;
    d->initial_plan = false;
    return rc;
}

ddpd_err ddp_backward_end(struct ddp *d, struct ddpd_error *err)
{
    if (!d->armed)
        return DDPD_OK;
    d->armed = false;
    ddpd_err rc = d->hook_rc;
    if (rc && err)
        *err = d->hook_err;
    if (d->initial_plan && (d->whole_req || rc))
        return end_initial_plan(d, rc, err);
    for (int b = 0; b < d->nbuckets; b++) {
        struct bucket *bk = &d->buckets[b];
        if (bk->req) {
            ddpd_err w = comm_wait(d->comm, bk->req, rc ? NULL : err);
            bk->req = NULL;
            if (!rc)
                rc = w;
            /* The hook's decompress: buffer.copy_(the 16-bit sum). */
            if (!rc && d->opts.hook != DDP_HOOK_NONE)
                half_decompress(kind_of(d->opts.hook), bk->buf, bk->half, bk->numel);
        } else if (!rc) {
            rc = ddpd_error_set(err, DDPD_EINTERNAL, "",
                                "bucket %d was never reduced: parameter %s got no gradient in backward", b,
                                model_param(d->m, bk->params[0])->name);
        }
    }
    return rc;
}

bool ddp_no_sync_enter(struct ddp *d)
{
    bool prev = d->require_sync;
    d->require_sync = false;
    return prev;
}

void ddp_no_sync_exit(struct ddp *d, bool prev)
{
    d->require_sync = prev;
}

ddpd_err ddp_join(struct ddp *d, int64_t *shadowed, struct ddpd_error *err)
{
    return ddp_join_each(d, NULL, NULL, shadowed, err);
}

ddpd_err ddp_join_each(struct ddp *d, ddp_step_hook hook, void *ctx, int64_t *shadowed,
                       struct ddpd_error *err)
{
    ddpd_err rc = DDPD_OK;
    int64_t n = 0, iters = 0;
    const bool buffers = model_buffer_count(d->m) > 0;
    if (d->opts.join) {
        for (;;) {
            /* J1: pairs with a live rank's N1; 0 means every rank has joined. */
            float live[2] = {0, 1};
            rc = buffers ? notify_live(d, 0.0f, false, live, err) : count_live(d, 0.0f, &live[0], err);
            if (rc)
                goto out;
            if (live[0] < 0.5f)
                break;
            iters++;
            /* With buffers: the live ranks' broadcast (received here: this replica's
             * buffers are overwritten, as PyTorch's joined ranks' are), and a no_sync
             * forward of theirs is shadowed by nothing more. */
            if (buffers && (rc = sync_buffers(d, false, live[1] > 0.5f, err)))
                goto out;
            if (live[1] < 0.5f)
                continue;
            /* Shadow the live ranks' bucket all-reduces with zeros, in bucket order (the
             * job's first synced step: PyTorch's initial plan, one bucket of everything). */
            bool shadowed_whole = d->initial_plan;
            if (d->initial_plan) {
                const int64_t total = model_numel(d->m);
                uint16_t *z = calloc((size_t)(total ? total : 1), sizeof(uint16_t));
                struct comm_req *req;
                if (!z) {
                    rc = ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory for the comm hook's bucket");
                    goto out;
                }
                rc = comm_allreduce_half_start(d->comm, z, total, kind_of(d->opts.hook), &req, err);
                if (rc == DDPD_OK)
                    rc = comm_wait(d->comm, req, err);
                free(z);
                d->initial_plan = false;
                if (rc)
                    goto out;
            }
            for (int b = 0; b < d->nbuckets && !shadowed_whole; b++) {
                const int64_t numel = d->buckets[b].numel;
                if (d->opts.hook != DDP_HOOK_NONE) {
                    /* PyTorch's join hook runs the comm hook on a zero bucket: zeros
                     * cast, divided and summed in 16 bits (+0.0 is all zero bits). */
                    struct comm_req *req;
                    memset(d->zeros_half, 0, (size_t)numel * sizeof(uint16_t));
                    rc = comm_allreduce_half_start(d->comm, d->zeros_half, numel, kind_of(d->opts.hook), &req,
                                                   err);
                    if (rc == DDPD_OK)
                        rc = comm_wait(d->comm, req, err);
                } else {
                    d->dev.ops->fill(d->dev.ctx, d->zeros, 0.0f, numel);
                    rc = allreduce_now(d, d->zeros, numel, err);
                }
                if (rc)
                    goto out;
            }
            n++;
            /* The live ranks' own collectives after their optimizer step. */
            if (hook && (rc = hook(ctx, n, err)))
                goto out;
        }
    }
    /* Final sync (DDP.md §4.5): the last joiner is the highest rank among those that
     * shadowed nothing, i.e. ran the most steps. */
    int64_t auth = iters == 0 ? d->rank : -1;
    rc = comm_allreduce_max_i64(d->comm, &auth, 1, err);
    if (rc)
        goto out;
    rc = broadcast_params(d, (int)auth, err);
out:
    d->steps = 0;
    if (shadowed)
        *shadowed = n;
    return rc;
}

ddpd_err ddp_eval_params(struct ddp *d, bool live, struct ddpd_error *err)
{
    if (!d->opts.join)
        return DDPD_OK;
    /* The highest live rank, and whether any rank has joined. */
    int64_t v[2] = {live ? d->rank : -1, live ? 0 : 1};
    ddpd_err rc = comm_allreduce_max_i64(d->comm, v, 2, err);
    if (rc || v[1] == 0 || v[0] < 0)
        return rc;
    const int root = (int)v[0];
    for (int i = 0; i < model_param_count(d->m); i++) {
        struct param *p = model_param(d->m, i);
        /* A parameter is never larger than its bucket, nor the scratch than the largest. */
        float *dst = live && d->rank != root ? d->zeros : p->data;
        if ((rc = comm_broadcast(d->comm, dst, (size_t)p->numel * sizeof(float), root, err)))
            return rc;
    }
    /* The buffers too (BatchNorm's running statistics are what eval normalises with). */
    for (int i = 0; i < model_buffer_count(d->m); i++) {
        struct model_buffer *b = model_buffer(d->m, i);
        const size_t bytes = (size_t)b->numel * (b->i64 ? 8 : 4);
        /* The scratch holds the largest bucket: at least BatchNorm's weight and bias,
         * so any of its buffers. */
        void *dst = live && d->rank != root ? (void *)d->zeros : b->data;
        if ((rc = comm_broadcast(d->comm, dst, bytes, root, err)))
            return rc;
    }
    return DDPD_OK;
}

int ddp_bucket_count(const struct ddp *d)
{
    return d->nbuckets;
}

int ddp_bucket_params(const struct ddp *d, int b, int *idx, int cap, int64_t *bytes)
{
    const struct bucket *bk = &d->buckets[b];
    for (int i = 0; i < bk->nparams && i < cap; i++)
        idx[i] = bk->params[i];
    if (bytes)
        *bytes = bk->numel * (int64_t)sizeof(float);
    return bk->nparams;
}
