/* err.h — the one error enum of ddpd, built from one table that also holds each
 * error's HTTP status and worker exit code (CONTRACT.md §6, §7). Functions return a
 * ddpd_err and put the detail (JSON path, sentence) into a struct ddpd_error. */
#ifndef DDPD_ERR_H
#define DDPD_ERR_H

#include <stdarg.h>

/* clang-format off */
/* X(NAME, http status, worker exit code, short text) */
#define DDPD_ERR_MAP(X)                                          \
    X(OK,        200, 0, "ok")                                   \
    X(EJSON,     400, 2, "malformed JSON")                       \
    X(ESPEC,     422, 2, "invalid job spec")                     \
    X(EDATA,     422, 2, "bad data file")                        \
    X(ETOOBIG,   413, 2, "too large")                            \
    X(EIO,       500, 1, "input/output error")                   \
    X(ENOMEM,    500, 1, "out of memory")                        \
    X(ECOMM,     500, 3, "communication failure")                \
    X(EDEVICE,   500, 4, "device failure")                       \
    X(ECANCELED, 500, 5, "cancelled")                            \
    X(ENOTFOUND, 404, 1, "not found")                            \
    X(EMETHOD,   405, 1, "method not allowed")                   \
    X(ECONFLICT, 409, 1, "conflict")                             \
    X(EAUTH,     401, 1, "unauthorized")                         \
    X(EBUSY,     503, 1, "busy")                                 \
    X(EINTERNAL, 500, 1, "internal error")                       \
    X(EUNAVAIL,  503, 1, "store unavailable")                    \
    X(ENONFINITE, 500, 1, "non-finite loss")                     \
    X(EREQUEST,  400, 1, "bad request")                          \
    X(EFORBIDDEN, 403, 1, "forbidden")                           \
    X(EMEDIATYPE, 415, 1, "unsupported media type")

typedef enum {
#define DDPD__ERR_ENUM(name, http, exit, text) DDPD_##name,
    DDPD_ERR_MAP(DDPD__ERR_ENUM)
#undef DDPD__ERR_ENUM
    DDPD_ERR_COUNT
} ddpd_err;
/* clang-format on */

/* Detail of one error. `path` is a JSON path ("model[2].in"), a file name, or empty;
 * `message` is a full sentence a user understands; `line`/`column` are set (1-based)
 * for EJSON and for data files where known, else 0. */
struct ddpd_error {
    ddpd_err code;
    int line, column;
    char path[256];
    char message[768];
};

const char *ddpd_err_name(ddpd_err e);  /* "ESPEC" */
const char *ddpd_err_text(ddpd_err e);  /* "invalid job spec" */
int ddpd_err_http(ddpd_err e);          /* 422 */
int ddpd_err_exit(ddpd_err e);          /* worker exit code: 2 */

/* Fills `e` (may be NULL) and returns `code`, so callers can write
 * `return ddpd_error_set(err, DDPD_ESPEC, "model[0].in", "expected ...");`. */
ddpd_err ddpd_error_set(struct ddpd_error *e, ddpd_err code, const char *path,
                        const char *fmt, ...) __attribute__((format(printf, 4, 5)));
ddpd_err ddpd_error_vset(struct ddpd_error *e, ddpd_err code, const char *path,
                         const char *fmt, va_list ap);
void ddpd_error_clear(struct ddpd_error *e);

#endif
