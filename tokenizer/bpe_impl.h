/* bpe_impl.h — what the tokenizer's files share and nobody else includes: the tokenizer's
 * state, the byte-string hash table (map.c) its vocabulary, merges and cache are kept in,
 * and the loader's (load.c) and encoder's (encode.c) entry points into each other. */
#ifndef DDPD_BPE_IMPL_H
#define DDPD_BPE_IMPL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "bpe.h"

/* ---- map.c: byte strings to two 32-bit values, open addressing with linear probing ---- */

struct bpe_slot {
    uint64_t hash; /* 0: an empty slot (a key's hash is never 0) */
    uint32_t koff, klen;
    uint32_t v0, v1;
};

struct bpe_map {
    struct bpe_slot *slot;
    size_t cap, n; /* slots (a power of two), keys held */
    unsigned char *keys;
    size_t keys_n, keys_cap;
};

#define map_hash  bpe__map_hash
#define map_find  bpe__map_find
#define map_put   bpe__map_put
#define map_clear bpe__map_clear
#define map_free  bpe__map_free

uint64_t map_hash(const void *key, size_t n);
/* The slot holding key[0..n) (hash h = map_hash(key, n)), or NULL. Borrowed until the next
 * map_put or map_clear. */
const struct bpe_slot *map_find(const struct bpe_map *m, const void *key, size_t n, uint64_t h);
/* Adds key -> (v0, v1) unless the key is there: 1 added, 0 already there (*found set to
 * its slot), -1 out of memory (the map unchanged). */
int map_put(struct bpe_map *m, const void *key, size_t n, uint64_t h, uint32_t v0, uint32_t v1,
            const struct bpe_slot **found);
/* Empties the map, keeping its memory. */
void map_clear(struct bpe_map *m);
void map_free(struct bpe_map *m);

/* ---- the tokenizer ---- */

#define BPE_CACHE_IDS_MAX (16u << 20) /* ids the cache of pre-tokens holds before it starts over */

/* One entry of the merge loop's heap: the pair (a, b) at node pos, merged at `rank`. */
struct bpe_cand {
    uint32_t rank, pos;
    int32_t a, b, ab;
};

struct bpe {
    int32_t n;            /* tokens */
    unsigned char *bytes; /* every token's bytes, one after another */
    uint32_t *off;        /* [n + 1]: token i is bytes[off[i] .. off[i + 1]) */
    size_t max_len;
    int32_t byte_id[256];  /* the token of each single byte */
    struct bpe_map merges; /* key: int32 a, int32 b -> v0 rank, v1 id of ab */
    struct bpe_map cache;  /* a pre-token's bytes -> v0 offset into cache_ids, v1 count */
    int32_t *cache_ids;
    size_t cache_n, cache_cap;
    pcre2_code *re;
    pcre2_match_data *md;
    bool jit;
    /* the merge loop's scratch, grown to the longest pre-token seen */
    int32_t *sym, *next, *prev;
    struct bpe_cand *heap, *pass, *fresh;
    size_t scratch_cap;
};

/* encode.c: compiles GPT-2's pattern into b->re and b->md (JIT when PCRE2 has it). */
#define bpe_compile bpe__compile
ddpd_err bpe_compile(struct bpe *b, struct ddpd_error *err);

#endif
