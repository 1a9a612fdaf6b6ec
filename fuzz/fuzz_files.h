/* fuzz_files.h — for the fuzz targets of file readers: one private data directory per
 * process and a way to put the input into a file there, so the readers run through their
 * real entry points (path checks, open, pread) exactly as a worker calls them. */
#ifndef DDPD_FUZZ_FILES_H
#define DDPD_FUZZ_FILES_H

#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char fuzz__dir[512];

/* Removes the data directory and its files when the fuzzer exits normally (a crash leaves
 * it, beside the crash's input). */
static void fuzz__cleanup(void)
{
    DIR *d = opendir(fuzz__dir);
    struct dirent *e;
    char path[1024];
    while (d && (e = readdir(d)))
        if (e->d_name[0] != '.') {
            snprintf(path, sizeof path, "%s/%s", fuzz__dir, e->d_name);
            unlink(path);
        }
    if (d)
        closedir(d);
    rmdir(fuzz__dir);
}

/* The data directory: ddpd-fuzz-XXXXXX in $DDPD_FUZZ_TMP, else /dev/shm (memory: tens of
 * thousands of rewrites a second), else $TMPDIR or /tmp. Made on first use. */
static const char *fuzz_dir(void)
{
    char *dir = fuzz__dir;
    if (!dir[0]) {
        const char *t = getenv("DDPD_FUZZ_TMP");
        if (!t || !t[0])
            t = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : getenv("TMPDIR");
        snprintf(dir, sizeof fuzz__dir, "%s/ddpd-fuzz-XXXXXX", t && t[0] ? t : "/tmp");
        if (!mkdtemp(dir)) {
            perror("mkdtemp");
            abort();
        }
        atexit(fuzz__cleanup);
    }
    return dir;
}

/* Writes `n` bytes to `name` inside fuzz_dir(), replacing what was there (a new file: a
 * truncated one makes ext4 flush it to disk on close). */
static void fuzz_write(const char *name, const void *data, size_t n)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", fuzz_dir(), name);
    unlink(path);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        perror(path);
        abort();
    }
    const char *p = data;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w <= 0) {
            perror(path);
            abort();
        }
        p += w;
        n -= (size_t)w;
    }
    close(fd);
}

#endif
