/* http_stream.c — streaming responses (SSE, NDJSON): a buffer that any thread writes or an
 * owner's pull fills, read by libmicrohttpd's content reader, which suspends the
 * connection while there is nothing to send. Knows nothing of events. */
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "../base/alloc.h"
#include "../base/check.h"
#include "http_impl.h"

#define STREAM_BLOCK (16 * 1024)

/* ---- streams ------------------------------------------------------------------------------ */

void http__stream_release(struct http_stream *st)
{
    pthread_mutex_lock(&st->mu);
    int left = --st->refs;
    pthread_mutex_unlock(&st->mu);
    if (left)
        return;
    pthread_mutex_destroy(&st->mu);
    free(st->buf);
    free(st);
}

/* Under st->mu: wakes the connection so the content reader runs again. */
void http__stream_wake(struct http_stream *st)
{
    if (st->suspended && st->mc) {
        st->suspended = false;
        MHD_resume_connection(st->mc);
    }
}

/* Under st->mu: ends the stream for writers and frees what is queued. */
void http__stream_end_locked(struct http_stream *st, enum http_stream_end why)
{
    if (st->ended)
        return;
    st->ended = true;
    st->why = why;
    free(st->buf);
    st->buf = NULL;
    st->off = st->len = st->cap = 0;
}

/* The MHD side is done with the stream (response freed or request ended): the first call
 * settles why it ended, unlinks it and calls on_close. On an HTTP thread. */
void http__stream_finish(struct http_stream *st, bool completed_ok)
{
    pthread_mutex_lock(&st->mu);
    if (st->finished) {
        pthread_mutex_unlock(&st->mu);
        return;
    }
    st->finished = true;
    st->mc = NULL;
    st->fd = -1;
    st->suspended = false;
    bool done = (st->owner_closed || st->pulled_out) && st->len == 0 && (completed_ok || !st->ended);
    http__stream_end_locked(st, done ? HTTP_STREAM_DONE : HTTP_STREAM_GONE);
    enum http_stream_end why = st->why;
    pthread_mutex_unlock(&st->mu);

    struct http_server *s = st->srv;
    pthread_mutex_lock(&s->mu);
    if (st->prev)
        st->prev->next = st->next;
    else
        s->streams = st->next;
    if (st->next)
        st->next->prev = st->prev;
    st->prev = st->next = NULL;
    s->nstreams--;
    if (why == HTTP_STREAM_SLOW)
        s->slow_total++;
    st->srv = NULL;
    pthread_mutex_unlock(&s->mu);

    if (st->on_close)
        st->on_close(st->arg, why);
}

/* libmicrohttpd's content reader: written bytes first, then the owner's pull; with
 * nothing to send it parks (suspends) the connection, which a write, wake, close or the
 * server's shutdown resumes. Never returns 0 without suspending (that would spin). */
static ssize_t stream_read(void *cls, uint64_t pos, char *out, size_t max)
{
    (void)pos;
    struct http_stream *st = cls;
    pthread_mutex_lock(&st->mu);
    for (;;) {
        ssize_t n;
        if (st->ended) {
            n = MHD_CONTENT_READER_END_WITH_ERROR;
        } else if (st->len > 0) {
            size_t k = st->len < max ? st->len : max;
            memcpy(out, st->buf + st->off, k);
            st->off += k;
            st->len -= k;
            if (st->len == 0)
                st->off = 0;
            n = (ssize_t)k;
        } else if (st->owner_closed || st->pulled_out) {
            n = MHD_CONTENT_READER_END_OF_STREAM;
        } else if (st->pull) {
            st->woken = false;
            pthread_mutex_unlock(&st->mu);
            long got = st->pull(st->arg, out, max);
            pthread_mutex_lock(&st->mu);
            if (got > 0 && !st->ended) {
                n = (ssize_t)(got < (long)max ? got : (long)max);
            } else {
                if (got < 0)
                    st->pulled_out = true;
                else if (got == 0 && !st->woken && !st->ended && !st->owner_closed && st->len == 0)
                    goto park;
                continue; /* something changed meanwhile: look again */
            }
        } else {
            goto park;
        }
        pthread_mutex_unlock(&st->mu);
        return n;
    }
park:
    /* Under mu, so a writer or waker sees `suspended` and resumes the connection. */
    st->suspended = true;
    MHD_suspend_connection(st->mc);
    pthread_mutex_unlock(&st->mu);
    return 0;
}

static void stream_response_free(void *cls)
{
    struct http_stream *st = cls;
    http__stream_finish(st, false);
    http__stream_release(st);
}

ddpd_err http_stream_write(struct http_stream *st, const void *data, size_t len)
{
    ddpd_err rc = DDPD_OK;
    pthread_mutex_lock(&st->mu);
    if (st->ended || st->owner_closed) {
        rc = DDPD_ECANCELED;
    } else if (len > st->max - st->len) {
        /* The client does not keep up: drop it rather than buffer without bound. Cutting
         * the socket makes libmicrohttpd notice at once even while its send is stuck. */
        http__stream_end_locked(st, HTTP_STREAM_SLOW);
        if (st->mc && st->fd >= 0)
            shutdown(st->fd, SHUT_RDWR);
        http__stream_wake(st);
        rc = DDPD_EBUSY;
    } else if (len > 0) {
        if (st->off + st->len + len > st->cap) {
            if (st->len + len <= st->cap) {
                memmove(st->buf, st->buf + st->off, st->len);
            } else {
                size_t cap = st->cap ? st->cap : 4096;
                while (cap < st->len + len)
                    cap *= 2;
                if (cap > st->max)
                    cap = st->max;
                char *b = xmalloc(cap);
                if (st->len)
                    memcpy(b, st->buf + st->off, st->len);
                free(st->buf);
                st->buf = b;
                st->cap = cap;
            }
            st->off = 0;
        }
        memcpy(st->buf + st->off + st->len, data, len);
        st->len += len;
        http__stream_wake(st);
    }
    pthread_mutex_unlock(&st->mu);
    return rc;
}

void http_stream_wake(struct http_stream *st)
{
    pthread_mutex_lock(&st->mu);
    st->woken = true;
    http__stream_wake(st);
    pthread_mutex_unlock(&st->mu);
}

void http_stream_close(struct http_stream *st)
{
    if (!st)
        return;
    pthread_mutex_lock(&st->mu);
    ASSERT(!st->owner_closed);
    st->owner_closed = true;
    http__stream_wake(st);
    pthread_mutex_unlock(&st->mu);
    http__stream_release(st);
}

ddpd_err http_respond_stream(struct http_request *req, const struct http_stream_opts *o,
                             struct http_stream **out, struct ddpd_error *err)
{
    *out = NULL;
    if (http__responded(req))
        return ddpd_error_set(err, DDPD_EINTERNAL, "", "a response was already set");
    struct http_stream *st = xcalloc(1, sizeof *st);
    pthread_mutex_init(&st->mu, NULL);
    st->refs = 3; /* owner, response, request */
    st->mc = req->mc;
    st->fd = req->conn ? req->conn->fd : -1;
    st->max = o->max_buffer ? o->max_buffer : (size_t)1 << 20;
    st->on_close = o->on_close;
    st->arg = o->arg;
    st->pull = o->pull;

    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, STREAM_BLOCK, stream_read,
                                                               st, stream_response_free);
    if (!r) {
        pthread_mutex_destroy(&st->mu);
        free(st);
        return ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory");
    }
    http__add_content_type(r, o->content_type ? o->content_type : "text/event-stream");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(r, "X-Accel-Buffering", "no");

    struct http_server *s = req->srv;
    pthread_mutex_lock(&s->mu);
    bool stopping = s->stopping;
    if (!stopping) {
        st->srv = s;
        st->next = s->streams;
        if (s->streams)
            s->streams->prev = st;
        s->streams = st;
        s->nstreams++;
    }
    pthread_mutex_unlock(&s->mu);
    if (stopping) {
        st->on_close = NULL; /* never opened: the caller hears it from the return value */
        st->finished = true;
        st->refs = 1;
        MHD_destroy_response(r); /* drops the response's reference */
        return ddpd_error_set(err, DDPD_EBUSY, "", "the server is shutting down");
    }
    http__set_response(req, 200, r);
    req->stream = st;
    *out = st;
    return DDPD_OK;
}
