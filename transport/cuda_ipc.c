/*
 * cuda_ipc: device collectives between ranks of one host, GPU to GPU.
 *
 * The receiver of a link owns its memory: GPU memory that it exports with a
 * CUDA IPC handle, or, where the sender's GPU cannot reach the receiver's
 * (no peer access between them), pinned host memory that both GPUs reach,
 * shared with the sender's process under a name. The sender maps it, and
 * its kernels write straight into it: no copy on the way, no host in the
 * data path. Ranks of one process (threads) skip the handle and use the
 * pointer, with peer access turned on between their GPUs.
 *
 * The link carries the memory only. Who may write which part of it when
 * (step mode's interprocess events, kernel mode's flags, which live in the
 * memory itself) is the engine's: runtime/device/device_ring.c and device_step.c.
 *
 * Everything CUDA goes through the module's table (brg_cuda.h), which the
 * runtime loads and hands over in brg__gpu_link_params: this file compiles
 * and links without the CUDA toolkit.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cuda/brg_cuda.h"
#include "transport.h"

#define IPC_MAGIC 0x62726769u /* "brgi" */

/* What the receiver tells the sender (BRG__CONN_INFO_BYTES at most). */
typedef struct ipc_info {
  uint32_t magic;
  uint32_t on_host; /* 1: pinned host memory, shared under `shm` */
  uint64_t process; /* the receiver's brg__gpu_desc.process */
  int32_t pid;
  int32_t gpu;
  uint64_t ptr; /* the memory, as the receiver's kernels reach it */
  uint64_t bytes;
  char shm[64];
  unsigned char handle[BRG__CUDA_IPC_HANDLE_BYTES];
} ipc_info;
_Static_assert(sizeof(ipc_info) <= BRG__CONN_INFO_BYTES, "cuda_ipc info");

typedef struct ipc_priv {
  const brg__cuda_api *api;
  int recv;   /* this end owns the memory */
  char *mem;  /* as this end's kernels reach it */
  char *host; /* pinned host memory: this end's mapping (NULL: GPU memory) */
  size_t bytes;
  int opened;   /* mem came from ipc_mem_open */
  int on_host;  /* the memory is pinned host memory (mapped here or not) */
  char shm[64]; /* the receiver's name for host memory ("": none) */
} ipc_priv;

static int ipc_can_connect(const brg__peer_info *self, const brg__peer_info *peer) {
  return self->host_hash == peer->host_hash;
}

/* The CUDA module is the runtime's to load: a device collective that finds
 * none fails before it gets here. */
static int ipc_available(char *why, size_t n) {
  (void)why;
  (void)n;
  return 1;
}

static brg_status cuda_error(brg__errbuf *err, const brg__cuda_api *api, int e, const char *what,
                             const brg__conn_params *p) {
  return brg__error(err, BRG_ERR_SYSTEM, "init",
                    "cuda_ipc: rank %d, link with rank %d: %s failed: %s", p->rank, p->peer, what,
                    e == -1 ? strerror(errno) : api->drv.error_string(e));
}

int brg__cuda_ipc_reach(const struct brg__cuda_api *api, const brg__gpu_desc *self,
                        const brg__gpu_desc *peer, char *why, size_t n) {
  int can = 0, how = -1, e = 0;
  if (!memcmp(peer->uuid, self->uuid, 16)) {
    can = 1;
    how = BRG__CUDA_REACH_SAME;
  } else if (peer->process == self->process) {
    how = BRG__CUDA_REACH_PEER;
    e = api->drv.can_access_peer(&can, peer->gpu, self->gpu);
  } else {
    /* Another process's GPU, by its UUID: no set_device on any device
     * (each would make a context), and found even where this process
     * does not see it (CUDA_VISIBLE_DEVICES per process). */
    e = api->drv.uuid_reaches(peer->uuid, self->gpu, &can, &how);
  }
  if (e) {
    snprintf(why, n, "the driver could not tell (%s): taken as unreachable",
             api->drv.error_string(e));
    return 0;
  }
  snprintf(why, n, "%s",
           how == BRG__CUDA_REACH_SAME ? "the same GPU"
           : how == BRG__CUDA_REACH_PEER
               ? (can ? "peer access between them (cudaDeviceCanAccessPeer)"
                      : "no peer access between them (cudaDeviceCanAccessPeer)")
           : how == BRG__CUDA_REACH_NVML
               ? (can ? "peer access between them (NVML; the sender's GPU is not visible here)"
                      : "no peer access between them (NVML; the sender's GPU is not visible "
                        "here)")
               : "the sender's GPU is not visible here and NVML cannot tell: taken as "
                 "reachable (CUDA IPC maps memory of GPUs a process does not see)");
  return can;
}

int brg__cuda_ipc_reaches(const struct brg__cuda_api *api, const brg__gpu_desc *self,
                          const brg__gpu_desc *peer) {
  char why[160];
  return brg__cuda_ipc_reach(api, self, peer, why, sizeof why);
}

int brg__cuda_ipc_on_host(const brg__conn *c) {
  const ipc_priv *v = c->priv;
  return v && v->on_host;
}

static void view(brg__conn *c, const brg__conn_params *p, char *mem) {
  c->fifo = (brg__fifo){.data = mem, .nslots = p->nslots, .slot_bytes = p->slot_bytes};
}

static brg_status ipc_priv_new(brg__conn *c, const brg__conn_params *p, int recv,
                               brg__errbuf *err) {
  if (!p->gpu || !p->gpu->api)
    return brg__error(err, BRG_ERR_INVALID_USAGE, "init",
                      "rank %d, link with rank %d: cuda_ipc carries device collectives only "
                      "(no GPU parameters given)",
                      p->rank, p->peer);
  ipc_priv *v = calloc(1, sizeof *v);
  if (!v) return brg__error(err, BRG_ERR_NO_MEMORY, "init", "cuda_ipc: out of host memory");
  v->api = p->gpu->api;
  v->recv = recv;
  v->bytes = p->gpu->bytes;
  c->priv = v;
  return BRG_SUCCESS;
}

/* Pinned host memory, shared with the sender's process under a name where
 * it is another process; 0, a CUDA error, or -1 with errno. */
static int host_alloc(ipc_priv *v, const brg__conn_params *p, int shared, ipc_info *info) {
  void *m = MAP_FAILED;
  if (shared) {
    /* A random nonce ends the name, so that no other process can make it
     * first (O_EXCL then fails: another nonce, never the existing file). */
    int fd = -1;
    for (int attempt = 0; attempt < 8 && fd < 0; attempt++) {
      unsigned long long nonce = 0;
      if (getrandom(&nonce, sizeof nonce, 0) != (ssize_t)sizeof nonce) break;
      snprintf(v->shm, sizeof v->shm, "/brigade-gpufifo-%016llx-%d-%d-%016llx",
               (unsigned long long)p->comm_id, p->rank, p->peer, nonce);
      fd = shm_open(v->shm, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW, 0600);
      if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0) {
      v->shm[0] = 0;
      return -1;
    }
    if (ftruncate(fd, (off_t)v->bytes) == 0)
      m = mmap(NULL, v->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    snprintf(info->shm, sizeof info->shm, "%s", v->shm);
  } else {
    m = mmap(NULL, v->bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  }
  if (m == MAP_FAILED) return -1;
  memset(m, 0, v->bytes); /* touched now, not on the hot path */
  void *dev = NULL;
  int e = v->api->drv.host_register(m, v->bytes, &dev);
  if (e) {
    munmap(m, v->bytes);
    return e;
  }
  v->host = m;
  v->mem = dev;
  v->on_host = 1;
  info->on_host = 1;
  return 0;
}

static brg_status ipc_recv_setup(brg__conn *c, const brg__conn_params *p, void *info_out,
                                 brg__errbuf *err) {
  brg_status s = ipc_priv_new(c, p, 1, err);
  if (s != BRG_SUCCESS) return s;
  ipc_priv *v = c->priv;
  const brg__gpu_link_params *g = p->gpu;
  ipc_info info = {.magic = IPC_MAGIC,
                   .process = g->self.process,
                   .pid = g->self.pid,
                   .gpu = g->self.gpu,
                   .bytes = v->bytes};
  int e;
  const char *what;
  char why[160];
  if (!brg__cuda_ipc_reach(v->api, &g->self, &g->peer, why, sizeof why)) {
    if (!g->host_fallback)
      return brg__error(err, BRG_ERR_UNAVAILABLE, "init",
                        "rank %d's GPU %d cannot be reached from rank %d's GPU %d (%s)", p->rank,
                        g->self.gpu, p->peer, g->peer.gpu, why);
    what = "a receive FIFO in pinned host memory (no peer access from the sender's GPU)";
    e = host_alloc(v, p, g->peer.process != g->self.process, &info);
    if (!e)
      BRG__INFO("init",
                "rank %d: link from rank %d: pinned host memory (PCIe): GPU %d cannot be reached "
                "from rank %d's GPU %d: %s",
                p->rank, p->peer, g->self.gpu, p->peer, g->peer.gpu, why);
  } else {
    what = "cudaMalloc + cudaIpcGetMemHandle of the receive memory";
    e = v->api->drv.ipc_mem_export((void **)&v->mem, v->bytes, info.handle);
    if (!e)
      BRG__INFO("init",
                "rank %d: link from rank %d: GPU memory of GPU %d, written by rank %d's GPU %d: "
                "%s",
                p->rank, p->peer, g->self.gpu, p->peer, g->peer.gpu, why);
  }
  if (e) return cuda_error(err, v->api, e, what, p);
  info.ptr = (uint64_t)(uintptr_t)v->mem;
  memset(info_out, 0, BRG__CONN_INFO_BYTES);
  memcpy(info_out, &info, sizeof info);
  view(c, p, v->mem);
  return BRG_SUCCESS;
}

/* Lets this thread's kernels (on the current device) reach GPU `peer` of
 * this process. */
static brg_status reach(const brg__cuda_api *api, const brg__conn_params *p, int peer,
                        brg__errbuf *err) {
  int self = p->gpu->self.gpu;
  if (peer == self) return BRG_SUCCESS;
  int can = 0;
  int e = api->drv.can_access_peer(&can, self, peer);
  if (e) return cuda_error(err, api, e, "cudaDeviceCanAccessPeer", p);
  if (!can)
    return brg__error(err, BRG_ERR_UNAVAILABLE, "init",
                      "rank %d on GPU %d cannot reach the memory of rank %d on GPU %d (no peer "
                      "access between them)",
                      p->rank, self, p->peer, peer);
  if ((e = api->drv.enable_peer_access(peer)) != 0)
    return cuda_error(err, api, e, "cudaDeviceEnablePeerAccess", p);
  BRG__INFO("init", "rank %d: peer access from GPU %d to GPU %d (rank %d)", p->rank, self, peer,
            p->peer);
  return BRG_SUCCESS;
}

static brg_status ipc_send_connect(brg__conn *c, const brg__conn_params *p, const void *info_in,
                                   brg__errbuf *err) {
  brg_status s = ipc_priv_new(c, p, 0, err);
  if (s != BRG_SUCCESS) return s;
  ipc_priv *v = c->priv;
  ipc_info info;
  memcpy(&info, info_in, sizeof info);
  info.shm[sizeof info.shm - 1] = 0;
  if (info.magic != IPC_MAGIC)
    return brg__error(err, BRG_ERR_REMOTE, "init",
                      "rank %d: the link description from rank %d is not cuda_ipc's (magic "
                      "%08x)",
                      p->rank, p->peer, info.magic);
  if (info.bytes != v->bytes)
    return brg__error(err, BRG_ERR_MISMATCH, "init",
                      "rank %d's receive memory is %llu bytes, rank %d expects %zu (are the "
                      "device settings alike on every rank?)",
                      p->peer, (unsigned long long)info.bytes, p->rank, v->bytes);
  const brg__cuda_api *api = v->api;
  int e;
  if (info.process == p->gpu->self.process) {
    /* One process: its pointer; GPU memory of another GPU wants peer access. */
    if (!info.on_host && (s = reach(api, p, info.gpu, err)) != BRG_SUCCESS) return s;
    v->mem = (char *)(uintptr_t)info.ptr;
    v->on_host = (int)info.on_host;
  } else if (info.on_host) {
    int fd = shm_open(info.shm, O_RDWR, 0);
    void *m = fd < 0 ? MAP_FAILED : mmap(NULL, v->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (fd >= 0) close(fd);
    if (m == MAP_FAILED)
      return brg__error(err, BRG_ERR_SYSTEM, "init",
                        "rank %d: mapping the host FIFO %s of rank %d: %s", p->rank, info.shm,
                        p->peer, strerror(errno));
    void *dev = NULL;
    if ((e = api->drv.host_register(m, v->bytes, &dev)) != 0) {
      munmap(m, v->bytes);
      return cuda_error(err, api, e, "cudaHostRegister of the receiver's host FIFO", p);
    }
    v->host = m;
    v->on_host = 1;
    v->mem = dev;
    /* Both ends have it mapped (one sender per host FIFO): the name has
     * done its work, and a rank killed from now on leaves nothing. */
    shm_unlink(info.shm);
  } else {
    if ((e = api->drv.ipc_mem_open((void **)&v->mem, info.handle)) != 0)
      return brg__error(err, BRG_ERR_SYSTEM, "init",
                        "rank %d: mapping the GPU memory of rank %d (pid %d) with "
                        "cudaIpcOpenMemHandle failed: %s",
                        p->rank, p->peer, info.pid, api->drv.error_string(e));
    v->opened = 1;
  }
  view(c, p, v->mem);
  return BRG_SUCCESS;
}

/* Nothing left to do: the sender mapped the memory in send_connect. */
static brg_status ipc_recv_connect(brg__conn *c, const brg__conn_params *p, brg__errbuf *err) {
  (void)c;
  (void)p;
  (void)err;
  return BRG_SUCCESS;
}

/* Only once both ends' kernels are done with the memory (the engine
 * drains and says goodbye first). */
static void ipc_close(brg__conn *c) {
  ipc_priv *v = c->priv;
  c->priv = NULL;
  c->fifo = (brg__fifo){0};
  if (!v) return;
  const brg__cuda_api *api = v->api;
  if (v->host) {
    api->drv.host_unregister(v->host);
    munmap(v->host, v->bytes);
  } else if (v->opened) {
    api->drv.ipc_mem_close(v->mem);
  } else if (v->recv && v->mem) {
    api->drv.mem_free(v->mem);
  }
  if (v->shm[0]) shm_unlink(v->shm);
  free(v);
}

const brg__transport_ops brg__transport_cuda_ipc = {
    .name = "cuda_ipc",
    .carries = BRG__CARRIES_DEVICE,
    .gpu_memory = 1,
    .can_connect = ipc_can_connect,
    .available = ipc_available,
    .recv_setup = ipc_recv_setup,
    .send_connect = ipc_send_connect,
    .recv_connect = ipc_recv_connect,
    .close = ipc_close,
};
