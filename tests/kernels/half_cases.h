/*
 * float32 bit patterns that pin down a float32 -> float16 / bfloat16
 * conversion, shared by the CPU check of elem.h's conversions
 * (tests/kernels/test_half_convert.c) and the GPU one
 * (tests/gpu/test_convert_gpu.cu), so both look at the same cases.
 *
 * For every non-negative finite value v of either format and the next one
 * up (Inf counting as 2^(emax+1), where IEEE puts the overflow threshold):
 * v and the float32 patterns next to it, and the tie halfway to the next
 * value with two float32 patterns on either side; both signs. Those are
 * every rounding boundary of both formats, normal and subnormal, and the
 * overflow threshold. Then NaNs with every float16 / bfloat16 payload,
 * signalling and quiet; infinities, zeros and float32 extremes; and a
 * stride through all 2^32 patterns. About 2.1 million in all.
 *
 * The values come from ldexp in double, not from the code under test.
 */
#ifndef BRG_TEST_HALF_CASES_H
#define BRG_TEST_HALF_CASES_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Value of the non-negative pattern v of a format with `mbits` stored
 * mantissa bits and exponent bias `bias`; the Inf pattern gives
 * 2^(emax+1), the value rounding overflows to. */
static inline double brg_test_half_value(unsigned v, int mbits, int bias) {
  unsigned e = v >> mbits, m = v & ((1u << mbits) - 1u);
  if (e == 0) return ldexp((double)m, 1 - bias - mbits);
  return ldexp((double)(m | (1u << mbits)), (int)e - bias - mbits);
}

static inline uint32_t brg_test_f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

/* Writes the patterns to out (at most cap of them; out may be NULL) and
 * returns how many there are. */
static inline size_t brg_test_half_cases(uint32_t *out, size_t cap) {
  size_t n = 0;
#define BRG__EMIT(u)                                                                               \
  do {                                                                                             \
    if (out && n < cap) out[n] = (uint32_t)(u);                                                    \
    n++;                                                                                           \
  } while (0)
  static const struct {
    int mbits, bias;
    unsigned inf;
  } fmt[2] = {{10, 15, 0x7c00u}, {7, 127, 0x7f80u}};
  for (int f = 0; f < 2; f++)
    for (unsigned v = 0; v < fmt[f].inf; v++) {
      double lo = brg_test_half_value(v, fmt[f].mbits, fmt[f].bias);
      double hi = brg_test_half_value(v + 1, fmt[f].mbits, fmt[f].bias);
      /* Both are exact in float32: at most 9 (bfloat16) or 12 (float16)
       * significant bits, inside float32's range. */
      uint32_t l = brg_test_f32_bits((float)lo), m = brg_test_f32_bits((float)((lo + hi) / 2));
      for (int k = 0; k < 2; k++) {
        uint32_t s = k ? 0x80000000u : 0;
        if (l) BRG__EMIT(s | (l - 1));
        BRG__EMIT(s | l);
        BRG__EMIT(s | (l + 1));
        for (uint32_t d = 0; d < 5; d++) BRG__EMIT(s | (m + d - 2));
      }
    }
  for (int k = 0; k < 2; k++) {
    uint32_t s = k ? 0x80000000u : 0;
    /* NaNs: every payload of the top 10 fraction bits (float16's; bfloat16
     * keeps the top 7 of them), with nothing, the lowest bit or all bits
     * below set; bit 22 is the quiet bit, so both kinds are here. */
    for (uint32_t p = 0; p < 1024; p++) {
      static const uint32_t low[] = {0, 1, 0x1fff};
      for (int j = 0; j < 3; j++)
        if (p | low[j]) BRG__EMIT(s | 0x7f800000u | p << 13 | low[j]);
    }
    static const uint32_t special[] = {
        0x00000000u, /* 0 */
        0x7f800000u, /* Inf */
        0x00000001u, /* smallest subnormal */
        0x007fffffu, /* largest subnormal */
        0x00800000u, /* smallest normal */
        0x7f7fffffu, /* largest finite */
        0x3f800000u, /* 1 */
    };
    for (size_t j = 0; j < sizeof special / sizeof special[0]; j++) BRG__EMIT(s | special[j]);
  }
  /* A prime stride through every pattern. */
  for (uint64_t u = 0; u < (1ull << 32); u += 4099) BRG__EMIT(u);
#undef BRG__EMIT
  return n;
}

#endif
