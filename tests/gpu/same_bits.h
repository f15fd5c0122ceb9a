/*
 * Result comparison for the GPU kernel tests: bit for bit, with one
 * exception. elem.h pins NaN payloads for float16/bfloat16 (canonical NaN)
 * and for min/max (the NaN input itself), but not for float32/float64 sum,
 * prod and avg: there the hardware picks the payload (x86 propagates an
 * input's payload, and which one depends on operand order the compiler may
 * swap; NVIDIA GPUs return the canonical 0x7fffffff). So for those pairs a
 * NaN matches any NaN; every other value must match exactly.
 */
#ifndef BRG_TEST_SAME_BITS_H
#define BRG_TEST_SAME_BITS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "brigade.h"

/* Index of the first of `count` elements of `es` bytes that differs, or count.
 * Pass op = -1 for copies and divisions (divide counts as avg). */
static inline size_t brg_test_first_diff(const void *got, const void *want, size_t count, size_t es,
                                         int dtype, int op) {
  const unsigned char *g = (const unsigned char *)got, *w = (const unsigned char *)want;
  int loose = (dtype == BRG_FLOAT32 || dtype == BRG_FLOAT64) &&
              (op == BRG_SUM || op == BRG_PROD || op == BRG_AVG);
  if (!loose) {
    if (memcmp(g, w, count * es) == 0) return count;
    size_t i = 0;
    while (g[i] == w[i]) i++;
    return i / es;
  }
  for (size_t i = 0; i < count; i++) {
    if (memcmp(g + i * es, w + i * es, es) == 0) continue;
    int gn, wn;
    if (es == 4) {
      uint32_t x, y;
      memcpy(&x, g + i * 4, 4);
      memcpy(&y, w + i * 4, 4);
      gn = (x & 0x7fffffffu) > 0x7f800000u;
      wn = (y & 0x7fffffffu) > 0x7f800000u;
    } else {
      uint64_t x, y;
      memcpy(&x, g + i * 8, 8);
      memcpy(&y, w + i * 8, 8);
      gn = (x & 0x7fffffffffffffffull) > 0x7ff0000000000000ull;
      wn = (y & 0x7fffffffffffffffull) > 0x7ff0000000000000ull;
    }
    if (!(gn && wn)) return i;
  }
  return count;
}

#endif
