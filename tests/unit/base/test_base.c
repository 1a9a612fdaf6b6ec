/* test_base.c — the base library (base/): ASSERT ends the process naming file and line;
 * ALWAYS/NEVER as release builds compile them (they are x; debug builds abort instead);
 * the xmalloc family; the clocks; mkdir -p, whole writes and rm -r; whole-string number
 * parsing. */
#undef DDPD_DEBUG /* ALWAYS/NEVER in release mode, whatever this build is */
#include "check.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/check.h"
#include "base/clock.h"
#include "base/file.h"
#include "base/parse.h"

static int evaluated;
static int touch(int v)
{
    evaluated++;
    return v;
}

static void test_always_never_release(void)
{
    evaluated = 0;
    CHECK(ALWAYS(touch(1)));
    CHECK(!ALWAYS(touch(0))); /* wrong, and the caller survives with the value */
    CHECK(NEVER(touch(5)));   /* wrong: true comes back */
    CHECK(!NEVER(touch(0)));
    CHECK_EQ_INT(evaluated, 4); /* each once */
    int handled = 0;
    char *p = NULL;
    if (NEVER(p == NULL))
        handled = 1;
    CHECK_EQ_INT(handled, 1);
}

/* ASSERT in a child: a true one passes, a false one aborts with file:line and the text. */
static void test_assert_aborts(void)
{
    int fd[2];
    CHECK(pipe(fd) == 0);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd[1], 2);
        close(fd[0]);
        ASSERT(1 + 1 == 2);
        int line = __LINE__ + 1;
        ASSERT(touch(2) == 3);
        fprintf(stderr, "survived %d\n", line);
        _exit(0);
    }
    close(fd[1]);
    char buf[512] = {0};
    size_t n = 0;
    ssize_t r;
    while (n < sizeof buf - 1 && (r = read(fd[0], buf + n, sizeof buf - 1 - n)) > 0)
        n += (size_t)r;
    close(fd[0]);
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
    CHECK(strstr(buf, "test_base.c:") != NULL);
    CHECK(strstr(buf, ": assertion failed: touch(2) == 3") != NULL);
    CHECK(strstr(buf, "survived") == NULL);
}

static void test_alloc(void)
{
    char *p = xmalloc(0); /* zero is one byte, never NULL */
    CHECK(p != NULL);
    free(p);
    int *z = xcalloc(16, sizeof *z);
    for (int i = 0; i < 16; i++)
        CHECK_EQ_INT(z[i], 0);
    z = xrealloc(z, 1024 * sizeof *z);
    z[1023] = 7;
    CHECK_EQ_INT(z[0] + z[1023], 7);
    free(z);
    char *s = xstrdup("ddpd");
    CHECK_EQ_STR(s, "ddpd");
    free(s);
}

static void test_clock(void)
{
    double m0 = base_mono_s();
    int64_t ms0 = base_mono_ms(), us0 = base_mono_us();
    base_sleep_s(0.02);
    base_sleep_s(-1); /* returns at once */
    double m1 = base_mono_s();
    int64_t ms1 = base_mono_ms(), us1 = base_mono_us();
    CHECK(m1 - m0 >= 0.015); /* at least the sleep (nanosleep never ends early unless a signal) */
    CHECK(ms1 - ms0 >= 15);
    CHECK(us1 - us0 >= 15000);
    /* The three units read the same clock. */
    CHECK(llabs(base_mono_ms() - (int64_t)(base_mono_s() * 1000)) < 1000);
    CHECK(llabs(base_mono_us() / 1000 - base_mono_ms()) < 1000);
    /* Wall clock: seconds since the epoch, after 2020. */
    CHECK(base_wall_s() > 1577836800.0);

    struct timespec now, t;
    clock_gettime(CLOCK_REALTIME, &now);
    t = base_timespec_after(CLOCK_REALTIME, 2.75);
    CHECK(t.tv_nsec >= 0 && t.tv_nsec < 1000000000L);
    double d = (double)(t.tv_sec - now.tv_sec) + (double)(t.tv_nsec - now.tv_nsec) * 1e-9;
    CHECK(d >= 2.7 && d < 60);
    clock_gettime(CLOCK_MONOTONIC, &now);
    t = base_timespec_after(CLOCK_MONOTONIC, -3); /* the past is now */
    d = (double)(t.tv_sec - now.tv_sec) + (double)(t.tv_nsec - now.tv_nsec) * 1e-9;
    CHECK(d >= 0 && d < 60);
    t = base_timespec_after(CLOCK_MONOTONIC, 1e300); /* capped, no overflow */
    CHECK(t.tv_sec > now.tv_sec && t.tv_nsec >= 0 && t.tv_nsec < 1000000000L);
}

/* A condvar on the monotonic clock times out at a monotonic deadline. */
static void test_cond_mono(void)
{
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cv;
    CHECK_EQ_INT(base_cond_init_mono(&cv), 0);
    pthread_mutex_lock(&mu);
    double t0 = base_mono_s();
    struct timespec until = base_timespec_after(CLOCK_MONOTONIC, 0.05);
    int rc = 0;
    while (rc == 0) /* a spurious wakeup waits again */
        rc = pthread_cond_timedwait(&cv, &mu, &until);
    pthread_mutex_unlock(&mu);
    CHECK_EQ_INT(rc, ETIMEDOUT);
    CHECK(base_mono_s() - t0 >= 0.04);
    pthread_cond_destroy(&cv);
}

static void test_mkdirs(void)
{
    const char *tmp = getenv("DDPD_TEST_TMP");
    char base[PATH_MAX], path[PATH_MAX + 64];
    if (tmp && *tmp)
        CHECK_EQ_INT(base_mkdirs(tmp, true), 0);
    snprintf(base, sizeof base, "%s/base-mkdirs-%d", tmp && *tmp ? tmp : "/tmp", (int)getpid());
    snprintf(path, sizeof path, "%s/a/b/c", base);
    CHECK_EQ_INT(base_mkdirs(path, false), 0); /* the parents only */
    struct stat st;
    char parent[PATH_MAX + 64];
    snprintf(parent, sizeof parent, "%s/a/b", base);
    CHECK(stat(parent, &st) == 0 && S_ISDIR(st.st_mode));
    CHECK_EQ_INT((int)(st.st_mode & 0777), 0700);
    CHECK(stat(path, &st) != 0);
    CHECK_EQ_INT(base_mkdirs(path, true), 0);
    CHECK(stat(path, &st) == 0 && S_ISDIR(st.st_mode));
    CHECK_EQ_INT(base_mkdirs(path, true), 0); /* already there */

    char file[PATH_MAX + 64], under[PATH_MAX + 96];
    snprintf(file, sizeof file, "%s/a/file", base);
    FILE *f = fopen(file, "w");
    CHECK(f != NULL);
    if (f)
        fclose(f);
    snprintf(under, sizeof under, "%s/x/y", file);
    CHECK_EQ_INT(base_mkdirs(under, true), ENOTDIR);
    CHECK_EQ_INT(base_mkdirs("", true), ENOENT);

    char *longp = xmalloc(PATH_MAX + 10);
    memset(longp, 'a', PATH_MAX + 9);
    longp[0] = '/';
    longp[PATH_MAX + 9] = '\0';
    CHECK_EQ_INT(base_mkdirs(longp, true), ENAMETOOLONG);
    free(longp);
}

static void test_write_all(void)
{
    int fd[2];
    CHECK(pipe(fd) == 0);
    char msg[3000];
    for (size_t i = 0; i < sizeof msg; i++)
        msg[i] = (char)('a' + i % 26);
    CHECK_EQ_INT(base_write_all(fd[1], msg, sizeof msg), 0);
    close(fd[1]);
    char got[4096];
    size_t n = 0;
    ssize_t r;
    while ((r = read(fd[0], got + n, sizeof got - n)) > 0)
        n += (size_t)r;
    close(fd[0]);
    CHECK_EQ_INT((int)n, (int)sizeof msg);
    CHECK(memcmp(got, msg, sizeof msg) == 0);
    CHECK_EQ_INT(base_write_all(-1, msg, 1), -1);
    CHECK_EQ_INT(errno, EBADF);
}

static void test_parse(void)
{
    long v = -99;
    CHECK_EQ_INT(base_parse_long("42", 1, 100, &v), 0);
    CHECK_EQ_INT((int)v, 42);
    CHECK_EQ_INT(base_parse_long("-5", -10, 10, &v), 0);
    CHECK_EQ_INT((int)v, -5);
    CHECK_EQ_INT(base_parse_long("1", 1, 1, &v), 0); /* bounds are inclusive */
    v = 7;
    CHECK_EQ_INT(base_parse_long("0", 1, 100, &v), -1);   /* below */
    CHECK_EQ_INT(base_parse_long("101", 1, 100, &v), -1); /* above */
    CHECK_EQ_INT(base_parse_long("", 1, 100, &v), -1);
    CHECK_EQ_INT(base_parse_long("12x", 1, 100, &v), -1);
    CHECK_EQ_INT(base_parse_long("x12", 1, 100, &v), -1);
    CHECK_EQ_INT(base_parse_long("1 ", 1, 100, &v), -1);
    CHECK_EQ_INT(base_parse_long("99999999999999999999999", 0, LONG_MAX, &v), -1); /* ERANGE */
    CHECK_EQ_INT(base_parse_long(NULL, 0, 1, &v), -1);
    CHECK_EQ_INT((int)v, 7); /* untouched by every failure */

    int64_t w = -1;
    CHECK_EQ_INT(base_parse_i64("9223372036854775807", 0, INT64_MAX, &w), 0);
    CHECK(w == INT64_MAX);
    CHECK_EQ_INT(base_parse_i64("-9223372036854775808", INT64_MIN, 0, &w), 0);
    CHECK(w == INT64_MIN);
    w = 3;
    CHECK_EQ_INT(base_parse_i64("9223372036854775808", 0, INT64_MAX, &w), -1); /* ERANGE */
    CHECK_EQ_INT(base_parse_i64("-1", 0, INT64_MAX, &w), -1);
    CHECK_EQ_INT(base_parse_i64("7.0", 0, 10, &w), -1);
    CHECK_EQ_INT(base_parse_i64("", 0, 10, &w), -1);
    CHECK(w == 3);
}

static void test_remove_tree(void)
{
    const char *tmp = getenv("DDPD_TEST_TMP");
    char base[PATH_MAX], p[PATH_MAX + 128], outside[PATH_MAX + 64], link[PATH_MAX + 64];
    snprintf(base, sizeof base, "%s/base-rmtree-%d", tmp && *tmp ? tmp : "/tmp", (int)getpid());
    snprintf(outside, sizeof outside, "%s-outside", base);
    CHECK_EQ_INT(base_mkdirs(outside, true), 0);
    snprintf(p, sizeof p, "%s/a/b", base);
    CHECK_EQ_INT(base_mkdirs(p, true), 0);
    snprintf(p, sizeof p, "%s/a/b/f", base);
    FILE *f = fopen(p, "w");
    CHECK(f != NULL);
    if (f)
        fclose(f);
    snprintf(p, sizeof p, "%s/keep", outside);
    f = fopen(p, "w");
    CHECK(f != NULL);
    if (f)
        fclose(f);
    snprintf(link, sizeof link, "%s/a/out", base);
    CHECK(symlink(outside, link) == 0);
    base_remove_tree(base);
    struct stat st;
    CHECK(lstat(base, &st) != 0 && errno == ENOENT);
    CHECK(stat(p, &st) == 0); /* the link was removed, not followed */
    base_remove_tree(outside);
    CHECK(lstat(outside, &st) != 0);
    base_remove_tree(outside); /* gone: nothing to do */
}

int main(void)
{
    test_always_never_release();
    test_assert_aborts();
    test_alloc();
    test_clock();
    test_cond_mono();
    test_mkdirs();
    test_write_all();
    test_parse();
    test_remove_tree();
    CHECK_DONE();
}
