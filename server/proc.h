/* proc.h — the server's child processes (the launchers, planner.c, super.c): starting a
 * child program, closing its pipes, and telling a process from a later one with its pid to
 * kill what an earlier server left. Clocks, files and writes are base/'s (base/clock.h,
 * base/file.h). */
#ifndef DDPD_PROC_H
#define DDPD_PROC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* How proc_spawn starts a child. */
#define PROC_FD_NULL (-1) /* /dev/null */
#define PROC_FD_SAME (-2) /* this process's own */
struct proc_spawn {
    const char *path;     /* the program, run as it is (no shell, no PATH search) */
    char *const *argv;    /* argv[0] included, NULL-terminated */
    char *const *env;     /* NAME=VALUE, NULL-terminated; NULL runs it with an empty environment
                             (never with the whole of the server's: env.h builds the allow-list) */
    int fd[3];            /* its stdin, stdout, stderr: a descriptor, PROC_FD_NULL or PROC_FD_SAME */
    pid_t pgid;           /* the process group it joins: 0 a new one it leads, -1 the server's */
    bool die_with_parent; /* SIGKILL when the server dies (PR_SET_PDEATHSIG) */
    bool hold_term;       /* SIGTERM and SIGUSR1 start blocked: one sent before the child has
                             its handler waits, pending, until the child unblocks it (a rank
                             does so once its cancel and preemption handlers are installed)
                             instead of killing it */
    int nice;             /* added to the child's niceness before it execs (0: the server's) */
};
/* Forks and execs `o`. The child starts with no signal blocked (the server blocks
 * SIGTERM in its threads) but SIGTERM and SIGUSR1 where `hold_term` says so, and no signal reaches it
 * before that (all are blocked across the fork), every signal at its default but those
 * the server ignores, SIGPIPE at its default, umask 077 (what it creates is
 * readable by this user only), and no descriptor of the server's but 0, 1 and 2; a failed exec is said on its
 * stderr and ends it with 127. The group is set on both sides of the fork, so no signal to it can miss the
 * child. Returns the pid, or -1 with errno set. */
pid_t proc_spawn(const struct proc_spawn *o);
/* Closes the open ends (>= 0) of a pipe made for a child and marks them -1. */
void proc_pipe_close(int p[2]);

/* When process `pid` started (/proc/PID/stat field 22, clock ticks after boot): with the
 * pid it names one process, not a later one that reuses the number. 0 when it is gone. */
uint64_t proc_start_time(pid_t pid);
/* Kills (SIGKILL) process `pid` and its process group (unless that is the caller's) when
 * it is still the process that started at `start_time`. True when it was. */
bool proc_kill_if_same(pid_t pid, uint64_t start_time);

#endif
