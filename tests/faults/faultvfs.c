/* faultvfs.c — SQLite I/O faults on demand, for the fault tests (tests/faults/). Linked
 * into `ddpd` only by a build with -DDDPD_FAULT_INJECTION=ON, never into a release, and
 * even there inert unless the environment names a control file:
 *
 *   DDPD_FAULT_SQLITE=/path/to/control ddpd serve ...
 *
 * A shim over the default VFS, registered as the new default before main() runs. Every
 * write, sync and truncate of a database, WAL or journal file first reads the control
 * file (when its mtime or size changed): "full" makes it fail with SQLITE_FULL, "ioerr"
 * with SQLITE_IOERR_WRITE (SQLITE_IOERR_FSYNC, ..._TRUNCATE), anything else or no file
 * lets it through. Reads are never failed, so readers keep working while writes fail,
 * as with a full disk. The count of injected faults goes to stderr at exit. */
#include <pthread.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

enum mode { MODE_OFF, MODE_FULL, MODE_IOERR };

static sqlite3_vfs *real_vfs;
static sqlite3_vfs fault_vfs;
static const char *control;
static atomic_ulong injected;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct timespec seen_mtime;
static off_t seen_size = -1;
static enum mode cur = MODE_OFF;

/* The control file's mode, read again only when the file changed. */
static enum mode mode_now(void)
{
    struct stat st;
    enum mode m;
    pthread_mutex_lock(&mu);
    if (stat(control, &st) != 0) {
        cur = MODE_OFF;
        seen_size = -1;
    } else if (st.st_size != seen_size || st.st_mtim.tv_sec != seen_mtime.tv_sec ||
               st.st_mtim.tv_nsec != seen_mtime.tv_nsec) {
        char buf[32] = "";
        FILE *f = fopen(control, "r");
        if (f) {
            size_t n = fread(buf, 1, sizeof buf - 1, f);
            buf[n] = '\0';
            fclose(f);
        }
        cur = !strncmp(buf, "full", 4) ? MODE_FULL : !strncmp(buf, "ioerr", 5) ? MODE_IOERR : MODE_OFF;
        seen_size = st.st_size;
        seen_mtime = st.st_mtim;
    }
    m = cur;
    pthread_mutex_unlock(&mu);
    return m;
}

/* SQLITE_OK, or the fault to report instead of doing `ioerr_kind`'s operation. */
static int fault(int ioerr_kind)
{
    switch (mode_now()) {
    case MODE_FULL: atomic_fetch_add(&injected, 1); return SQLITE_FULL;
    case MODE_IOERR: atomic_fetch_add(&injected, 1); return ioerr_kind;
    case MODE_OFF: break;
    }
    return SQLITE_OK;
}

struct ffile {
    sqlite3_file base;
    sqlite3_file *real; /* follows this struct in the same allocation */
};

#define REAL(f) (((struct ffile *)(f))->real)

static int f_close(sqlite3_file *f)
{
    return REAL(f)->pMethods->xClose(REAL(f));
}
static int f_read(sqlite3_file *f, void *p, int n, sqlite3_int64 off)
{
    return REAL(f)->pMethods->xRead(REAL(f), p, n, off);
}
static int f_write(sqlite3_file *f, const void *p, int n, sqlite3_int64 off)
{
    int rc = fault(SQLITE_IOERR_WRITE);
    return rc ? rc : REAL(f)->pMethods->xWrite(REAL(f), p, n, off);
}
static int f_truncate(sqlite3_file *f, sqlite3_int64 size)
{
    int rc = fault(SQLITE_IOERR_TRUNCATE);
    return rc ? rc : REAL(f)->pMethods->xTruncate(REAL(f), size);
}
static int f_sync(sqlite3_file *f, int flags)
{
    int rc = fault(SQLITE_IOERR_FSYNC);
    return rc ? rc : REAL(f)->pMethods->xSync(REAL(f), flags);
}
static int f_size(sqlite3_file *f, sqlite3_int64 *size)
{
    return REAL(f)->pMethods->xFileSize(REAL(f), size);
}
static int f_lock(sqlite3_file *f, int l)
{
    return REAL(f)->pMethods->xLock(REAL(f), l);
}
static int f_unlock(sqlite3_file *f, int l)
{
    return REAL(f)->pMethods->xUnlock(REAL(f), l);
}
static int f_check(sqlite3_file *f, int *out)
{
    return REAL(f)->pMethods->xCheckReservedLock(REAL(f), out);
}
static int f_fcntl(sqlite3_file *f, int op, void *arg)
{
    return REAL(f)->pMethods->xFileControl(REAL(f), op, arg);
}
static int f_sector(sqlite3_file *f)
{
    return REAL(f)->pMethods->xSectorSize(REAL(f));
}
static int f_devchar(sqlite3_file *f)
{
    return REAL(f)->pMethods->xDeviceCharacteristics(REAL(f));
}
static int f_shm_map(sqlite3_file *f, int pg, int pgsz, int extend, void volatile **pp)
{
    return REAL(f)->pMethods->xShmMap(REAL(f), pg, pgsz, extend, pp);
}
static int f_shm_lock(sqlite3_file *f, int off, int n, int flags)
{
    return REAL(f)->pMethods->xShmLock(REAL(f), off, n, flags);
}
static void f_shm_barrier(sqlite3_file *f)
{
    REAL(f)->pMethods->xShmBarrier(REAL(f));
}
static int f_shm_unmap(sqlite3_file *f, int del)
{
    return REAL(f)->pMethods->xShmUnmap(REAL(f), del);
}
static int f_fetch(sqlite3_file *f, sqlite3_int64 off, int n, void **pp)
{
    return REAL(f)->pMethods->xFetch(REAL(f), off, n, pp);
}
static int f_unfetch(sqlite3_file *f, sqlite3_int64 off, void *p)
{
    return REAL(f)->pMethods->xUnfetch(REAL(f), off, p);
}

static const sqlite3_io_methods fault_io = {
    .iVersion = 3,
    .xClose = f_close,
    .xRead = f_read,
    .xWrite = f_write,
    .xTruncate = f_truncate,
    .xSync = f_sync,
    .xFileSize = f_size,
    .xLock = f_lock,
    .xUnlock = f_unlock,
    .xCheckReservedLock = f_check,
    .xFileControl = f_fcntl,
    .xSectorSize = f_sector,
    .xDeviceCharacteristics = f_devchar,
    .xShmMap = f_shm_map,
    .xShmLock = f_shm_lock,
    .xShmBarrier = f_shm_barrier,
    .xShmUnmap = f_shm_unmap,
    .xFetch = f_fetch,
    .xUnfetch = f_unfetch,
};

static int v_open(sqlite3_vfs *vfs, const char *name, sqlite3_file *f, int flags, int *out_flags)
{
    (void)vfs;
    struct ffile *ff = (struct ffile *)f;
    ff->real = (sqlite3_file *)(ff + 1);
    ff->base.pMethods = NULL;
    int rc = real_vfs->xOpen(real_vfs, name, ff->real, flags, out_flags);
    if (rc != SQLITE_OK || !ff->real->pMethods)
        return rc;
    /* The shim's table forwards version 3 methods (the unix VFS has them). */
    if (ff->real->pMethods->iVersion < 3) {
        ff->real->pMethods->xClose(ff->real);
        return SQLITE_CANTOPEN;
    }
    ff->base.pMethods = &fault_io;
    return SQLITE_OK;
}

static int v_delete(sqlite3_vfs *v, const char *n, int sync)
{
    (void)v;
    return real_vfs->xDelete(real_vfs, n, sync);
}
static int v_access(sqlite3_vfs *v, const char *n, int flags, int *out)
{
    (void)v;
    return real_vfs->xAccess(real_vfs, n, flags, out);
}
static int v_fullpath(sqlite3_vfs *v, const char *n, int cap, char *out)
{
    (void)v;
    return real_vfs->xFullPathname(real_vfs, n, cap, out);
}
static void *v_dlopen(sqlite3_vfs *v, const char *n)
{
    (void)v;
    return real_vfs->xDlOpen(real_vfs, n);
}
static void v_dlerror(sqlite3_vfs *v, int n, char *out)
{
    (void)v;
    real_vfs->xDlError(real_vfs, n, out);
}
static void (*v_dlsym(sqlite3_vfs *v, void *h, const char *s))(void)
{
    (void)v;
    return real_vfs->xDlSym(real_vfs, h, s);
}
static void v_dlclose(sqlite3_vfs *v, void *h)
{
    (void)v;
    real_vfs->xDlClose(real_vfs, h);
}
static int v_random(sqlite3_vfs *v, int n, char *out)
{
    (void)v;
    return real_vfs->xRandomness(real_vfs, n, out);
}
static int v_sleep(sqlite3_vfs *v, int us)
{
    (void)v;
    return real_vfs->xSleep(real_vfs, us);
}
static int v_time(sqlite3_vfs *v, double *out)
{
    (void)v;
    return real_vfs->xCurrentTime(real_vfs, out);
}
static int v_lasterr(sqlite3_vfs *v, int n, char *out)
{
    (void)v;
    return real_vfs->xGetLastError(real_vfs, n, out);
}
static int v_time64(sqlite3_vfs *v, sqlite3_int64 *out)
{
    (void)v;
    return real_vfs->xCurrentTimeInt64(real_vfs, out);
}

static void report(void)
{
    fprintf(stderr, "ddpd: faultvfs: %lu SQLite I/O faults injected\n",
            (unsigned long)atomic_load(&injected));
}

__attribute__((constructor)) static void faultvfs_install(void)
{
    control = getenv("DDPD_FAULT_SQLITE");
    if (!control || !*control)
        return;
    if (sqlite3_initialize() != SQLITE_OK || !(real_vfs = sqlite3_vfs_find(NULL))) {
        fprintf(stderr, "ddpd: faultvfs: no default SQLite VFS\n");
        exit(1);
    }
    fault_vfs = (sqlite3_vfs){
        .iVersion = 2,
        .szOsFile = (int)sizeof(struct ffile) + real_vfs->szOsFile,
        .mxPathname = real_vfs->mxPathname,
        .zName = "ddpd-fault",
        .xOpen = v_open,
        .xDelete = v_delete,
        .xAccess = v_access,
        .xFullPathname = v_fullpath,
        .xDlOpen = v_dlopen,
        .xDlError = v_dlerror,
        .xDlSym = v_dlsym,
        .xDlClose = v_dlclose,
        .xRandomness = v_random,
        .xSleep = v_sleep,
        .xCurrentTime = v_time,
        .xGetLastError = v_lasterr,
        .xCurrentTimeInt64 = v_time64,
    };
    if (sqlite3_vfs_register(&fault_vfs, 1) != SQLITE_OK) {
        fprintf(stderr, "ddpd: faultvfs: cannot register the VFS\n");
        exit(1);
    }
    atexit(report);
    fprintf(stderr, "ddpd: faultvfs: SQLite writes fail on demand (control file %s)\n", control);
}
