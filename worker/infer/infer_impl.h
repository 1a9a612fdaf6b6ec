/* infer/infer_impl.h — what the files of `ddpd-worker --infer` share and nobody else sees
 * (tests aside): the loaded model's state, the request reader, the answer writers, the KV
 * cache (cache.c), sampling and the UTF-8 stream decoder (sample.c), and the two requests
 * (generate.c, predict.c). The protocol itself is infer.h's and docs/generation.md's. */
#ifndef DDPD_INFER_IMPL_H
#define DDPD_INFER_IMPL_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "../../schema/err.h"
#include "../../schema/spec.h"
#include "../dev.h"
#include "../model.h"
#include "../../tokenizer/bpe.h"
#include "infer.h"

/* Caps on what a request sizes (each refused with the field's name, never truncated). */
#define INFER_LINE_MAX      (64 << 20) /* bytes of one request line */
#define INFER_MAX_BATCH     4096       /* load's max_batch */
#define INFER_MAX_PROMPT    (1 << 20)  /* tokens of a prompt (only the last block_size count) */
#define INFER_MAX_SAMPLES   65536      /* samples of one predict */
#define INFER_MAX_OUTPUTS   (1 << 24)  /* output values of one predict (~250 MB of JSON) */
#define INFER_TOP           5          /* classes in predict's "top" */
#define INFER_MAX_TEMP      1000.0     /* temperature */
#define INFER_DEFAULT_BATCH 64

/* ---- the request reader (infer.c) ---- */

/* Lines of stdin, read with read(2) into a buffer of our own, so that generation can look
 * for a cancel without blocking (stdio's buffer would hide what it has read from poll). */
struct lines {
    int fd;
    char *buf;
    size_t len, cap; /* bytes held, from buf[0] */
    bool eof;
    bool skipping; /* dropping the rest of a line longer than INFER_LINE_MAX */
    size_t taken;  /* bytes lines_consume drops: the peeked line and its newline */
};

enum lines_rc { LINES_LINE, LINES_NONE, LINES_EOF, LINES_TOOLONG };

/* The next line (line[0..n), without its newline, not NUL-terminated: borrowed until
 * lines_consume or the next peek), waiting for it when `block`, else only taking what stdin has now.
 * LINES_TOOLONG: a line longer than INFER_LINE_MAX was dropped whole. A last line without
 * a newline counts at EOF. */
enum lines_rc lines_peek(struct lines *l, bool block, char **line, size_t *n);
/* Drops the line lines_peek returned. */
void lines_consume(struct lines *l);

/* ---- the loaded model (infer.c) ---- */

struct kv;

struct infer {
    struct lines in;
    FILE *out;
    struct dev cpu; /* opened once; the model's device unless it is on a GPU */
    struct dev dev; /* the model's */
    bool cuda;
    struct spec *spec; /* the loaded model's spec (heap: a spec is large); NULL when none */
    struct model *m;
    struct kv *kv;       /* the KV cache, for models that generate */
    struct bpe *tok;     /* the spec's tokenizer (text in and out), NULL without one */
    char why_not[512];   /* why this model cannot generate ("" when it can) */
    int64_t max_batch;   /* predict's largest batch */
    int64_t resident;    /* what load reported */
    bool cancel_pending; /* a cancel line arrived while generating */
    /* predict's activations and input batch, kept between predicts (infer__plan_release) */
    int64_t plan_rows; /* samples they hold; 0: none */
    void *plan_x;
    double plan_used; /* base_mono_s of the last predict */
};

/* Writes `obj` (stolen) as one compact line (floats with 9 significant digits) and
 * flushes. */
void infer__write(struct infer *in, json_t *obj);
/* The final line of a failed request. */
void infer__fail(struct infer *in, const char *op, const struct ddpd_error *err);
/* A JSON string of `s[0..n)` that is valid UTF-8 whatever s holds (invalid bytes become
 * U+FFFD). A new reference. */
json_t *infer__text(const char *s, size_t n);
/* Whether a cancel has arrived (stdin looked at without blocking, a cancel line consumed;
 * EOF counts as a cancel). A request line that comes first stays for after. */
bool infer__cancelled(struct infer *in);

/* How long predict's activations outlive the last predict while the worker waits. */
#define INFER_PLAN_IDLE_S 1.0

/* Gives back predict's activations and input batch (idle, or another request comes). */
void infer__plan_release(struct infer *in);

/* The requests, each answering exactly one final line. */
void infer__generate(struct infer *in, json_t *req);
void infer__predict(struct infer *in, json_t *req);

/* Reads an optional integer member `key` of `req` into *out (unchanged when absent), in
 * [lo, hi]; DDPD_ESPEC naming the key otherwise. */
ddpd_err infer__int(json_t *req, const char *key, int64_t lo, int64_t hi, int64_t *out,
                    struct ddpd_error *err);

/* ---- the KV cache and the incremental forward (cache.c) ---- */

/* NULL when `s` can generate (starts with embedding, ends in logits [T, num] over that
 * vocabulary with cross_entropy, and every layer is one the incremental forward runs:
 * embedding, position, layernorm, linear, activations, dropout, residual, attention),
 * else why not, written into why[cap]. */
const char *kv_why_not(const struct spec *s, char *why, size_t cap);
/* The cache and workspace of generation for model `m` of spec `s` (kv_why_not(s) NULL),
 * on the model's device; NULL with err set (DDPD_EDEVICE) when memory runs out. */
struct kv *kv_new(struct model *m, const struct spec *s, struct ddpd_error *err);
void kv_free(struct kv *g);
/* Device bytes the cache holds (K and V of every attention layer), and the workspace's:
 * one row's activations (kept) and a window's (allocated by the request that needs them,
 * kv_release gives them back). */
int64_t kv_cache_bytes(const struct kv *g);
int64_t kv_work_bytes(const struct kv *g);
int64_t kv_block(const struct kv *g); /* block_size: the window */
int64_t kv_vocab(const struct kv *g);
int64_t kv_len(const struct kv *g); /* positions the cache holds */
/* Whether one more token can come from the cache (every attention causal and the window
 * not full); else the next logits need kv_window. */
bool kv_can_step(const struct kv *g);
/* The logits [vocab] of the token after the window ids[0..n) (1 <= n <= block_size, ids
 * in range): the window's forward from position 0, which fills the cache with its n
 * positions. Host memory, borrowed until the next call. NULL with err set (DDPD_EDEVICE)
 * when the window's activations cannot be allocated. */
const float *kv_window(struct kv *g, const int32_t *ids, int64_t n, struct ddpd_error *err);
/* The logits after one more token `id` at position kv_len (kv_can_step): one position's
 * forward against the cached keys and values. */
const float *kv_step(struct kv *g, int32_t id);
/* Gives back a window's activations (the end of a request). */
void kv_release(struct kv *g);

/* ---- sampling and text (sample.c) ---- */

/* The next token from logits[vocab] (docs/generation.md "Sampling"): temperature 0 is
 * argmax (the lowest id among equal maxima); else p_i = exp((l_i - l_max) / T) over the
 * top_k largest logits (ties by lower id; 0 or >= vocab: all), and the first id whose
 * running sum of p exceeds u * sum(p), u = rng_uniform of rng_seed2(seed, index).
 * work[vocab] and order[vocab] are scratch. -1 when no logit is finite (or, sampling, a
 * NaN). */
int32_t sample_next(const float *logits, int64_t vocab, double temperature, int64_t top_k, uint64_t seed,
                    uint64_t index, double *work, int32_t *order);

/* An incremental UTF-8 decoder for a byte stream: text comes out as soon as a character
 * is complete; a partial sequence is held back; every maximal ill-formed subpart becomes
 * one U+FFFD (the Unicode standard's recommended practice, as WHATWG's decoder). */
struct utf8_stream {
    unsigned char held[4];
    int n;                /* bytes held */
    int need;             /* bytes the held sequence needs in all */
    unsigned char lo, hi; /* the range of the next byte */
};
#define UTF8_OUT_MAX 8 /* bytes one feed or flush writes at most */
void utf8_stream_init(struct utf8_stream *u);
/* Feeds byte b; writes the completed text to out (room for UTF8_OUT_MAX) and returns its
 * length (0 while a sequence is incomplete). */
size_t utf8_stream_feed(struct utf8_stream *u, unsigned char b, char *out);
/* The end of the stream: a held partial sequence becomes U+FFFD. */
size_t utf8_stream_flush(struct utf8_stream *u, char *out);

#endif
