/* jobdoc.c — the worker's stdin document: one encoder, one decoder (jansson). The
 * messages name the key and say "in the job document", as the worker's always did. */
#include "jobdoc.h"
#include "codec_impl.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

ddpd_err schema__get_str(const json_t *obj, const char *key, char *buf, size_t cap, struct ddpd_error *err)
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

ddpd_err schema__get_int(const json_t *obj, const char *key, int64_t lo, int64_t hi, int64_t *out,
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

ddpd_err schema__get_opt_int(const json_t *obj, const char *key, bool null_ok, int64_t none, int64_t *out,
                             struct ddpd_error *err)
{
    json_t *v = json_object_get(obj, key);
    *out = none;
    if (!v || (null_ok && json_is_null(v)))
        return DDPD_OK;
    return schema__get_int(obj, key, 0, INT64_MAX, out, err);
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

ddpd_err jobdoc_from_json(const json_t *obj, struct jobdoc *out, struct ddpd_error *err)
{
    int64_t v;
    ddpd_err rc;
    memset(out, 0, sizeof *out);
    out->rank = -1;
    if (!json_is_object(obj))
        return ddpd_error_set(err, DDPD_ESPEC, "", "the job document is not a JSON object");
    if ((rc = schema__get_int(obj, "world_size", 1, SPEC_MAX_WORLD, &v, err)))
        return rc;
    out->world_size = (int)v;
    if (json_object_get(obj, "rank")) {
        if ((rc = schema__get_int(obj, "rank", 0, out->world_size - 1, &v, err)))
            return rc;
        out->rank = (int)v;
    }
    if ((rc = schema__get_str(obj, "data_dir", out->data_dir, sizeof out->data_dir, err)) ||
        (rc = schema__get_str(obj, "out_dir", out->out_dir, sizeof out->out_dir, err)) ||
        (rc = schema__get_str(obj, "resume", out->resume, sizeof out->resume, err)) ||
        (rc = schema__get_str(obj, "init_path", out->init_path, sizeof out->init_path, err)) ||
        (rc = schema__get_opt_int(obj, "disk_quota", true, 0, &out->disk_quota, err)))
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
    if (out->world_size > 1 && (rc = get_comm(obj, out, err)))
        return rc;
    if ((rc = schema__get_opt_int(obj, "max_rank_memory", false, 0, &out->max_rank_memory, err)) ||
        (rc = schema__get_opt_int(obj, "job", false, 0, &out->job, err)) ||
        (rc = schema__get_opt_int(obj, "attempt", false, 0, &out->attempt, err)))
        return rc;
    return DDPD_OK;
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
        (!d->init_path[0] || put(o, "init_path", json_string(d->init_path))) &&
        put(o, "disk_quota", d->disk_quota > 0 ? json_integer(d->disk_quota) : json_null()) &&
        (d->max_rank_memory <= 0 || put(o, "max_rank_memory", json_integer(d->max_rank_memory)));
    if (!ok) {
        json_decref(o);
        return NULL;
    }
    return o;
}
