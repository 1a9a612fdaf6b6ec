/* test_emu.cc — the emulated CUDA device's self-tests: each bug class it exists to catch,
 * seeded on purpose into a small kernel or call, must fail, and the same code without the
 * bug must pass (so a green run of the GPU suites on the emulator means something). The
 * classes: a missing __syncthreads (before a read, and between two uses of the same
 * scratch), a shuffle that reads a lane which never wrote, a host
 * pointer passed to a kernel, a device pointer read on the host, a wrong lda, a missing
 * stream synchronisation (within a stream and across two), an out-of-bounds read; also a
 * barrier not every thread reaches. Each case runs in a child process (a fault ends it, and
 * the emulator's sticky errors are per process); the parent checks how it ended and what
 * the emulator printed. Compiled by g++ against emu.h and linked with the emulator's
 * runtime, as the .cu files of worker/cuda are. */
#include <cblas.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <string>

#include "emu.h"
#include "include/cublas_v2.h"

#define LAUNCH(k, grid, block, stream, ...) emu_launch(#k, k, (grid), (block), 0, (stream), __VA_ARGS__)

/* What a case's child reports by its exit status. */
enum { RIGHT = 0, WRONG = 1, REFUSED = 2, SETUP = 3 };

static int checks, failures;

#define EXPECT(cond, ...)                                                                                    \
    do {                                                                                                     \
        checks++;                                                                                            \
        if (!(cond)) {                                                                                       \
            failures++;                                                                                      \
            fprintf(stderr, "%s:%d: FAILED: ", __FILE__, __LINE__);                                          \
            fprintf(stderr, __VA_ARGS__);                                                                    \
            fputc('\n', stderr);                                                                             \
        }                                                                                                    \
    } while (0)

#define CK(call)                                                                                             \
    do {                                                                                                     \
        if ((call) != cudaSuccess) {                                                                         \
            fprintf(stderr, "%s: %s\n", #call, cudaGetErrorString(cudaGetLastError()));                      \
            _exit(SETUP);                                                                                    \
        }                                                                                                    \
    } while (0)

/* ---- kernels: each with its bug behind a flag ---- */

/* Block-wide reverse through shared memory: needs a barrier between the writes and the reads. */
__global__ void k_reverse(float *y, const float *x, bool barrier)
{
    __shared__ float s[256];
    const unsigned t = threadIdx.x, n = blockDim.x;
    s[t] = x[blockIdx.x * n + t];
    if (barrier)
        __syncthreads();
    y[blockIdx.x * n + t] = s[n - 1 - t];
}

/* The block's sum in thread 0: warp sums, then warp 0 adds the warps' (block_sum of dev.cu). */
__device__ float block_sum(float v)
{
    __shared__ float part[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_down_sync(0xffffffffu, v, o);
    if (lane == 0)
        part[warp] = v;
    __syncthreads();
    v = threadIdx.x < (blockDim.x >> 5) ? part[threadIdx.x] : 0.0f;
    if (warp == 0)
        for (int o = 16; o > 0; o >>= 1)
            v += __shfl_down_sync(0xffffffffu, v, o);
    return v;
}

/* Two sums through the same scratch: the second may only start writing it once every
 * warp has read the first's (the barrier dev.cu's k_bn_stats has). */
__global__ void k_two_sums(float *out, const float *x, const float *y, bool barrier)
{
    const float a = block_sum(x[threadIdx.x]);
    if (barrier)
        __syncthreads();
    const float b = block_sum(y[threadIdx.x]);
    if (threadIdx.x == 0) {
        out[0] = a;
        out[1] = b;
    }
}

/* A warp's sum by xor shuffles; `half` leaves lanes 16..31 out of the shuffle that still
 * names them in its mask, so lanes 0..15 would read values never written. */
__global__ void k_warp_sum(float *y, const float *x, bool half)
{
    float v = x[threadIdx.x];
    const int lane = threadIdx.x & 31;
    if (half && lane >= 16)
        return;
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0)
        y[threadIdx.x >> 5] = v;
}

/* The same, with a mask of lanes 0..15 whose partners (xor 16) lie outside it. */
__global__ void k_warp_outside(float *y, const float *x)
{
    float v = x[threadIdx.x];
    if ((threadIdx.x & 31) < 16)
        v += __shfl_xor_sync(0x0000ffffu, v, 16);
    y[threadIdx.x] = v;
}

/* A barrier inside a branch that half the block skips while the other half waits. */
__global__ void k_divergent_barrier(float *y)
{
    if (threadIdx.x < 16) {
        __syncthreads();
        y[threadIdx.x] = 1.0f;
    } else {
        while (y[0] == 0.0f)
            __syncwarp();
    }
}

__global__ void k_scale(float *y, const float *x, float a, int n)
{
    const int i = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (i < n)
        y[i] = a * x[i];
}

/* Reads x[i + shift]: shift 1 reads one past the end of x for the last thread. */
__global__ void k_shifted(float *y, const float *x, int n, int shift)
{
    const int i = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (i < n)
        y[i] = x[i + shift];
}

/* ---- the cases: run in the child, exit with RIGHT, WRONG or REFUSED ---- */

static float *dev_upload(const float *h, int n)
{
    float *d;
    CK(cudaMalloc((void **)&d, (size_t)n * sizeof(float)));
    CK(cudaMemcpy(d, h, (size_t)n * sizeof(float), cudaMemcpyHostToDevice));
    return d;
}

static int case_syncthreads(bool bug)
{
    enum { B = 256, G = 3, N = B * G };
    float x[N], y[N];
    for (int i = 0; i < N; i++)
        x[i] = (float)i;
    float *dx = dev_upload(x, N), *dy;
    CK(cudaMalloc((void **)&dy, sizeof y));
    LAUNCH(k_reverse, G, B, 0, dy, dx, !bug);
    CK(cudaGetLastError());
    CK(cudaMemcpy(y, dy, sizeof y, cudaMemcpyDeviceToHost));
    for (int b = 0; b < G; b++)
        for (int t = 0; t < B; t++)
            if (y[b * B + t] != x[b * B + B - 1 - t])
                return WRONG;
    return RIGHT;
}

static int case_scratch_reuse(bool bug)
{
    enum { N = 128 };
    float x[N], y[N], out[2], want[2] = {0, 0};
    for (int i = 0; i < N; i++) {
        x[i] = (float)(i % 5);
        y[i] = 100.0f + (float)i;
        want[0] += x[i];
        want[1] += y[i];
    }
    float *dx = dev_upload(x, N), *dy = dev_upload(y, N), *dout;
    CK(cudaMalloc((void **)&dout, sizeof out));
    LAUNCH(k_two_sums, 1, N, 0, dout, dx, dy, !bug);
    CK(cudaGetLastError());
    CK(cudaMemcpy(out, dout, sizeof out, cudaMemcpyDeviceToHost));
    return out[0] == want[0] && out[1] == want[1] ? RIGHT : WRONG;
}

static int case_shuffle(int variant)
{
    enum { N = 64 };
    float x[N], y[N];
    for (int i = 0; i < N; i++)
        x[i] = 1.0f + (float)i;
    float *dx = dev_upload(x, N), *dy;
    CK(cudaMalloc((void **)&dy, sizeof y));
    if (variant == 2)
        LAUNCH(k_warp_outside, 1, N, 0, dy, dx);
    else
        LAUNCH(k_warp_sum, 1, N, 0, dy, dx, variant == 1);
    CK(cudaGetLastError());
    if (cudaMemcpy(y, dy, sizeof y, cudaMemcpyDeviceToHost) != cudaSuccess)
        return REFUSED; /* the launch failed, and the emulator said why */
    if (variant != 0)
        return WRONG; /* ran without a complaint: a value was read before it was written */
    for (int w = 0; w < N / 32; w++) {
        float want = 0;
        for (int l = 0; l < 32; l++)
            want += x[w * 32 + l];
        if (y[w] != want)
            return WRONG;
    }
    return RIGHT;
}

static int case_divergent_barrier(void)
{
    float *dy;
    CK(cudaMalloc((void **)&dy, 32 * sizeof(float)));
    CK(cudaMemset(dy, 0, 32 * sizeof(float)));
    LAUNCH(k_divergent_barrier, 1, 32, 0, dy);
    return cudaDeviceSynchronize() == cudaErrorLaunchFailure ? REFUSED : WRONG;
}

static int case_host_pointer(bool bug)
{
    enum { N = 100 };
    static float host[N];
    float *dx = dev_upload(host, N), *dy;
    CK(cudaMalloc((void **)&dy, N * sizeof(float)));
    LAUNCH(k_scale, 1, 128, 0, dy, bug ? host : dx, 2.0f, (int)N);
    cudaError_t e = cudaGetLastError();
    if (e == cudaErrorIllegalAddress)
        return REFUSED;
    if (e != cudaSuccess)
        return SETUP;
    return cudaDeviceSynchronize() == cudaSuccess ? RIGHT : WRONG;
}

static int case_host_deref(bool bug)
{
    float one = 1.0f, back = 0;
    float *d = dev_upload(&one, 1);
    if (bug)
        back = *(volatile float *)d; /* the fault ends the child here */
    else
        CK(cudaMemcpy(&back, d, sizeof back, cudaMemcpyDeviceToHost));
    return back == 1.0f ? RIGHT : WRONG;
}

/* C = A B, column-major, A 5x3 (lda 5) in a buffer 16 floats longer, B 3x4, C 5x4; `lda`
 * is what the call says. */
static int case_lda(int lda)
{
    const int m = 5, k = 3, n = 4, ld_true = 5;
    float a[ld_true * k + 16], b[k * n], c[m * n], ref[m * n];
    for (int i = 0; i < ld_true * k + 16; i++)
        a[i] = (float)(i % 7) - 3.0f;
    for (int i = 0; i < k * n; i++)
        b[i] = (float)(i % 5) - 2.0f;
    cblas_sgemm(CblasColMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a, ld_true, b, k, 0.0f, ref, m);
    float *da = dev_upload(a, ld_true * k + 16), *db = dev_upload(b, k * n), *dc;
    CK(cudaMalloc((void **)&dc, sizeof c));
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS)
        return SETUP;
    const float one = 1.0f, zero = 0.0f;
    if (cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, da, lda, db, k, &zero, dc, m) !=
        CUBLAS_STATUS_SUCCESS)
        return REFUSED;
    CK(cudaMemcpy(c, dc, sizeof c, cudaMemcpyDeviceToHost));
    for (int i = 0; i < m * n; i++)
        if (c[i] != ref[i])
            return WRONG;
    return RIGHT;
}

/* Releases a stream held by a host function (the host decides when its work may start). */
static std::atomic<bool> gate_open;
static void gate(void *)
{
    while (!gate_open.load())
        usleep(100);
}

/* Within one stream: the host reads a pinned result that a kernel and a copy produce,
 * with or without waiting for the stream. */
static int case_stream_sync(bool bug)
{
    enum { N = 1000 };
    float x[N];
    for (int i = 0; i < N; i++)
        x[i] = (float)i;
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    float *dx = dev_upload(x, N), *dy, *pinned;
    CK(cudaMalloc((void **)&dy, N * sizeof(float)));
    CK(cudaHostAlloc((void **)&pinned, N * sizeof(float), cudaHostAllocDefault));
    memset(pinned, 0, N * sizeof(float));
    gate_open = false;
    CK(cudaLaunchHostFunc(s, gate, NULL)); /* the stream's work waits, as a busy GPU's would */
    LAUNCH(k_scale, (N + 127) / 128, 128, s, dy, dx, 3.0f, (int)N);
    CK(cudaMemcpyAsync(pinned, dy, N * sizeof(float), cudaMemcpyDeviceToHost, s));
    if (!bug) {
        gate_open = true;
        CK(cudaStreamSynchronize(s));
    }
    int rc = pinned[N - 1] == 3.0f * (float)(N - 1) ? RIGHT : WRONG;
    gate_open = true;
    CK(cudaStreamSynchronize(s));
    return rc;
}

/* Across two streams: stream B reads what stream A writes, with or without B waiting for
 * an event recorded on A. */
static int case_cross_stream(bool bug)
{
    enum { N = 500 };
    float x[N], y[N];
    for (int i = 0; i < N; i++)
        x[i] = 1.0f + (float)i;
    cudaStream_t a, b;
    cudaEvent_t ev;
    CK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
    CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    float *dx = dev_upload(x, N), *mid, *dy;
    CK(cudaMalloc((void **)&mid, N * sizeof(float)));
    CK(cudaMalloc((void **)&dy, N * sizeof(float)));
    gate_open = false;
    CK(cudaLaunchHostFunc(a, gate, NULL));
    LAUNCH(k_scale, (N + 127) / 128, 128, a, mid, dx, 2.0f, (int)N);
    CK(cudaEventRecord(ev, a));
    if (!bug)
        CK(cudaStreamWaitEvent(b, ev, 0));
    LAUNCH(k_scale, (N + 127) / 128, 128, b, dy, mid, 5.0f, (int)N);
    if (bug)
        CK(cudaStreamSynchronize(b)); /* b has all it needs but mid: it runs now */
    gate_open = true;
    CK(cudaStreamSynchronize(b));
    CK(cudaStreamSynchronize(a));
    CK(cudaMemcpy(y, dy, sizeof y, cudaMemcpyDeviceToHost));
    for (int i = 0; i < N; i++)
        if (y[i] != 10.0f * x[i])
            return WRONG;
    return RIGHT;
}

static int case_out_of_bounds(bool bug)
{
    enum { N = 1000 }; /* not a multiple of a page: the allocation ends mid-page */
    float x[N];
    for (int i = 0; i < N; i++)
        x[i] = (float)i;
    float *dx = dev_upload(x, N), *dy;
    CK(cudaMalloc((void **)&dy, N * sizeof(float)));
    /* Thread i reads x[i + 1]; the last one reads past the end unless n stops it. */
    LAUNCH(k_shifted, (N + 127) / 128, 128, 0, dy, dx, bug ? (int)N : (int)N - 1, 1);
    return cudaDeviceSynchronize() == cudaSuccess ? RIGHT : WRONG;
}

/* ---- the parent: run a case in a child, check how it ended ---- */

struct outcome {
    int status; /* waitpid's */
    std::string err;
};

static outcome run_child(int (*fn)(int), int arg)
{
    char path[] = "/tmp/ddpd-test-emu-XXXXXX";
    int fd = mkstemp(path);
    unlink(path);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd, 2);
        alarm(60); /* a hang is a failure too */
        _exit(fn(arg));
    }
    outcome o;
    waitpid(pid, &o.status, 0);
    lseek(fd, 0, SEEK_SET);
    char buf[4096];
    ssize_t r;
    while ((r = read(fd, buf, sizeof buf)) > 0)
        o.err.append(buf, (size_t)r);
    close(fd);
    return o;
}

static bool exited(const outcome &o, int code)
{
    return WIFEXITED(o.status) && WEXITSTATUS(o.status) == code;
}

/* Ended by SIGSEGV: the default action, or a sanitizer's report of it in a sanitizer build
 * (the emulator's handler passes the fault on to the handler it found). */
static bool faulted(const outcome &o)
{
    return (WIFSIGNALED(o.status) && WTERMSIG(o.status) == SIGSEGV) ||
           (WIFEXITED(o.status) && WEXITSTATUS(o.status) != 0 &&
            o.err.find("Sanitizer: SEGV") != std::string::npos);
}

static bool says(const outcome &o, const char *text)
{
    return o.err.find(text) != std::string::npos;
}

#define SHOW(o) (o).status, (o).err.c_str()

int main(void)
{
    setenv("DDPD_CUDA_EMU", "1", 1);
    unsetenv("CUDA_VISIBLE_DEVICES");

    outcome o = run_child([](int bug) { return case_syncthreads(bug); }, 0);
    EXPECT(exited(o, RIGHT), "reverse with __syncthreads: status %d, stderr: %s", SHOW(o));
    o = run_child([](int bug) { return case_syncthreads(bug); }, 1);
    EXPECT(exited(o, WRONG), "reverse without __syncthreads must give a wrong result: status %d, %s",
           SHOW(o));

    o = run_child([](int bug) { return case_scratch_reuse(bug); }, 0);
    EXPECT(exited(o, RIGHT), "two block sums with a barrier between: status %d, stderr: %s", SHOW(o));
    o = run_child([](int bug) { return case_scratch_reuse(bug); }, 1);
    EXPECT(exited(o, WRONG),
           "shared scratch overwritten before every warp read it must give a wrong result: "
           "status %d, stderr: %s",
           SHOW(o));

    o = run_child(case_shuffle, 0);
    EXPECT(exited(o, RIGHT), "warp sum: status %d, stderr: %s", SHOW(o));
    o = run_child(case_shuffle, 1);
    EXPECT(exited(o, REFUSED) && says(o, "__shfl_xor_sync") && says(o, "k_warp_sum") && says(o, "returned"),
           "a shuffle whose partner lanes returned must fail: status %d, stderr: %s", SHOW(o));
    o = run_child(case_shuffle, 2);
    EXPECT(exited(o, REFUSED) && says(o, "not in the mask") && says(o, "k_warp_outside"),
           "a shuffle reading a lane outside its mask must fail: status %d, stderr: %s", SHOW(o));
    o = run_child([](int) { return case_divergent_barrier(); }, 0);
    EXPECT(exited(o, REFUSED) && says(o, "no thread can move") && says(o, "__syncthreads"),
           "a barrier not every thread reaches must fail: status %d, stderr: %s", SHOW(o));

    o = run_child([](int bug) { return case_host_pointer(bug); }, 0);
    EXPECT(exited(o, RIGHT), "device pointers: status %d, stderr: %s", SHOW(o));
    o = run_child([](int bug) { return case_host_pointer(bug); }, 1);
    EXPECT(exited(o, REFUSED) && says(o, "kernel k_scale: argument 2") && says(o, "not device memory"),
           "a host pointer passed to a kernel must fail naming kernel and argument: status %d, stderr: %s",
           SHOW(o));

    o = run_child([](int bug) { return case_host_deref(bug); }, 0);
    EXPECT(exited(o, RIGHT), "device memory read by a copy: status %d, stderr: %s", SHOW(o));
    o = run_child([](int bug) { return case_host_deref(bug); }, 1);
    EXPECT(faulted(o) && says(o, "host code dereferenced device memory"),
           "a device pointer read on the host must fault: status %d, stderr: %s", SHOW(o));

    o = run_child(case_lda, 5);
    EXPECT(exited(o, RIGHT), "sgemm with the right lda: status %d, stderr: %s", SHOW(o));
    o = run_child(case_lda, 4);
    EXPECT(exited(o, REFUSED) && says(o, "lda = 4"), "lda < m must be refused: status %d, stderr: %s",
           SHOW(o));
    o = run_child(case_lda, 6);
    EXPECT(exited(o, WRONG), "a wrong lda inside the buffer must give a wrong answer: status %d, stderr: %s",
           SHOW(o));
    o = run_child(case_lda, 20);
    EXPECT(exited(o, REFUSED) && says(o, "cublasSgemm: A") && says(o, "not all device memory"),
           "an lda that runs past the allocation must be refused: status %d, stderr: %s", SHOW(o));

    o = run_child([](int bug) { return case_stream_sync(bug); }, 0);
    EXPECT(exited(o, RIGHT), "a synchronised read: status %d, stderr: %s", SHOW(o));
    o = run_child([](int bug) { return case_stream_sync(bug); }, 1);
    EXPECT(exited(o, WRONG),
           "a read without cudaStreamSynchronize must see stale data: status %d, stderr: %s", SHOW(o));
    o = run_child([](int bug) { return case_cross_stream(bug); }, 0);
    EXPECT(exited(o, RIGHT), "streams ordered by an event: status %d, stderr: %s", SHOW(o));
    o = run_child([](int bug) { return case_cross_stream(bug); }, 1);
    EXPECT(exited(o, WRONG),
           "a stream that does not wait for another's event must read stale data: status %d, "
           "stderr: %s",
           SHOW(o));

    o = run_child([](int bug) { return case_out_of_bounds(bug); }, 0);
    EXPECT(exited(o, RIGHT), "reads inside the buffer: status %d, stderr: %s", SHOW(o));
    o = run_child([](int bug) { return case_out_of_bounds(bug); }, 1);
    EXPECT(faulted(o) && says(o, "kernel k_shifted") && says(o, "out-of-bounds access") &&
               says(o, "0 bytes past the end of an allocation of 4000 bytes"),
           "a read past the end of a buffer must fault naming the kernel: status %d, stderr: %s", SHOW(o));

    printf("%d checks, %d failed\n", checks, failures);
    return failures ? 1 : 0;
}
