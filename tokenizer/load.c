/* load.c — vocab.json and merges.txt into a tokenizer (bpe.h): GPT-2's byte alphabet
 * (bytes_to_unicode) undone on every token, the ids checked dense, every merge's two
 * tokens and its result looked up in the vocabulary and its rank kept. Every error names
 * the file and, in merges.txt, the line. Knows nothing of encoding. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../base/file.h"
#include "bpe_impl.h"

/* GPT-2's bytes_to_unicode: the printable bytes '!'..'~', 0xA1..0xAC and 0xAE..0xFF stand
 * for themselves; the other 68, in increasing order, for U+0100 onwards. */
static int byte_to_cp(int b)
{
    int n = 0;
    for (int c = 0; c < b; c++)
        n += !((c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF));
    return ((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)) ? b : 256 + n;
}

size_t bpe_byte_char(unsigned char b, char out[2])
{
    int cp = byte_to_cp(b);
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

/* The byte each alphabet code point stands for; -1 outside the alphabet. */
struct alphabet {
    int16_t byte[324];
};

static void alphabet_init(struct alphabet *a)
{
    memset(a->byte, 0xff, sizeof a->byte);
    for (int b = 0; b < 256; b++)
        a->byte[byte_to_cp(b)] = (int16_t)b;
}

/* One UTF-8 character of s[0..n) (valid: jansson's strings are): its code point, *len. */
static uint32_t utf8_next(const unsigned char *s, size_t n, size_t *len)
{
    if (s[0] < 0x80 || n < 2) {
        *len = 1;
        return s[0];
    }
    if (s[0] < 0xE0 || n < 3) {
        *len = 2;
        return (uint32_t)(s[0] & 0x1F) << 6 | (s[1] & 0x3F);
    }
    if (s[0] < 0xF0 || n < 4) {
        *len = 3;
        return (uint32_t)(s[0] & 0x0F) << 12 | (uint32_t)(s[1] & 0x3F) << 6 | (s[2] & 0x3F);
    }
    *len = 4;
    return (uint32_t)(s[0] & 0x07) << 18 | (uint32_t)(s[1] & 0x3F) << 12 | (uint32_t)(s[2] & 0x3F) << 6 |
           (s[3] & 0x3F);
}

/* A token written in the alphabet (s[0..n)) as its bytes into out (room for n): their
 * count, or -1 with *bad the first code point outside the alphabet. */
static long unalphabet(const struct alphabet *a, const char *s, size_t n, unsigned char *out, uint32_t *bad)
{
    const unsigned char *p = (const unsigned char *)s;
    long k = 0;
    for (size_t i = 0; i < n;) {
        size_t len;
        uint32_t cp = utf8_next(p + i, n - i, &len);
        if (cp >= 324 || a->byte[cp] < 0) {
            *bad = cp;
            return -1;
        }
        out[k++] = (unsigned char)a->byte[cp];
        i += len;
    }
    return k;
}

/* "U+0020" or the character itself, for messages. */
static const char *cp_name(uint32_t cp, char *buf, size_t cap)
{
    snprintf(buf, cap, "U+%04" PRIX32, cp);
    return buf;
}

static ddpd_err load_vocab(struct bpe *b, const struct alphabet *a, const char *text, size_t len,
                           const char *name, struct bpe_map *vocab, struct ddpd_error *err)
{
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    ddpd_err rc = DDPD_OK;
    if (!root)
        return ddpd_error_set(err, DDPD_EDATA, name, "%s line %d: %s", name, je.line, je.text);
    if (!json_is_object(root)) {
        rc = ddpd_error_set(err, DDPD_EDATA, name, "%s: expected a JSON object of token -> id", name);
        goto out;
    }
    size_t n = json_object_size(root);
    if (n < 256 || n > BPE_VOCAB_MAX) {
        rc = ddpd_error_set(err, n > BPE_VOCAB_MAX ? DDPD_ETOOBIG : DDPD_EDATA, name,
                            "%s: %zu tokens; a byte-level vocabulary has from 256 (every byte) to %d", name,
                            n, BPE_VOCAB_MAX);
        goto out;
    }
    b->n = (int32_t)n;
    size_t total = 0;
    const char *key;
    json_t *v;
    json_object_foreach (root, key, v)
        total += strlen(key);
    b->off = calloc(n + 1, sizeof *b->off);
    b->bytes = malloc(total + 1);
    const char **who = calloc(n, sizeof *who); /* the token that has each id */
    if (!b->off || !b->bytes || !who || total > UINT32_MAX) {
        free(who);
        rc = ddpd_error_set(err, DDPD_ENOMEM, name, "%s: out of memory reading %zu tokens", name, n);
        goto out;
    }
    uint32_t *len_of = calloc(n, sizeof *len_of);
    if (!len_of) {
        free(who);
        rc = ddpd_error_set(err, DDPD_ENOMEM, name, "%s: out of memory reading %zu tokens", name, n);
        goto out;
    }
    /* First the ids (each once, all below n), then the bytes in id order. */
    json_object_foreach (root, key, v) {
        char kb[64];
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= (json_int_t)n) {
            rc = ddpd_error_set(err, DDPD_EDATA, name,
                                "%s: token \"%.40s\" has id %s; the ids of %zu tokens are the integers 0 to "
                                "%zu, each once",
                                name, key, json_is_integer(v) ? "out of range" : "that is not an integer", n,
                                n - 1);
            break;
        }
        json_int_t id = json_integer_value(v);
        if (who[id]) {
            snprintf(kb, sizeof kb, "%.40s", who[id]);
            rc = ddpd_error_set(err, DDPD_EDATA, name,
                                "%s: tokens \"%s\" and \"%.40s\" both have id %" JSON_INTEGER_FORMAT, name,
                                kb, key, id);
            break;
        }
        who[id] = key;
    }
    size_t at = 0;
    for (size_t id = 0; !rc && id < n; id++) {
        uint32_t bad = 0;
        char cb[16];
        long k = unalphabet(a, who[id], strlen(who[id]), b->bytes + at, &bad);
        if (k <= 0) {
            rc = ddpd_error_set(err, DDPD_EDATA, name,
                                k < 0 ? "%s: token \"%.40s\" (id %zu) holds %s, which is not in GPT-2's byte "
                                        "alphabet (bytes_to_unicode)"
                                      : "%s: token \"%.40s\" (id %zu) is empty%s",
                                name, who[id], id, k < 0 ? cp_name(bad, cb, sizeof cb) : "");
            break;
        }
        b->off[id] = (uint32_t)at;
        len_of[id] = (uint32_t)k;
        if ((size_t)k > b->max_len)
            b->max_len = (size_t)k;
        const struct bpe_slot *had = NULL;
        int put = map_put(vocab, b->bytes + at, (size_t)k, map_hash(b->bytes + at, (size_t)k), (uint32_t)id,
                          0, &had);
        if (put < 0) {
            rc = ddpd_error_set(err, DDPD_ENOMEM, name, "%s: out of memory", name);
            break;
        }
        if (put == 0) {
            rc = ddpd_error_set(err, DDPD_EDATA, name, "%s: tokens %" PRIu32 " and %zu are the same bytes",
                                name, had->v0, id);
            break;
        }
        at += (size_t)k;
    }
    b->off[n] = (uint32_t)at;
    free(who);
    free(len_of);
    for (int c = 0; !rc && c < 256; c++) {
        unsigned char byte = (unsigned char)c;
        const struct bpe_slot *s = map_find(vocab, &byte, 1, map_hash(&byte, 1));
        if (!s) {
            char cb[16];
            rc =
                ddpd_error_set(err, DDPD_EDATA, name,
                               "%s: no token for the byte 0x%02X (%s in GPT-2's byte alphabet): a byte-level "
                               "vocabulary holds all 256 bytes",
                               name, c, cp_name((uint32_t)byte_to_cp(c), cb, sizeof cb));
            break;
        }
        b->byte_id[c] = (int32_t)s->v0;
    }
out:
    json_decref(root);
    return rc;
}

/* One token of a merges line, its bytes looked up: the id, or -1 with err set. */
static int32_t merge_token(const struct alphabet *a, const struct bpe_map *vocab, const char *s, size_t n,
                           unsigned char *buf, size_t *blen, const char *name, int line,
                           struct ddpd_error *err)
{
    uint32_t bad = 0;
    char cb[16];
    long k = unalphabet(a, s, n, buf, &bad);
    if (k < 0) {
        ddpd_error_set(err, DDPD_EDATA, name,
                       "%s line %d: \"%.*s\" holds %s, which is not in GPT-2's byte alphabet", name, line,
                       (int)(n > 40 ? 40 : n), s, cp_name(bad, cb, sizeof cb));
        return -1;
    }
    const struct bpe_slot *t = map_find(vocab, buf, (size_t)k, map_hash(buf, (size_t)k));
    if (!t) {
        ddpd_error_set(err, DDPD_EDATA, name, "%s line %d: \"%.*s\" is not a token of the vocabulary", name,
                       line, (int)(n > 40 ? 40 : n), s);
        return -1;
    }
    *blen = (size_t)k;
    return (int32_t)t->v0;
}

static ddpd_err load_merges(struct bpe *b, const struct alphabet *a, const char *text, size_t len,
                            const char *name, const struct bpe_map *vocab, struct ddpd_error *err)
{
    unsigned char *buf = malloc(2 * len + 2);
    if (!buf)
        return ddpd_error_set(err, DDPD_ENOMEM, name, "%s: out of memory", name);
    ddpd_err rc = DDPD_OK;
    uint32_t rank = 0;
    int line = 0;
    for (size_t i = 0; i < len && !rc;) {
        const char *s = text + i, *nl = memchr(s, '\n', len - i);
        size_t n = nl ? (size_t)(nl - s) : len - i;
        i += n + (nl != NULL);
        line++;
        if (n && s[n - 1] == '\r')
            n--;
        if (line == 1 && n >= 1 && s[0] == '#')
            continue; /* "#version: 0.2" */
        if (n == 0) {
            if (i >= len)
                break; /* the newline that ends the last line */
            rc = ddpd_error_set(err, DDPD_EDATA, name, "%s line %d: an empty line; expected a merge \"A B\"",
                                name, line);
            break;
        }
        size_t parts = 1;
        for (size_t k = 0; k < n; k++)
            parts += s[k] == ' ';
        const char *sp = memchr(s, ' ', n);
        if (parts != 2 || sp == s || sp == s + n - 1) {
            rc = ddpd_error_set(err, DDPD_EDATA, name,
                                "%s line %d: expected two tokens separated by one space, got %s", name, line,
                                parts == 1   ? "one"
                                : parts == 2 ? "an empty token"
                                             : "more than two");
            break;
        }
        size_t la = (size_t)(sp - s), lb = n - la - 1, ka = 0, kb = 0;
        int32_t ia = merge_token(a, vocab, s, la, buf, &ka, name, line, err);
        int32_t ib = ia < 0 ? -1 : merge_token(a, vocab, sp + 1, lb, buf + ka, &kb, name, line, err);
        if (ib < 0) {
            rc = err ? err->code : DDPD_EDATA;
            break;
        }
        const struct bpe_slot *ab = map_find(vocab, buf, ka + kb, map_hash(buf, ka + kb));
        if (!ab) {
            rc = ddpd_error_set(err, DDPD_EDATA, name,
                                "%s line %d: the merge of \"%.*s\" and \"%.*s\" is not a token of the "
                                "vocabulary",
                                name, line, (int)(la > 40 ? 40 : la), s, (int)(lb > 40 ? 40 : lb), sp + 1);
            break;
        }
        int32_t key[2] = {ia, ib};
        const struct bpe_slot *had = NULL;
        int put = map_put(&b->merges, key, sizeof key, map_hash(key, sizeof key), rank, ab->v0, &had);
        if (put < 0) {
            rc = ddpd_error_set(err, DDPD_ENOMEM, name, "%s: out of memory", name);
        } else if (put == 0) {
            rc = ddpd_error_set(err, DDPD_EDATA, name,
                                "%s line %d: the merge \"%.*s\" is there already (rank %" PRIu32 ")", name,
                                line, (int)(n > 80 ? 80 : n), s, had->v0);
        }
        rank++;
    }
    free(buf);
    return rc;
}

struct bpe *bpe_new(const char *vocab, size_t vocab_len, const char *vocab_name, const char *merges,
                    size_t merges_len, const char *merges_name, struct ddpd_error *err)
{
    struct alphabet a;
    struct bpe_map words = {0};
    struct bpe *b = calloc(1, sizeof *b);
    if (!b) {
        ddpd_error_set(err, DDPD_ENOMEM, vocab_name, "out of memory for a tokenizer");
        return NULL;
    }
    alphabet_init(&a);
    ddpd_err rc = DDPD_OK;
    if (vocab_len > BPE_FILE_MAX || merges_len > BPE_FILE_MAX)
        rc = ddpd_error_set(err, DDPD_ETOOBIG, vocab_len > BPE_FILE_MAX ? vocab_name : merges_name,
                            "%s: larger than the %d MiB a tokenizer file may be",
                            vocab_len > BPE_FILE_MAX ? vocab_name : merges_name, BPE_FILE_MAX >> 20);
    if (!rc)
        rc = load_vocab(b, &a, vocab, vocab_len, vocab_name, &words, err);
    if (!rc)
        rc = load_merges(b, &a, merges, merges_len, merges_name, &words, err);
    if (!rc)
        rc = bpe_compile(b, err);
    map_free(&words);
    if (rc) {
        bpe_free(b);
        return NULL;
    }
    return b;
}

/* The whole file as a new buffer (*len bytes, NUL-terminated), or NULL with err set. */
static char *read_fd(int fd, const char *name, size_t *len, struct ddpd_error *err)
{
    struct stat st;
    if (fstat(fd, &st) != 0) {
        ddpd_error_set(err, DDPD_EDATA, name, "%s: %s", name, strerror(errno));
        return NULL;
    }
    if (!S_ISREG(st.st_mode)) {
        ddpd_error_set(err, DDPD_EDATA, name, "%s: not a regular file", name);
        return NULL;
    }
    if (st.st_size > BPE_FILE_MAX) {
        ddpd_error_set(err, DDPD_ETOOBIG, name, "%s: larger than the %d MiB a tokenizer file may be", name,
                       BPE_FILE_MAX >> 20);
        return NULL;
    }
    char *p = malloc((size_t)st.st_size + 1);
    if (!p) {
        ddpd_error_set(err, DDPD_ENOMEM, name, "%s: out of memory", name);
        return NULL;
    }
    int64_t got = base_read_at(fd, p, st.st_size, 0);
    if (got != st.st_size) {
        ddpd_error_set(err, DDPD_EDATA, name, "%s: %s", name,
                       got < 0 ? strerror(errno) : "changed while read");
        free(p);
        return NULL;
    }
    p[got] = '\0';
    *len = (size_t)got;
    return p;
}

struct bpe *bpe_new_fds(int vocab_fd, const char *vocab_name, int merges_fd, const char *merges_name,
                        struct ddpd_error *err)
{
    size_t vn = 0, mn = 0;
    char *v = read_fd(vocab_fd, vocab_name, &vn, err);
    char *m = v ? read_fd(merges_fd, merges_name, &mn, err) : NULL;
    struct bpe *b = m ? bpe_new(v, vn, vocab_name, m, mn, merges_name, err) : NULL;
    free(m);
    free(v);
    return b;
}

struct bpe *bpe_open(const char *vocab_path, const char *merges_path, struct ddpd_error *err)
{
    int vfd = open(vocab_path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (vfd < 0) {
        ddpd_error_set(err, DDPD_EDATA, vocab_path, "%s: %s", vocab_path, strerror(errno));
        return NULL;
    }
    int mfd = open(merges_path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (mfd < 0) {
        ddpd_error_set(err, DDPD_EDATA, merges_path, "%s: %s", merges_path, strerror(errno));
        close(vfd);
        return NULL;
    }
    struct bpe *b = bpe_new_fds(vfd, vocab_path, mfd, merges_path, err);
    close(mfd);
    close(vfd);
    return b;
}

void bpe_free(struct bpe *b)
{
    if (!b)
        return;
    if (b->md)
        pcre2_match_data_free(b->md);
    if (b->re)
        pcre2_code_free(b->re);
    map_free(&b->merges);
    map_free(&b->cache);
    free(b->cache_ids);
    free(b->sym);
    free(b->next);
    free(b->prev);
    free(b->heap);
    free(b->pass);
    free(b->fresh);
    free(b->bytes);
    free(b->off);
    free(b);
}

int64_t bpe_vocab_size(const struct bpe *b)
{
    return b->n;
}

size_t bpe_max_token_bytes(const struct bpe *b)
{
    return b->max_len;
}

const unsigned char *bpe_token(const struct bpe *b, int32_t id, size_t *len)
{
    if (id < 0 || id >= b->n)
        return NULL;
    *len = b->off[id + 1] - b->off[id];
    return b->bytes + b->off[id];
}

size_t bpe_decode(const struct bpe *b, const int32_t *ids, size_t n, char *out, size_t cap)
{
    size_t need = 0;
    for (size_t i = 0; i < n; i++) {
        size_t len;
        const unsigned char *t = bpe_token(b, ids[i], &len);
        if (!t)
            return SIZE_MAX;
        if (need + len <= cap)
            memcpy(out + need, t, len);
        need += len;
    }
    return need;
}
