/* fuzz_pull.c — what `ddpd pull` and the other client commands do with bytes a server
 * sends: stcheck_fd (server/stcheck.c) on a downloaded file, and termsafe (server/
 * termsafe.c) on text. A file either passes or says why; every mode's output must hold
 * nothing a terminal acts on: no C0 control but the newline and tab a mode keeps, no DEL,
 * no C1 control, only valid UTF-8. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_files.h"
#include "server/stcheck.h"
#include "server/termsafe.h"

/* Aborts unless out[0..n) is valid UTF-8 with no control character but those `keep` lists. */
static void check_inert(const char *what, const unsigned char *out, size_t n, const char *keep)
{
    for (size_t i = 0; i < n;) {
        unsigned c = out[i], len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : 4;
        if (c < 0x80) {
            if ((c < 0x20 && !(c && strchr(keep, (int)c))) || c == 0x7F)
                goto bad;
        } else {
            if (c < 0xC2 || c > 0xF4 || i + len > n)
                goto bad;
            for (unsigned k = 1; k < len; k++)
                if ((out[i + k] & 0xC0) != 0x80)
                    goto bad;
            if (c == 0xC2 && out[i + 1] < 0xA0) /* U+0080..U+009F */
                goto bad;
        }
        i += len;
        continue;
    bad:
        fprintf(stderr, "fuzz_pull: %s wrote byte 0x%02x at %zu\n", what, c, i);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* the file check */
    char path[1024], why[512] = "";
    fuzz_write("f.safetensors", data, size);
    snprintf(path, sizeof path, "%s/f.safetensors", fuzz_dir());
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        perror(path);
        abort();
    }
    if (!stcheck_fd(fd, (int64_t)size, why, sizeof why) && !why[0])
        abort(); /* a refusal always says why */
    check_inert("stcheck's reason", (const unsigned char *)why, strlen(why), "");
    close(fd);

    /* the text modes */
    static const struct {
        enum termsafe_mode mode;
        const char *name, *keep;
    } modes[] = {{TERMSAFE_LINE, "TERMSAFE_LINE", ""},
                 {TERMSAFE_TEXT, "TERMSAFE_TEXT", "\n\t"},
                 {TERMSAFE_JSON_LINE, "TERMSAFE_JSON_LINE", ""},
                 {TERMSAFE_JSON_TEXT, "TERMSAFE_JSON_TEXT", "\n\t"}};
    for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
        char *out = NULL;
        size_t n = 0;
        FILE *f = open_memstream(&out, &n);
        if (!f || termsafe_write(f, (const char *)data, size, modes[m].mode) != 0 || fclose(f) != 0)
            abort();
        check_inert(modes[m].name, (const unsigned char *)out, n, modes[m].keep);
        free(out);
    }
    char *s = malloc(size + 1), line[96];
    memcpy(s, data, size);
    s[size] = '\0';
    termsafe_line(line, sizeof line, s);
    check_inert("termsafe_line", (const unsigned char *)line, strlen(line), "");
    free(s);
    return 0;
}
