/* client_whoami.c — `ddpd whoami [--json]`: GET /v1/whoami, the caller as the server sees
 * it: name, role, and the limits an admin set (max priority, GPUs, CPU ranks and queued
 * jobs at once; "none" for no limit), or the answer as JSON. Everything from the network is
 * printed through termsafe. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_impl.h"
#include "termsafe.h"

enum { OPT_JSON = OPT_LOCAL };

/* A limit: its number, "none" for null (no limit), "-" when the answer lacks it. */
static const char *limit_text(char *buf, size_t cap, json_t *v)
{
    if (json_is_integer(v))
        snprintf(buf, cap, "%lld", (long long)json_integer_value(v));
    else
        snprintf(buf, cap, "%s", json_is_null(v) ? "none" : "-");
    return buf;
}

int cmd_whoami(struct client *c, int argc, char **argv)
{
    static const struct option longs[] = {{"json", no_argument, NULL, OPT_JSON}, COMMON_OPTIONS};
    struct opts o = {.cmd = find_command("whoami")};
    bool as_json = false;
    int opt;
    while ((opt = next_option(&o, argc, argv, ":h", longs)) != -1) {
        if (opt == -2)
            return o.rc;
        if (opt == OPT_JSON)
            as_json = true;
    }
    if (!operands(&o, argc, 0, "options"))
        return o.rc;
    int rc = client_setup(c, &o);
    if (rc)
        return rc;
    json_t *j = get_json(c, "/v1/whoami", &rc);
    if (!j)
        return rc;
    if (as_json)
        return client_print_json(j);
    const char *name = json_string_value(json_object_get(j, "name")),
               *role = json_string_value(json_object_get(j, "role"));
    if (!name || !role) {
        fprintf(stderr, "ddpd whoami: GET /v1/whoami: the answer has no \"name\" and \"role\"\n");
        json_decref(j);
        return EXIT_FAIL;
    }
    char nm[SAFE_MAX], ro[SAFE_MAX], pri[32], gpus[32], ranks[32], queued[32];
    printf("name           %s%s\n", termsafe_line(nm, sizeof nm, name),
           json_is_true(json_object_get(j, "builtin")) ? " (built in)" : "");
    printf("role           %s\n", termsafe_line(ro, sizeof ro, role));
    printf("max priority   %s\n", limit_text(pri, sizeof pri, json_object_get(j, "max_priority")));
    printf("max GPUs       %s\n", limit_text(gpus, sizeof gpus, json_object_get(j, "max_gpus")));
    printf("max CPU ranks  %s\n", limit_text(ranks, sizeof ranks, json_object_get(j, "max_cpu_ranks")));
    printf("max queued     %s\n", limit_text(queued, sizeof queued, json_object_get(j, "max_queued")));
    json_decref(j);
    return 0;
}
