/* http.h — ddpd's HTTP layer: a libmicrohttpd daemon, the route table, and the checks the
 * dispatcher makes before any handler runs (404/405, bearer auth, body limits, JSON
 * parsing), error-to-HTTP mapping (CONTRACT.md §7), response helpers and streaming
 * responses (SSE / NDJSON). It knows no jobs, no SQL and no events: handlers do.
 *
 * Threads: handlers run on libmicrohttpd's threads (one internal epoll thread, or a small
 * pool); they must not block for long. Streams are written from any thread. */
#ifndef DDPD_HTTP_H
#define DDPD_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../schema/err.h"

struct json_t;
struct user;
struct http_server;
struct http_request;
struct http_stream;

/* ---- routes ---------------------------------------------------------------------- */

/* A handler answers one request. It calls exactly one http_respond_* function and
 * returns DDPD_OK, or returns an error with `err` filled (ddpd_error_set), and the layer
 * renders {"error":{"code","message","path"}} with ddpd_err_http's status. A response
 * set before an error return is discarded. Runs on an HTTP thread. */
typedef ddpd_err (*http_handler_fn)(struct http_request *req, struct ddpd_error *err);

enum http_route_flags {
    HTTP_ROUTE_AUTH = 1u << 0, /* needs `Authorization: Bearer <token>` when a token is set,
                                  a loopback Host name when none is (http_config) */
    HTTP_ROUTE_JSON = 1u << 1, /* the body is a JSON document, parsed before the handler */
    HTTP_ROUTE_BODY = 1u << 2, /* the body is kept as bytes (http_request_body) */
};

/* One row of the route table. `pattern` is a path of literal segments and `{name}`
 * segments; a `{name}` segment matches a positive 64-bit decimal integer without sign or
 * leading zeros (1 .. 9223372036854775807) and anything else there is a 404; a
 * `{name:word}` segment matches 1..64 bytes of [A-Za-z0-9._-] (http_request_segment reads
 * it; its http_request_id is 0). HEAD is
 * served by the GET route. Bodies of routes without JSON/BODY are read and dropped (the
 * limit still applies). */
struct http_route {
    const char *method;  /* "GET", "POST", "DELETE", ... */
    const char *pattern; /* "/v1/jobs/{id}/events" */
    http_handler_fn handler;
    unsigned flags;  /* enum http_route_flags */
    size_t max_body; /* bytes; 0 = the server's max_body */
    /* The query parameters the route takes, space-separated ("state limit before name";
     * "" for none): any other is a 400 bad_query naming it and the ones taken, checked
     * before the handler runs, never silently ignored (a misspelt filter would return
     * every job). NULL: names not checked (the handler reads what it wants); a name given
     * twice or a %00 is refused on every route all the same. */
    const char *query;
};

/* Captures a pattern may hold. */
#define HTTP_MAX_CAPTURES 4

/* Query parameters a request may carry ("?a=1&b=2" is 2); more is 400 bad_query at once.
 * libmicrohttpd keeps each one in the connection's fixed memory pool and, in 0.9.75,
 * leaves the connection without an answer when the pool runs out (922 parameters did). */
#define HTTP_MAX_QUERY_PARAMS 64
/* Bytes of the request target (path and query); more is 400 bad_request at once. */
#define HTTP_MAX_TARGET 8192

/* The dispatcher's route lookup without a server (for tests and the fuzz target): the row
 * of `routes` that answers `method` (HEAD as GET) on `path` (decoded, without the query).
 * Returns its index, with the `{...}` captures in ids[HTTP_MAX_CAPTURES]; -1 when no row
 * has this path (404); -2 when rows have it but not this method (405: `allow` gets the
 * Allow header's list); -3 when a row of the table is invalid. */
int http_route_lookup(const struct http_route *routes, size_t n, const char *method, const char *path,
                      int64_t *ids, char *allow, size_t allow_cap);

/* The parse of a JSON route's body, as the dispatcher makes it before the handler runs:
 * DDPD_OK with *out a new reference, or DDPD_EJSON for an empty body or malformed JSON
 * (duplicate keys included) with err's line and column set. */
ddpd_err http_body_json(const char *body, size_t len, struct json_t **out, struct ddpd_error *err);

/* The bearer token check: true when `given` (glen bytes) is `token`. Its time depends only
 * on token_len, never on where `given` first differs or on its length. */
bool http_token_equal(const char *token, size_t token_len, const char *given, size_t glen);

/* ---- the server -------------------------------------------------------------------- */

struct http_config {
    /* "ADDR:PORT" with a numeric address: "127.0.0.1:8080", "0.0.0.0:0", "[::1]:8080",
     * "[::]:8080". Port 0 picks a free port (http_server_port tells which). */
    const char *listen;
    /* A socket http_listen made (> 2), taken: the server serves on it and closes it, also
     * when http_server_new fails. 0: bind `listen` here. */
    int listen_fd;
    const struct http_route *routes; /* borrowed; must outlive the server */
    size_t nroutes;
    void *ctx;         /* handed to handlers by http_request_ctx */
    const char *token; /* bearer token; NULL or "" = no auth. Copied. */
    /* CORS: the Access-Control-Allow-Origin value put on every response ("*" lets any page,
     * file URLs included, read the API; a token still guards /v1); with it an OPTIONS
     * preflight on a routed path gets 204 and the allowed methods and headers. NULL or ""
     * = no CORS headers (OPTIONS is a 405). Copied. */
    const char *cors_origin;
    /* Cross-site defences (CONTRACT.md §7, README "Security"), always on:
     * - a state-changing request (any method but GET, HEAD, OPTIONS) from a foreign
     *   origin is 403: its Origin is neither the server's own (http(s)://<Host>) nor
     *   cors_origin ("*" admits every origin), or, without Origin, Sec-Fetch-Site says
     *   cross-site or same-site;
     * - a JSON route's body needs Content-Type: application/json (415 otherwise), so
     *   an HTML form or a "simple" cross-site fetch cannot post one;
     * - without a token, a route with HTTP_ROUTE_AUTH (what a token would guard) needs a
     *   Host header that names a loopback address (localhost, 127.x.y.z, [::1], with or
     *   without a port; any IP literal too when `listen` is not a loopback address) or
     *   it is 403: a DNS name that was rebound to 127.0.0.1 cannot reach the API. */

    unsigned threads;          /* 0/1 = one internal epoll thread; N = a pool of N */
    unsigned connection_limit; /* 0 = 1024 */
    unsigned per_ip_limit;     /* 0 = 256 */
    unsigned idle_timeout_s;   /* a connection with no traffic is closed; 0 = 60 */
    /* A client must deliver a whole request (headers and body) within this time of
     * connecting, or of its previous response plus idle_timeout_s on a kept-alive
     * connection; else the connection is cut (slow-loris defence). 0 = 30000. */
    unsigned request_timeout_ms;
    size_t memory_limit; /* per-connection buffer (request line + headers); 0 = 64 KiB */
    size_t max_body;     /* default body limit of routes; 0 = 1 MiB */

    /* Named users (docs/security.md; the api's api_users.c): all optional. A route with
     * HTTP_ROUTE_AUTH needs a bearer token when `token` is set or users_exist says there
     * are users (asked at each request, so a user added to the database counts at once);
     * else it is the open loopback mode (the Host check above) and its caller is the
     * built-in admin `local`. A token equal to `token` is the built-in admin `root`; any
     * other is handed to authenticate, which fills *out (DDPD_ENOTFOUND: no such token,
     * 401; another error is answered as is). Then authorize (may be NULL) decides whether
     * the request's principal (http_request_user) may make it: an error return (403 with
     * a sentence naming the role or owner needed) is answered before the body is read.
     * users_exist returns 1, 0, or -1 with err set (answered as is). On HTTP threads. */
    int (*users_exist)(void *ctx, struct ddpd_error *err);
    ddpd_err (*authenticate)(void *ctx, const char *token, size_t len, struct user *out,
                             struct ddpd_error *err);
    ddpd_err (*authorize)(void *ctx, struct http_request *req, struct ddpd_error *err);

    /* Optional: libmicrohttpd's own diagnostics, one line each. Called on HTTP threads. */
    void (*log)(void *ctx, const char *line);
};

/* Binds the listening socket and starts serving. NULL with `err` set when the address is
 * malformed, cannot be bound ("cannot listen on 127.0.0.1:8080: Address already in use"),
 * or a route pattern is invalid. Caller frees with http_server_free. */
struct http_server *http_server_new(const struct http_config *cfg, struct ddpd_error *err);

/* Binds and listens on `addr` (as http_config.listen) without serving yet, so that a
 * program holds its port before it does anything it cannot undo; connections wait in the
 * backlog until http_server_new serves the socket (http_config.listen_fd). Returns it
 * (never 0, 1 or 2), or -1 with `err` set as http_server_new sets it. */
int http_listen(const char *addr, struct ddpd_error *err);

/* Stops accepting, ends every open stream (their on_close gets HTTP_STREAM_SHUTDOWN, on
 * this or an HTTP thread, before this returns), closes all connections, waits for the
 * HTTP threads and frees. Must not be called from a handler or an on_close callback.
 * NULL is a no-op. */
void http_server_free(struct http_server *s);

/* The bound TCP port (the real one when the config asked for port 0). */
int http_server_port(const struct http_server *s);

/* Prometheus text-format lines of the layer's counters: requests by route pattern and
 * status (ddpd_http_requests_total{route="/v1/jobs/{id}",code="200"}; requests that
 * matched no route count under route="unmatched"). With # HELP / # TYPE lines. Returns
 * a new string; caller frees. */
char *http_server_metrics(struct http_server *s);
/* The streaming responses now open, and those ended because the client read too slowly
 * (its buffer full), since the start: the API reports them with the hub's own drops as
 * one concept (ddpd_stream_subscribers, ddpd_stream_subscribers_dropped_total). */
void http_server_stream_stats(struct http_server *s, size_t *open, unsigned long long *slow);

/* True when `addr` ("ADDR:PORT" as in http_config.listen) is a loopback address
 * (127.0.0.0/8 in any form inet_aton takes, "127.1" included, and "localhost"; ::1,
 * ::ffff:127.0.0.0/104). False for wildcards, others and malformed. */
bool http_addr_is_loopback(const char *addr);
/* True when `addr` is an address http_config.listen takes; false with why[cap] saying
 * what is wrong with it (the port out of range, no port, a host name). */
bool http_addr_check(const char *addr, char *why, size_t cap);

/* True when `host` (a Host header: "localhost:8080", "127.0.0.1", "[::1]:80") names the
 * loopback interface: localhost (case-insensitive), an IPv4 address in 127.0.0.0/8, or
 * [::1], each with an optional numeric port. With `any_ip`, any IPv4 or [IPv6] literal. */
bool http_host_is_local(const char *host, bool any_ip);

/* True when the Origin header value `origin` is the server's own origin for `host` (the
 * Host header): "http://HOST" or "https://HOST", host compared case-insensitively. */
bool http_origin_is_host(const char *origin, const char *host);

/* ---- the request (borrowed by handlers; valid until the handler returns) --------------- */

void *http_request_ctx(const struct http_request *req);          /* http_config.ctx */
const char *http_request_method(const struct http_request *req); /* "GET" (also for HEAD) */
const char *http_request_path(const struct http_request *req);   /* decoded, no query */
const char *http_request_route(const struct http_request *req);  /* the matched pattern */
/* The i-th `{...}` capture of the pattern, counted from 0; 0 when there is none. */
int64_t http_request_id(const struct http_request *req, int i);
/* The i-th segment of the request's path, counted from 0 ("/v1/users/bob": 2 is "bob"),
 * into buf[cap]; false (buf "") when there is none or it does not fit. */
bool http_request_segment(const struct http_request *req, int i, char *buf, size_t cap);
/* A request header (case-insensitive name), NULL when absent. Borrowed. */
const char *http_request_header(const struct http_request *req, const char *name);
/* Who makes the request (users.h): the user its bearer token names, the built-in `root`
 * (the token file's token) or `local` (no token needed); NULL on a route without
 * HTTP_ROUTE_AUTH. Borrowed, valid until the request is answered (http_deferred_done
 * included). */
const struct user *http_request_user(const struct http_request *req);
/* The parsed body of a JSON route. Borrowed: the request keeps its reference; take your
 * own with json_incref. */
struct json_t *http_request_json(const struct http_request *req);
/* The body bytes of a BODY route (NUL-terminated for convenience; *len without it). */
const char *http_request_body(const struct http_request *req, size_t *len);
/* For a deferred request (http_defer) not answered yet: true once the client has closed
 * its side of the connection or it failed (a peek at the socket reads EOF or an error),
 * so that work nobody waits for can stop. A parked connection is not watched by the
 * layer; this looks. Any thread, until http_deferred_done. (A client that half-closes
 * after its request reads as gone.) */
bool http_request_client_gone(struct http_request *req);

/* ---- query parameters -------------------------------------------------------------- */
/* A failed helper returns an error for the handler to return as is: the client gets 400
 * with code "bad_query", the parameter's name as `path` and a sentence naming it. An
 * absent (or empty) parameter gives the default. A handler never sees a name given twice
 * or a NUL byte (%00) in a name or value: the dispatcher answers those 400 bad_query on
 * every route first (and a %00 in the path 400 bad_request). */

/* The raw value (decoded), NULL when absent. Borrowed. */
const char *http_query(const struct http_request *req, const char *name);
/* The value check of http_query_int: a decimal integer within [min, max], nothing else
 * around it. */
bool http_param_int(const char *v, int64_t min, int64_t max, int64_t *out);
/* A decimal integer within [min, max]. */
ddpd_err http_query_int(struct http_request *req, const char *name, int64_t min, int64_t max, int64_t dflt,
                        int64_t *out, struct ddpd_error *err);
/* One of `choices` (NULL-terminated); *out is its index, or `dflt` when absent. */
ddpd_err http_query_enum(struct http_request *req, const char *name, const char *const *choices, int dflt,
                         int *out, struct ddpd_error *err);
/* A check of a parameter the handler makes itself ("before" must be a cursor it issued):
 * fails as an unknown parameter does (http_route.query), with the handler's sentence. */
ddpd_err http_query_error(struct http_request *req, const char *name, struct ddpd_error *err, const char *fmt,
                          ...) __attribute__((format(printf, 4, 5)));

/* ---- responses (exactly one per request) -------------------------------------------- */

/* `body` with Content-Type application/json (and a trailing newline). Steals `body`. */
ddpd_err http_respond_json(struct http_request *req, int status, struct json_t *body);
/* `len` bytes of `data` (copied) with `content_type` ("text/plain; charset=utf-8" when
 * NULL). */
ddpd_err http_respond_bytes(struct http_request *req, int status, const char *content_type, const void *data,
                            size_t len);
/* A NUL-terminated string as text/plain; charset=utf-8 (copied). */
ddpd_err http_respond_text(struct http_request *req, int status, const char *text);
/* The error body of a handler's error return (CONTRACT.md §7, the status of the error
 * table) as the response, so that headers set with http_response_header stay on it (a
 * 503's Retry-After); handlers and deferred answers may use it. */
ddpd_err http_respond_error(struct http_request *req, ddpd_err code, const struct ddpd_error *e);
/* No body (204, 202). */
ddpd_err http_respond_empty(struct http_request *req, int status);
/* The bytes of a regular file, streamed from disk, 200 with `content_type`, an ETag made
 * from the file's identity, size and mtime (If-None-Match -> 304), and `cache_control`
 * when not NULL. DDPD_ENOTFOUND (with `path` as the error path) when it is missing or
 * not a regular file. The caller has already checked that `path` may be served. */
ddpd_err http_respond_file(struct http_request *req, const char *path, const char *content_type,
                           const char *cache_control, struct ddpd_error *err);

/* `size` bytes that `read` makes as the client takes them (a file served in another
 * layout, never whole in memory): 200 with `content_type` and a Content-Length. `read` is
 * called on an HTTP thread, one call at a time, with the position and room for up to
 * `max` bytes; it returns how many it wrote (at least 1), or -1 to cut the connection (the
 * client sees a body shorter than its Content-Length). `done` (may be NULL) is called
 * once when the answer is over or was never sent: the last use of `arg`. Also on an error
 * return, so the caller hands `arg` over in every case. */
ddpd_err http_respond_reader(struct http_request *req, int64_t size, const char *content_type,
                             long (*read)(void *arg, uint64_t pos, char *buf, size_t max),
                             void (*done)(void *arg), void *arg, struct ddpd_error *err);

/* A deferred answer, for a handler whose work finishes on another thread (a job insert
 * waiting for its group commit): the handler calls http_defer and returns DDPD_OK without
 * a response, and the connection waits, costing no thread. The other thread then answers
 * as a handler would, with the http_respond_* functions (not a stream) and
 * http_response_header, and calls http_deferred_done exactly once; with rc != DDPD_OK
 * the error is answered instead, as for a handler's error return. `req` must not be used
 * after http_deferred_done. http_server_free waits until every deferred answer is sent. */
void http_defer(struct http_request *req);
void http_deferred_done(struct http_request *req, ddpd_err rc, const struct ddpd_error *err);

/* Extra response header, e.g. ("Location", "/v1/jobs/7"). Copied; before or after the
 * respond call. At most 8 per request (more are dropped). */
void http_response_header(struct http_request *req, const char *name, const char *value);
/* Sets the response's ETag (a quoted string: "\"v7\""). When the request's If-None-Match
 * matches and the status is 200, the client gets 304 without a body instead. */
void http_response_etag(struct http_request *req, const char *etag);

/* ---- streams (Server-Sent Events, NDJSON) ------------------------------------------------ */

enum http_stream_end {
    HTTP_STREAM_DONE,     /* the owner closed it and every byte was sent */
    HTTP_STREAM_GONE,     /* the client went away, timed out, or the connection failed */
    HTTP_STREAM_SLOW,     /* the client read too slowly: its buffer hit max_buffer */
    HTTP_STREAM_SHUTDOWN, /* the server is shutting down */
};

struct http_stream_opts {
    const char *content_type; /* "text/event-stream", "application/x-ndjson" */
    size_t max_buffer;        /* bytes queued for this client before it is slow; 0 = 1 MiB */
    /* Called exactly once per stream, when it has ended for any reason (also after
     * http_stream_close), on an HTTP thread or in http_server_free; never from inside
     * http_stream_write/close. The last use of `arg` by the layer. May be NULL. */
    void (*on_close)(void *arg, enum http_stream_end why);
    void *arg;
    /* Optional pull mode, for an owner that keeps its own queue (the event hub): when the
     * client can take bytes and nothing written is pending, the layer calls pull on an
     * HTTP thread, under no lock of its own. It copies up to `cap` bytes into `buf` and
     * returns how many; 0 when it has nothing now (the connection is parked until
     * http_stream_wake); -1 to end the stream normally (the owner still calls
     * http_stream_close). NULL = push mode only (http_stream_write). */
    long (*pull)(void *arg, char *buf, size_t cap);
};

/* Answers the request with a chunked stream (status 200, the content type, Cache-Control:
 * no-cache, X-Accel-Buffering: no) and hands out *out, the owner's reference. The owner
 * writes with http_stream_write from any thread and must call http_stream_close(*out)
 * exactly once, also when on_close has already said the stream ended. DDPD_EBUSY when the
 * server is shutting down. */
ddpd_err http_respond_stream(struct http_request *req, const struct http_stream_opts *o,
                             struct http_stream **out, struct ddpd_error *err);

/* Queues `len` bytes for the client. Thread-safe; never blocks on the network; a write is
 * queued whole or not at all. DDPD_OK; DDPD_EBUSY when it would pass max_buffer: the
 * stream is then ended as slow (its buffer freed, the connection cut); DDPD_ECANCELED
 * when the stream has already ended. A dead client is only noticed on a write, so owners
 * send a heartbeat (": ping\n\n" for SSE) now and then. */
ddpd_err http_stream_write(struct http_stream *s, const void *data, size_t len);

/* Pull mode: there is something to pull now (or the owner wants pull called again). Any
 * thread, any time; a wake that races with a pull returning 0 is not lost. */
void http_stream_wake(struct http_stream *s);

/* The owner is done: what is queued is still sent, then the response ends normally (the
 * connection stays open for the next request). Releases the owner's reference; `s` must
 * not be used afterwards. Thread-safe. NULL is a no-op. */
void http_stream_close(struct http_stream *s);

#endif
