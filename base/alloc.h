/* alloc.h — the one allocation wrapper that aborts when memory runs out (STYLE.md:
 * "internal small allocations may abort on OOM through one wrapper", Redis's zmalloc).
 * Only for the small, internal bookkeeping whose size no client chooses beyond an
 * enforced cap: whatever a spec, a request or a file sizes is allocated with malloc and
 * its failure returned as DDPD_ENOMEM. A zero size is treated as one byte, so the result
 * is never NULL. Each returns a new block; the caller frees it with free(). */
#ifndef DDPD_BASE_ALLOC_H
#define DDPD_BASE_ALLOC_H

#include <stddef.h>

void *xmalloc(size_t n);
void *xcalloc(size_t n, size_t size);
/* realloc of `p` (NULL allowed) to n bytes; `p` is consumed. */
void *xrealloc(void *p, size_t n);
/* A copy of the NUL-terminated `s`. */
char *xstrdup(const char *s);

#endif
