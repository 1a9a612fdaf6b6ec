/* comm/cpu/root.c — the rendezvous: the root that issues the id and collects the ranks'
 * registrations (`ddpd-worker --issue-id cpu`), each proven against a challenge of its own
 * (wire.h, "the handshakes"), and a rank's side of it, which registers and receives the
 * table of addresses. Knows nothing of the ring or the collectives. */
#include "cpu_impl.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/rand.h>

/* ---- the id ---- */

/* bytes 0..15 the secret, 16..35 the root's address (comm_cpu__addr_put), the rest zero. */
int comm_cpu__id_decode(const struct comm_id *id, unsigned char secret[SECRET_BYTES], struct cpu_addr *root)
{
    memcpy(secret, id->bytes, SECRET_BYTES);
    if (comm_cpu__addr_get(id->bytes + SECRET_BYTES, root) < 0)
        return -1;
    for (int i = SECRET_BYTES + ADDR_BYTES; i < COMM_ID_BYTES; i++)
        if (id->bytes[i])
            return -1;
    return 0;
}

/* ---- the rendezvous root (the issuer) ---- */

struct rconn {
    int fd;
    int rank;     /* -1 until registered */
    double until; /* an unregistered connection is dropped then (HELLO_S after its accept) */
    size_t got;
    unsigned char nonce[NONCE_BYTES]; /* the challenge it must prove the secret over */
    unsigned char buf[REG_BYTES];
};

struct root {
    unsigned char secret[SECRET_BYTES];
    struct rconn *conns;
    size_t nconn;
    int world; /* 0 until the first registration */
    int registered, formed;
    int *slot;            /* slot[rank] = fd of the registered rank, or -1 */
    unsigned char *table; /* world * ADDR_BYTES */
    int logged;           /* lines the issuer's log got about dropped connections */
};

static void root_send_msg(int fd, uint32_t type, const void *payload, size_t len)
{
    unsigned char h[MSG_HDR_BYTES];
    put32(h, type);
    put32(h + 4, (uint32_t)len);
    double deadline = base_mono_s() + ROOT_SEND_S;
    /* A rank that does not read its messages only hurts itself: it times out. */
    if (comm_cpu__send_all(fd, h, sizeof h, deadline) == IO_OK && len)
        comm_cpu__send_all(fd, payload, len, deadline);
}

/* One line in the issuer's log (the job folder's issuer.log) per connection refused or
 * dropped before it registered, up to DROP_LOG_MAX: a flood does not fill the disk. */
static void root_log(struct root *R, int fd, const char *what, const char *why)
{
    char peer[80];
    if (R->logged > DROP_LOG_MAX)
        return;
    if (R->logged++ == DROP_LOG_MAX) {
        fprintf(stderr, "ddpd-worker --issue-id cpu: more connections dropped; no more are logged\n");
        return;
    }
    comm_cpu__peer_text(fd, peer, sizeof peer);
    fprintf(stderr, "ddpd-worker --issue-id cpu: %s from %s: %s\n", what, peer, why);
}

static void root_log_drop(struct root *R, int fd, const char *why)
{
    root_log(R, fd, "dropped a connection", why);
}

static void root_drop(struct root *R, size_t i)
{
    struct rconn *cn = &R->conns[i];
    if (cn->rank >= 0 && !R->formed) {
        /* A registered rank left before the group formed (it died or gave up): its slot
         * is free again, and the others keep waiting until their own deadline. */
        R->slot[cn->rank] = -1;
        R->registered--;
    }
    close(cn->fd);
    R->conns[i] = R->conns[--R->nconn];
}

static void root_refuse(struct root *R, size_t i, const char *text)
{
    root_log(R, R->conns[i].fd, "refused a registration", text);
    root_send_msg(R->conns[i].fd, MSG_ERROR, text, strlen(text));
    root_drop(R, i);
}

/* A full registration arrived on conns[i]: check it, record it, and when the last rank is
 * in send everyone the table. Returns 1 when conns[i] was removed. */
static int root_register(struct root *R, size_t i)
{
    struct rconn *cn = &R->conns[i];
    char text[MSG_TEXT_MAX];
    struct cpu_reg reg;
    if (comm_cpu__reg_decode(cn->buf, R->secret, cn->nonce, &reg, text, sizeof text) < 0) {
        root_refuse(R, i, text);
        return 1;
    }
    uint32_t rank = reg.rank, world = reg.world;
    if (R->world == 0) {
        /* The first registration fixes the world size; the cap above bounds the tables. */
        free(R->slot);
        free(R->table);
        R->slot = malloc(world * sizeof *R->slot);
        R->table = calloc(world, ADDR_BYTES);
        if (!R->slot || !R->table) {
            root_refuse(R, i, "the rendezvous root is out of memory");
            return 1;
        }
        for (uint32_t r = 0; r < world; r++)
            R->slot[r] = -1;
        R->world = (int)world;
    }
    if (world != (uint32_t)R->world) {
        snprintf(text, sizeof text,
                 "world size mismatch: this rank says %u ranks, the ranks before it said %d", world,
                 R->world);
        root_refuse(R, i, text);
        return 1;
    }
    if (rank >= world) {
        snprintf(text, sizeof text, "rank %u is out of range for a world of %u", rank, world);
        root_refuse(R, i, text);
        return 1;
    }
    if (R->formed || R->slot[rank] >= 0) {
        snprintf(text, sizeof text, "rank %u has already registered (duplicate rank)", rank);
        root_refuse(R, i, text);
        return 1;
    }
    cn->rank = (int)rank;
    R->slot[rank] = cn->fd;
    comm_cpu__addr_put(R->table + (size_t)rank * ADDR_BYTES, &reg.addr);
    R->registered++;
    if (R->registered < R->world) {
        /* Tell every waiting rank how many are in, so a rank that times out can say so. */
        unsigned char p[8];
        put32(p, (uint32_t)R->registered);
        put32(p + 4, (uint32_t)R->world);
        for (int r = 0; r < R->world; r++)
            if (R->slot[r] >= 0)
                root_send_msg(R->slot[r], MSG_PROGRESS, p, sizeof p);
        return 0;
    }
    R->formed = 1;
    for (int r = 0; r < R->world; r++)
        root_send_msg(R->slot[r], MSG_TABLE, R->table, (size_t)R->world * ADDR_BYTES);
    /* The group has its table; the ranks close their side, and so do we. */
    while (R->nconn > 0)
        root_drop(R, R->nconn - 1);
    return 1;
}

/* A new connection: it gets its own challenge at once (a fresh socket has room for it) and
 * HELLO_S to answer it. At MAX_ROOT_CONNS the oldest unregistered connection makes room:
 * a rank answers its challenge within a round trip, so only a newer flood than that can
 * push it out, while refusing the newcomer would shut out every rank behind a flood. */
static void root_accept(struct root *R, int fd)
{
    unsigned char ch[CHALLENGE_BYTES], nonce[NONCE_BYTES];
    if (R->formed) {
        static const char t[] = "this rendezvous has already formed its group";
        root_send_msg(fd, MSG_ERROR, t, sizeof t - 1);
        close(fd);
        return;
    }
    if (R->nconn >= MAX_ROOT_CONNS) {
        size_t old = R->nconn;
        for (size_t i = 0; i < R->nconn; i++)
            if (R->conns[i].rank < 0 && (old == R->nconn || R->conns[i].until < R->conns[old].until))
                old = i;
        if (old == R->nconn) { /* all registered: cannot happen below MAX_WORLD ranks */
            close(fd);
            return;
        }
        root_log_drop(R, R->conns[old].fd, "unregistered while too many connections wait");
        root_drop(R, old);
    }
    if (comm_cpu__nonce(nonce) < 0) {
        close(fd);
        return;
    }
    comm_cpu__challenge_put(ch, nonce);
    if (send(fd, ch, sizeof ch, MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)sizeof ch) {
        close(fd);
        return;
    }
    struct rconn *cn = &R->conns[R->nconn++];
    *cn = (struct rconn){.fd = fd, .rank = -1, .until = base_mono_s() + HELLO_S};
    memcpy(cn->nonce, nonce, NONCE_BYTES);
}

/* Drops the connections that did not register in time; returns the poll timeout until the
 * next such deadline (-1: none). */
static int root_expire(struct root *R)
{
    double now = base_mono_s(), next = 0;
    for (size_t i = R->nconn; i-- > 0;) {
        struct rconn *cn = &R->conns[i];
        if (cn->rank >= 0)
            continue;
        if (cn->until <= now) {
            root_log_drop(R, cn->fd,
                          cn->got ? "registration incomplete in time" : "silent: no registration in time");
            root_drop(R, i);
        } else if (next == 0 || cn->until < next) {
            next = cn->until;
        }
    }
    return next == 0 ? -1 : comm_cpu__ms_until(next);
}

int comm_cpu_issue_id(FILE *out, int stdin_fd)
{
    int rc = 1, lfd = -1;
    struct root R = {0};
    struct pollfd *pfd = NULL;
    char err[256] = "";
    struct cpu_addr a;
    struct comm_id id = {{0}};
    char hex[2 * COMM_ID_BYTES + 1];

    if (comm_cpu__listen_addr(&a, err, sizeof err) < 0)
        goto out;
    struct sockaddr_storage ss;
    socklen_t sl = comm_cpu__addr_to_sa(&a, &ss);
    lfd = socket(a.family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&ss, sl) < 0 || listen(lfd, SOMAXCONN) < 0) {
        char at[80];
        comm_cpu__addr_text(&a, at, sizeof at);
        snprintf(err, sizeof err, "cannot listen on %s: %s", at, strerror(errno));
        goto out;
    }
    sl = sizeof ss;
    if (getsockname(lfd, (struct sockaddr *)&ss, &sl) < 0 || comm_cpu__addr_from_sa(&ss, &a) < 0) {
        snprintf(err, sizeof err, "getsockname: %s", strerror(errno));
        goto out;
    }
    if (RAND_bytes(R.secret, SECRET_BYTES) != 1) {
        snprintf(err, sizeof err, "no random bytes for the group's secret (OpenSSL RAND_bytes failed)");
        goto out;
    }
    memcpy(id.bytes, R.secret, SECRET_BYTES);
    comm_cpu__addr_put(id.bytes + SECRET_BYTES, &a);
    comm_id_to_hex(&id, hex);
    if (fprintf(out, "{\"id\":\"%s\"}\n", hex) < 0 || fflush(out) != 0) {
        snprintf(err, sizeof err, "cannot write the id: %s", strerror(errno));
        goto out;
    }

    R.conns = malloc(MAX_ROOT_CONNS * sizeof *R.conns);
    pfd = malloc((MAX_ROOT_CONNS + 2) * sizeof *pfd);
    if (!R.conns || !pfd) {
        snprintf(err, sizeof err, "out of memory");
        goto out;
    }
    for (;;) {
        int wait_ms = root_expire(&R);
        pfd[0] = (struct pollfd){stdin_fd, POLLIN, 0};
        pfd[1] = (struct pollfd){lfd, POLLIN, 0};
        size_t n = R.nconn;
        for (size_t i = 0; i < n; i++)
            pfd[2 + i] = (struct pollfd){R.conns[i].fd, POLLIN, 0};
        if (poll(pfd, n + 2, wait_ms) < 0) {
            if (errno == EINTR)
                continue;
            snprintf(err, sizeof err, "poll: %s", strerror(errno));
            goto out;
        }
        if (pfd[0].revents) {
            char junk[256];
            ssize_t k = read(stdin_fd, junk, sizeof junk);
            if (k == 0 || (k < 0 && errno != EINTR && errno != EAGAIN)) {
                rc = 0; /* the launcher closed our stdin: this attempt is over */
                goto out;
            }
        }
        /* Walk the connections backwards: root_drop moves the last one into the hole. */
        for (size_t i = n; i-- > 0;) {
            if (!pfd[2 + i].revents)
                continue;
            if (i >= R.nconn || R.conns[i].fd != pfd[2 + i].fd)
                continue; /* dropped when the group formed */
            struct rconn *cn = &R.conns[i];
            if (cn->rank >= 0) {
                /* A registered rank sends nothing more: readable means it left. */
                char junk[64];
                ssize_t k = recv(cn->fd, junk, sizeof junk, MSG_DONTWAIT);
                if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR))
                    root_drop(&R, i);
                continue;
            }
            ssize_t k = recv(cn->fd, cn->buf + cn->got, REG_BYTES - cn->got, MSG_DONTWAIT);
            if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR)) {
                root_log_drop(&R, cn->fd, "closed before it registered");
                root_drop(&R, i);
                continue;
            }
            if (k > 0) {
                cn->got += (size_t)k;
                if (cn->got == REG_BYTES)
                    root_register(&R, i);
            }
        }
        if (pfd[1].revents) {
            int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
            if (fd >= 0)
                root_accept(&R, fd);
        }
    }
out:
    if (rc != 0)
        fprintf(stderr, "ddpd-worker --issue-id cpu: %s\n", err);
    while (R.nconn > 0)
        root_drop(&R, R.nconn - 1);
    free(pfd);
    free(R.conns);
    free(R.slot);
    free(R.table);
    if (lfd >= 0)
        close(lfd);
    return rc;
}

int comm_cpu__msg_head(const unsigned char h[MSG_HDR_BYTES], int world, uint32_t *type, uint32_t *len)
{
    *type = get32(h);
    *len = get32(h + 4);
    uint32_t expect = *type == MSG_PROGRESS ? 8u
                      : *type == MSG_TABLE  ? (uint32_t)world * ADDR_BYTES
                      : *type == MSG_ERROR  ? *len
                                            : 0;
    /* Lengths are the root's claims: anything not exactly what this type holds (or an
     * error text longer than the cap) is refused before any allocation. A type we do not
     * know is refused too: with length 0 it used to pass and be read as a table of
     * world * ADDR_BYTES bytes from a 1-byte buffer (found by fuzz/fuzz_comm.c). */
    if (*type != MSG_PROGRESS && *type != MSG_TABLE && *type != MSG_ERROR)
        return -1;
    if (*len != expect || *len > MAX_WORLD * ADDR_BYTES || (*type == MSG_ERROR && *len > MSG_TEXT_MAX))
        return -1;
    return 0;
}

int comm_cpu__msg_body(uint32_t type, unsigned char *payload, uint32_t len, int world, struct cpu_addr *table,
                       int *registered)
{
    if (type == MSG_PROGRESS) {
        *registered = (int)get32(payload);
        return 0;
    }
    if (type == MSG_ERROR) {
        payload[len] = '\0';
        for (uint32_t i = 0; i < len; i++)
            if (payload[i] < 32 || payload[i] > 126)
                payload[i] = '?';
        return 0;
    }
    if (type != MSG_TABLE || len != (uint32_t)world * ADDR_BYTES)
        return -1;
    for (int r = 0; r < world; r++)
        if (comm_cpu__addr_get(payload + (size_t)r * ADDR_BYTES, &table[r]) < 0)
            return -1;
    return 0;
}

/* Registers with the root over `fd` (connected) and receives the table: table[world] of
 * the ranks' listening addresses. */
int comm_cpu__rendezvous(struct cpu *c, int fd, const struct cpu_addr *root, const struct cpu_addr *me,
                         double deadline, struct cpu_addr *table, char *err, size_t cap)
{
    int rc = -1, registered = 0;
    char at[80];
    unsigned char ch[CHALLENGE_BYTES], nonce[NONCE_BYTES], reg[REG_BYTES], h[MSG_HDR_BYTES];
    unsigned char *payload = NULL;
    comm_cpu__addr_text(root, at, sizeof at);

    /* The root's challenge first: the registration proves the secret over its nonce. */
    int io = comm_cpu__recv_all(fd, ch, sizeof ch, deadline);
    if (io == IO_TIMEOUT) {
        comm_cpu__fmt_err(err, cap,
                          "rendezvous with root %s timed out after %.1f s (the root did not "
                          "acknowledge rank %d)",
                          at, c->timeout_s, c->rank);
        goto out;
    }
    if (io != IO_OK) {
        comm_cpu__fmt_err(err, cap, "rendezvous: root %s: %s", at, comm_cpu__io_text(io));
        goto out;
    }
    if (comm_cpu__challenge_decode(ch, nonce) < 0) {
        comm_cpu__fmt_err(err, cap,
                          "rendezvous: root %s does not speak this protocol (another ddpd version?)", at);
        goto out;
    }
    comm_cpu__reg_put(reg, c->secret, nonce, c->rank, c->world, me);
    io = comm_cpu__send_all(fd, reg, sizeof reg, deadline);
    if (io != IO_OK) {
        comm_cpu__fmt_err(err, cap, "rendezvous: registering with root %s: %s", at, comm_cpu__io_text(io));
        goto out;
    }
    for (;;) {
        io = comm_cpu__recv_all(fd, h, sizeof h, deadline);
        if (io == IO_TIMEOUT && registered) {
            comm_cpu__fmt_err(err, cap,
                              "rendezvous with root %s timed out after %.1f s (%d of %d ranks "
                              "registered)",
                              at, c->timeout_s, registered, c->world);
            goto out;
        }
        if (io == IO_TIMEOUT) {
            comm_cpu__fmt_err(err, cap,
                              "rendezvous with root %s timed out after %.1f s (the root did not "
                              "acknowledge rank %d)",
                              at, c->timeout_s, c->rank);
            goto out;
        }
        if (io != IO_OK) {
            comm_cpu__fmt_err(err, cap, "rendezvous: root %s: %s", at, comm_cpu__io_text(io));
            goto out;
        }
        uint32_t type, len;
        if (comm_cpu__msg_head(h, c->world, &type, &len) < 0) {
            comm_cpu__fmt_err(err, cap, "rendezvous: malformed message from root %s", at);
            goto out;
        }
        free(payload);
        payload = malloc(len + 1);
        if (!payload) {
            comm_cpu__fmt_err(err, cap, "rendezvous: out of memory");
            goto out;
        }
        io = comm_cpu__recv_all(fd, payload, len, deadline);
        if (io != IO_OK) {
            comm_cpu__fmt_err(err, cap, "rendezvous: root %s: %s", at, comm_cpu__io_text(io));
            goto out;
        }
        if (comm_cpu__msg_body(type, payload, len, c->world, table, &registered) < 0) {
            comm_cpu__fmt_err(err, cap, "rendezvous: malformed table from root %s", at);
            goto out;
        }
        if (type == MSG_PROGRESS)
            continue;
        if (type == MSG_ERROR) {
            comm_cpu__fmt_err(err, cap, "rendezvous: root %s refused rank %d: %s", at, c->rank,
                              (char *)payload);
            goto out;
        }
        rc = 0;
        break;
    }
out:
    free(payload);
    return rc;
}
