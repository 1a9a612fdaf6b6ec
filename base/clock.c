/* clock.c — thin, stateless readings of clock_gettime. */
#include "clock.h"

#include <errno.h>

static struct timespec now(clockid_t clk)
{
    struct timespec t;
    clock_gettime(clk, &t);
    return t;
}

double base_mono_s(void)
{
    struct timespec t = now(CLOCK_MONOTONIC);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int64_t base_mono_ms(void)
{
    struct timespec t = now(CLOCK_MONOTONIC);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

int64_t base_mono_us(void)
{
    struct timespec t = now(CLOCK_MONOTONIC);
    return (int64_t)t.tv_sec * 1000000 + t.tv_nsec / 1000;
}

double base_wall_s(void)
{
    struct timespec t = now(CLOCK_REALTIME);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

struct timespec base_timespec_after(clockid_t clk, double s)
{
    struct timespec t = now(clk);
    if (!(s > 0)) /* negative or NaN: now */
        return t;
    if (s > 1e9)
        s = 1e9; /* about 30 years: far enough, and no overflow of time_t or the sum */
    time_t whole = (time_t)s;
    int64_t ns = t.tv_nsec + (int64_t)((s - (double)whole) * 1e9);
    t.tv_sec += whole + (time_t)(ns / 1000000000);
    t.tv_nsec = (long)(ns % 1000000000);
    return t;
}

void base_sleep_s(double s)
{
    if (!(s > 0))
        return;
    if (s > 1e9)
        s = 1e9;
    time_t whole = (time_t)s;
    struct timespec t = {whole, (long)((s - (double)whole) * 1e9)};
    while (nanosleep(&t, &t) != 0 && errno == EINTR) {
    }
}

int base_cond_init_mono(pthread_cond_t *cv)
{
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    int rc = pthread_cond_init(cv, &a);
    pthread_condattr_destroy(&a);
    return rc;
}
