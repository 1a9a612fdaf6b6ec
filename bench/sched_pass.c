/* sched_pass.c — the cost of one scheduling pass (sched_next until false, then
 * sched_preempt) with 10,000 pending jobs over 64 GPU slots, and of sched_view over them
 * (issue 32's goal: a pass <= 10 ms). Mixed priorities, worlds 1..8, 20 owners of which 5
 * are at their quota of 8 GPUs; jobs submitted over the last 10 minutes, so aging orders them.
 * Each timed pass starts from a fresh state whose clock has moved by one aging step: every
 * effective priority has changed and the queue is sorted again (the worst case), with 16
 * slots just freed so that the pass starts jobs, and jobs of all priorities running so
 * that it preempts some. Prints medians over many passes. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../server/sched.h"

#define PENDING 10000
#define SLOTS   64
#define OWNERS  20
#define ROUNDS  41

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static int rnd(int n)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (int)(rng % (uint64_t)n);
}

static double mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static char owners[OWNERS][16];
static int64_t next_id = 1;

static void submit(struct sched *s, double at)
{
    struct sched_job j = {.job = next_id++,
                          .kind = DEVICE_CUDA,
                          .world = 1 + rnd(8),
                          .priority = rnd(101),
                          .preemptible = rnd(8) != 0,
                          .owner = owners[rnd(OWNERS)]};
    sched_enqueue(s, &j, at);
}

/* A server 10 minutes into its day: every slot held, PENDING waiting, 16 slots just freed. */
static struct sched *setup(double *now)
{
    struct sched *s = sched_new(SLOTS, 0);
    for (int o = 0; o < OWNERS; o++) {
        snprintf(owners[o], sizeof owners[o], "user%02d", o);
        if (o < 5)
            sched_set_limits(s, owners[o], 8, -1);
    }
    next_id = 1;
    int64_t job, started[SLOTS];
    device_kind kind;
    int slots[SLOTS], world, n = 0;
    for (;;) { /* what runs: started at 0, one by one, before the queue filled */
        submit(s, 0);
        if (!sched_next(s, 0, &job, &kind, slots, &world)) {
            sched_dequeue(s, next_id - 1);
            break;
        }
        started[n++] = job;
    }
    for (int i = 0; i < PENDING; i++)
        submit(s, 600.0 * i / PENDING);
    *now = 600;
    int freed = 0; /* end the first jobs started until 16 slots are free */
    for (int i = 0; i < n && freed < 16; i++) {
        for (int k = 0; k < SLOTS; k++)
            freed += sched_slot_holder(s, DEVICE_CUDA, k) == started[i];
        sched_release(s, started[i]);
    }
    while (sched_waiting(s, DEVICE_CUDA) < PENDING)
        submit(s, *now);
    for (int64_t id = next_id - 1; sched_waiting(s, DEVICE_CUDA) > PENDING; id--)
        sched_dequeue(s, id);
    *now += SCHED_AGING_S + 1;
    return s;
}

struct sink {
    size_t bytes;
    int rows;
};

static void row(void *ctx, const struct sched_view_job *v)
{
    struct sink *k = ctx;
    k->bytes += strlen(v->reason);
    k->rows++;
}

int main(void)
{
    double pass[ROUNDS], steady[ROUNDS], view[ROUNDS];
    int starts = 0, victims = 0, rows = 0;
    for (int r = 0; r < ROUNDS; r++) {
        double now;
        struct sched *s = setup(&now);
        int64_t job, v[SLOTS], for_job;
        device_kind kind;
        int slots[SLOTS], world;
        double t0 = mono();
        while (sched_next(s, now, &job, &kind, slots, &world))
            starts++;
        victims += sched_preempt(s, now, &for_job, v, SLOTS);
        pass[r] = mono() - t0;
        t0 = mono(); /* the next pass at the same time: the order holds */
        while (sched_next(s, now, &job, &kind, slots, &world))
            starts++;
        victims += sched_preempt(s, now, &for_job, v, SLOTS);
        steady[r] = mono() - t0;
        struct sink k = {0};
        now += SCHED_AGING_S; /* the view sorts again too */
        t0 = mono();
        sched_view(s, now, row, &k);
        view[r] = mono() - t0;
        rows = k.rows;
        sched_free(s);
    }
    qsort(pass, ROUNDS, sizeof *pass, cmp_double);
    qsort(steady, ROUNDS, sizeof *steady, cmp_double);
    qsort(view, ROUNDS, sizeof *view, cmp_double);
    printf("%d pending jobs over %d GPU slots, %d rounds (%.1f starts and %.1f victims per pass)\n", PENDING,
           SLOTS, ROUNDS, (double)starts / ROUNDS, (double)victims / ROUNDS);
    printf("pass, every effective priority changed (a sort): median %.3f ms (min %.3f, max %.3f); goal <= 10 "
           "ms: "
           "%s\n",
           pass[ROUNDS / 2] * 1e3, pass[0] * 1e3, pass[ROUNDS - 1] * 1e3,
           pass[ROUNDS / 2] <= 0.010 ? "met" : "MISSED");
    printf("pass, order unchanged: median %.3f ms (min %.3f, max %.3f)\n", steady[ROUNDS / 2] * 1e3,
           steady[0] * 1e3, steady[ROUNDS - 1] * 1e3);
    printf("sched_view of %d jobs with their reasons: median %.3f ms (min %.3f, max %.3f)\n", rows,
           view[ROUNDS / 2] * 1e3, view[0] * 1e3, view[ROUNDS - 1] * 1e3);
    return pass[ROUNDS / 2] <= 0.010 ? 0 : 1;
}
