/*
 * Kernel mode: a whole collective in one kernel launch.
 *
 * One thread block per channel. Channel ch owns a share of the data
 * (brg__part_* over the channels) and its own FIFO to the next rank, and
 * runs the ring schedule of schedule.h over that share, slice by slice,
 * without the host: it waits on flags the neighbours write, reduces or
 * copies with the element-wise body of elementwise.cuh, and writes flags
 * the neighbours wait on. A small allreduce between the ranks of one host
 * may instead take the one-shot path (channel::oneshot, one block): every
 * rank's input goes straight to every rank, which sums them in rank order;
 * up to the size brg__model_ll_limit picks, in its LL form (oneshot_ll: data
 * and flag in one store, no fence, each thread spinning on its own lines).
 * The ring has an LL form too (args.ring_ll, prim_ll): the same walk and
 * primitives, each slot sent as flagged lines into LL slots of its own,
 * the tail never posted and no fence taken.
 *
 * A channel's link, as rank p sees it (slots and words in the memory of the
 * rank named; the others reach it by CUDA IPC):
 *
 *      rank p-1                    rank p                     rank p+1
 *                       recv_slots[nslots]  <---- data ----  (p writes p+1's)
 *   head (p wrote:  <-- recv_head           recv_tail   <-- tail: p-1 posted
 *   slots p read)                           send_head   <-- p+1 consumed
 *
 *   sender:   wait until posted - consumed < nslots; write the slot; all
 *             threads meet (__syncthreads); thread 0 fences (release)
 *             and stores posted + 1 into the receiver's tail.
 *   receiver: thread 0 waits (acquire) until tail > taken; all threads
 *             meet; they read the slot; all meet; thread 0 fences and
 *             stores taken + 1 into the sender's head.
 *   A step that receives and sends posts both behind one fence.
 *
 * A link to another host has the same words and slots, in pinned host
 * memory of this rank instead of the neighbour's GPU memory: the host
 * proxy (runtime/exec/kernel/device_proxy.c) plays the neighbour, carrying posted slots
 * (and their sizes, send_sizes) to the network and writing the tail of
 * slots that arrived, so the kernel cannot tell the two links apart.
 *
 * posted and taken count slots since the link was made and live in the
 * rank's own GPU memory (counters[0], counters[1]): each launch starts from
 * what the previous one left there, so a launch replayed from a CUDA graph
 * continues the sequence instead of repeating it.
 *
 * Abort: thread 0 of every channel reads *abort_word (host memory mapped
 * for the GPU) as its launch begins and polls it while it waits, once
 * every POLL_SPINS spins (each read is a round trip over PCIe, which a read at
 * every spin would add to every wait); once it is set, the channel writes
 * ABORTED to *status and every thread of the channel returns, so no
 * stream stays blocked by a peer that will never write.
 *
 * Checks, so that a fault is named instead of hanging or reducing the
 * wrong data: the sender writes, beside each slot, its position on the
 * link and the call (brg__rk_meta; the one-shot flags carry the call too).
 * The receiver compares them with its own: a different call is MISMATCH,
 * a slot not at the position due is STALE; a launch that finds another
 * one running in its channel (the busy word, counters[2]) is BUSY. The
 * channel then records both calls in its watch record (host memory), sets
 * the abort word, so that this rank's other channels stop too, and ends.
 * The watch record also shows the host's watchdog each channel's progress
 * and what it waits for (runtime/exec/kernel/device_watch.c).
 *
 * This file is host-and-device code: nvcc builds the kernel from it
 * (ring_kernel.cu), and tests/gpu/simt_emu.cc runs the same source on the
 * CPU, blocks as OS threads and threads as fibers (simt.cuh).
 */
#ifndef BRG_RING_KERNEL_CUH
#define BRG_RING_KERNEL_CUH

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "elementwise.cuh"
#include "ring_args.h"
#include "schedule.h"
#include "simt.cuh"

namespace brg_rk {

constexpr int MAX_CHANNELS = BRG__RK_MAX_CHANNELS;

enum status {
  OK = BRG__RK_OK,
  ABORTED = BRG__RK_ABORTED,
  MISMATCH = BRG__RK_MISMATCH,
  STALE = BRG__RK_STALE,
  BUSY = BRG__RK_BUSY
};

BRG_SIMT_DEV bool same_call(const brg__rk_call &x, const brg__rk_call &y) {
  return x.seq == y.seq && x.count == y.count && x.root == y.root && x.kind == y.kind &&
         x.dtype == y.dtype && x.op == y.op;
}

typedef brg__rk_link link;
typedef brg__rk_args args;

/* Spins of a wait between two reads of the abort word (and of the previous
 * rank's header): on a GPU a spin is a flag load and a short sleep, well
 * under a microsecond, so an abort is seen within a millisecond or so. */
constexpr unsigned POLL_SPINS = 1024;

/* Steps between two writes of a channel's progress into its watch record
 * (host memory: each write crosses PCIe). The watchdog waits seconds for
 * progress, and 32 steps take microseconds. */
constexpr unsigned PUBLISH_STEPS = 32;

/* A slice's payload sits in its slot at the offset from a 16-byte boundary
 * that its first element has in the call's buffers (counted from element
 * 0, so that every rank agrees), so that a copy or reduce between a slot
 * and 16-byte aligned buffers stays on the 16-byte vector path whatever
 * element a chunk starts at; the slot keeps room for the shift (its
 * payload holds slot_bytes - SLOT_SHIFT_ROOM bytes, a multiple of 16, so
 * the slices of a chunk keep its offset). */
constexpr size_t SLOT_SHIFT_ROOM = 16;

/* The plan of schedule.h for this channel's share of the call (the ring
 * or the chain, by the call's brg__coll_kind), each step handed to
 * x.prim(primitive, input, output, elements) as pointers into the call's
 * buffers, with x.step set to its step; false once x.prim returns false.
 * A channel walks it with its own primitives (channel::prim); the tests
 * walk it with a recorder (tests/runtime/test_plan). */
template <class T, class X> BRG_SIMT_DEV bool walk(const args &a, size_t slot_elems, X &x) {
  brg__sched pl = {};
  pl.kind = a.kind;
  pl.nranks = a.nranks;
  pl.pos = a.pos;
  pl.ring = a.ring;
  pl.root = a.root;
  pl.inplace = a.sendbuf == a.recvbuf;
  pl.whole = a.whole;
  pl.count = a.count;
  pl.stride = a.stride;
  pl.slice_elems = slot_elems;
  pl.nchannels = a.nchannels;
  pl.channel = (int)brg_simt_block();
  brg__sched_begin(&pl);
  const T *send = static_cast<const T *>(a.sendbuf);
  T *recv = static_cast<T *>(a.recvbuf);
  brg__step st;
  while (brg__sched_next(&pl, &st)) {
    x.step = st.step;
    x.at = st.elem;
    if (!x.prim(st.prim, st.in && send ? send + st.in_off : nullptr,
                st.out && recv ? recv + st.out_off : nullptr, st.count))
      return false;
  }
  return true;
}

template <class D, int OP> struct channel {
  typedef typename D::T T;
  static constexpr int MID = OP == BRG_AVG ? BRG_SUM : OP; /* before the last step */

  const args &a;
  const link &l;
  brg__rk_watch *wr;      /* this channel's watch record (NULL: none) */
  uint64_t posted, taken; /* every thread keeps the same copy */
  size_t slot_elems;
  size_t at;        /* the slice's first element in the call's buffers (slot shift) */
  int step;         /* the ring step or chain hop, for the watch record */
  bool hdr_checked; /* thread 0: the previous rank's header of this call matched */
  int *ll_stop;     /* the block's: a thread of prim_ll stopped (shared memory) */
  unsigned spins;   /* thread 0: spins of this launch's waits so far */
  /* Thread 0: the watch record's words as they are now, and as the record
   * has them. The record is host memory, so the hot path does not write
   * it: what the channel waits for reaches it at the polls of the abort
   * word (a wait's first spin, then every POLL_SPINS), its progress every
   * PUBLISH_STEPS steps, and both at the launch's end. The counts live in
   * the channel's GPU memory between launches (counters[5], [6]). */
  uint64_t progress, launch;
  int w_step, w_peer, w_wait;
  int pub_step, pub_peer, pub_wait;
  uint64_t pub_progress;

  BRG_SIMT_DEV channel(const args &a_, const link &l_)
      : a(a_), l(l_), wr(a_.watch ? a_.watch + brg_simt_block() : nullptr), posted(0), taken(0),
        slot_elems(a_.ring_ll ? brg__rk_ring_ll_payload(a_.ring_ll) / sizeof(T)
                              : (a_.slot_bytes - SLOT_SHIFT_ROOM) / sizeof(T)),
        at(0), step(0), hdr_checked(false), ll_stop(nullptr), spins(0), progress(0), launch(0),
        w_step(0), w_peer(-1), w_wait(BRG__RK_WAIT_NONE), pub_step(-1), pub_peer(-2), pub_wait(-1),
        pub_progress(0) {}

  /* Thread 0: what the channel waits for now, for the watchdog (written
   * to the record by publish). */
  BRG_SIMT_DEV void waiting(int what, int peer) {
    w_step = step;
    w_peer = peer;
    w_wait = what;
  }

  /* Thread 0: the watch record brought up to date, the words that changed. */
  BRG_SIMT_DEV void publish() {
    if (!wr) return;
    if (progress != pub_progress) brg_simt_store_u64(&wr->progress, pub_progress = progress);
    if (w_step != pub_step) brg_simt_store_word(&wr->step, pub_step = w_step);
    if (w_peer != pub_peer) brg_simt_store_word(&wr->peer, pub_peer = w_peer);
    if (w_wait != pub_wait) brg_simt_store_word(&wr->wait, pub_wait = w_wait);
  }

  /* Thread 0: a step passed. */
  BRG_SIMT_DEV void advanced() {
    if (++progress % PUBLISH_STEPS == 0 && wr)
      brg_simt_store_u64(&wr->progress, pub_progress = progress);
  }

  /* A call into a watch record, which the host may read at any time. */
  BRG_SIMT_DEV static void put_call(brg__rk_call *dst, const brg__rk_call &src) {
    static_assert(sizeof(brg__rk_call) == 24, "three words");
    uint64_t v[3];
    memcpy(v, &src, sizeof v);
    uint64_t *o = reinterpret_cast<uint64_t *>(dst);
    for (int i = 0; i < 3; i++) brg_simt_store_u64(o + i, v[i]);
  }

  /* Thread 0 found a fault in what it compared from rank `peer` (a
   * one-shot flag or call), or from the previous rank (-1: its header or
   * slot): its record, then every channel of this rank stops (the abort
   * word). */
  BRG_SIMT_DEV void fault(int code, int peer, const brg__rk_call *theirs, uint64_t expected,
                          uint64_t found) {
    if (wr) {
      brg_simt_store_word(&wr->step, pub_step = step);
      brg_simt_store_word(&wr->peer, pub_peer = w_peer = peer);
      wr->expected = expected;
      wr->found = found;
      put_call(&wr->mine, a.call);
      if (theirs) put_call(&wr->theirs, *theirs);
      brg_simt_store_word_release(&wr->code, code);
    }
    brg_simt_store_word(a.status, code);
    brg_simt_store_word(a.abort_word, 1);
  }

  /* Thread 0: the previous rank's header of this call, once it is there:
   * 1 when it matches (now or before), 0 while it has not come, -1 when
   * it differs (a fault). */
  BRG_SIMT_DEV int hdr_poll() {
    if (!l.recv_hdr || hdr_checked) return 1;
    uint64_t k = l.counters[4];
    const brg__rk_hdr *h = l.recv_hdr + k % BRG__RK_HDRS;
    uint32_t f = brg__rk_hdr_flag(k);
    uint64_t w[BRG__RK_CALL_WORDS];
    for (int i = 0; i < BRG__RK_CALL_WORDS; i++) {
      w[i] = brg_simt_load_flagged(&h->w[i]);
      if (!brg__rk_has_flag(w[i], f)) return 0; /* not all there yet */
    }
    brg__rk_call theirs;
    brg__rk_call_of_words(w, f, &theirs);
    if (!same_call(theirs, a.call)) {
      fault(MISMATCH, -1, &theirs, 0, 0);
      return -1;
    }
    hdr_checked = true;
    l.counters[4] = k + 1;
    /* relaxed: the entry's words are read, and the sender writes the entry
     * again only BRG__RK_HDRS calls later */
    brg_simt_store_u64(l.hdr_ack, k + 1);
    return 1;
  }

  /* Thread 0, at the start: this call's header into the next rank's
   * mailbox, once it has room; false when stopped. */
  BRG_SIMT_DEV bool hdr_send() {
    if (!l.send_hdr) return true;
    uint64_t k = l.counters[3];
    int stop = 0;
    waiting(BRG__RK_WAIT_SEND, -1);
    while (!stop && k - brg_simt_load_acquire(l.hdr_acked) >= BRG__RK_HDRS) {
      stop = aborted();
      if (!stop) brg_simt_pause();
    }
    if (stop) return false;
    brg__rk_hdr *h = l.send_hdr + k % BRG__RK_HDRS;
    uint64_t w[BRG__RK_CALL_WORDS];
    brg__rk_call_words(&a.call, brg__rk_hdr_flag(k), w);
    for (int i = 0; i < BRG__RK_CALL_WORDS; i++) brg_simt_store_u64(&h->w[i], w[i]);
    l.counters[3] = k + 1;
    return true;
  }

  /* Thread 0 at a spin of a wait loop: whether the abort word is set, read
   * every POLL_SPINS spins (the launch's start read it first: go). */
  BRG_SIMT_DEV bool aborted() {
    if (spins++ % POLL_SPINS != 0) return false;
    if (brg_simt_tid() == 0) publish();
    return brg_simt_load_word(a.abort_word) != 0;
  }

  /* Thread 0 at a spin of a wait loop: whether to stop (the abort word, or
   * a header that differs, *faulted then), looked at as aborted() reads. */
  BRG_SIMT_DEV bool stop_now(int *faulted) {
    if (spins % POLL_SPINS != 0) {
      spins++;
      return false;
    }
    if (hdr_poll() < 0) {
      *faulted = 1;
      return true;
    }
    return aborted();
  }

  /* Thread 0, once the previous rank posted slot `taken`: it must be that
   * slot, of this call. */
  BRG_SIMT_DEV bool slot_ok() {
    if (!l.recv_meta) return true;
    const brg__rk_meta *m = l.recv_meta + taken % (uint64_t)a.nslots;
    if (m->post != taken + 1) {
      fault(STALE, -1, nullptr, taken + 1, m->post);
      return false;
    }
    brg__rk_call theirs = m->call;
    if (!same_call(theirs, a.call)) {
      fault(MISMATCH, -1, &theirs, 0, 0);
      return false;
    }
    return true;
  }

  /* Thread 0 waits for the slot to read and the slot to write; false for
   * every thread when the abort word stopped it. */
  BRG_SIMT_DEV bool wait(int recvs, int sends) {
    BRG_SIMT_SHARED int s_stop;
    if (brg_simt_tid() == 0) {
      int stop = 0, faulted = 0;
      if (recvs) waiting(BRG__RK_WAIT_RECV, -1);
      while (!stop && recvs && brg_simt_load_acquire(l.recv_tail) <= taken) {
        stop = stop_now(&faulted);
        if (!stop) brg_simt_pause();
      }
      if (!stop && recvs && !slot_ok()) stop = faulted = 1;
      if (sends) waiting(BRG__RK_WAIT_SEND, -1);
      while (!stop && sends && posted - brg_simt_load_acquire(l.send_head) >= (uint64_t)a.nslots) {
        stop = stop_now(&faulted);
        if (!stop) brg_simt_pause();
      }
      if (stop && !faulted) brg_simt_store_word(a.status, ABORTED);
      s_stop = stop;
    }
#if BRG_RK_BREAK != 2 /* tests/gpu: a kernel that reads before the flag says so must fail */
    brg_simt_sync();
#endif
    return !s_stop;
  }

  /* The emulator counts the elements that a copy or reduce takes one at a
   * time beyond the head and tail that align its destination (a byte at a
   * time for a copy), so that a test sees calls that fall off the vector
   * path: buffers and slots at different offsets from 16 bytes are read
   * shifted (elementwise.cuh, load16) and count nothing. */
  template <class E>
  BRG_SIMT_DEV static void count_scalar(const void *d0, size_t n, const brg_ew::plan &p) {
#if !defined(__CUDACC__)
    size_t x = brg_ew::scalar_excess<E>(d0, n, p);
    if (brg_simt_tid() == 0 && x > 0) brg_simt_emu_count(BRG_SIMT_COUNT_SCALAR, x);
#else
    (void)d0, (void)n, (void)p;
#endif
  }

  /* Whether two destinations sit at different offsets from 16 bytes (a
   * slot and a buffer aligned otherwise): the vector body then writes the
   * first, and a shifted copy of it the second, after the block meets. */
  BRG_SIMT_DEV static bool split(const void *d0, const void *d1) {
    return d1 && ((reinterpret_cast<uintptr_t>(d0) ^ reinterpret_cast<uintptr_t>(d1)) & 15) != 0;
  }

  BRG_SIMT_DEV static void copy_bytes(uint8_t *o0, uint8_t *o1, const uint8_t *s, size_t bytes) {
    brg_ew::plan p = brg_ew::make_plan<uint8_t>(o0, o1, s, s, bytes);
    count_scalar<uint8_t>(o0, bytes, p);
    brg_ew::thread_body<brg_ew::copy_fn>(brg_simt_tid(), brg_simt_nthreads(), o0, o1, s, nullptr,
                                         bytes, p, 0);
  }

  BRG_SIMT_DEV void copy(void *d0, void *d1, const void *src, size_t m) {
    typedef uint8_t B;
    size_t bytes = m * sizeof(T);
    B *o0 = static_cast<B *>(d0), *o1 = static_cast<B *>(d1);
    const B *s = static_cast<const B *>(src);
    if (!o0) {
      o0 = o1;
      o1 = nullptr;
    }
    bool two = split(o0, o1);
    copy_bytes(o0, two ? nullptr : o1, s, bytes);
    if (two) {
      brg_simt_sync(); /* every thread's part of o0 is written */
      copy_bytes(o1, nullptr, o0, bytes);
    }
  }

  template <int X>
  BRG_SIMT_DEV void reduce(T *d0, T *d1, const T *x, const T *y, size_t m, int div) {
    bool two = split(d0, d1);
    brg_ew::plan p = brg_ew::make_plan<T>(d0, two ? nullptr : d1, x, y, m);
    count_scalar<T>(d0, m, p);
    brg_ew::thread_body<brg_ew::reduce_fn<D, X>>(brg_simt_tid(), brg_simt_nthreads(), d0,
                                                 two ? nullptr : d1, x, y, m, p, div);
    if (two) {
      brg_simt_sync(); /* every thread's part of d0 is written */
      copy_bytes(reinterpret_cast<uint8_t *>(d1), nullptr, reinterpret_cast<const uint8_t *>(d0),
                 m * sizeof(T));
    }
  }

  /* Bytes from one slot to the next. */
  BRG_SIMT_DEV size_t stride() const {
    return a.slot_stride ? a.slot_stride : a.slot_bytes;
  }

  /* One primitive on one slice of m elements: in is this rank's input, out
   * its output (NULL where the primitive writes none). */
  BRG_SIMT_DEV bool prim(brg__prim pr, const T *in, T *out, size_t m) {
    if (a.ring_ll) return prim_ll(pr, in, out, m);
    int recvs = brg__prim_recvs(pr), sends = brg__prim_sends(pr);
    if ((recvs || sends) && !wait(recvs, sends)) return false;
    size_t shift = (at * sizeof(T)) & (SLOT_SHIFT_ROOM - 1);
    const T *r = recvs ? reinterpret_cast<const T *>(
                             l.recv_slots + (taken % (uint64_t)a.nslots) * stride() + shift)
                       : nullptr;
    T *slot =
        sends
            ? reinterpret_cast<T *>(l.send_slots + (posted % (uint64_t)a.nslots) * stride() + shift)
            : nullptr;
#if BRG_RK_BREAK == 1 /* tests/gpu: a flag posted before the data must fail */
    if (sends && brg_simt_tid() == 0) brg_simt_store_release(l.send_tail, posted + 1);
#endif
    if (m > 0) {
      brg__prim_math w = brg__prim_math_of(pr);
      /* The next rank's slot last: where the two destinations sit at
       * different offsets from 16 bytes, the second is copied from the
       * first, better read from this GPU's memory than from the peer's. */
      bool slot_first = w.dst0 == BRG__BUF_SLOT && w.dst1 != BRG__BUF_NONE;
      T *d0 = static_cast<T *>(brg__prim_buf(slot_first ? w.dst1 : w.dst0, in, r, out, slot));
      T *d1 = static_cast<T *>(brg__prim_buf(slot_first ? w.dst0 : w.dst1, in, r, out, slot));
      const T *x = static_cast<const T *>(brg__prim_buf(w.a, in, r, out, slot));
      const T *y = static_cast<const T *>(brg__prim_buf(w.b, in, r, out, slot));
      if (!w.reduce)
        copy(d0, d1, x, m);
      else if (w.last)
        reduce<OP>(d0, d1, x, y, m, a.nranks);
      else
        reduce<MID>(d0, d1, x, y, m, 1);
    }
    brg_simt_sync(); /* every thread's part of the slot is written (or read) */
    if (brg_simt_tid() == 0) {
      /* the proxy carries the slot from its start, the shift included */
      if (sends && l.send_sizes)
        brg_simt_store_u64(&l.send_sizes[posted % (uint64_t)a.nslots], shift + m * sizeof(T));
      if (sends && l.send_meta) {
        brg__rk_meta *sm = l.send_meta + posted % (uint64_t)a.nslots;
        sm->call = a.call;
        sm->post = posted + 1;
      }
      advanced();
      /* one fence for the post: the slot written and the slot read */
      if (sends || recvs) brg_simt_release();
#if BRG_RK_BREAK != 1
      if (sends) brg_simt_store_flag(l.send_tail, posted + 1);
#endif
      if (recvs) brg_simt_store_flag(l.recv_head, taken + 1);
#if !defined(__CUDACC__)
      if (sends) brg_simt_emu_count(BRG_SIMT_COUNT_POSTS, 1);
#endif
    }
    posted += sends;
    taken += recvs;
    return true;
  }

  /* The LL flag of the slot at position `pos` of the link (0 and up). */
  BRG_SIMT_DEV static uint32_t ring_flag(uint64_t pos) {
#if BRG_RK_BREAK == 3 /* tests/gpu: one flag for every slot must fail */
    (void)pos;
    return 1;
#else
    return brg__rk_ll_flag(pos + 1);
#endif
  }

  /* 8 bytes of a buffer at byte `at` (len of them, the rest 0), and back. */
  BRG_SIMT_DEV static uint64_t get8(const void *p, size_t at, size_t len) {
    const unsigned char *b = static_cast<const unsigned char *>(p) + at;
    uint64_t v = 0;
    if (len == 8 && (reinterpret_cast<uintptr_t>(b) & 7) == 0)
      v = *reinterpret_cast<const uint64_t *>(b);
    else
      memcpy(&v, b, len);
    return v;
  }
  BRG_SIMT_DEV static void put8(void *p, size_t at, size_t len, uint64_t v) {
    unsigned char *b = static_cast<unsigned char *>(p) + at;
    if (len == 8 && (reinterpret_cast<uintptr_t>(b) & 7) == 0)
      *reinterpret_cast<uint64_t *>(b) = v; /* one 8-byte store */
    else
      memcpy(b, &v, len);
  }

  /* prim() in the LL form (args.ring_ll): the same primitive on the same
   * slice, but the slot to the next rank is written as LL lines flagged
   * with its position on the link, and the slot from the previous rank is
   * read as its lines land, each thread spinning on the lines it takes
   * (ll_wait), so that no tail is posted and no system fence taken.
   * Thread 0 still waits for a free slot (the head, as prim) before any
   * line goes out, sends the call in the slot's first lines and checks
   * the previous rank's there (the meta's check of the plain form); the
   * head goes back relaxed once the block has read the slot: the reads
   * are done (their values are used) before the barrier, and the next
   * round of the slot carries another flag. */
  BRG_SIMT_DEV bool prim_ll(brg__prim pr, const T *in, T *out, size_t m) {
    constexpr size_t E = 8 / sizeof(T); /* elements of a line */
    int recvs = brg__prim_recvs(pr), sends = brg__prim_sends(pr);
    if (sends && !wait(0, sends)) return false;
    unsigned tid = brg_simt_tid(), nt = brg_simt_nthreads();
    uint64_t nsl = (uint64_t)a.nslots;
    uint32_t fs = ring_flag(posted), fr = ring_flag(taken);
    const uint64_t *r =
        recvs ? reinterpret_cast<const uint64_t *>(l.recv_ll + (taken % nsl) * a.ring_ll) : nullptr;
    uint64_t *slot =
        sends ? reinterpret_cast<uint64_t *>(l.send_ll + (posted % nsl) * a.ring_ll) : nullptr;
    int stop = 0, faulted = 0;
    if (tid == 0) {
      if (sends) {
        uint64_t w[BRG__RK_CALL_WORDS];
        brg__rk_call_words(&a.call, fs, w);
        for (int i = 0; i < BRG__RK_LL_CALL_LINES; i++)
          brg_simt_ll_store(slot + 2 * i, w[2 * i], w[2 * i + 1]);
      }
      if (recvs) {
        /* the previous rank's call, as slot_ok compares the meta's */
        uint64_t w[BRG__RK_CALL_WORDS];
        for (int i = 0; i < BRG__RK_LL_CALL_LINES && !stop; i++)
          stop = !ll_wait(r + 2 * i, fr, -1, &faulted, w + 2 * i);
        brg__rk_call theirs;
        if (!stop && brg__rk_call_of_words(w, fr, &theirs) && !same_call(theirs, a.call)) {
          fault(MISMATCH, -1, &theirs, 0, 0);
          stop = faulted = 1;
        }
      }
    }
    brg__prim_math w = brg__prim_math_of(pr);
    size_t bytes = m * sizeof(T), nlines = (bytes + 7) / 8;
    const uint64_t *rl = r ? r + 2 * BRG__RK_LL_CALL_LINES : nullptr;
    uint64_t *sl = slot ? slot + 2 * BRG__RK_LL_CALL_LINES : nullptr;
    for (size_t j = tid; j < nlines && !stop; j += nt) {
      size_t at = j * 8, len = bytes - at < 8 ? bytes - at : 8;
      uint64_t got = 0, v;
      if (recvs && !ll_take(rl + 2 * j, fr, -1, &faulted, &got)) {
        stop = 1;
        break;
      }
      /* the sources of the primitive's math: own input or what came */
      uint64_t xa = w.a == BRG__BUF_RECV ? got : get8(in, at, len);
      if (!w.reduce) {
        v = xa;
      } else {
        uint64_t xb = w.b == BRG__BUF_RECV ? got : get8(in, at, len);
        T x[E], y[E];
        memcpy(x, &xa, 8);
        memcpy(y, &xb, 8);
        for (size_t e = 0; e < E; e++)
          x[e] = w.last ? D::template op<OP>(x[e], y[e], a.nranks)
                        : D::template op<MID>(x[e], y[e], 1);
        memcpy(&v, x, 8);
      }
      if (sends)
        brg_simt_ll_store(sl + 2 * j, brg__rk_flagged((uint32_t)v, fs),
                          brg__rk_flagged((uint32_t)(v >> 32), fs));
      if (out && (w.dst0 == BRG__BUF_OUT || w.dst1 == BRG__BUF_OUT)) put8(out, at, len, v);
    }
    /* any thread: the block's word (every writer writes 1, and a launch
     * that stops ends, so go() alone clears it) */
    if (stop) *ll_stop = 1;
    brg_simt_sync(); /* every thread's lines are read and written */
    if (*ll_stop) {
      if (tid == 0 && !faulted) brg_simt_store_word(a.status, ABORTED);
      return false;
    }
    if (tid == 0) {
      advanced();
      /* relaxed: no fence, the slot's reads are done (see above) */
      if (recvs) brg_simt_store_u64(l.recv_head, taken + 1);
#if !defined(__CUDACC__)
      if (sends) brg_simt_emu_count(BRG_SIMT_COUNT_POSTS, 1);
#endif
    }
    posted += sends;
    taken += recvs;
    return true;
  }

  /* The flag rank r raises in the one-shot area `area`. */
  BRG_SIMT_DEV static uint64_t *os_flag(char *area, int r) {
    return reinterpret_cast<uint64_t *>(area + BRG__RK_OS_FLAGS + 64 * r);
  }
  /* The call rank r made into buffer b, beside its flag. */
  BRG_SIMT_DEV static brg__rk_call *os_call(char *area, int r, uint64_t b) {
    return reinterpret_cast<brg__rk_call *>(area + BRG__RK_OS_FLAGS + 64 * r + 8 +
                                            sizeof(brg__rk_call) * (size_t)(b & 1));
  }

  /* Allreduce in one hop between the ranks of one host (args.oneshot, see
   * ring_args.h): every rank writes its input into every rank's area, its
   * own included, raises its flag there, waits for every rank's flag in
   * its own area, and folds the N inputs in rank order, so that every
   * rank gets the same bits. A rank one call ahead of another writes the
   * other buffer; two calls ahead it cannot be, as in the call between it
   * waited for the other's flag, raised only once the other had read the
   * older inputs. */
  BRG_SIMT_DEV bool oneshot() {
    const brg__rk_oneshot &o = a.os;
    int n = a.nranks, me = o.rank;
    char *own = o.area[me];
    BRG_SIMT_SHARED uint64_t s_call;
    BRG_SIMT_SHARED int s_stop;
    if (brg_simt_tid() == 0) s_call = *reinterpret_cast<const uint64_t *>(own) + 1;
    brg_simt_sync();
    uint64_t call = s_call;
    size_t m = a.count, buf = BRG__RK_OS_DATA + (size_t)(call & 1) * (size_t)n * o.slot_bytes;
#if BRG_RK_BREAK == 1 /* tests/gpu: flags raised before the data must fail */
    if (brg_simt_tid() == 0)
      for (int r = 0; r < n; r++) brg_simt_store_release(os_flag(o.area[r], me), call);
#endif
    for (int r = 0; r < n; r++)
      copy(o.area[r] + buf + (size_t)me * o.slot_bytes, nullptr, a.sendbuf, m);
    brg_simt_sync(); /* every thread's part of every copy is written */
    /* Thread r raises this rank's flag in rank r's area: the N releases
     * at once, none behind another. */
    for (int r = (int)brg_simt_tid(); r < n; r += (int)brg_simt_nthreads()) {
      *os_call(o.area[r], me, call) = a.call;
#if BRG_RK_BREAK != 1
      brg_simt_store_release(os_flag(o.area[r], me), call);
#endif
    }
    if (brg_simt_tid() == 0) {
      int stop = 0, faulted = 0;
      for (int r = 0; r < n && !stop; r++) {
        waiting(BRG__RK_WAIT_ONESHOT, r);
        uint64_t f = 0;
        while (!stop && (f = brg_simt_load_acquire(os_flag(own, r))) < call) {
          stop = stop_now(&faulted);
          if (!stop) brg_simt_pause();
        }
        if (stop) break;
        /* A rank may be one call ahead (it wrote the other buffer), never two. */
        brg__rk_call theirs = *os_call(own, r, call);
        if (f > call + 1)
          fault(STALE, r, nullptr, call, f);
        else if (!same_call(theirs, a.call))
          fault(MISMATCH, r, &theirs, 0, 0);
        else
          continue;
        stop = faulted = 1;
      }
      if (stop && !faulted) brg_simt_store_word(a.status, ABORTED);
      s_stop = stop;
    }
#if BRG_RK_BREAK != 2
    brg_simt_sync();
#endif
    if (s_stop) return false;
    const char *in = own + buf;
    size_t slot = o.slot_bytes;
    T *out = static_cast<T *>(a.recvbuf);
    for (int r = 1; r < n; r++) {
      const T *x = r == 1 ? reinterpret_cast<const T *>(in) : out;
      const T *y = reinterpret_cast<const T *>(in + (size_t)r * slot);
      if (r < n - 1)
        reduce<MID>(out, nullptr, x, y, m, 1);
      else
        reduce<OP>(out, nullptr, x, y, m, n);
      brg_simt_sync(); /* the next pass's threads may read other elements */
    }
    if (brg_simt_tid() == 0) {
      *reinterpret_cast<uint64_t *>(own) = call;
      advanced();
    }
    return true;
  }

  /* ---- the direct paths on many blocks (ring_args.h) ---- */

  /* Rank r's direct area, as this rank reaches it. */
  BRG_SIMT_DEV char *darea(int r) const {
    return a.os.area[r] + a.os.direct_off;
  }
  /* The flag line of phase f of rank r's block b in the direct area `area`. */
  BRG_SIMT_DEV static brg__rk_dline *dline(char *area, int f, int r, int b) {
    return &reinterpret_cast<brg__rk_direct_head *>(area)->line[f][r][b];
  }
  /* Rank r's slot of buffer `call & 1` in the direct area `area`. */
  BRG_SIMT_DEV char *dslot(char *area, uint64_t call, int r) const {
    return area + BRG__RK_DIRECT_DATA +
           ((size_t)(call & 1) * (size_t)a.nranks + (size_t)r) * a.os.dslot;
  }

  /* This block's flag of phase f raised in every rank's area (`skip`: but
   * this one), after its writes there: its call beside it, one release
   * each, thread r taking rank r. */
  BRG_SIMT_DEV void draise(int f, uint64_t call, int skip) {
    int me = a.os.rank, b = (int)brg_simt_block();
    brg_simt_sync(); /* every thread's part of every copy is written */
    for (int r = (int)brg_simt_tid(); r < a.nranks; r += (int)brg_simt_nthreads()) {
      if (r == skip) continue;
      brg__rk_dline *line = dline(darea(r), f, me, b);
      line->call[call & 1] = a.call;
#if BRG_RK_BREAK != 1
      brg_simt_store_release(&line->flag, call);
#endif
    }
  }

  /* Thread 0 waits for phase f's flag of every rank's block (`skip`: but
   * that rank) in its own area, and checks their calls; false for every
   * thread when stopped. */
  BRG_SIMT_DEV bool dwait(int f, uint64_t call, int skip) {
    BRG_SIMT_SHARED int s_stop;
    int b = (int)brg_simt_block();
    if (brg_simt_tid() == 0) {
      char *own = darea(a.os.rank);
      int stop = 0, faulted = 0;
      for (int r = 0; r < a.nranks && !stop; r++) {
        if (r == skip) continue;
        waiting(BRG__RK_WAIT_ONESHOT, r);
        brg__rk_dline *line = dline(own, f, r, b);
        uint64_t fl = 0;
        while (!stop && (fl = brg_simt_load_acquire(&line->flag)) < call) {
          stop = stop_now(&faulted);
          if (!stop) brg_simt_pause();
        }
        if (stop) break;
        brg__rk_call theirs = line->call[call & 1];
        if (fl > call + 1)
          fault(STALE, r, nullptr, call, fl);
        else if (!same_call(theirs, a.call))
          fault(MISMATCH, r, &theirs, 0, 0);
        else
          continue;
        stop = faulted = 1;
      }
      if (stop && !faulted) brg_simt_store_word(a.status, ABORTED);
      s_stop = stop;
    }
#if BRG_RK_BREAK != 2
    brg_simt_sync();
#endif
    return !s_stop;
  }

  /* Where a two-shot block starting at element `at` of the call begins in
   * a slot: at the offset from 16 bytes it has in the call's buffers, so
   * that copies and folds between slots and aligned buffers stay on the
   * vector path (the ring's slots shift their payloads alike). */
  BRG_SIMT_DEV static size_t bshift(size_t at) {
    return (at * sizeof(T)) & 15;
  }

  /* out = the fold, in rank order, of the N inputs at in + r * step. */
  BRG_SIMT_DEV void dfold(T *out, const char *in, size_t step, size_t m) {
    int n = a.nranks;
    for (int r = 1; r < n; r++) {
      const T *x = r == 1 ? reinterpret_cast<const T *>(in) : out;
      const T *y = reinterpret_cast<const T *>(in + (size_t)r * step);
      if (r < n - 1)
        reduce<MID>(out, nullptr, x, y, m, 1);
      else
        reduce<OP>(out, nullptr, x, y, m, n);
      brg_simt_sync(); /* the next pass's threads may read other elements */
    }
  }

  /* An allreduce by a direct path on the launch's blocks (a.os.direct):
   * the one-shot form, or the two-shot form. Block b's calls count in
   * its own word of the area; a rank one call ahead writes the other
   * buffer, and two calls ahead it cannot be: in the call between, each
   * of its blocks waited for the same block of every rank, which raised
   * its flag only after its launch of the call before had ended (launches
   * of a communicator run one after another). */
  BRG_SIMT_DEV bool direct() {
    const brg__rk_oneshot &o = a.os;
    int n = a.nranks, me = o.rank, b = (int)brg_simt_block(), nb = a.nchannels;
    char *own = darea(me);
    uint64_t *calls = reinterpret_cast<brg__rk_direct_head *>(own)->calls;
    BRG_SIMT_SHARED uint64_t s_call;
    if (brg_simt_tid() == 0) s_call = calls[b] + 1;
    brg_simt_sync();
    uint64_t call = s_call;
    const T *in = static_cast<const T *>(a.sendbuf);
    T *out = static_cast<T *>(a.recvbuf);
    size_t step = o.dslot, half = o.dslot / 2;
    if (o.direct == BRG__RK_ONESHOT_MANY) {
      size_t off = brg__part_offset(a.count, nb, b), m = brg__part_count(a.count, nb, b);
#if BRG_RK_BREAK == 1 /* tests/gpu: flags raised before the data must fail */
      if (brg_simt_tid() == 0)
        for (int r = 0; r < n; r++) brg_simt_store_release(&dline(darea(r), 0, me, b)->flag, call);
#endif
      for (int r = 0; r < n; r++)
        copy(dslot(darea(r), call, me) + off * sizeof(T), nullptr, in + off, m);
      draise(0, call, -1);
      if (!dwait(0, call, -1)) return false;
      dfold(out + off, dslot(own, call, 0) + off * sizeof(T), step, m);
    } else {
      /* reduce-scatter: part b of block p of the input into rank p's area */
#if BRG_RK_BREAK == 1
      if (brg_simt_tid() == 0)
        for (int r = 0; r < n; r++) brg_simt_store_release(&dline(darea(r), 0, me, b)->flag, call);
#endif
      for (int p = 0; p < n; p++) {
        size_t bo = brg__part_offset(a.count, n, p), bm = brg__part_count(a.count, n, p);
        size_t so = brg__part_offset(bm, nb, b), sm = brg__part_count(bm, nb, b);
        copy(dslot(darea(p), call, me) + bshift(bo) + so * sizeof(T), nullptr, in + bo + so, sm);
      }
      draise(0, call, -1);
      if (!dwait(0, call, -1)) return false;
      size_t bo = brg__part_offset(a.count, n, me), bm = brg__part_count(a.count, n, me);
      size_t so = brg__part_offset(bm, nb, b), sm = brg__part_count(bm, nb, b);
      dfold(out + bo + so, dslot(own, call, 0) + bshift(bo) + so * sizeof(T), step, sm);
      /* all-gather: the result into every other rank's area */
      for (int r = 0; r < n; r++)
        if (r != me)
          copy(dslot(darea(r), call, me) + half + bshift(bo) + so * sizeof(T), nullptr,
               out + bo + so, sm);
      draise(1, call, me);
      if (!dwait(1, call, me)) return false;
      for (int r = 0; r < n; r++) {
        if (r == me) continue;
        size_t ro = brg__part_offset(a.count, n, r), rm = brg__part_count(a.count, n, r);
        size_t qo = brg__part_offset(rm, nb, b), qm = brg__part_count(rm, nb, b);
        copy(out + ro + qo, nullptr, dslot(own, call, r) + half + bshift(ro) + qo * sizeof(T), qm);
      }
    }
    brg_simt_sync();
    if (brg_simt_tid() == 0) {
      calls[b] = call;
      if (b == 0)
        for (int x = nb; x < BRG__RK_DIRECT_BLOCKS; x++) calls[x] = call;
      advanced();
    }
    return true;
  }

  /* Rank r's LL lines of call `call` in the area `area`. */
  BRG_SIMT_DEV const uint64_t *ll_lines(const char *area, uint64_t call, int r) const {
    size_t n = (size_t)a.nranks;
    size_t off = BRG__RK_OS_DATA + 2 * n * a.os.slot_bytes +
                 ((size_t)(call & 1) * n + (size_t)r) * a.os.ll_slot;
    return reinterpret_cast<const uint64_t *>(area + off);
  }

  /* The two halves of the LL line at p (w[0] the low) once both carry
   * flag f, from rank r (-1: the previous rank, a ring slot); false when
   * the launch stops (the abort word, or thread 0 finding the previous
   * rank's header differ, *faulted then). Any thread. */
  BRG_SIMT_DEV bool ll_wait(const uint64_t *p, uint32_t f, int r, int *faulted, uint64_t w[2]) {
    for (bool first = true;; first = false) {
      brg_simt_ll_load(p, &w[0], &w[1]);
      if (brg__rk_has_flag(w[0], f) && brg__rk_has_flag(w[1], f)) return true;
      if (brg_simt_tid() == 0) {
        if (first) waiting(r < 0 ? BRG__RK_WAIT_RECV : BRG__RK_WAIT_ONESHOT, r);
        if (stop_now(faulted)) return false;
      } else if (aborted()) {
        return false;
      }
      brg_simt_pause();
    }
  }

  /* The 8 data bytes of the LL line at p, as ll_wait waits for them. */
  BRG_SIMT_DEV bool ll_take(const uint64_t *p, uint32_t f, int r, int *faulted, uint64_t *out) {
    uint64_t w[2];
    if (!ll_wait(p, f, r, faulted, w)) return false;
    *out = (w[0] & 0xffffffffu) | w[1] << 32;
    return true;
  }

  /* The LL form of oneshot() (a.os.ll; ring_args.h draws the lines): no
   * fence and no flag of its own. Every rank stores its call and its
   * input as LL lines into every rank's area; each thread then folds, in
   * rank order, the lines it stored itself, as they arrive in its own
   * area, and writes their elements out, so that no thread waits for
   * another's lines and the block meets only at its end. Thread 0 checks
   * every rank's call first. A rank one call ahead writes the other
   * buffer, and two calls ahead it cannot be, as with oneshot(). */
  BRG_SIMT_DEV bool oneshot_ll() {
    constexpr size_t E = 8 / sizeof(T); /* elements of a line */
    const brg__rk_oneshot &o = a.os;
    int n = a.nranks, me = o.rank;
    char *own = o.area[me];
    unsigned tid = brg_simt_tid(), nt = brg_simt_nthreads();
    BRG_SIMT_SHARED uint64_t s_call;
    BRG_SIMT_SHARED int s_stop;
    if (tid == 0) {
      s_call = *reinterpret_cast<const uint64_t *>(own) + 1;
      s_stop = 0;
    }
    brg_simt_sync();
    uint64_t call = s_call;
    uint32_t fl = brg__rk_ll_flag(call);
#if BRG_RK_BREAK == 3 /* tests/gpu: one flag for every call must fail */
    fl = 1;
#endif
    size_t bytes = a.count * sizeof(T), nlines = (bytes + 7) / 8;
    const unsigned char *in = static_cast<const unsigned char *>(a.sendbuf);
    unsigned char *out = static_cast<unsigned char *>(a.recvbuf);
    bool aligned =
        (reinterpret_cast<uintptr_t>(in) & 7) == 0 && (reinterpret_cast<uintptr_t>(out) & 7) == 0;
    if (tid == 0) {
      uint64_t w[BRG__RK_CALL_WORDS];
      brg__rk_call_words(&a.call, fl, w);
      for (int r = 0; r < n; r++) {
        uint64_t *p = const_cast<uint64_t *>(ll_lines(o.area[r], call, me));
        for (int i = 0; i < BRG__RK_LL_CALL_LINES; i++)
          brg_simt_ll_store(p + 2 * i, w[2 * i], w[2 * i + 1]);
      }
    }
    for (size_t j = tid; j < nlines; j += nt) {
      size_t at = j * 8, len = bytes - at < 8 ? bytes - at : 8;
      uint64_t v = 0;
      if (aligned && len == 8)
        v = *reinterpret_cast<const uint64_t *>(in + at);
      else
        memcpy(&v, in + at, len);
      for (int r = 0; r < n; r++) {
        uint64_t *p =
            const_cast<uint64_t *>(ll_lines(o.area[r], call, me)) + 2 * (BRG__RK_LL_CALL_LINES + j);
        brg_simt_ll_store(p, brg__rk_flagged((uint32_t)v, fl),
                          brg__rk_flagged((uint32_t)(v >> 32), fl));
      }
    }
    int stop = 0, faulted = 0;
    if (tid == 0) {
      /* every rank's call, before any of its data is used */
      for (int r = 0; r < n && !stop; r++) {
        const uint64_t *p = ll_lines(own, call, r);
        uint64_t w[BRG__RK_CALL_WORDS];
        for (int i = 0; i < BRG__RK_LL_CALL_LINES && !stop; i++)
          stop = !ll_wait(p + 2 * i, fl, r, &faulted, w + 2 * i);
        if (stop) break;
        brg__rk_call theirs;
        brg__rk_call_of_words(w, fl, &theirs);
        if (!same_call(theirs, a.call)) {
          fault(MISMATCH, r, &theirs, 0, 0);
          stop = faulted = 1;
        }
      }
    }
    for (size_t j = tid; j < nlines && !stop; j += nt) {
      T acc[E], x[E];
      uint64_t v = 0;
      size_t line = 2 * (BRG__RK_LL_CALL_LINES + j);
      stop = !ll_take(ll_lines(own, call, 0) + line, fl, 0, &faulted, &v);
      memcpy(acc, &v, 8);
      for (int r = 1; r < n && !stop; r++) {
        stop = !ll_take(ll_lines(own, call, r) + line, fl, r, &faulted, &v);
        memcpy(x, &v, 8);
        for (size_t e = 0; e < E; e++)
          acc[e] = r < n - 1 ? D::template op<MID>(acc[e], x[e], 1)
                             : D::template op<OP>(acc[e], x[e], n);
      }
      if (stop) break;
      size_t at = j * 8, len = bytes - at < 8 ? bytes - at : 8;
      memcpy(&v, acc, 8);
      if (aligned && len == 8)
        *reinterpret_cast<uint64_t *>(out + at) = v; /* one 8-byte store */
      else
        memcpy(out + at, &v, len);
    }
    if (stop) s_stop = 1;
    brg_simt_sync();
    if (tid == 0) {
      if (s_stop && !faulted) brg_simt_store_word(a.status, ABORTED);
      if (!s_stop) {
        *reinterpret_cast<uint64_t *>(own) = call;
        advanced();
      }
    }
    return !s_stop;
  }

  /* One rank: the output is the input. */
  BRG_SIMT_DEV void single() {
    int ch = (int)brg_simt_block(), nch = a.nchannels;
    if (!a.recvbuf || a.sendbuf == a.recvbuf) return;
    size_t share = brg__part_count(a.count, nch, ch), base = brg__part_offset(a.count, nch, ch);
    copy(static_cast<T *>(a.recvbuf) + base, nullptr, static_cast<const T *>(a.sendbuf) + base,
         share);
  }

  /* A launch whose replays the host counts (a.launches): the block is
   * counted before it reads the abort word, so that a drain that set the
   * word and then finds every counted block ended knows that none still
   * touches the communicator's memory, and counted as ended once all its
   * threads are done. */
  BRG_SIMT_DEV void run() {
    if (a.launches && brg_simt_tid() == 0) brg_simt_add_u64(a.launches, 1);
    go();
    if (a.launches) {
      brg_simt_sync(); /* every thread of the block is done with the memory */
      if (brg_simt_tid() == 0) brg_simt_add_u64_release_gpu(a.launches + BRG__RK_ENDED, 1);
    }
  }

  BRG_SIMT_DEV void go() {
    BRG_SIMT_SHARED uint64_t s_start[2];
    BRG_SIMT_SHARED int s_stopped, s_go, s_ll_stop;
    int *busy = reinterpret_cast<int *>(&l.counters[2]);
    if (brg_simt_tid() == 0) {
      s_ll_stop = 0;
      /* launches queued behind a stopped one end at once, before they
       * touch the region (a graph replayed after destroy: device_watch.c) */
      s_stopped = brg_simt_load_word(a.abort_word) != 0;
      if (s_stopped) {
        brg_simt_store_word(a.status, ABORTED);
      } else if (wr && brg_simt_exchange_word(busy, 1) != 0) {
        /* another launch runs in this channel: its slots and counters are
         * not this one's to take (launches unordered by their streams) */
        fault(BUSY, -1, nullptr, 0, 0);
        s_stopped = 1;
      } else {
        s_start[0] = l.counters[0];
        s_start[1] = l.counters[1];
        pub_progress = progress = l.counters[5];
        launch = l.counters[6] + 1;
        if (wr) {
          put_call(&wr->mine, a.call);
          brg_simt_store_u64(&wr->started, launch);
        }
      }
      s_go = !s_stopped && hdr_send();
      if (!s_stopped && !s_go) brg_simt_store_word(a.status, ABORTED);
    }
    brg_simt_sync();
    if (s_stopped) return;
    ll_stop = &s_ll_stop;
    /* thread 0 read the abort word as the launch began: that is the
     * launch's first poll, and the next comes POLL_SPINS spins on, so
     * that a wait read at once does not cross PCIe */
    spins = 1;
    posted = s_start[0];
    taken = s_start[1];
    int n = a.nranks;
    bool done;
    if (!s_go) {
      done = false;
    } else if (n == 1) {
      single();
      done = true;
    } else if (a.oneshot) {
      done = a.os.direct ? direct() : a.os.ll ? oneshot_ll() : oneshot();
    } else {
      done = walk<T>(a, slot_elems, *this);
    }
    if (brg_simt_tid() == 0) {
      /* the previous rank's header of this call, where nothing it sent
       * was read in the wait loops (this rank only sent, or was quick) */
      if (done) waiting(BRG__RK_WAIT_RECV, -1);
      int h = done ? hdr_poll() : 1;
      while (h == 0) {
        if (aborted()) {
          brg_simt_store_word(a.status, ABORTED);
          break;
        }
        brg_simt_pause();
        h = hdr_poll();
      }
      done = done && h == 1;
      if (done) {
        l.counters[0] = posted;
        l.counters[1] = taken;
      }
      l.counters[5] = progress;
      l.counters[6] = launch;
      if (wr) {
        waiting(BRG__RK_WAIT_NONE, w_peer);
        publish();
        brg_simt_store_u64(&wr->finished, launch);
        /* only launches on this GPU take the busy word */
        brg_simt_store_word_release_gpu(busy, 0);
      }
    }
  }
};

template <class D, int OP> BRG_SIMT_DEV void run_op(const args &a) {
  channel<D, OP> c(a, a.chan[brg_simt_block()]);
  c.run();
}

template <class D> BRG_SIMT_DEV void run_dtype(const args &a) {
  switch (a.op) {
  case BRG_SUM: run_op<D, BRG_SUM>(a); break;
  case BRG_PROD: run_op<D, BRG_PROD>(a); break;
  case BRG_MIN: run_op<D, BRG_MIN>(a); break;
  case BRG_MAX: run_op<D, BRG_MAX>(a); break;
  case BRG_AVG: run_op<D, BRG_AVG>(a); break;
  }
  if constexpr (D::integer) {
    switch (a.op) {
    case BRG_BAND: run_op<D, BRG_BAND>(a); break;
    case BRG_BOR: run_op<D, BRG_BOR>(a); break;
    case BRG_BXOR: run_op<D, BRG_BXOR>(a); break;
    }
  }
}

/* What every thread of the launch runs: blocks are channels. */
BRG_SIMT_DEV void run(const args &a) {
  using namespace brg_ew;
  switch (a.dtype) {
  case BRG_INT8: run_dtype<tag_i8>(a); break;
  case BRG_UINT8: run_dtype<tag_u8>(a); break;
  case BRG_INT32: run_dtype<tag_i32>(a); break;
  case BRG_UINT32: run_dtype<tag_u32>(a); break;
  case BRG_INT64: run_dtype<tag_i64>(a); break;
  case BRG_UINT64: run_dtype<tag_u64>(a); break;
  case BRG_FLOAT16: run_dtype<tag_f16>(a); break;
  case BRG_BFLOAT16: run_dtype<tag_bf16>(a); break;
  case BRG_FLOAT32: run_dtype<tag_f32>(a); break;
  case BRG_FLOAT64: run_dtype<tag_f64>(a); break;
  }
}

} // namespace brg_rk

#endif /* BRG_RING_KERNEL_CUH */
