/* store.c — opening the job store: the database file and its mode, WAL and the pragmas,
 * the migrations, the quick check, the writer and inserter threads' start and stop, the
 * one-server lock and the health read. The store's other rooms are store_conn.c
 * (connections, statements, transactions), store_events.c, store_insert.c, store_jobs.c
 * and store_metrics.c. Knows nothing of HTTP, processes or scheduling. */
#include "store.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include "../base/alloc.h"
#include "../base/clock.h"
#include "../base/file.h"
#include "store_impl.h"

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

/* ---- migrations: schema/migrations/NNN_*.sql, generated into C by the build ---- */

#include "store_migrations.h" /* migrations[]: {name, sql} (cmake/embed_migrations.cmake) */

int store_schema_version(void)
{
    return (int)COUNT(migrations);
}

const char *store_migration_sql(int version, const char **name)
{
    if (version < 1 || version > (int)COUNT(migrations))
        return NULL;
    if (name)
        *name = migrations[version - 1].name;
    return migrations[version - 1].sql;
}

/* ---- open and close ---- */

static int user_version(sqlite3 *db, int *v)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &st, NULL);
    if (rc == SQLITE_OK) {
        rc = sqlite3_step(st);
        if (rc == SQLITE_ROW) {
            *v = sqlite3_column_int(st, 0);
            rc = SQLITE_OK;
        }
    }
    sqlite3_finalize(st);
    return rc;
}

static ddpd_err too_new(const char *path, int v, struct ddpd_error *err)
{
    return ddpd_error_set(err, DDPD_ECONFLICT, path,
                          "store: %s has schema version %d, but this ddpd knows versions up to "
                          "%d: it was written by a newer ddpd; run that one, or move the "
                          "database aside",
                          path, v, store_schema_version());
}

/* What PRAGMA foreign_key_check found: SQLITE_CONSTRAINT_FOREIGNKEY with the first row
 * that references nothing in `why`, SQLITE_OK when none does. */
static int fk_check(sqlite3 *db, char *why, size_t cap)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(db, "PRAGMA foreign_key_check", -1, &st, NULL);
    if (rc == SQLITE_OK && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        snprintf(why, cap, "table %s row %lld references a missing row of %s", col_text(st, 0),
                 (long long)sqlite3_column_int64(st, 1), col_text(st, 2));
        rc = SQLITE_CONSTRAINT_FOREIGNKEY;
    } else if (rc == SQLITE_DONE) {
        rc = SQLITE_OK;
    }
    sqlite3_finalize(st);
    return rc;
}

/* Migration `ver` in its own transaction; *at is set to the version the database is at
 * when another process migrated meanwhile. */
static ddpd_err migrate_one(struct store *s, sqlite3 *db, int ver, int *at, struct ddpd_error *err)
{
    char op[96];
    int v = 0, rc;
    snprintf(op, sizeof op, "migration %s", migrations[ver - 1].name);
    rc = sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL);
    if (rc != SQLITE_OK)
        return sq_fail(err, db, rc, op);
    /* Another process may have migrated meanwhile: look again under the lock. */
    rc = user_version(db, &v);
    if (rc == SQLITE_OK && v >= ver) {
        sqlite3_exec(db, "COMMIT", NULL, NULL, NULL);
        if (v > store_schema_version())
            return too_new(s->path, v, err);
        *at = v;
        return DDPD_OK;
    }
    char setv[48], why[300] = "";
    snprintf(setv, sizeof setv, "PRAGMA user_version = %d", ver);
    if (rc == SQLITE_OK)
        rc = sqlite3_exec(db, migrations[ver - 1].sql, NULL, NULL, NULL);
    if (rc == SQLITE_OK && (rc = fk_check(db, why, sizeof why)) == SQLITE_CONSTRAINT_FOREIGNKEY) {
        sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
        return ddpd_error_set(err, DDPD_EIO, s->path, "store: %s: %s: %s", s->path, op, why);
    }
    if (rc == SQLITE_OK)
        rc = sqlite3_exec(db, setv, NULL, NULL, NULL);
    if (rc == SQLITE_OK)
        rc = sqlite3_exec(db, "COMMIT", NULL, NULL, NULL);
    if (rc != SQLITE_OK) {
        ddpd_err e = sq_fail(err, db, rc, op);
        if (!sqlite3_get_autocommit(db))
            sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
        return e;
    }
    return DDPD_OK;
}

/* Applies the migrations above the database's user_version, each in its own
 * transaction that also sets user_version (so a crash leaves a whole version). */
static ddpd_err migrate(struct store *s, sqlite3 *db, struct ddpd_error *err)
{
    int v = 0;
    int rc = user_version(db, &v);
    if (rc != SQLITE_OK)
        return sq_fail(err, db, rc, "read user_version");
    if (v > store_schema_version())
        return too_new(s->path, v, err);
    if (v < 0) /* PRAGMA user_version is any 32-bit integer; ddpd's are 0 and up */
        return ddpd_error_set(err, DDPD_ECONFLICT, s->path,
                              "store: %s has schema version %d, which no ddpd writes: it is not a "
                              "ddpd database; move it aside or give --db another path",
                              s->path, v);
    /* Foreign keys are off while migrating (outside a transaction, as SQLite requires): a
     * migration that rebuilds a table (the cluster one: a CHECK cannot be altered) drops
     * the old one, which with them on would delete every row that references it. Each
     * migration's transaction checks them before it commits (foreign_key_check). */
    if (v < store_schema_version() && (rc = sqlite3_exec(db, "PRAGMA foreign_keys = OFF", NULL, NULL, NULL)))
        return sq_fail(err, db, rc, "turn foreign keys off to migrate");
    ddpd_err e = DDPD_OK;
    for (int ver = v + 1; ver <= store_schema_version() && !e; ver++)
        e = migrate_one(s, db, ver, &ver, err);
    if ((rc = sqlite3_exec(db, "PRAGMA foreign_keys = ON", NULL, NULL, NULL)) && !e)
        e = sq_fail(err, db, rc, "turn foreign keys on after migrating");
    return e;
}

/* PRAGMA quick_check: every page of the file is read and its b-tree structure checked (not
 * the indexes against their tables: that is integrity_check, far slower). A database whose
 * interior pages are damaged reads fine until a query reaches them; found here, it is
 * what store_ping (so /healthz) says from the start, and it is said on stderr. */
static void quick_check(struct store *s)
{
    sqlite3_stmt *st = NULL;
    char first[512] = "";
    int problems = 0;
    int rc = sqlite3_prepare_v2(s->w->db, "PRAGMA quick_check(20)", -1, &st, NULL);
    while (rc == SQLITE_OK && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        /* A row may hold several lines ("*** in database main ***\nOn tree page 7 ..."). */
        for (const char *line = col_text(st, 0); *line;) {
            size_t n = strcspn(line, "\n");
            if (strncmp(line, "ok", n > 2 ? n : 2) != 0 && strncmp(line, "***", 3) != 0 && problems++ == 0)
                snprintf(first, sizeof first, "%.*s", (int)(n < sizeof first ? n : sizeof first - 1), line);
            line += n + (line[n] == '\n');
        }
        rc = SQLITE_OK;
    }
    if (rc != SQLITE_DONE && rc != SQLITE_OK && !problems++) /* the check itself met the damage */
        snprintf(first, sizeof first, "%s (%s)", sqlite3_errmsg(s->w->db), sqlite3_errstr(rc));
    sqlite3_finalize(st);
    if (!problems)
        return;
    s->corrupt = true;
    ddpd_error_set(&s->corrupt_err, DDPD_EIO, s->path,
                   "store: %s failed its quick check at start: %s%s; the database is damaged: stop the "
                   "server, move the file aside and restore a backup (sqlite3 .recover saves what it can)",
                   s->path, first, problems > 1 ? " (and more problems)" : "");
    fprintf(stderr, "ddpd: %s\n", s->corrupt_err.message);
}

/* A database made by an older ddpd (0644, its WAL and SHM too) loses the group's and
 * others' permissions: what an upgrade keeps must not stay readable by everyone. Only
 * files this user owns; a failure is left to the administrator (no error). */
static void make_private(const char *path)
{
    static const char *const sfx[] = {"", "-wal", "-shm"};
    for (size_t i = 0; i < COUNT(sfx); i++) {
        char f[PATH_MAX];
        struct stat st;
        if (snprintf(f, sizeof f, "%s%s", path, sfx[i]) >= (int)sizeof f || lstat(f, &st) != 0 ||
            !S_ISREG(st.st_mode) || st.st_uid != geteuid() || !(st.st_mode & 077))
            continue;
        if (chmod(f, st.st_mode & 0700) == 0)
            fprintf(stderr, "ddpd: store: %s was readable by others (mode %03o): now %03o\n", f,
                    (unsigned)(st.st_mode & 0777), (unsigned)(st.st_mode & 0700));
    }
}

struct store *store_open(const char *path, struct ddpd_error *err)
{
    return store_open_with(path, NULL, err);
}

struct store *store_open_with(const char *path, const struct store_opts *opts, struct ddpd_error *err)
{
    ddpd_err e = DDPD_OK;
    struct store *s = NULL;
    if (!path || !*path || strcmp(path, ":memory:") == 0 || strncmp(path, "file:", 5) == 0) {
        ddpd_error_set(err, DDPD_EINTERNAL, path ? path : "", "store: the database must be a file name");
        return NULL;
    }
    int en = base_mkdirs(path, false);
    if (en) {
        ddpd_error_set(err, DDPD_EIO, path, "store: cannot create the folders of %s: %s", path, strerror(en));
        return NULL;
    }

    /* Created here, not by SQLite (0644): jobs' specs and events are their users' own.
     * The WAL and the shared-memory file take the database's mode. */
    int dbfd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (dbfd >= 0)
        close(dbfd); /* else SQLite's open below says why */
    make_private(path);

    s = xcalloc(1, sizeof *s);
    s->path = xstrdup(path);
    if (opts)
        s->o = *opts;
    if (s->o.batch_max <= 0)
        s->o.batch_max = 1000;
    if (s->o.linger_ms <= 0)
        s->o.linger_ms = 50;
    if (s->o.queue_max <= 0)
        s->o.queue_max = 65536;
    if (s->o.queue_max < s->o.batch_max)
        s->o.queue_max = s->o.batch_max;
    if (s->o.queue_max_bytes == 0)
        s->o.queue_max_bytes = (size_t)64 << 20;
    if (s->o.append_wait_ms <= 0)
        s->o.append_wait_ms = 1000;
    if (s->o.readers <= 0)
        s->o.readers = 8;
    if (s->o.busy_timeout_ms <= 0)
        s->o.busy_timeout_ms = 5000;
    if (s->o.job_events_max < 0)
        s->o.job_events_max = 0;
    pthread_mutex_init(&s->wmu, NULL);
    pthread_mutex_init(&s->imu, NULL);
    pthread_cond_init(&s->icv, NULL);
    s->itail = &s->ihead;
    pthread_mutex_init(&s->rmu, NULL);
    pthread_mutex_init(&s->qmu, NULL);
    pthread_cond_init(&s->rcv, NULL);
    base_cond_init_mono(&s->qcv);
    base_cond_init_mono(&s->space_cv);
    pthread_cond_init(&s->done_cv, NULL);
    s->q = xcalloc((size_t)s->o.queue_max, sizeof *s->q);

    e = conn_open(path, true, s->o.busy_timeout_ms, &s->w, err);
    if (e != DDPD_OK)
        goto out;
    int rc = store__budget_open(s);
    if (rc != SQLITE_OK) {
        e = sq_fail(err, s->w->db, rc, "register ddpd_kept");
        goto out;
    }
    /* Refuse a newer database before changing anything in it. */
    int v = 0;
    rc = user_version(s->w->db, &v);
    if (rc != SQLITE_OK) {
        e = sq_fail(err, s->w->db, rc, "read user_version");
        goto out;
    }
    if (v > store_schema_version()) {
        e = too_new(path, v, err);
        goto out;
    }
    sqlite3_stmt *st = NULL;
    rc = sqlite3_prepare_v2(s->w->db, "PRAGMA journal_mode = WAL", -1, &st, NULL);
    if (rc == SQLITE_OK && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        if (strcmp(col_text(st, 0), "wal") != 0) {
            e = ddpd_error_set(err, DDPD_EIO, path, "store: %s cannot use WAL (journal mode %s)", path,
                               col_text(st, 0));
            sqlite3_finalize(st);
            goto out;
        }
        rc = SQLITE_OK;
    }
    if (rc != SQLITE_OK) {
        e = sq_fail(err, s->w->db, rc, "set WAL");
        sqlite3_finalize(st);
        goto out;
    }
    sqlite3_finalize(st);
    e = migrate(s, s->w->db, err);
    if (e != DDPD_OK)
        goto out;
    quick_check(s);
    if (pthread_create(&s->thread, NULL, writer_main, s) != 0) {
        e = ddpd_error_set(err, DDPD_EINTERNAL, path, "store: cannot start the writer thread");
        goto out;
    }
    s->thread_started = true;
    if (pthread_create(&s->inserter, NULL, inserter_main, s) != 0) {
        e = ddpd_error_set(err, DDPD_EINTERNAL, path, "store: cannot start the inserter thread");
        goto out;
    }
    s->inserter_started = true;
out:
    if (e != DDPD_OK) {
        if (err && !err->path[0])
            copy_text(err->path, sizeof err->path, path);
        store_close(s);
        return NULL;
    }
    return s;
}

void store_close(struct store *s)
{
    if (!s)
        return;
    if (s->inserter_started) { /* it commits what is queued before it ends */
        pthread_mutex_lock(&s->imu);
        s->istop = true;
        pthread_cond_signal(&s->icv);
        pthread_mutex_unlock(&s->imu);
        pthread_join(s->inserter, NULL);
    }
    if (s->thread_started) {
        pthread_mutex_lock(&s->qmu);
        s->stop = true;
        pthread_cond_signal(&s->qcv);
        pthread_mutex_unlock(&s->qmu);
        pthread_join(s->thread, NULL);
    }
    for (int i = 0; i < s->qn; i++) /* only when the writer never started */
        free(s->q[(s->qhead + i) % s->o.queue_max].body);
    while (s->rfree) {
        struct conn *c = s->rfree;
        s->rfree = c->next;
        conn_close(c);
    }
    conn_close(s->w);
    pthread_cond_destroy(&s->done_cv);
    pthread_cond_destroy(&s->icv);
    pthread_mutex_destroy(&s->imu);
    pthread_cond_destroy(&s->space_cv);
    pthread_cond_destroy(&s->qcv);
    pthread_cond_destroy(&s->rcv);
    pthread_mutex_destroy(&s->qmu);
    pthread_mutex_destroy(&s->rmu);
    pthread_mutex_destroy(&s->wmu);
    free(s->q);
    free(s->keep);
    free(s->path);
    free(s);
}

/* ---- one server per database ---- */

struct store_lock {
    int fd;
};

struct store_lock *store_lock_take(const char *path, struct ddpd_error *err)
{
    char lp[PATH_MAX];
    struct store_lock *l = NULL;
    int fd = -1;
    if (!path || !*path || snprintf(lp, sizeof lp, "%s.lock", path) >= (int)sizeof lp) {
        ddpd_error_set(err, DDPD_EIO, path ? path : "", "store: no lock file name for database '%s'",
                       path ? path : "");
        goto out;
    }
    int en = base_mkdirs(path, false);
    if (en) {
        ddpd_error_set(err, DDPD_EIO, path, "store: cannot create the folders of %s: %s", path, strerror(en));
        goto out;
    }
    fd = open(lp, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
        ddpd_error_set(err, DDPD_EIO, lp, "store: cannot open the lock file %s: %s", lp, strerror(errno));
        goto out;
    }
    /* flock: held by the open file, released by the kernel however this process ends
     * (SIGKILL included), never by closing another descriptor of the same file. */
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        if (errno != EWOULDBLOCK) {
            ddpd_error_set(err, DDPD_EIO, lp, "store: cannot lock %s: %s", lp, strerror(errno));
            goto out;
        }
        char buf[32];
        ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
        buf[n > 0 ? n : 0] = '\0';
        char *end;
        long pid = strtol(buf, &end, 10);
        if (end != buf && pid > 0)
            ddpd_error_set(err, DDPD_ECONFLICT, path,
                           "store: the database %s is in use by another ddpd server (pid %ld holds %s): "
                           "stop that server first, or give this one another --db",
                           path, pid, lp);
        else
            ddpd_error_set(err, DDPD_ECONFLICT, path,
                           "store: the database %s is in use by another ddpd server (it holds %s): stop "
                           "that server first, or give this one another --db",
                           path, lp);
        goto out;
    }
    char pid[32];
    int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)n, 0) != n) {
        ddpd_error_set(err, DDPD_EIO, lp, "store: cannot write %s: %s", lp, strerror(errno));
        goto out;
    }
    l = xmalloc(sizeof *l);
    l->fd = fd;
    fd = -1;
out:
    if (fd >= 0)
        close(fd);
    return l;
}

void store_lock_release(struct store_lock *l)
{
    if (!l)
        return;
    close(l->fd); /* the lock goes with it; the file stays (its pid is only a hint) */
    free(l);
}

ddpd_err store_ping(struct store *s, struct ddpd_error *err)
{
    if (s->corrupt) {
        if (err)
            *err = s->corrupt_err;
        return s->corrupt_err.code;
    }
    struct conn *c = reader_get(s, err);
    if (!c)
        return err ? err->code : DDPD_EIO;
    ddpd_err e = DDPD_OK;
    sqlite3_stmt *st = stmt(c, R_PING, err);
    if (!st) {
        e = err ? err->code : DDPD_EINTERNAL;
    } else {
        int rc = sqlite3_step(st);
        if (rc != SQLITE_ROW)
            e = sq_fail(err, c->db, rc, "ping");
        stmt_done(st);
    }
    reader_put(s, c);
    return e;
}
