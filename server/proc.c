/* proc.c — see proc.h. */
#include "proc.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

pid_t proc_spawn(const struct proc_spawn *o)
{
    int null_fd = -1;
    for (int i = 0; i < 3; i++)
        if (o->fd[i] == PROC_FD_NULL && null_fd < 0 && (null_fd = open("/dev/null", O_RDWR | O_CLOEXEC)) < 0)
            return -1;
    /* Every signal stays blocked across the fork, so none reaches the child before it has
     * its own mask and dispositions: a SIGTERM to its group right after the fork is held
     * for a rank (hold_term), and never runs one of the server's handlers in the child
     * (where it would be lost). The parent's mask comes back after the fork. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pid_t pid = fork();
    if (pid == 0) {
        for (int sig = 1; sig < SIGRTMAX; sig++) {
            struct sigaction sa;
            if (sigaction(sig, NULL, &sa) == 0 && sa.sa_handler != SIG_DFL && sa.sa_handler != SIG_IGN)
                signal(sig, SIG_DFL);
        }
        signal(SIGPIPE, SIG_DFL);
        sigset_t mask;
        sigemptyset(&mask);
        if (o->hold_term) {
            sigaddset(&mask, SIGTERM);
            sigaddset(&mask, SIGUSR1);
        }
        sigprocmask(SIG_SETMASK, &mask, NULL);
        if (o->pgid >= 0)
            setpgid(0, o->pgid);
        if (o->die_with_parent)
            prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (o->nice > 0 && nice(o->nice) == -1) {
            /* Not fatal: the child runs at the server's priority. */
        }
        /* What a rank writes (checkpoints, the final model) is the user's training data:
         * its own, not the host's (files 0600, folders 0700). */
        umask(077);
        for (int i = 0; i < 3; i++) {
            int fd = o->fd[i] == PROC_FD_NULL ? null_fd : o->fd[i];
            if (fd != PROC_FD_SAME && fd != i)
                dup2(fd, i);
        }
        /* Only 0, 1, 2 cross into the child (the server may hold more than 1,024). */
        if (close_range(3, ~0u, 0) != 0)
            for (long fd = 3, max = sysconf(_SC_OPEN_MAX); fd < max; fd++)
                close((int)fd);
        static char *const no_env[] = {NULL};
        execve(o->path, o->argv, o->env ? o->env : no_env);
        dprintf(2, "ddpd: cannot execute %s: %s\n", o->path, strerror(errno));
        _exit(127);
    }
    int en = errno;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (pid > 0 && o->pgid >= 0)
        setpgid(pid, o->pgid ? o->pgid : pid);
    if (null_fd >= 0)
        close(null_fd);
    errno = en;
    return pid;
}

void proc_pipe_close(int p[2])
{
    for (int i = 0; i < 2; i++) {
        if (p[i] >= 0)
            close(p[i]);
        p[i] = -1;
    }
}

uint64_t proc_start_time(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')'); /* the command name may hold spaces */
    if (!p)
        return 0;
    unsigned long long v = 0;
    int field = 2;
    char *save = NULL;
    for (char *t = strtok_r(p + 1, " ", &save); t; t = strtok_r(NULL, " ", &save))
        if (++field == 22) {
            v = strtoull(t, NULL, 10);
            break;
        }
    return v;
}

bool proc_kill_if_same(pid_t pid, uint64_t start_time)
{
    if (pid <= 0 || start_time == 0 || proc_start_time(pid) != start_time)
        return false;
    pid_t pg = getpgid(pid);
    if (pg > 1 && pg != getpgid(0))
        kill(-pg, SIGKILL);
    kill(pid, SIGKILL);
    return true;
}
