/* comm/cpu/cpu.c — the CPU collective backend: a ring of ranks with its own rendezvous root
 * (the id issuer, `ddpd-worker --issue-id cpu`). Links are TCP, or a shared-memory FIFO
 * where both ends share the host (DDPD_COMM_SHM=0 keeps TCP). All-reduce is a ring
 * reduce-scatter + all-gather: each sum is made once, by one rank, and copied, so every
 * rank gets the same bits. Every wait has a deadline; knows nothing of tensors or DDP.
 * This file joins the group and holds the table's entries; sock.c, hello.c, root.c,
 * ring.c, engine.c and shm.c hold the other concerns (cpu_impl.h). */
#include "cpu_impl.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* ---- the table's entries ---- */

static void cpu_free(void *ctx);

static ddpd_err cpu_init_rank(const struct comm_id *id, int rank, int world, double timeout_s, void **ctx,
                              char *errbuf, size_t errcap)
{
    struct cpu *c = NULL;
    struct cpu_addr *table = NULL;
    int lfd = -1, rfd = -1;
    ddpd_err rc = DDPD_ECOMM;
    *ctx = NULL;

    if (world < 1 || world > MAX_WORLD || rank < 0 || rank >= world) {
        comm_cpu__fmt_err(errbuf, errcap, "rank %d of %d is out of range (world 1..%d)", rank, world,
                          MAX_WORLD);
        goto out;
    }
    if (!(timeout_s > 0) || timeout_s > 1e6) {
        comm_cpu__fmt_err(errbuf, errcap, "the communication timeout must be in (0, 1e6] s (got %g s)",
                          timeout_s);
        goto out;
    }
    c = calloc(1, sizeof *c);
    if (!c) {
        comm_cpu__fmt_err(errbuf, errcap, "out of memory");
        goto out;
    }
    c->rank = rank;
    c->world = world;
    c->prev = (rank + world - 1) % world;
    c->next = (rank + 1) % world;
    c->timeout_s = timeout_s;
    c->fd_next = c->fd_prev = -1;
    atomic_init(&c->aborted, 0);
    atomic_init(&c->cancelled, 0);
    c->fail_rc = DDPD_ECOMM;
    int sync_ok = pthread_mutex_init(&c->mu, NULL) == 0 && base_cond_init_mono(&c->work) == 0 &&
                  base_cond_init_mono(&c->done) == 0;
    if (!sync_ok) {
        comm_cpu__fmt_err(errbuf, errcap, "cannot create the communicator's lock");
        free(c);
        c = NULL;
        goto out;
    }
    c->have_sync = 1;
    if (world == 1) {
        /* Nothing to talk to, so the id is not even read: every collective is a no-op or a
         * copy, run inline by the caller. */
        rc = DDPD_OK;
        goto out;
    }
    struct cpu_addr root;
    if (comm_cpu__id_decode(id, c->secret, &root) < 0) {
        comm_cpu__fmt_err(errbuf, errcap, "malformed communicator id (no root address in it)");
        goto out;
    }
    double deadline = base_mono_s() + timeout_s;
    c->stage = malloc(STAGE_BYTES);
    table = calloc((size_t)world, sizeof *table);
    if (!c->stage || !table) {
        comm_cpu__fmt_err(errbuf, errcap, "out of memory");
        goto out;
    }

    int refused = 0;
    rfd = comm_cpu__connect_retry(&root, deadline, &refused);
    if (rfd < 0) {
        char at[80];
        comm_cpu__addr_text(&root, at, sizeof at);
        if (errno == ETIMEDOUT)
            comm_cpu__fmt_err(errbuf, errcap, "rendezvous with root %s timed out after %.1f s (%s)", at,
                              timeout_s,
                              refused ? "nobody listens there: is the issuer gone?" : "could not connect");
        else
            comm_cpu__fmt_err(errbuf, errcap, "rendezvous: cannot connect to root %s: %s", at,
                              strerror(errno));
        goto out;
    }
    /* Our ring listener goes on the interface that reaches the root: that address is what
     * the root (and so every rank) can reach us by, in the root's address family. */
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    struct cpu_addr me;
    if (getsockname(rfd, (struct sockaddr *)&ss, &sl) < 0 || comm_cpu__addr_from_sa(&ss, &me) < 0) {
        comm_cpu__fmt_err(errbuf, errcap, "getsockname: %s", strerror(errno));
        goto out;
    }
    me.port = 0;
    sl = comm_cpu__addr_to_sa(&me, &ss);
    lfd = socket(me.family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (lfd >= 0)
        comm_cpu__sock_tune(lfd); /* accepted sockets inherit the buffer sizes */
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&ss, sl) < 0 || listen(lfd, RING_BACKLOG) < 0) {
        comm_cpu__fmt_err(errbuf, errcap, "ring: cannot listen: %s", strerror(errno));
        goto out;
    }
    sl = sizeof ss;
    if (getsockname(lfd, (struct sockaddr *)&ss, &sl) < 0 || comm_cpu__addr_from_sa(&ss, &me) < 0) {
        comm_cpu__fmt_err(errbuf, errcap, "getsockname: %s", strerror(errno));
        goto out;
    }
    if (comm_cpu__rendezvous(c, rfd, &root, &me, deadline, table, errbuf, errcap) < 0)
        goto out;
    close(rfd);
    rfd = -1;
    if (comm_cpu__form_ring(c, lfd, table, deadline, errbuf, errcap) < 0)
        goto out;
    /* From here on a neighbour whose host falls silent fails the group within LIVE_S. */
    comm_cpu__sock_live(c->fd_next);
    comm_cpu__sock_live(c->fd_prev);
    comm_cpu__peer_host(c->fd_next, c->next_host, sizeof c->next_host);
    comm_cpu__peer_host(c->fd_prev, c->prev_host, sizeof c->prev_host);

    char text[64];
    snprintf(text, sizeof text, "rank %d aborted its communicator", rank);
    c->abort_notice_len = comm_cpu__notice_put(c->abort_notice, sizeof c->abort_notice, rank, 0, text);
    c->cancel_notice_len =
        comm_cpu__notice_put(c->cancel_notice, sizeof c->cancel_notice, rank, 1, "it was cancelled");

    /* The progress thread takes no signals: they belong to the worker's main thread. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int th = pthread_create(&c->thread, NULL, comm_cpu__progress_main, c);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (th != 0) {
        comm_cpu__fmt_err(errbuf, errcap, "cannot start the progress thread: %s", strerror(th));
        goto out;
    }
    c->have_thread = 1;
    rc = DDPD_OK;
out:
    if (rfd >= 0)
        close(rfd);
    if (lfd >= 0)
        close(lfd);
    free(table);
    if (rc != DDPD_OK) {
        cpu_free(c);
        c = NULL;
    }
    *ctx = c;
    return rc;
}

/* An all-reduce of n floats (half 0) or n 16-bit floats of kind hk (half 1). */
static ddpd_err allreduce_start(struct cpu *c, void *buf, int64_t n, int half, half_kind hk,
                                struct comm_req **req)
{
    const size_t esz = half ? sizeof(uint16_t) : sizeof(float);
    *req = NULL;
    struct comm_req *q = calloc(1, sizeof *q);
    pthread_mutex_lock(&c->mu);
    if (comm_cpu__check_usable(c) < 0 || !q || n < 0 || (uint64_t)n > SIZE_MAX / esz / 4) {
        if (!c->failed)
            comm_cpu__set_failed(c, DDPD_ECOMM,
                                 !q ? "out of memory" : "all-reduce of a negative or impossible count", 0);
        ddpd_err rc = c->fail_rc;
        pthread_mutex_unlock(&c->mu);
        free(q);
        return rc;
    }
    q->op = OP_ALLREDUCE;
    q->buf = buf;
    q->n = n;
    q->half = half;
    q->hk = hk;
    q->lnext = c->live;
    if (c->live)
        c->live->lprev = q;
    c->live = q;
    /* A small all-reduce issued while the ring is idle is left for the caller's wait to
     * run inline: waking the thread costs more than the collective (a cross-CPU wake-up
     * in a VM is tens of microseconds), and such a bucket (the last of a backward) is
     * waited for right away. The next start, blocking call or wait runs it, in order.
     * Anything else wakes the thread now: overlap with the caller's work is the point. */
    int defer = (uint64_t)n * esz <= SMALL_BYTES && !c->busy && !c->head;
    comm_cpu__enqueue(c, q);
    if (!defer)
        pthread_cond_signal(&c->work);
    pthread_mutex_unlock(&c->mu);
    *req = q;
    return DDPD_OK;
}

static ddpd_err cpu_allreduce_start(void *ctx, float *buf, int64_t n, struct comm_req **req)
{
    return allreduce_start(ctx, buf, n, 0, HALF_FP16, req);
}

static ddpd_err cpu_allreduce_half_start(void *ctx, uint16_t *buf, int64_t n, half_kind k,
                                         struct comm_req **req)
{
    return allreduce_start(ctx, buf, n, 1, k, req);
}

static uint64_t cpu_bytes_sent(void *ctx)
{
    struct cpu *c = ctx;
    return atomic_load_explicit(&c->sent, memory_order_relaxed);
}

static ddpd_err cpu_wait(void *ctx, struct comm_req *q)
{
    struct cpu *c = ctx;
    if (!q) {
        pthread_mutex_lock(&c->mu);
        ddpd_err rc = comm_cpu__check_usable(c) < 0 ? c->fail_rc : DDPD_OK;
        pthread_mutex_unlock(&c->mu);
        return rc;
    }
    ddpd_err rc = comm_cpu__wait_done(c, q);
    pthread_mutex_lock(&c->mu);
    if (q->lprev)
        q->lprev->lnext = q->lnext;
    else
        c->live = q->lnext;
    if (q->lnext)
        q->lnext->lprev = q->lprev;
    pthread_mutex_unlock(&c->mu);
    free(q);
    return rc;
}

static ddpd_err cpu_broadcast(void *ctx, void *buf, size_t bytes, int root)
{
    struct cpu *c = ctx;
    if (root < 0 || root >= c->world) {
        pthread_mutex_lock(&c->mu);
        comm_cpu__set_failed(c, DDPD_ECOMM, "broadcast from a rank outside the group", 0);
        pthread_mutex_unlock(&c->mu);
        return DDPD_ECOMM;
    }
    struct comm_req q = {.op = OP_BROADCAST, .buf = buf, .bytes = bytes, .root = root};
    return comm_cpu__blocking(c, &q);
}

static ddpd_err cpu_allgather(void *ctx, const void *in, size_t bytes, void *out)
{
    struct comm_req q = {.op = OP_ALLGATHER, .in = in, .buf = out, .bytes = bytes};
    return comm_cpu__blocking(ctx, &q);
}

static ddpd_err cpu_allreduce_max_i64(void *ctx, int64_t *v, int n)
{
    if (n < 0)
        n = 0;
    struct comm_req q = {.op = OP_MAX_I64, .buf = v, .n = n};
    return comm_cpu__blocking(ctx, &q);
}

static ddpd_err cpu_barrier(void *ctx)
{
    struct comm_req q = {.op = OP_BARRIER};
    return comm_cpu__blocking(ctx, &q);
}

/* The notice goes out before `aborted` is set: an executing thread that sees the flag
 * shuts the sockets at once, and a socket shut for reading that then receives prev's data
 * is reset by the kernel (RFC 1122), so a notice sent after that fails with ECONNRESET
 * and prev sees a bare hang-up: a cancelled rank's neighbour would report "closed the
 * connection" instead of the cancel. */
static void cpu_abort(void *ctx)
{
    struct cpu *c = ctx;
    if (!c)
        return;
    if (c->fd_prev >= 0)
        (void)!send(c->fd_prev, c->abort_notice, c->abort_notice_len, MSG_NOSIGNAL | MSG_DONTWAIT);
    atomic_store(&c->aborted, 1);
    comm_cpu__shut_sockets(c);
}

/* abort(), and the notice says why: prev learns that this rank was cancelled and passes
 * that on, so the whole ring ends as cancelled (DDPD_ECANCELED), not failed. Only atomics,
 * send and shutdown: safe in a signal handler. */
static int cpu_cancel(void *ctx)
{
    struct cpu *c = ctx;
    if (!c)
        return 0;
    atomic_store(&c->cancelled, 1);
    if (c->fd_prev >= 0 && c->cancel_notice_len) /* first: see cpu_abort */
        (void)!send(c->fd_prev, c->cancel_notice, c->cancel_notice_len, MSG_NOSIGNAL | MSG_DONTWAIT);
    atomic_store(&c->aborted, 1);
    comm_cpu__shut_sockets(c);
    return 1;
}

static const char *cpu_last_error(void *ctx)
{
    struct cpu *c = ctx;
    pthread_mutex_lock(&c->mu);
    comm_cpu__check_usable(c);
    snprintf(c->err_copy, sizeof c->err_copy, "%s", c->failed ? c->err : "");
    pthread_mutex_unlock(&c->mu);
    return c->err_copy;
}

static int cpu_failed_by_peer(void *ctx)
{
    struct cpu *c = ctx;
    pthread_mutex_lock(&c->mu);
    comm_cpu__check_usable(c);
    int by_peer = c->failed && c->fail_by_peer;
    pthread_mutex_unlock(&c->mu);
    return by_peer;
}

static void cpu_free(void *ctx)
{
    struct cpu *c = ctx;
    if (!c)
        return;
    if (c->have_thread) {
        pthread_mutex_lock(&c->mu);
        c->stopping = 1;
        /* A collective still running was never waited for: end it rather than its deadline. */
        if (c->busy) {
            atomic_store(&c->aborted, 1);
            comm_cpu__shut_sockets(c);
        }
        pthread_cond_signal(&c->work);
        pthread_mutex_unlock(&c->mu);
        pthread_join(c->thread, NULL);
    }
    while (c->live) {
        struct comm_req *q = c->live;
        c->live = q->lnext;
        free(q);
    }
    if (c->fd_next >= 0)
        close(c->fd_next);
    if (c->fd_prev >= 0)
        close(c->fd_prev);
    comm_cpu__link_unmap(&c->lin);
    comm_cpu__link_unmap(&c->lout);
    if (c->have_sync) {
        pthread_cond_destroy(&c->work);
        pthread_cond_destroy(&c->done);
        pthread_mutex_destroy(&c->mu);
    }
    free(c->stage);
    free(c->scratch);
    free(c);
}

const struct comm_ops comm_cpu_ops = {
    .name = "cpu",
    .init_rank = cpu_init_rank,
    .allreduce_start = cpu_allreduce_start,
    .allreduce_half_start = cpu_allreduce_half_start,
    .bytes_sent = cpu_bytes_sent,
    .wait = cpu_wait,
    .broadcast = cpu_broadcast,
    .allgather = cpu_allgather,
    .allreduce_max_i64 = cpu_allreduce_max_i64,
    .barrier = cpu_barrier,
    .abort = cpu_abort,
    .cancel = cpu_cancel,
    .last_error = cpu_last_error,
    .failed_by_peer = cpu_failed_by_peer,
    .free = cpu_free,
};
