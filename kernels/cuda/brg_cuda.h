/*
 * The interface of the CUDA module, libbrigade_cuda.so.
 *
 * The core library never links against CUDA: it opens this module with
 * dlopen() where one was built (runtime/device/device.c) and reaches the GPU only
 * through the table below. The table uses plain C types (CUDA errors travel
 * as int, streams as void *), so this header compiles without the CUDA
 * toolkit and the module can be rebuilt without touching the core.
 *
 * Every function that returns int returns 0 (cudaSuccess) or a CUDA error
 * code that error_string() turns into text.
 */
#ifndef BRG_CUDA_H
#define BRG_CUDA_H

#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Raised whenever the table changes shape; the loader refuses other values. */
#define BRG__CUDA_ABI 14

/* Name of the one symbol the module exports. */
#define BRG__CUDA_ENTRY "brg__cuda_module_api"

/*
 * The module's table is two: the kernels, what runs on the GPU (the
 * device forms of kernels.h and kernel mode's ring kernel), and the
 * driver, what manages it (devices, memory, streams, events, IPC, graphs).
 */
typedef struct brg__cuda_kernels {
  /*
   * The device forms of kernels.h, enqueued on `stream` (NULL: the legacy
   * default stream). Same contract: dst0[i] = a[i] (op) b[i] and, when dst1
   * is not NULL, dst1[i] = dst0[i]; BRG_AVG sums and divides by `divisor`.
   * Destinations may alias a source exactly, not partially. Pointers must be
   * aligned to the element size; 16-byte alignment (the same offset from a
   * 16-byte boundary for every pointer) takes the vectorized path.
   */
  int (*reduce)(void *dst0, void *dst1, const void *a, const void *b, size_t count, int dtype,
                int op, int divisor, void *stream);
  int (*copy)(void *dst0, void *dst1, const void *src, size_t bytes, void *stream);
  int (*divide)(void *dst, const void *src, size_t count, int dtype, int divisor, void *stream);

  /* The most thread blocks one reduce, copy or divide launch may use, 1 to
   * 1024 (BRIGADE_DEVICE_BLOCKS; 32 until set): a collective runs beside
   * the training computation and must not take every SM. A launch uses
   * the fewest of this, what the size needs and what fits on the GPU. */
  int (*set_max_blocks)(int blocks);

  /* dst[i] = src[i] converted, on `stream`: float32/float64 to
   * float16/bfloat16 scaled first (float64 times scale in double, rounded
   * to float32, then to half), or float16/bfloat16 widened to
   * float32/float64; rounding and NaN as elem.h's conversions. Other pairs:
   * an invalid-value error. For the gradient reducer's compression hooks. */
  int (*cast)(void *dst, int dst_dtype, const void *src, int src_dtype, size_t count, float scale,
              void *stream);
  /* A kernel of one thread block that stays busy for `us` microseconds on
   * `stream`: computation stood in for by benchmarks. */
  int (*busy)(unsigned us, void *stream);

  /* Kernel mode: one launch of ring_kernel.cuh on `stream`, `channels`
   * thread blocks of `threads` threads (a multiple of 32, at most 512);
   * args is a brg__rk_args (ring_args.h) of args_bytes bytes, copied at
   * the launch. */
  int (*ring_launch)(const void *args, size_t args_bytes, int channels, int threads, void *stream);
  /* Kernel mode's co-residency on the current device: its SMs, and the
   * thread blocks of ring_launch's kernels of `threads` threads that one
   * SM holds at once (the fewest over the kernels, by their registers and
   * shared memory: cudaOccupancyMaxActiveBlocksPerMultiprocessor). Blocks
   * beyond sms x blocks_per_sm wait for one to end, and kernel mode's
   * spinning blocks must all run at once. *sms 0: no bound known. */
  int (*ring_occupancy)(int threads, int *sms, int *blocks_per_sm);
} brg__cuda_kernels;

typedef struct brg__cuda_driver {
  /* Number of usable devices (> 0), or <= 0 with the reason written to why. */
  int (*probe)(char *why, size_t why_bytes);
  /* Name and compute capability of the current device, for logs. */
  void (*describe)(char *out, size_t out_bytes);
  const char *(*error_string)(int err);

  /* 1 when p is device (or managed) memory, setting *device; 0 for host
   * memory; a CUDA query that fails counts as host memory. */
  int (*pointer_is_device)(const void *p, int *device);

  /* Plain helpers for tests and tools that must not include CUDA headers. */
  int (*mem_alloc)(void **p, size_t bytes);
  int (*mem_free)(void *p);
  /* Synchronous: the work is done on return. They do not wait for work on
   * other streams (synchronize those first). */
  int (*mem_copy)(void *dst, const void *src, size_t bytes); /* any direction */
  int (*mem_set)(void *p, int value, size_t bytes);
  int (*stream_sync)(void *stream);
  int (*last_error)(void); /* pops the sticky launch error, as cudaGetLastError */

  /*
   * CUDA IPC between processes of one host (transport/cuda_ipc.cu). Handles
   * are BRG__CUDA_IPC_HANDLE_BYTES opaque bytes that travel over the
   * bootstrap. Two processes on the SAME device work too: nothing here asks
   * for peer access between devices.
   *
   * The step mode uses these so that no kernel ever waits on another
   * process's kernel (kernels of different processes on one GPU are
   * time-sliced unless MPS runs): a sender writes a slot of the receiver's
   * FIFO with a kernel or copy on its stream, records its exported event and
   * tells the receiver on the host; the receiver makes its stream wait for
   * that event and runs its own kernel. The only waiting is in the streams
   * and on the host.
   */
  int (*ipc_mem_export)(void **p, size_t bytes, void *handle); /* cudaMalloc + handle */
  int (*ipc_mem_open)(void **p, const void *handle);           /* map a peer's memory */
  int (*ipc_mem_close)(void *p);                               /* unmap what open mapped */
  int (*ipc_event_export)(void **event, void *handle);         /* interprocess event + handle */
  int (*ipc_event_open)(void **event, const void *handle);
  int (*event_destroy)(void *event);
  int (*event_record)(void *event, void *stream);
  int (*stream_wait_event)(void *stream, void *event);
  int (*event_sync)(void *event);
  int (*stream_create)(void **stream); /* non-blocking stream */
  int (*stream_destroy)(void *stream);
  /* UUID of the current device, so ranks can tell that they share one. */
  int (*device_uuid)(unsigned char uuid[16]);

  /* Timing, for benchmarks: an event that records time, and the
   * milliseconds between two recorded ones (after both completed). */
  int (*event_create_timing)(void **event);
  int (*event_elapsed_ms)(float *ms, void *start, void *end);

  /* Pins host memory and maps it for kernels (cudaHostRegister, mapped and
   * portable); *dev is the address kernels use. For links between hosts,
   * whose FIFOs are host memory the network transport moves. */
  int (*host_register)(void *p, size_t bytes, void **dev);
  int (*host_unregister)(void *p);

  /* A dmabuf file descriptor for [p, p + bytes) of device memory, for RDMA
   * registration (GPUDirect RDMA): *fd covers whole host pages and p lies
   * *offset bytes into it. The caller closes *fd. BRG__CUDA_ERR_NO_DMABUF
   * where the device or driver has no dmabuf support. */
  int (*dmabuf_export)(void *p, size_t bytes, int *fd, unsigned long long *offset);

  /* 0 once the event's last record has run, -1 while it has not, else an
   * error: for waits with a deadline (a dead peer's event never comes). */
  int (*event_query)(void *event);

  /* The calling thread's current device: memory, streams and events
   * belong to the device current when they are made, and kernels go into
   * streams of the current device. */
  int (*set_device)(int device);
  int (*get_device)(int *device);
  /* Whether kernels of `device` can reach memory of `peer`, and letting
   * them (from the current device to `peer`; already enabled counts as
   * done: the call returns 0). */
  int (*can_access_peer)(int *can, int device, int peer);
  int (*enable_peer_access)(int peer);

  /* An event for ordering only (no timing), cheap to record. */
  int (*event_create)(void **event);
  /*
   * Stream memory operations on a 32-bit word of mapped host memory (`addr`
   * is the address host_register gave kernels): wait_value holds `stream`
   * until (int32_t)(*addr - value) >= 0, so a counter that wraps still
   * compares right; write_value stores `value` once the stream's earlier
   * work has run. A collective whose host side runs on another thread
   * orders the caller's stream with them. BRG__CUDA_ERR_NO_MEMOPS where the
   * driver has none.
   */
  int (*stream_wait_value)(void *stream, void *addr, unsigned value);
  int (*stream_write_value)(void *stream, void *addr, unsigned value);
  /* Makes the RDMA writes into the current device's memory that the host
   * has seen complete visible to the work enqueued after this call
   * (GPUDirect RDMA receive); 0 also where the device orders them itself.
   * BRG__CUDA_ERR_NO_FLUSH where it can do neither. */
  int (*flush_rdma_writes)(void);

  /*
   * CUDA graphs. stream_capturing sets *capturing to 1 while `stream` is
   * capturing (cudaStreamIsCapturing), else 0. The other four are for
   * tests and tools: capture_begin starts capturing `stream`, in global
   * mode (no thread of the process may make a potentially unsafe call,
   * such as an allocation, meanwhile: torch's default) or, with global 0,
   * in thread-local mode (only the capturing thread may not);
   * capture_end ends it and instantiates what was captured as an
   * executable graph; graph_launch runs one on a stream; graph_destroy
   * frees it.
   */
  int (*stream_capturing)(void *stream, int *capturing);
  int (*capture_begin)(void *stream, int global);
  int (*capture_end)(void *stream, void **graph);
  int (*graph_launch)(void *graph, void *stream);
  int (*graph_destroy)(void *graph);

  /*
   * Whether kernels of the GPU whose UUID is `uuid` (another rank's, from
   * device_uuid) can reach memory of this process's device `device`,
   * found without making a context on any device (no set_device): *can is
   * 1 or 0 and *how says how it was decided (BRG__CUDA_REACH_*). A GPU
   * this process does not see (CUDA_VISIBLE_DEVICES per process) is asked
   * of NVML, which sees every GPU of the host; without NVML it is taken as
   * reachable, as CUDA IPC maps memory of such GPUs (the sender's open is
   * then the test). An error when no GPU of the host has that UUID.
   */
  int (*uuid_reaches)(const unsigned char uuid[16], int device, int *can, int *how);
  /* Whether contexts on `device` are shared through MPS (the driver's
   * cudaDevAttrMpsEnabled): *on 1 or 0. BRG__CUDA_ERR_NO_MPS_QUERY where
   * the driver cannot tell. */
  int (*mps_enabled)(int device, int *on);
  /* Loads every kernel of the module on the current device. Under lazy
   * loading (CUDA_MODULE_LOADING=LAZY, the default since CUDA 12.2) a
   * kernel's first launch loads it, and a load may wait for all work on
   * the device: a collective whose first launch waited so for another
   * rank's kernel, which waits for this one, would hang. The device setup
   * calls this before its last all-gather, so no collective loads. */
  int (*load_kernels)(void);
} brg__cuda_driver;

typedef struct brg__cuda_api {
  int abi; /* BRG__CUDA_ABI */
  brg__cuda_driver drv;
  brg__cuda_kernels kern;
} brg__cuda_api;

#define BRG__CUDA_IPC_HANDLE_BYTES 64

/* The module's own error codes, above CUDA's; error_string() explains them. */
#define BRG__CUDA_ERR_NO_DMABUF 100001    /* dmabuf_export: the device or driver cannot */
#define BRG__CUDA_ERR_NO_MEMOPS 100002    /* stream_wait_value / stream_write_value */
#define BRG__CUDA_ERR_NO_FLUSH 100003     /* flush_rdma_writes */
#define BRG__CUDA_ERR_NO_MPS_QUERY 100004 /* mps_enabled */

/* uuid_reaches' *how. */
#define BRG__CUDA_REACH_SAME 0    /* the GPU is `device` itself */
#define BRG__CUDA_REACH_PEER 1    /* visible here: cudaDeviceCanAccessPeer */
#define BRG__CUDA_REACH_NVML 2    /* not visible here: NVML's P2P status */
#define BRG__CUDA_REACH_ASSUMED 3 /* not visible here, no NVML: taken as reachable */

typedef const brg__cuda_api *(*brg__cuda_entry_fn)(void);

/* The module's entry point (BRG__CUDA_ENTRY). The core library reaches it
 * with dlsym(); programs linked with the module's objects (the kernel
 * benchmark) call it directly. */
const brg__cuda_api *brg__cuda_module_api(void);

/* The table of a module opened with dlopen(): what its entry point returns,
 * or NULL when it has none. The caller compares abi with BRG__CUDA_ABI. */
static inline const brg__cuda_api *brg__cuda_table(void *dl) {
  void *sym = dlsym(dl, BRG__CUDA_ENTRY);
  brg__cuda_entry_fn entry;
  memcpy(&entry, &sym, sizeof entry);
  return entry ? entry() : NULL;
}

/* For programs that see only the public API (tests, benchmarks): opens the
 * module at `path` (the file the library opens too, so one instance) and
 * returns its table once it has found a GPU; else NULL, with why. */
static inline const brg__cuda_api *brg__cuda_open(const char *path, char *why, size_t cap) {
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    snprintf(why, cap, "%s", dlerror());
    return NULL;
  }
  const brg__cuda_api *api = brg__cuda_table(h);
  if (!api || api->abi != BRG__CUDA_ABI) {
    snprintf(why, cap, "%s is not a CUDA module of this brigade (interface %d, expected %d)", path,
             api ? api->abi : -1, BRG__CUDA_ABI);
    return NULL;
  }
  if (api->drv.probe(why, cap) <= 0) return NULL;
  return api;
}

/* The module the library itself opens, for such programs: the file named
 * by BRIGADE_CUDA_MODULE, else libbrigade_cuda.so beside the shared object
 * that holds `anchor` (pass a function of libbrigade.so: the installed and
 * the build tree keep the two side by side), else the loader's search.
 * Needs _GNU_SOURCE (dladdr). */
#ifdef _GNU_SOURCE
static inline const brg__cuda_api *brg__cuda_open_beside(const void *anchor, char *why,
                                                         size_t cap) {
  char path[4096] = "libbrigade_cuda.so";
  const char *env = getenv("BRIGADE_CUDA_MODULE");
  Dl_info info;
  if (env && *env) {
    snprintf(path, sizeof path, "%s", env);
  } else if (dladdr(anchor, &info) && info.dli_fname && strrchr(info.dli_fname, '/')) {
    int dir = (int)(strrchr(info.dli_fname, '/') - info.dli_fname);
    snprintf(path, sizeof path, "%.*s/libbrigade_cuda.so", dir, info.dli_fname);
    if (access(path, F_OK) != 0) snprintf(path, sizeof path, "libbrigade_cuda.so");
  }
  return brg__cuda_open(path, why, cap);
}
#endif

#ifdef __cplusplus
}
#endif

#endif /* BRG_CUDA_H */
