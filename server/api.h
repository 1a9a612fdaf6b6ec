/* api.h — the /v1 handlers of CONTRACT.md §7 and the route table that binds them. They
 * validate input, read the store, and hand job changes to the supervisor. */
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

struct api {
    struct store *store;
    struct hub *hub;
    struct super *super;
    struct http_server *http; /* for /metrics; set after the server starts */
    const char *worker;       /* ddpd-worker, for the submission-time data check */
    const char *data_dir;     /* absolute */
    const char *jobs_dir;
    const char *web_dir;      /* the dashboard's files (index.html, ...); NULL = none */
    int64_t max_rank_memory;  /* bytes one rank may need (--max-rank-memory); 0 = no limit */
    /* Set up by api_start: */
    struct planner *planner;  /* ddpd-worker --plan processes for the submission check */
};

/* The route table (static; handlers get the struct api through http_request_ctx). */
const struct http_route *api_routes(size_t *n);

/* Starts / stops the thread that sends heartbeats to idle event streams every 15 s, and
 * the submission check's planner processes. */
ddpd_err api_start(struct api *a, struct ddpd_error *err);
void api_stop(struct api *a);

#endif
