/*
 * What a kernel of kernel mode (ring_kernel.cuh) may ask of the machine it
 * runs on, in one place, so that the same kernel source compiles for a GPU
 * with nvcc and for the CPU under the SIMT emulator of the tests
 * (tests/gpu/simt_emu.h), where there is no GPU:
 *
 *   brg_simt_tid / _nthreads / _block   threadIdx.x, blockDim.x, blockIdx.x
 *   brg_simt_sync                       __syncthreads
 *   brg_simt_pause                      a spinning thread lets others run
 *   brg_simt_load_acquire (u64)         a flag another GPU or the host wrote
 *   brg_simt_store_release (u64)        a flag another GPU or the host reads,
 *                                       after this thread's reads and writes
 *   brg_simt_release                    one fence for the flags that follow
 *   brg_simt_store_flag (u64)           a flag after brg_simt_release
 *   brg_simt_load_word (int)            a word the host writes (abort): a
 *                                       round trip over PCIe from a GPU
 *   brg_simt_store_word (int)           a word the host reads (status)
 *   brg_simt_store_word_release (int)   the same, after this thread's writes
 *   brg_simt_exchange_word (int)        swaps a word, returns the old one
 *   brg_simt_load_u64 / _store_u64      a counter the host reads (relaxed)
 *   brg_simt_load_flagged (u64)         a word of data and flag that a
 *                                       wait polls (relaxed, as _load_u64)
 *   brg_simt_ll_store / _ll_load        a 16-byte LL line another GPU reads
 *                                       (writes): two 8-byte halves, each
 *                                       stored and loaded whole, no fence
 *   brg_simt_store_word_release_gpu     a word only kernels of this GPU read,
 *                                       after this thread's writes (a fence
 *                                       of the GPU only, not of the system)
 *   brg_simt_add_u64                    adds to a counter the host reads,
 *                                       returns the old value
 *   brg_simt_add_u64_release_gpu        the same, after this thread's writes
 *                                       (a fence of the GPU only)
 *   BRG_SIMT_SHARED                     __shared__: one per thread block
 *
 * Flags and words are at system scope: they may live in another process's
 * GPU memory (CUDA IPC) or in host memory mapped for the GPU.
 *
 * A release at system scope is a fence of the whole memory system
 * (MEMBAR.SYS), the dearest instruction of a post: st.release is one, and
 * so is brg_simt_release. A post of several flags (a slot's tail and the
 * previous slot's head) takes one brg_simt_release and relaxed stores
 * (brg_simt_store_flag). What the block's other threads wrote before a
 * brg_simt_sync is covered by the fence of the thread that posts, as the
 * barrier orders their writes before it.
 */
#ifndef BRG_SIMT_CUH
#define BRG_SIMT_CUH

#include <stdint.h>

#if defined(__CUDACC__)
#include <cuda_runtime.h>

#define BRG_SIMT_DEV __device__ __forceinline__
#define BRG_SIMT_SHARED __shared__

static BRG_SIMT_DEV unsigned brg_simt_tid() {
  return threadIdx.x;
}
static BRG_SIMT_DEV unsigned brg_simt_nthreads() {
  return blockDim.x;
}
static BRG_SIMT_DEV unsigned brg_simt_block() {
  return blockIdx.x;
}
static BRG_SIMT_DEV void brg_simt_sync() {
  __syncthreads();
}
static BRG_SIMT_DEV void brg_simt_pause() {
  __nanosleep(64);
}
static BRG_SIMT_DEV uint64_t brg_simt_load_acquire(const uint64_t *p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
static BRG_SIMT_DEV void brg_simt_store_release(uint64_t *p, uint64_t v) {
  asm volatile("st.release.sys.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
static BRG_SIMT_DEV int brg_simt_load_word(const int *p) {
  int v;
  asm volatile("ld.relaxed.sys.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
static BRG_SIMT_DEV void brg_simt_store_word(int *p, int v) {
  asm volatile("st.relaxed.sys.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
static BRG_SIMT_DEV void brg_simt_store_word_release(int *p, int v) {
  asm volatile("st.release.sys.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
static BRG_SIMT_DEV int brg_simt_exchange_word(int *p, int v) {
  return atomicExch_system(p, v);
}
static BRG_SIMT_DEV uint64_t brg_simt_load_u64(const uint64_t *p) {
  uint64_t v;
  asm volatile("ld.relaxed.sys.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
static BRG_SIMT_DEV void brg_simt_store_u64(uint64_t *p, uint64_t v) {
  asm volatile("st.relaxed.sys.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
static BRG_SIMT_DEV uint64_t brg_simt_load_flagged(const uint64_t *p) {
  return brg_simt_load_u64(p);
}
static BRG_SIMT_DEV void brg_simt_release() {
  asm volatile("fence.acq_rel.sys;" ::: "memory");
}
static BRG_SIMT_DEV void brg_simt_store_flag(uint64_t *p, uint64_t v) {
  asm volatile("st.relaxed.sys.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
/* A vector access is single-copy atomic per element (PTX memory model):
 * each 8-byte half of the line, with its data and its flag, lands whole. */
static BRG_SIMT_DEV void brg_simt_ll_store(uint64_t *p, uint64_t lo, uint64_t hi) {
  asm volatile("st.relaxed.sys.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(lo), "l"(hi) : "memory");
}
static BRG_SIMT_DEV void brg_simt_ll_load(const uint64_t *p, uint64_t *lo, uint64_t *hi) {
  uint64_t x, y;
  asm volatile("ld.relaxed.sys.v2.u64 {%0, %1}, [%2];" : "=l"(x), "=l"(y) : "l"(p) : "memory");
  *lo = x;
  *hi = y;
}
static BRG_SIMT_DEV void brg_simt_store_word_release_gpu(int *p, int v) {
  asm volatile("st.release.gpu.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
static BRG_SIMT_DEV uint64_t brg_simt_add_u64(uint64_t *p, uint64_t v) {
  uint64_t old;
  asm volatile("atom.relaxed.sys.add.u64 %0, [%1], %2;" : "=l"(old) : "l"(p), "l"(v) : "memory");
  return old;
}
static BRG_SIMT_DEV void brg_simt_add_u64_release_gpu(uint64_t *p, uint64_t v) {
  asm volatile("red.release.gpu.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

#else                               /* the SIMT emulator */

/* Provided by the emulator (tests/gpu/simt_emu.cc) for the calling fiber. */
unsigned brg_simt_emu_tid();
unsigned brg_simt_emu_nthreads();
unsigned brg_simt_emu_block();
void brg_simt_emu_sync();
void brg_simt_emu_pause();
void brg_simt_emu_published();
/* What the emulator counts for the tests (simt_emu.h, brg_simt_emu::count). */
void brg_simt_emu_count(int what, uint64_t n);
#define BRG_SIMT_COUNT_SPINS 0      /* brg_simt_pause */
#define BRG_SIMT_COUNT_WORD_LOADS 1 /* brg_simt_load_word */
#define BRG_SIMT_COUNT_FENCES 2     /* system fences: releases, brg_simt_release */
#define BRG_SIMT_COUNT_FLAGS 3      /* flags and words stored with release */
#define BRG_SIMT_COUNT_SCALAR                                                                      \
  4 /* elements copied or reduced one at a time beyond the head and tail
       that align the destination */
#define BRG_SIMT_COUNT_LL_LINES 5 /* LL lines stored (brg_simt_ll_store) */
/* Loads and stores of the primitives below that reach host memory mapped
 * for the GPU (each a round trip, or a posted write, over PCIe on a GPU):
 * the emulator tells such memory from GPU memory by the regions its
 * module handed out (simt_emu.h, set_host_lookup). */
#define BRG_SIMT_COUNT_HOST_LOADS 6
#define BRG_SIMT_COUNT_HOST_STORES 7
#define BRG_SIMT_COUNT_POSTS 8 /* slots a channel posted to the next rank */
/* The address p a primitive loads (0: a word, 2: a flag it waits on) or
 * stores (1): counted when it is host memory. */
void brg_simt_emu_touch(const void *p, int how);

#define BRG_SIMT_DEV inline
/* Blocks are OS threads and a block's threads are fibers of its OS thread,
 * so thread-local storage is exactly one copy per block. */
#define BRG_SIMT_SHARED static thread_local

static inline unsigned brg_simt_tid() {
  return brg_simt_emu_tid();
}
static inline unsigned brg_simt_nthreads() {
  return brg_simt_emu_nthreads();
}
static inline unsigned brg_simt_block() {
  return brg_simt_emu_block();
}
static inline void brg_simt_sync() {
  brg_simt_emu_sync();
}
static inline void brg_simt_pause() {
  brg_simt_emu_pause();
}
/* tests/gpu: built with BRG_SIMT_RELAXED_FLAGS, the flags order nothing,
 * which x86 hides and ThreadSanitizer must catch (the slots' data then
 * races between blocks). */
#ifdef BRG_SIMT_RELAXED_FLAGS
#define BRG_SIMT_ACQUIRE __ATOMIC_RELAXED
#define BRG_SIMT_RELEASE __ATOMIC_RELAXED
#else
#define BRG_SIMT_ACQUIRE __ATOMIC_ACQUIRE
#define BRG_SIMT_RELEASE __ATOMIC_RELEASE
#endif
static inline uint64_t brg_simt_load_acquire(const uint64_t *p) {
  brg_simt_emu_touch(p, 2);
  return __atomic_load_n(p, BRG_SIMT_ACQUIRE);
}
static inline void brg_simt_store_release(uint64_t *p, uint64_t v) {
  brg_simt_emu_touch(p, 1);
  brg_simt_emu_count(BRG_SIMT_COUNT_FENCES, 1);
  brg_simt_emu_count(BRG_SIMT_COUNT_FLAGS, 1);
  __atomic_store_n(p, v, BRG_SIMT_RELEASE);
  brg_simt_emu_published(); /* a window for a reader that should not look yet */
}
static inline int brg_simt_load_word(const int *p) {
  brg_simt_emu_touch(p, 0);
  brg_simt_emu_count(BRG_SIMT_COUNT_WORD_LOADS, 1);
  return __atomic_load_n(p, __ATOMIC_RELAXED);
}
static inline void brg_simt_store_word(int *p, int v) {
  brg_simt_emu_touch(p, 1);
  __atomic_store_n(p, v, __ATOMIC_RELAXED);
}
static inline void brg_simt_store_word_release(int *p, int v) {
  brg_simt_emu_touch(p, 1);
  brg_simt_emu_count(BRG_SIMT_COUNT_FENCES, 1);
  brg_simt_emu_count(BRG_SIMT_COUNT_FLAGS, 1);
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
}
static inline int brg_simt_exchange_word(int *p, int v) {
  brg_simt_emu_touch(p, 0);
  brg_simt_emu_touch(p, 1);
  return __atomic_exchange_n(p, v, __ATOMIC_ACQ_REL);
}
static inline uint64_t brg_simt_load_u64(const uint64_t *p) {
  brg_simt_emu_touch(p, 0);
  return __atomic_load_n(p, __ATOMIC_RELAXED);
}
static inline void brg_simt_store_u64(uint64_t *p, uint64_t v) {
  brg_simt_emu_touch(p, 1);
  __atomic_store_n(p, v, __ATOMIC_RELAXED);
}
static inline uint64_t brg_simt_load_flagged(const uint64_t *p) {
  brg_simt_emu_touch(p, 2);
  return __atomic_load_n(p, __ATOMIC_RELAXED);
}
/* A block's fibers share one OS thread, so a release store orders every
 * fiber's writes before the flag: brg_simt_release is the fence the
 * device needs (counted), and the flag that follows it is stored with
 * release here, as ThreadSanitizer understands no fence of its own. */
static inline void brg_simt_release() {
  brg_simt_emu_count(BRG_SIMT_COUNT_FENCES, 1);
  __asm__ volatile("" ::: "memory");
}
static inline void brg_simt_store_flag(uint64_t *p, uint64_t v) {
  brg_simt_emu_touch(p, 1);
  brg_simt_emu_count(BRG_SIMT_COUNT_FLAGS, 1);
  __atomic_store_n(p, v, BRG_SIMT_RELEASE);
  brg_simt_emu_published();
}
/* The halves of an LL line are relaxed, as on the device: nothing orders
 * them, and a reader checks each half's flag. */
static inline void brg_simt_ll_store(uint64_t *p, uint64_t lo, uint64_t hi) {
  brg_simt_emu_touch(p, 1);
  brg_simt_emu_count(BRG_SIMT_COUNT_LL_LINES, 1);
  __atomic_store_n(p + 1, hi,
                   __ATOMIC_RELAXED); /* the second half first: a reader may see it alone */
  __atomic_store_n(p, lo, __ATOMIC_RELAXED);
}
static inline void brg_simt_ll_load(const uint64_t *p, uint64_t *lo, uint64_t *hi) {
  brg_simt_emu_touch(p, 2);
  *lo = __atomic_load_n(p, __ATOMIC_RELAXED);
  *hi = __atomic_load_n(p + 1, __ATOMIC_RELAXED);
}
/* A fence of the GPU alone: not one of the system fences counted. */
static inline void brg_simt_store_word_release_gpu(int *p, int v) {
  brg_simt_emu_touch(p, 1);
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
}
static inline uint64_t brg_simt_add_u64(uint64_t *p, uint64_t v) {
  return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); /* ordered before the abort word's load */
}
static inline void brg_simt_add_u64_release_gpu(uint64_t *p, uint64_t v) {
  __atomic_fetch_add(p, v, __ATOMIC_RELEASE);
}

#endif

#endif /* BRG_SIMT_CUH */
