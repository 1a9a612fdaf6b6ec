/* test_jsonnum.c — numbers without float noise (schema/jsonnum.h, issue 31): the shortest
 * form of a double reads back as the same double, and the tidy pass rewrites only the
 * reals of a JSON text, outside its strings. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "schema/jsonnum.h"

/* jansson's own text of `j`, tidied. Caller frees. */
static char *tidied(json_t *j)
{
    char *t = json_dumps(j, JSON_COMPACT | JSON_ENCODE_ANY);
    json_decref(j);
    jsonnum_tidy(t, strlen(t));
    return t;
}

static void test_shortest(void)
{
    char b[32];
    const double xs[] = {0.003,   451.4,         0.1,  0.1 + 0.2, 1e-5,   3.0e-4,
                         1.0 / 3, 6.02214076e23, -2.5, 1e300,     5e-324, 123456789012345678.0};
    const char *want[] = {"0.003",
                          "451.4",
                          "0.1",
                          "0.30000000000000004",
                          "1e-05",
                          "0.0003",
                          "0.3333333333333333",
                          "6.02214076e+23",
                          "-2.5",
                          "1e+300",
                          "4.94065645841247e-324",
                          "1.2345678901234568e+17"};
    for (size_t i = 0; i < sizeof xs / sizeof xs[0]; i++) {
        size_t n = jsonnum_shortest(xs[i], b, sizeof b);
        CHECK_EQ_STR(b, want[i]);
        CHECK_EQ_INT(n, strlen(want[i]));
        CHECK(strtod(b, NULL) == xs[i]);
    }
    /* Random doubles (their bits): every one reads back the same. */
    srand(31);
    for (int i = 0; i < 100000; i++) {
        unsigned long long u =
            ((unsigned long long)rand() << 42) ^ ((unsigned long long)rand() << 21) ^ (unsigned)rand();
        double x;
        memcpy(&x, &u, sizeof x);
        if (!isfinite(x))
            continue;
        jsonnum_shortest(x, b, sizeof b);
        if (strtod(b, NULL) != x) {
            char l[40];
            snprintf(l, sizeof l, "%.17g", x);
            CHECK_EQ_STR(b, l);
        }
    }
}

static void test_tidy(void)
{
    char *t = tidied(json_pack("{s:f, s:f, s:i, s:f, s:s, s:[f, f, f]}", "lr", 0.003, "samples_per_s", 451.4,
                               "step", (json_int_t)1770, "one", 1.0, "text", "0.0030000000000000001 \\\" 0.1",
                               "xs", -0.0, 1e-5, 0.1 + 0.2));
    CHECK_EQ_STR(t,
                 "{\"lr\":0.003,\"samples_per_s\":451.4,\"step\":1770,\"one\":1.0,"
                 "\"text\":\"0.0030000000000000001 \\\\\\\" 0.1\",\"xs\":[-0.0,1e-05,0.30000000000000004]}");
    /* It parses back to the same values. */
    json_t *back = json_loads(t, 0, NULL);
    CHECK(json_real_value(json_object_get(back, "lr")) == 0.003);
    CHECK(json_is_real(json_object_get(back, "one")));
    CHECK(json_is_integer(json_object_get(back, "step")));
    json_decref(back);
    free(t);
    /* Text that is not jansson's is left as it is where it is not a plain real. */
    char s[] = "[1e999, 0.10000000000000001, 2, \"x\"]";
    size_t n = jsonnum_tidy(s, strlen(s));
    CHECK_EQ_STR(s, "[1e999, 0.1, 2, \"x\"]");
    CHECK_EQ_INT(n, strlen(s));
}

int main(void)
{
    test_shortest();
    test_tidy();
    CHECK_DONE();
}
