/* env.c — the allow-list of environment variables that cross from ddpd into the processes
 * it starts (env.h). Everything not named here stays in the server. Reads `environ`,
 * writes nothing, allocates one array. */
#include "env.h"

#include <stdlib.h>
#include <string.h>

/* Exact names. */
static const char *const names[] = {
    "PATH", /* the worker's own helpers and libraries' lookups */
    "HOME",
    "USER",
    "LOGNAME", /* who runs it, for libraries that ask */
    "LANG",
    "LANGUAGE",
    "TZ",              /* locale and time zone of log lines */
    "TMPDIR",          /* where temporary files go */
    "LD_LIBRARY_PATH", /* where CUDA, cuBLAS and NCCL live (CUDA images set it) */
};

/* Name prefixes. */
static const char *const prefixes[] = {
    "LC_",       /* locale categories */
    "OMP_",      /* OpenMP: OMP_NUM_THREADS, the CPU backend's thread count */
    "OPENBLAS_", /* OpenBLAS: OPENBLAS_NUM_THREADS, OPENBLAS_CORETYPE, ... */
    "GOTO_",     /* OpenBLAS's older names (GOTO_NUM_THREADS) */
    "MKL_",      /* MKL_NUM_THREADS, for a BLAS that reads it */
    "CUDA_",     /* CUDA_VISIBLE_DEVICES (pinned per rank by the launcher), CUDA_CACHE_* */
    "NVIDIA_",   /* the NVIDIA container runtime's NVIDIA_VISIBLE_DEVICES, ... */
    "NCCL_",     /* NCCL's tuning and debugging: NCCL_SOCKET_IFNAME, NCCL_DEBUG, ... */
    "DDPD_",     /* ddpd's own knobs (DDPD_COMM_ADDR, DDPD_COMM_SHM, test hooks); ddpd reads
                    no secret from its environment: the token comes from --token-file */
    "SLURM_",    /* the allocation a worker runs in under Slurm (job id, nodes, ...) */
    "ASAN_",     "UBSAN_", "TSAN_", "LSAN_", /* sanitizer runtimes of sanitizer builds */
};

bool env_allowed(const char *entry)
{
    size_t n = strcspn(entry, "=");
    if (entry[n] != '=' || n == 0)
        return false;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strlen(names[i]) == n && !strncmp(entry, names[i], n))
            return true;
    for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++) {
        size_t k = strlen(prefixes[i]);
        if (n > k && !strncmp(entry, prefixes[i], k))
            return true;
    }
    return false;
}

char **env_for_worker(char *const extra[])
{
    extern char **environ;
    size_t n = 0, k = 0;
    while (environ[n])
        n++;
    while (extra && extra[k])
        k++;
    char **env = malloc((n + k + 1) * sizeof *env);
    if (!env)
        return NULL;
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        bool replaced = false;
        for (size_t j = 0; j < k && !replaced; j++) {
            size_t len = strcspn(extra[j], "=") + 1;
            replaced = !strncmp(environ[i], extra[j], len);
        }
        if (!replaced && env_allowed(environ[i]))
            env[m++] = environ[i];
    }
    for (size_t j = 0; j < k; j++)
        env[m++] = extra[j];
    env[m] = NULL;
    return env;
}
