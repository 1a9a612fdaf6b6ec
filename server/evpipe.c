/* evpipe.c — the event pipeline: decodes and numbers a job's events, stores them, commits
 * them in one transaction per turn of the supervisor's loop, publishes them to the hub
 * once committed, and keeps trying to store the end of a job that the store did not take
 * (a full disk). Knows the store and the hub, nothing of jobs being run; the supervisor
 * thread owns it. */
#include "evpipe.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../base/clock.h"
#include "hub.h"

/* The ends the store did not take are tried again once a second, but only until one
 * try fails: the others wait for the next second. A disk that stays full costs one try
 * (a few transactions) a second however many ends wait, and an end is stored within about
 * a second of the disk having room. At most UNSAVED_PER_TURN ends are stored per turn. */
#define UNSAVED_RETRY_S  EVPIPE_RETRY_S
#define UNSAVED_PER_TURN 16

/* A finished job whose end the store could not take (a full disk, an I/O error): its
 * final state event, its ranks' exit codes, then its attempt's end and its row, are
 * tried again every second until they are stored, so that the job does not stay
 * `running` in the store, its final event missing, for as long as this server runs. */
struct unsaved {
    int64_t job;
    int attempt, restarts;
    job_state state;
    char *error;              /* NULL for none */
    struct event ev;          /* the final state event */
    struct store_rank *ranks; /* the ranks' end rows, when !ranks_saved */
    int nranks;
    bool event_saved; /* committed */
    bool row_saved;   /* the row and the attempt's end */
    bool ranks_saved;
    double next_try;
    struct unsaved *next;
};

/* An event stored but not yet published: clients see an event only once it is
 * committed, so that whatever a client saw survives a crash of the server. */
struct pending {
    struct event ev;
    size_t len;
    struct pending *next;
    char body[];
};

struct evpipe {
    struct store *store;
    struct hub *hub;
    struct pending *pending, **pending_tail; /* stored, not yet published */
    struct unsaved *unsaved;                 /* finished jobs whose end the store has not taken yet */
};

void evpipe_add(struct evpipe *p, const struct event *ev, bool stored)
{
    char body[EVENT_LINE_MAX];
    int n = event_encode(ev, body, sizeof body);
    if (n < 0)
        return;
    struct ddpd_error err;
    if (!stored && store_event_append(p->store, ev, body, (size_t)n, &err) != DDPD_OK)
        fprintf(stderr, "ddpd: job %" PRId64 ": event %" PRId64 " not stored: %s\n", ev->job, ev->seq,
                err.message);
    struct pending *pe = malloc(sizeof *pe + (size_t)n + 1);
    if (!pe)
        return;
    pe->ev = *ev;
    pe->len = (size_t)n;
    memcpy(pe->body, body, (size_t)n + 1);
    pe->next = NULL;
    *p->pending_tail = pe;
    p->pending_tail = &pe->next;
}

void evpipe_publish(struct evpipe_source *src, struct event *ev)
{
    ev->has_server_fields = true;
    ev->job = src->job;
    ev->attempt = src->attempt;
    ev->seq = src->next_seq++;
    if (ev->ts == 0)
        ev->ts = base_wall_s();
    evpipe_add(src->pipe, ev, false);
}

void evpipe_rank_line(void *ctx, int rank, const char *line, size_t len)
{
    struct evpipe_source *src = ctx;
    struct event ev;
    struct ddpd_error err;
    if (event_decode(line, len, &ev, &err) != DDPD_OK) {
        fprintf(stderr, "ddpd: job %" PRId64 " rank %d: ignored a line that is not an event: %s\n", src->job,
                rank, err.message);
        return;
    }
    ev.rank = rank; /* the launcher knows which pipe it came from */
    ev.has_server_fields = false;
    evpipe_publish(src, &ev);
    if (ev.kind == EVENT_START && src->on_start)
        src->on_start(src->ctx, rank);
}

struct evpipe *evpipe_new(struct store *store, struct hub *hub)
{
    struct evpipe *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->store = store;
    p->hub = hub;
    p->pending_tail = &p->pending;
    return p;
}

/* The record of `ev`'s job, made when there is none (with every part saved until the
 * caller says which is not). */
static struct unsaved *unsaved_of(struct evpipe *p, const struct event *ev)
{
    for (struct unsaved *u = p->unsaved; u; u = u->next)
        if (u->job == ev->job)
            return u;
    struct unsaved *u = calloc(1, sizeof *u);
    if (!u)
        return NULL;
    u->job = ev->job;
    u->attempt = ev->attempt;
    if (!job_state_parse(ev->state, &u->state))
        u->state = JOB_STATE_FAILED;
    u->ev = *ev;
    u->event_saved = u->row_saved = u->ranks_saved = true;
    u->next_try = base_wall_s() + UNSAVED_RETRY_S;
    u->next = p->unsaved;
    p->unsaved = u;
    return u;
}

/* Whether `u`'s final event is committed (call store_flush first). */
static bool unsaved_event_in_store(struct evpipe *p, const struct unsaved *u)
{
    int64_t seq = 0;
    return store_event_max_seq(p->store, u->job, &seq, NULL) == DDPD_OK && seq >= u->ev.seq;
}

static void unsaved_free(struct unsaved *u)
{
    free(u->ranks);
    free(u->error);
    free(u);
}

/* Whether job `job` is gone from the store (deleted by a client): then nothing of its
 * end is to be stored any more. A read that fails otherwise says no. */
static bool job_deleted(struct evpipe *p, int64_t job)
{
    struct store_job j;
    ddpd_err e = store_job_get(p->store, job, &j, NULL);
    store_job_clear(&j);
    return e == DDPD_ENOTFOUND;
}

/* Tries again what is due (everything when `all`): the event first, then the attempt's
 * end and the row, so that a row that says final finds its final event stored. An end
 * whose job was deleted meanwhile is dropped. After a try that fails, the others wait
 * (UNSAVED_RETRY_S). */
void evpipe_retry(struct evpipe *p, bool all)
{
    if (!p->unsaved)
        return;
    double now = base_wall_s();
    int tried = 0;
    bool failed = false;
    for (struct unsaved **pp = &p->unsaved, *u; (u = *pp);) {
        if (!all && (now < u->next_try || failed || tried == UNSAVED_PER_TURN)) {
            pp = &u->next;
            continue;
        }
        tried++;
        if (job_deleted(p, u->job)) {
            fprintf(stderr,
                    "ddpd: job %" PRId64 ": deleted before its end (%s) could be stored; no longer "
                    "retried\n",
                    u->job, job_state_name(u->state));
            *pp = u->next;
            unsaved_free(u);
            continue;
        }
        u->next_try = now + UNSAVED_RETRY_S;
        if (!u->event_saved) {
            char body[EVENT_LINE_MAX];
            int n = event_encode(&u->ev, body, sizeof body);
            store_flush(p->store, NULL);
            u->event_saved =
                unsaved_event_in_store(p, u) ||
                (n >= 0 && store_event_append(p->store, &u->ev, body, (size_t)n, NULL) == DDPD_OK &&
                 store_flush(p->store, NULL) == DDPD_OK && unsaved_event_in_store(p, u));
        }
        if (!u->ranks_saved) {
            bool ok = true;
            for (int r = 0; ok && r < u->nranks; r++)
                ok = store_rank_put(p->store, u->job, &u->ranks[r], NULL) == DDPD_OK;
            u->ranks_saved = ok;
        }
        if (u->event_saved && !u->row_saved) {
            /* The attempt too: a restart's own update may have met the same full disk. */
            struct store_job_update up = {.fields = STORE_SET_STATE | STORE_SET_RESTARTS | STORE_SET_PENDING |
                                                    STORE_SET_ATTEMPT,
                                          .state = u->state,
                                          .attempt = u->attempt,
                                          .restarts = u->restarts,
                                          .pending_reason = ""};
            if (u->error) {
                up.fields |= STORE_SET_ERROR;
                up.error = u->error;
            }
            ddpd_err ae = store_attempt_end(p->store, u->job, u->attempt, job_state_name(u->state), NULL);
            u->row_saved = (ae == DDPD_OK || ae == DDPD_ENOTFOUND) &&
                           store_job_update(p->store, u->job, &up, NULL, NULL) == DDPD_OK;
        }
        if (u->event_saved && u->row_saved && u->ranks_saved) {
            fprintf(stderr, "ddpd: job %" PRId64 ": its end (%s) is stored now\n", u->job,
                    job_state_name(u->state));
            *pp = u->next;
            unsaved_free(u);
        } else {
            failed = true;
            pp = &u->next;
        }
    }
    for (struct unsaved *u = p->unsaved; failed && u; u = u->next)
        u->next_try = fmax(u->next_try, now + UNSAVED_RETRY_S);
}

void evpipe_drain(struct evpipe *p)
{
    if (!p->pending)
        return;
    bool failed = store_flush(p->store, NULL) != DDPD_OK;
    for (struct pending *pe = p->pending, *n; pe; pe = n) {
        n = pe->next;
        if (failed && event_is_final(&pe->ev)) { /* dropped with its batch? */
            struct unsaved *u = unsaved_of(p, &pe->ev);
            if (u && !unsaved_event_in_store(p, u)) {
                u->event_saved = false;
                u->ev = pe->ev;
                fprintf(stderr,
                        "ddpd: job %" PRId64 ": its final event is not stored; trying again every %.0f s\n",
                        pe->ev.job, UNSAVED_RETRY_S);
            }
        }
        /* Published all the same: a stream must end when its job does. */
        hub_publish(p->hub, &pe->ev, pe->body, pe->len);
        free(pe);
    }
    p->pending = NULL;
    p->pending_tail = &p->pending;
}

void evpipe_end_unsaved(struct evpipe *p, const struct event *ev, bool row_saved, int restarts,
                        const char *error, struct store_rank *ranks, int nranks)
{
    struct unsaved *u = unsaved_of(p, ev);
    if (!u) {
        free(ranks);
        return;
    }
    u->row_saved = row_saved;
    u->restarts = restarts;
    free(u->error);
    u->error = error ? strdup(error) : NULL;
    if (ranks) {
        free(u->ranks);
        u->ranks = ranks;
        u->nranks = nranks;
        u->ranks_saved = false;
    }
    fprintf(stderr, "ddpd: job %" PRId64 ": its end (%s) is not stored; trying again every %.0f s\n", ev->job,
            job_state_name(u->state), UNSAVED_RETRY_S);
}

void evpipe_report_unsaved(const struct evpipe *p)
{
    for (struct unsaved *u = p->unsaved; u; u = u->next)
        fprintf(stderr,
                "ddpd: job %" PRId64 ": its end (%s) could not be stored; the next server marks it failed "
                "(server restarted)\n",
                u->job, job_state_name(u->state));
}

void evpipe_free(struct evpipe *p)
{
    if (!p)
        return;
    for (struct pending *pe = p->pending, *n; pe; pe = n) {
        n = pe->next;
        free(pe);
    }
    while (p->unsaved) {
        struct unsaved *n = p->unsaved->next;
        unsaved_free(p->unsaved);
        p->unsaved = n;
    }
    free(p);
}
