/* parse.h — whole-string number parsing for command-line options and small text fields:
 * decimal only (strtol's syntax: leading white space and a sign are allowed), nothing
 * after the number, within the caller's bounds. The caller names
 * the option or field in its own error message. */
#ifndef DDPD_BASE_PARSE_H
#define DDPD_BASE_PARSE_H

#include <stdint.h>

/* `s` as a decimal long in [lo, hi]: 0 and *out set, or -1 (empty, not a number, junk
 * after it, out of range) with *out untouched. */
int base_parse_long(const char *s, long lo, long hi, long *out);
/* The same for an int64_t (ids, sequence numbers, steps). */
int base_parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out);

#endif
