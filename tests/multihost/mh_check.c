/*
 * One rank of the multi-host test, started by run.sh inside a network
 * namespace with the environment rendezvous (MASTER_ADDR, MASTER_PORT, RANK,
 * WORLD_SIZE). Uses only the public header, as an application would.
 *
 *   mh_check check   allreduce / reduce_scatter / all_gather / broadcast at
 *                    several sizes and types, then all_to_all and a ring of
 *                    send/recv; every element of every result is checked
 *                    against values computed here independently
 *   mh_check allreduce
 *                    allreduce of every dtype and op (avg included) at
 *                    counts 0, 1, 7, 1009, 65537 and 1048583 (some pairs
 *                    only at the two large counts), in and out of place,
 *                    every element against a reference computed here in
 *                    the dtype's own arithmetic; then every rank checks
 *                    that all ranks ended with the same bits (a hash of
 *                    every result, all-gathered). Run with BRIGADE_ALGO
 *                    ring or hier; with MH_DEVICE=1 on GPU buffers (each
 *                    input copied to the GPU, the result back, the stream
 *                    synchronized in between); with MH_CAPTURE=1 as well,
 *                    each allreduce is captured in a CUDA graph (after
 *                    brg_comm_device_setup) and the graph launched.
 *   mh_check rings   both of the above, for several rings (BRIGADE_RINGS),
 *                    which cut every collective but the barrier
 *   mh_check devmismatch
 *                    (MH_DEVICE=1, kernel mode) for each kind of mismatch
 *                    (count, dtype, op, root, collective), on a communicator
 *                    split off for it: one matched device call, then one
 *                    where the last rank's call differs; the call after it
 *                    and brg_comm_get_async_error must report the same
 *                    error within BRIGADE_TIMEOUT_MS, BRG_ERR_MISMATCH
 *                    naming both calls (or BRG_ERR_REMOTE: a rank stopped
 *                    by the one that found it), and one rank at least
 *                    BRG_ERR_MISMATCH (never the watchdog's
 *                    BRG_ERR_TIMEOUT); prints "mismatch ok" for each
 *   mh_check loop    allreduce until it fails (for the fault tests): prints
 *                    "looping" once the first one succeeded, then, on the
 *                    first failure, "error <status> after <ms> ms: <detail>".
 *                    With MH_DEVICE=1 the buffers are GPU memory of the CUDA
 *                    module BRIGADE_CUDA_MODULE names (GPU LOCAL_RANK modulo
 *                    the GPUs), and the stream is synchronized after every
 *                    call: a stream left blocked by a dead peer hangs the
 *                    rank, which the fault test counts as a failure.
 *
 * Exit 0 when every check passed, 1 on a wrong value or an unexpected error,
 * 3 when the loop ended in an error (what the fault tests want).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/resource.h>
#include <unistd.h>

#include "brigade.h"
#include "../../kernels/cuda/brg_cuda.h"

static int rank = -1, nranks = 0;
static int failures;

#define CHECK_OK(call)                                                                             \
  do {                                                                                             \
    brg_status s_ = (call);                                                                        \
    if (s_ != BRG_SUCCESS) {                                                                       \
      printf("rank %d: FAIL %s: %s (%s)\n", rank, #call, brg_status_string(s_),                    \
             brg_comm_last_error(comm));                                                           \
      fflush(stdout);                                                                              \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

static void bad(const char *what, size_t count, size_t i, double got, double want) {
  if (failures++ < 5)
    printf("rank %d: FAIL %s count %zu: element %zu is %.17g, expected %.17g\n", rank, what, count,
           i, got, want);
}

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Small integers, so float sums are exact whatever the order. */
static float fval(int r, size_t i) {
  return (float)((r + 1) * 3 + (int)(i % 101));
}
static int32_t ival(int r, size_t i) {
  return (int32_t)((r + 1) * 100003 + (int32_t)(i % 7919)) * (r % 2 ? -1 : 1);
}

static void check_allreduce(brg_comm *comm, size_t count) {
  float *fs = malloc(count * sizeof *fs), *fr = malloc(count * sizeof *fr);
  int32_t *is = malloc(count * sizeof *is), *ir = malloc(count * sizeof *ir);
  if (!fs || !fr || !is || !ir) exit(1);
  for (size_t i = 0; i < count; i++) fs[i] = fval(rank, i), is[i] = ival(rank, i);
  CHECK_OK(brg_allreduce(fs, fr, count, BRG_FLOAT32, BRG_SUM, comm, NULL));
  for (size_t i = 0; i < count; i++) {
    double want = 0;
    for (int r = 0; r < nranks; r++) want += fval(r, i);
    if (fr[i] != (float)want) bad("allreduce float32 sum", count, i, fr[i], want);
  }
  CHECK_OK(brg_allreduce(is, ir, count, BRG_INT32, BRG_MAX, comm, NULL));
  for (size_t i = 0; i < count; i++) {
    int32_t want = ival(0, i);
    for (int r = 1; r < nranks; r++)
      if (ival(r, i) > want) want = ival(r, i);
    if (ir[i] != want) bad("allreduce int32 max", count, i, ir[i], want);
  }
  /* in place */
  CHECK_OK(brg_allreduce(is, is, count, BRG_INT32, BRG_SUM, comm, NULL));
  for (size_t i = 0; i < count; i++) {
    int64_t want = 0;
    for (int r = 0; r < nranks; r++) want += ival(r, i);
    if (is[i] != (int32_t)want) bad("allreduce int32 sum in place", count, i, is[i], (double)want);
  }
  free(fs), free(fr), free(is), free(ir);
}

static void check_reduce_scatter(brg_comm *comm, size_t recvcount) {
  size_t total = recvcount * (size_t)nranks;
  float *s = malloc(total * sizeof *s + 1), *out = malloc(recvcount * sizeof *out + 1);
  if (!s || !out) exit(1);
  for (size_t i = 0; i < total; i++) s[i] = fval(rank, i);
  CHECK_OK(brg_reduce_scatter(s, out, recvcount, BRG_FLOAT32, BRG_SUM, comm, NULL));
  for (size_t i = 0; i < recvcount; i++) {
    size_t g = (size_t)rank * recvcount + i;
    double want = 0;
    for (int r = 0; r < nranks; r++) want += fval(r, g);
    if (out[i] != (float)want) bad("reduce_scatter float32 sum", recvcount, i, out[i], want);
  }
  free(s), free(out);
}

static void check_all_gather(brg_comm *comm, size_t sendcount) {
  int32_t *s = malloc(sendcount * sizeof *s + 1),
          *out = malloc(sendcount * (size_t)nranks * sizeof *out + 1);
  if (!s || !out) exit(1);
  for (size_t i = 0; i < sendcount; i++) s[i] = ival(rank, i);
  CHECK_OK(brg_all_gather(s, out, sendcount, BRG_INT32, comm, NULL));
  for (int r = 0; r < nranks; r++)
    for (size_t i = 0; i < sendcount; i++)
      if (out[(size_t)r * sendcount + i] != ival(r, i))
        bad("all_gather int32", sendcount, (size_t)r * sendcount + i,
            out[(size_t)r * sendcount + i], ival(r, i));
  free(s), free(out);
}

static void check_broadcast(brg_comm *comm, size_t count, int root) {
  double *buf = malloc(count * sizeof *buf + 1);
  if (!buf) exit(1);
  for (size_t i = 0; i < count; i++) buf[i] = rank == root ? (double)i * 0.5 + root : -1.0;
  CHECK_OK(brg_broadcast(buf, buf, count, BRG_FLOAT64, root, comm, NULL));
  for (size_t i = 0; i < count; i++)
    if (buf[i] != (double)i * 0.5 + root)
      bad("broadcast float64", count, i, buf[i], (double)i * 0.5 + root);
  free(buf);
}

/* all_to_all of `count` int32 per block, and a ring of messages (each
 * rank sends to the next and receives from the previous, the receive
 * posted first), every element against its sender's formula: the
 * point-to-point links, between hosts and within one. */
static int32_t p2p_value(int from, int to, size_t i) {
  return (int32_t)((uint32_t)from * 1000003u + (uint32_t)to * 1009u + (uint32_t)i);
}

static void check_p2p(brg_comm *comm, size_t count) {
  int32_t *s = malloc((size_t)nranks * count * 4 + 1), *g = malloc((size_t)nranks * count * 4 + 1);
  if (!s || !g) exit(1);
  for (int d = 0; d < nranks; d++)
    for (size_t i = 0; i < count; i++) s[(size_t)d * count + i] = p2p_value(rank, d, i);
  memset(g, 0xee, (size_t)nranks * count * 4);
  CHECK_OK(brg_all_to_all(s, g, count, BRG_INT32, comm, NULL));
  for (int f = 0; f < nranks; f++)
    for (size_t i = 0; i < count; i++)
      if (g[(size_t)f * count + i] != p2p_value(f, rank, i))
        bad("all_to_all int32", count, (size_t)f * count + i, g[(size_t)f * count + i],
            p2p_value(f, rank, i));
  int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
  brg_request rq;
  memset(g, 0xee, count * 4);
  CHECK_OK(brg_irecv(g, count, BRG_INT32, prev, comm, &rq));
  CHECK_OK(brg_send(s + (size_t)next * count, count, BRG_INT32, next, comm, NULL));
  CHECK_OK(brg_wait(&rq));
  for (size_t i = 0; i < count; i++)
    if (g[i] != p2p_value(prev, rank, i))
      bad("recv int32", count, i, g[i], p2p_value(prev, rank, i));
  free(s);
  free(g);
}

static int run_check(brg_comm *comm) {
  static const size_t sizes[] = {1, 7, 1000, 65537, 1000003};
  for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
    size_t n = sizes[k];
    check_allreduce(comm, n);
    check_reduce_scatter(comm, n / (size_t)nranks + 1);
    check_all_gather(comm, n / (size_t)nranks + 1);
    for (int root = 0; root < nranks; root++) check_broadcast(comm, n, root);
  }
  check_p2p(comm, 1);
  check_p2p(comm, 300007); /* more than a link holds at once */
  CHECK_OK(brg_barrier(comm));
  if (failures) {
    printf("rank %d: FAIL %d wrong values\n", rank, failures);
    return 1;
  }
  printf("rank %d of %d: OK (allreduce, reduce_scatter, all_gather, broadcast, all_to_all, "
         "send/recv; every element)\n",
         rank, nranks);
  return 0;
}

/* ---- every dtype and op ---- */

/* float32 <-> float16 / bfloat16 bits, round to nearest even; the values
 * here are 0 or normal in both formats (at least 1/9 in magnitude, at most
 * 256), which is all these need to handle. */
static int half_range_bad;
static uint16_t f16_from(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
  uint32_t a = x & 0x7fffffffu;
  if (a == 0) return sign;
  int e = (int)(a >> 23) - 127 + 15;
  if (e < 1 || e > 30) half_range_bad = 1;
  uint32_t m = a & 0x7fffff, h = ((uint32_t)e << 10) | (m >> 13), rest = m & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++;
  return (uint16_t)(sign | h);
}
static float f16_to(uint16_t h) {
  int e = (h >> 10) & 0x1f;
  float v = e == 0 ? 0.0f : ldexpf(1.0f + (float)(h & 0x3ff) / 1024.0f, e - 15);
  if (e == 0 && (h & 0x3ff)) half_range_bad = 1;
  return h & 0x8000 ? -v : v;
}
static uint16_t bf16_from(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  return (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}
static float bf16_to(uint16_t b) {
  uint32_t x = (uint32_t)b << 16;
  float f;
  memcpy(&f, &x, 4);
  return f;
}

static int is_unsigned(brg_dtype d) {
  return d == BRG_UINT8 || d == BRG_UINT32 || d == BRG_UINT64;
}

/* Rank r's input element i: small integers (-2..2, or 0..4 unsigned), so
 * sums and products of up to 9 ranks are exact in every float type. */
static int64_t input(brg_dtype d, brg_op op, int r, size_t i) {
  int64_t v = (int64_t)(((size_t)r * 7 + i * 3 + (size_t)op) % 5);
  return is_unsigned(d) ? v : v - 2;
}

static void store(brg_dtype d, void *buf, size_t i, int64_t v) {
  switch (d) {
  case BRG_INT8: ((int8_t *)buf)[i] = (int8_t)v; break;
  case BRG_UINT8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
  case BRG_INT32: ((int32_t *)buf)[i] = (int32_t)v; break;
  case BRG_UINT32: ((uint32_t *)buf)[i] = (uint32_t)v; break;
  case BRG_INT64: ((int64_t *)buf)[i] = v; break;
  case BRG_UINT64: ((uint64_t *)buf)[i] = (uint64_t)v; break;
  case BRG_FLOAT16: ((uint16_t *)buf)[i] = f16_from((float)v); break;
  case BRG_BFLOAT16: ((uint16_t *)buf)[i] = bf16_from((float)v); break;
  case BRG_FLOAT32: ((float *)buf)[i] = (float)v; break;
  case BRG_FLOAT64: ((double *)buf)[i] = (double)v; break;
  }
}

/* Element i as a double (exact for every value these tests produce). */
static double load(brg_dtype d, const void *buf, size_t i) {
  switch (d) {
  case BRG_INT8: return ((const int8_t *)buf)[i];
  case BRG_UINT8: return ((const uint8_t *)buf)[i];
  case BRG_INT32: return ((const int32_t *)buf)[i];
  case BRG_UINT32: return ((const uint32_t *)buf)[i];
  case BRG_INT64: return (double)((const int64_t *)buf)[i];
  case BRG_UINT64: return (double)((const uint64_t *)buf)[i];
  case BRG_FLOAT16: return f16_to(((const uint16_t *)buf)[i]);
  case BRG_BFLOAT16: return bf16_to(((const uint16_t *)buf)[i]);
  case BRG_FLOAT32: return ((const float *)buf)[i];
  case BRG_FLOAT64: return ((const double *)buf)[i];
  }
  return 0;
}

/* Integer v wrapped to dtype d's width, as the dtype holds it. */
static int64_t wrap(brg_dtype d, uint64_t v) {
  switch (d) {
  case BRG_INT8: return (int8_t)v;
  case BRG_UINT8: return (uint8_t)v;
  case BRG_INT32: return (int32_t)v;
  case BRG_UINT32: return (uint32_t)v;
  default: return (int64_t)v;
  }
}

/* The expected element i: integers wrap on sum and product and avg
 * truncates the wrapped sum toward zero; floats compute exactly here and
 * avg rounds sum / N once in the dtype, as brigade.h defines them. */
static double expect(brg_dtype d, brg_op op, size_t i) {
  int isfloat = d == BRG_FLOAT16 || d == BRG_BFLOAT16 || d == BRG_FLOAT32 || d == BRG_FLOAT64;
  uint64_t wsum = 0, wprod = 1;
  int64_t lo = INT64_MAX, hi = INT64_MIN, sum = 0;
  for (int r = 0; r < nranks; r++) {
    int64_t v = input(d, op, r, i);
    wsum += (uint64_t)v, wprod *= (uint64_t)v, sum += v;
    if (v < lo) lo = v;
    if (v > hi) hi = v;
  }
  switch (op) {
  case BRG_MIN: return (double)lo;
  case BRG_MAX: return (double)hi;
  case BRG_SUM: return isfloat ? (double)sum : (double)wrap(d, wsum);
  case BRG_PROD: return isfloat ? (double)(int64_t)wprod : (double)wrap(d, wprod);
  case BRG_AVG: break;
  default: return 0; /* the bitwise ops are not among the ops this test runs */
  }
  switch (d) {
  case BRG_FLOAT64: return (double)sum / (double)nranks;
  case BRG_FLOAT32: return (float)sum / (float)nranks;
  case BRG_FLOAT16: return f16_to(f16_from((float)sum / (float)nranks));
  case BRG_BFLOAT16: return bf16_to(bf16_from((float)sum / (float)nranks));
  case BRG_UINT32: return (double)((uint32_t)wsum / (uint32_t)nranks);
  case BRG_UINT64: return (double)(wsum / (uint64_t)nranks);
  case BRG_INT64: return (double)((int64_t)wsum / (int64_t)nranks);
  default: return (double)((int)wrap(d, wsum) / nranks);
  }
}

static uint64_t result_hash = 1469598103934665603ull;
static void hash_bytes(const void *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    result_hash = (result_hash ^ ((const uint8_t *)p)[i]) * 1099511628211ull;
}

/* MH_DEVICE=1: GPU buffers of the CUDA module BRIGADE_CUDA_MODULE names,
 * on GPU LOCAL_RANK modulo the GPUs, and a stream of their own. */
static const brg__cuda_api *g_api;
static void *g_stream;
static int g_capture; /* MH_CAPTURE=1 */

static int device_open(void) {
  char why[256];
  const char *path = getenv("BRIGADE_CUDA_MODULE");
  g_api = path ? brg__cuda_open(path, why, sizeof why) : NULL;
  if (!g_api) {
    printf("rank %d: FAIL no CUDA module: %s\n", rank, path ? why : "BRIGADE_CUDA_MODULE unset");
    return 1;
  }
  int ngpu = g_api->drv.probe(NULL, 0);
  const char *lr = getenv("LOCAL_RANK");
  if (ngpu > 0) g_api->drv.set_device((lr ? atoi(lr) : rank) % ngpu);
  if (g_api->drv.stream_create(&g_stream)) {
    printf("rank %d: FAIL no stream\n", rank);
    return 1;
  }
  return 0;
}

/* A GPU copy of n host bytes (at least 16 allocated). */
static void *device_copy(const void *h, size_t n) {
  void *d = NULL;
  if (g_api->drv.mem_alloc(&d, n + 16) || (n && g_api->drv.mem_copy(d, h, n))) {
    printf("rank %d: FAIL GPU buffer of %zu bytes\n", rank, n);
    exit(1);
  }
  return d;
}

/* The allreduce on GPU buffers: host sb (rb in place) in, host rb out. */
static brg_status device_allreduce(const char *sb, char *rb, size_t count, brg_dtype d, brg_op op,
                                   int in_place, brg_comm *comm) {
  size_t n = count * brg_dtype_size(d);
  void *ds = device_copy(in_place ? rb : sb, n), *dr = in_place ? ds : device_copy(rb, n);
  void *graph = NULL;
  if (g_capture && g_api->drv.capture_begin(g_stream, 1)) {
    printf("rank %d: FAIL capture_begin\n", rank);
    exit(1);
  }
  brg_status s = brg_allreduce(ds, dr, count, d, op, comm, g_stream);
  if (g_capture) {
    int e = g_api->drv.capture_end(g_stream, &graph);
    if (s == BRG_SUCCESS && e) {
      printf("rank %d: FAIL capture_end: %s\n", rank, g_api->drv.error_string(e));
      exit(1);
    }
    if (s == BRG_SUCCESS && (e = g_api->drv.graph_launch(graph, g_stream)) != 0) {
      printf("rank %d: FAIL graph_launch: %s\n", rank, g_api->drv.error_string(e));
      exit(1);
    }
  }
  if (s == BRG_SUCCESS &&
      (g_api->drv.stream_sync(g_stream) || (n && g_api->drv.mem_copy(rb, dr, n))))
    s = BRG_ERR_SYSTEM;
  if (graph) g_api->drv.graph_destroy(graph);
  g_api->drv.mem_free(ds);
  if (dr != ds) g_api->drv.mem_free(dr);
  return s;
}

static void check_one(brg_comm *comm, brg_dtype d, brg_op op, size_t count, int in_place) {
  size_t es = brg_dtype_size(d);
  char *sb = malloc(count * es + 1), *rb = malloc(count * es + 1);
  if (!sb || !rb) exit(1);
  for (size_t i = 0; i < count; i++) store(d, sb, i, input(d, op, rank, i));
  if (in_place) memcpy(rb, sb, count * es);
  if (g_api)
    CHECK_OK(device_allreduce(sb, rb, count, d, op, in_place, comm));
  else
    CHECK_OK(brg_allreduce(in_place ? rb : sb, rb, count, d, op, comm, NULL));
  char what[96];
  snprintf(what, sizeof what, "allreduce %s %s%s", brg_dtype_name(d), brg_op_name(op),
           in_place ? " in place" : "");
  for (size_t i = 0; i < count; i++) {
    double got = load(d, rb, i), want = expect(d, op, i);
    if (got != want) bad(what, count, i, got, want);
  }
  hash_bytes(rb, count * es);
  free(sb), free(rb);
}

static int run_allreduce_matrix(brg_comm *comm) {
  static const size_t small[] = {0, 1, 7, 1009};
  int calls = 0;
  for (size_t k = 0; k < sizeof small / sizeof small[0]; k++)
    for (int d = 0; d < BRG_NUM_DTYPES; d++)
      for (int op = 0; op <= BRG_AVG; op++, calls++) /* the ops every dtype takes */
        check_one(comm, (brg_dtype)d, (brg_op)op, small[k], (d + op) % 2);
  /* Large and odd: chunks that split unevenly within and across hosts. */
  static const struct {
    size_t count;
    brg_dtype d;
    brg_op op;
  } large[] = {
      {65537, BRG_FLOAT32, BRG_SUM},   {65537, BRG_BFLOAT16, BRG_AVG},
      {65537, BRG_INT64, BRG_MAX},     {65537, BRG_UINT8, BRG_PROD},
      {1048583, BRG_FLOAT32, BRG_SUM}, {1048583, BRG_FLOAT64, BRG_AVG},
  };
  for (size_t k = 0; k < sizeof large / sizeof large[0]; k++, calls++)
    check_one(comm, large[k].d, large[k].op, large[k].count, (int)k % 2);
  if (half_range_bad) {
    printf("rank %d: FAIL a half value outside the range this check handles\n", rank);
    return 1;
  }
  uint64_t *all = malloc((size_t)nranks * sizeof *all);
  if (!all) return 1;
  CHECK_OK(brg_all_gather(&result_hash, all, 1, BRG_UINT64, comm, NULL));
  for (int r = 0; r < nranks; r++)
    if (all[r] != result_hash) {
      printf("rank %d: FAIL rank %d's results differ in their bits from rank %d's\n", rank, r,
             rank);
      failures++;
    }
  free(all);
  if (failures) {
    printf("rank %d: FAIL %d wrong values\n", rank, failures);
    return 1;
  }
  printf("rank %d of %d: OK (%d allreduces, every dtype and op, every element; the same bits on "
         "every rank)\n",
         rank, nranks, calls);
  return 0;
}

/* ========================================================= devmismatch */

enum { DM_COUNT, DM_DTYPE, DM_OP, DM_ROOT, DM_KIND, DM_N };
static const char *DM_NAMES[DM_N] = {"count 4096 vs 4097", "float32 vs int32", "sum vs max",
                                     "broadcast root 0 vs 1", "allreduce vs broadcast"};

/* Whether the message names both calls of mismatch kind k. */
static int dm_names_both(int k, const char *m) {
  switch (k) {
  case DM_COUNT: return strstr(m, "count 4096,") && strstr(m, "count 4097,");
  case DM_DTYPE: return strstr(m, "float32") && strstr(m, "int32");
  case DM_OP: return strstr(m, "sum") && strstr(m, "max");
  case DM_ROOT: return strstr(m, "root 0") && strstr(m, "root 1");
  default: return strstr(m, "allreduce") && strstr(m, "broadcast");
  }
}

/* One kind of mismatch on a communicator of its own, split off `world`:
 * 0 when every check held. */
static int dm_one(brg_comm *world, int k, void *d) {
  brg_comm *comm = NULL;
  CHECK_OK(brg_comm_split(world, 0, rank, &comm));
  int odd = rank == nranks - 1;
  brg_status s = brg_allreduce(d, d, 7, BRG_FLOAT32, BRG_MAX, comm, g_stream);
  if (s == BRG_SUCCESS && g_api->drv.stream_sync(g_stream)) s = BRG_ERR_SYSTEM;
  if (s != BRG_SUCCESS) {
    printf("rank %d: FAIL %s: the matched allreduce before: %s (%s)\n", rank, DM_NAMES[k],
           brg_status_string(s), brg_comm_last_error(comm));
    return 1;
  }
  switch (k) {
  case DM_COUNT:
    s = brg_allreduce(d, d, odd ? 4097 : 4096, BRG_FLOAT32, BRG_SUM, comm, g_stream);
    break;
  case DM_DTYPE:
    s = brg_allreduce(d, d, 4096, odd ? BRG_INT32 : BRG_FLOAT32, BRG_SUM, comm, g_stream);
    break;
  case DM_OP:
    s = brg_allreduce(d, d, 4096, BRG_FLOAT32, odd ? BRG_MAX : BRG_SUM, comm, g_stream);
    break;
  case DM_ROOT: s = brg_broadcast(d, d, 4096, BRG_FLOAT32, odd ? 1 : 0, comm, g_stream); break;
  default:
    s = odd ? brg_broadcast(d, d, 4096, BRG_FLOAT32, 0, comm, g_stream)
            : brg_allreduce(d, d, 4096, BRG_FLOAT32, BRG_SUM, comm, g_stream);
  }
  /* Enqueued: the kernels (and the host proxies between them) find it. */
  int64_t t0 = now_ms();
  const char *tm = getenv("BRIGADE_TIMEOUT_MS");
  int64_t limit = (tm ? atoll(tm) : 30000) + 5000;
  brg_status a = s;
  while (a == BRG_SUCCESS && now_ms() - t0 < limit) {
    brg_comm_get_async_error(comm, &a);
    if (a == BRG_SUCCESS) {
      struct timespec ts = {0, 5000000};
      nanosleep(&ts, NULL);
    }
  }
  long long el = (long long)(now_ms() - t0);
  char async_msg[512];
  snprintf(async_msg, sizeof async_msg, "%s", brg_comm_last_error(comm));
  brg_status next = brg_allreduce(d, d, 7, BRG_FLOAT32, BRG_SUM, comm, g_stream);
  const char *m = brg_comm_last_error(comm);
  printf("rank %d: %s: call %s, async %s after %lld ms, next call %s: %s\n", rank, DM_NAMES[k],
         brg_status_string(s), brg_status_string(a), el, brg_status_string(next), m);
  int bad = 0;
  if (next != BRG_ERR_MISMATCH && next != BRG_ERR_REMOTE)
    printf("rank %d: FAIL %s: the call after returned %s, expected BRG_ERR_MISMATCH (or "
           "BRG_ERR_REMOTE)\n",
           rank, DM_NAMES[k], brg_status_string(next)),
        bad = 1;
  if (a != next)
    printf("rank %d: FAIL %s: brg_comm_get_async_error said %s, the call after %s\n", rank,
           DM_NAMES[k], brg_status_string(a), brg_status_string(next)),
        bad = 1;
  if (next == BRG_ERR_MISMATCH && (!dm_names_both(k, m) || !dm_names_both(k, async_msg) ||
                                   !strstr(m, "collective mismatch: rank")))
    printf("rank %d: FAIL %s: the messages do not name both calls: \"%s\" and \"%s\"\n", rank,
           DM_NAMES[k], async_msg, m),
        bad = 1;
  /* One rank at least must have found the mismatch (the host world
   * communicator is unharmed: the devices' errors are the split one's). */
  int32_t mine = next, *all = malloc((size_t)nranks * sizeof *all);
  if (!all) exit(1);
  brg_comm_destroy(comm);
  CHECK_OK(brg_all_gather(&mine, all, 1, BRG_INT32, world, NULL));
  int found = 0;
  for (int r = 0; r < nranks; r++) found += all[r] == BRG_ERR_MISMATCH;
  free(all);
  if (!found)
    printf("rank %d: FAIL %s: no rank reported BRG_ERR_MISMATCH\n", rank, DM_NAMES[k]), bad = 1;
  if (!bad) printf("rank %d: %s: mismatch ok\n", rank, DM_NAMES[k]);
  return bad;
}

static int run_devmismatch(brg_comm *world) {
  if (!g_api) {
    printf("rank %d: FAIL devmismatch needs MH_DEVICE=1\n", rank);
    return 1;
  }
  float h[4097];
  for (int i = 0; i < 4097; i++) h[i] = fval(rank, (size_t)i);
  void *d = device_copy(h, sizeof h);
  int bad = 0;
  for (int k = 0; k < DM_N; k++) bad |= dm_one(world, k, d);
  g_api->drv.mem_free(d);
  if (!bad) printf("rank %d of %d: OK (%d kinds of mismatch named)\n", rank, nranks, DM_N);
  return bad;
}

/* netfail: the last rank may open no more descriptors once its buffer is
 * made, so its first allreduce fails to set up the ends (shm's FIFO, tcp's
 * socket) of the links it makes first: with MH_DEVICE=1 in kernel mode,
 * kernel mode's links between hosts (the net ring); on host buffers under
 * BRIGADE_ALGO=hier, the links of the hierarchy's pieces, which the ranks
 * outside a piece stand by for. Every rank must fail that call within the
 * timeout, none may hang; the others' error must name the last rank and
 * what failed, the last rank's its own cause. */
static int run_netfail(brg_comm *comm) {
  size_t count = 4099;
  float *h = malloc(count * sizeof *h);
  if (!h) return 1;
  for (size_t i = 0; i < count; i++) h[i] = fval(rank, i);
  void *d = g_api ? device_copy(h, count * sizeof *h) : h;
  const char *what = g_api ? "kernel mode's links between hosts" : "the hierarchical allreduce";
  int victim = nranks - 1;
  if (rank == victim) {
    int lowest = dup(0); /* the lowest free descriptor: none below it is free */
    struct rlimit lim;
    if (lowest < 0 || close(lowest) || getrlimit(RLIMIT_NOFILE, &lim)) {
      printf("rank %d: FAIL no descriptor limit to set\n", rank);
      return 1;
    }
    lim.rlim_cur = (rlim_t)lowest;
    if (setrlimit(RLIMIT_NOFILE, &lim)) {
      printf("rank %d: FAIL setrlimit(RLIMIT_NOFILE, %d)\n", rank, lowest);
      return 1;
    }
  }
  int64_t t0 = now_ms();
  brg_status st = brg_allreduce(d, d, count, BRG_FLOAT32, BRG_SUM, comm, g_api ? g_stream : NULL);
  int e = st == BRG_SUCCESS && g_api ? g_api->drv.stream_sync(g_stream) : 0;
  const char *why = brg_comm_last_error(comm);
  char want[64], want2[64]; /* "rank V failed ...", or "rank V (next, ...) failed" */
  snprintf(want, sizeof want, "rank %d failed", victim);
  snprintf(want2, sizeof want2, "rank %d (", victim);
  int bad = 0;
  if (st == BRG_SUCCESS && !e) {
    printf("rank %d: FAIL the allreduce succeeded\n", rank);
    bad = 1;
  } else if (!strstr(why, what)) {
    printf("rank %d: FAIL the error does not name %s: %s\n", rank, what, why);
    bad = 1;
  } else if (rank != victim && !strstr(why, want) && !strstr(why, want2)) {
    printf("rank %d: FAIL the error does not name rank %d: %s\n", rank, victim, why);
    bad = 1;
  } else if (rank == victim && !strstr(why, "Too many open files")) {
    printf("rank %d: FAIL the error does not give its cause: %s\n", rank, why);
    bad = 1;
  }
  printf("rank %d: the allreduce returned %s after %lld ms: %s\n", rank, brg_status_string(st),
         (long long)(now_ms() - t0), why);
  if (g_api) g_api->drv.mem_free(d);
  free(h);
  if (bad) return 1;
  if (rank == victim) { /* descriptors again, for what is left to check */
    struct rlimit lim;
    getrlimit(RLIMIT_NOFILE, &lim);
    lim.rlim_cur = lim.rlim_max;
    setrlimit(RLIMIT_NOFILE, &lim);
  }
  printf("rank %d: set-up failure ok\n", rank);
  return 0;
}

static int loop_failed(brg_comm *comm, brg_status st, int64_t t0, long iter, const char *what) {
  printf("rank %d: error %s after %lld ms in iteration %ld: %s%s\n", rank, brg_status_string(st),
         (long long)(now_ms() - t0), iter, what, brg_comm_last_error(comm));
  fflush(stdout);
  return 3;
}

static int run_loop(brg_comm *comm) {
  size_t count = 1 << 20;
  float *s = malloc(count * sizeof *s), *r = malloc(count * sizeof *r);
  if (!s || !r) return 1;
  for (size_t i = 0; i < count; i++) s[i] = fval(rank, i);
  int64_t t0 = now_ms();
  for (long iter = 0;; iter++) {
    t0 = now_ms();
    brg_status st = brg_allreduce(s, r, count, BRG_FLOAT32, BRG_SUM, comm, NULL);
    if (st != BRG_SUCCESS) {
      free(s), free(r);
      return loop_failed(comm, st, t0, iter, "");
    }
    if (iter == 0) {
      printf("rank %d: looping\n", rank);
      fflush(stdout);
    }
  }
}

static int run_loop_device(brg_comm *comm) {
  size_t count = 1 << 20;
  float *h = malloc(count * sizeof *h);
  if (!h) return 1;
  for (size_t i = 0; i < count; i++) h[i] = fval(rank, i);
  void *d = device_copy(h, count * sizeof *h);
  free(h);
  for (long iter = 0;; iter++) {
    int64_t t0 = now_ms();
    brg_status s = brg_allreduce(d, d, count, BRG_FLOAT32, BRG_MAX, comm, g_stream);
    if (s != BRG_SUCCESS) return loop_failed(comm, s, t0, iter, "");
    int e = g_api->drv.stream_sync(g_stream);
    if (e) return loop_failed(comm, BRG_ERR_SYSTEM, t0, iter, g_api->drv.error_string(e));
    if (iter == 0) {
      printf("rank %d: looping (GPU buffers)\n", rank);
      fflush(stdout);
    }
  }
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "check";
  brg_comm *comm = NULL;
  setvbuf(stdout, NULL, _IOLBF, 0);
  brg_status s = brg_comm_init_env(&comm);
  if (s != BRG_SUCCESS) {
    printf("rank ?: FAIL brg_comm_init_env: %s (%s)\n", brg_status_string(s),
           brg_comm_last_error(NULL));
    return 1;
  }
  brg_comm_rank(comm, &rank);
  brg_comm_size(comm, &nranks);
  const char *dev = getenv("MH_DEVICE");
  if (dev && !strcmp(dev, "1") && device_open()) return 1;
  const char *cap = getenv("MH_CAPTURE");
  if (g_api && cap && !strcmp(cap, "1")) {
    g_capture = 1;
    CHECK_OK(brg_comm_device_setup(comm, -1)); /* nothing of the setup can be captured */
  }
  int rc = strcmp(mode, "loop") == 0 && g_api ? run_loop_device(comm)
           : strcmp(mode, "loop") == 0        ? run_loop(comm)
           : strcmp(mode, "allreduce") == 0   ? run_allreduce_matrix(comm)
           : strcmp(mode, "devmismatch") == 0 ? run_devmismatch(comm)
           : strcmp(mode, "netfail") == 0     ? run_netfail(comm)
           : strcmp(mode, "rings") == 0       ? (run_allreduce_matrix(comm) || run_check(comm))
                                              : run_check(comm);
  if (rc == 3) brg_comm_abort(comm);
  brg_comm_destroy(comm);
  return rc;
}
