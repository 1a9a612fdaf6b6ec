/* http.c — the HTTP layer over libmicrohttpd: route table, the checks made before any
 * handler runs, error bodies, responses and suspend/resume streams. Holds no job logic;
 * everything it knows about a request comes from http.h's route table.
 *
 * A request's life on the access handler: the first call (headers complete) matches the
 * route, checks auth and a declared Content-Length; upload calls collect or drop the body
 * while counting it; the final call runs the handler and queues the response. Answering
 * on the final call, not the first, lets libmicrohttpd keep the connection alive. */
#include "http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../base/alloc.h"
#include "../base/check.h"
#include "../base/clock.h"
#include "../base/parse.h"

#define MAX_SEGMENTS 16
#define MAX_CAPTURES HTTP_MAX_CAPTURES
#define MAX_HEADERS  8
#define STREAM_BLOCK (16 * 1024)

/* ---- addresses ------------------------------------------------------------------------ */

/* An IPv4 address in any numeric form inet_aton takes ("127.0.0.1", "127.1", "0x7f.1"),
 * nothing else around it (inet_aton itself stops at white space and ignores the rest). */
static bool ipv4_parse(const char *h, struct in_addr *a)
{
    return h[0] && strspn(h, "0123456789abcdefABCDEFxX.") == strlen(h) && inet_aton(h, a) != 0;
}

/* "ADDR:PORT" / "[ADDR6]:PORT" -> sockaddr. ADDR is numeric (IPv4 in any form inet_aton
 * takes, "127.1" included) or "localhost" (127.0.0.1: the loopback name every host has,
 * resolved without a resolver). False with the reason in why[cap] (may be NULL). */
static bool addr_parse_why(const char *addr, struct sockaddr_storage *ss, socklen_t *len, char *why,
                           size_t cap)
{
    char host[INET6_ADDRSTRLEN + 1];
    const char *port;
    char scratch[8];
    if (!why) {
        why = scratch;
        cap = sizeof scratch;
    }
    memset(ss, 0, sizeof *ss);
    if (!addr || !*addr) {
        snprintf(why, cap, "no address (give ADDR:PORT, e.g. 127.0.0.1:8080)");
        return false;
    }
    bool v6 = addr[0] == '[';
    if (v6) {
        const char *end = strchr(addr, ']');
        if (!end || end[1] != ':' || (size_t)(end - addr - 1) >= sizeof host) {
            snprintf(why, cap, "an IPv6 address is written [ADDR]:PORT, e.g. [::1]:8080");
            return false;
        }
        memcpy(host, addr + 1, (size_t)(end - addr - 1));
        host[end - addr - 1] = '\0';
        port = end + 2;
    } else {
        const char *colon = strrchr(addr, ':');
        if (!colon || (size_t)(colon - addr) >= sizeof host) {
            snprintf(why, cap, "no port (give ADDR:PORT, e.g. 127.0.0.1:8080; port 0 = any free port)");
            return false;
        }
        memcpy(host, addr, (size_t)(colon - addr));
        host[colon - addr] = '\0';
        port = colon + 1;
    }
    if (!*port || strlen(port) > 5 || strspn(port, "0123456789") != strlen(port) ||
        strtol(port, NULL, 10) > 65535) {
        snprintf(why, cap, "port \"%.16s\" is not a number from 0 to 65535", port);
        return false;
    }
    long p = strtol(port, NULL, 10);
    if (v6) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)ss;
        if (inet_pton(AF_INET6, host, &a->sin6_addr) != 1) {
            snprintf(why, cap, "\"%s\" is not an IPv6 address", host);
            return false;
        }
        a->sin6_family = AF_INET6;
        a->sin6_port = htons((uint16_t)p);
        *len = sizeof *a;
    } else {
        struct sockaddr_in *a = (struct sockaddr_in *)ss;
        if (!strcasecmp(host, "localhost"))
            a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        else if (!ipv4_parse(host, &a->sin_addr)) {
            snprintf(why, cap, "\"%s\" is not an IPv4 address or localhost (host names are not looked up)",
                     host);
            return false;
        }
        a->sin_family = AF_INET;
        a->sin_port = htons((uint16_t)p);
        *len = sizeof *a;
    }
    return true;
}

static bool addr_parse(const char *addr, struct sockaddr_storage *ss, socklen_t *len)
{
    return addr_parse_why(addr, ss, len, NULL, 0);
}

bool http_addr_check(const char *addr, char *why, size_t cap)
{
    struct sockaddr_storage ss;
    socklen_t len;
    return addr_parse_why(addr, &ss, &len, why, cap);
}

bool http_addr_is_loopback(const char *addr)
{
    struct sockaddr_storage ss;
    socklen_t len;
    if (!addr_parse(addr, &ss, &len))
        return false;
    if (ss.ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)&ss;
        return (ntohl(a->sin_addr.s_addr) >> 24) == 127;
    }
    const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)&ss;
    if (IN6_IS_ADDR_LOOPBACK(&a->sin6_addr))
        return true;
    return IN6_IS_ADDR_V4MAPPED(&a->sin6_addr) && a->sin6_addr.s6_addr[12] == 127;
}

/* A numeric port after a host: "" or ":1".. ":65535" (digits only). */
static bool port_ok(const char *p)
{
    if (!*p)
        return true;
    if (*p != ':' || !p[1] || strlen(p + 1) > 5 || strspn(p + 1, "0123456789") != strlen(p + 1))
        return false;
    return strtol(p + 1, NULL, 10) <= 65535;
}

bool http_host_is_local(const char *host, bool any_ip)
{
    char h[INET6_ADDRSTRLEN + 1];
    const char *rest;
    if (!host)
        return false;
    if (host[0] == '[') {
        const char *end = strchr(host, ']');
        if (!end || (size_t)(end - host - 1) >= sizeof h)
            return false;
        memcpy(h, host + 1, (size_t)(end - host - 1));
        h[end - host - 1] = '\0';
        rest = end + 1;
        struct in6_addr a6;
        if (!port_ok(rest) || inet_pton(AF_INET6, h, &a6) != 1)
            return false;
        return any_ip || IN6_IS_ADDR_LOOPBACK(&a6);
    }
    size_t n = strcspn(host, ":");
    if (n == 0 || n >= sizeof h)
        return false;
    memcpy(h, host, n);
    h[n] = '\0';
    rest = host + n;
    if (!port_ok(rest))
        return false;
    if (!strcasecmp(h, "localhost"))
        return true;
    /* Dotted quad only: inet_pton refuses the short forms ("127.1") and octal. */
    struct in_addr a4;
    if (inet_pton(AF_INET, h, &a4) != 1)
        return false;
    return any_ip || (ntohl(a4.s_addr) >> 24) == 127;
}

bool http_origin_is_host(const char *origin, const char *host)
{
    if (!origin || !host || !*host)
        return false;
    const char *o = NULL;
    if (!strncasecmp(origin, "http://", 7))
        o = origin + 7;
    else if (!strncasecmp(origin, "https://", 8))
        o = origin + 8;
    return o && !strcasecmp(o, host);
}

/* ---- text helpers ---------------------------------------------------------------------- */

/* A growable string for the metrics text; aborts on OOM (small, internal). */
struct sbuf {
    char *p;
    size_t len, cap;
};

static void sbuf_printf(struct sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sbuf_printf(struct sbuf *b, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        ASSERT(n >= 0);
        if (b->p && b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap ? b->cap * 2 : 1024;
        while (cap < b->len + (size_t)n + 1)
            cap *= 2;
        char *q = realloc(b->p, cap);
        ASSERT(q);
        b->p = q;
        b->cap = cap;
    }
}

/* Client text inside our messages: at most `max` bytes, printable ASCII only. */
static void clean_copy(char *dst, size_t cap, const char *src, size_t max)
{
    size_t i = 0, n = strlen(src);
    for (; i < n && i < max && i + 1 < cap; i++) {
        unsigned char c = (unsigned char)src[i];
        dst[i] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
    }
    if (i < n && i + 4 < cap && i == max) {
        memcpy(dst + i, "...", 3);
        i += 3;
    }
    dst[i < cap ? i : cap - 1] = '\0';
}

/* json_string that never fails on bad UTF-8 (replaces non-ASCII bytes then). */
static json_t *json_string_lossy(const char *s)
{
    json_t *j = json_string(s);
    if (j)
        return j;
    char *c = xstrdup(s);
    for (char *p = c; *p; p++)
        if ((unsigned char)*p >= 0x80)
            *p = '?';
    j = json_string(c);
    free(c);
    return j;
}

/* ---- compiled routes and counters ------------------------------------------------------ */

struct route_rt {
    const struct http_route *r;
    int nseg;
    const char *seg[MAX_SEGMENTS];
    size_t seglen[MAX_SEGMENTS];
    bool capture[MAX_SEGMENTS];
    int row; /* index of its pattern in the counters */
};

/* Statuses counted one by one; anything else counts as "other". */
static const int status_list[] = {200, 201, 202, 204, 206, 301, 302, 304, 400, 401, 403, 404, 405,
                                  408, 409, 413, 415, 422, 429, 431, 500, 501, 502, 503, 504};
#define NSTATUS ((int)(sizeof status_list / sizeof status_list[0]) + 1)

static int status_index(int status)
{
    for (int i = 0; i < NSTATUS - 1; i++)
        if (status_list[i] == status)
            return i;
    return NSTATUS - 1;
}

/* Splits "/a/b/c" into segments (pointers into `path`). -1 when not a path or too deep. */
static int split_path(const char *path, const char **seg, size_t *len)
{
    if (path[0] != '/')
        return -1;
    if (path[1] == '\0')
        return 0;
    int n = 0;
    const char *p = path + 1;
    for (;;) {
        if (n == MAX_SEGMENTS)
            return -1;
        const char *slash = strchr(p, '/');
        seg[n] = p;
        len[n] = slash ? (size_t)(slash - p) : strlen(p);
        n++;
        if (!slash)
            return n;
        p = slash + 1;
    }
}

/* A positive int64 in canonical decimal ("7", not "07", "+7" or "-7"). */
static bool parse_id(const char *s, size_t n, int64_t *out)
{
    if (n == 0 || n > 19 || s[0] == '0')
        return false;
    int64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return false;
        int d = s[i] - '0';
        if (v > (INT64_MAX - d) / 10)
            return false;
        v = v * 10 + d;
    }
    *out = v;
    return true;
}

static bool route_compile(struct route_rt *rt, const struct http_route *r)
{
    memset(rt, 0, sizeof *rt);
    rt->r = r;
    if (!r->method || !r->pattern || !r->handler)
        return false;
    rt->nseg = split_path(r->pattern, rt->seg, rt->seglen);
    if (rt->nseg < 0)
        return false;
    int captures = 0;
    for (int i = 0; i < rt->nseg; i++) {
        const char *s = rt->seg[i];
        size_t n = rt->seglen[i];
        if (n == 0)
            return false;
        bool open = memchr(s, '{', n) != NULL, close = memchr(s, '}', n) != NULL;
        if (s[0] == '{' && s[n - 1] == '}' && n > 2 && !memchr(s + 1, '{', n - 2) &&
            !memchr(s + 1, '}', n - 2)) {
            rt->capture[i] = true;
            if (++captures > MAX_CAPTURES)
                return false;
        } else if (open || close) {
            return false;
        }
    }
    return true;
}

static bool route_match(const struct route_rt *rt, int nseg, const char **seg, const size_t *len,
                        int64_t *ids)
{
    if (nseg != rt->nseg)
        return false;
    memset(ids, 0, MAX_CAPTURES * sizeof *ids);
    int k = 0;
    for (int i = 0; i < nseg; i++) {
        if (rt->capture[i]) {
            if (!parse_id(seg[i], len[i], &ids[k++]))
                return false;
        } else if (len[i] != rt->seglen[i] || memcmp(seg[i], rt->seg[i], len[i]) != 0) {
            return false;
        }
    }
    return true;
}

/* The row of `rts` that answers `method` (HEAD as GET) on `url`, with its captures in ids;
 * NULL when none does. *path_hit is the first row whose pattern matches the path whatever
 * its method (NULL: a 404), and `allow` lists the methods of the rows that match it. */
static const struct route_rt *route_find(const struct route_rt *rts, size_t n, const char *method,
                                         const char *url, int64_t *ids, const struct route_rt **path_hit,
                                         char *allow, size_t cap)
{
    const char *seg[MAX_SEGMENTS];
    size_t len[MAX_SEGMENTS];
    int64_t found[MAX_CAPTURES];
    int nseg = split_path(url, seg, len);
    const char *want = !strcmp(method, "HEAD") ? "GET" : method;
    size_t used = 0;
    *path_hit = NULL;
    if (cap)
        allow[0] = '\0';
    for (size_t i = 0; nseg >= 0 && i < n; i++) {
        const struct route_rt *rt = &rts[i];
        if (!route_match(rt, nseg, seg, len, found))
            continue;
        if (!*path_hit)
            *path_hit = rt;
        if (!strcmp(rt->r->method, want)) {
            memcpy(ids, found, sizeof found);
            return rt;
        }
        if (!strstr(allow, rt->r->method)) {
            int k = snprintf(allow + used, cap - used, "%s%s%s", used ? ", " : "", rt->r->method,
                             !strcmp(rt->r->method, "GET") ? ", HEAD" : "");
            if (k > 0 && (size_t)k < cap - used)
                used += (size_t)k;
        }
    }
    return NULL;
}

int http_route_lookup(const struct http_route *routes, size_t n, const char *method, const char *path,
                      int64_t *ids, char *allow, size_t allow_cap)
{
    struct route_rt *rts = xcalloc(n ? n : 1, sizeof *rts);
    const struct route_rt *hit = NULL, *rt = NULL;
    int rc = -3;
    for (size_t i = 0; i < n; i++)
        if (!route_compile(&rts[i], &routes[i]))
            goto out;
    memset(ids, 0, MAX_CAPTURES * sizeof *ids);
    rt = route_find(rts, n, method, path, ids, &hit, allow, allow_cap);
    rc = rt ? (int)(rt - rts) : hit ? -2 : -1;
out:
    free(rts);
    return rc;
}

/* ---- the server and its connections ----------------------------------------------------- */

/* One TCP connection, from libmicrohttpd's STARTED to CLOSED notification. */
struct conn {
    struct conn *prev, *next;
    int fd;
    int64_t deadline; /* monotonic ms by which the current request must be in; 0 = none */
    bool cut;
};

struct http_server {
    struct MHD_Daemon *d;
    int listen_fd;
    int port;
    char listen[128];
    struct http_config cfg;
    char *token;
    size_t token_len;
    char *cors;           /* Access-Control-Allow-Origin, NULL = none */
    bool host_check;      /* no token: AUTH routes answer only local Host names (http.h) */
    bool listen_loopback; /* the listen address is a loopback one */
    size_t max_body;
    unsigned request_timeout_ms, idle_timeout_s;

    struct route_rt *routes;
    size_t nroutes;
    const char **patterns; /* one per counters row; row npatterns is "unmatched" */
    size_t npatterns;
    atomic_ullong *counts; /* [(npatterns + 1) * NSTATUS] */

    pthread_mutex_t mu; /* conns, streams, nstreams, slow_total, stopping, reaper_stop */
    pthread_cond_t cv;
    struct conn *conns;
    struct http_stream *streams;
    size_t nstreams;
    unsigned long long slow_total;
    bool stopping;
    bool reaper_stop;
    bool reaper_started;
    pthread_t reaper;

    pthread_mutex_t dmu; /* deferred requests: their parked/answered, ndeferred */
    pthread_cond_t dcv;
    size_t ndeferred; /* deferred and not completed yet (answer sent, or connection ended) */
};

struct header {
    char *name, *value;
};

struct http_request {
    struct http_server *srv;
    bool begun;        /* the access handler's first call has run */
    unsigned nparams;  /* query parameters in the raw target (uri_seen) */
    size_t target_len; /* bytes of the raw target */
    struct MHD_Connection *mc;
    struct conn *conn;
    const char *method;
    const char *url;
    const struct route_rt *route;
    int row;
    int64_t ids[MAX_CAPTURES];

    /* Decided before the handler: an error to answer with (DDPD_OK = none). */
    ddpd_err pending;
    struct ddpd_error perr;
    bool query_failed; /* the handler's EJSON came from a query helper */
    bool preflight;    /* a CORS preflight, answered 204 before any handler */

    size_t limit;
    uint64_t received;
    bool too_big;
    bool keep_body;
    char *body;
    size_t body_len, body_cap;
    json_t *json;

    struct MHD_Response *resp;
    int status;
    struct header hdr[MAX_HEADERS];
    int nhdr;
    char *etag;
    struct http_stream *stream; /* the request's reference */

    /* An answer made on another thread (http_defer); parked and answered under
     * srv->dmu. */
    bool deferred, parked, answered;
    ddpd_err deferred_rc;
    struct ddpd_error deferred_err;
};

/* A streaming response. References: the owner's, the MHD response's and the request's. */
struct http_stream {
    pthread_mutex_t mu;
    int refs;
    /* Under srv->mu: the server's list; srv is NULL once the MHD side finished. */
    struct http_server *srv;
    struct http_stream *prev, *next;
    /* Under mu. */
    struct MHD_Connection *mc; /* NULL once the request ended */
    int fd;                    /* its socket while mc != NULL */
    char *buf;
    size_t off, len, cap, max; /* queued bytes are buf[off .. off+len) */
    bool suspended, owner_closed, ended, finished;
    bool pulled_out; /* pull returned -1 */
    bool woken;      /* http_stream_wake since the last pull began */
    enum http_stream_end why;
    void (*on_close)(void *arg, enum http_stream_end why);
    void *arg;
    long (*pull)(void *arg, char *buf, size_t cap);
};

static void count(struct http_server *s, int row, int status)
{
    atomic_fetch_add_explicit(&s->counts[(size_t)row * NSTATUS + status_index(status)], 1,
                              memory_order_relaxed);
}

/* ---- streams ------------------------------------------------------------------------------ */

static void stream_release(struct http_stream *st)
{
    pthread_mutex_lock(&st->mu);
    int left = --st->refs;
    pthread_mutex_unlock(&st->mu);
    if (left)
        return;
    pthread_mutex_destroy(&st->mu);
    free(st->buf);
    free(st);
}

/* Under st->mu: wakes the connection so the content reader runs again. */
static void stream_wake(struct http_stream *st)
{
    if (st->suspended && st->mc) {
        st->suspended = false;
        MHD_resume_connection(st->mc);
    }
}

/* Under st->mu: ends the stream for writers and frees what is queued. */
static void stream_end_locked(struct http_stream *st, enum http_stream_end why)
{
    if (st->ended)
        return;
    st->ended = true;
    st->why = why;
    free(st->buf);
    st->buf = NULL;
    st->off = st->len = st->cap = 0;
}

/* The MHD side is done with the stream (response freed or request ended): the first call
 * settles why it ended, unlinks it and calls on_close. On an HTTP thread. */
static void stream_finish(struct http_stream *st, bool completed_ok)
{
    pthread_mutex_lock(&st->mu);
    if (st->finished) {
        pthread_mutex_unlock(&st->mu);
        return;
    }
    st->finished = true;
    st->mc = NULL;
    st->fd = -1;
    st->suspended = false;
    bool done = (st->owner_closed || st->pulled_out) && st->len == 0 && (completed_ok || !st->ended);
    stream_end_locked(st, done ? HTTP_STREAM_DONE : HTTP_STREAM_GONE);
    enum http_stream_end why = st->why;
    pthread_mutex_unlock(&st->mu);

    struct http_server *s = st->srv;
    pthread_mutex_lock(&s->mu);
    if (st->prev)
        st->prev->next = st->next;
    else
        s->streams = st->next;
    if (st->next)
        st->next->prev = st->prev;
    st->prev = st->next = NULL;
    s->nstreams--;
    if (why == HTTP_STREAM_SLOW)
        s->slow_total++;
    st->srv = NULL;
    pthread_mutex_unlock(&s->mu);

    if (st->on_close)
        st->on_close(st->arg, why);
}

/* libmicrohttpd's content reader: written bytes first, then the owner's pull; with
 * nothing to send it parks (suspends) the connection, which a write, wake, close or the
 * server's shutdown resumes. Never returns 0 without suspending (that would spin). */
static ssize_t stream_read(void *cls, uint64_t pos, char *out, size_t max)
{
    (void)pos;
    struct http_stream *st = cls;
    pthread_mutex_lock(&st->mu);
    for (;;) {
        ssize_t n;
        if (st->ended) {
            n = MHD_CONTENT_READER_END_WITH_ERROR;
        } else if (st->len > 0) {
            size_t k = st->len < max ? st->len : max;
            memcpy(out, st->buf + st->off, k);
            st->off += k;
            st->len -= k;
            if (st->len == 0)
                st->off = 0;
            n = (ssize_t)k;
        } else if (st->owner_closed || st->pulled_out) {
            n = MHD_CONTENT_READER_END_OF_STREAM;
        } else if (st->pull) {
            st->woken = false;
            pthread_mutex_unlock(&st->mu);
            long got = st->pull(st->arg, out, max);
            pthread_mutex_lock(&st->mu);
            if (got > 0 && !st->ended) {
                n = (ssize_t)(got < (long)max ? got : (long)max);
            } else {
                if (got < 0)
                    st->pulled_out = true;
                else if (got == 0 && !st->woken && !st->ended && !st->owner_closed && st->len == 0)
                    goto park;
                continue; /* something changed meanwhile: look again */
            }
        } else {
            goto park;
        }
        pthread_mutex_unlock(&st->mu);
        return n;
    }
park:
    /* Under mu, so a writer or waker sees `suspended` and resumes the connection. */
    st->suspended = true;
    MHD_suspend_connection(st->mc);
    pthread_mutex_unlock(&st->mu);
    return 0;
}

static void stream_response_free(void *cls)
{
    struct http_stream *st = cls;
    stream_finish(st, false);
    stream_release(st);
}

ddpd_err http_stream_write(struct http_stream *st, const void *data, size_t len)
{
    ddpd_err rc = DDPD_OK;
    pthread_mutex_lock(&st->mu);
    if (st->ended || st->owner_closed) {
        rc = DDPD_ECANCELED;
    } else if (len > st->max - st->len) {
        /* The client does not keep up: drop it rather than buffer without bound. Cutting
         * the socket makes libmicrohttpd notice at once even while its send is stuck. */
        stream_end_locked(st, HTTP_STREAM_SLOW);
        if (st->mc && st->fd >= 0)
            shutdown(st->fd, SHUT_RDWR);
        stream_wake(st);
        rc = DDPD_EBUSY;
    } else if (len > 0) {
        if (st->off + st->len + len > st->cap) {
            if (st->len + len <= st->cap) {
                memmove(st->buf, st->buf + st->off, st->len);
            } else {
                size_t cap = st->cap ? st->cap : 4096;
                while (cap < st->len + len)
                    cap *= 2;
                if (cap > st->max)
                    cap = st->max;
                char *b = xmalloc(cap);
                if (st->len)
                    memcpy(b, st->buf + st->off, st->len);
                free(st->buf);
                st->buf = b;
                st->cap = cap;
            }
            st->off = 0;
        }
        memcpy(st->buf + st->off + st->len, data, len);
        st->len += len;
        stream_wake(st);
    }
    pthread_mutex_unlock(&st->mu);
    return rc;
}

void http_stream_wake(struct http_stream *st)
{
    pthread_mutex_lock(&st->mu);
    st->woken = true;
    stream_wake(st);
    pthread_mutex_unlock(&st->mu);
}

void http_stream_close(struct http_stream *st)
{
    if (!st)
        return;
    pthread_mutex_lock(&st->mu);
    ASSERT(!st->owner_closed);
    st->owner_closed = true;
    stream_wake(st);
    pthread_mutex_unlock(&st->mu);
    stream_release(st);
}

/* ---- responses ------------------------------------------------------------------------------ */

static bool responded(struct http_request *req)
{
    return req->resp != NULL;
}

static void set_response(struct http_request *req, int status, struct MHD_Response *r)
{
    ASSERT(r);
    req->resp = r;
    req->status = status;
}

static void add_content_type(struct MHD_Response *r, const char *ct)
{
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ct);
}

ddpd_err http_respond_bytes(struct http_request *req, int status, const char *content_type, const void *data,
                            size_t len)
{
    if (responded(req))
        return DDPD_EINTERNAL;
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)data, MHD_RESPMEM_MUST_COPY);
    if (!r)
        return DDPD_ENOMEM;
    add_content_type(r, content_type ? content_type : "text/plain; charset=utf-8");
    set_response(req, status, r);
    return DDPD_OK;
}

ddpd_err http_respond_text(struct http_request *req, int status, const char *text)
{
    return http_respond_bytes(req, status, NULL, text, strlen(text));
}

ddpd_err http_respond_empty(struct http_request *req, int status)
{
    if (responded(req))
        return DDPD_EINTERNAL;
    struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (!r)
        return DDPD_ENOMEM;
    set_response(req, status, r);
    return DDPD_OK;
}

ddpd_err http_respond_json(struct http_request *req, int status, json_t *body)
{
    if (!body)
        return DDPD_EINTERNAL;
    if (responded(req)) {
        json_decref(body);
        return DDPD_EINTERNAL;
    }
    char *text = json_dumps(body, JSON_COMPACT | JSON_ENCODE_ANY);
    json_decref(body);
    if (!text)
        return DDPD_ENOMEM;
    size_t n = strlen(text);
    char *t = realloc(text, n + 2);
    if (!t) {
        free(text);
        return DDPD_ENOMEM;
    }
    t[n] = '\n';
    t[n + 1] = '\0';
    struct MHD_Response *r = MHD_create_response_from_buffer(n + 1, t, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(t);
        return DDPD_ENOMEM;
    }
    add_content_type(r, "application/json");
    set_response(req, status, r);
    return DDPD_OK;
}

ddpd_err http_respond_file(struct http_request *req, const char *path, const char *content_type,
                           const char *cache_control, struct ddpd_error *err)
{
    if (responded(req))
        return ddpd_error_set(err, DDPD_EINTERNAL, "", "a response was already set");
    /* O_NONBLOCK: a FIFO where a file was expected must not hold the HTTP thread in
     * open (it is then refused as not a regular file). */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        if (fd >= 0)
            close(fd);
        return ddpd_error_set(err, DDPD_ENOTFOUND, path, "no such file");
    }
    /* libmicrohttpd owns fd from here (it closes it with the response). */
    struct MHD_Response *r = MHD_create_response_from_fd64((uint64_t)st.st_size, fd);
    if (!r) {
        close(fd);
        return ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory");
    }
    add_content_type(r, content_type ? content_type : "application/octet-stream");
    if (cache_control)
        MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, cache_control);
    set_response(req, 200, r);
    char etag[96];
    snprintf(etag, sizeof etag, "\"%llx-%llx-%llx\"", (unsigned long long)st.st_ino,
             (unsigned long long)st.st_size,
             (unsigned long long)st.st_mtim.tv_sec * 1000000000ull + (unsigned long long)st.st_mtim.tv_nsec);
    http_response_etag(req, etag);
    return DDPD_OK;
}

void http_response_header(struct http_request *req, const char *name, const char *value)
{
    if (req->nhdr == MAX_HEADERS)
        return;
    req->hdr[req->nhdr].name = xstrdup(name);
    req->hdr[req->nhdr].value = xstrdup(value);
    req->nhdr++;
}

void http_response_etag(struct http_request *req, const char *etag)
{
    free(req->etag);
    req->etag = xstrdup(etag);
}

static void clear_headers(struct http_request *req)
{
    for (int i = 0; i < req->nhdr; i++) {
        free(req->hdr[i].name);
        free(req->hdr[i].value);
    }
    req->nhdr = 0;
    free(req->etag);
    req->etag = NULL;
}

ddpd_err http_respond_stream(struct http_request *req, const struct http_stream_opts *o,
                             struct http_stream **out, struct ddpd_error *err)
{
    *out = NULL;
    if (responded(req))
        return ddpd_error_set(err, DDPD_EINTERNAL, "", "a response was already set");
    struct http_stream *st = xcalloc(1, sizeof *st);
    pthread_mutex_init(&st->mu, NULL);
    st->refs = 3; /* owner, response, request */
    st->mc = req->mc;
    st->fd = req->conn ? req->conn->fd : -1;
    st->max = o->max_buffer ? o->max_buffer : (size_t)1 << 20;
    st->on_close = o->on_close;
    st->arg = o->arg;
    st->pull = o->pull;

    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, STREAM_BLOCK, stream_read,
                                                               st, stream_response_free);
    if (!r) {
        pthread_mutex_destroy(&st->mu);
        free(st);
        return ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory");
    }
    add_content_type(r, o->content_type ? o->content_type : "text/event-stream");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(r, "X-Accel-Buffering", "no");

    struct http_server *s = req->srv;
    pthread_mutex_lock(&s->mu);
    bool stopping = s->stopping;
    if (!stopping) {
        st->srv = s;
        st->next = s->streams;
        if (s->streams)
            s->streams->prev = st;
        s->streams = st;
        s->nstreams++;
    }
    pthread_mutex_unlock(&s->mu);
    if (stopping) {
        st->on_close = NULL; /* never opened: the caller hears it from the return value */
        st->finished = true;
        st->refs = 1;
        MHD_destroy_response(r); /* drops the response's reference */
        return ddpd_error_set(err, DDPD_EBUSY, "", "the server is shutting down");
    }
    set_response(req, 200, r);
    req->stream = st;
    *out = st;
    return DDPD_OK;
}

/* The error body of CONTRACT.md §7 with the status of the error table. */
static void respond_error(struct http_request *req, ddpd_err code, const struct ddpd_error *e)
{
    const char *cs = (code == DDPD_EJSON && req->query_failed) ? "bad_query" : ddpd_err_code(code);
    const char *msg = e && e->message[0] ? e->message : ddpd_err_text(code);
    json_t *body = json_object();
    json_t *inner = json_object();
    json_object_set_new(inner, "code", json_string(cs));
    json_object_set_new(inner, "message", json_string_lossy(msg));
    json_object_set_new(inner, "path", json_string_lossy(e ? e->path : ""));
    json_object_set_new(body, "error", inner);
    if (http_respond_json(req, ddpd_err_http(code), body) != DDPD_OK) {
        /* Out of memory while rendering: a bodyless answer with the right status. */
        if (!req->resp)
            http_respond_empty(req, ddpd_err_http(code));
    }
}

static void set_pending(struct http_request *req, ddpd_err code, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void set_pending(struct http_request *req, ddpd_err code, const char *path, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ddpd_error_vset(&req->perr, code, path, fmt, ap);
    va_end(ap);
    req->pending = code;
}

/* If-None-Match against our ETag: "*" or a list; weak comparison (RFC 9110 13.1.2). */
static bool etag_matches(const char *inm, const char *etag)
{
    if (!inm || !etag)
        return false;
    if (!strncmp(etag, "W/", 2))
        etag += 2;
    size_t elen = strlen(etag);
    const char *p = inm;
    while (*p) {
        while (*p == ' ' || *p == '\t' || *p == ',')
            p++;
        if (!*p)
            break;
        const char *end = p;
        while (*end && *end != ',')
            end++;
        const char *q = end;
        while (q > p && (q[-1] == ' ' || q[-1] == '\t'))
            q--;
        if (q - p == 1 && *p == '*')
            return true;
        if (q - p > 2 && !strncmp(p, "W/", 2))
            p += 2;
        if ((size_t)(q - p) == elen && !memcmp(p, etag, elen))
            return true;
        p = end;
    }
    return false;
}

/* Queues the response set on `req`. */
static enum MHD_Result queue(struct http_request *req)
{
    if (!req->resp) /* a handler that returned OK without answering */
        respond_error(req, DDPD_EINTERNAL, NULL);
    if (!req->resp)
        return MHD_NO;
    if (req->status == 200 && req->etag && !req->stream &&
        etag_matches(http_request_header(req, MHD_HTTP_HEADER_IF_NONE_MATCH), req->etag)) {
        /* Keep the headers a 304 must repeat (Cache-Control) by copying from the old one. */
        const char *cc = MHD_get_response_header(req->resp, MHD_HTTP_HEADER_CACHE_CONTROL);
        char ccopy[256] = "";
        if (cc)
            snprintf(ccopy, sizeof ccopy, "%s", cc);
        MHD_destroy_response(req->resp);
        req->resp = NULL;
        http_respond_empty(req, 304);
        if (!req->resp)
            return MHD_NO;
        if (ccopy[0])
            MHD_add_response_header(req->resp, MHD_HTTP_HEADER_CACHE_CONTROL, ccopy);
    }
    if (req->etag)
        MHD_add_response_header(req->resp, MHD_HTTP_HEADER_ETAG, req->etag);
    for (int i = 0; i < req->nhdr; i++)
        MHD_add_response_header(req->resp, req->hdr[i].name, req->hdr[i].value);
    if (req->srv->cors)
        MHD_add_response_header(req->resp, "Access-Control-Allow-Origin", req->srv->cors);
    enum MHD_Result rc = MHD_queue_response(req->mc, (unsigned)req->status, req->resp);
    MHD_destroy_response(req->resp);
    req->resp = NULL;
    count(req->srv, req->row, req->status);
    return rc;
}

/* ---- the request ------------------------------------------------------------------------------ */

void *http_request_ctx(const struct http_request *req)
{
    return req->srv->cfg.ctx;
}
const char *http_request_path(const struct http_request *req)
{
    return req->url;
}
const char *http_request_route(const struct http_request *req)
{
    return req->route ? req->route->r->pattern : "";
}
const char *http_request_method(const struct http_request *req)
{
    return req->route ? req->route->r->method : req->method;
}

int64_t http_request_id(const struct http_request *req, int i)
{
    return (i >= 0 && i < MAX_CAPTURES) ? req->ids[i] : 0;
}

const char *http_request_header(const struct http_request *req, const char *name)
{
    return MHD_lookup_connection_value(req->mc, MHD_HEADER_KIND, name);
}

json_t *http_request_json(const struct http_request *req)
{
    return req->json;
}

const char *http_request_body(const struct http_request *req, size_t *len)
{
    if (len)
        *len = req->body_len;
    return req->body ? req->body : "";
}

const char *http_query(const struct http_request *req, const char *name)
{
    return MHD_lookup_connection_value(req->mc, MHD_GET_ARGUMENT_KIND, name);
}

ddpd_err http_query_error(struct http_request *req, const char *name, struct ddpd_error *err, const char *fmt,
                          ...)
{
    va_list ap;
    va_start(ap, fmt);
    ddpd_error_vset(err, DDPD_EJSON, name, fmt, ap);
    va_end(ap);
    req->query_failed = true;
    return DDPD_EJSON;
}

/* True when `name` is a word of the space-separated list `list`. */
static bool param_listed(const char *list, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = list; *p;) {
        size_t len = strcspn(p, " ");
        if (len == n && n && !strncmp(p, name, n))
            return true;
        p += len;
        while (*p == ' ')
            p++;
    }
    return false;
}

struct param_scan {
    const char *allowed;
    char unknown[160]; /* the unknown names, comma-separated, as far as they fit */
    char first[48];    /* the first of them: the error's path */
    int n;
};

static enum MHD_Result param_check_one(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    (void)kind, (void)value;
    struct param_scan *ps = cls;
    if (key && !param_listed(ps->allowed, key)) {
        size_t used = strlen(ps->unknown);
        char shown[48];
        clean_copy(shown, sizeof shown, key, 32);
        if (!ps->n)
            snprintf(ps->first, sizeof ps->first, "%s", shown);
        if (used + strlen(shown) + 5 < sizeof ps->unknown)
            snprintf(ps->unknown + used, sizeof ps->unknown - used, "%s'%s'", ps->n ? ", " : "", shown);
        ps->n++;
    }
    return MHD_YES;
}

/* The route's query list (http_route.query) against the request's parameters. */
static ddpd_err query_allow(struct http_request *req, const char *allowed, struct ddpd_error *err)
{
    struct param_scan ps = {.allowed = allowed};
    MHD_get_connection_values(req->mc, MHD_GET_ARGUMENT_KIND, param_check_one, &ps);
    if (!ps.n)
        return DDPD_OK;
    char takes[160] = "";
    size_t used = 0;
    for (const char *p = ps.allowed; *p && used < sizeof takes;) {
        size_t len = strcspn(p, " ");
        if (len) {
            int k = snprintf(takes + used, sizeof takes - used, "%s%.*s", used ? ", " : "", (int)len, p);
            used += k > 0 ? (size_t)k : 0;
        }
        p += len;
        while (*p == ' ')
            p++;
    }
    return http_query_error(req, ps.first, err, "unknown query parameter%s %s (%s %s takes %s)",
                            ps.n > 1 ? "s" : "", ps.unknown, req->method,
                            req->route ? req->route->r->pattern : "this route", used ? takes : "none");
}

bool http_param_int(const char *v, int64_t min, int64_t max, int64_t *out)
{
    /* Digits first: no white space or '+' before the number in a URL. */
    bool digits = (v[0] >= '0' && v[0] <= '9') || (v[0] == '-' && v[1] >= '0' && v[1] <= '9');
    return digits && base_parse_i64(v, min, max, out) == 0;
}

ddpd_err http_query_int(struct http_request *req, const char *name, int64_t min, int64_t max, int64_t dflt,
                        int64_t *out, struct ddpd_error *err)
{
    const char *v = http_query(req, name);
    *out = dflt;
    if (!v || !*v)
        return DDPD_OK;
    int64_t x;
    if (!http_param_int(v, min, max, &x)) {
        char shown[48];
        clean_copy(shown, sizeof shown, v, 32);
        return http_query_error(req, name, err,
                                "query parameter '%s' must be an integer from %" PRId64 " to %" PRId64
                                ", got '%s'",
                                name, min, max, shown);
    }
    *out = x;
    return DDPD_OK;
}

ddpd_err http_query_enum(struct http_request *req, const char *name, const char *const *choices, int dflt,
                         int *out, struct ddpd_error *err)
{
    const char *v = http_query(req, name);
    *out = dflt;
    if (!v || !*v)
        return DDPD_OK;
    char list[256] = "";
    size_t used = 0;
    for (int i = 0; choices[i]; i++) {
        if (!strcmp(v, choices[i])) {
            *out = i;
            return DDPD_OK;
        }
        int n = snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "", choices[i]);
        if (n > 0 && (size_t)n < sizeof list - used)
            used += (size_t)n;
    }
    char shown[48];
    clean_copy(shown, sizeof shown, v, 32);
    return http_query_error(req, name, err, "query parameter '%s' must be one of %s; got '%s'", name, list,
                            shown);
}

/* ---- the dispatcher --------------------------------------------------------------------------- */

/* Constant time in the provided token (depends only on the configured token's length). */
bool http_token_equal(const char *token, size_t token_len, const char *given, size_t glen)
{
    unsigned char diff = (unsigned char)(glen != token_len);
    for (size_t i = 0; i < token_len; i++) {
        unsigned char g = i < glen ? (unsigned char)given[i] : 0;
        diff |= g ^ (unsigned char)token[i];
    }
    return diff == 0;
}

static bool token_ok(const struct http_server *s, const char *given, size_t glen)
{
    return http_token_equal(s->token, s->token_len, given, glen);
}

static void check_auth(struct http_request *req)
{
    struct http_server *s = req->srv;
    const char *h = http_request_header(req, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h) {
        http_response_header(req, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer realm=\"ddpd\"");
        set_pending(req, DDPD_EAUTH, "", "this request needs an 'Authorization: Bearer <token>' header");
        return;
    }
    const char *t = NULL;
    if (!strncasecmp(h, "Bearer ", 7)) {
        t = h + 7;
        while (*t == ' ')
            t++;
    }
    size_t n = t ? strlen(t) : 0;
    while (n && (t[n - 1] == ' ' || t[n - 1] == '\t'))
        n--;
    if (!t || !token_ok(s, t, n)) {
        http_response_header(req, MHD_HTTP_HEADER_WWW_AUTHENTICATE,
                             "Bearer realm=\"ddpd\", error=\"invalid_token\"");
        set_pending(req, DDPD_EAUTH, "", "the bearer token is not valid");
    }
}

static void conn_set_deadline(struct http_server *s, struct conn *c, int64_t deadline)
{
    if (!c || !s->request_timeout_ms)
        return;
    pthread_mutex_lock(&s->mu);
    c->deadline = deadline;
    pthread_mutex_unlock(&s->mu);
}

/* The headers that frame the body, counted over every copy (MHD's lookup sees only the
 * first one, so "Content-Length: 2" then "Content-Length: 30" read as 2). */
struct framing {
    unsigned cl, te;
    bool cl_bad;
};

static enum MHD_Result framing_count(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    (void)kind;
    struct framing *f = cls;
    if (key && !strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH)) {
        f->cl++;
        size_t n = value ? strlen(value) : 0;
        if (n == 0 || n > 19 || strspn(value, "0123456789") != n)
            f->cl_bad = true;
    } else if (key && !strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING)) {
        f->te++;
    }
    return MHD_YES;
}

/* A body whose length two parsers could read two ways is refused (request smuggling,
 * RFC 9112 6.3): every Content-Length copy counts, equal ones too. The answer closes the
 * connection, since where this request ends is not known. True when refused. */
static bool check_framing(struct http_request *req)
{
    struct framing f = {0};
    MHD_get_connection_values(req->mc, MHD_HEADER_KIND, framing_count, &f);
    if (f.cl > 1)
        set_pending(req, DDPD_EREQUEST, "Content-Length",
                    "the request has %u Content-Length headers; send exactly one", f.cl);
    else if (f.cl && f.te)
        set_pending(req, DDPD_EREQUEST, "Content-Length",
                    "the request has both Content-Length and Transfer-Encoding; send one of them");
    else if (f.te > 1)
        set_pending(req, DDPD_EREQUEST, "Transfer-Encoding",
                    "the request has %u Transfer-Encoding headers; send at most one", f.te);
    else if (f.cl_bad)
        set_pending(req, DDPD_EREQUEST, "Content-Length",
                    "Content-Length must be a decimal number of bytes (at most 19 digits)");
    else
        return false;
    http_response_header(req, MHD_HTTP_HEADER_CONNECTION, "close");
    return true;
}

/* Changes state: every method but the safe ones (RFC 9110 9.2.1). */
static bool method_changes_state(const char *method)
{
    return strcmp(method, "GET") && strcmp(method, "HEAD") && strcmp(method, "OPTIONS");
}

/* Without a token, the routes a token would guard answer only local Host names: a page
 * whose DNS name was rebound to 127.0.0.1 sends its own name. True when refused. */
static bool check_host(struct http_request *req)
{
    const char *host = http_request_header(req, MHD_HTTP_HEADER_HOST);
    if (!req->srv->host_check || !host || http_host_is_local(host, !req->srv->listen_loopback))
        return false;
    char shown[96];
    clean_copy(shown, sizeof shown, host, 64);
    set_pending(req, DDPD_EFORBIDDEN, "Host",
                "Host '%s' is not a loopback name; a server without a token answers only localhost, "
                "127.x.y.z and [::1] (give --token-file to serve other names)",
                shown);
    return true;
}

/* A state-changing method from a foreign origin (http_config): a browser says where a
 * request comes from in Origin (sent on every cross-origin POST/DELETE, form posts
 * included) or, without it, in Sec-Fetch-Site. True when refused. */
static bool check_origin(struct http_request *req)
{
    struct http_server *s = req->srv;
    char shown[96];
    if (!method_changes_state(req->method))
        return false;
    const char *host = http_request_header(req, MHD_HTTP_HEADER_HOST);
    const char *origin = http_request_header(req, "Origin");
    if (origin) {
        bool ok = http_origin_is_host(origin, host) ||
                  (s->cors && (!strcmp(s->cors, "*") || !strcasecmp(s->cors, origin)));
        if (!ok) {
            clean_copy(shown, sizeof shown, origin, 64);
            set_pending(req, DDPD_EFORBIDDEN, "Origin",
                        "%s from origin '%s' is refused: it is not this server's origin%s", req->method,
                        shown, s->cors ? " nor --cors-origin" : " (see --cors-origin)");
        }
        return !ok;
    }
    const char *site = http_request_header(req, "Sec-Fetch-Site");
    if (site && (!strcasecmp(site, "cross-site") || !strcasecmp(site, "same-site")) &&
        !(s->cors && !strcmp(s->cors, "*"))) {
        set_pending(req, DDPD_EFORBIDDEN, "Sec-Fetch-Site",
                    "%s from another site (Sec-Fetch-Site: %s) is refused", req->method,
                    !strcasecmp(site, "cross-site") ? "cross-site" : "same-site");
        return true;
    }
    return false;
}

/* A JSON route's body must say it is JSON ("application/json", any parameters after ';'):
 * a form or a "simple" cross-site fetch, which needs no preflight, cannot. True when
 * refused. */
static bool check_media_type(struct http_request *req)
{
    const char *ct = http_request_header(req, MHD_HTTP_HEADER_CONTENT_TYPE);
    const char *p = ct ? ct : "";
    while (*p == ' ' || *p == '\t')
        p++;
    static const char want[] = "application/json";
    size_t n = sizeof want - 1;
    if (!strncasecmp(p, want, n) && (p[n] == '\0' || p[n] == ';' || p[n] == ' ' || p[n] == '\t'))
        return false;
    char shown[96];
    clean_copy(shown, sizeof shown, p, 64);
    set_pending(req, DDPD_EMEDIATYPE, "Content-Type",
                "%s %s needs 'Content-Type: application/json'; got %s%s%s", req->method,
                req->route->r->pattern, ct ? "'" : "none", ct ? shown : "", ct ? "'" : "");
    return true;
}

/* First call: framing, target, route, method, Host and Origin, auth, media type, declared
 * size. Returns true to answer at once. */
static bool request_begin(struct http_request *req)
{
    struct http_server *s = req->srv;
    const struct route_rt *path_hit = NULL;
    char allow[128];
    req->row = (int)s->npatterns;
    if (check_framing(req))
        return true;
    if (req->target_len > HTTP_MAX_TARGET) {
        set_pending(req, DDPD_EREQUEST, "", "the request target is %zu bytes; the limit is %d",
                    req->target_len, HTTP_MAX_TARGET);
        return true;
    }
    if (req->nparams > HTTP_MAX_QUERY_PARAMS) {
        set_pending(req, DDPD_EJSON, "", "the query has %u parameters; the limit is %d", req->nparams,
                    HTTP_MAX_QUERY_PARAMS);
        req->query_failed = true;
        return true;
    }
    /* Refused from another site: answered after the body is dropped, as for 401, so the
     * client reads its answer on a connection that stays in step. */
    bool refused = check_origin(req);
    req->route =
        route_find(s->routes, s->nroutes, req->method, req->url, req->ids, &path_hit, allow, sizeof allow);
    char shown[160];
    clean_copy(shown, sizeof shown, req->url, 128);
    if (req->route) {
        req->row = req->route->row;
    } else if (path_hit && s->cors && !strcmp(req->method, "OPTIONS") && !refused) {
        req->row = path_hit->row;
        req->preflight = true;
        http_response_header(req, "Access-Control-Allow-Methods", allow);
        http_response_header(req, "Access-Control-Allow-Headers",
                             "Authorization, Content-Type, Last-Event-ID");
        http_response_header(req, "Access-Control-Max-Age", "600");
        return true;
    } else if (path_hit) {
        req->row = path_hit->row;
        if (!refused) {
            http_response_header(req, MHD_HTTP_HEADER_ALLOW, allow);
            set_pending(req, DDPD_EMETHOD, "", "%s is not allowed on %s (allowed: %s)", req->method, shown,
                        allow);
        }
    } else if (!refused) {
        set_pending(req, DDPD_ENOTFOUND, "", "no such resource: %s", shown);
    }
    if (!req->pending && req->route && (req->route->r->flags & HTTP_ROUTE_AUTH))
        check_host(req);
    if (!req->pending && req->route && (req->route->r->flags & HTTP_ROUTE_AUTH) && s->token)
        check_auth(req);
    if (!req->pending && req->route && (req->route->r->flags & HTTP_ROUTE_JSON))
        check_media_type(req);

    req->limit = (req->route && req->route->r->max_body) ? req->route->r->max_body : s->max_body;
    req->keep_body =
        !req->pending && req->route && (req->route->r->flags & (HTTP_ROUTE_JSON | HTTP_ROUTE_BODY));
    const char *cl = http_request_header(req, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (cl && *cl) {
        char *end;
        errno = 0;
        unsigned long long n = strtoull(cl, &end, 10);
        if (!*end && errno == 0 && n > req->limit) {
            /* Known to be too large before any byte of it: answer now; libmicrohttpd then
             * closes the connection instead of reading the body. */
            if (!req->pending)
                set_pending(req, DDPD_ETOOBIG, "",
                            "request body of %llu bytes is larger than the limit of %zu bytes", n,
                            req->limit);
            return true;
        }
        if (!*end && errno == 0 && req->keep_body && n > 0) {
            req->body_cap = (size_t)n + 1;
            req->body = xmalloc(req->body_cap);
        }
    }
    return false;
}

/* Upload calls. The body past the limit (a chunked one, whose size was not declared) is
 * dropped to its end: libmicrohttpd cannot queue an answer mid-body, and cutting the
 * connection left the client with an empty reply instead of its 413. Dropping costs no
 * memory, and the request deadline (request_timeout_ms) still bounds how long a client
 * may keep sending. */
static void request_body(struct http_request *req, const char *data, size_t n)
{
    req->received += n;
    if (req->received > req->limit) {
        if (!req->too_big) {
            req->too_big = true;
            free(req->body);
            req->body = NULL;
            req->body_len = req->body_cap = 0;
        }
        return;
    }
    if (!req->keep_body)
        return;
    if (req->body_len + n + 1 > req->body_cap) {
        size_t cap = req->body_cap ? req->body_cap : 4096;
        while (cap < req->body_len + n + 1)
            cap *= 2;
        if (cap > req->limit + 1)
            cap = req->limit + 1;
        char *b = realloc(req->body, cap);
        ASSERT(b);
        req->body = b;
        req->body_cap = cap;
    }
    memcpy(req->body + req->body_len, data, n);
    req->body_len += n;
    req->body[req->body_len] = '\0';
}

ddpd_err http_body_json(const char *body, size_t len, json_t **out, struct ddpd_error *err)
{
    json_error_t je;
    *out = NULL;
    if (len == 0)
        return ddpd_error_set(err, DDPD_EJSON, "", "request body is empty; expected a JSON document");
    *out = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!*out) {
        ddpd_error_set(err, DDPD_EJSON, "", "malformed JSON at line %d, column %d: %s", je.line, je.column,
                       je.text);
        if (err) {
            err->line = je.line;
            err->column = je.column;
        }
        return DDPD_EJSON;
    }
    return DDPD_OK;
}

/* A handler's error return: what it set is discarded and the error answered. */
static void handler_failed(struct http_request *req, ddpd_err rc, const struct ddpd_error *e)
{
    if (req->resp) {
        /* For a stream this ends it (on_close runs now, on this thread). */
        MHD_destroy_response(req->resp);
        req->resp = NULL;
    }
    clear_headers(req);
    respond_error(req, rc, e);
}

/* Final call: the checks that need the body, then the handler. */
static void request_dispatch(struct http_request *req)
{
    if (req->pending) {
        respond_error(req, req->pending, &req->perr);
        return;
    }
    if (req->too_big) {
        struct ddpd_error e;
        ddpd_error_set(&e, DDPD_ETOOBIG, "", "request body is larger than the limit of %zu bytes",
                       req->limit);
        respond_error(req, DDPD_ETOOBIG, &e);
        return;
    }
    const struct http_route *r = req->route->r;
    if (r->flags & HTTP_ROUTE_JSON) {
        struct ddpd_error e;
        if (http_body_json(req->body, req->body_len, &req->json, &e) != DDPD_OK) {
            respond_error(req, DDPD_EJSON, &e);
            return;
        }
    }
    struct ddpd_error e;
    ddpd_error_clear(&e);
    if (r->query && query_allow(req, r->query, &e) != DDPD_OK) {
        respond_error(req, e.code, &e);
        return;
    }
    ddpd_err rc = r->handler(req, &e);
    if (rc != DDPD_OK)
        handler_failed(req, rc, &e);
}

void http_defer(struct http_request *req)
{
    struct http_server *s = req->srv;
    ASSERT(!req->deferred);
    req->deferred = true;
    pthread_mutex_lock(&s->dmu);
    s->ndeferred++;
    pthread_mutex_unlock(&s->dmu);
}

void http_deferred_done(struct http_request *req, ddpd_err rc, const struct ddpd_error *err)
{
    struct http_server *s = req->srv;
    pthread_mutex_lock(&s->dmu);
    ASSERT(req->deferred && !req->answered);
    req->deferred_rc = rc;
    if (rc != DDPD_OK) {
        if (err)
            req->deferred_err = *err;
        else
            ddpd_error_clear(&req->deferred_err);
    }
    req->answered = true;
    if (req->parked) { /* else the HTTP thread has not parked it yet and answers at once */
        req->parked = false;
        MHD_resume_connection(req->mc);
    }
    pthread_mutex_unlock(&s->dmu);
}

/* After a deferring handler returned: parks the connection until http_deferred_done,
 * unless the answer is already there. True when parked. */
static bool defer_park(struct http_request *req)
{
    struct http_server *s = req->srv;
    pthread_mutex_lock(&s->dmu);
    bool park = !req->answered;
    if (park) {
        req->parked = true;
        MHD_suspend_connection(req->mc);
    }
    pthread_mutex_unlock(&s->dmu);
    return park;
}

static struct http_request *request_new(struct http_server *s)
{
    struct http_request *req = xcalloc(1, sizeof *req);
    req->srv = s;
    return req;
}

/* libmicrohttpd's URI callback: the raw request target, before it parses the query into
 * its fixed per-connection memory pool. There, in 0.9.75, running out of pool (about 900
 * parameters) queued an error answer that was never sent, and the client waited for its
 * deadline. A target with more parameters than HTTP_MAX_QUERY_PARAMS, or longer than
 * HTTP_MAX_TARGET, is noted on the request, which request_begin answers with 400, and
 * its query is cut to nothing before the library parses it: the callback runs on the
 * library's own writable copy of the request line, between finding the '?' and parsing
 * what follows it. Its return value becomes the request's context. */
static void *uri_seen(void *cls, const char *uri, struct MHD_Connection *mc)
{
    (void)mc;
    struct http_request *req = request_new(cls);
    req->target_len = strlen(uri);
    char *q = strchr(uri, '?');
    if (q && q[1]) {
        req->nparams = 1;
        for (const char *p = q + 1; *p; p++)
            req->nparams += *p == '&';
    }
    if (q && (req->nparams > HTTP_MAX_QUERY_PARAMS || req->target_len > HTTP_MAX_TARGET))
        q[1] = '\0';
    return req;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *mc, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size,
                                  void **con_cls)
{
    (void)version;
    struct http_server *s = cls;
    struct http_request *req = *con_cls;
    if (!req) /* made by uri_seen; a daemon without it would still work */
        *con_cls = req = request_new(s);
    if (!req->begun) {
        req->begun = true;
        req->mc = mc;
        req->url = url;
        req->method = method;
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
        req->conn = ci ? ci->socket_context : NULL;
        *con_cls = req;
        if (request_begin(req)) {
            conn_set_deadline(s, req->conn, 0);
            if (req->preflight)
                http_respond_empty(req, 204);
            else
                respond_error(req, req->pending, &req->perr);
            return queue(req);
        }
        return MHD_YES;
    }
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        request_body(req, upload, n);
        return MHD_YES;
    }
    conn_set_deadline(s, req->conn, 0);
    if (!req->deferred) {
        request_dispatch(req);
        if (req->deferred && defer_park(req))
            return MHD_YES; /* http_deferred_done resumes the connection: called again */
    }
    if (req->deferred && req->deferred_rc != DDPD_OK)
        handler_failed(req, req->deferred_rc, &req->deferred_err);
    return queue(req);
}

static void on_completed(void *cls, struct MHD_Connection *mc, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    (void)mc;
    struct http_server *s = cls;
    struct http_request *req = *con_cls;
    if (!req)
        return;
    *con_cls = NULL;
    if (req->conn && s->request_timeout_ms)
        conn_set_deadline(s, req->conn,
                          base_mono_ms() + s->request_timeout_ms + (int64_t)s->idle_timeout_s * 1000);
    if (req->deferred) { /* its answer is sent (or the client is gone): http_server_free may stop */
        pthread_mutex_lock(&s->dmu);
        if (--s->ndeferred == 0)
            pthread_cond_broadcast(&s->dcv);
        pthread_mutex_unlock(&s->dmu);
    }
    if (req->resp)
        MHD_destroy_response(req->resp);
    if (req->stream) {
        stream_finish(req->stream, toe == MHD_REQUEST_TERMINATED_COMPLETED_OK);
        stream_release(req->stream);
    }
    clear_headers(req);
    json_decref(req->json);
    free(req->body);
    free(req);
}

static void on_connection(void *cls, struct MHD_Connection *mc, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe)
{
    struct http_server *s = cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        struct conn *c = xcalloc(1, sizeof *c);
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
        c->fd = ci ? ci->connect_fd : -1;
        pthread_mutex_lock(&s->mu);
        c->deadline = s->request_timeout_ms ? base_mono_ms() + s->request_timeout_ms : 0;
        c->next = s->conns;
        if (s->conns)
            s->conns->prev = c;
        s->conns = c;
        pthread_mutex_unlock(&s->mu);
        *socket_context = c;
    } else if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
        struct conn *c = *socket_context;
        if (!c)
            return;
        pthread_mutex_lock(&s->mu);
        if (c->prev)
            c->prev->next = c->next;
        else
            s->conns = c->next;
        if (c->next)
            c->next->prev = c->prev;
        pthread_mutex_unlock(&s->mu);
        free(c);
        *socket_context = NULL;
    }
}

/* Cuts connections whose request did not arrive in time. libmicrohttpd's own timeout is an
 * idle timeout, which a client sending one byte now and then never trips. shutdown() (not
 * close) is safe here: the fd stays libmicrohttpd's until its CLOSED notification, which
 * takes `mu` to unlink the connection first. */
static void *reaper_main(void *arg)
{
    struct http_server *s = arg;
    int64_t period = s->request_timeout_ms / 4;
    if (period < 10)
        period = 10;
    if (period > 500)
        period = 500;
    pthread_mutex_lock(&s->mu);
    while (!s->reaper_stop) {
        int64_t now = base_mono_ms();
        for (struct conn *c = s->conns; c; c = c->next) {
            if (c->deadline && now >= c->deadline && !c->cut && c->fd >= 0) {
                shutdown(c->fd, SHUT_RDWR);
                c->cut = true;
            }
        }
        struct timespec ts = base_timespec_after(CLOCK_MONOTONIC, (double)period / 1000);
        pthread_cond_timedwait(&s->cv, &s->mu, &ts);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static void on_log(void *cls, const char *fmt, va_list ap)
{
    struct http_server *s = cls;
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    size_t n = strlen(line);
    while (n && (line[n - 1] == '\n' || line[n - 1] == '\r'))
        line[--n] = '\0';
    if (s->cfg.log)
        s->cfg.log(s->cfg.ctx, line);
}

/* ---- server life ------------------------------------------------------------------------------- */

static int listen_on(const char *addr, struct ddpd_error *err)
{
    struct sockaddr_storage ss;
    socklen_t len;
    char why[160];
    if (!addr_parse_why(addr, &ss, &len, why, sizeof why)) {
        ddpd_error_set(err, DDPD_EINTERNAL, "listen", "bad listen address '%s': %s", addr ? addr : "", why);
        return -1;
    }
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int one = 1;
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(fd, (struct sockaddr *)&ss, len) != 0 || listen(fd, 511) != 0) {
        ddpd_error_set(err, DDPD_EIO, "listen", "cannot listen on %s: %s", addr, strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    return fd;
}

int http_listen(const char *addr, struct ddpd_error *err)
{
    int fd = listen_on(addr, err);
    if (fd >= 0 && fd <= 2) { /* 0..2 mean "none" in http_config.listen_fd */
        int high = fcntl(fd, F_DUPFD_CLOEXEC, 3);
        if (high < 0)
            ddpd_error_set(err, DDPD_EIO, "listen", "cannot listen on %s: %s", addr, strerror(errno));
        close(fd);
        fd = high;
    }
    return fd;
}

struct http_server *http_server_new(const struct http_config *cfg, struct ddpd_error *err)
{
    struct http_server *s = xcalloc(1, sizeof *s);
    s->listen_fd = cfg->listen_fd > 2 ? cfg->listen_fd : -1; /* from http_listen: ours now */
    s->cfg = *cfg;
    s->cfg.token = NULL;
    if (cfg->token && cfg->token[0]) {
        s->token = xstrdup(cfg->token);
        s->token_len = strlen(s->token);
    }
    s->cfg.cors_origin = NULL;
    if (cfg->cors_origin && cfg->cors_origin[0])
        s->cors = xstrdup(cfg->cors_origin);
    s->host_check = s->token == NULL;
    s->listen_loopback = http_addr_is_loopback(cfg->listen);
    snprintf(s->listen, sizeof s->listen, "%s", cfg->listen ? cfg->listen : "");
    s->max_body = cfg->max_body ? cfg->max_body : (size_t)1 << 20;
    s->request_timeout_ms = cfg->request_timeout_ms ? cfg->request_timeout_ms : 30000;
    s->idle_timeout_s = cfg->idle_timeout_s ? cfg->idle_timeout_s : 60;
    pthread_mutex_init(&s->mu, NULL);
    base_cond_init_mono(&s->cv);
    pthread_mutex_init(&s->dmu, NULL);
    pthread_cond_init(&s->dcv, NULL);

    /* Routes and one counters row per distinct pattern. */
    s->nroutes = cfg->nroutes;
    s->routes = xcalloc(cfg->nroutes, sizeof *s->routes);
    s->patterns = xcalloc(cfg->nroutes, sizeof *s->patterns);
    for (size_t i = 0; i < cfg->nroutes; i++) {
        struct route_rt *rt = &s->routes[i];
        if (!route_compile(rt, &cfg->routes[i])) {
            ddpd_error_set(err, DDPD_EINTERNAL, "routes", "bad route %s %s",
                           cfg->routes[i].method ? cfg->routes[i].method : "(null)",
                           cfg->routes[i].pattern ? cfg->routes[i].pattern : "(null)");
            goto fail;
        }
        size_t row = 0;
        while (row < s->npatterns && strcmp(s->patterns[row], rt->r->pattern))
            row++;
        if (row == s->npatterns)
            s->patterns[s->npatterns++] = rt->r->pattern;
        rt->row = (int)row;
    }
    s->counts = xcalloc((s->npatterns + 1) * NSTATUS, sizeof *s->counts);

    if (s->listen_fd < 0 && (s->listen_fd = listen_on(cfg->listen, err)) < 0)
        goto fail;
    /* libmicrohttpd gets its own descriptor of the socket: whatever it does with it on a
     * failed start or at stop, ours is closed exactly once, by us. */
    int mhd_fd = fcntl(s->listen_fd, F_DUPFD_CLOEXEC, 0);
    if (mhd_fd < 0) {
        ddpd_error_set(err, DDPD_EIO, "listen", "cannot listen on %s: %s", s->listen, strerror(errno));
        goto fail;
    }
    struct sockaddr_storage bound;
    socklen_t blen = sizeof bound;
    getsockname(s->listen_fd, (struct sockaddr *)&bound, &blen);
    s->port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                                : ((struct sockaddr_in *)&bound)->sin_port);

    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME;
    if (bound.ss_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    if (cfg->log)
        flags |= MHD_USE_ERROR_LOG;
    unsigned pool = cfg->threads > 1 ? cfg->threads : 0;
    s->d = MHD_start_daemon(
        flags, 0, NULL, NULL, on_request, s, MHD_OPTION_EXTERNAL_LOGGER, on_log, s, MHD_OPTION_LISTEN_SOCKET,
        mhd_fd, MHD_OPTION_CONNECTION_LIMIT, cfg->connection_limit ? cfg->connection_limit : 1024u,
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, cfg->per_ip_limit ? cfg->per_ip_limit : 256u,
        MHD_OPTION_CONNECTION_TIMEOUT, s->idle_timeout_s, MHD_OPTION_URI_LOG_CALLBACK, uri_seen, s,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, cfg->memory_limit ? cfg->memory_limit : (size_t)64 * 1024,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
        /* The pool option last: without a pool it is the end marker itself. */
        pool ? MHD_OPTION_THREAD_POOL_SIZE : MHD_OPTION_END, pool, MHD_OPTION_END);
    if (!s->d) {
        ddpd_error_set(err, DDPD_EIO, "listen", "cannot start the HTTP server on %s", s->listen);
        goto fail;
    }
    if (pthread_create(&s->reaper, NULL, reaper_main, s) != 0) {
        ddpd_error_set(err, DDPD_EIO, "", "cannot start a thread: %s", strerror(errno));
        goto fail;
    }
    s->reaper_started = true;
    return s;

fail:
    http_server_free(s);
    return NULL;
}

int http_server_port(const struct http_server *s)
{
    return s->port;
}

void http_server_free(struct http_server *s)
{
    if (!s)
        return;
    if (s->d) {
        /* Stop accepting: our descriptor of the socket goes now; libmicrohttpd closes its
         * own in MHD_stop_daemon. (Not MHD_quiesce_daemon: in 0.9.75 with a thread pool and
         * epoll, quiescing races the pool's threads removing the listen socket from their
         * epoll sets, and the loser panics with "Failed to remove listen FD from epoll set"
         * (seen once in a few hundred shutdowns in the API tests).) */
        if (s->listen_fd >= 0)
            close(s->listen_fd);
        s->listen_fd = -1;
        /* End every stream and wake the parked ones: libmicrohttpd must not be stopped with
         * suspended connections, and a resumed stream's reader now ends it with an error. */
        pthread_mutex_lock(&s->mu);
        s->stopping = true;
        for (struct http_stream *st = s->streams; st; st = st->next) {
            pthread_mutex_lock(&st->mu);
            stream_end_locked(st, HTTP_STREAM_SHUTDOWN);
            stream_wake(st);
            pthread_mutex_unlock(&st->mu);
        }
        pthread_mutex_unlock(&s->mu);
        /* Deferred requests are parked too: wait for their answers to be sent (stopping
         * the daemon earlier would close a resumed connection before its answer leaves).
         * Their owners answer each one they took (the store's inserter answers every
         * queued insert, within its busy timeout), and a client that does not read its
         * answer is cut off at the connection timeout, so this wait ends. */
        pthread_mutex_lock(&s->dmu);
        while (s->ndeferred > 0)
            pthread_cond_wait(&s->dcv, &s->dmu);
        pthread_mutex_unlock(&s->dmu);
        MHD_stop_daemon(s->d); /* closes connections and its listen socket: stream
                                  on_close callbacks run */
        s->d = NULL;
    }
    if (s->reaper_started) {
        pthread_mutex_lock(&s->mu);
        s->reaper_stop = true;
        pthread_cond_signal(&s->cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->reaper, NULL);
    }
    if (s->listen_fd >= 0)
        close(s->listen_fd);
    ASSERT(s->streams == NULL && s->conns == NULL);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->dcv);
    pthread_mutex_destroy(&s->dmu);
    free(s->counts);
    free(s->patterns);
    free(s->routes);
    free(s->token);
    free(s->cors);
    free(s);
}

char *http_server_metrics(struct http_server *s)
{
    struct sbuf b = {0};
    sbuf_printf(&b, "# HELP ddpd_http_requests_total HTTP requests answered, by route and "
                    "status code.\n# TYPE ddpd_http_requests_total counter\n");
    for (size_t row = 0; row <= s->npatterns; row++) {
        const char *route = row < s->npatterns ? s->patterns[row] : "unmatched";
        for (int k = 0; k < NSTATUS; k++) {
            unsigned long long n =
                atomic_load_explicit(&s->counts[row * NSTATUS + (size_t)k], memory_order_relaxed);
            if (!n)
                continue;
            char code[16];
            if (k < NSTATUS - 1)
                snprintf(code, sizeof code, "%d", status_list[k]);
            else
                snprintf(code, sizeof code, "other");
            sbuf_printf(&b, "ddpd_http_requests_total{route=\"%s\",code=\"%s\"} %llu\n", route, code, n);
        }
    }
    return b.p;
}

void http_server_stream_stats(struct http_server *s, size_t *open, unsigned long long *slow)
{
    pthread_mutex_lock(&s->mu);
    *open = s->nstreams;
    *slow = s->slow_total;
    pthread_mutex_unlock(&s->mu);
}
