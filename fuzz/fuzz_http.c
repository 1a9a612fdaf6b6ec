/* fuzz_http.c — the HTTP request path of ddpd serve without a socket: route matching over
 * the server's real route table (api_routes), the query parameters' value checks, and the
 * body of a JSON route through the dispatcher's parse (line and column on errors) into the
 * spec validator that POST /v1/jobs runs first. The input is a request as a client writes
 * it: "METHOD TARGET\n", header lines, an empty line, the body. The path and the query's
 * names and values are percent-decoded by libmicrohttpd's own MHD_http_unescape, as
 * libmicrohttpd does before ddpd sees them. */
#include <jansson.h>
#include <stdbool.h>
#include <microhttpd.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "schema/spec.h"
#include "server/api.h"
#include "server/http.h"
#include "server/store.h"

#define MAX_TARGET 8192

static void check_lookup(const struct http_route *routes, size_t n, const char *method, const char *path)
{
    int64_t ids[HTTP_MAX_CAPTURES];
    char allow[128];
    int rc = http_route_lookup(routes, n, method, path, ids, allow, sizeof allow);
    if (rc == -3 || rc < -3 || rc >= (int)n) {
        fprintf(stderr, "http_route_lookup: %d for the server's own table\n", rc);
        abort();
    }
    if (rc >= 0) {
        const char *want = strcmp(method, "HEAD") ? method : "GET";
        if (strcmp(routes[rc].method, want) != 0)
            abort();
        /* Every capture is a positive id, and the pattern has as many segments. */
        int caps = 0;
        for (const char *p = routes[rc].pattern; (p = strchr(p, '{')); p++)
            caps++;
        for (int i = 0; i < caps; i++)
            if (ids[i] < 1)
                abort();
    }
    if (rc == -2 && !allow[0])
        abort();
}

/* "a=1&b=%41" -> each decoded name and value into the checks handlers make. */
static void check_query(char *q)
{
    for (char *save, *kv = strtok_r(q, "&", &save); kv; kv = strtok_r(NULL, "&", &save)) {
        char *v = strchr(kv, '=');
        if (v)
            *v++ = '\0';
        MHD_http_unescape(kv);
        if (!v || !*v)
            continue;
        MHD_http_unescape(v);
        int64_t x = 0, y = 0;
        bool narrow = http_param_int(v, 1, STORE_LIST_MAX, &x);
        bool wide = http_param_int(v, INT64_MIN, INT64_MAX, &y);
        if (narrow && (!wide || x != y || x < 1 || x > STORE_LIST_MAX))
            abort();
        if (!strcmp(kv, "state")) {
            char buf[256];
            snprintf(buf, sizeof buf, "%s", v);
            for (char *s2, *t = strtok_r(buf, ",", &s2); t; t = strtok_r(NULL, ",", &s2)) {
                job_state st;
                if (job_state_parse(t, &st) && strcmp(job_state_name(st), t) != 0)
                    abort();
            }
        }
    }
}

static void check_body(const struct http_route *r, const char *body, size_t len)
{
    size_t limit = r->max_body ? r->max_body : (size_t)1 << 20;
    if (!(r->flags & HTTP_ROUTE_JSON) || len > limit)
        return;
    struct ddpd_error err;
    json_t *doc = NULL;
    ddpd_err rc = http_body_json(body, len, &doc, &err);
    if (rc != DDPD_OK) {
        if (rc != DDPD_EJSON || doc || !err.message[0] || err.line < 0 || err.column < 0)
            abort();
        return;
    }
    static struct spec s;
    struct spec_parse_opts po = {.default_device = DEVICE_CPU};
    rc = spec_from_json(doc, &po, &s, &err);
    if (rc != DDPD_OK && (rc != DDPD_ESPEC || !err.message[0] || !ddpd_err_code(rc)))
        abort();
    if (rc == DDPD_OK) {
        json_t *back = spec_to_json(&s);
        char *text = json_dumps(back, JSON_COMPACT);
        free(text);
        json_decref(back);
    }
    json_decref(doc);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static char target[MAX_TARGET];
    size_t n;
    const struct http_route *routes = api_routes(NULL, &n);
    const char *p = (const char *)data, *end = p + size;

    /* request line */
    const char *nl = memchr(p, '\n', size);
    const char *line_end = nl ? nl : end;
    const char *sp = memchr(p, ' ', (size_t)(line_end - p));
    if (!sp)
        return 0;
    char method[16];
    size_t mlen = (size_t)(sp - p);
    if (mlen == 0 || mlen >= sizeof method)
        return 0;
    memcpy(method, p, mlen);
    method[mlen] = '\0';
    size_t tlen = (size_t)(line_end - sp - 1);
    if (tlen > 0 && sp[tlen] == '\r')
        tlen--;
    if (tlen >= sizeof target || memchr(sp + 1, '\0', tlen))
        return 0;
    memcpy(target, sp + 1, tlen);
    target[tlen] = '\0';
    char *query = strchr(target, '?');
    if (query)
        *query++ = '\0';
    MHD_http_unescape(target);
    check_lookup(routes, n, method, target);
    if (query)
        check_query(query);

    /* headers up to an empty line, then the body; Host and Origin go through the
     * dispatcher's cross-site checks (a loopback name is also an IP-or-loopback one) */
    static char host[1024], origin[1024];
    host[0] = origin[0] = '\0';
    const char *q = nl ? nl + 1 : end;
    while (q < end) {
        const char *ls = q, *e = memchr(q, '\n', (size_t)(end - q));
        size_t l = (size_t)((e ? e : end) - q);
        q = e ? e + 1 : end;
        if (l == 0 || (l == 1 && ls[0] == '\r'))
            break;
        size_t vl = l && ls[l - 1] == '\r' ? l - 1 : l;
        char *dst = vl > 6 && !strncasecmp(ls, "Host: ", 6)     ? host
                    : vl > 8 && !strncasecmp(ls, "Origin: ", 8) ? origin
                                                                : NULL;
        size_t skip = dst == host ? 6 : 8;
        if (dst && vl - skip < sizeof host && !memchr(ls + skip, '\0', vl - skip)) {
            memcpy(dst, ls + skip, vl - skip);
            dst[vl - skip] = '\0';
        }
    }
    if (host[0]) {
        bool local = http_host_is_local(host, false);
        if (local && !http_host_is_local(host, true))
            abort();
        if (origin[0] && http_origin_is_host(origin, host) && strlen(origin) <= strlen(host))
            abort();
    }
    int64_t ids[HTTP_MAX_CAPTURES];
    char allow[128];
    int rc = http_route_lookup(routes, n, method, target, ids, allow, sizeof allow);
    if (rc >= 0)
        check_body(&routes[rc], q, (size_t)(end - q));
    return 0;
}
