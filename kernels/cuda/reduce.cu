/*
 * CUDA reduce, copy and divide: the device forms of kernels.h.
 *
 * One element-wise kernel does all three. Each thread moves 16-byte vectors
 * (uint4) in a grid-stride loop, UNROLL of them in flight per input before
 * it computes, which is what a streaming kernel needs to keep HBM busy. The
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
#include "elem.h"

namespace {

constexpr int THREADS = 256;
constexpr int UNROLL = 4;
constexpr int MAX_BLOCKS_PER_SM = 8;

/* ---- element functions, one tag per dtype ------------------------------- */

#define BRG__TAG(t, Ty)                                                              \
  struct tag_##t {                                                                   \
    typedef Ty T;                                                                    \
    template <int OP>                                                                \
    static __device__ __forceinline__ T op(T a, T b, int d) {                        \
      if constexpr (OP == BRG_SUM) return brg__##t##_sum(a, b);                      \
      else if constexpr (OP == BRG_PROD) return brg__##t##_prod(a, b);               \
      else if constexpr (OP == BRG_MIN) return brg__##t##_min(a, b);                 \
      else if constexpr (OP == BRG_MAX) return brg__##t##_max(a, b);                 \
      else return brg__##t##_avg(a, b, d);                                           \
    }                                                                                \
    static __device__ __forceinline__ T div(T x, int d) { return brg__##t##_div(x, d); } \
  };

BRG__TAG(i8, int8_t)
BRG__TAG(u8, uint8_t)
BRG__TAG(i32, int32_t)
BRG__TAG(u32, uint32_t)
BRG__TAG(i64, int64_t)
BRG__TAG(u64, uint64_t)
BRG__TAG(f16, uint16_t)
BRG__TAG(bf16, uint16_t)
BRG__TAG(f32, float)
BRG__TAG(f64, double)
#undef BRG__TAG

/* What the element-wise kernel computes: out = F::apply(a, b, d). */
template <class D, int OP>
struct reduce_fn {
  typedef typename D::T T;
  static constexpr bool binary = true;
  static __device__ __forceinline__ T apply(T a, T b, int d) { return D::template op<OP>(a, b, d); }
};
template <class D>
struct divide_fn {
  typedef typename D::T T;
  static constexpr bool binary = false;
  static __device__ __forceinline__ T apply(T a, T, int d) { return D::div(a, d); }
};
struct copy_fn {
  typedef uint8_t T;
  static constexpr bool binary = false;
  static __device__ __forceinline__ T apply(T a, T, int) { return a; }
};

template <typename T>
union vec16 {
  uint4 v;
  T e[16 / sizeof(T)];
};

/* ---- the kernel --------------------------------------------------------- */

template <class F>
__global__ void __launch_bounds__(THREADS)
elementwise(typename F::T *d0, typename F::T *d1, const typename F::T *a,
            const typename F::T *b, size_t n, size_t head, size_t nvec, int div) {
  typedef typename F::T T;
  constexpr int V = 16 / sizeof(T);
  const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  const size_t nthreads = (size_t)gridDim.x * blockDim.x;

  const uint4 *va = reinterpret_cast<const uint4 *>(a + head);
  const uint4 *vb = reinterpret_cast<const uint4 *>(b + head);
  uint4 *v0 = reinterpret_cast<uint4 *>(d0 + head);
  uint4 *v1 = reinterpret_cast<uint4 *>(d1 + head);
  for (size_t base = tid; base < nvec; base += nthreads * UNROLL) {
    vec16<T> x[UNROLL], y[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; u++) {
      size_t i = base + (size_t)u * nthreads;
      if (i < nvec) {
        x[u].v = va[i];
        if constexpr (F::binary) y[u].v = vb[i];
      }
    }
#pragma unroll
    for (int u = 0; u < UNROLL; u++) {
      size_t i = base + (size_t)u * nthreads;
      if (i < nvec) {
#pragma unroll
        for (int k = 0; k < V; k++)
          x[u].e[k] = F::apply(x[u].e[k], F::binary ? y[u].e[k] : x[u].e[k], div);
        v0[i] = x[u].v;
        if (d1) v1[i] = x[u].v;
      }
    }
  }

  /* Head and tail, or everything when the pointers are not co-aligned. */
  const size_t body = nvec * V, rest = n - head - body;
  for (size_t j = tid; j < head + rest; j += nthreads) {
    size_t i = j < head ? j : j + body;
    T r = F::apply(a[i], F::binary ? b[i] : a[i], div);
    d0[i] = r;
    if (d1) d1[i] = r;
  }
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
  constexpr size_t V = 16 / sizeof(T);
  if (n == 0) return cudaSuccess;
  T *d0 = static_cast<T *>(dst0), *d1 = static_cast<T *>(dst1);
  const T *a = static_cast<const T *>(src0);
  const T *b = F::binary ? static_cast<const T *>(src1) : a;

  uintptr_t mis = reinterpret_cast<uintptr_t>(a) & 15;
  bool aligned = (reinterpret_cast<uintptr_t>(d0) & 15) == mis &&
                 (!d1 || (reinterpret_cast<uintptr_t>(d1) & 15) == mis) &&
                 (reinterpret_cast<uintptr_t>(b) & 15) == mis && mis % sizeof(T) == 0;
  size_t head = 0, nvec = 0;
  if (aligned) {
    head = mis ? (16 - mis) / sizeof(T) : 0;
    if (head > n) head = n;
    nvec = (n - head) / V;
  }
  /* A grid of exactly the blocks that fit on the device at once: a partial
   * second wave would leave the device mostly idle while it runs. */
  static int per_sm;
  int fit = __atomic_load_n(&per_sm, __ATOMIC_RELAXED);
  if (fit == 0) {
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, elementwise<F>, THREADS, 0) !=
            cudaSuccess || fit <= 0)
      fit = 1;
    if (fit > MAX_BLOCKS_PER_SM) fit = MAX_BLOCKS_PER_SM;
    __atomic_store_n(&per_sm, fit, __ATOMIC_RELAXED);
  }
  size_t work = nvec ? (nvec + UNROLL - 1) / UNROLL : n;
  size_t blocks = (work + THREADS - 1) / THREADS;
  size_t max_blocks = (size_t)sm_count() * (size_t)fit;
  if (blocks > max_blocks) blocks = max_blocks;
  if (blocks == 0) blocks = 1;
  elementwise<F><<<(unsigned)blocks, THREADS, 0, static_cast<cudaStream_t>(stream)>>>(
      d0, d1, a, b, n, head, nvec, div);
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
  return cudaErrorInvalidValue;
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
