/* test_half.c — the 16-bit floats of `ddp.comm_hook` (worker/half.c) and the CPU
 * backend's all-reduce of them (comm/cpu/engine.c): casts round to nearest even as
 * PyTorch's do (known patterns, every fp16 and bf16 value back to itself), division and
 * add round through float32, and the all-reduce sums every element in the order of gloo's
 * ring all-reduce (chunk g of 2W segments of ceil(n/2W) elements: rank g-1, g-2, ..., g,
 * each add rounded), bitwise for 2 and 3 ranks on both of the engine's paths (the small
 * all-gather and the ring) over shared memory and TCP; from 4 ranks every rank holds the
 * same bits. The order itself was checked against PyTorch 1.13's gloo (tests/parity/
 * test_comm_hook.py checks it end to end). */
#include <signal.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "comm_group.h"
#include "rank_values.h"
#include "worker/comm.h"
#include "worker/half.h"

static void test_casts(void)
{
    /* fp16 */
    CHECK_EQ_INT(half_from_float(HALF_FP16, 1.0f), 0x3c00);
    CHECK_EQ_INT(half_from_float(HALF_FP16, -2.0f), 0xc000);
    CHECK_EQ_INT(half_from_float(HALF_FP16, 65504.0f), 0x7bff);
    CHECK_EQ_INT(half_from_float(HALF_FP16, 65519.0f), 0x7bff); /* below the midpoint */
    CHECK_EQ_INT(half_from_float(HALF_FP16, 65520.0f), 0x7c00); /* the midpoint rounds to even: inf */
    CHECK_EQ_INT(half_from_float(HALF_FP16, 1e9f), 0x7c00);
    CHECK_EQ_INT(half_from_float(HALF_FP16, 0x1p-24f), 0x0001);
    CHECK_EQ_INT(half_from_float(HALF_FP16, 0x1p-25f), 0x0000);        /* tie to even: 0 */
    CHECK_EQ_INT(half_from_float(HALF_FP16, 0x1.8p-24f), 0x0002);      /* tie to even: 2 */
    CHECK_EQ_INT(half_from_float(HALF_FP16, 0x1.000002p-25f), 0x0001); /* just above the tie */
    CHECK_EQ_INT(half_from_float(HALF_FP16, 0x1p-14f), 0x0400);        /* smallest normal */
    CHECK_EQ_INT(half_from_float(HALF_FP16, 1.0f + 0x1p-11f), 0x3c00); /* tie: even 1.0 */
    CHECK_EQ_INT(half_from_float(HALF_FP16, 1.0f + 0x3p-11f), 0x3c02); /* tie: even up */
    CHECK_EQ_INT(half_from_float(HALF_FP16, -0.0f), 0x8000);
    CHECK_EQ_INT(half_from_float(HALF_FP16, NAN) & 0x7fff, 0x7e00);
    CHECK_EQ_INT(half_from_float(HALF_FP16, INFINITY), 0x7c00);
    /* bf16 */
    CHECK_EQ_INT(half_from_float(HALF_BF16, 1.0f), 0x3f80);
    CHECK_EQ_INT(half_from_float(HALF_BF16, 1.0f + 0x1p-8f), 0x3f80); /* tie: even */
    CHECK_EQ_INT(half_from_float(HALF_BF16, 1.0f + 0x3p-8f), 0x3f82); /* tie: even up */
    CHECK_EQ_INT(half_from_float(HALF_BF16, 1.0f + 0x1.2p-8f), 0x3f81);
    CHECK_EQ_INT(half_from_float(HALF_BF16, NAN), 0x7fc0);
    CHECK_EQ_INT(half_from_float(HALF_BF16, -3e38f), 0xff62);
    /* Every value back to its own pattern; NaNs stay NaN. */
    int bad16 = 0, bad_bf = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = half_to_float(HALF_FP16, (uint16_t)h), g = half_to_float(HALF_BF16, (uint16_t)h);
        if (f == f ? half_from_float(HALF_FP16, f) != h : half_from_float(HALF_FP16, f) == 0)
            bad16++;
        if (g == g ? half_from_float(HALF_BF16, g) != h
                   : !isnan(half_to_float(HALF_BF16, half_from_float(HALF_BF16, g))))
            bad_bf++;
    }
    CHECK_EQ_INT(bad16, 0);
    CHECK_EQ_INT(bad_bf, 0);
    CHECK_NEAR(half_to_float(HALF_FP16, 0x0001), 0x1p-24, 0, 0);
    CHECK_NEAR(half_to_float(HALF_FP16, 0xfbff), -65504.0, 0, 0);

    /* compress: the cast first, then the division in float, then the cast again. */
    uint16_t h[3];
    const float src[3] = {1.0f, 0.1f, 65504.0f};
    half_compress(HALF_FP16, h, src, 3, 3);
    CHECK_EQ_INT(h[0], half_from_float(HALF_FP16, 1.0f / 3.0f));
    CHECK_EQ_INT(h[1],
                 half_from_float(HALF_FP16, half_to_float(HALF_FP16, half_from_float(HALF_FP16, 0.1f)) / 3));
    CHECK_EQ_INT(h[2], half_from_float(HALF_FP16, 65504.0f / 3.0f));
    float back[3];
    half_decompress(HALF_FP16, back, h, 3);
    CHECK_NEAR(back[0], half_to_float(HALF_FP16, h[0]), 0, 0);
    /* add rounds once, through float: 2048 + 1 is a tie in fp16 (spacing 2): even 2048. */
    uint16_t a = half_from_float(HALF_FP16, 2048.0f), b = half_from_float(HALF_FP16, 1.0f);
    half_add(HALF_FP16, &a, &b, 1);
    CHECK_NEAR(half_to_float(HALF_FP16, a), 2048.0, 0, 0);
    a = half_from_float(HALF_FP16, 2050.0f);
    half_add(HALF_FP16, &a, &b, 1);
    CHECK_NEAR(half_to_float(HALF_FP16, a), 2052.0, 0, 0);
}

/* The loops (8 at a time where the CPU can) against the scalar casts, element by element,
 * on values of every kind: ties, subnormals, overflow, infinities, NaN. */
static void test_loops_match_scalar(void)
{
    enum { N = 4099 };
    static float src[N], back[N];
    static uint16_t h[N], a[N], b[N];
    uint32_t x = 12345;
    for (int i = 0; i < N; i++) {
        x = x * 1664525u + 1013904223u;
        uint32_t bits = x;
        if (i % 7 == 0) /* around fp16's range and subnormals */
            bits = (x & 0x80ffffffu) | ((uint32_t)(96 + (x >> 24) % 48) << 23);
        memcpy(&src[i], &bits, sizeof bits);
    }
    src[0] = NAN;
    src[1] = INFINITY;
    src[2] = 65520.0f;
    src[3] = 0x1p-25f;
    src[4] = -0.0f;
    for (int kk = 0; kk < 2; kk++) {
        half_kind k = kk ? HALF_BF16 : HALF_FP16;
        for (int d = 1; d <= 3; d++) {
            half_compress(k, h, src, N, d);
            int bad = 0;
            for (int i = 0; i < N; i++) {
                float want = half_to_float(
                    k, half_from_float(k, half_to_float(k, half_from_float(k, src[i])) / (float)d));
                float got = half_to_float(k, h[i]);
                bad += !(got == want || (isnan(got) && isnan(want))) ||
                       (got == 0 && signbit(got) != signbit(want));
            }
            CHECK_EQ_INT(bad, 0);
        }
        half_decompress(k, back, h, N);
        int bad = 0;
        for (int i = 0; i < N; i++) {
            float want = half_to_float(k, h[i]);
            bad += memcmp(&back[i], &want, sizeof want) != 0 && !(isnan(back[i]) && isnan(want));
        }
        CHECK_EQ_INT(bad, 0);
        half_compress(k, a, src, N, 1);
        half_compress(k, b, src + 1, N - 1, 1);
        memcpy(h, a, sizeof a);
        half_add(k, h, b, N - 1);
        bad = 0;
        for (int i = 0; i < N - 1; i++) {
            float want =
                half_to_float(k, half_from_float(k, half_to_float(k, a[i]) + half_to_float(k, b[i])));
            float got = half_to_float(k, h[i]);
            bad += !(got == want || (isnan(got) && isnan(want)));
        }
        CHECK_EQ_INT(bad, 0);
    }
}

/* ---- the all-reduce ---- */

#define MAX_W  4
#define NSIZES 5
static const int64_t sizes[NSIZES] = {1, 7, 1000, 8193, 100003}; /* 8193 halves: just past the small path */

struct shared {
    uint64_t hash[MAX_W][NSIZES][2];
    int wrong[MAX_W][NSIZES][2]; /* elements that differ from gloo's order (W <= 3) */
    uint64_t sent[MAX_W];
};
static struct shared *sh;
static unsigned tcp_ranks;

static uint16_t value(half_kind k, int rank, int64_t i)
{
    /* Magnitudes that differ by rank (rank_values.h), so that the order of the adds shows. */
    return half_from_float(k, rank_value(rank, i) * 8.0f);
}

/* gloo's ring order for element i of n over W ranks. */
static uint16_t gloo_sum(half_kind k, int W, int64_t n, int64_t i)
{
    int64_t per = 2 * ((n + 2 * W - 1) / (2 * W));
    int g = (int)(i / per);
    uint16_t acc = value(k, (g + W - 1) % W, i);
    for (int j = 2; j <= W; j++) {
        uint16_t x = value(k, ((g - j) % W + W) % W, i);
        half_add(k, &acc, &x, 1);
    }
    return acc;
}

static int rank_half(int rank, int world, const struct comm_id *id)
{
    struct ddpd_error err;
    struct comm *c = comm_new(&comm_cpu_ops, id, rank, world, 20.0, &err);
    if (!c) {
        fprintf(stderr, "rank %d: comm_new: %s\n", rank, err.message);
        return 1;
    }
    static uint16_t buf[100003];
    for (int kk = 0; kk < 2; kk++) {
        half_kind k = kk ? HALF_BF16 : HALF_FP16;
        for (int s = 0; s < NSIZES; s++) {
            int64_t n = sizes[s];
            for (int64_t i = 0; i < n; i++)
                buf[i] = value(k, rank, i);
            struct comm_req *req;
            if (comm_allreduce_half_start(c, buf, n, k, &req, &err) || comm_wait(c, req, &err)) {
                fprintf(stderr, "rank %d: all-reduce: %s\n", rank, err.message);
                return 1;
            }
            sh->hash[rank][s][kk] = fnv(buf, (size_t)n * 2);
            int wrong = 0;
            for (int64_t i = 0; i < n; i++)
                wrong += buf[i] != gloo_sum(k, world, n, i);
            sh->wrong[rank][s][kk] = wrong;
        }
    }
    sh->sent[rank] = comm_bytes_sent(c);
    comm_free(c);
    return 0;
}

static int run_ranks(int world, const struct comm_id *id)
{
    pid_t pids[MAX_W];
    for (int r = 0; r < world; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            alarm(60);
            if (issuer_stdin >= 0)
                close(issuer_stdin);
            if (tcp_ranks >> r & 1)
                setenv("DDPD_COMM_SHM", "0", 1);
            exit(rank_half(r, world, id));
        }
    }
    int bad = 0;
    for (int r = 0; r < world; r++) {
        int st = 0;
        waitpid(pids[r], &st, 0);
        bad += !WIFEXITED(st) || WEXITSTATUS(st) != 0;
    }
    return bad;
}

static void test_allreduce(int world, unsigned tcp)
{
    struct issuer is;
    memset(sh, 0, sizeof *sh);
    tcp_ranks = tcp;
    CHECK_EQ_INT(issuer_start(&is), 0);
    CHECK_EQ_INT(run_ranks(world, &is.id), 0);
    CHECK_EQ_INT(issuer_stop(&is), 0);
    for (int r = 0; r < world; r++)
        for (int s = 0; s < NSIZES; s++)
            for (int kk = 0; kk < 2; kk++) {
                if (sh->hash[r][s][kk] != sh->hash[0][s][kk])
                    CHECK__FAIL("W=%d tcp %#x: %s all-reduce of %lld differs between rank 0 and rank %d",
                                world, tcp, kk ? "bf16" : "fp16", (long long)sizes[s], r);
                if (world <= 3 && sh->wrong[r][s][kk])
                    CHECK__FAIL(
                        "W=%d tcp %#x: %s all-reduce of %lld: %d elements not in gloo's order on rank %d",
                        world, tcp, kk ? "bf16" : "fp16", (long long)sizes[s], sh->wrong[r][s][kk], r);
            }
    /* The ring sends 2(W-1)/W of the 16-bit payload, half a float all-reduce's bytes. */
    if (world > 1) {
        uint64_t payload = 0;
        for (int s = 0; s < NSIZES; s++)
            payload += (uint64_t)sizes[s] * 2 * 2;
        CHECK(sh->sent[0] > 0);
        CHECK(sh->sent[0] < payload * 2 * (uint64_t)(world - 1) / (uint64_t)world + payload / 2);
    }
    tcp_ranks = 0;
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    test_casts();
    test_loops_match_scalar();
    comm_group_crypto_ready();
    sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED)
        return 1;
    for (int w = 1; w <= MAX_W; w++)
        test_allreduce(w, 0);
    test_allreduce(2, 0x3);
    test_allreduce(3, 0x7);
    test_allreduce(3, 0x2);
    CHECK_DONE();
}
