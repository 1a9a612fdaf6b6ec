/* dev/cuda.cu — the CUDA compute backend. For now it only answers whether a device is
 * there; the CUDA ops (cuBLAS + kernels, each tested against dev/cpu.c) come with the
 * GPU issue. Device code lives only in the .cu files of worker/dev, behind the C
 * header dev.h. */
#include <cuda_runtime.h>

extern "C" {
#include "../dev.h"
}

/* True when the CUDA runtime works and sees at least one device; any error (no driver,
 * no device, a runtime too new for the driver) reads as "no". */
extern "C" bool dev_cuda_available(void)
{
    int n = 0;
    cudaError_t rc = cudaGetDeviceCount(&n);
    if (rc != cudaSuccess) {
        (void)cudaGetLastError(); /* clear the sticky error for later callers */
        return false;
    }
    return n > 0;
}
