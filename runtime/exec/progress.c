/*
 * Progress: collectives run one at a time, in issue order, on the
 * communicator's worker thread or inline on the caller's thread when
 * nothing is queued ahead of them. Each runs through the executor chosen
 * as it was issued (brg__coll.exec, exec.h), whichever it is; a call
 * issued without one (the runtime's own) takes its leaf executor.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "exec.h"
#include "internal.h"
#include "trace.h"

/* The executor of a call's memory: the host ring engine, or for GPU
 * buffers the mode the device ring published (the first call's until
 * then); the composites of coll/ run their parts on it. */
const brg__exec_ops *brg__exec_leaf(const brg_comm *c, const brg__coll *k) {
  if (!k->device) return &brg__exec_host;
  if (k->staged) return &brg__exec_staged;
  if (c->nranks == 1) return &brg__exec_single;
  const brg__exec_ops *x = __atomic_load_n(&c->dev_exec, __ATOMIC_ACQUIRE);
  return x ? x : &brg__exec_device;
}

/* A composite executor's hooks (exec.h's BRG__EXEC_COMPOSITE): its
 * leaf's, looked up at each (the leaf of GPU
 * buffers becomes step or kernel mode once the device ring is made; their
 * hooks are the same). */

int brg__exec_leaf_detached(brg_comm *c, const brg__coll *k) {
  const brg__exec_ops *x = brg__exec_leaf(c, k);
  return x->detached && x->detached(c, k);
}

brg_status brg__exec_leaf_enter(brg_comm *c, const brg__coll *k, int *saved) {
  const brg__exec_ops *x = brg__exec_leaf(c, k);
  return x->enter ? x->enter(c, k, saved) : BRG_SUCCESS;
}

void brg__exec_leaf_leave(brg_comm *c, const brg__coll *k, int saved) {
  const brg__exec_ops *x = brg__exec_leaf(c, k);
  if (x->leave) x->leave(c, k, saved);
}

brg_status brg__exec_leaf_begin(brg_comm *c, brg__coll *k) {
  const brg__exec_ops *x = brg__exec_leaf(c, k);
  return x->begin ? x->begin(c, k) : BRG_SUCCESS;
}

brg_status brg__exec_leaf_setup(brg_comm *c, brg__coll *k, brg__exec_frame *f) {
  const brg__exec_ops *x = brg__exec_leaf(c, k);
  if (x->setup) return x->setup(c, k, f);
  f->entered = 1;
  return BRG_SUCCESS;
}

void brg__exec_leaf_end(brg_comm *c, brg__coll *k, brg_status s, brg__exec_frame *f) {
  const brg__exec_ops *x = brg__exec_leaf(c, k);
  if (x->end) x->end(c, k, s, f);
}

static brg_status run_one(brg_comm *c, brg__coll *k) {
  const brg__exec_ops *x = k->exec;
  brg__exec_frame f = {.entered = !x->setup, .saved = -1};
  brg_status s = BRG_SUCCESS;
  int ran = 0;
  if (__atomic_load_n(&c->aborted, __ATOMIC_ACQUIRE)) {
    s = brg__comm_aborted(c, NULL);
  } else if (__atomic_load_n(&c->broken, __ATOMIC_ACQUIRE) != BRG_SUCCESS) {
    s = __atomic_load_n(&c->broken, __ATOMIC_ACQUIRE); /* last_error holds the first failure */
  } else {
    if (x->setup) s = x->setup(c, k, &f);
    ran = f.entered; /* a setup that could not enter leaves the communicator whole */
    if (s == BRG_SUCCESS && !k->setup_only) s = x->run(c, k);
  }
  if (x->end) x->end(c, k, s, &f);
  if (ran && s != BRG_SUCCESS) {
    __atomic_store_n(&c->broken, s, __ATOMIC_RELEASE); /* check_call reads it unlocked */
    if (s != BRG_ERR_ABORTED) brg__comm_tell(c, s, c->last_error);
    brg__trace_flush(c); /* what led here, even if the process dies next */
  }
  return s;
}

/* A call that will not run (the communicator stops): its executor ends it
 * (a caller's stream must not wait for it). */
static void abandon(brg_comm *c, brg__coll *k) {
  brg__exec_frame f = {.entered = 0, .saved = -1};
  if (k->exec->end) k->exec->end(c, k, BRG_ERR_ABORTED, &f);
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

/* Starts c's worker where it has none yet (qlock held). A communicator's
 * starts with it; a piece's (comm.c's brg__comm_piece_make) at its first
 * queued call, since a piece whose calls all run inline on the caller's
 * thread (the hierarchy's cross and fold, mostly) never needs one. */
static brg_status worker_need(brg_comm *c) {
  if (c->worker_started) return BRG_SUCCESS;
  if (c->stop) return brg__comm_error(c, BRG_ERR_ABORTED, "a call queued while it was destroyed");
  if (pthread_create(&c->worker, NULL, worker_main, c) != 0)
    return brg__comm_error(c, BRG_ERR_SYSTEM, "pthread_create for the progress thread failed");
  c->worker_started = 1;
  return BRG_SUCCESS;
}

/* Queues r; the caller holds qlock and made sure of the worker. */
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

/* The most detached calls queued at once. */
#define ASYNC_DEPTH 64

/* A detached call (a device collective in the device ring's asynchronous
 * mode): queued for the worker, its executor's begin ordering the caller's
 * stream around it; the call returns. */
static brg_status run_detached(brg_comm *c, brg__coll *k) {
  const brg__exec_ops *x = k->exec;
  if (__atomic_load_n(&c->aborted, __ATOMIC_ACQUIRE)) return brg__comm_aborted(c, NULL);
  brg_status s = __atomic_load_n(&c->broken, __ATOMIC_ACQUIRE);
  if (s != BRG_SUCCESS) return s;
  brg__req *r = calloc(1, sizeof *r);
  if (!r) return brg__comm_error(c, BRG_ERR_NO_MEMORY, "out of memory queuing a collective");
  r->coll = *k;
  r->detached = 1;
  int saved = -1;
  if (x->enter && (s = x->enter(c, k, &saved)) != BRG_SUCCESS) {
    free(r);
    return s;
  }
  pthread_mutex_lock(&c->qlock);
  /* A caller that issues faster than the ring runs waits here, as a CUDA
   * launch waits when a stream's queue is full. */
  while (c->ndetached >= ASYNC_DEPTH && !__atomic_load_n(&c->aborted, __ATOMIC_ACQUIRE))
    pthread_cond_wait(&c->donecond, &c->qlock);
  s = worker_need(c);
  if (s == BRG_SUCCESS && x->begin) s = x->begin(c, &r->coll);
  if (s == BRG_SUCCESS) {
    enqueue(c, r);
    c->ndetached++;
  }
  pthread_mutex_unlock(&c->qlock);
  if (x->enter && x->leave) x->leave(c, k, saved);
  if (s != BRG_SUCCESS) {
    free(r);
    /* The other ranks run this collective: they must hear that this one
     * will not. */
    __atomic_store_n(&c->broken, s, __ATOMIC_RELEASE);
    brg__comm_tell(c, s, c->last_error);
  }
  return s;
}

/* A blocking call runs on the caller's thread when nothing is queued ahead
 * of it (no hand-off latency), otherwise it queues behind and waits. */
brg_status brg__progress_run(brg_comm *c, brg__coll *k) {
  if (!k->exec) k->exec = brg__exec_leaf(c, k);
  if (k->exec->detached && k->exec->detached(c, k)) return run_detached(c, k);
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
  brg_status w = worker_need(c);
  if (w != BRG_SUCCESS) {
    pthread_mutex_unlock(&c->qlock);
    return w;
  }
  brg__req r;
  memset(&r, 0, sizeof r);
  r.coll = *k;
  enqueue(c, &r);
  pthread_mutex_unlock(&c->qlock);
  return brg__progress_wait(&r);
}

brg_status brg__progress_enqueue(brg_comm *c, brg__req *r) {
  if (!r->coll.exec) r->coll.exec = brg__exec_leaf(c, &r->coll);
  pthread_mutex_lock(&c->qlock);
  brg_status s = worker_need(c);
  if (s == BRG_SUCCESS) {
    enqueue(c, r);
  } else { /* finished at once, with why: its waiter does not wait */
    r->comm = c;
    r->magic = BRG__REQ_MAGIC;
    r->status = s;
    __atomic_store_n(&r->done, 1, __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&c->qlock);
  return s;
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
  pthread_mutex_lock(&c->qlock);
  brg_status s = worker_need(c);
  pthread_mutex_unlock(&c->qlock);
  if (s != BRG_SUCCESS) return brg__error_quiet(err, s, "%s", c->last_error);
  return BRG_SUCCESS;
}

void brg__progress_stop(brg_comm *c) {
  pthread_mutex_lock(&c->qlock);
  int started = c->worker_started;
  c->stop = 1; /* no worker starts from now on (worker_need) */
  pthread_cond_broadcast(&c->qcond);
  pthread_mutex_unlock(&c->qlock);
  if (!started) return;
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
