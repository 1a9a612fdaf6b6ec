/* store_events.c — the per-job event log: store_event_append's queue, the writer thread
 * that commits it in batches (with the loss series and the ranks' and jobs' progress, in
 * the same transaction), store_flush, and the reads of the log. Knows nothing of HTTP or
 * the hub: streams read pages of it (stream.c). */
#include <math.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "../base/alloc.h"
#include "../base/clock.h"
#include "store.h"
#include "store_impl.h"

/* ---- small helpers ---- */

/* Waits on `cv` until the CLOCK_MONOTONIC time `deadline_ms` (the store's condvars
 * are made with that clock). */
static void cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, int64_t deadline_ms)
{
    struct timespec ts = {(time_t)(deadline_ms / 1000), (long)(deadline_ms % 1000) * 1000000L};
    pthread_cond_timedwait(cv, mu, &ts);
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

/* Rank 0's done event with a stop_reason (early_stop) sets the job's. */
static int batch_stop_reason(struct conn *c, const struct qev *q)
{
    sqlite3_stmt *st = stmt(c, W_JOB_STOP_REASON, NULL);
    if (!st)
        return SQLITE_ERROR;
    sqlite3_bind_int64(st, 1, q->job);
    sqlite3_bind_text(st, 2, q->body, (int)q->len, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

/* After the loss progress of a batch: the step of each rank that joined or is done (a
 * done event's `steps`), which may be past its last loss step; and why a job stopped
 * early. */
static int batch_rank_steps(struct conn *c, const struct qev *b, int n)
{
    sqlite3_stmt *st = NULL;
    for (int i = 0; i < n; i++) {
        const struct qev *q = &b[i];
        int src;
        if (q->stored && q->rank == 0 && q->kind == EVENT_DONE && strstr(q->body, "\"stop_reason\"") &&
            (src = batch_stop_reason(c, q)) != SQLITE_OK)
            return src;
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
        if (q->kind == EVENT_LOSS)
            sqlite3_bind_int64(ins, 8, q->step);
        else
            sqlite3_bind_null(ins, 8);
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
    s->try_thinned = 0;
    rc = store__budget_batch(s, b, n, loss, &s->try_thinned);
    if (rc != SQLITE_OK) {
        e = sq_fail(err, c->db, rc, "thin events");
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
        s->st.events_thinned += s->try_thinned;
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

void *writer_main(void *arg)
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
void drain(struct store *s)
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
