/* emu/kernel.cc — how the emulated device runs a kernel: the blocks of a launch one after
 * another on their stream's thread, and inside a block every CUDA thread as a fiber with a
 * stack of its own, a warp at a time (run_block). A fiber hands over only at a barrier
 * (__syncthreads, __syncwarp) or a shuffle, so code that reads what another thread writes
 * without the barrier between them reads a stale value, as a GPU would let it. Barriers
 * count threads that returned as arrived (sm_70 and later); a warp operation whose mask
 * names a lane that has left, or a block where no fiber can move, is a launch failure that
 * names the kernel, the block and the thread. A launch runs only where the module holds
 * code for the stream's device (runtime.cc's emu_code_for_device). With
 * DDPD_CUDA_EMU_LAUNCH_LOG=1 every launch's grid is written to stderr, so that tests can see
 * a kernel's launch shape. Knows nothing of memory or streams.
 * Test knob: DDPD_CUDA_EMU_KERNEL_DELAY_MS=N makes every kernel take N ms more on its
 * stream (a slow GPU: compute that outlasts a collective's deadline). */
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <mutex>
#include <vector>

#include "emu_impl.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define EMU_ASAN 1
#endif
#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#define EMU_TSAN 1
#endif

namespace emu
{

__thread thread_view *cur_thread;
__thread block_view *cur_block;

/* ---- the context switch ----
 * x86-64: the callee-saved registers, the SSE and x87 control words and the stack pointer,
 * so a switch costs a few nanoseconds (swapcontext's signal-mask system call would cost a
 * microsecond per switch, and a launch switches once per thread and barrier). */
#if defined(__x86_64__)
extern "C" void emu__ctx_switch(void **save_sp, void *load_sp);
extern "C" void emu__ctx_trampoline(void);
asm(R"(
    .text
    .p2align 4
    .globl emu__ctx_switch
    .hidden emu__ctx_switch
    .type emu__ctx_switch,@function
emu__ctx_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emu__ctx_switch,.-emu__ctx_switch

    .p2align 4
    .globl emu__ctx_trampoline
    .hidden emu__ctx_trampoline
    .type emu__ctx_trampoline,@function
emu__ctx_trampoline:
    movq %r12, %rdi
    callq *%r13
    ud2
    .size emu__ctx_trampoline,.-emu__ctx_trampoline
)");

/* A new fiber's saved frame: emu__ctx_switch pops it and "returns" into the trampoline,
 * which calls entry(arg) with the stack aligned as the ABI wants. */
static void *ctx_make(char *stack, size_t size, void (*entry)(void *), void *arg)
{
    uintptr_t top = ((uintptr_t)(stack + size)) & ~(uintptr_t)15;
    uint64_t *sp = (uint64_t *)(top - 96);
    memset(sp, 0, 96);
    uint32_t csr;
    uint16_t cw;
    asm volatile("stmxcsr %0" : "=m"(csr));
    asm volatile("fnstcw %0" : "=m"(cw));
    memcpy(sp, &csr, 4);
    memcpy((char *)sp + 4, &cw, 2);
    sp[1] = 0;                          /* r15 */
    sp[2] = 0;                          /* r14 */
    sp[3] = (uint64_t)(uintptr_t)entry; /* r13 */
    sp[4] = (uint64_t)(uintptr_t)arg;   /* r12 */
    sp[5] = 0;                          /* rbx */
    sp[6] = 0;                          /* rbp: the end of a backtrace */
    sp[7] = (uint64_t)(uintptr_t)emu__ctx_trampoline;
    return sp;
}
#else
#error "the emulated device's fibers need a context switch for this architecture (x86-64 only so far)"
#endif

/* ---- fibers, warps, blocks ---- */

enum { FIBER_READY, FIBER_WAITING, FIBER_DONE };

#if defined(EMU_ASAN)
enum : size_t { STACK_BYTES = 256 * 1024 };
#else
enum : size_t { STACK_BYTES = 64 * 1024 };
#endif
enum { MAX_THREADS = 1024, WARP = 32 };

struct fiber {
    void *sp;
    thread_view view;
    int linear; /* x + y * dim.x + z * dim.x * dim.y */
    int state;
    const char *waits_at; /* the barrier or shuffle it waits at, for a deadlock's report */
    char *stack;
#if defined(EMU_ASAN)
    void *fake_stack;
#endif
#if defined(EMU_TSAN)
    void *tsan;
#endif
};

struct warp {
    uint64_t slot[WARP];
    unsigned arrived; /* lanes at the current warp barrier */
    unsigned exited;  /* lanes that returned */
    unsigned gen;
};

struct block {
    const char *kernel;
    block_view view;
    const std::function<void()> *body;
    int n;          /* threads */
    int arrived;    /* at the current __syncthreads */
    int exited;     /* threads that returned */
    unsigned gen;   /* __syncthreads' generation */
    uint64_t moved; /* bumped whenever a fiber arrives, passes or returns */
    bool failed;
    warp warps[MAX_THREADS / WARP];
    fiber *fibers;
};

/* One stream thread's fiber stacks, made at its first launch and kept. */
struct runner {
    char *stacks = nullptr; /* MAX_THREADS stacks, each with a guard page below it */
    size_t stride = 0;
    fiber fibers[MAX_THREADS];
    void *sched_sp = nullptr;
#if defined(EMU_ASAN)
    const void *sched_bottom = nullptr;
    size_t sched_size = 0;
#endif
#if defined(EMU_TSAN)
    void *sched_tsan = nullptr;
#endif
    block *cur = nullptr;
    fiber *running = nullptr;

    ~runner()
    {
        if (stacks)
            munmap(stacks, stride * MAX_THREADS);
#if defined(EMU_TSAN)
        for (fiber &f : fibers)
            if (f.tsan)
                __tsan_destroy_fiber(f.tsan);
#endif
    }
};

static thread_local runner *tl_runner;
static thread_local bool tl_runner_made;

/* Guard pages of every runner, for telling a kernel's stack overflow from other faults. */
/* On the heap and never freed: a stream thread may still run while exit() destroys statics. */
static std::mutex &guards_mu = *new std::mutex;
static std::vector<std::pair<uintptr_t, size_t>> &guard_spans =
    *new std::vector<std::pair<uintptr_t, size_t>>; /* [first stack, its extent) */

static runner *get_runner()
{
    if (tl_runner)
        return tl_runner;
    runner *r = new runner();
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    r->stride = STACK_BYTES + page;
    void *m = mmap(NULL, r->stride * MAX_THREADS, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) {
        fprintf(stderr, "ddpd cuda emulator: cannot map %zu bytes of fiber stacks\n",
                r->stride * MAX_THREADS);
        abort();
    }
    r->stacks = (char *)m;
    for (int i = 0; i < MAX_THREADS; i++) {
        mprotect(r->stacks + (size_t)i * r->stride, page, PROT_NONE); /* a stack grows down onto it */
        r->fibers[i].stack = r->stacks + (size_t)i * r->stride + page;
    }
    {
        std::lock_guard<std::mutex> g(guards_mu);
        guard_spans.push_back({(uintptr_t)r->stacks, r->stride * MAX_THREADS});
    }
    tl_runner = r;
    if (!tl_runner_made) {
        tl_runner_made = true;
        /* Freed with the thread: a stream thread ends when its stream is destroyed. */
        static thread_local struct reaper {
            ~reaper()
            {
                if (tl_runner) {
                    std::lock_guard<std::mutex> g(guards_mu);
                    for (size_t i = 0; i < guard_spans.size(); i++)
                        if (guard_spans[i].first == (uintptr_t)tl_runner->stacks) {
                            guard_spans.erase(guard_spans.begin() + (long)i);
                            break;
                        }
                }
                delete tl_runner;
                tl_runner = nullptr;
            }
        } reap;
        (void)reap;
    }
    return r;
}

bool on_fiber_guard(const void *addr)
{
    const uintptr_t a = (uintptr_t)addr;
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    std::lock_guard<std::mutex> g(guards_mu);
    for (auto &s : guard_spans)
        if (a >= s.first && a < s.first + s.second && (a - s.first) % (STACK_BYTES + page) < page)
            return true;
    return false;
}

/* ---- switching ---- */

static void switch_to_fiber(runner *r, fiber *f)
{
    r->running = f;
    cur_thread = &f->view;
#if defined(EMU_ASAN)
    void *fake = nullptr;
    __sanitizer_start_switch_fiber(&fake, f->stack, STACK_BYTES);
#endif
#if defined(EMU_TSAN)
    __tsan_switch_to_fiber(f->tsan, 0);
#endif
    emu__ctx_switch(&r->sched_sp, f->sp);
#if defined(EMU_ASAN)
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
    r->running = nullptr;
}

/* From the running fiber back to the scheduler; `done` when the fiber will never resume. */
static void switch_to_sched(runner *r, fiber *f, bool done)
{
#if defined(EMU_ASAN)
    __sanitizer_start_switch_fiber(done ? nullptr : &f->fake_stack, r->sched_bottom, r->sched_size);
#else
    (void)done;
#endif
#if defined(EMU_TSAN)
    __tsan_switch_to_fiber(r->sched_tsan, 0);
#endif
    emu__ctx_switch(&f->sp, r->sched_sp);
#if defined(EMU_ASAN)
    __sanitizer_finish_switch_fiber(f->fake_stack, &r->sched_bottom, &r->sched_size);
#endif
}

static runner *running_runner()
{
    runner *r = tl_runner;
    if (!r || !r->running) {
        fprintf(stderr, "ddpd cuda emulator: a device function (a barrier or a shuffle) was called outside a "
                        "kernel\n");
        abort();
    }
    return r;
}

/* Ends the launch: the error names kernel, block and thread; the fibers are abandoned
 * (their stacks hold nothing that needs freeing) and the stream's later work is skipped,
 * as a sticky launch failure does on a GPU. */
[[noreturn]] static void kernel_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void kernel_fail(const char *fmt, ...)
{
    runner *r = running_runner();
    block *b = r->cur;
    fiber *f = r->running;
    char why[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    emu_error_sticky(cudaErrorLaunchFailure, "kernel %s, block (%u,%u,%u), thread (%u,%u,%u): %s", b->kernel,
                     b->view.block_idx.x, b->view.block_idx.y, b->view.block_idx.z, f->view.thread_idx.x,
                     f->view.thread_idx.y, f->view.thread_idx.z, why);
    b->failed = true;
    f->state = FIBER_DONE;
    switch_to_sched(r, f, true);
    __builtin_unreachable();
}

/* The running fiber waits: back to the scheduler until it is resumed. */
static void wait_here(runner *r, fiber *f, const char *what)
{
    f->state = FIBER_WAITING;
    f->waits_at = what;
    switch_to_sched(r, f, false);
    f->state = FIBER_READY;
}

static void fiber_main(void *arg)
{
    fiber *f = (fiber *)arg;
    runner *r = tl_runner;
#if defined(EMU_ASAN)
    __sanitizer_finish_switch_fiber(nullptr, &r->sched_bottom, &r->sched_size);
#endif
    block *b = r->cur;
    (*b->body)();
    /* Returned: counts as arrived at every later barrier of the block and its warp. */
    b->exited++;
    b->warps[f->linear / WARP].exited |= 1u << (f->linear % WARP);
    b->moved++;
    f->state = FIBER_DONE;
    switch_to_sched(r, f, true);
    __builtin_unreachable();
}

/* ---- barriers ---- */

void syncthreads()
{
    runner *r = running_runner();
    block *b = r->cur;
    fiber *f = r->running;
    const unsigned my = b->gen;
    b->arrived++;
    b->moved++;
    while (b->gen == my) {
        if (b->arrived + b->exited == b->n) {
            b->gen++;
            b->arrived = 0;
            b->moved++;
            break;
        }
        wait_here(r, f, "__syncthreads");
    }
}

int lane_id()
{
    return running_runner()->running->linear % WARP;
}

/* The lanes that exist in warp w of a block of n threads. */
static unsigned warp_lanes(const block *b, int w)
{
    const int left = b->n - w * WARP;
    return left >= WARP ? 0xffffffffu : (1u << left) - 1;
}

static void warp_barrier(runner *r, block *b, fiber *f, unsigned mask, const char *what)
{
    const int w = f->linear / WARP, lane = f->linear % WARP;
    warp &wp = b->warps[w];
    if (!(mask >> lane & 1u))
        kernel_fail("%s with mask 0x%08x, which leaves out the calling lane %d", what, mask, lane);
    if (mask & ~warp_lanes(b, w))
        kernel_fail("%s with mask 0x%08x names lanes that this warp does not have (a block of %d threads)",
                    what, mask, b->n);
    const unsigned my = wp.gen;
    wp.arrived |= 1u << lane;
    b->moved++;
    while (wp.gen == my) {
        if ((wp.arrived & mask) == mask) {
            wp.gen++;
            wp.arrived = 0;
            b->moved++;
            break;
        }
        const unsigned gone = wp.exited & mask & ~wp.arrived;
        if (gone)
            kernel_fail("%s with mask 0x%08x waits for lane %d, which returned without reaching it", what,
                        mask, __builtin_ctz(gone));
        wait_here(r, f, what);
    }
}

void syncwarp(unsigned mask)
{
    runner *r = running_runner();
    warp_barrier(r, r->cur, r->running, mask, "__syncwarp");
}

uint64_t shuffle(unsigned mask, uint64_t v, int src, const char *what)
{
    runner *r = running_runner();
    block *b = r->cur;
    fiber *f = r->running;
    warp &wp = b->warps[f->linear / WARP];
    const int lane = f->linear % WARP;
    /* Offer my value, wait until every lane of the mask has offered its own, read the
     * partner's, and wait again before the slots may be overwritten by the next shuffle. */
    wp.slot[lane] = v;
    warp_barrier(r, b, f, mask, what);
    uint64_t got = v;
    if (src >= 0) {
        if (src >= WARP || !(mask >> src & 1u))
            kernel_fail("%s reads lane %d, which is not in the mask 0x%08x: it never offered a value", what,
                        src, mask);
        got = wp.slot[src];
    }
    warp_barrier(r, b, f, mask, what);
    return got;
}

/* ---- a block, a grid ---- */

static void deadlock(runner *r, block *b)
{
    char who[256] = "";
    int shown = 0;
    size_t len = 0;
    for (int i = 0; i < b->n && shown < 4; i++) {
        fiber *f = &b->fibers[i];
        if (f->state != FIBER_WAITING)
            continue;
        len +=
            (size_t)snprintf(who + len, sizeof who - len, "%sthread (%u,%u,%u) at %s", shown ? ", " : "",
                             f->view.thread_idx.x, f->view.thread_idx.y, f->view.thread_idx.z, f->waits_at);
        if (len >= sizeof who)
            break;
        shown++;
    }
    emu_error_sticky(cudaErrorLaunchFailure,
                     "kernel %s, block (%u,%u,%u): no thread can move (a barrier or shuffle that not every "
                     "thread reaches): %s",
                     b->kernel, b->view.block_idx.x, b->view.block_idx.y, b->view.block_idx.z, who);
    b->failed = true;
    (void)r;
}

/* Runs one block to its end; false when the launch failed. */
static bool run_block(runner *r, block *b)
{
    const dim3 d = b->view.block_dim;
    b->fibers = r->fibers;
    for (int i = 0; i < b->n; i++) {
        fiber *f = &r->fibers[i];
        f->linear = i;
        f->view.thread_idx = {(unsigned)i % d.x, (unsigned)i / d.x % d.y, (unsigned)i / (d.x * d.y)};
        f->state = FIBER_READY;
        f->waits_at = "";
#if defined(EMU_TSAN)
        if (!f->tsan)
            f->tsan = __tsan_create_fiber(0);
#endif
        f->sp = ctx_make(f->stack, STACK_BYTES, fiber_main, f);
    }
    /* A warp at a time, the last warp first, each as far as it can go (its lanes round-robin,
     * through its shuffles, until every lane waits at a block barrier or has returned):
     * warps then meet only at __syncthreads, as far apart as a GPU may run them, so shared
     * memory read before another warp wrote it (or overwritten before another warp read
     * it) shows as a wrong value instead of hiding behind a lucky order. */
    const int warps = (b->n + WARP - 1) / WARP;
    int live = b->n;
    while (live > 0 && !b->failed) {
        const uint64_t sweep = b->moved;
        /* A released __syncthreads starts the sweep again from the last warp, so the warps
         * that arrived first do not get ahead of the others. */
        const unsigned gen = b->gen;
        for (int w = warps - 1; w >= 0 && !b->failed && b->gen == gen; w--) {
            const int lo = w * WARP, hi = lo + WARP < b->n ? lo + WARP : b->n;
            /* A bounded number of passes: a warp that spins on another warp's flag lets
             * the others run. */
            for (int pass = 0; pass < (1 << 16) && !b->failed; pass++) {
                const uint64_t before = b->moved;
                for (int i = lo; i < hi && !b->failed; i++) {
                    fiber *f = &r->fibers[i];
                    if (f->state == FIBER_DONE)
                        continue;
                    switch_to_fiber(r, f);
                    if (f->state == FIBER_DONE)
                        live--;
                }
                if (b->moved == before || b->gen != gen)
                    break;
            }
        }
        if (live > 0 && !b->failed && b->moved == sweep)
            deadlock(r, b);
    }
    return !b->failed;
}

void run_grid(const char *kernel, dim3 grid, dim3 blockdim, const std::function<void()> &body)
{
    runner *r = get_runner();
#if defined(EMU_TSAN)
    if (!r->sched_tsan)
        r->sched_tsan = __tsan_get_current_fiber();
#endif
    static_assert(sizeof(block) < 16384, "a block's bookkeeping stays small");
    block *b = new block();
    b->kernel = kernel;
    b->body = &body;
    b->n = (int)(blockdim.x * blockdim.y * blockdim.z);
    b->view.block_dim = blockdim;
    b->view.grid_dim = grid;
    r->cur = b;
    block_view *saved_block = cur_block;
    thread_view *saved_thread = cur_thread;
    cur_block = &b->view;
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                /* Every block starts with its barriers and warps fresh. */
                const block_view v = b->view;
                const int n = b->n;
                *b = block();
                b->kernel = kernel;
                b->body = &body;
                b->n = n;
                b->view = v;
                b->view.block_idx = {x, y, z};
                if (!run_block(r, b))
                    goto out;
            }
out:
    cur_block = saved_block;
    cur_thread = saved_thread;
    r->cur = nullptr;
    delete b;
}

/* DDPD_CUDA_EMU_KERNEL_DELAY_MS, read once: 0 when unset or not a number of ms. */
static long kernel_delay_ms()
{
    static const long ms = [] {
        const char *v = getenv("DDPD_CUDA_EMU_KERNEL_DELAY_MS");
        char *end;
        long n = v && *v ? strtol(v, &end, 10) : 0;
        return n > 0 && n <= 60000 && !*end ? n : 0L;
    }();
    return ms;
}

void submit(const char *kernel, dim3 grid, dim3 blk, size_t smem, cudaStream_t stream,
            std::function<void()> body)
{
    cudaError_t st = sticky_error();
    if (st != cudaSuccess) {
        set_last_error(st);
        return;
    }
    const unsigned long long threads = (unsigned long long)blk.x * blk.y * blk.z;
    if (threads == 0 || threads > MAX_THREADS || blk.z > 64 || grid.x == 0 || grid.y == 0 || grid.z == 0 ||
        grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535) {
        set_last_error(emu_error(cudaErrorInvalidConfiguration,
                                 "kernel %s launched with grid (%u,%u,%u) and block (%u,%u,%u): at most %d "
                                 "threads a block, grid dimensions from 1",
                                 kernel, grid.x, grid.y, grid.z, blk.x, blk.y, blk.z, MAX_THREADS));
        return;
    }
    if (smem > 0) {
        /* No kernel of worker/cuda asks for dynamic shared memory yet: say so rather than
         * run it with none. */
        set_last_error(
            emu_error(cudaErrorInvalidConfiguration,
                      "kernel %s asks for %zu bytes of dynamic shared memory, which the emulator does "
                      "not provide yet",
                      kernel, smem));
        return;
    }
    static const bool log_launches = [] {
        const char *v = getenv("DDPD_CUDA_EMU_LAUNCH_LOG");
        return v && !strcmp(v, "1");
    }();
    if (log_launches)
        fprintf(stderr, "ddpd cuda emulator: launch %s grid (%u,%u,%u) block (%u,%u,%u)\n", kernel, grid.x,
                grid.y, grid.z, blk.x, blk.y, blk.z);
    /* The driver loads the module's code for the stream's device: without code that device
     * runs, the launch fails as on a GPU the module was not built for. */
    const int dev = emu_stream_device(stream);
    int binary, ptx;
    if (dev >= 0 && dev < emu_device_count() && !emu_code_for_device(dev, &binary, &ptx)) {
        cudaDeviceProp p;
        const bool known = cudaGetDeviceProperties(&p, dev) == cudaSuccess;
        set_last_error(
            emu_error(cudaErrorNoKernelImageForDevice,
                      "kernel %s launched on device %d of compute capability %d.%d, but the module "
                      "holds code for %s only (DDPD_CUDA_EMU_CODE)",
                      kernel, dev, known ? p.major : 0, known ? p.minor : 0, emuModuleCode()));
        return;
    }
    const long delay_ms = kernel_delay_ms();
    cudaError_t e = enqueue(stream, [kernel, grid, blk, delay_ms, body = std::move(body)]() {
        if (delay_ms > 0) {
            struct timespec t = {delay_ms / 1000, delay_ms % 1000 * 1000000L};
            nanosleep(&t, NULL);
        }
        run_grid(kernel, grid, blk, body);
    });
    if (e != cudaSuccess)
        set_last_error(e);
}

bool describe_running_kernel(char *out, size_t cap)
{
    runner *r = tl_runner;
    if (!r || !r->cur || !r->running)
        return false;
    const block *b = r->cur;
    const fiber *f = r->running;
    snprintf(out, cap, "kernel %s, block (%u,%u,%u), thread (%u,%u,%u)", b->kernel, b->view.block_idx.x,
             b->view.block_idx.y, b->view.block_idx.z, f->view.thread_idx.x, f->view.thread_idx.y,
             f->view.thread_idx.z);
    return true;
}

} // namespace emu
