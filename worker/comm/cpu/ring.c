/* comm/cpu/ring.c — forming the ring: a rank connects to its next and accepts its prev, and
 * on both links each side proves that it holds the id's secret (wire.h, "the handshakes").
 * The ring port is open to anyone who can reach it, so a rank keeps accepting until its
 * true prev has proven itself or the deadline passes; whatever else connects is dropped and
 * logged, never fatal, and the unproven connections it holds are bounded in number
 * (PEND_MAX) and in time (HELLO_S). One poll loop serves both links: every rank is both a
 * connector and a listener, and ranks that finished one before starting the other would
 * wait on each other around the ring. Knows nothing of the collectives. */
#include "cpu_impl.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define RETRY_S      0.01 /* between tries to connect to next while nothing listens there */
#define REDO_S       0.05 /* before connecting again when next hung up on an unproven try */
#define ACCEPT_BURST 32   /* connections taken from the queue per turn of the loop */

/* An accepted connection that has not proven itself to be prev yet. */
struct pend {
    int fd;
    double since, until; /* accepted; dropped at `until` (HELLO_S later, at most the deadline) */
    int named;           /* its hello names our prev: evicted after the connections that do not */
    size_t got;
    unsigned char in[HELLO_BYTES + PROOF_BYTES]; /* its hello, then its proof */
    unsigned char nonce[NONCE_BYTES];            /* ours, which it must prove the secret over */
};

enum { OUT_IDLE, OUT_CONNECTING, OUT_HELLO, OUT_DONE };

/* Our connection to next, made again while next has not proven itself on it. */
struct out {
    int fd, state;
    double at; /* OUT_IDLE: when to connect */
    size_t got;
    unsigned char in[HELLO_BYTES + PROOF_BYTES]; /* next's hello, then its proof */
    unsigned char nonce[NONCE_BYTES];
    int refused; /* the last try found nothing listening */
    char why[160];
};

struct ring {
    struct cpu *c;
    int lfd;
    double deadline;
    char next_at[80];
    const struct cpu_addr *next_addr;
    struct pend pend[PEND_MAX];
    int npend;
    double accept_pause; /* out of files with nothing to drop: the listener rests until then */
    struct out out;
    int dropped;
    char *err;
    size_t cap;
};

/* ---- strangers ---- */

/* One line in the rank's log (its stderr) per dropped connection, up to DROP_LOG_MAX. */
static void log_drop(struct ring *R, int fd, const char *why)
{
    char peer[80];
    if (R->dropped++ > DROP_LOG_MAX)
        return;
    if (R->dropped > DROP_LOG_MAX) {
        fprintf(stderr, "[rank %d] comm: ring: more connections dropped; no more are logged\n", R->c->rank);
        return;
    }
    comm_cpu__peer_text(fd, peer, sizeof peer);
    fprintf(stderr, "[rank %d] comm: ring: dropped a connection from %s: %s\n", R->c->rank, peer, why);
}

static void pend_drop(struct ring *R, int i, const char *why)
{
    log_drop(R, R->pend[i].fd, why);
    close(R->pend[i].fd);
    R->pend[i] = R->pend[--R->npend];
}

/* Room for one more: the oldest connection whose hello did not name our prev goes first,
 * so that silence and garbage never push out the true prev, whose hello comes with its
 * connection; only forged hellos compete with it, and then the oldest goes. */
static void pend_evict(struct ring *R, const char *why)
{
    int v = 0;
    for (int i = 1; i < R->npend; i++) {
        const struct pend *p = &R->pend[i], *q = &R->pend[v];
        if (p->named < q->named || (p->named == q->named && p->since < q->since))
            v = i;
    }
    pend_drop(R, v, why);
}

/* ---- the listener: prev ---- */

/* prev proved itself on pend[i]: our own proof answers it, and every other waiting
 * connection goes. Returns 1 (done), or -1 when prev is lost in the answer. */
static int prev_proven(struct ring *R, int i, const struct cpu_hello *h)
{
    struct cpu *c = R->c;
    struct pend p = R->pend[i];
    unsigned char proof[PROOF_BYTES];
    R->pend[i] = R->pend[--R->npend];
    while (R->npend > 0)
        pend_drop(R, R->npend - 1, "unproven when the ring formed");
    comm_cpu__ring_proof(c->secret, RING_LISTENER, c->prev, c->rank, c->world, h->nonce, p.nonce, proof);
    int io = comm_cpu__send_all(p.fd, proof, sizeof proof, R->deadline);
    if (io != IO_OK) {
        close(p.fd);
        return comm_cpu__fmt_err(R->err, R->cap, "ring: answering rank %d: %s", c->prev,
                                 comm_cpu__io_text(io));
    }
    c->fd_prev = p.fd;
    return 1;
}

/* Reads what pend[i] sent: its hello, then its proof. Returns 1 when it proved to be prev,
 * 0 when it waits or was dropped, -1 on a failure of ours. */
static int pend_read(struct ring *R, int i)
{
    struct cpu *c = R->c;
    struct pend *p = &R->pend[i];
    struct cpu_hello h;
    char why[160];
    for (;;) {
        size_t need = p->got < HELLO_BYTES ? HELLO_BYTES : sizeof p->in;
        ssize_t k = recv(p->fd, p->in + p->got, need - p->got, MSG_DONTWAIT);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;
        if (k <= 0) {
            pend_drop(R, i, p->got ? "it hung up in the middle of its hello" : "it hung up without a word");
            return 0;
        }
        p->got += (size_t)k;
        if (p->got < need)
            continue;
        if (comm_cpu__hello_decode(p->in, c->prev, c->world, &h, why, sizeof why) < 0) {
            pend_drop(R, i, why);
            return 0;
        }
        p->named = 1;
        if (p->got < sizeof p->in)
            continue;
        if (!comm_cpu__ring_proof_check(c->secret, RING_CONNECTOR, c->prev, c->rank, c->world, h.nonce,
                                        p->nonce, p->in + HELLO_BYTES)) {
            pend_drop(R, i,
                      "wrong proof: it does not hold this group's id (a stranger, or a replayed hello)");
            return 0;
        }
        return prev_proven(R, i, &h);
    }
}

/* Takes what the listener's queue holds (a burst at most), each with our hello and nonce.
 * Returns 1 when one of them proved to be prev at once, else 0 (or -1, a failure of ours). */
static int accept_some(struct ring *R)
{
    struct cpu *c = R->c;
    char full[96];
    snprintf(full, sizeof full, "unproven while more than %d connections waited", PEND_MAX);
    for (int n = 0; n < ACCEPT_BURST; n++) {
        int fd = accept4(R->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0 && errno == EINTR)
            continue;
        if (fd < 0 && (errno == EMFILE || errno == ENFILE)) {
            /* Out of files: what we hold unproven goes first; with nothing to drop, the
             * queue waits a moment rather than wake the loop at once again. */
            if (R->npend > 0) {
                pend_evict(R, "dropped for want of file descriptors");
                continue;
            }
            R->accept_pause = base_mono_s() + RETRY_S;
            return 0;
        }
        if (fd < 0)
            return 0; /* EAGAIN: the queue is empty; anything else: next turn */
        if (R->npend == PEND_MAX)
            pend_evict(R, full);
        struct pend *p = &R->pend[R->npend];
        *p = (struct pend){.fd = fd, .since = base_mono_s()};
        p->until = p->since + HELLO_S < R->deadline ? p->since + HELLO_S : R->deadline;
        unsigned char hello[HELLO_BYTES];
        if (comm_cpu__nonce(p->nonce) < 0) {
            close(fd);
            return comm_cpu__fmt_err(R->err, R->cap,
                                     "ring: no random bytes for a nonce (OpenSSL RAND_bytes failed)");
        }
        comm_cpu__hello_put(hello, c->rank, c->world, p->nonce);
        R->npend++;
        /* A fresh socket has room for 48 bytes; one that has not is no rank of ours. */
        if (send(fd, hello, sizeof hello, MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)sizeof hello) {
            pend_drop(R, R->npend - 1, "it did not take our hello");
            continue;
        }
        comm_cpu__sock_tune(fd);
        /* prev sends its hello as soon as it is connected: read it now, so that it counts
         * as named before the next eviction. */
        int r = pend_read(R, R->npend - 1);
        if (r != 0)
            return r;
    }
    return 0;
}

/* ---- the connector: next ---- */

static void out_close(struct out *o, double redo_at)
{
    if (o->fd >= 0)
        close(o->fd);
    o->fd = -1;
    o->state = OUT_IDLE;
    o->at = redo_at;
}

/* Connected: our hello, with a fresh nonce that next must prove the secret over. */
static int out_greet(struct ring *R)
{
    struct out *o = &R->out;
    unsigned char hello[HELLO_BYTES];
    if (comm_cpu__nonce(o->nonce) < 0)
        return comm_cpu__fmt_err(R->err, R->cap,
                                 "ring: no random bytes for a nonce (OpenSSL RAND_bytes failed)");
    comm_cpu__hello_put(hello, R->c->rank, R->c->world, o->nonce);
    if (send(o->fd, hello, sizeof hello, MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)sizeof hello) {
        snprintf(o->why, sizeof o->why, "greeting it: %s", strerror(errno));
        out_close(o, base_mono_s() + REDO_S);
        return 0;
    }
    o->state = OUT_HELLO;
    o->got = 0;
    o->refused = 0; /* something listens there after all */
    return 0;
}

/* The end of one try to connect: `e` is its errno (0: connected). Nothing listening yet
 * (or a reset) is tried again; any other error is final, as connect_retry has it. */
static int out_connected(struct ring *R, int e)
{
    struct out *o = &R->out;
    if (e == 0)
        return out_greet(R);
    out_close(o, base_mono_s() + RETRY_S);
    o->refused = e == ECONNREFUSED;
    snprintf(o->why, sizeof o->why, "%s", strerror(e));
    if (e != ECONNREFUSED && e != EINTR && e != EAGAIN && e != ECONNRESET && e != ETIMEDOUT)
        return comm_cpu__fmt_err(R->err, R->cap, "ring: cannot connect to rank %d at %s: %s", R->c->next,
                                 R->next_at, strerror(e));
    return 0;
}

static int out_start(struct ring *R)
{
    struct out *o = &R->out;
    struct sockaddr_storage ss;
    socklen_t sl = comm_cpu__addr_to_sa(R->next_addr, &ss);
    o->fd = socket(R->next_addr->family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (o->fd < 0)
        return comm_cpu__fmt_err(R->err, R->cap, "ring: cannot connect to rank %d at %s: %s", R->c->next,
                                 R->next_at, strerror(errno));
    comm_cpu__sock_tune(o->fd);
    if (connect(o->fd, (struct sockaddr *)&ss, sl) == 0)
        return out_connected(R, 0);
    if (errno == EINPROGRESS) {
        o->state = OUT_CONNECTING;
        return 0;
    }
    return out_connected(R, errno);
}

/* Reads next's hello (and answers it with our proof), then next's proof. Returns 1 when
 * next proved itself, 0 while it has not, -1 on failure: a peer at next's address that
 * speaks otherwise or cannot prove itself is not ours, and no other will come there. */
static int out_read(struct ring *R)
{
    struct cpu *c = R->c;
    struct out *o = &R->out;
    struct cpu_hello h;
    char why[160];
    for (;;) {
        size_t need = o->got < HELLO_BYTES ? HELLO_BYTES : sizeof o->in;
        ssize_t k = recv(o->fd, o->in + o->got, need - o->got, MSG_DONTWAIT);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;
        if (k <= 0) {
            /* Next may have dropped us as one of too many unproven connections, or after
             * HELLO_S on a loaded machine: connect again, with a fresh nonce. */
            snprintf(o->why, sizeof o->why, "it hung up before proving itself");
            out_close(o, base_mono_s() + REDO_S);
            return 0;
        }
        o->got += (size_t)k;
        if (o->got < need)
            continue;
        if (comm_cpu__hello_decode(o->in, c->next, c->world, &h, why, sizeof why) < 0)
            return comm_cpu__fmt_err(R->err, R->cap, "ring: rank %d at %s answered with a wrong hello: %s",
                                     c->next, R->next_at, why);
        if (o->got == HELLO_BYTES) {
            unsigned char proof[PROOF_BYTES];
            comm_cpu__ring_proof(c->secret, RING_CONNECTOR, c->rank, c->next, c->world, o->nonce, h.nonce,
                                 proof);
            if (send(o->fd, proof, sizeof proof, MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)sizeof proof) {
                snprintf(o->why, sizeof o->why, "sending our proof: %s", strerror(errno));
                out_close(o, base_mono_s() + REDO_S);
                return 0;
            }
            continue;
        }
        if (!comm_cpu__ring_proof_check(c->secret, RING_LISTENER, c->rank, c->next, c->world, o->nonce,
                                        h.nonce, o->in + HELLO_BYTES))
            return comm_cpu__fmt_err(
                R->err, R->cap,
                "ring: rank %d at %s could not prove that it holds this group's id (does "
                "something else listen at that address?)",
                c->next, R->next_at);
        c->fd_next = o->fd;
        o->fd = -1;
        o->state = OUT_DONE;
        return 1;
    }
}

/* ---- the loop ---- */

/* The deadline passed: say which link is missing, naming the rank. */
static int ring_timeout(struct ring *R)
{
    struct cpu *c = R->c;
    const struct out *o = &R->out;
    char dropped[96] = "";
    if (R->dropped)
        snprintf(dropped, sizeof dropped, " (%d other connection%s dropped: see this rank's log)", R->dropped,
                 R->dropped == 1 ? " was" : "s were");
    if (o->state == OUT_HELLO)
        return comm_cpu__fmt_err(R->err, R->cap, "ring: rank %d at %s did not answer the hello within %.1f s",
                                 c->next, R->next_at, c->timeout_s);
    if (o->state != OUT_DONE)
        return comm_cpu__fmt_err(R->err, R->cap,
                                 "ring: cannot connect to rank %d at %s: timed out after %.1f s (%s)",
                                 c->next, R->next_at, c->timeout_s,
                                 o->refused  ? "nothing listens there"
                                 : o->why[0] ? o->why
                                             : "no answer");
    return comm_cpu__fmt_err(R->err, R->cap, "ring: rank %d did not connect within %.1f s%s", c->prev,
                             c->timeout_s, dropped);
}

/* One turn: wait for whatever can move (the listener, the waiting connections, the link
 * to next) until the nearest deadline, and move it. 1 when both links are proven. */
static int ring_turn(struct ring *R)
{
    struct cpu *c = R->c;
    struct out *o = &R->out;
    struct pollfd pfd[PEND_MAX + 2];
    int np = 0, li = -1, oi = -1;
    double now = base_mono_s(), wake = R->deadline;

    for (int i = R->npend; i-- > 0;)
        if (R->pend[i].until <= now)
            pend_drop(R, i, R->pend[i].got ? "its hello did not finish in time" : "silent");
    if (c->fd_prev < 0) {
        if (R->accept_pause <= now) {
            li = np;
            pfd[np++] = (struct pollfd){R->lfd, POLLIN, 0};
        } else if (R->accept_pause < wake) {
            wake = R->accept_pause;
        }
    }
    for (int i = 0; i < R->npend; i++) {
        pfd[np++] = (struct pollfd){R->pend[i].fd, POLLIN, 0};
        if (R->pend[i].until < wake)
            wake = R->pend[i].until;
    }
    if (o->state == OUT_IDLE && o->at <= now && out_start(R) < 0)
        return -1;
    if (o->state == OUT_IDLE && o->at < wake)
        wake = o->at;
    if (o->state == OUT_CONNECTING || o->state == OUT_HELLO) {
        oi = np;
        pfd[np++] = (struct pollfd){o->fd, o->state == OUT_CONNECTING ? POLLOUT : POLLIN, 0};
    }
    if (c->fd_prev >= 0 && o->state == OUT_DONE)
        return 1;
    if (now >= R->deadline)
        return ring_timeout(R);

    int n = poll(pfd, (nfds_t)np, comm_cpu__ms_until(wake));
    if (n < 0 && errno != EINTR)
        return comm_cpu__fmt_err(R->err, R->cap, "ring: poll: %s", strerror(errno));
    if (n <= 0)
        return 0;
    if (oi >= 0 && pfd[oi].revents) {
        int r = 0;
        if (o->state == OUT_CONNECTING) {
            int e = 0;
            socklen_t el = sizeof e;
            if (getsockopt(o->fd, SOL_SOCKET, SO_ERROR, &e, &el) < 0)
                e = errno;
            r = out_connected(R, e);
        } else {
            r = out_read(R);
        }
        if (r < 0)
            return -1;
    }
    /* The waiting connections by their fds (pend_read may reorder the array). */
    for (int k = li + 1; k < np; k++) {
        if (k == oi || !pfd[k].revents)
            continue;
        for (int i = 0; i < R->npend; i++)
            if (R->pend[i].fd == pfd[k].fd) {
                if (pend_read(R, i) < 0)
                    return -1;
                break;
            }
        if (c->fd_prev >= 0)
            break;
    }
    if (li >= 0 && pfd[li].revents && c->fd_prev < 0 && accept_some(R) < 0)
        return -1;
    return 0;
}

/* Connects to next, accepts prev among whatever else connects, proves both links, then
 * moves them onto shared memory where both ends share the host. */
int comm_cpu__form_ring(struct cpu *c, int lfd, const struct cpu_addr *table, double deadline, char *err,
                        size_t cap)
{
    struct ring R = {
        .c = c, .lfd = lfd, .deadline = deadline, .next_addr = &table[c->next], .err = err, .cap = cap};
    R.out.fd = -1;
    R.out.state = OUT_IDLE;
    comm_cpu__addr_text(&table[c->next], R.next_at, sizeof R.next_at);
    int r;
    while ((r = ring_turn(&R)) == 0)
        ;
    for (int i = R.npend; i-- > 0;)
        close(R.pend[i].fd);
    if (R.out.fd >= 0)
        close(R.out.fd);
    if (r < 0)
        return -1;
    if (R.dropped > DROP_LOG_MAX)
        fprintf(stderr, "[rank %d] comm: ring: formed; %d connections were dropped in all\n", c->rank,
                R.dropped);
    return comm_cpu__shm_setup(c, deadline, err, cap);
}
