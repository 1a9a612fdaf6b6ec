/* idmap.c — see idmap.h. Removal shifts the later entries of a probe run back into the
 * hole, so no tombstones accumulate however many jobs come and go. */
#include "idmap.h"

#include <stdlib.h>

#include "../base/alloc.h"

struct slot {
    int64_t id;
    void *v; /* NULL: free */
};

struct idmap {
    struct slot *t;
    size_t cap, n; /* cap: 0 or a power of two */
};

static size_t home(int64_t id, size_t cap)
{
    return (size_t)((uint64_t)id * 0x9E3779B97F4A7C15ull >> 17) & (cap - 1);
}

struct idmap *idmap_new(void)
{
    return calloc(1, sizeof(struct idmap));
}

void idmap_free(struct idmap *m)
{
    if (!m)
        return;
    free(m->t);
    free(m);
}

static size_t find(const struct idmap *m, int64_t id)
{
    size_t i = home(id, m->cap);
    while (m->t[i].v && m->t[i].id != id)
        i = (i + 1) & (m->cap - 1);
    return i;
}

void *idmap_get(const struct idmap *m, int64_t id)
{
    return m->cap ? m->t[find(m, id)].v : NULL;
}

void idmap_put(struct idmap *m, int64_t id, void *v)
{
    if (2 * (m->n + 1) > m->cap) {
        size_t cap = m->cap ? 2 * m->cap : 256;
        struct slot *old = m->t;
        size_t ocap = m->cap;
        m->t = xcalloc(cap, sizeof *m->t);
        m->cap = cap;
        for (size_t i = 0; i < ocap; i++)
            if (old[i].v)
                m->t[find(m, old[i].id)] = old[i];
        free(old);
    }
    m->t[find(m, id)] = (struct slot){id, v};
    m->n++;
}

void idmap_del(struct idmap *m, int64_t id)
{
    if (!m->cap)
        return;
    size_t mask = m->cap - 1, i = find(m, id);
    if (!m->t[i].v)
        return;
    for (size_t j = (i + 1) & mask; m->t[j].v; j = (j + 1) & mask) {
        size_t h = home(m->t[j].id, m->cap);
        /* Entry j may fill hole i when its home is not in (i, j] (cyclically). */
        if (((j - h) & mask) >= ((j - i) & mask)) {
            m->t[i] = m->t[j];
            i = j;
        }
    }
    m->t[i] = (struct slot){0, NULL};
    m->n--;
}

size_t idmap_count(const struct idmap *m)
{
    return m->n;
}
