/* client_sweep.c — `ddpd sweep submit FILE | show [--json] ID | cancel ID`: the sweep
 * routes of docs/api.md "Sweeps" over the client's connection. The table of `show` is
 * the server's ranking as it comes; everything from the network is printed through
 * termsafe. */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../schema/spec.h"
#include "client_impl.h"
#include "termsafe.h"

/* The options of a subcommand that has none of its own. Returns -1 to go on, else the
 * exit status (0 after --help). */
static int common_options(struct opts *o, int argc, char **argv)
{
    static const struct option longs[] = {COMMON_OPTIONS};
    int opt;
    while ((opt = next_option(o, argc, argv, ":h", longs)) != -1)
        if (opt == -2)
            return o->rc;
    return -1;
}

static int sweep_submit(struct client *c, int argc, char **argv)
{
    struct opts o = {.cmd = find_command("sweep")};
    int rc = common_options(&o, argc, argv);
    if (rc >= 0)
        return rc;
    if (!operands(&o, argc, 1, "FILE.json"))
        return o.rc;
    rc = client_setup(c, &o);
    if (rc)
        return rc;
    struct buf body = {.max = SPEC_MAX_BODY + 1};
    if ((rc = read_body("sweep submit", argv[optind], &body)))
        return rc;
    json_t *j = post_created(c, "sweep submit", "/v1/sweeps", body.p ? body.p : "", body.n, &rc);
    buf_free(&body);
    if (!j)
        return rc;
    printf("%" PRId64 "\n", (int64_t)json_integer_value(json_object_get(j, "id")));
    fprintf(stderr, "ddpd sweep: %" PRId64 " trials\n",
            (int64_t)json_integer_value(json_object_get(j, "trials")));
    json_decref(j);
    return 0;
}

/* A JSON value as one compact line, safe for a terminal, into buf[cap]. */
static const char *json_line(char *buf, size_t cap, const json_t *v)
{
    char *t = v ? json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY | JSON_PRESERVE_ORDER) : NULL;
    termsafe_line(buf, cap, t ? t : "-");
    free(t);
    return buf;
}

static int sweep_show(struct client *c, int argc, char **argv)
{
    static const struct option longs[] = {{"json", no_argument, NULL, 'j'}, COMMON_OPTIONS};
    struct opts o = {.cmd = find_command("sweep")};
    bool as_json = false;
    int opt;
    while ((opt = next_option(&o, argc, argv, ":h", longs)) != -1) {
        if (opt == -2)
            return o.rc;
        as_json = true; /* 'j' */
    }
    int64_t id;
    int rc = id_operand(c, &o, argc, argv, "sweep show", &id);
    if (rc)
        return rc;
    char path[64];
    snprintf(path, sizeof path, "/v1/sweeps/%" PRId64, id);
    json_t *j = get_json(c, path, &rc);
    if (!j)
        return rc;
    char a[SAFE_MAX], b[SAFE_MAX], d[SAFE_MAX];
    if (as_json) {
        char *text = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        rc = !text || termsafe_write(stdout, text, strlen(text), TERMSAFE_JSON_TEXT) != 0 ||
                     fputc('\n', stdout) == EOF
                 ? EXIT_FAIL
                 : 0;
        free(text);
        json_decref(j);
        return rc;
    }
    printf("sweep %" PRId64 ": %s, %s, %s (%s), counts %s\n", id,
           termsafe_line(a, sizeof a, json_string_value(json_object_get(j, "state"))),
           termsafe_line(b, sizeof b, json_string_value(json_object_get(j, "method"))),
           termsafe_line(d, sizeof d, json_string_value(json_object_get(j, "metric"))),
           json_string_value(json_object_get(j, "mode")) &&
                   !strcmp(json_string_value(json_object_get(j, "mode")), "max")
               ? "max"
               : "min",
           json_line(a, sizeof a, json_object_get(j, "counts")));
    /* asha: a RUNG column, the rung each trial's latest job runs to. */
    const char *method = json_string_value(json_object_get(j, "method"));
    bool asha = method && !strcmp(method, "asha");
    printf("%-5s %-6s %-6s %-10s %-12s %s%s\n", "RANK", "TRIAL", "JOB", "STATE", "METRIC",
           asha ? "RUNG " : "", "VALUES");
    size_t i;
    json_t *t;
    json_array_foreach (json_object_get(j, "trials"), i, t) {
        json_t *job = json_object_get(t, "job"), *m = json_object_get(t, "metric");
        char jb[24] = "-", mt[32] = "-";
        if (json_is_integer(job))
            snprintf(jb, sizeof jb, "%" PRId64, (int64_t)json_integer_value(job));
        if (json_is_number(m))
            snprintf(mt, sizeof mt, "%.6g", json_number_value(m));
        char rg[24] = "";
        if (asha)
            snprintf(rg, sizeof rg, "%-4" PRId64 " ",
                     (int64_t)json_integer_value(json_object_get(t, "rung")));
        printf("%-5" PRId64 " %-6" PRId64 " %-6s %-10s %-12s %s%s\n",
               (int64_t)json_integer_value(json_object_get(t, "rank")),
               (int64_t)json_integer_value(json_object_get(t, "index")), jb,
               termsafe_line(a, sizeof a, json_string_value(json_object_get(t, "state"))), mt, rg,
               json_line(b, sizeof b, json_object_get(t, "params")));
    }
    json_t *best = json_object_get(j, "best");
    if (json_is_object(best))
        printf("best: trial %" PRId64 " (job %" PRId64 "), %s = %.6g, %s\n",
               (int64_t)json_integer_value(json_object_get(best, "index")),
               (int64_t)json_integer_value(json_object_get(best, "job")),
               termsafe_line(a, sizeof a, json_string_value(json_object_get(j, "metric"))),
               json_number_value(json_object_get(best, "metric")),
               json_line(b, sizeof b, json_object_get(best, "params")));
    else
        printf("best: none yet\n");
    json_decref(j);
    return 0;
}

static int sweep_cancel(struct client *c, int argc, char **argv)
{
    struct opts o = {.cmd = find_command("sweep")};
    int rc = common_options(&o, argc, argv);
    if (rc >= 0)
        return rc;
    int64_t id;
    rc = id_operand(c, &o, argc, argv, "sweep cancel", &id);
    if (rc)
        return rc;
    char path[64];
    snprintf(path, sizeof path, "/v1/sweeps/%" PRId64 "/cancel", id);
    struct sink s = {.c = c, .body = {.max = ANSWER_MAX}};
    long status = request(c, "POST", path, NULL, 0, REQ_PLAIN, &s);
    if (status == 202) {
        printf("sweep %" PRId64 " is being cancelled\n", id);
        rc = 0;
    } else {
        rc = status > 0 ? http_failed(c, "POST", path, status, &s.body, false) : EXIT_FAIL;
    }
    buf_free(&s.body);
    return rc;
}

int cmd_sweep(struct client *c, int argc, char **argv)
{
    const char *sub = argc > 1 ? argv[1] : "";
    /* The subcommand's options and operands follow it: argv[1] becomes its argv[0]. */
    if (!strcmp(sub, "submit"))
        return sweep_submit(c, argc - 1, argv + 1);
    if (!strcmp(sub, "show"))
        return sweep_show(c, argc - 1, argv + 1);
    if (!strcmp(sub, "cancel"))
        return sweep_cancel(c, argc - 1, argv + 1);
    if (!strcmp(sub, "-h") || !strcmp(sub, "--help")) {
        struct opts o = {.cmd = find_command("sweep")};
        return common_options(&o, argc, argv);
    }
    char e[SAFE_MAX];
    fprintf(stderr, "ddpd sweep: expected submit, show or cancel, got \"%s\" (ddpd sweep --help)\n",
            termsafe_line(e, sizeof e, sub));
    return EXIT_USAGE;
}
