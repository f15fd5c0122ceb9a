/*
 * Packed float16 / bfloat16 arithmetic for the element-wise kernel
 * (elementwise.cuh): two elements in one 32-bit word, the lower address in
 * the low half, one instruction for both (HADD2, HMUL2, HMNMX2 on sm_80+;
 * the bfloat16 add and multiply need sm_90). On the CPU, for the SIMT
 * emulator and the element-wise test, each op has a stand-in that gives
 * the device's bits: both halves widened exactly to float32, one float32
 * op, one rounding to nearest even. A NaN result is the device's
 * canonical NaN, 0x7fff, in either format; elementwise.cuh turns it into
 * elem.h's canonical NaN.
 *
 * Why the device's op gives elem.h's bits (elem.h computes in float32 and
 * rounds once to the half type):
 *
 * - add, mul: the device rounds the exact result once. float32 carries
 *   24 bits, at least 2p + 2 for both half formats (p = 11, 8), so
 *   rounding to float32 first and then to the half type gives the same
 *   number (an exact product of two halves even needs no float32
 *   rounding; subnormal bfloat16 sums and products are exact in float32's
 *   subnormals).
 * - min, max (the .NaN forms): the result is one of the inputs, NaN when
 *   either input is NaN, and -0 below +0: elem.h's brg__f32_min/max rules.
 *
 * Not packed (elementwise.cuh keeps the scalar path): the division of AVG
 * and of the final divide, which elem.h does in float32 with IEEE division
 * by the integer divisor. No packed half instruction divides, and a
 * multiplication by a rounded reciprocal is not the same number.
 */
#ifndef BRG_PAIR_CUH
#define BRG_PAIR_CUH

#include <stdint.h>

#include "elem.h"

/* Whether the packed forms exist where this is compiled (1 on the CPU:
 * the stand-ins). Below them the kernel keeps the scalar ops. */
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define BRG_PAIR_F16 1
#else
#define BRG_PAIR_F16 0
#endif
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
#define BRG_PAIR_BF16 1
#else
#define BRG_PAIR_BF16 0
#endif

namespace brg_pair {

enum { F16, BF16 };
enum { ADD, MUL, MIN, MAX };

#if defined(__CUDA_ARCH__)

#define BRG__PAIR_OP(name, ins)                                                                    \
  static __device__ __forceinline__ uint32_t name(uint32_t a, uint32_t b) {                        \
    uint32_t d;                                                                                    \
    asm(ins " %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));                                            \
    return d;                                                                                      \
  }
BRG__PAIR_OP(f16_add, "add.rn.f16x2")
BRG__PAIR_OP(f16_mul, "mul.rn.f16x2")
#if __CUDA_ARCH__ >= 800
BRG__PAIR_OP(f16_min, "min.NaN.f16x2")
BRG__PAIR_OP(f16_max, "max.NaN.f16x2")
#endif
#if __CUDA_ARCH__ >= 900
BRG__PAIR_OP(bf16_min, "min.NaN.bf16x2")
BRG__PAIR_OP(bf16_max, "max.NaN.bf16x2")
BRG__PAIR_OP(bf16_add, "add.rn.bf16x2")
BRG__PAIR_OP(bf16_mul, "mul.rn.bf16x2")
#endif
#undef BRG__PAIR_OP

#else /* the CPU stand-ins */

/* Words the calling thread computed a word at a time (packed pairs here,
 * int8 lanes in elementwise.cuh), counted for the tests: a vector body
 * that falls back to one element at a time shows as none. */
inline thread_local uint64_t host_words;
static inline void count_word() {
  host_words++;
}

static inline float widen(int k, uint32_t h) {
  return k == F16 ? brg__f16_widen((uint16_t)h) : brg__bf16_widen((uint16_t)h);
}
/* One rounding to nearest even; any NaN is the device's 0x7fff. */
static inline uint32_t narrow(int k, float f) {
  if (f != f) return 0x7fffu;
  return k == F16 ? brg__f32_to_f16_number(f) : brg__f32_to_bf16_number(f);
}
static inline uint32_t lane(int k, int op, uint32_t a, uint32_t b) {
  float x = widen(k, a & 0xffffu), y = widen(k, b & 0xffffu), r;
  switch (op) {
  case ADD: r = x + y; break;
  case MUL: r = x * y; break;
  case MIN: r = brg__f32_min(x, y); break;
  default: r = brg__f32_max(x, y); break;
  }
  return narrow(k, r);
}
static inline uint32_t both(int k, int op, uint32_t a, uint32_t b) {
  count_word();
  return lane(k, op, a, b) | lane(k, op, a >> 16, b >> 16) << 16;
}
static inline uint32_t f16_add(uint32_t a, uint32_t b) {
  return both(F16, ADD, a, b);
}
static inline uint32_t f16_mul(uint32_t a, uint32_t b) {
  return both(F16, MUL, a, b);
}
static inline uint32_t f16_min(uint32_t a, uint32_t b) {
  return both(F16, MIN, a, b);
}
static inline uint32_t f16_max(uint32_t a, uint32_t b) {
  return both(F16, MAX, a, b);
}
static inline uint32_t bf16_add(uint32_t a, uint32_t b) {
  return both(BF16, ADD, a, b);
}
static inline uint32_t bf16_mul(uint32_t a, uint32_t b) {
  return both(BF16, MUL, a, b);
}
static inline uint32_t bf16_min(uint32_t a, uint32_t b) {
  return both(BF16, MIN, a, b);
}
static inline uint32_t bf16_max(uint32_t a, uint32_t b) {
  return both(BF16, MAX, a, b);
}

#endif

} // namespace brg_pair

#endif /* BRG_PAIR_CUH */
