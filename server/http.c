/* http.c — the HTTP layer over libmicrohttpd: the daemon, a connection's life and a
 * request's calls on the access handler, deferred answers, the reaper of slow requests,
 * and the server's start and ordered stop. The checks and routes are http_dispatch.c's
 * and http_route.c's; it holds no job logic.
 *
 * A request's life on the access handler: the first call (headers complete) matches the
 * route, checks auth and a declared Content-Length; upload calls collect or drop the body
 * while counting it; the final call runs the handler and queues the response. Answering
 * on the final call, not the first, lets libmicrohttpd keep the connection alive. */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "../base/alloc.h"
#include "../base/check.h"
#include "../base/clock.h"
#include "http_impl.h"

/* ---- connections --------------------------------------------------------------------------- */

static void conn_set_deadline(struct http_server *s, struct conn *c, int64_t deadline)
{
    if (!c || !s->request_timeout_ms)
        return;
    pthread_mutex_lock(&s->mu);
    c->deadline = deadline;
    pthread_mutex_unlock(&s->mu);
}

/* ---- deferred answers -------------------------------------------------------------------------- */

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

/* ---- the access handler and the connection's notifications ---------------------------------- */

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
    /* The library decodes the path in place and hands ddpd a C string, which a %00 would
     * end early ("/v1/jobs/7%00/x" read as "/v1/jobs/7"): only the raw target shows it. */
    const char *nul = strstr(uri, "%00");
    req->path_nul = nul && (!q || nul < q);
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
        if (http__request_begin(req)) {
            conn_set_deadline(s, req->conn, 0);
            if (req->preflight)
                http_respond_empty(req, 204);
            else
                http__respond_error(req, req->pending, &req->perr);
            return http__queue(req);
        }
        return MHD_YES;
    }
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        http__request_body(req, upload, n);
        return MHD_YES;
    }
    conn_set_deadline(s, req->conn, 0);
    if (!req->deferred) {
        http__request_dispatch(req);
        if (req->deferred && defer_park(req))
            return MHD_YES; /* http_deferred_done resumes the connection: called again */
    }
    if (req->deferred && req->deferred_rc != DDPD_OK)
        http__handler_failed(req, req->deferred_rc, &req->deferred_err);
    return http__queue(req);
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
        http__stream_finish(req->stream, toe == MHD_REQUEST_TERMINATED_COMPLETED_OK);
        http__stream_release(req->stream);
    }
    http__clear_headers(req);
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
        if (!http__route_compile(rt, &cfg->routes[i])) {
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

    if (s->listen_fd < 0 && (s->listen_fd = http__listen_on(cfg->listen, err)) < 0)
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
            http__stream_end_locked(st, HTTP_STREAM_SHUTDOWN);
            http__stream_wake(st);
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

void http_server_stream_stats(struct http_server *s, size_t *open, unsigned long long *slow)
{
    pthread_mutex_lock(&s->mu);
    *open = s->nstreams;
    *slow = s->slow_total;
    pthread_mutex_unlock(&s->mu);
}
