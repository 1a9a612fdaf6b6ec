/* text.c — finds what shown text may not hold (text.h): control characters and bytes that
 * are not UTF-8. A decoder of its own rather than jansson's, which checks only what it
 * parses: the rule is for any string, wherever it came from. */
#include "text.h"

/* The length of the UTF-8 sequence at u[0..left) and its code point in *cp, or 0 when it
 * is not valid UTF-8 (RFC 3629: no overlong forms, no surrogates, nothing past U+10FFFF). */
static size_t decode(const unsigned char *u, size_t left, int32_t *cp)
{
    static const unsigned char lead_bits[5] = {0, 0x7F, 0x1F, 0x0F, 0x07};
    static const int32_t shortest[5] = {0, 0, 0x80, 0x800, 0x10000}; /* below: an overlong form */
    const size_t n = u[0] < 0x80                    ? 1
                     : u[0] >= 0xC2 && u[0] <= 0xDF ? 2
                     : u[0] >= 0xE0 && u[0] <= 0xEF ? 3
                     : u[0] >= 0xF0 && u[0] <= 0xF4 ? 4
                                                    : 0;
    if (n == 0 || n > left)
        return 0;
    int32_t x = u[0] & lead_bits[n];
    for (size_t k = 1; k < n; k++) {
        if ((u[k] & 0xC0) != 0x80)
            return 0;
        x = (x << 6) | (u[k] & 0x3F);
    }
    if (x < shortest[n] || x > 0x10FFFF || (x >= 0xD800 && x <= 0xDFFF))
        return 0;
    *cp = x;
    return n;
}

size_t text_find_unshowable(const char *s, size_t len, int32_t *cp)
{
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < len;) {
        int32_t x = 0;
        size_t n = decode(u + i, len - i, &x);
        if (n == 0 || x < 0x20 || (x >= 0x7F && x <= 0x9F)) {
            *cp = n == 0 ? -1 : x;
            return i;
        }
        i += n;
    }
    return len;
}

ddpd_err text_check_showable(const char *s, size_t len, const char *path, struct ddpd_error *err)
{
    int32_t cp = 0;
    size_t at = text_find_unshowable(s, len, &cp);
    if (at == len)
        return DDPD_OK;
    if (cp < 0)
        return ddpd_error_set(err, DDPD_ESPEC, path, "invalid UTF-8 at byte %zu", at + 1);
    return ddpd_error_set(err, DDPD_ESPEC, path, "control character U+%04X at byte %zu is not allowed",
                          (unsigned)cp, at + 1);
}
