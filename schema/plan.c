/* plan.c (schema) — the planner's request and answer lines: jansson for the request and
 * for reading the answer, the event encoder for an error answer. */
#include "plan.h"
#include "codec_impl.h"
#include "event.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

json_t *plan_request_to_json(const struct plan_request *r)
{
    json_t *o = json_pack("{s:i, s:o, s:s, s:I}", "world_size", r->world_size, "spec", spec_to_json(&r->spec),
                          "data_dir", r->data_dir, "max_rank_memory", (json_int_t)r->max_rank_memory);
    if (o && r->init_path[0] && json_object_set_new(o, "init_path", json_string(r->init_path)) != 0) {
        json_decref(o);
        return NULL;
    }
    return o;
}

ddpd_err plan_request_from_json(const json_t *obj, struct plan_request *out, struct ddpd_error *err)
{
    int64_t world;
    ddpd_err rc;
    memset(out, 0, sizeof *out);
    if ((rc = schema__get_int(obj, "world_size", 1, SPEC_MAX_WORLD, &world, err)) ||
        (rc = schema__get_str(obj, "data_dir", out->data_dir, sizeof out->data_dir, err)) ||
        (rc = schema__get_opt_int(obj, "max_rank_memory", false, 0, &out->max_rank_memory, err)) ||
        (rc = schema__get_str(obj, "init_path", out->init_path, sizeof out->init_path, err)) ||
        (rc = spec_from_json(json_object_get(obj, "spec"), NULL, &out->spec, err)))
        return rc;
    out->world_size = (int)world;
    return DDPD_OK;
}

/* The error answer: the `error` event of a rank, with "path" for a spec error whose path
 * needs no escaping (a path that would is left out rather than sent damaged). */
static char *encode_error(const struct plan_answer *a, double ts)
{
    struct event ev;
    char line[EVENT_LINE_MAX + 300];
    memset(&ev, 0, sizeof ev);
    ev.kind = EVENT_ERROR;
    ev.ts = ts;
    snprintf(ev.error_kind, sizeof ev.error_kind, "%s", ddpd_err_kind(a->code));
    snprintf(ev.message, sizeof ev.message, "%s", a->message);
    int n = event_encode(&ev, line, EVENT_LINE_MAX);
    if (n < 2)
        return NULL;
    bool plain = a->code == DDPD_ESPEC && a->path[0];
    for (const char *c = a->path; plain && *c; c++)
        plain = *c > 0x20 && *c < 0x7f && *c != '"' && *c != '\\';
    if (plain && line[n - 1] == '}')
        snprintf(line + n - 1, sizeof line - (size_t)(n - 1), ",\"path\":\"%s\"}", a->path);
    return strdup(line);
}

char *plan_answer_encode(const struct plan_answer *a, double ts)
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

bool plan_answer_decode(const char *line, size_t len, int world_size, struct plan_answer *out)
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
        out->code = !strcmp(ev.error_kind, "data") ? DDPD_EDATA : DDPD_ESPEC;
        snprintf(out->path, sizeof out->path, "%s", path ? path : "");
        snprintf(out->message, sizeof out->message, "%s", ev.message);
        ok = true;
    }
    json_decref(j);
    return ok;
}
