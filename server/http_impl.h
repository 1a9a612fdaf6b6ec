/* http_impl.h — what the HTTP layer's own files share (not part of http.h's contract): the
 * server, a connection, a request and a stream as structs, and the internals one of its
 * files calls in another. Nothing outside server/http*.c includes this.
 *
 * The internals keep the short names they had when the layer was one file, so that their
 * bodies moved unchanged; each is defined in the file its comment names. */
#ifndef DDPD_HTTP_IMPL_H
#define DDPD_HTTP_IMPL_H

#include <jansson.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "http.h"
#include "users.h"

#define MAX_SEGMENTS 16
#define MAX_CAPTURES HTTP_MAX_CAPTURES
#define MAX_HEADERS  8
/* The statuses the counters tell apart (http_route.c's status_list), and "other". */
#define NSTATUS 27

/* ---- compiled routes (http_route.c) ----------------------------------------------------- */

struct route_rt {
    const struct http_route *r;
    int nseg;
    const char *seg[MAX_SEGMENTS];
    size_t seglen[MAX_SEGMENTS];
    bool capture[MAX_SEGMENTS];
    bool word[MAX_SEGMENTS]; /* a {name:word} capture */
    int row;                 /* index of its pattern in the counters */
};

/* Compiles one row of a route table; false when its pattern is invalid. */
bool http__route_compile(struct route_rt *rt, const struct http_route *r);
/* The row of `rts` that answers `method` (HEAD as GET) on `url`, with its captures in ids;
 * NULL when none does. *path_hit is the first row whose pattern matches the path whatever
 * its method (NULL: a 404), and `allow` lists the methods of the rows that match it. */
const struct route_rt *http__route_find(const struct route_rt *rts, size_t n, const char *method,
                                        const char *url, int64_t *ids, const struct route_rt **path_hit,
                                        char *allow, size_t cap);
/* Counts one answer of the route's row (npatterns: unmatched) with its status. */
void http__count(struct http_server *s, int row, int status);

/* ---- the server, its connections, requests and streams ---------------------------------- */

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
    bool path_nul;     /* the raw target's path has a %00 (uri_seen) */
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
    struct user user; /* the principal of an AUTH route, when has_user */
    bool has_user;

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

/* ---- the listening socket (http_addr.c) ------------------------------------------------- */

/* A bound, listening socket on `addr` (http_config.listen), or -1 with `err` set. */
int http__listen_on(const char *addr, struct ddpd_error *err);

/* ---- streams (http_stream.c) ------------------------------------------------------------ */

/* Drops one reference; the last frees the stream. */
void http__stream_release(struct http_stream *st);
/* Under st->mu: wakes the connection so the content reader runs again. */
void http__stream_wake(struct http_stream *st);
/* Under st->mu: ends the stream for writers and frees what is queued. */
void http__stream_end_locked(struct http_stream *st, enum http_stream_end why);
/* The MHD side is done with the stream: settles why it ended, unlinks it, calls on_close
 * (the first call only). On an HTTP thread. */
void http__stream_finish(struct http_stream *st, bool completed_ok);

/* ---- responses (http_respond.c) --------------------------------------------------------- */

bool http__responded(struct http_request *req);
void http__set_response(struct http_request *req, int status, struct MHD_Response *r);
void http__add_content_type(struct MHD_Response *r, const char *ct);
/* Frees the extra headers and the ETag set for the response. */
void http__clear_headers(struct http_request *req);
/* The error body of CONTRACT.md §7 with the status of the error table. */
void http__respond_error(struct http_request *req, ddpd_err code, const struct ddpd_error *e);
/* Queues the response set on `req` (a 500 when there is none) and counts it. */
enum MHD_Result http__queue(struct http_request *req);

/* ---- the request and its query (http_request.c) ----------------------------------------- */

/* Client text inside our messages: at most `max` bytes, printable ASCII only. */
void http__clean_copy(char *dst, size_t cap, const char *src, size_t max);
/* The route's query list (http_route.query) against the request's parameters. */
ddpd_err http__query_allow(struct http_request *req, const char *allowed, struct ddpd_error *err);
/* The rules every route's query keeps: no name given twice, no NUL byte in a name or value. */
ddpd_err http__query_unambiguous(struct http_request *req, struct ddpd_error *err);

/* ---- the dispatcher (http_dispatch.c) --------------------------------------------------- */

/* First call: framing, target, route, method, Host and Origin, auth, media type, declared
 * size. Returns true to answer at once. */
bool http__request_begin(struct http_request *req);
/* Upload calls: the body counted against the limit, kept when the route reads it. */
void http__request_body(struct http_request *req, const char *data, size_t n);
/* A handler's error return: what it set is discarded and the error answered. */
void http__handler_failed(struct http_request *req, ddpd_err rc, const struct ddpd_error *e);
/* Final call: the checks that need the body, then the handler. */
void http__request_dispatch(struct http_request *req);

#endif
