/* hello_mhd.c — the baseline of bench/server: a raw libmicrohttpd server with the thread
 * setup of ddpd's HTTP layer (server/http.c: an internal epoll polling thread, a pool of
 * 4, suspend/resume allowed, the same connection limits, timeout and memory limit) that
 * answers every request with a small fixed JSON body. Bodies (POST) are read and dropped.
 * Like ddpd it answers on the final call of the access handler, so keep-alive holds.
 *
 * Usage: bench_hello_mhd [ADDR:PORT]   (default 127.0.0.1:0)
 * Prints "bench_hello_mhd: listening on port N" on stderr and serves until SIGINT/SIGTERM. */
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static const char BODY[] = "{\"id\":1,\"name\":\"hello\",\"state\":\"queued\",\"step\":null,\"loss\":null}\n";

static int first_call_marker;

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
    (void)cls, (void)url, (void)method, (void)version, (void)upload;
    if (*con_cls == NULL) { /* headers complete: answer later, on the final call */
        *con_cls = &first_call_marker;
        return MHD_YES;
    }
    if (*upload_size) { /* a chunk of body: drop it */
        *upload_size = 0;
        return MHD_YES;
    }
    struct MHD_Response *r =
        MHD_create_response_from_buffer(sizeof BODY - 1, (void *)BODY, MHD_RESPMEM_PERSISTENT);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    enum MHD_Result rc = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return rc;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode t)
{
    (void)cls, (void)c, (void)t;
    *con_cls = NULL;
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code)
{
    (void)cls, (void)c, (void)socket_context, (void)code;
}

int main(int argc, char **argv)
{
    const char *addr = argc > 1 ? argv[1] : "127.0.0.1:0";
    char host[64];
    const char *colon = strrchr(addr, ':');
    if (!colon || (size_t)(colon - addr) >= sizeof host) {
        fprintf(stderr, "usage: %s [ADDR:PORT]\n", argv[0]);
        return 2;
    }
    memcpy(host, addr, (size_t)(colon - addr));
    host[colon - addr] = '\0';
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
        fprintf(stderr, "%s: not an IPv4 address: %s\n", argv[0], host);
        return 2;
    }
    /* Bind ourselves, as ddpd does, and hand MHD the socket. */
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) || listen(fd, 1024)) {
        perror("bind");
        return 1;
    }
    socklen_t len = sizeof sa;
    getsockname(fd, (struct sockaddr *)&sa, &len);

    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);

    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME;
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, 0, NULL, NULL, on_request, NULL, MHD_OPTION_LISTEN_SOCKET, fd, MHD_OPTION_CONNECTION_LIMIT, 1024u,
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, 256u, MHD_OPTION_CONNECTION_TIMEOUT, 60u,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)64 * 1024, MHD_OPTION_NOTIFY_COMPLETED, on_completed, NULL,
        MHD_OPTION_NOTIFY_CONNECTION, on_connection, NULL, MHD_OPTION_THREAD_POOL_SIZE, 4u, MHD_OPTION_END);
    if (!d) {
        fprintf(stderr, "%s: cannot start the daemon\n", argv[0]);
        return 1;
    }
    fprintf(stderr, "bench_hello_mhd: listening on port %d\n", ntohs(sa.sin_port));
    fflush(stderr);
    int sig;
    sigwait(&set, &sig);
    MHD_stop_daemon(d);
    return 0;
}
