/*
 * A small SIMT emulator: runs kernel-mode kernel source (kernels/cuda/
 * simt.cuh, ring_kernel.cuh) on the CPU, where there is no GPU.
 *
 * A launch of B blocks of T threads runs every block on an OS thread of its
 * own, so blocks run at the same time and really race, as on a GPU; the T
 * threads of a block are fibers (ucontext) of that OS thread, switched at
 * __syncthreads (brg_simt_sync: a fiber waits there until every live fiber
 * of its block has arrived) and whenever a thread spins on a flag
 * (brg_simt_pause). Flags and words are real atomics, so blocks of
 * different processes work together through shared memory as GPUs do
 * through CUDA IPC.
 *
 * What it cannot show: the weak ordering of a GPU's plain loads and stores
 * (the CPU is x86, whose stores are seen in order). What it does show: a
 * thread that reads before the flag that allows it, a flag posted before
 * the data it covers (brg_simt_store_release yields the OS thread after
 * every flag so readers on other blocks get to look at once), a barrier a
 * thread skips, and a wait that never ends.
 */
#ifndef BRG_SIMT_EMU_H
#define BRG_SIMT_EMU_H

#include <stdint.h>

#include <functional>

namespace brg_simt_emu {

/* Runs body in every thread of a grid of `blocks` blocks of `threads`
 * threads and returns once all have returned. 0 on success, -1 when the
 * threads or fiber stacks could not be made.
 *
 * Co-residency: with `slots` > 0, the launch runs on emulated GPU `gpu`
 * (0 to 7), which runs at most `slots` blocks at once across every launch
 * of this process on it, as a GPU runs at most SMs x blocks per SM; a
 * block starts once one has ended, in the order the launches asked for
 * them. Blocks that spin waiting for a block that cannot start then wait
 * for ever, as on a GPU. */
int launch(unsigned blocks, unsigned threads, const std::function<void()> &body, int gpu = -1,
           unsigned slots = 0);

/* Blocks of emulated GPU `gpu` running now, and the most that ran at once
 * since the process started (for tests). */
unsigned running(int gpu, unsigned *most);

/* What every launch of this process did so far, by BRG_SIMT_COUNT_*
 * (simt.cuh): spins, reads of host words, ... */
uint64_t count(int what);

/* How the counts tell host memory mapped for the GPU from GPU memory:
 * lookup(p, &lo, &hi) returns 1 for host memory, 0 for any other, and the
 * range [lo, hi) around p that is all of that kind (each block keeps a few
 * such ranges, so that a lookup runs once per range and launch). None set:
 * no access counts as host memory. */
typedef int (*host_lookup_fn)(const void *p, uintptr_t *lo, uintptr_t *hi);
void set_host_lookup(host_lookup_fn lookup);

/* On: a block that loaded words of host memory (not flags it waits on)
 * more than once per HOT_READ_SPINS spins of its threads, beyond
 * HOT_READ_LAUNCH a launch, stops the process with a message, as the
 * kernels must poll the host only that rarely. */
constexpr unsigned HOT_READ_SPINS = 1024, HOT_READ_LAUNCH = 4;
void set_hot_read_check(bool on);

} // namespace brg_simt_emu

#endif
