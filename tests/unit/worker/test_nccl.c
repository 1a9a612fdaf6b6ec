/* test_nccl.c — the NCCL collective backend: a one-rank group issued by `--issue-id nccl`'s
 * code in a child process, every collective on CUDA tensors (and the host-memory ones),
 * ordering against the compute stream, binding a non-CUDA device, and a group whose second
 * rank never comes, which must fail by its deadline instead of hanging. Groups of 2 and 3
 * rank processes (on the emulated device, or on a GPU per rank) run every collective and
 * must get the same bits; on the emulator a rank that is killed, aborts or issues another
 * collective must end its peers with the comm error (exit code 3, an `error` event naming
 * it) within seconds. Issue 34: an abort from another thread while this one issues
 * collectives (the emulator ends a process whose two threads call NCCL on one communicator
 * at once, or call it after its abort), collectives never waited for (freed with the
 * communicator: LeakSanitizer), and compute longer than ddp.timeout_s queued before a
 * collective (the emulator's kernels made slow), which must not count against it. Exits 77
 * (skipped) where no CUDA device is visible. */
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "rank_values.h"
#include "base/clock.h"
#include "worker/comm.h"
#include "worker/dev.h"
#include "worker/emit.h"

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

/* Collectives started and never waited for, by a caller that failed (or just left): the
 * communicator's end frees them all (under LeakSanitizer, nothing leaks). */
static void test_unwaited(struct dev g, const struct comm_id *id)
{
    struct ddpd_error err;
    ddpd_error_clear(&err);
    struct comm *c = join_alone(id);
    if (!c)
        return;
    CHECK_OK(comm_bind_dev(c, g, &err));
    float *a = g.ops->alloc(g.ctx, 1000 * sizeof(float));
    struct comm_req *r1, *r2;
    CHECK_OK(comm_allreduce_start(c, a, 1000, &r1, &err));
    CHECK_OK(comm_allreduce_start(c, a, 10, &r2, &err));
    comm_free(c);
    g.ops->free(g.ctx, a);
}

struct aborter {
    struct comm *c;
    long delay_us;
};

static void *abort_later(void *arg)
{
    const struct aborter *a = arg;
    struct timespec t = {0, a->delay_us * 1000};
    nanosleep(&t, NULL);
    comm_abort(a->c);
    return NULL;
}

/* comm.h: abort is safe from another thread. The thread that issues collectives (and the
 * watchdog) must then see every call fail (DDPD_ECOMM), never a crash: NCCL frees the
 * communicator in ncclCommAbort, and the emulator ends a process that calls it from two
 * threads at once, or after the abort (SIGABRT). */
static void test_abort_from_thread(struct dev g, const struct comm_id *id, long delay_us)
{
    struct ddpd_error err;
    ddpd_error_clear(&err);
    struct comm *c = join_alone(id);
    if (!c)
        return;
    CHECK_OK(comm_bind_dev(c, g, &err));
    float *a = g.ops->alloc(g.ctx, 1000 * sizeof(float));
    struct aborter ab = {c, delay_us};
    pthread_t t;
    CHECK(pthread_create(&t, NULL, abort_later, &ab) == 0);
    ddpd_err rc = DDPD_OK;
    const double until = base_mono_s() + 30.0;
    while (rc == DDPD_OK && base_mono_s() < until) {
        struct comm_req *r;
        rc = comm_allreduce_start(c, a, 1000, &r, &err);
        if (rc == DDPD_OK)
            rc = comm_wait(c, r, &err);
        if (rc == DDPD_OK)
            rc = comm_broadcast(c, a, 64, 0, &err);
    }
    pthread_join(t, NULL);
    CHECK_EQ_INT(rc, DDPD_ECOMM);
    comm_free(c);
    g.ops->free(g.ctx, a);
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

/* ---- groups of rank processes ---- */

#define MAX_W 3

/* What the ranks report to the parent, in a shared mapping. */
struct shared {
    uint64_t hash[MAX_W][4]; /* FNV-1a of each all-reduce result */
    double died_at;          /* when the victim went */
};
static struct shared *sh;
static int victim = -1;            /* the rank a fault test picks on */
static double rank_timeout_s = 30; /* the ranks' ddp.timeout_s */

/* Whether the plugin is the emulated device (the loader's own test of DDPD_CUDA_EMU). */
static bool emulated(void)
{
    const char *e = getenv("DDPD_CUDA_EMU");
    return e && *e && strcmp(e, "0") != 0;
}

typedef int (*rank_fn)(int rank, int world, struct dev g, struct comm *c);

struct group {
    int world;
    int status[MAX_W];     /* waitpid's */
    double ended[MAX_W];   /* when the parent reaped the rank */
    char out[MAX_W][2048]; /* what the rank wrote on stdout: its events */
};

/* One rank's process: its own GPU (NCCL, real or emulated, wants a GPU per rank: the
 * emulated suite runs with DDPD_CUDA_EMU=3), the group on `id`, then fn. Exits 77 where the
 * machine cannot hold the group, 1 on a failed check. */
static _Noreturn void rank_main(int rank, int world, const struct comm_id *id, rank_fn fn)
{
    struct ddpd_error err;
    ddpd_error_clear(&err);
    if (!dev_cuda_available() || dev_cuda_device_count() < world)
        exit(SKIP);
    struct dev g = dev_cuda_new(rank, false, &err);
    if (!g.ops) {
        fprintf(stderr, "rank %d: dev_cuda_new: %s\n", rank, err.message);
        exit(1);
    }
    struct comm *c = comm_new(&comm_nccl_ops, id, rank, world, rank_timeout_s, &err);
    if (!c) {
        fprintf(stderr, "rank %d: comm_new: %s\n", rank, err.message);
        exit(1);
    }
    CHECK_OK(comm_bind_dev(c, g, &err));
    int rc = fn(rank, world, g, c);
    comm_free(c);
    dev_cuda_free(g);
    fflush(stderr);
    exit(rc || check__failures ? 1 : 0); /* exit, not _exit: LeakSanitizer checks the rank */
}

/* Forks `world` ranks running fn, their stdout into gr->out; returns when all have ended. */
static void run_group(struct group *gr, int world, const struct comm_id *id, rank_fn fn)
{
    pid_t pid[MAX_W];
    int out[MAX_W];
    memset(gr, 0, sizeof *gr);
    gr->world = world;
    for (int r = 0; r < world; r++) {
        int p[2];
        if (pipe(p) < 0)
            abort();
        pid[r] = fork();
        if (pid[r] == 0) {
            alarm(60); /* a hang is a failure, not a stuck test run */
            dup2(p[1], STDOUT_FILENO);
            /* Only stdio: the issuers' stdin must close when the parent says so. */
            for (int fd = 3; fd < 1024; fd++)
                close(fd);
            check__failures = 0; /* the child counts its own */
            rank_main(r, world, id, fn);
        }
        close(p[1]);
        out[r] = p[0];
    }
    for (int left = world; left > 0; left--) {
        int st = 0;
        pid_t who = waitpid(-1, &st, 0);
        for (int r = 0; r < world; r++)
            if (pid[r] == who) {
                gr->status[r] = st;
                gr->ended[r] = base_mono_s();
            }
    }
    for (int r = 0; r < world; r++) {
        size_t n = 0;
        ssize_t got;
        while (n < sizeof gr->out[r] - 1 &&
               (got = read(out[r], gr->out[r] + n, sizeof gr->out[r] - 1 - n)) > 0)
            n += (size_t)got;
        close(out[r]);
    }
}

/* 0 when every rank exited 0, 1 when all were skipped (after saying so), else -1. */
static int group_result(const struct group *gr, const char *what)
{
    int ok = 0, skipped = 0;
    for (int r = 0; r < gr->world; r++) {
        int st = gr->status[r];
        if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
            ok++;
        else if (WIFEXITED(st) && WEXITSTATUS(st) == SKIP)
            skipped++;
        else
            fprintf(stderr, "  %s W=%d: rank %d: %s %d\n", what, gr->world, r,
                    WIFEXITED(st) ? "exit" : "signal", WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
    }
    if (skipped == gr->world) {
        fprintf(stderr, "  %s W=%d: skipped (no GPU for every rank)\n", what, gr->world);
        return 1;
    }
    return ok == gr->world ? 0 : -1;
}

/* The emulator's segment of `id` (emu/nccl.cc names it from bytes 8..23 of the id) must be
 * gone once every rank has left, however it left. */
static void check_no_segment(const struct comm_id *id)
{
    if (!emulated())
        return;
    char path[64] = "/dev/shm/ddpd-nccl-";
    for (int i = 8; i < 24; i++)
        snprintf(path + strlen(path), sizeof path - strlen(path), "%02x", id->bytes[i]);
    CHECK(access(path, F_OK) != 0);
}

/* Every collective, with all-reduces of several sizes in flight together (the larger ones
 * pass through the emulator's slots in chunks); the sums' bits go to the parent. */
static int rank_collectives(int rank, int world, struct dev g, struct comm *c)
{
    struct ddpd_error err;
    ddpd_error_clear(&err);
    static const int64_t sizes[4] = {1, 1000, 100003, (1 << 20) + 3};
    float *h = malloc((size_t)sizes[3] * sizeof *h), *d[4];
    struct comm_req *req[4];
    for (int k = 0; k < 4; k++) {
        for (int64_t i = 0; i < sizes[k]; i++)
            h[i] = rank_value(rank, i);
        d[k] = g.ops->alloc(g.ctx, (size_t)sizes[k] * sizeof *h);
        g.ops->to_device(g.ctx, d[k], h, (size_t)sizes[k] * sizeof *h);
    }
    struct comm_req *empty;
    CHECK_OK(comm_allreduce_start(c, d[0], 0, &empty, &err)); /* a step of its own all the same */
    for (int k = 0; k < 4; k++)
        CHECK_OK(comm_allreduce_start(c, d[k], sizes[k], &req[k], &err));
    CHECK_OK(comm_wait(c, empty, &err));
    for (int k = 0; k < 4; k++)
        CHECK_OK(comm_wait(c, req[k], &err));
    for (int k = 0; k < 4; k++) {
        g.ops->to_host(g.ctx, h, d[k], (size_t)sizes[k] * sizeof *h);
        sh->hash[rank][k] = fnv(h, (size_t)sizes[k] * sizeof *h);
        int bad = 0;
        for (int64_t i = 0; i < sizes[k]; i++) {
            double want = 0, mag = 0;
            for (int q = 0; q < world; q++) {
                want += rank_value(q, i);
                mag += fabs(rank_value(q, i));
            }
            bad += !(fabs(h[i] - want) <= 1e-6 * mag + 1e-30);
        }
        CHECK_EQ_INT(bad, 0);
        g.ops->free(g.ctx, d[k]);
    }
    /* A device broadcast from every root, one byte and a large one. */
    const size_t big = (1 << 20) + 5;
    unsigned char *hb = malloc(big), *db = g.ops->alloc(g.ctx, big);
    for (int root = 0; root < world; root++)
        for (size_t n = 1; n <= big; n += big - 1) {
            for (size_t i = 0; i < n; i++)
                hb[i] = (unsigned char)(rank == root ? i * 7 + (size_t)root : 0xee);
            g.ops->to_device(g.ctx, db, hb, n);
            CHECK_OK(comm_broadcast(c, db, n, root, &err));
            g.ops->to_host(g.ctx, hb, db, n);
            int bad = 0;
            for (size_t i = 0; i < n; i++)
                bad += hb[i] != (unsigned char)(i * 7 + (size_t)root);
            CHECK_EQ_INT(bad, 0);
        }
    /* Host-memory all-gathers: one value, and more than a slot per rank. */
    int64_t mine = 1000 + rank, all[MAX_W] = {0};
    CHECK_OK(comm_allgather(c, &mine, sizeof mine, all, &err));
    for (int q = 0; q < world; q++)
        CHECK_EQ_INT(all[q], 1000 + q);
    const size_t part = 300001;
    unsigned char *in = malloc(part), *gathered = malloc(part * (size_t)world);
    for (size_t i = 0; i < part; i++)
        in[i] = (unsigned char)(i * 13 + (size_t)rank);
    CHECK_OK(comm_allgather(c, in, part, gathered, &err));
    int bad = 0;
    for (int q = 0; q < world; q++)
        for (size_t i = 0; i < part; i++)
            bad += gathered[(size_t)q * part + i] != (unsigned char)(i * 13 + (size_t)q);
    CHECK_EQ_INT(bad, 0);
    int64_t v[3] = {rank, -rank, (int64_t)rank << 40};
    CHECK_OK(comm_allreduce_max_i64(c, v, 3, &err));
    CHECK(v[0] == world - 1 && v[1] == 0 && v[2] == (int64_t)(world - 1) << 40);
    CHECK_OK(comm_barrier(c, &err));
    g.ops->free(g.ctx, db);
    free(hb);
    free(in);
    free(gathered);
    free(h);
    return 0;
}

static void test_group_collectives(int world, const struct comm_id *id)
{
    struct group gr;
    memset(sh, 0, sizeof *sh);
    run_group(&gr, world, id, rank_collectives);
    int rc = group_result(&gr, "collectives");
    CHECK(rc >= 0);
    if (rc != 0)
        return;
    for (int r = 1; r < world; r++)
        for (int k = 0; k < 4; k++)
            CHECK(sh->hash[r][k] == sh->hash[0][k]); /* the same bits on every rank */
    check_no_segment(id);
    fprintf(stderr, "  collectives W=%d: ok\n", world);
}

/* A failed call ends the rank as worker/main.c ends it: abort, then the error event and
 * its exit code. (The watchdog may be ending it at the same moment.) */
#define OR_DIE(call)                                                                                         \
    do {                                                                                                     \
        if ((call) != DDPD_OK) {                                                                             \
            comm_abort(c);                                                                                   \
            emit_die(&err);                                                                                  \
        }                                                                                                    \
    } while (0)

/* All-reduces, each waited for through the compute stream, until the victim goes: it is
 * SIGKILLed with a large all-reduce in flight (the OOM killer), or aborts its
 * communicator (a cancelled rank) and leaves. The others never see their sum: their
 * watchdog ends them. */
static bool victim_aborts;
static int rank_loses_peer(int rank, int world, struct dev g, struct comm *c)
{
    (void)world;
    struct ddpd_error err;
    ddpd_error_clear(&err);
    const int64_t n = 1 << 20; /* 16 steps through the emulator's slots */
    float *d = g.ops->alloc(g.ctx, (size_t)n * sizeof *d), first;
    /* Copied in, not filled by a kernel: the emulator runs each of a kernel's 2^20 CUDA
     * threads as a fiber, which under ThreadSanitizer on the loaded 2-core machine takes
     * 15-30 s a rank. That time is not what this test is about, and while a collective's
     * deadline counted from its issue it was the first all-reduce's: all ranks timed out
     * in it (30 s) before the victim's turn came. */
    float *h = malloc((size_t)n * sizeof *h);
    if (!h)
        return 1;
    for (int64_t i = 0; i < n; i++)
        h[i] = 1.0f;
    g.ops->to_device(g.ctx, d, h, (size_t)n * sizeof *h);
    free(h);
    for (int it = 0; it < 100; it++) {
        struct comm_req *req;
        if (rank == victim && it == 3) {
            sh->died_at = base_mono_s();
            if (victim_aborts) {
                comm_abort(c);
                g.ops->free(g.ctx, d);
                return 0;
            }
            OR_DIE(comm_allreduce_start(c, d, n, &req, &err));
            struct timespec t = {0, 2 * 1000 * 1000};
            nanosleep(&t, NULL);
            sh->died_at = base_mono_s();
            kill(getpid(), SIGKILL);
        }
        OR_DIE(comm_allreduce_start(c, d, n, &req, &err));
        OR_DIE(comm_wait(c, req, &err));
        g.ops->to_host(g.ctx, &first, d, sizeof first);
    }
    fprintf(stderr, "rank %d: the victim's end was never seen\n", rank);
    return 1;
}

/* Rank 0 all-reduces 10 floats while rank 1 broadcasts 40 bytes. */
static int rank_mismatch(int rank, int world, struct dev g, struct comm *c)
{
    (void)world;
    struct ddpd_error err;
    ddpd_error_clear(&err);
    float *d = g.ops->alloc(g.ctx, 10 * sizeof *d), first;
    struct comm_req *req;
    if (rank == 0) {
        OR_DIE(comm_allreduce_start(c, d, 10, &req, &err));
        OR_DIE(comm_wait(c, req, &err));
        g.ops->to_host(g.ctx, &first, d, sizeof first);
    } else {
        OR_DIE(comm_broadcast(c, d, 40, 0, &err));
    }
    fprintf(stderr, "rank %d: the mismatch was never seen\n", rank);
    return 1;
}

/* Compute queued before a collective (6 kernels of 300 ms: DDPD_CUDA_EMU_KERNEL_DELAY_MS)
 * outlasts the 1 s deadline; the collective itself is quick. Its deadline starts when it
 * can begin, so neither the all-reduce nor the blocking broadcast fails. */
static int rank_slow_compute(int rank, int world, struct dev g, struct comm *c)
{
    (void)rank;
    (void)world;
    struct ddpd_error err;
    ddpd_error_clear(&err);
    float *d = g.ops->alloc(g.ctx, 1000 * sizeof *d), first = 0;
    for (int k = 0; k < 6; k++)
        g.ops->fill(g.ctx, d, 1.0f, 1000);
    struct comm_req *req;
    OR_DIE(comm_allreduce_start(c, d, 1000, &req, &err));
    OR_DIE(comm_wait(c, req, &err));
    for (int k = 0; k < 6; k++)
        g.ops->fill(g.ctx, d, 2.0f, 1000);
    OR_DIE(comm_broadcast(c, d, 1000 * sizeof *d, 0, &err));
    g.ops->to_host(g.ctx, &first, d, sizeof first);
    CHECK(first == 2.0f);
    g.ops->free(g.ctx, d);
    return 0;
}

static void test_group_slow_compute(const struct comm_id *id)
{
    struct group gr;
    memset(sh, 0, sizeof *sh);
    rank_timeout_s = 1.0;
    setenv("DDPD_CUDA_EMU_KERNEL_DELAY_MS", "300", 1); /* for the rank forked next only */
    run_group(&gr, 1, id, rank_slow_compute);
    unsetenv("DDPD_CUDA_EMU_KERNEL_DELAY_MS");
    rank_timeout_s = 30;
    int rc = group_result(&gr, "slow compute");
    CHECK(rc >= 0);
    if (rc == 0)
        fprintf(stderr, "  slow compute: 1.8 s of kernels before each collective, deadline 1 s: ok\n");
    else
        fprintf(stderr, "  slow compute: %s\n", gr.out[0]);
}

/* Rank 0 leaves its last all-reduce in flight (comm_wait does not block the host) and
 * frees the communicator; rank 1 ends cleanly without it, a moment later. Rank 0's clean
 * end must see its peer go rather than wait for the collective forever. */
static int rank_ends_early(int rank, int world, struct dev g, struct comm *c)
{
    (void)world;
    struct ddpd_error err;
    ddpd_error_clear(&err);
    float *d = g.ops->alloc(g.ctx, 1000 * sizeof *d);
    if (rank == 0) {
        struct comm_req *req;
        CHECK_OK(comm_allreduce_start(c, d, 1000, &req, &err));
        CHECK_OK(comm_wait(c, req, &err));
    } else {
        struct timespec t = {0, 300 * 1000 * 1000};
        nanosleep(&t, NULL);
    }
    sh->died_at = base_mono_s();
    return 0; /* rank_main frees the communicator, then the device and its buffers */
}

static void test_group_early_end(const struct comm_id *id)
{
    struct group gr;
    memset(sh, 0, sizeof *sh);
    run_group(&gr, 2, id, rank_ends_early);
    if (group_result(&gr, "early end") == 1)
        return;
    CHECK(WIFEXITED(gr.status[1]) && WEXITSTATUS(gr.status[1]) == 0);
    /* Rank 0 frees its comm cleanly (exit 0), or its watchdog saw the peer first (3). */
    int st = gr.status[0];
    CHECK(WIFEXITED(st) && (WEXITSTATUS(st) == 0 || WEXITSTATUS(st) == 3));
    fprintf(stderr, "  early end: rank 0 ended %.2f s after rank 1 left, with %s %d\n",
            gr.ended[0] - sh->died_at, WIFEXITED(st) ? "exit" : "signal",
            WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
    CHECK(gr.ended[0] - sh->died_at < 5.0);
    check_no_segment(id);
}

/* The ranks other than the victim must end with the comm exit code and one `error` event
 * holding `needle` (and the victim's rank, when there is one), within a few seconds. */
static void check_failed_group(const struct group *gr, const char *what, const char *needle)
{
    /* A victim that never went: its peers failed on their own (said so, not as hours). */
    CHECK(sh->died_at > 0);
    for (int r = 0; r < gr->world; r++) {
        if (r == victim)
            continue;
        double took = sh->died_at > 0 ? gr->ended[r] - sh->died_at : 1e9;
        int st = gr->status[r];
        char when[48] = "before the victim went";
        if (sh->died_at > 0)
            snprintf(when, sizeof when, "%.2f s after the fault", took);
        fprintf(stderr, "  %s W=%d: rank %d ended %s, with %s %d: %s", what, gr->world, r, when,
                WIFEXITED(st) ? "exit" : "signal", WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st),
                gr->out[r]);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 3);
        int events = 0;
        for (const char *at = gr->out[r]; (at = strstr(at, "\"event\":\"error\"")) != NULL; at++)
            events++;
        CHECK_EQ_INT(events, 1); /* the watchdog or the caller reports it, not both */
        CHECK(strstr(gr->out[r], needle) != NULL);
        if (victim >= 0) {
            char who[32];
            snprintf(who, sizeof who, "rank %d (pid", victim);
            CHECK(strstr(gr->out[r], who) != NULL);
            CHECK(took < 5.0); /* seen, not waited out (the deadline is 30 s) */
        }
    }
}

static void test_group_fault(int world, int who, bool aborts, const struct comm_id *id)
{
    struct group gr;
    memset(sh, 0, sizeof *sh);
    victim = who;
    victim_aborts = aborts;
    run_group(&gr, world, id, rank_loses_peer);
    if (group_result(&gr, "fault") == 1)
        return;
    if (aborts)
        CHECK(WIFEXITED(gr.status[who]) && WEXITSTATUS(gr.status[who]) == 0);
    else
        CHECK(WIFSIGNALED(gr.status[who]) && WTERMSIG(gr.status[who]) == SIGKILL);
    check_failed_group(&gr, aborts ? "rank aborts" : "rank killed",
                       aborts ? "aborted its communicator" : "is gone");
    check_no_segment(id);
    victim = -1;
}

static void test_group_mismatch(const struct comm_id *id)
{
    struct group gr;
    memset(sh, 0, sizeof *sh);
    victim = -1;
    sh->died_at = base_mono_s();
    run_group(&gr, 2, id, rank_mismatch);
    if (group_result(&gr, "mismatch") == 1)
        return;
    check_failed_group(&gr, "mismatch", "the ranks' collectives differ");
    for (int r = 0; r < 2; r++) {
        CHECK(strstr(gr.out[r], "ncclAllReduce #1 of 10 x float (sum)") != NULL);
        CHECK(strstr(gr.out[r], "ncclBroadcast #1 of 40 x int8 from rank 0") != NULL);
    }
    check_no_segment(id);
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
    /* Ids first: the issuers are forked before this process starts CUDA, and so are the
     * groups' ranks, which start their own. */
    enum { ABORTS = 8, NIDS = 14 + ABORTS };
    struct issuer is[NIDS];
    /* The groups' ids (4..11) only where a group can run: each rank loads the module;
     * the one-rank tests' (12..) after them. */
    const bool groups = dev_cuda_driver_present();
    const int nids = groups ? NIDS : 4;
    for (int i = 0; i < nids; i++)
        if (issuer_start(&is[i]) != 0) {
            fprintf(stderr, "--issue-id nccl printed no id\n");
            return 1;
        }
    CHECK(memcmp(&is[0].id, &is[1].id, sizeof is[0].id) != 0); /* fresh per call */
    sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED)
        return 1;
    if (groups) {
        test_group_collectives(2, &is[4].id);
        test_group_collectives(3, &is[5].id);
    }
    if (groups && emulated()) {
        /* Real NCCL may only time out on a lost peer; the emulator names it. */
        test_group_fault(2, 1, false, &is[6].id);
        test_group_fault(3, 1, false, &is[7].id);
        test_group_fault(3, 2, true, &is[8].id);
        test_group_mismatch(&is[9].id);
        test_group_early_end(&is[10].id);
        test_group_slow_compute(&is[11].id);
    }
    if (!dev_cuda_available()) {
        for (int i = 0; i < nids; i++)
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
    if (groups) {
        test_unwaited(g, &is[12].id);
        for (int k = 0; k < ABORTS; k++)
            test_abort_from_thread(g, &is[13 + k].id, 250L * k);
        fprintf(stderr, "  abort from another thread, %d times: every call after it failed\n", ABORTS);
    }
    for (int i = 0; i < nids; i++)
        CHECK_EQ_INT(issuer_stop(&is[i]), 0);
    dev_cuda_free(g);
    CHECK_DONE();
}
