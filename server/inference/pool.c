/* pool.c — the inference pool (pool.h): the slots (one worker process each, and the model
 * it holds), the queue, the runner threads that speak the worker protocol
 * (docs/architecture.md, "How an inference request flows"), and the housekeeper thread
 * that expires waiting requests and ends idle or doomed models (and idle GPU models when
 * a job waits for a GPU).
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

#define HOUSEKEEP_S    0.25 /* the housekeeper's period: queue deadlines, idle and doomed models */
#define READ_SLICE_S   0.1  /* how often a running request looks whether its client has gone */
#define END_GRACE_S    2.0  /* EOF on stdin to SIGKILL, for a process that is ended */
#define FORGOTTEN      64   /* deleted jobs remembered, so a request racing the delete is refused */
#define SIZES          64   /* models whose resident bytes are remembered, for the room to make */
#define LOAD_MAX_BATCH 64   /* predict's batch bound, the load request's max_batch */
#define GPU_RETRY_S    5    /* Retry-After when no GPU is free */

enum slot_state { SLOT_FREE, SLOT_BUSY, SLOT_ENDING };

/* A request, queued or running. */
struct task {
    struct infer_key key;
    char *weights, *spec;
    json_t *request;
    char *upload; /* a file of the pool's folder, removed with the task; NULL: none */
    char op[16];  /* the request's "op", for the status */
    struct infer_sink sink;
    double deadline; /* monotonic: it must have started by then */
    struct task *next;
};

struct slot {
    int index;
    enum slot_state state;
    struct infer_proc proc; /* the owner's alone (see the file's comment) */
    /* Under mu: */
    pid_t pid;
    bool cuda_proc; /* its process was started on a GPU (gpu) */
    int gpu;        /* the GPU slot (super_gpu_take) it holds, -1 none */
    bool loaded;    /* it holds a model: key */
    bool doomed;    /* its job was deleted: end it, never give it a request */
    struct infer_key key;
    int64_t resident; /* the model's resident_bytes */
    double last_used; /* monotonic */
    double used_wall; /* the same, wall clock (status) */
    double loaded_wall;
    const char *op; /* the running request's op (points into its task), NULL when none */
    uint64_t served;
};

struct infer_pool {
    struct infer_pool_opts o;
    char *worker, *dir;
    pthread_mutex_t mu;
    pthread_cond_t cv;    /* runners: a task queued, a slot freed, stopping */
    pthread_cond_t hk_cv; /* the housekeeper: something to end, stopping */
    struct slot *slots;
    struct task *head, *tail;
    int waiting, running;
    pthread_t *threads;
    int nthreads;
    pthread_t hk;
    bool hk_started;
    bool stop;         /* infer_pool_stop: no new request, the running ones cancelled */
    bool stop_threads; /* infer_pool_free: the threads end */
    struct infer_pool_stats st;
    int64_t forgotten[FORGOTTEN];
    unsigned nforgotten;
    struct {
        struct infer_key key;
        int64_t bytes;
    } sizes[SIZES];
    unsigned nsizes;
    unsigned upload_seq;
};

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
    json_decref(t->request);
    free(t);
}

/* Answers and frees a task that never reached a slot. */
static void task_refuse(struct task *t, ddpd_err rc, const struct ddpd_error *err, int retry)
{
    t->sink.done(t->sink.ctx, rc, NULL, err, retry);
    task_free(t);
}

static bool task_gone(struct infer_pool *p, struct task *t)
{
    bool stop;
    pthread_mutex_lock(&p->mu);
    stop = p->stop;
    pthread_mutex_unlock(&p->mu);
    return stop || (t->sink.gone && t->sink.gone(t->sink.ctx));
}

/* "job 3's final model" / "job 3's checkpoint 40" into buf[cap], for messages. */
static const char *model_name(const struct infer_key *k, char *buf, size_t cap)
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
static void end_process(struct infer_pool *p, struct slot *s, double grace, char *why, size_t cap)
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
        end_process(p, s, END_GRACE_S, NULL, 0);
        pthread_mutex_lock(&p->mu);
        s->state = SLOT_FREE;
        p->st.evictions++;
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
}

/* ---- the worker protocol, on a runner thread that owns slot s -------------------------------- */

/* The request failed because slot s's process died (EOF, a failed write): reaped, its
 * model and GPU gone, the error names it. */
static ddpd_err proc_died(struct infer_pool *p, struct slot *s, const struct task *t, const char *doing,
                          struct ddpd_error *err)
{
    char why[128], name[96];
    pid_t pid = s->proc.pid;
    end_process(p, s, END_GRACE_S, why, sizeof why);
    pthread_mutex_lock(&p->mu);
    p->st.failures++;
    pthread_mutex_unlock(&p->mu);
    fprintf(stderr, "ddpd: inference process %d (pid %d) %s while %s %s\n", s->index, (int)pid, why, doing,
            model_name(&t->key, name, sizeof name));
    return ddpd_error_set(err, DDPD_EINFER, "",
                          "the inference process (pid %d) %s while %s %s; the next request starts a new one",
                          (int)pid, why, doing, name);
}

/* The request failed because slot s's process wrote nothing for timeout_s: killed. */
static ddpd_err proc_hung(struct infer_pool *p, struct slot *s, const struct task *t, const char *doing,
                          struct ddpd_error *err)
{
    char name[96];
    pid_t pid = s->proc.pid;
    end_process(p, s, 0, NULL, 0);
    pthread_mutex_lock(&p->mu);
    p->st.failures++;
    pthread_mutex_unlock(&p->mu);
    fprintf(stderr, "ddpd: inference process %d (pid %d) wrote nothing for %.0f s while %s %s: killed\n",
            s->index, (int)pid, p->o.timeout_s, doing, model_name(&t->key, name, sizeof name));
    return ddpd_error_set(
        err, DDPD_ETIMEOUT, "",
        "the inference process (pid %d) wrote nothing for %.0f s (--infer-timeout-s) while %s "
        "%s: it was killed; the next request starts a new one",
        (int)pid, p->o.timeout_s, doing, name);
}

/* The process answered something that is not a line of the protocol: it is out of step
 * with its pipe, so it is ended. */
static ddpd_err proc_garbage(struct infer_pool *p, struct slot *s, const char *what, struct ddpd_error *err)
{
    pid_t pid = s->proc.pid;
    end_process(p, s, 0, NULL, 0);
    pthread_mutex_lock(&p->mu);
    p->st.failures++;
    pthread_mutex_unlock(&p->mu);
    return ddpd_error_set(err, DDPD_EINFER, "", "the inference process (pid %d) %s; it was ended", (int)pid,
                          what);
}

/* A final line {"ok": false, "error": {...}} as the error it carries. */
static ddpd_err worker_error(json_t *line, struct ddpd_error *err)
{
    json_t *e = json_object_get(line, "error");
    const char *code = json_string_value(json_object_get(e, "code"));
    const char *path = json_string_value(json_object_get(e, "path"));
    const char *msg = json_string_value(json_object_get(e, "message"));
    ddpd_err rc;
    if (!code || !ddpd_err_from_code(code, &rc) || rc == DDPD_OK)
        return ddpd_error_set(err, DDPD_EINFER, path ? path : "", "the inference worker failed: %s%s%s",
                              code ? code : "", code ? ": " : "", msg ? msg : "(no message)");
    return ddpd_error_set(err, rc, path ? path : "", "%s", msg && msg[0] ? msg : ddpd_err_text(rc));
}

/* Reads slot s's next line as JSON by the silence deadline, sending `cancel` once the
 * client has gone (when `cancellable`). DDPD_OK with *out (a new reference: an object).
 * Otherwise the process is ended and err says why. */
static ddpd_err read_line(struct infer_pool *p, struct slot *s, struct task *t, const char *doing,
                          bool cancellable, bool *cancel_sent, json_t **out, struct ddpd_error *err)
{
    double silent_since = base_mono_s();
    for (;;) {
        /* Before every read, not only when the worker is quiet: tokens may come faster
         * than READ_SLICE_S. */
        if (cancellable && !*cancel_sent && task_gone(p, t)) {
            *cancel_sent = true;
            pthread_mutex_lock(&p->mu);
            p->st.cancels++;
            pthread_mutex_unlock(&p->mu);
            if (!infer__proc_send(&s->proc, "{\"op\":\"cancel\"}"))
                return proc_died(p, s, t, doing, err);
        }
        char *line = NULL;
        enum infer_read r = infer__proc_read(&s->proc, READ_SLICE_S, p->o.line_max, &line);
        if (r == INFER_READ_LINE) {
            json_error_t je;
            json_t *j = json_loads(line, JSON_REJECT_DUPLICATES, &je);
            if (!json_is_object(j)) {
                json_decref(j);
                char what[200];
                snprintf(what, sizeof what, "answered a line that is not a JSON object: %.80s", line);
                return proc_garbage(p, s, what, err);
            }
            *out = j;
            return DDPD_OK;
        }
        if (r == INFER_READ_EOF)
            return proc_died(p, s, t, doing, err);
        if (r == INFER_READ_TOOLONG) {
            proc_garbage(p, s, "answered too long a line", err);
            return ddpd_error_set(err, DDPD_ETOOBIG, "",
                                  "the answer was longer than %zu bytes, the most one may be (4 x "
                                  "--infer-max-bytes): ask for fewer samples at a time",
                                  p->o.line_max);
        }
        if (base_mono_s() - silent_since >= p->o.timeout_s)
            return proc_hung(p, s, t, doing, err);
    }
}

static int64_t remembered_size(struct infer_pool *p, const struct infer_key *k)
{
    for (unsigned i = 0; i < p->nsizes && i < SIZES; i++)
        if (infer__key_eq(&p->sizes[i].key, k))
            return p->sizes[i].bytes;
    return -1;
}

static void remember_size(struct infer_pool *p, const struct infer_key *k, int64_t bytes)
{
    for (unsigned i = 0; i < p->nsizes && i < SIZES; i++)
        if (infer__key_eq(&p->sizes[i].key, k)) {
            p->sizes[i].bytes = bytes;
            return;
        }
    unsigned i = p->nsizes++ % SIZES;
    p->sizes[i].key = *k;
    p->sizes[i].bytes = bytes;
}

/* Makes room for `need` more bytes beside the other loaded models (slot s's own model is
 * being replaced). */
static void make_room(struct infer_pool *p, struct slot *s, int64_t need)
{
    int victims[INFER_PROCS_MAX];
    pthread_mutex_lock(&p->mu);
    int n = mark_victims(p, s->index, need, victims);
    pthread_mutex_unlock(&p->mu);
    end_marked(p, victims, n);
}

/* Slot s holds t's model when this returns DDPD_OK: its process started (on a GPU it took
 * for a cuda model), the model loaded in it. */
static ddpd_err ensure_model(struct infer_pool *p, struct slot *s, struct task *t, int *retry,
                             struct ddpd_error *err)
{
    char name[96];
    model_name(&t->key, name, sizeof name);
    pthread_mutex_lock(&p->mu);
    bool have = s->loaded && infer__key_eq(&s->key, &t->key) && s->pid > 0;
    bool wrong_kind = s->pid > 0 && s->cuda_proc != t->key.cuda;
    pthread_mutex_unlock(&p->mu);
    if (have)
        return DDPD_OK;
    /* A GPU process ends with its model (its CUDA context and the GPU slot go with it); a
     * CPU process is not started again for a GPU. */
    if (wrong_kind)
        end_process(p, s, END_GRACE_S, NULL, 0);
    if (s->proc.pid == 0) {
        int gpu = -1;
        char device[SCHED_GPU_ID_MAX] = "", why[256] = "";
        if (t->key.cuda && !(p->o.super && super_gpu_take(p->o.super, t->key.job, &gpu, device, sizeof device,
                                                          why, sizeof why))) {
            pthread_mutex_lock(&p->mu);
            p->st.rejected++;
            pthread_mutex_unlock(&p->mu);
            *retry = GPU_RETRY_S;
            return ddpd_error_set(err, DDPD_EBUSY, "device", "%s",
                                  why[0] ? why : "device cuda: this server has no GPU for inference");
        }
        char log[PATH_MAX];
        snprintf(log, sizeof log, "%s/worker-%d.log", p->dir, s->index);
        ddpd_err rc = infer__proc_start(&s->proc, p->worker, log, gpu >= 0 ? device : NULL, p->o.nice, err);
        if (rc) {
            if (gpu >= 0)
                super_gpu_give(p->o.super, gpu);
            return rc;
        }
        pthread_mutex_lock(&p->mu);
        s->pid = s->proc.pid;
        s->cuda_proc = t->key.cuda;
        s->gpu = gpu;
        s->loaded = false;
        pthread_mutex_unlock(&p->mu);
    }

    /* Room first, as much as the model needed last time (else its file's size: its
     * parameters), so the load does not pass the cap by much. */
    struct stat sb;
    pthread_mutex_lock(&p->mu);
    int64_t need = remembered_size(p, &t->key);
    s->loaded = false; /* replaced: its bytes no longer count */
    s->resident = 0;
    pthread_mutex_unlock(&p->mu);
    if (need < 0)
        need = stat(t->weights, &sb) == 0 ? (int64_t)sb.st_size : 0;
    make_room(p, s, need);

    json_error_t je;
    json_t *spec = json_loads(t->spec, 0, &je);
    json_t *load =
        json_pack("{s:s, s:o, s:s, s:s, s:i}", "op", "load", "spec", spec ? spec : json_null(), "weights",
                  t->weights, "device", t->key.cuda ? "cuda" : "cpu", "max_batch", LOAD_MAX_BATCH);
    if (load && t->key.cuda)
        json_object_set_new(load, "gpu", json_integer(0)); /* the one device CUDA_VISIBLE_DEVICES shows */
    char *text = load ? json_dumps(load, JSON_COMPACT) : NULL;
    json_decref(load);
    if (!text)
        return ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory loading %s", name);
    bool sent = infer__proc_send(&s->proc, text);
    free(text);
    if (!sent)
        return proc_died(p, s, t, "loading", err);
    json_t *ans = NULL;
    bool no_cancel = false;
    ddpd_err rc = read_line(p, s, t, "loading", false, &no_cancel, &ans, err);
    if (rc)
        return rc;
    if (!json_is_true(json_object_get(ans, "ok"))) {
        rc = worker_error(ans, err);
        json_decref(ans);
        return rc;
    }
    json_t *rb = json_object_get(ans, "resident_bytes");
    int64_t resident = json_is_integer(rb) && json_integer_value(rb) >= 0 ? json_integer_value(rb) : need;
    json_decref(ans);
    if (resident > p->o.memory) {
        end_process(p, s, END_GRACE_S, NULL, 0);
        return ddpd_error_set(err, DDPD_EMODELSIZE, "",
                              "%s needs %" PRId64 " bytes loaded, more than the %" PRId64
                              " bytes of --infer-memory for all loaded models together",
                              name, resident, p->o.memory);
    }
    pthread_mutex_lock(&p->mu);
    s->loaded = true;
    s->key = t->key;
    s->resident = resident;
    s->loaded_wall = base_wall_s();
    remember_size(p, &t->key, resident);
    p->st.loads++;
    pthread_mutex_unlock(&p->mu);
    make_room(p, s, resident); /* what it really took, beside the others */
    return DDPD_OK;
}

/* Runs t's request on slot s (which holds its model): its stream lines to the sink, its
 * final answer into *answer (a new reference). */
static ddpd_err exchange(struct infer_pool *p, struct slot *s, struct task *t, json_t **answer,
                         struct ddpd_error *err)
{
    char *text = json_dumps(t->request, JSON_COMPACT);
    if (!text)
        return ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory encoding the request");
    bool sent = infer__proc_send(&s->proc, text);
    free(text);
    if (!sent)
        return proc_died(p, s, t, "running a request on", err);
    bool cancel_sent = false;
    for (;;) {
        json_t *line = NULL;
        ddpd_err rc = read_line(p, s, t, "running a request on", true, &cancel_sent, &line, err);
        if (rc)
            return rc;
        json_t *ok = json_object_get(line, "ok");
        if (!ok) {
            if (t->sink.line)
                t->sink.line(t->sink.ctx, line);
            json_decref(line);
            continue;
        }
        if (!json_is_true(ok)) {
            rc = worker_error(line, err);
            json_decref(line);
            return rc;
        }
        json_object_del(line, "ok");
        json_object_del(line, "op");
        *answer = line;
        return DDPD_OK;
    }
}

/* The request is done with slot s: it is free again, unless its job was deleted (then
 * it is ended) or the models are over the cap (the least recently used idle ones go).
 * Marks what to end into out[]; returns how many. */
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
    if (task_gone(p, t)) {
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
        rc = ensure_model(p, s, t, &retry, &err);
    if (rc == DDPD_OK)
        rc = exchange(p, s, t, &answer, &err);
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
        end_process(p, &p->slots[i], END_GRACE_S, NULL, 0);
    pthread_cond_destroy(&p->hk_cv);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p->threads);
    free(p->slots);
    free(p->worker);
    free(p->dir);
    free(p);
}

ddpd_err infer_pool_submit(struct infer_pool *p, const struct infer_model *m, json_t *request,
                           const char *upload, const struct infer_sink *sink, int *retry_after_s,
                           struct ddpd_error *err)
{
    *retry_after_s = 0;
    struct task *t = calloc(1, sizeof *t);
    ddpd_err rc = DDPD_OK;
    if (!t || !(t->weights = strdup(m->weights)) || !(t->spec = strdup(m->spec)) ||
        (upload && !(t->upload = strdup(upload)))) {
        if (t) {
            free(t->weights);
            free(t->spec);
        }
        free(t);
        json_decref(request);
        return ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory queueing the request");
    }
    t->key = (struct infer_key){.job = m->job, .step = m->step < 0 ? -1 : m->step, .cuda = m->cuda};
    t->request = request;
    t->sink = *sink;
    t->deadline = base_mono_s() + p->o.timeout_s;
    const char *op = json_string_value(json_object_get(request, "op"));
    snprintf(t->op, sizeof t->op, "%s", op ? op : "?");

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
