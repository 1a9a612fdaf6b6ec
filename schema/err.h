/* err.h — the one error enum of ddpd, built from one table that also holds each
 * error's HTTP status, worker exit code, API error code and event kind (CONTRACT.md §6,
 * §7). Functions return a ddpd_err and put the detail (JSON path, sentence) into a
 * struct ddpd_error. */
#ifndef DDPD_ERR_H
#define DDPD_ERR_H

#include <stdarg.h>
#include <stdbool.h>

/* clang-format off */
/* X(NAME, http status, worker exit code, API error code (the "code" of an HTTP error body,
 * CONTRACT.md §7), event kind (the "kind" of an `error` event, §6), short text). The API
 * codes and event kinds are part of the contract: clients and tests compare them. */
#define DDPD_ERR_MAP(X)                                                                                 \
    X(OK,           200, 0, "ok",                     "internal",  "ok")                                \
    X(EJSON,        400, 2, "bad_json",               "spec",      "malformed JSON")                    \
    X(ESPEC,        422, 2, "invalid_spec",           "spec",      "invalid job spec")                  \
    X(EDATA,        422, 2, "bad_data",               "data",      "bad data file")                     \
    X(ETOOBIG,      413, 2, "too_large",              "spec",      "too large")                         \
    X(EIO,          500, 1, "io_error",               "io",        "input/output error")                \
    X(ENOMEM,       500, 1, "out_of_memory",          "internal",  "out of memory")                     \
    X(ECOMM,        500, 3, "comm_failure",           "comm",      "communication failure")             \
    X(EDEVICE,      500, 4, "device_failure",         "device",    "device failure")                    \
    X(ECANCELED,    500, 5, "cancelled",              "cancelled", "cancelled")                         \
    X(ENOTFOUND,    404, 1, "not_found",              "internal",  "not found")                         \
    X(EMETHOD,      405, 1, "method_not_allowed",     "internal",  "method not allowed")                \
    X(ECONFLICT,    409, 1, "conflict",               "internal",  "conflict")                          \
    X(EAUTH,        401, 1, "unauthorized",           "internal",  "unauthorized")                      \
    X(EBUSY,        503, 1, "busy",                   "internal",  "busy")                              \
    X(EINTERNAL,    500, 1, "internal",               "internal",  "internal error")                    \
    X(EUNAVAIL,     503, 1, "unavailable",            "internal",  "store unavailable")                 \
    X(ENONFINITE,   500, 1, "nonfinite_loss",         "nonfinite", "non-finite loss")                   \
    X(EREQUEST,     400, 1, "bad_request",            "internal",  "bad request")                       \
    X(EFORBIDDEN,   403, 1, "forbidden",              "internal",  "forbidden")                         \
    X(EMEDIATYPE,   415, 1, "unsupported_media_type", "internal",  "unsupported media type")            \
    X(EDATACHANGED, 409, 2, "data_changed",           "data",      "data changed since the checkpoint") \
    X(ENOMODEL,     409, 1, "no_model",               "internal",  "no model yet")                      \
    X(EMODELSIZE,   507, 1, "model_too_large",        "internal",  "model too large")                   \
    X(ETIMEOUT,     504, 1, "timeout",                "internal",  "timed out")                         \
    X(EINFER,       500, 1, "inference_failed",       "internal",  "inference process failed")    \
    X(EQUOTA,       429, 1, "quota_exceeded",         "internal",  "quota exceeded")

typedef enum {
#define DDPD__ERR_ENUM(name, http, exit, code, kind, text) DDPD_##name,
    DDPD_ERR_MAP(DDPD__ERR_ENUM)
#undef DDPD__ERR_ENUM
    DDPD_ERR_COUNT
} ddpd_err;
/* clang-format on */

/* A rank's exit code that is no error: asked to stop (SIGUSR1: a preemption, or Slurm's
 * --signal before its time limit), it wrote a checkpoint at the next optimizer step that
 * every rank agreed on, and ended there, so that a resume from it loses nothing
 * (CONTRACT.md §6). The launchers count a rank that ends with it as preempted, not
 * failed (server/cause.h). */
#define RANK_EXIT_PREEMPTED 6

/* Detail of one error. `path` is a JSON path ("model[2].in"), a file name, or empty;
 * `message` is a full sentence a user understands; `line`/`column` are set (1-based)
 * for EJSON and for data files where known, else 0. */
struct ddpd_error {
    ddpd_err code;
    int line, column;
    char path[256];
    char message[768];
};

const char *ddpd_err_name(ddpd_err e); /* "ESPEC" */
const char *ddpd_err_text(ddpd_err e); /* "invalid job spec" */
int ddpd_err_http(ddpd_err e);         /* 422 */
int ddpd_err_exit(ddpd_err e);         /* worker exit code: 2 */
const char *ddpd_err_code(ddpd_err e); /* API error code: "invalid_spec" */
const char *ddpd_err_kind(ddpd_err e); /* event kind: "spec" */
/* The worker exit code of an `error` event's kind ("data": 2), -1 for a kind not in the
 * table: every error of one kind exits with the same code (CONTRACT.md §6). */
int ddpd_err_kind_exit(const char *kind);
/* The error whose API code is `code` ("data_changed") into *out; false for none. */
bool ddpd_err_from_code(const char *code, ddpd_err *out);

/* Fills `e` (may be NULL) and returns `code`, so callers can write
 * `return ddpd_error_set(err, DDPD_ESPEC, "model[0].in", "expected ...");`. */
ddpd_err ddpd_error_set(struct ddpd_error *e, ddpd_err code, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
ddpd_err ddpd_error_vset(struct ddpd_error *e, ddpd_err code, const char *path, const char *fmt, va_list ap);
void ddpd_error_clear(struct ddpd_error *e);

#endif
