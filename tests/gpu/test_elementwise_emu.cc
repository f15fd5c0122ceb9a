/*
 * The CUDA element-wise kernel (kernels/cuda/elementwise.cuh) run on the
 * CPU: every thread of a small grid in turn, so the head / vector body /
 * tail split, the grid-stride loop with its unrolled loads, and the 16-byte
 * vector arithmetic are checked bit for bit against the CPU kernels on
 * machines without a GPU. (Concurrency and the device's own arithmetic are
 * what test_kernels_gpu adds on a GPU.)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <initializer_list>

#include "elementwise.cuh"
#include "same_bits.h"
extern "C" {
#include "kernels.h"
}

using namespace brg_ew;

static int failures, cases;

/* Words the vector body computed a word at a time on this thread
 * (pair.cuh counts them on the CPU); none where every element is computed
 * alone. */
static uint64_t brg_test_words() {
#ifdef BRG_PAIR_CUH
  return brg_pair::host_words;
#else
  return 0;
#endif
}
static uint64_t rng = 0x853c49e6748fea9bull;
static uint64_t rnd() {
  rng ^= rng >> 12;
  rng ^= rng << 25;
  rng ^= rng >> 27;
  return rng * 0x2545f4914f6cdd1dull;
}

static void fill(unsigned char *p, size_t n) {
  for (size_t i = 0; i < n; i++) p[i] = (unsigned char)rnd();
}

/* Runs the kernel body for every thread of a grid of `nthreads`. */
template <class F>
static void run_grid(size_t nthreads, void *d0, void *d1, const void *a, const void *b, size_t n,
                     int div) {
  typedef typename F::T T;
  T *o0 = static_cast<T *>(d0), *o1 = static_cast<T *>(d1);
  const T *x = static_cast<const T *>(a), *y = F::binary ? static_cast<const T *>(b) : x;
  plan p = make_plan<T>(o0, o1, x, y, n);
  for (size_t t = 0; t < nthreads; t++) thread_body<F>(t, nthreads, o0, o1, x, y, n, p, div);
}

template <class D>
static void run_reduce(int op, size_t nthreads, void *d0, void *d1, const void *a, const void *b,
                       size_t n, int div) {
  switch (op) {
  case BRG_SUM: run_grid<reduce_fn<D, BRG_SUM>>(nthreads, d0, d1, a, b, n, div); break;
  case BRG_PROD: run_grid<reduce_fn<D, BRG_PROD>>(nthreads, d0, d1, a, b, n, div); break;
  case BRG_MIN: run_grid<reduce_fn<D, BRG_MIN>>(nthreads, d0, d1, a, b, n, div); break;
  case BRG_MAX: run_grid<reduce_fn<D, BRG_MAX>>(nthreads, d0, d1, a, b, n, div); break;
  case BRG_AVG: run_grid<reduce_fn<D, BRG_AVG>>(nthreads, d0, d1, a, b, n, div); break;
  }
  if constexpr (D::integer) {
    switch (op) {
    case BRG_BAND: run_grid<reduce_fn<D, BRG_BAND>>(nthreads, d0, d1, a, b, n, div); break;
    case BRG_BOR: run_grid<reduce_fn<D, BRG_BOR>>(nthreads, d0, d1, a, b, n, div); break;
    case BRG_BXOR: run_grid<reduce_fn<D, BRG_BXOR>>(nthreads, d0, d1, a, b, n, div); break;
    }
  }
}

static void reduce_any(int dt, int op, size_t nt, void *d0, void *d1, const void *a, const void *b,
                       size_t n, int div) {
  switch (dt) {
  case BRG_INT8: run_reduce<tag_i8>(op, nt, d0, d1, a, b, n, div); break;
  case BRG_UINT8: run_reduce<tag_u8>(op, nt, d0, d1, a, b, n, div); break;
  case BRG_INT32: run_reduce<tag_i32>(op, nt, d0, d1, a, b, n, div); break;
  case BRG_UINT32: run_reduce<tag_u32>(op, nt, d0, d1, a, b, n, div); break;
  case BRG_INT64: run_reduce<tag_i64>(op, nt, d0, d1, a, b, n, div); break;
  case BRG_UINT64: run_reduce<tag_u64>(op, nt, d0, d1, a, b, n, div); break;
  case BRG_FLOAT16: run_reduce<tag_f16>(op, nt, d0, d1, a, b, n, div); break;
  case BRG_BFLOAT16: run_reduce<tag_bf16>(op, nt, d0, d1, a, b, n, div); break;
  case BRG_FLOAT32: run_reduce<tag_f32>(op, nt, d0, d1, a, b, n, div); break;
  case BRG_FLOAT64: run_reduce<tag_f64>(op, nt, d0, d1, a, b, n, div); break;
  }
}

static void divide_any(int dt, size_t nt, void *d, const void *s, size_t n, int div) {
  switch (dt) {
  case BRG_INT8: run_grid<divide_fn<tag_i8>>(nt, d, nullptr, s, nullptr, n, div); break;
  case BRG_UINT8: run_grid<divide_fn<tag_u8>>(nt, d, nullptr, s, nullptr, n, div); break;
  case BRG_INT32: run_grid<divide_fn<tag_i32>>(nt, d, nullptr, s, nullptr, n, div); break;
  case BRG_UINT32: run_grid<divide_fn<tag_u32>>(nt, d, nullptr, s, nullptr, n, div); break;
  case BRG_INT64: run_grid<divide_fn<tag_i64>>(nt, d, nullptr, s, nullptr, n, div); break;
  case BRG_UINT64: run_grid<divide_fn<tag_u64>>(nt, d, nullptr, s, nullptr, n, div); break;
  case BRG_FLOAT16: run_grid<divide_fn<tag_f16>>(nt, d, nullptr, s, nullptr, n, div); break;
  case BRG_BFLOAT16: run_grid<divide_fn<tag_bf16>>(nt, d, nullptr, s, nullptr, n, div); break;
  case BRG_FLOAT32: run_grid<divide_fn<tag_f32>>(nt, d, nullptr, s, nullptr, n, div); break;
  case BRG_FLOAT64: run_grid<divide_fn<tag_f64>>(nt, d, nullptr, s, nullptr, n, div); break;
  }
}

/* got and want hold n elements of es bytes; op as brg_test_first_diff. */
static void expect(const char *what, const void *got, const void *want, size_t n, size_t es, int dt,
                   int op) {
  cases++;
  size_t i = brg_test_first_diff(got, want, n, es, dt, op);
  if (i == n) return;
  uint64_t g = 0, w = 0;
  memcpy(&g, static_cast<const char *>(got) + i * es, es);
  memcpy(&w, static_cast<const char *>(want) + i * es, es);
  fprintf(stderr, "FAIL %s: element %zu is 0x%llx, the CPU kernel gives 0x%llx\n", what, i,
          (unsigned long long)g, (unsigned long long)w);
  failures++;
}

int main() {
  static const size_t esz[] = {1, 1, 4, 4, 8, 8, 2, 2, 4, 8};
  static const size_t counts[] = {0, 1, 2, 5, 7, 8, 9, 15, 16, 17, 31, 33, 64, 100, 1000, 4099};
  static const size_t grids[] = {1, 3, 32, 257};
  const size_t cap = (4099 * 8 + 64 + 63) / 64 * 64; /* aligned_alloc wants a multiple */
  unsigned char *buf[6];
  for (auto &p : buf) p = static_cast<unsigned char *>(aligned_alloc(64, cap));
  unsigned char *a = buf[0], *b = buf[1], *want = buf[2], *d0 = buf[3], *d1 = buf[4],
                *inpl = buf[5];
  char what[160];

  for (int dt = 0; dt < BRG_NUM_DTYPES; dt++) {
    size_t es = esz[dt];
    /* Offsets (bytes) of a/b and of the outputs: aligned, equal and
     * different distances from a 16-byte boundary. */
    size_t offs[3][2] = {{0, 0}, {es, es}, {0, es == 8 ? 8 : es}};
    for (int op = 0; op < (dt < BRG_FLOAT16 ? BRG_NUM_OPS : BRG_BAND); op++)
      for (size_t n : counts)
        for (auto &o : offs)
          for (size_t nt : grids) {
            size_t bytes = n * es;
            fill(a + o[0], bytes);
            fill(b + o[0], bytes);
            brg__reduce(want, nullptr, a + o[0], b + o[0], n, (brg_dtype)dt, (brg_op)op, 3);
            memset(d0, 0xa5, cap);
            memset(d1, 0x5a, cap);
            reduce_any(dt, op, nt, d0 + o[1], d1 + o[1], a + o[0], b + o[0], n, 3);
            snprintf(what, sizeof what, "reduce %s %s n=%zu offsets %zu/%zu grid %zu",
                     brg_dtype_name((brg_dtype)dt), brg_op_name((brg_op)op), n, o[0], o[1], nt);
            expect(what, d0 + o[1], want, n, es, dt, op);
            expect(what, d1 + o[1], want, n, es, dt, op);
            /* Nothing written outside the outputs. */
            unsigned char guard[16];
            memset(guard, 0xa5, sizeof guard);
            expect(what, d0 + o[1] + bytes, guard, 16, 1, BRG_UINT8, -1);
            /* In place. */
            memcpy(inpl + o[0], a + o[0], bytes);
            reduce_any(dt, op, nt, inpl + o[0], nullptr, inpl + o[0], b + o[0], n, 3);
            expect(what, inpl + o[0], want, n, es, dt, op);
          }
    for (size_t n : counts)
      for (auto &o : offs) {
        size_t bytes = n * es;
        fill(a + o[0], bytes);
        brg__divide(want, a + o[0], n, (brg_dtype)dt, 7);
        divide_any(dt, 32, d0 + o[1], a + o[0], n, 7);
        snprintf(what, sizeof what, "divide %s n=%zu offsets %zu/%zu",
                 brg_dtype_name((brg_dtype)dt), n, o[0], o[1]);
        expect(what, d0 + o[1], want, n, es, dt, BRG_AVG);
      }
  }
  for (size_t n : counts)
    for (size_t o = 0; o < 4; o++) {
      fill(a + o, n);
      run_grid<copy_fn>(32, d0 + (o & 1), d1 + (o & 1), a + o, nullptr, n, 0);
      snprintf(what, sizeof what, "copy2 %zu bytes offsets %zu/%zu", n, o, o & 1);
      expect(what, d0 + (o & 1), a + o, n, 1, BRG_UINT8, -1);
      expect(what, d1 + (o & 1), a + o, n, 1, BRG_UINT8, -1);
    }
  /* float16 and bfloat16 on the packed path: every pair of special values
   * (zeros of both signs, subnormals, the largest numbers, infinities,
   * NaNs with payloads and signs) under every op, through the vector body
   * (aligned) and the scalar loop (a/b one element off the outputs). */
  static const uint16_t special[2][24] = {
      {0x0000, 0x8000, 0x0001, 0x8001, 0x03ff, 0x8400, 0x0400, 0x3c00,
       0xbc00, 0x3c01, 0x1400, 0x7bff, 0xfbff, 0x7c00, 0xfc00, 0x7e00,
       0x7c01, 0xffff, 0x7fff, 0x3555, 0x4248, 0x0200, 0x5bff, 0x6000},
      {0x0000, 0x8000, 0x0001, 0x8001, 0x007f, 0x0080, 0x8080, 0x3f80,
       0xbf80, 0x3f81, 0x7f7f, 0xff7f, 0x7f80, 0xff80, 0x7fc0, 0x7f81,
       0xffff, 0x7fff, 0x3eab, 0x4049, 0x0040, 0x5f7f, 0x1f80, 0x2000}};
  for (int k = 0; k < 2; k++) {
    int dt = k ? BRG_BFLOAT16 : BRG_FLOAT16;
    const size_t nsv = 24, n = nsv * nsv;
    uint16_t *x = reinterpret_cast<uint16_t *>(a), *y = reinterpret_cast<uint16_t *>(b);
    for (size_t i = 0; i < n; i++) {
      x[i] = special[k][i / nsv];
      y[i] = special[k][i % nsv];
    }
    for (int op = 0; op < BRG_BAND; op++)
      for (int div : {1, 3, 8})
        for (size_t off = 0; off < 2; off++) {
          uint64_t words = brg_test_words();
          brg__reduce(want, nullptr, a, b, n, (brg_dtype)dt, (brg_op)op, div);
          reduce_any(dt, op, 32, d0 + 2 * off, nullptr, a, b, n, div);
          snprintf(what, sizeof what, "special %s %s div %d out offset %zu",
                   brg_dtype_name((brg_dtype)dt), brg_op_name((brg_op)op), div, 2 * off);
          expect(what, d0 + 2 * off, want, n, 2, dt, op);
          /* Aligned: the vector body takes its pairs a word at a time. */
          cases++;
          if (!off && brg_test_words() - words != n / 2) {
            fprintf(stderr, "FAIL %s: %llu words computed packed, want %zu\n", what,
                    (unsigned long long)(brg_test_words() - words), n / 2);
            failures++;
          }
        }
  }
  /* int8 and uint8 AVG and divide, four lanes a word: every pair of
   * values under divisors around the bounds of the lanes' division. */
  unsigned char *pa = static_cast<unsigned char *>(aligned_alloc(64, 65536)),
                *pb = static_cast<unsigned char *>(aligned_alloc(64, 65536)),
                *pw = static_cast<unsigned char *>(aligned_alloc(64, 65536)),
                *pd = static_cast<unsigned char *>(aligned_alloc(64, 65536));
  for (int dt : {BRG_INT8, BRG_UINT8})
    for (int div :
         {1, 2, 3, 5, 7, 8, 127, 128, 129, 255, 256, 257, 1000, 65535, 65536, 65537, 1 << 30}) {
      const size_t n = 65536;
      for (size_t i = 0; i < n; i++) {
        pa[i] = (unsigned char)(i >> 8);
        pb[i] = (unsigned char)i;
      }
      uint64_t words = brg_test_words();
      brg__reduce(pw, nullptr, pa, pb, n, (brg_dtype)dt, BRG_AVG, div);
      reduce_any(dt, BRG_AVG, 32, pd, nullptr, pa, pb, n, div);
      snprintf(what, sizeof what, "all pairs %s avg div %d", brg_dtype_name((brg_dtype)dt), div);
      expect(what, pd, pw, n, 1, dt, BRG_AVG);
      brg__divide(pw, pa, n, (brg_dtype)dt, div);
      divide_any(dt, 32, pd, pa, n, div);
      snprintf(what, sizeof what, "all values %s divide %d", brg_dtype_name((brg_dtype)dt), div);
      expect(what, pd, pw, n, 1, dt, BRG_AVG);
      cases++;
      if (brg_test_words() - words != 2 * n / 4) {
        fprintf(stderr, "FAIL %s: %llu words computed a word at a time, want %zu\n", what,
                (unsigned long long)(brg_test_words() - words), 2 * n / 4);
        failures++;
      }
    }
  for (auto *p : {pa, pb, pw, pd}) free(p);

  /* The grid: enough blocks for the work, bounded by what fits and by
   * set_max_blocks, at least one. */
  struct {
    size_t nvec, n, fit, bound, want;
  } grids_cases[] = {
      {0, 0, 528, 32, 1},                         /* nothing to do: still one block */
      {0, 100, 528, 32, 1},                       /* scalar path: one element per thread */
      {0, 1000, 528, 32, 4},                      /* ... over 1000 / 256 blocks */
      {1 << 20, 1 << 23, 528, 32, 32},            /* large: the bound */
      {1 << 20, 1 << 23, 528, 1024, 528},         /* large, loose bound: what fits */
      {1 << 20, 1 << 23, 528, 1, 1},              /* the smallest bound */
      {4 * 256 * 5, 8 * 4 * 256 * 5, 528, 32, 5}, /* UNROLL vectors per thread */
      {4 * 256 * 5 + 1, 8 * 4 * 256 * 5 + 8, 528, 32, 6},
  };
  for (auto &g : grids_cases) {
    size_t got = grid_blocks(plan{0, g.nvec, 0, 0}, g.n, 256, g.fit, g.bound);
    cases++;
    if (got != g.want) {
      fprintf(stderr, "FAIL grid_blocks(nvec %zu, n %zu, fit %zu, bound %zu) = %zu, want %zu\n",
              g.nvec, g.n, g.fit, g.bound, got, g.want);
      failures++;
    }
  }
  for (auto &p : buf) free(p);
  if (failures) {
    fprintf(stderr, "test_elementwise_emu: %d of %d checks failed\n", failures, cases);
    return 1;
  }
  printf("test_elementwise_emu: %d checks bit-equal to the CPU kernels\n", cases);
  return 0;
}
