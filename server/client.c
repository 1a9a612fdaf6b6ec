/* client.c — the client commands of `ddpd` (client.h) over libcurl: the connection and the
 * requests every command makes (client_impl.h), the job commands, and the table of all of
 * them (pull is client_pull.c's, generate and predict client_infer.c's, tokenize
 * client_tokenize.c's). Each parses its
 * options with getopt_long, makes its requests with timeouts (streams: the server's
 * heartbeats bound how long a dead connection goes unnoticed), and prints tables, JSON,
 * NDJSON or the progress line. Knows the REST API, not the server's code. Trusts nothing the network
 * says: every string from it reaches the terminal through termsafe.h, and a download gets
 * its name only when whole and valid (stcheck.h). */
#include "client.h"
#include "client_impl.h"

#include <curl/curl.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "../base/clock.h"
#include "../base/parse.h"
#include "../schema/jsonnum.h"
#include "../schema/spec.h"
#include "opt.h"
#include "progress.h"
#include "termsafe.h"
#include "token.h"

#define SSE_LINE_MAX       (1u << 20) /* one line of the event stream */
#define RECONNECT_MAX      10         /* attempts in a row without an event in between ... */
#define RECONNECT_WINDOW_S 60.0       /* ... and within this long */
#define SUBMIT_RETRIES     5          /* a submission the server is too busy for: 0.5 s, 1 s, .. 8 s apart */
#define LOGS_POLL_S        1.0
#define LOGS_MATCH         256    /* bytes of the log that logs -f finds again in the next read */
#define LOGS_TAIL_MAX      100000 /* GET /v1/jobs/{id}/logs: the largest tail ... */
#define LOGS_TAIL_DEFAULT  200    /* ... and the server's default */
#define JOBS_LIMIT_MAX     1000   /* GET /v1/jobs: the largest page */

bool buf_add(struct buf *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->max) {
        b->over = true;
        return false;
    }
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->over = true;
            return false;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
    return true;
}

void buf_free(struct buf *b)
{
    free(b->p);
    *b = (struct buf){0};
}

/* ---- options ------------------------------------------------------------------------ */

enum { OPT_FOLLOW = OPT_LOCAL, OPT_STATE, OPT_LIMIT, OPT_RANK, OPT_TAIL, OPT_STEP_RESUME, OPT_FORCE };

static void command_usage(const struct command *cmd, FILE *f)
{
    fprintf(f, "usage: ddpd %s %s\n%s\n%s" COMMON_HELP, cmd->name, cmd->args, cmd->what, cmd->help);
}

int next_option(struct opts *o, int argc, char **argv, const char *shorts, const struct option *longs)
{
    for (;;) {
        int c = getopt_long(argc, argv, shorts, longs, NULL);
        switch (c) {
        case OPT_SERVER: o->server = optarg; continue;
        case OPT_TOKEN_FILE: o->token_file = optarg; continue;
        case 'h':
            command_usage(o->cmd, stdout);
            o->rc = 0;
            return -2;
        case '?':
        case ':':
            opt_complain(o->cmd->name, c, argv, longs);
            if (c == '?')
                fprintf(stderr, "(ddpd %s --help lists the options)\n", o->cmd->name);
            o->rc = EXIT_USAGE;
            return -2;
        default: return c;
        }
    }
}

bool operands(struct opts *o, int argc, int want, const char *what)
{
    int have = argc - optind;
    if (have == want)
        return true;
    if (have < want)
        fprintf(stderr, "ddpd %s: missing %s\n", o->cmd->name, what);
    else
        fprintf(stderr, "ddpd %s: expected only %s, got %d arguments\n", o->cmd->name, what, have);
    command_usage(o->cmd, stderr);
    o->rc = EXIT_USAGE;
    return false;
}

bool parse_id(const char *cmd, const char *s, int64_t *id)
{
    if (base_parse_i64(s, 1, INT64_MAX, id)) {
        fprintf(stderr, "ddpd %s: expected a job id (a positive integer), got '%s'\n", cmd, s);
        return false;
    }
    return true;
}

bool parse_opt_long(const char *cmd, const char *opt, const char *v, long lo, long hi, long *out)
{
    if (base_parse_long(v, lo, hi, out)) {
        fprintf(stderr, "ddpd %s: %s: expected an integer in [%ld, %ld], got '%s'\n", cmd, opt, lo, hi, v);
        return false;
    }
    return true;
}

/* ---- the connection ----------------------------------------------------------------- */

int client_setup(struct client *c, const struct opts *o)
{
    const char *server = o->server ? o->server : getenv("DDPD_SERVER");
    const char *from = o->server ? "--server" : "DDPD_SERVER";
    if (!server || !server[0])
        server = DEFAULT_SERVER;
    bool scheme = !strncmp(server, "http://", 7) || !strncmp(server, "https://", 8);
    int n = snprintf(c->base, sizeof c->base, "%s%s", scheme ? "" : "http://", server);
    if (n < 0 || (size_t)n >= sizeof c->base - URL_PATH_ROOM) {
        fprintf(stderr, "ddpd %s: %s: the address is longer than %d bytes\n", c->cmd, from,
                URL_MAX - URL_PATH_ROOM);
        return EXIT_USAGE;
    }
    while (n > 0 && c->base[n - 1] == '/')
        c->base[--n] = '\0';
    if (strstr(server, "://") && !scheme) {
        fprintf(stderr, "ddpd %s: %s %s: expected an http:// or https:// address\n", c->cmd, from, server);
        return EXIT_USAGE;
    }
    char why[512];
    if (o->token_file) {
        if (!(c->token = token_read_file(o->token_file, why, sizeof why))) {
            fprintf(stderr, "ddpd %s: --token-file %s: %s\n", c->cmd, o->token_file, why);
            return EXIT_USAGE;
        }
    } else {
        const char *t = getenv("DDPD_TOKEN");
        if (t && t[0]) {
            if (!token_check(t, strlen(t), why, sizeof why)) {
                fprintf(stderr, "ddpd %s: DDPD_TOKEN: %s\n", c->cmd, why);
                return EXIT_USAGE;
            }
            c->token = strdup(t);
        }
    }
    if (c->token)
        snprintf(c->auth, sizeof c->auth, "Authorization: Bearer %s", c->token);
    if (!(c->curl = curl_easy_init())) {
        fprintf(stderr, "ddpd %s: cannot start libcurl\n", c->cmd);
        return EXIT_FAIL;
    }
    return 0;
}

static size_t on_data(char *p, size_t size, size_t nmemb, void *arg)
{
    struct sink *s = arg;
    size_t n = size * nmemb;
    long status = 0;
    curl_easy_getinfo(s->c->curl, CURLINFO_RESPONSE_CODE, &status);
    if (status == 200 && s->file) {
        /* CURLOPT_MAXFILESIZE_LARGE refuses a Content-Length past the cap; this, a body
         * without one that goes on past it. */
        s->file_came += (int64_t)n;
        if (s->file_max > 0 && (int64_t)n > s->file_max - s->file_bytes) {
            s->file_over = true;
            return 0;
        }
        if (fwrite(p, 1, n, s->file) != n) {
            s->file_failed = true;
            s->file_errno = errno;
            return 0;
        }
        s->file_bytes += (int64_t)n;
        return n;
    }
    if (status == 200 && s->stream)
        return s->stream(s->stream_ctx, p, n);
    return buf_add(&s->body, p, n) ? n : 0;
}

/* A header line of the answer: a download notes its Content-Length here, since curl does
 * not report it for an answer it refused for its length. */
static size_t on_header(char *p, size_t size, size_t nmemb, void *arg)
{
    struct sink *s = arg;
    size_t n = size * nmemb;
    char v[32];
    if (n > 5 && !strncmp(p, "HTTP/", 5)) /* a new answer (after a 100 Continue) */
        s->announced = -1;
    if (n > 15 && !strncasecmp(p, "content-length:", 15) && n - 15 < sizeof v) {
        memcpy(v, p + 15, n - 15);
        v[n - 15] = '\0';
        v[strcspn(v, "\r\n")] = '\0';
        if (base_parse_i64(v, 0, INT64_MAX, &s->announced))
            s->announced = -1;
    }
    if (n > 12 && !strncasecmp(p, "retry-after:", 12)) {
        size_t k = strspn(p + 12, " \t"), len = strcspn(p + 12 + k, "\r\n");
        snprintf(s->retry_after, sizeof s->retry_after, "%.*s", (int)(len < 31 ? len : 31), p + 12 + k);
    }
    return n;
}

/* libcurl calls this about once a second and on every chunk: a request whose stop flag a
 * signal handler set ends here (the connection is closed, which the server sees). */
static int on_progress(void *arg, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal, curl_off_t ulnow)
{
    (void)dltotal, (void)dlnow, (void)ultotal, (void)ulnow;
    const struct sink *s = arg;
    return *s->stop ? 1 : 0;
}

long request(struct client *c, const char *method, const char *path, const char *body, size_t body_len,
             enum req_kind kind, struct sink *s)
{
    char url[URL_MAX + 512], errbuf[CURL_ERROR_SIZE] = "";
    snprintf(url, sizeof url, "%s%s", c->base, path);
    CURL *h = c->curl;
    curl_easy_reset(h);
    struct curl_slist *hdrs = NULL;
    if (c->token)
        hdrs = curl_slist_append(hdrs, c->auth);
    char ct[96], accept[96];
    snprintf(ct, sizeof ct, "Content-Type: %s", s->content_type ? s->content_type : "application/json");
    snprintf(accept, sizeof accept, "Accept: %s", s->accept ? s->accept : "text/event-stream");
    if (body)
        hdrs = curl_slist_append(hdrs, ct);
    if (kind == REQ_STREAM || s->accept)
        hdrs = curl_slist_append(hdrs, accept);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
    if (!strcmp(method, "GET"))
        curl_easy_setopt(h, CURLOPT_HTTPGET, 1L);
    else if (!strcmp(method, "POST") || body) {
        /* A body with any other method (PATCH) goes as POST's does, under its own name. */
        curl_easy_setopt(h, CURLOPT_POST, 1L);
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, body ? body : "");
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)(body ? body_len : 0));
    }
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, CONNECT_TIMEOUT_S);
    curl_easy_setopt(h, CURLOPT_USERAGENT, "ddpd/0.1.0");
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, s);
    s->announced = -1;
    s->retry_after[0] = '\0';
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, s);
    if (kind == REQ_PLAIN) {
        curl_easy_setopt(h, CURLOPT_TIMEOUT, s->timeout_s ? s->timeout_s : REQUEST_TIMEOUT_S);
    } else {
        /* A download or a stream may take as long as it needs, but not stall: a stream
         * gets a heartbeat every 15 s, a download PULL_MIN_SPEED bytes a second at least. */
        curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, kind == REQ_DOWNLOAD ? PULL_MIN_SPEED : 1L);
        curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, s->idle_s ? s->idle_s : STREAM_IDLE_S);
    }
    if (s->stop) {
        curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
        curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, on_progress);
        curl_easy_setopt(h, CURLOPT_XFERINFODATA, s);
    }
    if (kind == REQ_DOWNLOAD && s->file_max > 0)
        curl_easy_setopt(h, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)s->file_max);
    CURLcode rc = curl_easy_perform(h);
    long status = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    curl_slist_free_all(hdrs);
    s->rc = rc;
    if (rc == CURLE_OK)
        return status;
    if (rc == CURLE_ABORTED_BY_CALLBACK && s->stop && *s->stop)
        return -1; /* the caller says it was interrupted */
    /* curl's message may quote what the server sent (a status line, a header). */
    termsafe_line(c->why, sizeof c->why, errbuf[0] ? errbuf : curl_easy_strerror(rc));
    if (s->body.over) {
        fprintf(stderr, "ddpd %s: %s %s: the answer is larger than %u bytes\n", c->cmd, method, path,
                (unsigned)s->body.max);
        return 0;
    }
    if (kind == REQ_STREAM || (kind == REQ_DOWNLOAD && status == 200)) {
        /* A stream refused, reset or silent for STREAM_IDLE_S: the caller tries again (or
         * the stream's parser stopped it, and the caller knows why). A download: the
         * caller says which check it failed. */
        return -1;
    }
    if (status == 0)
        fprintf(stderr,
                "ddpd %s: cannot reach the server at %s: %s (is `ddpd serve` running there? --server or "
                "DDPD_SERVER name the address)\n",
                c->cmd, c->base, c->why);
    else
        fprintf(stderr, "ddpd %s: %s %s at %s: %s\n", c->cmd, method, path, c->base, c->why);
    return 0;
}

int http_failed(struct client *c, const char *method, const char *path, long status, const struct buf *b,
                bool user_input)
{
    json_t *j = b->p ? json_loads(b->p, 0, NULL) : NULL;
    json_t *e = json_object_get(j, "error");
    const char *msg = json_string_value(json_object_get(e, "message"));
    const char *code = json_string_value(json_object_get(e, "code"));
    const char *at = json_string_value(json_object_get(e, "path"));
    char m[SAFE_MAX], cd[64], a[256], body[256];
    if (msg)
        fprintf(stderr, "ddpd %s: %s%s%s (HTTP %ld %s from %s %s)\n", c->cmd, termsafe_line(a, sizeof a, at),
                at && at[0] ? ": " : "", termsafe_line(m, sizeof m, msg), status,
                termsafe_line(cd, sizeof cd, code), method, path);
    else
        fprintf(stderr, "ddpd %s: %s %s: HTTP %ld from %s%s%s\n", c->cmd, method, path, status, c->base,
                b->n ? ": " : "", termsafe_line(body, sizeof body, b->n ? b->p : ""));
    if (status == 401)
        fprintf(stderr,
                "ddpd %s: the server at %s wants a token: set DDPD_TOKEN or --token-file to the "
                "server's token\n",
                c->cmd, c->base);
    json_decref(j);
    return user_input && (status == 400 || status == 413 || status == 422) ? EXIT_USAGE : EXIT_FAIL;
}

json_t *get_json(struct client *c, const char *path, int *rc)
{
    struct sink s = {.c = c, .body = {.max = ANSWER_MAX}};
    json_t *j = NULL;
    long status = request(c, "GET", path, NULL, 0, REQ_PLAIN, &s);
    *rc = EXIT_FAIL;
    if (status == 200) {
        json_error_t je;
        j = json_loads(s.body.p ? s.body.p : "", 0, &je);
        char t[256];
        if (!j)
            fprintf(stderr, "ddpd %s: GET %s: the answer is not JSON: %s\n", c->cmd, path,
                    termsafe_line(t, sizeof t, je.text));
        else
            *rc = 0;
    } else if (status > 0) {
        *rc = http_failed(c, "GET", path, status, &s.body, false);
    }
    buf_free(&s.body);
    return j;
}

/* ---- following a job ---------------------------------------------------------------- */

struct follow {
    struct client *c;
    int64_t job;
    struct progress *prog; /* NULL: NDJSON on stdout */
    int64_t last_seq;
    int frames; /* frames of this connection */
    char final[16];
    char error[1024];
    char stop_reason[256]; /* rank 0's done event's (early_stop), "" when none */
    char stream_error[512];
    struct buf line, data;
    char ev_name[32];
    int64_t id;
    bool has_id, out_failed;
    bool fatal; /* the parser stopped the stream: a line over SSE_LINE_MAX, stdout closed */
};

static bool final_state(const char *s)
{
    return s && (!strcmp(s, "succeeded") || !strcmp(s, "failed") || !strcmp(s, "cancelled"));
}

static void follow_frame(struct follow *f)
{
    f->frames++;
    json_t *ev = f->data.p ? json_loadb(f->data.p, f->data.n, 0, NULL) : NULL;
    if (!strcmp(f->ev_name, "stream_error")) {
        const char *m = json_string_value(json_object_get(ev, "message"));
        snprintf(f->stream_error, sizeof f->stream_error, "%s", m ? m : "(no message)");
        json_decref(ev);
        return;
    }
    if (f->has_id)
        f->last_seq = f->id;
    if (f->prog) {
        if (ev)
            progress_event(f->prog, ev);
    } else if (f->data.n && !ev) {
        /* NDJSON is JSON, one value a line: what is not JSON is not passed on. */
        char t[256];
        fprintf(stderr, "ddpd %s: skipped an event of job %" PRId64 " that is not JSON: %s\n", f->c->cmd,
                f->job, termsafe_line(t, sizeof t, f->data.p));
    } else if (f->data.n) {
        /* As the server sent it (numbers keep their digits), with whatever a terminal
         * would act on escaped as JSON reads it back. */
        if (termsafe_write(stdout, f->data.p, f->data.n, TERMSAFE_JSON_LINE) != 0 ||
            fputc('\n', stdout) == EOF || fflush(stdout) != 0)
            f->out_failed = true;
    }
    const char *kind = json_string_value(json_object_get(ev, "event"));
    const char *st = json_string_value(json_object_get(ev, "state"));
    if (kind && !strcmp(kind, "state") && final_state(st)) {
        snprintf(f->final, sizeof f->final, "%s", st);
        const char *e = json_string_value(json_object_get(ev, "error"));
        snprintf(f->error, sizeof f->error, "%s", e ? e : "");
    }
    const char *why = json_string_value(json_object_get(ev, "stop_reason"));
    if (kind && !strcmp(kind, "done") && why)
        snprintf(f->stop_reason, sizeof f->stop_reason, "%s", why);
    json_decref(ev);
}

/* One line of the SSE stream (without its end). */
static void follow_line(struct follow *f, char *l, size_t n)
{
    if (n && l[n - 1] == '\r')
        l[--n] = '\0';
    if (!n) { /* the end of a frame */
        if (f->data.n || f->ev_name[0])
            follow_frame(f);
        f->data.n = 0;
        if (f->data.p)
            f->data.p[0] = '\0';
        f->ev_name[0] = '\0';
        f->has_id = false;
        return;
    }
    if (l[0] == ':') /* a heartbeat or a comment */
        return;
    char *colon = memchr(l, ':', n);
    size_t klen = colon ? (size_t)(colon - l) : n;
    const char *v = colon ? colon + 1 : "";
    if (*v == ' ')
        v++;
    if (klen == 4 && !memcmp(l, "data", 4)) {
        if (f->data.n)
            buf_add(&f->data, "\n", 1);
        buf_add(&f->data, v, strlen(v));
    } else if (klen == 5 && !memcmp(l, "event", 5)) {
        snprintf(f->ev_name, sizeof f->ev_name, "%s", v);
    } else if (klen == 2 && !memcmp(l, "id", 2)) {
        f->has_id = !base_parse_i64(v, 0, INT64_MAX, &f->id);
    }
}

static size_t follow_bytes(void *ctx, const char *p, size_t n)
{
    struct follow *f = ctx;
    for (size_t i = 0; i < n; i++) {
        if (p[i] != '\n') {
            if (!buf_add(&f->line, p + i, 1)) {
                fprintf(stderr, "ddpd %s: a line of the event stream is longer than %u bytes\n", f->c->cmd,
                        SSE_LINE_MAX);
                f->fatal = true;
                return 0;
            }
            continue;
        }
        follow_line(f, f->line.p ? f->line.p : (char *)"", f->line.n);
        f->line.n = 0;
        if (f->line.p)
            f->line.p[0] = '\0';
        if (f->out_failed || f->data.over) {
            f->fatal = true;
            return 0;
        }
    }
    if (f->prog)
        progress_flush(f->prog);
    return n;
}

/* Follows job `job`'s events until its final state: the progress line when stdout is a
 * terminal, else the events as NDJSON. A connection that breaks off is opened again with
 * after= the last event received (RECONNECT_MAX times in RECONNECT_WINDOW_S without an
 * event in between). Returns the exit status of the job's outcome. */
static int follow_job(struct client *c, int64_t job)
{
    int rc = EXIT_FAIL;
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%" PRId64, job);
    json_t *j = get_json(c, path, &rc);
    if (!j)
        return rc;
    struct follow f = {.c = c, .job = job, .line = {.max = SSE_LINE_MAX}, .data = {.max = SSE_LINE_MAX}};
    if (isatty(STDOUT_FILENO))
        f.prog = progress_new(stdout, job, json_object_get(j, "spec"),
                              json_string_value(json_object_get(j, "state")));
    json_decref(j);
    int attempts = 0;
    double first_fail = 0;
    rc = EXIT_FAIL;
    for (;;) {
        snprintf(path, sizeof path, "/v1/jobs/%" PRId64 "/events?after=%" PRId64, job, f.last_seq);
        struct sink s = {.c = c, .body = {.max = ANSWER_MAX}, .stream = follow_bytes, .stream_ctx = &f};
        f.frames = 0;
        f.stream_error[0] = '\0';
        f.line.n = f.data.n = 0;
        f.ev_name[0] = '\0';
        long status = request(c, "GET", path, NULL, 0, REQ_STREAM, &s);
        if (status > 0 && status != 200)
            rc = http_failed(c, "GET", path, status, &s.body, false);
        buf_free(&s.body);
        if (f.final[0] || f.fatal || (status != 200 && status != -1))
            break;
        /* The stream ended before the job did: the server stopped, restarted or dropped
         * this client; open it again after the last event. */
        if (f.frames > 0)
            attempts = 0;
        if (attempts == 0)
            first_fail = base_mono_s();
        if (++attempts > RECONNECT_MAX || base_mono_s() - first_fail > RECONNECT_WINDOW_S) {
            if (f.prog)
                progress_finish(f.prog);
            char why[SAFE_MAX];
            termsafe_line(why, sizeof why,
                          f.stream_error[0] ? f.stream_error
                          : status == -1    ? c->why
                                            : "closed");
            fprintf(stderr,
                    "ddpd %s: the event stream of job %" PRId64
                    " from %s ended before the job did (%s); gave "
                    "up after %d attempts to reconnect in %.0f s\n",
                    c->cmd, job, c->base, why, attempts - 1, base_mono_s() - first_fail);
            goto out;
        }
        base_sleep_s(attempts < 5 ? 0.2 * (1 << attempts) : 5.0);
    }
    if (f.out_failed) {
        fprintf(stderr, "ddpd %s: cannot write the events to stdout\n", c->cmd);
        rc = EXIT_FAIL;
        goto out;
    }
    if (!f.final[0])
        goto out;
    if (f.prog)
        progress_finish(f.prog);
    if (!strcmp(f.final, "succeeded")) {
        rc = 0;
        char why[SAFE_MAX];
        if (f.stop_reason[0]) /* it ended before its last step: say why */
            fprintf(stderr, "ddpd %s: job %" PRId64 " succeeded: %s\n", c->cmd, job,
                    termsafe_line(why, sizeof why, f.stop_reason));
    } else {
        rc = !strcmp(f.final, "cancelled") ? EXIT_CANCELLED : EXIT_FAIL;
        char e[SAFE_MAX];
        fprintf(stderr, "ddpd %s: job %" PRId64 " %s%s%s\n", c->cmd, job, f.final, f.error[0] ? ": " : "",
                termsafe_line(e, sizeof e, f.error));
    }
out:
    progress_free(f.prog);
    buf_free(&f.line);
    buf_free(&f.data);
    return rc;
}

/* ---- the commands ------------------------------------------------------------------- */

json_t *post_created(struct client *c, const char *cmd, const char *path, const char *body, size_t len,
                     int *rc)
{
    struct sink s = {.c = c, .body = {.max = ANSWER_MAX}};
    long status = 0;
    for (int attempt = 0;; attempt++) {
        s.body.n = 0;
        status = request(c, "POST", path, body, len, REQ_PLAIN, &s);
        if (status != 503 || attempt == SUBMIT_RETRIES || !s.body.p || !strstr(s.body.p, "\"busy\""))
            break;
        fprintf(stderr,
                "ddpd %s: the server at %s is busy checking other submissions; trying again in %.1f s\n", cmd,
                c->base, 0.5 * (1 << attempt));
        base_sleep_s(0.5 * (1 << attempt));
    }
    json_t *j = NULL;
    *rc = EXIT_FAIL;
    if (status == 201) {
        j = json_loads(s.body.p ? s.body.p : "", 0, NULL);
        if (json_integer_value(json_object_get(j, "id")) <= 0) {
            fprintf(stderr, "ddpd %s: the server's answer names no id\n", cmd);
            json_decref(j);
            j = NULL;
        }
    } else if (status > 0) {
        *rc = http_failed(c, "POST", path, status, &s.body, true);
    }
    buf_free(&s.body);
    if (j)
        *rc = 0;
    return j;
}

/* POSTs `body` to `path`, which answers 201 and the new job (submit, resume): prints its
 * id, or with `follow` follows it as watch does. */
static int post_job(struct client *c, const char *cmd, const char *path, const char *body, size_t len,
                    bool follow)
{
    int rc;
    json_t *j = post_created(c, cmd, path, body, len, &rc);
    if (!j)
        return rc ? rc : EXIT_FAIL;
    int64_t id = json_integer_value(json_object_get(j, "id"));
    json_decref(j);
    if (!follow) {
        printf("%" PRId64 "\n", id);
        return 0;
    }
    /* With --follow stdout carries the events (NDJSON) or the progress line. */
    fprintf(stderr, "ddpd %s: job %" PRId64 " submitted\n", cmd, id);
    return follow_job(c, id);
}

/* The spec's text with the tags and notes of the options set beside its keys, into *spec
 * (replaced). False after a message when the file is not a JSON object. */
static bool spec_with_meta(struct buf *spec, const char *spec_path, const struct meta_opts *m)
{
    json_error_t je;
    json_t *j = json_loadb(spec->p ? spec->p : "", spec->n, 0, &je);
    if (!json_is_object(j)) {
        if (j)
            fprintf(stderr, "ddpd submit: %s: --tag and --notes need a spec that is a JSON object\n",
                    spec_path);
        else
            fprintf(stderr, "ddpd submit: %s line %d column %d: %s\n", spec_path, je.line, je.column,
                    je.text);
        json_decref(j);
        return false;
    }
    meta_put(m, j);
    char *text = json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(j);
    if (!text)
        return false;
    buf_free(spec);
    spec->p = text;
    spec->n = spec->cap = strlen(text);
    return true;
}

int read_body(const char *cmd, const char *path, struct buf *b)
{
    FILE *in = !strcmp(path, "-") ? stdin : fopen(path, "rb");
    if (!in) {
        fprintf(stderr, "ddpd %s: %s: %s\n", cmd, path, strerror(errno));
        return EXIT_USAGE;
    }
    char chunk[65536];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, in)) > 0 && buf_add(b, chunk, n))
        ;
    bool read_failed = ferror(in);
    if (in != stdin)
        fclose(in);
    if (read_failed || b->over) {
        fprintf(stderr, "ddpd %s: %s: %s\n", cmd, path,
                b->over ? "larger than the server's limit of 1 MiB for a request" : "cannot read it");
        buf_free(b);
        return EXIT_USAGE;
    }
    return 0;
}

static int cmd_submit(struct client *c, int argc, char **argv)
{
    static const struct option longs[] = {{"follow", no_argument, NULL, 'f'},
                                          {"tag", required_argument, NULL, OPT_TAG},
                                          {"notes", required_argument, NULL, OPT_NOTES},
                                          COMMON_OPTIONS};
    struct opts o = {.cmd = find_command("submit")};
    struct meta_opts meta = {0};
    bool follow = false;
    int opt;
    while ((opt = next_option(&o, argc, argv, ":fh", longs)) != -1) {
        if (opt == -2) {
            meta_free(&meta);
            return o.rc;
        }
        if (!meta_option(&meta, opt, optarg))
            follow = true; /* 'f' */
    }
    int rc = operands(&o, argc, 1, "SPEC.json") ? client_setup(c, &o) : o.rc;
    if (rc) {
        meta_free(&meta);
        return rc;
    }
    const char *spec_path = argv[optind];
    struct buf spec = {.max = SPEC_MAX_BODY + 1};
    if ((rc = read_body("submit", spec_path, &spec))) {
        meta_free(&meta);
        return rc;
    }
    bool meta_ok = !meta_given(&meta) || spec_with_meta(&spec, spec_path, &meta);
    meta_free(&meta);
    if (!meta_ok) {
        buf_free(&spec);
        return EXIT_USAGE;
    }
    rc = post_job(c, "submit", "/v1/jobs", spec.p ? spec.p : "", spec.n, follow);
    buf_free(&spec);
    return rc;
}

/* ddpd resume JOB [--step N] [--force] [--follow]: POST /v1/jobs/{id}/resume, a new job
 * that continues JOB from its newest checkpoint (or step N's), printed like submit's. */
static int cmd_resume(struct client *c, int argc, char **argv)
{
    static const struct option longs[] = {{"step", required_argument, NULL, OPT_STEP_RESUME},
                                          {"force", no_argument, NULL, OPT_FORCE},
                                          {"follow", no_argument, NULL, 'f'},
                                          COMMON_OPTIONS};
    struct opts o = {.cmd = find_command("resume")};
    bool follow = false, force = false;
    int64_t step = -1;
    int opt;
    while ((opt = next_option(&o, argc, argv, ":fh", longs)) != -1) {
        if (opt == -2)
            return o.rc;
        if (opt == 'f')
            follow = true;
        else if (opt == OPT_FORCE)
            force = true;
        else if (base_parse_i64(optarg, 0, INT64_MAX, &step)) {
            fprintf(stderr, "ddpd resume: --step: expected a checkpoint's step (an integer >= 0), got '%s'\n",
                    optarg);
            return EXIT_USAGE;
        }
    }
    int64_t id;
    int rc = id_operand(c, &o, argc, argv, "resume", &id);
    if (rc)
        return rc;
    char path[128];
    int n = snprintf(path, sizeof path, "/v1/jobs/%" PRId64 "/resume", id);
    if (step >= 0)
        n += snprintf(path + n, sizeof path - (size_t)n, "?step=%" PRId64, step);
    if (force)
        snprintf(path + n, sizeof path - (size_t)n, "%sforce=true", step >= 0 ? "&" : "?");
    return post_job(c, "resume", path, "", 0, follow);
}

int id_operand(struct client *c, struct opts *o, int argc, char **argv, const char *name, int64_t *id)
{
    if (!operands(o, argc, 1, "ID"))
        return o->rc;
    if (!parse_id(name, argv[optind], id))
        return EXIT_USAGE;
    return client_setup(c, o);
}

/* The options of a command whose one operand is a job id. Returns -1 to go on, else the
 * exit status (0 after --help). */
static int one_id_command(struct client *c, int argc, char **argv, const char *name, int64_t *id)
{
    static const struct option longs[] = {COMMON_OPTIONS};
    struct opts o = {.cmd = find_command(name)};
    int opt;
    while ((opt = next_option(&o, argc, argv, ":h", longs)) != -1)
        if (opt == -2)
            return o.rc;
    int rc = id_operand(c, &o, argc, argv, name, id);
    return rc ? rc : -1;
}

static int cmd_watch(struct client *c, int argc, char **argv)
{
    int64_t id;
    int rc = one_id_command(c, argc, argv, "watch", &id);
    return rc >= 0 ? rc : follow_job(c, id);
}

/* Prints a JSON answer (taken) indented, safe for a terminal: the server's numbers as it
 * printed them, not %.17g of them (jsonnum_tidy); jansson escaped the control characters
 * below 0x20 in its strings, and DEL, C1 and the rest become \u escapes of the same JSON
 * value. 0, or EXIT_FAIL. */
int client_print_json(json_t *j)
{
    char *text = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(j);
    if (!text)
        return EXIT_FAIL;
    jsonnum_tidy(text, strlen(text));
    int rc = termsafe_write(stdout, text, strlen(text), TERMSAFE_JSON_TEXT) != 0 || fputc('\n', stdout) == EOF
                 ? EXIT_FAIL
                 : 0;
    free(text);
    return rc;
}

static int cmd_show(struct client *c, int argc, char **argv)
{
    int64_t id;
    int rc = one_id_command(c, argc, argv, "show", &id);
    if (rc >= 0)
        return rc;
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%" PRId64, id);
    json_t *j = get_json(c, path, &rc);
    return j ? client_print_json(j) : rc;
}

/* POST .../cancel, POST .../preempt or DELETE ...: the answer's status is the result. */
static int change_job(struct client *c, int argc, char **argv, const char *name)
{
    int64_t id;
    int rc = one_id_command(c, argc, argv, name, &id);
    if (rc >= 0)
        return rc;
    bool rm = !strcmp(name, "rm");
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%" PRId64 "%s%s", id, rm ? "" : "/", rm ? "" : name);
    const char *method = rm ? "DELETE" : "POST";
    struct sink s = {.c = c, .body = {.max = ANSWER_MAX}};
    long status = request(c, method, path, NULL, 0, REQ_PLAIN, &s);
    if (status == 202 || status == 200 || status == 204) {
        printf("job %" PRId64 " %s\n", id,
               rm ? "deleted"
               : !strcmp(name, "cancel")
                   ? "is being cancelled"
                   : "is being preempted: it stops at its next step with a checkpoint and "
                     "waits in the queue to resume");
        rc = 0;
    } else {
        rc = status > 0 ? http_failed(c, method, path, status, &s.body, false) : EXIT_FAIL;
    }
    buf_free(&s.body);
    return rc;
}

static int cmd_cancel(struct client *c, int argc, char **argv)
{
    return change_job(c, argc, argv, "cancel");
}

static int cmd_preempt(struct client *c, int argc, char **argv)
{
    return change_job(c, argc, argv, "preempt");
}

static int cmd_rm(struct client *c, int argc, char **argv)
{
    return change_job(c, argc, argv, "rm");
}

/* "12s", "5m", "3h", "2d" since the epoch time `t`. */
static void fmt_age(char *buf, size_t cap, double t)
{
    double s = base_wall_s() - t;
    if (t <= 0)
        snprintf(buf, cap, "-");
    else if (s < 120)
        snprintf(buf, cap, "%.0fs", s < 0 ? 0 : s);
    else if (s < 7200)
        snprintf(buf, cap, "%.0fm", s / 60);
    else if (s < 172800)
        snprintf(buf, cap, "%.0fh", s / 3600);
    else
        snprintf(buf, cap, "%.0fd", s / 86400);
}

static int cmd_jobs(struct client *c, int argc, char **argv)
{
    static const struct option longs[] = {{"state", required_argument, NULL, OPT_STATE},
                                          {"limit", required_argument, NULL, OPT_LIMIT},
                                          {"tag", required_argument, NULL, OPT_TAG},
                                          COMMON_OPTIONS};
    struct opts o = {.cmd = find_command("jobs")};
    const char *state = NULL, *tag = NULL;
    long limit = 0;
    int opt;
    while ((opt = next_option(&o, argc, argv, ":h", longs)) != -1) {
        if (opt == -2)
            return o.rc;
        if (opt == OPT_STATE)
            state = optarg;
        else if (opt == OPT_TAG)
            tag = optarg;
        else if (!parse_opt_long("jobs", "--limit", optarg, 1, JOBS_LIMIT_MAX, &limit))
            return EXIT_USAGE;
    }
    if (!operands(&o, argc, 0, "options"))
        return o.rc;
    int rc = client_setup(c, &o);
    if (rc)
        return rc;
    char path[512];
    int n = snprintf(path, sizeof path, "/v1/jobs?");
    if (limit)
        n += snprintf(path + n, sizeof path - (size_t)n, "limit=%ld&", limit);
    if (state) {
        char *esc = curl_easy_escape(c->curl, state, 0);
        n += snprintf(path + n, sizeof path - (size_t)n, "state=%.200s&", esc ? esc : "");
        curl_free(esc);
    }
    if (tag) {
        char *esc = curl_easy_escape(c->curl, tag, 0);
        n += snprintf(path + n, sizeof path - (size_t)n, "tag=%.200s&", esc ? esc : "");
        curl_free(esc);
    }
    path[n - 1] = '\0'; /* the last '&' or the '?' */
    json_t *j = get_json(c, path, &rc);
    if (!j)
        return rc;
    json_t *jobs = json_object_get(j, "jobs");
    printf("%-6s %-24s %-10s %-17s %-11s %s\n", "ID", "NAME", "STATE", "STEP", "LOSS", "AGE");
    size_t i;
    json_t *job;
    json_array_foreach (jobs, i, job) {
        char step[48], loss[32], age[16];
        json_int_t st = json_integer_value(json_object_get(job, "step"));
        int64_t total = progress_total_steps(json_object_get(job, "spec"), 0);
        if (total > 0)
            snprintf(step, sizeof step, "%lld/%lld", (long long)st, (long long)total);
        else
            snprintf(step, sizeof step, "%lld", (long long)st);
        json_t *l = json_object_get(job, "loss");
        if (json_is_number(l))
            snprintf(loss, sizeof loss, "%.4g", json_number_value(l));
        else
            snprintf(loss, sizeof loss, "-");
        fmt_age(age, sizeof age, json_number_value(json_object_get(job, "created_at")));
        /* The name cut to its column at a character's boundary, escapes included. */
        const char *name = json_string_value(json_object_get(job, "name"));
        char nm[25], state[32];
        termsafe_line(nm, sizeof nm, name && name[0] ? name : "-");
        termsafe_line(state, sizeof state, json_string_value(json_object_get(job, "state")));
        printf("%-6lld %-24s %-10s %-17s %-11s %s\n",
               (long long)json_integer_value(json_object_get(job, "id")), nm, state, step, loss, age);
        /* Why a queued job waits, or why one ended early, on a line of its own. */
        const char *pending = json_string_value(json_object_get(job, "pending_reason"));
        const char *stopped = json_string_value(json_object_get(job, "stop_reason"));
        char why[1024];
        if (pending && pending[0]) {
            termsafe_line(why, sizeof why, pending);
            printf("       pending: %s\n", why);
        } else if (stopped && stopped[0]) {
            termsafe_line(why, sizeof why, stopped);
            printf("       %s\n", why);
        }
    }
    if (json_is_string(json_object_get(j, "next")))
        printf("(more: ddpd jobs --limit N shows up to %d)\n", JOBS_LIMIT_MAX);
    json_decref(j);
    return 0;
}

static int cmd_logs(struct client *c, int argc, char **argv)
{
    static const struct option longs[] = {{"rank", required_argument, NULL, OPT_RANK},
                                          {"tail", required_argument, NULL, OPT_TAIL},
                                          {"follow", no_argument, NULL, 'f'},
                                          COMMON_OPTIONS};
    struct opts o = {.cmd = find_command("logs")};
    long rank = 0, tail = 0;
    bool follow = false;
    int opt;
    while ((opt = next_option(&o, argc, argv, ":fh", longs)) != -1) {
        if (opt == -2)
            return o.rc;
        if (opt == 'f')
            follow = true;
        else if (opt == OPT_RANK && !parse_opt_long("logs", "--rank", optarg, 0, SPEC_MAX_WORLD - 1, &rank))
            return EXIT_USAGE;
        else if (opt == OPT_TAIL && !parse_opt_long("logs", "--tail", optarg, 1, LOGS_TAIL_MAX, &tail))
            return EXIT_USAGE;
    }
    int64_t id;
    int rc = id_operand(c, &o, argc, argv, "logs", &id);
    if (rc)
        return rc;
    char path[128], job_path[64];
    /* Following reads the server's window of the log each time (the last 100000 lines or
     * 4 MiB: the whole log while it is smaller) and prints what follows the bytes printed
     * last: at the same offset while the window is the whole log, else found by its last
     * LOGS_MATCH bytes. */
    snprintf(path, sizeof path, "/v1/jobs/%" PRId64 "/logs?rank=%ld&tail=%ld", id, rank,
             follow ? LOGS_TAIL_MAX
             : tail ? tail
                    : LOGS_TAIL_DEFAULT);
    snprintf(job_path, sizeof job_path, "/v1/jobs/%" PRId64, id);
    size_t printed = 0, seen_n = 0;
    char seen[LOGS_MATCH];
    for (bool last = !follow;;) {
        struct sink s = {.c = c, .body = {.max = ANSWER_MAX}};
        long status = request(c, "GET", path, NULL, 0, REQ_PLAIN, &s);
        if (status != 200) {
            rc = status > 0 ? http_failed(c, "GET", path, status, &s.body, false) : EXIT_FAIL;
            buf_free(&s.body);
            return rc;
        }
        const char *body = s.body.p ? s.body.p : "";
        size_t from = 0;
        if (seen_n && printed <= s.body.n && !memcmp(body + printed - seen_n, seen, seen_n)) {
            from = printed;
        } else if (seen_n) {
            const char *at = memmem(body, s.body.n, seen, seen_n);
            if (at)
                from = (size_t)(at - body) + seen_n;
            else
                fprintf(stderr,
                        "ddpd logs: [the log grew past the server's window of 4 MiB between two reads; "
                        "some lines are not shown]\n");
        }
        /* A character the rank has not finished writing waits for the next read, so
         * that its first bytes are not shown as escapes. */
        size_t end = s.body.n - (last ? 0 : termsafe_partial_tail(body + from, s.body.n - from));
        termsafe_write(stdout, body + from, end - from, TERMSAFE_TEXT);
        fflush(stdout);
        printed = end;
        if (end) {
            seen_n = end < LOGS_MATCH ? end : LOGS_MATCH;
            memcpy(seen, body + end - seen_n, seen_n);
        }
        buf_free(&s.body);
        if (last)
            return 0;
        json_t *j = get_json(c, job_path, &rc);
        if (!j)
            return rc;
        last = final_state(json_string_value(json_object_get(j, "state")));
        json_decref(j);
        if (!last)
            base_sleep_s(LOGS_POLL_S);
    }
}

/* One row of ddpd checkpoints: step, time, bytes and what it is ("best", "final", ""). */
static void checkpoint_row(json_t *ck, const char *kind)
{
    char when[32] = "-";
    time_t t = (time_t)json_number_value(json_object_get(ck, "time"));
    struct tm tm;
    if (t > 0 && localtime_r(&t, &tm))
        strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", &tm);
    printf("%-10lld %-19s %-12lld %s\n", (long long)json_integer_value(json_object_get(ck, "step")), when,
           (long long)json_integer_value(json_object_get(ck, "bytes")), kind);
}

static int cmd_checkpoints(struct client *c, int argc, char **argv)
{
    int64_t id;
    int rc = one_id_command(c, argc, argv, "checkpoints", &id);
    if (rc >= 0)
        return rc;
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%" PRId64 "/checkpoints", id);
    json_t *j = get_json(c, path, &rc);
    if (!j)
        return rc;
    json_t *list = json_object_get(j, "checkpoints");
    if (!json_is_array(list)) {
        fprintf(stderr, "ddpd checkpoints: GET %s: the answer has no \"checkpoints\" list\n", path);
        json_decref(j);
        return EXIT_FAIL;
    }
    printf("%-10s %-19s %-12s %s\n", "STEP", "TIME", "BYTES", "KIND");
    size_t i;
    json_t *ck, *fin = json_object_get(j, "final");
    json_array_foreach (list, i, ck)
        checkpoint_row(ck, json_is_true(json_object_get(ck, "best")) ? "best" : "");
    if (json_is_object(fin))
        checkpoint_row(fin, "final");
    json_decref(j);
    return 0;
}

/* ---- the table of commands ---------------------------------------------------------- */

static const struct command commands[] = {
    {"submit", "[--follow] [--tag T].. [--notes TEXT] SPEC.json",
     "Submits a job (SPEC.json, or - for stdin) and prints its id.",
     "  -f, --follow      then follow it as `ddpd watch` does (the id goes to stderr)\n"
     "  --tag T           tag the job T (repeat for more; replaces the file's \"tags\")\n"
     "  --notes TEXT      the job's notes (replaces the file's \"notes\")\n",
     cmd_submit},
    {"jobs", "[--state S[,S..]] [--tag T] [--limit N]",
     "Lists jobs, newest first: id, name, state, step/total, loss, age.",
     "  --state S         only jobs in these states (queued, starting, running, succeeded,\n"
     "                    failed, cancelled; comma-separated)\n"
     "  --tag T           only jobs tagged T (exactly)\n"
     "  --limit N         at most N jobs (1..1000; default the server's 50)\n",
     cmd_jobs},
    {"queue", "[--json] [--limit N]",
     "Shows the queue: the running jobs (id, name, owner, priority, devices, how long they\n"
     "have run, time limit) in start order, then the pending ones in the order they would\n"
     "start (place in their device's queue, id, name, owner, priority, devices, how long they\n"
     "have waited, why they wait).",
     "  --json            the server's answer (GET /v1/queue) as JSON\n"
     "  --limit N         at most N pending jobs (1..10000; default the server's 500)\n",
     cmd_queue},
    {"whoami", "[--json]",
     "Shows who the server takes you for (GET /v1/whoami): your name, role (admin, user or\n"
     "viewer) and limits: max priority, GPUs, CPU ranks and queued jobs at once (none: no\n"
     "limit).",
     "  --json            the server's answer as JSON\n", cmd_whoami},
    {"patch", "[--tag T].. [--no-tags] [--notes TEXT] ID",
     "Changes a job's tags (the --tag list replaces them) or notes, in any state.",
     "  --tag T           a tag of the job's new list (repeat for more)\n"
     "  --no-tags         remove every tag\n"
     "  --notes TEXT      the job's new notes (\"\" clears them)\n",
     cmd_patch},
    {"show", "ID", "Prints the job as JSON.", "", cmd_show},
    {"watch", "ID",
     "Follows the job until it ends: a progress line on a terminal, else its events as NDJSON.\n"
     "Exits 0 when it succeeded, 1 when it failed, 5 when it was cancelled; Ctrl-C stops\n"
     "watching, not the job.",
     "", cmd_watch},
    {"logs", "[--rank R] [--tail N] [-f] ID", "Prints a rank's log (its stderr).",
     "  --rank R          the rank (default 0)\n"
     "  --tail N          the last N lines (default 200)\n"
     "  -f, --follow      keep printing what is added until the job ends\n",
     cmd_logs},
    {"cancel", "ID", "Cancels a queued or running job.", "", cmd_cancel},
    {"preempt", "ID",
     "Stops a running job at its next optimizer step with a checkpoint; it waits in the queue as\n"
     "preempted and resumes from that checkpoint when the scheduler starts it again.",
     "", cmd_preempt},
    {"rm", "ID", "Deletes a finished job, its events and its files.", "", cmd_rm},
    {"checkpoints", "ID",
     "Lists the job's checkpoints: step, time, bytes, and which is the best one\n"
     "(checkpoint.keep_best) and the final model.",
     "", cmd_checkpoints},
    {"resume", "[--step N] [--force] [--follow] ID",
     "Continues a failed or cancelled job from its newest checkpoint (or step N's) as a\n"
     "new job, and prints the new job's id.",
     "  --step N          the checkpoint of step N (ddpd checkpoints ID lists them)\n"
     "  --force           resume even on data files that changed since the checkpoint\n"
     "  -f, --follow      then follow the new job as `ddpd watch` does (the id goes to stderr)\n",
     cmd_resume},
    {"compare", "ID ID [ID..]",
     "Compares jobs: a table of each one's final and best metrics (step, loss, final and best\n"
     "eval loss with their steps, and accuracy for classifiers), then the spec fields in which\n"
     "they differ, and only those, as dotted paths (optimizer.lr, model[0].out).",
     "", cmd_compare},
    {"sweep", "submit FILE.json  |  sweep show [--json] ID  |  sweep cancel ID",
     "Hyper-parameter sweeps (docs/api.md \"Sweeps\"): submit FILE.json (a POST /v1/sweeps body,\n"
     "- for stdin) and print the sweep's id; show its trials ranked by the metric (rank, trial,\n"
     "job, state, metric, values) and the best; cancel it and its jobs.",
     "  --json            show: the server's answer as JSON (with the best trial's spec)\n", cmd_sweep},
    {"pull",
     "[--step S | --best] [--optim] [-o FILE] [--max-bytes N] ID  |  pull --pytorch [--step S] ID DIR  |  "
     "pull --format gpt2 [--step S] ID DIR",
     "Downloads a model file: the final model, else the newest checkpoint, or step S's.\n"
     "With --pytorch, DIR/model.safetensors and DIR/model.py: the model as a plain PyTorch\n"
     "module (in Python, from DIR: import model; m = model.load()).\n"
     "With --format gpt2, DIR/model.safetensors and DIR/config.json in Hugging Face's GPT-2\n"
     "layout (GPT2LMHeadModel.from_pretrained(DIR)); a model that is not GPT-2-shaped fails.",
     "  --step S          the checkpoint of step S\n"
     "  --best            the best checkpoint (checkpoint.keep_best), as ddpd checkpoints marks it\n"
     "  --optim           the optimizer state instead of the model\n"
     "  -o, --output F    where to write it (default job-ID[-step-S][-optim].safetensors);\n"
     "                    written to a temporary file, renamed once whole and a valid\n"
     "                    safetensors file\n"
     "  --max-bytes N     refuse a download larger than N bytes (or 512M, 16G, ...; default\n"
     "                    64G, the largest file ddpd-worker reads)\n"
     "  --pytorch         the weights and model.py into the folder DIR (made if missing)\n"
     "  --format gpt2     Hugging Face's model.safetensors and config.json into the folder DIR\n",
     cmd_pull},
    {"generate", "[-n N] [--temperature T] [--top-k K] [--seed S] [--step S] ID PROMPT|--ids I,J,..",
     "Continues PROMPT (- reads it from stdin) with a GPT job's model, printing the text as it\n"
     "comes (control characters escaped), then the seed and time on stderr. Ctrl-C stops it.",
     "  -n, --max-new-tokens N  tokens to generate (default the server's 256)\n"
     "  --temperature T   0 is greedy (the most likely token); default 1\n"
     "  --top-k K         draw from the K most likely tokens only (default 0: all)\n"
     "  --seed S          the same seed and request give the same text (default: drawn)\n"
     "  --step S          the checkpoint of step S (default the final model, else the newest)\n"
     "  --ids I,J,..      the prompt as token ids, for a vocabulary that is not bytes; the\n"
     "                    answer is printed as ids\n",
     cmd_generate},
    {"predict", "[--json] [--step S] ID FILE.npy|-",
     "Runs the job's model in eval mode on the samples of FILE.npy (- for stdin; one sample per\n"
     "row, the spec's input_shape each) and prints each sample's top class, its probability\n"
     "and the next classes, or the raw outputs of a model without classes.",
     "  --json            the server's answer as JSON (outputs, shape, top, step, model)\n"
     "  --step S          the checkpoint of step S (default the final model, else the newest)\n",
     cmd_predict},
    {"tokenize", "--vocab V --merges M -o OUT [--eval-fraction F [--eval-out E]] IN.txt",
     "Encodes the text IN.txt (- for stdin) with GPT-2's byte-level BPE (vocab.json and\n"
     "merges.txt) into the tokens file OUT that `data.type: \"tokens\"` reads: uint16 ids\n"
     "when the vocabulary fits (up to 65536 tokens), else int32 (the spec's data.dtype; the\n"
     "summary says which). Streams the text; a progress line on a terminal for inputs from\n"
     "16 MB; then bytes, tokens and MB/s. Talks to no server.",
     "  --vocab V         the vocabulary (GPT-2's vocab.json: token -> id)\n"
     "  --merges M        the merges in rank order (GPT-2's merges.txt)\n"
     "  -o, --output OUT  the tokens file (written beside as a temporary file, renamed when whole)\n"
     "  --eval-fraction F also write the last F (0 < F < 1) of the tokens to an eval file,\n"
     "                    leaving the first 1 - F in OUT\n"
     "  --eval-out E      the eval file (default eval.bin in OUT's folder)\n",
     cmd_tokenize},
};

const struct command *find_command(const char *name)
{
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(commands[i].name, name))
            return &commands[i];
    return NULL;
}

bool client_is_command(const char *name)
{
    return find_command(name) != NULL;
}

void client_usage_lines(FILE *f)
{
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "       ddpd %-11s %s\n", commands[i].name, commands[i].args);
}

int client_main(int argc, char **argv)
{
    const struct command *cmd = find_command(argv[0]);
    if (!cmd)
        return EXIT_USAGE;
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        fprintf(stderr, "ddpd %s: cannot initialise libcurl\n", cmd->name);
        return EXIT_FAIL;
    }
    struct client c = {.cmd = cmd->name};
    optind = 1;
    opterr = 0;
    int rc = cmd->run(&c, argc, argv);
    if (c.curl)
        curl_easy_cleanup(c.curl);
    free(c.token);
    curl_global_cleanup();
    return rc;
}
