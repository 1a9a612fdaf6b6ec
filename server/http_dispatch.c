/* http_dispatch.c — the checks made before any handler runs, in order: the body's framing,
 * the target's size, the route (404/405, CORS preflight), Origin, Host, the bearer token,
 * the media type, the body's limit; then the JSON parse, the route's query list and the
 * handler. Holds no job logic. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "../base/alloc.h"
#include "../base/check.h"
#include "http_impl.h"

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
    return s->token && http_token_equal(s->token, s->token_len, given, glen);
}

static void invalid_token(struct http_request *req)
{
    http_response_header(req, MHD_HTTP_HEADER_WWW_AUTHENTICATE,
                         "Bearer realm=\"ddpd\", error=\"invalid_token\"");
    set_pending(req, DDPD_EAUTH, "", "the bearer token is not valid");
}

/* The bearer token to a principal: the token file's (root) or a user's. */
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
    if (!t || n == 0) {
        invalid_token(req);
        return;
    }
    if (token_ok(s, t, n)) {
        user_builtin(&req->user, USER_ROOT);
        req->has_user = true;
        return;
    }
    if (!s->cfg.authenticate) {
        invalid_token(req);
        return;
    }
    struct ddpd_error e;
    ddpd_error_clear(&e);
    ddpd_err rc = s->cfg.authenticate(s->cfg.ctx, t, n, &req->user, &e);
    if (rc == DDPD_OK)
        req->has_user = true;
    else if (rc == DDPD_ENOTFOUND || rc == DDPD_EAUTH)
        invalid_token(req);
    else
        set_pending(req, rc, "", "%s", e.message);
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
    http__clean_copy(shown, sizeof shown, host, 64);
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
            http__clean_copy(shown, sizeof shown, origin, 64);
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
    http__clean_copy(shown, sizeof shown, p, 64);
    set_pending(req, DDPD_EMEDIATYPE, "Content-Type",
                "%s %s needs 'Content-Type: application/json'; got %s%s%s", req->method,
                req->route->r->pattern, ct ? "'" : "none", ct ? shown : "", ct ? "'" : "");
    return true;
}

/* An AUTH route: who asks (a token when the server has a token file or users; else the
 * open loopback mode's Host check and `local`), then whether they may (cfg.authorize). */
static void authenticate(struct http_request *req)
{
    struct http_server *s = req->srv;
    struct ddpd_error e;
    ddpd_error_clear(&e);
    int required = s->token != NULL;
    if (!required && s->cfg.users_exist && (required = s->cfg.users_exist(s->cfg.ctx, &e)) < 0) {
        set_pending(req, e.code ? e.code : DDPD_EUNAVAIL, "", "%s", e.message);
        return;
    }
    if (required) {
        check_auth(req);
    } else if (!check_host(req)) {
        user_builtin(&req->user, USER_LOCAL);
        req->has_user = true;
    }
    if (!req->pending && s->cfg.authorize) {
        ddpd_error_clear(&e);
        ddpd_err rc = s->cfg.authorize(s->cfg.ctx, req, &e);
        if (rc)
            set_pending(req, rc, e.path, "%s", e.message);
    }
}

/* First call: framing, target, route, method, Host and Origin, auth, media type, declared
 * size. Returns true to answer at once. */
bool http__request_begin(struct http_request *req)
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
    if (req->path_nul) {
        set_pending(req, DDPD_EREQUEST, "", "the request path contains a NUL byte (%%00)");
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
    req->route = http__route_find(s->routes, s->nroutes, req->method, req->url, req->ids, &path_hit, allow,
                                  sizeof allow);
    char shown[160];
    http__clean_copy(shown, sizeof shown, req->url, 128);
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
        authenticate(req);
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
void http__request_body(struct http_request *req, const char *data, size_t n)
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
void http__handler_failed(struct http_request *req, ddpd_err rc, const struct ddpd_error *e)
{
    if (req->resp) {
        /* For a stream this ends it (on_close runs now, on this thread). */
        MHD_destroy_response(req->resp);
        req->resp = NULL;
    }
    http__clear_headers(req);
    http__respond_error(req, rc, e);
}

/* Final call: the checks that need the body, then the handler. */
void http__request_dispatch(struct http_request *req)
{
    if (req->pending) {
        http__respond_error(req, req->pending, &req->perr);
        return;
    }
    if (req->too_big) {
        struct ddpd_error e;
        ddpd_error_set(&e, DDPD_ETOOBIG, "", "request body is larger than the limit of %zu bytes",
                       req->limit);
        http__respond_error(req, DDPD_ETOOBIG, &e);
        return;
    }
    const struct http_route *r = req->route->r;
    if (r->flags & HTTP_ROUTE_JSON) {
        struct ddpd_error e;
        if (http_body_json(req->body, req->body_len, &req->json, &e) != DDPD_OK) {
            http__respond_error(req, DDPD_EJSON, &e);
            return;
        }
    }
    struct ddpd_error e;
    ddpd_error_clear(&e);
    if (http__query_unambiguous(req, &e) != DDPD_OK ||
        (r->query && http__query_allow(req, r->query, &e) != DDPD_OK)) {
        http__respond_error(req, e.code, &e);
        return;
    }
    ddpd_err rc = r->handler(req, &e);
    if (rc != DDPD_OK)
        http__handler_failed(req, rc, &e);
}
