/* token.c — the bearer token's rules, shared by the server (--token-file) and the client
 * (--token-file, DDPD_TOKEN): what a token may hold and how a token file is read. Knows
 * nothing of HTTP. */
#include "token.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

/* The most a token file may hold (the token and the whitespace after it). */
#define TOKEN_FILE_MAX 8192

bool token_check(const char *buf, size_t n, char *why, size_t cap)
{
    if (n > TOKEN_MAX) {
        snprintf(why, cap, "the token is %zu bytes; the limit is %d", n, TOKEN_MAX);
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)buf[i];
        if (c <= 0x20 || c >= 0x7f) {
            snprintf(why, cap,
                     "the token holds %s (byte 0x%02x) at offset %zu; a token is one line of printable "
                     "ASCII without spaces, which a client can send as 'Authorization: Bearer <token>'",
                     c == ' ' || c == '\t' ? "whitespace"
                     : c >= 0x7f           ? "a non-ASCII byte"
                                           : "a control byte",
                     c, i);
            return false;
        }
    }
    return true;
}

/* The bearer token of --token-file: the file's bytes less the whitespace that ends them
 * (an editor's newline). A token is what a client can send back in its Authorization
 * header, so one with whitespace or a control byte inside it (a second line included),
 * or longer than TOKEN_MAX, is refused rather than cut or kept unusable. Returns a new
 * string, or NULL with the reason in why[cap]. */
char *token_read_file(const char *path, char *why, size_t cap)
{
    char buf[TOKEN_FILE_MAX + 1];
    size_t n = 0;
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(why, cap, "cannot open: %s", strerror(errno));
        return NULL;
    }
    n = fread(buf, 1, sizeof buf, f);
    bool failed = ferror(f);
    fclose(f);
    if (failed) {
        snprintf(why, cap, "cannot read it");
        return NULL;
    }
    if (n > TOKEN_FILE_MAX) {
        snprintf(why, cap, "the file is larger than %d bytes; a token is at most %d bytes", TOKEN_FILE_MAX,
                 TOKEN_MAX);
        return NULL;
    }
    while (n > 0 && strchr(" \t\r\n\v\f", buf[n - 1]) && buf[n - 1] != '\0')
        n--;
    if (n == 0) {
        snprintf(why, cap, "the file holds no token");
        return NULL;
    }
    if (!token_check(buf, n, why, cap))
        return NULL;
    buf[n] = '\0';
    return strdup(buf);
}
