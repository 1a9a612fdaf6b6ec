/* client_infer.c — `ddpd generate` and `ddpd predict`: a job's model used through the
 * server (POST /v1/jobs/{id}/generate and /predict). generate streams the NDJSON answer
 * and prints each token's text as it comes; predict uploads a .npy file and prints a
 * table. What a model writes is untrusted text: it reaches the terminal only through
 * termsafe.h, so no generated escape sequence can drive the terminal. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "../base/parse.h"
#include "client_impl.h"
#include "termsafe.h"

#define PROMPT_MAX        (1u << 20)  /* the server's body limit */
#define IDS_MAX           65536       /* --ids: at most this many */
#define GEN_LINE_MAX      (4u << 20)  /* one NDJSON line: the final one holds every new id */
#define GEN_IDLE_S        300L        /* a queued request or a model loading sends nothing for a while */
#define PREDICT_MAX_BYTES (1LL << 30) /* the largest .npy upload read into memory */
#define PREDICT_TIMEOUT_S 600L
#define PREDICT_VALUES    8 /* raw outputs shown per sample; --json shows all */
#define PREDICT_NEXT      4 /* classes after the top one */

enum { OPT_TEMPERATURE = OPT_LOCAL, OPT_TOP_K, OPT_SEED, OPT_STEP, OPT_IDS, OPT_JSON };

/* ---- Ctrl-C -------------------------------------------------------------------------- */

/* SIGINT or SIGTERM during a generation: the request's progress callback ends the
 * transfer, so the server sees the connection close and stops generating, and the
 * terminal gets its final newline. */
static volatile sig_atomic_t stop_requested;

static void on_stop_signal(int sig)
{
    (void)sig;
    stop_requested = 1;
}

static void catch_stop(bool on)
{
    static const int sigs[] = {SIGINT, SIGTERM};
    static struct sigaction old[2];
    struct sigaction sa = {.sa_handler = on_stop_signal};
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < 2; i++)
        sigaction(sigs[i], on ? &sa : &old[i], on ? &old[i] : NULL);
}

/* ---- generate ------------------------------------------------------------------------ */

/* The stream's reader: lines of NDJSON (SSE's `data:` lines too, should the server speak
 * SSE), each a token, the final answer or an error. */
struct gen {
    struct client *c;
    struct buf line;
    int64_t tokens;
    char last;                  /* the last byte printed: '\n' before any */
    json_t *final;              /* the answer's last object ("done"), owned */
    char error[SAFE_MAX + 300]; /* an error the stream carried, escaped; "" when none */
    bool out_failed;
    bool too_long;
};

static void gen_print(struct gen *g, const char *s, size_t n, enum termsafe_mode mode)
{
    if (!n)
        return;
    if (termsafe_write(stdout, s, n, mode) != 0)
        g->out_failed = true;
    g->last = s[n - 1];
}

static void gen_token(struct gen *g, json_t *ev)
{
    json_t *text = json_object_get(ev, "text");
    g->tokens++;
    if (json_is_string(text)) {
        gen_print(g, json_string_value(text), json_string_length(text), TERMSAFE_TEXT);
    } else {
        char id[32];
        int n = snprintf(id, sizeof id, "%s%" JSON_INTEGER_FORMAT, g->last == '\n' ? "" : " ",
                         json_integer_value(json_object_get(ev, "token")));
        gen_print(g, id, (size_t)n, TERMSAFE_LINE);
    }
}

/* The answer's text or ids when no token line came before it (a server that answered
 * without streaming). */
static void gen_whole(struct gen *g, json_t *ans)
{
    json_t *text = json_object_get(ans, "text"), *id;
    size_t i;
    if (json_is_string(text)) {
        gen_print(g, json_string_value(text), json_string_length(text), TERMSAFE_TEXT);
        return;
    }
    json_array_foreach (json_object_get(ans, "ids"), i, id) {
        json_t *ev = json_pack("{s:O}", "token", id);
        gen_token(g, ev);
        json_decref(ev);
    }
}

static void gen_line(struct gen *g, char *l, size_t n)
{
    if (n && l[n - 1] == '\r')
        l[--n] = '\0';
    if (!n || l[0] == ':' || !strncmp(l, "event:", 6) || !strncmp(l, "id:", 3) || !strncmp(l, "retry:", 6))
        return;
    if (!strncmp(l, "data:", 5)) {
        size_t k = l[5] == ' ' ? 6 : 5;
        l += k;
        n -= k;
    }
    json_t *ev = json_loadb(l, n, 0, NULL);
    json_t *err = json_object_get(ev, "error");
    char t[256];
    if (!json_is_object(ev)) {
        fprintf(stderr, "ddpd %s: skipped a line of the answer that is not a JSON object: %s\n", g->c->cmd,
                termsafe_line(t, sizeof t, l));
    } else if (err) {
        const char *msg = json_string_value(json_object_get(err, "message"));
        const char *at = json_string_value(json_object_get(err, "path"));
        char m[SAFE_MAX], a[256];
        snprintf(g->error, sizeof g->error, "%s%s%s", termsafe_line(a, sizeof a, at), at && at[0] ? ": " : "",
                 termsafe_line(m, sizeof m,
                               msg                   ? msg
                               : json_is_string(err) ? json_string_value(err)
                                                     : "(no message)"));
    } else if (json_is_integer(json_object_get(ev, "token"))) {
        gen_token(g, ev);
    } else if (json_is_true(json_object_get(ev, "done")) || json_is_array(json_object_get(ev, "ids"))) {
        if (g->tokens == 0)
            gen_whole(g, ev);
        json_decref(g->final);
        g->final = json_incref(ev);
    }
    json_decref(ev);
}

static size_t gen_bytes(void *ctx, const char *p, size_t n)
{
    struct gen *g = ctx;
    for (size_t i = 0; i < n; i++) {
        if (p[i] != '\n') {
            if (!buf_add(&g->line, p + i, 1)) {
                g->too_long = true;
                return 0;
            }
            continue;
        }
        gen_line(g, g->line.p ? g->line.p : (char *)"", g->line.n);
        g->line.n = 0;
        if (g->line.p)
            g->line.p[0] = '\0';
    }
    if (fflush(stdout) != 0)
        g->out_failed = true;
    return g->out_failed ? 0 : n;
}

/* --ids 1,2,3 as a JSON array: a new reference, or NULL after a message. */
static json_t *parse_ids(const char *s)
{
    json_t *ids = json_array();
    const char *p = s;
    for (size_t i = 0;; i++) {
        size_t len = strcspn(p, ",");
        char item[32];
        int64_t v;
        snprintf(item, sizeof item, "%.*s", (int)(len < sizeof item - 1 ? len : sizeof item - 1), p);
        if (len >= sizeof item || base_parse_i64(item, 0, INT64_MAX, &v)) {
            char t[64];
            fprintf(stderr,
                    "ddpd generate: --ids: expected token ids (integers from 0) separated by commas, such as "
                    "1,2,3; item %zu is '%s'\n",
                    i + 1, termsafe_line(t, sizeof t, item));
            json_decref(ids);
            return NULL;
        }
        if (i == IDS_MAX) {
            fprintf(stderr, "ddpd generate: --ids: at most %d ids\n", IDS_MAX);
            json_decref(ids);
            return NULL;
        }
        json_array_append_new(ids, json_integer(v));
        if (!p[len])
            return ids;
        p += len + 1;
    }
}

/* PROMPT, or - for stdin: a JSON string (the prompt must be UTF-8 text), or NULL after a
 * message. */
static json_t *prompt_value(const char *arg)
{
    struct buf b = {.max = PROMPT_MAX + 1};
    if (!strcmp(arg, "-")) {
        char chunk[65536];
        size_t n;
        while ((n = fread(chunk, 1, sizeof chunk, stdin)) > 0 && buf_add(&b, chunk, n))
            ;
        if (ferror(stdin) || b.over) {
            fprintf(stderr, "ddpd generate: the prompt on stdin: %s\n",
                    b.over ? "larger than the server's limit of 1 MiB" : strerror(errno));
            buf_free(&b);
            return NULL;
        }
    } else {
        buf_add(&b, arg, strlen(arg));
    }
    json_t *v = json_stringn(b.p ? b.p : "", b.n);
    if (!v)
        fprintf(stderr, "ddpd generate: the prompt is not UTF-8 text (for other bytes, give their ids with "
                        "--ids)\n");
    buf_free(&b);
    return v;
}

/* What the summary line says of the model that answered: "final model", "checkpoint ckpt-40". */
static void model_words(char *dst, size_t cap, json_t *ans)
{
    const char *m = json_string_value(json_object_get(ans, "model"));
    char t[64];
    termsafe_line(t, sizeof t, m ? m : "?");
    snprintf(dst, cap, m && !strcmp(m, "final") ? "final model" : "checkpoint %s", t);
}

/* After the stream: the final newline, then what happened on stderr. Returns the exit
 * status. */
static int gen_finish(struct gen *g, int64_t id, long status)
{
    if (g->last != '\n')
        gen_print(g, "\n", 1, TERMSAFE_TEXT);
    fflush(stdout);
    const char *cmd = g->c->cmd;
    if (g->out_failed) {
        fprintf(stderr, "ddpd %s: cannot write the answer to stdout\n", cmd);
        return EXIT_FAIL;
    }
    if (stop_requested) {
        fprintf(stderr, "ddpd %s: interrupted after %" PRId64 " tokens; the server stops the generation\n",
                cmd, g->tokens);
        return EXIT_INTERRUPTED;
    }
    if (g->error[0]) {
        fprintf(stderr, "ddpd %s: the generation failed after %" PRId64 " tokens: %s\n", cmd, g->tokens,
                g->error);
        return EXIT_FAIL;
    }
    if (g->too_long) {
        fprintf(stderr, "ddpd %s: a line of the answer is longer than %u bytes\n", cmd, GEN_LINE_MAX);
        return EXIT_FAIL;
    }
    if (!g->final) {
        fprintf(stderr,
                "ddpd %s: the answer ended before the generation did, after %" PRId64 " tokens (%s)\n", cmd,
                g->tokens, status == -1 ? g->c->why : "no final line");
        return EXIT_FAIL;
    }
    json_t *f = g->final;
    char model[96];
    model_words(model, sizeof model, f);
    fprintf(stderr,
            "ddpd %s: %" PRId64 " tokens from job %" PRId64 "'s %s in %.2f s (seed %" JSON_INTEGER_FORMAT
            ")\n",
            cmd, g->tokens, id, model, json_number_value(json_object_get(f, "seconds")),
            json_integer_value(json_object_get(f, "seed")));
    json_int_t cropped = json_integer_value(json_object_get(f, "cropped"));
    if (cropped > 0)
        fprintf(stderr,
                "ddpd %s: the prompt's first %" JSON_INTEGER_FORMAT
                " tokens were dropped to fit the model's context, as nanoGPT does\n",
                cmd, cropped);
    if (json_is_true(json_object_get(f, "cancelled"))) {
        fprintf(stderr, "ddpd %s: the server cancelled the generation\n", cmd);
        return EXIT_FAIL;
    }
    return 0;
}

/* A refused request: the server's message, and when it is busy, when to come back. */
static int refused(struct client *c, const char *path, long status, const struct sink *s)
{
    int rc = http_failed(c, "POST", path, status, &s->body, true);
    if (status == 503 && s->retry_after[0]) {
        char t[40];
        fprintf(stderr, "ddpd %s: the server is busy; it asks to try again in %s s\n", c->cmd,
                termsafe_line(t, sizeof t, s->retry_after));
    }
    return rc;
}

int cmd_generate(struct client *c, int argc, char **argv)
{
    static const struct option longs[] = {{"max-new-tokens", required_argument, NULL, 'n'},
                                          {"temperature", required_argument, NULL, OPT_TEMPERATURE},
                                          {"top-k", required_argument, NULL, OPT_TOP_K},
                                          {"seed", required_argument, NULL, OPT_SEED},
                                          {"step", required_argument, NULL, OPT_STEP},
                                          {"ids", required_argument, NULL, OPT_IDS},
                                          COMMON_OPTIONS};
    struct opts o = {.cmd = find_command("generate")};
    json_t *req = json_object(), *ids = NULL;
    int opt, rc = EXIT_USAGE;
    int64_t v;
    while ((opt = next_option(&o, argc, argv, ":n:h", longs)) != -1) {
        const char *name = opt == 'n'         ? "max_new_tokens"
                           : opt == OPT_TOP_K ? "top_k"
                           : opt == OPT_SEED  ? "seed"
                                              : "step";
        if (opt == -2) {
            rc = o.rc;
            goto out;
        }
        if (opt == OPT_TEMPERATURE) {
            char *end;
            errno = 0;
            double t = strtod(optarg, &end);
            if (end == optarg || *end || errno || !isfinite(t) || t < 0) {
                fprintf(stderr, "ddpd generate: --temperature: expected a number from 0 (greedy), got '%s'\n",
                        optarg);
                goto out;
            }
            json_object_set_new(req, "temperature", json_real(t));
        } else if (opt == OPT_IDS) {
            json_decref(ids);
            if (!(ids = parse_ids(optarg)))
                goto out;
        } else if (base_parse_i64(optarg, opt == 'n' ? 1 : 0, INT64_MAX, &v)) {
            fprintf(stderr, "ddpd generate: %s: expected an integer from %d, got '%s'\n",
                    opt == 'n'         ? "-n"
                    : opt == OPT_TOP_K ? "--top-k"
                    : opt == OPT_SEED  ? "--seed"
                                       : "--step",
                    opt == 'n' ? 1 : 0, optarg);
            goto out;
        } else {
            json_object_set_new(req, name, json_integer(v));
        }
    }
    int have = argc - optind;
    if (have < 1 || (!ids && have < 2) || have > 2 || (ids && have == 2)) {
        fprintf(stderr, "ddpd generate: %s\n",
                have < 1           ? "missing the job's ID"
                : ids && have == 2 ? "give a PROMPT or --ids, not both"
                : have < 2         ? "missing the PROMPT (or --ids)"
                                   : "expected ID and PROMPT only");
        fprintf(stderr, "(ddpd generate --help shows the usage)\n");
        goto out;
    }
    int64_t id;
    if (!parse_id("generate", argv[optind], &id))
        goto out;
    json_t *prompt = ids ? NULL : prompt_value(argv[optind + 1]);
    if (!ids && !prompt)
        goto out;
    json_object_set_new(req, ids ? "ids" : "prompt", ids ? json_incref(ids) : prompt);
    json_object_set_new(req, "stream", json_true());
    if ((rc = client_setup(c, &o)))
        goto out;

    char *body = json_dumps(req, JSON_COMPACT);
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%" PRId64 "/generate", id);
    struct gen g = {.c = c, .line = {.max = GEN_LINE_MAX}, .last = '\n'};
    struct sink s = {.c = c,
                     .body = {.max = ANSWER_MAX},
                     .stream = gen_bytes,
                     .stream_ctx = &g,
                     .accept = "application/x-ndjson",
                     .idle_s = GEN_IDLE_S,
                     .stop = &stop_requested};
    stop_requested = 0;
    catch_stop(true);
    long status = body ? request(c, "POST", path, body, strlen(body), REQ_STREAM, &s) : 0;
    catch_stop(false);
    if (g.line.n && !stop_requested) /* a last line without its newline */
        gen_line(&g, g.line.p, g.line.n);
    if (status == 200 || status == -1)
        rc = gen_finish(&g, id, status);
    else if (status > 0)
        rc = refused(c, path, status, &s);
    else
        rc = stop_requested ? EXIT_INTERRUPTED : EXIT_FAIL;
    json_decref(g.final);
    buf_free(&g.line);
    buf_free(&s.body);
    free(body);
out:
    json_decref(ids);
    json_decref(req);
    return rc;
}

/* ---- predict ------------------------------------------------------------------------- */

/* The .npy file (or stdin with "-") into b. Returns true, or false after a message. */
static bool read_npy(const char *name, struct buf *b)
{
    FILE *in = !strcmp(name, "-") ? stdin : fopen(name, "rb");
    char n[512];
    termsafe_line(n, sizeof n, strcmp(name, "-") ? name : "stdin");
    if (!in) {
        fprintf(stderr, "ddpd predict: %s: %s\n", n, strerror(errno));
        return false;
    }
    char chunk[65536];
    size_t got;
    while ((got = fread(chunk, 1, sizeof chunk, in)) > 0 && buf_add(b, chunk, got))
        ;
    bool failed = ferror(in);
    if (in != stdin)
        fclose(in);
    if (failed || b->over) {
        fprintf(stderr, "ddpd predict: %s: %s\n", n,
                b->over ? "larger than 1 GiB (the server's own limit is --infer-max-bytes)"
                        : "cannot read it");
        return false;
    }
    if (b->n < 10 || memcmp(b->p, "\x93NUMPY", 6) != 0) {
        fprintf(stderr,
                "ddpd predict: %s is not a .npy file (it does not begin with \\x93NUMPY; numpy.save "
                "writes one)\n",
                n);
        return false;
    }
    return true;
}

/* Appends the numbers of a nested list to vals (up to cap), counting them all in *count. */
static void flatten(json_t *v, double *vals, size_t cap, size_t *count)
{
    if (json_is_array(v)) {
        size_t i;
        json_t *x;
        json_array_foreach (v, i, x)
            flatten(x, vals, cap, count);
    } else {
        if (*count < cap)
            vals[*count] = json_is_number(v) ? json_number_value(v) : NAN;
        (*count)++;
    }
}

/* One class of "top" as "7 0.9731" ("? ?" for what is not a class). */
static void fmt_class(char *dst, size_t cap, json_t *e, bool with_p)
{
    json_t *k = json_object_get(e, "class"), *p = json_object_get(e, "p");
    char ks[32] = "?", ps[32] = "?";
    if (json_is_integer(k))
        snprintf(ks, sizeof ks, "%" JSON_INTEGER_FORMAT, json_integer_value(k));
    if (json_is_number(p))
        snprintf(ps, sizeof ps, "%.4f", json_number_value(p));
    if (with_p)
        snprintf(dst, cap, "%s %s", ks, ps);
    else
        snprintf(dst, cap, "%s", ks);
}

static void print_top(json_t *top)
{
    size_t i;
    json_t *row;
    printf("%-7s %-6s %-7s %s\n", "SAMPLE", "CLASS", "P", "NEXT (CLASS P)");
    json_array_foreach (top, i, row) {
        char cls[32], p[32] = "?";
        json_t *first = json_array_get(row, 0);
        fmt_class(cls, sizeof cls, first, false);
        if (json_is_number(json_object_get(first, "p")))
            snprintf(p, sizeof p, "%.4f", json_number_value(json_object_get(first, "p")));
        printf("%-7zu %-6s %-7s", i, cls, p);
        for (size_t k = 1; k <= PREDICT_NEXT && k < json_array_size(row); k++) {
            char e[64];
            fmt_class(e, sizeof e, json_array_get(row, k), true);
            printf("%s%s", k > 1 ? ", " : " ", e);
        }
        printf("\n");
    }
}

static void print_outputs(json_t *outputs, json_t *shape)
{
    char sh[128] = "";
    size_t i, o = 0;
    json_t *d;
    json_array_foreach (shape, i, d) {
        if (o + 24 >= sizeof sh)
            break;
        o += (size_t)snprintf(sh + o, sizeof sh - o, "%s%" JSON_INTEGER_FORMAT, i ? "," : "[",
                              json_integer_value(d));
    }
    if (o)
        snprintf(sh + o, sizeof sh - o, "]");
    printf("%-7s OUTPUTS%s%s\n", "SAMPLE", sh[0] ? " " : "", sh);
    json_t *row;
    json_array_foreach (outputs, i, row) {
        double vals[PREDICT_VALUES];
        size_t count = 0;
        flatten(row, vals, PREDICT_VALUES, &count);
        printf("%-7zu", i);
        for (size_t k = 0; k < count && k < PREDICT_VALUES; k++)
            printf(" %.6g", vals[k]);
        if (count > PREDICT_VALUES)
            printf(" ... (%zu values; --json prints them all)", count);
        printf("\n");
    }
}

int cmd_predict(struct client *c, int argc, char **argv)
{
    static const struct option longs[] = {
        {"json", no_argument, NULL, OPT_JSON}, {"step", required_argument, NULL, OPT_STEP}, COMMON_OPTIONS};
    struct opts o = {.cmd = find_command("predict")};
    bool as_json = false;
    int64_t step = -1;
    int opt;
    while ((opt = next_option(&o, argc, argv, ":h", longs)) != -1) {
        if (opt == -2)
            return o.rc;
        if (opt == OPT_JSON) {
            as_json = true;
        } else if (base_parse_i64(optarg, 0, INT64_MAX, &step)) {
            fprintf(stderr, "ddpd predict: --step: expected a step (an integer from 0), got '%s'\n", optarg);
            return EXIT_USAGE;
        }
    }
    if (!operands(&o, argc, 2, "ID and FILE.npy (or - for stdin)"))
        return o.rc;
    int64_t id;
    if (!parse_id("predict", argv[optind], &id))
        return EXIT_USAGE;
    struct buf npy = {.max = (size_t)PREDICT_MAX_BYTES};
    if (!read_npy(argv[optind + 1], &npy)) {
        buf_free(&npy);
        return EXIT_USAGE;
    }
    int rc = client_setup(c, &o);
    if (rc) {
        buf_free(&npy);
        return rc;
    }
    /* The body is the .npy file, so the checkpoint's step goes in the query. */
    char path[96];
    int n = snprintf(path, sizeof path, "/v1/jobs/%" PRId64 "/predict", id);
    if (step >= 0)
        snprintf(path + n, sizeof path - (size_t)n, "?step=%" PRId64, step);
    struct sink s = {.c = c,
                     .body = {.max = ANSWER_MAX},
                     .content_type = "application/x-npy",
                     .accept = "application/json",
                     .timeout_s = PREDICT_TIMEOUT_S};
    long status = request(c, "POST", path, npy.p, npy.n, REQ_PLAIN, &s);
    buf_free(&npy);
    rc = EXIT_FAIL;
    if (status == 200) {
        json_error_t je;
        json_t *ans = json_loadb(s.body.p ? s.body.p : "", s.body.n, 0, &je);
        json_t *outputs = json_object_get(ans, "outputs");
        char t[256];
        if (!json_is_array(outputs)) {
            fprintf(stderr, "ddpd predict: POST %s: the answer %s\n", path,
                    ans ? "has no \"outputs\" list" : termsafe_line(t, sizeof t, je.text));
        } else if (as_json) {
            size_t len = s.body.n;
            while (len &&
                   (s.body.p[len - 1] == '\n' || s.body.p[len - 1] == '\r' || s.body.p[len - 1] == ' '))
                len--;
            rc = termsafe_write(stdout, s.body.p, len, TERMSAFE_JSON_LINE) != 0 ||
                         fputc('\n', stdout) == EOF || fflush(stdout) != 0
                     ? EXIT_FAIL
                     : 0;
        } else {
            json_t *top = json_object_get(ans, "top");
            if (json_is_array(top))
                print_top(top);
            else
                print_outputs(outputs, json_object_get(ans, "shape"));
            char model[96];
            model_words(model, sizeof model, ans);
            fprintf(stderr, "ddpd predict: %zu samples through job %" PRId64 "'s %s\n",
                    json_array_size(outputs), id, model);
            rc = fflush(stdout) != 0 ? EXIT_FAIL : 0;
        }
        json_decref(ans);
    } else if (status > 0) {
        rc = refused(c, path, status, &s);
    }
    buf_free(&s.body);
    return rc;
}
