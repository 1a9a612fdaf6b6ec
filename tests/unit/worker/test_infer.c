/* test_infer.c — the inference worker's parts (worker/infer/): the UTF-8 stream decoder
 * (split characters, every kind of ill-formed input, the flush), sampling (argmax ties and
 * NaN, top-k and its boundary ties, the temperature's effect on the draw, the draw itself
 * against the numbers docs/generation.md's Python gives), the incremental forward with the
 * KV cache against the full forward's last-position logits (prompts of 1 token, of the
 * full window and longer: the crop; a GPT, one whose last layer holds the attention, a
 * non-causal one), which models can generate, and the stdin line reader (a cancel seen
 * without blocking, a request sent early kept). With a CUDA device (the emulated one:
 * unit.test_infer_emu) the incremental forward runs on it too, against the CPU's full
 * forward of the same weights. */
#include <fcntl.h>
#include <stdint.h>
#include <unistd.h>

#include "check.h"
#include "worker/dev.h"
#include "worker/infer/infer_impl.h"
#include "worker/model.h"
#include "worker/rng.h"

/* ---- UTF-8 ---- */

/* The decoder's text for bytes in[0..n), fed one at a time, then flushed. */
static size_t decode(const char *in, size_t n, char *out)
{
    struct utf8_stream u;
    utf8_stream_init(&u);
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += utf8_stream_feed(&u, (unsigned char)in[i], out + k);
    k += utf8_stream_flush(&u, out + k);
    out[k] = '\0';
    return k;
}

#define FFFD "\xEF\xBF\xBD"

static void check_decode(const char *in, size_t n, const char *want)
{
    char out[256];
    decode(in, n, out);
    CHECK_EQ_STR(out, want);
}

static void test_utf8(void)
{
    check_decode("abc", 3, "abc");
    check_decode("h\xC3\xA9llo \xE2\x82\xAC \xF0\x9F\x98\x80", 15,
                 "h\xC3\xA9llo \xE2\x82\xAC \xF0\x9F\x98\x80");
    check_decode("\x80", 1, FFFD);                            /* a lone continuation byte */
    check_decode("\xC0\xAF", 2, FFFD FFFD);                   /* overlong lead C0 */
    check_decode("\xE0\x80\xAF", 3, FFFD FFFD FFFD);          /* overlong 3-byte form */
    check_decode("\xED\xA0\x80", 3, FFFD FFFD FFFD);          /* a surrogate */
    check_decode("\xF4\x90\x80\x80", 4, FFFD FFFD FFFD FFFD); /* past U+10FFFF */
    check_decode("\xF5", 1, FFFD);                            /* never a lead byte */
    check_decode("\xE2\x82"
                 "A",
                 3, FFFD "A");             /* cut short: one U+FFFD */
    check_decode("\xF0\x9F\x98", 3, FFFD); /* incomplete at the end */
    check_decode("\xC3"
                 "\xC3\xA9",
                 3, FFFD "\xC3\xA9"); /* a new lead restarts */
    check_decode("\xF0\x9F"
                 "\xE2\x82\xAC",
                 5, FFFD "\xE2\x82\xAC");

    /* Bytes arrive one token at a time: nothing comes out mid-character. */
    struct utf8_stream u;
    char out[UTF8_OUT_MAX];
    utf8_stream_init(&u);
    CHECK_EQ_INT(utf8_stream_feed(&u, 0xE2, out), 0);
    CHECK_EQ_INT(utf8_stream_feed(&u, 0x82, out), 0);
    CHECK_EQ_INT(utf8_stream_feed(&u, 0xAC, out), 3);
    CHECK(memcmp(out, "\xE2\x82\xAC", 3) == 0);
    CHECK_EQ_INT(utf8_stream_flush(&u, out), 0);
    /* The most one feed writes: U+FFFD for the held bytes and U+FFFD for the new one. */
    utf8_stream_init(&u);
    utf8_stream_feed(&u, 0xE2, out);
    CHECK_EQ_INT(utf8_stream_feed(&u, 0xFF, out), 6);

    /* infer__text: a message that is not UTF-8 is written with U+FFFD, never raw. */
    json_t *j = infer__text("a\xFF"
                            "b",
                            3);
    CHECK_EQ_STR(json_string_value(j), "a" FFFD "b");
    json_decref(j);
}

/* ---- sampling ---- */

static int32_t draw1(const float *l, int64_t v, double t, int64_t k, uint64_t seed, uint64_t idx)
{
    double work[64];
    int32_t order[64];
    return sample_next(l, v, t, k, seed, idx, work, order);
}

static double u_of(uint64_t seed, uint64_t n)
{
    struct rng r;
    rng_seed2(&r, seed, n);
    return rng_uniform(&r);
}

static void test_sampling(void)
{
    /* The draw is docs/generation.md's: its Python gives these numbers. */
    CHECK(u_of(0, 0) == 0x1.33d8be6d96ebep-1);
    CHECK(u_of(1, 0) == 0x1.67e55eda1f8e2p-1);
    CHECK(u_of(0, 1) == 0x1.d25dc93bae618p-3);
    CHECK(u_of(42, 7) == 0x1.5616461eff891p-1);
    CHECK(u_of(123456789, 4095) == 0x1.9f5e1677028c8p-2);
    CHECK(u_of(INT64_MAX, 3) == 0x1.25d30b6ffe10ap-1);

    /* Greedy: the lowest id among equal maxima; NaN never wins; all NaN: none. */
    const float ties[5] = {1, 3, 2, 3, 3};
    CHECK_EQ_INT(draw1(ties, 5, 0.0, 0, 9, 0), 1);
    const float nan_first[3] = {NAN, -1, -2};
    CHECK_EQ_INT(draw1(nan_first, 3, 0.0, 0, 9, 0), 1);
    const float all_nan[2] = {NAN, NAN};
    CHECK_EQ_INT(draw1(all_nan, 2, 0.0, 0, 9, 0), -1);
    CHECK_EQ_INT(draw1(nan_first, 3, 1.0, 0, 9, 0), -1); /* sampling needs a distribution */
    const float inf[2] = {INFINITY, 0};
    CHECK_EQ_INT(draw1(inf, 2, 1.0, 0, 9, 0), -1);
    const float ninf[2] = {-INFINITY, -INFINITY};
    CHECK_EQ_INT(draw1(ninf, 2, 1.0, 0, 9, 0), -1);
    const float one_left[3] = {-INFINITY, 0.5f, -INFINITY};
    for (uint64_t s = 0; s < 20; s++)
        CHECK_EQ_INT(draw1(one_left, 3, 1.0, 0, s, 0), 1);

    /* top_k 1 is greedy whatever the draw; ties at the boundary keep the lower id. */
    for (uint64_t s = 0; s < 50; s++) {
        CHECK_EQ_INT(draw1(ties, 5, 1.0, 1, s, s), 1);
        const int32_t t2 = draw1(ties, 5, 1.0, 2, s, 0); /* ids 1 and 3, equal weights */
        CHECK(t2 == 1 || t2 == 3);
        CHECK_EQ_INT(t2, u_of(s, 0) < 0.5 ? 1 : 3);
    }

    /* The temperature: logits {0, ln 3} give p = {1/4, 3/4} at T = 1 and {1, sqrt 3} /
     * (1 + sqrt 3) at T = 2; the draw picks id 0 exactly when u falls below p_0. At a tiny
     * T the larger logit always wins. */
    const float two[2] = {0.0f, (float)log(3.0)};
    int agree1 = 0, agree2 = 0, zeros = 0;
    for (uint64_t s = 0; s < 400; s++) {
        const double u = u_of(s, 5);
        const double b1 = 1.0 / (1.0 + exp((double)two[1])), b2 = 1.0 / (1.0 + exp((double)two[1] / 2.0));
        agree1 += draw1(two, 2, 1.0, 0, s, 5) == (u < b1 ? 0 : 1);
        agree2 += draw1(two, 2, 2.0, 0, s, 5) == (u < b2 ? 0 : 1);
        zeros += draw1(two, 2, 2.0, 0, s, 5) == 0;
        CHECK_EQ_INT(draw1(two, 2, 1e-9, 0, s, 5), 1);
    }
    CHECK_EQ_INT(agree1, 400);
    CHECK_EQ_INT(agree2, 400);
    CHECK(zeros > 100 && zeros < 200); /* ~0.366 of 400 */

    /* Every draw of a request has its own stream: the index changes it. */
    int differ = 0;
    const float flat[4] = {0, 0, 0, 0};
    for (uint64_t i = 0; i < 32; i++)
        differ += draw1(flat, 4, 1.0, 0, 7, i) != draw1(flat, 4, 1.0, 0, 7, 0);
    CHECK(differ > 10);
    /* top_k larger than the vocabulary is all of it. */
    CHECK_EQ_INT(draw1(flat, 4, 1.0, 99, 7, 3), draw1(flat, 4, 1.0, 0, 7, 3));
}

/* ---- the incremental forward ---- */

static struct spec *parse(const char *model, int64_t T)
{
    static struct spec specs[4];
    static int used;
    struct spec *s = &specs[used++ % 4];
    char text[4096];
    snprintf(text, sizeof text,
             "{\"model\": %s, \"input_shape\": [%" PRId64 "], \"loss\": \"cross_entropy\","
             " \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1}, \"batch_size\": 2, \"epochs\": 1,"
             " \"data\": {\"type\": \"npy\", \"x\": \"x.npy\", \"y\": \"y.npy\"}}",
             model, T);
    struct ddpd_error err;
    if (spec_parse(text, strlen(text), NULL, s, &err) != DDPD_OK) {
        fprintf(stderr, "spec_parse: %s: %s\n", err.path, err.message);
        exit(1);
    }
    return s;
}

static const char *GPT =
    "[{\"type\": \"embedding\", \"num\": 37, \"dim\": 12}, {\"type\": \"position\", \"max\": 9, \"dim\": 12},"
    " {\"type\": \"dropout\", \"p\": 0.2},"
    " {\"type\": \"residual\", \"layers\": [{\"type\": \"layernorm\", \"dim\": 12},"
    "   {\"type\": \"attention\", \"dim\": 12, \"heads\": 3}]},"
    " {\"type\": \"residual\", \"layers\": [{\"type\": \"layernorm\", \"dim\": 12, \"bias\": false},"
    "   {\"type\": \"linear\", \"in\": 12, \"out\": 40}, {\"type\": \"gelu\", \"approximate\": \"tanh\"},"
    "   {\"type\": \"linear\", \"in\": 40, \"out\": 12}, {\"type\": \"dropout\", \"p\": 0.5}]},"
    " {\"type\": \"residual\", \"layers\": [{\"type\": \"layernorm\", \"dim\": 12},"
    "   {\"type\": \"attention\", \"dim\": 12, \"heads\": 2, \"bias\": false},"
    "   {\"type\": \"residual\", \"layers\": [{\"type\": \"linear\", \"in\": 12, \"out\": 12}, {\"type\": "
    "\"relu\"}]}]},"
    " {\"type\": \"layernorm\", \"dim\": 12}, {\"type\": \"linear\", \"in\": 12, \"out\": 37}]";
/* Its last top-level layer holds the attention: no layer after it to cut to one row. */
static const char *GPT_NO_TAIL =
    "[{\"type\": \"embedding\", \"num\": 8, \"dim\": 8}, {\"type\": \"position\", \"max\": 6, \"dim\": 8},"
    " {\"type\": \"linear\", \"in\": 8, \"out\": 8}, {\"type\": \"tanh\"},"
    " {\"type\": \"residual\", \"layers\": [{\"type\": \"layernorm\", \"dim\": 8},"
    "   {\"type\": \"attention\", \"dim\": 8, \"heads\": 2}]}]";
static const char *GPT_NONCAUSAL =
    "[{\"type\": \"embedding\", \"num\": 11, \"dim\": 6}, {\"type\": \"position\", \"max\": 5, \"dim\": 6},"
    " {\"type\": \"residual\", \"layers\": [{\"type\": \"layernorm\", \"dim\": 6},"
    "   {\"type\": \"attention\", \"dim\": 6, \"heads\": 2, \"causal\": false}]},"
    " {\"type\": \"linear\", \"in\": 6, \"out\": 11}]";
/* Its head tied to the embedding (issue 30), with a bias of its own. */
static const char *GPT_TIED =
    "[{\"type\": \"embedding\", \"num\": 13, \"dim\": 8}, {\"type\": \"position\", \"max\": 7, \"dim\": 8},"
    " {\"type\": \"residual\", \"layers\": [{\"type\": \"layernorm\", \"dim\": 8},"
    "   {\"type\": \"attention\", \"dim\": 8, \"heads\": 2}]},"
    " {\"type\": \"layernorm\", \"dim\": 8}, {\"type\": \"linear\", \"in\": 8, \"out\": 13, \"tie\": \"0\"}]";

/* Random weights (layernorm's around 1) into m, the same numbers as host arrays in w. */
static void fill_weights(struct model *m, struct rng *r)
{
    struct dev d = model_dev(m);
    for (int i = 0; i < model_param_count(m); i++) {
        struct param *p = model_param(m, i);
        float *h = malloc((size_t)p->numel * sizeof *h);
        const bool norm_weight = strstr(p->name, "weight") && p->ndim == 1;
        for (int64_t j = 0; j < p->numel; j++)
            h[j] = (float)((norm_weight ? 1.0 : 0.0) + 0.5 * rng_normal(r));
        d.ops->to_device(d.ctx, p->data, h, (size_t)p->numel * sizeof *h);
        free(h);
    }
}

/* The same weights from model a into model b (on any devices). */
static void copy_weights(struct model *a, struct model *b)
{
    for (int i = 0; i < model_param_count(a); i++) {
        struct param *p = model_param(a, i), *q = model_param(b, i);
        float *h = malloc((size_t)p->numel * sizeof *h);
        model_dev(a).ops->to_host(model_dev(a).ctx, h, p->data, (size_t)p->numel * sizeof *h);
        model_dev(b).ops->to_device(model_dev(b).ctx, q->data, h, (size_t)p->numel * sizeof *h);
        free(h);
    }
}

/* Row `row` of the CPU model's full forward of one window (ids, [T]), into out[vocab]. */
static void full_row(struct model *ref, const int32_t *window, int64_t row, int64_t vocab, float *out)
{
    const float *y = model_forward(ref, window, 1);
    memcpy(out, y + row * vocab, (size_t)vocab * sizeof *out);
}

static void near(const char *what, int64_t at, const float *got, const float *want, int64_t n)
{
    int bad = 0;
    for (int64_t i = 0; i < n; i++)
        if (!(fabsf(got[i] - want[i]) <= 1e-5f + 1e-5f * fabsf(want[i]))) {
            if (!bad++)
                fprintf(stderr, "%s at %" PRId64 ": logit %" PRId64 ": %.9g vs the full forward's %.9g\n",
                        what, at, i, (double)got[i], (double)want[i]);
        }
    CHECK_EQ_INT(bad, 0);
}

/* The KV forward on `dev` against the CPU's full forward, over a sequence of 2T + 3 ids:
 * every prefix window of the first T (prompts of 1 .. T tokens), token by token from a
 * prompt of one (the cache), and the windows past T (the crop: a full window each). */
static void check_model(const char *name, const char *model_json, int64_t T, struct dev dev)
{
    struct spec *s = parse(model_json, T);
    char why[512];
    CHECK(kv_why_not(s, why, sizeof why) == NULL);
    struct dev cpu = dev_cpu_new(1);
    struct ddpd_error err;
    struct model *ref = model_new_eval(cpu, s, &err), *m = model_new_eval(dev, s, &err);
    CHECK(ref && m);
    if (!ref || !m)
        return;
    CHECK_EQ_INT(model_plan(ref, 1, &err), DDPD_OK);
    struct rng r;
    rng_seed(&r, 11);
    fill_weights(ref, &r);
    copy_weights(ref, m);
    struct kv *g = kv_new(m, s, &err);
    CHECK(g != NULL);
    if (!g)
        return;
    const int64_t V = kv_vocab(g), n = 2 * T + 3;
    CHECK_EQ_INT(kv_block(g), T);
    int32_t *seq = malloc((size_t)n * sizeof *seq), window[64];
    float *want = malloc((size_t)V * sizeof *want);
    for (int64_t i = 0; i < n; i++)
        seq[i] = (int32_t)rng_below(&r, (uint64_t)V);
    /* Prefix windows (a causal model's row n-1 ignores the ids after it). */
    memcpy(window, seq, (size_t)T * sizeof *window);
    char what[96];
    for (int64_t len = 1; len <= T; len++) {
        const float *got = kv_window(g, seq, len, &err);
        if (len < T && !strstr(name, "noncausal")) {
            full_row(ref, window, len - 1, V, want);
            snprintf(what, sizeof what, "%s: prompt of %" PRId64, name, len);
            near(what, len, got, want, V);
        }
        CHECK_EQ_INT(kv_len(g), len);
    }
    full_row(ref, window, T - 1, V, want);
    snprintf(what, sizeof what, "%s: the full window", name);
    near(what, T, kv_window(g, seq, T, &err), want, V);
    /* Token by token through the cache. */
    if (!strstr(name, "noncausal")) {
        kv_release(g); /* the next window allocates its activations again */
        kv_window(g, seq, 1, &err);
        for (int64_t len = 2; len <= T; len++) {
            CHECK(kv_can_step(g));
            const float *got = kv_step(g, seq[len - 1]);
            full_row(ref, window, len - 1, V, want);
            snprintf(what, sizeof what, "%s: cached step", name);
            near(what, len, got, want, V);
        }
    }
    CHECK(!kv_can_step(g)); /* a full window (or non-causal): no further step from the cache */
    /* Past the window: the last T tokens at positions 0 .. T-1. */
    for (int64_t end = T + 1; end <= n; end++) {
        memcpy(window, seq + end - T, (size_t)T * sizeof *window);
        full_row(ref, window, T - 1, V, want);
        snprintf(what, sizeof what, "%s: cropped window", name);
        near(what, end, kv_window(g, seq + end - T, T, &err), want, V);
    }
    CHECK(kv_cache_bytes(g) > 0 && kv_work_bytes(g) > 0);
    free(want);
    free(seq);
    kv_free(g);
    model_free(m);
    model_free(ref);
    dev_cpu_free(cpu);
}

static void test_why_not(void)
{
    char why[512];
    struct spec *mlp = parse("[{\"type\": \"linear\", \"in\": 4, \"out\": 3}]", 4);
    const char *w = kv_why_not(mlp, why, sizeof why);
    CHECK(w && strstr(w, "starts with linear"));
    /* Starts with embedding but its output is not over the vocabulary. */
    struct spec *other = parse("[{\"type\": \"embedding\", \"num\": 10, \"dim\": 4},"
                               " {\"type\": \"linear\", \"in\": 4, \"out\": 3}]",
                               5);
    w = kv_why_not(other, why, sizeof why);
    CHECK(w && strstr(w, "ends in linear [5, 3]"));
    struct spec *gpt = parse(GPT, 9);
    CHECK(kv_why_not(gpt, why, sizeof why) == NULL);
}

/* ---- the line reader ---- */

static void test_lines(void)
{
    int fds[2];
    CHECK(pipe(fds) == 0);
    struct lines l = {.fd = fds[0]};
    char *line;
    size_t n;
    fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) | O_NONBLOCK);
    /* Nothing yet: a look without blocking returns at once. */
    CHECK_EQ_INT(lines_peek(&l, false, &line, &n), LINES_NONE);
    const char two[] = "{\"op\": \"generate\"}\n{\"op\": \"cancel\"}\n{\"op\": \"x\"";
    CHECK(write(fds[1], two, sizeof two - 1) == (ssize_t)(sizeof two - 1));
    CHECK_EQ_INT(lines_peek(&l, false, &line, &n), LINES_LINE);
    CHECK(n == 18 && !memcmp(line, "{\"op\": \"generate\"}", n));
    /* A second look at the same line finds the same line (nothing is consumed by it). */
    CHECK_EQ_INT(lines_peek(&l, false, &line, &n), LINES_LINE);
    CHECK_EQ_INT(n, 18);
    lines_consume(&l);
    CHECK_EQ_INT(lines_peek(&l, false, &line, &n), LINES_LINE);
    CHECK(n == 16 && !memcmp(line, "{\"op\": \"cancel\"}", n));
    lines_consume(&l);
    /* An incomplete line waits for its newline, or for EOF. */
    CHECK_EQ_INT(lines_peek(&l, false, &line, &n), LINES_NONE);
    close(fds[1]);
    CHECK_EQ_INT(lines_peek(&l, true, &line, &n), LINES_LINE);
    CHECK(n == 10 && !memcmp(line, "{\"op\": \"x\"", n));
    lines_consume(&l);
    CHECK_EQ_INT(lines_peek(&l, true, &line, &n), LINES_EOF);
    close(fds[0]);
    free(l.buf);
}

int main(void)
{
    test_utf8();
    test_sampling();
    test_why_not();
    test_lines();
    struct dev cpu = dev_cpu_new(1);
    check_model("gpt", GPT, 9, cpu);
    check_model("gpt-no-tail", GPT_NO_TAIL, 6, cpu);
    check_model("gpt-noncausal", GPT_NONCAUSAL, 5, cpu);
    check_model("gpt-tied", GPT_TIED, 7, cpu);
    /* Where a CUDA device is visible (the emulated one in unit.test_infer_emu), the same
     * on it: every step of the incremental forward goes through its table. */
    if (dev_cuda_available()) {
        struct ddpd_error err;
        struct dev g = dev_cuda_new(0, false, &err);
        CHECK(g.ops != NULL);
        if (g.ops) {
            fprintf(stderr, "on GPU 0 (%s)\n", dev_cuda_name(g));
            check_model("gpt on the GPU", GPT, 9, g);
            check_model("gpt-no-tail on the GPU", GPT_NO_TAIL, 6, g);
            check_model("gpt-noncausal on the GPU", GPT_NONCAUSAL, 5, g);
            check_model("gpt-tied on the GPU", GPT_TIED, 7, g);
            dev_cuda_free(g);
        }
    } else if (getenv("DDPD_CUDA_EMU")) {
        CHECK(!"DDPD_CUDA_EMU is set but no CUDA device is visible");
    }
    dev_cpu_free(cpu);
    CHECK_DONE();
}
