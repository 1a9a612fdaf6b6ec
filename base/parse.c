/* parse.c — strtol with every failure said (parse.h). */
#include "base/parse.h"

#include <errno.h>
#include <stdlib.h>

int base_parse_long(const char *s, long lo, long hi, long *out)
{
    if (!s)
        return -1;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}
