/* api_jobs.c — a job as the API shows it (CONTRACT.md §7), the cache of rendered jobs that
 * GET /v1/jobs/{id} answers from, and the routes that read or end a job: list, get,
 * cancel, delete. Job changes are the supervisor's; this file only asks for them. */
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../schema/jobdir.h"
#include "../schema/jobmeta.h"
#include "../schema/jsonnum.h"
#include "api_impl.h"
#include "http.h"
#include "inference/pool.h"
#include "store.h"
#include "super.h"
#include "users.h"

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

/* A job's final and best metrics (docs/api.md "Job metrics"): the latest loss, the final
 * eval, and the best eval loss and accuracy with their steps; null where there is none. */
static json_t *metrics_json(const struct store_job *j)
{
    const struct store_job_evals *e = &j->evals;
    json_t *o = json_object();
    json_object_set_new(o, "step", j->has_progress ? json_integer(j->step) : json_null());
    json_object_set_new(o, "loss", num_or_null(j->has_progress && j->loss_finite, j->loss));
    json_object_set_new(o, "eval_step", e->has_final ? json_integer(e->final_step) : json_null());
    json_object_set_new(o, "eval_loss", num_or_null(e->has_loss, e->final_loss));
    json_object_set_new(o, "eval_accuracy", num_or_null(e->has_accuracy, e->final_accuracy));
    json_object_set_new(o, "best_eval_loss", num_or_null(e->has_best_loss, e->best_loss));
    json_object_set_new(o, "best_eval_loss_step",
                        e->has_best_loss ? json_integer(e->best_loss_step) : json_null());
    json_object_set_new(o, "best_eval_accuracy", num_or_null(e->has_best_accuracy, e->best_accuracy));
    json_object_set_new(o, "best_eval_accuracy_step",
                        e->has_best_accuracy ? json_integer(e->best_accuracy_step) : json_null());
    return o;
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
    /* Its metadata (schema/jobmeta.h): the tags in the order given, the notes or null. */
    json_t *tags = j->tags ? json_loads(j->tags, 0, NULL) : NULL;
    json_object_set_new(o, "tags", json_is_array(tags) ? tags : (json_decref(tags), json_array()));
    json_object_set_new(o, "notes", j->notes && j->notes[0] ? json_string(j->notes) : json_null());
    json_object_set_new(o, "state", json_string(job_state_name(j->state)));
    /* The user who submitted it (null: from before users), its preemptions and the seconds
     * it ran over its ended attempts (docs/security.md, docs/scheduling.md). */
    json_object_set_new(o, "owner", j->owner[0] ? json_string(j->owner) : json_null());
    json_object_set_new(o, "preemptions", json_integer(j->preemptions));
    json_object_set_new(o, "run_s", json_real(j->run_s));
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
    /* Why it ended before its last step: "early_stopped at step S (best S' = v)"; null else. */
    json_object_set_new(o, "stop_reason", j->stop_reason[0] ? json_string(j->stop_reason) : json_null());
    /* A job made by POST /v1/jobs/{id}/resume: the job and the checkpoint's step it continues. */
    json_object_set_new(o, "total_steps", j->total_steps > 0 ? json_integer(j->total_steps) : json_null());
    json_object_set_new(o, "resumed_from", j->resumed_from > 0 ? json_integer(j->resumed_from) : json_null());
    json_object_set_new(o, "resumed_from_step",
                        j->resumed_from > 0 ? json_integer(j->resume_step) : json_null());
    json_object_set_new(o, "metrics", metrics_json(j));
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
    size_t hn = jsonnum_tidy(head, strlen(head)), sn = strlen(spec); /* reals without float noise */
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
    char *t = job_text(api__ctx(req), j, &len);
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

void api__job_cache_init(struct api *a)
{
    for (int i = 0; i < API_JOB_CACHE_SLOTS; i++)
        pthread_mutex_init(&a->job_cache[i].mu, NULL);
}

void api__job_cache_clear(struct api *a)
{
    for (int i = 0; i < API_JOB_CACHE_SLOTS; i++) {
        free(a->job_cache[i].text);
        a->job_cache[i].text = NULL;
        a->job_cache[i].id = 0;
        pthread_mutex_destroy(&a->job_cache[i].mu);
    }
}

static struct api_job_cache_slot *job_cache_slot(struct api *a, int64_t id)
{
    return &a->job_cache[(uint64_t)id % API_JOB_CACHE_SLOTS];
}

/* Answers from the cache when it holds `id` at `version`; false when it does not. */
static bool job_cache_respond(struct http_request *req, int64_t id, uint64_t version, ddpd_err *rc)
{
    struct api_job_cache_slot *c = job_cache_slot(api__ctx(req), id);
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
    struct api_job_cache_slot *c = job_cache_slot(a, id);
    pthread_mutex_lock(&c->mu);
    char *old = c->text;
    c->id = id;
    c->version = version;
    c->text = text;
    c->len = len;
    pthread_mutex_unlock(&c->mu);
    free(old);
}

ddpd_err api__get_job(struct http_request *req, struct store_job *j, struct ddpd_error *err)
{
    memset(j, 0, sizeof *j);
    return store_job_get(api__ctx(req)->store, http_request_id(req, 0), j, err);
}

/* 201 with the job just stored and its Location; the job is stored whatever this returns,
 * so a failure's text (in *e) says so. */
ddpd_err api__respond_created(struct http_request *req, const struct store_job *j, struct ddpd_error *e)
{
    char loc[64];
    snprintf(loc, sizeof loc, "/v1/jobs/%" PRId64, j->id);
    http_response_header(req, "Location", loc);
    ddpd_err rc = respond_job(req, 201, j);
    if (rc != DDPD_OK)
        ddpd_error_set(e, rc, "", "out of memory answering for job %" PRId64 " (it is stored)", j->id);
    return rc;
}

/* ---- GET /v1/jobs, /v1/jobs/{id}, cancel, delete ------------------------------------------ */

ddpd_err api__list(struct http_request *req, struct ddpd_error *err)
{
    struct api *a = api__ctx(req);
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
    const char *tag = http_query(req, "tag");
    if (tag && tag[0]) {
        struct ddpd_error why;
        if (jobmeta_check_tag(tag, "tag", &why))
            return http_query_error(req, "tag", err, "%s", why.message);
        q.tag = tag;
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

ddpd_err api__get(struct http_request *req, struct ddpd_error *err)
{
    struct api *a = api__ctx(req);
    int64_t id = http_request_id(req, 0);
    uint64_t version = store_job_version(a->store, id); /* before the read: see store.h */
    ddpd_err rc;
    if (job_cache_respond(req, id, version, &rc))
        return rc;
    struct store_job j;
    if ((rc = api__get_job(req, &j, err)))
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

ddpd_err api__cancel(struct http_request *req, struct ddpd_error *err)
{
    ddpd_err rc = super_cancel(api__ctx(req)->super, http_request_id(req, 0), err);
    return rc ? rc : http_respond_empty(req, 202);
}

/* POST /v1/jobs/{id}/preempt: 202; the job checkpoints and waits as preempted. */
ddpd_err api__preempt(struct http_request *req, struct ddpd_error *err)
{
    const struct user *u = http_request_user(req);
    ddpd_err rc = super_preempt(api__ctx(req)->super, http_request_id(req, 0), u ? u->name : "", err);
    return rc ? rc : http_respond_empty(req, 202);
}

ddpd_err api__delete(struct http_request *req, struct ddpd_error *err)
{
    /* The supervisor deletes: between two turns of its loop no end of the job is half
     * stored or published. */
    struct api *a = api__ctx(req);
    ddpd_err rc = super_delete(a->super, http_request_id(req, 0), err);
    if (rc)
        return rc;
    /* Its models are unloaded, and a request for it that raced the delete is refused. */
    infer_pool_forget_job(a->infer, http_request_id(req, 0));
    return http_respond_empty(req, 204);
}

/* PATCH /v1/jobs/{id}: {"tags": [...], "notes": "..."} replaces what it names (either or
 * both; notes null or "" clears them), in any state; 200 with the job. */
ddpd_err api__patch(struct http_request *req, struct ddpd_error *err)
{
    struct api *a = api__ctx(req);
    json_t *body = http_request_json(req);
    if (!json_is_object(body))
        return ddpd_error_set(err, DDPD_ESPEC, "",
                              "expected an object: {\"tags\": [...], \"notes\": \"...\"}");
    const char *key;
    json_t *v;
    json_object_foreach (body, key, v)
        if (strcmp(key, "tags") && strcmp(key, "notes"))
            return ddpd_error_set(err, DDPD_ESPEC, key,
                                  "%s: unknown key (a job's tags and notes can change: tags, notes)", key);
    if (json_object_size(body) == 0)
        return ddpd_error_set(err, DDPD_ESPEC, "", "nothing to change: give tags, notes or both");
    struct jobmeta m;
    ddpd_err rc = jobmeta_from_json(body, false, &m, err);
    if (rc == DDPD_OK)
        rc = store_job_meta_set(a->store, http_request_id(req, 0), m.has_tags ? m.tags : NULL, m.has_notes,
                                m.notes, err);
    jobmeta_clear(&m);
    if (rc)
        return rc;
    struct store_job j;
    if ((rc = api__get_job(req, &j, err)) == DDPD_OK)
        rc = respond_job(req, 200, &j);
    store_job_clear(&j);
    return rc;
}
