/* proc.h — small helpers the server's process and file code shares (launch.c, plan.c,
 * slurm.c, store.c): a monotonic clock for deadlines, a write that finishes, and folders
 * made with their parents. */
#ifndef DDPD_PROC_H
#define DDPD_PROC_H

#include <stdbool.h>
#include <stddef.h>

/* Seconds on CLOCK_MONOTONIC. */
double proc_now_mono(void);
/* Writes all n bytes (retrying short writes and EINTR): 0, or -1 with errno set. */
int proc_write_all(int fd, const void *p, size_t n);
/* Creates the missing folders of `path` (mode 0755): its parents, and `path` itself when
 * `whole`. 0, or an errno value (ENAMETOOLONG past PATH_MAX). */
int proc_mkdirs(const char *path, bool whole);

#endif
