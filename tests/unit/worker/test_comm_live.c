/* test_comm_live.c — the liveness of the CPU backend's ring links (issue 33; sock.c's
 * comm_cpu__sock_live and comm_cpu__sock_silent): keepalive is set as the bound says, and
 * a peer whose kernel answers is never taken for silent, neither on an idle link (the
 * probes are answered) nor behind a receiver that does not read (a closed window: bytes
 * wait unsent, nothing is unacknowledged). Over loopback, whose kernel always answers;
 * a host whose packets vanish is tests/multihost/test_liveness.py. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"
#include "base/clock.h"
#include "worker/comm/cpu/cpu_impl.h"

/* Silence this long counts in the checks: past keepalive's first probe and its answer,
 * shorter than LIVE_S, so the test waits less. */
#define QUIET_S 2.5

/* A connected loopback pair, both ends non-blocking, the ring's options on both. */
static void pair(int *a, int *b)
{
    int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    CHECK(l >= 0);
    CHECK_EQ_INT(bind(l, (struct sockaddr *)&sa, sizeof sa), 0);
    CHECK_EQ_INT(listen(l, 1), 0);
    CHECK_EQ_INT(getsockname(l, (struct sockaddr *)&sa, &sl), 0);
    *a = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    comm_cpu__sock_tune(*a);
    CHECK_EQ_INT(connect(*a, (struct sockaddr *)&sa, sizeof sa), 0);
    *b = accept4(l, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    CHECK(*b >= 0);
    close(l);
    fcntl(*a, F_SETFL, fcntl(*a, F_GETFL) | O_NONBLOCK);
    comm_cpu__sock_live(*a);
    comm_cpu__sock_live(*b);
}

static int opt(int fd, int level, int name)
{
    int v = -1;
    socklen_t l = sizeof v;
    CHECK_EQ_INT(getsockopt(fd, level, name, &v, &l), 0);
    return v;
}

static void test_options(void)
{
    int a, b;
    pair(&a, &b);
    CHECK_EQ_INT(opt(a, SOL_SOCKET, SO_KEEPALIVE), 1);
    CHECK_EQ_INT(opt(a, IPPROTO_TCP, TCP_KEEPIDLE), KEEP_IDLE_S);
    CHECK_EQ_INT(opt(a, IPPROTO_TCP, TCP_KEEPINTVL), KEEP_INTVL_S);
    CHECK_EQ_INT(opt(a, IPPROTO_TCP, TCP_KEEPCNT), KEEP_CNT);
    CHECK_EQ_INT(opt(b, SOL_SOCKET, SO_KEEPALIVE), 1);
    /* No user timeout: it would end a link whose window stays closed (sock.c). */
    CHECK_EQ_INT(opt(a, IPPROTO_TCP, TCP_USER_TIMEOUT), 0);
    char host[64];
    comm_cpu__peer_host(a, host, sizeof host);
    CHECK_EQ_STR(host, "127.0.0.1");
    double q;
    CHECK_EQ_INT(comm_cpu__sock_silent(a, QUIET_S, &q), 0); /* fresh */
    close(a);
    close(b);
}

/* Idle for longer than QUIET_S: keepalive's probes are answered, so neither end is silent. */
static void test_idle_link_answers(void)
{
    int a, b;
    pair(&a, &b);
    base_sleep_s(QUIET_S + 1.0);
    double qa, qb;
    CHECK_EQ_INT(comm_cpu__sock_silent(a, QUIET_S, &qa), 0);
    CHECK_EQ_INT(comm_cpu__sock_silent(b, QUIET_S, &qb), 0);
    CHECK(qa < QUIET_S && qb < QUIET_S);
    close(a);
    close(b);
}

/* The receiver never reads: the sender fills both buffers and waits on a closed window
 * for longer than QUIET_S. The receiver's kernel answers, so that is no silence. */
static void test_closed_window_is_not_silence(void)
{
    int a, b;
    pair(&a, &b);
    static char buf[1 << 16];
    size_t sent = 0;
    double until = base_mono_s() + 10;
    while (base_mono_s() < until) {
        ssize_t k = send(a, buf, sizeof buf, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k > 0) {
            sent += (size_t)k;
            continue;
        }
        if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
            break;
        base_sleep_s(0.05); /* the kernel may still move bytes to the receiver */
        if (send(a, buf, 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
    }
    CHECK(sent > 0);
    base_sleep_s(QUIET_S + 1.0);
    double q;
    CHECK_EQ_INT(comm_cpu__sock_silent(a, QUIET_S, &q), 0);
    CHECK_EQ_INT(comm_cpu__sock_silent(b, QUIET_S, &q), 0);
    close(a);
    close(b);
}

int main(void)
{
    test_options();
    test_idle_link_answers();
    test_closed_window_is_not_silence();
    CHECK_DONE();
}
