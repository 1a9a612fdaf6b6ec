/* main.c — the `ddpd` program: parses the command and hands over to its module. */
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "client.h"
#include "run.h"
#include "serve.h"
#include "users_cli.h"

static void usage(FILE *f)
{
    fputs(
        "usage: ddpd serve [options]           the job server (ddpd serve --help)\n"
        "       ddpd run [options] SPEC.json   run one job on this host (ddpd run --help)\n"
        "       ddpd users add|list|remove|rotate|set ... --db DB   the server's users (ddpd users --help)\n",
        f);
    client_usage_lines(f);
    fputs("       ddpd --version\n"
          "Client commands talk to the server at --server URL or $DDPD_SERVER (default\n"
          "http://127.0.0.1:8080) with the token of --token-file F or $DDPD_TOKEN;\n"
          "ddpd COMMAND --help tells more.\n",
          f);
}

int main(int argc, char **argv)
{
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0)
        n = (ssize_t)snprintf(self, sizeof self, "%s", argv[0]);
    self[n] = '\0';
    const char *self_dir = dirname(self);

    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "serve"))
        return serve_main(argc - 1, argv + 1, self_dir);
    if (!strcmp(argv[1], "run"))
        return run_main(argc - 1, argv + 1, self_dir);
    if (!strcmp(argv[1], "users"))
        return users_main(argc - 1, argv + 1);
    if (client_is_command(argv[1]))
        return client_main(argc - 1, argv + 1);
    if (!strcmp(argv[1], "--version")) {
        puts("ddpd 0.1.0");
        return 0;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(stdout);
        return 0;
    }
    fprintf(
        stderr,
        "ddpd: unknown command '%s'; the commands are serve, run, users, submit, jobs, queue, whoami, patch, "
        "show, watch, logs, cancel, preempt, rm, resume, checkpoints, compare, pull, generate, predict, "
        "tokenize and sweep\n",
        argv[1]);
    usage(stderr);
    return 2;
}
