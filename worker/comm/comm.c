/* comm/comm.c — the communicator handle: {ops, ctx} plus the rank and world, thin
 * wrappers that call a backend (comm/cpu/, cuda/nccl.c) and turn its failures into a
 * struct ddpd_error (DDPD_ECOMM with the backend's text; DDPD_EDEVICE where the backend
 * says its device failed: a CUDA error in NCCL's stream), and the id's hex form.
 * Knows no sockets and no CUDA: everything below the table is the backend's. */
#include "../comm.h"
#include "comm_impl.h"

#include <stdlib.h>

struct comm {
    const struct comm_ops *ops;
    void *ctx;
    int rank, world;
};

static const char hexdigits[] = "0123456789abcdef";

void comm_id_to_hex(const struct comm_id *id, char *hex)
{
    for (int i = 0; i < COMM_ID_BYTES; i++) {
        hex[2 * i] = hexdigits[id->bytes[i] >> 4];
        hex[2 * i + 1] = hexdigits[id->bytes[i] & 15];
    }
    hex[2 * COMM_ID_BYTES] = '\0';
}

static int hexval(char ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F')
        return ch - 'A' + 10;
    return -1;
}

int comm_id_from_hex(const char *hex, struct comm_id *id)
{
    struct comm_id tmp;
    if (!hex)
        return -1;
    for (int i = 0; i < COMM_ID_BYTES; i++) {
        /* hexval('\0') is -1, so a short string stops here without reading past its end. */
        int hi = hexval(hex[2 * i]);
        if (hi < 0)
            return -1;
        int lo = hexval(hex[2 * i + 1]);
        if (lo < 0)
            return -1;
        tmp.bytes[i] = (unsigned char)(hi << 4 | lo);
    }
    if (hex[2 * COMM_ID_BYTES] != '\0')
        return -1;
    *id = tmp;
    return 0;
}

/* A failure of the collective is the group's (exit code 3) unless the backend says its
 * device failed (exit code 4) or the group ends because a rank was cancelled (exit code
 * 5): a peer's death must not read as a broken GPU, nor a cancel as a failure. */
static ddpd_err failure_code(ddpd_err rc)
{
    return rc == DDPD_EDEVICE || rc == DDPD_ECANCELED ? rc : DDPD_ECOMM;
}

/* Every failure reads "rank R: <backend text>", so a job's log names the rank that saw it. */
static ddpd_err fail(const struct comm *c, ddpd_err rc, struct ddpd_error *err)
{
    const char *text = c->ops->last_error ? c->ops->last_error(c->ctx) : NULL;
    if (!text || !*text)
        text = ddpd_err_text(rc);
    return ddpd_error_set(err, failure_code(rc), "comm", "rank %d: %s", c->rank, text);
}

struct comm *comm_new(const struct comm_ops *ops, const struct comm_id *id, int rank, int world,
                      double timeout_s, struct ddpd_error *err)
{
    char text[512] = "";
    void *ctx = NULL;
    ddpd_err rc = ops->init_rank(id, rank, world, timeout_s, &ctx, text, sizeof text);
    if (rc != DDPD_OK) {
        ddpd_error_set(err, failure_code(rc), "comm", "rank %d: %s", rank,
                       text[0] ? text : "joining the group failed");
        return NULL;
    }
    struct comm *c = malloc(sizeof *c);
    if (!c) {
        ops->free(ctx);
        ddpd_error_set(err, DDPD_ENOMEM, "comm", "rank %d: out of memory", rank);
        return NULL;
    }
    c->ops = ops;
    c->ctx = ctx;
    c->rank = rank;
    c->world = world;
    return c;
}

void comm_free(struct comm *c)
{
    if (!c)
        return;
    c->ops->free(c->ctx);
    free(c);
}

ddpd_err comm_bind_dev(struct comm *c, struct dev dev, struct ddpd_error *err)
{
    char text[512] = "";
    ddpd_err rc = DDPD_OK;
    if (c->ops->bind_dev)
        rc = c->ops->bind_dev(c->ctx, dev, text, sizeof text);
    else if (!dev.ops->host_memory)
        rc = comm__staged_wrap(&c->ops, &c->ctx, dev, text, sizeof text);
    if (rc != DDPD_OK)
        return ddpd_error_set(err, rc, "comm", "rank %d: %s", c->rank,
                              text[0] ? text : "binding the device failed");
    return DDPD_OK;
}

int comm_rank(const struct comm *c)
{
    return c->rank;
}
int comm_world(const struct comm *c)
{
    return c->world;
}

ddpd_err comm_allreduce_start(struct comm *c, float *buf, int64_t n, struct comm_req **req,
                              struct ddpd_error *err)
{
    *req = NULL;
    ddpd_err rc = c->ops->allreduce_start(c->ctx, buf, n, req);
    return rc == DDPD_OK ? DDPD_OK : fail(c, rc, err);
}

ddpd_err comm_allreduce_half_start(struct comm *c, uint16_t *buf, int64_t n, half_kind k,
                                   struct comm_req **req, struct ddpd_error *err)
{
    *req = NULL;
    if (!c->ops->allreduce_half_start)
        return ddpd_error_set(err, DDPD_ESPEC, "ddp.comm_hook",
                              "rank %d: the %s collectives have no %s all-reduce", c->rank, c->ops->name,
                              k == HALF_BF16 ? "bf16" : "fp16");
    ddpd_err rc = c->ops->allreduce_half_start(c->ctx, buf, n, k, req);
    return rc == DDPD_OK ? DDPD_OK : fail(c, rc, err);
}

int comm_has_half(const struct comm *c)
{
    return c && c->ops->allreduce_half_start;
}

uint64_t comm_bytes_sent(const struct comm *c)
{
    return c && c->ops->bytes_sent ? c->ops->bytes_sent(c->ctx) : 0;
}

ddpd_err comm_wait(struct comm *c, struct comm_req *req, struct ddpd_error *err)
{
    ddpd_err rc = c->ops->wait(c->ctx, req);
    return rc == DDPD_OK ? DDPD_OK : fail(c, rc, err);
}

ddpd_err comm_broadcast(struct comm *c, void *buf, size_t bytes, int root, struct ddpd_error *err)
{
    ddpd_err rc = c->ops->broadcast(c->ctx, buf, bytes, root);
    return rc == DDPD_OK ? DDPD_OK : fail(c, rc, err);
}

ddpd_err comm_allgather(struct comm *c, const void *in, size_t bytes, void *out, struct ddpd_error *err)
{
    ddpd_err rc = c->ops->allgather(c->ctx, in, bytes, out);
    return rc == DDPD_OK ? DDPD_OK : fail(c, rc, err);
}

/* The default max for a backend without one: gather every rank's vector, take the max. */
static ddpd_err max_by_allgather(struct comm *c, int64_t *v, int n, struct ddpd_error *err)
{
    if (n <= 0)
        return DDPD_OK;
    int64_t *all = malloc((size_t)n * (size_t)c->world * sizeof *all);
    if (!all)
        return ddpd_error_set(err, DDPD_ENOMEM, "comm", "rank %d: out of memory", c->rank);
    ddpd_err rc = comm_allgather(c, v, (size_t)n * sizeof *v, all, err);
    if (rc == DDPD_OK)
        for (int r = 0; r < c->world; r++)
            for (int i = 0; i < n; i++)
                if (all[(size_t)r * (size_t)n + (size_t)i] > v[i])
                    v[i] = all[(size_t)r * (size_t)n + (size_t)i];
    free(all);
    return rc;
}

ddpd_err comm_allreduce_max_i64(struct comm *c, int64_t *v, int n, struct ddpd_error *err)
{
    if (!c->ops->allreduce_max_i64)
        return max_by_allgather(c, v, n, err);
    ddpd_err rc = c->ops->allreduce_max_i64(c->ctx, v, n);
    return rc == DDPD_OK ? DDPD_OK : fail(c, rc, err);
}

ddpd_err comm_barrier(struct comm *c, struct ddpd_error *err)
{
    if (!c->ops->barrier) {
        /* The default barrier: a max over one value, which no rank leaves before all came. */
        int64_t none = 0;
        return max_by_allgather(c, &none, 1, err);
    }
    ddpd_err rc = c->ops->barrier(c->ctx);
    return rc == DDPD_OK ? DDPD_OK : fail(c, rc, err);
}

void comm_abort(struct comm *c)
{
    if (c && c->ops->abort)
        c->ops->abort(c->ctx);
}

int comm_cancel(struct comm *c)
{
    return c && c->ops->cancel ? c->ops->cancel(c->ctx) : 0;
}

int comm_carries_cancel(const struct comm *c)
{
    return c && c->ops->cancel;
}

int comm_failed_by_peer(const struct comm *c)
{
    return c && c->ops->failed_by_peer ? c->ops->failed_by_peer(c->ctx) : 0;
}
