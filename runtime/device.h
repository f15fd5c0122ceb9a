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
#include "internal.h"
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

/* The same for a call without a stream: once the process has the CUDA
 * driver loaded, buffers given without a stream must not be GPU memory. */
brg_status brg__device_check_host_call(brg_comm *c, const char *fn, const void *sendbuf,
                                       const void *recvbuf);

/*
 * Device collectives (device_ring.c). The ring runs in step mode: per slice
 * and step one copy or reduce kernel on the caller's stream, writing the
 * next rank's FIFO slot in its GPU memory (mapped by CUDA IPC), ordered by
 * interprocess events. No kernel ever waits for another process's kernel.
 */
struct brg__ring_op;
struct brg__dev_ring;
/* Building the device ring at the first device collective, in two halves
 * around an all-gather over the host ring that the progress layer runs:
 * prepare sets up this rank's own half and describes it in `mine`
 * (blob_bytes, with room for every rank's in `all`); finish checks every
 * rank's description, connects to the neighbours and frees the
 * descriptions, given the all-gather's status. */
typedef struct brg__dev_setup {
  struct brg__dev_ring *d;
  void *mine, *all;
  size_t blob_bytes;
} brg__dev_setup;
brg_status brg__device_ring_prepare(brg_comm *c, brg__dev_setup *st);
brg_status brg__device_ring_finish(brg_comm *c, brg__dev_setup *st, brg_status gathered);
size_t brg__device_ring_slice_bytes(const struct brg__dev_ring *d);
/* One primitive on one slice whose buffers are in GPU memory. */
brg_status brg__device_prim(struct brg__ring_op *o, int prim, const char *in, char *out,
                            size_t m);
/* One rank: recvbuf = sendbuf, on the stream. */
brg_status brg__device_single(brg_comm *c, const brg__coll *k);
/* Waits for the device work this rank enqueued, then frees the ring. */
void brg__device_ring_free(brg_comm *c);

#endif
