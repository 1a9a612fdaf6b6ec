/* test_server_sched.c — slots and queues: FIFO per device kind, gang allocation,
 * pending reasons, jobs that can never fit. */
#include "check.h"
#include "server/sched.h"

/* sched_take (an inference process's GPU): a free slot at once, never ahead of a job that
 * waits for the kind, never a slot without code; a job sees the slot as held. */
static void test_take(void)
{
    struct sched *s = sched_new(2, 0);
    int slot = -1, slots[2], world;
    int64_t job;
    device_kind kind;
    CHECK(sched_take(s, DEVICE_CUDA, -3, &slot));
    CHECK_EQ_INT(slot, 0);
    CHECK_EQ_INT(sched_slot_holder(s, DEVICE_CUDA, 0), -3);
    sched_enqueue(s,
                  &(struct sched_job){.job = 4,
                                      .kind = DEVICE_CUDA,
                                      .world = 2,
                                      .priority = SPEC_PRIORITY_DEFAULT,
                                      .preemptible = true},
                  0); /* needs both: waits */
    CHECK(!sched_next(s, 0, &job, &kind, slots, &world));
    CHECK_EQ_INT(sched_waiting(s, DEVICE_CUDA), 1);
    CHECK(!sched_take(s, DEVICE_CUDA, -5, &slot)); /* slot 1 is free, but job 4 waits */
    sched_release_slot(s, DEVICE_CUDA, 0);
    CHECK(sched_next(s, 0, &job, &kind, slots, &world));
    CHECK_EQ_INT(job, 4);
    CHECK_EQ_INT(sched_waiting(s, DEVICE_CUDA), 0);
    CHECK(!sched_take(s, DEVICE_CUDA, -5, &slot)); /* none free */
    sched_release(s, 4);
    struct sched_gpu_info info[2] = {{.known = true, .no_code = true}, {.known = false}};
    sched_describe_gpus(s, info);
    CHECK(sched_take(s, DEVICE_CUDA, -5, &slot)); /* slot 0 has no code: never given */
    CHECK_EQ_INT(slot, 1);
    sched_free(s);
}

int main(void)
{
    test_take();
    struct sched *s = sched_new(0, 2);
    char why[256];
    CHECK(sched_fits(s, DEVICE_CPU, 2, why, sizeof why));
    CHECK(!sched_fits(s, DEVICE_CPU, 3, why, sizeof why));
    CHECK_EQ_STR(why, "world_size 3 needs 3 CPU slots but this server has 2");
    CHECK(!sched_fits(s, DEVICE_CUDA, 1, why, sizeof why));
    CHECK_EQ_STR(why, "device cuda: this server has no GPUs");

    /* Three jobs competing for two slots: 1 (2 ranks), 2 (1 rank), 3 (1 rank). */
    sched_enqueue(
        s,
        &(struct sched_job){
            .job = 1, .kind = DEVICE_CPU, .world = 2, .priority = SPEC_PRIORITY_DEFAULT, .preemptible = true},
        0);
    sched_enqueue(
        s,
        &(struct sched_job){
            .job = 2, .kind = DEVICE_CPU, .world = 1, .priority = SPEC_PRIORITY_DEFAULT, .preemptible = true},
        0);
    sched_enqueue(
        s,
        &(struct sched_job){
            .job = 3, .kind = DEVICE_CPU, .world = 1, .priority = SPEC_PRIORITY_DEFAULT, .preemptible = true},
        0);
    int64_t job;
    device_kind kind;
    int slots[8], world;
    CHECK(sched_next(s, 0, &job, &kind, slots, &world));
    CHECK_EQ_INT(job, 1);
    CHECK_EQ_INT(world, 2);
    CHECK(slots[0] == 0 && slots[1] == 1);
    CHECK_EQ_INT(sched_slot_holder(s, DEVICE_CPU, 1), 1);
    CHECK(!sched_next(s, 0, &job, &kind, slots, &world)); /* gang: nothing free */
    sched_pending_reason(s, 2, 0, why, sizeof why);
    CHECK_EQ_STR(why, "waiting for 1 CPU slot: held by job 1");
    sched_pending_reason(s, 3, 0, why, sizeof why);
    CHECK_EQ_STR(why, "queued behind job 2 (1 job ahead for CPU slots)");
    sched_pending_reason(s, 1, 0, why, sizeof why);
    CHECK_EQ_STR(why, "");

    sched_release(s, 1);
    CHECK(sched_next(s, 0, &job, &kind, slots, &world));
    CHECK_EQ_INT(job, 2);
    CHECK(sched_next(s, 0, &job, &kind, slots, &world));
    CHECK_EQ_INT(job, 3);
    CHECK(!sched_next(s, 0, &job, &kind, slots, &world));

    /* A younger small job never overtakes an older big one of the same kind. */
    sched_release(s, 2);
    sched_enqueue(
        s,
        &(struct sched_job){
            .job = 4, .kind = DEVICE_CPU, .world = 2, .priority = SPEC_PRIORITY_DEFAULT, .preemptible = true},
        0);
    sched_enqueue(
        s,
        &(struct sched_job){
            .job = 5, .kind = DEVICE_CPU, .world = 1, .priority = SPEC_PRIORITY_DEFAULT, .preemptible = true},
        0);
    CHECK(!sched_next(s, 0, &job, &kind, slots, &world));
    CHECK(sched_dequeue(s, 4));
    CHECK(!sched_dequeue(s, 4));
    CHECK(sched_next(s, 0, &job, &kind, slots, &world));
    CHECK_EQ_INT(job, 5);

    /* Submissions that reach the queue out of order still run in id order (FIFO by
     * submission): 8 and 7 arrive before 6. */
    sched_release(s, 3);
    sched_release(s, 5);
    sched_enqueue(
        s,
        &(struct sched_job){
            .job = 9, .kind = DEVICE_CPU, .world = 2, .priority = SPEC_PRIORITY_DEFAULT, .preemptible = true},
        0);
    sched_enqueue(
        s,
        &(struct sched_job){
            .job = 8, .kind = DEVICE_CPU, .world = 1, .priority = SPEC_PRIORITY_DEFAULT, .preemptible = true},
        0);
    sched_enqueue(
        s,
        &(struct sched_job){
            .job = 7, .kind = DEVICE_CPU, .world = 1, .priority = SPEC_PRIORITY_DEFAULT, .preemptible = true},
        0);
    sched_enqueue(
        s,
        &(struct sched_job){
            .job = 6, .kind = DEVICE_CPU, .world = 1, .priority = SPEC_PRIORITY_DEFAULT, .preemptible = true},
        0);
    for (int64_t want = 6; want <= 9; want++) {
        CHECK(sched_next(s, 0, &job, &kind, slots, &world));
        CHECK_EQ_INT(job, want);
        sched_release(s, job);
    }
    sched_free(s);
    sched_free(NULL);

    /* Reasons by binary search over a long queue of both kinds, ids with gaps and
     * arriving out of order; ids not queued (between, before, after, running) have none. */
    s = sched_new(1, 1);
    sched_enqueue(s,
                  &(struct sched_job){.job = 1000,
                                      .kind = DEVICE_CPU,
                                      .world = 1,
                                      .priority = SPEC_PRIORITY_DEFAULT,
                                      .preemptible = true},
                  0); /* starts: holds the slot */
    CHECK(sched_next(s, 0, &job, &kind, slots, &world));
    for (int64_t id = 2998; id >= 1002; id -= 2) /* backwards: every one an out-of-order arrival */
        sched_enqueue(s,
                      &(struct sched_job){.job = id,
                                          .kind = id % 4 ? DEVICE_CPU : DEVICE_CUDA,
                                          .world = 1,
                                          .priority = SPEC_PRIORITY_DEFAULT,
                                          .preemptible = true},
                      0);
    sched_enqueue(s,
                  &(struct sched_job){.job = 1001,
                                      .kind = DEVICE_CUDA,
                                      .world = 1,
                                      .priority = SPEC_PRIORITY_DEFAULT,
                                      .preemptible = true},
                  0); /* starts on the GPU */
    CHECK(sched_next(s, 0, &job, &kind, slots, &world));
    CHECK_EQ_INT(job, 1001);
    sched_pending_reason(s, 1002, 0, why, sizeof why);
    CHECK_EQ_STR(why, "waiting for 1 CPU slot: held by job 1000");
    sched_pending_reason(s, 1006, 0, why, sizeof why);
    CHECK_EQ_STR(why, "queued behind job 1002 (1 job ahead for CPU slots)");
    sched_pending_reason(s, 2998, 0, why, sizeof why);
    CHECK_EQ_STR(why, "queued behind job 1002 (499 jobs ahead for CPU slots)");
    sched_pending_reason(s, 1004, 0, why, sizeof why);
    CHECK_EQ_STR(why, "waiting for 1 GPU: held by job 1001");
    sched_pending_reason(s, 2996, 0, why, sizeof why);
    CHECK_EQ_STR(why, "queued behind job 1004 (498 jobs ahead for GPUs)");
    const int64_t none[] = {1, 999, 1000, 1001, 1003, 2997, 2999, 3000, 100000};
    for (size_t i = 0; i < sizeof none / sizeof none[0]; i++) {
        sched_pending_reason(s, none[i], 0, why, sizeof why);
        CHECK_EQ_STR(why, "");
    }
    sched_free(s);
    CHECK_DONE();
}
