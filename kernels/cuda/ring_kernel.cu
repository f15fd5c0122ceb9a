/* Kernel mode's launch: the kernel of the collective's dtype and op, from
 * the tables of ring_kernel_dtype.cu's objects (one per dtype, built in
 * parallel), on the caller's stream, one thread block per channel. */
#include <cuda_runtime.h>

#include "brg_cuda.h"
#include "brigade.h"
#include "ring_kernel_table.h"

namespace {

using brg_rk_launch::kernel_fn;

/* The kernel of (dtype, op), NULL for values out of range. */
kernel_fn pick(int dtype, int op) {
  using namespace brg_rk_launch;
  if (op < 0 || op >= BRG_NUM_OPS) return nullptr;
  switch (dtype) {
  case BRG_INT8: return table_i8[op];
  case BRG_UINT8: return table_u8[op];
  case BRG_INT32: return table_i32[op];
  case BRG_UINT32: return table_u32[op];
  case BRG_INT64: return table_i64[op];
  case BRG_UINT64: return table_u64[op];
  case BRG_FLOAT16: return table_f16[op];
  case BRG_BFLOAT16: return table_bf16[op];
  case BRG_FLOAT32: return table_f32[op];
  case BRG_FLOAT64: return table_f64[op];
  default: return nullptr;
  }
}

} // namespace

/* Loads every (dtype, op) kernel on the current device (module.cu's
 * load_kernels). */
extern "C" int brg__cuda_ring_load(void) {
  for (int dt = 0; dt < BRG_NUM_DTYPES; dt++)
    for (int op = 0; op < BRG_NUM_OPS; op++) {
      kernel_fn k = pick(dt, op);
      cudaFuncAttributes at;
      cudaError_t e = k ? cudaFuncGetAttributes(&at, k) : cudaSuccess;
      if (e != cudaSuccess) return static_cast<int>(e);
    }
  return 0;
}

extern "C" int brg__cuda_ring_launch(const void *args, size_t args_bytes, int channels, int threads,
                                     void *stream) {
  using brg_rk_launch::MAX_THREADS;
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
  using brg_rk_launch::MAX_THREADS;
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
