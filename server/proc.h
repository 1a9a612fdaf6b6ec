/* proc.h — small helpers the server's process code shares (launch.c, plan.c, slurm.c):
 * a monotonic clock for deadlines and a write that finishes. */
#ifndef DDPD_PROC_H
#define DDPD_PROC_H

#include <stddef.h>

/* Seconds on CLOCK_MONOTONIC. */
double proc_now_mono(void);
/* Writes all n bytes (retrying short writes and EINTR): 0, or -1 with errno set. */
int proc_write_all(int fd, const void *p, size_t n);

#endif
