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

/* Which memory a collective's buffers are in, and so where it runs:
 *  - host buffers and stream NULL: a host collective (*device = 0);
 *  - device buffers, all on one GPU, with a stream or with NULL (the legacy
 *    default stream, as NCCL takes stream 0): a device collective on that
 *    GPU (*device = 1, *gpu);
 *  - host buffers with a stream, host and device buffers mixed, or buffers
 *    on two GPUs: BRG_ERR_INVALID_ARGUMENT naming the buffers;
 *  - a communicator used with buffers on two different GPUs over time:
 *    BRG_ERR_INVALID_USAGE naming both.
 * Buffers given without a stream are looked at only once the process has
 * the CUDA driver (or the configured module) loaded, so host-only
 * processes pay nothing. The message is recorded on the communicator. */
brg_status brg__device_classify(brg_comm *c, const char *fn, const void *sendbuf,
                                const void *recvbuf, brg_stream stream, int *device, int *gpu);

/* A call's memory at issue (coll.c): brg__device_classify into k->device
 * and k->gpu, then for GPU buffers on a stream capturing a CUDA graph
 * whether the call can be captured (kernel mode, set up before; never a
 * staged one): BRG_ERR_INVALID_USAGE saying how to fix it, else
 * k->captured. k->kind and k->staged are set; k->stream is `stream`.
 * (exec/device_exec.c) */
brg_status brg__device_check_call(brg_comm *c, const char *fn, const void *sendbuf,
                                  const void *recvbuf, brg_stream stream, brg__coll *k);

/* brg_comm_device_setup's device (-1: the current one), checked and made
 * the communicator's GPU. */
brg_status brg__device_choose(brg_comm *c, const char *fn, int device, int *gpu);
/* Makes `gpu` the calling thread's current device, keeping the one it
 * replaces in *prev (restore it with brg__device_leave). */
brg_status brg__device_enter(brg_comm *c, int gpu, int *prev);
void brg__device_leave(int prev);

/*
 * Device collectives (device_ring.c and the files device_ring_int.h lists).
 * In step mode the ring runs, per slice and step, one copy or reduce kernel
 * on the caller's stream, writing the next rank's FIFO slot in its GPU
 * memory (mapped by CUDA IPC), ordered by interprocess events. No kernel
 * ever waits for another process's kernel.
 */
struct brg__dev_ring;
/* The transport of the device link from rank `from` to rank `to`: the
 * first of brg__transports[] allowed by the communicator's transports that
 * carries device collectives between the two (cuda_ipc within a host,
 * unless BRIGADE_TRANSPORTS leaves it out; else the host link's, which
 * stages GPU payloads through its FIFO). NULL where none does. */
const brg__transport_ops *brg__device_link(const brg_comm *c, int from, int to);
/* 1 when a device link of the ring stages GPU payloads through a host
 * link (one without gpu_memory): kernel mode then takes the host proxy. */
int brg__device_staged_any(const brg_comm *c);
/* Builds the device ring at the first device collective on c (every rank
 * calls it at the same collective): two all-gathers over the host ring,
 * on the calling thread (device_setup.c). */
brg_status brg__device_ring_setup(brg_comm *c);
size_t brg__device_ring_slice_bytes(const struct brg__dev_ring *d);
/* Step mode's primitives run through brg__mem_device (ring_link.h). */
/*
 * Asynchronous mode (BRIGADE_DEVICE_PROXY; by default where the ring has a
 * link between hosts, whose waits are on the host): the host side of a
 * device collective runs on the communicator's thread, on the ring's own
 * stream, and the call returns at once. begin, on the caller's thread with
 * the communicator's qlock held (tickets follow the queue's order): the
 * ring's stream will wait for the caller's stream, and the caller's stream
 * for the collective, through a flag; k then names the ring's stream.
 * start, on the thread that runs it, before it; end, after it, with its
 * status (also when it never ran).
 */
int brg__device_ring_async(const struct brg__dev_ring *d);
/* Whether c's device collectives run in asynchronous mode: its device
 * ring's mode once made, else the one its setup will take (the same on
 * every rank), for the policy to choose by before the first call. */
int brg__device_async_mode(const brg_comm *c);
brg_status brg__device_async_begin(brg_comm *c, brg__coll *k);
brg_status brg__device_async_start(brg_comm *c, brg__coll *k);
void brg__device_async_end(brg_comm *c, brg__coll *k, brg_status s);
/* Kernel mode: the whole collective as one launch on its stream (the call
 * returns at once). brg__device_abort makes this rank's kernels stop at
 * their next wait (any thread). */
int brg__device_kernel_mode(const struct brg__dev_ring *d);
/* A device collective issued on a stream that is capturing a CUDA graph:
 * allowed in kernel mode once the device setup ran (k->captured set), else
 * BRG_ERR_INVALID_USAGE saying how to fix it; nothing else changes. */
brg_status brg__device_capture_check(brg_comm *c, const char *fn, brg__coll *k);
brg_status brg__device_kernel_run(brg_comm *c, brg__coll *k);
void brg__device_abort(brg_comm *c);
/* Kernel mode: why its kernels stopped since the last call (a fault they
 * found, the watchdog, a neighbour), recorded as the communicator's error;
 * BRG_SUCCESS while they run (brg_comm_get_async_error). */
brg_status brg__device_async_error(brg_comm *c);
/* Several rings (rings.c, through device_exec.c's fork and join): a device collective's parts 1..rings-1 run
 * on streams of their own (streams[r]) that start after what `stream` holds
 * now (fork), and `stream` continues after all of them (join). At most
 * BRG__DEVICE_MAX_RINGS rings. */
#define BRG__DEVICE_MAX_RINGS 16
brg_status brg__device_fork(brg_comm *c, void *stream, int rings, void **streams);
brg_status brg__device_join(brg_comm *c, void *stream, int rings);
/* buf[i] /= divisor on the stream (hier.c's BRG_AVG on GPU buffers). */
brg_status brg__device_divide(brg_comm *c, void *buf, size_t count, brg_dtype dtype, int divisor,
                              void *stream);
/* One rank: recvbuf = sendbuf, on the stream. */
brg_status brg__device_single(brg_comm *c, const brg__coll *k);
/* Teardown, in two halves around a barrier with the ring neighbours
 * (comm.c): drain waits, up to the communicator's timeout, for the device
 * work this rank enqueued, and says which stream and peers it waits for
 * when it cannot finish; free then frees the ring, unless the work could
 * not drain (then nothing the stream may still touch is freed). */
brg_status brg__device_ring_drain(brg_comm *c);
/* Kernel mode's graph replays at destroy (brg__exec_bye_word and
 * brg__exec_settle): the blocks they began, and the wait for this rank's
 * to have begun as many as its neighbours' before the abort. */
uint64_t brg__device_bye_word(const brg_comm *c);
brg_status brg__device_ring_settle(brg_comm *c, uint64_t theirs);
/* Stops kernel mode's host proxy (its links between hosts), once the
 * drain and the goodbyes are done; nothing when there is none. */
void brg__device_proxy_stop(brg_comm *c);
void brg__device_ring_free(brg_comm *c);

#endif
