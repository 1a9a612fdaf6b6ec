/* cuda/nccl.c — the NCCL collective backend for CUDA tensors. Collectives run on a comm
 * stream of their own: each waits for an event recorded on the compute stream (the
 * gradients are produced), and the compute stream waits for an event recorded after it
 * (the optimizer reads the sums), so the host never blocks on an all-reduce. A watchdog
 * thread checks every outstanding collective against its deadline and polls
 * ncclCommGetAsyncError; either failure aborts the communicator (never destroys it) and
 * ends the worker with the comm exit code. Only the module side of worker/cuda speaks CUDA
 * (this file, module.c and the .cu files); it is built into libddpd-cuda.so, which
 * cuda/nccl_forward.c forwards to. */
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

#define ABORT_S       10.0 /* ncclCommAbort is bounded too: after this the worker just exits */
#define WATCH_IDLE_MS 100  /* the watchdog's async-error poll when nothing is outstanding */
#define WATCH_BUSY_MS 2    /* and while collectives are: deadlines are seconds, so no spinning */

/* One collective the watchdog watches; shared with its request until both let go. */
struct work {
    cudaEvent_t done; /* recorded on the comm stream after the collective */
    double deadline;
    char what[64];
    int refs;
    struct work *next; /* the watchdog's FIFO, or the free list */
};

struct nccl {
    ncclComm_t comm;
    int rank, world, device;
    double timeout_s;
    cudaStream_t stream;  /* the comm stream */
    cudaStream_t compute; /* the compute backend's stream, from bind_dev */
    cudaEvent_t produced; /* recorded on the compute stream before each collective */
    /* Staging for host-memory collectives (allgather, max): device and pinned host. */
    void *dbuf, *hbuf;
    size_t stage_cap;

    pthread_t watchdog;
    bool watching;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct work *head, *tail, *spare;
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

/* What a table function returns: `rc`, unless the watchdog is ending the worker with the
 * failure, when the caller waits here for the exit (bounded by ABORT_S) instead. */
static ddpd_err handoff(struct nccl *c, ddpd_err rc)
{
    int none = REPORTER_NONE;
    if (rc == DDPD_OK || atomic_compare_exchange_strong(&c->reporter, &none, REPORTER_CALLER) ||
        none == REPORTER_CALLER)
        return rc;
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

static ddpd_err nccl_fail(struct nccl *c, ncclResult_t r, const char *what)
{
    const char *last = ncclGetLastError(c->comm);
    char why[400];
    snprintf(why, sizeof why, "%s%s%s", ncclGetErrorString(r), last && *last ? ": " : "", last ? last : "");
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

static void abort_bounded(struct nccl *c)
{
    if (!c->comm || atomic_exchange(&c->aborted, true))
        return;
    struct abort_call *a = calloc(1, sizeof *a);
    pthread_t t;
    if (!a)
        return;
    a->comm = c->comm;
    if (pthread_create(&t, NULL, abort_thread, a) != 0) {
        ncclCommAbort(c->comm);
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

/* ---- the watchdog ---- */

static void work_release_locked(struct nccl *c, struct work *w)
{
    if (--w->refs > 0)
        return;
    w->next = c->spare;
    c->spare = w;
}

/* Ends the worker: the first failure's text as an `error` event, exit code 3 (4 when it
 * was CUDA's). */
static _Noreturn void watchdog_fatal(struct nccl *c)
{
    abort_bounded(c);
    worker_die(failed_code(c), "rank %d: %s", c->rank, c->err);
}

static void *watchdog_main(void *arg)
{
    struct nccl *c = arg;
    cudaSetDevice(c->device); /* event queries are per-device */
    pthread_mutex_lock(&c->mu);
    /* After a failure the main thread saw or an abort, the worker is already leaving with
     * its own error: stop watching rather than report a second one. */
    while (!c->stop && !atomic_load(&c->aborted) && !atomic_load(&c->failed)) {
        struct work *w = c->head;
        if (w) {
            cudaError_t q = cudaEventQuery(w->done);
            if (q == cudaSuccess) {
                c->head = w->next;
                if (!c->head)
                    c->tail = NULL;
                work_release_locked(c, w);
                continue;
            }
            if (q != cudaErrorNotReady || base_mono_s() > w->deadline) {
                char what[128];
                snprintf(what, sizeof what, "%s", w->what);
                pthread_mutex_unlock(&c->mu);
                if (!watchdog_claims(c))
                    return NULL; /* the caller has failed and reports it */
                if (q != cudaErrorNotReady)
                    cuda_fail(c, q, what);
                else {
                    char why[64];
                    snprintf(why, sizeof why, "not done within %.0f s (a rank is gone or stuck)",
                             c->timeout_s);
                    fail(c, "nccl: %s %s", what, why);
                }
                watchdog_fatal(c);
            }
        }
        ncclResult_t async = ncclSuccess;
        if (ncclCommGetAsyncError(c->comm, &async) == ncclSuccess && async != ncclSuccess &&
            async != ncclInProgress) {
            pthread_mutex_unlock(&c->mu);
            if (!watchdog_claims(c))
                return NULL;
            nccl_fail(c, async, "asynchronous error");
            watchdog_fatal(c);
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
            abort_bounded(c);
            return failed_code(c);
        }
        base_sleep_s(50e-6); /* 50 us: well below a collective's deadline */
        if (ncclCommGetAsyncError(c->comm, &r) != ncclSuccess)
            break;
    }
    return r == ncclSuccess ? DDPD_OK : nccl_fail(c, r, what);
}

/* The comm stream waits for everything queued on the compute stream so far. */
static ddpd_err after_compute(struct nccl *c, const char *what)
{
    cudaError_t e = cudaEventRecord(c->produced, c->compute);
    if (e == cudaSuccess)
        e = cudaStreamWaitEvent(c->stream, c->produced, 0);
    return e == cudaSuccess ? DDPD_OK : cuda_fail(c, e, what);
}

/* Hands the collective just queued on the comm stream to the watchdog. The work comes
 * back with a second reference for the caller when `keep` is set. */
static ddpd_err watch(struct nccl *c, const char *what, bool keep, struct work **out)
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
        cudaError_t e = cudaEventCreateWithFlags(&w->done, cudaEventDisableTiming);
        if (e != cudaSuccess) {
            free(w);
            return cuda_fail(c, e, what);
        }
    }
    cudaError_t e = cudaEventRecord(w->done, c->stream);
    if (e != cudaSuccess) {
        pthread_mutex_lock(&c->mu);
        w->refs = 1;
        work_release_locked(c, w);
        pthread_mutex_unlock(&c->mu);
        return cuda_fail(c, e, what);
    }
    snprintf(w->what, sizeof w->what, "%s", what);
    w->deadline = base_mono_s() + c->timeout_s;
    w->refs = keep ? 2 : 1;
    w->next = NULL;
    pthread_mutex_lock(&c->mu);
    if (c->tail)
        c->tail->next = w;
    else
        c->head = w;
    c->tail = w;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (out)
        *out = w;
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

/* Blocks the host until `w` is done, within its deadline (the blocking collectives). */
static ddpd_err finish(struct nccl *c, struct work *w)
{
    ddpd_err rc = DDPD_OK;
    for (;;) {
        cudaError_t q = cudaEventQuery(w->done);
        if (q == cudaSuccess)
            break;
        if (q != cudaErrorNotReady) {
            rc = cuda_fail(c, q, w->what);
            break;
        }
        if (atomic_load(&c->failed) || base_mono_s() > w->deadline) {
            rc = fail(c, "nccl: %s %s", w->what, "not done by its deadline");
            break;
        }
        base_sleep_s(50e-6); /* 50 us: well below a collective's deadline */
    }
    pthread_mutex_lock(&c->mu);
    work_release_locked(c, w);
    pthread_mutex_unlock(&c->mu);
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
        abort_bounded(c);
        atomic_store(&c->aborted, true); /* nothing left for free() to abort */
        c->comm = NULL;
        if (c->produced)
            cudaEventDestroy(c->produced);
        if (c->stream)
            cudaStreamDestroy(c->stream);
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

static ddpd_err nc_allreduce_start(void *ctx, float *buf, int64_t n, struct comm_req **req)
{
    struct nccl *c = ctx;
    char what[64];
    snprintf(what, sizeof what, "all-reduce of %lld floats", (long long)n);
    ddpd_err rc = ready(c, what);
    if (!rc)
        rc = after_compute(c, what);
    if (!rc)
        rc = settle(c, ncclAllReduce(buf, buf, (size_t)n, ncclFloat, ncclSum, c->comm, c->stream), what);
    struct work *w = NULL;
    if (!rc)
        rc = watch(c, what, true, &w);
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
    pthread_mutex_lock(&c->mu);
    work_release_locked(c, w);
    pthread_mutex_unlock(&c->mu);
    if (e != cudaSuccess)
        return handoff(c, cuda_fail(c, e, "waiting for an all-reduce"));
    return handoff(c, atomic_load(&c->failed) ? failed_code(c) : DDPD_OK);
}

static ddpd_err nc_broadcast(void *ctx, void *buf, size_t bytes, int root)
{
    struct nccl *c = ctx;
    char what[64];
    snprintf(what, sizeof what, "broadcast of %zu bytes from rank %d", bytes, root);
    ddpd_err rc = ready(c, what);
    if (!rc)
        rc = after_compute(c, what);
    if (!rc)
        rc = settle(c, ncclBroadcast(buf, buf, bytes, ncclChar, root, c->comm, c->stream), what);
    struct work *w = NULL;
    if (!rc)
        rc = watch(c, what, true, &w);
    if (!rc)
        rc = finish(c, w);
    return handoff(c, rc);
}

/* Device and pinned host staging of at least `bytes` for host-memory collectives. */
static ddpd_err stage(struct nccl *c, size_t bytes)
{
    if (bytes <= c->stage_cap)
        return DDPD_OK;
    cudaStreamSynchronize(c->stream);
    cudaFree(c->dbuf);
    cudaFreeHost(c->hbuf);
    c->dbuf = c->hbuf = NULL;
    c->stage_cap = 0;
    cudaError_t e = cudaMalloc(&c->dbuf, bytes);
    if (e == cudaSuccess)
        e = cudaHostAlloc(&c->hbuf, bytes, cudaHostAllocDefault);
    if (e != cudaSuccess)
        return cuda_fail(c, e, "staging a host collective");
    c->stage_cap = bytes;
    return DDPD_OK;
}

/* A host-memory collective: `in_bytes` from `in` go to the device staging at offset
 * `in_at`, `run` queues the collective on the comm stream, and `out_bytes` from the
 * start of the staging come back into `out`, all within the deadline. */
static ddpd_err host_collective(struct nccl *c, const char *what, const void *in, size_t in_bytes,
                                size_t in_at, void *out, size_t out_bytes,
                                ncclResult_t (*run)(struct nccl *c, void *arg), void *arg)
{
    ddpd_err rc = ready(c, what);
    if (!rc)
        rc = stage(c, in_at + in_bytes > out_bytes ? in_at + in_bytes : out_bytes);
    if (rc)
        return rc;
    memcpy((char *)c->hbuf + in_at, in, in_bytes);
    cudaError_t e = cudaMemcpyAsync((char *)c->dbuf + in_at, (char *)c->hbuf + in_at, in_bytes,
                                    cudaMemcpyHostToDevice, c->stream);
    if (e != cudaSuccess)
        return cuda_fail(c, e, what);
    rc = settle(c, run(c, arg), what);
    if (!rc &&
        (e = cudaMemcpyAsync(c->hbuf, c->dbuf, out_bytes, cudaMemcpyDeviceToHost, c->stream)) != cudaSuccess)
        rc = cuda_fail(c, e, what);
    struct work *w = NULL;
    if (!rc)
        rc = watch(c, what, true, &w);
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
    return ncclAllGather((char *)c->dbuf + g->at, c->dbuf, g->bytes, ncclChar, c->comm, c->stream);
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
    return ncclAllReduce(c->dbuf, c->dbuf, n, ncclInt64, ncclMax, c->comm, c->stream);
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

static void nc_abort(void *ctx)
{
    struct nccl *c = ctx;
    handoff(c, DDPD_ECOMM); /* the caller reports why it aborts, unless the watchdog does */
    atomic_store(&c->failed, true);
    abort_bounded(c);
}

static const char *nc_last_error(void *ctx)
{
    struct nccl *c = ctx;
    return atomic_load(&c->failed) ? c->err : "";
}

static void free_works(struct work *w)
{
    while (w) {
        struct work *next = w->next;
        cudaEventDestroy(w->done);
        free(w);
        w = next;
    }
}

/* Waits for everything queued on the comm stream, within the deadline, watching the
 * asynchronous error as the watchdog does (it has stopped by now): a peer lost while the
 * last collective is in flight must not hang a clean end, since comm_wait leaves that
 * collective to the streams and NCCL's kernel then waits until an abort. */
static ddpd_err drain(struct nccl *c)
{
    const char *what = "draining the comm stream";
    const double until = base_mono_s() + c->timeout_s;
    for (;;) {
        cudaError_t q = cudaStreamQuery(c->stream);
        if (q == cudaSuccess)
            return DDPD_OK;
        if (q != cudaErrorNotReady)
            return cuda_fail(c, q, what);
        ncclResult_t async = ncclSuccess;
        if (ncclCommGetAsyncError(c->comm, &async) == ncclSuccess && async != ncclSuccess &&
            async != ncclInProgress)
            return nccl_fail(c, async, what);
        if (base_mono_s() > until)
            return fail(c, "nccl: %s: %s", what, "not done by the deadline");
        base_sleep_s(WATCH_BUSY_MS / 1000.0);
    }
}

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
    if (atomic_load(&c->failed)) {
        abort_bounded(c); /* never ncclCommDestroy after a failure */
    } else if (!atomic_load(&c->aborted)) {
        /* A clean end: flush what was issued, then release. Both may be in progress. */
        if (drain(c) == DDPD_OK && settle(c, ncclCommFinalize(c->comm), "ncclCommFinalize") == DDPD_OK)
            ncclCommDestroy(c->comm);
        else
            abort_bounded(c);
    }
    free_works(c->head);
    free_works(c->spare);
    cudaFree(c->dbuf);
    cudaFreeHost(c->hbuf);
    cudaEventDestroy(c->produced);
    cudaStreamDestroy(c->stream);
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
