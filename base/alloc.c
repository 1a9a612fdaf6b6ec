/* alloc.c — malloc & co. that abort with a line on stderr instead of returning NULL. They
 * call the C library's functions by name, so a test that wraps malloc (--wrap, see
 * tests/unit/test_store_alloc.c) sees these allocations too. */
#include "alloc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Noreturn void oom(size_t n, size_t size)
{
    fprintf(stderr, "ddpd: out of memory (%zu x %zu bytes)\n", n, size);
    fflush(stderr);
    abort();
}

void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        oom(1, n);
    return p;
}

void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p)
        oom(n, size);
    return p;
}

void *xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q)
        oom(1, n);
    return q;
}

char *xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = xmalloc(n);
    memcpy(p, s, n);
    return p;
}
