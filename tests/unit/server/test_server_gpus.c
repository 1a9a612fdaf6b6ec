/* test_server_gpus.c — which GPU a scheduler slot stands for (sched_gpu_ids): `--gpus 2,3`
 * puts slot 0 on GPU 2, `auto` numbers the devices among the server's own
 * CUDA_VISIBLE_DEVICES, malformed or repeated lists are refused, and the scheduler's GPU
 * slots carry the names (sched_name_gpus) and what `ddpd-worker --devices` said of their
 * devices (sched_gpu_match, sched_describe_gpus); a GPU the CUDA module holds no code for
 * is never given to a job, and a job that needs it is refused saying why. No GPU needed. */
#include "check.h"
#include "server/sched.h"

#define CAP 8

int main(void)
{
    char ids[CAP][SCHED_GPU_ID_MAX], why[512] = ""; /* the API's size */

    CHECK_EQ_INT(sched_gpu_ids("none", 4, NULL, ids, CAP, why, sizeof why), 0);

    /* An explicit list: slot i is the i-th device named, verbatim. */
    CHECK_EQ_INT(sched_gpu_ids("2,3", 0, NULL, ids, CAP, why, sizeof why), 2);
    CHECK_EQ_STR(ids[0], "2");
    CHECK_EQ_STR(ids[1], "3");
    CHECK_EQ_INT(sched_gpu_ids("5", 0, "0,1", ids, CAP, why, sizeof why), 1);
    CHECK_EQ_STR(ids[0], "5");
    CHECK_EQ_INT(
        sched_gpu_ids("GPU-8f2c1a3b-0000-1111-2222-333344445555,1", 0, NULL, ids, CAP, why, sizeof why), 2);
    CHECK_EQ_STR(ids[0], "GPU-8f2c1a3b-0000-1111-2222-333344445555");
    CHECK_EQ_STR(ids[1], "1");

    /* auto: --devices' index i is the i-th device the server itself sees. */
    CHECK_EQ_INT(sched_gpu_ids("auto", 2, NULL, ids, CAP, why, sizeof why), 2);
    CHECK_EQ_STR(ids[0], "0");
    CHECK_EQ_STR(ids[1], "1");
    CHECK_EQ_INT(sched_gpu_ids("auto", 2, "6,4", ids, CAP, why, sizeof why), 2);
    CHECK_EQ_STR(ids[0], "6");
    CHECK_EQ_STR(ids[1], "4");
    CHECK_EQ_INT(sched_gpu_ids("auto", 0, "6,4", ids, CAP, why, sizeof why), 0);
    CHECK_EQ_INT(sched_gpu_ids("auto", 3, "7", ids, CAP, why, sizeof why), 3); /* list too short */
    CHECK_EQ_STR(ids[0], "7");
    CHECK_EQ_STR(ids[2], "2");
    CHECK_EQ_INT(sched_gpu_ids("auto", CAP + 5, NULL, ids, CAP, why, sizeof why), CAP);

    /* Refused, with a reason. */
    CHECK_EQ_INT(sched_gpu_ids("1,,2", 0, NULL, ids, CAP, why, sizeof why), -1);
    CHECK(strstr(why, "'' is not a GPU") != NULL);
    CHECK_EQ_INT(sched_gpu_ids("1,2;rm", 0, NULL, ids, CAP, why, sizeof why), -1);
    CHECK(strstr(why, "'2;rm' is not a GPU") != NULL);
    CHECK_EQ_INT(sched_gpu_ids("", 0, NULL, ids, CAP, why, sizeof why), -1);
    CHECK_EQ_INT(sched_gpu_ids("3,1,3", 0, NULL, ids, CAP, why, sizeof why), -1);
    CHECK_EQ_STR(why, "--gpus: GPU 3 is listed twice");
    CHECK_EQ_INT(sched_gpu_ids("0,1,2,3,4,5,6,7,8", 0, NULL, ids, CAP, why, sizeof why), -1);
    CHECK_EQ_STR(why, "--gpus: more than 8 GPUs");

    /* The scheduler's GPU slots carry those names: "i" until named, NULL past the slots. */
    struct sched *s = sched_new(2, 1);
    CHECK(s != NULL);
    CHECK_EQ_STR(sched_gpu_device(s, 1), "1");
    CHECK_EQ_INT(sched_gpu_ids("GPU-a,7", 0, NULL, ids, CAP, why, sizeof why), 2);
    sched_name_gpus(s, (const char(*)[SCHED_GPU_ID_MAX])ids);
    CHECK_EQ_STR(sched_gpu_device(s, 0), "GPU-a");
    CHECK_EQ_STR(sched_gpu_device(s, 1), "7");
    CHECK(sched_gpu_device(s, 2) == NULL);
    CHECK(sched_gpu_device(s, -1) == NULL);

    /* Described by what --devices listed: by the name "auto" gives a device, or its uuid. */
    struct sched_gpu_info found[3] =
        {
            {.known = true, .memory = 100, .name = "A", .uuid = "GPU-a"},
            {.known = true, .emulated = true, .memory = 200, .name = "B", .uuid = "GPU-b"},
            {.known = true, .memory = 300, .name = "C", .uuid = ""},
        },
                          info[CAP];
    CHECK_EQ_INT(sched_gpu_ids("auto", 3, NULL, ids, CAP, why, sizeof why), 3);
    sched_gpu_match((const char(*)[SCHED_GPU_ID_MAX])ids, 3, NULL, found, 3, info);
    CHECK_EQ_STR(info[0].name, "A");
    CHECK(info[1].known && info[1].emulated && info[1].memory == 200);
    CHECK_EQ_STR(info[2].name, "C");
    /* Under the server's CUDA_VISIBLE_DEVICES=6,4: GPU 4 is the second it sees. */
    CHECK_EQ_INT(sched_gpu_ids("4,GPU-a,9", 0, NULL, ids, CAP, why, sizeof why), 3);
    sched_gpu_match((const char(*)[SCHED_GPU_ID_MAX])ids, 3, "6,4", found, 2, info);
    CHECK_EQ_STR(info[0].name, "B");
    CHECK(info[0].known && info[0].emulated);
    CHECK_EQ_STR(info[1].name, "A");
    CHECK(!info[2].known && !info[2].emulated && info[2].name[0] == '\0'); /* not listed */
    CHECK_EQ_INT(sched_gpu_ids("1", 0, NULL, ids, CAP, why, sizeof why), 1);
    sched_gpu_match((const char(*)[SCHED_GPU_ID_MAX])ids, 1, "6,4", found, 2, info);
    CHECK(!info[0].known); /* "1" is no device the server sees under 6,4 */

    /* The slots carry the descriptions; nothing is known until described. */
    CHECK(!sched_gpu_info(s, 0)->known);
    CHECK(sched_gpu_info(s, 2) == NULL);
    sched_describe_gpus(s, found + 1);
    CHECK(sched_gpu_info(s, 0)->emulated);
    CHECK_EQ_STR(sched_gpu_info(s, 1)->name, "C");
    sched_describe_gpus(s, NULL); /* keeps them */
    CHECK_EQ_STR(sched_gpu_info(s, 0)->name, "B");
    sched_free(s);

    /* A GPU without code in the module (an L40S, 8.9, and a module of sm_80 sm_90): no job
     * gets its slot, and one that would need it is refused naming it. */
    s = sched_new(3, 0);
    struct sched_gpu_info mixed[3] = {
        {.known = true, .name = "H", .cc = "9.0", .code = "sm_90", .module_code = "sm_80 sm_90"},
        {.known = true, .name = "L40S", .cc = "8.9", .no_code = true, .module_code = "sm_80 sm_90"},
        {.known = true, .name = "A", .cc = "8.0", .code = "sm_80", .module_code = "sm_80 sm_90"},
    };
    sched_describe_gpus(s, mixed);
    CHECK_EQ_INT(sched_slots(s, DEVICE_CUDA), 3);
    CHECK_EQ_INT(sched_usable_slots(s, DEVICE_CUDA), 2);
    CHECK(sched_fits(s, DEVICE_CUDA, 2, why, sizeof why));
    CHECK(!sched_fits(s, DEVICE_CUDA, 3, why, sizeof why));
    CHECK(strstr(why, "GPU 1 (device 1, L40S) has compute capability 8.9") != NULL);
    CHECK(strstr(why, "it was built for sm_80 sm_90") != NULL);
    CHECK(strstr(why, "can use 2 of the 3 GPUs, world_size 3 needs 3") != NULL);
    CHECK(strstr(why, "-DDDPD_CUDA_ARCHS=all") != NULL);
    CHECK(!sched_fits(s, DEVICE_CUDA, 4, why, sizeof why));
    CHECK_EQ_STR(why, "world_size 4 needs 4 GPUs but this server has 3");
    int slots[3], world;
    int64_t job;
    device_kind kind;
    sched_enqueue(s,
                  &(struct sched_job){.job = 7,
                                      .kind = DEVICE_CUDA,
                                      .world = 2,
                                      .priority = SPEC_PRIORITY_DEFAULT,
                                      .preemptible = true},
                  0);
    sched_enqueue(s,
                  &(struct sched_job){.job = 8,
                                      .kind = DEVICE_CUDA,
                                      .world = 1,
                                      .priority = SPEC_PRIORITY_DEFAULT,
                                      .preemptible = true},
                  0);
    CHECK(sched_next(s, 0, &job, &kind, slots, &world));
    CHECK(job == 7 && world == 2 && slots[0] == 0 && slots[1] == 2);
    CHECK(!sched_next(s, 0, &job, &kind, slots, &world)); /* GPU 1 is free but never given */
    sched_pending_reason(s, 8, 0, why, sizeof why);
    CHECK_EQ_STR(why, "waiting for 1 GPU: held by job 7");
    sched_release(s, 7);
    CHECK(sched_next(s, 0, &job, &kind, slots, &world));
    CHECK(job == 8 && slots[0] == 0);
    sched_free(s);
    /* Every GPU without code: nothing fits, even one rank. */
    s = sched_new(1, 0);
    sched_describe_gpus(s, mixed + 1);
    CHECK(!sched_fits(s, DEVICE_CUDA, 1, why, sizeof why));
    CHECK(strstr(why, "device cuda: this server's GPU 0 (device 0, L40S) has compute capability 8.9") == why);
    CHECK(strstr(why, "can use 0 of the 1 GPU, world_size 1 needs 1") != NULL);
    sched_free(s);
    /* Four of them with long names: two named, the rest counted, the advice still there. */
    struct sched_gpu_info four[4];
    for (int i = 0; i < 4; i++)
        four[i] =
            (struct sched_gpu_info){.known = true,
                                    .cc = "7.0",
                                    .no_code = true,
                                    .module_code = "sm_75 sm_80 sm_86 sm_89 sm_90 sm_100 sm_120 compute_120"};
    for (int i = 0; i < 4; i++)
        memset(four[i].name, 'V', sizeof four[i].name - 1);
    s = sched_new(4, 0);
    sched_describe_gpus(s, four);
    CHECK(!sched_fits(s, DEVICE_CUDA, 1, why, sizeof why));
    CHECK(strstr(why, "(and 2 more)") != NULL);
    CHECK(strstr(why, "-DDDPD_CUDA_ARCHS=all") != NULL);
    sched_free(s);
    CHECK_DONE();
}
