/* client_queue.c — `ddpd queue [--json] [--limit N]`: GET /v1/queue as two tables, the
 * running jobs (in start order) and the pending ones in the order they would start, with
 * why each waits; or the answer as JSON. Everything from the network is printed through
 * termsafe. */
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_impl.h"
#include "termsafe.h"

#define QUEUE_LIMIT_MAX 10000 /* GET /v1/queue's largest ?limit */

enum { OPT_JSON = OPT_LOCAL, OPT_QLIMIT };

/* Seconds as "45s", "3m12s", "2h05m", "3d04h"; "-" for null or a negative value. */
static const char *fmt_span(char *buf, size_t cap, json_t *v)
{
    if (!json_is_number(v) || json_number_value(v) < 0) {
        snprintf(buf, cap, "-");
        return buf;
    }
    long long s = (long long)floor(json_number_value(v));
    if (s < 60)
        snprintf(buf, cap, "%llds", s);
    else if (s < 3600)
        snprintf(buf, cap, "%lldm%02llds", s / 60, s % 60);
    else if (s < 86400)
        snprintf(buf, cap, "%lldh%02lldm", s / 3600, s % 3600 / 60);
    else
        snprintf(buf, cap, "%lldd%02lldh", s / 86400, s % 86400 / 3600);
    return buf;
}

/* A one-line cell: the string cut to its column (escapes included), "-" for null. */
static const char *cell(char *buf, size_t cap, json_t *v)
{
    const char *s = json_string_value(v);
    return termsafe_line(buf, cap, s && s[0] ? s : "-");
}

/* "gpu" for cuda, as the devices page names them. */
static const char *kind_word(json_t *device)
{
    const char *d = json_string_value(device);
    return d && !strcmp(d, "cuda") ? "gpu" : d && !strcmp(d, "cpu") ? "cpu" : "?";
}

/* A running job's devices: "gpu 0,1" (its slots), or "2 cpu" when the launcher places
 * the ranks itself (Slurm: no slots). */
static const char *running_devices(char *buf, size_t cap, json_t *job)
{
    json_t *slots = json_object_get(job, "slots"), *s;
    size_t i;
    if (!json_array_size(slots)) {
        snprintf(buf, cap, "%lld %s", (long long)json_integer_value(json_object_get(job, "world_size")),
                 kind_word(json_object_get(job, "device")));
        return buf;
    }
    size_t n = (size_t)snprintf(buf, cap, "%s ", kind_word(json_object_get(job, "device")));
    json_array_foreach (slots, i, s) {
        if (n >= cap)
            break;
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", i ? "," : "", (long long)json_integer_value(s));
    }
    return buf;
}

static void print_running(json_t *running)
{
    printf("RUNNING (%zu)\n", json_array_size(running));
    if (!json_array_size(running)) {
        printf("  none\n");
        return;
    }
    printf("%-6s %-24s %-12s %-4s %-12s %-12s %s\n", "ID", "NAME", "OWNER", "PRI", "DEVICES", "RUNNING FOR",
           "LIMIT");
    size_t i;
    json_t *j;
    json_array_foreach (running, i, j) {
        char nm[25], ow[13], dev[64], ran[24], lim[24];
        printf(
            "%-6lld %-24s %-12s %-4lld %-12s %-12s %s\n",
            (long long)json_integer_value(json_object_get(j, "id")),
            cell(nm, sizeof nm, json_object_get(j, "name")), cell(ow, sizeof ow, json_object_get(j, "owner")),
            (long long)json_integer_value(json_object_get(j, "priority")),
            running_devices(dev, sizeof dev, j), fmt_span(ran, sizeof ran, json_object_get(j, "running_s")),
            fmt_span(lim, sizeof lim, json_object_get(j, "time_limit")));
    }
}

static void print_pending(json_t *pending, json_int_t total)
{
    size_t shown = json_array_size(pending);
    if ((json_int_t)shown < total)
        printf("PENDING (%zu of %lld; --limit N shows more)\n", shown, (long long)total);
    else
        printf("PENDING (%zu)\n", shown);
    if (!shown) {
        printf("  none\n");
        return;
    }
    printf("%-4s %-6s %-24s %-12s %-9s %-8s %-8s %s\n", "#", "ID", "NAME", "OWNER", "PRI", "DEVICES",
           "WAITED", "REASON");
    size_t i;
    json_t *j;
    json_array_foreach (pending, i, j) {
        char nm[25], ow[13], pri[48], dev[48], waited[24], why[SAFE_MAX];
        json_int_t p = json_integer_value(json_object_get(j, "priority")),
                   e = json_integer_value(json_object_get(j, "effective_priority"));
        /* The effective priority (aging) when it is above the job's own: "30 (+5)". */
        if (e > p)
            snprintf(pri, sizeof pri, "%lld (+%lld)", (long long)p, (long long)(e - p));
        else
            snprintf(pri, sizeof pri, "%lld", (long long)p);
        snprintf(dev, sizeof dev, "%lld %s", (long long)json_integer_value(json_object_get(j, "world_size")),
                 kind_word(json_object_get(j, "device")));
        printf("%-4lld %-6lld %-24s %-12s %-9s %-8s %-8s %s\n",
               (long long)json_integer_value(json_object_get(j, "position")),
               (long long)json_integer_value(json_object_get(j, "id")),
               cell(nm, sizeof nm, json_object_get(j, "name")),
               cell(ow, sizeof ow, json_object_get(j, "owner")), pri, dev,
               fmt_span(waited, sizeof waited, json_object_get(j, "waited_s")),
               cell(why, sizeof why, json_object_get(j, "reason")));
    }
}

int cmd_queue(struct client *c, int argc, char **argv)
{
    static const struct option longs[] = {{"json", no_argument, NULL, OPT_JSON},
                                          {"limit", required_argument, NULL, OPT_QLIMIT},
                                          COMMON_OPTIONS};
    struct opts o = {.cmd = find_command("queue")};
    bool as_json = false;
    long limit = 0;
    int opt;
    while ((opt = next_option(&o, argc, argv, ":h", longs)) != -1) {
        if (opt == -2)
            return o.rc;
        if (opt == OPT_JSON)
            as_json = true;
        else if (!parse_opt_long("queue", "--limit", optarg, 1, QUEUE_LIMIT_MAX, &limit))
            return EXIT_USAGE;
    }
    if (!operands(&o, argc, 0, "options"))
        return o.rc;
    int rc = client_setup(c, &o);
    if (rc)
        return rc;
    char path[64] = "/v1/queue";
    if (limit)
        snprintf(path, sizeof path, "/v1/queue?limit=%ld", limit);
    json_t *j = get_json(c, path, &rc);
    if (!j)
        return rc;
    if (as_json)
        return client_print_json(j);
    json_t *running = json_object_get(j, "running"), *pending = json_object_get(j, "pending");
    if (!json_is_array(running) || !json_is_array(pending)) {
        fprintf(stderr, "ddpd queue: GET %s: the answer has no \"running\" and \"pending\" lists\n", path);
        json_decref(j);
        return EXIT_FAIL;
    }
    json_t *total = json_object_get(j, "pending_total");
    print_running(running);
    printf("\n");
    print_pending(pending,
                  json_is_integer(total) ? json_integer_value(total) : (json_int_t)json_array_size(pending));
    json_decref(j);
    return 0;
}
