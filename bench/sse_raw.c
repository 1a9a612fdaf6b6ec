/* sse_raw.c — the floor of bench/server's SSE fan-out: the least a server can do to send
 * one event to N Server-Sent Events subscribers, here, on the same machine and the same
 * client (bench_sse_client). One thread, no HTTP library, no store, no event hub: every
 * 1/RATE s it formats one `loss` frame (with `ts`, the time the event exists, as a worker
 * writes it) and sends it as one HTTP chunk to each connection in turn, one send() each.
 * On SIGTERM/SIGINT every stream gets a final `state` frame and the terminating chunk.
 *
 * Usage: bench_sse_raw RATE   (events per second)
 * Prints "bench_sse_raw: listening on port N" on stderr. Requests are not parsed beyond
 * the end of their headers; every one gets the stream. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_CONNS 20000

struct conn {
    int fd;
    bool streaming; /* headers read, 200 sent */
    size_t seen;    /* bytes of the request's headers matched so far ("\r\n\r\n") */
};

static volatile sig_atomic_t stop;

static void on_signal(int sig)
{
    (void)sig;
    stop = 1;
}

static double now_real(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* One SSE frame as one HTTP chunk. */
static int chunk(char *out, size_t cap, long id, const char *event, const char *data)
{
    char frame[512];
    int n = snprintf(frame, sizeof frame, "id: %ld\nevent: %s\ndata: %s\n\n", id, event, data);
    return snprintf(out, cap, "%x\r\n%s\r\n", n, frame);
}

/* A subscriber whose socket buffer is full misses the frame (its client counts a gap);
 * one that failed otherwise is closed. */
static void send_all(struct conn *c, int n, const char *buf, size_t len)
{
    for (int i = 0; i < n; i++)
        if (c[i].fd >= 0 && c[i].streaming && send(c[i].fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT) < 0 &&
            errno != EAGAIN) {
            close(c[i].fd);
            c[i].fd = -1;
        }
}

int main(int argc, char **argv)
{
    double rate = argc > 1 ? atof(argv[1]) : 0;
    if (rate <= 0) {
        fprintf(stderr, "usage: %s RATE\n", argv[0]);
        return 2;
    }
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&sa, sizeof sa) || listen(lfd, 4096)) {
        perror("bench_sse_raw: listen");
        return 1;
    }
    socklen_t sl = sizeof sa;
    getsockname(lfd, (struct sockaddr *)&sa, &sl);
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    signal(SIGPIPE, SIG_IGN);
    fprintf(stderr, "bench_sse_raw: listening on port %d\n", ntohs(sa.sin_port));
    fflush(stderr);

    static struct conn conns[MAX_CONNS];
    int nconns = 0;
    int ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event le = {.events = EPOLLIN, .data.u32 = UINT32_MAX};
    epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &le);
    static const char head[] =
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
        "Transfer-Encoding: chunked\r\n\r\n";
    double period = 1.0 / rate, next = now_real() + period;
    long id = 0;
    char buf[1024];
    while (!stop) {
        double wait = next - now_real();
        struct epoll_event ev[256];
        int k = epoll_wait(ep, ev, 256, wait > 0 ? (int)(wait * 1e3) + 1 : 0);
        for (int i = 0; i < k; i++) {
            if (ev[i].data.u32 == UINT32_MAX) {
                int fd;
                while (nconns < MAX_CONNS &&
                       (fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
                    int one = 1;
                    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    conns[nconns] = (struct conn){.fd = fd};
                    struct epoll_event ce = {.events = EPOLLIN, .data.u32 = (uint32_t)nconns};
                    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ce);
                    nconns++;
                }
                continue;
            }
            struct conn *c = &conns[ev[i].data.u32];
            ssize_t r = c->fd >= 0 ? read(c->fd, buf, sizeof buf) : 0;
            if (r <= 0) {
                if (r == 0 || (errno != EAGAIN && errno != EINTR)) {
                    epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
                    close(c->fd);
                    c->fd = -1;
                }
                continue;
            }
            for (ssize_t j = 0; j < r && !c->streaming; j++) {
                c->seen = (buf[j] == "\r\n\r\n"[c->seen]) ? c->seen + 1 : (buf[j] == '\r');
                if (c->seen == 4) {
                    c->streaming = true;
                    if (send(c->fd, head, sizeof head - 1, MSG_NOSIGNAL) < 0) {
                        close(c->fd);
                        c->fd = -1;
                    }
                }
            }
        }
        if (now_real() >= next) {
            double ts = now_real();
            char data[256], out[1024];
            snprintf(data, sizeof data,
                     "{\"event\":\"loss\",\"job\":1,\"rank\":0,\"step\":%ld,\"loss\":0.25,\"ts\":%.6f}",
                     id + 1, ts);
            int n = chunk(out, sizeof out, ++id, "loss", data);
            send_all(conns, nconns, out, (size_t)n);
            next += period;
            if (next < now_real())
                next = now_real() + period;
        }
    }
    /* The end: a final state event, then the terminating chunk. */
    char out[1024];
    int n =
        chunk(out, sizeof out - 5, ++id, "state", "{\"event\":\"state\",\"job\":1,\"state\":\"cancelled\"}");
    memcpy(out + n, "0\r\n\r\n", 5);
    send_all(conns, nconns, out, (size_t)n + 5);
    for (int i = 0; i < nconns; i++)
        if (conns[i].fd >= 0)
            close(conns[i].fd);
    return 0;
}
