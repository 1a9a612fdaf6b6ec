/* launch.c — fork/exec one job attempt's ranks into one process group, feed their stdin,
 * read their stdout line by line, reap them, and take the group down on the first
 * failure. No shell: execv with an argv. Knows the worker only through its program
 * path, the stdin document and the event lines (CONTRACT.md §5, §6). */
#include "launch.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../schema/event.h"

#define LINE_CAP (EVENT_LINE_MAX * 4)

struct rank_proc {
    pid_t pid;
    int out_fd;           /* stdout pipe, -1 once at EOF */
    bool exited;
    int status;           /* from waitpid */
    size_t len;           /* bytes pending in buf */
    bool overlong;        /* dropping the rest of an over-long line */
    char buf[LINE_CAP];
    char last_error[1024];
};

struct launch {
    struct launch_opts o;
    pid_t pgid;
    int n;
    struct rank_proc *ranks;
    int failed_rank;       /* first failure, -1 if none */
    double kill_at;        /* when SIGKILL follows SIGTERM; 0 = not armed */
    bool cancelled;
};

static double now_mono(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int mkdir_p(const char *path)
{
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p == '/') {
            *p = '\0';
            if (mkdir(buf, 0755) != 0 && errno != EEXIST)
                return -1;
            *p = '/';
        }
    }
    return mkdir(buf, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

static int write_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* In the child: wire stdin/stdout/stderr, join the group, exec. Never returns. */
static void child_exec(const struct launch *l, int in_fd, int out_fd, int log_fd)
{
    setpgid(0, l->pgid);
    if (l->o.die_with_parent)
        prctl(PR_SET_PDEATHSIG, SIGKILL);
    dup2(in_fd, 0);
    dup2(out_fd, 1);
    dup2(log_fd, 2);
    /* Only 0, 1, 2 cross into the worker. */
    for (int fd = 3; fd < 1024; fd++)
        close(fd);
    signal(SIGPIPE, SIG_DFL);
    char *argv[] = {(char *)l->o.worker, NULL};
    execv(l->o.worker, argv);
    dprintf(2, "ddpd: cannot execute %s: %s\n", l->o.worker, strerror(errno));
    _exit(127);
}

static int start_rank(struct launch *l, int r, struct ddpd_error *err)
{
    struct rank_proc *p = &l->ranks[r];
    int in[2] = {-1, -1}, out[2] = {-1, -1}, log_fd = -1;
    char *doc = NULL;
    int rc = -1;

    json_t *d = json_deep_copy(l->o.doc);
    json_object_set_new(d, "rank", json_integer(r));
    doc = json_dumps(d, JSON_COMPACT);
    json_decref(d);
    if (!doc) {
        ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory building rank %d's job document", r);
        goto out;
    }

    char log_path[4096];
    snprintf(log_path, sizeof log_path, "%s/rank-%d.log", l->o.out_dir, r);
    log_fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd < 0) {
        ddpd_error_set(err, DDPD_EIO, log_path, "%s: cannot open: %s", log_path, strerror(errno));
        goto out;
    }
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) {
        ddpd_error_set(err, DDPD_EIO, "", "cannot create pipes for rank %d: %s", r, strerror(errno));
        goto out;
    }
    pid_t pid = fork();
    if (pid < 0) {
        ddpd_error_set(err, DDPD_EIO, "", "cannot fork rank %d: %s", r, strerror(errno));
        goto out;
    }
    if (pid == 0)
        child_exec(l, in[0], out[1], log_fd);
    if (l->pgid == 0)
        l->pgid = pid;
    setpgid(pid, l->pgid); /* both sides call it: no race with the exec */
    p->pid = pid;
    close(in[0]);
    in[0] = -1;
    close(out[1]);
    out[1] = -1;
    /* The worker reads its whole document before anything else; a worker that died
     * first shows up as EPIPE here and as its exit status later. */
    write_all(in[1], doc, strlen(doc));
    p->out_fd = out[0];
    out[0] = -1;
    fcntl(p->out_fd, F_SETFL, fcntl(p->out_fd, F_GETFL) | O_NONBLOCK);
    rc = 0;
out:
    free(doc);
    for (int i = 0; i < 2; i++) {
        if (in[i] >= 0)
            close(in[i]);
        if (out[i] >= 0)
            close(out[i]);
    }
    if (log_fd >= 0)
        close(log_fd);
    return rc;
}

struct launch *launch_start(const struct launch_opts *o, struct ddpd_error *err)
{
    struct launch *l = calloc(1, sizeof *l);
    if (!l) {
        ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory starting a job");
        return NULL;
    }
    l->o = *o;
    if (l->o.grace_s <= 0)
        l->o.grace_s = 5;
    l->n = o->world_size;
    l->failed_rank = -1;
    l->ranks = calloc((size_t)l->n, sizeof *l->ranks);
    if (!l->ranks) {
        free(l);
        ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory starting a job");
        return NULL;
    }
    for (int r = 0; r < l->n; r++) {
        l->ranks[r].out_fd = -1;
        l->ranks[r].exited = true; /* until started */
    }
    if (mkdir_p(o->out_dir) != 0) {
        ddpd_error_set(err, DDPD_EIO, o->out_dir, "%s: cannot create: %s", o->out_dir, strerror(errno));
        launch_free(l);
        return NULL;
    }
    for (int r = 0; r < l->n; r++) {
        if (start_rank(l, r, err) != 0) {
            launch_free(l);
            return NULL;
        }
        l->ranks[r].exited = false;
    }
    return l;
}

static void signal_group(struct launch *l, int sig)
{
    if (l->pgid > 0)
        kill(-l->pgid, sig);
}

static void arm_kill(struct launch *l)
{
    if (l->kill_at == 0) {
        signal_group(l, SIGTERM);
        l->kill_at = now_mono() + l->o.grace_s;
    }
}

void launch_cancel(struct launch *l)
{
    if (!l)
        return;
    l->cancelled = true;
    arm_kill(l);
}

/* Hands complete lines to the callback; remembers each rank's last error message. */
static void deliver(struct launch *l, int r, const char *line, size_t len)
{
    struct rank_proc *p = &l->ranks[r];
    if (len == 0)
        return;
    struct event ev;
    if (len >= 16 && memcmp(line, "{\"event\":\"error\"", 16) == 0 &&
        event_decode(line, len, &ev, NULL) == DDPD_OK)
        snprintf(p->last_error, sizeof p->last_error, "%s", ev.message);
    if (l->o.on_line)
        l->o.on_line(l->o.ctx, r, line, len);
}

static void read_rank(struct launch *l, int r)
{
    struct rank_proc *p = &l->ranks[r];
    for (;;) {
        ssize_t n = read(p->out_fd, p->buf + p->len, sizeof p->buf - p->len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (n <= 0) { /* EOF or error: deliver a last unterminated line */
            if (p->len && !p->overlong)
                deliver(l, r, p->buf, p->len);
            p->len = 0;
            close(p->out_fd);
            p->out_fd = -1;
            return;
        }
        p->len += (size_t)n;
        char *start = p->buf, *end = p->buf + p->len, *nl;
        while ((nl = memchr(start, '\n', (size_t)(end - start)))) {
            if (!p->overlong)
                deliver(l, r, start, (size_t)(nl - start));
            p->overlong = false;
            start = nl + 1;
        }
        p->len = (size_t)(end - start);
        memmove(p->buf, start, p->len);
        if (p->len == sizeof p->buf) { /* no newline in LINE_CAP bytes: not an event */
            p->overlong = true;
            p->len = 0;
        }
    }
}

static void reap(struct launch *l)
{
    for (int r = 0; r < l->n; r++) {
        struct rank_proc *p = &l->ranks[r];
        if (p->exited)
            continue;
        int st;
        pid_t w = waitpid(p->pid, &st, WNOHANG);
        if (w != p->pid)
            continue;
        p->exited = true;
        p->status = st;
        bool ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
        if (!ok && l->failed_rank < 0 && !l->cancelled) {
            l->failed_rank = r;
            arm_kill(l);
        }
    }
}

bool launch_poll(struct launch *l, int timeout_ms)
{
    struct pollfd fds[l->n];
    int map[l->n], nf = 0;
    for (int r = 0; r < l->n; r++) {
        if (l->ranks[r].out_fd >= 0) {
            fds[nf].fd = l->ranks[r].out_fd;
            fds[nf].events = POLLIN;
            map[nf++] = r;
        }
    }
    /* Exits are noticed by polling waitpid; keep the wait short while any process runs. */
    int wait_ms = timeout_ms < 50 ? timeout_ms : 50;
    if (nf)
        poll(fds, (nfds_t)nf, wait_ms);
    else if (wait_ms > 0)
        usleep((useconds_t)wait_ms * 1000);
    for (int i = 0; i < nf; i++)
        if (fds[i].revents)
            read_rank(l, map[i]);
    reap(l);
    if (l->kill_at && now_mono() >= l->kill_at) {
        signal_group(l, SIGKILL);
        l->kill_at = now_mono() + 3600; /* once */
    }
    for (int r = 0; r < l->n; r++)
        if (!l->ranks[r].exited || l->ranks[r].out_fd >= 0)
            return false;
    return true;
}

static void describe_exit(int st, char *out, size_t cap, int *code)
{
    if (WIFEXITED(st)) {
        *code = WEXITSTATUS(st);
        snprintf(out, cap, "exited with code %d", *code);
    } else if (WIFSIGNALED(st)) {
        *code = 128 + WTERMSIG(st);
        snprintf(out, cap, "killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
    } else {
        *code = 1;
        snprintf(out, cap, "ended with status %d", st);
    }
}

void launch_result(const struct launch *l, struct launch_result *res)
{
    memset(res, 0, sizeof *res);
    res->ok = true;
    res->rank = -1;
    int r = l->failed_rank;
    if (r < 0) {
        /* No failure seen first-hand; a cancelled job's ranks may still have failed. */
        for (int i = 0; i < l->n && r < 0; i++)
            if (!(WIFEXITED(l->ranks[i].status) && WEXITSTATUS(l->ranks[i].status) == 0))
                r = i;
        if (r < 0)
            return;
    }
    const struct rank_proc *p = &l->ranks[r];
    char how[128];
    res->ok = false;
    res->rank = r;
    describe_exit(p->status, how, sizeof how, &res->exit_code);
    if (p->last_error[0])
        snprintf(res->message, sizeof res->message, "%s", p->last_error);
    else
        snprintf(res->message, sizeof res->message, "rank %d %s without an error event (see %s/rank-%d.log)",
                 r, how, l->o.out_dir, r);
}

pid_t launch_pgid(const struct launch *l) { return l->pgid; }

void launch_free(struct launch *l)
{
    if (!l)
        return;
    bool running = false;
    for (int r = 0; r < l->n; r++)
        running |= !l->ranks[r].exited;
    if (running) {
        signal_group(l, SIGKILL);
        for (int r = 0; r < l->n; r++)
            if (!l->ranks[r].exited)
                waitpid(l->ranks[r].pid, &l->ranks[r].status, 0);
    }
    for (int r = 0; r < l->n; r++)
        if (l->ranks[r].out_fd >= 0)
            close(l->ranks[r].out_fd);
    free(l->ranks);
    free(l);
}
