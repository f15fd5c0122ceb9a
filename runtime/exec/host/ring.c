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
 * against its own call, so ranks that disagree stop with BRG_ERR_MISMATCH
 * (ring_link.c, which also holds the waits on the two links).
 */
#include <stddef.h>
#include <string.h>

#include "exec.h"
#include "internal.h"
#include "kernels.h"
#include "ring_link.h"
#include "schedule.h"
#include "trace.h"

/* Element offset of p in buffer base, or -1 (for the trace). */
static long elem_off(const void *p, const void *base, size_t esize) {
  return p && base ? (long)(((const char *)p - (const char *)base) / (ptrdiff_t)esize) : -1;
}

/* A slice into the output, streamed past the cache for large collectives. */
static void copy_out(const brg__ring_op *o, char *out, const void *src, size_t bytes) {
  if (o->nt)
    brg__copy_nt(out, src, bytes);
  else
    brg__copy(out, NULL, src, bytes);
}

/* Host buffers: the CPU reads and writes the transports' slots. */

static uint64_t host_piece(const brg__ring_op *o, int send) {
  (void)o, (void)send;
  return UINT64_MAX; /* a host slot takes a whole slice */
}

static brg_status host_recv(brg__ring_op *o, size_t shift, uint64_t bytes, const char **r) {
  (void)shift;
  return brg__ring_recv_acquire(o, r, bytes);
}

static brg_status host_send(brg__ring_op *o, size_t shift, uint64_t bytes, char **slot) {
  (void)shift;
  return brg__ring_send_acquire(o, bytes, slot);
}

static brg_status host_apply(brg__ring_op *o, brg__prim prim, const char *in, char *out,
                             const char *r, char *slot, size_t m, const void **payload) {
  const brg__coll *k = o->coll;
  size_t bytes = m * o->esize;
  brg_op mid = k->op == BRG_AVG ? BRG_SUM : k->op;
  int n = o->c->nranks;
  if (m == 0) return BRG_SUCCESS;
  if (brg__prim_sends(prim) && o->direct) {
    /* The link sends from anywhere (tcp): what goes to the next rank is
     * sent from where it already is, the input, the output or the slot it
     * came in, instead of being copied into the send FIFO first. */
    switch (prim) {
    case BRG__PRIM_SEND:
      *payload = in;
      if (out && out != in) copy_out(o, out, in, bytes);
      return BRG_SUCCESS;
    case BRG__PRIM_RECV_REDUCE_COPY_SEND:
      if (o->nt || !out) break;
      brg__reduce(out, NULL, r, in, m, k->dtype, k->op, n);
      *payload = out;
      return BRG_SUCCESS;
    case BRG__PRIM_RECV_COPY_SEND:
      *payload = r;
      if (out != r) copy_out(o, out, r, bytes);
      return BRG_SUCCESS;
    default: break;
    }
  }
  if (o->nt && out) {
    /* Large collective: the slot (in cache) takes the result, and the output
     * is streamed from it, skipping the read-for-ownership of the output. */
    switch (prim) {
    case BRG__PRIM_SEND:
      brg__copy(slot, NULL, in, bytes);
      brg__copy_nt(out, in, bytes);
      return BRG_SUCCESS;
    case BRG__PRIM_RECV_REDUCE_COPY_SEND:
      brg__reduce(slot, NULL, r, in, m, k->dtype, k->op, n);
      brg__copy_nt(out, slot, bytes);
      return BRG_SUCCESS;
    case BRG__PRIM_RECV_COPY_SEND:
      brg__copy(slot, NULL, r, bytes);
      brg__copy_nt(out, r, bytes);
      return BRG_SUCCESS;
    case BRG__PRIM_RECV:
      if (out != r) brg__copy_nt(out, r, bytes);
      return BRG_SUCCESS;
    default: break;
    }
  }
  brg__prim_math w = brg__prim_math_of(prim);
  void *d0 = brg__prim_buf(w.dst0, in, r, out, slot), *d1 = brg__prim_buf(w.dst1, in, r, out, slot);
  const void *x = brg__prim_buf(w.a, in, r, out, slot), *y = brg__prim_buf(w.b, in, r, out, slot);
  if (w.reduce)
    brg__reduce(d0, d1, x, y, m, k->dtype, w.last ? k->op : mid, w.last ? n : 1);
  else if (d0 != x || d1) /* (a received slice may already be in the output) */
    brg__copy(d0, d1, x, bytes);
  return BRG_SUCCESS;
}

static brg_status host_sent(brg__ring_op *o, uint64_t bytes, const void *payload) {
  return brg__ring_send_post(o, bytes, payload);
}

static brg_status host_received(brg__ring_op *o) {
  brg__ring_recv_release(o);
  return BRG_SUCCESS;
}

const brg__mem_ops brg__mem_host = {
    .name = "host",
    .piece = host_piece,
    .recv = host_recv,
    .send = host_send,
    .apply = host_apply,
    .sent = host_sent,
    .received = host_received,
};

/* One primitive on one slice of m elements, host or GPU buffers alike (see
 * brg__mem_ops). `in` is this rank's input for the slice, `out` its output
 * (either may be NULL when the primitive does not use it). */
static brg_status prim_body(brg__ring_op *o, brg__prim prim, const char *in, char *out, size_t m) {
  const brg__coll *k = o->coll;
  const brg__mem_ops *mem = o->mem;
  /* One line per primitive: the slice order, the same for host and GPU
   * buffers (tests/gpu/test_device_schedule compares the two). */
  BRG__TRACE("ring", "%s #%llu (%s) step %d %s: %zu elements, in +%ld, out +%ld",
             brg__coll_name(k->kind), (unsigned long long)k->seq, mem->name, o->r->cur_step,
             brg__prim_name(prim), m, elem_off(in, k->sendbuf, o->esize),
             elem_off(out, k->recvbuf, o->esize));
  uint64_t bytes = (uint64_t)m * o->esize;
  int recvs = brg__prim_recvs(prim), sends = brg__prim_sends(prim);
  uint64_t rmax = recvs ? mem->piece(o, 0) : UINT64_MAX;
  uint64_t smax = sends ? mem->piece(o, 1) : UINT64_MAX;
  int rsplit = rmax < bytes, ssplit = smax < bytes;
  uint64_t piece = bytes;
  if (rsplit) piece = rmax;
  if (ssplit && smax < piece) piece = smax;
  piece -= piece % o->esize;
  size_t shift = (o->elem * o->esize) % 16;
  const char *r = NULL;
  char *slot = NULL;
  brg_status s;
  uint64_t off = 0;
  do {
    uint64_t pb = bytes - off < piece ? bytes - off : piece;
    int first = off == 0, last = off + pb == bytes;
    const void *payload = NULL; /* what is sent, where not the slot */
    if (recvs && (rsplit || first) &&
        (s = mem->recv(o, shift, rsplit ? pb : bytes, &r)) != BRG_SUCCESS)
      return s;
    if (sends && (ssplit || first) &&
        (s = mem->send(o, shift, ssplit ? pb : bytes, &slot)) != BRG_SUCCESS)
      return s;
    const char *rp = r ? r + (rsplit ? 0 : off) : NULL;
    char *sp = slot ? slot + (ssplit ? 0 : off) : NULL;
    s = mem->apply(o, prim, in ? in + off : NULL, out ? out + off : NULL, rp, sp,
                   (size_t)(pb / o->esize), &payload);
    if (s != BRG_SUCCESS) return s;
    if (sends && (ssplit || last) &&
        (s = mem->sent(o, ssplit ? pb : bytes, payload)) != BRG_SUCCESS)
      return s;
    if (recvs && (rsplit || last) && (s = mem->received(o)) != BRG_SUCCESS) return s;
    off += pb;
  } while (off < bytes);
  return BRG_SUCCESS;
}

/* prim_body, as a span of the trace when tracing is on. */
static brg_status run_prim(brg__ring_op *o, brg__prim prim, const char *in, char *out, size_t m) {
  if (__builtin_expect(o->c->trace == NULL, 1)) return prim_body(o, prim, in, out, m);
  int64_t t0 = brg__trace_slice_begin(o->c->trace);
  brg_status s = prim_body(o, prim, in, out, m);
  brg__trace_slice_end(o, prim, m * o->esize, t0, s);
  return s;
}

/* The plan of schedule.h for this call: the whole call, one channel. */
static void plan_begin(const brg__ring_op *o, brg__sched *pl) {
  const brg__coll *k = o->coll;
  const brg__ring *r = o->r;
  *pl = (brg__sched){.kind = k->kind,
                     .nranks = o->c->nranks,
                     .pos = r->pos,
                     .ring = r->order,
                     .root = k->root,
                     .inplace = k->sendbuf == k->recvbuf,
                     .whole = k->whole,
                     .count = k->count,
                     .stride = k->stride,
                     .slice_elems = o->slice_elems,
                     .nchannels = 1};
  brg__sched_begin(pl);
}

/* A step's input and output in this call's buffers (NULL: none). */
static const char *step_in(const brg__ring_op *o, const brg__step *st) {
  const char *b = o->coll->sendbuf;
  return st->in && b ? b + st->in_off * o->esize : NULL;
}
static char *step_out(const brg__ring_op *o, const brg__step *st) {
  char *b = o->coll->recvbuf;
  return st->out && b ? b + st->out_off * o->esize : NULL;
}

/* Receive windows: the all-gather steps only copy what arrives into the
 * output, so the link may land it there straight away. A second walk of
 * the plan runs ahead of the engine and offers the output of each such
 * step for the slot it will arrive in, as far ahead as the FIFO reaches
 * but never past the slice the engine has just worked on: in place, the
 * first step sends a slice from the very memory its last all-gather step
 * receives into, and an offer made after that send orders the two for
 * every thread (the peer cannot answer before it, but the proof runs
 * through the other process). The reduce-scatter steps need what arrives
 * beside their own input, so theirs lands in the FIFO. */
typedef struct ring_ahead {
  brg__sched plan;
  uint64_t pos; /* the slot the next receiving step of the walk takes */
} ring_ahead;

static void ring_offer_windows(brg__ring_op *o, ring_ahead *a, size_t last_sl) {
  brg__ring *r = o->r;
  uint64_t limit = r->recv_pos + (uint64_t)r->recv.fifo.nslots;
  brg__step st;
  while (a->pos < limit) {
    brg__sched before = a->plan;
    if (!brg__sched_next(&a->plan, &st)) break;
    if (st.slice > last_sl) {
      a->plan = before;
      break;
    }
    if (!brg__prim_recvs(st.prim)) continue;
    size_t bytes = st.count * o->esize;
    char *out = step_out(o, &st);
    if ((st.prim == BRG__PRIM_RECV || st.prim == BRG__PRIM_RECV_COPY_SEND) && out &&
        bytes > BRG__INLINE_BYTES)
      r->recv.ops->recv_window(&r->recv, a->pos, out, bytes);
    a->pos++;
  }
}

brg_status brg__ring_walk(brg__ring_op *o) {
  brg__ring *r = o->r;
  brg__sched plan;
  plan_begin(o, &plan);
  /* (the chain's slices only pass through, in the FIFO) */
  int windows = o->windows && !plan.chain;
  ring_ahead ahead = {.plan = plan, .pos = r->recv_pos};
  brg__step st;
  while (brg__sched_next(&plan, &st)) {
    r->cur_step = st.step;
    o->elem = st.elem;
    if (st.chunk >= 0) o->chunk = st.chunk;
    o->slice = st.slice;
    brg_status s = run_prim(o, st.prim, step_in(o, &st), step_out(o, &st), st.count);
    if (s != BRG_SUCCESS) return s;
    if (windows) ring_offer_windows(o, &ahead, st.slice);
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
static brg_status run_small_allreduce(brg__ring_op *o) {
  brg_comm *c = o->c;
  brg__ring *r = o->r;
  const brg__coll *k = o->coll;
  int n = c->nranks;
  size_t m = k->count, bytes = m * o->esize;
  for (int t = 0; t < n; t++) {
    int origin = r->order[brg__mod((long)r->pos - t, n)];
    char *block = c->scratch + (size_t)origin * bytes;
    brg__prim prim = t == 0      ? BRG__PRIM_SEND
                     : t < n - 1 ? BRG__PRIM_RECV_COPY_SEND
                                 : BRG__PRIM_RECV;
    r->cur_step = t;
    o->chunk = origin;
    brg_status s = run_prim(o, prim, k->sendbuf, block, m);
    if (s != BRG_SUCCESS) return s;
  }
  brg_op mid = k->op == BRG_AVG ? BRG_SUM : k->op;
  const char *acc = c->scratch;
  for (int q = 1; q < n; q++) {
    const char *next = c->scratch + (size_t)q * bytes;
    brg__reduce(k->recvbuf, NULL, acc, next, m, k->dtype, q == n - 1 ? k->op : mid, n);
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

/* all_to_all moves its blocks over point-to-point links, not the ring. A
 * header-only slot to the next rank first lets a neighbour that called
 * another collective stop with BRG_ERR_MISMATCH at once, where both would
 * otherwise wait out the timeout. Ranks of one all_to_all that differ in
 * count or dtype pass it: the blocks' own headers name those (p2p.c). */
static brg_status a2a_announce(brg__ring_op *o) {
  brg_status s = run_prim(o, BRG__PRIM_SEND, NULL, NULL, 0);
  return s != BRG_SUCCESS ? s : run_prim(o, BRG__PRIM_RECV, NULL, NULL, 0);
}

/* (inlined into both callers, so that the host's call pays no layer for
 * the memory being a parameter) */
static inline __attribute__((always_inline)) brg_status engine(brg_comm *c, brg__ring *r,
                                                               brg__coll *k,
                                                               const brg__mem_ops *mem,
                                                               struct brg__dev_ring *dev) {
  k->seq = ++c->seq;
  r->cur = k;
  r->cur_step = 0;
  brg__ring_op o = {.c = c, .r = r, .coll = k, .esize = brg_dtype_size(k->dtype)};
  o.slice_elems = brg__slice_elems(c, k);
  o.mem = mem;
  o.dev = dev;
  int host = mem == &brg__mem_host;
  o.direct = brg__ring_send_direct(&o);
  /* Windows only where sends go from anywhere: an all-gather step whose
   * slice landed in the output forwards it from there. */
  o.windows = o.direct && brg__ring_recv_windows(&o);
  size_t total = k->count * o.esize;
  if ((k->kind == BRG__COLL_ALL_GATHER || k->kind == BRG__COLL_REDUCE_SCATTER) && !k->whole)
    total *= (size_t)c->nranks;
  /* In place the output lines are already cached by the read of the input,
   * so only out-of-place outputs gain from streaming. */
  o.nt = host && c->nt_bytes > 0 && total >= c->nt_bytes && k->sendbuf != k->recvbuf;
  brg_status s = BRG_SUCCESS;
  int n = c->nranks;
  if (n == 1) {
    run_single(k, o.esize);
  } else {
    switch (k->kind) {
    case BRG__COLL_ALLREDUCE:
      if (host && k->count > 0 && k->count * o.esize <= c->small_bytes) {
        s = run_small_allreduce(&o);
        break;
      }
      /* fall through */
    case BRG__COLL_BARRIER:
    case BRG__COLL_REDUCE_SCATTER:
    case BRG__COLL_ALL_GATHER:
    case BRG__COLL_BROADCAST:
    case BRG__COLL_REDUCE: s = brg__ring_walk(&o); break;
    case BRG__COLL_ALL_TO_ALL:
      if ((s = a2a_announce(&o)) == BRG_SUCCESS) s = brg__p2p_all_to_all(c, k);
      break;
    case BRG__COLL_GATHER:
    case BRG__COLL_SCATTER:
      if ((s = a2a_announce(&o)) == BRG_SUCCESS) s = brg__rooted_run(c, k);
      break;
    }
  }
  /* An offer left behind by a failed call must not write into the
   * caller's buffers after it returns. */
  if (s != BRG_SUCCESS && o.windows) r->recv.ops->recv_window(&r->recv, 0, NULL, 0);
  r->cur = NULL;
  return s;
}

brg_status brg__ring_engine(brg_comm *c, brg__ring *r, brg__coll *k, const brg__mem_ops *mem,
                            struct brg__dev_ring *dev) {
  return engine(c, r, k, mem, dev);
}

static brg_status host_body(brg_comm *c, brg__coll *k) {
  return engine(c, &c->ring, k, &brg__mem_host, NULL);
}

brg_status brg__coll_execute(brg_comm *c, brg__coll *k) {
  return brg__trace_run(c, k, host_body);
}

static brg_status host_divide(brg_comm *c, const brg__coll *k, void *buf, size_t count,
                              int divisor) {
  (void)c;
  brg__divide(buf, buf, count, k->dtype, divisor);
  return BRG_SUCCESS;
}

const brg__exec_ops brg__exec_host = {
    .name = "host", .run = brg__coll_execute, .divide = host_divide};
