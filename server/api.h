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
struct http_server;
struct http_route;
struct api;

/* What the handlers work with; every pointer is borrowed and must outlive the api. */
struct api_config {
    struct store *store;
    struct hub *hub;
    struct super *super;
    const char *worker;   /* ddpd-worker, for the submission-time data check */
    const char *data_dir; /* absolute */
    const char *jobs_dir;
    const char *web_dir;     /* the dashboard's files (index.html, ...); NULL = none */
    int64_t max_rank_memory; /* bytes one rank may need (--max-rank-memory); 0 = no limit */
};

/* The route table (static; handlers get the struct api through http_request_ctx). */
const struct http_route *api_routes(size_t *n);

/* A new api over `c` (borrowed; its strings are borrowed too) with its event streams
 * (heartbeats to idle ones every 15 s) and the submission check's planner processes.
 * On DDPD_OK *out is a new api that the caller frees with api_free after the HTTP server
 * that serves it. Errors: DDPD_ENOMEM, DDPD_EINTERNAL; err says which. */
ddpd_err api_new(const struct api_config *c, struct api **out, struct ddpd_error *err);

/* Tells the api its HTTP server (borrowed), for /metrics; may be called while requests
 * run. */
void api_set_http(struct api *a, struct http_server *http);

/* Stops the planner and the streams' heartbeats and frees the api. Every stream must have
 * been closed (free the HTTP server first). NULL is a no-op. */
void api_free(struct api *a);

#endif
