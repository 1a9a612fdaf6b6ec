/* map.c — the tokenizer's one hash table (bpe_impl.h): byte-string keys, copied into the
 * map's own arena, to two 32-bit values, by open addressing with linear probing at most
 * half full. Holds the merge ranks and the cache of pre-tokens; no deletion, only a clear. */
#include <stdlib.h>
#include <string.h>

#include "bpe_impl.h"

static uint64_t mix(uint64_t x)
{
    x ^= x >> 32;
    x *= 0xd6e8feb86659fd93ull;
    x ^= x >> 32;
    x *= 0xd6e8feb86659fd93ull;
    return x ^ (x >> 32);
}

uint64_t map_hash(const void *key, size_t n)
{
    const unsigned char *p = key;
    uint64_t h = 0x9e3779b97f4a7c15ull ^ (uint64_t)n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = mix(h ^ w);
        p += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, p, n);
    h = mix(h ^ w ^ ((uint64_t)n << 56));
    return h ? h : 1;
}

const struct bpe_slot *map_find(const struct bpe_map *m, const void *key, size_t n, uint64_t h)
{
    if (!m->cap)
        return NULL;
    for (size_t i = h & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        const struct bpe_slot *s = &m->slot[i];
        if (!s->hash)
            return NULL;
        if (s->hash == h && s->klen == n && !memcmp(m->keys + s->koff, key, n))
            return s;
    }
}

static bool grow(struct bpe_map *m)
{
    size_t cap = m->cap ? m->cap * 2 : 64;
    struct bpe_slot *slot = calloc(cap, sizeof *slot);
    if (!slot)
        return false;
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->slot[i].hash)
            continue;
        size_t j = m->slot[i].hash & (cap - 1);
        while (slot[j].hash)
            j = (j + 1) & (cap - 1);
        slot[j] = m->slot[i];
    }
    free(m->slot);
    m->slot = slot;
    m->cap = cap;
    return true;
}

int map_put(struct bpe_map *m, const void *key, size_t n, uint64_t h, uint32_t v0, uint32_t v1,
            const struct bpe_slot **found)
{
    const struct bpe_slot *had = map_find(m, key, n, h);
    if (had) {
        if (found)
            *found = had;
        return 0;
    }
    if ((m->n + 1) * 2 > m->cap && !grow(m))
        return -1;
    if (m->keys_n + n > m->keys_cap) {
        size_t cap = m->keys_cap ? m->keys_cap : 4096;
        while (cap < m->keys_n + n)
            cap *= 2;
        if (cap > UINT32_MAX)
            return -1;
        unsigned char *k = realloc(m->keys, cap);
        if (!k)
            return -1;
        m->keys = k;
        m->keys_cap = cap;
    }
    size_t i = h & (m->cap - 1);
    while (m->slot[i].hash)
        i = (i + 1) & (m->cap - 1);
    memcpy(m->keys + m->keys_n, key, n);
    m->slot[i] = (struct bpe_slot){h, (uint32_t)m->keys_n, (uint32_t)n, v0, v1};
    m->keys_n += n;
    m->n++;
    if (found)
        *found = &m->slot[i];
    return 1;
}

void map_clear(struct bpe_map *m)
{
    if (m->cap)
        memset(m->slot, 0, m->cap * sizeof *m->slot);
    m->n = 0;
    m->keys_n = 0;
}

void map_free(struct bpe_map *m)
{
    free(m->slot);
    free(m->keys);
    memset(m, 0, sizeof *m);
}
