/*
 * libbrigade_nccl.so: brigade under NCCL's API (soname libnccl.so.2), so
 * that code written for NCCL (nccl-tests, frameworks that dlopen
 * libnccl.so.2) runs on brigade with LD_LIBRARY_PATH alone.
 *
 * It uses the public brigade.h, the toolkit's nccl.h for the types, and the
 * CUDA module's table (brg_cuda.h) for the little CUDA it needs: the
 * current device, ncclMemAlloc, and a first tiny collective at init.
 *
 * What maps how:
 *  - a communicator is a brg_comm; ncclCommInitAll makes its ranks as
 *    threads of this process, one per device;
 *  - collectives run on the stream given, as brigade's device collectives
 *    do; their host side runs on the communicator's progress thread
 *    (BRIGADE_DEVICE_PROXY=1 unless the environment says otherwise), so a
 *    call returns at once and one thread may drive several communicators
 *    inside ncclGroupStart/End, as NCCL allows;
 *  - the device ring is built at init by a one-element allreduce, so that
 *    no later call has to wait for the other ranks to set up theirs;
 *  - ncclGroupStart/End nest. Collectives need nothing from them (every
 *    call is already asynchronous); a communicator initialised inside a
 *    group (as nccl-tests does, one thread for several GPUs) is created at
 *    the outermost ncclGroupEnd, all of them at once, one thread each;
 *  - destroying a communicator waits for its ring neighbours to finish; one
 *    made together with others of this process (ncclCommInitAll, or
 *    several in one group) is destroyed on a thread of its own, so that one
 *    thread can destroy them in turn; the library waits for those threads
 *    when it is unloaded (at exit);
 *  - ncclCommSplit is brg_comm_split (the new communicator builds its
 *    device ring at its first collective);
 *  - ncclSend and ncclRecv on device buffers are ordered on their streams
 *    and run by the communicator's engine thread through pinned host
 *    memory (below): the call returns at once. The calls of a group on one
 *    communicator run together (their receives posted before their sends),
 *    so a group in which ranks send to and receive from each other cannot
 *    deadlock, even when one thread drives several communicators.
 *    ncclAlltoAll is such a group, as NCCL defines it. Host buffers are
 *    staged on the calling thread, which blocks;
 *  - ncclRedOpCreatePreMulSum: the scale is a kernel on the caller's
 *    stream before the sum (below);
 *  - ncclCommInitRankScalable takes the first of its ids (brigade's
 *    bootstrap gathers over a tree from one root); ncclConfig_t's
 *    `blocking` is honoured (0: init runs on a thread of its own, and
 *    ncclCommGetAsyncError says ncclInProgress until it is done); its other
 *    fields tune NCCL's own transports and are accepted;
 *  - ncclCommShrink makes a new communicator of the ranks kept, whose id
 *    the lowest of them sends the others on the parent's point-to-point
 *    links (the excluded ranks do not take part);
 *  - ncclGather and ncclScatter are brg_gather and brg_scatter: on device
 *    buffers staged through host memory by the calling thread, which waits
 *    for the stream and blocks until the result is in place;
 *  - ncclCommGrow initialises a new communicator on an id one rank made
 *    (ncclCommGetUniqueId) and broadcast on the old one; suspend releases
 *    nothing (brigade's device ring cannot be rebuilt by one rank) and
 *    refuses calls until resumed; the LSA team is the calling rank alone;
 *  - NCCL_* variables are taken as BRIGADE_* ones at the first call that
 *    reaches brigade (nccl_env.c);
 *  - calls brigade does not have (revoke, float8, the device API for user
 *    kernels, one-sided puts and signals, multicast memory,
 *    sends and receives in a CUDA graph capture, simulating a group that
 *    holds operations)
 *    return ncclInvalidUsage (ncclInvalidArgument for a float8 type), and
 *    ncclGetLastError says which; buffer registration (ncclCommRegister,
 *    ncclCommWindowRegister) is accepted and changes nothing, windows are
 *    recorded until deregistered;
 *  - brg_nccl_get_version gives brigade's version (ncclGetVersion gives
 *    the NCCL API's).
 */
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#include <nccl.h>

#include "brigade.h"
#include "cuda/brg_cuda.h"
#include "nccl_env.h"

#define EXPORT __attribute__((visibility("default")))

struct ncclWindow_vidmem {
  struct ncclComm *comm; /* the communicator it was registered with */
  void *buff;
  size_t size;
  int flags;
  struct ncclWindow_vidmem *next;
};

struct p2p_batch;

/* Pinned host memory mapped for the GPU: a batch's staging area. */
typedef struct staging {
  char *host, *dev;
  size_t bytes;
  struct staging *next;
} staging;

/* A communicator's point-to-point engine (below): one thread that runs
 * batches of sends and receives once their streams reach them. */
typedef struct p2p_engine {
  pthread_t th;
  int started, stop;
  pthread_mutex_t mu; /* the fields below and stop */
  pthread_cond_t cv;
  struct p2p_batch *head, *tail; /* queued, in issue order */
  struct p2p_batch *retired;     /* run; freed once their streams are past them */
  struct staging *pool;          /* staging areas of freed batches, registered still */
  int npool;
  ncclResult_t err; /* the first failure, for ncclCommGetAsyncError */
  char why[1024];
} p2p_engine;

/* A PreMulSum op (ncclRedOpCreatePreMulSum): its scalar, and the device
 * memory of its calls. */
typedef struct premul {
  int live;
  brg_dtype dt;
  int on_device;          /* ncclScalarDevice: read on the stream at each call */
  const void *dscalar;    /* that scalar */
  unsigned char value[8]; /* ncclScalarHostImmediate: read at creation */
  void *sbuf, *tmp;       /* the scalar repeated; the scaled input (reduce-scatter, reduce) */
  size_t scap, tcap;      /* their bytes */
  void *stream, *ev;      /* the stream of its last call, and an event recorded there after it */
  int ev_set;
} premul;
#define MAX_PREMUL 256

struct ncclComm {
  brg_comm *c;
  int device;
  int rank, nranks;
  int siblings; /* made with other communicators of this process at once */
  /* Non-blocking init (ncclConfig_t.blocking = 0): running on init_th
   * until init_done; calls other than ncclCommGetAsyncError wait for it. */
  pthread_t init_th;
  int init_started, init_joined, init_done;
  ncclResult_t init_r;
  char init_err[1024];
  pthread_mutex_t lock;              /* the fields below, and init_joined */
  struct ncclWindow_vidmem *windows; /* ncclCommWindowRegister's, not yet deregistered */
  p2p_engine eng;
  premul premuls[MAX_PREMUL]; /* op ncclNumOps + i is premuls[i] */
  void **dead;                /* device memory of PreMulSum ops, freed with the communicator */
  int ndead, capdead;
  int suspended;       /* ncclCommSuspend until ncclCommResume */
  int grow_id_pending; /* ncclCommGetUniqueId made an id no ncclCommGrow has taken yet */
  brg_unique_id grow_id;
};

/* Calls return at once, as NCCL's do, unless the user chose otherwise:
 * set when the library is loaded, before brigade reads its settings. */
__attribute__((constructor)) static void proxy_by_default(void) {
  setenv("BRIGADE_DEVICE_PROXY", "1", 0);
}

/* ---- errors ---------------------------------------------------------- */

static __thread char last_error[1024];

static ncclResult_t fail(ncclResult_t r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static ncclResult_t fail(ncclResult_t r, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  return r;
}

static ncclResult_t result_of(brg_status s) {
  switch (s) {
  case BRG_SUCCESS: return ncclSuccess;
  case BRG_IN_PROGRESS: return ncclInProgress;
  case BRG_ERR_INVALID_ARGUMENT: return ncclInvalidArgument;
  case BRG_ERR_INVALID_USAGE:
  case BRG_ERR_MISMATCH: return ncclInvalidUsage;
  case BRG_ERR_REMOTE:
  case BRG_ERR_TIMEOUT:
  case BRG_ERR_ABORTED: return ncclRemoteError;
  case BRG_ERR_INTERNAL: return ncclInternalError;
  default: return ncclSystemError;
  }
}

/* A brigade call's status, with its sentence kept for ncclGetLastError. */
static ncclResult_t check(const struct ncclComm *comm, brg_status s, const char *fn) {
  if (s == BRG_SUCCESS) return ncclSuccess;
  return fail(result_of(s), "%s: %s: %s", fn, brg_status_string(s),
              brg_comm_last_error(comm ? comm->c : NULL));
}

static ncclResult_t unsupported(const char *fn, const char *what) {
  return fail(ncclInvalidUsage, "%s: brigade has no %s (libbrigade_nccl.so)", fn, what);
}

EXPORT const char *ncclGetErrorString(ncclResult_t r) {
  switch (r) {
  case ncclSuccess: return "no error";
  case ncclUnhandledCudaError: return "unhandled cuda error";
  case ncclSystemError: return "unhandled system error";
  case ncclInternalError: return "internal error";
  case ncclInvalidArgument: return "invalid argument";
  case ncclInvalidUsage: return "invalid usage";
  case ncclRemoteError: return "remote process exited or there was a network error";
  case ncclInProgress: return "NCCL operation in progress";
  default: return "unknown result code";
  }
}

EXPORT const char *ncclGetLastError(ncclComm_t comm) {
  (void)comm;
  return last_error;
}

EXPORT ncclResult_t ncclGetVersion(int *version) {
  if (!version) return fail(ncclInvalidArgument, "ncclGetVersion: version is NULL");
  *version = NCCL_VERSION_CODE; /* the API this library implements */
  return ncclSuccess;
}

/* The version of brigade under this library (ncclGetVersion gives the
 * NCCL API it implements): *brigade as major * 10000 + minor * 100 +
 * patch, *nccl as ncclGetVersion's. Either may be NULL. */
EXPORT ncclResult_t brg_nccl_get_version(int *brigade, int *nccl) {
  int major = 0, minor = 0, patch = 0;
  brg_get_version(&major, &minor, &patch);
  if (brigade) *brigade = major * 10000 + minor * 100 + patch;
  if (nccl) *nccl = NCCL_VERSION_CODE;
  return ncclSuccess;
}

/* ---- the CUDA module ------------------------------------------------- */

static pthread_once_t cuda_once = PTHREAD_ONCE_INIT;
static const brg__cuda_api *cuda_api;
static char cuda_why[512];

static void cuda_open(void) {
  cuda_api = brg__cuda_open_beside((const void *)&brg_allreduce, cuda_why, sizeof cuda_why);
}

/* The module libbrigade.so opens too (one instance), or NULL. */
static const brg__cuda_api *cuda(void) {
  brg__nccl_env_apply(); /* before brigade reads its settings */
  pthread_once(&cuda_once, cuda_open);
  if (!cuda_api) fail(ncclUnhandledCudaError, "no usable CUDA module: %s", cuda_why);
  return cuda_api;
}

/* ---- dtypes and ops -------------------------------------------------- */

static int dtype_of(ncclDataType_t t, brg_dtype *out, const char *fn, ncclResult_t *r) {
  static const brg_dtype map[] = {
      [ncclInt8] = BRG_INT8,        [ncclUint8] = BRG_UINT8,     [ncclInt32] = BRG_INT32,
      [ncclUint32] = BRG_UINT32,    [ncclInt64] = BRG_INT64,     [ncclUint64] = BRG_UINT64,
      [ncclFloat16] = BRG_FLOAT16,  [ncclFloat32] = BRG_FLOAT32, [ncclFloat64] = BRG_FLOAT64,
      [ncclBfloat16] = BRG_BFLOAT16};
  if ((unsigned)t < sizeof map / sizeof map[0]) {
    *out = map[t];
    return 1;
  }
  if (t == ncclFloat8e4m3 || t == ncclFloat8e5m2)
    *r = fail(ncclInvalidArgument, "%s: brigade has no float8 types (datatype %d)", fn, (int)t);
  else
    *r = fail(ncclInvalidArgument, "%s: unknown datatype %d", fn, (int)t);
  return 0;
}

static int op_of(ncclRedOp_t op, brg_op *out, const char *fn, ncclResult_t *r) {
  switch (op) {
  case ncclSum: *out = BRG_SUM; return 1;
  case ncclProd: *out = BRG_PROD; return 1;
  case ncclMax: *out = BRG_MAX; return 1;
  case ncclMin: *out = BRG_MIN; return 1;
  case ncclAvg: *out = BRG_AVG; return 1;
  default:
    *r = (int)op >= ncclNumOps
             ? fail(ncclInvalidArgument,
                    "%s: reduction op %d is not a live ncclRedOpCreatePreMulSum op of this "
                    "communicator",
                    fn, (int)op)
             : fail(ncclInvalidArgument, "%s: unknown reduction op %d", fn, (int)op);
    return 0;
  }
}

/* The communicators handed out and not yet destroyed, so that one
 * destroyed (twice, or used after) is told without reading its memory.
 * (Its address may be handed out again to a new communicator; from then on
 * the old handle names the new one: no API can tell those apart.) */
static pthread_mutex_t live_lock = PTHREAD_MUTEX_INITIALIZER;
static const struct ncclComm **live;
static size_t nlive, live_cap;

static struct ncclComm *comm_new(void) {
  struct ncclComm *comm = calloc(1, sizeof *comm);
  if (!comm) return NULL;
  pthread_mutex_init(&comm->lock, NULL);
  pthread_mutex_init(&comm->eng.mu, NULL);
  pthread_cond_init(&comm->eng.cv, NULL);
  pthread_mutex_lock(&live_lock);
  if (nlive == live_cap) {
    size_t cap = live_cap ? 2 * live_cap : 16;
    const struct ncclComm **grown = realloc(live, cap * sizeof *grown);
    if (grown) {
      live = grown;
      live_cap = cap;
    }
  }
  int ok = nlive < live_cap;
  if (ok) live[nlive++] = comm;
  pthread_mutex_unlock(&live_lock);
  if (!ok) {
    free(comm);
    return NULL;
  }
  return comm;
}

/* Takes comm out of the table: 0 when it was not there (destroyed). */
static int comm_forget(const struct ncclComm *comm) {
  int found = 0;
  pthread_mutex_lock(&live_lock);
  for (size_t i = 0; i < nlive && !found; i++)
    if (live[i] == comm) {
      live[i] = live[--nlive];
      found = 1;
    }
  pthread_mutex_unlock(&live_lock);
  return found;
}

static int comm_live(const struct ncclComm *comm) {
  int found = 0;
  pthread_mutex_lock(&live_lock);
  for (size_t i = 0; i < nlive && !found; i++) found = live[i] == comm;
  pthread_mutex_unlock(&live_lock);
  return found;
}

/* Frees what comm holds besides its brg_comm, and comm. */
static void comm_free(struct ncclComm *comm) {
  free(comm->dead);
  while (comm->windows) {
    struct ncclWindow_vidmem *w = comm->windows;
    comm->windows = w->next;
    free(w);
  }
  pthread_mutex_destroy(&comm->lock);
  pthread_mutex_destroy(&comm->eng.mu);
  pthread_cond_destroy(&comm->eng.cv);
  free(comm);
}

static void comm_drop(struct ncclComm *comm) {
  comm_forget(comm);
  comm_free(comm);
}

/* Waits for a non-blocking init still running; its result. */
static ncclResult_t comm_settle(struct ncclComm *comm) {
  pthread_mutex_lock(&comm->lock);
  if (comm->init_started && !comm->init_joined) {
    pthread_join(comm->init_th, NULL);
    comm->init_joined = 1;
  }
  ncclResult_t r = comm->init_started ? comm->init_r : ncclSuccess;
  if (r != ncclSuccess) snprintf(last_error, sizeof last_error, "%s", comm->init_err);
  pthread_mutex_unlock(&comm->lock);
  return r;
}

static ncclResult_t comm_ok(const struct ncclComm *comm, const char *fn) {
  if (comm && !comm_live(comm))
    return fail(ncclInvalidArgument, "%s: comm was destroyed (or is not a communicator)", fn);
  if (comm && comm->init_started) {
    ncclResult_t r = comm_settle((struct ncclComm *)comm);
    if (r != ncclSuccess) return r;
  }
  return comm && comm->c ? ncclSuccess
                         : fail(ncclInvalidArgument, "%s: comm is NULL or destroyed", fn);
}

/* ---- ncclConfig_t ---------------------------------------------------- */

#define CONFIG_MAGIC 0xcafebeef
#define SIM_INFO_MAGIC 0x74685283u

/* Whether `field` (of `bytes` bytes at offset `off`) lies inside a config
 * of cfg->size bytes: a program built against an older nccl.h passes a
 * shorter struct. */
#define CONFIG_HAS(cfg, field) ((cfg)->size >= offsetof(ncclConfig_t, field) + sizeof((cfg)->field))

/* The fields of `cfg` (NULL: the defaults) brigade has: *blocking (1
 * unless cfg->blocking is 0). The others (CTA counts, network name,
 * traffic class, sharing) are tuning of NCCL's own transports and are
 * accepted and left alone. */
static ncclResult_t config_read(const ncclConfig_t *cfg, const char *fn, int *blocking) {
  *blocking = 1;
  if (!cfg) return ncclSuccess;
  if (cfg->magic != CONFIG_MAGIC)
    return fail(ncclInvalidArgument,
                "%s: config was not set from NCCL_CONFIG_INITIALIZER (magic 0x%x, expected 0x%x)",
                fn, cfg->magic, CONFIG_MAGIC);
  if (cfg->size < offsetof(ncclConfig_t, blocking))
    return fail(ncclInvalidArgument, "%s: config size %zu is too small", fn, cfg->size);
  if (CONFIG_HAS(cfg, blocking) && cfg->blocking != NCCL_CONFIG_UNDEF_INT) {
    if (cfg->blocking != 0 && cfg->blocking != 1)
      return fail(ncclInvalidArgument, "%s: config blocking is %d (0, 1 or undefined)", fn,
                  cfg->blocking);
    *blocking = cfg->blocking;
  }
  return ncclSuccess;
}

/* ---- communicators --------------------------------------------------- */

EXPORT ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  if (!id) return fail(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
  brg__nccl_env_apply(); /* before brigade reads its settings */
  _Static_assert(sizeof(ncclUniqueId) >= sizeof(brg_unique_id), "unique id too small");
  brg_unique_id b;
  brg_status s = brg_get_unique_id(&b);
  if (s != BRG_SUCCESS) return check(NULL, s, "ncclGetUniqueId");
  memset(id, 0, sizeof *id);
  memcpy(id->internal, b.internal, sizeof b.internal);
  return ncclSuccess;
}

/* Communicators initialised inside a group, created at its end. */
typedef struct pending_init {
  struct ncclComm *comm;
  int nranks, rank;
  ncclUniqueId id;
  ncclResult_t r;
  char err[1024];
  struct pending_init *next;
} pending_init;

static __thread int group_depth;
static __thread int group_colls; /* collectives issued inside the group */
static __thread pending_init *pending;

/* Sends and receives issued inside a group, run at its end. */
typedef struct pending_p2p {
  int is_send;
  void *buf; /* device memory */
  size_t count;
  brg_dtype dt;
  int peer;
  struct ncclComm *comm;
  cudaStream_t stream;
  struct pending_p2p *next;
} pending_p2p;
static __thread pending_p2p *p2p_head, *p2p_last;
static ncclResult_t run_p2p(void);
static void engine_stop(struct ncclComm *comm);
static void premul_free_all(struct ncclComm *comm);
static int reduction(struct ncclComm *comm, ncclRedOp_t op, brg_dtype dt, brg_op *bop, premul **pm,
                     const char *fn, ncclResult_t *r);
static ncclResult_t premul_scale(struct ncclComm *comm, premul *pm, const void *src, void *dst,
                                 size_t count, void *stream, const char *fn);
static void premul_after(premul *pm, void *stream);
static ncclResult_t grow(struct ncclComm *comm, void **buf, size_t *cap, size_t bytes,
                         int capturing, const char *fn, int *grown);

/* Fills `comm` (its device set): a brg_comm, its device ring built. */
static ncclResult_t init_now(struct ncclComm *comm, int nranks, const ncclUniqueId *id, int rank) {
  const brg__cuda_api *api = cuda();
  if (!api) return ncclUnhandledCudaError;
  if (api->drv.set_device(comm->device) != 0)
    return fail(ncclUnhandledCudaError, "ncclCommInitRank: cudaSetDevice(%d) failed", comm->device);
  brg_unique_id b;
  memcpy(b.internal, id->internal, sizeof b.internal);
  brg_status s = brg_comm_init(&comm->c, nranks, &b, rank);
  if (s != BRG_SUCCESS) return check(NULL, s, "ncclCommInitRank");
  comm->rank = rank;
  comm->nranks = nranks;
  /* The device ring, now: every rank is here, no later call (maybe in a
   * group driving several communicators from one thread) waits for it, and
   * the first collective may be captured in a CUDA graph. */
  s = brg_comm_device_setup(comm->c, comm->device);
  if (s != BRG_SUCCESS) {
    ncclResult_t r = check(comm, s, "ncclCommInitRank (building the device ring)");
    brg_comm_destroy(comm->c);
    comm->c = NULL;
    return r;
  }
  return ncclSuccess;
}

typedef struct bg_init {
  struct ncclComm *comm;
  int nranks, rank;
  ncclUniqueId id;
} bg_init;

static void *bg_init_main(void *arg) {
  bg_init *a = arg;
  struct ncclComm *comm = a->comm;
  ncclResult_t r = init_now(comm, a->nranks, &a->id, a->rank);
  if (r != ncclSuccess) snprintf(comm->init_err, sizeof comm->init_err, "%s", last_error);
  comm->init_r = r;
  __atomic_store_n(&comm->init_done, 1, __ATOMIC_RELEASE);
  free(a);
  return NULL;
}

/* A communicator on the current device: now, at the group's end, or (not
 * blocking) on a thread of its own, ncclInProgress until it is made. */
static ncclResult_t init_rank(ncclComm_t *out, int nranks, const ncclUniqueId *id, int rank,
                              const ncclConfig_t *config, const char *fn) {
  const brg__cuda_api *api = cuda();
  int blocking = 1;
  if (!out) return fail(ncclInvalidArgument, "%s: comm is NULL", fn);
  if (!id) return fail(ncclInvalidArgument, "%s: commId is NULL", fn);
  ncclResult_t r = config_read(config, fn, &blocking);
  if (r != ncclSuccess) return r;
  if (!api) return ncclUnhandledCudaError;
  struct ncclComm *comm = comm_new();
  if (!comm) return fail(ncclSystemError, "%s: out of memory", fn);
  if (api->drv.get_device(&comm->device) != 0) comm->device = 0;
  if (group_depth > 0) {
    pending_init *p = calloc(1, sizeof *p);
    if (!p) {
      comm_drop(comm);
      return fail(ncclSystemError, "%s: out of memory", fn);
    }
    *p = (pending_init){.comm = comm, .nranks = nranks, .rank = rank, .id = *id, .next = pending};
    pending = p;
    *out = comm;
    return ncclSuccess;
  }
  if (!blocking) {
    bg_init *a = malloc(sizeof *a);
    if (a) *a = (bg_init){.comm = comm, .nranks = nranks, .rank = rank, .id = *id};
    comm->init_started = a && pthread_create(&comm->init_th, NULL, bg_init_main, a) == 0;
    if (comm->init_started) {
      *out = comm;
      return ncclInProgress;
    }
    free(a); /* no thread: made here, as blocking */
  }
  r = init_now(comm, nranks, id, rank);
  if (r != ncclSuccess) {
    comm_drop(comm);
    return r;
  }
  *out = comm;
  return ncclSuccess;
}

static int count_pending(void) {
  int n = 0;
  for (pending_init *p = pending; p; p = p->next) n++;
  return n;
}

static void *pending_main(void *arg) {
  pending_init *p = arg;
  p->r = init_now(p->comm, p->nranks, &p->id, p->rank);
  snprintf(p->err, sizeof p->err, "%s", last_error);
  return NULL;
}

/* The group's communicators, each on a thread of its own (each init waits
 * for the others); the first error is returned. */
static ncclResult_t run_pending(void) {
  ncclResult_t r = ncclSuccess;
  int n = count_pending();
  for (pending_init *p = pending; p; p = p->next) p->comm->siblings = n > 1;
  pthread_t *th = calloc((size_t)n + 1, sizeof *th);
  int *started = calloc((size_t)n + 1, sizeof *started);
  int i = 0;
  for (pending_init *p = pending; p; p = p->next, i++)
    started[i] = th && started && pthread_create(&th[i], NULL, pending_main, p) == 0;
  i = 0;
  for (pending_init *p = pending; p; p = p->next, i++) {
    if (started && started[i])
      pthread_join(th[i], NULL);
    else
      pending_main(p); /* alone it waits for the others until the timeout */
    if (p->r != ncclSuccess && r == ncclSuccess) {
      r = p->r;
      snprintf(last_error, sizeof last_error, "%s", p->err);
    }
  }
  free(th);
  free(started);
  while (pending) {
    pending_init *p = pending;
    pending = p->next;
    free(p);
  }
  return r;
}

EXPORT ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank) {
  return init_rank(comm, nranks, &commId, rank, NULL, "ncclCommInitRank");
}

EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId,
                                           int rank, ncclConfig_t *config) {
  return init_rank(comm, nranks, &commId, rank, config, "ncclCommInitRankConfig");
}

/* Several ids speed up NCCL's bootstrap; brigade's gathers its table over
 * a tree of the ranks from one root, so every rank takes the first id (the
 * roots of the others, if this job made them, see no rank and close at
 * their timeout). */
EXPORT ncclResult_t ncclCommInitRankScalable(ncclComm_t *newcomm, int nranks, int myrank, int nId,
                                             ncclUniqueId *commIds, ncclConfig_t *config) {
  if (nId < 1 || !commIds)
    return fail(ncclInvalidArgument, "ncclCommInitRankScalable: nId is %d, commIds %s", nId,
                commIds ? "given" : "NULL");
  return init_rank(newcomm, nranks, commIds, myrank, config, "ncclCommInitRankScalable");
}

typedef struct init_all_arg {
  ncclComm_t *out;
  int ndev, dev, rank;
  const ncclUniqueId *id;
  ncclResult_t r;
  char err[1024];
} init_all_arg;

static void *init_all_main(void *p) {
  init_all_arg *a = p;
  struct ncclComm *comm = comm_new();
  a->r = comm ? ncclSuccess : fail(ncclSystemError, "ncclCommInitAll: out of memory");
  if (comm) {
    comm->device = a->dev;
    comm->siblings = a->ndev > 1;
    a->r = init_now(comm, a->ndev, a->id, a->rank);
    if (a->r == ncclSuccess)
      *a->out = comm;
    else
      comm_drop(comm);
  }
  snprintf(a->err, sizeof a->err, "%s", last_error);
  return NULL;
}

EXPORT ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist) {
  if (!comms || ndev < 1)
    return fail(ncclInvalidArgument, "ncclCommInitAll: comms is NULL or ndev %d < 1", ndev);
  const brg__cuda_api *api = cuda();
  if (!api) return ncclUnhandledCudaError;
  int ngpu = api->drv.probe(NULL, 0);
  for (int i = 0; i < ndev; i++) {
    int dev = devlist ? devlist[i] : i;
    if (dev < 0 || dev >= ngpu)
      return fail(ncclInvalidArgument, "ncclCommInitAll: device %d of %d visible", dev, ngpu);
  }
  ncclUniqueId id;
  ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) return r;
  init_all_arg *a = calloc((size_t)ndev, sizeof *a);
  pthread_t *th = calloc((size_t)ndev, sizeof *th);
  if (!a || !th) {
    free(a);
    free(th);
    return fail(ncclSystemError, "ncclCommInitAll: out of memory");
  }
  /* One thread per rank: each waits in init for all the others. */
  for (int i = 0; i < ndev; i++) {
    a[i] = (init_all_arg){.out = &comms[i], .ndev = ndev, .rank = i, .id = &id};
    a[i].dev = devlist ? devlist[i] : i;
    comms[i] = NULL;
    if (pthread_create(&th[i], NULL, init_all_main, &a[i]) != 0) {
      a[i].r = fail(ncclSystemError, "ncclCommInitAll: pthread_create failed");
      ndev = i; /* the ones started fail at the timeout; wait for them */
    }
  }
  r = ncclSuccess;
  for (int i = 0; i < ndev; i++) {
    pthread_join(th[i], NULL);
    if (a[i].r != ncclSuccess && r == ncclSuccess) {
      r = a[i].r;
      snprintf(last_error, sizeof last_error, "%s", a[i].err);
    }
  }
  if (r != ncclSuccess)
    for (int i = 0; i < ndev; i++)
      if (comms[i]) {
        brg_comm_destroy(comms[i]->c);
        free(comms[i]);
        comms[i] = NULL;
      }
  free(a);
  free(th);
  return r;
}

EXPORT ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  return comm_ok(comm, "ncclCommFinalize"); /* destroy does the rest */
}

/* Destroys running on threads of their own (siblings), joined at unload. */
static pthread_mutex_t reaper_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t reaper_done = PTHREAD_COND_INITIALIZER;
static int reapers;

static void *reaper_main(void *arg) {
  brg_comm_destroy(arg);
  pthread_mutex_lock(&reaper_lock);
  reapers--;
  pthread_cond_broadcast(&reaper_done);
  pthread_mutex_unlock(&reaper_lock);
  return NULL;
}

__attribute__((destructor)) static void wait_reapers(void) {
  pthread_mutex_lock(&reaper_lock);
  while (reapers > 0) pthread_cond_wait(&reaper_done, &reaper_lock);
  pthread_mutex_unlock(&reaper_lock);
}

EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  if (!comm_forget(comm))
    return fail(ncclInvalidArgument,
                "ncclCommDestroy: comm was already destroyed (or is not a communicator)");
  comm_settle(comm); /* a non-blocking init still running */
  engine_stop(comm);
  brg_status s = BRG_SUCCESS;
  pthread_t th;
  if (comm->c && comm->siblings) {
    pthread_mutex_lock(&reaper_lock);
    int started = pthread_create(&th, NULL, reaper_main, comm->c) == 0;
    if (started) {
      reapers++;
      pthread_detach(th);
    }
    pthread_mutex_unlock(&reaper_lock);
    if (!started) s = brg_comm_destroy(comm->c);
  } else if (comm->c) {
    s = brg_comm_destroy(comm->c);
  }
  comm->c = NULL;
  premul_free_all(comm);
  comm_free(comm);
  return check(NULL, s, "ncclCommDestroy");
}

EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  if (!comm_live(comm))
    return fail(ncclInvalidArgument,
                "ncclCommAbort: comm was already destroyed (or is not a communicator)");
  if (comm->c) brg_comm_abort(comm->c);
  return ncclCommDestroy(comm);
}

EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError) {
  if (!asyncError) return fail(ncclInvalidArgument, "ncclCommGetAsyncError: asyncError is NULL");
  if (comm && comm_live(comm) && comm->init_started &&
      !__atomic_load_n(&comm->init_done, __ATOMIC_ACQUIRE)) {
    *asyncError = ncclInProgress; /* a non-blocking init, still running */
    return ncclSuccess;
  }
  if (comm && comm_live(comm) && comm->init_started) {
    ncclResult_t ir = comm_settle(comm);
    if (ir != ncclSuccess) {
      *asyncError = ir; /* the init failed: ncclGetLastError says why */
      return ncclSuccess;
    }
  }
  ncclResult_t r = comm_ok(comm, "ncclCommGetAsyncError");
  if (r != ncclSuccess) return r;
  pthread_mutex_lock(&comm->eng.mu);
  ncclResult_t pr = comm->eng.err;
  if (pr != ncclSuccess) snprintf(last_error, sizeof last_error, "%s", comm->eng.why);
  pthread_mutex_unlock(&comm->eng.mu);
  if (pr != ncclSuccess) {
    *asyncError = pr; /* a send or receive on the stream failed */
    return ncclSuccess;
  }
  brg_status s = BRG_SUCCESS;
  brg_comm_get_async_error(comm->c, &s);
  *asyncError = result_of(s);
  if (s != BRG_SUCCESS) check(comm, s, "a collective");
  return ncclSuccess;
}

EXPORT ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
  ncclResult_t r = comm_ok(comm, "ncclCommCount");
  if (r == ncclSuccess && !count) r = fail(ncclInvalidArgument, "ncclCommCount: count is NULL");
  if (r == ncclSuccess) *count = comm->nranks;
  return r;
}

EXPORT ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device) {
  ncclResult_t r = comm_ok(comm, "ncclCommCuDevice");
  if (r == ncclSuccess && !device)
    r = fail(ncclInvalidArgument, "ncclCommCuDevice: device is NULL");
  if (r == ncclSuccess) *device = comm->device;
  return r;
}

EXPORT ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
  ncclResult_t r = comm_ok(comm, "ncclCommUserRank");
  if (r == ncclSuccess && !rank) r = fail(ncclInvalidArgument, "ncclCommUserRank: rank is NULL");
  if (r == ncclSuccess) *rank = comm->rank;
  return r;
}

/* ---- memory ---------------------------------------------------------- */

EXPORT ncclResult_t ncclMemAlloc(void **ptr, size_t size) {
  const brg__cuda_api *api = cuda();
  if (!ptr) return fail(ncclInvalidArgument, "ncclMemAlloc: ptr is NULL");
  if (!api) return ncclUnhandledCudaError;
  int e = api->drv.mem_alloc(ptr, size);
  return e ? fail(ncclUnhandledCudaError, "ncclMemAlloc: cudaMalloc(%zu): %s", size,
                  api->drv.error_string(e))
           : ncclSuccess;
}

EXPORT ncclResult_t ncclMemFree(void *ptr) {
  const brg__cuda_api *api = cuda();
  if (!api) return ncclUnhandledCudaError;
  int e = api->drv.mem_free(ptr);
  return e ? fail(ncclUnhandledCudaError, "ncclMemFree: %s", api->drv.error_string(e))
           : ncclSuccess;
}

EXPORT ncclResult_t ncclCommRegister(const ncclComm_t comm, void *buff, size_t size,
                                     void **handle) {
  (void)buff, (void)size;
  ncclResult_t r = comm_ok(comm, "ncclCommRegister");
  if (r == ncclSuccess && handle) *handle = NULL; /* nothing to register: accepted */
  return r;
}

EXPORT ncclResult_t ncclCommDeregister(const ncclComm_t comm, void *handle) {
  (void)handle;
  return comm_ok(comm, "ncclCommDeregister");
}

/* A window is NCCL's registration of a buffer for its symmetric kernels;
 * brigade's collectives take any buffer, so registering one records it
 * (for ncclCommWindowDeregister to check) and changes nothing else. */
EXPORT ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void *buff, size_t size,
                                           ncclWindow_t *win, int winFlags) {
  ncclResult_t r = comm_ok(comm, "ncclCommWindowRegister");
  if (r != ncclSuccess) return r;
  if (!win) return fail(ncclInvalidArgument, "ncclCommWindowRegister: win is NULL");
  *win = NULL;
  if (!buff && size)
    return fail(ncclInvalidArgument, "ncclCommWindowRegister: buff is NULL with size %zu", size);
  if (winFlags & ~(NCCL_WIN_DEFAULT | NCCL_WIN_COLL_SYMMETRIC))
    return fail(ncclInvalidArgument, "ncclCommWindowRegister: unknown winFlags 0x%x", winFlags);
  struct ncclWindow_vidmem *w = malloc(sizeof *w);
  if (!w) return fail(ncclSystemError, "ncclCommWindowRegister: out of memory");
  *w = (struct ncclWindow_vidmem){.comm = comm, .buff = buff, .size = size, .flags = winFlags};
  pthread_mutex_lock(&comm->lock);
  w->next = comm->windows;
  comm->windows = w;
  pthread_mutex_unlock(&comm->lock);
  *win = w;
  return ncclSuccess;
}

EXPORT ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  ncclResult_t r = comm_ok(comm, "ncclCommWindowDeregister");
  if (r != ncclSuccess) return r;
  struct ncclWindow_vidmem *found = NULL;
  pthread_mutex_lock(&comm->lock);
  for (struct ncclWindow_vidmem **p = &comm->windows; *p; p = &(*p)->next)
    if (*p == win) {
      found = win;
      *p = win->next;
      break;
    }
  pthread_mutex_unlock(&comm->lock);
  if (!found)
    return fail(ncclInvalidArgument,
                "ncclCommWindowDeregister: window %p is not registered with this communicator "
                "(deregistered already, or another communicator's)",
                (void *)win);
  free(found);
  return ncclSuccess;
}

/* ---- groups ---------------------------------------------------------- */

EXPORT ncclResult_t ncclGroupStart(void) {
  group_depth++;
  return ncclSuccess;
}

EXPORT ncclResult_t ncclGroupEnd(void) {
  if (group_depth == 0) return fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--group_depth > 0) return ncclSuccess;
  group_colls = 0;
  ncclResult_t r = pending ? run_pending() : ncclSuccess;
  ncclResult_t r2 = run_p2p(); /* runs (or drops, after a failed init) what was queued */
  return r != ncclSuccess ? r : r2;
}

/* NCCL's estimate of a group's time, without running it. brigade has it
 * for a group that holds no operation (its estimate is 0, and the
 * communicators initialised in it are made, as ncclGroupEnd makes them);
 * it has none for one that holds collectives (which brigade runs as they
 * are issued, so they have run) or sends and receives (which are dropped,
 * not run): ncclInvalidUsage, naming them. */
EXPORT ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t *simInfo) {
  if (group_depth == 0)
    return fail(ncclInvalidUsage, "ncclGroupSimulateEnd without ncclGroupStart");
  if (simInfo && simInfo->magic != SIM_INFO_MAGIC)
    return fail(ncclInvalidArgument,
                "ncclGroupSimulateEnd: simInfo was not set from NCCL_SIM_INFO_INITIALIZER (magic "
                "0x%x, expected 0x%x)",
                simInfo->magic, SIM_INFO_MAGIC);
  if (--group_depth > 0) return ncclSuccess;
  int colls = group_colls, p2ps = 0;
  group_colls = 0;
  while (p2p_head) {
    pending_p2p *op = p2p_head;
    p2p_head = op->next;
    free(op);
    p2ps++;
  }
  p2p_last = NULL;
  ncclResult_t r = pending ? run_pending() : ncclSuccess;
  if (r != ncclSuccess) return r;
  if (colls || p2ps)
    return fail(ncclInvalidUsage,
                "ncclGroupSimulateEnd: brigade has no cost model to simulate a group's operations "
                "(this group held %d collectives, which ran as they were issued, and %d sends and "
                "receives, which were dropped)",
                colls, p2ps);
  if (simInfo) simInfo->estimatedTime = 0.0f;
  return ncclSuccess;
}

/* ---- collectives ----------------------------------------------------- */

/* The common checks; 1 when the call may go on. */
static int prologue(const struct ncclComm *comm, ncclDataType_t t, brg_dtype *dt, const char *fn,
                    ncclResult_t *r) {
  if ((*r = comm_ok(comm, fn)) != ncclSuccess) return 0;
  if (comm->suspended) {
    *r = fail(ncclInvalidUsage,
              "%s: the communicator is suspended (ncclCommSuspend); call "
              "ncclCommResume first",
              fn);
    return 0;
  }
  if (group_depth > 0 && strcmp(fn, "ncclSend") && strcmp(fn, "ncclRecv")) group_colls++;
  return dtype_of(t, dt, fn, r);
}

EXPORT ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                                  ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                  cudaStream_t stream) {
  const char *fn = "ncclAllReduce";
  brg_dtype dt;
  brg_op bop;
  premul *pm;
  ncclResult_t r;
  if (!prologue(comm, datatype, &dt, fn, &r) || !reduction(comm, op, dt, &bop, &pm, fn, &r))
    return r;
  if (pm) { /* scaled into the receive buffer, summed there */
    if ((r = premul_scale(comm, pm, sendbuff, recvbuff, count, stream, fn)) != ncclSuccess)
      return r;
    sendbuff = recvbuff;
  }
  r = check(comm, brg_allreduce(sendbuff, recvbuff, count, dt, bop, comm->c, stream), fn);
  if (pm) premul_after(pm, stream);
  return r;
}

/* A PreMulSum's input, scaled into the op's own buffer. */
static ncclResult_t premul_input(struct ncclComm *comm, premul *pm, const void **sendbuff,
                                 size_t count, void *stream, const char *fn) {
  int capturing = 0, grown = 0;
  if (cuda_api->drv.stream_capturing(stream, &capturing) != 0) capturing = 0;
  ncclResult_t r =
      grow(comm, &pm->tmp, &pm->tcap, count * brg_dtype_size(pm->dt), capturing, fn, &grown);
  if (r == ncclSuccess) r = premul_scale(comm, pm, *sendbuff, pm->tmp, count, stream, fn);
  if (r == ncclSuccess) *sendbuff = pm->tmp;
  return r;
}

EXPORT ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                                      ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                      cudaStream_t stream) {
  const char *fn = "ncclReduceScatter";
  brg_dtype dt;
  brg_op bop;
  premul *pm;
  ncclResult_t r;
  if (!prologue(comm, datatype, &dt, fn, &r) || !reduction(comm, op, dt, &bop, &pm, fn, &r))
    return r;
  if (pm && recvcount > SIZE_MAX / (size_t)comm->nranks / brg_dtype_size(dt))
    return fail(ncclInvalidArgument, "%s: recvcount %zu is too large", fn, recvcount);
  if (pm && (r = premul_input(comm, pm, &sendbuff, recvcount * (size_t)comm->nranks, stream, fn)) !=
                ncclSuccess)
    return r;
  r = check(comm, brg_reduce_scatter(sendbuff, recvbuff, recvcount, dt, bop, comm->c, stream), fn);
  if (pm) premul_after(pm, stream);
  return r;
}

EXPORT ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                                  ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  brg_dtype dt;
  ncclResult_t r;
  if (!prologue(comm, datatype, &dt, "ncclAllGather", &r)) return r;
  return check(comm, brg_all_gather(sendbuff, recvbuff, sendcount, dt, comm->c, stream),
               "ncclAllGather");
}

EXPORT ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                                  ncclDataType_t datatype, int root, ncclComm_t comm,
                                  cudaStream_t stream) {
  brg_dtype dt;
  ncclResult_t r;
  if (!prologue(comm, datatype, &dt, "ncclBroadcast", &r)) return r;
  return check(comm, brg_broadcast(sendbuff, recvbuff, count, dt, root, comm->c, stream),
               "ncclBroadcast");
}

EXPORT ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root,
                              ncclComm_t comm, cudaStream_t stream) {
  return ncclBroadcast(buff, buff, count, datatype, root, comm, stream);
}

EXPORT ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count,
                               ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                               cudaStream_t stream) {
  const char *fn = "ncclReduce";
  brg_dtype dt;
  brg_op bop;
  premul *pm;
  ncclResult_t r;
  if (!prologue(comm, datatype, &dt, fn, &r) || !reduction(comm, op, dt, &bop, &pm, fn, &r))
    return r;
  if (pm && (r = premul_input(comm, pm, &sendbuff, count, stream, fn)) != ncclSuccess) return r;
  r = check(comm, brg_reduce(sendbuff, recvbuff, count, dt, bop, root, comm->c, stream), fn);
  if (pm) premul_after(pm, stream);
  return r;
}

/* ---- point-to-point and all-to-all, on the stream ------------------- */

/*
 * Sends and receives of device buffers are ordered on their streams and
 * run by the communicator's engine thread, so the call returns at once.
 * The calls of one group (or a lone call) on one communicator make a
 * batch, with a staging area of pinned host memory mapped for the GPU:
 * per stream of the batch (a leg), two words, then each operation's
 * data. At the call, each leg's stream gets
 *
 *   copy of each send's data into staging, write ready = 1,
 *   wait until done >= 1, copy of each receive's data out of staging,
 *   an event (the batch's memory is freed once every leg's has run)
 *
 * and the engine, once every leg's ready word is 1, posts the batch's
 * receives and sends (brigade's non-blocking host calls on the staging
 * area), waits for them and writes done = 1. Batches run in issue order.
 * Buffers in host memory take the staged, blocking path (p2p_now).
 */
#define P2P_MAX_LEGS 16
#define P2P_WORDS 256 /* bytes of words at the start of the staging area */
#define P2P_ALIGN 256
#define P2P_POOL 8 /* staging areas kept for reuse */

typedef struct p2p_batch {
  struct ncclComm *comm;
  int nops, nlegs, failed;
  pending_p2p *ops; /* their buf: the user's; staged at stage_off[k] */
  size_t *stage_off;
  void *leg_stream[P2P_MAX_LEGS];
  void *leg_ev[P2P_MAX_LEGS];
  char *host, *dev; /* the staging area, as the host and the GPU see it */
  size_t bytes;
  int registered;
  struct p2p_batch *next;
} p2p_batch;

static volatile uint32_t *batch_word(const p2p_batch *b, int leg, int done) {
  return (volatile uint32_t *)(void *)(b->host + 4 * (2 * leg + done));
}

static void batch_release(p2p_batch *b) {
  for (int l = 0; l < b->nlegs; l++) __atomic_store_n(batch_word(b, l, 1), 1, __ATOMIC_RELEASE);
}

/* Frees b once its legs' events have run (or, with wait, after they
 * have); 0 while it must be kept. */
static int batch_free(p2p_batch *b, int wait) {
  const brg__cuda_api *api = cuda_api;
  for (int l = 0; l < b->nlegs; l++) {
    if (!b->leg_ev[l]) continue;
    if (wait)
      api->drv.event_sync(b->leg_ev[l]);
    else if (api->drv.event_query(b->leg_ev[l]) != 0)
      return 0;
  }
  /* The staging area, still registered, to the pool (engine lock held):
   * unregistering may wait for the device, whose streams may wait for
   * this engine. */
  staging *a = b->registered ? malloc(sizeof *a) : NULL;
  if (a) {
    *a = (staging){.host = b->host, .dev = b->dev, .bytes = b->bytes, .next = b->comm->eng.pool};
    b->comm->eng.pool = a;
    b->comm->eng.npool++;
    b->host = NULL;
  } else if (b->registered) {
    api->drv.host_unregister(b->host);
  }
  for (int l = 0; l < b->nlegs; l++)
    if (b->leg_ev[l]) api->drv.event_destroy(b->leg_ev[l]);
  free(b->host);
  free(b->ops);
  free(b->stage_off);
  free(b);
  return 1;
}

/* Frees the retired batches whose streams are past them (engine lock held). */
static void reclaim(p2p_engine *e, int wait) {
  for (p2p_batch **p = &e->retired; *p;) {
    p2p_batch *b = *p;
    *p = b->next;
    if (!batch_free(b, wait)) {
      b->next = *p;
      *p = b;
      p = &b->next;
    }
  }
}

static void engine_fail(p2p_engine *e, ncclResult_t r, const char *why) {
  pthread_mutex_lock(&e->mu);
  if (e->err == ncclSuccess) {
    e->err = r;
    snprintf(e->why, sizeof e->why, "%s", why);
  }
  pthread_mutex_unlock(&e->mu);
}

/* Whether every leg's stream has reached the batch, polled until it has
 * or the engine stops. */
static int batch_wait_ready(p2p_engine *e, const p2p_batch *b) {
  for (int i = 0;; i++) {
    int ready = 1;
    for (int l = 0; l < b->nlegs && ready; l++)
      ready = __atomic_load_n(batch_word(b, l, 0), __ATOMIC_ACQUIRE) != 0;
    if (ready) return 1;
    if (__atomic_load_n(&e->stop, __ATOMIC_ACQUIRE)) return 0;
    if (i < 64)
      sched_yield();
    else
      usleep(i < 2000 ? 20 : 500);
  }
}

static void batch_run(struct ncclComm *comm, p2p_batch *b) {
  brg_request *req = calloc((size_t)b->nops, sizeof *req);
  int *posted = calloc((size_t)b->nops, sizeof *posted);
  brg_status first = BRG_SUCCESS;
  char why[1024] = "";
  if (!req || !posted) {
    first = BRG_ERR_NO_MEMORY;
    snprintf(why, sizeof why, "ncclSend/ncclRecv: out of memory");
  }
  /* Receives first, so that a peer's sends find them posted. */
  for (int pass = 0; pass < 2 && req && posted; pass++)
    for (int k = 0; k < b->nops; k++) {
      const pending_p2p *op = &b->ops[k];
      if (op->is_send != pass) continue;
      char *buf = b->host + b->stage_off[k];
      brg_status st = op->is_send ? brg_isend(buf, op->count, op->dt, op->peer, comm->c, &req[k])
                                  : brg_irecv(buf, op->count, op->dt, op->peer, comm->c, &req[k]);
      posted[k] = st == BRG_SUCCESS;
      if (st != BRG_SUCCESS && first == BRG_SUCCESS) {
        first = st;
        snprintf(why, sizeof why, "%s to/from rank %d: %s: %s",
                 op->is_send ? "ncclSend" : "ncclRecv", op->peer, brg_status_string(st),
                 brg_comm_last_error(comm->c));
      }
    }
  for (int k = 0; k < b->nops && req && posted; k++) {
    if (!posted[k]) continue;
    brg_status st = brg_wait(&req[k]);
    if (st != BRG_SUCCESS && first == BRG_SUCCESS) {
      first = st;
      snprintf(why, sizeof why, "%s to/from rank %d: %s: %s",
               b->ops[k].is_send ? "ncclSend" : "ncclRecv", b->ops[k].peer, brg_status_string(st),
               brg_comm_last_error(comm->c));
    }
  }
  if (first != BRG_SUCCESS) engine_fail(&comm->eng, result_of(first), why);
  free(req);
  free(posted);
}

static void *engine_main(void *arg) {
  struct ncclComm *comm = arg;
  p2p_engine *e = &comm->eng;
  cuda_api->drv.set_device(comm->device);
  pthread_mutex_lock(&e->mu);
  for (;;) {
    reclaim(e, 0);
    if (!e->head) {
      if (e->stop) break;
      if (e->retired) { /* look again soon: their streams move on */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 2000000;
        if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&e->cv, &e->mu, &ts);
      } else {
        pthread_cond_wait(&e->cv, &e->mu);
      }
      continue;
    }
    p2p_batch *b = e->head;
    pthread_mutex_unlock(&e->mu);
    if (!b->failed && batch_wait_ready(e, b)) batch_run(comm, b);
    batch_release(b); /* also when it failed or the engine stops: the streams go on */
    pthread_mutex_lock(&e->mu);
    e->head = b->next;
    if (!e->head) e->tail = NULL;
    b->next = e->retired;
    e->retired = b;
  }
  reclaim(e, 1);
  while (e->pool) {
    staging *a = e->pool;
    e->pool = a->next;
    cuda_api->drv.host_unregister(a->host);
    free(a->host);
    free(a);
  }
  e->npool = 0;
  pthread_mutex_unlock(&e->mu);
  return NULL;
}

/* Stops comm's engine: a batch whose streams have not reached it is not
 * run (its streams are let go). */
static void engine_stop(struct ncclComm *comm) {
  p2p_engine *e = &comm->eng;
  pthread_mutex_lock(&e->mu);
  int started = e->started;
  e->stop = 1;
  pthread_cond_broadcast(&e->cv);
  pthread_mutex_unlock(&e->mu);
  if (started) pthread_join(e->th, NULL);
  e->started = 0;
}

static ncclResult_t engine_start(struct ncclComm *comm) {
  p2p_engine *e = &comm->eng;
  ncclResult_t r = ncclSuccess;
  pthread_mutex_lock(&e->mu);
  if (!e->started && !e->stop) {
    e->started = pthread_create(&e->th, NULL, engine_main, comm) == 0;
    if (!e->started) r = fail(ncclSystemError, "ncclSend/ncclRecv: pthread_create failed");
  }
  pthread_mutex_unlock(&e->mu);
  return r;
}

static size_t align_up(size_t x, size_t a) {
  return (x + a - 1) / a * a;
}

/* The batch of comm's n operations ops[0..n) (device buffers), enqueued on
 * their streams and handed to the engine; the calling thread does not
 * wait for the peers. */
static ncclResult_t p2p_enqueue(struct ncclComm *comm, pending_p2p *const *ops, int n) {
  const brg__cuda_api *api = cuda();
  const char *fn = n == 1 && ops[0]->is_send ? "ncclSend" : n == 1 ? "ncclRecv" : "ncclGroupEnd";
  if (!api) return ncclUnhandledCudaError;
  ncclResult_t r = engine_start(comm);
  if (r != ncclSuccess) return r;
  p2p_batch *b = calloc(1, sizeof *b);
  if (b) b->ops = calloc((size_t)n, sizeof *b->ops);
  if (b) b->stage_off = calloc((size_t)n, sizeof *b->stage_off);
  if (!b || !b->ops || !b->stage_off) {
    if (b) free(b->ops), free(b->stage_off);
    free(b);
    return fail(ncclSystemError, "%s: out of memory", fn);
  }
  b->comm = comm;
  b->nops = n;
  size_t off = P2P_WORDS;
  for (int k = 0; k < n; k++) {
    b->ops[k] = *ops[k];
    b->ops[k].next = NULL;
    b->stage_off[k] = off;
    off += align_up(b->ops[k].count * brg_dtype_size(b->ops[k].dt), P2P_ALIGN);
    int l = 0;
    while (l < b->nlegs && b->leg_stream[l] != ops[k]->stream) l++;
    if (l == b->nlegs) {
      if (b->nlegs == P2P_MAX_LEGS) {
        batch_free(b, 1);
        return fail(ncclInvalidUsage,
                    "%s: a group's sends and receives on one communicator use "
                    "more than %d streams",
                    fn, P2P_MAX_LEGS);
      }
      b->leg_stream[b->nlegs++] = ops[k]->stream;
    }
  }
  for (int l = 0; l < b->nlegs; l++) {
    int capturing = 0;
    void *st = b->leg_stream[l];
    if (api->drv.stream_capturing(st, &capturing) == 0 && capturing) {
      batch_free(b, 1);
      return fail(ncclInvalidUsage,
                  "%s: brigade cannot capture sends and receives in a CUDA graph (stream %p is "
                  "capturing); collectives can be captured",
                  fn, st);
    }
  }
  b->bytes = align_up(off, 4096);
  /* A staging area from the pool, the smallest that fits; beyond
   * P2P_POOL areas, the oldest go (unregistered here, not on the engine). */
  p2p_engine *eng = &comm->eng;
  staging *got = NULL, *extra = NULL;
  pthread_mutex_lock(&eng->mu);
  staging **best = NULL;
  for (staging **p = &eng->pool; *p; p = &(*p)->next)
    if ((*p)->bytes >= b->bytes && (!best || (*p)->bytes < (*best)->bytes)) best = p;
  if (best) {
    got = *best;
    *best = got->next;
    eng->npool--;
  }
  if (eng->npool > P2P_POOL) {
    staging **p = &eng->pool;
    for (int k = 0; k < P2P_POOL; k++) p = &(*p)->next;
    extra = *p;
    *p = NULL;
    eng->npool = P2P_POOL;
  }
  pthread_mutex_unlock(&eng->mu);
  while (extra) {
    staging *a = extra;
    extra = a->next;
    api->drv.host_unregister(a->host);
    free(a->host);
    free(a);
  }
  int prev = -1;
  if (api->drv.get_device(&prev) != 0) prev = -1;
  const char *what = "cudaSetDevice";
  int e = api->drv.set_device(comm->device);
  if (got) {
    b->host = got->host;
    b->dev = got->dev;
    b->bytes = got->bytes;
    b->registered = 1;
    free(got);
  } else {
    b->host = aligned_alloc(4096, b->bytes);
    if (!b->host) {
      if (prev >= 0) api->drv.set_device(prev);
      batch_free(b, 1);
      return fail(ncclSystemError, "%s: out of memory for %zu bytes of staging", fn, b->bytes);
    }
    if (!e) {
      what = "cudaHostRegister";
      e = api->drv.host_register(b->host, b->bytes, (void **)&b->dev);
      b->registered = !e;
    }
  }
  memset(b->host, 0, P2P_WORDS);
  /* Each leg: its sends staged, ready, wait for done, its receives out. */
  for (int l = 0; l < b->nlegs && !e; l++) {
    void *st = b->leg_stream[l];
    for (int k = 0; k < n && !e; k++) {
      size_t bytes = b->ops[k].count * brg_dtype_size(b->ops[k].dt);
      if (b->ops[k].stream == st && b->ops[k].is_send && bytes)
        e = api->kern.copy(b->dev + b->stage_off[k], NULL, b->ops[k].buf, bytes, st), what = "copy";
    }
    if (!e) e = api->drv.stream_write_value(st, b->dev + 8 * l, 1), what = "cuStreamWriteValue32";
    if (!e) e = api->drv.stream_wait_value(st, b->dev + 8 * l + 4, 1), what = "cuStreamWaitValue32";
    for (int k = 0; k < n && !e; k++) {
      size_t bytes = b->ops[k].count * brg_dtype_size(b->ops[k].dt);
      if (b->ops[k].stream == st && !b->ops[k].is_send && bytes)
        e = api->kern.copy(b->ops[k].buf, NULL, b->dev + b->stage_off[k], bytes, st), what = "copy";
    }
    if (!e) e = api->drv.event_create(&b->leg_ev[l]), what = "cudaEventCreate";
    if (!e) e = api->drv.event_record(b->leg_ev[l], st), what = "cudaEventRecord";
  }
  if (prev >= 0) api->drv.set_device(prev);
  if (e) {
    r = fail(ncclUnhandledCudaError, "%s: %s: %s", fn, what, api->drv.error_string(e));
    if (!b->registered) {
      batch_free(b, 1);
      return r;
    }
    b->failed = 1; /* the engine lets its streams go and frees it */
  }
  pthread_mutex_lock(&eng->mu);
  if (eng->tail)
    eng->tail->next = b;
  else
    eng->head = b;
  eng->tail = b;
  pthread_cond_broadcast(&eng->cv);
  pthread_mutex_unlock(&eng->mu);
  return r;
}

/* Whether op's buffer is device memory (a count of 0 counts as such). */
static int on_device(const pending_p2p *op) {
  int dev = -1;
  return !op->count || cuda_api->drv.pointer_is_device(op->buf, &dev);
}

/* One send or receive of host memory: the stream's earlier work first,
 * then the data through a host buffer of the call's own; blocking. */
static ncclResult_t p2p_now(const pending_p2p *op) {
  const char *fn = op->is_send ? "ncclSend" : "ncclRecv";
  const brg__cuda_api *api = cuda();
  if (!api) return ncclUnhandledCudaError;
  size_t bytes = op->count * brg_dtype_size(op->dt);
  void *host = malloc(bytes ? bytes : 1);
  if (!host) return fail(ncclSystemError, "%s: out of memory for %zu bytes", fn, bytes);
  ncclResult_t r = ncclSuccess;
  /* The stream is the communicator's device's (a group may hold several). */
  int prev = -1;
  if (api->drv.get_device(&prev) != 0) prev = -1;
  int e = api->drv.set_device(op->comm->device);
  if (!e) e = api->drv.stream_sync(op->stream);
  if (!e && op->is_send && bytes) e = api->drv.mem_copy(host, op->buf, bytes);
  if (e) {
    r = fail(ncclUnhandledCudaError, "%s: %s", fn, api->drv.error_string(e));
  } else if (op->is_send) {
    r = check(op->comm, brg_send(host, op->count, op->dt, op->peer, op->comm->c, NULL), fn);
  } else {
    r = check(op->comm, brg_recv(host, op->count, op->dt, op->peer, op->comm->c, NULL), fn);
    if (r == ncclSuccess && bytes && (e = api->drv.mem_copy(op->buf, host, bytes)) != 0)
      r = fail(ncclUnhandledCudaError, "%s: %s", fn, api->drv.error_string(e));
  }
  if (prev >= 0) api->drv.set_device(prev);
  free(host);
  return r;
}

static void keep_first(ncclResult_t *r, ncclResult_t r1, const char *err) {
  if (r1 != ncclSuccess && *r == ncclSuccess)
    *r = r1;
  else if (*r != ncclSuccess) /* keep the first error's sentence */
    snprintf(last_error, sizeof last_error, "%s", err);
}

/* The group's operations: those on device buffers as one batch per
 * communicator, on their streams; those on host buffers then, on this
 * thread, every send before any receive. The first error is returned,
 * and what follows it still runs (its peers wait for it). */
static ncclResult_t run_p2p(void) {
  ncclResult_t r = ncclSuccess;
  int n = 0;
  for (pending_p2p *op = p2p_head; op; op = op->next) n++;
  pending_p2p **dev = calloc((size_t)n + 1, sizeof *dev),
              **mine = calloc((size_t)n + 1, sizeof *mine);
  char *done = calloc((size_t)n + 1, 1);
  if (!dev || !mine || !done) r = fail(ncclSystemError, "ncclGroupEnd: out of memory");
  int nd = 0;
  for (pending_p2p *op = p2p_head; op && dev; op = op->next)
    if (on_device(op)) dev[nd++] = op;
  for (int i = 0; i < nd && mine && done; i++) {
    if (done[i]) continue;
    int m = 0;
    for (int j = i; j < nd; j++)
      if (!done[j] && dev[j]->comm == dev[i]->comm) mine[m++] = dev[j], done[j] = 1;
    char err[sizeof last_error];
    snprintf(err, sizeof err, "%s", last_error);
    keep_first(&r, p2p_enqueue(dev[i]->comm, mine, m), err);
  }
  for (int sends = 1; sends >= 0 && dev; sends--)
    for (pending_p2p *op = p2p_head; op; op = op->next) {
      if (op->is_send != sends || on_device(op)) continue;
      char err[sizeof last_error];
      snprintf(err, sizeof err, "%s", last_error);
      keep_first(&r, p2p_now(op), err);
    }
  free(dev);
  free(mine);
  free(done);
  while (p2p_head) {
    pending_p2p *op = p2p_head;
    p2p_head = op->next;
    free(op);
  }
  p2p_last = NULL;
  return r;
}

static ncclResult_t p2p_call(int is_send, void *buf, size_t count, ncclDataType_t datatype,
                             int peer, ncclComm_t comm, cudaStream_t stream) {
  const char *fn = is_send ? "ncclSend" : "ncclRecv";
  pending_p2p op = {
      .is_send = is_send, .buf = buf, .count = count, .peer = peer, .comm = comm, .stream = stream};
  ncclResult_t r;
  if (!prologue(comm, datatype, &op.dt, fn, &r)) return r;
  if (peer < 0 || peer >= comm->nranks)
    return fail(ncclInvalidArgument, "%s: peer %d is not in [0, %d)", fn, peer, comm->nranks);
  if (count && !buf)
    return fail(ncclInvalidArgument, "%s: buffer is NULL with count %zu", fn, count);
  if (group_depth == 0) {
    if (!on_device(&op)) return p2p_now(&op);
    pending_p2p *one = &op;
    return p2p_enqueue(comm, &one, 1);
  }
  pending_p2p *q = malloc(sizeof *q);
  if (!q) return fail(ncclSystemError, "%s: out of memory", fn);
  *q = op;
  q->next = NULL;
  if (p2p_last)
    p2p_last->next = q;
  else
    p2p_head = q;
  p2p_last = q;
  return ncclSuccess;
}

EXPORT ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                             ncclComm_t comm, cudaStream_t stream) {
  return p2p_call(1, (void *)sendbuff, count, datatype, peer, comm, stream);
}

EXPORT ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                             ncclComm_t comm, cudaStream_t stream) {
  return p2p_call(0, recvbuff, count, datatype, peer, comm, stream);
}

/* As NCCL defines it: a group of a send to and a receive from every
 * rank, so one thread may drive several communicators' all-to-alls in
 * one group, and in place works (every send leaves before any receive). */
EXPORT ncclResult_t ncclAlltoAll(const void *sendbuff, void *recvbuff, size_t count,
                                 ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  brg_dtype dt;
  ncclResult_t r;
  if (!prologue(comm, datatype, &dt, "ncclAlltoAll", &r)) return r;
  /* The buffers hold nranks blocks: their size must be a size_t. */
  if (count > SIZE_MAX / 4 / brg_dtype_size(dt) / (size_t)comm->nranks)
    return fail(ncclInvalidArgument,
                "ncclAlltoAll: count %zu is too large (%d blocks of it, %zu bytes each element)",
                count, comm->nranks, brg_dtype_size(dt));
  size_t block = count * brg_dtype_size(dt);
  ncclGroupStart();
  for (int j = 0; j < comm->nranks && r == ncclSuccess; j++)
    r = p2p_call(1, (char *)sendbuff + (size_t)j * block, count, datatype, j, comm, stream);
  for (int j = 0; j < comm->nranks && r == ncclSuccess; j++)
    r = p2p_call(0, (char *)recvbuff + (size_t)j * block, count, datatype, j, comm, stream);
  ncclResult_t r2 = ncclGroupEnd();
  return r != ncclSuccess ? r : r2;
}

/* ncclGather and ncclScatter: brigade's gather and scatter (on GPU
 * buffers staged through host memory by the calling thread, which waits
 * for the stream: the call returns with the result in place). */
EXPORT ncclResult_t ncclGather(const void *sendbuff, void *recvbuff, size_t count,
                               ncclDataType_t datatype, int root, ncclComm_t comm,
                               cudaStream_t stream) {
  brg_dtype dt;
  ncclResult_t r;
  if (!prologue(comm, datatype, &dt, "ncclGather", &r)) return r;
  return check(comm, brg_gather(sendbuff, recvbuff, count, dt, root, comm->c, stream),
               "ncclGather");
}

EXPORT ncclResult_t ncclScatter(const void *sendbuff, void *recvbuff, size_t count,
                                ncclDataType_t datatype, int root, ncclComm_t comm,
                                cudaStream_t stream) {
  brg_dtype dt;
  ncclResult_t r;
  if (!prologue(comm, datatype, &dt, "ncclScatter", &r)) return r;
  return check(comm, brg_scatter(sendbuff, recvbuff, count, dt, root, comm->c, stream),
               "ncclScatter");
}

/* ---- what brigade does not have -------------------------------------- */

EXPORT ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                                  ncclConfig_t *config) {
  (void)config; /* its tuning fields have no brigade meaning */
  ncclResult_t r = comm_ok(comm, "ncclCommSplit");
  if (r != ncclSuccess) return r;
  if (!newcomm) return fail(ncclInvalidArgument, "ncclCommSplit: newcomm is NULL");
  *newcomm = NULL;
  struct ncclComm *nc = comm_new();
  if (!nc) return fail(ncclSystemError, "ncclCommSplit: out of memory");
  brg_status s =
      brg_comm_split(comm->c, color == NCCL_SPLIT_NOCOLOR ? BRG_SPLIT_NOCOLOR : color, key, &nc->c);
  if (s != BRG_SUCCESS || !nc->c) {
    comm_drop(nc);
    return check(comm, s, "ncclCommSplit");
  }
  nc->device = comm->device;
  brg_comm_rank(nc->c, &nc->rank);
  brg_comm_size(nc->c, &nc->nranks);
  *newcomm = nc;
  return ncclSuccess;
}

/* The ranks not excluded form the new communicator, in their order in
 * comm; the excluded ranks do not call (they may have failed). Brigade's
 * split needs every rank, so a shrink makes a new communicator instead:
 * the lowest rank kept makes a unique id and sends it to the others on
 * comm's point-to-point links, which join only the pairs that use them. */
EXPORT ncclResult_t ncclCommShrink(ncclComm_t comm, int *excludeRanksList, int excludeRanksCount,
                                   ncclComm_t *newcomm, ncclConfig_t *config, int shrinkFlags) {
  const char *fn = "ncclCommShrink";
  int blocking;
  ncclResult_t r = comm_ok(comm, fn);
  if (r != ncclSuccess) return r;
  if (!newcomm) return fail(ncclInvalidArgument, "%s: newcomm is NULL", fn);
  *newcomm = NULL;
  if ((r = config_read(config, fn, &blocking)) != ncclSuccess) return r;
  if (shrinkFlags == NCCL_SHRINK_ABORT)
    return fail(ncclInvalidUsage,
                "%s: brigade cannot shrink with NCCL_SHRINK_ABORT (it would stop the parent's "
                "links, which the shrink uses); shrink with NCCL_SHRINK_DEFAULT, then abort the "
                "parent",
                fn);
  if (shrinkFlags != NCCL_SHRINK_DEFAULT)
    return fail(ncclInvalidArgument, "%s: unknown shrinkFlags 0x%x", fn, shrinkFlags);
  if (excludeRanksCount < 0 || (excludeRanksCount > 0 && !excludeRanksList))
    return fail(ncclInvalidArgument, "%s: excludeRanksList is %s with excludeRanksCount %d", fn,
                excludeRanksList ? "given" : "NULL", excludeRanksCount);
  char *out = calloc((size_t)comm->nranks, 1);
  if (!out) return fail(ncclSystemError, "%s: out of memory", fn);
  for (int i = 0; i < excludeRanksCount; i++) {
    int x = excludeRanksList[i];
    const char *bad = x < 0 || x >= comm->nranks ? "is not a rank of the communicator"
                      : out[x]                   ? "is listed twice"
                      : x == comm->rank ? "is the calling rank (excluded ranks do not call)"
                                        : NULL;
    if (bad) {
      free(out);
      return fail(ncclInvalidArgument, "%s: excludeRanksList[%d] = %d %s (of %d ranks)", fn, i, x,
                  bad, comm->nranks);
    }
    out[x] = 1;
  }
  int nkept = 0, newrank = -1, leader = -1;
  for (int k = 0; k < comm->nranks; k++) {
    if (out[k]) continue;
    if (leader < 0) leader = k;
    if (k == comm->rank) newrank = nkept;
    nkept++;
  }
  brg_unique_id bid;
  brg_status s = BRG_SUCCESS;
  if (comm->rank == leader) {
    s = brg_get_unique_id(&bid);
    for (int k = leader + 1; k < comm->nranks && s == BRG_SUCCESS; k++)
      if (!out[k]) s = brg_send(&bid, sizeof bid, BRG_UINT8, k, comm->c, NULL);
  } else {
    s = brg_recv(&bid, sizeof bid, BRG_UINT8, leader, comm->c, NULL);
  }
  free(out);
  if (s != BRG_SUCCESS)
    return check(comm, s, "ncclCommShrink (handing the new communicator's id to the ranks kept)");
  struct ncclComm *nc = comm_new();
  if (!nc) return fail(ncclSystemError, "%s: out of memory", fn);
  nc->device = comm->device;
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  memcpy(id.internal, bid.internal, sizeof bid.internal);
  if ((r = init_now(nc, nkept, &id, newrank)) != ncclSuccess) {
    comm_drop(nc);
    return r;
  }
  *newcomm = nc;
  return ncclSuccess;
}

/* NCCL's revoke stops a communicator's operations and keeps it for split
 * and shrink; brigade's stop (ncclCommAbort) leaves it for destruction
 * only. */
EXPORT ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags) {
  ncclResult_t r = comm_ok(comm, "ncclCommRevoke");
  if (r != ncclSuccess) return r;
  if (revokeFlags != NCCL_REVOKE_DEFAULT)
    return fail(ncclInvalidArgument, "ncclCommRevoke: revokeFlags 0x%x (must be 0)", revokeFlags);
  return unsupported("ncclCommRevoke",
                     "revoke that keeps a communicator for split or shrink (ncclCommAbort stops "
                     "one; ncclCommShrink works on one that is not stopped)");
}

/* ---- PreMulSum ------------------------------------------------------- */

/*
 * ncclRedOpCreatePreMulSum: each rank's input times its scalar, then
 * summed. On the caller's stream, before the collective: the scalar
 * repeated in device memory (written once for a host scalar; copied from
 * the device scalar at each call, so its value at that point of the
 * stream counts), then the reduce kernel's product of input and that
 * (rounded to the dtype, as a scale would be) into the receive buffer
 * (allreduce) or the op's own buffer (reduce-scatter, reduce), which the
 * collective sums. Device memory is allocated when a call needs more than
 * the op has (not inside a CUDA graph capture: use the op once outside
 * first) and freed with the communicator. An op used on another stream
 * than its last call's waits for that call.
 */

static void dead_add(struct ncclComm *comm, void *p) {
  if (!p) return;
  if (comm->ndead == comm->capdead) {
    int cap = comm->capdead ? 2 * comm->capdead : 16;
    void **a = realloc(comm->dead, (size_t)cap * sizeof *a);
    if (!a) { /* cannot keep it for later: free it now (waits for the device) */
      cuda_api->drv.mem_free(p);
      return;
    }
    comm->dead = a;
    comm->capdead = cap;
  }
  comm->dead[comm->ndead++] = p;
}

static void premul_retire(struct ncclComm *comm, premul *pm) {
  dead_add(comm, pm->sbuf);
  dead_add(comm, pm->tmp);
  if (pm->ev) cuda_api->drv.event_destroy(pm->ev);
  memset(pm, 0, sizeof *pm);
}

static void premul_free_all(struct ncclComm *comm) {
  const brg__cuda_api *api = cuda_api;
  if (!api) return;
  for (int i = 0; i < MAX_PREMUL; i++)
    if (comm->premuls[i].live) premul_retire(comm, &comm->premuls[i]);
  if (!comm->ndead) return;
  int prev = -1;
  if (api->drv.get_device(&prev) != 0) prev = -1;
  api->drv.set_device(comm->device);
  for (int i = 0; i < comm->ndead; i++) api->drv.mem_free(comm->dead[i]);
  comm->ndead = 0;
  if (prev >= 0) api->drv.set_device(prev);
}

/* The live PreMulSum op `op` of comm for dtype dt, or NULL with *r set. */
static premul *premul_of(struct ncclComm *comm, ncclRedOp_t op, brg_dtype dt, const char *fn,
                         ncclResult_t *r) {
  long i = (long)op - ncclNumOps;
  if (i < 0 || i >= MAX_PREMUL || !comm->premuls[i].live) {
    *r = fail(ncclInvalidArgument,
              "%s: reduction op %d is not a live ncclRedOpCreatePreMulSum op of this "
              "communicator",
              fn, (int)op);
    return NULL;
  }
  premul *pm = &comm->premuls[i];
  if (pm->dt != dt) {
    *r = fail(ncclInvalidArgument,
              "%s: the PreMulSum op %d was made for %s, the call's datatype is %s", fn, (int)op,
              brg_dtype_name(pm->dt), brg_dtype_name(dt));
    return NULL;
  }
  return pm;
}

/* *buf holding at least `bytes` of device memory (the old one kept until
 * the communicator goes); 1 when it was replaced. */
static ncclResult_t grow(struct ncclComm *comm, void **buf, size_t *cap, size_t bytes,
                         int capturing, const char *fn, int *grown) {
  *grown = 0;
  if (*cap >= bytes) return ncclSuccess;
  if (capturing)
    return fail(ncclInvalidUsage,
                "%s: a PreMulSum op needs %zu bytes of device memory, which brigade cannot "
                "allocate inside a CUDA graph capture (call it once outside the capture first)",
                fn, bytes);
  size_t want = bytes < 2 * *cap ? 2 * *cap : bytes;
  void *p = NULL;
  int e = cuda_api->drv.mem_alloc(&p, want);
  if (e)
    return fail(ncclUnhandledCudaError, "%s: cudaMalloc(%zu) for a PreMulSum op: %s", fn, want,
                cuda_api->drv.error_string(e));
  dead_add(comm, *buf);
  *buf = p;
  *cap = want;
  *grown = 1;
  return ncclSuccess;
}

/* dst = src * the op's scalar, count elements, on `stream`. */
static ncclResult_t premul_scale(struct ncclComm *comm, premul *pm, const void *src, void *dst,
                                 size_t count, void *stream, const char *fn) {
  const brg__cuda_api *api = cuda_api;
  size_t es = brg_dtype_size(pm->dt), bytes = count * es;
  int capturing = 0, grown = 0;
  if (api->drv.stream_capturing(stream, &capturing) != 0) capturing = 0;
  int e = 0;
  const char *what = "cudaStreamWaitEvent";
  if (pm->ev_set && pm->stream != stream) {
    if (capturing)
      return fail(ncclInvalidUsage,
                  "%s: a PreMulSum op last used on stream %p cannot be used on stream %p inside "
                  "a CUDA graph capture",
                  fn, pm->stream, stream);
    e = api->drv.stream_wait_event(stream, pm->ev);
  }
  if (e) return fail(ncclUnhandledCudaError, "%s: %s: %s", fn, what, api->drv.error_string(e));
  if (!count) return ncclSuccess;
  ncclResult_t r = grow(comm, &pm->sbuf, &pm->scap, bytes, capturing, fn, &grown);
  if (r != ncclSuccess) return r;
  if (grown && !pm->on_device) { /* the host scalar, repeated, once */
    size_t n = pm->scap / es;
    char *h = malloc(pm->scap);
    if (!h) return fail(ncclSystemError, "%s: out of memory", fn);
    for (size_t i = 0; i < n; i++) memcpy(h + i * es, pm->value, es);
    e = api->drv.mem_copy(pm->sbuf, h, n * es), what = "cudaMemcpy";
    free(h);
  }
  if (!e && pm->on_device) { /* the device scalar, then doubled until count */
    e = api->kern.copy(pm->sbuf, NULL, pm->dscalar, es, stream), what = "copy";
    for (size_t k = 1; k < count && !e; k *= 2)
      e = api->kern.copy((char *)pm->sbuf + k * es, NULL, pm->sbuf,
                         (k < count - k ? k : count - k) * es, stream);
  }
  if (!e)
    e = api->kern.reduce(dst, NULL, src, pm->sbuf, count, (int)pm->dt, BRG_PROD, 1, stream),
    what = "reduce";
  return e ? fail(ncclUnhandledCudaError, "%s: %s: %s", fn, what, api->drv.error_string(e))
           : ncclSuccess;
}

/* After the collective: the stream and point a later call on another
 * stream waits for. */
static void premul_after(premul *pm, void *stream) {
  const brg__cuda_api *api = cuda_api;
  int capturing = 0;
  if (api->drv.stream_capturing(stream, &capturing) != 0) capturing = 0;
  pm->stream = stream;
  pm->ev_set = 0;
  if (capturing) return; /* (replays are ordered by the graph's user) */
  if (!pm->ev && api->drv.event_create(&pm->ev) != 0) pm->ev = NULL;
  pm->ev_set = pm->ev && api->drv.event_record(pm->ev, stream) == 0;
}

/* A reduction's op: a built-in one (*pm NULL) or a PreMulSum (*pm set, *bop
 * the sum). 1 when the call may go on. */
static int reduction(struct ncclComm *comm, ncclRedOp_t op, brg_dtype dt, brg_op *bop, premul **pm,
                     const char *fn, ncclResult_t *r) {
  *pm = NULL;
  if ((int)op < ncclNumOps) return op_of(op, bop, fn, r);
  *bop = BRG_SUM;
  return (*pm = premul_of(comm, op, dt, fn, r)) != NULL;
}

EXPORT ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar, ncclDataType_t datatype,
                                             ncclScalarResidence_t residence, ncclComm_t comm) {
  const char *fn = "ncclRedOpCreatePreMulSum";
  brg_dtype dt;
  ncclResult_t r = comm_ok(comm, fn);
  if (r != ncclSuccess || !dtype_of(datatype, &dt, fn, &r)) return r;
  if (!op) return fail(ncclInvalidArgument, "%s: op is NULL", fn);
  if (!scalar) return fail(ncclInvalidArgument, "%s: scalar is NULL", fn);
  if (residence != ncclScalarDevice && residence != ncclScalarHostImmediate)
    return fail(ncclInvalidArgument, "%s: unknown residence %d", fn, (int)residence);
  int dev = -1;
  if (residence == ncclScalarDevice && !cuda_api->drv.pointer_is_device(scalar, &dev))
    return fail(ncclInvalidArgument, "%s: scalar %p is not device memory (ncclScalarDevice)", fn,
                scalar);
  pthread_mutex_lock(&comm->lock);
  int i = 0;
  while (i < MAX_PREMUL && comm->premuls[i].live) i++;
  if (i < MAX_PREMUL) {
    premul *pm = &comm->premuls[i];
    memset(pm, 0, sizeof *pm);
    pm->live = 1;
    pm->dt = dt;
    pm->on_device = residence == ncclScalarDevice;
    pm->dscalar = scalar;
    if (!pm->on_device) memcpy(pm->value, scalar, brg_dtype_size(dt));
  }
  pthread_mutex_unlock(&comm->lock);
  if (i == MAX_PREMUL)
    return fail(ncclInvalidUsage, "%s: %d PreMulSum ops of this communicator are live already", fn,
                MAX_PREMUL);
  *op = (ncclRedOp_t)(ncclNumOps + i);
  return ncclSuccess;
}

EXPORT ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  ncclResult_t r = comm_ok(comm, "ncclRedOpDestroy");
  if (r != ncclSuccess) return r;
  if ((int)op < ncclNumOps)
    return fail(ncclInvalidArgument, "ncclRedOpDestroy: op %d is a built-in op", (int)op);
  long i = (long)op - ncclNumOps;
  pthread_mutex_lock(&comm->lock);
  int live = i < MAX_PREMUL && comm->premuls[i].live;
  if (live) premul_retire(comm, &comm->premuls[i]);
  pthread_mutex_unlock(&comm->lock);
  return live ? ncclSuccess
              : fail(ncclInvalidArgument,
                     "ncclRedOpDestroy: op %d is not a live PreMulSum op of this communicator",
                     (int)op);
}

/* ---- NCCL 2.28's device API, 2.29's suspend, grow and one-sided calls -- */

/* The types of nccl_device/core.h (a CUDA C++ header this C file cannot
 * include) that its host calls take: a team by value, the rest opaque. */
typedef struct ncclTeam {
  int nRanks, rank, stride;
} ncclTeam_t;
struct ncclDevComm;
struct ncclDevCommRequirements;
struct ncclDevResourceRequirements;
struct ncclLsaBarrierHandle;
struct ncclGinBarrierHandle;
struct ncclLLA2AHandle;

/* nccl.h of NCCL 2.29 declares these; the toolkit's may be older. */
#if NCCL_VERSION_CODE < 22907
#define NCCL_SUSPEND_MEM 0x01
typedef enum {
  ncclStatGpuMemSuspend = 0,
  ncclStatGpuMemSuspended = 1,
  ncclStatGpuMemPersist = 2,
  ncclStatGpuMemTotal = 3
} ncclCommMemStat_t;
typedef struct {
  int opCnt, peer, sigIdx, ctx;
} ncclWaitSignalDesc_t;
#endif

/* Brigade's kernels are its own collectives: it has no device-side API
 * for user kernels (device communicators, LSA and GIN barriers, LL
 * all-to-all, multicast memory), so nothing can be built for one. */
static ncclResult_t no_device_api(const char *fn) {
  return fail(ncclInvalidUsage,
              "%s: brigade has no device-side API (nccl_device.h: device communicators, "
              "barriers, LL all-to-all); its kernels are its own collectives "
              "(libbrigade_nccl.so)",
              fn);
}

EXPORT ncclResult_t ncclDevCommCreate(ncclComm_t comm, const struct ncclDevCommRequirements *reqs,
                                      struct ncclDevComm *outDevComm) {
  (void)reqs, (void)outDevComm;
  ncclResult_t r = comm_ok(comm, "ncclDevCommCreate");
  return r != ncclSuccess ? r : no_device_api("ncclDevCommCreate");
}

EXPORT ncclResult_t ncclDevCommDestroy(ncclComm_t comm, const struct ncclDevComm *devComm) {
  (void)devComm;
  ncclResult_t r = comm_ok(comm, "ncclDevCommDestroy");
  return r != ncclSuccess ? r : no_device_api("ncclDevCommDestroy (none can be created)");
}

EXPORT ncclResult_t ncclLsaBarrierCreateRequirement(ncclTeam_t team, int nBarriers,
                                                    struct ncclLsaBarrierHandle *outHandle,
                                                    struct ncclDevResourceRequirements *outReq) {
  (void)team, (void)nBarriers, (void)outHandle, (void)outReq;
  return no_device_api("ncclLsaBarrierCreateRequirement");
}

EXPORT ncclResult_t ncclGinBarrierCreateRequirement(ncclComm_t comm, ncclTeam_t team, int nBarriers,
                                                    struct ncclGinBarrierHandle *outHandle,
                                                    struct ncclDevResourceRequirements *outReq) {
  (void)comm, (void)team, (void)nBarriers, (void)outHandle, (void)outReq;
  return no_device_api("ncclGinBarrierCreateRequirement");
}

EXPORT ncclResult_t ncclLLA2ACreateRequirement(int nBlocks, int nSlots,
                                               struct ncclLLA2AHandle *outHandle,
                                               struct ncclDevResourceRequirements *outReq) {
  (void)nBlocks, (void)nSlots, (void)outHandle, (void)outReq;
  return no_device_api("ncclLLA2ACreateRequirement");
}

/* The slots an LL all-to-all needs: one per 8 bytes of each element (an
 * LL line carries 8 data bytes). A pure count, the same without a device
 * API; -1 for a negative argument or one that overflows. */
EXPORT int ncclLLA2ACalcSlots(int maxElts, int maxEltSize) {
  if (maxElts < 0 || maxEltSize < 0) {
    fail(ncclInvalidArgument, "ncclLLA2ACalcSlots: maxElts %d, maxEltSize %d (negative)", maxElts,
         maxEltSize);
    return -1;
  }
  long long slots = (long long)maxElts * ((maxEltSize + 7LL) / 8);
  return slots > INT32_MAX ? -1 : (int)slots;
}

/* Teams. NCCL's LSA team is the ranks whose memory this rank can load and
 * store; brigade maps no peer's memory for the caller, so it is this rank
 * alone, and the rail team (the ranks with this one's LSA rank) is the
 * world. Ranks convert as NCCL's inline functions do. */
EXPORT ncclTeam_t ncclTeamWorld(ncclComm_t comm) {
  ncclTeam_t t = {0, 0, 1};
  if (comm_ok(comm, "ncclTeamWorld") == ncclSuccess) t = (ncclTeam_t){comm->nranks, comm->rank, 1};
  return t;
}

EXPORT ncclTeam_t ncclTeamLsa(ncclComm_t comm) {
  ncclTeam_t t = {0, 0, 1};
  if (comm_ok(comm, "ncclTeamLsa") == ncclSuccess) t = (ncclTeam_t){1, 0, 1};
  return t;
}

EXPORT ncclTeam_t ncclTeamRail(ncclComm_t comm) {
  ncclTeam_t t = {0, 0, 1};
  if (comm_ok(comm, "ncclTeamRail") == ncclSuccess) t = (ncclTeam_t){comm->nranks, comm->rank, 1};
  return t;
}

EXPORT int ncclTeamRankToWorld(ncclComm_t comm, ncclTeam_t team, int rank) {
  if (comm_ok(comm, "ncclTeamRankToWorld") != ncclSuccess) return -1;
  return comm->rank + (rank - team.rank) * team.stride;
}

EXPORT int ncclTeamRankToLsa(ncclComm_t comm, ncclTeam_t team, int rank) {
  if (comm_ok(comm, "ncclTeamRankToLsa") != ncclSuccess) return -1;
  return 0 + (rank - team.rank) * team.stride; /* this rank's LSA rank is 0 */
}

/* The window `win` if it is registered with a live communicator (with
 * comm, when comm is not NULL); NULL with the error set. */
static struct ncclWindow_vidmem *window_of(ncclComm_t comm, ncclWindow_t win, const char *fn) {
  if (!win) {
    fail(ncclInvalidArgument, "%s: window is NULL", fn);
    return NULL;
  }
  struct ncclWindow_vidmem *found = NULL;
  pthread_mutex_lock(&live_lock);
  for (size_t i = 0; i < nlive && !found; i++) {
    struct ncclComm *c = (struct ncclComm *)live[i];
    if (comm && c != comm) continue;
    pthread_mutex_lock(&c->lock);
    for (struct ncclWindow_vidmem *w = c->windows; w && !found; w = w->next)
      if (w == win) found = w;
    pthread_mutex_unlock(&c->lock);
  }
  pthread_mutex_unlock(&live_lock);
  if (!found)
    fail(ncclInvalidArgument,
         "%s: window %p is not registered with %s (deregistered, or never registered)", fn,
         (void *)win, comm ? "this communicator" : "a live communicator");
  return found;
}

EXPORT ncclResult_t ncclWinGetUserPtr(ncclComm_t comm, ncclWindow_t win, void **outUserPtr) {
  ncclResult_t r = comm_ok(comm, "ncclWinGetUserPtr");
  if (r != ncclSuccess) return r;
  if (!outUserPtr) return fail(ncclInvalidArgument, "ncclWinGetUserPtr: outUserPtr is NULL");
  struct ncclWindow_vidmem *w = window_of(comm, win, "ncclWinGetUserPtr");
  if (!w) return ncclInvalidArgument;
  *outUserPtr = w->buff;
  return ncclSuccess;
}

/* A peer's buffer is load/store reachable only inside the LSA team, which
 * is this rank alone (above): its own window gives its own buffer, any
 * other peer NULL, as NCCL gives for a peer outside the team. */
EXPORT ncclResult_t ncclGetPeerDevicePointer(ncclWindow_t window, size_t offset, int peer,
                                             void **outPtr) {
  const char *fn = "ncclGetPeerDevicePointer";
  if (!outPtr) return fail(ncclInvalidArgument, "%s: outPtr is NULL", fn);
  *outPtr = NULL;
  struct ncclWindow_vidmem *w = window_of(NULL, window, fn);
  if (!w) return ncclInvalidArgument;
  if (peer < 0 || peer >= w->comm->nranks)
    return fail(ncclInvalidArgument, "%s: peer %d is not in [0, %d)", fn, peer, w->comm->nranks);
  if (offset > w->size)
    return fail(ncclInvalidArgument, "%s: offset %zu is past the window's %zu bytes", fn, offset,
                w->size);
  if (peer == w->comm->rank) *outPtr = (char *)w->buff + offset;
  return ncclSuccess;
}

EXPORT ncclResult_t ncclGetLsaMultimemDevicePointer(ncclWindow_t window, size_t offset,
                                                    void **outPtr) {
  (void)offset;
  const char *fn = "ncclGetLsaMultimemDevicePointer";
  if (outPtr) *outPtr = NULL;
  if (!window_of(NULL, window, fn)) return ncclInvalidArgument;
  return fail(ncclInvalidUsage,
              "%s: brigade has no multicast (NVLS multimem) memory: its LSA team is the "
              "calling rank alone",
              fn);
}

/* One-sided calls write into a peer's window without a receive posted
 * there; brigade's point-to-point needs the receive. */
static ncclResult_t no_one_sided(ncclComm_t comm, const char *fn) {
  ncclResult_t r = comm_ok(comm, fn);
  if (r != ncclSuccess) return r;
  return fail(ncclInvalidUsage,
              "%s: brigade has no one-sided communication (puts and signals into a peer's "
              "window with no receive posted there); use ncclSend and ncclRecv",
              fn);
}

EXPORT ncclResult_t ncclPutSignal(const void *localbuff, size_t count, ncclDataType_t datatype,
                                  int peer, ncclWindow_t peerWin, size_t peerWinOffset, int sigIdx,
                                  int ctx, unsigned int flags, ncclComm_t comm,
                                  cudaStream_t stream) {
  (void)localbuff, (void)count, (void)datatype, (void)peer, (void)peerWin, (void)peerWinOffset;
  (void)sigIdx, (void)ctx, (void)flags, (void)stream;
  return no_one_sided(comm, "ncclPutSignal");
}

EXPORT ncclResult_t ncclSignal(int peer, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm,
                               cudaStream_t stream) {
  (void)peer, (void)sigIdx, (void)ctx, (void)flags, (void)stream;
  return no_one_sided(comm, "ncclSignal");
}

EXPORT ncclResult_t ncclWaitSignal(int nDesc, ncclWaitSignalDesc_t *signalDescs, ncclComm_t comm,
                                   cudaStream_t stream) {
  (void)nDesc, (void)signalDescs, (void)stream;
  return no_one_sided(comm, "ncclWaitSignal");
}

/* Suspend releases the GPU memory NCCL can rebuild. Brigade's device ring
 * (its FIFOs and the IPC mappings of its neighbours') is made once, at
 * init, with the other ranks, and cannot be rebuilt by one rank alone: it
 * releases nothing, and a suspended communicator refuses operations until
 * it is resumed, as NCCL's does. */
EXPORT ncclResult_t ncclCommSuspend(ncclComm_t comm, int flags) {
  ncclResult_t r = comm_ok(comm, "ncclCommSuspend");
  if (r != ncclSuccess) return r;
  if (flags & ~NCCL_SUSPEND_MEM)
    return fail(ncclInvalidArgument, "ncclCommSuspend: unknown flags 0x%x", flags);
  if (comm->suspended)
    return fail(ncclInvalidUsage, "ncclCommSuspend: the communicator is suspended already");
  comm->suspended = 1;
  return ncclSuccess;
}

EXPORT ncclResult_t ncclCommResume(ncclComm_t comm) {
  ncclResult_t r = comm_ok(comm, "ncclCommResume");
  if (r != ncclSuccess) return r;
  if (!comm->suspended)
    return fail(ncclInvalidUsage, "ncclCommResume: the communicator is not suspended");
  comm->suspended = 0;
  return ncclSuccess;
}

EXPORT ncclResult_t ncclCommMemStats(ncclComm_t comm, ncclCommMemStat_t stat, uint64_t *value) {
  ncclResult_t r = comm_ok(comm, "ncclCommMemStats");
  if (r != ncclSuccess) return r;
  if (!value) return fail(ncclInvalidArgument, "ncclCommMemStats: value is NULL");
  switch (stat) {
  case ncclStatGpuMemSuspend: *value = 0; return ncclSuccess; /* nothing is released */
  case ncclStatGpuMemSuspended: *value = (uint64_t)comm->suspended; return ncclSuccess;
  case ncclStatGpuMemPersist:
  case ncclStatGpuMemTotal:
    return fail(ncclInvalidUsage,
                "ncclCommMemStats: brigade does not count a communicator's GPU memory (its "
                "device ring's FIFOs are allocated by the runtime, which does not report them); "
                "ncclStatGpuMemSuspend (0) and ncclStatGpuMemSuspended are known");
  default: return fail(ncclInvalidArgument, "ncclCommMemStats: unknown stat %d", (int)stat);
  }
}

/* Grow: the ranks of comm keep their ranks and new ones join at theirs.
 * The root (the rank of comm that made the id with ncclCommGetUniqueId)
 * passes it, the others pass NULL: they learn it from the root by an
 * all-gather of who holds it and a broadcast of the id on comm; then
 * every rank initialises the new communicator on it. */
EXPORT ncclResult_t ncclCommGetUniqueId(ncclComm_t comm, ncclUniqueId *uniqueId) {
  ncclResult_t r = comm_ok(comm, "ncclCommGetUniqueId");
  if (r != ncclSuccess) return r;
  if (!uniqueId) return fail(ncclInvalidArgument, "ncclCommGetUniqueId: uniqueId is NULL");
  if (comm->grow_id_pending)
    return fail(ncclInvalidUsage, "ncclCommGetUniqueId: the id made before has not been used by "
                                  "ncclCommGrow yet (one at a time)");
  brg_status s = brg_get_unique_id(&comm->grow_id);
  if (s != BRG_SUCCESS) return check(comm, s, "ncclCommGetUniqueId");
  comm->grow_id_pending = 1;
  memset(uniqueId, 0, sizeof *uniqueId);
  memcpy(uniqueId->internal, comm->grow_id.internal, sizeof comm->grow_id.internal);
  return ncclSuccess;
}

EXPORT ncclResult_t ncclCommGrow(ncclComm_t comm, int nRanks, const ncclUniqueId *uniqueId,
                                 int rank, ncclComm_t *newcomm, ncclConfig_t *config) {
  const char *fn = "ncclCommGrow";
  int blocking;
  if (!newcomm) return fail(ncclInvalidArgument, "%s: newcomm is NULL", fn);
  *newcomm = NULL;
  ncclResult_t r = config_read(config, fn, &blocking);
  if (r != ncclSuccess) return r;
  if (!comm) { /* a new rank */
    if (!uniqueId) return fail(ncclInvalidArgument, "%s: a new rank (comm NULL) needs the id", fn);
    if (rank < 0 || rank >= nRanks)
      return fail(ncclInvalidArgument, "%s: rank %d is not in [0, %d)", fn, rank, nRanks);
    return init_rank(newcomm, nRanks, uniqueId, rank, config, fn);
  }
  if ((r = comm_ok(comm, fn)) != ncclSuccess) return r;
  if (rank != -1)
    return fail(ncclInvalidArgument, "%s: a rank of comm passes rank -1 (it keeps %d), not %d", fn,
                comm->rank, rank);
  if (nRanks <= comm->nranks)
    return fail(ncclInvalidArgument, "%s: nRanks %d is not more than comm's %d", fn, nRanks,
                comm->nranks);
  if (uniqueId && (!comm->grow_id_pending ||
                   memcmp(uniqueId->internal, comm->grow_id.internal, sizeof comm->grow_id)))
    return fail(ncclInvalidArgument,
                "%s: the id is not one ncclCommGetUniqueId made on this communicator (or it was "
                "used already); the other ranks of comm pass NULL",
                fn);
  /* Who holds the id: exactly one rank. */
  int *roots = calloc((size_t)comm->nranks, sizeof *roots);
  if (!roots) return fail(ncclSystemError, "%s: out of memory", fn);
  int mine = uniqueId != NULL, root = -1, nroots = 0;
  brg_status s = brg_all_gather(&mine, roots, 1, BRG_INT32, comm->c, NULL);
  for (int k = 0; s == BRG_SUCCESS && k < comm->nranks; k++)
    if (roots[k]) {
      if (root < 0) root = k;
      nroots++;
    }
  free(roots);
  if (s != BRG_SUCCESS) return check(comm, s, "ncclCommGrow (finding the rank with the id)");
  if (nroots != 1)
    return fail(ncclInvalidUsage,
                "%s: %d ranks of comm passed an id; exactly one must (the "
                "one that called ncclCommGetUniqueId)",
                fn, nroots);
  brg_unique_id bid;
  if (mine) memcpy(bid.internal, uniqueId->internal, sizeof bid.internal);
  s = brg_broadcast(&bid, &bid, sizeof bid, BRG_UINT8, root, comm->c, NULL);
  if (s != BRG_SUCCESS) return check(comm, s, "ncclCommGrow (handing the id to comm's ranks)");
  if (mine) comm->grow_id_pending = 0; /* consumed */
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  memcpy(id.internal, bid.internal, sizeof bid.internal);
  return init_rank(newcomm, nRanks, &id, comm->rank, config, fn);
}

/* NCCL re-reads its logging variables here. Brigade reads its settings
 * once: NCCL_DEBUG, NCCL_DEBUG_FILE and NCCL_DEBUG_SUBSYS are set as
 * brigade's again, which counts where brigade has not read them yet. */
EXPORT void ncclResetDebugInit(void) {
  brg__nccl_env_debug_again();
}

EXPORT void ncclResetDebugInitInternal(void) {
  brg__nccl_env_debug_again();
}

/* ---- pncclXxx ---------------------------------------------------------- */

/* NCCL exports every call under a second name with a 'p' in front (for
 * profiling tools that wrap the first): the same functions here. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#define PNCCL(f) extern __typeof__(f) p##f __attribute__((alias(#f), visibility("default")));
PNCCL(ncclGetErrorString)
PNCCL(ncclGetLastError)
PNCCL(ncclGetVersion)
PNCCL(ncclGetUniqueId)
PNCCL(ncclCommInitRank)
PNCCL(ncclCommInitRankConfig)
PNCCL(ncclCommInitRankScalable)
PNCCL(ncclCommInitAll)
PNCCL(ncclCommFinalize)
PNCCL(ncclCommDestroy)
PNCCL(ncclCommAbort)
PNCCL(ncclCommGetAsyncError)
PNCCL(ncclCommCount)
PNCCL(ncclCommCuDevice)
PNCCL(ncclCommUserRank)
PNCCL(ncclMemAlloc)
PNCCL(ncclMemFree)
PNCCL(ncclCommRegister)
PNCCL(ncclCommDeregister)
PNCCL(ncclCommWindowRegister)
PNCCL(ncclCommWindowDeregister)
PNCCL(ncclGroupStart)
PNCCL(ncclGroupEnd)
PNCCL(ncclGroupSimulateEnd)
PNCCL(ncclAllReduce)
PNCCL(ncclReduceScatter)
PNCCL(ncclAllGather)
PNCCL(ncclBroadcast)
PNCCL(ncclBcast)
PNCCL(ncclReduce)
PNCCL(ncclSend)
PNCCL(ncclRecv)
PNCCL(ncclAlltoAll)
PNCCL(ncclGather)
PNCCL(ncclScatter)
PNCCL(ncclCommSplit)
PNCCL(ncclCommShrink)
PNCCL(ncclCommRevoke)
PNCCL(ncclRedOpCreatePreMulSum)
PNCCL(ncclRedOpDestroy)
PNCCL(ncclDevCommCreate)
PNCCL(ncclDevCommDestroy)
PNCCL(ncclLsaBarrierCreateRequirement)
PNCCL(ncclGinBarrierCreateRequirement)
PNCCL(ncclLLA2ACreateRequirement)
PNCCL(ncclLLA2ACalcSlots)
PNCCL(ncclTeamWorld)
PNCCL(ncclTeamLsa)
PNCCL(ncclTeamRail)
PNCCL(ncclTeamRankToWorld)
PNCCL(ncclTeamRankToLsa)
PNCCL(ncclWinGetUserPtr)
PNCCL(ncclGetPeerDevicePointer)
PNCCL(ncclGetLsaMultimemDevicePointer)
PNCCL(ncclPutSignal)
PNCCL(ncclSignal)
PNCCL(ncclWaitSignal)
PNCCL(ncclCommSuspend)
PNCCL(ncclCommResume)
PNCCL(ncclCommMemStats)
PNCCL(ncclCommGetUniqueId)
PNCCL(ncclCommGrow)
PNCCL(ncclResetDebugInit)
#pragma GCC diagnostic pop
