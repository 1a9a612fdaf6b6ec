/* comm_group.h — what the tests of the CPU collective backend (test_comm.c,
 * test_comm_ring.c) share: the id issuer, started as the launcher starts
 * `ddpd-worker --issue-id cpu` (its stdin held open by this process, its id read from its
 * stdout), and stopped by closing that stdin; and OpenSSL made ready before the ranks are
 * forked. Header-only, for the tests of worker/comm. */
#ifndef DDPD_TEST_COMM_GROUP_H
#define DDPD_TEST_COMM_GROUP_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "worker/comm.h"
#include "worker/comm/cpu/wire.h"

/* The tests fork their ranks where the launcher execs them: libcrypto's one-time setup
 * (3 ms a process, 50-60 ms under ThreadSanitizer) is done once here and inherited, and
 * OpenSSL reseeds its generator in each child. Call before the first fork. */
static inline void comm_group_crypto_ready(void)
{
    unsigned char n[NONCE_BYTES], p[PROOF_BYTES];
    if (comm_cpu__nonce(n) == 0)
        comm_cpu__ring_proof(n, RING_CONNECTOR, 0, 1, 2, n, n, p);
}

/* The write end of the issuer's stdin, held by the test; the rank processes it forks close
 * it, so that only the test ends the issuer. */
static int issuer_stdin = -1;

struct issuer {
    pid_t pid;
    struct comm_id id;
};

static inline int issuer_start(struct issuer *is)
{
    int in[2], out[2];
    is->pid = -1;
    if (pipe(in) < 0 || pipe(out) < 0)
        return -1;
    is->pid = fork();
    if (is->pid == 0) {
        alarm(60);
        close(in[1]);
        close(out[0]);
        FILE *f = fdopen(out[1], "w");
        exit(comm_cpu_issue_id(f, in[0]));
    }
    close(in[0]);
    close(out[1]);
    issuer_stdin = in[1];
    char line[600];
    size_t n = 0;
    while (n < sizeof line - 1) {
        ssize_t k = read(out[0], line + n, 1);
        if (k <= 0 || line[n] == '\n')
            break;
        n++;
    }
    line[n] = '\0';
    close(out[0]);
    const char *p = strstr(line, "{\"id\":\"");
    char hex[2 * COMM_ID_BYTES + 1];
    if (!p || strlen(p) < 7 + 2 * COMM_ID_BYTES + 2)
        return -1;
    memcpy(hex, p + 7, 2 * COMM_ID_BYTES);
    hex[2 * COMM_ID_BYTES] = '\0';
    return comm_id_from_hex(hex, &is->id);
}

static inline int issuer_stop(struct issuer *is)
{
    if (issuer_stdin >= 0)
        close(issuer_stdin);
    issuer_stdin = -1;
    int st = 0;
    if (is->pid < 0 || waitpid(is->pid, &st, 0) < 0)
        return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

#endif
