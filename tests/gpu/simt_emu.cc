/* The SIMT emulator of simt_emu.h. */
#include "simt_emu.h"
#include "simt.cuh"

#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <time.h>
#include <ucontext.h>

#include <vector>

/* ThreadSanitizer must be told about fibers, or it takes the switches for
 * one thread's accesses racing with themselves. */
#if defined(__SANITIZE_THREAD__)
#define BRG_SIMT_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define BRG_SIMT_TSAN 1
#endif
#endif
#ifdef BRG_SIMT_TSAN
#include <sanitizer/tsan_interface.h>
#endif

/* A block runs as many fibers as the launch has threads (512 in kernel
 * mode), and every __syncthreads switches to each of them and back:
 * swapcontext's signal-mask system call on every switch made that the
 * emulator's whole cost. On x86-64 without sanitizers (which watch
 * swapcontext) a switch is a few instructions of our own instead. */
#if defined(__x86_64__) && !defined(BRG_SIMT_TSAN) && !defined(__SANITIZE_ADDRESS__)
#if defined(__has_feature)
#if !__has_feature(address_sanitizer)
#define BRG_SIMT_FAST_SWITCH 1
#endif
#else
#define BRG_SIMT_FAST_SWITCH 1
#endif
#endif

#ifdef BRG_SIMT_FAST_SWITCH
/* Saves the callee-saved registers on this stack and its pointer in
 * *from, then resumes the stack at `to` (made by brg_simt_switch itself,
 * or by make_fiber). */
extern "C" void brg_simt_switch(void **from, void *to);
__asm__(".text\n"
        ".globl brg_simt_switch\n"
        ".hidden brg_simt_switch\n"
        ".type brg_simt_switch,@function\n"
        "brg_simt_switch:\n"
        "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
        "  movq %rsp, (%rdi)\n"
        "  movq %rsi, %rsp\n"
        "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
        "  ret\n"
        ".size brg_simt_switch, .-brg_simt_switch\n");
#endif

namespace {

enum { RUN, BARRIER, DONE };

constexpr size_t STACK_BYTES = 64 * 1024;

struct fiber {
#ifdef BRG_SIMT_FAST_SWITCH
  void *sp;
#else
  ucontext_t ctx;
#endif
  unsigned tid;
  int state;
  void *stack;
  void *tsan; /* ThreadSanitizer's fiber */
};

struct block_rt {
  unsigned block, nthreads;
  std::vector<fiber> f;
#ifdef BRG_SIMT_FAST_SWITCH
  void *sched_sp;
#else
  ucontext_t sched;
#endif
  unsigned cur = 0;
  unsigned at_barrier = 0, live = 0;
  bool paused = false;
  const std::function<void()> *body = nullptr;
  int failed = 0;
  int gpu = -1;        /* co-residency: the emulated GPU whose slot it takes */
  unsigned slots = 0;  /* its blocks at once */
  uint64_t ticket = 0; /* its turn for a slot there */
  /* host memory ranges seen by this block (set_host_lookup) */
  static constexpr int NRANGES = 8;
  uintptr_t lo[NRANGES] = {}, hi[NRANGES] = {};
  int host[NRANGES] = {};
  unsigned nranges = 0, next_range = 0;
  uint64_t spins = 0, host_word_loads = 0; /* for the hot-read check */
  void *tsan_sched = nullptr;              /* ThreadSanitizer's view of the scheduler */
};

/* From the scheduler to fiber t and back. */
void switch_to_fiber(block_rt *b, unsigned t) {
#ifdef BRG_SIMT_TSAN
  __tsan_switch_to_fiber(b->f[t].tsan, 0);
#endif
#ifdef BRG_SIMT_FAST_SWITCH
  brg_simt_switch(&b->sched_sp, b->f[t].sp);
#else
  swapcontext(&b->sched, &b->f[t].ctx);
#endif
}
void switch_to_sched(block_rt *b) {
#ifdef BRG_SIMT_TSAN
  __tsan_switch_to_fiber(b->tsan_sched, 0);
#endif
#ifdef BRG_SIMT_FAST_SWITCH
  brg_simt_switch(&b->f[b->cur].sp, b->sched_sp);
#else
  swapcontext(&b->f[b->cur].ctx, &b->sched);
#endif
}

thread_local block_rt *tl;

/* Every live fiber is at the barrier: all of them go on. */
void release_if_all_arrived(block_rt *b) {
  if (b->at_barrier == 0 || b->at_barrier != b->live) return;
  for (fiber &f : b->f)
    if (f.state == BARRIER) f.state = RUN;
  b->at_barrier = 0;
}

void fiber_main() {
  block_rt *b = tl;
  (*b->body)();
  b->f[b->cur].state = DONE;
  b->live--;
  release_if_all_arrived(b); /* a thread that has exited no longer holds the others */
#if defined(BRG_SIMT_TSAN) && !defined(BRG_SIMT_FAST_SWITCH)
  /* Back to the scheduler without returning: ThreadSanitizer would count
   * this function's exit against the scheduler's call stack once the
   * switch below is made, one frame too many per finished thread. Deep
   * enough, that stack runs below its start, and the next stack
   * ThreadSanitizer records there (the scheduler's nanosleep records
   * one) reads past the thread's memory. */
  __tsan_switch_to_fiber(b->tsan_sched, 0);
  setcontext(&b->sched);
  abort();
#endif
  /* returning resumes the scheduler (uc_link) */
}

#ifdef BRG_SIMT_FAST_SWITCH
/* Where a fiber's first switch lands; it never returns. */
void fiber_entry() {
  fiber_main();
  block_rt *b = tl;
  void *dead;
  brg_simt_switch(&dead, b->sched_sp);
  abort();
}
#endif

/* Fiber stacks outlive launches: a launch of 512-thread blocks would
 * otherwise allocate and fault in thousands of them. (Only with the fast
 * switch: under the sanitizers, whose view of a fiber's stack ends with
 * it, each launch makes its own.) */
std::vector<void *> stack_pool;
pthread_mutex_t stack_lock = PTHREAD_MUTEX_INITIALIZER;

void *stack_get() {
#ifndef BRG_SIMT_FAST_SWITCH
  return malloc(STACK_BYTES);
#endif
  void *p = nullptr;
  pthread_mutex_lock(&stack_lock);
  if (!stack_pool.empty()) {
    p = stack_pool.back();
    stack_pool.pop_back();
  }
  pthread_mutex_unlock(&stack_lock);
  return p ? p : malloc(STACK_BYTES);
}

void stack_put(void *p) {
#ifndef BRG_SIMT_FAST_SWITCH
  free(p);
  return;
#endif
  if (!p) return;
  pthread_mutex_lock(&stack_lock);
  stack_pool.push_back(p);
  pthread_mutex_unlock(&stack_lock);
}

/* Thread t of the block, ready to start at the body. */
bool make_fiber(block_rt *b, unsigned t) {
  fiber &f = b->f[t];
  f.tid = t;
  f.state = RUN;
  f.stack = stack_get();
  if (!f.stack) return false;
#ifdef BRG_SIMT_FAST_SWITCH
  /* What brg_simt_switch pops: six registers, then fiber_entry as the
   * return address, above it a zero return address of fiber_entry's own
   * so its frame is aligned as a call's (rsp + 8 a multiple of 16). */
  uintptr_t top = ((uintptr_t)f.stack + STACK_BYTES) & ~(uintptr_t)15;
  void **sp = reinterpret_cast<void **>(top) - 1;
  *sp = nullptr;
  *--sp = reinterpret_cast<void *>(&fiber_entry);
  for (int i = 0; i < 6; i++) *--sp = nullptr;
  f.sp = sp;
#else
  if (getcontext(&f.ctx) != 0) return false;
  f.ctx.uc_stack.ss_sp = f.stack;
  f.ctx.uc_stack.ss_size = STACK_BYTES;
  f.ctx.uc_link = &b->sched;
  makecontext(&f.ctx, fiber_main, 0);
#endif
#ifdef BRG_SIMT_TSAN
  f.tsan = __tsan_create_fiber(0);
#endif
  return true;
}

/* Co-residency (launch's slots): per emulated GPU, the blocks running and
 * the turns handed out and begun, so that blocks start in the order their
 * launches asked for them. */
constexpr int MAX_GPUS = 8;
struct gpu_slots {
  pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
  unsigned running = 0, most = 0;
  uint64_t issued = 0, begun = 0;
};
gpu_slots g_slots[MAX_GPUS];

void slot_take(int gpu, uint64_t ticket, unsigned limit) {
  gpu_slots &g = g_slots[gpu];
  pthread_mutex_lock(&g.mu);
  while (g.begun != ticket || g.running >= limit) pthread_cond_wait(&g.cv, &g.mu);
  g.begun++;
  if (++g.running > g.most) g.most = g.running;
  pthread_cond_broadcast(&g.cv); /* the next turn may start too */
  pthread_mutex_unlock(&g.mu);
}

void slot_give(int gpu) {
  gpu_slots &g = g_slots[gpu];
  pthread_mutex_lock(&g.mu);
  g.running--;
  pthread_cond_broadcast(&g.cv);
  pthread_mutex_unlock(&g.mu);
}

/* set_hot_read_check */
bool hot_read_checked;

void hot_read_check(const block_rt *b) {
  if (!__atomic_load_n(&hot_read_checked, __ATOMIC_RELAXED)) return;
  if (b->host_word_loads <= b->spins / brg_simt_emu::HOT_READ_SPINS + brg_simt_emu::HOT_READ_LAUNCH)
    return;
  fprintf(stderr,
          "emulated GPU: FAIL: block %u of a launch read words of host memory %llu times in "
          "%llu spins of its threads (at most one per %u spins and %u a launch: each read is a "
          "round trip over PCIe on a GPU; BRIGADE_EMU_HOT_READS)\n",
          b->block, (unsigned long long)b->host_word_loads, (unsigned long long)b->spins,
          brg_simt_emu::HOT_READ_SPINS, brg_simt_emu::HOT_READ_LAUNCH);
  fflush(stderr);
  abort();
}

/* A block the emulator could not make (its thread, or a thread's fiber
 * stack: memory or the process's thread limit, shared with every other
 * run on the machine). A GPU starts every block of a launch, and the
 * blocks that did start would spin for this one until a watchdog named
 * the wrong cause, so the process stops here saying why. */
[[noreturn]] void block_unmade(unsigned block, unsigned blocks, unsigned threads, const char *what,
                               int err) {
  fprintf(stderr,
          "simt emulator: block %u of a launch of %u blocks x %u threads could not be made "
          "(%s: %s); the process stops rather than let the other blocks wait for it\n",
          block, blocks, threads, what, strerror(err));
  fflush(stderr);
  abort();
}

void *block_main(void *arg) {
  block_rt *b = static_cast<block_rt *>(arg);
  tl = b;
  if (b->gpu >= 0) slot_take(b->gpu, b->ticket, b->slots);
#ifdef BRG_SIMT_TSAN
  b->tsan_sched = __tsan_get_current_fiber();
#endif
  for (unsigned t = 0; t < b->nthreads; t++)
    if (!make_fiber(b, t)) block_unmade(b->block, 0, b->nthreads, "a fiber's stack", errno);
  b->live = b->nthreads;
  unsigned idle_rounds = 0;
  while (b->live > 0) {
    bool worked = false;
    for (unsigned t = 0; t < b->nthreads; t++) {
      if (b->f[t].state != RUN) continue;
      b->cur = t;
      b->paused = false;
      switch_to_fiber(b, t);
      worked |= !b->paused;
    }
    if (worked) {
      idle_rounds = 0;
    } else if (++idle_rounds < 64) {
      sched_yield(); /* only spinning threads: let the other blocks run */
    } else {
      struct timespec ts = {0, 20000};
      nanosleep(&ts, nullptr);
    }
  }
  for (fiber &f : b->f) {
#ifdef BRG_SIMT_TSAN
    if (f.tsan) __tsan_destroy_fiber(f.tsan);
#endif
    stack_put(f.stack);
  }
  if (b->gpu >= 0) slot_give(b->gpu);
  hot_read_check(b);
  return nullptr;
}

} // namespace

unsigned brg_simt_emu_tid() {
  return tl->f[tl->cur].tid;
}
unsigned brg_simt_emu_nthreads() {
  return tl->nthreads;
}
unsigned brg_simt_emu_block() {
  return tl->block;
}

void brg_simt_emu_sync() {
  block_rt *b = tl;
  fiber &me = b->f[b->cur];
  me.state = BARRIER;
  b->at_barrier++;
  release_if_all_arrived(b);
  switch_to_sched(b);
}

namespace {
constexpr int NCOUNTS = 12;
uint64_t counts[NCOUNTS];
brg_simt_emu::host_lookup_fn host_lookup;
} // namespace

void brg_simt_emu::set_hot_read_check(bool on) {
  __atomic_store_n(&hot_read_checked, on, __ATOMIC_RELAXED);
}

void brg_simt_emu::set_host_lookup(host_lookup_fn lookup) {
  __atomic_store_n(&host_lookup, lookup, __ATOMIC_RELEASE);
}

/* A few ranges per block, looked up once each: the kernel reaches its
 * words and slots in a handful of regions. */
void brg_simt_emu_touch(const void *p, int how) {
  block_rt *b = tl;
  if (!b) return;
  uintptr_t a = reinterpret_cast<uintptr_t>(p);
  int host = -1;
  for (unsigned i = 0; i < b->nranges; i++)
    if (a >= b->lo[i] && a < b->hi[i]) {
      host = b->host[i];
      break;
    }
  if (host < 0) {
    brg_simt_emu::host_lookup_fn fn = __atomic_load_n(&host_lookup, __ATOMIC_ACQUIRE);
    uintptr_t lo = a, hi = a + 1;
    host = fn ? fn(p, &lo, &hi) : 0;
    if (!fn || lo > a || hi <= a) lo = a, hi = a + 1;
    unsigned i =
        b->nranges < block_rt::NRANGES ? b->nranges++ : b->next_range++ % block_rt::NRANGES;
    b->lo[i] = lo;
    b->hi[i] = hi;
    b->host[i] = host;
  }
  if (!host) return;
  brg_simt_emu_count(how == 1 ? BRG_SIMT_COUNT_HOST_STORES : BRG_SIMT_COUNT_HOST_LOADS, 1);
  if (how == 0) b->host_word_loads++;
}

void brg_simt_emu_count(int what, uint64_t n) {
  if (what >= 0 && what < NCOUNTS) __atomic_fetch_add(&counts[what], n, __ATOMIC_RELAXED);
}

uint64_t brg_simt_emu::count(int what) {
  return what >= 0 && what < NCOUNTS ? __atomic_load_n(&counts[what], __ATOMIC_RELAXED) : 0;
}

void brg_simt_emu_pause() {
  brg_simt_emu_count(BRG_SIMT_COUNT_SPINS, 1);
  block_rt *b = tl;
  b->spins++;
  b->paused = true;
  switch_to_sched(b);
}

void brg_simt_emu_published() {
  sched_yield();
}

unsigned brg_simt_emu::running(int gpu, unsigned *most) {
  if (gpu < 0 || gpu >= MAX_GPUS) return 0;
  gpu_slots &g = g_slots[gpu];
  pthread_mutex_lock(&g.mu);
  unsigned r = g.running;
  if (most) *most = g.most;
  pthread_mutex_unlock(&g.mu);
  return r;
}

int brg_simt_emu::launch(unsigned blocks, unsigned threads, const std::function<void()> &body,
                         int gpu, unsigned slots) {
  std::vector<block_rt> b(blocks);
  std::vector<pthread_t> th(blocks);
  std::vector<int> started(blocks, 0);
  int bad = 0;
  if (gpu < 0 || gpu >= MAX_GPUS || slots == 0) gpu = -1;
  uint64_t first = 0;
  if (gpu >= 0) { /* this launch's turns, in block order */
    pthread_mutex_lock(&g_slots[gpu].mu);
    first = g_slots[gpu].issued;
    g_slots[gpu].issued += blocks;
    pthread_mutex_unlock(&g_slots[gpu].mu);
  }
  for (unsigned i = 0; i < blocks; i++) {
    b[i].block = i;
    b[i].nthreads = threads;
    b[i].f.resize(threads);
    b[i].body = &body;
    b[i].gpu = gpu;
    b[i].slots = slots;
    b[i].ticket = first + i;
    int err = pthread_create(&th[i], nullptr, block_main, &b[i]);
    if (err != 0) block_unmade(i, blocks, threads, "pthread_create", err);
    started[i] = 1;
  }
  for (unsigned i = 0; i < blocks; i++) {
    if (started[i]) pthread_join(th[i], nullptr);
    bad |= b[i].failed;
  }
  return bad ? -1 : 0;
}
