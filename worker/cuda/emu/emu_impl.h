/* emu/emu_impl.h — what the emulated device's own files share (runtime.cc, kernel.cc,
 * cublas.cc, nccl.cc, sort): stream-ordered work, the device arena's bookkeeping and the
 * emulator's error reports. Nothing outside worker/cuda/emu includes it. */
#ifndef DDPD_EMU_IMPL_H
#define DDPD_EMU_IMPL_H

#include <stdbool.h>
#include <stddef.h>

#include "include/cuda_runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- stream-ordered work (runtime.cc) ----
 * Queues fn(arg) on stream `s` (NULL: the current device's legacy default stream). It runs
 * on the stream's own thread, after everything queued on `s` before it, with the device
 * arena accessible; later work on `s` waits until it returns. `release(arg)` (may be NULL)
 * runs after fn, or instead of it when the work is dropped (a destroyed stream). fn may
 * block (an emulated NCCL collective waits for its peers there), which stalls the stream
 * exactly as a collective kernel stalls a GPU stream. Returns cudaSuccess, or the error
 * that stops the call (an invalid stream, a sticky error); work refused so is released
 * (release(arg) runs) before the call returns. */
cudaError_t emu_stream_enqueue(cudaStream_t s, void (*fn)(void *arg), void *arg, void (*release)(void *arg));

/* The device of stream `s` (NULL: the calling thread's current device). */
int emu_stream_device(cudaStream_t s);

/* ---- memory (runtime.cc) ----
 * An allocation ends where its pages end, with an inaccessible page after it, so that an
 * overrun faults at its first byte: it starts 4-byte aligned (8 when its size is a multiple
 * of 8), where CUDA's start 256-byte aligned. Code that relies on more alignment than its
 * element type's fails here first.
 * Where [p, p + bytes) lies: EMU_MEM_DEVICE when inside one live cudaMalloc allocation,
 * EMU_MEM_PINNED inside one cudaHostAlloc allocation, else EMU_MEM_HOST (pageable host
 * memory, or a range that runs past the end of its allocation: see emu_mem_describe). */
enum emu_mem { EMU_MEM_HOST = 0, EMU_MEM_PINNED = 1, EMU_MEM_DEVICE = 2 };
enum emu_mem emu_mem_kind(const void *p, size_t bytes);

/* A sentence about p for error messages: "device memory (allocation of 4004 bytes at
 * 0x..., offset 12)", "pinned host memory (...)", "not device memory (a host pointer)". */
void emu_mem_describe(const void *p, char *out, size_t cap);

/* ---- errors (runtime.cc) ----
 * Reports a misuse the emulator caught: prints "ddpd cuda emulator: <text>" on stderr and
 * keeps the text, so that cudaGetErrorString(code) ends with it (the worker's `error`
 * event then names the kernel or call). Returns code. */
cudaError_t emu_error(cudaError_t code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* A misuse that a GPU would turn into a sticky context error (a kernel given a host
 * pointer, an out-of-bounds access): every later runtime call fails with `code` too. */
cudaError_t emu_error_sticky(cudaError_t code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Emulated device `visible` (the calling process's numbering, after CUDA_VISIBLE_DEVICES)
 * as its number among all DDPD_CUDA_EMU devices, the same in every process; -1 if none. */
int emu_device_physical(int visible);

/* Which code of the emulated module device `visible` runs, as the driver picks it
 * (runtime.cc): false when none, which every launch on it then fails with
 * cudaErrorNoKernelImageForDevice. */
bool emu_code_for_device(int visible, int *binary, int *ptx);

/* Number of emulated devices visible to this process: DDPD_CUDA_EMU (1..16), filtered and
 * renumbered by CUDA_VISIBLE_DEVICES. 0 when unset. */
int emu_device_count(void);

#ifdef __cplusplus
}

#include <functional>

#include "emu.h"

namespace emu
{
/* emu_stream_enqueue with a closure (runtime.cc). */
cudaError_t enqueue(cudaStream_t s, std::function<void()> work);
/* The calling thread's last error (cudaGetLastError's), and the sticky error if any. */
void set_last_error(cudaError_t e);
cudaError_t sticky_error();
/* kernel.cc: runs every block of a launch on the calling (stream) thread. */
void run_grid(const char *kernel, dim3 grid, dim3 block, const std::function<void()> &body);
/* kernel.cc: where a fault at `addr` happened, for the SIGSEGV report: the running kernel,
 * block and thread of the calling thread, or false when it runs none. */
bool describe_running_kernel(char *out, size_t cap);
/* kernel.cc: true when `addr` lies on a guard page of a fiber stack (a kernel's stack
 * overflowed). */
bool on_fiber_guard(const void *addr);
} // namespace emu
#endif

#endif
