/* store_sweeps.c — the store's room for hyper-parameter sweeps (the sweeps migration):
 * a sweep and its trials inserted together, read, listed, and their states changed by the
 * sweep controller. Sweeps are few and their statements rare, so each call prepares its
 * own statement (the job statements of store_conn.c are the hot ones). Knows nothing of
 * HTTP or of how a sweep chooses its trials. */
#include <math.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <string.h>

#include "../base/alloc.h"
#include "../base/clock.h"
#include "store.h"
#include "store_impl.h"

/* `sql` prepared on `c`, or NULL with err set. */
static sqlite3_stmt *prep(struct conn *c, const char *sql, struct ddpd_error *err)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(c->db, sql, -1, &st, NULL);
    if (rc != SQLITE_OK) {
        sq_fail(err, c->db, rc, "prepare a sweep statement");
        sqlite3_finalize(st);
        return NULL;
    }
    return st;
}

static char *dup_col(sqlite3_stmt *st, int i)
{
    return xstrdup(col_text(st, i));
}

ddpd_err store_sweep_insert(struct store *s, const struct store_sweep_new *sw, int64_t *id,
                            struct ddpd_error *err)
{
    ddpd_err e = wtx_begin(s, err);
    if (e)
        return e;
    sqlite3_stmt *st =
        prep(s->w,
             "INSERT INTO sweeps (created_at, state, method, metric, mode, max_parallel, body, owner) "
             "VALUES (?1, 'running', ?2, ?3, ?4, ?5, ?6, ?7)",
             err);
    sqlite3_stmt *tr = NULL;
    int rc;
    if (!st) {
        e = err ? err->code : DDPD_EIO;
        goto out;
    }
    sqlite3_bind_double(st, 1, base_wall_s());
    sqlite3_bind_text(st, 2, sw->method, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, sw->metric, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, sw->mode, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 5, sw->max_parallel);
    sqlite3_bind_text(st, 6, sw->body, -1, SQLITE_STATIC);
    bind_text_or_null(st, 7, sw->owner);
    if ((rc = sqlite3_step(st)) != SQLITE_DONE) {
        e = sq_fail(err, s->w->db, rc, "insert a sweep");
        goto out;
    }
    *id = sqlite3_last_insert_rowid(s->w->db);
    if (!(tr = prep(
              s->w,
              "INSERT INTO sweep_trials (sweep, idx, params, spec, state) VALUES (?1, ?2, ?3, ?4, 'pending')",
              err))) {
        e = err ? err->code : DDPD_EIO;
        goto out;
    }
    for (size_t i = 0; i < sw->n; i++) {
        sqlite3_reset(tr);
        sqlite3_bind_int64(tr, 1, *id);
        sqlite3_bind_int64(tr, 2, (sqlite3_int64)i);
        sqlite3_bind_text(tr, 3, sw->params[i], -1, SQLITE_STATIC);
        sqlite3_bind_text(tr, 4, sw->specs[i], -1, SQLITE_STATIC);
        if ((rc = sqlite3_step(tr)) != SQLITE_DONE) {
            e = sq_fail(err, s->w->db, rc, "insert a sweep's trial");
            goto out;
        }
    }
out:
    sqlite3_finalize(tr);
    sqlite3_finalize(st);
    return wtx_end(s, e, err);
}

#define SWEEP_COLS "id, created_at, finished_at, state, method, metric, mode, max_parallel, "

/* The columns of SWEEP_COLS (then the body or the trial count at column 8) into *sw. */
static void sweep_row(sqlite3_stmt *st, struct store_sweep *sw)
{
    sw->id = sqlite3_column_int64(st, 0);
    sw->created_at = sqlite3_column_double(st, 1);
    sw->finished_at = sqlite3_column_double(st, 2);
    copy_text(sw->state, sizeof sw->state, col_text(st, 3));
    copy_text(sw->method, sizeof sw->method, col_text(st, 4));
    copy_text(sw->metric, sizeof sw->metric, col_text(st, 5));
    copy_text(sw->mode, sizeof sw->mode, col_text(st, 6));
    sw->max_parallel = sqlite3_column_int(st, 7);
}

ddpd_err store_sweep_get(struct store *s, int64_t id, bool with_specs, struct store_sweep *out,
                         struct ddpd_error *err)
{
    memset(out, 0, sizeof *out);
    ddpd_err e;
    struct conn *c = read_begin(s, err, &e); /* the sweep and its trials from one moment */
    if (!c)
        return e;
    e = DDPD_OK;
    sqlite3_stmt *st = prep(c, "SELECT " SWEEP_COLS "body FROM sweeps WHERE id = ?1", err), *tr = NULL;
    int rc;
    if (!st) {
        e = err ? err->code : DDPD_EIO;
        goto out;
    }
    sqlite3_bind_int64(st, 1, id);
    if ((rc = sqlite3_step(st)) == SQLITE_DONE) {
        e = ddpd_error_set(err, DDPD_ENOTFOUND, "", "sweep %lld not found", (long long)id);
        goto out;
    } else if (rc != SQLITE_ROW) {
        e = sq_fail(err, c->db, rc, "read a sweep");
        goto out;
    }
    sweep_row(st, out);
    out->body = dup_col(st, 8);
    tr = prep(
        c,
        with_specs
            ? "SELECT idx, params, job, state, metric, rung, rungs, spec FROM sweep_trials WHERE sweep = ?1 "
              "ORDER BY idx"
            : "SELECT idx, params, job, state, metric, rung, rungs FROM sweep_trials WHERE sweep = ?1 ORDER "
              "BY idx",
        err);
    if (!tr) {
        e = err ? err->code : DDPD_EIO;
        goto out;
    }
    sqlite3_bind_int64(tr, 1, id);
    size_t cap = 0;
    while ((rc = sqlite3_step(tr)) == SQLITE_ROW) {
        if (out->n_trials == cap) {
            cap = cap ? 2 * cap : 16;
            struct store_trial *t = realloc(out->trials, cap * sizeof *t);
            if (!t) {
                e = ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory reading a sweep");
                goto out;
            }
            out->trials = t;
        }
        struct store_trial *t = &out->trials[out->n_trials++];
        memset(t, 0, sizeof *t);
        t->idx = sqlite3_column_int(tr, 0);
        t->params = dup_col(tr, 1);
        t->job = sqlite3_column_int64(tr, 2);
        copy_text(t->state, sizeof t->state, col_text(tr, 3));
        t->has_metric = sqlite3_column_type(tr, 4) != SQLITE_NULL;
        t->metric = t->has_metric ? sqlite3_column_double(tr, 4) : NAN;
        t->rung = sqlite3_column_int(tr, 5);
        t->rungs = dup_col(tr, 6);
        t->spec = with_specs ? dup_col(tr, 7) : NULL;
    }
    if (rc != SQLITE_DONE && e == DDPD_OK)
        e = sq_fail(err, c->db, rc, "read a sweep's trials");
out:
    sqlite3_finalize(tr);
    sqlite3_finalize(st);
    read_end(s, c);
    return e;
}

void store_sweep_clear(struct store_sweep *sw)
{
    if (!sw)
        return;
    for (size_t i = 0; i < sw->n_trials && sw->trials; i++) {
        free(sw->trials[i].params);
        free(sw->trials[i].spec);
        free(sw->trials[i].rungs);
    }
    free(sw->trials);
    free(sw->body);
    memset(sw, 0, sizeof *sw);
}

ddpd_err store_sweep_list(struct store *s, const char *state, int limit, int64_t before,
                          struct store_sweep **out, size_t *n, struct ddpd_error *err)
{
    *out = NULL;
    *n = 0;
    if (limit < 1 || limit > STORE_LIST_MAX)
        limit = STORE_LIST_MAX;
    ddpd_err e;
    struct conn *c = read_begin(s, err, &e);
    if (!c)
        return e;
    e = DDPD_OK;
    sqlite3_stmt *st =
        prep(c,
             "SELECT " SWEEP_COLS "(SELECT count(*) FROM sweep_trials WHERE sweep = id) FROM sweeps "
             "WHERE (?1 IS NULL OR state = ?1) AND id < ?2 ORDER BY id DESC LIMIT ?3",
             err);
    int rc;
    if (!st) {
        e = err ? err->code : DDPD_EIO;
        goto out;
    }
    bind_text_or_null(st, 1, state);
    sqlite3_bind_int64(st, 2, before > 0 ? before : INT64_MAX);
    sqlite3_bind_int(st, 3, limit);
    if (!(*out = calloc((size_t)limit, sizeof **out))) {
        e = ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory listing sweeps");
        goto out;
    }
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        struct store_sweep *sw = &(*out)[(*n)++];
        sweep_row(st, sw);
        sw->n_trials = (size_t)sqlite3_column_int64(st, 8);
    }
    if (rc != SQLITE_DONE)
        e = sq_fail(err, c->db, rc, "list sweeps");
out:
    sqlite3_finalize(st);
    read_end(s, c);
    return e;
}

void store_sweep_list_free(struct store_sweep *l, size_t n)
{
    (void)n; /* listed sweeps own nothing but the array */
    free(l);
}

ddpd_err store_sweep_set_state(struct store *s, int64_t id, const char *state, const char *if_state,
                               struct ddpd_error *err)
{
    ddpd_err e = wtx_begin(s, err);
    if (e)
        return e;
    sqlite3_stmt *rd = prep(s->w, "SELECT state FROM sweeps WHERE id = ?1", err), *up = NULL;
    int rc;
    if (!rd) {
        e = err ? err->code : DDPD_EIO;
        goto out;
    }
    sqlite3_bind_int64(rd, 1, id);
    if ((rc = sqlite3_step(rd)) == SQLITE_DONE) {
        e = ddpd_error_set(err, DDPD_ENOTFOUND, "", "sweep %lld not found", (long long)id);
        goto out;
    } else if (rc != SQLITE_ROW) {
        e = sq_fail(err, s->w->db, rc, "read a sweep's state");
        goto out;
    }
    if (if_state && strcmp(col_text(rd, 0), if_state)) {
        e = ddpd_error_set(err, DDPD_ECONFLICT, "", "sweep %lld is %s", (long long)id, col_text(rd, 0));
        goto out;
    }
    if (!(up = prep(
              s->w,
              "UPDATE sweeps SET state = ?2, finished_at = CASE WHEN ?2 = 'running' THEN NULL ELSE ?3 END "
              "WHERE id = ?1",
              err))) {
        e = err ? err->code : DDPD_EIO;
        goto out;
    }
    sqlite3_bind_int64(up, 1, id);
    sqlite3_bind_text(up, 2, state, -1, SQLITE_STATIC);
    sqlite3_bind_double(up, 3, base_wall_s());
    if ((rc = sqlite3_step(up)) != SQLITE_DONE)
        e = sq_fail(err, s->w->db, rc, "set a sweep's state");
out:
    sqlite3_finalize(up);
    sqlite3_finalize(rd);
    return wtx_end(s, e, err);
}

ddpd_err store__sweep_link(struct store *s, int64_t sweep, int idx, int rung, int64_t job,
                           struct ddpd_error *err)
{
    sqlite3_stmt *st = prep(
        s->w, "UPDATE sweep_trials SET job = ?3, state = 'queued', rung = ?4 WHERE sweep = ?1 AND idx = ?2",
        err);
    if (!st)
        return err && err->code != DDPD_OK ? err->code : DDPD_EIO;
    sqlite3_bind_int64(st, 1, sweep);
    sqlite3_bind_int(st, 2, idx);
    sqlite3_bind_int64(st, 3, job);
    sqlite3_bind_int(st, 4, rung);
    int rc = sqlite3_step(st);
    ddpd_err e = rc == SQLITE_DONE ? DDPD_OK : sq_fail(err, s->w->db, rc, "link a sweep's trial to its job");
    sqlite3_finalize(st);
    return e;
}

/* store_trial_set and store_trial_set_rungs (rungs NULL: left as they are). */
static ddpd_err trial_set(struct store *s, int64_t sweep, int idx, int64_t job, const char *state,
                          bool has_metric, double metric, const char *rungs, struct ddpd_error *err)
{
    ddpd_err e = wtx_begin(s, err);
    if (e)
        return e;
    sqlite3_stmt *st =
        prep(s->w,
             "UPDATE sweep_trials SET job = CASE WHEN ?3 > 0 THEN ?3 ELSE job END, state = ?4, "
             "metric = ?5, rungs = coalesce(?6, rungs) WHERE sweep = ?1 AND idx = ?2",
             err);
    int rc;
    if (!st) {
        e = err ? err->code : DDPD_EIO;
        goto out;
    }
    sqlite3_bind_int64(st, 1, sweep);
    sqlite3_bind_int(st, 2, idx);
    sqlite3_bind_int64(st, 3, job);
    sqlite3_bind_text(st, 4, state, -1, SQLITE_STATIC);
    if (has_metric && isfinite(metric))
        sqlite3_bind_double(st, 5, metric);
    else
        sqlite3_bind_null(st, 5);
    bind_text_or_null(st, 6, rungs);
    if ((rc = sqlite3_step(st)) != SQLITE_DONE)
        e = sq_fail(err, s->w->db, rc, "set a sweep's trial");
    else if (sqlite3_changes(s->w->db) != 1)
        e = ddpd_error_set(err, DDPD_ENOTFOUND, "", "sweep %lld has no trial %d", (long long)sweep, idx);
out:
    sqlite3_finalize(st);
    return wtx_end(s, e, err);
}

ddpd_err store_trial_set(struct store *s, int64_t sweep, int idx, int64_t job, const char *state,
                         bool has_metric, double metric, struct ddpd_error *err)
{
    return trial_set(s, sweep, idx, job, state, has_metric, metric, NULL, err);
}

ddpd_err store_trial_set_rungs(struct store *s, int64_t sweep, int idx, const char *state, bool has_metric,
                               double metric, const char *rungs, struct ddpd_error *err)
{
    return trial_set(s, sweep, idx, 0, state, has_metric, metric, rungs, err);
}
