/* test_server_slurm.c — the Slurm backend without Slurm: srun's argv (each option one
 * element, nothing split or quoted; a job's --nice, --time and --signal), the parsers of srun's labelled
 * output and task exits, and whole attempts against fake srun/squeue/scancel programs that print what the
 * real ones print (pieces of 1024 bytes, interleaved ranks, "task 1: Killed"). */
#include "check.h"
#include "server/launch.h"
#include "server/launch_slurm.h"
#include "schema/jobdoc.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static char tmp[512];

static void write_file(const char *name, const char *text, mode_t mode)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", tmp, name);
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "cannot write %s: %s\n", path, strerror(errno));
        exit(1);
    }
    fputs(text, f);
    fclose(f);
    chmod(path, mode);
}

static char *read_file(const char *name)
{
    static char buf[65536];
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", tmp, name);
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f)
        fclose(f);
    buf[n] = '\0';
    return buf;
}

static void test_argv(void)
{
    struct slurm_opts o = {.partition = "gpu a100",
                           .account = "proj;rm -rf /",
                           .time_limit = "1-00:00",
                           .n_extra = 2,
                           .cpus_per_task = 3};
    o.extra[0] = "--constraint=a100&ib";
    o.extra[1] = "--comment=it's \"quoted\" $HOME";
    struct slurm_argv a;
    struct ddpd_error err;
    CHECK_EQ_INT(slurm_srun_argv(&o, "ddpd.x.7.2", 4, false, NULL, "/opt/ddpd/ddpd-worker", &a, &err),
                 DDPD_OK);
    const char *want[] = {"srun",
                          "--job-name=ddpd.x.7.2",
                          "--ntasks=4",
                          "--cpus-per-task=3",
                          "--kill-on-bad-exit=1",
                          "--input=all",
                          "--label",
                          "--partition=gpu a100",
                          "--account=proj;rm -rf /",
                          "--time=1-00:00",
                          "--constraint=a100&ib",
                          "--comment=it's \"quoted\" $HOME",
                          "/opt/ddpd/ddpd-worker"};
    CHECK_EQ_INT(a.argc, 13);
    for (int i = 0; i < 13 && i < a.argc; i++)
        CHECK_EQ_STR(a.argv[i], want[i]);
    CHECK(a.argv[a.argc] == NULL);

    /* cuda: one GPU per task, no CPU count; unset options are left out. */
    struct slurm_opts g = {0};
    CHECK_EQ_INT(slurm_srun_argv(&g, "n", 2, true, NULL, "/w", &a, &err), DDPD_OK);
    const char *want_g[] = {
        "srun",        "--job-name=n", "--ntasks=2", "--gpus-per-task=1", "--kill-on-bad-exit=1",
        "--input=all", "--label",      "/w"};
    CHECK_EQ_INT(a.argc, 8);
    for (int i = 0; i < 8 && i < a.argc; i++)
        CHECK_EQ_STR(a.argv[i], want_g[i]);

    /* Too long for the buffer: an error naming the options, not a truncated argv. */
    static char huge[9000];
    memset(huge, 'x', sizeof huge - 1);
    struct slurm_opts h = {.n_extra = 1};
    h.extra[0] = huge;
    CHECK_EQ_INT(slurm_srun_argv(&h, "n", 2, false, NULL, "/w", &a, &err), DDPD_ETOOBIG);
    CHECK(strstr(err.message, "--slurm-arg") != NULL);

    char name[64];
    struct slurm_opts p = {.name_prefix = "ddpd.0badcafe."};
    slurm_job_name(&p, 42, 3, name, sizeof name);
    CHECK_EQ_STR(name, "ddpd.0badcafe.42.3");
}

static void test_job_argv(void)
{
    /* A job's priority, time limit and preemption grace (issue 32): --time in minutes
     * rounded up over the server's --slurm-time, --nice = (100 - priority) * 10, the
     * signal's seconds rounded up. */
    struct slurm_opts o = {.time_limit = "1-00:00"};
    struct slurm_job job = {.priority = 70, .time_limit_s = 90, .signal_grace_s = 30.5};
    struct slurm_argv a;
    struct ddpd_error err;
    CHECK_EQ_INT(slurm_srun_argv(&o, "n", 2, false, &job, "/w", &a, &err), DDPD_OK);
    const char *want[] = {
        "srun",        "--job-name=n", "--ntasks=2", "--cpus-per-task=1", "--kill-on-bad-exit=1",
        "--input=all", "--label",      "--time=2",   "--nice=300",        "--signal=USR1@31",
        "/w"};
    CHECK_EQ_INT(a.argc, 11);
    for (int i = 0; i < 11 && i < a.argc; i++)
        CHECK_EQ_STR(a.argv[i], want[i]);
    /* No time limit: the server's; no grace: no --signal. */
    job = (struct slurm_job){.priority = 50};
    CHECK_EQ_INT(slurm_srun_argv(&o, "n", 2, false, &job, "/w", &a, &err), DDPD_OK);
    CHECK_EQ_STR(a.argv[7], "--time=1-00:00");
    CHECK_EQ_STR(a.argv[8], "--nice=500");
    CHECK_EQ_STR(a.argv[9], "/w");
    /* A grace past Slurm's 65535 s is clamped; a time limit under a minute is 1. */
    job = (struct slurm_job){.priority = 100, .time_limit_s = 0.5, .signal_grace_s = 1e9};
    CHECK_EQ_INT(slurm_srun_argv(&o, "n", 2, false, &job, "/w", &a, &err), DDPD_OK);
    CHECK_EQ_STR(a.argv[7], "--time=1");
    CHECK_EQ_STR(a.argv[8], "--nice=0");
    CHECK_EQ_STR(a.argv[9], "--signal=USR1@65535");
    /* The mapping: never negative, 0 -> 1000. */
    CHECK_EQ_INT(slurm_nice(100), 0);
    CHECK_EQ_INT(slurm_nice(50), 500);
    CHECK_EQ_INT(slurm_nice(0), 1000);
    CHECK_EQ_INT(slurm_nice(-3), 1000);
    CHECK_EQ_INT(slurm_nice(200), 0);
}

static void test_parsers(void)
{
    const char *p;
    size_t n;
    CHECK_EQ_INT(slurm_parse_label("0: {\"a\":1}", 10, &p, &n), 0);
    CHECK_EQ_INT(n, 7);
    CHECK(memcmp(p, "{\"a\":1}", 7) == 0);
    CHECK_EQ_INT(slurm_parse_label(" 7: x", 5, &p, &n), 7);
    CHECK_EQ_INT(n, 1);
    CHECK_EQ_INT(slurm_parse_label("12: ", 4, &p, &n), 12);
    CHECK_EQ_INT(n, 0);
    CHECK_EQ_INT(slurm_parse_label("srun: error: x", 14, &p, &n), -1);
    CHECK_EQ_INT(slurm_parse_label(": x", 3, &p, &n), -1);
    CHECK_EQ_INT(slurm_parse_label("3:x", 3, &p, &n), -1);

    int codes[6];
    for (int i = 0; i < 6; i++)
        codes[i] = -1;
    CHECK_EQ_INT(slurm_parse_task_exit("srun: error: node7: task 1: Killed", 6, codes), 1);
    CHECK_EQ_INT(codes[1], 128 + SIGKILL);
    CHECK_EQ_INT(slurm_parse_task_exit("srun: error: node7: tasks 0,2-3: Terminated", 6, codes), 3);
    CHECK(codes[0] == 128 + SIGTERM && codes[2] == 128 + SIGTERM && codes[3] == 128 + SIGTERM);
    CHECK_EQ_INT(slurm_parse_task_exit("srun: error: n: task 4: Exited with exit code 3", 6, codes), 1);
    CHECK_EQ_INT(codes[4], 3);
    CHECK_EQ_INT(slurm_parse_task_exit("srun: error: n: task 5: Segmentation fault (core dumped)", 6, codes),
                 1);
    CHECK_EQ_INT(codes[5], 128 + SIGSEGV);
    /* Ranks beyond the world are ignored; other lines are not task exits. */
    CHECK_EQ_INT(slurm_parse_task_exit("srun: error: n: tasks 5-9: Killed", 6, codes), 1);
    CHECK_EQ_INT(
        slurm_parse_task_exit("srun: error: Unable to allocate resources: Invalid account", 6, codes), 0);
    CHECK_EQ_INT(slurm_parse_task_exit("srun: job 12 queued and waiting for resources", 6, codes), 0);
    CHECK_EQ_INT(slurm_parse_task_exit("srun: error: n: task 1: Frobnicated", 6, codes), 0);
}

/* ---- whole attempts against fake Slurm programs ---- */

struct lines {
    int n;
    int rank[64];
    char text[64][3000];
};

static void on_line(void *ctx, int rank, const char *line, size_t len)
{
    struct lines *l = ctx;
    if (l->n < 64) {
        l->rank[l->n] = rank;
        snprintf(l->text[l->n], sizeof l->text[l->n], "%.*s", (int)len, line);
        l->n++;
    }
}

static bool run_to_end(struct slurm_run *r, double timeout_s)
{
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        if (slurm_run_poll(r, 50))
            return true;
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((double)(t.tv_sec - t0.tv_sec) > timeout_s)
            return false;
    }
}

static void test_attempt_output(void)
{
    /* What srun prints for: rank 0 an event of 1500 bytes (two pieces: 1024 + 476), rank 1
     * a line of exactly 1024 bytes (a full piece and an empty one), rank 2 a short event;
     * pieces interleaved across ranks. Then rank 1 is killed, 0 and 2 terminated. */
    static char out[8192], err_text[2048], big[1600], exact[1100], script[4000];
    char msg[1400];
    memset(msg, 'm', 1400 - 40);
    msg[1400 - 40] = '\0';
    snprintf(big, sizeof big,
             "{\"event\":\"error\",\"rank\":0,\"kind\":\"comm\",\"message\":\"%s\",\"ts\":1}", msg);
    size_t blen = strlen(big);
    memset(exact, 'e', 1024);
    exact[1024] = '\0';
    snprintf(out, sizeof out, "0: %.1024s\n1: %s\n2: {\"event\":\"start\",\"rank\":2}\n1: \n0: %s\n", big,
             exact, big + 1024);
    snprintf(err_text, sizeof err_text,
             "0: [rank 0] hello\n1: [rank 1] world\n"
             "srun: error: node7: task 1: Killed\n"
             "0: slurmstepd: error: *** STEP 9.0 ON node7 CANCELLED AT 2026-01-01T00:00:00 ***\n"
             "srun: error: node7: tasks 0,2: Terminated\n");
    write_file("out.txt", out, 0644);
    write_file("err.txt", err_text, 0644);
    snprintf(script, sizeof script,
             "#!/bin/sh\nprintf '%%s\\n' \"$@\" > %s/argv.txt\ncat > %s/stdin.txt\ncat %s/out.txt\n"
             "cat %s/err.txt >&2\nexit 137\n",
             tmp, tmp, tmp, tmp);
    write_file("srun", script, 0755);

    char srun[1200], outdir[1200];
    snprintf(srun, sizeof srun, "%s/srun", tmp);
    snprintf(outdir, sizeof outdir, "%s/job1", tmp);
    mkdir(outdir, 0755);
    struct slurm_opts so = {.srun = srun, .squeue = "/bin/false", .scancel = "/bin/false", .n_extra = 1};
    so.extra[0] = "--comment=a b";
    struct lines got = {0};
    struct launch_opts lo = {.worker = "/opt/ddpd-worker",
                             .world_size = 3,
                             .out_dir = outdir,
                             .grace_s = 1,
                             .on_line = on_line,
                             .ctx = &got};
    struct ddpd_error err;
    struct slurm_run *r = slurm_run_start(&so, "ddpd.t.1.1", &lo, "{\"job\":1}", 0, &err);
    CHECK(r != NULL);
    if (!r) {
        fprintf(stderr, "%s\n", err.message);
        return;
    }
    CHECK(run_to_end(r, 20));
    CHECK_EQ_INT(got.n, 3);
    if (got.n == 3) {
        CHECK_EQ_INT(got.rank[0], 2);
        CHECK_EQ_INT(got.rank[1], 1);
        CHECK_EQ_STR(got.text[1], exact);
        CHECK_EQ_INT(got.rank[2], 0);
        CHECK_EQ_INT(strlen(got.text[2]), blen);
        CHECK_EQ_STR(got.text[2], big);
    }
    /* stdin is the document, every argument arrived as one. */
    CHECK_EQ_STR(read_file("stdin.txt"), "{\"job\":1}");
    CHECK(strstr(read_file("argv.txt"), "\n--comment=a b\n/opt/ddpd-worker\n") != NULL);
    CHECK(strstr(read_file("argv.txt"), "--job-name=ddpd.t.1.1\n--ntasks=3\n--cpus-per-task=1\n") != NULL);
    CHECK_EQ_STR(read_file("job1/rank-1.log"), "[rank 1] world\n");
    CHECK(strstr(read_file("job1/rank-0.log"), "[rank 0] hello\nslurmstepd: error: *** STEP 9.0") != NULL);
    CHECK(strstr(read_file("job1/srun.log"), "task 1: Killed") != NULL);

    struct launch_result res;
    slurm_run_result(r, &res);
    CHECK(!res.ok);
    CHECK_EQ_INT(res.rank, 1); /* killed outranks the ranks Slurm terminated after it */
    CHECK_EQ_INT(res.exit_code, 137);
    CHECK(strstr(res.message, "rank 1 was killed by signal 9") != NULL);
    CHECK_EQ_INT(slurm_run_exit_code(r, 0), 143);
    CHECK_EQ_INT(slurm_run_exit_code(r, 1), 137);
    slurm_run_free(r);
}

static void test_attempt_pending_cancel(void)
{
    /* srun waits in the queue until scancel; squeue says why. */
    char script[3000];
    snprintf(script, sizeof script,
             "#!/bin/sh\necho 'srun: job 77 queued and waiting for resources' >&2\n"
             "i=0; while [ ! -e %s/cancelled ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done\n"
             "echo 'srun: Job has been cancelled' >&2\nexit 1\n",
             tmp);
    write_file("srun2", script, 0755);
    snprintf(script, sizeof script, "#!/bin/sh\necho '77|PENDING|Resources'\n");
    write_file("squeue", script, 0755);
    snprintf(script, sizeof script,
             "#!/bin/sh\nprintf '%%s\\n' \"$@\" > %s/scancel-args\ntouch %s/cancelled\n", tmp, tmp);
    write_file("scancel", script, 0755);
    char srun[1200], squeue[1200], scancel[1200], outdir[1200];
    snprintf(srun, sizeof srun, "%s/srun2", tmp);
    snprintf(squeue, sizeof squeue, "%s/squeue", tmp);
    snprintf(scancel, sizeof scancel, "%s/scancel", tmp);
    snprintf(outdir, sizeof outdir, "%s/job2", tmp);
    struct slurm_opts so = {.srun = srun, .squeue = squeue, .scancel = scancel, .poll_s = 0.1};
    struct lines got = {0};
    struct launch_opts lo = {
        .worker = "/w", .world_size = 2, .out_dir = outdir, .grace_s = 1, .on_line = on_line, .ctx = &got};
    mkdir(outdir, 0755);
    struct ddpd_error err;
    struct slurm_run *r = slurm_run_start(&so, "ddpd.t.2.1", &lo, "{}", 0, &err);
    CHECK(r != NULL);
    if (!r)
        return;
    char why[256] = "";
    for (int i = 0; i < 100; i++) {
        slurm_run_poll(r, 20);
        if (slurm_run_waiting(r, why, sizeof why) && strstr(why, "Resources"))
            break;
    }
    CHECK_EQ_STR(why, "Slurm job 77 (ddpd.t.2.1) is pending: Resources");
    slurm_run_cancel(r);
    CHECK(run_to_end(r, 20));
    CHECK_EQ_STR(read_file("scancel-args"), "77\n");
    CHECK_EQ_INT(slurm_run_exit_code(r, 0), -1);
    struct launch_result res;
    slurm_run_result(r, &res);
    CHECK(!res.ok);
    CHECK_EQ_INT(res.rank, -1);
    slurm_run_free(r);

    /* srun that cannot be found: an error naming the Slurm job, no process. */
    so.srun = "/nonexistent/srun";
    CHECK(slurm_run_start(&so, "ddpd.t.2.1", &lo, "{}", 0, &err) == NULL);
    CHECK(strstr(err.message, "ddpd.t.2.1") != NULL);
}

static void test_node_failure_with_exit_0(void)
{
    /* After a node failure srun says so and may still exit 0: the job failed. */
    char script[2000], srun[1200], outdir[1200];
    snprintf(script, sizeof script, "#!/bin/sh\necho 'srun: error: Node failure on n3' >&2\nexit 0\n");
    write_file("srun3", script, 0755);
    snprintf(srun, sizeof srun, "%s/srun3", tmp);
    snprintf(outdir, sizeof outdir, "%s/job3", tmp);
    mkdir(outdir, 0755);
    struct slurm_opts so = {.srun = srun, .squeue = "/bin/false", .scancel = "/bin/false"};
    struct launch_opts lo = {.worker = "/w", .world_size = 2, .out_dir = outdir, .grace_s = 1};
    struct ddpd_error err;
    struct slurm_run *r = slurm_run_start(&so, "ddpd.t.3.1", &lo, "{}", 0, &err);
    CHECK(r != NULL);
    if (!r)
        return;
    CHECK(run_to_end(r, 20));
    struct launch_result res;
    slurm_run_result(r, &res);
    CHECK(!res.ok);
    CHECK_EQ_INT(res.rank, -1);
    CHECK(strstr(res.message, "Slurm ended job ddpd.t.3.1") != NULL);
    CHECK(strstr(res.message, "Node failure on n3") != NULL);
    CHECK_EQ_INT(slurm_run_exit_code(r, 0), -1);
    slurm_run_free(r);
}

static void test_attempt_preempt(void)
{
    /* A preemption: srun gets SIGUSR1 once Slurm has allocated the job, and (as the real
     * srun forwards it and the ranks checkpoint and end with 6) says the tasks exited 6;
     * the attempt is preempted, not failed, and blames no rank. The job document's spec
     * gives srun its --nice and --signal (the server's default grace). */
    char script[3000], srun[1200], outdir[1200];
    snprintf(script, sizeof script,
             "#!/bin/sh\nprintf '%%s\\n' \"$@\" > %s/argv-p.txt\n"
             "trap 'echo \"0: {\\\"event\\\":\\\"checkpoint\\\",\\\"rank\\\":0,\\\"step\\\":3}\"; "
             "echo \"srun: error: n1: tasks 0-1: Exited with exit code 6\" >&2; exit 6' USR1\n"
             "echo 'srun: job 5 has been allocated resources' >&2\n"
             "i=0; while [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done\nexit 1\n",
             tmp);
    write_file("srun4", script, 0755);
    snprintf(srun, sizeof srun, "%s/srun4", tmp);
    snprintf(outdir, sizeof outdir, "%s/job4", tmp);
    mkdir(outdir, 0755);
    struct jobdoc *doc = calloc(1, sizeof *doc);
    if (!doc)
        return;
    doc->spec.priority = 20;
    struct slurm_opts so = {.srun = srun, .squeue = "/bin/false", .scancel = "/bin/false"};
    struct lines got = {0};
    struct launch_opts lo = {.worker = "/w",
                             .world_size = 2,
                             .out_dir = outdir,
                             .grace_s = 1,
                             .preempt_grace_s = 45,
                             .doc = doc,
                             .on_line = on_line,
                             .ctx = &got};
    struct ddpd_error err;
    struct slurm_run *r = slurm_run_start(&so, "ddpd.t.4.1", &lo, "{}", 0, &err);
    free(doc);
    CHECK(r != NULL);
    if (!r)
        return;
    /* Asked before the allocation is seen: sent once it is. */
    slurm_run_preempt(r);
    CHECK(run_to_end(r, 20));
    CHECK(strstr(read_file("argv-p.txt"), "\n--nice=800\n--signal=USR1@45\n/w\n") != NULL);
    CHECK_EQ_INT(got.n, 1);
    struct launch_result res;
    slurm_run_result(r, &res);
    CHECK(!res.ok);
    CHECK(res.preempted);
    CHECK_EQ_INT(res.rank, -1);
    CHECK_EQ_INT(res.exit_code, RANK_EXIT_PREEMPTED);
    CHECK(strstr(res.message, "preempted") != NULL);
    CHECK_EQ_INT(slurm_run_exit_code(r, 1), 6);
    slurm_run_free(r);
}

/* Slurm's --time formats, for telling its time limit from a preemption. */
static void test_time_s(void)
{
    CHECK(slurm_time_s("1") == 60);
    CHECK(slurm_time_s("90:30") == 5430);
    CHECK(slurm_time_s("2:00:00") == 7200);
    CHECK(slurm_time_s("1-2") == 93600);
    CHECK(slurm_time_s("1-0:30") == 88200);
    CHECK(slurm_time_s("1-0:0:5") == 86405);
    CHECK(slurm_time_s("UNLIMITED") == 0);
    CHECK(slurm_time_s("") == 0 && slurm_time_s(NULL) == 0);
    CHECK(slurm_time_s("5x") == 0);
}

int main(void)
{
    test_time_s();
    const char *base = getenv("DDPD_TEST_TMP");
    snprintf(tmp, sizeof tmp, "%s/slurm-XXXXXX", base ? base : "/tmp");
    if (base)
        mkdir(base, 0755);
    if (!mkdtemp(tmp)) {
        fprintf(stderr, "mkdtemp %s: %s\n", tmp, strerror(errno));
        return 1;
    }
    test_argv();
    test_job_argv();
    test_parsers();
    test_attempt_output();
    test_attempt_pending_cancel();
    test_node_failure_with_exit_0();
    test_attempt_preempt();
    CHECK_DONE();
}
