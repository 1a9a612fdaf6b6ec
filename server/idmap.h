/* idmap.h — a hash map from a job id to a pointer (open addressing, linear probing, kept
 * at most half full): the supervisor's jobs by id, thousands of them when many wait in
 * the queue, looked up on every submission and command. Knows nothing of what it maps;
 * not thread-safe. */
#ifndef DDPD_IDMAP_H
#define DDPD_IDMAP_H

#include <stddef.h>
#include <stdint.h>

struct idmap;

/* An empty map; NULL when out of memory. */
struct idmap *idmap_new(void);
/* Frees the map (not what it points to). NULL is a no-op. */
void idmap_free(struct idmap *m);

/* The pointer of `id` (borrowed), or NULL when absent. */
void *idmap_get(const struct idmap *m, int64_t id);
/* Maps `id`, which must be absent, to `v` (not NULL). Out of memory aborts, like every
 * small allocation the supervisor cannot do without. */
void idmap_put(struct idmap *m, int64_t id, void *v);
/* Removes `id`; absent: nothing happens. */
void idmap_del(struct idmap *m, int64_t id);
/* How many ids are mapped. */
size_t idmap_count(const struct idmap *m);

#endif
