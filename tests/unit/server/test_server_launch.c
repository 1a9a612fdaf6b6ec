/* test_server_launch.c — server/launch.c and its backends' tables without a worker: the
 * launcher policy the supervisor asks (local: the server's slots and device names;
 * Slurm: its own queue, no slots here), and one local attempt of a stand-in worker (a
 * shell script: its stdin document, its stdout lines, its exit code in the result). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "schema/jobdoc.h"
#include "server/launch.h"
#include "server/launch_slurm.h"
#include "server/sched.h"

static void test_policy(void)
{
    struct launcher *local = launcher_local_new();
    struct slurm_opts so = {.name_prefix = "ddpd.t."};
    struct launcher *slurm = launcher_slurm_new(&so);
    CHECK(local && slurm);
    if (!local || !slurm)
        return;
    CHECK_EQ_STR(launcher_name(local), "local");
    CHECK_EQ_STR(launcher_name(NULL), "local"); /* NULL is the local launcher */
    CHECK_EQ_STR(launcher_name(slurm), "slurm");
    CHECK(!launcher_queues(local));
    CHECK(launcher_queues(slurm));

    struct sched *s = sched_new(2, 1);
    char ids[2][SCHED_GPU_ID_MAX] = {"5", "GPU-x"}, why[256] = "";
    sched_name_gpus(s, (const char(*)[SCHED_GPU_ID_MAX])ids);
    CHECK(launcher_fits(local, s, DEVICE_CUDA, 2, why, sizeof why));
    CHECK(!launcher_fits(local, s, DEVICE_CPU, 2, why, sizeof why));
    CHECK_EQ_STR(why, "world_size 2 needs 2 CPU slots but this server has 1");
    CHECK(launcher_fits(slurm, s, DEVICE_CPU, 64, why, sizeof why)); /* Slurm decides */

    sched_enqueue(
        s,
        &(struct sched_job){
            .job = 7, .kind = DEVICE_CPU, .world = 1, .priority = SPEC_PRIORITY_DEFAULT, .preemptible = true},
        0);
    sched_enqueue(
        s,
        &(struct sched_job){
            .job = 8, .kind = DEVICE_CPU, .world = 1, .priority = SPEC_PRIORITY_DEFAULT, .preemptible = true},
        0);
    int64_t job;
    device_kind kind;
    int slots[4], world;
    CHECK(sched_next(s, 0, &job, &kind, slots, &world));
    CHECK(launcher_pending_reason(local, s, 8, why, sizeof why));
    CHECK_EQ_STR(why, "waiting for 1 CPU slot: held by job 7");
    CHECK(!launcher_pending_reason(slurm, s, 8, why, sizeof why));
    CHECK_EQ_STR(why, "");

    /* Slot 1's device was listed by ddpd-worker --devices (an emulated one of compute
     * capability 8.6 that runs the module's sm_80); slot 0's not. */
    struct sched_gpu_info info[2] = {{.known = false},
                                     {.known = true,
                                      .emulated = true,
                                      .memory = 1 << 30,
                                      .name = "ddpd emulated GPU 1",
                                      .uuid = "GPU-x",
                                      .cc = "8.6",
                                      .code = "sm_80"}};
    sched_describe_gpus(s, info);
    /* Slot 1 held by an inference process with job 9's model (sched_take's holder -9). */
    int got = -1;
    CHECK(sched_take(s, DEVICE_CUDA, -9, &got));
    CHECK_EQ_INT(got, 0);
    sched_release_slot(s, DEVICE_CUDA, 0);
    CHECK(sched_take(s, DEVICE_CUDA, -9, &got) && got == 0);
    sched_release_slot(s, DEVICE_CUDA, 0);
    CHECK(sched_take(s, DEVICE_CUDA, -1, &got) && got == 0); /* slot 0 taken first... */
    CHECK(sched_take(s, DEVICE_CUDA, -9, &got) && got == 1); /* ...then slot 1 */
    sched_release_slot(s, DEVICE_CUDA, 0);
    json_t *d = launcher_devices_json(local, s);
    char *t = json_dumps(d, JSON_COMPACT | JSON_SORT_KEYS);
    CHECK_EQ_STR(
        t, "{\"cpu_slots\":[{\"index\":0,\"inference\":null,\"job\":7}],\"gpus\":[{\"code\":null,"
           "\"compute_capability\":null,\"device\":\"5\",\"emulated\":false,\"has_code\":null,\"index\":0,"
           "\"inference\":null,\"job\":null,\"memory\":null,\"name\":null,\"uuid\":null},{\"code\":\"sm_80\","
           "\"compute_capability\":\"8.6\",\"device\":\"GPU-x\",\"emulated\":true,\"has_code\":true,"
           "\"index\":1,\"inference\":9,\"job\":null,\"memory\":1073741824,\"name\":\"ddpd emulated GPU "
           "1\",\"uuid\":\"GPU-x\"}]}");
    sched_release_slot(s, DEVICE_CUDA, 1);
    free(t);
    json_decref(d);
    d = launcher_devices_json(slurm, s);
    t = json_dumps(d, JSON_COMPACT | JSON_SORT_KEYS);
    CHECK_EQ_STR(t, "{\"cpu_slots\":[],\"gpus\":[],\"launcher\":\"slurm\"}");
    free(t);
    json_decref(d);
    launcher_recover_orphans(local, NULL, 0); /* nothing to end */
    sched_free(s);
    launcher_free(local);
    launcher_free(slurm);
    launcher_free(NULL);
}

struct lines {
    int n, rank;
    char last[256];
};

static void on_line(void *ctx, int rank, const char *line, size_t len)
{
    struct lines *l = ctx;
    l->n++;
    l->rank = rank;
    snprintf(l->last, sizeof l->last, "%.*s", (int)len, line);
}

static void test_local_attempt(const char *tmp)
{
    char worker[700], out[700], doc_copy[800];
    snprintf(worker, sizeof worker, "%s/worker.sh", tmp);
    snprintf(out, sizeof out, "%s/job", tmp);
    snprintf(doc_copy, sizeof doc_copy, "%s/doc.json", out);
    FILE *f = fopen(worker, "w");
    CHECK(f != NULL);
    if (!f)
        return;
    /* Keeps its stdin document in the job folder, says one line and fails with 7. */
    fprintf(f, "#!/bin/sh\ncat > '%s'\necho hello\nexit 7\n", doc_copy);
    fclose(f);
    chmod(worker, 0755);

    static const char spec_text[] =
        "{\"model\":[{\"type\":\"linear\",\"in\":4,\"out\":2}],\"loss\":\"mse\","
        "\"optimizer\":{\"type\":\"sgd\",\"lr\":0.1},\"data\":{\"type\":\"synthetic\",\"samples\":10},"
        "\"batch_size\":2,\"epochs\":1}";
    struct jobdoc *doc = calloc(1, sizeof *doc);
    struct ddpd_error err;
    CHECK(doc && spec_parse(spec_text, strlen(spec_text), NULL, &doc->spec, &err) == DDPD_OK);
    if (!doc)
        return;
    doc->job = 3;
    doc->attempt = 1;
    doc->world_size = 1;
    doc->rank = -1;
    snprintf(doc->out_dir, sizeof doc->out_dir, "%s", out);
    struct lines got = {0};
    struct launch_opts lo = {.worker = worker,
                             .world_size = 1,
                             .out_dir = out,
                             .doc = doc,
                             .grace_s = 1,
                             .on_line = on_line,
                             .ctx = &got};
    struct launch *l = launch_start(&lo, &err);
    free(doc);
    CHECK(l != NULL);
    if (!l) {
        fprintf(stderr, "    %s\n", err.message);
        return;
    }
    CHECK(launch_pid(l, 0) > 0);
    CHECK_EQ_INT(launch_pgid(l), launch_pid(l, 0)); /* one rank: no issuer, rank 0 leads */
    bool done = false;
    for (int i = 0; i < 6000 && !done; i++) /* 10 ms polls: at most a minute */
        done = launch_poll(l, 10);
    CHECK(done);
    char why[64];
    CHECK(!launch_waiting(l, why, sizeof why));
    struct launch_result res;
    launch_result(l, &res);
    CHECK(!res.ok);
    CHECK_EQ_INT(res.rank, 0);
    CHECK_EQ_INT(res.exit_code, 7);
    CHECK(strstr(res.message, "rank 0 exited with code 7 without an error event") != NULL);
    CHECK_EQ_INT(launch_exit_code(l, 0), 7);
    CHECK_EQ_INT(got.n, 1);
    CHECK_EQ_INT(got.rank, 0);
    CHECK_EQ_STR(got.last, "hello");
    launch_free(l);

    /* The rank's document: the caller's, with its rank added. */
    json_t *seen = json_load_file(doc_copy, 0, NULL);
    CHECK(seen != NULL);
    CHECK_EQ_INT((int)json_integer_value(json_object_get(seen, "rank")), 0);
    CHECK_EQ_INT((int)json_integer_value(json_object_get(seen, "job")), 3);
    json_decref(seen);
    unlink(doc_copy);
    char log[800];
    snprintf(log, sizeof log, "%s/rank-0.log", out);
    unlink(log);
    snprintf(log, sizeof log, "%s/rank-0.nccl.log", out);
    unlink(log);
    rmdir(out);
    unlink(worker);
}

int main(void)
{
    const char *base = getenv("DDPD_TEST_TMP");
    char tmp[512];
    snprintf(tmp, sizeof tmp, "%s/launch-XXXXXX", base ? base : "/tmp");
    if (base)
        mkdir(base, 0755);
    if (!mkdtemp(tmp)) {
        perror("mkdtemp");
        return 1;
    }
    test_policy();
    test_local_attempt(tmp);
    rmdir(tmp);
    CHECK_DONE();
}
