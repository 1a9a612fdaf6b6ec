/* pool.c — the inference pool (pool.h): the slots (one worker process each, and the model
 * it holds), the queue, the runner threads (each runs a request on a slot with run.c,
 * which speaks the worker protocol: docs/architecture.md, "How an inference request
 * flows"), the memory cap's evictions, and the housekeeper thread that expires waiting
 * requests and ends idle or doomed models (and idle GPU models when a job waits for a
 * GPU).
 *
 * Threads: one runner per slot (started at the first request) takes the head of the
 * queue onto the slot policy.c picks, and owns that slot, its process and its pipes until
 * the request is done; the housekeeper wakes every HOUSEKEEP_S. `mu` guards the queue,
 * the counters and every slot field that another thread reads (state, pid, the model);
 * a slot's process and pipes are used only by the thread that owns the slot (BUSY: its
 * runner; ENDING: whoever marked it). No callback of a sink runs under `mu` but `gone`. */
#include "pool.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../../base/clock.h"
#include "../../base/file.h"
#include "../sched.h"
#include "../super.h"
#include "pool_impl.h"

/* ---- tasks --------------------------------------------------------------------------------- */

static void task_free(struct task *t)
{
    if (!t)
        return;
    if (t->upload)
        unlink(t->upload);
    free(t->upload);
    free(t->weights);
    free(t->spec);
    free(t->data_dir);
    free(t->request);
    free(t);
}

/* Answers and frees a task that never reached a slot. */
static void task_refuse(struct task *t, ddpd_err rc, const struct ddpd_error *err, int retry)
{
    t->sink.done(t->sink.ctx, rc, NULL, err, retry);
    task_free(t);
}

bool infer__task_gone(struct infer_pool *p, struct task *t)
{
    bool stop;
    pthread_mutex_lock(&p->mu);
    stop = p->stop;
    pthread_mutex_unlock(&p->mu);
    return stop || (t->sink.gone && t->sink.gone(t->sink.ctx));
}

/* "job 3's final model" / "job 3's checkpoint 40" into buf[cap], for messages. */
const char *infer__model_name(const struct infer_key *k, char *buf, size_t cap)
{
    if (k->step < 0)
        snprintf(buf, cap, "job %" PRId64 "'s final model", k->job);
    else
        snprintf(buf, cap, "job %" PRId64 "'s checkpoint at step %" PRId64, k->job, k->step);
    return buf;
}

/* ---- slots (under mu unless said) ------------------------------------------------------------ */

static void views_of(struct infer_pool *p, struct infer_view *v)
{
    for (int i = 0; i < p->o.procs; i++) {
        const struct slot *s = &p->slots[i];
        v[i] = (struct infer_view){.free = s->state == SLOT_FREE && !s->doomed,
                                   .running = s->pid > 0,
                                   .cuda = s->cuda_proc,
                                   .loaded = s->loaded,
                                   .key = s->key,
                                   .last_used = s->last_used};
    }
}

static int64_t memory_used(struct infer_pool *p, int except)
{
    int64_t used = 0;
    for (int i = 0; i < p->o.procs; i++)
        if (i != except && p->slots[i].loaded)
            used += p->slots[i].resident;
    return used;
}

/* Marks the idle models to unload until `need` more bytes fit beside the others (slot
 * `keep`'s own not counted) under the cap: each victim ENDING, its index into out[]. The
 * number marked. Models of running requests are never taken: the cap may be passed while
 * they run, and is kept again as they end (release). */
static int mark_victims(struct infer_pool *p, int keep, int64_t need, int *out)
{
    struct infer_view v[INFER_PROCS_MAX];
    int n = 0;
    int64_t used = memory_used(p, keep);
    while (used + need > p->o.memory) {
        views_of(p, v);
        int i = infer__victim(v, p->o.procs, keep);
        if (i < 0)
            break;
        p->slots[i].state = SLOT_ENDING;
        used -= p->slots[i].resident;
        out[n++] = i;
    }
    return n;
}

/* Ends slot s's process (the caller owns s: BUSY or ENDING) and gives its GPU back; its
 * exit into why[cap]. Not under mu. */
void infer__end_process(struct infer_pool *p, struct slot *s, double grace, char *why, size_t cap)
{
    infer__proc_end(&s->proc, grace, why, cap);
    pthread_mutex_lock(&p->mu);
    int gpu = s->gpu;
    s->gpu = -1;
    s->pid = 0;
    s->cuda_proc = false;
    s->loaded = false;
    s->resident = 0;
    s->doomed = false;
    pthread_mutex_unlock(&p->mu);
    if (gpu >= 0 && p->o.super)
        super_gpu_give(p->o.super, gpu);
}

/* Ends the ENDING slots idx[0..n) (evictions) and frees them. Not under mu. */
static void end_marked(struct infer_pool *p, const int *idx, int n)
{
    for (int k = 0; k < n; k++) {
        struct slot *s = &p->slots[idx[k]];
        infer__end_process(p, s, END_GRACE_S, NULL, 0);
        pthread_mutex_lock(&p->mu);
        s->state = SLOT_FREE;
        p->st.evictions++;
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
}

/* Makes room for `need` more bytes beside the other loaded models (slot s's own model is
 * being replaced). */
void infer__make_room(struct infer_pool *p, struct slot *s, int64_t need)
{
    int victims[INFER_PROCS_MAX];
    pthread_mutex_lock(&p->mu);
    int n = mark_victims(p, s->index, need, victims);
    pthread_mutex_unlock(&p->mu);
    end_marked(p, victims, n);
}

static int release(struct infer_pool *p, struct slot *s, int *out)
{
    int n = 0;
    pthread_mutex_lock(&p->mu);
    s->state = SLOT_FREE;
    s->op = NULL;
    s->served++;
    s->last_used = base_mono_s();
    s->used_wall = base_wall_s();
    p->running--;
    /* A model of a job deleted while it loaded is doomed too. */
    for (unsigned i = 0; s->loaded && i < p->nforgotten && i < FORGOTTEN; i++)
        s->doomed |= p->forgotten[i] == s->key.job;
    if (s->doomed) {
        s->state = SLOT_ENDING;
        out[n++] = s->index;
    }
    n += mark_victims(p, -1, 0, out + n);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    return n;
}

static void run_task(struct infer_pool *p, struct slot *s, struct task *t)
{
    struct ddpd_error err;
    ddpd_error_clear(&err);
    json_t *answer = NULL;
    int retry = 0, victims[INFER_PROCS_MAX + 1];
    ddpd_err rc = DDPD_OK;
    if (infer__task_gone(p, t)) {
        pthread_mutex_lock(&p->mu);
        bool stopping = p->stop;
        p->st.cancels += !stopping;
        pthread_mutex_unlock(&p->mu);
        rc = stopping
                 ? ddpd_error_set(&err, DDPD_EBUSY, "", "the server is shutting down")
                 : ddpd_error_set(&err, DDPD_ECANCELED, "", "the client went away before the request ran");
        retry = stopping ? 1 : 0;
    }
    if (rc == DDPD_OK)
        rc = infer__ensure_model(p, s, t, &retry, &err);
    if (rc == DDPD_OK)
        rc = infer__exchange(p, s, t, &answer, &err);
    int n = release(p, s, victims);
    t->sink.done(t->sink.ctx, rc, answer, &err, retry);
    json_decref(answer);
    task_free(t);
    end_marked(p, victims, n);
}

/* ---- threads ------------------------------------------------------------------------------ */

static void *runner(void *arg)
{
    struct infer_pool *p = arg;
    pthread_setname_np(pthread_self(), "ddpd-infer");
    pthread_mutex_lock(&p->mu);
    for (;;) {
        int i = -1;
        while (!p->stop_threads) {
            if (p->head) {
                struct infer_view v[INFER_PROCS_MAX];
                views_of(p, v);
                if ((i = infer__pick(v, p->o.procs, &p->head->key)) >= 0)
                    break;
            }
            pthread_cond_wait(&p->cv, &p->mu);
        }
        if (i < 0)
            break;
        struct task *t = p->head;
        p->head = t->next;
        if (!p->head)
            p->tail = NULL;
        p->waiting--;
        p->running++;
        struct slot *s = &p->slots[i];
        s->state = SLOT_BUSY;
        s->op = t->op;
        pthread_mutex_unlock(&p->mu);
        run_task(p, s, t);
        pthread_mutex_lock(&p->mu);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* Takes the waiting tasks for which `drop` holds out of the queue into a list. Under mu. */
static struct task *unqueue(struct infer_pool *p, bool (*drop)(struct infer_pool *, struct task *, void *),
                            void *arg)
{
    struct task *out = NULL, **pp = &p->head, *prev = NULL;
    while (*pp) {
        struct task *t = *pp;
        if (drop(p, t, arg)) {
            *pp = t->next;
            if (p->tail == t)
                p->tail = prev;
            p->waiting--;
            t->next = out;
            out = t;
        } else {
            prev = t;
            pp = &t->next;
        }
    }
    return out;
}

/* A waiting task past its deadline (arg: now). */
static bool expired(struct infer_pool *p, struct task *t, void *arg)
{
    (void)p;
    return t->deadline <= *(double *)arg;
}

static bool every(struct infer_pool *p, struct task *t, void *arg)
{
    (void)p;
    (void)t;
    (void)arg;
    return true;
}

static bool client_gone(struct infer_pool *p, struct task *t, void *arg)
{
    (void)p;
    (void)arg;
    return t->sink.gone && t->sink.gone(t->sink.ctx);
}

static void *housekeeper(void *arg)
{
    struct infer_pool *p = arg;
    pthread_setname_np(pthread_self(), "ddpd-infer-hk");
    pthread_mutex_lock(&p->mu);
    while (!p->stop_threads) {
        double now = base_mono_s();
        /* A job waiting for a GPU: idle cuda models give their slots up. Asked outside mu
         * (the supervisor's lock is never taken under the pool's). */
        bool any_gpu = false;
        for (int i = 0; i < p->o.procs; i++)
            any_gpu |= p->slots[i].state == SLOT_FREE && p->slots[i].gpu >= 0;
        bool gpu_wanted = false;
        if (any_gpu && p->o.super) {
            pthread_mutex_unlock(&p->mu);
            gpu_wanted = super_gpu_wanted(p->o.super);
            pthread_mutex_lock(&p->mu);
        }
        struct task *late = unqueue(p, expired, &now);
        struct task *gone = unqueue(p, client_gone, NULL);
        int ending[INFER_PROCS_MAX], n = 0;
        for (int i = 0; i < p->o.procs; i++) {
            struct slot *s = &p->slots[i];
            if (s->state == SLOT_FREE && s->pid > 0 &&
                (s->doomed || now - s->last_used >= p->o.idle_s || (gpu_wanted && s->gpu >= 0))) {
                s->state = SLOT_ENDING;
                ending[n++] = i;
            }
        }
        int nlate = 0, ngone = 0;
        for (struct task *t = late; t; t = t->next)
            nlate++;
        for (struct task *t = gone; t; t = t->next)
            ngone++;
        p->st.rejected += (uint64_t)nlate;
        p->st.cancels += (uint64_t)ngone;
        int retry = 1 + p->waiting / p->o.procs;
        pthread_mutex_unlock(&p->mu);

        struct ddpd_error err;
        for (struct task *t = late, *next; t; t = next) {
            next = t->next;
            ddpd_error_set(
                &err, DDPD_EBUSY, "",
                "the request waited %.0f s (--infer-timeout-s) for an inference process: every one "
                "of the %d (--infer-procs) was busy; try again later",
                p->o.timeout_s, p->o.procs);
            task_refuse(t, DDPD_EBUSY, &err, retry);
        }
        for (struct task *t = gone, *next; t; t = next) {
            next = t->next;
            ddpd_error_set(&err, DDPD_ECANCELED, "", "the client went away before the request ran");
            task_refuse(t, DDPD_ECANCELED, &err, 0);
        }
        end_marked(p, ending, n);

        pthread_mutex_lock(&p->mu);
        if (!p->stop_threads) {
            struct timespec ts = base_timespec_after(CLOCK_MONOTONIC, HOUSEKEEP_S);
            pthread_cond_timedwait(&p->hk_cv, &p->mu, &ts);
        }
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* Under mu: the runners and the housekeeper, at the first request. */
static ddpd_err start_threads(struct infer_pool *p, struct ddpd_error *err)
{
    if (p->nthreads > 0)
        return DDPD_OK;
    if (!p->threads && !(p->threads = calloc((size_t)p->o.procs, sizeof *p->threads)))
        return ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory starting the inference threads");
    if (!p->hk_started && pthread_create(&p->hk, NULL, housekeeper, p) == 0)
        p->hk_started = true;
    for (int i = 0; p->hk_started && i < p->o.procs; i++)
        if (pthread_create(&p->threads[p->nthreads], NULL, runner, p) == 0)
            p->nthreads++;
    if (p->nthreads == 0)
        return ddpd_error_set(err, DDPD_EINTERNAL, "", "cannot start the inference threads");
    return DDPD_OK;
}

/* ---- public ------------------------------------------------------------------------------ */

ddpd_err infer_pool_new(const struct infer_pool_opts *o, struct infer_pool **out, struct ddpd_error *err)
{
    *out = NULL;
    if (o->procs < 1 || o->procs > INFER_PROCS_MAX || o->queue < 0 || o->queue > INFER_QUEUE_MAX ||
        o->memory <= 0 || o->idle_s <= 0 || o->timeout_s <= 0 || o->line_max < 1024)
        return ddpd_error_set(err, DDPD_EINTERNAL, "", "inference pool options out of range");
    int e = base_mkdirs(o->dir, true);
    if (e)
        return ddpd_error_set(err, DDPD_EIO, o->dir, "cannot create the inference folder %s: %s", o->dir,
                              strerror(e));
    struct infer_pool *p = calloc(1, sizeof *p);
    if (!p || !(p->slots = calloc((size_t)o->procs, sizeof *p->slots)) || !(p->worker = strdup(o->worker)) ||
        !(p->dir = strdup(o->dir))) {
        if (p) {
            free(p->slots);
            free(p->worker);
        }
        free(p);
        return ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory for the inference pool");
    }
    p->o = *o;
    p->o.worker = p->worker;
    p->o.dir = p->dir;
    for (int i = 0; i < o->procs; i++)
        p->slots[i] = (struct slot){.index = i, .gpu = -1, .proc = {.in_fd = -1, .out_fd = -1}};
    pthread_mutex_init(&p->mu, NULL);
    base_cond_init_mono(&p->cv);
    base_cond_init_mono(&p->hk_cv);
    *out = p;
    return DDPD_OK;
}

void infer_pool_stop(struct infer_pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    struct task *all = unqueue(p, every, NULL);
    pthread_cond_broadcast(&p->cv);
    pthread_cond_signal(&p->hk_cv);
    pthread_mutex_unlock(&p->mu);
    struct ddpd_error err;
    ddpd_error_set(&err, DDPD_EBUSY, "", "the server is shutting down");
    for (struct task *t = all, *next; t; t = next) {
        next = t->next;
        task_refuse(t, DDPD_EBUSY, &err, 1);
    }
}

void infer_pool_free(struct infer_pool *p)
{
    if (!p)
        return;
    infer_pool_stop(p);
    pthread_mutex_lock(&p->mu);
    p->stop_threads = true;
    pthread_cond_broadcast(&p->cv);
    pthread_cond_signal(&p->hk_cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->nthreads; i++)
        pthread_join(p->threads[i], NULL);
    if (p->hk_started)
        pthread_join(p->hk, NULL);
    for (int i = 0; i < p->o.procs; i++)
        infer__end_process(p, &p->slots[i], END_GRACE_S, NULL, 0);
    pthread_cond_destroy(&p->hk_cv);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p->threads);
    free(p->slots);
    free(p->worker);
    free(p->dir);
    free(p);
}

ddpd_err infer_pool_submit(struct infer_pool *p, const struct infer_model *m, char *request, const char *op,
                           const char *upload, const struct infer_sink *sink, int *retry_after_s,
                           struct ddpd_error *err)
{
    *retry_after_s = 0;
    struct task *t = calloc(1, sizeof *t);
    ddpd_err rc = DDPD_OK;
    if (!t || !(t->weights = strdup(m->weights)) || !(t->spec = strdup(m->spec)) ||
        (upload && !(t->upload = strdup(upload))) || (m->data_dir && !(t->data_dir = strdup(m->data_dir)))) {
        if (t) {
            free(t->weights);
            free(t->spec);
            free(t->upload);
        }
        free(t);
        free(request);
        return ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory queueing the request");
    }
    t->key = (struct infer_key){.job = m->job, .step = m->step < 0 ? -1 : m->step, .cuda = m->cuda};
    t->request = request;
    t->sink = *sink;
    t->deadline = base_mono_s() + p->o.timeout_s;
    snprintf(t->op, sizeof t->op, "%s", op);

    pthread_mutex_lock(&p->mu);
    bool deleted = false;
    for (unsigned i = 0; i < p->nforgotten && i < FORGOTTEN; i++)
        deleted |= p->forgotten[i] == m->job;
    if (p->stop) {
        *retry_after_s = 1;
        rc = ddpd_error_set(err, DDPD_EBUSY, "", "the server is shutting down");
    } else if (deleted) {
        rc = ddpd_error_set(err, DDPD_ENOTFOUND, "", "job %" PRId64 " was deleted", m->job);
    } else if (p->running + p->waiting >= p->o.procs + p->o.queue) {
        *retry_after_s = 1 + p->waiting / p->o.procs;
        rc = ddpd_error_set(err, DDPD_EBUSY, "",
                            "every inference process is busy (%d, --infer-procs) and %d requests wait "
                            "(at most %d, --infer-queue); try again later",
                            p->o.procs, p->waiting, p->o.queue);
    } else {
        rc = start_threads(p, err);
    }
    if (rc == DDPD_EBUSY)
        p->st.rejected++;
    if (rc == DDPD_OK) {
        if (p->tail)
            p->tail->next = t;
        else
            p->head = t;
        p->tail = t;
        p->waiting++;
        p->st.requests++;
        pthread_cond_broadcast(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
    if (rc != DDPD_OK) {
        free(t->upload); /* the caller's file still: not removed */
        t->upload = NULL;
        task_free(t);
    }
    return rc;
}

int infer_pool_upload_path(struct infer_pool *p, char *path, size_t cap)
{
    pthread_mutex_lock(&p->mu);
    unsigned seq = p->upload_seq++;
    pthread_mutex_unlock(&p->mu);
    if (snprintf(path, cap, "%s/upload-%d-%u.npy", p->dir, (int)getpid(), seq) >= (int)cap) {
        errno = ENAMETOOLONG;
        return -1;
    }
    return open(path, O_WRONLY | O_CREAT | O_EXCL | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
}

static bool of_job(struct infer_pool *p, struct task *t, void *arg)
{
    (void)p;
    return t->key.job == *(int64_t *)arg;
}

void infer_pool_forget_job(struct infer_pool *p, int64_t job)
{
    pthread_mutex_lock(&p->mu);
    p->forgotten[p->nforgotten++ % FORGOTTEN] = job;
    struct task *mine = unqueue(p, of_job, &job);
    for (int i = 0; i < p->o.procs; i++)
        if (p->slots[i].loaded && p->slots[i].key.job == job)
            p->slots[i].doomed = true;
    pthread_cond_signal(&p->hk_cv);
    pthread_mutex_unlock(&p->mu);
    struct ddpd_error err;
    ddpd_error_set(&err, DDPD_ENOTFOUND, "", "job %" PRId64 " was deleted while the request waited", job);
    for (struct task *t = mine, *next; t; t = next) {
        next = t->next;
        task_refuse(t, DDPD_ENOTFOUND, &err, 0);
    }
}

void infer_pool_stats_get(struct infer_pool *p, struct infer_pool_stats *out)
{
    pthread_mutex_lock(&p->mu);
    *out = p->st;
    pthread_mutex_unlock(&p->mu);
}

static const char *slot_state_name(const struct slot *s)
{
    switch (s->state) {
    case SLOT_BUSY: return "busy";
    case SLOT_ENDING: return "ending";
    case SLOT_FREE: break;
    }
    return s->pid > 0 ? "idle" : "stopped";
}

json_t *infer_pool_status(struct infer_pool *p)
{
    json_t *procs = json_array();
    pthread_mutex_lock(&p->mu);
    int busy = 0, alive = 0;
    for (int i = 0; i < p->o.procs; i++) {
        const struct slot *s = &p->slots[i];
        busy += s->state == SLOT_BUSY;
        alive += s->pid > 0;
        json_t *model = json_null();
        if (s->loaded) {
            char nm[48];
            if (s->key.step < 0)
                snprintf(nm, sizeof nm, "final");
            else
                snprintf(nm, sizeof nm, "ckpt-%" PRId64, s->key.step);
            model =
                json_pack("{s:I, s:o, s:s, s:s, s:o, s:I, s:f, s:f}", "job", (json_int_t)s->key.job, "step",
                          s->key.step < 0 ? json_null() : json_integer(s->key.step), "name", nm, "device",
                          s->key.cuda ? "cuda" : "cpu", "gpu",
                          s->gpu >= 0 ? json_integer(s->gpu) : json_null(), "resident_bytes",
                          (json_int_t)s->resident, "loaded_at", s->loaded_wall, "last_used", s->used_wall);
        }
        json_array_append_new(procs, json_pack("{s:i, s:s, s:o, s:o, s:o, s:I}", "index", i, "state",
                                               slot_state_name(s), "pid",
                                               s->pid > 0 ? json_integer(s->pid) : json_null(), "op",
                                               s->op ? json_string(s->op) : json_null(), "model", model,
                                               "requests", (json_int_t)s->served));
    }
    struct infer_pool_stats st = p->st;
    json_t *out = json_pack(
        "{s:o, s:i, s:i, s:i, s:{s:i, s:i}, s:{s:I, s:I}, s:f, s:f, s:{s:I, s:I, s:I, s:I, s:I, s:I}}",
        "processes", procs, "procs_max", p->o.procs, "alive", alive, "busy", busy, "queue", "waiting",
        p->waiting, "max", p->o.queue, "memory", "used", (json_int_t)memory_used(p, -1), "cap",
        (json_int_t)p->o.memory, "idle_s", p->o.idle_s, "timeout_s", p->o.timeout_s, "counters", "requests",
        (json_int_t)st.requests, "rejected", (json_int_t)st.rejected, "evictions", (json_int_t)st.evictions,
        "cancels", (json_int_t)st.cancels, "failures", (json_int_t)st.failures, "loads",
        (json_int_t)st.loads);
    pthread_mutex_unlock(&p->mu);
    return out;
}

char *infer_pool_metrics(struct infer_pool *p)
{
    pthread_mutex_lock(&p->mu);
    int busy = 0, alive = 0;
    for (int i = 0; i < p->o.procs; i++) {
        busy += p->slots[i].state == SLOT_BUSY;
        alive += p->slots[i].pid > 0;
    }
    struct infer_pool_stats st = p->st;
    int waiting = p->waiting;
    int64_t used = memory_used(p, -1);
    pthread_mutex_unlock(&p->mu);
    size_t cap = 4096;
    char *out = malloc(cap);
    if (!out)
        return NULL;
    snprintf(
        out, cap,
        "# HELP ddpd_inference_processes Inference processes running, and those running a request.\n"
        "# TYPE ddpd_inference_processes gauge\n"
        "ddpd_inference_processes{state=\"alive\"} %d\nddpd_inference_processes{state=\"busy\"} %d\n"
        "# HELP ddpd_inference_queue Inference requests waiting for a process.\n"
        "# TYPE ddpd_inference_queue gauge\nddpd_inference_queue %d\n"
        "# HELP ddpd_inference_memory_bytes The loaded models' resident bytes (--infer-memory caps them).\n"
        "# TYPE ddpd_inference_memory_bytes gauge\nddpd_inference_memory_bytes %" PRId64 "\n"
        "# HELP ddpd_inference_requests_total Inference requests accepted.\n"
        "# TYPE ddpd_inference_requests_total counter\nddpd_inference_requests_total %llu\n"
        "# HELP ddpd_inference_rejected_total Inference requests refused with 503 (queue full, no GPU).\n"
        "# TYPE ddpd_inference_rejected_total counter\nddpd_inference_rejected_total %llu\n"
        "# HELP ddpd_inference_evictions_total Models unloaded for room, idleness or a deleted job.\n"
        "# TYPE ddpd_inference_evictions_total counter\nddpd_inference_evictions_total %llu\n"
        "# HELP ddpd_inference_cancels_total Inference requests whose client went away.\n"
        "# TYPE ddpd_inference_cancels_total counter\nddpd_inference_cancels_total %llu\n"
        "# HELP ddpd_inference_failures_total Inference processes that died or hung with a request.\n"
        "# TYPE ddpd_inference_failures_total counter\nddpd_inference_failures_total %llu\n"
        "# HELP ddpd_inference_loads_total Models loaded into an inference process.\n"
        "# TYPE ddpd_inference_loads_total counter\nddpd_inference_loads_total %llu\n",
        alive, busy, waiting, used, (unsigned long long)st.requests, (unsigned long long)st.rejected,
        (unsigned long long)st.evictions, (unsigned long long)st.cancels, (unsigned long long)st.failures,
        (unsigned long long)st.loads);
    return out;
}
