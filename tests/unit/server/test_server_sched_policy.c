/* test_server_sched_policy.c — the scheduling policy of docs/scheduling.md on a simulated
 * clock and device pool: priority order, FIFO within a priority, aging and its starvation
 * bound, gang scheduling without backfill, quotas, the choice of preemption victims, time
 * limits, the reasons and the view; then random operations against the invariants. */
#include "check.h"
#include "server/sched.h"

static double now; /* the simulated clock, seconds */

static void enq(struct sched *s, int64_t job, device_kind kind, int world, int priority, bool preemptible,
                const char *owner)
{
    sched_enqueue(s,
                  &(struct sched_job){.job = job,
                                      .kind = kind,
                                      .world = world,
                                      .priority = priority,
                                      .preemptible = preemptible,
                                      .owner = owner},
                  now);
}

/* The job sched_next starts now, or 0. */
static int64_t next(struct sched *s)
{
    int64_t job;
    device_kind kind;
    int slots[SCHED_MAX_SLOTS], world;
    return sched_next(s, now, &job, &kind, slots, &world) ? job : 0;
}

static const char *why(const struct sched *s, int64_t job)
{
    static char buf[256];
    sched_pending_reason(s, job, now, buf, sizeof buf);
    return buf;
}

/* Highest priority first, FIFO within a priority; the reasons of the head and of the
 * jobs behind it. */
static void test_priority_order(void)
{
    struct sched *s = sched_new(0, 1);
    sched_set_aging(s, 0);
    enq(s, 1, DEVICE_CPU, 1, 50, false, NULL);
    CHECK_EQ_INT(next(s), 1);
    enq(s, 2, DEVICE_CPU, 1, 30, true, NULL);
    enq(s, 3, DEVICE_CPU, 1, 70, true, NULL);
    enq(s, 4, DEVICE_CPU, 1, 50, true, NULL);
    enq(s, 5, DEVICE_CPU, 1, 70, true, NULL);
    enq(s, 5, DEVICE_CPU, 1, 90, true, NULL); /* queued already: not added twice */
    enq(s, 1, DEVICE_CPU, 1, 90, true, NULL); /* running: not added */
    CHECK_EQ_INT(sched_waiting(s, DEVICE_CPU), 4);
    CHECK_EQ_INT(next(s), 0);
    CHECK_EQ_STR(why(s, 3), "waiting for 1 CPU slot: held by job 1 (priority 50, not preemptible)");
    CHECK_EQ_STR(why(s, 5), "queued behind job 3 (1 job ahead for CPU slots)");
    CHECK_EQ_STR(why(s, 4), "queued behind job 3 (priority 70)");
    CHECK_EQ_STR(why(s, 2), "queued behind job 3 (priority 70)");
    CHECK_EQ_STR(why(s, 1), ""); /* running */
    int64_t victims[4], for_job = 0;
    CHECK_EQ_INT(sched_preempt(s, now, &for_job, victims, 4), 0); /* job 1 is not preemptible */
    const int64_t want[] = {3, 5, 4, 2};
    int64_t prev = 1;
    for (int i = 0; i < 4; i++) {
        sched_release(s, prev);
        CHECK_EQ_INT(next(s), want[i]);
        CHECK_EQ_INT(next(s), 0);
        prev = want[i];
    }
    sched_free(s);
}

/* Aging: a job's effective priority rises by one every aging_s seconds it waits, up to
 * 100, and the reasons say so. */
static void test_aging(void)
{
    struct sched *s = sched_new(1, 0);
    now = 1000;
    enq(s, 1, DEVICE_CUDA, 1, 50, false, NULL);
    CHECK_EQ_INT(next(s), 1);
    enq(s, 9, DEVICE_CUDA, 1, 10, true, NULL);
    now += 59;
    enq(s, 10, DEVICE_CUDA, 1, 50, true, NULL);
    CHECK_EQ_STR(why(s, 9), "queued behind job 10 (priority 50)");
    now = 1000 + 41 * 60.0; /* job 9: 10 + 41 = 51; job 10: 50 + 40 = 90 */
    CHECK_EQ_STR(why(s, 9), "queued behind job 10 (priority 50, raised to 90 by waiting)");
    now = 1000 + 90 * 60.0; /* job 9 reaches 100 */
    CHECK_EQ_STR(why(s, 9), "waiting for 1 GPU: held by job 1 (priority 50, not preemptible)");
    CHECK_EQ_STR(why(s, 10), "queued behind job 9 (priority 10, raised to 100 by waiting)");
    sched_release(s, 1);
    CHECK_EQ_INT(next(s), 9);
    sched_free(s);
    now = 0;
}

/* A 4-rank gang that fits only after two 2-rank jobs of lower priority are preempted; no
 * second preemption while they drain; the victims come back to the queue. */
static void test_gang_after_two_preemptions(void)
{
    struct sched *s = sched_new(4, 0);
    now = 0;
    enq(s, 1, DEVICE_CUDA, 2, 10, true, NULL);
    enq(s, 2, DEVICE_CUDA, 2, 20, true, NULL);
    CHECK_EQ_INT(next(s), 2);
    now = 5;
    CHECK_EQ_INT(next(s), 1);
    now = 10;
    enq(s, 3, DEVICE_CUDA, 4, 80, true, NULL);
    CHECK_EQ_INT(next(s), 0);
    CHECK_EQ_STR(why(s, 3), "waiting for 4 GPUs: held by jobs 2 (priority 20) and 1 (priority 10)");
    int64_t victims[8], for_job = 0;
    CHECK_EQ_INT(sched_preempt(s, now, &for_job, victims, 8), 2);
    CHECK_EQ_INT(for_job, 3);
    CHECK_EQ_INT(victims[0], 1); /* the lowest priority first */
    CHECK_EQ_INT(victims[1], 2);
    CHECK_EQ_STR(why(s, 3), "waiting for 4 GPUs: preempting jobs 2 and 1");
    CHECK_EQ_INT(sched_preempt(s, now, &for_job, victims, 8), 0); /* they drain */
    /* A job of higher priority still that arrives meanwhile makes no new preemption. */
    enq(s, 4, DEVICE_CUDA, 1, 95, true, NULL);
    CHECK_EQ_INT(sched_preempt(s, now, &for_job, victims, 8), 0);
    CHECK_EQ_STR(why(s, 4),
                 "waiting for 1 GPU: held by jobs 2 (priority 20, being preempted) and 1 (priority "
                 "10, being preempted)");
    sched_dequeue(s, 4);
    now = 11;
    sched_release(s, 1);
    enq(s, 1, DEVICE_CUDA, 2, 10, true, NULL);
    CHECK_EQ_INT(next(s), 0); /* two of four free: the gang waits, job 1 behind it */
    CHECK_EQ_STR(why(s, 3), "waiting for 2 GPUs: preempting job 2");
    CHECK_EQ_STR(why(s, 1), "queued behind job 3 (priority 80)");
    CHECK_EQ_INT(sched_preempt(s, now, &for_job, victims, 8), 0);
    sched_release(s, 2);
    enq(s, 2, DEVICE_CUDA, 2, 20, true, NULL);
    CHECK_EQ_INT(next(s), 3);
    CHECK_EQ_INT(next(s), 0);
    CHECK_EQ_STR(why(s, 2), "waiting for 2 GPUs: held by job 3 (priority 80)");
    CHECK_EQ_STR(why(s, 1), "queued behind job 2 (priority 20)");
    CHECK_EQ_INT(sched_preempt(s, now, &for_job, victims, 8), 0); /* 80 is higher */
    sched_free(s);
}

/* The fewest victims: lowest priority first, then the most recently started, then any
 * chosen one not needed dropped. */
static void test_minimal_victims(void)
{
    for (int need = 1; need <= 3; need++) {
        struct sched *s = sched_new(4, 0);
        now = 0;
        enq(s, 1, DEVICE_CUDA, 1, 10, true, NULL); /* A: starts at 0 */
        CHECK_EQ_INT(next(s), 1);
        now = 1;
        enq(s, 3, DEVICE_CUDA, 2, 20, true, NULL); /* C: 2 ranks, priority 20 */
        CHECK_EQ_INT(next(s), 3);
        now = 5;
        enq(s, 2, DEVICE_CUDA, 1, 10, true, NULL); /* B: the most recent of priority 10 */
        CHECK_EQ_INT(next(s), 2);
        now = 6;
        enq(s, 4, DEVICE_CUDA, need, 50, true, NULL);
        int64_t victims[8], for_job = 0;
        int n = sched_preempt(s, now, &for_job, victims, 8);
        if (need == 1) { /* B alone */
            CHECK_EQ_INT(n, 1);
            CHECK_EQ_INT(victims[0], 2);
        } else if (need == 2) { /* B then A */
            CHECK_EQ_INT(n, 2);
            CHECK(victims[0] == 2 && victims[1] == 1);
        } else { /* B, A, C chosen; A not needed once C is: B and C */
            CHECK_EQ_INT(n, 2);
            CHECK(victims[0] == 2 && victims[1] == 3);
        }
        sched_free(s);
    }
    /* A free slot counts: one more is needed, not two. */
    struct sched *s = sched_new(3, 0);
    enq(s, 1, DEVICE_CUDA, 1, 10, true, NULL);
    enq(s, 2, DEVICE_CUDA, 1, 10, true, NULL);
    CHECK_EQ_INT(next(s), 1);
    CHECK_EQ_INT(next(s), 2);
    enq(s, 3, DEVICE_CUDA, 2, 60, true, NULL);
    int64_t victims[2], for_job = 0;
    CHECK_EQ_INT(sched_preempt(s, now, &for_job, victims, 1), 1);
    CHECK_EQ_INT(victims[0], 2); /* started at the same time: the higher id, the later */
    sched_free(s);
}

/* Equal priority never preempts; non-preemptible jobs are never chosen, and a job that
 * can start now preempts nothing. */
static void test_no_victims(void)
{
    struct sched *s = sched_new(4, 0);
    int64_t victims[8], for_job = 0;
    enq(s, 1, DEVICE_CUDA, 2, 10, false, NULL);
    enq(s, 2, DEVICE_CUDA, 2, 50, true, NULL);
    CHECK_EQ_INT(next(s), 2);
    CHECK_EQ_INT(next(s), 1);
    enq(s, 3, DEVICE_CUDA, 2, 50, true, NULL);
    CHECK_EQ_INT(sched_preempt(s, now, &for_job, victims, 8), 0);
    CHECK_EQ_STR(why(s, 3), "waiting for 2 GPUs: held by jobs 2 and 1 (priority 10, not preemptible)");
    sched_dequeue(s, 3);
    enq(s, 4, DEVICE_CUDA, 4, 90, true, NULL); /* only job 2's two slots could be had */
    CHECK_EQ_INT(sched_preempt(s, now, &for_job, victims, 8), 0);
    CHECK_EQ_STR(why(s, 4),
                 "waiting for 4 GPUs: held by jobs 2 (priority 50) and 1 (priority 10, not preemptible)");
    sched_dequeue(s, 4);
    enq(s, 5, DEVICE_CUDA, 2, 90, true, NULL); /* job 1 is lower, but not preemptible */
    CHECK_EQ_INT(sched_preempt(s, now, &for_job, victims, 8), 1);
    CHECK_EQ_INT(victims[0], 2);
    sched_release(s, 2);
    CHECK_EQ_INT(next(s), 5);
    sched_release(s, 5);
    enq(s, 6, DEVICE_CUDA, 2, 90, true, NULL); /* two are free: it starts, nobody preempted */
    CHECK_EQ_INT(sched_preempt(s, now, &for_job, victims, 8), 0);
    CHECK_EQ_INT(next(s), 6);
    sched_free(s);
}

/* Quotas: a job whose owner is at its limit is passed over (blocks nothing, preempts
 * nothing) and says so. */
static void test_quotas(void)
{
    struct sched *s = sched_new(8, 4);
    sched_set_limits(s, "alice", 4, 2);
    sched_set_limits(s, "carol", -1, -1); /* no limit */
    int64_t victims[8], for_job = 0;
    enq(s, 1, DEVICE_CUDA, 4, 50, true, "alice");
    CHECK_EQ_INT(next(s), 1);
    enq(s, 2, DEVICE_CUDA, 1, 90, true, "alice");
    enq(s, 3, DEVICE_CUDA, 2, 40, true, "bob");
    enq(s, 4, DEVICE_CUDA, 2, 30, true, "carol");
    CHECK_EQ_STR(why(s, 2), "quota: alice runs 4 of 4 GPUs");
    CHECK_EQ_STR(why(s, 3), "starting: the 2 GPUs it needs are free");
    CHECK_EQ_INT(next(s), 3); /* passed over: job 2 blocks nothing */
    CHECK_EQ_INT(next(s), 4);
    CHECK_EQ_INT(next(s), 0);
    /* Every GPU held by jobs of lower priority: job 2 still preempts nothing. */
    CHECK_EQ_INT(sched_preempt(s, now, &for_job, victims, 8), 0);
    sched_release(s, 1);
    enq(s, 5, DEVICE_CUDA, 3, 95, true, "alice");
    CHECK_EQ_INT(next(s), 5);                                        /* 4 free, alice holds none */
    CHECK_EQ_STR(why(s, 2), "starting: the 1 GPU it needs is free"); /* alice: 3 + 1 of 4 */
    CHECK_EQ_INT(next(s), 2);                                        /* ...and there is a free GPU */
    enq(s, 6, DEVICE_CUDA, 2, 60, true, "alice");
    CHECK_EQ_STR(why(s, 6), "quota: alice runs 4 of 4 GPUs");
    sched_release(s, 2);
    CHECK_EQ_STR(why(s, 6), "quota: alice runs 3 of 4 GPUs and needs 2");
    enq(s, 7, DEVICE_CUDA, 8, 10, true, "dave"); /* behind a passed-over job, it is the head */
    CHECK_EQ_STR(why(s, 7),
                 "waiting for 7 GPUs: held by jobs 5 (priority 95), 3 (priority 40) and 4 (priority 30)");
    /* CPU ranks */
    enq(s, 10, DEVICE_CPU, 2, 50, true, "alice");
    enq(s, 11, DEVICE_CPU, 1, 50, true, "alice");
    enq(s, 12, DEVICE_CPU, 3, 50, true, "alice");
    enq(s, 13, DEVICE_CPU, 1, 20, true, "bob");
    CHECK_EQ_INT(next(s), 10);
    CHECK_EQ_STR(why(s, 11), "quota: alice runs 2 of 2 CPU ranks");
    CHECK_EQ_STR(why(s, 13), "starting: the 1 CPU slot it needs is free");
    CHECK_EQ_INT(next(s), 13);
    sched_release(s, 10);
    CHECK_EQ_STR(why(s, 12), "quota: alice runs 0 of 2 CPU ranks and needs 3");
    CHECK_EQ_INT(next(s), 11);
    CHECK_EQ_INT(next(s), 0);
    sched_set_limits(s, "alice", -1, -1); /* lifted */
    CHECK_EQ_STR(why(s, 12), "waiting for 1 CPU slot: held by jobs 11 and 13 (priority 20)");
    sched_free(s);
}

/* Time limits on the simulated clock, counting earlier attempts' run_s. */
static void test_time_limits(void)
{
    struct sched *s = sched_new(0, 4);
    int64_t out[4];
    now = 10;
    sched_enqueue(
        s,
        &(struct sched_job){
            .job = 1, .kind = DEVICE_CPU, .world = 1, .priority = 50, .time_limit = 100, .run_s = 30},
        now);
    enq(s, 2, DEVICE_CPU, 1, 50, true, NULL);
    CHECK_EQ_INT(next(s), 1);
    CHECK_EQ_INT(next(s), 2);
    now = 20;
    sched_enqueue(
        s, &(struct sched_job){.job = 3, .kind = DEVICE_CPU, .world = 2, .priority = 50, .time_limit = 50},
        now);
    CHECK_EQ_INT(next(s), 3);
    now = 69.5;
    CHECK_EQ_INT(sched_expired(s, now, out, 4), 0);
    now = 70;
    CHECK_EQ_INT(sched_expired(s, now, out, 4), 1);
    CHECK_EQ_INT(out[0], 3);
    now = 80; /* 30 earlier + 70 now */
    CHECK_EQ_INT(sched_expired(s, now, out, 4), 2);
    CHECK(out[0] == 1 && out[1] == 3); /* in start order */
    CHECK_EQ_INT(sched_expired(s, now, out, 1), 1);
    sched_release(s, 3);
    now = 1e6;
    CHECK_EQ_INT(sched_expired(s, now, out, 4), 1); /* job 2 has no limit */
    sched_free(s);
    now = 0;
}

/* Starvation: a 4-rank priority-10 job among an endless stream of 1-rank priority-50 jobs
 * that keeps the 4 GPUs busy starts within the documented bound, (100 - 10) * aging_s plus
 * the longest run; without aging it never does. */
static double starve(double aging, double horizon)
{
    const double run_for = 30, every = 5; /* more work than the 4 GPUs can do */
    struct sched *s = sched_new(4, 0);
    sched_set_aging(s, aging);
    int64_t ends_job[64] = {0};
    double ends_at[64];
    int64_t id = 1;
    double started = -1, next_submit = 0;
    now = 0;
    for (int i = 0; i < 8; i++) /* a backlog first */
        enq(s, ++id, DEVICE_CUDA, 1, 50, true, NULL);
    enq(s, 1, DEVICE_CUDA, 4, 10, true, NULL);
    for (; now <= horizon && started < 0; now += 1) {
        for (int i = 0; i < 64; i++)
            if (ends_job[i] && ends_at[i] <= now) {
                sched_release(s, ends_job[i]);
                ends_job[i] = 0;
            }
        while (next_submit <= now) {
            enq(s, ++id, DEVICE_CUDA, 1, 50, true, NULL);
            next_submit += every;
        }
        for (int64_t j; (j = next(s));) {
            if (j == 1) {
                started = now;
                break;
            }
            for (int i = 0; i < 64; i++)
                if (!ends_job[i]) {
                    ends_job[i] = j;
                    ends_at[i] = now + run_for;
                    break;
                }
        }
        /* Nothing to preempt: the stream is not above the waiting job, and once the job
         * started it keeps the priority it waited for (100) against the stream. */
        int64_t victims[8], for_job;
        CHECK_EQ_INT(sched_preempt(s, now, &for_job, victims, 8), 0);
    }
    if (started >= 0) { /* still so with a new job of the stream waiting */
        enq(s, ++id, DEVICE_CUDA, 1, 50, true, NULL);
        int64_t victims[8], for_job;
        CHECK_EQ_INT(sched_preempt(s, now, &for_job, victims, 8), 0);
    }
    sched_free(s);
    return started;
}

static void test_starvation_bound(void)
{
    double t = starve(SCHED_AGING_S, 20000);
    CHECK(t >= 0);
    CHECK(t <= (100 - 10) * SCHED_AGING_S + 30 + 1);
    CHECK(t > 600); /* it did wait: the stream kept it out for a while */
    fprintf(stderr, "starvation: the 4-rank job started at t=%.0f s (bound %.0f s)\n", t,
            (100 - 10) * SCHED_AGING_S + 30 + 1);
    CHECK(starve(0, 20000) < 0); /* no aging: starved for good */
}

/* sched_take: an inference process never overtakes a waiting job; the reasons name it. */
static void test_take_and_inference(void)
{
    struct sched *s = sched_new(3, 0);
    int slot;
    enq(s, 5, DEVICE_CUDA, 1, 50, true, NULL);
    CHECK_EQ_INT(next(s), 5);
    CHECK(sched_take(s, DEVICE_CUDA, -7, &slot));
    CHECK_EQ_INT(slot, 1);
    enq(s, 9, DEVICE_CUDA, 3, 80, true, NULL);
    CHECK(!sched_take(s, DEVICE_CUDA, -8, &slot)); /* slot 2 is free, but job 9 waits */
    CHECK_EQ_STR(why(s, 9),
                 "waiting for 2 GPUs: held by job 5 (priority 50) and an inference model of job 7");
    int64_t victims[4], for_job = 0;
    CHECK_EQ_INT(sched_preempt(s, now, &for_job, victims, 4), 0); /* inference is never a victim */
    sched_release_slot(s, DEVICE_CUDA, 1);
    CHECK_EQ_INT(sched_preempt(s, now, &for_job, victims, 4), 1);
    CHECK_EQ_INT(victims[0], 5);
    sched_free(s);
}

/* The view: running jobs in start order, then pending ones per kind (GPUs first) in the
 * order they would start, each with sched_pending_reason's sentence. */
struct rows {
    int n;
    struct sched_view_job v[16];
    char owner[16][16];
};

static void collect(void *ctx, const struct sched_view_job *v)
{
    struct rows *r = ctx;
    if (r->n < 16) {
        r->v[r->n] = *v;
        snprintf(r->owner[r->n], sizeof r->owner[r->n], "%s", v->owner);
        r->n++;
    }
}

static void test_view(void)
{
    struct sched *s = sched_new(2, 1);
    now = 100;
    sched_set_limits(s, "alice", 1, -1);
    enq(s, 1, DEVICE_CUDA, 1, 30, true, "alice");
    enq(s, 2, DEVICE_CPU, 1, 50, true, NULL);
    CHECK_EQ_INT(next(s), 2);
    CHECK_EQ_INT(next(s), 1);
    enq(s, 3, DEVICE_CUDA, 2, 40, true, "bob");
    enq(s, 4, DEVICE_CUDA, 1, 90, true, "alice");
    enq(s, 5, DEVICE_CUDA, 1, 40, true, "bob");
    enq(s, 6, DEVICE_CPU, 1, 50, true, NULL);
    now = 100 + 120; /* two points of aging */
    struct rows r = {0};
    sched_view(s, now, collect, &r);
    CHECK_EQ_INT(r.n, 6);
    const int64_t order[] = {2, 1, 4, 3, 5, 6};
    for (int i = 0; i < r.n && i < 6; i++) {
        CHECK_EQ_INT(r.v[i].job, order[i]);
        if (!r.v[i].running)
            CHECK_EQ_STR(r.v[i].reason, why(s, r.v[i].job));
    }
    CHECK(r.v[0].running && r.v[1].running && !r.v[2].running);
    CHECK_EQ_INT(r.v[0].kind, DEVICE_CPU);
    CHECK_EQ_INT(r.v[1].effective, 30); /* running: its priority */
    CHECK_EQ_STR(r.owner[1], "alice");
    CHECK_EQ_STR(r.owner[0], "");
    CHECK_EQ_INT(r.v[2].position, 1);
    CHECK_EQ_INT(r.v[2].effective, 92);
    CHECK_EQ_STR(r.v[2].reason, "quota: alice runs 1 of 1 GPU");
    CHECK_EQ_INT(r.v[3].position, 2);
    CHECK_EQ_STR(r.v[3].reason, "waiting for 1 GPU: held by job 1 (priority 30)");
    CHECK_EQ_STR(r.v[4].reason, "queued behind job 3 (2 jobs ahead for GPUs)");
    CHECK_EQ_INT(r.v[5].position, 1);
    CHECK_EQ_STR(r.v[5].reason, "waiting for 1 CPU slot: held by job 2");
    CHECK(r.v[5].since == 100);
    sched_free(s);
    now = 0;
}

/* Random operations against the invariants: no slot held twice, a started job had all of
 * its slots free and its owner under quota, a victim's priority is below its job's and the
 * victims are a minimal set, effective priorities stay within 0..100, the view's order is
 * the policy's. */
static uint64_t rng = 88172645463325252ull;
static int rnd(int n)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (int)(rng % (uint64_t)n);
}

#define RJOBS 4096
struct rjob {
    int state; /* 0 none, 1 queued, 2 running, 3 gone */
    device_kind kind;
    int world, priority, owner;
    bool preemptible, preempting;
};
static struct rjob rj[RJOBS];
static const char *rowners[] = {NULL, "alice", "bob", "carol"};
static int rused[4][2];
static const int rlimit[4][2] = {{-1, -1}, {2, 3}, {4, -1}, {-1, 1}}; /* [owner][kind] */

struct rview {
    int n, bad;
    int last_kind, last_eff;
    int64_t last_job;
};

static void rview_row(void *ctx, const struct sched_view_job *v)
{
    struct rview *r = ctx;
    r->n++;
    if (v->effective < 0 || v->effective > 100 || v->effective < v->priority)
        r->bad++;
    if (v->running)
        return;
    if (rj[v->job].state != 1)
        r->bad++;
    if ((int)v->kind == r->last_kind &&
        (v->effective > r->last_eff || (v->effective == r->last_eff && v->job < r->last_job)))
        r->bad++;
    r->last_kind = v->kind, r->last_eff = v->effective, r->last_job = v->job;
}

static void test_random(void)
{
    struct sched *s = sched_new(6, 5);
    sched_set_aging(s, 10);
    for (int o = 1; o < 4; o++)
        sched_set_limits(s, rowners[o], rlimit[o][DEVICE_CUDA], rlimit[o][DEVICE_CPU]);
    int64_t nextid = 1;
    int started = 0, preempted = 0, fails = 0;
    now = 0;
    for (int op = 0; op < 6000 && fails < 5; op++) {
        now += rnd(4);
        int what = rnd(10);
        if (what < 4 && nextid < RJOBS) {
            struct rjob *j = &rj[nextid];
            *j = (struct rjob){.state = 1,
                               .kind = rnd(2) ? DEVICE_CUDA : DEVICE_CPU,
                               .priority = rnd(101),
                               .owner = rnd(4),
                               .preemptible = rnd(4) != 0};
            j->world = 1 + rnd(j->kind == DEVICE_CUDA ? 4 : 3);
            enq(s, nextid++, j->kind, j->world, j->priority, j->preemptible, rowners[j->owner]);
        } else if (what < 7) { /* a running job ends (a victim drains), or a queued one is cancelled */
            int64_t pick[RJOBS];
            int npick = 0;
            for (int64_t i = 1; i < nextid; i++)
                if (rj[i].state == (what < 6 ? 2 : 1))
                    pick[npick++] = i;
            int64_t id = npick ? pick[rnd(npick)] : nextid;
            if (id < nextid && rj[id].state == 2) {
                sched_release(s, id);
                rused[rj[id].owner][rj[id].kind] -= rj[id].world;
                rj[id].state = 3;
                if (rj[id].preempting) { /* back to the queue */
                    rj[id].state = 1;
                    rj[id].preempting = false;
                    enq(s, id, rj[id].kind, rj[id].world, rj[id].priority, rj[id].preemptible,
                        rowners[rj[id].owner]);
                }
            } else if (id < nextid && rj[id].state == 1) {
                CHECK(sched_dequeue(s, id));
                rj[id].state = 3;
            }
        } else if (what < 9) { /* a pass */
            int64_t holder[2][8];
            for (int t = 0; t < 2; t++)
                for (int i = 0; i < sched_slots(s, (device_kind)t); i++)
                    holder[t][i] = sched_slot_holder(s, (device_kind)t, i);
            int64_t job;
            device_kind kind;
            int slots[8], world;
            while (sched_next(s, now, &job, &kind, slots, &world)) {
                struct rjob *j = &rj[job];
                bool ok = j->state == 1 && kind == j->kind && world == j->world;
                int lim = rlimit[j->owner][kind];
                ok = ok && (lim < 0 || rused[j->owner][kind] + world <= lim);
                for (int i = 0; i < world; i++) {
                    ok = ok && holder[kind][slots[i]] == 0 && sched_slot_holder(s, kind, slots[i]) == job;
                    holder[kind][slots[i]] = job;
                }
                if (!ok) {
                    CHECK(ok);
                    fails++;
                }
                j->state = 2;
                rused[j->owner][kind] += world;
                started++;
            }
            int64_t victims[16], for_job = 0;
            int n = sched_preempt(s, now, &for_job, victims, 16);
            if (n > 0) {
                struct rjob *f = &rj[for_job];
                int freed = 0, nfree = 0;
                for (int i = 0; i < sched_slots(s, f->kind); i++)
                    nfree += sched_slot_holder(s, f->kind, i) == 0;
                bool ok = f->state == 1 && nfree < f->world;
                for (int i = 0; i < n; i++) {
                    struct rjob *v = &rj[victims[i]];
                    ok = ok && v->state == 2 && !v->preempting && v->preemptible &&
                         v->priority < f->priority && v->kind == f->kind;
                    v->preempting = true;
                    freed += v->world;
                }
                ok = ok && nfree + freed >= f->world;
                for (int i = 0; i < n; i++) /* minimal: none can be spared */
                    ok = ok && nfree + freed - rj[victims[i]].world < f->world;
                if (!ok) {
                    CHECK(ok);
                    fails++;
                }
                preempted += n;
            }
        } else { /* the view */
            struct rview r = {.last_kind = -1};
            sched_view(s, now, rview_row, &r);
            int queued = 0, running = 0;
            for (int64_t id = 1; id < nextid; id++)
                queued += rj[id].state == 1, running += rj[id].state == 2;
            if (r.bad || r.n != queued + running) {
                CHECK_EQ_INT(r.bad, 0);
                CHECK_EQ_INT(r.n, queued + running);
                fails++;
            }
        }
        /* No slot held twice: each running job holds exactly its world. */
        for (int t = 0; t < 2; t++) {
            int held = 0;
            for (int i = 0; i < sched_slots(s, (device_kind)t); i++) {
                int64_t h = sched_slot_holder(s, (device_kind)t, i);
                if (h > 0 && (rj[h].state != 2 || rj[h].kind != (device_kind)t)) {
                    CHECK(false);
                    fails++;
                }
                held += h > 0;
            }
            int want = 0;
            for (int64_t id = 1; id < nextid; id++)
                want += rj[id].state == 2 && rj[id].kind == (device_kind)t ? rj[id].world : 0;
            if (held != want) {
                CHECK_EQ_INT(held, want);
                fails++;
            }
        }
    }
    fprintf(stderr, "random: %" PRId64 " jobs, %d starts, %d victims\n", nextid - 1, started, preempted);
    CHECK(started > 500 && preempted > 10);
    sched_free(s);
    now = 0;
}

int main(void)
{
    test_priority_order();
    test_aging();
    test_gang_after_two_preemptions();
    test_minimal_victims();
    test_no_victims();
    test_quotas();
    test_time_limits();
    test_starvation_bound();
    test_take_and_inference();
    test_view();
    test_random();
    CHECK_DONE();
}
