/* data/path.c — data files opened beneath the data directory: {rank} substitution, the
 * openat2 RESOLVE_BENEATH open (or an O_NOFOLLOW walk where the kernel lacks it), and
 * capped reads. Never opens a file outside the data directory; knows no file format. */
#include "data_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "../../base/file.h"

#define DATA_MAX_FILE  (64LL << 30) /* bytes of one data file */
#define WALK_MAX_LINKS 40           /* symbolic links one open may follow (the kernel's own limit) */
#define WALK_MAX_DEPTH 256          /* directories one open may hold on its way down */

#ifdef SYS_openat2
#include <linux/openat2.h>
#endif

/* ---- paths ---- */

bool data__has_rank(const char *p)
{
    return strstr(p, "{rank}") != NULL;
}

/* Writes `given` with every {rank} replaced by `rank` into out. */
static bool subst_rank(char *out, size_t cap, const char *given, int rank)
{
    size_t o = 0;
    for (const char *p = given; *p;) {
        if (strncmp(p, "{rank}", 6) == 0) {
            int n = snprintf(out + o, cap - o, "%d", rank);
            if (n < 0 || (size_t)n >= cap - o)
                return false;
            o += (size_t)n;
            p += 6;
        } else {
            if (o + 1 >= cap)
                return false;
            out[o++] = *p++;
        }
    }
    out[o] = '\0';
    return true;
}

/* ---- opening beneath the data directory ----
 * A data file is opened in one step that cannot leave the data directory, and the readers
 * use that descriptor: resolving a path first (realpath) and opening it afterwards left a
 * window in which a directory swapped for a symbolic link led out of it (89 of 300 tries).
 * openat2 with RESOLVE_BENEATH does it in the kernel; where it is missing (ENOSYS before
 * Linux 5.6, or a seccomp filter's EPERM) the same walk is done here, one component at a
 * time from a directory descriptor with O_NOFOLLOW, reading each symbolic link itself.
 * Either way a symbolic link may lead anywhere inside the data directory by a relative
 * target; an absolute target, or ".." above the data directory, is EXDEV. Files are opened
 * O_NONBLOCK, so a FIFO or a device does not block the open, and then refused unless they
 * are regular files. */

/* The portable walk: `path` (relative, no "..") beneath directory `root`. Returns an open
 * descriptor or -1 with errno (EXDEV: it would leave root). */
static int walk_beneath(int root, const char *path)
{
    int stack[WALK_MAX_DEPTH], depth = 0, links = 0, fd = -1, e = 0;
    char *rem = NULL, *next = NULL;
    size_t remcap = strlen(path) + 1;
    stack[0] = fcntl(root, F_DUPFD_CLOEXEC, 0);
    rem = malloc(remcap);
    if (stack[0] < 0 || !rem) {
        e = stack[0] < 0 ? errno : ENOMEM;
        goto out;
    }
    memcpy(rem, path, remcap);
    char *p = rem;
    for (;;) {
        while (*p == '/')
            p++;
        if (!*p) { /* the path named a directory: open it, and let the caller refuse it */
            fd = openat(stack[depth], ".", O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
            e = fd < 0 ? errno : 0;
            goto out;
        }
        size_t len = strcspn(p, "/");
        bool last = p[len] == '\0';
        char comp[NAME_MAX + 1];
        if (len > NAME_MAX) {
            e = ENAMETOOLONG;
            goto out;
        }
        memcpy(comp, p, len);
        comp[len] = '\0';
        p += len;
        if (!strcmp(comp, "."))
            continue;
        if (!strcmp(comp, "..")) {
            if (depth == 0) {
                e = EXDEV;
                goto out;
            }
            close(stack[depth--]);
            continue;
        }
        if (last) {
            fd = openat(stack[depth], comp, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_NOFOLLOW | O_CLOEXEC);
            if (fd >= 0 || errno != ELOOP) {
                e = fd < 0 ? errno : 0;
                goto out;
            }
        }
        /* An inner component, or a last one that is a symbolic link: look at what it is
         * without following it. */
        int at = openat(stack[depth], comp, O_PATH | O_NOFOLLOW | O_CLOEXEC);
        struct stat st;
        if (at < 0 || fstat(at, &st) != 0) {
            e = errno;
            if (at >= 0)
                close(at);
            goto out;
        }
        if (S_ISDIR(st.st_mode) && !last) {
            if (depth + 1 == WALK_MAX_DEPTH) {
                close(at);
                e = ENAMETOOLONG;
                goto out;
            }
            stack[++depth] = at;
            continue;
        }
        if (!S_ISLNK(st.st_mode)) {
            close(at);
            if (last && ++links <= WALK_MAX_LINKS) { /* no longer a link: open it again */
                p -= len;
                continue;
            }
            if (last) {
                e = ELOOP;
                goto out;
            }
            e = ENOTDIR;
            goto out;
        }
        /* A symbolic link: its target, read from the link this walk holds, goes in front
         * of what is left of the path. */
        char target[PATH_MAX];
        ssize_t n = readlinkat(at, "", target, sizeof target - 1);
        e = errno;
        close(at);
        if (n < 0)
            goto out;
        if (++links > WALK_MAX_LINKS || n == (ssize_t)sizeof target - 1) {
            e = n == (ssize_t)sizeof target - 1 ? ENAMETOOLONG : ELOOP;
            goto out;
        }
        target[n] = '\0';
        if (target[0] == '/') {
            e = EXDEV;
            goto out;
        }
        size_t left = strlen(p);
        next = malloc((size_t)n + 1 + left + 1);
        if (!next) {
            e = ENOMEM;
            goto out;
        }
        memcpy(next, target, (size_t)n);
        if (left) {
            next[n] = '/';
            memcpy(next + n + 1, p, left + 1);
        } else {
            next[n] = '\0';
        }
        free(rem);
        rem = next;
        next = NULL;
        p = rem;
        e = 0;
    }
out:
    for (int i = depth; i >= 0; i--)
        if (stack[i] >= 0)
            close(stack[i]);
    free(rem);
    errno = e;
    return fd;
}

/* `path` beneath directory `root`, in one step: openat2 where the kernel has it, else the
 * walk. Returns a descriptor or -1 with errno. Set DDPD_NO_OPENAT2 to test the walk. */
static int open_beneath(int root, const char *path)
{
#ifdef SYS_openat2
    if (!getenv("DDPD_NO_OPENAT2")) {
        struct open_how how = {
            .flags = O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC,
            .resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS,
        };
        for (int tries = 0; tries < 16; tries++) {
            long fd = syscall(SYS_openat2, root, path, &how, sizeof how);
            if (fd >= 0)
                return (int)fd;
            /* EAGAIN: a rename raced with "..": the kernel asks for another try. */
            if (errno != EAGAIN)
                break;
        }
        if (errno != ENOSYS && errno != EPERM)
            return -1;
    }
#endif
    return walk_beneath(root, path);
}

/* Opens `name` (spec field `field`'s value `given`, {rank} replaced) beneath data_dir as
 * a regular file, refusing anything that leaves the data directory: an absolute path, "..",
 * or a symbolic link that leads out of it. Returns the descriptor (*size its bytes) or -1
 * with `err` set. */
static int path_open(const char *data_dir, const char *field, const char *given, const char *name,
                     int64_t *size, struct ddpd_error *err)
{
    const char *dir = data_dir && data_dir[0] ? data_dir : ".";
    int root = -1, fd = -1;
    struct stat st;
    if (name[0] == '/') {
        data__fail(err, DDPD_ESPEC, field,
                   "\"%s\" is an absolute path; data paths are relative to the data directory", given);
        goto out;
    }
    bool names_a_file = false; /* a part other than "." */
    for (const char *c = name; *c;) {
        size_t len = strcspn(c, "/");
        if (len == 2 && c[0] == '.' && c[1] == '.') {
            data__fail(err, DDPD_ESPEC, field, "\"%s\" leaves the data directory", given);
            goto out;
        }
        names_a_file |= len > 0 && !(len == 1 && c[0] == '.');
        c += len;
        while (*c == '/')
            c++;
    }
    if (!names_a_file) {
        data__fail(err, DDPD_ESPEC, field, "\"%s\" is the data directory itself; name a file in it", given);
        goto out;
    }
    root = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (root < 0) {
        data__fail(err, DDPD_EDATA, dir, "data directory: %s", strerror(errno));
        goto out;
    }
    fd = open_beneath(root, name);
    if (fd < 0) {
        if (errno == EXDEV)
            data__fail(err, DDPD_ESPEC, field, "\"%s\" leaves the data directory (through a symbolic link)",
                       given);
        else {
            /* Where it looked: a file put beside the examples rather than in the server's
             * --data-dir is the usual cause (issue 31). */
            int e = errno;
            char abs[PATH_MAX];
            data__fail(err, DDPD_EDATA, name,
                       "cannot open: %s (data paths are resolved against the data directory %s)", strerror(e),
                       realpath(dir, abs) ? abs : dir);
        }
        goto out;
    }
    if (fstat(fd, &st) != 0) {
        data__fail(err, DDPD_EDATA, name, "cannot stat: %s", strerror(errno));
        goto fail;
    }
    if (!S_ISREG(st.st_mode)) {
        data__fail(err, DDPD_EDATA, name, "not a regular file%s",
                   S_ISFIFO(st.st_mode)                         ? " (a FIFO)"
                   : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? " (a device)"
                   : S_ISSOCK(st.st_mode)                       ? " (a socket)"
                                                                : "");
        goto fail;
    }
    if ((int64_t)st.st_size > DATA_MAX_FILE) {
        data__fail(err, DDPD_EDATA, name, "too large: %" PRId64 " bytes (the limit is %lld GiB)",
                   (int64_t)st.st_size, DATA_MAX_FILE >> 30);
        goto fail;
    }
    if (size)
        *size = (int64_t)st.st_size;
    goto out;
fail:
    close(fd);
    fd = -1;
out:
    if (root >= 0)
        close(root);
    return fd;
}

int data_path_open(const char *data_dir, const char *field, const char *given, struct ddpd_error *err)
{
    if (!given[0]) {
        data__fail(err, DDPD_ESPEC, field, "missing file name");
        return -1;
    }
    return path_open(data_dir, field, given, given, NULL, err);
}

ddpd_err data_path_resolve(const char *data_dir, const char *field, const char *given, char *out, size_t cap,
                           struct ddpd_error *err)
{
    struct ddpd_error local;
    struct ddpd_error *e = err ? err : &local;
    int fd = data_path_open(data_dir, field, given, e);
    if (fd < 0)
        return e->code;
    /* The name of what was opened, as the kernel knows it. */
    char link[64], real[PATH_MAX];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, real, sizeof real - 1);
    int saved = errno;
    close(fd);
    if (n < 0)
        return data__fail(e, DDPD_EDATA, given, "cannot name the opened file: %s", strerror(saved));
    real[n] = '\0';
    int k = snprintf(out, cap, "%s", real);
    if (k < 0 || (size_t)k >= cap)
        return data__fail(e, DDPD_ESPEC, field, "path is too long");
    return DDPD_OK;
}

/* Opens spec field `field` (value `given`) under data_dir for `rank`, refusing anything
 * that leaves the data directory. */
ddpd_err data__file_open(struct dfile *f, const char *data_dir, const char *field, const char *given,
                         int rank, struct ddpd_error *err)
{
    f->fd = -1;
    f->size = 0;
    if (!given[0])
        return data__fail(err, DDPD_ESPEC, field, "missing file name");
    if (!subst_rank(f->name, sizeof f->name, given, rank))
        return data__fail(err, DDPD_ESPEC, field, "path is too long");
    f->fd = path_open(data_dir, field, given, f->name, &f->size, err);
    return f->fd < 0 ? (err ? err->code : DDPD_EDATA) : DDPD_OK;
}

void data__file_close(struct dfile *f)
{
    if (f->fd >= 0)
        close(f->fd);
    f->fd = -1;
}

/* Reads a whole (capped) file into a NUL-terminated buffer. */
ddpd_err data__read_whole(const struct dfile *f, char **out, struct ddpd_error *err)
{
    char *buf = malloc((size_t)f->size + 1);
    *out = NULL;
    if (!buf)
        return data__fail(err, DDPD_ENOMEM, f->name, "out of memory reading %" PRId64 " bytes", f->size);
    int64_t got = base_read_at(f->fd, buf, f->size, 0);
    if (got != f->size) {
        free(buf);
        return data__fail(err, DDPD_EDATA, f->name, "cannot read: %s",
                          got < 0 ? strerror(errno) : "file shrank while reading");
    }
    buf[f->size] = '\0';
    *out = buf;
    return DDPD_OK;
}
