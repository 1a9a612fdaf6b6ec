/* jsonnum.h — numbers as ddpd prints them: the shortest text that reads back as the same
 * double (0.003, not jansson's 0.0030000000000000001), for every real the server and the
 * worker write: the event encoder, the stored spec, every API answer, the metrics CSV.
 * Pure functions: no allocation, no I/O. */
#ifndef DDPD_JSONNUM_H
#define DDPD_JSONNUM_H

#include <stddef.h>

/* The shortest of %.15g, %.16g and %.17g of x that strtod reads back as x, into buf[cap]
 * (32 bytes always suffice); -0.0 is "-0". Returns its length. x must be finite. */
size_t jsonnum_shortest(double x, char *buf, size_t cap);

/* Rewrites, in place, each real number of the JSON text s[0..len) (a number token with a
 * '.' or an exponent, outside strings) in its shortest form, keeping it a real (".0" is
 * added where the shortest form would read as an integer: 1.0, -0.0); integers, strings
 * and everything else are left as they are. A number is only ever shortened. s must have
 * room for s[len]: the result is NUL-terminated. Returns the new length. */
size_t jsonnum_tidy(char *s, size_t len);

#endif
