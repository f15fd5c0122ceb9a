/*
 * CUDA reduce, copy and divide: the device forms of kernels.h.
 *
 * One element-wise kernel does all three (elementwise.cuh). Each thread
 * moves 16-byte vectors (uint4) in a grid-stride loop, UNROLL of them in
 * flight per input before it computes, which is what a streaming kernel
 * needs to keep HBM busy. The
 * element arithmetic is elem.h's, the same inline functions the CPU kernels
 * call, so both produce the same bits (nvcc keeps IEEE division and does
 * not contract these expressions into FMAs: there is no a*b+c in them).
 *
 *   [ head | vector body: nvec x 16 bytes ............ | tail ]
 *     scalar                                              scalar
 *
 * The head peels elements until the pointers reach a 16-byte boundary; when
 * the pointers sit at different offsets from 16 bytes, everything takes the
 * scalar loop (correct, slower).
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>

#include "brigade.h"
#include "brg_cuda.h"
#include "elementwise.cuh"

namespace {

using namespace brg_ew;

constexpr int THREADS = 256;
constexpr int MAX_BLOCKS_PER_SM = 8;

/* set_max_blocks (BRIGADE_DEVICE_BLOCKS): the bound on every grid. */
int max_grid = 32;

template <class F>
__global__ void __launch_bounds__(THREADS)
    elementwise(typename F::T *d0, typename F::T *d1, const typename F::T *a,
                const typename F::T *b, size_t n, plan p, int div) {
  thread_body<F>((size_t)blockIdx.x * blockDim.x + threadIdx.x, (size_t)gridDim.x * blockDim.x, d0,
                 d1, a, b, n, p, div);
}

/* Multiprocessors of each device, read once. */
int sm_count(void) {
  static int cached[64];
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 32;
  int n = __atomic_load_n(&cached[dev], __ATOMIC_RELAXED);
  if (n == 0) {
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0)
      n = 32;
    __atomic_store_n(&cached[dev], n, __ATOMIC_RELAXED);
  }
  return n;
}

template <class F>
int launch(void *dst0, void *dst1, const void *src0, const void *src1, size_t n, int div,
           void *stream) {
  typedef typename F::T T;
  if (n == 0) return cudaSuccess;
  T *d0 = static_cast<T *>(dst0), *d1 = static_cast<T *>(dst1);
  const T *a = static_cast<const T *>(src0);
  const T *b = F::binary ? static_cast<const T *>(src1) : a;

  plan p = make_plan<T>(d0, d1, a, b, n);
  /* At most the blocks that fit on the device at once (a partial second
   * wave would leave the device mostly idle while it runs), and at most
   * max_grid: the training computation beside a collective needs the rest. */
  static int per_sm;
  int fit = __atomic_load_n(&per_sm, __ATOMIC_RELAXED);
  if (fit == 0) {
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, elementwise<F>, THREADS, 0) !=
            cudaSuccess ||
        fit <= 0)
      fit = 1;
    if (fit > MAX_BLOCKS_PER_SM) fit = MAX_BLOCKS_PER_SM;
    __atomic_store_n(&per_sm, fit, __ATOMIC_RELAXED);
  }
  size_t blocks = grid_blocks(p, n, THREADS, (size_t)sm_count() * (size_t)fit,
                              (size_t)__atomic_load_n(&max_grid, __ATOMIC_RELAXED));
  elementwise<F><<<(unsigned)blocks, THREADS, 0, static_cast<cudaStream_t>(stream)>>>(d0, d1, a, b,
                                                                                      n, p, div);
  return cudaGetLastError();
}

template <class D>
int reduce_dtype(void *d0, void *d1, const void *a, const void *b, size_t n, int op, int div,
                 void *stream) {
  switch (op) {
  case BRG_SUM: return launch<reduce_fn<D, BRG_SUM>>(d0, d1, a, b, n, div, stream);
  case BRG_PROD: return launch<reduce_fn<D, BRG_PROD>>(d0, d1, a, b, n, div, stream);
  case BRG_MIN: return launch<reduce_fn<D, BRG_MIN>>(d0, d1, a, b, n, div, stream);
  case BRG_MAX: return launch<reduce_fn<D, BRG_MAX>>(d0, d1, a, b, n, div, stream);
  case BRG_AVG: return launch<reduce_fn<D, BRG_AVG>>(d0, d1, a, b, n, div, stream);
  }
  if constexpr (D::integer) {
    switch (op) {
    case BRG_BAND: return launch<reduce_fn<D, BRG_BAND>>(d0, d1, a, b, n, div, stream);
    case BRG_BOR: return launch<reduce_fn<D, BRG_BOR>>(d0, d1, a, b, n, div, stream);
    case BRG_BXOR: return launch<reduce_fn<D, BRG_BXOR>>(d0, d1, a, b, n, div, stream);
    }
  }
  return cudaErrorInvalidValue;
}

/* Loads the element-wise kernels of dtype D (module.cu's load_kernels). */
template <class F> cudaError_t load_one() {
  cudaFuncAttributes at;
  return cudaFuncGetAttributes(&at, elementwise<F>);
}

template <class D> cudaError_t load_dtype() {
  cudaError_t e = load_one<reduce_fn<D, BRG_SUM>>();
  if (e == cudaSuccess) e = load_one<reduce_fn<D, BRG_PROD>>();
  if (e == cudaSuccess) e = load_one<reduce_fn<D, BRG_MIN>>();
  if (e == cudaSuccess) e = load_one<reduce_fn<D, BRG_MAX>>();
  if (e == cudaSuccess) e = load_one<reduce_fn<D, BRG_AVG>>();
  if (e == cudaSuccess) e = load_one<divide_fn<D>>();
  if constexpr (D::integer) {
    if (e == cudaSuccess) e = load_one<reduce_fn<D, BRG_BAND>>();
    if (e == cudaSuccess) e = load_one<reduce_fn<D, BRG_BOR>>();
    if (e == cudaSuccess) e = load_one<reduce_fn<D, BRG_BXOR>>();
  }
  return e;
}

} // namespace

/* ---- entry points (C linkage, used by module.cu's table) ---------------- */

extern "C" int brg__cuda_reduce(void *d0, void *d1, const void *a, const void *b, size_t n,
                                int dtype, int op, int div, void *stream) {
  switch (dtype) {
  case BRG_INT8: return reduce_dtype<tag_i8>(d0, d1, a, b, n, op, div, stream);
  case BRG_UINT8: return reduce_dtype<tag_u8>(d0, d1, a, b, n, op, div, stream);
  case BRG_INT32: return reduce_dtype<tag_i32>(d0, d1, a, b, n, op, div, stream);
  case BRG_UINT32: return reduce_dtype<tag_u32>(d0, d1, a, b, n, op, div, stream);
  case BRG_INT64: return reduce_dtype<tag_i64>(d0, d1, a, b, n, op, div, stream);
  case BRG_UINT64: return reduce_dtype<tag_u64>(d0, d1, a, b, n, op, div, stream);
  case BRG_FLOAT16: return reduce_dtype<tag_f16>(d0, d1, a, b, n, op, div, stream);
  case BRG_BFLOAT16: return reduce_dtype<tag_bf16>(d0, d1, a, b, n, op, div, stream);
  case BRG_FLOAT32: return reduce_dtype<tag_f32>(d0, d1, a, b, n, op, div, stream);
  case BRG_FLOAT64: return reduce_dtype<tag_f64>(d0, d1, a, b, n, op, div, stream);
  }
  return cudaErrorInvalidValue;
}

extern "C" int brg__cuda_divide(void *d, const void *s, size_t n, int dtype, int div,
                                void *stream) {
  switch (dtype) {
  case BRG_INT8: return launch<divide_fn<tag_i8>>(d, NULL, s, NULL, n, div, stream);
  case BRG_UINT8: return launch<divide_fn<tag_u8>>(d, NULL, s, NULL, n, div, stream);
  case BRG_INT32: return launch<divide_fn<tag_i32>>(d, NULL, s, NULL, n, div, stream);
  case BRG_UINT32: return launch<divide_fn<tag_u32>>(d, NULL, s, NULL, n, div, stream);
  case BRG_INT64: return launch<divide_fn<tag_i64>>(d, NULL, s, NULL, n, div, stream);
  case BRG_UINT64: return launch<divide_fn<tag_u64>>(d, NULL, s, NULL, n, div, stream);
  case BRG_FLOAT16: return launch<divide_fn<tag_f16>>(d, NULL, s, NULL, n, div, stream);
  case BRG_BFLOAT16: return launch<divide_fn<tag_bf16>>(d, NULL, s, NULL, n, div, stream);
  case BRG_FLOAT32: return launch<divide_fn<tag_f32>>(d, NULL, s, NULL, n, div, stream);
  case BRG_FLOAT64: return launch<divide_fn<tag_f64>>(d, NULL, s, NULL, n, div, stream);
  }
  return cudaErrorInvalidValue;
}

extern "C" int brg__cuda_set_max_blocks(int blocks) {
  if (blocks < 1 || blocks > 1024) return cudaErrorInvalidValue;
  __atomic_store_n(&max_grid, blocks, __ATOMIC_RELAXED);
  return cudaSuccess;
}

/* One destination is what the copy engine does best; two take the kernel,
 * which reads the source once. */
extern "C" int brg__cuda_copy(void *d0, void *d1, const void *s, size_t bytes, void *stream) {
  if (bytes == 0) return cudaSuccess;
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  if (!d1) return d0 == s ? cudaSuccess : cudaMemcpyAsync(d0, s, bytes, cudaMemcpyDefault, st);
  if (d0 == s) return cudaMemcpyAsync(d1, s, bytes, cudaMemcpyDefault, st);
  if (d1 == s) return cudaMemcpyAsync(d0, s, bytes, cudaMemcpyDefault, st);
  return launch<copy_fn>(d0, d1, s, NULL, bytes, 0, stream);
}

/* ---- casts for the gradient reducer's compression hooks ---- */

namespace {

__device__ inline uint16_t to_half(float f, int half) {
  return half == BRG_FLOAT16 ? brg__f32_to_f16(f) : brg__f32_to_bf16(f);
}
__device__ inline float from_half(uint16_t h, int half) {
  return half == BRG_FLOAT16 ? brg__f16_to_f32(h) : brg__bf16_to_f32(h);
}

__global__ void __launch_bounds__(THREADS)
    cast_kernel(void *dst, int dt, const void *src, int st, size_t n, float scale) {
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    if (st == BRG_FLOAT32)
      static_cast<uint16_t *>(dst)[i] = to_half(static_cast<const float *>(src)[i] * scale, dt);
    else if (st == BRG_FLOAT64)
      static_cast<uint16_t *>(dst)[i] =
          to_half((float)(static_cast<const double *>(src)[i] * (double)scale), dt);
    else if (dt == BRG_FLOAT32)
      static_cast<float *>(dst)[i] = from_half(static_cast<const uint16_t *>(src)[i], st);
    else
      static_cast<double *>(dst)[i] = from_half(static_cast<const uint16_t *>(src)[i], st);
  }
}

bool is_half(int d) {
  return d == BRG_FLOAT16 || d == BRG_BFLOAT16;
}
bool is_wide(int d) {
  return d == BRG_FLOAT32 || d == BRG_FLOAT64;
}

} // namespace

extern "C" int brg__cuda_cast(void *dst, int dst_dtype, const void *src, int src_dtype, size_t n,
                              float scale, void *stream) {
  if (!((is_wide(src_dtype) && is_half(dst_dtype)) || (is_half(src_dtype) && is_wide(dst_dtype))))
    return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  size_t blocks = (n + THREADS - 1) / THREADS,
         cap = (size_t)__atomic_load_n(&max_grid, __ATOMIC_RELAXED);
  if (blocks > cap) blocks = cap;
  cast_kernel<<<(unsigned)blocks, THREADS, 0, static_cast<cudaStream_t>(stream)>>>(
      dst, dst_dtype, src, src_dtype, n, scale);
  return cudaGetLastError();
}

namespace {

__global__ void busy_kernel(unsigned long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}

} // namespace

extern "C" int brg__cuda_busy(unsigned us, void *stream) {
  busy_kernel<<<1, 32, 0, static_cast<cudaStream_t>(stream)>>>(1000ull * us);
  return cudaGetLastError();
}

/* Every kernel of this file on the current device, loaded. */
extern "C" int brg__cuda_elementwise_load(void) {
  cudaError_t e = load_dtype<tag_i8>();
  if (e == cudaSuccess) e = load_dtype<tag_u8>();
  if (e == cudaSuccess) e = load_dtype<tag_i32>();
  if (e == cudaSuccess) e = load_dtype<tag_u32>();
  if (e == cudaSuccess) e = load_dtype<tag_i64>();
  if (e == cudaSuccess) e = load_dtype<tag_u64>();
  if (e == cudaSuccess) e = load_dtype<tag_f16>();
  if (e == cudaSuccess) e = load_dtype<tag_bf16>();
  if (e == cudaSuccess) e = load_dtype<tag_f32>();
  if (e == cudaSuccess) e = load_dtype<tag_f64>();
  if (e == cudaSuccess) e = load_one<copy_fn>();
  cudaFuncAttributes at;
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&at, cast_kernel);
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&at, busy_kernel);
  return static_cast<int>(e);
}
