/*
 * libbrigade_nccl.so through nccl.h alone, as a program written for NCCL
 * would use it (the CUDA module's table only moves test data and waits for
 * streams, which such a program does with the CUDA runtime).
 *
 *   test_nccl_compat ranks N   N processes, each one communicator made with
 *                              ncclGetUniqueId + ncclCommInitRank inside a
 *                              group (as nccl-tests does); every collective
 *                              nccl.h has x every dtype brigade has x every
 *                              op, counts 0, 1, 7, 4099, 65537, in place and
 *                              out of place, every element checked;
 *                              ncclSend/ncclRecv (grouped and not) and
 *                              ncclAlltoAll; ncclGather and ncclScatter
 *                              from every root; then the calls brigade lacks
 *                              and bad arguments
 *   test_nccl_compat all N     ncclCommInitAll: N communicators in this
 *                              process, one per device, driven from one
 *                              thread inside ncclGroupStart/End (an
 *                              allreduce, then a ring of ncclSend/ncclRecv)
 *
 * Inputs are small integers chosen so that every result is exact in every
 * dtype: rank r's element i is (i % 20) + 1 + 2r (sum N((i % 20) + N), so
 * the average is exact too), and (i % 3) + 1 + r % 2 for products.
 * Exits 77 without a GPU (1 with BRIGADE_TEST_NO_SKIP set).
 */
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nccl.h>

#include "../../kernels/cuda/brg_cuda.h"

static const brg__cuda_api *api;
static int g_rank = -1, g_failures;
static long g_checked; /* elements compared */

#define FAIL(...)                                                                                  \
  do {                                                                                             \
    fprintf(stderr, "rank %d: FAIL: ", g_rank);                                                    \
    fprintf(stderr, __VA_ARGS__);                                                                  \
    fputc('\n', stderr);                                                                           \
    if (++g_failures > 20) exit(1);                                                                \
  } while (0)

#define NCCL_OK(call)                                                                              \
  do {                                                                                             \
    ncclResult_t r_ = (call);                                                                      \
    if (r_ != ncclSuccess) {                                                                       \
      FAIL("%s: %s: %s", #call, ncclGetErrorString(r_), ncclGetLastError(NULL));                   \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

static const ncclDataType_t types[] = {ncclInt8,    ncclUint8,   ncclInt32,   ncclUint32,
                                       ncclInt64,   ncclUint64,  ncclFloat16, ncclFloat32,
                                       ncclFloat64, ncclBfloat16};
static const char *type_names[] = {"int8",   "uint8",   "int32",   "uint32",  "int64",
                                   "uint64", "float16", "float32", "float64", "bfloat16"};
static const size_t type_bytes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};
static const ncclRedOp_t ops[] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg};
static const char *op_names[] = {"sum", "prod", "max", "min", "avg"};
static const size_t counts[] = {0, 1, 7, 4099, 65537};

/* Element i of `buf` (type index t) set to / read as a double. */
static void put(void *buf, int t, size_t i, double v) {
  switch (types[t]) {
  case ncclInt8: ((int8_t *)buf)[i] = (int8_t)v; break;
  case ncclUint8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
  case ncclInt32: ((int32_t *)buf)[i] = (int32_t)v; break;
  case ncclUint32: ((uint32_t *)buf)[i] = (uint32_t)v; break;
  case ncclInt64: ((int64_t *)buf)[i] = (int64_t)v; break;
  case ncclUint64: ((uint64_t *)buf)[i] = (uint64_t)v; break;
  case ncclFloat16: {
    _Float16 h = (_Float16)v;
    memcpy((char *)buf + 2 * i, &h, 2);
    break;
  }
  case ncclFloat32: ((float *)buf)[i] = (float)v; break;
  case ncclFloat64: ((double *)buf)[i] = v; break;
  default: { /* bfloat16: small integers are exact in the top half of a float */
    float f = (float)v;
    uint32_t u;
    memcpy(&u, &f, 4);
    ((uint16_t *)buf)[i] = (uint16_t)(u >> 16);
  }
  }
}

static double get(const void *buf, int t, size_t i) {
  switch (types[t]) {
  case ncclInt8: return ((const int8_t *)buf)[i];
  case ncclUint8: return ((const uint8_t *)buf)[i];
  case ncclInt32: return ((const int32_t *)buf)[i];
  case ncclUint32: return ((const uint32_t *)buf)[i];
  case ncclInt64: return (double)((const int64_t *)buf)[i];
  case ncclUint64: return (double)((const uint64_t *)buf)[i];
  case ncclFloat16: {
    _Float16 h;
    memcpy(&h, (const char *)buf + 2 * i, 2);
    return (double)h;
  }
  case ncclFloat32: return ((const float *)buf)[i];
  case ncclFloat64: return ((const double *)buf)[i];
  default: {
    uint32_t u = (uint32_t)((const uint16_t *)buf)[i] << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
  }
  }
}

static double input(int op, size_t i, int r) {
  return ops[op] == ncclProd ? (double)(i % 3 + 1 + (size_t)(r % 2))
                             : (double)(i % 20 + 1 + 2 * (size_t)r);
}

/* The reduction over ranks 0..n-1 of element i. */
static double expect(int op, size_t i, int n) {
  double acc = input(op, i, 0);
  for (int r = 1; r < n; r++) {
    double x = input(op, i, r);
    switch (ops[op]) {
    case ncclProd: acc *= x; break;
    case ncclMax: acc = x > acc ? x : acc; break;
    case ncclMin: acc = x < acc ? x : acc; break;
    default: acc += x;
    }
  }
  return ops[op] == ncclAvg ? acc / n : acc;
}

/* One communicator's view: device buffers and a host mirror. */
typedef struct bufs {
  void *dsend, *drecv, *host;
  size_t bytes;
  cudaStream_t stream;
} bufs;

static void to_dev(void *d, const void *h, size_t bytes) {
  if (bytes && api->drv.mem_copy(d, h, bytes)) {
    FAIL("mem_copy to the GPU failed");
    exit(1);
  }
}
static void from_dev(void *h, const void *d, size_t bytes) {
  api->drv.stream_sync(NULL);
  if (bytes && api->drv.mem_copy(h, d, bytes)) {
    FAIL("mem_copy from the GPU failed");
    exit(1);
  }
}

static void check_elems(const char *what, int t, const void *got, size_t n,
                        double (*want)(size_t, void *), void *arg) {
  g_checked += (long)n;
  for (size_t i = 0; i < n; i++) {
    double w = want(i, arg), g = get(got, t, i);
    if (g != w) {
      FAIL("%s %s: element %zu of %zu is %g, expected %g", what, type_names[t], i, n, g, w);
      return;
    }
  }
}

typedef struct ctx {
  int op, n, rank, root, nranks;
  size_t count;
} ctx;

static double want_reduce(size_t i, void *a) {
  ctx *c = a;
  return expect(c->op, i, c->nranks);
}
static double want_rs(size_t i, void *a) {
  ctx *c = a;
  return expect(c->op, (size_t)c->rank * c->count + i, c->nranks);
}
static double want_ag(size_t i, void *a) {
  ctx *c = a;
  return input(0, i % c->count, (int)(i / c->count));
}
static double want_bcast(size_t i, void *a) {
  ctx *c = a;
  return input(0, i, c->root);
}

/* Every collective, dtype, op, count, in place and out of place. */
static void collectives(ncclComm_t comm, int rank, int n, bufs *b) {
  char *h = b->host;
  for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++) {
    size_t cnt = counts[ci];
    for (int t = 0; t < (int)(sizeof types / sizeof types[0]); t++) {
      size_t es = type_bytes[t];
      for (int inplace = 0; inplace < 2; inplace++) {
        char what[160];
        /* allreduce and reduce, every op */
        for (int op = 0; op < 5; op++) {
          ctx c = {.op = op, .rank = rank, .nranks = n, .count = cnt};
          for (size_t i = 0; i < cnt; i++) put(h, t, i, input(op, i, rank));
          to_dev(b->dsend, h, cnt * es);
          void *out = inplace ? b->dsend : b->drecv;
          NCCL_OK(ncclAllReduce(b->dsend, out, cnt, types[t], ops[op], comm, b->stream));
          from_dev(h, out, cnt * es);
          snprintf(what, sizeof what, "ncclAllReduce %s count %zu %s", op_names[op], cnt,
                   inplace ? "in place" : "out of place");
          check_elems(what, t, h, cnt, want_reduce, &c);
          int root = n - 1;
          for (size_t i = 0; i < cnt; i++) put(h, t, i, input(op, i, rank));
          to_dev(b->dsend, h, cnt * es);
          NCCL_OK(ncclReduce(b->dsend, out, cnt, types[t], ops[op], root, comm, b->stream));
          from_dev(h, out, cnt * es);
          snprintf(what, sizeof what, "ncclReduce %s root %d count %zu %s", op_names[op], root, cnt,
                   inplace ? "in place" : "out of place");
          if (rank == root) check_elems(what, t, h, cnt, want_reduce, &c);
          /* reduce-scatter: N chunks of cnt in, this rank's chunk out */
          for (size_t i = 0; i < cnt * (size_t)n; i++) put(h, t, i, input(op, i, rank));
          to_dev(b->dsend, h, cnt * (size_t)n * es);
          void *rs_out = inplace ? (char *)b->dsend + (size_t)rank * cnt * es : b->drecv;
          NCCL_OK(ncclReduceScatter(b->dsend, rs_out, cnt, types[t], ops[op], comm, b->stream));
          from_dev(h, rs_out, cnt * es);
          snprintf(what, sizeof what, "ncclReduceScatter %s count %zu %s", op_names[op], cnt,
                   inplace ? "in place" : "out of place");
          check_elems(what, t, h, cnt, want_rs, &c);
        }
        /* all-gather: cnt in, N chunks out */
        ctx c = {.rank = rank, .nranks = n, .count = cnt, .root = n - 1};
        for (size_t i = 0; i < cnt; i++) put(h, t, i, input(0, i, rank));
        void *ag_in = inplace ? (char *)b->drecv + (size_t)rank * cnt * es : b->dsend;
        to_dev(ag_in, h, cnt * es);
        NCCL_OK(ncclAllGather(ag_in, b->drecv, cnt, types[t], comm, b->stream));
        from_dev(h, b->drecv, cnt * (size_t)n * es);
        snprintf(what, sizeof what, "ncclAllGather count %zu %s", cnt,
                 inplace ? "in place" : "out of place");
        if (cnt) check_elems(what, t, h, cnt * (size_t)n, want_ag, &c);
        /* broadcast from the last rank (ncclBcast is always in place) */
        for (size_t i = 0; i < cnt; i++) put(h, t, i, input(0, i, rank));
        to_dev(b->dsend, h, cnt * es);
        if (inplace)
          NCCL_OK(ncclBcast(b->dsend, cnt, types[t], c.root, comm, b->stream));
        else
          NCCL_OK(ncclBroadcast(b->dsend, b->drecv, cnt, types[t], c.root, comm, b->stream));
        from_dev(h, inplace ? b->dsend : b->drecv, cnt * es);
        snprintf(what, sizeof what, "%s root %d count %zu", inplace ? "ncclBcast" : "ncclBroadcast",
                 c.root, cnt);
        check_elems(what, t, h, cnt, want_bcast, &c);
      }
    }
  }
}

/* The calls brigade lacks and bad arguments: the right code, and
 * ncclGetLastError naming the call. */
static void refused(ncclComm_t comm, ncclResult_t got, ncclResult_t want, const char *text,
                    const char *call) {
  const char *m = ncclGetLastError(comm);
  if (got != want || !strstr(m, text))
    FAIL("%s: %s \"%s\", expected %s with \"%s\"", call, ncclGetErrorString(got), m,
         ncclGetErrorString(want), text);
}
#define REFUSED(call, want, text) refused(comm, (call), (want), (text), #call)

static void refusals(ncclComm_t comm, bufs *b) {
  int nr = 0;
  NCCL_OK(ncclCommCount(comm, &nr));
  REFUSED(ncclSend(b->dsend, 1, ncclFloat32, nr, comm, b->stream), ncclInvalidArgument, "peer");
  REFUSED(ncclRecv(b->drecv, 1, ncclFloat32, -1, comm, b->stream), ncclInvalidArgument, "peer");
  REFUSED(ncclAllReduce(b->dsend, b->drecv, 1, ncclFloat8e4m3, ncclSum, comm, b->stream),
          ncclInvalidArgument, "float8");
  REFUSED(ncclAllReduce(b->dsend, b->drecv, 1, (ncclDataType_t)99, ncclSum, comm, b->stream),
          ncclInvalidArgument, "datatype 99");
  REFUSED(
      ncclAllReduce(b->dsend, b->drecv, 1, ncclFloat32, (ncclRedOp_t)ncclNumOps, comm, b->stream),
      ncclInvalidArgument, "not a live ncclRedOpCreatePreMulSum op");
  REFUSED(ncclAllReduce(b->dsend, b->drecv, 1, ncclFloat32, ncclSum, NULL, b->stream),
          ncclInvalidArgument, "comm is NULL");
  REFUSED(ncclCommSplit(comm, 0, 0, NULL, NULL), ncclInvalidArgument, "newcomm is NULL");
  REFUSED(ncclGroupEnd(), ncclInvalidUsage, "without ncclGroupStart");
  /* nranks blocks of SIZE_MAX / 8 elements: no buffer has that many bytes. */
  REFUSED(ncclAlltoAll(b->dsend, b->drecv, SIZE_MAX / 8, ncclFloat64, comm, b->stream),
          ncclInvalidArgument, "too large");
  int v = 0, cnt = 0, rk = -1, dev = -1;
  NCCL_OK(ncclGetVersion(&v));
  if (v != NCCL_VERSION_CODE) FAIL("ncclGetVersion: %d, expected %d", v, NCCL_VERSION_CODE);
  NCCL_OK(ncclCommCount(comm, &cnt));
  NCCL_OK(ncclCommUserRank(comm, &rk));
  NCCL_OK(ncclCommCuDevice(comm, &dev));
  ncclResult_t async = ncclInternalError;
  NCCL_OK(ncclCommGetAsyncError(comm, &async));
  if (rk != g_rank || async != ncclSuccess)
    FAIL("ncclCommUserRank %d (rank %d), async error %s", rk, g_rank, ncclGetErrorString(async));
}

/* Element i of the message from rank src to rank dst: small integers,
 * exact in every dtype. */
static double p2p_val(size_t i, int src, int dst) {
  return (double)((i * 7 + (size_t)src * 3 + (size_t)dst * 11) % 50 + 1);
}

typedef struct p2p_want {
  int src, dst; /* src -1: block j (of `per` elements) came from rank j */
  size_t per;
} p2p_want;

static double want_p2p(size_t i, void *a) {
  p2p_want *w = a;
  if (w->src >= 0) return p2p_val(i, w->src, w->dst);
  return p2p_val(i % w->per, (int)(i / w->per), w->dst);
}

static void fill_p2p(char *h, int t, size_t cnt, int src, int dst) {
  for (size_t i = 0; i < cnt; i++) put(h, t, i, p2p_val(i, src, dst));
}

/* ncclSend / ncclRecv in a group (the receive issued first) around the
 * ring for every dtype and count; a crossed pair outside any group (both
 * send first); ncclAlltoAll out of place and in place. */
static void p2p(ncclComm_t comm, int rank, int n, bufs *b) {
  char *h = b->host, what[160];
  int next = (rank + 1) % n, prev = (rank - 1 + n) % n;
  for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++) {
    size_t cnt = counts[ci];
    for (int t = 0; t < (int)(sizeof types / sizeof types[0]); t++) {
      fill_p2p(h, t, cnt, rank, next);
      to_dev(b->dsend, h, cnt * type_bytes[t]);
      api->drv.mem_set(b->drecv, 0xee, cnt * type_bytes[t] + 1);
      NCCL_OK(ncclGroupStart());
      NCCL_OK(ncclRecv(b->drecv, cnt, types[t], prev, comm, b->stream));
      NCCL_OK(ncclSend(b->dsend, cnt, types[t], next, comm, b->stream));
      NCCL_OK(ncclGroupEnd());
      from_dev(h, b->drecv, cnt * type_bytes[t]);
      p2p_want w = {.src = prev, .dst = rank};
      snprintf(what, sizeof what, "ncclRecv from rank %d (count %zu)", prev, cnt);
      check_elems(what, t, h, cnt, want_p2p, &w);
    }
  }
  int peer = rank ^ 1;
  if (peer < n) {
    size_t cnt = counts[sizeof counts / sizeof counts[0] - 1];
    int t = 8; /* float64: the largest message */
    fill_p2p(h, t, cnt, rank, peer);
    to_dev(b->dsend, h, cnt * 8);
    NCCL_OK(ncclSend(b->dsend, cnt, types[t], peer, comm, b->stream));
    NCCL_OK(ncclRecv(b->drecv, cnt, types[t], peer, comm, b->stream));
    from_dev(h, b->drecv, cnt * 8);
    p2p_want w = {.src = peer, .dst = rank};
    check_elems("ncclSend then ncclRecv, both ranks, no group", t, h, cnt, want_p2p, &w);
  }
  static const size_t a2a_counts[] = {1, 4099};
  for (size_t ci = 0; ci < 2; ci++) {
    size_t cnt = a2a_counts[ci];
    for (int t = 0; t < (int)(sizeof types / sizeof types[0]); t++) {
      for (int inplace = 0; inplace < 2; inplace++) {
        size_t block = cnt * type_bytes[t];
        for (int j = 0; j < n; j++) fill_p2p(h + (size_t)j * block, t, cnt, rank, j);
        to_dev(b->dsend, h, block * (size_t)n);
        void *out = inplace ? b->dsend : b->drecv;
        NCCL_OK(ncclAlltoAll(b->dsend, out, cnt, types[t], comm, b->stream));
        from_dev(h, out, block * (size_t)n);
        p2p_want w = {.src = -1, .dst = rank, .per = cnt};
        snprintf(what, sizeof what, "ncclAlltoAll count %zu %s", cnt,
                 inplace ? "in place" : "out of place");
        check_elems(what, t, h, cnt * (size_t)n, want_p2p, &w);
      }
    }
  }
}

/* ncclRecv on device memory returns before its data is sent: rank 0's
 * receive from rank 1 (on stream s1) has not run when the call returns,
 * and rank 1 sends only after an allreduce (on s2) that rank 0 issues
 * after its receive returned; then every element is checked. A receive
 * that blocked until its data came would never let the allreduce start.
 * In a CUDA graph capture, ncclSend is refused by name. */
static void p2p_async(ncclComm_t comm, int rank, int n, bufs *b) {
  void *s1 = NULL, *s2 = NULL, *ev = NULL, *sig = NULL;
  if (api->drv.stream_create(&s1) || api->drv.stream_create(&s2) || api->drv.event_create(&ev)) {
    FAIL("stream_create / event_create failed");
    return;
  }
  NCCL_OK(ncclMemAlloc(&sig, sizeof(float)));
  size_t cnt = 4099;
  int t = 7; /* float32 */
  char *h = b->host;
  if (rank == 0) {
    api->drv.mem_set(b->drecv, 0xee, cnt * 4);
    NCCL_OK(ncclRecv(b->drecv, cnt, ncclFloat32, 1, comm, s1));
    api->drv.event_record(ev, s1);
    int q = api->drv.event_query(ev);
    if (q != -1) FAIL("ncclRecv: the stream is past the receive before its data was sent (%d)", q);
  }
  NCCL_OK(ncclAllReduce(sig, sig, 1, ncclFloat32, ncclSum, comm, s2));
  api->drv.stream_sync(s2);
  if (rank == 1) {
    fill_p2p(h, t, cnt, 1, 0);
    to_dev(b->dsend, h, cnt * 4);
    NCCL_OK(ncclSend(b->dsend, cnt, ncclFloat32, 0, comm, s1));
  }
  api->drv.stream_sync(s1);
  if (rank == 0) {
    from_dev(h, b->drecv, cnt * 4);
    p2p_want w = {.src = 1, .dst = 0};
    check_elems("ncclRecv ordered on its stream", t, h, cnt, want_p2p, &w);
  }
  if (api->drv.capture_begin(s1, 0) == 0) {
    REFUSED(ncclSend(b->dsend, 1, ncclFloat32, (rank + 1) % n, comm, s1), ncclInvalidUsage,
            "CUDA graph");
    void *g = NULL;
    if (api->drv.capture_end(s1, &g) == 0 && g) api->drv.graph_destroy(g);
  }
  ncclMemFree(sig);
  api->drv.event_destroy(ev);
  api->drv.stream_destroy(s1);
  api->drv.stream_destroy(s2);
}

/* PreMulSum: rank r's input times its own scalar s_r, summed; s_r is
 * 0.5 (r + 1) for the float types (products and sums of small halves are
 * exact in every one) and r + 1 for int32. */
static double pm_scalar(int t, int r) {
  return types[t] == ncclInt32 ? r + 1 : 0.5 * (r + 1);
}

typedef struct pm_want {
  int t, n, mul; /* mul: rank r's scalar times mul (the device scalar rewritten) */
  size_t base;   /* the element's offset in the full input (reduce-scatter) */
} pm_want;

static double want_pm(size_t i, void *a) {
  pm_want *w = a;
  double acc = 0;
  for (int r = 0; r < w->n; r++) acc += w->mul * pm_scalar(w->t, r) * input(0, w->base + i, r);
  return acc;
}

/* Every float dtype and int32, the scalar on the host and on the device:
 * allreduce (out of place and in place), reduce-scatter and reduce; the
 * device scalar rewritten between two allreduces (read at each call). */
static void premul_sum(ncclComm_t comm, int rank, int n, bufs *b) {
  static const int pm_types[] = {6, 7, 8, 9, 2}; /* f16 f32 f64 bf16 i32 */
  char *h = b->host, what[160];
  size_t cnt = 4099;
  void *dscalar = NULL;
  NCCL_OK(ncclMemAlloc(&dscalar, 8));
  for (size_t ti = 0; ti < sizeof pm_types / sizeof pm_types[0]; ti++) {
    int t = pm_types[ti];
    size_t es = type_bytes[t];
    char sc[8];
    put(sc, t, 0, pm_scalar(t, rank));
    for (int on_dev = 0; on_dev < 2; on_dev++) {
      ncclRedOp_t op;
      to_dev(dscalar, sc, es);
      NCCL_OK(ncclRedOpCreatePreMulSum(&op, on_dev ? dscalar : (void *)sc, types[t],
                                       on_dev ? ncclScalarDevice : ncclScalarHostImmediate, comm));
      for (int inplace = 0; inplace < 2; inplace++) {
        for (size_t i = 0; i < cnt; i++) put(h, t, i, input(0, i, rank));
        to_dev(b->dsend, h, cnt * es);
        void *out = inplace ? b->dsend : b->drecv;
        NCCL_OK(ncclAllReduce(b->dsend, out, cnt, types[t], op, comm, b->stream));
        from_dev(h, out, cnt * es);
        pm_want w = {.t = t, .n = n, .mul = 1};
        snprintf(what, sizeof what, "PreMulSum allreduce (%s scalar, %s)",
                 on_dev ? "device" : "host", inplace ? "in place" : "out of place");
        check_elems(what, t, h, cnt, want_pm, &w);
      }
      /* reduce-scatter: n blocks of cnt */
      for (size_t i = 0; i < cnt * (size_t)n; i++) put(h, t, i, input(0, i, rank));
      to_dev(b->dsend, h, cnt * (size_t)n * es);
      NCCL_OK(ncclReduceScatter(b->dsend, b->drecv, cnt, types[t], op, comm, b->stream));
      from_dev(h, b->drecv, cnt * es);
      pm_want w = {.t = t, .n = n, .mul = 1, .base = (size_t)rank * cnt};
      snprintf(what, sizeof what, "PreMulSum reduce-scatter (%s scalar)",
               on_dev ? "device" : "host");
      check_elems(what, t, h, cnt, want_pm, &w);
      for (size_t i = 0; i < cnt; i++) put(h, t, i, input(0, i, rank));
      to_dev(b->dsend, h, cnt * es);
      NCCL_OK(ncclReduce(b->dsend, b->drecv, cnt, types[t], op, n - 1, comm, b->stream));
      from_dev(h, b->drecv, cnt * es);
      w.base = 0;
      snprintf(what, sizeof what, "PreMulSum reduce to rank %d (%s scalar)", n - 1,
               on_dev ? "device" : "host");
      if (rank == n - 1) check_elems(what, t, h, cnt, want_pm, &w);
      if (on_dev) { /* twice the scalar, read at the next call */
        char sc2[8];
        put(sc2, t, 0, 2 * pm_scalar(t, rank));
        to_dev(dscalar, sc2, es);
        for (size_t i = 0; i < cnt; i++) put(h, t, i, input(0, i, rank));
        to_dev(b->dsend, h, cnt * es);
        NCCL_OK(ncclAllReduce(b->dsend, b->drecv, cnt, types[t], op, comm, b->stream));
        from_dev(h, b->drecv, cnt * es);
        w.mul = 2;
        check_elems("PreMulSum allreduce after the device scalar changed", t, h, cnt, want_pm, &w);
      }
      REFUSED(ncclAllReduce(b->dsend, b->drecv, 1, types[t == 7 ? 8 : 7], op, comm, b->stream),
              ncclInvalidArgument, "was made for");
      NCCL_OK(ncclRedOpDestroy(op, comm));
      REFUSED(ncclRedOpDestroy(op, comm), ncclInvalidArgument, "not a live PreMulSum");
    }
  }
  ncclRedOp_t op;
  REFUSED(ncclRedOpDestroy(ncclSum, comm), ncclInvalidArgument, "built-in");
  REFUSED(ncclRedOpCreatePreMulSum(&op, h, ncclFloat32, ncclScalarDevice, comm),
          ncclInvalidArgument, "not device memory");
  ncclMemFree(dscalar);
}

/* ncclCommSplit: even and odd ranks, each group ordered backwards by key;
 * an allreduce on the new communicator sums its members' ranks. */
static void split(ncclComm_t comm, int rank, int n, bufs *b) {
  ncclComm_t sub = NULL;
  NCCL_OK(ncclCommSplit(comm, rank % 2, n - rank, &sub, NULL));
  int cnt = 0, rk = -1, want_cnt = (n - rank % 2 + 1) / 2, want_rk = 0;
  for (int r = rank + 2; r < n; r += 2) want_rk++; /* higher old ranks come first */
  NCCL_OK(ncclCommCount(sub, &cnt));
  NCCL_OK(ncclCommUserRank(sub, &rk));
  if (cnt != want_cnt || rk != want_rk)
    FAIL("ncclCommSplit: rank %d of %d in the new communicator, expected %d of %d", rk, cnt,
         want_rk, want_cnt);
  float x = (float)rank, sum = 0;
  for (int r = rank % 2; r < n; r += 2) sum += (float)r;
  to_dev(b->dsend, &x, sizeof x);
  NCCL_OK(ncclAllReduce(b->dsend, b->drecv, 1, ncclFloat32, ncclSum, sub, b->stream));
  from_dev(&x, b->drecv, sizeof x);
  if (x != sum) FAIL("allreduce on the split communicator: %g, expected %g", x, sum);
  NCCL_OK(ncclCommDestroy(sub));
}

/* An allreduce of one float32 per rank, `x`, on comm: the sum. */
static float sum_one(ncclComm_t comm, bufs *b, float x) {
  to_dev(b->dsend, &x, sizeof x);
  NCCL_OK(ncclAllReduce(b->dsend, b->drecv, 1, ncclFloat32, ncclSum, comm, b->stream));
  from_dev(&x, b->drecv, sizeof x);
  return x;
}

/* The calls of NCCL 2.22 to 2.28: ncclCommInitRankScalable (two ids, the
 * second unused) and a non-blocking ncclCommInitRankConfig on ids rank 0
 * broadcast; windows; ncclGroupSimulateEnd; brigade's version beside
 * NCCL's; ncclCommShrink without rank 1 (which does not call it). */
ncclResult_t brg_nccl_get_version(int *brigade, int *nccl);
static void newer_calls(ncclComm_t comm, int rank, int n, bufs *b) {
  ncclUniqueId ids[2];
  memset(ids, 0, sizeof ids);
  if (rank == 0) NCCL_OK(ncclGetUniqueId(&ids[0]));
  if (rank == n - 1) NCCL_OK(ncclGetUniqueId(&ids[1]));
  for (int k = 0; k < 2; k++) {
    to_dev(b->dsend, &ids[k], sizeof ids[k]);
    NCCL_OK(ncclBroadcast(b->dsend, b->drecv, sizeof ids[k], ncclUint8, k ? n - 1 : 0, comm,
                          b->stream));
    from_dev(&ids[k], b->drecv, sizeof ids[k]);
  }
  ncclComm_t sc = NULL;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  NCCL_OK(ncclCommInitRankScalable(&sc, n, rank, 2, ids, &cfg));
  float want = (float)(n * (n - 1) / 2);
  float got = sum_one(sc, b, (float)rank);
  if (got != want) FAIL("allreduce on ncclCommInitRankScalable's: %g, expected %g", got, want);
  NCCL_OK(ncclCommDestroy(sc));

  /* Non-blocking: ncclInProgress until ncclCommGetAsyncError says it is made. */
  if (rank == 0) NCCL_OK(ncclGetUniqueId(&ids[0]));
  to_dev(b->dsend, &ids[0], sizeof ids[0]);
  NCCL_OK(ncclBroadcast(b->dsend, b->drecv, sizeof ids[0], ncclUint8, 0, comm, b->stream));
  from_dev(&ids[0], b->drecv, sizeof ids[0]);
  cfg.blocking = 0;
  ncclComm_t nb = NULL;
  ncclResult_t r = ncclCommInitRankConfig(&nb, n, ids[0], rank, &cfg);
  if (r != ncclInProgress && r != ncclSuccess)
    FAIL("non-blocking ncclCommInitRankConfig: %s: %s", ncclGetErrorString(r),
         ncclGetLastError(NULL));
  ncclResult_t state = ncclInProgress;
  while (state == ncclInProgress) {
    NCCL_OK(ncclCommGetAsyncError(nb, &state));
    if (state == ncclInProgress) usleep(1000);
  }
  if (state != ncclSuccess) FAIL("non-blocking init ended with %s", ncclGetErrorString(state));
  got = sum_one(nb, b, (float)rank);
  if (got != want) FAIL("allreduce on the non-blocking init's: %g, expected %g", got, want);
  NCCL_OK(ncclCommDestroy(nb));
  cfg.blocking = 7;
  REFUSED(ncclCommInitRankConfig(&nb, n, ids[0], rank, &cfg), ncclInvalidArgument, "blocking is 7");
  cfg.blocking = 1;
  cfg.magic = 0;
  REFUSED(ncclCommInitRankConfig(&nb, n, ids[0], rank, &cfg), ncclInvalidArgument,
          "NCCL_CONFIG_INITIALIZER");

  /* Windows: registered, used, deregistered once. */
  ncclWindow_t w = NULL, w2 = NULL;
  NCCL_OK(ncclCommWindowRegister(comm, b->dsend, b->bytes, &w, NCCL_WIN_COLL_SYMMETRIC));
  NCCL_OK(ncclCommWindowRegister(comm, b->drecv, b->bytes, &w2, NCCL_WIN_DEFAULT));
  got = sum_one(comm, b, 1.0f);
  if (got != (float)n) FAIL("allreduce on registered windows: %g, expected %d", got, n);
  NCCL_OK(ncclCommWindowDeregister(comm, w));
  REFUSED(ncclCommWindowDeregister(comm, w), ncclInvalidArgument, "not registered");
  REFUSED(ncclCommWindowRegister(comm, b->dsend, 8, &w, 0x40), ncclInvalidArgument, "winFlags");
  NCCL_OK(ncclCommWindowDeregister(comm, w2));

  /* Simulation: an empty group is estimated; one with a send is refused. */
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclGroupSimulateEnd(&sim));
  if (sim.estimatedTime != 0.0f) FAIL("empty group: estimatedTime %g", (double)sim.estimatedTime);
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclSend(b->dsend, 1, ncclFloat32, (rank + 1) % n, comm, b->stream));
  REFUSED(ncclGroupSimulateEnd(&sim), ncclInvalidUsage, "1 sends and receives");
  REFUSED(ncclCommRevoke(comm, 0), ncclInvalidUsage, "revoke");

  int bv = -1, nv = -1;
  NCCL_OK(brg_nccl_get_version(&bv, &nv));
  if (nv != NCCL_VERSION_CODE || bv < 0 || bv >= 10000 * 100)
    FAIL("brg_nccl_get_version: brigade %d, NCCL API %d", bv, nv);

  /* Shrink: rank 1 (when there are more than two) stays out. */
  int gone = n > 2 ? 1 : -1;
  if (rank != gone) {
    ncclComm_t sh = NULL;
    REFUSED(ncclCommShrink(comm, &rank, 1, &sh, NULL, 0), ncclInvalidArgument, "calling rank");
    REFUSED(ncclCommShrink(comm, &gone, 1, &sh, NULL, NCCL_SHRINK_ABORT), ncclInvalidUsage,
            "NCCL_SHRINK_ABORT");
    NCCL_OK(ncclCommShrink(comm, &gone, gone < 0 ? 0 : 1, &sh, NULL, NCCL_SHRINK_DEFAULT));
    int cnt = 0, rk = -1, want_rk = gone >= 0 && rank > gone ? rank - 1 : rank;
    NCCL_OK(ncclCommCount(sh, &cnt));
    NCCL_OK(ncclCommUserRank(sh, &rk));
    if (cnt != (gone < 0 ? n : n - 1) || rk != want_rk)
      FAIL("ncclCommShrink: rank %d of %d, expected %d of %d", rk, cnt, want_rk,
           gone < 0 ? n : n - 1);
    float w_sum = want - (gone < 0 ? 0.0f : (float)gone);
    got = sum_one(sh, b, (float)rank);
    if (got != w_sum) FAIL("allreduce on the shrunk communicator: %g, expected %g", got, w_sum);
    NCCL_OK(ncclCommDestroy(sh));
  }
}

/* The calls of NCCL 2.28's device API and of 2.29 (which PyPI torch 2.15
 * binds), declared here as NCCL's headers declare them (nccl.h of 2.29,
 * nccl_device/core.h): an older nccl.h lacks them. */
typedef struct {
  int nRanks, rank, stride;
} team_t;
#if NCCL_VERSION_CODE < 22907
typedef enum { statSuspend = 0, statSuspended = 1, statPersist = 2 } mem_stat_t;
ncclResult_t ncclCommSuspend(ncclComm_t comm, int flags);
ncclResult_t ncclCommResume(ncclComm_t comm);
ncclResult_t ncclCommMemStats(ncclComm_t comm, mem_stat_t stat, uint64_t *value);
ncclResult_t ncclWinGetUserPtr(ncclComm_t comm, ncclWindow_t win, void **outUserPtr);
ncclResult_t ncclGetPeerDevicePointer(ncclWindow_t window, size_t offset, int peer, void **outPtr);
ncclResult_t ncclGetLsaMultimemDevicePointer(ncclWindow_t window, size_t offset, void **outPtr);
ncclResult_t ncclPutSignal(const void *localbuff, size_t count, ncclDataType_t datatype, int peer,
                           ncclWindow_t peerWin, size_t peerWinOffset, int sigIdx, int ctx,
                           unsigned int flags, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclSignal(int peer, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm,
                        cudaStream_t stream);
ncclResult_t ncclCommGetUniqueId(ncclComm_t comm, ncclUniqueId *uniqueId);
ncclResult_t ncclCommGrow(ncclComm_t comm, int nRanks, const ncclUniqueId *uniqueId, int rank,
                          ncclComm_t *newcomm, ncclConfig_t *config);
#define NCCL_SUSPEND_MEM 0x01
#endif
ncclResult_t ncclDevCommCreate(ncclComm_t comm, const void *reqs, void *outDevComm);
ncclResult_t ncclLsaBarrierCreateRequirement(team_t team, int nBarriers, void *outHandle,
                                             void *outReq);
int ncclLLA2ACalcSlots(int maxElts, int maxEltSize);
team_t ncclTeamWorld(ncclComm_t comm);
team_t ncclTeamLsa(ncclComm_t comm);
team_t ncclTeamRail(ncclComm_t comm);
int ncclTeamRankToWorld(ncclComm_t comm, team_t team, int rank);
int ncclTeamRankToLsa(ncclComm_t comm, team_t team, int rank);

static void calls_229(ncclComm_t comm, int rank, int n, bufs *b) {
  /* Windows: the user's pointer; a peer's memory is reachable only for
   * this rank itself (its LSA team is itself), others NULL. */
  ncclWindow_t w = NULL;
  void *p = (void *)1;
  NCCL_OK(ncclCommWindowRegister(comm, b->dsend, b->bytes, &w, NCCL_WIN_COLL_SYMMETRIC));
  NCCL_OK(ncclWinGetUserPtr(comm, w, &p));
  if (p != b->dsend) FAIL("ncclWinGetUserPtr: %p, expected %p", p, b->dsend);
  for (int k = 0; k < n; k++) {
    p = (void *)1;
    NCCL_OK(ncclGetPeerDevicePointer(w, 16, k, &p));
    void *want = k == rank ? (char *)b->dsend + 16 : NULL;
    if (p != want) FAIL("ncclGetPeerDevicePointer(peer %d): %p, expected %p", k, p, want);
  }
  REFUSED(ncclGetPeerDevicePointer(w, 0, n, &p), ncclInvalidArgument, "peer");
  REFUSED(ncclGetPeerDevicePointer(w, b->bytes + 1, rank, &p), ncclInvalidArgument, "offset");
  REFUSED(ncclGetLsaMultimemDevicePointer(w, 0, &p), ncclInvalidUsage, "multicast");
  NCCL_OK(ncclCommWindowDeregister(comm, w));
  REFUSED(ncclWinGetUserPtr(comm, w, &p), ncclInvalidArgument, "not registered");
  REFUSED(ncclGetPeerDevicePointer(w, 0, rank, &p), ncclInvalidArgument, "not registered");

  /* Teams, by NCCL's formulas with an LSA team of one. */
  team_t world = ncclTeamWorld(comm), lsa = ncclTeamLsa(comm), rail = ncclTeamRail(comm);
  if (world.nRanks != n || world.rank != rank || world.stride != 1 || lsa.nRanks != 1 ||
      lsa.rank != 0 || rail.nRanks != n || rail.rank != rank || rail.stride != 1)
    FAIL("teams: world {%d %d %d}, lsa {%d %d %d}, rail {%d %d %d}", world.nRanks, world.rank,
         world.stride, lsa.nRanks, lsa.rank, lsa.stride, rail.nRanks, rail.rank, rail.stride);
  for (int k = 0; k < n; k++)
    if (ncclTeamRankToWorld(comm, world, k) != k || ncclTeamRankToWorld(comm, rail, k) != k)
      FAIL("ncclTeamRankToWorld(%d) is %d", k, ncclTeamRankToWorld(comm, world, k));
  if (ncclTeamRankToLsa(comm, lsa, 0) != 0 || ncclTeamRankToWorld(comm, lsa, 0) != rank)
    FAIL("the LSA team's rank 0 is LSA rank %d, world rank %d", ncclTeamRankToLsa(comm, lsa, 0),
         ncclTeamRankToWorld(comm, lsa, 0));
  /* One slot per 8 bytes of an element. */
  if (ncclLLA2ACalcSlots(32, 16) != 64 || ncclLLA2ACalcSlots(5, 1) != 5 ||
      ncclLLA2ACalcSlots(3, 9) != 6 || ncclLLA2ACalcSlots(-1, 8) != -1)
    FAIL("ncclLLA2ACalcSlots: %d %d %d %d", ncclLLA2ACalcSlots(32, 16), ncclLLA2ACalcSlots(5, 1),
         ncclLLA2ACalcSlots(3, 9), ncclLLA2ACalcSlots(-1, 8));

  /* What brigade has not: the device API and one-sided calls. */
  char dc[256];
  REFUSED(ncclDevCommCreate(comm, dc, dc), ncclInvalidUsage, "no device-side API");
  REFUSED(ncclLsaBarrierCreateRequirement(lsa, 1, dc, dc), ncclInvalidUsage, "no device-side API");
  REFUSED(ncclSignal((rank + 1) % n, 0, 0, 0, comm, b->stream), ncclInvalidUsage, "one-sided");
  REFUSED(
      ncclPutSignal(b->dsend, 1, ncclFloat32, (rank + 1) % n, NULL, 0, 0, 0, 0, comm, b->stream),
      ncclInvalidUsage, "one-sided");

  /* Suspend: nothing released, calls refused until resumed. */
  uint64_t v = 7;
  NCCL_OK(ncclCommSuspend(comm, NCCL_SUSPEND_MEM));
  REFUSED(ncclAllReduce(b->dsend, b->drecv, 1, ncclFloat32, ncclSum, comm, b->stream),
          ncclInvalidUsage, "suspended");
  REFUSED(ncclCommSuspend(comm, NCCL_SUSPEND_MEM), ncclInvalidUsage, "suspended already");
  NCCL_OK(ncclCommMemStats(comm, statSuspended, &v));
  if (v != 1) FAIL("ncclCommMemStats(suspended) while suspended: %llu", (unsigned long long)v);
  NCCL_OK(ncclCommMemStats(comm, statSuspend, &v));
  if (v != 0) FAIL("ncclCommMemStats(suspendable bytes): %llu", (unsigned long long)v);
  REFUSED(ncclCommMemStats(comm, statPersist, &v), ncclInvalidUsage, "does not count");
  NCCL_OK(ncclCommResume(comm));
  REFUSED(ncclCommResume(comm), ncclInvalidUsage, "not suspended");
  NCCL_OK(ncclCommMemStats(comm, statSuspended, &v));
  if (v != 0) FAIL("ncclCommMemStats(suspended) after resume: %llu", (unsigned long long)v);
  float got = sum_one(comm, b, 1.0f);
  if (got != (float)n) FAIL("allreduce after ncclCommResume: %g, expected %d", got, n);
  /* The pnccl names are the same calls. */
  float x = 2.0f;
  to_dev(b->dsend, &x, sizeof x);
  NCCL_OK(pncclAllReduce(b->dsend, b->drecv, 1, ncclFloat32, ncclSum, comm, b->stream));
  from_dev(&x, b->drecv, sizeof x);
  if (x != 2.0f * (float)n) FAIL("pncclAllReduce: %g, expected %d", x, 2 * n);
}

/* ncclGather and ncclScatter: every root, dtype and count; block j of the
 * gathered buffer is rank j's, rank j gets block j of the root's. */
static void rooted(ncclComm_t comm, int rank, int n, bufs *b) {
  char *h = b->host, what[160];
  for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++) {
    size_t cnt = counts[ci];
    for (int t = 0; t < (int)(sizeof types / sizeof types[0]); t++) {
      size_t es = type_bytes[t];
      for (int root = 0; root < n; root++) {
        fill_p2p(h, t, cnt, rank, root);
        to_dev(b->dsend, h, cnt * es);
        NCCL_OK(ncclGather(b->dsend, b->drecv, cnt, types[t], root, comm, b->stream));
        if (rank == root) {
          from_dev(h, b->drecv, cnt * (size_t)n * es);
          p2p_want w = {-1, root, cnt};
          snprintf(what, sizeof what, "ncclGather root %d count %zu", root, cnt);
          check_elems(what, t, h, cnt * (size_t)n, want_p2p, &w);
        }
        for (int j = 0; rank == root && j < n; j++)
          fill_p2p(h + (size_t)j * cnt * es, t, cnt, root, j);
        if (rank == root) to_dev(b->dsend, h, cnt * (size_t)n * es);
        NCCL_OK(ncclScatter(b->dsend, b->drecv, cnt, types[t], root, comm, b->stream));
        from_dev(h, b->drecv, cnt * es);
        p2p_want w = {root, rank, 0};
        snprintf(what, sizeof what, "ncclScatter root %d count %zu", root, cnt);
        check_elems(what, t, h, cnt, want_p2p, &w);
      }
    }
  }
}

static void alloc_bufs(bufs *b, int n) {
  b->bytes = counts[sizeof counts / sizeof counts[0] - 1] * 8 * (size_t)n;
  NCCL_OK(ncclMemAlloc(&b->dsend, b->bytes));
  NCCL_OK(ncclMemAlloc(&b->drecv, b->bytes));
  b->host = malloc(b->bytes);
  b->stream = NULL; /* the legacy default stream, as nccl-tests' -y 1 */
  if (!b->host) exit(1);
}

static void free_bufs(bufs *b) {
  ncclMemFree(b->dsend);
  ncclMemFree(b->drecv);
  free(b->host);
}

static int open_api(void) {
  char why[256];
  api = brg__cuda_open(getenv("BRIGADE_CUDA_MODULE") ? getenv("BRIGADE_CUDA_MODULE") : "", why,
                       sizeof why);
  if (!api) fprintf(stderr, "no GPU: %s\n", why);
  return api != NULL;
}

static int rank_main(int rank, int n, const ncclUniqueId *id) {
  g_rank = rank;
  if (!open_api()) return 1;
  api->drv.set_device(rank % api->drv.probe(NULL, 0));
  ncclComm_t comm;
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclCommInitRank(&comm, n, *id, rank));
  NCCL_OK(ncclGroupEnd());
  bufs b;
  alloc_bufs(&b, n);
  collectives(comm, rank, n, &b);
  p2p(comm, rank, n, &b);
  rooted(comm, rank, n, &b);
  refusals(comm, &b);
  p2p_async(comm, rank, n, &b);
  premul_sum(comm, rank, n, &b);
  split(comm, rank, n, &b);
  newer_calls(comm, rank, n, &b);
  calls_229(comm, rank, n, &b);
  free_bufs(&b);
  NCCL_OK(ncclCommDestroy(comm));
  /* Destroyed twice: a clean error, not a use of freed memory (documented
   * as undefined once the address may name a new communicator). */
  REFUSED(ncclCommDestroy(comm), ncclInvalidArgument, "already destroyed");
  REFUSED(ncclCommCount(comm, &n), ncclInvalidArgument, "destroyed");
  printf("rank %d: %ld elements checked, %d failures\n", rank, g_checked, g_failures);
  return g_failures ? 1 : 0;
}

/* Ranks that call allreduces of 1000 and 1001 elements (kernel mode: the
 * call returns at once): ncclCommGetAsyncError reports the mismatch, and
 * ncclGetLastError names both calls. */
static int rank_mismatch(int rank, int n, const ncclUniqueId *id) {
  g_rank = rank;
  if (!open_api()) return 1;
  api->drv.set_device(rank % api->drv.probe(NULL, 0));
  ncclComm_t comm;
  void *d = NULL;
  NCCL_OK(ncclCommInitRank(&comm, n, *id, rank));
  NCCL_OK(ncclMemAlloc(&d, 1001 * sizeof(float)));
  NCCL_OK(ncclAllReduce(d, d, rank == 1 ? 1001 : 1000, ncclFloat32, ncclSum, comm, NULL));
  ncclResult_t async = ncclSuccess;
  for (int i = 0; i < 2000 && async == ncclSuccess; i++) {
    NCCL_OK(ncclCommGetAsyncError(comm, &async));
    if (async == ncclSuccess) usleep(5000);
  }
  const char *m = ncclGetLastError(comm);
  printf("rank %d: mismatched allreduce: async error %s: %s\n", rank, ncclGetErrorString(async), m);
  if (async != ncclInvalidUsage && async != ncclRemoteError)
    FAIL("mismatched allreduce: ncclCommGetAsyncError said %s within 10 s",
         ncclGetErrorString(async));
  else if (async == ncclInvalidUsage && (!strstr(m, "count 1000,") || !strstr(m, "count 1001,")))
    FAIL("ncclGetLastError does not name both calls: %s", m);
  api->drv.stream_sync(NULL);
  ncclCommDestroy(comm);
  ncclMemFree(d);
  return g_failures ? 1 : 0;
}

/* ncclCommGrow: ranks 0 .. n-2 make a communicator, rank 0 makes a grow id
 * (ncclCommGetUniqueId) and hands it to rank n-1 (here through shared
 * memory, as a job would through its launcher), which joins at rank n-1;
 * the others keep their ranks, rank 0 passing the id and the rest NULL. */
typedef struct grow_shared {
  volatile int ready;
  ncclUniqueId id;
} grow_shared;
static int rank_grow(int rank, int n, const ncclUniqueId *id, grow_shared *g) {
  g_rank = rank;
  if (!open_api()) return 1;
  api->drv.set_device(rank % api->drv.probe(NULL, 0));
  bufs b;
  alloc_bufs(&b, n);
  ncclComm_t comm = NULL, grown = NULL;
  if (rank < n - 1) {
    NCCL_OK(ncclCommInitRank(&comm, n - 1, *id, rank));
    float got = sum_one(comm, &b, (float)rank);
    if (got != (float)((n - 1) * (n - 2) / 2)) FAIL("allreduce before the grow: %g", got);
    REFUSED(ncclCommGrow(comm, n, NULL, 0, &grown, NULL), ncclInvalidArgument, "rank -1");
    REFUSED(ncclCommGrow(comm, n - 1, NULL, -1, &grown, NULL), ncclInvalidArgument,
            "not more than");
  }
  if (rank == 0) {
    ncclUniqueId gid, again;
    NCCL_OK(ncclCommGetUniqueId(comm, &gid));
    REFUSED(ncclCommGetUniqueId(comm, &again), ncclInvalidUsage, "one at a time");
    g->id = gid;
    __atomic_store_n(&g->ready, 1, __ATOMIC_RELEASE);
    NCCL_OK(ncclCommGrow(comm, n, &gid, -1, &grown, NULL));
  } else if (rank < n - 1) {
    NCCL_OK(ncclCommGrow(comm, n, NULL, -1, &grown, NULL));
  } else {
    while (!__atomic_load_n(&g->ready, __ATOMIC_ACQUIRE)) usleep(1000);
    ncclUniqueId gid = g->id;
    REFUSED(ncclCommGrow(NULL, n, &gid, n, &grown, NULL), ncclInvalidArgument, "rank");
    NCCL_OK(ncclCommGrow(NULL, n, &gid, rank, &grown, NULL));
  }
  int cnt = 0, rk = -1;
  NCCL_OK(ncclCommCount(grown, &cnt));
  NCCL_OK(ncclCommUserRank(grown, &rk));
  if (cnt != n || rk != rank)
    FAIL("grown communicator: rank %d of %d, expected %d of %d", rk, cnt, rank, n);
  float got = sum_one(grown, &b, (float)rank);
  if (got != (float)(n * (n - 1) / 2))
    FAIL("allreduce on the grown communicator: %g, expected %d", got, n * (n - 1) / 2);
  NCCL_OK(ncclCommDestroy(grown));
  if (comm) {
    got = sum_one(comm, &b, 1.0f); /* the parent still works */
    if (got != (float)(n - 1)) FAIL("allreduce on the parent after the grow: %g", got);
    NCCL_OK(ncclCommDestroy(comm));
  }
  free_bufs(&b);
  printf("rank %d: grow to %d ranks, %d failures\n", rank, n, g_failures);
  return g_failures ? 1 : 0;
}

/* ncclCommInitAll, and one thread driving every communicator in a group. */
static int init_all(int n) {
  g_rank = 0;
  if (!open_api()) return 1;
  ncclComm_t comms[8];
  int devs[8];
  int ngpu = api->drv.probe(NULL, 0);
  for (int i = 0; i < n; i++) devs[i] = i % ngpu;
  NCCL_OK(ncclCommInitAll(comms, n, devs));
  size_t cnt = 4099;
  void *d[8];
  float *h = malloc(cnt * sizeof *h);
  for (int i = 0; i < n; i++) {
    api->drv.set_device(devs[i]);
    NCCL_OK(ncclMemAlloc(&d[i], cnt * sizeof(float)));
    for (size_t k = 0; k < cnt; k++) h[k] = (float)input(0, k, i);
    api->drv.mem_copy(d[i], h, cnt * sizeof(float));
  }
  NCCL_OK(ncclGroupStart());
  for (int i = 0; i < n; i++) {
    api->drv.set_device(devs[i]);
    NCCL_OK(ncclAllReduce(d[i], d[i], cnt, ncclFloat32, ncclSum, comms[i], NULL));
  }
  NCCL_OK(ncclGroupEnd());
  /* One thread, one group: communicator i sends its result to i + 1 and
   * receives i - 1's (the receives issued first). */
  void *e[8];
  for (int i = 0; i < n; i++) {
    api->drv.set_device(devs[i]);
    NCCL_OK(ncclMemAlloc(&e[i], cnt * sizeof(float)));
  }
  NCCL_OK(ncclGroupStart());
  for (int i = 0; i < n; i++)
    NCCL_OK(ncclRecv(e[i], cnt, ncclFloat32, (i - 1 + n) % n, comms[i], NULL));
  for (int i = 0; i < n; i++)
    NCCL_OK(ncclSend(d[i], cnt, ncclFloat32, (i + 1) % n, comms[i], NULL));
  NCCL_OK(ncclGroupEnd());
  for (int i = 0; i < n; i++) {
    api->drv.set_device(devs[i]);
    api->drv.stream_sync(NULL);
    for (int pass = 0; pass < 2; pass++) {
      api->drv.mem_copy(h, pass ? e[i] : d[i], cnt * sizeof(float));
      for (size_t k = 0; k < cnt; k++)
        if (h[k] != (float)expect(0, k, n)) {
          FAIL("ncclCommInitAll: communicator %d %s element %zu is %g, expected %g", i,
               pass ? "(received in a group)" : "", k, h[k], expect(0, k, n));
          break;
        }
    }
    ncclMemFree(e[i]);
    ncclMemFree(d[i]);
    NCCL_OK(ncclCommDestroy(comms[i]));
  }
  free(h);
  printf("%s all (%d communicators, one thread)\n", g_failures ? "FAIL" : "ok", n);
  return g_failures ? 1 : 0;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s ranks|all|mismatch|grow N\n", argv[0]);
    return 2;
  }
  int n = atoi(argv[2]);
  if (n < 1 || n > 8) return fprintf(stderr, "N must be 1..8\n"), 2;
  /* Look for a GPU in a child: CUDA must not start in this process before
   * the ranks are forked. */
  pid_t pid = fork();
  if (pid == 0) _exit(open_api() ? 0 : getenv("BRIGADE_TEST_NO_SKIP") ? 1 : 77);
  int st = 0;
  if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st)) return 1;
  if (WEXITSTATUS(st)) return WEXITSTATUS(st);
  if (!strcmp(argv[1], "all")) return init_all(n);

  /* The ranks are forked first; the id reaches them through shared memory. */
  struct shared {
    volatile int ready;
    ncclUniqueId id;
    grow_shared grow;
  } *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (sh == MAP_FAILED) return 1;
  pid_t kids[8];
  for (int r = 0; r < n; r++) {
    kids[r] = fork();
    if (kids[r] == 0) {
      while (!__atomic_load_n(&sh->ready, __ATOMIC_ACQUIRE)) usleep(1000);
      _exit(!strcmp(argv[1], "mismatch") ? rank_mismatch(r, n, &sh->id)
            : !strcmp(argv[1], "grow")   ? rank_grow(r, n, &sh->id, &sh->grow)
                                         : rank_main(r, n, &sh->id));
    }
  }
  if (ncclGetUniqueId(&sh->id) != ncclSuccess) {
    fprintf(stderr, "ncclGetUniqueId: %s\n", ncclGetLastError(NULL));
    for (int r = 0; r < n; r++) kill(kids[r], SIGKILL);
    return 1;
  }
  __atomic_store_n(&sh->ready, 1, __ATOMIC_RELEASE);
  int rc = 0;
  for (int r = 0; r < n; r++) {
    if (waitpid(kids[r], &st, 0) != kids[r] || !WIFEXITED(st) || WEXITSTATUS(st)) {
      fprintf(stderr, "rank %d failed (status %d)\n", r, st);
      rc = 1;
    }
  }
  printf("%s %s (%d ranks)\n", rc ? "FAIL" : "ok", argv[1], n);
  return rc;
}
