/*
 * Host reduce and copy kernels.
 *
 * Every (dtype, op) pair has one plain loop over the element functions of
 * elem.h; the compiler vectorizes those. The loops are compiled three times,
 * for the baseline ISA, for AVX2 and for AVX-512, and the set that fits the
 * CPU is picked once at first use. float16 and bfloat16 get hand-written
 * AVX2+F16C and AVX-512 loops instead, because the compiler does not
 * vectorize the conversions; they widen 8 to 32 lanes to float32, compute,
 * and round back to nearest even, bit for bit what elem.h computes.
 *
 * Aliasing: a destination may be exactly a source (in place), never a
 * partial overlap. Element i is then read before it is written and no
 * iteration touches another's element, so there is no loop-carried
 * dependency; BRG__IVDEP tells the vectorizer so instead of `restrict`,
 * which would be a false promise for in-place calls.
 */
#include <stdint.h>
#include <string.h>

#include "elem.h"
#include "kernels.h"

#if defined(__x86_64__) || defined(__i386__)
#define BRG__X86 1
#include <cpuid.h>
#include <immintrin.h>
#else
#define BRG__X86 0
#endif

/* Test hook: force one ISA ("generic", "avx2", "avx512"), or NULL to go
 * back to the detected one. Returns 0, or -1 when the name is unknown or
 * the CPU cannot run it. */
int brg__kernels_force_isa(const char *name);

/* Exact aliasing leaves no loop-carried dependency; say so to the vectorizer. */
#if defined(__clang__)
#define BRG__IVDEP _Pragma("clang loop vectorize(assume_safety)")
/* Loops with integer division or scalar float16 conversion stay scalar. */
#pragma clang diagnostic ignored "-Wpass-failed"
#elif defined(__GNUC__)
#define BRG__IVDEP _Pragma("GCC ivdep")
#else
#define BRG__IVDEP
#endif

typedef void (*brg__reduce_fn)(void *d0, void *d1, const void *a, const void *b, size_t n, int div);
typedef void (*brg__divide_fn)(void *d, const void *s, size_t n, int div);

/* ---- plain loops, instantiated once per ISA ----------------------------- */

/* One reduce loop. EXPR combines a[i] and b[i] (and `div` for avg). */
#define BRG__REDUCE_FN(isa, attr, t, T, op, EXPR)                                                  \
  attr static void reduce_##isa##_##t##_##op(void *d0v, void *d1v, const void *av, const void *bv, \
                                             size_t n, int div) {                                  \
    T *d0 = (T *)d0v, *d1 = (T *)d1v;                                                              \
    const T *a = (const T *)av, *b = (const T *)bv;                                                \
    (void)div;                                                                                     \
    if (d1) {                                                                                      \
      BRG__IVDEP for (size_t i = 0; i < n; i++) {                                                  \
        T r = EXPR;                                                                                \
        d0[i] = r;                                                                                 \
        d1[i] = r;                                                                                 \
      }                                                                                            \
    } else {                                                                                       \
      BRG__IVDEP for (size_t i = 0; i < n; i++) d0[i] = EXPR;                                      \
    }                                                                                              \
  }

#define BRG__REDUCE_FNS(isa, attr, t, T)                                                           \
  BRG__REDUCE_FN(isa, attr, t, T, sum, brg__##t##_sum(a[i], b[i]))                                 \
  BRG__REDUCE_FN(isa, attr, t, T, prod, brg__##t##_prod(a[i], b[i]))                               \
  BRG__REDUCE_FN(isa, attr, t, T, min, brg__##t##_min(a[i], b[i]))                                 \
  BRG__REDUCE_FN(isa, attr, t, T, max, brg__##t##_max(a[i], b[i]))                                 \
  BRG__REDUCE_FN(isa, attr, t, T, avg, brg__##t##_avg(a[i], b[i], div))

/* The integers' bitwise ops, on top of the arithmetic ones. */
#define BRG__INT_REDUCE_FNS(isa, attr, t, T)                                                       \
  BRG__REDUCE_FNS(isa, attr, t, T)                                                                 \
  BRG__REDUCE_FN(isa, attr, t, T, band, brg__##t##_band(a[i], b[i]))                               \
  BRG__REDUCE_FN(isa, attr, t, T, bor, brg__##t##_bor(a[i], b[i]))                                 \
  BRG__REDUCE_FN(isa, attr, t, T, bxor, brg__##t##_bxor(a[i], b[i]))

#define BRG__DIVIDE_FN(isa, attr, t, T)                                                            \
  attr static void divide_##isa##_##t(void *dv, const void *sv, size_t n, int div) {               \
    T *d = (T *)dv;                                                                                \
    const T *s = (const T *)sv;                                                                    \
    BRG__IVDEP for (size_t i = 0; i < n; i++) d[i] = brg__##t##_div(s[i], div);                    \
  }

/* Everything but the half-type reduce loops, which the x86 ISAs replace. */
#define BRG__PLAIN_FNS(isa, attr)                                                                  \
  BRG__INT_REDUCE_FNS(isa, attr, i8, int8_t)                                                       \
  BRG__INT_REDUCE_FNS(isa, attr, u8, uint8_t)                                                      \
  BRG__INT_REDUCE_FNS(isa, attr, i32, int32_t)                                                     \
  BRG__INT_REDUCE_FNS(isa, attr, u32, uint32_t)                                                    \
  BRG__INT_REDUCE_FNS(isa, attr, i64, int64_t)                                                     \
  BRG__INT_REDUCE_FNS(isa, attr, u64, uint64_t)                                                    \
  BRG__REDUCE_FNS(isa, attr, f32, float)                                                           \
  BRG__REDUCE_FNS(isa, attr, f64, double)                                                          \
  BRG__DIVIDE_FN(isa, attr, i8, int8_t)                                                            \
  BRG__DIVIDE_FN(isa, attr, u8, uint8_t)                                                           \
  BRG__DIVIDE_FN(isa, attr, i32, int32_t)                                                          \
  BRG__DIVIDE_FN(isa, attr, u32, uint32_t)                                                         \
  BRG__DIVIDE_FN(isa, attr, i64, int64_t)                                                          \
  BRG__DIVIDE_FN(isa, attr, u64, uint64_t)                                                         \
  BRG__DIVIDE_FN(isa, attr, f16, uint16_t)                                                         \
  BRG__DIVIDE_FN(isa, attr, bf16, uint16_t)                                                        \
  BRG__DIVIDE_FN(isa, attr, f32, float)                                                            \
  BRG__DIVIDE_FN(isa, attr, f64, double)

// clang-format off
#define BRG__ROW(isa, t)                                                                \
  { reduce_##isa##_##t##_sum, reduce_##isa##_##t##_prod, reduce_##isa##_##t##_min,      \
    reduce_##isa##_##t##_max, reduce_##isa##_##t##_avg }
/* Integers add the bitwise ops; floating-point rows leave them NULL. */
#define BRG__INT_ROW(isa, t)                                                            \
  { reduce_##isa##_##t##_sum, reduce_##isa##_##t##_prod, reduce_##isa##_##t##_min,      \
    reduce_##isa##_##t##_max, reduce_##isa##_##t##_avg, reduce_##isa##_##t##_band,      \
    reduce_##isa##_##t##_bor, reduce_##isa##_##t##_bxor }

/* Rows in brg_dtype order. */
#define BRG__TABLE(isa, name)                                                                   \
  { name,                                                                                       \
    { BRG__INT_ROW(isa, i8), BRG__INT_ROW(isa, u8), BRG__INT_ROW(isa, i32),                     \
      BRG__INT_ROW(isa, u32), BRG__INT_ROW(isa, i64), BRG__INT_ROW(isa, u64),                   \
      BRG__ROW(isa, f16), BRG__ROW(isa, bf16), BRG__ROW(isa, f32), BRG__ROW(isa, f64) },        \
    { divide_##isa##_i8, divide_##isa##_u8, divide_##isa##_i32, divide_##isa##_u32,     \
      divide_##isa##_i64, divide_##isa##_u64, divide_##isa##_f16, divide_##isa##_bf16,  \
      divide_##isa##_f32, divide_##isa##_f64 } }
// clang-format on

struct brg__kernel_table {
  const char *name;
  brg__reduce_fn reduce[BRG_NUM_DTYPES][BRG_NUM_OPS];
  brg__divide_fn divide[BRG_NUM_DTYPES];
};

BRG__PLAIN_FNS(generic, )
BRG__REDUCE_FNS(generic, , f16, uint16_t)
BRG__REDUCE_FNS(generic, , bf16, uint16_t)

/* ---- float16 / bfloat16 with AVX2 + F16C and AVX-512 -------------------- */

#if BRG__X86

/* The scalar element op, for the tails; `op` is a constant once inlined. */
static inline __attribute__((always_inline)) uint16_t half_scalar(int bf, brg_op op, uint16_t a,
                                                                  uint16_t b, int div) {
  switch (op) {
  case BRG_SUM: return bf ? brg__bf16_sum(a, b) : brg__f16_sum(a, b);
  case BRG_PROD: return bf ? brg__bf16_prod(a, b) : brg__f16_prod(a, b);
  case BRG_MIN: return bf ? brg__bf16_min(a, b) : brg__f16_min(a, b);
  case BRG_MAX: return bf ? brg__bf16_max(a, b) : brg__f16_max(a, b);
  default: return bf ? brg__bf16_avg(a, b, div) : brg__f16_avg(a, b, div);
  }
}

/*
 * float16 goes through the F16C conversions (vcvtph2ps, and vcvtps2ph with
 * round-to-nearest-even). bfloat16 widens a full integer vector by
 * interleaving it with zeros (unpacklo/hi), which puts the lanes out of
 * order within each 128-bit block; packus on the way back restores the
 * order, so no cross-lane shuffle is needed.
 *
 * brg__f32_min / _max map onto minps(b, a), which is `b < a ? b : a`;
 * equal operands take OR / AND of the bits, and unordered lanes become NaN.
 * Every NaN leaves as the canonical one, as in brg__f16_round.
 */

#define BRG__AVX2 __attribute__((target("avx2,f16c")))
#define BRG__AVX2_INLINE static inline __attribute__((target("avx2,f16c"), always_inline))
#define BRG__RNE (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

/* Any NaN to the canonical one: 0x7fc00000 narrows to 0x7e00 and 0x7fc0. */
BRG__AVX2_INLINE __m256 avx2_canon(__m256 v) {
  __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
  return _mm256_blendv_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000)), nan);
}

/* bfloat16 of each lane, nearest even, in the low 16 bits of the lane. */
BRG__AVX2_INLINE __m256i avx2_bf16_lanes(__m256 v) {
  __m256i x = _mm256_castps_si256(avx2_canon(v));
  __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  x = _mm256_add_epi32(x, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
  return _mm256_srli_epi32(x, 16);
}

/* Round each lane to the half type and widen it again (lane order kept). */
BRG__AVX2_INLINE __m256 avx2_round_trip(int bf, __m256 v) {
  if (bf) return _mm256_castsi256_ps(_mm256_slli_epi32(avx2_bf16_lanes(v), 16));
  return _mm256_cvtph_ps(_mm256_cvtps_ph(avx2_canon(v), BRG__RNE));
}

/* 16 bfloat16 -> 2 x 8 float32, out of order within 128-bit blocks. */
BRG__AVX2_INLINE void avx2_bf16_widen2(__m256i h, __m256 *lo, __m256 *hi) {
  *lo = _mm256_castsi256_ps(_mm256_unpacklo_epi16(_mm256_setzero_si256(), h));
  *hi = _mm256_castsi256_ps(_mm256_unpackhi_epi16(_mm256_setzero_si256(), h));
}

/* Inverse of avx2_bf16_widen2, rounding to nearest even. */
BRG__AVX2_INLINE __m256i avx2_bf16_narrow2(__m256 lo, __m256 hi) {
  return _mm256_packus_epi32(avx2_bf16_lanes(lo), avx2_bf16_lanes(hi));
}

/* The op in float32, before the final rounding. */
BRG__AVX2_INLINE __m256 avx2_op(int bf, brg_op op, __m256 a, __m256 b, __m256 div) {
  __m256 r, eq, nan;
  switch (op) {
  case BRG_SUM: return _mm256_add_ps(a, b);
  case BRG_PROD: return _mm256_mul_ps(a, b);
  case BRG_MIN:
  case BRG_MAX:
    eq = _mm256_cmp_ps(a, b, _CMP_EQ_OQ);
    nan = _mm256_cmp_ps(a, b, _CMP_UNORD_Q);
    if (op == BRG_MIN) {
      r = _mm256_min_ps(b, a);
      r = _mm256_blendv_ps(r, _mm256_or_ps(a, b), eq);
    } else {
      r = _mm256_max_ps(b, a);
      r = _mm256_blendv_ps(r, _mm256_and_ps(a, b), eq);
    }
    return _mm256_blendv_ps(r, nan, nan); /* all-ones is a NaN */
  default:                                /* avg: the sum is rounded to the half type first */
    return _mm256_div_ps(avx2_round_trip(bf, _mm256_add_ps(a, b)), div);
  }
}

/* float16 goes 8 lanes at a time straight from and to memory, where the
 * F16C conversions cost no shuffle; bfloat16 goes 16 at a time. */
BRG__AVX2_INLINE void avx2_half(int bf, brg_op op, void *d0v, void *d1v, const void *av,
                                const void *bv, size_t n, int div) {
  uint16_t *d0 = (uint16_t *)d0v, *d1 = (uint16_t *)d1v;
  const uint16_t *a = (const uint16_t *)av, *b = (const uint16_t *)bv;
  __m256 vdiv = _mm256_set1_ps((float)div);
  size_t i = 0;
  if (bf) {
    for (; i + 16 <= n; i += 16) {
      __m256 alo, ahi, blo, bhi;
      avx2_bf16_widen2(_mm256_loadu_si256((const __m256i *)(a + i)), &alo, &ahi);
      avx2_bf16_widen2(_mm256_loadu_si256((const __m256i *)(b + i)), &blo, &bhi);
      __m256i r =
          avx2_bf16_narrow2(avx2_op(bf, op, alo, blo, vdiv), avx2_op(bf, op, ahi, bhi, vdiv));
      _mm256_storeu_si256((__m256i *)(d0 + i), r);
      if (d1) _mm256_storeu_si256((__m256i *)(d1 + i), r);
    }
  } else {
    for (; i + 8 <= n; i += 8) {
      __m256 va = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(a + i)));
      __m256 vb = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + i)));
      __m128i r = _mm256_cvtps_ph(avx2_canon(avx2_op(bf, op, va, vb, vdiv)), BRG__RNE);
      _mm_storeu_si128((__m128i *)(d0 + i), r);
      if (d1) _mm_storeu_si128((__m128i *)(d1 + i), r);
    }
  }
  for (; i < n; i++) {
    uint16_t r = half_scalar(bf, op, a[i], b[i], div);
    d0[i] = r;
    if (d1) d1[i] = r;
  }
}

#define BRG__AVX2_HALF_FN(t, bf, op, OP)                                                           \
  BRG__AVX2 static void reduce_avx2_##t##_##op(void *d0, void *d1, const void *a, const void *b,   \
                                               size_t n, int div) {                                \
    avx2_half(bf, OP, d0, d1, a, b, n, div);                                                       \
  }
#define BRG__AVX2_HALF_FNS(t, bf)                                                                  \
  BRG__AVX2_HALF_FN(t, bf, sum, BRG_SUM)                                                           \
  BRG__AVX2_HALF_FN(t, bf, prod, BRG_PROD)                                                         \
  BRG__AVX2_HALF_FN(t, bf, min, BRG_MIN)                                                           \
  BRG__AVX2_HALF_FN(t, bf, max, BRG_MAX)                                                           \
  BRG__AVX2_HALF_FN(t, bf, avg, BRG_AVG)

BRG__AVX2_HALF_FNS(f16, 0)
BRG__AVX2_HALF_FNS(bf16, 1)
BRG__PLAIN_FNS(avx2, BRG__AVX2)

#define BRG__AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
#define BRG__AVX512_INLINE                                                                         \
  static inline __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq"), always_inline))

BRG__AVX512_INLINE __m512 avx512_canon(__m512 v) {
  __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  return _mm512_mask_mov_ps(v, nan, _mm512_castsi512_ps(_mm512_set1_epi32(0x7fc00000)));
}

BRG__AVX512_INLINE __m512i avx512_bf16_lanes(__m512 v) {
  __m512i x = _mm512_castps_si512(avx512_canon(v));
  __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
  x = _mm512_add_epi32(x, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
  return _mm512_srli_epi32(x, 16);
}

BRG__AVX512_INLINE __m512 avx512_round_trip(int bf, __m512 v) {
  if (bf) return _mm512_castsi512_ps(_mm512_slli_epi32(avx512_bf16_lanes(v), 16));
  return _mm512_cvtph_ps(_mm512_cvtps_ph(avx512_canon(v), BRG__RNE));
}

BRG__AVX512_INLINE void avx512_bf16_widen2(__m512i h, __m512 *lo, __m512 *hi) {
  *lo = _mm512_castsi512_ps(_mm512_unpacklo_epi16(_mm512_setzero_si512(), h));
  *hi = _mm512_castsi512_ps(_mm512_unpackhi_epi16(_mm512_setzero_si512(), h));
}

BRG__AVX512_INLINE __m512i avx512_bf16_narrow2(__m512 lo, __m512 hi) {
  return _mm512_packus_epi32(avx512_bf16_lanes(lo), avx512_bf16_lanes(hi));
}

BRG__AVX512_INLINE __m512 avx512_op(int bf, brg_op op, __m512 a, __m512 b, __m512 div) {
  __m512 r;
  __mmask16 eq, nan;
  switch (op) {
  case BRG_SUM: return _mm512_add_ps(a, b);
  case BRG_PROD: return _mm512_mul_ps(a, b);
  case BRG_MIN:
  case BRG_MAX:
    eq = _mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ);
    nan = _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q);
    if (op == BRG_MIN) {
      r = _mm512_min_ps(b, a);
      r = _mm512_mask_mov_ps(r, eq, _mm512_or_ps(a, b));
    } else {
      r = _mm512_max_ps(b, a);
      r = _mm512_mask_mov_ps(r, eq, _mm512_and_ps(a, b));
    }
    return _mm512_mask_mov_ps(r, nan, _mm512_castsi512_ps(_mm512_set1_epi32(0x7fc00000)));
  default: return _mm512_div_ps(avx512_round_trip(bf, _mm512_add_ps(a, b)), div);
  }
}

/* 32 bfloat16 lanes (two float32 vectors) a step. */
BRG__AVX512_INLINE __m512i avx512_bf16_step(brg_op op, __m512i a, __m512i b, __m512 div) {
  __m512 alo, ahi, blo, bhi;
  avx512_bf16_widen2(a, &alo, &ahi);
  avx512_bf16_widen2(b, &blo, &bhi);
  return avx512_bf16_narrow2(avx512_op(1, op, alo, blo, div), avx512_op(1, op, ahi, bhi, div));
}

/* 16 float16 lanes a step. */
BRG__AVX512_INLINE __m256i avx512_f16_step(brg_op op, __m256i a, __m256i b, __m512 div) {
  __m512 r = avx512_op(0, op, _mm512_cvtph_ps(a), _mm512_cvtph_ps(b), div);
  return _mm512_cvtps_ph(avx512_canon(r), BRG__RNE);
}

/* The tails run the same lanes under a mask. */
BRG__AVX512_INLINE void avx512_half(int bf, brg_op op, void *d0v, void *d1v, const void *av,
                                    const void *bv, size_t n, int div) {
  uint16_t *d0 = (uint16_t *)d0v, *d1 = (uint16_t *)d1v;
  const uint16_t *a = (const uint16_t *)av, *b = (const uint16_t *)bv;
  __m512 vdiv = _mm512_set1_ps((float)div);
  size_t i = 0;
  if (bf) {
    for (; i + 32 <= n; i += 32) {
      __m512i r = avx512_bf16_step(op, _mm512_loadu_si512(a + i), _mm512_loadu_si512(b + i), vdiv);
      _mm512_storeu_si512(d0 + i, r);
      if (d1) _mm512_storeu_si512(d1 + i, r);
    }
    if (i < n) {
      __mmask32 m = (__mmask32)((1ull << (n - i)) - 1u);
      __m512i r = avx512_bf16_step(op, _mm512_maskz_loadu_epi16(m, a + i),
                                   _mm512_maskz_loadu_epi16(m, b + i), vdiv);
      _mm512_mask_storeu_epi16(d0 + i, m, r);
      if (d1) _mm512_mask_storeu_epi16(d1 + i, m, r);
    }
  } else {
    for (; i + 16 <= n; i += 16) {
      __m256i r = avx512_f16_step(op, _mm256_loadu_si256((const __m256i *)(a + i)),
                                  _mm256_loadu_si256((const __m256i *)(b + i)), vdiv);
      _mm256_storeu_si256((__m256i *)(d0 + i), r);
      if (d1) _mm256_storeu_si256((__m256i *)(d1 + i), r);
    }
    if (i < n) {
      __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
      __m256i r = avx512_f16_step(op, _mm256_maskz_loadu_epi16(m, a + i),
                                  _mm256_maskz_loadu_epi16(m, b + i), vdiv);
      _mm256_mask_storeu_epi16(d0 + i, m, r);
      if (d1) _mm256_mask_storeu_epi16(d1 + i, m, r);
    }
  }
}

#define BRG__AVX512_HALF_FN(t, bf, op, OP)                                                         \
  BRG__AVX512 static void reduce_avx512_##t##_##op(void *d0, void *d1, const void *a,              \
                                                   const void *b, size_t n, int div) {             \
    avx512_half(bf, OP, d0, d1, a, b, n, div);                                                     \
  }
#define BRG__AVX512_HALF_FNS(t, bf)                                                                \
  BRG__AVX512_HALF_FN(t, bf, sum, BRG_SUM)                                                         \
  BRG__AVX512_HALF_FN(t, bf, prod, BRG_PROD)                                                       \
  BRG__AVX512_HALF_FN(t, bf, min, BRG_MIN)                                                         \
  BRG__AVX512_HALF_FN(t, bf, max, BRG_MAX)                                                         \
  BRG__AVX512_HALF_FN(t, bf, avg, BRG_AVG)

BRG__AVX512_HALF_FNS(f16, 0)
BRG__AVX512_HALF_FNS(bf16, 1)
BRG__PLAIN_FNS(avx512, BRG__AVX512)

#endif /* BRG__X86 */

/* ---- dispatch ----------------------------------------------------------- */

enum { ISA_GENERIC, ISA_AVX2, ISA_AVX512, ISA_COUNT };

static const struct brg__kernel_table tables[] = {
    [ISA_GENERIC] = BRG__TABLE(generic, "generic"),
#if BRG__X86
    [ISA_AVX2] = BRG__TABLE(avx2, "avx2"),
    [ISA_AVX512] = BRG__TABLE(avx512, "avx512"),
#endif
};

#if BRG__X86
/* Not every compiler's __builtin_cpu_supports knows "f16c"; ask CPUID. The
 * AVX2 check that goes with it already covers the OS saving YMM state. */
static int cpu_has_f16c(void) {
  unsigned a, b, c, d;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}
#endif

static int isa_supported(int isa) {
#if BRG__X86
  __builtin_cpu_init();
  switch (isa) {
  case ISA_GENERIC: return 1;
  case ISA_AVX2: return __builtin_cpu_supports("avx2") && cpu_has_f16c();
  case ISA_AVX512:
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  default: return 0;
  }
#else
  return isa == ISA_GENERIC;
#endif
}

/* -1 until first use. Every thread computes the same answer, so a race on
 * the first call is harmless. */
static int current_isa = -1;

static int detect_isa(void) {
  for (int isa = ISA_COUNT - 1; isa > ISA_GENERIC; isa--)
    if (isa_supported(isa)) return isa;
  return ISA_GENERIC;
}

static const struct brg__kernel_table *table(void) {
  int isa = __atomic_load_n(&current_isa, __ATOMIC_RELAXED);
  if (isa < 0) {
    isa = detect_isa();
    __atomic_store_n(&current_isa, isa, __ATOMIC_RELAXED);
  }
  return &tables[isa];
}

int brg__kernels_force_isa(const char *name) {
  if (!name) {
    __atomic_store_n(&current_isa, detect_isa(), __ATOMIC_RELAXED);
    return 0;
  }
  for (int isa = 0; isa < ISA_COUNT; isa++) {
    if (isa < (int)(sizeof tables / sizeof tables[0]) && tables[isa].name &&
        strcmp(tables[isa].name, name) == 0 && isa_supported(isa)) {
      __atomic_store_n(&current_isa, isa, __ATOMIC_RELAXED);
      return 0;
    }
  }
  return -1;
}

const char *brg__kernels_isa(void) {
  return table()->name;
}

void brg__reduce(void *dst0, void *dst1, const void *a, const void *b, size_t count,
                 brg_dtype dtype, brg_op op, int divisor) {
  if (count == 0 || (unsigned)dtype >= BRG_NUM_DTYPES || (unsigned)op >= BRG_NUM_OPS) return;
  if (dst1 == dst0) dst1 = NULL;
  if (divisor < 1) divisor = 1; /* callers divide by a rank count; never trap */
  brg__reduce_fn fn = table()->reduce[dtype][op];
  if (fn) fn(dst0, dst1, a, b, count, divisor); /* NULL: a bitwise op on floats */
}

void brg__divide(void *dst, const void *src, size_t count, brg_dtype dtype, int divisor) {
  if (count == 0 || (unsigned)dtype >= BRG_NUM_DTYPES) return;
  if (divisor < 1) divisor = 1;
  table()->divide[dtype](dst, src, count, divisor);
}

/* With two destinations, copy in blocks that stay in L2 so the source is
 * read from memory once. memcpy needs distinct buffers, so skip a
 * destination that is the source. */
#define BRG__COPY_BLOCK ((size_t)256 * 1024)

void brg__copy(void *dst0, void *dst1, const void *src, size_t bytes) {
  char *d0 = dst0 == src ? NULL : (char *)dst0;
  char *d1 = dst1 == src || dst1 == dst0 ? NULL : (char *)dst1;
  const char *s = (const char *)src;
  if (!d0 || !d1) {
    if (d0) memcpy(d0, s, bytes);
    if (d1) memcpy(d1, s, bytes);
    return;
  }
  for (size_t off = 0; off < bytes; off += BRG__COPY_BLOCK) {
    size_t n = bytes - off < BRG__COPY_BLOCK ? bytes - off : BRG__COPY_BLOCK;
    memcpy(d0 + off, s + off, n);
    memcpy(d1 + off, s + off, n);
  }
}

/* Copy with non-temporal stores: for outputs of large collectives that the
 * caller will not read soon, this skips the read-for-ownership of every
 * destination line, a third of the memory traffic of a plain copy. */
void brg__copy_nt(void *dst, const void *src, size_t bytes) {
  if (dst == src || bytes == 0) return;
#if BRG__X86
  char *d = (char *)dst;
  const char *s = (const char *)src;
  size_t head = (16 - ((uintptr_t)d & 15)) & 15;
  if (head > bytes) head = bytes;
  memcpy(d, s, head);
  d += head;
  s += head;
  bytes -= head;
  size_t body = bytes & ~(size_t)63;
  for (size_t i = 0; i < body; i += 64) {
    __m128i a = _mm_loadu_si128((const __m128i *)(s + i));
    __m128i b = _mm_loadu_si128((const __m128i *)(s + i + 16));
    __m128i c = _mm_loadu_si128((const __m128i *)(s + i + 32));
    __m128i e = _mm_loadu_si128((const __m128i *)(s + i + 48));
    _mm_stream_si128((__m128i *)(d + i), a);
    _mm_stream_si128((__m128i *)(d + i + 16), b);
    _mm_stream_si128((__m128i *)(d + i + 32), c);
    _mm_stream_si128((__m128i *)(d + i + 48), e);
  }
  _mm_sfence();
  memcpy(d + body, s + body, bytes - body);
#else
  memcpy(dst, src, bytes);
#endif
}
