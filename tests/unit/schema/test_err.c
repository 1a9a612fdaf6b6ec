/* test_err.c — the error table (schema/err.h): every code has a distinct name, a short
 * text, an HTTP status and a worker exit code; the store's "cannot write now" codes are
 * 503 (a client may retry), and out-of-range values read as internal errors. The API
 * error codes and event kinds are the contract's strings (CONTRACT.md §6, §7): each is
 * pinned here, so a changed or missing column fails this test. */
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
    /* A resume on data that changed since its checkpoint: 409 from the API, and a rank's
     * exit 2 with kind "data" (a restart's). */
    CHECK_EQ_INT(ddpd_err_http(DDPD_EDATACHANGED), 409);
    CHECK_EQ_INT(ddpd_err_exit(DDPD_EDATACHANGED), 2);
    CHECK_EQ_INT(ddpd_err_http(DDPD_ERR_COUNT), 500);
    CHECK_EQ_STR(ddpd_err_name((ddpd_err)-1), "EINTERNAL");

    static const struct {
        ddpd_err e;
        const char *code, *kind;
    } pinned[] = {
        {DDPD_OK, "ok", "internal"},
        {DDPD_EJSON, "bad_json", "spec"},
        {DDPD_ESPEC, "invalid_spec", "spec"},
        {DDPD_EDATA, "bad_data", "data"},
        {DDPD_ETOOBIG, "too_large", "spec"},
        {DDPD_EIO, "io_error", "io"},
        {DDPD_ENOMEM, "out_of_memory", "internal"},
        {DDPD_ECOMM, "comm_failure", "comm"},
        {DDPD_EDEVICE, "device_failure", "device"},
        {DDPD_ECANCELED, "cancelled", "cancelled"},
        {DDPD_ENOTFOUND, "not_found", "internal"},
        {DDPD_EMETHOD, "method_not_allowed", "internal"},
        {DDPD_ECONFLICT, "conflict", "internal"},
        {DDPD_EAUTH, "unauthorized", "internal"},
        {DDPD_EBUSY, "busy", "internal"},
        {DDPD_EINTERNAL, "internal", "internal"},
        {DDPD_EUNAVAIL, "unavailable", "internal"},
        {DDPD_ENONFINITE, "nonfinite_loss", "nonfinite"},
        {DDPD_EREQUEST, "bad_request", "internal"},
        {DDPD_EFORBIDDEN, "forbidden", "internal"},
        {DDPD_EMEDIATYPE, "unsupported_media_type", "internal"},
        {DDPD_EDATACHANGED, "data_changed", "data"},
        {DDPD_ENOMODEL, "no_model", "internal"},
        {DDPD_EMODELSIZE, "model_too_large", "internal"},
        {DDPD_ETIMEOUT, "timeout", "internal"},
        {DDPD_EINFER, "inference_failed", "internal"},
        {DDPD_EQUOTA, "quota_exceeded", "internal"},
    };
    CHECK_EQ_INT((int)(sizeof pinned / sizeof pinned[0]), DDPD_ERR_COUNT);
    for (size_t i = 0; i < sizeof pinned / sizeof pinned[0]; i++) {
        CHECK_EQ_STR(ddpd_err_code(pinned[i].e), pinned[i].code);
        CHECK_EQ_STR(ddpd_err_kind(pinned[i].e), pinned[i].kind);
    }
    CHECK_EQ_STR(ddpd_err_code(DDPD_ERR_COUNT), "internal");
    for (size_t i = 0; i < sizeof pinned / sizeof pinned[0]; i++) {
        ddpd_err back = DDPD_EINTERNAL;
        CHECK(ddpd_err_from_code(pinned[i].code, &back));
        CHECK_EQ_INT(back, pinned[i].e);
    }
    ddpd_err none = DDPD_OK;
    CHECK(!ddpd_err_from_code("no_such_code", &none) && !ddpd_err_from_code(NULL, &none));
    CHECK_EQ_INT(none, DDPD_OK);
    CHECK_EQ_STR(ddpd_err_kind((ddpd_err)-1), "internal");

    /* An error event's kind stands for one exit code (the launcher reports a rank's
     * failure by its event's kind when the rank was stopped before it could exit so). */
    for (int i = DDPD_OK + 1; i < DDPD_ERR_COUNT; i++)
        CHECK_EQ_INT(ddpd_err_kind_exit(ddpd_err_kind((ddpd_err)i)), ddpd_err_exit((ddpd_err)i));
    CHECK_EQ_INT(ddpd_err_kind_exit("data"), 2);
    CHECK_EQ_INT(ddpd_err_kind_exit("comm"), 3);
    CHECK_EQ_INT(ddpd_err_kind_exit("cancelled"), 5);
    CHECK_EQ_INT(ddpd_err_kind_exit("internal"), 1);
    CHECK_EQ_INT(ddpd_err_kind_exit("bogus"), -1);
    CHECK_EQ_INT(ddpd_err_kind_exit(NULL), -1);

    struct ddpd_error e;
    CHECK_EQ_INT(ddpd_error_set(&e, DDPD_EUNAVAIL, "db", "disk %s", "full"), DDPD_EUNAVAIL);
    CHECK_EQ_INT(e.code, DDPD_EUNAVAIL);
    CHECK_EQ_STR(e.path, "db");
    CHECK_EQ_STR(e.message, "disk full");
    CHECK_EQ_INT(ddpd_error_set(NULL, DDPD_EBUSY, NULL, "x"), DDPD_EBUSY);
    CHECK_DONE();
}
