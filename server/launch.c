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
    pid_t issuer;          /* the id issuer (world_size > 1), 0 if none */
    int issuer_in;         /* its stdin: closing it ends the issuer */
    bool issuer_exited;
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
static void child_exec(const struct launch *l, char *const argv[], int in_fd, int out_fd, int log_fd)
{
    /* A blocked signal stays blocked across execv: the server blocks SIGTERM in its
     * threads (it takes it with sigwait), and a worker must still hear cancellation. */
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
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
    execv(l->o.worker, argv);
    dprintf(2, "ddpd: cannot execute %s: %s\n", l->o.worker, strerror(errno));
    _exit(127);
}

/* Starts `ddpd-worker --issue-id cpu` and reads the id it prints (one JSON line) within
 * ISSUER_DEADLINE_S. Its stdin stays open: closing it ends the rendezvous root. */
#define ISSUER_DEADLINE_S 10.0
static int start_issuer(struct launch *l, char *id_hex, size_t cap, struct ddpd_error *err)
{
    int in[2] = {-1, -1}, out[2] = {-1, -1}, log_fd = -1, rc = -1;
    char log_path[4096], line[1024];
    size_t len = 0;
    snprintf(log_path, sizeof log_path, "%s/issuer.log", l->o.out_dir);
    log_fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd < 0 || pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) {
        ddpd_error_set(err, DDPD_EIO, log_path, "cannot start the id issuer: %s", strerror(errno));
        goto out;
    }
    pid_t pid = fork();
    if (pid < 0) {
        ddpd_error_set(err, DDPD_EIO, "", "cannot fork the id issuer: %s", strerror(errno));
        goto out;
    }
    if (pid == 0) {
        char *argv[] = {(char *)l->o.worker, "--issue-id", "cpu", NULL};
        child_exec(l, argv, in[0], out[1], log_fd);
    }
    l->pgid = pid;
    setpgid(pid, pid);
    l->issuer = pid;
    close(in[0]);
    in[0] = -1;
    l->issuer_in = in[1];
    in[1] = -1;
    close(out[1]);
    out[1] = -1;

    double deadline = now_mono() + ISSUER_DEADLINE_S;
    while (!memchr(line, '\n', len)) {
        int left = (int)((deadline - now_mono()) * 1000);
        struct pollfd pfd = {.fd = out[0], .events = POLLIN};
        if (left <= 0 || poll(&pfd, 1, left) <= 0) {
            ddpd_error_set(err, DDPD_ECOMM, "", "the id issuer printed no id within %.0f s (see %s)",
                           ISSUER_DEADLINE_S, log_path);
            goto out;
        }
        ssize_t n = read(out[0], line + len, sizeof line - 1 - len);
        if (n <= 0) {
            ddpd_error_set(err, DDPD_ECOMM, "", "the id issuer exited before printing an id (see %s)",
                           log_path);
            goto out;
        }
        len += (size_t)n;
        if (len == sizeof line - 1)
            break;
    }
    line[len] = '\0';
    json_t *j = json_loads(line, JSON_DISABLE_EOF_CHECK, NULL);
    const char *hex = json_string_value(json_object_get(j, "id"));
    if (!hex || strlen(hex) >= cap) {
        json_decref(j);
        ddpd_error_set(err, DDPD_ECOMM, "", "the id issuer printed no valid id: %.200s", line);
        goto out;
    }
    snprintf(id_hex, cap, "%s", hex);
    json_decref(j);
    rc = 0;
out:
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

static int start_rank(struct launch *l, int r, const char *id_hex, struct ddpd_error *err)
{
    struct rank_proc *p = &l->ranks[r];
    int in[2] = {-1, -1}, out[2] = {-1, -1}, log_fd = -1;
    char *doc = NULL;
    int rc = -1;

    json_t *d = json_deep_copy(l->o.doc);
    json_object_set_new(d, "rank", json_integer(r));
    if (id_hex)
        json_object_set_new(d, "comm", json_pack("{s:s, s:s}", "backend", "cpu", "id", id_hex));
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
    if (pid == 0) {
        char *argv[] = {(char *)l->o.worker, NULL};
        child_exec(l, argv, in[0], out[1], log_fd);
    }
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
    l->issuer_in = -1;
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
    char id_hex[512];
    if (l->n > 1 && start_issuer(l, id_hex, sizeof id_hex, err) != 0) {
        launch_free(l);
        return NULL;
    }
    for (int r = 0; r < l->n; r++) {
        if (start_rank(l, r, l->n > 1 ? id_hex : NULL, err) != 0) {
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

static bool is_comm_failure(int st) { return WIFEXITED(st) && WEXITSTATUS(st) == 3; }

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
        if (ok || l->cancelled)
            continue;
        /* Blame the cause, not its echo: when a rank dies, its peers fail with a
         * communication error (exit 3) within milliseconds, often before the dead rank
         * is reaped. A failure of another kind outranks those. */
        if (l->failed_rank < 0 || (is_comm_failure(l->ranks[l->failed_rank].status) &&
                                   !is_comm_failure(st)))
            l->failed_rank = r;
        arm_kill(l);
    }
}

/* Every rank is gone: closing its stdin ends the issuer; it must not outlive them. */
static void stop_issuer(struct launch *l)
{
    if (l->issuer_in >= 0) {
        close(l->issuer_in);
        l->issuer_in = -1;
    }
    if (!l->issuer || l->issuer_exited)
        return;
    for (int i = 0; i < 200; i++) { /* 2 s, then SIGKILL */
        int st;
        if (waitpid(l->issuer, &st, WNOHANG) == l->issuer) {
            l->issuer_exited = true;
            return;
        }
        usleep(10000);
    }
    kill(l->issuer, SIGKILL);
    waitpid(l->issuer, NULL, 0);
    l->issuer_exited = true;
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
    /* With timeout 0 the caller has polled already: read what is there. */
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
    stop_issuer(l);
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
    if (l->issuer && !l->issuer_exited)
        kill(l->issuer, SIGKILL);
    stop_issuer(l);
    free(l->ranks);
    free(l);
}

ddpd_err launch_plan(const char *worker, json_t *doc, int world_size, double timeout_s,
                     int64_t *counts, bool *known, struct ddpd_error *err)
{
    int in[2] = {-1, -1}, out[2] = {-1, -1};
    char *text = json_dumps(doc, JSON_COMPACT), buf[EVENT_LINE_MAX * 2];
    size_t len = 0;
    ddpd_err rc = DDPD_EINTERNAL;
    pid_t pid = -1;
    *known = false;
    if (!text || pipe2(in, O_CLOEXEC) || pipe2(out, O_CLOEXEC)) {
        rc = ddpd_error_set(err, DDPD_EIO, "", "cannot run %s --plan: %s", worker, strerror(errno));
        goto out;
    }
    pid = fork();
    if (pid == 0) {
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        dup2(in[0], 0);
        dup2(out[1], 1);
        char *argv[] = {(char *)worker, "--plan", NULL};
        execv(worker, argv);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    in[0] = out[1] = -1;
    if (pid < 0) {
        rc = ddpd_error_set(err, DDPD_EIO, "", "cannot fork: %s", strerror(errno));
        goto out;
    }
    write_all(in[1], text, strlen(text));
    close(in[1]);
    in[1] = -1;
    double deadline = now_mono() + timeout_s;
    for (;;) {
        int left = (int)((deadline - now_mono()) * 1000);
        struct pollfd p = {.fd = out[0], .events = POLLIN};
        if (left <= 0 || poll(&p, 1, left) <= 0) {
            rc = ddpd_error_set(err, DDPD_EIO, "", "%s --plan did not answer within %.0f s", worker, timeout_s);
            goto out;
        }
        ssize_t n = read(out[0], buf + len, sizeof buf - 1 - len);
        if (n <= 0 || (len += (size_t)n) == sizeof buf - 1)
            break;
    }
    buf[len] = '\0';
    struct event ev;
    json_t *j = json_loads(buf, JSON_DISABLE_EOF_CHECK, NULL);
    json_t *b = json_object_get(j, "batches");
    if (json_is_array(b) && (int)json_array_size(b) == world_size) {
        for (int r = 0; r < world_size; r++)
            counts[r] = json_integer_value(json_array_get(b, (size_t)r));
        *known = true;
        rc = DDPD_OK;
    } else if (json_is_null(b)) {
        rc = DDPD_OK;
    } else if (event_decode(buf, strcspn(buf, "\n"), &ev, NULL) == DDPD_OK && ev.kind == EVENT_ERROR) {
        rc = ddpd_error_set(err, !strcmp(ev.error_kind, "data") ? DDPD_EDATA : DDPD_ESPEC, "", "%s",
                            ev.message);
    } else {
        rc = ddpd_error_set(err, DDPD_EINTERNAL, "", "%s --plan answered: %.300s", worker, buf);
    }
    json_decref(j);
out:
    if (pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
    for (int i = 0; i < 2; i++) {
        if (in[i] >= 0)
            close(in[i]);
        if (out[i] >= 0)
            close(out[i]);
    }
    free(text);
    return rc;
}

pid_t launch_pid(const struct launch *l, int rank)
{
    return rank >= 0 && rank < l->n ? l->ranks[rank].pid : 0;
}

int launch_fds(const struct launch *l, struct pollfd *fds, int cap)
{
    int n = 0;
    for (int r = 0; r < l->n && n < cap; r++)
        if (l->ranks[r].out_fd >= 0)
            fds[n++] = (struct pollfd){.fd = l->ranks[r].out_fd, .events = POLLIN};
    return n;
}

int launch_exit_code(const struct launch *l, int rank)
{
    if (rank < 0 || rank >= l->n || !l->ranks[rank].exited || !l->ranks[rank].pid)
        return -1;
    int code;
    char how[128];
    describe_exit(l->ranks[rank].status, how, sizeof how, &code);
    return code;
}
