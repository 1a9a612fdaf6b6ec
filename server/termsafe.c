/* termsafe.c — escaping of text from the network for a terminal (termsafe.h). One step
 * decides what one character becomes; the writers loop over it. UTF-8 is checked as the
 * Unicode standard's table 3-7 says (no overlong forms, no surrogates, nothing past
 * U+10FFFF), since a terminal's decoder may read a malformed sequence as a control. */
#include "termsafe.h"

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#define UNIT_MAX 8 /* the longest that one character becomes: "\u009b", or 4 bytes of UTF-8 */

/* The length of the UTF-8 character that the first `k` bytes of s begin (1 to 4), or 0 if
 * they cannot begin one. `k` may be less than the character's length: a prefix. */
static size_t utf8_expect(const unsigned char *s, size_t k)
{
    unsigned c = s[0];
    size_t len;
    unsigned lo = 0x80, hi = 0xbf; /* the range of the second byte */
    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf)
        len = 2;
    else if (c >= 0xe0 && c <= 0xef) {
        len = 3;
        if (c == 0xe0)
            lo = 0xa0; /* overlong below */
        else if (c == 0xed)
            hi = 0x9f; /* surrogates above */
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4;
        if (c == 0xf0)
            lo = 0x90; /* overlong below */
        else if (c == 0xf4)
            hi = 0x8f; /* past U+10FFFF above */
    } else {
        return 0; /* a continuation byte, C0, C1 or F5..FF: never a first byte */
    }
    for (size_t i = 1; i < len && i < k; i++) {
        unsigned b = s[i];
        if (i == 1 ? b < lo || b > hi : b < 0x80 || b > 0xbf)
            return 0;
    }
    return len;
}

static size_t hex_escape(char *out, const char *form, unsigned v)
{
    static const char digits[] = "0123456789abcdef";
    size_t n = strlen(form);
    memcpy(out, form, n);
    out[n] = digits[(v >> 4) & 15];
    out[n + 1] = digits[v & 15];
    return n + 2;
}

/* What the character at s (n > 0 bytes left) becomes, in out[UNIT_MAX]: its length; *used
 * says how many bytes of s it stood for. */
static size_t unit(const unsigned char *s, size_t n, enum termsafe_mode mode, char *out, size_t *used)
{
    bool json = mode == TERMSAFE_JSON_LINE || mode == TERMSAFE_JSON_TEXT;
    bool keep = mode == TERMSAFE_TEXT || mode == TERMSAFE_JSON_TEXT;
    unsigned c = s[0];
    *used = 1;
    if (c >= 0x20 && c < 0x7f) {
        out[0] = (char)c;
        return 1;
    }
    if (c == '\n' || c == '\t' || c == '\r') {
        if (keep && c != '\r') {
            out[0] = (char)c;
            return 1;
        }
        if (json) { /* white space between tokens */
            out[0] = ' ';
            return 1;
        }
        out[0] = '\\';
        out[1] = c == '\n' ? 'n' : c == '\t' ? 't' : 'r';
        return 2;
    }
    if (c < 0x80) /* the other C0 controls and DEL */
        return hex_escape(out, json ? "\\u00" : "\\x", c);
    size_t len = utf8_expect(s, n);
    if (len == 0 || len > n) {
        if (json) {
            memcpy(out, "\\ufffd", 6);
            return 6;
        }
        return hex_escape(out, "\\x", c);
    }
    *used = len;
    if (c == 0xc2 && s[1] < 0xa0) /* U+0080..U+009F: C1, CSI (U+009B) among them */
        return hex_escape(out, "\\u00", s[1]);
    memcpy(out, s, len);
    return len;
}

int termsafe_write(FILE *f, const char *s, size_t n, enum termsafe_mode mode)
{
    const unsigned char *p = (const unsigned char *)s;
    char buf[4096];
    size_t at = 0;
    for (size_t i = 0; i < n;) {
        size_t used;
        /* Runs of plain text go out as they are. */
        size_t run = 0;
        while (i + run < n && p[i + run] >= 0x20 && p[i + run] < 0x7f)
            run++;
        if (run) {
            if (at && fwrite(buf, 1, at, f) != at)
                return EOF;
            at = 0;
            if (fwrite(s + i, 1, run, f) != run)
                return EOF;
            i += run;
            continue;
        }
        if (at + UNIT_MAX > sizeof buf) {
            if (fwrite(buf, 1, at, f) != at)
                return EOF;
            at = 0;
        }
        at += unit(p + i, n - i, mode, buf + at, &used);
        i += used;
    }
    if (at && fwrite(buf, 1, at, f) != at)
        return EOF;
    return 0;
}

const char *termsafe_line(char *out, size_t cap, const char *s)
{
    const unsigned char *p = (const unsigned char *)(s ? s : "");
    size_t n = strlen((const char *)p), at = 0, fit = 0; /* fit: a unit's end with room for "..." */
    out[0] = '\0';
    for (size_t i = 0; i < n;) {
        char u[UNIT_MAX];
        size_t used, k = unit(p + i, n - i, TERMSAFE_LINE, u, &used);
        if (at + 4 <= cap)
            fit = at;
        if (at + k + 1 > cap) {
            memcpy(out + fit, "...", 4);
            return out;
        }
        memcpy(out + at, u, k);
        at += k;
        out[at] = '\0';
        i += used;
    }
    return out;
}

size_t termsafe_partial_tail(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    for (size_t k = 1; k <= 3 && k <= n; k++) {
        unsigned c = p[n - k];
        if (c >= 0x80 && c < 0xc0)
            continue; /* a continuation byte: its first byte is further back */
        size_t len = c >= 0x80 ? utf8_expect(p + n - k, k) : 1;
        return len > k ? k : 0;
    }
    return 0;
}
