/* jobdoc.c — the worker's stdin document (a rank's, or the planner's request) and the
 * planner's answer: jansson for the document and for reading the answer, the event encoder
 * for an error answer. The messages name the key and say "in the job document", as the
 * worker's always did. */
#include "jobdoc.h"
#include "event.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A string member into buf (cap bytes): "" when absent or null; a wrong type or a string
 * longer than buf is DDPD_ESPEC naming the key. */
static ddpd_err get_str(const json_t *obj, const char *key, char *buf, size_t cap, struct ddpd_error *err)
{
    json_t *v = json_object_get(obj, key);
    buf[0] = '\0';
    if (!v || json_is_null(v))
        return DDPD_OK;
    if (!json_is_string(v))
        return ddpd_error_set(err, DDPD_ESPEC, key, "%s: expected a string in the job document", key);
    if (json_string_length(v) >= cap)
        return ddpd_error_set(err, DDPD_ESPEC, key, "%s: longer than %zu bytes in the job document", key,
                              cap - 1);
    memcpy(buf, json_string_value(v), json_string_length(v) + 1);
    return DDPD_OK;
}

/* An integer member in [lo, hi]; anything else (absent included) is DDPD_ESPEC. */
static ddpd_err get_int(const json_t *obj, const char *key, int64_t lo, int64_t hi, int64_t *out,
                        struct ddpd_error *err)
{
    json_t *v = json_object_get(obj, key);
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return ddpd_error_set(err, DDPD_ESPEC, key,
                              "%s: expected an integer in [%lld, %lld] in the job document", key,
                              (long long)lo, (long long)hi);
    *out = json_integer_value(v);
    return DDPD_OK;
}

/* An optional integer member in [0, INT64_MAX]: `none` when absent (or, with null_ok, null). */
static ddpd_err get_opt_int(const json_t *obj, const char *key, bool null_ok, int64_t none, int64_t *out,
                            struct ddpd_error *err)
{
    json_t *v = json_object_get(obj, key);
    *out = none;
    if (!v || (null_ok && json_is_null(v)))
        return DDPD_OK;
    return get_int(obj, key, 0, INT64_MAX, out, err);
}

static ddpd_err get_comm(const json_t *obj, struct jobdoc *out, struct ddpd_error *err)
{
    json_t *jc = json_object_get(obj, "comm");
    const char *backend = json_string_value(json_object_get(jc, "backend"));
    json_t *id = json_object_get(jc, "id");
    if (!backend || (strcmp(backend, "cpu") != 0 && strcmp(backend, "nccl") != 0) || !json_is_string(id) ||
        json_string_length(id) >= sizeof out->comm_id)
        return ddpd_error_set(
            err, DDPD_ESPEC, "comm",
            "comm: %d ranks need {\"backend\": \"cpu\" or \"nccl\", \"id\": \"<hex>\"} in the "
            "job document",
            out->world_size);
    snprintf(out->comm_backend, sizeof out->comm_backend, "%s", backend);
    memcpy(out->comm_id, json_string_value(id), json_string_length(id) + 1);
    return DDPD_OK;
}

/* Both readings of the document: a rank's (with_comm: more than one rank needs a group)
 * and the planner's (comm never read). */
static ddpd_err decode(const json_t *obj, bool with_comm, struct jobdoc *out, struct ddpd_error *err)
{
    int64_t v;
    ddpd_err rc;
    memset(out, 0, sizeof *out);
    out->rank = -1;
    if (!json_is_object(obj))
        return ddpd_error_set(err, DDPD_ESPEC, "", "the job document is not a JSON object");
    if ((rc = get_int(obj, "world_size", 1, SPEC_MAX_WORLD, &v, err)))
        return rc;
    out->world_size = (int)v;
    if (json_object_get(obj, "rank")) {
        if ((rc = get_int(obj, "rank", 0, out->world_size - 1, &v, err)))
            return rc;
        out->rank = (int)v;
    }
    if ((rc = get_str(obj, "data_dir", out->data_dir, sizeof out->data_dir, err)) ||
        (rc = get_str(obj, "out_dir", out->out_dir, sizeof out->out_dir, err)) ||
        (rc = get_str(obj, "resume", out->resume, sizeof out->resume, err)) ||
        (rc = get_str(obj, "init_path", out->init_path, sizeof out->init_path, err)) ||
        (rc = get_opt_int(obj, "disk_quota", true, 0, &out->disk_quota, err)))
        return rc;
    json_t *js = json_object_get(obj, "spec");
    if (!json_is_object(js))
        return ddpd_error_set(err, DDPD_ESPEC, "spec", "spec: the job document has no spec object");
    if ((rc = spec_from_json(js, NULL, &out->spec, err)))
        return rc;
    if (out->spec.world_size != out->world_size)
        return ddpd_error_set(err, DDPD_ESPEC, "world_size",
                              "world_size: the job document says %d but the spec says %d", out->world_size,
                              out->spec.world_size);
    if (with_comm && out->world_size > 1 && (rc = get_comm(obj, out, err)))
        return rc;
    if ((rc = get_opt_int(obj, "max_rank_memory", false, 0, &out->max_rank_memory, err)) ||
        (rc = get_opt_int(obj, "job", false, 0, &out->job, err)) ||
        (rc = get_opt_int(obj, "attempt", false, 0, &out->attempt, err)) ||
        (rc = get_opt_int(obj, "stop_at", false, 0, &out->stop_at, err)))
        return rc;
    json_t *force = json_object_get(obj, "resume_force");
    if (force && !json_is_boolean(force))
        return ddpd_error_set(err, DDPD_ESPEC, "resume_force",
                              "resume_force: expected true or false in the job document");
    out->resume_force = json_is_true(force);
    return DDPD_OK;
}

ddpd_err jobdoc_from_json(const json_t *obj, struct jobdoc *out, struct ddpd_error *err)
{
    return decode(obj, true, out, err);
}

ddpd_err jobdoc_plan_from_json(const json_t *obj, struct jobdoc *out, struct ddpd_error *err)
{
    return decode(obj, false, out, err);
}

/* Sets obj[key] = v (stolen); false (v released) when v is NULL or memory ran out. */
static bool put(json_t *obj, const char *key, json_t *v)
{
    return v && json_object_set_new(obj, key, v) == 0;
}

json_t *jobdoc_to_json(const struct jobdoc *d)
{
    json_t *o = json_object();
    if (!o)
        return NULL;
    json_t *comm = d->comm_backend[0] ? json_pack("{s:s, s:s}", "backend", d->comm_backend, "id", d->comm_id)
                                      : json_null();
    bool ok =
        put(o, "comm", comm) && put(o, "job", json_integer(d->job)) &&
        put(o, "attempt", json_integer(d->attempt)) && put(o, "world_size", json_integer(d->world_size)) &&
        (d->rank < 0 || put(o, "rank", json_integer(d->rank))) && put(o, "spec", spec_to_json(&d->spec)) &&
        put(o, "data_dir", json_string(d->data_dir)) && put(o, "out_dir", json_string(d->out_dir)) &&
        put(o, "resume", d->resume[0] ? json_string(d->resume) : json_null()) &&
        (!d->resume_force || put(o, "resume_force", json_true())) &&
        (!d->init_path[0] || put(o, "init_path", json_string(d->init_path))) &&
        put(o, "disk_quota", d->disk_quota > 0 ? json_integer(d->disk_quota) : json_null()) &&
        (d->max_rank_memory <= 0 || put(o, "max_rank_memory", json_integer(d->max_rank_memory))) &&
        (d->stop_at <= 0 || put(o, "stop_at", json_integer(d->stop_at)));
    if (!ok) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* ---- the planner's answer (ddpd-worker --plan's stdout) ---------------------------------- */

/* The error answer: the `error` event of a rank, with "path" for a spec error or a changed
 * data file whose path needs no escaping (a path that would is left out rather than sent
 * damaged), and "code", the error's API code, which the kind alone does not tell
 * (bad_data or data_changed). */
static char *encode_error(const struct jobdoc_plan_answer *a, double ts)
{
    struct event ev;
    char line[EVENT_LINE_MAX + 400]; /* room for the path (< 256 bytes) and the code after the event */
    memset(&ev, 0, sizeof ev);
    ev.kind = EVENT_ERROR;
    ev.ts = ts;
    snprintf(ev.error_kind, sizeof ev.error_kind, "%s", ddpd_err_kind(a->code));
    snprintf(ev.message, sizeof ev.message, "%s", a->message);
    int n = event_encode(&ev, line, EVENT_LINE_MAX);
    if (n < 2)
        return NULL;
    bool plain = (a->code == DDPD_ESPEC || a->code == DDPD_EDATACHANGED) && a->path[0];
    for (const char *c = a->path; plain && *c; c++)
        plain = *c > 0x20 && *c < 0x7f && *c != '"' && *c != '\\';
    if (line[n - 1] != '}')
        return NULL;
    n--;
    if (plain)
        n += snprintf(line + n, sizeof line - (size_t)n, ",\"path\":\"%s\"", a->path);
    snprintf(line + n, sizeof line - (size_t)n, ",\"code\":\"%s\"}", ddpd_err_code(a->code));
    return strdup(line);
}

char *jobdoc_plan_answer_encode(const struct jobdoc_plan_answer *a, double ts)
{
    if (a->code != DDPD_OK)
        return encode_error(a, ts);
    if (!a->known || a->world_size < 1 || a->world_size > SPEC_MAX_WORLD)
        return strdup("{\"batches\":null}");
    size_t cap = 16 + 21 * (size_t)a->world_size, len = 0;
    char *out = malloc(cap);
    if (!out)
        return NULL;
    len += (size_t)snprintf(out, cap, "{\"batches\":[");
    for (int r = 0; r < a->world_size; r++)
        len += (size_t)snprintf(out + len, cap - len, "%s%lld", r ? "," : "", (long long)a->batches[r]);
    snprintf(out + len, cap - len, "]}");
    return out;
}

bool jobdoc_plan_answer_decode(const char *line, size_t len, int world_size, struct jobdoc_plan_answer *out)
{
    memset(out, 0, sizeof *out);
    out->world_size = world_size;
    json_t *j = json_loadb(line, len, 0, NULL);
    json_t *b = json_object_get(j, "batches");
    bool ok = false;
    struct event ev;
    if (json_is_array(b) && world_size >= 1 && world_size <= SPEC_MAX_WORLD &&
        json_array_size(b) == (size_t)world_size) {
        ok = true;
        for (int r = 0; r < world_size && ok; r++) {
            json_t *v = json_array_get(b, (size_t)r);
            ok = json_is_integer(v) && json_integer_value(v) >= 0;
            out->batches[r] = ok ? json_integer_value(v) : 0;
        }
        out->known = ok;
    } else if (b && json_is_null(b)) {
        ok = true;
    } else if (j && event_decode(line, len, &ev, NULL) == DDPD_OK && ev.kind == EVENT_ERROR) {
        const char *path = json_string_value(json_object_get(j, "path"));
        ddpd_err code;
        out->code = !strcmp(ev.error_kind, "data") ? DDPD_EDATA : DDPD_ESPEC;
        /* Only a rank's errors: the answer is the error a rank would die of. */
        if (ddpd_err_from_code(json_string_value(json_object_get(j, "code")), &code) &&
            ddpd_err_exit(code) == 2 && code != DDPD_OK)
            out->code = code;
        snprintf(out->path, sizeof out->path, "%s", path ? path : "");
        snprintf(out->message, sizeof out->message, "%s", ev.message);
        ok = true;
    }
    json_decref(j);
    return ok;
}
