/* comm/cpu/engine.c — the collective engine of the CPU backend: each collective as a plan of
 * send and receive segments run over the ring (TCP or the shared FIFOs), failure notices, and
 * the queue with its progress thread. Knows nothing of how the ring was formed. */
#include "cpu_impl.h"

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static const char *const op_names[OP_COUNT] = {"?",         "allreduce",     "broadcast",
                                               "allgather", "allreduce_max", "barrier"};

/* Shuts both ring sockets: a blocked executor wakes, and the neighbours see the
 * connection close at once, so one rank's failure reaches the whole ring in
 * milliseconds instead of at everyone's deadline. Async-signal-safe. */
void comm_cpu__shut_sockets(struct cpu *c)
{
    if (c->fd_next >= 0)
        shutdown(c->fd_next, SHUT_RDWR);
    if (c->fd_prev >= 0)
        shutdown(c->fd_prev, SHUT_RDWR);
}

/* Failure notices. Data only flows rank -> next, so the reverse direction of each ring
 * connection is idle after the hello; a rank that fails writes why into it, to prev,
 * before hanging up. Prev reads it when its own send fails or its socket to next turns
 * readable, and names the rank where the failure began instead of the neighbour that
 * merely passed the hang-up on. A dead process sends no notice: its neighbours see the
 * connection close, which names it just as well. */
size_t comm_cpu__notice_put(unsigned char *buf, size_t cap, int origin, int cancel, const char *text)
{
    size_t len = strlen(text);
    if (len > NOTICE_TEXT_MAX)
        len = NOTICE_TEXT_MAX;
    if (len > cap - NOTICE_HDR)
        len = cap - NOTICE_HDR;
    put32(buf, cancel ? CANCEL_TAG : NOTICE_TAG);
    put32(buf + 4, (uint32_t)origin);
    put32(buf + 8, (uint32_t)len);
    memcpy(buf + NOTICE_HDR, text, len);
    return NOTICE_HDR + len;
}

static void send_notice(struct cpu *c, int origin, int cancel, const char *text)
{
    unsigned char buf[NOTICE_HDR + NOTICE_TEXT_MAX];
    size_t n = comm_cpu__notice_put(buf, sizeof buf, origin, cancel, text);
    /* Best effort: the reverse direction is empty, so a few hundred bytes always fit. */
    if (c->fd_prev >= 0)
        (void)!send(c->fd_prev, buf, n, MSG_NOSIGNAL | MSG_DONTWAIT);
}

/* Where a failure began, its first text, and whether it was a cancel (a rank told to
 * stop, not a fault), passed along backwards unchanged; `hangup`: a neighbour hung up
 * without a word (it died), so the failure began there though no notice names it;
 * `silent`: next's host stopped answering. */
struct origin {
    int rank;
    int cancel;
    int hangup;
    int silent; /* next's host stopped answering (seen here first-hand, as a timeout is) */
    char text[NOTICE_TEXT_MAX + 1];
};

/* Anything readable from next means next has given up: a notice followed by its hang-up,
 * or just the hang-up (it died). Returns 1 with the failure in err and o, 0 when nothing
 * has arrived. */
int comm_cpu__notice_decode(const unsigned char *buf, size_t k, int world, int *origin,
                            char text[NOTICE_TEXT_MAX + 1])
{
    /* Zero bytes are wake-up pings of a shared-memory link, not news. */
    const unsigned char *all = buf;
    while (k > 0 && *buf == 0) {
        buf++;
        k--;
    }
    if (k == 0 && buf != all)
        return 0;
    if (k >= NOTICE_HDR && (get32(buf) == NOTICE_TAG || get32(buf) == CANCEL_TAG)) {
        uint32_t from = get32(buf + 4), len = get32(buf + 8);
        /* The origin and length are the peer's claims: both are checked against what
         * arrived and the world before use. */
        if (from < (uint32_t)world && len <= k - NOTICE_HDR && len <= NOTICE_TEXT_MAX) {
            for (uint32_t i = 0; i < len; i++) {
                unsigned char ch = buf[NOTICE_HDR + i];
                text[i] = ch >= 32 && ch < 127 ? (char)ch : '?';
            }
            text[len] = '\0';
            *origin = (int)from;
            return get32(buf) == CANCEL_TAG ? 2 : 1;
        }
    }
    return -1;
}

/* A neighbour whose host stopped answering: the kernel gave up on the link (ETIMEDOUT:
 * keepalive, comm_cpu__sock_live) or its clock of acknowledgements says so
 * (comm_cpu__sock_silent). Not a failure that began at another rank in the sense of
 * failed_by_peer: like a timeout, it is seen first-hand, and it names whom it lost. */
static void silent_text(char *err, size_t cap, int peer, const char *host, const char *w, double quiet_s)
{
    snprintf(err, cap,
             "rank %d on host %s stopped answering during %s: its host acknowledged nothing for %.1f s "
             "(a node or its network lost)",
             peer, host, w, quiet_s);
}

static int next_failed(struct cpu *c, const char *w, char *err, size_t cap, struct origin *o)
{
    unsigned char all[1024];
    ssize_t k = recv(c->fd_next, all, sizeof all, MSG_DONTWAIT);
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return 0;
    if (k < 0 && errno == ETIMEDOUT) {
        silent_text(err, cap, c->next, c->next_host, w, LIVE_S);
        o->silent = 1;
        return 1;
    }
    int got = k > 0 ? comm_cpu__notice_decode(all, (size_t)k, c->world, &o->rank, o->text) : -1;
    if (got == 0)
        return 0;
    if (got > 0) {
        o->cancel = got == 2;
        snprintf(err, cap, "rank %d reported: %s", o->rank, o->text);
        return 1;
    }
    snprintf(err, cap, "peer rank %d closed the connection during %s", c->next, w);
    o->hangup = 1;
    return 1;
}

/* ---- the collective engine ---- */

static void seg_of(const struct cpu *c, const struct plan *p, int recv, int i, unsigned char **ptr,
                   size_t *len)
{
    if (p->chain) {
        *ptr = p->base;
        *len = p->total;
        return;
    }
    /* Ring step i: send chunk rank-i, receive chunk rank-i-1. */
    size_t W = (size_t)c->world;
    size_t ch = ((size_t)c->rank + 3 * W - (size_t)i - (size_t)recv) % W;
    if (p->gloo_chunk) {
        size_t g = (ch + W - 1) % W, a = g * p->gloo_chunk, b = a + p->gloo_chunk;
        a = a < p->nunits ? a : p->nunits;
        b = b < p->nunits ? b : p->nunits;
        *ptr = p->base + a * p->unit;
        *len = (b - a) * p->unit;
        return;
    }
    size_t per = p->nunits / W, rem = p->nunits % W;
    size_t start = ch * per + (ch < rem ? ch : rem);
    *ptr = p->base + start * p->unit;
    *len = (per + (ch < rem)) * p->unit;
}

static size_t send_limit(const struct plan *p, const struct stream *r, int i, size_t len)
{
    if (p->nrecv == 0 || i < p->lag)
        return len;
    int j = i - p->lag;
    if (r->seg > j)
        return len;
    return r->seg == j ? r->off : 0;
}

/* Moves a stream past finished (and empty) segments. */
static void stream_skip(const struct cpu *c, const struct plan *p, int recv, struct stream *s)
{
    int nseg = recv ? p->nrecv : p->nsend;
    while (s->seg < nseg) {
        unsigned char *ptr;
        size_t len;
        seg_of(c, p, recv, s->seg, &ptr, &len);
        if (s->off < len)
            break;
        s->seg++;
        s->off = 0;
    }
}

static void describe(char *buf, size_t cap, int op, uint32_t seq, uint64_t bytes, uint32_t arg)
{
    const char *name = op > 0 && op < OP_COUNT ? op_names[op] : "unknown collective";
    if (op == OP_BARRIER)
        snprintf(buf, cap, "%s #%u", name, seq);
    else if (op == OP_BROADCAST)
        snprintf(buf, cap, "%s #%u of %llu bytes from rank %u", name, seq, (unsigned long long)bytes, arg);
    else
        snprintf(buf, cap, "%s #%u of %llu bytes", name, seq, (unsigned long long)bytes);
}

void comm_cpu__header_describe(const unsigned char h[HDR_BYTES], char *buf, size_t cap)
{
    describe(buf, cap, (int)get32(h + 4), get32(h + 12), get64(h + 16), get32(h + 8));
}

/* "allreduce (bucket of 1048576 floats)": what the user's call was, for error texts. */
static void what(char *buf, size_t cap, const struct plan *p)
{
    const char *name = op_names[p->op];
    switch (p->op) {
    case OP_ALLREDUCE:
        if (p->half)
            snprintf(buf, cap, "%s (bucket of %llu %s values)", name,
                     (unsigned long long)(p->bytes / sizeof(uint16_t)), p->hk == HALF_BF16 ? "bf16" : "fp16");
        else
            snprintf(buf, cap, "%s (bucket of %llu floats)", name,
                     (unsigned long long)(p->bytes / sizeof(float)));
        break;
    case OP_BROADCAST:
        snprintf(buf, cap, "%s (%llu bytes from rank %u)", name, (unsigned long long)p->bytes, p->arg);
        break;
    case OP_ALLGATHER:
        snprintf(buf, cap, "%s (%llu bytes per rank)", name, (unsigned long long)p->bytes);
        break;
    case OP_MAX_I64:
        snprintf(buf, cap, "%s (%llu values)", name, (unsigned long long)(p->bytes / sizeof(int64_t)));
        break;
    default: snprintf(buf, cap, "%s", name);
    }
}

/* Shared-memory waits spin by sched_yield for up to SPIN_S before they sleep: when the
 * peer shares this CPU (more ranks than CPUs), the yield lets it run at once, and when it
 * runs on another one, the bytes usually come within microseconds, far cheaper than a
 * sleep and a ping (a 2-rank all-reduce of 8 bytes: ~2 us against ~5 us). But a yield
 * gives the CPU to whatever else is runnable here, and since Linux 6.6 (EEVDF) it also
 * moves this thread's deadline a whole slice back: a CPU-bound process beside the ranks
 * then keeps the CPU until the next tick (4 ms at HZ=250), whereas a thread woken from a
 * sleep preempts it. One such yield per wait made 2- and 3-rank jobs 10-30 times slower
 * beside two busy loops on 2 cores (bench/README.md, "bench/oversub"). So the spins run on a
 * credit of time they may lose: a yield that comes back later than SPIN_SLICE_S (a time
 * slice, not a peer's share of a collective) costs what it took; a spin that catches the
 * peer's bytes earns SPIN_CATCH_S (the sleep it saved); and SPIN_LOSS of the time that
 * passes is earned anyway, so that spinning resumes once a busy loop is gone. The credit
 * is capped at SPIN_CREDIT_S (two ticks); while it is spent, waits sleep at once. Beside
 * a busy loop a rank thus loses to yields at most what its spins saved plus SPIN_LOSS of
 * its time; without one, it spins as before. Owned by the executing thread, like seq. */
static int spin_allowed(struct cpu *c, double now)
{
    c->spin_credit += SPIN_LOSS * (now - c->spin_credit_at);
    if (c->spin_credit > SPIN_CREDIT_S)
        c->spin_credit = SPIN_CREDIT_S;
    c->spin_credit_at = now;
    return c->spin_credit > 0;
}

static void spin_caught(struct cpu *c)
{
    c->spin_credit += SPIN_CATCH_S;
    if (c->spin_credit > SPIN_CREDIT_S)
        c->spin_credit = SPIN_CREDIT_S;
}

static void add_into(float *restrict dst, const float *restrict src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] += src[i];
}

/* Adds `bytes` (whole elements) of the incoming partial sum into dst: floats, or 16-bit
 * floats rounded after each add as gloo's fp16 sum is (half.h). */
static void reduce_into(const struct plan *p, unsigned char *dst, const void *src, size_t bytes)
{
    if (p->half)
        half_add(p->hk, (uint16_t *)(void *)dst, src, (int64_t)(bytes / sizeof(uint16_t)));
    else
        add_into((float *)(void *)dst, src, bytes / sizeof(float));
}

/* Checks a complete incoming collective header against ours; -1 with the text if not. */
static int header_check(const struct cpu *c, const struct plan *p, const unsigned char *shdr,
                        const unsigned char *rhdr, uint32_t seq, char *err, size_t cap)
{
    if (memcmp(rhdr, shdr, HDR_BYTES) == 0)
        return 0;
    char got[96], want[96], w[160];
    if (get32(rhdr) != get32(shdr)) {
        what(w, sizeof w, p);
        snprintf(err, cap,
                 "garbled stream from rank %d during %s (no collective header "
                 "where one was due)",
                 c->prev, w);
        return -1;
    }
    comm_cpu__header_describe(rhdr, got, sizeof got);
    describe(want, sizeof want, p->op, seq, p->bytes, p->arg);
    snprintf(err, cap, "collective mismatch: rank %d sent %s, expected %s", c->prev, got, want);
    return -1;
}

/* Whether a TCP link's peer host stopped answering while we wait on it (comm_cpu__sock_silent);
 * the text names the rank and its host. Keepalive's verdict on an idle link comes as
 * ETIMEDOUT from the link's reads and writes instead. Same-host links are not looked at: a
 * peer process that dies there closes its socket. */
static int links_silent(struct cpu *c, const char *w, char *err, size_t cap)
{
    double quiet;
    if (!c->lout.h && comm_cpu__sock_silent(c->fd_next, LIVE_S, &quiet)) {
        silent_text(err, cap, c->next, c->next_host, w, quiet);
        return 1;
    }
    if (!c->lin.h && comm_cpu__sock_silent(c->fd_prev, LIVE_S, &quiet)) {
        silent_text(err, cap, c->prev, c->prev_host, w, quiet);
        return 1;
    }
    return 0;
}

/* Runs one collective's plan to the end or to the first failure (text in err). A failure
 * sends a notice to prev and shuts the sockets, which poisons the ring for everyone.
 * Each direction moves over TCP or over a shared FIFO (same host); the bookkeeping,
 * the pipelining rule and the failure handling are the same for both. */
static ddpd_err run_plan(struct cpu *c, const struct plan *p, char *err, size_t cap)
{
    unsigned char shdr[HDR_BYTES], rhdr[HDR_BYTES];
    uint32_t seq = ++c->seq;
    put32(shdr, 0x44445043); /* "DDPC" */
    put32(shdr + 4, (uint32_t)p->op);
    put32(shdr + 8, p->arg);
    put32(shdr + 12, seq);
    put64(shdr + 16, p->bytes);

    struct stream s = {0}, r = {0};
    struct origin o = {.rank = -1};
    const size_t esz = p->half ? sizeof(uint16_t) : sizeof(float); /* a reduced element */
    double deadline = base_mono_s() + c->timeout_s;
    double live_at = base_mono_s() + LIVE_CHECK_S; /* the next look at the links' liveness */
    double spin_until = 0;                         /* > 0 while a shared-memory wait is under way ... */
    int slept = 0;                                 /* ... and it slept or lost a slice: not a catch */
    char w[160];
    int e = 0;

    /* Each collective starts 8-aligned in a FIFO, so floats read in place are aligned.
     * Both sides stand at the same position here and pad alike. */
    if (c->lout.h)
        c->lout.pos = (c->lout.pos + 7) & ~(uint64_t)7;
    if (c->lin.h)
        c->lin.pos = (c->lin.pos + 7) & ~(uint64_t)7;
    stream_skip(c, p, 0, &s);
    stream_skip(c, p, 1, &r);
    for (;;) {
        int sdone = p->nsend == 0 || (s.hdr == HDR_BYTES && s.seg == p->nsend);
        int rdone = p->nrecv == 0 || (r.hdr == HDR_BYTES && r.seg == p->nrecv);
        if (sdone && rdone)
            return DDPD_OK;
        if (atomic_load_explicit(&c->aborted, memory_order_relaxed))
            goto fail;
        int progressed = 0, want_out = 0, want_in = 0;

        if (!sdone) {
            struct iovec iov[2];
            int cnt = 0;
            if (s.hdr < HDR_BYTES)
                iov[cnt++] = (struct iovec){shdr + s.hdr, HDR_BYTES - s.hdr};
            if (s.seg < p->nsend) {
                unsigned char *ptr;
                size_t len;
                seg_of(c, p, 0, s.seg, &ptr, &len);
                size_t lim = send_limit(p, &r, s.seg, len);
                if (lim > s.off) {
                    size_t k = lim - s.off;
                    iov[cnt++] = (struct iovec){ptr + s.off, k < SEND_SLICE ? k : SEND_SLICE};
                }
            }
            ssize_t k = 0;
            if (cnt > 0 && c->lout.h) {
                k = (ssize_t)comm_cpu__shm_put(c, iov, cnt);
                want_out = k == 0;
            } else if (cnt > 0) {
                struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)cnt};
                k = sendmsg(c->fd_next, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
                if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                    want_out = 1;
                } else if (k < 0 && errno != EINTR) {
                    e = errno;
                    what(w, sizeof w, p);
                    if (e == ETIMEDOUT) { /* the kernel gave up on next's host (sock_live) */
                        silent_text(err, cap, c->next, c->next_host, w, LIVE_S);
                        goto fail;
                    }
                    if (next_failed(c, w, err, cap, &o))
                        goto fail;
                    if (e == EPIPE || e == ECONNRESET) {
                        snprintf(err, cap, "peer rank %d closed the connection during %s", c->next, w);
                        o.hangup = 1;
                    } else
                        snprintf(err, cap, "sending to rank %d during %s: %s", c->next, w, strerror(e));
                    goto fail;
                }
            }
            if (k > 0) {
                size_t left = (size_t)k;
                atomic_fetch_add_explicit(&c->sent, (uint64_t)k, memory_order_relaxed);
                if (s.hdr < HDR_BYTES) {
                    size_t h = HDR_BYTES - s.hdr < left ? HDR_BYTES - s.hdr : left;
                    s.hdr += h;
                    left -= h;
                }
                s.off += left;
                stream_skip(c, p, 0, &s);
                progressed = 1;
            }
        }

        if (!rdone && c->lin.h) {
            const unsigned char *src = NULL;
            size_t n = comm_cpu__shm_avail(&c->lin, &src), used = 0;
            if (n > SHM_PIECE)
                n = SHM_PIECE;
            if (n > 0 && r.hdr < HDR_BYTES) {
                size_t h = HDR_BYTES - r.hdr < n ? HDR_BYTES - r.hdr : n;
                memcpy(rhdr + r.hdr, src, h);
                r.hdr += h;
                used = h;
                if (r.hdr == HDR_BYTES && header_check(c, p, shdr, rhdr, seq, err, cap) < 0)
                    goto fail;
            }
            if (used < n && r.hdr == HDR_BYTES && r.seg < p->nrecv) {
                unsigned char *ptr;
                size_t len;
                seg_of(c, p, 1, r.seg, &ptr, &len);
                size_t m = n - used < len - r.off ? n - used : len - r.off;
                if (r.seg < p->nreduce) {
                    /* Added straight from the FIFO: the stage is a TCP-only detour. */
                    m = m / esz * esz;
                    reduce_into(p, ptr + r.off, src + used, m);
                } else {
                    memcpy(ptr + r.off, src + used, m);
                }
                r.off += m;
                used += m;
                stream_skip(c, p, 1, &r);
            }
            if (used) {
                comm_cpu__shm_consume(c, used);
                progressed = 1;
            } else {
                want_in = 1;
            }
        } else if (!rdone) {
            struct iovec iov[2];
            int cnt = 0;
            unsigned char *ptr = NULL;
            size_t len = 0;
            int reduce = r.seg < p->nreduce;
            if (r.hdr < HDR_BYTES)
                iov[cnt++] = (struct iovec){rhdr + r.hdr, HDR_BYTES - r.hdr};
            if (r.seg < p->nrecv) {
                seg_of(c, p, 1, r.seg, &ptr, &len);
                if (reduce) {
                    size_t room = STAGE_BYTES - r.pend, want = len - r.off - r.pend;
                    iov[cnt++] =
                        (struct iovec){(unsigned char *)c->stage + r.pend, want < room ? want : room};
                } else {
                    iov[cnt++] = (struct iovec){ptr + r.off, len - r.off};
                }
            }
            struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)cnt};
            ssize_t k = recvmsg(c->fd_prev, &m, MSG_DONTWAIT);
            if (k > 0) {
                size_t left = (size_t)k;
                progressed = 1;
                if (r.hdr < HDR_BYTES) {
                    size_t h = HDR_BYTES - r.hdr < left ? HDR_BYTES - r.hdr : left;
                    r.hdr += h;
                    left -= h;
                    if (r.hdr == HDR_BYTES && header_check(c, p, shdr, rhdr, seq, err, cap) < 0)
                        goto fail;
                }
                if (reduce) {
                    r.pend += left;
                    size_t whole = r.pend / esz * esz;
                    reduce_into(p, ptr + r.off, c->stage, whole);
                    r.off += whole;
                    r.pend -= whole;
                    if (r.pend)
                        memmove(c->stage, (unsigned char *)c->stage + whole, r.pend);
                } else {
                    r.off += left;
                }
                stream_skip(c, p, 1, &r);
            } else if (k == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
                e = k == 0 ? 0 : errno;
                goto prev_failed;
            } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
                want_in = 1;
            }
        }

        if (progressed) {
            if (spin_until > 0 && !slept)
                spin_caught(c);
            spin_until = 0;
            slept = 0;
            continue;
        }
        /* Nothing moved this round. Every way of waiting below (a spin, a re-check of the
         * FIFOs, a poll) comes back here, so this one check bounds them all: a wait that
         * ends early for any reason, or a peer that stops in any state, cannot keep this
         * rank past its deadline. */
        double now = base_mono_s();
        if (now >= deadline) {
            what(w, sizeof w, p);
            /* Name whom we wait for: the sender if its bytes are missing, else the
             * receiver that does not drain its socket or FIFO. */
            int whom = want_in || !want_out ? c->prev : c->next;
            snprintf(err, cap, "%s timed out after %.1f s waiting for rank %d", w, c->timeout_s, whom);
            goto fail;
        }
        /* A neighbour's host that stopped answering ends the wait long before the deadline
         * (LIVE_S; links_silent). Read from the kernel's clocks, never from ours: a wait that
         * comes here late, after this rank was descheduled, sees no silence that was not. */
        if (now >= live_at) {
            live_at = now + LIVE_CHECK_S;
            what(w, sizeof w, p);
            if (links_silent(c, w, err, cap))
                goto fail;
        }
        if (!want_in && !want_out)
            continue;
        /* A shared-memory peer is usually about to write or drain: spin briefly before
         * paying for a sleep and a wake-up, while the spins' credit lasts (spin_allowed). */
        int shm_in = want_in && c->lin.h, shm_out = want_out && c->lout.h;
        if (shm_in || shm_out) {
            if (spin_until == 0)
                spin_until = spin_allowed(c, now) ? now + SPIN_S : now;
            if (now < spin_until) {
                /* sched_yield, not a pause loop: with more runnable threads than CPUs
                 * (two ranks packed on one vCPU) a pure spin would keep the very peer
                 * we wait for off the CPU until the spin ends. A yield that comes back
                 * after more than SPIN_SLICE_S was some other thread's time slice, not
                 * a peer's turn at the collective: it is charged to the credit. */
                sched_yield();
                double lost = base_mono_s() - now;
                if (lost > SPIN_SLICE_S) {
                    c->spin_credit -= lost;
                    slept = 1; /* not a catch */
                }
                continue;
            }
            slept = 1;
            /* Going to sleep: say so, then look once more (the other side's publish and
             * our flag are both seq_cst, so it either sees the flag and pings, or we see
             * its bytes here). */
            int ready = 0;
            if (shm_in)
                atomic_store(&c->lin.h->cons_sleep, 1);
            if (shm_out)
                atomic_store(&c->lout.h->prod_sleep, 1);
            atomic_thread_fence(memory_order_seq_cst); /* the flags before the re-reads */
            if (shm_in)
                ready |= comm_cpu__shm_usable(c, p, &r);
            if (shm_out)
                ready |= comm_cpu__shm_room(&c->lout) > 0;
            if (ready) {
                if (shm_in)
                    atomic_store(&c->lin.h->cons_sleep, 0);
                if (shm_out)
                    atomic_store(&c->lout.h->prod_sleep, 0);
                continue;
            }
        }
        /* While we still owe next bytes, fd_next is watched for input too: anything
         * arriving there is a failure notice or a hang-up (next_failed), which must end
         * this wait at once; pings for a shared FIFO arrive there as well. Once our part
         * is sent, next may finish and hang up first. */
        struct pollfd pf[2];
        nfds_t np = 0;
        if (!sdone)
            pf[np++] =
                (struct pollfd){c->fd_next, (short)(POLLIN | (want_out && !c->lout.h ? POLLOUT : 0)), 0};
        if (want_in)
            pf[np++] = (struct pollfd){c->fd_prev, POLLIN, 0};
        int pr = poll(pf, np, comm_cpu__ms_until(live_at < deadline ? live_at : deadline));
        int perr = errno;
        if (shm_in)
            atomic_store(&c->lin.h->cons_sleep, 0);
        if (shm_out)
            atomic_store(&c->lout.h->prod_sleep, 0);
        if (pr > 0 && !sdone && (pf[0].revents & (POLLIN | POLLHUP | POLLERR))) {
            what(w, sizeof w, p);
            if (next_failed(c, w, err, cap, &o))
                goto fail;
        }
        if (pr > 0 && shm_in && (pf[np - 1].revents & (POLLIN | POLLHUP | POLLERR))) {
            /* Only pings come this way on a shared link: drain them; a hang-up is news. */
            unsigned char junk[256];
            ssize_t k = recv(c->fd_prev, junk, sizeof junk, MSG_DONTWAIT);
            if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
                /* A peer that finished its part writes its last bytes into the FIFO and
                 * may exit before we read them: data that is there comes first; the
                 * hang-up only matters once nothing usable is left and we still need
                 * input. */
                if (comm_cpu__shm_usable(c, p, &r))
                    continue;
                e = k == 0 ? 0 : errno;
                goto prev_failed;
            }
        }
        if (pr < 0 && perr != EINTR) {
            snprintf(err, cap, "poll: %s", strerror(perr));
            goto fail;
        }
    }

prev_failed:
    if (atomic_load(&c->aborted))
        goto fail;
    what(w, sizeof w, p);
    if (e == ETIMEDOUT) {
        /* Not a hang-up passed on: prev's host stopped answering (the kernel gave up on the
         * link, sock_live), so the failure is here to see and nobody's news will come. */
        silent_text(err, cap, c->prev, c->prev_host, w, LIVE_S);
        goto fail;
    }
    {
        /* Prev hung up. Hang-ups travel forward around the ring and notices backward, so
         * whatever broke it, the news comes back to us from next: a notice naming the rank
         * where the failure began (and whether that rank was cancelled), or next's own
         * hang-up. Pass the hang-up on first (a next that has sent its part watches only
         * prev), then wait for the news until the deadline or an abort: which rank
         * happened to see the hang-up first then changes nothing in what every rank
         * reports. With W=2 next is prev, and its notice or hang-up is already there.
         * If next hung up without a word while we still owe it bytes, it died (a live
         * rank sends a notice first), and prev only passed that on: name next. */
        struct origin o2 = {.rank = -1};
        char t2[ERR_CAP];
        int sdone = p->nsend == 0 || (s.hdr == HDR_BYTES && s.seg == p->nsend);
        int got = 0;
        shutdown(c->fd_next, SHUT_WR);
        while (!(got = next_failed(c, w, t2, sizeof t2, &o2)) && !atomic_load(&c->aborted)) {
            /* A next whose host went silent sends no news: the wait ends at LIVE_S. */
            double now = base_mono_s(), quiet;
            if (!c->lout.h && comm_cpu__sock_silent(c->fd_next, LIVE_S, &quiet)) {
                silent_text(t2, sizeof t2, c->next, c->next_host, w, quiet);
                o2.silent = got = 1;
                break;
            }
            if (now >= deadline ||
                comm_cpu__wait_fd(c->fd_next, POLLIN,
                                  now + LIVE_CHECK_S < deadline ? now + LIVE_CHECK_S : deadline) < 0)
                break;
        }
        if (atomic_load(&c->aborted))
            goto fail;
        if (got && (o2.rank >= 0 || o2.silent || !sdone)) {
            o = o2;
            snprintf(err, cap, "%s", t2);
        } else if (e == 0 || e == ECONNRESET) {
            snprintf(err, cap, "peer rank %d closed the connection during %s", c->prev, w);
            o.hangup = 1;
        } else {
            snprintf(err, cap, "receiving from rank %d during %s: %s", c->prev, w, strerror(e));
        }
    }
fail:
    if (atomic_load(&c->aborted)) {
        /* Whatever broke after abort() or cancel() is its doing; it sent its own notice. */
        int cancelled = atomic_load(&c->cancelled);
        what(w, sizeof w, p);
        snprintf(err, cap, "%s during %s", cancelled ? "cancelled" : "communicator aborted", w);
        comm_cpu__shut_sockets(c);
        return cancelled ? DDPD_ECANCELED : DDPD_ECOMM;
    }
    /* Another rank's notice, or a neighbour's silent hang-up: the failure began there. */
    c->exec_by_peer = (o.rank >= 0 && o.rank != c->rank) || o.hangup;
    if (o.rank < 0) {
        o.rank = c->rank;
        snprintf(o.text, sizeof o.text, "%s", err);
    }
    /* A cancel stays a cancel as it travels: every rank ends as cancelled, not failed. */
    send_notice(c, o.rank, o.cancel, o.text);
    comm_cpu__shut_sockets(c);
    return o.cancel ? DDPD_ECANCELED : DDPD_ECOMM;
}

/* Grows the executor's scratch to at least `bytes`. */
static int scratch_reserve(struct cpu *c, size_t bytes, char *err, size_t cap)
{
    if (bytes <= c->scratch_cap)
        return 0;
    unsigned char *n = realloc(c->scratch, bytes);
    if (!n) {
        snprintf(err, cap, "out of memory for a %zu-byte collective buffer", bytes);
        return -1;
    }
    c->scratch = n;
    c->scratch_cap = bytes;
    return 0;
}

/* Ring all-gather of `bytes` per rank in out[world*bytes]; this rank's part is in place. */
static ddpd_err ring_allgather(struct cpu *c, int op, uint32_t arg, uint64_t hdr_bytes, unsigned char *out,
                               size_t bytes, char *err, size_t cap)
{
    struct plan p = {.op = op,
                     .arg = arg,
                     .bytes = hdr_bytes,
                     .base = out,
                     .unit = bytes,
                     .nunits = (size_t)c->world,
                     .nsend = c->world - 1,
                     .nrecv = c->world - 1,
                     .lag = 1};
    return run_plan(c, &p, err, cap);
}

static ddpd_err do_allreduce(struct cpu *c, float *buf, int64_t n, char *err, size_t cap)
{
    size_t W = (size_t)c->world, nb = (size_t)n * sizeof(float);
    if (W == 1)
        return DDPD_OK;
    if (nb > SMALL_BYTES) {
        /* Reduce-scatter (W-1 steps, each adds the incoming chunk), then all-gather (W-1
         * steps, each copies a finished chunk): chunk c's sum is made by rank c-1 alone. */
        struct plan p = {.op = OP_ALLREDUCE,
                         .bytes = nb,
                         .base = (unsigned char *)buf,
                         .unit = sizeof(float),
                         .nunits = (size_t)n,
                         .nsend = 2 * (c->world - 1),
                         .nrecv = 2 * (c->world - 1),
                         .lag = 1,
                         .nreduce = c->world - 1};
        return run_plan(c, &p, err, cap);
    }
    /* Latency path: one all-gather of every contribution (W-1 hops instead of 2(W-1)),
     * then every rank sums them in rank order 0..W-1, which gives the same bits everywhere. */
    if (scratch_reserve(c, W * nb, err, cap) < 0)
        return DDPD_ECOMM;
    float *all = (float *)c->scratch;
    if (nb)
        memcpy(all + (size_t)c->rank * (size_t)n, buf, nb);
    ddpd_err rc = ring_allgather(c, OP_ALLREDUCE, 0, nb, c->scratch, nb, err, cap);
    if (rc != DDPD_OK)
        return rc;
    for (size_t i = 0; i < (size_t)n; i++) {
        float acc = all[i];
        for (size_t r = 1; r < W; r++)
            acc += all[r * (size_t)n + i];
        buf[i] = acc;
    }
    return DDPD_OK;
}

/* The all-reduce of 16-bit floats (DDP's fp16 and bf16 comm hooks) with the numbers of
 * gloo's ring all-reduce, which PyTorch's fp16_compress_hook sums with on the CPU: gloo
 * splits the tensor into 2W segments of ceil(n/2W) elements, chunk g (segments 2g and
 * 2g+1) travels from rank g-1 down to rank g, and every add rounds to fp16. An element of
 * chunk g is thus ((x[g-1] + x[g-2]) + ...) + x[g] (checked against PyTorch 1.13 for 2, 3
 * and 4 ranks). The header's arg names the kind, so that ranks that disagree on it fail
 * as a collective mismatch. */
static ddpd_err do_allreduce_half(struct cpu *c, uint16_t *buf, int64_t n, half_kind hk, char *err,
                                  size_t cap)
{
    const size_t W = (size_t)c->world, nb = (size_t)n * sizeof(uint16_t);
    if (W == 1 || n == 0)
        return DDPD_OK;
    const size_t per = 2 * (((size_t)n + 2 * W - 1) / (2 * W)); /* gloo's chunk */
    if (nb > SMALL_BYTES) {
        /* This ring sends to rank+1, gloo's to rank-1: chunk c here is summed from rank c
         * up to rank c-1, so it holds gloo's chunk c-1 to end with the same last add.
         * With 2 or 3 ranks that is gloo's order exactly (the first two addends commute);
         * from 4 ranks on the middle addends come in another order, the same on every
         * rank (bitwise equal replicas, sub-ulp apart from gloo). */
        struct plan p = {.op = OP_ALLREDUCE,
                         .arg = 1u + (uint32_t)hk,
                         .bytes = nb,
                         .base = (unsigned char *)buf,
                         .unit = sizeof(uint16_t),
                         .nunits = (size_t)n,
                         .nsend = 2 * (c->world - 1),
                         .nrecv = 2 * (c->world - 1),
                         .lag = 1,
                         .nreduce = c->world - 1,
                         .half = 1,
                         .hk = hk,
                         .gloo_chunk = per};
        return run_plan(c, &p, err, cap);
    }
    /* Latency path: all-gather every contribution, then sum each element in gloo's order. */
    if (scratch_reserve(c, W * nb, err, cap) < 0)
        return DDPD_ECOMM;
    uint16_t *all = (uint16_t *)(void *)c->scratch;
    memcpy(all + (size_t)c->rank * (size_t)n, buf, nb);
    ddpd_err rc = ring_allgather(c, OP_ALLREDUCE, 1u + (uint32_t)hk, nb, c->scratch, nb, err, cap);
    if (rc != DDPD_OK)
        return rc;
    for (size_t i = 0; i < (size_t)n; i++) {
        const size_t g = i / per;
        uint16_t acc = all[((g + W - 1) % W) * (size_t)n + i];
        for (size_t k = 2; k <= W; k++)
            half_add(hk, &acc, &all[((g + W - k % W) % W) * (size_t)n + i], 1);
        buf[i] = acc;
    }
    return DDPD_OK;
}

static ddpd_err do_broadcast(struct cpu *c, void *buf, size_t bytes, int root, char *err, size_t cap)
{
    if (c->world == 1)
        return DDPD_OK;
    /* A chain root -> root+1 -> ... -> root-1; each forwards what it has received so far. */
    int pos = (c->rank - root + c->world) % c->world;
    struct plan p = {.op = OP_BROADCAST,
                     .arg = (uint32_t)root,
                     .bytes = bytes,
                     .base = buf,
                     .chain = 1,
                     .total = bytes,
                     .nsend = pos<c->world - 1, .nrecv = pos> 0,
                     .lag = 0};
    return run_plan(c, &p, err, cap);
}

static ddpd_err do_allgather(struct cpu *c, const void *in, size_t bytes, void *out, char *err, size_t cap)
{
    unsigned char *mine = (unsigned char *)out + (size_t)c->rank * bytes;
    if (bytes && (const void *)mine != in)
        memmove(mine, in, bytes);
    if (c->world == 1)
        return DDPD_OK;
    return ring_allgather(c, OP_ALLGATHER, 0, bytes, out, bytes, err, cap);
}

static ddpd_err do_max(struct cpu *c, int64_t *v, int n, char *err, size_t cap)
{
    size_t W = (size_t)c->world, nb = (size_t)n * sizeof(int64_t);
    if (W == 1)
        return DDPD_OK;
    if (scratch_reserve(c, W * nb + 1, err, cap) < 0)
        return DDPD_ECOMM;
    int64_t *all = (int64_t *)c->scratch;
    if (nb)
        memcpy(all + (size_t)c->rank * (size_t)n, v, nb);
    ddpd_err rc = ring_allgather(c, OP_MAX_I64, 0, nb, c->scratch, nb, err, cap);
    if (rc != DDPD_OK)
        return rc;
    for (size_t r = 0; r < W; r++)
        for (size_t i = 0; i < (size_t)n; i++)
            if (all[r * (size_t)n + i] > v[i])
                v[i] = all[r * (size_t)n + i];
    return DDPD_OK;
}

static ddpd_err do_barrier(struct cpu *c, char *err, size_t cap)
{
    if (c->world == 1)
        return DDPD_OK;
    /* An all-gather of one byte: nobody finishes before everyone has started. */
    if (scratch_reserve(c, (size_t)c->world, err, cap) < 0)
        return DDPD_ECOMM;
    c->scratch[c->rank] = 1;
    return ring_allgather(c, OP_BARRIER, 0, 0, c->scratch, 1, err, cap);
}

static ddpd_err execute(struct cpu *c, struct comm_req *q, char *err, size_t cap)
{
    switch (q->op) {
    case OP_ALLREDUCE:
        return q->half ? do_allreduce_half(c, q->buf, q->n, q->hk, err, cap)
                       : do_allreduce(c, q->buf, q->n, err, cap);
    case OP_BROADCAST: return do_broadcast(c, q->buf, q->bytes, q->root, err, cap);
    case OP_ALLGATHER: return do_allgather(c, q->in, q->bytes, q->buf, err, cap);
    case OP_MAX_I64: return do_max(c, q->buf, (int)q->n, err, cap);
    case OP_BARRIER: return do_barrier(c, err, cap);
    }
    snprintf(err, cap, "unknown collective %d", q->op);
    return DDPD_ECOMM;
}

/* ---- the queue and the progress thread ---- */

/* Records the first failure; every later call fails fast with its text and its code
 * (DDPD_ECANCELED when the group ended by a cancel, else DDPD_ECOMM). `by_peer`: it began
 * at another rank (failed_by_peer). Under mu. */
void comm_cpu__set_failed(struct cpu *c, ddpd_err rc, const char *text, int by_peer)
{
    if (c->failed)
        return;
    c->failed = 1;
    c->fail_by_peer = by_peer;
    c->fail_rc = rc == DDPD_ECANCELED ? DDPD_ECANCELED : DDPD_ECOMM;
    snprintf(c->err, sizeof c->err, "%s", text && *text ? text : "communication failure");
}

/* Fails fast if the communicator is poisoned, aborted or cancelled. Under mu. */
int comm_cpu__check_usable(struct cpu *c)
{
    if (!c->failed && atomic_load(&c->aborted)) {
        if (atomic_load(&c->cancelled))
            comm_cpu__set_failed(c, DDPD_ECANCELED, "cancelled", 0);
        else
            comm_cpu__set_failed(c, DDPD_ECOMM, "communicator aborted", 0);
    }
    return c->failed ? -1 : 0;
}

/* Pops the head of the queue and runs it on the calling thread. Called and returns with mu
 * held; the collective itself runs unlocked. */
static void run_head(struct cpu *c)
{
    struct comm_req *q = c->head;
    c->head = q->qnext;
    if (!c->head)
        c->tail = NULL;
    q->qnext = NULL;
    c->busy = 1;
    c->run_start = base_mono_s();
    int skip = comm_cpu__check_usable(c) < 0;
    ddpd_err rc = DDPD_ECOMM;
    char text[ERR_CAP] = "";
    pthread_mutex_unlock(&c->mu);
    c->exec_by_peer = 0;
    if (!skip)
        rc = execute(c, q, text, sizeof text);
    pthread_mutex_lock(&c->mu);
    if (rc != DDPD_OK)
        comm_cpu__set_failed(c, rc, text, c->exec_by_peer);
    q->rc = rc == DDPD_OK ? DDPD_OK : c->fail_rc;
    q->done = 1;
    c->busy = 0;
    pthread_cond_broadcast(&c->done);
    if (c->head)
        pthread_cond_signal(&c->work);
}

void *comm_cpu__progress_main(void *arg)
{
    struct cpu *c = arg;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->stopping && (c->busy || !c->head))
            pthread_cond_wait(&c->work, &c->mu);
        if (c->stopping)
            break;
        run_head(c);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

void comm_cpu__enqueue(struct cpu *c, struct comm_req *q)
{
    q->qnext = NULL;
    if (c->tail)
        c->tail->qnext = q;
    else
        c->head = q;
    c->tail = q;
}

/* Blocks until q is done. When nothing runs, the caller runs the queue's head itself:
 * a collective issued while the ring is idle then costs no thread hand-off. */
ddpd_err comm_cpu__wait_done(struct cpu *c, struct comm_req *q)
{
    pthread_mutex_lock(&c->mu);
    int kicked = 0;
    while (!q->done) {
        if (!c->busy && c->head) {
            run_head(c);
            continue;
        }
        struct timespec ts = base_timespec_after(CLOCK_MONOTONIC, 1);
        pthread_cond_timedwait(&c->done, &c->mu, &ts);
        /* Safety net: run_plan bounds every socket wait by the deadline, so a collective
         * running far past it is stuck somewhere unexpected; shutting the sockets frees it. */
        if (c->busy && !kicked && base_mono_s() > c->run_start + c->timeout_s + 5.0) {
            comm_cpu__shut_sockets(c);
            kicked = 1;
        }
    }
    ddpd_err rc = q->rc;
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* Issues a blocking collective: ordered after everything queued, run inline when idle. */
ddpd_err comm_cpu__blocking(struct cpu *c, struct comm_req *q)
{
    pthread_mutex_lock(&c->mu);
    if (comm_cpu__check_usable(c) < 0) {
        ddpd_err rc = c->fail_rc;
        pthread_mutex_unlock(&c->mu);
        return rc;
    }
    /* No wake-up: if the ring is idle we run it ourselves at once, and otherwise the
     * progress thread is running (or we run what it has not taken yet). */
    comm_cpu__enqueue(c, q);
    pthread_mutex_unlock(&c->mu);
    return comm_cpu__wait_done(c, q);
}
