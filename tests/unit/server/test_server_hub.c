/* test_server_hub.c — the event hub (server/hub.h): history then live with no gap and no
 * duplicate, resuming from every after_seq (inside the tail, before it with the store's
 * gap served from a fake store, after the end, a job the hub never saw), the end after
 * the final state event, 500 subscribers fed by consumer threads while a publisher runs
 * (timed), slow subscribers dropped while others keep up, unsubscribing while publishing,
 * and the memory caps evicting finished jobs first. */
#include "check.h"

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "base/clock.h"
#include "server/hub.h"

#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define SANITIZED 1
#else
#define SANITIZED 0
#endif

/* ---- a job's events and a fake store ---- */

/* Event `seq` of a job of `total` events: 1 is `state: running`, `total` (when final) is
 * `state: succeeded`, the others are losses. */
static struct event job_event(int64_t job, int64_t seq, int64_t total, bool final)
{
    struct event e = {.rank = 0,
                      .ts = 1764680000.0 + (double)seq,
                      .has_server_fields = true,
                      .job = job,
                      .attempt = 1,
                      .seq = seq};
    if (seq == 1 || (final && seq == total)) {
        e.kind = EVENT_STATE;
        e.rank = -1;
        snprintf(e.state, sizeof e.state, "%s", seq == 1 ? "running" : "succeeded");
    } else {
        e.kind = EVENT_LOSS;
        e.step = seq;
        e.loss = 1.0 / (double)seq;
        e.samples_per_s = 1000.0;
    }
    return e;
}

static ddpd_err publish(struct hub *h, int64_t job, int64_t seq, int64_t total, bool final)
{
    struct event e = job_event(job, seq, total, final);
    return hub_publish(h, &e, NULL, 0);
}

/* ---- reading a stream back ---- */

/* Parses the bytes of one stream and checks that the seqs run after+1, after+2, ...
 * Every frame is checked in full (decoded; SSE id and event name against the body)
 * when `full`, else only its seq is read (fast, for the 500-subscriber run). */
struct parser {
    hub_format fmt;
    bool full;
    int64_t last; /* seq of the last frame */
    long frames;
    int errors;
    bool saw_final;
    size_t n;
    char buf[4 * HUB_FRAME_MAX];
};

static void parser_init(struct parser *p, hub_format fmt, int64_t after, bool full)
{
    p->fmt = fmt;
    p->full = full;
    p->last = after;
    p->frames = 0;
    p->errors = 0;
    p->saw_final = false;
    p->n = 0;
}

static void parser_error(struct parser *p, const char *what, const char *frame, size_t len)
{
    if (p->errors++ < 5)
        fprintf(stderr, "stream error after seq %lld: %s: %.*s\n", (long long)p->last, what,
                (int)(len > 200 ? 200 : len), frame);
}

static void parser_frame(struct parser *p, const char *fr, size_t len)
{
    const char *json = fr;
    size_t jlen = len;
    int64_t seq = -1;
    char kind[32] = "";
    if (p->fmt == HUB_FORMAT_SSE) {
        /* "id: N\nevent: K\ndata: J" (the blank line already cut) */
        char *end;
        if (len < 4 || memcmp(fr, "id: ", 4) != 0) {
            parser_error(p, "no id", fr, len);
            return;
        }
        seq = strtoll(fr + 4, &end, 10);
        if (strncmp(end, "\nevent: ", 8) != 0) {
            parser_error(p, "no event", fr, len);
            return;
        }
        const char *k = end + 8, *nl = memchr(k, '\n', len - (size_t)(k - fr));
        if (!nl || (size_t)(nl - k) >= sizeof kind || strncmp(nl, "\ndata: ", 7) != 0) {
            parser_error(p, "no data", fr, len);
            return;
        }
        memcpy(kind, k, (size_t)(nl - k));
        json = nl + 7;
        jlen = len - (size_t)(json - fr);
    } else {
        const char *s = memmem(fr, len, "\"seq\":", 6);
        if (!s) {
            parser_error(p, "no seq", fr, len);
            return;
        }
        seq = strtoll(s + 6, NULL, 10);
    }
    if (p->full) {
        struct event ev;
        struct ddpd_error e;
        if (event_decode(json, jlen, &ev, &e) != DDPD_OK) {
            parser_error(p, e.message, fr, len);
            return;
        }
        if (ev.seq != seq)
            parser_error(p, "id differs from seq", fr, len);
        if (p->fmt == HUB_FORMAT_SSE && strcmp(kind, event_kind_name(ev.kind)) != 0)
            parser_error(p, "event name differs from kind", fr, len);
        if (event_is_final(&ev))
            p->saw_final = true;
    }
    if (seq != p->last + 1)
        parser_error(p, "out of sequence (gap or duplicate)", fr, len);
    p->last = seq;
    p->frames++;
}

/* Takes len new bytes at p->buf + p->n. */
static void parser_took(struct parser *p, size_t len)
{
    p->n += len;
    const char *sep = p->fmt == HUB_FORMAT_SSE ? "\n\n" : "\n";
    size_t seplen = strlen(sep), start = 0;
    for (;;) {
        char *e = memmem(p->buf + start, p->n - start, sep, seplen);
        if (!e)
            break;
        parser_frame(p, p->buf + start, (size_t)(e - (p->buf + start)));
        start = (size_t)(e - p->buf) + seplen;
    }
    memmove(p->buf, p->buf + start, p->n - start);
    p->n -= start;
}

static void parser_feed(struct parser *p, const char *data, size_t len)
{
    if (p->n + len > sizeof p->buf) {
        parser_error(p, "frame too long", data, len);
        return;
    }
    memcpy(p->buf + p->n, data, len);
    parser_took(p, len);
}

/* Pulls until the stream has nothing now (or ends); `cap` bytes at a time. Counts
 * problems in p->errors, never with CHECK, so that threads may use it. */
static hub_pull drain_cap(struct hub_sub *s, struct parser *p, size_t cap)
{
    for (;;) {
        size_t len = 0, room = sizeof p->buf - p->n;
        hub_pull r = hub_sub_next(s, p->buf + p->n, cap < room ? cap : room, &len);
        if (r != HUB_DATA)
            return r;
        if (len == 0)
            parser_error(p, "HUB_DATA with no bytes", "", 0);
        parser_took(p, len);
    }
}

static hub_pull drain(struct hub_sub *s, struct parser *p)
{
    return drain_cap(s, p, 2 * HUB_FRAME_MAX);
}

/* The HTTP handler's part of hub.h's recipe, with a fake store holding seqs 1..stored of
 * a job of `total` events: sends the store's events in (after, from), then tells the
 * subscription. */
static void serve_gap(struct hub_sub *s, struct parser *p, int64_t job, int64_t after, int64_t from,
                      int64_t stored, int64_t total, bool final)
{
    if (from <= after + 1)
        return;
    int64_t last = after;
    bool saw_final = false;
    char line[EVENT_LINE_MAX], frame[HUB_FRAME_MAX];
    for (int64_t seq = after + 1; seq < from && seq <= stored; seq++) {
        struct event ev = job_event(job, seq, total, final);
        int n = event_encode(&ev, line, sizeof line);
        int m = n > 0 ? hub_format_event(p->fmt, seq, event_kind_name(ev.kind), line, (size_t)n, frame,
                                         sizeof frame)
                      : -1;
        if (m <= 0) {
            parser_error(p, "cannot format the store's event", "", 0);
            break;
        }
        parser_feed(p, frame, (size_t)m);
        last = seq;
        saw_final |= event_is_final(&ev);
    }
    hub_sub_gap_filled(s, last, saw_final);
}

/* ---- callbacks that count ---- */

struct counter {
    atomic_int ready, dropped;
    char reason[128];
};

static void count_ready(void *ctx)
{
    struct counter *c = ctx;
    atomic_fetch_add(&c->ready, 1);
}

static void count_drop(void *ctx, const char *reason)
{
    struct counter *c = ctx;
    snprintf(c->reason, sizeof c->reason, "%s", reason);
    atomic_fetch_add(&c->dropped, 1);
}

static struct hub_sub *sub_counted(struct hub *h, int64_t job, int64_t after, hub_format fmt,
                                   struct counter *c, int64_t *from)
{
    struct hub_sub_opts o = {.format = fmt, .on_ready = count_ready, .on_drop = count_drop, .ctx = c};
    struct hub_sub *s = NULL;
    CHECK_EQ_INT(hub_subscribe(h, job, after, &o, &s, from), DDPD_OK);
    return s;
}

/* ---- tests ---- */

static void test_formats(void)
{
    char buf[HUB_FRAME_MAX];
    const char *body = "{\"event\":\"loss\",\"job\":7,\"attempt\":1,\"seq\":42}";
    int n = hub_format_event(HUB_FORMAT_SSE, 42, "loss", body, strlen(body), buf, sizeof buf);
    CHECK(n > 0);
    buf[n > 0 ? n : 0] = 0;
    CHECK_EQ_STR(buf, "id: 42\nevent: loss\ndata: {\"event\":\"loss\",\"job\":7,\"attempt\":1,"
                      "\"seq\":42}\n\n");
    n = hub_format_event(HUB_FORMAT_NDJSON, 42, "loss", body, strlen(body), buf, sizeof buf);
    CHECK(n > 0);
    buf[n > 0 ? n : 0] = 0;
    CHECK_EQ_STR(buf, "{\"event\":\"loss\",\"job\":7,\"attempt\":1,\"seq\":42}\n");
    /* Too small a buffer, a too long kind name. */
    CHECK_EQ_INT(hub_format_event(HUB_FORMAT_SSE, 42, "loss", body, strlen(body), buf, 20), -1);
    CHECK_EQ_INT(hub_format_event(HUB_FORMAT_NDJSON, 1, "loss", body, strlen(body), buf, strlen(body)), -1);
    CHECK_EQ_INT(hub_format_event(HUB_FORMAT_SSE, 1, "a-kind-name-far-too-long", "{}", 2, buf, sizeof buf),
                 -1);
    /* The largest body with the largest seq fits HUB_FRAME_MAX. */
    static char big[EVENT_LINE_MAX];
    memset(big, 'x', sizeof big - 1);
    CHECK(hub_format_event(HUB_FORMAT_SSE, INT64_MAX, "checkpoint", big, sizeof big - 1, buf, sizeof buf) >
          0);

    size_t len;
    const char *ping = hub_heartbeat(HUB_FORMAT_SSE, &len);
    CHECK_EQ_STR(ping, ": ping\n\n");
    CHECK_EQ_INT(len, 8);
    CHECK(hub_heartbeat(HUB_FORMAT_NDJSON, &len) == NULL);
    CHECK_EQ_INT(len, 0);

    struct event e = job_event(1, 5, 5, true);
    CHECK(event_is_final(&e));
    snprintf(e.state, sizeof e.state, "failed");
    CHECK(event_is_final(&e));
    snprintf(e.state, sizeof e.state, "cancelled");
    CHECK(event_is_final(&e));
    snprintf(e.state, sizeof e.state, "starting");
    CHECK(!event_is_final(&e));
    e = job_event(1, 3, 5, true);
    CHECK(!event_is_final(&e));
}

static void test_publish_errors(void)
{
    struct hub *h = hub_new(NULL);
    struct event e = job_event(1, 1, 3, true);
    e.has_server_fields = false;
    CHECK_EQ_INT(hub_publish(h, &e, NULL, 0), DDPD_EINTERNAL);
    e.has_server_fields = true;
    CHECK_EQ_INT(hub_publish(h, &e, "{\"a\":\n1}", 8), DDPD_EINTERNAL);
    static char big[EVENT_LINE_MAX + 1];
    memset(big, ' ', sizeof big);
    CHECK_EQ_INT(hub_publish(h, &e, big, sizeof big), DDPD_ETOOBIG);
    CHECK_EQ_INT(hub_publish(h, &e, NULL, 0), DDPD_OK);
    CHECK_EQ_INT(hub_publish(h, &e, NULL, 0), DDPD_ECONFLICT); /* seq not increasing */
    CHECK_EQ_INT(publish(h, 1, 3, 3, true), DDPD_OK);          /* gaps in seq are allowed */
    CHECK_EQ_INT(publish(h, 1, 4, 5, false), DDPD_ECONFLICT);  /* after the final event */
    /* A body given by the caller is what is streamed. */
    struct event f = job_event(2, 1, 1, false);
    CHECK_EQ_INT(hub_publish(h, &f, "{\"event\":\"state\",\"job\":2,\"attempt\":1,\"seq\":1}", 45), DDPD_OK);
    int64_t from;
    struct counter c = {0};
    struct hub_sub *s = sub_counted(h, 2, 0, HUB_FORMAT_NDJSON, &c, &from);
    char buf[256];
    size_t len;
    CHECK_EQ_INT(hub_sub_next(s, buf, sizeof buf, &len), HUB_DATA);
    CHECK_EQ_INT(len, 46);
    CHECK(memcmp(buf, "{\"event\":\"state\",\"job\":2,\"attempt\":1,\"seq\":1}\n", 46) == 0);
    hub_unsubscribe(s);
    hub_unsubscribe(NULL);

    struct hub_stats st;
    hub_stats_get(h, &st);
    CHECK_EQ_INT(st.published, 3);
    CHECK_EQ_INT(st.jobs, 2);
    CHECK_EQ_INT(st.events, 3);
    CHECK_EQ_INT(st.subscribers, 0);
    hub_free(h);
    hub_free(NULL);
}

/* History, then live, then the end, in both formats; on_ready once per HUB_AGAIN. */
static void test_history_then_live(void)
{
    for (int fmt = 0; fmt < 2; fmt++) {
        struct hub *h = hub_new(NULL);
        const int64_t job = 42, total = 20;
        for (int64_t q = 1; q <= 5; q++)
            CHECK_EQ_INT(publish(h, job, q, total, true), DDPD_OK);
        struct counter c = {0};
        int64_t from;
        struct hub_sub *s = sub_counted(h, job, 0, (hub_format)fmt, &c, &from);
        CHECK_EQ_INT(from, 1);
        static struct parser p;
        parser_init(&p, (hub_format)fmt, 0, true);
        CHECK_EQ_INT(drain(s, &p), HUB_AGAIN);
        CHECK_EQ_INT(p.last, 5);
        CHECK_EQ_INT(atomic_load(&c.ready), 0);
        /* Two publishes while waiting: one wake-up. */
        CHECK_EQ_INT(publish(h, job, 6, total, true), DDPD_OK);
        CHECK_EQ_INT(publish(h, job, 7, total, true), DDPD_OK);
        CHECK_EQ_INT(atomic_load(&c.ready), 1);
        CHECK_EQ_INT(drain(s, &p), HUB_AGAIN);
        CHECK_EQ_INT(p.last, 7);
        for (int64_t q = 8; q <= total; q++) {
            CHECK_EQ_INT(publish(h, job, q, total, true), DDPD_OK);
            if (q % 3 == 0)
                CHECK(drain(s, &p) != HUB_DROPPED);
        }
        CHECK_EQ_INT(drain(s, &p), HUB_END);
        CHECK_EQ_INT(drain(s, &p), HUB_END); /* stays ended */
        CHECK_EQ_INT(p.last, total);
        CHECK_EQ_INT(p.frames, total);
        CHECK_EQ_INT(p.errors, 0);
        CHECK(p.saw_final);
        CHECK_EQ_INT(p.n, 0);
        CHECK_EQ_INT(atomic_load(&c.dropped), 0);
        CHECK_EQ_STR(hub_sub_reason(s), "");
        hub_unsubscribe(s);
        hub_free(h);
    }
}

/* A pull buffer smaller than a frame: frames are split across pulls, bytes intact. */
static void test_small_pulls(void)
{
    struct hub *h = hub_new(NULL);
    for (int64_t q = 1; q <= 30; q++)
        CHECK_EQ_INT(publish(h, 1, q, 30, true), DDPD_OK);
    for (size_t cap = 1; cap <= 61; cap += 6) {
        for (int fmt = 0; fmt < 2; fmt++) {
            int64_t from;
            struct counter c = {0};
            struct hub_sub *s = sub_counted(h, 1, 0, (hub_format)fmt, &c, &from);
            static struct parser p;
            parser_init(&p, (hub_format)fmt, 0, true);
            CHECK_EQ_INT(drain_cap(s, &p, cap), HUB_END);
            CHECK_EQ_INT(p.last, 30);
            CHECK_EQ_INT(p.errors, 0);
            CHECK_EQ_INT(p.n, 0);
            hub_unsubscribe(s);
        }
    }
    hub_free(h);
}

/* Resume from every after_seq, at every point of a job's life: the hub's tail holds the
 * last 40 events; what is older comes from the fake store. The subscriber must get
 * exactly after+1 .. total, then the end. */
static void test_resume_every_seq(void)
{
    const int64_t job = 9, total = 100;
    const int64_t points[] = {0, 1, 10, 39, 40, 41, 70, 99, 100};
    struct hub_limits lim = {.job_events = 40};
    long runs = 0;
    for (size_t k = 0; k < sizeof points / sizeof points[0]; k++) {
        int64_t published = points[k];
        for (int64_t after = 0; after <= total + 2; after++) {
            hub_format fmt = (hub_format)(after % 2);
            struct hub *h = hub_new(&lim);
            for (int64_t q = 1; q <= published; q++)
                CHECK_EQ_INT(publish(h, job, q, total, true), DDPD_OK);
            struct counter c = {0};
            int64_t from;
            struct hub_sub *s = sub_counted(h, job, after, fmt, &c, &from);
            /* What the hub answers. */
            int64_t oldest = published > 40 ? published - 39 : 1;
            if (published == 0)
                CHECK_EQ_INT(from, HUB_SEQ_UNKNOWN);
            else if (after >= oldest - 1 && (published == total || published - after <= 30))
                CHECK_EQ_INT(from, after + 1);
            else if (published == total)
                CHECK_EQ_INT(from, oldest); /* finished: the whole tail */
            else
                CHECK_EQ_INT(from, published - 30 + 1); /* running: room to spare */
            static struct parser p;
            parser_init(&p, fmt, after, true);
            serve_gap(s, &p, job, after, from, published, total, true);
            hub_pull r = drain(s, &p);
            for (int64_t q = published + 1; q <= total; q++) {
                CHECK_EQ_INT(publish(h, job, q, total, true), DDPD_OK);
                if (q % 7 == 0)
                    r = drain(s, &p);
            }
            r = drain(s, &p);
            CHECK_EQ_INT(r, HUB_END);
            CHECK_EQ_INT(p.last, after > total ? after : total);
            CHECK_EQ_INT(p.frames, after >= total ? 0 : total - after);
            CHECK_EQ_INT(p.errors, 0);
            CHECK_EQ_INT(atomic_load(&c.dropped), 0);
            if (p.errors || r != HUB_END)
                fprintf(stderr, "    published %lld, after %lld, from %lld\n", (long long)published,
                        (long long)after, (long long)from);
            hub_unsubscribe(s);
            hub_free(h);
            runs++;
        }
    }
    fprintf(stderr, "resume: %ld subscriptions checked\n", runs);
}

/* The hub never saw the job (it ran before a server restart, or its tail and record were
 * evicted): everything comes from the store; events the store already returned and the
 * supervisor publishes afterwards are not sent twice. */
static void test_resume_unknown_job(void)
{
    const int64_t job = 3, total = 50;
    /* Finished before the restart: the store has it all, the hub nothing. */
    for (int64_t after = 0; after <= total; after++) {
        struct hub *h = hub_new(NULL);
        struct counter c = {0};
        int64_t from;
        struct hub_sub *s = sub_counted(h, job, after, HUB_FORMAT_SSE, &c, &from);
        CHECK_EQ_INT(from, HUB_SEQ_UNKNOWN);
        static struct parser p;
        parser_init(&p, HUB_FORMAT_SSE, after, true);
        serve_gap(s, &p, job, after, from, total, total, true);
        /* after == total: the store returned nothing, so the handler must know from the
         * store's job row that the job is finished; the hub can't. */
        if (after < total)
            CHECK_EQ_INT(drain(s, &p), HUB_END);
        CHECK_EQ_INT(p.last, total);
        CHECK_EQ_INT(p.errors, 0);
        hub_unsubscribe(s);
        struct hub_stats st;
        hub_stats_get(h, &st);
        CHECK_EQ_INT(st.jobs, 0); /* the empty record went with its last subscriber */
        hub_free(h);
    }
    /* Running: the store has 1..20 committed, of which 19 and 20 the supervisor has
     * appended but not yet published. */
    for (int64_t after = 0; after <= 20; after++) {
        struct hub *h = hub_new(NULL);
        struct counter c = {0};
        int64_t from;
        struct hub_sub *s = sub_counted(h, job, after, HUB_FORMAT_NDJSON, &c, &from);
        CHECK_EQ_INT(from, HUB_SEQ_UNKNOWN);
        static struct parser p;
        parser_init(&p, HUB_FORMAT_NDJSON, after, true);
        serve_gap(s, &p, job, after, from, 20, total, true);
        CHECK_EQ_INT(publish(h, job, 19, total, true), DDPD_OK);
        CHECK_EQ_INT(publish(h, job, 20, total, true), DDPD_OK);
        CHECK_EQ_INT(drain(s, &p), HUB_AGAIN);
        CHECK_EQ_INT(p.last, 20);
        for (int64_t q = 21; q <= total; q++)
            CHECK_EQ_INT(publish(h, job, q, total, true), DDPD_OK);
        CHECK_EQ_INT(drain(s, &p), HUB_END);
        CHECK_EQ_INT(p.last, total);
        CHECK_EQ_INT(p.frames, total - after);
        CHECK_EQ_INT(p.errors, 0);
        hub_unsubscribe(s);
        hub_free(h);
    }
}

/* Subscribing at random points while a publisher runs, with a tail of 64 events: the
 * store is "appended before published" (stored_max moves first) and the handler flushes
 * (reads stored_max) before it reads the gap. Every stream must be exact. */
struct race {
    struct hub *h;
    int64_t job, total;
    atomic_llong stored, published;
    atomic_int stop;
    atomic_long streams, errors, drops, gaps, unknown;
};

static void *race_publisher(void *arg)
{
    struct race *r = arg;
    for (int64_t q = 1; q <= r->total; q++) {
        atomic_store(&r->stored, q); /* store_event_append, then ... */
        if (publish(r->h, r->job, q, r->total, true) != DDPD_OK)
            atomic_fetch_add(&r->errors, 1);
        atomic_store(&r->published, q);
        if (q % 16 == 0)
            sched_yield();
    }
    return NULL;
}

static void *race_subscriber(void *arg)
{
    struct race *r = arg;
    unsigned seed = (unsigned)(uintptr_t)&seed;
    static _Thread_local struct parser p;
    for (int i = 0; i < 400; i++) {
        /* Mostly a little behind the publisher: inside the tail, just before it (a
         * gap to fill from the store), or just after the newest event. */
        int64_t pub = atomic_load(&r->published);
        int64_t after = pub + 2 - (int64_t)(rand_r(&seed) % 1000);
        if (after < 0)
            after = 0;
        /* No CHECK on this thread: check.h's counters are not atomic. */
        struct counter c = {0};
        struct hub_sub_opts o = {
            .format = (hub_format)(i % 2), .on_ready = count_ready, .on_drop = count_drop, .ctx = &c};
        struct hub_sub *s;
        int64_t from;
        if (hub_subscribe(r->h, r->job, after, &o, &s, &from) != DDPD_OK) {
            atomic_fetch_add(&r->errors, 1);
            break;
        }
        if (from == HUB_SEQ_UNKNOWN)
            atomic_fetch_add(&r->unknown, 1);
        else if (from > after + 1)
            atomic_fetch_add(&r->gaps, 1);
        parser_init(&p, (hub_format)(i % 2), after, true);
        /* store_flush, then store_events_read(after, ...) stopping at from. */
        serve_gap(s, &p, r->job, after, from, atomic_load(&r->stored), r->total, true);
        hub_pull res;
        do {
            res = drain(s, &p);
            if (res == HUB_AGAIN)
                sched_yield();
        } while (res == HUB_AGAIN && p.last < after + 200);
        /* A stream that falls behind the tail is dropped (the client resumes); what it
         * got until then must still be exact. */
        if (res == HUB_DROPPED)
            atomic_fetch_add(&r->drops, 1);
        if (p.errors) {
            fprintf(stderr, "race: after %lld from %lld: %d errors\n", (long long)after, (long long)from,
                    p.errors);
            atomic_fetch_add(&r->errors, 1);
        }
        hub_unsubscribe(s);
        atomic_fetch_add(&r->streams, 1);
    }
    return NULL;
}

static void test_resume_race(void)
{
    struct hub_limits lim = {.job_events = 256};
    struct race r = {.job = 5, .total = SANITIZED ? 20000 : 100000};
    r.h = hub_new(&lim);
    pthread_t pub, subs[3];
    pthread_create(&pub, NULL, race_publisher, &r);
    for (int i = 0; i < 3; i++)
        pthread_create(&subs[i], NULL, race_subscriber, &r);
    pthread_join(pub, NULL);
    for (int i = 0; i < 3; i++)
        pthread_join(subs[i], NULL);
    CHECK_EQ_INT(atomic_load(&r.errors), 0);
    CHECK_EQ_INT(atomic_load(&r.streams), 1200);
    CHECK(atomic_load(&r.drops) < 600);
    CHECK(atomic_load(&r.gaps) > 0);
    fprintf(stderr,
            "resume race: 1200 streams at random points (%ld with a store gap, %ld before the "
            "first publish), %ld dropped as slow, none wrong\n",
            atomic_load(&r.gaps), atomic_load(&r.unknown), atomic_load(&r.drops));
    hub_free(r.h);
}

/* ---- 500 subscribers, consumer threads woken by on_ready ---- */

struct consumer;
struct csub {
    struct hub_sub *sub;
    struct consumer *owner;
    struct parser p;
    hub_pull result;
};

struct consumer {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct csub **ready;
    size_t nready, cap;
    int remaining;
    long pulls;
};

static void consumer_push(struct consumer *c, struct csub *cs)
{
    pthread_mutex_lock(&c->mu);
    if (c->nready == c->cap)
        abort(); /* each subscription is queued at most once */
    c->ready[c->nready++] = cs;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static void csub_ready(void *ctx)
{
    struct csub *cs = ctx;
    consumer_push(cs->owner, cs);
}

static void csub_drop(void *ctx, const char *reason)
{
    (void)reason;
    csub_ready(ctx);
}

static void *consumer_main(void *arg)
{
    struct consumer *c = arg;
    pthread_mutex_lock(&c->mu);
    while (c->remaining > 0) {
        if (c->nready == 0) {
            pthread_cond_wait(&c->cv, &c->mu);
            continue;
        }
        struct csub *cs = c->ready[--c->nready];
        pthread_mutex_unlock(&c->mu);
        hub_pull r;
        long pulls = 0;
        for (;;) {
            size_t len = 0;
            r = hub_sub_next(cs->sub, cs->p.buf + cs->p.n, sizeof cs->p.buf - cs->p.n, &len);
            pulls++;
            if (r != HUB_DATA)
                break;
            parser_took(&cs->p, len);
        }
        pthread_mutex_lock(&c->mu);
        c->pulls += pulls;
        if (r == HUB_END || r == HUB_DROPPED) {
            cs->result = r;
            c->remaining--;
        }
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

static void fanout_run(int nsubs, int nconsumers, int64_t events, bool paced)
{
    struct hub_limits lim = {
        .job_events = (size_t)events + 10, .job_bytes = 1u << 30, .total_bytes = 1u << 30};
    struct hub *h = hub_new(&lim);
    const int64_t job = 77;
    struct csub *cs = calloc((size_t)nsubs, sizeof *cs);
    struct consumer *cons = calloc((size_t)nconsumers, sizeof *cons);
    pthread_t *th = calloc((size_t)nconsumers, sizeof *th);
    for (int i = 0; i < nconsumers; i++) {
        pthread_mutex_init(&cons[i].mu, NULL);
        pthread_cond_init(&cons[i].cv, NULL);
        cons[i].cap = (size_t)nsubs;
        cons[i].ready = calloc(cons[i].cap, sizeof *cons[i].ready);
    }
    for (int i = 0; i < nsubs; i++) {
        struct consumer *c = &cons[i % nconsumers];
        cs[i].owner = c;
        parser_init(&cs[i].p, (hub_format)(i % 2), 0, false);
        struct hub_sub_opts o = {
            .format = (hub_format)(i % 2), .on_ready = csub_ready, .on_drop = csub_drop, .ctx = &cs[i]};
        int64_t from;
        CHECK_EQ_INT(hub_subscribe(h, job, 0, &o, &cs[i].sub, &from), DDPD_OK);
        CHECK_EQ_INT(from, HUB_SEQ_UNKNOWN);
        hub_sub_gap_filled(cs[i].sub, 0, false); /* the store had nothing */
        c->remaining++;
        consumer_push(c, &cs[i]);
    }
    for (int i = 0; i < nconsumers; i++)
        pthread_create(&th[i], NULL, consumer_main, &cons[i]);

    double t0 = base_mono_s(), tmax = 0;
    for (int64_t q = 1; q <= events; q++) {
        double a = base_mono_s();
        CHECK_EQ_INT(publish(h, job, q, events, true), DDPD_OK);
        double d = base_mono_s() - a;
        if (d > tmax)
            tmax = d;
        if (paced && q % 100 == 0) {
            struct timespec ts = {0, 1000000}; /* 1 ms per 100 events */
            nanosleep(&ts, NULL);
        }
    }
    double t1 = base_mono_s();
    for (int i = 0; i < nconsumers; i++)
        pthread_join(th[i], NULL);
    double t2 = base_mono_s();

    long ok = 0, pulls = 0;
    for (int i = 0; i < nsubs; i++) {
        ok += cs[i].result == HUB_END && cs[i].p.last == events && cs[i].p.errors == 0 &&
              cs[i].p.frames == events;
        if (cs[i].result != HUB_END && i < 3)
            fprintf(stderr, "sub %d: %s\n", i, hub_sub_reason(cs[i].sub));
    }
    for (int i = 0; i < nconsumers; i++)
        pulls += cons[i].pulls;
    CHECK_EQ_INT(ok, nsubs);
    struct hub_stats st;
    hub_stats_get(h, &st);
    CHECK_EQ_INT(st.subscribers, nsubs);
    CHECK_EQ_INT(st.dropped, 0);
    fprintf(stderr,
            "fan-out%s: %d subscribers, %d consumer threads, %lld events: publish %.0f events/s "
            "(slowest publish %.0f us), all delivered in %.3f s = %.2fM frames/s, %.1f pulls "
            "per subscriber per 100 events\n",
            paced ? " (paced)" : "", nsubs, nconsumers, (long long)events, (double)events / (t1 - t0),
            tmax * 1e6, t2 - t0, (double)events * nsubs / (t2 - t0) / 1e6,
            100.0 * (double)pulls / nsubs / (double)events);
    for (int i = 0; i < nsubs; i++)
        hub_unsubscribe(cs[i].sub);
    for (int i = 0; i < nconsumers; i++) {
        pthread_mutex_destroy(&cons[i].mu);
        pthread_cond_destroy(&cons[i].cv);
        free(cons[i].ready);
    }
    free(th);
    free(cons);
    free(cs);
    hub_free(h);
}

static void test_fanout_500(void)
{
    fanout_run(500, 4, SANITIZED ? 1000 : 20000, false);
    fanout_run(500, 4, SANITIZED ? 1000 : 5000, true);
}

/* Publishing with 500 subscribers that never pull (each waits once: 500 wake-ups for
 * the first event, then nothing per subscriber until they are dropped). */
static void test_publish_cost_idle_subs(void)
{
    struct hub *h = hub_new(NULL);
    enum { N = 500 };
    static struct counter c[N];
    static struct hub_sub *s[N];
    int64_t from;
    for (int i = 0; i < N; i++) {
        memset(&c[i], 0, sizeof c[i]);
        s[i] = sub_counted(h, 1, 0, HUB_FORMAT_SSE, &c[i], &from);
    }
    const int64_t events = SANITIZED ? 2000 : 9000; /* under sub_events: nobody dropped */
    double t0 = base_mono_s();
    for (int64_t q = 1; q <= events; q++)
        publish(h, 1, q, events + 1, false);
    double dt = base_mono_s() - t0;
    fprintf(stderr, "publish with %d subscribers that never pull: %.0f events/s\n", N, (double)events / dt);
    struct hub_stats st;
    hub_stats_get(h, &st);
    CHECK_EQ_INT(st.dropped, 0);
    for (int i = 0; i < N; i++)
        hub_unsubscribe(s[i]);
    hub_free(h);
}

/* A subscriber that never pulls is dropped when its queue overflows (events, then bytes),
 * with on_drop called once; the others get everything; memory stays within the job caps. */
static void test_slow_subscriber(void)
{
    for (int by_bytes = 0; by_bytes < 2; by_bytes++) {
        struct hub_limits lim = {.job_events = 500,
                                 .job_bytes = 256 << 10,
                                 .sub_events = by_bytes ? 100000 : 100,
                                 .sub_bytes = by_bytes ? 16 << 10 : 1 << 30};
        struct hub *h = hub_new(&lim);
        const int64_t job = 8, total = 5000;
        struct counter slow_c = {0}, fast_c[3] = {{0}};
        int64_t from;
        struct hub_sub *slow = sub_counted(h, job, 0, HUB_FORMAT_SSE, &slow_c, &from);
        struct hub_sub *fast[3];
        static struct parser fp[3];
        for (int i = 0; i < 3; i++) {
            fast[i] = sub_counted(h, job, 0, (hub_format)(i % 2), &fast_c[i], &from);
            parser_init(&fp[i], (hub_format)(i % 2), 0, true);
        }
        size_t max_bytes = 0, max_events = 0;
        for (int64_t q = 1; q <= total; q++) {
            CHECK_EQ_INT(publish(h, job, q, total, true), DDPD_OK);
            for (int i = 0; i < 3; i++)
                drain(fast[i], &fp[i]);
            struct hub_stats st;
            hub_stats_get(h, &st);
            if (st.bytes > max_bytes)
                max_bytes = st.bytes;
            if (st.events > max_events)
                max_events = st.events;
        }
        CHECK_EQ_INT(atomic_load(&slow_c.dropped), 1);
        CHECK_EQ_INT(atomic_load(&slow_c.ready), 0);
        CHECK(strstr(slow_c.reason, "slow subscriber") != NULL);
        CHECK(strstr(slow_c.reason, by_bytes ? "bytes behind" : "events behind") != NULL);
        CHECK_EQ_STR(hub_sub_reason(slow), slow_c.reason);
        char buf[64];
        size_t len;
        CHECK_EQ_INT(hub_sub_next(slow, buf, sizeof buf, &len), HUB_DROPPED);
        CHECK_EQ_INT(len, 0);
        for (int i = 0; i < 3; i++) {
            CHECK_EQ_INT(drain(fast[i], &fp[i]), HUB_END);
            CHECK_EQ_INT(fp[i].last, total);
            CHECK_EQ_INT(fp[i].errors, 0);
            CHECK_EQ_INT(atomic_load(&fast_c[i].dropped), 0);
        }
        CHECK(max_events <= lim.job_events);
        CHECK(max_bytes <= lim.job_bytes);
        struct hub_stats st;
        hub_stats_get(h, &st);
        CHECK_EQ_INT(st.dropped, 1);
        CHECK_EQ_INT(st.subscribers, 4);
        fprintf(stderr, "slow subscriber dropped (%s); peak %zu events, %zu bytes held\n", slow_c.reason,
                max_events, max_bytes);
        hub_unsubscribe(slow);
        for (int i = 0; i < 3; i++)
            hub_unsubscribe(fast[i]);
        hub_free(h);
    }
}

/* Subscriptions come and go while a publisher runs; each one's context is freed right
 * after hub_unsubscribe, so a callback after it would be a use after free (ASan) or a
 * race (TSan). */
struct churn {
    struct hub *h;
    atomic_int stop;
    atomic_long subs;
};

struct churn_ctx {
    long ready;
    struct hub_sub *sub;
    char buf[512];
};

static void churn_ready(void *ctx)
{
    struct churn_ctx *c = ctx;
    c->ready++; /* written by the callback only; read after hub_unsubscribe */
}

static void churn_drop(void *ctx, const char *reason)
{
    (void)reason;
    churn_ready(ctx);
}

static void *churn_main(void *arg)
{
    struct churn *ch = arg;
    unsigned seed = (unsigned)(uintptr_t)&seed;
    while (!atomic_load(&ch->stop)) {
        struct churn_ctx *c = calloc(1, sizeof *c);
        struct hub_sub_opts o = {
            .format = HUB_FORMAT_SSE, .on_ready = churn_ready, .on_drop = churn_drop, .ctx = c};
        int64_t from;
        if (hub_subscribe(ch->h, 1 + (int64_t)(rand_r(&seed) % 3), 0, &o, &c->sub, &from) == DDPD_OK) {
            int pulls = (int)(rand_r(&seed) % 4);
            for (int i = 0; i < pulls; i++) {
                size_t len;
                hub_sub_next(c->sub, c->buf, sizeof c->buf, &len);
            }
            hub_unsubscribe(c->sub);
            atomic_fetch_add(&ch->subs, 1);
            c->ready = -1; /* no callback may touch c from here on */
        }
        free(c);
    }
    return NULL;
}

static void test_unsubscribe_while_publishing(void)
{
    /* The total cap is below what the three tails want, so evictions run all along. */
    struct hub_limits lim = {.job_events = 200, .sub_events = 50, .total_bytes = 100000};
    struct churn ch = {.h = hub_new(&lim)};
    pthread_t th[3];
    for (int i = 0; i < 3; i++)
        pthread_create(&th[i], NULL, churn_main, &ch);
    const int64_t events = SANITIZED ? 5000 : 30000;
    for (int64_t q = 1; q <= events; q++)
        for (int64_t job = 1; job <= 3; job++)
            CHECK_EQ_INT(publish(ch.h, job, q, events, q == events), DDPD_OK);
    atomic_store(&ch.stop, 1);
    for (int i = 0; i < 3; i++)
        pthread_join(th[i], NULL);
    struct hub_stats st;
    hub_stats_get(ch.h, &st);
    CHECK_EQ_INT(st.subscribers, 0);
    CHECK(atomic_load(&ch.subs) > 0);
    CHECK(st.bytes <= lim.total_bytes);
    fprintf(stderr, "churn: %ld subscriptions came and went during %lld publishes (%llu dropped)\n",
            atomic_load(&ch.subs), (long long)(3 * events), (unsigned long long)st.dropped);
    hub_free(ch.h);
}

/* Per-job caps by count and bytes, and the total cap: finished jobs' tails go first
 * (oldest finished first), then running jobs are cut down. */
static void test_memory_caps(void)
{
    /* Per job, by count: the tail keeps the newest 100. */
    struct hub_limits lim = {.job_events = 100};
    struct hub *h = hub_new(&lim);
    for (int64_t q = 1; q <= 1000; q++)
        publish(h, 1, q, 1000, true);
    struct hub_stats st;
    hub_stats_get(h, &st);
    CHECK_EQ_INT(st.events, 100);
    CHECK_EQ_INT(st.evicted, 900);
    struct counter c = {0};
    int64_t from;
    struct hub_sub *s = sub_counted(h, 1, 0, HUB_FORMAT_SSE, &c, &from);
    CHECK_EQ_INT(from, 901);
    hub_unsubscribe(s);
    hub_free(h);

    /* Per job, by bytes. */
    lim = (struct hub_limits){.job_bytes = 20000};
    h = hub_new(&lim);
    for (int64_t q = 1; q <= 1000; q++)
        publish(h, 1, q, 1000, true);
    hub_stats_get(h, &st);
    CHECK(st.bytes <= 20000);
    CHECK(st.bytes > 15000);
    CHECK_EQ_INT(st.events + st.evicted, 1000);
    hub_free(h);

    /* Total: finished A, then finished B, then running C grows past the cap. */
    lim = (struct hub_limits){.total_bytes = 200000};
    h = hub_new(&lim);
    for (int64_t q = 1; q <= 150; q++)
        publish(h, 1, q, 150, true); /* A */
    for (int64_t q = 1; q <= 150; q++)
        publish(h, 2, q, 150, true); /* B */
    hub_stats_get(h, &st);
    size_t per_job = st.bytes / 2;
    CHECK(st.bytes < 200000);
    struct counter ca = {0};
    struct hub_sub *sa = sub_counted(h, 1, 0, HUB_FORMAT_SSE, &ca, &from); /* never pulls */
    CHECK_EQ_INT(from, 1);
    int64_t a_gone = 0, b_gone = 0, c_cut = 0;
    size_t max_bytes = 0;
    for (int64_t q = 1; q <= 3000; q++) {
        publish(h, 3, q, 3000, false); /* C: running */
        hub_stats_get(h, &st);
        if (st.bytes > max_bytes)
            max_bytes = st.bytes;
        struct counter cc = {0};
        int64_t fa, fb, fc;
        struct hub_sub *x = sub_counted(h, 1, 0, HUB_FORMAT_SSE, &cc, &fa);
        hub_unsubscribe(x);
        x = sub_counted(h, 2, 0, HUB_FORMAT_SSE, &cc, &fb);
        hub_unsubscribe(x);
        x = sub_counted(h, 3, 0, HUB_FORMAT_SSE, &cc, &fc);
        hub_unsubscribe(x);
        if (!a_gone && fa != 1)
            a_gone = q;
        if (!b_gone && fb != 1)
            b_gone = q;
        if (!c_cut && fc != 1)
            c_cut = q;
        if (!a_gone)
            CHECK(fb == 1 && fc == 1);
        else if (!b_gone)
            CHECK(fc == 1 || q == b_gone);
    }
    CHECK(a_gone > 0 && b_gone > a_gone && c_cut >= b_gone);
    CHECK(max_bytes <= lim.total_bytes + 2000); /* one frame over, then evicted at once */
    /* A's reader that never pulled was dropped when A's tail went. */
    CHECK_EQ_INT(atomic_load(&ca.dropped), 1);
    CHECK(strstr(ca.reason, "evicted") != NULL);
    hub_stats_get(h, &st);
    CHECK_EQ_INT(st.dropped, 1);
    CHECK_EQ_INT(st.jobs, 2); /* B's empty record went; A stays while sa is subscribed */
    hub_unsubscribe(sa);
    hub_stats_get(h, &st);
    CHECK_EQ_INT(st.jobs, 1);
    fprintf(stderr,
            "total cap 200000 B (finished jobs of %zu B each): A evicted at C's event %lld, B at "
            "%lld, C cut from %lld; peak %zu B\n",
            per_job, (long long)a_gone, (long long)b_gone, (long long)c_cut, max_bytes);
    hub_free(h);
}

static void test_forget_and_close(void)
{
    struct hub_limits lim = {.max_subs = 3};
    struct hub *h = hub_new(&lim);
    for (int64_t q = 1; q <= 10; q++)
        publish(h, 1, q, 10, true);
    struct counter c1 = {0}, c2 = {0}, c3 = {0};
    int64_t from;
    struct hub_sub *s1 = sub_counted(h, 1, 0, HUB_FORMAT_SSE, &c1, &from);
    struct hub_sub *s2 = sub_counted(h, 2, 0, HUB_FORMAT_SSE, &c2, &from);
    struct hub_sub *s3 = sub_counted(h, 2, 0, HUB_FORMAT_SSE, &c3, &from);
    struct hub_sub *s4 = NULL;
    struct hub_sub_opts o = {.format = HUB_FORMAT_SSE};
    CHECK_EQ_INT(hub_subscribe(h, 3, 0, &o, &s4, &from), DDPD_EBUSY);
    CHECK(s4 == NULL);

    hub_job_forget(h, 1);
    CHECK_EQ_INT(atomic_load(&c1.dropped), 1);
    CHECK_EQ_STR(c1.reason, "job deleted");
    char buf[64];
    size_t len;
    CHECK_EQ_INT(hub_sub_next(s1, buf, sizeof buf, &len), HUB_DROPPED);
    hub_job_forget(h, 1);  /* twice: nothing */
    hub_job_forget(h, 99); /* unknown: nothing */
    struct hub_stats st;
    hub_stats_get(h, &st);
    CHECK_EQ_INT(st.events, 0);
    CHECK_EQ_INT(st.bytes, 0);
    CHECK_EQ_INT(st.dropped, 0); /* deletion is not a drop */
    hub_unsubscribe(s1);
    /* The job starts afresh. */
    CHECK_EQ_INT(publish(h, 1, 1, 10, true), DDPD_OK);

    CHECK_EQ_INT(hub_sub_next(s2, buf, sizeof buf, &len), HUB_AGAIN);
    hub_close_all(h, "server shutting down");
    CHECK_EQ_INT(atomic_load(&c2.dropped), 1);
    CHECK_EQ_INT(atomic_load(&c2.ready), 0); /* on_drop, not on_ready */
    CHECK_EQ_INT(atomic_load(&c3.dropped), 1);
    CHECK_EQ_STR(hub_sub_reason(s3), "server shutting down");
    CHECK_EQ_INT(hub_sub_next(s2, buf, sizeof buf, &len), HUB_DROPPED);
    hub_unsubscribe(s2);
    hub_unsubscribe(s3);
    hub_stats_get(h, &st);
    CHECK_EQ_INT(st.subscribers, 0);
    CHECK_EQ_INT(st.jobs, 1);
    hub_free(h);
}

#define RUN(t)                                                                                               \
    do {                                                                                                     \
        double t0_ = base_mono_s();                                                                          \
        t();                                                                                                 \
        fprintf(stderr, "%-36s %6.2f s\n", #t, base_mono_s() - t0_);                                         \
    } while (0)

int main(void)
{
    RUN(test_formats);
    RUN(test_publish_errors);
    RUN(test_history_then_live);
    RUN(test_small_pulls);
    RUN(test_resume_every_seq);
    RUN(test_resume_unknown_job);
    RUN(test_resume_race);
    RUN(test_slow_subscriber);
    RUN(test_memory_caps);
    RUN(test_forget_and_close);
    RUN(test_unsubscribe_while_publishing);
    RUN(test_publish_cost_idle_subs);
    RUN(test_fanout_500);
    CHECK_DONE();
}
