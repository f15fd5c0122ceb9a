#include "convert.h"

#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define BRG_HAVE_F16C_PATH 1
#endif

static inline uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
static inline float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

uint16_t brg__f32_to_f16(float f) {
  uint32_t x = f32_bits(f);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
  uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) /* inf or NaN */
    return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x0200u | ((ax >> 13) & 0x3ffu) : 0));
  if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds past 65504 */
  if (ax < 0x38800000u) {                                   /* below 2^-14: subnormal or zero */
    if (ax < 0x33000000u) return sign;                      /* below half the least subnormal */
    uint32_t mant = (ax & 0x7fffffu) | 0x800000u;
    int shift = 126 - (int)(ax >> 23); /* 14..24: bits dropped beyond the normal 13 */
    uint32_t q = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1))) q++;
    return (uint16_t)(sign | q);
  }
  uint32_t r = ax + 0xfffu + ((ax >> 13) & 1u); /* round to nearest even at bit 13 */
  return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
}

float brg__f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1f) return bits_f32(sign | 0x7f800000u | (m << 13));
  if (e != 0) return bits_f32(sign | ((e + 112) << 23) | (m << 13));
  float v = (float)m * 0x1p-24f; /* zero or subnormal */
  return sign ? -v : v;
}

uint16_t brg__f32_to_bf16(float f) {
  uint32_t x = f32_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
  return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

float brg__bf16_to_f32(uint16_t h) {
  return bits_f32((uint32_t)h << 16);
}

#ifdef BRG_HAVE_F16C_PATH
__attribute__((target("avx,f16c"))) static void f32_to_f16_f16c(uint16_t *dst, const float *src,
                                                                size_t n, float scale) {
  size_t i = 0;
  __m256 s = _mm256_set1_ps(scale);
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_mul_ps(_mm256_loadu_ps(src + i), s);
    _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
  for (; i < n; i++) dst[i] = brg__f32_to_f16(src[i] * scale);
}
__attribute__((target("avx,f16c"))) static void f16_to_f32_f16c(float *dst, const uint16_t *src,
                                                                size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
  for (; i < n; i++) dst[i] = brg__f16_to_f32(src[i]);
}
static int have_f16c(void) {
  static int cached = -1;
  if (cached < 0) cached = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
  return cached;
}
#endif

void brg__convert_to_half(uint16_t *dst, brg_dtype half, const void *src, brg_dtype src_dtype,
                          size_t n, float scale) {
  if (src_dtype == BRG_FLOAT32) {
    const float *s = src;
    if (half == BRG_FLOAT16) {
#ifdef BRG_HAVE_F16C_PATH
      if (have_f16c()) {
        f32_to_f16_f16c(dst, s, n, scale);
        return;
      }
#endif
      for (size_t i = 0; i < n; i++) dst[i] = brg__f32_to_f16(s[i] * scale);
    } else {
      for (size_t i = 0; i < n; i++) dst[i] = brg__f32_to_bf16(s[i] * scale);
    }
  } else {
    const double *s = src;
    if (half == BRG_FLOAT16)
      for (size_t i = 0; i < n; i++) dst[i] = brg__f32_to_f16((float)(s[i] * scale));
    else
      for (size_t i = 0; i < n; i++) dst[i] = brg__f32_to_bf16((float)(s[i] * scale));
  }
}

void brg__convert_from_half(void *dst, brg_dtype dst_dtype, const uint16_t *src, brg_dtype half,
                            size_t n) {
  if (dst_dtype == BRG_FLOAT32) {
    float *d = dst;
    if (half == BRG_FLOAT16) {
#ifdef BRG_HAVE_F16C_PATH
      if (have_f16c()) {
        f16_to_f32_f16c(d, src, n);
        return;
      }
#endif
      for (size_t i = 0; i < n; i++) d[i] = brg__f16_to_f32(src[i]);
    } else {
      for (size_t i = 0; i < n; i++) d[i] = brg__bf16_to_f32(src[i]);
    }
  } else {
    double *d = dst;
    if (half == BRG_FLOAT16)
      for (size_t i = 0; i < n; i++) d[i] = brg__f16_to_f32(src[i]);
    else
      for (size_t i = 0; i < n; i++) d[i] = brg__bf16_to_f32(src[i]);
  }
}
