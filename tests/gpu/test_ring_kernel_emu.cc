/*
 * The kernel-mode ring kernel (kernels/cuda/ring_kernel.cuh), its real
 * source, run on the CPU by the SIMT emulator (simt_emu.h): N ranks, each
 * one launch per collective of C channel blocks, talking only through the
 * FIFOs' slots and flags in shared memory, as GPUs do through CUDA IPC.
 *
 *   test_ring_kernel_emu threads|procs N CHANNELS BLOCK_THREADS [quick|oneshot|ll|align|misalign|direct|ringll]
 *   test_ring_kernel_emu abort N CHANNELS BLOCK_THREADS [oneshot|ll|ringll]
 *   test_ring_kernel_emu stale 2 1 BLOCK_THREADS
 *   test_ring_kernel_emu cost N CHANNELS BLOCK_THREADS
 *
 * threads: the ranks are threads of this process; procs: forked
 * processes, the FIFOs in a MAP_SHARED mapping made before the fork.
 * With threads, the kernels must also have used at most one system fence
 * per flag they raised (the emulator counts both). Each
 * rank runs the whole list of cases on its own, back to back, as a stream
 * would: only the flags keep the ranks in step. Every collective x dtype x
 * op x count (0, 1, 7, 4099, and a multi-slice one), in place and out of
 * place, on a ring whose order is not the rank order, and every
 * allreduce up to 4099 elements again by the one-shot path; every element of
 * every rank's output is checked against a fold of the inputs computed
 * here, and the bytes around the outputs must be untouched. The inputs are
 * small integers, so that any order of reduction gives the same bits.
 * `oneshot` runs only the one-shot allreduces, back to back, so that a
 * rank that runs ahead writes the other buffer of a slower one's area;
 * every other one takes the LL form (data and flag in one store), so that
 * the two forms share the areas' call counter. `ll` runs them all in the
 * LL form, counts 0 and up, and (threads) the launches must then have
 * used no system fence at all, and stored LL lines.
 * Every launch sends its call to the next rank's mailbox (brg__rk_hdr) and
 * keeps a watch record with its busy word, as the runtime's do.
 * `align` (threads) runs counts whose chunks start off 16 bytes, every
 * buffer aligned: no element may then be copied or reduced one at a time
 * (the emulator counts them), the slots shifting their payloads to match.
 * `misalign` (threads) runs every collective and dtype, counts 0, 1,
 * primes, in place and out of place, by the ring and the one-shot path,
 * with input and output at offsets from 16 bytes (whole elements, 1 to 15
 * bytes) that differ between them and from rank to rank: every element is
 * checked, and the copies and reduces must stay on the vector path (read
 * shifted) but for a few elements at each call's ends: the elements taken
 * one at a time beyond the head and tail that align a destination must
 * stay under one in 16 of the outputs'.
 *
 * `ringll` runs the ring in its LL form (args.ring_ll): every
 * collective, dtype and op, counts 0, 1, 7, 509, 4099, in place and out of
 * place, every fourth case by the plain ring between them, every element
 * checked.
 *
 * `direct` runs only the direct paths of allreduce on CHANNELS blocks
 * (ring_args.h): the one-shot and two-shot forms by turns, every dtype and
 * op, odd counts, in place and out of place, every element checked.
 *
 * abort: rank N-1 never launches; the others' allreduce (the one-shot one
 * with `oneshot`, its LL form with `ll`, the ring's LL form with `ringll`) waits for it until another thread sets the abort word;
 * every launch must then return with ABORTED in its status word, soon,
 * having read the abort word far less often than it spun.
 *
 * stale: the kernel's own checks of what it finds, with the slots' marks
 * (brg__rk_meta) and watch records as the runtime gives them. Two ranks
 * run an allreduce, then the FIFO is put out of step between launches:
 * rank 1's tail raised by one, as if rank 0 had posted a slot it never
 * wrote. Rank 1's next launch must stop with STALE in its status and its
 * watch record, naming the post it expected and the older one the slot
 * holds, rather than reduce that slot's old data. The same for the
 * one-shot path: rank 0's flag in rank 1's area two calls ahead of
 * rank 1's call (areas out of step) must stop rank 1's launch with STALE,
 * naming both call numbers.
 *
 * cost: what the kernels cost, by the emulator's counts (simt.cuh), for
 * the ring, one-shot and LL paths of allreduce in turn, every rank at
 * once: host memory (the abort and status words, the watch records) read
 * at most once per POLL_SPINS spins beyond a launch's start, written at
 * most once per 32 slots beyond a few times a launch; one system fence
 * per step (2N - 1 per 2N - 2 slots posted), N per one-shot launch,
 * none in the LL form; nothing off the vector path.
 *
 * Built a second time with -DBRG_RK_BREAK=1 (the tail, or the one-shot
 * flags, posted before the data is written) and =2 (no barrier after the
 * wait for them), the same test must fail (meson: should_fail), with all
 * cases and with the one-shot ones alone; with =3 (the LL lines of every
 * call carry the same flag), `ll` must fail.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <type_traits>
#include <thread>
#include <vector>

#include "ring_kernel.cuh"
#include "simt_emu.h"

using namespace brg_rk;

static const int NSLOTS = 4;
static const size_t SLOT_BYTES = 4096; /* small: many slices, FIFO wrap-around */
static const size_t GUARD = 64;
static const size_t OS_SLOT = 36864; /* one-shot: room for 4099 elements of 8 bytes */
static const size_t LL_SLOT = brg__rk_ll_slot(OS_SLOT);

static int g_n, g_channels, g_threads, g_quick, g_only_oneshot, g_align, g_ll, g_misalign;
static int g_direct; /* the direct paths on CHANNELS blocks only */
static int g_ringll; /* the ring's LL form (every fourth case the plain ring) */
/* The ring's LL slots: small, so that a slice is 480 bytes and calls wrap
 * the slots many times. */
static const size_t RING_LL = 1024;
/* Direct paths: room for one rank's input (4099 elements of 8 bytes), the
 * two-shot's block and its result in a half each. */
static const size_t D_SLOT = 36864;
static size_t area_bytes(int n) {
  return brg__rk_os_bytes(n, OS_SLOT, LL_SLOT) + brg__rk_direct_bytes(n, D_SLOT);
}
/* misalign: output elements of every rank's cases, the measure of the scalar bound */
static std::atomic<uint64_t> g_out_elems{0};

/* ------------------------------------------------------------ the FIFOs */

/* Everything one (rank, channel) owns, in one shared mapping. */
struct chan_mem {
  alignas(64) uint64_t tail;
  alignas(64) uint64_t head;
  alignas(64) uint64_t counters[8];
  alignas(64) uint64_t hdr_acked;
  alignas(64) brg__rk_hdr hdrs[BRG__RK_HDRS];
  alignas(64) char slots[NSLOTS * SLOT_BYTES];
  alignas(64) char ll[NSLOTS * RING_LL]; /* the ring's LL slots */
  brg__rk_meta meta[NSLOTS];             /* stale: the marks the previous rank writes */
};
static chan_mem *g_mem;        /* [rank * MAX_CHANNELS + ch] */
static brg__rk_watch *g_watch; /* [rank * MAX_CHANNELS + ch] */
static int *g_abort;           /* one word, shared */
static int *g_ring;            /* position -> rank */
static char *g_os;             /* the one-shot areas, one per rank */

static char *os_area(int rank) {
  return g_os + (size_t)rank * area_bytes(g_n);
}

static chan_mem &cm(int rank, int ch) {
  return g_mem[rank * MAX_CHANNELS + ch];
}

static int pos_of(int rank) {
  for (int p = 0; p < g_n; p++)
    if (g_ring[p] == rank) return p;
  return -1;
}

static args make_args(int rank, int kind, int dtype, int op, int root, const void *s, void *r,
                      size_t count, int *status) {
  args a;
  memset(&a, 0, sizeof a);
  a.kind = kind;
  a.dtype = dtype;
  a.op = op;
  a.nranks = g_n;
  a.pos = pos_of(rank);
  a.root = root;
  a.ring = g_ring;
  a.sendbuf = s;
  a.recvbuf = r;
  a.count = count;
  a.nslots = NSLOTS;
  a.slot_bytes = SLOT_BYTES;
  a.nchannels = g_channels;
  a.abort_word = g_abort;
  a.status = status;
  a.watch = g_watch + (size_t)rank * MAX_CHANNELS;
  a.call.seq = 1; /* the same on every rank; count, kind, dtype, op and root differ by call */
  a.call.count = count;
  a.call.root = root;
  a.call.kind = (uint8_t)kind;
  a.call.dtype = (uint8_t)dtype;
  a.call.op = (uint8_t)op;
  int next = g_ring[(a.pos + 1) % g_n], prev = g_ring[(a.pos + g_n - 1) % g_n];
  for (int ch = 0; ch < g_channels; ch++) {
    brg_rk::link &l = a.chan[ch];
    l.send_slots = cm(next, ch).slots;
    l.send_tail = &cm(next, ch).tail;
    l.send_head = &cm(rank, ch).head;
    l.recv_slots = cm(rank, ch).slots;
    l.recv_tail = &cm(rank, ch).tail;
    l.recv_head = &cm(prev, ch).head;
    l.counters = cm(rank, ch).counters;
    l.send_hdr = cm(next, ch).hdrs;
    l.recv_hdr = cm(rank, ch).hdrs;
    l.hdr_acked = &cm(rank, ch).hdr_acked;
    l.hdr_ack = &cm(prev, ch).hdr_acked;
    l.send_ll = cm(next, ch).ll;
    l.recv_ll = cm(rank, ch).ll;
  }
  return a;
}

/* ------------------------------------------------------------ reference */

static size_t esize(int dt) {
  static const size_t es[] = {1, 1, 4, 4, 8, 8, 2, 2, 4, 8};
  return es[dt];
}

/* Input element i of rank r in case c: a small integer. */
static int value(int c, int r, size_t i, int op) {
  if (op >= BRG_BAND) /* every bit of a byte, and the sign bit */
    return (int)(((uint32_t)r * 2654435761u + (uint32_t)i * 40503u + (uint32_t)c * 977u) >> 1);
  int v = (int)((r * 5 + i * 3 + (size_t)c * 7) % 4);
  return op == BRG_PROD ? 1 + v % 3 : v;
}

template <class D> static typename D::T encode(int v) {
  typedef typename D::T T;
  if constexpr (std::is_same<D, brg_ew::tag_f16>::value)
    return brg__f32_to_f16((float)v);
  else if constexpr (std::is_same<D, brg_ew::tag_bf16>::value)
    return brg__f32_to_bf16((float)v);
  else
    return (T)v;
}

/* out[j] = the fold over ranks, in rank order, of element (off + j). */
template <class D> static void fold(int c, int op, size_t off, size_t m, void *out) {
  typedef typename D::T T;
  T *o = static_cast<T *>(out);
  for (size_t j = 0; j < m; j++) {
    T acc = encode<D>(value(c, 0, off + j, op));
    for (int r = 1; r < g_n; r++) {
      T x = encode<D>(value(c, r, off + j, op));
      switch (op) {
      case BRG_SUM:
      case BRG_AVG: acc = D::template op<BRG_SUM>(acc, x, 1); break;
      case BRG_PROD: acc = D::template op<BRG_PROD>(acc, x, 1); break;
      case BRG_MIN: acc = D::template op<BRG_MIN>(acc, x, 1); break;
      case BRG_MAX: acc = D::template op<BRG_MAX>(acc, x, 1); break;
      default:
        if constexpr (D::integer) /* the bitwise ops, by C's own operators */
          acc = op == BRG_BAND ? (T)(acc & x) : op == BRG_BOR ? (T)(acc | x) : (T)(acc ^ x);
        break;
      }
    }
    o[j] = op == BRG_AVG ? D::div(acc, g_n) : acc;
  }
}

template <class D> static void fill(int c, int r, int op, size_t n, void *buf) {
  typedef typename D::T T;
  for (size_t i = 0; i < n; i++) static_cast<T *>(buf)[i] = encode<D>(value(c, r, i, op));
}

#define DISPATCH(dt, F, ...)                                                                       \
  switch (dt) {                                                                                    \
  case BRG_INT8: F<brg_ew::tag_i8>(__VA_ARGS__); break;                                            \
  case BRG_UINT8: F<brg_ew::tag_u8>(__VA_ARGS__); break;                                           \
  case BRG_INT32: F<brg_ew::tag_i32>(__VA_ARGS__); break;                                          \
  case BRG_UINT32: F<brg_ew::tag_u32>(__VA_ARGS__); break;                                         \
  case BRG_INT64: F<brg_ew::tag_i64>(__VA_ARGS__); break;                                          \
  case BRG_UINT64: F<brg_ew::tag_u64>(__VA_ARGS__); break;                                         \
  case BRG_FLOAT16: F<brg_ew::tag_f16>(__VA_ARGS__); break;                                        \
  case BRG_BFLOAT16: F<brg_ew::tag_bf16>(__VA_ARGS__); break;                                      \
  case BRG_FLOAT32: F<brg_ew::tag_f32>(__VA_ARGS__); break;                                        \
  case BRG_FLOAT64: F<brg_ew::tag_f64>(__VA_ARGS__); break;                                        \
  }

/* ------------------------------------------------------------ the cases */

struct tcase {
  int kind, dtype, op;
  size_t count;
  int inplace, root;
  int oneshot; /* an allreduce by the one-shot path: 1, or 2 in its LL form; by the direct
                * paths on many blocks: 3 the one-shot form, 4 the two-shot form */
  int ring_ll; /* the ring in its LL form */
};

static std::vector<tcase> make_cases() {
  std::vector<tcase> v;
  if (g_align) {
    /* Counts whose chunks start at elements that are not a multiple of 16
     * bytes (1,000,000 float32 on 8 ranks x 8 channels: 3 chunks in 4),
     * every buffer 16-byte aligned: nothing need take the scalar path. */
    const int kinds[] = {BRG__COLL_ALLREDUCE, BRG__COLL_BROADCAST, BRG__COLL_REDUCE};
    const int dts[] = {BRG_FLOAT32, BRG_BFLOAT16, BRG_INT8, BRG_FLOAT64};
    const size_t counts[] = {1000000, 100003, 100001, 50005};
    for (int k : kinds)
      for (int d = 0; d < 4; d++) {
        if (k != BRG__COLL_ALLREDUCE && d > 0) continue;
        for (int inplace = 0; inplace < 2; inplace++)
          v.push_back({k, dts[d], BRG_SUM, counts[d], inplace, (d + 1) % g_n, 0, 0});
      }
    return v;
  }
  if (g_misalign) {
    /* Every collective and dtype, sum (and avg and max for allreduce: the
     * word-at-a-time bodies), counts 0, 1, primes, in place and out of
     * place, and the allreduces up to 4099 again by the one-shot path
     * (flags: its copies and reduces are the vector path's). */
    for (int kind = BRG__COLL_ALLREDUCE; kind <= BRG__COLL_REDUCE; kind++)
      for (int dt = 0; dt < BRG_NUM_DTYPES; dt++)
        for (int op : {(int)BRG_SUM, (int)BRG_AVG, (int)BRG_MAX}) {
          if (op != BRG_SUM && kind != BRG__COLL_ALLREDUCE) continue;
          for (size_t n : {(size_t)0, (size_t)1, (size_t)7, (size_t)4099, (size_t)20011})
            for (int inplace = 0; inplace < 2; inplace++) {
              if (op != BRG_SUM && n != 4099) continue;
              int root = (int)((n + (size_t)dt) % (size_t)g_n);
              v.push_back({kind, dt, op, n, inplace, root, 0, 0});
              if (kind == BRG__COLL_ALLREDUCE && n > 0 && n <= 4099)
                v.push_back({kind, dt, op, n, inplace, root, 1, 0});
            }
        }
    return v;
  }
  if (g_direct) {
    /* The direct paths: allreduce, every dtype and op, odd counts (some
     * below blocks x ranks: empty parts), in place and out of place, the
     * one-shot and two-shot forms by turns, sharing the areas' counters. */
    for (int dt = 0; dt < BRG_NUM_DTYPES; dt++)
      for (int op = 0; op < BRG_NUM_OPS; op++) {
        if (op >= BRG_BAND && dt >= BRG_FLOAT16) continue;
        for (size_t n : {(size_t)1, (size_t)7, (size_t)509, (size_t)4099})
          for (int inplace = 0; inplace < 2; inplace++)
            v.push_back({BRG__COLL_ALLREDUCE, dt, op, n, inplace, 0, 3 + (int)(v.size() % 2), 0});
      }
    return v;
  }
  if (g_ringll) {
    /* The ring's LL form: every collective, dtype and op (the bitwise ops
     * of the integers), 0, 1 and odd counts, in place and out of place;
     * every fourth case takes the plain ring, so that both forms share
     * the links' positions. */
    for (int kind = BRG__COLL_ALLREDUCE; kind <= BRG__COLL_REDUCE; kind++)
      for (int dt = 0; dt < BRG_NUM_DTYPES; dt++)
        for (int op = 0; op < BRG_NUM_OPS; op++) {
          bool reduces = kind == BRG__COLL_ALLREDUCE || kind == BRG__COLL_REDUCE_SCATTER ||
                         kind == BRG__COLL_REDUCE;
          if ((!reduces && op != BRG_SUM) || (op >= BRG_BAND && dt >= BRG_FLOAT16)) continue;
          for (size_t n : {(size_t)0, (size_t)1, (size_t)7, (size_t)509, (size_t)4099}) {
            /* the large count for sum, allreduce every op */
            if (n == 4099 && op != BRG_SUM && kind != BRG__COLL_ALLREDUCE) continue;
            for (int inplace = 0; inplace < 2; inplace++) {
              int root = (int)((n + (size_t)dt + (size_t)op) % (size_t)g_n);
              v.push_back({kind, dt, op, n, inplace, root, 0, v.size() % 4 != 3});
            }
          }
        }
    return v;
  }
  const size_t counts[] = {0, 1, 7, 4099, 20011};
  for (int kind = BRG__COLL_ALLREDUCE; kind <= BRG__COLL_REDUCE; kind++)
    for (int dt = 0; dt < BRG_NUM_DTYPES; dt++)
      for (int op = 0; op < BRG_NUM_OPS; op++) {
        bool reduces = kind == BRG__COLL_ALLREDUCE || kind == BRG__COLL_REDUCE_SCATTER ||
                       kind == BRG__COLL_REDUCE;
        if (!reduces && op != BRG_SUM) continue;
        if (g_ll) { /* the LL form: 0, 1, primes, in place and out of place */
          if (kind != BRG__COLL_ALLREDUCE || (op >= BRG_BAND && dt >= BRG_FLOAT16)) continue;
          for (size_t n : {(size_t)0, (size_t)1, (size_t)7, (size_t)509, (size_t)4099})
            for (int inplace = 0; inplace < 2; inplace++)
              v.push_back({kind, dt, op, n, inplace, 0, 2, 0});
          continue;
        }
        if (op >= BRG_BAND) {
          /* The bitwise ops: integers, allreduce, one count each (7 or 513,
           * by turns), by both paths: the data path is the same for every op. */
          if (dt >= BRG_FLOAT16 || kind != BRG__COLL_ALLREDUCE) continue;
          size_t n = (dt + op) % 2 ? 7 : 513;
          int root = (int)((n + (size_t)dt) % (size_t)g_n);
          if (!g_only_oneshot) v.push_back({kind, dt, op, n, 0, root, 0, 0});
          v.push_back({kind, dt, op, n, 0, root, 1, 0});
          continue;
        }
        for (size_t n : counts) {
          /* quick: every op on small counts, the large count for sum */
          if (g_quick && n > 4099 && op != BRG_SUM) continue;
          for (int inplace = 0; inplace < 2; inplace++) {
            int root = (int)((n + (size_t)dt) % (size_t)g_n);
            if (!g_only_oneshot) v.push_back({kind, dt, op, n, inplace, root, 0, 0});
            if (kind == BRG__COLL_ALLREDUCE && n > 0 && n <= 4099)
              v.push_back({kind, dt, op, n, inplace, root, 1, 0});
          }
        }
      }
  return v;
}

/* Buffer sizes (elements) of a case: input, output. */
static void sizes(const tcase &t, size_t *in, size_t *out) {
  size_t n = (size_t)g_n;
  *in = t.kind == BRG__COLL_REDUCE_SCATTER ? t.count * n : t.count;
  *out = t.kind == BRG__COLL_ALL_GATHER ? t.count * n : t.count;
}

static int g_fail_budget = 10;

static int check_case(int ci, const tcase &t, int rank, const unsigned char *out,
                      size_t out_elems) {
  size_t es = esize(t.dtype);
  std::vector<unsigned char> want(out_elems * es + 1);
  bool has_out = !(t.kind == BRG__COLL_REDUCE && rank != t.root);
  if (!has_out) return 0;
  switch (t.kind) {
  case BRG__COLL_ALLREDUCE:
  case BRG__COLL_REDUCE: DISPATCH(t.dtype, fold, ci, t.op, 0, t.count, want.data()) break;
  case BRG__COLL_REDUCE_SCATTER:
    DISPATCH(t.dtype, fold, ci, t.op, (size_t)rank * t.count, t.count, want.data()) break;
  case BRG__COLL_ALL_GATHER:
    for (int q = 0; q < g_n; q++)
      DISPATCH(t.dtype, fill, ci, q, BRG_SUM, t.count, want.data() + (size_t)q * t.count * es)
    break;
  case BRG__COLL_BROADCAST:
    DISPATCH(t.dtype, fill, ci, t.root, BRG_SUM, t.count, want.data()) break;
  }
  for (size_t i = 0; i < out_elems; i++)
    if (memcmp(out + i * es, want.data() + i * es, es) != 0) {
      if (g_fail_budget-- > 0) {
        uint64_t g = 0, w = 0;
        memcpy(&g, out + i * es, es);
        memcpy(&w, want.data() + i * es, es);
        fprintf(
            stderr,
            "FAIL rank %d case %d: %s kind %d%s %s count %zu %s root %d: element %zu is 0x%llx, "
            "expected 0x%llx\n",
            rank, ci, brg_dtype_name((brg_dtype)t.dtype), t.kind, t.oneshot ? " one-shot" : "",
            brg_op_name((brg_op)t.op), t.count, t.inplace ? "in place" : "out of place", t.root, i,
            (unsigned long long)g, (unsigned long long)w);
      }
      return 1;
    }
  for (size_t i = 0; i < GUARD; i++)
    if (out[out_elems * es + i] != 0xee) {
      if (g_fail_budget-- > 0)
        fprintf(stderr, "FAIL rank %d case %d: byte %zu after the output was written\n", rank, ci,
                i);
      return 1;
    }
  return 0;
}

/* Every case, back to back, as rank `rank`. Returns the number of failures. */
static int run_rank(int rank) {
  std::vector<tcase> cases = make_cases();
  int fails = 0;
  int status = 0;
  for (size_t ci = 0; ci < cases.size(); ci++) {
    const tcase &t = cases[ci];
    size_t es = esize(t.dtype), in_e, out_e;
    sizes(t, &in_e, &out_e);
    size_t cap = (in_e > out_e ? in_e : out_e) * es + GUARD;
    std::vector<unsigned char> in(cap + 16), outb(cap + 16);
    /* odd offsets from 16 bytes on some cases: the kernels' scalar paths;
     * misalign: input and output at offsets (whole elements) that differ
     * between them, between the ranks and from case to case */
    size_t shift = (ci % 3 == 2 && !g_align) ? es : 0, oshift = shift;
    if (g_misalign) {
      shift = (size_t)(rank * 5 + (int)ci * 3 + 1) % 16 / es * es;
      oshift = (size_t)(rank * 7 + (int)ci + 9) % 16 / es * es;
      g_out_elems += out_e;
    }
    unsigned char *ip = in.data() + shift, *op = outb.data() + oshift;
    DISPATCH(t.dtype, fill, (int)ci, rank, t.op, in_e, ip)
    memset(op, 0xee, out_e * es + GUARD);
    const void *s = ip;
    void *r = op;
    if (t.inplace) {
      /* in place: the output is the input (reduce-scatter and all-gather:
       * this rank's block of the full buffer, as NCCL takes them) */
      memset(op, 0xee, cap);
      if (t.kind == BRG__COLL_ALL_GATHER) {
        memcpy(op + (size_t)rank * t.count * es, ip, t.count * es);
        s = op + (size_t)rank * t.count * es;
      } else if (t.kind == BRG__COLL_REDUCE_SCATTER) {
        memcpy(op, ip, in_e * es);
        memset(op + in_e * es, 0xee, GUARD);
        s = op;
        r = op + (size_t)rank * t.count * es;
      } else {
        memcpy(op, ip, in_e * es);
        s = op;
      }
    }
    if (t.kind == BRG__COLL_REDUCE && rank != t.root && !t.inplace) r = nullptr;
    args a = make_args(rank, t.kind, t.dtype, t.op, t.root, s, r, t.count, &status);
    unsigned blocks = (unsigned)g_channels;
    if (t.ring_ll) a.ring_ll = RING_LL;
    if (t.oneshot) {
      a.oneshot = 1;
      a.os.rank = rank;
      a.os.slot_bytes = OS_SLOT;
      a.os.ll_slot = LL_SLOT;
      /* `oneshot`: every other case in the LL form */
      a.os.ll = t.oneshot == 2 || (g_only_oneshot && !g_ll && ci % 2);
      for (int q = 0; q < g_n; q++) a.os.area[q] = os_area(q);
      blocks = 1;
      if (t.oneshot >= 3) {
        a.os.direct = t.oneshot == 3 ? BRG__RK_ONESHOT_MANY : BRG__RK_TWOSHOT;
        a.os.direct_off = brg__rk_os_bytes(g_n, OS_SLOT, LL_SLOT);
        a.os.dslot = D_SLOT;
        a.os.ll = 0;
        blocks = (unsigned)g_channels;
      }
    }
    if (brg_simt_emu::launch(blocks, (unsigned)g_threads, [&] { run(a); }) != 0) {
      fprintf(stderr, "FAIL rank %d: the emulator could not launch\n", rank);
      return fails + 1;
    }
    if (status != OK) {
      const brg__rk_watch &w = a.watch[0];
      fprintf(stderr,
              "FAIL rank %d case %zu: status %d (channel 0: code %d, step %d; its call: kind %d "
              "count %llu, the other's: kind %d count %llu)\n",
              rank, ci, status, w.code, w.step, w.mine.kind, (unsigned long long)w.mine.count,
              w.theirs.kind, (unsigned long long)w.theirs.count);
#if BRG_RK_BREAK
      _exit(1); /* the others may wait for this rank's next call */
#endif
      return fails + 1;
    }
    const unsigned char *got = static_cast<const unsigned char *>(r ? r : op);
    if (t.inplace && t.kind == BRG__COLL_REDUCE_SCATTER) {
      /* the guard after this rank's block is the next rank's input: skip it */
      std::vector<unsigned char> copy(out_e * es + GUARD, 0xee);
      memcpy(copy.data(), got, out_e * es);
      fails += check_case((int)ci, t, rank, copy.data(), out_e);
    } else if (r) {
      fails += check_case((int)ci, t, rank, got, out_e);
    }
#if BRG_RK_BREAK
    /* A build broken on purpose has shown what it had to at its first
     * wrong value: the run ends there (every rank with it). */
    if (fails) {
      fprintf(stderr, "rank %d: wrong values with BRG_RK_BREAK=%d, as expected\n", rank,
              BRG_RK_BREAK);
      fflush(stderr);
      _exit(1);
    }
#endif
  }
  return fails;
}

/* ------------------------------------------------------------ drivers */

static void *shared_alloc(size_t bytes) {
  void *p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    perror("mmap");
    exit(1);
  }
  memset(p, 0, bytes);
  return p;
}

static void setup_shared(int n) {
  g_mem = static_cast<chan_mem *>(shared_alloc(sizeof(chan_mem) * (size_t)n * MAX_CHANNELS));
  g_abort = static_cast<int *>(shared_alloc(4096));
  g_ring = static_cast<int *>(shared_alloc(4096));
  g_os = static_cast<char *>(shared_alloc((size_t)n * area_bytes(n)));
  g_watch =
      static_cast<brg__rk_watch *>(shared_alloc(sizeof(brg__rk_watch) * (size_t)n * MAX_CHANNELS));
  /* position p holds rank (p + 1) mod N: the ring is not the rank order */
  for (int p = 0; p < n; p++) g_ring[p] = (p + 1) % n;
}

static int run_threads() {
  std::vector<int> fails(g_n, 0);
  std::vector<std::thread> th;
  for (int r = 0; r < g_n; r++) th.emplace_back([&fails, r] { fails[r] = run_rank(r); });
  for (auto &t : th) t.join();
  int total = 0;
  for (int f : fails) total += f;
  /* One system fence per post at most (a fence is the dearest instruction
   * of a post): a step that receives and sends raises two flags behind
   * one fence, the one-shot path one flag per rank with one release each. */
  uint64_t fences = brg_simt_emu::count(BRG_SIMT_COUNT_FENCES);
  uint64_t flags = brg_simt_emu::count(BRG_SIMT_COUNT_FLAGS);
  printf("%llu system fences for %llu flags raised\n", (unsigned long long)fences,
         (unsigned long long)flags);
  if (fences > flags) {
    fprintf(stderr, "FAIL: %llu system fences for %llu flags (at most one each expected)\n",
            (unsigned long long)fences, (unsigned long long)flags);
    total++;
  }
  /* align: with every buffer aligned, no slot may push a copy or reduce
   * off the 16-byte vector path. */
  uint64_t scalar = brg_simt_emu::count(BRG_SIMT_COUNT_SCALAR);
  if (g_align) printf("%llu elements on the scalar path\n", (unsigned long long)scalar);
  /* ll: the LL form raises no flag and takes no system fence (the mailbox
   * headers and the busy word included), and its lines are what moved. */
  uint64_t lines = brg_simt_emu::count(BRG_SIMT_COUNT_LL_LINES);
  if (g_ll) printf("%llu LL lines stored\n", (unsigned long long)lines);
  /* ringll: LL lines moved the LL cases' slots (the emulator counts them) */
  if (g_ringll) printf("%llu LL lines stored\n", (unsigned long long)lines);
  if (g_ringll && !lines) {
    fprintf(stderr, "FAIL: the ring's LL form stored no LL lines\n");
    total++;
  }
  if (g_ll && (fences || !lines)) {
    fprintf(stderr, "FAIL: the LL form took %llu system fences and stored %llu LL lines\n",
            (unsigned long long)fences, (unsigned long long)lines);
    total++;
  }
  /* misalign: buffers at any offset from 16 bytes are read shifted, so
   * only the vectors next to each call's ends may go one element at a time
   * (the element loop took all of them before): a bound of one in 16 of
   * the outputs' elements, far above the few per call expected. */
  if (g_misalign) {
    uint64_t bound = g_out_elems / 16;
    printf("%llu elements on the scalar path beyond the aligning head and tail (bound %llu)\n",
           (unsigned long long)scalar, (unsigned long long)bound);
    if (scalar > bound) {
      fprintf(stderr,
              "FAIL: %llu elements copied or reduced one at a time beyond the head and tail "
              "that align them, over the bound of %llu: buffers at different offsets from 16 "
              "bytes fell off the vector path\n",
              (unsigned long long)scalar, (unsigned long long)bound);
      total++;
    }
  }
  if (g_align && scalar) {
    fprintf(stderr,
            "FAIL: %llu elements copied or reduced one at a time (a byte at a time for a copy) "
            "where every buffer is aligned\n",
            (unsigned long long)scalar);
    total++;
  }
  return total;
}

static int run_procs() {
  std::vector<pid_t> pids;
  for (int r = 0; r < g_n; r++) {
    pid_t p = fork();
    if (p == 0) _exit(run_rank(r) ? 1 : 0);
    pids.push_back(p);
  }
  int bad = 0;
  for (pid_t p : pids) {
    int st = 0;
    waitpid(p, &st, 0);
    bad += !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
  return bad;
}

static uint64_t now_ns() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ------------------------------------------------------------ stale */

/* Rank `rank`'s allreduce of `count` float32, its call number `seq`, on
 * the one channel with the slots' marks and a watch record; one-shot when
 * `oneshot`. Launched on its own thread; a watcher sets the abort word if
 * it has not returned within `wait_ms` (a launch that reads a stale slot
 * and then waits for ever). The status word after it. */
static int stale_launch(int rank, uint64_t seq, size_t count, int oneshot, float *buf,
                        int wait_ms) {
  int status = 0;
  args a = make_args(rank, BRG__COLL_ALLREDUCE, BRG_FLOAT32, BRG_SUM, -1, buf, buf, count, &status);
  a.call = brg__rk_call{
      seq, count, -1, (uint8_t)BRG__COLL_ALLREDUCE, (uint8_t)BRG_FLOAT32, (uint8_t)BRG_SUM, 0};
  int next = g_ring[(a.pos + 1) % g_n];
  for (int ch = 0; ch < g_channels; ch++) {
    a.chan[ch].send_meta = cm(next, ch).meta;
    a.chan[ch].recv_meta = cm(rank, ch).meta;
  }
  if (oneshot) {
    a.oneshot = 1;
    a.os.rank = rank;
    a.os.slot_bytes = OS_SLOT;
    a.os.ll_slot = LL_SLOT;
    for (int q = 0; q < g_n; q++) a.os.area[q] = os_area(q);
  }
  std::atomic<int> done{0};
  std::thread watcher([&] {
    uint64_t end = now_ns() + (uint64_t)wait_ms * 1000000u;
    while (!done.load() && now_ns() < end) {
      struct timespec ts = {0, 2 * 1000 * 1000};
      nanosleep(&ts, nullptr);
    }
    if (!done.load()) __atomic_store_n(g_abort, 1, __ATOMIC_RELEASE);
  });
  brg_simt_emu::launch(oneshot ? 1u : (unsigned)g_channels, (unsigned)g_threads, [&] { run(a); });
  done = 1;
  watcher.join();
  return status;
}

/* Both ranks' first call, side by side: it must succeed. */
static int stale_first(size_t count, int oneshot, std::vector<std::vector<float>> &buf) {
  std::vector<int> st(g_n, -1);
  std::vector<std::thread> th;
  for (int r = 0; r < g_n; r++)
    th.emplace_back([&, r] { st[r] = stale_launch(r, 1, count, oneshot, buf[r].data(), 60000); });
  for (auto &t : th) t.join();
  int bad = 0;
  for (int r = 0; r < g_n; r++)
    if (st[r] != OK) {
      fprintf(stderr, "FAIL stale: rank %d's first call (in step) ended with status %d\n", r,
              st[r]);
      bad++;
    }
  return bad;
}

/* The launch stopped with STALE, and its watch record names what the
 * runtime's message names (runtime/exec/kernel/device_watch.c): the position or call
 * expected, the one found, and what was compared (peer: the rank whose
 * one-shot flag it was, -1 the previous rank's slot). */
static int stale_expect(const char *what, int status, const brg__rk_watch &w, uint64_t expected,
                        uint64_t found, int peer) {
  printf("stale %s: rank 1's status %d, watch record: code %d, expected %llu, found %llu, peer "
         "%d, call %llu\n",
         what, status, w.code, (unsigned long long)w.expected, (unsigned long long)w.found, w.peer,
         (unsigned long long)w.mine.seq);
  if (status == STALE && w.code == STALE && w.expected == expected && w.found == found &&
      w.peer == peer && w.mine.seq == 2)
    return 0;
  fprintf(stderr,
          "FAIL stale %s: expected status and watch code STALE (%d), expected %llu, found %llu, "
          "peer %d, call 2\n",
          what, STALE, (unsigned long long)expected, (unsigned long long)found, peer);
  return 1;
}

static int run_stale() {
  if (g_n != 2 || g_channels != 1) {
    fprintf(stderr, "stale runs with N=2 and 1 channel\n");
    return 1;
  }
  memset(g_watch, 0, sizeof(brg__rk_watch) * (size_t)g_n * MAX_CHANNELS);
  /* a ring size: more slots from rank 0 than the link has (NSLOTS) */
  size_t count = 4 * (SLOT_BYTES / sizeof(float));
  std::vector<std::vector<float>> buf(g_n, std::vector<float>(count, 1.0f));
  int bad = stale_first(count, 0, buf);
  uint64_t taken = cm(1, 0).counters[1];
  if (taken < (uint64_t)NSLOTS || cm(1, 0).tail != taken) {
    fprintf(stderr, "FAIL stale: rank 1 took %llu slots, tail %llu (at least %d expected)\n",
            (unsigned long long)taken, (unsigned long long)cm(1, 0).tail, NSLOTS);
    return bad + 1;
  }
  /* A tail one ahead of what rank 0 posted: its slot holds post
   * taken + 1 - NSLOTS, an older one. */
  __atomic_store_n(&cm(1, 0).tail, taken + 1, __ATOMIC_RELEASE);
  int st = stale_launch(1, 2, count, 0, buf[1].data(), 20000);
  bad += stale_expect("slot", st, g_watch[1 * MAX_CHANNELS], taken + 1, taken + 1 - NSLOTS, -1);

  /* The one-shot path, on memory as new. */
  memset(g_mem, 0, sizeof(chan_mem) * (size_t)g_n * MAX_CHANNELS);
  memset(g_os, 0, (size_t)g_n * area_bytes(g_n));
  __atomic_store_n(g_abort, 0, __ATOMIC_RELEASE);
  memset(g_watch, 0, sizeof(brg__rk_watch) * (size_t)g_n * MAX_CHANNELS);
  size_t small = 100;
  bad += stale_first(small, 1, buf);
  /* rank 0's flag in rank 1's area: call 4, where rank 1's next is call 2
   * (a rank may be one call ahead, never two) */
  uint64_t *flag0 = reinterpret_cast<uint64_t *>(os_area(1) + BRG__RK_OS_FLAGS + 64 * 0);
  if (*flag0 != 1) {
    fprintf(stderr, "FAIL stale: rank 0's one-shot flag in rank 1's area is %llu, 1 expected\n",
            (unsigned long long)*flag0);
    return bad + 1;
  }
  __atomic_store_n(flag0, 4, __ATOMIC_RELEASE);
  st = stale_launch(1, 2, small, 1, buf[1].data(), 20000);
  bad += stale_expect("one-shot", st, g_watch[1 * MAX_CHANNELS], 2, 4, 0);
  return bad;
}

/* Rank N-1 never comes; the others' allreduce must stop at the abort word. */
static int run_abort() {
  std::vector<int> status(g_n, 0);
  size_t count = g_only_oneshot ? 4099 : 100000;
  std::vector<std::vector<float>> buf(g_n, std::vector<float>(count, 1.0f));
  std::atomic<int> returned{0};
  std::vector<std::thread> th;
  for (int r = 0; r < g_n - 1; r++)
    th.emplace_back([&, r] {
      args a = make_args(r, BRG__COLL_ALLREDUCE, BRG_FLOAT32, BRG_SUM, 0, buf[r].data(),
                         buf[r].data(), buf[r].size(), &status[r]);
      if (g_ringll) a.ring_ll = RING_LL;
      if (g_only_oneshot) {
        a.oneshot = 1;
        a.os.rank = r;
        a.os.slot_bytes = OS_SLOT;
        a.os.ll_slot = LL_SLOT;
        a.os.ll = g_ll;
        for (int q = 0; q < g_n; q++) a.os.area[q] = os_area(q);
      }
      brg_simt_emu::launch(g_only_oneshot ? 1u : (unsigned)g_channels, (unsigned)g_threads,
                           [&] { run(a); });
      returned++;
    });
  struct timespec ts = {0, 300 * 1000 * 1000};
  nanosleep(&ts, nullptr);
  int early = returned.load();
  uint64_t t0 = now_ns();
  __atomic_store_n(g_abort, 1, __ATOMIC_RELEASE);
  for (auto &t : th) t.join();
  double late_ms = (double)(now_ns() - t0) / 1e6;
  int bad = 0;
  if (early) {
    fprintf(stderr, "FAIL abort: %d launches returned before the abort word was set\n", early);
    bad++;
  }
  /* The kernels end soon after the abort word is set (on a GPU within a
   * millisecond or so; here a generous bound, the emulator's spins being
   * slow under load), and read it (host memory, a round trip over PCIe
   * from a GPU) far less often than they spin. */
  uint64_t spins = brg_simt_emu::count(BRG_SIMT_COUNT_SPINS);
  uint64_t reads = brg_simt_emu::count(BRG_SIMT_COUNT_WORD_LOADS);
  uint64_t blocks = (uint64_t)(g_n - 1) * (g_only_oneshot ? 1u : (unsigned)g_channels);
  printf("abort: the kernels returned %.1f ms after the abort word was set; %llu spins, %llu "
         "reads of the abort word\n",
         late_ms, (unsigned long long)spins, (unsigned long long)reads);
  if (late_ms > 10000) {
    fprintf(stderr, "FAIL abort: the kernels returned %.0f ms after the abort word was set\n",
            late_ms);
    bad++;
  }
  if (reads > spins / 512 + 8 * blocks) {
    fprintf(stderr,
            "FAIL abort: %llu reads of the abort word in %llu spins of %llu blocks (at most one "
            "per %u spins and a few per launch expected)\n",
            (unsigned long long)reads, (unsigned long long)spins, (unsigned long long)blocks,
            POLL_SPINS);
    bad++;
  }
  for (int r = 0; r < g_n - 1; r++)
    if (status[r] != ABORTED) {
      fprintf(stderr, "FAIL abort: rank %d's status is %d, expected ABORTED (%d)\n", r, status[r],
              ABORTED);
      bad++;
    }
  return bad;
}

/* ------------------------------------------------------------ cost */

/* cost: host memory mapped for the GPU is what the runtime keeps there:
 * the abort word, the status words (g_abort's page) and the watch
 * records; the FIFOs and one-shot areas are GPU memory. */
static int host_range(const void *p, uintptr_t *lo, uintptr_t *hi) {
  uintptr_t a = reinterpret_cast<uintptr_t>(p);
  uintptr_t ab = reinterpret_cast<uintptr_t>(g_abort), w = reinterpret_cast<uintptr_t>(g_watch);
  size_t wbytes = sizeof(brg__rk_watch) * (size_t)g_n * MAX_CHANNELS;
  if (a >= ab && a < ab + 4096) {
    *lo = ab;
    *hi = ab + 4096;
    return 1;
  }
  if (a >= w && a < w + wbytes) {
    *lo = w;
    *hi = w + wbytes;
    return 1;
  }
  return 0;
}

struct cost {
  uint64_t v[9];
  static cost now() {
    cost c;
    for (int i = 0; i < 9; i++) c.v[i] = brg_simt_emu::count(i);
    return c;
  }
  uint64_t operator[](int i) const { return v[i]; }
  cost operator-(const cost &o) const {
    cost c;
    for (int i = 0; i < 9; i++) c.v[i] = v[i] - o.v[i];
    return c;
  }
};

/* `launches` allreduces of `count` float32 on every rank at once (path 0:
 * the ring, 1: one-shot, 2: its LL form, 3 and 4: the direct paths, 5: the
 * ring's LL form, 6: the ring again); what they cost, and the blocks. */
static int cost_phase(int path, size_t count, int launches, cost *out, uint64_t *blocks) {
  std::vector<int> fails(g_n, 0);
  std::vector<std::thread> th;
  cost before = cost::now();
  for (int r = 0; r < g_n; r++)
    th.emplace_back([&, r] {
      std::vector<float> in(count), outb(count);
      for (size_t i = 0; i < count; i++) in[i] = (float)((i % 100) + r);
      int *status = g_abort + 16 * (r + 1); /* host memory, as the runtime's */
      for (int k = 0; k < launches; k++) {
        args a = make_args(r, BRG__COLL_ALLREDUCE, BRG_FLOAT32, BRG_SUM, 0, in.data(), outb.data(),
                           count, status);
        a.call.seq = (uint64_t)k + 1;
        unsigned nb = (unsigned)g_channels;
        if (path == 5) a.ring_ll = RING_LL;
        if (path && path < 5) {
          a.oneshot = 1;
          a.os.rank = r;
          a.os.slot_bytes = OS_SLOT;
          a.os.ll_slot = LL_SLOT;
          a.os.ll = path == 2;
          for (int q = 0; q < g_n; q++) a.os.area[q] = os_area(q);
          nb = 1;
        }
        if (path == 3 || path == 4) { /* the direct paths, on CHANNELS blocks */
          a.os.direct = path == 3 ? BRG__RK_ONESHOT_MANY : BRG__RK_TWOSHOT;
          a.os.direct_off = brg__rk_os_bytes(g_n, OS_SLOT, LL_SLOT);
          a.os.dslot = D_SLOT;
          nb = (unsigned)g_channels;
        }
        *status = OK;
        if (brg_simt_emu::launch(nb, (unsigned)g_threads, [&] { run(a); }) != 0 || *status != OK) {
          fprintf(stderr, "FAIL cost: rank %d launch %d: status %d\n", r, k, *status);
          fails[r]++;
          return;
        }
        float want0 = (float)(g_n * (0 % 100) + g_n * (g_n - 1) / 2);
        if (outb[0] != want0 ||
            outb[count - 1] != (float)(g_n * (int)((count - 1) % 100) + g_n * (g_n - 1) / 2)) {
          fprintf(stderr, "FAIL cost: rank %d launch %d: wrong sums\n", r, k);
          fails[r]++;
          return;
        }
      }
    });
  for (auto &t : th) t.join();
  *out = cost::now() - before;
  *blocks =
      (uint64_t)g_n * (uint64_t)launches * (path == 1 || path == 2 ? 1u : (unsigned)g_channels);
  int bad = 0;
  for (int f : fails) bad += f;
  return bad;
}

/* What the kernels cost per posted slot and per launch (the emulator's
 * counts): the hot path, a wait's spins and a slot's work, reads host
 * memory (a round trip over PCIe from a GPU) at most once per POLL_SPINS
 * spins, beyond a few reads a launch; every post takes one system fence;
 * a one-shot launch N (one flag a rank), its LL form none; a block of
 * the direct paths N (one-shot) or 2N - 1 (two-shot). */
static int run_cost() {
  brg_simt_emu::set_host_lookup(host_range);
  int bad = 0;
  const char *names[7] = {"ring",     "one-shot", "LL",          "one-shot on many blocks",
                          "two-shot", "ring LL",  "ring at 256K"};
  /* the ring's LL form at 256 KiB, and the plain ring at the same size */
  const size_t counts[7] = {200000, 1000, 1000, 4099, 4099, 65536, 65536};
  const int launches[7] = {2, 40, 40, 20, 20, 2, 2};
  for (int path = 0; path < 7; path++) {
    cost c;
    uint64_t blocks = 0;
    bad += cost_phase(path, counts[path], launches[path], &c, &blocks);
    uint64_t posts = c[BRG_SIMT_COUNT_POSTS], spins = c[BRG_SIMT_COUNT_SPINS];
    uint64_t loads = c[BRG_SIMT_COUNT_HOST_LOADS], stores = c[BRG_SIMT_COUNT_HOST_STORES];
    uint64_t fences = c[BRG_SIMT_COUNT_FENCES];
    uint64_t nl = (uint64_t)g_n * (uint64_t)launches[path];
    printf("cost %s: %llu launches (%llu blocks), %llu slots posted, %llu spins: %llu host loads, "
           "%llu host stores, %llu system fences, %llu elements off the vector path\n",
           names[path], (unsigned long long)nl, (unsigned long long)blocks,
           (unsigned long long)posts, (unsigned long long)spins, (unsigned long long)loads,
           (unsigned long long)stores, (unsigned long long)fences,
           (unsigned long long)c[BRG_SIMT_COUNT_SCALAR]);
    /* per unit of work: a ring slot, or a block of a one-hop launch */
    bool ring = path == 0 || path >= 5;
    double units = ring ? (double)(posts ? posts : 1) : (double)blocks;
    printf("cost %s per %s: %.3f host loads, %.3f host stores, %.3f system fences, %.0f bytes "
           "of the call; %.2f blocks a launch\n",
           names[path], ring ? "slot posted" : "block", (double)loads / units,
           (double)stores / units, (double)fences / units,
           (double)counts[path] * sizeof(float) * (double)nl / units, (double)blocks / (double)nl);
    /* the hot path: once per POLL_SPINS spins, and a launch's start (1 a
     * block): no slot and no wait reads host memory before POLL_SPINS
     * spins */
    if (loads > spins / POLL_SPINS + blocks) {
      fprintf(stderr,
              "FAIL cost %s: %llu host loads for %llu spins of %llu blocks (at most one per %u "
              "spins and 1 a block)\n",
              names[path], (unsigned long long)loads, (unsigned long long)spins,
              (unsigned long long)blocks, POLL_SPINS);
      bad++;
    }
    if (ring) {
      /* the ring: the slots are the work; a block's launch writes its watch
       * record a few times (started, finished, the wait, the progress) */
      if (path == 0 && posts < 50 * blocks) {
        fprintf(stderr, "FAIL cost ring: only %llu slots posted by %llu blocks\n",
                (unsigned long long)posts, (unsigned long long)blocks);
        bad++;
      }
      if (stores > posts / 32 + 4 * (spins / POLL_SPINS) + 12 * blocks) {
        fprintf(stderr,
                "FAIL cost ring: %llu host stores for %llu slots posted (at most one per 32 "
                "slots, 4 per %u spins and 12 a block)\n",
                (unsigned long long)stores, (unsigned long long)posts, POLL_SPINS);
        bad++;
      }
      /* the LL form: no system fence at all, its lines carry their flags */
      if (path == 5 && (fences || !c[BRG_SIMT_COUNT_LL_LINES])) {
        fprintf(stderr,
                "FAIL cost ring LL: %llu system fences (none expected) and %llu LL lines "
                "stored\n",
                (unsigned long long)fences, (unsigned long long)c[BRG_SIMT_COUNT_LL_LINES]);
        bad++;
      }
      /* one fence per step that posts or takes a slot: a slice's 2N - 1
       * steps post 2N - 2 slots */
      if (path != 5 && fences * (uint64_t)(2 * g_n - 2) != posts * (uint64_t)(2 * g_n - 1)) {
        fprintf(stderr,
                "FAIL cost ring: %llu system fences for %llu slots posted (one per step: %d per "
                "%d posts expected)\n",
                (unsigned long long)fences, (unsigned long long)posts, 2 * g_n - 1, 2 * g_n - 2);
        bad++;
      }
      if (c[BRG_SIMT_COUNT_SCALAR]) {
        fprintf(stderr, "FAIL cost ring: %llu elements off the vector path, buffers aligned\n",
                (unsigned long long)c[BRG_SIMT_COUNT_SCALAR]);
        bad++;
      }
    } else {
      /* one release per flag: a one-shot launch's N, a direct block's N
       * (one-shot) or 2N - 1 (two-shot: inputs to all, results to others) */
      uint64_t want = path == 1   ? (uint64_t)g_n * nl
                      : path == 3 ? (uint64_t)g_n * blocks
                      : path == 4 ? (uint64_t)(2 * g_n - 1) * blocks
                                  : 0;
      if (fences != want || posts) {
        fprintf(stderr,
                "FAIL cost %s: %llu system fences (%llu expected: %s) and %llu ring slots\n",
                names[path], (unsigned long long)fences, (unsigned long long)want,
                path == 2 ? "none" : "one per flag raised", (unsigned long long)posts);
        bad++;
      }
      if (path >= 3 && c[BRG_SIMT_COUNT_SCALAR]) {
        fprintf(stderr, "FAIL cost %s: %llu elements off the vector path, buffers aligned\n",
                names[path], (unsigned long long)c[BRG_SIMT_COUNT_SCALAR]);
        bad++;
      }
      if (stores > 4 * (spins / POLL_SPINS) + 12 * blocks) {
        fprintf(stderr, "FAIL cost %s: %llu host stores in %llu launches (at most 12 each)\n",
                names[path], (unsigned long long)stores, (unsigned long long)nl);
        bad++;
      }
    }
  }
  return bad;
}

static void on_alarm(int) {
  static const char msg[] = "FAIL: still running at the deadline (a wait that never ends?)\n";
  ssize_t w = write(2, msg, sizeof msg - 1);
  (void)w;
  _exit(1);
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr,
            "usage: %s threads|procs|abort N CHANNELS BLOCK_THREADS "
            "[quick|oneshot|ll|align|misalign|direct|ringll]\n",
            argv[0]);
    return 2;
  }
  const char *mode = argv[1];
  g_n = atoi(argv[2]);
  g_channels = argc > 3 ? atoi(argv[3]) : 2;
  g_threads = argc > 4 ? atoi(argv[4]) : 32;
  g_ll = argc > 5 && strcmp(argv[5], "ll") == 0;
  g_only_oneshot = g_ll || (argc > 5 && strcmp(argv[5], "oneshot") == 0);
  g_quick = g_only_oneshot || (argc > 5 && strcmp(argv[5], "quick") == 0);
  g_align = argc > 5 && strcmp(argv[5], "align") == 0;
  g_misalign = argc > 5 && strcmp(argv[5], "misalign") == 0;
  g_direct = argc > 5 && strcmp(argv[5], "direct") == 0;
  g_ringll = argc > 5 && strcmp(argv[5], "ringll") == 0;
  if (g_n < 1 || g_n > 8 || g_channels < 1 || g_channels > MAX_CHANNELS || g_threads < 1 ||
      g_threads > 1024) {
    fprintf(stderr, "bad arguments\n");
    return 2;
  }
  /* RING_EMU_DEADLINE_S: the should-fail runs (a broken kernel) take a
   * shorter one, since a wait that never ends is how some of them fail */
  const char *dl = getenv("RING_EMU_DEADLINE_S");
  signal(SIGALRM, on_alarm);
  alarm(dl && atoi(dl) > 0 ? (unsigned)atoi(dl) : 240);
  setup_shared(g_n);
  int bad;
  if (strcmp(mode, "threads") == 0)
    bad = run_threads();
  else if (strcmp(mode, "procs") == 0)
    bad = run_procs();
  else if (strcmp(mode, "abort") == 0)
    bad = g_n < 2 ? 0 : run_abort();
  else if (strcmp(mode, "stale") == 0)
    bad = run_stale();
  else if (strcmp(mode, "cost") == 0)
    bad = run_cost();
  else {
    fprintf(stderr, "unknown mode %s\n", mode);
    return 2;
  }
  printf("test_ring_kernel_emu %s N=%d channels=%d threads=%d%s: %s\n", mode, g_n, g_channels,
         g_threads,
         g_direct         ? " direct paths only (one-shot and two-shot on many blocks)"
         : g_ll           ? " one-shot LL only"
         : g_only_oneshot ? " one-shot only"
         : g_align        ? " aligned buffers"
         : g_misalign     ? " buffers off 16 bytes, each rank its own"
         : g_quick        ? " quick"
                          : "",
         bad ? "FAILED" : "ok");
  return bad ? 1 : 0;
}
