/* test_bpe.c — the tokenizer (tokenizer/bpe.h) on a small hand-made vocabulary whose ids
 * were worked out by hand: the 256 bytes as ids 0..255 (id = the byte) and 15 merges.
 * Covers GPT-2's pre-tokeniser (contractions, a space joining the next word, numbers,
 * punctuation, runs of spaces with the last one left for the word, trailing spaces,
 * newlines), the merge loop's order (every place of the lowest-ranked pair left to right
 * in one pass), bytes that are not UTF-8, decoding, the safe cut, and the loaders' errors,
 * each naming the file and its line. */
#include <string.h>

#include "check.h"
#include "tokenizer/bpe.h"

/* GPT-2's bytes_to_unicode, written again here (not bpe_byte_char: the loader's alphabet is
 * what this checks): byte b's character as UTF-8 into out. */
static size_t alpha(int b, char *out)
{
    int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    int cp = b;
    if (!printable) {
        int n = 0;
        for (int c = 0; c < b; c++)
            n += !((c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF));
        cp = 256 + n;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

/* A token's bytes written in the alphabet, as a JSON string's content (no escapes needed
 * but for '"' and '\\'). */
static void alpha_str(const char *bytes, char *out)
{
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)bytes; *p; p++) {
        if (*p == '"' || *p == '\\')
            out[n++] = '\\';
        n += alpha(*p, out + n);
    }
    out[n] = '\0';
}

/* The merges in rank order, as bytes (a space is the byte 0x20, written Ġ in the files). */
static const char *const MERGES[][2] = {
    {"h", "e"}, {"l", "l"},   {"he", "ll"}, {"hell", "o"},  {" ", "w"},
    {"o", "r"}, {" w", "or"}, {"l", "d"},   {" wor", "ld"}, {"'", "s"},
    {"1", "2"}, {" ", "1"},   {" ", " "},   {"\n", "\n"},   {"a", "a"},
};
#define NMERGES (int)(sizeof MERGES / sizeof MERGES[0])

static char vocab_json[64 << 10], merges_txt[16 << 10];

static void make_files(void)
{
    size_t v = 0, m = 0;
    char t[64], a[64], b[64];
    v += (size_t)snprintf(vocab_json + v, sizeof vocab_json - v, "{");
    for (int i = 0; i < 256; i++) {
        char one[2] = {(char)i, 0};
        if (i == 0) { /* the NUL byte: written by hand, alpha_str stops at it */
            size_t k = alpha(0, t);
            t[k] = '\0';
        } else {
            alpha_str(one, t);
        }
        v += (size_t)snprintf(vocab_json + v, sizeof vocab_json - v, "%s\"%s\": %d", i ? ", " : "", t, i);
    }
    m += (size_t)snprintf(merges_txt + m, sizeof merges_txt - m, "#version: 0.2\n");
    for (int r = 0; r < NMERGES; r++) {
        char both[64];
        snprintf(both, sizeof both, "%s%s", MERGES[r][0], MERGES[r][1]);
        alpha_str(both, t);
        /* "he" + "ll" and the like: the result of an earlier merge is already there. */
        int seen = 0;
        for (int q = 0; q < r; q++) {
            char prev[64];
            snprintf(prev, sizeof prev, "%s%s", MERGES[q][0], MERGES[q][1]);
            seen |= !strcmp(prev, both);
        }
        if (!seen)
            v += (size_t)snprintf(vocab_json + v, sizeof vocab_json - v, ", \"%s\": %d", t, 256 + r);
        alpha_str(MERGES[r][0], a);
        alpha_str(MERGES[r][1], b);
        m += (size_t)snprintf(merges_txt + m, sizeof merges_txt - m, "%s %s\n", a, b);
    }
    snprintf(vocab_json + v, sizeof vocab_json - v, "}");
}

static struct bpe *load(const char *vocab, const char *merges, struct ddpd_error *err)
{
    ddpd_error_clear(err);
    return bpe_new(vocab, strlen(vocab), "vocab.json", merges, strlen(merges), "merges.txt", err);
}

/* Encodes `text` and compares with the n expected ids; then decodes back. */
static void expect(struct bpe *b, const char *text, size_t len, const int32_t *want, size_t n)
{
    struct bpe_ids ids = {0};
    struct ddpd_error err;
    CHECK_EQ_INT(bpe_encode(b, text, len, &ids, &err), DDPD_OK);
    int same = ids.n == n && !memcmp(ids.v, want, n * sizeof *want);
    if (!same) {
        fprintf(stderr, "encoding \"%.*s\":\n  got     ", (int)len, text);
        for (size_t i = 0; i < ids.n; i++)
            fprintf(stderr, " %d", ids.v[i]);
        fprintf(stderr, "\n  expected");
        for (size_t i = 0; i < n; i++)
            fprintf(stderr, " %d", want[i]);
        fputc('\n', stderr);
    }
    CHECK(same);
    char back[256];
    size_t k = bpe_decode(b, ids.v, ids.n, back, sizeof back);
    CHECK(k == len && !memcmp(back, text, len));
    free(ids.v);
}

#define EXPECT(b, text, ...)                                                                                 \
    do {                                                                                                     \
        static const int32_t want_[] = {__VA_ARGS__};                                                        \
        expect(b, text, sizeof text - 1, want_, sizeof want_ / sizeof want_[0]);                             \
    } while (0)

static void test_hand_worked_ids(void)
{
    struct ddpd_error err;
    struct bpe *b = load(vocab_json, merges_txt, &err);
    CHECK(b != NULL);
    if (!b) {
        fprintf(stderr, "%s\n", err.message);
        return;
    }
    CHECK_EQ_INT(bpe_vocab_size(b), 256 + NMERGES);
    /* h e l l o: he (rank 0), ll (1), hell (2), hello (3); " world": Ġw (4), or (5), Ġwor
     * (6), ld (7), Ġworld (8). */
    EXPECT(b, "hello world", 259, 264);
    /* Contractions are pieces of their own; 's merges (9), 'll is ' then ll. */
    EXPECT(b, "it's", 'i', 't', 265);
    EXPECT(b, "I'll", 'I', '\'', 257);
    /* A number keeps its space: Ġ1 (11) loses to 12 (10), and then nothing merges. */
    EXPECT(b, "a 123", 'a', ' ', 266, '3');
    /* Punctuation runs are one piece, a space before them joins them. */
    EXPECT(b, "hello!! ?!", 259, '!', '!', ' ', '?', '!');
    /* Three spaces before a word: "  " (ĠĠ, 12) and " b" (the last space joins the word). */
    EXPECT(b, "a   b", 'a', 268, ' ', 'b');
    /* Trailing spaces are one piece: ĠĠĠ is ĠĠ then Ġ (one pass, left to right). */
    EXPECT(b, "a   ", 'a', 268, ' ');
    /* Newlines: "\n\n" before a letter is "\n" and "\n"; three are "\n\n" (13) and "\n". */
    EXPECT(b, "a\n\nb", 'a', '\n', '\n', 'b');
    EXPECT(b, "a\n\n\nb", 'a', 269, '\n', 'b');
    /* One pass merges every place of the pair from the left: aaa -> aa a, aaaa -> aa aa. */
    EXPECT(b, "aaa", 270, 'a');
    EXPECT(b, "aaaa", 270, 270);
    /* Non-ASCII letters are letters (é is C3 A9; " é" one piece); an emoji is "other". */
    EXPECT(b, "caf\xc3\xa9 \xc3\xa9!", 'c', 'a', 'f', 0xC3, 0xA9, ' ', 0xC3, 0xA9, '!');
    /* Bytes that are not UTF-8 are pieces of their own, and come back as they were. */
    EXPECT(b, "he\xff\xfell", 256, 0xFF, 0xFE, 257);
    /* The cache gives the same ids the second time. */
    EXPECT(b, "hello hello hello", 259, ' ', 259, ' ', 259);
    int32_t bad = 999;
    char out[8];
    CHECK(bpe_decode(b, &bad, 1, out, sizeof out) == SIZE_MAX);
    size_t len = 0;
    CHECK(bpe_token(b, 264, &len) && len == 6 && !memcmp(bpe_token(b, 264, &len), " world", 6));
    CHECK(bpe_max_token_bytes(b) == 6);
    bpe_free(b);
}

static void test_safe_cut(void)
{
    CHECK_EQ_INT(bpe_safe_cut("abc def", 7), 3);
    CHECK_EQ_INT(bpe_safe_cut("abc\ndef ", 8), 3);
    CHECK_EQ_INT(bpe_safe_cut("abc  def", 8), 0);   /* a run of spaces: not there */
    CHECK_EQ_INT(bpe_safe_cut("abc\n\ndef", 8), 0); /* nor in a run of newlines */
    CHECK_EQ_INT(bpe_safe_cut("ab\xc3\xa9 def", 8), 0);
    CHECK_EQ_INT(bpe_safe_cut("x", 1), 0);
    /* Wherever it cuts, the two halves encode as the whole. */
    struct ddpd_error err;
    struct bpe *b = load(vocab_json, merges_txt, &err);
    const char *t = "hello world it's 123 a   b\nhello\n\n\nworld   x  !! aaaa hello world\n";
    size_t n = strlen(t);
    for (size_t end = 2; b && end <= n; end++) {
        size_t q = bpe_safe_cut(t, end);
        if (!q)
            continue;
        struct bpe_ids whole = {0}, parts = {0};
        bpe_encode(b, t, n, &whole, &err);
        bpe_encode(b, t, q, &parts, &err);
        bpe_encode(b, t + q, n - q, &parts, &err);
        CHECK(whole.n == parts.n && !memcmp(whole.v, parts.v, whole.n * sizeof(int32_t)));
        free(whole.v);
        free(parts.v);
    }
    bpe_free(b);
}

/* Loading fails with `code`, the error's message containing `want`. */
static void expect_error(const char *vocab, const char *merges, ddpd_err code, const char *want)
{
    struct ddpd_error err;
    struct bpe *b = load(vocab, merges, &err);
    CHECK(b == NULL);
    bpe_free(b);
    CHECK_EQ_INT(err.code, code);
    if (!strstr(err.message, want))
        CHECK__FAIL("error \"%s\" does not say \"%s\"", err.message, want);
}

static void test_malformed_files(void)
{
    static char m[sizeof merges_txt + 256], v[sizeof vocab_json + 256];
    /* merges.txt: a line with three tokens, one with one, an empty one, an unknown token,
     * a merge whose result is not a token, a merge given twice. */
    snprintf(m, sizeof m, "#version: 0.2\nĠ w\nh e l\n");
    expect_error(vocab_json, m, DDPD_EDATA, "merges.txt line 3: expected two tokens separated by one space");
    snprintf(m, sizeof m, "#version: 0.2\nĠ w\nhe\n");
    expect_error(vocab_json, m, DDPD_EDATA, "merges.txt line 3: expected two tokens");
    snprintf(m, sizeof m, "#version: 0.2\nh e\n\nl l\n");
    expect_error(vocab_json, m, DDPD_EDATA, "merges.txt line 3: an empty line");
    snprintf(m, sizeof m, "#version: 0.2\nh e\nxyz e\n");
    expect_error(vocab_json, m, DDPD_EDATA, "merges.txt line 3: \"xyz\" is not a token of the vocabulary");
    snprintf(m, sizeof m, "#version: 0.2\nh e\nq z\n");
    expect_error(vocab_json, m, DDPD_EDATA, "merges.txt line 3: the merge of \"q\" and \"z\" is not a token");
    snprintf(m, sizeof m, "#version: 0.2\nh e\nl l\nh e\n");
    expect_error(vocab_json, m, DDPD_EDATA, "merges.txt line 4: the merge \"h e\" is there already (rank 0)");
    /* vocab.json: not JSON (jansson's line), not an object, an id twice, an id out of
     * range, a character outside the alphabet, a byte missing. */
    expect_error("{\n\"a\": 1,\n\"b\" 2}", merges_txt, DDPD_EDATA, "vocab.json line 3:");
    expect_error("[1, 2]", merges_txt, DDPD_EDATA, "vocab.json: expected a JSON object");
    snprintf(v, sizeof v, "%.*s, \"zz\": 7}", (int)strlen(vocab_json) - 1, vocab_json);
    expect_error(v, merges_txt, DDPD_EDATA, "both have id 7");
    snprintf(v, sizeof v, "%.*s, \"zz\": 9999}", (int)strlen(vocab_json) - 1, vocab_json);
    expect_error(v, merges_txt, DDPD_EDATA, "token \"zz\" has id out of range");
    snprintf(v, sizeof v, "%.*s, \"z z\": 271}", (int)strlen(vocab_json) - 1, vocab_json);
    expect_error(v, merges_txt, DDPD_EDATA, "holds U+0020, which is not in GPT-2's byte alphabet");
    char *w = strstr(vocab_json, "\"w\": 119");
    CHECK(w != NULL);
    if (w) {
        snprintf(v, sizeof v, "%.*s\"ww\": 119%s", (int)(w - vocab_json), vocab_json,
                 w + strlen("\"w\": 119"));
        expect_error(v, "#version: 0.2\n", DDPD_EDATA, "no token for the byte 0x77");
    }
}

int main(void)
{
    make_files();
    test_hand_worked_ids();
    test_safe_cut();
    test_malformed_files();
    CHECK_DONE();
}
