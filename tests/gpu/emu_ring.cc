/* The emulated CUDA module's kernel-mode launch: the real ring kernel
 * (kernels/cuda/ring_kernel.cuh) run by the SIMT emulator (simt_emu.h) on
 * the stream's thread, as the GPU would run it in stream order. */
#include "ring_kernel.cuh"
#include "simt_emu.h"

extern "C" int brg__emu_ring_run(const brg__rk_args *a, int channels, int threads) {
  return brg_simt_emu::launch((unsigned)channels, (unsigned)threads, [a] { brg_rk::run(*a); });
}
