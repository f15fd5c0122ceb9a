/*
 * For the CUDA programs built beside the module (the kernel benchmark, the
 * GPU tests): a CUDA runtime call that fails ends the program, saying
 * where and why.
 */
#ifndef BRG_CUDA_CHECK_H
#define BRG_CUDA_CHECK_H

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define BRG_CUDA_CHECK(x)                                                                          \
  do {                                                                                             \
    cudaError_t e_ = (x);                                                                          \
    if (e_ != cudaSuccess) {                                                                       \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));          \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

#endif
