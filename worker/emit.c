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
/* Bytes in out_buf: a line that would not fit is preceded by a flush, so stdio never
 * writes part of a line, and stdout holds whole lines whenever the SIGBUS handler
 * (mapguard.c) writes its own with write(2). */
static size_t pending;

void emit_flush(void)
{
    fflush(stdout);
    pending = 0;
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
    if (pending + (size_t)n > sizeof out_buf)
        emit_flush();
    fwrite(line, 1, (size_t)n, stdout);
    pending += (size_t)n;
    if (ev->kind != EVENT_LOSS || base_mono_s() - last_flush >= FLUSH_INTERVAL_S)
        emit_flush();
}

void emit_set_rank(int r)
{
    rank = r;
}

/* A log line with its rank prefix and newline into out[cap]; its length (cut at cap). */
static size_t log_line(char *out, size_t cap, const char *msg)
{
    int n = rank >= 0 ? snprintf(out, cap, "[rank %d] %s\n", rank, msg) : snprintf(out, cap, "%s\n", msg);
    return n < 0 ? 0 : (size_t)n < cap ? (size_t)n : cap - 1;
}

void emit_log(const char *fmt, ...)
{
    char msg[2048], line[2080];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fwrite(line, 1, log_line(line, sizeof line, msg), stderr);
}

/* The `error` event of e (its message prefixed with the path where it does not name it). */
static void error_event(const struct ddpd_error *e, struct event *ev)
{
    memset(ev, 0, sizeof *ev);
    ev->kind = EVENT_ERROR;
    ev->rank = rank < 0 ? 0 : rank;
    snprintf(ev->error_kind, sizeof ev->error_kind, "%s", ddpd_err_kind(e->code));
    /* The message names its path already in most cases; prefix it where it does not. */
    int n;
    if (e->path[0] && !strstr(e->message, e->path))
        n = snprintf(ev->message, sizeof ev->message, "%s: %s", e->path, e->message);
    else
        n = snprintf(ev->message, sizeof ev->message, "%s", e->message);
    if (n < 0)
        ev->message[0] = '\0';
}

void emit_error(const struct ddpd_error *e)
{
    emit_failure(e, false);
}

void emit_failure(const struct ddpd_error *e, bool secondary)
{
    struct event ev;
    error_event(e, &ev);
    ev.secondary = secondary;
    emit_log("error (%s)%s: %s", ev.error_kind, secondary ? " after another rank's failure" : "", ev.message);
    emit_event(&ev);
    emit_flush();
    fflush(stderr);
}

int emit_error_lines(const struct ddpd_error *e, char *line, size_t cap, char *log, size_t log_cap)
{
    struct event ev;
    char msg[sizeof ev.message + 64];
    error_event(e, &ev);
    ev.ts = base_wall_s();
    int n = event_encode(&ev, line, cap - 1);
    if (n < 0 || log_cap < 1)
        return -1;
    line[n++] = '\n';
    line[n] = '\0';
    snprintf(msg, sizeof msg, "error (%s): %s", ev.error_kind, ev.message);
    log_line(log, log_cap, msg);
    return n;
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
