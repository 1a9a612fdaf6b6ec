/* fuzz_comm.c — the CPU collective backend's wire decoders (worker/comm/cpu/wire.h) on any
 * bytes a peer could send. The first byte picks the frame, the rest is its bytes:
 *   0 a rank's registration with the root      1 a stream of root -> rank messages
 *   2 what a rank reads from next (notices)    3 a ring hello and its proof
 *   4 a shared-memory offer                    5 a collective header
 *   6 a rendezvous id (bytes, and as hex text) 7 the root's challenge
 * Frames shorter than their size are zero-padded, as a short read never reaches a decoder
 * (the callers read whole frames), so padding is the honest way to try every length.
 * The proofs are HMACs no fuzzer forges: a registration is decoded as sent, and again with
 * the proof its body would carry, so that the checks behind the proof are fuzzed too. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/comm/cpu/wire.h"

static const unsigned char secret[SECRET_BYTES] = "ddpd-fuzz-key..";
static const unsigned char nonce[NONCE_BYTES] = "ddpd-fuzz-nonce-0123456789abcde";

/* Copies up to `n` bytes of the input into a zeroed frame of `n` bytes. */
static void frame(unsigned char *dst, size_t n, const uint8_t *data, size_t size)
{
    memset(dst, 0, n);
    memcpy(dst, data, size < n ? size : n);
}

static void check_text(const char *text, size_t cap)
{
    if (!memchr(text, '\0', cap) || !text[0])
        abort();
}

static void registration(const uint8_t *data, size_t size)
{
    unsigned char reg[REG_BYTES];
    struct cpu_reg r;
    char text[MSG_TEXT_MAX];
    frame(reg, sizeof reg, data, size);
    for (int proven = 0; proven < 2; proven++) {
        if (proven && comm_cpu__reg_proof(secret, nonce, reg, reg + REG_BODY_BYTES) != 0)
            abort();
        if (comm_cpu__reg_decode(reg, secret, nonce, &r, text, sizeof text) < 0) {
            check_text(text, sizeof text);
            continue;
        }
        if (r.world < 1 || r.world > MAX_WORLD || r.addr.port == 0)
            abort();
    }
}

/* As rendezvous() reads the root: a header, then exactly the payload it announced, until
 * an error text, a table, or a malformed message ends it. */
static void root_stream(const uint8_t *data, size_t size)
{
    static struct cpu_addr table[MAX_WORLD];
    if (size < 2)
        return;
    int world = 1 + (int)((data[0] << 8 | data[1]) % MAX_WORLD);
    data += 2;
    size -= 2;
    while (size >= MSG_HDR_BYTES) {
        uint32_t type, len;
        int registered = -1;
        if (comm_cpu__msg_head(data, world, &type, &len) < 0)
            return;
        data += MSG_HDR_BYTES;
        size -= MSG_HDR_BYTES;
        if (len > MAX_WORLD * ADDR_BYTES || (type == MSG_ERROR && len > MSG_TEXT_MAX))
            abort(); /* the header check promised these bounds */
        if (len > size)
            return; /* the root hung up mid-message */
        unsigned char *payload = malloc((size_t)len + 1);
        memcpy(payload, data, len);
        int rc = comm_cpu__msg_body(type, payload, len, world, table, &registered);
        if (type == MSG_ERROR && rc == 0)
            for (uint32_t i = 0; i < len; i++)
                if (payload[i] < 32 || payload[i] > 126)
                    abort();
        free(payload);
        data += len;
        size -= len;
        if (rc < 0 || type != MSG_PROGRESS)
            return;
    }
}

static void notice(const uint8_t *data, size_t size)
{
    char text[NOTICE_TEXT_MAX + 1];
    int origin = -1;
    if (size < 1)
        return;
    int world = 1 + data[0] % 8;
    /* next_failed reads at most 1 KiB at once */
    size_t k = size - 1 > 1024 ? 1024 : size - 1;
    if (k == 0)
        return;
    int rc = comm_cpu__notice_decode(data + 1, k, world, &origin, text);
    if (rc > 2 || (rc >= 1 && (origin < 0 || origin >= world || strlen(text) > NOTICE_TEXT_MAX)))
        abort();
}

static void hello(const uint8_t *data, size_t size)
{
    unsigned char h[HELLO_BYTES + PROOF_BYTES];
    struct cpu_hello got;
    char why[256] = "";
    frame(h, sizeof h, data, size);
    if (comm_cpu__hello_decode(h, 1, 4, &got, why, sizeof why) < 0) {
        check_text(why, sizeof why);
        return;
    }
    if (got.rank != 1 || got.world != 4)
        abort();
    /* As the listener rank 2 checks its prev's proof over the nonce it sent. */
    comm_cpu__ring_proof_check(secret, RING_CONNECTOR, 1, 2, 4, got.nonce, nonce, h + HELLO_BYTES);
}

static void challenge(const uint8_t *data, size_t size)
{
    unsigned char ch[CHALLENGE_BYTES], n[NONCE_BYTES];
    frame(ch, sizeof ch, data, size);
    if (comm_cpu__challenge_decode(ch, n) == 0 &&
        memcmp(n, ch + CHALLENGE_BYTES - NONCE_BYTES, NONCE_BYTES) != 0)
        abort();
}

static void shm_offer(const uint8_t *data, size_t size)
{
    unsigned char o[SHM_OFFER_BYTES];
    uint32_t pid, fdnum;
    frame(o, sizeof o, data, size);
    if (comm_cpu__shm_offer_decode(o, &pid, &fdnum) && pid == 0)
        abort();
}

static void header(const uint8_t *data, size_t size)
{
    unsigned char h[HDR_BYTES];
    char text[96];
    frame(h, sizeof h, data, size);
    comm_cpu__header_describe(h, text, sizeof text);
    check_text(text, sizeof text);
}

static void id(const uint8_t *data, size_t size)
{
    struct comm_id cid;
    unsigned char m[SECRET_BYTES];
    struct cpu_addr root;
    char hex[2 * COMM_ID_BYTES + 1], back[2 * COMM_ID_BYTES + 1];
    frame(cid.bytes, sizeof cid.bytes, data, size);
    if (comm_cpu__id_decode(&cid, m, &root) == 0 && root.port == 0)
        abort();
    /* The hex text as the worker's stdin document carries it. */
    size_t n = size < sizeof hex - 1 ? size : sizeof hex - 1;
    memcpy(hex, data, n);
    hex[n] = '\0';
    if (comm_id_from_hex(hex, &cid) == 0) {
        comm_id_to_hex(&cid, back);
        if (comm_id_from_hex(back, &cid) != 0)
            abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const uint8_t *p = data + 1;
    size_t n = size - 1;
    switch (data[0] % 8) {
    case 0: registration(p, n); break;
    case 1: root_stream(p, n); break;
    case 2: notice(p, n); break;
    case 3: hello(p, n); break;
    case 4: shm_offer(p, n); break;
    case 5: header(p, n); break;
    case 6: id(p, n); break;
    default: challenge(p, n); break;
    }
    return 0;
}
