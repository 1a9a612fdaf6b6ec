/* cuda/sort.cu — CUB's radix sort of (int32 key, int32 value) pairs, for the deterministic
 * embedding backward in dev.cu. Apart from dev.cu because CUB's headers declare a C++
 * namespace `cuda`, which dev.cu's `struct cuda` would clash with. */
#include <cub/device/device_radix_sort.cuh>
#include <cuda_runtime.h>
#include <stdint.h>

/* cub::DeviceRadixSort::SortPairs over all 32 bits (stable: equal keys keep their values'
 * order), queued on `stream`. With temp NULL it only sets *temp_bytes. */
cudaError_t cuda_sort_pairs_i32(void *temp, size_t *temp_bytes, const int32_t *keys_in, int32_t *keys_out,
                                const int32_t *vals_in, int32_t *vals_out, int n, cudaStream_t stream)
{
    return cub::DeviceRadixSort::SortPairs(temp, *temp_bytes, keys_in, keys_out, vals_in, vals_out, n, 0, 32,
                                           stream);
}
