/* comm/cpu/sock.c — the CPU backend's plumbing: clocks, addresses, and blocking socket I/O
 * with a deadline (send_all, recv_all, connect_retry). Knows nothing of ranks or collectives. */
#include "cpu_impl.h"

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* ---- small helpers ---- */

/* Milliseconds until `deadline` for poll, rounded up so a wait never ends early. */
int comm_cpu__ms_until(double deadline)
{
    double left = deadline - base_mono_s();
    if (left <= 0)
        return 0;
    if (left > 3600)
        return 3600 * 1000;
    return (int)ceil(left * 1000.0);
}

/* ---- addresses ---- */

socklen_t comm_cpu__addr_to_sa(const struct cpu_addr *a, struct sockaddr_storage *ss)
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

int comm_cpu__addr_from_sa(const struct sockaddr_storage *ss, struct cpu_addr *a)
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
void comm_cpu__addr_text(const struct cpu_addr *a, char *buf, size_t cap)
{
    char ip[INET6_ADDRSTRLEN] = "?";
    inet_ntop(a->family, a->ip, ip, sizeof ip);
    if (a->family == AF_INET6)
        snprintf(buf, cap, "[%s]:%u", ip, (unsigned)a->port);
    else
        snprintf(buf, cap, "%s:%u", ip, (unsigned)a->port);
}

void comm_cpu__peer_text(int fd, char *buf, size_t cap)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    struct cpu_addr a;
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) == 0 && comm_cpu__addr_from_sa(&ss, &a) == 0)
        comm_cpu__addr_text(&a, buf, cap);
    else
        snprintf(buf, cap, "?");
}

void comm_cpu__peer_host(int fd, char *buf, size_t cap)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    struct cpu_addr a;
    char ip[INET6_ADDRSTRLEN];
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) == 0 && comm_cpu__addr_from_sa(&ss, &a) == 0 &&
        inet_ntop(a.family, a.ip, ip, sizeof ip))
        snprintf(buf, cap, "%s", ip);
    else
        snprintf(buf, cap, "?");
}

/* On the wire (in the id, the registration and the table): family as 4 or 6, port, then
 * 16 address bytes (an IPv4 address uses the first 4). */
void comm_cpu__addr_put(unsigned char p[ADDR_BYTES], const struct cpu_addr *a)
{
    memset(p, 0, ADDR_BYTES);
    put16(p, a->family == AF_INET6 ? 6 : 4);
    put16(p + 2, a->port);
    memcpy(p + 4, a->ip, a->family == AF_INET6 ? 16 : 4);
}

int comm_cpu__addr_get(const unsigned char p[ADDR_BYTES], struct cpu_addr *a)
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
int comm_cpu__listen_addr(struct cpu_addr *a, char *err, size_t cap)
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
        found = comm_cpu__addr_from_sa(&ss, a);
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
void comm_cpu__sock_tune(int fd)
{
    int one = 1, buf = SOCK_BUF;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
}

/* Why keepalive and not TCP_USER_TIMEOUT: since Linux 5.11 a user timeout also ends a
 * connection whose receive window stays closed that long, though the peer's kernel answers
 * every probe, and a ring peer that is slow to start its side of a collective (a
 * straggler, a checkpoint being written) closes its window for as long as it likes. */
void comm_cpu__sock_live(int fd)
{
    int one = 1, idle = KEEP_IDLE_S, intvl = KEEP_INTVL_S, cnt = KEEP_CNT;
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
}

/* The kernel's own clocks say whether the peer's host still answers: the time since it
 * last acknowledged anything (tcpi_last_ack_recv) or sent us data (tcpi_last_data_recv),
 * the later of the two, as keepalive itself counts. A live host keeps that short whatever
 * its processes do: it acknowledges data within a round trip, or answers with a closed
 * window (then nothing is unacknowledged, and no verdict is given while our bytes wait
 * for the window: the probes of a closed window back off to minutes), and it answers the
 * keepalive probes of an idle link every KEEP_INTVL_S. So LIVE_S of quiet with data
 * unacknowledged and retransmitted, or on an idle link, means the host is gone or cut off.
 * This is also the verdict where keepalive never gives up: a host whose own interface
 * drops what it sends retries its probes forever, not counting them as lost. None of it
 * depends on when either process runs: a rank that looks late, after a long deschedule,
 * reads the kernel's times. */
int comm_cpu__sock_silent(int fd, double live_s, double *quiet_s)
{
    struct tcp_info ti;
    socklen_t len = sizeof ti;
    memset(&ti, 0, sizeof ti);
    *quiet_s = 0;
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) < 0 ||
        len < offsetof(struct tcp_info, tcpi_last_ack_recv) + sizeof ti.tcpi_last_ack_recv)
        return 0;
    if (ti.tcpi_state != TCP_ESTABLISHED && ti.tcpi_state != TCP_CLOSE_WAIT &&
        ti.tcpi_state != TCP_FIN_WAIT1 && ti.tcpi_state != TCP_LAST_ACK && ti.tcpi_state != TCP_CLOSING)
        return 0; /* ended: its reads and writes say why */
    uint32_t ms =
        ti.tcpi_last_ack_recv < ti.tcpi_last_data_recv ? ti.tcpi_last_ack_recv : ti.tcpi_last_data_recv;
    *quiet_s = ms / 1000.0;
    if (*quiet_s < live_s)
        return 0;
    if (ti.tcpi_unacked > 0)
        return ti.tcpi_retransmits > 0;
    int unsent = 0;
    if (ioctl(fd, SIOCOUTQNSD, &unsent) < 0 || unsent > 0)
        return 0; /* bytes waiting for a closed window */
    return 1;
}

/* 1 when `fd` is ready for `events`, 0 at the deadline, -1 on a poll error. */
int comm_cpu__wait_fd(int fd, short events, double deadline)
{
    for (;;) {
        struct pollfd p = {fd, events, 0};
        int r = poll(&p, 1, comm_cpu__ms_until(deadline));
        if (r > 0)
            return 1;
        if (r == 0) {
            if (base_mono_s() >= deadline)
                return 0;
            continue;
        }
        if (errno != EINTR)
            return -1;
    }
}

/* Writes all of buf on a non-blocking socket before the deadline. */
int comm_cpu__send_all(int fd, const void *buf, size_t len, double deadline)
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
            int w = comm_cpu__wait_fd(fd, POLLOUT, deadline);
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
int comm_cpu__recv_all(int fd, void *buf, size_t len, double deadline)
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
            int w = comm_cpu__wait_fd(fd, POLLIN, deadline);
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
int comm_cpu__connect_retry(const struct cpu_addr *a, double deadline, int *refused)
{
    struct sockaddr_storage ss;
    socklen_t sl = comm_cpu__addr_to_sa(a, &ss);
    *refused = 0;
    for (;;) {
        int fd = socket(a->family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0)
            return -1;
        comm_cpu__sock_tune(fd);
        int r = connect(fd, (struct sockaddr *)&ss, sl);
        if (r < 0 && errno == EINPROGRESS) {
            int w = comm_cpu__wait_fd(fd, POLLOUT, deadline);
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
        if (base_mono_s() + 0.01 >= deadline) {
            errno = ETIMEDOUT;
            return -1;
        }
        base_sleep_s(0.01);
    }
}

int comm_cpu__fmt_err(char *buf, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (buf && cap)
        vsnprintf(buf, cap, fmt, ap);
    va_end(ap);
    return -1;
}

const char *comm_cpu__io_text(int io)
{
    return io == IO_TIMEOUT ? "timed out" : io == IO_CLOSED ? "connection closed" : strerror(errno);
}
