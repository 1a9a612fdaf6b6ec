/* emit.h — how a worker speaks: events (CONTRACT.md §6) as NDJSON on stdout, human
 * logs on stderr, and one exit path that turns an error into an `error` event and the
 * documented exit code. Only this module writes to stdout. */
#ifndef DDPD_EMIT_H
#define DDPD_EMIT_H

#include "../schema/err.h"
#include "../schema/event.h"

/* Writes one event line. Output is buffered and flushed at most 10 ms after the last
 * flush, and at once for every event other than `loss`, so a fast loop does not pay a
 * system call per step yet the stream stays live. `ev->ts` is filled in when 0. */
void emit_event(struct event *ev);
void emit_flush(void);

/* Human log line on stderr, prefixed with the rank once emit_set_rank was called. */
void emit_set_rank(int rank);
void emit_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Writes an `error` event for `e` (and the log line) and flushes. */
void emit_error(const struct ddpd_error *e);
/* The same for the error this rank fails of, `secondary` when it is a consequence of
 * another rank's failure (comm_failed_by_peer): the event says so (docs/events.md), and
 * the launcher then names the rank where the failure began (server/cause.h). */
void emit_failure(const struct ddpd_error *e, bool secondary);
/* What emit_error would write for `e`, now, without writing it: the event line (with its
 * newline, stamped with the current time) into line[cap] and the log line (with its
 * newline) into log[log_cap], both NUL-terminated. Returns the event line's length, or -1
 * when it does not fit. For lines written later by a signal handler (mapguard.c), which
 * may only write(2) what was built before. */
int emit_error_lines(const struct ddpd_error *e, char *line, size_t cap, char *log, size_t log_cap);
/* The same, then ends the process with _exit(ddpd_err_exit(e->code)): from any thread
 * (NCCL's watchdog ends the worker too), without atexit handlers or library teardown, and
 * with no other thread's event after the error. */
_Noreturn void emit_die(const struct ddpd_error *e);
/* The same from a code and a message, for failures detected deep inside (CUDA_CHECK). */
_Noreturn void worker_die(ddpd_err code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
