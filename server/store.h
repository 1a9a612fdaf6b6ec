/* store.h — the job store: jobs, attempts, ranks, the per-job event log and the loss
 * series in one SQLite database (DESIGN.md "Threads"). The only module that speaks SQL;
 * it knows nothing of HTTP, processes or the scheduler's rules.
 *
 * Threads. Every function may be called from any thread at any time. Writes go through
 * one writer connection: events are queued by store_event_append and committed in
 * batches by the store's own writer thread; the other writes (job insert, update,
 * delete, attempts, ranks) run in the caller's thread on that same connection under a
 * lock, each in its own transaction, and are committed when they return. Reads run on a
 * small pool of reader connections (one per concurrently reading thread, up to
 * `readers`; a further reader waits for a free one), so they never wait for the writer.
 *
 * Durability. WAL with synchronous=NORMAL: whatever a function reported as committed
 * survives the process being killed (SIGKILL, crash). A power loss or kernel crash may
 * lose the last commits made since the previous WAL checkpoint, never corrupt the file.
 * Events are committed when store_flush returns, or a little later (`linger_ms`).
 *
 * Errors. Where a function below lists DDPD_EIO, a failing disk (SQLite's IOERR, FULL)
 * is DDPD_EUNAVAIL instead, and a lock held beyond busy_timeout is DDPD_EBUSY: both are
 * 503 for a client, the transaction was rolled back, and the store stays usable. The
 * event writer retries a batch that fails so twice and then drops it, counted in
 * events_dropped (never stopping the caller or the jobs). */
#ifndef DDPD_STORE_H
#define DDPD_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../schema/err.h"
#include "../schema/event.h"
#include "../schema/job_state.h"
#include "../schema/spec.h"

/* ---- opening ---- */

struct store;

/* Tuning; zero fields take the defaults. */
struct store_opts {
    int batch_max;          /* events per writer transaction; default 1000 */
    int linger_ms;          /* the writer commits a partial batch this long after its
                               first event was queued, or at once on store_flush; default 50 */
    int queue_max;          /* events queued and not yet taken by the writer; default 65536 */
    size_t queue_max_bytes; /* their bodies' bytes; default 64 MiB */
    int append_wait_ms;     /* how long store_event_append waits for room; default 1000 */
    int readers;            /* reader connections at most; default 8 */
    int busy_timeout_ms;    /* SQLite busy_timeout on every connection; default 5000 */
    /* Loss events kept per job (all ranks and attempts together; `ddpd serve
     * --job-events-max`): past it, the writer thins the job's older loss events in the
     * batch's transaction (store_budget.c): the newest job_events_max/2 stay whole, and
     * below them each bucket of steps keeps its first, last, smallest and largest mean
     * loss and its first loss that was not finite, in at most a quarter of the budget. A
     * job of W ranks keeps at least 40*W. Every other kind of event is kept, and seq is
     * never reused. 0 = no bound (the default here; ddpd serve's is 20000). */
    int job_events_max;
};
/* ddpd serve's --job-events-max unless it says otherwise: the newest 10,000 loss events
 * whole (a hub's tail), the older history in at most 5,000 rows (1,000 buckets or more:
 * what the dashboard's curve of 1,000 points shows), about 5 MB of a job's database. */
#define STORE_JOB_EVENTS_DEFAULT 20000

/* Opens (creating it 0600 and its parent folders 0700) the database at `path`, a file name (not
 * ":memory:" or a URI: readers need their own connections to the same file), sets WAL,
 * synchronous=NORMAL, busy_timeout and foreign keys, applies the migrations the database
 * lacks (each in its own transaction, up to store_schema_version()) and starts the writer
 * thread. Errors: DDPD_EIO (cannot create or open, not a database, I/O),
 * DDPD_EBUSY (locked by another process beyond busy_timeout), DDPD_ECONFLICT (the
 * database was made by a newer ddpd: its user_version is above what this binary knows).
 * Returns a new store that the caller frees with store_close, or NULL with `err` set. */
struct store *store_open(const char *path, struct ddpd_error *err);
/* The same with tuning; `opts` may be NULL (defaults). */
struct store *store_open_with(const char *path, const struct store_opts *opts, struct ddpd_error *err);

/* Commits every queued event, stops the writer thread, closes every connection and frees
 * the store. NULL is a no-op. No other call on `s` may be running or follow. */
void store_close(struct store *s);

/* The schema version this binary migrates to (the number of migrations). */
int store_schema_version(void);
/* The SQL text of migration `version` (1-based, as schema/migrations/NNN_name.sql holds
 * it) and, when `name` is not NULL, its file name ("001_init.sql"). Static storage;
 * NULL when there is no such migration. */
const char *store_migration_sql(int version, const char **name);

/* ---- one server per database ---- */

/* A database has one server at a time: two would both recover (kill) each other's ranks and
 * run each queued job twice. store_lock_take locks PATH.lock beside the database at `path`
 * (made 0600 with its folders) with flock, exclusively, for as long as the handle lives,
 * and writes this process's pid into it; the kernel releases the lock however the process
 * ends. Take it before store_open and before anything changes the jobs. Errors:
 * DDPD_ECONFLICT when another process holds it (the message names its pid, as the file
 * says it), DDPD_EIO when the file cannot be made or locked. Returns a new handle that the
 * caller releases with store_lock_release (NULL is a no-op). */
struct store_lock;
struct store_lock *store_lock_take(const char *path, struct ddpd_error *err);
void store_lock_release(struct store_lock *l);

/* ---- jobs ---- */

/* What a submission stores; every pointer is borrowed for the call. */
struct store_job_new {
    const char *name; /* NUL-terminated; "" allowed */
    const char *spec; /* the spec as JSON text (spec_to_json's output) */
    int world_size;   /* >= 1 */
    device_kind device;
    int max_restarts;
    /* A job that continues job `resumed_from` (> 0) from its checkpoint at `resume_step`
     * (POST /v1/jobs/{id}/resume); 0 for a job submitted afresh. With resume_force it does
     * so even on data files that changed since that checkpoint (migration 004). */
    int64_t resumed_from, resume_step;
    bool resume_force;
    int64_t total_steps; /* the optimizer steps in all, when known at submit; 0 = not known */
    /* Its metadata (schema/jobmeta.h, checked by the caller): the tags as the JSON text of
     * an array of strings (NULL or "[]": none) and the notes (NULL or "": none), stored in
     * the insert's transaction. */
    const char *tags, *notes;
    /* The sweep trial this job runs (sweep > 0): the trial's job and state `queued` are
     * set in the insert's transaction, so that a trial never has a job it does not know
     * of, whenever the server is killed. 0 = none. */
    int64_t sweep;
    int sweep_trial;
    int sweep_rung; /* the rung the trial's job runs to (ASHA); 0 otherwise */
    /* A pause (ASHA's rung): the ranks stop after this step with its checkpoint (the job
     * document's stop_at); 0 = none. */
    int64_t stop_at;
    /* The user who submitted it (NULL: none; a sweep trial's job then gets the sweep's
     * owner, in the insert's statement). */
    const char *owner;
    /* Also store the job's first event, the `queued` state event (seq 1, attempt 0, ts =
     * created_at: store_job_queued_event), in the same transaction. */
    bool queued_event;
};

/* The `queued` state event store_job_insert stores with queued_event set. */
void store_job_queued_event(int64_t id, double created_at, struct event *ev);

/* Inserts a job in state `queued`, attempt 0. On DDPD_OK sets *id (never reused) and,
 * when not NULL, *created_at (seconds since the epoch); the row is committed (durable in
 * the sense above) when this returns. Errors: DDPD_EINTERNAL (spec is not valid JSON,
 * world_size < 1), DDPD_EBUSY, DDPD_EIO. */
ddpd_err store_job_insert(struct store *s, const struct store_job_new *job, int64_t *id, double *created_at,
                          struct ddpd_error *err);

/* The same insert without waiting: queued for the inserter thread's next group commit
 * (one transaction for every insert queued meanwhile), after which `done` runs on that
 * thread with the outcome: on DDPD_OK `job` is the row as stored (what store_job_get
 * would read back, without ranks: queued, attempt 0, its id and created_at; its spec is
 * the caller's string, borrowed for the call, so never store_job_clear it), else NULL
 * and `err` says why. job's strings must stay valid until then. `done` must not block
 * for long: the next group waits for it. */
struct store_job;
typedef void (*store_insert_done_fn)(void *ctx, ddpd_err rc, const struct store_job *job,
                                     const struct ddpd_error *err);
void store_job_insert_async(struct store *s, const struct store_job_new *job, store_insert_done_fn done,
                            void *ctx);

/* One rank of a job attempt. Read from the store, or written with store_rank_put (which
 * uses rank, attempt, pid, start_time, state and exit_code). */
#define STORE_RANK_STATE_MAX 16
struct store_rank {
    int attempt;
    int rank;
    int64_t pid;                      /* 0 when not known */
    uint64_t start_time;              /* /proc/PID/stat field 22 (clock ticks after boot); 0 = not known */
    char state[STORE_RANK_STATE_MAX]; /* free text chosen by the supervisor: "starting",
                                         "running", "exited", ... */
    bool has_exit_code;
    int exit_code;     /* when has_exit_code: 0..255, 128+signal when killed */
    bool has_progress; /* step, loss, samples_per_s below are set: the rank's
                          latest loss event (written by the event writer) */
    int64_t step;
    bool loss_finite; /* false when the latest loss was NaN/inf */
    double loss;
    double samples_per_s;
};

#define STORE_NAME_MAX 128
#define STORE_TEXT_MAX 1024
/* A job's final and best eval metrics (the *_job_metrics.sql migration): the eval of the
 * highest step, the lowest finite eval loss and the highest eval accuracy (cross_entropy
 * only), each with the step of its first occurrence. A has_ flag is false where there is
 * none. */
struct store_job_evals {
    bool has_final; /* final_step */
    int64_t final_step;
    bool has_loss, has_accuracy; /* final_loss (finite), final_accuracy */
    double final_loss, final_accuracy;
    bool has_best_loss, has_best_accuracy;
    int64_t best_loss_step, best_accuracy_step;
    double best_loss, best_accuracy;
};

/* A job as GET /v1/jobs/{id} shows it (CONTRACT.md §7). Strings longer than their
 * buffer are cut at a UTF-8 character boundary. Owns `spec` and `ranks`: release with
 * store_job_clear. */
#define STORE_OWNER_MAX 65 /* a user name (users.h USER_NAME_MAX) and its NUL */
struct store_job {
    int64_t id;
    char name[STORE_NAME_MAX];
    job_state state;
    char *spec; /* JSON text, owned; NULL when not loaded */
    int world_size;
    device_kind device;
    double created_at;
    double started_at, finished_at; /* 0 when not yet */
    int attempt;                    /* 0 before the first start */
    bool has_progress;              /* step and loss are set */
    int64_t step;
    bool loss_finite;                    /* false when the latest step's loss was not finite */
    double loss;                         /* mean over the ranks that reported the latest step */
    char error[STORE_TEXT_MAX];          /* "" when none */
    char pending_reason[STORE_TEXT_MAX]; /* "" when none */
    char stop_reason[STORE_TEXT_MAX];    /* why it ended before its last step (early_stop); "" */
    int max_restarts, restarts;
    /* Why the job was restarted: JSON text of an array, oldest first, of {"attempt": N (the
     * attempt that ended), "reason": "...", "ts": seconds, "rank": R, "exit_code": C (the
     * rank whose failure ended it; null, or absent in rows of older servers, when no
     * rank's failure did)} (at most
     * STORE_RESTART_HISTORY_MAX entries); "[]" when never. Owned. */
    char *restart_history;
    int64_t resumed_from, resume_step; /* store_job_new's; 0 for a job submitted afresh */
    bool resume_force;                 /* store_job_new's */
    int64_t total_steps;               /* store_job_new's; 0 = not known */
    struct store_job_evals evals;      /* from its eval events, kept by the event writer */
    int64_t stop_at;                   /* store_job_new's; 0 = none */
    /* Its metadata: the tags as the JSON text of an array of strings in the order given
     * ("[]" when none; NULL in store_job_insert_async's row means none too) and the notes
     * (NULL when none). Owned, except in that row, where they are the caller's. */
    char *tags, *notes;
    char owner[STORE_OWNER_MAX]; /* the user who submitted it; "" for a job from before users */
    int preemptions;             /* times it was preempted */
    double run_s;                /* seconds it ran over its ended attempts */
    size_t n_ranks;              /* ranks of the current attempt, by rank; owned */
    struct store_rank *ranks;
};

#define STORE_RESTART_HISTORY_MAX 256
/* Frees what `j` owns and zeroes it. NULL is a no-op. */
void store_job_clear(struct store_job *j);
/* A number that changes after every commit that may change what store_job_get returns
 * for job `id` (state, progress, ranks, attempts, deletion): read it before
 * store_job_get, and a later equal value means the job still reads the same. Counters
 * are shared by ids in the same bucket (a change of one is seen as a change of all in
 * it) and start at 0 with each store_open. Lock-free. */
#define STORE_JOB_VERSIONS 1024
uint64_t store_job_version(struct store *s, int64_t id);

/* Reads job `id` with its spec and the ranks of its current attempt into *out (which
 * the caller releases with store_job_clear, also after an error). DDPD_ENOTFOUND when
 * there is no such job. */
ddpd_err store_job_get(struct store *s, int64_t id, struct store_job *out, struct ddpd_error *err);

#define STORE_LIST_MAX 1000
struct store_job_query {
    unsigned states;  /* JOB_STATE_BIT mask; 0 = every state */
    int limit;        /* 1..STORE_LIST_MAX; 0 = 50; larger is cut to STORE_LIST_MAX */
    int64_t before;   /* cursor: only jobs with id < before; 0 = from the newest */
    bool with_spec;   /* load each job's spec */
    bool with_ranks;  /* load the ranks of each job's current attempt (pid and
                         start_time for restart recovery) */
    const char *name; /* only the jobs of exactly this name; NULL = any (borrowed) */
    const char *tag;  /* only the jobs with exactly this tag; NULL = any (borrowed); read
                         through the index of job_tags (tag, job), newest first */
};
/* Jobs newest first. Owns `jobs`: release with store_job_list_free. */
struct store_job_list {
    size_t n;
    struct store_job *jobs;
    int64_t next; /* the `before` of the next page; 0 when this page is the last */
};
/* Lists jobs matching `q` into *out (release with store_job_list_free, also after an
 * error). */
ddpd_err store_job_list(struct store *s, const struct store_job_query *q, struct store_job_list *out,
                        struct ddpd_error *err);
/* Frees what `l` owns and zeroes it. NULL is a no-op. */
void store_job_list_free(struct store_job_list *l);

/* Replaces job `id`'s tags with `tags` (the JSON text of an array of strings, checked
 * by the caller: schema/jobmeta.h) unless it is NULL, and its notes with `notes` (NULL or
 * "" clears them) when set_notes; one transaction, committed when this returns. Works in
 * every state: metadata is not training. Errors: DDPD_ENOTFOUND, DDPD_EBUSY, DDPD_EIO. */
ddpd_err store_job_meta_set(struct store *s, int64_t id, const char *tags, bool set_notes, const char *notes,
                            struct ddpd_error *err);

/* Jobs in each state (for /metrics): counts[JOB_STATE_COUNT]. */
ddpd_err store_job_count(struct store *s, int64_t *counts, struct ddpd_error *err);

/* Which columns store_job_update writes (bit mask in `fields`). */
enum {
    STORE_SET_STATE = 1u << 0,      /* state; also the timestamps, see below */
    STORE_SET_ATTEMPT = 1u << 1,    /* attempt; when it changes, clears step and loss (a
                                       new attempt reports its own) unless
                                       STORE_SET_PROGRESS is set */
    STORE_SET_RESTARTS = 1u << 2,   /* restarts */
    STORE_SET_ERROR = 1u << 3,      /* error (NULL or "" clears it) */
    STORE_SET_PENDING = 1u << 4,    /* pending_reason (NULL or "" clears it) */
    STORE_SET_PROGRESS = 1u << 5,   /* step and loss (the event writer also sets them) */
    STORE_SET_RESTART = 1u << 6,    /* appends {attempt, reason, ts: now, rank, exit_code}
                                       (restart_*) to restart_history (up to
                                       STORE_RESTART_HISTORY_MAX) */
    STORE_SET_RUN = 1u << 7,        /* preemptions and run_s */
    STORE_SET_PREEMPT_BY = 1u << 8, /* preempt_by (0 clears it) */
};
/* A change to one job. Pointers are borrowed for the call. */
struct store_job_update {
    unsigned fields;    /* STORE_SET_* */
    unsigned if_states; /* apply only when the job's current state is in this
                           JOB_STATE_BIT mask; 0 = whatever it is */
    job_state state;
    int attempt;
    int restarts;
    const char *error;
    const char *pending_reason;
    int64_t step;
    double loss;                /* NaN/inf is stored as "not finite" */
    int restart_attempt;        /* STORE_SET_RESTART: the attempt that ended */
    const char *restart_reason; /* and why the job starts again */
    bool restart_by_rank;       /* a rank's failure ended it: restart_rank failed with */
    int restart_rank;           /* restart_exit_code; else both are null in the entry */
    int restart_exit_code;
    const char *restart_extra; /* STORE_SET_RESTART: a JSON object whose keys the entry
                                  also gets ({"by": 15, "step": 40}), or NULL */
    int preemptions;           /* STORE_SET_RUN: times preempted, */
    double run_s;              /* and seconds run over the ended attempts (time_limit) */
    int64_t preempt_by;        /* STORE_SET_PREEMPT_BY: the job it is being preempted for
                                  (set while it drains: a restarted server then requeues it
                                  as preempted), 0 none */
};
/* Applies `u` to job `id` in one transaction, committed when this returns. Setting the
 * state also keeps the timestamps true: `starting`/`running` set started_at when it is
 * not set yet and clear finished_at; a final state sets finished_at to now; `queued`
 * clears finished_at. Any state other than `queued` clears pending_reason (unless the
 * same update sets it). When `old` is not NULL it receives the state before the update.
 * Errors: DDPD_ENOTFOUND (no such job), DDPD_ECONFLICT (its state is not in
 * `if_states`; nothing changed), DDPD_EBUSY, DDPD_EIO. */
ddpd_err store_job_update(struct store *s, int64_t id, const struct store_job_update *u, job_state *old,
                          struct ddpd_error *err);

/* Deletes job `id` with its attempts, ranks, events and loss series, when its state is in
 * `if_states` (0 = any). Events of the job still queued are committed first, so none
 * outlives the delete; later appends for it are dropped (counted in events_dropped).
 * Errors: DDPD_ENOTFOUND, DDPD_ECONFLICT (state not in if_states), DDPD_EBUSY, DDPD_EIO. */
ddpd_err store_job_delete(struct store *s, int64_t id, unsigned if_states, struct ddpd_error *err);

/* ---- attempts and ranks ---- */

/* Records the start of attempt `attempt` (>= 1) of job `job` with its rendezvous id
 * (borrowed; may be NULL), started now. DDPD_ECONFLICT when it exists already,
 * DDPD_ENOTFOUND when the job does not. */
ddpd_err store_attempt_begin(struct store *s, int64_t job, int attempt, const char *comm_id,
                             struct ddpd_error *err);
/* Records the end of an attempt: finished now, `outcome` (borrowed: "succeeded",
 * "failed", "cancelled", "restarted", "server restarted", ...). DDPD_ENOTFOUND when the
 * attempt was never begun. */
ddpd_err store_attempt_end(struct store *s, int64_t job, int attempt, const char *outcome,
                           struct ddpd_error *err);

/* Inserts or replaces the rank row (job, r->attempt, r->rank) with r's pid, start_time,
 * state and exit code; keeps the progress the event writer stored. `r` is borrowed.
 * DDPD_ENOTFOUND when the job does not exist. */
ddpd_err store_rank_put(struct store *s, int64_t job, const struct store_rank *r, struct ddpd_error *err);

/* ---- events ---- */

/* Queues one event for the writer thread. `ev` is borrowed and must carry the server's
 * fields (has_server_fields, job, attempt and the per-job seq the caller assigned).
 * `body` (len bytes, borrowed, copied) is the JSON text stored and served later; NULL
 * encodes `ev` with event_encode. A loss event also goes into the loss series and
 * updates the rank's and the job's step and loss, in the same transaction, which also
 * keeps the job's usage (store_job_usage) and may thin its older loss events
 * (store_opts.job_events_max).
 * When the queue is full (queue_max events or queue_max_bytes) this waits up to
 * append_wait_ms for the writer to make room and then gives up with DDPD_EBUSY, the
 * event not queued: a stalled disk slows the caller down a little and then costs events,
 * never the server. DDPD_ETOOBIG for a body over EVENT_LINE_MAX, DDPD_EINTERNAL for an
 * event without server fields. An event that cannot be stored later (its job deleted,
 * its seq taken) is dropped by the writer and counted. */
ddpd_err store_event_append(struct store *s, const struct event *ev, const char *body, size_t len,
                            struct ddpd_error *err);

/* Waits until every event appended before this call is committed (or dropped). Returns
 * the first writer error since the previous store_flush (a batch that could not be
 * committed after retries, a row that was refused), DDPD_OK when there was none. */
ddpd_err store_flush(struct store *s, struct ddpd_error *err);

/* One stored event, borrowed by the callback for the duration of the call. */
struct store_event_row {
    int64_t job, seq;
    int attempt;
    event_kind kind;
    int rank; /* -1 for the server's own events */
    double ts;
    const char *body; /* NUL-terminated JSON text */
    size_t len;
};
/* Calls `fn` for each committed event of `job` with seq > after_seq, in seq order (the
 * seqs of loss events that thinning deleted are missing; the others stay), at
 * most `max` of them (0 = STORE_EVENTS_MAX; larger is cut to it); `fn` returns false to
 * stop (that row does not count as delivered). `fn` runs while a reader connection is
 * held: it must not call the store. Sets *count (may be NULL) to the number delivered
 * (accepted by `fn`). A job without events (or no such job) delivers none. */
#define STORE_EVENTS_MAX 100000
ddpd_err store_events_read(struct store *s, int64_t job, int64_t after_seq, int max,
                           bool (*fn)(void *ctx, const struct store_event_row *row), void *ctx, size_t *count,
                           struct ddpd_error *err);
/* One page of the same read, for a stream that pages a long history as its client reads
 * it: also stops before the row that would take the bodies delivered past max_bytes (0 =
 * no byte cap; the first row is always delivered, whatever its size). One statement on a
 * reader connection: it never takes or waits for the write lock, and holds nothing
 * between pages (the next page is the read with after_seq = the last seq delivered). */
ddpd_err store_events_page(struct store *s, int64_t job, int64_t after_seq, int max, size_t max_bytes,
                           bool (*fn)(void *ctx, const struct store_event_row *row), void *ctx, size_t *count,
                           struct ddpd_error *err);

/* The largest committed seq of `job`, 0 when it has none; call store_flush first to
 * include queued events. A restarted server continues numbering after it (thinning never
 * deletes a job's newest events). */
ddpd_err store_event_max_seq(struct store *s, int64_t job, int64_t *seq, struct ddpd_error *err);

/* What job `id`'s stored events take (what ddpd serve's --job-disk-quota counts beside
 * the job's folder): rows, the bytes of their JSON bodies, and how many are loss events;
 * committed ones, kept by the writer in the transactions that store and thin them. Zeros
 * for a job without events, or no such job. One read on a reader connection. */
struct store_usage {
    int64_t events, bytes, loss_events;
};
ddpd_err store_job_usage(struct store *s, int64_t id, struct store_usage *out, struct ddpd_error *err);

/* ---- the shared cluster (store_cluster.c) ---- */

/* What the scheduler weighs of a job beyond its spec: its owner and the owner's running
 * limits (-1: none, or no such user), its preemptions, the seconds it ran over its ended
 * attempts, and the job it is being preempted for (0 none). */
struct store_job_weight {
    char owner[72]; /* "" for a job from before users */
    int max_gpus, max_cpu_ranks;
    int preemptions;
    double run_s;
    int64_t preempt_by;
};
/* Reads it on a reader. DDPD_ENOTFOUND for an unknown job. */
ddpd_err store_job_weight(struct store *s, int64_t id, struct store_job_weight *out, struct ddpd_error *err);

/* ---- metrics ---- */

/* One loss curve: `rank` is -1 for the mean over ranks per step, else that rank's. */
struct store_series {
    int rank;
    size_t n;
    int64_t *step; /* [n], ascending; owned by the enclosing store_metrics */
    double *loss;  /* [n] */
};
/* One eval event (CONTRACT.md §2a): loss NAN when it was not finite; accuracy only for
 * cross_entropy. */
struct store_eval {
    int64_t step;
    double loss, accuracy;
    bool has_accuracy;
    int64_t samples;
};
/* Owns `series`, `lr`, `grad_norm`, `time`, `eval` and their arrays: release with store_metrics_free. */
struct store_metrics {
    int64_t points;                /* finite loss values stored (all ranks; fewer in the
                                      older steps of a job thinned to job_events_max) */
    int64_t first_step, last_step; /* 0 when there is none */
    size_t n_series;               /* series[0] is the mean (rank -1), then ranks ascending */
    struct store_series *series;
    /* The lr of each logged step (from rank 0's loss events; `loss` holds the lr),
     * downsampled like a loss series; n 0 for a job whose events carry none. */
    struct store_series lr;
    /* The same for the gradients' norm before clipping (only with grad_clip), and the
     * time (seconds since the epoch) each logged step's loss event was written. */
    struct store_series grad_norm, time;
    /* Every eval event of the job, in step order (a restart's rerun replaces the steps
     * from its first on), thinned to max_points. */
    size_t n_eval;
    struct store_eval *eval;
};
#define STORE_METRICS_MAX_POINTS 100000
#define STORE_METRICS_MAX_RANKS  4096
/* The loss curve of `job` (and its lr, grad_norm and time series and eval points), each series downsampled to
 * at most max_points (clamped to 2..STORE_METRICS_MAX_POINTS; 0 = 1000): the step range is
 * cut into max_points/4 buckets of equal width and each bucket keeps its first, minimum,
 * maximum and last point (all of them when it has at most 4), in step order; so the first
 * and last step and the global minimum and maximum of every series are always kept. With
 * max_points 2 or 3 the whole range is one bucket that keeps its first and last point (and
 * with 3 the minimum, else the maximum, between them). Non-finite losses are left out. One
 * streamed pass over the rows; memory O(max_points × ranks). Release *out with
 * store_metrics_free, also after an error. An unknown job gives no series. */
ddpd_err store_metrics_get(struct store *s, int64_t job, int max_points, struct store_metrics *out,
                           struct ddpd_error *err);
/* Frees what `m` owns and zeroes it. NULL is a no-op. */
void store_metrics_free(struct store_metrics *m);

/* ---- sweeps (store_sweeps.c; the sweeps migration in schema/migrations/) ---- */

#define STORE_SWEEP_WORD 16
/* One trial of a sweep. Owns `params` and `spec` (JSON text; spec NULL when not loaded). */
struct store_trial {
    int idx;
    char *params;                 /* {"<dotted.path>": value, ...} */
    char *spec;                   /* the trial's spec */
    int64_t job;                  /* 0 until submitted */
    char state[STORE_SWEEP_WORD]; /* "pending" or its job's state */
    bool has_metric;
    double metric;
    int rung;    /* the rung its latest job runs to (ASHA; 0 otherwise) */
    char *rungs; /* the rungs it completed: [{"rung", "step", "job", "metric"}, ...] */
};
/* A sweep as GET /v1/sweeps/{id} shows it. Owns `body` and `trials`: release with
 * store_sweep_clear. */
struct store_sweep {
    int64_t id;
    double created_at, finished_at; /* finished_at 0 while running */
    char state[STORE_SWEEP_WORD];   /* running, succeeded, cancelled */
    char method[STORE_SWEEP_WORD];
    char metric[STORE_SWEEP_WORD];
    char mode[STORE_SWEEP_WORD];
    int max_parallel;
    char *body;                 /* the request; NULL when not loaded */
    size_t n_trials;            /* set by get and list */
    struct store_trial *trials; /* [n_trials] by idx (get only) */
};
/* What a sweep's insert stores; pointers borrowed for the call. */
struct store_sweep_new {
    const char *body, *method, *metric, *mode;
    int max_parallel;
    size_t n;
    char *const *params, *const *specs; /* [n] */
    const char *owner;                  /* the user who submitted it (its trials' jobs get it); NULL: none */
};
/* Inserts a sweep (state running) and its n trials (pending) in one transaction; sets
 * *id. Errors: DDPD_EBUSY, DDPD_EIO. */
ddpd_err store_sweep_insert(struct store *s, const struct store_sweep_new *sw, int64_t *id,
                            struct ddpd_error *err);
/* Sweep `id` with its trials (their specs when with_specs) into *out (release with
 * store_sweep_clear, also after an error). DDPD_ENOTFOUND when there is none. */
ddpd_err store_sweep_get(struct store *s, int64_t id, bool with_specs, struct store_sweep *out,
                         struct ddpd_error *err);
/* Sweeps newest first (without body and trials, with n_trials), only those in `state`
 * when not NULL, at most `limit` (1..STORE_LIST_MAX) with id < before (0 = from the
 * newest). *out (n of them) is released with store_sweep_list_free. */
ddpd_err store_sweep_list(struct store *s, const char *state, int limit, int64_t before,
                          struct store_sweep **out, size_t *n, struct ddpd_error *err);
void store_sweep_list_free(struct store_sweep *l, size_t n);
void store_sweep_clear(struct store_sweep *sw);
/* Sets sweep `id`'s state (a final one also sets finished_at) when it is `if_state`
 * (NULL: whatever it is). DDPD_ENOTFOUND, DDPD_ECONFLICT (its state is another). */
ddpd_err store_sweep_set_state(struct store *s, int64_t id, const char *state, const char *if_state,
                               struct ddpd_error *err);
/* Sets trial `idx` of sweep `sweep`: its job (0 = leave it), state and metric. */
ddpd_err store_trial_set(struct store *s, int64_t sweep, int idx, int64_t job, const char *state,
                         bool has_metric, double metric, struct ddpd_error *err);
/* The same, with the trial's completed rungs (JSON text, store_trial.rungs) in the same
 * statement: a rung's record and the state it leaves the trial in are stored together. */
ddpd_err store_trial_set_rungs(struct store *s, int64_t sweep, int idx, const char *state, bool has_metric,
                               double metric, const char *rungs, struct ddpd_error *err);

/* ---- health and counters ---- */

/* ---- users (store_users.c; the cluster migration, server/users.h) ----
 *
 * Users are few and their writes rare: each call prepares its own statement. Tokens are
 * never stored, only their SHA-256 (hex); the caller hashes (users.h). */
struct user;

/* Inserts user u (its name, role and limits; created_at is set here) with the token's
 * hash. DDPD_ECONFLICT naming the user when the name is taken; DDPD_EBUSY, DDPD_EIO. */
ddpd_err store_user_add(struct store *s, const struct user *u, const char *token_sha256,
                        struct ddpd_error *err);
/* User `name` into *out. DDPD_ENOTFOUND naming it when there is none. */
ddpd_err store_user_get(struct store *s, const char *name, struct user *out, struct ddpd_error *err);
/* The user whose token hashes to `token_sha256`: looked up by the hash, then the stored
 * hash compared with it by user_hash_equal (CRYPTO_memcmp). DDPD_ENOTFOUND when none. */
ddpd_err store_user_find_token(struct store *s, const char *token_sha256, struct user *out,
                               struct ddpd_error *err);
/* Every user by name into *out (n of them; caller frees *out). */
ddpd_err store_user_list(struct store *s, struct user **out, size_t *n, struct ddpd_error *err);
/* Removes user `name`; their jobs keep their owner's name. DDPD_ENOTFOUND when none. */
ddpd_err store_user_remove(struct store *s, const char *name, struct ddpd_error *err);
/* A new token hash for user `name` (rotated_at now): the old token stops working at once.
 * DDPD_ENOTFOUND when none. */
ddpd_err store_user_rotate(struct store *s, const char *name, const char *token_sha256,
                           struct ddpd_error *err);
/* Sets u->name's role and limits from *u. DDPD_ENOTFOUND when none. */
ddpd_err store_user_update(struct store *s, const struct user *u, struct ddpd_error *err);
/* Whether the users table has any row (then the API needs a token). */
ddpd_err store_user_any(struct store *s, bool *any, struct ddpd_error *err);
/* The jobs of `owner` waiting to run (queued or preempted), for max_queued. */
ddpd_err store_user_queued(struct store *s, const char *owner, int64_t *n, struct ddpd_error *err);
/* The owner of job `id` (or sweep `id` with `sweep`) into owner[cap] ("" when it has
 * none: a job from before users). DDPD_ENOTFOUND when there is no such job or sweep. */
ddpd_err store_owner_get(struct store *s, bool sweep, int64_t id, char *owner, size_t cap,
                         struct ddpd_error *err);

/* A cheap read on a reader connection (for /healthz). DDPD_EIO, naming the file and the
 * first problem, when the database failed PRAGMA quick_check at store_open (damaged
 * pages: it may read fine until a query reaches them). */
ddpd_err store_ping(struct store *s, struct ddpd_error *err);
/* store_open runs PRAGMA quick_check once, after the migrations, and says on stderr
 * when it fails; the store stays open (what is intact can still be read). */

struct store_stats {
    uint64_t events_appended;  /* accepted by store_event_append */
    uint64_t events_committed; /* rows written */
    uint64_t events_dropped;   /* refused rows and failed batches */
    uint64_t events_rejected;  /* store_event_append returned DDPD_EBUSY (queue full) */
    uint64_t events_thinned;   /* stored loss events deleted to keep jobs within job_events_max */
    uint64_t batches;          /* writer transactions committed */
    size_t queued;             /* events waiting now */
};
void store_stats_get(struct store *s, struct store_stats *out);

#endif
