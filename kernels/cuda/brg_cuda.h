/*
 * The interface of the CUDA module, libbrigade_cuda.so.
 *
 * The core library never links against CUDA: it opens this module with
 * dlopen() where one was built (runtime/device.c) and reaches the GPU only
 * through the table below. The table uses plain C types (CUDA errors travel
 * as int, streams as void *), so this header compiles without the CUDA
 * toolkit and the module can be rebuilt without touching the core.
 *
 * Every function that returns int returns 0 (cudaSuccess) or a CUDA error
 * code that error_string() turns into text.
 */
#ifndef BRG_CUDA_H
#define BRG_CUDA_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Raised whenever the table changes shape; the loader refuses other values. */
#define BRG__CUDA_ABI 1

/* Name of the one symbol the module exports. */
#define BRG__CUDA_ENTRY "brg__cuda_module_api"

typedef struct brg__cuda_api {
  int abi;                        /* BRG__CUDA_ABI */

  /* Number of usable devices (> 0), or <= 0 with the reason written to why. */
  int (*probe)(char *why, size_t why_bytes);
  /* Name and compute capability of the current device, for logs. */
  void (*describe)(char *out, size_t out_bytes);
  const char *(*error_string)(int err);

  /* 1 when p is device (or managed) memory, setting *device; 0 for host
   * memory; a CUDA query that fails counts as host memory. */
  int (*pointer_is_device)(const void *p, int *device);

  /*
   * The device forms of kernels.h, enqueued on `stream` (NULL: the legacy
   * default stream). Same contract: dst0[i] = a[i] (op) b[i] and, when dst1
   * is not NULL, dst1[i] = dst0[i]; BRG_AVG sums and divides by `divisor`.
   * Destinations may alias a source exactly, not partially. Pointers must be
   * aligned to the element size; 16-byte alignment (the same offset from a
   * 16-byte boundary for every pointer) takes the vectorized path.
   */
  int (*reduce)(void *dst0, void *dst1, const void *a, const void *b, size_t count,
                int dtype, int op, int divisor, void *stream);
  int (*copy)(void *dst0, void *dst1, const void *src, size_t bytes, void *stream);
  int (*divide)(void *dst, const void *src, size_t count, int dtype, int divisor, void *stream);

  /* Plain helpers for tests and tools that must not include CUDA headers. */
  int (*mem_alloc)(void **p, size_t bytes);
  int (*mem_free)(void *p);
  int (*mem_copy)(void *dst, const void *src, size_t bytes); /* any direction, synchronous */
  int (*mem_set)(void *p, int value, size_t bytes);          /* synchronous */
  int (*stream_sync)(void *stream);
  int (*last_error)(void);      /* pops the sticky launch error, as cudaGetLastError */
} brg__cuda_api;

typedef const brg__cuda_api *(*brg__cuda_entry_fn)(void);

/* The module's entry point (BRG__CUDA_ENTRY). The core library reaches it
 * with dlsym(); programs linked with the module's objects (the kernel
 * benchmark) call it directly. */
const brg__cuda_api *brg__cuda_module_api(void);

#ifdef __cplusplus
}
#endif

#endif /* BRG_CUDA_H */
