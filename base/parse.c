/* parse.c — strtol with every failure said (parse.h). */
#include "parse.h"

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

int base_parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    if (!s)
        return -1;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return -1;
    *out = (int64_t)v;
    return 0;
}
