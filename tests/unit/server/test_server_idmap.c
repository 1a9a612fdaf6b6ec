/* test_server_idmap.c — server/idmap.c against a plain array: thousands of ids put, got and
 * deleted in a mixed order (growth, probe runs that wrap, removal that shifts entries
 * back), every lookup checked after every change of a sample. */
#include <stdint.h>
#include <stdlib.h>

#include "check.h"
#include "server/idmap.h"

#define N 5000

int main(void)
{
    static int64_t val[N + 1]; /* val[id] != 0: mapped to &val[id] */
    struct idmap *m = idmap_new();
    CHECK(m != NULL);
    if (!m)
        return 1;
    CHECK(idmap_get(m, 7) == NULL);
    idmap_del(m, 7); /* absent, empty map */
    unsigned seed = 12345;
    size_t count = 0;
    int bad = 0;
    for (int round = 0; round < 20 * N; round++) {
        seed = seed * 1103515245u + 12345u;
        int64_t id = 1 + (int64_t)((seed >> 8) % N);
        if (val[id]) {
            idmap_del(m, id);
            val[id] = 0;
            count--;
        } else {
            idmap_put(m, id, &val[id]);
            val[id] = 1;
            count++;
        }
        if (round % 97 == 0 || round > 20 * N - 10)
            for (int64_t k = 1; k <= N; k++)
                bad += idmap_get(m, k) != (val[k] ? (void *)&val[k] : NULL);
    }
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT((int)idmap_count(m), (int)count);
    idmap_del(m, N + 7); /* absent */
    CHECK_EQ_INT((int)idmap_count(m), (int)count);
    idmap_free(m);
    idmap_free(NULL);
    CHECK_DONE();
}
