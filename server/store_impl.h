/* store_impl.h — what the store's own files share (not part of store.h's contract): the
 * connections and the ids of their statements (store_conn.c holds the SQL), the store
 * handle, the helpers every room of the store uses, and the loss-curve downsampler
 * (store_curve.c) that store_metrics.c feeds from SQL. Nothing outside server/store*.c
 * includes this. */
#ifndef DDPD_STORE_IMPL_H
#define DDPD_STORE_IMPL_H

#include <pthread.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "store.h"

/* ---- connections and their prepared statements (store_conn.c) ---- */

/* The statements, by id: sql_text in store_conn.c holds each one's SQL. */
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
    W_JOB_STOP_REASON,
    W_JOB_EVAL,
    W_JOB_INSERT,
    W_JOB_STATE,
    W_JOB_UPDATE,
    W_JOB_DELETE,
    W_TAGS_INSERT,
    W_TAGS_DELETE,
    W_JOB_NOTES,
    W_ATTEMPT_INSERT,
    W_ATTEMPT_END,
    W_RANK_PUT,
    W_USAGE_ADD,
    W_THIN_JOB,
    W_THIN_CUT,
    W_THIN_SCAN,
    W_THIN_LOSS,
    W_THIN_SIZE,
    W_THIN_EVENTS,
    W_THIN_USAGE,
    /* readers */
    R_JOB_GET,
    R_JOB_WEIGHT,
    R_JOB_LIST_ALL,
    R_JOB_LIST_ONE,
    R_JOB_LIST_SOME,
    R_JOB_LIST_TAG,
    R_RANKS,
    R_EVENTS,
    R_MAX_SEQ,
    R_LOSS_RANGE,
    R_LOSS_SCAN,
    R_STEP_SCAN,
    R_EVAL_SCAN,
    R_JOB_COUNT,
    R_USAGE,
    R_PING,
    ST_COUNT
};

struct conn {
    sqlite3 *db;
    sqlite3_stmt *st[ST_COUNT];
    struct conn *next; /* free list of the reader pool */
};

/* ---- the store ---- */

/* One queued event: what the writer needs of it, and its body. */
struct qev {
    int64_t job, seq, step;
    int attempt, rank;
    event_kind kind;
    bool loss_finite;
    double ts, loss, samples_per_s;
    double accuracy; /* eval, when has_accuracy */
    bool has_accuracy;
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
    struct store_stats st;  /* counters (queued is filled in on read) */
    uint64_t try_thinned;   /* the writer thread's: events its current try thinned */
    int64_t *keep;          /* the writer thread's: the steps a thinning round keeps, */
    size_t nkeep, keep_cap; /* ascending (store_budget.c) */
    bool werr_set;          /* a writer error not yet reported by store_flush */
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

/* ---- the helpers the store's files share ----
 *
 * Inside the store's files they keep their short names; the names below are macros for
 * store__* (as zlib's Z_PREFIX), so the linked symbols carry the module's prefix. */
#define copy_text         store__copy_text
#define sq_fail           store__sq_fail
#define conn_open         store__conn_open
#define conn_close        store__conn_close
#define stmt              store__stmt
#define stmt_done         store__stmt_done
#define bind_text_or_null store__bind_text_or_null
#define col_text          store__col_text
#define reader_get        store__reader_get
#define reader_put        store__reader_put
#define read_begin        store__read_begin
#define read_end          store__read_end
#define step_simple       store__step_simple
#define rollback          store__rollback
#define wtx_begin         store__wtx_begin
#define wtx_end           store__wtx_end
#define job_changed       store__job_changed
#define drain             store__drain
#define writer_main       store__writer_main
#define inserter_main     store__inserter_main

/* store_conn.c */

/* Copies NUL-terminated `src` (NULL = "") into dst[cap], cutting at a UTF-8 character
 * boundary when it does not fit. */
void copy_text(char *dst, size_t cap, const char *src);
/* Maps an SQLite result to ddpd's errors (store.h's Errors), naming `op`; call it before
 * any other call on `db`. Returns the code it set. */
ddpd_err sq_fail(struct ddpd_error *err, sqlite3 *db, int rc, const char *op);
/* Opens one connection (the writer's creates the file) with the pragmas every connection
 * of the store shares; *out is freed with conn_close (NULL is a no-op). */
ddpd_err conn_open(const char *path, bool writer, int busy_ms, struct conn **out, struct ddpd_error *err);
void conn_close(struct conn *c);
/* The prepared statement `id` of `c` (prepared on first use), or NULL with `err` set;
 * stmt_done resets it and clears its bindings. */
sqlite3_stmt *stmt(struct conn *c, int id, struct ddpd_error *err);
void stmt_done(sqlite3_stmt *st);
/* Binds `s`, or NULL when it is NULL or "". */
void bind_text_or_null(sqlite3_stmt *st, int i, const char *s);
/* Column i as text; "" for NULL. Valid until the statement steps or resets. */
const char *col_text(sqlite3_stmt *st, int i);
/* A reader connection from the pool (opened when none is free, up to o.readers; waits
 * for one beyond), given back with reader_put. */
struct conn *reader_get(struct store *s, struct ddpd_error *err);
void reader_put(struct store *s, struct conn *c);
/* A reader with a read transaction open (all it reads is from one moment), or NULL with
 * *e set; read_end ends it and gives the reader back. */
struct conn *read_begin(struct store *s, struct ddpd_error *err, ddpd_err *e);
void read_end(struct store *s, struct conn *c);
/* Steps statement `id` (BEGIN, COMMIT, ...) once; SQLITE_OK when it is done. */
int step_simple(struct conn *c, int id);
/* Ends the open transaction of `c`, if any, without changes. */
void rollback(struct conn *c);
/* Takes the writer connection (wmu) and opens a write transaction; wtx_end commits when
 * e is DDPD_OK (returning the commit's error), else rolls back, and releases it. */
ddpd_err wtx_begin(struct store *s, struct ddpd_error *err);
ddpd_err wtx_end(struct store *s, ddpd_err e, struct ddpd_error *err);

/* store_jobs.c: bumps job `id`'s store_job_version, after the commit that changed it. */
void job_changed(struct store *s, int64_t id);
/* store_jobs.c: inserts job `id`'s tags (`tags`: the JSON text of an array of strings) on
 * the writer connection, inside its open transaction. */
ddpd_err store__tags_put(struct store *s, int64_t id, const char *tags, struct ddpd_error *err);

/* store_events.c: the writer thread (started by store_open), and the wait until every
 * event appended so far is committed or dropped. */
void *writer_main(void *arg);
void drain(struct store *s);

/* store_insert.c: the inserter thread (started by store_open). */
void *inserter_main(void *arg);

/* store_budget.c. store__budget_open registers on the writer connection the SQL function
 * its statements use (an SQLite result). The others run on the writer connection inside
 * its open transaction and return an SQLite result (SQLITE_OK when done). store__usage_add adds `rows` events
 * (`loss` of them loss events) of `bytes` to job's usage and sets *loss_now and *thinned (may be NULL) to its
 * loss events now and what its latest thinning left. store__budget_batch, after a batch's rows: each job's
 * usage from its stored rows, and a thinning round for a job past store_opts.job_events_max (adding the
 * events it deleted to *thinned); `scratch` has room for n pointers. */
int store__budget_open(struct store *s);
int store__usage_add(struct conn *c, int64_t job, int64_t rows, int64_t bytes, int64_t loss,
                     int64_t *loss_now, int64_t *thinned);
int store__budget_batch(struct store *s, struct qev *b, int n, struct qev **scratch, uint64_t *thinned);

/* store_sweeps.c: sets trial `idx` of sweep `sweep` to job `job`, state queued, on the
 * writer connection inside its open transaction (store_job_new.sweep). */
ddpd_err store__sweep_link(struct store *s, int64_t sweep, int idx, int rung, int64_t job,
                           struct ddpd_error *err);

/* ---- the loss curve (store_curve.c) ---- */

struct store_metrics;

/* The downsampling of one job's loss curve (store_metrics_get's contract in store.h):
 * the mean over ranks per step and each rank's series, bucketed over [lo, hi]. Pure
 * bookkeeping: knows no SQL, not thread-safe. */
struct store__curve;

/* A new curve over the steps lo..hi (lo <= hi) kept to max_points per series (already
 * clamped by the caller). Caller frees with store__curve_free. */
struct store__curve *store__curve_new(int64_t lo, int64_t hi, int max_points);

/* One stored row, in (step, rank) order: `rank`'s loss at `step`; has_value false for a
 * non-finite loss (stored NULL), which counts for nothing. Rows of ranks outside
 * 0..STORE_METRICS_MAX_RANKS-1 are left out. */
void store__curve_add(struct store__curve *c, int64_t step, int rank, bool has_value, double v);

/* Closes the curve into *out (zeroed by the caller): the mean, then each rank with
 * points, their first and last step and the number of points. *out owns the arrays
 * (store_metrics_free); the curve is left empty. */
void store__curve_finish(struct store__curve *c, struct store_metrics *out);

/* NULL is a no-op. */
void store__curve_free(struct store__curve *c);

#endif
