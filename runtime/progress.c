/*
 * Progress: collectives run one at a time, in issue order, on the
 * communicator's worker thread or inline on the caller's thread when
 * nothing is queued ahead of them.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "device.h"
#include "internal.h"
#include "kernels.h"
#include "schedule.h"
#include "trace.h"

/* The first device collective builds the device ring on every rank, over
 * the host ring: each rank says which GPU it has, then sets up its own half
 * and describes it, and each rank connects to its neighbours'. Every rank
 * takes part in both all-gathers even when its own half failed, so that
 * all of them learn which rank could not and why, instead of timing out. */
static brg_status device_setup(brg_comm *c) {
  brg__dev_setup st;
  brg_status s = brg__device_ring_prepare(c, &st);
  if (s != BRG_SUCCESS) return s;
  brg__coll g = {.kind = BRG__COLL_ALL_GATHER,
                 .dtype = BRG_UINT8,
                 .op = BRG_SUM,
                 .root = -1,
                 .sendbuf = st.mine,
                 .recvbuf = st.all,
                 .count = st.blob_bytes};
  s = brg__coll_execute(c, &g);
  s = brg__device_ring_local(c, &st, s);
  if (s == BRG_SUCCESS) {
    brg__coll g2 = g;
    s = brg__coll_execute(c, &g2);
  }
  return brg__device_ring_finish(c, &st, s);
}

/* Hierarchical allreduce (hier.c chose it and made its communicators):
 * runs one phase on a communicator of the hierarchy; a failure aborts both,
 * so that the ranks waiting on this one in the other phase hear of it, and
 * of why (a rank of another host gone silent, say, which a rank waiting
 * within its host cannot see for itself). */
static brg_status phase(brg_comm *c, brg_comm *sub, brg__coll *p, const brg__coll *k,
                        const char *what) {
  brg_status s = brg__progress_run(sub, p);
  if (s == BRG_SUCCESS) return s;
  char why[BRG__ERRLEN];
  snprintf(why, sizeof why, "%s", sub->last_error);
  brg__comm_stop_why(c->local, why);
  brg__comm_stop_why(c->cross, why);
  char desc[160];
  brg__coll_describe(desc, sizeof desc, k->kind, k->seq, k->count, k->dtype, k->op, k->root, 0);
  return brg__comm_error(c, s, "%s (hier): %s failed: %s", desc, what, why);
}

static brg_status hier_body(brg_comm *c, brg__coll *k) {
  brg_comm *local = c->local, *cross = c->cross;
  size_t esize = brg_dtype_size(k->dtype);
  uint64_t sent0 = __atomic_load_n(&local->bytes_sent, __ATOMIC_RELAXED) +
                   __atomic_load_n(&cross->bytes_sent, __ATOMIC_RELAXED);
  brg_op sum = k->op == BRG_AVG ? BRG_SUM : k->op;
  /* GPU buffers: every phase a device collective on the caller's stream. */
  brg__coll dev = {
      .device = k->device, .gpu = k->gpu, .stream = k->stream, .captured = k->captured};
  brg__coll rs = dev;
  rs.kind = BRG__COLL_REDUCE_SCATTER;
  rs.dtype = k->dtype;
  rs.op = sum;
  rs.root = -1;
  rs.sendbuf = k->sendbuf;
  rs.recvbuf = k->recvbuf;
  rs.count = k->count;
  rs.whole = 1;
  brg_status s = phase(c, local, &rs, k, "the reduce-scatter within the host");
  if (s != BRG_SUCCESS) return s;
  /* This rank's chunk, as the reduce-scatter cut it. */
  size_t off = brg__part_offset(k->count, local->nranks, local->rank);
  size_t cnt = brg__part_count(k->count, local->nranks, local->rank);
  char *shard = (char *)k->recvbuf + off * esize;
  if (cnt > 0) { /* the same on every rank of cross: all of them skip it */
    brg__coll ar = rs;
    ar.kind = BRG__COLL_ALLREDUCE;
    ar.sendbuf = shard;
    ar.recvbuf = shard;
    ar.count = cnt;
    ar.whole = 0;
    if ((s = phase(c, cross, &ar, k, "the allreduce across hosts")) != BRG_SUCCESS) return s;
    if (k->op == BRG_AVG && k->device)
      s = brg__device_divide(c, shard, cnt, k->dtype, c->nranks, k->stream);
    else if (k->op == BRG_AVG)
      brg__divide(shard, shard, cnt, k->dtype, c->nranks);
    if (s != BRG_SUCCESS) return s;
  }
  brg__coll ag = rs;
  ag.kind = BRG__COLL_ALL_GATHER;
  ag.op = BRG_SUM;
  ag.sendbuf = k->recvbuf;
  if ((s = phase(c, local, &ag, k, "the all-gather within the host")) != BRG_SUCCESS) return s;
  uint64_t sent1 = __atomic_load_n(&local->bytes_sent, __ATOMIC_RELAXED) +
                   __atomic_load_n(&cross->bytes_sent, __ATOMIC_RELAXED);
  __atomic_fetch_add(&c->bytes_sent, sent1 - sent0, __ATOMIC_RELAXED);
  return BRG_SUCCESS;
}

static brg_status hier_run(brg_comm *c, brg__coll *k) {
  k->seq = ++c->seq;
  return brg__trace_run(c, k, hier_body);
}

/* Whether k is cut over the communicator's rings: a host allreduce,
 * reduce-scatter, all-gather, broadcast or reduce that gives every ring at
 * least a slice (of each rank's block, for reduce-scatter and all-gather).
 * The count is the same on every rank, so every rank decides alike. */
static int on_rings(const brg_comm *c, const brg__coll *k) {
  int cut = k->kind == BRG__COLL_ALLREDUCE || k->kind == BRG__COLL_REDUCE_SCATTER ||
            k->kind == BRG__COLL_ALL_GATHER || k->kind == BRG__COLL_BROADCAST ||
            k->kind == BRG__COLL_REDUCE;
  /* GPU buffers too, also captured in a CUDA graph when every ring runs
   * kernel mode (the forks and joins of the rings' streams are captured
   * with the parts; ring 0's own kernel mode the capture check required). */
  int dev_ok = !k->device || c->nrings <= BRG__DEVICE_MAX_RINGS;
  for (int r = 1; k->device && k->captured && dev_ok && r < c->nrings; r++)
    dev_ok = brg__device_kernel_mode(__atomic_load_n(&c->rings[r]->dev, __ATOMIC_ACQUIRE));
  return c->nrings > 1 && dev_ok && cut && !k->whole &&
         k->count * brg_dtype_size(k->dtype) >= (size_t)c->nrings * c->slice_bytes;
}

/* Part r of k's elements on ring r of `rings`: the same share of every
 * rank's block for reduce-scatter and all-gather, whose blocks stay where
 * they are in the full-size buffer (the part's stride is the call's
 * count); a contiguous share of the buffers otherwise. */
static brg__coll ring_part(const brg__coll *k, int rings, int r) {
  size_t esize = brg_dtype_size(k->dtype);
  size_t off = brg__part_offset(k->count, rings, r) * esize;
  brg__coll p = *k;
  p.count = brg__part_count(k->count, rings, r);
  if (k->kind == BRG__COLL_REDUCE_SCATTER || k->kind == BRG__COLL_ALL_GATHER)
    p.stride = k->stride ? k->stride : k->count;
  /* a buffer a rank does not have (broadcast, reduce) stays NULL */
  p.sendbuf = k->sendbuf ? (const char *)k->sendbuf + off : NULL;
  p.recvbuf = k->recvbuf ? (char *)k->recvbuf + off : NULL;
  return p;
}

/* The collective k cut into one part per ring: parts 1..R-1 queued on the
 * rings' own communicators, whose threads run them, part 0 here on this
 * one's ring. A part that fails stops the others (their peers hear it on
 * each ring), and the first failure is the call's. */
static brg_status run_rings(brg_comm *c, brg__coll *k) {
  int rings = c->nrings;
  brg__req *parts = calloc((size_t)rings, sizeof *parts);
  if (!parts) return brg__comm_error(c, BRG_ERR_NO_MEMORY, "out of memory for %d rings", rings);
  /* GPU buffers: each ring's part on a stream of its own, forked from the
   * caller's stream and joined back into it, so the rings run at once. */
  void *streams[BRG__DEVICE_MAX_RINGS] = {0};
  brg_status s = k->device ? brg__device_fork(c, k->stream, rings, streams) : BRG_SUCCESS;
  if (s != BRG_SUCCESS) {
    free(parts);
    return s;
  }
  for (int r = 1; r < rings; r++) {
    parts[r].coll = ring_part(k, rings, r);
    if (k->device) parts[r].coll.stream = streams[r];
    brg__progress_enqueue(c->rings[r], &parts[r]);
  }
  brg__coll k0 = ring_part(k, rings, 0);
  s = brg__coll_execute(c, &k0);
  k->seq = k0.seq;
  /* The others' peers hear why (the first failure names the rank that
   * caused it), not just that this rank stopped. */
  if (s != BRG_SUCCESS)
    for (int r = 1; r < rings; r++) brg__comm_stop_why(c->rings[r], brg_comm_last_error(c));
  for (int r = 1; r < rings; r++) {
    brg_status p = brg__progress_wait(&parts[r]);
    if (p == BRG_SUCCESS || s != BRG_SUCCESS) continue;
    s = brg__comm_error(c, p, "%s (ring %d of %d)", brg_comm_last_error(c->rings[r]), r, rings);
    for (int q = 1; q < rings; q++) brg__comm_stop_why(c->rings[q], brg_comm_last_error(c));
  }
  free(parts);
  if (k->device) {
    brg_status j = brg__device_join(c, k->stream, rings);
    if (s == BRG_SUCCESS) s = j;
  }
  return s;
}

static brg_status run_one(brg_comm *c, brg__coll *k) {
  /* Whichever thread runs a device collective (the caller's, or the worker
   * when it was queued behind others) works on the GPU of its buffers. */
  int prev_gpu = -1, ran = 0;
  brg_status s = k->device ? brg__device_enter(c, k->gpu, &prev_gpu) : BRG_SUCCESS;
  int entered = k->device && s == BRG_SUCCESS;
  if (s != BRG_SUCCESS) {
  } else if (__atomic_load_n(&c->aborted, __ATOMIC_ACQUIRE)) {
    s = brg__comm_error(c, BRG_ERR_ABORTED, "communicator was aborted");
  } else if (__atomic_load_n(&c->broken, __ATOMIC_ACQUIRE) != BRG_SUCCESS) {
    s = __atomic_load_n(&c->broken, __ATOMIC_ACQUIRE); /* last_error holds the first failure */
  } else {
    ran = 1;
    if (k->device && c->nranks > 1 && !c->dev) s = device_setup(c);
    /* The rings' device rings with this one's, so that a call captured in a
     * CUDA graph later finds them all made (their parts' threads are idle:
     * only this communicator's calls give them work, and it waits for
     * them). */
    for (int r = 1; k->device && r < c->nrings && s == BRG_SUCCESS; r++)
      if (!__atomic_load_n(&c->rings[r]->dev, __ATOMIC_ACQUIRE)) s = device_setup(c->rings[r]);
    if (s == BRG_SUCCESS && k->async) s = brg__device_async_start(c, k);
    if (s == BRG_SUCCESS && !k->setup_only)
      s = k->hier          ? hier_run(c, k)
          : k->lat         ? brg__lat_run(c, k)
          : on_rings(c, k) ? run_rings(c, k)
                           : brg__coll_execute(c, k);
  }
  if (k->async) brg__device_async_end(c, k, s);
  if (entered) brg__device_leave(prev_gpu);
  if (ran && s != BRG_SUCCESS) {
    __atomic_store_n(&c->broken, s, __ATOMIC_RELEASE); /* check_call reads it unlocked */
    if (s != BRG_ERR_ABORTED) brg__comm_notify_abort(c, s, c->last_error);
    brg__trace_flush(c); /* what led here, even if the process dies next */
  }
  return s;
}

/* A device collective that will not run (the communicator stops): its
 * caller's stream must not wait for it. */
static void abandon(brg_comm *c, brg__coll *k) {
  int prev_gpu = -1;
  if (!k->async || brg__device_enter(c, k->gpu, &prev_gpu) != BRG_SUCCESS) return;
  brg__device_async_end(c, k, BRG_ERR_ABORTED);
  brg__device_leave(prev_gpu);
}

static void *worker_main(void *arg) {
  brg_comm *c = arg;
  brg__log_set_thread_rank(c->rank);
  pthread_mutex_lock(&c->qlock);
  for (;;) {
    while (!c->stop && (c->busy || !c->qhead)) pthread_cond_wait(&c->qcond, &c->qlock);
    if (!c->qhead && c->stop) break;
    if (!c->qhead) continue;
    brg__req *r = c->qhead;
    c->qhead = r->next;
    if (!c->qhead) c->qtail = NULL;
    c->busy = 1;
    int stopping = c->stop; /* written under qlock by brg__progress_stop */
    pthread_mutex_unlock(&c->qlock);
    brg_status s = BRG_ERR_ABORTED;
    if (stopping)
      abandon(c, &r->coll);
    else
      s = run_one(c, &r->coll);
    int detached = r->detached;
    if (detached) free(r);
    pthread_mutex_lock(&c->qlock);
    c->busy = 0;
    c->ndetached -= detached;
    if (!detached) {
      r->status = s;
      __atomic_store_n(&r->done, 1, __ATOMIC_RELEASE);
    }
    pthread_cond_broadcast(&c->donecond);
  }
  pthread_mutex_unlock(&c->qlock);
  return NULL;
}

/* Queues r; the caller holds qlock. */
static void enqueue(brg_comm *c, brg__req *r) {
  r->next = NULL;
  r->done = 0;
  r->comm = c;
  r->magic = BRG__REQ_MAGIC;
  if (c->qtail)
    c->qtail->next = r;
  else
    c->qhead = r;
  c->qtail = r;
  pthread_cond_signal(&c->qcond);
}

brg_status brg__progress_wait(brg__req *r) {
  brg_comm *c = r->comm;
  if (__atomic_load_n(&r->done, __ATOMIC_ACQUIRE)) return r->status;
  pthread_mutex_lock(&c->qlock);
  while (!r->done) pthread_cond_wait(&c->donecond, &c->qlock);
  pthread_mutex_unlock(&c->qlock);
  return r->status;
}

/* The most device collectives of the asynchronous mode queued at once. */
#define ASYNC_DEPTH 64

/* A device collective in the device ring's asynchronous mode: queued for
 * the worker, the caller's stream ordered around it; the call returns. */
static brg_status run_async(brg_comm *c, brg__coll *k) {
  if (__atomic_load_n(&c->aborted, __ATOMIC_ACQUIRE))
    return brg__comm_error(c, BRG_ERR_ABORTED, "communicator was aborted");
  brg_status s = __atomic_load_n(&c->broken, __ATOMIC_ACQUIRE);
  if (s != BRG_SUCCESS) return s;
  brg__req *r = calloc(1, sizeof *r);
  if (!r) return brg__comm_error(c, BRG_ERR_NO_MEMORY, "out of memory queuing a collective");
  r->coll = *k;
  r->detached = 1;
  int prev_gpu = -1;
  if ((s = brg__device_enter(c, k->gpu, &prev_gpu)) != BRG_SUCCESS) {
    free(r);
    return s;
  }
  pthread_mutex_lock(&c->qlock);
  /* A caller that issues faster than the ring runs waits here, as a CUDA
   * launch waits when a stream's queue is full. */
  while (c->ndetached >= ASYNC_DEPTH && !__atomic_load_n(&c->aborted, __ATOMIC_ACQUIRE))
    pthread_cond_wait(&c->donecond, &c->qlock);
  s = brg__device_async_begin(c, &r->coll);
  if (s == BRG_SUCCESS) {
    enqueue(c, r);
    c->ndetached++;
  }
  pthread_mutex_unlock(&c->qlock);
  brg__device_leave(prev_gpu);
  if (s != BRG_SUCCESS) {
    free(r);
    /* The other ranks run this collective: they must hear that this one
     * will not. */
    __atomic_store_n(&c->broken, s, __ATOMIC_RELEASE);
    brg__comm_notify_abort(c, s, c->last_error);
  }
  return s;
}

/* A blocking call runs on the caller's thread when nothing is queued ahead
 * of it (no hand-off latency), otherwise it queues behind and waits. */
brg_status brg__progress_run(brg_comm *c, brg__coll *k) {
  if (k->device && c->nranks > 1 && !k->setup_only &&
      brg__device_ring_async(__atomic_load_n(&c->dev, __ATOMIC_ACQUIRE)))
    return run_async(c, k);
  pthread_mutex_lock(&c->qlock);
  if (!c->busy && !c->qhead) {
    c->busy = 1;
    pthread_mutex_unlock(&c->qlock);
    brg_status s = run_one(c, k);
    pthread_mutex_lock(&c->qlock);
    c->busy = 0;
    /* Wake the worker only when work queued up meanwhile: a wake-up per
     * call would cost a context switch on a rank pinned to one core. */
    if (c->qhead) pthread_cond_signal(&c->qcond);
    pthread_mutex_unlock(&c->qlock);
    return s;
  }
  brg__req r;
  memset(&r, 0, sizeof r);
  r.coll = *k;
  enqueue(c, &r);
  pthread_mutex_unlock(&c->qlock);
  return brg__progress_wait(&r);
}

brg_status brg__progress_enqueue(brg_comm *c, brg__req *r) {
  pthread_mutex_lock(&c->qlock);
  enqueue(c, r);
  pthread_mutex_unlock(&c->qlock);
  return BRG_SUCCESS;
}

int brg__progress_settle(brg_comm *c) {
  int64_t deadline = brg__deadline_ms(c->timeout_ms);
  pthread_mutex_lock(&c->qlock);
  for (;;) {
    int others = 0;
    for (brg__req *r = c->qhead; r; r = r->next) others |= !r->detached;
    if (others || (!c->busy && !c->qhead) || brg__deadline_passed(deadline)) break;
    struct timespec ts = brg__realtime_in_ms(10);
    pthread_cond_timedwait(&c->donecond, &c->qlock, &ts);
  }
  int idle = !c->busy && !c->qhead;
  pthread_mutex_unlock(&c->qlock);
  return idle;
}

brg_status brg__progress_start(brg_comm *c, brg__errbuf *err) {
  if (pthread_create(&c->worker, NULL, worker_main, c) != 0)
    return brg__error_quiet(err, BRG_ERR_SYSTEM, "pthread_create for the progress thread failed");
  c->worker_started = 1;
  return BRG_SUCCESS;
}

void brg__progress_stop(brg_comm *c) {
  if (!c->worker_started) return;
  pthread_mutex_lock(&c->qlock);
  c->stop = 1;
  pthread_cond_broadcast(&c->qcond);
  pthread_mutex_unlock(&c->qlock);
  pthread_join(c->worker, NULL);
  c->worker_started = 0;
}

/* An all-gather of `bytes` host bytes per rank over comm, in issue order
 * with its other collectives (what brg_all_gather runs, without the checks
 * of arguments that are right by construction): how a split and the
 * sub-communicators that meet over their parent exchange what they say. */
brg_status brg__split_gather(brg_comm *comm, const void *mine, void *all, size_t bytes) {
  brg__coll k = {.kind = BRG__COLL_ALL_GATHER,
                 .dtype = BRG_UINT8,
                 .op = BRG_SUM,
                 .root = -1,
                 .sendbuf = mine,
                 .recvbuf = all,
                 .count = bytes};
  return brg__progress_run(comm, &k);
}
