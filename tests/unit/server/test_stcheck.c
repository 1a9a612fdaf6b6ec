/* test_stcheck.c — server/stcheck.c, the check `ddpd pull` makes of a download: a valid file
 * passes (several dtypes, an empty tensor, metadata, a padded header); each way of being
 * broken is refused with a message naming the check: too short for the header's length,
 * a header past the file, not JSON, not an object, a key twice, bad metadata, an unknown
 * dtype, a shape that does not match the offsets, offsets past the data, an overlap, a
 * gap, bytes left over, a shape whose bytes overflow; every cut of a valid file too. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "server/stcheck.h"

/* A file of 8-byte length + header (padded with spaces to `pad_to`) + data_len zero bytes,
 * cut to `cut` bytes when cut >= 0; checked. */
static bool check_file(const char *header, size_t data_len, long cut, char *why, size_t cap)
{
    size_t hl = strlen(header), size = 8 + hl + data_len;
    unsigned char *b = calloc(1, size ? size : 1);
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(b + 8, header, hl);
    if (cut >= 0 && (size_t)cut < size)
        size = (size_t)cut;
    FILE *f = tmpfile();
    if (!f || fwrite(b, 1, size, f) != size || fflush(f) != 0)
        abort();
    why[0] = '\0';
    bool ok = stcheck_fd(fileno(f), (int64_t)size, why, cap);
    fclose(f);
    free(b);
    return ok;
}

static void refused(const char *header, size_t data_len, const char *want)
{
    char why[512];
    CHECK(!check_file(header, data_len, -1, why, sizeof why));
    if (!strstr(why, want))
        fprintf(stderr, "  for %s\n  got:      %s\n  expected: ...%s...\n", header, why, want);
    CHECK(strstr(why, want) != NULL);
}

static const char *const GOOD = "{\"__metadata__\":{\"format\":\"pt\",\"step\":\"5\"},"
                                "\"0.weight\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
                                "\"b\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[24,32]},"
                                "\"e\":{\"dtype\":\"F16\",\"shape\":[0,7],\"data_offsets\":[32,32]},"
                                "\"h\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[32,38]},"
                                "\"u\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[38,40]}}    ";

int main(void)
{
    char why[512];
    CHECK(check_file(GOOD, 40, -1, why, sizeof why));
    CHECK_EQ_STR(why, "");
    CHECK(check_file("{}", 0, -1, why, sizeof why)); /* no tensors at all: valid */

    /* Every cut of the valid file is refused. */
    size_t size = 8 + strlen(GOOD) + 40;
    int passed = 0;
    for (long cut = 0; cut < (long)size; cut++)
        passed += check_file(GOOD, 40, cut, why, sizeof why);
    CHECK_EQ_INT(passed, 0);
    CHECK(!check_file(GOOD, 40, 3, why, sizeof why) && strstr(why, "3 bytes, fewer than the 8"));
    CHECK(!check_file(GOOD, 40, 20, why, sizeof why) && strstr(why, "only 12 follow it"));

    refused(GOOD, 41, "the data section is 41 bytes but the tensors cover 40");
    refused("not json", 0, "the header is not JSON");
    refused("[1,2]", 0, "the header is not a JSON object");
    refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
            "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
            8, "the header is not JSON: duplicate object key");
    refused("{\"__metadata__\":{\"k\":1}}", 0, "\"__metadata__\": the value of \"k\" is not a string");
    refused("{\"__metadata__\":[]}", 0, "\"__metadata__\" is not an object");
    refused("{\"a\":{\"dtype\":\"Q7\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "unknown dtype \"Q7\"");
    refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4,
            "data_offsets [0, 4] span 4 bytes, but its dtype F32 and shape need 8");
    refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", 4,
            "data_offsets [4, 0] end before they begin");
    refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}", 4,
            "data_offsets [8, 12] run past the data section (4 bytes)");
    refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
            "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
            8, "tensor \"b\": data_offsets [4, 8] overlap tensor \"a\"");
    refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8,
            "no tensor covers bytes [0, 4) of the data section");
    refused("{\"a\":{\"dtype\":\"F64\",\"shape\":[4611686018427387904,4],\"data_offsets\":[0,8]}}", 8,
            "its shape's bytes do not fit in 64 bits");
    refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4,
            "shape[0] is not a non-negative");
    refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4,
            "\"data_offsets\" is not [begin, end]");
    refused("{\"a\":[]}", 0, "tensor \"a\": expected an object");
    /* A name with an escape sequence is shown escaped in the message. */
    refused("{\"\\u001b[2J\":{\"dtype\":\"Q7\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
            "tensor \"\\x1b[2J\": unknown dtype");
    /* A header length near 2^64 does not wrap around. */
    {
        unsigned char b[16] = {0xf8, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
        FILE *f = tmpfile();
        fwrite(b, 1, sizeof b, f);
        fflush(f);
        CHECK(!stcheck_fd(fileno(f), sizeof b, why, sizeof why) && strstr(why, "only 8 follow it"));
        fclose(f);
    }
    CHECK_DONE();
}
