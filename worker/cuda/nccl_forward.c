/* cuda/nccl_forward.c — comm.h's NCCL entry points in ddpd-worker: a table that forwards to
 * cuda/nccl.c inside libddpd-cuda.so (cuda/plugin.h), and `--issue-id nccl`. Joining a
 * group loads the module; where it cannot be loaded (no module, no NCCL, a DDPD_CUDA=OFF
 * build) init_rank and the id issuer fail with the loader's message. */
#include <errno.h>
#include <poll.h>
#include <unistd.h>

#include "plugin.h"

/* The module's table. Only reached with a context that its init_rank made, so the
 * module is loaded. */
static const struct comm_ops *real(void)
{
    return cuda_plugin_loaded()->nccl;
}

static ddpd_err fw_init_rank(const struct comm_id *id, int rank, int world, double timeout_s, void **ctx,
                             char *errbuf, size_t errcap)
{
    struct ddpd_error err;
    const struct ddpd_cuda_plugin *p = cuda_plugin_get(&err);
    if (!p) {
        snprintf(errbuf, errcap, "nccl: %s", err.message);
        return DDPD_ECOMM;
    }
    return p->nccl->init_rank(id, rank, world, timeout_s, ctx, errbuf, errcap);
}

static ddpd_err fw_allreduce_start(void *ctx, float *buf, int64_t n, struct comm_req **req)
{
    return real()->allreduce_start(ctx, buf, n, req);
}

static ddpd_err fw_wait(void *ctx, struct comm_req *req)
{
    return real()->wait(ctx, req);
}

static ddpd_err fw_broadcast(void *ctx, void *buf, size_t bytes, int root)
{
    return real()->broadcast(ctx, buf, bytes, root);
}

static ddpd_err fw_allgather(void *ctx, const void *in, size_t bytes, void *out)
{
    return real()->allgather(ctx, in, bytes, out);
}

static ddpd_err fw_allreduce_max_i64(void *ctx, int64_t *v, int n)
{
    return real()->allreduce_max_i64(ctx, v, n);
}

static void fw_abort(void *ctx)
{
    real()->abort(ctx);
}

static const char *fw_last_error(void *ctx)
{
    return real()->last_error(ctx);
}

static void fw_free(void *ctx)
{
    real()->free(ctx);
}

static ddpd_err fw_bind_dev(void *ctx, struct dev dev, char *errbuf, size_t errcap)
{
    return real()->bind_dev(ctx, dev, errbuf, errcap);
}

const struct comm_ops comm_nccl_ops = {
    .name = "nccl",
    .init_rank = fw_init_rank,
    .allreduce_start = fw_allreduce_start,
    .wait = fw_wait,
    .broadcast = fw_broadcast,
    .allgather = fw_allgather,
    .allreduce_max_i64 = fw_allreduce_max_i64,
    .barrier = NULL, /* as in cuda/nccl.c: comm.c's default, a max over one value */
    .abort = fw_abort,
    .last_error = fw_last_error,
    .free = fw_free,
    .bind_dev = fw_bind_dev,
};

int comm_nccl_issue_id(FILE *out, int stdin_fd)
{
    struct ddpd_error err;
    const struct ddpd_cuda_plugin *p = cuda_plugin_get(&err);
    if (!p) {
        fprintf(stderr, "ddpd-worker: --issue-id nccl: %s\n", err.message);
        return 1;
    }
    struct comm_id id;
    char why[256], hex[2 * COMM_ID_BYTES + 1];
    if (p->nccl_unique_id(&id, why, sizeof why) != 0) {
        fprintf(stderr, "ddpd-worker: ncclGetUniqueId: %s\n", why);
        return 1;
    }
    comm_id_to_hex(&id, hex);
    if (fprintf(out, "{\"id\":\"%s\"}\n", hex) < 0 || fflush(out) != 0) {
        fprintf(stderr, "ddpd-worker: cannot write the id\n");
        return 1;
    }
    /* NCCL's bootstrap root is a thread of this process: stay until stdin closes. */
    char buf[256];
    for (;;) {
        ssize_t n = read(stdin_fd, buf, sizeof buf);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            /* A non-blocking stdin: sleep until it has input or ends, never spin. */
            struct pollfd pf = {stdin_fd, POLLIN, 0};
            (void)poll(&pf, 1, -1);
            continue;
        }
        if (n == 0 || (n < 0 && errno != EINTR))
            return 0;
    }
}
