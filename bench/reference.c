/*
 * The reference model behind the data check (-c 1): element access and the
 * half and bfloat16 conversions by hand, the input patterns of every rank,
 * the expected results computed from them without brigade, and the
 * element-by-element comparison. common.c says why the inputs are what they
 * are.
 */
#include "bench_internal.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

/* ------------------------------------------------------- element access */

static int dt_is_float(brg_dtype dt) {
  return dt >= BRG_FLOAT16;
}
static int dt_is_signed(brg_dtype dt) {
  return dt == BRG_INT8 || dt == BRG_INT32 || dt == BRG_INT64;
}
size_t bench_dt_size(brg_dtype dt) {
  static const size_t sz[BRG_NUM_DTYPES] = {1, 1, 4, 4, 8, 8, 2, 2, 4, 8};
  return sz[dt];
}

/* IEEE binary16 and bfloat16 by hand, round to nearest even, so the
 * reference does not depend on brigade's own conversions. */
static uint16_t f32_to_f16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
  uint32_t a = x & 0x7fffffffu;
  if (a >= 0x7f800000u) return sign | 0x7c00u | (a > 0x7f800000u ? 0x200u : 0u);
  if (a >= 0x477ff000u) return sign | 0x7c00u; /* rounds past 65504 */
  if (a < 0x38800000u) {                       /* below 2^-14: subnormal */
    float af;
    memcpy(&af, &a, 4);
    return sign | (uint16_t)nearbyintf(af * 16777216.0f); /* units of 2^-24 */
  }
  uint32_t h = ((((a >> 23) - 127 + 15) << 10) | ((a & 0x7fffffu) >> 13));
  uint32_t rest = a & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1))) h++; /* carry may bump the exponent */
  return sign | (uint16_t)h;
}

static float f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  uint32_t x;
  if (e == 0) {
    float v = ldexpf((float)m, -24);
    return sign ? -v : v;
  }
  if (e == 31)
    x = sign | 0x7f800000u | (m << 13);
  else
    x = sign | ((e - 15 + 127) << 23) | (m << 13);
  float f;
  memcpy(&f, &x, 4);
  return f;
}

static uint16_t f32_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
  return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

static float bf16_to_f32(uint16_t b) {
  uint32_t x = (uint32_t)b << 16;
  float f;
  memcpy(&f, &x, 4);
  return f;
}

static double load_f(brg_dtype dt, const void *p) {
  switch (dt) {
  case BRG_FLOAT16: {
    uint16_t h;
    memcpy(&h, p, 2);
    return f16_to_f32(h);
  }
  case BRG_BFLOAT16: {
    uint16_t h;
    memcpy(&h, p, 2);
    return bf16_to_f32(h);
  }
  case BRG_FLOAT32: {
    float f;
    memcpy(&f, p, 4);
    return f;
  }
  default: {
    double d;
    memcpy(&d, p, 8);
    return d;
  }
  }
}

static void store_f(brg_dtype dt, void *p, double v) {
  switch (dt) {
  case BRG_FLOAT16: {
    uint16_t h = f32_to_f16((float)v);
    memcpy(p, &h, 2);
    break;
  }
  case BRG_BFLOAT16: {
    uint16_t h = f32_to_bf16((float)v);
    memcpy(p, &h, 2);
    break;
  }
  case BRG_FLOAT32: {
    float f = (float)v;
    memcpy(p, &f, 4);
    break;
  }
  default: memcpy(p, &v, 8); break;
  }
}

/* Integers are kept as their bit pattern in the low bits of a uint64_t:
 * arithmetic modulo 2^64 truncated to the width is exactly the wrapping
 * arithmetic of the narrow type. */
static uint64_t int_trunc(brg_dtype dt, uint64_t v) {
  size_t bits = bench_dt_size(dt) * 8;
  return bits == 64 ? v : v & ((UINT64_C(1) << bits) - 1);
}

static int64_t int_sext(brg_dtype dt, uint64_t v) {
  size_t bits = bench_dt_size(dt) * 8;
  if (bits == 64) return (int64_t)v;
  uint64_t sign = UINT64_C(1) << (bits - 1);
  return (int64_t)((v ^ sign) - sign);
}

static uint64_t load_u(brg_dtype dt, const void *p) {
  uint64_t v = 0;
  memcpy(&v, p, bench_dt_size(dt)); /* little-endian host */
  return v;
}

static void store_u(brg_dtype dt, void *p, uint64_t v) {
  memcpy(p, &v, bench_dt_size(dt));
}

static int elem_equal(brg_dtype dt, const void *a, const void *b) {
  if (dt_is_float(dt)) return load_f(dt, a) == load_f(dt, b); /* +0 == -0, NaN never */
  return memcmp(a, b, bench_dt_size(dt)) == 0;
}

/* ----------------------------------------------------------- input data */

static uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

static uint32_t hash2(uint32_t j, uint32_t r) {
  return mix32(j * 0x9e3779b1u + mix32(r + 0x632be5abu));
}

/*
 * Input element j (< PERIOD) of rank r, exact in every dtype:
 *   sum   integers in [-m, m], m chosen so every partial sum of N ranks stays
 *         within 240 (exact in bfloat16's 8-bit significand);
 *   prod  1 or -1, with a 2 on at most one rank in 8 for each element (and a
 *         0.5 likewise for floats), so products are signed powers of two
 *         within half's range up to 120 ranks;
 *   avg   c + 1 + e with c the same on every rank and e = +1/-1 on the two
 *         ranks of a pair (0 on an unpaired last rank): the sum is N(c+1),
 *         a multiple of N, so the mean is the exact integer c + 1;
 *   min, max and the data of non-reducing collectives: integers in [-30, 30]
 *         (large values for unsigned types, where they wrap).
 */
static double input_value(int op, brg_dtype dt, int nranks, int r, uint32_t j) {
  uint32_t h = hash2(j, (uint32_t)r);
  switch (op) {
  case BRG_SUM: {
    int m = nranks <= 40 ? 6 : (240 / nranks > 1 ? 240 / nranks : 1);
    return (double)((int)(h % (uint32_t)(2 * m + 1)) - m);
  }
  case BRG_PROD:
    if ((j + (uint32_t)r) % 8 == 0) return 2;
    if ((j + (uint32_t)r) % 8 == 4) return dt_is_float(dt) ? 0.5 : 1;
    return (h & 3) == 1 ? -1 : 1;
  case BRG_AVG: {
    double c = (double)(hash2(j, 0xffffffffu) % 5);
    if ((nranks & 1) && r == nranks - 1) return c + 1;
    int s = ((j + (uint32_t)(r / 2)) & 1) ? 1 : -1;
    return c + 1 + ((r & 1) ? -s : s);
  }
  default: return (double)((int)(h % 61) - 30);
  }
}

static void store_value(brg_dtype dt, void *p, double v) {
  if (dt_is_float(dt))
    store_f(dt, p, v);
  else
    store_u(dt, p, int_trunc(dt, (uint64_t)(int64_t)v));
}

/* One period of rank r's input. */
void bench_make_input(unsigned char *pat, brg_dtype dt, int op, int nranks, int r) {
  size_t es = bench_dt_size(dt);
  for (uint32_t j = 0; j < PERIOD; j++)
    store_value(dt, pat + j * es, input_value(op, dt, nranks, r, j));
}

/* One period of the reduction of all ranks' inputs, computed independently
 * of brigade: doubles for floats (exact for these inputs, rounded once at
 * the end), wrapping integer arithmetic otherwise. */
void bench_make_reduced(unsigned char *pat, brg_dtype dt, brg_op op, int nranks) {
  size_t es = bench_dt_size(dt);
  unsigned char tmp[8];
  for (uint32_t j = 0; j < PERIOD; j++) {
    if (dt_is_float(dt)) {
      double acc = 0;
      for (int r = 0; r < nranks; r++) {
        double v = input_value(op, dt, nranks, r, j);
        if (r == 0) {
          acc = v;
          continue;
        }
        switch (op) {
        case BRG_SUM:
        case BRG_AVG: acc += v; break;
        case BRG_PROD: acc *= v; break;
        case BRG_MIN: acc = v < acc ? v : acc; break;
        case BRG_MAX: acc = v > acc ? v : acc; break;
        default: break; /* the bitwise ops take integers only */
        }
      }
      if (op == BRG_AVG) acc /= nranks;
      store_f(dt, pat + j * es, acc);
    } else {
      uint64_t acc = 0;
      for (int r = 0; r < nranks; r++) {
        store_value(dt, tmp, input_value(op, dt, nranks, r, j));
        uint64_t v = load_u(dt, tmp);
        if (r == 0) {
          acc = v;
          continue;
        }
        int less = dt_is_signed(dt) ? int_sext(dt, v) < int_sext(dt, acc) : v < acc;
        switch (op) {
        case BRG_SUM:
        case BRG_AVG: acc = int_trunc(dt, acc + v); break;
        case BRG_PROD: acc = int_trunc(dt, acc * v); break;
        case BRG_MIN:
          if (less) acc = v;
          break;
        case BRG_MAX:
          if (!less && v != acc) acc = v;
          break;
        case BRG_BAND: acc &= v; break;
        case BRG_BOR: acc |= v; break;
        case BRG_BXOR: acc ^= v; break;
        }
      }
      if (op == BRG_AVG) {
        if (dt_is_signed(dt))
          acc = int_trunc(dt, (uint64_t)(int_sext(dt, acc) / nranks));
        else
          acc = acc / (uint64_t)nranks;
      }
      store_u(dt, pat + j * es, acc);
    }
  }
}

/* A period that differs from `pat` in every element (low byte flipped), for
 * poisoning outputs so an element nobody wrote is always counted wrong. */
void bench_make_poison(unsigned char *dst, const unsigned char *pat, size_t es) {
  memcpy(dst, pat, PERIOD * es);
  for (uint32_t j = 0; j < PERIOD; j++) dst[j * es] ^= 0x5a;
}

/* dst[k] = pat[(start + k) % PERIOD] for k < n. */
void bench_pattern_fill(void *dst, const unsigned char *pat, size_t es, size_t start, size_t n) {
  char *d = dst;
  size_t off = start % PERIOD;
  while (n > 0) {
    size_t run = PERIOD - off < n ? PERIOD - off : n;
    memcpy(d, pat + off * es, run * es);
    d += run * es;
    n -= run;
    off = 0;
  }
}

/* Elements k < n where buf[k] != pat[(start + k) % PERIOD]. */
size_t bench_pattern_wrong(const void *buf, const unsigned char *pat, brg_dtype dt, size_t start,
                           size_t n) {
  const char *b = buf;
  size_t es = bench_dt_size(dt), off = start % PERIOD, wrong = 0;
  while (n > 0) {
    size_t run = PERIOD - off < n ? PERIOD - off : n;
    if (memcmp(b, pat + off * es, run * es) != 0)
      for (size_t k = 0; k < run; k++) wrong += !elem_equal(dt, b + k * es, pat + (off + k) * es);
    b += run * es;
    n -= run;
    off = 0;
  }
  return wrong;
}
