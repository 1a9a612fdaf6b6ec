/* comm/cpu/shm.c — same-host links of the CPU backend: a FIFO of bytes in shared memory
 * from a rank to its next, offered and accepted over the ring's TCP connection, and its
 * producer and consumer sides. Knows nothing of the collectives that use it. */
#include "cpu_impl.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

/* A one-byte wake-up for a peer that sleeps in poll() on this connection. */
static void ping(int fd)
{
    static const unsigned char zero = 0;
    (void)!send(fd, &zero, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
}

/* Bytes the producer may write now, in whole 8-byte units. The position can run up to 7
 * bytes past a full FIFO (alignment padding, see run_plan), hence the guard. The consumer's
 * padding at the start of a collective is not published until it first consumes, so the
 * raw room can be a few bytes odd; a put that used them would end the FIFO in the middle
 * of a float, which a reducing consumer cannot take. Were this producer then to die, the
 * consumer would see bytes it can never use, and those bytes used to keep it spinning,
 * past its deadline and blind to the hang-up (issue 15, item 19). Rounding here, where
 * both comm_cpu__shm_put and the wait's re-check read it, keeps them agreeing on "no room". */
size_t comm_cpu__shm_room(const struct link *L)
{
    uint64_t used = L->pos - atomic_load_explicit(&L->h->tail, memory_order_acquire);
    return used >= SHM_CAP ? 0 : (SHM_CAP - (size_t)used) & ~(size_t)7;
}

/* Copies as much of iov as fits into the FIFO to next and publishes it. */
size_t comm_cpu__shm_put(struct cpu *c, const struct iovec *iov, int cnt)
{
    struct link *L = &c->lout;
    size_t room = comm_cpu__shm_room(L), done = 0;
    if (room > SHM_PIECE)
        room = SHM_PIECE;
    for (int i = 0; i < cnt && done < room; i++) {
        const unsigned char *src = iov[i].iov_base;
        size_t n = iov[i].iov_len < room - done ? iov[i].iov_len : room - done;
        while (n > 0) {
            size_t off = (size_t)(L->pos & (SHM_CAP - 1));
            size_t k = n < SHM_CAP - off ? n : SHM_CAP - off;
            memcpy(L->data + off, src, k);
            L->pos += k;
            src += k;
            n -= k;
            done += k;
        }
    }
    if (done) {
        /* seq_cst pairs with the consumer's "set cons_sleep, re-read head": one of the
         * two sees the other, so a wake-up is never lost. */
        atomic_store(&L->h->head, L->pos);
        if (atomic_load(&L->h->cons_sleep) && atomic_exchange(&L->h->cons_sleep, 0))
            ping(c->fd_next);
    }
    return done;
}

/* Contiguous bytes readable at the consumer's position (0 when none). */
size_t comm_cpu__shm_avail(const struct link *L, const unsigned char **ptr)
{
    uint64_t head = atomic_load_explicit(&L->h->head, memory_order_acquire);
    if ((int64_t)(head - L->pos) <= 0)
        return 0;
    size_t off = (size_t)(L->pos & (SHM_CAP - 1));
    size_t n = (size_t)(head - L->pos);
    *ptr = L->data + off;
    return n < SHM_CAP - off ? n : SHM_CAP - off;
}

/* Whether the consumer can take anything at its position now: bytes, and for a reducing
 * segment at least one whole element (a stray fragment is nothing it can use). */
int comm_cpu__shm_usable(const struct cpu *c, const struct plan *p, const struct stream *r)
{
    const unsigned char *src;
    size_t n = comm_cpu__shm_avail(&c->lin, &src);
    if (r->hdr == HDR_BYTES && r->seg < p->nreduce)
        return n >= (p->half ? sizeof(uint16_t) : sizeof(float));
    return n > 0;
}

void comm_cpu__shm_consume(struct cpu *c, size_t n)
{
    struct link *L = &c->lin;
    L->pos += n;
    atomic_store(&L->h->tail, L->pos);
    if (atomic_load(&L->h->prod_sleep) && atomic_exchange(&L->h->prod_sleep, 0))
        ping(c->fd_prev);
}

/* ---- same-host links ---- */

#define SHM_OFFER_TAG 0x53484d4f /* "SHMO" */
#define SHM_ACK_TAG   0x53484d41 /* "SHMA" */

/* DDPD_COMM_SHM=0 keeps every link on TCP (for tests, or to rule the FIFOs out). */
static int shm_enabled(void)
{
    const char *v = getenv("DDPD_COMM_SHM");
    return !(v && !strcmp(v, "0"));
}

/* Creates this rank's incoming FIFO in a memfd. Returns the fd, which must stay open until
 * prev has opened it through /proc, or -1 (the link then stays on TCP). */
static int shm_create(struct cpu *c, unsigned char nonce[16])
{
    if (!shm_enabled())
        return -1;
    int fd = memfd_create("ddpd-ring", MFD_CLOEXEC);
    if (fd < 0)
        return -1;
    size_t len = SHM_HDR + SHM_CAP;
    void *m = MAP_FAILED;
    if (ftruncate(fd, (off_t)len) == 0)
        m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED || getrandom(nonce, 16, 0) != 16) {
        if (m != MAP_FAILED)
            munmap(m, len);
        close(fd);
        return -1;
    }
    struct shm_ctl *h = m;
    memcpy(h->secret, c->secret, SECRET_BYTES);
    memcpy(h->nonce, nonce, 16);
    atomic_store(&h->head, 0);
    atomic_store(&h->tail, 0);
    atomic_store(&h->cons_sleep, 0);
    atomic_store(&h->prod_sleep, 0);
    c->lin = (struct link){h, (unsigned char *)m + SHM_HDR, 0};
    return fd;
}

/* Maps next's FIFO, offered as (pid, fd, nonce). Only a process on this host, in our PID
 * namespace, can be opened this way, and the secret and nonce prove it is the right one:
 * a pid that names some other process on another host's behalf fails the check. */
static int shm_open_peer(struct cpu *c, uint32_t pid, uint32_t fdnum, const unsigned char *nonce)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%u/fd/%u", pid, fdnum);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return -1;
    size_t len = SHM_HDR + SHM_CAP;
    struct stat st;
    void *m = MAP_FAILED;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && (size_t)st.st_size == len)
        m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED)
        return -1;
    struct shm_ctl *h = m;
    if (memcmp(h->secret, c->secret, SECRET_BYTES) != 0 || memcmp(h->nonce, nonce, 16) != 0) {
        munmap(m, len);
        return -1;
    }
    c->lout = (struct link){h, (unsigned char *)m + SHM_HDR, 0};
    return 0;
}

void comm_cpu__link_unmap(struct link *L)
{
    if (L->h)
        munmap(L->h, SHM_HDR + SHM_CAP);
    L->h = NULL;
}

int comm_cpu__shm_offer_decode(const unsigned char offer[SHM_OFFER_BYTES], uint32_t *pid, uint32_t *fdnum)
{
    *pid = get32(offer + 4);
    *fdnum = get32(offer + 8);
    return get32(offer) == SHM_OFFER_TAG && *pid != 0 && get32(offer + 12) == SHM_CAP;
}

/* Moves each ring link onto a shared FIFO where both ends share this host; a link whose
 * ends cannot (other host, other PID namespace, DDPD_COMM_SHM=0) stays on TCP. Each
 * rank offers its incoming FIFO to prev, maps next's, and the producer's answer decides,
 * so both ends of a link always agree. Fails only when the TCP connections do. */
int comm_cpu__shm_setup(struct cpu *c, double deadline, char *err, size_t cap)
{
    unsigned char offer[SHM_OFFER_BYTES] = {0}, theirs[SHM_OFFER_BYTES], ack[8], ack_in[8];
    unsigned char nonce[16] = {0};
    int rc = -1, io;
    int mfd = shm_create(c, nonce);
    put32(offer, SHM_OFFER_TAG);
    put32(offer + 4, mfd >= 0 ? (uint32_t)getpid() : 0);
    put32(offer + 8, mfd >= 0 ? (uint32_t)mfd : 0);
    put32(offer + 12, SHM_CAP);
    memcpy(offer + 16, nonce, 16);
    io = comm_cpu__send_all(c->fd_prev, offer, sizeof offer, deadline);
    if (io != IO_OK) {
        comm_cpu__fmt_err(err, cap, "ring: offering shared memory to rank %d: %s", c->prev,
                          comm_cpu__io_text(io));
        goto out;
    }
    io = comm_cpu__recv_all(c->fd_next, theirs, sizeof theirs, deadline);
    if (io != IO_OK) {
        comm_cpu__fmt_err(err, cap, "ring: shared-memory offer from rank %d: %s", c->next,
                          comm_cpu__io_text(io));
        goto out;
    }
    uint32_t pid = 0, fdnum = 0;
    int ok = comm_cpu__shm_offer_decode(theirs, &pid, &fdnum) && shm_enabled() &&
             shm_open_peer(c, pid, fdnum, theirs + 16) == 0;
    put32(ack, SHM_ACK_TAG);
    put32(ack + 4, (uint32_t)ok);
    io = comm_cpu__send_all(c->fd_next, ack, sizeof ack, deadline);
    if (io != IO_OK) {
        comm_cpu__fmt_err(err, cap, "ring: answering rank %d: %s", c->next, comm_cpu__io_text(io));
        goto out;
    }
    io = comm_cpu__recv_all(c->fd_prev, ack_in, sizeof ack_in, deadline);
    if (io != IO_OK) {
        comm_cpu__fmt_err(err, cap, "ring: shared-memory answer from rank %d: %s", c->prev,
                          comm_cpu__io_text(io));
        goto out;
    }
    if (get32(ack_in) != SHM_ACK_TAG || get32(ack_in + 4) != 1)
        comm_cpu__link_unmap(&c->lin);
    rc = 0;
out:
    if (mfd >= 0)
        close(mfd);
    return rc;
}
