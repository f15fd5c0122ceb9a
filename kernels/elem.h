/*
 * Element arithmetic for every (dtype, op) pair, shared by the CPU kernels
 * and the CUDA kernels so that the CPU tests pin down what the GPU computes.
 *
 * Rules, the same for every caller:
 *
 * - Integers wrap on sum and prod (done in unsigned arithmetic, so there is
 *   no undefined behaviour). AVG divides the wrapped sum with C division,
 *   which truncates toward zero. BAND, BOR and BXOR combine the bits; they
 *   exist for integers only (the API refuses them with other dtypes).
 * - float16 and bfloat16 are stored as uint16_t bit patterns. Every op
 *   widens both inputs to float32, computes once in float32 and rounds once
 *   to nearest, ties to even. The double rounding is innocuous for + - * /
 *   because float32 carries more than 2p+2 bits for both half formats.
 *   AVG rounds the sum to the half type (as a ring step would when it sends
 *   the partial sum on) and then divides in float32 and rounds again.
 * - A NaN produced by a half op is the canonical quiet NaN (0x7e00 for
 *   float16, 0x7fc0 for bfloat16), so CPU, AVX and GPU paths agree bit for
 *   bit even though hardware NaN payloads differ. The plain conversions keep
 *   sign and payload (quietened), as F16C hardware does.
 * - On the device (__CUDA_ARCH__) the half <-> float32 conversions are the
 *   hardware's cvt instructions (round to nearest even, subnormals kept,
 *   overflow to Inf, as the code below does in software). NaN keeps its
 *   explicit path, so the NaN rules above hold whatever payload the
 *   hardware would give. tests/kernels/test_half_convert.c checks the
 *   software conversions against independent references, and
 *   tests/gpu/test_convert_gpu.cu the device ones against the software.
 * - min/max propagate NaN: when either input is NaN the result is NaN (for
 *   float32/float64 the first NaN input, a before b). -0 is below +0, so
 *   min(-0, +0) = -0 and max(-0, +0) = +0 in either order.
 */
#ifndef BRG_ELEM_H
#define BRG_ELEM_H

#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

#include "hd.h"

#define BRG_F16_CANONICAL_NAN ((uint16_t)0x7e00u)
#define BRG_BF16_CANONICAL_NAN ((uint16_t)0x7fc0u)

/* ---- bit casts ---------------------------------------------------------- */

static inline BRG_HD uint32_t brg__f32_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
#endif
}

static inline BRG_HD float brg__bits_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
#endif
}

static inline BRG_HD uint64_t brg__f64_bits(double d) {
#if defined(__CUDA_ARCH__)
  return (uint64_t)__double_as_longlong(d);
#else
  uint64_t u;
  memcpy(&u, &d, sizeof u);
  return u;
#endif
}

static inline BRG_HD double brg__bits_f64(uint64_t u) {
#if defined(__CUDA_ARCH__)
  return __longlong_as_double((long long)u);
#else
  double d;
  memcpy(&d, &u, sizeof d);
  return d;
#endif
}

/* ---- float16 <-> float32 ------------------------------------------------ */

/* The quiet NaN a conversion makes of a NaN input: sign and the top payload
 * bits kept, the quiet bit set. */
static inline BRG_HD float brg__f16_nan_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  return brg__bits_f32(sign | 0x7fc00000u | ((uint32_t)(h & 0x3ffu) << 13));
}
static inline BRG_HD uint16_t brg__f32_nan_to_f16(uint32_t x) {
  return (uint16_t)(((x >> 16) & 0x8000u) | 0x7e00u | ((x >> 13) & 0x3ffu));
}

/* Widening for the ops below: exact for every number; a NaN stays a NaN
 * with any payload (each op's result is rounded by brg__f16_round, which
 * makes every NaN the canonical one). */
static inline BRG_HD float brg__f16_widen(uint16_t h) {
#if defined(__CUDA_ARCH__)
  return __half2float(__ushort_as_half(h));
#else
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t em = h & 0x7fffu;
  uint32_t bits;
  if (em > 0x7c00u) return brg__f16_nan_to_f32(h);
  if (em == 0x7c00u) { /* Inf */
    bits = 0x7f800000u;
  } else if (em >= 0x0400u) { /* normal: rebias the exponent */
    bits = (em << 13) + ((uint32_t)(127 - 15) << 23);
  } else { /* zero or subnormal: em * 2^-24, exact */
    bits = brg__f32_bits((float)em * 5.9604644775390625e-08f);
  }
  return brg__bits_f32(sign | bits);
#endif
}

static inline BRG_HD float brg__f16_to_f32(uint16_t h) {
  return (h & 0x7fffu) > 0x7c00u ? brg__f16_nan_to_f32(h) : brg__f16_widen(h);
}

/* Rounding of a number; NaN is the callers' to handle first. */
static inline BRG_HD uint16_t brg__f32_to_f16_number(float f) {
#if defined(__CUDA_ARCH__)
  return __half_as_ushort(__float2half_rn(f));
#else
  uint32_t x = brg__f32_bits(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x477ff000u) /* >= 65520 (incl. Inf and NaN) rounds to Inf */
    return (uint16_t)(sign | 0x7c00u);
  if (ax >= 0x38800000u) { /* >= 2^-14: normal result */
    ax -= (uint32_t)(127 - 15) << 23;
    return (uint16_t)(sign | ((ax + 0xfffu + ((ax >> 13) & 1u)) >> 13));
  }
  if (ax <= 0x33000000u) /* <= 2^-25: the tie at 2^-25 goes to 0 */
    return (uint16_t)sign;
  {                        /* subnormal result: mant * 2^(e-150) / 2^-24 */
    uint32_t e = ax >> 23; /* 102..112 */
    uint32_t mant = (ax & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - e; /* 14..24 */
    uint32_t r = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1u);
    r += (rem > half) | ((rem == half) & r); /* may carry into the lowest normal */
    return (uint16_t)(sign | r);
  }
#endif
}

static inline BRG_HD uint16_t brg__f32_to_f16(float f) {
  uint32_t x = brg__f32_bits(f);
  return (x & 0x7fffffffu) > 0x7f800000u ? brg__f32_nan_to_f16(x) : brg__f32_to_f16_number(f);
}

/* ---- bfloat16 <-> float32 ----------------------------------------------- */

static inline BRG_HD float brg__bf16_widen(uint16_t h) {
#if defined(__CUDA_ARCH__)
  return __bfloat162float(__ushort_as_bfloat16(h));
#else
  return brg__bits_f32((uint32_t)h << 16);
#endif
}

static inline BRG_HD float brg__bf16_to_f32(uint16_t h) {
  float f = brg__bf16_widen(h);
  if ((h & 0x7fffu) > 0x7f80u) /* NaN made quiet */
    f = brg__bits_f32(((uint32_t)h << 16) | 0x00400000u);
  return f;
}

static inline BRG_HD uint16_t brg__f32_to_bf16_number(float f) {
#if defined(__CUDA_ARCH__)
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
#else
  /* Round to nearest even on the low half; a carry walks into the exponent
   * and past the largest finite value into Inf, as it should. */
  uint32_t x = brg__f32_bits(f);
  return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
#endif
}

static inline BRG_HD uint16_t brg__f32_to_bf16(float f) {
  uint32_t x = brg__f32_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) /* NaN: quiet, top payload bits kept */
    return (uint16_t)((x >> 16) | 0x0040u);
  return brg__f32_to_bf16_number(f);
}

/* Rounding of an op result: like the conversions, but any NaN becomes the
 * canonical NaN. */
static inline BRG_HD uint16_t brg__f16_round(float f) {
  return f != f ? BRG_F16_CANONICAL_NAN : brg__f32_to_f16_number(f);
}
static inline BRG_HD uint16_t brg__bf16_round(float f) {
  return f != f ? BRG_BF16_CANONICAL_NAN : brg__f32_to_bf16_number(f);
}

/* ---- float min / max ---------------------------------------------------- */

/* Written as a chain of selects so that loops over them vectorize. Equal
 * operands differ at most in the sign of zero: OR of the bits picks -0 for
 * min, AND picks +0 for max. */
static inline BRG_HD float brg__f32_min(float a, float b) {
  float r = b < a ? b : a;
  r = a == b ? brg__bits_f32(brg__f32_bits(a) | brg__f32_bits(b)) : r;
  r = b != b ? b : r;
  return a != a ? a : r;
}
static inline BRG_HD float brg__f32_max(float a, float b) {
  float r = b > a ? b : a;
  r = a == b ? brg__bits_f32(brg__f32_bits(a) & brg__f32_bits(b)) : r;
  r = b != b ? b : r;
  return a != a ? a : r;
}
static inline BRG_HD double brg__f64_min(double a, double b) {
  double r = b < a ? b : a;
  r = a == b ? brg__bits_f64(brg__f64_bits(a) | brg__f64_bits(b)) : r;
  r = b != b ? b : r;
  return a != a ? a : r;
}
static inline BRG_HD double brg__f64_max(double a, double b) {
  double r = b > a ? b : a;
  r = a == b ? brg__bits_f64(brg__f64_bits(a) & brg__f64_bits(b)) : r;
  r = b != b ? b : r;
  return a != a ? a : r;
}

/* ---- float32 / float64 -------------------------------------------------- */

static inline BRG_HD float brg__f32_sum(float a, float b) {
  return a + b;
}
static inline BRG_HD float brg__f32_prod(float a, float b) {
  return a * b;
}
static inline BRG_HD float brg__f32_div(float x, int d) {
  return x / (float)d;
}
static inline BRG_HD float brg__f32_avg(float a, float b, int d) {
  return (a + b) / (float)d;
}

static inline BRG_HD double brg__f64_sum(double a, double b) {
  return a + b;
}
static inline BRG_HD double brg__f64_prod(double a, double b) {
  return a * b;
}
static inline BRG_HD double brg__f64_div(double x, int d) {
  return x / (double)d;
}
static inline BRG_HD double brg__f64_avg(double a, double b, int d) {
  return (a + b) / (double)d;
}

/* ---- float16 / bfloat16 (uint16_t bit patterns) ------------------------- */

#define BRG__HALF_OPS(t)                                                                           \
  static inline BRG_HD uint16_t brg__##t##_sum(uint16_t a, uint16_t b) {                           \
    return brg__##t##_round(brg__##t##_widen(a) + brg__##t##_widen(b));                            \
  }                                                                                                \
  static inline BRG_HD uint16_t brg__##t##_prod(uint16_t a, uint16_t b) {                          \
    return brg__##t##_round(brg__##t##_widen(a) * brg__##t##_widen(b));                            \
  }                                                                                                \
  static inline BRG_HD uint16_t brg__##t##_min(uint16_t a, uint16_t b) {                           \
    return brg__##t##_round(brg__f32_min(brg__##t##_widen(a), brg__##t##_widen(b)));               \
  }                                                                                                \
  static inline BRG_HD uint16_t brg__##t##_max(uint16_t a, uint16_t b) {                           \
    return brg__##t##_round(brg__f32_max(brg__##t##_widen(a), brg__##t##_widen(b)));               \
  }                                                                                                \
  static inline BRG_HD uint16_t brg__##t##_div(uint16_t x, int d) {                                \
    return brg__##t##_round(brg__##t##_widen(x) / (float)d);                                       \
  }                                                                                                \
  static inline BRG_HD uint16_t brg__##t##_avg(uint16_t a, uint16_t b, int d) {                    \
    return brg__##t##_div(brg__##t##_sum(a, b), d);                                                \
  }

BRG__HALF_OPS(f16)
BRG__HALF_OPS(bf16)
#undef BRG__HALF_OPS

/* ---- integers ----------------------------------------------------------- */

/* t: suffix, T: type, U: unsigned type wide enough that products of two
 * values do not promote to signed int, D: type the division happens in (the
 * divisor is at least 1 and may exceed T's range). */
#define BRG__INT_OPS(t, T, U, D)                                                                   \
  static inline BRG_HD T brg__##t##_sum(T a, T b) {                                                \
    return (T)((U)a + (U)b);                                                                       \
  }                                                                                                \
  static inline BRG_HD T brg__##t##_prod(T a, T b) {                                               \
    return (T)((U)a * (U)b);                                                                       \
  }                                                                                                \
  static inline BRG_HD T brg__##t##_min(T a, T b) {                                                \
    return b < a ? b : a;                                                                          \
  }                                                                                                \
  static inline BRG_HD T brg__##t##_max(T a, T b) {                                                \
    return b > a ? b : a;                                                                          \
  }                                                                                                \
  static inline BRG_HD T brg__##t##_div(T x, int d) {                                              \
    return (T)((D)x / (D)d);                                                                       \
  }                                                                                                \
  static inline BRG_HD T brg__##t##_avg(T a, T b, int d) {                                         \
    return brg__##t##_div(brg__##t##_sum(a, b), d);                                                \
  }                                                                                                \
  static inline BRG_HD T brg__##t##_band(T a, T b) {                                               \
    return (T)((U)a & (U)b);                                                                       \
  }                                                                                                \
  static inline BRG_HD T brg__##t##_bor(T a, T b) {                                                \
    return (T)((U)a | (U)b);                                                                       \
  }                                                                                                \
  static inline BRG_HD T brg__##t##_bxor(T a, T b) {                                               \
    return (T)((U)a ^ (U)b);                                                                       \
  }

BRG__INT_OPS(i8, int8_t, uint32_t, int)
BRG__INT_OPS(u8, uint8_t, uint32_t, int)
BRG__INT_OPS(i32, int32_t, uint32_t, int)
BRG__INT_OPS(u32, uint32_t, uint32_t, uint32_t)
BRG__INT_OPS(i64, int64_t, uint64_t, int64_t)
BRG__INT_OPS(u64, uint64_t, uint64_t, uint64_t)
#undef BRG__INT_OPS

#endif /* BRG_ELEM_H */
