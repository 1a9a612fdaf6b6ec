/* super_queue.c — the queue as a view (GET /v1/queue, `ddpd queue`, the dashboard's queue
 * page): the running jobs in start order and the pending ones in the order they would
 * start, with their devices, times and reasons. FIRST VERSION, built from the public APIs
 * (the store's rows, super_pending_reason, super_devices): the lead re-bases it on the
 * scheduler's own view (sched.c) once priorities and preemption land. Reads only; it
 * changes no job. */
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/clock.h"
#include "../schema/job_state.h"
#include "super.h"
#include "store.h"

/* One job of the view, as much of its row as the view shows. */
struct qjob {
    int64_t id;
    char name[STORE_NAME_MAX];
    job_state state;
    device_kind device;
    int world_size;
    double created_at, started_at;
    int priority;
    bool preemptible;
    double time_limit;   /* 0: none */
    char *stored_reason; /* the row's pending_reason (Slurm's), owned; NULL when none */
};

struct qlist {
    struct qjob *v;
    size_t n, cap;
};

/* The spec's scheduling fields, from the stored spec's text: priority (SPEC_PRIORITY_DEFAULT
 * when absent), preemptible (true) and time_limit (0). */
static void spec_fields(const char *text, struct qjob *q)
{
    q->priority = SPEC_PRIORITY_DEFAULT;
    q->preemptible = true;
    q->time_limit = 0;
    json_t *spec = text ? json_loads(text, 0, NULL) : NULL;
    json_t *p = json_object_get(spec, "priority"), *pre = json_object_get(spec, "preemptible"),
           *tl = json_object_get(spec, "time_limit");
    if (json_is_integer(p))
        q->priority = (int)json_integer_value(p);
    if (json_is_boolean(pre))
        q->preemptible = json_is_true(pre);
    if (json_is_number(tl) && json_number_value(tl) > 0)
        q->time_limit = json_number_value(tl);
    json_decref(spec);
}

/* Every job in `states` into *l (appended), through the store's pages. */
static ddpd_err collect(struct store *st, unsigned states, struct qlist *l, struct ddpd_error *err)
{
    struct store_job_query q = {.states = states, .limit = STORE_LIST_MAX, .with_spec = true};
    for (;;) {
        struct store_job_list page;
        ddpd_err rc = store_job_list(st, &q, &page, err);
        if (rc) {
            store_job_list_free(&page);
            return rc;
        }
        if (l->n + page.n > l->cap) {
            size_t cap = 2 * (l->n + page.n);
            struct qjob *v = realloc(l->v, cap * sizeof *v);
            if (!v) {
                store_job_list_free(&page);
                return ddpd_error_set(err, DDPD_ENOMEM, NULL, "out of memory listing the queue");
            }
            l->v = v;
            l->cap = cap;
        }
        for (size_t i = 0; i < page.n; i++) {
            const struct store_job *j = &page.jobs[i];
            struct qjob *o = &l->v[l->n++];
            memset(o, 0, sizeof *o);
            o->id = j->id;
            snprintf(o->name, sizeof o->name, "%s", j->name);
            o->state = j->state;
            o->device = j->device;
            o->world_size = j->world_size;
            o->created_at = j->created_at;
            o->started_at = j->started_at;
            o->stored_reason = j->pending_reason[0] ? strdup(j->pending_reason) : NULL;
            spec_fields(j->spec, o);
        }
        q.before = page.next;
        store_job_list_free(&page);
        if (!q.before)
            return DDPD_OK;
    }
}

static void qlist_free(struct qlist *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->v[i].stored_reason);
    free(l->v);
}

/* Running: in start order (then id). */
static int by_start(const void *a, const void *b)
{
    const struct qjob *x = a, *y = b;
    if (x->started_at != y->started_at)
        return x->started_at < y->started_at ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* Pending: the order they would start. Today's scheduler (sched.c) keeps one FIFO per
 * device kind in id order, and GPU jobs are listed first. */
static int by_queue(const void *a, const void *b)
{
    const struct qjob *x = a, *y = b;
    if (x->device != y->device)
        return x->device == DEVICE_CUDA ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* Seconds to one decimal (the API prints them in their shortest form). */
static json_t *seconds(double s)
{
    return json_real(round((s < 0 ? 0 : s) * 10) / 10);
}

/* Which slots each job holds, from the launcher's devices (super_devices): the indices of
 * job `id`'s slots of its kind, in slot order. */
static json_t *slots_of(json_t *devs, int64_t id, device_kind kind)
{
    json_t *out = json_array(), *slot;
    size_t i;
    json_array_foreach (json_object_get(devs, kind == DEVICE_CUDA ? "gpus" : "cpu_slots"), i, slot) {
        json_t *h = json_object_get(slot, "job");
        if (json_is_integer(h) && json_integer_value(h) == id)
            json_array_append_new(out, json_integer(json_integer_value(json_object_get(slot, "index"))));
    }
    return out;
}

/* A time limit in seconds as the spec wrote it: an integer when it is one; null for none. */
static json_t *limit_json(double t)
{
    if (t <= 0)
        return json_null();
    return t == floor(t) && t < 9007199254740992.0 ? json_integer((json_int_t)t) : json_real(t);
}

static json_t *running_json(const struct qjob *j, json_t *devs, double now)
{
    json_t *o = json_object();
    json_object_set_new(o, "id", json_integer(j->id));
    json_object_set_new(o, "name", json_string(j->name));
    json_object_set_new(o, "owner", json_null()); /* users land with the cluster's users part */
    json_object_set_new(o, "priority", json_integer(j->priority));
    json_object_set_new(o, "preemptible", json_boolean(j->preemptible));
    json_object_set_new(o, "device", json_string(device_kind_name(j->device)));
    json_object_set_new(o, "world_size", json_integer(j->world_size));
    json_object_set_new(o, "slots", slots_of(devs, j->id, j->device));
    json_object_set_new(o, "state", json_string(job_state_name(j->state)));
    json_object_set_new(o, "running_s", j->started_at > 0 ? seconds(now - j->started_at) : json_real(0));
    json_object_set_new(o, "time_limit", limit_json(j->time_limit));
    json_object_set_new(o, "preempting", json_false());
    return o;
}

static json_t *pending_json(struct super *s, const struct qjob *j, int position, double now)
{
    char live[STORE_TEXT_MAX];
    const char *why = j->state == JOB_STATE_QUEUED && super_pending_reason(s, j->id, live, sizeof live)
                          ? live
                          : j->stored_reason;
    json_t *o = json_object();
    json_object_set_new(o, "id", json_integer(j->id));
    json_object_set_new(o, "name", json_string(j->name));
    json_object_set_new(o, "owner", json_null());
    json_object_set_new(o, "priority", json_integer(j->priority));
    /* No aging yet: what it is ordered by is its own priority. */
    json_object_set_new(o, "effective_priority", json_integer(j->priority));
    json_object_set_new(o, "device", json_string(device_kind_name(j->device)));
    json_object_set_new(o, "world_size", json_integer(j->world_size));
    json_object_set_new(o, "state", json_string(job_state_name(j->state)));
    json_object_set_new(o, "waited_s", seconds(now - j->created_at));
    json_object_set_new(o, "position", json_integer(position));
    json_object_set_new(o, "reason", why && why[0] ? json_string(why) : json_null());
    return o;
}

json_t *super_queue(struct super *s, int limit, struct ddpd_error *err)
{
    struct qlist run = {0}, wait = {0};
    json_t *out = NULL, *devs = NULL;
    if (limit < 1 || limit > SUPER_QUEUE_LIMIT_MAX)
        limit = SUPER_QUEUE_LIMIT_DEFAULT;
    struct store *st = super_store(s);
    if (collect(st, JOB_STATES_ACTIVE, &run, err) || collect(st, JOB_STATES_WAITING, &wait, err))
        goto out;
    devs = super_devices(s);
    const double now = base_wall_s();
    if (run.n)
        qsort(run.v, run.n, sizeof *run.v, by_start);
    if (wait.n)
        qsort(wait.v, wait.n, sizeof *wait.v, by_queue);

    json_t *running = json_array(), *pending = json_array();
    for (size_t i = 0; i < run.n; i++)
        json_array_append_new(running, running_json(&run.v[i], devs, now));
    /* position: its place in its device kind's queue, 1 for the next to start. */
    int pos = 0;
    for (size_t i = 0; i < wait.n && i < (size_t)limit; i++) {
        pos = i && wait.v[i].device == wait.v[i - 1].device ? pos + 1 : 1;
        json_array_append_new(pending, pending_json(s, &wait.v[i], pos, now));
    }
    out = json_object();
    if (!out || !running || !pending) {
        json_decref(running);
        json_decref(pending);
        json_decref(out);
        out = NULL;
        ddpd_error_set(err, DDPD_ENOMEM, NULL, "out of memory rendering the queue");
        goto out;
    }
    json_object_set_new(out, "running", running);
    json_object_set_new(out, "pending", pending);
    json_object_set_new(out, "pending_total", json_integer((json_int_t)wait.n));
    json_object_set_new(out, "slots",
                        json_pack("{s:I, s:I}", "gpus",
                                  (json_int_t)json_array_size(json_object_get(devs, "gpus")), "cpu",
                                  (json_int_t)json_array_size(json_object_get(devs, "cpu_slots"))));
out:
    json_decref(devs);
    qlist_free(&run);
    qlist_free(&wait);
    return out;
}
