/* jsonnum.c — the shortest round-trip text of a double, and the pass that gives every
 * real of a JSON text that form (jsonnum.h). jansson prints reals with %.17g, which
 * turns what a user wrote (0.003) into float noise (0.0030000000000000001). */
#include "jsonnum.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* %.16g or %.15g of x into buf[cap] when one reads back as x (the shorter), else 0: then
 * only %.17g does. 16 is tried first: when it fails 15 fails too (a 15-digit decimal is a
 * 16-digit one, no nearer to x than the nearest), and a measured value (a loss) usually
 * needs 17, so most numbers cost one formatting, not three. */
static size_t shorter_than_17(double x, char *buf, size_t cap)
{
    char b15[40];
    int n = snprintf(buf, cap, "%.16g", x);
    if (n < 0 || (size_t)n >= cap || strtod(buf, NULL) != x)
        return 0;
    int m = snprintf(b15, sizeof b15, "%.15g", x);
    if (m > 0 && (size_t)m < cap && strtod(b15, NULL) == x) {
        memcpy(buf, b15, (size_t)m + 1);
        return (size_t)m;
    }
    return (size_t)n;
}

size_t jsonnum_shortest(double x, char *buf, size_t cap)
{
    size_t n = shorter_than_17(x, buf, cap);
    if (n)
        return n;
    int k = snprintf(buf, cap, "%.17g", x);
    return k < 0 ? 0 : (size_t)k < cap ? (size_t)k : cap - 1;
}

static bool in_number(char c)
{
    return (c >= '0' && c <= '9') || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-';
}

size_t jsonnum_tidy(char *s, size_t len)
{
    size_t r = 0, w = 0;
    bool in_string = false;
    while (r < len) {
        char c = s[r];
        if (in_string) {
            s[w++] = s[r++];
            if (c == '\\' && r < len)
                s[w++] = s[r++];
            else if (c == '"')
                in_string = false;
            continue;
        }
        if (c == '"') {
            in_string = true;
            s[w++] = s[r++];
            continue;
        }
        if (!(c == '-' || (c >= '0' && c <= '9'))) {
            s[w++] = s[r++];
            continue;
        }
        size_t start = r;
        bool real = false;
        while (r < len && in_number(s[r])) {
            real |= s[r] == '.' || s[r] == 'e' || s[r] == 'E';
            r++;
        }
        size_t n = r - start;
        char tok[64], out[40];
        size_t m = 0;
        if (real && n < sizeof tok) {
            memcpy(tok, s + start, n);
            tok[n] = '\0';
            char *end;
            double x = strtod(tok, &end);
            if (end == tok + n && isfinite(x) && (m = shorter_than_17(x, out, sizeof out)) > 0) {
                /* 0: only 17 digits do, which is what the text has (jansson's %.17g). */
                if (!strpbrk(out, ".eE")) { /* keep it a real: 1 -> 1.0 */
                    memcpy(out + m, ".0", 3);
                    m += 2;
                }
            }
        }
        if (m > 0 && m <= n) {
            memmove(s + w, out, m);
            w += m;
        } else {
            memmove(s + w, s + start, n);
            w += n;
        }
    }
    s[w] = '\0';
    return w;
}
