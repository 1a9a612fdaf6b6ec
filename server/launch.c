/* launch.c — what every launcher shares: the id issuer of a multi-rank attempt (one
 * `ddpd-worker --issue-id` on this host, whose stdin stays open for as long as the ranks
 * run) and the dispatch to the backend's table (launch_impl.h). Knows no backend but by
 * its table; knows the worker only through its program path, the stdin document and the
 * issuer's one line (CONTRACT.md §5). */
#include "launch_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../base/clock.h"
#include "../base/file.h"
#include "../schema/event.h"
#include "../schema/jobdir.h"
#include "env.h"
#include "proc.h"

struct launch {
    const struct launch_ops *ops;
    void *run; /* the backend's attempt */
    pid_t pgid;
    pid_t issuer;  /* the id issuer (world_size > 1), 0 if none */
    int issuer_in; /* its stdin: closing it ends the issuer */
    bool issuer_exited;
};

/* The collective backend the job's spec asks for ("cpu" or "nccl"): the id issuer and
 * every rank's comm document must speak the same one. */
static const char *backend_name(const struct jobdoc *doc)
{
    return doc->spec.ddp.backend == BACKEND_NCCL ? "nccl" : "cpu";
}

/* Starts `ddpd-worker --issue-id <backend>` and reads the id it prints (one JSON line) within
 * ISSUER_DEADLINE_S. Its stdin stays open: closing it ends the rendezvous root. */
#define ISSUER_DEADLINE_S 10.0
static int start_issuer(struct launch *l, const struct launch_opts *o, char *id_hex, size_t cap,
                        struct ddpd_error *err)
{
    int in[2] = {-1, -1}, out[2] = {-1, -1}, log_fd = -1, rc = -1;
    char log_path[4096], line[1024];
    size_t len = 0;
    char nccl_log[4200], *extra[] = {nccl_log, NULL}, **env = NULL;
    jobdir_file_path(log_path, sizeof log_path, o->out_dir, JOBDIR_ISSUER_LOG);
    /* NCCL's own output (its bootstrap root lives in the issuer) goes to a file. */
    snprintf(nccl_log, sizeof nccl_log, "NCCL_DEBUG_FILE=%s/issuer.nccl.log", o->out_dir);
    env = env_for_worker(extra);
    log_fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (log_fd < 0 || pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) {
        ddpd_error_set(err, DDPD_EIO, log_path, "cannot start the id issuer: %s", strerror(errno));
        goto out;
    }
    char *argv[] = {(char *)o->worker, "--issue-id", (char *)backend_name(o->doc), NULL};
    struct proc_spawn sp = {.path = o->worker,
                            .argv = argv,
                            .env = env,
                            .fd = {in[0], out[1], log_fd},
                            .pgid = 0,
                            .die_with_parent = o->die_with_parent};
    pid_t pid = proc_spawn(&sp); /* it leads the job's process group */
    if (pid < 0) {
        ddpd_error_set(err, DDPD_EIO, "", "cannot fork the id issuer: %s", strerror(errno));
        goto out;
    }
    l->pgid = pid;
    l->issuer = pid;
    close(in[0]);
    in[0] = -1;
    l->issuer_in = in[1];
    in[1] = -1;
    close(out[1]);
    out[1] = -1;

    double deadline = base_mono_s() + ISSUER_DEADLINE_S;
    while (!memchr(line, '\n', len)) {
        int left = (int)((deadline - base_mono_s()) * 1000);
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
    proc_pipe_close(in);
    proc_pipe_close(out);
    if (log_fd >= 0)
        close(log_fd);
    free(env);
    return rc;
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

static const struct launch_ops *ops_of(const struct launcher *L)
{
    return L ? L->ops : &launch__local_ops;
}
static void *ctx_of(const struct launcher *L)
{
    return L ? L->ctx : NULL;
}

struct launch *launch_start(const struct launch_opts *o, struct ddpd_error *err)
{
    struct launch *l = calloc(1, sizeof *l);
    struct jobdoc *doc = NULL;
    if (!l) {
        ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory starting a job");
        return NULL;
    }
    struct launch_opts lo = *o;
    if (lo.grace_s <= 0)
        lo.grace_s = 5;
    l->ops = ops_of(o->launcher);
    l->issuer_in = -1;
    int en = base_mkdirs(o->out_dir, true);
    if (en) {
        ddpd_error_set(err, DDPD_EIO, o->out_dir, "%s: cannot create: %s", o->out_dir, strerror(en));
        goto fail;
    }
    char id_hex[512];
    if (o->world_size > 1 && start_issuer(l, o, id_hex, sizeof id_hex, err) != 0)
        goto fail;
    /* Every rank's document: the caller's, with the rendezvous every rank joins. */
    if (!(doc = malloc(sizeof *doc))) {
        ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory building the job document");
        goto fail;
    }
    *doc = *o->doc;
    doc->rank = -1;
    doc->comm_backend[0] = doc->comm_id[0] = '\0';
    if (o->world_size > 1) {
        snprintf(doc->comm_backend, sizeof doc->comm_backend, "%s", backend_name(o->doc));
        snprintf(doc->comm_id, sizeof doc->comm_id, "%s", id_hex);
    }
    l->run = l->ops->start(ctx_of(o->launcher), &lo, doc, &l->pgid, err);
    free(doc);
    if (!l->run)
        goto fail;
    return l;
fail:
    launch_free(l);
    return NULL;
}

bool launch_poll(struct launch *l, int timeout_ms)
{
    if (!l->ops->poll(l->run, timeout_ms))
        return false;
    stop_issuer(l);
    return true;
}

int launch_fds(const struct launch *l, struct pollfd *fds, int cap)
{
    return l->ops->fds(l->run, fds, cap);
}

void launch_cancel(struct launch *l)
{
    if (l)
        l->ops->cancel(l->run);
}

void launch_preempt(struct launch *l)
{
    if (l)
        l->ops->preempt(l->run);
}

void launch_result(const struct launch *l, struct launch_result *res)
{
    l->ops->result(l->run, res);
}

pid_t launch_pgid(const struct launch *l)
{
    return l->pgid;
}

pid_t launch_pid(const struct launch *l, int rank)
{
    return l->ops->pid ? l->ops->pid(l->run, rank) : 0;
}

int launch_exit_code(const struct launch *l, int rank)
{
    return l->ops->exit_code(l->run, rank);
}

bool launch_waiting(const struct launch *l, char *why, size_t cap)
{
    return l->ops->waiting && l->ops->waiting(l->run, why, cap);
}

void launch_free(struct launch *l)
{
    if (!l)
        return;
    if (l->run)
        l->ops->free(l->run);
    if (l->issuer && !l->issuer_exited)
        kill(l->issuer, SIGKILL);
    stop_issuer(l);
    free(l);
}

void launch__deliver(const struct launch_opts *o, int rank, const char *line, size_t len,
                     struct cause_rank *end)
{
    if (len == 0)
        return;
    cause_note_line(end, line, len);
    if (o->on_line)
        o->on_line(o->ctx, rank, line, len);
}

/* ---- launchers ------------------------------------------------------------------------- */

struct launcher *launch__new(const struct launch_ops *ops, void *ctx)
{
    struct launcher *L = calloc(1, sizeof *L);
    if (!L) {
        if (ops->free_ctx)
            ops->free_ctx(ctx);
        return NULL;
    }
    L->ops = ops;
    L->ctx = ctx;
    return L;
}

struct launcher *launcher_local_new(void)
{
    return launch__new(&launch__local_ops, NULL);
}

void launcher_free(struct launcher *L)
{
    if (!L)
        return;
    if (L->ops->free_ctx)
        L->ops->free_ctx(L->ctx);
    free(L);
}

const char *launcher_name(const struct launcher *L)
{
    return ops_of(L)->name;
}

bool launcher_queues(const struct launcher *L)
{
    return ops_of(L)->queues;
}

bool launcher_fits(const struct launcher *L, const struct sched *s, device_kind kind, int world, char *why,
                   size_t cap)
{
    return ops_of(L)->fits(ctx_of(L), s, kind, world, why, cap);
}

bool launcher_pending_reason(const struct launcher *L, const struct sched *s, int64_t job, char *buf,
                             size_t cap)
{
    buf[0] = '\0';
    return ops_of(L)->pending_reason(ctx_of(L), s, job, buf, cap);
}

json_t *launcher_devices_json(const struct launcher *L, const struct sched *s)
{
    return ops_of(L)->devices_json(ctx_of(L), s);
}

void launcher_recover_orphans(const struct launcher *L, const struct launch_orphan *o, size_t n)
{
    if (ops_of(L)->recover_orphans)
        ops_of(L)->recover_orphans(ctx_of(L), o, n);
}
