/* hello_mhd.c — the baseline of bench/server: a raw libmicrohttpd server with the thread
 * setup of ddpd's HTTP layer (server/http.c: an internal epoll polling thread, a pool of
 * 4, suspend/resume allowed, the same connection limits, timeout and memory limit) that
 * answers every request with a small fixed JSON body. Bodies (POST) are read and dropped.
 * Like ddpd it answers on the final call of the access handler, so keep-alive holds.
 *
 * With --insert DB, each POST's body is instead kept and stored before the answer: one
 * INSERT of the body into a table of DB (SQLite, WAL, synchronous=NORMAL, one prepared
 * statement, one transaction per POST, under one lock) on the HTTP thread. That is the
 * least a server must do to keep what was POSTed across its own crash, the floor under
 * ddpd's POST /v1/jobs (which also validates, writes the canonical spec, queues an event
 * and answers the stored job).
 *
 * Usage: bench_hello_mhd [ADDR:PORT] [--insert DB]   (default 127.0.0.1:0)
 * Prints "bench_hello_mhd: listening on port N" on stderr and serves until SIGINT/SIGTERM. */
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static const char BODY[] = "{\"id\":1,\"name\":\"hello\",\"state\":\"queued\",\"step\":null,\"loss\":null}\n";

/* --insert: the store, its statement and the lock around both. */
static sqlite3 *db;
static sqlite3_stmt *ins;
static pthread_mutex_t db_mu = PTHREAD_MUTEX_INITIALIZER;

struct req {
    char *body;
    size_t len, cap;
};

static int first_call_marker;

static enum MHD_Result answer(struct MHD_Connection *c, unsigned status)
{
    struct MHD_Response *r =
        MHD_create_response_from_buffer(sizeof BODY - 1, (void *)BODY, MHD_RESPMEM_PERSISTENT);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    enum MHD_Result rc = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size,
                                  void **con_cls)
{
    (void)cls, (void)url, (void)version;
    bool keep = db && strcmp(method, "POST") == 0;
    if (*con_cls == NULL) { /* headers complete: answer later, on the final call */
        *con_cls = keep ? calloc(1, sizeof(struct req)) : &first_call_marker;
        return *con_cls ? MHD_YES : MHD_NO;
    }
    if (*upload_size) { /* a chunk of body: drop it, or keep it with --insert */
        struct req *q = keep ? *con_cls : NULL;
        if (q) {
            if (q->len + *upload_size > q->cap) {
                size_t cap = q->cap ? q->cap : 4096;
                while (cap < q->len + *upload_size)
                    cap *= 2;
                char *b = realloc(q->body, cap);
                if (!b)
                    return MHD_NO;
                q->body = b;
                q->cap = cap;
            }
            memcpy(q->body + q->len, upload, *upload_size);
            q->len += *upload_size;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (!keep)
        return answer(c, MHD_HTTP_OK);
    struct req *q = *con_cls;
    pthread_mutex_lock(&db_mu);
    sqlite3_bind_text(ins, 1, q->body ? q->body : "", (int)q->len, SQLITE_STATIC);
    int rc = sqlite3_step(ins);
    sqlite3_reset(ins);
    sqlite3_clear_bindings(ins);
    pthread_mutex_unlock(&db_mu);
    return answer(c, rc == SQLITE_DONE ? MHD_HTTP_CREATED : MHD_HTTP_INTERNAL_SERVER_ERROR);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode t)
{
    (void)cls, (void)c, (void)t;
    if (*con_cls && *con_cls != &first_call_marker) {
        struct req *q = *con_cls;
        free(q->body);
        free(q);
    }
    *con_cls = NULL;
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code)
{
    (void)cls, (void)c, (void)socket_context, (void)code;
}

int main(int argc, char **argv)
{
    const char *addr = "127.0.0.1:0", *dbpath = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--insert") == 0 && i + 1 < argc)
            dbpath = argv[++i];
        else
            addr = argv[i];
    }
    if (dbpath) {
        const char *sql = "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA busy_timeout=5000;"
                          "CREATE TABLE IF NOT EXISTS posts (id INTEGER PRIMARY KEY, body TEXT NOT NULL);";
        if (sqlite3_open(dbpath, &db) != SQLITE_OK || sqlite3_exec(db, sql, NULL, NULL, NULL) != SQLITE_OK ||
            sqlite3_prepare_v2(db, "INSERT INTO posts (body) VALUES (?)", -1, &ins, NULL) != SQLITE_OK) {
            fprintf(stderr, "%s: %s: %s\n", argv[0], dbpath, db ? sqlite3_errmsg(db) : "cannot open");
            return 1;
        }
    }
    char host[64];
    const char *colon = strrchr(addr, ':');
    if (!colon || (size_t)(colon - addr) >= sizeof host) {
        fprintf(stderr, "usage: %s [ADDR:PORT] [--insert DB]\n", argv[0]);
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
        flags, 0, NULL, NULL, on_request, NULL, MHD_OPTION_LISTEN_SOCKET, fd, MHD_OPTION_CONNECTION_LIMIT,
        1024u, MHD_OPTION_PER_IP_CONNECTION_LIMIT, 256u, MHD_OPTION_CONNECTION_TIMEOUT, 60u,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)64 * 1024, MHD_OPTION_NOTIFY_COMPLETED, on_completed,
        NULL, MHD_OPTION_NOTIFY_CONNECTION, on_connection, NULL, MHD_OPTION_THREAD_POOL_SIZE, 4u,
        MHD_OPTION_END);
    if (!d) {
        fprintf(stderr, "%s: cannot start the daemon\n", argv[0]);
        return 1;
    }
    fprintf(stderr, "bench_hello_mhd: listening on port %d\n", ntohs(sa.sin_port));
    fflush(stderr);
    int sig;
    sigwait(&set, &sig);
    MHD_stop_daemon(d);
    if (db) {
        sqlite3_finalize(ins);
        sqlite3_close(db);
    }
    return 0;
}
