/* termsafe.h — text from the network made safe to print on a terminal. Whatever a server
 * or a job says (names, error messages, logs, events) reaches the user's terminal only
 * through these functions, so that no escape sequence in it can clear the screen, move the
 * cursor, set the window's title or answer back: C0 controls, DEL, the C1 controls
 * U+0080..U+009F and bytes that are not UTF-8 are shown as visible escapes. Printable text,
 * UTF-8 included, is unchanged; a backslash is not doubled (the output is for reading, not
 * for parsing back). Pure functions but for the FILE writes; knows nothing of HTTP. */
#ifndef DDPD_TERMSAFE_H
#define DDPD_TERMSAFE_H

#include <stddef.h>
#include <stdio.h>

enum termsafe_mode {
    /* A one-line field (a name, an error message, a table cell): every control character
     * is escaped, '\n', '\r' and '\t' as `\n`, `\r`, `\t`, the others as `\x1b`; a C1
     * control as `\u009b`; a byte that is not UTF-8 as `\xff`. */
    TERMSAFE_LINE,
    /* A log's text: the same, but '\n' and '\t' are kept. */
    TERMSAFE_TEXT,
    /* JSON text that jansson wrote or accepted: the same JSON value with nothing a terminal
     * acts on. Control characters (which valid JSON has only as white space between
     * tokens), DEL and C1 become `\u00XX` or a space, bytes that are not UTF-8 `\ufffd`;
     * '\n' and '\t' are kept for an indented document (TERMSAFE_JSON_TEXT), a space on one line. */
    TERMSAFE_JSON_LINE,
    TERMSAFE_JSON_TEXT,
};

/* Writes s[0..n) to f as `mode` says. Returns 0, or EOF when a write failed. */
int termsafe_write(FILE *f, const char *s, size_t n, enum termsafe_mode mode);

/* s (a NUL-terminated string; NULL reads as "") escaped as TERMSAFE_LINE into out, which
 * has cap >= 4 bytes: NUL-terminated, cut at a character's boundary with "..." when the
 * whole does not fit. Returns out. */
const char *termsafe_line(char *out, size_t cap, const char *s);

/* How many bytes at the end of s[0..n) begin a UTF-8 character that is not complete (0 to
 * 3): what a reader of a growing text holds back until the rest arrives. */
size_t termsafe_partial_tail(const char *s, size_t n);

#endif
