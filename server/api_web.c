/* api_web.c — the server's own routes: its devices (GET /v1/devices), its health, its
 * Prometheus metrics (/metrics) and the dashboard's static files (web/). */
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api_impl.h"
#include "http.h"
#include "hub.h"
#include "inference/pool.h"
#include "store.h"
#include "super.h"

/* ---- devices, health, Prometheus -------------------------------------------------------------- */

ddpd_err api__devices(struct http_request *req, struct ddpd_error *err)
{
    (void)err;
    return http_respond_json(req, 200, super_devices(api__ctx(req)->super));
}

ddpd_err api__health(struct http_request *req, struct ddpd_error *err)
{
    ddpd_err rc = store_ping(api__ctx(req)->store, err);
    if (rc)
        return rc;
    return http_respond_json(req, 200, json_pack("{s:b, s:s}", "ok", 1, "database", "ok"));
}

#ifndef DDPD_VERSION
#define DDPD_VERSION "unknown"
#endif

/* Free and busy slots of one kind from the devices' JSON (super_devices): a slot a job or
 * an inference process holds is busy. */
static void slots_count(json_t *devs, const char *key, int64_t *total, int64_t *used)
{
    json_t *arr = json_object_get(devs, key), *slot;
    size_t i;
    *total = *used = 0;
    json_array_foreach (arr, i, slot) {
        (*total)++;
        *used +=
            !json_is_null(json_object_get(slot, "job")) || !json_is_null(json_object_get(slot, "inference"));
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
ddpd_err api__prometheus(struct http_request *req, struct ddpd_error *err)
{
    struct api *a = api__ctx(req);
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
    char *inferm = infer_pool_metrics(a->infer);
    size_t streams_open = 0;
    unsigned long long streams_slow = 0;
    if (srv)
        http_server_stream_stats(srv, &streams_open, &streams_slow);
    json_t *devs = super_devices(a->super);
    int64_t cpu_total, cpu_used, gpu_total, gpu_used;
    slots_count(devs, "cpu_slots", &cpu_total, &cpu_used);
    slots_count(devs, "gpus", &gpu_total, &gpu_used);
    json_decref(devs);
    size_t cap = 8192 + running.n * 600 + (httpm ? strlen(httpm) : 0) + (inferm ? strlen(inferm) : 0), n = 0;
    char *out = malloc(cap);
    if (!out) {
        free(inferm);
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
    if (inferm && n < cap)
        n += (size_t)snprintf(out + n, cap - n, "%s", inferm);
    free(inferm);
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
    struct api *a = api__ctx(req);
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
ddpd_err api__web_root(struct http_request *req, struct ddpd_error *err)
{
    (void)err;
    http_response_header(req, "Location", "/web/index.html");
    return http_respond_empty(req, 302);
}

/* GET /compare?ids=3,5,9: to the dashboard's compare page, #/compare?ids=3,5,9 (its
 * router reads the part after '#'). The ids are job ids, digits and commas only. */
ddpd_err api__web_compare(struct http_request *req, struct ddpd_error *err)
{
    const char *ids = http_query(req, "ids");
    if (!ids)
        ids = "";
    size_t n = strlen(ids);
    if (n > 1024 || strspn(ids, "0123456789,") != n)
        return ddpd_error_set(err, DDPD_EREQUEST, "ids",
                              "ids: expected job ids separated by commas (3,5,9), at most 1024 characters");
    char loc[1100];
    snprintf(loc, sizeof loc, "/web/index.html#/compare?ids=%s", ids);
    http_response_header(req, "Location", loc);
    return http_respond_empty(req, 302);
}

ddpd_err api__web_file(struct http_request *req, struct ddpd_error *err)
{
    const char *p = http_request_path(req);
    return serve_web_file(req, strncmp(p, "/web/", 5) ? "" : p + 5, err);
}
