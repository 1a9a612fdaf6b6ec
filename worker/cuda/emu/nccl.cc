/* emu/nccl.cc — NCCL for the emulated device: the ranks, processes of one host, meet in a
 * POSIX shared-memory segment named by the unique id; each collective runs on its stream's
 * thread and moves its data in chunks through one fixed-size slot per rank, waiting on
 * futexes that also watch for aborted or dead peers. Reductions run on every rank in rank
 * order, so all ranks get the same bits. It does not emulate NCCL's transports, topology,
 * rings and trees, several hosts, timing or group fusion.
 * It checks NCCL's rules for its caller, which real NCCL leaves to luck: a call on a
 * communicator while another thread is inside one on it, or after ncclCommAbort or
 * ncclCommDestroy freed it, ends the process with SIGABRT, saying which (see Call below).
 * Test knobs (environment): DDPD_CUDA_EMU_NCCL_BLIND=1, a dead peer is never noticed, as
 * NCCL's shared-memory and P2P transports do not notice one: only the caller's deadline
 * ends the wait; DDPD_CUDA_EMU_NCCL_KILL=R:SEQ:AT, rank R kills itself at its collective
 * SEQ (see kill_point). */
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <type_traits>

#include <cerrno>
#include <climits>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "emu_impl.h"
#include "include/nccl.h"

namespace
{

constexpr int kMaxRanks = 64;
constexpr size_t kSlotBytes = size_t{256} << 10; /* a rank's share of one step */
constexpr long kSliceMs = 20;                    /* a futex wait's slice: abort and peers are looked at */
constexpr double kLivenessS = 0.1;               /* how often a waiting rank reads its peers' /proc */
constexpr double kInitWaitS = 5.0;               /* a segment's initialiser is a few stores away */
constexpr long kHoldUs = 200; /* each call holds its communicator this long at least: Call */
constexpr char kIdMagic[8] = {'d', 'd', 'p', 'd', 'n', 'c', 'c', 'l'};

/* What ncclGetUniqueId puts in the id: the rest of its 128 bytes is zero. */
struct IdBody {
    char magic[8];
    unsigned char random[16];
};
static_assert(sizeof(IdBody) <= sizeof(ncclUniqueId), "the id holds its body");

using A32 = std::atomic<uint32_t>;
using A64 = std::atomic<uint64_t>;
/* The segment's words are shared between processes, and futexes wait on them. */
static_assert(A32::is_always_lock_free && A64::is_always_lock_free && sizeof(A32) == 4, "plain shared words");

enum SegState : uint32_t { SEG_NEW = 0, SEG_INIT, SEG_READY, SEG_CLOSED };
enum RankState : uint32_t { RANK_FREE = 0, RANK_CLAIMED, RANK_JOINED, RANK_LEFT, RANK_ABORTED };
enum Kind : uint32_t { KIND_ALLREDUCE = 1, KIND_BROADCAST, KIND_ALLGATHER, KIND_REDUCESCATTER };

/* One collective as its caller described it: every rank's must be the same. */
struct Desc {
    uint32_t seq, kind, dtype, op;
    int32_t root;
    uint64_t count;
};

struct alignas(128) ShmRank {
    A32 state;       /* RankState */
    A32 ready, done; /* the last step whose slot this rank has filled / has read every slot of */
    A32 pid;         /* with `start`, who holds the rank, against pid reuse */
    A64 start;       /* /proc/PID/stat's starttime */
    A32 device;      /* 1 + the emulated GPU (its number among DDPD_CUDA_EMU's) it joined on */
    Desc desc;       /* the collective of step `ready`; written before `ready` */
};

/* The segment: zero-filled by ftruncate, so every word starts at 0. */
struct ShmSeg {
    A32 state;  /* SegState: initialised once, closed (unlinked) when all have joined or left */
    A32 bell;   /* bumped after every change below; waiters sleep on it */
    A32 nranks; /* set by the initialiser */
    A32 joined; /* ranks that have ever joined: only grows */
    ShmRank rank[kMaxRanks];
    alignas(4096) unsigned char slot[kMaxRanks][kSlotBytes];
};

double now_s()
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Sleeps while *w == seen, at most one slice. Non-private: the word is in a shared mapping. */
void futex_wait(A32 *w, uint32_t seen)
{
    struct timespec slice = {0, kSliceMs * 1000000L};
    syscall(SYS_futex, reinterpret_cast<uint32_t *>(w), FUTEX_WAIT, seen, &slice, nullptr, 0);
}

void futex_wake(A32 *w)
{
    syscall(SYS_futex, reinterpret_cast<uint32_t *>(w), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

/* After any change to the segment: every waiter, in every process, looks again. */
void ring(ShmSeg *s)
{
    s->bell.fetch_add(1);
    futex_wake(&s->bell);
}

/* Step counters wrap; a rank is never 2^31 steps ahead of another. */
bool reached(uint32_t have, uint32_t want)
{
    return (int32_t)(have - want) >= 0;
}

/* The start time of a live process (not a zombie), 0 when there is none: a zombie's rank
 * is as gone as a reaped one, since the server may not have waited for it yet. */
uint64_t proc_start(uint32_t pid)
{
    char path[48], buf[1024];
    snprintf(path, sizeof path, "/proc/%u/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    /* The command name may hold anything: the fields start after its last ')'. */
    char *p = strrchr(buf, ')');
    if (!p || p[1] != ' ' || p[2] == 'Z' || p[2] == 'X' || p[2] == 'x')
        return 0;
    p += 2; /* field 3, the state; starttime is field 22 */
    for (int field = 3; field < 22; field++) {
        p = strchr(p, ' ');
        if (!p)
            return 0;
        p++;
    }
    return strtoull(p, nullptr, 10) + 1; /* + 1: never 0 for a live process */
}

bool rank_alive(const ShmRank &r)
{
    return proc_start(r.pid.load()) == r.start.load();
}

size_t dtype_size(uint32_t t)
{
    static const size_t size[ncclNumTypes] = {1, 1, 4, 4, 8, 8, 2, 4, 8};
    return t < ncclNumTypes ? size[t] : 0;
}

const char *dtype_name(uint32_t t)
{
    static const char *const name[ncclNumTypes] = {"int8",   "uint8",   "int32", "uint32", "int64",
                                                   "uint64", "float16", "float", "double"};
    return t < ncclNumTypes ? name[t] : "?";
}

const char *op_name(uint32_t op)
{
    static const char *const name[ncclNumOps] = {"sum", "prod", "max", "min", "avg"};
    return op < ncclNumOps ? name[op] : "?";
}

/* "ncclAllReduce #3 of 10 x float (sum)": how errors name a collective. */
void desc_text(const Desc &d, char *out, size_t cap)
{
    static const char *const call[] = {"?", "ncclAllReduce", "ncclBroadcast", "ncclAllGather",
                                       "ncclReduceScatter"};
    int n = snprintf(out, cap, "%s #%u of %llu x %s", call[d.kind <= 4 ? d.kind : 0], d.seq,
                     (unsigned long long)d.count, dtype_name(d.dtype));
    if (n < 0 || (size_t)n >= cap)
        return;
    if (d.kind == KIND_ALLREDUCE || d.kind == KIND_REDUCESCATTER)
        snprintf(out + n, cap - (size_t)n, " (%s)", op_name(d.op));
    else if (d.kind == KIND_BROADCAST)
        snprintf(out + n, cap - (size_t)n, " from rank %d", d.root);
}

/* Integers wrap as on a GPU (in the unsigned type: no signed overflow); float max/min
 * keep NCCL's plain comparisons. */
template <class T> T reduce_one(uint32_t op, T a, T b)
{
    if constexpr (std::is_integral_v<T>) {
        using U = std::make_unsigned_t<T>;
        if (op == ncclProd)
            return (T)(U)((U)a * (U)b);
        if (op == ncclSum || op == ncclAvg)
            return (T)(U)((U)a + (U)b);
    } else {
        if (op == ncclProd)
            return a * b;
        if (op == ncclSum || op == ncclAvg)
            return a + b;
    }
    if (op == ncclMax)
        return a > b ? a : b;
    return a < b ? a : b;
}

/* out[0..n) = slot[0] op slot[1] op ... op slot[W-1], each read at byte `at`: the same
 * order on every rank, hence the same bits. NCCL takes buffers at any address: one that T
 * cannot be loaded from directly is reduced in a bounce buffer. */
template <class T> void reduce_slots(void *out, const ShmSeg *s, int world, size_t at, size_t n, uint32_t op)
{
    constexpr size_t kBounce = 4096 / sizeof(T);
    if ((uintptr_t)out % alignof(T) != 0) {
        T tmp[kBounce];
        for (size_t i = 0; i < n; i += kBounce) {
            size_t m = n - i < kBounce ? n - i : kBounce;
            reduce_slots<T>(tmp, s, world, at + i * sizeof(T), m, op);
            memcpy(static_cast<unsigned char *>(out) + i * sizeof(T), tmp, m * sizeof(T));
        }
        return;
    }
    T *o = static_cast<T *>(out);
    memcpy(o, s->slot[0] + at, n * sizeof(T));
    for (int q = 1; q < world; q++) {
        const T *in = reinterpret_cast<const T *>(s->slot[q] + at);
        for (size_t i = 0; i < n; i++)
            o[i] = reduce_one<T>(op, o[i], in[i]);
    }
    if (op == ncclAvg)
        for (size_t i = 0; i < n; i++)
            o[i] = (T)(o[i] / (T)world);
}

void reduce_any(uint32_t dtype, void *out, const ShmSeg *s, int world, size_t at, size_t n, uint32_t op)
{
    switch (dtype) {
    case ncclInt8: reduce_slots<int8_t>(out, s, world, at, n, op); break;
    case ncclUint8: reduce_slots<uint8_t>(out, s, world, at, n, op); break;
    case ncclInt32: reduce_slots<int32_t>(out, s, world, at, n, op); break;
    case ncclUint32: reduce_slots<uint32_t>(out, s, world, at, n, op); break;
    case ncclInt64: reduce_slots<int64_t>(out, s, world, at, n, op); break;
    case ncclUint64: reduce_slots<uint64_t>(out, s, world, at, n, op); break;
    case ncclFloat32: reduce_slots<float>(out, s, world, at, n, op); break;
    case ncclFloat64: reduce_slots<double>(out, s, world, at, n, op); break;
    default: break; /* float16 reductions are refused when queued */
    }
}

/* The last failure of a call without a communicator (ncclGetLastError(NULL)). */
std::mutex g_mu;
char g_last[512];
/* Aborted and destroyed communicators are never freed: work queued on a stream may still
 * name one (it returns at once), and a caller's later call with one must find it marked
 * freed (Call reports it) rather than reused memory. Reachable from here, so no leak
 * report; a plain list, which exit() does not destroy under a thread still pushing onto it. */
ncclComm *g_graveyard;
thread_local int t_group_depth;

} // namespace

struct ncclComm {
    int rank = 0, world = 0;
    bool blocking = true;
    char name[64] = "";           /* the segment's name */
    ShmSeg *seg = nullptr;        /* mapped until leave(); changed under run_mu and mu */
    std::mutex mu;                /* the texts, `inflight`, `seg` against leave() */
    std::condition_variable idle; /* inflight reached 0 */
    std::mutex run_mu;            /* one collective at a time; leave() waits for it */
    std::atomic<int> error{0};    /* the first asynchronous error, ncclSuccess (0) while none */
    std::atomic<bool> joined{false}, stop{false}, finalizing{false};
    std::atomic<uint32_t> issued{0}; /* collectives queued: their sequence numbers */
    int inflight = 0;                /* queued and not yet released; under mu */
    uint32_t step = 0;               /* steps run; under run_mu */
    double next_live_run = 0, next_live_join = 0;
    char async_text[512] = "", last_text[512] = "";
    ncclComm *next_dead = nullptr; /* g_graveyard's list; under g_mu */
    /* NCCL's rules for the caller (Call): the thread inside a call on it (0: none), that
     * call's name, and the call that freed it (nullptr while it lives). */
    std::atomic<long> holder{0};
    std::atomic<const char *> holder_call{nullptr}, freed_by{nullptr};
};

namespace
{

/* ---- NCCL's rules for its caller, checked ----
 * NCCL's calls are re-entrant but not thread-safe: one thread at a time may call on a
 * communicator, and ncclCommAbort and ncclCommDestroy free it, so that no call may overlap
 * or follow them (NCCL's user guide, "Thread Safety"; ncclCommAbort). Real NCCL does not
 * check: an overlapping call corrupts its state or reads freed memory, and the process
 * crashes, or not, by luck. Every call here that takes a communicator holds a Call for its
 * length: one made while another thread holds one on the same communicator, or on a
 * communicator already freed, is reported and ends the process (SIGABRT). A Call lasts
 * kHoldUs at least, as if NCCL's calls were slow: the window in which a second thread's
 * call is seen is then wide enough to catch a caller without a discipline in a few dozen
 * calls, not by luck. (The stream threads that run the collectives are NCCL's own
 * kernels and proxy, not callers: they take no Call.) */

long thread_id()
{
    thread_local long id = syscall(SYS_gettid);
    return id;
}

[[noreturn]] __attribute__((format(printf, 1, 2))) void misuse(const char *fmt, ...)
{
    char text[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    fprintf(stderr, "ddpd nccl emulator: misuse of NCCL: %s\n", text);
    abort();
}

class Call
{
  public:
    Call(ncclComm *c, const char *name) : c_(c)
    {
        if (!c)
            return;
        const long me = thread_id();
        check_alive(name, me);
        long other = 0;
        if (!c->holder.compare_exchange_strong(other, me)) {
            const char *theirs = c->holder_call.load();
            misuse("%s on thread %ld while thread %ld is inside %s on the same communicator: NCCL is not "
                   "thread-safe (one thread at a time may call on a communicator)",
                   name, me, other, theirs ? theirs : "a call");
        }
        c->holder_call.store(name);
        check_alive(name, me); /* freed between the first look and the claim */
        struct timespec t = {0, kHoldUs * 1000};
        nanosleep(&t, nullptr);
    }
    ~Call()
    {
        if (c_)
            c_->holder.store(0);
    }
    Call(const Call &) = delete;
    Call &operator=(const Call &) = delete;

  private:
    void check_alive(const char *name, long me)
    {
        if (const char *by = c_->freed_by.load())
            misuse("%s on thread %ld with a communicator that %s freed already (a use after free in NCCL)",
                   name, me, by);
    }
    ncclComm *c_;
};

/* The call that frees `c` says so while it still holds its Call: later calls are refused. */
void mark_freed(ncclComm *c, const char *by)
{
    c->freed_by.store(by);
}

/* DDPD_CUDA_EMU_NCCL_BLIND=1: peers' processes are never looked at, so a dead peer is
 * noticed by nobody (NCCL's shared-memory and P2P transports wait on memory a dead peer
 * never writes); one that aborted or left is still seen, from its state in the segment. */
bool blind()
{
    static const bool on = [] {
        const char *v = getenv("DDPD_CUDA_EMU_NCCL_BLIND");
        return v && !strcmp(v, "1");
    }();
    return on;
}

/* DDPD_CUDA_EMU_NCCL_KILL=R:SEQ:AT, a test's way to end a rank at an exact point of its
 * collectives: the process of rank R SIGKILLs itself at its collective number SEQ (1 is
 * the first it issues), AT `issue` (inside the call, before it is queued: the peers wait
 * for it in that collective), `post` (on the stream, once its first chunk is in its slot:
 * the peers have seen it arrive) or `done` (once the collective has completed on this
 * rank: the peers finish it too, then wait for it in the next). With the variable set,
 * every rank names on stderr each collective it issues ("rank 0 issues ncclAllGather #7
 * of 16 x int8") and, as it destroys or aborts its communicator, how many it issued, so
 * that a test can pick SEQ among them. */
enum KillAt { KILL_NONE = 0, KILL_ISSUE, KILL_POST, KILL_DONE };
struct KillPoint {
    bool set = false;
    int rank = -1;
    uint32_t seq = 0;
    KillAt at = KILL_NONE;
};

const KillPoint &kill_point()
{
    static const KillPoint k = [] {
        KillPoint p;
        const char *v = getenv("DDPD_CUDA_EMU_NCCL_KILL");
        if (!v || !*v)
            return p;
        p.set = true;
        char at[16] = "";
        unsigned seq = 0;
        int rank = -1;
        if (sscanf(v, "%d:%u:%15s", &rank, &seq, at) == 3) {
            p.rank = rank;
            p.seq = seq;
            p.at = !strcmp(at, "issue")  ? KILL_ISSUE
                   : !strcmp(at, "post") ? KILL_POST
                   : !strcmp(at, "done") ? KILL_DONE
                                         : KILL_NONE;
        }
        if (p.at == KILL_NONE)
            fprintf(stderr,
                    "ddpd nccl emulator: DDPD_CUDA_EMU_NCCL_KILL='%s' is not RANK:SEQ:issue|post|done\n", v);
        return p;
    }();
    return k;
}

void kill_if(const ncclComm *c, uint32_t seq, KillAt at)
{
    const KillPoint &k = kill_point();
    if (k.at != at || k.rank != c->rank || k.seq != seq)
        return;
    static const char *const name[] = {"", "issue", "post", "done"};
    fprintf(stderr,
            "ddpd nccl emulator: rank %d kills itself at its collective %u (%s), as "
            "DDPD_CUDA_EMU_NCCL_KILL asks\n",
            c->rank, seq, name[at]);
    fflush(stderr);
    kill(getpid(), SIGKILL);
}

/* What a test of DDPD_CUDA_EMU_NCCL_KILL counts on: the collectives this rank issued. */
void say_issued(const ncclComm *c)
{
    if (kill_point().set)
        fprintf(stderr, "ddpd nccl emulator: rank %d issued %u collectives\n", c->rank, c->issued.load());
}

void vnote(ncclComm *c, bool async, ncclResult_t r, const char *fmt, va_list ap)
{
    char text[512];
    vsnprintf(text, sizeof text, fmt, ap);
    bool first = false;
    if (c) {
        if (async && c->error.load() == ncclSuccess) {
            snprintf(c->async_text, sizeof c->async_text, "%s", text);
            c->error.store(r);
            first = true;
        }
        snprintf(c->last_text, sizeof c->last_text, "%s", text);
    }
    {
        std::lock_guard<std::mutex> g(g_mu);
        snprintf(g_last, sizeof g_last, "%s", text);
    }
    if (first || !c)
        fprintf(stderr, "ddpd nccl emulator: %s%s\n", async ? "asynchronous error: " : "", text);
}

/* A failure of the call itself: the call returns r and ncclGetLastError says why. */
__attribute__((format(printf, 3, 4))) ncclResult_t fail(ncclComm *c, ncclResult_t r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (c) {
        std::lock_guard<std::mutex> g(c->mu);
        vnote(c, false, r, fmt, ap);
    } else {
        vnote(nullptr, false, r, fmt, ap);
    }
    va_end(ap);
    return r;
}

/* The communicator's asynchronous error (the first one stays); caller holds c->mu. */
__attribute__((format(printf, 3, 4))) void fail_async_locked(ncclComm *c, ncclResult_t r, const char *fmt,
                                                             ...)
{
    va_list ap;
    va_start(ap, fmt);
    vnote(c, true, r, fmt, ap);
    va_end(ap);
}

/* Why rank q can no longer take part, or nullptr. `live` also reads its /proc entry. */
const char *peer_failure(const ShmRank &p, bool live)
{
    uint32_t st = p.state.load();
    if (st == RANK_ABORTED)
        return "aborted its communicator";
    if (st == RANK_LEFT)
        return "left the group (ncclCommDestroy)";
    if (st == RANK_JOINED && live && !rank_alive(p))
        return "is gone (exited or killed)";
    return nullptr;
}

/* Blocks the stream after an asynchronous error, as NCCL's kernel spins, until the
 * communicator is aborted or destroyed. */
void park(ncclComm *c)
{
    while (!c->stop.load()) {
        uint32_t bell = c->seg->bell.load();
        if (c->stop.load())
            break;
        futex_wait(&c->seg->bell, bell);
    }
}

/* Waits until counter `field` of every rank reaches `want`. False when the communicator
 * stops; a failed peer becomes the asynchronous error, and the wait parks until then. */
bool wait_all(ncclComm *c, A32 ShmRank::*field, uint32_t want, const Desc &d)
{
    ShmSeg *s = c->seg;
    for (;;) {
        uint32_t bell = s->bell.load();
        if (c->stop.load())
            return false;
        if (c->error.load() != ncclSuccess) {
            park(c);
            return false;
        }
        bool all = true, live = false;
        double now = now_s();
        if (!blind() && now >= c->next_live_run) {
            live = true;
            c->next_live_run = now + kLivenessS;
        }
        for (int q = 0; q < c->world; q++) {
            const ShmRank &p = s->rank[q];
            if (reached((p.*field).load(std::memory_order_acquire), want))
                continue;
            all = false;
            const char *why = q == c->rank ? nullptr : peer_failure(p, live);
            /* A peer's counters are written before it leaves: read them again. */
            if (why && !reached((p.*field).load(std::memory_order_acquire), want)) {
                char what[160];
                desc_text(d, what, sizeof what);
                std::lock_guard<std::mutex> g(c->mu);
                fail_async_locked(c, ncclRemoteError, "rank %d (pid %u) %s while rank %d waits for it in %s",
                                  q, p.pid.load(), why, c->rank, what);
                break;
            }
        }
        if (all)
            return true;
        if (c->error.load() == ncclSuccess)
            futex_wait(&s->bell, bell);
    }
}

struct Work {
    ncclComm *c;
    Desc d;
    const unsigned char *send;
    unsigned char *recv;
};

/* This rank's part of units [off, off + n) of a collective into its slot; `per` units fill
 * a slot (a reduce-scatter's slot holds `per` of every rank's part). */
void post(const Work &w, size_t off, size_t n, size_t per, unsigned char *slot)
{
    const Desc &d = w.d;
    const size_t es = dtype_size(d.dtype);
    if (n == 0 || (d.kind == KIND_BROADCAST && w.c->rank != d.root))
        return;
    if (d.kind == KIND_REDUCESCATTER)
        for (int q = 0; q < w.c->world; q++)
            memcpy(slot + (size_t)q * per * es, w.send + ((size_t)q * d.count + off) * es, n * es);
    else if (d.kind == KIND_ALLREDUCE)
        memcpy(slot, w.send + off * es, n * es);
    else
        memcpy(slot, w.send + off, n); /* broadcast and all-gather count bytes */
}

/* Units [off, off + n) of the result, from every rank's slot. */
void take(const Work &w, size_t off, size_t n, size_t per, const ShmSeg *s)
{
    const Desc &d = w.d;
    const size_t es = dtype_size(d.dtype);
    if (n == 0)
        return;
    if (d.kind == KIND_ALLREDUCE)
        reduce_any(d.dtype, w.recv + off * es, s, w.c->world, 0, n, d.op);
    else if (d.kind == KIND_REDUCESCATTER)
        reduce_any(d.dtype, w.recv + off * es, s, w.c->world, (size_t)w.c->rank * per * es, n, d.op);
    else if (d.kind == KIND_BROADCAST)
        memcpy(w.recv + off, s->slot[d.root], n);
    else /* in place, this rank's part of recv is its send: copied to its slot already */
        for (int q = 0; q < w.c->world; q++)
            memcpy(w.recv + (size_t)q * d.count * es + off, s->slot[q], n);
}

/* One step of a collective, taken by every rank in the same order: each rank fills its
 * slot, every rank's slot is full (and the collectives are checked to be the same call),
 * each reads the slots, and the step ends when every rank has read them, so that the
 * next step may fill them again. False when the collective must stop. */
bool step(const Work &w, size_t off, size_t n, size_t per)
{
    ncclComm *c = w.c;
    const Desc &d = w.d;
    ShmSeg *s = c->seg;
    ShmRank &me = s->rank[c->rank];
    uint32_t k = ++c->step;
    post(w, off, n, per, s->slot[c->rank]);
    me.desc = d;
    me.ready.store(k, std::memory_order_release);
    ring(s);
    if (off == 0)
        kill_if(c, d.seq, KILL_POST);
    if (!wait_all(c, &ShmRank::ready, k, d))
        return false;
    for (int q = 0; q < c->world; q++) {
        const Desc &o = s->rank[q].desc;
        if (o.seq != d.seq || o.kind != d.kind || o.dtype != d.dtype || o.op != d.op || o.root != d.root ||
            o.count != d.count) {
            char mine[160], theirs[160];
            desc_text(d, mine, sizeof mine);
            desc_text(o, theirs, sizeof theirs);
            {
                std::lock_guard<std::mutex> g(c->mu);
                fail_async_locked(c, ncclInvalidUsage,
                                  "the ranks' collectives differ: rank %d issued %s, rank %d %s", c->rank,
                                  mine, q, theirs);
            }
            park(c);
            return false;
        }
    }
    take(w, off, n, per, s);
    me.done.store(k, std::memory_order_release);
    ring(s);
    return wait_all(c, &ShmRank::done, k, d);
}

/* A collective on its stream's thread, in steps of at most a slot. */
void run_work(void *arg)
{
    const Work &w = *static_cast<Work *>(arg);
    ncclComm *c = w.c;
    std::lock_guard<std::mutex> run(c->run_mu);
    if (c->stop.load() || !c->seg)
        return;
    if (c->error.load() != ncclSuccess) {
        park(c);
        return;
    }
    /* Broadcasts and all-gathers move bytes, reductions whole elements. */
    const Desc &d = w.d;
    const size_t es = dtype_size(d.dtype);
    const bool reduces = d.kind == KIND_ALLREDUCE || d.kind == KIND_REDUCESCATTER;
    const size_t total = reduces ? d.count : d.count * es;
    const size_t per =
        (d.kind == KIND_REDUCESCATTER ? kSlotBytes / (size_t)c->world : kSlotBytes) / (reduces ? es : 1);
    /* At least one step: an empty collective is matched against the peers' too. */
    size_t off = 0;
    do {
        size_t n = total - off < per ? total - off : per;
        if (!step(w, off, n, per))
            return;
        off += n;
    } while (off < total);
    kill_if(c, d.seq, KILL_DONE);
}

void release_work(void *arg)
{
    Work *w = static_cast<Work *>(arg);
    ncclComm *c = w->c;
    delete w;
    std::lock_guard<std::mutex> g(c->mu);
    if (--c->inflight == 0)
        c->idle.notify_all();
}

/* Checks a collective's arguments and queues it on `stream`. */
ncclResult_t enqueue(ncclComm *c, const char *call, Desc d, const void *send, size_t send_count, void *recv,
                     size_t recv_count, cudaStream_t stream)
{
    if (!c)
        return fail(nullptr, ncclInvalidArgument, "%s: comm is NULL", call);
    Call held(c, call);
    if (c->stop.load())
        return fail(c, ncclInvalidUsage, "%s: the communicator was aborted or destroyed", call);
    if (c->finalizing.load())
        return fail(c, ncclInvalidUsage, "%s: the communicator is finalized", call);
    if (int e = c->error.load())
        return (ncclResult_t)e; /* ncclGetLastError has said why already */
    const size_t es = dtype_size(d.dtype);
    if (!es)
        return fail(c, ncclInvalidArgument, "%s: datatype %u is not an ncclDataType_t", call, d.dtype);
    if ((d.kind == KIND_ALLREDUCE || d.kind == KIND_REDUCESCATTER) &&
        (d.op >= ncclNumOps || d.dtype == ncclFloat16))
        return fail(c, ncclInvalidArgument, "%s: op %s on %s is not emulated", call, op_name(d.op),
                    dtype_name(d.dtype));
    if (d.kind == KIND_BROADCAST && (d.root < 0 || d.root >= c->world))
        return fail(c, ncclInvalidArgument, "%s: root %d is not a rank of %d", call, d.root, c->world);
    if (send_count > SIZE_MAX / es || recv_count > SIZE_MAX / es)
        return fail(c, ncclInvalidArgument, "%s: count %llu is too large", call, (unsigned long long)d.count);
    /* NCCL takes device pointers only; a broadcast reads sendbuff on its root only. */
    const struct {
        const void *p;
        size_t bytes;
        const char *arg;
        bool used;
    } bufs[2] = {{send, send_count * es, "sendbuff", d.kind != KIND_BROADCAST || d.root == c->rank},
                 {recv, recv_count * es, "recvbuff", true}};
    for (const auto &b : bufs) {
        if (b.used && b.bytes && emu_mem_kind(b.p, b.bytes) != EMU_MEM_DEVICE) {
            char where[200];
            emu_mem_describe(b.p, where, sizeof where);
            return fail(c, ncclInvalidArgument, "%s: %s %p (%zu bytes) is %s", call, b.arg, b.p, b.bytes,
                        where);
        }
    }
    d.seq = c->issued.fetch_add(1) + 1;
    if (kill_point().set) {
        char what[160];
        desc_text(d, what, sizeof what);
        fprintf(stderr, "ddpd nccl emulator: rank %d issues %s\n", c->rank, what);
    }
    kill_if(c, d.seq, KILL_ISSUE);
    Work *w = new Work{c, d, static_cast<const unsigned char *>(send), static_cast<unsigned char *>(recv)};
    {
        std::lock_guard<std::mutex> g(c->mu);
        c->inflight++;
    }
    cudaError_t e = emu_stream_enqueue(stream, run_work, w, release_work);
    if (e != cudaSuccess) {
        /* Released already (emu_stream_enqueue releases work it drops). This rank's
         * sequence has a gap now: the communicator is broken for good. */
        std::lock_guard<std::mutex> g(c->mu);
        fail_async_locked(c, ncclUnhandledCudaError, "%s: queueing on the stream: %s", call,
                          cudaGetErrorString(e));
        return ncclUnhandledCudaError;
    }
    return ncclSuccess;
}

/* Under c->mu with the segment mapped: whether every rank has joined. A rank that left,
 * aborted or died before that is the asynchronous error. */
bool joined_check(ncclComm *c)
{
    ShmSeg *s = c->seg;
    if (s->joined.load() >= (uint32_t)c->world) {
        /* NCCL refuses two ranks of a group on one GPU ("Duplicate GPU detected"). */
        for (int q = 0; q < c->world; q++)
            if (q != c->rank && s->rank[q].device.load() == s->rank[c->rank].device.load()) {
                fail_async_locked(c, ncclInvalidUsage,
                                  "ncclCommInitRank: Duplicate GPU detected: rank %d and rank %d are both on "
                                  "emulated GPU %u (NCCL takes one GPU per rank)",
                                  c->rank, q, s->rank[q].device.load() - 1);
                return false;
            }
        return true;
    }
    double now = now_s();
    bool live = !blind() && now >= c->next_live_join;
    if (live)
        c->next_live_join = now + kLivenessS;
    for (int q = 0; q < c->world; q++) {
        const char *why = q == c->rank ? nullptr : peer_failure(s->rank[q], live);
        if (why && s->joined.load() < (uint32_t)c->world) {
            fail_async_locked(c, ncclRemoteError, "rank %d (pid %u) %s before every rank had joined", q,
                              s->rank[q].pid.load(), why);
            return false;
        }
    }
    return false;
}

/* Maps the id's segment (creating it if this rank is first), initialises it once and
 * takes this rank's slot. */
ncclResult_t attach(ncclComm *c, const IdBody &id)
{
    int n = snprintf(c->name, sizeof c->name, "/ddpd-nccl-");
    for (unsigned char b : id.random)
        n += snprintf(c->name + n, sizeof c->name - (size_t)n, "%02x", b);
    int fd = shm_open(c->name, O_CREAT | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0)
        return fail(nullptr, ncclSystemError, "ncclCommInitRank: shm_open(%s): %s", c->name, strerror(errno));
    void *map = MAP_FAILED;
    if (ftruncate(fd, sizeof(ShmSeg)) == 0)
        map = mmap(nullptr, sizeof(ShmSeg), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int why = errno;
    close(fd);
    if (map == MAP_FAILED)
        return fail(nullptr, ncclSystemError, "ncclCommInitRank: mapping %s (%zu bytes): %s", c->name,
                    sizeof(ShmSeg), strerror(why));
    ShmSeg *s = c->seg = static_cast<ShmSeg *>(map);
    uint32_t st = SEG_NEW;
    if (s->state.compare_exchange_strong(st, SEG_INIT)) {
        s->nranks.store((uint32_t)c->world);
        s->state.store(SEG_READY);
        futex_wake(&s->state);
        st = SEG_READY;
    }
    for (double until = now_s() + kInitWaitS; st == SEG_INIT && now_s() < until; st = s->state.load())
        futex_wait(&s->state, SEG_INIT);
    ShmRank &me = s->rank[c->rank];
    uint32_t mine = RANK_FREE;
    if (st == SEG_INIT)
        return fail(nullptr, ncclSystemError, "ncclCommInitRank: %s was never initialised", c->name);
    if (st == SEG_CLOSED)
        return fail(nullptr, ncclInvalidUsage, "ncclCommInitRank: the group of this id is complete already");
    if (s->nranks.load() != (uint32_t)c->world)
        return fail(nullptr, ncclInvalidArgument,
                    "ncclCommInitRank: rank %d was given nranks %d, but the group of this id has %u", c->rank,
                    c->world, s->nranks.load());
    if (!me.state.compare_exchange_strong(mine, RANK_CLAIMED))
        return fail(nullptr, ncclInvalidUsage,
                    "ncclCommInitRank: rank %d of this id is taken already (by pid %u)", c->rank,
                    me.pid.load());
    me.pid.store((uint32_t)getpid());
    me.start.store(proc_start((uint32_t)getpid()));
    me.device.store(1u + (uint32_t)emu_device_physical(emu_stream_device(NULL)));
    me.state.store(RANK_JOINED);
    /* Once every rank has the segment mapped, its name has served: unlinking it now leaves
     * nothing behind however the ranks end (killed, or exiting mid-abort). */
    uint32_t ready = SEG_READY;
    if (s->joined.fetch_add(1) + 1 == (uint32_t)c->world &&
        s->state.compare_exchange_strong(ready, SEG_CLOSED))
        shm_unlink(c->name);
    ring(s);
    return ncclSuccess;
}

void bury(ncclComm *c)
{
    std::lock_guard<std::mutex> g(g_mu);
    c->next_dead = g_graveyard;
    g_graveyard = c;
}

/* Ends this rank's part: wakes its collective (which returns), tells the peers `how` it
 * left, and unlinks the segment of a group that never formed when no peer is left in it.
 * True for the one call that did it. */
bool leave(ncclComm *c, RankState how)
{
    if (c->stop.exchange(true) || !c->seg)
        return false;
    ShmSeg *s = c->seg;
    ring(s);
    std::lock_guard<std::mutex> run(c->run_mu);
    std::lock_guard<std::mutex> g(c->mu);
    s->rank[c->rank].state.store(how);
    ring(s);
    bool last = true;
    for (int q = 0; q < c->world; q++) {
        const ShmRank &p = s->rank[q];
        uint32_t st = p.state.load();
        if (q != c->rank && (st == RANK_CLAIMED || (st == RANK_JOINED && rank_alive(p))))
            last = false;
    }
    uint32_t ready = SEG_READY;
    if (last && s->state.compare_exchange_strong(ready, SEG_CLOSED))
        shm_unlink(c->name);
    munmap(s, sizeof(ShmSeg));
    c->seg = nullptr;
    return true;
}

} // namespace

extern "C" {

ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId)
{
    if (!uniqueId)
        return fail(nullptr, ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
    IdBody body;
    memcpy(body.magic, kIdMagic, sizeof body.magic);
    for (size_t got = 0; got < sizeof body.random;) {
        ssize_t n = getrandom(body.random + got, sizeof body.random - got, 0);
        if (n < 0 && errno != EINTR)
            return fail(nullptr, ncclSystemError, "ncclGetUniqueId: getrandom: %s", strerror(errno));
        got += n > 0 ? (size_t)n : 0;
    }
    memset(uniqueId, 0, sizeof *uniqueId);
    memcpy(uniqueId->internal, &body, sizeof body);
    return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t *config)
{
    if (!comm)
        return fail(nullptr, ncclInvalidArgument, "ncclCommInitRank: comm is NULL");
    *comm = nullptr;
    bool blocking = true;
    if (config) {
        if (config->magic != NCCL_CONFIG_MAGIC || config->size != sizeof(ncclConfig_t))
            return fail(nullptr, ncclInvalidArgument,
                        "ncclCommInitRankConfig: config was not set up with NCCL_CONFIG_INITIALIZER");
        if (config->blocking != NCCL_CONFIG_UNDEF_INT)
            blocking = config->blocking != 0;
    }
    if (nranks < 1 || nranks > kMaxRanks)
        return fail(nullptr, ncclInvalidArgument, "ncclCommInitRank: nranks %d is not in [1, %d]", nranks,
                    kMaxRanks);
    if (rank < 0 || rank >= nranks)
        return fail(nullptr, ncclInvalidArgument, "ncclCommInitRank: rank %d is not in [0, %d)", rank,
                    nranks);
    IdBody id;
    memcpy(&id, commId.internal, sizeof id);
    if (memcmp(id.magic, kIdMagic, sizeof id.magic) != 0)
        return fail(nullptr, ncclInvalidArgument,
                    "ncclCommInitRank: the id does not come from ncclGetUniqueId");
    ncclComm *c = new ncclComm;
    c->rank = rank;
    c->world = nranks;
    c->blocking = blocking;
    ncclResult_t r = attach(c, id);
    if (r != ncclSuccess) {
        if (c->seg)
            munmap(c->seg, sizeof(ShmSeg));
        delete c;
        return r;
    }
    /* Non-blocking: ncclCommGetAsyncError says when the others have come. */
    for (;;) {
        uint32_t bell = c->seg->bell.load();
        int e;
        {
            std::lock_guard<std::mutex> g(c->mu);
            c->joined.store(joined_check(c));
            e = c->error.load();
        }
        if (e != ncclSuccess && blocking) {
            leave(c, RANK_ABORTED);
            delete c;
            return (ncclResult_t)e;
        }
        if (c->joined.load() || !blocking) {
            *comm = c; /* a failure to join surfaces through ncclCommGetAsyncError */
            return c->joined.load() ? ncclSuccess : ncclInProgress;
        }
        futex_wait(&c->seg->bell, bell);
    }
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank)
{
    return ncclCommInitRankConfig(comm, nranks, commId, rank, nullptr);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError)
{
    if (!comm || !asyncError)
        return fail(comm, ncclInvalidArgument, "ncclCommGetAsyncError: %s is NULL",
                    comm ? "asyncError" : "comm");
    Call held(comm, "ncclCommGetAsyncError");
    if (!comm->joined.load()) {
        std::lock_guard<std::mutex> g(comm->mu);
        if (comm->seg && !comm->stop.load() && comm->error.load() == ncclSuccess)
            comm->joined.store(joined_check(comm));
    }
    int e = comm->error.load();
    if (e == ncclSuccess && comm->stop.load()) {
        fail(comm, ncclInvalidUsage, "ncclCommGetAsyncError: the communicator was aborted or destroyed");
        e = ncclInvalidUsage;
    } else if (e == ncclSuccess && !comm->joined.load()) {
        e = ncclInProgress;
    } else if (e == ncclSuccess && comm->finalizing.load()) {
        std::lock_guard<std::mutex> g(comm->mu);
        e = comm->inflight > 0 ? ncclInProgress : ncclSuccess;
    }
    *asyncError = (ncclResult_t)e;
    return ncclSuccess;
}

/* Marks the end of this rank's collectives; done when every queued one has run. */
ncclResult_t ncclCommFinalize(ncclComm_t comm)
{
    if (!comm)
        return fail(nullptr, ncclInvalidArgument, "ncclCommFinalize: comm is NULL");
    Call held(comm, "ncclCommFinalize");
    if (comm->stop.load())
        return fail(comm, ncclInvalidUsage, "ncclCommFinalize: the communicator was aborted or destroyed");
    comm->finalizing.store(true);
    std::unique_lock<std::mutex> lk(comm->mu);
    while (comm->inflight > 0 && comm->blocking && comm->error.load() == ncclSuccess)
        comm->idle.wait_for(lk, std::chrono::milliseconds(kSliceMs));
    if (int e = comm->error.load())
        return (ncclResult_t)e;
    return comm->inflight > 0 ? ncclInProgress : ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    if (!comm)
        return ncclSuccess;
    Call held(comm, "ncclCommDestroy");
    say_issued(comm);
    if (!leave(comm, RANK_LEFT))
        return fail(comm, ncclInvalidUsage,
                    "ncclCommDestroy: the communicator was aborted or destroyed already");
    /* Kept, like an aborted one: queued work may still name it (and returns at once), and a
     * later call with it must find it freed, not reuse its memory. */
    mark_freed(comm, "ncclCommDestroy");
    bury(comm);
    return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    if (!comm)
        return ncclSuccess;
    Call held(comm, "ncclCommAbort");
    say_issued(comm);
    if (leave(comm, RANK_ABORTED))
        bury(comm);
    mark_freed(comm, "ncclCommAbort");
    return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count)
{
    if (!comm || !count)
        return fail(comm, ncclInvalidArgument, "ncclCommCount: %s is NULL", comm ? "count" : "comm");
    Call held(comm, "ncclCommCount");
    *count = comm->world;
    return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank)
{
    if (!comm || !rank)
        return fail(comm, ncclInvalidArgument, "ncclCommUserRank: %s is NULL", comm ? "rank" : "comm");
    Call held(comm, "ncclCommUserRank");
    *rank = comm->rank;
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t result)
{
    switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

const char *ncclGetLastError(ncclComm_t comm)
{
    /* A copy per thread: the watchdog reads it while the stream thread may write. */
    thread_local char text[512];
    if (comm) {
        Call held(comm, "ncclGetLastError");
        std::lock_guard<std::mutex> g(comm->mu);
        snprintf(text, sizeof text, "%s",
                 comm->error.load() != ncclSuccess ? comm->async_text : comm->last_text);
    } else {
        std::lock_guard<std::mutex> g(g_mu);
        snprintf(text, sizeof text, "%s", g_last);
    }
    return text;
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    Desc d = {0, KIND_ALLREDUCE, (uint32_t)datatype, (uint32_t)op, 0, count};
    return enqueue(comm, "ncclAllReduce", d, sendbuff, count, recvbuff, count, stream);
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                           int root, ncclComm_t comm, cudaStream_t stream)
{
    Desc d = {0, KIND_BROADCAST, (uint32_t)datatype, 0, root, count};
    return enqueue(comm, "ncclBroadcast", d, sendbuff, count, recvbuff, count, stream);
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream)
{
    Desc d = {0, KIND_ALLGATHER, (uint32_t)datatype, 0, 0, sendcount};
    size_t world = comm ? (size_t)comm->world : 1;
    size_t all = sendcount > SIZE_MAX / world ? SIZE_MAX : sendcount * world;
    return enqueue(comm, "ncclAllGather", d, sendbuff, sendcount, recvbuff, all, stream);
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    Desc d = {0, KIND_REDUCESCATTER, (uint32_t)datatype, (uint32_t)op, 0, recvcount};
    size_t world = comm ? (size_t)comm->world : 1;
    size_t all = recvcount > SIZE_MAX / world ? SIZE_MAX : recvcount * world;
    return enqueue(comm, "ncclReduceScatter", d, sendbuff, all, recvbuff, recvcount, stream);
}

ncclResult_t ncclGroupStart(void)
{
    t_group_depth++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void)
{
    if (t_group_depth == 0)
        return fail(nullptr, ncclInvalidUsage, "ncclGroupEnd: no ncclGroupStart to end");
    t_group_depth--;
    return ncclSuccess;
}

} // extern "C"
