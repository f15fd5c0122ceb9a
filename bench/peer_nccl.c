/*
 * --peer nccl: NCCL timed beside brigade on the same GPU buffers (-G), under
 * brigade-run.
 *
 * libnccl.so.2 is opened with dlopen() when the peer starts, so the
 * benchmarks neither link against NCCL nor CUDA and run on machines that
 * have neither; nccl.h is used for its types only. Rank 0 makes NCCL's
 * unique id and broadcasts it over brigade (host memory), then every rank
 * joins NCCL's communicator on the device the run already uses.
 *
 * NCCL has every dtype and op brigade has, and takes its buffers in the
 * in-place layout common.c already uses, so every row runs and buffers pass
 * straight through. Calls are enqueued on the benchmark's stream; the driver
 * synchronizes it for timing.
 */
#include "peer.h"

#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <string.h>

#include <nccl.h>

#ifndef BENCH_NCCL_FALLBACK
#define BENCH_NCCL_FALLBACK "/usr/local/cuda/lib64/libnccl.so.2"
#endif

/* The entry points, typed from nccl.h's declarations; nothing links them. */
#define NCCL_FN(name) __typeof__(&name)

static struct {
  void *lib;
  char path[512];
  int version;
  ncclComm_t comm;
  int rank;
  NCCL_FN(ncclGetVersion) get_version;
  NCCL_FN(ncclGetUniqueId) get_unique_id;
  NCCL_FN(ncclCommInitRank) comm_init_rank;
  NCCL_FN(ncclCommFinalize) comm_finalize; /* optional (NCCL >= 2.14) */
  NCCL_FN(ncclCommDestroy) comm_destroy;
  NCCL_FN(ncclGetErrorString) error_string;
  NCCL_FN(ncclGetLastError) last_error; /* optional (NCCL >= 2.13) */
  NCCL_FN(ncclAllReduce) allreduce;
  NCCL_FN(ncclReduceScatter) reduce_scatter;
  NCCL_FN(ncclAllGather) all_gather;
  NCCL_FN(ncclBroadcast) broadcast;
  NCCL_FN(ncclReduce) reduce;
} g;

static ncclDataType_t nccl_type(brg_dtype dt) {
  switch (dt) {
  case BRG_INT8: return ncclInt8;
  case BRG_UINT8: return ncclUint8;
  case BRG_INT32: return ncclInt32;
  case BRG_UINT32: return ncclUint32;
  case BRG_INT64: return ncclInt64;
  case BRG_UINT64: return ncclUint64;
  case BRG_FLOAT16: return ncclFloat16;
  case BRG_BFLOAT16: return ncclBfloat16;
  case BRG_FLOAT32: return ncclFloat32;
  case BRG_FLOAT64: return ncclFloat64;
  default: return ncclNumTypes;
  }
}

static ncclRedOp_t nccl_op(brg_op op) {
  switch (op) {
  case BRG_SUM: return ncclSum;
  case BRG_PROD: return ncclProd;
  case BRG_MIN: return ncclMin;
  case BRG_MAX: return ncclMax;
  case BRG_AVG: return ncclAvg;
  default: return ncclNumOps;
  }
}

static int nccl_fail(const char *what, ncclResult_t rc) {
  const char *last = g.last_error ? g.last_error(g.comm) : NULL;
  fprintf(stderr, "peer nccl: rank %d: %s failed: %s%s%s\n", g.rank, what, g.error_string(rc),
          last && *last ? ": " : "", last && *last ? last : "");
  return -1;
}

static void *sym(const char *name, int required) {
  void *p = dlsym(g.lib, name);
  if (p == NULL && required)
    fprintf(stderr, "peer nccl: %s has no %s: %s\n", g.path, name, dlerror());
  return p;
}

/* Opens libnccl.so.2 (the loader's search path, then the toolkit's copy
 * found at build time) and resolves what the peer calls. */
static int load(void) {
  const char *tried[] = {"libnccl.so.2", BENCH_NCCL_FALLBACK};
  char err[512] = "";
  for (size_t i = 0; i < sizeof tried / sizeof tried[0] && g.lib == NULL; i++) {
    g.lib = dlopen(tried[i], RTLD_NOW | RTLD_LOCAL);
    if (g.lib == NULL) snprintf(err, sizeof err, "%s", dlerror());
  }
  if (g.lib == NULL) {
    fprintf(stderr, "peer nccl: cannot open libnccl.so.2 (nor %s): %s\n", BENCH_NCCL_FALLBACK, err);
    return -1;
  }
  struct link_map *lm = NULL;
  int named = dlinfo(g.lib, RTLD_DI_LINKMAP, &lm) == 0 && lm != NULL && lm->l_name[0];
  snprintf(g.path, sizeof g.path, "%s", named ? lm->l_name : "libnccl.so.2");

  g.get_version = (NCCL_FN(ncclGetVersion))sym("ncclGetVersion", 1);
  g.get_unique_id = (NCCL_FN(ncclGetUniqueId))sym("ncclGetUniqueId", 1);
  g.comm_init_rank = (NCCL_FN(ncclCommInitRank))sym("ncclCommInitRank", 1);
  g.comm_finalize = (NCCL_FN(ncclCommFinalize))sym("ncclCommFinalize", 0);
  g.comm_destroy = (NCCL_FN(ncclCommDestroy))sym("ncclCommDestroy", 1);
  g.error_string = (NCCL_FN(ncclGetErrorString))sym("ncclGetErrorString", 1);
  g.last_error = (NCCL_FN(ncclGetLastError))sym("ncclGetLastError", 0);
  g.allreduce = (NCCL_FN(ncclAllReduce))sym("ncclAllReduce", 1);
  g.reduce_scatter = (NCCL_FN(ncclReduceScatter))sym("ncclReduceScatter", 1);
  g.all_gather = (NCCL_FN(ncclAllGather))sym("ncclAllGather", 1);
  g.broadcast = (NCCL_FN(ncclBroadcast))sym("ncclBroadcast", 1);
  g.reduce = (NCCL_FN(ncclReduce))sym("ncclReduce", 1);
  if (!g.get_version || !g.get_unique_id || !g.comm_init_rank || !g.comm_destroy ||
      !g.error_string || !g.allreduce || !g.reduce_scatter || !g.all_gather || !g.broadcast ||
      !g.reduce) {
    dlclose(g.lib);
    g.lib = NULL;
    return -1;
  }
  if (g.get_version(&g.version) != ncclSuccess) g.version = 0;
  return 0;
}

static int open_peer(brg_comm *comm, int rank, int nranks) {
  g.rank = rank;
  if (!bench_device_mode()) {
    fprintf(stderr, "peer nccl: --peer nccl needs -G (GPU buffers)\n");
    return -1;
  }
  if (load() != 0) return -1;

  /* byte 0 says whether rank 0 got an id, so no rank waits in NCCL for it */
  unsigned char msg[1 + sizeof(ncclUniqueId)];
  memset(msg, 0, sizeof msg);
  if (rank == 0) {
    ncclUniqueId id;
    ncclResult_t rc = g.get_unique_id(&id);
    if (rc == ncclSuccess) {
      msg[0] = 1;
      memcpy(msg + 1, &id, sizeof id);
    } else {
      nccl_fail("ncclGetUniqueId", rc);
    }
  }
  brg_status st = brg_broadcast(msg, msg, sizeof msg, BRG_UINT8, 0, comm, NULL);
  if (st != BRG_SUCCESS) {
    fprintf(stderr, "peer nccl: brg_broadcast (unique id) failed: %s\n", brg_comm_last_error(comm));
    return -1;
  }
  if (!msg[0]) return -1;
  ncclUniqueId id;
  memcpy(&id, msg + 1, sizeof id);
  /* NCCL 2.28 refuses two ranks on one GPU: that shows up here */
  ncclResult_t rc = g.comm_init_rank(&g.comm, nranks, id, rank);
  if (rc != ncclSuccess) {
    g.comm = NULL;
    return nccl_fail("ncclCommInitRank", rc);
  }
  return 0;
}

static const char *nccl_describe(void) {
  static char buf[640];
  int v = g.version, major, minor, patch;
  if (v >= 10000) { /* NCCL_VERSION() after 2.8: X*10000 + Y*100 + Z */
    major = v / 10000;
    minor = v / 100 % 100;
  } else {
    major = v / 1000;
    minor = v / 100 % 10;
  }
  patch = v % 100;
  snprintf(buf, sizeof buf, "NCCL %d.%d.%d (%s)", major, minor, patch, g.path);
  return buf;
}

static const char *unsupported(bench_kind kind, brg_dtype dt, brg_op op, int in_place) {
  (void)in_place;
  /* both came with NCCL 2.10; the version read at open is what runs */
  if (op == BRG_AVG && g.version < 21000 &&
      (kind == BENCH_ALLREDUCE || kind == BENCH_REDUCE_SCATTER || kind == BENCH_REDUCE))
    return "NCCL before 2.10 has no average op";
  if (dt == BRG_BFLOAT16 && g.version < 21000) return "NCCL before 2.10 has no bfloat16 type";
  return NULL;
}

static int prepare(const bench_peer_call *pc) {
  (void)pc;
  return 0;
}

static int run(const bench_peer_call *pc) {
  const bench_call *c = &pc->c;
  ncclDataType_t t = nccl_type(c->dtype);
  ncclRedOp_t op = nccl_op(c->op);
  cudaStream_t s = (cudaStream_t)c->stream;
  ncclResult_t rc;
  const char *what;
  switch (pc->kind) {
  case BENCH_ALLREDUCE:
    what = "ncclAllReduce";
    rc = g.allreduce(c->send, c->recv, c->count, t, op, g.comm, s);
    break;
  case BENCH_REDUCE_SCATTER:
    what = "ncclReduceScatter";
    rc = g.reduce_scatter(c->send, c->recv, c->count, t, op, g.comm, s);
    break;
  case BENCH_ALL_GATHER:
    what = "ncclAllGather";
    rc = g.all_gather(c->send, c->recv, c->count, t, g.comm, s);
    break;
  case BENCH_BROADCAST:
    what = "ncclBroadcast";
    rc = g.broadcast(c->send, c->recv, c->count, t, c->root, g.comm, s);
    break;
  case BENCH_REDUCE:
    what = "ncclReduce";
    rc = g.reduce(c->send, c->recv, c->count, t, op, c->root, g.comm, s);
    break;
  default: return -1;
  }
  return rc == ncclSuccess ? 0 : nccl_fail(what, rc);
}

/* Finalize waits for every rank's outstanding work, so no rank frees its
 * connections while a neighbour still uses them. */
static void close_peer(void) {
  if (g.comm == NULL) return;
  ncclResult_t rc;
  if (g.comm_finalize != NULL && (rc = g.comm_finalize(g.comm)) != ncclSuccess)
    nccl_fail("ncclCommFinalize", rc);
  if ((rc = g.comm_destroy(g.comm)) != ncclSuccess) nccl_fail("ncclCommDestroy", rc);
  g.comm = NULL;
}

const bench_peer bench_peer_nccl = {
    .name = "nccl",
    .launcher = "brigade-run",
    .nalgs = 1,
    .algs = (const char *const[]){"auto"} /* NCCL picks ring, tree or NVLS itself */,
    .launch = NULL,
    .open = open_peer,
    .describe = nccl_describe,
    .unsupported = unsupported,
    .prepare = prepare,
    .run = run,
    .close = close_peer,
    .finalize = NULL,
};
