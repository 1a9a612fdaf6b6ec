/* test_store_alloc.c — allocation failures on the submission path (curl's torture mode,
 * STYLE.md "Error paths are tested on purpose"): the spec parser and the store's job
 * insert, run once per N with the Nth allocation failing, for N = 1, 2, ... until a run
 * needs no failure. Every run must end cleanly: success, or DDPD_ENOMEM with a message
 * (DDPD_ESPEC for a spec that is wrong anyway), no crash, and the jobs table holding
 * exactly the jobs whose insert reported success. Leaks show up under AddressSanitizer's
 * leak check (scripts/test.sh, stage 2).
 *
 * The hook: this program is linked with -Wl,--wrap=malloc,calloc,realloc,strdup
 * (tests/CMakeLists.txt), so every such call in ddpd's own objects comes here; jansson
 * and SQLite (shared libraries) are routed here through json_set_alloc_funcs and
 * SQLITE_CONFIG_MALLOC. Production code is unchanged. */
#include "check.h"

#include <jansson.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "schema/spec.h"
#include "server/store.h"

/* ---- the hook ---- */

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);
char *__real_strdup(const char *s);

static atomic_long fail_at;    /* the allocation to fail, counted from 1; 0 = disarmed */
static atomic_long calls;      /* allocations since armed */
static atomic_bool injected;   /* the armed allocation was reached and failed */
static pthread_t armed_thread; /* only this thread's allocations count (the store's writer
                                  thread runs beside the test) */

static bool should_fail(void)
{
    if (atomic_load(&fail_at) == 0 || !pthread_equal(pthread_self(), armed_thread))
        return false;
    if (atomic_fetch_add(&calls, 1) + 1 != atomic_load(&fail_at))
        return false;
    atomic_store(&injected, true);
    return true;
}

void *__wrap_malloc(size_t n)
{
    return should_fail() ? NULL : __real_malloc(n);
}
void *__wrap_calloc(size_t n, size_t size)
{
    return should_fail() ? NULL : __real_calloc(n, size);
}
void *__wrap_realloc(void *p, size_t n)
{
    return should_fail() ? NULL : __real_realloc(p, n);
}
char *__wrap_strdup(const char *s)
{
    return should_fail() ? NULL : __real_strdup(s);
}

static void arm(long n)
{
    armed_thread = pthread_self();
    atomic_store(&calls, 0);
    atomic_store(&injected, false);
    atomic_store(&fail_at, n);
}

/* Disarms; true when the armed failure happened. */
static bool disarm(void)
{
    atomic_store(&fail_at, 0);
    return atomic_load(&injected);
}

/* jansson's allocations. */
static void *json_alloc(size_t n)
{
    return __wrap_malloc(n);
}

/* SQLite's: a 16-byte header keeps the size for xSize. */
static void *sq_malloc(int n)
{
    if (n <= 0)
        return NULL;
    int64_t *p = __wrap_malloc((size_t)n + 16);
    if (!p)
        return NULL;
    p[0] = n;
    return p + 2;
}

static void sq_free(void *p)
{
    if (p)
        free((int64_t *)p - 2);
}

static int sq_size(void *p)
{
    return p ? (int)((int64_t *)p - 2)[0] : 0;
}

static void *sq_realloc(void *p, int n)
{
    if (!p)
        return sq_malloc(n);
    if (n <= 0) {
        sq_free(p);
        return NULL;
    }
    int64_t *q = __wrap_realloc((int64_t *)p - 2, (size_t)n + 16);
    if (!q)
        return NULL;
    q[0] = n;
    return q + 2;
}

static int sq_roundup(int n)
{
    return (n + 7) & ~7;
}
static int sq_init(void *ctx)
{
    (void)ctx;
    return SQLITE_OK;
}
static void sq_shutdown(void *ctx)
{
    (void)ctx;
}

static void hook_install(void)
{
    json_set_alloc_funcs(json_alloc, free);
    static const sqlite3_mem_methods mm = {sq_malloc,  sq_free, sq_realloc,  sq_size,
                                           sq_roundup, sq_init, sq_shutdown, NULL};
    int rc = sqlite3_config(SQLITE_CONFIG_MALLOC, &mm);
    if (rc != SQLITE_OK) {
        fprintf(stderr, "sqlite3_config(SQLITE_CONFIG_MALLOC): %d\n", rc);
        exit(1);
    }
    /* No lookaside: every allocation SQLite makes goes through the hook. */
    sqlite3_config(SQLITE_CONFIG_LOOKASIDE, 0, 0);
}

/* ---- the path under test: what POST /v1/jobs does with a body ---- */

static ddpd_err submit(struct store *s, const char *text, int64_t *id, struct ddpd_error *err)
{
    struct spec spec;
    ddpd_err rc = spec_parse(text, strlen(text), NULL, &spec, err);
    if (rc)
        return rc;
    char *js = spec_dumps(&spec);
    if (!js)
        return ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory storing the job");
    struct store_job_new jn = {.name = spec.name,
                               .spec = js,
                               .world_size = spec.world_size,
                               .device = spec.device,
                               .max_restarts = spec.max_restarts};
    rc = store_job_insert(s, &jn, id, NULL, err);
    free(js);
    return rc;
}

static int64_t jobs_in(struct store *s)
{
    int64_t counts[JOB_STATE_COUNT], n = 0;
    struct ddpd_error e;
    CHECK_EQ_INT(store_job_count(s, counts, &e), DDPD_OK);
    for (int i = 0; i < JOB_STATE_COUNT; i++)
        n += counts[i];
    return n;
}

/* Runs `text` through submit with the Nth allocation failing, N = 1, 2, ... Returns the
 * number of runs that had a failure injected. `want` is the outcome without failures. */
static long torture(struct store *s, const char *what, const char *text, ddpd_err want)
{
    long runs = 0, enomem = 0, absorbed = 0;
    for (long n = 1; n < 100000; n++) {
        int64_t before = jobs_in(s), id = 0;
        struct ddpd_error e;
        ddpd_error_clear(&e);
        arm(n);
        ddpd_err rc = submit(s, text, &id, &e);
        bool hit = disarm();
        int64_t after = jobs_in(s);
        if (!hit) {
            /* Nothing left to fail: the path ran whole. */
            CHECK_EQ_INT(rc, want);
            CHECK_EQ_INT(after - before, want == DDPD_OK);
            fprintf(stderr, "  %s: %ld allocations; every one failed once: %ld ENOMEM, %ld absorbed\n", what,
                    n - 1, enomem, absorbed);
            return runs;
        }
        runs++;
        if (rc == DDPD_ENOMEM) {
            enomem++;
            if (!e.message[0])
                CHECK__FAIL("%s, allocation %ld: ENOMEM without a message", what, n);
        } else if (rc == want) {
            absorbed++; /* e.g. SQLite freed its cache and tried again */
        } else {
            CHECK__FAIL("%s, allocation %ld failed: %s (%s), expected ENOMEM or %s", what, n,
                        ddpd_err_name(rc), e.message, ddpd_err_name(want));
        }
        /* A job is stored exactly when the insert said so. */
        CHECK_EQ_INT(after - before, rc == DDPD_OK);
        if (rc == DDPD_OK) {
            struct store_job j;
            CHECK_EQ_INT(store_job_get(s, id, &j, &e), DDPD_OK);
            CHECK(j.spec != NULL && strstr(j.spec, "\"model\"") != NULL);
            store_job_clear(&j);
        }
    }
    CHECK__FAIL("%s: still failing after 100000 allocations", what);
    return runs;
}

int main(void)
{
    hook_install();
    const char *tmp = getenv("DDPD_TEST_TMP");
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/store-alloc-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (tmp && *tmp)
        mkdir(tmp, 0755);
    if (!mkdtemp(dir)) {
        perror(dir);
        return 1;
    }
    snprintf(path, sizeof path, "%s/ddpd.db", dir);
    struct ddpd_error e;
    struct store *s = store_open(path, &e);
    if (!s) {
        fprintf(stderr, "store_open: %s\n", e.message);
        return 1;
    }

    const char *good = "{\"name\":\"oom\",\"world_size\":2,\"device\":\"cpu\","
                       "\"model\":[{\"type\":\"linear\",\"in\":10,\"out\":8},{\"type\":\"relu\"},"
                       "{\"type\":\"linear\",\"in\":8,\"out\":1}],\"loss\":\"mse\","
                       "\"optimizer\":{\"type\":\"adamw\",\"lr\":0.001},"
                       "\"data\":{\"type\":\"synthetic\",\"samples\":64,\"seed\":3},"
                       "\"batch_size\":4,\"steps\":5,\"checkpoint\":{\"every_steps\":2}}";
    const char *csv = "{\"model\":[{\"type\":\"linear\",\"in\":3,\"out\":2}],\"device\":\"cpu\","
                      "\"loss\":\"mse\",\"optimizer\":{\"type\":\"sgd\",\"lr\":0.1,\"momentum\":0.9},"
                      "\"batch_size\":2,\"epochs\":1,\"ddp\":{\"join\":false},"
                      "\"data\":{\"type\":\"csv\",\"path\":\"d.csv\",\"target\":[\"a\",\"b\"]}}";
    const char *bad = "{\"model\":[{\"type\":\"linear\",\"in\":10,\"out\":8},"
                      "{\"type\":\"linear\",\"in\":7,\"out\":1}],\"device\":\"cpu\"}";
    const char *broken = "{\"model\": [1, 2,, 3]}";

    CHECK(torture(s, "valid spec", good, DDPD_OK) > 10);
    CHECK(torture(s, "csv spec", csv, DDPD_OK) > 10);
    CHECK(torture(s, "invalid spec", bad, DDPD_ESPEC) > 0);
    CHECK(torture(s, "malformed JSON", broken, DDPD_EJSON) > 0);

    /* The store is whole after all that: a plain insert and the database's own check. */
    int64_t id;
    CHECK_EQ_INT(submit(s, good, &id, &e), DDPD_OK);
    store_close(s);
    sqlite3 *db = NULL;
    CHECK_EQ_INT(sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    sqlite3_stmt *st = NULL;
    CHECK_EQ_INT(sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1, &st, NULL), SQLITE_OK);
    CHECK_EQ_INT(sqlite3_step(st), SQLITE_ROW);
    CHECK_EQ_STR((const char *)sqlite3_column_text(st, 0), "ok");
    sqlite3_finalize(st);
    sqlite3_close(db);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "%s/ddpd.db", dir);
    unlink(cmd);
    snprintf(cmd, sizeof cmd, "%s/ddpd.db-wal", dir);
    unlink(cmd);
    snprintf(cmd, sizeof cmd, "%s/ddpd.db-shm", dir);
    unlink(cmd);
    rmdir(dir);
    CHECK_DONE();
}
