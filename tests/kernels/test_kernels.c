/*
 * Host reduce / copy kernels against references computed here.
 *
 * The references do not use elem.h: integers are wrapped by hand in wider
 * arithmetic, float32 results are computed in double and float64 results in
 * __float128 (both wide enough that rounding twice gives the correctly
 * rounded answer), and float16 / bfloat16 results are computed in double and
 * rounded by a converter written below with frexp / nearbyint. Every ISA the
 * CPU can run is tested, and the SIMD half-type paths are also compared bit
 * for bit with the generic path on random bit patterns.
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
#include "kernels.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define HAVE_X86 1
#else
#define HAVE_X86 0
#endif

/* Defined in reduce_cpu.c: force one kernel ISA, NULL for the detected one. */
int brg__kernels_force_isa(const char *name);

static const char *const isa_names[] = {"generic", "avx2", "avx512"};
static const size_t counts[] = {0, 1, 7, 15, 16, 17, 31, 33, 1000, 1003};

/* ---- helpers ------------------------------------------------------------ */

static const char *dt_name(brg_dtype dt) {
  static const char *const n[] = {"int8",   "uint8",   "int32",    "uint32",  "int64",
                                  "uint64", "float16", "bfloat16", "float32", "float64"};
  return n[dt];
}
static const char *op_name(brg_op op) {
  static const char *const n[] = {"sum", "prod", "min", "max", "avg", "band", "bor", "bxor"};
  return n[op];
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void) { /* xorshift64* */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return rng_state * 0x2545f4914f6cdd1dull;
}

static size_t esize(brg_dtype dt) {
  static const size_t sz[] = {1, 1, 4, 4, 8, 8, 2, 2, 4, 8};
  return sz[dt];
}

static int is_half(brg_dtype dt) {
  return dt == BRG_FLOAT16 || dt == BRG_BFLOAT16;
}
static int is_float(brg_dtype dt) {
  return dt == BRG_FLOAT32 || dt == BRG_FLOAT64;
}

static float f32_of(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static uint32_t bits_of(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

/* ---- reference half formats --------------------------------------------- */

/* A binary16-like format: mbits stored mantissa bits, exponent bias, and
 * the quiet NaN that op results use. */
struct hfmt {
  int mbits, bias;
  uint16_t qnan;
};
static const struct hfmt F16 = {10, 15, 0x7e00};
static const struct hfmt BF16 = {7, 127, 0x7fc0};

static int hfmt_emax_field(const struct hfmt *f) {
  return (1 << (15 - f->mbits)) - 1;
}

static double ref_decode(const struct hfmt *f, uint16_t h) {
  int e = (h >> f->mbits) & hfmt_emax_field(f);
  int m = h & ((1 << f->mbits) - 1);
  double v;
  if (e == hfmt_emax_field(f))
    v = m ? NAN : INFINITY;
  else if (e == 0)
    v = ldexp(m, 1 - f->bias - f->mbits);
  else
    v = ldexp(m + (1 << f->mbits), e - f->bias - f->mbits);
  return (h & 0x8000) ? -v : v;
}

static int ref_isnan(const struct hfmt *f, uint16_t h) {
  return ((h >> f->mbits) & hfmt_emax_field(f)) == hfmt_emax_field(f) &&
         (h & ((1 << f->mbits) - 1)) != 0;
}

/* Round x to the format, nearest even; NaN becomes the canonical NaN. */
static uint16_t ref_encode(const struct hfmt *f, double x) {
  int emin = 1 - f->bias, emax = f->bias;
  uint16_t inf = (uint16_t)(hfmt_emax_field(f) << f->mbits);
  if (isnan(x)) return f->qnan;
  uint16_t sign = signbit(x) ? 0x8000 : 0;
  double ax = fabs(x);
  if (isinf(ax)) return sign | inf;
  if (ax == 0) return sign;
  int E;
  frexp(ax, &E);
  int e = E - 1 < emin ? emin : E - 1;
  double q = ldexp(1.0, e - f->mbits); /* spacing of the format at ax */
  double n = nearbyint(ax / q);        /* exact scaling, then round to even */
  double v = n * q;
  if (n == 0) return sign;
  if (v >= ldexp(1.0, emax + 1)) return sign | inf;
  frexp(v, &E);
  e = E - 1;
  if (e < emin) return sign | (uint16_t)n; /* subnormal */
  uint16_t mant = (uint16_t)(ldexp(v, f->mbits - e) - ldexp(1.0, f->mbits));
  return (uint16_t)(sign | ((e + f->bias) << f->mbits) | mant);
}

static uint16_t ref_half_op(const struct hfmt *f, brg_op op, uint16_t a, uint16_t b, int div) {
  double da = ref_decode(f, a), db = ref_decode(f, b);
  switch (op) {
  case BRG_SUM: return ref_encode(f, da + db);
  case BRG_PROD: return ref_encode(f, da * db);
  case BRG_MIN:
  case BRG_MAX:
    if (isnan(da) || isnan(db)) return f->qnan;
    if (da != db) return (op == BRG_MIN) == (da < db) ? a : b;
    return op == BRG_MIN ? (a | b) : (a & b); /* equal: only zeros differ, by sign */
  default: return ref_encode(f, ref_decode(f, ref_encode(f, da + db)) / div);
  }
}

/* ---- reference for every dtype ------------------------------------------ */

static int64_t wrap_s(int64_t v, int bits) { /* v mod 2^bits, as a signed value */
  uint64_t m = (1ull << bits) - 1, u = (uint64_t)v & m;
  return (u >> (bits - 1)) ? (int64_t)u - (int64_t)(1ull << bits) : (int64_t)u;
}
static int64_t s64_of(unsigned __int128 v) { /* low 64 bits as int64 */
  uint64_t u = (uint64_t)v;
  return u >> 63 ? -(int64_t)(~u) - 1 : (int64_t)u;
}

static int64_t ref_sint(brg_op op, int64_t a, int64_t b, int bits, int div) {
  int64_t s;
  if (bits == 64) {
    unsigned __int128 ua = (uint64_t)a, ub = (uint64_t)b;
    s = s64_of(ua + ub);
    if (op == BRG_PROD) return s64_of(ua * ub);
  } else {
    s = wrap_s(a + b, bits);
    if (op == BRG_PROD) return wrap_s(a * b, bits);
  }
  switch (op) {
  case BRG_SUM: return s;
  case BRG_MIN: return a <= b ? a : b;
  case BRG_MAX: return a >= b ? a : b;
  case BRG_BAND: return a & b; /* sign-extended inputs give the sign-extended result */
  case BRG_BOR: return a | b;
  case BRG_BXOR: return a ^ b;
  default: return s / div;
  }
}

static uint64_t ref_uint(brg_op op, uint64_t a, uint64_t b, int bits, int div) {
  unsigned __int128 mask = bits == 64 ? ~(uint64_t)0 : (1ull << bits) - 1;
  uint64_t s = (uint64_t)(((unsigned __int128)a + b) & mask);
  switch (op) {
  case BRG_SUM: return s;
  case BRG_PROD: return (uint64_t)(((unsigned __int128)a * b) & mask);
  case BRG_MIN: return a <= b ? a : b;
  case BRG_MAX: return a >= b ? a : b;
  case BRG_BAND: return a & b;
  case BRG_BOR: return a | b;
  case BRG_BXOR: return a ^ b;
  default: return s / (uint64_t)div;
  }
}

#ifdef __SIZEOF_FLOAT128__
typedef __float128 wide_t; /* 113 bits >= 2*53+2: rounding twice is exact */
#else
typedef long double wide_t;
#endif

#define REF_FLOAT_MINMAX(op, a, b)                                                                 \
  (isnan(a)                            ? (a)                                                       \
   : isnan(b)                          ? (b)                                                       \
   : (a) < (b)                         ? ((op) == BRG_MIN ? (a) : (b))                             \
   : (b) < (a)                         ? ((op) == BRG_MIN ? (b) : (a))                             \
   : ((op) == BRG_MIN) == !!signbit(a) ? (a)                                                       \
                                       : (b))

static float ref_f32(brg_op op, float a, float b, int div) {
  switch (op) {
  case BRG_SUM: return (float)((double)a + (double)b);
  case BRG_PROD: return (float)((double)a * (double)b);
  case BRG_MIN:
  case BRG_MAX: return REF_FLOAT_MINMAX(op, a, b);
  default: return (float)((double)(float)((double)a + (double)b) / div);
  }
}

static double ref_f64(brg_op op, double a, double b, int div) {
  switch (op) {
  case BRG_SUM: return (double)((wide_t)a + (wide_t)b);
  case BRG_PROD: return (double)((wide_t)a * (wide_t)b);
  case BRG_MIN:
  case BRG_MAX: return REF_FLOAT_MINMAX(op, a, b);
  default: return (double)((wide_t)(double)((wide_t)a + (wide_t)b) / div);
  }
}

/* Expected element i into exp (esize(dt) bytes). */
static void ref_elem(brg_dtype dt, brg_op op, const void *av, const void *bv, size_t i, int div,
                     void *exp) {
  const unsigned char *a = (const unsigned char *)av + i * esize(dt);
  const unsigned char *b = (const unsigned char *)bv + i * esize(dt);
  switch (dt) {
  case BRG_INT8:
    *(int8_t *)exp = (int8_t)ref_sint(op, *(const int8_t *)a, *(const int8_t *)b, 8, div);
    break;
  case BRG_UINT8: *(uint8_t *)exp = (uint8_t)ref_uint(op, *a, *b, 8, div); break;
  case BRG_INT32: {
    int32_t x, y;
    memcpy(&x, a, 4), memcpy(&y, b, 4);
    int32_t r = (int32_t)ref_sint(op, x, y, 32, div);
    memcpy(exp, &r, 4);
    break;
  }
  case BRG_UINT32: {
    uint32_t x, y;
    memcpy(&x, a, 4), memcpy(&y, b, 4);
    uint32_t r = (uint32_t)ref_uint(op, x, y, 32, div);
    memcpy(exp, &r, 4);
    break;
  }
  case BRG_INT64: {
    int64_t x, y;
    memcpy(&x, a, 8), memcpy(&y, b, 8);
    int64_t r = ref_sint(op, x, y, 64, div);
    memcpy(exp, &r, 8);
    break;
  }
  case BRG_UINT64: {
    uint64_t x, y;
    memcpy(&x, a, 8), memcpy(&y, b, 8);
    uint64_t r = ref_uint(op, x, y, 64, div);
    memcpy(exp, &r, 8);
    break;
  }
  case BRG_FLOAT16:
  case BRG_BFLOAT16: {
    uint16_t x, y;
    memcpy(&x, a, 2), memcpy(&y, b, 2);
    uint16_t r = ref_half_op(dt == BRG_FLOAT16 ? &F16 : &BF16, op, x, y, div);
    memcpy(exp, &r, 2);
    break;
  }
  case BRG_FLOAT32: {
    float x, y;
    memcpy(&x, a, 4), memcpy(&y, b, 4);
    float r = ref_f32(op, x, y, div);
    memcpy(exp, &r, 4);
    break;
  }
  case BRG_FLOAT64: {
    double x, y;
    memcpy(&x, a, 8), memcpy(&y, b, 8);
    double r = ref_f64(op, x, y, div);
    memcpy(exp, &r, 8);
    break;
  }
  }
}

/* Bits must match, except that float32/float64 sum/prod/avg only promise a
 * NaN (hardware picks the payload). min/max return an input, bit exact. */
static int elem_matches(brg_dtype dt, brg_op op, const void *exp, const void *got) {
  if (memcmp(exp, got, esize(dt)) == 0) return 1;
  if (op == BRG_MIN || op == BRG_MAX) return 0;
  if (dt == BRG_FLOAT32) {
    float e, g;
    memcpy(&e, exp, 4), memcpy(&g, got, 4);
    return isnan(e) && isnan(g);
  }
  if (dt == BRG_FLOAT64) {
    double e, g;
    memcpy(&e, exp, 8), memcpy(&g, got, 8);
    return isnan(e) && isnan(g);
  }
  return 0;
}

static void hex(char *out, const void *p, size_t n) {
  const unsigned char *c = (const unsigned char *)p;
  for (size_t i = 0; i < n; i++) sprintf(out + 2 * i, "%02x", c[n - 1 - i]);
}

/* ---- inputs ------------------------------------------------------------- */

static void fill(brg_dtype dt, void *buf, size_t n) {
  unsigned char *p = (unsigned char *)buf;
  for (size_t i = 0; i < n; i++) {
    uint64_t r = rnd(), k = rnd() % 16;
    switch (dt) {
    case BRG_FLOAT16: {
      /* Random bits (every class), or close magnitudes so rounding matters. */
      uint16_t h = (uint16_t)r;
      if (k >= 6) h = (uint16_t)((h & 0x83ff) | ((12 + (r >> 16) % 7) << 10));
      memcpy(p + 2 * i, &h, 2);
      break;
    }
    case BRG_BFLOAT16: {
      uint16_t h = (uint16_t)r;
      if (k >= 6) h = (uint16_t)((h & 0x807f) | ((124 + (r >> 16) % 7) << 7));
      memcpy(p + 2 * i, &h, 2);
      break;
    }
    case BRG_FLOAT32: {
      static const uint32_t special[] = {0x7fc00000, 0xffc00001, 0x7f800001, 0x7f800000,
                                         0xff800000, 0x00000000, 0x80000000, 0x00000001,
                                         0x807fffff, 0x7f7fffff, 0xff7fffff, 0x00800000};
      uint32_t u = (uint32_t)r;
      if (k == 0)
        u = special[(r >> 32) % 12];
      else if (k >= 4)
        u = (u & 0x807fffff) | (uint32_t)((124 + (r >> 40) % 7) << 23);
      memcpy(p + 4 * i, &u, 4);
      break;
    }
    case BRG_FLOAT64: {
      static const uint64_t special[] = {0x7ff8000000000000ull, 0xfff8000000000001ull,
                                         0x7ff0000000000001ull, 0x7ff0000000000000ull,
                                         0xfff0000000000000ull, 0,
                                         0x8000000000000000ull, 1,
                                         0x7fefffffffffffffull, 0x0010000000000000ull};
      uint64_t u = r;
      if (k == 0)
        u = special[rnd() % 10];
      else if (k >= 4)
        u = (u & 0x800fffffffffffffull) | ((1020 + rnd() % 7) << 52);
      memcpy(p + 8 * i, &u, 8);
      break;
    }
    default:
      memcpy(p + esize(dt) * i, &r, esize(dt));
      /* Some extremes so wrap-around is hit every run. */
      if (k == 0) memset(p + esize(dt) * i, 0xff, esize(dt));
      if (k == 1) {
        memset(p + esize(dt) * i, 0, esize(dt));
        p[esize(dt) * (i + 1) - 1] = 0x80;
      }
      break;
    }
  }
}

/* ---- buffers with guard bytes ------------------------------------------- */

#define GUARD 64
#define GUARD_BYTE 0xa5

/* Payload starts one element past GUARD bytes, so it is never vector aligned. */
struct buf {
  unsigned char *base;
  void *p;
  size_t bytes;
};

static struct buf buf_new(brg_dtype dt, size_t n) {
  struct buf b;
  b.bytes = n * esize(dt);
  b.base = malloc(2 * GUARD + esize(dt) + b.bytes);
  assert_non_null(b.base);
  memset(b.base, GUARD_BYTE, 2 * GUARD + esize(dt) + b.bytes);
  b.p = b.base + GUARD + esize(dt);
  return b;
}

static void buf_check_guards(const struct buf *b, size_t elem) {
  for (size_t i = 0; i < GUARD + elem; i++)
    if (b->base[i] != GUARD_BYTE)
      fail_msg("write before the buffer at byte -%zu", GUARD + elem - i);
  const unsigned char *end = (const unsigned char *)b->p + b->bytes;
  for (size_t i = 0; i < GUARD; i++)
    if (end[i] != GUARD_BYTE) fail_msg("write past the buffer at byte +%zu", i);
}

/* ---- all dtypes x ops x counts x aliasing ------------------------------- */

enum alias_mode {
  DST_NEW,       /* dst0 fresh, no dst1 */
  DST_NEW_DST1,  /* dst0 and dst1 fresh */
  DST_IS_A,      /* dst0 == a */
  DST_IS_B_DST1, /* dst0 == b, dst1 fresh */
  DST1_IS_A,     /* dst0 fresh, dst1 == a */
  BOTH_IN_PLACE, /* dst0 == a, dst1 == b */
  ALIAS_MODES
};

static void check_one(brg_dtype dt, brg_op op, size_t n, int div, enum alias_mode mode,
                      const char *isa) {
  size_t es = esize(dt);
  struct buf a = buf_new(dt, n), b = buf_new(dt, n), d0 = buf_new(dt, n), d1 = buf_new(dt, n);
  unsigned char *a_in = malloc(n * es + 1), *b_in = malloc(n * es + 1);
  assert_non_null(a_in);
  assert_non_null(b_in);
  fill(dt, a.p, n);
  fill(dt, b.p, n);
  memcpy(a_in, a.p, n * es);
  memcpy(b_in, b.p, n * es);

  void *dst0 = d0.p, *dst1 = NULL;
  switch (mode) {
  case DST_NEW: break;
  case DST_NEW_DST1: dst1 = d1.p; break;
  case DST_IS_A: dst0 = a.p; break;
  case DST_IS_B_DST1: dst0 = b.p, dst1 = d1.p; break;
  case DST1_IS_A: dst1 = a.p; break;
  case BOTH_IN_PLACE: dst0 = a.p, dst1 = b.p; break;
  default: break;
  }
  brg__reduce(dst0, dst1, a.p, b.p, n, dt, op, div);

  unsigned char exp[8];
  char he[17], hg[17], ha[17], hb[17];
  for (size_t i = 0; i < n; i++) {
    ref_elem(dt, op, a_in, b_in, i, div, exp);
    const void *outs[2] = {(const unsigned char *)dst0 + i * es,
                           dst1 ? (const unsigned char *)dst1 + i * es : NULL};
    for (int k = 0; k < 2; k++) {
      if (!outs[k] || elem_matches(dt, op, exp, outs[k])) continue;
      hex(he, exp, es), hex(hg, outs[k], es), hex(ha, a_in + i * es, es),
          hex(hb, b_in + i * es, es);
      fail_msg("%s %s %s n=%zu div=%d mode=%d dst%d[%zu]: a=%s b=%s expected %s got %s", isa,
               dt_name(dt), op_name(op), n, div, (int)mode, k, i, ha, hb, he, hg);
    }
  }
  /* Inputs that are not destinations stay as they were. */
  if (dst0 != a.p && dst1 != a.p) assert_memory_equal(a.p, a_in, n * es);
  if (dst0 != b.p && dst1 != b.p) assert_memory_equal(b.p, b_in, n * es);
  buf_check_guards(&a, es), buf_check_guards(&b, es);
  buf_check_guards(&d0, es), buf_check_guards(&d1, es);
  free(a.base), free(b.base), free(d0.base), free(d1.base), free(a_in), free(b_in);
}

static void run_all_ops(const char *isa) {
  for (int dt = 0; dt < BRG_NUM_DTYPES; dt++)
    for (int op = 0; op < BRG_NUM_OPS; op++)
      for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++)
        for (int mode = 0; mode < ALIAS_MODES; mode++) {
          if (op >= BRG_BAND && dt >= BRG_FLOAT16) continue; /* integers only */
          if (op != BRG_AVG) {
            check_one((brg_dtype)dt, (brg_op)op, counts[c], 3, (enum alias_mode)mode, isa);
            continue;
          }
          for (int div = 1; div <= 8; div++)
            check_one((brg_dtype)dt, (brg_op)op, counts[c], div, (enum alias_mode)mode, isa);
        }
}

static void test_reduce_every_isa(void **state) {
  (void)state;
  int ran = 0;
  for (size_t k = 0; k < sizeof isa_names / sizeof isa_names[0]; k++) {
    if (brg__kernels_force_isa(isa_names[k]) != 0) {
      print_message("kernels: %s not runnable here, skipped\n", isa_names[k]);
      continue;
    }
    assert_string_equal(brg__kernels_isa(), isa_names[k]);
    run_all_ops(isa_names[k]);
    ran++;
  }
  assert_int_equal(brg__kernels_force_isa(NULL), 0);
  assert_true(ran >= 1);
}

/* The bitwise ops have no floating-point kernels: such a call writes
 * nothing (the API refuses it before it gets here). */
static void test_bitwise_float_writes_nothing(void **state) {
  (void)state;
  unsigned char a[64], b[64], d[64], before[64];
  memset(a, 0x5a, sizeof a), memset(b, 0xa5, sizeof b), memset(d, 0x77, sizeof d);
  memcpy(before, d, sizeof d);
  for (int dt = BRG_FLOAT16; dt <= BRG_FLOAT64; dt++)
    for (int op = BRG_BAND; op <= BRG_BXOR; op++) {
      brg__reduce(d, NULL, a, b, 64 / esize((brg_dtype)dt), (brg_dtype)dt, (brg_op)op, 1);
      assert_memory_equal(d, before, sizeof d);
    }
}

static void test_isa_detection(void **state) {
  (void)state;
  assert_int_equal(brg__kernels_force_isa(NULL), 0);
  const char *isa = brg__kernels_isa();
  print_message("kernels: detected ISA %s\n", isa);
  /* The detected ISA is the best one that can be forced. */
  size_t best = 0;
  for (size_t k = 0; k < sizeof isa_names / sizeof isa_names[0]; k++)
    if (brg__kernels_force_isa(isa_names[k]) == 0) best = k;
  assert_int_equal(brg__kernels_force_isa(NULL), 0);
  assert_string_equal(isa, isa_names[best]);
  assert_int_equal(brg__kernels_force_isa("sse9"), -1);
  assert_string_equal(brg__kernels_isa(), isa);
}

/* ---- SIMD vs generic on random bit patterns ------------------------------ */

static void test_simd_matches_generic(void **state) {
  (void)state;
  const size_t n = 4099;
  uint16_t *a = malloc(n * 2), *b = malloc(n * 2), *g = malloc(n * 2), *v = malloc(n * 2);
  assert_true(a && b && g && v);
  int compared = 0;
  for (size_t k = 1; k < sizeof isa_names / sizeof isa_names[0]; k++) {
    for (int round = 0; round < 40; round++) {
      for (size_t i = 0; i < n; i++) {
        uint64_t r = rnd();
        a[i] = (uint16_t)r, b[i] = (uint16_t)(r >> 16);
        if (round & 1) b[i] = (uint16_t)(a[i] ^ (r >> 32 & 0x1f)); /* near ties, equal values */
      }
      size_t len = round < 20 ? n : 1 + rnd() % 64;
      for (int dt = BRG_FLOAT16; dt <= BRG_BFLOAT16; dt++)
        for (int op = 0; op <= BRG_AVG; op++) { /* the bitwise ops take integers only */
          int div = 1 + (int)(rnd() % 8);
          if (brg__kernels_force_isa("generic") != 0) fail_msg("generic ISA refused");
          brg__reduce(g, NULL, a, b, len, (brg_dtype)dt, (brg_op)op, div);
          if (brg__kernels_force_isa(isa_names[k]) != 0) goto next_isa;
          brg__reduce(v, NULL, a, b, len, (brg_dtype)dt, (brg_op)op, div);
          for (size_t i = 0; i < len; i++)
            if (g[i] != v[i])
              fail_msg("%s %s %s div=%d [%zu]: a=%04x b=%04x generic %04x simd %04x", isa_names[k],
                       dt_name((brg_dtype)dt), op_name((brg_op)op), div, i, a[i], b[i], g[i], v[i]);
          compared++;
        }
    }
  next_isa:;
  }
  brg__kernels_force_isa(NULL);
  print_message("kernels: %d SIMD/generic half comparisons\n", compared);
  free(a), free(b), free(g), free(v);
}

/* ---- conversions -------------------------------------------------------- */

static void test_f16_roundtrip_exhaustive(void **state) {
  (void)state;
  for (uint32_t h = 0; h < 65536; h++) {
    float f = brg__f16_to_f32((uint16_t)h);
    uint16_t back = brg__f32_to_f16(f);
    double ref = ref_decode(&F16, (uint16_t)h);
    if (ref_isnan(&F16, (uint16_t)h)) {
      if (!isnan(f) || !ref_isnan(&F16, back))
        fail_msg("f16 NaN %04x -> %08x -> %04x", h, bits_of(f), back);
      if (!(bits_of(f) & 0x00400000)) fail_msg("f16 NaN %04x widened to a signalling NaN", h);
      continue;
    }
    if (back != h) fail_msg("f16 %04x -> %08x -> %04x", h, bits_of(f), back);
    if ((double)f != ref || !signbit(f) != !signbit(ref))
      fail_msg("f16 %04x widened to %a, want %a", h, f, ref);
  }
}

static void test_bf16_roundtrip_exhaustive(void **state) {
  (void)state;
  for (uint32_t h = 0; h < 65536; h++) {
    float f = brg__bf16_to_f32((uint16_t)h);
    uint16_t back = brg__f32_to_bf16(f);
    if (ref_isnan(&BF16, (uint16_t)h)) {
      if (!isnan(f) || !ref_isnan(&BF16, back)) fail_msg("bf16 NaN %04x -> %04x", h, back);
      continue;
    }
    if (back != h || bits_of(f) != h << 16)
      fail_msg("bf16 %04x -> %08x -> %04x", h, bits_of(f), back);
  }
}

/* float32 -> half by the kernel's converter, by the reference, and (for
 * float16, where the CPU has F16C) by the hardware. */
#if HAVE_X86
__attribute__((target("f16c"))) static uint16_t hw_f32_to_f16(float f) {
  return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
}
__attribute__((target("f16c"))) static float hw_f16_to_f32(uint16_t h) {
  return _cvtsh_ss(h);
}
static int have_f16c(void) {
  unsigned a, b, c, d;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) && (c & bit_OSXSAVE);
}
#endif

static void check_narrow(uint32_t u) {
  float f = f32_of(u);
  uint16_t h = brg__f32_to_f16(f), bh = brg__f32_to_bf16(f);
  if (isnan(f)) {
    if (!ref_isnan(&F16, h) || !ref_isnan(&BF16, bh))
      fail_msg("NaN %08x narrowed to %04x / %04x", u, h, bh);
    if (!(h & 0x0200) || !(bh & 0x0040)) fail_msg("NaN %08x narrowed to a signalling NaN", u);
    if ((h ^ (u >> 16)) & 0x8000) fail_msg("NaN %08x lost its sign", u);
  } else {
    if (h != ref_encode(&F16, f))
      fail_msg("f32 %08x (%a) -> f16 %04x, want %04x", u, f, h, ref_encode(&F16, f));
    if (bh != ref_encode(&BF16, f))
      fail_msg("f32 %08x (%a) -> bf16 %04x, want %04x", u, f, bh, ref_encode(&BF16, f));
  }
#if HAVE_X86
  static int hw = -1;
  if (hw < 0) hw = have_f16c();
  if (hw && h != hw_f32_to_f16(f))
    fail_msg("f32 %08x -> f16 %04x, F16C says %04x", u, h, hw_f32_to_f16(f));
#endif
}

static void test_narrow_against_reference(void **state) {
  (void)state;
  /* Every exponent and sign with low bits around each rounding point, then
   * random patterns. */
  static const uint32_t low[] = {0,      1,        0x7fff,   0x8000,  0x8001, 0xffff,
                                 0x0fff, 0x1000,   0x1001,   0x1fff,  0x2000, 0x2001,
                                 0x3000, 0x7fffff, 0x400000, 0x3fffff};
  for (uint32_t s = 0; s < 2; s++)
    for (uint32_t e = 0; e < 256; e++)
      for (uint32_t m = 0; m < 1024; m += 7)
        for (size_t k = 0; k < sizeof low / sizeof low[0]; k++)
          check_narrow(s << 31 | e << 23 | ((m << 13) ^ low[k]));
  for (int i = 0; i < 2000000; i++) check_narrow((uint32_t)rnd());
  /* Whole float16 subnormal and near-overflow ranges, every float there. */
  for (uint32_t u = 0x33000000; u < 0x38800000; u += 13) check_narrow(u);
  for (uint32_t u = 0x477fe000; u <= 0x47800000; u++) check_narrow(u);
#if HAVE_X86
  if (have_f16c())
    for (uint32_t h = 0; h < 65536; h++) {
      float mine = brg__f16_to_f32((uint16_t)h), hw = hw_f16_to_f32((uint16_t)h);
      if (bits_of(mine) != bits_of(hw))
        fail_msg("f16 %04x -> %08x, F16C says %08x", h, bits_of(mine), bits_of(hw));
    }
#endif
}

static void test_f16_edge_cases(void **state) {
  (void)state;
  /* Ties go to even. */
  assert_int_equal(brg__f32_to_f16(1.0f + 0x1p-11f), 0x3c00);
  assert_int_equal(brg__f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);
  assert_int_equal(brg__f32_to_f16(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);
  assert_int_equal(brg__f32_to_f16(2049.0f), 0x6800); /* 2048 */
  assert_int_equal(brg__f32_to_f16(2051.0f), 0x6802); /* 2052 */
  /* Largest finite, overflow. */
  assert_int_equal(brg__f32_to_f16(65504.0f), 0x7bff);
  assert_int_equal(brg__f32_to_f16(65519.996f), 0x7bff);
  assert_int_equal(brg__f32_to_f16(65520.0f), 0x7c00);
  assert_int_equal(brg__f32_to_f16(1e9f), 0x7c00);
  assert_int_equal(brg__f32_to_f16(-1e9f), 0xfc00);
  assert_int_equal(brg__f32_to_f16(INFINITY), 0x7c00);
  assert_int_equal(brg__f32_to_f16(-INFINITY), 0xfc00);
  assert_true(brg__f16_to_f32(0x7bff) == 65504.0f);
  assert_true(isinf(brg__f16_to_f32(0xfc00)) && brg__f16_to_f32(0xfc00) < 0);
  /* Subnormals, both ways. */
  assert_int_equal(brg__f32_to_f16(0x1p-24f), 0x0001);
  assert_int_equal(brg__f32_to_f16(0x1p-25f), 0x0000); /* tie to even: 0 */
  assert_int_equal(brg__f32_to_f16(0x1.0002p-25f), 0x0001);
  assert_int_equal(brg__f32_to_f16(3 * 0x1p-25f), 0x0002);        /* 1.5 ulp: tie to 2 */
  assert_int_equal(brg__f32_to_f16(5 * 0x1p-25f), 0x0002);        /* 2.5 ulp: tie to 2 */
  assert_int_equal(brg__f32_to_f16(0x1p-14f - 0x1p-25f), 0x0400); /* tie up into the normals */
  assert_int_equal(brg__f32_to_f16(-0x1p-26f), 0x8000);
  assert_true(brg__f16_to_f32(0x0001) == 0x1p-24f);
  assert_true(brg__f16_to_f32(0x03ff) == 1023 * 0x1p-24f);
  assert_true(brg__f16_to_f32(0x8001) == -0x1p-24f);
  /* Signed zero. */
  assert_int_equal(brg__f32_to_f16(-0.0f), 0x8000);
  assert_true(signbit(brg__f16_to_f32(0x8000)) && brg__f16_to_f32(0x8000) == 0);
  /* NaN stays NaN, quiet, with its sign. */
  assert_true(isnan(brg__f16_to_f32(0x7c01)));
  assert_true(bits_of(brg__f16_to_f32(0x7c01)) & 0x00400000);
  assert_true(ref_isnan(&F16, brg__f32_to_f16(f32_of(0x7f800001)))); /* payload below f16 bits */
  assert_int_equal(brg__f32_to_f16(f32_of(0xffc00000)), 0xfe00);

  /* Ops. */
  assert_int_equal(brg__f16_sum(0x7bff, 0x7bff), 0x7c00);                 /* overflow */
  assert_int_equal(brg__f16_sum(0x7c00, 0xfc00), BRG_F16_CANONICAL_NAN);  /* Inf + -Inf */
  assert_int_equal(brg__f16_prod(0x7c00, 0x0000), BRG_F16_CANONICAL_NAN); /* Inf * 0 */
  assert_int_equal(brg__f16_sum(0x3c00, 0x1000), 0x3c00);  /* 1 + 2^-11: tie, stays 1 */
  assert_int_equal(brg__f16_sum(0x0001, 0x0001), 0x0002);  /* subnormal arithmetic */
  assert_int_equal(brg__f16_prod(0x0200, 0x3800), 0x0100); /* 2^-15 * 0.5 */
  assert_int_equal(brg__f16_prod(0x0001, 0x3800), 0x0000); /* 2^-25: tie to 0 */
  assert_int_equal(brg__f16_sum(0x8000, 0x0000), 0x0000);  /* -0 + +0 = +0 */
  assert_int_equal(brg__f16_sum(0x8000, 0x8000), 0x8000);
  assert_int_equal(brg__f16_min(0x7e00, 0x3c00), BRG_F16_CANONICAL_NAN);
  assert_int_equal(brg__f16_min(0x3c00, 0xfd00), BRG_F16_CANONICAL_NAN);
  assert_int_equal(brg__f16_max(0x3c00, 0x7c01), BRG_F16_CANONICAL_NAN);
  assert_int_equal(brg__f16_max(0x7e00, 0x7c00), BRG_F16_CANONICAL_NAN);
  assert_int_equal(brg__f16_min(0x8000, 0x0000), 0x8000);
  assert_int_equal(brg__f16_min(0x0000, 0x8000), 0x8000);
  assert_int_equal(brg__f16_max(0x8000, 0x0000), 0x0000);
  assert_int_equal(brg__f16_max(0x0000, 0x8000), 0x0000);
  assert_int_equal(brg__f16_min(0xfc00, 0x7bff), 0xfc00);
  assert_int_equal(brg__f16_avg(0x3c00, 0x4000, 2), 0x3e00); /* (1 + 2) / 2 = 1.5 */
  assert_int_equal(brg__f16_avg(0x7bff, 0x7bff, 2), 0x7c00); /* sum overflows first */
  assert_int_equal(brg__f16_div(0x0001, 2), 0x0000);         /* 2^-25: tie to 0 */
  assert_int_equal(brg__f16_div(0x0003, 2), 0x0002);         /* 1.5 ulp: tie to 2 */
}

static void test_bf16_edge_cases(void **state) {
  (void)state;
  assert_int_equal(brg__f32_to_bf16(1.0f + 0x1p-8f), 0x3f80); /* tie to even */
  assert_int_equal(brg__f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);
  assert_int_equal(brg__f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
  assert_int_equal(brg__f32_to_bf16(f32_of(0x7f7f0000)), 0x7f7f); /* largest finite */
  assert_int_equal(brg__f32_to_bf16(f32_of(0x7f7f7fff)), 0x7f7f);
  assert_int_equal(brg__f32_to_bf16(f32_of(0x7f7f8000)), 0x7f80); /* tie: odd rounds up to Inf */
  assert_int_equal(brg__f32_to_bf16(f32_of(0x7f7fffff)), 0x7f80); /* FLT_MAX overflows */
  assert_int_equal(brg__f32_to_bf16(f32_of(0xff7fffff)), 0xff80);
  assert_int_equal(brg__f32_to_bf16(INFINITY), 0x7f80);
  assert_int_equal(brg__f32_to_bf16(f32_of(0x00010000)), 0x0001); /* smallest subnormal */
  assert_int_equal(brg__f32_to_bf16(f32_of(0x00008000)), 0x0000); /* half of it: tie to 0 */
  assert_int_equal(brg__f32_to_bf16(f32_of(0x00008001)), 0x0001);
  assert_int_equal(brg__f32_to_bf16(f32_of(0x00018000)), 0x0002); /* 1.5: tie to 2 */
  assert_int_equal(brg__f32_to_bf16(f32_of(0x007f8000)), 0x0080); /* rounds up to the normals */
  assert_int_equal(brg__f32_to_bf16(-0.0f), 0x8000);
  assert_true(brg__bf16_to_f32(0x0001) == 0x1p-133f);
  /* A NaN whose payload is all below the bf16 bits must not turn into Inf. */
  assert_true(ref_isnan(&BF16, brg__f32_to_bf16(f32_of(0x7f800001))));
  assert_true(ref_isnan(&BF16, brg__f32_to_bf16(f32_of(0xff800001))));
  assert_int_equal(brg__f32_to_bf16(f32_of(0xff800001)) & 0x8000, 0x8000);
  assert_true(isnan(brg__bf16_to_f32(0x7f81)));
  assert_true(bits_of(brg__bf16_to_f32(0x7f81)) & 0x00400000);

  assert_int_equal(brg__bf16_sum(0x7f7f, 0x7f7f), 0x7f80);
  assert_int_equal(brg__bf16_sum(0x7f80, 0xff80), BRG_BF16_CANONICAL_NAN);
  assert_int_equal(brg__bf16_sum(0x3f80, 0x3b80), 0x3f80); /* 1 + 2^-8: tie, stays 1 */
  assert_int_equal(brg__bf16_sum(0x3f81, 0x3b80), 0x3f82); /* (1 + 2^-7) + 2^-8: tie up */
  assert_int_equal(brg__bf16_min(0x3f80, 0x7fc1), BRG_BF16_CANONICAL_NAN);
  assert_int_equal(brg__bf16_max(0xffc0, 0x3f80), BRG_BF16_CANONICAL_NAN);
  assert_int_equal(brg__bf16_min(0x0000, 0x8000), 0x8000);
  assert_int_equal(brg__bf16_max(0x8000, 0x0000), 0x0000);
  assert_int_equal(brg__bf16_avg(0x3f80, 0x4000, 2), 0x3fc0);
}

/* The same edge cases through brg__reduce, on every ISA, placed both in the
 * SIMD body and in the tail. */
static void test_half_edges_through_kernels(void **state) {
  (void)state;
  struct {
    brg_dtype dt;
    brg_op op;
    uint16_t a, b, want;
  } cases[] = {
      {BRG_FLOAT16, BRG_SUM, 0x7c00, 0xfc00, 0x7e00},
      {BRG_FLOAT16, BRG_SUM, 0x7bff, 0x7bff, 0x7c00},
      {BRG_FLOAT16, BRG_SUM, 0x3c00, 0x1000, 0x3c00},
      {BRG_FLOAT16, BRG_SUM, 0x3c01, 0x1000, 0x3c02},
      {BRG_FLOAT16, BRG_SUM, 0x0001, 0x8002, 0x8001},
      {BRG_FLOAT16, BRG_PROD, 0x0001, 0x3800, 0x0000},
      {BRG_FLOAT16, BRG_PROD, 0x0003, 0x3800, 0x0002},
      {BRG_FLOAT16, BRG_MIN, 0x7e00, 0x3c00, 0x7e00},
      {BRG_FLOAT16, BRG_MIN, 0x3c00, 0x7d00, 0x7e00},
      {BRG_FLOAT16, BRG_MAX, 0xfe00, 0x3c00, 0x7e00},
      {BRG_FLOAT16, BRG_MIN, 0x0000, 0x8000, 0x8000},
      {BRG_FLOAT16, BRG_MAX, 0x8000, 0x0000, 0x0000},
      {BRG_FLOAT16, BRG_SUM, 0x7c01, 0x3c00, 0x7e00},
      {BRG_FLOAT16, BRG_PROD, 0x7c00, 0x8000, 0x7e00},
      {BRG_BFLOAT16, BRG_SUM, 0x7f80, 0xff80, 0x7fc0},
      {BRG_BFLOAT16, BRG_SUM, 0x7f7f, 0x7f7f, 0x7f80},
      {BRG_BFLOAT16, BRG_SUM, 0x3f80, 0x3b80, 0x3f80},
      {BRG_BFLOAT16, BRG_SUM, 0x3f81, 0x3b80, 0x3f82},
      {BRG_BFLOAT16, BRG_SUM, 0x7f81, 0x3f80, 0x7fc0},
      {BRG_BFLOAT16, BRG_MIN, 0x3f80, 0xffc0, 0x7fc0},
      {BRG_BFLOAT16, BRG_MAX, 0x7fc0, 0x3f80, 0x7fc0},
      {BRG_BFLOAT16, BRG_MIN, 0x8000, 0x0000, 0x8000},
      {BRG_BFLOAT16, BRG_PROD, 0x0001, 0x3f00, 0x0000},
      {BRG_BFLOAT16, BRG_PROD, 0x0003, 0x3f00, 0x0002},
  };
  enum { N = 37 }; /* 32 in the SIMD body, 5 in the tail */
  uint16_t a[N], b[N], d[N];
  for (size_t k = 0; k < sizeof isa_names / sizeof isa_names[0]; k++) {
    if (brg__kernels_force_isa(isa_names[k]) != 0) continue;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
      for (int i = 0; i < N; i++) a[i] = cases[c].a, b[i] = cases[c].b;
      brg__reduce(d, NULL, a, b, N, cases[c].dt, cases[c].op, 1);
      for (int i = 0; i < N; i++)
        if (d[i] != cases[c].want)
          fail_msg("%s case %zu [%d]: %04x %s %04x = %04x, want %04x", isa_names[k], c, i,
                   cases[c].a, op_name(cases[c].op), cases[c].b, d[i], cases[c].want);
    }
  }
  brg__kernels_force_isa(NULL);
}

/* ---- integers and plain floats ------------------------------------------ */

static void test_integer_wrap(void **state) {
  (void)state;
  for (size_t k = 0; k < sizeof isa_names / sizeof isa_names[0]; k++) {
    if (brg__kernels_force_isa(isa_names[k]) != 0) continue;
    int8_t a8[17], b8[17], r8[17];
    for (int i = 0; i < 17; i++) a8[i] = 127, b8[i] = 1;
    brg__reduce(r8, NULL, a8, b8, 17, BRG_INT8, BRG_SUM, 1);
    for (int i = 0; i < 17; i++) assert_int_equal(r8[i], -128);
    brg__reduce(r8, NULL, a8, b8, 17, BRG_INT8, BRG_AVG, 2); /* wrapped sum, then / 2 */
    for (int i = 0; i < 17; i++) assert_int_equal(r8[i], -64);
    for (int i = 0; i < 17; i++) a8[i] = -128, b8[i] = -1;
    brg__reduce(r8, NULL, a8, b8, 17, BRG_INT8, BRG_PROD, 1);
    for (int i = 0; i < 17; i++) assert_int_equal(r8[i], -128);
    for (int i = 0; i < 17; i++) a8[i] = -100, b8[i] = -100;   /* -200 wraps to 56 */
    brg__reduce(r8, NULL, a8, b8, 17, BRG_INT8, BRG_AVG, 200); /* divisor beyond int8 */
    for (int i = 0; i < 17; i++) assert_int_equal(r8[i], 0);
    for (int i = 0; i < 17; i++) a8[i] = -100, b8[i] = 0;
    brg__reduce(r8, NULL, a8, b8, 17, BRG_INT8, BRG_AVG, 130);
    for (int i = 0; i < 17; i++) assert_int_equal(r8[i], 0);
    brg__reduce(r8, NULL, a8, b8, 17, BRG_INT8, BRG_AVG, 7);
    for (int i = 0; i < 17; i++) assert_int_equal(r8[i], -14);
    for (int i = 0; i < 17; i++) a8[i] = -1, b8[i] = -2;
    brg__reduce(r8, NULL, a8, b8, 17, BRG_INT8, BRG_AVG, 2); /* -3 / 2 truncates to -1 */
    for (int i = 0; i < 17; i++) assert_int_equal(r8[i], -1);

    uint8_t u8a[17], u8b[17], u8r[17];
    for (int i = 0; i < 17; i++) u8a[i] = 255, u8b[i] = 1;
    brg__reduce(u8r, NULL, u8a, u8b, 17, BRG_UINT8, BRG_SUM, 1);
    for (int i = 0; i < 17; i++) assert_int_equal(u8r[i], 0);
    brg__reduce(u8r, NULL, u8a, u8a, 17, BRG_UINT8, BRG_AVG, 200); /* divisor beyond int8 */
    for (int i = 0; i < 17; i++) assert_int_equal(u8r[i], 254 / 200);

    uint64_t a64[9], b64[9], r64[9];
    for (int i = 0; i < 9; i++) a64[i] = 1ull << 32, b64[i] = 1ull << 32;
    brg__reduce(r64, NULL, a64, b64, 9, BRG_UINT64, BRG_PROD, 1);
    for (int i = 0; i < 9; i++) assert_true(r64[i] == 0);
    for (int i = 0; i < 9; i++) a64[i] = (1ull << 63) + 1, b64[i] = 3;
    brg__reduce(r64, NULL, a64, b64, 9, BRG_UINT64, BRG_PROD, 1);
    for (int i = 0; i < 9; i++) assert_true(r64[i] == (1ull << 63) + 3);

    int64_t s64a[9], s64b[9], s64r[9];
    for (int i = 0; i < 9; i++) s64a[i] = INT64_MAX, s64b[i] = 1;
    brg__reduce(s64r, NULL, s64a, s64b, 9, BRG_INT64, BRG_SUM, 1);
    for (int i = 0; i < 9; i++) assert_true(s64r[i] == INT64_MIN);
    brg__reduce(s64r, NULL, s64a, s64b, 9, BRG_INT64, BRG_AVG, 4);
    for (int i = 0; i < 9; i++) assert_true(s64r[i] == INT64_MIN / 4);

    int32_t s32a[9], s32b[9], s32r[9];
    for (int i = 0; i < 9; i++) s32a[i] = INT32_MIN, s32b[i] = -1;
    brg__reduce(s32r, NULL, s32a, s32b, 9, BRG_INT32, BRG_PROD, 1);
    for (int i = 0; i < 9; i++) assert_true(s32r[i] == INT32_MIN);
    brg__reduce(s32r, NULL, s32a, s32b, 9, BRG_INT32, BRG_SUM, 1);
    for (int i = 0; i < 9; i++) assert_true(s32r[i] == INT32_MAX);
  }
  brg__kernels_force_isa(NULL);
}

static void test_float_nan_minmax(void **state) {
  (void)state;
  for (size_t k = 0; k < sizeof isa_names / sizeof isa_names[0]; k++) {
    if (brg__kernels_force_isa(isa_names[k]) != 0) continue;
    float a[19], b[19], r[19];
    for (int i = 0; i < 19; i++) a[i] = NAN, b[i] = 1.0f;
    brg__reduce(r, NULL, a, b, 19, BRG_FLOAT32, BRG_MIN, 1);
    for (int i = 0; i < 19; i++) assert_true(isnan(r[i]));
    brg__reduce(r, NULL, b, a, 19, BRG_FLOAT32, BRG_MAX, 1);
    for (int i = 0; i < 19; i++) assert_true(isnan(r[i]));
    for (int i = 0; i < 19; i++) a[i] = INFINITY, b[i] = -INFINITY;
    brg__reduce(r, NULL, a, b, 19, BRG_FLOAT32, BRG_SUM, 1);
    for (int i = 0; i < 19; i++) assert_true(isnan(r[i]));
    for (int i = 0; i < 19; i++) a[i] = 0.0f, b[i] = -0.0f;
    brg__reduce(r, NULL, a, b, 19, BRG_FLOAT32, BRG_MIN, 1);
    for (int i = 0; i < 19; i++) assert_true(r[i] == 0 && signbit(r[i]));
    brg__reduce(r, NULL, b, a, 19, BRG_FLOAT32, BRG_MAX, 1);
    for (int i = 0; i < 19; i++) assert_true(r[i] == 0 && !signbit(r[i]));

    double x[11], y[11], z[11];
    for (int i = 0; i < 11; i++) x[i] = 2.0, y[i] = NAN;
    brg__reduce(z, NULL, x, y, 11, BRG_FLOAT64, BRG_MAX, 1);
    for (int i = 0; i < 11; i++) assert_true(isnan(z[i]));
    brg__reduce(z, NULL, y, x, 11, BRG_FLOAT64, BRG_MIN, 1);
    for (int i = 0; i < 11; i++) assert_true(isnan(z[i]));
  }
  brg__kernels_force_isa(NULL);
}

/* ---- divide and copy ---------------------------------------------------- */

static void test_divide(void **state) {
  (void)state;
  for (size_t k = 0; k < sizeof isa_names / sizeof isa_names[0]; k++) {
    if (brg__kernels_force_isa(isa_names[k]) != 0) continue;
    for (int dt = 0; dt < BRG_NUM_DTYPES; dt++)
      for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++)
        for (int div = 1; div <= 8; div++)
          for (int in_place = 0; in_place < 2; in_place++) {
            size_t n = counts[c], es = esize((brg_dtype)dt);
            struct buf s = buf_new((brg_dtype)dt, n), d = buf_new((brg_dtype)dt, n);
            unsigned char *orig = malloc(n * es + 1), *zero = calloc(n + 1, es);
            assert_true(orig && zero);
            fill((brg_dtype)dt, s.p, n);
            memcpy(orig, s.p, n * es);
            void *dst = in_place ? s.p : d.p;
            brg__divide(dst, s.p, n, (brg_dtype)dt, div);
            /* x / d is avg(x, 0, d) for every dtype: the sum with +0 is
             * exact (-0 + 0 aside, which divides to a zero either way). */
            unsigned char exp[8];
            for (size_t i = 0; i < n; i++) {
              const unsigned char *g = (const unsigned char *)dst + i * es;
              if (is_half((brg_dtype)dt)) {
                uint16_t x, got;
                memcpy(&x, orig + i * es, 2), memcpy(&got, g, 2);
                const struct hfmt *f = dt == BRG_FLOAT16 ? &F16 : &BF16;
                uint16_t want = ref_encode(f, ref_decode(f, x) / div);
                if (got != want)
                  fail_msg("%s divide %04x / %d = %04x, want %04x", isa_names[k], x, div, got,
                           want);
                continue;
              }
              ref_elem((brg_dtype)dt, BRG_AVG, orig, zero, i, div, exp);
              if (is_float((brg_dtype)dt) && memcmp(exp, g, es) != 0) {
                /* -0 / d keeps its sign; the avg reference made it +0. */
                double e = dt == BRG_FLOAT32 ? (double)*(const float *)(const void *)exp
                                             : *(const double *)(const void *)exp;
                double v = dt == BRG_FLOAT32 ? (double)*(const float *)(const void *)g
                                             : *(const double *)(const void *)g;
                if ((isnan(e) && isnan(v)) || (e == 0 && v == 0)) continue;
              }
              if (!elem_matches((brg_dtype)dt, BRG_AVG, exp, g))
                fail_msg("%s divide %s [%zu] by %d wrong", isa_names[k], dt_name((brg_dtype)dt), i,
                         div);
            }
            if (!in_place) assert_memory_equal(s.p, orig, n * es);
            buf_check_guards(&s, es), buf_check_guards(&d, es);
            free(s.base), free(d.base), free(orig), free(zero);
          }
  }
  brg__kernels_force_isa(NULL);
}

static void test_copy(void **state) {
  (void)state;
  static const size_t sizes[] = {
      0, 1, 7, 64, 1003, 256 * 1024 - 1, 256 * 1024 + 5, 3 * 256 * 1024 + 17};
  for (size_t z = 0; z < sizeof sizes / sizeof sizes[0]; z++)
    for (int mode = 0; mode < 4; mode++) {
      size_t n = sizes[z];
      struct buf s = buf_new(BRG_UINT8, n), d0 = buf_new(BRG_UINT8, n), d1 = buf_new(BRG_UINT8, n);
      unsigned char *orig = malloc(n + 1);
      assert_non_null(orig);
      fill(BRG_UINT8, s.p, n);
      memcpy(orig, s.p, n);
      void *dst0 = d0.p, *dst1 = NULL;
      if (mode == 1) dst1 = d1.p;
      if (mode == 2) dst0 = s.p, dst1 = d1.p; /* in place plus a second copy */
      if (mode == 3) dst1 = s.p;
      brg__copy(dst0, dst1, s.p, n);
      assert_memory_equal(dst0, orig, n);
      if (dst1) assert_memory_equal(dst1, orig, n);
      assert_memory_equal(s.p, orig, n);
      buf_check_guards(&s, 1), buf_check_guards(&d0, 1), buf_check_guards(&d1, 1);
      free(s.base), free(d0.base), free(d1.base), free(orig);
    }
}

/* ---- the reference itself ------------------------------------------------ */

/* The reference converter must agree with plain double -> float rounding
 * where the formats meet: a float16 value is a float, so encode(decode(h)) is
 * h, and for bfloat16 the encoder of a float is its top half rounded. */
static void test_reference_sanity(void **state) {
  (void)state;
  for (uint32_t h = 0; h < 65536; h++) {
    if (ref_isnan(&F16, (uint16_t)h) || ref_isnan(&BF16, (uint16_t)h)) continue;
    assert_int_equal(ref_encode(&F16, ref_decode(&F16, (uint16_t)h)), h);
    assert_int_equal(ref_encode(&BF16, ref_decode(&BF16, (uint16_t)h)), h);
  }
  assert_int_equal(ref_encode(&F16, 2049.0), 0x6800);
  assert_int_equal(ref_encode(&F16, 65520.0), 0x7c00);
  assert_int_equal(ref_encode(&F16, ldexp(1, -25)), 0x0000);
  assert_int_equal(ref_encode(&BF16, 1.0 + ldexp(1, -8)), 0x3f80);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_reference_sanity),
      cmocka_unit_test(test_isa_detection),
      cmocka_unit_test(test_bitwise_float_writes_nothing),
      cmocka_unit_test(test_f16_edge_cases),
      cmocka_unit_test(test_bf16_edge_cases),
      cmocka_unit_test(test_f16_roundtrip_exhaustive),
      cmocka_unit_test(test_bf16_roundtrip_exhaustive),
      cmocka_unit_test(test_narrow_against_reference),
      cmocka_unit_test(test_half_edges_through_kernels),
      cmocka_unit_test(test_integer_wrap),
      cmocka_unit_test(test_float_nan_minmax),
      cmocka_unit_test(test_reduce_every_isa),
      cmocka_unit_test(test_simd_matches_generic),
      cmocka_unit_test(test_divide),
      cmocka_unit_test(test_copy),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
