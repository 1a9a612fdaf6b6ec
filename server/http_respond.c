/* http_respond.c — a request's answer: the http_respond_* bodies, extra headers and the
 * ETag (304 on a match), the error body of CONTRACT.md §7, and queueing the answer on
 * the connection. Decides nothing about what to answer. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../base/alloc.h"
#include "../base/check.h"
#include "../schema/jsonnum.h"
#include "http_impl.h"

/* ---- responses ------------------------------------------------------------------------------ */

bool http__responded(struct http_request *req)
{
    return req->resp != NULL;
}

void http__set_response(struct http_request *req, int status, struct MHD_Response *r)
{
    ASSERT(r);
    req->resp = r;
    req->status = status;
}

void http__add_content_type(struct MHD_Response *r, const char *ct)
{
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ct);
}

ddpd_err http_respond_bytes(struct http_request *req, int status, const char *content_type, const void *data,
                            size_t len)
{
    if (http__responded(req))
        return DDPD_EINTERNAL;
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)data, MHD_RESPMEM_MUST_COPY);
    if (!r)
        return DDPD_ENOMEM;
    http__add_content_type(r, content_type ? content_type : "text/plain; charset=utf-8");
    http__set_response(req, status, r);
    return DDPD_OK;
}

ddpd_err http_respond_text(struct http_request *req, int status, const char *text)
{
    return http_respond_bytes(req, status, NULL, text, strlen(text));
}

ddpd_err http_respond_empty(struct http_request *req, int status)
{
    if (http__responded(req))
        return DDPD_EINTERNAL;
    struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (!r)
        return DDPD_ENOMEM;
    http__set_response(req, status, r);
    return DDPD_OK;
}

ddpd_err http_respond_json(struct http_request *req, int status, json_t *body)
{
    if (!body)
        return DDPD_EINTERNAL;
    if (http__responded(req)) {
        json_decref(body);
        return DDPD_EINTERNAL;
    }
    char *text = json_dumps(body, JSON_COMPACT | JSON_ENCODE_ANY);
    json_decref(body);
    if (!text)
        return DDPD_ENOMEM;
    size_t n = jsonnum_tidy(text, strlen(text)); /* reals without float noise */
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
    http__add_content_type(r, "application/json");
    http__set_response(req, status, r);
    return DDPD_OK;
}

ddpd_err http_respond_file(struct http_request *req, const char *path, const char *content_type,
                           const char *cache_control, struct ddpd_error *err)
{
    if (http__responded(req))
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
    http__add_content_type(r, content_type ? content_type : "application/octet-stream");
    if (cache_control)
        MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, cache_control);
    http__set_response(req, 200, r);
    char etag[96];
    snprintf(etag, sizeof etag, "\"%llx-%llx-%llx\"", (unsigned long long)st.st_ino,
             (unsigned long long)st.st_size,
             (unsigned long long)st.st_mtim.tv_sec * 1000000000ull + (unsigned long long)st.st_mtim.tv_nsec);
    http_response_etag(req, etag);
    return DDPD_OK;
}

/* http_respond_reader's callback and its argument, as libmicrohttpd holds them. */
struct reader {
    long (*read)(void *arg, uint64_t pos, char *buf, size_t max);
    void (*done)(void *arg);
    void *arg;
};

static ssize_t reader_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct reader *r = cls;
    long n = r->read(r->arg, pos, buf, max);
    return n > 0 ? (ssize_t)n : MHD_CONTENT_READER_END_WITH_ERROR;
}

static void reader_free(void *cls)
{
    struct reader *r = cls;
    if (r->done)
        r->done(r->arg);
    free(r);
}

ddpd_err http_respond_reader(struct http_request *req, int64_t size, const char *content_type,
                             long (*read)(void *arg, uint64_t pos, char *buf, size_t max),
                             void (*done)(void *arg), void *arg, struct ddpd_error *err)
{
    struct reader *rd = malloc(sizeof *rd);
    if (http__responded(req) || !rd || size < 0) {
        free(rd);
        if (done)
            done(arg);
        return ddpd_error_set(err, rd ? DDPD_EINTERNAL : DDPD_ENOMEM, "",
                              rd ? "a response was already set" : "out of memory");
    }
    *rd = (struct reader){.read = read, .done = done, .arg = arg};
    /* libmicrohttpd owns rd from here (reader_free runs with the response's end). */
    struct MHD_Response *r =
        MHD_create_response_from_callback((uint64_t)size, 64 * 1024, reader_read, rd, reader_free);
    if (!r) {
        reader_free(rd);
        return ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory");
    }
    http__add_content_type(r, content_type);
    http__set_response(req, 200, r);
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

void http__clear_headers(struct http_request *req)
{
    for (int i = 0; i < req->nhdr; i++) {
        free(req->hdr[i].name);
        free(req->hdr[i].value);
    }
    req->nhdr = 0;
    free(req->etag);
    req->etag = NULL;
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

/* The error body of CONTRACT.md §7 with the status of the error table. */
void http__respond_error(struct http_request *req, ddpd_err code, const struct ddpd_error *e)
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

ddpd_err http_respond_error(struct http_request *req, ddpd_err code, const struct ddpd_error *e)
{
    if (http__responded(req))
        return DDPD_EINTERNAL;
    http__respond_error(req, code, e);
    return req->resp ? DDPD_OK : DDPD_ENOMEM;
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
enum MHD_Result http__queue(struct http_request *req)
{
    if (!req->resp) /* a handler that returned OK without answering */
        http__respond_error(req, DDPD_EINTERNAL, NULL);
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
    if (req->srv->cors) {
        MHD_add_response_header(req->resp, "Access-Control-Allow-Origin", req->srv->cors);
        /* A cross-origin page reads only the safelisted headers unless told: the dashboard
         * shows a 503's Retry-After (inference's queue is full). */
        MHD_add_response_header(req->resp, "Access-Control-Expose-Headers", "Retry-After");
    }
    enum MHD_Result rc = MHD_queue_response(req->mc, (unsigned)req->status, req->resp);
    MHD_destroy_response(req->resp);
    req->resp = NULL;
    http__count(req->srv, req->row, req->status);
    return rc;
}
