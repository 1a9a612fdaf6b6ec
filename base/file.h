/* file.h — small file-system helpers the server and the worker share: folders made with
 * their parents, writes and reads that finish, trees removed. No policy: callers say what an error means. */
#ifndef DDPD_BASE_FILE_H
#define DDPD_BASE_FILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* mkdir -p: creates the missing folders of `path` with mode 0700 (job folders and the
 * database hold users' data): its parents, and `path` itself when `whole`. 0, or an errno
 * value (ENOENT for "", ENAMETOOLONG at PATH_MAX or longer, ENOTDIR where a part is a
 * file). */
int base_mkdirs(const char *path, bool whole);
/* Writes all n bytes (retrying short writes and EINTR): 0, or -1 with errno set. */
int base_write_all(int fd, const void *p, size_t n);
/* Reads up to n bytes at offset off (pread, EINTR retried): the bytes read, fewer only at
 * the end of the file, or -1 with errno. */
int64_t base_read_at(int fd, void *buf, int64_t n, int64_t off);
/* rm -r of `path`: its own files only, no link is followed. Errors are ignored. */
void base_remove_tree(const char *path);

#endif
