/* fuzz_bpe.c — the tokenizer (tokenizer/bpe.h) on any vocab.json, merges.txt and text. The
 * input's first byte picks the mode: odd, the rest is "vocab.json \0 merges.txt \0 text"
 * as they come (the loaders' errors must carry their detail); even, the rest is
 * "merges.txt \0 text" and the vocabulary is built here, the 256 bytes and every merge's
 * result, so that the merge loop runs on whatever merges and text come. Whenever a
 * tokenizer loads, encoding must succeed, every id must be in the vocabulary and decoding
 * must give the text back. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/bpe.h"

/* A JSON string of an alphabet token (its text t[0..n)), escaped, appended to v. */
static size_t put_token(char *v, size_t cap, size_t at, const char *t, size_t n)
{
    v[at++] = '"';
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)t[i];
        if (c == '"' || c == '\\')
            v[at++] = '\\';
        if (c < 0x20)
            at += (size_t)snprintf(v + at, cap - at, "\\u%04x", c);
        else
            v[at++] = (char)c;
    }
    v[at++] = '"';
    return at;
}

/* vocab.json of the 256 bytes and each merge line's two halves joined (duplicates left to
 * the loader's JSON_REJECT_DUPLICATES, which then refuses the file). */
static char *build_vocab(const char *merges, size_t n, size_t *len)
{
    const size_t cap = 256 * 16 + n * 12 + 64; /* a line of L bytes writes at most 6L + 18 */
    char *v = malloc(cap);
    size_t at = 0, id = 0;
    v[at++] = '{';
    for (int b = 0; b < 256; b++) {
        char t[4];
        size_t k = bpe_byte_char((unsigned char)b, t);
        at = put_token(v, cap, at, t, k);
        at += (size_t)snprintf(v + at, cap - at, ":%zu,", id++);
    }
    for (size_t i = 0; i < n;) {
        const char *s = merges + i, *nl = memchr(s, '\n', n - i);
        size_t k = nl ? (size_t)(nl - s) : n - i;
        i += k + 1;
        const char *sp = memchr(s, ' ', k);
        if (!sp || (i == k + 1 && s[0] == '#'))
            continue;
        char *joined = malloc(k);
        memcpy(joined, s, (size_t)(sp - s));
        memcpy(joined + (sp - s), sp + 1, k - (size_t)(sp - s) - 1);
        at = put_token(v, cap, at, joined, k - 1);
        at += (size_t)snprintf(v + at, cap - at, ":%zu,", id++);
        free(joined);
    }
    v[at - 1] = '}';
    *len = at;
    return v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const char *p = (const char *)data + 1, *end = (const char *)data + size;
    const bool given = data[0] & 1;
    const char *vocab = NULL, *merges, *text;
    size_t vn = 0, mn, tn;
    char *built = NULL;
    if (given) {
        const char *z = memchr(p, '\0', (size_t)(end - p));
        if (!z)
            return 0;
        vocab = p;
        vn = (size_t)(z - p);
        p = z + 1;
    }
    const char *z = memchr(p, '\0', (size_t)(end - p));
    merges = p;
    mn = z ? (size_t)(z - p) : (size_t)(end - p);
    text = z ? z + 1 : end;
    tn = (size_t)(end - text);
    if (!given)
        vocab = built = build_vocab(merges, mn, &vn);
    struct ddpd_error err;
    ddpd_error_clear(&err);
    struct bpe *b = bpe_new(vocab, vn, "vocab.json", merges, mn, "merges.txt", &err);
    free(built);
    if (!b) {
        if (err.code == DDPD_OK || !err.message[0]) {
            fprintf(stderr, "bpe_new failed without its detail\n");
            abort();
        }
        return 0;
    }
    struct bpe_ids ids = {0};
    if (bpe_encode(b, text, tn, &ids, &err) != DDPD_OK) {
        fprintf(stderr, "bpe_encode: %s\n", err.message);
        abort();
    }
    for (size_t i = 0; i < ids.n; i++)
        if (ids.v[i] < 0 || ids.v[i] >= bpe_vocab_size(b))
            abort();
    char *back = malloc(tn + 1);
    if (bpe_decode(b, ids.v, ids.n, back, tn + 1) != tn || memcmp(back, text, tn) != 0) {
        fprintf(stderr, "decode(encode(text)) is not the text\n");
        abort();
    }
    free(back);
    free(ids.v);
    bpe_free(b);
    return 0;
}
