/*
 * The ring engine: runs one collective over the FIFOs to the ring
 * neighbours, following the schedule of schedule.h.
 *
 *          +-----> pos 1 -----+
 *          |                  v
 *        pos 0              pos 2        each arrow is one FIFO of slots;
 *          ^                  |          a slice travels one hop per step
 *          +----- pos 3 <-----+
 *
 * Every slot carries a header naming the collective; the receiver checks it
 * against its own call, so ranks that disagree stop with BRG_ERR_MISMATCH.
 */
#include <errno.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "settings.h"
#include "internal.h"
#include "kernels.h"
#include "schedule.h"
#include "ring.h"
#include "device.h"

const char *brg__coll_name(brg__coll_kind kind) {
  switch (kind) {
  case BRG__COLL_ALLREDUCE: return "allreduce";
  case BRG__COLL_REDUCE_SCATTER: return "reduce_scatter";
  case BRG__COLL_ALL_GATHER: return "all_gather";
  case BRG__COLL_BROADCAST: return "broadcast";
  case BRG__COLL_REDUCE: return "reduce";
  case BRG__COLL_BARRIER: return "barrier";
  }
  return "unknown";
}

int64_t brg__now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void describe(char *out, size_t n, brg__coll_kind kind, uint64_t seq, uint64_t count,
                     int dtype, int op, int root, int device) {
  const char *dn = brg_dtype_name((brg_dtype)dtype), *on = brg_op_name((brg_op)op);
  snprintf(out, n, "%s #%llu (count %llu, %s, %s, root %d%s)", brg__coll_name(kind),
           (unsigned long long)seq, (unsigned long long)count, dn ? dn : "?", on ? on : "-",
           root, device ? ", GPU buffers" : "");
}

/* Reads what arrived on a ring socket while we were waiting: an abort
 * notice from a neighbour, a goodbye, or the hang-up of one that died. */
static brg_status check_ring_socket(brg_comm *c, int dir) {
  int fd = brg__bootstrap_fd(c->bs, dir);
  if (fd < 0 || c->departed[dir]) return BRG_SUCCESS;
  struct pollfd pfd = {.fd = fd, .events = POLLIN};
  if (poll(&pfd, 1, 0) <= 0) return BRG_SUCCESS;
  int peer = dir == BRG__RING_NEXT ? c->next : c->prev;
  char buf[BRG__BOOT_MAX_MSG + 1];
  uint32_t type = 0, len = 0;
  brg__errbuf err;
  brg_status s = brg__bootstrap_recv(c->bs, dir, &type, buf, BRG__BOOT_MAX_MSG, &len, 0, &err);
  if (s == BRG_ERR_TIMEOUT) return BRG_SUCCESS;
  if (s != BRG_SUCCESS)
    return brg__comm_error(c, BRG_ERR_REMOTE, "rank %d (pid %d on %s) is gone: %s", peer,
                           c->peers[peer].pid, c->peers[peer].hostname, err.msg);
  if (type == BRG__MSG_BYE) {
    c->departed[dir] = 1;
    return BRG_SUCCESS;
  }
  if (type == BRG__MSG_ABORT && len >= 4) {
    brg_status rs;
    memcpy(&rs, buf, 4);
    buf[len] = 0;
    if (rs <= BRG_IN_PROGRESS || rs > BRG_ERR_INTERNAL) rs = BRG_ERR_REMOTE;
    if (rs == BRG_ERR_ABORTED || rs == BRG_ERR_TIMEOUT) rs = BRG_ERR_REMOTE;
    /* Say what this rank itself was waiting for: with cascading timeouts
     * that names the rank that really stalled. */
    if (c->wait_peer != peer && c->wait_start_ns)
      return brg__comm_error(c, rs, "%s; rank %d was itself waiting %lld ms for rank %d to %s",
                             buf + 4, c->rank,
                             (long long)((brg__now_ns() - c->wait_start_ns) / 1000000),
                             c->wait_peer, c->wait_what);
    return brg__comm_error(c, rs, "%s", buf + 4);
  }
  return brg__comm_error(c, BRG_ERR_REMOTE, "unexpected message type %u from rank %d", type,
                         peer);
}

/* The waiter's check: called about every millisecond while a wait sleeps. */
static brg_status ring_check(void *arg) {
  brg_comm *c = arg;
  if (__atomic_load_n(&c->aborted, __ATOMIC_ACQUIRE))
    return brg__comm_error(c, BRG_ERR_ABORTED, "aborted by brg_comm_abort");
  /* Notices first: they name the rank that failed, which a broken link
   * further along the ring does not. During setup the ring sockets carry
   * the setup messages themselves. */
  for (int dir = 0; c->ready && dir < 2; dir++) {
    brg_status s = check_ring_socket(c, dir);
    if (s != BRG_SUCCESS) return s;
  }
  brg__conn *w = c->wait_conn;
  uint32_t closed =
      w && w->fifo.ctrl ? __atomic_load_n(&w->fifo.ctrl->closed, __ATOMIC_ACQUIRE) : 0;
  if (closed)
    return brg__comm_error(c, (brg_status)closed,
                           "%s link with rank %d closed while waiting for it to %s: %s",
                           w->ops ? w->ops->name : "?", w->peer, c->wait_what,
                           w->fifo.ctrl->closed_why[0] ? w->fifo.ctrl->closed_why : "no reason given");
  int64_t now = brg__now_ns();
  if (!c->wait_start_ns) c->wait_start_ns = now;
  int dir = c->wait_peer == c->next ? BRG__RING_NEXT : BRG__RING_PREV;
  /* A neighbour that left cleanly sent all it had; allow a moment for data
   * still on the wire, then say who left too early. */
  if (c->ready && c->departed[dir] && now - c->wait_start_ns > 1000000000LL)
    return brg__comm_error(c, BRG_ERR_REMOTE,
                           "rank %d destroyed its communicator while rank %d was still waiting "
                           "for it to %s (did the ranks call different numbers of collectives?)",
                           c->wait_peer, c->rank, c->wait_what);
  if (now - c->wait_start_ns > (int64_t)c->timeout_ms * 1000000) {
    char what[160] = "setup";
    if (c->cur)
      describe(what, sizeof what, c->cur->kind, c->cur->seq, c->cur->count, c->cur->dtype,
               c->cur->op, c->cur->root, c->cur->stream != NULL);
    return brg__comm_error(c, BRG_ERR_TIMEOUT,
                           "timeout: no progress for %d ms in %s at step %d, waiting for rank "
                           "%d (pid %d on %s) to %s",
                           c->timeout_ms, what, c->cur_step, c->wait_peer,
                           c->peers[c->wait_peer].pid, c->peers[c->wait_peer].hostname,
                           c->wait_what);
  }
  return BRG_SUCCESS;
}

void brg__ring_waiter_init(brg_comm *c) {
  c->waiter.spin = (int)brg__core_int(BRG__CORE_SPIN);
  c->waiter.check = ring_check;
  c->waiter.arg = c;
}

/* ---- the five primitives' building blocks ---- */


/* Waits for a free slot in the FIFO to the next rank; small slices go in
 * the slot header itself. The receiver's head is re-read only when the
 * last value seen says the FIFO is full. */
brg_status brg__ring_send_acquire(ring_op *o, size_t bytes, char **slot) {
  brg_comm *c = o->c;
  brg__fifo *f = &c->send.fifo;
  if (c->send_pos + 1 > c->send_head + (uint64_t)f->nslots) {
    c->send_head = __atomic_load_n(&f->ctrl->head, __ATOMIC_ACQUIRE);
    if (c->send_pos + 1 > c->send_head + (uint64_t)f->nslots) {
      c->wait_what = "free a slot (it is not receiving)";
      c->wait_peer = c->next;
      c->wait_conn = &c->send;
      c->wait_start_ns = 0;
      brg_status s = brg__wait_ge(&f->ctrl->head, &f->ctrl->head_waiters,
                                  c->send_pos + 1 - (uint64_t)f->nslots, &c->waiter);
      if (s != BRG_SUCCESS) return s;
      c->send_head = __atomic_load_n(&f->ctrl->head, __ATOMIC_ACQUIRE);
    }
  }
  *slot = bytes <= BRG__INLINE_BYTES ? brg__fifo_meta(f, c->send_pos)->inline_data
                                     : brg__fifo_slot(f, c->send_pos);
  return BRG_SUCCESS;
}

void brg__ring_send_post(ring_op *o, size_t bytes) {
  brg_comm *c = o->c;
  brg__fifo *f = &c->send.fifo;
  brg__slot_meta *m = brg__fifo_meta(f, c->send_pos);
  m->seq = o->coll->seq;
  m->count = o->coll->count;
  m->kind = (uint32_t)o->coll->kind;
  m->bytes = (uint32_t)bytes;
  m->dtype = (uint16_t)o->coll->dtype;
  m->op = (uint16_t)o->coll->op;
  m->root = o->coll->root;
  m->step = (uint32_t)c->cur_step;
  m->device = o->dev != NULL;
  c->send_pos++;
  c->bytes_sent += bytes;
  __atomic_store_n(&m->flag, c->send_pos, __ATOMIC_RELEASE);
  brg__publish(&f->ctrl->tail, &f->ctrl->tail_waiters, c->send_pos);
}

/* Waits for the next slot from the previous rank and checks its header. */
brg_status brg__ring_recv_acquire(ring_op *o, const char **slot, size_t bytes) {
  brg_comm *c = o->c;
  brg__fifo *f = &c->recv.fifo;
  brg__slot_meta *m = brg__fifo_meta(f, c->recv_pos);
  if (__atomic_load_n(&m->flag, __ATOMIC_ACQUIRE) != c->recv_pos + 1) {
    c->wait_what = "send data";
    c->wait_peer = c->prev;
    c->wait_conn = &c->recv;
    c->wait_start_ns = 0;
    brg_status s = brg__wait_flag(&m->flag, c->recv_pos + 1, &f->ctrl->tail,
                                  &f->ctrl->tail_waiters, &c->waiter);
    if (s != BRG_SUCCESS) return s;
  }
  const brg__coll *k = o->coll;
  if (m->seq != k->seq || m->kind != (uint32_t)k->kind || m->count != k->count ||
      m->dtype != (uint16_t)k->dtype || m->op != (uint16_t)k->op || m->root != k->root ||
      m->bytes != bytes || m->device != (o->dev != NULL)) {
    char mine[160], theirs[160];
    describe(mine, sizeof mine, k->kind, k->seq, k->count, k->dtype, k->op, k->root,
             o->dev != NULL);
    describe(theirs, sizeof theirs, (brg__coll_kind)m->kind, m->seq, m->count, m->dtype, m->op,
             m->root, (int)m->device);
    return brg__comm_error(c, BRG_ERR_MISMATCH,
                           "collective mismatch: rank %d called %s but rank %d called %s", c->rank,
                           mine, c->prev, theirs);
  }
  *slot = bytes <= BRG__INLINE_BYTES ? m->inline_data : brg__fifo_slot(f, c->recv_pos);
  return BRG_SUCCESS;
}

void brg__ring_recv_release(ring_op *o) {
  brg_comm *c = o->c;
  brg__fifo *f = &c->recv.fifo;
  c->recv_pos++;
  brg__publish(&f->ctrl->head, &f->ctrl->head_waiters, c->recv_pos);
}

/* One primitive on one slice of m elements. `in` is this rank's input for
 * the slice, `out` its output (either may be NULL when the primitive does
 * not use it). */
static const char *prim_name(brg__prim p) {
  switch (p) {
  case BRG__PRIM_SEND: return "send";
  case BRG__PRIM_RECV_REDUCE_SEND: return "recv_reduce_send";
  case BRG__PRIM_RECV_REDUCE_COPY_SEND: return "recv_reduce_copy_send";
  case BRG__PRIM_RECV_REDUCE_COPY: return "recv_reduce_copy";
  case BRG__PRIM_RECV_COPY_SEND: return "recv_copy_send";
  case BRG__PRIM_RECV: return "recv";
  case BRG__PRIM_COPY: return "copy";
  }
  return "?";
}

/* Element offset of p in buffer base, or -1 (for the trace). */
static long elem_off(const void *p, const void *base, size_t esize) {
  return p && base ? (long)(((const char *)p - (const char *)base) / (ptrdiff_t)esize) : -1;
}

static brg_status run_prim(ring_op *o, brg__prim prim, const char *in, char *out, size_t m) {
  const brg__coll *k = o->coll;
  /* One line per primitive: the slice order, the same for host and GPU
   * buffers (tests/gpu/test_device_schedule compares the two). */
  BRG__TRACE("ring", "%s #%llu (%s) step %d %s: %zu elements, in +%ld, out +%ld",
             brg__coll_name(k->kind), (unsigned long long)k->seq, o->dev ? "GPU" : "host",
             o->c->cur_step, prim_name(prim), m, elem_off(in, k->sendbuf, o->esize),
             elem_off(out, k->recvbuf, o->esize));
  size_t bytes = m * o->esize;
  brg_op mid = k->op == BRG_AVG ? BRG_SUM : k->op;
  int n = o->c->nranks;
  const char *r = NULL;
  char *slot = NULL;
  brg_status s;
  int recvs = brg__prim_recvs(prim), sends = brg__prim_sends(prim);
  if (o->dev) return brg__device_prim(o, prim, in, out, m);
  if (recvs && (s = brg__ring_recv_acquire(o, &r, bytes)) != BRG_SUCCESS) return s;
  if (sends && (s = brg__ring_send_acquire(o, bytes, &slot)) != BRG_SUCCESS) return s;
  if (m == 0) goto done;
  if (o->stream && out) {
    /* Large collective: the slot (in cache) takes the result, and the output
     * is streamed from it, skipping the read-for-ownership of the output. */
    switch (prim) {
    case BRG__PRIM_SEND: brg__copy(slot, NULL, in, bytes); brg__copy_stream(out, in, bytes); goto done;
    case BRG__PRIM_RECV_REDUCE_COPY_SEND:
      brg__reduce(slot, NULL, r, in, m, k->dtype, k->op, n);
      brg__copy_stream(out, slot, bytes);
      goto done;
    case BRG__PRIM_RECV_COPY_SEND: brg__copy(slot, NULL, r, bytes); brg__copy_stream(out, r, bytes); goto done;
    case BRG__PRIM_RECV: brg__copy_stream(out, r, bytes); goto done;
    default: break;
    }
  }
  switch (prim) {
  case BRG__PRIM_SEND: brg__copy(slot, out, in, bytes); break;
  case BRG__PRIM_RECV_REDUCE_SEND: brg__reduce(slot, NULL, r, in, m, k->dtype, mid, 1); break;
  case BRG__PRIM_RECV_REDUCE_COPY_SEND:
    brg__reduce(out, slot, r, in, m, k->dtype, k->op, n);
    break;
  case BRG__PRIM_RECV_REDUCE_COPY: brg__reduce(out, NULL, r, in, m, k->dtype, k->op, n); break;
  case BRG__PRIM_RECV_COPY_SEND: brg__copy(out, slot, r, bytes); break;
  case BRG__PRIM_RECV: brg__copy(out, NULL, r, bytes); break;
  case BRG__PRIM_COPY: brg__copy(out, NULL, in, bytes); break;
  }
done:
  if (sends) brg__ring_send_post(o, bytes);
  if (recvs) brg__ring_recv_release(o);
  return BRG_SUCCESS;
}

/* Allreduce, reduce-scatter and all-gather: steps [t0, t1] of the ring
 * schedule. `stride` is the element distance between chunks in the
 * full-size buffer (0: balanced split of count). */
static brg_status run_ring(ring_op *o, int t0, int t1) {
  brg_comm *c = o->c;
  const brg__coll *k = o->coll;
  int n = c->nranks, p = c->pos;
  int ag = k->kind == BRG__COLL_ALL_GATHER, rs = k->kind == BRG__COLL_REDUCE_SCATTER;
  size_t per = k->count; /* elements per chunk for rs / ag */
  size_t total = rs || ag ? per * (size_t)n : k->count;
  size_t max_slices = 0;
  for (int i = 0; i < n; i++) {
    size_t cnt = rs || ag ? per : brg__part_count(total, n, i);
    size_t ns = brg__slice_total(cnt, o->slice_elems);
    if (ns > max_slices) max_slices = ns;
  }
  for (size_t sl = 0; sl < max_slices; sl++) {
    for (int t = t0; t <= t1; t++) {
      int id = c->ring[brg__ring_chunk(p, n, t)];
      size_t cnt = rs || ag ? per : brg__part_count(total, n, id);
      size_t off = rs || ag ? per * (size_t)id : brg__part_offset(total, n, id);
      if (sl >= brg__slice_total(cnt, o->slice_elems)) continue;
      size_t m = brg__slice_count(cnt, o->slice_elems, sl);
      size_t e = off + brg__slice_offset(sl, o->slice_elems);
      const char *in = NULL;
      char *out = NULL;
      brg__prim prim = brg__ring_prim(n, t);
      if (rs) {
        in = (const char *)k->sendbuf + e * o->esize;
        if (t == t1) {
          prim = BRG__PRIM_RECV_REDUCE_COPY;
          out = (char *)k->recvbuf + brg__slice_offset(sl, o->slice_elems) * o->esize;
        }
      } else if (ag) {
        out = (char *)k->recvbuf + e * o->esize;
        if (t == t0) {
          prim = BRG__PRIM_SEND; /* own block: input -> output and next */
          in = (const char *)k->sendbuf + brg__slice_offset(sl, o->slice_elems) * o->esize;
        }
      } else {
        in = k->sendbuf ? (const char *)k->sendbuf + e * o->esize : NULL;
        out = k->recvbuf ? (char *)k->recvbuf + e * o->esize : NULL;
      }
      if (prim == BRG__PRIM_SEND && !ag) out = NULL;
      c->cur_step = t;
      o->elem = e;
      brg_status s = run_prim(o, prim, in, out, m);
      if (s != BRG_SUCCESS) return s;
    }
  }
  return BRG_SUCCESS;
}

/* Broadcast and reduce: a pipelined chain of N-1 hops along the ring. */
static brg_status run_chain(ring_op *o) {
  brg_comm *c = o->c;
  const brg__coll *k = o->coll;
  int n = c->nranks;
  int root_pos = 0;
  for (int i = 0; i < n; i++)
    if (c->ring[i] == k->root) root_pos = i;
  int bcast = k->kind == BRG__COLL_BROADCAST;
  int first = bcast ? root_pos : (root_pos + 1) % n;
  int hop = brg__chain_hop(c->pos, first, n);
  brg__prim prim;
  if (hop == 0) prim = BRG__PRIM_SEND;
  else if (hop < n - 1) prim = bcast ? BRG__PRIM_RECV_COPY_SEND : BRG__PRIM_RECV_REDUCE_SEND;
  else prim = bcast ? BRG__PRIM_RECV : BRG__PRIM_RECV_REDUCE_COPY;
  size_t slices = brg__slice_total(k->count, o->slice_elems);
  for (size_t sl = 0; sl < slices; sl++) {
    size_t e = brg__slice_offset(sl, o->slice_elems);
    size_t m = brg__slice_count(k->count, o->slice_elems, sl);
    const char *in = k->sendbuf ? (const char *)k->sendbuf + e * o->esize : NULL;
    char *out = k->recvbuf ? (char *)k->recvbuf + e * o->esize : NULL;
    /* The broadcast root also fills its own output; reduce senders do not. */
    if (prim == BRG__PRIM_SEND && !(bcast && in != out)) out = NULL;
    if (!bcast && prim != BRG__PRIM_RECV_REDUCE_COPY) out = NULL;
    if (bcast && hop != 0) in = NULL;
    c->cur_step = hop;
    o->elem = e;
    brg_status s = run_prim(o, prim, in, out, m);
    if (s != BRG_SUCCESS) return s;
  }
  return BRG_SUCCESS;
}

/* Small allreduce: latency is the number of hops, so gather every rank's
 * input around the ring (N-1 hops instead of 2N-2) and let each rank reduce
 * locally, in rank order, so that every rank computes bit-identical results.
 *
 *   step 0:          own input -> scratch[rank], next
 *   step 1..N-2:     prev -> scratch[r'], next      (r' = origin of the block)
 *   step N-1:        prev -> scratch[r']
 *   then:            out = scratch[0] (+) scratch[1] (+) ... (+) scratch[N-1]
 */
static brg_status run_small_allreduce(ring_op *o) {
  brg_comm *c = o->c;
  const brg__coll *k = o->coll;
  int n = c->nranks;
  size_t m = k->count, bytes = m * o->esize;
  for (int t = 0; t < n; t++) {
    int origin = c->ring[brg__mod((long)c->pos - t, n)];
    char *block = c->scratch + (size_t)origin * bytes;
    brg__prim prim = t == 0 ? BRG__PRIM_SEND : t < n - 1 ? BRG__PRIM_RECV_COPY_SEND : BRG__PRIM_RECV;
    c->cur_step = t;
    brg_status s = run_prim(o, prim, k->sendbuf, block, m);
    if (s != BRG_SUCCESS) return s;
  }
  brg_op mid = k->op == BRG_AVG ? BRG_SUM : k->op;
  const char *acc = c->scratch;
  for (int r = 1; r < n; r++) {
    const char *next = c->scratch + (size_t)r * bytes;
    brg__reduce(k->recvbuf, NULL, acc, next, m, k->dtype, r == n - 1 ? k->op : mid, n);
    acc = k->recvbuf;
  }
  return BRG_SUCCESS;
}

/* One rank: the result is the input (divided by 1 for avg). */
static void run_single(const brg__coll *k, size_t esize) {
  size_t elems = k->count;
  if (!k->recvbuf || k->kind == BRG__COLL_BARRIER) return;
  if (k->recvbuf != k->sendbuf) brg__copy(k->recvbuf, NULL, k->sendbuf, elems * esize);
}

brg_status brg__coll_execute(brg_comm *c, brg__coll *k) {
  if (k->stream && c->nranks == 1) {
    k->seq = ++c->seq;
    return brg__device_single(c, k);
  }
  /* The first device collective sets up the device ring on every rank. */
  if (k->stream && !c->dev) {
    brg_status s = brg__device_ring_setup(c);
    if (s != BRG_SUCCESS) return s;
  }
  k->seq = ++c->seq;
  c->cur = k;
  c->cur_step = 0;
  ring_op o = {.c = c, .coll = k, .esize = brg_dtype_size(k->dtype)};
  o.slice_elems = c->slot_bytes / o.esize;
  if (k->stream) {
    o.dev = c->dev;
    o.slice_elems = brg__device_ring_slot_bytes(c->dev) / o.esize;
  }
  size_t total = k->count * o.esize;
  if (k->kind == BRG__COLL_ALL_GATHER || k->kind == BRG__COLL_REDUCE_SCATTER)
    total *= (size_t)c->nranks;
  /* In place the output lines are already cached by the read of the input,
   * so only out-of-place outputs gain from streaming. */
  o.stream = !o.dev && c->stream_bytes > 0 && total >= c->stream_bytes && k->sendbuf != k->recvbuf;
  brg_status s = BRG_SUCCESS;
  int n = c->nranks;
  if (n == 1) {
    run_single(k, o.esize);
  } else {
    switch (k->kind) {
    case BRG__COLL_ALLREDUCE:
      if (!o.dev && k->count > 0 && k->count * o.esize <= c->small_bytes) {
        s = run_small_allreduce(&o);
        break;
      }
      /* fall through */
    case BRG__COLL_BARRIER: s = run_ring(&o, 0, 2 * n - 2); break;
    case BRG__COLL_REDUCE_SCATTER: s = run_ring(&o, 0, n - 1); break;
    case BRG__COLL_ALL_GATHER: s = run_ring(&o, n - 1, 2 * n - 2); break;
    case BRG__COLL_BROADCAST:
    case BRG__COLL_REDUCE: s = run_chain(&o); break;
    }
  }
  c->cur = NULL;
  return s;
}
