/* mapguard.c — the SIGBUS handler and the registry of the rank's file mappings it reads
 * (mapguard.h). The handler runs on the thread whose read of a mapping faulted, in the
 * middle of anything but stdio, jansson or malloc (a fault comes from reading a mapped
 * byte, never from inside those): it uses only async-signal-safe calls (clock_gettime,
 * write, sigaction, raise, _exit) and memory prepared before, never malloc or stdio. */
#include "mapguard.h"

#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../schema/event.h"
#include "emit.h"

_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "the handler reads the slots' flags: they must be lock-free");

/* One registered mapping. `used` is published last (release) and read first (acquire):
 * the handler never sees a slot half filled. */
struct slot {
    atomic_int used;
    uintptr_t lo, hi; /* [lo, hi) */
    int exit_code;
    size_t line_len, log_len;
    size_t ts_at, ts_len; /* the digits of the line's "ts" value */
    char line[EVENT_LINE_MAX + 1];
    char log[EVENT_TEXT_MAX + 128];
};

static struct slot slots[MAPGUARD_SLOTS];
static struct sigaction old_bus; /* SIG_DFL until the handler is installed */
static int installed;

static struct slot *find(uintptr_t a)
{
    for (int i = 0; i < MAPGUARD_SLOTS; i++) {
        struct slot *s = &slots[i];
        if (atomic_load_explicit(&s->used, memory_order_acquire) && a >= s->lo && a < s->hi)
            return s;
    }
    return NULL;
}

const char *mapguard_find(const void *addr, size_t *len)
{
    const struct slot *s = find((uintptr_t)addr);
    if (s && len)
        *len = s->line_len;
    return s ? s->line : NULL;
}

/* Locates the value of the line's last "ts" key (the encoder writes it last, as digits
 * and a point: %.6f). A "ts" inside a string is escaped (\"ts\") and never matches. */
static void find_ts(struct slot *s)
{
    static const char key[] = ",\"ts\":";
    const char *at = NULL;
    for (const char *p = s->line; (p = strstr(p, key)); p++)
        at = p + sizeof key - 1;
    s->ts_at = s->ts_len = 0;
    if (!at)
        return;
    size_t n = 0;
    while ((at[n] >= '0' && at[n] <= '9') || at[n] == '.')
        n++;
    s->ts_at = (size_t)(at - s->line);
    s->ts_len = n;
}

/* Writes the current time as "<seconds>.<6 digits>" over the prebuilt ts when it has as
 * many characters (it has, from 2001 to 2286): the event then says when the file was
 * found changed, not when it was mapped. Async-signal-safe. */
static void stamp(struct slot *s)
{
    struct timespec t;
    char tmp[40];
    size_t n = 0;
    if (s->ts_len == 0 || clock_gettime(CLOCK_REALTIME, &t) != 0 || t.tv_sec < 0)
        return;
    long us = t.tv_nsec / 1000;
    for (int i = 0; i < 6; i++, us /= 10)
        tmp[n++] = (char)('0' + us % 10);
    tmp[n++] = '.';
    uint64_t sec = (uint64_t)t.tv_sec;
    do {
        tmp[n++] = (char)('0' + sec % 10);
        sec /= 10;
    } while (sec && n < sizeof tmp);
    if (n != s->ts_len)
        return;
    for (size_t i = 0; i < n; i++) /* tmp holds the digits backwards */
        s->line[s->ts_at + i] = tmp[n - 1 - i];
}

static void write_all(int fd, const char *p, size_t n)
{
    for (int tries = 0; n > 0 && tries < 64; tries++) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno != EINTR)
            return;
        if (w > 0) {
            p += w;
            n -= (size_t)w;
        }
    }
}

static void on_sigbus(int sig, siginfo_t *si, void *uc)
{
    (void)uc;
    int saved = errno;
    /* si_code > 0: raised by the kernel for a fault at si_addr (not sent by kill). */
    struct slot *s = si && si->si_code > 0 ? find((uintptr_t)si->si_addr) : NULL;
    if (!s) {
        /* Not a guarded mapping: a real bug crashes as one. The previous action comes
         * back; returning runs the faulting access again, which meets it; a SIGBUS sent
         * by kill is raised again (blocked until this handler returns). */
        sigaction(SIGBUS, &old_bus, NULL);
        if (!si || si->si_code <= 0)
            raise(sig);
        errno = saved;
        return;
    }
    stamp(s);
    /* stdout holds whole lines (emit.c flushes before a line that would not fit its
     * buffer), so this line starts a line of its own; loss events still in the buffer
     * are lost, the error that ends the rank is not. */
    write_all(STDOUT_FILENO, s->line, s->line_len);
    write_all(STDERR_FILENO, s->log, s->log_len);
    _exit(s->exit_code);
}

void mapguard_install(void)
{
    if (installed)
        return;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGBUS, &sa, &old_bus) == 0)
        installed = 1;
}

bool mapguard_add(const void *addr, size_t len, const struct ddpd_error *why)
{
    struct slot *s = NULL;
    if (!addr || len == 0 || (uintptr_t)addr > UINTPTR_MAX - len)
        return false;
    for (int i = 0; i < MAPGUARD_SLOTS && !s; i++)
        if (!atomic_load_explicit(&slots[i].used, memory_order_relaxed))
            s = &slots[i];
    if (!s)
        return false;
    int n = emit_error_lines(why, s->line, sizeof s->line, s->log, sizeof s->log);
    if (n < 0)
        return false;
    s->line_len = (size_t)n;
    s->log_len = strlen(s->log);
    s->lo = (uintptr_t)addr;
    s->hi = (uintptr_t)addr + len;
    s->exit_code = ddpd_err_exit(why->code);
    find_ts(s);
    atomic_store_explicit(&s->used, 1, memory_order_release);
    return true;
}

void mapguard_remove(const void *addr)
{
    for (int i = 0; i < MAPGUARD_SLOTS; i++)
        if (atomic_load_explicit(&slots[i].used, memory_order_relaxed) && slots[i].lo == (uintptr_t)addr)
            atomic_store_explicit(&slots[i].used, 0, memory_order_release);
}
