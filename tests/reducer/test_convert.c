/* float16/bfloat16 conversions of the compression hooks (reducer/convert.c). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "convert.h"

/* float16 decoded from its fields with ldexp: an independent reference. */
static double f16_ref(uint16_t h) {
  int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  double v;
  if (e == 31)
    v = m ? NAN : INFINITY;
  else if (e == 0)
    v = ldexp(m, -24);
  else
    v = ldexp(1024 + m, e - 25);
  return s ? -v : v;
}

static void test_f16_decode_all(void **state) {
  (void)state;
  for (uint32_t h = 0; h < 65536; h++) {
    double want = f16_ref((uint16_t)h);
    float got = brg__f16_to_f32((uint16_t)h);
    if (isnan(want))
      assert_true(isnan(got));
    else
      assert_true((double)got == want && !signbit(got) == !signbit(want));
  }
}

/* Encoding: every float16 round-trips; the midpoint between neighbours goes
 * to the even one; just off the midpoint goes to the nearer one. */
static void test_f16_encode(void **state) {
  (void)state;
  for (uint32_t h = 0; h < 0x7c00; h++) {
    float f = brg__f16_to_f32((uint16_t)h);
    assert_int_equal(brg__f32_to_f16(f), h);
    assert_int_equal(brg__f32_to_f16(-f), h | 0x8000);
    if (h + 1 < 0x7c00) {
      double lo = f16_ref((uint16_t)h), hi = f16_ref((uint16_t)(h + 1));
      float mid = (float)((lo + hi) / 2); /* exact in float32 */
      assert_int_equal(brg__f32_to_f16(mid), (h & 1) ? h + 1 : h);
      assert_int_equal(brg__f32_to_f16(nextafterf(mid, 0)), h);
      assert_int_equal(brg__f32_to_f16(nextafterf(mid, INFINITY)), h + 1);
    }
  }
  assert_int_equal(brg__f32_to_f16(65504.0f), 0x7bff);
  assert_int_equal(brg__f32_to_f16(65519.0f), 0x7bff);
  assert_int_equal(brg__f32_to_f16(65520.0f), 0x7c00);
  assert_int_equal(brg__f32_to_f16(1e30f), 0x7c00);
  assert_int_equal(brg__f32_to_f16(-INFINITY), 0xfc00);
  assert_int_equal(brg__f32_to_f16(0x1p-26f), 0);
  assert_int_equal(brg__f32_to_f16(0x1p-25f), 0);   /* tie to even: zero */
  assert_int_equal(brg__f32_to_f16(0x1.8p-25f), 1); /* past the tie */
  assert_int_equal(brg__f32_to_f16(0x1.8p-24f), 2); /* 1.5 ulp: tie to even 2 */
  uint16_t n = brg__f32_to_f16(NAN);
  assert_true((n & 0x7c00) == 0x7c00 && (n & 0x3ff) != 0);
}

static void test_bf16(void **state) {
  (void)state;
  for (uint32_t h = 0; h < 65536; h++) {
    uint32_t bits = h << 16;
    float f;
    memcpy(&f, &bits, 4);
    float back = brg__bf16_to_f32((uint16_t)h);
    if (isnan(f)) {
      assert_true(isnan(back));
      assert_true(isnan(brg__bf16_to_f32(brg__f32_to_bf16(f))));
      continue;
    }
    assert_memory_equal(&back, &f, 4);
    assert_int_equal(brg__f32_to_bf16(f), h);
    if ((h & 0x7fff) < 0x7f7f) { /* midpoint to the next one up in magnitude */
      uint32_t midbits = bits | 0x8000;
      float mid;
      memcpy(&mid, &midbits, 4);
      assert_int_equal(brg__f32_to_bf16(mid), (h & 1) ? h + 1 : h);
    }
  }
  assert_int_equal(brg__f32_to_bf16(3.4e38f), 0x7f80); /* rounds past the largest */
}

/* The array paths (F16C where the CPU has it) agree with the scalar ones. */
static void test_arrays(void **state) {
  (void)state;
  enum { N = 1003 };
  float src[N], back[N], scale = 1.0f / 3.0f;
  double srcd[N], backd[N];
  uint16_t h[N];
  uint64_t s = 1;
  for (int i = 0; i < N; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    src[i] = ldexpf((float)(int32_t)(s >> 32) / 2147483648.0f, (int)(s % 40) - 20);
    srcd[i] = src[i];
  }
  brg_dtype halves[2] = {BRG_FLOAT16, BRG_BFLOAT16};
  for (int k = 0; k < 2; k++) {
    brg_dtype hd = halves[k];
    brg__convert_to_half(h, hd, src, BRG_FLOAT32, N, scale);
    for (int i = 0; i < N; i++)
      assert_int_equal(h[i], hd == BRG_FLOAT16 ? brg__f32_to_f16(src[i] * scale)
                                               : brg__f32_to_bf16(src[i] * scale));
    brg__convert_from_half(back, BRG_FLOAT32, h, hd, N);
    for (int i = 0; i < N; i++)
      assert_true(back[i] == (hd == BRG_FLOAT16 ? brg__f16_to_f32(h[i]) : brg__bf16_to_f32(h[i])));
    brg__convert_to_half(h, hd, srcd, BRG_FLOAT64, N, 1.0f);
    brg__convert_from_half(backd, BRG_FLOAT64, h, hd, N);
    for (int i = 0; i < N; i++) {
      double tol =
          hd == BRG_FLOAT16 ? fmax(fabs(srcd[i]) * 0x1p-11, 0x1p-25) : fabs(srcd[i]) * 0x1p-8;
      if (fabs(srcd[i]) < 65504) assert_true(fabs(backd[i] - srcd[i]) <= tol);
    }
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_f16_decode_all),
      cmocka_unit_test(test_f16_encode),
      cmocka_unit_test(test_bf16),
      cmocka_unit_test(test_arrays),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
