/* emit.c — the worker's voice: buffered NDJSON events on stdout, logs on stderr, and the
 * single exit path for failures. Any thread may speak: stdout's own lock (flockfile)
 * guards the buffer and its bookkeeping, and the exit path (emit_die) may run on any
 * thread, NCCL's watchdog's included. */
#include "emit.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../base/clock.h"

#define FLUSH_INTERVAL_S 0.010
#define DIE_LOCK_S       1.0 /* how long emit_die waits for another thread's write to stdout */

static int rank = -1;
static double last_flush;
static char out_buf[1 << 16];
static int buffered;
/* Bytes in out_buf: a line that would not fit is preceded by a flush, so stdio never
 * writes part of a line, and stdout holds whole lines whenever the SIGBUS handler
 * (mapguard.c) writes its own with write(2). */
static size_t pending;

/* Under stdout's lock. */
static void flush_locked(void)
{
    fflush(stdout);
    pending = 0;
    last_flush = base_mono_s();
}

void emit_flush(void)
{
    flockfile(stdout);
    flush_locked();
    funlockfile(stdout);
}

static void event_locked(struct event *ev);

void emit_event(struct event *ev)
{
    flockfile(stdout);
    event_locked(ev);
    funlockfile(stdout);
}

static void event_locked(struct event *ev)
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
        flush_locked();
    fwrite(line, 1, (size_t)n, stdout);
    pending += (size_t)n;
    if (ev->kind != EVENT_LOSS || base_mono_s() - last_flush >= FLUSH_INTERVAL_S)
        flush_locked();
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

static void write_error(const struct ddpd_error *e, bool secondary)
{
    struct event ev;
    error_event(e, &ev);
    ev.secondary = secondary;
    emit_log("error (%s)%s: %s", ev.error_kind, secondary ? " after another rank's failure" : "", ev.message);
    emit_event(&ev);
    emit_flush();
    fflush(stderr);
}

void emit_error(const struct ddpd_error *e)
{
    write_error(e, false);
}

/* The exit code of the rank's failure once its `error` event is out, 0 before: a rank
 * fails once, and emit_die, called later from another thread, writes no second event.
 * Under stdout's lock. */
static int failed_exit;

void emit_failure(const struct ddpd_error *e, bool secondary)
{
    flockfile(stdout);
    write_error(e, secondary);
    if (!failed_exit)
        failed_exit = ddpd_err_exit(e->code);
    funlockfile(stdout);
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

static void write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w <= 0)
            return;
        p += w;
        n -= (size_t)w;
    }
}

/* From any thread. It keeps stdout locked from here on, so that no other thread's event
 * follows the error, and leaves with _exit: exit() would run the atexit handlers and the
 * CUDA, cuBLAS and NCCL teardown while another thread may be inside them (blocked in a
 * stream synchronisation, or in the collective the failure is about), which can crash or
 * hang the end. A thread holding stdout past DIE_LOCK_S (a write blocked on a full pipe)
 * does not hold the error back: it is then written beside, with write(2). Where the rank's
 * failure is out already (emit_failure), it leaves with that one's code, writing nothing. */
_Noreturn void emit_die(const struct ddpd_error *e)
{
    bool locked = false;
    const double until = base_mono_s() + DIE_LOCK_S;
    while (!(locked = ftrylockfile(stdout) == 0) && base_mono_s() < until)
        base_sleep_s(1e-3);
    if (locked && failed_exit)
        _exit(failed_exit);
    if (locked) {
        write_error(e, false);
    } else {
        char line[EVENT_LINE_MAX + 2], log[2200] = "";
        int n = emit_error_lines(e, line, sizeof line, log, sizeof log);
        write_all(STDERR_FILENO, log, strlen(log));
        if (n > 0)
            write_all(STDOUT_FILENO, line, (size_t)n);
    }
    _exit(ddpd_err_exit(e->code));
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
