/* half.c — fp16 and bfloat16 conversions, division and sum with PyTorch's and gloo's
 * rounding (half.h). Bit manipulation only: no compiler half type, no FPU mode. */
#include "half.h"

#include <string.h>

/* On x86 with F16C and AVX2 the loops run 8 elements at a time: F16C's conversions round
 * to nearest even as the scalar code does, and the float division and add are the same
 * IEEE operations, so both paths give the same bits (NaN payloads aside: NaN stays NaN). */
#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#define HALF_X86   1
#define VEC_TARGET __attribute__((target("avx2,f16c")))
/* AVX2 (and the OS's support of it) from the compiler's own check; F16C from CPUID leaf 1
 * (clang's __builtin_cpu_supports does not know "f16c"). */
static int vec_ok(void)
{
    unsigned a, b, c, d;
    return __builtin_cpu_supports("avx2") && __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
}
#else
#define HALF_X86 0
#endif

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float float_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Round to nearest even, as c10's fp16_ieee_from_fp32_value and gloo's cpu_float2half_rn. */
static uint16_t fp16_from_float(float f)
{
    uint32_t x = bits_of(f);
    const uint32_t sign = x & 0x80000000u;
    uint32_t o;
    x ^= sign;
    if (x >= (127u + 16u) << 23) {
        /* |f| >= 65536, an infinity or a NaN (which stays quiet). */
        o = x > 0x7f800000u ? 0x7e00u : 0x7c00u;
    } else if (x < 113u << 23) {
        /* Below fp16's smallest normal (2^-14): add 0.5, whose ulp is fp16's smallest
         * subnormal (2^-24), so that the float add rounds to nearest even for us. */
        const float magic = float_of(126u << 23);
        o = bits_of(float_of(x) + magic) - bits_of(magic);
    } else {
        /* Rebias the exponent and round the 13 dropped bits to nearest even; a carry into
         * the exponent is right, and past the largest finite value it reaches infinity. */
        const uint32_t odd = (x >> 13) & 1u;
        x += ((uint32_t)(15 - 127) << 23) + 0xfffu + odd;
        o = x >> 13;
    }
    return (uint16_t)(o | sign >> 16);
}

static float fp16_to_float(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) {
        /* Zero or subnormal: m * 2^-24, exact in float. */
        float v = (float)m * 0x1p-24f;
        return sign ? -v : v;
    }
    if (e == 31)
        return float_of(sign | 0x7f800000u | m << 13);
    return float_of(sign | (e + 112u) << 23 | m << 13);
}

/* c10::detail::round_to_nearest_even. */
static uint16_t bf16_from_float(float f)
{
    if (f != f)
        return 0x7fc0u;
    const uint32_t u = bits_of(f);
    return (uint16_t)((u + ((u >> 16) & 1u) + 0x7fffu) >> 16);
}

uint16_t half_from_float(half_kind k, float f)
{
    return k == HALF_BF16 ? bf16_from_float(f) : fp16_from_float(f);
}

float half_to_float(half_kind k, uint16_t h)
{
    return k == HALF_BF16 ? float_of((uint32_t)h << 16) : fp16_to_float(h);
}

#if HALF_X86
#define RNE (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

static inline __m256 VEC_TARGET bf16x8_to_float(const uint16_t *p)
{
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

/* c10's round_to_nearest_even on 8 floats, NaN to 0x7fc0. */
static inline void VEC_TARGET float_to_bf16x8(uint16_t *p, __m256 f)
{
    __m256i u = _mm256_castps_si256(f);
    __m256i bias = _mm256_add_epi32(_mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1)),
                                    _mm256_set1_epi32(0x7fff));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, bias), 16);
    __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(f, f, _CMP_UNORD_Q));
    r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7fc0), nan);
    /* Pack the 8 low halves: packus within lanes, then put the lanes in order. */
    __m256i packed = _mm256_packus_epi32(r, r);
    packed = _mm256_permute4x64_epi64(packed, 0x08);
    _mm_storeu_si128((__m128i *)(void *)p, _mm256_castsi256_si128(packed));
}

static int64_t VEC_TARGET compress_vec(half_kind k, uint16_t *dst, const float *src, int64_t n, float d)
{
    const __m256 vd = _mm256_set1_ps(d);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(src + i);
        if (k == HALF_BF16) {
            float_to_bf16x8(dst + i, x);
            float_to_bf16x8(dst + i, _mm256_div_ps(bf16x8_to_float(dst + i), vd));
        } else {
            __m256 h = _mm256_cvtph_ps(_mm256_cvtps_ph(x, RNE));
            _mm_storeu_si128((__m128i *)(void *)(dst + i), _mm256_cvtps_ph(_mm256_div_ps(h, vd), RNE));
        }
    }
    return i;
}

static int64_t VEC_TARGET decompress_vec(half_kind k, float *dst, const uint16_t *src, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 f = k == HALF_BF16
                       ? bf16x8_to_float(src + i)
                       : _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(src + i)));
        _mm256_storeu_ps(dst + i, f);
    }
    return i;
}

static int64_t VEC_TARGET add_vec(half_kind k, uint16_t *dst, const uint16_t *src, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        if (k == HALF_BF16) {
            float_to_bf16x8(dst + i, _mm256_add_ps(bf16x8_to_float(dst + i), bf16x8_to_float(src + i)));
        } else {
            __m256 a = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(dst + i)));
            __m256 b = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(src + i)));
            _mm_storeu_si128((__m128i *)(void *)(dst + i), _mm256_cvtps_ph(_mm256_add_ps(a, b), RNE));
        }
    }
    return i;
}
#endif

void half_compress(half_kind k, uint16_t *dst, const float *src, int64_t n, int divisor)
{
    const float d = (float)divisor;
#if HALF_X86
    if (vec_ok()) {
        int64_t done = compress_vec(k, dst, src, n, d);
        dst += done;
        src += done;
        n -= done;
    }
#endif
    if (k == HALF_BF16) {
        for (int64_t i = 0; i < n; i++)
            dst[i] = bf16_from_float(float_of((uint32_t)bf16_from_float(src[i]) << 16) / d);
    } else {
        for (int64_t i = 0; i < n; i++)
            dst[i] = fp16_from_float(fp16_to_float(fp16_from_float(src[i])) / d);
    }
}

void half_decompress(half_kind k, float *dst, const uint16_t *src, int64_t n)
{
#if HALF_X86
    if (vec_ok()) {
        int64_t done = decompress_vec(k, dst, src, n);
        dst += done;
        src += done;
        n -= done;
    }
#endif
    if (k == HALF_BF16) {
        for (int64_t i = 0; i < n; i++)
            dst[i] = float_of((uint32_t)src[i] << 16);
    } else {
        for (int64_t i = 0; i < n; i++)
            dst[i] = fp16_to_float(src[i]);
    }
}

void half_add(half_kind k, uint16_t *dst, const uint16_t *src, int64_t n)
{
#if HALF_X86
    if (vec_ok()) {
        int64_t done = add_vec(k, dst, src, n);
        dst += done;
        src += done;
        n -= done;
    }
#endif
    if (k == HALF_BF16) {
        for (int64_t i = 0; i < n; i++)
            dst[i] = bf16_from_float(float_of((uint32_t)dst[i] << 16) + float_of((uint32_t)src[i] << 16));
    } else {
        for (int64_t i = 0; i < n; i++)
            dst[i] = fp16_from_float(fp16_to_float(dst[i]) + fp16_to_float(src[i]));
    }
}
