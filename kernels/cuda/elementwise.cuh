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
#include "pair.cuh"

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

/* ---- whole 32-bit words at once ---------------------------------------- */

/* The vector body may compute a word of elements at a time: word_op<D, OP>
 * (and div_word<D> for the final divide) says whether it does (`on`) and
 * how (`apply`, given the word of each input, the divisor and what
 * `prepare` made of the divisor once per thread). The result is the bits
 * the element functions above give, element by element. */
template <class D, int OP> struct word_op { static constexpr bool on = false; };
template <class D> struct div_word { static constexpr bool on = false; };

/* Each NaN half of a word made the canonical NaN CANON (0x7fff, what the
 * device's packed ops give, is not elem.h's canonical NaN). A half is NaN
 * when its bits without the sign exceed INF: adding 0x8000 - (INF + 1)
 * carries into the half's top bit exactly then. */
template <uint32_t INF, uint32_t CANON> BRG__EW_HD uint32_t canonical_nan(uint32_t x) {
  uint32_t nan = ((x & 0x7fff7fffu) + (0x8000u - (INF + 1)) * 0x10001u) & 0x80008000u;
  uint32_t mask = (nan >> 15) * 0xffffu;
  return x ^ ((x ^ (CANON * 0x10001u)) & mask);
}

/* float16 and bfloat16: two elements per packed instruction (pair.cuh says
 * why they give elem.h's bits). AVG adds packed and divides each half as
 * elem.h does, in float32: no packed division gives the same number. */
#define BRG__PAIR_WORD_OP(t, INF, CANON)                                                           \
  template <int OP> struct word_op<tag_##t, OP> {                                                  \
    static constexpr bool on =                                                                     \
        OP == BRG_SUM || OP == BRG_PROD || OP == BRG_MIN || OP == BRG_MAX || OP == BRG_AVG;        \
    static BRG__EW_HD uint32_t prepare(int) { return 0; }                                          \
    static BRG__EW_HD uint32_t apply(uint32_t a, uint32_t b, int d, uint32_t) {                    \
      if constexpr (OP == BRG_SUM)                                                                 \
        return canonical_nan<INF, CANON>(brg_pair::t##_add(a, b));                                 \
      else if constexpr (OP == BRG_PROD)                                                           \
        return canonical_nan<INF, CANON>(brg_pair::t##_mul(a, b));                                 \
      else if constexpr (OP == BRG_MIN)                                                            \
        return canonical_nan<INF, CANON>(brg_pair::t##_min(a, b));                                 \
      else if constexpr (OP == BRG_MAX)                                                            \
        return canonical_nan<INF, CANON>(brg_pair::t##_max(a, b));                                 \
      else {                                                                                       \
        uint32_t s = brg_pair::t##_add(a, b); /* a NaN half stays NaN in the division */           \
        return (uint32_t)brg__##t##_div((uint16_t)s, d) |                                          \
               (uint32_t)brg__##t##_div((uint16_t)(s >> 16), d) << 16;                             \
      }                                                                                            \
    }                                                                                              \
  };
#if BRG_PAIR_F16
BRG__PAIR_WORD_OP(f16, 0x7c00u, BRG_F16_CANONICAL_NAN)
#endif
#if BRG_PAIR_BF16
BRG__PAIR_WORD_OP(bf16, 0x7f80u, BRG_BF16_CANONICAL_NAN)
#endif
#undef BRG__PAIR_WORD_OP

/* int8 and uint8 AVG and divide: four lanes of a word in int32 registers.
 * The division of a lane (|s| <= 255, C division truncating toward zero)
 * is a multiplication: with m = 2^16 / d + 1, (|s| * m) >> 16 = |s| / d
 * for every |s| < 256 and d >= 1, as |s| * m / 2^16 exceeds |s| / d by
 * less than 1/256, and the fraction of |s| / d stays below 1 - 1/d (for
 * d < 256; for d >= 256 the quotient is 0 and |s| * m / 2^16 < 1). */
BRG__EW_HD uint32_t byte_divisor(int d) {
  return 65536u / (uint32_t)d + 1u;
}
/* The four lanes of `s` divided by the divisor m stands for. */
template <bool SIGNED> BRG__EW_HD uint32_t div_bytes(uint32_t s, uint32_t m) {
  uint32_t r = 0;
#if !defined(__CUDA_ARCH__)
  brg_pair::count_word();
#endif
  BRG__EW_UNROLL
  for (int k = 0; k < 32; k += 8) {
    if constexpr (SIGNED) {
      int32_t v = (int32_t)(s << (24 - k)) >> 24;
      uint32_t q = ((uint32_t)(v < 0 ? -v : v) * m) >> 16;
      r |= ((v < 0 ? 0u - q : q) & 0xffu) << k;
    } else {
      r |= ((((s >> k) & 0xffu) * m) >> 16) << k;
    }
  }
  return r;
}
/* Lane-wise sum of four bytes, wrapping in each lane. */
BRG__EW_HD uint32_t add_bytes(uint32_t a, uint32_t b) {
  return ((a & 0x7f7f7f7fu) + (b & 0x7f7f7f7fu)) ^ ((a ^ b) & 0x80808080u);
}
#define BRG__BYTE_WORD_OP(t, SIGNED)                                                               \
  template <int OP> struct word_op<tag_##t, OP> {                                                  \
    static constexpr bool on = OP == BRG_AVG;                                                      \
    static BRG__EW_HD uint32_t prepare(int d) { return byte_divisor(d); }                          \
    static BRG__EW_HD uint32_t apply(uint32_t a, uint32_t b, int, uint32_t m) {                    \
      return div_bytes<SIGNED>(add_bytes(a, b), m);                                                \
    }                                                                                              \
  };                                                                                               \
  template <> struct div_word<tag_##t> {                                                           \
    static constexpr bool on = true;                                                               \
    static BRG__EW_HD uint32_t prepare(int d) { return byte_divisor(d); }                          \
    static BRG__EW_HD uint32_t apply(uint32_t a, uint32_t, int, uint32_t m) {                      \
      return div_bytes<SIGNED>(a, m);                                                              \
    }                                                                                              \
  };
BRG__BYTE_WORD_OP(i8, true)
BRG__BYTE_WORD_OP(u8, false)
#undef BRG__BYTE_WORD_OP

/* What the element-wise kernel computes: out = F::apply(a, b, d), or a
 * word at a time where F::words. */
template <class D, int OP> struct reduce_fn {
  typedef typename D::T T;
  typedef word_op<D, OP> W;
  static constexpr bool binary = true;
  static constexpr bool words = W::on;
  static BRG__EW_HD T apply(T a, T b, int d) { return D::template op<OP>(a, b, d); }
};
template <class D> struct divide_fn {
  typedef typename D::T T;
  typedef div_word<D> W;
  static constexpr bool binary = false;
  static constexpr bool words = W::on;
  static BRG__EW_HD T apply(T a, T, int d) { return D::div(a, d); }
};
struct copy_fn {
  typedef uint8_t T;
  typedef div_word<void> W;
  static constexpr bool binary = false;
  static constexpr bool words = false;
  static BRG__EW_HD T apply(T a, T, int) { return a; }
};

template <typename T> union vec16 {
  brg__vec16_bits v;
  T e[16 / sizeof(T)];
};

/* The split of one call, around the first destination d0: `head`
 * elements are peeled until d0 reaches a 16-byte boundary, `nvec` aligned
 * 16-byte vectors follow, then the tail. A source at another offset from a
 * 16-byte boundary than d0 (a buffer aligned differently, or a slot and a
 * buffer) is read shifted: each vector from the two aligned vectors that
 * hold it (load16), `sa` and `sb` bytes past their start, so that no
 * pairing of pointers falls back to the element loop. Every aligned
 * vector read lies inside its source (a shifted source's first vector may
 * wait one vector longer, its last end one sooner). Only a second
 * destination at another offset than d0, or a d0 not on an element
 * boundary, leaves everything to the element loop (nvec = 0). */
struct plan {
  size_t head, nvec;
  unsigned sa, sb; /* bytes of a and b past a 16-byte boundary, where d0 is on one */
};

/* Whether every pointer sits at the same offset from a 16-byte boundary,
 * a whole number of elements of T from it: no source needs a shift. */
template <typename T>
BRG__EW_HD bool coaligned(const void *d0, const void *d1, const void *a, const void *b) {
  uintptr_t mis = reinterpret_cast<uintptr_t>(a) & 15;
  return (reinterpret_cast<uintptr_t>(d0) & 15) == mis &&
         (!d1 || (reinterpret_cast<uintptr_t>(d1) & 15) == mis) &&
         (reinterpret_cast<uintptr_t>(b) & 15) == mis && mis % sizeof(T) == 0;
}

template <typename T>
BRG__EW_HD plan make_plan(const void *d0, const void *d1, const void *a, const void *b, size_t n) {
  constexpr size_t E = sizeof(T), V = 16 / E;
  plan p = {0, 0, 0, 0};
  if (!b) b = a; /* unary */
  uintptr_t m0 = reinterpret_cast<uintptr_t>(d0) & 15;
  if (m0 % E || (d1 && (reinterpret_cast<uintptr_t>(d1) & 15) != m0)) return p;
  size_t head = m0 ? (16 - m0) / E : 0;
  unsigned sa = (unsigned)((reinterpret_cast<uintptr_t>(a) + head * E) & 15);
  unsigned sb = (unsigned)((reinterpret_cast<uintptr_t>(b) + head * E) & 15);
  /* A shifted source's first vector reads the aligned 16 bytes before it. */
  if (head * E < sa || head * E < sb) head += V;
  if (head >= n) {
    p.head = n;
    return p;
  }
  /* ... and its last one the aligned 16 bytes after it, up to 16 - shift
   * bytes past the vector's end. */
  unsigned over = sa ? 16 - sa : 0;
  if (sb && 16 - sb > over) over = 16 - sb;
  size_t rem = (n - head) * E, need = 16 + over;
  p.head = head;
  p.nvec = rem >= need ? (rem - need) / 16 + 1 : 0;
  p.sa = sa;
  p.sb = sb;
  return p;
}

/* Elements a call of plan p takes one at a time beyond the head and tail
 * that align d0 (0 where every pointer is co-aligned): the work the
 * shifted vector path exists to keep off the element loop. */
template <typename T> BRG__EW_HD size_t scalar_excess(const void *d0, size_t n, plan p) {
  constexpr size_t E = sizeof(T), V = 16 / E;
  uintptr_t m0 = reinterpret_cast<uintptr_t>(d0) & 15;
  size_t head = m0 % E ? 0 : m0 ? (16 - m0) / E : 0;
  if (head > n) head = n;
  size_t unavoidable = head + (n - head) % V;
  size_t scalar = n - p.nvec * V;
  return scalar > unavoidable ? scalar - unavoidable : 0;
}

/* The bits of hi:lo shifted right by s bits (s < 32). */
BRG__EW_HD uint32_t funnel(uint32_t lo, uint32_t hi, unsigned s) {
#if defined(__CUDA_ARCH__)
  return __funnelshift_r(lo, hi, s);
#else
  return (uint32_t)((((uint64_t)hi << 32) | lo) >> s);
#endif
}

/* The 16 bytes at q, sh bytes past a 16-byte boundary (sh < 16): one
 * aligned load where sh is 0, else two whose bytes are shifted into one
 * vector (words picked by selects, not indexed, so that they stay in
 * registers on the device). */
BRG__EW_HD brg__vec16_bits load16(const unsigned char *q, unsigned sh) {
  const brg__vec16_bits *p = reinterpret_cast<const brg__vec16_bits *>(q - sh);
  if (!sh) return p[0];
  const brg__vec16_bits lo = p[0], hi = p[1];
  const unsigned w = sh >> 2, s = (sh & 3) * 8;
  const uint32_t c0 = w == 0 ? lo.x : w == 1 ? lo.y : w == 2 ? lo.z : lo.w;
  const uint32_t c1 = w == 0 ? lo.y : w == 1 ? lo.z : w == 2 ? lo.w : hi.x;
  const uint32_t c2 = w == 0 ? lo.z : w == 1 ? lo.w : w == 2 ? hi.x : hi.y;
  const uint32_t c3 = w == 0 ? lo.w : w == 1 ? hi.x : w == 2 ? hi.y : hi.z;
  const uint32_t c4 = w == 0 ? hi.x : w == 1 ? hi.y : w == 2 ? hi.z : hi.w;
  brg__vec16_bits r;
  r.x = funnel(c0, c1, s);
  r.y = funnel(c1, c2, s);
  r.z = funnel(c2, c3, s);
  r.w = funnel(c3, c4, s);
  return r;
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

/* What F::W::prepare makes of the divisor, once per thread (0 if nothing). */
template <class F> BRG__EW_HD uint32_t prepare(int div) {
  if constexpr (F::words)
    return F::W::prepare(div);
  else
    return (void)div, 0u;
}

/* x = x (op) y on every element of a vector (y unused for unary F); aux is
 * prepare<F>(div). */
template <class F>
BRG__EW_HD void apply_vec(vec16<typename F::T> &x, const vec16<typename F::T> &y, int div,
                          uint32_t aux) {
  constexpr int V = 16 / sizeof(typename F::T);
  if constexpr (F::words) {
    const brg__vec16_bits &b = F::binary ? y.v : x.v;
    x.v.x = F::W::apply(x.v.x, b.x, div, aux);
    x.v.y = F::W::apply(x.v.y, b.y, div, aux);
    x.v.z = F::W::apply(x.v.z, b.z, div, aux);
    x.v.w = F::W::apply(x.v.w, b.w, div, aux);
  } else {
    (void)aux;
    BRG__EW_UNROLL
    for (int k = 0; k < V; k++) {
      if constexpr (F::binary)
        x.e[k] = F::apply(x.e[k], y.e[k], div);
      else
        x.e[k] = F::apply(x.e[k], x.e[k], div);
    }
  }
}

/* Thread `tid` of `nthreads`: a grid-stride loop over the vectors, UNROLL
 * loads of each input in flight before any arithmetic, then the scalar
 * head and tail spread over the threads. Destinations may alias a source
 * exactly: every element is read once, by the thread that writes it (a
 * source that is a destination has d0's offset, so it is never read
 * shifted, across another thread's vector). */
template <class F>
BRG__EW_HD void thread_body(size_t tid, size_t nthreads, typename F::T *d0, typename F::T *d1,
                            const typename F::T *a, const typename F::T *b, size_t n, plan p,
                            int div) {
  typedef typename F::T T;
  constexpr int V = 16 / sizeof(T);
  const unsigned char *ca = reinterpret_cast<const unsigned char *>(a + p.head);
  const unsigned char *cb = F::binary ? reinterpret_cast<const unsigned char *>(b + p.head) : ca;
  brg__vec16_bits *v0 = reinterpret_cast<brg__vec16_bits *>(d0 + p.head);
  brg__vec16_bits *v1 = d1 ? reinterpret_cast<brg__vec16_bits *>(d1 + p.head) : nullptr;
  const uint32_t aux = prepare<F>(div);
  size_t i = tid;
  /* Full rounds: UNROLL vectors of each input loaded before any arithmetic. */
  for (; i + (UNROLL - 1) * nthreads < p.nvec; i += UNROLL * nthreads) {
    vec16<T> x[UNROLL], y[UNROLL];
    BRG__EW_UNROLL
    for (int u = 0; u < UNROLL; u++) {
      x[u].v = load16(ca + 16 * (i + u * nthreads), p.sa);
      if constexpr (F::binary) y[u].v = load16(cb + 16 * (i + u * nthreads), p.sb);
    }
    BRG__EW_UNROLL
    for (int u = 0; u < UNROLL; u++) {
      apply_vec<F>(x[u], y[u], div, aux);
      v0[i + u * nthreads] = x[u].v;
      if (v1) v1[i + u * nthreads] = x[u].v;
    }
  }
  /* The last, partial round: fewer than UNROLL vectors, one at a time. */
  for (; i < p.nvec; i += nthreads) {
    vec16<T> x, y;
    x.v = load16(ca + 16 * i, p.sa);
    if constexpr (F::binary)
      y.v = load16(cb + 16 * i, p.sb);
    else
      y.v = x.v;
    apply_vec<F>(x, y, div, aux);
    v0[i] = x.v;
    if (v1) v1[i] = x.v;
  }

  /* Head and tail, or everything when d0 and d1 are not co-aligned. */
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
