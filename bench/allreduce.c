/* allreduce.c — the C side of bench/allreduce: forks an id issuer and W ranks of the CPU
 * collective backend on this host, times in-place SUM all-reduces (start + wait, as DDP
 * issues them) of the given sizes and prints one JSON line of per-size medians. Not a
 * test: it asserts nothing but that the sums come out right. For bench/allreduce-hosts
 * (ranks on several hosts): `--issue` is the issuer alone, `--rank R ID` one rank. */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../worker/comm.h"

#define MAX_SIZES 16
#define MAX_ITERS 100000

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Parses a whole decimal number in [lo, hi]; -1 when it is not one. */
static long long parse_num(const char *s, long long lo, long long hi)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return -1;
    return v;
}

struct result {
    double median_s[MAX_SIZES];
    int ok;
};

/* One rank: join, then for each size a few warm-up rounds and `iters` timed ones. */
static int run_rank(int rank, int world, const struct comm_id *id, const long long *bytes, const int *iters,
                    int nsizes, struct result *res)
{
    struct ddpd_error err;
    struct comm *c = comm_new(&comm_cpu_ops, id, rank, world, 30.0, &err);
    if (!c) {
        fprintf(stderr, "bench_allreduce: %s\n", err.message);
        return 1;
    }
    int rc = 1;
    double *t = malloc(MAX_ITERS * sizeof *t);
    float *buf = NULL;
    for (int s = 0; s < nsizes; s++) {
        int64_t n = bytes[s] / (long long)sizeof(float);
        free(buf);
        buf = calloc((size_t)n + 1, sizeof *buf);
        if (!t || !buf)
            goto out;
        for (int k = -3; k < iters[s]; k++) {
            /* Zeros stay zeros (no overflow, no denormals over many rounds), and a small
             * integer in front sums exactly, so every round checks its result. */
            buf[0] = (float)(rank + 1);
            if (k == 0 && comm_barrier(c, &err) != DDPD_OK)
                goto fail;
            struct comm_req *req;
            double t0 = now_s();
            if (comm_allreduce_start(c, buf, n, &req, &err) != DDPD_OK || comm_wait(c, req, &err) != DDPD_OK)
                goto fail;
            if (k >= 0)
                t[k] = now_s() - t0;
            if (n > 0 && buf[0] != (float)(world * (world + 1) / 2)) {
                fprintf(stderr, "bench_allreduce: wrong sum %g\n", buf[0]);
                goto out;
            }
        }
        qsort(t, (size_t)iters[s], sizeof *t, cmp_double);
        res->median_s[s] = t[iters[s] / 2];
    }
    res->ok = 1;
    rc = 0;
    goto out;
fail:
    fprintf(stderr, "bench_allreduce: %s\n", err.message);
out:
    free(buf);
    free(t);
    comm_free(c);
    return rc;
}

/* One rank's medians as the JSON line main prints. */
static void print_results(int world, const long long *bytes, const int *iters, int nsizes,
                          const struct result *r)
{
    printf("{\"backend\":\"ddpd\",\"world\":%d,\"results\":[", world);
    for (int s = 0; s < nsizes; s++) {
        double t = r->median_s[s];
        double busbw = (double)bytes[s] * 2.0 * (world - 1) / world / t / 1e9;
        printf("%s{\"bytes\":%lld,\"iters\":%d,\"median_s\":%.9f,\"busbw_gbs\":%.4f}", s ? "," : "", bytes[s],
               iters[s], t, busbw);
    }
    printf("]}\n");
}

int main(int argc, char **argv)
{
    int world = 2, nsizes = 0, iters[MAX_SIZES], one_rank = -1;
    long long bytes[MAX_SIZES];
    const char *id_arg = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--issue") && argc == 2) {
            /* Only the id issuer (bench/allreduce-hosts runs it on the server's host):
             * the id on stdout, alive until stdin closes. */
            return comm_cpu_issue_id(stdout, 0);
        } else if (!strcmp(argv[i], "--rank") && i + 2 < argc) {
            /* --rank R ID: only rank R of the group of ID (on another host), its medians. */
            one_rank = (int)parse_num(argv[++i], 0, 63);
            id_arg = argv[++i];
            if (one_rank < 0)
                goto usage;
        } else if (!strcmp(argv[i], "--world") && i + 1 < argc) {
            world = (int)parse_num(argv[++i], 1, 64);
            if (world < 0)
                goto usage;
        } else if (!strcmp(argv[i], "--size") && i + 2 < argc && nsizes < MAX_SIZES) {
            /* --size BYTES ITERS */
            bytes[nsizes] = parse_num(argv[++i], 4, 1LL << 32);
            iters[nsizes] = (int)parse_num(argv[++i], 1, MAX_ITERS);
            if (bytes[nsizes] < 0 || iters[nsizes] < 0)
                goto usage;
            nsizes++;
        } else {
            goto usage;
        }
    }
    if (nsizes == 0) {
        bytes[0] = 8, iters[0] = 2000;
        bytes[1] = 1 << 20, iters[1] = 200;
        bytes[2] = 64 << 20, iters[2] = 10;
        nsizes = 3;
    }
    signal(SIGPIPE, SIG_IGN);
    if (one_rank >= 0) {
        struct comm_id rid;
        struct result r1 = {0};
        if (one_rank >= world || comm_id_from_hex(id_arg, &rid) != 0)
            goto usage;
        if (run_rank(one_rank, world, &rid, bytes, iters, nsizes, &r1) != 0)
            return 1;
        print_results(world, bytes, iters, nsizes, &r1);
        return 0;
    }

    /* The issuer, as the launcher runs it: id on its stdout, alive until its stdin closes. */
    int in[2], out[2];
    if (pipe(in) < 0 || pipe(out) < 0)
        return 1;
    pid_t issuer = fork();
    if (issuer == 0) {
        close(in[1]);
        close(out[0]);
        exit(comm_cpu_issue_id(fdopen(out[1], "w"), in[0]));
    }
    close(in[0]);
    close(out[1]);
    char line[600] = "";
    size_t len = 0;
    while (len < sizeof line - 1 && read(out[0], line + len, 1) == 1 && line[len] != '\n')
        len++;
    line[len] = '\0';
    close(out[0]);
    struct comm_id id;
    const char *p = strstr(line, "\"id\":\"");
    char hex[2 * COMM_ID_BYTES + 1] = "";
    if (p && strlen(p + 6) > 2 * COMM_ID_BYTES) {
        memcpy(hex, p + 6, 2 * COMM_ID_BYTES);
        hex[2 * COMM_ID_BYTES] = '\0';
    }
    if (comm_id_from_hex(hex, &id) != 0) {
        fprintf(stderr, "bench_allreduce: the issuer printed no id: '%s'\n", line);
        return 1;
    }

    struct result *res =
        mmap(NULL, (size_t)world * sizeof *res, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (res == MAP_FAILED)
        return 1;
    memset(res, 0, (size_t)world * sizeof *res);
    pid_t pids[64];
    for (int r = 0; r < world; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            close(in[1]);
            exit(run_rank(r, world, &id, bytes, iters, nsizes, &res[r]));
        }
    }
    int bad = 0;
    for (int r = 0; r < world; r++) {
        int st;
        waitpid(pids[r], &st, 0);
        bad += !WIFEXITED(st) || WEXITSTATUS(st) != 0 || !res[r].ok;
    }
    close(in[1]);
    waitpid(issuer, NULL, 0);
    if (bad)
        return 1;

    /* Rank 0's medians (the ranks finish each all-reduce within microseconds of each other). */
    print_results(world, bytes, iters, nsizes, &res[0]);
    return 0;

usage:
    fprintf(stderr, "usage: bench_allreduce [--world W] [--size BYTES ITERS]... [--rank R ID]\n"
                    "       bench_allreduce --issue\n");
    return 2;
}
