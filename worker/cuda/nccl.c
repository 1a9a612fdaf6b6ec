/* cuda/nccl.c — the NCCL collective backend for CUDA tensors. Collectives run on a comm
 * stream of their own: each waits for an event recorded on the compute stream (the
 * gradients are produced), and the compute stream waits for an event recorded after it
 * (the optimizer reads the sums), so the host never blocks on an all-reduce. A watchdog
 * thread checks every outstanding collective against its deadline and polls
 * ncclCommGetAsyncError; either failure aborts the communicator (never destroys it) and
 * ends the worker with the comm exit code. Only the module side of worker/cuda speaks CUDA
 * (this file, module.c and the .cu files); it is built into libddpd-cuda.so, which
 * cuda/nccl_forward.c forwards to.
 *
 * Threads and the communicator. NCCL's calls are re-entrant but not thread-safe: one
 * thread at a time may call on a communicator, and ncclCommAbort frees it, so no call may
 * overlap or follow it (NCCL's user guide, "Thread Safety" and ncclCommAbort). Two threads
 * call here, the caller's (the worker's main thread) and the watchdog, and the discipline
 * is one lock:
 *   - c->call_mu guards c->comm and every NCCL call that takes it. It is held across one
 *     NCCL call only, never across a wait, a sleep, a CUDA synchronisation or an exit, and
 *     nothing else is locked while it is held (c->mu may be held around it, never taken
 *     inside it). The communicator is non-blocking (config.blocking = 0): every call
 *     returns at once, ncclInProgress at worst, so no holder holds it long.
 *   - The caller takes it plainly. The watchdog only tries it for its poll of the
 *     asynchronous error (busy: the caller is in a call, and the poll waits its turn);
 *     where it must have it (NCCL's text of a failure, the abort) it waits ABORT_S at most.
 *   - An abort takes it, takes the handle out (c->comm = NULL) and lets it go, then calls
 *     ncclCommAbort on the handle (bounded by ABORT_S on a helper thread). No call is
 *     running then and none can start: every later path finds c->comm NULL and fails with
 *     the failure recorded. The watchdog waits for the lock at most ABORT_S; past that it
 *     ends the worker without aborting (the process's end releases NCCL as well).
 *   - c->mu guards the watchdog's FIFO, the works' deadlines and refs, the spare list and
 *     the failure's text.
 * A failure the watchdog reports ends the worker from the watchdog's thread (worker_die:
 * the `error` event is flushed, then _exit), while the caller's thread may be blocked in a
 * stream synchronisation; the caller reports every other one (handoff below).
 *
 * Deadlines. A collective's deadline (ddp.timeout_s) runs from the moment it can begin on
 * the comm stream: an event recorded there after the wait for the compute stream (and
 * after the collectives before it) says when, and the watchdog starts the clock when that
 * event completes. A long backward pass before an all-reduce therefore does not count
 * against it; a peer that never comes does. The compute stream's own work has no
 * deadline here (a stuck kernel is the device's failure, not the group's). */
#include <cuda_runtime.h>
#include <nccl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../../base/clock.h"
#include "../emit.h"
#include "../comm.h"
#include "plugin.h"

_Static_assert(sizeof(ncclUniqueId) == COMM_ID_BYTES, "a comm_id carries an ncclUniqueId");

/* ncclCommAbort, and the wait for the comm stream after it, are bounded too: past this the
 * worker goes on without them. A survivor of a lost peer thus ends within timeout_s (its
 * collective's deadline) + ABORT_S + the flush of its error (emit_die). */
#define ABORT_S 5.0
/* A worker still running this long after a failure its caller took is ended by the
 * watchdog (see watchdog_main): ABORT_S for the caller's abort, and time to write its error. */
#define REAP_S        (ABORT_S + 4.0)
#define WATCH_IDLE_MS 100  /* the watchdog's async-error poll when nothing is outstanding */
#define WATCH_BUSY_MS 2    /* and while collectives are: deadlines are seconds, so no spinning */
#define STAGE_MIN     4096 /* the host collectives' staging starts at this many bytes */

/* One collective the watchdog watches; shared with its request until both let go. */
struct work {
    cudaEvent_t started; /* recorded on the comm stream before the collective: it can begin */
    cudaEvent_t done;    /* recorded on the comm stream after the collective */
    double deadline;     /* 0 until `started` is seen complete, then that moment + timeout_s */
    char what[64];
    int refs;
    struct work *next; /* the watchdog's FIFO, or the spare list */
    struct work *all;  /* every work made: nc_free frees them, waited for or not */
};

/* Staging buffers outgrown by a larger host collective: freed at the end, not while the
 * device may be busy (cudaFree waits for the whole device). */
struct retired {
    void *dbuf, *hbuf;
    struct retired *next;
};

struct nccl {
    pthread_mutex_t call_mu; /* the communicator's lock: see the discipline at the top */
    ncclComm_t comm;         /* under call_mu; NULL once taken out for the abort */
    int rank, world, device;
    double timeout_s;
    cudaStream_t stream;  /* the comm stream */
    cudaStream_t compute; /* the compute backend's stream, from bind_dev */
    cudaEvent_t produced; /* recorded on the compute stream before each collective */
    /* Staging for host-memory collectives (allgather, max): device and pinned host. */
    void *dbuf, *hbuf;
    size_t stage_cap;
    struct retired *retired;

    pthread_t watchdog;
    bool watching;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct work *head, *tail, *spare, *all;
    bool stop;
    atomic_bool failed; /* set once; every later call fails fast */
    atomic_bool aborted;
    atomic_int reporter; /* who reports the failure: enum reporter */
    char err[512];
    ddpd_err code; /* the first failure's: DDPD_EDEVICE for CUDA's, DDPD_ECOMM otherwise */
};

/* A failure is reported once: by the watchdog, which ends the worker itself, or by the
 * caller, to whom the table's functions return it (worker/main.c then aborts and exits).
 * Not both: the watchdog's abort sets the caller's streams going again, and its next call
 * would report the same failure while the watchdog does, two `error` events and two
 * exits racing in emit.c. */
enum reporter { REPORTER_NONE, REPORTER_CALLER, REPORTER_WATCHDOG };

static bool watchdog_claims(struct nccl *c)
{
    int none = REPORTER_NONE;
    return atomic_compare_exchange_strong(&c->reporter, &none, REPORTER_WATCHDOG);
}

static void abort_bounded(struct nccl *c, bool bounded);

/* What a table function returns: `rc`, unless the watchdog is ending the worker with the
 * failure, when the caller waits here for the exit (bounded by ABORT_S) instead. A failure
 * the caller takes aborts the communicator before it returns: NCCL's collective then stops
 * stalling the comm stream, and the caller's way out (freeing device memory, which waits
 * for the whole device) does not wait on it for ever. */
static ddpd_err handoff(struct nccl *c, ddpd_err rc)
{
    int none = REPORTER_NONE;
    if (rc == DDPD_OK)
        return rc;
    if (atomic_compare_exchange_strong(&c->reporter, &none, REPORTER_CALLER) || none == REPORTER_CALLER) {
        abort_bounded(c, false);
        return rc;
    }
    for (;;)
        pause();
}

/* The code of the failure recorded; DDPD_ECOMM when there is none (nc_abort sets
 * c->failed without one). */
static ddpd_err failed_code(struct nccl *c)
{
    pthread_mutex_lock(&c->mu);
    ddpd_err code = c->code;
    pthread_mutex_unlock(&c->mu);
    return code != DDPD_OK ? code : DDPD_ECOMM;
}

/* Records the first failure's text and code; returns that first failure's code, so that
 * every later call reports the same cause. */
static ddpd_err fail_as(struct nccl *c, ddpd_err code, const char *fmt, const char *what, const char *why)
{
    pthread_mutex_lock(&c->mu);
    if (!atomic_load(&c->failed)) {
        snprintf(c->err, sizeof c->err, fmt, what, why);
        c->code = code;
        atomic_store(&c->failed, true);
    }
    pthread_mutex_unlock(&c->mu);
    return failed_code(c);
}

static ddpd_err fail(struct nccl *c, const char *fmt, const char *what, const char *why)
{
    return fail_as(c, DDPD_ECOMM, fmt, what, why);
}

/* A CUDA error is the device's failure (exit code 4), not the group's. */
static ddpd_err cuda_fail(struct nccl *c, cudaError_t e, const char *what)
{
    return fail_as(c, DDPD_EDEVICE, "nccl: %s: CUDA error: %s", what, cudaGetErrorString(e));
}

/* ---- the communicator's calls, each under call_mu (the discipline at the top) ----
 * Each answers ncclInvalidUsage once the communicator was taken out for the abort, which
 * was recorded as a failure before it: the caller then reports that one. */

static ncclResult_t call_async_error(struct nccl *c, ncclResult_t *async)
{
    ncclResult_t r = ncclInvalidUsage;
    pthread_mutex_lock(&c->call_mu);
    if (c->comm)
        r = ncclCommGetAsyncError(c->comm, async);
    pthread_mutex_unlock(&c->call_mu);
    return r;
}

static ncclResult_t call_allreduce(struct nccl *c, void *buf, size_t n, ncclDataType_t type, ncclRedOp_t op)
{
    ncclResult_t r = ncclInvalidUsage;
    pthread_mutex_lock(&c->call_mu);
    if (c->comm)
        r = ncclAllReduce(buf, buf, n, type, op, c->comm, c->stream);
    pthread_mutex_unlock(&c->call_mu);
    return r;
}

static ncclResult_t call_broadcast(struct nccl *c, void *buf, size_t bytes, int root)
{
    ncclResult_t r = ncclInvalidUsage;
    pthread_mutex_lock(&c->call_mu);
    if (c->comm)
        r = ncclBroadcast(buf, buf, bytes, ncclChar, root, c->comm, c->stream);
    pthread_mutex_unlock(&c->call_mu);
    return r;
}

static ncclResult_t call_allgather(struct nccl *c, const void *in, void *out, size_t bytes)
{
    ncclResult_t r = ncclInvalidUsage;
    pthread_mutex_lock(&c->call_mu);
    if (c->comm)
        r = ncclAllGather(in, out, bytes, ncclChar, c->comm, c->stream);
    pthread_mutex_unlock(&c->call_mu);
    return r;
}

static ncclResult_t call_finalize(struct nccl *c)
{
    ncclResult_t r = ncclInvalidUsage;
    pthread_mutex_lock(&c->call_mu);
    if (c->comm)
        r = ncclCommFinalize(c->comm);
    pthread_mutex_unlock(&c->call_mu);
    return r;
}

/* call_mu, waiting at most ABORT_S: for the watchdog, which must not wait on a holder
 * stuck inside NCCL. False when it could not be had. */
static bool lock_bounded(struct nccl *c)
{
    struct timespec until = base_timespec_after(CLOCK_REALTIME, ABORT_S);
    return pthread_mutex_timedlock(&c->call_mu, &until) == 0;
}

/* NCCL's text for the last failure, copied out under the lock (the string is NCCL's);
 * "" when the lock cannot be had. */
static void call_last_error(struct nccl *c, char *out, size_t cap)
{
    *out = '\0';
    if (!lock_bounded(c))
        return;
    const char *last = ncclGetLastError(c->comm); /* NULL: the library's last error */
    snprintf(out, cap, "%s", last ? last : "");
    pthread_mutex_unlock(&c->call_mu);
}

static ddpd_err nccl_fail(struct nccl *c, ncclResult_t r, const char *what)
{
    char last[300], why[400];
    call_last_error(c, last, sizeof last);
    snprintf(why, sizeof why, "%s%s%s", ncclGetErrorString(r), *last ? ": " : "", last);
    return fail_as(c, r == ncclUnhandledCudaError ? DDPD_EDEVICE : DDPD_ECOMM, "nccl: %s: %s", what, why);
}

/* Aborts the communicator once, from whichever thread gets here first, within ABORT_S:
 * ncclCommAbort runs on a helper thread, and if it hangs the caller goes on without it. */
struct abort_call {
    ncclComm_t comm;
    atomic_bool done;
};

static void *abort_thread(void *arg)
{
    struct abort_call *a = arg;
    ncclCommAbort(a->comm);
    atomic_store(&a->done, true);
    return NULL;
}

/* Takes the handle out under call_mu (waiting at most ABORT_S for it when `bounded`: the
 * watchdog's case), then aborts it alone. */
static void abort_bounded(struct nccl *c, bool bounded)
{
    if (bounded) {
        if (!lock_bounded(c))
            return; /* a holder stuck inside NCCL: the worker ends without the abort */
    } else {
        pthread_mutex_lock(&c->call_mu);
    }
    ncclComm_t comm = c->comm;
    c->comm = NULL;
    atomic_store(&c->aborted, true);
    pthread_mutex_unlock(&c->call_mu);
    if (!comm)
        return;
    struct abort_call *a = calloc(1, sizeof *a);
    pthread_t t;
    if (!a)
        return;
    a->comm = comm;
    if (pthread_create(&t, NULL, abort_thread, a) != 0) {
        ncclCommAbort(comm);
        free(a);
        return;
    }
    const double until = base_mono_s() + ABORT_S;
    while (!atomic_load(&a->done) && base_mono_s() < until)
        base_sleep_s(50e-6); /* 50 us: well below a collective's deadline */
    if (atomic_load(&a->done)) {
        pthread_join(t, NULL);
        free(a);
    } else {
        pthread_detach(t); /* still inside NCCL: leak the call, the worker is leaving */
    }
}

/* ---- the works ---- */

static void work_release_locked(struct nccl *c, struct work *w)
{
    if (--w->refs > 0)
        return;
    w->next = c->spare;
    c->spare = w;
}

static void work_release(struct nccl *c, struct work *w)
{
    pthread_mutex_lock(&c->mu);
    work_release_locked(c, w);
    pthread_mutex_unlock(&c->mu);
}

/* A work for the collective `what` about to be queued, with one reference (the caller's
 * until watch() or work_release). */
static ddpd_err work_get(struct nccl *c, const char *what, struct work **out)
{
    pthread_mutex_lock(&c->mu);
    struct work *w = c->spare;
    if (w)
        c->spare = w->next;
    pthread_mutex_unlock(&c->mu);
    if (!w) {
        w = calloc(1, sizeof *w);
        if (!w)
            return fail(c, "nccl: %s: %s", what, "out of memory");
        cudaError_t e = cudaEventCreateWithFlags(&w->started, cudaEventDisableTiming);
        if (e == cudaSuccess &&
            (e = cudaEventCreateWithFlags(&w->done, cudaEventDisableTiming)) != cudaSuccess)
            cudaEventDestroy(w->started);
        if (e != cudaSuccess) {
            free(w);
            return cuda_fail(c, e, what);
        }
        pthread_mutex_lock(&c->mu);
        w->all = c->all;
        c->all = w;
        pthread_mutex_unlock(&c->mu);
    }
    snprintf(w->what, sizeof w->what, "%s", what);
    w->deadline = 0;
    w->refs = 1;
    w->next = NULL;
    *out = w;
    return DDPD_OK;
}

/* Under c->mu: where `w` stands. cudaSuccess when it is done, cudaErrorNotReady while it
 * is queued or running (with *late set past its deadline), else the CUDA error. Its
 * deadline starts when its `started` event is first seen complete. */
static cudaError_t work_state_locked(struct nccl *c, struct work *w, bool *late)
{
    *late = false;
    if (w->deadline == 0) {
        cudaError_t s = cudaEventQuery(w->started);
        if (s != cudaSuccess)
            return s; /* not begun (cudaErrorNotReady), or the device failed */
        w->deadline = base_mono_s() + c->timeout_s;
    }
    cudaError_t q = cudaEventQuery(w->done);
    if (q == cudaErrorNotReady && base_mono_s() > w->deadline)
        *late = true;
    return q;
}

/* ---- the watchdog ---- */

/* Ends the worker: the first failure's text as an `error` event, exit code 3 (4 when it
 * was CUDA's). From this thread, while the caller's may be anywhere: worker_die flushes
 * the event and leaves with _exit (emit.c). */
static _Noreturn void watchdog_fatal(struct nccl *c)
{
    abort_bounded(c, true);
    worker_die(failed_code(c), "rank %d: %s", c->rank, c->err);
}

/* After a failure the caller took (or an abort), the worker is leaving with the caller's
 * error: worker/main.c writes it, aborts and exits. The watchdog stays to make sure it
 * does: a caller still running REAP_S later (a cudaFree waiting for a collective that an
 * abort which hung did not end, say) is ended from here with the failure's exit code
 * (emit_die writes no second `error` event when the caller's is out). */
static void reap(struct nccl *c, double *reap_at)
{
    const double now = base_mono_s();
    if (*reap_at == 0)
        *reap_at = now + REAP_S;
    if (now >= *reap_at) {
        pthread_mutex_unlock(&c->mu);
        worker_die(failed_code(c),
                   "rank %d: %s (the worker still ran %.0f s after it: ended by the watchdog)", c->rank,
                   c->err, REAP_S);
    }
    struct timespec until = base_timespec_after(CLOCK_REALTIME, *reap_at - now);
    pthread_cond_timedwait(&c->cv, &c->mu, &until);
}

static void *watchdog_main(void *arg)
{
    struct nccl *c = arg;
    double reap_at = 0;
    cudaSetDevice(c->device); /* event queries are per-device */
    pthread_mutex_lock(&c->mu);
    while (!c->stop) {
        if (atomic_load(&c->aborted) || atomic_load(&c->failed)) {
            reap(c, &reap_at);
            continue;
        }
        struct work *w = c->head;
        if (w) {
            bool late;
            cudaError_t q = work_state_locked(c, w, &late);
            if (q == cudaSuccess) {
                c->head = w->next;
                if (!c->head)
                    c->tail = NULL;
                work_release_locked(c, w);
                continue;
            }
            if (q != cudaErrorNotReady || late) {
                char what[128];
                snprintf(what, sizeof what, "%s", w->what);
                pthread_mutex_unlock(&c->mu);
                if (watchdog_claims(c)) {
                    if (q != cudaErrorNotReady)
                        cuda_fail(c, q, what);
                    else {
                        char why[96];
                        snprintf(why, sizeof why,
                                 "not done within %.0f s of its start (a rank is gone or stuck)",
                                 c->timeout_s);
                        fail(c, "nccl: %s %s", what, why);
                    }
                    watchdog_fatal(c);
                }
                pthread_mutex_lock(&c->mu); /* the caller has failed and reports it */
                continue;
            }
        }
        /* Only when the communicator is free: the caller is inside an NCCL call otherwise,
         * and the poll comes again in a moment. (Under c->mu: call_mu is only tried here.) */
        ncclResult_t async = ncclSuccess;
        if (pthread_mutex_trylock(&c->call_mu) == 0) {
            if (c->comm && ncclCommGetAsyncError(c->comm, &async) != ncclSuccess)
                async = ncclSuccess;
            pthread_mutex_unlock(&c->call_mu);
        }
        if (async != ncclSuccess && async != ncclInProgress) {
            pthread_mutex_unlock(&c->mu);
            if (watchdog_claims(c)) {
                nccl_fail(c, async, "asynchronous error");
                watchdog_fatal(c);
            }
            pthread_mutex_lock(&c->mu);
            continue;
        }
        /* A new collective wakes it (watch signals); otherwise it looks again soon. */
        struct timespec until =
            base_timespec_after(CLOCK_REALTIME, (w ? WATCH_BUSY_MS : WATCH_IDLE_MS) / 1000.0);
        pthread_cond_timedwait(&c->cv, &c->mu, &until);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* ---- enqueueing ---- */

/* NCCL with blocking = 0 may answer ncclInProgress; then the call completes in the
 * background and the communicator's state says when. Waits for it up to the deadline. */
static ddpd_err settle(struct nccl *c, ncclResult_t r, const char *what)
{
    const double until = base_mono_s() + c->timeout_s;
    while (r == ncclInProgress) {
        if (base_mono_s() > until) {
            fail(c, "nccl: %s: %s", what, "still in progress at the deadline");
            abort_bounded(c, false);
            return failed_code(c);
        }
        base_sleep_s(50e-6); /* 50 us: well below a collective's deadline */
        if (call_async_error(c, &r) != ncclSuccess)
            break;
    }
    return r == ncclSuccess ? DDPD_OK : nccl_fail(c, r, what);
}

/* The comm stream waits for everything queued on the compute stream so far, then marks
 * where the collective of `w` can begin (its deadline starts there). */
static ddpd_err after_compute(struct nccl *c, struct work *w)
{
    cudaError_t e = cudaEventRecord(c->produced, c->compute);
    if (e == cudaSuccess)
        e = cudaStreamWaitEvent(c->stream, c->produced, 0);
    if (e == cudaSuccess)
        e = cudaEventRecord(w->started, c->stream);
    return e == cudaSuccess ? DDPD_OK : cuda_fail(c, e, w->what);
}

/* Hands the collective of `w`, just queued on the comm stream, to the watchdog. The
 * caller's reference stays the caller's (nc_wait or finish lets it go); the watchdog takes
 * its own. On failure `w` is released. */
static ddpd_err watch(struct nccl *c, struct work *w)
{
    cudaError_t e = cudaEventRecord(w->done, c->stream);
    if (e != cudaSuccess) {
        work_release(c, w);
        return cuda_fail(c, e, w->what);
    }
    pthread_mutex_lock(&c->mu);
    w->refs++;
    if (c->tail)
        c->tail->next = w;
    else
        c->head = w;
    c->tail = w;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
    return DDPD_OK;
}

static ddpd_err ready(struct nccl *c, const char *what)
{
    if (atomic_load(&c->failed))
        return failed_code(c);
    if (!c->compute)
        return fail(c, "nccl: %s: %s", what, "no CUDA device bound (comm_bind_dev)");
    return DDPD_OK;
}

/* After `w` is done: whether its result can be trusted. NCCL's kernels end early once the
 * communicator is aborted (the watchdog's abort for a lost peer, say), leaving whatever
 * the buffers held, so a collective done after a failure, an abort or an asynchronous
 * error has no result: the failure is the answer, never the bytes. */
static ddpd_err trusted(struct nccl *c)
{
    if (atomic_load(&c->failed) || atomic_load(&c->aborted))
        return failed_code(c);
    ncclResult_t async = ncclSuccess;
    if (call_async_error(c, &async) != ncclSuccess)
        return fail(c, "nccl: %s: %s", "a collective",
                    "its communicator was aborted before its result was read");
    if (async != ncclSuccess && async != ncclInProgress)
        return nccl_fail(c, async, "asynchronous error");
    return DDPD_OK;
}

/* Blocks the host until `w` is done, within its deadline (the blocking collectives), and
 * lets the caller's reference go. */
static ddpd_err finish(struct nccl *c, struct work *w)
{
    ddpd_err rc = DDPD_OK;
    for (;;) {
        bool late;
        pthread_mutex_lock(&c->mu);
        cudaError_t q = work_state_locked(c, w, &late);
        pthread_mutex_unlock(&c->mu);
        if (q == cudaSuccess) {
            rc = trusted(c);
            break;
        }
        if (q != cudaErrorNotReady) {
            rc = cuda_fail(c, q, w->what);
            break;
        }
        if (atomic_load(&c->failed) || late) {
            rc = fail(c, "nccl: %s %s", w->what, "not done by its deadline");
            break;
        }
        base_sleep_s(50e-6); /* 50 us: well below a collective's deadline */
    }
    work_release(c, w);
    return rc;
}

/* ---- the table ---- */

static ddpd_err nc_init_rank(const struct comm_id *id, int rank, int world, double timeout_s, void **ctx,
                             char *errbuf, size_t errcap)
{
    struct nccl *c = calloc(1, sizeof *c);
    if (!c) {
        snprintf(errbuf, errcap, "out of memory");
        return DDPD_ENOMEM;
    }
    c->rank = rank;
    c->world = world;
    c->timeout_s = timeout_s > 0 ? timeout_s : 300;
    pthread_mutex_init(&c->call_mu, NULL);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    ddpd_err rc = DDPD_ECOMM;
    cudaError_t e = cudaGetDevice(&c->device);
    if (e == cudaSuccess)
        e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    if (e == cudaSuccess)
        e = cudaEventCreateWithFlags(&c->produced, cudaEventDisableTiming);
    if (e != cudaSuccess) {
        cuda_fail(c, e, "opening the comm stream");
        goto out;
    }
    ncclUniqueId uid;
    memcpy(&uid, id->bytes, sizeof uid);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0; /* so that a missing rank cannot hang us: poll with a deadline */
    /* No other thread yet: the handle is written without call_mu. */
    ncclResult_t r = ncclCommInitRankConfig(&c->comm, world, uid, rank, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
        nccl_fail(c, r, "ncclCommInitRankConfig");
        goto out;
    }
    if (settle(c, r, "joining the group (ncclCommInitRankConfig)"))
        goto out;
    if (pthread_create(&c->watchdog, NULL, watchdog_main, c) != 0) {
        fail(c, "nccl: %s: %s", "starting the watchdog", "pthread_create failed");
        goto out;
    }
    c->watching = true;
    rc = DDPD_OK;
out:
    if (rc != DDPD_OK) {
        rc = failed_code(c);
        snprintf(errbuf, errcap, "%s", c->err);
        abort_bounded(c, false);
        if (c->produced)
            cudaEventDestroy(c->produced);
        if (c->stream)
            cudaStreamDestroy(c->stream);
        pthread_mutex_destroy(&c->call_mu);
        pthread_mutex_destroy(&c->mu);
        pthread_cond_destroy(&c->cv);
        free(c);
        return rc;
    }
    *ctx = c;
    return DDPD_OK;
}

static ddpd_err nc_bind_dev(void *ctx, struct dev dev, char *errbuf, size_t errcap)
{
    struct nccl *c = ctx;
    c->compute = cuda__dev_stream(dev);
    if (!c->compute) {
        snprintf(errbuf, errcap, "nccl takes CUDA tensors, not %s ones (use ddp.backend \"cpu\")",
                 dev.ops->name);
        return DDPD_ESPEC;
    }
    if (cuda__dev_device(dev) != c->device) {
        snprintf(errbuf, errcap, "nccl joined on GPU %d but the tensors are on GPU %d", c->device,
                 cuda__dev_device(dev));
        return DDPD_EINTERNAL;
    }
    return DDPD_OK;
}

/* The start of a collective on tensors: a work, the wait for the compute stream, and the
 * NCCL call `r` made by the caller between the two halves (queue_begin, queue_end). */
static ddpd_err queue_begin(struct nccl *c, const char *what, struct work **w)
{
    *w = NULL;
    ddpd_err rc = ready(c, what);
    if (!rc)
        rc = work_get(c, what, w);
    if (!rc && (rc = after_compute(c, *w)) != DDPD_OK) {
        work_release(c, *w);
        *w = NULL;
    }
    return rc;
}

static ddpd_err queue_end(struct nccl *c, struct work *w, ncclResult_t r)
{
    ddpd_err rc = settle(c, r, w->what);
    if (rc) {
        work_release(c, w);
        return rc;
    }
    return watch(c, w);
}

static ddpd_err nc_allreduce_start(void *ctx, float *buf, int64_t n, struct comm_req **req)
{
    struct nccl *c = ctx;
    char what[64];
    snprintf(what, sizeof what, "all-reduce of %lld floats", (long long)n);
    struct work *w;
    ddpd_err rc = queue_begin(c, what, &w);
    if (!rc)
        rc = queue_end(c, w, call_allreduce(c, buf, (size_t)n, ncclFloat, ncclSum));
    if (!rc)
        *req = (struct comm_req *)w;
    return handoff(c, rc);
}

/* The optimizer (and anything later on the compute stream) waits for the sum; the host
 * does not. A failure the watchdog has seen is reported here. */
static ddpd_err nc_wait(void *ctx, struct comm_req *req)
{
    struct nccl *c = ctx;
    struct work *w = (struct work *)req;
    cudaError_t e = cudaStreamWaitEvent(c->compute, w->done, 0);
    work_release(c, w);
    if (e != cudaSuccess)
        return handoff(c, cuda_fail(c, e, "waiting for an all-reduce"));
    return handoff(c, atomic_load(&c->failed) ? failed_code(c) : DDPD_OK);
}

static ddpd_err nc_broadcast(void *ctx, void *buf, size_t bytes, int root)
{
    struct nccl *c = ctx;
    char what[64];
    snprintf(what, sizeof what, "broadcast of %zu bytes from rank %d", bytes, root);
    struct work *w;
    ddpd_err rc = queue_begin(c, what, &w);
    if (!rc)
        rc = queue_end(c, w, call_broadcast(c, buf, bytes, root));
    if (!rc)
        rc = finish(c, w);
    return handoff(c, rc);
}

/* Device and pinned host staging of at least `bytes` for host-memory collectives. The
 * buffers it outgrows are kept until nc_free: freeing them here would wait for the whole
 * device (cudaFree and cudaFreeHost do), a comm stream stalled on a lost peer included,
 * with no deadline. */
static ddpd_err stage(struct nccl *c, size_t bytes)
{
    if (bytes <= c->stage_cap)
        return DDPD_OK;
    size_t cap = c->stage_cap ? c->stage_cap : STAGE_MIN;
    while (cap < bytes)
        cap = cap > SIZE_MAX / 2 ? bytes : cap * 2;
    void *dbuf = NULL, *hbuf = NULL;
    cudaError_t e = cudaMalloc(&dbuf, cap);
    if (e == cudaSuccess && (e = cudaHostAlloc(&hbuf, cap, cudaHostAllocDefault)) != cudaSuccess)
        cudaFree(dbuf); /* nothing queued uses it yet */
    if (e != cudaSuccess)
        return cuda_fail(c, e, "staging a host collective");
    if (c->dbuf) {
        struct retired *r = malloc(sizeof *r);
        if (!r) {
            cudaFree(dbuf);
            cudaFreeHost(hbuf);
            return fail(c, "nccl: %s: %s", "staging a host collective", "out of memory");
        }
        *r = (struct retired){c->dbuf, c->hbuf, c->retired};
        c->retired = r;
    }
    c->dbuf = dbuf;
    c->hbuf = hbuf;
    c->stage_cap = cap;
    return DDPD_OK;
}

/* A host-memory collective: `in_bytes` from `in` go to the device staging at offset
 * `in_at`, `run` queues the collective on the comm stream, and `out_bytes` from the
 * start of the staging come back into `out`, all within the deadline. It is ordered after
 * the comm stream's earlier collectives, not after the compute stream (host memory). */
static ddpd_err host_collective(struct nccl *c, const char *what, const void *in, size_t in_bytes,
                                size_t in_at, void *out, size_t out_bytes,
                                ncclResult_t (*run)(struct nccl *c, void *arg), void *arg)
{
    ddpd_err rc = ready(c, what);
    if (!rc)
        rc = stage(c, in_at + in_bytes > out_bytes ? in_at + in_bytes : out_bytes);
    struct work *w = NULL;
    if (!rc)
        rc = work_get(c, what, &w);
    if (rc)
        return rc;
    memcpy((char *)c->hbuf + in_at, in, in_bytes);
    cudaError_t e = cudaEventRecord(w->started, c->stream);
    if (e == cudaSuccess)
        e = cudaMemcpyAsync((char *)c->dbuf + in_at, (char *)c->hbuf + in_at, in_bytes,
                            cudaMemcpyHostToDevice, c->stream);
    if (e != cudaSuccess) {
        work_release(c, w);
        return cuda_fail(c, e, what);
    }
    rc = settle(c, run(c, arg), what);
    if (!rc &&
        (e = cudaMemcpyAsync(c->hbuf, c->dbuf, out_bytes, cudaMemcpyDeviceToHost, c->stream)) != cudaSuccess)
        rc = cuda_fail(c, e, what);
    if (rc) {
        work_release(c, w);
        return rc;
    }
    rc = watch(c, w);
    if (!rc)
        rc = finish(c, w);
    if (!rc)
        memcpy(out, c->hbuf, out_bytes);
    return rc;
}

struct gather_arg {
    size_t bytes, at;
};

static ncclResult_t run_allgather(struct nccl *c, void *arg)
{
    const struct gather_arg *g = arg;
    return call_allgather(c, (char *)c->dbuf + g->at, c->dbuf, g->bytes);
}

static ddpd_err nc_allgather(void *ctx, const void *in, size_t bytes, void *out)
{
    struct nccl *c = ctx;
    /* In place: rank r's contribution sits where the gathered array keeps it. */
    struct gather_arg g = {bytes, (size_t)c->rank * bytes};
    return handoff(c, host_collective(c, "all-gather", in, bytes, g.at, out, bytes * (size_t)c->world,
                                      run_allgather, &g));
}

static ncclResult_t run_max(struct nccl *c, void *arg)
{
    const size_t n = *(const size_t *)arg;
    return call_allreduce(c, c->dbuf, n, ncclInt64, ncclMax);
}

static ddpd_err nc_allreduce_max_i64(void *ctx, int64_t *v, int n)
{
    struct nccl *c = ctx;
    size_t count = n > 0 ? (size_t)n : 0;
    if (!count)
        return DDPD_OK;
    return handoff(c, host_collective(c, "max all-reduce", v, count * sizeof *v, 0, v, count * sizeof *v,
                                      run_max, &count));
}

/* From any thread (comm.h): safe beside the watchdog, which finds the handle gone. */
static void nc_abort(void *ctx)
{
    struct nccl *c = ctx;
    atomic_store(&c->failed, true); /* first: a call racing this one fails fast */
    handoff(c, DDPD_ECOMM);         /* the caller reports why it aborts, unless the watchdog does */
    abort_bounded(c, false);
}

static const char *nc_last_error(void *ctx)
{
    struct nccl *c = ctx;
    return atomic_load(&c->failed) ? c->err : "";
}

/* Waits until the comm stream has run everything queued on it, at most until `until`
 * (base_mono_s); while `watch_async`, a peer's loss seen by NCCL ends the wait too, as the
 * watchdog would (it has stopped by then). DDPD_OK when the stream is idle. */
static ddpd_err stream_idle(struct nccl *c, const char *what, double until, bool watch_async)
{
    for (;;) {
        cudaError_t q = cudaStreamQuery(c->stream);
        if (q == cudaSuccess)
            return DDPD_OK;
        if (q != cudaErrorNotReady)
            return cuda_fail(c, q, what);
        ncclResult_t async = ncclSuccess;
        if (watch_async && call_async_error(c, &async) == ncclSuccess && async != ncclSuccess &&
            async != ncclInProgress)
            return nccl_fail(c, async, what);
        if (base_mono_s() > until)
            return fail(c, "nccl: %s: %s", what, "not done by the deadline");
        base_sleep_s(WATCH_BUSY_MS / 1000.0);
    }
}

static void free_works(struct work *w)
{
    while (w) {
        struct work *next = w->all;
        cudaEventDestroy(w->started);
        cudaEventDestroy(w->done);
        free(w);
        w = next;
    }
}

/* Every wait here has a deadline: a clean end drains the comm stream within timeout_s
 * (watching for a lost peer, since comm_wait leaves the last collective to the streams and
 * NCCL's kernel then waits until an abort), finalizes and destroys; any failure aborts,
 * then waits at most ABORT_S for the stream. Only an idle stream's buffers are freed
 * (cudaFree waits for the whole device); a stream still stalled after the abort keeps
 * them, and the worker leaves without. Every work goes, waited for by its caller or not. */
static void nc_free(void *ctx)
{
    struct nccl *c = ctx;
    if (!c)
        return;
    if (c->watching) {
        pthread_mutex_lock(&c->mu);
        c->stop = true;
        pthread_cond_signal(&c->cv);
        pthread_mutex_unlock(&c->mu);
        pthread_join(c->watchdog, NULL);
    }
    bool idle = false;
    if (!atomic_load(&c->failed) && !atomic_load(&c->aborted)) {
        /* A clean end: flush what was issued, then release. Both may be in progress. */
        const char *what = "draining the comm stream";
        if (stream_idle(c, what, base_mono_s() + c->timeout_s, true) == DDPD_OK &&
            settle(c, call_finalize(c), "ncclCommFinalize") == DDPD_OK) {
            idle = true;
            pthread_mutex_lock(&c->call_mu);
            ncclCommDestroy(c->comm);
            c->comm = NULL;
            pthread_mutex_unlock(&c->call_mu);
        }
    }
    if (!idle) {
        abort_bounded(c, false); /* never ncclCommDestroy after a failure */
        idle = stream_idle(c, "the comm stream after the abort", base_mono_s() + ABORT_S, false) == DDPD_OK;
    }
    free_works(c->all);
    if (idle) {
        cudaFree(c->dbuf);
        cudaFreeHost(c->hbuf);
        for (struct retired *r = c->retired; r; r = r->next) {
            cudaFree(r->dbuf);
            cudaFreeHost(r->hbuf);
        }
        cudaEventDestroy(c->produced);
        cudaStreamDestroy(c->stream);
    }
    while (c->retired) {
        struct retired *next = c->retired->next;
        free(c->retired);
        c->retired = next;
    }
    pthread_mutex_destroy(&c->call_mu);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c);
}

const struct comm_ops cuda__nccl_ops = {
    .name = "nccl",
    .init_rank = nc_init_rank,
    .allreduce_start = nc_allreduce_start,
    .wait = nc_wait,
    .broadcast = nc_broadcast,
    .allgather = nc_allgather,
    .allreduce_max_i64 = nc_allreduce_max_i64,
    .barrier = NULL, /* comm.c's default: a max over one value */
    .abort = nc_abort,
    .last_error = nc_last_error,
    .free = nc_free,
    .bind_dev = nc_bind_dev,
};

/* `--issue-id nccl`'s id (cuda/nccl_forward.c prints it and keeps this process alive). */
int cuda__nccl_unique_id(struct comm_id *id, char *errbuf, size_t errcap)
{
    ncclUniqueId uid;
    ncclResult_t r = ncclGetUniqueId(&uid);
    if (r != ncclSuccess) {
        snprintf(errbuf, errcap, "%s", ncclGetErrorString(r));
        return -1;
    }
    memcpy(id->bytes, &uid, sizeof uid);
    return 0;
}
