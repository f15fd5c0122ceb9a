/* The command line of the *_perf programs: options, defaults and the -h text. */
#include "bench_internal.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
const char *const bench_dtype_print[BRG_NUM_DTYPES] = {
    "int8", "uint8", "int32", "uint32", "int64", "uint64", "half", "bfloat16", "float", "double",
};
const char *const bench_op_print[BRG_NUM_OPS] = {"sum", "prod", "min", "max",
                                                 "avg", "band", "bor", "bxor"};

/* --------------------------------------------------------------- options */

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
  default: break;
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
          "  -o, --op OP              sum prod min max avg, band bor bxor (integer types), or all\n"
          "                           (the first five; default sum)\n"
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
          "  -g, --gpu N              with -G: the GPU this rank uses (default: the\n"
          "                           rank's place on its host, LOCAL_RANK when the\n"
          "                           launcher sets it, modulo the GPUs it sees)\n"
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
          bench_prog, coll->name, bench_peers_built(), bench_prog);
}

int bench_parse_args(int argc, char **argv, const bench_coll *coll, bench_opts *o) {
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
      {"gpu", required_argument, NULL, 'g'},
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
      .gpu = -1,
      .ndtypes = 1,
      .dtypes = {BRG_FLOAT32},
      .nops = 1,
      .ops = {BRG_SUM},
  };
  int c;
  while ((c = getopt_long(argc, argv, "b:e:i:f:n:w:c:o:d:r:z:p:R:C:Gg:h", longopts, NULL)) != -1) {
    size_t sz;
    int v;
    switch (c) {
    case 'b':
    case 'e':
    case 'i':
      if (parse_size(optarg, &sz) != 0) {
        fprintf(stderr, "%s: -%c: not a size: '%s'\n", bench_prog, c, optarg);
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
        fprintf(stderr, "%s: -f: not a step factor: '%s'\n", bench_prog, optarg);
        return -1;
      }
      o->step_factor = sz;
      break;
    case 'n':
      if (parse_int(optarg, 1, &o->iters) != 0) {
        fprintf(stderr, "%s: -n: need a count >= 1, got '%s'\n", bench_prog, optarg);
        return -1;
      }
      break;
    case 'w':
      if (parse_int(optarg, 0, &o->warmup) != 0) {
        fprintf(stderr, "%s: -w: need a count >= 0, got '%s'\n", bench_prog, optarg);
        return -1;
      }
      break;
    case 'c':
    case 'z':
    case 'R':
      if (parse_int(optarg, 0, &v) != 0 || v > 1) {
        fprintf(stderr, "%s: -%c: need 0 or 1, got '%s'\n", bench_prog, c, optarg);
        return -1;
      }
      if (c == 'c')
        o->check = v;
      else if (c == 'z')
        o->blocking = v;
      else
        o->roofline = v;
      break;
    case 'p': o->peer = optarg; break;
    case 'C': o->csv = optarg; break;
    case 'G': o->device = 1; break;
    case 'g':
      if (parse_int(optarg, 0, &o->gpu) != 0) {
        fprintf(stderr, "%s: -g: need a GPU index >= 0, got '%s'\n", bench_prog, optarg);
        return -1;
      }
      break;
    case 'r':
      if (parse_int(optarg, 0, &o->root) != 0) {
        fprintf(stderr, "%s: -r: need a rank >= 0, got '%s'\n", bench_prog, optarg);
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
        fprintf(stderr, "%s: -d: unknown datatype '%s' (see -h)\n", bench_prog, optarg);
        return -1;
      }
      break;
    case 'o':
      if (strcmp(optarg, "all") == 0) { /* the ops every dtype takes (not the bitwise ones) */
        o->nops = BRG_AVG + 1;
        for (int i = 0; i <= BRG_AVG; i++) o->ops[i] = (brg_op)i;
        break;
      }
      o->nops = 0;
      for (int i = 0; i < BRG_NUM_OPS; i++)
        if (strcmp(optarg, bench_op_print[i]) == 0) {
          o->ops[0] = (brg_op)i;
          o->nops = 1;
        }
      if (o->nops == 0) {
        fprintf(stderr, "%s: -o: unknown op '%s' (sum prod min max avg band bor bxor all)\n",
                bench_prog, optarg);
        return -1;
      }
      break;
    case 'h': usage(stdout, coll); exit(0);
    default: usage(stderr, coll); return -1;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "%s: unexpected argument '%s' (see -h)\n", bench_prog, argv[optind]);
    return -1;
  }
  if (o->min_bytes > o->max_bytes) {
    fprintf(stderr, "%s: -b %zu is larger than -e %zu\n", bench_prog, o->min_bytes, o->max_bytes);
    return -1;
  }
  return 0;
}
