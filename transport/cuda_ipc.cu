/*
 * CUDA IPC pieces of the cuda_ipc transport, compiled into the CUDA module
 * (the core library reaches them through brg_cuda.h's table).
 *
 * A connection's receive FIFO lives in the receiver's device memory; the
 * receiver exports it with a legacy cudaIpc handle and the sender maps it.
 * Legacy handles work between two processes on the same device, which is
 * how a one-GPU machine runs a ring; no cudaDeviceCanAccessPeer gate. Events
 * are created interprocess (and without timing, as IPC requires) so that
 * one process's stream can wait for work another process enqueued.
 */
#include <cuda_runtime.h>
#include <string.h>

#include "brg_cuda.h"

static_assert(sizeof(cudaIpcMemHandle_t) <= BRG__CUDA_IPC_HANDLE_BYTES, "IPC handle size");
static_assert(sizeof(cudaIpcEventHandle_t) <= BRG__CUDA_IPC_HANDLE_BYTES, "IPC handle size");

extern "C" int brg__cuda_ipc_mem_export(void **p, size_t bytes, void *handle) {
  void *mem = NULL;
  cudaError_t e = cudaMalloc(&mem, bytes);
  if (e != cudaSuccess) return e;
  cudaIpcMemHandle_t h;
  e = cudaIpcGetMemHandle(&h, mem);
  if (e != cudaSuccess) {
    cudaFree(mem);
    return e;
  }
  memset(handle, 0, BRG__CUDA_IPC_HANDLE_BYTES);
  memcpy(handle, &h, sizeof h);
  *p = mem;
  return cudaSuccess;
}

extern "C" int brg__cuda_ipc_mem_open(void **p, const void *handle) {
  cudaIpcMemHandle_t h;
  memcpy(&h, handle, sizeof h);
  return cudaIpcOpenMemHandle(p, h, cudaIpcMemLazyEnablePeerAccess);
}

extern "C" int brg__cuda_ipc_mem_close(void *p) {
  return cudaIpcCloseMemHandle(p);
}

extern "C" int brg__cuda_ipc_event_export(void **event, void *handle) {
  cudaEvent_t ev;
  cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming | cudaEventInterprocess);
  if (e != cudaSuccess) return e;
  cudaIpcEventHandle_t h;
  e = cudaIpcGetEventHandle(&h, ev);
  if (e != cudaSuccess) {
    cudaEventDestroy(ev);
    return e;
  }
  memset(handle, 0, BRG__CUDA_IPC_HANDLE_BYTES);
  memcpy(handle, &h, sizeof h);
  *event = ev;
  return cudaSuccess;
}

extern "C" int brg__cuda_ipc_event_open(void **event, const void *handle) {
  cudaIpcEventHandle_t h;
  memcpy(&h, handle, sizeof h);
  cudaEvent_t ev;
  cudaError_t e = cudaIpcOpenEventHandle(&ev, h);
  if (e == cudaSuccess) *event = ev;
  return e;
}
