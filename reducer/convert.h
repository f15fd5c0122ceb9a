/*
 * float32/float64 <-> float16/bfloat16 for the compression hooks. The
 * reducer sees only brigade.h, so it carries its own conversions rather than
 * borrowing the kernels'. Rounding is to nearest even; NaN stays NaN, values
 * past the half range become infinity. float64 goes through float32 first.
 */
#ifndef BRG_REDUCER_CONVERT_H
#define BRG_REDUCER_CONVERT_H

#include <stddef.h>
#include <stdint.h>
#include "brigade.h"

uint16_t brg__f32_to_f16(float f);
float brg__f16_to_f32(uint16_t h);
uint16_t brg__f32_to_bf16(float f);
float brg__bf16_to_f32(uint16_t h);

/* dst[i] = half(scale * src[i]); src is float32 or float64 (src_dtype),
 * half is BRG_FLOAT16 or BRG_BFLOAT16. */
void brg__convert_to_half(uint16_t *dst, brg_dtype half, const void *src, brg_dtype src_dtype,
                          size_t n, float scale);
/* dst[i] = src[i] widened to dst_dtype (float32 or float64). */
void brg__convert_from_half(void *dst, brg_dtype dst_dtype, const uint16_t *src, brg_dtype half,
                            size_t n);

#endif
