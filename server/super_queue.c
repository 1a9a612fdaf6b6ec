/* super_queue.c — the queue as a view (GET /v1/queue, `ddpd queue`, the dashboard's queue
 * page): the running jobs in start order and the pending ones in the order they would
 * start, with their devices, times and reasons, as the scheduler sees them (sched_view,
 * under the supervisor's lock), then each job's name, state and time_limit from the
 * store. Reads only; it changes no job. */
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/clock.h"
#include "store.h"
#include "super_impl.h"

struct view_ctx {
    struct super *s;
    json_t *running, *pending;
    int limit, total;
    double now;
};

static json_t *str_or_null(const char *v)
{
    return v && *v ? json_string(v) : json_null();
}

/* One job of the scheduler's view: what the scheduler knows (the job table is the
 * supervisor thread's; the lock keeps the scheduler still, not the table). */
static void view_row(void *ctx, const struct sched_view_job *v)
{
    struct view_ctx *c = ctx;
    if (v->job <= 0)
        return;
    if (!v->running && c->total++ >= c->limit)
        return;
    json_t *o = json_object();
    json_object_set_new(o, "id", json_integer(v->job));
    json_object_set_new(o, "owner", str_or_null(v->owner));
    json_object_set_new(o, "priority", json_integer(v->priority));
    json_object_set_new(o, "preemptible", json_boolean(v->preemptible));
    json_object_set_new(o, "device", json_string(device_kind_name(v->kind)));
    json_object_set_new(o, "world_size", json_integer(v->world));
    if (v->running) {
        json_t *slots = json_array();
        for (int i = 0, n = sched_slots(c->s->sched, v->kind); i < n; i++)
            if (sched_slot_holder(c->s->sched, v->kind, i) == v->job)
                json_array_append_new(slots, json_integer(i));
        json_object_set_new(o, "slots", slots);
        json_object_set_new(o, "running_s", json_real(c->now - v->since));
        json_object_set_new(o, "preempting", json_boolean(v->preempting));
        json_array_append_new(c->running, o);
    } else {
        json_object_set_new(o, "effective_priority", json_integer(v->effective));
        json_object_set_new(o, "waited_s", json_real(c->now - v->since));
        json_object_set_new(o, "position", json_integer(v->position));
        json_object_set_new(o, "reason", json_string(v->reason));
        json_array_append_new(c->pending, o);
    }
}

/* Each row's name, state and time_limit from the store (its stored spec). A job deleted
 * meanwhile keeps what the scheduler said. */
static ddpd_err add_rows(struct super *s, json_t *list, bool running, struct ddpd_error *err)
{
    size_t i;
    json_t *o;
    json_array_foreach (list, i, o) {
        struct store_job j;
        memset(&j, 0, sizeof j);
        ddpd_err rc = store_job_get(s->o.store, json_integer_value(json_object_get(o, "id")), &j, err);
        if (rc == DDPD_ENOTFOUND)
            continue;
        if (rc)
            return rc;
        json_object_set_new(o, "name", json_string(j.name));
        json_object_set_new(o, "state", json_string(job_state_name(j.state)));
        if (running) {
            json_t *spec = j.spec ? json_loads(j.spec, 0, NULL) : NULL;
            json_t *tl = json_object_get(spec, "time_limit");
            json_object_set_new(o, "time_limit",
                                json_is_number(tl) ? json_real(json_number_value(tl)) : json_null());
            json_decref(spec);
        }
        store_job_clear(&j);
    }
    return DDPD_OK;
}

json_t *super_queue(struct super *s, int limit, struct ddpd_error *err)
{
    struct view_ctx c = {.s = s, .running = json_array(), .pending = json_array(), .limit = limit};
    pthread_mutex_lock(&s->lock);
    c.now = base_mono_s();
    sched_view(s->sched, c.now, view_row, &c);
    json_t *slots = json_pack("{s:i, s:i}", "gpus", sched_slots(s->sched, DEVICE_CUDA), "cpu",
                              sched_slots(s->sched, DEVICE_CPU));
    pthread_mutex_unlock(&s->lock);
    json_t *out = json_pack("{s:o, s:o, s:i, s:o}", "running", c.running, "pending", c.pending,
                            "pending_total", c.total, "slots", slots);
    if (!out) {
        ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory building the queue");
        return NULL;
    }
    if (add_rows(s, json_object_get(out, "running"), true, err) ||
        add_rows(s, json_object_get(out, "pending"), false, err)) {
        json_decref(out);
        return NULL;
    }
    return out;
}
