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
 *
 * With --peer, each placement of each row is then timed and checked the
 * same way through a peer library (peer.h), and the row gains the peer's
 * columns and the ratio of bus bandwidths. all_reduce_perf starts by
 * measuring the machine's copy rate, the memory roofline (see roofline()).
 *
 * With -G (--device) the buffers are GPU memory and every call goes on a
 * CUDA stream; inputs are built on the host as above and copied up, outputs
 * copied down for the check, and the timed loop is measured with CUDA
 * events. The GPU is reached through brigade's CUDA module
 * (libbrigade_cuda.so, opened with dlopen like the library does), so the
 * programs never link against CUDA.
 */
#include "common.h"
#include "peer.h"
#include "../kernels/cuda/brg_cuda.h"

#include <dlfcn.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
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

/* ----------------------------------------------------------------- peers */

/* The peers this build has (bench/meson.build defines BENCH_HAVE_*). */
static const bench_peer *const peers[] = {
#ifdef BENCH_HAVE_MPI
    &bench_peer_mpi,
#endif
#ifdef BENCH_HAVE_GLOO
    &bench_peer_gloo,
#endif
#ifdef BENCH_HAVE_NCCL
    &bench_peer_nccl,
#endif
    NULL,
};

static const char *peers_built(void) {
  static char buf[64];
  buf[0] = '\0';
  for (size_t i = 0; peers[i] != NULL; i++)
    snprintf(buf + strlen(buf), sizeof buf - strlen(buf), "%s%s", i ? ", " : "", peers[i]->name);
  return buf[0] ? buf : "none in this build";
}

static const bench_peer *peer_find(const char *name) {
  for (size_t i = 0; peers[i] != NULL; i++)
    if (strcmp(peers[i]->name, name) == 0) return peers[i];
  return NULL;
}

/* --------------------------------------------------------------- options */

typedef struct bench_opts {
  size_t min_bytes, max_bytes;
  size_t step_bytes; /* used when step_factor <= 1 */
  size_t step_factor;
  int iters, warmup, check, blocking, root;
  int roofline;         /* -1: default (on for all_reduce) */
  int device;           /* -G: GPU buffers on a CUDA stream */
  const char *peer;     /* --peer NAME, or NULL */
  const char *csv;      /* --csv PATH, or NULL */
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
          "  -p, --peer NAME          also time NAME on the same buffers and print the\n"
          "                           ratio brigade busbw / peer busbw: %s\n"
          "  -R, --roofline 0|1       measure the two-thread copy rate first and print\n"
          "                           the memory roofline (default 1 for all_reduce)\n"
          "  -C, --csv PATH           rank 0 also writes every result to PATH as CSV\n"
          "  -G, --device             GPU buffers, calls on a CUDA stream, CUDA-event\n"
          "                           timing; the roofline is then the GPU's\n"
          "                           device-to-device copy rate\n"
          "  -h, --help               this text\n"
          "\n"
          "SIZE is the total payload in bytes: per rank for all_reduce, broadcast and\n"
          "reduce, the whole gathered/scattered buffer for all_gather and reduce_scatter.\n"
          "Times are averages over -n calls, the slowest rank's; busbw is algbw times\n"
          "2(N-1)/N for all_reduce, (N-1)/N for all_gather and reduce_scatter, 1 for\n"
          "broadcast and reduce. Select transports with BRIGADE_TRANSPORTS=shm|tcp.\n"
          "--peer mpi needs the program started by mpirun (mpirun -np N %s ...);\n"
          "--peer gloo runs under brigade-run; --peer nccl too, with -G (one GPU per rank:\n"
          "NCCL refuses two ranks on one GPU).\n",
          prog, coll->name, peers_built(), prog);
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
      {"peer", required_argument, NULL, 'p'},
      {"roofline", required_argument, NULL, 'R'},
      {"csv", required_argument, NULL, 'C'},
      {"device", no_argument, NULL, 'G'},
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
      .roofline = -1,
      .ndtypes = 1,
      .dtypes = {BRG_FLOAT32},
      .nops = 1,
      .ops = {BRG_SUM},
  };
  int c;
  while ((c = getopt_long(argc, argv, "b:e:i:f:n:w:c:o:d:r:z:p:R:C:Gh", longopts, NULL)) != -1) {
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
    case 'R':
      if (parse_int(optarg, 0, &v) != 0 || v > 1) {
        fprintf(stderr, "%s: -%c: need 0 or 1, got '%s'\n", prog, c, optarg);
        return -1;
      }
      if (c == 'c')
        o->check = v;
      else if (c == 'z')
        o->blocking = v;
      else
        o->roofline = v;
      break;
    case 'p':
      o->peer = optarg;
      break;
    case 'C':
      o->csv = optarg;
      break;
    case 'G':
      o->device = 1;
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
  const bench_peer *peer;
  uint64_t peer_wrong_total;
  const char *peer_skips[8]; /* distinct reasons for n/a peer columns */
  int npeer_skips;
  double copy_rate;     /* bytes read + written per second, 0 when not measured */
  double roof_busbw;    /* GB/s: the allreduce busbw the copy rate allows */
  double last_busbw[2]; /* largest size so far: brigade out of place, in place */
  double last_peer[2];  /* the peer's, 0 when n/a */
  size_t last_bytes;
  FILE *csv;
  /* -G */
  const brg__cuda_api *gpu;
  char *dsend, *drecv;  /* device mirrors of sendreg and recvreg */
  void *stream, *ev_start, *ev_end;
  int gpu_share;        /* ranks on this rank's GPU */
  char gpu_desc[256];
} bench;

static bench *current; /* for bench_device_mode() */

int bench_device_mode(void) {
  return current != NULL && current->gpu != NULL;
}

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

/* The device mirror of a pointer into sendreg or recvreg (-G). */
static char *on_device(const bench *b, char *host) {
  if (b->gpu == NULL || host == NULL) return host;
  if (host >= b->sendreg && host < b->sendreg + b->reg_bytes) return b->dsend + (host - b->sendreg);
  return b->drecv + (host - b->recvreg);
}

/* Bytes of each region a row uses. */
static size_t row_extent(const row_geom *g, size_t es) {
  size_t e = g->total > g->send_elems ? g->total : g->send_elems;
  if (g->recv_elems > e) e = g->recv_elems;
  return e * es;
}

static void gpu_check(bench *b, const char *what, int e) {
  if (e == 0) return;
  fprintf(stderr, "%s: rank %d: %s failed: %s\n", prog, b->rank, what, b->gpu->error_string(e));
  if (b->comm) brg_comm_abort(b->comm);
  exit(1);
}

/* -G: host regions -> device (up) or back (down, after the stream is done). */
static void gpu_move(bench *b, const row_geom *g, size_t es, int up) {
  if (b->gpu == NULL) return;
  size_t n = row_extent(g, es);
  if (!up) gpu_check(b, "cudaStreamSynchronize", b->gpu->stream_sync(b->stream));
  gpu_check(b, "cudaMemcpy", up ? b->gpu->mem_copy(b->dsend, b->sendreg, n)
                                : b->gpu->mem_copy(b->sendreg, b->dsend, n));
  gpu_check(b, "cudaMemcpy", up ? b->gpu->mem_copy(b->drecv, b->recvreg, n)
                                : b->gpu->mem_copy(b->recvreg, b->drecv, n));
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
  if (!(b->coll->kind == BENCH_BROADCAST && in_place && b->rank != b->o.root))
    pattern_fill(send, b->pat_in, es, 0, g->send_elems);
  gpu_move(b, g, es, 1);
}

/* Wrong elements on this rank after one call on init_data's buffers. */
static uint64_t check_data(bench *b, const row_geom *g, brg_dtype dt, int in_place) {
  size_t es = dt_size(dt);
  char *send, *recv;
  uint64_t wrong = 0;
  call_buffers(b, g, es, in_place, &send, &recv);
  gpu_move(b, g, es, 0);
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

/* One call: brigade's when alg < 0, else the peer's algorithm `alg`. */
static void run_call(bench *b, const row_geom *g, brg_dtype dt, brg_op op, int in_place, int alg) {
  char *send, *recv;
  call_buffers(b, g, dt_size(dt), in_place, &send, &recv);
  bench_call c = {.send = on_device(b, send),
                  .recv = on_device(b, recv),
                  .count = g->count,
                  .dtype = dt,
                  .op = op,
                  .root = b->o.root,
                  .comm = b->comm,
                  .stream = b->stream};
  if (alg >= 0) {
    bench_peer_call pc = {.c = c, .kind = b->coll->kind, .in_place = in_place, .alg = alg};
    if (b->peer->run(&pc) != 0) {
      fprintf(stderr, "%s: rank %d: peer %s (%s) failed\n", prog, b->rank, b->peer->name,
              b->peer->algs[alg]);
      fflush(stdout);
      brg_comm_abort(b->comm);
      exit(1);
    }
    return;
  }
  brg_status st = b->coll->run(&c);
  if (st != BRG_SUCCESS) die_status(b, b->coll->call_name, st);
}

typedef struct timing {
  double usec; /* per call, the slowest rank's */
  uint64_t wrong;
} timing;

/* Times one placement of one row for brigade (alg < 0) or a peer algorithm,
 * then checks one more call's data. */
static timing time_calls(bench *b, const row_geom *g, brg_dtype dt, brg_op op, int in_place,
                         int alg) {
  brg_status st;
  timing t = {0, 0};

  init_data(b, g, dt, in_place);
  if (alg >= 0) {
    char *send, *recv;
    call_buffers(b, g, dt_size(dt), in_place, &send, &recv);
    bench_peer_call pc = {
        .c = {.send = on_device(b, send), .recv = on_device(b, recv), .count = g->count,
              .dtype = dt, .op = op, .root = b->o.root, .comm = b->comm, .stream = b->stream},
        .kind = b->coll->kind, .in_place = in_place, .alg = alg};
    if (b->peer->prepare(&pc) != 0) {
      fprintf(stderr, "%s: rank %d: peer %s: set-up failed\n", prog, b->rank, b->peer->name);
      brg_comm_abort(b->comm);
      exit(1);
    }
  }
  for (int i = 0; i < b->o.warmup; i++) run_call(b, g, dt, op, in_place, alg);
  if (b->gpu) gpu_check(b, "cudaStreamSynchronize", b->gpu->stream_sync(b->stream));
  if ((st = brg_barrier(b->comm)) != BRG_SUCCESS) die_status(b, "brg_barrier", st);
  double t0 = now_s();
  if (b->gpu) gpu_check(b, "cudaEventRecord", b->gpu->event_record(b->ev_start, b->stream));
  for (int i = 0; i < b->o.iters; i++) run_call(b, g, dt, op, in_place, alg);
  if (b->gpu) {
    float ms = 0;
    gpu_check(b, "cudaEventRecord", b->gpu->event_record(b->ev_end, b->stream));
    gpu_check(b, "cudaStreamSynchronize", b->gpu->stream_sync(b->stream));
    gpu_check(b, "cudaEventElapsedTime", b->gpu->event_elapsed_ms(&ms, b->ev_start, b->ev_end));
    t.usec = (double)ms * 1e3 / b->o.iters;
  } else {
    t.usec = (now_s() - t0) * 1e6 / b->o.iters;
  }
  if ((st = brg_allreduce(&t.usec, &t.usec, 1, BRG_FLOAT64, BRG_MAX, b->comm, NULL)) !=
      BRG_SUCCESS)
    die_status(b, "brg_allreduce (time)", st);

  if (b->o.check) {
    init_data(b, g, dt, in_place);
    run_call(b, g, dt, op, in_place, alg);
    t.wrong = check_data(b, g, dt, in_place);
    if ((st = brg_allreduce(&t.wrong, &t.wrong, 1, BRG_UINT64, BRG_SUM, b->comm, NULL)) !=
        BRG_SUCCESS)
      die_status(b, "brg_allreduce (#wrong)", st);
  }
  return t;
}

static void format_time(char *buf, size_t len, double usec) {
  if (usec >= 10000.0)
    snprintf(buf, len, "%7.0f", usec);
  else if (usec >= 100.0)
    snprintf(buf, len, "%7.1f", usec);
  else
    snprintf(buf, len, "%7.2f", usec);
}

static void format_wrong(const bench *b, char *buf, size_t len, uint64_t wrong) {
  if (b->o.check)
    snprintf(buf, len, "%" PRIu64, wrong);
  else
    snprintf(buf, len, "N/A");
}

static void csv_row(bench *b, const char *library, const char *alg, int in_place, size_t bytes,
                    size_t count, brg_dtype dt, int op, const timing *t, double algbw,
                    double busbw) {
  if (b->csv == NULL || b->rank != 0) return;
  char wbuf[32];
  format_wrong(b, wbuf, sizeof wbuf, t->wrong);
  fprintf(b->csv, "%s,%s,%s,%d,%s,%zu,%zu,%s,%s,%.3f,%.4f,%.4f,%s\n", b->coll->name, library, alg,
          b->nranks, in_place ? "in-place" : "out-of-place", bytes, count, dtype_print[dt],
          op == PLAIN_DATA ? "none" : op_print[op], t->usec, algbw, busbw, wbuf);
}

static void note_peer_skip(bench *b, const char *why) {
  for (int i = 0; i < b->npeer_skips; i++)
    if (strcmp(b->peer_skips[i], why) == 0) return;
  if (b->npeer_skips < (int)(sizeof b->peer_skips / sizeof b->peer_skips[0]))
    b->peer_skips[b->npeer_skips++] = why;
}

/* Times one placement of one row, brigade and then the peer; prints its
 * columns on rank 0. */
static void time_placement(bench *b, const row_geom *g, brg_dtype dt, int op, int in_place) {
  brg_op bop = op == PLAIN_DATA ? BRG_SUM : (brg_op)op;
  size_t es = dt_size(dt);
  double bytes = (double)(g->total * es);
  double factor = bus_factor(b->coll->kind, b->nranks);

  timing t = time_calls(b, g, dt, bop, in_place, -1);
  b->wrong_total += t.wrong;
  double algbw = t.usec > 0 ? bytes / t.usec / 1e3 : 0; /* GB/s */
  double busbw = algbw * factor;
  b->bw_sum += busbw;
  b->bw_rows++;
  b->last_busbw[in_place] = busbw;
  csv_row(b, "brigade", "ring", in_place, g->total * es, g->count, dt, op, &t, algbw, busbw);
  char tbuf[32], wbuf[32];
  format_time(tbuf, sizeof tbuf, t.usec);
  format_wrong(b, wbuf, sizeof wbuf, t.wrong);
  if (b->rank == 0) {
    printf("  %7s  %6.2f  %6.2f  %5s", tbuf, algbw, busbw, wbuf);
    if (b->roof_busbw > 0) printf("  %5.1f", 100.0 * busbw / b->roof_busbw);
  }
  if (b->peer == NULL) return;

  b->last_peer[in_place] = 0;
  const char *why = b->peer->unsupported(b->coll->kind, dt, bop, in_place);
  if (why != NULL) {
    note_peer_skip(b, why);
    if (b->rank == 0) {
      printf("  %7s  %6s  %5s", "n/a", "n/a", "n/a");
      if (b->peer->nalgs > 1) printf("  %7s", "n/a");
      printf("  %6s", "n/a");
    }
    return;
  }
  timing best = {0, 0};
  int best_alg = 0;
  uint64_t peer_wrong = 0;
  for (int a = 0; a < b->peer->nalgs; a++) {
    timing pt = time_calls(b, g, dt, bop, in_place, a);
    peer_wrong += pt.wrong;
    double pbus = pt.usec > 0 ? bytes / pt.usec / 1e3 * factor : 0;
    csv_row(b, b->peer->name, b->peer->algs[a], in_place, g->total * es, g->count, dt, op, &pt,
            pbus / factor, pbus);
    if (a == 0 || pt.usec < best.usec) {
      best = pt;
      best_alg = a;
    }
  }
  b->peer_wrong_total += peer_wrong;
  double pbusbw = best.usec > 0 ? bytes / best.usec / 1e3 * factor : 0;
  b->last_peer[in_place] = pbusbw;
  if (b->rank != 0) return;
  format_time(tbuf, sizeof tbuf, best.usec);
  format_wrong(b, wbuf, sizeof wbuf, peer_wrong);
  printf("  %7s  %6.2f  %5s", tbuf, pbusbw, wbuf);
  if (b->peer->nalgs > 1) printf("  %7s", b->peer->algs[best_alg]);
  /* the ratio of busbw is the ratio of times; times stay meaningful at 0 bytes */
  printf("  %6.2f", t.usec > 0 ? best.usec / t.usec : 0.0);
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
    b->last_bytes = g.total * es;
    if (b->rank == 0) printf("\n");
    size_t next = b->o.step_factor > 1 ? size * b->o.step_factor : size + b->o.step_bytes;
    if (next <= size || next > b->o.max_bytes) break;
    size = next;
  }
}

/* --------------------------------------------------------------- roofline */

/*
 * The memory roofline: a STREAM-style copy by two threads, each copying its
 * half of a 512 MiB source into its half of a 512 MiB destination (1 GiB in
 * all, about 4x the 260 MiB L3 of the machines we run on, so the copy goes to
 * DRAM). B counts bytes read plus bytes written per second, the best of a
 * few passes. An allreduce of S bytes on N ranks of one host has to read the
 * N inputs and write the N outputs, 2NS bytes, so algbw <= B / 2N and
 * busbw = algbw 2(N-1)/N <= B (N-1) / N^2.
 */
#define COPY_BYTES ((size_t)512 << 20) /* per buffer, both threads together */
#define COPY_THREADS 2
#define COPY_PASSES 5

typedef struct copy_arg {
  char *dst;
  const char *src;
  size_t bytes;
  pthread_barrier_t *bar;
  double *pass_s; /* written by thread 0 */
  int id;
} copy_arg;

static void *copy_thread(void *p) {
  copy_arg *a = p;
  memset(a->dst, 1, a->bytes); /* each thread faults in its own pages */
  memset((char *)a->src, 2, a->bytes);
  memcpy(a->dst, a->src, a->bytes); /* warm */
  for (int i = 0; i < COPY_PASSES; i++) {
    pthread_barrier_wait(a->bar);
    double t0 = now_s();
    memcpy(a->dst, a->src, a->bytes);
    pthread_barrier_wait(a->bar);
    if (a->id == 0) a->pass_s[i] = now_s() - t0;
  }
  return NULL;
}

/* Bytes read + written per second, or 0 when it could not be measured. */
static double measure_copy_rate(void) {
  char *src = aligned_alloc(ALIGN, COPY_BYTES), *dst = aligned_alloc(ALIGN, COPY_BYTES);
  double pass_s[COPY_PASSES] = {0}, best = 0;
  pthread_barrier_t bar;
  pthread_t th[COPY_THREADS];
  copy_arg args[COPY_THREADS];
  int started = 0;
  if (src == NULL || dst == NULL) goto out;
  pthread_barrier_init(&bar, NULL, COPY_THREADS);
  for (int i = 0; i < COPY_THREADS; i++) {
    size_t part = COPY_BYTES / COPY_THREADS;
    args[i] = (copy_arg){.dst = dst + i * part, .src = src + i * part, .bytes = part,
                         .bar = &bar, .pass_s = pass_s, .id = i};
    if (pthread_create(&th[i], NULL, copy_thread, &args[i]) != 0) break;
    started++;
  }
  if (started < COPY_THREADS) {
    /* a started thread would wait on the barrier for ever */
    fprintf(stderr, "%s: cannot start the copy threads (run with -R 0)\n", prog);
    exit(1);
  }
  for (int i = 0; i < COPY_THREADS; i++) pthread_join(th[i], NULL);
  pthread_barrier_destroy(&bar);
  for (int i = 0; i < COPY_PASSES; i++)
    if (pass_s[i] > 0 && (best == 0 || pass_s[i] < best)) best = pass_s[i];
out:
  free(src);
  free(dst);
  return best > 0 ? 2.0 * (double)COPY_BYTES / best : 0;
}

/*
 * The GPU roofline (-G): cudaMemcpy device to device of 256 MiB, bytes read
 * plus written per second, the best of a few. The ring in step mode moves,
 * per rank and allreduce of S bytes, (6N-4)/N x S bytes through HBM: the
 * first step reads and writes a chunk (2), N-2 reduce steps read two and
 * write one (3 each), the middle step reads two and writes two (4), N-2
 * copy steps read one and write two (3 each), the last reads and writes one
 * (2), in chunks of S/N. With G ranks on one GPU its HBM carries G times
 * that, so busbw <= copy rate / (G (6N-4)/N) x 2(N-1)/N.
 */
#define GPU_COPY_BYTES ((size_t)256 << 20)

static double measure_gpu_copy_rate(bench *b) {
  void *src = NULL, *dst = NULL;
  double best = 0;
  if (b->gpu->mem_alloc(&src, GPU_COPY_BYTES) || b->gpu->mem_alloc(&dst, GPU_COPY_BYTES)) {
    fprintf(stderr, "%s: no room for the 2 x 256 MiB copy of the roofline\n", prog);
  } else {
    b->gpu->mem_set(src, 1, GPU_COPY_BYTES);
    b->gpu->mem_copy(dst, src, GPU_COPY_BYTES);
    /* Timed by events on the legacy stream, where cudaMemcpy runs. */
    for (int i = 0; i < 10; i++) {
      float ms = 0;
      gpu_check(b, "cudaEventRecord", b->gpu->event_record(b->ev_start, NULL));
      gpu_check(b, "cudaMemcpy", b->gpu->mem_copy(dst, src, GPU_COPY_BYTES));
      gpu_check(b, "cudaEventRecord", b->gpu->event_record(b->ev_end, NULL));
      gpu_check(b, "cudaEventSynchronize", b->gpu->event_sync(b->ev_end));
      gpu_check(b, "cudaEventElapsedTime", b->gpu->event_elapsed_ms(&ms, b->ev_start, b->ev_end));
      double dt = (double)ms / 1e3;
      if (dt > 0 && (best == 0 || dt < best)) best = dt;
    }
  }
  if (src) b->gpu->mem_free(src);
  if (dst) b->gpu->mem_free(dst);
  return best > 0 ? 2.0 * (double)GPU_COPY_BYTES / best : 0;
}

static void roofline(bench *b) {
  brg_status st;
  if ((st = brg_barrier(b->comm)) != BRG_SUCCESS) die_status(b, "brg_barrier", st);
  double rate = b->rank != 0 ? 0 : b->gpu ? measure_gpu_copy_rate(b) : measure_copy_rate();
  if ((st = brg_broadcast(&rate, &rate, 1, BRG_FLOAT64, 0, b->comm, NULL)) != BRG_SUCCESS)
    die_status(b, "brg_broadcast (copy rate)", st);
  b->copy_rate = rate;
  double n = b->nranks;
  if (b->gpu) {
    if (b->nranks > 1 && b->coll->kind == BENCH_ALLREDUCE)
      b->roof_busbw = rate / 1e9 / (b->gpu_share * (6 * n - 4) / n) * 2 * (n - 1) / n;
    if (b->rank != 0) return;
    printf("# GPU roofline: cudaMemcpy device to device %.1f GB/s (read + write, 256 MiB)\n",
           rate / 1e9);
    if (b->roof_busbw > 0)
      printf("#   the ring moves (6N-4)/N x size through HBM per rank, %d rank(s) per GPU: "
             "%%roof = HBM bytes per second / copy rate (busbw <= %.2f GB/s)\n",
             b->gpu_share, b->roof_busbw);
    if (b->csv) fprintf(b->csv, "#gpu_copy_rate_GBps,%.3f\n#roof_busbw_GBps,%.4f\n", rate / 1e9,
                        b->roof_busbw);
    return;
  }
  if (b->nranks > 1) b->roof_busbw = rate / 1e9 * (n - 1) / (n * n);
  if (b->rank != 0) return;
  printf("# Memory roofline: two-thread copy %.1f GB/s (read + write, 2 x 512 MiB buffers)\n",
         rate / 1e9);
  if (b->nranks > 1)
    printf("#   allreduce reads N inputs and writes N outputs: busbw <= B (N-1)/N^2 = %.2f GB/s "
           "for N = %d (%%roof column)\n",
           b->roof_busbw, b->nranks);
  if (b->csv) fprintf(b->csv, "#copy_rate_GBps,%.3f\n#roof_busbw_GBps,%.4f\n", rate / 1e9,
                      b->roof_busbw);
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

static void comm_open(bench *b, int *argc, char ***argv) {
  brg_status st;
  if (b->peer != NULL && b->peer->launch != NULL) {
    if (b->peer->launch(argc, argv, &b->comm) != 0) exit(1);
  } else if (rank_env_present()) {
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
  const char *tr = getenv("BRIGADE_TRANSPORTS");
  printf("# transports: %s\n", tr && *tr ? tr : "default (BRIGADE_TRANSPORTS unset)");
  if (b->peer != NULL) {
    printf("# peer: %s; ratio = brigade busbw / peer busbw (> 1: brigade is faster)", b->peer->describe());
    if (b->peer->nalgs > 1) {
      printf("; peer algorithms:");
      for (int a = 0; a < b->peer->nalgs; a++) printf(" %s", b->peer->algs[a]);
      printf(" (the fastest is shown)");
    }
    printf("\n");
  }
}

/* One placement's column group: brigade's, then the peer's. */
static void print_group(const bench *b, int line) {
  static const char *const head[2][9] = {
      {"time", "algbw", "busbw", "#wrong", "%roof", "time", "busbw", "#wrong", "alg"},
      {"(us)", "(GB/s)", "(GB/s)", "", "", "(us)", "(GB/s)", "", ""},
  };
  const char *const *h = head[line];
  printf("  %7s  %6s  %6s %6s", h[0], h[1], h[2], h[3]);
  if (b->roof_busbw > 0) printf("  %5s", h[4]);
  if (b->peer == NULL) return;
  printf("  %7s  %6s %6s", h[5], h[6], h[7]);
  if (b->peer->nalgs > 1) printf("  %7s", h[8]);
  printf("  %6s", line == 0 ? "ratio" : "");
}

static void print_columns(const bench *b) {
  int group = 2 + 2 + 8 + 8 + 7 + (b->roof_busbw > 0 ? 7 : 0);
  if (b->peer != NULL) group += 9 + 8 + 7 + 8 + (b->peer->nalgs > 1 ? 9 : 0);
  char left[64], right[64];
  snprintf(left, sizeof left, "out-of-place%s%s", b->peer ? " / " : "", b->peer ? b->peer->name : "");
  snprintf(right, sizeof right, "in-place%s%s", b->peer ? " / " : "", b->peer ? b->peer->name : "");
  printf("#%51s%-*s%s\n", "", group, left, right);
  printf("#%11s  %12s  %8s  %6s  %6s", "size", "count", "type", "redop", "root");
  print_group(b, 0);
  print_group(b, 0);
  printf("\n#%11s  %12s  %8s  %6s  %6s", "(B)", "(elements)", "", "", "");
  print_group(b, 1);
  print_group(b, 1);
  printf("\n");
}

static void print_footer(const bench *b) {
  printf("# Out of bounds values : %" PRIu64 " %s\n", b->wrong_total,
         b->wrong_total ? "FAILED" : "OK");
  printf("# Avg bus bandwidth    : %g \n", b->bw_rows ? b->bw_sum / b->bw_rows : 0.0);
  if (b->roof_busbw > 0 && b->bw_rows > 0) {
    printf("# Roofline at %zu B: brigade reaches %.0f%% (out of place) and %.0f%% (in place) of "
           "%.2f GB/s",
           b->last_bytes, 100.0 * b->last_busbw[0] / b->roof_busbw,
           100.0 * b->last_busbw[1] / b->roof_busbw, b->roof_busbw);
    if (b->peer != NULL)
      for (int p = 0; p < 2; p++)
        if (b->last_peer[p] > 0)
          printf("; %s %.0f%% (%s)", b->peer->name, 100.0 * b->last_peer[p] / b->roof_busbw,
                 p ? "in place" : "out of place");
    printf("\n");
  }
  if (b->peer != NULL) {
    printf("# Peer %s out of bounds values : %" PRIu64 " %s\n", b->peer->name, b->peer_wrong_total,
           b->peer_wrong_total ? "FAILED" : "OK");
    for (int i = 0; i < b->npeer_skips; i++)
      printf("# Peer %s n/a: %s\n", b->peer->name, b->peer_skips[i]);
  }
  printf("#\n");
}

/* -G: brigade's CUDA module, the file the library itself opens: named by
 * BRIGADE_CUDA_MODULE, else beside libbrigade.so, else in its build tree. */
static const brg__cuda_api *gpu_module(char *why, size_t cap) {
  char path[4096] = "";
  const char *env = getenv("BRIGADE_CUDA_MODULE");
  Dl_info info;
  if (env && *env) {
    snprintf(path, sizeof path, "%s", env);
  } else if (dladdr((void *)&brg_allreduce, &info) && info.dli_fname &&
             strrchr(info.dli_fname, '/')) {
    char dir[3800];
    snprintf(dir, sizeof dir, "%s", info.dli_fname);
    *strrchr(dir, '/') = 0;
    snprintf(path, sizeof path, "%s/libbrigade_cuda.so", dir);
    if (access(path, F_OK) != 0) snprintf(path, sizeof path, "%s/kernels/cuda/libbrigade_cuda.so", dir);
    if (access(path, F_OK) != 0) snprintf(path, sizeof path, "libbrigade_cuda.so");
  } else {
    snprintf(path, sizeof path, "libbrigade_cuda.so");
  }
  return brg__cuda_open(path, why, cap);
}

static void gpu_open(bench *b) {
  char why[512] = "";
  b->gpu = gpu_module(why, sizeof why);
  if (b->gpu == NULL) {
    fprintf(stderr, "%s: rank %d: -G: no usable GPU: %s\n", prog, b->rank, why);
    brg_comm_abort(b->comm);
    exit(2);
  }
  gpu_check(b, "cudaMalloc", b->gpu->mem_alloc((void **)&b->dsend, b->reg_bytes));
  gpu_check(b, "cudaMalloc", b->gpu->mem_alloc((void **)&b->drecv, b->reg_bytes));
  gpu_check(b, "cudaStreamCreate", b->gpu->stream_create(&b->stream));
  gpu_check(b, "cudaEventCreate", b->gpu->event_create_timing(&b->ev_start));
  gpu_check(b, "cudaEventCreate", b->gpu->event_create_timing(&b->ev_end));
  /* Which ranks share this GPU: the roofline counts their HBM traffic. */
  unsigned char *uuids = calloc((size_t)b->nranks, 16), mine[16] = {0};
  if (!uuids) exit(1);
  gpu_check(b, "cudaGetDeviceProperties", b->gpu->device_uuid(mine));
  brg_status st = brg_all_gather(mine, uuids, 16, BRG_UINT8, b->comm, NULL);
  if (st != BRG_SUCCESS) die_status(b, "brg_all_gather (GPU ids)", st);
  b->gpu_share = 0;
  for (int r = 0; r < b->nranks; r++) b->gpu_share += memcmp(uuids + 16 * r, mine, 16) == 0;
  free(uuids);
  b->gpu->describe(b->gpu_desc, sizeof b->gpu_desc);
}

int bench_main(int argc, char **argv, const bench_coll *coll) {
  bench b = {.coll = coll};
  brg_status st;
  current = &b;
  if (argc > 0 && argv[0] != NULL) {
    const char *slash = strrchr(argv[0], '/');
    prog = slash ? slash + 1 : argv[0];
  }
  setvbuf(stdout, NULL, _IOLBF, 0); /* rows appear as they finish, also through a pipe */
  if (parse_args(argc, argv, coll, &b.o) != 0) return 2;
  if (b.o.peer != NULL && (b.peer = peer_find(b.o.peer)) == NULL) {
    fprintf(stderr, "%s: --peer %s: not in this build (built: %s)\n", prog, b.o.peer, peers_built());
    return 2;
  }
  if (b.o.roofline < 0) b.o.roofline = coll->kind == BENCH_ALLREDUCE;

  comm_open(&b, &argc, &argv);
  if (has_root(coll->kind) && b.o.root >= b.nranks) {
    if (b.rank == 0) fprintf(stderr, "%s: -r %d: only %d ranks\n", prog, b.o.root, b.nranks);
    brg_comm_destroy(b.comm);
    if (b.peer && b.peer->finalize) b.peer->finalize();
    return 2;
  }
  if (b.o.device && b.peer != NULL && strcmp(b.peer->name, "nccl") != 0) {
    if (b.rank == 0)
      fprintf(stderr, "%s: --peer %s takes host buffers; with -G only --peer nccl\n", prog,
              b.peer->name);
    brg_comm_destroy(b.comm);
    if (b.peer->finalize) b.peer->finalize();
    return 2;
  }
  b.reg_bytes = b.o.max_bytes < 64 ? 64 : b.o.max_bytes;
  if (b.o.device) gpu_open(&b);
  if (b.peer != NULL && b.peer->open(b.comm, b.rank, b.nranks) != 0) {
    fprintf(stderr, "%s: rank %d: cannot start peer %s (the reason is above; it runs under %s)\n",
            prog, b.rank, b.peer->name, b.peer->launcher);
    brg_comm_abort(b.comm);
    return 1;
  }
  if (b.rank == 0 && b.o.csv != NULL) {
    b.csv = fopen(b.o.csv, "w");
    if (b.csv == NULL) {
      fprintf(stderr, "%s: cannot write %s: %s\n", prog, b.o.csv, strerror(errno));
      brg_comm_abort(b.comm);
      return 1;
    }
    fprintf(b.csv, "collective,library,alg,nranks,placement,bytes,count,dtype,op,time_us,"
                   "algbw_GBps,busbw_GBps,wrong\n");
  }

  if (b.rank == 0) print_header(&b);
  print_ranks(&b);

  if (b.gpu && b.rank == 0)
    printf("# GPU buffers (-G): %s; %d of %d ranks on this GPU; CUDA-event timing\n",
           b.gpu_desc, b.gpu_share, b.nranks);
  b.sendreg = alloc_touched(b.reg_bytes);
  b.recvreg = alloc_touched(b.reg_bytes);
  b.pat_in = alloc_touched(PERIOD * 8);
  b.pat_expect = alloc_touched(PERIOD * 8);
  b.pat_poison = alloc_touched(PERIOD * 8);
  b.pat_tmp = alloc_touched(PERIOD * 8);
  if (b.o.roofline) roofline(&b);

  if (b.rank == 0) print_columns(&b);
  int nops = is_reduction(coll->kind) ? b.o.nops : 1;
  for (int d = 0; d < b.o.ndtypes; d++)
    for (int k = 0; k < nops; k++)
      sweep(&b, b.o.dtypes[d], is_reduction(coll->kind) ? (int)b.o.ops[k] : PLAIN_DATA);

  if (b.rank == 0) print_footer(&b);
  if (b.csv != NULL) fclose(b.csv);

  /* No rank may tear down while a neighbour is still finishing the last
   * collective: line up on brigade, then (where there is one) on the peer,
   * which does not go through brigade. */
  if ((st = brg_barrier(b.comm)) != BRG_SUCCESS) die_status(&b, "brg_barrier", st);
  if (b.peer != NULL && b.peer->close != NULL) b.peer->close();
  st = brg_comm_destroy(b.comm);
  b.comm = NULL;
  if (st != BRG_SUCCESS) die_status(&b, "brg_comm_destroy", st);
  if (b.peer != NULL && b.peer->finalize != NULL) b.peer->finalize();
  if (b.gpu) {
    b.gpu->event_destroy(b.ev_start);
    b.gpu->event_destroy(b.ev_end);
    b.gpu->stream_destroy(b.stream);
    b.gpu->mem_free(b.dsend);
    b.gpu->mem_free(b.drecv);
  }
  free(b.sendreg);
  free(b.recvreg);
  free(b.pat_in);
  free(b.pat_expect);
  free(b.pat_poison);
  free(b.pat_tmp);
  return b.wrong_total ? 1 : 0;
}
