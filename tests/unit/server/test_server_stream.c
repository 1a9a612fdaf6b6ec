/* test_server_stream.c — server/stream.c: a job's history paged from a real store, then the
 * hub's live events, with no event lost or repeated at the seam; resume exact; the end
 * only after the final event; a read error, a deleted job or a drop end with a
 * stream_error frame, never as the job's end; the streams handle's keep-alives. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "base/file.h"
#include "base/clock.h"
#include "server/hub.h"
#include "server/store.h"
#include "server/stream.h"

static char tmpdir[512];

static void sleep_us(long us)
{
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000L};
    nanosleep(&ts, NULL);
}

static struct store *open_store(const char *name)
{
    char path[600];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    struct ddpd_error e;
    struct store *s = store_open(path, &e);
    if (!s)
        fprintf(stderr, "    store_open: %s\n", e.message);
    CHECK(s != NULL);
    return s;
}

static int64_t new_job(struct store *s)
{
    struct ddpd_error e;
    struct store_job_new jn = {.name = "t", .spec = "{}", .world_size = 1, .device = DEVICE_CPU};
    int64_t id = 0;
    CHECK_EQ_INT(store_job_insert(s, &jn, &id, NULL, &e), DDPD_OK);
    return id;
}

/* Event `seq` of `job`: a loss event, or the final `succeeded` state event. */
static int make(struct event *ev, char *body, int64_t job, int64_t seq, bool final)
{
    memset(ev, 0, sizeof *ev);
    ev->kind = final ? EVENT_STATE : EVENT_LOSS;
    ev->rank = final ? -1 : 0;
    ev->step = seq;
    ev->loss = 1.0 / (double)seq;
    ev->ts = 1764680000.0 + (double)seq;
    if (final)
        snprintf(ev->state, sizeof ev->state, "succeeded");
    ev->has_server_fields = true;
    ev->job = job;
    ev->attempt = 1;
    ev->seq = seq;
    return event_encode(ev, body, EVENT_LINE_MAX);
}

/* As the supervisor: store first, then publish (hub.h's order). */
static void emit(struct store *s, struct hub *h, int64_t job, int64_t seq, bool final)
{
    struct event ev;
    char body[EVENT_LINE_MAX];
    int n = make(&ev, body, job, seq, final);
    struct ddpd_error e;
    ddpd_err rc;
    int tries = 0;
    while ((rc = store_event_append(s, &ev, body, (size_t)n, &e)) == DDPD_EBUSY && ++tries < 100)
        ;
    CHECK_EQ_INT(rc, DDPD_OK);
    if (h)
        CHECK_EQ_INT(hub_publish(h, &ev, body, (size_t)n), DDPD_OK);
}

static void finish_row(struct store *s, int64_t job)
{
    struct ddpd_error e;
    CHECK_EQ_INT(store_flush(s, &e), DDPD_OK);
    struct store_job_update u = {.fields = STORE_SET_STATE, .state = JOB_STATE_SUCCEEDED};
    CHECK_EQ_INT(store_job_update(s, job, &u, NULL, &e), DDPD_OK);
}

/* A client: pulls a stream to its end, checking every frame. */
struct client {
    struct hub *h;
    struct store *s;
    int64_t job, after, total; /* expects after+1 .. total */
    hub_format fmt;
    size_t page_events, page_bytes, cap;
    int stall_every; /* sleep 2 ms every this many pulls; 0 = never */
    bool resume;     /* reopen after a CLOSED at the last seq seen */
    /* results */
    int64_t last;
    long frames, errors, reopens, bad;
    bool ended;  /* STREAM_END */
    bool closed; /* STREAM_CLOSED without resume */
    char why[512];
    char last_error[1024];
    /* wake */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool woken;
};

static void wake(void *ctx)
{
    struct client *c = ctx;
    pthread_mutex_lock(&c->mu);
    c->woken = true;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

/* One whole frame (without its trailing newlines). */
static void frame(struct client *c, const char *f, size_t n)
{
    char line[EVENT_LINE_MAX + 128];
    if (n >= sizeof line) {
        c->bad++;
        return;
    }
    memcpy(line, f, n);
    line[n] = '\0';
    const char *data = line;
    if (c->fmt == HUB_FORMAT_SSE) {
        /* "id: N\nevent: K\ndata: J" or, for stream_error, "event: K\ndata: J" */
        const char *d = strstr(line, "data: ");
        if (!d) {
            c->bad++;
            return;
        }
        if (!strncmp(line, "event: stream_error\n", 20)) {
            snprintf(c->last_error, sizeof c->last_error, "%.1000s", d + 6);
            c->errors++;
            return;
        }
        long long id;
        if (sscanf(line, "id: %lld\n", &id) != 1 || id != c->last + 1) {
            if (c->bad++ < 3)
                fprintf(stderr, "    frame after %" PRId64 ": %.80s\n", c->last, line);
            return;
        }
        data = d + 6;
    }
    if (strstr(data, "\"event\":\"stream_error\"")) {
        snprintf(c->last_error, sizeof c->last_error, "%.1000s", data);
        c->errors++;
        return;
    }
    const char *p = strstr(data, "\"seq\":");
    long long seq = p ? strtoll(p + 6, NULL, 10) : -1;
    if (seq != c->last + 1) {
        if (c->bad++ < 3)
            fprintf(stderr, "    after %" PRId64 " came seq %lld: %.80s\n", c->last, seq, data);
    }
    if (seq > c->last)
        c->last = seq;
    c->frames++;
}

static void *run_client(void *arg)
{
    struct client *c = arg;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    c->last = c->after;
    char *acc = malloc(1 << 20);
    size_t acc_len = 0;
    char buf[65536];
    size_t cap = c->cap ? c->cap : sizeof buf;
    long pulls = 0;
    double deadline = base_mono_s() + 120;
    while (base_mono_s() < deadline) {
        struct stream_opts o = {.format = c->fmt,
                                .page_events = c->page_events,
                                .page_bytes = c->page_bytes,
                                .wake = wake,
                                .ctx = c};
        struct stream *st;
        struct ddpd_error e;
        if (stream_open(c->h, c->s, c->job, c->last, &o, &st, &e) != DDPD_OK) {
            snprintf(c->why, sizeof c->why, "open: %.400s", e.message);
            c->closed = true;
            break;
        }
        acc_len = 0;
        stream_pull r;
        for (;;) {
            size_t len = 0;
            pthread_mutex_lock(&c->mu);
            c->woken = false;
            pthread_mutex_unlock(&c->mu);
            r = stream_next(st, buf, cap, &len);
            if (r == STREAM_DATA) {
                if (acc_len + len > (1 << 20)) {
                    c->bad++;
                    break;
                }
                memcpy(acc + acc_len, buf, len);
                acc_len += len;
                const char *sep = c->fmt == HUB_FORMAT_SSE ? "\n\n" : "\n";
                size_t sl = strlen(sep), start = 0;
                for (size_t i = 0; i + sl <= acc_len; i++)
                    if (!memcmp(acc + i, sep, sl)) {
                        frame(c, acc + start, i - start);
                        start = i + sl;
                        i = start - 1;
                    }
                memmove(acc, acc + start, acc_len - start);
                acc_len -= start;
                if (c->stall_every && ++pulls % c->stall_every == 0)
                    sleep_us(2000);
                continue;
            }
            if (r != STREAM_AGAIN)
                break;
            /* Wait for the wake, bounded; a pull after a timeout is harmless. */
            pthread_mutex_lock(&c->mu);
            if (!c->woken) {
                struct timespec t;
                clock_gettime(CLOCK_REALTIME, &t);
                t.tv_sec += 2;
                pthread_cond_timedwait(&c->cv, &c->mu, &t);
            }
            pthread_mutex_unlock(&c->mu);
            if (base_mono_s() > deadline)
                break;
        }
        if (acc_len)
            c->bad++; /* a cut frame */
        if (r == STREAM_END) {
            c->ended = true;
            stream_free(st);
            break;
        }
        snprintf(c->why, sizeof c->why, "%.500s", stream_why(st));
        stream_free(st);
        if (r == STREAM_CLOSED && c->resume && c->reopens++ < 100000)
            continue;
        c->closed = true;
        break;
    }
    free(acc);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    return NULL;
}

/* A finished job's long history, in both formats, from the start and from the middle,
 * with pages far smaller than the history and reads of odd sizes. */
static void test_history(void)
{
    struct store *s = open_store("history.db");
    struct hub *h = hub_new(NULL);
    int64_t job = new_job(s);
    const int64_t N = 20000;
    for (int64_t q = 1; q <= N; q++)
        emit(s, NULL, job, q, q == N);
    finish_row(s, job);
    static const int64_t afters[] = {0, 1, 12345, 19999};
    for (int f = 0; f < 2; f++)
        for (size_t i = 0; i < sizeof afters / sizeof afters[0]; i++) {
            struct client c = {.h = h,
                               .s = s,
                               .job = job,
                               .after = afters[i],
                               .total = N,
                               .fmt = f ? HUB_FORMAT_SSE : HUB_FORMAT_NDJSON,
                               .page_events = 97,
                               .page_bytes = 3000,
                               .cap = 777};
            run_client(&c);
            CHECK(c.ended);
            CHECK_EQ_INT(c.last, N);
            CHECK_EQ_INT(c.frames, N - afters[i]);
            CHECK_EQ_INT(c.bad, 0);
            CHECK_EQ_INT(c.errors, 0);
        }
    /* The client that had the final event already: the stream ends at once. */
    struct client c = {.h = h, .s = s, .job = job, .after = N, .total = N, .fmt = HUB_FORMAT_NDJSON};
    run_client(&c);
    CHECK(c.ended);
    CHECK_EQ_INT(c.frames, 0);
    /* Past any seq, up to INT64_MAX (no overflow of seq + 1 in the stream or the hub,
     * which UBSan would report): nothing, then the end. */
    static const int64_t far[] = {N + 1, INT64_MAX / 2, INT64_MAX - 1, INT64_MAX};
    for (size_t i = 0; i < sizeof far / sizeof far[0]; i++) {
        struct client z = {.h = h, .s = s, .job = job, .after = far[i], .total = N, .fmt = HUB_FORMAT_SSE};
        run_client(&z);
        CHECK(z.ended);
        CHECK_EQ_INT(z.frames, 0);
        CHECK_EQ_INT(z.bad, 0);
    }
    /* Default pages. */
    struct client d = {.h = h, .s = s, .job = job, .total = N, .fmt = HUB_FORMAT_SSE};
    run_client(&d);
    CHECK(d.ended && d.last == N && d.frames == N && d.bad == 0);
    hub_free(h);
    store_close(s);
}

/* The seam: a job that publishes while clients page its history. The hub keeps a short
 * tail (so most clients start in the store and join the hub late); clients start at
 * different times, some from the middle, some stall (the hub drops them as slow: they
 * resume from their last event, as an SSE client does). Every client must see every event
 * after its start exactly once, in order, and end after the final one. */
struct publisher {
    struct store *s;
    struct hub *h;
    int64_t job, total;
    atomic_int_fast64_t done;
};

static void *run_publisher(void *arg)
{
    struct publisher *p = arg;
    for (int64_t q = 1; q <= p->total; q++) {
        emit(p->s, p->h, p->job, q, q == p->total);
        atomic_store(&p->done, q);
        if (q % 16 == 0)
            sleep_us(300);
    }
    finish_row(p->s, p->job);
    return NULL;
}

static void test_seam(void)
{
    for (int round = 0; round < 3; round++) {
        char name[64];
        snprintf(name, sizeof name, "seam%d.db", round);
        struct store *s = open_store(name);
        struct hub_limits lim = {.job_events = 40 + 30 * (size_t)round};
        struct hub *h = hub_new(&lim);
        struct publisher p = {.s = s, .h = h, .job = new_job(s), .total = 12000};
        pthread_t pt;
        pthread_create(&pt, NULL, run_publisher, &p);
        enum { NC = 8 };
        struct client c[NC];
        pthread_t ct[NC];
        for (int i = 0; i < NC; i++) {
            /* Start at different points of the run. */
            for (int k = 0; k < 2000 && atomic_load(&p.done) < (int64_t)i * 1200; k++)
                sleep_us(1000);
            c[i] = (struct client){.h = h,
                                   .s = s,
                                   .job = p.job,
                                   .total = p.total,
                                   .after = i % 3 == 2 ? atomic_load(&p.done) / 2 : 0,
                                   .fmt = i % 2 ? HUB_FORMAT_SSE : HUB_FORMAT_NDJSON,
                                   .page_events = (size_t)(50 + 37 * i),
                                   .page_bytes = 4096 + 999 * (size_t)i,
                                   .cap = i % 4 == 0 ? 100 : 0,
                                   .stall_every = i % 4 == 3 ? 50 : 0,
                                   .resume = true};
            pthread_create(&ct[i], NULL, run_client, &c[i]);
        }
        pthread_join(pt, NULL);
        for (int i = 0; i < NC; i++) {
            pthread_join(ct[i], NULL);
            if (getenv("VERBOSE") || !c[i].ended || c[i].bad || c[i].last != p.total)
                fprintf(stderr,
                        "    round %d client %d: ended %d last %" PRId64 " bad %ld reopens %ld why %s\n",
                        round, i, c[i].ended, c[i].last, c[i].bad, c[i].reopens, c[i].why);
            CHECK(c[i].ended);
            CHECK_EQ_INT(c[i].last, p.total);
            CHECK_EQ_INT(c[i].bad, 0);
            /* Every reopen was announced by a stream_error frame. */
            CHECK_EQ_INT(c[i].errors, c[i].reopens);
        }
        /* The hub holds this finished job: past its last seq, up to INT64_MAX, nothing. */
        struct client z = {
            .h = h, .s = s, .job = p.job, .after = INT64_MAX, .total = p.total, .fmt = HUB_FORMAT_NDJSON};
        run_client(&z);
        CHECK(z.ended);
        CHECK_EQ_INT(z.frames, 0);
        hub_free(h);
        store_close(s);
    }
}

/* Overwrites the middle of a closed database's file (pages of the events table and its
 * index) with garbage: reads there fail with SQLITE_CORRUPT. */
static void corrupt_middle(const char *path)
{
    sqlite3 *db;
    CHECK_EQ_INT(sqlite3_open(path, &db), SQLITE_OK);
    CHECK_EQ_INT(sqlite3_exec(db, "PRAGMA wal_checkpoint(TRUNCATE)", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
    FILE *f = fopen(path, "r+b");
    CHECK(f != NULL);
    if (!f)
        return;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    char junk[4096];
    memset(junk, 0xA5, sizeof junk);
    for (long off = size / 2 / 4096 * 4096; off < size * 6 / 10; off += 4096) {
        fseek(f, off, SEEK_SET);
        fwrite(junk, 1, sizeof junk, f);
    }
    fclose(f);
}

/* A read error in the middle of a finished job's history: the stream gives what it
 * read, then a stream_error frame naming the database, and is CLOSED: never END (the old
 * gap fill took the failed read for the end of a finished job and closed the stream as
 * complete, without the final event). */
static void test_read_error(void)
{
    char path[600];
    snprintf(path, sizeof path, "%s/corrupt.db", tmpdir);
    struct store *s = open_store("corrupt.db");
    int64_t job = new_job(s);
    const int64_t N = 30000;
    for (int64_t q = 1; q <= N; q++)
        emit(s, NULL, job, q, q == N);
    finish_row(s, job);
    store_close(s);
    corrupt_middle(path);
    s = open_store("corrupt.db");
    struct hub *h = hub_new(NULL);
    for (int f = 0; f < 2; f++) {
        struct client c = {
            .h = h, .s = s, .job = job, .total = N, .fmt = f ? HUB_FORMAT_SSE : HUB_FORMAT_NDJSON};
        run_client(&c);
        CHECK(!c.ended);
        CHECK(c.closed);
        CHECK(c.last > 0 && c.last < N);
        CHECK_EQ_INT(c.bad, 0);
        CHECK_EQ_INT(c.errors, 1);
        CHECK(strstr(c.last_error, "from the database") != NULL);
        CHECK(strstr(c.why, "cannot read the events of job") != NULL);
        fprintf(stderr, "    read error after seq %" PRId64 ": %s\n", c.last, c.why);
    }
    hub_free(h);
    store_close(s);
}

/* A job deleted while a client pages its history: CLOSED with "deleted", not END. */
static void test_deleted(void)
{
    struct store *s = open_store("deleted.db");
    struct hub *h = hub_new(NULL);
    int64_t job = new_job(s);
    const int64_t N = 5000;
    for (int64_t q = 1; q < N; q++) /* no final event: the job ended on a full disk */
        emit(s, NULL, job, q, false);
    finish_row(s, job);
    struct stream_opts o = {.format = HUB_FORMAT_NDJSON, .page_events = 100};
    struct stream *st;
    struct ddpd_error e;
    CHECK_EQ_INT(stream_open(h, s, job, 0, &o, &st, &e), DDPD_OK);
    char buf[4096];
    size_t len;
    CHECK_EQ_INT(stream_next(st, buf, sizeof buf, &len), STREAM_DATA);
    CHECK_EQ_INT(store_job_delete(s, job, JOB_STATES_FINAL, &e), DDPD_OK);
    hub_job_forget(h, job);
    stream_pull r;
    int n = 0;
    char tail[8192] = "";
    while ((r = stream_next(st, buf, sizeof buf - 1, &len)) == STREAM_DATA && n++ < 100000) {
        buf[len] = '\0';
        snprintf(tail, sizeof tail, "%s", buf);
    }
    CHECK_EQ_INT(r, STREAM_CLOSED);
    CHECK(strstr(tail, "\"event\":\"stream_error\"") && strstr(tail, "was deleted"));
    CHECK(strstr(stream_why(st), "was deleted") != NULL);
    stream_free(st);

    /* The variant without a delete: a finished job without its final event in the
     * store ends (the row is final: the client cannot get more), as END. */
    job = new_job(s);
    for (int64_t q = 1; q < 300; q++)
        emit(s, NULL, job, q, false);
    finish_row(s, job);
    CHECK_EQ_INT(stream_open(h, s, job, 0, &o, &st, &e), DDPD_OK);
    while ((r = stream_next(st, buf, sizeof buf, &len)) == STREAM_DATA)
        ;
    CHECK_EQ_INT(r, STREAM_END);
    stream_free(st);
    hub_free(h);
    store_close(s);
}

/* Waits (bounded) for the client's wake; true when it came. */
static bool wait_woken(struct client *c, double limit_s)
{
    double end = base_mono_s() + limit_s;
    pthread_mutex_lock(&c->mu);
    while (!c->woken && base_mono_s() < end) {
        pthread_mutex_unlock(&c->mu);
        sleep_us(2000);
        pthread_mutex_lock(&c->mu);
    }
    bool w = c->woken;
    c->woken = false;
    pthread_mutex_unlock(&c->mu);
    return w;
}

/* streams_new / streams_open: an idle SSE stream is woken by the heartbeat thread and its
 * pull sends the keep-alive comment, between frames; NDJSON has none; live events still
 * come; every stream leaves the handle's list on stream_free (streams_free after). */
static void test_streams_heartbeat(void)
{
    struct store *s = open_store("heartbeat.db");
    struct hub *h = hub_new(NULL);
    int64_t job = new_job(s);
    struct streams *ss;
    struct ddpd_error e;
    CHECK_EQ_INT(streams_new(h, s, 0.2, &ss, &e), DDPD_OK);
    struct client sse = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    struct client nd = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    struct stream *a, *b;
    CHECK_EQ_INT(streams_open(ss, job, 0, HUB_FORMAT_SSE, wake, &sse, &a, &e), DDPD_OK);
    CHECK_EQ_INT(streams_open(ss, job, 0, HUB_FORMAT_NDJSON, wake, &nd, &b, &e), DDPD_OK);
    char buf[4096];
    size_t len, hbn;
    const char *hb = hub_heartbeat(HUB_FORMAT_SSE, &hbn);
    /* Drain to AGAIN (the empty history), then wait for the heartbeat thread's wake. */
    stream_pull r;
    int n = 0;
    while ((r = stream_next(a, buf, sizeof buf, &len)) == STREAM_DATA && n++ < 100)
        CHECK(len == hbn && !memcmp(buf, hb, hbn)); /* only keep-alives before any event */
    CHECK_EQ_INT(r, STREAM_AGAIN);
    CHECK(wait_woken(&sse, 60));
    CHECK_EQ_INT(stream_next(a, buf, sizeof buf, &len), STREAM_DATA);
    CHECK(len == hbn && !memcmp(buf, hb, hbn));
    /* A buffer too small for the keep-alive gets nothing, not a part of it. */
    CHECK(wait_woken(&sse, 60));
    CHECK_EQ_INT(stream_next(a, buf, 1, &len), STREAM_AGAIN);
    /* NDJSON has no comment syntax: no keep-alive, however idle. */
    while ((r = stream_next(b, buf, sizeof buf, &len)) == STREAM_DATA && n++ < 100)
        ;
    CHECK_EQ_INT(r, STREAM_AGAIN);
    CHECK(wait_woken(&nd, 60));
    CHECK_EQ_INT(stream_next(b, buf, sizeof buf, &len), STREAM_AGAIN);
    /* An event reaches both, as a frame of its own. */
    emit(s, h, job, 1, false);
    for (int i = 0; i < 2; i++) {
        struct stream *st = i ? b : a;
        bool got = false;
        for (n = 0; n < 100 && (r = stream_next(st, buf, sizeof buf - 1, &len)) == STREAM_DATA; n++) {
            buf[len] = '\0';
            if (strstr(buf, "\"seq\":1"))
                got = true;
        }
        CHECK(got);
    }
    stream_free(a);
    stream_free(b);
    streams_free(ss);
    streams_free(NULL);
    hub_free(h);
    store_close(s);
}

int main(void)
{
    const char *base = getenv("DDPD_TEST_TMP");
    if (!base)
        base = "/tmp";
    mkdir(base, 0755);
    snprintf(tmpdir, sizeof tmpdir, "%s/stream-XXXXXX", base);
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    test_history();
    test_seam();
    test_read_error();
    test_deleted();
    test_streams_heartbeat();
    base_remove_tree(tmpdir);
    CHECK_DONE();
}
