/* launch_local.c — the local launcher: fork/exec one job attempt's ranks into one process
 * group on this host, feed their stdin, read their stdout line by line, reap them, and take
 * the group down on the first failure; its policy is the server's own slots (sched.h). No
 * shell: execve with an argv and an allow-listed environment (env.h). Knows the worker only
 * through its program path, the stdin document and the event lines (CONTRACT.md §5, §6);
 * which rank's failure ended the attempt is cause.h's choice. */
#include "launch_impl.h"

#include <errno.h>
#include <inttypes.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
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
#include "../schema/spec.h"
#include "cause.h"
#include "env.h"
#include "proc.h"
#include "sched.h"

#define LINE_CAP (EVENT_LINE_MAX * 4)

struct rank_proc {
    pid_t pid;
    int out_fd; /* stdout pipe, -1 once at EOF */
    bool exited;
    int status;    /* from waitpid */
    size_t len;    /* bytes pending in buf */
    bool overlong; /* dropping the rest of an over-long line */
    char buf[LINE_CAP];
};

struct local {
    struct launch_opts o;
    pid_t pgid; /* the issuer's, or rank 0's */
    int n;
    struct rank_proc *ranks;
    struct cause_rank *ends;   /* each rank's end and last error event, for cause_pick */
    int reaped;                /* ranks reaped so far */
    double kill_at;            /* when SIGKILL follows SIGTERM; 0 = not armed */
    bool sent_term, sent_kill; /* signals we sent the group */
    bool cancelled;
    int64_t need;        /* bytes a rank needs (the spec's estimate), -1 if unknown */
    bool need_with_data; /* ... its data included (synthetic) */
};

static int start_rank(struct local *l, int r, struct jobdoc *every, struct ddpd_error *err)
{
    struct rank_proc *p = &l->ranks[r];
    int in[2] = {-1, -1}, out[2] = {-1, -1}, log_fd = -1;
    char *doc = NULL, **env = NULL;
    int rc = -1;

    every->rank = r;
    json_t *d = jobdoc_to_json(every);
    doc = d ? json_dumps(d, JSON_COMPACT) : NULL;
    json_decref(d);
    if (!doc) {
        ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory building rank %d's job document", r);
        goto out;
    }

    char log_path[4096];
    jobdir_rank_log_path(log_path, sizeof log_path, l->o.out_dir, r);
    /* NCCL writes to a file of its own, never into the event stream; a cuda rank sees
     * only its GPU. */
    char nccl_path[4096], nccl_log[4200], gpu[128], *extra[3] = {nccl_log, NULL, NULL};
    jobdir_nccl_log_path(nccl_path, sizeof nccl_path, l->o.out_dir, r);
    snprintf(nccl_log, sizeof nccl_log, "NCCL_DEBUG_FILE=%s", nccl_path);
    if (l->o.gpus) {
        snprintf(gpu, sizeof gpu, "CUDA_VISIBLE_DEVICES=%s", l->o.gpus[r]);
        extra[1] = gpu;
    }
    env = env_for_worker(extra);
    log_fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (log_fd < 0) {
        ddpd_error_set(err, DDPD_EIO, log_path, "%s: cannot open: %s", log_path, strerror(errno));
        goto out;
    }
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) {
        ddpd_error_set(err, DDPD_EIO, "", "cannot create pipes for rank %d: %s", r, strerror(errno));
        goto out;
    }
    char *argv[] = {(char *)l->o.worker, NULL};
    struct proc_spawn sp = {.path = l->o.worker,
                            .argv = argv,
                            .env = env,
                            .fd = {in[0], out[1], log_fd},
                            .pgid = l->pgid,
                            .die_with_parent = l->o.die_with_parent,
                            /* A cancel (SIGTERM to the group) may come before the rank has
                             * installed its handler, even before its exec: held, it reaches
                             * the handler then, and the rank exits 5 having told its peers,
                             * instead of dying of the signal (issue 15, item 14). */
                            .hold_term = true};
    pid_t pid = proc_spawn(&sp); /* the first process of a job leads its group */
    if (pid < 0) {
        ddpd_error_set(err, DDPD_EIO, "", "cannot fork rank %d: %s", r, strerror(errno));
        goto out;
    }
    if (l->pgid == 0)
        l->pgid = pid;
    p->pid = pid;
    close(in[0]);
    in[0] = -1;
    close(out[1]);
    out[1] = -1;
    /* The worker reads its whole document before anything else; a worker that died
     * first shows up as EPIPE here and as its exit status later. */
    base_write_all(in[1], doc, strlen(doc));
    p->out_fd = out[0];
    out[0] = -1;
    fcntl(p->out_fd, F_SETFL, fcntl(p->out_fd, F_GETFL) | O_NONBLOCK);
    rc = 0;
out:
    free(doc);
    free(env);
    proc_pipe_close(in);
    proc_pipe_close(out);
    if (log_fd >= 0)
        close(log_fd);
    return rc;
}

/* What a rank of this job needs, for the message of a rank the kernel killed: the
 * spec's estimate (schema/spec.h), with synthetic data's rows; for data files without
 * the data, which only the planner and the ranks measure. */
static int64_t memory_need(const struct spec *spec, bool *with_data)
{
    struct spec_memory m;
    *with_data = spec->data.kind == DATA_SYNTHETIC;
    const bool eval_synthetic = spec->eval.data.kind == DATA_SYNTHETIC;
    spec_memory_estimate(spec,
                         &(struct spec_memory_in){.rows = *with_data ? spec->data.samples : 0,
                                                  .eval_rows = eval_synthetic ? spec->eval.data.samples : 0},
                         &m);
    return m.host;
}

static void local_free(void *run);

static void *local_start(void *ctx, const struct launch_opts *o, struct jobdoc *doc, pid_t *pgid,
                         struct ddpd_error *err)
{
    (void)ctx;
    struct local *l = calloc(1, sizeof *l);
    if (!l) {
        ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory starting a job");
        return NULL;
    }
    l->o = *o;
    l->o.doc = NULL; /* borrowed for this call only */
    l->need = memory_need(&doc->spec, &l->need_with_data);
    l->pgid = *pgid;
    l->n = o->world_size;
    l->ranks = calloc((size_t)l->n, sizeof *l->ranks);
    l->ends = calloc((size_t)l->n, sizeof *l->ends);
    if (!l->ranks || !l->ends) {
        free(l->ranks);
        free(l->ends);
        free(l);
        ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory starting a job");
        return NULL;
    }
    for (int r = 0; r < l->n; r++) {
        l->ranks[r].out_fd = -1;
        l->ranks[r].exited = true; /* until started */
    }
    for (int r = 0; r < l->n; r++) {
        if (start_rank(l, r, doc, err) != 0) {
            local_free(l);
            return NULL;
        }
        l->ranks[r].exited = false;
        *pgid = l->pgid;
    }
    return l;
}

static void signal_group(struct local *l, int sig)
{
    if (l->pgid > 0)
        kill(-l->pgid, sig);
    if (sig == SIGTERM)
        l->sent_term = true;
    else if (sig == SIGKILL)
        l->sent_kill = true;
}

static void arm_kill(struct local *l)
{
    if (l->kill_at == 0) {
        signal_group(l, SIGTERM);
        l->kill_at = base_mono_s() + l->o.grace_s;
    }
}

static void local_cancel(void *run)
{
    struct local *l = run;
    l->cancelled = true;
    arm_kill(l);
}

/* SIGUSR1 to each rank that runs, not to the group: the id issuer leads the group and
 * has nothing to checkpoint. A rank not yet at its handler holds it (hold_term). */
static void local_preempt(void *run)
{
    struct local *l = run;
    for (int r = 0; r < l->n; r++)
        if (!l->ranks[r].exited && l->ranks[r].pid > 0)
            kill(l->ranks[r].pid, SIGUSR1);
}

/* Hands complete lines to the callback; remembers each rank's last error event. */
static void deliver(struct local *l, int r, const char *line, size_t len)
{
    launch__deliver(&l->o, r, line, len, &l->ends[r]);
}

/* Reads of one rank's pipe per read_rank call (LINE_CAP bytes each, ~1000 short events in
 * all): a rank that writes faster than the events are handled must not keep the caller
 * here (the supervisor also serves other jobs, commands and the commit of what it read).
 * What is left waits in the pipe, whose full buffer blocks the rank's writes: that is
 * the backpressure on a flooding worker, and the server's memory stays bounded. */
#define READS_PER_POLL 4

static void read_rank(struct local *l, int r)
{
    struct rank_proc *p = &l->ranks[r];
    for (int reads = 0; reads < READS_PER_POLL; reads++) {
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

/* How an exit status reads by itself: a communication failure (exit 3: a peer died), the
 * end a signal we sent the group brought (exit 5 is a worker's answer to SIGTERM), or a
 * failure of its own. A rank killed from outside by a signal we did not send failed of
 * its own, even when it is reaped after we began stopping the others. */
static enum cause_exit exit_reads(const struct local *l, int st)
{
    if (WIFEXITED(st) && WEXITSTATUS(st) == 3)
        return CAUSE_EXIT_LOST_PEER;
    if ((WIFEXITED(st) && WEXITSTATUS(st) == 5 && l->sent_term) ||
        (WIFSIGNALED(st) &&
         ((WTERMSIG(st) == SIGTERM && l->sent_term) || (WTERMSIG(st) == SIGKILL && l->sent_kill))))
        return CAUSE_EXIT_STOPPED;
    return CAUSE_EXIT_OWN;
}

static void reap(struct local *l)
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
        struct cause_rank *e = &l->ends[r];
        e->order = ++l->reaped;
        e->ended_at = base_wall_s();
        /* A rank that stopped at a preemption's checkpoint has not failed: its peers stop
         * at the same step on their own, and stopping them would cut that short. */
        e->preempted = WIFEXITED(st) && WEXITSTATUS(st) == RANK_EXIT_PREEMPTED;
        e->failed = !(WIFEXITED(st) && WEXITSTATUS(st) == 0) && !e->preempted;
        if (!e->failed)
            continue;
        /* Which failure was the cause is decided once every rank has ended (local_result):
         * the first one reaped is as often an echo (a peer's exit 3) as the cause. */
        e->exit = exit_reads(l, st);
        if (!l->cancelled)
            arm_kill(l);
    }
}

static bool local_poll(void *run, int timeout_ms)
{
    struct local *l = run;
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
    if (l->kill_at && base_mono_s() >= l->kill_at) {
        signal_group(l, SIGKILL);
        l->kill_at = base_mono_s() + 3600; /* once */
    }
    for (int r = 0; r < l->n; r++)
        if (!l->ranks[r].exited || l->ranks[r].out_fd >= 0)
            return false;
    return true;
}

static void describe_exit(const struct local *l, int st, char *out, size_t cap, int *code)
{
    if (WIFEXITED(st)) {
        *code = WEXITSTATUS(st);
        snprintf(out, cap, "exited with code %d", *code);
    } else if (WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL && !l->sent_kill) {
        /* A SIGKILL nobody here sent: on a host where the kernel log cannot be read, the
         * out-of-memory killer is the likely sender; say so, with what the job needed. */
        *code = 128 + SIGKILL;
        if (l->need >= 0)
            snprintf(
                out, cap,
                "killed by signal 9 (SIGKILL, not sent by ddpd: likely the out-of-memory killer; the job "
                "needed about %.1f MiB per rank%s)",
                (double)l->need / (1 << 20), l->need_with_data ? "" : " besides its data");
        else
            snprintf(out, cap,
                     "killed by signal 9 (SIGKILL, not sent by ddpd: likely the out-of-memory killer)");
    } else if (WIFSIGNALED(st)) {
        *code = 128 + WTERMSIG(st);
        snprintf(out, cap, "killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
    } else {
        *code = 1;
        snprintf(out, cap, "ended with status %d", st);
    }
}

static void local_result(const void *run, struct launch_result *res)
{
    const struct local *l = run;
    memset(res, 0, sizeof *res);
    res->ok = true;
    res->rank = -1;
    if (cause_preempted(l->ends, l->n)) {
        res->ok = false;
        res->preempted = true;
        res->exit_code = RANK_EXIT_PREEMPTED;
        snprintf(res->message, sizeof res->message,
                 "preempted: every rank stopped at its checkpoint (exit code %d)", RANK_EXIT_PREEMPTED);
        return;
    }
    int r = cause_pick(l->ends, l->n);
    if (r < 0)
        return;
    const struct rank_proc *p = &l->ranks[r];
    const struct cause_rank *e = &l->ends[r];
    char how[256];
    int code;
    res->ok = false;
    res->rank = r;
    describe_exit(l, p->status, how, sizeof how, &code);
    res->exit_code = cause_exit_code(e, code);
    if (e->has_error)
        snprintf(res->message, sizeof res->message, "%s", e->message);
    else {
        char logp[4096];
        jobdir_rank_log_path(logp, sizeof logp, l->o.out_dir, r);
        snprintf(res->message, sizeof res->message, "rank %d %s without an error event (see %.600s)", r, how,
                 logp);
    }
}

static void local_free(void *run)
{
    struct local *l = run;
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
    free(l->ends);
    free(l);
}

static pid_t local_pid(const void *run, int rank)
{
    const struct local *l = run;
    return rank >= 0 && rank < l->n ? l->ranks[rank].pid : 0;
}

static int local_fds(const void *run, struct pollfd *fds, int cap)
{
    const struct local *l = run;
    int n = 0;
    for (int r = 0; r < l->n && n < cap; r++)
        if (l->ranks[r].out_fd >= 0)
            fds[n++] = (struct pollfd){.fd = l->ranks[r].out_fd, .events = POLLIN};
    return n;
}

static int local_exit_code(const void *run, int rank)
{
    const struct local *l = run;
    if (rank < 0 || rank >= l->n || !l->ranks[rank].exited || !l->ranks[rank].pid)
        return -1;
    int code;
    char how[256];
    describe_exit(l, l->ranks[rank].status, how, sizeof how, &code);
    return code;
}

/* ---- policy: the server's own slots ------------------------------------------------------ */

static bool local_fits(void *ctx, const struct sched *s, device_kind kind, int world, char *why, size_t cap)
{
    (void)ctx;
    return sched_fits(s, kind, world, why, cap);
}

static bool local_pending_reason(void *ctx, const struct sched *s, int64_t job, char *buf, size_t cap)
{
    (void)ctx;
    sched_pending_reason(s, job, base_mono_s(), buf, cap);
    return buf[0] != '\0';
}

static json_t *local_devices_json(void *ctx, const struct sched *s)
{
    (void)ctx;
    json_t *out = json_object();
    for (int t = 0; t < 2; t++) {
        json_t *arr = json_array();
        for (int i = 0; i < sched_slots(s, (device_kind)t); i++) {
            int64_t h = sched_slot_holder(s, (device_kind)t, i);
            /* A negative holder is an inference process (sched_take): no job, and the job
             * whose model it holds under "inference". */
            json_t *slot =
                json_pack("{s:i, s:o, s:o}", "index", i, "job", h > 0 ? json_integer(h) : json_null(),
                          "inference", h < 0 ? json_integer(-h) : json_null());
            /* A GPU slot's device as CUDA_VISIBLE_DEVICES names it (slot 0 is GPU 2 under
             * --gpus 2,3), and what ddpd-worker --devices said of it (null: not listed). */
            if (slot && t == DEVICE_CUDA) {
                const struct sched_gpu_info *g = sched_gpu_info(s, i);
                bool k = g && g->known;
                json_object_set_new(slot, "device", json_string(sched_gpu_device(s, i)));
                json_object_set_new(slot, "name", k ? json_string(g->name) : json_null());
                json_object_set_new(slot, "memory", k ? json_integer(g->memory) : json_null());
                json_object_set_new(slot, "uuid", k && g->uuid[0] ? json_string(g->uuid) : json_null());
                json_object_set_new(slot, "emulated", json_boolean(k && g->emulated));
                /* Its compute capability and whether ddpd's CUDA module runs there (null:
                 * not known); a GPU without code is never given to a job. */
                json_object_set_new(slot, "compute_capability",
                                    k && g->cc[0] ? json_string(g->cc) : json_null());
                json_object_set_new(slot, "has_code",
                                    k && g->cc[0] ? json_boolean(!g->no_code) : json_null());
                json_object_set_new(slot, "code", k && g->code[0] ? json_string(g->code) : json_null());
            }
            json_array_append_new(arr, slot);
        }
        json_object_set_new(out, t == DEVICE_CUDA ? "gpus" : "cpu_slots", arr);
    }
    return out;
}

/* Kills each rank whose pid still belongs to the process that was started (same start
 * time), with its process group. */
static void local_recover_orphans(void *ctx, const struct launch_orphan *o, size_t n)
{
    (void)ctx;
    for (size_t i = 0; i < n; i++)
        if (proc_kill_if_same((pid_t)o[i].pid, o[i].start_time))
            fprintf(stderr, "ddpd: job %" PRId64 ": killed rank %d (pid %lld) left by an earlier server\n",
                    o[i].job, o[i].rank, (long long)o[i].pid);
}

const struct launch_ops launch__local_ops = {
    .name = "local",
    .queues = false,
    .start = local_start,
    .poll = local_poll,
    .fds = local_fds,
    .cancel = local_cancel,
    .preempt = local_preempt,
    .result = local_result,
    .exit_code = local_exit_code,
    .pid = local_pid,
    .free = local_free,
    .fits = local_fits,
    .pending_reason = local_pending_reason,
    .devices_json = local_devices_json,
    .recover_orphans = local_recover_orphans,
};
