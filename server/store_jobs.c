/* store_jobs.c — a stored job after its insert: its updates, its deletion, its attempts and
 * ranks, its reads (one job, a page of jobs, the counts by state) and the per-job change
 * counters (store_job_version). Knows nothing of HTTP or the scheduler's rules. */
#include <math.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "../base/alloc.h"
#include "../base/clock.h"
#include "store.h"
#include "store_impl.h"

/* ---- change counters ---- */

/* After the commit, never before: a reader that sees the new version then reads data at
 * least as new as that commit. */
void job_changed(struct store *s, int64_t id)
{
    atomic_fetch_add_explicit(&s->jver[(uint64_t)id % STORE_JOB_VERSIONS], 1, memory_order_release);
}

uint64_t store_job_version(struct store *s, int64_t id)
{
    return atomic_load_explicit(&s->jver[(uint64_t)id % STORE_JOB_VERSIONS], memory_order_acquire);
}

/* ---- jobs: writes ---- */

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
    bind_text_or_null(st, 15, u->restart_extra);
    sqlite3_bind_int(st, 16, u->preemptions);
    sqlite3_bind_double(st, 17, u->run_s);
    if (u->preempt_by != 0) /* -1: a user's or a signal's */
        sqlite3_bind_int64(st, 18, u->preempt_by);
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

ddpd_err store__tags_put(struct store *s, int64_t id, const char *tags, struct ddpd_error *err)
{
    sqlite3_stmt *st = stmt(s->w, W_TAGS_INSERT, err);
    if (!st)
        return err ? err->code : DDPD_EINTERNAL;
    sqlite3_bind_int64(st, 1, id);
    sqlite3_bind_text(st, 2, tags, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    ddpd_err e = rc == SQLITE_DONE ? DDPD_OK : sq_fail(err, s->w->db, rc, "store the job's tags");
    stmt_done(st);
    return e;
}

/* Runs the bound writer statement `id` for job `id` inside the open transaction. */
static ddpd_err w_step(struct store *s, int which, int64_t id, const char *text, const char *op,
                       struct ddpd_error *err)
{
    sqlite3_stmt *st = stmt(s->w, which, err);
    if (!st)
        return err ? err->code : DDPD_EINTERNAL;
    sqlite3_bind_int64(st, 1, id);
    if (which == W_JOB_NOTES)
        bind_text_or_null(st, 2, text);
    int rc = sqlite3_step(st);
    ddpd_err e = rc == SQLITE_DONE ? DDPD_OK : sq_fail(err, s->w->db, rc, op);
    stmt_done(st);
    return e;
}

ddpd_err store_job_meta_set(struct store *s, int64_t id, const char *tags, bool set_notes, const char *notes,
                            struct ddpd_error *err)
{
    job_state cur;
    ddpd_err e = wtx_begin(s, err);
    if (e != DDPD_OK)
        return e;
    e = job_state_w(s, id, &cur, err); /* DDPD_ENOTFOUND for no such job */
    if (e == DDPD_OK && tags &&
        (e = w_step(s, W_TAGS_DELETE, id, NULL, "replace the job's tags", err)) == DDPD_OK)
        e = store__tags_put(s, id, tags, err);
    if (e == DDPD_OK && set_notes)
        e = w_step(s, W_JOB_NOTES, id, notes, "set the job's notes", err);
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
    free(j->tags);
    free(j->notes);
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
    copy_text(j->stop_reason, sizeof j->stop_reason, col_text(st, 21));
    struct store_job_evals *e = &j->evals;
    e->has_final = sqlite3_column_type(st, 22) != SQLITE_NULL;
    e->final_step = sqlite3_column_int64(st, 22);
    e->has_loss = sqlite3_column_type(st, 23) != SQLITE_NULL;
    e->final_loss = sqlite3_column_double(st, 23);
    e->has_accuracy = sqlite3_column_type(st, 24) != SQLITE_NULL;
    e->final_accuracy = sqlite3_column_double(st, 24);
    e->has_best_loss = sqlite3_column_type(st, 25) != SQLITE_NULL;
    e->best_loss = sqlite3_column_double(st, 25);
    e->best_loss_step = sqlite3_column_int64(st, 26);
    e->has_best_accuracy = sqlite3_column_type(st, 27) != SQLITE_NULL;
    e->best_accuracy = sqlite3_column_double(st, 27);
    e->best_accuracy_step = sqlite3_column_int64(st, 28);
    if (sqlite3_column_type(st, 29) != SQLITE_NULL)
        j->notes = xstrdup(col_text(st, 29));
    j->tags = xstrdup(sqlite3_column_type(st, 30) != SQLITE_NULL ? col_text(st, 30) : "[]");
    j->stop_at = sqlite3_column_int64(st, 31); /* NULL reads as 0: none */
    copy_text(j->owner, sizeof j->owner, col_text(st, 32));
    j->preemptions = sqlite3_column_int(st, 33);
    j->run_s = sqlite3_column_double(st, 34);
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
    int which = q->tag                                    ? R_JOB_LIST_TAG
                : states == 0 || states == JOB_STATES_ALL ? R_JOB_LIST_ALL
                : nstates == 1                            ? R_JOB_LIST_ONE
                                                          : R_JOB_LIST_SOME;
    sqlite3_stmt *st = stmt(c, which, err);
    if (!st) {
        e = err ? err->code : DDPD_EINTERNAL;
        goto end;
    }
    sqlite3_bind_int64(st, 1, q->before > 0 ? q->before : INT64_MAX);
    bool some = states != 0 && states != JOB_STATES_ALL;
    for (int i = 0, p = 2; some && i < JOB_STATE_COUNT; i++)
        if (states & JOB_STATE_BIT(i))
            sqlite3_bind_text(st, p++, job_state_name((job_state)i), -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 8, limit + 1); /* one more tells whether there is a next page */
    sqlite3_bind_int(st, 9, q->with_spec);
    if (q->name)
        sqlite3_bind_text(st, 10, q->name, -1, SQLITE_STATIC);
    else
        sqlite3_bind_null(st, 10);
    if (q->tag)
        sqlite3_bind_text(st, 11, q->tag, -1, SQLITE_STATIC);
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
