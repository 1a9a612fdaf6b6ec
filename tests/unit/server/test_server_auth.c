/* test_server_auth.c — the bearer token on every route of the server's real route table
 * (api_routes(), iterated, not copied): every /v1 row needs it, the rows that don't are
 * the documented open ones (CONTRACT.md §7: /healthz, the dashboard; and /metrics), every
 * row is reachable by its own pattern, and over HTTP each row that needs the token answers
 * 401 to no token and to wrong ones before its handler runs (the handlers get no context
 * here: one that ran would crash the test). And the token compare is constant-time. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "server/api.h"
#include "server/http.h"

#define TOKEN "t0ken-0f5e9b2c7a1d"

/* The rows that may answer without a token. */
static bool open_route(const char *pattern)
{
    return !strcmp(pattern, "/healthz") || !strcmp(pattern, "/metrics") || !strcmp(pattern, "/") ||
           !strcmp(pattern, "/web") || !strncmp(pattern, "/web/", 5) || !strcmp(pattern, "/compare");
}

/* The pattern with every {name} segment replaced by 7. */
static void concrete(const char *pattern, char *out, size_t cap)
{
    size_t o = 0;
    for (const char *p = pattern; *p && o + 2 < cap;) {
        if (*p == '{') {
            const char *close = strchr(p, '}');
            out[o++] = '7';
            p = close ? close + 1 : p + strlen(p);
        } else {
            out[o++] = *p++;
        }
    }
    out[o] = '\0';
}

/* One request on its own connection; the status, and whether a WWW-Authenticate: Bearer
 * header came back. -1 when the exchange failed. */
static int request(int port, const char *method, const char *path, const char *auth, bool *bearer)
{
    char req[1024], resp[16384];
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {
        .sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    struct timeval tv = {5, 0};
    *bearer = false;
    if (fd < 0)
        return -1;
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    bool post = !strcmp(method, "POST");
    int n = snprintf(req, sizeof req, "%s %s HTTP/1.1\r\nHost: t\r\nConnection: close\r\n%s%s%s%s", method,
                     path, auth ? "Authorization: " : "", auth ? auth : "", auth ? "\r\n" : "",
                     post ? "Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}" : "\r\n");
    size_t got = 0;
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0 || write(fd, req, (size_t)n) != n) {
        close(fd);
        return -1;
    }
    for (ssize_t k; got + 1 < sizeof resp && (k = read(fd, resp + got, sizeof resp - 1 - got)) > 0;)
        got += (size_t)k;
    close(fd);
    resp[got] = '\0';
    int status = -1;
    if (sscanf(resp, "HTTP/1.1 %d", &status) != 1)
        return -1;
    for (char *h = strstr(resp, "\r\n"); h && h[2] != '\r'; h = strstr(h + 2, "\r\n"))
        if (!strncasecmp(h + 2, "WWW-Authenticate: Bearer", 24))
            *bearer = true;
    return status;
}

typedef bool (*equal_fn)(const char *, size_t, const char *, size_t);

/* Seconds of `reps` compares. */
static double time_compare(equal_fn eq, const char *tok, size_t n, const char *given, size_t glen, int reps)
{
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (int i = 0; i < reps; i++) {
        volatile bool r = eq(tok, n, given, glen);
        (void)r;
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    return (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) * 1e-9;
}

/* A compare that stops at the first difference, as memcmp does (not memcmp itself: the
 * sanitizers' memcmp reads both buffers whole), the control of the timing test. */
static bool early_exit_equal(const char *token, size_t token_len, const char *given, size_t glen)
{
    if (glen != token_len)
        return false;
    for (size_t i = 0; i < token_len; i++)
        if (token[i] != given[i])
            return false;
    return true;
}

/* The token compare takes as long whether the first or the last byte is wrong, or the
 * given token is short: with a 64 KiB token, a compare that stops at the first difference
 * (the control) is hundreds of times faster when the first byte is wrong. The cases are
 * timed in turns and each keeps its best round, so a busy machine slows them alike; the
 * bounds (a factor of 3, for sanitizer builds) are wide next to what an early exit does. */
static void test_constant_time(void)
{
    enum { N = 64 * 1024, REPS = 40, ROUNDS = 25, CASES = 6 };
    static char tok[N], first[N], last[N];
    for (size_t i = 0; i < N; i++)
        tok[i] = first[i] = last[i] = (char)('a' + i % 26);
    first[0] ^= 1;
    last[N - 1] ^= 1;
    CHECK(http_token_equal(tok, N, tok, N));
    CHECK(!http_token_equal(tok, N, first, N) && !http_token_equal(tok, N, last, N));
    CHECK(!http_token_equal(tok, N, tok, N - 1) && !http_token_equal(tok, N, tok, 0));
    const struct {
        equal_fn eq;
        const char *given;
        size_t glen;
    } c[CASES] = {{http_token_equal, last, N}, {http_token_equal, first, N}, {http_token_equal, tok, N},
                  {http_token_equal, tok, 1},  {early_exit_equal, last, N},  {early_exit_equal, first, N}};
    double best[CASES];
    for (int k = 0; k < CASES; k++)
        best[k] = 1e9;
    for (int round = 0; round < ROUNDS; round++)
        for (int k = 0; k < CASES; k++) {
            double t = time_compare(c[k].eq, tok, N, c[k].given, c[k].glen, REPS);
            if (t < best[k])
                best[k] = t;
        }
    double first_r = best[1] / best[0], same_r = best[2] / best[0], short_r = best[3] / best[0];
    double control = best[5] / best[4];
    fprintf(stderr,
            "  token compare, first/last byte wrong: %.2f (equal: %.2f, 1 byte given: %.2f); "
            "early-exit control: %.4f\n",
            first_r, same_r, short_r, control);
    CHECK(control < 0.1); /* the measurement sees an early exit */
    CHECK(first_r > 0.33 && first_r < 3.0);
    CHECK(same_r > 0.33 && same_r < 3.0);
    CHECK(short_r > 0.33 && short_r < 3.0);
}

int main(void)
{
    test_constant_time();

    size_t n;
    const struct http_route *routes = api_routes(NULL, &n);
    CHECK(n >= 10);

    /* The table's policy, row by row. */
    int auth_rows = 0;
    for (size_t i = 0; i < n; i++) {
        const struct http_route *r = &routes[i];
        bool auth = r->flags & HTTP_ROUTE_AUTH;
        bool v1 = !strncmp(r->pattern, "/v1/", 4) || !strcmp(r->pattern, "/v1");
        if (v1 && !auth)
            CHECK__FAIL("%s %s: a /v1 route without HTTP_ROUTE_AUTH", r->method, r->pattern);
        if (!auth && !open_route(r->pattern))
            CHECK__FAIL("%s %s: open without a token, and not one of the documented open routes", r->method,
                        r->pattern);
        check__count += 2;
        auth_rows += auth;
        /* Every row answers its own pattern (none is shadowed by an earlier one). */
        char path[256], allow[128];
        int64_t ids[HTTP_MAX_CAPTURES];
        concrete(r->pattern, path, sizeof path);
        CHECK_EQ_INT(http_route_lookup(routes, n, r->method, path, ids, allow, sizeof allow), (long long)i);
    }
    CHECK(auth_rows >= 9);

    /* Over HTTP, with a token configured: every auth row refuses every wrong credential. */
    struct ddpd_error err;
    struct http_config cfg = {
        .listen = "127.0.0.1:0", .routes = routes, .nroutes = n, .ctx = NULL, .token = TOKEN};
    struct http_server *s = http_server_new(&cfg, &err);
    CHECK(s != NULL);
    if (!s)
        CHECK_DONE();
    int port = http_server_port(s);
    static const char *const wrong[] = {
        NULL,                        /* no header */
        "Bearer",                    /* no token */
        "Bearer ",                   /* empty token */
        "Bearer " TOKEN "x",         /* one byte more */
        "Bearer t0ken-0f5e9b2c7a1",  /* one byte less */
        "Bearer T0KEN-0F5E9B2C7A1D", /* another case */
        "Bearer u0ken-0f5e9b2c7a1d", /* first byte wrong */
        "Bearer t0ken-0f5e9b2c7a1e", /* last byte wrong */
        "Basic " TOKEN,              /* another scheme */
        TOKEN,                       /* no scheme */
        "Bearer " TOKEN "\t" TOKEN,  /* the token twice */
    };
    int tried = 0;
    for (size_t i = 0; i < n; i++) {
        const struct http_route *r = &routes[i];
        if (!(r->flags & HTTP_ROUTE_AUTH))
            continue;
        char path[256];
        concrete(r->pattern, path, sizeof path);
        for (size_t w = 0; w < sizeof wrong / sizeof wrong[0]; w++) {
            for (int head = 0; head < 1 + !strcmp(r->method, "GET"); head++) {
                bool bearer;
                const char *m = head ? "HEAD" : r->method;
                int st = request(port, m, path, wrong[w], &bearer);
                tried++;
                if (st != 401 || !bearer)
                    CHECK__FAIL("%s %s with %s: status %d, WWW-Authenticate Bearer %s", m, path,
                                wrong[w] ? wrong[w] : "(no Authorization)", st,
                                bearer ? "present" : "missing");
                check__count++;
            }
        }
    }
    fprintf(stderr, "%d auth rows of %zu, %d refused requests\n", auth_rows, n, tried);
    http_server_free(s);
    CHECK_DONE();
}
