/* test_server_sched.c — slots and queues: FIFO per device kind, gang allocation,
 * pending reasons, jobs that can never fit. */
#include "check.h"
#include "server/sched.h"

int main(void)
{
    struct sched *s = sched_new(0, 2);
    char why[256];
    CHECK(sched_fits(s, DEVICE_CPU, 2, why, sizeof why));
    CHECK(!sched_fits(s, DEVICE_CPU, 3, why, sizeof why));
    CHECK_EQ_STR(why, "world_size 3 needs 3 CPU slots but this server has 2");
    CHECK(!sched_fits(s, DEVICE_CUDA, 1, why, sizeof why));
    CHECK_EQ_STR(why, "device cuda: this server has no GPUs");

    /* Three jobs competing for two slots: 1 (2 ranks), 2 (1 rank), 3 (1 rank). */
    sched_enqueue(s, 1, DEVICE_CPU, 2);
    sched_enqueue(s, 2, DEVICE_CPU, 1);
    sched_enqueue(s, 3, DEVICE_CPU, 1);
    int64_t job;
    device_kind kind;
    int slots[8], world;
    CHECK(sched_next(s, &job, &kind, slots, &world));
    CHECK_EQ_INT(job, 1);
    CHECK_EQ_INT(world, 2);
    CHECK(slots[0] == 0 && slots[1] == 1);
    CHECK_EQ_INT(sched_slot_holder(s, DEVICE_CPU, 1), 1);
    CHECK(!sched_next(s, &job, &kind, slots, &world)); /* gang: nothing free */
    sched_pending_reason(s, 2, why, sizeof why);
    CHECK_EQ_STR(why, "waiting for 1 free CPU slots (0 of 2 free)");
    sched_pending_reason(s, 3, why, sizeof why);
    CHECK_EQ_STR(why, "queued behind job 2 (1 earlier job waiting for CPU slots)");
    sched_pending_reason(s, 1, why, sizeof why);
    CHECK_EQ_STR(why, "");

    sched_release(s, 1);
    CHECK(sched_next(s, &job, &kind, slots, &world));
    CHECK_EQ_INT(job, 2);
    CHECK(sched_next(s, &job, &kind, slots, &world));
    CHECK_EQ_INT(job, 3);
    CHECK(!sched_next(s, &job, &kind, slots, &world));

    /* A younger small job never overtakes an older big one of the same kind. */
    sched_release(s, 2);
    sched_enqueue(s, 4, DEVICE_CPU, 2);
    sched_enqueue(s, 5, DEVICE_CPU, 1);
    CHECK(!sched_next(s, &job, &kind, slots, &world));
    CHECK(sched_dequeue(s, 4));
    CHECK(!sched_dequeue(s, 4));
    CHECK(sched_next(s, &job, &kind, slots, &world));
    CHECK_EQ_INT(job, 5);

    /* Submissions that reach the queue out of order still run in id order (FIFO by
     * submission): 8 and 7 arrive before 6. */
    sched_release(s, 3);
    sched_release(s, 5);
    sched_enqueue(s, 9, DEVICE_CPU, 2);
    sched_enqueue(s, 8, DEVICE_CPU, 1);
    sched_enqueue(s, 7, DEVICE_CPU, 1);
    sched_enqueue(s, 6, DEVICE_CPU, 1);
    for (int64_t want = 6; want <= 9; want++) {
        CHECK(sched_next(s, &job, &kind, slots, &world));
        CHECK_EQ_INT(job, want);
        sched_release(s, job);
    }
    sched_free(s);
    sched_free(NULL);
    CHECK_DONE();
}
