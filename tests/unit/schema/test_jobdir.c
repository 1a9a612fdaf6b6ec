/* test_jobdir.c — schema/jobdir.c: the layout's names (written out here as the contract
 * spells them) and the newest checkpoint to resume from, checkpoint folder names, pruning to keep_last (the
 * one just written always stays; leftovers of a crash go; a stale newer folder of another run does not evict
 * it), the folder's size and the quota's sentence, the message for a pruned --resume, and the quota's size
 * syntax. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "base/file.h"
#include "schema/jobdir.h"

static char root[2048];

static void put_file(const char *dir, const char *name, size_t bytes)
{
    char p[8192];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    CHECK(fd >= 0);
    char buf[4096] = {0};
    while (bytes > 0) {
        size_t n = bytes < sizeof buf ? bytes : sizeof buf;
        CHECK(write(fd, buf, n) == (ssize_t)n);
        bytes -= n;
    }
    close(fd);
}

/* OUT/<name>/ with a model and an optimizer file of `bytes` each. */
static void put_ckpt(const char *out, const char *name, size_t bytes)
{
    char d[8192];
    snprintf(d, sizeof d, "%s/%s", out, name);
    CHECK(mkdir(d, 0700) == 0);
    put_file(d, "model.safetensors", bytes);
    put_file(d, "optim.safetensors", bytes);
}

static bool exists(const char *out, const char *name)
{
    char p[8192];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s", out, name);
    return lstat(p, &st) == 0;
}

static int count_entries(const char *out)
{
    DIR *d = opendir(out);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    if (d)
        closedir(d);
    return n;
}

static void fresh(char *out, size_t cap, const char *name)
{
    snprintf(out, cap, "%s/%s", root, name);
    CHECK(mkdir(out, 0700) == 0);
}

static void test_ckpt_step(void)
{
    int64_t s = -1;
    CHECK(jobdir_ckpt_step("ckpt-0", &s) && s == 0);
    CHECK(jobdir_ckpt_step("ckpt-40", &s) && s == 40);
    CHECK(jobdir_ckpt_step("ckpt-9223372036854775807", &s) && s == INT64_MAX);
    CHECK(!jobdir_ckpt_step("ckpt-9223372036854775808", &s));
    CHECK(!jobdir_ckpt_step("ckpt-", &s));
    CHECK(!jobdir_ckpt_step("ckpt-7.tmp", &s));
    CHECK(!jobdir_ckpt_step("ckpt-7.del", &s));
    CHECK(!jobdir_ckpt_step("ckpt--7", &s));
    CHECK(!jobdir_ckpt_step("ckpt-+7", &s));
    CHECK(!jobdir_ckpt_step("ckpt- 7", &s));
    CHECK(!jobdir_ckpt_step("model.safetensors", &s));
}

static void test_prune(void)
{
    char out[4400];
    struct ddpd_error e;
    int pruned = -1;

    /* every_steps 1, keep_last 2: after writing ckpt-10, only 9 and 10 stay. */
    fresh(out, sizeof out, "prune");
    for (int i = 1; i <= 10; i++) {
        char n[32];
        snprintf(n, sizeof n, "ckpt-%d", i);
        put_ckpt(out, n, 100);
    }
    put_file(out, "model.safetensors", 10); /* the final model of an earlier run: never touched */
    put_file(out, "rank-0.log", 10);
    CHECK_EQ_INT(jobdir_prune(out, 2, 10, &pruned, &e), DDPD_OK);
    CHECK_EQ_INT(pruned, 8);
    CHECK(exists(out, "ckpt-9") && exists(out, "ckpt-10"));
    CHECK(!exists(out, "ckpt-1") && !exists(out, "ckpt-8") && !exists(out, "ckpt-8.del"));
    CHECK(exists(out, "model.safetensors") && exists(out, "rank-0.log"));
    CHECK_EQ_INT(count_entries(out), 4);
    /* Nothing to do: pruning again is a no-op. */
    CHECK_EQ_INT(jobdir_prune(out, 2, 10, &pruned, &e), DDPD_OK);
    CHECK_EQ_INT(pruned, 0);
    CHECK_EQ_INT(count_entries(out), 4);

    /* keep_last 1 keeps only the one just written; keep_last larger than there are keeps all. */
    put_ckpt(out, "ckpt-11", 1);
    CHECK_EQ_INT(jobdir_prune(out, 5, 11, &pruned, &e), DDPD_OK);
    CHECK_EQ_INT(pruned, 0);
    CHECK_EQ_INT(jobdir_prune(out, 1, 11, &pruned, &e), DDPD_OK);
    CHECK_EQ_INT(pruned, 2);
    CHECK(exists(out, "ckpt-11") && !exists(out, "ckpt-10") && !exists(out, "ckpt-9"));

    /* Leftovers of a crash: a prune cut short (.del, even with a larger step) and a torn
     * write older than the newest go; a .tmp at or after the newest (a write in progress)
     * and names that are not checkpoints stay. Nested folders (per-rank files in a
     * subfolder) go with their checkpoint. */
    put_ckpt(out, "ckpt-3.del", 5);
    put_ckpt(out, "ckpt-99.del", 5);
    put_ckpt(out, "ckpt-7.tmp", 5);
    put_ckpt(out, "ckpt-12.tmp", 5);
    put_ckpt(out, "ckpt-10", 5);
    char sub[8192];
    snprintf(sub, sizeof sub, "%s/ckpt-10/rank-1", out);
    CHECK(mkdir(sub, 0700) == 0);
    put_file(sub, "optim.safetensors", 5);
    put_ckpt(out, "ckpt-x", 5);
    CHECK_EQ_INT(jobdir_prune(out, 1, 11, &pruned, &e), DDPD_OK);
    CHECK_EQ_INT(pruned, 1);
    CHECK(!exists(out, "ckpt-3.del") && !exists(out, "ckpt-99.del") && !exists(out, "ckpt-7.tmp"));
    CHECK(!exists(out, "ckpt-10"));
    CHECK(exists(out, "ckpt-12.tmp") && exists(out, "ckpt-x") && exists(out, "ckpt-11"));

    /* A stale newer folder (another run resumed from an older step into this folder) does
     * not evict the checkpoint just written. */
    put_ckpt(out, "ckpt-50", 5);
    put_ckpt(out, "ckpt-5", 5);
    CHECK_EQ_INT(jobdir_prune(out, 1, 5, &pruned, &e), DDPD_OK);
    CHECK(exists(out, "ckpt-5"));
    CHECK(!exists(out, "ckpt-50") && !exists(out, "ckpt-11"));

    /* A folder that cannot be read is an error naming it. */
    CHECK_EQ_INT(jobdir_prune("/nonexistent/ddpd-jobdir", 2, 1, &pruned, &e), DDPD_EIO);
    CHECK(strstr(e.message, "/nonexistent/ddpd-jobdir") != NULL);
    CHECK_EQ_INT(pruned, 0);
}

static void test_bytes_and_quota(void)
{
    char out[4400], link[8192];
    struct ddpd_error e;
    int64_t b = -1;
    fresh(out, sizeof out, "bytes");
    put_ckpt(out, "ckpt-1", 1000);
    put_file(out, "rank-0.log", 500);
    /* A link is not followed: a link to a large file elsewhere costs nothing here. */
    snprintf(link, sizeof link, "%s/big", out);
    CHECK(symlink("/proc/self/exe", link) == 0);
    CHECK_EQ_INT(jobdir_bytes(out, &b, &e), DDPD_OK);
    CHECK_EQ_INT(b, 2500);

    CHECK_EQ_INT(jobdir_check_quota(out, 0, INT64_MAX, "x", &e), DDPD_OK);              /* no quota */
    CHECK_EQ_INT(jobdir_check_quota(out, 3000, 500, "checkpoint ckpt-2", &e), DDPD_OK); /* exactly full */
    CHECK_EQ_INT(jobdir_check_quota(out, 3000, 501, "checkpoint ckpt-2", &e), DDPD_EIO);
    CHECK(strstr(e.message, "writing checkpoint ckpt-2 (501 bytes) would bring the job folder ") ==
          e.message);
    CHECK(strstr(e.message, " from 2500 to 3001 bytes, over the job disk quota of 3000 bytes "
                            "(ddpd serve --job-disk-quota); nothing was written") != NULL);
    CHECK(strstr(e.message, out) != NULL);
    CHECK_EQ_INT(jobdir_check_quota(out, 3000, INT64_MAX, "the final model", &e), DDPD_EIO);
    CHECK(strstr(e.message, "to 9223372036854775807 bytes") != NULL);
    CHECK_EQ_INT(jobdir_check_quota(out, 2000, 0, "", &e), DDPD_EIO);
    CHECK(strstr(e.message, "holds 2500 bytes, over the job disk quota of 2000 bytes") != NULL);
    CHECK_EQ_INT(jobdir_bytes("/nonexistent/ddpd-jobdir", &b, &e), DDPD_EIO);
    CHECK(strstr(e.message, "/nonexistent/ddpd-jobdir: cannot open the job folder") != NULL);
}

static void test_missing_ckpt(void)
{
    char out[2400], ck[2600];
    struct ddpd_error e;
    fresh(out, sizeof out, "missing");
    for (int i = 1; i <= 6; i++) {
        char n[32];
        snprintf(n, sizeof n, "ckpt-%d", i * 10);
        put_ckpt(out, n, 1);
    }
    put_ckpt(out, "ckpt-70.tmp", 1);
    snprintf(ck, sizeof ck, "%s/ckpt-5", out);
    CHECK_EQ_INT(jobdir_missing_ckpt(ck, &e), DDPD_EDATA);
    char want[32768];
    snprintf(
        want, sizeof want,
        "%s: no such checkpoint (checkpoint.keep_last deletes all but the newest ones); the newest there: "
        "%s/ckpt-60, %s/ckpt-50, %s/ckpt-40, %s/ckpt-30",
        ck, out, out, out, out);
    CHECK_EQ_STR(e.message, want);
    snprintf(ck, sizeof ck, "%s/nothing/ckpt-5/", root);
    CHECK_EQ_INT(jobdir_missing_ckpt(ck, &e), DDPD_EDATA);
    CHECK(strstr(e.message, "there is no complete checkpoint in ") != NULL);
    CHECK_EQ_INT(jobdir_missing_ckpt("ckpt-5", &e), DDPD_EDATA); /* relative: the parent is "." */
    CHECK(strstr(e.message, "ckpt-5: no such checkpoint") == e.message);
}

static void test_size_parse(void)
{
    int64_t b = -1;
    CHECK(jobdir_size_parse("0", &b) && b == 0);
    CHECK(jobdir_size_parse("none", &b) && b == 0);
    CHECK(jobdir_size_parse("NONE", &b) && b == 0);
    CHECK(jobdir_size_parse("1048576", &b) && b == 1048576);
    CHECK(jobdir_size_parse("100B", &b) && b == 100);
    CHECK(jobdir_size_parse("96K", &b) && b == 96 * 1024);
    CHECK(jobdir_size_parse("20k", &b) && b == 20480);
    CHECK(jobdir_size_parse("512MiB", &b) && b == 512LL << 20);
    CHECK(jobdir_size_parse("10G", &b) && b == 10LL << 30);
    CHECK(jobdir_size_parse("3gb", &b) && b == 3LL << 30);
    CHECK(jobdir_size_parse("2T", &b) && b == 2LL << 40);
    CHECK(jobdir_size_parse("8388607T", &b) && b == 8388607LL << 40);
    CHECK(!jobdir_size_parse("8388608T", &b)); /* 2^63: over INT64_MAX */
    CHECK(jobdir_size_parse("9223372036854775807", &b) && b == INT64_MAX);
    CHECK(!jobdir_size_parse("9223372036854775808", &b));
    CHECK(!jobdir_size_parse("99999999999999999999", &b));
    const char *bad[] = {"",    "G",    "-1",   "+1",   " 1",  "1 ",   "1.5G",
                         "10X", "10GG", "10Gi", "10iB", "1e9", "0x10", "none1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        b = 77;
        if (jobdir_size_parse(bad[i], &b))
            CHECK__FAIL("jobdir_size_parse(\"%s\") accepted (%lld)", bad[i], (long long)b);
        CHECK_EQ_INT(b, 77);
    }
    CHECK(!jobdir_size_parse(NULL, &b));
    CHECK_EQ_INT(JOBDIR_DEFAULT_QUOTA, 10LL << 30);
}

/* The names are the contract's (CONTRACT.md, schema/README.md): spelled out here once
 * more on purpose, so that a changed name fails this test. */
static void test_names(void)
{
    char b[64];
    CHECK(jobdir_job_path(b, sizeof b, "/var/jobs", 42));
    CHECK_EQ_STR(b, "/var/jobs/42");
    CHECK(jobdir_ckpt_path(b, sizeof b, "/var/jobs/42", 300));
    CHECK_EQ_STR(b, "/var/jobs/42/ckpt-300");
    int64_t step = 0;
    CHECK(jobdir_ckpt_step(strrchr(b, '/') + 1, &step));
    CHECK_EQ_INT(step, 300);
    CHECK(jobdir_tmp_path(b, sizeof b, "/o/ckpt-3"));
    CHECK_EQ_STR(b, "/o/ckpt-3.tmp");
    CHECK(jobdir_rank_log_path(b, sizeof b, "/o", 3));
    CHECK_EQ_STR(b, "/o/rank-3.log");
    CHECK(jobdir_nccl_log_path(b, sizeof b, "/o", 0));
    CHECK_EQ_STR(b, "/o/rank-0.nccl.log");
    CHECK(jobdir_model_path(b, sizeof b, "/o/ckpt-3"));
    CHECK_EQ_STR(b, "/o/ckpt-3/model.safetensors");
    CHECK(jobdir_rank_file(b, sizeof b, JOBDIR_OPTIM, 0));
    CHECK_EQ_STR(b, "optim.safetensors");
    CHECK(jobdir_rank_file(b, sizeof b, JOBDIR_OPTIM, 2));
    CHECK_EQ_STR(b, "optim-rank-2.safetensors");
    CHECK(jobdir_rank_file(b, sizeof b, JOBDIR_MODEL, 1));
    CHECK_EQ_STR(b, "model-rank-1.safetensors");
    CHECK_EQ_STR(JOBDIR_MODEL_FILE, "model.safetensors");
    CHECK(jobdir_file_path(b, sizeof b, "/o", JOBDIR_SRUN_STDIN));
    CHECK_EQ_STR(b, "/o/srun-stdin.json");
    CHECK_EQ_STR(JOBDIR_SRUN_LOG, "srun.log");
    CHECK_EQ_STR(JOBDIR_ISSUER_LOG, "issuer.log");
    /* A name that does not fit is refused, never silently cut. */
    char small[12];
    CHECK(!jobdir_ckpt_path(small, sizeof small, "/var/jobs/42", 300));
    CHECK(!jobdir_rank_file(small, sizeof small, JOBDIR_OPTIM, 12));
    CHECK(jobdir_job_path(small, sizeof small, "/j", 12345678));
    CHECK(!jobdir_job_path(small, sizeof small, "/j", 123456789));
}

/* The newest complete checkpoint with rank 0's optimizer state; torn or foreign folders
 * never count. */
static void test_latest_ckpt(void)
{
    char out[4096], path[4096];
    fresh(out, sizeof out, "latest");
    CHECK(!jobdir_latest_ckpt(out, path, sizeof path));
    put_ckpt(out, "ckpt-20", 1);
    put_ckpt(out, "ckpt-100", 1);
    put_ckpt(out, "ckpt-300.tmp", 1); /* being written */
    put_ckpt(out, "ckpt-400.del", 1); /* being deleted */
    put_ckpt(out, "ckpt-x", 1);
    char d[8192];
    snprintf(d, sizeof d, "%s/ckpt-200", out); /* no optimizer state: not complete */
    CHECK(mkdir(d, 0700) == 0);
    put_file(d, "model.safetensors", 1);
    CHECK(jobdir_latest_ckpt(out, path, sizeof path));
    char want[8192];
    snprintf(want, sizeof want, "%s/ckpt-100", out);
    CHECK_EQ_STR(path, want);
    CHECK(!jobdir_latest_ckpt(out, path, 8)); /* does not fit */
    snprintf(d, sizeof d, "%s/none", root);
    CHECK(!jobdir_latest_ckpt(d, path, sizeof path));
}

/* Every complete checkpoint, oldest first (numerically, not as names sort). */
static void test_ckpt_list(void)
{
    char out[4096];
    int64_t *steps;
    size_t n;
    fresh(out, sizeof out, "list");
    CHECK(jobdir_ckpt_list(out, &steps, &n));
    CHECK_EQ_INT(n, 0);
    CHECK(steps == NULL);
    put_ckpt(out, "ckpt-100", 1);
    put_ckpt(out, "ckpt-20", 1);
    put_ckpt(out, "ckpt-5", 1);
    put_ckpt(out, "ckpt-300.tmp", 1);
    char d[8192];
    snprintf(d, sizeof d, "%s/ckpt-200", out); /* no optimizer state: not complete */
    CHECK(mkdir(d, 0700) == 0);
    CHECK(jobdir_ckpt_list(out, &steps, &n));
    CHECK_EQ_INT(n, 3);
    if (n == 3) {
        CHECK_EQ_INT(steps[0], 5);
        CHECK_EQ_INT(steps[1], 20);
        CHECK_EQ_INT(steps[2], 100);
    }
    free(steps);
    snprintf(d, sizeof d, "%s/none", root);
    CHECK(jobdir_ckpt_list(d, &steps, &n));
    CHECK_EQ_INT(n, 0);
}

/* Another job's checkpoint linked into a job's folder: the same bytes, the same inode,
 * made whole or not at all, and a second call leaves it as it is. */
static void test_ckpt_link(void)
{
    char a[4096], src[8192], dst[8192], f[8300], g[8300];
    struct ddpd_error err;
    fresh(a, sizeof a, "link");
    put_ckpt(a, "ckpt-10", 1);
    snprintf(src, sizeof src, "%s/ckpt-10", a);
    snprintf(dst, sizeof dst, "%s/other/job/ckpt-10", a);
    CHECK_EQ_INT(jobdir_ckpt_link(src, dst, &err), DDPD_OK);
    snprintf(f, sizeof f, "%s/optim.safetensors", src);
    snprintf(g, sizeof g, "%s/optim.safetensors", dst);
    struct stat s1, s2;
    CHECK(stat(f, &s1) == 0 && stat(g, &s2) == 0);
    CHECK(s1.st_ino == s2.st_ino);
    char listed[8192];
    snprintf(listed, sizeof listed, "%s/other/job", a);
    CHECK(jobdir_latest_ckpt(listed, f, sizeof f));
    CHECK_EQ_STR(f, dst);
    CHECK_EQ_INT(jobdir_ckpt_link(src, dst, &err), DDPD_OK); /* already there */
    /* A checkpoint that is gone or incomplete is a data error naming it, leaving nothing. */
    snprintf(src, sizeof src, "%s/ckpt-99", a);
    snprintf(dst, sizeof dst, "%s/other/job/ckpt-99", a);
    CHECK_EQ_INT(jobdir_ckpt_link(src, dst, &err), DDPD_EDATA);
    CHECK(strstr(err.message, "ckpt-99") != NULL);
    CHECK(stat(dst, &s1) != 0);
    snprintf(f, sizeof f, "%s.tmp", dst);
    CHECK(stat(f, &s1) != 0);
}

int main(void)
{
    const char *tmp = getenv("DDPD_TEST_TMP");
    char base[1024];
    snprintf(base, sizeof base, "%.1000s", tmp && *tmp ? tmp : "/tmp");
    mkdir(base, 0700);
    snprintf(root, sizeof root, "%s/jobdir-XXXXXX", base);
    if (!mkdtemp(root)) {
        fprintf(stderr, "mkdtemp %s: %s\n", root, strerror(errno));
        return 1;
    }
    test_names();
    test_latest_ckpt();
    test_ckpt_list();
    test_ckpt_link();
    test_ckpt_step();
    test_prune();
    test_bytes_and_quota();
    test_missing_ckpt();
    test_size_parse();
    /* The folder stays for a look when something failed. */
    if (!check__failures)
        base_remove_tree(root);
    CHECK_DONE();
}
