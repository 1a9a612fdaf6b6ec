/* clock.h — the clocks every part reads: the monotonic one for deadlines and intervals,
 * the wall clock for timestamps that leave the process (events, rows). Thread-safe, no
 * state. Nothing here sleeps long or knows what it is timing. */
#ifndef DDPD_BASE_CLOCK_H
#define DDPD_BASE_CLOCK_H

#include <pthread.h>
#include <stdint.h>
#include <time.h>

/* CLOCK_MONOTONIC in seconds, milliseconds and microseconds. */
double base_mono_s(void);
int64_t base_mono_ms(void);
int64_t base_mono_us(void);
/* CLOCK_REALTIME in seconds since the epoch (what events and the store record). */
double base_wall_s(void);
/* The time `s` seconds (>= 0) after now on clock `clk` (CLOCK_MONOTONIC or CLOCK_REALTIME),
 * as pthread_cond_timedwait takes it for a condvar of that clock. */
struct timespec base_timespec_after(clockid_t clk, double s);
/* pthread_cond_init of a condvar that waits on CLOCK_MONOTONIC (deadlines from
 * base_timespec_after(CLOCK_MONOTONIC, ...) survive changes of the wall clock); returns
 * what pthread_cond_init does. */
int base_cond_init_mono(pthread_cond_t *cv);
/* Sleeps `s` seconds (<= 0: not at all), resuming after a signal's handler. For short
 * naps in bounded poll loops and retry back-offs, never to wait for another thread. */
void base_sleep_s(double s);

#endif
