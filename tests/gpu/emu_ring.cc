/* The emulated CUDA module's kernel-mode launch: the real ring kernel
 * (kernels/cuda/ring_kernel.cuh) run by the SIMT emulator (simt_emu.h) on
 * the stream's thread, as the GPU would run it in stream order.
 *
 * Co-residency (emu_module.c's header): each emulated GPU runs at most
 * BRIGADE_EMU_SMS x BRIGADE_EMU_BLOCKS_PER_SM blocks at once, shared by
 * every launch of this process on it; the module's occupancy query
 * answers with the same numbers. */
#include <stdint.h>
#include <stdlib.h>

#include "ring_kernel.cuh"
#include "simt_emu.h"

/* emu_module.c: whether p is registered host memory, and the region's range */
extern "C" int brg__emu_host_range(const void *p, uintptr_t *lo, uintptr_t *hi);

namespace {

/* A setting of the environment: its value, or `strict` where it is unset
 * and BRIGADE_EMU_STRICT=1, else `dflt`. */
int setting(const char *name, int dflt, int strict) {
  const char *v = getenv(name);
  if (v && *v) return atoi(v);
  const char *s = getenv("BRIGADE_EMU_STRICT");
  return s && atoi(s) ? strict : dflt;
}

/* A small GPU's SMs, for the strict rules: ranks as threads at N = 4 with
 * the model's 16 channels of 512 threads fit (4 x 16 = 64 = 16 SMs x 4). */
constexpr int STRICT_SMS = 16;

/* An SM holds at most 2048 threads and 32 blocks (sm_80 to sm_90). */
int blocks_per_sm(int threads) {
  int by_threads = threads > 0 ? 2048 / threads : 32;
  int d = by_threads < 32 ? by_threads : 32;
  int v = setting("BRIGADE_EMU_BLOCKS_PER_SM", d, d);
  return v < 1 ? 1 : v;
}

} // namespace

/* The SMs and the blocks of `threads` threads each holds; *sms 0: no
 * bound (co-residency not emulated). */
extern "C" void brg__emu_ring_occupancy(int threads, int *sms, int *per_sm) {
  int n = setting("BRIGADE_EMU_SMS", 0, STRICT_SMS);
  *sms = n > 0 ? n : 0;
  *per_sm = blocks_per_sm(threads);
}

extern "C" int brg__emu_ring_run(const brg__rk_args *a, int channels, int threads, int gpu) {
  brg_simt_emu::set_host_lookup(brg__emu_host_range);
  static int hot = -1;
  if (__atomic_load_n(&hot, __ATOMIC_RELAXED) < 0)
    __atomic_store_n(&hot, setting("BRIGADE_EMU_HOT_READS", 0, 1) != 0, __ATOMIC_RELAXED);
  brg_simt_emu::set_hot_read_check(__atomic_load_n(&hot, __ATOMIC_RELAXED) != 0);
  int sms, per_sm;
  brg__emu_ring_occupancy(threads, &sms, &per_sm);
  return brg_simt_emu::launch((unsigned)channels, (unsigned)threads, [a] { brg_rk::run(*a); }, gpu,
                              (unsigned)(sms * per_sm));
}

/* For tests (dlsym on this module): what the ring kernels of this process
 * did so far, by BRG_SIMT_COUNT_* (simt.cuh), and the most blocks that
 * ran at once on emulated GPU `gpu`. */
extern "C" __attribute__((visibility("default"))) uint64_t brg__emu_count(int what) {
  return brg_simt_emu::count(what);
}
extern "C" __attribute__((visibility("default"))) unsigned brg__emu_blocks_most(int gpu) {
  unsigned most = 0;
  brg_simt_emu::running(gpu, &most);
  return most;
}
