/* test_nccl.c — the NCCL collective backend on one GPU: a one-rank group issued by
 * `--issue-id nccl`'s code in a child process, every collective on CUDA tensors (and the
 * host-memory ones), ordering against the compute stream, binding a non-CUDA device, and
 * a group whose second rank never comes, which must fail by its deadline instead of
 * hanging. Exits 77 (skipped) where no CUDA device is visible. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "base/clock.h"
#include "worker/comm.h"
#include "worker/dev.h"

#define SKIP 77

struct issuer {
    pid_t pid;
    int stdin_fd;
    struct comm_id id;
};

/* Forks `ddpd-worker --issue-id nccl` (its code) and reads the id line. Called before
 * this process touches CUDA: the child must not inherit a CUDA context. */
static int issuer_start(struct issuer *is)
{
    int in[2], out[2];
    if (pipe(in) < 0 || pipe(out) < 0)
        return -1;
    is->pid = fork();
    if (is->pid == 0) {
        alarm(120);
        /* Only its own pipe ends: an earlier issuer's stdin must close when we say so. */
        for (int fd = 3; fd < 1024; fd++)
            if (fd != in[0] && fd != out[1])
                close(fd);
        exit(comm_nccl_issue_id(fdopen(out[1], "w"), in[0]));
    }
    close(in[0]);
    close(out[1]);
    is->stdin_fd = in[1];
    char line[600];
    size_t n = 0;
    while (n < sizeof line - 1 && read(out[0], line + n, 1) == 1 && line[n] != '\n')
        n++;
    line[n] = '\0';
    close(out[0]);
    char hex[2 * COMM_ID_BYTES + 1] = "";
    if (sscanf(line, "{\"id\":\"%256[0-9a-f]\"}", hex) != 1)
        return -1;
    return comm_id_from_hex(hex, &is->id);
}

static int issuer_stop(struct issuer *is)
{
    close(is->stdin_fd);
    int st = 0;
    waitpid(is->pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

#define CHECK_OK(call)                                                                                       \
    do {                                                                                                     \
        ddpd_err check__rc = (call);                                                                         \
        check__count++;                                                                                      \
        if (check__rc != DDPD_OK)                                                                            \
            CHECK__FAIL("%s: %s", #call, err.message);                                                       \
    } while (0)

/* A one-rank group on `id`, or NULL (a failed check) with the reason on stderr. */
static struct comm *join_alone(const struct comm_id *id)
{
    struct ddpd_error err;
    ddpd_error_clear(&err);
    struct comm *c = comm_new(&comm_nccl_ops, id, 0, 1, 30.0, &err);
    CHECK(c != NULL);
    if (!c)
        fprintf(stderr, "comm_new: %s\n", err.message);
    return c;
}

/* Before comm_bind_dev there is no compute stream to order a collective after. */
static void test_unbound(struct dev g, const struct comm_id *id)
{
    struct ddpd_error err;
    ddpd_error_clear(&err);
    struct comm *c = join_alone(id);
    if (!c)
        return;
    struct comm_req *r;
    float *a = g.ops->alloc(g.ctx, 1000 * sizeof(float));
    CHECK(comm_allreduce_start(c, a, 1000, &r, &err) == DDPD_ECOMM);
    CHECK(strstr(err.message, "no CUDA device bound") != NULL);
    comm_free(c); /* after a failure: aborted, never destroyed */
    g.ops->free(g.ctx, a);
}

/* Every collective of one rank on a bound GPU. */
static void test_collectives(struct dev g, const struct comm_id *id)
{
    struct ddpd_error err;
    ddpd_error_clear(&err);
    struct comm *c = join_alone(id);
    if (!c)
        return;
    CHECK_OK(comm_bind_dev(c, g, &err));
    const int64_t n = 100003;
    float *h = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        h[i] = (float)i * 0.5f;
    float *a = g.ops->alloc(g.ctx, (size_t)n * sizeof(float)), *b = g.ops->alloc(g.ctx, 3 * sizeof(float));
    /* Produced on the compute stream, reduced on the comm stream, consumed on the compute
     * stream again: the scale must see the sum, and the sum must see the copy. */
    g.ops->to_device(g.ctx, a, h, (size_t)n * sizeof(float));
    g.ops->fill(g.ctx, b, 2.0f, 3);
    struct comm_req *r1, *r2;
    CHECK_OK(comm_allreduce_start(c, a, n, &r1, &err));
    CHECK_OK(comm_allreduce_start(c, b, 3, &r2, &err));
    CHECK_OK(comm_wait(c, r1, &err));
    CHECK_OK(comm_wait(c, r2, &err));
    g.ops->scale(g.ctx, a, 2.0f, n);
    float *back = malloc((size_t)n * sizeof(float)), hb[3];
    g.ops->to_host(g.ctx, back, a, (size_t)n * sizeof(float));
    g.ops->to_host(g.ctx, hb, b, sizeof hb);
    int bad = 0;
    for (int64_t i = 0; i < n; i++)
        bad += back[i] != h[i] * 2.0f;
    CHECK_EQ_INT(bad, 0);
    CHECK(hb[0] == 2.0f && hb[2] == 2.0f);
    /* Blocking collectives: a tensor broadcast, host-memory gather, max and barrier. */
    CHECK_OK(comm_broadcast(c, b, 3 * sizeof(float), 0, &err));
    int64_t mine = 42, all[1] = {0};
    CHECK_OK(comm_allgather(c, &mine, sizeof mine, all, &err));
    CHECK_EQ_INT(all[0], 42);
    int64_t v[3] = {-5, 7, 1LL << 40};
    CHECK_OK(comm_allreduce_max_i64(c, v, 3, &err));
    CHECK(v[0] == -5 && v[1] == 7 && v[2] == 1LL << 40);
    CHECK_OK(comm_barrier(c, &err));
    comm_free(c);
    g.ops->free(g.ctx, a);
    g.ops->free(g.ctx, b);
    free(h);
    free(back);
}

/* The CPU backend's tensors cannot go to NCCL: a clear error, not a crash. */
static void test_bind_cpu(const struct comm_id *id)
{
    struct ddpd_error err;
    ddpd_error_clear(&err);
    struct comm *c = join_alone(id);
    if (!c)
        return;
    struct dev cpu = dev_cpu_new(1);
    CHECK(comm_bind_dev(c, cpu, &err) != DDPD_OK);
    CHECK(strstr(err.message, "nccl takes CUDA tensors, not cpu ones") != NULL);
    comm_free(c);
    dev_cpu_free(cpu);
}

/* Rank 1 of 2 never comes: joining fails at the deadline (2 s) plus the bounded abort. */
static void test_absent_rank(const struct comm_id *id)
{
    struct ddpd_error err;
    ddpd_error_clear(&err);
    double t0 = base_mono_s();
    struct comm *c = comm_new(&comm_nccl_ops, id, 0, 2, 2.0, &err);
    double took = base_mono_s() - t0;
    CHECK(c == NULL);
    comm_free(c);
    CHECK(took >= 1.9 && took < 15.0);
    CHECK(strstr(err.message, "rank 0: nccl: joining the group") != NULL);
    fprintf(stderr, "absent rank: after %.1f s: %s\n", took, err.message);
}

int main(void)
{
#ifndef DDPD_HAVE_CUDA
    /* A build without CUDA refuses an NCCL group with a message that says why, unless
     * DDPD_CUDA_PLUGIN names a module to load (the emulated one: unit.test_nccl_emu). */
    if (!getenv("DDPD_CUDA_PLUGIN")) {
        struct ddpd_error e;
        struct comm_id none = {{0}};
        CHECK(comm_new(&comm_nccl_ops, &none, 0, 1, 1.0, &e) == NULL);
        CHECK(strstr(e.message, "built without CUDA or NCCL") != NULL);
        fprintf(stderr, "built without NCCL: skipped\n");
        return check__failures ? 1 : SKIP;
    }
#endif
    /* Ids first: the issuers are forked before this process starts CUDA. */
    struct issuer is[4];
    for (int i = 0; i < 4; i++)
        if (issuer_start(&is[i]) != 0) {
            fprintf(stderr, "--issue-id nccl printed no id\n");
            return 1;
        }
    CHECK(memcmp(&is[0].id, &is[1].id, sizeof is[0].id) != 0); /* fresh per call */
    if (!dev_cuda_available()) {
        for (int i = 0; i < 4; i++)
            issuer_stop(&is[i]);
        fprintf(stderr, "no CUDA device visible: skipped\n");
        return SKIP;
    }
    struct ddpd_error err;
    struct dev g = dev_cuda_new(0, false, &err);
    if (!g.ops) {
        fprintf(stderr, "dev_cuda_new: %s\n", err.message);
        return 1;
    }
    test_unbound(g, &is[0].id);
    test_collectives(g, &is[1].id);
    test_bind_cpu(&is[2].id);
    test_absent_rank(&is[3].id);
    for (int i = 0; i < 4; i++)
        CHECK_EQ_INT(issuer_stop(&is[i]), 0);
    dev_cuda_free(g);
    CHECK_DONE();
}
