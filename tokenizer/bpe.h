/* bpe.h — GPT-2's byte-level BPE tokenizer (OpenAI's encoder.py, tiktoken's "gpt2"): the
 * standard vocab.json and merges.txt read into a tokenizer, text encoded to token ids
 * (GPT-2's pre-tokenising pattern through PCRE2, then the merges) and ids decoded back to
 * bytes. Knows no job, no spec and no file format beyond those two; used by `ddpd
 * tokenize`, the planner and the inference worker. A tokenizer is not thread-safe (its
 * cache and scratch change as it encodes): one per thread. */
#ifndef DDPD_BPE_H
#define DDPD_BPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../schema/err.h"

#define BPE_FILE_MAX  (256 << 20) /* bytes of vocab.json or merges.txt */
#define BPE_VOCAB_MAX (1 << 24)   /* tokens of a vocabulary */

struct bpe;

/* Token ids as encoding appends them (free(v) when done). */
struct bpe_ids {
    int32_t *v;
    size_t n, cap;
};

/* A tokenizer from the texts of vocab.json (vocab[0..vocab_len)) and merges.txt, each
 * named in errors as `vocab_name` and `merges_name` (the file as the user gave it).
 * vocab.json maps each token, written in GPT-2's byte alphabet (bytes_to_unicode), to its
 * id: ids dense from 0, all 256 single bytes present. merges.txt: an optional first line
 * `#version: ...`, then one merge `A B` a line in rank order, A, B and AB all tokens of
 * the vocabulary. Returns a new tokenizer (bpe_free), or NULL with err set: DDPD_EDATA
 * naming the file and, where there is one, its line ("merges.txt line 7: expected two
 * tokens separated by one space, got 3"), DDPD_ETOOBIG past the caps, DDPD_ENOMEM. */
struct bpe *bpe_new(const char *vocab, size_t vocab_len, const char *vocab_name, const char *merges,
                    size_t merges_len, const char *merges_name, struct ddpd_error *err);

/* bpe_new from two open files (read whole from offset 0; the descriptors stay the
 * caller's), named in errors as given. */
struct bpe *bpe_new_fds(int vocab_fd, const char *vocab_name, int merges_fd, const char *merges_name,
                        struct ddpd_error *err);

/* bpe_new from two paths; a file that cannot be read is DDPD_EDATA naming it. */
struct bpe *bpe_open(const char *vocab_path, const char *merges_path, struct ddpd_error *err);

void bpe_free(struct bpe *b);

/* The number of tokens (ids are 0 .. bpe_vocab_size - 1). */
int64_t bpe_vocab_size(const struct bpe *b);
/* The longest token in bytes. */
size_t bpe_max_token_bytes(const struct bpe *b);

/* Appends the ids of text[0..n) to *out (grown with realloc). Any bytes are taken: valid
 * UTF-8 is split by GPT-2's pattern, and a run of bytes that is not UTF-8 (which the
 * pattern cannot match) is one piece of its own, so decode(encode(t)) == t for every t.
 * DDPD_ENOMEM (out keeps what was appended) or DDPD_EINTERNAL (PCRE2 failed) with err
 * set; else DDPD_OK. */
ddpd_err bpe_encode(struct bpe *b, const char *text, size_t n, struct bpe_ids *out, struct ddpd_error *err);

/* The bytes of token `id` (borrowed, valid until bpe_free; *len set), NULL for an id
 * outside the vocabulary. */
const unsigned char *bpe_token(const struct bpe *b, int32_t id, size_t *len);

/* The bytes of ids[0..n) into out[0..cap): returns the bytes they need (write again with
 * more room when that is more than cap), or SIZE_MAX when an id is outside the
 * vocabulary. May end mid-character: a token need not hold whole UTF-8 characters. */
size_t bpe_decode(const struct bpe *b, const int32_t *ids, size_t n, char *out, size_t cap);

/* Where text[0..n) can be cut so that encoding the two parts gives the ids of the whole:
 * the largest q in [1, n) before a space or newline that has a printable ASCII byte (not a
 * space) on each side; 0 when there is none. */
size_t bpe_safe_cut(const char *text, size_t n);

/* Byte b's character in GPT-2's byte alphabet (bytes_to_unicode), as UTF-8 into out (1 or
 * 2 bytes): their count. What vocab.json and merges.txt write a token's bytes with. */
size_t bpe_byte_char(unsigned char b, char out[2]);

/* Whether PCRE2 compiled the pattern to machine code (its JIT), for the benchmark's
 * report. */
bool bpe_jit(const struct bpe *b);

#endif
