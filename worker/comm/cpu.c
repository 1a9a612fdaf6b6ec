/* comm/cpu.c — the CPU collective backend: a ring of ranks with its own rendezvous root
 * (the id issuer, `ddpd-worker --issue-id cpu`). Links are TCP, or a shared-memory FIFO
 * where both ends share the host (DDPD_COMM_SHM=0 keeps TCP). All-reduce is a ring
 * reduce-scatter + all-gather: each sum is made once, by one rank, and copied, so every
 * rank gets the same bits. Every wait has a deadline; knows nothing of tensors or DDP. */
#include "../comm.h"
#include "cpu_wire.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define NOTICE_TAG 0x4444504e      /* "DDPN": a failure notice */
#define CANCEL_TAG 0x44445051      /* "DDPQ": the same, for a rank that was cancelled */
#define SMALL_BYTES (16 * 1024)    /* all-reduces up to this take the latency path */
#define STAGE_BYTES (256 * 1024)   /* receive staging of a reduction */
#define SEND_SLICE (256 * 1024)    /* most bytes handed to one sendmsg */
#define SOCK_BUF (4 * 1024 * 1024) /* SO_SNDBUF / SO_RCVBUF */
#define ERR_CAP 512
#define ROOT_SEND_S 2.0        /* the root's bound on writing to one rank */
#define SHM_HDR 4096           /* shared FIFO: control page, then the ring of bytes */
#define SHM_CAP (2u << 20)     /* bytes of a shared FIFO (a power of two) */
#define SHM_PIECE (128 * 1024) /* most bytes moved before publishing the position */
#define SPIN_S 50e-6           /* a shared-memory wait spins this long before sleeping */
#define MAX_ROOT_CONNS 4096    /* connections the root holds at once */
#define PROTO_VERSION 1

enum { OP_ALLREDUCE = 1, OP_BROADCAST, OP_ALLGATHER, OP_MAX_I64, OP_BARRIER, OP_COUNT };
static const char *const op_names[OP_COUNT] = {"?",         "allreduce",     "broadcast",
                                               "allgather", "allreduce_max", "barrier"};

/* Results of the blocking socket helpers. */
enum { IO_OK = 0, IO_TIMEOUT = -1, IO_CLOSED = -2, IO_ERROR = -3 };

/* ---- small helpers ---- */

static double mono(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void sleep_s(double s)
{
    struct timespec t = {(time_t)s, (long)((s - floor(s)) * 1e9)};
    nanosleep(&t, NULL);
}

/* Milliseconds until `deadline` for poll, rounded up so a wait never ends early. */
static int ms_until(double deadline)
{
    double left = deadline - mono();
    if (left <= 0)
        return 0;
    if (left > 3600)
        return 3600 * 1000;
    return (int)ceil(left * 1000.0);
}

static void put16(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 8);
    p[1] = (unsigned char)v;
}

static void put32(unsigned char *p, uint32_t v)
{
    put16(p, v >> 16);
    put16(p + 2, v);
}

static void put64(unsigned char *p, uint64_t v)
{
    put32(p, (uint32_t)(v >> 32));
    put32(p + 4, (uint32_t)v);
}

static uint32_t get16(const unsigned char *p)
{
    return (uint32_t)p[0] << 8 | p[1];
}
static uint32_t get32(const unsigned char *p)
{
    return get16(p) << 16 | get16(p + 2);
}
static uint64_t get64(const unsigned char *p)
{
    return (uint64_t)get32(p) << 32 | get32(p + 4);
}

/* ---- addresses ---- */

static socklen_t addr_to_sa(const struct cpu_addr *a, struct sockaddr_storage *ss)
{
    memset(ss, 0, sizeof *ss);
    if (a->family == AF_INET) {
        struct sockaddr_in *s4 = (struct sockaddr_in *)ss;
        s4->sin_family = AF_INET;
        s4->sin_port = htons(a->port);
        memcpy(&s4->sin_addr, a->ip, 4);
        return sizeof *s4;
    }
    struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)ss;
    s6->sin6_family = AF_INET6;
    s6->sin6_port = htons(a->port);
    memcpy(&s6->sin6_addr, a->ip, 16);
    return sizeof *s6;
}

static int addr_from_sa(const struct sockaddr_storage *ss, struct cpu_addr *a)
{
    memset(a, 0, sizeof *a);
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *s4 = (const struct sockaddr_in *)ss;
        a->family = AF_INET;
        a->port = ntohs(s4->sin_port);
        memcpy(a->ip, &s4->sin_addr, 4);
        return 0;
    }
    if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)ss;
        a->family = AF_INET6;
        a->port = ntohs(s6->sin6_port);
        memcpy(a->ip, &s6->sin6_addr, 16);
        return 0;
    }
    return -1;
}

/* "127.0.0.1:43211" or "[::1]:43211". */
static void addr_text(const struct cpu_addr *a, char *buf, size_t cap)
{
    char ip[INET6_ADDRSTRLEN] = "?";
    inet_ntop(a->family, a->ip, ip, sizeof ip);
    if (a->family == AF_INET6)
        snprintf(buf, cap, "[%s]:%u", ip, (unsigned)a->port);
    else
        snprintf(buf, cap, "%s:%u", ip, (unsigned)a->port);
}

/* On the wire (in the id, the registration and the table): family as 4 or 6, port, then
 * 16 address bytes (an IPv4 address uses the first 4). */
static void addr_put(unsigned char *p, const struct cpu_addr *a)
{
    memset(p, 0, ADDR_BYTES);
    put16(p, a->family == AF_INET6 ? 6 : 4);
    put16(p + 2, a->port);
    memcpy(p + 4, a->ip, a->family == AF_INET6 ? 16 : 4);
}

static int addr_get(const unsigned char *p, struct cpu_addr *a)
{
    memset(a, 0, sizeof *a);
    uint32_t fam = get16(p);
    if (fam != 4 && fam != 6)
        return -1;
    a->family = fam == 6 ? AF_INET6 : AF_INET;
    a->port = (uint16_t)get16(p + 2);
    memcpy(a->ip, p + 4, fam == 6 ? 16 : 4);
    return a->port ? 0 : -1;
}

/* The address the issuer listens on: DDPD_COMM_ADDR (a numeric address or a host name)
 * or 127.0.0.1, port 0 so the kernel picks a free one. */
static int listen_addr(struct cpu_addr *a, char *err, size_t cap)
{
    const char *host = getenv("DDPD_COMM_ADDR");
    if (!host || !*host)
        host = "127.0.0.1";
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_socktype = SOCK_STREAM;
    int rc = getaddrinfo(host, NULL, &hints, &res);
    if (rc != 0) {
        snprintf(err, cap, "DDPD_COMM_ADDR '%s': %s", host, gai_strerror(rc));
        return -1;
    }
    int found = -1;
    for (struct addrinfo *ai = res; ai && found < 0; ai = ai->ai_next) {
        struct sockaddr_storage ss = {0};
        if (ai->ai_addrlen > sizeof ss)
            continue;
        memcpy(&ss, ai->ai_addr, ai->ai_addrlen);
        found = addr_from_sa(&ss, a);
    }
    freeaddrinfo(res);
    if (found < 0) {
        snprintf(err, cap, "DDPD_COMM_ADDR '%s' has no IPv4 or IPv6 address", host);
        return -1;
    }
    a->port = 0;
    return 0;
}

/* ---- sockets ---- */

/* Latency (no Nagle) and room for a whole pipeline of sub-chunks in flight. Set before
 * connect/listen so the window scale is negotiated for the large buffers; failures only
 * cost speed. */
static void sock_tune(int fd)
{
    int one = 1, buf = SOCK_BUF;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
}

/* 1 when `fd` is ready for `events`, 0 at the deadline, -1 on a poll error. */
static int wait_fd(int fd, short events, double deadline)
{
    for (;;) {
        struct pollfd p = {fd, events, 0};
        int r = poll(&p, 1, ms_until(deadline));
        if (r > 0)
            return 1;
        if (r == 0) {
            if (mono() >= deadline)
                return 0;
            continue;
        }
        if (errno != EINTR)
            return -1;
    }
}

/* Writes all of buf on a non-blocking socket before the deadline. */
static int send_all(int fd, const void *buf, size_t len, double deadline)
{
    const unsigned char *p = buf;
    while (len > 0) {
        ssize_t k = send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k > 0) {
            p += k;
            len -= (size_t)k;
            continue;
        }
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int w = wait_fd(fd, POLLOUT, deadline);
            if (w == 0)
                return IO_TIMEOUT;
            if (w < 0)
                return IO_ERROR;
            continue;
        }
        return errno == EPIPE || errno == ECONNRESET ? IO_CLOSED : IO_ERROR;
    }
    return IO_OK;
}

/* Reads exactly len bytes from a non-blocking socket before the deadline. */
static int recv_all(int fd, void *buf, size_t len, double deadline)
{
    unsigned char *p = buf;
    while (len > 0) {
        ssize_t k = recv(fd, p, len, MSG_DONTWAIT);
        if (k > 0) {
            p += k;
            len -= (size_t)k;
            continue;
        }
        if (k == 0)
            return IO_CLOSED;
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            int w = wait_fd(fd, POLLIN, deadline);
            if (w == 0)
                return IO_TIMEOUT;
            if (w < 0)
                return IO_ERROR;
            continue;
        }
        return errno == ECONNRESET ? IO_CLOSED : IO_ERROR;
    }
    return IO_OK;
}

/* Connects to `a` before the deadline, retrying while nobody listens there yet (the root
 * or a neighbour may still be starting). Returns a non-blocking fd, or -1 with errno
 * (ETIMEDOUT at the deadline; *refused says whether the last try was refused). */
static int connect_retry(const struct cpu_addr *a, double deadline, int *refused)
{
    struct sockaddr_storage ss;
    socklen_t sl = addr_to_sa(a, &ss);
    *refused = 0;
    for (;;) {
        int fd = socket(a->family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0)
            return -1;
        sock_tune(fd);
        int r = connect(fd, (struct sockaddr *)&ss, sl);
        if (r < 0 && errno == EINPROGRESS) {
            int w = wait_fd(fd, POLLOUT, deadline);
            if (w == 0) {
                close(fd);
                errno = ETIMEDOUT;
                return -1;
            }
            int soerr = 0;
            socklen_t el = sizeof soerr;
            if (w < 0)
                soerr = errno;
            else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &el) < 0)
                soerr = errno;
            r = soerr ? -1 : 0;
            errno = soerr;
        }
        if (r == 0)
            return fd;
        int e = errno;
        close(fd);
        if (e != ECONNREFUSED && e != EINTR && e != EAGAIN && e != ECONNRESET) {
            errno = e;
            return -1;
        }
        *refused = e == ECONNREFUSED;
        if (mono() + 0.01 >= deadline) {
            errno = ETIMEDOUT;
            return -1;
        }
        sleep_s(0.01);
    }
}

/* ---- the id ---- */

/* bytes 0..15 magic, 16..35 the root's address (addr_put), the rest zero. */
int comm_cpu__id_decode(const struct comm_id *id, unsigned char magic[MAGIC_BYTES], struct cpu_addr *root)
{
    memcpy(magic, id->bytes, MAGIC_BYTES);
    if (addr_get(id->bytes + MAGIC_BYTES, root) < 0)
        return -1;
    for (int i = MAGIC_BYTES + ADDR_BYTES; i < COMM_ID_BYTES; i++)
        if (id->bytes[i])
            return -1;
    return 0;
}

/* ---- the rendezvous root (the issuer) ---- */

struct rconn {
    int fd;
    int rank; /* -1 until registered */
    size_t got;
    unsigned char buf[REG_BYTES];
};

struct root {
    unsigned char magic[MAGIC_BYTES];
    struct rconn *conns;
    size_t nconn;
    int world; /* 0 until the first registration */
    int registered, formed;
    int *slot;            /* slot[rank] = fd of the registered rank, or -1 */
    unsigned char *table; /* world * ADDR_BYTES */
};

static void root_send_msg(int fd, uint32_t type, const void *payload, size_t len)
{
    unsigned char h[MSG_HDR_BYTES];
    put32(h, type);
    put32(h + 4, (uint32_t)len);
    double deadline = mono() + ROOT_SEND_S;
    /* A rank that does not read its messages only hurts itself: it times out. */
    if (send_all(fd, h, sizeof h, deadline) == IO_OK && len)
        send_all(fd, payload, len, deadline);
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
    root_send_msg(R->conns[i].fd, MSG_ERROR, text, strlen(text));
    root_drop(R, i);
}

int comm_cpu__reg_decode(const unsigned char reg[REG_BYTES], const unsigned char magic[MAGIC_BYTES],
                         struct cpu_reg *out, char *text, size_t cap)
{
    if (memcmp(reg, magic, MAGIC_BYTES) != 0) {
        snprintf(text, cap,
                 "wrong magic: the id this rank was given does not belong to this "
                 "rendezvous (a stale id from an earlier attempt?)");
        return -1;
    }
    uint32_t version = get32(reg + 16);
    out->rank = get32(reg + 20);
    out->world = get32(reg + 24);
    if (version != PROTO_VERSION || addr_get(reg + 28, &out->addr) < 0) {
        snprintf(text, cap, "malformed registration (another ddpd version?)");
        return -1;
    }
    if (out->world < 1 || out->world > MAX_WORLD) {
        snprintf(text, cap, "world size %u is out of range (1..%d)", out->world, MAX_WORLD);
        return -1;
    }
    return 0;
}

/* A full registration arrived on conns[i]: check it, record it, and when the last rank is
 * in send everyone the table. Returns 1 when conns[i] was removed. */
static int root_register(struct root *R, size_t i)
{
    struct rconn *cn = &R->conns[i];
    char text[MSG_TEXT_MAX];
    struct cpu_reg reg;
    if (comm_cpu__reg_decode(cn->buf, R->magic, &reg, text, sizeof text) < 0) {
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
    memcpy(R->table + (size_t)rank * ADDR_BYTES, cn->buf + 28, ADDR_BYTES);
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

int comm_cpu_issue_id(FILE *out, int stdin_fd)
{
    int rc = 1, lfd = -1;
    struct root R = {0};
    struct pollfd *pfd = NULL;
    char err[256] = "";
    struct cpu_addr a;
    struct comm_id id = {{0}};
    char hex[2 * COMM_ID_BYTES + 1];

    if (listen_addr(&a, err, sizeof err) < 0)
        goto out;
    struct sockaddr_storage ss;
    socklen_t sl = addr_to_sa(&a, &ss);
    lfd = socket(a.family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&ss, sl) < 0 || listen(lfd, SOMAXCONN) < 0) {
        char at[80];
        addr_text(&a, at, sizeof at);
        snprintf(err, sizeof err, "cannot listen on %s: %s", at, strerror(errno));
        goto out;
    }
    sl = sizeof ss;
    if (getsockname(lfd, (struct sockaddr *)&ss, &sl) < 0 || addr_from_sa(&ss, &a) < 0) {
        snprintf(err, sizeof err, "getsockname: %s", strerror(errno));
        goto out;
    }
    size_t got = 0;
    while (got < MAGIC_BYTES) {
        ssize_t k = getrandom(R.magic + got, MAGIC_BYTES - got, 0);
        if (k < 0 && errno != EINTR) {
            snprintf(err, sizeof err, "getrandom: %s", strerror(errno));
            goto out;
        }
        if (k > 0)
            got += (size_t)k;
    }
    memcpy(id.bytes, R.magic, MAGIC_BYTES);
    addr_put(id.bytes + MAGIC_BYTES, &a);
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
        pfd[0] = (struct pollfd){stdin_fd, POLLIN, 0};
        pfd[1] = (struct pollfd){lfd, POLLIN, 0};
        size_t n = R.nconn;
        for (size_t i = 0; i < n; i++)
            pfd[2 + i] = (struct pollfd){R.conns[i].fd, POLLIN, 0};
        if (poll(pfd, n + 2, -1) < 0) {
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
            if (fd >= 0) {
                if (R.formed) {
                    static const char t[] = "this rendezvous has already formed its group";
                    root_send_msg(fd, MSG_ERROR, t, sizeof t - 1);
                    close(fd);
                } else if (R.nconn >= MAX_ROOT_CONNS) {
                    close(fd);
                } else {
                    R.conns[R.nconn++] = (struct rconn){.fd = fd, .rank = -1};
                }
            }
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

/* ---- a communicator ---- */

struct comm_req {
    struct comm_req *qnext;         /* the FIFO queue */
    struct comm_req *lprev, *lnext; /* started all-reduces not yet waited (for free) */
    int op;
    void *buf;
    const void *in;
    size_t bytes;
    int64_t n;
    int root;
    int done;
    ddpd_err rc;
};

/* A same-host link: a FIFO of bytes in memory shared by a rank (producer) and its next
 * (consumer), created by the consumer. Positions count bytes since the link began; each
 * side publishes its own and reads the other's. The sleep flags and one-byte pings over
 * the TCP connection wake a side that stopped spinning (see run_plan). */
struct shm_ctl {
    unsigned char magic[MAGIC_BYTES]; /* the id's magic and a nonce: proof it is ours */
    unsigned char nonce[16];
    _Alignas(64) _Atomic uint64_t head; /* written by the producer */
    _Alignas(64) _Atomic uint64_t tail; /* written by the consumer */
    _Alignas(64) _Atomic uint32_t cons_sleep;
    _Alignas(64) _Atomic uint32_t prod_sleep;
};
_Static_assert(sizeof(struct shm_ctl) <= SHM_HDR, "the control page holds the control block");

struct link {
    struct shm_ctl *h;   /* NULL: this direction goes over TCP */
    unsigned char *data; /* SHM_CAP bytes after the control page */
    uint64_t pos;        /* producer: next byte to write; consumer: next byte to read */
};

struct cpu {
    int rank, world, prev, next;
    double timeout_s;
    unsigned char magic[MAGIC_BYTES];
    int fd_next, fd_prev;  /* we only send to next and only receive from prev */
    struct link lout, lin; /* shared-memory data paths to next / from prev, if same host */

    /* Owned by whichever thread executes collectives (the progress thread or a caller
     * running one inline); `busy`, handed over under mu, says who. */
    uint32_t seq;
    float *stage;
    unsigned char *scratch;
    size_t scratch_cap;

    /* Shared, under mu. */
    pthread_mutex_t mu;
    pthread_cond_t work; /* the progress thread sleeps here */
    pthread_cond_t done; /* callers waiting for a request sleep here */
    pthread_t thread;
    int have_thread, have_sync;
    struct comm_req *head, *tail, *live;
    int busy, stopping, failed;
    ddpd_err fail_rc; /* DDPD_ECOMM, or DDPD_ECANCELED when the group ends by a cancel */
    double run_start;
    char err[ERR_CAP];

    char err_copy[ERR_CAP];                      /* what last_error hands the driving thread */
    atomic_int aborted;                          /* abort() may come from any thread or a signal handler */
    atomic_int cancelled;                        /* ... and so may cancel(), which also sets aborted */
    unsigned char abort_notice[NOTICE_HDR + 64]; /* prebuilt: abort() may not format */
    size_t abort_notice_len;
    unsigned char cancel_notice[NOTICE_HDR + 64];
    size_t cancel_notice_len;
};

/* Shuts both ring sockets: a blocked executor wakes, and the neighbours see the
 * connection close at once, so one rank's failure reaches the whole ring in
 * milliseconds instead of at everyone's deadline. Async-signal-safe. */
static void shut_sockets(struct cpu *c)
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
static size_t notice_put(unsigned char *buf, size_t cap, int origin, int cancel, const char *text)
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
    size_t n = notice_put(buf, sizeof buf, origin, cancel, text);
    /* Best effort: the reverse direction is empty, so a few hundred bytes always fit. */
    if (c->fd_prev >= 0)
        (void)!send(c->fd_prev, buf, n, MSG_NOSIGNAL | MSG_DONTWAIT);
}

/* Where a failure began, its first text, and whether it was a cancel (a rank told to
 * stop, not a fault), passed along backwards unchanged. */
struct origin {
    int rank;
    int cancel;
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

static int next_failed(struct cpu *c, const char *w, char *err, size_t cap, struct origin *o)
{
    unsigned char all[1024];
    ssize_t k = recv(c->fd_next, all, sizeof all, MSG_DONTWAIT);
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return 0;
    int got = k > 0 ? comm_cpu__notice_decode(all, (size_t)k, c->world, &o->rank, o->text) : -1;
    if (got == 0)
        return 0;
    if (got > 0) {
        o->cancel = got == 2;
        snprintf(err, cap, "rank %d reported: %s", o->rank, o->text);
        return 1;
    }
    snprintf(err, cap, "peer rank %d closed the connection during %s", c->next, w);
    return 1;
}

/* ---- the collective engine ---- */

/* One collective as two byte streams: send segments to next, receive segments from prev.
 * Send segment i (i >= lag) carries what receive segment i-lag brought, so it may only
 * send as far as that segment has been processed: this one rule pipelines the ring
 * (lag 1: reduce-scatter and all-gather steps) and the broadcast chain (lag 0). */
struct plan {
    int op;
    uint32_t arg;   /* broadcast: the root */
    uint64_t bytes; /* as named in the header */
    unsigned char *base;
    int chain; /* 1: one segment, the whole of base[total] */
    size_t total;
    size_t unit, nunits; /* ring: base is nunits units of `unit` bytes in W chunks */
    int nsend, nrecv, lag;
    int nreduce; /* receive segments [0, nreduce) are added into base (floats) */
};

struct stream {
    int seg;     /* current segment */
    size_t off;  /* bytes of it done (receiving a reduction: added into base) */
    size_t hdr;  /* header bytes done */
    size_t pend; /* receiving a reduction: bytes waiting in stage */
};

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
    default:
        snprintf(buf, cap, "%s", name);
    }
}

static void add_into(float *restrict dst, const float *restrict src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] += src[i];
}

/* A one-byte wake-up for a peer that sleeps in poll() on this connection. */
static void ping(int fd)
{
    static const unsigned char zero = 0;
    (void)!send(fd, &zero, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
}

/* Bytes the producer may write now, in whole 8-byte units. The position can run up to 7
 * bytes past a full FIFO (alignment padding, see run_plan), hence the guard. The consumer's
 * padding at the start of a collective is not published until it first consumes, so the
 * raw room can be a few bytes odd; a put that used them would end the FIFO in the middle
 * of a float, which a reducing consumer cannot take. Were this producer then to die, the
 * consumer would see bytes it can never use, and those bytes used to keep it spinning,
 * past its deadline and blind to the hang-up (issue 15, item 19). Rounding here, where
 * both shm_put and the wait's re-check read it, keeps them agreeing on "no room". */
static size_t shm_room(const struct link *L)
{
    uint64_t used = L->pos - atomic_load_explicit(&L->h->tail, memory_order_acquire);
    return used >= SHM_CAP ? 0 : (SHM_CAP - (size_t)used) & ~(size_t)7;
}

/* Copies as much of iov as fits into the FIFO to next and publishes it. */
static size_t shm_put(struct cpu *c, const struct iovec *iov, int cnt)
{
    struct link *L = &c->lout;
    size_t room = shm_room(L), done = 0;
    if (room > SHM_PIECE)
        room = SHM_PIECE;
    for (int i = 0; i < cnt && done < room; i++) {
        const unsigned char *src = iov[i].iov_base;
        size_t n = iov[i].iov_len < room - done ? iov[i].iov_len : room - done;
        while (n > 0) {
            size_t off = (size_t)(L->pos & (SHM_CAP - 1));
            size_t k = n < SHM_CAP - off ? n : SHM_CAP - off;
            memcpy(L->data + off, src, k);
            L->pos += k;
            src += k;
            n -= k;
            done += k;
        }
    }
    if (done) {
        /* seq_cst pairs with the consumer's "set cons_sleep, re-read head": one of the
         * two sees the other, so a wake-up is never lost. */
        atomic_store(&L->h->head, L->pos);
        if (atomic_load(&L->h->cons_sleep) && atomic_exchange(&L->h->cons_sleep, 0))
            ping(c->fd_next);
    }
    return done;
}

/* Contiguous bytes readable at the consumer's position (0 when none). */
static size_t shm_avail(const struct link *L, const unsigned char **ptr)
{
    uint64_t head = atomic_load_explicit(&L->h->head, memory_order_acquire);
    if ((int64_t)(head - L->pos) <= 0)
        return 0;
    size_t off = (size_t)(L->pos & (SHM_CAP - 1));
    size_t n = (size_t)(head - L->pos);
    *ptr = L->data + off;
    return n < SHM_CAP - off ? n : SHM_CAP - off;
}

/* Whether the consumer can take anything at its position now: bytes, and for a reducing
 * segment at least one whole float (a stray fragment is nothing it can use). */
static int shm_usable(const struct cpu *c, const struct plan *p, const struct stream *r)
{
    const unsigned char *src;
    size_t n = shm_avail(&c->lin, &src);
    if (r->hdr == HDR_BYTES && r->seg < p->nreduce)
        return n >= sizeof(float);
    return n > 0;
}

static void shm_consume(struct cpu *c, size_t n)
{
    struct link *L = &c->lin;
    L->pos += n;
    atomic_store(&L->h->tail, L->pos);
    if (atomic_load(&L->h->prod_sleep) && atomic_exchange(&L->h->prod_sleep, 0))
        ping(c->fd_prev);
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
    double deadline = mono() + c->timeout_s, spin_until = 0;
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
                k = (ssize_t)shm_put(c, iov, cnt);
                want_out = k == 0;
            } else if (cnt > 0) {
                struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)cnt};
                k = sendmsg(c->fd_next, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
                if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                    want_out = 1;
                } else if (k < 0 && errno != EINTR) {
                    e = errno;
                    what(w, sizeof w, p);
                    if (next_failed(c, w, err, cap, &o))
                        goto fail;
                    if (e == EPIPE || e == ECONNRESET)
                        snprintf(err, cap, "peer rank %d closed the connection during %s", c->next, w);
                    else
                        snprintf(err, cap, "sending to rank %d during %s: %s", c->next, w, strerror(e));
                    goto fail;
                }
            }
            if (k > 0) {
                size_t left = (size_t)k;
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
            size_t n = shm_avail(&c->lin, &src), used = 0;
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
                    m = m / sizeof(float) * sizeof(float);
                    add_into((float *)(ptr + r.off), (const float *)(const void *)(src + used),
                             m / sizeof(float));
                } else {
                    memcpy(ptr + r.off, src + used, m);
                }
                r.off += m;
                used += m;
                stream_skip(c, p, 1, &r);
            }
            if (used) {
                shm_consume(c, used);
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
                    size_t whole = r.pend / sizeof(float) * sizeof(float);
                    add_into((float *)(ptr + r.off), c->stage, whole / sizeof(float));
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
            spin_until = 0;
            continue;
        }
        /* Nothing moved this round. Every way of waiting below (a spin, a re-check of the
         * FIFOs, a poll) comes back here, so this one check bounds them all: a wait that
         * ends early for any reason, or a peer that stops in any state, cannot keep this
         * rank past its deadline. */
        if (mono() >= deadline) {
            what(w, sizeof w, p);
            /* Name whom we wait for: the sender if its bytes are missing, else the
             * receiver that does not drain its socket or FIFO. */
            int whom = want_in || !want_out ? c->prev : c->next;
            snprintf(err, cap, "%s timed out after %.1f s waiting for rank %d", w, c->timeout_s, whom);
            goto fail;
        }
        if (!want_in && !want_out)
            continue;
        /* A shared-memory peer is usually about to write or drain: spin briefly before
         * paying for a sleep and a wake-up. */
        int shm_in = want_in && c->lin.h, shm_out = want_out && c->lout.h;
        if (shm_in || shm_out) {
            double t = mono();
            if (spin_until == 0)
                spin_until = t + SPIN_S;
            if (t < spin_until) {
                /* sched_yield, not a pause loop: with more runnable threads than CPUs
                 * (two ranks packed on one vCPU) a pure spin would keep the very peer
                 * we wait for off the CPU until the spin ends. */
                sched_yield();
                continue;
            }
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
                ready |= shm_usable(c, p, &r);
            if (shm_out)
                ready |= shm_room(&c->lout) > 0;
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
        int pr = poll(pf, np, ms_until(deadline));
        int perr = errno;
        if (shm_in)
            atomic_store(&c->lin.h->cons_sleep, 0);
        if (shm_out)
            atomic_store(&c->lout.h->prod_sleep, 0);
        spin_until = 0;
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
                if (shm_usable(c, p, &r))
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
        while (!(got = next_failed(c, w, t2, sizeof t2, &o2)) && !atomic_load(&c->aborted))
            if (wait_fd(c->fd_next, POLLIN, deadline) <= 0)
                break;
        if (atomic_load(&c->aborted))
            goto fail;
        if (got && (o2.rank >= 0 || !sdone)) {
            o = o2;
            snprintf(err, cap, "%s", t2);
        } else if (e == 0 || e == ECONNRESET) {
            snprintf(err, cap, "peer rank %d closed the connection during %s", c->prev, w);
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
        shut_sockets(c);
        return cancelled ? DDPD_ECANCELED : DDPD_ECOMM;
    }
    if (o.rank < 0) {
        o.rank = c->rank;
        snprintf(o.text, sizeof o.text, "%s", err);
    }
    /* A cancel stays a cancel as it travels: every rank ends as cancelled, not failed. */
    send_notice(c, o.rank, o.cancel, o.text);
    shut_sockets(c);
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
static ddpd_err ring_allgather(struct cpu *c, int op, uint64_t hdr_bytes, unsigned char *out, size_t bytes,
                               char *err, size_t cap)
{
    struct plan p = {.op = op,
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
    ddpd_err rc = ring_allgather(c, OP_ALLREDUCE, nb, c->scratch, nb, err, cap);
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
    return ring_allgather(c, OP_ALLGATHER, bytes, out, bytes, err, cap);
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
    ddpd_err rc = ring_allgather(c, OP_MAX_I64, nb, c->scratch, nb, err, cap);
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
    return ring_allgather(c, OP_BARRIER, 0, c->scratch, 1, err, cap);
}

static ddpd_err execute(struct cpu *c, struct comm_req *q, char *err, size_t cap)
{
    switch (q->op) {
    case OP_ALLREDUCE:
        return do_allreduce(c, q->buf, q->n, err, cap);
    case OP_BROADCAST:
        return do_broadcast(c, q->buf, q->bytes, q->root, err, cap);
    case OP_ALLGATHER:
        return do_allgather(c, q->in, q->bytes, q->buf, err, cap);
    case OP_MAX_I64:
        return do_max(c, q->buf, (int)q->n, err, cap);
    case OP_BARRIER:
        return do_barrier(c, err, cap);
    }
    snprintf(err, cap, "unknown collective %d", q->op);
    return DDPD_ECOMM;
}

/* ---- the queue and the progress thread ---- */

/* Records the first failure; every later call fails fast with its text and its code
 * (DDPD_ECANCELED when the group ended by a cancel, else DDPD_ECOMM). Under mu. */
static void set_failed(struct cpu *c, ddpd_err rc, const char *text)
{
    if (c->failed)
        return;
    c->failed = 1;
    c->fail_rc = rc == DDPD_ECANCELED ? DDPD_ECANCELED : DDPD_ECOMM;
    snprintf(c->err, sizeof c->err, "%s", text && *text ? text : "communication failure");
}

/* Fails fast if the communicator is poisoned, aborted or cancelled. Under mu. */
static int check_usable(struct cpu *c)
{
    if (!c->failed && atomic_load(&c->aborted)) {
        if (atomic_load(&c->cancelled))
            set_failed(c, DDPD_ECANCELED, "cancelled");
        else
            set_failed(c, DDPD_ECOMM, "communicator aborted");
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
    c->run_start = mono();
    int skip = check_usable(c) < 0;
    ddpd_err rc = DDPD_ECOMM;
    char text[ERR_CAP] = "";
    pthread_mutex_unlock(&c->mu);
    if (!skip)
        rc = execute(c, q, text, sizeof text);
    pthread_mutex_lock(&c->mu);
    if (rc != DDPD_OK)
        set_failed(c, rc, text);
    q->rc = rc == DDPD_OK ? DDPD_OK : c->fail_rc;
    q->done = 1;
    c->busy = 0;
    pthread_cond_broadcast(&c->done);
    if (c->head)
        pthread_cond_signal(&c->work);
}

static void *progress_main(void *arg)
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

static void enqueue(struct cpu *c, struct comm_req *q)
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
static ddpd_err wait_done(struct cpu *c, struct comm_req *q)
{
    pthread_mutex_lock(&c->mu);
    int kicked = 0;
    while (!q->done) {
        if (!c->busy && c->head) {
            run_head(c);
            continue;
        }
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_sec += 1;
        pthread_cond_timedwait(&c->done, &c->mu, &ts);
        /* Safety net: run_plan bounds every socket wait by the deadline, so a collective
         * running far past it is stuck somewhere unexpected; shutting the sockets frees it. */
        if (c->busy && !kicked && mono() > c->run_start + c->timeout_s + 5.0) {
            shut_sockets(c);
            kicked = 1;
        }
    }
    ddpd_err rc = q->rc;
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* Issues a blocking collective: ordered after everything queued, run inline when idle. */
static ddpd_err blocking(struct cpu *c, struct comm_req *q)
{
    pthread_mutex_lock(&c->mu);
    if (check_usable(c) < 0) {
        ddpd_err rc = c->fail_rc;
        pthread_mutex_unlock(&c->mu);
        return rc;
    }
    /* No wake-up: if the ring is idle we run it ourselves at once, and otherwise the
     * progress thread is running (or we run what it has not taken yet). */
    enqueue(c, q);
    pthread_mutex_unlock(&c->mu);
    return wait_done(c, q);
}

/* ---- the table's entries ---- */

static int fmt_err(char *buf, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fmt_err(char *buf, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (buf && cap)
        vsnprintf(buf, cap, fmt, ap);
    va_end(ap);
    return -1;
}

static void cpu_free(void *ctx);

/* A hello on a ring connection: magic, the sender's rank, a tag. */
static void hello_put(unsigned char *h, const struct cpu *c)
{
    memcpy(h, c->magic, MAGIC_BYTES);
    put32(h + 16, (uint32_t)c->rank);
    put32(h + 20, 0x48454c4f); /* "HELO" */
}

int comm_cpu__hello_check(const unsigned char h[HELLO_BYTES], const unsigned char magic[MAGIC_BYTES],
                          int expect, char *err, size_t cap)
{
    if (memcmp(h, magic, MAGIC_BYTES) != 0 || get32(h + 20) != 0x48454c4f)
        return fmt_err(err, cap,
                       "ring: the connection with rank %d carries the wrong magic "
                       "(a rank of another group?)",
                       expect);
    if (get32(h + 16) != (uint32_t)expect)
        return fmt_err(err, cap, "ring: expected rank %d on this connection, got rank %u", expect,
                       get32(h + 16));
    return 0;
}

static const char *io_text(int io)
{
    return io == IO_TIMEOUT ? "timed out" : io == IO_CLOSED ? "connection closed" : strerror(errno);
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
        if (addr_get(payload + (size_t)r * ADDR_BYTES, &table[r]) < 0)
            return -1;
    return 0;
}

/* Registers with the root over `fd` (connected) and receives the table: table[world] of
 * the ranks' listening addresses. */
static int rendezvous(struct cpu *c, int fd, const struct cpu_addr *root, const struct cpu_addr *me,
                      double deadline, struct cpu_addr *table, char *err, size_t cap)
{
    int rc = -1, registered = 0;
    char at[80];
    unsigned char reg[REG_BYTES] = {0}, h[MSG_HDR_BYTES];
    unsigned char *payload = NULL;
    addr_text(root, at, sizeof at);

    memcpy(reg, c->magic, MAGIC_BYTES);
    put32(reg + 16, PROTO_VERSION);
    put32(reg + 20, (uint32_t)c->rank);
    put32(reg + 24, (uint32_t)c->world);
    addr_put(reg + 28, me);
    int io = send_all(fd, reg, sizeof reg, deadline);
    if (io != IO_OK) {
        fmt_err(err, cap, "rendezvous: registering with root %s: %s", at, io_text(io));
        goto out;
    }
    for (;;) {
        io = recv_all(fd, h, sizeof h, deadline);
        if (io == IO_TIMEOUT && registered) {
            fmt_err(err, cap,
                    "rendezvous with root %s timed out after %.1f s (%d of %d ranks "
                    "registered)",
                    at, c->timeout_s, registered, c->world);
            goto out;
        }
        if (io == IO_TIMEOUT) {
            fmt_err(err, cap,
                    "rendezvous with root %s timed out after %.1f s (the root did not "
                    "acknowledge rank %d)",
                    at, c->timeout_s, c->rank);
            goto out;
        }
        if (io != IO_OK) {
            fmt_err(err, cap, "rendezvous: root %s: %s", at, io_text(io));
            goto out;
        }
        uint32_t type, len;
        if (comm_cpu__msg_head(h, c->world, &type, &len) < 0) {
            fmt_err(err, cap, "rendezvous: malformed message from root %s", at);
            goto out;
        }
        free(payload);
        payload = malloc(len + 1);
        if (!payload) {
            fmt_err(err, cap, "rendezvous: out of memory");
            goto out;
        }
        io = recv_all(fd, payload, len, deadline);
        if (io != IO_OK) {
            fmt_err(err, cap, "rendezvous: root %s: %s", at, io_text(io));
            goto out;
        }
        if (comm_cpu__msg_body(type, payload, len, c->world, table, &registered) < 0) {
            fmt_err(err, cap, "rendezvous: malformed table from root %s", at);
            goto out;
        }
        if (type == MSG_PROGRESS)
            continue;
        if (type == MSG_ERROR) {
            fmt_err(err, cap, "rendezvous: root %s refused rank %d: %s", at, c->rank, (char *)payload);
            goto out;
        }
        rc = 0;
        break;
    }
out:
    free(payload);
    return rc;
}

/* ---- same-host links ---- */

#define SHM_OFFER_TAG 0x53484d4f /* "SHMO" */
#define SHM_ACK_TAG 0x53484d41   /* "SHMA" */

/* DDPD_COMM_SHM=0 keeps every link on TCP (for tests, or to rule the FIFOs out). */
static int shm_enabled(void)
{
    const char *v = getenv("DDPD_COMM_SHM");
    return !(v && !strcmp(v, "0"));
}

/* Creates this rank's incoming FIFO in a memfd. Returns the fd, which must stay open until
 * prev has opened it through /proc, or -1 (the link then stays on TCP). */
static int shm_create(struct cpu *c, unsigned char nonce[16])
{
    if (!shm_enabled())
        return -1;
    int fd = memfd_create("ddpd-ring", MFD_CLOEXEC);
    if (fd < 0)
        return -1;
    size_t len = SHM_HDR + SHM_CAP;
    void *m = MAP_FAILED;
    if (ftruncate(fd, (off_t)len) == 0)
        m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED || getrandom(nonce, 16, 0) != 16) {
        if (m != MAP_FAILED)
            munmap(m, len);
        close(fd);
        return -1;
    }
    struct shm_ctl *h = m;
    memcpy(h->magic, c->magic, MAGIC_BYTES);
    memcpy(h->nonce, nonce, 16);
    atomic_store(&h->head, 0);
    atomic_store(&h->tail, 0);
    atomic_store(&h->cons_sleep, 0);
    atomic_store(&h->prod_sleep, 0);
    c->lin = (struct link){h, (unsigned char *)m + SHM_HDR, 0};
    return fd;
}

/* Maps next's FIFO, offered as (pid, fd, nonce). Only a process on this host, in our PID
 * namespace, can be opened this way, and the magic and nonce prove it is the right one:
 * a pid that names some other process on another host's behalf fails the check. */
static int shm_open_peer(struct cpu *c, uint32_t pid, uint32_t fdnum, const unsigned char *nonce)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%u/fd/%u", pid, fdnum);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return -1;
    size_t len = SHM_HDR + SHM_CAP;
    struct stat st;
    void *m = MAP_FAILED;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && (size_t)st.st_size == len)
        m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED)
        return -1;
    struct shm_ctl *h = m;
    if (memcmp(h->magic, c->magic, MAGIC_BYTES) != 0 || memcmp(h->nonce, nonce, 16) != 0) {
        munmap(m, len);
        return -1;
    }
    c->lout = (struct link){h, (unsigned char *)m + SHM_HDR, 0};
    return 0;
}

static void link_unmap(struct link *L)
{
    if (L->h)
        munmap(L->h, SHM_HDR + SHM_CAP);
    L->h = NULL;
}

int comm_cpu__shm_offer_decode(const unsigned char offer[SHM_OFFER_BYTES], uint32_t *pid, uint32_t *fdnum)
{
    *pid = get32(offer + 4);
    *fdnum = get32(offer + 8);
    return get32(offer) == SHM_OFFER_TAG && *pid != 0 && get32(offer + 12) == SHM_CAP;
}

/* Moves each ring link onto a shared FIFO where both ends share this host; a link whose
 * ends cannot (other host, other PID namespace, DDPD_COMM_SHM=0) stays on TCP. Each
 * rank offers its incoming FIFO to prev, maps next's, and the producer's answer decides,
 * so both ends of a link always agree. Fails only when the TCP connections do. */
static int setup_shm(struct cpu *c, double deadline, char *err, size_t cap)
{
    unsigned char offer[SHM_OFFER_BYTES] = {0}, theirs[SHM_OFFER_BYTES], ack[8], ack_in[8];
    unsigned char nonce[16] = {0};
    int rc = -1, io;
    int mfd = shm_create(c, nonce);
    put32(offer, SHM_OFFER_TAG);
    put32(offer + 4, mfd >= 0 ? (uint32_t)getpid() : 0);
    put32(offer + 8, mfd >= 0 ? (uint32_t)mfd : 0);
    put32(offer + 12, SHM_CAP);
    memcpy(offer + 16, nonce, 16);
    io = send_all(c->fd_prev, offer, sizeof offer, deadline);
    if (io != IO_OK) {
        fmt_err(err, cap, "ring: offering shared memory to rank %d: %s", c->prev, io_text(io));
        goto out;
    }
    io = recv_all(c->fd_next, theirs, sizeof theirs, deadline);
    if (io != IO_OK) {
        fmt_err(err, cap, "ring: shared-memory offer from rank %d: %s", c->next, io_text(io));
        goto out;
    }
    uint32_t pid = 0, fdnum = 0;
    int ok = comm_cpu__shm_offer_decode(theirs, &pid, &fdnum) && shm_enabled() &&
             shm_open_peer(c, pid, fdnum, theirs + 16) == 0;
    put32(ack, SHM_ACK_TAG);
    put32(ack + 4, (uint32_t)ok);
    io = send_all(c->fd_next, ack, sizeof ack, deadline);
    if (io != IO_OK) {
        fmt_err(err, cap, "ring: answering rank %d: %s", c->next, io_text(io));
        goto out;
    }
    io = recv_all(c->fd_prev, ack_in, sizeof ack_in, deadline);
    if (io != IO_OK) {
        fmt_err(err, cap, "ring: shared-memory answer from rank %d: %s", c->prev, io_text(io));
        goto out;
    }
    if (get32(ack_in) != SHM_ACK_TAG || get32(ack_in + 4) != 1)
        link_unmap(&c->lin);
    rc = 0;
out:
    if (mfd >= 0)
        close(mfd);
    return rc;
}

/* Connects to next, accepts prev, and checks both with a hello each way. */
static int form_ring(struct cpu *c, int lfd, const struct cpu_addr *table, double deadline, char *err,
                     size_t cap)
{
    unsigned char mine[HELLO_BYTES], theirs[HELLO_BYTES];
    char at[80];
    int refused = 0, io;
    hello_put(mine, c);

    addr_text(&table[c->next], at, sizeof at);
    c->fd_next = connect_retry(&table[c->next], deadline, &refused);
    if (c->fd_next < 0)
        return fmt_err(err, cap, "ring: cannot connect to rank %d at %s: %s", c->next, at,
                       errno == ETIMEDOUT ? "timed out" : strerror(errno));
    /* The hello fits the socket buffer, so sending before accepting cannot deadlock. */
    io = send_all(c->fd_next, mine, sizeof mine, deadline);
    if (io != IO_OK)
        return fmt_err(err, cap, "ring: greeting rank %d at %s: %s", c->next, at, io_text(io));

    int w = wait_fd(lfd, POLLIN, deadline);
    if (w == 0)
        return fmt_err(err, cap, "ring: rank %d did not connect within %.1f s", c->prev, c->timeout_s);
    c->fd_prev = w > 0 ? accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC) : -1;
    if (c->fd_prev < 0)
        return fmt_err(err, cap, "ring: accepting rank %d: %s", c->prev, strerror(errno));
    sock_tune(c->fd_prev);
    io = recv_all(c->fd_prev, theirs, sizeof theirs, deadline);
    if (io != IO_OK)
        return fmt_err(err, cap, "ring: hello from rank %d: %s", c->prev, io_text(io));
    if (comm_cpu__hello_check(theirs, c->magic, c->prev, err, cap) < 0)
        return -1;
    io = send_all(c->fd_prev, mine, sizeof mine, deadline);
    if (io != IO_OK)
        return fmt_err(err, cap, "ring: answering rank %d: %s", c->prev, io_text(io));
    io = recv_all(c->fd_next, theirs, sizeof theirs, deadline);
    if (io != IO_OK)
        return fmt_err(err, cap, "ring: answer from rank %d: %s", c->next, io_text(io));
    if (comm_cpu__hello_check(theirs, c->magic, c->next, err, cap) < 0)
        return -1;
    return setup_shm(c, deadline, err, cap);
}

static ddpd_err cpu_init_rank(const struct comm_id *id, int rank, int world, double timeout_s, void **ctx,
                              char *errbuf, size_t errcap)
{
    struct cpu *c = NULL;
    struct cpu_addr *table = NULL;
    int lfd = -1, rfd = -1;
    ddpd_err rc = DDPD_ECOMM;
    *ctx = NULL;

    if (world < 1 || world > MAX_WORLD || rank < 0 || rank >= world) {
        fmt_err(errbuf, errcap, "rank %d of %d is out of range (world 1..%d)", rank, world, MAX_WORLD);
        goto out;
    }
    if (!(timeout_s > 0) || timeout_s > 1e6) {
        fmt_err(errbuf, errcap, "the communication timeout must be in (0, 1e6] s (got %g s)", timeout_s);
        goto out;
    }
    c = calloc(1, sizeof *c);
    if (!c) {
        fmt_err(errbuf, errcap, "out of memory");
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
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    int sync_ok = pthread_mutex_init(&c->mu, NULL) == 0 && pthread_cond_init(&c->work, &ca) == 0 &&
                  pthread_cond_init(&c->done, &ca) == 0;
    pthread_condattr_destroy(&ca);
    if (!sync_ok) {
        fmt_err(errbuf, errcap, "cannot create the communicator's lock");
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
    if (comm_cpu__id_decode(id, c->magic, &root) < 0) {
        fmt_err(errbuf, errcap, "malformed communicator id (no root address in it)");
        goto out;
    }
    double deadline = mono() + timeout_s;
    c->stage = malloc(STAGE_BYTES);
    table = calloc((size_t)world, sizeof *table);
    if (!c->stage || !table) {
        fmt_err(errbuf, errcap, "out of memory");
        goto out;
    }

    int refused = 0;
    rfd = connect_retry(&root, deadline, &refused);
    if (rfd < 0) {
        char at[80];
        addr_text(&root, at, sizeof at);
        if (errno == ETIMEDOUT)
            fmt_err(errbuf, errcap, "rendezvous with root %s timed out after %.1f s (%s)", at, timeout_s,
                    refused ? "nobody listens there: is the issuer gone?" : "could not connect");
        else
            fmt_err(errbuf, errcap, "rendezvous: cannot connect to root %s: %s", at, strerror(errno));
        goto out;
    }
    /* Our ring listener goes on the interface that reaches the root: that address is what
     * the root (and so every rank) can reach us by, in the root's address family. */
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    struct cpu_addr me;
    if (getsockname(rfd, (struct sockaddr *)&ss, &sl) < 0 || addr_from_sa(&ss, &me) < 0) {
        fmt_err(errbuf, errcap, "getsockname: %s", strerror(errno));
        goto out;
    }
    me.port = 0;
    sl = addr_to_sa(&me, &ss);
    lfd = socket(me.family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (lfd >= 0)
        sock_tune(lfd); /* accepted sockets inherit the buffer sizes */
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&ss, sl) < 0 || listen(lfd, 16) < 0) {
        fmt_err(errbuf, errcap, "ring: cannot listen: %s", strerror(errno));
        goto out;
    }
    sl = sizeof ss;
    if (getsockname(lfd, (struct sockaddr *)&ss, &sl) < 0 || addr_from_sa(&ss, &me) < 0) {
        fmt_err(errbuf, errcap, "getsockname: %s", strerror(errno));
        goto out;
    }
    if (rendezvous(c, rfd, &root, &me, deadline, table, errbuf, errcap) < 0)
        goto out;
    close(rfd);
    rfd = -1;
    if (form_ring(c, lfd, table, deadline, errbuf, errcap) < 0)
        goto out;

    char text[64];
    snprintf(text, sizeof text, "rank %d aborted its communicator", rank);
    c->abort_notice_len = notice_put(c->abort_notice, sizeof c->abort_notice, rank, 0, text);
    c->cancel_notice_len = notice_put(c->cancel_notice, sizeof c->cancel_notice, rank, 1, "it was cancelled");

    /* The progress thread takes no signals: they belong to the worker's main thread. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int th = pthread_create(&c->thread, NULL, progress_main, c);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (th != 0) {
        fmt_err(errbuf, errcap, "cannot start the progress thread: %s", strerror(th));
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

static ddpd_err cpu_allreduce_start(void *ctx, float *buf, int64_t n, struct comm_req **req)
{
    struct cpu *c = ctx;
    *req = NULL;
    struct comm_req *q = calloc(1, sizeof *q);
    pthread_mutex_lock(&c->mu);
    if (check_usable(c) < 0 || !q || n < 0 || (uint64_t)n > SIZE_MAX / sizeof(float) / 4) {
        if (!c->failed)
            set_failed(c, DDPD_ECOMM, !q ? "out of memory" : "all-reduce of a negative or impossible count");
        ddpd_err rc = c->fail_rc;
        pthread_mutex_unlock(&c->mu);
        free(q);
        return rc;
    }
    q->op = OP_ALLREDUCE;
    q->buf = buf;
    q->n = n;
    q->lnext = c->live;
    if (c->live)
        c->live->lprev = q;
    c->live = q;
    /* A small all-reduce issued while the ring is idle is left for the caller's wait to
     * run inline: waking the thread costs more than the collective (a cross-CPU wake-up
     * in a VM is tens of microseconds), and such a bucket (the last of a backward) is
     * waited for right away. The next start, blocking call or wait runs it, in order.
     * Anything else wakes the thread now: overlap with the caller's work is the point. */
    int defer = (uint64_t)n * sizeof(float) <= SMALL_BYTES && !c->busy && !c->head;
    enqueue(c, q);
    if (!defer)
        pthread_cond_signal(&c->work);
    pthread_mutex_unlock(&c->mu);
    *req = q;
    return DDPD_OK;
}

static ddpd_err cpu_wait(void *ctx, struct comm_req *q)
{
    struct cpu *c = ctx;
    if (!q) {
        pthread_mutex_lock(&c->mu);
        ddpd_err rc = check_usable(c) < 0 ? c->fail_rc : DDPD_OK;
        pthread_mutex_unlock(&c->mu);
        return rc;
    }
    ddpd_err rc = wait_done(c, q);
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
        set_failed(c, DDPD_ECOMM, "broadcast from a rank outside the group");
        pthread_mutex_unlock(&c->mu);
        return DDPD_ECOMM;
    }
    struct comm_req q = {.op = OP_BROADCAST, .buf = buf, .bytes = bytes, .root = root};
    return blocking(c, &q);
}

static ddpd_err cpu_allgather(void *ctx, const void *in, size_t bytes, void *out)
{
    struct comm_req q = {.op = OP_ALLGATHER, .in = in, .buf = out, .bytes = bytes};
    return blocking(ctx, &q);
}

static ddpd_err cpu_allreduce_max_i64(void *ctx, int64_t *v, int n)
{
    if (n < 0)
        n = 0;
    struct comm_req q = {.op = OP_MAX_I64, .buf = v, .n = n};
    return blocking(ctx, &q);
}

static ddpd_err cpu_barrier(void *ctx)
{
    struct comm_req q = {.op = OP_BARRIER};
    return blocking(ctx, &q);
}

static void cpu_abort(void *ctx)
{
    struct cpu *c = ctx;
    if (!c)
        return;
    atomic_store(&c->aborted, 1);
    if (c->fd_prev >= 0)
        (void)!send(c->fd_prev, c->abort_notice, c->abort_notice_len, MSG_NOSIGNAL | MSG_DONTWAIT);
    shut_sockets(c);
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
    atomic_store(&c->aborted, 1);
    if (c->fd_prev >= 0 && c->cancel_notice_len)
        (void)!send(c->fd_prev, c->cancel_notice, c->cancel_notice_len, MSG_NOSIGNAL | MSG_DONTWAIT);
    shut_sockets(c);
    return 1;
}

static const char *cpu_last_error(void *ctx)
{
    struct cpu *c = ctx;
    pthread_mutex_lock(&c->mu);
    check_usable(c);
    snprintf(c->err_copy, sizeof c->err_copy, "%s", c->failed ? c->err : "");
    pthread_mutex_unlock(&c->mu);
    return c->err_copy;
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
            shut_sockets(c);
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
    link_unmap(&c->lin);
    link_unmap(&c->lout);
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
    .wait = cpu_wait,
    .broadcast = cpu_broadcast,
    .allgather = cpu_allgather,
    .allreduce_max_i64 = cpu_allreduce_max_i64,
    .barrier = cpu_barrier,
    .abort = cpu_abort,
    .cancel = cpu_cancel,
    .last_error = cpu_last_error,
    .free = cpu_free,
};
