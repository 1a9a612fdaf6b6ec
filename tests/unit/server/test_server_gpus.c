/* test_server_gpus.c — which GPU a scheduler slot stands for (sched_gpu_ids): `--gpus 2,3`
 * puts slot 0 on GPU 2, `auto` numbers the devices among the server's own
 * CUDA_VISIBLE_DEVICES, malformed or repeated lists are refused, and the scheduler's GPU
 * slots carry the names (sched_name_gpus) and what `ddpd-worker --devices` said of their
 * devices (sched_gpu_match, sched_describe_gpus). No GPU needed. */
#include "check.h"
#include "server/sched.h"

#define CAP 8

int main(void)
{
    char ids[CAP][SCHED_GPU_ID_MAX], why[256] = "";

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
    CHECK_DONE();
}
