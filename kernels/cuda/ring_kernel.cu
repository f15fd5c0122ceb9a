/* Kernel mode's launch: ring_kernel.cuh as __global__ kernels, one thread
 * block per channel. Each dtype and op is a kernel of its own, picked on
 * the host: each gets the registers its own path needs, and the compiler
 * handles fifty small functions instead of one that holds them all. */
#include <cuda_runtime.h>

#include "brg_cuda.h"
#include "ring_kernel.cuh"

namespace {

constexpr int MAX_THREADS = 512;

template <class D, int OP>
__global__ void __launch_bounds__(MAX_THREADS) ring_kernel(const brg__rk_args a) {
  brg_rk::run_op<D, OP>(a);
}

typedef void (*kernel_fn)(const brg__rk_args);

/* The bitwise ops' kernels exist for integer dtypes only. */
template <class D, int OP> constexpr kernel_fn bitwise_kernel() {
  if constexpr (D::integer)
    return ring_kernel<D, OP>;
  else
    return nullptr;
}

template <class D> struct ops {
  static constexpr kernel_fn fn[BRG_NUM_OPS] = {
      ring_kernel<D, BRG_SUM>,      ring_kernel<D, BRG_PROD>,     ring_kernel<D, BRG_MIN>,
      ring_kernel<D, BRG_MAX>,      ring_kernel<D, BRG_AVG>,      bitwise_kernel<D, BRG_BAND>(),
      bitwise_kernel<D, BRG_BOR>(), bitwise_kernel<D, BRG_BXOR>()};
};

/* The kernel of (dtype, op), NULL for values out of range. */
kernel_fn pick(int dtype, int op) {
  using namespace brg_ew;
  static_assert(BRG_SUM == 0 && BRG_PROD == 1 && BRG_MIN == 2 && BRG_MAX == 3 && BRG_AVG == 4 &&
                    BRG_BAND == 5 && BRG_BOR == 6 && BRG_BXOR == 7 && BRG_NUM_OPS == 8,
                "ops::fn lists the ops in brg_op's order");
  if (op < 0 || op >= BRG_NUM_OPS) return nullptr;
  switch (dtype) {
  case BRG_INT8: return ops<tag_i8>::fn[op];
  case BRG_UINT8: return ops<tag_u8>::fn[op];
  case BRG_INT32: return ops<tag_i32>::fn[op];
  case BRG_UINT32: return ops<tag_u32>::fn[op];
  case BRG_INT64: return ops<tag_i64>::fn[op];
  case BRG_UINT64: return ops<tag_u64>::fn[op];
  case BRG_FLOAT16: return ops<tag_f16>::fn[op];
  case BRG_BFLOAT16: return ops<tag_bf16>::fn[op];
  case BRG_FLOAT32: return ops<tag_f32>::fn[op];
  case BRG_FLOAT64: return ops<tag_f64>::fn[op];
  default: return nullptr;
  }
}

} // namespace

extern "C" int brg__cuda_ring_launch(const void *args, size_t args_bytes, int channels, int threads,
                                     void *stream) {
  if (args_bytes != sizeof(brg__rk_args) || channels < 1 || channels > BRG__RK_MAX_CHANNELS ||
      threads < 32 || threads > MAX_THREADS || threads % 32 != 0)
    return static_cast<int>(cudaErrorInvalidValue);
  const brg__rk_args *a = static_cast<const brg__rk_args *>(args);
  kernel_fn k = pick(a->dtype, a->op);
  if (!k) return static_cast<int>(cudaErrorInvalidValue);
  k<<<channels, threads, 0, static_cast<cudaStream_t>(stream)>>>(*a);
  return static_cast<int>(cudaGetLastError());
}

/* The fewest blocks of `threads` threads per SM over every (dtype, op)
 * kernel (each has its own registers), and the current device's SMs. */
extern "C" int brg__cuda_ring_occupancy(int threads, int *sms, int *blocks_per_sm) {
  if (threads < 32 || threads > MAX_THREADS || threads % 32 != 0)
    return static_cast<int>(cudaErrorInvalidValue);
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, dev);
  int fewest = -1;
  for (int dtype = 0; e == cudaSuccess && dtype < BRG_NUM_DTYPES; dtype++)
    for (int op = 0; e == cudaSuccess && op < BRG_NUM_OPS; op++) {
      kernel_fn k = pick(dtype, op);
      int n = 0;
      if (!k) continue;
      e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k, threads, 0);
      if (e == cudaSuccess && (fewest < 0 || n < fewest)) fewest = n;
    }
  if (e != cudaSuccess) return static_cast<int>(e);
  *blocks_per_sm = fewest < 0 ? 0 : fewest;
  return 0;
}
