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
 * threads or fiber stacks could not be made. */
int launch(unsigned blocks, unsigned threads, const std::function<void()> &body);

/* What every launch of this process did so far, by BRG_SIMT_COUNT_*
 * (simt.cuh): spins, reads of host words, ... */
uint64_t count(int what);

} // namespace brg_simt_emu

#endif
