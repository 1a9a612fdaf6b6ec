/* err.c — the error table's accessors. */
#include "err.h"

#include <stdio.h>
#include <string.h>

static const struct {
    const char *name, *text, *code, *kind;
    int http, exit;
} table[] = {
#define DDPD__ERR_ROW(name, http, exit, code, kind, text) {#name, text, code, kind, http, exit},
    DDPD_ERR_MAP(DDPD__ERR_ROW)
#undef DDPD__ERR_ROW
};

static int valid(ddpd_err e)
{
    return (int)e >= 0 && e < DDPD_ERR_COUNT;
}

const char *ddpd_err_name(ddpd_err e)
{
    return valid(e) ? table[e].name : "EINTERNAL";
}
const char *ddpd_err_text(ddpd_err e)
{
    return valid(e) ? table[e].text : "internal error";
}
int ddpd_err_http(ddpd_err e)
{
    return valid(e) ? table[e].http : 500;
}
int ddpd_err_exit(ddpd_err e)
{
    return valid(e) ? table[e].exit : 1;
}
const char *ddpd_err_code(ddpd_err e)
{
    return valid(e) ? table[e].code : "internal";
}
const char *ddpd_err_kind(ddpd_err e)
{
    return valid(e) ? table[e].kind : "internal";
}

int ddpd_err_kind_exit(const char *kind)
{
    for (int e = DDPD_OK + 1; e < DDPD_ERR_COUNT; e++) /* OK's kind is a placeholder */
        if (kind && strcmp(table[e].kind, kind) == 0)
            return table[e].exit;
    return -1;
}

bool ddpd_err_from_code(const char *code, ddpd_err *out)
{
    for (int i = 0; code && i < DDPD_ERR_COUNT; i++)
        if (!strcmp(table[i].code, code)) {
            *out = (ddpd_err)i;
            return true;
        }
    return false;
}

ddpd_err ddpd_error_vset(struct ddpd_error *e, ddpd_err code, const char *path, const char *fmt, va_list ap)
{
    if (!e)
        return code;
    e->code = code;
    e->line = e->column = 0;
    snprintf(e->path, sizeof e->path, "%s", path ? path : "");
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    return code;
}

ddpd_err ddpd_error_set(struct ddpd_error *e, ddpd_err code, const char *path, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ddpd_error_vset(e, code, path, fmt, ap);
    va_end(ap);
    return code;
}

void ddpd_error_clear(struct ddpd_error *e)
{
    if (e)
        memset(e, 0, sizeof *e);
}
