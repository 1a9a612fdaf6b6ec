/* test_mapguard.c — the SIGBUS guard of the rank's file mappings (worker/mapguard.h): the
 * registry's lookup (ranges, edges, removal, its fixed size, the prebuilt event line), and
 * in child processes a real truncation under a mapped tokens data set (exit 2, the event
 * on stdout naming the file, stamped at the fault) and the faults it must leave alone (a
 * mapping it does not guard, a SIGBUS sent by kill: still deaths by the signal, or the
 * program's own earlier handler). */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "base/file.h"
#include "schema/event.h"
#include "schema/spec.h"
#include "worker/data.h"
#include "worker/emit.h"
#include "worker/mapguard.h"

/* AddressSanitizer handles SIGBUS itself (handle_sigbus) but lets a program install its
 * own handler (allow_user_segv_handler): mapguard's handler runs in that build too, and
 * ASan's becomes the previous action, which reports a fault mapguard leaves alone and
 * exits with 1 instead of the death by the signal. */
#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif
#ifndef UNDER_ASAN
#define UNDER_ASAN 0
#endif

static char root[2048]; /* the test's temporary folder, also the data directory */

static void setup(void)
{
    const char *base = getenv("DDPD_TEST_TMP");
    if (!base || !base[0])
        base = "/tmp";
    mkdir(base, 0755);
    snprintf(root, sizeof root, "%s/mapguard.XXXXXX", base);
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        exit(1);
    }
}

static struct ddpd_error why(const char *file)
{
    struct ddpd_error e;
    ddpd_error_set(&e, DDPD_EDATA, file, "%s: the file changed while the job was running", file);
    return e;
}

/* The line of a fault at addr decodes as an `error` event of kind data from `rank`
 * whose message is `msg`. */
static void check_line(const void *addr, int rank, const char *msg)
{
    struct event ev;
    struct ddpd_error err = {0};
    size_t len = 0;
    const char *line = mapguard_find(addr, &len);
    CHECK(line != NULL);
    if (!line)
        return;
    CHECK(len > 1 && line[len - 1] == '\n');
    CHECK_EQ_INT(event_decode(line, len - 1, &ev, &err), DDPD_OK);
    CHECK_EQ_INT(ev.kind, EVENT_ERROR);
    CHECK_EQ_STR(ev.error_kind, "data");
    CHECK_EQ_INT(ev.rank, rank);
    CHECK_EQ_STR(ev.message, msg);
}

static void test_lookup(void)
{
    static char area[3][4096];
    struct ddpd_error a = why("a.bin"), b = why("b/c.npy");
    size_t len = 0;
    CHECK(mapguard_find(area[0], &len) == NULL && len == 0);
    CHECK(mapguard_add(area[0], sizeof area[0], &a));
    CHECK(mapguard_add(area[1] + 100, 50, &b));
    /* Every byte of a range, and none beside it. */
    check_line(area[0], 0, a.message);
    check_line(area[0] + 4095, 0, a.message);
    CHECK(mapguard_find(area[1], &len) == NULL);
    CHECK(mapguard_find(area[1] + 99, &len) == NULL);
    check_line(area[1] + 100, 0, b.message);
    check_line(area[1] + 149, 0, b.message);
    CHECK(mapguard_find(area[1] + 150, &len) == NULL);
    CHECK(mapguard_find(area[2], &len) == NULL);
    /* Removing is by the start; an address that starts nothing removes nothing. */
    mapguard_remove(area[0] + 1);
    CHECK(mapguard_find(area[0], NULL) != NULL);
    mapguard_remove(area[0]);
    CHECK(mapguard_find(area[0], NULL) == NULL);
    CHECK(mapguard_find(area[1] + 120, NULL) != NULL);
    /* Nothing to guard. */
    CHECK(!mapguard_add(NULL, 10, &a));
    CHECK(!mapguard_add(area[2], 0, &a));
    CHECK(!mapguard_add((void *)(UINTPTR_MAX - 10), 20, &a));
    /* Fixed size: the slots freed by a removal are used again. */
    int added = 0;
    while (added < 2 * MAPGUARD_SLOTS && mapguard_add(area[2] + added, 1, &a))
        added++;
    CHECK_EQ_INT(added, MAPGUARD_SLOTS - 1);
    for (int i = 0; i < added; i++)
        mapguard_remove(area[2] + i);
    mapguard_remove(area[1] + 100);
    for (int i = 0; i < MAPGUARD_SLOTS; i++)
        CHECK(mapguard_add(area[2] + i, 1, &a));
    for (int i = 0; i < MAPGUARD_SLOTS; i++)
        mapguard_remove(area[2] + i);
    for (int i = 0; i < 3; i++)
        CHECK(mapguard_find(area[i] + 200, NULL) == NULL);
}

/* A tokens data set of 64 windows of 8 uint16 ids in root/t.bin (16 KiB: four pages). */
static const char *tokens_spec(struct spec *s)
{
    static const char text[] =
        "{\"world_size\": 1, \"model\": [{\"type\": \"embedding\", \"num\": 256, \"dim\": 4},"
        " {\"type\": \"linear\", \"in\": 4, \"out\": 256}], \"input_shape\": [8], \"loss\": "
        "\"cross_entropy\","
        " \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1}, \"batch_size\": 4, \"epochs\": 1,"
        " \"data\": {\"type\": \"tokens\", \"path\": \"t.bin\", \"block_size\": 8, \"shuffle\": false}}";
    struct ddpd_error err = {0};
    if (spec_parse(text, strlen(text), NULL, s, &err) != DDPD_OK) {
        fprintf(stderr, "spec: %s\n", err.message);
        exit(1);
    }
    static char path[4200];
    snprintf(path, sizeof path, "%s/t.bin", root);
    FILE *f = fopen(path, "wb");
    for (int i = 0; i < 8192 && f; i++)
        fputc(i & 0x7f, f), fputc(0, f);
    if (!f || fclose(f) != 0) {
        perror(path);
        exit(1);
    }
    return path;
}

/* Runs fn in a child whose stdout goes to out[cap] (NUL-terminated), and its stderr to
 * /dev/null when `quiet` (a crash expected, and under ASan its report); returns its wait
 * status. Bounded: the child is killed after 20 s (a hang fails the test, not the run). */
static int in_child(void (*fn)(void), char *out, size_t cap, bool quiet)
{
    int p[2];
    if (pipe(p) != 0)
        return -1;
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        struct rlimit no_core = {0, 0}; /* the deaths by SIGBUS below are expected */
        setrlimit(RLIMIT_CORE, &no_core);
        dup2(p[1], STDOUT_FILENO);
        int null = quiet ? open("/dev/null", O_WRONLY) : -1;
        if (null >= 0)
            dup2(null, STDERR_FILENO);
        close(p[0]);
        close(p[1]);
        alarm(20);
        fn();
        _exit(99); /* fn returned: no fault happened */
    }
    close(p[1]);
    size_t n = 0;
    ssize_t r;
    while (n + 1 < cap && ((r = read(p[0], out + n, cap - 1 - n)) > 0 || (r < 0 && errno == EINTR)))
        if (r > 0)
            n += (size_t)r;
    out[n] = '\0';
    close(p[0]);
    int st = -1;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    return st;
}

static double wall_s(void)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + tv.tv_usec * 1e-6;
}

/* The rank's case: a tokens data set opened (its file mapped and registered: the error
 * line is built then), the clock let move on by 2 ms, the time written as the first
 * line of stdout, the file truncated to one page, then every batch read. */
static void child_truncated_tokens(void)
{
    struct spec s;
    const char *path = tokens_spec(&s);
    struct ddpd_error err = {0};
    emit_set_rank(3);
    mapguard_install();
    struct dataset *ds = dataset_open(&s, root, 0, 1, &err);
    if (!ds)
        _exit(98);
    int32_t x[4 * 8], y[4 * 8];
    if (dataset_batch(ds, 0, x, NULL, y) != 4)
        _exit(97);
    double mapped = wall_s(), now = mapped;
    for (long spins = 0; now < mapped + 0.002 && spins < 100000000; spins++)
        now = wall_s();
    char t[64];
    int n = snprintf(t, sizeof t, "%.6f\n", now);
    if (write(STDOUT_FILENO, t, (size_t)n) != n || truncate(path, 4096) != 0)
        _exit(97);
    for (int64_t b = 0; b < dataset_batches(ds); b++)
        dataset_batch(ds, b, x, NULL, y);
    dataset_free(ds);
}

static void test_truncated_tokens(void)
{
    char out[16384];
    int st = in_child(child_truncated_tokens, out, sizeof out, false);
    CHECK(WIFEXITED(st));
    CHECK_EQ_INT(WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), 2);
    /* The child's time, then one line: the error event, naming the file and its size
     * when mapped. */
    char *line = strchr(out, '\n');
    double before = strtod(out, NULL);
    line = line ? line + 1 : out;
    size_t len = strlen(line);
    CHECK(len > 0 && strchr(line, '\n') == line + len - 1);
    struct event ev;
    struct ddpd_error err = {0};
    CHECK_EQ_INT(event_decode(line, len ? len - 1 : 0, &ev, &err), DDPD_OK);
    CHECK_EQ_INT(ev.kind, EVENT_ERROR);
    CHECK_EQ_STR(ev.error_kind, "data");
    CHECK_EQ_INT(ev.rank, 3);
    CHECK(strstr(ev.message, "t.bin: the file changed while the job was running: it is now shorter than the "
                             "16384 bytes it had when the job started") == ev.message);
    /* Stamped when the fault happened, not when the file was mapped (2 ms before). */
    CHECK(before > 0 && ev.ts >= before);
    if (!(before > 0 && ev.ts >= before))
        fprintf(stderr, "    ts %.6f, child's time before the truncation %.6f: %s", ev.ts, before, out);
}

static void on_bus_42(int sig, siginfo_t *si, void *uc)
{
    (void)sig, (void)si, (void)uc;
    _exit(42);
}

/* A mapping nobody registered, truncated under it: a real bug, which must still crash
 * (with a guarded range elsewhere). With `chained`, a handler of the program's own was
 * installed first: it gets the fault (exit 42). */
static void unguarded_fault(bool chained)
{
    char path[4200];
    static char other[64];
    struct ddpd_error e = why("other.bin");
    snprintf(path, sizeof path, "%s/u.bin", root);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || ftruncate(fd, 8192) != 0)
        _exit(98);
    volatile const char *m = mmap(NULL, 8192, PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED)
        _exit(98);
    if (chained) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_bus_42;
        sa.sa_flags = SA_SIGINFO;
        sigaction(SIGBUS, &sa, NULL);
    }
    mapguard_install();
    mapguard_add(other, sizeof other, &e);
    if (ftruncate(fd, 0) != 0)
        _exit(97);
    (void)m[4096];
}

static void child_unguarded(void)
{
    unguarded_fault(false);
}

static void child_unguarded_chained(void)
{
    unguarded_fault(true);
}

static void child_killed(void)
{
    mapguard_install();
    kill(getpid(), SIGBUS);
}

/* The default action's end: the death by SIGBUS, or under ASan its report's exit 1. */
static bool died_of_sigbus(int st)
{
    if (UNDER_ASAN)
        return WIFEXITED(st) && WEXITSTATUS(st) == 1;
    return WIFSIGNALED(st) && WTERMSIG(st) == SIGBUS;
}

static void test_other_faults_still_crash(void)
{
    char out[1024];
    int st = in_child(child_unguarded, out, sizeof out, true);
    CHECK(died_of_sigbus(st));
    CHECK_EQ_STR(out, "");
    st = in_child(child_unguarded_chained, out, sizeof out, true);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 42);
    CHECK_EQ_STR(out, "");
    st = in_child(child_killed, out, sizeof out, true);
    CHECK(died_of_sigbus(st));
    CHECK_EQ_STR(out, "");
}

int main(void)
{
    setup();
    test_lookup();
    test_truncated_tokens();
    test_other_faults_still_crash();
    base_remove_tree(root);
    CHECK_DONE();
}
