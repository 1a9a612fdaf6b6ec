/* api.c — the /v1 handlers. Each validates what the client sent (errors name the JSON
 * path or the query parameter), reads the store for answers, and hands job changes to
 * the supervisor. Event streams are stream.h's: the history paged from the store as the
 * client reads it, then the hub's live events. */
#include "api.h"
#include "api_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../base/parse.h"
#include "../schema/jobdir.h"
#include "../schema/jobdoc.h"
#include "../schema/spec.h"
#include "http.h"
#include "hub.h"
#include "launch.h"
#include "planner.h"
#include "store.h"
#include "stream.h"
#include "super.h"

/* The rendered-job cache's size (see job_cache_respond). */
#define JOB_CACHE_SLOTS 256

struct job_cache_slot {
    pthread_mutex_t mu;
    int64_t id; /* 0 = empty */
    uint64_t version;
    char *text; /* with its trailing newline */
    size_t len;
};

struct api {
    struct store *store;
    struct hub *hub;
    struct super *super;
    struct http_server *http; /* for /metrics; set by api_set_http after the server starts */
    const char *worker, *data_dir, *jobs_dir, *web_dir;
    int64_t max_rank_memory;
    double plan_timeout_s;   /* see PLAN_TIMEOUT_S */
    struct planner *planner; /* ddpd-worker --plan processes for the submission check */
    struct streams *streams; /* the event streams and their heartbeats */
    struct job_cache_slot job_cache[JOB_CACHE_SLOTS];
};

static struct api *ctx_of(struct http_request *req)
{
    return http_request_ctx(req);
}

static json_t *num_or_null(bool has, double v)
{
    return has && isfinite(v) ? json_real(v) : json_null();
}
static json_t *time_or_null(double t)
{
    return t > 0 ? json_real(t) : json_null();
}

/* `in` with the server's folders written as a client knows them: a path in the data
 * directory relative to it ("x.npy"), one in the jobs folder as "jobs/3/ckpt-40". A
 * rank's error names the files it opened by their full path (the worker knows no
 * better); an API client has no use for the server's layout. Cut to out[cap]. */
static void relative_paths(const struct api *a, const char *in, char *out, size_t cap)
{
    const char *dirs[2] = {a->data_dir, a->jobs_dir}, *as[2] = {"", JOBDIR_JOBS "/"};
    size_t n = 0;
    while (*in && n + 1 < cap) {
        bool cut = false;
        for (int d = 0; d < 2 && !cut; d++) {
            size_t len = dirs[d] ? strlen(dirs[d]) : 0;
            /* The folder itself, followed by '/', at the start of a word. */
            if (len > 1 && !strncmp(in, dirs[d], len) && in[len] == '/' &&
                (n == 0 || out[n - 1] == ' ' || out[n - 1] == '(' || out[n - 1] == '"' ||
                 out[n - 1] == '\'')) {
                size_t k = strlen(as[d]);
                if (n + k + 1 >= cap)
                    break;
                memcpy(out + n, as[d], k);
                n += k;
                in += len + 1;
                cut = true;
            }
        }
        if (!cut)
            out[n++] = *in++;
    }
    out[n] = '\0';
}

/* A job as CONTRACT.md §7 shows it, without its spec (job_text adds it). A queued job's
 * pending reason is the scheduler's of now (super_pending_reason), else the stored one. */
static json_t *job_json(struct api *a, const struct store_job *j)
{
    char live[STORE_TEXT_MAX];
    const char *why = j->state == JOB_STATE_QUEUED && super_pending_reason(a->super, j->id, live, sizeof live)
                          ? live
                          : j->pending_reason;
    json_t *o = json_object();
    json_object_set_new(o, "id", json_integer(j->id));
    json_object_set_new(o, "name", json_string(j->name));
    json_object_set_new(o, "state", json_string(job_state_name(j->state)));
    json_object_set_new(o, "world_size", json_integer(j->world_size));
    json_object_set_new(o, "device", json_string(device_kind_name(j->device)));
    json_object_set_new(o, "created_at", json_real(j->created_at));
    json_object_set_new(o, "started_at", time_or_null(j->started_at));
    json_object_set_new(o, "finished_at", time_or_null(j->finished_at));
    json_object_set_new(o, "attempt", json_integer(j->attempt));
    json_object_set_new(o, "restarts", json_integer(j->restarts));
    json_object_set_new(o, "step", j->has_progress ? json_integer(j->step) : json_null());
    json_object_set_new(o, "loss", num_or_null(j->has_progress && j->loss_finite, j->loss));
    /* A step with a null loss: it was NaN or infinite (the store keeps no non-finite
     * number), which the dashboard marks. */
    if (j->has_progress && !j->loss_finite)
        json_object_set_new(o, "loss_nonfinite", json_true());
    char shown[STORE_TEXT_MAX];
    relative_paths(a, j->error, shown, sizeof shown);
    json_object_set_new(o, "error", j->error[0] ? json_string(shown) : json_null());
    /* Why the job was restarted, oldest first (store.h); its error is only a final one. */
    json_t *hist = j->restart_history ? json_loads(j->restart_history, 0, NULL) : NULL;
    json_object_set_new(o, "restart_history", json_is_array(hist) ? hist : (json_decref(hist), json_array()));
    json_object_set_new(o, "pending_reason", why[0] ? json_string(why) : json_null());
    /* A job made by POST /v1/jobs/{id}/resume: the job and the checkpoint's step it continues. */
    json_object_set_new(o, "total_steps", j->total_steps > 0 ? json_integer(j->total_steps) : json_null());
    json_object_set_new(o, "resumed_from", j->resumed_from > 0 ? json_integer(j->resumed_from) : json_null());
    json_object_set_new(o, "resumed_from_step",
                        j->resumed_from > 0 ? json_integer(j->resume_step) : json_null());
    json_t *ranks = json_array();
    for (size_t i = 0; i < j->n_ranks; i++) {
        const struct store_rank *r = &j->ranks[i];
        json_t *jr = json_object();
        json_object_set_new(jr, "rank", json_integer(r->rank));
        json_object_set_new(jr, "pid", r->pid ? json_integer(r->pid) : json_null());
        json_object_set_new(jr, "state", json_string(r->state));
        json_object_set_new(jr, "exit_code", r->has_exit_code ? json_integer(r->exit_code) : json_null());
        json_object_set_new(jr, "step", r->has_progress ? json_integer(r->step) : json_null());
        json_object_set_new(jr, "loss", num_or_null(r->has_progress && r->loss_finite, r->loss));
        if (r->has_progress && !r->loss_finite)
            json_object_set_new(jr, "loss_nonfinite", json_true());
        json_object_set_new(jr, "samples_per_s", num_or_null(r->has_progress, r->samples_per_s));
        json_array_append_new(ranks, jr);
    }
    json_object_set_new(o, "ranks", ranks);
    return o;
}

/* A job's JSON text (NUL-terminated, malloc'd, *len bytes): job_json's object with the
 * stored spec spliced in as its last member. The stored text is spec_to_json's compact
 * output, valid JSON by the store's CHECK; parsing it back and dumping it again was most
 * of the time of a GET. */
static char *job_text(struct api *a, const struct store_job *j, size_t *len)
{
    json_t *o = job_json(a, j);
    char *head = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (!head)
        return NULL;
    const char *spec = j->spec ? j->spec : "null";
    size_t hn = strlen(head), sn = strlen(spec);
    char *t = malloc(hn + sn + 16);
    if (t) {
        /* head is "{...}": drop its '}' and append ,"spec":SPEC} */
        memcpy(t, head, hn - 1);
        static const char key[] = ",\"spec\":";
        size_t n = sizeof key - 1;
        memcpy(t + hn - 1, key, n);
        memcpy(t + hn - 1 + n, spec, sn);
        *len = hn - 1 + n + sn;
        t[(*len)++] = '}';
        t[*len] = '\0';
    }
    free(head);
    return t;
}

static ddpd_err respond_job(struct http_request *req, int status, const struct store_job *j)
{
    size_t len;
    char *t = job_text(ctx_of(req), j, &len);
    if (!t)
        return DDPD_ENOMEM;
    t[len] = '\n'; /* every JSON answer ends with a newline */
    ddpd_err rc = http_respond_bytes(req, status, "application/json", t, len + 1);
    free(t);
    return rc;
}

/* ---- the rendered-job cache --------------------------------------------------------------
 * GET /v1/jobs/{id} is what dashboards and scripts poll. Its answer is kept per job with
 * the store's version of the job (store_job_version, read before the store is), so a
 * repeated GET of an unchanged job costs a lock and a copy, not two queries and a render. */

static void job_cache_init(struct api *a)
{
    for (int i = 0; i < JOB_CACHE_SLOTS; i++)
        pthread_mutex_init(&a->job_cache[i].mu, NULL);
}

static void job_cache_clear(struct api *a)
{
    for (int i = 0; i < JOB_CACHE_SLOTS; i++) {
        free(a->job_cache[i].text);
        a->job_cache[i].text = NULL;
        a->job_cache[i].id = 0;
        pthread_mutex_destroy(&a->job_cache[i].mu);
    }
}

static struct job_cache_slot *job_cache_slot(struct api *a, int64_t id)
{
    return &a->job_cache[(uint64_t)id % JOB_CACHE_SLOTS];
}

/* Answers from the cache when it holds `id` at `version`; false when it does not. */
static bool job_cache_respond(struct http_request *req, int64_t id, uint64_t version, ddpd_err *rc)
{
    struct job_cache_slot *c = job_cache_slot(ctx_of(req), id);
    bool hit = false;
    pthread_mutex_lock(&c->mu);
    if (c->text && c->id == id && c->version == version) {
        *rc = http_respond_bytes(req, 200, "application/json", c->text, c->len);
        hit = true;
    }
    pthread_mutex_unlock(&c->mu);
    return hit;
}

/* Keeps `text` (taken) as job id's answer at `version`. */
static void job_cache_put(struct api *a, int64_t id, uint64_t version, char *text, size_t len)
{
    struct job_cache_slot *c = job_cache_slot(a, id);
    pthread_mutex_lock(&c->mu);
    char *old = c->text;
    c->id = id;
    c->version = version;
    c->text = text;
    c->len = len;
    pthread_mutex_unlock(&c->mu);
    free(old);
}

static ddpd_err get_job(struct http_request *req, struct store_job *j, struct ddpd_error *err)
{
    memset(j, 0, sizeof *j);
    return store_job_get(ctx_of(req)->store, http_request_id(req, 0), j, err);
}

ddpd_err api__get_job(struct http_request *req, struct store_job *j, struct ddpd_error *err)
{
    return get_job(req, j, err);
}

/* ---- POST /v1/jobs ---------------------------------------------------------------------- */

/* A job between its validation and its commit. */
struct submission {
    struct http_request *req;
    struct api *a;
    char *text; /* the spec as stored; the supervisor's once stored */
    char name[STORE_NAME_MAX];
};

/* 201 with the job just stored and its Location; the job is stored whatever this returns,
 * so a failure's text (in *e) says so. */
static ddpd_err respond_created(struct http_request *req, const struct store_job *j, struct ddpd_error *e)
{
    char loc[64];
    snprintf(loc, sizeof loc, "/v1/jobs/%" PRId64, j->id);
    http_response_header(req, "Location", loc);
    ddpd_err rc = respond_job(req, 201, j);
    if (rc != DDPD_OK)
        ddpd_error_set(e, rc, "", "out of memory answering for job %" PRId64 " (it is stored)", j->id);
    return rc;
}

/* The store's inserter thread, after the commit: the answer, then the supervisor. */
static void submitted(void *ctx, ddpd_err rc, const struct store_job *j, const struct ddpd_error *err)
{
    struct submission *sub = ctx;
    struct http_request *req = sub->req;
    if (rc != DDPD_OK) {
        http_deferred_done(req, rc, err);
        free(sub->text);
        free(sub);
        return;
    }
    struct ddpd_error e;
    ddpd_err r = respond_created(req, j, &e);
    super_submit(sub->a->super, j->id, sub->text, j->world_size, j->device, j->max_restarts, j->created_at);
    http_deferred_done(req, r, &e);
    free(sub);
}

/* The optimizer steps a job takes in all, as the ranks count them (train.c): the spec's
 * steps, or epochs times the steps per epoch of the rank with the most batches; 0 when
 * the counts are not known (only the ranks can tell) or it does not fit. */
static int64_t total_steps(const struct spec *spec, const int64_t *counts, bool known)
{
    if (spec->steps > 0)
        return spec->steps;
    if (!known || spec->epochs <= 0 || spec->grad_accum <= 0)
        return 0;
    int64_t most = 0, total;
    for (int r = 0; r < spec->world_size; r++)
        most = counts[r] > most ? counts[r] : most;
    int64_t per_epoch = most / spec->grad_accum + (most % spec->grad_accum != 0);
    return per_epoch > 0 && !__builtin_mul_overflow(spec->epochs, per_epoch, &total) ? total : 0;
}

/* The rest of a submission once its data counts are known (on the HTTP thread for
 * synthetic data, on a planner thread otherwise): the join check, then the insert, whose
 * commit answers the deferred request (submitted). Returns an error to answer with
 * instead; then nothing was queued. */
static ddpd_err submit_checked(struct http_request *req, struct api *a, const struct spec *spec,
                               const int64_t *counts, bool known, struct ddpd_error *err)
{
    ddpd_err rc;
    if (known && (rc = spec_check_batch_counts(spec, counts, err)))
        return rc;

    struct submission *sub = calloc(1, sizeof *sub);
    if (!sub || !(sub->text = spec_dumps(spec))) {
        free(sub);
        return ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory storing the job");
    }
    sub->req = req;
    sub->a = a;
    _Static_assert(sizeof sub->name == sizeof spec->name, "a spec's name fits the store's");
    memcpy(sub->name, spec->name, sizeof sub->name);
    /* Answered once the insert's group is committed: under load one commit serves many
     * submissions, and no HTTP thread waits for it. */
    struct store_job_new jn = {.name = sub->name,
                               .spec = sub->text,
                               .world_size = spec->world_size,
                               .device = spec->device,
                               .max_restarts = spec->max_restarts,
                               .total_steps = total_steps(spec, counts, known),
                               .queued_event = true};
    store_job_insert_async(a->store, &jn, submitted, sub);
    return DDPD_OK;
}

/* A submission waiting for its data check. */
struct planning {
    struct http_request *req; /* deferred */
    struct api *a;
    struct spec spec;
};

/* The planner's answer, on a planner thread. */
static void planned(void *ctx, ddpd_err rc, const int64_t *counts, bool known, const struct ddpd_error *perr)
{
    struct planning *pl = ctx;
    struct ddpd_error err;
    if (rc != DDPD_OK) {
        err = *perr;
        /* A data error's answer has no path: the data, or the eval data that the
         * worker's message names (train_check_eval_data). */
        if ((rc == DDPD_EDATA || rc == DDPD_ESPEC) && !err.path[0])
            snprintf(err.path, sizeof err.path, "%s",
                     strncmp(err.message, "eval.data: ", 11) == 0 ? "eval.data" : "data");
    } else {
        rc = submit_checked(pl->req, pl->a, &pl->spec, counts, known, &err);
    }
    if (rc != DDPD_OK)
        http_deferred_done(pl->req, rc, &err);
    free(pl);
}

_Static_assert(SPEC_MAX_WORLD <= PLAN_MAX_WORLD, "the planner takes every world size a spec allows");

/* The data check's deadline: a data file that blocks on open holds a planner process
 * (never an HTTP thread) this long. DDPD_PLAN_TIMEOUT_S (seconds, 1-3600) changes it, for
 * tests of that case. */
#define PLAN_TIMEOUT_S 30.0

/* "5, 10, 15" (the newest few when there are many) into buf[cap]; "none" for no steps. */
static void steps_text(const int64_t *steps, size_t n, char *buf, size_t cap);

/* `code` at `path`: "<prefix>job ID has no checkpoint at step STEP; it has steps 5, 10"
 * (or "step 5", or "none"), the steps read from the job's folder `dir`. */
static ddpd_err no_checkpoint_at(struct ddpd_error *err, ddpd_err code, const char *path, const char *prefix,
                                 const char *dir, int64_t id, int64_t step)
{
    int64_t *steps;
    size_t n;
    char list[256];
    if (!jobdir_ckpt_list(dir, &steps, &n))
        return ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory listing the checkpoints");
    steps_text(steps, n, list, sizeof list);
    free(steps);
    return ddpd_error_set(err, code, path,
                          "%sjob %" PRId64 " has no checkpoint at step %" PRId64 "; it has %s%s", prefix, id,
                          step, n ? (n > 1 ? "steps " : "step ") : "", list);
}

/* init.from_job (and init.step) to the weights' path in the jobs folder, or a 422 naming
 * the key: no such job, no such checkpoint (naming the steps there are), no weights yet. */
static ddpd_err resolve_init_job(struct api *a, const struct spec *spec, char *path, size_t cap,
                                 struct ddpd_error *err)
{
    int64_t src = spec->init_from_job, step = spec->init_from_step;
    struct store_job j;
    memset(&j, 0, sizeof j);
    ddpd_err rc = store_job_get(a->store, src, &j, err);
    job_state st = j.state;
    store_job_clear(&j);
    if (rc == DDPD_ENOTFOUND)
        return ddpd_error_set(err, DDPD_ESPEC, "init.from_job", "init.from_job: there is no job %" PRId64,
                              src);
    if (rc)
        return rc;
    char dir[PATH_MAX];
    jobdir_job_path(dir, sizeof dir, a->jobs_dir, src);
    if (jobdir_init_weights(dir, step, path, cap))
        return DDPD_OK;
    if (step >= 0)
        return no_checkpoint_at(err, DDPD_ESPEC, "init.step", "init.step: ", dir, src, step);
    return ddpd_error_set(err, DDPD_ESPEC, "init.from_job",
                          "init.from_job: job %" PRId64
                          " (%s) has no weights yet: no final model and no checkpoint",
                          src, job_state_name(st));
}

/* The planner's request: the job's document (jobdoc.h) without a rank, a group or an
 * out_dir; for a resume, the checkpoint `resume` (NULL: none) to check the data against.
 * NULL when out of memory, or when `resume` does not fit the document (a jobs folder too
 * deep: the supervisor would fail it too). */
static json_t *plan_doc(const struct api *a, const struct spec *spec, const char *init_path,
                        const char *resume, bool force)
{
    struct jobdoc *preq = calloc(1, sizeof *preq); /* ~106 KiB: not on an HTTP thread's stack */
    json_t *doc = NULL;
    if (!preq)
        return NULL;
    preq->world_size = spec->world_size;
    preq->rank = -1;
    preq->spec = *spec;
    preq->max_rank_memory = a->max_rank_memory;
    preq->resume_force = force;
    snprintf(preq->data_dir, sizeof preq->data_dir, "%s", a->data_dir);
    snprintf(preq->init_path, sizeof preq->init_path, "%s", init_path);
    if (!resume || snprintf(preq->resume, sizeof preq->resume, "%s", resume) < (int)sizeof preq->resume)
        doc = jobdoc_to_json(preq);
    free(preq);
    return doc;
}

static ddpd_err h_submit(struct http_request *req, struct ddpd_error *err)
{
    struct api *a = ctx_of(req);
    json_t *body = http_request_json(req);
    struct spec_parse_opts po = {.default_device = super_default_device(a->super)};
    struct planning *pl = calloc(1, sizeof *pl);
    if (!pl)
        return ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory checking the job");
    struct spec *spec = &pl->spec;
    ddpd_err rc = spec_from_json(body, &po, spec, err);
    char why[512];
    const char *blame;
    if (rc == DDPD_OK && !super_fits(a->super, spec->device, spec->world_size, why, sizeof why, &blame))
        rc = ddpd_error_set(err, DDPD_ESPEC, blame, "%s", why);
    if (rc)
        goto out;

    /* init.from_job: another job of this server, whose weights lie in its jobs folder. The
     * path is the server's own (never one from the spec), for the planner to check the
     * tensors' names and shapes against the model as it checks init.from. */
    char init_path[PATH_MAX] = "";
    if (spec->init_from_job > 0 && (rc = resolve_init_job(a, spec, init_path, sizeof init_path, err)))
        goto out;

    /* The data must be readable and, with join false, even, and a rank must fit in memory.
     * Synthetic data (and eval.data) has nothing to read: its counts follow from the spec, here. Files are
     * the planner's to read, on its own threads and processes: nothing that can block on a file runs here. */
    if (spec->data.kind == DATA_SYNTHETIC && !spec->init_from[0] && !spec->init_from_job &&
        (spec->eval.every_steps <= 0 || spec->eval.data.kind == DATA_SYNTHETIC)) {
        /* The memory a rank needs follows from the spec too (the planner checks it
         * against the same limit where there are files, or an init.from to check). */
        struct spec_memory mem;
        spec_memory_estimate(
            spec, &(struct spec_memory_in){.rows = spec->data.samples, .eval_rows = spec->eval.data.samples},
            &mem);
        if ((rc = spec_memory_check(spec, &mem, a->max_rank_memory, "the server's --max-rank-memory",
                                    DDPD_ESPEC, err)))
            goto out;
        int64_t counts[SPEC_MAX_WORLD];
        for (int r = 0; r < spec->world_size; r++)
            counts[r] = spec_batches(spec_shard_rows(spec->data.samples, r, spec->world_size),
                                     spec->batch_size, spec->data.drop_last);
        /* Deferred first: the insert may answer before submit_checked returns. */
        http_defer(req);
        if ((rc = submit_checked(req, a, spec, counts, true, err)))
            http_deferred_done(req, rc, err);
        free(pl);
        return DDPD_OK;
    }
    json_t *doc = plan_doc(a, spec, init_path, NULL, false);
    if (!doc) {
        rc = ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory checking the job's data");
        goto out;
    }
    pl->req = req;
    pl->a = a;
    http_defer(req);
    if ((rc = planner_plan_async(a->planner, doc, spec->world_size, a->plan_timeout_s, planned, pl, err))) {
        /* Nothing queued: answer the deferred request with the error now. */
        http_deferred_done(req, rc, err);
        return DDPD_OK;
    }
    return DDPD_OK; /* pl is the planner's now */
out:
    free(pl);
    return rc;
}

/* ---- GET /v1/jobs, /v1/jobs/{id}, cancel, delete ------------------------------------------ */

static ddpd_err h_list(struct http_request *req, struct ddpd_error *err)
{
    struct api *a = ctx_of(req);
    struct store_job_query q = {.with_spec = true, .with_ranks = false};
    int64_t limit, before;
    ddpd_err rc;
    if ((rc = http_query_int(req, "limit", 1, STORE_LIST_MAX, 50, &limit, err)) ||
        (rc = http_query_int(req, "before", 1, INT64_MAX, 0, &before, err)))
        return rc;
    const char *state = http_query(req, "state");
    if (state && state[0]) {
        /* A comma-separated list of states. */
        char buf[256];
        snprintf(buf, sizeof buf, "%s", state);
        for (char *save, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            job_state st;
            if (!job_state_parse(t, &st))
                return http_query_error(req, "state", err,
                                        "state: unknown state \"%s\" (queued, starting, running, succeeded, "
                                        "failed, cancelled)",
                                        t);
            q.states |= JOB_STATE_BIT(st);
        }
    }
    const char *name = http_query(req, "name");
    if (name && name[0]) {
        if (strlen(name) >= STORE_NAME_MAX)
            return http_query_error(req, "name", err, "name: longer than a job's name can be (%d bytes)",
                                    STORE_NAME_MAX - 1);
        q.name = name;
    }
    q.limit = (int)limit;
    q.before = before;
    struct store_job_list l;
    if ((rc = store_job_list(a->store, &q, &l, err)))
        return rc;
    /* {"jobs":[JOB,...],"next":"N"|null}, each JOB rendered as job_text does. */
    size_t cap = 64 + l.n * 1024, len = 0;
    char *out = malloc(cap);
    rc = out ? DDPD_OK : DDPD_ENOMEM;
    if (out)
        len = (size_t)snprintf(out, cap, "{\"jobs\":[");
    for (size_t i = 0; rc == DDPD_OK && i < l.n; i++) {
        size_t n;
        char *t = job_text(a, &l.jobs[i], &n);
        char *grown = t && len + n + 64 > cap ? realloc(out, cap = 2 * (len + n + 64)) : out;
        if (!t || !grown) {
            rc = DDPD_ENOMEM;
        } else {
            out = grown;
            if (i)
                out[len++] = ',';
            memcpy(out + len, t, n);
            len += n;
        }
        free(t);
    }
    if (rc == DDPD_OK) {
        if (l.next)
            len += (size_t)snprintf(out + len, cap - len, "],\"next\":\"%" PRId64 "\"}\n", l.next);
        else
            len += (size_t)snprintf(out + len, cap - len, "],\"next\":null}\n");
        rc = http_respond_bytes(req, 200, "application/json", out, len);
    }
    free(out);
    store_job_list_free(&l);
    return rc;
}

static ddpd_err h_get(struct http_request *req, struct ddpd_error *err)
{
    struct api *a = ctx_of(req);
    int64_t id = http_request_id(req, 0);
    uint64_t version = store_job_version(a->store, id); /* before the read: see store.h */
    ddpd_err rc;
    if (job_cache_respond(req, id, version, &rc))
        return rc;
    struct store_job j;
    if ((rc = get_job(req, &j, err)))
        return rc;
    size_t len;
    char *t = job_text(a, &j, &len);
    bool queued = j.state == JOB_STATE_QUEUED;
    store_job_clear(&j);
    if (!t)
        return DDPD_ENOMEM;
    t[len++] = '\n';
    rc = http_respond_bytes(req, 200, "application/json", t, len);
    if (queued) /* its pending reason changes without the store */
        free(t);
    else
        job_cache_put(a, id, version, t, len);
    return rc;
}

static ddpd_err h_cancel(struct http_request *req, struct ddpd_error *err)
{
    ddpd_err rc = super_cancel(ctx_of(req)->super, http_request_id(req, 0), err);
    return rc ? rc : http_respond_empty(req, 202);
}

static ddpd_err h_delete(struct http_request *req, struct ddpd_error *err)
{
    /* The supervisor deletes: between two turns of its loop no end of the job is half
     * stored or published. */
    ddpd_err rc = super_delete(ctx_of(req)->super, http_request_id(req, 0), err);
    return rc ? rc : http_respond_empty(req, 204);
}

/* "5, 10, 15" (the newest few when there are many) into buf[cap]; "none" for no steps. */
static void steps_text(const int64_t *steps, size_t n, char *buf, size_t cap)
{
    size_t first = n > 8 ? n - 8 : 0, len = 0;
    buf[0] = '\0';
    if (!n)
        snprintf(buf, cap, "none");
    if (first)
        len += (size_t)snprintf(buf, cap, "... ");
    for (size_t i = first; i < n && len < cap; i++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%" PRId64, i > first ? ", " : "", steps[i]);
}

/* ---- POST /v1/jobs/{id}/resume ----------------------------------------------------------------- */

/* A resumed job between its checks and its commit. */
struct resumption {
    struct http_request *req;
    struct api *a;
    struct store_job j; /* the job resumed; the new one's spec and name are its */
    int64_t step;       /* the checkpoint's */
    bool force;         /* ?force=true: even on data changed since the checkpoint */
    struct spec spec;   /* j's spec, parsed: the planner's counts give its total steps */
};

/* The inserter thread, after the commit: the answer, then the supervisor, which reads the
 * job back from the store (with its link) and stores its queued event. */
static void resumed(void *ctx, ddpd_err rc, const struct store_job *j, const struct ddpd_error *err)
{
    struct resumption *r = ctx;
    struct http_request *req = r->req;
    struct ddpd_error e;
    if (rc == DDPD_OK) {
        rc = respond_created(req, j, &e);
        super_submit(r->a->super, j->id, NULL, j->world_size, j->device, j->max_restarts, j->created_at);
        err = &e;
    }
    http_deferred_done(req, rc, err);
    store_job_clear(&r->j);
    free(r);
}

/* The new job: queued, attempt 0, linked to the one resumed; answered at the commit
 * (resumed). `counts` (known) are the planner's, for its total steps; else the old job's
 * stand. Returns an error to answer with instead; then nothing was queued. */
static ddpd_err resume_insert(struct resumption *r, const int64_t *counts, bool known, struct ddpd_error *err)
{
    ddpd_err rc;
    if (known && (rc = spec_check_batch_counts(&r->spec, counts, err)))
        return rc;
    struct store_job_new jn = {.name = r->j.name,
                               .spec = r->j.spec,
                               .world_size = r->j.world_size,
                               .device = r->j.device,
                               .max_restarts = r->j.max_restarts,
                               .resumed_from = r->j.id,
                               .resume_step = r->step,
                               .resume_force = r->force,
                               .total_steps =
                                   known ? total_steps(&r->spec, counts, known) : r->j.total_steps};
    store_job_insert_async(r->a->store, &jn, resumed, r);
    return DDPD_OK;
}

/* The planner's answer to a resume's data check, on a planner thread. */
static void resume_planned(void *ctx, ddpd_err rc, const int64_t *counts, bool known,
                           const struct ddpd_error *perr)
{
    struct resumption *r = ctx;
    struct http_request *req = r->req;
    struct ddpd_error err;
    if (rc != DDPD_OK) {
        err = *perr;
        if ((rc == DDPD_EDATA || rc == DDPD_ESPEC) && !err.path[0])
            snprintf(err.path, sizeof err.path, "%s",
                     strncmp(err.message, "eval.data: ", 11) == 0 ? "eval.data" : "data");
    } else {
        rc = resume_insert(r, counts, known, &err);
    }
    if (rc != DDPD_OK) {
        http_deferred_done(req, rc, &err);
        store_job_clear(&r->j);
        free(r);
    }
}

/* POST /v1/jobs/{id}/resume[?step=S][&force=true]: a new job with the same spec that
 * continues a failed or cancelled job from its newest checkpoint (or checkpoint S), as a
 * restart would, on the data that checkpoint was written on: a planner compares the data
 * files with the checkpoint's fingerprints (409 data_changed naming the file and what
 * changed, unless force) and reads them as a submission's check does. */
static ddpd_err h_resume(struct http_request *req, struct ddpd_error *err)
{
    static const char *const no_yes[] = {"false", "true", NULL};
    struct api *a = ctx_of(req);
    int64_t id = http_request_id(req, 0), step;
    int force = 0;
    struct resumption *r = calloc(1, sizeof *r);
    if (!r)
        return ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory resuming job %" PRId64, id);
    ddpd_err rc = get_job(req, &r->j, err);
    if (rc || (rc = http_query_int(req, "step", 0, INT64_MAX, -1, &step, err)) ||
        (rc = http_query_enum(req, "force", no_yes, 0, &force, err)))
        goto out;
    job_state st = r->j.state;
    if (st != JOB_STATE_FAILED && st != JOB_STATE_CANCELLED) {
        rc = ddpd_error_set(
            err, DDPD_ECONFLICT, "", "job %" PRId64 " is %s: only a failed or cancelled job can be resumed%s",
            id, job_state_name(st),
            st == JOB_STATE_SUCCEEDED ? " (it finished; start a new job from its weights with "
                                        "init.from_job)"
                                      : " (it has not ended)");
        goto out;
    }
    char dir[PATH_MAX], ck[PATH_MAX + 32], optim[64], path[PATH_MAX + 128];
    jobdir_job_path(dir, sizeof dir, a->jobs_dir, id);
    if (step >= 0) {
        struct stat sb;
        jobdir_rank_file(optim, sizeof optim, JOBDIR_OPTIM, 0);
        jobdir_ckpt_path(ck, sizeof ck, dir, step);
        jobdir_file_path(path, sizeof path, ck, optim);
        if (stat(path, &sb) != 0) {
            rc = no_checkpoint_at(err, DDPD_ENOTFOUND, "step", "", dir, id, step);
            goto out;
        }
    } else if (!jobdir_latest_ckpt(dir, ck, sizeof ck) || !jobdir_ckpt_step(strrchr(ck, '/') + 1, &step)) {
        rc = ddpd_error_set(err, DDPD_ENOTFOUND, "",
                            "job %" PRId64
                            " has no checkpoint to resume from: it %s before its first checkpoint "
                            "(checkpoint.every_steps)",
                            id, st == JOB_STATE_FAILED ? "failed" : "was cancelled");
        goto out;
    }
    /* The server may have fewer slots now than when the job ran. */
    char why[512];
    const char *blame;
    if (!super_fits(a->super, r->j.device, r->j.world_size, why, sizeof why, &blame)) {
        rc = ddpd_error_set(err, DDPD_ESPEC, blame, "%s", why);
        goto out;
    }
    r->req = req;
    r->a = a;
    r->step = step;
    r->force = force == 1;
    if ((rc = spec_parse(r->j.spec, strlen(r->j.spec), NULL, &r->spec, err)))
        goto out;
    /* Synthetic data has no files to check (and the counts follow from the spec, as
     * they did for the job resumed). Deferred first: the insert may answer before
     * resume_insert returns. */
    const struct spec *spec = &r->spec;
    if (spec->data.kind == DATA_SYNTHETIC &&
        (spec->eval.every_steps <= 0 || spec->eval.data.kind == DATA_SYNTHETIC)) {
        http_defer(req);
        if ((rc = resume_insert(r, NULL, false, err))) {
            http_deferred_done(req, rc, err);
            store_job_clear(&r->j);
            free(r);
        }
        return DDPD_OK;
    }
    /* The planner's request, with the checkpoint to check the data against. */
    json_t *doc = plan_doc(a, spec, "", ck, r->force);
    if (!doc) {
        rc = ddpd_error_set(err, DDPD_ENOMEM, "",
                            "cannot build the data check of job %" PRId64
                            "'s resume (out of memory, or its checkpoint's path is too long)",
                            id);
        goto out;
    }
    http_defer(req);
    if ((rc = planner_plan_async(a->planner, doc, spec->world_size, a->plan_timeout_s, resume_planned, r,
                                 err))) {
        http_deferred_done(req, rc, err);
        store_job_clear(&r->j);
        free(r);
    }
    return DDPD_OK; /* r is the planner's now */
out:
    store_job_clear(&r->j);
    free(r);
    return rc;
}

/* ---- events ---------------------------------------------------------------------------------- */

/* One GET .../events: the stream (stream.h: history, live tail, keep-alives) tied to its
 * HTTP response. Two references, the handler's and on_close's; the last frees. */
struct evstream {
    pthread_mutex_t mu;
    int refs;
    struct stream *stream;
    struct http_stream *st; /* set once the response exists */
    bool closed;
};

/* The last reference ends the stream, gives the owner's reference of the HTTP stream back
 * and frees. */
static void es_unref(struct evstream *es)
{
    pthread_mutex_lock(&es->mu);
    int left = --es->refs;
    pthread_mutex_unlock(&es->mu);
    if (left > 0)
        return;
    stream_free(es->stream); /* no wake after this */
    http_stream_close(es->st);
    pthread_mutex_destroy(&es->mu);
    free(es);
}

/* The stream's wake: its pull would find something (data, the end, a keep-alive). */
static void es_wake(void *arg)
{
    struct evstream *es = arg;
    pthread_mutex_lock(&es->mu);
    if (es->st && !es->closed)
        http_stream_wake(es->st);
    pthread_mutex_unlock(&es->mu);
}

/* The HTTP layer's pull: called when the client can take bytes, so a page of history is
 * read from the store only when the previous one has gone out. */
static long es_pull(void *arg, char *buf, size_t cap)
{
    struct evstream *es = arg;
    size_t len = 0;
    switch (stream_next(es->stream, buf, cap, &len)) {
    case STREAM_DATA: return (long)len;
    case STREAM_AGAIN: return 0;
    case STREAM_END:
    case STREAM_CLOSED: return -1;
    }
    return -1;
}

static void es_close(void *arg, enum http_stream_end why)
{
    (void)why;
    struct evstream *es = arg;
    pthread_mutex_lock(&es->mu);
    es->closed = true;
    pthread_mutex_unlock(&es->mu);
    es_unref(es);
}

static ddpd_err h_events(struct http_request *req, struct ddpd_error *err)
{
    struct api *a = ctx_of(req);
    int64_t job = http_request_id(req, 0), after = 0;
    struct store_job j;
    ddpd_err rc = get_job(req, &j, err);
    if (rc)
        return rc;
    store_job_clear(&j);

    const char *accept = http_request_header(req, "Accept");
    int fmt_idx;
    static const char *const formats[] = {"sse", "ndjson", NULL};
    int dflt = accept && strstr(accept, "application/x-ndjson") ? 1 : 0;
    if ((rc = http_query_enum(req, "format", formats, dflt, &fmt_idx, err)))
        return rc;
    const char *last_id = http_request_header(req, "Last-Event-ID");
    if (last_id && last_id[0]) {
        if (base_parse_i64(last_id, 0, INT64_MAX, &after))
            return ddpd_error_set(err, DDPD_EJSON, "Last-Event-ID",
                                  "Last-Event-ID: expected a sequence number, got \"%.40s\"", last_id);
    }
    int64_t q_after;
    if ((rc = http_query_int(req, "after", 0, INT64_MAX, after, &q_after, err)))
        return rc;
    after = q_after;
    hub_format fmt = fmt_idx == 1 ? HUB_FORMAT_NDJSON : HUB_FORMAT_SSE;

    struct evstream *es = calloc(1, sizeof *es);
    if (!es)
        return ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory");
    pthread_mutex_init(&es->mu, NULL);
    es->refs = 2;
    if ((rc = streams_open(a->streams, job, after, fmt, es_wake, es, &es->stream, err))) {
        pthread_mutex_destroy(&es->mu);
        free(es);
        return rc;
    }
    struct http_stream_opts ho = {
        .content_type = fmt == HUB_FORMAT_SSE ? "text/event-stream" : "application/x-ndjson",
        /* Everything is pulled (es_pull), nothing written ahead: the history is paged
         * from the store as the client reads it. */
        .max_buffer = 64u << 10,
        .on_close = es_close,
        .arg = es,
        .pull = es_pull,
    };
    struct http_stream *st;
    if ((rc = http_respond_stream(req, &ho, &st, err))) {
        stream_free(es->stream);
        pthread_mutex_destroy(&es->mu);
        free(es);
        return rc;
    }
    pthread_mutex_lock(&es->mu);
    es->st = st;
    pthread_mutex_unlock(&es->mu);
    es_wake(es);
    es_unref(es);
    return DDPD_OK;
}

/* Planner processes: two answer while a third submission waits (each answer takes
 * microseconds to a few milliseconds; more processes would only cost memory). */
#define PLANNERS 2

ddpd_err api_new(const struct api_config *c, struct api **out, struct ddpd_error *err)
{
    *out = NULL;
    struct api *a = calloc(1, sizeof *a);
    if (!a)
        return ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory for the api");
    *a = (struct api){.store = c->store,
                      .hub = c->hub,
                      .super = c->super,
                      .worker = c->worker,
                      .data_dir = c->data_dir,
                      .jobs_dir = c->jobs_dir,
                      .web_dir = c->web_dir,
                      .max_rank_memory = c->max_rank_memory};
    const char *pt = getenv("DDPD_PLAN_TIMEOUT_S");
    char *end = NULL;
    double t = pt ? strtod(pt, &end) : 0;
    a->plan_timeout_s = pt && end != pt && !*end && t >= 1 && t <= 3600 ? t : PLAN_TIMEOUT_S;
    job_cache_init(a);
    ddpd_err rc = streams_new(a->hub, a->store, 0, &a->streams, err);
    if (rc == DDPD_OK && !(a->planner = planner_new(a->worker, PLANNERS)))
        rc = ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory for the planner");
    if (rc) {
        api_free(a);
        return rc;
    }
    *out = a;
    return DDPD_OK;
}

void api_set_http(struct api *a, struct http_server *http)
{
    __atomic_store_n(&a->http, http, __ATOMIC_RELEASE);
}

void api_free(struct api *a)
{
    if (!a)
        return;
    planner_free(a->planner);
    streams_free(a->streams);
    job_cache_clear(a);
    free(a);
}

/* ---- metrics, logs, checkpoint ----------------------------------------------------------- */

static ddpd_err h_metrics(struct http_request *req, struct ddpd_error *err)
{
    struct api *a = ctx_of(req);
    int64_t maxp;
    ddpd_err rc = http_query_int(req, "max_points", 2, STORE_METRICS_MAX_POINTS, 1000, &maxp, err);
    if (rc)
        return rc;
    struct store_job j;
    if ((rc = get_job(req, &j, err)))
        return rc;
    store_job_clear(&j);
    struct store_metrics m;
    if ((rc = store_metrics_get(a->store, http_request_id(req, 0), (int)maxp, &m, err)))
        return rc;
    json_t *series = json_array();
    json_t *mean = json_null();
    for (size_t i = 0; i < m.n_series; i++) {
        const struct store_series *s = &m.series[i];
        json_t *steps = json_array(), *loss = json_array();
        for (size_t k = 0; k < s->n; k++) {
            json_array_append_new(steps, json_integer(s->step[k]));
            json_array_append_new(loss, isfinite(s->loss[k]) ? json_real(s->loss[k]) : json_null());
        }
        json_t *o = json_pack("{s:o, s:o}", "step", steps, "loss", loss);
        if (s->rank < 0) {
            json_decref(mean);
            mean = o;
        } else {
            json_object_set_new(o, "rank", json_integer(s->rank));
            json_array_append_new(series, o);
        }
    }
    /* The lr of each logged step, and the eval points (CONTRACT.md §2a), as columns. */
    json_t *lr_step = json_array(), *lr = json_array();
    for (size_t k = 0; k < m.lr.n; k++) {
        json_array_append_new(lr_step, json_integer(m.lr.step[k]));
        json_array_append_new(lr, json_real(m.lr.loss[k]));
    }
    json_t *ev_step = json_array(), *ev_loss = json_array(), *ev_acc = json_array(), *ev_n = json_array();
    for (size_t k = 0; k < m.n_eval; k++) {
        const struct store_eval *e = &m.eval[k];
        json_array_append_new(ev_step, json_integer(e->step));
        json_array_append_new(ev_loss, isfinite(e->loss) ? json_real(e->loss) : json_null());
        json_array_append_new(ev_acc, e->has_accuracy && isfinite(e->accuracy) ? json_real(e->accuracy)
                                                                               : json_null());
        json_array_append_new(ev_n, json_integer(e->samples));
    }
    json_t *out =
        json_pack("{s:I, s:I, s:I, s:o, s:o, s:{s:o, s:o}, s:{s:o, s:o, s:o, s:o}}", "points",
                  (json_int_t)m.points, "first_step", (json_int_t)m.first_step, "last_step",
                  (json_int_t)m.last_step, "mean", mean, "ranks", series, "lr", "step", lr_step, "lr", lr,
                  "eval", "step", ev_step, "loss", ev_loss, "accuracy", ev_acc, "samples", ev_n);
    store_metrics_free(&m);
    return http_respond_json(req, 200, out);
}

static ddpd_err h_logs(struct http_request *req, struct ddpd_error *err)
{
    struct api *a = ctx_of(req);
    struct store_job j;
    ddpd_err rc = get_job(req, &j, err);
    if (rc)
        return rc;
    int world = j.world_size;
    store_job_clear(&j);
    int64_t rank, tail;
    if ((rc = http_query_int(req, "rank", 0, world - 1, 0, &rank, err)) ||
        (rc = http_query_int(req, "tail", 1, 100000, 200, &tail, err)))
        return rc;
    char path[PATH_MAX];
    char dir[PATH_MAX];
    jobdir_job_path(dir, sizeof dir, a->jobs_dir, http_request_id(req, 0));
    jobdir_rank_log_path(path, sizeof path, dir, (int)rank);
    /* Not blocking, no links, a regular file only: a FIFO or a device in the job's folder
     * must not hold an HTTP thread (nor a link make it read another file). */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (fd >= 0 && (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))) {
        close(fd);
        return ddpd_error_set(err, DDPD_EIO, "", "%s of job %" PRId64 " is not a regular file",
                              strrchr(path, '/') + 1, http_request_id(req, 0));
    }
    FILE *f = fd >= 0 ? fdopen(fd, "rb") : NULL;
    if (!f) {
        if (fd >= 0)
            close(fd);
        return http_respond_text(req, 200, "");
    }
    /* The last `tail` lines: read at most 4 MiB from the end. */
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    long start = size > (4 << 20) ? size - (4 << 20) : 0;
    fseek(f, start, SEEK_SET);
    char *buf = malloc((size_t)(size - start) + 1);
    size_t n = buf ? fread(buf, 1, (size_t)(size - start), f) : 0;
    fclose(f);
    if (!buf)
        return ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory");
    buf[n] = '\0';
    const char *p = buf + n;
    int64_t lines = 0;
    if (p > buf && p[-1] == '\n')
        p--;
    while (p > buf && lines < tail)
        if (*--p == '\n' && ++lines == tail) {
            p++;
            break;
        }
    rc = http_respond_text(req, 200, p);
    free(buf);
    return rc;
}

/* GET /v1/jobs/{id}/checkpoints: {"checkpoints":[{"step":S,"time":T,"bytes":B},...]},
 * oldest first; time is the folder's completion (its last change, when it was renamed
 * into place), bytes its files together. */
static ddpd_err h_checkpoints(struct http_request *req, struct ddpd_error *err)
{
    struct api *a = ctx_of(req);
    int64_t id = http_request_id(req, 0);
    struct store_job j;
    ddpd_err rc = get_job(req, &j, err);
    if (rc)
        return rc;
    store_job_clear(&j);
    char dir[PATH_MAX], ck[PATH_MAX + 32];
    jobdir_job_path(dir, sizeof dir, a->jobs_dir, id);
    int64_t *steps;
    size_t n;
    if (!jobdir_ckpt_list(dir, &steps, &n))
        return ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory listing the checkpoints of job %" PRId64,
                              id);
    json_t *list = json_array();
    for (size_t i = 0; i < n; i++) {
        struct stat st;
        int64_t bytes = 0;
        struct ddpd_error e2;
        /* One pruned meanwhile (checkpoint.keep_last) is simply not listed. */
        if (!jobdir_ckpt_path(ck, sizeof ck, dir, steps[i]) || stat(ck, &st) != 0 ||
            jobdir_bytes(ck, &bytes, &e2) != DDPD_OK)
            continue;
        double t = (double)st.st_mtim.tv_sec + (double)st.st_mtim.tv_nsec * 1e-9;
        json_array_append_new(list, json_pack("{s:I, s:f, s:I}", "step", (json_int_t)steps[i], "time", t,
                                              "bytes", (json_int_t)bytes));
    }
    free(steps);
    return http_respond_json(req, 200, json_pack("{s:o}", "checkpoints", list));
}

/* Why job `id` (in state `st`) has no weights to download yet. */
static ddpd_err no_checkpoint(int64_t id, job_state st, struct ddpd_error *err)
{
    switch (st) {
    case JOB_STATE_QUEUED:
        return ddpd_error_set(err, DDPD_ENOTFOUND, "",
                              "job %" PRId64 " has no checkpoint: it has not started yet", id);
    case JOB_STATE_FAILED:
    case JOB_STATE_CANCELLED:
        return ddpd_error_set(err, DDPD_ENOTFOUND, "",
                              "job %" PRId64 " has no checkpoint: it %s before its first checkpoint", id,
                              st == JOB_STATE_FAILED ? "failed" : "was cancelled");
    case JOB_STATE_SUCCEEDED:
        return ddpd_error_set(err, DDPD_ENOTFOUND, "",
                              "job %" PRId64 " has no checkpoint: its files were removed from the server",
                              id);
    default:
        return ddpd_error_set(err, DDPD_ENOTFOUND, "",
                              "job %" PRId64
                              " has no checkpoint yet (it writes one every checkpoint.every_steps "
                              "steps, and its final model at the end)",
                              id);
    }
}

/* GET /v1/jobs/{id}/checkpoint[?step=S][&file=model|optim]: a checkpoint's weights (or
 * rank 0's optimizer state); without step the final model, else the newest checkpoint. */
static ddpd_err h_checkpoint(struct http_request *req, struct ddpd_error *err)
{
    struct api *a = ctx_of(req);
    int64_t id = http_request_id(req, 0), step;
    static const char *const files[] = {"model", "optim", NULL};
    int file;
    struct store_job j;
    ddpd_err rc = get_job(req, &j, err);
    if (rc)
        return rc;
    job_state state = j.state;
    store_job_clear(&j);
    if ((rc = http_query_int(req, "step", 0, INT64_MAX, -1, &step, err)) ||
        (rc = http_query_enum(req, "file", files, 0, &file, err)))
        return rc;
    const char *what = file == 1 ? JOBDIR_OPTIM : JOBDIR_MODEL;
    char dir[PATH_MAX], ck[PATH_MAX + 32], name[64], path[PATH_MAX + 128];
    jobdir_job_path(dir, sizeof dir, a->jobs_dir, id);
    jobdir_rank_file(name, sizeof name, what, 0);
    struct stat st;
    if (step >= 0) {
        jobdir_ckpt_path(ck, sizeof ck, dir, step);
        jobdir_file_path(path, sizeof path, ck, name);
        if (stat(path, &st) != 0)
            return no_checkpoint_at(err, DDPD_ENOTFOUND, "step", "", dir, id, step);
    } else {
        jobdir_file_path(path, sizeof path, dir, name);
        if (stat(path, &st) != 0) {
            /* No final model yet: the newest checkpoint. */
            if (!jobdir_latest_ckpt(dir, ck, sizeof ck))
                return no_checkpoint(id, state, err);
            jobdir_file_path(path, sizeof path, ck, name);
        }
    }
    char disp[128];
    snprintf(disp, sizeof disp, "attachment; filename=\"%s\"", name);
    http_response_header(req, "Content-Disposition", disp);
    return http_respond_file(req, path, "application/octet-stream", "no-cache", err);
}

/* ---- devices, health, Prometheus -------------------------------------------------------------- */

static ddpd_err h_devices(struct http_request *req, struct ddpd_error *err)
{
    (void)err;
    return http_respond_json(req, 200, super_devices(ctx_of(req)->super));
}

static ddpd_err h_health(struct http_request *req, struct ddpd_error *err)
{
    ddpd_err rc = store_ping(ctx_of(req)->store, err);
    if (rc)
        return rc;
    return http_respond_json(req, 200, json_pack("{s:b, s:s}", "ok", 1, "database", "ok"));
}

#ifndef DDPD_VERSION
#define DDPD_VERSION "unknown"
#endif

/* Free and busy slots of one kind from the devices' JSON (super_devices). */
static void slots_count(json_t *devs, const char *key, int64_t *total, int64_t *used)
{
    json_t *arr = json_object_get(devs, key), *slot;
    size_t i;
    *total = *used = 0;
    json_array_foreach (arr, i, slot) {
        (*total)++;
        *used += !json_is_null(json_object_get(slot, "job"));
    }
}

/* A Prometheus label value: \, " and newlines escaped, into out[cap]. */
static void label_escape(char *out, size_t cap, const char *v)
{
    size_t n = 0;
    for (; *v && n + 3 < cap; v++) {
        if (*v == '\\' || *v == '"')
            out[n++] = '\\';
        if (*v == '\n') {
            out[n++] = '\\';
            out[n++] = 'n';
            continue;
        }
        out[n++] = *v;
    }
    out[n] = '\0';
}

/* GET /metrics: one name per concept (schema/README.md "Metrics"). */
static ddpd_err h_prometheus(struct http_request *req, struct ddpd_error *err)
{
    struct api *a = ctx_of(req);
    int64_t counts[JOB_STATE_COUNT];
    ddpd_err rc = store_job_count(a->store, counts, err);
    if (rc)
        return rc;
    /* The running jobs' progress: at most a page of them (STORE_LIST_MAX). */
    struct store_job_query q = {.states = JOB_STATE_BIT(JOB_STATE_RUNNING), .limit = STORE_LIST_MAX};
    struct store_job_list running;
    if ((rc = store_job_list(a->store, &q, &running, err)))
        return rc;
    struct store_stats ss;
    struct hub_stats hs;
    store_stats_get(a->store, &ss);
    hub_stats_get(a->hub, &hs);
    /* Set by api_set_http after the HTTP server started, while requests may already run. */
    struct http_server *srv = __atomic_load_n(&a->http, __ATOMIC_ACQUIRE);
    char *httpm = srv ? http_server_metrics(srv) : NULL;
    size_t streams_open = 0;
    unsigned long long streams_slow = 0;
    if (srv)
        http_server_stream_stats(srv, &streams_open, &streams_slow);
    json_t *devs = super_devices(a->super);
    int64_t cpu_total, cpu_used, gpu_total, gpu_used;
    slots_count(devs, "cpu_slots", &cpu_total, &cpu_used);
    slots_count(devs, "gpus", &gpu_total, &gpu_used);
    json_decref(devs);
    size_t cap = 8192 + running.n * 600 + (httpm ? strlen(httpm) : 0), n = 0;
    char *out = malloc(cap);
    if (!out) {
        free(httpm);
        store_job_list_free(&running);
        return ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory");
    }
    n += (size_t)snprintf(out + n, cap - n,
                          "# HELP ddpd_build_info The server's version.\n# TYPE ddpd_build_info gauge\n"
                          "ddpd_build_info{version=\"%s\"} 1\n",
                          DDPD_VERSION);
    /* Jobs now in each state that is not final: a finished job is history, not load. */
    n += (size_t)snprintf(out + n, cap - n,
                          "# HELP ddpd_jobs Jobs now queued, starting or running.\n# TYPE ddpd_jobs gauge\n");
    for (int s = 0; s < JOB_STATE_COUNT; s++)
        if (!(JOB_STATE_BIT(s) & JOB_STATES_FINAL))
            n += (size_t)snprintf(out + n, cap - n, "ddpd_jobs{state=\"%s\"} %" PRId64 "\n",
                                  job_state_name((job_state)s), counts[s]);
    n += (size_t)snprintf(out + n, cap - n,
                          "# HELP ddpd_slots Device slots of this server.\n# TYPE ddpd_slots gauge\n"
                          "ddpd_slots{kind=\"cpu\"} %" PRId64 "\nddpd_slots{kind=\"cuda\"} %" PRId64 "\n"
                          "# HELP ddpd_slots_used Device slots held by a job now.\n"
                          "# TYPE ddpd_slots_used gauge\n"
                          "ddpd_slots_used{kind=\"cpu\"} %" PRId64 "\nddpd_slots_used{kind=\"cuda\"} %" PRId64
                          "\n",
                          cpu_total, gpu_total, cpu_used, gpu_used);
    n += (size_t)snprintf(out + n, cap - n,
                          "# HELP ddpd_job_step The latest optimizer step of each running job.\n"
                          "# TYPE ddpd_job_step gauge\n");
    char name[2 * STORE_NAME_MAX + 8];
    for (size_t i = 0; i < running.n && n < cap; i++) {
        const struct store_job *j = &running.jobs[i];
        label_escape(name, sizeof name, j->name);
        if (j->has_progress)
            n += (size_t)snprintf(out + n, cap - n,
                                  "ddpd_job_step{job=\"%" PRId64 "\",name=\"%s\"} %" PRId64 "\n", j->id, name,
                                  j->step);
    }
    n += (size_t)snprintf(out + n, cap - n,
                          "# HELP ddpd_job_loss The latest loss (mean over ranks) of each running job.\n"
                          "# TYPE ddpd_job_loss gauge\n");
    for (size_t i = 0; i < running.n && n < cap; i++) {
        const struct store_job *j = &running.jobs[i];
        label_escape(name, sizeof name, j->name);
        char v[40];
        /* A loss that was NaN or infinite (kept as none by the store) reads NaN. */
        if (j->loss_finite && isfinite(j->loss))
            snprintf(v, sizeof v, "%.9g", j->loss);
        else
            snprintf(v, sizeof v, "NaN");
        if (j->has_progress)
            n += (size_t)snprintf(out + n, cap - n, "ddpd_job_loss{job=\"%" PRId64 "\",name=\"%s\"} %s\n",
                                  j->id, name, v);
    }
    n += (size_t)snprintf(
        out + n, cap - n,
        "# HELP ddpd_events_ingested_total Events accepted for storage.\n"
        "# TYPE ddpd_events_ingested_total counter\nddpd_events_ingested_total %llu\n"
        "# HELP ddpd_events_committed_total Events written to the database.\n"
        "# TYPE ddpd_events_committed_total counter\nddpd_events_committed_total %llu\n"
        "# HELP ddpd_events_dropped_total Events that could not be stored.\n"
        "# TYPE ddpd_events_dropped_total counter\nddpd_events_dropped_total %llu\n"
        "# HELP ddpd_events_thinned_total Stored loss events deleted to keep jobs within --job-events-max.\n"
        "# TYPE ddpd_events_thinned_total counter\nddpd_events_thinned_total %llu\n"
        "# HELP ddpd_stream_subscribers Open event streams.\n"
        "# TYPE ddpd_stream_subscribers gauge\nddpd_stream_subscribers %llu\n"
        "# HELP ddpd_stream_subscribers_dropped_total Event streams ended because the client "
        "read too slowly.\n"
        "# TYPE ddpd_stream_subscribers_dropped_total counter\n"
        "ddpd_stream_subscribers_dropped_total %llu\n",
        (unsigned long long)ss.events_appended, (unsigned long long)ss.events_committed,
        (unsigned long long)(ss.events_dropped + ss.events_rejected), (unsigned long long)ss.events_thinned,
        (unsigned long long)(srv ? streams_open : hs.subscribers),
        (unsigned long long)hs.dropped + streams_slow);
    if (httpm && n < cap)
        n += (size_t)snprintf(out + n, cap - n, "%s", httpm);
    free(httpm);
    store_job_list_free(&running);
    rc = http_respond_bytes(req, 200, "text/plain; version=0.0.4; charset=utf-8", out, n < cap ? n : cap - 1);
    free(out);
    return rc;
}

/* ---- the dashboard's static files (web/) ------------------------------------------------- */

/* A file directly inside the web folder: a plain name of letters, digits, '-', '_' and
 * dots (not first), with a known extension. Anything else is a 404. */
static const char *web_type(const char *name)
{
    static const char *const types[][2] = {
        {".html", "text/html; charset=utf-8"}, {".js", "text/javascript; charset=utf-8"},
        {".css", "text/css; charset=utf-8"},   {".svg", "image/svg+xml"},
        {".json", "application/json"},         {".png", "image/png"},
        {".txt", "text/plain; charset=utf-8"},
    };
    size_t n = strlen(name);
    if (n == 0 || n > 128 || name[0] == '.')
        return NULL;
    for (const char *p = name; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '-' ||
              *p == '_' || *p == '.'))
            return NULL;
    const char *dot = strrchr(name, '.');
    for (size_t i = 0; dot && i < sizeof types / sizeof types[0]; i++)
        if (!strcmp(dot, types[i][0]))
            return types[i][1];
    return NULL;
}

static ddpd_err serve_web_file(struct http_request *req, const char *name, struct ddpd_error *err)
{
    struct api *a = ctx_of(req);
    const char *type = web_type(name);
    char path[PATH_MAX];
    if (!a->web_dir)
        return ddpd_error_set(err, DDPD_ENOTFOUND, "",
                              "no such resource: /web/%.128s (no dashboard: ddpd serve found no web/ folder; "
                              "give it --web-dir)",
                              name);
    if (!type || snprintf(path, sizeof path, "%s/%s", a->web_dir, name) >= (int)sizeof path)
        return ddpd_error_set(err, DDPD_ENOTFOUND, "", "no such resource: /web/%.128s", name);
    /* no-cache: the browser keeps the file and revalidates it with its ETag (304). */
    ddpd_err rc = http_respond_file(req, path, type, "no-cache", err);
    if (rc == DDPD_ENOTFOUND)
        /* No server path in an answer anyone may read: the folder is in the server's log. */
        return ddpd_error_set(err, DDPD_ENOTFOUND, "",
                              "no such resource: /web/%.128s (not in the dashboard's folder, --web-dir)",
                              name);
    return rc;
}

/* GET / and GET /web: to /web/index.html, where the page's relative links (app.js,
 * style.css) find their files, as they do when index.html is opened from disk. (A route
 * pattern has no empty segment, so "/web/" itself is not one.) */
static ddpd_err h_web_root(struct http_request *req, struct ddpd_error *err)
{
    (void)err;
    http_response_header(req, "Location", "/web/index.html");
    return http_respond_empty(req, 302);
}

static ddpd_err h_web_file(struct http_request *req, struct ddpd_error *err)
{
    const char *p = http_request_path(req);
    return serve_web_file(req, strncmp(p, "/web/", 5) ? "" : p + 5, err);
}

static const struct http_route routes[] = {
    {"POST", "/v1/jobs", h_submit, HTTP_ROUTE_AUTH | HTTP_ROUTE_JSON, 0, ""},
    {"GET", "/v1/jobs", h_list, HTTP_ROUTE_AUTH, 0, "state limit before name"},
    {"GET", "/v1/jobs/{id}", h_get, HTTP_ROUTE_AUTH, 0, ""},
    {"DELETE", "/v1/jobs/{id}", h_delete, HTTP_ROUTE_AUTH, 0, ""},
    {"POST", "/v1/jobs/{id}/cancel", h_cancel, HTTP_ROUTE_AUTH, 0, ""},
    {"POST", "/v1/jobs/{id}/resume", h_resume, HTTP_ROUTE_AUTH, 0, "step force"},
    {"GET", "/v1/jobs/{id}/events", h_events, HTTP_ROUTE_AUTH, 0, "format after"},
    {"GET", "/v1/jobs/{id}/metrics", h_metrics, HTTP_ROUTE_AUTH, 0, "max_points"},
    {"GET", "/v1/jobs/{id}/logs", h_logs, HTTP_ROUTE_AUTH, 0, "rank tail"},
    {"GET", "/v1/jobs/{id}/checkpoint", h_checkpoint, HTTP_ROUTE_AUTH, 0, "step file"},
    {"GET", "/v1/jobs/{id}/checkpoints", h_checkpoints, HTTP_ROUTE_AUTH, 0, ""},
    {"GET", "/v1/jobs/{id}/pytorch", api__pytorch, HTTP_ROUTE_AUTH, 0, ""},
    {"GET", "/v1/devices", h_devices, HTTP_ROUTE_AUTH, 0, ""},
    {"GET", "/healthz", h_health, 0, 0, NULL},
    {"GET", "/metrics", h_prometheus, 0, 0, NULL},
    /* The dashboard (open without a token, CONTRACT.md §7). Route patterns match literal
     * segments only, so each file of web/ has its row: a new file needs one here. */
    {"GET", "/", h_web_root, 0, 0, NULL},
    {"GET", "/web", h_web_root, 0, 0, NULL},
    {"GET", "/web/index.html", h_web_file, 0, 0, NULL},
    {"GET", "/web/style.css", h_web_file, 0, 0, NULL},
    {"GET", "/web/favicon.svg", h_web_file, 0, 0, NULL},
    {"GET", "/web/util.js", h_web_file, 0, 0, NULL},
    {"GET", "/web/api.js", h_web_file, 0, 0, NULL},
    {"GET", "/web/chart.js", h_web_file, 0, 0, NULL},
    {"GET", "/web/templates.js", h_web_file, 0, 0, NULL},
    {"GET", "/web/views.js", h_web_file, 0, 0, NULL},
    {"GET", "/web/job.js", h_web_file, 0, 0, NULL},
    {"GET", "/web/app.js", h_web_file, 0, 0, NULL},
};

const struct http_route *api_routes(size_t *n)
{
    *n = sizeof routes / sizeof routes[0];
    return routes;
}
