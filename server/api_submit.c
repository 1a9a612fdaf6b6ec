/* api_submit.c — POST /v1/jobs and POST /v1/jobs/{id}/resume: a spec (or a job to
 * continue) checked, its data checked by a planner process off the HTTP thread
 * (planner.h), the job inserted by the store's inserter thread and handed to the
 * supervisor; the deferred request is answered at the commit. */
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../schema/jobdir.h"
#include "../schema/jobdoc.h"
#include "../schema/jobmeta.h"
#include "../schema/spec.h"
#include "api_impl.h"
#include "http.h"
#include "planner.h"
#include "store.h"
#include "super.h"
#include "users.h"

/* ---- POST /v1/jobs ---------------------------------------------------------------------- */

/* A job between its validation and its commit. */
struct submission {
    struct http_request *req;
    struct api *a;
    char *text; /* the spec as stored; the supervisor's once stored */
    char name[STORE_NAME_MAX];
    char owner[STORE_OWNER_MAX]; /* the principal who submits it */
    struct jobmeta meta;         /* its tags and notes, stored with it */
};

/* The name of the request's principal into owner[STORE_OWNER_MAX]; NULL when none. */
static const char *owner_of(struct http_request *req, char *owner)
{
    const struct user *u = http_request_user(req);
    snprintf(owner, STORE_OWNER_MAX, "%s", u ? u->name : "");
    return owner[0] ? owner : NULL;
}

/* The store's inserter thread, after the commit: the answer, then the supervisor. */
static void submitted(void *ctx, ddpd_err rc, const struct store_job *j, const struct ddpd_error *err)
{
    struct submission *sub = ctx;
    struct http_request *req = sub->req;
    if (rc != DDPD_OK) {
        http_deferred_done(req, rc, err);
        free(sub->text);
        jobmeta_clear(&sub->meta);
        free(sub);
        return;
    }
    struct ddpd_error e;
    ddpd_err r = api__respond_created(req, j, &e);
    super_submit(sub->a->super, j->id, sub->text, j->world_size, j->device, j->max_restarts, j->created_at);
    http_deferred_done(req, r, &e);
    jobmeta_clear(&sub->meta);
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
 * commit answers the deferred request (submitted). `meta` is taken (moved into the
 * insert, or cleared). Returns an error to answer with instead; then nothing was queued. */
static ddpd_err submit_checked(struct http_request *req, struct api *a, const struct spec *spec,
                               struct jobmeta *meta, const int64_t *counts, bool known,
                               struct ddpd_error *err)
{
    ddpd_err rc;
    if (known && (rc = spec_check_batch_counts(spec, counts, err))) {
        jobmeta_clear(meta);
        return rc;
    }

    struct submission *sub = calloc(1, sizeof *sub);
    if (!sub || !(sub->text = spec_dumps(spec))) {
        free(sub);
        jobmeta_clear(meta);
        return ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory storing the job");
    }
    sub->meta = *meta;
    memset(meta, 0, sizeof *meta);
    sub->req = req;
    sub->a = a;
    _Static_assert(sizeof sub->name == sizeof spec->name, "a spec's name fits the store's");
    memcpy(sub->name, spec->name, sizeof sub->name);
    /* Answered once the insert's group is committed: under load one commit serves many
     * submissions, and no HTTP thread waits for it. */
    struct store_job_new jn = {.name = sub->name,
                               .owner = owner_of(req, sub->owner),
                               .spec = sub->text,
                               .world_size = spec->world_size,
                               .device = spec->device,
                               .max_restarts = spec->max_restarts,
                               .total_steps = total_steps(spec, counts, known),
                               .tags = sub->meta.tags,
                               .notes = sub->meta.notes,
                               .queued_event = true};
    store_job_insert_async(a->store, &jn, submitted, sub);
    return DDPD_OK;
}

/* A submission waiting for its data check. */
struct planning {
    struct http_request *req; /* deferred */
    struct api *a;
    struct spec spec;
    struct jobmeta meta; /* the job's tags and notes (schema/jobmeta.h) */
};

/* The planner's failure as the request's error. A data error's answer has no path: the
 * data, or the eval data that the worker's message names (train_check_eval_data). */
void api__plan_error(ddpd_err rc, const struct ddpd_error *perr, struct ddpd_error *err)
{
    *err = *perr;
    if ((rc == DDPD_EDATA || rc == DDPD_ESPEC) && !err->path[0])
        snprintf(err->path, sizeof err->path, "%s",
                 strncmp(err->message, "eval.data: ", 11) == 0 ? "eval.data" : "data");
}

/* The planner's answer, on a planner thread. */
static void planned(void *ctx, ddpd_err rc, const int64_t *counts, bool known, const struct ddpd_error *perr)
{
    struct planning *pl = ctx;
    struct ddpd_error err;
    if (rc != DDPD_OK) {
        api__plan_error(rc, perr, &err);
    } else {
        rc = submit_checked(pl->req, pl->a, &pl->spec, &pl->meta, counts, known, &err);
    }
    if (rc != DDPD_OK)
        http_deferred_done(pl->req, rc, &err);
    jobmeta_clear(&pl->meta);
    free(pl);
}

_Static_assert(SPEC_MAX_WORLD <= PLAN_MAX_WORLD, "the planner takes every world size a spec allows");

/* init.from_job (and init.step) to the weights' path in the jobs folder, or a 422 naming
 * the key: no such job, no such checkpoint (naming the steps there are), no weights yet. */
ddpd_err api__resolve_init_job(struct api *a, const struct spec *spec, char *path, size_t cap,
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
        return api__no_checkpoint_at(err, DDPD_ESPEC, "init.step", "init.step: ", dir, src, step);
    return ddpd_error_set(err, DDPD_ESPEC, "init.from_job",
                          "init.from_job: job %" PRId64
                          " (%s) has no weights yet: no final model and no checkpoint",
                          src, job_state_name(st));
}

/* The planner's request: the job's document (jobdoc.h) without a rank, a group or an
 * out_dir; for a resume, the checkpoint `resume` (NULL: none) to check the data against.
 * NULL when out of memory, or when `resume` does not fit the document (a jobs folder too
 * deep: the supervisor would fail it too). */
json_t *api__plan_doc(const struct api *a, const struct spec *spec, const char *init_path, const char *resume,
                      bool force)
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

bool api__spec_has_files(const struct spec *spec)
{
    return !(spec->data.kind == DATA_SYNTHETIC && !spec->init_from[0] && !spec->init_from_job &&
             !spec->tokenizer_vocab[0] &&
             (spec->eval.every_steps <= 0 || spec->eval.data.kind == DATA_SYNTHETIC));
}

ddpd_err api__memory_check(const struct api *a, const struct spec *spec, struct ddpd_error *err)
{
    /* The memory a rank needs follows from the spec (the planner checks it against the
     * same limit where there are files, or an init.from to check). */
    struct spec_memory mem;
    spec_memory_estimate(
        spec, &(struct spec_memory_in){.rows = spec->data.samples, .eval_rows = spec->eval.data.samples},
        &mem);
    return spec_memory_check(spec, &mem, a->max_rank_memory, "the server's --max-rank-memory", DDPD_ESPEC,
                             err);
}

ddpd_err api__submit(struct http_request *req, struct ddpd_error *err)
{
    struct api *a = api__ctx(req);
    json_t *body = http_request_json(req);
    struct spec_parse_opts po = {.default_device = super_default_device(a->super)};
    struct planning *pl = calloc(1, sizeof *pl);
    if (!pl)
        return ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory checking the job");
    struct spec *spec = &pl->spec;
    /* Tags and notes sit beside the spec's keys; what is left is the spec. */
    ddpd_err rc = jobmeta_from_json(body, true, &pl->meta, err);
    if (rc == DDPD_OK)
        rc = spec_from_json(body, &po, spec, err);
    char why[512];
    const char *blame;
    if (rc == DDPD_OK && !super_fits(a->super, spec->device, spec->world_size, why, sizeof why, &blame))
        rc = ddpd_error_set(err, DDPD_ESPEC, blame, "%s", why);
    /* The submitter's limits (api_users.c): priority, preemptible, world size, queued jobs. */
    if (rc == DDPD_OK)
        rc = api__user_limits(a, http_request_user(req), spec, true, err);
    if (rc)
        goto out;

    /* init.from_job: another job of this server, whose weights lie in its jobs folder. The
     * path is the server's own (never one from the spec), for the planner to check the
     * tensors' names and shapes against the model as it checks init.from. */
    char init_path[PATH_MAX] = "";
    if (spec->init_from_job > 0 && (rc = api__resolve_init_job(a, spec, init_path, sizeof init_path, err)))
        goto out;

    /* The data must be readable and, with join false, even, and a rank must fit in memory.
     * Synthetic data (and eval.data) without init.from or a tokenizer has nothing to read: its counts follow
     * from the spec, here. Files are the planner's to read, on its own threads and processes: nothing that
     * can block on a file runs here. */
    if (!api__spec_has_files(spec)) {
        if ((rc = api__memory_check(a, spec, err)))
            goto out;
        int64_t counts[SPEC_MAX_WORLD];
        for (int r = 0; r < spec->world_size; r++)
            counts[r] = spec_batches(spec_shard_rows(spec->data.samples, r, spec->world_size),
                                     spec->batch_size, spec->data.drop_last);
        /* Deferred first: the insert may answer before submit_checked returns. */
        http_defer(req);
        if ((rc = submit_checked(req, a, spec, &pl->meta, counts, true, err)))
            http_deferred_done(req, rc, err);
        free(pl);
        return DDPD_OK;
    }
    json_t *doc = api__plan_doc(a, spec, init_path, NULL, false);
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
        jobmeta_clear(&pl->meta);
        free(pl);
        return DDPD_OK;
    }
    return DDPD_OK; /* pl is the planner's now */
out:
    jobmeta_clear(&pl->meta);
    free(pl);
    return rc;
}

/* ---- POST /v1/jobs/{id}/resume ----------------------------------------------------------------- */

/* A resumed job between its checks and its commit. */
struct resumption {
    struct http_request *req;
    struct api *a;
    struct store_job j;          /* the job resumed; the new one's spec and name are its */
    int64_t step;                /* the checkpoint's */
    bool force;                  /* ?force=true: even on data changed since the checkpoint */
    struct spec spec;            /* j's spec, parsed: the planner's counts give its total steps */
    char owner[STORE_OWNER_MAX]; /* the resumer: the new job's owner */
};

/* The inserter thread, after the commit: the answer, then the supervisor, which reads the
 * job back from the store (with its link) and stores its queued event. */
static void resumed(void *ctx, ddpd_err rc, const struct store_job *j, const struct ddpd_error *err)
{
    struct resumption *r = ctx;
    struct http_request *req = r->req;
    struct ddpd_error e;
    if (rc == DDPD_OK) {
        rc = api__respond_created(req, j, &e);
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
                               .owner = owner_of(r->req, r->owner),
                               .spec = r->j.spec,
                               .world_size = r->j.world_size,
                               .device = r->j.device,
                               .max_restarts = r->j.max_restarts,
                               .resumed_from = r->j.id,
                               .resume_step = r->step,
                               .resume_force = r->force,
                               /* A resumed job is the same experiment: it keeps its tags and notes. */
                               .tags = r->j.tags,
                               .notes = r->j.notes,
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
        api__plan_error(rc, perr, &err);
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
ddpd_err api__resume(struct http_request *req, struct ddpd_error *err)
{
    static const char *const no_yes[] = {"false", "true", NULL};
    struct api *a = api__ctx(req);
    int64_t id = http_request_id(req, 0), step;
    int force = 0;
    struct resumption *r = calloc(1, sizeof *r);
    if (!r)
        return ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory resuming job %" PRId64, id);
    ddpd_err rc = api__get_job(req, &r->j, err);
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
        if (!jobdir_step_dir(ck, sizeof ck, dir, step)) /* ckpt-S, or the best one best-S */
            jobdir_ckpt_path(ck, sizeof ck, dir, step);
        jobdir_file_path(path, sizeof path, ck, optim);
        if (stat(path, &sb) != 0) {
            rc = api__no_checkpoint_at(err, DDPD_ENOTFOUND, "step", "", dir, id, step);
            goto out;
        }
    } else {
        /* The newest complete checkpoint: the latest ckpt-N, or the best one (keep_best)
         * when it is later. */
        int64_t best;
        bool found = jobdir_latest_ckpt(dir, ck, sizeof ck) && jobdir_ckpt_step(strrchr(ck, '/') + 1, &step);
        if (jobdir_best_find(dir, &best) && (!found || best > step) &&
            jobdir_best_path(ck, sizeof ck, dir, best)) {
            step = best;
            found = true;
        }
        if (!found) {
            rc = ddpd_error_set(err, DDPD_ENOTFOUND, "",
                                "job %" PRId64
                                " has no checkpoint to resume from: it %s before its first checkpoint "
                                "(checkpoint.every_steps)",
                                id, st == JOB_STATE_FAILED ? "failed" : "was cancelled");
            goto out;
        }
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
    /* The resumer's limits, as for a submission (the owner check is api_access.c's). */
    if ((rc = api__user_limits(a, http_request_user(req), &r->spec, true, err)))
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
    json_t *doc = api__plan_doc(a, spec, "", ck, r->force);
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
