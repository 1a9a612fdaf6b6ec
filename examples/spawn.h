/* spawn.h — the examples' torch.multiprocessing.spawn: starts a rendezvous root (what
 * `ddpd-worker --issue-id cpu` runs) and `world` rank processes, gives each a joined
 * communicator, and returns 0 only if every rank's function returned 0. Header-only so
 * each example stays one file a reader can follow. */
#ifndef DDPD_EXAMPLE_SPAWN_H
#define DDPD_EXAMPLE_SPAWN_H

#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "worker/comm.h"

typedef int (*example_fn)(int rank, int world, struct comm *comm);

static int example_spawn(int world, example_fn fn)
{
    int to_root[2], from_root[2];
    if (pipe(to_root) || pipe(from_root))
        return 1;
    fflush(stdout);
    pid_t root = fork();
    if (root == 0) {
        close(to_root[1]);
        close(from_root[0]);
        FILE *out = fdopen(from_root[1], "w");
        _exit(comm_cpu_issue_id(out, to_root[0]));
    }
    close(to_root[0]);
    close(from_root[1]);
    char line[1024];
    FILE *in = fdopen(from_root[0], "r");
    if (!in || !fgets(line, sizeof line, in)) {
        fprintf(stderr, "example: the rendezvous root printed no id\n");
        return 1;
    }
    json_t *j = json_loads(line, 0, NULL);
    struct comm_id id;
    if (comm_id_from_hex(json_string_value(json_object_get(j, "id")), &id) != 0) {
        fprintf(stderr, "example: bad id line: %s", line);
        return 1;
    }
    json_decref(j);

    pid_t pids[64];
    for (int r = 0; r < world; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            struct ddpd_error err;
            struct comm *c = comm_new(&comm_cpu_ops, &id, r, world, 30.0, &err);
            if (!c) {
                fprintf(stderr, "rank %d: %s\n", r, err.message);
                _exit(3);
            }
            int rc = fn(r, world, c);
            fflush(stdout);
            comm_free(c);
            _exit(rc);
        }
    }
    int failed = 0;
    for (int r = 0; r < world; r++) {
        int st;
        waitpid(pids[r], &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "example: rank %d failed (status %d)\n", r, st);
            failed = 1;
        }
    }
    close(to_root[1]); /* ends the root */
    waitpid(root, NULL, 0);
    fclose(in);
    return failed;
}

#endif
