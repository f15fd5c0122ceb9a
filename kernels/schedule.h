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

#if defined(__CUDACC__)
#define BRG_HD __host__ __device__
#else
#define BRG_HD
#endif

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

#endif
