/* store_insert.c — job inserts: store_job_insert_async queues them and the inserter thread
 * commits each group of them in one transaction (with each job's `queued` event);
 * store_job_insert waits for one. Knows nothing of HTTP or the planner. */
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "../base/clock.h"
#include "store.h"
#include "store_impl.h"

/* ---- jobs: inserts ---- */

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
                            .total_steps = r->job.total_steps,
                            .stop_at = r->job.stop_at,
                            .tags = (char *)r->job.tags,
                            .notes = r->job.notes && r->job.notes[0] ? (char *)r->job.notes : NULL};
    snprintf(j->name, sizeof j->name, "%s", r->job.name ? r->job.name : "");
    snprintf(j->owner, sizeof j->owner, "%s", r->job.owner ? r->job.owner : "");
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
    if (rc == SQLITE_DONE && (rc = store__usage_add(s->w, ev.job, 1, n, 0, NULL, NULL)) == SQLITE_OK)
        rc = SQLITE_DONE; /* and its usage, in the same transaction */
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
    bind_text_or_null(st, 11, job->notes);
    if (job->stop_at > 0)
        sqlite3_bind_int64(st, 12, job->stop_at);
    else
        sqlite3_bind_null(st, 12);
    bind_text_or_null(st, 13, job->owner);
    sqlite3_bind_int64(st, 14, job->sweep);
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
    if (e == DDPD_OK && job->tags && strcmp(job->tags, "[]") != 0)
        e = store__tags_put(s, r->id, job->tags, &r->err);
    if (e == DDPD_OK && job->sweep > 0)
        e = store__sweep_link(s, job->sweep, job->sweep_trial, job->sweep_rung, r->id, &r->err);
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
void *inserter_main(void *arg)
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
