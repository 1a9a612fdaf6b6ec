/* store.c — the only code that speaks SQL: migrations, jobs, attempts, ranks, the event
 * log and the loss series in one SQLite database. Knows nothing of HTTP, processes or
 * scheduling. One writer connection (the event writer thread and the callers' other
 * writes take turns under `wmu`), a pool of reader connections for everything else. */
#include "store.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "../base/alloc.h"
#include "../base/clock.h"
#include "../base/file.h"
#include "store_impl.h"

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

/* ---- migrations: schema/migrations/NNN_*.sql, generated into C by the build ---- */

#include "store_migrations.h" /* migrations[]: {name, sql} (cmake/embed_migrations.cmake) */

int store_schema_version(void)
{
    return (int)COUNT(migrations);
}

const char *store_migration_sql(int version, const char **name)
{
    if (version < 1 || version > (int)COUNT(migrations))
        return NULL;
    if (name)
        *name = migrations[version - 1].name;
    return migrations[version - 1].sql;
}

/* ---- small helpers ---- */

/* Waits on `cv` until the CLOCK_MONOTONIC time `deadline_ms` (the condvars of this file
 * are made with that clock). */
static void cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, int64_t deadline_ms)
{
    struct timespec ts = {(time_t)(deadline_ms / 1000), (long)(deadline_ms % 1000) * 1000000L};
    pthread_cond_timedwait(cv, mu, &ts);
}

/* Copies NUL-terminated `src` (NULL = "") into dst[cap], cutting at a UTF-8 character
 * boundary when it does not fit. */
static void copy_text(char *dst, size_t cap, const char *src)
{
    size_t n = src ? strlen(src) : 0;
    if (n >= cap) {
        n = cap - 1;
        while (n > 0 && ((unsigned char)src[n] & 0xC0) == 0x80)
            n--;
    }
    if (n)
        memcpy(dst, src, n);
    dst[n] = '\0';
}

/* Maps an SQLite result to ddpd's errors; the text names the operation and carries
 * SQLite's own message. Call it before any other call on `db` (the message is the last
 * call's). */
static ddpd_err sq_fail(struct ddpd_error *err, sqlite3 *db, int rc, const char *op)
{
    ddpd_err code;
    switch (rc & 0xff) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED: code = DDPD_EBUSY; break;
    case SQLITE_NOMEM: code = DDPD_ENOMEM; break;
    case SQLITE_CONSTRAINT: code = DDPD_ECONFLICT; break;
    case SQLITE_ERROR:
    case SQLITE_MISUSE:
    case SQLITE_RANGE:
    case SQLITE_MISMATCH: code = DDPD_EINTERNAL; break;
    case SQLITE_IOERR:
    case SQLITE_FULL:
        /* The disk, not the request: a client may retry later (503). */
        code = DDPD_EUNAVAIL;
        break;
    default: /* CORRUPT, NOTADB, CANTOPEN, READONLY, PERM, PROTOCOL, ... */ code = DDPD_EIO; break;
    }
    const char *msg = db ? sqlite3_errmsg(db) : sqlite3_errstr(rc), *what = sqlite3_errstr(rc);
    /* Busy or unavailable: say that nothing was written and that a retry may succeed. */
    const char *hint = code == DDPD_EBUSY || code == DDPD_EUNAVAIL
                           ? " (the job store is unavailable for now; retry later)"
                           : "";
    if (strcmp(msg, what) == 0)
        return ddpd_error_set(err, code, "", "store: %s: %s%s", op, msg, hint);
    return ddpd_error_set(err, code, "", "store: %s: %s (%s)%s", op, msg, what, hint);
}

/* ---- connections and their prepared statements ---- */

enum {
    /* writer */
    W_BEGIN,
    W_COMMIT,
    W_ROLLBACK,
    W_EVENT_INSERT,
    W_LOSS_INSERT,
    W_RANK_PROGRESS,
    W_RANK_STEP,
    W_JOB_PROGRESS,
    W_JOB_INSERT,
    W_JOB_STATE,
    W_JOB_UPDATE,
    W_JOB_DELETE,
    W_ATTEMPT_INSERT,
    W_ATTEMPT_END,
    W_RANK_PUT,
    /* readers */
    R_JOB_GET,
    R_JOB_LIST_ALL,
    R_JOB_LIST_ONE,
    R_JOB_LIST_SOME,
    R_RANKS,
    R_EVENTS,
    R_MAX_SEQ,
    R_LOSS_RANGE,
    R_LOSS_SCAN,
    R_LR_SCAN,
    R_EVAL_SCAN,
    R_JOB_COUNT,
    R_PING,
    ST_COUNT
};

#define STR_(x)               #x
#define STR(x)                STR_(x)
#define RESTART_HISTORY_MAX_S STR(STORE_RESTART_HISTORY_MAX)

#define JOB_COLS                                                                                             \
    "id, name, state, CASE WHEN ?9 THEN spec END, world_size, device, created_at, "                          \
    "started_at, finished_at, attempt, step, loss, error, pending_reason, max_restarts, "                    \
    "restarts, restart_history, resumed_from, resume_step, total_steps, resume_force "

static const char *const sql_text[ST_COUNT] = {
    [W_BEGIN] = "BEGIN IMMEDIATE",
    [W_COMMIT] = "COMMIT",
    [W_ROLLBACK] = "ROLLBACK",
    [W_EVENT_INSERT] = "INSERT INTO events (job, seq, attempt, kind, rank, body, ts) "
                       "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    [W_LOSS_INSERT] = "INSERT OR REPLACE INTO loss (job, step, rank, loss) VALUES (?1, ?2, ?3, ?4)",
    [W_RANK_PROGRESS] = "UPDATE ranks SET step = ?4, loss = ?5, samples_per_s = ?6 "
                        "WHERE job = ?1 AND attempt = ?2 AND rank = ?3 "
                        "AND (step IS NULL OR step <= ?4)",
    /* A rank's join and done events: the steps it took, also those it shadowed after it
     * joined (which have no loss events of its own). */
    [W_RANK_STEP] = "UPDATE ranks SET step = ?4 WHERE job = ?1 AND attempt = ?2 AND rank = ?3 "
                    "AND (step IS NULL OR step < ?4)",
    /* The job's loss is the mean over the ranks that reported the step so far; NULL when
     * any of them was not finite. Events of an older attempt leave the job alone. */
    [W_JOB_PROGRESS] = "UPDATE jobs SET step = ?2, loss = (SELECT CASE WHEN count(loss) = "
                       "count(*) THEN avg(loss) END FROM loss WHERE job = ?1 AND step = ?2) "
                       "WHERE id = ?1 AND attempt <= ?3 AND (step IS NULL OR step <= ?2)",
    [W_JOB_INSERT] = "INSERT INTO jobs (name, state, spec, world_size, device, created_at, "
                     "max_restarts, resumed_from, resume_step, total_steps, resume_force) "
                     "VALUES (?1, 'queued', ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
    [W_JOB_STATE] = "SELECT state FROM jobs WHERE id = ?1",
    /* ?2 is the STORE_SET_* mask, ?3 the new state, ?10 now. */
    [W_JOB_UPDATE] =
        "UPDATE jobs SET "
        "state = CASE WHEN ?2 & 1 THEN ?3 ELSE state END, "
        "started_at = CASE WHEN ?2 & 1 AND ?3 IN ('starting', 'running') AND started_at IS NULL "
        "THEN ?10 ELSE started_at END, "
        "finished_at = CASE WHEN NOT ?2 & 1 THEN finished_at "
        "WHEN ?3 IN ('succeeded', 'failed', 'cancelled') THEN coalesce(finished_at, ?10) "
        "ELSE NULL END, "
        "attempt = CASE WHEN ?2 & 2 THEN ?4 ELSE attempt END, "
        "restarts = CASE WHEN ?2 & 4 THEN ?5 ELSE restarts END, "
        "error = CASE WHEN ?2 & 8 THEN ?6 ELSE error END, "
        "pending_reason = CASE WHEN ?2 & 16 THEN ?7 WHEN ?2 & 1 AND ?3 <> 'queued' THEN NULL "
        "ELSE pending_reason END, "
        /* Only another attempt clears the progress: setting the same one again
         * (a retried end after a full disk) keeps what the attempt reported. */
        "step = CASE WHEN ?2 & 32 THEN ?8 WHEN ?2 & 2 AND attempt <> ?4 THEN NULL ELSE step END, "
        "loss = CASE WHEN ?2 & 32 THEN ?9 WHEN ?2 & 2 AND attempt <> ?4 THEN NULL ELSE loss END, "
        "restart_history = CASE WHEN ?2 & 64 AND json_array_length(restart_history) < " RESTART_HISTORY_MAX_S
        " "
        "THEN json_insert(restart_history, '$[#]', json_object('attempt', ?11, 'reason', ?12, "
        "'ts', ?10, 'rank', ?13, 'exit_code', ?14)) ELSE restart_history END "
        "WHERE id = ?1",
    [W_JOB_DELETE] = "DELETE FROM jobs WHERE id = ?1",
    [W_ATTEMPT_INSERT] = "INSERT INTO attempts (job, attempt, comm_id, started_at) "
                         "VALUES (?1, ?2, ?3, ?4)",
    [W_ATTEMPT_END] = "UPDATE attempts SET finished_at = ?3, outcome = ?4 "
                      "WHERE job = ?1 AND attempt = ?2",
    [W_RANK_PUT] = "INSERT INTO ranks (job, attempt, rank, pid, start_time, state, exit_code) "
                   "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) ON CONFLICT (job, attempt, rank) DO "
                   "UPDATE SET pid = excluded.pid, start_time = excluded.start_time, "
                   "state = excluded.state, exit_code = excluded.exit_code",
    [R_JOB_GET] = "SELECT " JOB_COLS "FROM jobs WHERE id = ?1",
    /* Three shapes, so each gets the plan that fits: the primary key backwards, one
     * range of (state, id) backwards, or an IN over the states. */
    [R_JOB_LIST_ALL] = "SELECT " JOB_COLS "FROM jobs WHERE id < ?1 AND (?10 IS NULL OR name = ?10) "
                       "ORDER BY id DESC LIMIT ?8",
    [R_JOB_LIST_ONE] = "SELECT " JOB_COLS "FROM jobs WHERE state = ?2 AND id < ?1 "
                       "AND (?10 IS NULL OR name = ?10) ORDER BY id DESC LIMIT ?8",
    [R_JOB_LIST_SOME] = "SELECT " JOB_COLS "FROM jobs WHERE state IN (?2, ?3, ?4, ?5, ?6, ?7) "
                        "AND id < ?1 AND (?10 IS NULL OR name = ?10) ORDER BY id DESC LIMIT ?8",
    [R_RANKS] = "SELECT attempt, rank, pid, start_time, state, exit_code, step, loss, "
                "samples_per_s FROM ranks WHERE job = ?1 AND attempt = ?2 ORDER BY rank",
    [R_EVENTS] = "SELECT seq, attempt, kind, rank, ts, body FROM events "
                 "WHERE job = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3",
    [R_MAX_SEQ] = "SELECT max(seq) FROM events WHERE job = ?1",
    /* Two subqueries: each min()/max() alone is one index probe; together they would scan. */
    [R_LOSS_RANGE] = "SELECT (SELECT min(step) FROM loss WHERE job = ?1), "
                     "(SELECT max(step) FROM loss WHERE job = ?1)",
    [R_LOSS_SCAN] = "SELECT step, rank, loss FROM loss WHERE job = ?1 ORDER BY step, rank",
    /* The lr each logged step used, from rank 0's loss events (every rank that ran a
     * step used the same); of a step a restart ran again, the latest (SQLite takes the
     * bare columns from the row of max(seq)). */
    [R_LR_SCAN] = "SELECT json_extract(body, '$.step') AS step, json_extract(body, '$.lr'), max(seq) "
                  "FROM events WHERE job = ?1 AND kind = 'loss' AND rank = 0 AND "
                  "json_extract(body, '$.lr') IS NOT NULL GROUP BY step ORDER BY step",
    [R_EVAL_SCAN] = "SELECT body FROM events WHERE job = ?1 AND kind = 'eval' ORDER BY seq",
    [R_JOB_COUNT] = "SELECT state, count(*) FROM jobs GROUP BY state",
    [R_PING] = "SELECT count(*) FROM sqlite_schema",
};

struct conn {
    sqlite3 *db;
    sqlite3_stmt *st[ST_COUNT];
    struct conn *next; /* free list of the reader pool */
};

static void conn_close(struct conn *c)
{
    if (!c)
        return;
    for (int i = 0; i < ST_COUNT; i++)
        sqlite3_finalize(c->st[i]);
    sqlite3_close(c->db);
    free(c);
}

/* Opens one connection with the settings every connection of the store shares. */
static ddpd_err conn_open(const char *path, bool writer, int busy_ms, struct conn **out,
                          struct ddpd_error *err)
{
    ddpd_err e = DDPD_OK;
    struct conn *c = xcalloc(1, sizeof *c);
    int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX | (writer ? SQLITE_OPEN_CREATE : 0);
    int rc = sqlite3_open_v2(path, &c->db, flags, NULL);
    if (rc != SQLITE_OK) {
        e = sq_fail(err, c->db, rc, "open");
        goto out;
    }
    sqlite3_extended_result_codes(c->db, 1);
    sqlite3_busy_timeout(c->db, busy_ms);
    /* synchronous=NORMAL in WAL mode: a commit is durable against a process crash; the
     * WAL is synced at checkpoints, so a power loss can lose only the latest commits. */
    const char *pragmas = writer ? "PRAGMA foreign_keys = ON; PRAGMA synchronous = NORMAL; "
                                   "PRAGMA journal_size_limit = 67108864; "
                                   "PRAGMA cache_size = -16384;"
                                 : "PRAGMA foreign_keys = ON; PRAGMA query_only = ON;";
    rc = sqlite3_exec(c->db, pragmas, NULL, NULL, NULL);
    if (rc != SQLITE_OK)
        e = sq_fail(err, c->db, rc, "set pragmas");
out:
    if (e != DDPD_OK) {
        conn_close(c);
        c = NULL;
    }
    *out = c;
    return e;
}

/* The prepared statement `id` of `c`, reset and unbound, or NULL with `err` set. */
static sqlite3_stmt *stmt(struct conn *c, int id, struct ddpd_error *err)
{
    if (!c->st[id]) {
        int rc = sqlite3_prepare_v3(c->db, sql_text[id], -1, SQLITE_PREPARE_PERSISTENT, &c->st[id], NULL);
        if (rc != SQLITE_OK) {
            sq_fail(err, c->db, rc, "prepare");
            return NULL;
        }
    }
    return c->st[id];
}

static void stmt_done(sqlite3_stmt *st)
{
    if (st) {
        sqlite3_reset(st);
        sqlite3_clear_bindings(st);
    }
}

static void bind_text_or_null(sqlite3_stmt *st, int i, const char *s)
{
    if (s && *s)
        sqlite3_bind_text(st, i, s, -1, SQLITE_TRANSIENT);
    else
        sqlite3_bind_null(st, i);
}

static const char *col_text(sqlite3_stmt *st, int i)
{
    const unsigned char *t = sqlite3_column_text(st, i);
    return t ? (const char *)t : "";
}

/* ---- the store ---- */

/* One queued event: what the writer needs of it, and its body. */
struct qev {
    int64_t job, seq, step;
    int attempt, rank;
    event_kind kind;
    bool loss_finite;
    double ts, loss, samples_per_s;
    char *body; /* owned */
    size_t len;
    int64_t t_ms; /* when it was queued (monotonic) */
    bool stored;  /* set by the writer: the row went in */
};

struct store {
    char *path;
    struct store_opts o;

    /* The writer connection: the writer thread and the synchronous writes take turns. */
    pthread_mutex_t wmu;
    struct conn *w;

    /* Reader pool. */
    pthread_mutex_t rmu;
    pthread_cond_t rcv;
    struct conn *rfree;
    int ropen;

    /* Event queue: a ring of queue_max entries, and the writer thread. */
    pthread_mutex_t qmu;
    pthread_cond_t qcv;      /* the writer waits here: events, a flush, stop */
    pthread_cond_t space_cv; /* appenders wait here for room */
    pthread_cond_t done_cv;  /* flushers wait here for `done` */
    struct qev *q;
    int qhead, qn;
    size_t qbytes;
    uint64_t appended, taken, done; /* events accepted, taken by the writer, finished */
    uint64_t flush_req;             /* a flusher waits for done >= this */
    bool stop;
    pthread_t thread;
    bool thread_started;
    struct store_stats st; /* counters (queued is filled in on read) */
    bool werr_set;         /* a writer error not yet reported by store_flush */
    struct ddpd_error werr;

    /* Job inserts waiting for the inserter thread's next group commit. */
    pthread_mutex_t imu;
    pthread_cond_t icv; /* the inserter waits here: inserts, stop */
    struct insert_req *ihead, **itail;
    bool istop;
    pthread_t inserter;
    bool inserter_started;

    /* PRAGMA quick_check at open: what store_ping reports when it failed. */
    bool corrupt;
    struct ddpd_error corrupt_err;

    /* store_job_version: a change counter per hash bucket of job ids, bumped after every
     * commit that touches a job (so colliding ids only cost a cache miss). */
    _Atomic uint64_t jver[STORE_JOB_VERSIONS];
};

/* After the commit, never before: a reader that sees the new version then reads data at
 * least as new as that commit. */
static void job_changed(struct store *s, int64_t id)
{
    atomic_fetch_add_explicit(&s->jver[(uint64_t)id % STORE_JOB_VERSIONS], 1, memory_order_release);
}

uint64_t store_job_version(struct store *s, int64_t id)
{
    return atomic_load_explicit(&s->jver[(uint64_t)id % STORE_JOB_VERSIONS], memory_order_acquire);
}

/* ---- reader pool ---- */

static struct conn *reader_get(struct store *s, struct ddpd_error *err)
{
    struct conn *c = NULL;
    pthread_mutex_lock(&s->rmu);
    while (!s->rfree && s->ropen >= s->o.readers)
        pthread_cond_wait(&s->rcv, &s->rmu);
    if (s->rfree) {
        c = s->rfree;
        s->rfree = c->next;
        pthread_mutex_unlock(&s->rmu);
        return c;
    }
    s->ropen++;
    pthread_mutex_unlock(&s->rmu);
    if (conn_open(s->path, false, s->o.busy_timeout_ms, &c, err) != DDPD_OK) {
        pthread_mutex_lock(&s->rmu);
        s->ropen--;
        pthread_cond_signal(&s->rcv);
        pthread_mutex_unlock(&s->rmu);
        return NULL;
    }
    return c;
}

static void reader_put(struct store *s, struct conn *c)
{
    if (!c)
        return;
    pthread_mutex_lock(&s->rmu);
    c->next = s->rfree;
    s->rfree = c;
    pthread_cond_signal(&s->rcv);
    pthread_mutex_unlock(&s->rmu);
}

/* A reader with a read transaction open, so that all it reads is from one moment; NULL
 * with *e set when there is none. read_end ends the transaction and gives it back. */
static struct conn *read_begin(struct store *s, struct ddpd_error *err, ddpd_err *e)
{
    struct conn *c = reader_get(s, err);
    if (!c) {
        *e = err ? err->code : DDPD_EIO;
        return NULL;
    }
    int rc = sqlite3_exec(c->db, "BEGIN", NULL, NULL, NULL);
    if (rc != SQLITE_OK) {
        *e = sq_fail(err, c->db, rc, "begin read");
        reader_put(s, c);
        return NULL;
    }
    return c;
}

static void read_end(struct store *s, struct conn *c)
{
    sqlite3_exec(c->db, "COMMIT", NULL, NULL, NULL);
    reader_put(s, c);
}

/* ---- writer transactions ---- */

static int step_simple(struct conn *c, int id)
{
    sqlite3_stmt *st = stmt(c, id, NULL);
    if (!st)
        return SQLITE_ERROR;
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

/* Ends the writer's open transaction, if any, without changes. */
static void rollback(struct conn *c)
{
    if (!sqlite3_get_autocommit(c->db))
        step_simple(c, W_ROLLBACK);
}

/* Takes the writer connection and opens a write transaction. On success the caller
 * holds wmu and ends with wtx_end. */
static ddpd_err wtx_begin(struct store *s, struct ddpd_error *err)
{
    pthread_mutex_lock(&s->wmu);
    int rc = step_simple(s->w, W_BEGIN);
    if (rc != SQLITE_OK) {
        ddpd_err e = sq_fail(err, s->w->db, rc, "begin");
        pthread_mutex_unlock(&s->wmu);
        return e;
    }
    return DDPD_OK;
}

/* Commits when e is DDPD_OK (returning the commit's error, if any), else rolls back;
 * releases the writer connection. */
static ddpd_err wtx_end(struct store *s, ddpd_err e, struct ddpd_error *err)
{
    if (e == DDPD_OK) {
        int rc = step_simple(s->w, W_COMMIT);
        if (rc != SQLITE_OK)
            e = sq_fail(err, s->w->db, rc, "commit");
    }
    if (e != DDPD_OK)
        rollback(s->w);
    pthread_mutex_unlock(&s->wmu);
    return e;
}

/* ---- the event writer ---- */

static int cmp_loss_rank(const void *a, const void *b)
{
    const struct qev *x = *(const struct qev *const *)a, *y = *(const struct qev *const *)b;
    if (x->job != y->job)
        return x->job < y->job ? -1 : 1;
    if (x->attempt != y->attempt)
        return x->attempt < y->attempt ? -1 : 1;
    if (x->rank != y->rank)
        return x->rank < y->rank ? -1 : 1;
    if (x->step != y->step)
        return x->step < y->step ? -1 : 1;
    return 0;
}

static void bind_loss(sqlite3_stmt *st, int i, const struct qev *q)
{
    if (q->loss_finite)
        sqlite3_bind_double(st, i, q->loss);
    else
        sqlite3_bind_null(st, i);
}

/* After the rows of a batch: each rank's latest loss, once per rank, and each job's
 * latest step (its loss is read back from the series), once per job. */
static int batch_progress(struct conn *c, struct qev **loss, int n)
{
    qsort(loss, (size_t)n, sizeof *loss, cmp_loss_rank);
    sqlite3_stmt *rk = stmt(c, W_RANK_PROGRESS, NULL), *jb = stmt(c, W_JOB_PROGRESS, NULL);
    if (!rk || !jb)
        return SQLITE_ERROR;
    int rc = SQLITE_OK;
    for (int i = 0; i < n && rc == SQLITE_OK; i++) {
        const struct qev *q = loss[i];
        bool last_of_rank = i + 1 == n || loss[i + 1]->job != q->job || loss[i + 1]->attempt != q->attempt ||
                            loss[i + 1]->rank != q->rank;
        if (last_of_rank) {
            sqlite3_bind_int64(rk, 1, q->job);
            sqlite3_bind_int(rk, 2, q->attempt);
            sqlite3_bind_int(rk, 3, q->rank);
            sqlite3_bind_int64(rk, 4, q->step);
            bind_loss(rk, 5, q);
            sqlite3_bind_double(rk, 6, q->samples_per_s);
            rc = sqlite3_step(rk);
            rc = rc == SQLITE_DONE ? SQLITE_OK : rc;
            sqlite3_reset(rk);
        }
        if (rc != SQLITE_OK || (i + 1 < n && loss[i + 1]->job == q->job))
            continue;
        /* The last of this job: the latest (attempt, step) among its ranks. */
        const struct qev *best = q;
        for (int k = i; k >= 0 && loss[k]->job == q->job; k--)
            if (loss[k]->attempt > best->attempt ||
                (loss[k]->attempt == best->attempt && loss[k]->step > best->step))
                best = loss[k];
        sqlite3_bind_int64(jb, 1, best->job);
        sqlite3_bind_int64(jb, 2, best->step);
        sqlite3_bind_int(jb, 3, best->attempt);
        rc = sqlite3_step(jb);
        rc = rc == SQLITE_DONE ? SQLITE_OK : rc;
        sqlite3_reset(jb);
    }
    return rc;
}

/* After the loss progress of a batch: the step of each rank that joined or is done (a
 * done event's `steps`), which may be past its last loss step. */
static int batch_rank_steps(struct conn *c, const struct qev *b, int n)
{
    sqlite3_stmt *st = NULL;
    for (int i = 0; i < n; i++) {
        const struct qev *q = &b[i];
        if (!q->stored || q->rank < 0 || q->step <= 0 || (q->kind != EVENT_DONE && q->kind != EVENT_JOIN))
            continue;
        if (!st && !(st = stmt(c, W_RANK_STEP, NULL)))
            return SQLITE_ERROR;
        sqlite3_bind_int64(st, 1, q->job);
        sqlite3_bind_int(st, 2, q->attempt);
        sqlite3_bind_int(st, 3, q->rank);
        sqlite3_bind_int64(st, 4, q->step);
        int rc = sqlite3_step(st);
        sqlite3_reset(st);
        if (rc != SQLITE_DONE)
            return rc;
    }
    return SQLITE_OK;
}

/* One try at committing a batch. Rows that a constraint refuses (deleted job, seq taken)
 * are left out and counted; any other error fails the whole try (rolled back). */
static ddpd_err batch_try(struct store *s, struct qev *b, int n, struct qev **loss, uint64_t *refused,
                          struct ddpd_error *rowerr, struct ddpd_error *err)
{
    struct conn *c = s->w;
    ddpd_err e = DDPD_OK;
    int nloss = 0;
    *refused = 0;
    int rc = step_simple(c, W_BEGIN);
    if (rc != SQLITE_OK)
        return sq_fail(err, c->db, rc, "begin event batch");
    sqlite3_stmt *ins = stmt(c, W_EVENT_INSERT, err), *li = stmt(c, W_LOSS_INSERT, err);
    if (!ins || !li) {
        e = err ? err->code : DDPD_EINTERNAL;
        goto out;
    }
    for (int i = 0; i < n; i++) {
        struct qev *q = &b[i];
        q->stored = false;
        sqlite3_bind_int64(ins, 1, q->job);
        sqlite3_bind_int64(ins, 2, q->seq);
        sqlite3_bind_int(ins, 3, q->attempt);
        sqlite3_bind_text(ins, 4, event_kind_name(q->kind), -1, SQLITE_STATIC);
        if (q->rank >= 0)
            sqlite3_bind_int(ins, 5, q->rank);
        else
            sqlite3_bind_null(ins, 5);
        sqlite3_bind_text(ins, 6, q->body, (int)q->len, SQLITE_STATIC);
        sqlite3_bind_double(ins, 7, q->ts);
        rc = sqlite3_step(ins);
        if (rc == SQLITE_DONE) {
            q->stored = true;
        } else if ((rc & 0xff) == SQLITE_CONSTRAINT) {
            if (*refused == 0)
                ddpd_error_set(rowerr, DDPD_ECONFLICT, "", "store: event %lld of job %lld refused: %s",
                               (long long)q->seq, (long long)q->job, sqlite3_errmsg(c->db));
            ++*refused;
        } else {
            e = sq_fail(err, c->db, rc, "insert event");
            sqlite3_reset(ins);
            goto out;
        }
        sqlite3_reset(ins);
        if (!q->stored || q->kind != EVENT_LOSS || q->rank < 0)
            continue;
        sqlite3_bind_int64(li, 1, q->job);
        sqlite3_bind_int64(li, 2, q->step);
        sqlite3_bind_int(li, 3, q->rank);
        bind_loss(li, 4, q);
        rc = sqlite3_step(li);
        if (rc != SQLITE_DONE) {
            e = sq_fail(err, c->db, rc, "insert loss");
            sqlite3_reset(li);
            goto out;
        }
        sqlite3_reset(li);
        loss[nloss++] = q;
    }
    rc = batch_progress(c, loss, nloss);
    if (rc == SQLITE_OK)
        rc = batch_rank_steps(c, b, n);
    if (rc != SQLITE_OK) {
        e = sq_fail(err, c->db, rc, "update progress");
        goto out;
    }
    rc = step_simple(c, W_COMMIT);
    if (rc != SQLITE_OK)
        e = sq_fail(err, c->db, rc, "commit event batch");
out:
    if (e != DDPD_OK)
        rollback(c);
    return e;
}

/* Commits a batch, retrying a failed try twice (a disk that is briefly full, a lock held
 * by another process beyond busy_timeout); after that the batch is dropped and the error
 * kept for store_flush. Frees the bodies. */
static void batch_commit(struct store *s, struct qev *b, int n, struct qev **loss)
{
    struct ddpd_error e1, rowerr;
    uint64_t refused = 0;
    ddpd_err e = DDPD_OK;
    ddpd_error_clear(&rowerr);
    for (int tries = 0;; tries++) {
        pthread_mutex_lock(&s->wmu);
        e = batch_try(s, b, n, loss, &refused, &rowerr, &e1);
        pthread_mutex_unlock(&s->wmu);
        if (e == DDPD_OK || tries == 2)
            break;
        base_sleep_s((double)(50 << tries) / 1000);
    }
    for (int i = 0; i < n; i++) {
        if (i == 0 || b[i].job != b[i - 1].job)
            job_changed(s, b[i].job);
        free(b[i].body);
    }
    pthread_mutex_lock(&s->qmu);
    if (e == DDPD_OK) {
        s->st.batches++;
        s->st.events_committed += (uint64_t)n - refused;
        s->st.events_dropped += refused;
        if (refused && !s->werr_set) {
            s->werr = rowerr;
            s->werr_set = true;
        }
    } else {
        s->st.events_dropped += (uint64_t)n;
        if (!s->werr_set) {
            s->werr = e1;
            s->werr_set = true;
        }
        fprintf(stderr, "ddpd: store: dropped %d events: %s\n", n, e1.message);
    }
    pthread_mutex_unlock(&s->qmu);
}

static void *inserter_main(void *arg);

static void *writer_main(void *arg)
{
    struct store *s = arg;
    pthread_setname_np(pthread_self(), "ddpd-events");
    struct qev *b = xcalloc((size_t)s->o.batch_max, sizeof *b);
    struct qev **loss = xcalloc((size_t)s->o.batch_max, sizeof *loss);
    int cap = s->o.queue_max;
    pthread_mutex_lock(&s->qmu);
    for (;;) {
        while (s->qn == 0 && !s->stop)
            pthread_cond_wait(&s->qcv, &s->qmu);
        if (s->qn == 0)
            break; /* stopping, and nothing is left */
        /* Linger for a fuller batch, unless someone waits for these events. */
        int64_t deadline = s->q[s->qhead].t_ms + s->o.linger_ms;
        while (!s->stop && s->qn < s->o.batch_max && s->flush_req <= s->taken && base_mono_ms() < deadline)
            cond_wait_until(&s->qcv, &s->qmu, deadline);
        int n = s->qn < s->o.batch_max ? s->qn : s->o.batch_max;
        for (int i = 0; i < n; i++) {
            struct qev *q = &s->q[(s->qhead + i) % cap];
            b[i] = *q;
            s->qbytes -= q->len;
            q->body = NULL;
        }
        s->qhead = (s->qhead + n) % cap;
        s->qn -= n;
        s->taken += (uint64_t)n;
        pthread_cond_broadcast(&s->space_cv);
        pthread_mutex_unlock(&s->qmu);

        batch_commit(s, b, n, loss);

        pthread_mutex_lock(&s->qmu);
        s->done += (uint64_t)n;
        pthread_cond_broadcast(&s->done_cv);
    }
    pthread_mutex_unlock(&s->qmu);
    free(loss);
    free(b);
    return NULL;
}

/* Waits until every event accepted so far is finished (committed or dropped). */
static void drain(struct store *s)
{
    pthread_mutex_lock(&s->qmu);
    uint64_t target = s->appended;
    if (s->flush_req < target) {
        s->flush_req = target;
        pthread_cond_signal(&s->qcv);
    }
    while (s->done < target)
        pthread_cond_wait(&s->done_cv, &s->qmu);
    pthread_mutex_unlock(&s->qmu);
}

ddpd_err store_flush(struct store *s, struct ddpd_error *err)
{
    drain(s);
    ddpd_err e = DDPD_OK;
    pthread_mutex_lock(&s->qmu);
    if (s->werr_set) {
        e = s->werr.code;
        if (err)
            *err = s->werr;
        s->werr_set = false;
    }
    pthread_mutex_unlock(&s->qmu);
    return e;
}

ddpd_err store_event_append(struct store *s, const struct event *ev, const char *body, size_t len,
                            struct ddpd_error *err)
{
    char line[EVENT_LINE_MAX];
    if (!ev->has_server_fields || ev->job <= 0 || ev->seq <= 0)
        return ddpd_error_set(err, DDPD_EINTERNAL, "",
                              "store: an event needs the server's job, attempt and seq");
    if (!body) {
        int n = event_encode(ev, line, sizeof line);
        if (n < 0)
            return ddpd_error_set(err, DDPD_ETOOBIG, "", "store: event does not encode");
        body = line;
        len = (size_t)n;
    }
    if (len >= EVENT_LINE_MAX)
        return ddpd_error_set(err, DDPD_ETOOBIG, "", "store: event body of %zu bytes exceeds %d", len,
                              EVENT_LINE_MAX - 1);

    struct qev q = {
        .job = ev->job,
        .seq = ev->seq,
        .step = ev->kind == EVENT_DONE ? ev->steps : ev->step,
        .attempt = (int)ev->attempt,
        .rank = ev->kind == EVENT_STATE ? -1 : ev->rank,
        .kind = ev->kind,
        .loss_finite = !ev->nonfinite && isfinite(ev->loss),
        .ts = ev->ts,
        .loss = ev->loss,
        .samples_per_s = ev->samples_per_s,
        .len = len,
    };
    q.body = xmalloc(len + 1);
    memcpy(q.body, body, len);
    q.body[len] = '\0';

    pthread_mutex_lock(&s->qmu);
    q.t_ms = base_mono_ms();
    int64_t deadline = q.t_ms + s->o.append_wait_ms;
    while ((s->qn >= s->o.queue_max || s->qbytes + len > s->o.queue_max_bytes) && s->qn > 0) {
        if (base_mono_ms() >= deadline) {
            s->st.events_rejected++;
            pthread_mutex_unlock(&s->qmu);
            free(q.body);
            return ddpd_error_set(err, DDPD_EBUSY, "",
                                  "store: event queue full for %d ms (the database is slow); "
                                  "event %lld of job %lld not stored",
                                  s->o.append_wait_ms, (long long)ev->seq, (long long)ev->job);
        }
        cond_wait_until(&s->space_cv, &s->qmu, deadline);
    }
    s->q[(s->qhead + s->qn) % s->o.queue_max] = q;
    s->qn++;
    s->qbytes += len;
    s->appended++;
    s->st.events_appended++;
    if (s->qn == 1 || s->qn >= s->o.batch_max)
        pthread_cond_signal(&s->qcv);
    pthread_mutex_unlock(&s->qmu);
    return DDPD_OK;
}

void store_stats_get(struct store *s, struct store_stats *out)
{
    pthread_mutex_lock(&s->qmu);
    *out = s->st;
    out->queued = (size_t)s->qn;
    pthread_mutex_unlock(&s->qmu);
}

/* ---- open and close ---- */

static int user_version(sqlite3 *db, int *v)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &st, NULL);
    if (rc == SQLITE_OK) {
        rc = sqlite3_step(st);
        if (rc == SQLITE_ROW) {
            *v = sqlite3_column_int(st, 0);
            rc = SQLITE_OK;
        }
    }
    sqlite3_finalize(st);
    return rc;
}

static ddpd_err too_new(const char *path, int v, struct ddpd_error *err)
{
    return ddpd_error_set(err, DDPD_ECONFLICT, path,
                          "store: %s has schema version %d, but this ddpd knows versions up to "
                          "%d: it was written by a newer ddpd; run that one, or move the "
                          "database aside",
                          path, v, store_schema_version());
}

/* Applies the migrations above the database's user_version, each in its own
 * transaction that also sets user_version (so a crash leaves a whole version). */
static ddpd_err migrate(struct store *s, sqlite3 *db, struct ddpd_error *err)
{
    char op[96];
    int v = 0;
    int rc = user_version(db, &v);
    if (rc != SQLITE_OK)
        return sq_fail(err, db, rc, "read user_version");
    if (v > store_schema_version())
        return too_new(s->path, v, err);
    if (v < 0) /* PRAGMA user_version is any 32-bit integer; ddpd's are 0 and up */
        return ddpd_error_set(err, DDPD_ECONFLICT, s->path,
                              "store: %s has schema version %d, which no ddpd writes: it is not a "
                              "ddpd database; move it aside or give --db another path",
                              s->path, v);
    for (int ver = v + 1; ver <= store_schema_version(); ver++) {
        snprintf(op, sizeof op, "migration %s", migrations[ver - 1].name);
        rc = sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL);
        if (rc != SQLITE_OK)
            return sq_fail(err, db, rc, op);
        /* Another process may have migrated meanwhile: look again under the lock. */
        rc = user_version(db, &v);
        if (rc == SQLITE_OK && v >= ver) {
            sqlite3_exec(db, "COMMIT", NULL, NULL, NULL);
            if (v > store_schema_version())
                return too_new(s->path, v, err);
            ver = v;
            continue;
        }
        char setv[48];
        snprintf(setv, sizeof setv, "PRAGMA user_version = %d", ver);
        if (rc == SQLITE_OK)
            rc = sqlite3_exec(db, migrations[ver - 1].sql, NULL, NULL, NULL);
        if (rc == SQLITE_OK)
            rc = sqlite3_exec(db, setv, NULL, NULL, NULL);
        if (rc == SQLITE_OK)
            rc = sqlite3_exec(db, "COMMIT", NULL, NULL, NULL);
        if (rc != SQLITE_OK) {
            ddpd_err e = sq_fail(err, db, rc, op);
            if (!sqlite3_get_autocommit(db))
                sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
            return e;
        }
    }
    return DDPD_OK;
}

/* PRAGMA quick_check: every page of the file is read and its b-tree structure checked (not
 * the indexes against their tables: that is integrity_check, far slower). A database whose
 * interior pages are damaged reads fine until a query reaches them; found here, it is
 * what store_ping (so /healthz) says from the start, and it is said on stderr. */
static void quick_check(struct store *s)
{
    sqlite3_stmt *st = NULL;
    char first[512] = "";
    int problems = 0;
    int rc = sqlite3_prepare_v2(s->w->db, "PRAGMA quick_check(20)", -1, &st, NULL);
    while (rc == SQLITE_OK && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        /* A row may hold several lines ("*** in database main ***\nOn tree page 7 ..."). */
        for (const char *line = col_text(st, 0); *line;) {
            size_t n = strcspn(line, "\n");
            if (strncmp(line, "ok", n > 2 ? n : 2) != 0 && strncmp(line, "***", 3) != 0 && problems++ == 0)
                snprintf(first, sizeof first, "%.*s", (int)(n < sizeof first ? n : sizeof first - 1), line);
            line += n + (line[n] == '\n');
        }
        rc = SQLITE_OK;
    }
    if (rc != SQLITE_DONE && rc != SQLITE_OK && !problems++) /* the check itself met the damage */
        snprintf(first, sizeof first, "%s (%s)", sqlite3_errmsg(s->w->db), sqlite3_errstr(rc));
    sqlite3_finalize(st);
    if (!problems)
        return;
    s->corrupt = true;
    ddpd_error_set(&s->corrupt_err, DDPD_EIO, s->path,
                   "store: %s failed its quick check at start: %s%s; the database is damaged: stop the "
                   "server, move the file aside and restore a backup (sqlite3 .recover saves what it can)",
                   s->path, first, problems > 1 ? " (and more problems)" : "");
    fprintf(stderr, "ddpd: %s\n", s->corrupt_err.message);
}

/* A database made by an older ddpd (0644, its WAL and SHM too) loses the group's and
 * others' permissions: what an upgrade keeps must not stay readable by everyone. Only
 * files this user owns; a failure is left to the administrator (no error). */
static void make_private(const char *path)
{
    static const char *const sfx[] = {"", "-wal", "-shm"};
    for (size_t i = 0; i < COUNT(sfx); i++) {
        char f[PATH_MAX];
        struct stat st;
        if (snprintf(f, sizeof f, "%s%s", path, sfx[i]) >= (int)sizeof f || lstat(f, &st) != 0 ||
            !S_ISREG(st.st_mode) || st.st_uid != geteuid() || !(st.st_mode & 077))
            continue;
        if (chmod(f, st.st_mode & 0700) == 0)
            fprintf(stderr, "ddpd: store: %s was readable by others (mode %03o): now %03o\n", f,
                    (unsigned)(st.st_mode & 0777), (unsigned)(st.st_mode & 0700));
    }
}

struct store *store_open(const char *path, struct ddpd_error *err)
{
    return store_open_with(path, NULL, err);
}

struct store *store_open_with(const char *path, const struct store_opts *opts, struct ddpd_error *err)
{
    ddpd_err e = DDPD_OK;
    struct store *s = NULL;
    if (!path || !*path || strcmp(path, ":memory:") == 0 || strncmp(path, "file:", 5) == 0) {
        ddpd_error_set(err, DDPD_EINTERNAL, path ? path : "", "store: the database must be a file name");
        return NULL;
    }
    int en = base_mkdirs(path, false);
    if (en) {
        ddpd_error_set(err, DDPD_EIO, path, "store: cannot create the folders of %s: %s", path, strerror(en));
        return NULL;
    }

    /* Created here, not by SQLite (0644): jobs' specs and events are their users' own.
     * The WAL and the shared-memory file take the database's mode. */
    int dbfd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (dbfd >= 0)
        close(dbfd); /* else SQLite's open below says why */
    make_private(path);

    s = xcalloc(1, sizeof *s);
    s->path = xstrdup(path);
    if (opts)
        s->o = *opts;
    if (s->o.batch_max <= 0)
        s->o.batch_max = 1000;
    if (s->o.linger_ms <= 0)
        s->o.linger_ms = 50;
    if (s->o.queue_max <= 0)
        s->o.queue_max = 65536;
    if (s->o.queue_max < s->o.batch_max)
        s->o.queue_max = s->o.batch_max;
    if (s->o.queue_max_bytes == 0)
        s->o.queue_max_bytes = (size_t)64 << 20;
    if (s->o.append_wait_ms <= 0)
        s->o.append_wait_ms = 1000;
    if (s->o.readers <= 0)
        s->o.readers = 8;
    if (s->o.busy_timeout_ms <= 0)
        s->o.busy_timeout_ms = 5000;
    pthread_mutex_init(&s->wmu, NULL);
    pthread_mutex_init(&s->imu, NULL);
    pthread_cond_init(&s->icv, NULL);
    s->itail = &s->ihead;
    pthread_mutex_init(&s->rmu, NULL);
    pthread_mutex_init(&s->qmu, NULL);
    pthread_cond_init(&s->rcv, NULL);
    base_cond_init_mono(&s->qcv);
    base_cond_init_mono(&s->space_cv);
    pthread_cond_init(&s->done_cv, NULL);
    s->q = xcalloc((size_t)s->o.queue_max, sizeof *s->q);

    e = conn_open(path, true, s->o.busy_timeout_ms, &s->w, err);
    if (e != DDPD_OK)
        goto out;
    /* Refuse a newer database before changing anything in it. */
    int v = 0;
    int rc = user_version(s->w->db, &v);
    if (rc != SQLITE_OK) {
        e = sq_fail(err, s->w->db, rc, "read user_version");
        goto out;
    }
    if (v > store_schema_version()) {
        e = too_new(path, v, err);
        goto out;
    }
    sqlite3_stmt *st = NULL;
    rc = sqlite3_prepare_v2(s->w->db, "PRAGMA journal_mode = WAL", -1, &st, NULL);
    if (rc == SQLITE_OK && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        if (strcmp(col_text(st, 0), "wal") != 0) {
            e = ddpd_error_set(err, DDPD_EIO, path, "store: %s cannot use WAL (journal mode %s)", path,
                               col_text(st, 0));
            sqlite3_finalize(st);
            goto out;
        }
        rc = SQLITE_OK;
    }
    if (rc != SQLITE_OK) {
        e = sq_fail(err, s->w->db, rc, "set WAL");
        sqlite3_finalize(st);
        goto out;
    }
    sqlite3_finalize(st);
    e = migrate(s, s->w->db, err);
    if (e != DDPD_OK)
        goto out;
    quick_check(s);
    if (pthread_create(&s->thread, NULL, writer_main, s) != 0) {
        e = ddpd_error_set(err, DDPD_EINTERNAL, path, "store: cannot start the writer thread");
        goto out;
    }
    s->thread_started = true;
    if (pthread_create(&s->inserter, NULL, inserter_main, s) != 0) {
        e = ddpd_error_set(err, DDPD_EINTERNAL, path, "store: cannot start the inserter thread");
        goto out;
    }
    s->inserter_started = true;
out:
    if (e != DDPD_OK) {
        if (err && !err->path[0])
            copy_text(err->path, sizeof err->path, path);
        store_close(s);
        return NULL;
    }
    return s;
}

void store_close(struct store *s)
{
    if (!s)
        return;
    if (s->inserter_started) { /* it commits what is queued before it ends */
        pthread_mutex_lock(&s->imu);
        s->istop = true;
        pthread_cond_signal(&s->icv);
        pthread_mutex_unlock(&s->imu);
        pthread_join(s->inserter, NULL);
    }
    if (s->thread_started) {
        pthread_mutex_lock(&s->qmu);
        s->stop = true;
        pthread_cond_signal(&s->qcv);
        pthread_mutex_unlock(&s->qmu);
        pthread_join(s->thread, NULL);
    }
    for (int i = 0; i < s->qn; i++) /* only when the writer never started */
        free(s->q[(s->qhead + i) % s->o.queue_max].body);
    while (s->rfree) {
        struct conn *c = s->rfree;
        s->rfree = c->next;
        conn_close(c);
    }
    conn_close(s->w);
    pthread_cond_destroy(&s->done_cv);
    pthread_cond_destroy(&s->icv);
    pthread_mutex_destroy(&s->imu);
    pthread_cond_destroy(&s->space_cv);
    pthread_cond_destroy(&s->qcv);
    pthread_cond_destroy(&s->rcv);
    pthread_mutex_destroy(&s->qmu);
    pthread_mutex_destroy(&s->rmu);
    pthread_mutex_destroy(&s->wmu);
    free(s->q);
    free(s->path);
    free(s);
}

/* ---- one server per database ---- */

struct store_lock {
    int fd;
};

struct store_lock *store_lock_take(const char *path, struct ddpd_error *err)
{
    char lp[PATH_MAX];
    struct store_lock *l = NULL;
    int fd = -1;
    if (!path || !*path || snprintf(lp, sizeof lp, "%s.lock", path) >= (int)sizeof lp) {
        ddpd_error_set(err, DDPD_EIO, path ? path : "", "store: no lock file name for database '%s'",
                       path ? path : "");
        goto out;
    }
    int en = base_mkdirs(path, false);
    if (en) {
        ddpd_error_set(err, DDPD_EIO, path, "store: cannot create the folders of %s: %s", path, strerror(en));
        goto out;
    }
    fd = open(lp, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
        ddpd_error_set(err, DDPD_EIO, lp, "store: cannot open the lock file %s: %s", lp, strerror(errno));
        goto out;
    }
    /* flock: held by the open file, released by the kernel however this process ends
     * (SIGKILL included), never by closing another descriptor of the same file. */
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        if (errno != EWOULDBLOCK) {
            ddpd_error_set(err, DDPD_EIO, lp, "store: cannot lock %s: %s", lp, strerror(errno));
            goto out;
        }
        char buf[32];
        ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
        buf[n > 0 ? n : 0] = '\0';
        char *end;
        long pid = strtol(buf, &end, 10);
        if (end != buf && pid > 0)
            ddpd_error_set(err, DDPD_ECONFLICT, path,
                           "store: the database %s is in use by another ddpd server (pid %ld holds %s): "
                           "stop that server first, or give this one another --db",
                           path, pid, lp);
        else
            ddpd_error_set(err, DDPD_ECONFLICT, path,
                           "store: the database %s is in use by another ddpd server (it holds %s): stop "
                           "that server first, or give this one another --db",
                           path, lp);
        goto out;
    }
    char pid[32];
    int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)n, 0) != n) {
        ddpd_error_set(err, DDPD_EIO, lp, "store: cannot write %s: %s", lp, strerror(errno));
        goto out;
    }
    l = xmalloc(sizeof *l);
    l->fd = fd;
    fd = -1;
out:
    if (fd >= 0)
        close(fd);
    return l;
}

void store_lock_release(struct store_lock *l)
{
    if (!l)
        return;
    close(l->fd); /* the lock goes with it; the file stays (its pid is only a hint) */
    free(l);
}

/* ---- jobs: writes ---- */

/* One job insert waiting for its group's commit. */
struct insert_req {
    struct store_job_new job; /* its strings are the caller's until done runs */
    double now;
    int64_t id;
    ddpd_err e;
    struct ddpd_error err;
    store_insert_done_fn done;
    void *ctx;
    struct insert_req *next;
};

/* The row an insert stored, as store_job_get reads it back (spec borrowed from r). */
static void job_of_insert(const struct insert_req *r, struct store_job *j)
{
    *j = (struct store_job){.id = r->id,
                            .state = JOB_STATE_QUEUED,
                            .spec = (char *)r->job.spec,
                            .world_size = r->job.world_size,
                            .device = r->job.device,
                            .created_at = r->now,
                            .max_restarts = r->job.max_restarts,
                            .resumed_from = r->job.resumed_from,
                            .resume_step = r->job.resume_step,
                            .resume_force = r->job.resume_force,
                            .total_steps = r->job.total_steps};
    snprintf(j->name, sizeof j->name, "%s", r->job.name ? r->job.name : "");
}

void store_job_queued_event(int64_t id, double created_at, struct event *ev)
{
    memset(ev, 0, sizeof *ev);
    ev->kind = EVENT_STATE;
    ev->rank = -1;
    snprintf(ev->state, sizeof ev->state, "%s", job_state_name(JOB_STATE_QUEUED));
    ev->has_server_fields = true;
    ev->job = id;
    ev->attempt = 0;
    ev->seq = 1;
    ev->ts = created_at;
}

/* The job's `queued` event, in its insert's transaction. Any failure fails the group: a
 * job is never stored without it. */
static ddpd_err insert_queued_event(struct store *s, struct insert_req *r)
{
    struct event ev;
    char body[EVENT_LINE_MAX];
    store_job_queued_event(r->id, r->now, &ev);
    int n = event_encode(&ev, body, sizeof body);
    if (n < 0)
        return ddpd_error_set(&r->err, DDPD_EINTERNAL, "", "store: cannot encode job %lld's queued event",
                              (long long)r->id);
    sqlite3_stmt *st = stmt(s->w, W_EVENT_INSERT, &r->err);
    if (!st)
        return r->err.code == DDPD_EINTERNAL ? DDPD_EIO : r->err.code;
    sqlite3_bind_int64(st, 1, ev.job);
    sqlite3_bind_int64(st, 2, ev.seq);
    sqlite3_bind_int(st, 3, ev.attempt);
    sqlite3_bind_text(st, 4, event_kind_name(ev.kind), -1, SQLITE_STATIC);
    sqlite3_bind_null(st, 5);
    sqlite3_bind_text(st, 6, body, n, SQLITE_STATIC);
    sqlite3_bind_double(st, 7, ev.ts);
    int rc = sqlite3_step(st);
    ddpd_err e = rc == SQLITE_DONE ? DDPD_OK : sq_fail(&r->err, s->w->db, rc, "insert the queued event");
    if (e == DDPD_EINTERNAL) /* a row-level refusal must not leave the job without it */
        e = DDPD_EIO;
    stmt_done(st);
    return e;
}

/* Inserts one job inside the group's transaction. A CHECK failure undoes only this
 * statement; the group goes on. */
static ddpd_err insert_one(struct store *s, struct insert_req *r)
{
    const struct store_job_new *job = &r->job;
    sqlite3_stmt *st = stmt(s->w, W_JOB_INSERT, &r->err);
    if (!st)
        return r->err.code;
    sqlite3_bind_text(st, 1, job->name ? job->name : "", -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, job->spec, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 3, job->world_size);
    sqlite3_bind_text(st, 4, device_kind_name(job->device), -1, SQLITE_STATIC);
    sqlite3_bind_double(st, 5, r->now);
    sqlite3_bind_int(st, 6, job->max_restarts);
    if (job->resumed_from > 0) {
        sqlite3_bind_int64(st, 7, job->resumed_from);
        sqlite3_bind_int64(st, 8, job->resume_step);
    } else {
        sqlite3_bind_null(st, 7);
        sqlite3_bind_null(st, 8);
    }
    if (job->total_steps > 0)
        sqlite3_bind_int64(st, 9, job->total_steps);
    else
        sqlite3_bind_null(st, 9);
    sqlite3_bind_int(st, 10, job->resumed_from > 0 && job->resume_force);
    ddpd_err e = DDPD_OK;
    int rc = sqlite3_step(st);
    if (rc == SQLITE_CONSTRAINT_CHECK) {
        /* SQLite's json_valid() says false when it runs out of memory: a spec that fails
         * the check is tried once more before it counts as invalid. */
        sqlite3_reset(st);
        rc = sqlite3_step(st);
    }
    if (rc == SQLITE_CONSTRAINT_CHECK)
        e = ddpd_error_set(&r->err, DDPD_EINTERNAL, "",
                           "store: insert job: %s (spec must be "
                           "valid JSON, device cpu or cuda)",
                           sqlite3_errmsg(s->w->db));
    else if (rc != SQLITE_DONE)
        e = sq_fail(&r->err, s->w->db, rc, "insert job");
    else
        r->id = sqlite3_last_insert_rowid(s->w->db);
    stmt_done(st);
    if (e == DDPD_OK && job->queued_event)
        e = insert_queued_event(s, r);
    return e;
}

/* Inserts a group in one transaction. An error other than a row's CHECK (I/O, full disk,
 * busy) rolls the whole group back and is every member's error. */
static void insert_group(struct store *s, struct insert_req *g)
{
    struct ddpd_error gerr;
    ddpd_err ge = DDPD_OK;
    pthread_mutex_lock(&s->wmu);
    int rc = step_simple(s->w, W_BEGIN);
    if (rc != SQLITE_OK) {
        ge = sq_fail(&gerr, s->w->db, rc, "insert job");
        pthread_mutex_unlock(&s->wmu);
    } else {
        for (struct insert_req *r = g; r; r = r->next) {
            r->e = insert_one(s, r);
            if (r->e != DDPD_OK && r->e != DDPD_EINTERNAL) {
                ge = r->e;
                gerr = r->err;
                break;
            }
        }
        ge = wtx_end(s, ge, &gerr);
    }
    for (struct insert_req *r = g; r; r = r->next)
        if (ge != DDPD_OK) {
            r->e = ge;
            r->err = gerr;
        }
}

/* Group commit: inserts queue up while the inserter thread commits the previous group,
 * and the next transaction takes them all; the busier the server, the more jobs one
 * commit serves. */
static void *inserter_main(void *arg)
{
    struct store *s = arg;
    pthread_setname_np(pthread_self(), "ddpd-insert");
    pthread_mutex_lock(&s->imu);
    for (;;) {
        while (!s->ihead && !s->istop)
            pthread_cond_wait(&s->icv, &s->imu);
        struct insert_req *g = s->ihead;
        if (!g)
            break; /* stopping, and nothing is left */
        s->ihead = NULL;
        s->itail = &s->ihead;
        pthread_mutex_unlock(&s->imu);
        insert_group(s, g);
        for (struct insert_req *r = g, *n; r; r = n) {
            n = r->next;
            struct store_job j;
            if (r->e == DDPD_OK)
                job_of_insert(r, &j);
            r->done(r->ctx, r->e, r->e == DDPD_OK ? &j : NULL, &r->err);
            free(r);
        }
        pthread_mutex_lock(&s->imu);
    }
    pthread_mutex_unlock(&s->imu);
    return NULL;
}

void store_job_insert_async(struct store *s, const struct store_job_new *job, store_insert_done_fn done,
                            void *ctx)
{
    struct insert_req *r = calloc(1, sizeof *r);
    struct ddpd_error err;
    if (!r) {
        ddpd_error_set(&err, DDPD_ENOMEM, "", "out of memory storing the job");
        done(ctx, DDPD_ENOMEM, NULL, &err);
        return;
    }
    if (!job->spec || job->world_size < 1) {
        free(r);
        ddpd_error_set(&err, DDPD_EINTERNAL, "", "store: a job needs a spec and world_size >= 1");
        done(ctx, DDPD_EINTERNAL, NULL, &err);
        return;
    }
    r->job = *job;
    r->now = base_wall_s();
    r->done = done;
    r->ctx = ctx;
    ddpd_error_clear(&r->err);
    pthread_mutex_lock(&s->imu);
    bool first = s->ihead == NULL;
    *s->itail = r;
    s->itail = &r->next;
    if (first)
        pthread_cond_signal(&s->icv);
    pthread_mutex_unlock(&s->imu);
}

/* store_job_insert: the async insert, waited for. */
struct insert_wait {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    ddpd_err e;
    int64_t id;
    double created_at;
    struct ddpd_error err;
};

static void insert_waited(void *ctx, ddpd_err rc, const struct store_job *job, const struct ddpd_error *err)
{
    struct insert_wait *w = ctx;
    pthread_mutex_lock(&w->mu);
    w->e = rc;
    if (rc == DDPD_OK) {
        w->id = job->id;
        w->created_at = job->created_at;
    } else
        w->err = *err;
    w->done = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

ddpd_err store_job_insert(struct store *s, const struct store_job_new *job, int64_t *id, double *created_at,
                          struct ddpd_error *err)
{
    struct insert_wait w = {.done = false};
    pthread_mutex_init(&w.mu, NULL);
    pthread_cond_init(&w.cv, NULL);
    store_job_insert_async(s, job, insert_waited, &w);
    pthread_mutex_lock(&w.mu);
    while (!w.done)
        pthread_cond_wait(&w.cv, &w.mu);
    pthread_mutex_unlock(&w.mu);
    pthread_cond_destroy(&w.cv);
    pthread_mutex_destroy(&w.mu);
    if (w.e != DDPD_OK) {
        if (err)
            *err = w.err;
        return w.e;
    }
    *id = w.id;
    if (created_at)
        *created_at = w.created_at;
    return DDPD_OK;
}

/* Reads the state of job `id` on the writer connection (inside its transaction). */
static ddpd_err job_state_w(struct store *s, int64_t id, job_state *out, struct ddpd_error *err)
{
    sqlite3_stmt *st = stmt(s->w, W_JOB_STATE, err);
    if (!st)
        return err ? err->code : DDPD_EINTERNAL;
    sqlite3_bind_int64(st, 1, id);
    ddpd_err e = DDPD_OK;
    int rc = sqlite3_step(st);
    if (rc == SQLITE_DONE)
        e = ddpd_error_set(err, DDPD_ENOTFOUND, "", "job %lld not found", (long long)id);
    else if (rc != SQLITE_ROW)
        e = sq_fail(err, s->w->db, rc, "read job state");
    else if (!job_state_parse(col_text(st, 0), out))
        e = ddpd_error_set(err, DDPD_EIO, "", "store: job %lld has an unknown state '%s'", (long long)id,
                           col_text(st, 0));
    stmt_done(st);
    return e;
}

static ddpd_err state_guard(int64_t id, job_state cur, unsigned if_states, struct ddpd_error *err)
{
    if (if_states && !(if_states & JOB_STATE_BIT(cur)))
        return ddpd_error_set(err, DDPD_ECONFLICT, "", "job %lld is %s", (long long)id, job_state_name(cur));
    return DDPD_OK;
}

ddpd_err store_job_update(struct store *s, int64_t id, const struct store_job_update *u, job_state *old,
                          struct ddpd_error *err)
{
    if ((u->fields & STORE_SET_STATE) && (unsigned)u->state >= JOB_STATE_COUNT)
        return ddpd_error_set(err, DDPD_EINTERNAL, "", "store: bad job state %d", (int)u->state);
    job_state cur = JOB_STATE_QUEUED;
    sqlite3_stmt *st = NULL;
    ddpd_err e = wtx_begin(s, err);
    if (e != DDPD_OK)
        return e;
    e = job_state_w(s, id, &cur, err);
    if (e == DDPD_OK)
        e = state_guard(id, cur, u->if_states, err);
    if (e != DDPD_OK)
        goto out;
    st = stmt(s->w, W_JOB_UPDATE, err);
    if (!st) {
        e = err ? err->code : DDPD_EINTERNAL;
        goto out;
    }
    sqlite3_bind_int64(st, 1, id);
    sqlite3_bind_int(st, 2, (int)u->fields);
    sqlite3_bind_text(st, 3, job_state_name((u->fields & STORE_SET_STATE) ? u->state : cur), -1,
                      SQLITE_STATIC);
    sqlite3_bind_int(st, 4, u->attempt);
    sqlite3_bind_int(st, 5, u->restarts);
    bind_text_or_null(st, 6, u->error);
    bind_text_or_null(st, 7, u->pending_reason);
    sqlite3_bind_int64(st, 8, u->step);
    if (isfinite(u->loss))
        sqlite3_bind_double(st, 9, u->loss);
    else
        sqlite3_bind_null(st, 9);
    sqlite3_bind_double(st, 10, base_wall_s());
    sqlite3_bind_int(st, 11, u->restart_attempt);
    sqlite3_bind_text(st, 12, u->restart_reason ? u->restart_reason : "", -1, SQLITE_TRANSIENT);
    if (u->restart_by_rank) {
        sqlite3_bind_int(st, 13, u->restart_rank);
        sqlite3_bind_int(st, 14, u->restart_exit_code);
    } /* else null */
    int rc = sqlite3_step(st);
    if (rc != SQLITE_DONE)
        e = sq_fail(err, s->w->db, rc, "update job");
out:
    stmt_done(st);
    e = wtx_end(s, e, err);
    job_changed(s, id);
    if (old && e == DDPD_OK)
        *old = cur;
    return e;
}

ddpd_err store_job_delete(struct store *s, int64_t id, unsigned if_states, struct ddpd_error *err)
{
    job_state cur;
    sqlite3_stmt *st = NULL;
    drain(s); /* its queued events first, so none lands after the delete */
    ddpd_err e = wtx_begin(s, err);
    if (e != DDPD_OK)
        return e;
    e = job_state_w(s, id, &cur, err);
    if (e == DDPD_OK)
        e = state_guard(id, cur, if_states, err);
    if (e != DDPD_OK)
        goto out;
    st = stmt(s->w, W_JOB_DELETE, err);
    if (!st) {
        e = err ? err->code : DDPD_EINTERNAL;
        goto out;
    }
    sqlite3_bind_int64(st, 1, id);
    int rc = sqlite3_step(st);
    if (rc != SQLITE_DONE)
        e = sq_fail(err, s->w->db, rc, "delete job");
out:
    stmt_done(st);
    e = wtx_end(s, e, err);
    job_changed(s, id);
    return e;
}

/* ---- attempts and ranks ---- */

/* Runs the prepared writer statement `st` (bound) alone, as its own transaction; a
 * foreign-key failure means the job is missing. */
static ddpd_err w_exec(struct store *s, sqlite3_stmt *st, int64_t job, const char *op, bool need_change,
                       struct ddpd_error *err)
{
    ddpd_err e = DDPD_OK;
    int rc = sqlite3_step(st);
    if (rc == SQLITE_CONSTRAINT_FOREIGNKEY)
        e = ddpd_error_set(err, DDPD_ENOTFOUND, "", "job %lld not found", (long long)job);
    else if (rc != SQLITE_DONE)
        e = sq_fail(err, s->w->db, rc, op);
    else if (need_change && sqlite3_changes(s->w->db) == 0)
        e = ddpd_error_set(err, DDPD_ENOTFOUND, "", "store: %s: job %lld has no such row", op,
                           (long long)job);
    stmt_done(st);
    return e;
}

ddpd_err store_attempt_begin(struct store *s, int64_t job, int attempt, const char *comm_id,
                             struct ddpd_error *err)
{
    ddpd_err e;
    pthread_mutex_lock(&s->wmu);
    sqlite3_stmt *st = stmt(s->w, W_ATTEMPT_INSERT, err);
    if (!st) {
        e = err ? err->code : DDPD_EINTERNAL;
    } else {
        sqlite3_bind_int64(st, 1, job);
        sqlite3_bind_int(st, 2, attempt);
        bind_text_or_null(st, 3, comm_id);
        sqlite3_bind_double(st, 4, base_wall_s());
        e = w_exec(s, st, job, "begin attempt", false, err);
    }
    pthread_mutex_unlock(&s->wmu);
    job_changed(s, job);
    return e;
}

ddpd_err store_attempt_end(struct store *s, int64_t job, int attempt, const char *outcome,
                           struct ddpd_error *err)
{
    ddpd_err e;
    pthread_mutex_lock(&s->wmu);
    sqlite3_stmt *st = stmt(s->w, W_ATTEMPT_END, err);
    if (!st) {
        e = err ? err->code : DDPD_EINTERNAL;
    } else {
        sqlite3_bind_int64(st, 1, job);
        sqlite3_bind_int(st, 2, attempt);
        sqlite3_bind_double(st, 3, base_wall_s());
        bind_text_or_null(st, 4, outcome);
        e = w_exec(s, st, job, "end attempt", true, err);
    }
    pthread_mutex_unlock(&s->wmu);
    job_changed(s, job);
    return e;
}

ddpd_err store_rank_put(struct store *s, int64_t job, const struct store_rank *r, struct ddpd_error *err)
{
    ddpd_err e;
    pthread_mutex_lock(&s->wmu);
    sqlite3_stmt *st = stmt(s->w, W_RANK_PUT, err);
    if (!st) {
        e = err ? err->code : DDPD_EINTERNAL;
    } else {
        sqlite3_bind_int64(st, 1, job);
        sqlite3_bind_int(st, 2, r->attempt);
        sqlite3_bind_int(st, 3, r->rank);
        if (r->pid > 0)
            sqlite3_bind_int64(st, 4, r->pid);
        if (r->start_time > 0)
            sqlite3_bind_int64(st, 5, (sqlite3_int64)r->start_time);
        sqlite3_bind_text(st, 6, r->state, -1, SQLITE_TRANSIENT);
        if (r->has_exit_code)
            sqlite3_bind_int(st, 7, r->exit_code);
        e = w_exec(s, st, job, "put rank", false, err);
    }
    pthread_mutex_unlock(&s->wmu);
    job_changed(s, job);
    return e;
}

/* ---- jobs: reads ---- */

void store_job_clear(struct store_job *j)
{
    if (!j)
        return;
    free(j->spec);
    free(j->ranks);
    free(j->restart_history);
    memset(j, 0, sizeof *j);
}

void store_job_list_free(struct store_job_list *l)
{
    if (!l)
        return;
    for (size_t i = 0; i < l->n; i++)
        store_job_clear(&l->jobs[i]);
    free(l->jobs);
    memset(l, 0, sizeof *l);
}

/* Fills *j from a row of JOB_COLS. */
static void job_from_row(sqlite3_stmt *st, struct store_job *j)
{
    memset(j, 0, sizeof *j);
    j->id = sqlite3_column_int64(st, 0);
    copy_text(j->name, sizeof j->name, col_text(st, 1));
    if (!job_state_parse(col_text(st, 2), &j->state))
        j->state = JOB_STATE_FAILED; /* NEVER: the schema's CHECK allows only the six */
    if (sqlite3_column_type(st, 3) != SQLITE_NULL) {
        const char *t = col_text(st, 3);
        size_t n = (size_t)sqlite3_column_bytes(st, 3);
        j->spec = xmalloc(n + 1);
        memcpy(j->spec, t, n);
        j->spec[n] = '\0';
    }
    j->world_size = sqlite3_column_int(st, 4);
    j->device = strcmp(col_text(st, 5), "cuda") == 0 ? DEVICE_CUDA : DEVICE_CPU;
    j->created_at = sqlite3_column_double(st, 6);
    j->started_at = sqlite3_column_double(st, 7);
    j->finished_at = sqlite3_column_double(st, 8);
    j->attempt = sqlite3_column_int(st, 9);
    j->has_progress = sqlite3_column_type(st, 10) != SQLITE_NULL;
    j->step = sqlite3_column_int64(st, 10);
    j->loss_finite = sqlite3_column_type(st, 11) != SQLITE_NULL;
    j->loss = j->loss_finite ? sqlite3_column_double(st, 11) : NAN;
    copy_text(j->error, sizeof j->error, col_text(st, 12));
    copy_text(j->pending_reason, sizeof j->pending_reason, col_text(st, 13));
    j->max_restarts = sqlite3_column_int(st, 14);
    j->restarts = sqlite3_column_int(st, 15);
    const char *h = col_text(st, 16);
    size_t hn = (size_t)sqlite3_column_bytes(st, 16);
    j->restart_history = xmalloc(hn + 1);
    memcpy(j->restart_history, h, hn);
    j->restart_history[hn] = '\0';
    j->resumed_from = sqlite3_column_int64(st, 17); /* NULL reads as 0 */
    j->resume_step = sqlite3_column_int64(st, 18);
    j->total_steps = sqlite3_column_int64(st, 19); /* NULL reads as 0: not known */
    j->resume_force = sqlite3_column_int(st, 20) != 0;
}

static ddpd_err load_ranks(struct conn *c, struct store_job *j, struct ddpd_error *err)
{
    sqlite3_stmt *st = stmt(c, R_RANKS, err);
    if (!st)
        return err ? err->code : DDPD_EINTERNAL;
    sqlite3_bind_int64(st, 1, j->id);
    sqlite3_bind_int(st, 2, j->attempt);
    ddpd_err e = DDPD_OK;
    size_t cap = 0;
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        if (j->n_ranks == cap) {
            cap = cap ? 2 * cap : 8;
            j->ranks = xrealloc(j->ranks, cap * sizeof *j->ranks);
        }
        struct store_rank *r = &j->ranks[j->n_ranks++];
        memset(r, 0, sizeof *r);
        r->attempt = sqlite3_column_int(st, 0);
        r->rank = sqlite3_column_int(st, 1);
        r->pid = sqlite3_column_int64(st, 2);
        r->start_time = (uint64_t)sqlite3_column_int64(st, 3);
        copy_text(r->state, sizeof r->state, col_text(st, 4));
        r->has_exit_code = sqlite3_column_type(st, 5) != SQLITE_NULL;
        r->exit_code = r->has_exit_code ? sqlite3_column_int(st, 5) : 0;
        r->has_progress = sqlite3_column_type(st, 6) != SQLITE_NULL;
        r->step = sqlite3_column_int64(st, 6);
        r->loss_finite = sqlite3_column_type(st, 7) != SQLITE_NULL;
        r->loss = r->loss_finite ? sqlite3_column_double(st, 7) : NAN;
        r->samples_per_s = sqlite3_column_double(st, 8);
    }
    if (rc != SQLITE_DONE)
        e = sq_fail(err, c->db, rc, "read ranks");
    stmt_done(st);
    return e;
}

ddpd_err store_job_get(struct store *s, int64_t id, struct store_job *out, struct ddpd_error *err)
{
    memset(out, 0, sizeof *out);
    ddpd_err e = DDPD_OK;
    struct conn *c = read_begin(s, err, &e); /* the job and its ranks from one moment */
    if (!c)
        return e;
    sqlite3_stmt *st = stmt(c, R_JOB_GET, err);
    if (!st) {
        e = err ? err->code : DDPD_EINTERNAL;
        goto end;
    }
    sqlite3_bind_int64(st, 1, id);
    sqlite3_bind_int(st, 9, 1);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW)
        job_from_row(st, out);
    else if (rc == SQLITE_DONE)
        e = ddpd_error_set(err, DDPD_ENOTFOUND, "", "job %lld not found", (long long)id);
    else
        e = sq_fail(err, c->db, rc, "read job");
    stmt_done(st);
    if (e == DDPD_OK)
        e = load_ranks(c, out, err);
end:
    read_end(s, c);
    return e;
}

ddpd_err store_job_list(struct store *s, const struct store_job_query *q, struct store_job_list *out,
                        struct ddpd_error *err)
{
    memset(out, 0, sizeof *out);
    int limit = q->limit <= 0 ? 50 : q->limit > STORE_LIST_MAX ? STORE_LIST_MAX : q->limit;
    unsigned states = q->states & JOB_STATES_ALL;
    int nstates = __builtin_popcount(states);
    ddpd_err e = DDPD_OK;
    struct conn *c = read_begin(s, err, &e);
    if (!c)
        return e;
    int which = states == 0 || states == JOB_STATES_ALL ? R_JOB_LIST_ALL
                : nstates == 1                          ? R_JOB_LIST_ONE
                                                        : R_JOB_LIST_SOME;
    sqlite3_stmt *st = stmt(c, which, err);
    if (!st) {
        e = err ? err->code : DDPD_EINTERNAL;
        goto end;
    }
    sqlite3_bind_int64(st, 1, q->before > 0 ? q->before : INT64_MAX);
    for (int i = 0, p = 2; which != R_JOB_LIST_ALL && i < JOB_STATE_COUNT; i++)
        if (states & JOB_STATE_BIT(i))
            sqlite3_bind_text(st, p++, job_state_name((job_state)i), -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 8, limit + 1); /* one more tells whether there is a next page */
    sqlite3_bind_int(st, 9, q->with_spec);
    if (q->name)
        sqlite3_bind_text(st, 10, q->name, -1, SQLITE_STATIC);
    else
        sqlite3_bind_null(st, 10);
    out->jobs = xcalloc((size_t)limit, sizeof *out->jobs);
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        if (out->n == (size_t)limit) {
            out->next = out->jobs[out->n - 1].id;
            break;
        }
        job_from_row(st, &out->jobs[out->n++]);
    }
    if (rc != SQLITE_ROW && rc != SQLITE_DONE)
        e = sq_fail(err, c->db, rc, "list jobs");
    stmt_done(st);
    for (size_t i = 0; e == DDPD_OK && q->with_ranks && i < out->n; i++)
        e = load_ranks(c, &out->jobs[i], err);
end:
    read_end(s, c);
    return e;
}

ddpd_err store_job_count(struct store *s, int64_t *counts, struct ddpd_error *err)
{
    for (int i = 0; i < JOB_STATE_COUNT; i++)
        counts[i] = 0;
    struct conn *c = reader_get(s, err);
    if (!c)
        return err ? err->code : DDPD_EIO;
    ddpd_err e = DDPD_OK;
    sqlite3_stmt *st = stmt(c, R_JOB_COUNT, err);
    if (!st) {
        e = err ? err->code : DDPD_EINTERNAL;
        goto out;
    }
    int rc;
    job_state js;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW)
        if (job_state_parse(col_text(st, 0), &js))
            counts[js] = sqlite3_column_int64(st, 1);
    if (rc != SQLITE_DONE)
        e = sq_fail(err, c->db, rc, "count jobs");
    stmt_done(st);
out:
    reader_put(s, c);
    return e;
}

ddpd_err store_ping(struct store *s, struct ddpd_error *err)
{
    if (s->corrupt) {
        if (err)
            *err = s->corrupt_err;
        return s->corrupt_err.code;
    }
    struct conn *c = reader_get(s, err);
    if (!c)
        return err ? err->code : DDPD_EIO;
    ddpd_err e = DDPD_OK;
    sqlite3_stmt *st = stmt(c, R_PING, err);
    if (!st) {
        e = err ? err->code : DDPD_EINTERNAL;
    } else {
        int rc = sqlite3_step(st);
        if (rc != SQLITE_ROW)
            e = sq_fail(err, c->db, rc, "ping");
        stmt_done(st);
    }
    reader_put(s, c);
    return e;
}

/* ---- events: reads ---- */

static event_kind kind_parse(const char *name)
{
    for (int k = EVENT_START; k <= EVENT_STATE; k++)
        if (strcmp(name, event_kind_name((event_kind)k)) == 0)
            return (event_kind)k;
    return EVENT_STATE; /* NEVER: only the writer stores kinds, by event_kind_name */
}

ddpd_err store_events_page(struct store *s, int64_t job, int64_t after_seq, int max, size_t max_bytes,
                           bool (*fn)(void *ctx, const struct store_event_row *row), void *ctx, size_t *count,
                           struct ddpd_error *err)
{
    size_t got = 0, bytes = 0;
    if (max <= 0 || max > STORE_EVENTS_MAX)
        max = STORE_EVENTS_MAX;
    struct conn *c = reader_get(s, err);
    if (!c)
        return err ? err->code : DDPD_EIO;
    ddpd_err e = DDPD_OK;
    sqlite3_stmt *st = stmt(c, R_EVENTS, err);
    if (!st) {
        e = err ? err->code : DDPD_EINTERNAL;
        goto out;
    }
    sqlite3_bind_int64(st, 1, job);
    sqlite3_bind_int64(st, 2, after_seq);
    sqlite3_bind_int(st, 3, max);
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        struct store_event_row row = {
            .job = job,
            .seq = sqlite3_column_int64(st, 0),
            .attempt = sqlite3_column_int(st, 1),
            .kind = kind_parse(col_text(st, 2)),
            .rank = sqlite3_column_type(st, 3) == SQLITE_NULL ? -1 : sqlite3_column_int(st, 3),
            .ts = sqlite3_column_double(st, 4),
            .body = col_text(st, 5),
        };
        row.len = (size_t)sqlite3_column_bytes(st, 5);
        /* The byte cap: never more than max_bytes of bodies, but always the first row
         * (a page that could hold nothing would never advance). */
        if (max_bytes && got > 0 && row.len > max_bytes - bytes) {
            rc = SQLITE_DONE;
            break;
        }
        if (!fn(ctx, &row)) {
            rc = SQLITE_DONE;
            break;
        }
        got++;
        bytes += row.len;
    }
    if (rc != SQLITE_DONE)
        e = sq_fail(err, c->db, rc, "read events");
    stmt_done(st);
out:
    reader_put(s, c);
    if (count)
        *count = got;
    return e;
}

ddpd_err store_events_read(struct store *s, int64_t job, int64_t after_seq, int max,
                           bool (*fn)(void *ctx, const struct store_event_row *row), void *ctx, size_t *count,
                           struct ddpd_error *err)
{
    return store_events_page(s, job, after_seq, max, 0, fn, ctx, count, err);
}

ddpd_err store_event_max_seq(struct store *s, int64_t job, int64_t *seq, struct ddpd_error *err)
{
    *seq = 0;
    struct conn *c = reader_get(s, err);
    if (!c)
        return err ? err->code : DDPD_EIO;
    ddpd_err e = DDPD_OK;
    sqlite3_stmt *st = stmt(c, R_MAX_SEQ, err);
    if (!st) {
        e = err ? err->code : DDPD_EINTERNAL;
        goto out;
    }
    sqlite3_bind_int64(st, 1, job);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW)
        *seq = sqlite3_column_int64(st, 0); /* NULL (no events) reads as 0 */
    else
        e = sq_fail(err, c->db, rc, "read max seq");
    stmt_done(st);
out:
    reader_put(s, c);
    return e;
}

/* ---- metrics: the loss curve, downsampled by store_curve.c ---- */

/* The eval events of `job` into out->eval, in step order: a restart that runs a step
 * again replaces the points from that step on (the current attempt's history wins). At
 * most max_points: beyond, every k-th is kept, and the last. */
static ddpd_err eval_scan(struct conn *c, int64_t job, int max_points, struct store_metrics *out,
                          struct ddpd_error *err)
{
    size_t cap = 0;
    sqlite3_stmt *st = stmt(c, R_EVAL_SCAN, err);
    if (!st)
        return err ? err->code : DDPD_EINTERNAL;
    sqlite3_bind_int64(st, 1, job);
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        struct event ev;
        const char *body = (const char *)sqlite3_column_text(st, 0);
        if (!body || event_decode(body, (size_t)sqlite3_column_bytes(st, 0), &ev, NULL) != DDPD_OK ||
            ev.kind != EVENT_EVAL)
            continue; /* the writer stored only events that decode */
        while (out->n_eval > 0 && out->eval[out->n_eval - 1].step >= ev.step)
            out->n_eval--;
        if (out->n_eval == cap) {
            cap = cap ? 2 * cap : 64;
            out->eval = xrealloc(out->eval, cap * sizeof *out->eval);
        }
        out->eval[out->n_eval++] = (struct store_eval){.step = ev.step,
                                                       .loss = ev.nonfinite ? NAN : ev.loss,
                                                       .accuracy = ev.accuracy,
                                                       .has_accuracy = ev.has_accuracy,
                                                       .samples = ev.samples};
    }
    stmt_done(st);
    if (rc != SQLITE_DONE)
        return sq_fail(err, c->db, rc, "read eval series");
    if (out->n_eval > (size_t)max_points) {
        const size_t k = (out->n_eval + (size_t)max_points - 1) / (size_t)max_points, last = out->n_eval - 1;
        size_t n = 0;
        for (size_t i = 0; i < last; i += k)
            out->eval[n++] = out->eval[i];
        out->eval[n++] = out->eval[last];
        out->n_eval = n;
    }
    return DDPD_OK;
}

ddpd_err store_metrics_get(struct store *s, int64_t job, int max_points, struct store_metrics *out,
                           struct ddpd_error *err)
{
    memset(out, 0, sizeof *out);
    if (max_points == 0)
        max_points = 1000;
    if (max_points < 2)
        max_points = 2;
    if (max_points > STORE_METRICS_MAX_POINTS)
        max_points = STORE_METRICS_MAX_POINTS;
    struct store__curve *curve = NULL;
    ddpd_err e = DDPD_OK;
    struct conn *c = read_begin(s, err, &e);
    if (!c)
        return e;
    sqlite3_stmt *st = stmt(c, R_LOSS_RANGE, err);
    if (!st) {
        e = err ? err->code : DDPD_EINTERNAL;
        goto end;
    }
    sqlite3_bind_int64(st, 1, job);
    int rc = sqlite3_step(st);
    if (rc != SQLITE_ROW) {
        e = sq_fail(err, c->db, rc, "read loss range");
        stmt_done(st);
        goto end;
    }
    bool any = sqlite3_column_type(st, 0) != SQLITE_NULL;
    int64_t lo = sqlite3_column_int64(st, 0), hi = sqlite3_column_int64(st, 1);
    stmt_done(st);
    if (!any)
        goto end;

    st = stmt(c, R_LOSS_SCAN, err);
    if (!st) {
        e = err ? err->code : DDPD_EINTERNAL;
        goto end;
    }
    sqlite3_bind_int64(st, 1, job);
    curve = store__curve_new(lo, hi, max_points);
    while ((rc = sqlite3_step(st)) == SQLITE_ROW)
        store__curve_add(curve, sqlite3_column_int64(st, 0), sqlite3_column_int(st, 1),
                         sqlite3_column_type(st, 2) != SQLITE_NULL, sqlite3_column_double(st, 2));
    if (rc != SQLITE_DONE) {
        e = sq_fail(err, c->db, rc, "read loss series");
        stmt_done(st);
        goto end;
    }
    stmt_done(st);
    store__curve_finish(curve, out);
    store__curve_free(curve);
    curve = NULL;

    /* The lr series, downsampled like a loss curve of one rank over the same steps. */
    st = stmt(c, R_LR_SCAN, err);
    if (!st) {
        e = err ? err->code : DDPD_EINTERNAL;
        goto end;
    }
    sqlite3_bind_int64(st, 1, job);
    curve = store__curve_new(lo, hi, max_points);
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        const int64_t step = sqlite3_column_int64(st, 0);
        if (step >= lo && step <= hi) /* a loss event's step always is: it has a loss row */
            store__curve_add(curve, step, 0, sqlite3_column_type(st, 1) != SQLITE_NULL,
                             sqlite3_column_double(st, 1));
    }
    if (rc != SQLITE_DONE) {
        e = sq_fail(err, c->db, rc, "read lr series");
        stmt_done(st);
        goto end;
    }
    stmt_done(st);
    struct store_metrics lr = {0};
    store__curve_finish(curve, &lr);
    out->lr = lr.series[0]; /* the mean over one rank: its own values */
    lr.series[0] = (struct store_series){0};
    store_metrics_free(&lr);

    e = eval_scan(c, job, max_points, out, err);
end:
    read_end(s, c);
    store__curve_free(curve);
    return e;
}
