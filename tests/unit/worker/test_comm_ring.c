/* test_comm_ring.c — the CPU backend's rendezvous against strangers (issue 28, item 1;
 * docs/security.md): whatever connects to a rank's ring port during the rendezvous (64
 * random bytes, a silent connection, a flood of both) is dropped and logged, and the ring
 * forms with the true neighbour long before the deadline; the root drops what does not
 * register. The handshakes are challenge-response under the id's secret: a recorded hello
 * of one group does not open a later one, the secret never crosses the wire, and a rank
 * does not trust a listener that cannot prove itself. A test learns a rank's ring port as
 * anyone on the host sees it listening: from /proc/PID/net/tcp, matched to the rank's own
 * socket inodes. */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "comm_group.h"
#include "rank_values.h"
#include "base/clock.h"
#include "worker/comm.h"
#include "worker/comm/cpu/wire.h"

#define NFLOATS 5000

static char tmpdir[256];

/* ---- ranks as processes, each with its own log ---- */

/* A rank's stderr (its log, as the launcher's rank-R.log) for this case. */
static void log_path(char *buf, size_t cap, const char *cas, int rank)
{
    snprintf(buf, cap, "%s/%s-rank-%d.log", tmpdir, cas, rank);
}

/* Joins, all-reduces NFLOATS rank-dependent values, checks the sums, and leaves. */
static int rank_main(int rank, int world, const struct comm_id *id, double timeout_s)
{
    struct ddpd_error err;
    struct comm_req *req;
    struct comm *c = comm_new(&comm_cpu_ops, id, rank, world, timeout_s, &err);
    if (!c) {
        fprintf(stderr, "rank %d: comm_new: %s\n", rank, err.message);
        return 1;
    }
    static float buf[NFLOATS];
    for (int i = 0; i < NFLOATS; i++)
        buf[i] = rank_value(rank, i);
    int bad = comm_allreduce_start(c, buf, NFLOATS, &req, &err) != DDPD_OK ||
              comm_wait(c, req, &err) != DDPD_OK || comm_barrier(c, &err) != DDPD_OK;
    if (bad)
        fprintf(stderr, "rank %d: collective: %s\n", rank, err.message);
    for (int i = 0; i < NFLOATS && !bad; i++) {
        double want = 0, mag = 0;
        for (int r = 0; r < world; r++) {
            want += rank_value(r, i);
            mag += fabs(rank_value(r, i));
        }
        if (!(fabs(buf[i] - want) <= 1e-6 * mag)) {
            fprintf(stderr, "rank %d: element %d: %.9g, want %.9g\n", rank, i, buf[i], want);
            bad = 1;
        }
    }
    comm_free(c);
    return bad;
}

/* Forks rank `rank` of `world` with its stderr in its log; nofile > 0 limits its open files. */
static pid_t rank_start(const char *cas, int rank, int world, const struct comm_id *id, double timeout_s,
                        rlim_t nofile)
{
    pid_t p = fork();
    if (p != 0)
        return p;
    alarm(100); /* a hang is a failure, not a stuck test run */
    /* Only what a launched rank has: no sockets of the test (its strangers, its issuer pipe). */
    close_range(3, ~0u, 0);
    char path[512];
    log_path(path, sizeof path, cas, rank);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0 || dup2(fd, 2) < 0)
        _exit(2);
    close(fd);
    if (nofile > 0) {
        struct rlimit rl = {nofile, nofile};
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
            _exit(2);
    }
    check__failures = 0;
    int rc = rank_main(rank, world, id, timeout_s);
    fflush(stderr);
    exit(rc || check__failures ? 1 : 0); /* exit, not _exit: LeakSanitizer checks the rank */
}

/* 0 when the rank exited 0; else prints how it ended and its log. */
static int rank_wait(const char *cas, int rank, pid_t p)
{
    int st = 0;
    if (waitpid(p, &st, 0) < 0)
        return -1;
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
        return 0;
    char path[512], line[1024];
    log_path(path, sizeof path, cas, rank);
    fprintf(stderr, "  %s: rank %d: %s %d; its log:\n", cas, rank, WIFEXITED(st) ? "exit" : "signal",
            WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
    FILE *f = fopen(path, "r");
    for (int n = 0; f && n < 40 && fgets(line, sizeof line, f); n++)
        fprintf(stderr, "    %s", line);
    if (f)
        fclose(f);
    return 1;
}

/* Lines of a rank's log that contain `what`. */
static int log_count(const char *cas, int rank, const char *what)
{
    char path[512], line[1024];
    log_path(path, sizeof path, cas, rank);
    FILE *f = fopen(path, "r");
    int n = 0;
    while (f && fgets(line, sizeof line, f))
        n += strstr(line, what) != NULL;
    if (f)
        fclose(f);
    return n;
}

/* ---- a rank's ring port, seen from outside ---- */

/* The port on which process `pid` listens for TCP, or 0 while it has none: its socket
 * inodes (/proc/PID/fd) matched against the LISTEN rows of /proc/PID/net/tcp. */
static int listening_port(pid_t pid)
{
    char path[64], link[64];
    unsigned long inodes[64];
    int ninodes = 0, port = 0;
    snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
    DIR *d = opendir(path);
    struct dirent *e;
    while (d && (e = readdir(d)) && ninodes < 64) {
        char fdp[400];
        snprintf(fdp, sizeof fdp, "%s/%s", path, e->d_name);
        ssize_t k = readlink(fdp, link, sizeof link - 1);
        if (k <= 0)
            continue;
        link[k] = '\0';
        if (sscanf(link, "socket:[%lu]", &inodes[ninodes]) == 1)
            ninodes++;
    }
    if (d)
        closedir(d);
    snprintf(path, sizeof path, "/proc/%d/net/tcp", (int)pid);
    FILE *f = fopen(path, "r");
    char row[512];
    while (f && !port && fgets(row, sizeof row, f)) {
        unsigned lport, st;
        unsigned long ino;
        if (sscanf(row, " %*s %*[0-9A-Fa-f]:%x %*s %x %*s %*s %*s %*s %*s %lu", &lport, &st, &ino) != 3 ||
            st != 0x0A)
            continue;
        for (int i = 0; i < ninodes; i++)
            if (inodes[i] == ino)
                port = (int)lport;
    }
    if (f)
        fclose(f);
    return port;
}

/* Waits (bounded) until rank process `pid` listens on its ring port: it does from before
 * it registers with the root until its ring is formed. */
static int ring_port(pid_t pid)
{
    double deadline = base_mono_s() + 30;
    struct timespec t = {0, 5 * 1000 * 1000};
    for (;;) {
        int port = listening_port(pid);
        if (port || base_mono_s() > deadline)
            return port;
        nanosleep(&t, NULL);
    }
}

/* ---- strangers ---- */

/* A connection to 127.0.0.1:port; blocking connect when `wait`, else started only (a
 * stranger beyond the listener's backlog stays half-open, as in a flood). -1 on failure. */
static int stranger(int port, int wait)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | (wait ? 0 : SOCK_NONBLOCK), 0);
    if (fd < 0)
        return -1;
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0 && !(!wait && errno == EINPROGRESS)) {
        close(fd);
        return -1;
    }
    return fd;
}

static int local_port(int fd)
{
    struct sockaddr_in a;
    socklen_t l = sizeof a;
    return getsockname(fd, (struct sockaddr *)&a, &l) == 0 ? ntohs(a.sin_port) : 0;
}

static void put_be32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

static void random_bytes(unsigned char *b, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t k = getrandom(b + got, n - got, 0);
        if (k > 0)
            got += (size_t)k;
    }
}

/* ---- the cases ---- */

/* A stranger connects to rank 0's ring port while rank 0 waits in the rendezvous (so it
 * is first in the queue, before rank 1) and sends 64 random bytes. Before: rank 0 took it
 * for rank 1 and both ranks failed at once ("carries the wrong magic"). */
static void test_garbage_stranger(void)
{
    struct issuer is;
    CHECK_EQ_INT(issuer_start(&is), 0);
    pid_t r0 = rank_start("garbage", 0, 2, &is.id, 30, 0);
    int port = ring_port(r0);
    CHECK(port > 0);
    int s = stranger(port, 1);
    CHECK(s >= 0);
    unsigned char junk[64];
    random_bytes(junk, sizeof junk);
    CHECK_EQ_INT(send(s, junk, sizeof junk, MSG_NOSIGNAL), (long long)sizeof junk);
    char who[64];
    snprintf(who, sizeof who, "127.0.0.1:%d", local_port(s));
    pid_t r1 = rank_start("garbage", 1, 2, &is.id, 30, 0);
    CHECK_EQ_INT(rank_wait("garbage", 0, r0), 0);
    CHECK_EQ_INT(rank_wait("garbage", 1, r1), 0);
    /* The rank logged whom it dropped, and why. */
    CHECK_EQ_INT(log_count("garbage", 0, who), 1);
    CHECK_EQ_INT(log_count("garbage", 0, "not a ring hello"), 1);
    close(s);
    CHECK_EQ_INT(issuer_stop(&is), 0);
}

/* A stranger connects to rank 0's ring port during the rendezvous and says nothing, and
 * holds the connection open until the job ends. Before: rank 0 waited on it for the whole
 * ddp.timeout_s, then blamed rank 1. Now the ring forms with the true rank 1; with
 * timeout_s 60, a job that succeeds did not wait it out. */
static void test_silent_stranger(void)
{
    struct issuer is;
    CHECK_EQ_INT(issuer_start(&is), 0);
    pid_t r0 = rank_start("silent", 0, 3, &is.id, 60, 0);
    int port = ring_port(r0);
    CHECK(port > 0);
    int s = stranger(port, 1);
    CHECK(s >= 0);
    pid_t r1 = rank_start("silent", 1, 3, &is.id, 60, 0);
    pid_t r2 = rank_start("silent", 2, 3, &is.id, 60, 0);
    CHECK_EQ_INT(rank_wait("silent", 0, r0), 0);
    CHECK_EQ_INT(rank_wait("silent", 1, r1), 0);
    CHECK_EQ_INT(rank_wait("silent", 2, r2), 0);
    close(s);
    CHECK_EQ_INT(issuer_stop(&is), 0);
}

/* Many strangers at once, more than a rank keeps waiting: half of them silent, half
 * sending garbage, all held open; rank 0 may open only 64 files. The ring forms, rank 0
 * runs out of nothing, and its log stays short. */
#define FLOOD 150
static void test_many_strangers(void)
{
    struct issuer is;
    int fds[FLOOD];
    CHECK_EQ_INT(issuer_start(&is), 0);
    pid_t r0 = rank_start("flood", 0, 2, &is.id, 60, 64);
    int port = ring_port(r0);
    CHECK(port > 0);
    int opened = 0;
    for (int i = 0; i < FLOOD; i++) {
        fds[i] = stranger(port, 0);
        opened += fds[i] >= 0;
    }
    CHECK_EQ_INT(opened, FLOOD);
    /* Garbage from every other stranger whose connection is up already. */
    unsigned char junk[64];
    random_bytes(junk, sizeof junk);
    for (int i = 0; i < FLOOD; i += 2)
        if (fds[i] >= 0)
            (void)!send(fds[i], junk, sizeof junk, MSG_NOSIGNAL | MSG_DONTWAIT);
    pid_t r1 = rank_start("flood", 1, 2, &is.id, 60, 0);
    CHECK_EQ_INT(rank_wait("flood", 0, r0), 0);
    CHECK_EQ_INT(rank_wait("flood", 1, r1), 0);
    int lines = log_count("flood", 0, "dropped a connection from 127.0.0.1:");
    fprintf(stderr, "  flood: rank 0 logged %d strangers\n", lines);
    CHECK(lines >= 1 && lines < FLOOD / 2);
    for (int i = 0; i < FLOOD; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    CHECK_EQ_INT(issuer_stop(&is), 0);
}

/* ---- the handshake's pieces ---- */

/* A proof holds for exactly its inputs: another secret, either nonce, either rank, the
 * world or the role makes it wrong. So a proof recorded on one link proves nothing on
 * another, in this group or a later one (whose secret and nonces are new). */
static void test_proofs(void)
{
    unsigned char s1[SECRET_BYTES], s2[SECRET_BYTES], nc[NONCE_BYTES], nl[NONCE_BYTES], nx[NONCE_BYTES];
    unsigned char p[PROOF_BYTES], q[PROOF_BYTES];
    random_bytes(s1, sizeof s1);
    random_bytes(s2, sizeof s2);
    CHECK_EQ_INT(comm_cpu__nonce(nc), 0);
    CHECK_EQ_INT(comm_cpu__nonce(nl), 0);
    CHECK_EQ_INT(comm_cpu__nonce(nx), 0);
    CHECK(memcmp(nc, nl, NONCE_BYTES) != 0);
    CHECK_EQ_INT(comm_cpu__ring_proof(s1, RING_CONNECTOR, 2, 3, 4, nc, nl, p), 0);
    CHECK_EQ_INT(comm_cpu__ring_proof(s1, RING_CONNECTOR, 2, 3, 4, nc, nl, q), 0);
    CHECK(memcmp(p, q, PROOF_BYTES) == 0);
    CHECK_EQ_INT(comm_cpu__ring_proof_check(s1, RING_CONNECTOR, 2, 3, 4, nc, nl, p), 1);
    CHECK_EQ_INT(comm_cpu__ring_proof_check(s2, RING_CONNECTOR, 2, 3, 4, nc, nl, p), 0); /* a later group */
    CHECK_EQ_INT(comm_cpu__ring_proof_check(s1, RING_CONNECTOR, 2, 3, 4, nc, nx, p),
                 0); /* a later challenge */
    CHECK_EQ_INT(comm_cpu__ring_proof_check(s1, RING_CONNECTOR, 2, 3, 4, nx, nl, p), 0);
    CHECK_EQ_INT(comm_cpu__ring_proof_check(s1, RING_LISTENER, 2, 3, 4, nc, nl, p), 0); /* reflected */
    CHECK_EQ_INT(comm_cpu__ring_proof_check(s1, RING_CONNECTOR, 1, 3, 4, nc, nl, p), 0);
    CHECK_EQ_INT(comm_cpu__ring_proof_check(s1, RING_CONNECTOR, 2, 0, 4, nc, nl, p), 0);
    CHECK_EQ_INT(comm_cpu__ring_proof_check(s1, RING_CONNECTOR, 2, 3, 5, nc, nl, p), 0);
    p[PROOF_BYTES - 1] ^= 1;
    CHECK_EQ_INT(comm_cpu__ring_proof_check(s1, RING_CONNECTOR, 2, 3, 4, nc, nl, p), 0);

    /* The hello names its sender; its decoder says why it is not the one expected. */
    unsigned char h[HELLO_BYTES];
    struct cpu_hello got;
    char why[160];
    comm_cpu__hello_put(h, 3, 4, nc);
    CHECK_EQ_INT(comm_cpu__hello_decode(h, 3, 4, &got, why, sizeof why), 0);
    CHECK(got.rank == 3 && got.world == 4 && memcmp(got.nonce, nc, NONCE_BYTES) == 0);
    CHECK_EQ_INT(comm_cpu__hello_decode(h, 1, 4, &got, why, sizeof why), -1);
    CHECK_EQ_STR(why, "it says it is rank 3 of 4, not rank 1 of 4");
    h[7] ^= 0x7; /* the version */
    CHECK_EQ_INT(comm_cpu__hello_decode(h, 3, 4, &got, why, sizeof why), -1);
    CHECK(strstr(why, "another ddpd version?") != NULL);
    h[0] ^= 0x40;
    CHECK_EQ_INT(comm_cpu__hello_decode(h, 3, 4, &got, why, sizeof why), -1);
    CHECK_EQ_STR(why, "not a ring hello");

    /* A registration holds for the root's nonce and the secret, and carries neither. */
    unsigned char reg[REG_BYTES], ch[CHALLENGE_BYTES], back[NONCE_BYTES];
    struct cpu_addr a = {.family = AF_INET, .port = 4242, .ip = {127, 0, 0, 1}};
    struct cpu_reg r;
    char text[MSG_TEXT_MAX];
    comm_cpu__challenge_put(ch, nl);
    CHECK_EQ_INT(comm_cpu__challenge_decode(ch, back), 0);
    CHECK(memcmp(back, nl, NONCE_BYTES) == 0);
    comm_cpu__reg_put(reg, s1, nl, 2, 4, &a);
    CHECK(memmem(reg, sizeof reg, s1, SECRET_BYTES) == NULL);
    CHECK_EQ_INT(comm_cpu__reg_decode(reg, s1, nl, &r, text, sizeof text), 0);
    CHECK(r.rank == 2 && r.world == 4 && r.addr.port == 4242);
    CHECK_EQ_INT(comm_cpu__reg_decode(reg, s1, nx, &r, text, sizeof text),
                 -1); /* replayed to another challenge */
    CHECK(strstr(text, "wrong proof") != NULL);
    CHECK_EQ_INT(comm_cpu__reg_decode(reg, s2, nl, &r, text, sizeof text), -1); /* another group */
    reg[7] ^= 1;                                                                /* another rank, same proof */
    CHECK_EQ_INT(comm_cpu__reg_decode(reg, s1, nl, &r, text, sizeof text), -1);
}

/* ---- a recorded group: the test plays its root and rank 1 ---- */

static int listener(int *port)
{
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t l = sizeof a;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 4) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &l) != 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    *port = ntohs(a.sin_port);
    return fd;
}

/* accept and read with a bound: a rank that never comes fails the case, not the run */
static int accept_within(int lfd)
{
    struct pollfd p = {lfd, POLLIN, 0};
    if (poll(&p, 1, 30000) != 1)
        return -1;
    int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
    struct timeval tv = {30, 0};
    if (fd >= 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

static int read_full(int fd, void *buf, size_t n)
{
    unsigned char *p = buf;
    while (n > 0) {
        ssize_t k = recv(fd, p, n, 0);
        if (k <= 0)
            return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

/* What rank 0 of a 2-rank group sent on the wire: its registration, and its hello and
 * proof to rank 1 (the test), made over the test's nonces. */
struct recording {
    unsigned char secret[SECRET_BYTES];
    unsigned char reg[REG_BYTES];
    unsigned char hello[HELLO_BYTES], proof[PROOF_BYTES];
    unsigned char nonce1[NONCE_BYTES]; /* the nonce the test, as rank 1, sent rank 0 */
};

/* Runs rank 0 against a root and a rank 1 that are the test, records what it sends, and
 * answers its hello with a wrong proof: rank 0 must refuse that listener. Returns rank 0's
 * exit status (0 would mean it trusted a listener that does not hold the secret). */
static int record_group(struct recording *rec)
{
    int rport, lport, st = -1;
    int rl = listener(&rport), ll = listener(&lport), root = -1, ring = -1;
    CHECK(rl >= 0 && ll >= 0);
    struct comm_id id = {{0}};
    struct cpu_addr ra = {.family = AF_INET, .port = (uint16_t)rport, .ip = {127, 0, 0, 1}}, me = ra;
    me.port = (uint16_t)lport;
    random_bytes(rec->secret, SECRET_BYTES);
    memcpy(id.bytes, rec->secret, SECRET_BYTES);
    comm_cpu__addr_put(id.bytes + SECRET_BYTES, &ra);
    pid_t r0 = rank_start("record", 0, 2, &id, 20, 0);

    /* As the root: a challenge, the registration, the table (rank 1: the test). */
    unsigned char ch[CHALLENGE_BYTES], nonce[NONCE_BYTES], table[MSG_HDR_BYTES + 2 * ADDR_BYTES];
    struct cpu_reg reg;
    char text[MSG_TEXT_MAX];
    CHECK_EQ_INT(comm_cpu__nonce(nonce), 0);
    comm_cpu__challenge_put(ch, nonce);
    root = accept_within(rl);
    CHECK(root >= 0);
    CHECK(root >= 0 && send(root, ch, sizeof ch, MSG_NOSIGNAL) == (ssize_t)sizeof ch);
    CHECK(root >= 0 && read_full(root, rec->reg, REG_BYTES) == 0);
    CHECK_EQ_INT(comm_cpu__reg_decode(rec->reg, rec->secret, nonce, &reg, text, sizeof text), 0);
    put_be32(table, MSG_TABLE);
    put_be32(table + 4, 2 * ADDR_BYTES);
    comm_cpu__addr_put(table + MSG_HDR_BYTES, &reg.addr);
    comm_cpu__addr_put(table + MSG_HDR_BYTES + ADDR_BYTES, &me);
    CHECK(root >= 0 && send(root, table, sizeof table, MSG_NOSIGNAL) == (ssize_t)sizeof table);

    /* As rank 1: rank 0 connects to us, its next. */
    ring = accept_within(ll);
    CHECK(ring >= 0);
    unsigned char mine[HELLO_BYTES], wrong[PROOF_BYTES];
    CHECK_EQ_INT(comm_cpu__nonce(rec->nonce1), 0);
    comm_cpu__hello_put(mine, 1, 2, rec->nonce1);
    CHECK(ring >= 0 && read_full(ring, rec->hello, HELLO_BYTES) == 0);
    CHECK(ring >= 0 && send(ring, mine, sizeof mine, MSG_NOSIGNAL) == (ssize_t)sizeof mine);
    CHECK(ring >= 0 && read_full(ring, rec->proof, PROOF_BYTES) == 0);
    random_bytes(wrong, sizeof wrong);
    CHECK(ring >= 0 && send(ring, wrong, sizeof wrong, MSG_NOSIGNAL) == (ssize_t)sizeof wrong);
    waitpid(r0, &st, 0);
    if (root >= 0)
        close(root);
    if (ring >= 0)
        close(ring);
    close(rl);
    close(ll);
    return st;
}

/* The secret never crosses the wire (before: the registration and both hellos carried it
 * in clear, so whoever watched one group's wire could join that group as any rank), and
 * a rank refuses a listener that cannot prove it holds the secret. */
static void test_secret_stays_home(struct recording *rec)
{
    int st = record_group(rec);
    CHECK(memmem(rec->reg, REG_BYTES, rec->secret, SECRET_BYTES) == NULL);
    CHECK(memmem(rec->hello, HELLO_BYTES, rec->secret, SECRET_BYTES) == NULL);
    CHECK(memmem(rec->proof, PROOF_BYTES, rec->secret, SECRET_BYTES) == NULL);
    /* What it sent is a real proof over our nonce: the recording is worth replaying. */
    struct cpu_hello h;
    char why[160];
    CHECK_EQ_INT(comm_cpu__hello_decode(rec->hello, 0, 2, &h, why, sizeof why), 0);
    CHECK_EQ_INT(
        comm_cpu__ring_proof_check(rec->secret, RING_CONNECTOR, 0, 1, 2, h.nonce, rec->nonce1, rec->proof),
        1);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 1);
    CHECK_EQ_INT(log_count("record", 0, "ring: rank 1 at 127.0.0.1:"), 1);
    CHECK_EQ_INT(log_count("record", 0, "could not prove that it holds this group's id"), 1);
}

/* A recorded hello and proof of rank 0 (from the group above), replayed to rank 1 of a
 * later group, on a connection that comes before the true rank 0's: rank 1 hangs up on it,
 * logs it, and forms its ring with the true rank 0. */
static void test_replay(const struct recording *rec)
{
    struct issuer is;
    CHECK_EQ_INT(issuer_start(&is), 0);
    pid_t r1 = rank_start("replay", 1, 2, &is.id, 30, 0);
    int port = ring_port(r1);
    CHECK(port > 0);
    int s = stranger(port, 1);
    CHECK(s >= 0);
    struct timeval tv = {30, 0};
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    CHECK_EQ_INT(send(s, rec->hello, HELLO_BYTES, MSG_NOSIGNAL), HELLO_BYTES);
    CHECK_EQ_INT(send(s, rec->proof, PROOF_BYTES, MSG_NOSIGNAL), PROOF_BYTES);
    char who[64];
    snprintf(who, sizeof who, "127.0.0.1:%d: wrong proof", local_port(s));
    pid_t r0 = rank_start("replay", 0, 2, &is.id, 30, 0);
    /* Rank 1's hello to us, then its hang-up: nothing else. */
    unsigned char theirs[HELLO_BYTES], more;
    CHECK_EQ_INT(read_full(s, theirs, sizeof theirs), 0);
    CHECK(recv(s, &more, 1, 0) <= 0);
    CHECK_EQ_INT(rank_wait("replay", 0, r0), 0);
    CHECK_EQ_INT(rank_wait("replay", 1, r1), 0);
    CHECK_EQ_INT(log_count("replay", 1, who), 1);
    close(s);
    CHECK_EQ_INT(issuer_stop(&is), 0);
}

/* The root too is open to anyone: a connection that sends garbage is refused, one that never
 * registers is dropped after a few seconds (before: held for as long as the root lived),
 * and neither keeps a group from forming. */
static void test_root_strangers(void)
{
    struct issuer is;
    struct cpu_addr root;
    unsigned char secret[SECRET_BYTES], ch[CHALLENGE_BYTES], nonce[NONCE_BYTES], junk[REG_BYTES], more;
    CHECK_EQ_INT(issuer_start(&is), 0);
    CHECK_EQ_INT(comm_cpu__id_decode(&is.id, secret, &root), 0);
    int silent = stranger(root.port, 1), noisy = stranger(root.port, 1);
    CHECK(silent >= 0 && noisy >= 0);
    struct timeval tv = {30, 0};
    setsockopt(silent, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(noisy, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    /* Each gets its own challenge, which names no secret. */
    CHECK_EQ_INT(read_full(silent, ch, sizeof ch), 0);
    CHECK_EQ_INT(comm_cpu__challenge_decode(ch, nonce), 0);
    CHECK(memmem(ch, sizeof ch, secret, SECRET_BYTES) == NULL);
    CHECK_EQ_INT(read_full(noisy, ch, sizeof ch), 0);
    random_bytes(junk, sizeof junk);
    CHECK_EQ_INT(send(noisy, junk, sizeof junk, MSG_NOSIGNAL), REG_BYTES);
    unsigned char h[MSG_HDR_BYTES];
    CHECK_EQ_INT(read_full(noisy, h, sizeof h), 0); /* the refusal's header, then its text, then EOF */
    CHECK_EQ_INT(h[3], MSG_ERROR);
    /* The silent one: dropped (EOF) well within the test's bound. */
    CHECK(recv(silent, &more, 1, 0) == 0);
    pid_t r0 = rank_start("root", 0, 2, &is.id, 30, 0), r1 = rank_start("root", 1, 2, &is.id, 30, 0);
    CHECK_EQ_INT(rank_wait("root", 0, r0), 0);
    CHECK_EQ_INT(rank_wait("root", 1, r1), 0);
    close(silent);
    close(noisy);
    CHECK_EQ_INT(issuer_stop(&is), 0);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    comm_group_crypto_ready();
    const char *base = getenv("DDPD_TEST_TMP");
    snprintf(tmpdir, sizeof tmpdir, "%s/test_comm_ring-XXXXXX", base && *base ? base : "/tmp");
    if (base && *base)
        mkdir(base, 0700);
    if (!mkdtemp(tmpdir)) {
        fprintf(stderr, "mkdtemp %s: %s\n", tmpdir, strerror(errno));
        return 1;
    }
    double t0 = base_mono_s();
    struct recording rec;
    test_proofs();
    test_garbage_stranger();
    test_silent_stranger();
    test_many_strangers();
    test_secret_stays_home(&rec);
    test_replay(&rec);
    test_root_strangers();
    fprintf(stderr, "test_comm_ring: %.1f s (logs in %s)\n", base_mono_s() - t0, tmpdir);
    CHECK_DONE();
}
