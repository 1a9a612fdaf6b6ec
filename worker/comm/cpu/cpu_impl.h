/* comm/cpu/cpu_impl.h — what the files of the CPU collective backend share and nobody else
 * sees: its constants, the communicator's struct, and the cross-file helpers of each concern
 * (sock.c: addresses and blocking socket I/O; hello.c: the handshakes' proofs; root.c: the
 * rendezvous; ring.c: forming the ring among strangers; engine.c: the collective engine and
 * its progress thread; shm.c: same-host FIFOs; cpu.c: the table). */
#ifndef DDPD_COMM_CPU_IMPL_H
#define DDPD_COMM_CPU_IMPL_H

#include "wire.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "../../../base/clock.h"
#include "../../half.h"

#define NOTICE_TAG     0x4444504e        /* "DDPN": a failure notice */
#define CANCEL_TAG     0x44445051        /* "DDPQ": the same, for a rank that was cancelled */
#define SMALL_BYTES    (16 * 1024)       /* all-reduces up to this take the latency path */
#define STAGE_BYTES    (256 * 1024)      /* receive staging of a reduction */
#define SEND_SLICE     (256 * 1024)      /* most bytes handed to one sendmsg */
#define SOCK_BUF       (4 * 1024 * 1024) /* SO_SNDBUF / SO_RCVBUF */
#define ERR_CAP        512
#define ROOT_SEND_S    2.0          /* the root's bound on writing to one rank */
#define SHM_HDR        4096         /* shared FIFO: control page, then the ring of bytes */
#define SHM_CAP        (2u << 20)   /* bytes of a shared FIFO (a power of two) */
#define SHM_PIECE      (128 * 1024) /* most bytes moved before publishing the position */
#define SPIN_S         50e-6        /* a shared-memory wait spins at most this long, then sleeps */
#define SPIN_CATCH_S   5e-6         /* what a spin that catches the bytes saves (a sleep) */
#define SPIN_SLICE_S   250e-6       /* a yield away this long lost a time slice */
#define SPIN_LOSS      0.01         /* share of the time spins may lose without catching ... */
#define SPIN_CREDIT_S  0.01         /* ... saved up to this (see spin_allowed in engine.c) */
#define MAX_ROOT_CONNS 4096         /* connections the root holds at once */

/* Liveness of the ring's TCP links (sock.c, comm_cpu__sock_live and comm_cpu__sock_silent):
 * a peer whose kernel acknowledges nothing for LIVE_S is lost (a node powered off, a
 * network gone), whatever ddp.timeout_s says. Only the peers' kernels answer the probes
 * and acknowledgements this counts, never their processes, so a rank descheduled by a
 * loaded machine (or busy far from any collective) is not taken for lost. */
#define LIVE_S       4.0  /* silence that fails the job */
#define LIVE_CHECK_S 0.25 /* a waiting collective looks at its links this often */
#define KEEP_IDLE_S  1    /* an idle link is probed after this ... */
#define KEEP_INTVL_S 1    /* ... then again this often ... */
#define KEEP_CNT     3    /* ... and the kernel gives up after this many unanswered */
_Static_assert(KEEP_IDLE_S + KEEP_CNT * KEEP_INTVL_S == (int)LIVE_S, "keepalive gives up at LIVE_S");

/* Whoever can reach a rank's ring port or the root may connect (ring.c, root.c). */
#define HELLO_S      5.0 /* an unproven connection is dropped after this */
#define PEND_MAX     16  /* unproven ring connections a rank holds at once */
#define RING_BACKLOG 128 /* the ring listener's queue: strangers wait there, not in SYN retries */
#define DROP_LOG_MAX 20  /* log lines about dropped connections, per rendezvous */

enum { OP_ALLREDUCE = 1, OP_BROADCAST, OP_ALLGATHER, OP_MAX_I64, OP_BARRIER, OP_COUNT };

/* Results of the blocking socket helpers. */
enum { IO_OK = 0, IO_TIMEOUT = -1, IO_CLOSED = -2, IO_ERROR = -3 };

static inline void put16(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 8);
    p[1] = (unsigned char)v;
}

static inline void put32(unsigned char *p, uint32_t v)
{
    put16(p, v >> 16);
    put16(p + 2, v);
}

static inline void put64(unsigned char *p, uint64_t v)
{
    put32(p, (uint32_t)(v >> 32));
    put32(p + 4, (uint32_t)v);
}

static inline uint32_t get16(const unsigned char *p)
{
    return (uint32_t)p[0] << 8 | p[1];
}
static inline uint32_t get32(const unsigned char *p)
{
    return get16(p) << 16 | get16(p + 2);
}
static inline uint64_t get64(const unsigned char *p)
{
    return (uint64_t)get32(p) << 32 | get32(p + 4);
}

/* ---- a communicator ---- */

struct comm_req {
    struct comm_req *qnext;         /* the FIFO queue */
    struct comm_req *lprev, *lnext; /* started all-reduces not yet waited (for free) */
    int op;
    void *buf;
    const void *in;
    size_t bytes;
    int64_t n;
    int root;
    int half; /* all-reduce: 1 when buf holds 16-bit floats of kind hk, not floats */
    half_kind hk;
    int done;
    ddpd_err rc;
};

/* A same-host link: a FIFO of bytes in memory shared by a rank (producer) and its next
 * (consumer), created by the consumer. Positions count bytes since the link began; each
 * side publishes its own and reads the other's. The sleep flags and one-byte pings over
 * the TCP connection wake a side that stopped spinning (see run_plan). */
struct shm_ctl {
    /* The id's secret and a nonce: proof that it is ours. The page can be opened only by
     * whoever may open the rank's fds (/proc/PID/fd), who could read its memory as well. */
    unsigned char secret[SECRET_BYTES];
    unsigned char nonce[16];
    _Alignas(64) _Atomic uint64_t head; /* written by the producer */
    _Alignas(64) _Atomic uint64_t tail; /* written by the consumer */
    _Alignas(64) _Atomic uint32_t cons_sleep;
    _Alignas(64) _Atomic uint32_t prod_sleep;
};
_Static_assert(sizeof(struct shm_ctl) <= SHM_HDR, "the control page holds the control block");

struct link {
    struct shm_ctl *h;   /* NULL: this direction goes over TCP */
    unsigned char *data; /* SHM_CAP bytes after the control page */
    uint64_t pos;        /* producer: next byte to write; consumer: next byte to read */
};

struct cpu {
    int rank, world, prev, next;
    double timeout_s;
    unsigned char secret[SECRET_BYTES]; /* from the id: the key of the handshakes' proofs */

    int fd_next, fd_prev;              /* we only send to next and only receive from prev */
    char next_host[64], prev_host[64]; /* their hosts' addresses, for error texts */
    struct link lout, lin;             /* shared-memory data paths to next / from prev, if same host */

    /* Owned by whichever thread executes collectives (the progress thread or a caller
     * running one inline); `busy`, handed over under mu, says who. */
    uint32_t seq;
    int exec_by_peer;      /* the last collective's failure began at another rank */
    double spin_credit;    /* seconds the spins of shared-memory waits may still lose ... */
    double spin_credit_at; /* ... as of then (spin_allowed in engine.c) */
    float *stage;
    unsigned char *scratch;
    size_t scratch_cap;

    /* Shared, under mu. */
    pthread_mutex_t mu;
    pthread_cond_t work; /* the progress thread sleeps here */
    pthread_cond_t done; /* callers waiting for a request sleep here */
    pthread_t thread;
    int have_thread, have_sync;
    struct comm_req *head, *tail, *live;
    int busy, stopping, failed;
    ddpd_err fail_rc; /* DDPD_ECOMM, or DDPD_ECANCELED when the group ends by a cancel */
    int fail_by_peer; /* the failure began at another rank (comm_ops.failed_by_peer) */
    double run_start;
    char err[ERR_CAP];

    _Atomic uint64_t sent; /* bytes this rank has sent to next, headers included (bytes_sent) */

    char err_copy[ERR_CAP];                      /* what last_error hands the driving thread */
    atomic_int aborted;                          /* abort() may come from any thread or a signal handler */
    atomic_int cancelled;                        /* ... and so may cancel(), which also sets aborted */
    unsigned char abort_notice[NOTICE_HDR + 64]; /* prebuilt: abort() may not format */
    size_t abort_notice_len;
    unsigned char cancel_notice[NOTICE_HDR + 64];
    size_t cancel_notice_len;
};

/* One collective as two byte streams: send segments to next, receive segments from prev.
 * Send segment i (i >= lag) carries what receive segment i-lag brought, so it may only
 * send as far as that segment has been processed: this one rule pipelines the ring
 * (lag 1: reduce-scatter and all-gather steps) and the broadcast chain (lag 0). */
struct plan {
    int op;
    uint32_t arg;   /* broadcast: the root */
    uint64_t bytes; /* as named in the header */
    unsigned char *base;
    int chain; /* 1: one segment, the whole of base[total] */
    size_t total;
    size_t unit, nunits; /* ring: base is nunits units of `unit` bytes in W chunks */
    int nsend, nrecv, lag;
    int nreduce; /* receive segments [0, nreduce) are added into base (elements below) */
    int half;    /* the reduced elements: floats (0) or 16-bit floats of kind hk (1) */
    half_kind hk;
    /* Ring chunks laid out as gloo's ring all-reduce lays them (0: an even split): chunk g
     * holds units [g*gloo_chunk, (g+1)*gloo_chunk) clipped to nunits, and this ring's
     * chunk c is gloo's chunk c-1, so that each element is summed in gloo's order (exactly
     * for up to 3 ranks; see do_allreduce_half in engine.c). */
    size_t gloo_chunk;
};

struct stream {
    int seg;     /* current segment */
    size_t off;  /* bytes of it done (receiving a reduction: added into base) */
    size_t hdr;  /* header bytes done */
    size_t pend; /* receiving a reduction: bytes waiting in stage */
};

/* sock.c */
int comm_cpu__ms_until(double deadline);
socklen_t comm_cpu__addr_to_sa(const struct cpu_addr *a, struct sockaddr_storage *ss);
int comm_cpu__addr_from_sa(const struct sockaddr_storage *ss, struct cpu_addr *a);
void comm_cpu__addr_text(const struct cpu_addr *a, char *buf, size_t cap);
/* The address of the peer of a connected socket, as addr_text writes it ("?" if unknown). */
void comm_cpu__peer_text(int fd, char *buf, size_t cap);
int comm_cpu__listen_addr(struct cpu_addr *a, char *err, size_t cap);
void comm_cpu__sock_tune(int fd);
int comm_cpu__wait_fd(int fd, short events, double deadline);
int comm_cpu__send_all(int fd, const void *buf, size_t len, double deadline);
int comm_cpu__recv_all(int fd, void *buf, size_t len, double deadline);
int comm_cpu__connect_retry(const struct cpu_addr *a, double deadline, int *refused);
/* The address of the peer's host ("10.77.0.3", "::1"; "?" if unknown). */
void comm_cpu__peer_host(int fd, char *buf, size_t cap);
/* Keepalive on a ring link: the kernel probes it after KEEP_IDLE_S without traffic and
 * ends it (ETIMEDOUT) when KEEP_CNT probes go unanswered, LIVE_S after the peer's host
 * fell silent. Failures only cost the early detection. */
void comm_cpu__sock_live(int fd);
/* 1 when the peer's host has answered nothing for live_s (*quiet_s: seconds since it
 * last did) while it owes an answer: data we sent waits for its acknowledgement and was
 * retransmitted, or the link is idle and keepalive probes it. 0 otherwise: also for a
 * receiver that merely does not read (its kernel answers with a closed window), and for a
 * socket that is not TCP or already ended (its reads and writes report why). */
int comm_cpu__sock_silent(int fd, double live_s, double *quiet_s);
/* Formats into buf (when cap > 0) and returns -1, so that error paths read
 * `return comm_cpu__fmt_err(...)`. */
int comm_cpu__fmt_err(char *buf, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
const char *comm_cpu__io_text(int io);

/* root.c */
int comm_cpu__rendezvous(struct cpu *c, int fd, const struct cpu_addr *root, const struct cpu_addr *me,
                         double deadline, struct cpu_addr *table, char *err, size_t cap);

/* ring.c */
int comm_cpu__form_ring(struct cpu *c, int lfd, const struct cpu_addr *table, double deadline, char *err,
                        size_t cap);

/* engine.c */
void comm_cpu__shut_sockets(struct cpu *c);
size_t comm_cpu__notice_put(unsigned char *buf, size_t cap, int origin, int cancel, const char *text);
void comm_cpu__set_failed(struct cpu *c, ddpd_err rc, const char *text, int by_peer);
int comm_cpu__check_usable(struct cpu *c);
void *comm_cpu__progress_main(void *arg);
void comm_cpu__enqueue(struct cpu *c, struct comm_req *q);
ddpd_err comm_cpu__wait_done(struct cpu *c, struct comm_req *q);
ddpd_err comm_cpu__blocking(struct cpu *c, struct comm_req *q);

/* shm.c */
size_t comm_cpu__shm_room(const struct link *L);
size_t comm_cpu__shm_put(struct cpu *c, const struct iovec *iov, int cnt);
size_t comm_cpu__shm_avail(const struct link *L, const unsigned char **ptr);
int comm_cpu__shm_usable(const struct cpu *c, const struct plan *p, const struct stream *r);
void comm_cpu__shm_consume(struct cpu *c, size_t n);
void comm_cpu__link_unmap(struct link *L);
int comm_cpu__shm_setup(struct cpu *c, double deadline, char *err, size_t cap);

#endif
