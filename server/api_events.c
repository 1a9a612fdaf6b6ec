/* api_events.c — GET /v1/jobs/{id}/events: a stream (stream.h: the history paged from
 * the store as the client reads it, then the hub's live events) bound to an HTTP stream
 * (http_stream.c), as SSE or NDJSON. */
#include <jansson.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "../base/parse.h"
#include "api_impl.h"
#include "http.h"
#include "hub.h"
#include "store.h"
#include "stream.h"

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

ddpd_err api__events(struct http_request *req, struct ddpd_error *err)
{
    struct api *a = api__ctx(req);
    int64_t job = http_request_id(req, 0), after = 0;
    struct store_job j;
    ddpd_err rc = api__get_job(req, &j, err);
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
