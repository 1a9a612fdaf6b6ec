/* half.c — fp16 and bfloat16 conversions, division and sum with PyTorch's and gloo's
 * rounding (half.h). Bit manipulation only: no compiler half type, no FPU mode. */
#include "half.h"

#include <string.h>

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

void half_compress(half_kind k, uint16_t *dst, const float *src, int64_t n, int divisor)
{
    const float d = (float)divisor;
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
    if (k == HALF_BF16) {
        for (int64_t i = 0; i < n; i++)
            dst[i] = bf16_from_float(float_of((uint32_t)dst[i] << 16) + float_of((uint32_t)src[i] << 16));
    } else {
        for (int64_t i = 0; i < n; i++)
            dst[i] = fp16_from_float(fp16_to_float(dst[i]) + fp16_to_float(src[i]));
    }
}
