/* store_users.c — the store's room for named users (the cluster migration): add, read,
 * list, remove, rotate and change a user, find one by the hash of a token, count a user's
 * waiting jobs, read a job's or sweep's owner. Users are few and their statements cheap:
 * each call prepares its own. Stores only tokens' hashes. Knows nothing of HTTP. */
#include <sqlite3.h>
#include <stdlib.h>
#include <string.h>

#include "../base/clock.h"
#include "store.h"
#include "store_impl.h"
#include "users.h"

#define USER_COLS "name, role, max_priority, max_gpus, max_cpu_ranks, max_queued, created_at, rotated_at "

static sqlite3_stmt *prep(struct conn *c, const char *sql, struct ddpd_error *err)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(c->db, sql, -1, &st, NULL);
    if (rc != SQLITE_OK) {
        sq_fail(err, c->db, rc, "prepare a user statement");
        sqlite3_finalize(st);
        return NULL;
    }
    return st;
}

static int64_t col_limit(sqlite3_stmt *st, int i)
{
    return sqlite3_column_type(st, i) == SQLITE_NULL ? USER_NO_LIMIT : sqlite3_column_int64(st, i);
}

static void bind_limit(sqlite3_stmt *st, int i, int64_t v)
{
    if (v < 0)
        sqlite3_bind_null(st, i);
    else
        sqlite3_bind_int64(st, i, v);
}

static void user_row(sqlite3_stmt *st, struct user *u)
{
    memset(u, 0, sizeof *u);
    copy_text(u->name, sizeof u->name, col_text(st, 0));
    if (!user_role_parse(col_text(st, 1), &u->role))
        u->role = USER_ROLE_VIEWER; /* the table's CHECK keeps this from happening */
    u->max_priority = sqlite3_column_int(st, 2);
    u->max_gpus = col_limit(st, 3);
    u->max_cpu_ranks = col_limit(st, 4);
    u->max_queued = col_limit(st, 5);
    u->created_at = sqlite3_column_double(st, 6);
    u->rotated_at = sqlite3_column_double(st, 7);
}

/* One write statement with `bind` applied, in its own transaction; *changes its rows. */
static ddpd_err write1(struct store *s, const char *sql, const char *op,
                       void (*bind)(sqlite3_stmt *, const void *), const void *arg, int *changes,
                       struct ddpd_error *err)
{
    ddpd_err e = wtx_begin(s, err);
    if (e)
        return e;
    sqlite3_stmt *st = prep(s->w, sql, err);
    if (!st) {
        e = err ? err->code : DDPD_EIO;
        goto out;
    }
    bind(st, arg);
    int rc = sqlite3_step(st);
    if (rc != SQLITE_DONE)
        e = sq_fail(err, s->w->db, rc, op);
    else if (changes)
        *changes = sqlite3_changes(s->w->db);
out:
    sqlite3_finalize(st);
    return wtx_end(s, e, err);
}

struct add_args {
    const struct user *u;
    const char *hash;
    double now;
};

static void bind_add(sqlite3_stmt *st, const void *arg)
{
    const struct add_args *a = arg;
    sqlite3_bind_text(st, 1, a->u->name, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, user_role_name(a->u->role), -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, a->hash, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 4, a->u->max_priority);
    bind_limit(st, 5, a->u->max_gpus);
    bind_limit(st, 6, a->u->max_cpu_ranks);
    bind_limit(st, 7, a->u->max_queued);
    sqlite3_bind_double(st, 8, a->now);
}

ddpd_err store_user_add(struct store *s, const struct user *u, const char *token_sha256,
                        struct ddpd_error *err)
{
    struct add_args a = {u, token_sha256, base_wall_s()};
    struct ddpd_error e2;
    ddpd_err e = write1(s,
                        "INSERT INTO users (name, role, token_sha256, max_priority, max_gpus, max_cpu_ranks, "
                        "max_queued, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                        "add a user", bind_add, &a, NULL, &e2);
    if (e == DDPD_ECONFLICT)
        return ddpd_error_set(err, DDPD_ECONFLICT, "name", "there is already a user named %s", u->name);
    if (e && err)
        *err = e2;
    return e;
}

/* A read of one user row by `sql` bound to `key`. */
static ddpd_err read_user(struct store *s, const char *sql, const char *key, struct user *out, char *hash,
                          struct ddpd_error *err)
{
    ddpd_err e;
    struct conn *c = reader_get(s, err);
    if (!c)
        return err ? err->code : DDPD_EIO;
    sqlite3_stmt *st = prep(c, sql, err);
    if (!st) {
        e = err ? err->code : DDPD_EIO;
        goto out;
    }
    sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        user_row(st, out);
        if (hash)
            copy_text(hash, USER_HASH_HEX + 1, col_text(st, 8));
        e = DDPD_OK;
    } else if (rc == SQLITE_DONE) {
        e = DDPD_ENOTFOUND;
        if (err)
            err->code = DDPD_ENOTFOUND;
    } else {
        e = sq_fail(err, c->db, rc, "read a user");
    }
out:
    sqlite3_finalize(st);
    reader_put(s, c);
    return e;
}

ddpd_err store_user_get(struct store *s, const char *name, struct user *out, struct ddpd_error *err)
{
    ddpd_err e =
        read_user(s, "SELECT " USER_COLS ", token_sha256 FROM users WHERE name = ?1", name, out, NULL, err);
    if (e == DDPD_ENOTFOUND)
        return ddpd_error_set(err, DDPD_ENOTFOUND, "", "there is no user named %s", name);
    return e;
}

ddpd_err store_user_find_token(struct store *s, const char *token_sha256, struct user *out,
                               struct ddpd_error *err)
{
    char stored[USER_HASH_HEX + 1] = "";
    ddpd_err e = read_user(s, "SELECT " USER_COLS ", token_sha256 FROM users WHERE token_sha256 = ?1",
                           token_sha256, out, stored, err);
    if (e == DDPD_ENOTFOUND || (e == DDPD_OK && !user_hash_equal(stored, token_sha256))) {
        memset(out, 0, sizeof *out);
        return ddpd_error_set(err, DDPD_ENOTFOUND, "", "no user has this token");
    }
    return e;
}

ddpd_err store_user_list(struct store *s, struct user **out, size_t *n, struct ddpd_error *err)
{
    *out = NULL;
    *n = 0;
    ddpd_err e = DDPD_OK;
    struct conn *c = reader_get(s, err);
    if (!c)
        return err ? err->code : DDPD_EIO;
    sqlite3_stmt *st = prep(c, "SELECT " USER_COLS " FROM users ORDER BY name", err);
    size_t cap = 0;
    int rc;
    if (!st) {
        e = err ? err->code : DDPD_EIO;
        goto out;
    }
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            struct user *u = realloc(*out, cap * sizeof *u);
            if (!u) {
                e = ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory listing users");
                goto out;
            }
            *out = u;
        }
        user_row(st, &(*out)[(*n)++]);
    }
    if (rc != SQLITE_DONE)
        e = sq_fail(err, c->db, rc, "list the users");
out:
    if (e) {
        free(*out);
        *out = NULL;
        *n = 0;
    }
    sqlite3_finalize(st);
    reader_put(s, c);
    return e;
}

static void bind_name(sqlite3_stmt *st, const void *arg)
{
    sqlite3_bind_text(st, 1, arg, -1, SQLITE_STATIC);
}

ddpd_err store_user_remove(struct store *s, const char *name, struct ddpd_error *err)
{
    int changes = 0;
    ddpd_err e =
        write1(s, "DELETE FROM users WHERE name = ?1", "remove a user", bind_name, name, &changes, err);
    if (e == DDPD_OK && changes == 0)
        return ddpd_error_set(err, DDPD_ENOTFOUND, "", "there is no user named %s", name);
    return e;
}

struct rotate_args {
    const char *name, *hash;
    double now;
};

static void bind_rotate(sqlite3_stmt *st, const void *arg)
{
    const struct rotate_args *a = arg;
    sqlite3_bind_text(st, 1, a->name, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, a->hash, -1, SQLITE_STATIC);
    sqlite3_bind_double(st, 3, a->now);
}

ddpd_err store_user_rotate(struct store *s, const char *name, const char *token_sha256,
                           struct ddpd_error *err)
{
    struct rotate_args a = {name, token_sha256, base_wall_s()};
    int changes = 0;
    ddpd_err e = write1(s, "UPDATE users SET token_sha256 = ?2, rotated_at = ?3 WHERE name = ?1",
                        "rotate a user's token", bind_rotate, &a, &changes, err);
    if (e == DDPD_OK && changes == 0)
        return ddpd_error_set(err, DDPD_ENOTFOUND, "", "there is no user named %s", name);
    return e;
}

static void bind_update(sqlite3_stmt *st, const void *arg)
{
    const struct user *u = arg;
    sqlite3_bind_text(st, 1, u->name, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, user_role_name(u->role), -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 3, u->max_priority);
    bind_limit(st, 4, u->max_gpus);
    bind_limit(st, 5, u->max_cpu_ranks);
    bind_limit(st, 6, u->max_queued);
}

ddpd_err store_user_update(struct store *s, const struct user *u, struct ddpd_error *err)
{
    int changes = 0;
    ddpd_err e = write1(s,
                        "UPDATE users SET role = ?2, max_priority = ?3, max_gpus = ?4, max_cpu_ranks = ?5, "
                        "max_queued = ?6 WHERE name = ?1",
                        "change a user", bind_update, u, &changes, err);
    if (e == DDPD_OK && changes == 0)
        return ddpd_error_set(err, DDPD_ENOTFOUND, "", "there is no user named %s", u->name);
    return e;
}

/* One integer of `sql` with ?1 bound to `text` (when not NULL) or `id`. */
static ddpd_err read_int(struct store *s, const char *sql, const char *text, int64_t id, int64_t *out,
                         bool *found, struct ddpd_error *err)
{
    ddpd_err e = DDPD_OK;
    struct conn *c = reader_get(s, err);
    if (!c)
        return err ? err->code : DDPD_EIO;
    sqlite3_stmt *st = prep(c, sql, err);
    if (!st) {
        e = err ? err->code : DDPD_EIO;
        goto out;
    }
    if (text)
        sqlite3_bind_text(st, 1, text, -1, SQLITE_STATIC);
    else
        sqlite3_bind_int64(st, 1, id);
    int rc = sqlite3_step(st);
    *found = rc == SQLITE_ROW;
    if (rc == SQLITE_ROW)
        *out = sqlite3_column_int64(st, 0);
    else if (rc != SQLITE_DONE)
        e = sq_fail(err, c->db, rc, "read the users");
out:
    sqlite3_finalize(st);
    reader_put(s, c);
    return e;
}

ddpd_err store_user_any(struct store *s, bool *any, struct ddpd_error *err)
{
    int64_t v = 0;
    bool found;
    ddpd_err e = read_int(s, "SELECT EXISTS (SELECT 1 FROM users)", NULL, 0, &v, &found, err);
    *any = e == DDPD_OK && v != 0;
    return e;
}

ddpd_err store_user_queued(struct store *s, const char *owner, int64_t *n, struct ddpd_error *err)
{
    bool found;
    *n = 0;
    return read_int(s, "SELECT count(*) FROM jobs WHERE owner = ?1 AND state IN ('queued', 'preempted')",
                    owner, 0, n, &found, err);
}

ddpd_err store_owner_get(struct store *s, bool sweep, int64_t id, char *owner, size_t cap,
                         struct ddpd_error *err)
{
    owner[0] = '\0';
    ddpd_err e = DDPD_OK;
    struct conn *c = reader_get(s, err);
    if (!c)
        return err ? err->code : DDPD_EIO;
    sqlite3_stmt *st = prep(
        c, sweep ? "SELECT owner FROM sweeps WHERE id = ?1" : "SELECT owner FROM jobs WHERE id = ?1", err);
    if (!st) {
        e = err ? err->code : DDPD_EIO;
        goto out;
    }
    sqlite3_bind_int64(st, 1, id);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW)
        copy_text(owner, cap, col_text(st, 0));
    else if (rc == SQLITE_DONE)
        e = ddpd_error_set(err, DDPD_ENOTFOUND, "", "%s %lld not found", sweep ? "sweep" : "job",
                           (long long)id);
    else
        e = sq_fail(err, c->db, rc, "read an owner");
out:
    sqlite3_finalize(st);
    reader_put(s, c);
    return e;
}
