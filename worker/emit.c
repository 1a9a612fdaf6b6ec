/* emit.c — the worker's voice: buffered NDJSON events on stdout, logs on stderr, and the
 * single exit path for failures. */
#include "emit.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/clock.h"

#define FLUSH_INTERVAL_S 0.010

static int rank = -1;
static double last_flush;
static char out_buf[1 << 16];
static int buffered;

void emit_flush(void)
{
    fflush(stdout);
    last_flush = base_mono_s();
}

void emit_event(struct event *ev)
{
    char line[EVENT_LINE_MAX];
    if (!buffered) {
        /* Our own buffer, flushed on our schedule (see emit.h). */
        setvbuf(stdout, out_buf, _IOFBF, sizeof out_buf);
        buffered = 1;
    }
    if (ev->ts == 0)
        ev->ts = base_wall_s();
    int n = event_encode(ev, line, sizeof line - 1);
    if (n < 0) {
        /* Only an oversized message can do this; say so rather than drop the event. */
        struct event e = *ev;
        e.message[200] = '\0';
        e.path[200] = '\0';
        n = event_encode(&e, line, sizeof line - 1);
        if (n < 0)
            return;
    }
    line[n++] = '\n';
    fwrite(line, 1, (size_t)n, stdout);
    if (ev->kind != EVENT_LOSS || base_mono_s() - last_flush >= FLUSH_INTERVAL_S)
        emit_flush();
}

void emit_set_rank(int r)
{
    rank = r;
}

void emit_log(const char *fmt, ...)
{
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (rank >= 0)
        fprintf(stderr, "[rank %d] %s\n", rank, msg);
    else
        fprintf(stderr, "%s\n", msg);
}

void emit_error(const struct ddpd_error *e)
{
    struct event ev;
    memset(&ev, 0, sizeof ev);
    ev.kind = EVENT_ERROR;
    ev.rank = rank < 0 ? 0 : rank;
    snprintf(ev.error_kind, sizeof ev.error_kind, "%s", ddpd_err_kind(e->code));
    /* The message names its path already in most cases; prefix it where it does not. */
    int n;
    if (e->path[0] && !strstr(e->message, e->path))
        n = snprintf(ev.message, sizeof ev.message, "%s: %s", e->path, e->message);
    else
        n = snprintf(ev.message, sizeof ev.message, "%s", e->message);
    if (n < 0)
        ev.message[0] = '\0';
    emit_log("error (%s): %s", ev.error_kind, ev.message);
    emit_event(&ev);
    emit_flush();
    fflush(stderr);
}

_Noreturn void emit_die(const struct ddpd_error *e)
{
    emit_error(e);
    exit(ddpd_err_exit(e->code));
}

_Noreturn void worker_die(ddpd_err code, const char *fmt, ...)
{
    struct ddpd_error e;
    va_list ap;
    va_start(ap, fmt);
    ddpd_error_vset(&e, code, "", fmt, ap);
    va_end(ap);
    emit_die(&e);
}
