/* http_route.c — the route table compiled for matching (literal and `{id}` segments,
 * 404 and 405 with the Allow list), and the request counters by route and status that
 * /metrics prints. Knows nothing of connections. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/alloc.h"
#include "../base/check.h"
#include "http_impl.h"

/* ---- routes ------------------------------------------------------------------------------ */

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

/* A word segment ({name:word}): 1..64 bytes of [A-Za-z0-9._-] (a user's name). */
static bool is_word(const char *s, size_t n)
{
    if (n == 0 || n > 64)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
              c == '_' || c == '-'))
            return false;
    }
    return true;
}

bool http__route_compile(struct route_rt *rt, const struct http_route *r)
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
            rt->word[i] = n > 7 && !memcmp(s + n - 6, ":word}", 6);
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
        if (rt->capture[i] && rt->word[i]) {
            if (!is_word(seg[i], len[i]))
                return false;
            ids[k++] = 0;
        } else if (rt->capture[i]) {
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
const struct route_rt *http__route_find(const struct route_rt *rts, size_t n, const char *method,
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
        if (!http__route_compile(&rts[i], &routes[i]))
            goto out;
    memset(ids, 0, MAX_CAPTURES * sizeof *ids);
    rt = http__route_find(rts, n, method, path, ids, &hit, allow, allow_cap);
    rc = rt ? (int)(rt - rts) : hit ? -2 : -1;
out:
    free(rts);
    return rc;
}

/* Statuses counted one by one; anything else counts as "other". */
static const int status_list[] = {200, 201, 202, 204, 206, 301, 302, 304, 400, 401, 403, 404, 405,
                                  408, 409, 413, 415, 422, 429, 431, 500, 501, 502, 503, 504, 507};
_Static_assert(sizeof status_list / sizeof status_list[0] == NSTATUS - 1,
               "NSTATUS (http_impl.h) is status_list and other");

static int status_index(int status)
{
    for (int i = 0; i < NSTATUS - 1; i++)
        if (status_list[i] == status)
            return i;
    return NSTATUS - 1;
}

void http__count(struct http_server *s, int row, int status)
{
    atomic_fetch_add_explicit(&s->counts[(size_t)row * NSTATUS + status_index(status)], 1,
                              memory_order_relaxed);
}

/* ---- the counters' text -------------------------------------------------------------------- */

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
