/*
 * The device executors (exec.h): collectives on GPU buffers, as progress.c
 * and the composites see them. Every one shares the same hooks around its
 * run (the GPU of the buffers made current, the device ring made at the
 * first call, the asynchronous mode's queue and stream order); they differ
 * in their run: step mode's ring engine, kernel mode's launch, a one-rank
 * copy, or gather, scatter and the tree and rhd allreduces staged through
 * host memory (which makes no device ring: only the GPU current; in the
 * asynchronous mode those allreduces take the device ring's hooks and
 * stream, brg__exec_staged_async). The
 * communicator's device state at destroy is reached from here too, so that
 * nothing else of the runtime asks which mode a device ring runs.
 */
#include <stdlib.h>

#include "device.h"
#include "device_ring_int.h"
#include "exec.h"
#include "ring_link.h"
#include "trace.h"

/* Once c's device ring is made: the executor of its mode, for the
 * policy to pick at issue. */
static void publish(brg_comm *c) {
  const struct brg__dev_ring *d = __atomic_load_n(&c->dev, __ATOMIC_ACQUIRE);
  if (d && !__atomic_load_n(&c->dev_exec, __ATOMIC_ACQUIRE))
    __atomic_store_n(&c->dev_exec, brg__device_kernel_mode(d) ? &brg__exec_kernel : &brg__exec_step,
                     __ATOMIC_RELEASE);
}

/* ---- the hooks every device executor shares ---- */

static int dev_detached(brg_comm *c, const brg__coll *k) {
  return c->nranks > 1 && !k->setup_only &&
         brg__device_ring_async(__atomic_load_n(&c->dev, __ATOMIC_ACQUIRE));
}

/* Whichever thread runs a device collective (the caller's, or the worker
 * when it was queued behind others) works on the GPU of its buffers. */
static brg_status dev_enter(brg_comm *c, const brg__coll *k, int *saved) {
  return brg__device_enter(c, k->gpu, saved);
}

static void dev_leave(brg_comm *c, const brg__coll *k, int saved) {
  (void)c, (void)k;
  brg__device_leave(saved);
}

/* The GPU of the buffers made current first, as the call runs on it. */
static brg_status dev_setup(brg_comm *c, brg__coll *k, brg__exec_frame *f) {
  brg_status s = brg__device_enter(c, k->gpu, &f->saved);
  if (s != BRG_SUCCESS) return s;
  f->entered = 1;
  if (c->nranks > 1 && !c->dev) s = brg__device_ring_setup(c);
  if (s == BRG_SUCCESS) publish(c);
  /* The rings' device rings with this one's, so that a call captured in a
   * CUDA graph later finds them all made (their parts' threads are idle:
   * only this communicator's calls give them work, and it waits for
   * them). */
  for (int r = 1; r < c->nrings && s == BRG_SUCCESS; r++) {
    if (!__atomic_load_n(&c->rings[r]->dev, __ATOMIC_ACQUIRE))
      s = brg__device_ring_setup(c->rings[r]);
    if (s == BRG_SUCCESS) publish(c->rings[r]);
  }
  if (s == BRG_SUCCESS && k->async) s = brg__device_async_start(c, k);
  return s;
}

/* The asynchronous mode's caller's stream is released whatever happened
 * (on the GPU of the buffers, made current here where setup did not). */
static void dev_end(brg_comm *c, brg__coll *k, brg_status s, brg__exec_frame *f) {
  if (k->async && !f->entered && brg__device_enter(c, k->gpu, &f->saved) == BRG_SUCCESS)
    f->entered = 1;
  if (k->async) brg__device_async_end(c, k, s);
  if (f->entered) brg__device_leave(f->saved);
}

/* Several rings: at most BRG__DEVICE_MAX_RINGS, and in a CUDA graph only
 * where every ring runs kernel mode (the forks and joins of the rings'
 * streams are captured with the parts; ring 0's own kernel mode the
 * capture check required). */
static int dev_parts_ok(const brg_comm *c, const brg__coll *k, int parts) {
  int ok = parts <= BRG__DEVICE_MAX_RINGS;
  for (int r = 1; k->captured && ok && r < c->nrings; r++)
    ok = brg__device_kernel_mode(__atomic_load_n(&c->rings[r]->dev, __ATOMIC_ACQUIRE));
  return ok;
}

static brg_status dev_fork(brg_comm *c, const brg__coll *k, int parts, void **streams) {
  return brg__device_fork(c, k->stream, parts, streams);
}

static brg_status dev_join(brg_comm *c, const brg__coll *k, int parts) {
  return brg__device_join(c, k->stream, parts);
}

static brg_status dev_divide(brg_comm *c, const brg__coll *k, void *buf, size_t count,
                             int divisor) {
  return brg__device_divide(c, buf, count, k->dtype, divisor, k->stream);
}

#define DEVICE_EXEC(NAME, RUN)                                                                     \
  {                                                                                                \
    .name = (NAME), .detached = dev_detached, .enter = dev_enter, .leave = dev_leave,              \
    .begin = brg__device_async_begin, .setup = dev_setup, .run = (RUN), .end = dev_end,            \
    .parts_ok = dev_parts_ok, .fork = dev_fork, .join = dev_join, .divide = dev_divide             \
  }

/* ---- the runs ---- */

static brg_status step_body(brg_comm *c, brg__coll *k) {
  return brg__ring_engine(c, &c->ring, k, &brg__mem_device, c->dev);
}

static brg_status step_run(brg_comm *c, brg__coll *k) {
  return brg__trace_run(c, k, step_body);
}

static brg_status kernel_body(brg_comm *c, brg__coll *k) {
  k->seq = ++c->seq;
  return brg__device_kernel_run(c, k);
}

static brg_status kernel_run(brg_comm *c, brg__coll *k) {
  return brg__trace_run(c, k, kernel_body);
}

static brg_status single_body(brg_comm *c, brg__coll *k) {
  k->seq = ++c->seq;
  return brg__device_single(c, k);
}

static brg_status single_run(brg_comm *c, brg__coll *k) {
  return brg__trace_run(c, k, single_body);
}

/* The first call on GPU buffers: its setup made the device ring, whose
 * mode now runs it. */
static brg_status first_run(brg_comm *c, brg__coll *k) {
  const brg__exec_ops *x = __atomic_load_n(&c->dev_exec, __ATOMIC_ACQUIRE);
  if (!x)
    return brg__comm_error(c, BRG_ERR_INTERNAL, "%s: the device ring was not made",
                           brg__coll_name(k->kind));
  return x->run(c, k);
}

const brg__exec_ops brg__exec_step = DEVICE_EXEC("step", step_run);
const brg__exec_ops brg__exec_kernel = DEVICE_EXEC("kernel", kernel_run);
const brg__exec_ops brg__exec_single = DEVICE_EXEC("single", single_run);
/* The first call's: its setup makes the device ring (after coll/policy.c
 * made kernel mode's links between hosts) and publishes the mode. */
const brg__exec_ops brg__exec_device = {.name = "device",
                                        .detached = dev_detached,
                                        .enter = dev_enter,
                                        .leave = dev_leave,
                                        .begin = brg__device_async_begin,
                                        .setup = dev_setup,
                                        .run = first_run,
                                        .end = dev_end,
                                        .parts_ok = dev_parts_ok,
                                        .fork = dev_fork,
                                        .join = dev_join,
                                        .divide = dev_divide};

/* ---- staged through host memory ---- */

/* Gather and scatter, and the tree and rhd allreduces the policy staged
 * (k->lat, coll/policy.c): the host collective (the host executor's, or
 * lat.c's) runs between host copies of the GPU buffers. The caller's
 * stream is waited for first (its work may still write the send buffer
 * or read the receive buffer), and the module's copies are synchronous,
 * so the receive buffer holds the result when the call returns and any
 * later work on any stream sees it. Only the buffers a rank passes are
 * copied: the root's N blocks, the other ranks' one; an allreduce in
 * place has one host copy, copied in and back. */
/* The call k as a host collective run by x: no GPU, no stream, neither
 * staged nor asynchronous (its buffers the caller's to set). */
static brg__coll host_call(const brg__coll *k, const brg__exec_ops *x) {
  brg__coll h = *k;
  h.device = 0;
  h.staged = 0;
  h.async = 0;
  h.start_ev = NULL;
  h.stream = NULL;
  h.exec = x;
  return h;
}

static brg_status staged_run(brg_comm *c, brg__coll *k) {
  const brg__cuda_api *api = brg__device_api(NULL);
  int gather = k->kind == BRG__COLL_GATHER, scatter = k->kind == BRG__COLL_SCATTER;
  const char *fn = gather ? "brg_gather" : scatter ? "brg_scatter" : "brg_allreduce";
  size_t bytes = k->count * brg_dtype_size(k->dtype), n = (size_t)c->nranks;
  size_t sbytes = !k->sendbuf ? 0 : scatter ? bytes * n : bytes;
  size_t rbytes = !k->recvbuf ? 0 : gather ? bytes * n : bytes;
  int one = k->kind == BRG__COLL_ALLREDUCE && k->sendbuf == k->recvbuf;
  brg_status s;
  brg__coll h = host_call(k, k->lat ? &brg__exec_lat : &brg__exec_host);
  h.sendbuf = k->sendbuf ? malloc(sbytes ? sbytes : 1) : NULL;
  h.recvbuf = one ? (void *)h.sendbuf : k->recvbuf ? malloc(rbytes ? rbytes : 1) : NULL;
  if ((k->sendbuf && !h.sendbuf) || (k->recvbuf && !h.recvbuf)) {
    s = brg__comm_error(c, BRG_ERR_NO_MEMORY, "%s: out of memory for %zu bytes of host staging", fn,
                        sbytes + (one ? 0 : rbytes));
    goto out;
  }
  const char *what = "waiting for the stream";
  int e = api->drv.stream_sync(k->stream);
  if (!e && sbytes) {
    what = "copying the GPU send buffer to host memory";
    e = api->drv.mem_copy((void *)h.sendbuf, k->sendbuf, sbytes);
  }
  if (e) {
    s = brg__comm_error(c, BRG_ERR_SYSTEM, "%s: %s (stream %p) failed: %s", fn, what, k->stream,
                        api->drv.error_string(e));
    goto out;
  }
  s = h.exec->run(c, &h);
  k->seq = h.seq;
  if (s == BRG_SUCCESS && rbytes && (e = api->drv.mem_copy(k->recvbuf, h.recvbuf, rbytes)) != 0)
    s = brg__comm_error(c, BRG_ERR_SYSTEM,
                        "%s: copying the result from host memory to the GPU receive buffer "
                        "failed: %s",
                        fn, api->drv.error_string(e));
out:
  free((void *)h.sendbuf);
  if (!one) free(h.recvbuf);
  return s;
}

/* Only the GPU made current: the collective itself is a host one. */
static brg_status staged_setup(brg_comm *c, brg__coll *k, brg__exec_frame *f) {
  brg_status s = brg__device_enter(c, k->gpu, &f->saved);
  f->entered = s == BRG_SUCCESS;
  return s;
}

static void staged_end(brg_comm *c, brg__coll *k, brg_status s, brg__exec_frame *f) {
  (void)c, (void)k, (void)s;
  if (f->entered) brg__device_leave(f->saved);
}

const brg__exec_ops brg__exec_staged = {
    .name = "staged", .setup = staged_setup, .run = staged_run, .end = staged_end};

/* ---- staged in the asynchronous mode ---- */

/* Until the work on `stream` so far has run, waited for as step mode
 * waits for its slots (brg__dev_event_wait: a neighbour gone or the
 * communicator aborted ends the wait with its error). */
static brg_status stage_wait(brg_comm *c, struct brg__dev_ring *d, void *stream, const char *what) {
  const brg__cuda_api *api = d->api;
  int e = d->stage_ev ? 0 : api->drv.event_create(&d->stage_ev);
  if (!e) e = api->drv.event_record(d->stage_ev, stream);
  if (e) return brg__dev_cuda_fail(c, api, e, what);
  return brg__dev_event_wait(c, d, d->stage_ev, what);
}

/* The ring's staging memory, at least `bytes`: grown to twice the old size
 * at least, in whole pages, the old memory kept until the ring is freed
 * (the copy back of an earlier call may still read it). */
static brg_status stage_room(brg_comm *c, struct brg__dev_ring *d, size_t bytes) {
  if (bytes <= d->stage_bytes) return BRG_SUCCESS;
  const brg__cuda_api *api = d->api;
  int n = (int)(sizeof d->stage_old / sizeof d->stage_old[0]);
  size_t want = bytes < 2 * d->stage_bytes ? 2 * d->stage_bytes : bytes;
  want = (want + 4095) & ~(size_t)4095;
  char *host = NULL, *dev = NULL;
  int e = want < bytes || (d->stage_host && d->nstage_old == n)
              ? -1
              : brg__dev_pinned_alloc(api, want, &host, &dev);
  if (e == -1)
    return brg__comm_error(c, BRG_ERR_NO_MEMORY,
                           "brg_allreduce: out of memory for %zu bytes of host staging", bytes);
  if (e) return brg__dev_cuda_fail(c, api, e, "cudaHostRegister (host staging of the allreduce)");
  if (d->stage_host) {
    d->stage_old[d->nstage_old].host = d->stage_host;
    d->stage_old[d->nstage_old].bytes = d->stage_bytes;
    d->nstage_old++;
  }
  d->stage_host = host;
  d->stage_dev = dev;
  d->stage_bytes = want;
  return BRG_SUCCESS;
}

/* The tree and rhd allreduces the policy staged where the device calls run
 * asynchronously (coll/policy.c): the call returned at once, and this runs
 * on the communicator's thread with k->stream the ring's own, which waited
 * for the caller's stream to reach the call (dev_setup). A kernel copies
 * the send buffer into the ring's pinned staging, the thread waits for it,
 * runs lat.c's algorithm there and launches the copy of the result to the
 * receive buffer; dev_end then has the ring's stream raise the flag the
 * caller's stream waits on. The call that makes the device ring runs on
 * the calling thread on its stream (not yet asynchronous), and waits for
 * the copy back before it returns, as the staged executor does. The
 * staging is reused by the next call, whose copy in follows this one's
 * copy back on the same stream (the host writes it only after that copy
 * in has run). */
static brg_status staged_async_run(brg_comm *c, brg__coll *k) {
  struct brg__dev_ring *d = c->dev;
  const brg__cuda_api *api = d->api;
  size_t bytes = k->count * brg_dtype_size(k->dtype);
  size_t room = (bytes + 255) & ~(size_t)255;
  if (room == 0) room = 256; /* a count of 0 still has buffers to name */
  int one = k->sendbuf == k->recvbuf;
  d->last_stream = k->stream;
  brg_status s = stage_room(c, d, one ? room : 2 * room);
  if (s != BRG_SUCCESS) return s;
  size_t at = one ? 0 : room; /* the result's place in the staging */
  brg__coll h = host_call(k, &brg__exec_lat);
  h.sendbuf = d->stage_host;
  h.recvbuf = d->stage_host + at;
  int e = bytes ? api->kern.copy(d->stage_dev, NULL, k->sendbuf, bytes, k->stream) : 0;
  if (e) return brg__dev_cuda_fail(c, api, e, "copy kernel of the send buffer to host staging");
  s = stage_wait(c, d, k->stream, "cudaEventQuery (the send buffer's copy to host staging)");
  if (s != BRG_SUCCESS) return s;
  s = h.exec->run(c, &h);
  k->seq = h.seq;
  if (s != BRG_SUCCESS) return s;
  e = bytes ? api->kern.copy(k->recvbuf, NULL, d->stage_dev + at, bytes, k->stream) : 0;
  if (e) return brg__dev_cuda_fail(c, api, e, "copy kernel of the result from host staging");
  if (!k->async)
    s = stage_wait(c, d, k->stream, "cudaEventQuery (the result's copy from host staging)");
  return s;
}

/* The device ring's hooks: its setup makes the ring at the first call,
 * whose asynchronous mode then queues the calls and orders the caller's
 * stream around them. */
const brg__exec_ops brg__exec_staged_async = DEVICE_EXEC("staged-async", staged_async_run);

/* ---- the communicator's device state ---- */

int brg__exec_outlives(const brg_comm *c) {
  return __atomic_load_n(&c->dev, __ATOMIC_ACQUIRE) != NULL;
}

void brg__exec_abort(brg_comm *c) {
  brg__device_abort(c);
}

brg_status brg__exec_drain(brg_comm *c) {
  return brg__device_ring_drain(c);
}

uint64_t brg__exec_bye_word(const brg_comm *c) {
  return brg__device_bye_word(c);
}

brg_status brg__exec_settle(brg_comm *c, uint64_t theirs) {
  return brg__device_ring_settle(c, theirs);
}

void brg__exec_stop(brg_comm *c) {
  brg__device_proxy_stop(c);
}

void brg__exec_free(brg_comm *c) {
  __atomic_store_n(&c->dev_exec, NULL, __ATOMIC_RELEASE);
  brg__device_ring_free(c);
}

brg_status brg__exec_async_error(brg_comm *c) {
  return brg__device_async_error(c);
}

/* ---- at issue ---- */

/* Where a call's buffers are; on a capturing stream, whether the graph
 * may hold the call (kernel mode's rules, device_kernel.c). */
brg_status brg__device_check_call(brg_comm *c, const char *fn, const void *sendbuf,
                                  const void *recvbuf, brg_stream stream, brg__coll *k) {
  brg_status s = brg__device_classify(c, fn, sendbuf, recvbuf, stream, &k->device, &k->gpu);
  if (s != BRG_SUCCESS || !k->device) return s;
  const brg__cuda_api *api = brg__device_api(NULL);
  int capturing = 0;
  if (api->drv.stream_capturing(stream, &capturing) != 0 || !capturing) {
    api->drv.last_error(); /* a query that failed leaves no error behind */
    return BRG_SUCCESS;
  }
  if (!k->staged) return brg__device_capture_check(c, fn, k); /* kernel mode's rules */
  /* Staged through host memory by the calling thread, which waits for
   * the stream: nothing a CUDA graph can hold. */
  api->drv.last_error();
  return brg__comm_error(c, BRG_ERR_INVALID_USAGE,
                         "%s: stream %p is capturing a CUDA graph, but %s on GPU buffers is "
                         "staged through host memory by the calling thread, which a graph "
                         "cannot hold: call it outside the capture",
                         fn, stream, brg__coll_name(k->kind));
}
