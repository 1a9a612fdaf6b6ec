/* test_err.c — the error table (schema/err.h): every code has a distinct name, a short
 * text, an HTTP status and a worker exit code; the store's "cannot write now" codes are
 * 503 (a client may retry), and out-of-range values read as internal errors. */
#include "check.h"
#include "schema/err.h"

int main(void)
{
    for (int i = 0; i < DDPD_ERR_COUNT; i++) {
        ddpd_err e = (ddpd_err)i;
        CHECK(ddpd_err_name(e)[0] && ddpd_err_text(e)[0]);
        CHECK(i == DDPD_OK ? ddpd_err_http(e) == 200 : ddpd_err_http(e) >= 400 && ddpd_err_http(e) <= 599);
        CHECK(ddpd_err_exit(e) >= 0 && ddpd_err_exit(e) <= 5);
        for (int k = 0; k < i; k++)
            if (!strcmp(ddpd_err_name(e), ddpd_err_name((ddpd_err)k)))
                CHECK__FAIL("codes %d and %d are both named %s", k, i, ddpd_err_name(e));
    }
    CHECK_EQ_INT(ddpd_err_http(DDPD_EBUSY), 503);
    CHECK_EQ_INT(ddpd_err_http(DDPD_EUNAVAIL), 503);
    CHECK_EQ_STR(ddpd_err_name(DDPD_EUNAVAIL), "EUNAVAIL");
    CHECK_EQ_STR(ddpd_err_text(DDPD_EUNAVAIL), "store unavailable");
    CHECK_EQ_INT(ddpd_err_http(DDPD_ESPEC), 422);
    CHECK_EQ_INT(ddpd_err_exit(DDPD_ECOMM), 3);
    CHECK_EQ_INT(ddpd_err_http(DDPD_ERR_COUNT), 500);
    CHECK_EQ_STR(ddpd_err_name((ddpd_err)-1), "EINTERNAL");

    struct ddpd_error e;
    CHECK_EQ_INT(ddpd_error_set(&e, DDPD_EUNAVAIL, "db", "disk %s", "full"), DDPD_EUNAVAIL);
    CHECK_EQ_INT(e.code, DDPD_EUNAVAIL);
    CHECK_EQ_STR(e.path, "db");
    CHECK_EQ_STR(e.message, "disk full");
    CHECK_EQ_INT(ddpd_error_set(NULL, DDPD_EBUSY, NULL, "x"), DDPD_EBUSY);
    CHECK_DONE();
}
