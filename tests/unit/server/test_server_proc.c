/* test_server_proc.c — server/proc.c: how every child of the server starts (proc_spawn:
 * only descriptors 0-2 cross, even one numbered past 1,024; /dev/null, the server's own
 * stderr, an empty environment, signals unblocked (SIGTERM held where asked), its own
 * process group, a failed exec said and exit 127). The children are coreutils programs:
 * the test may use them; the server runs none. (mkdir -p moved to base/: test_base.c.) */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "server/proc.h"

/* Runs `o` with its stdout (and stderr, when err is not NULL) into buffers; its exit
 * status, or -1. */
static int run(struct proc_spawn *o, char *out, size_t cap, char *err, size_t ecap)
{
    int p[2], e[2] = {-1, -1};
    if (pipe2(p, O_CLOEXEC) != 0 || (err && pipe2(e, O_CLOEXEC) != 0))
        return -1;
    o->fd[1] = p[1];
    if (err)
        o->fd[2] = e[1];
    pid_t pid = proc_spawn(o);
    close(p[1]);
    if (err)
        close(e[1]);
    if (pid < 0)
        return -1;
    size_t n = 0;
    ssize_t k;
    while (n + 1 < cap && (k = read(p[0], out + n, cap - 1 - n)) > 0)
        n += (size_t)k;
    out[n] = '\0';
    close(p[0]);
    if (err) {
        n = 0;
        while (n + 1 < ecap && (k = read(e[0], err + n, ecap - 1 - n)) > 0)
            n += (size_t)k;
        err[n] = '\0';
        close(e[0]);
    }
    int st;
    if (waitpid(pid, &st, 0) != pid)
        return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static const char *prog(const char *name)
{
    static char path[64];
    snprintf(path, sizeof path, "/usr/bin/%s", name);
    if (access(path, X_OK) != 0)
        snprintf(path, sizeof path, "/bin/%s", name);
    return path;
}

/* The child's descriptors are 0, 1, 2 (and ls's own directory handle): not a plain one of
 * ours, nor one numbered past 1,024 (a server with many clients holds such). */
static void test_only_stdio_crosses(void)
{
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    int high = 1500;
    if (rl.rlim_cur < 2048 && rl.rlim_max >= 2048) {
        rl.rlim_cur = 2048;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    int plain = open("/dev/null", O_RDONLY); /* no O_CLOEXEC */
    CHECK(plain >= 3);
    bool have_high = rl.rlim_cur > (rlim_t)high && dup2(plain, high) == high;
    char *argv[] = {"ls", "/proc/self/fd", NULL};
    struct proc_spawn o = {
        .path = prog("ls"), .argv = argv, .fd = {PROC_FD_NULL, 0, PROC_FD_SAME}, .pgid = -1};
    char out[4096];
    CHECK_EQ_INT(run(&o, out, sizeof out, NULL, 0), 0);
    /* ls lists 0 1 2 and the descriptor it reads the folder with (3). */
    CHECK_EQ_STR(out, "0\n1\n2\n3\n");
    if (!have_high)
        fprintf(stderr, "note: could not open a descriptor numbered %d here; checked the plain one only\n",
                high);
    else
        close(high);
    close(plain);
}

/* stdin from /dev/null reads nothing; a NULL environment is an empty one. */
static void test_null_stdin_and_empty_env(void)
{
    char *cat[] = {"cat", NULL};
    struct proc_spawn o = {
        .path = prog("cat"), .argv = cat, .fd = {PROC_FD_NULL, 0, PROC_FD_SAME}, .pgid = -1};
    char out[256];
    CHECK_EQ_INT(run(&o, out, sizeof out, NULL, 0), 0);
    CHECK_EQ_STR(out, "");

    setenv("DDPD_TEST_SECRET", "must-not-cross", 1);
    char *env_argv[] = {"env", NULL};
    o = (struct proc_spawn){
        .path = prog("env"), .argv = env_argv, .fd = {PROC_FD_NULL, 0, PROC_FD_SAME}, .pgid = -1};
    CHECK_EQ_INT(run(&o, out, sizeof out, NULL, 0), 0);
    CHECK_EQ_STR(out, "");

    char *given[] = {"A=1", "B=two", NULL};
    o.env = given;
    CHECK_EQ_INT(run(&o, out, sizeof out, NULL, 0), 0);
    CHECK_EQ_STR(out, "A=1\nB=two\n");
}

/* A signal blocked in the server (as SIGTERM is in its threads) is not blocked in the
 * child: a `sleep` ends on SIGTERM. pgid 0 makes it the leader of a group of its own. */
static void test_signals_and_group(void)
{
    sigset_t term, old;
    sigemptyset(&term);
    sigaddset(&term, SIGTERM);
    sigprocmask(SIG_BLOCK, &term, &old);
    char *argv[] = {"sleep", "30", NULL};
    struct proc_spawn o = {
        .path = prog("sleep"), .argv = argv, .fd = {PROC_FD_NULL, PROC_FD_NULL, PROC_FD_SAME}, .pgid = 0};
    pid_t pid = proc_spawn(&o);
    CHECK(pid > 0);
    if (pid > 0) {
        CHECK_EQ_INT(getpgid(pid), pid);
        kill(-pid, SIGTERM); /* the group, as the launcher signals a job */
        int st = 0;
        CHECK_EQ_INT(waitpid(pid, &st, 0), pid);
        CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM);
    }
    sigprocmask(SIG_SETMASK, &old, NULL);
}

/* Whether `status` (a /proc/PID/status text) shows SIGTERM in its blocked set. */
static bool sig_blocked(const char *status, int sig)
{
    const char *line = strstr(status, "\nSigBlk:");
    if (!line)
        return false;
    unsigned long long mask = strtoull(line + strlen("\nSigBlk:"), NULL, 16);
    return (mask >> (sig - 1)) & 1;
}

static bool term_blocked(const char *status)
{
    return sig_blocked(status, SIGTERM);
}

/* hold_term, how a rank starts: SIGTERM blocked in the child (and only there where asked),
 * so a SIGTERM to its group at once, before the program could install a handler, waits
 * pending for it to be unblocked instead of killing it: `cat`, which never unblocks it,
 * ends normally at the end of its input. */
static void test_hold_term(void)
{
    char *argv[] = {"cat", "/proc/self/status", NULL};
    struct proc_spawn o = {.path = prog("cat"),
                           .argv = argv,
                           .fd = {PROC_FD_NULL, 0, PROC_FD_SAME},
                           .pgid = -1,
                           .hold_term = true};
    char out[8192];
    CHECK_EQ_INT(run(&o, out, sizeof out, NULL, 0), 0);
    CHECK(strstr(out, "\nSigBlk:") != NULL);
    CHECK(term_blocked(out));
    CHECK(sig_blocked(out, SIGUSR1)); /* a preemption waits for the rank's handler too */
    o.hold_term = false;
    CHECK_EQ_INT(run(&o, out, sizeof out, NULL, 0), 0);
    CHECK(strstr(out, "\nSigBlk:") != NULL);
    CHECK(!term_blocked(out));
    CHECK(!sig_blocked(out, SIGUSR1));

    int in[2];
    CHECK_EQ_INT(pipe2(in, O_CLOEXEC), 0);
    char *cat[] = {"cat", NULL};
    o = (struct proc_spawn){.path = prog("cat"),
                            .argv = cat,
                            .fd = {in[0], PROC_FD_NULL, PROC_FD_SAME},
                            .pgid = 0,
                            .hold_term = true};
    pid_t pid = proc_spawn(&o);
    close(in[0]);
    CHECK(pid > 0);
    if (pid > 0) {
        CHECK_EQ_INT(kill(-pid, SIGTERM), 0); /* the launcher's cancel, right after the fork */
        close(in[1]);                         /* cat reads EOF and exits 0: the signal waited */
        int st = 0;
        CHECK_EQ_INT(waitpid(pid, &st, 0), pid);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    } else {
        close(in[1]);
    }
}

/* A program that cannot be executed: exit 127 and a message naming it on its stderr. */
static void test_exec_failure(void)
{
    char *argv[] = {"no-such-program", NULL};
    struct proc_spawn o = {
        .path = "/nonexistent/no-such-program", .argv = argv, .fd = {PROC_FD_NULL, 0, 0}, .pgid = -1};
    char out[256], err[512];
    CHECK_EQ_INT(run(&o, out, sizeof out, err, sizeof err), 127);
    CHECK(strstr(err, "cannot execute /nonexistent/no-such-program: No such file or directory") != NULL);
}

/* proc_pipe_close closes the ends still open, marks both -1, and leaves a half-closed or
 * fully closed pipe alone (the launchers' cleanup runs it on any of the three). */
static void test_pipe_close(void)
{
    int p[2];
    CHECK_EQ_INT(pipe2(p, O_CLOEXEC), 0);
    int r = p[0], w = p[1];
    proc_pipe_close(p);
    CHECK_EQ_INT(p[0], -1);
    CHECK_EQ_INT(p[1], -1);
    CHECK(fcntl(r, F_GETFD) == -1 && errno == EBADF);
    CHECK(fcntl(w, F_GETFD) == -1 && errno == EBADF);
    proc_pipe_close(p); /* both -1: nothing to close */
    CHECK_EQ_INT(p[0], -1);

    CHECK_EQ_INT(pipe2(p, O_CLOEXEC), 0);
    w = p[1];
    close(p[0]);
    p[0] = -1; /* the read end handed on, as the launchers do */
    proc_pipe_close(p);
    CHECK_EQ_INT(p[1], -1);
    CHECK(fcntl(w, F_GETFD) == -1 && errno == EBADF);
}

int main(void)
{
    test_only_stdio_crosses();
    test_null_stdin_and_empty_env();
    test_signals_and_group();
    test_hold_term();
    test_exec_failure();
    test_pipe_close();
    CHECK_DONE();
}
