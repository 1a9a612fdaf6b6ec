/* stream.c — one client's event stream: the history paged from the store, then the hub's
 * live tail, with its keep-alives; and the streams of a server, whose heartbeat thread
 * wakes the idle ones (stream.h). Holds one page at most; never buffers a history whole.
 * Knows nothing of HTTP or of the supervisor. */
#include "stream.h"

#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../base/clock.h"
#include "store.h"

#define PAGE_EVENTS          1000
#define PAGE_BYTES           (64u * 1024)
#define STREAM_AFTER_MAX     (INT64_MAX / 2)
#define HEARTBEAT_S          15.0
#define HEARTBEAT_POLL_MAX_S 5.0 /* the heartbeat thread looks at least this often */

/* The streams of a server: the open ones (for the heartbeat thread) and that thread. */
struct streams {
    struct hub *hub;
    struct store *store;
    double heartbeat_s;
    pthread_mutex_t mu; /* the list; held while the heartbeat thread wakes streams */
    pthread_cond_t cv;  /* stop */
    bool stop;
    struct stream *head;
    pthread_t thread;
};

/* Where a stream is. HISTORY: paging the store, no hub subscription. GAP: subscribed,
 * the hub delivers seq >= from; paging the store for seq < from. LIVE: pulling the hub.
 * DONE / CLOSED: what is in the page is the last of it, then STREAM_END / STREAM_CLOSED. */
enum phase { PH_HISTORY, PH_GAP, PH_LIVE, PH_DONE, PH_CLOSED };

struct stream {
    struct hub *hub;
    struct store *store;
    int64_t job;
    hub_format fmt;
    size_t page_events, page_bytes;
    void (*wake)(void *ctx);
    void *ctx;
    double heartbeat_s;
    _Atomic int64_t last_write_us; /* the pull writes it, the heartbeat thread reads it */
    struct streams *owner;         /* NULL when opened alone (stream_open) */
    struct stream *prev, *next;    /* in owner's list, under owner->mu */

    enum phase ph;
    struct hub_sub *sub;
    int64_t last;     /* the seq of the last event put into the page (after, at first) */
    int64_t from;     /* GAP: the smallest seq the hub delivers */
    bool caught_up;   /* the last page was not full: the store (or the gap) has no more */
    bool row_checked; /* GAP with an unknown `from`: the job row was read once (see gap_done) */
    char *page;       /* frames not yet taken: page[off .. len) */
    size_t off, len, cap;
    char why[512];
};

static bool idle(const struct stream *st)
{
    return st->heartbeat_s > 0 && (double)(base_mono_us() - st->last_write_us) * 1e-6 >= st->heartbeat_s;
}

static void on_ready(void *ctx)
{
    struct stream *st = ctx;
    if (st->wake)
        st->wake(st->ctx);
}

static void on_drop(void *ctx, const char *reason)
{
    (void)reason; /* hub_sub_reason keeps it; the pull reports it */
    on_ready(ctx);
}

/* A page buffer: room for page_bytes of bodies and their frames' headers, and then for
 * two whole frames more (the store lets the first row of a page pass the byte cap, and a
 * stream_error frame always fits after a page). Allocated while the stream pages its
 * history, freed when it goes live (the hub then fills the caller's buffer). */
static bool page_alloc(struct stream *st)
{
    if (!st->page) {
        st->cap = st->page_bytes + 2 * (size_t)HUB_FRAME_MAX;
        st->page = malloc(st->cap);
        st->off = st->len = 0;
    }
    return st->page != NULL;
}

/* Ends the stream with a stream_error frame saying `fmt...` (also kept for stream_why),
 * after what the page holds (whole events read before the failure). */
static void fail(struct stream *st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(struct stream *st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(st->why, sizeof st->why, fmt, ap);
    va_end(ap);
    st->ph = PH_CLOSED;
    json_t *o =
        json_pack("{s:s, s:I, s:s}", "event", "stream_error", "job", (json_int_t)st->job, "message", st->why);
    char *body = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    /* The frame fits in the room a page keeps (fill_row): the message is at most
     * sizeof why bytes, each escaped to 6 at most, well under HUB_FRAME_MAX. */
    char *at = body && page_alloc(st) ? st->page + st->len : NULL;
    int n = at ? hub_format_event(st->fmt, 0, "stream_error", body, strlen(body), at, st->cap - st->len) : -1;
    if (n > 0 && st->fmt == HUB_FORMAT_SSE) {
        /* No `id:` line: the client's Last-Event-ID stays its last real event's. */
        char *nl = memchr(at, '\n', (size_t)n);
        size_t cut = nl ? (size_t)(nl + 1 - at) : 0;
        memmove(at, at + cut, (size_t)n - cut);
        n -= (int)cut;
    }
    if (n > 0)
        st->len += (size_t)n;
    free(body);
}

ddpd_err stream_open(struct hub *h, struct store *s, int64_t job, int64_t after, const struct stream_opts *o,
                     struct stream **out, struct ddpd_error *err)
{
    *out = NULL;
    struct stream *st = calloc(1, sizeof *st);
    if (!st)
        return ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory opening the events of job %" PRId64, job);
    st->hub = h;
    st->store = s;
    st->job = job;
    st->fmt = o->format;
    st->page_events = o->page_events ? o->page_events : PAGE_EVENTS;
    st->page_bytes = o->page_bytes ? o->page_bytes : PAGE_BYTES;
    if (st->page_events > STORE_EVENTS_MAX)
        st->page_events = STORE_EVENTS_MAX;
    st->wake = o->wake;
    st->ctx = o->ctx;
    st->heartbeat_s = o->heartbeat_s > 0 ? o->heartbeat_s : 0;
    st->last_write_us = base_mono_us();
    /* No job gets near 2^62 events: a larger `after` means "nothing yet" as well, and
     * keeps every seq + 1 here and in the hub from overflowing. */
    st->last = after < 0 ? 0 : after > STREAM_AFTER_MAX ? STREAM_AFTER_MAX : after;
    after = st->last;

    /* Subscribing first answers the common cases at once: a client that follows a live
     * job from the hub's tail (no gap), and the subscriber limit (503 now, not later). */
    struct hub_sub_opts so = {.format = st->fmt, .on_ready = on_ready, .on_drop = on_drop, .ctx = st};
    int64_t from;
    ddpd_err rc = hub_subscribe(h, job, after, &so, &st->sub, &from);
    if (rc) {
        free(st);
        return ddpd_error_set(err, rc, "", "cannot follow job %" PRId64 " now: too many subscribers", job);
    }
    if (from == after + 1) {
        st->ph = PH_LIVE;
    } else if (from != HUB_SEQ_UNKNOWN && from > after && (uint64_t)(from - after - 1) <= st->page_events) {
        /* A short gap: fill it while the hub keeps what follows. */
        store_flush(s, NULL);
        st->ph = PH_GAP;
        st->from = from;
    } else {
        /* A long history (or one the hub never saw): page it without a subscription, and
         * join the hub when the store has no more (page_done). */
        hub_unsubscribe(st->sub);
        st->sub = NULL;
        st->ph = PH_HISTORY;
    }
    *out = st;
    return DDPD_OK;
}

struct fill {
    struct stream *st;
    int64_t bound; /* rows with seq >= bound are the hub's */
    size_t rows, bytes;
    bool at_bound; /* the next row is the hub's */
    bool full;     /* the page has no room for another frame */
    bool bad;      /* a row that cannot be framed */
    bool final;
};

static bool fill_row(void *ctx, const struct store_event_row *row)
{
    struct fill *f = ctx;
    struct stream *st = f->st;
    if (row->seq >= f->bound) {
        f->at_bound = true;
        return false;
    }
    /* Keep room for one more frame after this one (fail's stream_error). */
    if (st->cap - st->len < 2 * (size_t)HUB_FRAME_MAX) {
        f->full = true;
        return false;
    }
    int n = hub_format_event(st->fmt, row->seq, event_kind_name(row->kind), row->body, row->len,
                             st->page + st->len, st->cap - st->len - HUB_FRAME_MAX);
    if (n <= 0) {
        f->bad = true;
        return false;
    }
    st->len += (size_t)n;
    st->last = row->seq;
    f->rows++;
    f->bytes += row->len;
    if (row->kind == EVENT_STATE) {
        struct event ev;
        if (event_decode(row->body, row->len, &ev, NULL) == DDPD_OK && event_is_final(&ev)) {
            f->final = true;
            return false; /* nothing of the job follows its final event */
        }
    }
    return true;
}

/* Reads the next page of the store (events after st->last, below `bound`) into the
 * empty page. */
static void page_read(struct stream *st, int64_t bound)
{
    if (!page_alloc(st)) {
        /* Nothing can be said to the client without a buffer: end the stream as
         * closed, not complete. */
        snprintf(st->why, sizeof st->why, "out of memory reading the events of job %" PRId64, st->job);
        st->ph = PH_CLOSED;
        return;
    }
    struct fill f = {.st = st, .bound = bound};
    struct ddpd_error e = {0};
    st->off = st->len = 0;
    ddpd_err rc = store_events_page(st->store, st->job, st->last, (int)st->page_events, st->page_bytes,
                                    fill_row, &f, NULL, &e);
    if (rc != DDPD_OK) {
        /* The events read before the error are whole and in order: they go first, and
         * the client resumes after the last of them. */
        fail(st, "cannot read the events of job %" PRId64 " after seq %" PRId64 " from the database: %s",
             st->job, st->last, e.message[0] ? e.message : ddpd_err_text(rc));
        return;
    }
    if (f.bad) {
        fail(st, "the event after seq %" PRId64 " of job %" PRId64 " cannot be framed", st->last, st->job);
        return;
    }
    if (f.final) {
        st->ph = PH_DONE;
        return;
    }
    /* Caught up: the next row is the hub's, or the store has no more for now. A page
     * that stopped short of both caps is the store's end too; the store's byte cap stops
     * before a row of at most EVENT_LINE_MAX bytes, so a page within that of its byte
     * cap may have been cut there: read on. */
    st->caught_up = f.at_bound || f.rows == 0 ||
                    (f.rows < st->page_events && !f.full && f.bytes + EVENT_LINE_MAX <= st->page_bytes);
}

/* From now on the hub fills the caller's buffer: the page goes. */
static void go_live(struct stream *st)
{
    free(st->page);
    st->page = NULL;
    st->off = st->len = st->cap = 0;
    st->ph = PH_LIVE;
}

/* HISTORY has caught up with the store: join the hub at st->last. */
static void join_hub(struct stream *st)
{
    struct hub_sub_opts so = {.format = st->fmt, .on_ready = on_ready, .on_drop = on_drop, .ctx = st};
    int64_t from;
    if (hub_subscribe(st->hub, st->job, st->last, &so, &st->sub, &from) != DDPD_OK) {
        st->sub = NULL;
        fail(st, "cannot follow job %" PRId64 " live now: too many subscribers", st->job);
        return;
    }
    st->caught_up = false;
    if (from == st->last + 1) {
        go_live(st);
        return;
    }
    /* Every event below `from` was published before the subscription, so appended
     * before it: after the flush the store has them all (hub.h). */
    store_flush(st->store, NULL);
    st->ph = PH_GAP;
    st->from = from;
}

/* GAP has read everything below `from`: go live. */
static void gap_done(struct stream *st)
{
    if (st->from == HUB_SEQ_UNKNOWN) {
        /* The hub never saw the job, so it cannot tell its end. The supervisor stores a
         * job's final event before its final row: when the row is final, the event is in
         * the store. Read once more after the row said so (the event may have been
         * stored after this gap's read), then end: the client has had it. */
        struct store_job j;
        struct ddpd_error e = {0};
        memset(&j, 0, sizeof j);
        ddpd_err rc = store_job_get(st->store, st->job, &j, &e);
        bool final = rc == DDPD_OK && (JOB_STATE_BIT(j.state) & JOB_STATES_FINAL);
        store_job_clear(&j);
        if (rc == DDPD_ENOTFOUND) {
            fail(st, "job %" PRId64 " was deleted", st->job);
            return;
        }
        if (rc != DDPD_OK) {
            fail(st, "cannot read job %" PRId64 " from the database: %s", st->job,
                 e.message[0] ? e.message : ddpd_err_text(rc));
            return;
        }
        if (final && !st->row_checked) {
            st->row_checked = true;
            store_flush(st->store, NULL);
            st->caught_up = false;
            return;
        }
        if (final) {
            st->ph = PH_DONE;
            return;
        }
    }
    hub_sub_gap_filled(st->sub, st->last, false);
    go_live(st);
}

static stream_pull next(struct stream *st, char *buf, size_t cap, size_t *len)
{
    *len = 0;
    for (;;) {
        if (st->off < st->len) {
            size_t n = st->len - st->off < cap ? st->len - st->off : cap;
            memcpy(buf, st->page + st->off, n);
            st->off += n;
            *len = n;
            return STREAM_DATA;
        }
        st->off = st->len = 0;
        switch (st->ph) {
        case PH_DONE: return STREAM_END;
        case PH_CLOSED: return STREAM_CLOSED;
        case PH_HISTORY:
            if (st->caught_up)
                join_hub(st);
            else
                page_read(st, INT64_MAX);
            break;
        case PH_GAP:
            if (st->caught_up)
                gap_done(st);
            else
                page_read(st, st->from);
            break;
        case PH_LIVE:
            switch (hub_sub_next(st->sub, buf, cap, len)) {
            case HUB_DATA: return STREAM_DATA;
            case HUB_AGAIN: return STREAM_AGAIN;
            case HUB_END: st->ph = PH_DONE; return STREAM_END;
            case HUB_DROPPED:
                fail(st, "%s",
                     hub_sub_reason(st->sub)[0] ? hub_sub_reason(st->sub) : "dropped by the server");
                break;
            }
            break;
        }
    }
}

stream_pull stream_next(struct stream *st, char *buf, size_t cap, size_t *len)
{
    stream_pull r = next(st, buf, cap, len);
    if (r == STREAM_AGAIN && idle(st)) {
        /* Between frames (the hub and the page only say AGAIN there): a keep-alive. */
        size_t n;
        const char *hb = hub_heartbeat(st->fmt, &n);
        if (hb && n <= cap) {
            memcpy(buf, hb, n);
            *len = n;
            r = STREAM_DATA;
        }
    }
    if (r == STREAM_DATA)
        st->last_write_us = base_mono_us();
    return r;
}

const char *stream_why(const struct stream *st)
{
    return st->why;
}

void stream_free(struct stream *st)
{
    if (!st)
        return;
    struct streams *ss = st->owner;
    if (ss) {
        /* Out of the heartbeat thread's list: no wake from it after this. */
        pthread_mutex_lock(&ss->mu);
        if (st->prev)
            st->prev->next = st->next;
        else
            ss->head = st->next;
        if (st->next)
            st->next->prev = st->prev;
        pthread_mutex_unlock(&ss->mu);
    }
    hub_unsubscribe(st->sub);
    free(st->page);
    free(st);
}

/* ---- the streams of a server ---- */

/* The heartbeat thread: wakes each idle stream now and then so that its pull sends a
 * keep-alive (and finds clients that went away). */
static void *heartbeats(void *arg)
{
    struct streams *ss = arg;
    /* A third of the interval: a keep-alive goes out at most a third late. */
    double poll = ss->heartbeat_s / 3 < HEARTBEAT_POLL_MAX_S ? ss->heartbeat_s / 3 : HEARTBEAT_POLL_MAX_S;
    int64_t poll_ns = (int64_t)(poll * 1e9) > 1000000 ? (int64_t)(poll * 1e9) : 1000000;
    pthread_mutex_lock(&ss->mu);
    while (!ss->stop) {
        struct timespec t = base_timespec_after(CLOCK_REALTIME, (double)poll_ns * 1e-9);
        pthread_cond_timedwait(&ss->cv, &ss->mu, &t);
        if (ss->stop)
            break;
        for (struct stream *st = ss->head; st; st = st->next)
            if (st->wake && idle(st))
                st->wake(st->ctx);
    }
    pthread_mutex_unlock(&ss->mu);
    return NULL;
}

ddpd_err streams_new(struct hub *h, struct store *s, double heartbeat_s, struct streams **out,
                     struct ddpd_error *err)
{
    *out = NULL;
    struct streams *ss = calloc(1, sizeof *ss);
    if (!ss)
        return ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory for the event streams");
    ss->hub = h;
    ss->store = s;
    ss->heartbeat_s = heartbeat_s > 0 ? heartbeat_s : HEARTBEAT_S;
    pthread_mutex_init(&ss->mu, NULL);
    pthread_cond_init(&ss->cv, NULL);
    if (pthread_create(&ss->thread, NULL, heartbeats, ss) != 0) {
        pthread_cond_destroy(&ss->cv);
        pthread_mutex_destroy(&ss->mu);
        free(ss);
        return ddpd_error_set(err, DDPD_EINTERNAL, "", "cannot start the event streams' heartbeat thread");
    }
    *out = ss;
    return DDPD_OK;
}

ddpd_err streams_open(struct streams *ss, int64_t job, int64_t after, hub_format format,
                      void (*wake)(void *ctx), void *ctx, struct stream **out, struct ddpd_error *err)
{
    struct stream_opts o = {.format = format, .wake = wake, .ctx = ctx, .heartbeat_s = ss->heartbeat_s};
    ddpd_err rc = stream_open(ss->hub, ss->store, job, after, &o, out, err);
    if (rc)
        return rc;
    struct stream *st = *out;
    st->owner = ss;
    pthread_mutex_lock(&ss->mu);
    st->next = ss->head;
    if (ss->head)
        ss->head->prev = st;
    ss->head = st;
    pthread_mutex_unlock(&ss->mu);
    return DDPD_OK;
}

void streams_free(struct streams *ss)
{
    if (!ss)
        return;
    pthread_mutex_lock(&ss->mu);
    ss->stop = true;
    pthread_cond_signal(&ss->cv);
    pthread_mutex_unlock(&ss->mu);
    pthread_join(ss->thread, NULL);
    pthread_cond_destroy(&ss->cv);
    pthread_mutex_destroy(&ss->mu);
    free(ss);
}
