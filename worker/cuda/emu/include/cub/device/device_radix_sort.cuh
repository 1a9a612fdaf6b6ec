/* emu/include/cub/device/device_radix_sort.cuh — CUB's DeviceRadixSort::SortPairs as the
 * emulated device provides it: a stable sort of (key, value) pairs by key, in stream order,
 * with CUB's two-call protocol (a first call with temp NULL only says how much scratch it
 * needs). Like cuBLAS, a library the emulator stands in for; worker/cuda/sort.cu calls it. */
#ifndef DDPD_EMU_CUB_DEVICE_RADIX_SORT_CUH
#define DDPD_EMU_CUB_DEVICE_RADIX_SORT_CUH

#include <stddef.h>

#include <algorithm>
#include <vector>

#include "../../../emu_impl.h"

namespace cub
{

struct DeviceRadixSort {
    template <typename K, typename V>
    static cudaError_t SortPairs(void *temp, size_t &temp_bytes, const K *keys_in, K *keys_out,
                                 const V *vals_in, V *vals_out, int n, int begin_bit = 0,
                                 int end_bit = (int)sizeof(K) * 8, cudaStream_t stream = 0)
    {
        if (!temp) {
            temp_bytes = 1; /* the sort below needs none, but a caller may not pass NULL twice */
            return cudaSuccess;
        }
        if (n <= 0)
            return cudaSuccess;
        const size_t kb = (size_t)n * sizeof(K), vb = (size_t)n * sizeof(V);
        const void *ptrs[4] = {keys_in, keys_out, vals_in, vals_out};
        const size_t sizes[4] = {kb, kb, vb, vb};
        static const char *const names[4] = {"keys_in", "keys_out", "values_in", "values_out"};
        for (int i = 0; i < 4; i++)
            if (emu_mem_kind(ptrs[i], sizes[i]) != EMU_MEM_DEVICE) {
                char what[256];
                emu_mem_describe(ptrs[i], what, sizeof what);
                return emu_error(cudaErrorInvalidValue,
                                 "cub::DeviceRadixSort::SortPairs: %s (%d entries) is not all "
                                 "device memory: it starts at %s",
                                 names[i], n, what);
            }
        using U = typename std::make_unsigned<K>::type;
        const U mask =
            end_bit - begin_bit >= (int)sizeof(K) * 8 ? (U) ~(U)0 : (U)(((U)1 << (end_bit - begin_bit)) - 1);
        return emu::enqueue(stream, [=] {
            /* Over all bits CUB orders keys by value (signed ones too); over fewer, by the
             * bits [begin, end) as an unsigned number. */
            const bool all = begin_bit == 0 && end_bit >= (int)sizeof(K) * 8;
            std::vector<int> order((size_t)n);
            for (int i = 0; i < n; i++)
                order[(size_t)i] = i;
            auto key = [&](int i) { return (U)((U)keys_in[i] >> begin_bit) & mask; };
            std::stable_sort(order.begin(), order.end(),
                             [&](int a, int b) { return all ? keys_in[a] < keys_in[b] : key(a) < key(b); });
            std::vector<K> k((size_t)n);
            std::vector<V> v((size_t)n);
            for (int i = 0; i < n; i++) {
                k[(size_t)i] = keys_in[order[(size_t)i]];
                v[(size_t)i] = vals_in[order[(size_t)i]];
            }
            std::copy(k.begin(), k.end(), keys_out);
            std::copy(v.begin(), v.end(), vals_out);
        });
    }
};

} // namespace cub

#endif
