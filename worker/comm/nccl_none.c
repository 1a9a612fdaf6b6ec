/* comm/nccl_none.c — the NCCL entry points of a build without CUDA or NCCL: joining a
 * group and issuing an id fail with a message that says why. CMake builds this file
 * instead of comm/nccl.c when DDPD_HAVE_CUDA is off. */
#include "../comm.h"

#define WHY "this ddpd-worker was built without NCCL (ddp.backend \"nccl\" needs a CUDA build)"

static ddpd_err none_init_rank(const struct comm_id *id, int rank, int world, double timeout_s,
                               void **ctx, char *errbuf, size_t errcap)
{
    (void)id, (void)rank, (void)world, (void)timeout_s, (void)ctx;
    snprintf(errbuf, errcap, "%s", WHY);
    return DDPD_ECOMM;
}

/* init_rank never succeeds, so no other slot is ever reached with a context. */
const struct comm_ops comm_nccl_ops = {
    .name = "nccl",
    .init_rank = none_init_rank,
};

int comm_nccl_issue_id(FILE *out, int stdin_fd)
{
    (void)out, (void)stdin_fd;
    fprintf(stderr, "ddpd-worker: --issue-id nccl: %s\n", WHY);
    return 1;
}
