/* The latency-bound allreduces (BRIGADE_ALGO=tree or rhd, from the
 * environment) at every N from 1 to the job's size: one job of N ranks
 * splits off the first n ranks for n = 1..N and runs allreduces on each,
 * every dtype with an op and a count that change with n (so that every
 * dtype meets every op and count across the sizes), in and out of place,
 * each element checked against a reference computed here from inputs whose
 * results are exact in every dtype, and the output's bits compared
 * between all ranks. BRIGADE_SLICE_BYTES small makes the tree pipeline
 * several slices at the largest count. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static const brg_dtype DT[] = {BRG_INT8,   BRG_UINT8,   BRG_INT32,    BRG_UINT32,  BRG_INT64,
                               BRG_UINT64, BRG_FLOAT16, BRG_BFLOAT16, BRG_FLOAT32, BRG_FLOAT64};
static const char *DTN[] = {"int8",   "uint8",   "int32",    "uint32",  "int64",
                            "uint64", "float16", "bfloat16", "float32", "float64"};
static const brg_op OPV[] = {BRG_SUM, BRG_PROD, BRG_MIN, BRG_MAX, BRG_AVG};
static const char *OPN[] = {"sum", "prod", "min", "max", "avg"};
static const size_t COUNTS[] = {1, 7, 3001};

static int is_signed(int d) {
  return d != 1 && d != 3 && d != 5;
}

/* Rank r's input at element j of an allreduce over n ranks: small integers,
 * so that every result is exact in every dtype. */
static int64_t input(int d, int op, int n, int r, size_t j) {
  int s = is_signed(d);
  switch (op) {
  case 1: return r == (int)(j % (size_t)n) ? 2 : s && (r + j) % 2 ? -1 : 1;
  case 4: return 3 + (int64_t)(j % 5) - (s ? 5 : 0) + (n > 1 ? (r == 0) - (r == 1) : 0);
  default: return (int64_t)((r * 7 + j * 3) % 11) - (s ? 5 : 0);
  }
}

static int64_t reference(int d, int op, int n, size_t j) {
  int64_t acc = input(d, op, n, 0, j);
  for (int r = 1; r < n; r++) {
    int64_t v = input(d, op, n, r, j);
    acc = op == 0 || op == 4 ? acc + v
          : op == 1          ? acc * v
          : op == 2          ? (v < acc ? v : acc)
                             : (v > acc ? v : acc);
  }
  return op == 4 ? acc / n : acc;
}

static size_t dsize(int d) {
  return d < 2 ? 1 : d < 4 ? 4 : d < 6 ? 8 : d < 8 ? 2 : d == 8 ? 4 : 8;
}

static void put(int d, void *p, int64_t v) {
  switch (d) {
  case 0: *(int8_t *)p = (int8_t)v; break;
  case 1: *(uint8_t *)p = (uint8_t)v; break;
  case 2: *(int32_t *)p = (int32_t)v; break;
  case 3: *(uint32_t *)p = (uint32_t)v; break;
  case 4: *(int64_t *)p = v; break;
  case 5: *(uint64_t *)p = (uint64_t)v; break;
  case 6: {
    _Float16 h = (_Float16)v;
    memcpy(p, &h, 2);
    break;
  }
  case 7: {
    float f = (float)v;
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t b = (uint16_t)(u >> 16); /* exact: small integers */
    memcpy(p, &b, 2);
    break;
  }
  case 8: *(float *)p = (float)v; break;
  default: *(double *)p = (double)v; break;
  }
}

static uint64_t fnv(const unsigned char *p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

static int body(mp_ctx *ctx) {
  size_t most = COUNTS[2] * 8;
  unsigned char *in = malloc(most), *out = malloc(most), *want = malloc(most);
  for (int n = 1; n <= ctx->nranks; n++) {
    brg_comm *sub = NULL;
    brg_status st =
        brg_comm_split(ctx->comm, ctx->rank < n ? 0 : BRG_SPLIT_NOCOLOR, ctx->rank, &sub);
    MP_CHECK(st == BRG_SUCCESS, "split n=%d: %s", n, brg_comm_last_error(ctx->comm));
    if (st != BRG_SUCCESS) break;
    if (!sub) continue;
    for (int d = 0; d < 10; d++) {
      int op = (d + n) % 5, inplace = (d + n) % 2;
      size_t count = COUNTS[(d / 5 + n) % 3], es = dsize(d);
      for (size_t j = 0; j < count; j++) {
        put(d, in + j * es, input(d, op, n, ctx->rank, j));
        put(d, want + j * es, reference(d, op, n, j));
      }
      memset(out, 0xA5, count * es);
      if (inplace) memcpy(out, in, count * es);
      st = brg_allreduce(inplace ? out : in, out, count, DT[d], OPV[op], sub, NULL);
      MP_CHECK(st == BRG_SUCCESS, "n=%d %s %s count %zu: %s", n, DTN[d], OPN[op], count,
               brg_comm_last_error(sub));
      if (st != BRG_SUCCESS) break;
      size_t bad = 0, first = 0;
      for (size_t j = 0; j < count; j++)
        if (memcmp(out + j * es, want + j * es, es) && !bad++) first = j;
      MP_CHECK(bad == 0, "n=%d %s %s count %zu %s: %zu elements wrong, the first at %zu", n, DTN[d],
               OPN[op], count, inplace ? "in place" : "out of place", bad, first);
      /* the same bits on every rank */
      ctx->shared->vals[ctx->rank] = (int64_t)fnv(out, count * es);
      brg_barrier(sub);
      for (int r = 0; r < n; r++)
        MP_CHECK(ctx->shared->vals[r] == ctx->shared->vals[0],
                 "n=%d %s %s count %zu: rank %d's result differs from rank 0's", n, DTN[d], OPN[op],
                 count, r);
      brg_barrier(sub);
    }
    brg_comm_destroy(sub);
  }
  free(in);
  free(out);
  free(want);
  return 0;
}

/* Rank 2 passes one element more than the others: every rank must fail,
 * and long before BRIGADE_TIMEOUT_MS; rank 2 with BRG_ERR_MISMATCH or the
 * failure of a peer that found it. */
static int body_mismatch(mp_ctx *ctx) {
  float in[8] = {0}, out[8];
  int64_t t0 = mp_now_ns();
  brg_status st =
      brg_allreduce(in, out, ctx->rank == 2 ? 8 : 7, BRG_FLOAT32, BRG_SUM, ctx->comm, NULL);
  double s = (double)(mp_now_ns() - t0) / 1e9;
  MP_CHECK(st != BRG_SUCCESS, "an allreduce whose ranks disagree on the count succeeded");
  MP_CHECK(s < 10, "the mismatch took %.1f s to fail (%s): BRIGADE_TIMEOUT_MS ended it", s,
           brg_comm_last_error(ctx->comm));
  if (ctx->rank == 2)
    MP_CHECK(st == BRG_ERR_MISMATCH || st == BRG_ERR_REMOTE, "rank 2: %s: %s",
             brg_status_string(st), brg_comm_last_error(ctx->comm));
  return 0;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 17;
  int mismatch = argc > 2 && !strcmp(argv[2], "mismatch");
  mp_opts o = {.name = mismatch ? "lat-mismatch" : "lat",
               .nranks = n,
               .init = MP_INIT_ID,
               .victim = -1,
               .deadline_ms = mp_env_int("MP_DEADLINE_MS", 100000)};
  return mp_run(&o, mismatch ? body_mismatch : body, NULL);
}
