/* store_conn.c — the store's connections: every SQL statement the store runs (one table,
 * prepared once per connection), the writer connection's transactions, the pool of reader
 * connections, and the mapping of SQLite's errors to ddpd's. One writer connection (the
 * event writer thread and the callers' other writes take turns under `wmu`), a pool of
 * reader connections for everything else. Knows nothing of HTTP. */
#include <pthread.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <string.h>
#include "../base/alloc.h"
#include "store.h"
#include "store_impl.h"

/* ---- small helpers ---- */

/* Copies NUL-terminated `src` (NULL = "") into dst[cap], cutting at a UTF-8 character
 * boundary when it does not fit. */
void copy_text(char *dst, size_t cap, const char *src)
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
ddpd_err sq_fail(struct ddpd_error *err, sqlite3 *db, int rc, const char *op)
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

#define STR_(x)               #x
#define STR(x)                STR_(x)
#define RESTART_HISTORY_MAX_S STR(STORE_RESTART_HISTORY_MAX)

#define JOB_COLS                                                                                             \
    "id, name, state, CASE WHEN ?9 THEN spec END, world_size, device, created_at, "                          \
    "started_at, finished_at, attempt, step, loss, error, pending_reason, max_restarts, "                    \
    "restarts, restart_history, resumed_from, resume_step, total_steps, resume_force, stop_reason, "         \
    "eval_step, eval_loss, eval_accuracy, best_eval_loss, best_eval_loss_step, best_eval_accuracy, "         \
    "best_eval_accuracy_step, notes, "                                                                       \
    "(SELECT json_group_array(tag) FROM (SELECT tag FROM job_tags WHERE job = jobs.id ORDER BY pos)), "      \
    "stop_at, owner, preemptions, run_s "

static const char *const sql_text[ST_COUNT] = {
    [W_BEGIN] = "BEGIN IMMEDIATE",
    [W_COMMIT] = "COMMIT",
    [W_ROLLBACK] = "ROLLBACK",
    /* ?8: a loss event's step, NULL for the other kinds (store_budget.c finds them by it). */
    [W_EVENT_INSERT] = "INSERT INTO events (job, seq, attempt, kind, rank, body, ts, step) "
                       "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
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
    /* Rank 0's done event of a job that stopped early (early_stop) says why. */
    [W_JOB_STOP_REASON] = "UPDATE jobs SET stop_reason = json_extract(?2, '$.stop_reason') "
                          "WHERE id = ?1 AND json_extract(?2, '$.stop_reason') IS NOT NULL",
    /* An eval event (?2 step, ?3 loss or NULL, ?4 accuracy or NULL; of any attempt): the final
     * eval is the one of the highest step (a step run again replaces it), the best ones
     * the lowest loss and highest accuracy, first occurrence (the *_job_metrics.sql migration). */
    [W_JOB_EVAL] =
        "UPDATE jobs SET "
        "best_eval_loss_step = CASE WHEN ?3 IS NOT NULL AND (best_eval_loss IS NULL OR "
        "?3 < best_eval_loss) THEN ?2 ELSE best_eval_loss_step END, "
        "best_eval_loss = CASE WHEN ?3 IS NOT NULL AND (best_eval_loss IS NULL OR "
        "?3 < best_eval_loss) THEN ?3 ELSE best_eval_loss END, "
        "best_eval_accuracy_step = CASE WHEN ?4 IS NOT NULL AND (best_eval_accuracy IS NULL OR "
        "?4 > best_eval_accuracy) THEN ?2 ELSE best_eval_accuracy_step END, "
        "best_eval_accuracy = CASE WHEN ?4 IS NOT NULL AND (best_eval_accuracy IS NULL OR "
        "?4 > best_eval_accuracy) THEN ?4 ELSE best_eval_accuracy END, "
        "eval_loss = CASE WHEN eval_step IS NULL OR eval_step <= ?2 THEN ?3 ELSE eval_loss END, "
        "eval_accuracy = CASE WHEN eval_step IS NULL OR eval_step <= ?2 THEN ?4 ELSE eval_accuracy END, "
        "eval_step = CASE WHEN eval_step IS NULL OR eval_step <= ?2 THEN ?2 ELSE eval_step END "
        "WHERE id = ?1",
    [W_JOB_INSERT] =
        "INSERT INTO jobs (name, state, spec, world_size, device, created_at, "
        "max_restarts, resumed_from, resume_step, total_steps, resume_force, notes, stop_at, owner) "
        /* ?13 the owner; a sweep trial's job (?14 its sweep) without one gets the sweep's. */
        "VALUES (?1, 'queued', ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, "
        "coalesce(?13, (SELECT owner FROM sweeps WHERE id = ?14)))",
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
        "pending_reason = CASE WHEN ?2 & 16 THEN ?7 WHEN ?2 & 1 AND ?3 NOT IN ('queued', 'preempted') THEN "
        "NULL "
        "ELSE pending_reason END, "
        /* Only another attempt clears the progress: setting the same one again
         * (a retried end after a full disk) keeps what the attempt reported. */
        "step = CASE WHEN ?2 & 32 THEN ?8 WHEN ?2 & 2 AND attempt <> ?4 THEN NULL ELSE step END, "
        "loss = CASE WHEN ?2 & 32 THEN ?9 WHEN ?2 & 2 AND attempt <> ?4 THEN NULL ELSE loss END, "
        "restart_history = CASE WHEN ?2 & 64 AND json_array_length(restart_history) < " RESTART_HISTORY_MAX_S
        " "
        "THEN json_insert(restart_history, '$[#]', json_patch(json_object('attempt', ?11, 'reason', ?12, "
        "'ts', ?10, 'rank', ?13, 'exit_code', ?14), coalesce(?15, '{}'))) ELSE restart_history END, "
        "preemptions = CASE WHEN ?2 & 128 THEN ?16 ELSE preemptions END, "
        "run_s = CASE WHEN ?2 & 128 THEN ?17 ELSE run_s END, "
        "preempt_by = CASE WHEN ?2 & 256 THEN ?18 ELSE preempt_by END "
        "WHERE id = ?1",
    [W_JOB_DELETE] = "DELETE FROM jobs WHERE id = ?1",
    /* A job's tags (?2: the JSON text of an array of strings), each at its place. */
    [W_TAGS_INSERT] = "INSERT INTO job_tags (tag, job, pos) SELECT value, ?1, key FROM json_each(?2)",
    [W_TAGS_DELETE] = "DELETE FROM job_tags WHERE job = ?1",
    [W_JOB_NOTES] = "UPDATE jobs SET notes = ?2 WHERE id = ?1",
    [W_ATTEMPT_INSERT] = "INSERT INTO attempts (job, attempt, comm_id, started_at) "
                         "VALUES (?1, ?2, ?3, ?4)",
    [W_ATTEMPT_END] = "UPDATE attempts SET finished_at = ?3, outcome = ?4 "
                      "WHERE job = ?1 AND attempt = ?2",
    [W_RANK_PUT] = "INSERT INTO ranks (job, attempt, rank, pid, start_time, state, exit_code) "
                   "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) ON CONFLICT (job, attempt, rank) DO "
                   "UPDATE SET pid = excluded.pid, start_time = excluded.start_time, "
                   "state = excluded.state, exit_code = excluded.exit_code",
    /* store_budget.c: a job's stored events (?2 rows, ?3 bytes, ?4 of them loss events)
     * added to its usage; the loss events it has now, and what the latest thinning left. */
    [W_USAGE_ADD] = "INSERT INTO event_usage (job, events, bytes, loss_events) VALUES (?1, ?2, ?3, ?4) "
                    "ON CONFLICT (job) DO UPDATE SET events = events + excluded.events, "
                    "bytes = bytes + excluded.bytes, loss_events = loss_events + excluded.loss_events "
                    "RETURNING loss_events, thinned",
    [W_THIN_JOB] = "SELECT world_size, (SELECT min(step) FROM loss WHERE job = ?1) FROM jobs WHERE id = ?1",
    /* The newest ?2 loss events, which stay whole: the first seq and the smallest step
     * among them, and how many there are. */
    [W_THIN_CUT] = "SELECT min(seq), min(coalesce(step, json_extract(body, '$.step'))), count(*) FROM "
                   "(SELECT seq, step, body FROM events WHERE job = ?1 AND kind = 'loss' "
                   "ORDER BY seq DESC LIMIT ?2)",
    /* The loss series below step ?2, one mean per step (store_budget.c picks the steps
     * that stay; the primary key's order: no sort). */
    [W_THIN_SCAN] = "SELECT step, CASE WHEN count(loss) = count(*) THEN avg(loss) END FROM loss "
                    "WHERE job = ?1 AND step < ?2 GROUP BY step",
    /* Then the other steps go: their loss rows, and the loss events before seq ?2 of the
     * steps below ?3 (every attempt's; W_THIN_SIZE counts them first). ddpd_kept() is
     * store_budget.c's, on the writer connection only. */
    [W_THIN_LOSS] = "DELETE FROM loss WHERE job = ?1 AND step < ?2 AND NOT ddpd_kept(step)",
    [W_THIN_SIZE] =
        "SELECT count(*), sum(length(CAST(body AS BLOB))) FROM events WHERE job = ?1 AND seq < ?2 "
        "AND kind = 'loss' AND coalesce(step, json_extract(body, '$.step')) < ?3 "
        "AND NOT ddpd_kept(coalesce(step, json_extract(body, '$.step')))",
    [W_THIN_EVENTS] = "DELETE FROM events WHERE job = ?1 AND seq < ?2 AND kind = 'loss' "
                      "AND coalesce(step, json_extract(body, '$.step')) < ?3 "
                      "AND NOT ddpd_kept(coalesce(step, json_extract(body, '$.step')))",
    [W_THIN_USAGE] = "UPDATE event_usage SET events = events - ?2, bytes = bytes - ?3, "
                     "loss_events = loss_events - ?2, thinned = loss_events - ?2 WHERE job = ?1",
    [R_JOB_GET] = "SELECT " JOB_COLS "FROM jobs WHERE id = ?1",
    /* store_cluster.c: what the scheduler weighs of a job, with its owner's limits. */
    [R_JOB_WEIGHT] = "SELECT j.owner, u.max_gpus, u.max_cpu_ranks, j.preemptions, j.run_s, j.preempt_by "
                     "FROM jobs j LEFT JOIN users u ON u.name = j.owner WHERE j.id = ?1",
    /* Three shapes, so each gets the plan that fits: the primary key backwards, one
     * range of (state, id) backwards, or an IN over the states. */
    [R_JOB_LIST_ALL] = "SELECT " JOB_COLS "FROM jobs WHERE id < ?1 AND (?10 IS NULL OR name = ?10) "
                       "ORDER BY id DESC LIMIT ?8",
    [R_JOB_LIST_ONE] = "SELECT " JOB_COLS "FROM jobs WHERE state = ?2 AND id < ?1 "
                       "AND (?10 IS NULL OR name = ?10) ORDER BY id DESC LIMIT ?8",
    [R_JOB_LIST_SOME] = "SELECT " JOB_COLS "FROM jobs WHERE state IN (?2, ?3, ?4, ?5, ?6, ?7) "
                        "AND id < ?1 AND (?10 IS NULL OR name = ?10) ORDER BY id DESC LIMIT ?8",
    /* By tag: one range of job_tags' primary key (tag, job) backwards, each job then by
     * its id (CROSS JOIN keeps that order of the loops); the states, when given, in ?2..?7. */
    [R_JOB_LIST_TAG] = "SELECT " JOB_COLS "FROM job_tags CROSS JOIN jobs ON jobs.id = job_tags.job "
                       "WHERE job_tags.tag = ?11 AND job_tags.job < ?1 "
                       "AND (?2 IS NULL OR state IN (?2, ?3, ?4, ?5, ?6, ?7)) "
                       "AND (?10 IS NULL OR name = ?10) ORDER BY job_tags.job DESC LIMIT ?8",
    [R_RANKS] = "SELECT attempt, rank, pid, start_time, state, exit_code, step, loss, "
                "samples_per_s FROM ranks WHERE job = ?1 AND attempt = ?2 ORDER BY rank",
    [R_EVENTS] = "SELECT seq, attempt, kind, rank, ts, body FROM events "
                 "WHERE job = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3",
    [R_MAX_SEQ] = "SELECT max(seq) FROM events WHERE job = ?1",
    /* Two subqueries: each min()/max() alone is one index probe; together they would scan. */
    [R_LOSS_RANGE] = "SELECT (SELECT min(step) FROM loss WHERE job = ?1), "
                     "(SELECT max(step) FROM loss WHERE job = ?1)",
    [R_LOSS_SCAN] = "SELECT step, rank, loss FROM loss WHERE job = ?1 ORDER BY step, rank",
    /* Rank 0's loss events, one per logged step: the lr that step used, the gradient
     * norm and when it was written (every rank that ran a step used the same lr and saw
     * the same norm); of a step a restart ran again, the latest (SQLite takes the bare
     * columns from the row of max(seq)). The step column where the writer filled it
     * (005_event_budget.sql), else the body's. */
    [R_STEP_SCAN] = "SELECT coalesce(step, json_extract(body, '$.step')) AS s, json_extract(body, '$.lr'), "
                    "json_extract(body, '$.grad_norm'), ts, max(seq) FROM events "
                    "WHERE job = ?1 AND kind = 'loss' AND rank = 0 GROUP BY s ORDER BY s",
    [R_EVAL_SCAN] = "SELECT body FROM events WHERE job = ?1 AND kind = 'eval' ORDER BY seq",
    [R_JOB_COUNT] = "SELECT state, count(*) FROM jobs GROUP BY state",
    [R_USAGE] = "SELECT events, bytes, loss_events FROM event_usage WHERE job = ?1",
    [R_PING] = "SELECT count(*) FROM sqlite_schema",
};

void conn_close(struct conn *c)
{
    if (!c)
        return;
    for (int i = 0; i < ST_COUNT; i++)
        sqlite3_finalize(c->st[i]);
    sqlite3_close(c->db);
    free(c);
}

/* Opens one connection with the settings every connection of the store shares. */
ddpd_err conn_open(const char *path, bool writer, int busy_ms, struct conn **out, struct ddpd_error *err)
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
sqlite3_stmt *stmt(struct conn *c, int id, struct ddpd_error *err)
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

void stmt_done(sqlite3_stmt *st)
{
    if (st) {
        sqlite3_reset(st);
        sqlite3_clear_bindings(st);
    }
}

void bind_text_or_null(sqlite3_stmt *st, int i, const char *s)
{
    if (s && *s)
        sqlite3_bind_text(st, i, s, -1, SQLITE_TRANSIENT);
    else
        sqlite3_bind_null(st, i);
}

const char *col_text(sqlite3_stmt *st, int i)
{
    const unsigned char *t = sqlite3_column_text(st, i);
    return t ? (const char *)t : "";
}

/* ---- reader pool ---- */

struct conn *reader_get(struct store *s, struct ddpd_error *err)
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

void reader_put(struct store *s, struct conn *c)
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
struct conn *read_begin(struct store *s, struct ddpd_error *err, ddpd_err *e)
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

void read_end(struct store *s, struct conn *c)
{
    sqlite3_exec(c->db, "COMMIT", NULL, NULL, NULL);
    reader_put(s, c);
}

/* ---- writer transactions ---- */

int step_simple(struct conn *c, int id)
{
    sqlite3_stmt *st = stmt(c, id, NULL);
    if (!st)
        return SQLITE_ERROR;
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

/* Ends the writer's open transaction, if any, without changes. */
void rollback(struct conn *c)
{
    if (!sqlite3_get_autocommit(c->db))
        step_simple(c, W_ROLLBACK);
}

/* Takes the writer connection and opens a write transaction. On success the caller
 * holds wmu and ends with wtx_end. */
ddpd_err wtx_begin(struct store *s, struct ddpd_error *err)
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
ddpd_err wtx_end(struct store *s, ddpd_err e, struct ddpd_error *err)
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
