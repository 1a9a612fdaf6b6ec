/* http_request.c — what a handler reads of its request: the method, path, captures,
 * headers and body, and the query parameters (the route's list of names, integers and
 * enums with errors that name the parameter). */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "../base/parse.h"
#include "http_impl.h"

/* ---- client text in messages ---------------------------------------------------------------- */

/* Client text inside our messages: at most `max` bytes, printable ASCII only. */
void http__clean_copy(char *dst, size_t cap, const char *src, size_t max)
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

bool http_request_segment(const struct http_request *req, int i, char *buf, size_t cap)
{
    const char *p = req->url;
    buf[0] = '\0';
    for (int k = 0; *p == '/'; k++) {
        p++;
        size_t n = strcspn(p, "/");
        if (k == i) {
            if (n >= cap)
                return false;
            memcpy(buf, p, n);
            buf[n] = '\0';
            return true;
        }
        p += n;
    }
    return false;
}

const struct user *http_request_user(const struct http_request *req)
{
    return req->has_user ? &req->user : NULL;
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

bool http_request_client_gone(struct http_request *req)
{
    int fd = req->conn ? req->conn->fd : -1;
    if (fd < 0)
        return false;
    char c;
    ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
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
        http__clean_copy(shown, sizeof shown, key, 32);
        if (!ps->n)
            snprintf(ps->first, sizeof ps->first, "%s", shown);
        if (used + strlen(shown) + 5 < sizeof ps->unknown)
            snprintf(ps->unknown + used, sizeof ps->unknown - used, "%s'%s'", ps->n ? ", " : "", shown);
        ps->n++;
    }
    return MHD_YES;
}

/* The route's query list (http_route.query) against the request's parameters. */
ddpd_err http__query_allow(struct http_request *req, const char *allowed, struct ddpd_error *err)
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

/* A parameter as libmicrohttpd decoded it, with the decoded sizes: "%00" becomes a NUL
 * that strlen stops at, so only the sizes tell "model%00" from "model". */
struct query_param {
    const char *name, *value; /* value NULL: "?flag" without '=' */
    size_t name_len, value_len;
};

struct query_list {
    struct query_param p[HTTP_MAX_QUERY_PARAMS];
    unsigned n;
};

static enum MHD_Result query_collect(void *cls, enum MHD_ValueKind kind, const char *key, size_t key_size,
                                     const char *value, size_t value_size)
{
    (void)kind;
    struct query_list *q = cls;
    if (q->n == HTTP_MAX_QUERY_PARAMS) /* never: uri_seen cut a longer query to nothing */
        return MHD_NO;
    q->p[q->n++] = (struct query_param){key ? key : "", value, key ? key_size : 0, value ? value_size : 0};
    return MHD_YES;
}

/* Every route's query, before its own list: a name given twice is refused, since which
 * value counts would be a guess (http_query reads the first), and so is a NUL byte in a
 * name or value, since the handler would read only up to it ("file=model%00" was the
 * model). The first fault in the query's order is named. */
ddpd_err http__query_unambiguous(struct http_request *req, struct ddpd_error *err)
{
    struct query_list q = {.n = 0};
    MHD_get_connection_values_n(req->mc, MHD_GET_ARGUMENT_KIND, query_collect, &q);
    for (unsigned i = 0; i < q.n; i++) {
        const struct query_param *p = &q.p[i];
        char shown[48];
        http__clean_copy(shown, sizeof shown, p->name, 32);
        if (strlen(p->name) != p->name_len)
            return http_query_error(req, shown, err,
                                    "query parameter '%s' contains a NUL byte (%%00) in its name", shown);
        if (p->value && strlen(p->value) != p->value_len)
            return http_query_error(req, shown, err,
                                    "query parameter '%s' contains a NUL byte (%%00) in its value", shown);
        unsigned times = 0;
        for (unsigned j = 0; j < q.n; j++)
            times += q.p[j].name_len == p->name_len && !memcmp(q.p[j].name, p->name, p->name_len);
        if (times > 1) {
            char how[24] = "twice";
            if (times > 2)
                snprintf(how, sizeof how, "%u times", times);
            return http_query_error(req, shown, err, "query parameter '%s' is given %s; give it once", shown,
                                    how);
        }
    }
    return DDPD_OK;
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
        http__clean_copy(shown, sizeof shown, v, 32);
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
    http__clean_copy(shown, sizeof shown, v, 32);
    return http_query_error(req, name, err, "query parameter '%s' must be one of %s; got '%s'", name, list,
                            shown);
}
