/* users_cli.c — `ddpd users add|list|remove|rotate|set` (docs/cli.md, docs/security.md):
 * named users managed on the database directly, through the store (its migrations make a
 * fresh database usable; WAL and the busy timeout let it run beside a live server, which
 * sees each change at its next request). A new token is printed once, as the last line
 * of the output; only its SHA-256 is stored. Knows no HTTP. */
#include "users_cli.h"

#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "../base/parse.h"
#include "store.h"
#include "users.h"

static void usage(FILE *f)
{
    fputs("usage: ddpd users add NAME --role admin|user|viewer [--max-priority P] [--max-gpus N]\n"
          "                      [--max-cpu-ranks N] [--max-queued N] [--db DB]\n"
          "       ddpd users list [--db DB]\n"
          "       ddpd users remove NAME [--db DB]\n"
          "       ddpd users rotate NAME [--db DB]\n"
          "       ddpd users set NAME [--role R] [--max-priority P] [--max-gpus N|none]\n"
          "                      [--max-cpu-ranks N|none] [--max-queued N|none] [--db DB]\n"
          "Manages the server's users in its database (default var/ddpd.db), also while it runs.\n"
          "add and rotate print the user's new token as the last line: it is shown only once\n"
          "(the database keeps its SHA-256). Limits: --max-priority 0..100 (default 50), the most\n"
          "GPUs and CPU ranks at once and queued jobs (default none: no limit).\n",
          f);
}

/* What the command line says. */
struct users_args {
    const char *verb, *name, *db;
    struct user u;
    bool role_set, any_set;
};

static bool parse_limit(const char *opt, const char *v, bool none_ok, int64_t hi, int64_t *out)
{
    if (none_ok && v && !strcmp(v, "none")) {
        *out = USER_NO_LIMIT;
        return true;
    }
    if (!v || base_parse_i64(v, 0, hi, out) != 0) {
        fprintf(stderr, "ddpd users: %s: expected an integer from 0 to %lld%s; got %s\n", opt, (long long)hi,
                none_ok ? " or none" : "", v ? v : "nothing");
        return false;
    }
    return true;
}

static bool parse_args(int argc, char **argv, struct users_args *a)
{
    memset(a, 0, sizeof *a);
    user_defaults(&a->u);
    a->db = "var/ddpd.db";
    if (argc < 2) {
        usage(stderr);
        return false;
    }
    a->verb = argv[1];
    bool set = !strcmp(a->verb, "set");
    for (int i = 2; i < argc; i++) {
        const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t n;
        if (o[0] != '-' || !o[1]) {
            if (a->name) {
                fprintf(stderr, "ddpd users %s: one user name is taken; got '%s' and '%s'\n", a->verb,
                        a->name, o);
                return false;
            }
            a->name = o;
            continue;
        }
        if (!v) {
            fprintf(stderr, "ddpd users %s: %s needs a value\n", a->verb, o);
            return false;
        }
        i++;
        if (!strcmp(o, "--db")) {
            a->db = v;
            continue;
        }
        a->any_set = true;
        if (!strcmp(o, "--role")) {
            if (!user_role_parse(v, &a->u.role)) {
                fprintf(stderr, "ddpd users %s: --role: expected admin, user or viewer; got '%s'\n", a->verb,
                        v);
                return false;
            }
            a->role_set = true;
        } else if (!strcmp(o, "--max-priority")) {
            if (!parse_limit(o, v, false, 100, &n))
                return false;
            a->u.max_priority = (int)n;
        } else if (!strcmp(o, "--max-gpus")) {
            if (!parse_limit(o, v, set, 1 << 20, &a->u.max_gpus))
                return false;
        } else if (!strcmp(o, "--max-cpu-ranks")) {
            if (!parse_limit(o, v, set, 1 << 20, &a->u.max_cpu_ranks))
                return false;
        } else if (!strcmp(o, "--max-queued")) {
            if (!parse_limit(o, v, set, 1 << 30, &a->u.max_queued))
                return false;
        } else {
            fprintf(stderr, "ddpd users %s: unknown option %s\n", a->verb, o);
            usage(stderr);
            return false;
        }
    }
    return true;
}

static void print_limit(const char *label, int64_t v)
{
    if (v < 0)
        printf("  %s none", label);
    else
        printf("  %s %lld", label, (long long)v);
}

static void print_user(const struct user *u)
{
    char when[32] = "";
    time_t t = (time_t)u->created_at;
    struct tm tm;
    if (gmtime_r(&t, &tm))
        strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
    printf("%-20s %-6s  max_priority %d", u->name, user_role_name(u->role), u->max_priority);
    print_limit("max_gpus", u->max_gpus);
    print_limit("max_cpu_ranks", u->max_cpu_ranks);
    print_limit("max_queued", u->max_queued);
    printf("  created %s\n", when);
}

/* Sets `field` of *u to `from`'s when the option was given (a field of the parsed args
 * differs from the defaults only when it was). */
static void apply_set(int argc, char **argv, const struct user *from, struct user *u)
{
    for (int i = 2; i + 1 < argc; i++) {
        const char *o = argv[i];
        if (!strcmp(o, "--role"))
            u->role = from->role;
        else if (!strcmp(o, "--max-priority"))
            u->max_priority = from->max_priority;
        else if (!strcmp(o, "--max-gpus"))
            u->max_gpus = from->max_gpus;
        else if (!strcmp(o, "--max-cpu-ranks"))
            u->max_cpu_ranks = from->max_cpu_ranks;
        else if (!strcmp(o, "--max-queued"))
            u->max_queued = from->max_queued;
        else
            continue;
        i++;
    }
}

/* A new token, printed as the last line. */
static int print_token(const char *token)
{
    printf("token (shown once; the server keeps only its SHA-256):\n%s\n", token);
    return fflush(stdout) == 0 ? 0 : 1;
}

int users_main(int argc, char **argv)
{
    struct users_args a;
    if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        usage(stdout);
        return 0;
    }
    if (!parse_args(argc, argv, &a))
        return 2;
    bool add = !strcmp(a.verb, "add"), list = !strcmp(a.verb, "list"), rm = !strcmp(a.verb, "remove"),
         rot = !strcmp(a.verb, "rotate"), set = !strcmp(a.verb, "set");
    if (!add && !list && !rm && !rot && !set) {
        fprintf(stderr,
                "ddpd users: unknown command '%s'; the commands are add, list, remove, rotate and set\n",
                a.verb);
        usage(stderr);
        return 2;
    }
    char why[200];
    if (list && a.name) {
        fprintf(stderr, "ddpd users list: takes no name (got '%s')\n", a.name);
        return 2;
    }
    if (!list && !a.name) {
        fprintf(stderr, "ddpd users %s: give the user's NAME\n", a.verb);
        return 2;
    }
    if (a.name && !user_name_check(a.name, why, sizeof why)) {
        fprintf(stderr, "ddpd users %s: NAME '%s': %s\n", a.verb, a.name, why);
        return 2;
    }
    if (add && user_name_reserved(a.name)) {
        fprintf(stderr, "ddpd users add: %s is the name of a built-in admin (%s); choose another name\n",
                a.name,
                !strcmp(a.name, USER_ROOT) ? "the --token-file token's" : "the open loopback mode's caller");
        return 2;
    }
    if (add && !a.role_set) {
        fprintf(stderr, "ddpd users add: give --role admin, user or viewer\n");
        return 2;
    }
    if ((rm || rot || list) && a.any_set) {
        fprintf(stderr, "ddpd users %s: takes no --role or limits (use ddpd users set)\n", a.verb);
        return 2;
    }
    if (set && !a.any_set) {
        fprintf(stderr, "ddpd users set: nothing to change: give --role, --max-priority, --max-gpus, "
                        "--max-cpu-ranks or --max-queued\n");
        return 2;
    }
    /* The database's folder must exist (a typo in --db must not grow folders). */
    char dir[PATH_MAX];
    struct stat st;
    snprintf(dir, sizeof dir, "%s", a.db);
    const char *dd = dirname(dir);
    if (stat(dd, &st) != 0 || !S_ISDIR(st.st_mode)) {
        fprintf(stderr, "ddpd users %s: --db %s: the folder %s does not exist\n", a.verb, a.db, dd);
        return 2;
    }
    struct ddpd_error err;
    struct store *s = store_open(a.db, &err);
    if (!s) {
        fprintf(stderr, "ddpd users %s: --db %s: %s\n", a.verb, a.db, err.message);
        return 1;
    }
    int rc = 1;
    char token[USER_TOKEN_HEX + 1], hash[USER_HASH_HEX + 1];
    ddpd_err e = DDPD_OK;
    if ((add || rot) && (!user_token_new(token) || !user_token_hash(token, strlen(token), hash))) {
        fprintf(stderr, "ddpd users %s: cannot make a token (libcrypto failed)\n", a.verb);
        goto out;
    }
    if (add) {
        snprintf(a.u.name, sizeof a.u.name, "%s", a.name);
        if ((e = store_user_add(s, &a.u, hash, &err)))
            goto fail;
        struct user back;
        if (store_user_get(s, a.name, &back, &err) == DDPD_OK)
            a.u = back;
        printf("added ");
        print_user(&a.u);
        rc = print_token(token);
    } else if (list) {
        struct user *l = NULL;
        size_t n = 0;
        if ((e = store_user_list(s, &l, &n, &err)))
            goto fail;
        for (size_t i = 0; i < n; i++)
            print_user(&l[i]);
        if (n == 0)
            printf("no users (the API is open on loopback, or guarded by --token-file alone)\n");
        free(l);
        rc = 0;
    } else if (rm) {
        if ((e = store_user_remove(s, a.name, &err)))
            goto fail;
        printf("removed %s: their token no longer works; their jobs keep their name as owner\n", a.name);
        rc = 0;
    } else if (rot) {
        if ((e = store_user_rotate(s, a.name, hash, &err)))
            goto fail;
        printf("rotated %s's token: the old one no longer works\n", a.name);
        rc = print_token(token);
    } else {
        struct user u;
        if ((e = store_user_get(s, a.name, &u, &err)))
            goto fail;
        apply_set(argc, argv, &a.u, &u);
        if ((e = store_user_update(s, &u, &err)))
            goto fail;
        printf("changed ");
        print_user(&u);
        rc = 0;
    }
    goto out;
fail:
    fprintf(stderr, "ddpd users %s: %s\n", a.verb, err.message);
    rc = e == DDPD_ENOTFOUND || e == DDPD_ECONFLICT ? 2 : 1;
out:
    store_close(s);
    return rc;
}
