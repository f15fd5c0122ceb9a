/* Kernel mode's launch: ring_kernel.cuh as a __global__ kernel, one thread
 * block per channel. */
#include <cuda_runtime.h>

#include "brg_cuda.h"
#include "ring_kernel.cuh"

namespace {

constexpr int MAX_THREADS = 512;

__global__ void __launch_bounds__(MAX_THREADS) ring_kernel(const brg__rk_args a) {
  brg_rk::run(a);
}

} // namespace

extern "C" int brg__cuda_ring_launch(const void *args, size_t args_bytes, int channels, int threads,
                                     void *stream) {
  if (args_bytes != sizeof(brg__rk_args) || channels < 1 || channels > BRG__RK_MAX_CHANNELS ||
      threads < 32 || threads > MAX_THREADS || threads % 32 != 0)
    return static_cast<int>(cudaErrorInvalidValue);
  const brg__rk_args *a = static_cast<const brg__rk_args *>(args);
  ring_kernel<<<channels, threads, 0, static_cast<cudaStream_t>(stream)>>>(*a);
  return static_cast<int>(cudaGetLastError());
}
