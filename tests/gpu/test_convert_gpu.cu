/*
 * elem.h's float16 / bfloat16 conversions on the GPU, where they are the
 * hardware's cvt instructions, against the same functions on the CPU,
 * where they are the software that tests/kernels/test_half_convert.c checks
 * against independent references; bit for bit:
 *
 * - all 65,536 float16 and bfloat16 patterns to float32 (the plain
 *   conversion; and the widening the ops use, which must give the same
 *   number and, for a NaN, some NaN);
 * - the float32 patterns of half_cases.h (every rounding boundary of both
 *   formats, NaNs, overflow) to both formats, plain and as op results are
 *   rounded (canonical NaN);
 * - every op on every pattern of both formats against 32 second operands
 *   (zeros, subnormals, extremes, Inf, NaNs, random).
 *
 * Before that, on any machine: cuda_fp16.h / cuda_bf16.h's host versions
 * of the same intrinsics (NVIDIA's software model of the cvt instructions)
 * against elem.h's software, every number of the same cases (NaN is
 * elem.h's own business on both sides). Built with nvcc only; exits 77
 * (skip) where there is no GPU and the host part passed.
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_check.h"
#include "elem.h"
#include "half_cases.h"

#define SKIP 77

enum { NOPS = 6 }; /* sum, prod, min, max, avg, div */
static const char *const op_names[NOPS] = {"sum", "prod", "min", "max", "avg", "div"};
enum { NB = 32, DIVISOR = 3 };

/* ---- the same code on both sides ---------------------------------------- */

/* Widening of pattern i: conversion and the ops' widening, both formats. */
__host__ __device__ static void widen_one(uint32_t i, uint32_t out[4]) {
  out[0] = brg__f32_bits(brg__f16_to_f32((uint16_t)i));
  out[1] = brg__f32_bits(brg__bf16_to_f32((uint16_t)i));
  out[2] = brg__f32_bits(brg__f16_widen((uint16_t)i));
  out[3] = brg__f32_bits(brg__bf16_widen((uint16_t)i));
}

__host__ __device__ static void narrow_one(uint32_t x, uint16_t out[4]) {
  float f = brg__bits_f32(x);
  out[0] = brg__f32_to_f16(f);
  out[1] = brg__f16_round(f);
  out[2] = brg__f32_to_bf16(f);
  out[3] = brg__bf16_round(f);
}

__host__ __device__ static uint16_t op_one(int bf, int op, uint16_t a, uint16_t b) {
  switch (op) {
  case 0: return bf ? brg__bf16_sum(a, b) : brg__f16_sum(a, b);
  case 1: return bf ? brg__bf16_prod(a, b) : brg__f16_prod(a, b);
  case 2: return bf ? brg__bf16_min(a, b) : brg__f16_min(a, b);
  case 3: return bf ? brg__bf16_max(a, b) : brg__f16_max(a, b);
  case 4: return bf ? brg__bf16_avg(a, b, DIVISOR) : brg__f16_avg(a, b, DIVISOR);
  default: return bf ? brg__bf16_div(a, DIVISOR) : brg__f16_div(a, DIVISOR);
  }
}

/* ---- kernels ------------------------------------------------------------ */

__global__ void widen_kernel(uint32_t *out) {
  uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < 65536) widen_one(i, out + 4 * (size_t)i);
}

__global__ void narrow_kernel(const uint32_t *x, size_t n, uint16_t *out) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    narrow_one(x[i], out + 4 * i);
}

/* out[((bf * NOPS + op) * NB + j) * 65536 + a] */
__global__ void op_kernel(const uint16_t *bs, uint16_t *out) {
  uint32_t a = blockIdx.x * blockDim.x + threadIdx.x;
  if (a >= 65536) return;
  for (int bf = 0; bf < 2; bf++)
    for (int op = 0; op < NOPS; op++)
      for (int j = 0; j < NB; j++)
        out[((size_t)(bf * NOPS + op) * NB + j) * 65536 + a] = op_one(bf, op, (uint16_t)a, bs[j]);
}

/* ---- host --------------------------------------------------------------- */

static int failures;

static void tally(const char *what, unsigned long long checked, unsigned long long bad) {
  printf("%-52s %9llu results, %llu differ\n", what, checked, bad);
  if (bad) failures++;
}

static int is_nan_f32(uint32_t u) {
  return (u & 0x7fffffffu) > 0x7f800000u;
}

/* The intrinsics' host versions against elem.h's software, numbers only. */
static void check_host_models(void) {
  unsigned long long bad[4] = {0, 0, 0, 0}, nw = 0, nn = 0;
  for (uint32_t i = 0; i < 65536; i++) {
    uint16_t h = (uint16_t)i;
    if ((h & 0x7fffu) <= 0x7c00u) {
      uint32_t g = brg__f32_bits(__half2float(__ushort_as_half(h)));
      if (g != brg__f32_bits(brg__f16_to_f32(h)) && bad[0]++ < 10)
        fprintf(stderr, "__half2float %04x: %08x, elem.h %08x\n", h, g,
                brg__f32_bits(brg__f16_to_f32(h)));
      nw++;
    }
    if ((h & 0x7fffu) <= 0x7f80u) {
      uint32_t g = brg__f32_bits(__bfloat162float(__ushort_as_bfloat16(h)));
      if (g != brg__f32_bits(brg__bf16_to_f32(h)) && bad[1]++ < 10)
        fprintf(stderr, "__bfloat162float %04x: %08x, elem.h %08x\n", h, g,
                brg__f32_bits(brg__bf16_to_f32(h)));
      nw++;
    }
  }
  size_t n = brg_test_half_cases(NULL, 0);
  uint32_t *cases = (uint32_t *)malloc(n * sizeof *cases);
  if (!cases) exit(1);
  brg_test_half_cases(cases, n);
  for (size_t i = 0; i < n; i++) {
    if (is_nan_f32(cases[i])) continue;
    float f = brg__bits_f32(cases[i]);
    uint16_t g = __half_as_ushort(__float2half_rn(f)), w = brg__f32_to_f16(f);
    if (g != w && bad[2]++ < 10)
      fprintf(stderr, "__float2half_rn %08x: %04x, elem.h %04x\n", cases[i], g, w);
    g = __bfloat16_as_ushort(__float2bfloat16_rn(f));
    w = brg__f32_to_bf16(f);
    if (g != w && bad[3]++ < 10)
      fprintf(stderr, "__float2bfloat16_rn %08x: %04x, elem.h %04x\n", cases[i], g, w);
    nn++;
  }
  free(cases);
  tally("host model: half/bfloat16 -> float32, every number", nw, bad[0] + bad[1]);
  tally("host model: float32 -> half/bfloat16, boundary cases", 2 * nn, bad[2] + bad[3]);
}

int main(void) {
  check_host_models();
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count <= 0) {
    if (failures) {
      fprintf(stderr, "test_convert_gpu: the host models differ from elem.h\n");
      return 1;
    }
    printf("test_convert_gpu: GPU part skipped: %s\n",
           e != cudaSuccess ? cudaGetErrorString(e) : "no CUDA device");
    return SKIP;
  }
  cudaDeviceProp prop;
  BRG_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  printf("test_convert_gpu: %s, sm_%d%d\n", prop.name, prop.major, prop.minor);

  /* To float32: all patterns. */
  {
    uint32_t *d, *got = (uint32_t *)malloc(65536 * 4 * sizeof *got);
    if (!got) return 1;
    BRG_CUDA_CHECK(cudaMalloc(&d, 65536 * 4 * sizeof *d));
    widen_kernel<<<256, 256>>>(d);
    BRG_CUDA_CHECK(cudaGetLastError());
    BRG_CUDA_CHECK(cudaMemcpy(got, d, 65536 * 4 * sizeof *got, cudaMemcpyDeviceToHost));
    static const char *const what[4] = {"f16 -> f32", "bf16 -> f32", "f16 widen", "bf16 widen"};
    unsigned long long bad[4] = {0, 0, 0, 0};
    for (uint32_t i = 0; i < 65536; i++) {
      uint32_t want[4];
      widen_one(i, want);
      for (int k = 0; k < 4; k++) {
        const uint32_t g = got[4 * i + k];
        /* The ops' widening may give any NaN for a NaN. */
        int same = g == want[k] || (k >= 2 && is_nan_f32(g) && is_nan_f32(want[k]));
        if (!same && bad[k]++ < 10)
          fprintf(stderr, "%s %04x: GPU %08x, CPU %08x\n", what[k], i, g, want[k]);
      }
    }
    tally("float16 -> float32, every pattern", 65536, bad[0]);
    tally("bfloat16 -> float32, every pattern", 65536, bad[1]);
    tally("float16 widening for ops, every pattern", 65536, bad[2]);
    tally("bfloat16 widening for ops, every pattern", 65536, bad[3]);
    BRG_CUDA_CHECK(cudaFree(d));
    free(got);
  }

  /* From float32: the boundary cases. */
  {
    size_t n = brg_test_half_cases(NULL, 0);
    uint32_t *cases = (uint32_t *)malloc(n * sizeof *cases), *dx;
    uint16_t *got = (uint16_t *)malloc(n * 4 * sizeof *got), *dout;
    if (!cases || !got) return 1;
    brg_test_half_cases(cases, n);
    BRG_CUDA_CHECK(cudaMalloc(&dx, n * sizeof *dx));
    BRG_CUDA_CHECK(cudaMalloc(&dout, n * 4 * sizeof *dout));
    BRG_CUDA_CHECK(cudaMemcpy(dx, cases, n * sizeof *dx, cudaMemcpyHostToDevice));
    narrow_kernel<<<1024, 256>>>(dx, n, dout);
    BRG_CUDA_CHECK(cudaGetLastError());
    BRG_CUDA_CHECK(cudaMemcpy(got, dout, n * 4 * sizeof *got, cudaMemcpyDeviceToHost));
    static const char *const what[4] = {"float32 -> float16", "float16 rounding of op results",
                                        "float32 -> bfloat16", "bfloat16 rounding of op results"};
    unsigned long long bad[4] = {0, 0, 0, 0};
    for (size_t i = 0; i < n; i++) {
      uint16_t want[4];
      narrow_one(cases[i], want);
      for (int k = 0; k < 4; k++)
        if (got[4 * i + k] != want[k] && bad[k]++ < 10)
          fprintf(stderr, "%s %08x: GPU %04x, CPU %04x\n", what[k], cases[i], got[4 * i + k],
                  want[k]);
    }
    for (int k = 0; k < 4; k++) {
      char label[96];
      snprintf(label, sizeof label, "%s, boundary cases", what[k]);
      tally(label, n, bad[k]);
    }
    BRG_CUDA_CHECK(cudaFree(dx));
    BRG_CUDA_CHECK(cudaFree(dout));
    free(cases);
    free(got);
  }

  /* The ops: every pattern against NB second operands. */
  {
    uint16_t bs[NB] = {0x0000, 0x8000, 0x0001, 0x8001, 0x03ff, 0x0400, 0x3c00, 0xbc00,
                       0x7bff, 0xfbff, 0x7c00, 0xfc00, 0x7e00, 0x7c01, 0xfe01, 0x7fff,
                       0x3f80, 0xbf80, 0x0080, 0x007f, 0x7f7f, 0x7f80, 0x7fc0, 0x7f81};
    uint64_t r = 0x9e3779b97f4a7c15ull;
    for (int j = 24; j < NB; j++) {
      r ^= r >> 12;
      r ^= r << 25;
      r ^= r >> 27;
      bs[j] = (uint16_t)((r * 0x2545f4914f6cdd1dull) >> 48);
    }
    size_t total = (size_t)2 * NOPS * NB * 65536;
    uint16_t *db, *dout, *got = (uint16_t *)malloc(total * sizeof *got);
    if (!got) return 1;
    BRG_CUDA_CHECK(cudaMalloc(&db, sizeof bs));
    BRG_CUDA_CHECK(cudaMalloc(&dout, total * sizeof *dout));
    BRG_CUDA_CHECK(cudaMemcpy(db, bs, sizeof bs, cudaMemcpyHostToDevice));
    op_kernel<<<256, 256>>>(db, dout);
    BRG_CUDA_CHECK(cudaGetLastError());
    BRG_CUDA_CHECK(cudaMemcpy(got, dout, total * sizeof *got, cudaMemcpyDeviceToHost));
    for (int bf = 0; bf < 2; bf++)
      for (int op = 0; op < NOPS; op++) {
        unsigned long long bad = 0;
        for (int j = 0; j < NB; j++)
          for (uint32_t a = 0; a < 65536; a++) {
            uint16_t g = got[((size_t)(bf * NOPS + op) * NB + j) * 65536 + a];
            uint16_t w = op_one(bf, op, (uint16_t)a, bs[j]);
            if (g != w && bad++ < 10)
              fprintf(stderr, "%s %s %04x, %04x: GPU %04x, CPU %04x\n", bf ? "bf16" : "f16",
                      op_names[op], a, bs[j], g, w);
          }
        char label[96];
        snprintf(label, sizeof label, "%s %s, every pattern x %d", bf ? "bfloat16" : "float16",
                 op_names[op], NB);
        tally(label, (unsigned long long)NB * 65536, bad);
      }
    BRG_CUDA_CHECK(cudaFree(db));
    BRG_CUDA_CHECK(cudaFree(dout));
    free(got);
  }

  if (failures) {
    fprintf(stderr, "test_convert_gpu: %d checks differ between GPU and CPU\n", failures);
    return 1;
  }
  printf("test_convert_gpu: the GPU conversions are bit-identical to the CPU ones\n");
  return 0;
}
