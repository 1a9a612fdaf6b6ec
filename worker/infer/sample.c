/* infer/sample.c — the next token from the logits (greedy, temperature, top-k, one draw
 * of ddpd's RNG: docs/generation.md writes the rule down so that another implementation
 * reproduces it), and the UTF-8 stream decoder that turns a byte vocabulary's tokens into
 * text as they come. Pure functions of host memory: no device, no I/O. */
#include <math.h>
#include <stdlib.h>

#include "../rng.h"
#include "infer_impl.h"

/* ---- sampling ---- */

/* Greedy: the largest logit, the lowest id among equal ones; NaN never wins. */
static int32_t argmax(const float *l, int64_t vocab)
{
    int32_t best = -1;
    for (int64_t i = 0; i < vocab; i++)
        if (!isnan(l[i]) && (best < 0 || l[i] > l[best]))
            best = (int32_t)i;
    return best;
}

/* qsort_r's order for top-k: larger logit first, then lower id. */
static int by_logit(const void *a, const void *b, void *ctx)
{
    const float *l = ctx;
    const int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    if (l[i] != l[j])
        return l[i] > l[j] ? -1 : 1;
    return i < j ? -1 : i > j;
}

int32_t sample_next(const float *logits, int64_t vocab, double temperature, int64_t top_k, uint64_t seed,
                    uint64_t index, double *work, int32_t *order)
{
    if (temperature <= 0.0)
        return argmax(logits, vocab);
    for (int64_t i = 0; i < vocab; i++)
        if (isnan(logits[i]) || logits[i] == INFINITY)
            return -1; /* no distribution to draw from */
    /* The candidates: the top_k largest, or all. work[i] < 0 marks a dropped id. */
    const bool all = top_k <= 0 || top_k >= vocab;
    for (int64_t i = 0; i < vocab; i++)
        work[i] = all ? 0.0 : -1.0;
    if (!all) {
        for (int64_t i = 0; i < vocab; i++)
            order[i] = (int32_t)i;
        qsort_r(order, (size_t)vocab, sizeof order[0], by_logit, (void *)logits);
        for (int64_t j = 0; j < top_k; j++)
            work[order[j]] = 0.0;
    }
    double lmax = -INFINITY;
    for (int64_t i = 0; i < vocab; i++)
        if (work[i] == 0.0 && logits[i] > lmax)
            lmax = logits[i];
    if (lmax == -INFINITY)
        return -1; /* every candidate is -inf */
    /* p_i = exp((l_i - l_max) / T): the softmax at temperature T with the maximum
     * subtracted, in double, summed in id order. */
    double sum = 0.0;
    for (int64_t i = 0; i < vocab; i++) {
        work[i] = work[i] == 0.0 ? exp(((double)logits[i] - lmax) / temperature) : 0.0;
        sum += work[i];
    }
    struct rng r;
    rng_seed2(&r, seed, index);
    const double target = rng_uniform(&r) * sum;
    double run = 0.0;
    int32_t last = -1;
    for (int64_t i = 0; i < vocab; i++) {
        if (work[i] <= 0.0)
            continue;
        run += work[i];
        last = (int32_t)i;
        if (run > target)
            return (int32_t)i;
    }
    return last; /* u * sum rounded to the whole sum: the last candidate */
}

/* ---- UTF-8 ---- */

static size_t put_replacement(char *out)
{
    out[0] = (char)0xEF;
    out[1] = (char)0xBF;
    out[2] = (char)0xBD;
    return 3;
}

void utf8_stream_init(struct utf8_stream *u)
{
    u->n = u->need = 0;
    u->lo = 0x80;
    u->hi = 0xBF;
}

/* A byte that starts afresh: ASCII out at once, a lead byte held with the range its
 * second byte must fall in (no overlongs, no surrogates, nothing past U+10FFFF). */
static size_t start(struct utf8_stream *u, unsigned char b, char *out)
{
    u->lo = 0x80;
    u->hi = 0xBF;
    if (b < 0x80) {
        out[0] = (char)b;
        return 1;
    }
    if (b >= 0xC2 && b <= 0xDF)
        u->need = 2;
    else if (b >= 0xE0 && b <= 0xEF)
        u->need = 3, u->lo = b == 0xE0 ? 0xA0 : 0x80, u->hi = b == 0xED ? 0x9F : 0xBF;
    else if (b >= 0xF0 && b <= 0xF4)
        u->need = 4, u->lo = b == 0xF0 ? 0x90 : 0x80, u->hi = b == 0xF4 ? 0x8F : 0xBF;
    else
        return put_replacement(out); /* a continuation byte, C0, C1, F5..FF */
    u->held[0] = b;
    u->n = 1;
    return 0;
}

size_t utf8_stream_feed(struct utf8_stream *u, unsigned char b, char *out)
{
    if (u->n == 0)
        return start(u, b, out);
    if (b < u->lo || b > u->hi) {
        /* The held bytes are a maximal ill-formed subpart: one U+FFFD, then b anew. */
        u->n = u->need = 0;
        size_t k = put_replacement(out);
        return k + start(u, b, out + k);
    }
    u->lo = 0x80;
    u->hi = 0xBF;
    u->held[u->n++] = b;
    if (u->n < u->need)
        return 0;
    for (int i = 0; i < u->n; i++)
        out[i] = (char)u->held[i];
    size_t k = (size_t)u->n;
    u->n = u->need = 0;
    return k;
}

size_t utf8_stream_flush(struct utf8_stream *u, char *out)
{
    if (u->n == 0)
        return 0;
    utf8_stream_init(u);
    return put_replacement(out);
}
