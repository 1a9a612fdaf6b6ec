/* planner.c — long-lived `ddpd-worker --plan` processes answering one request per line
 * (planner.h). The callers ignore SIGPIPE (ddpd serve and ddpd run both do), so a planner
 * that died shows up as a failed write or an early EOF, never as a signal. */
#include "planner.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <pthread.h>
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
#include "../schema/jobdoc.h"
#include "env.h"
#include "proc.h"

#define ANSWER_MAX (EVENT_LINE_MAX * 2)

struct proc {
    pid_t pid; /* 0 = not running */
    int in_fd, out_fd;
    bool busy;
};

/* A queued asynchronous plan (planner_plan_async). */
struct plan_req {
    json_t *doc;
    int world_size;
    double deadline, timeout_s;
    planner_done_fn done;
    void *ctx;
    struct plan_req *next;
};

struct planner {
    char *worker;
    int n;
    pthread_mutex_t mu;
    pthread_cond_t free_cv;
    struct proc *procs;
    /* Asynchronous plans, under mu: a FIFO of requests, `n` threads that run them (started
     * on first use), and the count of requests queued or running (capped). */
    pthread_cond_t queue_cv;
    struct plan_req *head, *tail;
    size_t pending;
    pthread_t *threads;
    int nthreads;
    bool stop;
};

struct planner *planner_new(const char *worker, int procs)
{
    struct planner *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->worker = strdup(worker);
    p->n = procs < 1 ? 1 : procs;
    p->procs = calloc((size_t)p->n, sizeof *p->procs);
    if (!p->worker || !p->procs) {
        free(p->worker);
        free(p->procs);
        free(p);
        return NULL;
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->free_cv, NULL);
    pthread_cond_init(&p->queue_cv, NULL);
    return p;
}

/* Ends a planner process: EOF on its stdin ends its loop; SIGKILL makes sure. */
static void proc_stop(struct proc *c)
{
    if (c->pid > 0) {
        close(c->in_fd);
        close(c->out_fd);
        kill(c->pid, SIGKILL);
        while (waitpid(c->pid, NULL, 0) < 0 && errno == EINTR)
            ;
    }
    c->pid = 0;
    c->in_fd = c->out_fd = -1;
}

void planner_free(struct planner *p)
{
    if (!p)
        return;
    /* The threads finish what they run (within its deadline) and answer what is still
     * queued as refused. */
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    pthread_cond_broadcast(&p->queue_cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->nthreads; i++)
        pthread_join(p->threads[i], NULL);
    free(p->threads);
    for (int i = 0; i < p->n; i++)
        proc_stop(&p->procs[i]);
    pthread_cond_destroy(&p->queue_cv);
    pthread_cond_destroy(&p->free_cv);
    pthread_mutex_destroy(&p->mu);
    free(p->procs);
    free(p->worker);
    free(p);
}

static ddpd_err proc_start(struct proc *c, const char *worker, struct ddpd_error *err)
{
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC))
        return ddpd_error_set(err, DDPD_EIO, "", "cannot run %s --plan: %s", worker, strerror(errno));
    if (pipe2(out, O_CLOEXEC)) {
        proc_pipe_close(in);
        return ddpd_error_set(err, DDPD_EIO, "", "cannot run %s --plan: %s", worker, strerror(errno));
    }
    /* The worker's environment is an allow-list of ours (env.h), built before fork; its
     * stderr is the server's. */
    char **env = env_for_worker(NULL);
    char *argv[] = {(char *)worker, "--plan", NULL};
    struct proc_spawn sp = {
        .path = worker, .argv = argv, .env = env, .fd = {in[0], out[1], PROC_FD_SAME}, .pgid = -1};
    pid_t pid = proc_spawn(&sp);
    free(env);
    close(in[0]);
    close(out[1]);
    if (pid < 0) {
        close(in[1]);
        close(out[0]);
        return ddpd_error_set(err, DDPD_EIO, "", "cannot fork %s --plan: %s", worker, strerror(errno));
    }
    *c = (struct proc){.pid = pid, .in_fd = in[1], .out_fd = out[0], .busy = c->busy};
    return DDPD_OK;
}

/* Reads one answer line (without the newline) into buf by `deadline`. */
static ddpd_err read_line(struct proc *c, const char *worker, double deadline, double timeout_s, char *buf,
                          struct ddpd_error *err)
{
    size_t len = 0;
    for (;;) {
        int left = (int)((deadline - base_mono_s()) * 1000);
        struct pollfd pf = {.fd = c->out_fd, .events = POLLIN};
        if (left <= 0 || poll(&pf, 1, left) == 0)
            return ddpd_error_set(err, DDPD_EDATA, "data",
                                  "the data files could not be read within %.0f s (does one block on open: a "
                                  "FIFO, a device, a hung network mount?); the check was given up",
                                  timeout_s);
        ssize_t n = read(c->out_fd, buf + len, ANSWER_MAX - 1 - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return ddpd_error_set(err, DDPD_EIO, "", "%s --plan ended without an answer", worker);
        char *nl = memchr(buf + len, '\n', (size_t)n);
        len += (size_t)n;
        if (nl) {
            *nl = '\0';
            return DDPD_OK;
        }
        if (len == ANSWER_MAX - 1)
            return ddpd_error_set(err, DDPD_EIO, "", "%s --plan answered a line longer than %d bytes", worker,
                                  ANSWER_MAX);
    }
}

/* The answer line (schema/jobdoc.h): the counts, "only the ranks can tell", or the worker's
 * error; anything else is the process's failure. */
static ddpd_err parse_answer(const char *line, const char *worker, int world_size, int64_t *counts,
                             bool *known, struct ddpd_error *err)
{
    struct jobdoc_plan_answer *ans = malloc(sizeof *ans);
    ddpd_err rc;
    if (!ans)
        rc = ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory reading the plan answer");
    else if (!jobdoc_plan_answer_decode(line, strlen(line), world_size, ans))
        rc = ddpd_error_set(err, DDPD_EIO, "", "%s --plan answered: %.300s", worker, line);
    else if (ans->code != DDPD_OK)
        rc = ddpd_error_set(err, ans->code, ans->path, "%s", ans->message);
    else {
        *known = ans->known;
        for (int r = 0; ans->known && r < world_size; r++)
            counts[r] = ans->batches[r];
        rc = DDPD_OK;
    }
    free(ans);
    return rc;
}

/* Takes a free process slot, waiting until `deadline`; -1 when none came free. */
static int take_slot(struct planner *p, double deadline)
{
    pthread_mutex_lock(&p->mu);
    int got = -1;
    for (;;) {
        for (int i = 0; i < p->n && got < 0; i++)
            if (!p->procs[i].busy)
                got = i;
        if (got >= 0 || base_mono_s() >= deadline)
            break;
        double left = deadline - base_mono_s();
        struct timespec ts = base_timespec_after(CLOCK_REALTIME, left < 0.5 ? left : 0.5);
        pthread_cond_timedwait(&p->free_cv, &p->mu, &ts);
    }
    if (got >= 0)
        p->procs[got].busy = true;
    pthread_mutex_unlock(&p->mu);
    return got;
}

static void give_slot(struct planner *p, int i)
{
    pthread_mutex_lock(&p->mu);
    p->procs[i].busy = false;
    pthread_cond_signal(&p->free_cv);
    pthread_mutex_unlock(&p->mu);
}

/* planner_plan by `deadline` (monotonic); its messages say `timeout_s`, the whole
 * deadline the caller was given (an asynchronous plan spent part of it queued). */
static ddpd_err plan_by(struct planner *p, json_t *doc, int world_size, double deadline, double timeout_s,
                        int64_t *counts, bool *known, struct ddpd_error *err)
{
    *known = false;
    char *text = json_dumps(doc, JSON_COMPACT);
    if (!text)
        return ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory encoding the plan request");
    int i = take_slot(p, deadline);
    if (i < 0) {
        free(text);
        return ddpd_error_set(err, DDPD_EBUSY, "",
                              "every data check was busy for %.0f s (%d at a time, each up to its own "
                              "deadline); try again later",
                              timeout_s, p->n);
    }
    /* The slot is ours alone until give_slot: its process is used without the lock. */
    struct proc *c = &p->procs[i];
    char *line = malloc(ANSWER_MAX);
    ddpd_err rc = line ? DDPD_OK : ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory for the plan answer");
    if (rc == DDPD_OK && c->pid == 0)
        rc = proc_start(c, p->worker, err);
    if (rc == DDPD_OK) {
        size_t n = strlen(text);
        text[n] = '\n'; /* json_dumps's NUL becomes the request's newline */
        if (base_write_all(c->in_fd, text, n + 1))
            rc = ddpd_error_set(err, DDPD_EIO, "", "%s --plan ended: %s", p->worker, strerror(errno));
    }
    bool line_ok = false;
    if (rc == DDPD_OK)
        rc = read_line(c, p->worker, deadline, timeout_s, line, err);
    if (rc == DDPD_OK) {
        line_ok = true;
        rc = parse_answer(line, p->worker, world_size, counts, known, err);
    }
    /* A process that failed to answer (in time) is out of step with its pipe: replace it. */
    if (rc == DDPD_EIO || rc == DDPD_ENOMEM || (rc == DDPD_EDATA && !line_ok))
        proc_stop(c);
    give_slot(p, i);
    free(line);
    free(text);
    return rc;
}

ddpd_err planner_plan(struct planner *p, json_t *doc, int world_size, double timeout_s, int64_t *counts,
                      bool *known, struct ddpd_error *err)
{
    return plan_by(p, doc, world_size, base_mono_s() + timeout_s, timeout_s, counts, known, err);
}

ddpd_err planner_plan_once(const char *worker, json_t *doc, int world_size, double timeout_s, int64_t *counts,
                           bool *known, struct ddpd_error *err)
{
    struct planner *p = planner_new(worker, 1);
    if (!p)
        return ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory starting %s --plan", worker);
    ddpd_err rc = planner_plan(p, doc, world_size, timeout_s, counts, known, err);
    planner_free(p);
    return rc;
}

/* ---- asynchronous plans ---------------------------------------------------------------- */

static void *plan_thread(void *arg)
{
    struct planner *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->head && !p->stop)
            pthread_cond_wait(&p->queue_cv, &p->mu);
        if (!p->head)
            break; /* stopping, nothing left */
        struct plan_req *r = p->head;
        p->head = r->next;
        if (!p->head)
            p->tail = NULL;
        bool stopping = p->stop;
        pthread_mutex_unlock(&p->mu);

        int64_t counts[PLAN_MAX_WORLD];
        bool known = false;
        struct ddpd_error err;
        ddpd_error_clear(&err);
        double left = r->deadline - base_mono_s();
        ddpd_err rc;
        if (stopping)
            rc = ddpd_error_set(&err, DDPD_EBUSY, "", "the server is shutting down");
        else if (left <= 0)
            rc = ddpd_error_set(&err, DDPD_EBUSY, "",
                                "every data check was busy for %.0f s (%d at a time, each up to its own "
                                "deadline); try again later",
                                r->timeout_s, p->n);
        else
            rc = plan_by(p, r->doc, r->world_size, r->deadline, r->timeout_s, counts, &known, &err);
        r->done(r->ctx, rc, counts, known, &err);
        json_decref(r->doc);
        free(r);

        pthread_mutex_lock(&p->mu);
        p->pending--;
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

ddpd_err planner_plan_async(struct planner *p, json_t *doc, int world_size, double timeout_s,
                            planner_done_fn done, void *ctx, struct ddpd_error *err)
{
    ddpd_err rc = DDPD_OK;
    struct plan_req *r = NULL;
    if (world_size < 1 || world_size > PLAN_MAX_WORLD) {
        rc = ddpd_error_set(err, DDPD_EINTERNAL, "", "plan of %d ranks (at most %d)", world_size,
                            PLAN_MAX_WORLD);
        goto out;
    }
    if (!(r = calloc(1, sizeof *r))) {
        rc = ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory queueing the data check");
        goto out;
    }
    *r = (struct plan_req){.doc = doc,
                           .world_size = world_size,
                           .timeout_s = timeout_s,
                           .deadline = base_mono_s() + timeout_s,
                           .done = done,
                           .ctx = ctx};
    pthread_mutex_lock(&p->mu);
    if (p->stop) {
        rc = ddpd_error_set(err, DDPD_EBUSY, "", "the server is shutting down");
    } else if (p->pending >= PLAN_QUEUE_MAX) {
        rc = ddpd_error_set(err, DDPD_EBUSY, "",
                            "%zu data checks are waiting or running (at most %d); try again later",
                            p->pending, PLAN_QUEUE_MAX);
    } else if (p->nthreads == 0) {
        if (!p->threads)
            p->threads = calloc((size_t)p->n, sizeof *p->threads);
        for (int i = 0; p->threads && i < p->n; i++)
            if (pthread_create(&p->threads[p->nthreads], NULL, plan_thread, p) == 0)
                p->nthreads++;
        if (p->nthreads == 0)
            rc = ddpd_error_set(err, DDPD_EINTERNAL, "", "cannot start the data check threads");
    }
    if (rc == DDPD_OK) {
        if (p->tail)
            p->tail->next = r;
        else
            p->head = r;
        p->tail = r;
        p->pending++;
        pthread_cond_signal(&p->queue_cv);
    }
    pthread_mutex_unlock(&p->mu);
out:
    if (rc != DDPD_OK) {
        free(r);
        json_decref(doc);
    }
    return rc;
}
