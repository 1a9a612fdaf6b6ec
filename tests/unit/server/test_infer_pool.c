/* test_infer_pool.c — the inference pool (server/inference/): its choices (policy.c: which
 * process takes a request, which idle model goes for room), and the pool's threads with
 * real processes, the stand-in worker tests/helpers/infer_worker.py (run as the pool's
 * `WORKER --infer`, its knobs in a control file): requests answered exactly once, the
 * queue's bound (EBUSY with a Retry-After), cancel when the client has gone, eviction by
 * the memory cap, a deleted job's requests and models, a worker that dies or hangs, and
 * the stop. Run under ThreadSanitizer in CI's TSan stage (no GPU: super is NULL). */
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/file.h"
#include "check.h"
#include "server/inference/pool.h"
#include "server/inference/pool_impl.h"

/* ---- policy.c ------------------------------------------------------------------------------ */

static struct infer_view idle(int64_t job, bool cuda, double used)
{
    return (struct infer_view){.free = true,
                               .running = true,
                               .cuda = cuda,
                               .loaded = true,
                               .key = {.job = job, .step = -1, .cuda = cuda},
                               .last_used = used};
}

static void test_pick(void)
{
    struct infer_key k1 = {.job = 1, .step = -1}, k3 = {.job = 3, .step = -1},
                     k1c = {.job = 1, .step = -1, .cuda = true};
    struct infer_view v[4];
    /* The one holding the model wins, even when it was used longest ago. */
    v[0] = idle(2, false, 5);
    v[1] = idle(1, false, 1);
    v[2] = (struct infer_view){.free = true};
    CHECK_EQ_INT(infer__pick(v, 3, &k1), 1);
    /* Busy holders are not free: an empty slot then. */
    v[1].free = false;
    CHECK_EQ_INT(infer__pick(v, 3, &k1), 2);
    /* No empty slot: the least recently used model is replaced (ties: lower index). */
    v[2] = idle(4, false, 2);
    v[3] = idle(5, false, 2);
    CHECK_EQ_INT(infer__pick(v, 4, &k3), 2);
    v[0].last_used = 1;
    CHECK_EQ_INT(infer__pick(v, 4, &k3), 0);
    /* A step is another model; a device too. */
    struct infer_key k1s = {.job = 1, .step = 10};
    v[1].free = true;
    CHECK(infer__pick(v, 4, &k1s) != 1 || v[1].key.step == 10);
    CHECK(infer__pick(v, 4, &k1c) != 1);
    /* Without a model: a process of the request's kind before one that must be ended. */
    v[0] = (struct infer_view){.free = true, .running = true, .cuda = true};
    v[1] = (struct infer_view){.free = true, .running = true, .cuda = false};
    CHECK_EQ_INT(infer__pick(v, 2, &k1), 1);
    CHECK_EQ_INT(infer__pick(v, 2, &k1c), 0);
    v[1].free = false;
    CHECK_EQ_INT(infer__pick(v, 2, &k1), 0); /* the GPU process is ended and a CPU one started */
    /* Nothing free. */
    v[0].free = false;
    CHECK_EQ_INT(infer__pick(v, 2, &k1), -1);
    CHECK_EQ_INT(infer__pick(v, 0, &k1), -1);
}

static void test_victim(void)
{
    struct infer_view v[4] = {
        idle(1, false, 3), idle(2, false, 1), idle(3, false, 2), {.free = true, .running = true}};
    CHECK_EQ_INT(infer__victim(v, 4, -1), 1); /* least recently used */
    CHECK_EQ_INT(infer__victim(v, 4, 1), 2);  /* not the one kept */
    v[2].free = false;                        /* running a request: never */
    CHECK_EQ_INT(infer__victim(v, 4, 1), 0);
    v[0].loaded = false;
    CHECK_EQ_INT(infer__victim(v, 4, 1), -1); /* no model to unload */
    struct infer_key a = {.job = 1, .step = 2, .cuda = false}, b = a;
    CHECK(infer__key_eq(&a, &b));
    b.cuda = true;
    CHECK(!infer__key_eq(&a, &b));
}

/* ---- the pool with the stand-in worker ------------------------------------------------------ */

static char dir[PATH_MAX], ctl[PATH_MAX + 16], weights[PATH_MAX + 32], weights2[PATH_MAX + 32],
    worker[PATH_MAX];

static const char *SPEC = "{\"input_shape\": [4], \"loss\": \"cross_entropy\", \"model\": ["
                          "{\"type\": \"embedding\", \"num\": 16, \"dim\": 4},"
                          "{\"type\": \"linear\", \"in\": 4, \"out\": 16}]}";

/* One request's sink: what the pool called, and when the client is to look gone. */
struct sink {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int dones, lines;
    int gone_after; /* lines; -1: never */
    ddpd_err rc;
    int retry;
    char message[768];
    json_t *answer;
};

static void s_line(void *ctx, json_t *line)
{
    struct sink *s = ctx;
    (void)line;
    pthread_mutex_lock(&s->mu);
    s->lines++;
    pthread_mutex_unlock(&s->mu);
}

static bool s_gone(void *ctx)
{
    struct sink *s = ctx;
    pthread_mutex_lock(&s->mu);
    bool g = s->gone_after >= 0 && s->lines >= s->gone_after;
    pthread_mutex_unlock(&s->mu);
    return g;
}

static void s_done(void *ctx, ddpd_err rc, json_t *answer, const struct ddpd_error *err, int retry)
{
    struct sink *s = ctx;
    pthread_mutex_lock(&s->mu);
    s->dones++;
    s->rc = rc;
    s->retry = retry;
    snprintf(s->message, sizeof s->message, "%s", rc ? err->message : "");
    s->answer = answer ? json_deep_copy(answer) : NULL;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

static void sink_init(struct sink *s, int gone_after)
{
    memset(s, 0, sizeof *s);
    pthread_mutex_init(&s->mu, NULL);
    base_cond_init_mono(&s->cv);
    s->gone_after = gone_after;
}

/* Waits (60 s at most) for the answer; false when none came. */
static bool sink_wait(struct sink *s)
{
    struct timespec ts = base_timespec_after(CLOCK_MONOTONIC, 60);
    pthread_mutex_lock(&s->mu);
    while (s->dones == 0 && pthread_cond_timedwait(&s->cv, &s->mu, &ts) == 0)
        ;
    bool ok = s->dones > 0;
    pthread_mutex_unlock(&s->mu);
    return ok;
}

static void sink_clear(struct sink *s)
{
    json_decref(s->answer);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
}

static void set_ctl(const char *json)
{
    FILE *f = fopen(ctl, "w");
    if (f) {
        fputs(json, f);
        fclose(f);
    }
}

static struct infer_pool *pool(int procs, int queue, int64_t memory, double timeout_s)
{
    struct infer_pool_opts o = {.worker = worker,
                                .dir = dir,
                                .procs = procs,
                                .queue = queue,
                                .memory = memory,
                                .idle_s = 300,
                                .timeout_s = timeout_s,
                                .line_max = 1 << 20,
                                .nice = 1};
    struct infer_pool *p = NULL;
    struct ddpd_error err;
    CHECK_EQ_INT(infer_pool_new(&o, &p, &err), DDPD_OK);
    return p;
}

static ddpd_err gen(struct infer_pool *p, int64_t job, const char *w, int tokens, struct sink *s, int *retry)
{
    struct infer_model m = {.job = job, .step = -1, .weights = w, .spec = SPEC};
    char *req = malloc(160);
    snprintf(req, 160,
             "{\"op\": \"generate\", \"ids\": [1], \"max_new_tokens\": %d, \"seed\": 7, \"stream\": true}",
             tokens);
    struct infer_sink k = {.line = s_line, .gone = s_gone, .done = s_done, .ctx = s};
    struct ddpd_error err;
    return infer_pool_submit(p, &m, req, "generate", NULL, &k, retry, &err);
}

static void test_queue_bound_and_answers(void)
{
    set_ctl("{\"delay_s\": 0.05}");
    struct infer_pool *p = pool(2, 1, 1 << 30, 30);
    struct sink s[4];
    int retry = 0;
    for (int i = 0; i < 4; i++)
        sink_init(&s[i], -1);
    /* Two run, one waits, the fourth is refused with a Retry-After. */
    for (int i = 0; i < 3; i++)
        CHECK_EQ_INT(gen(p, 1, weights, 20, &s[i], &retry), DDPD_OK);
    CHECK_EQ_INT(gen(p, 1, weights, 20, &s[3], &retry), DDPD_EBUSY);
    CHECK(retry >= 1);
    for (int i = 0; i < 3; i++) {
        CHECK(sink_wait(&s[i]));
        CHECK_EQ_INT(s[i].rc, DDPD_OK);
        CHECK_EQ_INT(s[i].dones, 1);
        CHECK_EQ_INT(s[i].lines, 20);
        CHECK_EQ_INT(json_array_size(json_object_get(s[i].answer, "ids")), 20);
        CHECK(!json_object_get(s[i].answer, "ok"));
    }
    CHECK_EQ_INT(s[3].dones, 0);
    struct infer_pool_stats st;
    infer_pool_stats_get(p, &st);
    CHECK_EQ_INT(st.requests, 3);
    CHECK_EQ_INT(st.rejected, 1);
    /* Two processes, each loaded once (the third ran on one that had the model). */
    CHECK_EQ_INT(st.loads, 2);
    json_t *status = infer_pool_status(p);
    CHECK_EQ_INT(json_array_size(json_object_get(status, "processes")), 2);
    CHECK_EQ_STR(
        json_string_value(json_object_get(json_array_get(json_object_get(status, "processes"), 0), "state")),
        "idle");
    json_decref(status);
    infer_pool_free(p);
    for (int i = 0; i < 4; i++)
        sink_clear(&s[i]);
}

static void test_cancel(void)
{
    set_ctl("{\"delay_s\": 0.02}");
    struct infer_pool *p = pool(1, 1, 1 << 30, 30);
    struct sink s;
    int retry;
    sink_init(&s, 3);
    CHECK_EQ_INT(gen(p, 1, weights, 4000, &s, &retry), DDPD_OK);
    CHECK(sink_wait(&s));
    CHECK_EQ_INT(s.rc, DDPD_OK);
    CHECK(json_is_true(json_object_get(s.answer, "cancelled")));
    CHECK(s.lines < 4000);
    struct infer_pool_stats st;
    infer_pool_stats_get(p, &st);
    CHECK_EQ_INT(st.cancels, 1);
    /* A client gone before its request ran: dropped, never run. */
    struct sink g;
    sink_init(&g, 0);
    CHECK_EQ_INT(gen(p, 1, weights, 5, &g, &retry), DDPD_OK);
    CHECK(sink_wait(&g));
    CHECK_EQ_INT(g.rc, DDPD_ECANCELED);
    infer_pool_free(p);
    sink_clear(&s);
    sink_clear(&g);
}

static void test_memory_cap(void)
{
    set_ctl("{\"resident_bytes\": 6000}");
    struct infer_pool *p = pool(2, 0, 10000, 30);
    struct sink a, b, c;
    int retry;
    sink_init(&a, -1);
    sink_init(&b, -1);
    sink_init(&c, -1);
    CHECK_EQ_INT(gen(p, 1, weights, 2, &a, &retry), DDPD_OK);
    CHECK(sink_wait(&a));
    CHECK_EQ_INT(gen(p, 2, weights2, 2, &b, &retry), DDPD_OK);
    CHECK(sink_wait(&b));
    CHECK_EQ_INT(b.rc, DDPD_OK);
    struct infer_pool_stats st;
    infer_pool_stats_get(p, &st);
    CHECK_EQ_INT(st.evictions, 1); /* job 1's idle model made room for job 2's */
    json_t *status = infer_pool_status(p);
    CHECK_EQ_INT(json_integer_value(json_object_get(json_object_get(status, "memory"), "used")), 6000);
    json_decref(status);
    /* A model larger than the cap alone. */
    set_ctl("{\"resident_bytes\": 20000}");
    CHECK_EQ_INT(gen(p, 3, weights, 2, &c, &retry), DDPD_OK);
    CHECK(sink_wait(&c));
    CHECK_EQ_INT(c.rc, DDPD_EMODELSIZE);
    CHECK(strstr(c.message, "--infer-memory") != NULL);
    infer_pool_free(p);
    sink_clear(&a);
    sink_clear(&b);
    sink_clear(&c);
}

static void test_forget_job(void)
{
    set_ctl("{\"delay_s\": 0.05}");
    struct infer_pool *p = pool(1, 4, 1 << 30, 30);
    struct sink run, waiting, later;
    int retry;
    sink_init(&run, -1);
    sink_init(&waiting, -1);
    sink_init(&later, -1);
    CHECK_EQ_INT(gen(p, 1, weights, 20, &run, &retry), DDPD_OK);
    CHECK_EQ_INT(gen(p, 1, weights, 20, &waiting, &retry), DDPD_OK);
    infer_pool_forget_job(p, 1);
    CHECK(sink_wait(&waiting));
    CHECK_EQ_INT(waiting.rc, DDPD_ENOTFOUND);
    CHECK(sink_wait(&run));
    CHECK_EQ_INT(gen(p, 1, weights, 2, &later, &retry), DDPD_ENOTFOUND);
    /* The model goes with its process (bounded wait for the housekeeper). */
    bool gone = false;
    for (double end = base_mono_s() + 30; !gone && base_mono_s() < end; base_sleep_s(0.05)) {
        json_t *status = infer_pool_status(p);
        gone = json_integer_value(json_object_get(status, "alive")) == 0;
        json_decref(status);
    }
    CHECK(gone);
    infer_pool_free(p);
    sink_clear(&run);
    sink_clear(&waiting);
    sink_clear(&later);
}

static void test_crash_and_hang(void)
{
    struct infer_pool *p = pool(1, 2, 1 << 30, 1.5);
    struct sink a, b, c;
    int retry;
    sink_init(&a, -1);
    sink_init(&b, -1);
    sink_init(&c, -1);
    set_ctl("{\"crash_after\": 2, \"exit_code\": 3}");
    CHECK_EQ_INT(gen(p, 1, weights, 10, &a, &retry), DDPD_OK);
    CHECK(sink_wait(&a));
    CHECK_EQ_INT(a.rc, DDPD_EINFER);
    CHECK(strstr(a.message, "exited with status 3") != NULL);
    set_ctl("{\"hang_after\": 1}");
    CHECK_EQ_INT(gen(p, 1, weights, 10, &b, &retry), DDPD_OK);
    CHECK(sink_wait(&b));
    CHECK_EQ_INT(b.rc, DDPD_ETIMEOUT);
    CHECK(strstr(b.message, "wrote nothing") != NULL);
    set_ctl("{}");
    CHECK_EQ_INT(gen(p, 1, weights, 3, &c, &retry), DDPD_OK); /* a new process */
    CHECK(sink_wait(&c));
    CHECK_EQ_INT(c.rc, DDPD_OK);
    struct infer_pool_stats st;
    infer_pool_stats_get(p, &st);
    CHECK_EQ_INT(st.failures, 2);
    infer_pool_free(p);
    sink_clear(&a);
    sink_clear(&b);
    sink_clear(&c);
}

/* A cuda model on a pool without a supervisor's GPUs: the request's mistake (422 at
 * "device"), not a 503 to retry; no process is started for it. */
static void test_cuda_without_gpus(void)
{
    struct infer_pool *p = pool(1, 1, 1 << 30, 30);
    struct sink s;
    int retry = 0;
    sink_init(&s, -1);
    struct infer_model m = {.job = 1, .step = -1, .cuda = true, .weights = weights, .spec = SPEC};
    struct infer_sink k = {.line = s_line, .gone = s_gone, .done = s_done, .ctx = &s};
    struct ddpd_error err;
    CHECK_EQ_INT(infer_pool_submit(p, &m, strdup("{\"op\": \"generate\", \"ids\": [1]}"), "generate", NULL,
                                   &k, &retry, &err),
                 DDPD_OK);
    CHECK(sink_wait(&s));
    CHECK_EQ_INT(s.rc, DDPD_ESPEC);
    CHECK_EQ_INT(s.retry, 0);
    json_t *status = infer_pool_status(p);
    CHECK_EQ_INT(json_integer_value(json_object_get(status, "alive")), 0);
    json_decref(status);
    infer_pool_free(p);
    sink_clear(&s);
}

static void test_stop(void)
{
    set_ctl("{\"delay_s\": 0.05}");
    struct infer_pool *p = pool(1, 2, 1 << 30, 30);
    struct sink a, b, c;
    int retry;
    sink_init(&a, -1);
    sink_init(&b, -1);
    sink_init(&c, -1);
    CHECK_EQ_INT(gen(p, 1, weights, 4000, &a, &retry), DDPD_OK);
    CHECK_EQ_INT(gen(p, 1, weights, 5, &b, &retry), DDPD_OK);
    int n = 0; /* a runs (it has streamed a token) while b waits */
    for (double end = base_mono_s() + 30; n == 0 && base_mono_s() < end; base_sleep_s(0.02)) {
        pthread_mutex_lock(&a.mu);
        n = a.lines;
        pthread_mutex_unlock(&a.mu);
    }
    CHECK(n > 0);
    infer_pool_stop(p);
    CHECK_EQ_INT(gen(p, 1, weights, 5, &c, &retry), DDPD_EBUSY);
    CHECK(sink_wait(&b));
    CHECK_EQ_INT(b.rc, DDPD_EBUSY); /* waiting: refused */
    CHECK(sink_wait(&a));           /* running: cancelled */
    CHECK_EQ_INT(a.rc, DDPD_OK);
    CHECK(json_is_true(json_object_get(a.answer, "cancelled")));
    infer_pool_free(p);
    sink_clear(&a);
    sink_clear(&b);
    sink_clear(&c);
}

int main(void)
{
    test_pick();
    test_victim();
    const char *data = getenv("DDPD_TEST_DATA"), *tmp = getenv("DDPD_TEST_TMP");
    if (!data || !tmp || access("/usr/bin/python3", X_OK) != 0) {
        fprintf(stderr, "no DDPD_TEST_DATA / DDPD_TEST_TMP or /usr/bin/python3: the pool's cases skipped\n");
        CHECK_DONE();
    }
    /* DDPD_TEST_DATA is tests/data (which need not exist): the helper is tests/helpers/. */
    snprintf(worker, sizeof worker, "%s", data);
    char *slash = strrchr(worker, '/');
    if (slash)
        snprintf(slash, sizeof worker - (size_t)(slash - worker), "/helpers/infer_worker.py");
    snprintf(dir, sizeof dir, "%s/infer-pool-%d", tmp, (int)getpid());
    CHECK_EQ_INT(base_mkdirs(dir, true), 0);
    snprintf(ctl, sizeof ctl, "%s/ctl.json", dir);
    snprintf(weights, sizeof weights, "%s/1/model.safetensors", dir);
    snprintf(weights2, sizeof weights2, "%s/2/model.safetensors", dir);
    base_mkdirs(weights, false);
    base_mkdirs(weights2, false);
    FILE *f = fopen(weights, "w");
    if (f) {
        fputs("weights", f);
        fclose(f);
    }
    if ((f = fopen(weights2, "w"))) {
        fputs("weights", f);
        fclose(f);
    }
    signal(SIGPIPE, SIG_IGN);              /* as ddpd serve: a dead worker is a failed write (pool.h) */
    setenv("DDPD_TEST_INFER_CTL", ctl, 1); /* reaches the workers: DDPD_* is allow-listed */
    test_queue_bound_and_answers();
    test_cancel();
    test_memory_cap();
    test_forget_job();
    test_crash_and_hang();
    test_cuda_without_gpus();
    test_stop();
    base_remove_tree(dir);
    CHECK_DONE();
}
