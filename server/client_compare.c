/* client_compare.c — `ddpd compare ID ID...`: the final and best metrics of several jobs
 * in one table (each job's `metrics`, docs/api.md "Job metrics"), then the spec fields in
 * which they differ, and only those (the specs flattened to dotted paths, model[0].out, as
 * the dashboard's compare page shows them). Reads GET /v1/jobs/{id} of each job; all it
 * prints of the server's answers goes through termsafe. */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../base/alloc.h"
#include "client_impl.h"
#include "termsafe.h"

#define COMPARE_MAX 50 /* jobs on one command line, as on the dashboard's page */
#define CELL_MAX    64 /* a cell as printed, escaped and cut */

/* ---- the specs flattened ---- */

/* Every leaf of `v` into `out` as path -> value (borrowed from v): an object's members as
 * prefix.key, an array's items as prefix[i]; an empty object or array is a leaf. */
static void flatten(json_t *v, const char *prefix, json_t *out)
{
    char path[512];
    if (json_is_object(v) && json_object_size(v)) {
        const char *k;
        json_t *x;
        json_object_foreach (v, k, x) {
            snprintf(path, sizeof path, "%s%s%s", prefix, prefix[0] ? "." : "", k);
            flatten(x, path, out);
        }
    } else if (json_is_array(v) && json_array_size(v)) {
        size_t i;
        json_t *x;
        json_array_foreach (v, i, x) {
            snprintf(path, sizeof path, "%s[%zu]", prefix, i);
            flatten(x, path, out);
        }
    } else {
        json_object_set(out, prefix, v);
    }
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* A spec value as one cell: a number as the shortest text that reads back the same (no
 * float noise: 0.05, not 0.050000000000000003), anything else as compact JSON. */
static const char *value_text(char *out, size_t cap, const json_t *v)
{
    if (!v)
        return termsafe_line(out, cap, "(not set)");
    char num[40];
    if (json_is_real(v)) {
        double d = json_real_value(v);
        for (int prec = 1; prec <= 17; prec++) {
            snprintf(num, sizeof num, "%.*g", prec, d);
            if (strtod(num, NULL) == d)
                break;
        }
        return termsafe_line(out, cap, num);
    }
    char *t = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    termsafe_line(out, cap, t ? t : "?");
    free(t);
    return out;
}

/* ---- the metrics table ---- */

/* A metric of `m` as a cell: "-" when null; a loss to 4 significant digits, an accuracy
 * as a percentage; " @S" with its step when `step_key` names one. */
static void metric_cell(char *out, size_t cap, const json_t *m, const char *key, const char *step_key,
                        bool pct)
{
    const json_t *v = json_object_get(m, key);
    if (!json_is_number(v)) {
        snprintf(out, cap, "-");
        return;
    }
    int n = pct ? snprintf(out, cap, "%.2f%%", 100 * json_number_value(v))
                : snprintf(out, cap, "%.4g", json_number_value(v));
    const json_t *s = step_key ? json_object_get(m, step_key) : NULL;
    if (json_is_integer(s) && n > 0 && (size_t)n < cap)
        snprintf(out + n, cap - (size_t)n, " @%" JSON_INTEGER_FORMAT, json_integer_value(s));
}

enum { COL_JOB, COL_NAME, COL_STATE, COL_STEP, COL_LOSS, COL_EVAL, COL_BEST, COL_ACC, COL_BEST_ACC, NCOL };
static const char *const col_head[NCOL] = {"JOB",       "NAME",           "STATE",    "STEP",         "LOSS",
                                           "EVAL LOSS", "BEST EVAL LOSS", "EVAL ACC", "BEST EVAL ACC"};

/* Prints rows of cells [n][ncol] in columns as wide as their widest cell. */
static void print_table(char (*cells)[NCOL][CELL_MAX], size_t n, int ncol)
{
    int w[NCOL] = {0};
    for (size_t r = 0; r < n; r++)
        for (int k = 0; k < ncol; k++) {
            int len = (int)strlen(cells[r][k]);
            w[k] = len > w[k] ? len : w[k];
        }
    for (size_t r = 0; r < n; r++)
        for (int k = 0; k < ncol; k++)
            printf("%-*s%s", k + 1 < ncol ? w[k] : 0, cells[r][k], k + 1 < ncol ? "  " : "\n");
}

static void print_metrics(json_t **jobs, size_t n)
{
    bool acc = false;
    for (size_t i = 0; i < n; i++)
        acc |= json_is_number(json_object_get(json_object_get(jobs[i], "metrics"), "best_eval_accuracy"));
    char(*cells)[NCOL][CELL_MAX] = xcalloc(n + 1, sizeof *cells);
    for (int k = 0; k < NCOL; k++)
        snprintf(cells[0][k], CELL_MAX, "%s", col_head[k]);
    for (size_t i = 0; i < n; i++) {
        json_t *j = jobs[i], *m = json_object_get(j, "metrics");
        char(*row)[CELL_MAX] = cells[i + 1];
        snprintf(row[COL_JOB], CELL_MAX, "%" JSON_INTEGER_FORMAT,
                 json_integer_value(json_object_get(j, "id")));
        const char *name = json_string_value(json_object_get(j, "name"));
        termsafe_line(row[COL_NAME], CELL_MAX, name && name[0] ? name : "-");
        termsafe_line(row[COL_STATE], CELL_MAX, json_string_value(json_object_get(j, "state")));
        const json_t *st = json_object_get(m, "step");
        if (json_is_integer(st))
            snprintf(row[COL_STEP], CELL_MAX, "%" JSON_INTEGER_FORMAT, json_integer_value(st));
        else
            snprintf(row[COL_STEP], CELL_MAX, "-");
        metric_cell(row[COL_LOSS], CELL_MAX, m, "loss", NULL, false);
        metric_cell(row[COL_EVAL], CELL_MAX, m, "eval_loss", "eval_step", false);
        metric_cell(row[COL_BEST], CELL_MAX, m, "best_eval_loss", "best_eval_loss_step", false);
        metric_cell(row[COL_ACC], CELL_MAX, m, "eval_accuracy", "eval_step", true);
        metric_cell(row[COL_BEST_ACC], CELL_MAX, m, "best_eval_accuracy", "best_eval_accuracy_step", true);
    }
    print_table(cells, n + 1, acc ? NCOL : COL_ACC);
    free(cells);
}

/* The spec fields in which the jobs differ: a path that some spec lacks is one of them. */
static void print_differences(json_t **jobs, size_t n)
{
    json_t **flat = xcalloc(n, sizeof *flat);
    json_t *all = json_object();
    for (size_t i = 0; i < n; i++) {
        flat[i] = json_object();
        flatten(json_object_get(jobs[i], "spec"), "", flat[i]);
        json_object_update(all, flat[i]);
    }
    size_t np = json_object_size(all), nd = 0;
    const char **paths = xcalloc(np ? np : 1, sizeof *paths);
    const char *k;
    json_t *v;
    json_object_foreach (all, k, v) {
        const json_t *first = json_object_get(flat[0], k);
        for (size_t i = 1; i < n; i++) {
            const json_t *x = json_object_get(flat[i], k);
            if (!first || !x || !json_equal(first, x)) {
                paths[nd++] = k;
                break;
            }
        }
    }
    qsort(paths, nd, sizeof *paths, cmp_str);
    printf("\n");
    if (!nd) {
        printf("The specs are the same.\n");
    } else {
        /* One column per job: FIELD, then #ID each. */
        int w0 = (int)strlen("FIELD");
        char cell[CELL_MAX];
        for (size_t p = 0; p < nd; p++) {
            int len = (int)strlen(termsafe_line(cell, sizeof cell, paths[p]));
            w0 = len > w0 ? len : w0;
        }
        int *w = xcalloc(n, sizeof *w);
        for (size_t i = 0; i < n; i++) {
            w[i] = snprintf(cell, sizeof cell, "#%" JSON_INTEGER_FORMAT,
                            json_integer_value(json_object_get(jobs[i], "id")));
            for (size_t p = 0; p < nd; p++) {
                int len = (int)strlen(value_text(cell, sizeof cell, json_object_get(flat[i], paths[p])));
                w[i] = len > w[i] ? len : w[i];
            }
        }
        printf("%-*s", w0, "FIELD");
        for (size_t i = 0; i < n; i++) {
            snprintf(cell, sizeof cell, "#%" JSON_INTEGER_FORMAT,
                     json_integer_value(json_object_get(jobs[i], "id")));
            printf("  %-*s", i + 1 < n ? w[i] : 0, cell);
        }
        printf("\n");
        for (size_t p = 0; p < nd; p++) {
            printf("%-*s", w0, termsafe_line(cell, sizeof cell, paths[p]));
            for (size_t i = 0; i < n; i++)
                printf("  %-*s", i + 1 < n ? w[i] : 0,
                       value_text(cell, sizeof cell, json_object_get(flat[i], paths[p])));
            printf("\n");
        }
        free(w);
    }
    free(paths);
    json_decref(all);
    for (size_t i = 0; i < n; i++)
        json_decref(flat[i]);
    free(flat);
}

int cmd_compare(struct client *c, int argc, char **argv)
{
    static const struct option longs[] = {COMMON_OPTIONS};
    struct opts o = {.cmd = find_command("compare")};
    int opt;
    while ((opt = next_option(&o, argc, argv, ":h", longs)) != -1)
        if (opt == -2)
            return o.rc;
    int n = argc - optind;
    if (n < 2 || n > COMPARE_MAX) {
        fprintf(stderr, "ddpd compare: expected 2 to %d job ids, got %d (ddpd compare --help)\n", COMPARE_MAX,
                n);
        return EXIT_USAGE;
    }
    int64_t ids[COMPARE_MAX];
    for (int i = 0; i < n; i++) {
        if (!parse_id("compare", argv[optind + i], &ids[i]))
            return EXIT_USAGE;
        for (int k = 0; k < i; k++)
            if (ids[k] == ids[i]) {
                fprintf(stderr, "ddpd compare: job %" PRId64 " is given twice\n", ids[i]);
                return EXIT_USAGE;
            }
    }
    int rc = client_setup(c, &o);
    if (rc)
        return rc;
    json_t *jobs[COMPARE_MAX] = {0};
    int got = 0;
    for (; got < n; got++) {
        char path[64];
        snprintf(path, sizeof path, "/v1/jobs/%" PRId64, ids[got]);
        if (!(jobs[got] = get_json(c, path, &rc)))
            break;
    }
    if (got == n) {
        print_metrics(jobs, (size_t)n);
        print_differences(jobs, (size_t)n);
        rc = 0;
    }
    for (int i = 0; i < got; i++)
        json_decref(jobs[i]);
    return rc;
}
