/* emu/include/cuda_runtime.h — the CUDA runtime API as the emulated device implements it
 * (cuda/emu/runtime.cc): the subset worker/cuda calls, with CUDA's names, types and
 * meanings, for C and C++. Only the emulated module's sources see this header; the real
 * module includes the toolkit's. */
#ifndef DDPD_EMU_CUDA_RUNTIME_H
#define DDPD_EMU_CUDA_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The codes keep CUDA's numbers, so that a log line reads the same on both. */
typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInitializationError = 3,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidMemcpyDirection = 21,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorNoKernelImageForDevice = 209,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600,
    cudaErrorIllegalAddress = 700,
    cudaErrorLaunchFailure = 719,
    cudaErrorUnknown = 999,
} cudaError_t;

typedef struct emu_stream *cudaStream_t; /* NULL: the device's legacy default stream */
typedef struct emu_event *cudaEvent_t;

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
};

enum cudaMemoryType {
    cudaMemoryTypeUnregistered = 0,
    cudaMemoryTypeHost = 1,
    cudaMemoryTypeDevice = 2,
    cudaMemoryTypeManaged = 3,
};

struct cudaPointerAttributes {
    enum cudaMemoryType type;
    int device;
    void *devicePointer;
    void *hostPointer;
};

typedef struct CUuuid_st {
    char bytes[16];
} cudaUUID_t;

/* The fields of cudaDeviceProp that ddpd reads (the real struct has many more). */
typedef struct cudaDeviceProp {
    char name[256];
    cudaUUID_t uuid;
    size_t totalGlobalMem;
    int major, minor;
    int multiProcessorCount;
    int warpSize;
    int maxThreadsPerBlock;
} cudaDeviceProp;

/* The fields of cudaFuncAttributes that ddpd reads. */
struct cudaFuncAttributes {
    int binaryVersion; /* the cubin's architecture, 86 for sm_86 (the device's for JIT-compiled PTX) */
    int ptxVersion;    /* the PTX's, 90 for compute_90; 0 when a cubin runs */
    int maxThreadsPerBlock;
};

#define cudaStreamDefault      0x0u
#define cudaStreamNonBlocking  0x1u
#define cudaEventDefault       0x0u
#define cudaEventBlockingSync  0x1u
#define cudaEventDisableTiming 0x2u
#define cudaHostAllocDefault   0x0u

typedef void (*cudaHostFn_t)(void *userData);

const char *cudaGetErrorString(cudaError_t e);
const char *cudaGetErrorName(cudaError_t e);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);

cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *prop, int device);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaDeviceSynchronize(void);

cudaError_t cudaMalloc(void **p, size_t bytes);
cudaError_t cudaFree(void *p);
cudaError_t cudaMallocAsync(void **p, size_t bytes, cudaStream_t s);
cudaError_t cudaFreeAsync(void *p, cudaStream_t s);
cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned flags);
cudaError_t cudaMallocHost(void **p, size_t bytes);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p);

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                            cudaStream_t s);
cudaError_t cudaMemset(void *p, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t s);

cudaError_t cudaStreamCreate(cudaStream_t *s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamQuery(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags);
cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void *userData);

/* Fails with cudaErrorNoKernelImageForDevice when the module holds no code the current
 * device runs (every kernel of the module shares the one fat binary). */
cudaError_t cudaFuncGetAttributes(struct cudaFuncAttributes *attr, const void *func);

/* Not CUDA's: the emulator's own. The code the emulated module's fat binary holds
 * (DDPD_CUDA_EMU_CODE, or the release's list), as nvcc names it: "sm_80 sm_90 compute_90". */
const char *emuModuleCode(void);

cudaError_t cudaEventCreate(cudaEvent_t *e);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaEventQuery(cudaEvent_t e);
cudaError_t cudaEventSynchronize(cudaEvent_t e);

#ifdef __cplusplus
}
#endif

#endif
