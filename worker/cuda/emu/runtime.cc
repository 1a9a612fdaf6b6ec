/* emu/runtime.cc — the emulated device's CUDA runtime: its devices (DDPD_CUDA_EMU of them,
 * seen through CUDA_VISIBLE_DEVICES, of the compute capability DDPD_CUDA_EMU_CC says), the
 * code of the emulated module's fat binary (DDPD_CUDA_EMU_CODE) and the driver's choice of
 * it at every launch, device memory in an arena that host code cannot touch, pinned host memory, streams that
 * run their work in order on a thread each, events, and the errors a GPU would report. Device memory is an
 * mmap per allocation, placed at the end of its pages with an inaccessible guard page after it, and is
 * PROT_NONE except while some stream is executing work: host code that dereferences a device pointer faults,
 * and so does a kernel that reads past its buffer; the SIGSEGV handler says which. Kernels themselves run in
 * kernel.cc. What this cannot show: speed, real memory limits, timing. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "emu_impl.h"

/* ---- errors ---- */

namespace
{

struct code_text {
    cudaError_t code;
    const char *name, *text;
};
const code_text codes[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration", "invalid configuration argument"},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection", "invalid copy direction for memcpy"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorNoKernelImageForDevice, "cudaErrorNoKernelImageForDevice",
     "no kernel image is available for execution on the device"},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress", "an illegal memory access was encountered"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
    {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};
constexpr int NCODES = (int)(sizeof codes / sizeof codes[0]);

int code_index(cudaError_t e)
{
    for (int i = 0; i < NCODES; i++)
        if (codes[i].code == e)
            return i;
    return NCODES - 1;
}

/* The last emulator report of each code, published whole (never freed: a message another
 * thread is printing must stay valid). */
std::atomic<const char *> detail[NCODES];
std::atomic<int> sticky{cudaSuccess};
thread_local cudaError_t tl_last = cudaSuccess;

cudaError_t report(cudaError_t code, bool make_sticky, const char *fmt, va_list ap)
{
    char why[1024];
    vsnprintf(why, sizeof why, fmt, ap);
    fprintf(stderr, "ddpd cuda emulator: %s\n", why);
    const int i = code_index(code);
    const size_t cap = strlen(codes[i].text) + strlen(why) + 40;
    char *text = (char *)malloc(cap);
    if (text) {
        snprintf(text, cap, "%s (ddpd cuda emulator: %s)", codes[i].text, why);
        detail[i].store(text);
    }
    if (make_sticky) {
        int none = cudaSuccess;
        sticky.compare_exchange_strong(none, (int)code);
    }
    return code;
}

} // namespace

extern "C" cudaError_t emu_error(cudaError_t code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    report(code, false, fmt, ap);
    va_end(ap);
    return code;
}

extern "C" cudaError_t emu_error_sticky(cudaError_t code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    report(code, true, fmt, ap);
    va_end(ap);
    return code;
}

namespace emu
{
void set_last_error(cudaError_t e)
{
    if (e != cudaSuccess)
        tl_last = e;
}
cudaError_t sticky_error()
{
    return (cudaError_t)sticky.load();
}
} // namespace emu

extern "C" const char *cudaGetErrorString(cudaError_t e)
{
    const int i = code_index(e);
    const char *d = detail[i].load();
    return d ? d : codes[i].text;
}

extern "C" const char *cudaGetErrorName(cudaError_t e)
{
    return codes[code_index(e)].name;
}

extern "C" cudaError_t cudaGetLastError(void)
{
    cudaError_t e = tl_last;
    tl_last = cudaSuccess;
    return e != cudaSuccess ? e : emu::sticky_error();
}

extern "C" cudaError_t cudaPeekAtLastError(void)
{
    return tl_last != cudaSuccess ? tl_last : emu::sticky_error();
}

/* Every call but the error queries fails with the sticky error once there is one. */
#define STICKY_GUARD()                                                                                       \
    do {                                                                                                     \
        cudaError_t s_ = emu::sticky_error();                                                                \
        if (s_ != cudaSuccess)                                                                               \
            return s_;                                                                                       \
    } while (0)

/* ---- devices ---- */

namespace
{

constexpr int MAX_DEVICES = 16;
/* 1 GiB each: small, on purpose; DDPD_CUDA_EMU_MEMORY_MIB sets another size (a test of
 * GPT-2-sized buffers). */
size_t device_memory = (size_t)1 << 30;

struct device {
    int physical; /* its number among the DDPD_CUDA_EMU devices */
    int cc_major, cc_minor;
    std::atomic<size_t> used{0};
};

/* The emulated module's fat binary: nvcc's code names, "sm_80 sm_90 compute_90". By default
 * the release's list (CMake's DDPD_CUDA_EMU_DEFAULT_CODE: every major architecture from
 * Volta on, and PTX of the newest), so that any emulated device runs it. */
#ifndef DDPD_CUDA_EMU_DEFAULT_CODE
#define DDPD_CUDA_EMU_DEFAULT_CODE "sm_70 sm_75 sm_80 sm_86 sm_89 sm_90 sm_100 sm_120 compute_120"
#endif
char module_code[512] = DDPD_CUDA_EMU_DEFAULT_CODE;
int physical_cc[MAX_DEVICES][2];

/* DDPD_CUDA_EMU_CC: "8.6" for every device, or "8.6,7.0" for physical devices 0 and 1 (the
 * last entry for the rest); 9.0 when unset. A malformed entry is reported and ignored. */
void capability_init(int total)
{
    const char *v = getenv("DDPD_CUDA_EMU_CC");
    int major = 9, minor = 0;
    for (int i = 0; i < total; i++) {
        if (v && *v) {
            const size_t len = strcspn(v, ",");
            int a, b, n = 0;
            char item[32];
            snprintf(item, sizeof item, "%.*s", (int)(len < 31 ? len : 31), v);
            if (sscanf(item, "%d.%d%n", &a, &b, &n) == 2 && n == (int)strlen(item) && a >= 1 && a <= 99 &&
                b >= 0 && b <= 9)
                major = a, minor = b;
            else
                fprintf(stderr,
                        "ddpd cuda emulator: DDPD_CUDA_EMU_CC entry '%s' is not a compute capability "
                        "such as 8.6\n",
                        item);
            v += len;
            v += *v == ',';
        }
        physical_cc[i][0] = major;
        physical_cc[i][1] = minor;
    }
}

std::once_flag devices_once;
device *devices[MAX_DEVICES];
int ndevices;
thread_local int tl_device;

void install_fault_handler();

/* DDPD_CUDA_EMU=N devices, then CUDA_VISIBLE_DEVICES as CUDA reads it: a comma-separated
 * list of ordinals (or the UUIDs cudaGetDeviceProperties gives), up to the first entry that
 * names no device. */
void devices_init()
{
    const char *n = getenv("DDPD_CUDA_EMU");
    int total = 0;
    if (n && *n) {
        char *end;
        long v = strtol(n, &end, 10);
        if (*end || v < 0 || v > MAX_DEVICES)
            fprintf(stderr, "ddpd cuda emulator: DDPD_CUDA_EMU='%s' is not a device count in [0, %d]\n", n,
                    MAX_DEVICES);
        else
            total = (int)v;
    }
    int order[MAX_DEVICES], count = 0;
    capability_init(total);
    const char *code = getenv("DDPD_CUDA_EMU_CODE");
    if (code && *code)
        snprintf(module_code, sizeof module_code, "%s", code);
    const char *mib = getenv("DDPD_CUDA_EMU_MEMORY_MIB");
    if (mib && *mib) {
        char *end;
        long long v = strtoll(mib, &end, 10);
        if (*end || v < 1 || v > ((long long)1 << 20))
            fprintf(stderr,
                    "ddpd cuda emulator: DDPD_CUDA_EMU_MEMORY_MIB='%s' is not a size in [1, 1048576] MiB\n",
                    mib);
        else
            device_memory = (size_t)v << 20;
    }
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    if (!vis) {
        for (int i = 0; i < total; i++)
            order[count++] = i;
    } else {
        const char *p = vis;
        while (*p && count < MAX_DEVICES) {
            const size_t len = strcspn(p, ",");
            char item[64];
            snprintf(item, sizeof item, "%.*s", (int)(len < 63 ? len : 63), p);
            int phys = -1;
            if (!strncmp(item, "GPU-", 4)) {
                for (int i = 0; i < total; i++) {
                    char uuid[48];
                    snprintf(uuid, sizeof uuid, "GPU-dd9de000-0000-0000-0000-%012x", i);
                    if (!strncmp(uuid, item, strlen(item)))
                        phys = i;
                }
            } else {
                char *end;
                long v = strtol(item, &end, 10);
                if (end != item && !*end && v >= 0 && v < total)
                    phys = (int)v;
            }
            bool dup = false;
            for (int i = 0; i < count; i++)
                dup |= order[i] == phys;
            if (phys < 0 || dup)
                break;
            order[count++] = phys;
            p += len;
            if (*p == ',')
                p++;
        }
    }
    for (int i = 0; i < count; i++) {
        devices[i] = new device();
        devices[i]->physical = order[i];
        devices[i]->cc_major = physical_cc[order[i]][0];
        devices[i]->cc_minor = physical_cc[order[i]][1];
    }
    ndevices = count;
    if (count > 0)
        install_fault_handler();
}

int device_count()
{
    std::call_once(devices_once, devices_init);
    return ndevices;
}

cudaError_t device_ok()
{
    if (device_count() == 0)
        return cudaErrorNoDevice;
    return tl_device < ndevices ? cudaSuccess : cudaErrorInvalidDevice;
}

} // namespace

extern "C" int emu_device_count(void)
{
    return device_count();
}

extern "C" int emu_device_physical(int visible)
{
    return visible >= 0 && visible < device_count() ? devices[visible]->physical : -1;
}

extern "C" cudaError_t cudaGetDeviceCount(int *count)
{
    *count = device_count();
    return *count ? cudaSuccess : cudaErrorNoDevice;
}

extern "C" cudaError_t cudaGetDeviceProperties(cudaDeviceProp *prop, int i)
{
    if (device_count() == 0)
        return cudaErrorNoDevice;
    if (i < 0 || i >= ndevices)
        return cudaErrorInvalidDevice;
    memset(prop, 0, sizeof *prop);
    const int phys = devices[i]->physical;
    snprintf(prop->name, sizeof prop->name, "ddpd emulated GPU %d", phys);
    /* GPU-dd9de000-0000-0000-0000-<physical>: recognisably not a real board's. */
    const unsigned char u[16] = {0xdd, 0x9d, 0xe0, 0x00, 0, 0, 0, 0,
                                 0,    0,    0,    0,    0, 0, 0, (unsigned char)phys};
    memcpy(prop->uuid.bytes, u, sizeof u);
    prop->totalGlobalMem = device_memory;
    prop->major = devices[i]->cc_major;
    prop->minor = devices[i]->cc_minor;
    prop->multiProcessorCount = 1;
    prop->warpSize = 32;
    prop->maxThreadsPerBlock = 1024;
    return cudaSuccess;
}

extern "C" cudaError_t cudaSetDevice(int i)
{
    if (device_count() == 0)
        return cudaErrorNoDevice;
    if (i < 0 || i >= ndevices)
        return cudaErrorInvalidDevice;
    tl_device = i;
    return cudaSuccess;
}

extern "C" cudaError_t cudaGetDevice(int *i)
{
    if (device_count() == 0)
        return cudaErrorNoDevice;
    *i = tl_device;
    return cudaSuccess;
}

/* ---- the driver's choice of code ---- */

extern "C" const char *emuModuleCode(void)
{
    device_count(); /* reads DDPD_CUDA_EMU_CODE */
    return module_code;
}

/* What a driver runs of the module's fat binary on device `visible`: the newest cubin
 * sm_XY of the device's own major version X with Y at most its minor (sm_XYa only on X.Y
 * itself), else PTX compute_XY not newer than the device, compiled for it. *binary is the
 * cubin's version (or the device's, for PTX), *ptx the PTX's (0 for a cubin), as
 * cudaFuncGetAttributes reports them. False when nothing there runs on the device. */
extern "C" bool emu_code_for_device(int visible, int *binary, int *ptx)
{
    if (visible < 0 || visible >= device_count())
        return false;
    const int major = devices[visible]->cc_major, minor = devices[visible]->cc_minor;
    const int cc = major * 10 + minor;
    int cubin = -1, jit = -1;
    for (const char *p = module_code; *p;) {
        const size_t len = strcspn(p, " ,");
        char item[32];
        snprintf(item, sizeof item, "%.*s", (int)(len < 31 ? len : 31), p);
        int v = 0, n = 0;
        char suffix[4] = "";
        if (sscanf(item, "sm_%d%n", &v, &n) == 1) {
            snprintf(suffix, sizeof suffix, "%s", item + n);
            const bool exact = !strcmp(suffix, "a");
            if ((exact ? v == cc : !suffix[0] && v / 10 == major && v % 10 <= minor) && v > cubin)
                cubin = v;
        } else if (sscanf(item, "compute_%d%n", &v, &n) == 1 && !item[n] && v <= cc && v > jit) {
            jit = v;
        }
        p += len;
        p += strspn(p, " ,");
    }
    if (cubin < 0 && jit < 0)
        return false;
    *binary = cubin >= 0 ? cubin : cc;
    *ptx = cubin >= 0 ? 0 : jit;
    return true;
}

extern "C" cudaError_t cudaFuncGetAttributes(struct cudaFuncAttributes *attr, const void *func)
{
    STICKY_GUARD();
    cudaError_t e = device_ok();
    if (e != cudaSuccess)
        return e;
    if (!func)
        return cudaErrorInvalidValue;
    memset(attr, 0, sizeof *attr);
    if (!emu_code_for_device(tl_device, &attr->binaryVersion, &attr->ptxVersion))
        return cudaErrorNoKernelImageForDevice;
    attr->maxThreadsPerBlock = 1024;
    return cudaSuccess;
}

/* ---- memory ---- */

namespace
{

struct alloc {
    char *map;       /* the mapping: data pages, then one guard page */
    size_t data_len; /* bytes of data pages */
    char *ptr;       /* what the caller got: the last `size` bytes (rounded to 4) of the data pages */
    size_t size;
    enum emu_mem kind;
    int device;
};

/* On the heap and never freed: stream threads may run while exit() destroys statics. */
std::mutex &mem_mu = *new std::mutex;
std::map<uintptr_t, alloc> &allocs = *new std::map<uintptr_t, alloc>; /* by ptr */
int active;                                                           /* streams executing work */
size_t page_size;

/* The allocation holding p, or NULL (mem_mu held). */
const alloc *find_locked(const void *p)
{
    const uintptr_t a = (uintptr_t)p;
    auto it = allocs.upper_bound(a);
    if (it == allocs.begin())
        return nullptr;
    --it;
    const alloc &al = it->second;
    return a >= (uintptr_t)al.map && a < (uintptr_t)al.map + al.data_len + page_size ? &al : nullptr;
}

/* Device memory opens while any stream executes work and closes when none does. */
void protect_all_locked(int prot)
{
    for (auto &kv : allocs)
        if (kv.second.kind == EMU_MEM_DEVICE && mprotect(kv.second.map, kv.second.data_len, prot) != 0) {
            fprintf(stderr, "ddpd cuda emulator: mprotect: %s\n", strerror(errno));
            abort();
        }
}

void device_enter()
{
    std::lock_guard<std::mutex> g(mem_mu);
    if (active++ == 0)
        protect_all_locked(PROT_READ | PROT_WRITE);
}

void device_leave()
{
    std::lock_guard<std::mutex> g(mem_mu);
    if (--active == 0)
        protect_all_locked(PROT_NONE);
}

cudaError_t map_alloc(void **out, size_t bytes, enum emu_mem kind)
{
    if (!page_size)
        page_size = (size_t)sysconf(_SC_PAGESIZE);
    const size_t size4 = (bytes + 3) & ~(size_t)3;
    const size_t data_len = (size4 + page_size - 1) / page_size * page_size;
    std::lock_guard<std::mutex> g(mem_mu);
    const int prot = kind != EMU_MEM_DEVICE || active ? PROT_READ | PROT_WRITE : PROT_NONE;
    void *m = mmap(NULL, data_len + page_size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED)
        return cudaErrorMemoryAllocation;
    if (prot != PROT_NONE && mprotect(m, data_len, prot) != 0) {
        munmap(m, data_len + page_size);
        return cudaErrorMemoryAllocation;
    }
    alloc al;
    al.map = (char *)m;
    al.data_len = data_len;
    al.ptr = al.map + data_len - size4;
    al.size = bytes;
    al.kind = kind;
    al.device = tl_device;
    allocs[(uintptr_t)al.ptr] = al;
    *out = al.ptr;
    return cudaSuccess;
}

/* Unmaps the allocation starting at p; false when p starts none of `kind`. */
bool unmap_alloc(void *p, enum emu_mem kind, size_t *size, int *dev)
{
    std::lock_guard<std::mutex> g(mem_mu);
    auto it = allocs.find((uintptr_t)p);
    if (it == allocs.end() || it->second.kind != kind)
        return false;
    *size = it->second.size;
    *dev = it->second.device;
    munmap(it->second.map, it->second.data_len + page_size);
    allocs.erase(it);
    return true;
}

/* Where [p, p + bytes) lies, with the allocation; EMU_MEM_HOST and *over > 0 when it starts
 * inside an allocation and runs past its end. */
enum emu_mem classify(const void *p, size_t bytes, alloc *out, size_t *over)
{
    std::lock_guard<std::mutex> g(mem_mu);
    *over = 0;
    const alloc *al = find_locked(p);
    if (!al || (const char *)p < al->ptr)
        return EMU_MEM_HOST;
    if (out)
        *out = *al;
    const size_t off = (size_t)((const char *)p - al->ptr);
    if (off + bytes > al->size) {
        *over = off + bytes - al->size;
        return EMU_MEM_HOST;
    }
    return al->kind;
}

} // namespace

extern "C" enum emu_mem emu_mem_kind(const void *p, size_t bytes)
{
    size_t over;
    return classify(p, bytes ? bytes : 1, nullptr, &over);
}

extern "C" void emu_mem_describe(const void *p, char *out, size_t cap)
{
    alloc al;
    size_t over;
    std::lock_guard<std::mutex> g(mem_mu);
    const alloc *a = find_locked(p);
    if (a && (const char *)p >= a->ptr) {
        al = *a;
        const size_t off = (size_t)((const char *)p - al.ptr);
        snprintf(out, cap, "%s (an allocation of %zu bytes at %p, offset %zu%s)",
                 al.kind == EMU_MEM_DEVICE ? "device memory" : "pinned host memory", al.size, (void *)al.ptr,
                 off, off >= al.size ? ", past its end" : "");
    } else {
        (void)over;
        snprintf(out, cap, "%p, which is not device memory (a host pointer?)", p);
    }
}

namespace emu
{
bool check_pointer_arg(const char *kernel, int index, const void *p)
{
    if (!p)
        return true;
    size_t over;
    const enum emu_mem k = classify(p, 1, nullptr, &over);
    if (k == EMU_MEM_DEVICE || k == EMU_MEM_PINNED)
        return true;
    char what[256];
    emu_mem_describe(p, what, sizeof what);
    set_last_error(
        emu_error_sticky(cudaErrorIllegalAddress, "kernel %s: argument %d is %s", kernel, index, what));
    return false;
}
} // namespace emu

/* ---- streams ---- */

struct emu_stream {
    int device;
    bool blocking; /* synchronises with the legacy default stream */
    bool legacy;
    std::mutex mu;
    std::condition_variable cv;      /* work arrived, or stop */
    std::condition_variable idle_cv; /* work done */
    struct item {
        std::function<void()> fn;
        bool always; /* bookkeeping (events, waits): runs even after a sticky error */
    };
    std::deque<item> q;
    uint64_t queued = 0, done = 0;
    bool stop = false;
    std::thread th;
};

namespace
{

std::mutex &streams_mu = *new std::mutex;
std::vector<emu_stream *> &streams = *new std::vector<emu_stream *>;
emu_stream *legacy[MAX_DEVICES];

void stream_main(emu_stream *s)
{
    /* A kernel whose fiber overflows its stack faults on a guard page: the handler needs a
     * stack of its own to say so. */
    stack_t alt;
    alt.ss_size = 64 * 1024;
    alt.ss_sp = malloc(alt.ss_size);
    alt.ss_flags = 0;
    if (alt.ss_sp)
        sigaltstack(&alt, NULL);
    tl_device = s->device;
    bool entered = false;
    std::unique_lock<std::mutex> lk(s->mu);
    for (;;) {
        if (s->q.empty()) {
            if (entered) {
                lk.unlock();
                device_leave();
                entered = false;
                lk.lock();
                continue;
            }
            if (s->stop)
                break;
            s->cv.wait(lk);
            continue;
        }
        emu_stream::item it = std::move(s->q.front());
        s->q.pop_front();
        lk.unlock();
        if (!entered) {
            device_enter();
            entered = true;
        }
        if (it.always || emu::sticky_error() == cudaSuccess)
            it.fn();
        it.fn = nullptr; /* releases what the work captured, on this thread */
        lk.lock();
        if (s->q.empty()) {
            /* Closed again before anyone hears the stream is idle: a host that synchronises
             * and then dereferences a device pointer faults, every time. */
            lk.unlock();
            device_leave();
            entered = false;
            lk.lock();
        }
        s->done++;
        s->idle_cv.notify_all();
    }
    lk.unlock();
    stack_t off = {};
    off.ss_flags = SS_DISABLE;
    sigaltstack(&off, NULL);
    free(alt.ss_sp);
}

emu_stream *stream_new(int dev, bool blocking, bool is_legacy)
{
    emu_stream *s = new emu_stream();
    s->device = dev;
    s->blocking = blocking;
    s->legacy = is_legacy;
    s->th = std::thread(stream_main, s);
    std::lock_guard<std::mutex> g(streams_mu);
    streams.push_back(s);
    return s;
}

/* The stream a call means: NULL is the current device's legacy default stream. */
emu_stream *resolve(cudaStream_t s)
{
    if (s)
        return s;
    std::lock_guard<std::mutex> g(streams_mu);
    if (!legacy[tl_device]) {
        emu_stream *l = new emu_stream();
        l->device = tl_device;
        l->blocking = true;
        l->legacy = true;
        l->th = std::thread(stream_main, l);
        streams.push_back(l);
        legacy[tl_device] = l;
    }
    return legacy[tl_device];
}

void push(emu_stream *s, std::function<void()> fn, bool always)
{
    std::lock_guard<std::mutex> g(s->mu);
    s->q.push_back({std::move(fn), always});
    s->queued++;
    s->cv.notify_one();
}

uint64_t mark(emu_stream *s)
{
    std::lock_guard<std::mutex> g(s->mu);
    return s->queued;
}

void wait_mark(emu_stream *s, uint64_t m)
{
    std::unique_lock<std::mutex> lk(s->mu);
    s->idle_cv.wait(lk, [&] { return s->done >= m; });
}

/* Work for the legacy stream waits for every blocking stream's work so far, and a blocking
 * stream's work waits for the legacy stream's (CUDA's implicit synchronisation). */
void order_with_legacy(emu_stream *s)
{
    if (!s->blocking)
        return;
    std::vector<std::pair<emu_stream *, uint64_t>> waits;
    {
        std::lock_guard<std::mutex> g(streams_mu);
        for (emu_stream *o : streams)
            if (o != s && o->device == s->device && o->blocking && (s->legacy || o->legacy))
                waits.push_back({o, 0});
    }
    for (auto &w : waits) {
        w.second = mark(w.first);
        emu_stream *o = w.first;
        const uint64_t m = w.second;
        push(
            s, [o, m] { wait_mark(o, m); }, true);
    }
}

/* Waits until every stream of device `dev` has finished the work queued so far. */
void device_sync(int dev)
{
    std::vector<std::pair<emu_stream *, uint64_t>> marks;
    {
        std::lock_guard<std::mutex> g(streams_mu);
        for (emu_stream *s : streams)
            if (s->device == dev)
                marks.push_back({s, 0});
    }
    for (auto &m : marks)
        m.second = mark(m.first);
    for (auto &m : marks)
        wait_mark(m.first, m.second);
}

} // namespace

namespace emu
{
cudaError_t enqueue(cudaStream_t st, std::function<void()> work)
{
    STICKY_GUARD();
    cudaError_t e = device_ok();
    if (e != cudaSuccess)
        return e;
    emu_stream *s = resolve(st);
    order_with_legacy(s);
    push(s, std::move(work), false);
    return cudaSuccess;
}
} // namespace emu

extern "C" cudaError_t emu_stream_enqueue(cudaStream_t st, void (*fn)(void *), void *arg,
                                          void (*release)(void *))
{
    struct owner {
        void (*release)(void *);
        void *arg;
        ~owner()
        {
            if (release)
                release(arg);
        }
    };
    auto o = std::make_shared<owner>();
    o->release = release;
    o->arg = arg;
    cudaError_t e = emu::enqueue(st, [fn, arg, o] { fn(arg); });
    return e;
}

extern "C" int emu_stream_device(cudaStream_t s)
{
    return s ? s->device : tl_device;
}

extern "C" cudaError_t cudaStreamCreateWithFlags(cudaStream_t *out, unsigned flags)
{
    STICKY_GUARD();
    cudaError_t e = device_ok();
    if (e != cudaSuccess)
        return e;
    *out = stream_new(tl_device, !(flags & cudaStreamNonBlocking), false);
    return cudaSuccess;
}

extern "C" cudaError_t cudaStreamCreate(cudaStream_t *out)
{
    return cudaStreamCreateWithFlags(out, cudaStreamDefault);
}

/* CUDA returns at once and releases the stream when its work is done; the thread that
 * runs the work is joined here, after the work. */
extern "C" cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    if (!s)
        return cudaErrorInvalidResourceHandle;
    {
        std::lock_guard<std::mutex> g(streams_mu);
        for (size_t i = 0; i < streams.size(); i++)
            if (streams[i] == s) {
                streams.erase(streams.begin() + (long)i);
                break;
            }
    }
    {
        std::lock_guard<std::mutex> g(s->mu);
        s->stop = true;
        s->cv.notify_one();
    }
    s->th.join();
    delete s;
    return cudaSuccess;
}

extern "C" cudaError_t cudaStreamSynchronize(cudaStream_t st)
{
    if (device_ok() != cudaSuccess)
        return device_ok();
    emu_stream *s = resolve(st);
    wait_mark(s, mark(s));
    return emu::sticky_error();
}

extern "C" cudaError_t cudaStreamQuery(cudaStream_t st)
{
    STICKY_GUARD();
    emu_stream *s = resolve(st);
    std::lock_guard<std::mutex> g(s->mu);
    return s->done >= s->queued ? cudaSuccess : cudaErrorNotReady;
}

extern "C" cudaError_t cudaDeviceSynchronize(void)
{
    cudaError_t e = device_ok();
    if (e != cudaSuccess)
        return e;
    device_sync(tl_device);
    return emu::sticky_error();
}

extern "C" cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void *user)
{
    return emu::enqueue(s, [fn, user] { fn(user); });
}

/* ---- events ---- */

namespace
{
struct event_state {
    std::mutex mu;
    std::condition_variable cv;
    uint64_t recorded = 0, completed = 0; /* records asked for, and reached by their streams */
};
} // namespace

struct emu_event {
    std::shared_ptr<event_state> s; /* outlives the handle while recorded work is pending */
};

extern "C" cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags)
{
    (void)flags;
    STICKY_GUARD();
    *e = new emu_event{std::make_shared<event_state>()};
    return cudaSuccess;
}

extern "C" cudaError_t cudaEventCreate(cudaEvent_t *e)
{
    return cudaEventCreateWithFlags(e, cudaEventDefault);
}

extern "C" cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    if (!e)
        return cudaErrorInvalidResourceHandle;
    delete e;
    return cudaSuccess;
}

extern "C" cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t st)
{
    STICKY_GUARD();
    if (!e)
        return cudaErrorInvalidResourceHandle;
    cudaError_t err = device_ok();
    if (err != cudaSuccess)
        return err;
    std::shared_ptr<event_state> es = e->s;
    uint64_t gen;
    {
        std::lock_guard<std::mutex> g(es->mu);
        gen = ++es->recorded;
    }
    emu_stream *s = resolve(st);
    order_with_legacy(s);
    push(
        s,
        [es, gen] {
            std::lock_guard<std::mutex> g(es->mu);
            if (es->completed < gen)
                es->completed = gen;
            es->cv.notify_all();
        },
        true);
    return cudaSuccess;
}

extern "C" cudaError_t cudaEventQuery(cudaEvent_t e)
{
    STICKY_GUARD();
    if (!e)
        return cudaErrorInvalidResourceHandle;
    std::lock_guard<std::mutex> g(e->s->mu);
    return e->s->completed >= e->s->recorded ? cudaSuccess : cudaErrorNotReady;
}

extern "C" cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    if (!e)
        return cudaErrorInvalidResourceHandle;
    std::shared_ptr<event_state> es = e->s;
    std::unique_lock<std::mutex> lk(es->mu);
    const uint64_t gen = es->recorded;
    es->cv.wait(lk, [&] { return es->completed >= gen; });
    return emu::sticky_error();
}

extern "C" cudaError_t cudaStreamWaitEvent(cudaStream_t st, cudaEvent_t e, unsigned flags)
{
    (void)flags;
    STICKY_GUARD();
    if (!e)
        return cudaErrorInvalidResourceHandle;
    cudaError_t err = device_ok();
    if (err != cudaSuccess)
        return err;
    std::shared_ptr<event_state> es = e->s;
    uint64_t gen;
    {
        std::lock_guard<std::mutex> g(es->mu);
        gen = es->recorded; /* the record most recent now: later ones do not count */
    }
    emu_stream *s = resolve(st);
    order_with_legacy(s);
    push(
        s,
        [es, gen] {
            std::unique_lock<std::mutex> lk(es->mu);
            es->cv.wait(lk, [&] { return es->completed >= gen; });
        },
        true);
    return cudaSuccess;
}

/* ---- allocation ---- */

extern "C" cudaError_t cudaMalloc(void **p, size_t bytes)
{
    STICKY_GUARD();
    cudaError_t e = device_ok();
    if (e != cudaSuccess)
        return e;
    *p = NULL;
    if (!bytes)
        return cudaSuccess;
    device *d = devices[tl_device];
    if (bytes > device_memory || d->used.fetch_add(bytes) + bytes > device_memory) {
        if (bytes <= device_memory)
            d->used.fetch_sub(bytes);
        return cudaErrorMemoryAllocation;
    }
    e = map_alloc(p, bytes, EMU_MEM_DEVICE);
    if (e != cudaSuccess)
        d->used.fetch_sub(bytes);
    return e;
}

static cudaError_t free_device(void *p)
{
    size_t size;
    int dev;
    if (!unmap_alloc(p, EMU_MEM_DEVICE, &size, &dev)) {
        char what[256];
        emu_mem_describe(p, what, sizeof what);
        return emu_error(cudaErrorInvalidValue, "cudaFree(%p): not a pointer cudaMalloc returned: %s", p,
                         what);
    }
    devices[dev]->used.fetch_sub(size);
    return cudaSuccess;
}

/* cudaFree waits for the device first, as CUDA's does. */
extern "C" cudaError_t cudaFree(void *p)
{
    if (!p)
        return cudaSuccess;
    if (device_count() == 0)
        return cudaErrorNoDevice;
    device_sync(tl_device);
    return free_device(p);
}

/* Stream-ordered: the memory exists at once, and is released when the stream gets there. */
extern "C" cudaError_t cudaMallocAsync(void **p, size_t bytes, cudaStream_t s)
{
    (void)s;
    return cudaMalloc(p, bytes);
}

extern "C" cudaError_t cudaFreeAsync(void *p, cudaStream_t s)
{
    if (!p)
        return cudaSuccess;
    size_t over;
    if (classify(p, 1, nullptr, &over) != EMU_MEM_DEVICE)
        return free_device(p); /* reports it */
    return emu::enqueue(s, [p] { free_device(p); });
}

extern "C" cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned flags)
{
    (void)flags;
    STICKY_GUARD();
    if (device_count() == 0)
        return cudaErrorNoDevice;
    return map_alloc(p, bytes ? bytes : 1, EMU_MEM_PINNED);
}

extern "C" cudaError_t cudaMallocHost(void **p, size_t bytes)
{
    return cudaHostAlloc(p, bytes, cudaHostAllocDefault);
}

extern "C" cudaError_t cudaFreeHost(void *p)
{
    if (!p)
        return cudaSuccess;
    if (device_count() == 0)
        return cudaErrorNoDevice;
    device_sync(tl_device);
    size_t size;
    int dev;
    if (!unmap_alloc(p, EMU_MEM_PINNED, &size, &dev)) {
        char what[256];
        emu_mem_describe(p, what, sizeof what);
        return emu_error(cudaErrorInvalidValue, "cudaFreeHost(%p): not a pointer cudaHostAlloc returned: %s",
                         p, what);
    }
    return cudaSuccess;
}

extern "C" cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p)
{
    alloc al;
    size_t over;
    memset(a, 0, sizeof *a);
    const enum emu_mem k = classify(p, 1, &al, &over);
    a->type = k == EMU_MEM_DEVICE   ? cudaMemoryTypeDevice
              : k == EMU_MEM_PINNED ? cudaMemoryTypeHost
                                    : cudaMemoryTypeUnregistered;
    a->device = k == EMU_MEM_HOST ? -1 : al.device;
    a->devicePointer = k == EMU_MEM_HOST ? NULL : (void *)p;
    a->hostPointer = k == EMU_MEM_DEVICE ? NULL : (void *)p;
    return cudaSuccess;
}

/* ---- copies ---- */

static const char *kind_name(enum cudaMemcpyKind k)
{
    switch (k) {
    case cudaMemcpyHostToHost: return "cudaMemcpyHostToHost";
    case cudaMemcpyHostToDevice: return "cudaMemcpyHostToDevice";
    case cudaMemcpyDeviceToHost: return "cudaMemcpyDeviceToHost";
    case cudaMemcpyDeviceToDevice: return "cudaMemcpyDeviceToDevice";
    default: return "cudaMemcpyDefault";
    }
}

/* One side of a copy: device or not, and the whole range inside its allocation. */
static cudaError_t copy_side(const char *call, const char *side, const void *p, size_t bytes,
                             bool want_device, enum cudaMemcpyKind kind, enum emu_mem *got)
{
    size_t over;
    alloc al;
    *got = classify(p, bytes, &al, &over);
    if (over)
        return emu_error(cudaErrorInvalidValue,
                         "%s: the %s (%p, %zu bytes) runs %zu bytes past the end of its "
                         "allocation of %zu bytes",
                         call, side, p, bytes, over, al.size);
    if ((*got == EMU_MEM_DEVICE) != want_device) {
        char what[256];
        emu_mem_describe(p, what, sizeof what);
        return emu_error(cudaErrorInvalidValue, "%s(%s): the %s is %s", call, kind_name(kind), side,
                         want_device ? what : "device memory");
    }
    return cudaSuccess;
}

extern "C" cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                                       cudaStream_t s)
{
    STICKY_GUARD();
    cudaError_t e = device_ok();
    if (e != cudaSuccess)
        return e;
    if (!bytes)
        return cudaSuccess;
    if (kind == cudaMemcpyDefault) {
        const bool dd = emu_mem_kind(dst, bytes) == EMU_MEM_DEVICE,
                   sd = emu_mem_kind(src, bytes) == EMU_MEM_DEVICE;
        kind = dd ? (sd ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                  : (sd ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
    }
    if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDeviceToDevice)
        return emu_error(cudaErrorInvalidMemcpyDirection, "cudaMemcpyAsync: copy kind %d", (int)kind);
    const bool dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    const bool src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    enum emu_mem dk, sk;
    if ((e = copy_side("cudaMemcpyAsync", "destination", dst, bytes, dst_dev, kind, &dk)) != cudaSuccess ||
        (e = copy_side("cudaMemcpyAsync", "source", src, bytes, src_dev, kind, &sk)) != cudaSuccess)
        return e;
    if (!src_dev && sk == EMU_MEM_HOST) {
        /* From pageable memory the driver stages the source before the call returns. */
        auto staged = std::make_shared<std::vector<char>>((const char *)src, (const char *)src + bytes);
        return emu::enqueue(s, [dst, staged] { memcpy(dst, staged->data(), staged->size()); });
    }
    e = emu::enqueue(s, [dst, src, bytes] { memcpy(dst, src, bytes); });
    if (e == cudaSuccess && !dst_dev && dk == EMU_MEM_HOST) {
        /* Into pageable memory the call returns once the copy is done. */
        emu_stream *st = resolve(s);
        wait_mark(st, mark(st));
        e = emu::sticky_error();
    }
    return e;
}

extern "C" cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind)
{
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, NULL);
    return e == cudaSuccess ? cudaStreamSynchronize(NULL) : e;
}

extern "C" cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t s)
{
    STICKY_GUARD();
    cudaError_t e = device_ok();
    if (e != cudaSuccess)
        return e;
    if (!bytes)
        return cudaSuccess;
    enum emu_mem k;
    if ((e = copy_side("cudaMemsetAsync", "destination", p, bytes, true, cudaMemcpyHostToDevice, &k)) !=
        cudaSuccess)
        return e;
    return emu::enqueue(s, [p, value, bytes] { memset(p, value, bytes); });
}

extern "C" cudaError_t cudaMemset(void *p, int value, size_t bytes)
{
    cudaError_t e = cudaMemsetAsync(p, value, bytes, NULL);
    return e == cudaSuccess ? cudaStreamSynchronize(NULL) : e;
}

/* ---- faults: say what a SIGSEGV in device memory or a kernel was ---- */

namespace
{

struct sigaction previous;

void say(const char *s)
{
    size_t n = strlen(s);
    while (n > 0) {
        ssize_t w = write(2, s, n);
        if (w <= 0)
            return;
        s += w;
        n -= (size_t)w;
    }
}

void on_fault(int sig, siginfo_t *si, void *uc)
{
    const void *addr = si->si_addr;
    char where[256] = "", what[320] = "", line[700];
    const bool in_kernel = emu::describe_running_kernel(where, sizeof where);
    bool ours = false;
    if (emu::on_fiber_guard(addr)) {
        snprintf(what, sizeof what,
                 "the CUDA thread's stack overflowed (the emulator's fiber stacks are small)");
        ours = true;
    } else if (mem_mu.try_lock()) {
        const alloc *al = find_locked(addr);
        if (al && al->kind == EMU_MEM_DEVICE) {
            ours = true;
            const char *a = (const char *)addr;
            if (a >= al->map + al->data_len)
                snprintf(what, sizeof what,
                         "an out-of-bounds access at %p, %zu bytes past the end of an allocation of %zu "
                         "bytes at %p",
                         addr, (size_t)(a - (al->ptr + al->size)), al->size, (void *)al->ptr);
            else if (a < al->ptr)
                snprintf(what, sizeof what,
                         "an out-of-bounds access at %p, %zu bytes before an allocation of %zu bytes at %p",
                         addr, (size_t)(al->ptr - a), al->size, (void *)al->ptr);
            else
                snprintf(
                    what, sizeof what,
                    "host code dereferenced device memory at %p (an allocation of %zu bytes at %p): device "
                    "memory is not host memory",
                    addr, al->size, (void *)al->ptr);
        }
        mem_mu.unlock();
    }
    if (ours || in_kernel) {
        snprintf(line, sizeof line, "ddpd cuda emulator: %s%s%s\n", in_kernel ? where : "",
                 in_kernel ? ": " : "", ours ? what : "a memory fault");
        say(line);
    }
    /* Let the fault happen again, now with the handler that was there before (the default
     * one ends the process with SIGSEGV). */
    if ((previous.sa_flags & SA_SIGINFO) && previous.sa_sigaction) {
        previous.sa_sigaction(sig, si, uc);
        return;
    }
    sigaction(sig, &previous, NULL);
}

void install_fault_handler()
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &previous);
}

} // namespace
