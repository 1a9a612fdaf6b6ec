/* worker.c — one `ddpd-worker --infer` process of the inference pool (pool_impl.h):
 * started with execve (proc.h) and the allow-listed environment (env.h), its lines
 * written and read with deadlines, ended and reaped. Knows the process, not the protocol:
 * pool.c speaks that. The server ignores SIGPIPE, so a worker that died shows up as a
 * failed write or an EOF, never as a signal. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../base/clock.h"
#include "../../base/file.h"
#include "../env.h"
#include "../proc.h"
#include "pool_impl.h"

ddpd_err infer__proc_start(struct infer_proc *c, const char *worker, const char *log, const char *gpu_device,
                           int nice, struct ddpd_error *err)
{
    int in[2] = {-1, -1}, out[2] = {-1, -1}, logfd = -1;
    ddpd_err rc = DDPD_OK;
    char **env = NULL;
    char cvd[128];
    if (pipe2(in, O_CLOEXEC) || pipe2(out, O_CLOEXEC)) {
        rc = ddpd_error_set(err, DDPD_EIO, "", "cannot run %s --infer: %s", worker, strerror(errno));
        goto out;
    }
    /* The previous process's log stays as LOG.1: a worker that died is explained there
     * after its slot started another. */
    char old[4200];
    if (snprintf(old, sizeof old, "%s.1", log) < (int)sizeof old)
        rename(log, old);
    logfd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0600);
    /* One BLAS thread each: the pool's processes are its concurrency (--infer-procs), and
     * training shares the cores. */
    snprintf(cvd, sizeof cvd, "CUDA_VISIBLE_DEVICES=%s", gpu_device ? gpu_device : "");
    char *extra[] = {"OPENBLAS_NUM_THREADS=1", "OMP_NUM_THREADS=1", gpu_device ? cvd : NULL, NULL};
    if (!(env = env_for_worker(extra))) {
        rc = ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory starting %s --infer", worker);
        goto out;
    }
    char *argv[] = {(char *)worker, "--infer", NULL};
    struct proc_spawn sp = {.path = worker,
                            .argv = argv,
                            .env = env,
                            .fd = {in[0], out[1], logfd >= 0 ? logfd : PROC_FD_NULL},
                            .pgid = 0,
                            .die_with_parent = true,
                            .nice = nice};
    pid_t pid = proc_spawn(&sp);
    if (pid < 0) {
        rc = ddpd_error_set(err, DDPD_EIO, "", "cannot fork %s --infer: %s", worker, strerror(errno));
        goto out;
    }
    close(in[0]);
    close(out[1]);
    *c = (struct infer_proc){.pid = pid, .in_fd = in[1], .out_fd = out[0]};
    in[0] = in[1] = out[0] = out[1] = -1;
out:
    proc_pipe_close(in);
    proc_pipe_close(out);
    if (logfd >= 0)
        close(logfd);
    free(env);
    return rc;
}

bool infer__proc_send(struct infer_proc *c, const char *line)
{
    size_t n = strlen(line);
    return c->pid > 0 && base_write_all(c->in_fd, line, n) == 0 && base_write_all(c->in_fd, "\n", 1) == 0;
}

enum infer_read infer__proc_read(struct infer_proc *c, double wait_s, size_t max, char **line)
{
    double deadline = base_mono_s() + wait_s;
    if (c->taken) { /* the line handed out last is done with */
        memmove(c->buf, c->buf + c->taken, c->len - c->taken);
        c->len -= c->taken;
        c->taken = 0;
    }
    for (;;) {
        /* A whole line read already? Hand it out; the rest stays for the next call. */
        char *nl = c->len ? memchr(c->buf, '\n', c->len) : NULL;
        if (nl) {
            *nl = '\0';
            *line = c->buf;
            c->taken = (size_t)(nl - c->buf) + 1;
            return INFER_READ_LINE;
        }
        if (c->len > max)
            return INFER_READ_TOOLONG;
        int left = (int)((deadline - base_mono_s()) * 1000);
        struct pollfd pf = {.fd = c->out_fd, .events = POLLIN};
        int pr = left > 0 ? poll(&pf, 1, left) : 0;
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr <= 0)
            return INFER_READ_NONE;
        if (c->cap - c->len < 65536) {
            size_t cap = c->cap ? 2 * c->cap : 1 << 16;
            if (cap > max + 65536)
                cap = max + 65536;
            if (cap <= c->cap)
                return INFER_READ_TOOLONG;
            char *b = realloc(c->buf, cap);
            if (!b)
                return INFER_READ_TOOLONG; /* out of memory for a line: as too long */
            c->buf = b;
            c->cap = cap;
        }
        ssize_t n = read(c->out_fd, c->buf + c->len, c->cap - c->len - 1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return INFER_READ_EOF;
        c->len += (size_t)n;
    }
}

void infer__proc_end(struct infer_proc *c, double grace_s, char *why, size_t cap)
{
    if (why && cap)
        why[0] = '\0';
    if (c->pid <= 0)
        return;
    close(c->in_fd);
    int st = 0;
    pid_t got = 0;
    for (double deadline = base_mono_s() + grace_s; (got = waitpid(c->pid, &st, WNOHANG)) == 0;) {
        if (base_mono_s() >= deadline) {
            kill(-c->pid, SIGKILL); /* its group: whatever it started goes too */
            kill(c->pid, SIGKILL);
            while ((got = waitpid(c->pid, &st, 0)) < 0 && errno == EINTR)
                ;
            break;
        }
        base_sleep_s(0.01);
    }
    close(c->out_fd);
    if (why && cap) {
        if (got != c->pid)
            snprintf(why, cap, "ended");
        else if (WIFEXITED(st))
            snprintf(why, cap, "exited with status %d", WEXITSTATUS(st));
        else if (WIFSIGNALED(st))
            snprintf(why, cap, "was killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
        else
            snprintf(why, cap, "ended");
    }
    free(c->buf);
    *c = (struct infer_proc){.pid = 0, .in_fd = -1, .out_fd = -1};
}
