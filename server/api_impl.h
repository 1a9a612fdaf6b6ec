/* api_impl.h — what the files of the /v1 handlers share (not part of api.h's contract):
 * the api struct, the helpers more than one handler file calls, and the handlers the
 * route table in api.c names. Nothing outside server/api*.c includes this.
 *
 * The files: api.c (the api's life and the route table), api_jobs.c (a job as JSON, the
 * rendered-job cache, list, get, cancel, delete, patch), api_submit.c (submit and resume, with
 * the planner's data check), api_files.c (a job's curve, logs and checkpoints), api_metrics_csv.c (the curve
 * as CSV), api_events.c (the event stream), api_web.c (devices, health, /metrics, the dashboard's files),
 * api_infer.c (generate, predict and the inference pool's state), api_pytorch.c (the job's model as
 * model.py), api_sweeps.c (hyper-parameter sweeps), api_queue.c (the queue as a view), api_users.c
 * (authentication against the users table, /v1/whoami, /v1/users, a user's submission limits), api_access.c
 * (who may call each route). */
#ifndef DDPD_API_IMPL_H
#define DDPD_API_IMPL_H

#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../schema/err.h"
#include "../schema/spec.h"
#include "../schema/job_state.h"
#include "api.h"
#include "http.h"

struct store_job;
struct infer_pool;

/* The rendered-job cache's size (api_jobs.c, api__job_cache_respond). */
#define API_JOB_CACHE_SLOTS 256

struct api_job_cache_slot {
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
    struct sweeper *sweeper;
    struct http_server *http; /* for /metrics; set by api_set_http after the server starts */
    const char *worker, *data_dir, *jobs_dir, *web_dir;
    int64_t max_rank_memory;
    double plan_timeout_s;    /* see API_PLAN_TIMEOUT_S */
    struct planner *planner;  /* ddpd-worker --plan processes for the submission check */
    struct streams *streams;  /* the event streams and their heartbeats */
    struct infer_pool *infer; /* the inference processes (inference/pool.h) */
    struct api_infer_config infer_cfg;
    /* The route table with this server's limits (api_routes). */
    struct http_route *routes;
    size_t nroutes;
    struct api_job_cache_slot job_cache[API_JOB_CACHE_SLOTS];
};

/* The data check's deadline: a data file that blocks on open holds a planner process
 * (never an HTTP thread) this long. DDPD_PLAN_TIMEOUT_S (seconds, 1-3600) changes it, for
 * tests of that case. */
#define API_PLAN_TIMEOUT_S 30.0

/* The api of a request's server (http_config.ctx). */
struct api *api__ctx(struct http_request *req);

/* ---- api_jobs.c ---------------------------------------------------------------------------- */

/* Job `{id}` of the request's path into *j (zeroed first; the caller clears it with
 * store_job_clear). DDPD_ENOTFOUND when there is none. */
ddpd_err api__get_job(struct http_request *req, struct store_job *j, struct ddpd_error *err);
/* 201 with the job just stored and its Location; the job is stored whatever this returns,
 * so a failure's text (in *e) says so. */
ddpd_err api__respond_created(struct http_request *req, const struct store_job *j, struct ddpd_error *e);
void api__job_cache_init(struct api *a);
void api__job_cache_clear(struct api *a);

/* ---- api_submit.c: the submission checks a sweep shares (api_sweeps.c) -------------------- */

/* The planner's failure as a request's error (a data error without a path: `data`, or
 * `eval.data` when the message names it). */
void api__plan_error(ddpd_err rc, const struct ddpd_error *perr, struct ddpd_error *err);
/* init.from_job to its weights' path in the jobs folder, or a 422 naming the key. */
ddpd_err api__resolve_init_job(struct api *a, const struct spec *spec, char *path, size_t cap,
                               struct ddpd_error *err);
/* The planner's request for `spec` (jobdoc.h; resume NULL: none): a new reference, NULL
 * when out of memory. */
json_t *api__plan_doc(const struct api *a, const struct spec *spec, const char *init_path, const char *resume,
                      bool force);
/* Whether a spec has files to read (data, eval data, init.from, a tokenizer): then the
 * planner checks them; else its batch counts and memory follow from the spec alone. */
bool api__spec_has_files(const struct spec *spec);
/* A spec without files against --max-rank-memory: a 422 when a rank would need more. */
ddpd_err api__memory_check(const struct api *a, const struct spec *spec, struct ddpd_error *err);

/* ---- api_files.c ------------------------------------------------------------------------- */

/* "5, 10, 15" (the newest few when there are many) into buf[cap]; "none" for no steps. */
void api__steps_text(const int64_t *steps, size_t n, char *buf, size_t cap);
/* `code` at `path`: "<prefix>job ID has no checkpoint at step STEP; it has steps 5, 10"
 * (or "step 5", or "none"), the steps read from the job's folder `dir`. */
ddpd_err api__no_checkpoint_at(struct ddpd_error *err, ddpd_err code, const char *path, const char *prefix,
                               const char *dir, int64_t id, int64_t step);

/* ---- api_metrics_csv.c ------------------------------------------------------------------- */

/* GET /v1/jobs/{id}/metrics?format=csv: `m` (borrowed) as text/csv, a header row
 * (step,loss,loss_rank_R..,lr,eval_loss,eval_accuracy,eval_samples) and a row per step. */
struct store_metrics;
ddpd_err api__metrics_csv(struct http_request *req, const struct store_metrics *m, struct ddpd_error *err);

/* ---- the handlers of the route table (api.c) ---------------------------------------------- */

ddpd_err api__submit(struct http_request *req, struct ddpd_error *err);      /* api_submit.c */
ddpd_err api__resume(struct http_request *req, struct ddpd_error *err);      /* api_submit.c */
ddpd_err api__list(struct http_request *req, struct ddpd_error *err);        /* api_jobs.c */
ddpd_err api__get(struct http_request *req, struct ddpd_error *err);         /* api_jobs.c */
ddpd_err api__cancel(struct http_request *req, struct ddpd_error *err);      /* api_jobs.c */
ddpd_err api__delete(struct http_request *req, struct ddpd_error *err);      /* api_jobs.c */
ddpd_err api__patch(struct http_request *req, struct ddpd_error *err);       /* api_jobs.c */
ddpd_err api__events(struct http_request *req, struct ddpd_error *err);      /* api_events.c */
ddpd_err api__metrics(struct http_request *req, struct ddpd_error *err);     /* api_files.c */
ddpd_err api__logs(struct http_request *req, struct ddpd_error *err);        /* api_files.c */
ddpd_err api__checkpoints(struct http_request *req, struct ddpd_error *err); /* api_files.c */
ddpd_err api__checkpoint(struct http_request *req, struct ddpd_error *err);  /* api_files.c */
ddpd_err api__devices(struct http_request *req, struct ddpd_error *err);     /* api_web.c */
ddpd_err api__health(struct http_request *req, struct ddpd_error *err);      /* api_web.c */
ddpd_err api__prometheus(struct http_request *req, struct ddpd_error *err);  /* api_web.c */
ddpd_err api__web_root(struct http_request *req, struct ddpd_error *err);    /* api_web.c */
ddpd_err api__web_compare(struct http_request *req, struct ddpd_error *err); /* api_web.c */
ddpd_err api__web_file(struct http_request *req, struct ddpd_error *err);    /* api_web.c */
ddpd_err api__generate(struct http_request *req, struct ddpd_error *err);    /* api_infer.c */
ddpd_err api__predict(struct http_request *req, struct ddpd_error *err);     /* api_infer.c */
ddpd_err api__inference(struct http_request *req, struct ddpd_error *err);   /* api_infer.c */
ddpd_err api__pytorch(struct http_request *req, struct ddpd_error *err);     /* api_pytorch.c */
ddpd_err api__queue(struct http_request *req, struct ddpd_error *err);       /* api_queue.c */

/* Users (api_users.c). */
ddpd_err api__whoami(struct http_request *req, struct ddpd_error *err);
ddpd_err api__users_list(struct http_request *req, struct ddpd_error *err);
ddpd_err api__users_add(struct http_request *req, struct ddpd_error *err);
ddpd_err api__users_patch(struct http_request *req, struct ddpd_error *err);
ddpd_err api__users_delete(struct http_request *req, struct ddpd_error *err);
ddpd_err api__users_rotate(struct http_request *req, struct ddpd_error *err);
ddpd_err api__preempt(struct http_request *req, struct ddpd_error *err); /* api_jobs.c */
/* A submission of `spec` by `u` against u's limits (api_users.c): priority above
 * max_priority, preemptible false or a world_size past max_gpus / max_cpu_ranks is a 403
 * naming the field; with count_queued, u's queued and preempted jobs at max_queued a 429
 * (quota_exceeded, path max_queued). Admins (and u NULL) have no limits. */
struct user;
ddpd_err api__user_limits(struct api *a, const struct user *u, const struct spec *spec, bool count_queued,
                          struct ddpd_error *err);

/* The sweep routes (api_sweeps.c). */
ddpd_err api__sweep_submit(struct http_request *req, struct ddpd_error *err);
ddpd_err api__sweep_list(struct http_request *req, struct ddpd_error *err);
ddpd_err api__sweep_get(struct http_request *req, struct ddpd_error *err);
ddpd_err api__sweep_cancel(struct http_request *req, struct ddpd_error *err);

#endif
