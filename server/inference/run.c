/* run.c — one request on one slot of the inference pool, on the runner thread that owns
 * the slot (pool_impl.h): the worker's process started (with a GPU slot for a cuda model),
 * its model loaded after room was made, the request sent, its token lines passed to the
 * sink and `cancel` sent once the client has gone, the final line read; every read has
 * the silence deadline --infer-timeout-s. A worker that dies, hangs or answers out of
 * protocol is ended and the error names it; the slot starts a new process next time. */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../../base/clock.h"
#include "../sched.h"
#include "../super.h"
#include "pool_impl.h"

/* The request failed because slot s's process died (EOF, a failed write): reaped, its
 * model and GPU gone, the error names it. */
static ddpd_err proc_died(struct infer_pool *p, struct slot *s, const struct task *t, const char *doing,
                          struct ddpd_error *err)
{
    char why[128], name[96];
    pid_t pid = s->proc.pid;
    infer__end_process(p, s, END_GRACE_S, why, sizeof why);
    pthread_mutex_lock(&p->mu);
    p->st.failures++;
    pthread_mutex_unlock(&p->mu);
    fprintf(stderr, "ddpd: inference process %d (pid %d) %s while %s %s\n", s->index, (int)pid, why, doing,
            infer__model_name(&t->key, name, sizeof name));
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
    infer__end_process(p, s, 0, NULL, 0);
    pthread_mutex_lock(&p->mu);
    p->st.failures++;
    pthread_mutex_unlock(&p->mu);
    fprintf(stderr, "ddpd: inference process %d (pid %d) wrote nothing for %.0f s while %s %s: killed\n",
            s->index, (int)pid, p->o.timeout_s, doing, infer__model_name(&t->key, name, sizeof name));
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
    infer__end_process(p, s, 0, NULL, 0);
    pthread_mutex_lock(&p->mu);
    p->st.failures++;
    pthread_mutex_unlock(&p->mu);
    fprintf(stderr, "ddpd: inference process %d (pid %d) %s: ended\n", s->index, (int)pid, what);
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
        if (cancellable && !*cancel_sent && infer__task_gone(p, t)) {
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
            /* A byte vocabulary's token 0 is the text "\u0000": allowed, and passed on so. */
            json_t *j = json_loads(line, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &je);
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

/* Slot s holds t's model when this returns DDPD_OK: its process started (on a GPU it took
 * for a cuda model), the model loaded in it. */
ddpd_err infer__ensure_model(struct infer_pool *p, struct slot *s, struct task *t, int *retry,
                             struct ddpd_error *err)
{
    char name[96];
    infer__model_name(&t->key, name, sizeof name);
    pthread_mutex_lock(&p->mu);
    bool have = s->loaded && infer__key_eq(&s->key, &t->key) && s->pid > 0;
    bool wrong_kind = s->pid > 0 && s->cuda_proc != t->key.cuda;
    pthread_mutex_unlock(&p->mu);
    if (have)
        return DDPD_OK;
    /* A GPU process ends with its model (its CUDA context and the GPU slot go with it); a
     * CPU process is not started again for a GPU. */
    if (wrong_kind)
        infer__end_process(p, s, END_GRACE_S, NULL, 0);
    if (s->proc.pid == 0) {
        int gpu = -1;
        char device[SCHED_GPU_ID_MAX] = "", why[256] = "";
        int took = !t->key.cuda ? 1
                   : p->o.super
                       ? super_gpu_take(p->o.super, t->key.job, &gpu, device, sizeof device, why, sizeof why)
                       : -1;
        if (took < 0) /* never: the request's mistake */
            return ddpd_error_set(err, DDPD_ESPEC, "device", "%s",
                                  why[0] ? why : "device cuda: this server has no GPU for inference");
        if (took == 0) { /* not now: 503, retry */
            pthread_mutex_lock(&p->mu);
            p->st.rejected++;
            pthread_mutex_unlock(&p->mu);
            *retry = GPU_RETRY_S;
            return ddpd_error_set(err, DDPD_EBUSY, "device", "%s", why);
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
    infer__make_room(p, s, need);

    json_error_t je;
    json_t *spec = json_loads(t->spec, 0, &je);
    json_t *load =
        json_pack("{s:s, s:o, s:s, s:s, s:i}", "op", "load", "spec", spec ? spec : json_null(), "weights",
                  t->weights, "device", t->key.cuda ? "cuda" : "cpu", "max_batch", LOAD_MAX_BATCH);
    if (load && t->key.cuda)
        json_object_set_new(load, "gpu", json_integer(0)); /* the one device CUDA_VISIBLE_DEVICES shows */
    if (load && t->data_dir)                               /* where the spec's tokenizer files are */
        json_object_set_new(load, "data_dir", json_string(t->data_dir));
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
        infer__end_process(p, s, END_GRACE_S, NULL, 0);
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
    infer__make_room(p, s, resident); /* what it really took, beside the others */
    return DDPD_OK;
}

/* Runs t's request on slot s (which holds its model): its stream lines to the sink, its
 * final answer into *answer (a new reference). */
ddpd_err infer__exchange(struct infer_pool *p, struct slot *s, struct task *t, json_t **answer,
                         struct ddpd_error *err)
{
    if (!infer__proc_send(&s->proc, t->request))
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
