/* api_access.c — who may make each /v1 request (docs/security.md): one row per route of
 * api.c's table with the role it needs and, for the routes that act on one job or sweep,
 * that its owner or an admin makes it. The dispatcher calls api_authorize after the
 * bearer token named the principal and before the body is read; every refusal is a 403
 * whose sentence names the role or the owner needed. Knows no SQL (the owner comes from
 * the store). */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "../base/check.h"
#include "api.h"
#include "api_impl.h"
#include "store.h"
#include "users.h"

enum access {
    ACCESS_READ,        /* every role */
    ACCESS_COMPUTE,     /* user and admin: submits work */
    ACCESS_OWNER_JOB,   /* the job's owner (a user) or an admin */
    ACCESS_OWNER_SWEEP, /* the sweep's owner (a user) or an admin */
    ACCESS_ADMIN,       /* admin only */
};

/* One route's rule: what it is called in a sentence ("cancelling a job") and, for an
 * owner's route, the verb ("cancel it"). */
struct access_row {
    const char *method, *pattern;
    enum access access;
    const char *doing, *verb;
};

/* Every AUTH row of api.c's table (test_permissions.py checks the two agree). A route
 * missing here is refused to all but admins (GET: allowed to all), never opened by
 * accident. */
static const struct access_row rows[] = {
    {"POST", "/v1/jobs", ACCESS_COMPUTE, "submitting a job", NULL},
    {"GET", "/v1/jobs", ACCESS_READ, NULL, NULL},
    {"GET", "/v1/jobs/{id}", ACCESS_READ, NULL, NULL},
    {"DELETE", "/v1/jobs/{id}", ACCESS_OWNER_JOB, "deleting a job", "delete it"},
    {"PATCH", "/v1/jobs/{id}", ACCESS_OWNER_JOB, "changing a job's tags or notes",
     "change its tags or notes"},
    {"POST", "/v1/jobs/{id}/cancel", ACCESS_OWNER_JOB, "cancelling a job", "cancel it"},
    {"POST", "/v1/jobs/{id}/resume", ACCESS_OWNER_JOB, "resuming a job", "resume it"},
    {"POST", "/v1/jobs/{id}/preempt", ACCESS_OWNER_JOB, "preempting a job", "preempt it"},
    {"GET", "/v1/jobs/{id}/events", ACCESS_READ, NULL, NULL},
    {"GET", "/v1/jobs/{id}/metrics", ACCESS_READ, NULL, NULL},
    {"GET", "/v1/jobs/{id}/logs", ACCESS_READ, NULL, NULL},
    {"GET", "/v1/jobs/{id}/checkpoint", ACCESS_READ, NULL, NULL},
    {"GET", "/v1/jobs/{id}/checkpoints", ACCESS_READ, NULL, NULL},
    {"GET", "/v1/jobs/{id}/pytorch", ACCESS_READ, NULL, NULL},
    {"POST", "/v1/jobs/{id}/generate", ACCESS_COMPUTE, "generating from a job's model", NULL},
    {"POST", "/v1/jobs/{id}/predict", ACCESS_COMPUTE, "predicting with a job's model", NULL},
    {"GET", "/v1/inference", ACCESS_READ, NULL, NULL},
    {"POST", "/v1/sweeps", ACCESS_COMPUTE, "submitting a sweep", NULL},
    {"GET", "/v1/sweeps", ACCESS_READ, NULL, NULL},
    {"GET", "/v1/sweeps/{id}", ACCESS_READ, NULL, NULL},
    {"POST", "/v1/sweeps/{id}/cancel", ACCESS_OWNER_SWEEP, "cancelling a sweep", "cancel it"},
    {"GET", "/v1/devices", ACCESS_READ, NULL, NULL},
    {"GET", "/v1/queue", ACCESS_READ, NULL, NULL},
    {"GET", "/v1/whoami", ACCESS_READ, NULL, NULL},
    {"GET", "/v1/users", ACCESS_ADMIN, "listing users", NULL},
    {"POST", "/v1/users", ACCESS_ADMIN, "adding a user", NULL},
    {"PATCH", "/v1/users/{name:word}", ACCESS_ADMIN, "changing a user", NULL},
    {"DELETE", "/v1/users/{name:word}", ACCESS_ADMIN, "removing a user", NULL},
    {"POST", "/v1/users/{name:word}/rotate", ACCESS_ADMIN, "rotating a user's token", NULL},
};

static const struct access_row *find_row(const char *method, const char *pattern)
{
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        if (!strcmp(rows[i].method, method) && !strcmp(rows[i].pattern, pattern))
            return &rows[i];
    return NULL;
}

bool api_access_known(const char *method, const char *pattern)
{
    return find_row(method, pattern) != NULL;
}

/* The role a principal needs for `access` beyond its own, as words. */
static const char *needs(enum access access)
{
    return access == ACCESS_ADMIN ? "the role admin" : "the role user or admin";
}

ddpd_err api_authorize(void *ctx, struct http_request *req, struct ddpd_error *err)
{
    struct api *a = ctx;
    const struct user *u = http_request_user(req);
    const char *method = http_request_method(req), *pattern = http_request_route(req);
    const struct access_row *row = find_row(method, pattern);
    struct access_row fallback = {method, pattern, strcmp(method, "GET") ? ACCESS_ADMIN : ACCESS_READ,
                                  "this request", NULL};
    if (!row)
        row = &fallback;
    if (!u)
        return ddpd_error_set(err, DDPD_EAUTH, "", "this request needs a bearer token");
    if (row->access == ACCESS_READ || u->role == USER_ROLE_ADMIN)
        return DDPD_OK;
    if (u->role == USER_ROLE_VIEWER)
        return ddpd_error_set(err, DDPD_EFORBIDDEN, "", "viewer %s may only read: %s needs %s", u->name,
                              row->doing, needs(row->access));
    if (row->access == ACCESS_ADMIN)
        return ddpd_error_set(err, DDPD_EFORBIDDEN, "", "%s %s is not an admin: %s needs the role admin",
                              user_role_name(u->role), u->name, row->doing);
    if (row->access == ACCESS_COMPUTE)
        return DDPD_OK;
    /* An owner's route: the job or sweep of the path. One that does not exist is the
     * handler's 404. */
    bool sweep = row->access == ACCESS_OWNER_SWEEP;
    int64_t id = http_request_id(req, 0);
    char owner[STORE_OWNER_MAX];
    struct ddpd_error e;
    ddpd_err rc = store_owner_get(a->store, sweep, id, owner, sizeof owner, &e);
    if (rc == DDPD_ENOTFOUND)
        return DDPD_OK;
    if (rc) {
        *err = e;
        return rc;
    }
    if (!strcmp(owner, u->name))
        return DDPD_OK;
    if (!owner[0])
        return ddpd_error_set(err, DDPD_EFORBIDDEN, "",
                              "%s %" PRId64
                              " has no owner (it was submitted before users): only an admin may %s",
                              sweep ? "sweep" : "job", id, row->verb);
    return ddpd_error_set(err, DDPD_EFORBIDDEN, "", "%s %" PRId64 " is %s's: only %s or an admin may %s",
                          sweep ? "sweep" : "job", id, owner, owner, row->verb);
}
