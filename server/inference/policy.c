/* policy.c — the inference pool's choices (pool_impl.h): which process slot takes a
 * request, and which idle model goes to make room. Pure functions of a snapshot: no
 * locks, no processes, no clocks (tests/unit/server/test_infer_policy.c). */
#include "pool_impl.h"

bool infer__key_eq(const struct infer_key *a, const struct infer_key *b)
{
    return a->job == b->job && a->step == b->step && a->cuda == b->cuda;
}

/* How well free slot `s` suits `want`: lower is better; 4 for a slot that is not free. */
static int rank_of(const struct infer_view *s, const struct infer_key *want)
{
    if (!s->free)
        return 4;
    if (s->loaded && infer__key_eq(&s->key, want))
        return 0;
    if (!s->loaded && (!s->running || s->cuda == want->cuda))
        return 1;
    if (!s->loaded)
        return 2;
    return 3;
}

int infer__pick(const struct infer_view *v, int n, const struct infer_key *want)
{
    int best = -1, best_rank = 4;
    for (int i = 0; i < n; i++) {
        int r = rank_of(&v[i], want);
        /* Among models to replace, the least recently used; else the lower index. */
        if (r < best_rank || (r == 3 && r == best_rank && v[i].last_used < v[best].last_used)) {
            best = i;
            best_rank = r;
        }
    }
    return best;
}

int infer__victim(const struct infer_view *v, int n, int keep)
{
    int best = -1;
    for (int i = 0; i < n; i++)
        if (i != keep && v[i].free && v[i].loaded && (best < 0 || v[i].last_used < v[best].last_used))
            best = i;
    return best;
}
