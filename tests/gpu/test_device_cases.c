/*
 * Device collectives in the situations a multi-GPU machine makes ordinary,
 * through the public API, on the CUDA module BRIGADE_CUDA_MODULE names (the
 * emulated one in CI: several devices, peer access, real unmapping):
 *
 *   queued   buffers on GPU 1, a device allreduce queued behind a host
 *            iallreduce, so the progress thread (current device 0) runs it
 *   threads  ranks as threads of one process, on GPUs 0 and 1
 *   destroy  brg_comm_destroy right after an asynchronous device allreduce,
 *            then the stream drains and every element is checked
 *   kill     a rank SIGKILLed mid-collective: every survivor's call and
 *            destroy return within BRIGADE_TIMEOUT_MS + 5 s, naming it
 *   async    (run with BRIGADE_DEVICE_PROXY=1, as a ring between hosts
 *            runs) the other ranks join a second late: rank 0's calls
 *            return at once all the same, its stream waits for the
 *            results, and a host collective after them is ordered too
 *   graph    CUDA graphs: a captured call before the device setup is
 *            refused and changes nothing; after brg_comm_device_setup an
 *            allreduce, a reduce-scatter and a small allreduce (the
 *            one-shot path, whose call counter lives on the device) are
 *            captured (global mode, as torch captures) and the graph
 *            launched four times on new data, an uncaptured small
 *            allreduce between two launches, every element checked each
 *            time; in step mode
 *            (BRIGADE_DEVICE_MODE=step) the captured call is refused and
 *            the communicator still works
 *   graphdestroy  (kernel mode) a captured allreduce's graph launched
 *            twice and brg_comm_destroy at once, the replays still running:
 *            destroy waits for them (on the stream they were captured on),
 *            every element checked; the graph launched again after
 *            destroy ends at once (the abort word stays mapped and set)
 *            instead of touching freed memory, and leaves recvbuf alone
 *   graphother  (kernel mode) the same graph launched on a stream other than
 *            the one that captured it: a replay queued behind a busy kernel
 *            there at destroy ends at once when it starts, recvbuf
 *            untouched; then rank 0 destroys while its replay waits for the
 *            other ranks, a second late: destroy waits for the replays (their
 *            blocks counted on the device) before it frees their memory, and
 *            every rank's elements are right
 *   limits   kernel mode: ranks whose BRIGADE_DEVICE_SMALL_BYTES (TEST_LIMITS=small:
 *            1000 and 1024) or BRIGADE_DEVICE_LL_BYTES (ll: 992 and 1000) differ
 *            only before their one-shot slots round them up, or whose
 *            BRIGADE_DEVICE_RING_LL_BYTES (ringll: 1M and 2M) differ: the device setup
 *            fails at once on every rank with BRG_ERR_MISMATCH naming both
 *            values, instead of ranks taking different paths for one call
 *   mps      ranks of different processes on one GPU (BRIGADE_EMU_DEVICES=1)
 *            with TEST_MPS=disagree: rank 0 finds the MPS daemon's pipe
 *            and the others do not (CUDA_MPS_PIPE_DIRECTORY of their
 *            own): brg_comm_device_setup must fail on every rank with
 *            BRG_ERR_MISMATCH naming ranks 0 and 1, not pick two modes
 *            that wait on each other forever; TEST_MPS=on or off (the
 *            driver's answer, BRIGADE_EMU_MPS; off makes the emulated GPU
 *            run one process's kernels at a time): setup and an
 *            allreduce succeed, every element checked
 *
 *   streams  kernel mode: one communicator, 64 collectives (one-shot and
 *            ring sizes) alternating over 3 streams, every element checked
 *   shared   two ranks as threads of one process on one GPU, both on the
 *            legacy stream (NULL): refused with BRG_ERR_INVALID_USAGE
 *            naming the shared stream, never a hang; then both on one
 *            stream they made: the second is refused, the first's kernel
 *            stopped
 *   mismatch kernel mode: ranks call different collectives (count on the
 *            one-shot path and on the ring, dtype, op, root, collective);
 *            the call after, brg_comm_last_error and
 *            brg_comm_get_async_error report it within BRIGADE_TIMEOUT_MS
 *            + 5 s, a BRG_ERR_MISMATCH naming both calls on some rank,
 *            each call given to a rank that made it; at 3 ranks or more
 *            with cuda_ipc, also rank 1 on the ring and the others on the
 *            one-shot path (LL and flags), rank 0 late: the previous
 *            rank's header found to differ during a one-shot wait
 *   stuck    kernel mode: rank 0 launches an allreduce that rank 1, alive,
 *            never joins: its kernel is stopped within BRIGADE_TIMEOUT_MS +
 *            5 s, the error naming the collective, channel, step and peer
 *   stale    kernel mode: one captured graph launched on two streams with
 *            nothing ordering them: a launch that finds another one in its
 *            channels fails, naming it, rather than reduce stale data
 *
 *   emurules the emulated module's strict rules (emu_module.c), on the
 *            module alone: under each rule that is on (BRIGADE_EMU_STRICT
 *            and the rule's own setting, read here as the module reads
 *            them) a kernel's first launch and load_kernels wait for a
 *            busy kernel on another stream, later launches do not; a free
 *            waits for it, and a synchronous copy waits for a busy
 *            per-thread stream but not a busy non-blocking one; a stream
 *            that shares a hardware queue (stream 8 and stream 0 of 8
 *            CUDA_DEVICE_MAX_CONNECTIONS) waits behind the other's held
 *            work. With a rule off, none of these waits.
 *
 *   test_device_cases CASE [N]    exits 77 without a GPU (1 with
 *                                 BRIGADE_TEST_NO_SKIP set)
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../kernels/cuda/brg_cuda.h"
#include "../multiproc/harness.h"

static int g_timeout_ms;

static const brg__cuda_api *open_api(char *why, size_t cap) {
  const char *path = getenv("BRIGADE_CUDA_MODULE");
  if (!path || !*path) {
    snprintf(why, cap, "BRIGADE_CUDA_MODULE is not set");
    return NULL;
  }
  return brg__cuda_open(path, why, cap);
}

static double ms_since(int64_t t0) {
  return (double)(mp_now_ns() - t0) / 1e6;
}

/* in[i] = (i % 1000) + rank: the sum over N ranks is N (i % 1000) + N(N-1)/2. */
static float *host_input(size_t n, int rank) {
  float *h = malloc(n * sizeof *h);
  if (h)
    for (size_t i = 0; i < n; i++) h[i] = (float)(i % 1000) + (float)rank;
  return h;
}

static size_t first_wrong(const float *h, size_t n, int nranks) {
  for (size_t i = 0; i < n; i++)
    if (h[i] != (float)(nranks * (int)(i % 1000) + nranks * (nranks - 1) / 2)) return i;
  return n;
}

/* A device buffer on the current device holding host_input(n, rank). */
static void *device_input(const brg__cuda_api *api, size_t n, int rank) {
  void *d = NULL;
  float *h = host_input(n, rank);
  int e = h ? api->drv.mem_alloc(&d, n * sizeof(float)) : 0;
  if (!h || e) {
    mp_fail("rank %d: a device buffer of %zu floats: %s", rank, n,
            h ? api->drv.error_string(e) : "out of host memory");
    free(h);
    return NULL;
  }
  if ((e = api->drv.mem_copy(d, h, n * sizeof(float))) != 0)
    mp_fail("rank %d: copying the input to the GPU: %s", rank, api->drv.error_string(e));
  free(h);
  return d;
}

static int check_device(const brg__cuda_api *api, const void *d, size_t n, int nranks,
                        const char *what) {
  float *h = malloc(n * sizeof *h);
  if (!h) return 0;
  api->drv.mem_copy(h, d, n * sizeof(float));
  size_t i = first_wrong(h, n, nranks);
  if (i < n) mp_fail("%s: element %zu is %g", what, i, h[i]);
  free(h);
  return i == n;
}

/* ================================================================ queued */

#define QUEUED_HOST (1u << 22)
#define QUEUED_DEV 1000003u

static int body_queued(mp_ctx *ctx) {
  char why[256];
  const brg__cuda_api *api = open_api(why, sizeof why);
  if (!api) return mp_fail("no GPU: %s", why), 1;
  if (api->drv.probe(NULL, 0) < 2) return mp_info("one GPU: nothing to check"), 0;
  if (api->drv.set_device(1) != 0) return mp_fail("cudaSetDevice(1) failed"), 1;
  void *d = device_input(api, QUEUED_DEV, ctx->rank), *st = NULL;
  float *h = host_input(QUEUED_HOST, ctx->rank);
  if (!d || !h || api->drv.stream_create(&st) != 0) return mp_fail("setup failed"), 1;
  brg_request req;
  brg_status s = brg_iallreduce(h, h, QUEUED_HOST, BRG_FLOAT32, BRG_SUM, ctx->comm, &req);
  MP_CHECK(s == BRG_SUCCESS, "brg_iallreduce: %s", brg_comm_last_error(ctx->comm));
  /* Queued behind the iallreduce: the progress thread runs it. */
  s = brg_allreduce(d, d, QUEUED_DEV, BRG_FLOAT32, BRG_SUM, ctx->comm, st);
  MP_CHECK(s == BRG_SUCCESS, "device allreduce on GPU 1 behind a host iallreduce: %s: %s",
           brg_status_string(s), brg_comm_last_error(ctx->comm));
  s = brg_wait(&req);
  MP_CHECK(s == BRG_SUCCESS, "brg_wait: %s", brg_comm_last_error(ctx->comm));
  size_t i = first_wrong(h, QUEUED_HOST, ctx->nranks);
  MP_CHECK(i == QUEUED_HOST, "host iallreduce: element %zu is %g", i, i < QUEUED_HOST ? h[i] : 0);
  api->drv.stream_sync(st);
  check_device(api, d, QUEUED_DEV, ctx->nranks, "device allreduce on GPU 1");
  int cur = -1;
  api->drv.get_device(&cur);
  MP_CHECK(cur == 1, "the caller's current device changed to %d", cur);
  api->drv.stream_destroy(st);
  api->drv.mem_free(d);
  free(h);
  return 0;
}

/* =============================================================== threads */

#define THREADS_COUNT 1000003u

typedef struct thread_rank {
  const brg__cuda_api *api;
  const brg_unique_id *id;
  int rank, nranks, gpu;
} thread_rank;

static void *thread_main(void *arg) {
  thread_rank *t = arg;
  const brg__cuda_api *api = t->api;
  brg_comm *c = NULL;
  void *d = NULL, *st = NULL;
  if (api->drv.set_device(t->gpu) != 0 || !(d = device_input(api, THREADS_COUNT, t->rank)) ||
      api->drv.stream_create(&st) != 0) {
    mp_fail("rank %d: setup on GPU %d failed", t->rank, t->gpu);
    return NULL;
  }
  brg_status s = brg_comm_init(&c, t->nranks, t->id, t->rank);
  if (s == BRG_SUCCESS) s = brg_allreduce(d, d, THREADS_COUNT, BRG_FLOAT32, BRG_SUM, c, st);
  if (s == BRG_SUCCESS) s = brg_broadcast(d, d, 7, BRG_FLOAT32, t->nranks - 1, c, st);
  if (s != BRG_SUCCESS) {
    mp_fail("rank %d on GPU %d: %s: %s", t->rank, t->gpu, brg_status_string(s),
            brg_comm_last_error(c));
  } else {
    api->drv.stream_sync(st);
    char what[64];
    snprintf(what, sizeof what, "rank %d on GPU %d", t->rank, t->gpu);
    check_device(api, d, THREADS_COUNT, t->nranks, what);
  }
  if (c) brg_comm_destroy(c);
  api->drv.stream_destroy(st);
  api->drv.mem_free(d);
  return NULL;
}

static int body_threads(mp_ctx *ctx) {
  char why[256];
  const brg__cuda_api *api = open_api(why, sizeof why);
  if (!api) return mp_fail("no GPU: %s", why), 1;
  int ngpu = api->drv.probe(NULL, 0);
  if (ngpu < 2) return mp_info("one GPU: nothing to check"), 0;
  int n = *(const int *)ctx->arg;
  brg_unique_id id;
  if (brg_get_unique_id(&id) != BRG_SUCCESS) return mp_fail("brg_get_unique_id"), 1;
  pthread_t th[8];
  thread_rank t[8];
  for (int r = 0; r < n; r++) {
    t[r] = (thread_rank){.api = api, .id = &id, .rank = r, .nranks = n, .gpu = r % ngpu};
    pthread_create(&th[r], NULL, thread_main, &t[r]);
  }
  for (int r = 0; r < n; r++) pthread_join(th[r], NULL);
  return 0;
}

/* ============================================================== emurules */

#define RULE_BUSY_US 400000
#define RULE_WAITED_MS 350.0 /* the busy kernel's time, less the clock's slack */
#define RULE_QUICK_MS 200.0  /* a call that waited for nothing */

static int rule_on(const char *name) {
  const char *v = getenv(name);
  if (v && *v) return atoi(v) != 0;
  v = getenv("BRIGADE_EMU_STRICT");
  return v && *v && atoi(v) != 0;
}

/* Whether a call took as long as the busy kernel it should wait for
 * (`waits`), or returned at once; a complaint names it when not. */
static int rule_check(const char *what, double ms, int waits) {
  int ok = waits ? ms >= RULE_WAITED_MS : ms < RULE_QUICK_MS;
  if (!ok)
    mp_fail("%s took %.1f ms: it should %s the %d ms busy kernel", what, ms,
            waits ? "wait for" : "not wait for", RULE_BUSY_US / 1000);
  else
    mp_info("%s: %.1f ms (%s)", what, ms, waits ? "waited" : "did not wait");
  return !ok;
}

static int body_emurules(mp_ctx *ctx) {
  (void)ctx;
  char why[256];
  const brg__cuda_api *api = open_api(why, sizeof why);
  if (!api) return mp_fail("no GPU: %s", why), 1;
  int sync_free = rule_on("BRIGADE_EMU_SYNC_FREE"), queues = rule_on("BRIGADE_EMU_HW_QUEUES"),
      lazy = rule_on("BRIGADE_EMU_LAZY_LOAD");
  const char *mc = getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  int conns = mc && *mc ? atoi(mc) : 8;
  conns = conns < 1 ? 1 : conns > 32 ? 32 : conns;
  void *st[9] = {0}, *buf = NULL, *spare = NULL, *ev = NULL;
  float host[16] = {0};
  for (int i = 0; i < 9; i++) /* the process's first streams: queues in this order */
    if (api->drv.stream_create(&st[i]) != 0) return mp_fail("stream_create"), 1;
  if (api->drv.mem_alloc(&buf, 4096) || api->drv.event_create(&ev))
    return mp_fail("mem_alloc or event_create"), 1;
  int bad = 0;
  int64_t t0;

  /* Lazy loading: busy's own first launch finds nothing queued. */
  api->kern.busy(RULE_BUSY_US, st[1]);
  t0 = mp_now_ns();
  api->kern.reduce(buf, NULL, buf, buf, 16, BRG_FLOAT32, BRG_SUM, 1, st[2]);
  bad += rule_check("a reduce kernel's first launch", ms_since(t0), lazy);
  api->drv.stream_sync(st[1]);
  api->kern.busy(RULE_BUSY_US, st[1]);
  t0 = mp_now_ns();
  api->kern.reduce(buf, NULL, buf, buf, 16, BRG_FLOAT32, BRG_SUM, 1, st[2]);
  bad += rule_check("its second launch", ms_since(t0), 0);
  t0 = mp_now_ns();
  api->drv.load_kernels();
  bad += rule_check("load_kernels", ms_since(t0), lazy);
  api->drv.stream_sync(st[1]);
  api->kern.busy(RULE_BUSY_US, st[1]);
  t0 = mp_now_ns();
  api->kern.divide(buf, buf, 16, BRG_FLOAT32, 2, st[2]);
  bad += rule_check("a divide kernel's first launch after load_kernels", ms_since(t0), 0);
  api->drv.stream_sync(st[1]);
  api->drv.stream_sync(st[2]);

  /* Synchronizing calls. */
  if (api->drv.mem_alloc(&spare, 64)) return mp_fail("mem_alloc"), 1;
  api->kern.busy(RULE_BUSY_US, st[3]);
  t0 = mp_now_ns();
  api->drv.mem_free(spare);
  bad += rule_check("mem_free beside a busy stream", ms_since(t0), sync_free);
  api->drv.stream_sync(st[3]);
  api->kern.busy(RULE_BUSY_US, st[3]);
  t0 = mp_now_ns();
  api->drv.mem_copy(host, buf, sizeof host);
  bad += rule_check("mem_copy beside a busy non-blocking stream", ms_since(t0), 0);
  api->drv.stream_sync(st[3]);
  api->kern.busy(RULE_BUSY_US, (void *)2); /* cudaStreamPerThread: blocking */
  t0 = mp_now_ns();
  api->drv.mem_copy(host, buf, sizeof host);
  bad += rule_check("mem_copy beside a busy per-thread stream", ms_since(t0), sync_free);
  api->drv.stream_sync((void *)2);

  /* Hardware queues: stream 8's record waits behind its busy kernel and
   * holds its queue; stream 0's record, issued after it, waits too where
   * the two share one. */
  int shared = queues && 8 % conns == 0;
  api->kern.busy(RULE_BUSY_US, st[8]);
  api->drv.event_record(ev, st[8]);
  void *ev0 = NULL;
  if (api->drv.event_create(&ev0)) return mp_fail("event_create"), 1;
  t0 = mp_now_ns();
  api->drv.event_record(ev0, st[0]);
  while (api->drv.event_query(ev0) != 0) usleep(1000);
  bad += rule_check("stream 0's record issued behind stream 8's held work", ms_since(t0), shared);
  api->drv.stream_sync(st[8]);
  mp_info("rules: sync-free %d, hardware queues %d (%d), lazy loading %d", sync_free, queues, conns,
          lazy);
  api->drv.event_destroy(ev0);
  api->drv.event_destroy(ev);
  for (int i = 0; i < 9; i++) api->drv.stream_destroy(st[i]);
  api->drv.mem_free(buf);
  return bad ? 1 : 0;
}

/* =============================================================== destroy */

#define DESTROY_COUNT (1u << 22)

static int body_destroy(mp_ctx *ctx) {
  char why[256];
  const brg__cuda_api *api = open_api(why, sizeof why);
  if (!api) return mp_fail("no GPU: %s", why), 1;
  void *d = device_input(api, DESTROY_COUNT, ctx->rank), *st = NULL;
  if (!d || api->drv.stream_create(&st) != 0) return mp_fail("setup failed"), 1;
  brg_status s = brg_allreduce(d, d, DESTROY_COUNT, BRG_FLOAT32, BRG_SUM, ctx->comm, st);
  MP_CHECK(s == BRG_SUCCESS, "device allreduce: %s", brg_comm_last_error(ctx->comm));
  /* At once: the collective is only enqueued, and may still run on this
   * rank's stream and its neighbours'. */
  s = brg_comm_destroy(ctx->comm);
  ctx->comm = NULL;
  MP_CHECK(s == BRG_SUCCESS, "brg_comm_destroy: %s: %s", brg_status_string(s),
           brg_comm_last_error(NULL));
  api->drv.stream_sync(st);
  check_device(api, d, DESTROY_COUNT, ctx->nranks, "allreduce finished after destroy");
  api->drv.stream_destroy(st);
  api->drv.mem_free(d);
  return 0;
}

/* ================================================================== kill */

#define KILL_COUNT (1u << 20)
#define VICTIM 1

static int body_kill(mp_ctx *ctx) {
  char why[256];
  const brg__cuda_api *api = open_api(why, sizeof why);
  if (!api) return mp_fail("no GPU: %s", why), 1;
  mp_shared *sh = ctx->shared;
  void *d = device_input(api, KILL_COUNT, 0), *st = NULL;
  if (!d || api->drv.stream_create(&st) != 0) return mp_fail("setup failed"), 1;
  brg_status s = BRG_SUCCESS;
  int iter = 0;
  int64_t start = mp_now_ns();
  while ((s = brg_allreduce(d, d, KILL_COUNT, BRG_FLOAT32, BRG_MAX, ctx->comm, st)) ==
         BRG_SUCCESS) {
    __atomic_store_n(&sh->progress[ctx->rank], ++iter, __ATOMIC_RELEASE);
    if (ms_since(start) > 60000) {
      mp_fail("still no error 60 s after the loop started");
      break;
    }
  }
  int64_t t_sig = __atomic_load_n(&sh->signal_ns, __ATOMIC_ACQUIRE);
  const char *m = brg_comm_last_error(ctx->comm);
  mp_info("rank %d: %s after %d calls: %s", ctx->rank, brg_status_string(s), iter, m);
  if (s != BRG_SUCCESS) {
    MP_CHECK(t_sig != 0, "the allreduce failed before rank %d was killed: %s", VICTIM, m);
    double el = t_sig ? (double)(mp_now_ns() - t_sig) / 1e6 : 0;
    MP_CHECK(el <= g_timeout_ms + 5000.0, "the error came %.0f ms after the kill", el);
    MP_CHECK(mp_names_rank(m, VICTIM), "the error does not name rank %d: \"%s\"", VICTIM, m);
  }
  int64_t t0 = mp_now_ns();
  s = brg_comm_destroy(ctx->comm);
  ctx->comm = NULL;
  double el = ms_since(t0);
  MP_CHECK(el <= g_timeout_ms + 5000.0, "brg_comm_destroy took %.0f ms", el);
  if (s != BRG_SUCCESS) {
    /* The stream could not drain: the message says which and why. */
    const char *dm = brg_comm_last_error(NULL);
    mp_info("destroy: %s: %s", brg_status_string(s), dm);
    MP_CHECK(mp_names_rank(dm, VICTIM), "destroy's error does not name rank %d: \"%s\"", VICTIM,
             dm);
    MP_CHECK(strstr(dm, "stream") != NULL, "destroy's error does not name the stream: \"%s\"", dm);
  }
  /* The stream is left to the module; the process ends here. */
  return 0;
}

/* ================================================================= async */

#define ASYNC_COUNT 1000003u
#define ASYNC_LATE_MS 1000

static int body_async(mp_ctx *ctx) {
  char why[256];
  const brg__cuda_api *api = open_api(why, sizeof why);
  if (!api) return mp_fail("no GPU: %s", why), 1;
  void *a = device_input(api, ASYNC_COUNT, ctx->rank), *st = NULL;
  void *b = device_input(api, ASYNC_COUNT, ctx->rank);
  if (!a || !b || api->drv.stream_create(&st) != 0) return mp_fail("setup failed"), 1;
  /* The first device collective builds the device ring: every rank waits
   * for all, so it is not timed. */
  brg_status s = brg_allreduce(a, a, 1, BRG_FLOAT32, BRG_SUM, ctx->comm, st);
  MP_CHECK(s == BRG_SUCCESS, "first allreduce: %s", brg_comm_last_error(ctx->comm));
  api->drv.stream_sync(st);
  api->drv.mem_copy(a, b, sizeof(float)); /* element 0 back to its input */
  float h[3] = {1, 2, 3};
  s = brg_barrier(ctx->comm);
  MP_CHECK(s == BRG_SUCCESS, "barrier: %s", brg_comm_last_error(ctx->comm));
  if (ctx->rank != 0) usleep(ASYNC_LATE_MS * 1000);
  int64_t t0 = mp_now_ns();
  s = brg_allreduce(a, a, ASYNC_COUNT, BRG_FLOAT32, BRG_SUM, ctx->comm, st);
  if (s == BRG_SUCCESS) s = brg_allreduce(b, b, ASYNC_COUNT, BRG_FLOAT32, BRG_SUM, ctx->comm, st);
  double issue_ms = ms_since(t0);
  MP_CHECK(s == BRG_SUCCESS, "device allreduce: %s", brg_comm_last_error(ctx->comm));
  if (ctx->rank == 0)
    MP_CHECK(issue_ms < ASYNC_LATE_MS / 2,
             "rank 0's two device allreduces took %.0f ms to return while the other ranks "
             "were %d ms late: the call waited for them",
             issue_ms, ASYNC_LATE_MS);
  /* A host collective is ordered after them on every rank. */
  s = brg_allreduce(h, h, 3, BRG_FLOAT32, BRG_SUM, ctx->comm, NULL);
  MP_CHECK(s == BRG_SUCCESS && h[0] == (float)ctx->nranks && h[2] == 3.0f * (float)ctx->nranks,
           "host allreduce after them: %s, h = %g %g %g", brg_comm_last_error(ctx->comm),
           (double)h[0], (double)h[1], (double)h[2]);
  api->drv.stream_sync(st);
  mp_info("rank %d: the calls returned after %.1f ms, the stream finished after %.1f ms", ctx->rank,
          issue_ms, ms_since(t0));
  check_device(api, a, ASYNC_COUNT, ctx->nranks, "first async allreduce");
  check_device(api, b, ASYNC_COUNT, ctx->nranks, "second async allreduce");
  api->drv.stream_destroy(st);
  api->drv.mem_free(a);
  api->drv.mem_free(b);
  return 0;
}

/* ================================================================= graph */

#define GRAPH_COUNT 262147u /* prime: several slices per channel */
#define GRAPH_RS 4099u      /* reduce-scatter: elements per rank */
#define GRAPH_SMALL 1031u   /* an allreduce the one-shot path takes */
#define GRAPH_LAUNCHES 4

/* Launch `it` of rank r: in[i] = (i % 1000) + r + it, so every rank
 * expects N (i % 1000) + N(N-1)/2 + N it at element i of the whole. */
static void graph_fill(const brg__cuda_api *api, void *d, size_t n, int rank, int it) {
  float *h = host_input(n, rank + it);
  if (!h || api->drv.mem_copy(d, h, n * sizeof(float)) != 0) mp_fail("filling the input failed");
  free(h);
}

static int graph_check(const brg__cuda_api *api, const void *d, size_t n, size_t first, int nranks,
                       int it, const char *what) {
  float *h = malloc(n * sizeof *h);
  if (!h || api->drv.mem_copy(h, d, n * sizeof(float)) != 0)
    return mp_fail("%s: read back", what), 0;
  for (size_t i = 0; i < n; i++) {
    size_t g = first + i;
    float want = (float)(nranks * (int)(g % 1000) + nranks * (nranks - 1) / 2 + nranks * it);
    if (h[i] != want) {
      mp_fail("%s, launch %d: element %zu is %g, expected %g", what, it, i, h[i], want);
      free(h);
      return 0;
    }
  }
  free(h);
  return 1;
}

/* A step the rest depends on: on failure the rank stops here. */
#define REQUIRE(cond, ...)                                                                         \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      mp_fail(__VA_ARGS__);                                                                        \
      return 1;                                                                                    \
    }                                                                                              \
  } while (0)

static int body_graph(mp_ctx *ctx) {
  char why[256];
  const brg__cuda_api *api = open_api(why, sizeof why);
  if (!api) return mp_fail("no GPU: %s", why), 1;
  const char *mode = getenv("BRIGADE_DEVICE_MODE");
  int step = mode && !strcmp(mode, "step");
  int n = ctx->nranks, rank = ctx->rank;
  if (api->drv.set_device(rank % api->drv.probe(NULL, 0)) != 0) return mp_fail("cudaSetDevice"), 1;
  void *send = NULL, *recv = NULL, *rs = NULL, *sm = NULL, *x = NULL, *st = NULL, *g = NULL;
  if (api->drv.mem_alloc(&send, GRAPH_COUNT * sizeof(float)) ||
      api->drv.mem_alloc(&recv, GRAPH_COUNT * 4) || api->drv.mem_alloc(&rs, GRAPH_RS * 4) ||
      api->drv.mem_alloc(&sm, GRAPH_SMALL * 4) || !(x = device_input(api, 7, rank)) ||
      api->drv.stream_create(&st))
    return mp_fail("setup failed"), 1;
  graph_fill(api, send, GRAPH_COUNT, rank, 0);

  /* A captured call before the setup: refused, and the capture is intact. */
  REQUIRE(api->drv.capture_begin(st, 1) == 0, "capture_begin");
  brg_status s = brg_allreduce(send, recv, GRAPH_COUNT, BRG_FLOAT32, BRG_SUM, ctx->comm, st);
  REQUIRE(s == BRG_ERR_INVALID_USAGE &&
              strstr(brg_comm_last_error(ctx->comm), "brg_comm_device_setup"),
          "a captured allreduce before the setup: %s: %s", brg_status_string(s),
          brg_comm_last_error(ctx->comm));
  int e = api->drv.capture_end(st, &g);
  REQUIRE(e == 0, "capture_end after the refused call: %s", api->drv.error_string(e));
  api->drv.graph_destroy(g);
  g = NULL;

  s = brg_comm_device_setup(ctx->comm, -1);
  REQUIRE(s == BRG_SUCCESS, "brg_comm_device_setup: %s", brg_comm_last_error(ctx->comm));
  s = brg_comm_device_setup(ctx->comm, -1);
  REQUIRE(s == BRG_SUCCESS, "brg_comm_device_setup again: %s", brg_comm_last_error(ctx->comm));

  if (step) {
    REQUIRE(api->drv.capture_begin(st, 1) == 0, "capture_begin");
    s = brg_allreduce(send, recv, GRAPH_COUNT, BRG_FLOAT32, BRG_SUM, ctx->comm, st);
    REQUIRE(s == BRG_ERR_INVALID_USAGE && strstr(brg_comm_last_error(ctx->comm), "step mode"),
            "a captured allreduce in step mode: %s: %s", brg_status_string(s),
            brg_comm_last_error(ctx->comm));
    REQUIRE(api->drv.capture_end(st, &g) == 0, "capture_end");
    api->drv.graph_destroy(g);
    s = brg_allreduce(send, recv, GRAPH_COUNT, BRG_FLOAT32, BRG_SUM, ctx->comm, st);
    REQUIRE(s == BRG_SUCCESS, "allreduce after the refused capture: %s",
            brg_comm_last_error(ctx->comm));
    api->drv.stream_sync(st);
    graph_check(api, recv, GRAPH_COUNT, 0, n, 0, "step mode, uncaptured");
  } else {
    REQUIRE(api->drv.capture_begin(st, 1) == 0, "capture_begin");
    s = brg_allreduce(send, recv, GRAPH_COUNT, BRG_FLOAT32, BRG_SUM, ctx->comm, st);
    if (s == BRG_SUCCESS)
      s = brg_reduce_scatter(send, rs, GRAPH_RS, BRG_FLOAT32, BRG_SUM, ctx->comm, st);
    if (s == BRG_SUCCESS)
      s = brg_allreduce(send, sm, GRAPH_SMALL, BRG_FLOAT32, BRG_SUM, ctx->comm, st);
    REQUIRE(s == BRG_SUCCESS, "captured collectives: %s: %s", brg_status_string(s),
            brg_comm_last_error(ctx->comm));
    e = api->drv.capture_end(st, &g);
    REQUIRE(e == 0, "capture_end: %s", api->drv.error_string(e));
    for (int it = 0; it < GRAPH_LAUNCHES; it++) {
      graph_fill(api, send, GRAPH_COUNT, rank, it);
      api->drv.mem_set(recv, 0xff, GRAPH_COUNT * 4);
      api->drv.mem_set(rs, 0xff, GRAPH_RS * 4);
      api->drv.mem_set(sm, 0xff, GRAPH_SMALL * 4);
      e = api->drv.graph_launch(g, st);
      REQUIRE(e == 0, "graph_launch %d: %s", it, api->drv.error_string(e));
      if (it == 2) {
        s = brg_allreduce(x, x, 7, BRG_FLOAT32, BRG_SUM, ctx->comm, st);
        REQUIRE(s == BRG_SUCCESS, "an uncaptured allreduce between launches: %s",
                brg_comm_last_error(ctx->comm));
      }
      api->drv.stream_sync(st);
      graph_check(api, recv, GRAPH_COUNT, 0, n, it, "captured allreduce");
      graph_check(api, rs, GRAPH_RS, (size_t)rank * GRAPH_RS, n, it, "captured reduce-scatter");
      graph_check(api, sm, GRAPH_SMALL, 0, n, it, "captured small allreduce");
    }
    check_device(api, x, 7, n, "the uncaptured allreduce between launches");
    api->drv.graph_destroy(g);
    /* A second graph, the communicator's last call captured: destroy
     * must drain without waiting on anything recorded in a capture. */
    api->drv.mem_free(x);
    REQUIRE((x = device_input(api, 7, rank)) != NULL, "device_input");
    REQUIRE(api->drv.capture_begin(st, 1) == 0, "capture_begin");
    s = brg_allreduce(x, x, 7, BRG_FLOAT32, BRG_SUM, ctx->comm, st);
    REQUIRE(s == BRG_SUCCESS, "captured in-place allreduce: %s", brg_comm_last_error(ctx->comm));
    REQUIRE(api->drv.capture_end(st, &g) == 0, "capture_end");
    REQUIRE(api->drv.graph_launch(g, st) == 0, "graph_launch");
    api->drv.stream_sync(st);
    check_device(api, x, 7, n, "a captured in-place allreduce");
    api->drv.graph_destroy(g);
  }
  api->drv.stream_destroy(st);
  api->drv.mem_free(send);
  api->drv.mem_free(recv);
  api->drv.mem_free(rs);
  api->drv.mem_free(sm);
  api->drv.mem_free(x);
  return 0;
}

/* =============================================================== streams */

#define STREAMS_CALLS 64
#define STREAMS_SMALL 1000u /* the one-shot path */
#define STREAMS_RING 20011u /* the ring */

static int body_streams(mp_ctx *ctx) {
  char why[256];
  const brg__cuda_api *api = open_api(why, sizeof why);
  if (!api) return mp_fail("no GPU: %s", why), 1;
  int n = ctx->nranks, rank = ctx->rank;
  REQUIRE(api->drv.set_device(rank % api->drv.probe(NULL, 0)) == 0, "cudaSetDevice");
  void *st[3] = {0}, *buf[STREAMS_CALLS] = {0};
  size_t cnt[STREAMS_CALLS];
  for (int s = 0; s < 3; s++) REQUIRE(api->drv.stream_create(&st[s]) == 0, "stream_create");
  for (int i = 0; i < STREAMS_CALLS; i++) {
    cnt[i] = i % 2 ? STREAMS_RING : STREAMS_SMALL;
    REQUIRE(api->drv.mem_alloc(&buf[i], cnt[i] * sizeof(float)) == 0, "cudaMalloc");
    graph_fill(api, buf[i], cnt[i], rank, i);
  }
  brg_status s = brg_comm_device_setup(ctx->comm, -1);
  REQUIRE(s == BRG_SUCCESS, "brg_comm_device_setup: %s", brg_comm_last_error(ctx->comm));
  for (int i = 0; i < STREAMS_CALLS && s == BRG_SUCCESS; i++)
    s = brg_allreduce(buf[i], buf[i], cnt[i], BRG_FLOAT32, BRG_SUM, ctx->comm, st[i % 3]);
  REQUIRE(s == BRG_SUCCESS, "allreduces on 3 streams: %s: %s", brg_status_string(s),
          brg_comm_last_error(ctx->comm));
  for (int i = 0; i < 3; i++) api->drv.stream_sync(st[i]);
  int bad = 0;
  for (int i = 0; i < STREAMS_CALLS; i++) {
    char what[64];
    snprintf(what, sizeof what, "allreduce %d of %zu on stream %d", i, cnt[i], i % 3);
    bad += !graph_check(api, buf[i], cnt[i], 0, n, i, what);
  }
  MP_CHECK(bad == 0, "%d of %d allreduces on 3 streams were wrong", bad, STREAMS_CALLS);
  brg_status a = BRG_SUCCESS;
  brg_comm_get_async_error(ctx->comm, &a);
  MP_CHECK(a == BRG_SUCCESS, "async error after them: %s: %s", brg_status_string(a),
           brg_comm_last_error(ctx->comm));
  for (int i = 0; i < STREAMS_CALLS; i++) api->drv.mem_free(buf[i]);
  for (int i = 0; i < 3; i++) api->drv.stream_destroy(st[i]);
  return 0;
}

/* ================================================================ shared */

typedef struct shared_rank {
  const brg__cuda_api *api;
  const brg_unique_id *id;
  int rank, nranks;
  void *stream; /* the one both ranks pass: NULL, or one made on GPU 0 */
  brg_status s;
  char msg[512];
} shared_rank;

static void *shared_main(void *arg) {
  shared_rank *t = arg;
  const brg__cuda_api *api = t->api;
  brg_comm *c = NULL;
  void *d = NULL;
  t->s = BRG_ERR_INTERNAL;
  if (api->drv.set_device(0) != 0 || !(d = device_input(api, 4099, t->rank))) {
    mp_fail("rank %d: setup on GPU 0 failed", t->rank);
    return NULL;
  }
  brg_status s = brg_comm_init(&c, t->nranks, t->id, t->rank);
  if (s == BRG_SUCCESS) s = brg_allreduce(d, d, 4099, BRG_FLOAT32, BRG_SUM, c, t->stream);
  if (s == BRG_SUCCESS) {
    /* enqueued first: the other rank's refusal must stop this kernel */
    api->drv.stream_sync(t->stream);
    int64_t t0 = mp_now_ns();
    while (s == BRG_SUCCESS && ms_since(t0) < g_timeout_ms + 5000.0) {
      brg_comm_get_async_error(c, &s);
      if (s == BRG_SUCCESS) mp_sleep_ms(5);
    }
  }
  t->s = s;
  snprintf(t->msg, sizeof t->msg, "%s", brg_comm_last_error(c));
  if (c) brg_comm_destroy(c);
  api->drv.mem_free(d);
  return NULL;
}

static int body_shared(mp_ctx *ctx) {
  char why[256];
  const brg__cuda_api *api = open_api(why, sizeof why);
  if (!api) return mp_fail("no GPU: %s", why), 1;
  int n = *(const int *)ctx->arg;
  brg_unique_id id;
  if (brg_get_unique_id(&id) != BRG_SUCCESS) return mp_fail("brg_get_unique_id"), 1;
  pthread_t th[8];
  shared_rank t[8];
  int64_t t0 = mp_now_ns();
  for (int r = 0; r < n; r++) {
    t[r] = (shared_rank){.api = api, .id = &id, .rank = r, .nranks = n};
    pthread_create(&th[r], NULL, shared_main, &t[r]);
  }
  for (int r = 0; r < n; r++) pthread_join(th[r], NULL);
  mp_info("the ranks returned after %.0f ms", ms_since(t0));
  /* One stream of GPU 0 passed by both ranks: the second to launch on it
   * is refused, the first one's kernel is stopped. */
  void *st = NULL;
  brg_unique_id id2;
  REQUIRE(api->drv.set_device(0) == 0 && api->drv.stream_create(&st) == 0, "stream_create");
  REQUIRE(brg_get_unique_id(&id2) == BRG_SUCCESS, "brg_get_unique_id");
  pthread_t th2[8];
  shared_rank t2[8];
  for (int r = 0; r < n; r++) {
    t2[r] = (shared_rank){.api = api, .id = &id2, .rank = r, .nranks = n, .stream = st};
    pthread_create(&th2[r], NULL, shared_main, &t2[r]);
  }
  for (int r = 0; r < n; r++) pthread_join(th2[r], NULL);
  int refused = 0;
  for (int r = 0; r < n; r++) {
    mp_info("one stream: rank %d: %s: %s", r, brg_status_string(t2[r].s), t2[r].msg);
    refused += t2[r].s == BRG_ERR_INVALID_USAGE && mp_contains(t2[r].msg, "stream");
    MP_CHECK(t2[r].s == BRG_ERR_INVALID_USAGE || t2[r].s == BRG_ERR_REMOTE,
             "rank %d: two ranks on one stream: %s, expected BRG_ERR_INVALID_USAGE (or "
             "BRG_ERR_REMOTE, the other's refusal): %s",
             r, brg_status_string(t2[r].s), t2[r].msg);
  }
  MP_CHECK(refused > 0, "no rank was refused the stream another rank launched on");
  api->drv.stream_destroy(st);
  /* The rank refused second stops the first one's queued kernel: that
   * rank hears the refusal as BRG_ERR_REMOTE. */
  int refused_null = 0;
  for (int r = 0; r < n; r++) {
    mp_info("rank %d: %s: %s", r, brg_status_string(t[r].s), t[r].msg);
    refused_null += t[r].s == BRG_ERR_INVALID_USAGE;
    MP_CHECK(t[r].s == BRG_ERR_INVALID_USAGE ||
                 (t[r].s == BRG_ERR_REMOTE && mp_contains(t[r].msg, "same GPU")),
             "rank %d: a device allreduce on the stream another rank of this process uses on "
             "the same GPU returned %s, expected BRG_ERR_INVALID_USAGE (or BRG_ERR_REMOTE, "
             "the other's refusal): %s",
             r, brg_status_string(t[r].s), t[r].msg);
    if (t[r].s == BRG_ERR_INVALID_USAGE)
      MP_CHECK(mp_contains(t[r].msg, "stream") && mp_contains(t[r].msg, "same GPU"),
               "rank %d: the message does not name the shared stream and GPU: %s", r, t[r].msg);
  }
  MP_CHECK(refused_null > 0, "no rank was refused the legacy stream another rank launched on");
  return 0;
}

/* ============================================================== mismatch */

/* The last two (3 ranks or more, with the one-shot path): rank 1 takes
 * the ring, the others the one-shot path (LL lines, then flags), and rank
 * 0 calls only once the others have their error: rank 1's next rank finds
 * rank 1's header differ while it waits for rank 0's one-shot input, and
 * must name rank 1, not rank 0. */
enum {
  KM_COUNT,
  KM_COUNT_RING,
  KM_DTYPE,
  KM_OP,
  KM_ROOT,
  KM_KIND,
  KM_LATE_LL,
  KM_LATE_FLAGS,
  KM_N
};
static const char *KM_NAMES[KM_N] = {"count 1000 vs 1001 (one-shot)",
                                     "count 70001 vs 70002 (ring)",
                                     "float32 vs int32",
                                     "sum vs max",
                                     "broadcast root 0 vs 1",
                                     "allreduce vs broadcast",
                                     "count 1000 (one-shot, LL) vs 70001 (ring), rank 0 late",
                                     "count 12000 (one-shot, flags) vs 70001 (ring), rank 0 late"};

static int km_names_both(int kind, const char *m) {
  switch (kind) {
  case KM_COUNT: return mp_contains(m, "count 1000,") && mp_contains(m, "count 1001,");
  case KM_COUNT_RING: return mp_contains(m, "count 70001,") && mp_contains(m, "count 70002,");
  case KM_DTYPE: return mp_contains(m, "float32") && mp_contains(m, "int32");
  case KM_OP: return mp_contains(m, "sum") && mp_contains(m, "max");
  case KM_ROOT: return mp_contains(m, "root 0") && mp_contains(m, "root 1");
  case KM_LATE_LL: return mp_contains(m, "count 1000,") && mp_contains(m, "count 70001,");
  case KM_LATE_FLAGS: return mp_contains(m, "count 12000,") && mp_contains(m, "count 70001,");
  default: return mp_contains(m, "allreduce") && mp_contains(m, "broadcast");
  }
}

/* Whether a mismatch message of rank `rank` gives each call to a rank
 * that made it: its own to itself, and the other to rank 1 (the odd call)
 * where it is not rank 1, to another rank where it is. */
static int km_ranks_right(const char *m, int rank) {
  const char *p = strstr(m, "collective mismatch: rank "), *q = p ? strstr(p, " but rank ") : NULL;
  int mine = -1, theirs = -1;
  if (!q || sscanf(p, "collective mismatch: rank %d called", &mine) != 1 ||
      sscanf(q, " but rank %d called", &theirs) != 1)
    return 0;
  return mine == rank && theirs != rank && (theirs == 1) == (rank != 1);
}

static int body_mismatch(mp_ctx *ctx) {
  char why[256];
  const brg__cuda_api *api = open_api(why, sizeof why);
  if (!api) return mp_fail("no GPU: %s", why), 1;
  int kind = *(const int *)ctx->arg, rank = ctx->rank, odd = rank == 1;
  mp_shared *sh = ctx->shared;
  brg_comm *c = ctx->comm;
  REQUIRE(api->drv.set_device(rank % api->drv.probe(NULL, 0)) == 0, "cudaSetDevice");
  void *d = device_input(api, 70002, rank), *st = NULL;
  REQUIRE(d && api->drv.stream_create(&st) == 0, "setup failed");
  brg_status s = brg_comm_device_setup(c, -1);
  REQUIRE(s == BRG_SUCCESS, "brg_comm_device_setup: %s", brg_comm_last_error(c));
  /* one matched call first: the mismatch is the second */
  s = brg_allreduce(d, d, 7, BRG_FLOAT32, BRG_MAX, c, st);
  REQUIRE(s == BRG_SUCCESS, "matched allreduce: %s", brg_comm_last_error(c));
  int late = kind == KM_LATE_LL || kind == KM_LATE_FLAGS;
  if (late && rank == 0) {
    /* the others have their error first (or the deadline passed) */
    int64_t end = mp_now_ns() + (int64_t)(g_timeout_ms + 5000) * 1000000;
    while (__atomic_load_n(&sh->flags[1], __ATOMIC_ACQUIRE) < ctx->nranks - 1 && mp_now_ns() < end)
      mp_sleep_ms(5);
  }
  switch (kind) {
  case KM_COUNT: s = brg_allreduce(d, d, odd ? 1001 : 1000, BRG_FLOAT32, BRG_SUM, c, st); break;
  case KM_COUNT_RING:
    s = brg_allreduce(d, d, odd ? 70002 : 70001, BRG_FLOAT32, BRG_SUM, c, st);
    break;
  case KM_DTYPE:
    s = brg_allreduce(d, d, 4096, odd ? BRG_INT32 : BRG_FLOAT32, BRG_SUM, c, st);
    break;
  case KM_OP: s = brg_allreduce(d, d, 4096, BRG_FLOAT32, odd ? BRG_MAX : BRG_SUM, c, st); break;
  case KM_ROOT: s = brg_broadcast(d, d, 4096, BRG_FLOAT32, odd ? 1 : 0, c, st); break;
  case KM_LATE_LL:
  case KM_LATE_FLAGS:
    s = brg_allreduce(d, d,
                      odd                  ? 70001
                      : kind == KM_LATE_LL ? 1000
                                           : 12000,
                      BRG_FLOAT32, BRG_SUM, c, st);
    break;
  default:
    s = odd ? brg_broadcast(d, d, 4096, BRG_FLOAT32, 0, c, st)
            : brg_allreduce(d, d, 4096, BRG_FLOAT32, BRG_SUM, c, st);
  }
  /* Enqueued: the kernels find the mismatch. */
  int64_t t0 = mp_now_ns();
  brg_status a = s;
  while (a == BRG_SUCCESS && ms_since(t0) < g_timeout_ms + 5000.0) {
    brg_comm_get_async_error(c, &a);
    if (a == BRG_SUCCESS) mp_sleep_ms(5);
  }
  double el = ms_since(t0);
  if (rank != 0) __atomic_fetch_add(&sh->flags[1], 1, __ATOMIC_ACQ_REL);
  char async_msg[512];
  snprintf(async_msg, sizeof async_msg, "%s", brg_comm_last_error(c));
  brg_status next = brg_allreduce(d, d, 7, BRG_FLOAT32, BRG_SUM, c, st);
  const char *m = brg_comm_last_error(c);
  mp_info("%s: call %s, async %s after %.0f ms, next call %s: %s", KM_NAMES[kind],
          brg_status_string(s), brg_status_string(a), el, brg_status_string(next), m);
  MP_CHECK(a != BRG_SUCCESS,
           "%s: no error from the call or brg_comm_get_async_error within %.0f ms", KM_NAMES[kind],
           el);
  MP_CHECK(next == BRG_ERR_MISMATCH || next == BRG_ERR_REMOTE,
           "%s: the call after returned %s, expected BRG_ERR_MISMATCH or BRG_ERR_REMOTE: %s",
           KM_NAMES[kind], brg_status_string(next), m);
  MP_CHECK(a == next, "%s: brg_comm_get_async_error said %s, the next call %s", KM_NAMES[kind],
           brg_status_string(a), brg_status_string(next));
  if (next == BRG_ERR_MISMATCH) {
    MP_CHECK(km_names_both(kind, m), "%s: the message does not name both calls: \"%s\"",
             KM_NAMES[kind], m);
    MP_CHECK(km_names_both(kind, async_msg),
             "%s: brg_comm_last_error after brg_comm_get_async_error does not name both calls: "
             "\"%s\"",
             KM_NAMES[kind], async_msg);
    MP_CHECK(km_ranks_right(m, rank),
             "%s: the message gives a call to a rank that did not make it: \"%s\"", KM_NAMES[kind],
             m);
  }
  sh->vals[rank] = next;
  __atomic_fetch_add(&sh->flags[0], 1, __ATOMIC_ACQ_REL);
  if (rank == 0) {
    int64_t end = mp_now_ns() + (int64_t)(g_timeout_ms + 10000) * 1000000;
    while (__atomic_load_n(&sh->flags[0], __ATOMIC_ACQUIRE) < ctx->nranks && mp_now_ns() < end)
      mp_sleep_ms(5);
    int mm = 0;
    for (int q = 0; q < ctx->nranks; q++) mm += sh->vals[q] == BRG_ERR_MISMATCH;
    MP_CHECK(mm > 0, "no rank reported BRG_ERR_MISMATCH (%s)", KM_NAMES[kind]);
  }
  t0 = mp_now_ns();
  brg_comm_destroy(c);
  ctx->comm = NULL;
  MP_CHECK(ms_since(t0) <= g_timeout_ms + 5000.0, "brg_comm_destroy took %.0f ms", ms_since(t0));
  api->drv.stream_destroy(st);
  api->drv.mem_free(d);
  return 0;
}

static int case_mismatch(int n) {
  int bad = 0;
  const char *only = getenv("KM_ONLY"), *tr = getenv("BRIGADE_TRANSPORTS");
  /* the one-shot path: ranks of one host, with cuda_ipc */
  int oneshot = n >= 3 && (!tr || strstr(tr, "cuda_ipc"));
  for (int k = 0; k < KM_N; k++) {
    if (only && *only && atoi(only) != k) continue;
    if ((k == KM_LATE_LL || k == KM_LATE_FLAGS) && !oneshot) continue;
    char name[96];
    snprintf(name, sizeof name, "kernel-mode mismatch: %s", KM_NAMES[k]);
    mp_opts o = {.name = name,
                 .nranks = n,
                 .deadline_ms = 2 * g_timeout_ms + 30000,
                 .init = MP_INIT_ID,
                 .victim = -1};
    /* the flags form: no LL lines (at 3 ranks every one-shot size takes
     * them by default) */
    if (k == KM_LATE_FLAGS) setenv("BRIGADE_DEVICE_LL_BYTES", "0", 1);
    bad |= mp_run(&o, body_mismatch, &k);
    if (k == KM_LATE_FLAGS) unsetenv("BRIGADE_DEVICE_LL_BYTES");
  }
  return bad;
}

/* ================================================================= stuck */

static int body_stuck(mp_ctx *ctx) {
  char why[256];
  const brg__cuda_api *api = open_api(why, sizeof why);
  if (!api) return mp_fail("no GPU: %s", why), 1;
  int rank = ctx->rank;
  mp_shared *sh = ctx->shared;
  REQUIRE(api->drv.set_device(rank % api->drv.probe(NULL, 0)) == 0, "cudaSetDevice");
  void *d = device_input(api, 70001, rank), *st = NULL;
  REQUIRE(d && api->drv.stream_create(&st) == 0, "setup failed");
  brg_status s = brg_comm_device_setup(ctx->comm, -1);
  REQUIRE(s == BRG_SUCCESS, "brg_comm_device_setup: %s", brg_comm_last_error(ctx->comm));
  if (rank == 0) {
    s = brg_allreduce(d, d, 70001, BRG_FLOAT32, BRG_SUM, ctx->comm, st);
    REQUIRE(s == BRG_SUCCESS, "allreduce: %s", brg_comm_last_error(ctx->comm));
    int64_t t0 = mp_now_ns();
    brg_status a = BRG_SUCCESS;
    while (a == BRG_SUCCESS && ms_since(t0) < g_timeout_ms + 20000.0) {
      brg_comm_get_async_error(ctx->comm, &a);
      if (a == BRG_SUCCESS) mp_sleep_ms(10);
    }
    double el = ms_since(t0);
    const char *m = brg_comm_last_error(ctx->comm);
    mp_info("%s after %.0f ms: %s", brg_status_string(a), el, m);
    MP_CHECK(a == BRG_ERR_TIMEOUT,
             "a kernel waiting for a live rank that never launches: %s "
             "after %.0f ms, expected BRG_ERR_TIMEOUT: %s",
             brg_status_string(a), el, m);
    MP_CHECK(el <= g_timeout_ms + 5000.0, "the stuck kernel was stopped %.0f ms after the call",
             el);
    MP_CHECK(mp_contains(m, "allreduce") && mp_contains(m, "channel") && mp_contains(m, "step") &&
                 mp_names_rank(m, 1),
             "the error does not name the collective, channel, step and rank 1: \"%s\"", m);
    s = brg_allreduce(d, d, 7, BRG_FLOAT32, BRG_SUM, ctx->comm, st);
    MP_CHECK(s == a, "the call after returned %s", brg_status_string(s));
    t0 = mp_now_ns();
    MP_CHECK(api->drv.stream_sync(st) == 0, "the stream did not drain");
    MP_CHECK(ms_since(t0) < 5000.0, "the stream drained after %.0f ms", ms_since(t0));
    __atomic_store_n(&sh->flags[0], 1, __ATOMIC_RELEASE);
  } else {
    /* Alive (its liveness thread beats) but never launching. */
    mp_wait_flag(0, g_timeout_ms + 30000);
  }
  brg_comm_destroy(ctx->comm);
  ctx->comm = NULL;
  api->drv.stream_destroy(st);
  api->drv.mem_free(d);
  return 0;
}

/* ================================================================= stale */

#define STALE_COUNT 70001u

static int body_stale(mp_ctx *ctx) {
  char why[256];
  const brg__cuda_api *api = open_api(why, sizeof why);
  if (!api) return mp_fail("no GPU: %s", why), 1;
  int n = ctx->nranks, rank = ctx->rank;
  REQUIRE(api->drv.set_device(rank % api->drv.probe(NULL, 0)) == 0, "cudaSetDevice");
  void *d = NULL, *st = NULL, *st2 = NULL, *g = NULL;
  REQUIRE(api->drv.mem_alloc(&d, STALE_COUNT * sizeof(float)) == 0 &&
              api->drv.stream_create(&st) == 0 && api->drv.stream_create(&st2) == 0,
          "setup failed");
  brg_status s = brg_comm_device_setup(ctx->comm, -1);
  REQUIRE(s == BRG_SUCCESS, "brg_comm_device_setup: %s", brg_comm_last_error(ctx->comm));
  REQUIRE(api->drv.capture_begin(st, 1) == 0, "capture_begin");
  s = brg_allreduce(d, d, STALE_COUNT, BRG_FLOAT32, BRG_SUM, ctx->comm, st);
  REQUIRE(s == BRG_SUCCESS, "captured allreduce: %s", brg_comm_last_error(ctx->comm));
  REQUIRE(api->drv.capture_end(st, &g) == 0, "capture_end");
  /* Two launches of the graph with nothing ordering them: in place, the
   * second one's input is the first one's output on every rank. Rank 1
   * comes late, so that rank 0's two launches both wait in their channels. */
  graph_fill(api, d, STALE_COUNT, rank, 0);
  if (rank == 1) mp_sleep_ms(300);
  REQUIRE(api->drv.graph_launch(g, st) == 0 && api->drv.graph_launch(g, st2) == 0, "graph_launch");
  api->drv.stream_sync(st);
  api->drv.stream_sync(st2);
  brg_status a = BRG_SUCCESS;
  int64_t t0 = mp_now_ns();
  while (a == BRG_SUCCESS && ms_since(t0) < 2000) {
    brg_comm_get_async_error(ctx->comm, &a);
    if (a == BRG_SUCCESS) mp_sleep_ms(5);
  }
  const char *m = brg_comm_last_error(ctx->comm);
  mp_info("%s: %s", brg_status_string(a), m);
  if (a == BRG_SUCCESS) {
    /* Succeeded: only if the launches ran one after the other, on right data. */
    float *h = malloc(STALE_COUNT * sizeof *h);
    api->drv.mem_copy(h, d, STALE_COUNT * sizeof(float));
    for (size_t i = 0; i < STALE_COUNT; i++) {
      float once = (float)(n * (int)(i % 1000) + n * (n - 1) / 2);
      if (h[i] != once * (float)n) {
        mp_fail("two unordered launches returned no error and element %zu is %g (%g expected "
                "from two allreduces in turn)",
                i, h[i], (double)(once * (float)n));
        break;
      }
    }
    free(h);
  } else if (a != BRG_ERR_REMOTE) {
    MP_CHECK(mp_contains(m, "another launch") || mp_contains(m, "stale"),
             "the error does not say another launch was running or what was stale: \"%s\"", m);
  }
  api->drv.graph_destroy(g);
  brg_comm_destroy(ctx->comm);
  ctx->comm = NULL;
  api->drv.stream_destroy(st);
  api->drv.stream_destroy(st2);
  api->drv.mem_free(d);
  return 0;
}

/* ========================================================== graphdestroy */

static int body_graphdestroy(mp_ctx *ctx) {
  char why[256];
  const brg__cuda_api *api = open_api(why, sizeof why);
  if (!api) return mp_fail("no GPU: %s", why), 1;
  int n = ctx->nranks, rank = ctx->rank;
  if (api->drv.set_device(rank % api->drv.probe(NULL, 0)) != 0) return mp_fail("cudaSetDevice"), 1;
  void *send = NULL, *recv = NULL, *st = NULL, *g = NULL;
  if (api->drv.mem_alloc(&send, GRAPH_COUNT * 4) || api->drv.mem_alloc(&recv, GRAPH_COUNT * 4) ||
      api->drv.stream_create(&st))
    return mp_fail("setup failed"), 1;
  graph_fill(api, send, GRAPH_COUNT, rank, 1);
  brg_status s = brg_comm_device_setup(ctx->comm, -1);
  REQUIRE(s == BRG_SUCCESS, "brg_comm_device_setup: %s", brg_comm_last_error(ctx->comm));
  REQUIRE(api->drv.capture_begin(st, 1) == 0, "capture_begin");
  s = brg_allreduce(send, recv, GRAPH_COUNT, BRG_FLOAT32, BRG_SUM, ctx->comm, st);
  REQUIRE(s == BRG_SUCCESS, "captured allreduce: %s", brg_comm_last_error(ctx->comm));
  REQUIRE(api->drv.capture_end(st, &g) == 0, "capture_end");
  api->drv.mem_set(recv, 0xff, GRAPH_COUNT * 4);
  for (int it = 0; it < 2; it++) REQUIRE(api->drv.graph_launch(g, st) == 0, "graph_launch %d", it);
  /* At once: the replays are only queued. */
  s = brg_comm_destroy(ctx->comm);
  ctx->comm = NULL;
  REQUIRE(s == BRG_SUCCESS, "brg_comm_destroy with replays in flight: %s: %s", brg_status_string(s),
          brg_comm_last_error(NULL));
  REQUIRE(api->drv.stream_sync(st) == 0, "stream_sync after destroy");
  graph_check(api, recv, GRAPH_COUNT, 0, n, 1, "replays in flight at destroy");
  /* A replay after destroy (the user's error): ends at once. */
  api->drv.mem_set(recv, 0xff, GRAPH_COUNT * 4);
  REQUIRE(api->drv.graph_launch(g, st) == 0, "graph_launch after destroy");
  REQUIRE(api->drv.stream_sync(st) == 0, "stream_sync of a replay after destroy");
  unsigned *h = malloc(GRAPH_COUNT * 4);
  REQUIRE(h && api->drv.mem_copy(h, recv, GRAPH_COUNT * 4) == 0, "mem_copy");
  size_t touched = 0;
  for (size_t i = 0; i < GRAPH_COUNT; i++) touched += h[i] != 0xffffffffu;
  free(h);
  REQUIRE(touched == 0, "a replay after destroy wrote %zu elements of recvbuf", touched);
  api->drv.graph_destroy(g);
  api->drv.stream_destroy(st);
  api->drv.mem_free(send);
  api->drv.mem_free(recv);
  return 0;
}

/* ============================================================ graphother */

/* A captured allreduce's graph launched on a stream other than the one
 * that captured it (the communicator has no event there), twice: rank 0
 * calls brg_comm_destroy while its first replay waits in its kernel for
 * the other ranks, which launch theirs a second later and destroy once
 * they are done. Rank 0's destroy must wait for its replays before it
 * frees the memory they and the other ranks' kernels use (the emulated
 * module unmaps it for real), so that all finish and every element is
 * right. First, a replay queued behind a busy kernel on that stream, and
 * destroy before it runs: it ends at once when it starts, recvbuf
 * untouched. */
#define GRAPHOTHER_LATE_MS 1000
#define GRAPHOTHER_COUNT 16411u /* prime */

static int body_graphother(mp_ctx *ctx) {
  char why[256];
  const brg__cuda_api *api = open_api(why, sizeof why);
  if (!api) return mp_fail("no GPU: %s", why), 1;
  int n = ctx->nranks, rank = ctx->rank;
  if (api->drv.set_device(rank % api->drv.probe(NULL, 0)) != 0) return mp_fail("cudaSetDevice"), 1;
  void *send = NULL, *recv = NULL, *st = NULL, *other = NULL, *g = NULL;
  if (api->drv.mem_alloc(&send, GRAPHOTHER_COUNT * 4) ||
      api->drv.mem_alloc(&recv, GRAPHOTHER_COUNT * 4) || api->drv.stream_create(&st) ||
      api->drv.stream_create(&other))
    return mp_fail("setup failed"), 1;
  graph_fill(api, send, GRAPHOTHER_COUNT, rank, 1);
  /* The queued replay's communicator, split off first, then the one in
   * flight on the harness's. */
  brg_comm *c1 = NULL;
  brg_status s = brg_comm_split(ctx->comm, 0, rank, &c1);
  REQUIRE(s == BRG_SUCCESS, "brg_comm_split: %s", brg_comm_last_error(ctx->comm));
  for (int queued = 1; queued >= 0; queued--) {
    const char *how = queued ? "queued" : "in flight";
    brg_comm *c = queued ? c1 : ctx->comm;
    s = brg_comm_device_setup(c, -1);
    REQUIRE(s == BRG_SUCCESS, "brg_comm_device_setup: %s", brg_comm_last_error(c));
    REQUIRE(api->drv.capture_begin(st, 1) == 0, "capture_begin");
    s = brg_allreduce(send, recv, GRAPHOTHER_COUNT, BRG_FLOAT32, BRG_SUM, c, st);
    REQUIRE(s == BRG_SUCCESS, "captured allreduce: %s", brg_comm_last_error(c));
    REQUIRE(api->drv.capture_end(st, &g) == 0, "capture_end");
    api->drv.mem_set(recv, 0xff, GRAPHOTHER_COUNT * 4);
    if (queued) REQUIRE(api->kern.busy(1500000, other) == 0, "busy kernel");
    if (!queued && rank != 0) mp_sleep_ms(GRAPHOTHER_LATE_MS);
    for (int it = 0; it < (queued ? 1 : 2); it++)
      REQUIRE(api->drv.graph_launch(g, other) == 0, "graph_launch %d on another stream", it);
    /* In flight: rank 0's first replay has begun and waits for the late
     * ranks when rank 0 destroys; they finish theirs before they do. */
    if (!queued && rank == 0) mp_sleep_ms(GRAPHOTHER_LATE_MS * 7 / 10);
    if (!queued && rank != 0) {
      REQUIRE(api->drv.stream_sync(other) == 0, "stream_sync");
      brg_status a = BRG_SUCCESS;
      brg_comm_get_async_error(c, &a);
      MP_CHECK(a == BRG_SUCCESS, "replays on another stream: %s: %s", brg_status_string(a),
               brg_comm_last_error(c));
    }
    int64_t t0 = mp_now_ns();
    s = brg_comm_destroy(c);
    if (!queued) ctx->comm = NULL;
    mp_info("brg_comm_destroy with a replay %s on another stream: %s after %.0f ms", how,
            brg_status_string(s), ms_since(t0));
    REQUIRE(s == BRG_SUCCESS, "brg_comm_destroy with replays %s on another stream: %s: %s", how,
            brg_status_string(s), brg_comm_last_error(NULL));
    REQUIRE(api->drv.stream_sync(other) == 0, "stream_sync after destroy");
    if (!queued) {
      graph_check(api, recv, GRAPHOTHER_COUNT, 0, n, 1, "replays on another stream at destroy");
    } else {
      unsigned *h = malloc(GRAPHOTHER_COUNT * 4);
      REQUIRE(h && api->drv.mem_copy(h, recv, GRAPHOTHER_COUNT * 4) == 0, "mem_copy");
      size_t touched = 0;
      for (size_t i = 0; i < GRAPHOTHER_COUNT; i++) touched += h[i] != 0xffffffffu;
      free(h);
      REQUIRE(touched == 0, "a replay that began after destroy wrote %zu elements of recvbuf",
              touched);
    }
    api->drv.graph_destroy(g);
  }
  api->drv.stream_destroy(st);
  api->drv.stream_destroy(other);
  api->drv.mem_free(send);
  api->drv.mem_free(recv);
  return 0;
}

/* ================================================================ limits */

/* Ranks whose one-shot limits differ only below what their slots round up
 * to, so that the slots agree (TEST_LIMITS=small: BRIGADE_DEVICE_SMALL_BYTES
 * 1000 on rank 0, 1024 on the others, BRIGADE_DEVICE_LL_BYTES 512 on all;
 * ll: BRIGADE_DEVICE_LL_BYTES 992 and 1000, SMALL_BYTES 4096; ringll:
 * BRIGADE_DEVICE_RING_LL_BYTES 1M and 2M, whose LL slots agree): the
 * setup must fail at once on every rank with BRG_ERR_MISMATCH naming both
 * values. Where it lets them through, the allreduce at the boundary (1024
 * bytes, 1000 with ll) is run to show what it does: one rank takes the
 * ring (the flags' one-shot form) and the other the one-shot path (LL). */
static int body_limits(mp_ctx *ctx) {
  const char *how = getenv("TEST_LIMITS");
  int ll = how && !strcmp(how, "ll"), rl = how && !strcmp(how, "ringll"), rank = ctx->rank;
  const char *var = rl   ? "BRIGADE_DEVICE_RING_LL_BYTES"
                    : ll ? "BRIGADE_DEVICE_LL_BYTES"
                         : "BRIGADE_DEVICE_SMALL_BYTES";
  const char *v0 = rl ? "1048576" : ll ? "992" : "1000";
  const char *v1 = rl ? "2097152" : ll ? "1000" : "1024";
  setenv(var, rank == 0 ? v0 : v1, 1);
  /* the other limit alike, below both: only the one compared differs */
  if (!rl)
    setenv(ll ? "BRIGADE_DEVICE_SMALL_BYTES" : "BRIGADE_DEVICE_LL_BYTES", ll ? "4096" : "512", 1);
  char why[256];
  const brg__cuda_api *api = open_api(why, sizeof why);
  if (!api) return mp_fail("no GPU: %s", why), 1;
  REQUIRE(api->drv.set_device(rank % api->drv.probe(NULL, 0)) == 0, "cudaSetDevice");
  size_t count = ll ? 250 : 256; /* float32: the bytes of the larger limit */
  void *d = device_input(api, count, rank), *st = NULL;
  REQUIRE(d && api->drv.stream_create(&st) == 0, "setup failed");
  brg_comm *c = NULL;
  brg_status s = brg_comm_init(&c, ctx->nranks, ctx->id, rank);
  REQUIRE(s == BRG_SUCCESS, "brg_comm_init: %s", brg_comm_last_error(NULL));
  int64_t t0 = mp_now_ns();
  s = brg_comm_device_setup(c, -1);
  const char *m = brg_comm_last_error(c);
  mp_info("%s %s on rank 0, %s on the others: setup %s after %.0f ms: %s", var, v0, v1,
          brg_status_string(s), ms_since(t0), m);
  if (s == BRG_SUCCESS) {
    s = brg_allreduce(d, d, count, BRG_FLOAT32, BRG_SUM, c, st);
    if (s == BRG_SUCCESS) api->drv.stream_sync(st);
    if (s == BRG_SUCCESS) brg_comm_get_async_error(c, &s);
    mp_fail("device setup accepted %s %s on rank 0 and %s on rank 1; an allreduce of %zu bytes "
            "then took %.0f ms and returned %s: %s",
            var, v0, v1, count * sizeof(float), ms_since(t0), brg_status_string(s),
            brg_comm_last_error(c));
  } else {
    MP_CHECK(s == BRG_ERR_MISMATCH && mp_contains(m, v0) && mp_contains(m, v1) &&
                 mp_contains(m, var),
             "device setup with %s %s and %s returned %s, expected %s naming both values and "
             "the setting: %s",
             var, v0, v1, brg_status_string(s), brg_status_string(BRG_ERR_MISMATCH), m);
    MP_CHECK(ms_since(t0) < g_timeout_ms, "the refusal took %.0f ms", ms_since(t0));
  }
  brg_comm_destroy(c);
  api->drv.stream_destroy(st);
  api->drv.mem_free(d);
  return 0;
}

/* =================================================================== mps */

#define MPS_COUNT 4099

static int body_mps(mp_ctx *ctx) {
  const char *how = getenv("TEST_MPS");
  int disagree = how && !strcmp(how, "disagree");
  char dir[128], ctl[160];
  snprintf(dir, sizeof dir, "/tmp/brigade-test-mps-%d-%d", (int)getppid(), ctx->rank);
  snprintf(ctl, sizeof ctl, "%s/control", dir);
  if (disagree) {
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) return mp_fail("mkdir %s: %m", dir), 1;
    FILE *f = ctx->rank == 0 ? fopen(ctl, "w") : NULL;
    if (f) fclose(f);
    setenv("CUDA_MPS_PIPE_DIRECTORY", dir, 1);
  } else {
    setenv("BRIGADE_EMU_MPS", how && !strcmp(how, "on") ? "1" : "0", 1);
  }
  char why[256];
  const brg__cuda_api *api = open_api(why, sizeof why);
  if (!api) return mp_fail("no GPU: %s", why), 1;
  void *d = device_input(api, MPS_COUNT, ctx->rank), *st = NULL;
  int e = d ? api->drv.stream_create(&st) : 0;
  if (!d || e)
    return mp_fail("setup: %s", d ? api->drv.error_string(e) : "no device buffer (above)"), 1;
  brg_status s = brg_comm_device_setup(ctx->comm, 0);
  const char *err = brg_comm_last_error(ctx->comm);
  unlink(ctl);
  rmdir(dir);
  if (disagree) {
    MP_CHECK(s == BRG_ERR_MISMATCH && strstr(err, "ranks 0 and 1") && strstr(err, "MPS"),
             "device setup with ranks that disagree on MPS returned %s (%s), expected %s naming "
             "ranks 0 and 1",
             brg_status_string(s), err, brg_status_string(BRG_ERR_MISMATCH));
  } else {
    MP_CHECK(s == BRG_SUCCESS, "device setup: %s: %s", brg_status_string(s), err);
    s = brg_allreduce(d, d, MPS_COUNT, BRG_FLOAT32, BRG_SUM, ctx->comm, st);
    MP_CHECK(s == BRG_SUCCESS, "device allreduce: %s", brg_comm_last_error(ctx->comm));
    MP_CHECK(api->drv.stream_sync(st) == 0, "stream_sync");
    check_device(api, d, MPS_COUNT, ctx->nranks, "allreduce of ranks sharing a GPU");
  }
  api->drv.stream_destroy(st);
  api->drv.mem_free(d);
  return 0;
}

/* ================================================================== main */

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr,
            "usage: %s queued|threads|destroy|kill|async|graph|streams|shared|mismatch|stuck|stale|"
            "graphdestroy|graphother|limits|mps|emurules [N]\n",
            argv[0]);
    return 2;
  }
  const char *cs = argv[1];
  int n = argc > 2 ? atoi(argv[2]) : 2;
  g_timeout_ms = mp_env_int("BRIGADE_TIMEOUT_MS", 60000);
  /* Look for a GPU in a child: CUDA must not start in the parent, whose
   * ranks are forked later. */
  pid_t pid = fork();
  if (pid == 0) {
    char why[256] = "";
    if (open_api(why, sizeof why)) _exit(0);
    printf("no GPU: %s\n", why);
    _exit(getenv("BRIGADE_TEST_NO_SKIP") ? 1 : 77);
  }
  int wst = 0;
  if (pid < 0 || waitpid(pid, &wst, 0) != pid || !WIFEXITED(wst)) return 1;
  if (WEXITSTATUS(wst) != 0) return WEXITSTATUS(wst);

  mp_opts o = {.name = cs, .nranks = n, .deadline_ms = 240000, .init = MP_INIT_ID, .victim = -1};
  if (!strcmp(cs, "queued")) return mp_run(&o, body_queued, NULL);
  if (!strcmp(cs, "destroy")) return mp_run(&o, body_destroy, NULL);
  if (!strcmp(cs, "async")) return mp_run(&o, body_async, NULL);
  if (!strcmp(cs, "graph")) return mp_run(&o, body_graph, NULL);
  if (!strcmp(cs, "mps")) return mp_run(&o, body_mps, NULL);
  if (!strcmp(cs, "graphdestroy")) return mp_run(&o, body_graphdestroy, NULL);
  if (!strcmp(cs, "graphother")) return mp_run(&o, body_graphother, NULL);
  if (!strcmp(cs, "limits")) {
    o.init = MP_INIT_NONE;
    return mp_run(&o, body_limits, NULL);
  }
  if (!strcmp(cs, "threads")) {
    o.nranks = 1;
    o.init = MP_INIT_BARE;
    return mp_run(&o, body_threads, &n);
  }
  if (!strcmp(cs, "kill")) {
    o.victim = VICTIM;
    o.victim_signal = SIGKILL;
    o.victim_after = 2;
    o.victim_delay_ms = 3;
    o.deadline_ms = 3 * g_timeout_ms + 60000;
    return mp_run(&o, body_kill, NULL);
  }
  if (!strcmp(cs, "streams")) return mp_run(&o, body_streams, NULL);
  if (!strcmp(cs, "stuck")) return mp_run(&o, body_stuck, NULL);
  if (!strcmp(cs, "stale")) return mp_run(&o, body_stale, NULL);
  if (!strcmp(cs, "emurules")) {
    o.nranks = 1;
    o.init = MP_INIT_BARE;
    return mp_run(&o, body_emurules, NULL);
  }
  if (!strcmp(cs, "mismatch")) return case_mismatch(n);
  if (!strcmp(cs, "shared")) {
    o.nranks = 1;
    o.init = MP_INIT_BARE;
    o.deadline_ms = 3 * g_timeout_ms + 30000;
    return mp_run(&o, body_shared, &n);
  }
  fprintf(stderr, "unknown case %s\n", cs);
  return 2;
}
