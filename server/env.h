/* env.h — the environment ddpd gives the processes it starts (the ranks, the id issuer,
 * `ddpd-worker --plan` and `--devices`): an allow-list of the server's own environment, so
 * that whatever else the server was started with (cloud keys, database passwords, an
 * LD_PRELOAD) never reaches a job. The list and why each entry is on it: env.c. */
#ifndef DDPD_ENV_H
#define DDPD_ENV_H

#include <stdbool.h>

/* True when the "NAME=VALUE" entry may cross into a worker. */
bool env_allowed(const char *entry);

/* The allowed entries of this process's environment, with `extra` ("NAME=VALUE" entries,
 * NULL-terminated; may be NULL) added or replacing the same names, for execve. Built
 * before fork so the child only calls execve. Returns a new array of borrowed strings
 * (valid while the environment and `extra` are unchanged); caller frees the array; NULL
 * when out of memory. */
char **env_for_worker(char *const extra[]);

#endif
