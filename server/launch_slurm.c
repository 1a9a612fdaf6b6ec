/* launch_slurm.c — the Slurm launcher: runs one job attempt as one srun whose tasks are
 * the ranks, and turns what srun and Slurm say back into what launch.h promises: per-rank event lines, rank
 * logs, a result naming the failed rank, a pending reason. Knows Slurm only through its programs (srun,
 * squeue, scancel: execve with an argv and the allow-listed environment of env.h, never a shell) and their
 * output. Blocks nowhere: squeue and scancel run as child processes read by launch_poll. */
#include "launch_slurm.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../base/clock.h"
#include "../base/file.h"
#include "../schema/event.h"
#include "../schema/jobdir.h"
#include "cause.h"
#include "env.h"
#include "launch_impl.h"
#include "proc.h"

#define LINE_CAP          (EVENT_LINE_MAX * 4)
#define RAW_CAP           (SLURM_IO_PIECE + 64) /* one labelled piece: label, payload, newline */
#define HELPER_TIMEOUT_S  10.0
#define SCANCEL_EVERY_S   2.0
#define SLURM_KILL_WAIT_S 30.0 /* Slurm's default KillWait: TERM -> KILL of the tasks */
#define FINAL_LOOK_S      8.0  /* how long to wait for an ended job's final state in squeue */

/* ---- srun's command line ------------------------------------------------------------- */

/* Appends one formatted argument; -1 when the buffer is full. */
static int arg_add(struct slurm_argv *a, size_t *used, const char *fmt, const char *v)
{
    if (a->argc >= (int)(sizeof a->argv / sizeof a->argv[0]) - 1)
        return -1;
    int n = snprintf(a->buf + *used, sizeof a->buf - *used, fmt, v);
    if (n < 0 || (size_t)n >= sizeof a->buf - *used)
        return -1;
    a->argv[a->argc++] = a->buf + *used;
    *used += (size_t)n + 1;
    return 0;
}

static bool set(const char *s)
{
    return s && *s;
}

int slurm_nice(int priority)
{
    priority = priority < 0 ? 0 : priority > 100 ? 100 : priority;
    return (100 - priority) * 10;
}

/* Whole seconds or minutes, rounded up, at least 1 and at most `max`. */
static long long ceil_to(double v, double unit, long long max)
{
    double n = ceil(v / unit);
    return n < 1 ? 1 : n > (double)max ? max : (long long)n;
}

ddpd_err slurm_srun_argv(const struct slurm_opts *o, const char *name, int world, bool cuda,
                         const struct slurm_job *job, const char *worker, struct slurm_argv *a,
                         struct ddpd_error *err)
{
    size_t used = 0;
    char num[32];
    memset(a->argv, 0, sizeof a->argv);
    a->argc = 0;
    int bad = arg_add(a, &used, "%s", set(o->srun) ? o->srun : "srun");
    bad |= arg_add(a, &used, "--job-name=%s", name);
    snprintf(num, sizeof num, "%d", world);
    bad |= arg_add(a, &used, "--ntasks=%s", num);
    if (cuda) {
        bad |= arg_add(a, &used, "--gpus-per-task=%s", "1");
    } else {
        snprintf(num, sizeof num, "%d", o->cpus_per_task > 0 ? o->cpus_per_task : 1);
        bad |= arg_add(a, &used, "--cpus-per-task=%s", num);
    }
    /* A rank that fails takes the step down, as the local launcher does; every task reads
     * the same stdin document; every output line says which task wrote it. */
    bad |= arg_add(a, &used, "%s", "--kill-on-bad-exit=1");
    bad |= arg_add(a, &used, "%s", "--input=all");
    bad |= arg_add(a, &used, "%s", "--label");
    if (set(o->partition))
        bad |= arg_add(a, &used, "--partition=%s", o->partition);
    if (set(o->account))
        bad |= arg_add(a, &used, "--account=%s", o->account);
    if (job && job->time_limit_s > 0) { /* the job's own limit, in minutes */
        snprintf(num, sizeof num, "%lld", ceil_to(job->time_limit_s, 60, 1LL << 40));
        bad |= arg_add(a, &used, "--time=%s", num);
    } else if (set(o->time_limit)) {
        bad |= arg_add(a, &used, "--time=%s", o->time_limit);
    }
    if (job) {
        snprintf(num, sizeof num, "%d", slurm_nice(job->priority));
        bad |= arg_add(a, &used, "--nice=%s", num);
    }
    if (job && job->signal_grace_s > 0) { /* Slurm's sig_time is at most 65535 s */
        snprintf(num, sizeof num, "%lld", ceil_to(job->signal_grace_s, 1, 65535));
        bad |= arg_add(a, &used, "--signal=USR1@%s", num);
    }
    for (int i = 0; i < o->n_extra && i < SLURM_MAX_EXTRA; i++)
        bad |= arg_add(a, &used, "%s", o->extra[i]);
    bad |= arg_add(a, &used, "%s", worker);
    a->argv[a->argc] = NULL;
    if (bad)
        return ddpd_error_set(err, DDPD_ETOOBIG, "slurm",
                              "srun's command line for %s does not fit in %zu bytes (--slurm-arg, "
                              "--slurm-partition, --slurm-account, --slurm-time, the worker path)",
                              name, sizeof a->buf);
    return DDPD_OK;
}

void slurm_job_name(const struct slurm_opts *o, long long job, int attempt, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s%lld.%d", set(o->name_prefix) ? o->name_prefix : "ddpd.", job, attempt);
}

/* ---- parsers --------------------------------------------------------------------------- */

int slurm_parse_label(const char *line, size_t len, const char **payload, size_t *plen)
{
    size_t i = 0;
    while (i < len && line[i] == ' ')
        i++;
    size_t d = i;
    long rank = 0;
    while (i < len && line[i] >= '0' && line[i] <= '9' && i - d < 7)
        rank = rank * 10 + (line[i++] - '0');
    if (i == d || i >= len || line[i] != ':')
        return -1;
    i++;
    if (i < len && line[i] != ' ')
        return -1;
    if (i < len)
        i++;
    *payload = line + i;
    *plen = len - i;
    return (int)rank;
}

/* "Killed" -> SIGKILL, as srun writes strsignal()'s text; 0 when unknown. */
static int signal_by_name(const char *what, size_t n)
{
    for (int sig = 1; sig < 65; sig++) {
        const char *s = strsignal(sig);
        if (s && strlen(s) == n && strncmp(s, what, n) == 0)
            return sig;
    }
    return 0;
}

int slurm_parse_task_exit(const char *line, int world, int *codes)
{
    if (strncmp(line, "srun: error: ", 13) != 0)
        return 0;
    const char *t = strstr(line, ": task ");
    size_t skip = 7;
    if (!t) {
        t = strstr(line, ": tasks ");
        skip = 8;
    }
    if (!t)
        return 0;
    const char *list = t + skip, *colon = strchr(list, ':');
    if (!colon || colon[1] != ' ')
        return 0;
    const char *what = colon + 2;
    int code;
    if (strncmp(what, "Exited with exit code ", 22) == 0) {
        char *end;
        long v = strtol(what + 22, &end, 10);
        if (end == what + 22 || v < 0 || v > 255)
            return 0;
        code = (int)v;
    } else {
        size_t n = strcspn(what, "(\r\n");
        while (n && what[n - 1] == ' ')
            n--;
        int sig = signal_by_name(what, n);
        if (!sig)
            return 0;
        code = 128 + sig;
    }
    /* "1", "0,2", "0-3", "0-1,5" */
    int count = 0;
    const char *p = list;
    while (p < colon) {
        char *end;
        long a = strtol(p, &end, 10), b = a;
        if (end == p)
            return 0;
        p = end;
        if (*p == '-') {
            b = strtol(p + 1, &end, 10);
            if (end == p + 1)
                return 0;
            p = end;
        }
        for (long r = a; r <= b && r < world; r++)
            if (r >= 0) {
                codes[r] = code;
                count++;
            }
        if (*p == ',')
            p++;
        else if (p != colon)
            return 0;
    }
    return count;
}

/* ---- helpers: squeue and scancel as short-lived children ------------------------------------ */

struct helper {
    pid_t pid; /* 0 when none runs */
    int fd;    /* its stdout; -1 at EOF */
    char out[16384];
    size_t len;
    double deadline;
    int status;
};

/* argv[0] found on PATH before the fork (the child only calls async-signal-safe code). */
static int resolve(const char *prog, char *out, size_t cap)
{
    if (strchr(prog, '/')) {
        snprintf(out, cap, "%s", prog);
        return access(out, X_OK);
    }
    const char *path = getenv("PATH");
    if (!path || !*path)
        path = "/usr/local/bin:/usr/bin:/bin";
    for (const char *p = path; *p;) {
        size_t n = strcspn(p, ":");
        if (n && (size_t)snprintf(out, cap, "%.*s/%s", (int)n, p, prog) < cap && access(out, X_OK) == 0)
            return 0;
        p += n;
        if (*p == ':')
            p++;
    }
    snprintf(out, cap, "%s", prog);
    return -1;
}

/* Starts argv (argv[0] resolved) with stdout to out_fd, stderr to err_fd, stdin from
 * in_fd (-1: /dev/null), in process group pgid (0: its own), with the allow-listed
 * environment plus `extra` (env.h; srun hands it on to the tasks). Returns the pid or -1. */
bool slurm_programs_found(const struct slurm_opts *o, char *why, size_t cap)
{
    const char *progs[3] = {set(o->srun) ? o->srun : "srun", set(o->squeue) ? o->squeue : "squeue",
                            set(o->scancel) ? o->scancel : "scancel"};
    char path[PATH_MAX];
    for (int i = 0; i < 3; i++)
        if (resolve(progs[i], path, sizeof path) != 0) {
            snprintf(why, cap, "%s is not on PATH (%s)", progs[i], getenv("PATH") ? getenv("PATH") : "");
            return false;
        }
    return true;
}

/* Starts argv[0] (a full path) with the allow-listed environment plus `extra`; -1 for
 * in/out/err is /dev/null, pgid 0 a new group it leads. */
static pid_t spawn(char *const argv[], char *const extra[], int in_fd, int out_fd, int err_fd, pid_t pgid,
                   bool die_with_parent)
{
    char **env = env_for_worker(extra);
    struct proc_spawn sp = {.path = argv[0],
                            .argv = argv,
                            .env = env,
                            .fd = {in_fd, out_fd, err_fd},
                            .pgid = pgid,
                            .die_with_parent = die_with_parent};
    pid_t pid = proc_spawn(&sp);
    free(env);
    return pid;
}

static int helper_start(struct helper *h, const char *prog, char **args, int log_fd)
{
    char path[PATH_MAX];
    int p[2];
    resolve(prog, path, sizeof path);
    size_t n = 0;
    while (args[n])
        n++;
    char **argv = calloc(n + 2, sizeof *argv);
    if (!argv || pipe2(p, O_CLOEXEC) != 0) {
        free(argv);
        return -1;
    }
    argv[0] = path;
    memcpy(argv + 1, args, n * sizeof *argv);
    pid_t pid = spawn(argv, NULL, -1, p[1], log_fd, 0, true);
    free(argv);
    close(p[1]);
    if (pid < 0) {
        close(p[0]);
        return -1;
    }
    fcntl(p[0], F_SETFL, fcntl(p[0], F_GETFL) | O_NONBLOCK);
    h->pid = pid;
    h->fd = p[0];
    h->len = 0;
    h->deadline = base_mono_s() + HELPER_TIMEOUT_S;
    return 0;
}

/* 1 when the helper finished (output in h->out, NUL-terminated, status in h->status),
 * -1 when it ran past its deadline (killed), 0 while it runs or when none runs. */
static int helper_poll(struct helper *h)
{
    if (!h->pid)
        return 0;
    while (h->fd >= 0) {
        ssize_t n = read(h->fd, h->out + h->len, sizeof h->out - 1 - h->len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        if (n <= 0 || (h->len += (size_t)n) == sizeof h->out - 1) {
            close(h->fd);
            h->fd = -1;
        }
    }
    h->out[h->len] = '\0';
    if (h->fd < 0 && waitpid(h->pid, &h->status, WNOHANG) == h->pid) {
        h->pid = 0;
        return 1;
    }
    if (base_mono_s() > h->deadline) {
        kill(h->pid, SIGKILL);
        waitpid(h->pid, &h->status, 0);
        if (h->fd >= 0)
            close(h->fd);
        h->fd = -1;
        h->pid = 0;
        return -1;
    }
    return 0;
}

static void helper_stop(struct helper *h)
{
    if (h->pid) {
        kill(h->pid, SIGKILL);
        waitpid(h->pid, NULL, 0);
        h->pid = 0;
    }
    if (h->fd >= 0)
        close(h->fd);
    h->fd = -1;
}

/* Runs a helper to its end (at most timeout_s); its output in h->out. */
static int helper_run(struct helper *h, const char *prog, char **args, double timeout_s)
{
    if (helper_start(h, prog, args, -1) != 0)
        return -1;
    h->deadline = base_mono_s() + timeout_s;
    for (;;) {
        int rc = helper_poll(h);
        if (rc)
            return rc > 0 && WIFEXITED(h->status) && WEXITSTATUS(h->status) == 0 ? 0 : -1;
        struct pollfd p = {.fd = h->fd, .events = POLLIN};
        if (h->fd >= 0)
            poll(&p, 1, 20);
        else
            usleep(5000);
    }
}

void slurm_cancel_orphans(const struct slurm_opts *o, double timeout_s)
{
    struct helper h = {.fd = -1};
    char fmt[] = "--format=%i|%j", nohdr[] = "--noheader", user[40];
    snprintf(user, sizeof user, "--user=%u", (unsigned)getuid());
    char *qargs[] = {nohdr, user, fmt, NULL};
    const char *prefix = set(o->name_prefix) ? o->name_prefix : "ddpd.";
    if (helper_run(&h, set(o->squeue) ? o->squeue : "squeue", qargs, timeout_s) != 0) {
        fprintf(stderr,
                "ddpd: squeue did not answer: Slurm jobs named %s* of an earlier server may still run\n",
                prefix);
        return;
    }
    char ids[256][24], *args[257], *save = NULL;
    int n = 0;
    for (char *line = strtok_r(h.out, "\n", &save); line && n < 256; line = strtok_r(NULL, "\n", &save)) {
        char *bar = strchr(line, '|');
        if (!bar || strncmp(bar + 1, prefix, strlen(prefix)) != 0)
            continue;
        *bar = '\0';
        snprintf(ids[n], sizeof ids[n], "%s", line);
        args[n] = ids[n];
        n++;
    }
    if (!n)
        return;
    args[n] = NULL;
    struct helper c = {.fd = -1};
    if (helper_run(&c, set(o->scancel) ? o->scancel : "scancel", args, timeout_s) != 0)
        fprintf(stderr, "ddpd: scancel of %d Slurm job%s named %s* failed\n", n, n == 1 ? "" : "s", prefix);
    else
        fprintf(stderr, "ddpd: cancelled %d Slurm job%s (%s*) left by an earlier server\n", n,
                n == 1 ? "" : "s", prefix);
}

/* ---- one attempt ------------------------------------------------------------------------------ */

struct rank_out {
    char *buf; /* the line being reassembled from pieces (LINE_CAP), lazily */
    size_t len;
    bool overlong;
    int log_fd; /* OUT/rank-R.log, lazily; -1 until then */
    int code;   /* exit code as srun reported it, -1 unknown */
};

struct raw {
    int fd;
    size_t len;
    char buf[RAW_CAP];
};

struct slurm_run {
    struct launch_opts o;
    struct slurm_opts so;
    char name[256];
    char srun_path[PATH_MAX];
    pid_t pid;
    int status;
    bool exited;
    struct raw out, err;
    int srun_log;
    int n;
    struct rank_out *ranks;
    struct cause_rank *ends; /* each rank's reported end and last error event (cause.h) */
    int reports;
    long long jobid;                /* 0 until known */
    bool allocated;                 /* Slurm started the tasks */
    char reason[256];               /* squeue's pending reason */
    char slurm_end[512];            /* Slurm's "*** JOB 7 ON n1 CANCELLED AT ... DUE TO TIME LIMIT ***" */
    char final[192];                /* the ended job's state and reason from squeue ("TIMEOUT (TimeLimit)") */
    char node_failure[256];         /* "srun: error: Node failure on n3": srun may still exit 0 */
    char srun_error[512];           /* srun's last own error line */
    struct helper q, c;             /* squeue, scancel */
    bool settled;                   /* the last look at the ended Slurm job found a final state */
    double final_until, final_next; /* looking again while it is still COMPLETING */
    double next_query, next_scancel, kill_at;
    bool cancelled, killed;
    bool preempt, preempt_sent; /* a preemption asked for; SIGUSR1 sent to srun */
    /* Slurm's time limit of the step (seconds; 0 unknown) and the signal's lead before it,
     * and when the tasks started (monotonic; 0 before): ranks that stop at a checkpoint
     * on Slurm's signal near the limit have reached the time limit, not a preemption. */
    double limit_s, grace_s, alloc_at;
};

static void mark_allocated(struct slurm_run *r)
{
    if (!r->allocated)
        r->alloc_at = base_mono_s();
    r->allocated = true;
}

/* Slurm's time format (--time): "M", "M:S", "H:M:S", "D-H", "D-H:M", "D-H:M:S"; seconds,
 * or 0 when it is none of them ("UNLIMITED", "infinite", empty). */
double slurm_time_s(const char *v)
{
    if (!v || !*v || strspn(v, "0123456789:-") != strlen(v))
        return 0;
    long d = 0, a = 0, b = 0, c = 0;
    if (strchr(v, '-')) {
        int k = sscanf(v, "%ld-%ld:%ld:%ld", &d, &a, &b, &c);
        return k < 2 ? 0 : (double)d * 86400 + (double)a * 3600 + (double)b * 60 + (double)c;
    }
    int k = sscanf(v, "%ld:%ld:%ld", &a, &b, &c);
    return k == 1   ? (double)a * 60
           : k == 2 ? (double)a * 60 + (double)b
           : k == 3 ? (double)a * 3600 + (double)b * 60 + (double)c
                    : 0;
}

static void log_line(int fd, const char *line, size_t len, bool newline)
{
    if (fd < 0)
        return;
    base_write_all(fd, line, len);
    if (newline)
        base_write_all(fd, "\n", 1);
}

static int rank_log(struct slurm_run *r, int rank)
{
    struct rank_out *ro = &r->ranks[rank];
    if (ro->log_fd < 0) {
        char path[PATH_MAX];
        jobdir_rank_log_path(path, sizeof path, r->o.out_dir, rank);
        ro->log_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    }
    return ro->log_fd;
}

/* Remembers why Slurm ended the job: "*** JOB 7 ON n1 CANCELLED AT ... DUE TO TIME LIMIT ***". */
static void note_slurm_end(struct slurm_run *r, const char *line, size_t len)
{
    char tmp[512];
    snprintf(tmp, sizeof tmp, "%.*s", (int)(len < sizeof tmp - 1 ? len : sizeof tmp - 1), line);
    char *a = strstr(tmp, "*** "), *b = a ? strstr(a + 4, " ***") : NULL;
    if (!a || !b || !strstr(a, " CANCELLED AT "))
        return;
    *b = '\0';
    /* Only a reason beats a plain cancellation (a step cancelled because a rank failed). */
    if (strstr(a, " DUE TO ") || !r->slurm_end[0])
        snprintf(r->slurm_end, sizeof r->slurm_end, "%s", a + 4);
}

static void stdout_piece(struct slurm_run *r, const char *line, size_t len)
{
    const char *p;
    size_t n;
    int rank = slurm_parse_label(line, len, &p, &n);
    if (rank < 0 || rank >= r->n) {
        log_line(r->srun_log, line, len, true);
        return;
    }
    mark_allocated(r);
    struct rank_out *ro = &r->ranks[rank];
    if (!ro->buf && !(ro->buf = malloc(LINE_CAP)))
        return;
    if (ro->overlong || ro->len + n > LINE_CAP) {
        ro->overlong = true;
        ro->len = 0;
    } else {
        memcpy(ro->buf + ro->len, p, n);
        ro->len += n;
    }
    if (n == SLURM_IO_PIECE) /* the line goes on in this rank's next piece */
        return;
    if (!ro->overlong)
        launch__deliver(&r->o, rank, ro->buf, ro->len, &r->ends[rank]);
    ro->overlong = false;
    ro->len = 0;
}

/* A rank's end as srun reported it, for cause_pick: exit 3 lost a peer; SIGTERM is how
 * Slurm stops the other tasks of a step after one failed (--kill-on-bad-exit) or is
 * cancelled; anything else (an exit code, SIGKILL from the out-of-memory killer) is the
 * rank's own. Tasks reported on one line share its order. */
static void note_end(struct cause_rank *e, int code, int order)
{
    e->preempted = code == RANK_EXIT_PREEMPTED; /* at its checkpoint: no failure */
    e->failed = code > 0 && !e->preempted;
    e->exit = code == 3 ? CAUSE_EXIT_LOST_PEER : code == 128 + SIGTERM ? CAUSE_EXIT_STOPPED : CAUSE_EXIT_OWN;
    e->order = order;
    e->ended_at = base_wall_s();
}

static void stderr_line(struct slurm_run *r, const char *line, size_t len)
{
    const char *p;
    size_t n;
    int rank = slurm_parse_label(line, len, &p, &n);
    if (rank >= 0 && rank < r->n) {
        mark_allocated(r);
        log_line(rank_log(r, rank), p, n, n != SLURM_IO_PIECE);
        note_slurm_end(r, p, n);
        return;
    }
    log_line(r->srun_log, line, len, true);
    char tmp[1024];
    snprintf(tmp, sizeof tmp, "%.*s", (int)(len < sizeof tmp - 1 ? len : sizeof tmp - 1), line);
    int codes_before = r->reports;
    int *codes = malloc((size_t)r->n * sizeof *codes);
    if (codes) {
        for (int i = 0; i < r->n; i++)
            codes[i] = -1;
        if (slurm_parse_task_exit(tmp, r->n, codes) > 0) {
            r->reports++;
            for (int i = 0; i < r->n; i++)
                if (codes[i] >= 0 && r->ranks[i].code < 0) {
                    r->ranks[i].code = codes[i];
                    note_end(&r->ends[i], codes[i], r->reports);
                }
        }
        free(codes);
    }
    long long id;
    int end = 0; /* %n: the whole line matched, not only up to the number (sscanf's count) */
    if (sscanf(tmp, "srun: job %lld queued and waiting for resources%n", &id, &end) == 1 && end > 0) {
        r->jobid = id;
    } else if ((end = 0, sscanf(tmp, "srun: job %lld has been allocated resources%n", &id, &end)) == 1 &&
               end > 0) {
        r->jobid = id;
        mark_allocated(r);
    } else if (strncmp(tmp, "srun: error: Node failure on ", 29) == 0) {
        snprintf(r->node_failure, sizeof r->node_failure, "%.200s", tmp + 13);
    } else if (strstr(tmp, "*** ")) {
        note_slurm_end(r, tmp, strlen(tmp));
    } else if (codes_before == r->reports && strncmp(tmp, "srun: error: ", 13) == 0) {
        snprintf(r->srun_error, sizeof r->srun_error, "%.500s", tmp);
    }
}

/* Reads a pipe of srun's and hands over its complete lines. */
static void read_raw(struct slurm_run *r, struct raw *w, void (*fn)(struct slurm_run *, const char *, size_t))
{
    while (w->fd >= 0) {
        ssize_t n = read(w->fd, w->buf + w->len, sizeof w->buf - w->len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (n <= 0) {
            if (w->len)
                fn(r, w->buf, w->len);
            w->len = 0;
            close(w->fd);
            w->fd = -1;
            return;
        }
        w->len += (size_t)n;
        char *start = w->buf, *end = w->buf + w->len, *nl;
        while ((nl = memchr(start, '\n', (size_t)(end - start)))) {
            fn(r, start, (size_t)(nl - start));
            start = nl + 1;
        }
        w->len = (size_t)(end - start);
        memmove(w->buf, start, w->len);
        if (w->len == sizeof w->buf) { /* longer than any labelled piece: not srun's framing */
            fn(r, w->buf, w->len);
            w->len = 0;
        }
    }
}

struct slurm_run *slurm_run_start(const struct slurm_opts *so, const char *name, const struct launch_opts *lo,
                                  const char *doc, pid_t pgid, struct ddpd_error *err)
{
    struct slurm_run *r = calloc(1, sizeof *r);
    struct slurm_argv *a = calloc(1, sizeof *a);
    int in_fd = -1, out[2] = {-1, -1}, errp[2] = {-1, -1};
    if (!r || !a || !(r->ranks = calloc((size_t)lo->world_size, sizeof *r->ranks)) ||
        !(r->ends = calloc((size_t)lo->world_size, sizeof *r->ends))) {
        ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory starting Slurm job %s", name);
        goto fail;
    }
    r->o = *lo;
    r->o.doc = NULL; /* borrowed for this call only */
    r->so = *so;
    if (r->so.poll_s <= 0)
        r->so.poll_s = 2;
    r->n = lo->world_size;
    r->out.fd = r->err.fd = r->srun_log = -1;
    r->q.fd = r->c.fd = -1;
    snprintf(r->name, sizeof r->name, "%s", name);
    for (int i = 0; i < r->n; i++) {
        r->ranks[i].log_fd = -1;
        r->ranks[i].code = -1;
    }
    char path[PATH_MAX];
    jobdir_file_path(path, sizeof path, lo->out_dir, JOBDIR_SRUN_LOG);
    r->srun_log = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    /* The document goes through a file: srun reads its stdin whenever the tasks start
     * (perhaps hours later), and the supervisor must not wait on a pipe for that. */
    jobdir_file_path(path, sizeof path, lo->out_dir, JOBDIR_SRUN_STDIN);
    int wfd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (wfd < 0 || base_write_all(wfd, doc, strlen(doc)) != 0 || close(wfd) != 0 ||
        (in_fd = open(path, O_RDONLY | O_CLOEXEC)) < 0) {
        ddpd_error_set(err, DDPD_EIO, path, "Slurm job %s: cannot write its stdin document %s: %s", r->name,
                       path, strerror(errno));
        goto fail;
    }
    struct slurm_job job = {0}, *jp = NULL;
    if (lo->doc) {
        const struct spec *sp = &lo->doc->spec;
        job.priority = sp->priority;
        job.time_limit_s = sp->time_limit;
        job.signal_grace_s = sp->preempt_grace > 0     ? sp->preempt_grace
                             : lo->preempt_grace_s > 0 ? lo->preempt_grace_s
                                                       : LAUNCH_PREEMPT_GRACE_S;
        jp = &job;
    }
    r->grace_s = jp ? job.signal_grace_s : 0;
    r->limit_s = job.time_limit_s > 0 ? ceil(job.time_limit_s / 60) * 60 : slurm_time_s(r->so.time_limit);
    if (slurm_srun_argv(&r->so, r->name, r->n, lo->cuda, jp, lo->worker, a, err) != DDPD_OK)
        goto fail;
    if (resolve(a->argv[0], r->srun_path, sizeof r->srun_path) != 0) {
        ddpd_error_set(err, DDPD_EIO, "slurm", "Slurm job %s: cannot execute %s: not found on PATH", r->name,
                       a->argv[0]);
        goto fail;
    }
    a->argv[0] = r->srun_path;
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(errp, O_CLOEXEC) != 0) {
        ddpd_error_set(err, DDPD_EIO, "", "Slurm job %s: cannot create pipes: %s", r->name, strerror(errno));
        goto fail;
    }
    /* NCCL's own output goes to a file per task (%h host, %p pid), never into the events. */
    char nccl_log[PATH_MAX + 32], *extra[] = {nccl_log, NULL};
    snprintf(nccl_log, sizeof nccl_log, "NCCL_DEBUG_FILE=%s/rank.%%h.%%p.nccl.log", lo->out_dir);
    r->pid = spawn(a->argv, extra, in_fd, out[1], errp[1], pgid, lo->die_with_parent);
    if (r->pid < 0) {
        ddpd_error_set(err, DDPD_EIO, "", "Slurm job %s: cannot fork srun: %s", r->name, strerror(errno));
        goto fail;
    }
    close(out[1]);
    close(errp[1]);
    close(in_fd);
    r->out.fd = out[0];
    r->err.fd = errp[0];
    fcntl(r->out.fd, F_SETFL, fcntl(r->out.fd, F_GETFL) | O_NONBLOCK);
    fcntl(r->err.fd, F_SETFL, fcntl(r->err.fd, F_GETFL) | O_NONBLOCK);
    r->next_query = base_mono_s() + 0.2; /* a job that starts at once never looks pending long */
    free(a);
    return r;
fail:
    proc_pipe_close(out);
    proc_pipe_close(errp);
    if (in_fd >= 0)
        close(in_fd);
    free(a);
    slurm_run_free(r);
    return NULL;
}

/* Every task srun reported ended 0 or at a preemption's checkpoint (exit 6), at least
 * one of them the latter, and Slurm ended nothing itself: srun exits 6 then. */
static bool run_preempted(const struct slurm_run *r)
{
    return WIFEXITED(r->status) && WEXITSTATUS(r->status) == RANK_EXIT_PREEMPTED &&
           cause_preempted(r->ends, r->n) && !r->node_failure[0] && !strstr(r->slurm_end, " DUE TO ");
}

/* The ranks stopped on Slurm's signal near the step's time limit: it ran at least the
 * limit less the signal's lead less Slurm's slack (its signal may come up to 60 s early,
 * and it looks at limits every 30 s or so). */
static bool at_time_limit(const struct slurm_run *r)
{
    return r->limit_s > 0 && r->alloc_at > 0 && base_mono_s() - r->alloc_at >= r->limit_s - r->grace_s - 90;
}

/* srun's exit code is not the whole story: after a node failure it may exit 0. */
static bool run_failed(const struct slurm_run *r)
{
    if (run_preempted(r))
        return false;
    return !(WIFEXITED(r->status) && WEXITSTATUS(r->status) == 0) || r->node_failure[0] ||
           strstr(r->slurm_end, " DUE TO ");
}

/* squeue's answer "ID|STATE|REASON" for our job name. */
static void took_query(struct slurm_run *r)
{
    char *save = NULL, *line = strtok_r(r->q.out, "\n", &save);
    char *st = line ? strchr(line, '|') : NULL, *why = st ? strchr(st + 1, '|') : NULL;
    if (!st || !why) {
        r->settled |= r->exited; /* Slurm no longer knows it: nothing more to learn */
        return;
    }
    *st++ = '\0';
    *why++ = '\0';
    long long id = strtoll(line, NULL, 10);
    if (id > 0)
        r->jobid = id;
    if (r->exited) { /* the final look: how Slurm ended it (TIMEOUT, NODE_FAIL, ...) */
        r->settled = strcmp(st, "COMPLETING") && strcmp(st, "RUNNING") && strcmp(st, "CONFIGURING") &&
                     strcmp(st, "PENDING") && strcmp(st, "SUSPENDED");
        if (!r->settled || (strcmp(st, "COMPLETED") && strcmp(st, "FAILED") && strcmp(st, "CANCELLED")))
            snprintf(r->final, sizeof r->final, "%.40s (%.140s)", st, why);
        else
            r->final[0] = '\0';
        return;
    }
    if (strcmp(st, "PENDING") == 0)
        snprintf(r->reason, sizeof r->reason, "%s", why);
    else
        mark_allocated(r);
}

static void scancel_now(struct slurm_run *r)
{
    char name[300], id[32], user[40];
    char *args[3] = {NULL, NULL, NULL};
    snprintf(name, sizeof name, "--name=%s", r->name);
    snprintf(id, sizeof id, "%lld", r->jobid);
    snprintf(user, sizeof user, "--user=%u", (unsigned)getuid());
    args[0] = r->jobid ? id : user;
    args[1] = r->jobid ? NULL : name;
    helper_start(&r->c, set(r->so.scancel) ? r->so.scancel : "scancel", args, r->srun_log);
}

bool slurm_run_poll(struct slurm_run *r, int timeout_ms)
{
    struct pollfd fds[4];
    int nf = slurm_run_fds(r, fds, 4);
    int wait_ms = timeout_ms < 50 ? timeout_ms : 50;
    if (nf)
        poll(fds, (nfds_t)nf, wait_ms);
    else if (wait_ms > 0)
        usleep((useconds_t)wait_ms * 1000);
    read_raw(r, &r->out, stdout_piece);
    read_raw(r, &r->err, stderr_line);
    if (!r->exited && waitpid(r->pid, &r->status, WNOHANG) == r->pid)
        r->exited = true;
    int qr = helper_poll(&r->q);
    if (qr > 0 && WIFEXITED(r->q.status) && WEXITSTATUS(r->q.status) == 0)
        took_query(r);
    else if (qr != 0 && r->exited) /* squeue failed: no final state to wait for */
        r->settled = true;
    helper_poll(&r->c);
    double now = base_mono_s();
    if (!r->exited && !r->allocated && !r->q.pid && now >= r->next_query) {
        char name[300], fmt[] = "--format=%i|%T|%r", nohdr[] = "--noheader";
        snprintf(name, sizeof name, "--name=%s", r->name);
        char *args[] = {nohdr, name, fmt, NULL};
        helper_start(&r->q, set(r->so.squeue) ? r->so.squeue : "squeue", args, r->srun_log);
        r->next_query = now + r->so.poll_s;
    }
    if (r->preempt && !r->preempt_sent && r->allocated && !r->exited) {
        /* srun forwards the signals it gets to every task (srun(1), "Signals"). */
        kill(r->pid, SIGUSR1);
        r->preempt_sent = true;
    }
    if (r->cancelled && !r->exited) {
        if (!r->c.pid && now >= r->next_scancel) {
            scancel_now(r);
            r->next_scancel = now + SCANCEL_EVERY_S;
        }
        if (!r->killed && now >= r->kill_at) {
            kill(r->pid, SIGKILL);
            r->killed = true;
        }
    }
    if (!r->exited || r->out.fd >= 0 || r->err.fd >= 0)
        return false;
    /* srun failed on its own (not cancelled by us): ask Slurm how the job ended. */
    if (!run_failed(r) || r->cancelled)
        return r->q.pid == 0;
    if (r->final_until == 0)
        r->final_until = now + FINAL_LOOK_S;
    if (!r->settled && !r->q.pid && now < r->final_until && now >= r->final_next) {
        char name[300], fmt[] = "--format=%i|%T|%r", nohdr[] = "--noheader", all[] = "--states=all";
        snprintf(name, sizeof name, "--name=%s", r->name);
        char *args[] = {nohdr, all, name, fmt, NULL};
        helper_start(&r->q, set(r->so.squeue) ? r->so.squeue : "squeue", args, r->srun_log);
        r->final_next = now + 0.5;
    }
    return r->q.pid == 0 && (r->settled || now >= r->final_until);
}

int slurm_run_fds(const struct slurm_run *r, struct pollfd *fds, int cap)
{
    int n = 0;
    const int all[4] = {r->out.fd, r->err.fd, r->q.fd, r->c.fd};
    for (int i = 0; i < 4 && n < cap; i++)
        if (all[i] >= 0)
            fds[n++] = (struct pollfd){.fd = all[i], .events = POLLIN};
    return n;
}

void slurm_run_cancel(struct slurm_run *r)
{
    if (!r || r->cancelled)
        return;
    r->cancelled = true;
    r->next_scancel = 0;
    r->kill_at = base_mono_s() + (r->o.grace_s > 0 ? r->o.grace_s : 5) + SLURM_KILL_WAIT_S;
}

void slurm_run_preempt(struct slurm_run *r)
{
    if (!r || r->exited)
        return;
    r->preempt = true;
    if (r->allocated && !r->preempt_sent) {
        kill(r->pid, SIGUSR1);
        r->preempt_sent = true;
    }
}

bool slurm_run_waiting(const struct slurm_run *r, char *why, size_t cap)
{
    if (r->allocated || r->exited)
        return false;
    if (r->jobid && r->reason[0])
        snprintf(why, cap, "Slurm job %lld (%s) is pending: %s", r->jobid, r->name, r->reason);
    else
        snprintf(why, cap, "submitted to Slurm as %s", r->name);
    return true;
}

void slurm_run_result(const struct slurm_run *r, struct launch_result *res)
{
    memset(res, 0, sizeof *res);
    res->rank = -1;
    if (r->exited && run_preempted(r) && at_time_limit(r)) {
        /* Slurm's signal came before its time limit, not a preemption: the attempt ends
         * here (requeued, it would only reach the same limit again). */
        res->exit_code = RANK_EXIT_PREEMPTED;
        snprintf(
            res->message, sizeof res->message,
            "time limit: Slurm job %.200s (Slurm job %lld) reached its time limit of %.0f s (--time; Slurm's "
            "signal came %.0f s before it): every rank stopped at its checkpoint, so resuming the job "
            "(ddpd resume) goes on from there",
            r->name, r->jobid, r->limit_s, r->grace_s);
        return;
    }
    if (r->exited && run_preempted(r)) {
        res->preempted = true;
        res->exit_code = RANK_EXIT_PREEMPTED;
        snprintf(res->message, sizeof res->message,
                 "preempted: every rank of Slurm job %.200s (Slurm job %lld) stopped at its checkpoint (exit "
                 "code %d)",
                 r->name, r->jobid, RANK_EXIT_PREEMPTED);
        return;
    }
    res->ok = r->exited && !run_failed(r);
    if (res->ok)
        return;
    char how[160], tail[600] = "";
    if (r->slurm_end[0])
        snprintf(tail, sizeof tail, " (Slurm: %s)", r->slurm_end);
    int rank = cause_pick(r->ends, r->n); /* whose failure explains the others' */
    if (strstr(r->slurm_end, " DUE TO ") || r->final[0] || r->node_failure[0]) {
        /* Slurm ended it (time limit, node failure, preemption): that is the cause, and the
         * ranks' exits are its echo. */
        res->exit_code = rank >= 0 ? r->ranks[rank].code : 1;
        snprintf(res->message, sizeof res->message,
                 "Slurm ended job %.200s (Slurm job %lld)%s%.150s%s%.300s%s%.200s", r->name, r->jobid,
                 r->final[0] ? ": " : "", r->final, r->slurm_end[0] ? ": " : "", r->slurm_end,
                 r->node_failure[0] ? ": " : "", r->node_failure);
        return;
    }
    if (rank >= 0) {
        const struct rank_out *ro = &r->ranks[rank];
        const struct cause_rank *e = &r->ends[rank];
        res->rank = rank;
        res->exit_code = cause_exit_code(e, ro->code);
        if (ro->code > 128)
            snprintf(how, sizeof how, "was killed by signal %d (%s)", ro->code - 128,
                     strsignal(ro->code - 128));
        else
            snprintf(how, sizeof how, "exited with code %d", ro->code);
        if (e->has_error)
            snprintf(res->message, sizeof res->message, "%s%s", e->message, tail);
        else {
            char logp[PATH_MAX];
            jobdir_rank_log_path(logp, sizeof logp, r->o.out_dir, rank);
            snprintf(res->message, sizeof res->message, "rank %d %s without an error event (see %.600s)%s",
                     rank, how, logp, tail);
        }
        return;
    }
    /* No task failed: srun itself did (no allocation, a bad option, killed). */
    if (WIFEXITED(r->status))
        res->exit_code = WEXITSTATUS(r->status);
    else
        res->exit_code = WIFSIGNALED(r->status) ? 128 + WTERMSIG(r->status) : 1;
    snprintf(res->message, sizeof res->message,
             "srun for Slurm job %s ended with code %d%s%s%s (see %s/srun.log)", r->name, res->exit_code,
             r->srun_error[0] ? ": " : "", r->srun_error, tail, r->o.out_dir);
}

int slurm_run_exit_code(const struct slurm_run *r, int rank)
{
    if (rank < 0 || rank >= r->n || !r->exited)
        return -1;
    if (r->ranks[rank].code >= 0)
        return r->ranks[rank].code;
    return run_failed(r) ? -1 : 0;
}

pid_t slurm_run_pid(const struct slurm_run *r)
{
    return r ? r->pid : 0;
}

void slurm_run_free(struct slurm_run *r)
{
    if (!r)
        return;
    if (r->pid > 0 && !r->exited) {
        /* The server is going away with the job still in Slurm: cancel it there, then
         * end srun. */
        helper_stop(&r->c);
        scancel_now(r);
        double until = base_mono_s() + HELPER_TIMEOUT_S;
        while (r->c.pid && base_mono_s() < until && !helper_poll(&r->c))
            usleep(10000);
        helper_stop(&r->c);
        kill(r->pid, SIGKILL);
        waitpid(r->pid, &r->status, 0);
        r->exited = true;
    }
    helper_stop(&r->q);
    helper_stop(&r->c);
    if (r->out.fd >= 0)
        close(r->out.fd);
    if (r->err.fd >= 0)
        close(r->err.fd);
    if (r->srun_log >= 0)
        close(r->srun_log);
    for (int i = 0; r->ranks && i < r->n; i++) {
        if (r->ranks[i].log_fd >= 0)
            close(r->ranks[i].log_fd);
        free(r->ranks[i].buf);
    }
    free(r->ranks);
    free(r->ends);
    free(r);
}

/* ---- the launcher table ------------------------------------------------------------------- */

/* One document for every task (no rank: each takes SLURM_PROCID). */
static void *run_start(void *ctx, const struct launch_opts *o, struct jobdoc *doc, pid_t *pgid,
                       struct ddpd_error *err)
{
    const struct slurm_opts *so = ctx;
    char name[256];
    slurm_job_name(so, (long long)o->job, o->attempt, name, sizeof name);
    json_t *j = jobdoc_to_json(doc); /* rank -1: left out */
    char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!text) {
        ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory building Slurm job %s's document", name);
        return NULL;
    }
    struct slurm_run *r = slurm_run_start(so, name, o, text, *pgid, err);
    free(text);
    if (r && *pgid == 0)
        *pgid = slurm_run_pid(r);
    return r;
}

static bool run_poll(void *run, int timeout_ms)
{
    return slurm_run_poll(run, timeout_ms);
}
static int run_fds(const void *run, struct pollfd *fds, int cap)
{
    return slurm_run_fds(run, fds, cap);
}
static void run_cancel(void *run)
{
    slurm_run_cancel(run);
} /* scancel: Slurm signals the tasks */
static void run_preempt(void *run)
{
    slurm_run_preempt(run);
}
static void run_result(const void *run, struct launch_result *res)
{
    slurm_run_result(run, res);
}
static int run_exit_code(const void *run, int rank)
{
    return slurm_run_exit_code(run, rank);
}
static bool run_waiting(const void *run, char *why, size_t cap)
{
    return slurm_run_waiting(run, why, cap);
}
static void run_free(void *run)
{
    slurm_run_free(run);
}

/* Slurm says whether a job fits, as a pending reason. */
static bool policy_fits(void *ctx, const struct sched *s, device_kind kind, int world, char *why, size_t cap)
{
    (void)ctx, (void)s, (void)kind, (void)world, (void)why, (void)cap;
    return true;
}

/* Slurm's reasons are stored as squeue tells them. */
static bool policy_pending_reason(void *ctx, const struct sched *s, int64_t job, char *buf, size_t cap)
{
    (void)ctx, (void)s, (void)job, (void)buf, (void)cap;
    return false;
}

/* Slurm holds the devices: `squeue`, `sinfo`. */
static json_t *policy_devices_json(void *ctx, const struct sched *s)
{
    (void)ctx, (void)s;
    json_t *out = json_object();
    json_object_set_new(out, "gpus", json_array());
    json_object_set_new(out, "cpu_slots", json_array());
    json_object_set_new(out, "launcher", json_string("slurm"));
    return out;
}

/* An earlier server's sruns died with it; their Slurm jobs may still run. */
static void policy_recover_orphans(void *ctx, const struct launch_orphan *o, size_t n)
{
    (void)o, (void)n;
    slurm_cancel_orphans(ctx, 10);
}

static const struct launch_ops slurm_ops = {
    .name = "slurm",
    .queues = true,
    .start = run_start,
    .poll = run_poll,
    .fds = run_fds,
    .cancel = run_cancel,
    .preempt = run_preempt,
    .result = run_result,
    .exit_code = run_exit_code,
    .waiting = run_waiting,
    .free = run_free,
    .fits = policy_fits,
    .pending_reason = policy_pending_reason,
    .devices_json = policy_devices_json,
    .recover_orphans = policy_recover_orphans,
    .free_ctx = free,
};

struct launcher *launcher_slurm_new(const struct slurm_opts *o)
{
    struct slurm_opts *c = malloc(sizeof *c);
    if (!c)
        return NULL;
    *c = *o;
    return launch__new(&slurm_ops, c);
}
