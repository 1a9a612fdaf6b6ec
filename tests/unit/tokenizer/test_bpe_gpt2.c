/* test_bpe_gpt2.c — the tokenizer on OpenAI's own GPT-2 files, where they are: the folder
 * DDPD_GPT2_DIR holding vocab.json and merges.txt (Hugging Face's "gpt2" repository has
 * both). Known encodings, as tiktoken's "gpt2" gives them, and the round trip. Exits 77
 * (ctest's skip) without the files: they cannot be downloaded here. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "tokenizer/bpe.h"

static void expect(struct bpe *b, const char *text, const int32_t *want, size_t n)
{
    struct bpe_ids ids = {0};
    struct ddpd_error err;
    CHECK_EQ_INT(bpe_encode(b, text, strlen(text), &ids, &err), DDPD_OK);
    CHECK_EQ_INT(ids.n, n);
    for (size_t i = 0; i < n && i < ids.n; i++)
        CHECK_EQ_INT(ids.v[i], want[i]);
    char back[512];
    CHECK(bpe_decode(b, ids.v, ids.n, back, sizeof back) == strlen(text) &&
          !memcmp(back, text, strlen(text)));
    free(ids.v);
}

#define EXPECT(b, text, ...)                                                                                 \
    do {                                                                                                     \
        static const int32_t want_[] = {__VA_ARGS__};                                                        \
        expect(b, text, want_, sizeof want_ / sizeof want_[0]);                                              \
    } while (0)

int main(void)
{
    const char *dir = getenv("DDPD_GPT2_DIR");
    if (!dir || !*dir) {
        fprintf(stderr, "DDPD_GPT2_DIR is not set: skipped (it names a folder with GPT-2's vocab.json and "
                        "merges.txt)\n");
        return 77;
    }
    char v[4096], m[4096];
    snprintf(v, sizeof v, "%s/vocab.json", dir);
    snprintf(m, sizeof m, "%s/merges.txt", dir);
    struct ddpd_error err;
    struct bpe *b = bpe_open(v, m, &err);
    if (!b) {
        fprintf(stderr, "%s\n", err.message);
        return 1;
    }
    CHECK_EQ_INT(bpe_vocab_size(b), 50257);
    EXPECT(b, "Hello world", 15496, 995);
    EXPECT(b, "hello world", 31373, 995);
    EXPECT(b, "Hello, world!", 15496, 11, 995, 0);
    size_t len = 0;
    const unsigned char *eot = bpe_token(b, 50256, &len);
    CHECK(eot && len == 13 && !memcmp(eot, "<|endoftext|>", 13));
    bpe_free(b);
    CHECK_DONE();
}
