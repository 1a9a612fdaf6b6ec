/* ingest.c — loss events into SQLite per second: ddpd's store (server/store.c:
 * store_event_append from one thread, committed in batches by the store's writer thread,
 * store_flush at the end) against a raw batched prepared insert of the same rows with
 * plain sqlite3. Run by bench/server; one measurement per process, fresh database.
 *
 * Usage: bench_ingest store|raw DB_PATH EVENTS [RANKS] [BATCH] [EVENTS_MAX]
 *   store  store_open(DB_PATH), one job with RANKS ranks (attempt 1), then EVENTS loss
 *          events (rank r, step s, round robin over ranks) appended and flushed. The store
 *          writes each into `events` and `loss` and keeps the rank's and the job's latest
 *          step and loss (two UPDATEs per batch, not per event). With EVENTS_MAX > 0 (the
 *          store's job_events_max, ddpd serve's --job-events-max) the writer also thins the
 *          job's older loss events past it; BATCH is the raw mode's only.
 *   raw    the same schema (migration 001 applied as text, so the tables have the same
 *          shape; foreign keys not enforced, as plain sqlite3 leaves them), journal_mode
 *          WAL, synchronous NORMAL, then the same rows: per event one prepared INSERT into
 *          `events` and one INSERT OR REPLACE into `loss`, BATCH events (default 1000, the
 *          store's batch_max) per BEGIN IMMEDIATE ... COMMIT.
 * Both get the same event bodies (event_encode with the server fields), encoded before the
 * clock starts. Timed: from the first append / insert to the last commit (store_flush
 * returned). Setup (opening, migrations, the job row) is not timed.
 *
 * Prints one JSON line: {"mode":..,"events":N,"seconds":S,"per_s":R,"job_step":..,...}. */
#include <inttypes.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../schema/event.h"
#include "../server/store.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

struct row {
    struct event ev;
    char *body;
    int len;
};

static struct row *make_rows(int64_t job, long n, int ranks)
{
    struct row *rows = calloc((size_t)n, sizeof *rows);
    char buf[EVENT_LINE_MAX];
    double t0 = wall_s();
    for (long i = 0; i < n; i++) {
        struct event *ev = &rows[i].ev;
        ev->kind = EVENT_LOSS;
        ev->rank = (int)(i % ranks);
        ev->step = i / ranks + 1;
        ev->epoch = ev->step / 1000;
        ev->loss = 1.0 / (double)(ev->step + 1) + 0.001 * ev->rank;
        ev->samples_per_s = 51234.5;
        ev->ts = t0 + 0.001 * (double)i;
        ev->has_server_fields = true;
        ev->job = job;
        ev->attempt = 1;
        ev->seq = i + 1;
        int len = event_encode(ev, buf, sizeof buf);
        if (len < 0) {
            fprintf(stderr, "event_encode failed\n");
            exit(1);
        }
        rows[i].body = malloc((size_t)len + 1);
        memcpy(rows[i].body, buf, (size_t)len + 1);
        rows[i].len = len;
    }
    return rows;
}

static int run_store(const char *path, long n, int ranks, long events_max)
{
    struct ddpd_error err;
    struct store_opts o = {.job_events_max = (int)events_max};
    struct store *s = store_open_with(path, &o, &err);
    if (!s) {
        fprintf(stderr, "store_open: %s\n", err.message);
        return 1;
    }
    struct store_job_new jn = {.name = "bench", .spec = "{}", .world_size = ranks, .device = DEVICE_CPU};
    int64_t id;
    if (store_job_insert(s, &jn, &id, NULL, &err) || store_attempt_begin(s, id, 1, NULL, &err)) {
        fprintf(stderr, "setup: %s\n", err.message);
        return 1;
    }
    struct store_job_update u = {
        .fields = STORE_SET_STATE | STORE_SET_ATTEMPT, .state = JOB_STATE_RUNNING, .attempt = 1};
    if (store_job_update(s, id, &u, NULL, &err)) {
        fprintf(stderr, "setup: %s\n", err.message);
        return 1;
    }
    for (int r = 0; r < ranks; r++) {
        struct store_rank sr = {.attempt = 1, .rank = r, .pid = 1};
        snprintf(sr.state, sizeof sr.state, "running");
        if (store_rank_put(s, id, &sr, &err)) {
            fprintf(stderr, "setup: %s\n", err.message);
            return 1;
        }
    }
    struct row *rows = make_rows(id, n, ranks);

    double t0 = now_s();
    for (long i = 0; i < n; i++) {
        if (store_event_append(s, &rows[i].ev, rows[i].body, (size_t)rows[i].len, &err) != DDPD_OK) {
            fprintf(stderr, "store_event_append %ld: %s\n", i, err.message);
            return 1;
        }
    }
    ddpd_err fe = store_flush(s, &err);
    double dt = now_s() - t0;
    if (fe != DDPD_OK) {
        fprintf(stderr, "store_flush: %s\n", err.message);
        return 1;
    }
    struct store_stats st;
    store_stats_get(s, &st);
    struct store_job j;
    memset(&j, 0, sizeof j);
    ddpd_err ge = store_job_get(s, id, &j, &err);
    struct store_usage us = {0};
    store_job_usage(s, id, &us, NULL);
    printf("{\"mode\":\"store\",\"events\":%ld,\"seconds\":%.6f,\"per_s\":%.1f,\"batches\":%" PRIu64
           ",\"committed\":%" PRIu64 ",\"dropped\":%" PRIu64 ",\"thinned\":%" PRIu64 ",\"stored\":%" PRId64
           ",\"job_step\":%" PRId64 ",\"job_has_progress\":%s,"
           "\"rank0_step\":%" PRId64 "}\n",
           n, dt, (double)n / dt, st.batches, st.events_committed, st.events_dropped, st.events_thinned,
           us.events, ge == DDPD_OK && j.has_progress ? j.step : (int64_t)-1,
           ge == DDPD_OK && j.has_progress ? "true" : "false",
           ge == DDPD_OK && j.n_ranks > 0 && j.ranks[0].has_progress ? j.ranks[0].step : (int64_t)-1);
    store_job_clear(&j);
    store_close(s);
    for (long i = 0; i < n; i++)
        free(rows[i].body);
    free(rows);
    return 0;
}

static int check(sqlite3 *db, int rc, const char *what)
{
    if (rc != SQLITE_OK && rc != SQLITE_DONE && rc != SQLITE_ROW) {
        fprintf(stderr, "%s: %s\n", what, sqlite3_errmsg(db));
        exit(1);
    }
    return rc;
}

static int run_raw(const char *path, long n, int ranks, int batch)
{
    sqlite3 *db;
    check(NULL, sqlite3_open(path, &db), "open");
    check(db, sqlite3_exec(db, "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;", NULL, NULL, NULL),
          "pragmas");
    check(db, sqlite3_exec(db, store_migration_sql(1, NULL), NULL, NULL, NULL), "schema");
    struct row *rows = make_rows(1, n, ranks);
    sqlite3_stmt *ins, *li, *begin, *commit;
    check(db,
          sqlite3_prepare_v2(db,
                             "INSERT INTO events (job, seq, attempt, kind, rank, body, ts) "
                             "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                             -1, &ins, NULL),
          "prepare");
    check(db,
          sqlite3_prepare_v2(db,
                             "INSERT OR REPLACE INTO loss (job, step, rank, loss) VALUES (?1, ?2, ?3, ?4)",
                             -1, &li, NULL),
          "prepare");
    check(db, sqlite3_prepare_v2(db, "BEGIN IMMEDIATE", -1, &begin, NULL), "prepare");
    check(db, sqlite3_prepare_v2(db, "COMMIT", -1, &commit, NULL), "prepare");

    double t0 = now_s();
    for (long i = 0; i < n; i += batch) {
        check(db, sqlite3_step(begin), "begin");
        sqlite3_reset(begin);
        long end = i + batch < n ? i + batch : n;
        for (long k = i; k < end; k++) {
            const struct event *ev = &rows[k].ev;
            sqlite3_bind_int64(ins, 1, ev->job);
            sqlite3_bind_int64(ins, 2, ev->seq);
            sqlite3_bind_int(ins, 3, (int)ev->attempt);
            sqlite3_bind_text(ins, 4, "loss", -1, SQLITE_STATIC);
            sqlite3_bind_int(ins, 5, ev->rank);
            sqlite3_bind_text(ins, 6, rows[k].body, rows[k].len, SQLITE_STATIC);
            sqlite3_bind_double(ins, 7, ev->ts);
            check(db, sqlite3_step(ins), "insert event");
            sqlite3_reset(ins);
            sqlite3_bind_int64(li, 1, ev->job);
            sqlite3_bind_int64(li, 2, ev->step);
            sqlite3_bind_int(li, 3, ev->rank);
            sqlite3_bind_double(li, 4, ev->loss);
            check(db, sqlite3_step(li), "insert loss");
            sqlite3_reset(li);
        }
        check(db, sqlite3_step(commit), "commit");
        sqlite3_reset(commit);
    }
    double dt = now_s() - t0;
    printf("{\"mode\":\"raw\",\"events\":%ld,\"seconds\":%.6f,\"per_s\":%.1f,\"batch\":%d}\n", n, dt,
           (double)n / dt, batch);
    sqlite3_finalize(ins);
    sqlite3_finalize(li);
    sqlite3_finalize(begin);
    sqlite3_finalize(commit);
    sqlite3_close(db);
    for (long i = 0; i < n; i++)
        free(rows[i].body);
    free(rows);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 4 || (strcmp(argv[1], "store") && strcmp(argv[1], "raw"))) {
        fprintf(stderr, "usage: %s store|raw DB_PATH EVENTS [RANKS] [BATCH] [EVENTS_MAX]\n", argv[0]);
        return 2;
    }
    long n = atol(argv[3]);
    int ranks = argc > 4 ? atoi(argv[4]) : 2;
    int batch = argc > 5 ? atoi(argv[5]) : 1000;
    long events_max = argc > 6 ? atol(argv[6]) : 0;
    if (n < 1 || ranks < 1 || batch < 1 || events_max < 0 || events_max > INT32_MAX) {
        fprintf(stderr, "%s: EVENTS, RANKS and BATCH must be positive, EVENTS_MAX 0 or more\n", argv[0]);
        return 2;
    }
    return !strcmp(argv[1], "store") ? run_store(argv[2], n, ranks, events_max)
                                     : run_raw(argv[2], n, ranks, batch);
}
