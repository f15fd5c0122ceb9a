/*
 * The benchmark driver shared by all *_perf programs.
 *
 * For every dtype, op and size it times -n back-to-back calls (after -w
 * untimed ones), out of place and then in place, and prints one row like
 * nccl-tests: average time per call (the slowest rank's), algorithm
 * bandwidth (bytes / time) and bus bandwidth (algbw times the share of the
 * data each link has to carry for that collective).
 *
 * The data check (-c 1) is a separate call after the timed loop: fresh
 * inputs, the output poisoned, one call, then every element of the output
 * is compared with a reference computed here from the inputs, never by
 * brigade. Inputs are small integers (and powers of two for prod) chosen so
 * that the exact result is representable in every dtype, half and bfloat16
 * included, whatever order the ranks combine them in; integer types wrap,
 * and the reference wraps the same way.
 *
 * Inputs repeat with a period of PERIOD elements, so buffers are filled and
 * checked with memcpy/memcmp of one precomputed period rather than element
 * by element. PERIOD has odd factors, so an output shifted by a power-of-two
 * number of elements (a misplaced chunk or slice) never matches by chance.
 */
#include "common.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define PERIOD 30030u /* 2*3*5*7*11*13 */
#define ALIGN 4096u
#define PLAIN_DATA (-1) /* "op" of the data pattern of non-reducing collectives */

static const char *prog = "brigade_perf";

/* ------------------------------------------------------------------ names */

/* nccl-tests spellings first: they are what the table prints. */
static const struct {
  const char *name;
  brg_dtype dtype;
} dtype_names[] = {
    {"int8", BRG_INT8},       {"uint8", BRG_UINT8},       {"int32", BRG_INT32},
    {"uint32", BRG_UINT32},   {"int64", BRG_INT64},       {"uint64", BRG_UINT64},
    {"half", BRG_FLOAT16},    {"bfloat16", BRG_BFLOAT16}, {"float", BRG_FLOAT32},
    {"double", BRG_FLOAT64},  {"float16", BRG_FLOAT16},   {"float32", BRG_FLOAT32},
    {"float64", BRG_FLOAT64}, {"char", BRG_INT8},         {"int", BRG_INT32},
    {"fp16", BRG_FLOAT16},    {"bf16", BRG_BFLOAT16},
};
static const char *const dtype_print[BRG_NUM_DTYPES] = {
    "int8", "uint8", "int32", "uint32", "int64", "uint64", "half", "bfloat16", "float", "double",
};
static const char *const op_print[BRG_NUM_OPS] = {"sum", "prod", "min", "max", "avg"};

/* --------------------------------------------------------------- options */

typedef struct bench_opts {
  size_t min_bytes, max_bytes;
  size_t step_bytes; /* used when step_factor <= 1 */
  size_t step_factor;
  int iters, warmup, check, blocking, root;
  int ndtypes, nops;
  brg_dtype dtypes[BRG_NUM_DTYPES];
  brg_op ops[BRG_NUM_OPS];
} bench_opts;

/* "64", "1K", "32M", "2G" (powers of 1024), optionally followed by "B". */
static int parse_size(const char *s, size_t *out) {
  char *end;
  errno = 0;
  if (*s == '-' || *s == '\0') return -1;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno != 0 || end == s) return -1;
  unsigned shift = 0;
  switch (*end) {
  case 'k':
  case 'K':
    shift = 10;
    end++;
    break;
  case 'm':
  case 'M':
    shift = 20;
    end++;
    break;
  case 'g':
  case 'G':
    shift = 30;
    end++;
    break;
  case 't':
  case 'T':
    shift = 40;
    end++;
    break;
  default:
    break;
  }
  if (*end == 'B' || *end == 'b') end++;
  if (*end != '\0') return -1;
  if (shift && v > (ULLONG_MAX >> shift)) return -1;
  v <<= shift;
  if (v > SIZE_MAX / 4) return -1;
  *out = (size_t)v;
  return 0;
}

static int parse_int(const char *s, int min, int *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno != 0 || end == s || *end != '\0' || v < min || v > 1000000000L) return -1;
  *out = (int)v;
  return 0;
}

static void usage(FILE *f, const bench_coll *coll) {
  fprintf(f,
          "usage: %s [options]\n"
          "Times brigade's %s on host memory and prints an nccl-tests style table.\n"
          "Ranks come from the launcher's environment (brigade-run, torchrun, mpirun,\n"
          "srun); without one it runs as a single rank.\n"
          "\n"
          "  -b, --minbytes SIZE      smallest size (default 32M); K/M/G suffixes\n"
          "  -e, --maxbytes SIZE      largest size (default 32M)\n"
          "  -f, --stepfactor N       multiply the size by N between rows\n"
          "  -i, --stepbytes SIZE     add SIZE between rows (default 1M)\n"
          "  -n, --iters N            timed calls per row (default 20)\n"
          "  -w, --warmup_iters N     untimed calls before each timed loop (default 5)\n"
          "  -c, --check 0|1          check every element of one extra call (default 1)\n"
          "  -d, --datatype TYPE      int8 uint8 int32 uint32 int64 uint64 half|float16\n"
          "                           bfloat16 float|float32 double|float64, or all\n"
          "                           (default float)\n"
          "  -o, --op OP              sum prod min max avg, or all (default sum)\n"
          "  -r, --root R             root rank of broadcast and reduce (default 0)\n"
          "  -z, --blocking 0|1       accepted for compatibility: host calls block\n"
          "  -h, --help               this text\n"
          "\n"
          "SIZE is the total payload in bytes: per rank for all_reduce, broadcast and\n"
          "reduce, the whole gathered/scattered buffer for all_gather and reduce_scatter.\n"
          "Times are averages over -n calls, the slowest rank's; busbw is algbw times\n"
          "2(N-1)/N for all_reduce, (N-1)/N for all_gather and reduce_scatter, 1 for\n"
          "broadcast and reduce. Select transports with BRIGADE_TRANSPORTS=shm|tcp.\n",
          prog, coll->name);
}

static int parse_args(int argc, char **argv, const bench_coll *coll, bench_opts *o) {
  static const struct option longopts[] = {
      {"minbytes", required_argument, NULL, 'b'},
      {"maxbytes", required_argument, NULL, 'e'},
      {"stepbytes", required_argument, NULL, 'i'},
      {"stepfactor", required_argument, NULL, 'f'},
      {"iters", required_argument, NULL, 'n'},
      {"warmup_iters", required_argument, NULL, 'w'},
      {"check", required_argument, NULL, 'c'},
      {"op", required_argument, NULL, 'o'},
      {"datatype", required_argument, NULL, 'd'},
      {"root", required_argument, NULL, 'r'},
      {"blocking", required_argument, NULL, 'z'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0},
  };
  *o = (bench_opts){
      .min_bytes = 32u << 20,
      .max_bytes = 32u << 20,
      .step_bytes = 1u << 20,
      .step_factor = 1,
      .iters = 20,
      .warmup = 5,
      .check = 1,
      .blocking = 1,
      .root = 0,
      .ndtypes = 1,
      .dtypes = {BRG_FLOAT32},
      .nops = 1,
      .ops = {BRG_SUM},
  };
  int c;
  while ((c = getopt_long(argc, argv, "b:e:i:f:n:w:c:o:d:r:z:h", longopts, NULL)) != -1) {
    size_t sz;
    int v;
    switch (c) {
    case 'b':
    case 'e':
    case 'i':
      if (parse_size(optarg, &sz) != 0) {
        fprintf(stderr, "%s: -%c: not a size: '%s'\n", prog, c, optarg);
        return -1;
      }
      if (c == 'b')
        o->min_bytes = sz;
      else if (c == 'e')
        o->max_bytes = sz;
      else {
        o->step_bytes = sz;
        o->step_factor = 1;
      }
      break;
    case 'f':
      if (parse_size(optarg, &sz) != 0 || sz < 1) {
        fprintf(stderr, "%s: -f: not a step factor: '%s'\n", prog, optarg);
        return -1;
      }
      o->step_factor = sz;
      break;
    case 'n':
      if (parse_int(optarg, 1, &o->iters) != 0) {
        fprintf(stderr, "%s: -n: need a count >= 1, got '%s'\n", prog, optarg);
        return -1;
      }
      break;
    case 'w':
      if (parse_int(optarg, 0, &o->warmup) != 0) {
        fprintf(stderr, "%s: -w: need a count >= 0, got '%s'\n", prog, optarg);
        return -1;
      }
      break;
    case 'c':
    case 'z':
      if (parse_int(optarg, 0, &v) != 0 || v > 1) {
        fprintf(stderr, "%s: -%c: need 0 or 1, got '%s'\n", prog, c, optarg);
        return -1;
      }
      if (c == 'c')
        o->check = v;
      else
        o->blocking = v;
      break;
    case 'r':
      if (parse_int(optarg, 0, &o->root) != 0) {
        fprintf(stderr, "%s: -r: need a rank >= 0, got '%s'\n", prog, optarg);
        return -1;
      }
      break;
    case 'd':
      if (strcmp(optarg, "all") == 0) {
        o->ndtypes = BRG_NUM_DTYPES;
        for (int i = 0; i < BRG_NUM_DTYPES; i++) o->dtypes[i] = (brg_dtype)i;
        break;
      }
      o->ndtypes = 0;
      for (size_t i = 0; i < sizeof dtype_names / sizeof dtype_names[0]; i++)
        if (strcmp(optarg, dtype_names[i].name) == 0) {
          o->dtypes[0] = dtype_names[i].dtype;
          o->ndtypes = 1;
        }
      if (o->ndtypes == 0) {
        fprintf(stderr, "%s: -d: unknown datatype '%s' (see -h)\n", prog, optarg);
        return -1;
      }
      break;
    case 'o':
      if (strcmp(optarg, "all") == 0) {
        o->nops = BRG_NUM_OPS;
        for (int i = 0; i < BRG_NUM_OPS; i++) o->ops[i] = (brg_op)i;
        break;
      }
      o->nops = 0;
      for (int i = 0; i < BRG_NUM_OPS; i++)
        if (strcmp(optarg, op_print[i]) == 0) {
          o->ops[0] = (brg_op)i;
          o->nops = 1;
        }
      if (o->nops == 0) {
        fprintf(stderr, "%s: -o: unknown op '%s' (sum prod min max avg all)\n", prog, optarg);
        return -1;
      }
      break;
    case 'h':
      usage(stdout, coll);
      exit(0);
    default:
      usage(stderr, coll);
      return -1;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "%s: unexpected argument '%s' (see -h)\n", prog, argv[optind]);
    return -1;
  }
  if (o->min_bytes > o->max_bytes) {
    fprintf(stderr, "%s: -b %zu is larger than -e %zu\n", prog, o->min_bytes, o->max_bytes);
    return -1;
  }
  return 0;
}

/* ------------------------------------------------------- element access */

static int dt_is_float(brg_dtype dt) {
  return dt >= BRG_FLOAT16;
}
static int dt_is_signed(brg_dtype dt) {
  return dt == BRG_INT8 || dt == BRG_INT32 || dt == BRG_INT64;
}
static size_t dt_size(brg_dtype dt) {
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
  default:
    memcpy(p, &v, 8);
    break;
  }
}

/* Integers are kept as their bit pattern in the low bits of a uint64_t:
 * arithmetic modulo 2^64 truncated to the width is exactly the wrapping
 * arithmetic of the narrow type. */
static uint64_t int_trunc(brg_dtype dt, uint64_t v) {
  size_t bits = dt_size(dt) * 8;
  return bits == 64 ? v : v & ((UINT64_C(1) << bits) - 1);
}

static int64_t int_sext(brg_dtype dt, uint64_t v) {
  size_t bits = dt_size(dt) * 8;
  if (bits == 64) return (int64_t)v;
  uint64_t sign = UINT64_C(1) << (bits - 1);
  return (int64_t)((v ^ sign) - sign);
}

static uint64_t load_u(brg_dtype dt, const void *p) {
  uint64_t v = 0;
  memcpy(&v, p, dt_size(dt)); /* little-endian host */
  return v;
}

static void store_u(brg_dtype dt, void *p, uint64_t v) {
  memcpy(p, &v, dt_size(dt));
}

static int elem_equal(brg_dtype dt, const void *a, const void *b) {
  if (dt_is_float(dt)) return load_f(dt, a) == load_f(dt, b); /* +0 == -0, NaN never */
  return memcmp(a, b, dt_size(dt)) == 0;
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
  default:
    return (double)((int)(h % 61) - 30);
  }
}

static void store_value(brg_dtype dt, void *p, double v) {
  if (dt_is_float(dt))
    store_f(dt, p, v);
  else
    store_u(dt, p, int_trunc(dt, (uint64_t)(int64_t)v));
}

/* One period of rank r's input. */
static void make_input(unsigned char *pat, brg_dtype dt, int op, int nranks, int r) {
  size_t es = dt_size(dt);
  for (uint32_t j = 0; j < PERIOD; j++)
    store_value(dt, pat + j * es, input_value(op, dt, nranks, r, j));
}

/* One period of the reduction of all ranks' inputs, computed independently
 * of brigade: doubles for floats (exact for these inputs, rounded once at
 * the end), wrapping integer arithmetic otherwise. */
static void make_reduced(unsigned char *pat, brg_dtype dt, brg_op op, int nranks) {
  size_t es = dt_size(dt);
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
        case BRG_AVG:
          acc += v;
          break;
        case BRG_PROD:
          acc *= v;
          break;
        case BRG_MIN:
          acc = v < acc ? v : acc;
          break;
        case BRG_MAX:
          acc = v > acc ? v : acc;
          break;
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
        case BRG_AVG:
          acc = int_trunc(dt, acc + v);
          break;
        case BRG_PROD:
          acc = int_trunc(dt, acc * v);
          break;
        case BRG_MIN:
          if (less) acc = v;
          break;
        case BRG_MAX:
          if (!less && v != acc) acc = v;
          break;
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
static void make_poison(unsigned char *dst, const unsigned char *pat, size_t es) {
  memcpy(dst, pat, PERIOD * es);
  for (uint32_t j = 0; j < PERIOD; j++) dst[j * es] ^= 0x5a;
}

/* dst[k] = pat[(start + k) % PERIOD] for k < n. */
static void pattern_fill(void *dst, const unsigned char *pat, size_t es, size_t start, size_t n) {
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
static size_t pattern_wrong(const void *buf, const unsigned char *pat, brg_dtype dt, size_t start,
                            size_t n) {
  const char *b = buf;
  size_t es = dt_size(dt), off = start % PERIOD, wrong = 0;
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

/* ---------------------------------------------------------------- state */

typedef struct bench {
  const bench_coll *coll;
  bench_opts o;
  brg_comm *comm;
  int rank, nranks;
  char *sendreg, *recvreg; /* out of place: send / recv; in place: recvreg holds both */
  size_t reg_bytes;
  /* patterns of the current dtype and op, PERIOD elements each */
  unsigned char *pat_in, *pat_expect, *pat_poison, *pat_tmp;
  double bw_sum;
  int bw_rows;
  uint64_t wrong_total;
} bench;

/* Geometry of one row. `count` is the collective's argument; `total` the
 * elements the size column and the bandwidth count. */
typedef struct row_geom {
  size_t count, total, send_elems, recv_elems;
  size_t send_off, recv_off; /* in place: element offsets into recvreg */
} row_geom;

static void die_status(bench *b, const char *what, brg_status st) {
  fprintf(stderr, "%s: rank %d: %s failed: %s: %s\n", prog, b->rank, what, brg_status_string(st),
          b->comm ? brg_comm_last_error(b->comm) : brg_comm_last_error(NULL));
  fflush(stdout);
  if (b->comm) brg_comm_abort(b->comm);
  exit(1);
}

static void *alloc_touched(size_t bytes) {
  bytes = (bytes + ALIGN - 1) / ALIGN * ALIGN; /* aligned_alloc wants a multiple */
  void *p = aligned_alloc(ALIGN, bytes);
  if (p == NULL) {
    fprintf(stderr, "%s: cannot allocate %zu bytes\n", prog, bytes);
    exit(1);
  }
  memset(p, 0, bytes); /* fault every page in now, not inside the timed loop */
  return p;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int is_reduction(bench_kind k) {
  return k != BENCH_ALL_GATHER && k != BENCH_BROADCAST;
}
static int has_root(bench_kind k) {
  return k == BENCH_BROADCAST || k == BENCH_REDUCE;
}

static double bus_factor(bench_kind k, int n) {
  switch (k) {
  case BENCH_ALLREDUCE:
    return 2.0 * (n - 1) / n;
  case BENCH_REDUCE_SCATTER:
  case BENCH_ALL_GATHER:
    return (double)(n - 1) / n;
  default:
    return 1.0;
  }
}

static row_geom geometry(const bench *b, size_t bytes, brg_dtype dt) {
  size_t elems = bytes / dt_size(dt), n = (size_t)b->nranks;
  row_geom g = {0};
  switch (b->coll->kind) {
  case BENCH_REDUCE_SCATTER:
    g.count = elems / n;
    g.total = g.send_elems = g.count * n;
    g.recv_elems = g.count;
    g.recv_off = (size_t)b->rank * g.count;
    break;
  case BENCH_ALL_GATHER:
    g.count = g.send_elems = elems / n;
    g.total = g.recv_elems = g.count * n;
    g.send_off = (size_t)b->rank * g.count;
    break;
  default:
    g.count = g.total = g.send_elems = g.recv_elems = elems;
    break;
  }
  return g;
}

static void call_buffers(const bench *b, const row_geom *g, size_t es, int in_place, char **send,
                         char **recv) {
  if (in_place) {
    *send = b->recvreg + g->send_off * es;
    *recv = b->recvreg + g->recv_off * es;
  } else {
    *send = b->sendreg;
    *recv = b->recvreg;
  }
}

/* Poisons the output, then writes this rank's input (in place the input
 * overwrites the part of the output it shares). */
static void init_data(bench *b, const row_geom *g, brg_dtype dt, int in_place) {
  size_t es = dt_size(dt);
  char *send, *recv;
  call_buffers(b, g, es, in_place, &send, &recv);
  if (b->coll->kind == BENCH_ALL_GATHER) {
    for (int r = 0; r < b->nranks; r++) {
      make_input(b->pat_tmp, dt, PLAIN_DATA, b->nranks, r);
      make_poison(b->pat_tmp, b->pat_tmp, es);
      pattern_fill(recv + (size_t)r * g->count * es, b->pat_tmp, es, 0, g->count);
    }
  } else {
    size_t start = b->coll->kind == BENCH_REDUCE_SCATTER ? (size_t)b->rank * g->count : 0;
    pattern_fill(recv, b->pat_poison, es, start, g->recv_elems);
  }
  if (b->coll->kind == BENCH_BROADCAST && in_place && b->rank != b->o.root) return;
  pattern_fill(send, b->pat_in, es, 0, g->send_elems);
}

/* Wrong elements on this rank after one call on init_data's buffers. */
static uint64_t check_data(bench *b, const row_geom *g, brg_dtype dt, int in_place) {
  size_t es = dt_size(dt);
  char *send, *recv;
  uint64_t wrong = 0;
  call_buffers(b, g, es, in_place, &send, &recv);
  switch (b->coll->kind) {
  case BENCH_ALL_GATHER:
    for (int r = 0; r < b->nranks; r++) {
      make_input(b->pat_tmp, dt, PLAIN_DATA, b->nranks, r);
      wrong += pattern_wrong(recv + (size_t)r * g->count * es, b->pat_tmp, dt, 0, g->count);
    }
    break;
  case BENCH_REDUCE_SCATTER:
    wrong += pattern_wrong(recv, b->pat_expect, dt, (size_t)b->rank * g->count, g->count);
    break;
  case BENCH_REDUCE:
    if (b->rank == b->o.root) wrong += pattern_wrong(recv, b->pat_expect, dt, 0, g->recv_elems);
    break;
  default:
    wrong += pattern_wrong(recv, b->pat_expect, dt, 0, g->recv_elems);
    break;
  }
  /* The send buffer is const: out of place it must come back untouched. */
  if (!in_place) wrong += pattern_wrong(send, b->pat_in, dt, 0, g->send_elems);
  return wrong;
}

static void run_call(bench *b, const row_geom *g, brg_dtype dt, brg_op op, int in_place) {
  char *send, *recv;
  call_buffers(b, g, dt_size(dt), in_place, &send, &recv);
  bench_call c = {.send = send,
                  .recv = recv,
                  .count = g->count,
                  .dtype = dt,
                  .op = op,
                  .root = b->o.root,
                  .comm = b->comm};
  brg_status st = b->coll->run(&c);
  if (st != BRG_SUCCESS) die_status(b, b->coll->call_name, st);
}

/* Times one placement of one row; prints its columns on rank 0. */
static void time_placement(bench *b, const row_geom *g, brg_dtype dt, int op, int in_place) {
  brg_op bop = op == PLAIN_DATA ? BRG_SUM : (brg_op)op;
  brg_status st;

  init_data(b, g, dt, in_place);
  for (int i = 0; i < b->o.warmup; i++) run_call(b, g, dt, bop, in_place);
  if ((st = brg_barrier(b->comm)) != BRG_SUCCESS) die_status(b, "brg_barrier", st);
  double t0 = now_s();
  for (int i = 0; i < b->o.iters; i++) run_call(b, g, dt, bop, in_place);
  double usec = (now_s() - t0) * 1e6 / b->o.iters;
  if ((st = brg_allreduce(&usec, &usec, 1, BRG_FLOAT64, BRG_MAX, b->comm, NULL)) != BRG_SUCCESS)
    die_status(b, "brg_allreduce (time)", st);

  uint64_t wrong = 0;
  if (b->o.check) {
    init_data(b, g, dt, in_place);
    run_call(b, g, dt, bop, in_place);
    wrong = check_data(b, g, dt, in_place);
    if ((st = brg_allreduce(&wrong, &wrong, 1, BRG_UINT64, BRG_SUM, b->comm, NULL)) != BRG_SUCCESS)
      die_status(b, "brg_allreduce (#wrong)", st);
    b->wrong_total += wrong;
  }

  double bytes = (double)(g->total * dt_size(dt));
  double algbw = usec > 0 ? bytes / usec / 1e3 : 0; /* GB/s */
  double busbw = algbw * bus_factor(b->coll->kind, b->nranks);
  b->bw_sum += busbw;
  b->bw_rows++;
  if (b->rank != 0) return;
  char tbuf[32], wbuf[32];
  if (usec >= 10000.0)
    snprintf(tbuf, sizeof tbuf, "%7.0f", usec);
  else if (usec >= 100.0)
    snprintf(tbuf, sizeof tbuf, "%7.1f", usec);
  else
    snprintf(tbuf, sizeof tbuf, "%7.2f", usec);
  if (b->o.check)
    snprintf(wbuf, sizeof wbuf, "%" PRIu64, wrong);
  else
    snprintf(wbuf, sizeof wbuf, "N/A");
  printf("  %7s  %6.2f  %6.2f  %5s", tbuf, algbw, busbw, wbuf);
}

static void sweep(bench *b, brg_dtype dt, int op) {
  size_t es = dt_size(dt);
  make_input(b->pat_in, dt, is_reduction(b->coll->kind) ? op : PLAIN_DATA, b->nranks, b->rank);
  if (is_reduction(b->coll->kind))
    make_reduced(b->pat_expect, dt, (brg_op)op, b->nranks);
  else if (b->coll->kind == BENCH_BROADCAST)
    make_input(b->pat_expect, dt, PLAIN_DATA, b->nranks, b->o.root);
  else
    make_input(b->pat_expect, dt, PLAIN_DATA, b->nranks, b->rank); /* unused */
  make_poison(b->pat_poison, b->pat_expect, es);

  size_t size = b->o.min_bytes;
  for (;;) {
    row_geom g = geometry(b, size, dt);
    if (b->rank == 0)
      printf("%12zu  %12zu  %8s  %6s  %6d", g.total * es, g.total, dtype_print[dt],
             op == PLAIN_DATA ? "none" : op_print[op], has_root(b->coll->kind) ? b->o.root : -1);
    time_placement(b, &g, dt, op, 0);
    time_placement(b, &g, dt, op, 1);
    if (b->rank == 0) printf("\n");
    size_t next = b->o.step_factor > 1 ? size * b->o.step_factor : size + b->o.step_bytes;
    if (next <= size || next > b->o.max_bytes) break;
    size = next;
  }
}

/* ----------------------------------------------------------- communicator */

/* Whether a launcher told us our rank. Without one we run alone. */
static int rank_env_present(void) {
  static const char *const vars[] = {"RANK",     "WORLD_SIZE", "OMPI_COMM_WORLD_RANK",
                                     "PMI_RANK", "PMIX_RANK",  "SLURM_PROCID"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
    if (getenv(vars[i]) != NULL) return 1;
  return 0;
}

static void comm_open(bench *b) {
  brg_status st;
  if (rank_env_present()) {
    if ((st = brg_comm_init_env(&b->comm)) != BRG_SUCCESS) {
      b->comm = NULL;
      die_status(b, "brg_comm_init_env", st);
    }
  } else {
    brg_unique_id id;
    if ((st = brg_get_unique_id(&id)) != BRG_SUCCESS) die_status(b, "brg_get_unique_id", st);
    if ((st = brg_comm_init(&b->comm, 1, &id, 0)) != BRG_SUCCESS) {
      b->comm = NULL;
      die_status(b, "brg_comm_init", st);
    }
  }
  if ((st = brg_comm_rank(b->comm, &b->rank)) != BRG_SUCCESS) die_status(b, "brg_comm_rank", st);
  if ((st = brg_comm_size(b->comm, &b->nranks)) != BRG_SUCCESS) die_status(b, "brg_comm_size", st);
}

/* "#  Rank  0 Pid  1234 on host" for every rank, gathered to all. */
static void print_ranks(bench *b) {
  typedef struct {
    int32_t pid;
    char host[60];
  } rank_info;
  rank_info self = {.pid = (int32_t)getpid()};
  if (gethostname(self.host, sizeof self.host - 1) != 0) snprintf(self.host, sizeof self.host, "?");
  rank_info *all = calloc((size_t)b->nranks, sizeof *all);
  if (all == NULL) {
    fprintf(stderr, "%s: out of memory\n", prog);
    exit(1);
  }
  brg_status st = brg_all_gather(&self, all, sizeof self, BRG_UINT8, b->comm, NULL);
  if (st != BRG_SUCCESS) die_status(b, "brg_all_gather (rank list)", st);
  if (b->rank == 0) {
    printf("#\n# Using ranks\n");
    for (int r = 0; r < b->nranks; r++) {
      all[r].host[sizeof all[r].host - 1] = '\0';
      printf("#  Rank %2d Pid %6d on %10s\n", r, (int)all[r].pid, all[r].host);
    }
    printf("#\n");
  }
  free(all);
}

static void print_header(const bench *b) {
  const bench_opts *o = &b->o;
  printf("# %s_perf: brigade %d.%d.%d  nRanks %d minBytes %zu maxBytes %zu ", b->coll->name,
         BRG_VERSION_MAJOR, BRG_VERSION_MINOR, BRG_VERSION_PATCH, b->nranks, o->min_bytes,
         o->max_bytes);
  if (o->step_factor > 1)
    printf("step: %zu(factor)", o->step_factor);
  else
    printf("step: %zu(bytes)", o->step_bytes);
  printf(" warmup iters: %d iters: %d validation: %d blocking: %d\n", o->warmup, o->iters, o->check,
         o->blocking);
}

static void print_columns(void) {
  printf("#%61s%s%23s%s\n", "", "out-of-place", "", "in-place");
  printf("#%11s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s\n", "size", "count",
         "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw",
         "#wrong");
  printf("#%11s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s\n", "(B)", "(elements)",
         "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
}

int bench_main(int argc, char **argv, const bench_coll *coll) {
  bench b = {.coll = coll};
  if (argc > 0 && argv[0] != NULL) {
    const char *slash = strrchr(argv[0], '/');
    prog = slash ? slash + 1 : argv[0];
  }
  setvbuf(stdout, NULL, _IOLBF, 0); /* rows appear as they finish, also through a pipe */
  if (parse_args(argc, argv, coll, &b.o) != 0) return 2;

  comm_open(&b);
  if (has_root(coll->kind) && b.o.root >= b.nranks) {
    if (b.rank == 0) fprintf(stderr, "%s: -r %d: only %d ranks\n", prog, b.o.root, b.nranks);
    brg_comm_destroy(b.comm);
    return 2;
  }

  if (b.rank == 0) print_header(&b);
  print_ranks(&b);

  b.reg_bytes = b.o.max_bytes < 64 ? 64 : b.o.max_bytes;
  b.sendreg = alloc_touched(b.reg_bytes);
  b.recvreg = alloc_touched(b.reg_bytes);
  b.pat_in = alloc_touched(PERIOD * 8);
  b.pat_expect = alloc_touched(PERIOD * 8);
  b.pat_poison = alloc_touched(PERIOD * 8);
  b.pat_tmp = alloc_touched(PERIOD * 8);

  if (b.rank == 0) print_columns();
  int nops = is_reduction(coll->kind) ? b.o.nops : 1;
  for (int d = 0; d < b.o.ndtypes; d++)
    for (int k = 0; k < nops; k++)
      sweep(&b, b.o.dtypes[d], is_reduction(coll->kind) ? (int)b.o.ops[k] : PLAIN_DATA);

  if (b.rank == 0) {
    printf("# Out of bounds values : %" PRIu64 " %s\n", b.wrong_total,
           b.wrong_total ? "FAILED" : "OK");
    printf("# Avg bus bandwidth    : %g \n#\n", b.bw_rows ? b.bw_sum / b.bw_rows : 0.0);
  }

  brg_status st = brg_comm_destroy(b.comm);
  b.comm = NULL;
  if (st != BRG_SUCCESS) die_status(&b, "brg_comm_destroy", st);
  free(b.sendreg);
  free(b.recvreg);
  free(b.pat_in);
  free(b.pat_expect);
  free(b.pat_poison);
  free(b.pat_tmp);
  return b.wrong_total ? 1 : 0;
}
