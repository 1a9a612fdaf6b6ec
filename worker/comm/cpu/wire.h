/* comm/cpu/wire.h — the wire formats of the CPU collective backend (comm/cpu/), shared with its
 * unit test and its fuzz target: sizes, addresses, and pure decoders of the bytes a peer
 * sends (a rank's registration with the root, the root's messages, a ring hello, a failure
 * notice, a shared-memory offer, a collective header). The decoders read only the buffer
 * they are given, trust none of the numbers in it, and do no I/O. Not a public API. */
#ifndef DDPD_COMM_CPU_WIRE_H
#define DDPD_COMM_CPU_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "../../comm.h"

#define MAX_WORLD       1024 /* a registration claiming more is refused */
#define MAGIC_BYTES     16
#define ADDR_BYTES      20  /* family, port, 16 address bytes (see addr_put) */
#define REG_BYTES       64  /* a rank's registration with the root */
#define MSG_HDR_BYTES   8   /* root -> rank messages: type, length */
#define MSG_TEXT_MAX    512 /* longest error text the root sends */
#define HELLO_BYTES     24  /* ring neighbours: magic, rank, tag */
#define HDR_BYTES       24  /* per-collective header on the ring */
#define NOTICE_HDR      12  /* failure notice: tag, origin rank, text length */
#define NOTICE_TEXT_MAX 400
#define SHM_OFFER_BYTES 32 /* tag, pid, fd, FIFO size, nonce */

enum { MSG_PROGRESS = 1, MSG_ERROR = 2, MSG_TABLE = 3 };

struct cpu_addr {
    int family;           /* AF_INET or AF_INET6 */
    uint16_t port;        /* host order */
    unsigned char ip[16]; /* 4 bytes used for AF_INET */
};

/* A rank's registration with the root, as the root read it. */
struct cpu_reg {
    uint32_t rank, world;
    struct cpu_addr addr;
};

/* The id: bytes 0..15 magic, 16..35 the root's address, the rest zero. 0, or -1 when
 * malformed. */
int comm_cpu__id_decode(const struct comm_id *id, unsigned char magic[MAGIC_BYTES], struct cpu_addr *root);

/* The checks of a registration that need no state of the root: the magic, the protocol
 * version, the address, the world size range. 0, or -1 with the sentence the root sends
 * back in `text`. The rank is checked against the world by the root (rank < world). */
int comm_cpu__reg_decode(const unsigned char reg[REG_BYTES], const unsigned char magic[MAGIC_BYTES],
                         struct cpu_reg *out, char *text, size_t cap);

/* A root -> rank message header for a rank of `world`: 0 with its type and length (exactly
 * what the type holds; an error text at most MSG_TEXT_MAX), or -1 when malformed. The
 * length is checked before the caller allocates anything for the payload. */
int comm_cpu__msg_head(const unsigned char h[MSG_HDR_BYTES], int world, uint32_t *type, uint32_t *len);

/* The payload of a message that passed comm_cpu__msg_head (`len` bytes, room for len + 1).
 * MSG_PROGRESS: *registered = ranks in so far. MSG_ERROR: the text is made printable ASCII
 * and NUL-terminated in place. MSG_TABLE: table[world] of the ranks' addresses. 0, or -1
 * for a malformed table. */
int comm_cpu__msg_body(uint32_t type, unsigned char *payload, uint32_t len, int world, struct cpu_addr *table,
                       int *registered);

/* A ring hello from the rank `expect`: 0, or -1 with the reason in err. */
int comm_cpu__hello_check(const unsigned char h[HELLO_BYTES], const unsigned char magic[MAGIC_BYTES],
                          int expect, char *err, size_t cap);

/* What a rank read from next when it expected nothing (k > 0 bytes): 0 when they are only
 * wake-up pings (zero bytes); 1 for a failure notice from a rank < world, 2 for a cancel
 * notice (the origin rank was cancelled), each with its origin and its text made printable
 * (text holds NOTICE_TEXT_MAX + 1); -1 for anything else (the caller reports the peer's
 * hang-up). */
int comm_cpu__notice_decode(const unsigned char *buf, size_t k, int world, int *origin,
                            char text[NOTICE_TEXT_MAX + 1]);

/* A shared-memory offer from next: 1 when it is well formed (the tag, a pid, the FIFO size
 * this build uses), with the pid and fd number to open; else 0. */
int comm_cpu__shm_offer_decode(const unsigned char offer[SHM_OFFER_BYTES], uint32_t *pid, uint32_t *fdnum);

/* A received collective header in words ("allreduce #7 of 4096 bytes"), for error texts. */
void comm_cpu__header_describe(const unsigned char h[HDR_BYTES], char *buf, size_t cap);

#endif
