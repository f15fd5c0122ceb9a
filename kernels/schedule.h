/*
 * The ring schedule: which chunk a rank touches at which step, and where the
 * slices of a chunk begin. Pure arithmetic in static inline functions, so the
 * host engine and the device kernel follow one plan and the plan can be
 * tested on its own.
 *
 * Positions p = 0..N-1 are places on the ring (p sends to p+1 mod N and
 * receives from p-1 mod N); the communicator maps positions to ranks. The
 * buffer is cut into N chunks; chunk c is balanced (sizes differ by at most
 * one element) and is owned by the rank at position c when reduce-scatter
 * ends.
 *
 *            chunk p-1          chunk p-2               chunk p
 *   step 0:  send      ->  1:  recv-reduce-send -> ... N-1: recv-reduce-copy-send
 *   step N..2N-3: recv-copy-send            step 2N-2: recv
 *
 *   allreduce step t (0 <= t <= 2N-2) at position p works on chunk (p-1-t) mod N:
 *
 *     t = 0            send                     input              -> next
 *     0 < t < N-1      recv-reduce-send         prev (+) input     -> next
 *     t = N-1          recv-reduce-copy-send    prev (+) input     -> output, next
 *     N-1 < t < 2N-2   recv-copy-send           prev               -> output, next
 *     t = 2N-2         recv                     prev               -> output
 *
 * Reduce-scatter is steps 0..N-1 (the last step writes output without
 * sending), all-gather is steps N-1..2N-2 with the own chunk sent first.
 */
#ifndef BRG_SCHEDULE_H
#define BRG_SCHEDULE_H

#include <stddef.h>
#include <stdint.h>

#include "hd.h"

/* A function every step of a walk calls: inlined into the executor's loop
 * (nvcc inlines device code by itself). */
#if defined(__CUDACC__)
#define BRG_HD_STEP __host__ __device__
#elif defined(__GNUC__)
#define BRG_HD_STEP __attribute__((always_inline))
#else
#define BRG_HD_STEP
#endif

/* The collectives, numbered once for the runtime (brg__coll), the plan
 * below and kernel mode's launch arguments (ring_args.h, which carries the
 * number). The ring runs allreduce, reduce-scatter, all-gather and barrier
 * (an allreduce of nothing); the chain broadcast and reduce; the others go
 * point to point (runtime/exec/p2p/p2p.c, rooted.c). */
typedef enum {
  BRG__COLL_ALLREDUCE = 1,
  BRG__COLL_REDUCE_SCATTER,
  BRG__COLL_ALL_GATHER,
  BRG__COLL_BROADCAST,
  BRG__COLL_REDUCE,
  BRG__COLL_BARRIER,
  BRG__COLL_ALL_TO_ALL,
  BRG__COLL_GATHER,
  BRG__COLL_SCATTER,
} brg__coll_kind;

typedef enum {
  BRG__PRIM_SEND = 0,              /* own input -> next */
  BRG__PRIM_RECV_REDUCE_SEND,      /* incoming (+) own input -> next */
  BRG__PRIM_RECV_REDUCE_COPY_SEND, /* incoming (+) own input -> output and next */
  BRG__PRIM_RECV_COPY_SEND,        /* incoming -> output and next */
  BRG__PRIM_RECV,                  /* incoming -> output */
  BRG__PRIM_RECV_REDUCE_COPY,      /* incoming (+) own input -> output (end of a chain) */
  BRG__PRIM_COPY,                  /* own input -> output, no traffic */
} brg__prim;

/* Whether a primitive takes a slice from the previous rank / gives one to the next. */
static inline BRG_HD int brg__prim_recvs(brg__prim p) {
  return p != BRG__PRIM_SEND && p != BRG__PRIM_COPY;
}
static inline BRG_HD int brg__prim_sends(brg__prim p) {
  return p == BRG__PRIM_SEND || p == BRG__PRIM_RECV_REDUCE_SEND ||
         p == BRG__PRIM_RECV_REDUCE_COPY_SEND || p == BRG__PRIM_RECV_COPY_SEND;
}

/* The primitive's name, for logs and traces. */
static inline const char *brg__prim_name(brg__prim p) {
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

/*
 * What a primitive computes on a slice, as one copy or one reduce:
 *
 *   copy:    dst0 = a            (and dst1 = a where dst1 is set)
 *   reduce:  dst0 = a (op) b     (and dst1 = dst0 where dst1 is set)
 *
 * `last` marks the reduce that ends a chain: it takes the collective's op
 * (BRG_AVG divides by N there); the others combine with that op's
 * combining part (sum for BRG_AVG) and divide by nothing. The host engine,
 * step mode's kernels and kernel mode's ring kernel map each primitive to
 * its buffers through this one table.
 */
enum { BRG__BUF_NONE = 0, BRG__BUF_IN, BRG__BUF_RECV, BRG__BUF_OUT, BRG__BUF_SLOT };
typedef struct brg__prim_math {
  unsigned char reduce, last;
  unsigned char a, b;       /* sources (BRG__BUF_*) */
  unsigned char dst0, dst1; /* destinations */
} brg__prim_math;

static inline BRG_HD brg__prim_math brg__pm(int reduce, int last, int a, int b, int dst0,
                                            int dst1) {
  brg__prim_math w;
  w.reduce = (unsigned char)reduce;
  w.last = (unsigned char)last;
  w.a = (unsigned char)a;
  w.b = (unsigned char)b;
  w.dst0 = (unsigned char)dst0;
  w.dst1 = (unsigned char)dst1;
  return w;
}

static inline BRG_HD brg__prim_math brg__prim_math_of(brg__prim p) {
  switch (p) {
  case BRG__PRIM_SEND: return brg__pm(0, 0, BRG__BUF_IN, 0, BRG__BUF_SLOT, BRG__BUF_OUT);
  case BRG__PRIM_RECV_REDUCE_SEND:
    return brg__pm(1, 0, BRG__BUF_RECV, BRG__BUF_IN, BRG__BUF_SLOT, 0);
  case BRG__PRIM_RECV_REDUCE_COPY_SEND:
    return brg__pm(1, 1, BRG__BUF_RECV, BRG__BUF_IN, BRG__BUF_OUT, BRG__BUF_SLOT);
  case BRG__PRIM_RECV_REDUCE_COPY:
    return brg__pm(1, 1, BRG__BUF_RECV, BRG__BUF_IN, BRG__BUF_OUT, 0);
  case BRG__PRIM_RECV_COPY_SEND:
    return brg__pm(0, 0, BRG__BUF_RECV, 0, BRG__BUF_OUT, BRG__BUF_SLOT);
  case BRG__PRIM_RECV: return brg__pm(0, 0, BRG__BUF_RECV, 0, BRG__BUF_OUT, 0);
  case BRG__PRIM_COPY: return brg__pm(0, 0, BRG__BUF_IN, 0, BRG__BUF_OUT, 0);
  }
  return brg__pm(0, 0, 0, 0, 0, 0);
}

/* The buffer a brg__prim_math names: own input, the received slot, own
 * output, the slot for the next rank; NULL for BRG__BUF_NONE. Sources come
 * back without const, for the destination's type. */
static inline BRG_HD void *brg__prim_buf(int which, const void *in, const void *recv, void *out,
                                         void *slot) {
  switch (which) {
  case BRG__BUF_IN: return (void *)(uintptr_t)in;
  case BRG__BUF_RECV: return (void *)(uintptr_t)recv;
  case BRG__BUF_OUT: return out;
  case BRG__BUF_SLOT: return slot;
  }
  return NULL;
}

static inline BRG_HD int brg__mod(long a, int n) {
  long m = a % n;
  return (int)(m < 0 ? m + n : m);
}

/* Number of allreduce steps for N ranks: N-1 of reduce-scatter plus N-1 of
 * all-gather, counting the fused middle step once per direction. */
static inline BRG_HD int brg__ring_steps(int nranks) {
  return 2 * nranks - 1;
}

/* Chunk (a position index) that position `pos` works on at allreduce step t. */
static inline BRG_HD int brg__ring_chunk(int pos, int nranks, int t) {
  return brg__mod((long)pos - 1 - t, nranks);
}

/* Primitive at allreduce step t (0 <= t <= 2N-2), N >= 2. */
static inline BRG_HD brg__prim brg__ring_prim(int nranks, int t) {
  if (t == 0) return BRG__PRIM_SEND;
  if (t < nranks - 1) return BRG__PRIM_RECV_REDUCE_SEND;
  if (t == nranks - 1) return BRG__PRIM_RECV_REDUCE_COPY_SEND;
  if (t < 2 * nranks - 2) return BRG__PRIM_RECV_COPY_SEND;
  return BRG__PRIM_RECV;
}

/* Balanced split of `count` elements into `parts`: first element and size of part i. */
static inline BRG_HD size_t brg__part_offset(size_t count, int parts, int i) {
  size_t base = count / (size_t)parts, extra = count % (size_t)parts;
  return base * (size_t)i + ((size_t)i < extra ? (size_t)i : extra);
}
static inline BRG_HD size_t brg__part_count(size_t count, int parts, int i) {
  return count / (size_t)parts + ((size_t)i < count % (size_t)parts ? 1 : 0);
}

/* Slices of a chunk of `n` elements with at most `slice_elems` per slice. A
 * chunk with no elements still has one (empty) slice, so zero-byte
 * collectives still synchronise the ring. */
static inline BRG_HD size_t brg__slice_total(size_t n, size_t slice_elems) {
  return n == 0 ? 1 : (n + slice_elems - 1) / slice_elems;
}
static inline BRG_HD size_t brg__slice_offset(size_t s, size_t slice_elems) {
  return s * slice_elems;
}
static inline BRG_HD size_t brg__slice_count(size_t n, size_t slice_elems, size_t s) {
  size_t off = s * slice_elems;
  if (off >= n) return 0;
  return n - off < slice_elems ? n - off : slice_elems;
}

/* Chain collectives (broadcast, reduce) run along the ring from position
 * `first` for N-1 hops. Hop index of a position: 0 for the first, N-1 for
 * the last. */
static inline BRG_HD int brg__chain_hop(int pos, int first, int nranks) {
  return brg__mod((long)pos - first, nranks);
}

/* The primitive at hop `hop` of a chain of N ranks (N >= 2): broadcast
 * copies along, reduce adds its input on the way, the last hop keeps it. */
static inline BRG_HD brg__prim brg__chain_prim(int hop, int nranks, int bcast) {
  if (hop == 0) return BRG__PRIM_SEND;
  if (hop < nranks - 1) return bcast ? BRG__PRIM_RECV_COPY_SEND : BRG__PRIM_RECV_REDUCE_SEND;
  return bcast ? BRG__PRIM_RECV : BRG__PRIM_RECV_REDUCE_COPY;
}

/*
 * The plan (brg__sched): every step one rank runs for one collective of
 * the ring or the chain, in the order it runs them (slices outer, steps inner), with the
 * slice each step works on. The host engine (runtime/exec/host/ring.c, for host and
 * GPU buffers alike) and kernel mode's ring kernel (kernels/cuda/
 * ring_kernel.cuh) are executors of it: they turn each step into buffers
 * and run its primitive. A new collective of the ring is a plan here;
 * every executor then runs it.
 *
 *   ring:  allreduce (and barrier, with nothing) steps 0..2N-2,
 *          reduce-scatter 0..N-1 (the last reduces into the output
 *          without sending), all-gather N-1..2N-2 (the first sends the
 *          rank's own block, copying it into the output)
 *   chain: broadcast from the root, reduce towards it (N-1 hops)
 *
 * A kernel cuts a call over channels: channel ch of nchannels runs the
 * plan of its share (brg__part_* of the count, or of each block with
 * `whole`); the host runs the whole call as one channel. N = 1 has no
 * steps: the executors copy the input.
 *
 *   brg__sched pl = {0};
 *   pl.kind = ...; (the call, as below)
 *   brg__sched_begin(&pl);
 *   for (brg__step st; brg__sched_next(&pl, &st);) run st
 *
 * A copy of a brg__sched walks on independently: the host engine
 * walks a second copy ahead of the first to offer receive windows.
 */
typedef struct brg__sched {
  /* The call (the caller sets these before brg__sched_begin). */
  int kind;               /* brg__coll_kind */
  int nranks, pos;        /* ring size and this rank's position on it */
  const int *ring;        /* position -> rank */
  int root;               /* broadcast and reduce: the root's rank */
  int inplace;            /* the send buffer is the receive buffer */
  int whole;              /* reduce-scatter and all-gather: see brg__coll */
  size_t count;           /* the call's count argument */
  size_t stride;          /* reduce-scatter and all-gather (not whole): 0 is count */
  size_t slice_elems;     /* elements of a slice, at least 1 */
  int nchannels, channel; /* this channel's share of the call (0 channels: 1) */
  /* The walk (brg__sched_begin sets these). */
  int chain, hop;       /* chain: whether it is one, this rank's hop */
  int cprim, cin, cout; /* chain: the primitive and buffers of every slice */
  int rs, ag;           /* ring: reduce-scatter, all-gather */
  int t0, t1, t;        /* ring: the steps run, the next one */
  size_t share, base;   /* this channel's elements and the first of them */
  size_t slices, sl;    /* slices of the longest chunk, the next one */
} brg__sched;

/* One step of a plan. Buffers by role: `in` is BRG__BUF_IN (the send
 * buffer, at element in_off) or BRG__BUF_NONE; `out` is BRG__BUF_OUT (the
 * receive buffer, at out_off) or BRG__BUF_NONE. */
typedef struct brg__step {
  brg__prim prim;
  int in, out;
  size_t in_off, out_off;
  size_t count; /* elements of the slice */
  size_t elem;  /* its first element in the collective's full-size buffer */
  size_t slice; /* its index within its chunk */
  int chunk;    /* ring: the rank whose chunk it is; chain: -1 */
  int step;     /* ring: the step t; chain: the hop */
} brg__step;

/* Where this channel's part of chunk `id` (the chunk of rank id) begins
 * and how long it is. Allreduce cuts the channel's share into N chunks;
 * reduce-scatter and all-gather take the channel's share of rank id's
 * block (blocks of count at the stride, or with `whole` the chunks
 * allreduce would cut the whole buffer into). */
static inline BRG_HD_STEP size_t brg__sched_piece(const brg__sched *pl, int id, size_t *off) {
  int n = pl->nranks;
  if (!pl->rs && !pl->ag) {
    *off = pl->base + brg__part_offset(pl->share, n, id);
    return brg__part_count(pl->share, n, id);
  }
  if (!pl->whole) {
    *off = (pl->stride ? pl->stride : pl->count) * (size_t)id + pl->base;
    return pl->share;
  }
  size_t blk = brg__part_count(pl->count, n, id);
  *off = brg__part_offset(pl->count, n, id) + brg__part_offset(blk, pl->nchannels, pl->channel);
  return brg__part_count(blk, pl->nchannels, pl->channel);
}

/* Sets the walk up from the call. */
static inline BRG_HD void brg__sched_begin(brg__sched *pl) {
  int n = pl->nranks, k = pl->kind;
  if (pl->nchannels < 1) {
    pl->nchannels = 1;
    pl->channel = 0;
  }
  pl->share = brg__part_count(pl->count, pl->nchannels, pl->channel);
  pl->base = brg__part_offset(pl->count, pl->nchannels, pl->channel);
  pl->sl = 0;
  pl->slices = 0;
  pl->chain = k == BRG__COLL_BROADCAST || k == BRG__COLL_REDUCE;
  if (n < 2) return; /* no steps */
  if (pl->chain) {
    /* One primitive on every slice. The broadcast root also fills its own
     * output (out of place); only the last hop of a reduce writes one;
     * only the broadcast root reads its input. */
    int root_pos = 0, bcast = k == BRG__COLL_BROADCAST;
    for (int i = 0; i < n; i++)
      if (pl->ring[i] == pl->root) root_pos = i;
    pl->hop = brg__chain_hop(pl->pos, bcast ? root_pos : (root_pos + 1) % n, n);
    brg__prim prim = brg__chain_prim(pl->hop, n, bcast);
    pl->cprim = (int)prim;
    pl->cin = bcast && pl->hop != 0 ? BRG__BUF_NONE : BRG__BUF_IN;
    pl->cout = BRG__BUF_OUT;
    if (prim == BRG__PRIM_SEND && !(bcast && !pl->inplace)) pl->cout = BRG__BUF_NONE;
    if (!bcast && prim != BRG__PRIM_RECV_REDUCE_COPY) pl->cout = BRG__BUF_NONE;
    pl->slices = brg__slice_total(pl->share, pl->slice_elems);
    return;
  }
  pl->rs = k == BRG__COLL_REDUCE_SCATTER;
  pl->ag = k == BRG__COLL_ALL_GATHER;
  pl->t0 = k == BRG__COLL_ALL_GATHER ? n - 1 : 0;
  pl->t1 = k == BRG__COLL_REDUCE_SCATTER ? n - 1 : 2 * n - 2;
  pl->t = pl->t0;
  for (int i = 0; i < n; i++) {
    size_t off, ns = brg__slice_total(brg__sched_piece(pl, i, &off), pl->slice_elems);
    if (ns > pl->slices) pl->slices = ns;
  }
}

static inline BRG_HD_STEP void brg__sched_set(brg__step *st, brg__prim prim, int in, size_t in_off,
                                              int out, size_t out_off) {
  st->prim = prim;
  st->in = in;
  st->in_off = in_off;
  st->out = out;
  st->out_off = out_off;
}

/* The chain's next slice: this rank's hop's primitive on it. */
static inline BRG_HD_STEP int brg__sched_next_chain(brg__sched *pl, brg__step *st) {
  if (pl->sl >= pl->slices) return 0;
  size_t sl = pl->sl++;
  size_t e = pl->base + brg__slice_offset(sl, pl->slice_elems);
  brg__sched_set(st, (brg__prim)pl->cprim, pl->cin, e, pl->cout, e);
  st->count = brg__slice_count(pl->share, pl->slice_elems, sl);
  st->elem = e;
  st->slice = sl;
  st->chunk = -1;
  st->step = pl->hop;
  return 1;
}

/* The next step of the walk into *st; 0 at the end. */
static inline BRG_HD_STEP int brg__sched_next(brg__sched *pl, brg__step *st) {
  if (pl->chain) return brg__sched_next_chain(pl, st);
  int n = pl->nranks, rs = pl->rs, ag = pl->ag;
  while (pl->sl < pl->slices) {
    size_t sl = pl->sl, off;
    int t = pl->t;
    if (++pl->t > pl->t1) {
      pl->t = pl->t0;
      pl->sl++;
    }
    int id = pl->ring[brg__ring_chunk(pl->pos, n, t)];
    size_t cnt = brg__sched_piece(pl, id, &off);
    if (sl >= brg__slice_total(cnt, pl->slice_elems)) continue;
    size_t e = off + brg__slice_offset(sl, pl->slice_elems);
    /* Where the slice lies in the rs output or ag input: a buffer of one
     * block, or the whole buffer. */
    size_t own = pl->whole ? e : pl->base + brg__slice_offset(sl, pl->slice_elems);
    brg__prim prim = brg__ring_prim(n, t);
    if (rs && t == pl->t1)
      brg__sched_set(st, BRG__PRIM_RECV_REDUCE_COPY, BRG__BUF_IN, e, BRG__BUF_OUT, own);
    else if (rs)
      brg__sched_set(st, prim, BRG__BUF_IN, e, BRG__BUF_NONE, 0);
    else if (ag && t == pl->t0) /* own block: input -> output and next */
      brg__sched_set(st, BRG__PRIM_SEND, BRG__BUF_IN, own, BRG__BUF_OUT, e);
    else if (ag)
      brg__sched_set(st, prim, BRG__BUF_NONE, 0, BRG__BUF_OUT, e);
    else
      brg__sched_set(st, prim, BRG__BUF_IN, e,
                     prim == BRG__PRIM_SEND ? BRG__BUF_NONE : BRG__BUF_OUT, e);
    st->count = brg__slice_count(cnt, pl->slice_elems, sl);
    st->elem = e;
    st->slice = sl;
    st->chunk = id;
    st->step = t;
    return 1;
  }
  return 0;
}

#endif
