/* api.c — the /v1 API: its life (api_new, api_free) and its route table, which binds each
 * route to its handler in the api_*.c files (api_impl.h). The handlers validate what the
 * client sent (errors name the JSON path or the query parameter), read the store for
 * answers, and hand job changes to the supervisor. */
#include "api.h"

#include <stdlib.h>
#include <string.h>

#include "api_impl.h"
#include "http.h"
#include "inference/pool.h"
#include "planner.h"
#include "stream.h"

struct api *api__ctx(struct http_request *req)
{
    return http_request_ctx(req);
}

/* Planner processes: two answer while a third submission waits (each answer takes
 * microseconds to a few milliseconds; more processes would only cost memory). */
#define PLANNERS 2
/* The inference workers' niceness: training ranks and the HTTP threads go first. */
#define INFER_NICE 5

static struct http_route *route_table(const struct api *a, size_t *n);

ddpd_err api_new(const struct api_config *c, struct api **out, struct ddpd_error *err)
{
    *out = NULL;
    struct api *a = calloc(1, sizeof *a);
    if (!a)
        return ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory for the api");
    *a = (struct api){.store = c->store,
                      .hub = c->hub,
                      .super = c->super,
                      .sweeper = c->sweeper,
                      .worker = c->worker,
                      .data_dir = c->data_dir,
                      .jobs_dir = c->jobs_dir,
                      .web_dir = c->web_dir,
                      .max_rank_memory = c->max_rank_memory};
    const char *pt = getenv("DDPD_PLAN_TIMEOUT_S");
    char *end = NULL;
    double t = pt ? strtod(pt, &end) : 0;
    a->plan_timeout_s = pt && end != pt && !*end && t >= 1 && t <= 3600 ? t : API_PLAN_TIMEOUT_S;
    a->infer_cfg = c->infer;
    api__job_cache_init(a);
    ddpd_err rc = streams_new(a->hub, a->store, 0, &a->streams, err);
    if (rc == DDPD_OK && !(a->planner = planner_new(a->worker, PLANNERS)))
        rc = ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory for the planner");
    if (rc == DDPD_OK && !(a->routes = route_table(a, &a->nroutes)))
        rc = ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory for the routes");
    if (rc == DDPD_OK) {
        struct infer_pool_opts po = {.worker = c->infer.worker,
                                     .dir = c->infer.dir,
                                     .procs = c->infer.procs,
                                     .queue = c->infer.queue,
                                     .memory = c->infer.memory,
                                     .idle_s = c->infer.idle_s,
                                     .timeout_s = c->infer.timeout_s,
                                     .line_max = c->infer.line_max,
                                     .nice = INFER_NICE,
                                     .super = c->super};
        rc = infer_pool_new(&po, &a->infer, err);
    }
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

void api_stop(struct api *a)
{
    if (a)
        infer_pool_stop(a->infer);
}

void api_free(struct api *a)
{
    if (!a)
        return;
    infer_pool_free(a->infer);
    free(a->routes);
    planner_free(a->planner);
    streams_free(a->streams);
    api__job_cache_clear(a);
    free(a);
}

static const struct http_route routes[] = {
    {"POST", "/v1/jobs", api__submit, HTTP_ROUTE_AUTH | HTTP_ROUTE_JSON, 0, ""},
    {"GET", "/v1/jobs", api__list, HTTP_ROUTE_AUTH, 0, "state limit before name tag"},
    {"GET", "/v1/jobs/{id}", api__get, HTTP_ROUTE_AUTH, 0, ""},
    {"DELETE", "/v1/jobs/{id}", api__delete, HTTP_ROUTE_AUTH, 0, ""},
    /* A job's tags and notes (schema/jobmeta.h). */
    {"PATCH", "/v1/jobs/{id}", api__patch, HTTP_ROUTE_AUTH | HTTP_ROUTE_JSON, 0, ""},
    {"POST", "/v1/jobs/{id}/cancel", api__cancel, HTTP_ROUTE_AUTH, 0, ""},
    {"POST", "/v1/jobs/{id}/resume", api__resume, HTTP_ROUTE_AUTH, 0, "step force"},
    {"POST", "/v1/jobs/{id}/preempt", api__preempt, HTTP_ROUTE_AUTH, 0, ""},
    {"GET", "/v1/jobs/{id}/events", api__events, HTTP_ROUTE_AUTH, 0, "format after"},
    {"GET", "/v1/jobs/{id}/metrics", api__metrics, HTTP_ROUTE_AUTH, 0, "max_points format"},
    {"GET", "/v1/jobs/{id}/logs", api__logs, HTTP_ROUTE_AUTH, 0, "rank tail"},
    {"GET", "/v1/jobs/{id}/checkpoint", api__checkpoint, HTTP_ROUTE_AUTH, 0, "step file format"},
    {"GET", "/v1/jobs/{id}/checkpoints", api__checkpoints, HTTP_ROUTE_AUTH, 0, ""},
    {"GET", "/v1/jobs/{id}/pytorch", api__pytorch, HTTP_ROUTE_AUTH, 0, ""},
    /* Inference (api_infer.c): predict's body is JSON or a .npy file, up to
     * --infer-max-bytes (route_table sets the limit). */
    {"POST", "/v1/jobs/{id}/generate", api__generate, HTTP_ROUTE_AUTH | HTTP_ROUTE_JSON, 0, ""},
    {"POST", "/v1/jobs/{id}/predict", api__predict, HTTP_ROUTE_AUTH | HTTP_ROUTE_BODY, 0, "step device"},
    {"GET", "/v1/inference", api__inference, HTTP_ROUTE_AUTH, 0, ""},
    /* Hyper-parameter sweeps (api_sweeps.c). */
    {"POST", "/v1/sweeps", api__sweep_submit, HTTP_ROUTE_AUTH | HTTP_ROUTE_JSON, 0, ""},
    {"GET", "/v1/sweeps", api__sweep_list, HTTP_ROUTE_AUTH, 0, "state limit before"},
    {"GET", "/v1/sweeps/{id}", api__sweep_get, HTTP_ROUTE_AUTH, 0, ""},
    {"POST", "/v1/sweeps/{id}/cancel", api__sweep_cancel, HTTP_ROUTE_AUTH, 0, ""},
    {"GET", "/v1/devices", api__devices, HTTP_ROUTE_AUTH, 0, ""},
    {"GET", "/v1/queue", api__queue, HTTP_ROUTE_AUTH, 0, "limit"},
    /* Users (api_users.c; who may call what: api_access.c). */
    {"GET", "/v1/whoami", api__whoami, HTTP_ROUTE_AUTH, 0, ""},
    {"GET", "/v1/users", api__users_list, HTTP_ROUTE_AUTH, 0, ""},
    {"POST", "/v1/users", api__users_add, HTTP_ROUTE_AUTH | HTTP_ROUTE_JSON, 0, ""},
    {"PATCH", "/v1/users/{name:word}", api__users_patch, HTTP_ROUTE_AUTH | HTTP_ROUTE_JSON, 0, ""},
    {"DELETE", "/v1/users/{name:word}", api__users_delete, HTTP_ROUTE_AUTH, 0, ""},
    {"POST", "/v1/users/{name:word}/rotate", api__users_rotate, HTTP_ROUTE_AUTH, 0, ""},
    {"GET", "/healthz", api__health, 0, 0, NULL},
    {"GET", "/metrics", api__prometheus, 0, 0, NULL},
    /* The dashboard (open without a token, CONTRACT.md §7). Route patterns match literal
     * segments only, so each file of web/ has its row: a new file needs one here. */
    {"GET", "/", api__web_root, 0, 0, NULL},
    {"GET", "/web", api__web_root, 0, 0, NULL},
    {"GET", "/compare", api__web_compare, 0, 0, "ids"},
    {"GET", "/web/index.html", api__web_file, 0, 0, NULL},
    {"GET", "/web/style.css", api__web_file, 0, 0, NULL},
    {"GET", "/web/favicon.svg", api__web_file, 0, 0, NULL},
    {"GET", "/web/util.js", api__web_file, 0, 0, NULL},
    {"GET", "/web/api.js", api__web_file, 0, 0, NULL},
    {"GET", "/web/chart.js", api__web_file, 0, 0, NULL},
    {"GET", "/web/templates.js", api__web_file, 0, 0, NULL},
    {"GET", "/web/views.js", api__web_file, 0, 0, NULL},
    {"GET", "/web/sample.js", api__web_file, 0, 0, NULL},
    {"GET", "/web/job.js", api__web_file, 0, 0, NULL},
    {"GET", "/web/compare.js", api__web_file, 0, 0, NULL},
    {"GET", "/web/app.js", api__web_file, 0, 0, NULL},
    {"GET", "/web/sweep.js", api__web_file, 0, 0, NULL},
    {"GET", "/web/queue.js", api__web_file, 0, 0, NULL},
};

/* A copy of the table with this server's limits: the predict route's body limit. */
static struct http_route *route_table(const struct api *a, size_t *n)
{
    *n = sizeof routes / sizeof routes[0];
    struct http_route *t = malloc(sizeof routes);
    if (!t)
        return NULL;
    memcpy(t, routes, sizeof routes);
    for (size_t i = 0; i < *n; i++)
        if (t[i].handler == api__predict)
            t[i].max_body = a->infer_cfg.max_bytes;
    return t;
}

const struct http_route *api_routes(const struct api *a, size_t *n)
{
    if (a) {
        *n = a->nroutes;
        return a->routes;
    }
    *n = sizeof routes / sizeof routes[0];
    return routes;
}
