/* encode.c — text to token ids (bpe.h): GPT-2's pre-tokenising pattern through PCRE2 (UTF,
 * Unicode properties, JIT where PCRE2 has it) splits the text, each piece is looked up in
 * a cache of pieces already encoded, and a new piece goes through the merge loop: the
 * pairs in a heap by (rank, position), every place of the lowest-ranked pair merged left
 * to right in one pass, as OpenAI's encoder.py does. Knows nothing of files. */
#include <stdlib.h>
#include <string.h>

#include "bpe_impl.h"

/* OpenAI's pattern, as encoder.py and tiktoken's gpt2 write it. */
static const char PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

#define CACHE_PIECE_MAX 128 /* bytes of the longest piece the cache keeps */

ddpd_err bpe_compile(struct bpe *b, struct ddpd_error *err)
{
    int code = 0;
    PCRE2_SIZE at = 0;
    /* MATCH_INVALID_UTF: bytes that are not UTF-8 match nothing (instead of failing the
     * whole match), and encode() gives them pieces of their own. */
    b->re = pcre2_compile((PCRE2_SPTR)PATTERN, PCRE2_ZERO_TERMINATED,
                          PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &code, &at, NULL);
    if (!b->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code, msg, sizeof msg);
        return ddpd_error_set(err, DDPD_EINTERNAL, "",
                              "PCRE2 cannot compile GPT-2's pattern (offset %zu): %s", (size_t)at,
                              (const char *)msg);
    }
    b->jit = pcre2_jit_compile(b->re, PCRE2_JIT_COMPLETE) == 0;
    b->md = pcre2_match_data_create_from_pattern(b->re, NULL);
    if (!b->md)
        return ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory for PCRE2's match data");
    return DDPD_OK;
}

bool bpe_jit(const struct bpe *b)
{
    return b->jit;
}

static bool ids_room(struct bpe_ids *o, size_t more)
{
    if (o->n + more <= o->cap)
        return true;
    size_t cap = o->cap ? o->cap : 1024;
    while (cap < o->n + more)
        cap *= 2;
    int32_t *v = realloc(o->v, cap * sizeof *v);
    if (!v)
        return false;
    o->v = v;
    o->cap = cap;
    return true;
}

static bool scratch(struct bpe *b, size_t n)
{
    if (n <= b->scratch_cap)
        return true;
    size_t cap = b->scratch_cap ? b->scratch_cap : 64;
    while (cap < n)
        cap *= 2;
    int32_t *sym = realloc(b->sym, cap * sizeof *sym);
    b->sym = sym ? sym : b->sym;
    int32_t *next = realloc(b->next, cap * sizeof *next);
    b->next = next ? next : b->next;
    int32_t *prev = realloc(b->prev, cap * sizeof *prev);
    b->prev = prev ? prev : b->prev;
    struct bpe_cand *heap = realloc(b->heap, 3 * cap * sizeof *heap);
    b->heap = heap ? heap : b->heap;
    struct bpe_cand *pass = realloc(b->pass, 3 * cap * sizeof *pass);
    b->pass = pass ? pass : b->pass;
    struct bpe_cand *fresh = realloc(b->fresh, 2 * cap * sizeof *fresh);
    b->fresh = fresh ? fresh : b->fresh;
    if (!sym || !next || !prev || !heap || !pass || !fresh)
        return false;
    b->scratch_cap = cap;
    return true;
}

/* ---- the heap of candidate merges, by (rank, position) ---- */

static bool before(const struct bpe_cand *x, const struct bpe_cand *y)
{
    return x->rank < y->rank || (x->rank == y->rank && x->pos < y->pos);
}

static void heap_push(struct bpe_cand *h, size_t *n, struct bpe_cand c)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t up = (i - 1) / 2;
        if (!before(&c, &h[up]))
            break;
        h[i] = h[up];
        i = up;
    }
    h[i] = c;
}

static struct bpe_cand heap_pop(struct bpe_cand *h, size_t *n)
{
    struct bpe_cand top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && before(&h[c + 1], &h[c]))
            c++;
        if (!before(&h[c], &last))
            break;
        h[i] = h[c];
        i = c;
    }
    if (*n)
        h[i] = last;
    return top;
}

/* The merge of the pair of nodes i and j (sym[i], sym[j]) into *c, false when none. */
static bool candidate(const struct bpe *b, int32_t i, int32_t j, struct bpe_cand *c)
{
    int32_t key[2] = {b->sym[i], b->sym[j]};
    const struct bpe_slot *s = map_find(&b->merges, key, sizeof key, map_hash(key, sizeof key));
    if (!s)
        return false;
    *c = (struct bpe_cand){.rank = s->v0, .pos = (uint32_t)i, .a = key[0], .b = key[1], .ab = (int32_t)s->v1};
    return true;
}

/* The ids of one piece p[0..n) (n >= 2) appended to out. encoder.py's loop: while any
 * pair of neighbouring symbols has a merge, take the lowest-ranked one and merge each of
 * its places from left to right; the pairs that this pass makes wait for the next. */
static ddpd_err merge_piece(struct bpe *b, const unsigned char *p, size_t n, struct bpe_ids *out,
                            struct ddpd_error *err)
{
    if (!scratch(b, n) || !ids_room(out, n))
        return ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory encoding a piece of %zu bytes", n);
    int32_t *sym = b->sym, *next = b->next, *prev = b->prev;
    size_t nh = 0;
    for (size_t i = 0; i < n; i++) {
        sym[i] = b->byte_id[p[i]];
        next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
        prev[i] = (int32_t)i - 1;
    }
    struct bpe_cand c;
    for (size_t i = 0; i + 1 < n; i++)
        if (candidate(b, (int32_t)i, (int32_t)i + 1, &c))
            heap_push(b->heap, &nh, c);
    while (nh) {
        const uint32_t rank = b->heap[0].rank;
        size_t np = 0, nf = 0;
        while (nh && b->heap[0].rank == rank)
            b->pass[np++] = heap_pop(b->heap, &nh);
        for (size_t k = 0; k < np; k++) {
            const struct bpe_cand *m = &b->pass[k];
            const int32_t i = (int32_t)m->pos, j = next[i];
            if (sym[i] != m->a || j < 0 || sym[j] != m->b)
                continue; /* stale: a merge of this pass took one of its two */
            sym[i] = m->ab;
            sym[j] = -1;
            next[i] = next[j];
            if (next[j] >= 0)
                prev[next[j]] = i;
            if (prev[i] >= 0 && candidate(b, prev[i], i, &c))
                b->fresh[nf++] = c;
            if (next[i] >= 0 && candidate(b, i, next[i], &c))
                b->fresh[nf++] = c;
        }
        for (size_t k = 0; k < nf; k++)
            heap_push(b->heap, &nh, b->fresh[k]);
    }
    for (int32_t i = 0; i >= 0; i = next[i])
        out->v[out->n++] = sym[i];
    return DDPD_OK;
}

/* One piece: a single byte at once, else from the cache, else merged (and cached when
 * short). */
static ddpd_err piece(struct bpe *b, const unsigned char *p, size_t n, struct bpe_ids *out,
                      struct ddpd_error *err)
{
    if (n == 1) {
        if (!ids_room(out, 1))
            return ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory for the ids");
        out->v[out->n++] = b->byte_id[p[0]];
        return DDPD_OK;
    }
    const bool cacheable = n <= CACHE_PIECE_MAX;
    uint64_t h = 0;
    if (cacheable) {
        h = map_hash(p, n);
        const struct bpe_slot *s = map_find(&b->cache, p, n, h);
        if (s) {
            if (!ids_room(out, s->v1))
                return ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory for the ids");
            memcpy(out->v + out->n, b->cache_ids + s->v0, s->v1 * sizeof(int32_t));
            out->n += s->v1;
            return DDPD_OK;
        }
    }
    const size_t at = out->n;
    ddpd_err rc = merge_piece(b, p, n, out, err);
    if (rc || !cacheable)
        return rc;
    const size_t k = out->n - at;
    if (b->cache_n + k > BPE_CACHE_IDS_MAX) { /* full: start over (the text's words come back) */
        map_clear(&b->cache);
        b->cache_n = 0;
    }
    if (b->cache_n + k > b->cache_cap) {
        size_t cap = b->cache_cap ? b->cache_cap * 2 : 65536;
        int32_t *v = realloc(b->cache_ids, cap * sizeof *v);
        if (!v)
            return DDPD_OK; /* uncached: only slower */
        b->cache_ids = v;
        b->cache_cap = cap;
    }
    if (map_put(&b->cache, p, n, h, (uint32_t)b->cache_n, (uint32_t)k, NULL) == 1) {
        memcpy(b->cache_ids + b->cache_n, out->v + at, k * sizeof(int32_t));
        b->cache_n += k;
    }
    return DDPD_OK;
}

ddpd_err bpe_encode(struct bpe *b, const char *text, size_t n, struct bpe_ids *out, struct ddpd_error *err)
{
    const unsigned char *s = (const unsigned char *)text;
    size_t pos = 0;
    ddpd_err rc = DDPD_OK;
    while (pos < n && !rc) {
        int m = b->jit ? pcre2_jit_match(b->re, s, n, pos, 0, b->md, NULL)
                       : pcre2_match(b->re, s, n, pos, 0, b->md, NULL);
        if (m == PCRE2_ERROR_NOMATCH)
            return piece(b, s + pos, n - pos, out, err); /* bytes that are not UTF-8, to the end */
        if (m < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(m, msg, sizeof msg);
            return ddpd_error_set(err, DDPD_EINTERNAL, "", "PCRE2 failed at byte %zu of the text: %s", pos,
                                  (const char *)msg);
        }
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(b->md);
        if (ov[0] > pos && (rc = piece(b, s + pos, ov[0] - pos, out, err))) /* not UTF-8 */
            break;
        if (ov[1] <= ov[0]) /* no alternative matches empty; never loop */
            return ddpd_error_set(err, DDPD_EINTERNAL, "", "GPT-2's pattern matched nothing at byte %zu",
                                  pos);
        rc = piece(b, s + ov[0], ov[1] - ov[0], out, err);
        pos = ov[1];
    }
    return rc;
}

/* A printable ASCII byte other than the space. */
static bool solid(unsigned char c)
{
    return c > ' ' && c < 0x7f;
}

size_t bpe_safe_cut(const char *text, size_t n)
{
    const unsigned char *s = (const unsigned char *)text;
    for (size_t q = n >= 2 ? n - 2 : 0; q >= 1; q--)
        if ((s[q] == ' ' || s[q] == '\n') && solid(s[q - 1]) && solid(s[q + 1]))
            return q;
    return 0;
}
