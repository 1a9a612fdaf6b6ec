/* comm/cpu/wire.h — the wire formats of the CPU collective backend (comm/cpu/), shared with its
 * unit tests and its fuzz target: sizes, addresses, the handshakes' proofs, and pure
 * decoders of the bytes a peer sends (the root's challenge, a rank's registration, the
 * root's messages, a ring hello, a failure notice, a shared-memory offer, a collective
 * header). The decoders read only the buffer they are given, trust none of the numbers in
 * it, and do no I/O. Not a public API. */
#ifndef DDPD_COMM_CPU_WIRE_H
#define DDPD_COMM_CPU_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "../../comm.h"

#define MAX_WORLD       1024 /* a registration claiming more is refused */
#define SECRET_BYTES    16   /* the id's secret: the key of every proof, never sent */
#define NONCE_BYTES     32   /* a fresh random challenge, one per connection and side */
#define PROOF_BYTES     32   /* HMAC-SHA256 under the secret */
#define ADDR_BYTES      20   /* family, port, 16 address bytes (see addr_put) */
#define CHALLENGE_BYTES 40   /* root -> rank on accept: tag, version, nonce */
#define REG_BODY_BYTES  32   /* a registration's fields: version, rank, world, address */
#define REG_BYTES       64   /* a rank's registration with the root: body, proof */
#define MSG_HDR_BYTES   8    /* root -> rank messages: type, length */
#define MSG_TEXT_MAX    512  /* longest error text the root sends */
#define HELLO_BYTES     48   /* ring neighbours, each way: tag, version, rank, world, nonce */
#define HDR_BYTES       24   /* per-collective header on the ring */
#define NOTICE_HDR      12   /* failure notice: tag, origin rank, text length */
#define NOTICE_TEXT_MAX 400
#define SHM_OFFER_BYTES 32 /* tag, pid, fd, FIFO size, nonce */
#define PROTO_VERSION   2  /* 2: the handshakes prove the secret instead of sending it */

/* ---- the handshakes (docs/security.md says what they protect) ----
 *
 * The id (printed by the issuer, handed to each rank on its stdin) holds a secret of
 * SECRET_BYTES, drawn afresh for every attempt, and the root's address. The secret never
 * crosses the wire: it is the key of HMAC-SHA256, and each side of a connection proves
 * that it holds it by a MAC over a nonce the other side has just drawn. What someone
 * recorded of one group proves nothing to a later group (another secret, other nonces),
 * nor to the same group again (other nonces). Integers are big-endian, 4 bytes.
 *
 * Registration, a rank with the root:
 *   root, on accepting:  CHALLENGE  "DDPC" | version | nonce_root                     40 bytes
 *   rank:                REG        version | rank | world | address | proof           64 bytes
 *       proof = HMAC(secret, "ddpd cpu registration\0" | nonce_root | the 32 bytes before it)
 *   then the root's messages (MSG_*): progress, an error text, or the table of addresses.
 *
 * The ring, rank p connecting to its next n (the address the table gives), world W:
 *   each side at once:   HELLO      "DDPH" | version | its rank | W | its nonce         48 bytes
 *   p, on n's hello:     PROOF      HMAC(secret, "ddpd cpu ring connector\0" | p | n | W | nonce_p | nonce_n)
 *   n, once p's proof holds:
 *                        PROOF      HMAC(secret, "ddpd cpu ring listener\0" | p | n | W | nonce_p | nonce_n)
 * A listener keeps accepting until its prev has proven itself or the deadline passes;
 * whatever else connects is dropped and logged (not a hello, another rank, a wrong proof,
 * silent past HELLO_S). A connector fails when the listener's hello or proof is wrong:
 * nothing but the rank of the table can prove itself at that address. */

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

/* An address as the id, the registration and the table carry it: family (4 or 6), port,
 * 16 address bytes (an IPv4 address uses the first 4). get: 0, or -1 when malformed. */
void comm_cpu__addr_put(unsigned char p[ADDR_BYTES], const struct cpu_addr *a);
int comm_cpu__addr_get(const unsigned char p[ADDR_BYTES], struct cpu_addr *a);

/* The id: bytes 0..15 the secret, 16..35 the root's address, the rest zero. 0, or -1 when
 * malformed. */
int comm_cpu__id_decode(const struct comm_id *id, unsigned char secret[SECRET_BYTES], struct cpu_addr *root);

/* A fresh nonce from OpenSSL's CSPRNG: 0, or -1 when it has none to give. */
int comm_cpu__nonce(unsigned char nonce[NONCE_BYTES]);

/* The root's challenge, and a rank's reading of it: 0 with the nonce, or -1 when it is not
 * a challenge of this protocol version. */
void comm_cpu__challenge_put(unsigned char ch[CHALLENGE_BYTES], const unsigned char nonce[NONCE_BYTES]);
int comm_cpu__challenge_decode(const unsigned char ch[CHALLENGE_BYTES], unsigned char nonce[NONCE_BYTES]);

/* The proof that ends a registration: over the root's nonce and the body before it. 0, or
 * -1 when libcrypto fails (proof is then zeros, which the root refuses). */
int comm_cpu__reg_proof(const unsigned char secret[SECRET_BYTES], const unsigned char nonce[NONCE_BYTES],
                        const unsigned char body[REG_BODY_BYTES], unsigned char proof[PROOF_BYTES]);

/* A registration of `rank` of `world` listening at `addr`, proven for the root's nonce. */
void comm_cpu__reg_put(unsigned char reg[REG_BYTES], const unsigned char secret[SECRET_BYTES],
                       const unsigned char nonce[NONCE_BYTES], int rank, int world,
                       const struct cpu_addr *addr);

/* The checks of a registration that need no state of the root but its secret and the
 * nonce it sent: the protocol version, the proof, the address, the world size range. 0, or
 * -1 with the sentence the root sends back in `text`. The rank is checked against the world
 * by the root (rank < world). */
int comm_cpu__reg_decode(const unsigned char reg[REG_BYTES], const unsigned char secret[SECRET_BYTES],
                         const unsigned char nonce[NONCE_BYTES], struct cpu_reg *out, char *text, size_t cap);

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

/* A ring hello: the sender's rank, the world, and the nonce the peer must prove itself over. */
struct cpu_hello {
    uint32_t rank, world;
    unsigned char nonce[NONCE_BYTES];
};
void comm_cpu__hello_put(unsigned char h[HELLO_BYTES], int rank, int world,
                         const unsigned char nonce[NONCE_BYTES]);

/* A ring hello that should come from rank `expect` of `world`: 0 with its fields, or -1
 * with why not in `why` ("not a ring hello", "another protocol version", "it says it is
 * rank 3 of 4, not rank 1 of 4"). Proves nothing: the proof that follows does. */
int comm_cpu__hello_decode(const unsigned char h[HELLO_BYTES], int expect, int world, struct cpu_hello *out,
                           char *why, size_t cap);

/* Who owes a ring proof: the rank that connected (prev), or the one that listened (next). */
enum { RING_CONNECTOR = 1, RING_LISTENER = 2 };

/* The proof `role` owes on the ring link from rank `from` (the connector, whose nonce is
 * nonce_from) to rank `to` (the listener, nonce_to) in a world of `world`. 0, or -1 when
 * libcrypto fails (proof is then zeros, which no peer accepts). */
int comm_cpu__ring_proof(const unsigned char secret[SECRET_BYTES], int role, int from, int to, int world,
                         const unsigned char nonce_from[NONCE_BYTES],
                         const unsigned char nonce_to[NONCE_BYTES], unsigned char proof[PROOF_BYTES]);

/* 1 when `got` is that proof (compared in constant time), else 0. */
int comm_cpu__ring_proof_check(const unsigned char secret[SECRET_BYTES], int role, int from, int to,
                               int world, const unsigned char nonce_from[NONCE_BYTES],
                               const unsigned char nonce_to[NONCE_BYTES],
                               const unsigned char got[PROOF_BYTES]);

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
