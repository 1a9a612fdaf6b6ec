/* opt.c — getopt_long's refusals in words (opt.h). */
#include "opt.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

void opt_complain(const char *cmd, int c, char **argv, const struct option *longs)
{
    const char *arg = optind > 0 ? argv[optind - 1] : "";
    bool is_long = !strncmp(arg, "--", 2);
    if (c == ':') {
        if (is_long || !(optopt > 0 && optopt < 256))
            fprintf(stderr, "ddpd %s: option '%s' needs a value\n", cmd, arg);
        else
            fprintf(stderr, "ddpd %s: option '-%c' needs a value\n", cmd, optopt);
        return;
    }
    if (!is_long && optopt > 0 && optopt < 256) {
        fprintf(stderr, "ddpd %s: unknown option '-%c'\n", cmd, optopt);
        return;
    }
    if (!is_long) {
        fprintf(stderr, "ddpd %s: unknown option '%s'\n", cmd, arg);
        return;
    }
    /* A long option that is the start of several names is ambiguous, not unknown. */
    const char *name = arg + 2;
    size_t n = strcspn(name, "=");
    int matches = 0;
    for (const struct option *o = longs; o->name; o++)
        matches += !strncmp(o->name, name, n);
    if (n > 0 && matches > 1) {
        fprintf(stderr, "ddpd %s: option '--%.*s' is ambiguous:", cmd, (int)n, name);
        for (const struct option *o = longs; o->name; o++)
            if (!strncmp(o->name, name, n))
                fprintf(stderr, " --%s", o->name);
        fputc('\n', stderr);
    } else if (matches == 1 && name[n] == '=') {
        fprintf(stderr, "ddpd %s: option '--%.*s' takes no value\n", cmd, (int)n, name);
    } else {
        fprintf(stderr, "ddpd %s: unknown option '%s'\n", cmd, arg);
    }
}
