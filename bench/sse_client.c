/* sse_client.c — the subscribers of bench/server's SSE fan-out benchmark: N Server-Sent
 * Events streams of one job on one epoll thread, cheap enough that the client does not
 * compete much with the server for the CPU (a 2-core machine also runs the job's worker).
 *
 * Usage: bench_sse_client PORT PATH N NSRC WARM_S MEASURE_S END_S [SRC0]
 *   Connects N sockets to 127.0.0.1:PORT from source addresses 127.0.0.SRC0 .. +NSRC-1
 *   (SRC0 default 1; round robin: ddpd limits connections per IP), sends `GET PATH` with
 *   Accept: text/event-stream on each, reads everything (chunked encoding undone). After
 *   WARM_S seconds it measures for MEASURE_S seconds: for every `loss` frame whose `ts`
 *   (the worker's write time) is within the window, latency = the kernel's receive time of
 *   the read that completed the frame (SO_TIMESTAMPNS) − ts, and the same with the time
 *   epoll_wait returned. Then prints one JSON line with the statistics and keeps reading
 *   until every stream has ended (the terminating chunk) or END_S more seconds have passed,
 *   and prints a second JSON line ({"ended":..,"final":..,"in_order":..}: in_order counts
 *   the streams that got every frame from `id: 1` on, none missing or repeated, up to the
 *   job's final state event). Exit 0, or 1 on a setup error. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

struct conn {
    int fd;
    int status;      /* HTTP status; 0 until the headers are in */
    bool ended;      /* terminating chunk seen */
    bool closed;     /* EOF or error */
    bool final;      /* a final state event seen */
    long chunk_left; /* bytes of the current chunk still to come */
    int skip;        /* CRLF after a chunk still to skip */
    char *raw;       /* undecoded bytes (headers, chunk-size lines) */
    size_t nraw, craw;
    char *body; /* decoded bytes not yet split into frames */
    size_t nbody, cbody;
    long loss_frames;       /* loss frames within the window */
    long frames;            /* event frames in all */
    long first_id, last_id; /* `id:` of the first and the latest frame; 0 = none yet */
    long gaps;              /* frames whose id was not last_id + 1 (lost, repeated or reordered) */
};

static double now_real(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void append(char **buf, size_t *n, size_t *cap, const char *p, size_t len)
{
    if (*n + len + 1 > *cap) {
        size_t c = *cap ? *cap : 4096;
        while (c < *n + len + 1)
            c *= 2;
        *buf = realloc(*buf, c);
        if (!*buf) {
            perror("realloc");
            exit(1);
        }
        *cap = c;
    }
    memcpy(*buf + *n, p, len);
    *n += len;
    (*buf)[*n] = '\0';
}

static void consume(char *buf, size_t *n, size_t k)
{
    memmove(buf, buf + k, *n - k);
    *n -= k;
    buf[*n] = '\0';
}

static double *lat_k, *lat_u;
static size_t nlat, clat;

static void record(double k, double u)
{
    if (nlat == clat) {
        clat = clat ? clat * 2 : 65536;
        lat_k = realloc(lat_k, clat * sizeof *lat_k);
        lat_u = realloc(lat_u, clat * sizeof *lat_u);
        if (!lat_k || !lat_u) {
            perror("realloc");
            exit(1);
        }
    }
    lat_k[nlat] = k;
    lat_u[nlat++] = u;
}

/* Splits complete frames ("...\n\n") off the decoded body. */
static void frames(struct conn *c, double kt, double ut, double since, double until)
{
    for (;;) {
        char *end = c->nbody ? strstr(c->body, "\n\n") : NULL;
        if (!end)
            return;
        size_t len = (size_t)(end - c->body) + 2;
        *end = '\0';
        const char *f = c->body;
        if (f[0] != ':') { /* not a heartbeat comment */
            const char *idl = strncmp(f, "id: ", 4) == 0 ? f : strstr(f, "\nid: ");
            if (idl) {
                long id = strtol(idl + (idl == f ? 4 : 5), NULL, 10);
                if (c->frames == 0)
                    c->first_id = id;
                else if (id != c->last_id + 1)
                    c->gaps++;
                c->last_id = id;
            }
            c->frames++;
            if (strstr(f, "event: loss")) {
                const char *t = strstr(f, "\"ts\":");
                if (t) {
                    double ts = strtod(t + 5, NULL);
                    if (ts >= since && ts < until) {
                        record(kt - ts, ut - ts);
                        c->loss_frames++;
                    }
                }
            } else if (strstr(f, "\"state\":\"cancelled\"") || strstr(f, "\"state\":\"succeeded\"") ||
                       strstr(f, "\"state\":\"failed\"")) {
                c->final = true;
            }
        }
        consume(c->body, &c->nbody, len);
    }
}

static void feed(struct conn *c, const char *data, size_t len, double kt, double ut, double since,
                 double until)
{
    append(&c->raw, &c->nraw, &c->craw, data, len);
    for (;;) {
        if (!c->status) {
            char *e = strstr(c->raw, "\r\n\r\n");
            if (!e)
                break;
            c->status = c->nraw > 12 ? atoi(c->raw + 9) : -1;
            consume(c->raw, &c->nraw, (size_t)(e - c->raw) + 4);
            continue;
        }
        if (c->skip) {
            size_t k = (size_t)c->skip < c->nraw ? (size_t)c->skip : c->nraw;
            consume(c->raw, &c->nraw, k);
            c->skip -= (int)k;
            if (c->skip)
                break;
        }
        if (c->chunk_left == 0) {
            char *e = strstr(c->raw, "\r\n");
            if (!e)
                break;
            long size = strtol(c->raw, NULL, 16);
            consume(c->raw, &c->nraw, (size_t)(e - c->raw) + 2);
            if (size == 0) {
                c->ended = true;
                break;
            }
            c->chunk_left = size;
        }
        size_t k = (size_t)c->chunk_left < c->nraw ? (size_t)c->chunk_left : c->nraw;
        if (k == 0)
            break;
        append(&c->body, &c->nbody, &c->cbody, c->raw, k);
        consume(c->raw, &c->nraw, k);
        c->chunk_left -= (long)k;
        if (c->chunk_left == 0)
            c->skip = 2;
    }
    frames(c, kt, ut, since, until);
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *v, size_t n, double p)
{
    if (!n)
        return -1;
    size_t k = (size_t)(p / 100.0 * (double)(n - 1) + 0.5);
    return v[k < n ? k : n - 1];
}

int main(int argc, char **argv)
{
    if (argc != 8 && argc != 9) {
        fprintf(stderr, "usage: %s PORT PATH N NSRC WARM_S MEASURE_S END_S [SRC0]\n", argv[0]);
        return 2;
    }
    int src0 = argc == 9 ? atoi(argv[8]) : 1; /* the first source address: 127.0.0.SRC0 */
    int port = atoi(argv[1]);
    const char *path = argv[2];
    int n = atoi(argv[3]), nsrc = atoi(argv[4]);
    double warm = atof(argv[5]), measure = atof(argv[6]), end_s = atof(argv[7]);
    if (n < 1 || nsrc < 1 || src0 < 1 || src0 + nsrc > 251) {
        fprintf(stderr, "%s: bad N or NSRC\n", argv[0]);
        return 2;
    }
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    if (rl.rlim_cur < (rlim_t)n + 64) {
        rl.rlim_cur =
            rl.rlim_max == RLIM_INFINITY || rl.rlim_max > (rlim_t)n + 64 ? (rlim_t)n + 64 : rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    char req[512];
    int reqlen =
        snprintf(req, sizeof req,
                 "GET %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nAccept: text/event-stream\r\n\r\n", path, port);
    struct conn *cs = calloc((size_t)n, sizeof *cs);
    int ep = epoll_create1(EPOLL_CLOEXEC);
    double t_conn = now_real();
    for (int i = 0; i < n; i++) {
        struct conn *c = &cs[i];
        c->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (c->fd < 0) {
            fprintf(stderr, "%s: socket %d: %s\n", argv[0], i, strerror(errno));
            return 1;
        }
        int one = 1;
        setsockopt(c->fd, SOL_SOCKET, SO_TIMESTAMPNS, &one, sizeof one);
        struct sockaddr_in src = {.sin_family = AF_INET,
                                  .sin_addr.s_addr = htonl(0x7f000000u + (uint32_t)(src0 + i % nsrc))};
        struct sockaddr_in dst = {
            .sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(0x7f000001u)};
        if (bind(c->fd, (struct sockaddr *)&src, sizeof src) ||
            connect(c->fd, (struct sockaddr *)&dst, sizeof dst) ||
            write(c->fd, req, (size_t)reqlen) != reqlen) {
            fprintf(stderr, "%s: connection %d: %s\n", argv[0], i, strerror(errno));
            return 1;
        }
        struct epoll_event ev = {.events = EPOLLIN, .data.u32 = (uint32_t)i};
        epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &ev);
    }
    double t_connected = now_real();
    double since = t_connected + warm, until = since + measure;
    struct epoll_event evs[256];
    char buf[65536];
    char cbuf[CMSG_SPACE(sizeof(struct timespec)) * 2];
    bool reported = false;
    double stop_at = until + end_s;
    for (;;) {
        double now = now_real();
        if (!reported && now >= until) {
            qsort(lat_k, nlat, sizeof *lat_k, cmp);
            qsort(lat_u, nlat, sizeof *lat_u, cmp);
            int ok200 = 0, closed = 0;
            long minf = -1, maxf = 0;
            for (int i = 0; i < n; i++) {
                ok200 += cs[i].status == 200;
                closed += cs[i].closed;
                if (minf < 0 || cs[i].loss_frames < minf)
                    minf = cs[i].loss_frames;
                if (cs[i].loss_frames > maxf)
                    maxf = cs[i].loss_frames;
            }
            printf(
                "{\"subscribers\":%d,\"ok200\":%d,\"closed\":%d,\"samples\":%zu,\"connect_s\":%.3f,"
                "\"k_p50\":%.6f,\"k_p99\":%.6f,\"k_max\":%.6f,\"u_p50\":%.6f,\"u_p99\":%.6f,\"u_max\":%.6f,"
                "\"frames_min\":%ld,\"frames_max\":%ld}\n",
                n, ok200, closed, nlat, t_connected - t_conn, pct(lat_k, nlat, 50), pct(lat_k, nlat, 99),
                nlat ? lat_k[nlat - 1] : -1, pct(lat_u, nlat, 50), pct(lat_u, nlat, 99),
                nlat ? lat_u[nlat - 1] : -1, minf, maxf);
            fflush(stdout);
            reported = true;
        }
        if (reported) {
            int open = 0;
            for (int i = 0; i < n; i++)
                open += !cs[i].ended && !cs[i].closed;
            if (!open || now >= stop_at)
                break;
        }
        int k = epoll_wait(ep, evs, 256, 100);
        double ut = now_real();
        for (int e = 0; e < k; e++) {
            struct conn *c = &cs[evs[e].data.u32];
            struct iovec iov = {.iov_base = buf, .iov_len = sizeof buf - 1};
            struct msghdr mh = {
                .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof cbuf};
            ssize_t r = recvmsg(c->fd, &mh, MSG_DONTWAIT);
            if (r < 0 && (errno == EAGAIN || errno == EINTR))
                continue;
            if (r <= 0) {
                c->closed = true;
                epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
                continue;
            }
            double kt = ut;
            for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm))
                if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_TIMESTAMPNS) {
                    struct timespec ts;
                    memcpy(&ts, CMSG_DATA(cm), sizeof ts);
                    kt = (double)ts.tv_sec + ts.tv_nsec * 1e-9;
                }
            feed(c, buf, (size_t)r, kt, ut, since, until);
        }
    }
    /* In order: every frame from id 1 on, none missing or repeated, up to the final one. */
    int ended = 0, final = 0, in_order = 0;
    long gaps = 0, fmin = -1, fmax = 0, last_min = -1, last_max = 0;
    for (int i = 0; i < n; i++) {
        struct conn *c = &cs[i];
        ended += c->ended;
        final += c->final;
        gaps += c->gaps;
        in_order += c->final && c->gaps == 0 && c->first_id == 1 && c->last_id == c->frames;
        fmin = fmin < 0 || c->frames < fmin ? c->frames : fmin;
        fmax = c->frames > fmax ? c->frames : fmax;
        last_min = last_min < 0 || c->last_id < last_min ? c->last_id : last_min;
        last_max = c->last_id > last_max ? c->last_id : last_max;
        close(c->fd);
    }
    printf("{\"ended\":%d,\"final\":%d,\"in_order\":%d,\"gaps\":%ld,\"frames_min\":%ld,\"frames_max\":%ld,"
           "\"last_id_min\":%ld,\"last_id_max\":%ld}\n",
           ended, final, in_order, gaps, fmin, fmax, last_min, last_max);
    return 0;
}
