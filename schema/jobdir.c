/* jobdir.c — a job folder's names, its size, checkpoint pruning and the quota's size syntax
 * (jobdir.h). Plain POSIX directory walks from directory descriptors, never following a
 * symbolic link; knows nothing of what the files hold. */
#include "jobdir.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../base/file.h"

#define CKPT_PREFIX "ckpt-"
#define BEST_PREFIX "best-"

/* snprintf into out[cap]: false when it did not fit. */
static bool name_fits(char *out, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static bool name_fits(char *out, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(out, cap, fmt, ap);
    va_end(ap);
    return n >= 0 && (size_t)n < cap;
}

bool jobdir_job_path(char *out, size_t cap, const char *jobs_dir, int64_t job)
{
    return name_fits(out, cap, "%s/%" PRId64, jobs_dir, job);
}

bool jobdir_ckpt_path(char *out, size_t cap, const char *out_dir, int64_t step)
{
    return name_fits(out, cap, "%s/" CKPT_PREFIX "%" PRId64, out_dir, step);
}

bool jobdir_tmp_path(char *out, size_t cap, const char *ckpt_dir)
{
    return name_fits(out, cap, "%s.tmp", ckpt_dir);
}

bool jobdir_rank_log_path(char *out, size_t cap, const char *out_dir, int rank)
{
    return name_fits(out, cap, "%s/rank-%d.log", out_dir, rank);
}

bool jobdir_nccl_log_path(char *out, size_t cap, const char *out_dir, int rank)
{
    return name_fits(out, cap, "%s/rank-%d.nccl.log", out_dir, rank);
}

bool jobdir_model_path(char *out, size_t cap, const char *dir)
{
    return name_fits(out, cap, "%s/" JOBDIR_MODEL_FILE, dir);
}

bool jobdir_file_path(char *out, size_t cap, const char *dir, const char *name)
{
    return name_fits(out, cap, "%s/%s", dir, name);
}

bool jobdir_rank_file(char *out, size_t cap, const char *what, int rank)
{
    return rank == 0 ? name_fits(out, cap, "%s.safetensors", what)
                     : name_fits(out, cap, "%s-rank-%d.safetensors", what, rank);
}

bool jobdir_latest_ckpt(const char *out_dir, char *path, size_t cap)
{
    DIR *d = opendir(out_dir);
    if (!d)
        return false;
    int64_t best = -1, n;
    struct dirent *e;
    char f[PATH_MAX + 320], optim[64];
    jobdir_rank_file(optim, sizeof optim, JOBDIR_OPTIM, 0);
    while ((e = readdir(d))) {
        struct stat st;
        /* "ckpt-7.tmp" is a torn write: not a checkpoint */
        if (jobdir_ckpt_step(e->d_name, &n) && n > best &&
            name_fits(f, sizeof f, "%s/%s/%s", out_dir, e->d_name, optim) && stat(f, &st) == 0)
            best = n;
    }
    closedir(d);
    return best >= 0 && jobdir_ckpt_path(path, cap, out_dir, best);
}

static int cmp_i64(const void *a, const void *b);

bool jobdir_ckpt_list(const char *out_dir, int64_t **steps, size_t *n)
{
    *steps = NULL;
    *n = 0;
    DIR *d = opendir(out_dir);
    if (!d)
        return true;
    size_t cap = 0;
    bool ok = true;
    struct dirent *e;
    char f[PATH_MAX + 320], optim[64];
    jobdir_rank_file(optim, sizeof optim, JOBDIR_OPTIM, 0);
    while (ok && (e = readdir(d))) {
        struct stat st;
        int64_t step;
        if (!jobdir_ckpt_step(e->d_name, &step) ||
            !name_fits(f, sizeof f, "%s/%s/%s", out_dir, e->d_name, optim) || stat(f, &st) != 0)
            continue;
        if (*n == cap) {
            int64_t *grown = realloc(*steps, (cap = cap ? 2 * cap : 16) * sizeof *grown);
            if (!grown) {
                ok = false;
                break;
            }
            *steps = grown;
        }
        (*steps)[(*n)++] = step;
    }
    closedir(d);
    if (!ok) {
        free(*steps);
        *steps = NULL;
        *n = 0;
        return false;
    }
    if (*n)
        qsort(*steps, *n, sizeof **steps, cmp_i64);
    return true;
}

ddpd_err jobdir_ckpt_link(const char *src, const char *dst, struct ddpd_error *err)
{
    char tmp[PATH_MAX], parent[PATH_MAX], f[PATH_MAX + 320], g[PATH_MAX + 320], optim[64];
    struct stat st;
    DIR *d = NULL;
    ddpd_err rc = DDPD_OK;
    if (stat(dst, &st) == 0)
        return DDPD_OK;
    if (!jobdir_tmp_path(tmp, sizeof tmp, dst) || !name_fits(parent, sizeof parent, "%s", dst))
        return ddpd_error_set(err, DDPD_EIO, dst, "%s: name too long", dst);
    char *slash = strrchr(parent, '/');
    if (slash && slash != parent) {
        *slash = '\0';
        int en = base_mkdirs(parent, true);
        if (en)
            return ddpd_error_set(err, DDPD_EIO, parent, "%s: cannot create: %s", parent, strerror(en));
    }
    jobdir_rank_file(optim, sizeof optim, JOBDIR_OPTIM, 0);
    if (!name_fits(f, sizeof f, "%s/%s", src, optim) || stat(f, &st) != 0 || !(d = opendir(src)))
        return ddpd_error_set(err, DDPD_EDATA, src,
                              "%s: no such complete checkpoint (it was deleted or pruned)", src);
    base_remove_tree(tmp); /* a leftover of a crash */
    if (mkdir(tmp, 0700) != 0) {
        rc = ddpd_error_set(err, DDPD_EIO, tmp, "%s: cannot create: %s", tmp, strerror(errno));
        goto out;
    }
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!name_fits(f, sizeof f, "%s/%s", src, e->d_name) || lstat(f, &st) != 0 || !S_ISREG(st.st_mode))
            continue;
        if (!name_fits(g, sizeof g, "%s/%s", tmp, e->d_name) || link(f, g) != 0) {
            rc = ddpd_error_set(err, DDPD_EIO, f, "%s: cannot link it into %s: %s", f, tmp, strerror(errno));
            goto out;
        }
    }
    if (rename(tmp, dst) != 0)
        rc = ddpd_error_set(err, DDPD_EIO, dst, "%s: cannot rename %s into place: %s", dst, tmp,
                            strerror(errno));
out:
    if (rc)
        base_remove_tree(tmp);
    if (d)
        closedir(d);
    return rc;
}

bool jobdir_init_weights(const char *job_dir, int64_t step, char *path, size_t cap)
{
    char ck[PATH_MAX], optim[64], f[PATH_MAX + 80];
    struct stat st;
    if (step >= 0) {
        jobdir_rank_file(optim, sizeof optim, JOBDIR_OPTIM, 0);
        return jobdir_ckpt_path(ck, sizeof ck, job_dir, step) && jobdir_file_path(f, sizeof f, ck, optim) &&
               stat(f, &st) == 0 && jobdir_model_path(path, cap, ck) && stat(path, &st) == 0;
    }
    if (jobdir_model_path(path, cap, job_dir) && stat(path, &st) == 0)
        return true;
    return jobdir_latest_ckpt(job_dir, ck, sizeof ck) && jobdir_model_path(path, cap, ck) &&
           stat(path, &st) == 0;
}

/* "<prefix>N" with N decimal, no sign, no suffix: N into *step. */
static bool prefixed_step(const char *name, const char *prefix, int64_t *step)
{
    if (strncmp(name, prefix, strlen(prefix)) != 0)
        return false;
    const char *p = name + strlen(prefix);
    int64_t n = 0;
    if (!*p)
        return false;
    for (; *p; p++) {
        if (*p < '0' || *p > '9' || n > (INT64_MAX - (*p - '0')) / 10)
            return false;
        n = n * 10 + (*p - '0');
    }
    *step = n;
    return true;
}

bool jobdir_ckpt_step(const char *name, int64_t *step)
{
    return prefixed_step(name, CKPT_PREFIX, step);
}

/* ---- the best checkpoint (checkpoint.keep_best) ---- */

bool jobdir_best_path(char *out, size_t cap, const char *out_dir, int64_t step)
{
    return name_fits(out, cap, "%s/" BEST_PREFIX "%" PRId64, out_dir, step);
}

bool jobdir_best_find(const char *out_dir, int64_t *step)
{
    DIR *d = opendir(out_dir);
    if (!d)
        return false;
    int64_t best = -1, n;
    struct dirent *e;
    while ((e = readdir(d)))
        if (prefixed_step(e->d_name, BEST_PREFIX, &n) && n > best)
            best = n;
    closedir(d);
    if (best >= 0)
        *step = best;
    return best >= 0;
}

bool jobdir_step_dir(char *out, size_t cap, const char *out_dir, int64_t step)
{
    struct stat st;
    return (jobdir_ckpt_path(out, cap, out_dir, step) && stat(out, &st) == 0) ||
           (jobdir_best_path(out, cap, out_dir, step) && stat(out, &st) == 0);
}

/* Adds the sizes of the regular files under the open directory `fd` (taken: closed
 * here) to *sum. `path` names it for messages. */
static ddpd_err walk_bytes(int fd, const char *path, int depth, int64_t *sum, struct ddpd_error *err)
{
    DIR *d = fdopendir(fd);
    if (!d) {
        int en = errno;
        close(fd);
        return ddpd_error_set(err, DDPD_EIO, path, "%s: cannot read the folder: %s", path, strerror(en));
    }
    ddpd_err rc = DDPD_OK;
    struct dirent *e;
    errno = 0;
    while (rc == DDPD_OK && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        struct stat st;
        if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0)
            continue; /* gone meanwhile (pruned, renamed into place): not there to count */
        if (S_ISREG(st.st_mode)) {
            int64_t sz = st.st_size > 0 ? (int64_t)st.st_size : 0;
            *sum = *sum > INT64_MAX - sz ? INT64_MAX : *sum + sz;
        } else if (S_ISDIR(st.st_mode) && depth < JOBDIR_MAX_DEPTH) {
            int sub = openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (sub < 0)
                continue;
            char child[4096];
            snprintf(child, sizeof child, "%s/%s", path, e->d_name);
            rc = walk_bytes(sub, child, depth + 1, sum, err);
        }
        errno = 0;
    }
    if (rc == DDPD_OK && errno)
        rc = ddpd_error_set(err, DDPD_EIO, path, "%s: cannot read the folder: %s", path, strerror(errno));
    closedir(d);
    return rc;
}

ddpd_err jobdir_bytes(const char *dir, int64_t *bytes, struct ddpd_error *err)
{
    *bytes = 0;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return ddpd_error_set(err, DDPD_EIO, dir, "%s: cannot open the job folder: %s", dir, strerror(errno));
    return walk_bytes(fd, dir, 0, bytes, err);
}

ddpd_err jobdir_check_quota(const char *dir, int64_t quota, int64_t adding, const char *what,
                            struct ddpd_error *err)
{
    if (quota <= 0)
        return DDPD_OK;
    int64_t have;
    ddpd_err rc = jobdir_bytes(dir, &have, err);
    if (rc)
        return rc;
    if (adding < 0)
        adding = 0;
    if (have <= quota && adding <= quota - have)
        return DDPD_OK;
    if (!adding)
        return ddpd_error_set(err, DDPD_EIO, dir,
                              "the job folder %s holds %" PRId64 " bytes, over the job disk quota of %" PRId64
                              " bytes (ddpd serve --job-disk-quota)",
                              dir, have, quota);
    return ddpd_error_set(err, DDPD_EIO, dir,
                          "writing %s (%" PRId64 " bytes) would bring the job folder %s from %" PRId64
                          " to %" PRId64 " bytes, over the job disk quota of %" PRId64
                          " bytes (ddpd serve --job-disk-quota); nothing was written",
                          what, adding, dir, have, have > INT64_MAX - adding ? INT64_MAX : have + adding,
                          quota);
}

/* Removes `name` under the directory `at`, a file or a whole folder (depth-capped, links
 * removed as links). 0, or an errno value. */
static int remove_tree(int at, const char *name, int depth)
{
    if (unlinkat(at, name, 0) == 0 || errno == ENOENT)
        return 0;
    if (errno != EISDIR && errno != EPERM)
        return errno;
    if (depth >= JOBDIR_MAX_DEPTH)
        return ELOOP;
    int fd = openat(at, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? 0 : errno;
    DIR *d = fdopendir(fd);
    if (!d) {
        int en = errno;
        close(fd);
        return en;
    }
    int en = 0;
    struct dirent *e;
    while (!en && (e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            en = remove_tree(dirfd(d), e->d_name, depth + 1);
    closedir(d);
    if (!en && unlinkat(at, name, AT_REMOVEDIR) != 0 && errno != ENOENT)
        en = errno;
    return en;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* A leftover of a crash: "ckpt-N.del" (a prune cut short), or "ckpt-N.tmp" with
 * N < newest (a write cut short; the one at `newest` or later may be another rank's
 * write in progress and is left alone). */
static bool is_leftover(const char *name, int64_t newest)
{
    size_t len = strlen(name);
    if (len < 9 || len >= 64 || strncmp(name, CKPT_PREFIX, strlen(CKPT_PREFIX)) != 0)
        return false;
    const char *suffix = name + len - 4;
    if (strcmp(suffix, ".del") && strcmp(suffix, ".tmp"))
        return false;
    char base[64];
    memcpy(base, name, len - 4);
    base[len - 4] = '\0';
    int64_t n;
    if (!jobdir_ckpt_step(base, &n))
        return false;
    return !strcmp(suffix, ".del") || n < newest;
}

ddpd_err jobdir_prune(const char *dir, int64_t keep_last, int64_t newest, int *pruned, struct ddpd_error *err)
{
    int64_t *steps = NULL;
    size_t n = 0, cap = 0;
    int dfd = -1, gone = 0;
    DIR *d = NULL;
    ddpd_err rc = DDPD_OK;
    char name[64];

    if (pruned)
        *pruned = 0;
    if (keep_last < 1)
        keep_last = 1;
    dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int lfd = dfd >= 0 ? dup(dfd) : -1;
    if (lfd < 0 || !(d = fdopendir(lfd))) {
        if (lfd >= 0)
            close(lfd);
        rc = ddpd_error_set(err, DDPD_EIO, dir, "%s: cannot read the job folder to prune checkpoints: %s",
                            dir, strerror(errno));
        goto out;
    }
    /* Leftovers first, then the list of complete checkpoints other than the newest. */
    struct dirent *e;
    while ((e = readdir(d))) {
        int64_t step;
        if (is_leftover(e->d_name, newest)) {
            int en = remove_tree(dfd, e->d_name, 0);
            if (en) {
                rc = ddpd_error_set(err, DDPD_EIO, dir, "%s/%s: cannot remove: %s", dir, e->d_name,
                                    strerror(en));
                goto out;
            }
            continue;
        }
        if (!jobdir_ckpt_step(e->d_name, &step) || step == newest)
            continue;
        if (n == cap) {
            size_t ncap = cap ? cap * 2 : 16;
            int64_t *p = realloc(steps, ncap * sizeof *p);
            if (!p) {
                rc = ddpd_error_set(err, DDPD_ENOMEM, dir, "%s: out of memory listing checkpoints", dir);
                goto out;
            }
            steps = p;
            cap = ncap;
        }
        steps[n++] = step;
    }
    /* The newest keep_last - 1 of the others stay beside the one just written. */
    if ((int64_t)n <= keep_last - 1)
        goto out;
    qsort(steps, n, sizeof *steps, cmp_i64);
    size_t drop = n - (size_t)(keep_last - 1);
    /* Each goes out of the set of checkpoints in one rename; only then is it removed, so
     * that a crash leaves a ".del" folder that nothing reads as a checkpoint. */
    for (size_t i = 0; i < drop; i++) {
        char del[80];
        snprintf(name, sizeof name, CKPT_PREFIX "%" PRId64, steps[i]);
        snprintf(del, sizeof del, "%s.del", name);
        if (renameat(dfd, name, dfd, del) != 0) {
            if (errno == ENOENT)
                continue;
            rc = ddpd_error_set(err, DDPD_EIO, dir, "%s/%s: cannot remove: %s", dir, name, strerror(errno));
            goto out;
        }
        int en = remove_tree(dfd, del, 0);
        if (en) {
            rc = ddpd_error_set(err, DDPD_EIO, dir, "%s/%s: cannot remove: %s", dir, del, strerror(en));
            goto out;
        }
        gone++;
    }
    fsync(dfd);
out:
    if (pruned)
        *pruned = gone;
    if (d)
        closedir(d);
    if (dfd >= 0)
        close(dfd);
    free(steps);
    return rc;
}

ddpd_err jobdir_best_prune(const char *dir, int64_t keep, struct ddpd_error *err)
{
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int lfd = dfd >= 0 ? dup(dfd) : -1;
    DIR *d = lfd >= 0 ? fdopendir(lfd) : NULL;
    ddpd_err rc = DDPD_OK;
    if (!d) {
        if (lfd >= 0)
            close(lfd);
        rc = ddpd_error_set(err, DDPD_EIO, dir,
                            "%s: cannot read the job folder to replace the best checkpoint: %s", dir,
                            strerror(errno));
        goto out;
    }
    struct dirent *e;
    while ((e = readdir(d))) {
        char base[64];
        int64_t n;
        size_t len = strlen(e->d_name);
        if (len >= sizeof base || strncmp(e->d_name, BEST_PREFIX, strlen(BEST_PREFIX)) != 0)
            continue;
        memcpy(base, e->d_name, len + 1);
        if (len > 4 && (!strcmp(base + len - 4, ".tmp") || !strcmp(base + len - 4, ".del")))
            base[len - 4] = '\0';
        /* Every other best, and the torn writes of one (never keep's own .tmp: it has none
         * once renamed into place). */
        if (!prefixed_step(base, BEST_PREFIX, &n) || (n == keep && !strcmp(base, e->d_name)))
            continue;
        int en = remove_tree(dfd, e->d_name, 0);
        if (en) {
            rc = ddpd_error_set(err, DDPD_EIO, dir, "%s/%s: cannot remove: %s", dir, e->d_name, strerror(en));
            goto out;
        }
    }
    fsync(dfd);
out:
    if (d)
        closedir(d);
    if (dfd >= 0)
        close(dfd);
    return rc;
}

ddpd_err jobdir_missing_ckpt(const char *ckpt_dir, struct ddpd_error *err)
{
    char parent[4096], list[512] = "";
    snprintf(parent, sizeof parent, "%s", ckpt_dir);
    size_t len = strlen(parent);
    while (len > 1 && parent[len - 1] == '/')
        parent[--len] = '\0';
    char *slash = strrchr(parent, '/');
    if (!slash)
        snprintf(parent, sizeof parent, ".");
    else if (slash == parent)
        parent[1] = '\0';
    else
        *slash = '\0';
    /* The newest few complete checkpoints beside it, newest first. */
    int64_t best[4];
    int nb = 0;
    DIR *d = opendir(parent);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        int64_t step;
        if (!jobdir_ckpt_step(e->d_name, &step))
            continue;
        int i = nb < 4 ? nb++ : 4;
        while (i > 0 && best[i - 1] < step) {
            if (i < 4)
                best[i] = best[i - 1];
            i--;
        }
        if (i < 4)
            best[i] = step;
    }
    if (d)
        closedir(d);
    for (int i = 0; i < nb; i++) {
        size_t at = strlen(list);
        snprintf(list + at, sizeof list - at, "%s%s/" CKPT_PREFIX "%" PRId64, i ? ", " : "", parent, best[i]);
    }
    return ddpd_error_set(
        err, DDPD_EDATA, ckpt_dir,
        "%s: no such checkpoint (checkpoint.keep_last deletes all but the newest ones); %s%s", ckpt_dir,
        nb ? "the newest there: " : "there is no complete checkpoint in ", nb ? list : parent);
}

bool jobdir_size_parse(const char *text, int64_t *bytes)
{
    if (!text || !*text)
        return false;
    if (!strcasecmp(text, "none")) {
        *bytes = 0;
        return true;
    }
    const char *p = text;
    int64_t n = 0;
    if (*p < '0' || *p > '9')
        return false;
    for (; *p >= '0' && *p <= '9'; p++) {
        if (n > (INT64_MAX - (*p - '0')) / 10)
            return false;
        n = n * 10 + (*p - '0');
    }
    int shift = 0;
    switch (*p) {
    case 'k':
    case 'K': shift = 10; break;
    case 'm':
    case 'M': shift = 20; break;
    case 'g':
    case 'G': shift = 30; break;
    case 't':
    case 'T': shift = 40; break;
    default: break;
    }
    if (shift) {
        p++;
        if (!strcasecmp(p, "ib") || !strcasecmp(p, "b"))
            p += strlen(p);
    } else if (!strcasecmp(p, "b")) {
        p++;
    }
    if (*p)
        return false;
    if (n > (INT64_MAX >> shift))
        return false;
    *bytes = n << shift;
    return true;
}
