/* test_termsafe.c — server/termsafe.c: what each kind of character becomes in a one-line
 * field, a log's text and JSON; that no control character, DEL, C1 control or byte that is
 * not UTF-8 ever comes out raw (every byte value, every two-byte sequence, and hostile
 * strings such as a screen clear and a window title); that UTF-8 text is unchanged; that
 * the JSON modes give JSON that reads back as the same value; the cut of a long field at a
 * character's boundary; and the partial character at the end of a growing log. */
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "server/termsafe.h"

/* s[0..n) through termsafe_write in `mode`, as a new NUL-terminated string (out_n: its length). */
static char *written(const char *s, size_t n, enum termsafe_mode mode, size_t *out_n)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        abort();
    CHECK_EQ_INT(termsafe_write(f, s, n, mode), 0);
    fclose(f);
    if (out_n)
        *out_n = len;
    return buf;
}

static void check_mode(const char *s, enum termsafe_mode mode, const char *want)
{
    char *got = written(s, strlen(s), mode, NULL);
    CHECK_EQ_STR(got, want);
    free(got);
}

static void check_line(const char *s, const char *want)
{
    char out[256];
    CHECK_EQ_STR(termsafe_line(out, sizeof out, s), want);
    check_mode(s, TERMSAFE_LINE, want);
}

/* True when t[0..n) holds nothing a terminal acts on: no C0 control but those `keep`
 * allows, no DEL, no C1 as UTF-8, and valid UTF-8 throughout. */
static bool inert(const char *t, size_t n, const char *keep)
{
    const unsigned char *p = (const unsigned char *)t;
    for (size_t i = 0; i < n; i++) {
        if (p[i] < 0x20 && !(p[i] && strchr(keep, p[i])))
            return false;
        if (p[i] == 0x7f)
            return false;
        if (p[i] == 0xc2 && i + 1 < n && p[i + 1] < 0xa0)
            return false;
    }
    /* jansson reads only valid UTF-8: a JSON string of it must load. */
    json_t *j = json_stringn(t, n);
    bool ok = j != NULL;
    json_decref(j);
    return ok;
}

static void test_each_kind(void)
{
    check_line("plain text, 1.5 and ünïcödé ✓ 🙂", "plain text, 1.5 and ünïcödé ✓ 🙂");
    check_line("a\x1b[2Jb", "a\\x1b[2Jb");                /* a screen clear */
    check_line("\x1b]0;owned\x07", "\\x1b]0;owned\\x07"); /* a window title */
    check_line("x\xc2\x9b"
               "31mred",
               "x\\u009b31mred"); /* CSI as C1 */
    check_line("\x9b"
               "31m",
               "\\x9b31m"); /* CSI as one byte */
    check_line("del\x7f!", "del\\x7f!");
    check_line("a\nb\tc\rd", "a\\nb\\tc\\rd");
    check_line("\x01\x1f", "\\x01\\x1f");
    check_line("bad \xff\xfe utf-8", "bad \\xff\\xfe utf-8");
    check_line("overlong \xc0\xaf, surrogate \xed\xa0\x80", "overlong \\xc0\\xaf, surrogate \\xed\\xa0\\x80");
    check_line("past U+10FFFF \xf4\x90\x80\x80", "past U+10FFFF \\xf4\\x90\\x80\\x80");
    check_line("cut \xe2\x9c", "cut \\xe2\\x9c");
    check_line("back\\slash", "back\\slash");
    check_line("\xc2\xa0nbsp", "\xc2\xa0nbsp"); /* U+00A0 is printable */
    char out[16];
    CHECK_EQ_STR(termsafe_line(out, sizeof out, NULL), "");

    /* A log keeps its lines and tabs, nothing else. */
    check_mode("line 1\n\tline 2\r\x1b[Kline 3\n", TERMSAFE_TEXT, "line 1\n\tline 2\\r\\x1b[Kline 3\n");
    /* NUL in the middle of a log is escaped, not an end. */
    size_t n;
    char *got = written("a\0b", 3, TERMSAFE_TEXT, &n);
    CHECK_EQ_STR(got, "a\\x00b");
    free(got);
}

/* Every byte alone, and every pair of bytes, in every mode: nothing raw comes out. */
static void test_all_bytes(void)
{
    static const enum termsafe_mode modes[] = {TERMSAFE_LINE, TERMSAFE_TEXT, TERMSAFE_JSON_LINE,
                                               TERMSAFE_JSON_TEXT};
    static const char *const keep[] = {"", "\n\t", "", "\n\t"};
    int bad = 0;
    for (size_t m = 0; m < 4; m++)
        for (int a = 0; a < 256; a++)
            for (int b = -1; b < 256; b++) {
                char s[3] = {(char)a, (char)b, 'z'};
                size_t sn = b < 0 ? 1 : 3, n;
                char *t = written(s, sn, modes[m], &n);
                if (!inert(t, n, keep[m]) && bad++ < 5)
                    fprintf(stderr, "mode %zu: bytes %02x %02x came out with a raw control\n", m, a, b & 255);
                free(t);
            }
    CHECK_EQ_INT(bad, 0);
    /* termsafe_line too, on every byte after a printable one. */
    bad = 0;
    for (int a = 1; a < 256; a++) {
        char s[4] = {'x', (char)a, (char)0x9b, 0}, out[64];
        termsafe_line(out, sizeof out, s);
        bad += !inert(out, strlen(out), "");
    }
    CHECK_EQ_INT(bad, 0);
}

/* JSON text: what a server sends (valid JSON, with DEL and C1 raw in its strings, which
 * JSON allows) comes out on one line as JSON of the same value. */
static void test_json(void)
{
    const char *in = "{\"name\": \"a\x7f"
                     "b\xc2\x9b"
                     "c\\u001b[2J\\n\xf0\x9f\x99\x82\",\n\t\"loss\":\r\n 0.10000}";
    size_t n;
    char *line = written(in, strlen(in), TERMSAFE_JSON_LINE, &n);
    CHECK(inert(line, n, ""));
    CHECK_EQ_STR(line,
                 "{\"name\": \"a\\u007fb\\u009bc\\u001b[2J\\n\xf0\x9f\x99\x82\",  \"loss\":   0.10000}");
    json_t *a = json_loads(in, 0, NULL), *b = json_loads(line, 0, NULL);
    CHECK(a && b && json_equal(a, b));
    json_decref(b);
    free(line);
    /* An indented document keeps its lines. */
    char *text = json_dumps(a, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    char *shown = written(text, strlen(text), TERMSAFE_JSON_TEXT, &n);
    CHECK(inert(shown, n, "\n"));
    CHECK(strchr(shown, '\n') != NULL);
    b = json_loads(shown, 0, NULL);
    CHECK(b && json_equal(a, b));
    json_decref(b);
    json_decref(a);
    free(text);
    free(shown);
    /* Bytes that are not UTF-8 become U+FFFD. */
    check_mode("\"\xff\"", TERMSAFE_JSON_LINE, "\"\\ufffd\"");
}

static void test_cut(void)
{
    char out[12];
    CHECK_EQ_STR(termsafe_line(out, sizeof out, "short"), "short");
    CHECK_EQ_STR(termsafe_line(out, sizeof out, "exactly 11!"), "exactly 11!");
    CHECK_EQ_STR(termsafe_line(out, sizeof out, "one more byte"), "one more...");
    /* Never half an escape's character or half a UTF-8 character before the dots. */
    CHECK_EQ_STR(termsafe_line(out, sizeof out, "abcdef\x1b[2J"), "abcdef...");
    CHECK_EQ_STR(termsafe_line(out, sizeof out, "abcdeé✓✓✓"), "abcdeé...");
    char tiny[4];
    CHECK_EQ_STR(termsafe_line(tiny, sizeof tiny, "\x1b"), "...");
    CHECK_EQ_STR(termsafe_line(tiny, sizeof tiny, "abc"), "abc");
}

static void test_partial_tail(void)
{
    CHECK_EQ_INT(termsafe_partial_tail("abc", 3), 0);
    CHECK_EQ_INT(termsafe_partial_tail("ab\xc3", 3), 1);
    CHECK_EQ_INT(termsafe_partial_tail("ab\xc3\xa9", 4), 0);
    CHECK_EQ_INT(termsafe_partial_tail("a\xe2\x9c", 3), 2);
    CHECK_EQ_INT(termsafe_partial_tail("\xf0\x9f\x99", 3), 3);
    CHECK_EQ_INT(termsafe_partial_tail("\xf0\x9f\x99\x82", 4), 0);
    CHECK_EQ_INT(termsafe_partial_tail("a\xff", 2), 0);     /* never valid: shown now */
    CHECK_EQ_INT(termsafe_partial_tail("a\xe0\x80", 3), 0); /* overlong: shown now */
    CHECK_EQ_INT(termsafe_partial_tail("\x80\x80\x80", 3), 0);
    CHECK_EQ_INT(termsafe_partial_tail("", 0), 0);
}

int main(void)
{
    test_each_kind();
    test_all_bytes();
    test_json();
    test_cut();
    test_partial_tail();
    CHECK_DONE();
}
