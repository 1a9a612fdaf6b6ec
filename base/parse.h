/* parse.h — whole-string number parsing for command-line options and small text fields:
 * decimal only, no leading or trailing junk, within the caller's bounds. The caller names
 * the option or field in its own error message. */
#ifndef DDPD_BASE_PARSE_H
#define DDPD_BASE_PARSE_H

/* `s` as a decimal long in [lo, hi]: 0 and *out set, or -1 (empty, not a number, junk
 * after it, out of range) with *out untouched. */
int base_parse_long(const char *s, long lo, long hi, long *out);

#endif
