/* check.h — the unit tests' assertions: each prints both sides and where it failed, and
 * counts failures so one run reports them all. A test's main ends with CHECK_DONE(). */
#ifndef DDPD_CHECK_H
#define DDPD_CHECK_H

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int check__failures, check__count;

#define CHECK__FAIL(...)                                                                                     \
    do {                                                                                                     \
        check__failures++;                                                                                   \
        fprintf(stderr, "%s:%d: ", __FILE__, __LINE__);                                                      \
        fprintf(stderr, __VA_ARGS__);                                                                        \
        fputc('\n', stderr);                                                                                 \
    } while (0)

#define CHECK(cond)                                                                                          \
    do {                                                                                                     \
        check__count++;                                                                                      \
        if (!(cond))                                                                                         \
            CHECK__FAIL("CHECK(%s) failed", #cond);                                                          \
    } while (0)

#define CHECK_EQ_INT(a, b)                                                                                   \
    do {                                                                                                     \
        long long check__a = (long long)(a), check__b = (long long)(b);                                      \
        check__count++;                                                                                      \
        if (check__a != check__b)                                                                            \
            CHECK__FAIL("%s == %s: %lld != %lld", #a, #b, check__a, check__b);                               \
    } while (0)

#define CHECK_EQ_STR(a, b)                                                                                   \
    do {                                                                                                     \
        const char *check__a = (a), *check__b = (b);                                                         \
        check__count++;                                                                                      \
        if (!check__a || !check__b || strcmp(check__a, check__b) != 0)                                       \
            CHECK__FAIL("%s == %s:\n    got:      \"%s\"\n    expected: \"%s\"", #a, #b,                     \
                        check__a ? check__a : "(null)", check__b ? check__b : "(null)");                     \
    } while (0)

/* |a - b| <= atol + rtol * |b| */
#define CHECK_NEAR(a, b, atol, rtol)                                                                         \
    do {                                                                                                     \
        double check__a = (double)(a), check__b = (double)(b);                                               \
        check__count++;                                                                                      \
        if (!(fabs(check__a - check__b) <= (atol) + (rtol)*fabs(check__b)))                                  \
            CHECK__FAIL("%s ~= %s: %.9g vs %.9g (diff %.3g)", #a, #b, check__a, check__b,                    \
                        fabs(check__a - check__b));                                                          \
    } while (0)

#define CHECK_DONE()                                                                                         \
    do {                                                                                                     \
        fprintf(stderr, "%d checks, %d failed\n", check__count, check__failures);                            \
        return check__failures ? 1 : 0;                                                                      \
    } while (0)

#endif
