/*
 * elem.h's float16 / bfloat16 <-> float32 conversions (the CPU ones, which
 * the GPU ones must match bit for bit: tests/gpu/test_convert_gpu.cu)
 * against references that share no code with them:
 *
 * - a reference written here in double arithmetic (ldexp, frexp and
 *   nearbyint, which rounds to nearest even), for both formats;
 * - the compiler's _Float16 conversions (libgcc's soft-float routines on a
 *   baseline x86-64 build), for float16;
 * - F16C hardware (vcvtps2ph / vcvtph2ps), for float16, where the CPU has it.
 *
 * Widening: all 65,536 patterns of each format. Narrowing, both the plain
 * conversion and the rounding of op results (canonical NaN): the float32
 * patterns of half_cases.h, every rounding boundary of both formats among
 * them. GCC 12 has no bfloat16 arithmetic type in C, so bfloat16 has the
 * double reference only.
 *
 * NaN rules (elem.h): a plain conversion keeps the sign and the top payload
 * bits and sets the quiet bit; the rounding of op results gives the
 * canonical NaN (0x7e00, 0x7fc0).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "elem.h"
#include "half_cases.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define HAVE_X86 1
#else
#define HAVE_X86 0
#endif

/* _Float16 with conversions to and from float (GCC 12 on x86-64 with SSE2). */
#if defined(__FLT16_MANT_DIG__)
#define HAVE_FLOAT16 1
#else
#define HAVE_FLOAT16 0
#endif

struct fmt {
  const char *name;
  int mbits, bias;
  uint16_t canonical_nan;
};
static const struct fmt F16 = {"float16", 10, 15, 0x7e00};
static const struct fmt BF16 = {"bfloat16", 7, 127, 0x7fc0};

static uint32_t bits_of(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}
static float float_of(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static uint16_t inf_of(const struct fmt *f) {
  return (uint16_t)(((1u << (15 - f->mbits)) - 1u) << f->mbits);
}

/* ---- the double reference ----------------------------------------------- */

static uint32_t ref_widen(const struct fmt *f, uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint16_t ah = h & 0x7fffu, inf = inf_of(f);
  if (ah > inf) /* NaN: quiet, payload moved to the top of float32's fraction */
    return sign | 0x7fc00000u | (uint32_t)(ah & ((1u << f->mbits) - 1u)) << (23 - f->mbits);
  if (ah == inf) return sign | 0x7f800000u;
  double v = brg_test_half_value(ah, f->mbits, f->bias);
  return sign | bits_of((float)v); /* exact: float32 holds every value of both */
}

/* x rounded to the format, nearest even; a NaN as a plain conversion
 * makes it. */
static uint16_t ref_narrow(const struct fmt *f, uint32_t x) {
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000u), inf = inf_of(f);
  float xf = float_of(x);
  if (isnan(xf))
    return (uint16_t)(sign | inf | (1u << (f->mbits - 1)) | ((x & 0x7fffffu) >> (23 - f->mbits)));
  double a = fabs((double)xf);
  if (isinf(a)) return sign | inf;
  if (a == 0) return sign;
  int emin = 1 - f->bias, E;
  frexp(a, &E); /* a = m * 2^E, m in [0.5, 1) */
  int e = E - 1 < emin ? emin : E - 1;
  double ulp = ldexp(1.0, e - f->mbits);
  double q = nearbyint(a / ulp); /* a / ulp is exact; the rounding is to even */
  double v = q * ulp;
  if (v >= ldexp(1.0, f->bias + 1)) return sign | inf;
  if (v < ldexp(1.0, emin)) return (uint16_t)(sign | (uint16_t)q); /* subnormal or 0 */
  frexp(v, &E);
  e = E - 1;
  uint16_t mant = (uint16_t)(ldexp(v, f->mbits - e) - ldexp(1.0, f->mbits));
  return (uint16_t)(sign | (uint16_t)((e + f->bias) << f->mbits) | mant);
}

/* ---- the other references ----------------------------------------------- */

#if HAVE_FLOAT16
/* Through memory, so the conversions happen at run time (libgcc). */
static uint32_t gcc_f16_widen(uint16_t h) {
  _Float16 x;
  memcpy(&x, &h, sizeof x);
  volatile float f = (float)x;
  return bits_of(f);
}
static uint16_t gcc_f16_narrow(uint32_t x) {
  volatile _Float16 h = (_Float16)float_of(x);
  _Float16 copy = h;
  uint16_t u;
  memcpy(&u, &copy, sizeof u);
  return u;
}
#endif

#if HAVE_X86
static int have_f16c(void) {
  return __builtin_cpu_supports("f16c");
}
__attribute__((target("f16c"))) static uint32_t hw_f16_widen(uint16_t h) {
  return bits_of(_cvtsh_ss(h));
}
__attribute__((target("f16c"))) static uint16_t hw_f16_narrow(uint32_t x) {
  return (uint16_t)_cvtss_sh(float_of(x), _MM_FROUND_TO_NEAREST_INT);
}
#else
static int have_f16c(void) {
  return 0;
}
#endif

/* ---- checks ------------------------------------------------------------- */

static int report(const char *what, unsigned long long checked, unsigned long long bad) {
  print_message("%-58s %9llu patterns, %llu differ\n", what, checked, bad);
  return bad == 0;
}

#define MAX_SHOWN 10
static void show(unsigned long long *bad, const char *fmtstr, ...) {
  if ((*bad)++ >= MAX_SHOWN) return;
  va_list ap;
  va_start(ap, fmtstr);
  vfprintf(stderr, fmtstr, ap);
  va_end(ap);
}

static void test_widen_exhaustive(void **state) {
  (void)state;
  unsigned long long bad_f16 = 0, bad_bf16 = 0, bad_gcc = 0, bad_hw = 0, bad_widen = 0;
  int hw = have_f16c();
  for (uint32_t i = 0; i < 65536; i++) {
    uint16_t h = (uint16_t)i;
    uint32_t got = bits_of(brg__f16_to_f32(h)), want = ref_widen(&F16, h);
    if (got != want) show(&bad_f16, "f16 %04x -> %08x, reference %08x\n", h, got, want);
#if HAVE_FLOAT16
    if (got != gcc_f16_widen(h))
      show(&bad_gcc, "f16 %04x -> %08x, _Float16 %08x\n", h, got, gcc_f16_widen(h));
#endif
#if HAVE_X86
    if (hw && got != hw_f16_widen(h))
      show(&bad_hw, "f16 %04x -> %08x, F16C %08x\n", h, got, hw_f16_widen(h));
#endif
    got = bits_of(brg__bf16_to_f32(h));
    want = ref_widen(&BF16, h);
    if (got != want) show(&bad_bf16, "bf16 %04x -> %08x, reference %08x\n", h, got, want);
    /* What the ops widen with: the same number, or some NaN for a NaN. */
    float w16 = brg__f16_widen(h), wb16 = brg__bf16_widen(h);
    int nan16 = (h & 0x7fffu) > 0x7c00u, nanb16 = (h & 0x7fffu) > 0x7f80u;
    if (nan16 ? !isnan(w16) : bits_of(w16) != ref_widen(&F16, h))
      show(&bad_widen, "f16 widen %04x -> %08x\n", h, bits_of(w16));
    if (nanb16 ? !isnan(wb16) : bits_of(wb16) != ref_widen(&BF16, h))
      show(&bad_widen, "bf16 widen %04x -> %08x\n", h, bits_of(wb16));
  }
  int ok = report("float16 -> float32 vs double reference", 65536, bad_f16);
#if HAVE_FLOAT16
  ok &= report("float16 -> float32 vs _Float16 (libgcc)", 65536, bad_gcc);
#else
  print_message("float16 -> float32 vs _Float16: no _Float16 in this compiler\n");
#endif
  if (hw)
    ok &= report("float16 -> float32 vs F16C", 65536, bad_hw);
  else
    print_message("float16 -> float32 vs F16C: this CPU has no F16C\n");
  ok &= report("bfloat16 -> float32 vs double reference", 65536, bad_bf16);
  ok &= report("float16 / bfloat16 widening for ops", 2 * 65536, bad_widen);
  if (!ok) fail_msg("conversions to float32 differ (first ones above)");
}

static void test_narrow_cases(void **state) {
  (void)state;
  size_t n = brg_test_half_cases(NULL, 0);
  uint32_t *cases = malloc(n * sizeof *cases);
  assert_non_null(cases);
  assert_int_equal(brg_test_half_cases(cases, n), n);
  unsigned long long bad_f16 = 0, bad_bf16 = 0, bad_gcc = 0, bad_hw = 0, bad_round = 0;
  unsigned long long ties = 0, bties = 0, nans = 0, subnormal = 0, overflow = 0;
  int hw = have_f16c();
  for (size_t i = 0; i < n; i++) {
    uint32_t x = cases[i];
    float f = float_of(x);
    uint16_t got = brg__f32_to_f16(f), want = ref_narrow(&F16, x);
    if (got != want) show(&bad_f16, "f32 %08x -> f16 %04x, reference %04x\n", x, got, want);
#if HAVE_FLOAT16
    uint16_t g = gcc_f16_narrow(x);
    if (got != g) show(&bad_gcc, "f32 %08x -> f16 %04x, _Float16 %04x\n", x, got, g);
#endif
#if HAVE_X86
    if (hw && got != hw_f16_narrow(x))
      show(&bad_hw, "f32 %08x -> f16 %04x, F16C %04x\n", x, got, hw_f16_narrow(x));
#endif
    uint16_t r = brg__f16_round(f), rw = isnan(f) ? F16.canonical_nan : want;
    if (r != rw) show(&bad_round, "f16 round %08x -> %04x, want %04x\n", x, r, rw);

    uint16_t bgot = brg__f32_to_bf16(f), bwant = ref_narrow(&BF16, x);
    if (bgot != bwant) show(&bad_bf16, "f32 %08x -> bf16 %04x, reference %04x\n", x, bgot, bwant);
    r = brg__bf16_round(f);
    rw = isnan(f) ? BF16.canonical_nan : bwant;
    if (r != rw) show(&bad_round, "bf16 round %08x -> %04x, want %04x\n", x, r, rw);

    /* What the set covers, for the record. */
    double a = fabs((double)f);
    nans += isnan(f);
    overflow += !isnan(f) && (want & 0x7fffu) == 0x7c00u && !isinf(f);
    subnormal += a > 0 && a < 0x1p-14;
    if (!isnan(f) && !isinf(f) && a != 0) { /* a tie: a / ulp ends in .5 */
      int e = ilogb(a) < -14 ? -14 : ilogb(a);
      double q = ldexp(a, F16.mbits - e);
      ties += q - floor(q) == 0.5;
      e = ilogb(a) < -126 ? -126 : ilogb(a);
      q = ldexp(a, BF16.mbits - e);
      bties += q - floor(q) == 0.5;
    }
  }
  print_message("narrowing: %zu float32 patterns: %llu NaN, %llu float16 and %llu bfloat16 "
                "ties, %llu below float16's normal range, %llu finite overflowing float16\n",
                n, nans, ties, bties, subnormal, overflow);
  int ok = report("float32 -> float16 vs double reference", n, bad_f16);
#if HAVE_FLOAT16
  ok &= report("float32 -> float16 vs _Float16 (libgcc)", n, bad_gcc);
#endif
  if (hw) ok &= report("float32 -> float16 vs F16C", n, bad_hw);
  ok &= report("float32 -> bfloat16 vs double reference", n, bad_bf16);
  ok &= report("float16 / bfloat16 rounding of op results (canonical NaN)", 2 * n, bad_round);
  free(cases);
  if (!ok) fail_msg("conversions from float32 differ (first ones above)");
}

/* The reference itself, on values whose answers are known by heart. */
static void test_reference_sanity(void **state) {
  (void)state;
  assert_int_equal(ref_narrow(&F16, bits_of(65504.0f)), 0x7bff);
  assert_int_equal(ref_narrow(&F16, bits_of(65519.99f)), 0x7bff);
  assert_int_equal(ref_narrow(&F16, bits_of(65520.0f)), 0x7c00); /* the tie goes to Inf */
  assert_int_equal(ref_narrow(&F16, bits_of(0x1p-24f)), 0x0001);
  assert_int_equal(ref_narrow(&F16, bits_of(0x1p-25f)), 0x0000);   /* tie to even: 0 */
  assert_int_equal(ref_narrow(&F16, bits_of(0x1.8p-24f)), 0x0002); /* tie to even: 2 */
  assert_int_equal(ref_narrow(&F16, bits_of(-1.0f)), 0xbc00);
  assert_int_equal(ref_narrow(&F16, 0x7f800001u), 0x7e00);
  assert_int_equal(ref_narrow(&BF16, bits_of(1.0f)), 0x3f80);
  assert_int_equal(ref_narrow(&BF16, 0x3f808000u), 0x3f80); /* tie to even */
  assert_int_equal(ref_narrow(&BF16, 0x3f818000u), 0x3f82);
  assert_int_equal(ref_narrow(&BF16, 0x7f7f8000u), 0x7f80); /* the tie above max: Inf */
  assert_int_equal(ref_narrow(&BF16, 0x7f7f7fffu), 0x7f7f);
  assert_int_equal(ref_narrow(&BF16, 0x00008000u), 0x0000); /* subnormal tie to even */
  assert_int_equal(ref_narrow(&BF16, 0x00018000u), 0x0002);
  assert_int_equal(ref_narrow(&BF16, 0xff800001u), 0xffc0);
  assert_int_equal(ref_widen(&F16, 0x0001), bits_of(0x1p-24f));
  assert_int_equal(ref_widen(&F16, 0x7c01), 0x7fc02000u);
  assert_int_equal(ref_widen(&BF16, 0xff81), 0xffc10000u);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_reference_sanity),
      cmocka_unit_test(test_widen_exhaustive),
      cmocka_unit_test(test_narrow_cases),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
