/* comm/cpu/hello.c — the handshakes' messages and proofs (wire.h, "the handshakes"): the
 * root's challenge, a rank's registration proof, the ring hello and its proofs, as
 * HMAC-SHA256 under the id's secret over fresh nonces (OpenSSL's libcrypto). Pure
 * functions but for the nonces; no I/O. The secret is a key here and nothing else: no
 * message carries it. */
#include "cpu_impl.h"

#include <stdio.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#define CHALLENGE_TAG 0x44445043 /* "DDPC" */
#define HELLO_TAG     0x44445048 /* "DDPH" */

/* Labels keep the three proofs apart: a MAC made for one never serves as another. */
static const char reg_label[] = "ddpd cpu registration";
static const char connector_label[] = "ddpd cpu ring connector";
static const char listener_label[] = "ddpd cpu ring listener";
_Static_assert(sizeof connector_label >= sizeof listener_label,
               "ring_proof sizes its buffer by the longer label");

int comm_cpu__nonce(unsigned char nonce[NONCE_BYTES])
{
    return RAND_bytes(nonce, NONCE_BYTES) == 1 ? 0 : -1;
}

/* HMAC-SHA256(secret, msg[len]) into out; on a libcrypto failure, zeros and -1. */
static int mac(const unsigned char secret[SECRET_BYTES], const unsigned char *msg, size_t len,
               unsigned char out[PROOF_BYTES])
{
    unsigned int n = 0;
    if (!HMAC(EVP_sha256(), secret, SECRET_BYTES, msg, len, out, &n) || n != PROOF_BYTES) {
        memset(out, 0, PROOF_BYTES);
        return -1;
    }
    return 0;
}

/* ---- registration ---- */

void comm_cpu__challenge_put(unsigned char ch[CHALLENGE_BYTES], const unsigned char nonce[NONCE_BYTES])
{
    put32(ch, CHALLENGE_TAG);
    put32(ch + 4, PROTO_VERSION);
    memcpy(ch + 8, nonce, NONCE_BYTES);
}

int comm_cpu__challenge_decode(const unsigned char ch[CHALLENGE_BYTES], unsigned char nonce[NONCE_BYTES])
{
    if (get32(ch) != CHALLENGE_TAG || get32(ch + 4) != PROTO_VERSION)
        return -1;
    memcpy(nonce, ch + 8, NONCE_BYTES);
    return 0;
}

int comm_cpu__reg_proof(const unsigned char secret[SECRET_BYTES], const unsigned char nonce[NONCE_BYTES],
                        const unsigned char body[REG_BODY_BYTES], unsigned char proof[PROOF_BYTES])
{
    unsigned char msg[sizeof reg_label + NONCE_BYTES + REG_BODY_BYTES];
    memcpy(msg, reg_label, sizeof reg_label);
    memcpy(msg + sizeof reg_label, nonce, NONCE_BYTES);
    memcpy(msg + sizeof reg_label + NONCE_BYTES, body, REG_BODY_BYTES);
    return mac(secret, msg, sizeof msg, proof);
}

void comm_cpu__reg_put(unsigned char reg[REG_BYTES], const unsigned char secret[SECRET_BYTES],
                       const unsigned char nonce[NONCE_BYTES], int rank, int world,
                       const struct cpu_addr *addr)
{
    memset(reg, 0, REG_BYTES);
    put32(reg, PROTO_VERSION);
    put32(reg + 4, (uint32_t)rank);
    put32(reg + 8, (uint32_t)world);
    comm_cpu__addr_put(reg + 12, addr);
    comm_cpu__reg_proof(secret, nonce, reg, reg + REG_BODY_BYTES);
}

int comm_cpu__reg_decode(const unsigned char reg[REG_BYTES], const unsigned char secret[SECRET_BYTES],
                         const unsigned char nonce[NONCE_BYTES], struct cpu_reg *out, char *text, size_t cap)
{
    unsigned char want[PROOF_BYTES];
    if (get32(reg) != PROTO_VERSION) {
        snprintf(text, cap, "malformed registration (another ddpd version?)");
        return -1;
    }
    if (comm_cpu__reg_proof(secret, nonce, reg, want) < 0 ||
        CRYPTO_memcmp(want, reg + REG_BODY_BYTES, PROOF_BYTES) != 0) {
        snprintf(text, cap,
                 "wrong proof: the id this rank was given does not belong to this rendezvous (a stale id "
                 "from an earlier attempt?)");
        return -1;
    }
    out->rank = get32(reg + 4);
    out->world = get32(reg + 8);
    if (comm_cpu__addr_get(reg + 12, &out->addr) < 0) {
        snprintf(text, cap, "malformed registration (no listening address)");
        return -1;
    }
    if (out->world < 1 || out->world > MAX_WORLD) {
        snprintf(text, cap, "world size %u is out of range (1..%d)", out->world, MAX_WORLD);
        return -1;
    }
    return 0;
}

/* ---- the ring ---- */

void comm_cpu__hello_put(unsigned char h[HELLO_BYTES], int rank, int world,
                         const unsigned char nonce[NONCE_BYTES])
{
    put32(h, HELLO_TAG);
    put32(h + 4, PROTO_VERSION);
    put32(h + 8, (uint32_t)rank);
    put32(h + 12, (uint32_t)world);
    memcpy(h + 16, nonce, NONCE_BYTES);
}

int comm_cpu__hello_decode(const unsigned char h[HELLO_BYTES], int expect, int world, struct cpu_hello *out,
                           char *why, size_t cap)
{
    if (get32(h) != HELLO_TAG)
        return comm_cpu__fmt_err(why, cap, "not a ring hello");
    if (get32(h + 4) != PROTO_VERSION)
        return comm_cpu__fmt_err(why, cap,
                                 "a ring hello of protocol version %u, not %d (another ddpd version?)",
                                 get32(h + 4), PROTO_VERSION);
    out->rank = get32(h + 8);
    out->world = get32(h + 12);
    if (out->rank != (uint32_t)expect || out->world != (uint32_t)world)
        return comm_cpu__fmt_err(why, cap, "it says it is rank %u of %u, not rank %d of %d", out->rank,
                                 out->world, expect, world);
    memcpy(out->nonce, h + 16, NONCE_BYTES);
    return 0;
}

int comm_cpu__ring_proof(const unsigned char secret[SECRET_BYTES], int role, int from, int to, int world,
                         const unsigned char nonce_from[NONCE_BYTES],
                         const unsigned char nonce_to[NONCE_BYTES], unsigned char proof[PROOF_BYTES])
{
    /* The longer label sizes the buffer; each proof MACs its own label's bytes only. */
    unsigned char msg[sizeof connector_label + 12 + 2 * NONCE_BYTES];
    const char *label = role == RING_CONNECTOR ? connector_label : listener_label;
    size_t n = strlen(label) + 1;
    memcpy(msg, label, n);
    put32(msg + n, (uint32_t)from);
    put32(msg + n + 4, (uint32_t)to);
    put32(msg + n + 8, (uint32_t)world);
    memcpy(msg + n + 12, nonce_from, NONCE_BYTES);
    memcpy(msg + n + 12 + NONCE_BYTES, nonce_to, NONCE_BYTES);
    return mac(secret, msg, n + 12 + 2 * NONCE_BYTES, proof);
}

int comm_cpu__ring_proof_check(const unsigned char secret[SECRET_BYTES], int role, int from, int to,
                               int world, const unsigned char nonce_from[NONCE_BYTES],
                               const unsigned char nonce_to[NONCE_BYTES],
                               const unsigned char got[PROOF_BYTES])
{
    unsigned char want[PROOF_BYTES];
    if (comm_cpu__ring_proof(secret, role, from, to, world, nonce_from, nonce_to, want) < 0)
        return 0;
    return CRYPTO_memcmp(want, got, PROOF_BYTES) == 0;
}
