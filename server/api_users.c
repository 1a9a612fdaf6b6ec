/* api_users.c — named users over HTTP (docs/security.md, docs/api.md): the callbacks by
 * which the dispatcher authenticates a bearer token against the users table, GET
 * /v1/whoami, the admin's /v1/users routes, and the limits a user's submission keeps
 * (max_priority, preemptible, max_gpus, max_cpu_ranks, max_queued). Who may call which
 * route is api_access.c's. Knows no SQL: the rows are the store's (store_users.c). */
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "api_impl.h"
#include "store.h"
#include "token.h"
#include "users.h"

int api_users_exist(void *ctx, struct ddpd_error *err)
{
    struct api *a = ctx;
    bool any = false;
    if (store_user_any(a->store, &any, err) != DDPD_OK)
        return -1;
    return any;
}

ddpd_err api_authenticate(void *ctx, const char *token, size_t len, struct user *out, struct ddpd_error *err)
{
    struct api *a = ctx;
    char hash[USER_HASH_HEX + 1];
    if (len == 0 || len > TOKEN_MAX)
        return ddpd_error_set(err, DDPD_EAUTH, "", "the bearer token is not valid");
    if (!user_token_hash(token, len, hash))
        return ddpd_error_set(err, DDPD_EINTERNAL, "", "cannot hash the bearer token (libcrypto failed)");
    return store_user_find_token(a->store, hash, out, err);
}

/* ---- the limits of a submission ---------------------------------------------------------- */

ddpd_err api__user_limits(struct api *a, const struct user *u, const struct spec *spec, bool count_queued,
                          struct ddpd_error *err)
{
    if (!u || u->role == USER_ROLE_ADMIN)
        return DDPD_OK; /* admins have no cap */
    if (spec->priority > u->max_priority)
        return ddpd_error_set(err, DDPD_EFORBIDDEN, "priority",
                              "priority %d is above %s's max_priority %d; an admin may raise it "
                              "(ddpd users set %s --max-priority %d)",
                              spec->priority, u->name, u->max_priority, u->name, spec->priority);
    if (!spec->preemptible)
        return ddpd_error_set(err, DDPD_EFORBIDDEN, "preemptible",
                              "preemptible false: only an admin may submit a job that cannot be preempted, "
                              "and %s is a %s",
                              u->name, user_role_name(u->role));
    bool gpu = spec->device == DEVICE_CUDA;
    int64_t cap = gpu ? u->max_gpus : u->max_cpu_ranks;
    if (cap >= 0 && spec->world_size > cap)
        return ddpd_error_set(err, DDPD_EFORBIDDEN, "world_size",
                              "world_size %d can never run: %s may use at most %" PRId64 " %s at once (%s)",
                              spec->world_size, u->name, cap, gpu ? "GPUs" : "CPU ranks",
                              gpu ? "max_gpus" : "max_cpu_ranks");
    if (count_queued && u->max_queued >= 0) {
        int64_t n = 0;
        ddpd_err rc = store_user_queued(a->store, u->name, &n, err);
        if (rc)
            return rc;
        if (n >= u->max_queued)
            return ddpd_error_set(err, DDPD_EQUOTA, "max_queued",
                                  "quota: %s has %" PRId64 " of %" PRId64 " queued jobs (max_queued)",
                                  u->name, n, u->max_queued);
    }
    return DDPD_OK;
}

/* ---- the routes --------------------------------------------------------------------------- */

static ddpd_err respond_user(struct http_request *req, int status, const struct user *u, const char *token)
{
    json_t *o = user_to_json(u);
    if (o && token)
        json_object_set_new(o, "token", json_string(token));
    return http_respond_json(req, status, o);
}

/* GET /v1/whoami: the caller as the server sees it. */
ddpd_err api__whoami(struct http_request *req, struct ddpd_error *err)
{
    const struct user *u = http_request_user(req);
    if (!u)
        return ddpd_error_set(err, DDPD_EAUTH, "", "this request needs a bearer token");
    return respond_user(req, 200, u, NULL);
}

/* GET /v1/users: {"users": [...]}, by name, never a token. */
ddpd_err api__users_list(struct http_request *req, struct ddpd_error *err)
{
    struct user *l = NULL;
    size_t n = 0;
    ddpd_err rc = store_user_list(api__ctx(req)->store, &l, &n, err);
    if (rc)
        return rc;
    json_t *arr = json_array();
    for (size_t i = 0; i < n && arr; i++)
        json_array_append_new(arr, user_to_json(&l[i]));
    free(l);
    return http_respond_json(req, 200, json_pack("{s:o}", "users", arr));
}

/* The {name:word} of /v1/users/{name}[/rotate], checked. */
static ddpd_err path_name(struct http_request *req, char *name, size_t cap, struct ddpd_error *err)
{
    char why[200];
    if (!http_request_segment(req, 2, name, cap) || !user_name_check(name, why, sizeof why))
        return ddpd_error_set(err, DDPD_ENOTFOUND, "", "there is no user named %s", name);
    return DDPD_OK;
}

/* POST /v1/users {"name", "role", limits}: 201 with the user and its token, shown once. */
ddpd_err api__users_add(struct http_request *req, struct ddpd_error *err)
{
    struct api *a = api__ctx(req);
    json_t *body = http_request_json(req);
    struct user u;
    char path[64], why[300], token[USER_TOKEN_HEX + 1], hash[USER_HASH_HEX + 1];
    user_defaults(&u);
    if (!user_from_json(body, true, &u, path, sizeof path, why, sizeof why))
        return ddpd_error_set(err, DDPD_ESPEC, path, "%s", why);
    if (!u.name[0])
        return ddpd_error_set(err, DDPD_ESPEC, "name", "name: a new user needs a name");
    if (!json_object_get(body, "role"))
        return ddpd_error_set(err, DDPD_ESPEC, "role",
                              "role: a new user needs a role: admin, user or viewer");
    if (user_name_reserved(u.name))
        return ddpd_error_set(
            err, DDPD_ESPEC, "name",
            "name: %s is the name of a built-in admin (the --token-file token's, or the open "
            "loopback mode's); choose another",
            u.name);
    if (!user_token_new(token) || !user_token_hash(token, strlen(token), hash))
        return ddpd_error_set(err, DDPD_EINTERNAL, "", "cannot make a token (libcrypto failed)");
    ddpd_err rc = store_user_add(a->store, &u, hash, err);
    if (rc)
        return rc;
    struct user back;
    if (store_user_get(a->store, u.name, &back, err) == DDPD_OK)
        u = back;
    char loc[96];
    snprintf(loc, sizeof loc, "/v1/users/%s", u.name);
    http_response_header(req, "Location", loc);
    return respond_user(req, 201, &u, token);
}

/* PATCH /v1/users/{name}: role and limits; 200 with the user. */
ddpd_err api__users_patch(struct http_request *req, struct ddpd_error *err)
{
    struct api *a = api__ctx(req);
    char name[USER_NAME_MAX + 1], path[64], why[300];
    struct user u;
    ddpd_err rc = path_name(req, name, sizeof name, err);
    if (rc || (rc = store_user_get(a->store, name, &u, err)))
        return rc;
    json_t *body = http_request_json(req);
    if (json_is_object(body) && json_object_size(body) == 0)
        return ddpd_error_set(
            err, DDPD_ESPEC, "",
            "nothing to change: give role, max_priority, max_gpus, max_cpu_ranks or max_queued");
    if (!user_from_json(body, false, &u, path, sizeof path, why, sizeof why))
        return ddpd_error_set(err, DDPD_ESPEC, path, "%s", why);
    if ((rc = store_user_update(a->store, &u, err)))
        return rc;
    return respond_user(req, 200, &u, NULL);
}

/* DELETE /v1/users/{name}: 204; its token stops working at once, its jobs stay. */
ddpd_err api__users_delete(struct http_request *req, struct ddpd_error *err)
{
    char name[USER_NAME_MAX + 1];
    ddpd_err rc = path_name(req, name, sizeof name, err);
    if (rc || (rc = store_user_remove(api__ctx(req)->store, name, err)))
        return rc;
    return http_respond_empty(req, 204);
}

/* POST /v1/users/{name}/rotate: a new token (shown once); the old one stops working. */
ddpd_err api__users_rotate(struct http_request *req, struct ddpd_error *err)
{
    struct api *a = api__ctx(req);
    char name[USER_NAME_MAX + 1], token[USER_TOKEN_HEX + 1], hash[USER_HASH_HEX + 1];
    struct user u;
    ddpd_err rc = path_name(req, name, sizeof name, err);
    if (rc)
        return rc;
    if (!user_token_new(token) || !user_token_hash(token, strlen(token), hash))
        return ddpd_error_set(err, DDPD_EINTERNAL, "", "cannot make a token (libcrypto failed)");
    if ((rc = store_user_rotate(a->store, name, hash, err)) || (rc = store_user_get(a->store, name, &u, err)))
        return rc;
    return respond_user(req, 200, &u, token);
}
