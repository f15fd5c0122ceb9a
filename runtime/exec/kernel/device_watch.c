/*
 * Kernel mode's faults and watchdog: what a channel that stopped found,
 * the liveness thread's check on launches in flight, and the drain.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device_ring_int.h"

/* Channel ch's watch record (ring_args.h), in the pinned page. */
static brg__rk_watch *watch_rec(const struct brg__dev_ring *d, int ch) {
  return &d->k.words->watch[ch];
}

/* A call from a watch record, "allreduce #3 (count 7, ...)". */
static void watch_call(char *out, size_t n, const brg__rk_call *src) {
  uint64_t v[3];
  brg__rk_call x;
  for (int i = 0; i < 3; i++) v[i] = __atomic_load_n((const uint64_t *)src + i, __ATOMIC_RELAXED);
  memcpy(&x, v, sizeof x);
  brg__coll_describe(out, n, (brg__coll_kind)x.kind, x.seq, x.count, x.dtype, x.op, x.root, 1);
}

/* What a channel that stopped on a fault found (ring_kernel.cuh's checks),
 * in why; its status, or BRG_SUCCESS when none did. */
static brg_status kernel_fault(const brg_comm *c, const struct brg__dev_ring *d, char *why,
                               size_t n) {
  for (int ch = 0; ch < d->k.channels; ch++) {
    brg__rk_watch *w = watch_rec(d, ch);
    int code = __atomic_load_n(&w->code, __ATOMIC_ACQUIRE);
    if (code == BRG__RK_OK || code == BRG__RK_ABORTED) continue;
    char mine[160], theirs[160];
    int step = __atomic_load_n(&w->step, __ATOMIC_RELAXED);
    /* What the channel compared: a one-shot flag of rank `peer`, or (peer
     * -1) the previous rank's header or slot. The peer stays as the fault
     * left it; the wait does not (a launch that ends says it waits for
     * nothing). */
    int peer = __atomic_load_n(&w->peer, __ATOMIC_RELAXED);
    int oneshot = peer >= 0 && peer < c->nranks;
    int from = oneshot ? peer : c->ring.prev;
    watch_call(mine, sizeof mine, &w->mine);
    if (code == BRG__RK_MISMATCH) {
      watch_call(theirs, sizeof theirs, &w->theirs);
      snprintf(why, n, "collective mismatch: rank %d called %s but rank %d called %s", c->rank,
               mine, from, theirs);
      return BRG_ERR_MISMATCH;
    }
    if (code == BRG__RK_BUSY) {
      snprintf(why, n,
               "rank %d: a kernel-mode launch of %s found another launch of this communicator "
               "running in channel %d (graph launches, or launches on streams, that nothing "
               "orders): it stopped instead of taking the other one's slots",
               c->rank, mine, ch);
      return BRG_ERR_INVALID_USAGE;
    }
    if (oneshot)
      snprintf(why, n,
               "rank %d: kernel-mode %s found a stale one-shot flag of rank %d: call %llu where "
               "call %llu was due (one-shot areas out of step)",
               c->rank, mine, from, (unsigned long long)w->found, (unsigned long long)w->expected);
    else
      snprintf(why, n,
               "rank %d: kernel-mode %s, channel %d, step %d: a stale slot from rank %d: it is "
               "marked as post %llu of the link where post %llu was due (FIFO positions out of "
               "step)",
               c->rank, mine, ch, step, from, (unsigned long long)w->found,
               (unsigned long long)w->expected);
    return BRG_ERR_INTERNAL;
  }
  return BRG_SUCCESS;
}

/* Why this rank's kernels were stopped, for the call after. */
brg_status brg__dev_kernel_stopped(brg_comm *c, struct brg__dev_ring *d) {
  char why[BRG__ERRLEN];
  brg_status s = kernel_fault(c, d, why, sizeof why);
  if (s != BRG_SUCCESS) return brg__comm_error(c, s, "%s", why);
  s = BRG_ERR_REMOTE;
  snprintf(why, sizeof why, "the communicator was aborted");
  pthread_mutex_lock(&d->ev_lock);
  if (d->k.stop_why[0]) snprintf(why, sizeof why, "%s", d->k.stop_why);
  brg_status own = d->k.stop_code;
  pthread_mutex_unlock(&d->ev_lock);
  /* The watchdog's own verdict (the neighbours' notices that follow it are
   * its echo). */
  if (own != BRG_SUCCESS) return brg__comm_error(c, own, "%s", why);
  for (int dir = 0; dir < 2; dir++) {
    char buf[BRG__BOOT_MAX_MSG + 1], text[BRG__ERRLEN / 2];
    uint32_t type = 0, len = 0;
    brg_status ls;
    if (brg__live_take(c, dir, &ls, &type, buf, &len, text, sizeof text) != 1) continue;
    int peer = dir == BRG__RING_NEXT ? c->ring.next : c->ring.prev;
    if (ls != BRG_SUCCESS) {
      snprintf(why, sizeof why, "rank %d (pid %d on %.64s) is gone: %.150s", peer,
               c->peers[peer].pid, c->peers[peer].hostname, text);
      break;
    }
    if (type == BRG__MSG_ABORT && len > 4) {
      buf[len] = 0;
      snprintf(why, sizeof why, "%.*s", (int)(sizeof why - 1), buf + 4);
      break;
    }
  }
  int64_t silent_ms = 0;
  int quiet = brg__live_silent(c, &silent_ms);
  if (quiet >= 0 && silent_ms >= brg__live_silent_limit_ms(c)) {
    s = silent_ms >= c->timeout_ms ? BRG_ERR_TIMEOUT : BRG_ERR_REMOTE;
    snprintf(why, sizeof why, "rank %d (pid %d on %s) has been silent for %lld ms", quiet,
             c->peers[quiet].pid, c->peers[quiet].hostname, (long long)silent_ms);
  }
  if (__atomic_load_n(&c->aborted, __ATOMIC_ACQUIRE)) s = BRG_ERR_ABORTED;
  return brg__comm_error(c, s,
                         "rank %d: a device collective's kernel stopped waiting for its "
                         "neighbours: %s",
                         c->rank, why);
}

/* The watchdog of kernel mode, on the liveness thread (c->kwatch), every
 * beat: a channel that stopped on a fault, or a launch in flight whose
 * progress has stood still for the timeout (a peer that never launches,
 * calls that deadlock), stops this rank's kernels through the abort word;
 * the reason waits for the next call and brg_comm_get_async_error. 1 and
 * the reason in why when it stopped them now. */
int brg__dev_kernel_watch(brg_comm *c, char *why, size_t n) {
  struct brg__dev_ring *d = __atomic_load_n(&c->dev, __ATOMIC_ACQUIRE);
  if (!d || !d->k.on || d->wd.fired) return 0;
  char text[BRG__ERRLEN];
  brg_status s = kernel_fault(c, d, text, sizeof text);
  int64_t now = brg__now_ns();
  for (int ch = 0; s == BRG_SUCCESS && ch < d->k.channels; ch++) {
    brg__rk_watch *w = watch_rec(d, ch);
    uint64_t started = __atomic_load_n(&w->started, __ATOMIC_RELAXED);
    uint64_t progress = __atomic_load_n(&w->progress, __ATOMIC_RELAXED);
    if (started == __atomic_load_n(&w->finished, __ATOMIC_RELAXED)) {
      d->wd.since[ch] = 0; /* nothing in flight */
      continue;
    }
    if (!d->wd.since[ch] || started != d->wd.started[ch] || progress != d->wd.progress[ch]) {
      d->wd.since[ch] = now;
      d->wd.started[ch] = started;
      d->wd.progress[ch] = progress;
      continue;
    }
    int64_t still_ms = (now - d->wd.since[ch]) / 1000000;
    if (still_ms < c->timeout_ms) continue;
    int wait = __atomic_load_n(&w->wait, __ATOMIC_RELAXED);
    int step = __atomic_load_n(&w->step, __ATOMIC_RELAXED);
    int peer = wait == BRG__RK_WAIT_RECV   ? c->ring.prev
               : wait == BRG__RK_WAIT_SEND ? c->ring.next
                                           : __atomic_load_n(&w->peer, __ATOMIC_RELAXED);
    if (peer < 0 || peer >= c->nranks) peer = c->ring.prev;
    char call[160];
    watch_call(call, sizeof call, &w->mine);
    snprintf(text, sizeof text,
             "rank %d: kernel-mode %s made no progress for %lld ms (BRIGADE_TIMEOUT_MS %d): "
             "channel %d waits at step %d for rank %d (pid %d on %s) %s; the kernels were "
             "stopped",
             c->rank, call, (long long)still_ms, c->timeout_ms, ch, step, peer, c->peers[peer].pid,
             c->peers[peer].hostname,
             wait == BRG__RK_WAIT_RECV   ? "to post a slot"
             : wait == BRG__RK_WAIT_SEND ? "to free a slot"
                                         : "to raise its one-shot flag");
    s = BRG_ERR_TIMEOUT;
  }
  if (s == BRG_SUCCESS) return 0;
  pthread_mutex_lock(&d->ev_lock);
  if (!d->k.stop_why[0] || d->k.stop_code == BRG_SUCCESS) {
    snprintf(d->k.stop_why, sizeof d->k.stop_why, "%s", text);
    d->k.stop_code = s;
  }
  pthread_mutex_unlock(&d->ev_lock);
  d->wd.fired = 1;
  brg__dev_kernel_stop(d);
  snprintf(why, n, "%s", text);
  return 1;
}

brg_status brg__device_async_error(brg_comm *c) {
  struct brg__dev_ring *d = __atomic_load_n(&c->dev, __ATOMIC_ACQUIRE);
  if (!d || !d->k.on || !d->k.words) return BRG_SUCCESS;
  if (!__atomic_load_n(&d->k.words->abort, __ATOMIC_ACQUIRE) &&
      __atomic_load_n(&d->k.words->status, __ATOMIC_ACQUIRE) == BRG__RK_OK)
    return BRG_SUCCESS;
  return brg__dev_kernel_stopped(c, d);
}
static brg_status kernel_drain_wait(brg_comm *c, struct brg__dev_ring *d);
static brg_status replays_stop(brg_comm *c, struct brg__dev_ring *d, brg_status s);

/* The streams that captured launches: an event after what they hold now
 * (graph replays launched there), where they are not capturing again. */
static void graph_streams_mark(struct brg__dev_ring *d) {
  const brg__cuda_api *api = d->api;
  for (int i = 0; i < d->k.ngstreams; i++) {
    int capturing = 0;
    if (api->drv.stream_capturing(d->k.gstream[i], &capturing) != 0 || capturing) {
      api->drv.last_error();
      continue;
    }
    if (!d->k.gdone_ev[i] && api->drv.event_create(&d->k.gdone_ev[i]) != 0) continue;
    api->drv.event_record(d->k.gdone_ev[i], d->k.gstream[i]);
  }
}

/* Whether every block of a graph replay that began has ended: replays on
 * any stream count their blocks in the pinned page (brg__dev_kwords.launches), ended
 * read after began, so that equal counts mean that every block begun when
 * `began` was read had ended when `ended` was. */
static int replays_done(const struct brg__dev_ring *d) {
  if (!d->k.graphs || !d->k.words) return 1;
  const uint64_t *w = d->k.words->launches;
  uint64_t began = __atomic_load_n(&w[0], __ATOMIC_SEQ_CST);
  return __atomic_load_n(&w[BRG__RK_ENDED], __ATOMIC_SEQ_CST) == began;
}

/* After the abort word is set for good: until every replay that began has
 * ended (those running stop at their next wait, those that begin now end
 * at once), seen on three polls a millisecond apart, so that a block that
 * read the word just before it was set is counted by then; 0 when that
 * took over 5 s (the memory must then stay). */
static int replays_drained(const struct brg__dev_ring *d) {
  /* The abort word again, sequentially consistent: ordered before the
   * counts' loads (a store then loads, which release alone does not order;
   * a fence would do too, but ThreadSanitizer builds refuse fences). */
  if (d->k.words) __atomic_store_n(&d->k.words->abort, 1, __ATOMIC_SEQ_CST);
  int64_t deadline = brg__deadline_ms(5000);
  for (int seen = 0; seen < 3;) {
    seen = replays_done(d) ? seen + 1 : 0;
    if (seen < 3 && brg__deadline_passed(deadline)) return 0;
    brg__sleep_ms(1);
  }
  return 1;
}

/* Kernel mode's drain. After graphs captured launches, their replays are
 * waited for too: those on the streams they were captured on by an event
 * there, those on any other stream by their count of blocks begun and
 * ended. A replay queued behind another on a stream no call named is not
 * counted before it begins, so the abort waits for the neighbours'
 * goodbyes (brg__dev_kernel_settle); a drain that failed stops them now. */
brg_status brg__dev_kernel_drain(brg_comm *c, struct brg__dev_ring *d) {
  if (d->k.graphs) graph_streams_mark(d);
  brg_status s = kernel_drain_wait(c, d);
  if (!d->k.graphs) return s;
  if (s == BRG_SUCCESS && d->k.words && !__atomic_load_n(&d->k.words->abort, __ATOMIC_ACQUIRE)) {
    d->k.settle = 1;
    return s;
  }
  return replays_stop(c, d, s);
}

uint64_t brg__dev_kernel_bye_word(const struct brg__dev_ring *d) {
  if (!d->k.graphs || !d->k.words) return 0;
  return __atomic_load_n(&d->k.words->launches[0], __ATOMIC_SEQ_CST);
}

/* After both neighbours' goodbyes: every replay they began met one of this
 * rank's (a collective needs every rank), so until this rank has begun as
 * many blocks as the neighbour that began most (`theirs`), one of its
 * replays is still queued and runs with theirs; then the abort word is
 * set for good (a replay that comes later ends at once), and nothing is
 * freed before every replay that began before it has ended. A replay of
 * this rank's beyond theirs that waits has no partner left: it is stopped
 * at once. Bounded by the timeout, after which the abort stops what is
 * left. */
brg_status brg__dev_kernel_settle(brg_comm *c, struct brg__dev_ring *d, uint64_t theirs) {
  if (!d->k.settle) return BRG_SUCCESS;
  d->k.settle = 0;
  const uint64_t *w = d->k.words->launches;
  int64_t deadline = brg__deadline_ms(c->timeout_ms);
  for (int i = 0; !brg__deadline_passed(deadline); i++) {
    uint64_t began = __atomic_load_n(&w[0], __ATOMIC_SEQ_CST);
    uint64_t ended = __atomic_load_n(&w[BRG__RK_ENDED], __ATOMIC_SEQ_CST);
    if (ended == began ? began >= theirs : began > theirs) break;
    brg__sleep_ms(i < 100 ? 0 : 1);
  }
  return replays_stop(c, d, BRG_SUCCESS);
}

/* Sets the abort word for good and waits for every replay that began to
 * end (replays_drained); s, or the error that names one that did not. */
static brg_status replays_stop(brg_comm *c, struct brg__dev_ring *d, brg_status s) {
  brg__dev_kernel_stop(d);
  if (!replays_drained(d)) {
    d->stuck = 1;
    if (s == BRG_SUCCESS)
      s = brg__comm_error(c, BRG_ERR_TIMEOUT,
                          "rank %d: a graph replay of a kernel-mode collective, launched on a "
                          "stream this communicator was not told of, did not stop within 5 s of "
                          "the abort at destroy: its memory stays allocated",
                          c->rank);
  }
  return s;
}

/* Kernel mode: waits for this rank's kernels with the communicator's
 * checks (the ring sockets, the timeout), since no liveness thread runs
 * any more; a neighbour gone or silent stops the kernels, and the stream
 * drains. */
static brg_status kernel_drain_wait(brg_comm *c, struct brg__dev_ring *d) {
  c->ring.cur = NULL;
  c->ring.wait_conn = NULL;
  c->ring.wait_peer = c->ring.next;
  c->ring.wait_what = "finish its device collectives";
  c->ring.wait_start_ns = 0;
  /* A neighbour that drained and left has taken every slot this rank's
   * kernels posted to it and posted every slot they read: they finish
   * without it. */
  c->ring.departed_ok = 1;
  for (int i = 0;; i++) {
    if (brg__dev_own_work_drained(d, 0) && brg__dev_proxy_flushed(d) && replays_done(d))
      return BRG_SUCCESS;
    brg_status s = c->ring.waiter.check ? c->ring.waiter.check(c->ring.waiter.arg) : BRG_SUCCESS;
    if (s != BRG_SUCCESS) {
      brg__dev_kernel_stop(d);
      int drained = brg__dev_own_work_drained(d, brg__deadline_ms(5000)) && replays_drained(d);
      d->stuck = !drained;
      char why[BRG__ERRLEN / 2];
      snprintf(why, sizeof why, "%.*s", (int)sizeof why - 1, c->last_error);
      return brg__comm_error(c, s,
                             "rank %d: device work on stream %p was stopped before it finished "
                             "(%s): %s",
                             c->rank, d->last_stream,
                             drained ? "the stream drained"
                                     : "the stream did not drain within 5 s "
                                       "and its FIFOs stay allocated",
                             why);
    }
    brg__sleep_ms(i < 100 ? 0 : 1);
  }
}
