/*
 * CUDA reduce / copy / divide kernels against the CPU kernels, bit for bit.
 *
 * Inputs are random bit patterns (NaNs with payloads, infinities, -0,
 * subnormals and all), so the comparison covers elem.h's rounding and NaN
 * rules, not only ordinary numbers (a float32/float64 sum, prod or avg
 * that is NaN may carry any NaN payload: see same_bits.h). Every dtype x
 * op, one output and two,
 * in place, every count around the 16-byte vector width, and pointers
 * placed at equal and at different offsets from a 16-byte boundary (the
 * vector path and the scalar path).
 *
 * Goes through the same loader the library uses (runtime/device/device.c), so it
 * needs no CUDA headers and exits 77 (skip) where that loader finds no GPU.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "brigade.h"
#include "device.h"
#include "kernels.h"
#include "same_bits.h"

#define SKIP 77

static const brg__cuda_api *api;
static int failures;

static const char *const dt_names[] = {"int8",   "uint8",   "int32",    "uint32",  "int64",
                                       "uint64", "float16", "bfloat16", "float32", "float64"};
static const char *const op_names[] = {"sum", "prod", "min", "max", "avg", "band", "bor", "bxor"};
static const size_t esizes[] = {1, 1, 4, 4, 8, 8, 2, 2, 4, 8};

static uint64_t rng_state = 0x243f6a8885a308d3ull;
static uint64_t rnd(void) {
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return rng_state * 0x2545f4914f6cdd1dull;
}

/* Random bytes, with a share of elements set to special values so that
 * equal operands, zeros and NaNs meet often enough to matter. */
static void fill(unsigned char *p, size_t n, size_t esize) {
  for (size_t i = 0; i < n; i += 8) {
    uint64_t r = rnd();
    memcpy(p + i, &r, n - i < 8 ? n - i : 8);
  }
  for (size_t i = 0; i + esize <= n; i += esize) {
    uint64_t r = rnd() % 16;
    if (r == 0)
      memset(p + i, 0, esize); /* +0 */
    else if (r == 1) {
      memset(p + i, 0, esize);
      p[i + esize - 1] = 0x80;
    } /* -0 */
    else if (r == 2)
      memset(p + i, 0xff, esize); /* NaN / -1 */
    else if (r == 3 && i >= esize)
      memcpy(p + i, p + i - esize, esize);
  }
}

#define CK(call)                                                                                   \
  do {                                                                                             \
    int e_ = (call);                                                                               \
    if (e_ != 0) {                                                                                 \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, api->drv.error_string(e_));    \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

/* n elements of es bytes; op as brg_test_first_diff (-1: exact). */
static void expect_equal(const char *what, const unsigned char *got, const unsigned char *want,
                         size_t n, size_t es, int dt, int op) {
  size_t e = brg_test_first_diff(got, want, n, es, dt, op);
  if (e == n) return;
  uint64_t g = 0, w = 0;
  memcpy(&g, got + e * es, es);
  memcpy(&w, want + e * es, es);
  fprintf(stderr, "FAIL %s: element %zu is 0x%llx on the GPU, 0x%llx on the CPU\n", what, e,
          (unsigned long long)g, (unsigned long long)w);
  failures++;
}

/* Device buffers, with room for an offset of up to 15 bytes. */
enum { A, B, D0, D1, NBUF };

static void test_reduce(brg_dtype dt, brg_op op, size_t n, size_t off_a, size_t off_d,
                        unsigned char *dev[NBUF], unsigned char *host[6]) {
  size_t es = esizes[dt], bytes = n * es;
  int div = 3;
  unsigned char *ha = host[0], *hb = host[1], *want0 = host[2], *got0 = host[3], *got1 = host[4];
  fill(ha, bytes, es);
  fill(hb, bytes, es);
  brg__reduce(want0, NULL, ha, hb, n, dt, op, div);

  unsigned char *a = dev[A] + off_a, *b = dev[B] + off_a, *d0 = dev[D0] + off_d,
                *d1 = dev[D1] + off_d;
  char what[160];
  CK(api->drv.mem_copy(a, ha, bytes));
  CK(api->drv.mem_copy(b, hb, bytes));

  /* One output. */
  CK(api->drv.mem_set(dev[D0], 0xa5, bytes + 16));
  CK(api->kern.reduce(d0, NULL, a, b, n, dt, op, div, NULL));
  CK(api->drv.stream_sync(NULL));
  CK(api->drv.mem_copy(got0, d0, bytes));
  snprintf(what, sizeof what, "reduce %s %s n=%zu offsets %zu/%zu", dt_names[dt], op_names[op], n,
           off_a, off_d);
  expect_equal(what, got0, want0, n, es, dt, op);

  /* Two outputs. */
  CK(api->drv.mem_set(dev[D0], 0x5a, bytes + 16));
  CK(api->drv.mem_set(dev[D1], 0x3c, bytes + 16));
  CK(api->kern.reduce(d0, d1, a, b, n, dt, op, div, NULL));
  CK(api->drv.stream_sync(NULL));
  CK(api->drv.mem_copy(got0, d0, bytes));
  CK(api->drv.mem_copy(got1, d1, bytes));
  snprintf(what, sizeof what, "reduce2 %s %s n=%zu offsets %zu/%zu (dst0)", dt_names[dt],
           op_names[op], n, off_a, off_d);
  expect_equal(what, got0, want0, n, es, dt, op);
  snprintf(what, sizeof what, "reduce2 %s %s n=%zu offsets %zu/%zu (dst1)", dt_names[dt],
           op_names[op], n, off_a, off_d);
  expect_equal(what, got1, want0, n, es, dt, op);

  /* In place into the first input, with a second output. */
  CK(api->kern.reduce(a, d1, a, b, n, dt, op, div, NULL));
  CK(api->drv.stream_sync(NULL));
  CK(api->drv.mem_copy(got0, a, bytes));
  CK(api->drv.mem_copy(got1, d1, bytes));
  snprintf(what, sizeof what, "reduce in place %s %s n=%zu offset %zu", dt_names[dt], op_names[op],
           n, off_a);
  expect_equal(what, got0, want0, n, es, dt, op);
  expect_equal(what, got1, want0, n, es, dt, op);
}

static void test_divide(brg_dtype dt, size_t n, size_t off, unsigned char *dev[NBUF],
                        unsigned char *host[6]) {
  size_t es = esizes[dt], bytes = n * es;
  int div = 7;
  fill(host[0], bytes, es);
  brg__divide(host[2], host[0], n, dt, div);
  CK(api->drv.mem_copy(dev[A] + off, host[0], bytes));
  CK(api->kern.divide(dev[D0] + off, dev[A] + off, n, dt, div, NULL));
  CK(api->kern.divide(dev[A] + off, dev[A] + off, n, dt, div, NULL)); /* in place */
  CK(api->drv.stream_sync(NULL));
  char what[96];
  snprintf(what, sizeof what, "divide %s n=%zu offset %zu", dt_names[dt], n, off);
  CK(api->drv.mem_copy(host[3], dev[D0] + off, bytes));
  expect_equal(what, host[3], host[2], n, es, dt, BRG_AVG);
  CK(api->drv.mem_copy(host[3], dev[A] + off, bytes));
  expect_equal(what, host[3], host[2], n, es, dt, BRG_AVG);
}

static void test_copy(size_t bytes, size_t off_s, size_t off_d, unsigned char *dev[NBUF],
                      unsigned char *host[6]) {
  fill(host[0], bytes, 1);
  CK(api->drv.mem_copy(dev[A] + off_s, host[0], bytes));
  CK(api->drv.mem_set(dev[D0], 0, bytes + 16));
  CK(api->drv.mem_set(dev[D1], 0, bytes + 16));
  CK(api->kern.copy(dev[D0] + off_d, dev[D1] + off_d, dev[A] + off_s, bytes, NULL));
  CK(api->drv.stream_sync(NULL));
  char what[96];
  snprintf(what, sizeof what, "copy2 %zu bytes offsets %zu/%zu", bytes, off_s, off_d);
  CK(api->drv.mem_copy(host[3], dev[D0] + off_d, bytes));
  expect_equal(what, host[3], host[0], bytes, 1, BRG_UINT8, -1);
  CK(api->drv.mem_copy(host[3], dev[D1] + off_d, bytes));
  expect_equal(what, host[3], host[0], bytes, 1, BRG_UINT8, -1);
  CK(api->kern.copy(dev[B] + off_d, NULL, dev[A] + off_s, bytes, NULL));
  CK(api->drv.stream_sync(NULL));
  CK(api->drv.mem_copy(host[3], dev[B] + off_d, bytes));
  expect_equal(what, host[3], host[0], bytes, 1, BRG_UINT8, -1);
}

int main(void) {
  const char *why = "";
  api = brg__device_api(&why);
  if (!api) {
    printf("test_kernels_gpu: skipped: %s\n", why);
    return SKIP;
  }
  /* Counts around the vector width of every type, and one large enough for
   * many blocks and the unrolled grid-stride loop. */
  static const size_t counts[] = {1, 3, 7, 8, 15, 16, 17, 33, 1000, 4099, 1 << 20 | 5};
  const size_t ncounts = sizeof counts / sizeof counts[0];
  size_t max_bytes = (counts[ncounts - 1] + 16) * 8 + 16;
  unsigned char *dev[NBUF], *host[6];
  for (int i = 0; i < NBUF; i++) CK(api->drv.mem_alloc((void **)&dev[i], max_bytes));
  for (int i = 0; i < 6; i++) {
    host[i] = malloc(max_bytes);
    if (!host[i]) return 1;
  }

  int cases = 0;
  for (int dt = 0; dt < BRG_NUM_DTYPES; dt++) {
    size_t es = esizes[dt];
    /* Offsets in elements' bytes: aligned, equal misalignment (head peel),
     * different misalignment (scalar path). */
    size_t offs[3][2] = {
        {0, 0}, {es * (16 / es > 1 ? 1 : 0), es * (16 / es > 1 ? 1 : 0)}, {0, es < 8 ? es : 8}};
    for (int op = 0; op < (dt < BRG_FLOAT16 ? BRG_NUM_OPS : BRG_BAND); op++) /* bitwise: ints */
      for (size_t c = 0; c < ncounts; c++)
        for (int o = 0; o < (c + 1 < ncounts ? 3 : 1); o++, cases++)
          test_reduce((brg_dtype)dt, (brg_op)op, counts[c], offs[o][0], offs[o][1], dev, host);
    for (size_t c = 0; c < ncounts; c++)
      for (int o = 0; o < 2; o++, cases++)
        test_divide((brg_dtype)dt, counts[c], offs[o][0], dev, host);
  }
  for (size_t c = 0; c < ncounts; c++)
    for (size_t o = 0; o < 3; o++, cases++)
      test_copy(counts[c], o * 3, o == 2 ? 0 : o * 3, dev, host);

  for (int i = 0; i < NBUF; i++) api->drv.mem_free(dev[i]);
  for (int i = 0; i < 6; i++) free(host[i]);
  if (failures) {
    fprintf(stderr, "test_kernels_gpu: %d of %d cases failed\n", failures, cases);
    return 1;
  }
  printf("test_kernels_gpu: %d cases bit-equal to the CPU kernels\n", cases);
  return 0;
}
