/* api.h — the /v1 handlers of CONTRACT.md §7 and the route table that binds them. They
 * validate input, read the store, hand job changes to the supervisor and open event
 * streams (stream.h). */
#ifndef DDPD_API_H
#define DDPD_API_H

#include <stddef.h>
#include <stdint.h>

#include "../schema/err.h"

struct store;
struct hub;
struct super;
struct sweeper;
struct http_server;
struct http_route;
struct api;

/* The inference pool's settings (`ddpd serve --infer-*`, inference/pool.h). */
struct api_infer_config {
    const char *worker; /* run as `WORKER --infer` */
    const char *dir;    /* the processes' logs and the uploads */
    int procs, queue;
    int64_t memory; /* bytes */
    double idle_s, timeout_s;
    size_t max_bytes; /* the predict route's body limit */
    size_t line_max;  /* the longest answer a worker may write: 4 x max_bytes, at least 16 MiB */
};

/* What the handlers work with; every pointer is borrowed and must outlive the api. */
struct api_config {
    struct store *store;
    struct hub *hub;
    struct super *super;
    struct sweeper *sweeper; /* the sweeps' controller (sweep/sweep.h) */
    const char *worker;      /* ddpd-worker, for the submission-time data check */
    const char *data_dir;    /* absolute */
    const char *jobs_dir;
    const char *web_dir;     /* the dashboard's files (index.html, ...); NULL = none */
    int64_t max_rank_memory; /* bytes one rank may need (--max-rank-memory); 0 = no limit */
    struct api_infer_config infer;
};

/* Named users (api_users.c, api_access.c), as http_config's users_exist, authenticate
 * and authorize take them (ctx: the api). */
struct user;
struct http_request;
int api_users_exist(void *ctx, struct ddpd_error *err);
ddpd_err api_authenticate(void *ctx, const char *token, size_t len, struct user *out, struct ddpd_error *err);
ddpd_err api_authorize(void *ctx, struct http_request *req, struct ddpd_error *err);
/* Whether api_access.c has a rule for the route (method, pattern). */
bool api_access_known(const char *method, const char *pattern);

/* The route table (handlers get the struct api through http_request_ctx): api's own,
 * whose predict route takes bodies up to --infer-max-bytes, valid until api_free; with
 * api NULL the static table (the same rows, the default limits). */
const struct http_route *api_routes(const struct api *a, size_t *n);

/* A new api over `c` (borrowed; its strings are borrowed too) with its event streams
 * (heartbeats to idle ones every 15 s) and the submission check's planner processes.
 * On DDPD_OK *out is a new api that the caller frees with api_free after the HTTP server
 * that serves it. Errors: DDPD_ENOMEM, DDPD_EINTERNAL; err says which. */
ddpd_err api_new(const struct api_config *c, struct api **out, struct ddpd_error *err);

/* Tells the api its HTTP server (borrowed), for /metrics; may be called while requests
 * run. */
void api_set_http(struct api *a, struct http_server *http);

/* Before the HTTP server is freed: the inference pool answers its waiting requests (503)
 * and cancels the running ones, so that the server's wait for deferred answers is short.
 * NULL is a no-op. */
void api_stop(struct api *a);

/* Stops the planner, the inference pool and the streams' heartbeats and frees the api.
 * Every stream must have been closed (free the HTTP server first). NULL is a no-op. */
void api_free(struct api *a);

#endif
