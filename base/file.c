/* file.c — folders and writes (file.h). Knows no job layout. */
#include "base/file.h"

#include <errno.h>
#include <limits.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int base_mkdirs(const char *path, bool whole)
{
    char buf[PATH_MAX];
    size_t n = strlen(path);
    if (n == 0)
        return ENOENT; /* what mkdir("") says */
    if (n >= sizeof buf)
        return ENAMETOOLONG;
    memcpy(buf, path, n + 1);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(buf, 0700) != 0 && errno != EEXIST)
            return errno;
        *p = '/';
    }
    if (whole && mkdir(buf, 0700) != 0 && errno != EEXIST)
        return errno;
    return 0;
}

int base_write_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n) {
        ssize_t w = write(fd, c, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        c += w;
        n -= (size_t)w;
    }
    return 0;
}
