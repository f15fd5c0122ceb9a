/*
 * The GPU side of the runtime, as the core library sees it: the CUDA module
 * (libbrigade_cuda.so, kernels/cuda/brg_cuda.h) opened with dlopen() on
 * first use. When the module was not built, cannot be loaded, or finds no
 * GPU or driver, every device entry point answers BRG_ERR_UNAVAILABLE and
 * says why; host collectives never depend on it.
 */
#ifndef BRG_DEVICE_H
#define BRG_DEVICE_H

#include "brigade.h"
#include "cuda/brg_cuda.h"

/* The module's table, loaded once per process; NULL when there is no usable
 * GPU, with *why (when why is not NULL) set to a sentence saying which piece
 * is missing. Thread-safe. */
const brg__cuda_api *brg__device_api(const char **why);

/* Argument check of a collective called with a stream (the `if (stream)`
 * branch of comm.c's check_call). Buffers given with a stream must be
 * device memory. Returns the status the call must end with, the message
 * recorded on the communicator. */
brg_status brg__device_check_call(brg_comm *c, const char *fn, const void *sendbuf,
                                  const void *recvbuf, brg_stream stream);

#endif
