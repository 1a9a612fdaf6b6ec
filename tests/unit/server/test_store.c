/* test_store.c — the job store against real SQLite files in a temp folder: migrations
 * (fresh, idempotent, the generated table in order, a newer database
 * refused), jobs (insert, get, list with cursor and filter, updates and their guards),
 * attempts and ranks, the event writer (order, after-seq, progress, refused rows, a full
 * queue, a locked database), 100k loss events ingested (rate printed), the metrics
 * downsampling, readers beside the writer, delete, and SIGKILL at random moments. */
#include "check.h"
#include "base/file.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdbool.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "schema/event.h"
#include "server/store.h"

/* Sanitized builds run 5-50x slower: they get smaller workloads (the plain build runs
 * the full sizes and prints the rates). */
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
#define SANITIZED 1
#endif
#endif
#ifndef SANITIZED
#define SANITIZED 0
#endif

#define SPEC "{\"name\":\"t\",\"model\":[{\"type\":\"linear\",\"in\":2,\"out\":1}]}"

static char tmpdir[512];

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void db_path(char *buf, size_t cap, const char *name)
{
    snprintf(buf, cap, "%s/%s", tmpdir, name);
}

static struct store *open_ok(const char *path, const struct store_opts *o)
{
    struct ddpd_error e;
    ddpd_error_clear(&e);
    struct store *s = store_open_with(path, o, &e);
    if (!s)
        fprintf(stderr, "    store_open(%s): %s %s\n", path, ddpd_err_name(e.code), e.message);
    CHECK(s != NULL);
    return s;
}

static int64_t insert_job(struct store *s, const char *name, int world)
{
    struct ddpd_error e;
    struct store_job_new j = {.name = name, .spec = SPEC, .world_size = world, .device = DEVICE_CPU};
    int64_t id = 0;
    double created = 0;
    ddpd_err rc = store_job_insert(s, &j, &id, &created, &e);
    if (rc != DDPD_OK)
        fprintf(stderr, "    insert: %s\n", e.message);
    CHECK_EQ_INT(rc, DDPD_OK);
    CHECK(id > 0);
    CHECK(created > 1.6e9);
    return id;
}

static ddpd_err set_state(struct store *s, int64_t id, job_state st, unsigned if_states)
{
    struct ddpd_error e;
    struct store_job_update u = {.fields = STORE_SET_STATE, .if_states = if_states, .state = st};
    return store_job_update(s, id, &u, NULL, &e);
}

/* Fills a server-side event (job, attempt, seq) and its body as the hub would. */
static int make_event(struct event *ev, char *body, size_t cap, int64_t job, int64_t seq, int attempt,
                      event_kind kind, int rank, int64_t step, double loss)
{
    memset(ev, 0, sizeof *ev);
    ev->kind = kind;
    ev->rank = kind == EVENT_STATE ? -1 : rank;
    ev->ts = 1764680000.0 + (double)seq * 1e-3;
    ev->step = step;
    ev->loss = loss;
    ev->nonfinite = !isfinite(loss);
    ev->samples_per_s = 1000.0 + rank;
    if (kind == EVENT_STATE)
        snprintf(ev->state, sizeof ev->state, "running");
    if (kind == EVENT_START) {
        ev->world_size = 2;
        snprintf(ev->device, sizeof ev->device, "cpu");
    }
    ev->has_server_fields = true;
    ev->job = job;
    ev->attempt = attempt;
    ev->seq = seq;
    return body ? event_encode(ev, body, cap) : 0;
}

static ddpd_err append(struct store *s, int64_t job, int64_t seq, int attempt, event_kind kind, int rank,
                       int64_t step, double loss)
{
    struct event ev;
    char body[EVENT_LINE_MAX];
    int n = make_event(&ev, body, sizeof body, job, seq, attempt, kind, rank, step, loss);
    CHECK(n > 0);
    struct ddpd_error e;
    ddpd_err rc = store_event_append(s, &ev, body, (size_t)n, &e);
    if (rc != DDPD_OK && rc != DDPD_EBUSY)
        fprintf(stderr, "    append: %s\n", e.message);
    return rc;
}

static ddpd_err flush(struct store *s)
{
    struct ddpd_error e;
    ddpd_err rc = store_flush(s, &e);
    if (rc != DDPD_OK)
        fprintf(stderr, "    flush: %s %s\n", ddpd_err_name(rc), e.message);
    return rc;
}

/* Runs one SQL query on a raw connection and returns its first column as an integer
 * (text results compared by the caller through `text`). */
static long long raw_query(const char *path, const char *sql, char *text, size_t cap)
{
    sqlite3 *db = NULL;
    sqlite3_stmt *st = NULL;
    long long v = -1;
    if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK &&
        sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW) {
        v = sqlite3_column_int64(st, 0);
        if (text)
            snprintf(text, cap, "%s", (const char *)sqlite3_column_text(st, 0));
    } else {
        fprintf(stderr, "    raw query %s: %s\n", sql, db ? sqlite3_errmsg(db) : "?");
    }
    sqlite3_finalize(st);
    sqlite3_close(db);
    return v;
}

/* ---- migrations ---- */

/* The migrations table the build generated from schema/migrations/ (one copy of the SQL:
 * the .sql files; cmake/embed_migrations.cmake numbers them and stops at a gap). */
static void test_migration_table(void)
{
    CHECK(store_schema_version() >= 1);
    CHECK(store_migration_sql(0, NULL) == NULL);
    CHECK(store_migration_sql(store_schema_version() + 1, NULL) == NULL);
    for (int v = 1; v <= store_schema_version(); v++) {
        const char *name = NULL, *sql = store_migration_sql(v, &name);
        CHECK(sql != NULL && name != NULL);
        if (!sql || !name)
            continue;
        CHECK_EQ_INT(strtol(name, NULL, 10), v);
        CHECK(strlen(name) > 4 && strcmp(name + strlen(name) - 4, ".sql") == 0);
        CHECK(sqlite3_complete(sql));
    }
}

static void test_open_fresh_and_again(void)
{
    char path[700], text[64];
    db_path(path, sizeof path, "a/b/c/fresh.db"); /* parent folders are created */
    struct store *s = open_ok(path, NULL);
    if (!s)
        return;
    int64_t id = insert_job(s, "kept", 1);
    store_close(s);
    store_close(NULL);
    CHECK_EQ_INT(raw_query(path, "PRAGMA user_version", NULL, 0), store_schema_version());
    raw_query(path, "PRAGMA journal_mode", text, sizeof text);
    CHECK_EQ_STR(text, "wal");
    CHECK_EQ_INT(raw_query(path,
                           "SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND "
                           "name IN ('jobs', 'attempts', 'ranks', 'events', 'loss')",
                           NULL, 0),
                 5);
    /* Reopening applies nothing twice and keeps the data. */
    for (int i = 0; i < 2; i++) {
        s = open_ok(path, NULL);
        if (!s)
            return;
        struct store_job j;
        struct ddpd_error e;
        CHECK_EQ_INT(store_job_get(s, id, &j, &e), DDPD_OK);
        CHECK_EQ_STR(j.name, "kept");
        store_job_clear(&j);
        CHECK_EQ_INT(store_ping(s, &e), DDPD_OK);
        store_close(s);
    }
    CHECK_EQ_INT(raw_query(path, "PRAGMA user_version", NULL, 0), store_schema_version());
    CHECK_EQ_INT(raw_query(path, "SELECT count(*) FROM jobs", NULL, 0), 1);
}

static void test_open_errors(void)
{
    char path[700];
    struct ddpd_error e;
    /* A database from a newer ddpd. */
    db_path(path, sizeof path, "newer.db");
    sqlite3 *db = NULL;
    CHECK_EQ_INT(sqlite3_open(path, &db), SQLITE_OK);
    CHECK_EQ_INT(sqlite3_exec(db, "CREATE TABLE x (y); PRAGMA user_version = 99", NULL, NULL, NULL),
                 SQLITE_OK);
    sqlite3_close(db);
    ddpd_error_clear(&e);
    struct store *s = store_open(path, &e);
    CHECK(s == NULL);
    store_close(s);
    CHECK_EQ_INT(e.code, DDPD_ECONFLICT);
    CHECK(strstr(e.message, "99") != NULL);
    CHECK(strstr(e.message, "newer") != NULL);
    CHECK_EQ_INT(raw_query(path, "PRAGMA user_version", NULL, 0), 99); /* left untouched */

    /* Another program's database: a negative user_version (read as a version, it indexed
     * the migrations at -1). */
    db_path(path, sizeof path, "foreign.db");
    CHECK_EQ_INT(sqlite3_open(path, &db), SQLITE_OK);
    CHECK_EQ_INT(sqlite3_exec(db, "CREATE TABLE x (y); PRAGMA user_version = -7", NULL, NULL, NULL),
                 SQLITE_OK);
    sqlite3_close(db);
    ddpd_error_clear(&e);
    s = store_open(path, &e);
    CHECK(s == NULL);
    store_close(s);
    CHECK_EQ_INT(e.code, DDPD_ECONFLICT);
    CHECK(strstr(e.message, "-7") != NULL);
    CHECK(strstr(e.message, "not a ddpd database") != NULL);
    CHECK_EQ_INT(raw_query(path, "PRAGMA user_version", NULL, 0), -7); /* left untouched */

    /* A file that is not a database. */
    db_path(path, sizeof path, "garbage.db");
    FILE *f = fopen(path, "wb");
    for (int i = 0; f && i < 512; i++)
        fputs("not a database at all ", f);
    if (f)
        fclose(f);
    ddpd_error_clear(&e);
    s = store_open(path, &e);
    CHECK(s == NULL);
    CHECK_EQ_INT(e.code, DDPD_EIO);
    CHECK(strstr(e.message, "not a database") != NULL);

    /* Not a file name; a folder that cannot be made. */
    CHECK(store_open(":memory:", &e) == NULL);
    db_path(path, sizeof path, "garbage.db/sub/x.db");
    ddpd_error_clear(&e);
    CHECK(store_open(path, &e) == NULL);
    CHECK_EQ_INT(e.code, DDPD_EIO);
}

/* ---- jobs ---- */

static void test_jobs(void)
{
    char path[700];
    struct ddpd_error e;
    db_path(path, sizeof path, "jobs.db");
    struct store *s = open_ok(path, NULL);
    if (!s)
        return;
    int64_t ids[25];
    for (int i = 0; i < 25; i++) {
        char name[32];
        snprintf(name, sizeof name, "job-%d", i);
        ids[i] = insert_job(s, name, 1 + i % 3);
        if (i > 0)
            CHECK(ids[i] > ids[i - 1]);
    }
    /* get */
    struct store_job j;
    CHECK_EQ_INT(store_job_get(s, ids[4], &j, &e), DDPD_OK);
    CHECK_EQ_INT(j.id, ids[4]);
    CHECK_EQ_STR(j.name, "job-4");
    CHECK_EQ_INT(j.state, JOB_STATE_QUEUED);
    CHECK_EQ_STR(j.spec, SPEC);
    CHECK_EQ_INT(j.world_size, 2);
    CHECK_EQ_INT(j.device, DEVICE_CPU);
    CHECK(j.created_at > 1.6e9);
    CHECK(j.started_at == 0 && j.finished_at == 0);
    CHECK_EQ_INT(j.attempt, 0);
    CHECK(!j.has_progress);
    CHECK_EQ_STR(j.error, "");
    CHECK_EQ_INT(j.n_ranks, 0);
    store_job_clear(&j);
    CHECK_EQ_INT(store_job_get(s, 999999, &j, &e), DDPD_ENOTFOUND);
    store_job_clear(&j);

    /* bad inserts */
    int64_t id;
    struct store_job_new bad = {.name = "x", .spec = "{not json", .world_size = 1};
    CHECK_EQ_INT(store_job_insert(s, &bad, &id, NULL, &e), DDPD_EINTERNAL);
    bad.spec = SPEC;
    bad.world_size = 0;
    CHECK_EQ_INT(store_job_insert(s, &bad, &id, NULL, &e), DDPD_EINTERNAL);

    /* list: newest first, pages of 10 */
    struct store_job_list l;
    struct store_job_query q = {.limit = 10};
    int seen = 0;
    int64_t expect = ids[24];
    for (int page = 0; page < 5; page++) {
        CHECK_EQ_INT(store_job_list(s, &q, &l, &e), DDPD_OK);
        for (size_t i = 0; i < l.n; i++, seen++, expect--)
            CHECK_EQ_INT(l.jobs[i].id, expect);
        CHECK(l.n == 0 || l.jobs[0].spec == NULL); /* with_spec off */
        q.before = l.next;
        bool last = l.next == 0;
        CHECK_EQ_INT(l.n, page < 2 ? 10 : 5);
        store_job_list_free(&l);
        if (last)
            break;
    }
    CHECK_EQ_INT(seen, 25);

    /* state changes */
    job_state old = JOB_STATE_COUNT;
    struct store_job_update u = {.fields = STORE_SET_PENDING, .pending_reason = "waiting for 2 cpu slots"};
    CHECK_EQ_INT(store_job_update(s, ids[0], &u, &old, &e), DDPD_OK);
    CHECK_EQ_INT(old, JOB_STATE_QUEUED);
    CHECK_EQ_INT(store_job_get(s, ids[0], &j, &e), DDPD_OK);
    CHECK_EQ_STR(j.pending_reason, "waiting for 2 cpu slots");
    store_job_clear(&j);
    u = (struct store_job_update){.fields = STORE_SET_STATE | STORE_SET_ATTEMPT,
                                  .if_states = JOB_STATE_BIT(JOB_STATE_QUEUED),
                                  .state = JOB_STATE_STARTING,
                                  .attempt = 1};
    CHECK_EQ_INT(store_job_update(s, ids[0], &u, &old, &e), DDPD_OK);
    CHECK_EQ_INT(store_attempt_begin(s, ids[0], 1, "00ab", &e), DDPD_OK);
    CHECK_EQ_INT(store_attempt_begin(s, ids[0], 1, "00ab", &e), DDPD_ECONFLICT);
    CHECK_EQ_INT(store_attempt_begin(s, 999999, 1, NULL, &e), DDPD_ENOTFOUND);
    for (int r = 0; r < 2; r++) {
        struct store_rank rk = {.attempt = 1,
                                .rank = r,
                                .pid = 1000 + r,
                                .start_time = 123456789ull + (uint64_t)r,
                                .state = "running"};
        CHECK_EQ_INT(store_rank_put(s, ids[0], &rk, &e), DDPD_OK);
    }
    struct store_rank rk = {.attempt = 1, .rank = 0, .state = "x"};
    CHECK_EQ_INT(store_rank_put(s, 999999, &rk, &e), DDPD_ENOTFOUND);
    CHECK_EQ_INT(set_state(s, ids[0], JOB_STATE_RUNNING, 0), DDPD_OK);
    CHECK_EQ_INT(store_job_get(s, ids[0], &j, &e), DDPD_OK);
    CHECK_EQ_INT(j.state, JOB_STATE_RUNNING);
    CHECK(j.started_at > 1.6e9);
    CHECK(j.finished_at == 0);
    CHECK_EQ_STR(j.pending_reason, ""); /* cleared on leaving queued */
    CHECK_EQ_INT(j.attempt, 1);
    CHECK_EQ_INT(j.n_ranks, 2);
    if (j.n_ranks == 2) {
        CHECK_EQ_INT(j.ranks[1].rank, 1);
        CHECK_EQ_INT(j.ranks[1].pid, 1001);
        CHECK_EQ_INT(j.ranks[1].start_time, 123456790);
        CHECK_EQ_STR(j.ranks[1].state, "running");
        CHECK(!j.ranks[1].has_exit_code);
    }
    double started = j.started_at;
    store_job_clear(&j);

    /* a guarded change that does not apply changes nothing */
    CHECK_EQ_INT(set_state(s, ids[0], JOB_STATE_CANCELLED, JOB_STATE_BIT(JOB_STATE_QUEUED)), DDPD_ECONFLICT);
    CHECK_EQ_INT(set_state(s, 999999, JOB_STATE_CANCELLED, 0), DDPD_ENOTFOUND);

    /* ranks exit, the attempt ends, the job fails with an error */
    rk = (struct store_rank){.attempt = 1,
                             .rank = 1,
                             .pid = 1001,
                             .start_time = 123456790,
                             .state = "exited",
                             .has_exit_code = true,
                             .exit_code = 137};
    CHECK_EQ_INT(store_rank_put(s, ids[0], &rk, &e), DDPD_OK);
    CHECK_EQ_INT(store_attempt_end(s, ids[0], 1, "failed", &e), DDPD_OK);
    CHECK_EQ_INT(store_attempt_end(s, ids[0], 7, "failed", &e), DDPD_ENOTFOUND);
    u = (struct store_job_update){.fields = STORE_SET_STATE | STORE_SET_ERROR,
                                  .if_states = JOB_STATES_ACTIVE,
                                  .state = JOB_STATE_FAILED,
                                  .error = "rank 1 was killed by signal 9"};
    CHECK_EQ_INT(store_job_update(s, ids[0], &u, &old, &e), DDPD_OK);
    CHECK_EQ_INT(old, JOB_STATE_RUNNING);
    CHECK_EQ_INT(store_job_get(s, ids[0], &j, &e), DDPD_OK);
    CHECK_EQ_INT(j.state, JOB_STATE_FAILED);
    CHECK_EQ_STR(j.error, "rank 1 was killed by signal 9");
    CHECK(j.finished_at >= j.started_at);
    CHECK(j.started_at == started);
    CHECK(j.n_ranks == 2 && j.ranks[1].has_exit_code && j.ranks[1].exit_code == 137);
    CHECK_EQ_INT(raw_query(path,
                           "SELECT count(*) FROM attempts WHERE outcome = 'failed' AND "
                           "finished_at >= started_at AND comm_id = '00ab'",
                           NULL, 0),
                 1);
    store_job_clear(&j);

    /* a restart: back to starting with a new attempt, the error cleared */
    u = (struct store_job_update){.fields = STORE_SET_STATE | STORE_SET_ATTEMPT | STORE_SET_RESTARTS |
                                            STORE_SET_ERROR,
                                  .state = JOB_STATE_STARTING,
                                  .attempt = 2,
                                  .restarts = 1};
    CHECK_EQ_INT(store_job_update(s, ids[0], &u, NULL, &e), DDPD_OK);
    CHECK_EQ_INT(store_job_get(s, ids[0], &j, &e), DDPD_OK);
    CHECK_EQ_INT(j.state, JOB_STATE_STARTING);
    CHECK_EQ_INT(j.attempt, 2);
    CHECK_EQ_INT(j.restarts, 1);
    CHECK_EQ_STR(j.error, "");
    CHECK(j.finished_at == 0 && j.started_at == started);
    CHECK_EQ_INT(j.n_ranks, 0); /* attempt 2 has none yet */
    store_job_clear(&j);

    /* a long error is cut at a character boundary */
    char longerr[3000];
    for (size_t i = 0; i + 2 < sizeof longerr; i += 2)
        memcpy(longerr + i, "\xc3\xa9", 2); /* é */
    longerr[sizeof longerr - 2] = '\0';
    u = (struct store_job_update){.fields = STORE_SET_ERROR, .error = longerr};
    CHECK_EQ_INT(store_job_update(s, ids[0], &u, NULL, &e), DDPD_OK);
    CHECK_EQ_INT(store_job_get(s, ids[0], &j, &e), DDPD_OK);
    CHECK_EQ_INT(strlen(j.error), STORE_TEXT_MAX - 2);
    store_job_clear(&j);

    /* filters */
    CHECK_EQ_INT(set_state(s, ids[1], JOB_STATE_SUCCEEDED, 0), DDPD_OK);
    CHECK_EQ_INT(set_state(s, ids[2], JOB_STATE_CANCELLED, 0), DDPD_OK);
    CHECK_EQ_INT(set_state(s, ids[3], JOB_STATE_RUNNING, 0), DDPD_OK);
    q = (struct store_job_query){.states = JOB_STATE_BIT(JOB_STATE_RUNNING)};
    CHECK_EQ_INT(store_job_list(s, &q, &l, &e), DDPD_OK);
    CHECK(l.n == 1 && l.jobs[0].id == ids[3] && l.next == 0);
    store_job_list_free(&l);
    q = (struct store_job_query){.states = JOB_STATES_FINAL, .with_spec = true};
    CHECK_EQ_INT(store_job_list(s, &q, &l, &e), DDPD_OK);
    CHECK(l.n == 2 && l.jobs[0].id == ids[2] && l.jobs[1].id == ids[1]);
    CHECK(l.n == 2 && l.jobs[0].spec && strcmp(l.jobs[0].spec, SPEC) == 0);
    store_job_list_free(&l);
    q = (struct store_job_query){.states = JOB_STATE_BIT(JOB_STATE_QUEUED), .limit = 20, .before = ids[10]};
    CHECK_EQ_INT(store_job_list(s, &q, &l, &e), DDPD_OK);
    CHECK_EQ_INT(l.n, 6); /* ids[4..9] */
    CHECK(l.n == 6 && l.jobs[0].id == ids[9] && l.jobs[5].id == ids[4] && l.next == 0);
    store_job_list_free(&l);
    q = (struct store_job_query){.states = JOB_STATES_ACTIVE, .with_ranks = true};
    CHECK_EQ_INT(store_job_list(s, &q, &l, &e), DDPD_OK);
    CHECK(l.n == 2 && l.jobs[0].id == ids[3] && l.jobs[1].id == ids[0]);
    store_job_list_free(&l);

    int64_t counts[JOB_STATE_COUNT];
    CHECK_EQ_INT(store_job_count(s, counts, &e), DDPD_OK);
    CHECK_EQ_INT(counts[JOB_STATE_QUEUED], 21);
    CHECK_EQ_INT(counts[JOB_STATE_STARTING], 1);
    CHECK_EQ_INT(counts[JOB_STATE_RUNNING], 1);
    CHECK_EQ_INT(counts[JOB_STATE_SUCCEEDED], 1);
    CHECK_EQ_INT(counts[JOB_STATE_CANCELLED], 1);
    CHECK_EQ_INT(counts[JOB_STATE_FAILED], 0);

    job_state js;
    CHECK(job_state_parse("cancelled", &js) && js == JOB_STATE_CANCELLED);
    CHECK(!job_state_parse("Cancelled", &js));
    CHECK_EQ_STR(job_state_name(JOB_STATE_RUNNING), "running");
    store_close(s);
}

/* ---- events ---- */

struct collect {
    int n;
    int64_t seq[64];
    char body[64][EVENT_LINE_MAX];
    int rank[64];
    event_kind kind[64];
};

static bool collect_fn(void *ctx, const struct store_event_row *row)
{
    struct collect *c = ctx;
    if (c->n < 64) {
        c->seq[c->n] = row->seq;
        snprintf(c->body[c->n], EVENT_LINE_MAX, "%s", row->body);
        c->rank[c->n] = row->rank;
        c->kind[c->n] = row->kind;
        CHECK_EQ_INT(row->len, strlen(row->body));
    }
    c->n++;
    return true;
}

static void test_events(void)
{
    char path[700];
    struct ddpd_error e;
    db_path(path, sizeof path, "events.db");
    struct store *s = open_ok(path, NULL);
    if (!s)
        return;
    int64_t job = insert_job(s, "ev", 2);
    struct store_job_update u = {
        .fields = STORE_SET_STATE | STORE_SET_ATTEMPT, .state = JOB_STATE_RUNNING, .attempt = 1};
    CHECK_EQ_INT(store_job_update(s, job, &u, NULL, &e), DDPD_OK);
    for (int r = 0; r < 2; r++) {
        struct store_rank rk = {.attempt = 1, .rank = r, .pid = 50 + r, .state = "running"};
        CHECK_EQ_INT(store_rank_put(s, job, &rk, &e), DDPD_OK);
    }
    char bodies[12][EVENT_LINE_MAX];
    struct event ev;
    int64_t seq = 0;
    make_event(&ev, bodies[seq], EVENT_LINE_MAX, job, seq + 1, 1, EVENT_STATE, -1, 0, 0);
    CHECK_EQ_INT(store_event_append(s, &ev, bodies[seq], strlen(bodies[seq]), &e), DDPD_OK);
    seq++;
    for (int r = 0; r < 2; r++, seq++) {
        make_event(&ev, bodies[seq], EVENT_LINE_MAX, job, seq + 1, 1, EVENT_START, r, 0, 0);
        CHECK_EQ_INT(store_event_append(s, &ev, bodies[seq], strlen(bodies[seq]), &e), DDPD_OK);
    }
    for (int step = 1; step <= 4; step++)
        for (int r = 0; r < 2; r++, seq++) {
            double loss = step == 4 && r == 1 ? NAN : 1.0 / step + r;
            make_event(&ev, bodies[seq], EVENT_LINE_MAX, job, seq + 1, 1, EVENT_LOSS, r, step, loss);
            /* the body NULL path: the store encodes the event itself */
            CHECK_EQ_INT(store_event_append(s, &ev, r ? bodies[seq] : NULL, r ? strlen(bodies[seq]) : 0, &e),
                         DDPD_OK);
        }
    CHECK_EQ_INT(seq, 11);
    CHECK_EQ_INT(flush(s), DDPD_OK);

    struct collect *c = calloc(1, sizeof *c);
    size_t count = 0;
    CHECK_EQ_INT(store_events_read(s, job, 0, 0, collect_fn, c, &count, &e), DDPD_OK);
    CHECK_EQ_INT(count, 11);
    CHECK_EQ_INT(c->n, 11);
    for (int i = 0; i < c->n && i < 11; i++) {
        CHECK_EQ_INT(c->seq[i], i + 1);
        CHECK_EQ_STR(c->body[i], bodies[i]);
    }
    CHECK(c->kind[0] == EVENT_STATE && c->rank[0] == -1);
    CHECK(c->kind[2] == EVENT_START && c->rank[2] == 1);
    CHECK(c->kind[10] == EVENT_LOSS && c->rank[10] == 1);
    CHECK(strstr(c->body[9], "\"seq\":10") != NULL);
    memset(c, 0, sizeof *c);
    CHECK_EQ_INT(store_events_read(s, job, 5, 3, collect_fn, c, &count, &e), DDPD_OK);
    CHECK(count == 3 && c->seq[0] == 6 && c->seq[2] == 8);
    memset(c, 0, sizeof *c);
    CHECK_EQ_INT(store_events_read(s, job, 11, 0, collect_fn, c, &count, &e), DDPD_OK);
    CHECK_EQ_INT(count, 0);
    CHECK_EQ_INT(store_events_read(s, 424242, 0, 0, collect_fn, c, &count, &e), DDPD_OK);
    CHECK_EQ_INT(count, 0);
    free(c);
    int64_t max = -1;
    CHECK_EQ_INT(store_event_max_seq(s, job, &max, &e), DDPD_OK);
    CHECK_EQ_INT(max, 11);
    CHECK_EQ_INT(store_event_max_seq(s, 424242, &max, &e), DDPD_OK);
    CHECK_EQ_INT(max, 0);

    /* progress: the job's latest step and mean loss (NaN on rank 1 at step 4), ranks' own */
    struct store_job j;
    CHECK_EQ_INT(store_job_get(s, job, &j, &e), DDPD_OK);
    CHECK(j.has_progress);
    CHECK_EQ_INT(j.step, 4);
    CHECK(!j.loss_finite);
    CHECK(j.n_ranks == 2 && j.ranks[0].has_progress && j.ranks[0].step == 4);
    CHECK(j.n_ranks == 2 && j.ranks[0].loss_finite);
    CHECK_NEAR(j.n_ranks == 2 ? j.ranks[0].loss : 0, 0.25, 1e-12, 0);
    CHECK_NEAR(j.n_ranks == 2 ? j.ranks[0].samples_per_s : 0, 1000.0, 1e-9, 0);
    CHECK(j.n_ranks == 2 && j.ranks[1].step == 4 && !j.ranks[1].loss_finite);
    store_job_clear(&j);
    CHECK(append(s, job, 12, 1, EVENT_LOSS, 0, 5, 0.5) == DDPD_OK);
    CHECK(append(s, job, 13, 1, EVENT_LOSS, 1, 5, 1.5) == DDPD_OK);
    CHECK(append(s, job, 14, 1, EVENT_LOSS, 1, 3, 9.0) == DDPD_OK); /* late and old: ignored */
    CHECK_EQ_INT(flush(s), DDPD_OK);
    CHECK_EQ_INT(store_job_get(s, job, &j, &e), DDPD_OK);
    CHECK_EQ_INT(j.step, 5);
    CHECK(j.loss_finite);
    CHECK_NEAR(j.loss, 1.0, 1e-12, 0);
    CHECK(j.n_ranks == 2 && j.ranks[1].step == 5);
    store_job_clear(&j);
    CHECK_EQ_INT(raw_query(path, "SELECT count(*) FROM loss", NULL, 0), 10);
    CHECK_EQ_INT(raw_query(path, "SELECT loss FROM loss WHERE step = 3 AND rank = 1", NULL, 0), 9);

    /* refused rows: an unknown job, a seq taken; the rest of the batch goes in */
    CHECK(append(s, 424242, 1, 1, EVENT_LOSS, 0, 1, 1.0) == DDPD_OK);
    CHECK(append(s, job, 14, 1, EVENT_LOSS, 0, 6, 1.0) == DDPD_OK);
    CHECK(append(s, job, 15, 1, EVENT_LOSS, 0, 6, 1.0) == DDPD_OK);
    ddpd_error_clear(&e);
    CHECK_EQ_INT(store_flush(s, &e), DDPD_ECONFLICT);
    CHECK(strstr(e.message, "refused") != NULL);
    CHECK_EQ_INT(store_flush(s, &e), DDPD_OK); /* reported once */
    CHECK_EQ_INT(store_event_max_seq(s, job, &max, &e), DDPD_OK);
    CHECK_EQ_INT(max, 15);
    struct store_stats stats;
    store_stats_get(s, &stats);
    CHECK_EQ_INT(stats.events_appended, 17);
    CHECK_EQ_INT(stats.events_committed, 15);
    CHECK_EQ_INT(stats.events_dropped, 2);
    CHECK_EQ_INT(stats.queued, 0);

    /* what append refuses at once */
    make_event(&ev, NULL, 0, job, 16, 1, EVENT_LOSS, 0, 7, 1.0);
    ev.has_server_fields = false;
    CHECK_EQ_INT(store_event_append(s, &ev, NULL, 0, &e), DDPD_EINTERNAL);
    ev.has_server_fields = true;
    static char huge[EVENT_LINE_MAX + 10];
    memset(huge, 'x', sizeof huge);
    CHECK_EQ_INT(store_event_append(s, &ev, huge, sizeof huge, &e), DDPD_ETOOBIG);
    store_close(s);
}

/* A database locked by another connection: synchronous writes report DDPD_EBUSY after
 * busy_timeout; the event writer retries and gets through once the lock goes; a stalled
 * writer fills the queue and append reports DDPD_EBUSY after append_wait_ms. */
/* store_job_insert_async: every insert's callback runs once with its own id, ids in the
 * order of the calls; queued_event stores the job's queued event (seq 1) with it; a bad
 * insert fails alone; store_close commits what is still queued before it returns. */
struct async_seen {
    pthread_mutex_t mu;
    int n, failed;
    int64_t id[200];
    double created[200];
    int order[200]; /* callback order: index of the call */
};

struct async_call {
    struct async_seen *seen;
    int i;
};

static void async_done(void *ctx, ddpd_err rc, const struct store_job *j, const struct ddpd_error *err)
{
    struct async_call *c = ctx;
    struct async_seen *a = c->seen;
    pthread_mutex_lock(&a->mu);
    if (rc != DDPD_OK) {
        CHECK(err != NULL && err->message[0]);
        CHECK(j == NULL);
        a->failed++;
        a->id[c->i] = -1;
    } else {
        /* the row as stored: what store_job_get reads back */
        CHECK_EQ_STR(j->name, "async");
        CHECK_EQ_INT(j->state, JOB_STATE_QUEUED);
        CHECK_EQ_INT(j->world_size, 1);
        CHECK_EQ_INT(j->attempt, 0);
        CHECK_EQ_INT(j->total_steps, 40 + c->i);
        CHECK(j->spec && strcmp(j->spec, SPEC) == 0);
        a->id[c->i] = j->id;
        a->created[c->i] = j->created_at;
    }
    a->order[a->n++] = c->i;
    pthread_mutex_unlock(&a->mu);
}

static void test_insert_async(void)
{
    char path[700];
    struct ddpd_error e;
    db_path(path, sizeof path, "async.db");
    struct store *s = open_ok(path, NULL);
    if (!s)
        return;
    static struct async_seen seen = {.mu = PTHREAD_MUTEX_INITIALIZER};
    static struct async_call calls[200];
    const int n = 200, bad = 77;
    for (int i = 0; i < n; i++) {
        calls[i] = (struct async_call){&seen, i};
        struct store_job_new j = {.name = "async",
                                  .spec = i == bad ? "{not json" : SPEC,
                                  .world_size = 1,
                                  .device = DEVICE_CPU,
                                  .total_steps = 40 + i,
                                  .queued_event = i % 2 == 0};
        store_job_insert_async(s, &j, async_done, &calls[i]);
    }
    store_close(s); /* commits the queued inserts first */
    CHECK_EQ_INT(seen.n, n);
    CHECK_EQ_INT(seen.failed, 1);
    CHECK_EQ_INT(seen.id[bad], -1);
    for (int k = 0; k < n; k++)
        CHECK_EQ_INT(seen.order[k], k); /* callbacks in the order of the calls */
    int64_t prev = 0;
    for (int i = 0; i < n; i++) {
        if (i == bad)
            continue;
        CHECK(seen.id[i] > prev);
        prev = seen.id[i];
    }

    s = open_ok(path, NULL);
    if (!s)
        return;
    struct store_job back;
    CHECK_EQ_INT(store_job_get(s, seen.id[3], &back, &e), DDPD_OK); /* the row the callback had */
    CHECK_EQ_INT(back.total_steps, 43);
    CHECK(back.created_at == seen.created[3]);
    CHECK_EQ_INT(back.state, JOB_STATE_QUEUED);
    store_job_clear(&back);
    struct collect *c = calloc(1, sizeof *c);
    for (int i = 0; i < n; i += 25) {
        if (i == bad)
            continue;
        memset(c, 0, sizeof *c);
        size_t count = 0;
        CHECK_EQ_INT(store_events_read(s, seen.id[i], 0, 0, collect_fn, c, &count, &e), DDPD_OK);
        if (i % 2) {
            CHECK_EQ_INT(count, 0);
            continue;
        }
        CHECK_EQ_INT(count, 1);
        CHECK_EQ_INT(c->seq[0], 1);
        CHECK_EQ_INT(c->kind[0], EVENT_STATE);
        CHECK_EQ_INT(c->rank[0], -1);
        struct event want;
        char body[EVENT_LINE_MAX];
        store_job_queued_event(seen.id[i], seen.created[i], &want);
        CHECK(event_encode(&want, body, sizeof body) > 0);
        CHECK_EQ_STR(c->body[0], body);
        CHECK(strstr(c->body[0], "\"state\":\"queued\"") != NULL);
        int64_t max = 0;
        CHECK_EQ_INT(store_event_max_seq(s, seen.id[i], &max, &e), DDPD_OK);
        CHECK_EQ_INT(max, 1);
    }
    free(c);
    store_close(s);
}

static void test_busy(void)
{
    char path[700];
    struct ddpd_error e;
    db_path(path, sizeof path, "busy.db");
    struct store_opts o = {
        .busy_timeout_ms = 100, .batch_max = 10, .queue_max = 10, .append_wait_ms = 50, .linger_ms = 1};
    struct store *s = open_ok(path, &o);
    if (!s)
        return;
    int64_t job = insert_job(s, "busy", 1);
    sqlite3 *db = NULL;
    CHECK_EQ_INT(sqlite3_open(path, &db), SQLITE_OK);
    CHECK_EQ_INT(sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL), SQLITE_OK);
    struct store_job_new nj = {.name = "x", .spec = SPEC, .world_size = 1};
    int64_t id;
    ddpd_error_clear(&e);
    CHECK_EQ_INT(store_job_insert(s, &nj, &id, NULL, &e), DDPD_EBUSY);
    CHECK(strstr(e.message, "insert job") != NULL);
    CHECK_EQ_INT(set_state(s, job, JOB_STATE_RUNNING, 0), DDPD_EBUSY);
    /* reads go on */
    struct store_job j;
    CHECK_EQ_INT(store_job_get(s, job, &j, &e), DDPD_OK);
    store_job_clear(&j);

    int seq = 0, rejected = 0;
    for (int i = 0; i < 40; i++) {
        ddpd_err rc = append(s, job, seq + 1, 1, EVENT_LOSS, 0, seq + 1, 1.0);
        if (rc == DDPD_OK)
            seq++;
        else if (rc == DDPD_EBUSY)
            rejected++;
    }
    CHECK(seq >= 10);
    CHECK(rejected > 0);
    struct store_stats st;
    store_stats_get(s, &st);
    CHECK_EQ_INT(st.events_rejected, rejected);
    CHECK_EQ_INT(sqlite3_exec(db, "COMMIT", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
    /* Batches that used up their retries while the lock was held are dropped and
     * reported; once it is gone, events go in again. */
    ddpd_err rc = flush(s);
    CHECK(rc == DDPD_OK || rc == DDPD_EBUSY);
    store_stats_get(s, &st);
    CHECK_EQ_INT(st.events_committed + st.events_dropped, seq);
    seq++;
    CHECK(append(s, job, seq, 1, EVENT_LOSS, 0, seq, 1.0) == DDPD_OK);
    CHECK_EQ_INT(flush(s), DDPD_OK);
    int64_t max = 0;
    CHECK_EQ_INT(store_event_max_seq(s, job, &max, &e), DDPD_OK);
    CHECK_EQ_INT(max, seq);
    CHECK_EQ_INT(store_job_insert(s, &nj, &id, NULL, &e), DDPD_OK);
    store_close(s);
}

/* ---- ingest rate ---- */

#define INGEST_RANKS 4
#define INGEST_STEPS (SANITIZED ? 5000 : 25000) /* 100k loss events (20k sanitized) */

/* The same rows with a bare batched prepared insert (the benchmark's baseline). */
static double raw_ingest(const char *path, char (*bodies)[256], int n)
{
    sqlite3 *db = NULL;
    sqlite3_stmt *ev = NULL, *ls = NULL;
    CHECK_EQ_INT(sqlite3_open(path, &db), SQLITE_OK);
    CHECK_EQ_INT(sqlite3_exec(db,
                              "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; "
                              "PRAGMA foreign_keys = ON;",
                              NULL, NULL, NULL),
                 SQLITE_OK);
    CHECK_EQ_INT(sqlite3_exec(db, store_migration_sql(1, NULL), NULL, NULL, NULL), SQLITE_OK);
    CHECK_EQ_INT(sqlite3_exec(db,
                              "INSERT INTO jobs (name, state, spec, world_size, device, "
                              "created_at) VALUES ('raw', 'running', '{}', 4, 'cpu', 0)",
                              NULL, NULL, NULL),
                 SQLITE_OK);
    sqlite3_prepare_v2(db,
                       "INSERT INTO events (job, seq, attempt, kind, rank, body, ts) "
                       "VALUES (1, ?1, 1, 'loss', ?2, ?3, ?4)",
                       -1, &ev, NULL);
    sqlite3_prepare_v2(db,
                       "INSERT OR REPLACE INTO loss (job, step, rank, loss) "
                       "VALUES (1, ?1, ?2, ?3)",
                       -1, &ls, NULL);
    double t0 = base_mono_s();
    for (int i = 0; i < n; i++) {
        if (i % 1000 == 0)
            sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL);
        sqlite3_bind_int64(ev, 1, i + 1);
        sqlite3_bind_int(ev, 2, i % INGEST_RANKS);
        sqlite3_bind_text(ev, 3, bodies[i], -1, SQLITE_STATIC);
        sqlite3_bind_double(ev, 4, 1.0 + i);
        CHECK(sqlite3_step(ev) == SQLITE_DONE);
        sqlite3_reset(ev);
        sqlite3_bind_int64(ls, 1, i / INGEST_RANKS + 1);
        sqlite3_bind_int(ls, 2, i % INGEST_RANKS);
        sqlite3_bind_double(ls, 3, 1.0 / (i + 1));
        CHECK(sqlite3_step(ls) == SQLITE_DONE);
        sqlite3_reset(ls);
        if (i % 1000 == 999 || i == n - 1)
            sqlite3_exec(db, "COMMIT", NULL, NULL, NULL);
    }
    double dt = base_mono_s() - t0;
    sqlite3_finalize(ev);
    sqlite3_finalize(ls);
    sqlite3_close(db);
    return dt;
}

static void test_ingest_rate(void)
{
    char path[700], rawpath[700];
    struct ddpd_error e;
    db_path(path, sizeof path, "ingest.db");
    db_path(rawpath, sizeof rawpath, "ingest-raw.db");
    int n = INGEST_RANKS * INGEST_STEPS;
    char(*bodies)[256] = malloc((size_t)n * 256);
    struct event ev;
    struct store *s = open_ok(path, NULL);
    if (!s || !bodies)
        goto out;
    int64_t job = insert_job(s, "ingest", INGEST_RANKS);
    /* The bodies are encoded beforehand, as the hub does before it hands them over. */
    for (int i = 0; i < n; i++) {
        int len = make_event(&ev, bodies[i], 256, job, i + 1, 1, EVENT_LOSS, i % INGEST_RANKS,
                             i / INGEST_RANKS + 1, 1.0 / (i + 1));
        CHECK(len > 0 && len < 256);
    }
    double t0 = base_mono_s();
    int bad = 0;
    for (int i = 0; i < n; i++) {
        ev.seq = i + 1;
        ev.rank = i % INGEST_RANKS;
        ev.step = i / INGEST_RANKS + 1;
        ev.loss = 1.0 / (i + 1);
        if (store_event_append(s, &ev, bodies[i], strlen(bodies[i]), &e) != DDPD_OK)
            bad++;
    }
    CHECK_EQ_INT(flush(s), DDPD_OK);
    double dt = base_mono_s() - t0;
    CHECK_EQ_INT(bad, 0);
    struct store_stats st;
    store_stats_get(s, &st);
    CHECK_EQ_INT(st.events_committed, n);
    int64_t max = 0;
    CHECK_EQ_INT(store_event_max_seq(s, job, &max, &e), DDPD_OK);
    CHECK_EQ_INT(max, n);
    store_close(s);
    s = NULL;
    CHECK_EQ_INT(raw_query(path, "SELECT count(*) FROM loss", NULL, 0), n);
    double raw = raw_ingest(rawpath, bodies, n);
    fprintf(stderr,
            "ingest: %d loss events in %.3f s = %.0f events/s (%llu batches); raw batched "
            "insert of the same rows %.3f s = %.0f rows/s; ratio %.2f\n",
            n, dt, n / dt, (unsigned long long)st.batches, raw, n / raw, raw / dt);
    CHECK(dt < (SANITIZED ? 60.0 : 20.0)); /* "a few seconds", on a busy shared machine */
out:
    store_close(s);
    free(bodies);
}

/* ---- metrics ---- */

static double curve(int64_t step, int rank)
{
    return 1.0 + 0.5 * sin((double)step * 0.01) + 0.01 * rank;
}

static void test_metrics(void)
{
    char path[700];
    struct ddpd_error e;
    db_path(path, sizeof path, "metrics.db");
    struct store *s = open_ok(path, NULL);
    if (!s)
        return;
    int64_t job = insert_job(s, "m", 3);
    const int steps = SANITIZED ? 5000 : 10000, W = 3;
    const int64_t min_step = 4321, max_step = 777, nan_step = 4500;
    int64_t seq = 0;
    for (int64_t step = 1; step <= steps; step++)
        for (int r = 0; r < W; r++) {
            double v = curve(step, r);
            if (step == min_step && r == 1)
                v = -5.0; /* the global minimum, one rank only */
            if (step == max_step && r == 2)
                v = 50.0;
            if (step == nan_step && r == 0)
                v = NAN;
            CHECK(append(s, job, ++seq, 1, EVENT_LOSS, r, step, v) == DDPD_OK);
        }
    CHECK_EQ_INT(flush(s), DDPD_OK);

    struct store_metrics m;
    CHECK_EQ_INT(store_metrics_get(s, job, 100, &m, &e), DDPD_OK);
    CHECK_EQ_INT(m.n_series, 1 + W);
    CHECK_EQ_INT(m.first_step, 1);
    CHECK_EQ_INT(m.last_step, steps);
    CHECK_EQ_INT(m.points, (int64_t)steps * W - 1);
    for (size_t i = 0; i < m.n_series; i++) {
        struct store_series *sr = &m.series[i];
        CHECK_EQ_INT(sr->rank, (int)i - 1);
        CHECK(sr->n <= 100 && sr->n >= 50);
        CHECK(sr->n > 0 && sr->step[0] == 1 && sr->step[sr->n - 1] == steps);
        double lo = INFINITY, hi = -INFINITY;
        bool ascending = true, exact = true;
        for (size_t k = 0; k < sr->n; k++) {
            if (k && sr->step[k] <= sr->step[k - 1])
                ascending = false;
            lo = fmin(lo, sr->loss[k]);
            hi = fmax(hi, sr->loss[k]);
            if (sr->rank >= 0 && sr->step[k] != min_step && sr->step[k] != max_step &&
                fabs(sr->loss[k] - curve(sr->step[k], sr->rank)) > 1e-12)
                exact = false; /* every kept point is a real point */
        }
        CHECK(ascending);
        CHECK(exact);
        if (sr->rank == 1)
            CHECK_NEAR(lo, -5.0, 0, 0);
        if (sr->rank == 2)
            CHECK_NEAR(hi, 50.0, 0, 0);
        if (sr->rank == -1) { /* the mean keeps the spikes, diluted over the ranks */
            CHECK_NEAR(lo, (curve(min_step, 0) - 5.0 + curve(min_step, 2)) / 3, 1e-12, 0);
            CHECK_NEAR(hi, (curve(max_step, 0) + curve(max_step, 1) + 50.0) / 3, 1e-12, 0);
        }
    }
    store_metrics_free(&m);
    store_metrics_free(NULL);

    /* max_points above the step range: every point, exactly; the NaN step's mean skips it */
    CHECK_EQ_INT(store_metrics_get(s, job, 20000, &m, &e), DDPD_OK);
    CHECK(m.n_series == 4 && m.series[0].n == (size_t)steps && m.series[1].n == (size_t)steps - 1);
    if (m.n_series == 4 && m.series[0].n == (size_t)steps) {
        CHECK_NEAR(m.series[0].loss[0], (curve(1, 0) + curve(1, 1) + curve(1, 2)) / 3, 1e-12, 0);
        CHECK_NEAR(m.series[0].loss[nan_step - 1], (curve(nan_step, 1) + curve(nan_step, 2)) / 2, 1e-12, 0);
    }
    store_metrics_free(&m);

    /* tiny and huge max_points are clamped; every max_points is a bound, also below 4
     * (2: the first and last step; 3: the minimum between them) */
    CHECK_EQ_INT(store_metrics_get(s, job, 1, &m, &e), DDPD_OK);
    for (size_t i = 0; i < m.n_series; i++)
        CHECK_EQ_INT(m.series[i].n, 2);
    store_metrics_free(&m);
    for (int mp = 2; mp <= 9; mp++) {
        CHECK_EQ_INT(store_metrics_get(s, job, mp, &m, &e), DDPD_OK);
        for (size_t i = 0; i < m.n_series; i++) {
            const struct store_series *sr = &m.series[i];
            CHECK(sr->n <= (size_t)mp && sr->n >= 2);
            if (sr->n >= 2) {
                CHECK_EQ_INT(sr->step[0], 1);
                CHECK_EQ_INT(sr->step[sr->n - 1], steps);
            }
            if (mp == 3 && sr->rank == 1)
                CHECK(sr->n == 3 && sr->loss[1] == -5.0);
        }
        store_metrics_free(&m);
    }

    /* sparse steps (log_every 10) fewer than max_points: all kept */
    int64_t job2 = insert_job(s, "sparse", 1);
    for (int i = 1; i <= 200; i++)
        CHECK(append(s, job2, i, 1, EVENT_LOSS, 0, 10 * i, 1.0 / i) == DDPD_OK);
    CHECK_EQ_INT(flush(s), DDPD_OK);
    CHECK_EQ_INT(store_metrics_get(s, job2, 400, &m, &e), DDPD_OK);
    CHECK(m.n_series == 2 && m.series[0].n == 200 && m.series[1].n == 200);
    store_metrics_free(&m);

    CHECK_EQ_INT(store_metrics_get(s, 424242, 100, &m, &e), DDPD_OK);
    CHECK_EQ_INT(m.n_series, 0);
    store_metrics_free(&m);

    /* a million rows (written straight into the series): streamed, timed */
    const long long big = SANITIZED ? 200000 : 1000000;
    int64_t job3 = insert_job(s, "big", 4);
    sqlite3 *db = NULL;
    char sql[400];
    snprintf(sql, sizeof sql,
             "WITH RECURSIVE c(x) AS (SELECT 0 UNION ALL SELECT x + 1 FROM c WHERE x < %lld) "
             "INSERT INTO loss (job, step, rank, loss) SELECT %lld, x / 4 + 1, x %% 4, "
             "1.0 + 0.5 * sin((x / 4 + 1) * 0.01) + 0.01 * (x %% 4) FROM c",
             big - 1, (long long)job3);
    CHECK_EQ_INT(sqlite3_open(path, &db), SQLITE_OK);
    CHECK_EQ_INT(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
    double t0 = base_mono_s();
    CHECK_EQ_INT(store_metrics_get(s, job3, 1000, &m, &e), DDPD_OK);
    double dt = base_mono_s() - t0;
    CHECK(m.n_series == 5 && m.series[0].n <= 1000 && m.series[4].n <= 1000);
    CHECK(m.n_series == 5 && m.series[0].step[m.series[0].n - 1] == big / 4);
    CHECK_EQ_INT(m.points, big);
    fprintf(stderr, "metrics: %lld loss rows downsampled to %zu points per series in %.3f s\n", big,
            m.n_series ? m.series[0].n : 0, dt);
    store_metrics_free(&m);
    store_close(s);
}

/* ---- readers beside the writer ---- */

struct conc {
    struct store *s;
    int64_t job;
    int target;
    int errors;
    int reads;
    _Atomic int done;
};

static bool count_fn(void *ctx, const struct store_event_row *row)
{
    int64_t *expect = ctx;
    if (row->seq != *expect + 1)
        return false;
    *expect = row->seq;
    return true;
}

static void *reader_main(void *arg)
{
    struct conc *c = arg;
    struct ddpd_error e;
    int errors = 0, reads = 0;
    int64_t last_max = 0;
    while (!c->done) {
        int64_t max = 0, expect = 0;
        size_t n = 0;
        if (store_event_max_seq(c->s, c->job, &max, &e) != DDPD_OK || max < last_max)
            errors++;
        last_max = max;
        /* a page from a random point: contiguous seqs */
        int64_t after = max > 500 ? max - 500 : 0;
        expect = after;
        if (store_events_read(c->s, c->job, after, 1000, count_fn, &expect, &n, &e) != DDPD_OK ||
            expect < max)
            errors++;
        struct store_job j;
        if (store_job_get(c->s, c->job, &j, &e) != DDPD_OK)
            errors++;
        store_job_clear(&j);
        struct store_job_list l;
        struct store_job_query q = {.limit = 5};
        if (store_job_list(c->s, &q, &l, &e) != DDPD_OK || l.n == 0)
            errors++;
        store_job_list_free(&l);
        struct store_metrics m;
        if (store_metrics_get(c->s, c->job, 200, &m, &e) != DDPD_OK)
            errors++;
        store_metrics_free(&m);
        reads += 5;
    }
    __atomic_add_fetch(&c->errors, errors, __ATOMIC_RELAXED);
    __atomic_add_fetch(&c->reads, reads, __ATOMIC_RELAXED);
    return NULL;
}

static void *appender_main(void *arg)
{
    struct conc *c = arg;
    for (int i = 1; i <= c->target; i++)
        if (append(c->s, c->job, i, 1, EVENT_LOSS, i % 2, (i + 1) / 2, 1.0 / i) != DDPD_OK)
            __atomic_add_fetch(&c->errors, 1, __ATOMIC_RELAXED);
    return NULL;
}

static void *inserter_main(void *arg)
{
    struct conc *c = arg;
    struct ddpd_error e;
    for (int i = 0; i < 200; i++) {
        struct store_job_new j = {.name = "side", .spec = SPEC, .world_size = 1};
        int64_t id;
        if (store_job_insert(c->s, &j, &id, NULL, &e) != DDPD_OK ||
            set_state(c->s, id, JOB_STATE_RUNNING, 0) != DDPD_OK)
            __atomic_add_fetch(&c->errors, 1, __ATOMIC_RELAXED);
    }
    return NULL;
}

/* An event of any kind with its server fields, stored as event_encode writes it. */
static ddpd_err append_ev(struct store *s, struct event *ev, int64_t job, int64_t seq, int attempt)
{
    char body[EVENT_LINE_MAX];
    struct ddpd_error e;
    ev->has_server_fields = true;
    ev->job = job;
    ev->seq = seq;
    ev->attempt = attempt;
    ev->ts = 1.0;
    int n = event_encode(ev, body, sizeof body);
    CHECK(n > 0);
    return store_event_append(s, ev, body, (size_t)n, &e);
}

/* §2a in /metrics: the lr, grad_norm and time series from rank 0's loss events and every
 * eval event; a restart's rerun of steps replaces the eval points from its first step on.
 * The job's final and best eval metrics that the writer keeps. */
static void test_metrics_eval_lr(void)
{
    char path[700];
    struct ddpd_error e;
    db_path(path, sizeof path, "metrics-eval.db");
    struct store *s = open_ok(path, NULL);
    if (!s)
        return;
    int64_t job = insert_job(s, "eval", 2), seq = 0;
    for (int attempt = 1; attempt <= 2; attempt++)
        for (int64_t step = attempt == 1 ? 1 : 7; step <= (attempt == 1 ? 10 : 12); step++) {
            for (int r = 0; r < 2; r++) {
                struct event ev = {.kind = EVENT_LOSS, .rank = r, .step = step, .loss = 1.0 / (double)step};
                ev.lr = 0.01 * (double)step + (attempt == 2 ? 1 : 0); /* the rerun's values win */
                ev.has_lr = true;
                ev.grad_norm = 0.5 * (double)step + (attempt == 2 ? 1 : 0);
                ev.has_grad_norm = r == 0 || step > 2; /* rank 0's are the series */
                CHECK_EQ_INT(append_ev(s, &ev, job, ++seq, attempt), DDPD_OK);
            }
            if (step % 4 == 0 || step == 12) {
                struct event ev = {.kind = EVENT_EVAL, .rank = 0, .step = step, .samples = 100};
                ev.loss = step == 8 && attempt == 1 ? NAN : 2.0 / (double)step;
                ev.nonfinite = !isfinite(ev.loss);
                ev.accuracy = 0.5 + 0.01 * (double)step + (attempt == 2 ? 0.1 : 0);
                ev.has_accuracy = true;
                CHECK_EQ_INT(append_ev(s, &ev, job, ++seq, attempt), DDPD_OK);
            }
        }
    CHECK_EQ_INT(flush(s), DDPD_OK);
    struct store_metrics m;
    CHECK_EQ_INT(store_metrics_get(s, job, 1000, &m, &e), DDPD_OK);
    /* eval: 4 and 8 of attempt 1 were replaced from step 8 on by attempt 2's 8 and 12 */
    CHECK_EQ_INT((int64_t)m.n_eval, 3);
    if (m.n_eval == 3) {
        CHECK(m.eval[0].step == 4 && m.eval[1].step == 8 && m.eval[2].step == 12);
        CHECK_NEAR(m.eval[0].accuracy, 0.54, 1e-15, 0);
        CHECK_NEAR(m.eval[1].accuracy, 0.68, 1e-15, 0);
        CHECK(isfinite(m.eval[1].loss) && m.eval[1].has_accuracy && m.eval[2].samples == 100);
    }
    /* lr: steps 1..12, the rerun's values from step 7 on */
    CHECK_EQ_INT((int64_t)m.lr.n, 12);
    if (m.lr.n == 12) {
        CHECK(m.lr.step[0] == 1 && m.lr.step[11] == 12);
        CHECK_NEAR(m.lr.loss[0], 0.01, 1e-15, 0);
        CHECK_NEAR(m.lr.loss[5], 0.06, 1e-15, 0);
        CHECK_NEAR(m.lr.loss[6], 1.07, 1e-12, 0);
        CHECK_NEAR(m.lr.loss[9], 1.10, 1e-12, 0);
        CHECK_NEAR(m.lr.loss[11], 1.12, 1e-12, 0);
    }
    /* grad_norm like the lr; time: every event's ts (1.0 here) */
    CHECK_EQ_INT((int64_t)m.grad_norm.n, 12);
    if (m.grad_norm.n == 12) {
        CHECK_NEAR(m.grad_norm.loss[0], 0.5, 1e-15, 0);
        CHECK_NEAR(m.grad_norm.loss[11], 7.0, 1e-12, 0);
    }
    CHECK_EQ_INT((int64_t)m.time.n, 12);
    CHECK(m.time.n == 12 && m.time.loss[0] == 1.0 && m.time.loss[11] == 1.0);
    /* The job's final and best eval (kept by the writer): the final is the highest step's
     * (attempt 2's 12); the best loss the lowest finite one (step 8's NaN left out), the best
     * accuracy the highest, over every eval event stored. */
    struct store_job jj;
    CHECK_EQ_INT(store_job_get(s, job, &jj, &e), DDPD_OK);
    const struct store_job_evals *ev = &jj.evals;
    CHECK(ev->has_final && ev->final_step == 12 && ev->has_loss && ev->has_accuracy);
    CHECK_NEAR(ev->final_loss, 2.0 / 12, 1e-15, 0);
    CHECK_NEAR(ev->final_accuracy, 0.72, 1e-15, 0);
    CHECK(ev->has_best_loss && ev->best_loss_step == 12 && ev->has_best_accuracy &&
          ev->best_accuracy_step == 12);
    CHECK_NEAR(ev->best_loss, 2.0 / 12, 1e-15, 0);
    CHECK_NEAR(ev->best_accuracy, 0.72, 1e-15, 0);
    store_job_clear(&jj);
    store_metrics_free(&m);
    CHECK(m.lr.n == 0 && m.n_eval == 0 && !m.eval);
    /* thinned to max_points, keeping the last */
    int64_t job2 = insert_job(s, "many-evals", 1);
    seq = 0;
    for (int64_t step = 1; step <= 50; step++) {
        struct event ev = {.kind = EVENT_LOSS, .rank = 0, .step = step, .loss = 1};
        CHECK_EQ_INT(append_ev(s, &ev, job2, ++seq, 1), DDPD_OK);
        struct event ev2 = {.kind = EVENT_EVAL, .rank = 0, .step = step, .loss = 1, .samples = 1};
        CHECK_EQ_INT(append_ev(s, &ev2, job2, ++seq, 1), DDPD_OK);
    }
    CHECK_EQ_INT(flush(s), DDPD_OK);
    CHECK_EQ_INT(store_metrics_get(s, job2, 10, &m, &e), DDPD_OK);
    CHECK(m.n_eval >= 2 && m.n_eval <= 11 && m.eval[0].step == 1 && m.eval[m.n_eval - 1].step == 50);
    CHECK_EQ_INT((int64_t)m.lr.n, 0); /* loss events without lr */
    store_metrics_free(&m);
    /* Equal eval losses: the best is the first; no accuracy (mse): none. */
    CHECK_EQ_INT(store_job_get(s, job2, &jj, &e), DDPD_OK);
    CHECK(jj.evals.has_final && jj.evals.final_step == 50 && jj.evals.has_loss && !jj.evals.has_accuracy);
    CHECK(jj.evals.has_best_loss && jj.evals.best_loss_step == 1 && jj.evals.best_loss == 1.0);
    CHECK(!jj.evals.has_best_accuracy);
    store_job_clear(&jj);
    /* A job without eval events has none of them. */
    int64_t job3 = insert_job(s, "no-evals", 1);
    CHECK_EQ_INT(store_job_get(s, job3, &jj, &e), DDPD_OK);
    CHECK(!jj.evals.has_final && !jj.evals.has_loss && !jj.evals.has_best_loss &&
          !jj.evals.has_best_accuracy);
    store_job_clear(&jj);
    store_close(s);
}

static void test_concurrent(void)
{
    char path[700];
    db_path(path, sizeof path, "conc.db");
    struct store_opts o = {.readers = 3}; /* fewer connections than readers: they wait */
    struct conc c = {.s = open_ok(path, &o), .target = SANITIZED ? 10000 : 50000};
    if (!c.s)
        return;
    c.job = insert_job(c.s, "conc", 2);
    pthread_t rd[4], ap, in;
    for (int i = 0; i < 4; i++)
        pthread_create(&rd[i], NULL, reader_main, &c);
    pthread_create(&ap, NULL, appender_main, &c);
    pthread_create(&in, NULL, inserter_main, &c);
    pthread_join(ap, NULL);
    pthread_join(in, NULL);
    CHECK_EQ_INT(flush(c.s), DDPD_OK);
    c.done = 1;
    for (int i = 0; i < 4; i++)
        pthread_join(rd[i], NULL);
    CHECK_EQ_INT(c.errors, 0);
    CHECK(c.reads > 0);
    fprintf(stderr, "concurrent: %d reads beside %d appends and 400 job writes\n", c.reads, c.target);
    struct ddpd_error e;
    int64_t max = 0;
    CHECK_EQ_INT(store_event_max_seq(c.s, c.job, &max, &e), DDPD_OK);
    CHECK_EQ_INT(max, c.target);
    store_close(c.s);
}

/* ---- delete ---- */

static void test_delete(void)
{
    char path[700];
    struct ddpd_error e;
    db_path(path, sizeof path, "delete.db");
    struct store *s = open_ok(path, NULL);
    if (!s)
        return;
    int64_t a = insert_job(s, "a", 1), b = insert_job(s, "b", 1);
    CHECK_EQ_INT(set_state(s, a, JOB_STATE_RUNNING, 0), DDPD_OK);
    CHECK_EQ_INT(store_attempt_begin(s, a, 1, NULL, &e), DDPD_OK);
    struct store_rank rk = {.attempt = 1, .rank = 0, .state = "running"};
    CHECK_EQ_INT(store_rank_put(s, a, &rk, &e), DDPD_OK);
    for (int i = 1; i <= 100; i++) {
        CHECK(append(s, a, i, 1, EVENT_LOSS, 0, i, 1.0) == DDPD_OK);
        CHECK(append(s, b, i, 1, EVENT_LOSS, 0, i, 1.0) == DDPD_OK);
    }
    /* no flush: delete commits the queued events first */
    CHECK_EQ_INT(store_job_delete(s, a, JOB_STATES_FINAL, &e), DDPD_ECONFLICT);
    CHECK(strstr(e.message, "running") != NULL);
    CHECK_EQ_INT(set_state(s, a, JOB_STATE_SUCCEEDED, 0), DDPD_OK);
    CHECK_EQ_INT(store_job_delete(s, a, JOB_STATES_FINAL, &e), DDPD_OK);
    CHECK_EQ_INT(store_job_delete(s, a, 0, &e), DDPD_ENOTFOUND);
    struct store_job j;
    CHECK_EQ_INT(store_job_get(s, a, &j, &e), DDPD_ENOTFOUND);
    store_job_clear(&j);
    CHECK_EQ_INT(flush(s), DDPD_OK);
    CHECK_EQ_INT(raw_query(path, "SELECT count(*) FROM events WHERE job = 1", NULL, 0), 0);
    CHECK_EQ_INT(raw_query(path, "SELECT count(*) FROM loss WHERE job = 1", NULL, 0), 0);
    CHECK_EQ_INT(raw_query(path, "SELECT count(*) FROM ranks WHERE job = 1", NULL, 0), 0);
    CHECK_EQ_INT(raw_query(path, "SELECT count(*) FROM attempts WHERE job = 1", NULL, 0), 0);
    CHECK_EQ_INT(raw_query(path, "SELECT count(*) FROM events WHERE job = 2", NULL, 0), 100);
    /* an event for the deleted job is dropped, not stored */
    CHECK(append(s, a, 101, 1, EVENT_LOSS, 0, 101, 1.0) == DDPD_OK);
    CHECK_EQ_INT(store_flush(s, &e), DDPD_ECONFLICT);
    CHECK_EQ_INT(raw_query(path, "SELECT count(*) FROM events WHERE job = 1", NULL, 0), 0);
    /* ids are never reused */
    CHECK_EQ_INT(store_job_delete(s, b, 0, &e), DDPD_OK);
    CHECK(insert_job(s, "c", 1) > b);
    store_close(s);
}

/* ---- issue 28: a job's stored events are bounded ---- */

/* Everything stored of one job, as a reader sees it. */
struct all_events {
    int n, cap;
    int64_t *seq, *step;
    event_kind *kind;
    int *rank, *attempt;
    double *loss;
    bool *nonfinite;
    int64_t bytes;
};

static bool all_fn(void *ctx, const struct store_event_row *row)
{
    struct all_events *a = ctx;
    if (a->n == a->cap) {
        a->cap = a->cap ? 2 * a->cap : 1024;
        a->seq = realloc(a->seq, (size_t)a->cap * sizeof *a->seq);
        a->step = realloc(a->step, (size_t)a->cap * sizeof *a->step);
        a->kind = realloc(a->kind, (size_t)a->cap * sizeof *a->kind);
        a->rank = realloc(a->rank, (size_t)a->cap * sizeof *a->rank);
        a->attempt = realloc(a->attempt, (size_t)a->cap * sizeof *a->attempt);
        a->loss = realloc(a->loss, (size_t)a->cap * sizeof *a->loss);
        a->nonfinite = realloc(a->nonfinite, (size_t)a->cap * sizeof *a->nonfinite);
    }
    struct event ev;
    CHECK_EQ_INT(event_decode(row->body, row->len, &ev, NULL), DDPD_OK);
    a->seq[a->n] = row->seq;
    a->step[a->n] = ev.step;
    a->kind[a->n] = row->kind;
    a->rank[a->n] = row->rank;
    a->attempt[a->n] = row->attempt;
    a->loss[a->n] = ev.loss;
    a->nonfinite[a->n] = ev.nonfinite;
    a->bytes += (int64_t)row->len;
    a->n++;
    return true;
}

static void all_free(struct all_events *a)
{
    free(a->seq);
    free(a->step);
    free(a->kind);
    free(a->rank);
    free(a->attempt);
    free(a->loss);
    free(a->nonfinite);
    memset(a, 0, sizeof *a);
}

/* Reads every stored event of `job` (in pages, as a stream does). */
static void read_all(struct store *s, int64_t job, struct all_events *a)
{
    struct ddpd_error e;
    memset(a, 0, sizeof *a);
    for (int64_t after = 0;;) {
        size_t got = 0;
        int before = a->n;
        CHECK_EQ_INT(store_events_page(s, job, after, 500, 0, all_fn, a, &got, &e), DDPD_OK);
        if (got == 0)
            break;
        after = a->seq[before + (int)got - 1];
    }
}

/* The loss events of `a` at `step` of `attempt` (0 = any). */
static int loss_rows_at(const struct all_events *a, int64_t step, int attempt)
{
    int n = 0;
    for (int i = 0; i < a->n; i++)
        n += a->kind[i] == EVENT_LOSS && a->step[i] == step && (attempt == 0 || a->attempt[i] == attempt);
    return n;
}

#define BUDGET      400 /* loss events of the job, both ranks */
#define BUDGET_RANK 2

/* The loss of rank r at step k: a smooth decay with a spike, a dip and a NaN. */
static double budget_loss(int64_t k, int r)
{
    if (k == 700)
        return 50.0; /* a spike on both ranks */
    if (k == 900)
        return -5.0; /* a dip */
    if (k == 1100 && r == 1)
        return NAN;
    return 1.0 / (1.0 + 0.01 * (double)k) + 0.001 * r + 0.0001 * (double)(k % 7);
}

struct budget_run {
    struct store *s;
    int64_t job, seq;
    int non_loss; /* non-loss events appended */
    int64_t max_loss_seen;
};

static void budget_append(struct budget_run *r, int attempt, event_kind kind, int rank, int64_t step,
                          double loss)
{
    struct event ev;
    char body[EVENT_LINE_MAX];
    make_event(&ev, body, sizeof body, r->job, ++r->seq, attempt, kind, rank, step, loss);
    if (kind == EVENT_CHECKPOINT)
        snprintf(ev.path, sizeof ev.path, "jobs/%lld/ckpt-%lld/model.safetensors", (long long)r->job,
                 (long long)step);
    if (kind == EVENT_ERROR) {
        snprintf(ev.error_kind, sizeof ev.error_kind, "comm");
        snprintf(ev.message, sizeof ev.message, "rank 1 went away at step %lld", (long long)step);
    }
    if (kind == EVENT_EVAL)
        ev.samples = 64;
    if (kind == EVENT_DONE)
        ev.steps = step;
    int n = event_encode(&ev, body, sizeof body);
    CHECK(n > 0);
    struct ddpd_error e;
    CHECK_EQ_INT(store_event_append(r->s, &ev, body, (size_t)n, &e), DDPD_OK);
    r->non_loss += kind != EVENT_LOSS;
}

/* One attempt's steps first..last of both ranks, with an eval every 50 steps and a
 * checkpoint every 200; a flush every 25 steps (the live path's small batches), after
 * which the job's stored loss events are within the budget. */
static void budget_attempt(struct budget_run *r, int attempt, int64_t first, int64_t last, bool check_bound)
{
    struct ddpd_error e;
    budget_append(r, attempt, EVENT_STATE, -1, 0, 0);
    for (int rk = 0; rk < BUDGET_RANK; rk++)
        budget_append(r, attempt, EVENT_START, rk, 0, 0);
    for (int64_t k = first; k <= last; k++) {
        for (int rk = 0; rk < BUDGET_RANK; rk++)
            budget_append(r, attempt, EVENT_LOSS, rk, k, budget_loss(k, rk));
        if (k % 50 == 0)
            budget_append(r, attempt, EVENT_EVAL, 0, k, 0.5);
        if (k % 200 == 0)
            budget_append(r, attempt, EVENT_CHECKPOINT, 0, k, 0);
        if (k % 25 == 0 || k == last) {
            CHECK_EQ_INT(flush(r->s), DDPD_OK);
            struct store_usage u;
            CHECK_EQ_INT(store_job_usage(r->s, r->job, &u, &e), DDPD_OK);
            if (u.loss_events > r->max_loss_seen)
                r->max_loss_seen = u.loss_events;
            if (check_bound && u.loss_events > BUDGET) {
                fprintf(stderr, "    after step %lld: %lld loss events stored, budget %d\n", (long long)k,
                        (long long)u.loss_events, BUDGET);
                CHECK(u.loss_events <= BUDGET);
                check_bound = false; /* say it once */
            }
        }
    }
}

/* Checks what must survive thinning in `a`: every non-loss event, the first and last
 * step, the spike, the dip, the NaN, the newest budget/2 loss events whole; seqs
 * increasing; usage equal to the rows. */
static void budget_check(struct budget_run *r, int64_t first_step, int64_t last_step, int last_attempt)
{
    struct ddpd_error e;
    struct all_events a;
    read_all(r->s, r->job, &a);
    int loss = 0, non_loss = 0, steps_nf = 0;
    bool increasing = true;
    for (int i = 0; i < a.n; i++) {
        loss += a.kind[i] == EVENT_LOSS;
        non_loss += a.kind[i] != EVENT_LOSS;
        if (i > 0 && a.seq[i] <= a.seq[i - 1])
            increasing = false;
        if (a.kind[i] == EVENT_LOSS && a.nonfinite[i])
            steps_nf++;
    }
    CHECK(increasing);
    CHECK(loss <= BUDGET);
    CHECK_EQ_INT(non_loss, r->non_loss);       /* every eval, checkpoint, error, state, ... */
    CHECK(loss < (int)(r->seq - r->non_loss)); /* and some loss events did go */
    CHECK_EQ_INT(loss_rows_at(&a, first_step, 0), BUDGET_RANK);
    CHECK_EQ_INT(loss_rows_at(&a, last_step, last_attempt), BUDGET_RANK);
    CHECK(loss_rows_at(&a, 700, 0) >= BUDGET_RANK); /* the spike */
    CHECK(loss_rows_at(&a, 900, 0) >= BUDGET_RANK); /* the dip */
    CHECK(steps_nf >= 1);                           /* the NaN */
    /* The newest BUDGET/2 loss events are every step of the last BUDGET/2/ranks. */
    for (int64_t k = last_step - BUDGET / 2 / BUDGET_RANK + 1; k <= last_step; k++)
        if (loss_rows_at(&a, k, last_attempt) != BUDGET_RANK) {
            fprintf(stderr, "    newest step %lld was thinned\n", (long long)k);
            CHECK(false);
            break;
        }
    int64_t max = 0;
    CHECK_EQ_INT(store_event_max_seq(r->s, r->job, &max, &e), DDPD_OK);
    CHECK_EQ_INT(max, r->seq); /* the numbering goes on after it */
    struct store_usage u;
    CHECK_EQ_INT(store_job_usage(r->s, r->job, &u, &e), DDPD_OK);
    CHECK_EQ_INT(u.events, a.n);
    CHECK_EQ_INT(u.loss_events, loss);
    all_free(&a);
}

static void test_event_budget(void)
{
    char path[700];
    struct ddpd_error e;
    db_path(path, sizeof path, "budget.db");
    struct store_opts o = {.job_events_max = BUDGET};
    struct budget_run r = {.s = open_ok(path, &o)};
    if (!r.s)
        return;
    struct store_job_new jn = {
        .name = "budget", .spec = SPEC, .world_size = BUDGET_RANK, .queued_event = true};
    CHECK_EQ_INT(store_job_insert(r.s, &jn, &r.job, NULL, &e), DDPD_OK);
    r.seq = 1; /* the queued event */
    r.non_loss = 1;
    int64_t other = insert_job(r.s, "small", 1);
    struct store_job_update up = {
        .fields = STORE_SET_STATE | STORE_SET_ATTEMPT, .state = JOB_STATE_RUNNING, .attempt = 1};
    CHECK_EQ_INT(store_job_update(r.s, r.job, &up, NULL, &e), DDPD_OK);
    for (int i = 1; i <= 50; i++) /* another job's events are not touched */
        CHECK_EQ_INT(append(r.s, other, i, 1, EVENT_LOSS, 0, i, 1.0), DDPD_OK);

    /* Attempt 1: 1500 steps (3000 loss events, 7.5x the budget), a rank's error at its end. */
    budget_attempt(&r, 1, 1, 1500, true);
    budget_append(&r, 1, EVENT_ERROR, 1, 1500, 0);
    CHECK_EQ_INT(flush(r.s), DDPD_OK);
    budget_check(&r, 1, 1500, 1);

    /* The server restarts (the budget lives in the database), and attempt 2 resumes from
     * the checkpoint at step 1400: steps 1401..1500 run again, then on to 2000 (10x the
     * budget in all). Until it passes step 1500 the older attempt's newest events are
     * still above its cut (at most the budget again); then the bound holds again. */
    store_close(r.s);
    r.s = open_ok(path, &o);
    if (!r.s)
        return;
    up = (struct store_job_update){.fields = STORE_SET_ATTEMPT, .attempt = 2};
    CHECK_EQ_INT(store_job_update(r.s, r.job, &up, NULL, &e), DDPD_OK);
    budget_attempt(&r, 2, 1401, 2000, false);
    CHECK(r.max_loss_seen <= 2 * BUDGET);
    budget_append(&r, 2, EVENT_DONE, 0, 2000, 0.1);
    CHECK_EQ_INT(flush(r.s), DDPD_OK);
    budget_check(&r, 1, 2000, 2);

    /* Steps 1401..1500 read as attempt 2's, the job's progress is its last step, and the
     * curve keeps the spike, the dip and both ends. */
    struct store_job j;
    CHECK_EQ_INT(store_job_get(r.s, r.job, &j, &e), DDPD_OK);
    CHECK(j.has_progress && j.step == 2000);
    CHECK(fabs(j.loss - (budget_loss(2000, 0) + budget_loss(2000, 1)) / 2) < 1e-12);
    store_job_clear(&j);
    struct store_metrics m;
    CHECK_EQ_INT(store_metrics_get(r.s, r.job, 0, &m, &e), DDPD_OK);
    CHECK_EQ_INT(m.first_step, 1);
    CHECK_EQ_INT(m.last_step, 2000);
    CHECK(m.points <= BUDGET);
    double hi = -INFINITY, lo = INFINITY;
    for (size_t i = 0; m.n_series > 0 && i < m.series[0].n; i++) {
        hi = fmax(hi, m.series[0].loss[i]);
        lo = fmin(lo, m.series[0].loss[i]);
    }
    CHECK(hi == 50.0 && lo == -5.0);
    store_metrics_free(&m);
    struct store_stats st;
    store_stats_get(r.s, &st);
    CHECK(st.events_thinned > 0);
    struct store_usage fin;
    CHECK_EQ_INT(store_job_usage(r.s, r.job, &fin, &e), DDPD_OK);
    fprintf(stderr,
            "event budget %d: %lld of %lld loss events stored at the end (at most %lld after a commit, "
            "%llu thinned since the reopen), %lld events, %lld bytes\n",
            BUDGET, (long long)fin.loss_events, (long long)(r.seq - r.non_loss), (long long)r.max_loss_seen,
            (unsigned long long)st.events_thinned, (long long)fin.events, (long long)fin.bytes);
    CHECK_EQ_INT(raw_query(path, "SELECT count(*) FROM events WHERE job = 2", NULL, 0), 50);
    CHECK_EQ_INT(raw_query(path, "SELECT count(*) FROM loss WHERE job = 2", NULL, 0), 50);
    /* The usage is the rows', bytes included, for every job. */
    CHECK_EQ_INT(
        raw_query(path,
                  "SELECT count(*) FROM event_usage u WHERE events <> (SELECT count(*) FROM events "
                  "WHERE job = u.job) OR bytes <> (SELECT sum(length(CAST(body AS BLOB))) FROM events "
                  "WHERE job = u.job) OR loss_events <> (SELECT count(*) FROM events WHERE job = u.job "
                  "AND kind = 'loss')",
                  NULL, 0),
        0);
    CHECK_EQ_INT(raw_query(path, "SELECT count(*) FROM event_usage", NULL, 0), 2);
    CHECK_EQ_INT(store_job_delete(r.s, r.job, 0, &e), DDPD_OK);
    CHECK_EQ_INT(raw_query(path, "SELECT count(*) FROM event_usage", NULL, 0), 1);
    store_close(r.s);

    /* Without a budget nothing is thinned. */
    db_path(path, sizeof path, "budget-none.db");
    struct store *s = open_ok(path, NULL);
    if (!s)
        return;
    int64_t job = insert_job(s, "all", 1);
    for (int i = 1; i <= 3 * BUDGET; i++)
        CHECK_EQ_INT(append(s, job, i, 1, EVENT_LOSS, 0, i, 1.0 / i), DDPD_OK);
    CHECK_EQ_INT(flush(s), DDPD_OK);
    struct store_usage u;
    CHECK_EQ_INT(store_job_usage(s, job, &u, &e), DDPD_OK);
    CHECK_EQ_INT(u.loss_events, 3 * BUDGET);
    CHECK_EQ_INT(u.events, 3 * BUDGET);
    CHECK_EQ_INT(store_job_usage(s, 424242, &u, &e), DDPD_OK);
    CHECK(u.events == 0 && u.bytes == 0);
    store_close(s);
}

/* A database of schema version 3 gets its jobs' usage from the events it holds. */
static void test_event_budget_migration(void)
{
    char path[700];
    db_path(path, sizeof path, "budget-v3.db");
    sqlite3 *db = NULL;
    CHECK_EQ_INT(sqlite3_open(path, &db), SQLITE_OK);
    for (int v = 1; v <= 3; v++)
        CHECK_EQ_INT(sqlite3_exec(db, store_migration_sql(v, NULL), NULL, NULL, NULL), SQLITE_OK);
    CHECK_EQ_INT(
        sqlite3_exec(db,
                     "PRAGMA user_version = 3; INSERT INTO jobs (name, state, spec, world_size, device, "
                     "created_at) VALUES ('old', 'succeeded', '{}', 1, 'cpu', 1); "
                     "INSERT INTO events VALUES (1, 1, 1, 'state', NULL, '{\"event\":\"state\"}', 1), "
                     "(1, 2, 1, 'loss', 0, '{\"event\":\"loss\",\"step\":1}', 1), "
                     "(1, 3, 1, 'loss', 0, '{\"event\":\"loss\",\"step\":2,\"x\":\"\xc3\xa9\"}', 1);",
                     NULL, NULL, NULL),
        SQLITE_OK);
    sqlite3_close(db);
    struct store *s = open_ok(path, NULL);
    if (!s)
        return;
    struct ddpd_error e;
    struct store_usage u;
    CHECK_EQ_INT(store_job_usage(s, 1, &u, &e), DDPD_OK);
    CHECK_EQ_INT(u.events, 3);
    CHECK_EQ_INT(u.loss_events, 2);
    CHECK_EQ_INT(u.bytes, 17 + 25 + 34); /* bytes, not characters */
    store_close(s);
}

/* ---- SIGKILL at random moments ---- */

/* The child: inserts jobs and events and reports each once its call returned:
 * "J id" after an insert, "E id seq" after a flush. Runs until killed. Its jobs' 1500
 * events each are past its event budget: it is killed while thinning too. */
static int crash_child(const char *path)
{
    struct ddpd_error e;
    struct store_opts o = {.linger_ms = 5, .job_events_max = 400};
    struct store *s = store_open_with(path, &o, &e);
    if (!s) {
        fprintf(stderr, "child: %s\n", e.message);
        return 1;
    }
    setvbuf(stdout, NULL, _IONBF, 0);
    for (int k = 0;; k++) {
        struct store_job_new j = {.name = "crash", .spec = SPEC, .world_size = 2};
        int64_t id;
        if (store_job_insert(s, &j, &id, NULL, &e) != DDPD_OK)
            return 2;
        printf("J %lld\n", (long long)id);
        set_state(s, id, JOB_STATE_RUNNING, 0);
        int64_t seq = 0;
        for (int round = 0; round < 5; round++) {
            for (int i = 0; i < 300; i++) {
                seq++;
                if (append(s, id, seq, 1, EVENT_LOSS, (int)(seq % 2), (seq + 1) / 2, 1.0) != DDPD_OK)
                    return 3;
            }
            if (round % 2 == 0 || k % 3 == 0) {
                if (flush(s) != DDPD_OK)
                    return 4;
                printf("E %lld %lld\n", (long long)id, (long long)seq);
            }
        }
    }
}

/* One line of the child's reports; the last 64 flushes are kept. */
static bool parse_report(const char *line, int64_t *jobs, int *nj, int64_t *ev_job, int64_t *ev_seq, int *ne)
{
    long long a, b;
    if (sscanf(line, "J %lld", &a) == 1 && *nj < 100000) {
        jobs[(*nj)++] = a;
    } else if (sscanf(line, "E %lld %lld", &a, &b) == 2) {
        ev_job[*ne % 64] = a;
        ev_seq[*ne % 64] = b;
        ++*ne;
    } else {
        fprintf(stderr, "    child said: %s", line);
        return false;
    }
    return true;
}

static void test_crash(const char *self)
{
    char path[700];
    db_path(path, sizeof path, "crash.db");
    unsigned seed = (unsigned)time(NULL) ^ (unsigned)getpid();
    fprintf(stderr, "crash: seed %u\n", seed);
    srand(seed);
    int64_t jobs_total = 0;
    for (int round = 0; round < 6; round++) {
        int fd[2];
        CHECK_EQ_INT(pipe(fd), 0);
        pid_t pid = fork();
        if (pid == 0) {
            dup2(fd[1], 1);
            close(fd[0]);
            close(fd[1]);
            execl(self, self, "crash-child", path, (char *)NULL);
            _exit(127);
        }
        close(fd[1]);
        FILE *f = fdopen(fd[0], "r");
        char line[128];
        /* Wait until it has flushed once, then kill it at a random moment. */
        int64_t *jobs = calloc(100000, sizeof *jobs), ev_job[64] = {0}, ev_seq[64] = {0};
        int nj = 0, ne = 0;
        while (ne == 0 && fgets(line, sizeof line, f))
            if (!parse_report(line, jobs, &nj, ev_job, ev_seq, &ne))
                break;
        sleep_ms(5 + rand() % 300);
        kill(pid, SIGKILL);
        int status = 0;
        waitpid(pid, &status, 0);
        CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
        while (fgets(line, sizeof line, f))
            parse_report(line, jobs, &nj, ev_job, ev_seq, &ne);
        fclose(f);

        /* Reopen: every job whose insert returned is there, every flushed event too. */
        struct ddpd_error e;
        struct store *s = open_ok(path, NULL);
        if (!s) {
            free(jobs);
            return;
        }
        int missing = 0;
        for (int i = 0; i < nj; i++) {
            struct store_job j;
            if (store_job_get(s, jobs[i], &j, &e) != DDPD_OK)
                missing++;
            store_job_clear(&j);
        }
        CHECK_EQ_INT(missing, 0);
        for (int i = 0; i < ne && i < 64; i++) {
            int64_t max = 0;
            CHECK_EQ_INT(store_event_max_seq(s, ev_job[i], &max, &e), DDPD_OK);
            CHECK(max >= ev_seq[i]);
        }
        store_close(s);
        char text[64] = "";
        raw_query(path, "PRAGMA integrity_check", text, sizeof text);
        CHECK_EQ_STR(text, "ok");
        CHECK_EQ_INT(raw_query(path, "SELECT count(*) FROM pragma_foreign_key_check", NULL, 0), 0);
        /* Thinning is in the batch's transaction: the usage is the rows', and a job's
         * loss events are within the budget plus one batch. */
        CHECK_EQ_INT(
            raw_query(path,
                      "SELECT count(*) FROM event_usage u WHERE events <> (SELECT count(*) FROM events "
                      "WHERE job = u.job) OR loss_events <> (SELECT count(*) FROM events WHERE job = "
                      "u.job AND kind = 'loss') OR bytes <> (SELECT sum(length(CAST(body AS BLOB))) "
                      "FROM events WHERE job = u.job)",
                      NULL, 0),
            0);
        CHECK_EQ_INT(raw_query(path, "SELECT count(*) FROM event_usage WHERE loss_events > 400", NULL, 0), 0);
        jobs_total += nj;
        fprintf(stderr, "crash round %d: killed after %d job inserts and %d flushes, all there\n", round, nj,
                ne);
        free(jobs);
    }
    CHECK(jobs_total > 0);
}

/* ---- issue 15: one server per database, state that tells the truth ---- */

static void test_lock(void)
{
    char path[600], lock[640], text[64];
    db_path(path, sizeof path, "locked/one.db");
    snprintf(lock, sizeof lock, "%s.lock", path);
    struct ddpd_error e;
    struct store_lock *l = store_lock_take(path, &e);
    CHECK(l != NULL);
    /* Another holder (another open of the file: flock locks belong to it, so this process
     * stands for a second server) is refused, naming the pid the file holds. */
    CHECK(store_lock_take(path, &e) == NULL);
    CHECK_EQ_INT(e.code, DDPD_ECONFLICT);
    char want[64];
    snprintf(want, sizeof want, "(pid %ld holds ", (long)getpid());
    CHECK(strstr(e.message, want) != NULL);
    CHECK(strstr(e.message, "in use by another ddpd server") != NULL);
    struct stat st;
    CHECK(stat(lock, &st) == 0 && (st.st_mode & 0777) == 0600);
    int fd = open(lock, O_RDONLY);
    ssize_t n = fd >= 0 ? read(fd, text, sizeof text - 1) : -1;
    text[n > 0 ? n : 0] = '\0';
    close(fd);
    CHECK_EQ_INT(strtol(text, NULL, 10), (long)getpid());
    store_lock_release(l);
    /* Released: taken again (the file stays). */
    l = store_lock_take(path, &e);
    CHECK(l != NULL);
    store_lock_release(l);
    store_lock_release(NULL);
    /* The database and its folder: the user's own. */
    struct store *s = open_ok(path, NULL);
    insert_job(s, "x", 1);
    char wal[640];
    snprintf(wal, sizeof wal, "%s-wal", path);
    CHECK(stat(path, &st) == 0 && (st.st_mode & 0777) == 0600);
    CHECK(stat(wal, &st) == 0 && (st.st_mode & 0777) == 0600);
    db_path(wal, sizeof wal, "locked");
    CHECK(stat(wal, &st) == 0 && (st.st_mode & 0777) == 0700);
    store_close(s);
    /* An older ddpd's database (0644, and its WAL) is made private when opened. */
    CHECK(chmod(path, 0644) == 0);
    snprintf(wal, sizeof wal, "%s-wal", path);
    int wfd = open(wal, O_RDWR | O_CREAT, 0644);
    CHECK(wfd >= 0 && fchmod(wfd, 0644) == 0);
    close(wfd);
    s = open_ok(path, NULL);
    CHECK(stat(path, &st) == 0 && (st.st_mode & 0777) == 0600);
    CHECK(stat(wal, &st) == 0 && (st.st_mode & 0777) == 0600);
    store_close(s);
}

static void test_state_truth(void)
{
    char path[600];
    db_path(path, sizeof path, "truth.db");
    struct store *s = open_ok(path, NULL);
    struct ddpd_error e;
    struct store_job j;
    int64_t id = insert_job(s, "restarts", 2);
    CHECK_EQ_INT(store_job_get(s, id, &j, &e), DDPD_OK);
    CHECK_EQ_STR(j.restart_history, "[]");
    store_job_clear(&j);

    /* Attempt 1 runs and reports progress: loss at step 2 on both ranks, rank 1 joins at
     * step 2 and both are done after 5 steps. */
    CHECK_EQ_INT(store_attempt_begin(s, id, 1, NULL, &e), DDPD_OK);
    struct store_job_update u = {
        .fields = STORE_SET_STATE | STORE_SET_ATTEMPT, .state = JOB_STATE_RUNNING, .attempt = 1};
    CHECK_EQ_INT(store_job_update(s, id, &u, NULL, &e), DDPD_OK);
    for (int r = 0; r < 2; r++) {
        struct store_rank rk = {.attempt = 1, .rank = r, .pid = 100 + r};
        snprintf(rk.state, sizeof rk.state, "running");
        CHECK_EQ_INT(store_rank_put(s, id, &rk, &e), DDPD_OK);
    }
    CHECK_EQ_INT(append(s, id, 1, 1, EVENT_LOSS, 0, 2, 0.5), DDPD_OK);
    CHECK_EQ_INT(append(s, id, 2, 1, EVENT_LOSS, 1, 2, 0.25), DDPD_OK);
    struct event ev;
    make_event(&ev, NULL, 0, id, 3, 1, EVENT_JOIN, 1, 2, 0);
    CHECK_EQ_INT(store_event_append(s, &ev, NULL, 0, &e), DDPD_OK);
    CHECK_EQ_INT(flush(s), DDPD_OK);
    CHECK_EQ_INT(store_job_get(s, id, &j, &e), DDPD_OK);
    CHECK_EQ_INT(j.ranks[1].step, 2);
    store_job_clear(&j);
    for (int r = 0; r < 2; r++) {
        make_event(&ev, NULL, 0, id, 4 + r, 1, EVENT_DONE, r, 0, 0);
        ev.steps = 5;
        ev.loss = r ? 0.25 : 0.5;
        CHECK_EQ_INT(store_event_append(s, &ev, NULL, 0, &e), DDPD_OK);
    }
    CHECK_EQ_INT(flush(s), DDPD_OK);
    CHECK_EQ_INT(store_job_get(s, id, &j, &e), DDPD_OK);
    CHECK_EQ_INT(j.n_ranks, 2);
    for (int r = 0; r < 2; r++) { /* done says 5 steps; the loss stays the latest reported */
        CHECK_EQ_INT(j.ranks[r].step, 5);
        CHECK_NEAR(j.ranks[r].loss, r ? 0.25 : 0.5, 0, 0);
    }
    CHECK(j.has_progress);
    CHECK_EQ_INT(j.step, 2);
    CHECK_NEAR(j.loss, 0.375, 1e-12, 0);
    store_job_clear(&j);

    /* The same attempt set again (a retried end) keeps the progress; another clears it. */
    u = (struct store_job_update){
        .fields = STORE_SET_STATE | STORE_SET_ATTEMPT, .state = JOB_STATE_RUNNING, .attempt = 1};
    CHECK_EQ_INT(store_job_update(s, id, &u, NULL, &e), DDPD_OK);
    CHECK_EQ_INT(store_job_get(s, id, &j, &e), DDPD_OK);
    CHECK(j.has_progress);
    CHECK_EQ_INT(j.step, 2);
    store_job_clear(&j);

    /* A restart: its reason goes to the history, not to error; a later success shows none. */
    u = (struct store_job_update){.fields = STORE_SET_STATE | STORE_SET_ATTEMPT | STORE_SET_RESTART |
                                            STORE_SET_ERROR,
                                  .state = JOB_STATE_STARTING,
                                  .attempt = 2,
                                  .restart_attempt = 1,
                                  .restart_reason = "restart 1 of 3 after rank 1 failed (exit code 3): \"x\"",
                                  .restart_by_rank = true,
                                  .restart_rank = 1,
                                  .restart_exit_code = 3};
    CHECK_EQ_INT(store_job_update(s, id, &u, NULL, &e), DDPD_OK);
    u.restart_by_rank = false; /* no rank's failure: rank and exit_code null */
    u.restart_attempt = 2;
    u.attempt = 3;
    u.restart_reason = "server restarted; the job was queued again";
    u.state = JOB_STATE_QUEUED;
    CHECK_EQ_INT(store_job_update(s, id, &u, NULL, &e), DDPD_OK);
    CHECK_EQ_INT(set_state(s, id, JOB_STATE_SUCCEEDED, 0), DDPD_OK);
    CHECK_EQ_INT(store_job_get(s, id, &j, &e), DDPD_OK);
    CHECK(!j.has_progress); /* attempt 2 cleared attempt 1's */
    CHECK_EQ_STR(j.error, "");
    char want[512];
    double ts = 0;
    int pos = 0;
    CHECK(sscanf(j.restart_history,
                 "[{\"attempt\":1,\"reason\":\"restart 1 of 3 after rank 1 failed (exit code 3): "
                 "\\\"x\\\"\",\"ts\":%lf,\"rank\":1,\"exit_code\":3}%n",
                 &ts, &pos) == 1 &&
          pos > 0);
    CHECK(ts > 1.6e9);
    snprintf(want, sizeof want, ",{\"attempt\":2,\"reason\":\"server restarted; the job was queued again\",");
    CHECK(strstr(j.restart_history + pos, want) == j.restart_history + pos);
    CHECK(strstr(j.restart_history + pos, "\"rank\":null,\"exit_code\":null}]") != NULL);
    store_job_clear(&j);
    store_close(s);

    /* A version 1 database: the restart reasons kept as errors move into the history. */
    db_path(path, sizeof path, "v1.db");
    sqlite3 *db = NULL;
    CHECK_EQ_INT(sqlite3_open(path, &db), SQLITE_OK);
    CHECK_EQ_INT(sqlite3_exec(db, store_migration_sql(1, NULL), NULL, NULL, NULL), SQLITE_OK);
    CHECK_EQ_INT(
        sqlite3_exec(db,
                     "PRAGMA user_version = 1; INSERT INTO jobs (name, state, spec, world_size, device, "
                     "created_at, attempt, error) VALUES "
                     "('ok', 'succeeded', '{}', 1, 'cpu', 0, 2, 'restart 1 of 1 after rank 0 failed'), "
                     "('bad', 'failed', '{}', 1, 'cpu', 0, 2, 'rank 0 failed (exit code 2)'), "
                     "('requeued', 'queued', '{}', 1, 'cpu', 0, 1, "
                     "'server restarted; the job was queued again'), "
                     "('plain', 'succeeded', '{}', 1, 'cpu', 0, 1, NULL)",
                     NULL, NULL, NULL),
        SQLITE_OK);
    sqlite3_close(db);
    s = open_ok(path, NULL);
    const char *errs[4] = {"", "rank 0 failed (exit code 2)", "", ""};
    const char *hist[4] = {
        "[{\"attempt\":1,\"reason\":\"restart 1 of 1 after rank 0 failed\",\"ts\":null}]", "[]",
        "[{\"attempt\":1,\"reason\":\"server restarted; the job was queued again\",\"ts\":null}]", "[]"};
    for (int i = 0; i < 4; i++) {
        CHECK_EQ_INT(store_job_get(s, i + 1, &j, &e), DDPD_OK);
        CHECK_EQ_STR(j.error, errs[i]);
        CHECK_EQ_STR(j.restart_history, hist[i]);
        store_job_clear(&j);
    }
    store_close(s);
}

/* A database whose interior b-tree page is damaged opens (what is intact can be read),
 * and store_ping says what quick_check found. */
static void test_quick_check(void)
{
    char path[600];
    db_path(path, sizeof path, "damaged.db");
    struct store *s = open_ok(path, NULL);
    struct ddpd_error e;
    int64_t id = insert_job(s, "fill", 1);
    for (int i = 1; i <= 3000; i++)
        CHECK_EQ_INT(append(s, id, i, 1, EVENT_LOSS, 0, i, 1.0 / i), DDPD_OK);
    CHECK_EQ_INT(flush(s), DDPD_OK);
    CHECK_EQ_INT(store_ping(s, &e), DDPD_OK);
    store_close(s);
    sqlite3 *db = NULL;
    CHECK_EQ_INT(sqlite3_open(path, &db), SQLITE_OK);
    CHECK_EQ_INT(sqlite3_exec(db, "PRAGMA wal_checkpoint(TRUNCATE)", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
    s = open_ok(path, NULL); /* healthy: the check passes */
    CHECK_EQ_INT(store_ping(s, &e), DDPD_OK);
    store_close(s);
    CHECK_EQ_INT(sqlite3_open(path, &db), SQLITE_OK);
    CHECK_EQ_INT(sqlite3_exec(db, "PRAGMA wal_checkpoint(TRUNCATE)", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
    /* The first interior page after the schema page: its cells overwritten. */
    int fd = open(path, O_RDWR);
    CHECK(fd >= 0);
    unsigned char hdr[100], page[65536];
    CHECK(pread(fd, hdr, sizeof hdr, 0) == (ssize_t)sizeof hdr);
    size_t psize = (size_t)hdr[16] << 8 | hdr[17];
    psize = psize == 1 ? 65536 : psize;
    bool damaged = false;
    for (off_t off = (off_t)psize; !damaged && pread(fd, page, psize, off) == (ssize_t)psize;
         off += (off_t)psize) {
        if (page[0] != 0x02 && page[0] != 0x05)
            continue;
        size_t start = (size_t)page[5] << 8 | page[6];
        memset(page + start, 0xA5, psize - start);
        CHECK(pwrite(fd, page, psize, off) == (ssize_t)psize);
        damaged = true;
    }
    close(fd);
    CHECK(damaged);
    s = open_ok(path, NULL);
    ddpd_error_clear(&e);
    CHECK_EQ_INT(store_ping(s, &e), DDPD_EIO);
    CHECK(strstr(e.message, "failed its quick check at start: ") != NULL);
    CHECK(strstr(e.message, path) != NULL);
    store_close(s);
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "crash-child") == 0)
        return crash_child(argv[2]);

    const char *base = getenv("DDPD_TEST_TMP");
    if (!base || !*base)
        base = "/tmp";
    mkdir(base, 0755);
    snprintf(tmpdir, sizeof tmpdir, "%s/store-XXXXXX", base);
    if (!mkdtemp(tmpdir)) {
        fprintf(stderr, "mkdtemp %s: %s\n", tmpdir, strerror(errno));
        return 1;
    }
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    self[n > 0 ? n : 0] = '\0';

    test_migration_table();
    test_open_fresh_and_again();
    test_open_errors();
    test_jobs();
    test_events();
    test_insert_async();
    test_busy();
    test_ingest_rate();
    test_metrics();
    test_metrics_eval_lr();
    test_concurrent();
    test_delete();
    test_event_budget();
    test_event_budget_migration();
    test_lock();
    test_state_truth();
    test_quick_check();
    test_crash(self);

    if (check__failures == 0)
        base_remove_tree(tmpdir);
    else
        fprintf(stderr, "files kept in %s\n", tmpdir);
    CHECK_DONE();
}
