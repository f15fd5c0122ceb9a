/*
 * The element-wise kernel of reduce.cu, as host-and-device code: the
 * functors for every (dtype, op), the split of a call into a scalar head,
 * a body of 16-byte vectors and a scalar tail, and what one thread of the
 * grid does. reduce.cu wraps it in a __global__ kernel; the CPU test
 * tests/gpu/test_elementwise_emu.cc runs every thread of a grid in turn on
 * the host, so the indexing and the vector arithmetic are checked on
 * machines without a GPU.
 *
 *   [ head | vector body: nvec x 16 bytes ............ | tail ]
 *     scalar                                              scalar
 */
#ifndef BRG_ELEMENTWISE_CUH
#define BRG_ELEMENTWISE_CUH

#include <stddef.h>
#include <stdint.h>

#if defined(__CUDACC__)
#include <cuda_runtime.h>
#define BRG__EW_HD __host__ __device__ __forceinline__
typedef uint4 brg__vec16_bits;
#else
#define BRG__EW_HD inline
struct alignas(16) brg__vec16_bits {
  uint32_t x, y, z, w;
};
#endif

#include "brigade.h"
#include "elem.h"

/* Unrolled on the device; host passes (nvcc's own and the CPU test's) do
 * not know the pragma. */
#if defined(__CUDA_ARCH__)
#define BRG__EW_UNROLL _Pragma("unroll")
#else
#define BRG__EW_UNROLL
#endif

namespace brg_ew {

constexpr int UNROLL = 4; /* 16-byte vectors in flight per input and thread */

/* ---- element functions, one tag per dtype ------------------------------- */

/* INT: whether the dtype has the bitwise ops (integers only). */
#define BRG__TAG(t, Ty, INT)                                                                       \
  struct tag_##t {                                                                                 \
    typedef Ty T;                                                                                  \
    static constexpr bool integer = INT;                                                           \
    template <int OP> static BRG__EW_HD T op(T a, T b, int d) {                                    \
      if constexpr (OP == BRG_SUM)                                                                 \
        return brg__##t##_sum(a, b);                                                               \
      else if constexpr (OP == BRG_PROD)                                                           \
        return brg__##t##_prod(a, b);                                                              \
      else if constexpr (OP == BRG_MIN)                                                            \
        return brg__##t##_min(a, b);                                                               \
      else if constexpr (OP == BRG_MAX)                                                            \
        return brg__##t##_max(a, b);                                                               \
      else if constexpr (OP == BRG_AVG)                                                            \
        return brg__##t##_avg(a, b, d);                                                            \
      else                                                                                         \
        return bitwise<OP>(a, b);                                                                  \
    }                                                                                              \
    static BRG__EW_HD T div(T x, int d) { return brg__##t##_div(x, d); }                           \
  };

/* The bits of a and b combined; integer types only (the API refuses the
 * bitwise ops with floating-point dtypes, and no kernel is made for them). */
template <int OP, class T> static BRG__EW_HD T bitwise(T a, T b) {
  if constexpr (OP == BRG_BAND)
    return (T)(a & b);
  else if constexpr (OP == BRG_BOR)
    return (T)(a | b);
  else
    return (T)(a ^ b);
}

BRG__TAG(i8, int8_t, true)
BRG__TAG(u8, uint8_t, true)
BRG__TAG(i32, int32_t, true)
BRG__TAG(u32, uint32_t, true)
BRG__TAG(i64, int64_t, true)
BRG__TAG(u64, uint64_t, true)
BRG__TAG(f16, uint16_t, false)
BRG__TAG(bf16, uint16_t, false)
BRG__TAG(f32, float, false)
BRG__TAG(f64, double, false)
#undef BRG__TAG

/* What the element-wise kernel computes: out = F::apply(a, b, d). */
template <class D, int OP> struct reduce_fn {
  typedef typename D::T T;
  static constexpr bool binary = true;
  static BRG__EW_HD T apply(T a, T b, int d) { return D::template op<OP>(a, b, d); }
};
template <class D> struct divide_fn {
  typedef typename D::T T;
  static constexpr bool binary = false;
  static BRG__EW_HD T apply(T a, T, int d) { return D::div(a, d); }
};
struct copy_fn {
  typedef uint8_t T;
  static constexpr bool binary = false;
  static BRG__EW_HD T apply(T a, T, int) { return a; }
};

template <typename T> union vec16 {
  brg__vec16_bits v;
  T e[16 / sizeof(T)];
};

/* The split of one call. When every pointer sits at the same offset from a
 * 16-byte boundary, `head` elements are peeled until they reach it and
 * `nvec` vectors follow; otherwise everything is scalar (nvec = 0). */
struct plan {
  size_t head, nvec;
};

/* Whether every pointer sits at the same offset from a 16-byte boundary,
 * a whole number of elements of T from it: the vector path's condition. */
template <typename T>
BRG__EW_HD bool coaligned(const void *d0, const void *d1, const void *a, const void *b) {
  uintptr_t mis = reinterpret_cast<uintptr_t>(a) & 15;
  return (reinterpret_cast<uintptr_t>(d0) & 15) == mis &&
         (!d1 || (reinterpret_cast<uintptr_t>(d1) & 15) == mis) &&
         (reinterpret_cast<uintptr_t>(b) & 15) == mis && mis % sizeof(T) == 0;
}

template <typename T>
BRG__EW_HD plan make_plan(const void *d0, const void *d1, const void *a, const void *b, size_t n) {
  constexpr size_t V = 16 / sizeof(T);
  plan p = {0, 0};
  uintptr_t mis = reinterpret_cast<uintptr_t>(a) & 15;
  if (coaligned<T>(d0, d1, a, b)) {
    p.head = mis ? (16 - mis) / sizeof(T) : 0;
    if (p.head > n) p.head = n;
    p.nvec = (n - p.head) / V;
  }
  return p;
}

/* Blocks of `threads` for one call: one round of UNROLL vectors (or one
 * element, on the scalar path) per thread, but at most `fit`, the blocks
 * the device runs at once, and at most `bound` (set_max_blocks). */
BRG__EW_HD size_t grid_blocks(plan p, size_t n, size_t threads, size_t fit, size_t bound) {
  size_t work = p.nvec ? (p.nvec + UNROLL - 1) / UNROLL : n;
  size_t blocks = (work + threads - 1) / threads;
  if (blocks > fit) blocks = fit;
  if (blocks > bound) blocks = bound;
  return blocks ? blocks : 1;
}

/* x = x (op) y on every element of a vector (y unused for unary F). */
template <class F>
BRG__EW_HD void apply_vec(vec16<typename F::T> &x, const vec16<typename F::T> &y, int div) {
  constexpr int V = 16 / sizeof(typename F::T);
  BRG__EW_UNROLL
  for (int k = 0; k < V; k++) {
    if constexpr (F::binary)
      x.e[k] = F::apply(x.e[k], y.e[k], div);
    else
      x.e[k] = F::apply(x.e[k], x.e[k], div);
  }
}

/* Thread `tid` of `nthreads`: a grid-stride loop over the vectors, UNROLL
 * loads of each input in flight before any arithmetic, then the scalar
 * head and tail spread over the threads. Destinations may alias a source
 * exactly: every element is read once, by the thread that writes it. */
template <class F>
BRG__EW_HD void thread_body(size_t tid, size_t nthreads, typename F::T *d0, typename F::T *d1,
                            const typename F::T *a, const typename F::T *b, size_t n, plan p,
                            int div) {
  typedef typename F::T T;
  constexpr int V = 16 / sizeof(T);
  const brg__vec16_bits *va = reinterpret_cast<const brg__vec16_bits *>(a + p.head);
  const brg__vec16_bits *vb = reinterpret_cast<const brg__vec16_bits *>(b + p.head);
  brg__vec16_bits *v0 = reinterpret_cast<brg__vec16_bits *>(d0 + p.head);
  brg__vec16_bits *v1 = d1 ? reinterpret_cast<brg__vec16_bits *>(d1 + p.head) : nullptr;
  size_t i = tid;
  /* Full rounds: UNROLL vectors of each input loaded before any arithmetic. */
  for (; i + (UNROLL - 1) * nthreads < p.nvec; i += UNROLL * nthreads) {
    vec16<T> x[UNROLL], y[UNROLL];
    BRG__EW_UNROLL
    for (int u = 0; u < UNROLL; u++) {
      x[u].v = va[i + u * nthreads];
      if constexpr (F::binary) y[u].v = vb[i + u * nthreads];
    }
    BRG__EW_UNROLL
    for (int u = 0; u < UNROLL; u++) {
      apply_vec<F>(x[u], y[u], div);
      v0[i + u * nthreads] = x[u].v;
      if (v1) v1[i + u * nthreads] = x[u].v;
    }
  }
  /* The last, partial round: fewer than UNROLL vectors, one at a time. */
  for (; i < p.nvec; i += nthreads) {
    vec16<T> x, y;
    x.v = va[i];
    if constexpr (F::binary)
      y.v = vb[i];
    else
      y.v = x.v;
    apply_vec<F>(x, y, div);
    v0[i] = x.v;
    if (v1) v1[i] = x.v;
  }

  /* Head and tail, or everything when the pointers are not co-aligned. */
  const size_t body = p.nvec * V, rest = n - p.head - body;
  for (size_t j = tid; j < p.head + rest; j += nthreads) {
    size_t i = j < p.head ? j : j + body;
    T r = F::apply(a[i], F::binary ? b[i] : a[i], div);
    d0[i] = r;
    if (d1) d1[i] = r;
  }
}

} // namespace brg_ew

#endif /* BRG_ELEMENTWISE_CUH */
