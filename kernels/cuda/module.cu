/*
 * The table libbrigade_cuda.so hands to the core library (brg_cuda.h).
 * Only brg__cuda_module_api is exported; cudart is linked statically and
 * reaches the driver (libcuda.so.1) itself, at first use. The few driver
 * functions used here come through cudart too (driver_fn).
 */
#include <cuda.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "brg_cuda.h"

extern "C" int brg__cuda_reduce(void *d0, void *d1, const void *a, const void *b, size_t n,
                                int dtype, int op, int div, void *stream);
extern "C" int brg__cuda_divide(void *d, const void *s, size_t n, int dtype, int div, void *stream);
extern "C" int brg__cuda_copy(void *d0, void *d1, const void *s, size_t bytes, void *stream);
extern "C" int brg__cuda_set_max_blocks(int blocks);
extern "C" int brg__cuda_busy(unsigned us, void *stream);
extern "C" int brg__cuda_ring_launch(const void *args, size_t args_bytes, int channels, int threads,
                                     void *stream);
extern "C" int brg__cuda_ring_occupancy(int threads, int *sms, int *blocks_per_sm);
extern "C" int brg__cuda_cast(void *dst, int dst_dtype, const void *src, int src_dtype, size_t n,
                              float scale, void *stream);
extern "C" int brg__cuda_ring_load(void);
extern "C" int brg__cuda_elementwise_load(void);
extern "C" int brg__cuda_ipc_mem_export(void **p, size_t bytes, void *handle);
extern "C" int brg__cuda_ipc_mem_open(void **p, const void *handle);
extern "C" int brg__cuda_ipc_mem_close(void *p);
extern "C" int brg__cuda_ipc_event_export(void **event, void *handle);
extern "C" int brg__cuda_ipc_event_open(void **event, const void *handle);

namespace {

int probe(char *why, size_t n) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    /* cudart reports a missing driver and an old one alike (insufficient
     * driver); say which it is, and for an old one which versions. */
    int version = 0; /* the CUDA version the driver supports; 0: no driver */
    cudaDriverGetVersion(&version);
    void *drv = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (drv && version > 0 && version < CUDART_VERSION)
      snprintf(why, n,
               "the NVIDIA driver supports CUDA %d.%d, this module was built with CUDA %d.%d: "
               "install an NVIDIA driver for CUDA %d.%d or newer (cudaGetDeviceCount: %s)",
               version / 1000, version % 1000 / 10, CUDART_VERSION / 1000,
               CUDART_VERSION % 1000 / 10, CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10,
               cudaGetErrorName(e));
    else
      snprintf(why, n, "cudaGetDeviceCount failed: %s (%s)%s", cudaGetErrorName(e),
               cudaGetErrorString(e),
               drv ? "" : "; the NVIDIA driver library libcuda.so.1 is not installed");
    if (drv) dlclose(drv);
    cudaGetLastError();
    return -1;
  }
  if (count <= 0) {
    snprintf(why, n, "no CUDA device is visible (CUDA_VISIBLE_DEVICES=\"%s\")",
             getenv("CUDA_VISIBLE_DEVICES") ? getenv("CUDA_VISIBLE_DEVICES") : "(unset)");
    return 0;
  }
  return count;
}

void describe(char *out, size_t n) {
  int dev = 0, drv = 0, rt = 0;
  cudaDeviceProp p;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&p, dev) != cudaSuccess) {
    snprintf(out, n, "unknown CUDA device");
    cudaGetLastError();
    return;
  }
  cudaDriverGetVersion(&drv);
  cudaRuntimeGetVersion(&rt);
  snprintf(out, n, "device %d: %s, sm_%d%d, %d SMs, %.1f GiB; driver %d, runtime %d", dev, p.name,
           p.major, p.minor, p.multiProcessorCount, (double)p.totalGlobalMem / (1 << 30), drv, rt);
}

const char *error_string(int err) {
  if (err == BRG__CUDA_ERR_NO_DMABUF)
    /* Short: the runtime logs it after a prefix in a 128-byte buffer. */
    return "dmabuf export is not supported on this device/driver "
           "(CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED is 0)";
  if (err == BRG__CUDA_ERR_NO_MEMOPS)
    return "the driver has no stream memory operations (cuStreamWaitValue32)";
  if (err == BRG__CUDA_ERR_NO_FLUSH)
    return "the device can neither order nor flush GPUDirect RDMA writes";
  if (err == BRG__CUDA_ERR_NO_MPS_QUERY)
    return "the driver cannot tell whether MPS serves this device (no cudaDevAttrMpsEnabled)";
  return cudaGetErrorString(static_cast<cudaError_t>(err));
}

int pointer_is_device(const void *p, int *device) {
  cudaPointerAttributes a;
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  if (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged) return 0;
  if (device) *device = a.device;
  return 1;
}

int mem_alloc(void **p, size_t bytes) {
  return cudaMalloc(p, bytes);
}
int mem_free(void *p) {
  return cudaFree(p);
}
/* Synchronous in full: cudaMemcpy from pageable memory and device to device,
 * and cudaMemset, may return before the legacy stream has done the work,
 * and the collectives run on non-blocking streams that do not wait for it. */
int mem_copy(void *dst, const void *src, size_t bytes) {
  cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyDefault);
  return e != cudaSuccess ? e : cudaStreamSynchronize(cudaStreamLegacy);
}
int mem_set(void *p, int value, size_t bytes) {
  cudaError_t e = cudaMemset(p, value, bytes);
  return e != cudaSuccess ? e : cudaStreamSynchronize(cudaStreamLegacy);
}
int stream_sync(void *stream) {
  return cudaStreamSynchronize(static_cast<cudaStream_t>(stream));
}
int last_error(void) {
  return cudaGetLastError();
}

int event_destroy(void *ev) {
  return cudaEventDestroy(static_cast<cudaEvent_t>(ev));
}
int event_record(void *ev, void *stream) {
  return cudaEventRecord(static_cast<cudaEvent_t>(ev), static_cast<cudaStream_t>(stream));
}
int stream_wait_event(void *stream, void *ev) {
  return cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(ev), 0);
}
int event_sync(void *ev) {
  return cudaEventSynchronize(static_cast<cudaEvent_t>(ev));
}
int stream_create(void **stream) {
  cudaStream_t s;
  cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (e == cudaSuccess) *stream = s;
  return e;
}
int stream_destroy(void *stream) {
  return cudaStreamDestroy(static_cast<cudaStream_t>(stream));
}
int device_uuid(unsigned char uuid[16]) {
  int dev = 0;
  cudaDeviceProp p;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaGetDeviceProperties(&p, dev);
  if (e == cudaSuccess) memcpy(uuid, p.uuid.bytes, 16);
  return e;
}

int event_create_timing(void **event) {
  cudaEvent_t ev;
  cudaError_t e = cudaEventCreate(&ev);
  if (e == cudaSuccess) *event = ev;
  return e;
}
int event_elapsed_ms(float *ms, void *start, void *end) {
  return cudaEventElapsedTime(ms, static_cast<cudaEvent_t>(start), static_cast<cudaEvent_t>(end));
}

int event_query(void *ev) {
  cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(ev));
  if (e == cudaErrorNotReady) {
    cudaGetLastError();
    return -1;
  }
  return e;
}
int set_device(int device) {
  return cudaSetDevice(device);
}
int get_device(int *device) {
  return cudaGetDevice(device);
}
int can_access_peer(int *can, int device, int peer) {
  return cudaDeviceCanAccessPeer(can, device, peer);
}
int enable_peer_access(int peer) {
  cudaError_t e = cudaDeviceEnablePeerAccess(peer, 0);
  if (e == cudaErrorPeerAccessAlreadyEnabled) {
    cudaGetLastError();
    return cudaSuccess;
  }
  return e;
}

/* NVML, opened at run time (the toolkit ships no header for it here):
 * only what uuid_reaches asks, declared as the library defines it. */
typedef struct nvml_device *nvml_device_t;
struct nvml_api {
  int (*init)(void);
  int (*by_uuid)(const char *uuid, nvml_device_t *dev);
  int (*by_bus)(const char *bus, nvml_device_t *dev);
  int (*p2p)(nvml_device_t a, nvml_device_t b, int index, int *status);
};
const nvml_api *nvml(void) {
  static nvml_api n;
  static int state; /* 0 not tried, 1 usable, -1 not */
  static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  pthread_mutex_lock(&mu);
  if (state == 0) {
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    state = -1;
    if (h) {
      void *f[4] = {dlsym(h, "nvmlInit_v2"), dlsym(h, "nvmlDeviceGetHandleByUUID"),
                    dlsym(h, "nvmlDeviceGetHandleByPciBusId_v2"),
                    dlsym(h, "nvmlDeviceGetP2PStatus")};
      if (f[0] && f[1] && f[2] && f[3]) {
        memcpy(&n.init, &f[0], sizeof f[0]);
        memcpy(&n.by_uuid, &f[1], sizeof f[1]);
        memcpy(&n.by_bus, &f[2], sizeof f[2]);
        memcpy(&n.p2p, &f[3], sizeof f[3]);
        if (n.init() == 0) state = 1;
      }
    }
  }
  pthread_mutex_unlock(&mu);
  return state == 1 ? &n : NULL;
}

/* Finds the GPU by UUID among the devices this process sees with
 * cudaGetDeviceProperties, and asks cudaDeviceCanAccessPeer: neither
 * makes a context (cudaSetDevice would, on every device it visits). */
int uuid_reaches(const unsigned char uuid[16], int device, int *can, int *how) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) return e;
  for (int i = 0; i < n; i++) {
    cudaDeviceProp p;
    if ((e = cudaGetDeviceProperties(&p, i)) != cudaSuccess) return e;
    if (memcmp(p.uuid.bytes, uuid, 16)) continue;
    if (i == device) {
      *how = BRG__CUDA_REACH_SAME;
      *can = 1;
      return cudaSuccess;
    }
    *how = BRG__CUDA_REACH_PEER;
    return cudaDeviceCanAccessPeer(can, i, device);
  }
  /* Not among this process's devices: NVML sees every GPU of the host. */
  const nvml_api *nv = nvml();
  char id[64], bus[32];
  nvml_device_t a, b;
  int status = 1;
  if (nv && cudaDeviceGetPCIBusId(bus, sizeof bus, device) == cudaSuccess) {
    snprintf(id, sizeof id,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", uuid[0],
             uuid[1], uuid[2], uuid[3], uuid[4], uuid[5], uuid[6], uuid[7], uuid[8], uuid[9],
             uuid[10], uuid[11], uuid[12], uuid[13], uuid[14], uuid[15]);
    /* index 1: NVML_P2P_CAPS_INDEX_WRITE; status 0: NVML_P2P_STATUS_OK */
    if (nv->by_uuid(id, &a) == 0 && nv->by_bus(bus, &b) == 0 && nv->p2p(a, b, 1, &status) == 0) {
      *how = BRG__CUDA_REACH_NVML;
      *can = status == 0;
      return cudaSuccess;
    }
  }
  *how = BRG__CUDA_REACH_ASSUMED;
  *can = 1;
  return cudaSuccess;
}

int mps_enabled(int device, int *on) {
  int v = 0;
  cudaError_t e = cudaDeviceGetAttribute(&v, cudaDevAttrMpsEnabled, device);
  if (e == cudaErrorInvalidValue) {
    cudaGetLastError();
    return BRG__CUDA_ERR_NO_MPS_QUERY;
  }
  if (e == cudaSuccess) *on = v != 0;
  return e;
}

int host_register(void *p, size_t bytes, void **dev) {
  cudaError_t e = cudaHostRegister(p, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable);
  if (e != cudaSuccess) return e;
  e = cudaHostGetDevicePointer(dev, p, 0);
  if (e != cudaSuccess) cudaHostUnregister(p);
  return e;
}
int host_unregister(void *p) {
  return cudaHostUnregister(p);
}

/* Driver functions, reached through the runtime so that the module does not
 * link against libcuda (cuda.h gives only their types). NULL where the
 * driver has none. */
void *driver_fn(const char *name, int cuda_version) {
  void *sym = NULL;
  cudaDriverEntryPointQueryResult q;
  if (cudaGetDriverEntryPointByVersion(name, &sym, cuda_version, cudaEnableDefault, &q) !=
          cudaSuccess ||
      q != cudaDriverEntryPointSuccess) {
    cudaGetLastError();
    return NULL;
  }
  return sym;
}

/* CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED of the current device. The runtime
 * API has no name for it (cudaDevAttrReserved124 in CUDA 13), so this asks
 * the driver; a driver too old to know it cannot export either. */
bool dmabuf_supported(void) {
  typedef CUresult (*device_get_fn)(CUdevice *, int);
  typedef CUresult (*attribute_fn)(int *, CUdevice_attribute, CUdevice);
  device_get_fn get = reinterpret_cast<device_get_fn>(driver_fn("cuDeviceGet", 2000));
  attribute_fn attr = reinterpret_cast<attribute_fn>(driver_fn("cuDeviceGetAttribute", 2000));
  int ordinal = 0, supported = 0;
  CUdevice dev;
  if (!get || !attr || cudaGetDevice(&ordinal) != cudaSuccess) return false;
  return get(&dev, ordinal) == CUDA_SUCCESS &&
         attr(&supported, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, dev) == CUDA_SUCCESS && supported;
}

int dmabuf_export(void *p, size_t bytes, int *fd, unsigned long long *offset) {
  typedef CUresult (*get_handle_fn)(void *handle, CUdeviceptr dptr, size_t size,
                                    CUmemRangeHandleType type, unsigned long long flags);
  if (!dmabuf_supported()) return BRG__CUDA_ERR_NO_DMABUF;
  get_handle_fn get_handle =
      reinterpret_cast<get_handle_fn>(driver_fn("cuMemGetHandleForAddressRange", 11070));
  if (!get_handle) return BRG__CUDA_ERR_NO_DMABUF;
  /* The range must cover whole host pages (the driver's rule): 4 KiB on
   * x86-64, 64 KiB on many aarch64 machines such as GH200. */
  long host_page = sysconf(_SC_PAGESIZE);
  const unsigned long long page = host_page > 0 ? (unsigned long long)host_page : 4096;
  unsigned long long a = reinterpret_cast<unsigned long long>(p);
  unsigned long long base = a & ~(page - 1), end = (a + bytes + page - 1) & ~(page - 1);
  int h = -1;
  if (get_handle(&h, base, end - base, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0) != CUDA_SUCCESS ||
      h < 0)
    return cudaErrorNotSupported;
  *fd = h;
  *offset = a - base;
  return cudaSuccess;
}

int event_create(void **event) {
  cudaEvent_t ev;
  cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  if (e == cudaSuccess) *event = ev;
  return e;
}

/* cuStreamWaitValue32 and cuStreamWriteValue32 (CUDA 12's forms, which
 * every driver since has), looked up once. */
typedef CUresult (*stream_value_fn)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
stream_value_fn memop(int write) {
  static stream_value_fn fns[2];
  static int looked;
  if (!__atomic_load_n(&looked, __ATOMIC_ACQUIRE)) {
    stream_value_fn w = reinterpret_cast<stream_value_fn>(driver_fn("cuStreamWaitValue32", 12000));
    stream_value_fn r = reinterpret_cast<stream_value_fn>(driver_fn("cuStreamWriteValue32", 12000));
    __atomic_store_n(&fns[0], w, __ATOMIC_RELAXED);
    __atomic_store_n(&fns[1], r, __ATOMIC_RELAXED);
    __atomic_store_n(&looked, 1, __ATOMIC_RELEASE);
  }
  return __atomic_load_n(&fns[write], __ATOMIC_RELAXED);
}

int stream_value(int write, void *stream, void *addr, unsigned value) {
  stream_value_fn fn = memop(write);
  if (!fn) return BRG__CUDA_ERR_NO_MEMOPS;
  CUresult r = fn(static_cast<CUstream>(stream), reinterpret_cast<CUdeviceptr>(addr), value,
                  write ? static_cast<unsigned>(CU_STREAM_WRITE_VALUE_DEFAULT)
                        : static_cast<unsigned>(CU_STREAM_WAIT_VALUE_GEQ));
  if (r == CUDA_ERROR_NOT_SUPPORTED) return BRG__CUDA_ERR_NO_MEMOPS;
  /* CUresult and cudaError_t share the codes that matter here. */
  return r == CUDA_SUCCESS ? 0 : static_cast<int>(cudaErrorUnknown);
}
int stream_wait_value(void *stream, void *addr, unsigned value) {
  return stream_value(0, stream, addr, value);
}
int stream_write_value(void *stream, void *addr, unsigned value) {
  return stream_value(1, stream, addr, value);
}

int flush_rdma_writes(void) {
  int dev = 0, ordering = 0, options = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess)
    e = cudaDeviceGetAttribute(&ordering, cudaDevAttrGPUDirectRDMAWritesOrdering, dev);
  if (e == cudaSuccess)
    e = cudaDeviceGetAttribute(&options, cudaDevAttrGPUDirectRDMAFlushWritesOptions, dev);
  if (e != cudaSuccess) return e;
  /* Writes ordered for the device's own work need no flush. */
  if (ordering >= cudaGPUDirectRDMAWritesOrderingOwner) return cudaSuccess;
  if (!(options & cudaFlushGPUDirectRDMAWritesOptionHost)) return BRG__CUDA_ERR_NO_FLUSH;
  return cudaDeviceFlushGPUDirectRDMAWrites(cudaFlushGPUDirectRDMAWritesTargetCurrentDevice,
                                            cudaFlushGPUDirectRDMAWritesToOwner);
}

int stream_capturing(void *stream, int *capturing) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  cudaError_t e = cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &st);
  *capturing = e == cudaSuccess && st != cudaStreamCaptureStatusNone;
  return e;
}
int capture_begin(void *stream, int global) {
  return cudaStreamBeginCapture(static_cast<cudaStream_t>(stream),
                                global ? cudaStreamCaptureModeGlobal
                                       : cudaStreamCaptureModeThreadLocal);
}
int capture_end(void *stream, void **graph) {
  cudaGraph_t g = NULL;
  cudaGraphExec_t x = NULL;
  cudaError_t e = cudaStreamEndCapture(static_cast<cudaStream_t>(stream), &g);
  if (e != cudaSuccess) return e;
  e = cudaGraphInstantiate(&x, g, 0);
  cudaGraphDestroy(g);
  if (e == cudaSuccess) *graph = x;
  return e;
}
int graph_launch(void *graph, void *stream) {
  return cudaGraphLaunch(static_cast<cudaGraphExec_t>(graph), static_cast<cudaStream_t>(stream));
}
int graph_destroy(void *graph) {
  return cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(graph));
}

/* Touching each kernel (cudaFuncGetAttributes) loads it under lazy
 * loading, so that no collective's launch does; once per device. */
int load_kernels(void) {
  static unsigned char done[64];
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  if (dev >= 0 && dev < 64 && __atomic_load_n(&done[dev], __ATOMIC_ACQUIRE)) return cudaSuccess;
  int r = brg__cuda_elementwise_load();
  if (r == 0) r = brg__cuda_ring_load();
  if (r == 0 && dev >= 0 && dev < 64) __atomic_store_n(&done[dev], 1, __ATOMIC_RELEASE);
  return r;
}

const brg__cuda_api api = {
    .abi = BRG__CUDA_ABI,
    .drv =
        {
            .probe = probe,
            .describe = describe,
            .error_string = error_string,
            .pointer_is_device = pointer_is_device,
            .mem_alloc = mem_alloc,
            .mem_free = mem_free,
            .mem_copy = mem_copy,
            .mem_set = mem_set,
            .stream_sync = stream_sync,
            .last_error = last_error,
            .ipc_mem_export = brg__cuda_ipc_mem_export,
            .ipc_mem_open = brg__cuda_ipc_mem_open,
            .ipc_mem_close = brg__cuda_ipc_mem_close,
            .ipc_event_export = brg__cuda_ipc_event_export,
            .ipc_event_open = brg__cuda_ipc_event_open,
            .event_destroy = event_destroy,
            .event_record = event_record,
            .stream_wait_event = stream_wait_event,
            .event_sync = event_sync,
            .stream_create = stream_create,
            .stream_destroy = stream_destroy,
            .device_uuid = device_uuid,
            .event_create_timing = event_create_timing,
            .event_elapsed_ms = event_elapsed_ms,
            .host_register = host_register,
            .host_unregister = host_unregister,
            .dmabuf_export = dmabuf_export,
            .event_query = event_query,
            .set_device = set_device,
            .get_device = get_device,
            .can_access_peer = can_access_peer,
            .enable_peer_access = enable_peer_access,
            .event_create = event_create,
            .stream_wait_value = stream_wait_value,
            .stream_write_value = stream_write_value,
            .flush_rdma_writes = flush_rdma_writes,
            .stream_capturing = stream_capturing,
            .capture_begin = capture_begin,
            .capture_end = capture_end,
            .graph_launch = graph_launch,
            .graph_destroy = graph_destroy,
            .uuid_reaches = uuid_reaches,
            .mps_enabled = mps_enabled,
            .load_kernels = load_kernels,
        },
    .kern =
        {
            .reduce = brg__cuda_reduce,
            .copy = brg__cuda_copy,
            .divide = brg__cuda_divide,
            .set_max_blocks = brg__cuda_set_max_blocks,
            .cast = brg__cuda_cast,
            .busy = brg__cuda_busy,
            .ring_launch = brg__cuda_ring_launch,
            .ring_occupancy = brg__cuda_ring_occupancy,
        },
};

} // namespace

extern "C" __attribute__((visibility("default"))) const brg__cuda_api *brg__cuda_module_api(void) {
  return &api;
}
