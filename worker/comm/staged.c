/* comm/staged.c — a host-memory backend (cpu) used for tensors that live on a device
 * (`ddp.backend: cpu` with `device: cuda`): each all-reduce or broadcast copies the
 * tensor into a host buffer, runs the wrapped backend on it and copies the result back.
 * Only the compute backend's table is used (to_host orders the copy after the work that
 * produced the tensor); host-memory collectives pass straight through. */
#include <stdlib.h>

#include "comm_impl.h"

struct slab {
    float *p;
    int64_t cap; /* floats */
    bool busy;
};

struct staged {
    const struct comm_ops *inner;
    void *ictx;
    struct dev dev;
    struct slab *slabs;
    int nslabs;
    char err[256];
};

/* What comm_req points at for this backend: the wrapped request and the staging. */
struct staged_req {
    struct comm_req *inner;
    int slab; /* index: the slab array may move as it grows */
    float *buf;
    int64_t n;
};

static void *host_alloc(struct staged *s, size_t bytes)
{
    return s->dev.ops->host_alloc ? s->dev.ops->host_alloc(s->dev.ctx, bytes) : malloc(bytes);
}

static void host_free(struct staged *s, void *p)
{
    if (s->dev.ops->host_free)
        s->dev.ops->host_free(s->dev.ctx, p);
    else
        free(p);
}

/* A free host buffer of at least n floats, by index. Buffers are kept and reused: a
 * step's buckets take the same ones every step. -1 when out of memory. */
static int slab_take(struct staged *s, int64_t n)
{
    struct slab *best = NULL;
    for (int i = 0; i < s->nslabs; i++)
        if (!s->slabs[i].busy && (!best || s->slabs[i].cap > best->cap))
            best = &s->slabs[i];
    if (!best) {
        struct slab *grown = realloc(s->slabs, (size_t)(s->nslabs + 1) * sizeof *grown);
        if (!grown)
            return -1;
        s->slabs = grown;
        best = &s->slabs[s->nslabs++];
        *best = (struct slab){0};
    }
    if (best->cap < n) {
        float *p = host_alloc(s, (size_t)n * sizeof(float));
        if (!p)
            return -1;
        if (best->p)
            host_free(s, best->p);
        best->p = p;
        best->cap = n;
    }
    best->busy = true;
    return (int)(best - s->slabs);
}

static ddpd_err fail(struct staged *s, ddpd_err rc, const char *what)
{
    snprintf(s->err, sizeof s->err, "%s", what);
    return rc;
}

static ddpd_err st_init_rank(const struct comm_id *id, int rank, int world, double timeout_s, void **ctx,
                             char *errbuf, size_t errcap)
{
    (void)id, (void)rank, (void)world, (void)timeout_s, (void)ctx;
    snprintf(errbuf, errcap, "the staging adaptor wraps a joined backend (comm_bind_dev)");
    return DDPD_EINTERNAL;
}

static ddpd_err st_allreduce_start(void *ctx, float *buf, int64_t n, struct comm_req **req)
{
    struct staged *s = ctx;
    struct staged_req *r = calloc(1, sizeof *r);
    int k = r ? slab_take(s, n) : -1;
    if (k < 0) {
        free(r);
        return fail(s, DDPD_ENOMEM, "out of host memory staging an all-reduce");
    }
    struct slab *slab = &s->slabs[k];
    *r = (struct staged_req){.slab = k, .buf = buf, .n = n};
    s->dev.ops->to_host(s->dev.ctx, slab->p, buf, (size_t)n * sizeof(float));
    ddpd_err rc = s->inner->allreduce_start(s->ictx, slab->p, n, &r->inner);
    if (rc != DDPD_OK) {
        slab->busy = false;
        free(r);
        return rc;
    }
    *req = (struct comm_req *)r;
    return DDPD_OK;
}

static ddpd_err st_wait(void *ctx, struct comm_req *req)
{
    struct staged *s = ctx;
    struct staged_req *r = (struct staged_req *)req;
    ddpd_err rc = s->inner->wait(s->ictx, r->inner);
    /* to_device returns once the host buffer is consumed, so the slab is free again. */
    struct slab *slab = &s->slabs[r->slab];
    if (rc == DDPD_OK)
        s->dev.ops->to_device(s->dev.ctx, r->buf, slab->p, (size_t)r->n * sizeof(float));
    slab->busy = false;
    free(r);
    return rc;
}

static ddpd_err st_broadcast(void *ctx, void *buf, size_t bytes, int root)
{
    struct staged *s = ctx;
    int k = slab_take(s, (int64_t)((bytes + sizeof(float) - 1) / sizeof(float)));
    if (k < 0)
        return fail(s, DDPD_ENOMEM, "out of host memory staging a broadcast");
    struct slab *slab = &s->slabs[k];
    s->dev.ops->to_host(s->dev.ctx, slab->p, buf, bytes);
    ddpd_err rc = s->inner->broadcast(s->ictx, slab->p, bytes, root);
    if (rc == DDPD_OK)
        s->dev.ops->to_device(s->dev.ctx, buf, slab->p, bytes);
    slab->busy = false;
    return rc;
}

static ddpd_err st_allgather(void *ctx, const void *in, size_t bytes, void *out)
{
    struct staged *s = ctx;
    return s->inner->allgather(s->ictx, in, bytes, out);
}

/* The wrapped backend's optional slots keep their defaults (comm.c) when it lacks them. */
static ddpd_err st_allreduce_max_i64(void *ctx, int64_t *v, int n)
{
    struct staged *s = ctx;
    return s->inner->allreduce_max_i64(s->ictx, v, n);
}

static ddpd_err st_barrier(void *ctx)
{
    struct staged *s = ctx;
    return s->inner->barrier(s->ictx);
}

static void st_abort(void *ctx)
{
    struct staged *s = ctx;
    if (s->inner->abort)
        s->inner->abort(s->ictx);
}

static int st_cancel(void *ctx)
{
    struct staged *s = ctx;
    return s->inner->cancel ? s->inner->cancel(s->ictx) : 0;
}

static const char *st_last_error(void *ctx)
{
    struct staged *s = ctx;
    if (s->err[0])
        return s->err;
    return s->inner->last_error ? s->inner->last_error(s->ictx) : "";
}

static int st_failed_by_peer(void *ctx)
{
    struct staged *s = ctx;
    return !s->err[0] && s->inner->failed_by_peer && s->inner->failed_by_peer(s->ictx);
}

static void st_free(void *ctx)
{
    struct staged *s = ctx;
    s->inner->free(s->ictx);
    for (int i = 0; i < s->nslabs; i++)
        if (s->slabs[i].p)
            host_free(s, s->slabs[i].p);
    free(s->slabs);
    free(s);
}

/* The wrapped backend (cpu) has every optional slot; one without them is refused below,
 * so these forwards never call through NULL. */
static const struct comm_ops staged_ops = {
    .name = "staged",
    .init_rank = st_init_rank,
    .allreduce_start = st_allreduce_start,
    .wait = st_wait,
    .broadcast = st_broadcast,
    .allgather = st_allgather,
    .allreduce_max_i64 = st_allreduce_max_i64,
    .barrier = st_barrier,
    .abort = st_abort,
    .cancel = st_cancel,
    .last_error = st_last_error,
    .failed_by_peer = st_failed_by_peer,
    .free = st_free,
};

ddpd_err comm__staged_wrap(const struct comm_ops **ops, void **ctx, struct dev dev, char *errbuf,
                           size_t errcap)
{
    if (!(*ops)->allreduce_max_i64 || !(*ops)->barrier) {
        snprintf(errbuf, errcap, "the %s backend cannot stage %s tensors through the host", (*ops)->name,
                 dev.ops->name);
        return DDPD_EINTERNAL;
    }
    struct staged *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(errbuf, errcap, "out of memory");
        return DDPD_ENOMEM;
    }
    *s = (struct staged){.inner = *ops, .ictx = *ctx, .dev = dev};
    *ops = &staged_ops;
    *ctx = s;
    return DDPD_OK;
}
