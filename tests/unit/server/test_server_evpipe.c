/* test_server_evpipe.c — server/evpipe.c with a real store and hub: a rank's stdout line
 * is decoded and numbered by its job's source (its rank the pipe's, a `start` handed to
 * on_start, a line that is no event dropped); an event is in the store once drained; an end the store did not
 * take (its row, its ranks' rows) is stored by evpipe_retry; the end of a job deleted meanwhile is dropped,
 * not retried forever. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "server/evpipe.h"
#include "server/hub.h"
#include "server/store.h"

static int64_t new_job(struct store *s)
{
    struct ddpd_error e;
    struct store_job_new jn = {.name = "t", .spec = "{}", .world_size = 2, .device = DEVICE_CPU};
    int64_t id = 0;
    CHECK_EQ_INT(store_job_insert(s, &jn, &id, NULL, &e), DDPD_OK);
    return id;
}

static struct event state_event(int64_t job, int64_t seq, const char *state)
{
    struct event ev = {.kind = EVENT_STATE,
                       .rank = -1,
                       .has_server_fields = true,
                       .job = job,
                       .attempt = 1,
                       .seq = seq,
                       .ts = 1764680000.0 + (double)seq};
    snprintf(ev.state, sizeof ev.state, "%s", state);
    return ev;
}

static int64_t max_seq(struct store *s, int64_t job)
{
    int64_t seq = -1;
    CHECK_EQ_INT(store_event_max_seq(s, job, &seq, NULL), DDPD_OK);
    return seq;
}

struct started {
    int calls, rank;
};

static void on_start(void *ctx, int rank)
{
    struct started *st = ctx;
    st->calls++;
    st->rank = rank;
}

/* The committed event of `job` with seq `seq` into body (cap bytes); its rank. -2: none. */
static int event_at(struct store *s, int64_t job, int64_t seq, char *body, size_t cap);

struct one_row {
    int64_t seq;
    int rank;
    char *body;
    size_t cap;
    bool found;
};

static bool one_row_fn(void *ctx, const struct store_event_row *row)
{
    struct one_row *o = ctx;
    if (row->seq == o->seq) {
        o->found = true;
        o->rank = row->rank;
        snprintf(o->body, o->cap, "%s", row->body);
    }
    return true;
}

static int event_at(struct store *s, int64_t job, int64_t seq, char *body, size_t cap)
{
    struct one_row o = {.seq = seq, .body = body, .cap = cap};
    CHECK_EQ_INT(store_events_read(s, job, seq - 1, 1, one_row_fn, &o, NULL, NULL), DDPD_OK);
    return o.found ? o.rank : -2;
}

/* A rank's lines through a job's source: stamped with the source's job, attempt and seq,
 * the rank the pipe's, a `start` handed on after it is queued, other lines dropped. */
static void test_source(struct store *st, struct evpipe *p)
{
    int64_t job = new_job(st);
    CHECK_EQ_INT(store_flush(st, NULL), DDPD_OK);
    int64_t first = max_seq(st, job) + 1;
    struct started seen = {0, -1};
    struct evpipe_source src = {
        .pipe = p, .job = job, .attempt = 2, .next_seq = first, .on_start = on_start, .ctx = &seen};
    char line[EVENT_LINE_MAX], body[EVENT_LINE_MAX];

    struct event start = {.kind = EVENT_START, .rank = 0, .ts = 1764680000.5, .world_size = 2};
    snprintf(start.device, sizeof start.device, "cpu");
    int n = event_encode(&start, line, sizeof line);
    CHECK(n > 0);
    evpipe_rank_line(&src, 1, line, (size_t)n);
    CHECK_EQ_INT(seen.calls, 1);
    CHECK_EQ_INT(seen.rank, 1);

    struct event loss = {
        .kind = EVENT_LOSS, .rank = 0, .ts = 1764680001.0, .step = 3, .epoch = 1, .loss = 0.25};
    n = event_encode(&loss, line, sizeof line);
    CHECK(n > 0);
    evpipe_rank_line(&src, 1, line, (size_t)n);
    evpipe_rank_line(&src, 1, "not an event", 12); /* logged, dropped: takes no seq */
    CHECK_EQ_INT(src.next_seq, first + 2);
    CHECK_EQ_INT(seen.calls, 1);

    struct event state = {.kind = EVENT_STATE, .rank = -1}; /* ts 0: stamped now */
    snprintf(state.state, sizeof state.state, "running");
    evpipe_publish(&src, &state);
    CHECK(state.ts > 1764680001.0);
    CHECK_EQ_INT(state.seq, first + 2);
    evpipe_drain(p);

    CHECK_EQ_INT(max_seq(st, job), first + 2);
    CHECK_EQ_INT(event_at(st, job, first, body, sizeof body), 1);
    CHECK(strstr(body, "\"event\":\"start\"") != NULL);
    CHECK_EQ_INT(event_at(st, job, first + 1, body, sizeof body), 1); /* the pipe's rank, not the line's */
    struct event back;
    CHECK_EQ_INT(event_decode(body, strlen(body), &back, NULL), DDPD_OK);
    CHECK_EQ_INT(back.kind, EVENT_LOSS);
    CHECK(back.has_server_fields);
    CHECK_EQ_INT(back.job, job);
    CHECK_EQ_INT(back.attempt, 2);
    CHECK_EQ_INT(back.seq, first + 1);
    CHECK_EQ_INT(back.step, 3);
    CHECK_EQ_INT(event_at(st, job, first + 2, body, sizeof body), -1);
    CHECK(strstr(body, "\"state\":\"running\"") != NULL);
}

int main(void)
{
    const char *base = getenv("DDPD_TEST_TMP");
    char dir[600], db[700];
    snprintf(dir, sizeof dir, "%s/evpipe-XXXXXX", base ? base : "/tmp");
    if (base)
        mkdir(base, 0755);
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    snprintf(db, sizeof db, "%s/ddpd.db", dir);
    struct ddpd_error e;
    struct store *st = store_open(db, &e);
    struct hub *hub = hub_new(NULL);
    struct evpipe *p = evpipe_new(st, hub);
    CHECK(st && hub && p);
    if (!st || !hub || !p)
        return 1;

    /* Added, then in the store once drained (the job's queued event is seq 1). */
    int64_t a = new_job(st);
    CHECK_EQ_INT(store_flush(st, NULL), DDPD_OK);
    int64_t before = max_seq(st, a);
    struct event ev = state_event(a, before + 1, "starting");
    evpipe_add(p, &ev, false);
    evpipe_drain(p);
    CHECK_EQ_INT(max_seq(st, a), before + 1);

    /* An end whose row and ranks the store did not take: stored by the retry. */
    CHECK_EQ_INT(store_attempt_begin(st, a, 1, NULL, NULL), DDPD_OK);
    struct event fin = state_event(a, before + 2, "failed");
    evpipe_add(p, &fin, false);
    evpipe_drain(p);
    struct store_rank *ranks = calloc(2, sizeof *ranks);
    for (int r = 0; r < 2; r++) {
        ranks[r] = (struct store_rank){.attempt = 1, .rank = r, .has_exit_code = true, .exit_code = 3 + r};
        snprintf(ranks[r].state, sizeof ranks[r].state, "failed");
    }
    evpipe_end_unsaved(p, &fin, false, 1, "rank 1 failed", ranks, 2);
    evpipe_retry(p, true);
    struct store_job j;
    memset(&j, 0, sizeof j);
    CHECK_EQ_INT(store_job_get(st, a, &j, &e), DDPD_OK);
    CHECK_EQ_INT(j.state, JOB_STATE_FAILED);
    CHECK_EQ_INT(j.restarts, 1);
    CHECK_EQ_STR(j.error, "rank 1 failed");
    CHECK_EQ_INT((int)j.n_ranks, 2);
    if (j.n_ranks == 2)
        CHECK_EQ_INT(j.ranks[1].exit_code, 4);
    store_job_clear(&j);

    /* The end of a job deleted meanwhile is dropped: the retry stores nothing of it. */
    int64_t b = new_job(st);
    CHECK_EQ_INT(store_flush(st, NULL), DDPD_OK);
    struct store_job_update u = {.fields = STORE_SET_STATE, .state = JOB_STATE_CANCELLED};
    CHECK_EQ_INT(store_job_update(st, b, &u, NULL, &e), DDPD_OK);
    struct event fb = state_event(b, max_seq(st, b) + 1, "cancelled");
    evpipe_end_unsaved(p, &fb, false, 0, NULL, NULL, 0);
    CHECK_EQ_INT(store_job_delete(st, b, JOB_STATES_FINAL, &e), DDPD_OK);
    evpipe_retry(p, true);
    memset(&j, 0, sizeof j);
    CHECK_EQ_INT(store_job_get(st, b, &j, NULL), DDPD_ENOTFOUND);
    store_job_clear(&j);
    evpipe_report_unsaved(p); /* nothing left to report */

    test_source(st, p);

    evpipe_free(p);
    evpipe_free(NULL);
    hub_free(hub);
    store_close(st);
    char path[800];
    snprintf(path, sizeof path, "%s/ddpd.db", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/ddpd.db-wal", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/ddpd.db-shm", dir);
    unlink(path);
    rmdir(dir);
    CHECK_DONE();
}
