/* hub.c — per-job event tails in memory and the subscribers that stream them (hub.h).
 * Each event is encoded once, into one allocation holding its SSE frame and its NDJSON
 * line; a subscriber is a cursor into its job's ring of those frames. Knows nothing of
 * HTTP, SQLite or processes, and never blocks the publisher on a subscriber.
 *
 * Locks: the registry mutex (job lookup), then a job's mutex; never two jobs' mutexes at
 * once. Callbacks run after every hub lock is released; a subscription counts the
 * callbacks in flight (cb_active) so that hub_unsubscribe can wait them out. */
#include "hub.h"

#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/alloc.h"
#include "../base/check.h"

#define KIND_MAX 16 /* longest kind name hub_format_event accepts */

/* One event in both formats. Immutable once in a ring; freed by whoever evicts it, under
 * the job's lock, so readers copy from it only under that lock. */
struct frame {
    int64_t seq;
    uint64_t cum;    /* the job's bytes published before this frame (for byte lag) */
    uint32_t size;   /* what it counts for in the byte limits */
    uint32_t len[2]; /* [HUB_FORMAT_SSE], [HUB_FORMAT_NDJSON] */
    bool final;
    char data[]; /* the SSE frame, then the NDJSON line */
};

struct job {
    int64_t id;
    struct job *hnext; /* registry chain, under the registry lock */
    atomic_int refs;   /* the registry's, each subscription's, each caller's in flight */
    pthread_mutex_t mu;
    /* Everything below is under mu. */
    bool dead; /* out of the registry (forgotten or empty); take it again */
    struct frame **ring;
    uint64_t ring_cap;   /* a power of two */
    uint64_t base, head; /* the tail is frames [base, head), absolute indices */
    size_t bytes;        /* of the frames in the tail */
    uint64_t cum;        /* bytes ever published to this job */
    int64_t last_seq;    /* 0 before the first */
    bool finished;
    uint64_t finish_order;
    struct hub_sub *subs; /* doubly linked */
    size_t nsubs;
    struct hub_sub **armed; /* waiting for on_ready */
    size_t narmed, armed_cap;
    uint64_t min_hint; /* <= every live subscription's cursor (cursors only advance) */
};

struct hub_sub {
    struct hub *hub;
    struct job *job; /* holds a reference */
    hub_format fmt;
    void (*on_ready)(void *ctx);
    void (*on_drop)(void *ctx, const char *reason);
    void *ctx;
    atomic_int cb_active;
    /* Everything below is under job->mu. */
    struct hub_sub *prev, *next;
    uint64_t cursor;      /* next frame to send */
    size_t off;           /* bytes of the frame at cursor already sent */
    int64_t skip_through; /* frames with seq <= this are not sent */
    bool ended, dropped, armed;
    size_t armed_idx;
    char reason[128]; /* written once, before `dropped` is set */
};

struct hub {
    struct hub_limits lim;
    pthread_mutex_t reg_mu;
    struct job **buckets; /* under reg_mu */
    size_t nbuckets, njobs;
    pthread_mutex_t evict_mu; /* one memory-cap eviction at a time */
    atomic_uint_fast64_t subs_now, published, dropped, events, bytes, evicted, finish_counter;
};

/* ---- callbacks, run after the locks are released ---- */

struct wake {
    struct hub_sub *s;
    bool drop;
};
struct wakes {
    struct wake *v;
    size_t n, cap;
    struct wake local[32];
};

static void wakes_init(struct wakes *w)
{
    w->v = w->local;
    w->n = 0;
    w->cap = sizeof w->local / sizeof w->local[0];
}

/* Under s's job lock: the callback will run, so hub_unsubscribe must wait for it. */
static void wakes_push(struct wakes *w, struct hub_sub *s, bool drop)
{
    if (w->n == w->cap) {
        size_t cap = w->cap * 2;
        if (w->v == w->local) {
            w->v = xmalloc(cap * sizeof *w->v);
            memcpy(w->v, w->local, w->n * sizeof *w->v);
        } else {
            w->v = xrealloc(w->v, cap * sizeof *w->v);
        }
        w->cap = cap;
    }
    atomic_fetch_add_explicit(&s->cb_active, 1, memory_order_relaxed);
    w->v[w->n++] = (struct wake){s, drop};
}

/* With no hub lock held. After the decrement the subscription may be freed at once. */
static void wakes_run(struct wakes *w)
{
    for (size_t i = 0; i < w->n; i++) {
        struct hub_sub *s = w->v[i].s;
        if (w->v[i].drop && s->on_drop)
            s->on_drop(s->ctx, s->reason);
        else if (s->on_ready)
            s->on_ready(s->ctx);
        atomic_fetch_sub_explicit(&s->cb_active, 1, memory_order_release);
    }
    if (w->v != w->local)
        free(w->v);
    wakes_init(w);
}

/* ---- frames ---- */

static int sse_header(char *buf, size_t cap, int64_t seq, const char *kind)
{
    return snprintf(buf, cap, "id: %lld\nevent: %s\ndata: ", (long long)seq, kind);
}

int hub_format_event(hub_format fmt, int64_t seq, const char *kind, const char *body, size_t len, char *buf,
                     size_t cap)
{
    size_t n;
    if (fmt == HUB_FORMAT_NDJSON) {
        n = len + 1;
        if (n > cap || n > (size_t)INT32_MAX)
            return -1;
        memcpy(buf, body, len);
        buf[len] = '\n';
        return (int)n;
    }
    char hdr[64];
    if (strnlen(kind, KIND_MAX + 1) > KIND_MAX)
        return -1;
    int h = sse_header(hdr, sizeof hdr, seq, kind);
    ASSERT(h > 0 && (size_t)h < sizeof hdr);
    n = (size_t)h + len + 2;
    if (n > cap || n > (size_t)INT32_MAX)
        return -1;
    memcpy(buf, hdr, (size_t)h);
    memcpy(buf + h, body, len);
    buf[h + len] = '\n';
    buf[h + len + 1] = '\n';
    return (int)n;
}

const char *hub_heartbeat(hub_format fmt, size_t *len)
{
    static const char ping[] = ": ping\n\n";
    if (fmt != HUB_FORMAT_SSE) {
        *len = 0;
        return NULL;
    }
    *len = sizeof ping - 1;
    return ping;
}

static struct frame *frame_new(int64_t seq, const char *kind, const char *body, size_t len, bool final)
{
    char hdr[64];
    int h = sse_header(hdr, sizeof hdr, seq, kind);
    ASSERT(h > 0 && (size_t)h < sizeof hdr);
    size_t sse = (size_t)h + len + 2, nd = len + 1;
    struct frame *f = xmalloc(sizeof *f + sse + nd);
    f->seq = seq;
    f->cum = 0;
    f->size = (uint32_t)(sizeof *f + sse + nd);
    f->len[HUB_FORMAT_SSE] = (uint32_t)sse;
    f->len[HUB_FORMAT_NDJSON] = (uint32_t)nd;
    f->final = final;
    int a = hub_format_event(HUB_FORMAT_SSE, seq, kind, body, len, f->data, sse);
    int b = hub_format_event(HUB_FORMAT_NDJSON, seq, kind, body, len, f->data + sse, nd);
    ASSERT(a == (int)sse && b == (int)nd);
    return f;
}

static const char *frame_bytes(const struct frame *f, hub_format fmt)
{
    return fmt == HUB_FORMAT_SSE ? f->data : f->data + f->len[HUB_FORMAT_SSE];
}

static struct frame *at(const struct job *j, uint64_t i)
{
    return j->ring[i & (j->ring_cap - 1)];
}

/* ---- jobs ---- */

static size_t bucket_of(const struct hub *h, int64_t id)
{
    return (size_t)(((uint64_t)id * 0x9E3779B97F4A7C15ull) >> 32) & (h->nbuckets - 1);
}

static void job_unref(struct job *j)
{
    if (atomic_fetch_sub_explicit(&j->refs, 1, memory_order_acq_rel) != 1)
        return;
    /* Nobody can reach it any more: out of the registry, no subscription, no caller. */
    ASSERT(j->dead && j->nsubs == 0);
    for (uint64_t i = j->base; i < j->head; i++)
        free(at(j, i));
    free(j->ring);
    free(j->armed);
    pthread_mutex_destroy(&j->mu);
    free(j);
}

/* Under reg_mu. */
static void registry_grow(struct hub *h)
{
    size_t n = h->nbuckets * 2;
    struct job **b = xcalloc(n, sizeof *b);
    struct job **old = h->buckets;
    size_t oldn = h->nbuckets;
    h->buckets = b;
    h->nbuckets = n;
    for (size_t i = 0; i < oldn; i++) {
        struct job *j = old[i], *next;
        for (; j; j = next) {
            next = j->hnext;
            size_t k = bucket_of(h, j->id);
            j->hnext = b[k];
            b[k] = j;
        }
    }
    free(old);
}

/* Under reg_mu. */
static void registry_unlink(struct hub *h, struct job *j)
{
    struct job **p = &h->buckets[bucket_of(h, j->id)];
    while (*p != j)
        p = &(*p)->hnext;
    *p = j->hnext;
    h->njobs--;
}

/* Job `id`, created when missing, locked and with a reference the caller drops with
 * job_unref after unlocking. */
static struct job *job_take(struct hub *h, int64_t id)
{
    for (;;) {
        pthread_mutex_lock(&h->reg_mu);
        struct job *j = h->buckets[bucket_of(h, id)];
        while (j && j->id != id)
            j = j->hnext;
        if (!j) {
            j = xcalloc(1, sizeof *j);
            j->id = id;
            atomic_init(&j->refs, 1); /* the registry's */
            pthread_mutex_init(&j->mu, NULL);
            j->ring_cap = 16;
            j->ring = xcalloc(j->ring_cap, sizeof *j->ring);
            if (h->njobs >= h->nbuckets)
                registry_grow(h);
            size_t k = bucket_of(h, id);
            j->hnext = h->buckets[k];
            h->buckets[k] = j;
            h->njobs++;
        }
        atomic_fetch_add_explicit(&j->refs, 1, memory_order_relaxed);
        pthread_mutex_unlock(&h->reg_mu);
        pthread_mutex_lock(&j->mu);
        if (!j->dead)
            return j;
        /* Removed between the lookup and the lock: its successor is in the registry. */
        pthread_mutex_unlock(&j->mu);
        job_unref(j);
    }
}

/* Takes an empty job (no subscription, no event) out of the registry: keeping it would
 * only cost memory, and a later subscribe or publish recreates it. */
static void job_maybe_remove(struct hub *h, struct job *j)
{
    bool removed = false;
    pthread_mutex_lock(&h->reg_mu);
    pthread_mutex_lock(&j->mu);
    if (!j->dead && j->nsubs == 0 && j->base == j->head) {
        j->dead = true;
        registry_unlink(h, j);
        removed = true;
    }
    pthread_mutex_unlock(&j->mu);
    pthread_mutex_unlock(&h->reg_mu);
    if (removed)
        job_unref(j);
}

/* Every job in the registry, each with a reference; the caller unrefs and frees. */
static struct job **jobs_snapshot(struct hub *h, size_t *n)
{
    pthread_mutex_lock(&h->reg_mu);
    struct job **v = xmalloc((h->njobs ? h->njobs : 1) * sizeof *v);
    size_t k = 0;
    for (size_t i = 0; i < h->nbuckets; i++)
        for (struct job *j = h->buckets[i]; j; j = j->hnext) {
            atomic_fetch_add_explicit(&j->refs, 1, memory_order_relaxed);
            v[k++] = j;
        }
    ASSERT(k == h->njobs);
    pthread_mutex_unlock(&h->reg_mu);
    *n = k;
    return v;
}

/* ---- under a job's lock ---- */

static void disarm(struct job *j, struct hub_sub *s)
{
    if (!s->armed)
        return;
    struct hub_sub *last = j->armed[--j->narmed];
    j->armed[s->armed_idx] = last;
    last->armed_idx = s->armed_idx;
    s->armed = false;
}

static void arm(struct job *j, struct hub_sub *s)
{
    if (s->armed)
        return;
    if (j->narmed == j->armed_cap) {
        j->armed_cap = j->armed_cap ? j->armed_cap * 2 : 16;
        j->armed = xrealloc(j->armed, j->armed_cap * sizeof *j->armed);
    }
    s->armed = true;
    s->armed_idx = j->narmed;
    j->armed[j->narmed++] = s;
}

static void drop(struct hub *h, struct job *j, struct hub_sub *s, bool count, struct wakes *w,
                 const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static void drop(struct hub *h, struct job *j, struct hub_sub *s, bool count, struct wakes *w,
                 const char *fmt, ...)
{
    if (s->dropped)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->reason, sizeof s->reason, fmt, ap);
    va_end(ap);
    s->dropped = true;
    disarm(j, s);
    if (count)
        atomic_fetch_add_explicit(&h->dropped, 1, memory_order_relaxed);
    wakes_push(w, s, true);
}

/* Drops the subscriptions that fell behind: their next frame was evicted, or their queue
 * (the frames from their cursor to the head) is over the subscriber limits. Walks the
 * subscriptions only when the oldest cursor could be one of those, so a publish to a job
 * whose subscribers keep up costs O(1) here. */
static void check_subs(struct hub *h, struct job *j, struct wakes *w)
{
    uint64_t lim_e = h->lim.sub_events, lim_b = h->lim.sub_bytes, m = j->min_hint;
    if (j->nsubs == 0)
        return;
    if (!(m < j->base || j->head - m > lim_e || (m < j->head && j->cum - at(j, m)->cum > lim_b)))
        return;
    uint64_t newmin = j->head;
    for (struct hub_sub *s = j->subs; s; s = s->next) {
        if (s->dropped || s->ended)
            continue;
        uint64_t c = s->cursor;
        if (c < j->base)
            drop(h, j, s, true, w, "evicted: the events it had not taken were evicted (memory cap)");
        else if (j->head - c > lim_e)
            drop(h, j, s, true, w, "slow subscriber: %llu events behind", (unsigned long long)(j->head - c));
        else if (c < j->head && j->cum - at(j, c)->cum > lim_b)
            drop(h, j, s, true, w, "slow subscriber: %llu bytes behind",
                 (unsigned long long)(j->cum - at(j, c)->cum));
        else if (c < newmin)
            newmin = c;
    }
    j->min_hint = newmin;
}

/* Evicts the oldest frames until the tail is within `events` and `bytes`. */
static void trim(struct hub *h, struct job *j, uint64_t events, size_t bytes, struct wakes *w)
{
    uint64_t n = 0;
    size_t freed = 0;
    while (j->base < j->head && (j->head - j->base > events || j->bytes > bytes)) {
        struct frame *f = at(j, j->base);
        j->ring[j->base & (j->ring_cap - 1)] = NULL;
        j->bytes -= f->size;
        freed += f->size;
        free(f);
        j->base++;
        n++;
    }
    if (!n)
        return;
    atomic_fetch_sub_explicit(&h->bytes, freed, memory_order_relaxed);
    atomic_fetch_sub_explicit(&h->events, n, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->evicted, n, memory_order_relaxed);
    check_subs(h, j, w);
}

static void ring_push(struct job *j, struct frame *f)
{
    if (j->head - j->base == j->ring_cap) {
        uint64_t cap = j->ring_cap * 2;
        struct frame **r = xcalloc(cap, sizeof *r);
        for (uint64_t i = j->base; i < j->head; i++)
            r[i & (cap - 1)] = at(j, i);
        free(j->ring);
        j->ring = r;
        j->ring_cap = cap;
    }
    j->ring[j->head & (j->ring_cap - 1)] = f;
    j->head++;
}

/* ---- the hub ---- */

struct hub *hub_new(const struct hub_limits *lim)
{
    struct hub *h = xcalloc(1, sizeof *h);
    if (lim)
        h->lim = *lim;
    if (!h->lim.job_events)
        h->lim.job_events = 10000;
    if (!h->lim.job_bytes)
        h->lim.job_bytes = 8u << 20;
    if (!h->lim.total_bytes)
        h->lim.total_bytes = 256u << 20;
    if (!h->lim.sub_events)
        h->lim.sub_events = h->lim.job_events;
    if (!h->lim.sub_bytes)
        h->lim.sub_bytes = h->lim.job_bytes;
    if (!h->lim.max_subs)
        h->lim.max_subs = 10000;
    pthread_mutex_init(&h->reg_mu, NULL);
    pthread_mutex_init(&h->evict_mu, NULL);
    h->nbuckets = 64;
    h->buckets = xcalloc(h->nbuckets, sizeof *h->buckets);
    atomic_init(&h->subs_now, 0);
    atomic_init(&h->published, 0);
    atomic_init(&h->dropped, 0);
    atomic_init(&h->events, 0);
    atomic_init(&h->bytes, 0);
    atomic_init(&h->evicted, 0);
    atomic_init(&h->finish_counter, 0);
    return h;
}

void hub_free(struct hub *h)
{
    if (!h)
        return;
    ASSERT(atomic_load(&h->subs_now) == 0);
    for (size_t i = 0; i < h->nbuckets; i++) {
        struct job *j = h->buckets[i], *next;
        for (; j; j = next) {
            next = j->hnext;
            j->dead = true;
            job_unref(j);
        }
    }
    free(h->buckets);
    pthread_mutex_destroy(&h->reg_mu);
    pthread_mutex_destroy(&h->evict_mu);
    free(h);
}

struct evict_item {
    struct job *j;
    bool finished;
    uint64_t order;
    size_t bytes;
};

static int evict_cmp(const void *a, const void *b)
{
    const struct evict_item *x = a, *y = b;
    if (x->finished != y->finished)
        return x->finished ? -1 : 1; /* finished jobs first */
    return x->order < y->order ? -1 : x->order > y->order;
}

/* Brings the hub under 7/8 of total_bytes (hysteresis, so that a full hub does not evict
 * on every publish): whole tails of finished jobs, oldest finished first; then running
 * jobs' oldest frames down to an equal share each. */
static void evict_total(struct hub *h)
{
    if (pthread_mutex_trylock(&h->evict_mu) != 0)
        return; /* another thread is at it */
    size_t target = h->lim.total_bytes - h->lim.total_bytes / 8, n;
    struct job **jobs = jobs_snapshot(h, &n);
    struct evict_item *it = xcalloc(n, sizeof *it);
    size_t running = 0;
    for (size_t i = 0; i < n; i++) {
        struct job *j = jobs[i];
        pthread_mutex_lock(&j->mu);
        it[i] = (struct evict_item){j, j->finished, j->finish_order, j->bytes};
        pthread_mutex_unlock(&j->mu);
        running += !it[i].finished && it[i].bytes;
    }
    qsort(it, n, sizeof *it, evict_cmp);
    struct wakes w;
    wakes_init(&w);
    for (size_t i = 0; i < n && it[i].finished; i++) {
        if (atomic_load_explicit(&h->bytes, memory_order_relaxed) <= target)
            break;
        pthread_mutex_lock(&it[i].j->mu);
        trim(h, it[i].j, 0, 0, &w);
        pthread_mutex_unlock(&it[i].j->mu);
        wakes_run(&w);
    }
    if (running && atomic_load_explicit(&h->bytes, memory_order_relaxed) > target) {
        size_t share = target / running;
        for (size_t i = 0; i < n; i++) {
            if (it[i].finished)
                continue;
            pthread_mutex_lock(&it[i].j->mu);
            trim(h, it[i].j, UINT64_MAX, share, &w);
            pthread_mutex_unlock(&it[i].j->mu);
            wakes_run(&w);
        }
    }
    for (size_t i = 0; i < n; i++) {
        job_maybe_remove(h, jobs[i]);
        job_unref(jobs[i]);
    }
    free(it);
    free(jobs);
    pthread_mutex_unlock(&h->evict_mu);
}

ddpd_err hub_publish(struct hub *h, const struct event *ev, const char *body, size_t len)
{
    char tmp[EVENT_LINE_MAX];
    if (!ev->has_server_fields)
        return DDPD_EINTERNAL;
    if (!body) {
        int n = event_encode(ev, tmp, sizeof tmp);
        if (n < 0)
            return DDPD_ETOOBIG;
        body = tmp;
        len = (size_t)n;
    }
    if (len >= EVENT_LINE_MAX)
        return DDPD_ETOOBIG;
    /* A raw newline would end an SSE field or an NDJSON line early. */
    if (memchr(body, '\n', len) || memchr(body, '\r', len))
        return DDPD_EINTERNAL;
    bool final = event_is_final(ev);
    /* Encoding and allocating happen before the lock: the lock covers pointer work. */
    struct frame *f = frame_new(ev->seq, event_kind_name(ev->kind), body, len, final);

    struct job *j = job_take(h, ev->job);
    if (ev->seq <= j->last_seq || j->finished) {
        pthread_mutex_unlock(&j->mu);
        job_unref(j);
        free(f);
        return DDPD_ECONFLICT;
    }
    f->cum = j->cum;
    j->cum += f->size;
    ring_push(j, f);
    j->bytes += f->size;
    j->last_seq = ev->seq;
    if (final) {
        j->finished = true;
        j->finish_order = atomic_fetch_add_explicit(&h->finish_counter, 1, memory_order_relaxed);
    }
    atomic_fetch_add_explicit(&h->bytes, f->size, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->events, 1, memory_order_relaxed);

    struct wakes w;
    wakes_init(&w);
    trim(h, j, h->lim.job_events, h->lim.job_bytes, &w);
    check_subs(h, j, &w);
    for (size_t i = 0; i < j->narmed; i++) {
        j->armed[i]->armed = false;
        wakes_push(&w, j->armed[i], false);
    }
    j->narmed = 0;
    pthread_mutex_unlock(&j->mu);
    wakes_run(&w);
    job_unref(j);

    atomic_fetch_add_explicit(&h->published, 1, memory_order_relaxed);
    if (atomic_load_explicit(&h->bytes, memory_order_relaxed) > h->lim.total_bytes)
        evict_total(h);
    return DDPD_OK;
}

/* Drops every subscription of `j` (under its lock). */
static void drop_all(struct hub *h, struct job *j, const char *reason, struct wakes *w)
{
    for (struct hub_sub *s = j->subs; s; s = s->next)
        drop(h, j, s, false, w, "%s", reason);
}

void hub_job_forget(struct hub *h, int64_t id)
{
    pthread_mutex_lock(&h->reg_mu);
    struct job *j = h->buckets[bucket_of(h, id)];
    while (j && j->id != id)
        j = j->hnext;
    if (!j) {
        pthread_mutex_unlock(&h->reg_mu);
        return;
    }
    registry_unlink(h, j);
    struct wakes w;
    wakes_init(&w);
    pthread_mutex_lock(&j->mu);
    j->dead = true;
    drop_all(h, j, "job deleted", &w);
    trim(h, j, 0, 0, &w);
    pthread_mutex_unlock(&j->mu);
    pthread_mutex_unlock(&h->reg_mu);
    wakes_run(&w);
    job_unref(j); /* the registry's */
}

void hub_close_all(struct hub *h, const char *reason)
{
    size_t n;
    struct job **jobs = jobs_snapshot(h, &n);
    struct wakes w;
    wakes_init(&w);
    for (size_t i = 0; i < n; i++) {
        pthread_mutex_lock(&jobs[i]->mu);
        drop_all(h, jobs[i], reason, &w);
        pthread_mutex_unlock(&jobs[i]->mu);
        wakes_run(&w);
        job_unref(jobs[i]);
    }
    free(jobs);
}

/* ---- subscribers ---- */

/* The first index in [lo, hi) whose frame has seq > after (hi when none). */
static uint64_t seek_seq(const struct job *j, uint64_t lo, uint64_t hi, int64_t after)
{
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (at(j, mid)->seq <= after)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The first index in [lo, head] from which the queue is within `bytes`. */
static uint64_t seek_bytes(const struct job *j, uint64_t lo, uint64_t bytes)
{
    uint64_t hi = j->head;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (j->cum - at(j, mid)->cum > bytes)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

ddpd_err hub_subscribe(struct hub *h, int64_t id, int64_t after_seq, const struct hub_sub_opts *opts,
                       struct hub_sub **out, int64_t *from)
{
    *out = NULL;
    if (atomic_fetch_add_explicit(&h->subs_now, 1, memory_order_relaxed) >= h->lim.max_subs) {
        atomic_fetch_sub_explicit(&h->subs_now, 1, memory_order_relaxed);
        return DDPD_EBUSY;
    }
    if (after_seq < 0)
        after_seq = 0;
    struct hub_sub *s = xcalloc(1, sizeof *s);
    s->hub = h;
    s->fmt = opts->format == HUB_FORMAT_NDJSON ? HUB_FORMAT_NDJSON : HUB_FORMAT_SSE;
    s->on_ready = opts->on_ready;
    s->on_drop = opts->on_drop;
    s->ctx = opts->ctx;
    atomic_init(&s->cb_active, 0);
    s->skip_through = after_seq;

    struct job *j = job_take(h, id); /* its reference becomes the subscription's */
    s->job = j;
    uint64_t c = j->head;
    int64_t f;
    if (j->base < j->head) {
        int64_t oldest = at(j, j->base)->seq;
        if (after_seq >= oldest - 1) {
            c = seek_seq(j, j->base, j->head, after_seq);
            f = after_seq + 1;
        } else {
            c = j->base;
            f = oldest;
        }
        /* A running job's subscriber starts with room to spare in its queue (a quarter
         * of its limits), or the next publish would drop it at once; the store serves
         * what it skips. A finished job publishes nothing more, so it gets all. */
        if (!j->finished) {
            uint64_t room_e = h->lim.sub_events - h->lim.sub_events / 4;
            uint64_t room_b = h->lim.sub_bytes - h->lim.sub_bytes / 4;
            uint64_t min = j->head > room_e ? j->head - room_e : 0;
            if (min < c)
                min = c;
            min = seek_bytes(j, min, room_b);
            if (min > c) {
                c = min;
                f = c < j->head ? at(j, c)->seq : j->last_seq + 1;
            }
        }
    } else if (j->last_seq > 0) {
        f = (after_seq > j->last_seq ? after_seq : j->last_seq) + 1;
    } else {
        f = HUB_SEQ_UNKNOWN;
    }
    s->cursor = c;
    s->next = j->subs;
    if (j->subs)
        j->subs->prev = s;
    j->subs = s;
    if (j->nsubs++ == 0 || c < j->min_hint)
        j->min_hint = c;
    pthread_mutex_unlock(&j->mu);
    *out = s;
    *from = f;
    return DDPD_OK;
}

void hub_sub_gap_filled(struct hub_sub *s, int64_t last_seq, bool saw_final)
{
    pthread_mutex_lock(&s->job->mu);
    if (last_seq > s->skip_through)
        s->skip_through = last_seq;
    if (saw_final)
        s->ended = true;
    pthread_mutex_unlock(&s->job->mu);
}

hub_pull hub_sub_next(struct hub_sub *s, char *buf, size_t cap, size_t *len)
{
    struct job *j = s->job;
    size_t n = 0;
    hub_pull r;
    ASSERT(cap > 0);
    pthread_mutex_lock(&j->mu);
    if (s->dropped) {
        r = HUB_DROPPED;
        goto out;
    }
    if (s->ended) {
        r = HUB_END;
        goto out;
    }
    while (s->cursor < j->head) {
        const struct frame *f = at(j, s->cursor);
        if (f->seq <= s->skip_through && s->off == 0) {
            s->cursor++;
            s->off = 0;
            continue;
        }
        if (n == cap)
            break;
        size_t flen = f->len[s->fmt], c = flen - s->off;
        if (c > cap - n)
            c = cap - n;
        memcpy(buf + n, frame_bytes(f, s->fmt) + s->off, c);
        n += c;
        s->off += c;
        if (s->off < flen)
            break;
        s->cursor++;
        s->off = 0;
    }
    if (n > 0)
        r = HUB_DATA;
    else if (j->finished && s->cursor == j->head) {
        s->ended = true;
        r = HUB_END;
    } else {
        arm(j, s);
        r = HUB_AGAIN;
    }
out:
    pthread_mutex_unlock(&j->mu);
    *len = n;
    return r;
}

const char *hub_sub_reason(const struct hub_sub *s)
{
    pthread_mutex_lock(&s->job->mu);
    bool dropped = s->dropped;
    pthread_mutex_unlock(&s->job->mu);
    /* The reason is written once, before `dropped`, and never again. */
    return dropped ? s->reason : "";
}

void hub_unsubscribe(struct hub_sub *s)
{
    if (!s)
        return;
    struct hub *h = s->hub;
    struct job *j = s->job;
    pthread_mutex_lock(&j->mu);
    if (s->prev)
        s->prev->next = s->next;
    else
        j->subs = s->next;
    if (s->next)
        s->next->prev = s->prev;
    j->nsubs--;
    disarm(j, s);
    pthread_mutex_unlock(&j->mu);
    /* Out of the lists, nobody starts a callback of s any more; wait for those running
     * (they are short: a resume of a suspended connection). */
    while (atomic_load_explicit(&s->cb_active, memory_order_acquire) > 0)
        sched_yield();
    atomic_fetch_sub_explicit(&h->subs_now, 1, memory_order_relaxed);
    job_maybe_remove(h, j);
    job_unref(j);
    free(s);
}

void hub_stats_get(struct hub *h, struct hub_stats *out)
{
    out->subscribers = atomic_load_explicit(&h->subs_now, memory_order_relaxed);
    out->published = atomic_load_explicit(&h->published, memory_order_relaxed);
    out->dropped = atomic_load_explicit(&h->dropped, memory_order_relaxed);
    out->events = atomic_load_explicit(&h->events, memory_order_relaxed);
    out->bytes = atomic_load_explicit(&h->bytes, memory_order_relaxed);
    out->evicted = atomic_load_explicit(&h->evicted, memory_order_relaxed);
    pthread_mutex_lock(&h->reg_mu);
    out->jobs = h->njobs;
    pthread_mutex_unlock(&h->reg_mu);
}
