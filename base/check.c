/* check.c — where a failed ASSERT (or, in debug builds, ALWAYS/NEVER) ends: one line on
 * stderr naming the file, the line and the expression, then abort(). */
#include "check.h"

#include <stdio.h>
#include <stdlib.h>

void base_check_fail(const char *file, int line, const char *expr)
{
    fprintf(stderr, "%s:%d: assertion failed: %s\n", file, line, expr);
    fflush(stderr);
    abort();
}
