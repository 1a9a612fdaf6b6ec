/* half.h — the 16-bit floats of DDP's compressed gradients (`ddp.comm_hook`, issue 33):
 * IEEE fp16 and bfloat16 as 16-bit patterns, with the rounding of PyTorch's CPU kernels
 * and gloo's fp16 sum: a cast rounds to nearest even; a division and an add are done in
 * float32 and the result cast (rounded) back. Pure functions on host memory, nothing of
 * devices or communicators. */
#ifndef DDPD_HALF_H
#define DDPD_HALF_H

#include <stdbool.h>
#include <stdint.h>

typedef enum { HALF_FP16, HALF_BF16 } half_kind;

uint16_t half_from_float(half_kind k, float f); /* round to nearest even; NaN stays NaN */
float half_to_float(half_kind k, uint16_t h);   /* exact */

/* PyTorch's `buffer.to(torch.float16).div_(divisor)` (or bfloat16): dst[i] =
 * half(float(half(src[i])) / divisor). [n] each. */
void half_compress(half_kind k, uint16_t *dst, const float *src, int64_t n, int divisor);
/* `buffer.copy_(compressed)`: dst[i] = float(src[i]), exact. */
void half_decompress(half_kind k, float *dst, const uint16_t *src, int64_t n);
/* gloo's sum of two fp16 tensors (the same rounding for bf16): dst[i] = half(float(dst[i]) +
 * float(src[i])). Commutative, as the float add is. */
void half_add(half_kind k, uint16_t *dst, const uint16_t *src, int64_t n);

#endif
