/* data.c — the data sets of CONTRACT.md §2/§3: .npy and CSV readers, the synthetic
 * teacher, rank sharding, per-epoch shuffling and batching. Everything lives in host
 * memory as float32 rows (int32 class ids). Knows nothing of devices, the model or the
 * optimizer, and never opens a file outside the data directory. Every size read from a
 * file or a spec is capped before it is allocated. */
#include "data.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#ifdef SYS_openat2
#include <linux/openat2.h>
#endif

#include "rng.h"

#define DATA_MAX_FILE (64LL << 30)   /* bytes of one data file */
#define DATA_MAX_MEMORY (64LL << 30) /* bytes of rows one rank may hold */
#define NPY_MAX_HEADER (64 * 1024)
#define NPY_MAX_DIMS 8
#define CSV_MAX_CELL 256 /* a number longer than this is not a number */
#define CSV_MAX_COLS (SPEC_MAX_WIDTH + SPEC_MAX_TARGETS)
#define TEACHER_MAX_PARAMS SPEC_MAX_SYNTHETIC_WEIGHTS
/* Class ids the planner reads before a job is accepted (it answers within 30 s); larger
 * label files are checked by the ranks as they load them. */
#define DATA_MAX_CHECK (1LL << 30)
#define IO_CHUNK (1 << 20)
#define WALK_MAX_LINKS 40  /* symbolic links one open may follow (the kernel's own limit) */
#define WALK_MAX_DEPTH 256 /* directories one open may hold on its way down */

/* Salts that keep the synthetic streams apart from the shuffle streams, which are
 * rng_seed2(seed, epoch). Row i is rng_seed2(seed ^ SALT_ROWS, i); the teacher's weights
 * are rng_seed2(seed ^ SALT_TEACHER, 0); calibration input c (cross_entropy) is
 * rng_seed2(seed ^ SALT_CALIB, c). */
#define SALT_ROWS 0x73616d706c657321ull    /* "samples!" */
#define SALT_TEACHER 0x7465616368657221ull /* "teacher!" */
#define SALT_CALIB 0x63616c6962726174ull   /* "calibrat" */

struct dataset {
    int64_t in, out;
    bool ce;
    int64_t n;       /* rows held below */
    float *x;        /* [n, in] */
    float *y;        /* [n, out], mse */
    int32_t *labels; /* [n], cross_entropy */

    int rank, world;
    int64_t batch;
    bool shuffle, drop_last;
    uint64_t seed;
    /* How shard positions map to held rows:
     * PER_RANK: the held rows are the shard ({rank} files); shuffling permutes them.
     * WHOLE: the held rows are the whole data set; rank r takes positions r, r+W, ...
     *        of the epoch's order.
     * SHARD_ONLY: synthetic without shuffling: only this rank's rows r, r+W, ... were
     *        generated, in that order. */
    enum { HOLD_PER_RANK, HOLD_WHOLE, HOLD_SHARD_ONLY } hold;
    int64_t n_total; /* length of the epoch's order */
    int64_t shard;
    int64_t *perm; /* [n_total] when shuffling */
    int64_t *idx;  /* [shard] held row of each shard position in this epoch */
};

/* ---- errors ---- */

/* Sets `err` to "<path>: <message>" with `path` also as the error's path. */
static ddpd_err fail(struct ddpd_error *err, ddpd_err code, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static ddpd_err fail(struct ddpd_error *err, ddpd_err code, const char *path, const char *fmt, ...)
{
    char msg[640];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return ddpd_error_set(err, code, path, "%s: %s", path, msg);
}

/* ---- the model's shape ---- */

static int first_linear(const struct spec *s)
{
    for (int i = 0; i < s->n_layers; i++)
        if (s->layers[i].kind == LAYER_LINEAR)
            return i;
    return -1;
}

static int last_linear(const struct spec *s)
{
    for (int i = s->n_layers - 1; i >= 0; i--)
        if (s->layers[i].kind == LAYER_LINEAR)
            return i;
    return -1;
}

static ddpd_err check_spec(const struct spec *s, int world, struct ddpd_error *err)
{
    int f = first_linear(s), l = last_linear(s);
    if (s->n_layers < 1 || s->n_layers > SPEC_MAX_LAYERS || f < 0)
        return fail(err, DDPD_ESPEC, "model", "needs at least one linear layer");
    if (s->layers[f].in < 1 || s->layers[f].in > SPEC_MAX_WIDTH || s->layers[l].out < 1 ||
        s->layers[l].out > SPEC_MAX_WIDTH)
        return fail(err, DDPD_ESPEC, "model", "layer widths must be in [1, %d]", SPEC_MAX_WIDTH);
    if (s->batch_size < 1)
        return fail(err, DDPD_ESPEC, "batch_size", "must be at least 1, got %" PRId64, s->batch_size);
    if (world < 1 || world > SPEC_MAX_WORLD)
        return fail(err, DDPD_ESPEC, "world_size", "must be in [1, %d], got %d", SPEC_MAX_WORLD, world);
    return DDPD_OK;
}

/* float32 of a double as an IEEE cast does, without the undefined behaviour C gives a
 * cast of a value beyond FLT_MAX. */
static float to_f32(double d)
{
    if (d >= 0x1.ffffffp+127)
        return INFINITY;
    if (d <= -0x1.ffffffp+127)
        return -INFINITY;
    return (float)d;
}

/* ---- paths ---- */

/* A data file: the name as the spec gives it ({rank} replaced) and its open descriptor. */
struct dfile {
    char name[SPEC_PATH_MAX + 32];
    int fd;
    int64_t size;
};

static bool has_rank(const char *p)
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
        fail(err, DDPD_ESPEC, field,
             "\"%s\" is an absolute path; data paths are relative to the data directory", given);
        goto out;
    }
    for (const char *c = name; *c;) {
        size_t len = strcspn(c, "/");
        if (len == 2 && c[0] == '.' && c[1] == '.') {
            fail(err, DDPD_ESPEC, field, "\"%s\" leaves the data directory", given);
            goto out;
        }
        c += len;
        while (*c == '/')
            c++;
    }
    root = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (root < 0) {
        fail(err, DDPD_EDATA, dir, "data directory: %s", strerror(errno));
        goto out;
    }
    fd = open_beneath(root, name);
    if (fd < 0) {
        if (errno == EXDEV)
            fail(err, DDPD_ESPEC, field, "\"%s\" leaves the data directory (through a symbolic link)", given);
        else
            fail(err, DDPD_EDATA, name, "cannot open: %s", strerror(errno));
        goto out;
    }
    if (fstat(fd, &st) != 0) {
        fail(err, DDPD_EDATA, name, "cannot stat: %s", strerror(errno));
        goto fail;
    }
    if (!S_ISREG(st.st_mode)) {
        fail(err, DDPD_EDATA, name, "not a regular file%s",
             S_ISFIFO(st.st_mode)                         ? " (a FIFO)"
             : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? " (a device)"
             : S_ISSOCK(st.st_mode)                       ? " (a socket)"
                                                          : "");
        goto fail;
    }
    if ((int64_t)st.st_size > DATA_MAX_FILE) {
        fail(err, DDPD_EDATA, name, "too large: %" PRId64 " bytes (the limit is %lld GiB)",
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
        fail(err, DDPD_ESPEC, field, "missing file name");
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
        return fail(e, DDPD_EDATA, given, "cannot name the opened file: %s", strerror(saved));
    real[n] = '\0';
    int k = snprintf(out, cap, "%s", real);
    if (k < 0 || (size_t)k >= cap)
        return fail(e, DDPD_ESPEC, field, "path is too long");
    return DDPD_OK;
}

/* Opens spec field `field` (value `given`) under data_dir for `rank`, refusing anything
 * that leaves the data directory. */
static ddpd_err file_open(struct dfile *f, const char *data_dir, const char *field, const char *given,
                          int rank, struct ddpd_error *err)
{
    f->fd = -1;
    f->size = 0;
    if (!given[0])
        return fail(err, DDPD_ESPEC, field, "missing file name");
    if (!subst_rank(f->name, sizeof f->name, given, rank))
        return fail(err, DDPD_ESPEC, field, "path is too long");
    f->fd = path_open(data_dir, field, given, f->name, &f->size, err);
    return f->fd < 0 ? (err ? err->code : DDPD_EDATA) : DDPD_OK;
}

static void file_close(struct dfile *f)
{
    if (f->fd >= 0)
        close(f->fd);
    f->fd = -1;
}

/* Reads up to n bytes at off; returns the bytes read (fewer only at end of file) or -1. */
static int64_t read_at(int fd, void *buf, int64_t n, int64_t off)
{
    int64_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, (char *)buf + got, (size_t)(n - got), (off_t)(off + got));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -1;
        if (r == 0)
            break;
        got += r;
    }
    return got;
}

/* ---- .npy ---- */

struct npy {
    char descr[32];
    char order; /* '<', '>', '|', '=' */
    char kind;  /* 'f', 'i', 'u', ... */
    int size;   /* bytes per value */
    bool fortran;
    int ndim;
    int64_t shape[NPY_MAX_DIMS];
    int64_t data_off; /* first byte of the data */
    int64_t numel;
};

/* A cursor over the header's Python literal; `base` is the header's offset in the file. */
struct lit {
    const char *p, *start, *end;
    int64_t base;
};

static void lit_ws(struct lit *l)
{
    while (l->p < l->end && (*l->p == ' ' || *l->p == '\t' || *l->p == '\n' || *l->p == '\r'))
        l->p++;
}

static int64_t lit_off(const struct lit *l)
{
    return l->base + (l->p - l->start);
}

static ddpd_err lit_fail(struct lit *l, const char *name, const char *what, struct ddpd_error *err)
{
    return fail(err, DDPD_EDATA, name, "bad .npy header at byte %" PRId64 ": %s", lit_off(l), what);
}

/* A quoted string without escapes (all .npy header strings are). */
static ddpd_err lit_str(struct lit *l, char *out, size_t cap, const char *name, struct ddpd_error *err)
{
    lit_ws(l);
    if (l->p >= l->end || (*l->p != '\'' && *l->p != '"'))
        return lit_fail(l, name, "expected a quoted string", err);
    char q = *l->p++;
    size_t n = 0;
    while (l->p < l->end && *l->p != q) {
        if (*l->p == '\\' || n + 1 >= cap)
            return lit_fail(l, name, "unsupported string", err);
        out[n++] = *l->p++;
    }
    if (l->p >= l->end)
        return lit_fail(l, name, "unterminated string", err);
    l->p++;
    out[n] = '\0';
    return DDPD_OK;
}

static bool lit_word(struct lit *l, const char *w)
{
    size_t n = strlen(w);
    if ((size_t)(l->end - l->p) >= n && memcmp(l->p, w, n) == 0) {
        l->p += n;
        return true;
    }
    return false;
}

/* A shape tuple: "()", "(3,)", "(3, 4)", also Python 2's "(3L, 4L)". */
static ddpd_err lit_shape(struct lit *l, struct npy *h, const char *name, struct ddpd_error *err)
{
    lit_ws(l);
    if (l->p >= l->end || *l->p != '(')
        return lit_fail(l, name, "'shape' must be a tuple", err);
    l->p++;
    h->ndim = 0;
    for (;;) {
        lit_ws(l);
        if (l->p < l->end && *l->p == ')') {
            l->p++;
            return DDPD_OK;
        }
        if (l->p >= l->end || *l->p < '0' || *l->p > '9')
            return lit_fail(l, name, "expected a non-negative integer in 'shape'", err);
        if (h->ndim == NPY_MAX_DIMS)
            return lit_fail(l, name, "too many dimensions in 'shape'", err);
        int64_t v = 0;
        while (l->p < l->end && *l->p >= '0' && *l->p <= '9') {
            if (v > (INT64_MAX - 9) / 10)
                return lit_fail(l, name, "dimension too large", err);
            v = v * 10 + (*l->p++ - '0');
        }
        if (l->p < l->end && *l->p == 'L')
            l->p++;
        h->shape[h->ndim++] = v;
        lit_ws(l);
        if (l->p < l->end && *l->p == ',')
            l->p++;
        else if (l->p >= l->end || *l->p != ')')
            return lit_fail(l, name, "expected ',' or ')' in 'shape'", err);
    }
}

/* Parses the header dict {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }. */
static ddpd_err npy_dict(struct lit *l, struct npy *h, const char *name, struct ddpd_error *err)
{
    bool seen_descr = false, seen_order = false, seen_shape = false;
    ddpd_err rc;
    lit_ws(l);
    if (l->p >= l->end || *l->p != '{')
        return lit_fail(l, name, "expected '{'", err);
    l->p++;
    for (;;) {
        char key[32];
        lit_ws(l);
        if (l->p < l->end && *l->p == '}') {
            l->p++;
            break;
        }
        if ((rc = lit_str(l, key, sizeof key, name, err)))
            return rc;
        lit_ws(l);
        if (l->p >= l->end || *l->p != ':')
            return lit_fail(l, name, "expected ':'", err);
        l->p++;
        lit_ws(l);
        if (strcmp(key, "descr") == 0 && !seen_descr) {
            seen_descr = true;
            if (l->p < l->end && (*l->p == '[' || *l->p == '{'))
                return fail(err, DDPD_EDATA, name,
                            "structured arrays are not supported (a plain numeric array is)");
            if ((rc = lit_str(l, h->descr, sizeof h->descr, name, err)))
                return rc;
        } else if (strcmp(key, "fortran_order") == 0 && !seen_order) {
            seen_order = true;
            if (lit_word(l, "True"))
                h->fortran = true;
            else if (lit_word(l, "False"))
                h->fortran = false;
            else
                return lit_fail(l, name, "'fortran_order' must be True or False", err);
        } else if (strcmp(key, "shape") == 0 && !seen_shape) {
            seen_shape = true;
            if ((rc = lit_shape(l, h, name, err)))
                return rc;
        } else {
            return fail(err, DDPD_EDATA, name,
                        "bad .npy header at byte %" PRId64 ": unexpected or repeated key '%s'", lit_off(l),
                        key);
        }
        lit_ws(l);
        if (l->p < l->end && *l->p == ',')
            l->p++;
        else if (l->p >= l->end || *l->p != '}')
            return lit_fail(l, name, "expected ',' or '}'", err);
    }
    lit_ws(l);
    if (l->p != l->end)
        return lit_fail(l, name, "unexpected text after the header dict", err);
    if (!seen_descr || !seen_order || !seen_shape)
        return fail(err, DDPD_EDATA, name, "bad .npy header: missing '%s'",
                    !seen_descr   ? "descr"
                    : !seen_order ? "fortran_order"
                                  : "shape");
    return DDPD_OK;
}

static const char *npy_type_name(const struct npy *h)
{
    static const struct {
        char kind;
        int size;
        const char *name;
    } names[] = {{'f', 4, "float32"}, {'f', 8, "float64"}, {'i', 1, "int8"},  {'i', 2, "int16"},
                 {'i', 4, "int32"},   {'i', 8, "int64"},   {'u', 1, "uint8"}, {'u', 2, "uint16"},
                 {'u', 4, "uint32"},  {'u', 8, "uint64"}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (names[i].kind == h->kind && names[i].size == h->size)
            return names[i].name;
    return h->descr;
}

/* Reads and checks the preamble and header of an open .npy file: everything but the
 * values. Checks the data is all there. */
static ddpd_err npy_header(const struct dfile *f, struct npy *h, struct ddpd_error *err)
{
    unsigned char pre[12];
    char *text = NULL;
    ddpd_err rc;
    memset(h, 0, sizeof *h);
    int64_t got = read_at(f->fd, pre, sizeof pre, 0);
    if (got < 0)
        return fail(err, DDPD_EDATA, f->name, "cannot read: %s", strerror(errno));
    if (got < 8 || memcmp(pre, "\x93NUMPY", 6) != 0)
        return fail(err, DDPD_EDATA, f->name, "not a .npy file (it does not start with \"\\x93NUMPY\")");
    if (pre[6] < 1 || pre[6] > 3 || pre[7] != 0)
        return fail(err, DDPD_EDATA, f->name, "unsupported .npy version %d.%d (1.0 and 2.0 are)", pre[6],
                    pre[7]);
    int64_t pl = pre[6] == 1 ? 10 : 12, hl;
    if (got < pl)
        return fail(err, DDPD_EDATA, f->name,
                    "truncated header: the file is %" PRId64 " bytes, shorter than the %" PRId64
                    "-byte .npy preamble",
                    f->size, pl);
    if (pre[6] == 1)
        hl = (int64_t)pre[8] | (int64_t)pre[9] << 8;
    else
        hl = (int64_t)pre[8] | (int64_t)pre[9] << 8 | (int64_t)pre[10] << 16 | (int64_t)pre[11] << 24;
    if (hl > NPY_MAX_HEADER)
        return fail(err, DDPD_EDATA, f->name, "header too large: %" PRId64 " bytes (the limit is %d)", hl,
                    NPY_MAX_HEADER);
    if (pl + hl > f->size)
        return fail(err, DDPD_EDATA, f->name,
                    "truncated header: the header says it is %" PRId64
                    " bytes but the file ends at byte %" PRId64,
                    hl, f->size);
    text = malloc((size_t)hl + 1);
    if (!text)
        return fail(err, DDPD_ENOMEM, f->name, "out of memory reading the header");
    errno = 0;
    if (read_at(f->fd, text, hl, pl) != hl) {
        rc = fail(err, DDPD_EDATA, f->name, "cannot read the header: %s",
                  errno ? strerror(errno) : "short read");
        goto out;
    }
    struct lit l = {text, text, text + hl, pl};
    if ((rc = npy_dict(&l, h, f->name, err)))
        goto out;

    /* descr: byte order, kind, size, e.g. "<f4", "|i1". */
    const char *d = h->descr;
    size_t dl = strlen(d);
    h->order = dl ? d[0] : 0;
    h->kind = dl > 1 ? d[1] : 0;
    h->size = 0;
    if (dl == 3 && d[2] >= '1' && d[2] <= '8')
        h->size = d[2] - '0';
    bool known = (h->kind == 'f' && (h->size == 4 || h->size == 8)) ||
                 ((h->kind == 'i' || h->kind == 'u') &&
                  (h->size == 1 || h->size == 2 || h->size == 4 || h->size == 8));
    bool le = h->order == '<' || (h->order == '|' && h->size == 1);
    if (known && h->order == '>' && h->size > 1) {
        rc = fail(err, DDPD_EDATA, f->name,
                  "dtype '%s' is big-endian; save it little-endian (arr.astype('<%c%d'))", d, h->kind,
                  h->size);
        goto out;
    }
    if (!known || !le) {
        rc = fail(err, DDPD_EDATA, f->name, "unsupported dtype '%s'", d);
        goto out;
    }
    if (h->fortran) {
        rc = fail(err, DDPD_EDATA, f->name,
                  "fortran_order is True; save a C-ordered array (np.ascontiguousarray)");
        goto out;
    }
    h->data_off = pl + hl;
    int64_t avail = f->size - h->data_off, bytes = 0;
    bool zero = false, over = false;
    h->numel = 1;
    for (int i = 0; i < h->ndim; i++)
        zero |= h->shape[i] == 0;
    for (int i = 0; i < h->ndim && !zero && !over; i++)
        over = __builtin_mul_overflow(h->numel, h->shape[i], &h->numel);
    if (zero)
        h->numel = 0;
    over = over || __builtin_mul_overflow(h->numel, (int64_t)h->size, &bytes);
    if (over) {
        rc = fail(err, DDPD_EDATA, f->name,
                  "truncated: the header's shape is larger than the %" PRId64
                  " bytes that follow the header at offset %" PRId64,
                  avail, h->data_off);
        goto out;
    }
    if (bytes > avail) {
        rc = fail(err, DDPD_EDATA, f->name,
                  "truncated: header says %" PRId64 " %s values (%" PRId64 " bytes) but only %" PRId64
                  " bytes follow the header at offset %" PRId64,
                  h->numel, npy_type_name(h), bytes, avail, h->data_off);
        goto out;
    }
    rc = DDPD_OK;
out:
    free(text);
    return rc;
}

static void shape_text(char *out, size_t cap, const struct npy *h)
{
    size_t o = 0;
    o += (size_t)snprintf(out, cap, "(");
    for (int i = 0; i < h->ndim && o < cap; i++)
        o += (size_t)snprintf(out + o, cap - o, i ? ", %" PRId64 : "%" PRId64, h->shape[i]);
    if (o < cap)
        snprintf(out + o, cap - o, h->ndim == 1 ? ",)" : ")");
}

enum npy_role { NPY_X, NPY_Y_MSE, NPY_Y_CE };

/* Checks an .npy header's dtype and shape against its role and the model. Sets *rows.
 * `empty_ok`: zero rows are allowed (a rank's own {rank} file: that rank joins at once
 * and shadows the others, as PyTorch's DDP runs a rank without inputs). */
static ddpd_err npy_check(const struct dfile *f, const struct npy *h, enum npy_role role,
                          const struct spec *s, bool empty_ok, int64_t *rows, struct ddpd_error *err)
{
    int fi = first_linear(s), li = last_linear(s);
    int64_t in = s->layers[fi].in, out = s->layers[li].out;
    char sh[160];
    shape_text(sh, sizeof sh, h);
    if (role != NPY_Y_CE && h->kind != 'f')
        return fail(err, DDPD_EDATA, f->name,
                    "dtype '%s' is not supported; %s must be float32 ('<f4') or float64 ('<f8')", h->descr,
                    role == NPY_X ? "x" : "mse targets");
    if (role == NPY_Y_CE && h->kind == 'f')
        return fail(err, DDPD_EDATA, f->name,
                    "dtype '%s': cross_entropy targets are integer class ids "
                    "(int32 '<i4' or int64 '<i8')",
                    h->descr);
    if (h->ndim < 1 || (h->shape[0] < 1 && !empty_ok))
        return fail(err, DDPD_EDATA, f->name, "no samples: shape %s", sh);
    *rows = h->shape[0];
    if (role == NPY_X) {
        if (h->ndim == 1 && in == 1)
            return DDPD_OK;
        if (h->ndim != 2)
            return fail(err, DDPD_EDATA, f->name, "x must be 2-dimensional [N, %" PRId64 "], got shape %s",
                        in, sh);
        if (h->shape[1] != in)
            return fail(err, DDPD_EDATA, f->name, "x has %" PRId64 " columns but model[%d].in is %" PRId64,
                        h->shape[1], fi, in);
    } else if (role == NPY_Y_MSE) {
        if (h->ndim == 1 && out == 1)
            return DDPD_OK;
        if (h->ndim != 2)
            return fail(err, DDPD_EDATA, f->name,
                        "mse targets must be 2-dimensional [N, %" PRId64 "], got shape %s", out, sh);
        if (h->shape[1] != out)
            return fail(err, DDPD_EDATA, f->name, "y has %" PRId64 " columns but model[%d].out is %" PRId64,
                        h->shape[1], li, out);
    } else if (h->ndim != 1) {
        return fail(err, DDPD_EDATA, f->name,
                    "cross_entropy targets must be 1-dimensional [N] class ids, got shape %s", sh);
    }
    return DDPD_OK;
}

static uint64_t load_le(const unsigned char *p, int size)
{
    uint64_t v = 0;
    for (int i = size - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* Reads all values of an .npy file into f32[numel] (float files) or, checking each is a
 * class id in [0, classes), into i32[numel] (integer files; i32 NULL only checks them). */
static ddpd_err npy_values(const struct dfile *f, const struct npy *h, float *f32, int32_t *i32,
                           int64_t classes, struct ddpd_error *err)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    if (h->kind == 'f' && h->size == 4) { /* the common case needs no conversion */
        errno = 0;
        if (read_at(f->fd, f32, h->numel * 4, h->data_off) != h->numel * 4)
            return fail(err, DDPD_EDATA, f->name, "cannot read at offset %" PRId64 ": %s", h->data_off,
                        errno ? strerror(errno) : "file shrank while reading");
        return DDPD_OK;
    }
#endif
    unsigned char *buf = malloc(IO_CHUNK);
    ddpd_err rc = DDPD_OK;
    if (!buf)
        return fail(err, DDPD_ENOMEM, f->name, "out of memory");
    const int64_t per = IO_CHUNK / h->size;
    for (int64_t done = 0; done < h->numel;) {
        int64_t n = h->numel - done < per ? h->numel - done : per;
        int64_t off = h->data_off + done * h->size;
        errno = 0;
        if (read_at(f->fd, buf, n * h->size, off) != n * h->size) {
            rc = fail(err, DDPD_EDATA, f->name, "cannot read at offset %" PRId64 ": %s", off,
                      errno ? strerror(errno) : "file shrank while reading");
            goto out;
        }
        for (int64_t i = 0; i < n; i++) {
            const unsigned char *p = buf + i * h->size;
            uint64_t bits = load_le(p, h->size);
            if (h->kind == 'f') {
                if (h->size == 4) {
                    uint32_t b32 = (uint32_t)bits;
                    memcpy(&f32[done + i], &b32, 4);
                } else {
                    double dv;
                    memcpy(&dv, &bits, 8);
                    f32[done + i] = to_f32(dv);
                }
                continue;
            }
            int64_t v;
            bool neg = false;
            if (h->kind == 'i') {
                int sh = 64 - 8 * h->size; /* sign-extend */
                v = (int64_t)(bits << sh) >> sh;
                neg = v < 0;
            } else {
                v = bits > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)bits;
            }
            if (neg || v >= classes) {
                rc = fail(err, DDPD_EDATA, f->name,
                          "class id %" PRId64 " at row %" PRId64 " is out of range [0, %" PRId64 ")", v,
                          done + i, classes);
                goto out;
            }
            if (i32)
                i32[done + i] = (int32_t)v;
        }
        done += n;
    }
out:
    free(buf);
    return rc;
}

/* ---- CSV ---- */

struct csv {
    const char *p, *end;
    int64_t line;     /* physical line of p, 1-based */
    int64_t err_line; /* where CSV_ERR was found, and what */
    const char *err_what;
};

struct cell {
    const char *p; /* raw text, without the surrounding quotes */
    size_t len;
    bool escaped; /* holds "" pairs */
};

enum { CSV_MORE, CSV_EOR, CSV_ERR };

/* Ends a field at c->p: ',' (more fields follow), a line end or the end of the file. */
static int csv_after(struct csv *c)
{
    if (c->p >= c->end)
        return CSV_EOR;
    if (*c->p == ',') {
        c->p++;
        return CSV_MORE;
    }
    if (*c->p == '\n') {
        c->p++;
        c->line++;
        return CSV_EOR;
    }
    if (*c->p == '\r' && c->p + 1 < c->end && c->p[1] == '\n') {
        c->p += 2;
        c->line++;
        return CSV_EOR;
    }
    return CSV_ERR;
}

/* Reads one field (RFC 4180). On CSV_ERR sets c->err_line and c->err_what. */
static int csv_field(struct csv *c, struct cell *out)
{
    out->escaped = false;
    if (c->p < c->end && *c->p == '"') {
        int64_t line0 = c->line;
        out->p = ++c->p;
        for (;;) {
            if (c->p >= c->end) {
                c->err_line = line0;
                c->err_what = "quoted field is never closed";
                return CSV_ERR;
            }
            if (*c->p == '"') {
                if (c->p + 1 < c->end && c->p[1] == '"') {
                    out->escaped = true;
                    c->p += 2;
                    continue;
                }
                break;
            }
            if (*c->p == '\n')
                c->line++;
            c->p++;
        }
        out->len = (size_t)(c->p - out->p);
        c->p++;
        int r = csv_after(c);
        if (r == CSV_ERR) {
            c->err_line = c->line;
            c->err_what = "unexpected character after a closing quote";
        }
        return r;
    }
    out->p = c->p;
    while (c->p < c->end && *c->p != ',' && *c->p != '\n') {
        if (*c->p == '"') {
            c->err_line = c->line;
            c->err_what = "quote inside an unquoted field";
            return CSV_ERR;
        }
        if (*c->p == '\r' && c->p + 1 < c->end && c->p[1] == '\n')
            break;
        c->p++;
    }
    out->len = (size_t)(c->p - out->p);
    return csv_after(c);
}

/* Skips blank lines; false at the end of the file. */
static bool csv_next_record(struct csv *c)
{
    for (;;) {
        if (c->p >= c->end)
            return false;
        if (*c->p == '\n') {
            c->p++;
            c->line++;
        } else if (*c->p == '\r' && c->p + 1 < c->end && c->p[1] == '\n') {
            c->p += 2;
            c->line++;
        } else {
            return true;
        }
    }
}

/* The cell's text with "" unescaped, truncated to cap-1 bytes; returns its full length. */
static size_t cell_text(const struct cell *cl, char *out, size_t cap)
{
    size_t o = 0, n = 0;
    for (size_t i = 0; i < cl->len; i++, n++) {
        if (cl->escaped && cl->p[i] == '"')
            i++; /* the first of a "" pair */
        if (o + 1 < cap)
            out[o++] = cl->p[i];
    }
    if (cap)
        out[o] = '\0';
    return n;
}

/* An EDATA error at `line` (and 1-based column `col`, or 0) of a CSV file, which the
 * message names too. */
static ddpd_err csv_fail(struct ddpd_error *err, const char *name, int64_t line, int col, const char *fmt,
                         ...) __attribute__((format(printf, 5, 6)));
static ddpd_err csv_fail(struct ddpd_error *err, const char *name, int64_t line, int col, const char *fmt,
                         ...)
{
    char msg[640];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ddpd_error_set(err, DDPD_EDATA, name, "%s: %s", name, msg);
    if (err) {
        err->line = (int)(line > INT_MAX ? INT_MAX : line);
        err->column = col;
    }
    return DDPD_EDATA;
}

/* The CSV's layout: the header's names and what each column feeds. */
struct csv_layout {
    int ncols;
    struct cell *names; /* [ncols] */
    int32_t *role;      /* [ncols]: >= 0 input index, < 0 target -(k+1) */
    int64_t rows;
    const char *body; /* first byte after the header */
    int64_t body_line;
};

static void layout_free(struct csv_layout *lo)
{
    free(lo->names);
    free(lo->role);
    lo->names = NULL;
    lo->role = NULL;
}

/* Reads the header, maps columns to inputs and targets and counts the data rows,
 * checking every row has the header's number of fields. */
static ddpd_err csv_scan(const char *name, const char *buf, int64_t len, const struct spec *s,
                         bool empty_ok, struct csv_layout *lo, struct ddpd_error *err)
{
    struct csv c = {buf, buf + len, 1, 0, NULL};
    char text[CSV_MAX_CELL];
    const struct spec_data *d = &s->data;
    int fi = first_linear(s), li = last_linear(s);
    int64_t in = s->layers[fi].in, out = s->layers[li].out;
    bool ce = s->loss == LOSS_CROSS_ENTROPY;
    int cap = 64, r;

    memset(lo, 0, sizeof *lo);
    if (len >= 3 && memcmp(buf, "\xef\xbb\xbf", 3) == 0)
        c.p += 3; /* a UTF-8 byte order mark, as spreadsheets write */
    if (d->n_targets < 1 || d->n_targets > SPEC_MAX_TARGETS)
        return fail(err, DDPD_ESPEC, "data.target", "name the target column(s)");
    if (ce && d->n_targets != 1)
        return fail(err, DDPD_ESPEC, "data.target",
                    "cross_entropy needs exactly one target column (of class ids), got %d", d->n_targets);
    if (!ce && d->n_targets != out)
        return fail(err, DDPD_ESPEC, "data.target", "%d target column(s) but model[%d].out is %" PRId64,
                    d->n_targets, li, out);
    if (!csv_next_record(&c))
        return fail(err, DDPD_EDATA, name, "empty file (a header row is needed)");

    lo->names = malloc((size_t)cap * sizeof *lo->names);
    if (!lo->names)
        return fail(err, DDPD_ENOMEM, name, "out of memory");
    do {
        if (lo->ncols == cap) {
            if (cap >= CSV_MAX_COLS)
                return fail(err, DDPD_EDATA, name, "too many columns (the limit is %d)", CSV_MAX_COLS);
            cap *= 2;
            struct cell *nn = realloc(lo->names, (size_t)cap * sizeof *nn);
            if (!nn)
                return fail(err, DDPD_ENOMEM, name, "out of memory");
            lo->names = nn;
        }
        r = csv_field(&c, &lo->names[lo->ncols++]);
        if (r == CSV_ERR)
            return csv_fail(err, name, c.err_line, 0, "line %" PRId64 ": %s", c.err_line, c.err_what);
    } while (r == CSV_MORE);
    lo->body = c.p;
    lo->body_line = c.line;

    lo->role = malloc((size_t)lo->ncols * sizeof *lo->role);
    if (!lo->role)
        return fail(err, DDPD_ENOMEM, name, "out of memory");
    for (int j = 0; j < lo->ncols; j++)
        lo->role[j] = 0;
    for (int k = 0; k < d->n_targets; k++) {
        int hits = 0;
        for (int j = 0; j < lo->ncols; j++) {
            size_t n = cell_text(&lo->names[j], text, sizeof text);
            if (n == strlen(d->targets[k]) && strcmp(text, d->targets[k]) == 0) {
                if (lo->role[j] < 0)
                    return fail(err, DDPD_ESPEC, "data.target", "\"%s\" is named twice", d->targets[k]);
                lo->role[j] = -(k + 1);
                hits++;
            }
        }
        if (hits == 0)
            return fail(err, DDPD_EDATA, name, "no column named \"%s\" (the target) in the header",
                        d->targets[k]);
        if (hits > 1)
            return fail(err, DDPD_EDATA, name, "%d columns are named \"%s\" (the target)", hits,
                        d->targets[k]);
    }
    int32_t inputs = 0;
    for (int j = 0; j < lo->ncols; j++)
        if (lo->role[j] == 0)
            lo->role[j] = inputs++;
    if (inputs != in)
        return fail(err, DDPD_EDATA, name,
                    "%d input columns (all but the target%s) but model[%d].in is %" PRId64, inputs,
                    d->n_targets > 1 ? "s" : "", fi, in);

    while (csv_next_record(&c)) {
        int64_t line = c.line;
        int n = 0;
        struct cell cl;
        do {
            r = csv_field(&c, &cl);
            if (r == CSV_ERR)
                return csv_fail(err, name, c.err_line, 0, "line %" PRId64 ": %s", c.err_line, c.err_what);
            n++;
        } while (r == CSV_MORE && n <= lo->ncols);
        if (n > lo->ncols)
            return csv_fail(err, name, line, 0, "line %" PRId64 " has more fields than the header's %d", line,
                            lo->ncols);
        if (n < lo->ncols)
            return csv_fail(err, name, line, 0, "line %" PRId64 " has %d fields but the header has %d", line,
                            n, lo->ncols);
        lo->rows++;
    }
    if (lo->rows == 0 && !empty_ok) /* empty_ok: a {rank} file, as for npy_check */
        return fail(err, DDPD_EDATA, name, "no data rows after the header");
    return DDPD_OK;
}

/* Parses a numeric cell: surrounding spaces allowed, the rest must be a decimal number
 * (hexadecimal is refused; nan and inf are numbers, as pandas reads them). */
static ddpd_err csv_number(const char *name, const struct csv_layout *lo, int col, int64_t line,
                           const struct cell *cl, double *v, struct ddpd_error *err)
{
    char text[CSV_MAX_CELL], shown[48], col_name[64];
    size_t n = cell_text(cl, text, sizeof text);
    cell_text(&lo->names[col], col_name, sizeof col_name);
    snprintf(shown, sizeof shown, "%.40s%s", text, strlen(text) > 40 ? "..." : "");
    char *b = text, *e = text;
    while (*b == ' ' || *b == '\t')
        b++;
    size_t bl = strlen(b);
    while (bl && (b[bl - 1] == ' ' || b[bl - 1] == '\t'))
        b[--bl] = '\0';
    if (bl == 0)
        return csv_fail(err, name, line, col + 1, "line %" PRId64 ", column \"%s\": empty cell", line,
                        col_name);
    errno = 0;
    *v = n < sizeof text && !strpbrk(b, "xX") ? strtod(b, &e) : 0;
    if (n >= sizeof text || strpbrk(b, "xX") || e == b || *e)
        return csv_fail(err, name, line, col + 1, "line %" PRId64 ", column \"%s\": \"%s\" is not a number",
                        line, col_name, shown);
    if (errno == ERANGE && fabs(*v) > 1)
        return csv_fail(err, name, line, col + 1, "line %" PRId64 ", column \"%s\": \"%s\" is out of range",
                        line, col_name, shown);
    return DDPD_OK;
}

/* Second pass, over a file csv_scan accepted: every cell into x, y or labels (or, with
 * those NULL, every cell checked: numbers, class ids in range). */
static ddpd_err csv_fill(const char *name, const char *buf, int64_t len, const struct csv_layout *lo,
                         struct dataset *ds, struct ddpd_error *err)
{
    struct csv c = {lo->body, buf + len, lo->body_line, 0, NULL};
    struct cell cl;
    ddpd_err rc;
    for (int64_t row = 0; csv_next_record(&c); row++) {
        int64_t line = c.line;
        for (int j = 0; j < lo->ncols; j++) {
            double v = 0;
            char col_name[64];
            if (csv_field(&c, &cl) == CSV_ERR) /* cannot happen: csv_scan parsed it */
                return csv_fail(err, name, c.err_line, 0, "line %" PRId64 ": %s", c.err_line, c.err_what);
            if ((rc = csv_number(name, lo, j, line, &cl, &v, err)))
                return rc;
            int32_t role = lo->role[j];
            if (role >= 0) {
                if (ds->x)
                    ds->x[row * ds->in + role] = to_f32(v);
                continue;
            }
            if (!ds->ce) {
                if (ds->y)
                    ds->y[row * ds->out + (-role - 1)] = to_f32(v);
                continue;
            }
            cell_text(&lo->names[j], col_name, sizeof col_name);
            if (v != floor(v))
                return csv_fail(err, name, line, j + 1,
                                "line %" PRId64 ", column \"%s\": class id %g is not an integer", line,
                                col_name, v);
            if (v < 0 || v >= (double)ds->out)
                return csv_fail(err, name, line, j + 1,
                                "line %" PRId64 ", column \"%s\": class id %.0f is out of range "
                                "[0, %" PRId64 ")",
                                line, col_name, v, ds->out);
            if (ds->labels)
                ds->labels[row] = (int32_t)v;
        }
    }
    return DDPD_OK;
}

/* Reads a whole (capped) file into a NUL-terminated buffer. */
static ddpd_err read_whole(const struct dfile *f, char **out, struct ddpd_error *err)
{
    char *buf = malloc((size_t)f->size + 1);
    *out = NULL;
    if (!buf)
        return fail(err, DDPD_ENOMEM, f->name, "out of memory reading %" PRId64 " bytes", f->size);
    int64_t got = read_at(f->fd, buf, f->size, 0);
    if (got != f->size) {
        free(buf);
        return fail(err, DDPD_EDATA, f->name, "cannot read: %s",
                    got < 0 ? strerror(errno) : "file shrank while reading");
    }
    buf[f->size] = '\0';
    *out = buf;
    return DDPD_OK;
}

/* ---- synthetic ---- */

/* The fixed random teacher: the spec's layers with weights and biases uniform in
 * ±1/sqrt(in), computed in double. For cross_entropy the outputs are centred by their
 * mean over TEACHER_CALIB inputs before the argmax: without it a constant part of the
 * logits (e.g. after a sigmoid) can make every label the same class. */
#define TEACHER_CALIB 1024
/* Rows computed together: each weight row is read once per block instead of once per
 * row (a teacher of a few million weights does not fit in cache). Every row's numbers
 * are computed in the same order whatever block it is in, so a row is the same on
 * every rank and in every run. */
#define TEACHER_BLOCK 64

struct teacher {
    const struct spec *s;
    int64_t in, out, max_width;
    double *w[SPEC_MAX_LAYERS], *b[SPEC_MAX_LAYERS];
    double *a, *t;  /* [TEACHER_BLOCK, max_width] activations */
    double *center; /* [out], cross_entropy */
};

static void teacher_free(struct teacher *t)
{
    for (int i = 0; i < SPEC_MAX_LAYERS; i++) {
        free(t->w[i]);
        free(t->b[i]);
    }
    free(t->a);
    free(t->t);
    free(t->center);
}

/* w·a in a fixed order: four partial sums (vectorizable without reassociation), then
 * (s0 + s1) + (s2 + s3). */
static double teacher_dot(const double *restrict w, const double *restrict a, int64_t n)
{
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int64_t k = 0;
    for (; k + 4 <= n; k += 4) {
        s0 += w[k] * a[k];
        s1 += w[k + 1] * a[k + 1];
        s2 += w[k + 2] * a[k + 2];
        s3 += w[k + 3] * a[k + 3];
    }
    for (; k < n; k++)
        s0 += w[k] * a[k];
    return (s0 + s1) + (s2 + s3);
}

/* The teacher's outputs for `rows` inputs at t->a (row stride max_width). Returns the
 * outputs (row stride max_width), borrowed until the next call. */
static const double *teacher_forward(struct teacher *t, int64_t rows)
{
    const struct spec *s = t->s;
    const int64_t ld = t->max_width;
    double *a = t->a, *nx = t->t, *tmp;
    int64_t width = t->in;
    for (int l = 0; l < s->n_layers; l++) {
        const struct spec_layer *L = &s->layers[l];
        const int64_t n = rows * ld;
        switch (L->kind) {
        case LAYER_LINEAR:
            for (int64_t o = 0; o < L->out; o++) {
                const double *w = t->w[l] + o * L->in;
                const double bias = t->b[l] ? t->b[l][o] : 0;
                for (int64_t r = 0; r < rows; r++)
                    nx[r * ld + o] = bias + teacher_dot(w, a + r * ld, L->in);
            }
            width = L->out;
            tmp = a;
            a = nx;
            nx = tmp;
            break;
        case LAYER_RELU:
            for (int64_t k = 0; k < n; k++)
                a[k] = a[k] > 0 ? a[k] : 0;
            break;
        case LAYER_TANH:
            for (int64_t k = 0; k < n; k++)
                a[k] = tanh(a[k]);
            break;
        case LAYER_SIGMOID:
            for (int64_t k = 0; k < n; k++)
                a[k] = 1 / (1 + exp(-a[k]));
            break;
        case LAYER_GELU:
            for (int64_t k = 0; k < n; k++)
                a[k] = 0.5 * a[k] * (1 + erf(a[k] / sqrt(2.0)));
            break;
        }
    }
    (void)width;
    return a;
}

static ddpd_err teacher_new(struct teacher *t, const struct spec *s, struct ddpd_error *err)
{
    struct rng r;
    int64_t params = 0;
    memset(t, 0, sizeof *t);
    t->s = s;
    t->in = s->layers[first_linear(s)].in;
    t->out = s->layers[last_linear(s)].out;
    int64_t width = t->in;
    t->max_width = width;
    for (int i = 0; i < s->n_layers; i++) {
        const struct spec_layer *L = &s->layers[i];
        if (L->kind != LAYER_LINEAR)
            continue;
        if (L->in != width || L->out < 1 || L->out > SPEC_MAX_WIDTH)
            return fail(err, DDPD_ESPEC, "model", "layer %d's shape does not chain", i);
        params += L->in * L->out;
        if (params > TEACHER_MAX_PARAMS)
            return fail(err, DDPD_ESPEC, "data.samples",
                        "the model is too large for synthetic data (a teacher over %lld "
                        "parameters)",
                        TEACHER_MAX_PARAMS);
        width = L->out;
        if (width > t->max_width)
            t->max_width = width;
    }
    t->a = malloc((size_t)(TEACHER_BLOCK * t->max_width) * sizeof(double));
    t->t = malloc((size_t)(TEACHER_BLOCK * t->max_width) * sizeof(double));
    if (!t->a || !t->t)
        return fail(err, DDPD_EDEVICE, "data",
                    "out of memory: cannot allocate the synthetic teacher's activations");
    rng_seed2(&r, s->data.seed ^ SALT_TEACHER, 0);
    for (int i = 0; i < s->n_layers; i++) {
        const struct spec_layer *L = &s->layers[i];
        if (L->kind != LAYER_LINEAR)
            continue;
        double bound = 1.0 / sqrt((double)L->in);
        t->w[i] = malloc((size_t)(L->in * L->out) * sizeof(double));
        t->b[i] = L->bias ? malloc((size_t)L->out * sizeof(double)) : NULL;
        if (!t->w[i] || (L->bias && !t->b[i]))
            return fail(err, DDPD_EDEVICE, "data",
                        "out of memory: cannot allocate the synthetic teacher's layer %d (%" PRId64
                        " doubles, %.1f MiB)",
                        i, L->in * L->out, (double)(L->in * L->out) * sizeof(double) / (1 << 20));
        for (int64_t k = 0; k < L->in * L->out; k++)
            t->w[i][k] = (2 * rng_uniform(&r) - 1) * bound;
        for (int64_t k = 0; L->bias && k < L->out; k++)
            t->b[i][k] = (2 * rng_uniform(&r) - 1) * bound;
    }
    if (s->loss != LOSS_CROSS_ENTROPY)
        return DDPD_OK;
    t->center = calloc((size_t)t->out, sizeof(double));
    if (!t->center)
        return fail(err, DDPD_ENOMEM, "data", "out of memory for the synthetic teacher");
    for (int64_t c0 = 0; c0 < TEACHER_CALIB; c0 += TEACHER_BLOCK) {
        for (int64_t r0 = 0; r0 < TEACHER_BLOCK; r0++) {
            rng_seed2(&r, s->data.seed ^ SALT_CALIB, (uint64_t)(c0 + r0));
            for (int64_t j = 0; j < t->in; j++)
                t->a[r0 * t->max_width + j] = rng_normal(&r);
        }
        const double *o = teacher_forward(t, TEACHER_BLOCK);
        for (int64_t r0 = 0; r0 < TEACHER_BLOCK; r0++)
            for (int64_t k = 0; k < t->out; k++)
                t->center[k] += o[r0 * t->max_width + k] / TEACHER_CALIB;
    }
    return DDPD_OK;
}

/* Rows idx[0..n) (n <= TEACHER_BLOCK) of the synthetic set into x/y/label (row k of
 * the output for idx[k]): x ~ N(0,1), then the teacher's output plus 0.01 N(0,1) (mse)
 * or the argmax of its centred output (cross_entropy). A row depends only on
 * (seed, index), so every rank agrees on it whatever it generates. */
static void teacher_rows(struct teacher *t, const int64_t *idx, int64_t n, float *x, float *y,
                         int32_t *label)
{
    struct rng r[TEACHER_BLOCK];
    const int64_t ld = t->max_width;
    for (int64_t k = 0; k < n; k++) {
        rng_seed2(&r[k], t->s->data.seed ^ SALT_ROWS, (uint64_t)idx[k]);
        for (int64_t j = 0; j < t->in; j++) {
            t->a[k * ld + j] = rng_normal(&r[k]);
            x[k * t->in + j] = (float)t->a[k * ld + j];
        }
    }
    const double *out = teacher_forward(t, n);
    for (int64_t k = 0; k < n; k++) {
        const double *o = out + k * ld;
        if (t->center) {
            int64_t best = 0;
            for (int64_t c = 1; c < t->out; c++)
                if (o[c] - t->center[c] > o[best] - t->center[best])
                    best = c;
            label[k] = (int32_t)best;
        } else {
            for (int64_t c = 0; c < t->out; c++)
                y[k * t->out + c] = to_f32(o[c] + 0.01 * rng_normal(&r[k]));
        }
    }
}

/* ---- the data set ---- */

/* Room for n rows; `what` names the file (EDATA) or the spec field (ESPEC) that sized it. */
static ddpd_err ds_alloc(struct dataset *ds, int64_t n, ddpd_err code, const char *what,
                         struct ddpd_error *err)
{
    int64_t per = (ds->in + (ds->ce ? 1 : ds->out)) * 4;
    if (n > DATA_MAX_MEMORY / per)
        return fail(err, code, what,
                    "too large: %" PRId64 " rows of %" PRId64 " bytes exceed the limit of %lld GiB", n, per,
                    DATA_MAX_MEMORY >> 30);
    ds->n = n;
    if (n == 0)
        n = 1; /* a rank with an empty shard still gets valid pointers */
    ds->x = malloc((size_t)(n * ds->in) * sizeof(float));
    if (ds->ce)
        ds->labels = malloc((size_t)n * sizeof(int32_t));
    else
        ds->y = malloc((size_t)(n * ds->out) * sizeof(float));
    if (!ds->x || (ds->ce ? !ds->labels : !ds->y))
        return fail(err, DDPD_EDEVICE, what,
                    "out of memory: cannot allocate the data set (%" PRId64 " rows of %" PRId64
                    " bytes, %.1f MiB)",
                    n, per, (double)n * (double)per / (1 << 20));
    return DDPD_OK;
}

static ddpd_err open_synthetic(struct dataset *ds, const struct spec *s, struct ddpd_error *err)
{
    struct teacher t;
    ddpd_err rc;
    if (s->data.samples < 1)
        return fail(err, DDPD_ESPEC, "data.samples", "must be at least 1, got %" PRId64, s->data.samples);
    ds->n_total = s->data.samples;
    /* With shuffling every rank needs every row; without, only its own. */
    ds->hold = ds->shuffle ? HOLD_WHOLE : HOLD_SHARD_ONLY;
    int64_t n = ds->shuffle ? ds->n_total : spec_shard_rows(ds->n_total, ds->rank, ds->world);
    if ((rc = teacher_new(&t, s, err)))
        goto out;
    if ((rc = ds_alloc(ds, n, DDPD_ESPEC, "data.samples", err)))
        goto out;
    for (int64_t k0 = 0; k0 < n; k0 += TEACHER_BLOCK) {
        int64_t idx[TEACHER_BLOCK], m = n - k0 < TEACHER_BLOCK ? n - k0 : TEACHER_BLOCK;
        for (int64_t k = 0; k < m; k++)
            idx[k] = ds->shuffle ? k0 + k : ds->rank + (k0 + k) * ds->world;
        teacher_rows(&t, idx, m, ds->x + k0 * ds->in, ds->ce ? NULL : ds->y + k0 * ds->out,
                     ds->ce ? ds->labels + k0 : NULL);
    }
out:
    teacher_free(&t);
    return rc;
}

static ddpd_err open_npy(struct dataset *ds, const struct spec *s, const char *data_dir,
                         struct ddpd_error *err)
{
    struct dfile fx = {.fd = -1}, fy = {.fd = -1};
    struct npy hx, hy;
    int64_t nx, ny;
    ddpd_err rc;
    bool rx = has_rank(s->data.x), ry = has_rank(s->data.y);
    if (rx != ry)
        return fail(err, DDPD_ESPEC, rx ? "data.y" : "data.x", "x and y must both hold {rank} or neither");
    ds->hold = rx ? HOLD_PER_RANK : HOLD_WHOLE;
    if ((rc = file_open(&fx, data_dir, "data.x", s->data.x, ds->rank, err)) ||
        (rc = npy_header(&fx, &hx, err)) || (rc = npy_check(&fx, &hx, NPY_X, s, rx, &nx, err)))
        goto out;
    if ((rc = file_open(&fy, data_dir, "data.y", s->data.y, ds->rank, err)) ||
        (rc = npy_header(&fy, &hy, err)) ||
        (rc = npy_check(&fy, &hy, ds->ce ? NPY_Y_CE : NPY_Y_MSE, s, ry, &ny, err)))
        goto out;
    if (nx != ny) {
        rc = fail(err, DDPD_EDATA, fy.name, "y has %" PRId64 " rows but %s has %" PRId64, ny, fx.name, nx);
        goto out;
    }
    if ((rc = ds_alloc(ds, nx, DDPD_EDATA, fx.name, err)) ||
        (rc = npy_values(&fx, &hx, ds->x, NULL, 0, err)) ||
        (rc = npy_values(&fy, &hy, ds->y, ds->labels, ds->out, err)))
        goto out;
    ds->n_total = nx;
out:
    file_close(&fx);
    file_close(&fy);
    return rc;
}

static ddpd_err open_csv(struct dataset *ds, const struct spec *s, const char *data_dir,
                         struct ddpd_error *err)
{
    struct dfile f = {.fd = -1};
    struct csv_layout lo = {0};
    char *buf = NULL;
    ddpd_err rc;
    ds->hold = has_rank(s->data.path) ? HOLD_PER_RANK : HOLD_WHOLE;
    if ((rc = file_open(&f, data_dir, "data.path", s->data.path, ds->rank, err)) ||
        (rc = read_whole(&f, &buf, err)) ||
        (rc = csv_scan(f.name, buf, f.size, s, ds->hold == HOLD_PER_RANK, &lo, err)) ||
        (rc = ds_alloc(ds, lo.rows, DDPD_EDATA, f.name, err)) ||
        (rc = csv_fill(f.name, buf, f.size, &lo, ds, err)))
        goto out;
    ds->n_total = lo.rows;
out:
    layout_free(&lo);
    free(buf);
    file_close(&f);
    return rc;
}

struct dataset *dataset_open(const struct spec *spec, const char *data_dir, int rank, int world_size,
                             struct ddpd_error *err)
{
    struct dataset *ds = NULL;
    ddpd_err rc;
    if ((rc = check_spec(spec, world_size, err)))
        goto out;
    if (rank < 0 || rank >= world_size) {
        rc = fail(err, DDPD_EINTERNAL, "data", "rank %d is not in [0, %d)", rank, world_size);
        goto out;
    }
    rc = DDPD_ENOMEM;
    ds = calloc(1, sizeof *ds);
    if (!ds) {
        fail(err, rc, "data", "out of memory");
        goto out;
    }
    ds->in = spec->layers[first_linear(spec)].in;
    ds->out = spec->layers[last_linear(spec)].out;
    ds->ce = spec->loss == LOSS_CROSS_ENTROPY;
    ds->rank = rank;
    ds->world = world_size;
    ds->batch = spec->batch_size;
    ds->shuffle = spec->data.shuffle;
    ds->drop_last = spec->data.drop_last;
    ds->seed = spec->data.seed;
    switch (spec->data.kind) {
    case DATA_SYNTHETIC:
        rc = open_synthetic(ds, spec, err);
        break;
    case DATA_NPY:
        rc = open_npy(ds, spec, data_dir, err);
        break;
    case DATA_CSV:
        rc = open_csv(ds, spec, data_dir, err);
        break;
    default:
        rc = fail(err, DDPD_ESPEC, "data.type", "unknown data type");
        break;
    }
    if (rc)
        goto out;

    if (ds->hold == HOLD_PER_RANK) {
        ds->n_total = ds->n;
        ds->shard = ds->n;
    } else {
        ds->shard = spec_shard_rows(ds->n_total, rank, world_size);
    }
    rc = DDPD_ENOMEM;
    ds->idx = malloc((size_t)(ds->shard > 0 ? ds->shard : 1) * sizeof *ds->idx);
    if (ds->shuffle)
        ds->perm = malloc((size_t)ds->n_total * sizeof *ds->perm);
    if (!ds->idx || (ds->shuffle && !ds->perm)) {
        fail(err, rc, "data", "out of memory for the sample order");
        goto out;
    }
    dataset_set_epoch(ds, 0);
    rc = DDPD_OK;
out:
    if (rc) {
        dataset_free(ds);
        return NULL;
    }
    return ds;
}

void dataset_free(struct dataset *ds)
{
    if (!ds)
        return;
    free(ds->x);
    free(ds->y);
    free(ds->labels);
    free(ds->perm);
    free(ds->idx);
    free(ds);
}

int64_t dataset_rows(const struct dataset *ds)
{
    return ds->n_total;
}

bool dataset_rank_file(const struct dataset *ds)
{
    return ds->hold == HOLD_PER_RANK;
}

int64_t dataset_shard_size(const struct dataset *ds)
{
    return ds->shard;
}

int64_t dataset_batches(const struct dataset *ds)
{
    return spec_batches(ds->shard, ds->batch, ds->drop_last);
}

void dataset_set_epoch(struct dataset *ds, int64_t epoch)
{
    if (ds->shuffle) {
        struct rng r;
        for (int64_t i = 0; i < ds->n_total; i++)
            ds->perm[i] = i;
        rng_seed2(&r, ds->seed, (uint64_t)epoch);
        rng_shuffle(&r, ds->perm, ds->n_total);
    }
    for (int64_t k = 0; k < ds->shard; k++) {
        int64_t pos = ds->hold == HOLD_PER_RANK ? k : ds->rank + k * ds->world;
        int64_t row = ds->shuffle ? ds->perm[pos] : pos;
        ds->idx[k] = ds->hold == HOLD_SHARD_ONLY ? k : row;
    }
}

int64_t dataset_batch(const struct dataset *ds, int64_t b, float *x, float *y, int32_t *labels)
{
    /* b < the batch count (partial last batch included) keeps b * batch below the shard:
     * batch_size may be near INT64_MAX. */
    if (b < 0 || b >= spec_batches(ds->shard, ds->batch, false))
        return 0;
    int64_t first = b * ds->batch;
    int64_t rows = ds->shard - first < ds->batch ? ds->shard - first : ds->batch;
    for (int64_t k = 0; k < rows; k++) {
        int64_t i = ds->idx[first + k];
        memcpy(x + k * ds->in, ds->x + i * ds->in, (size_t)ds->in * sizeof(float));
        if (ds->ce)
            labels[k] = ds->labels[i];
        else
            memcpy(y + k * ds->out, ds->y + i * ds->out, (size_t)ds->out * sizeof(float));
    }
    return rows;
}

/* ---- batch counts before any rank starts ---- */

/* Rows of the whole data set, read from the files' headers (or the spec). With `check`
 * the values are read too, for what a rank would otherwise find only after the job was
 * accepted: class ids out of range, CSV cells that are not numbers. *file_bytes is the
 * size of a file a rank reads whole (CSV), else 0. */
static ddpd_err count_rows(const struct spec *s, const char *data_dir, bool check, int64_t *rows,
                           int64_t *file_bytes, struct ddpd_error *err)
{
    struct dfile f = {.fd = -1}, g = {.fd = -1};
    struct npy h, hy;
    struct csv_layout lo = {0};
    char *buf = NULL;
    int64_t ny;
    ddpd_err rc = DDPD_OK;
    switch (s->data.kind) {
    case DATA_SYNTHETIC:
        if (s->data.samples < 1)
            return fail(err, DDPD_ESPEC, "data.samples", "must be at least 1, got %" PRId64, s->data.samples);
        *rows = s->data.samples;
        return DDPD_OK;
    case DATA_NPY:
        if (has_rank(s->data.x) || has_rank(s->data.y))
            break;
        if ((rc = file_open(&f, data_dir, "data.x", s->data.x, 0, err)) || (rc = npy_header(&f, &h, err)) ||
            (rc = npy_check(&f, &h, NPY_X, s, false, rows, err)) ||
            (rc = file_open(&g, data_dir, "data.y", s->data.y, 0, err)) || (rc = npy_header(&g, &hy, err)) ||
            (rc = npy_check(&g, &hy, s->loss == LOSS_CROSS_ENTROPY ? NPY_Y_CE : NPY_Y_MSE, s, false, &ny, err)))
            goto out;
        if (ny != *rows)
            rc = fail(err, DDPD_EDATA, g.name, "y has %" PRId64 " rows but %s has %" PRId64, ny, f.name,
                      *rows);
        else if (check && s->loss == LOSS_CROSS_ENTROPY && hy.numel * hy.size <= DATA_MAX_CHECK)
            rc = npy_values(&g, &hy, NULL, NULL, s->layers[last_linear(s)].out, err);
        goto out;
    case DATA_CSV:
        if (has_rank(s->data.path))
            break;
        if ((rc = file_open(&f, data_dir, "data.path", s->data.path, 0, err)) ||
            (rc = read_whole(&f, &buf, err)) || (rc = csv_scan(f.name, buf, f.size, s, false, &lo, err)))
            goto out;
        *rows = lo.rows;
        *file_bytes = f.size;
        if (check) {
            struct dataset cells = {.in = s->layers[first_linear(s)].in,
                                    .out = s->layers[last_linear(s)].out,
                                    .ce = s->loss == LOSS_CROSS_ENTROPY};
            rc = csv_fill(f.name, buf, f.size, &lo, &cells, err);
        }
        goto out;
    default:
        return fail(err, DDPD_ESPEC, "data.type", "unknown data type");
    }
    return ddpd_error_set(err, DDPD_ENOTFOUND, "data",
                          "batch counts of {rank} files are known only to the ranks");
out:
    layout_free(&lo);
    free(buf);
    file_close(&f);
    file_close(&g);
    return rc;
}

ddpd_err dataset_batch_counts(const struct spec *spec, const char *data_dir, int world_size, int64_t *out,
                              struct ddpd_error *err)
{
    int64_t rows = 0, file_bytes = 0;
    ddpd_err rc;
    if ((rc = check_spec(spec, world_size, err)) ||
        (rc = count_rows(spec, data_dir, false, &rows, &file_bytes, err)))
        return rc;
    for (int r = 0; r < world_size; r++)
        out[r] = spec_batches(spec_shard_rows(rows, r, world_size), spec->batch_size, spec->data.drop_last);
    return DDPD_OK;
}

ddpd_err dataset_check(const struct spec *spec, const char *data_dir, int world_size, int64_t *rows,
                       int64_t *file_bytes, struct ddpd_error *err)
{
    ddpd_err rc;
    *rows = *file_bytes = 0;
    if ((rc = check_spec(spec, world_size, err)))
        return rc;
    return count_rows(spec, data_dir, true, rows, file_bytes, err);
}
