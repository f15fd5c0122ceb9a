/* Bucket assignment (reducer/buckets.c): caps, dtype split, order. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "buckets.h"

#define MAXP 512

typedef struct plan {
  size_t n, nb;
  size_t members[MAXP], start[MAXP + 1], of[MAXP];
} plan;

static brg_status assign(plan *pl, size_t n, const size_t *count, const brg_dtype *dt,
                         const size_t *order, size_t first_cap, size_t cap) {
  size_t rev[MAXP];
  if (order == NULL) {
    for (size_t k = 0; k < n; k++) rev[k] = n - 1 - k;
    order = rev;
  }
  pl->n = n;
  return brg__bucket_assign(n, count, dt, order, first_cap, cap, pl->members, pl->start, pl->of,
                            &pl->nb);
}

static size_t bucket_bytes(const plan *pl, size_t b, const size_t *count, const brg_dtype *dt) {
  size_t s = 0;
  for (size_t k = pl->start[b]; k < pl->start[b + 1]; k++)
    s += count[pl->members[k]] * brg_dtype_size(dt[pl->members[k]]);
  return s;
}

static void expect_bucket(const plan *pl, size_t b, size_t n, const size_t *want) {
  assert_int_equal(pl->start[b + 1] - pl->start[b], n);
  for (size_t k = 0; k < n; k++) {
    assert_int_equal(pl->members[pl->start[b] + k], want[k]);
    assert_int_equal(pl->of[want[k]], b);
  }
}

/* Ten 256 KiB float32 tensors, reverse order: the first bucket stops at
 * 1 MiB, the rest fill 2 MiB caps. */
static void test_first_bucket_cap(void **state) {
  (void)state;
  size_t count[10];
  brg_dtype dt[10];
  for (int i = 0; i < 10; i++) count[i] = 65536, dt[i] = BRG_FLOAT32;
  plan pl;
  assert_int_equal(assign(&pl, 10, count, dt, NULL, 1 << 20, 2 << 20), BRG_SUCCESS);
  assert_int_equal(pl.nb, 2);
  expect_bucket(&pl, 0, 4, (size_t[]){9, 8, 7, 6});
  expect_bucket(&pl, 1, 6, (size_t[]){5, 4, 3, 2, 1, 0});
}

/* A bucket closes the moment it reaches its cap; a tensor that would push
 * it past the cap starts the next one. */
static void test_cap_boundaries(void **state) {
  (void)state;
  /* bytes in reverse order: 600, 400 (=1000, closes), 700, 200, 200 (would be 1100 > 1000) */
  size_t count[5] = {200, 200, 700, 400, 600};
  brg_dtype dt[5] = {BRG_UINT8, BRG_UINT8, BRG_UINT8, BRG_UINT8, BRG_UINT8};
  plan pl;
  assert_int_equal(assign(&pl, 5, count, dt, NULL, 1000, 1000), BRG_SUCCESS);
  assert_int_equal(pl.nb, 3);
  expect_bucket(&pl, 0, 2, (size_t[]){4, 3});
  expect_bucket(&pl, 1, 2, (size_t[]){2, 1});
  expect_bucket(&pl, 2, 1, (size_t[]){0});
}

/* A tensor larger than the cap gets a bucket of its own, wherever it sits. */
static void test_large_tensor_own_bucket(void **state) {
  (void)state;
  size_t count[6] = {10, 10, 5000, 10, 10, 3000};
  brg_dtype dt[6];
  for (int i = 0; i < 6; i++) dt[i] = BRG_FLOAT32;
  plan pl;
  /* reverse: 5 (12000 B, > first cap) | 4, 3 | 2 (20000 B) | 1, 0 */
  assert_int_equal(assign(&pl, 6, count, dt, NULL, 4096, 8192), BRG_SUCCESS);
  assert_int_equal(pl.nb, 4);
  expect_bucket(&pl, 0, 1, (size_t[]){5});
  expect_bucket(&pl, 1, 2, (size_t[]){4, 3});
  expect_bucket(&pl, 2, 1, (size_t[]){2});
  expect_bucket(&pl, 3, 2, (size_t[]){1, 0});
  assert_true(bucket_bytes(&pl, 2, count, dt) > 8192);
}

/* One dtype per bucket; buckets launch in the order of their first tensor. */
static void test_dtype_split(void **state) {
  (void)state;
  size_t count[6] = {100, 100, 100, 100, 100, 100};
  brg_dtype dt[6] = {BRG_FLOAT32, BRG_FLOAT16, BRG_FLOAT32, BRG_FLOAT16, BRG_FLOAT64, BRG_FLOAT32};
  plan pl;
  assert_int_equal(assign(&pl, 6, count, dt, NULL, 1 << 20, 1 << 20), BRG_SUCCESS);
  /* reverse order: 5 f32, 4 f64, 3 f16, 2 f32, 1 f16, 0 f32 */
  assert_int_equal(pl.nb, 3);
  expect_bucket(&pl, 0, 3, (size_t[]){5, 2, 0});
  expect_bucket(&pl, 1, 1, (size_t[]){4});
  expect_bucket(&pl, 2, 2, (size_t[]){3, 1});
}

/* Only the first bucket opened is small, even when another dtype's first
 * bucket opens later. */
static void test_first_cap_only_once(void **state) {
  (void)state;
  size_t count[4] = {300, 300, 300, 300};
  brg_dtype dt[4] = {BRG_FLOAT16, BRG_FLOAT16, BRG_FLOAT32, BRG_FLOAT32};
  plan pl;
  /* reverse: 3 f32 1200 B (>= 1000 first cap: closes), 2 f32 1200 B, 1 f16 600, 0 f16 600 */
  assert_int_equal(assign(&pl, 4, count, dt, NULL, 1000, 4000), BRG_SUCCESS);
  assert_int_equal(pl.nb, 3);
  expect_bucket(&pl, 0, 1, (size_t[]){3});
  expect_bucket(&pl, 1, 1, (size_t[]){2});
  expect_bucket(&pl, 2, 2, (size_t[]){1, 0});
}

/* Any fill order (the rebuild passes the observed ready order). */
static void test_custom_order(void **state) {
  (void)state;
  size_t count[5] = {100, 100, 100, 100, 100};
  brg_dtype dt[5] = {BRG_FLOAT32, BRG_FLOAT32, BRG_FLOAT32, BRG_FLOAT32, BRG_FLOAT32};
  size_t order[5] = {2, 0, 4, 1, 3};
  plan pl;
  assert_int_equal(assign(&pl, 5, count, dt, order, 400, 800), BRG_SUCCESS);
  assert_int_equal(pl.nb, 3);
  expect_bucket(&pl, 0, 1, (size_t[]){2});
  expect_bucket(&pl, 1, 2, (size_t[]){0, 4});
  expect_bucket(&pl, 2, 2, (size_t[]){1, 3});
}

static void test_zero_count(void **state) {
  (void)state;
  size_t count[3] = {0, 10, 0};
  brg_dtype dt[3] = {BRG_FLOAT32, BRG_FLOAT32, BRG_FLOAT32};
  plan pl;
  assert_int_equal(assign(&pl, 3, count, dt, NULL, 1000, 1000), BRG_SUCCESS);
  assert_int_equal(pl.nb, 1);
  expect_bucket(&pl, 0, 3, (size_t[]){2, 1, 0});
}

static void test_bad_input(void **state) {
  (void)state;
  size_t count[3] = {1, 1, 1};
  brg_dtype dt[3] = {BRG_FLOAT32, BRG_FLOAT32, BRG_FLOAT32};
  plan pl;
  assert_int_equal(assign(&pl, 3, count, dt, (size_t[]){0, 0, 1}, 8, 8), BRG_ERR_INVALID_ARGUMENT);
  assert_int_equal(assign(&pl, 3, count, dt, (size_t[]){0, 1, 3}, 8, 8), BRG_ERR_INVALID_ARGUMENT);
  brg_dtype bad[3] = {BRG_FLOAT32, (brg_dtype)99, BRG_FLOAT32};
  assert_int_equal(assign(&pl, 3, count, bad, NULL, 8, 8), BRG_ERR_INVALID_ARGUMENT);
}

/* ResNet-50's 161 tensors with DDP's defaults: 1 MiB first bucket, then
 * 25 MiB. */
static size_t resnet50(size_t *count) {
  size_t n = 0;
  count[n++] = 64 * 3 * 7 * 7, count[n++] = 64, count[n++] = 64;
  const int blocks[4] = {3, 4, 6, 3}, width[4] = {64, 128, 256, 512};
  size_t in = 64;
  for (int s = 0; s < 4; s++)
    for (int b = 0; b < blocks[s]; b++) {
      size_t w = (size_t)width[s], out = 4 * w;
      count[n++] = w * in, count[n++] = w, count[n++] = w;
      count[n++] = w * w * 9, count[n++] = w, count[n++] = w;
      count[n++] = out * w, count[n++] = out, count[n++] = out;
      if (b == 0) count[n++] = out * in, count[n++] = out, count[n++] = out;
      in = out;
    }
  count[n++] = 1000 * 2048, count[n++] = 1000;
  return n;
}

static void test_resnet50(void **state) {
  (void)state;
  size_t count[MAXP];
  brg_dtype dt[MAXP];
  size_t n = resnet50(count), total = 0;
  assert_int_equal(n, 161);
  for (size_t i = 0; i < n; i++) total += count[i], dt[i] = BRG_FLOAT32;
  assert_int_equal(total, 25557032);
  plan pl;
  assert_int_equal(assign(&pl, n, count, dt, NULL, 1 << 20, 25 << 20), BRG_SUCCESS);
  /* fc.bias alone (fc.weight, 8 MB, would pass 1 MiB), then 25 MiB buckets. */
  expect_bucket(&pl, 0, 1, (size_t[]){160});
  assert_int_equal(pl.members[pl.start[1]], 159);
  for (size_t b = 1; b < pl.nb; b++)
    assert_true(bucket_bytes(&pl, b, count, dt) <= (25u << 20) ||
                pl.start[b + 1] - pl.start[b] == 1);
  assert_int_equal(pl.nb, 6);
}

/* Random models: the invariants hold for any sizes and dtypes. */
static void test_invariants_random(void **state) {
  (void)state;
  static const brg_dtype dts[4] = {BRG_FLOAT32, BRG_FLOAT16, BRG_BFLOAT16, BRG_FLOAT64};
  uint64_t seed = 88172645463325252ull;
  for (int trial = 0; trial < 300; trial++) {
    size_t n = 1 + trial % 200, count[MAXP], order[MAXP], pos[MAXP];
    brg_dtype dt[MAXP];
    for (size_t i = 0; i < n; i++) {
      seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
      count[i] = (seed >> 8) % (trial % 3 == 0 ? 5000 : 300);
      dt[i] = dts[(trial % 2) ? (seed >> 40) % 4 : 0];
      order[i] = i;
    }
    for (size_t i = n; i-- > 1;) { /* shuffle */
      seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
      size_t j = seed % (i + 1), t = order[i];
      order[i] = order[j], order[j] = t;
    }
    for (size_t k = 0; k < n; k++) pos[order[k]] = k;
    size_t first_cap = 64 + (size_t)trial * 7, cap = 1000 + (size_t)trial * 13;
    plan pl;
    assert_int_equal(assign(&pl, n, count, dt, order, first_cap, cap), BRG_SUCCESS);
    assert_int_equal(pl.start[0], 0);
    assert_int_equal(pl.start[pl.nb], n);
    int seen[MAXP] = {0};
    size_t last_open_pos = 0, prev_of_dtype[BRG_NUM_DTYPES];
    for (int d = 0; d < BRG_NUM_DTYPES; d++) prev_of_dtype[d] = (size_t)-1;
    for (size_t b = 0; b < pl.nb; b++) {
      size_t lo = pl.start[b], hi = pl.start[b + 1];
      assert_true(hi > lo);
      size_t limit = b == 0 ? first_cap : cap;
      size_t bytes = bucket_bytes(&pl, b, count, dt), biggest = 0;
      for (size_t k = lo; k < hi; k++)
        if (count[pl.members[k]] * brg_dtype_size(dt[pl.members[k]]) > biggest)
          biggest = count[pl.members[k]] * brg_dtype_size(dt[pl.members[k]]);
      assert_true(bytes <= limit || bytes == biggest); /* over the cap: one tensor alone */
      if (b > 0) assert_true(pos[pl.members[lo]] > last_open_pos);
      /* Not closed early: the previous bucket of this dtype was full, or
       * this bucket's first tensor did not fit in it. */
      brg_dtype d = dt[pl.members[lo]];
      size_t pb = prev_of_dtype[d];
      if (pb != (size_t)-1) {
        size_t pbytes = bucket_bytes(&pl, pb, count, dt), plimit = pb == 0 ? first_cap : cap;
        assert_true(pbytes >= plimit ||
                    pbytes + count[pl.members[lo]] * brg_dtype_size(d) > plimit);
      }
      prev_of_dtype[d] = b;
      last_open_pos = pos[pl.members[lo]];
      for (size_t k = lo; k < hi; k++) {
        size_t p = pl.members[k];
        assert_false(seen[p]);
        seen[p] = 1;
        assert_int_equal(pl.of[p], b);
        assert_int_equal(dt[p], dt[pl.members[lo]]);
        if (k > lo) assert_true(pos[p] > pos[pl.members[k - 1]]);
      }
    }
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_first_bucket_cap),
      cmocka_unit_test(test_cap_boundaries),
      cmocka_unit_test(test_large_tensor_own_bucket),
      cmocka_unit_test(test_dtype_split),
      cmocka_unit_test(test_first_cap_only_once),
      cmocka_unit_test(test_custom_order),
      cmocka_unit_test(test_zero_count),
      cmocka_unit_test(test_bad_input),
      cmocka_unit_test(test_resnet50),
      cmocka_unit_test(test_invariants_random),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
