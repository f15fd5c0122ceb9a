/*
 * Device collectives: the ring of ring.c with its payloads in GPU memory.
 *
 * The schedule, the slices and the host FIFOs are the host engine's; what
 * changes is where the bytes go. Each rank owns a receive FIFO of
 * BRIGADE_STEPS slots in its own GPU memory, exported with CUDA IPC and
 * mapped by the previous rank. Per slice and step a rank enqueues one copy
 * or reduce kernel on the caller's stream that reads its own slot and
 * writes the next rank's slot, exactly as the host primitive would:
 *
 *   prev rank                         this rank
 *   kernel writes my slot k  ---+
 *   record send_ev[k]           |
 *   host header for slot k  ----+-->  wait for the header (host)
 *                                     stream waits for prev's send_ev[k]
 *                                     kernel reads slot k (+ input) -> next
 *                                     record rel_ev[k]
 *   (slot k again, one lap on:) <---  host head++ (slot k is free)
 *   stream waits for rel_ev[k]
 *
 * So the only waiting is on the host (for headers, which come as soon as a
 * peer has enqueued its work) and in the streams (for events). No kernel
 * spins on another process's kernel, which matters on a GPU shared by
 * several processes without MPS: there the processes' kernels run in
 * turns, and a kernel spinning for another one would stall for a whole
 * time slice or forever. The call returns once its work is enqueued.
 *
 * Two ranks in one process use each other's pointers and events directly.
 *
 * A link between hosts has no CUDA IPC: there the slots are the network
 * transport's own host FIFO (tcp or ibverbs), pinned and mapped for
 * kernels. The sender's kernel writes the slot in host memory, the host
 * waits for it and posts the slot for the transport to carry; the
 * receiver's kernel reads the slot that arrived, and the host waits for it
 * before handing the slot back. Those waits make the call return only when
 * the collective is done on ranks with such a link. Where both ends can
 * register GPU memory with an ibverbs link (GPUDirect RDMA: the
 * transport's dev_register and dev_remote), the slots stay in GPU memory
 * and the link moves them GPU to GPU instead (BRIGADE_IB_GDR).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <errno.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "device.h"
#include "internal.h"
#include "settings.h"
#include "ring_link.h"

#define HB BRG__CUDA_IPC_HANDLE_BYTES

/* A payload sits in its GPU slot at the same offset from a 16-byte boundary
 * as its elements in the caller's buffers (counted from the start of the
 * collective, so every rank agrees), which keeps the kernels on their
 * 16-byte vector path when chunks start at odd elements. */
#define SLOT_SHIFT_ROOM 256

struct brg__dev_ring {
  const brg__cuda_api *api;
  int nslots;
  size_t slice_bytes;                 /* the pipeline unit: one slice per GPU slot */
  size_t stride;                      /* slice_bytes + room to shift a payload */
  char *fifo;                         /* own receive FIFO (device memory) */
  char *next_fifo;                    /* the next rank's, mapped */
  int next_mapped;                    /* next_fifo came from ipc_mem_open */
  void *send_ev[BRG__MAX_SLOTS];      /* recorded after writing next's slot k */
  void *rel_ev[BRG__MAX_SLOTS];       /* recorded after consuming own slot k */
  void *prev_send_ev[BRG__MAX_SLOTS]; /* the previous rank's send_ev */
  void *next_rel_ev[BRG__MAX_SLOTS];  /* the next rank's rel_ev */
  int prev_opened, next_opened;       /* those came from ipc_event_open */
  /* Links to other hosts: the transport's host FIFO regions, mapped. */
  int send_staged, recv_staged;
  /* ...or GPU memory straight on the network (GPUDirect RDMA): */
  int send_gdr, recv_gdr;           /* the link runs that way */
  int send_reg, recv_reg;           /* registered with the link */
  char *gdr_send;                   /* device slots the sender's kernels write */
  brg__conn *link_send, *link_recv; /* the communicator's links */
  char *send_region, *recv_region;  /* host addresses (NULL: not registered) */
  char *send_region_dev, *recv_region_dev;
  void *last_stream; /* the stream of the latest device collective */
  /* Where the previous rank's kernels cannot reach this rank's GPU (no peer
   * access between the two GPUs), the receive FIFO is pinned host memory
   * that both GPUs reach: shared memory between processes. */
  char *fifo_host; /* the mapping (NULL: the FIFO is GPU memory) */
  size_t fifo_host_bytes;
  char fifo_shm[64]; /* its shared-memory name ("": none) */
  char *next_host;   /* the next rank's host FIFO, mapped here */
  int stuck;         /* own work could not drain: nothing may be freed */
};

/* What each rank tells every other one at setup. */
typedef struct dev_blob {
  int32_t ok; /* 1: this rank's side is ready */
  int32_t pid;
  uint64_t process;     /* random per process: ranks in one process */
  int32_t gpu;          /* the device index in this rank's process */
  int32_t fifo_on_host; /* 1: the receive FIFO is pinned host memory */
  char fifo_shm[64];    /* ...shared under this name (other processes) */
  int32_t nslots;
  int32_t pad;
  uint64_t slice_bytes;
  unsigned char uuid[16];           /* of the GPU */
  char why[192];                    /* when not ok */
  uint64_t fifo_ptr;                /* for a rank in the same process, and GDR */
  int32_t gdr_send_ok, gdr_recv_ok; /* GPU memory registered with the network link */
  uint32_t gdr_rkey;                /* of fifo_ptr's slots, on the link from prev */
  int32_t pad2;
  char gdr_why[128]; /* why not, for the log */
  uint64_t send_ev_ptr[BRG__MAX_SLOTS], rel_ev_ptr[BRG__MAX_SLOTS];
  unsigned char fifo_handle[HB];
  unsigned char send_ev[BRG__MAX_SLOTS][HB];
  unsigned char rel_ev[BRG__MAX_SLOTS][HB];
} dev_blob;

static brg_status cuda_fail(brg_comm *c, const brg__cuda_api *api, int e, const char *what) {
  return brg__comm_error(c, BRG_ERR_SYSTEM, "rank %d: CUDA %s failed: %s", c->rank, what,
                         api->error_string(e));
}

size_t brg__device_ring_slice_bytes(const struct brg__dev_ring *d) {
  return d->slice_bytes;
}

/* Frees the device ring. Only once this rank's own work has drained and
 * both neighbours said theirs has (comm.c): their streams wait on this
 * rank's events and write its FIFO, and its stream waits on theirs. */
static void ring_release(struct brg__dev_ring *d) {
  const brg__cuda_api *api = d->api;
  for (int k = 0; k < d->nslots; k++) {
    if (d->prev_opened && d->prev_send_ev[k]) api->event_destroy(d->prev_send_ev[k]);
    if (d->next_opened && d->next_rel_ev[k]) api->event_destroy(d->next_rel_ev[k]);
  }
  if (d->next_mapped && d->next_fifo) api->ipc_mem_close(d->next_fifo);
  if (d->next_host) {
    api->host_unregister(d->next_host);
    munmap(d->next_host, (size_t)d->nslots * d->stride);
  }
  if (d->send_reg) d->link_send->ops->dev_register(d->link_send, NULL, 0, -1, 0, NULL, NULL);
  if (d->recv_reg) d->link_recv->ops->dev_register(d->link_recv, NULL, 0, -1, 0, NULL, NULL);
  if (d->send_region) api->host_unregister(d->send_region);
  if (d->recv_region) api->host_unregister(d->recv_region);
  for (int k = 0; k < d->nslots; k++) {
    if (d->send_ev[k]) api->event_destroy(d->send_ev[k]);
    if (d->rel_ev[k]) api->event_destroy(d->rel_ev[k]);
  }
  if (d->fifo_host) {
    api->host_unregister(d->fifo_host);
    munmap(d->fifo_host, d->fifo_host_bytes);
  } else if (d->fifo) {
    api->mem_free(d->fifo);
  }
  if (d->fifo_shm[0]) shm_unlink(d->fifo_shm);
  if (d->gdr_send) api->mem_free(d->gdr_send);
  free(d);
}

/* Waits for an event with the communicator's checks (abort, a neighbour
 * gone, the deadline) between polls, so that a dead peer's work that never
 * comes cannot hold the calling thread. */
static brg_status event_wait(brg_comm *c, struct brg__dev_ring *d, void *ev, const char *what) {
  const brg__cuda_api *api = d->api;
  c->wait_start_ns = 0;
  for (int i = 0;; i++) {
    int e = api->event_query(ev);
    if (e == 0) return BRG_SUCCESS;
    if (e != -1) return cuda_fail(c, api, e, what);
    if (i < 100) continue;
    brg_status s = c->waiter.check ? c->waiter.check(c->waiter.arg) : BRG_SUCCESS;
    if (s != BRG_SUCCESS) return s;
    brg__sleep_ms(i < 1000 ? 0 : 1);
  }
}

/* Whether every event this rank recorded has run, polled until the
 * deadline (ms, -1 never). */
static int own_work_drained(struct brg__dev_ring *d, int64_t deadline) {
  const brg__cuda_api *api = d->api;
  for (int i = 0;; i++) {
    int pending = 0;
    for (int k = 0; k < d->nslots && !pending; k++) {
      if (d->send_ev[k] && api->event_query(d->send_ev[k]) == -1) pending = 1;
      if (d->rel_ev[k] && api->event_query(d->rel_ev[k]) == -1) pending = 1;
    }
    if (!pending) return 1;
    if (brg__deadline_passed(deadline)) return 0;
    brg__sleep_ms(i < 100 ? 0 : 1);
  }
}

brg_status brg__device_ring_drain(brg_comm *c) {
  struct brg__dev_ring *d = c->dev;
  if (!d) return BRG_SUCCESS;
  if (own_work_drained(d, brg__deadline_ms(c->timeout_ms))) return BRG_SUCCESS;
  d->stuck = 1;
  char stream[64];
  if (d->last_stream)
    snprintf(stream, sizeof stream, "stream %p", d->last_stream);
  else
    snprintf(stream, sizeof stream, "the legacy default stream");
  return brg__comm_error(c, BRG_ERR_REMOTE,
                         "rank %d: device work on %s did not finish within %d ms: it waits for "
                         "rank %d (pid %d on %s) or rank %d (pid %d on %s), gone or stalled; the "
                         "GPU FIFO and events stay allocated, since that stream may still use "
                         "them",
                         c->rank, stream, c->timeout_ms, c->prev, c->peers[c->prev].pid,
                         c->peers[c->prev].hostname, c->next, c->peers[c->next].pid,
                         c->peers[c->next].hostname);
}

void brg__device_ring_free(brg_comm *c) {
  struct brg__dev_ring *d = c->dev;
  if (!d) return;
  c->dev = NULL;
  if (d->stuck) return; /* left to the stream that still waits: freeing it would crash */
  ring_release(d);
}

/* Pins and maps the host FIFO of a network link for kernels. */
static int map_host_fifo(const brg__cuda_api *api, const brg__fifo *f, char **region, char **dev) {
  char *base = (char *)f->ctrl;
  void *dp = NULL;
  int e = api->host_register(base, brg__fifo_region_bytes(f->nslots, f->slot_bytes), &dp);
  if (e) return e;
  *region = base;
  *dev = dp;
  return 0;
}

/* Registers GPU memory with a network link; 0 or the reason in why. */
static int gdr_register(struct brg__dev_ring *d, brg__conn *link, void *p, size_t bytes,
                        uint32_t *rkey, char *why, size_t cap) {
  if (!link->ops->dev_register) {
    snprintf(why, cap, "the %s transport cannot carry GPU memory", link->ops->name);
    return -1;
  }
  int fd = -1;
  unsigned long long off = 0;
  int e = d->api->dmabuf_export(p, bytes, &fd, &off);
  if (e) {
    snprintf(why, cap, "no dmabuf for GPU memory: %s", d->api->error_string(e));
    return -1;
  }
  brg__errbuf err;
  brg_status s = link->ops->dev_register(link, p, bytes, fd, off, rkey, &err);
  close(fd);
  if (s != BRG_SUCCESS) {
    size_t n = strlen(err.msg) < cap - 1 ? strlen(err.msg) : cap - 1;
    memcpy(why, err.msg, n);
    why[n] = 0;
    return -1;
  }
  return 0;
}

/* GPUDirect RDMA on the links to and from other hosts, where the transport
 * and the GPU allow it; whether it then runs is decided with the neighbour. */
static void setup_gdr(struct brg__dev_ring *d, dev_blob *b) {
  size_t bytes = (size_t)d->nslots * d->stride;
  if (!brg__device_int(BRG__DEVICE_IB_GDR)) {
    snprintf(b->gdr_why, sizeof b->gdr_why, "off (BRIGADE_IB_GDR=0)");
    return;
  }
  if (d->recv_staged && gdr_register(d, d->link_recv, d->fifo, bytes, &b->gdr_rkey, b->gdr_why,
                                     sizeof b->gdr_why) == 0)
    d->recv_reg = b->gdr_recv_ok = 1;
  if (d->send_staged) {
    unsigned char unused[HB];
    int e = d->api->ipc_mem_export((void **)&d->gdr_send, bytes, unused);
    if (e)
      snprintf(b->gdr_why, sizeof b->gdr_why, "cudaMalloc: %s", d->api->error_string(e));
    else if (gdr_register(d, d->link_send, d->gdr_send, bytes, NULL, b->gdr_why,
                          sizeof b->gdr_why) == 0)
      d->send_reg = b->gdr_send_ok = 1;
  }
}

/* Whether kernels of the previous rank's GPU can reach this rank's GPU
 * memory: the same GPU, or peer access between the two (a GPU of another
 * process is found among this process's GPUs by its UUID). */
static int prev_reaches(const brg__cuda_api *api, const dev_blob *self, const dev_blob *prev) {
  if (!memcmp(prev->uuid, self->uuid, 16)) return 1;
  int dev = -1;
  if (prev->process == self->process) {
    dev = prev->gpu;
  } else {
    int n = api->probe(NULL, 0), cur = self->gpu;
    for (int i = 0; i < n && dev < 0; i++) {
      unsigned char u[16];
      if (api->set_device(i) == 0 && api->device_uuid(u) == 0 && !memcmp(u, prev->uuid, 16))
        dev = i;
    }
    api->set_device(cur);
  }
  int can = 0;
  return dev >= 0 && api->can_access_peer(&can, dev, self->gpu) == 0 && can;
}

/* A receive FIFO in pinned host memory, shared with other processes under a
 * name when `shared`; 0 or a CUDA error (-1: a system call failed). */
static int host_fifo_alloc(brg_comm *c, struct brg__dev_ring *d, size_t bytes, int shared,
                           dev_blob *b) {
  void *m = MAP_FAILED;
  if (shared) {
    snprintf(d->fifo_shm, sizeof d->fifo_shm, "/brigade-gpufifo-%016llx-%d",
             (unsigned long long)b->process, c->rank);
    int fd = shm_open(d->fifo_shm, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0) {
      d->fifo_shm[0] = 0;
      return -1;
    }
    if (ftruncate(fd, (off_t)bytes) == 0)
      m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    snprintf(b->fifo_shm, sizeof b->fifo_shm, "%s", d->fifo_shm);
  } else {
    m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  }
  if (m == MAP_FAILED) return -1;
  memset(m, 0, bytes); /* touched now, not on the hot path */
  d->fifo_host = m;
  d->fifo_host_bytes = bytes;
  void *dev = NULL;
  int e = d->api->host_register(m, bytes, &dev);
  if (e) return e;
  d->fifo = dev;
  b->fifo_on_host = 1;
  return 0;
}

/* This rank's own half: FIFO, events and mapped host FIFOs, described in `b`. */
static void setup_local(brg_comm *c, struct brg__dev_ring *d, dev_blob *b, const dev_blob *prev) {
  const brg__cuda_api *api = d->api;
  int e = 0;
  const char *what = "cudaGetDeviceProperties";
  if (!e && d->send_staged) {
    what = "cudaHostRegister of the send FIFO (link to another host)";
    e = map_host_fifo(api, &c->send.fifo, &d->send_region, &d->send_region_dev);
  }
  if (!e && d->recv_staged) {
    what = "cudaHostRegister of the receive FIFO (link from another host)";
    e = map_host_fifo(api, &c->recv.fifo, &d->recv_region, &d->recv_region_dev);
  }
  if (!e && !d->recv_staged && !prev_reaches(api, b, prev)) {
    /* The previous rank's kernels write this FIFO: where they cannot
     * reach this GPU, it is pinned host memory that both GPUs reach. */
    what = "a receive FIFO in pinned host memory (no peer access from the previous rank's GPU)";
    e = host_fifo_alloc(c, d, (size_t)d->nslots * d->stride, prev->process != b->process, b);
    if (!e)
      BRG__INFO("init",
                "rank %d: GPU %d cannot be reached from rank %d's GPU %d: the FIFO between "
                "them is pinned host memory",
                c->rank, b->gpu, c->prev, prev->gpu);
  } else if (!e) {
    what = "cudaMalloc + cudaIpcGetMemHandle of the receive FIFO";
    e = api->ipc_mem_export((void **)&d->fifo, (size_t)d->nslots * d->stride, b->fifo_handle);
  }
  for (int k = 0; !e && k < d->nslots; k++) {
    what = "creating interprocess events";
    e = api->ipc_event_export(&d->send_ev[k], b->send_ev[k]);
    if (!e) e = api->ipc_event_export(&d->rel_ev[k], b->rel_ev[k]);
    b->send_ev_ptr[k] = (uint64_t)(uintptr_t)d->send_ev[k];
    b->rel_ev_ptr[k] = (uint64_t)(uintptr_t)d->rel_ev[k];
  }
  b->fifo_ptr = (uint64_t)(uintptr_t)d->fifo;
  if (!e) setup_gdr(d, b);
  if (e) {
    snprintf(b->why, sizeof b->why, "%s: %s (%zu bytes of FIFO)", what,
             e == -1 ? strerror(errno) : api->error_string(e), (size_t)d->nslots * d->stride);
    return;
  }
  b->ok = 1;
}

/* A random number per process, so that ranks can tell that they share one
 * (pids repeat across PID namespaces). */
static pthread_mutex_t token_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t token;
static pid_t token_pid; /* a forked child makes its own */

static uint64_t process_token(void) {
  pthread_mutex_lock(&token_lock);
  if (token == 0 || token_pid != getpid()) {
    if (getrandom(&token, sizeof token, 0) != (ssize_t)sizeof token)
      token = (uint64_t)brg__now_ns() ^ ((uint64_t)getpid() << 32);
    token |= 1;
    token_pid = getpid();
  }
  uint64_t t = token;
  pthread_mutex_unlock(&token_lock);
  return t;
}

/* Lets this rank's kernels (on the current device) reach the next rank's
 * FIFO on device `peer` of the same process. */
static brg_status reach_peer(brg_comm *c, struct brg__dev_ring *d, int self_gpu, int peer) {
  const brg__cuda_api *api = d->api;
  if (peer == self_gpu) return BRG_SUCCESS;
  int can = 0;
  int e = api->can_access_peer(&can, self_gpu, peer);
  if (e) return cuda_fail(c, api, e, "cudaDeviceCanAccessPeer");
  if (!can)
    return brg__comm_error(c, BRG_ERR_UNAVAILABLE,
                           "rank %d on GPU %d cannot reach the memory of rank %d on GPU %d (no "
                           "peer access between them)",
                           c->rank, self_gpu, c->next, peer);
  if ((e = api->enable_peer_access(peer)) != 0)
    return cuda_fail(c, api, e, "cudaDeviceEnablePeerAccess");
  BRG__INFO("init", "rank %d: peer access from GPU %d to GPU %d (rank %d)", c->rank, self_gpu, peer,
            c->next);
  return BRG_SUCCESS;
}

/* The links to the neighbours, from their blobs. */
static brg_status setup_links(brg_comm *c, struct brg__dev_ring *d, const dev_blob *self,
                              const dev_blob *next, const dev_blob *prev) {
  const brg__cuda_api *api = d->api;
  int e;
  if (d->send_staged) {
    /* slots are the transport's host FIFO */
  } else if (next->fifo_on_host && next->process == self->process) {
    /* pinned host memory of this process: every GPU reaches it */
    d->next_fifo = (char *)(uintptr_t)next->fifo_ptr;
    for (int k = 0; k < d->nslots; k++) d->next_rel_ev[k] = (void *)(uintptr_t)next->rel_ev_ptr[k];
  } else if (next->fifo_on_host) {
    size_t bytes = (size_t)d->nslots * d->stride;
    int fd = shm_open(next->fifo_shm, O_RDWR, 0);
    void *m = fd < 0 ? MAP_FAILED : mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (fd >= 0) close(fd);
    if (m == MAP_FAILED)
      return brg__comm_error(c, BRG_ERR_SYSTEM, "rank %d: mapping the host FIFO %s of rank %d: %s",
                             c->rank, next->fifo_shm, c->next, strerror(errno));
    d->next_host = m;
    void *dev = NULL;
    if ((e = api->host_register(m, bytes, &dev)) != 0)
      return cuda_fail(c, api, e, "cudaHostRegister of the next rank's host FIFO");
    d->next_fifo = dev;
    d->next_opened = 1;
    for (int k = 0; k < d->nslots; k++)
      if ((e = api->ipc_event_open(&d->next_rel_ev[k], next->rel_ev[k])) != 0)
        return cuda_fail(c, api, e, "cudaIpcOpenEventHandle (next rank's events)");
  } else if (next->process == self->process) {
    brg_status s = reach_peer(c, d, self->gpu, next->gpu);
    if (s != BRG_SUCCESS) return s;
    d->next_fifo = (char *)(uintptr_t)next->fifo_ptr;
    for (int k = 0; k < d->nslots; k++) d->next_rel_ev[k] = (void *)(uintptr_t)next->rel_ev_ptr[k];
  } else {
    if ((e = api->ipc_mem_open((void **)&d->next_fifo, next->fifo_handle)) != 0)
      return brg__comm_error(c, BRG_ERR_SYSTEM,
                             "rank %d: mapping the GPU FIFO of rank %d (pid %d) with "
                             "cudaIpcOpenMemHandle failed: %s",
                             c->rank, c->next, next->pid, api->error_string(e));
    d->next_mapped = 1;
    d->next_opened = 1;
    for (int k = 0; k < d->nslots; k++)
      if ((e = api->ipc_event_open(&d->next_rel_ev[k], next->rel_ev[k])) != 0)
        return cuda_fail(c, api, e, "cudaIpcOpenEventHandle (next rank's events)");
  }
  if (d->recv_staged) {
    /* slots are the transport's host FIFO */
  } else if (prev->process == self->process) {
    for (int k = 0; k < d->nslots; k++)
      d->prev_send_ev[k] = (void *)(uintptr_t)prev->send_ev_ptr[k];
  } else {
    d->prev_opened = 1;
    for (int k = 0; k < d->nslots; k++)
      if ((e = api->ipc_event_open(&d->prev_send_ev[k], prev->send_ev[k])) != 0)
        return cuda_fail(c, api, e, "cudaIpcOpenEventHandle (previous rank's events)");
  }
  return BRG_SUCCESS;
}

/* Whether the MPS control daemon serves this process's GPU work. */
static int mps_running(void) {
  const char *dir = getenv("CUDA_MPS_PIPE_DIRECTORY");
  char path[512];
  snprintf(path, sizeof path, "%s/control", dir && dir[0] ? dir : "/tmp/nvidia-mps");
  return access(path, F_OK) == 0;
}

brg_status brg__device_ring_prepare(brg_comm *c, brg__dev_setup *st) {
  const char *why = "";
  const brg__cuda_api *api = brg__device_api(&why);
  if (!api) return brg__comm_error(c, BRG_ERR_UNAVAILABLE, "device collectives: %s", why);
  struct brg__dev_ring *d = calloc(1, sizeof *d);
  dev_blob *all = calloc((size_t)c->nranks, sizeof *all), *mine = calloc(1, sizeof *mine);
  if (!d || !all || !mine) {
    free(d);
    free(all);
    free(mine);
    return brg__comm_error(c, BRG_ERR_NO_MEMORY, "device collectives: out of host memory");
  }
  d->api = api;
  d->nslots = c->nslots;
  d->slice_bytes = (size_t)brg__device_int(BRG__DEVICE_SLICE_BYTES) & ~(size_t)255;
  d->link_send = &c->send;
  d->link_recv = &c->recv;
  uint64_t here = c->peers[c->rank].host_hash;
  d->send_staged = c->peers[c->next].host_hash != here;
  d->recv_staged = c->peers[c->prev].host_hash != here;
  /* Every rank slices alike: with any link between hosts, slices are the
   * host FIFOs' slots. */
  for (int r = 0; r < c->nranks; r++)
    if (c->peers[r].host_hash != c->peers[0].host_hash) d->slice_bytes = c->slice_bytes;
  mine->pid = (int32_t)getpid();
  mine->process = process_token();
  if (api->get_device(&mine->gpu) != 0) mine->gpu = 0;
  mine->nslots = d->nslots;
  mine->slice_bytes = d->slice_bytes;
  if (api->device_uuid(mine->uuid) != 0) memset(mine->uuid, 0, sizeof mine->uuid);
  d->stride = d->slice_bytes + SLOT_SHIFT_ROOM;
  st->d = d;
  st->mine = mine;
  st->all = all;
  st->blob_bytes = sizeof *mine;
  return BRG_SUCCESS;
}

brg_status brg__device_ring_local(brg_comm *c, brg__dev_setup *st, brg_status gathered) {
  dev_blob *mine = st->mine, *all = st->all;
  if (gathered != BRG_SUCCESS) return gathered;
  setup_local(c, st->d, mine, &all[c->prev]);
  /* A failed half is described in `mine` (ok = 0, why): the second
   * all-gather still runs, so every rank learns it. */
  return BRG_SUCCESS;
}

brg_status brg__device_ring_finish(brg_comm *c, brg__dev_setup *st, brg_status gathered) {
  struct brg__dev_ring *d = st->d;
  const brg__cuda_api *api = d->api;
  dev_blob *mine = st->mine, *all = st->all;
  brg_status s = gathered;
  for (int r = 0; s == BRG_SUCCESS && r < c->nranks; r++) {
    if (!all[r].ok)
      s = brg__comm_error(c, BRG_ERR_SYSTEM,
                          "device collectives: rank %d could not set up its "
                          "GPU side: %s",
                          r, all[r].why);
    else if (all[r].nslots != mine->nslots || all[r].slice_bytes != mine->slice_bytes)
      s = brg__comm_error(c, BRG_ERR_INVALID_USAGE,
                          "device collectives: rank %d has %d GPU slots of %llu bytes, rank %d "
                          "%d of %llu (set BRIGADE_STEPS and BRIGADE_DEVICE_SLICE_BYTES alike "
                          "on every rank)",
                          r, all[r].nslots, (unsigned long long)all[r].slice_bytes, c->rank,
                          mine->nslots, (unsigned long long)mine->slice_bytes);
  }
  if (s == BRG_SUCCESS) s = setup_links(c, d, mine, &all[c->next], &all[c->prev]);
  if (s == BRG_SUCCESS) {
    /* GPUDirect runs on a link when both of its ends registered. */
    d->send_gdr = d->send_staged && mine->gdr_send_ok && all[c->next].gdr_recv_ok;
    d->recv_gdr = d->recv_staged && all[c->prev].gdr_send_ok && mine->gdr_recv_ok;
    if (d->send_gdr)
      c->send.ops->dev_remote(&c->send, all[c->next].fifo_ptr, all[c->next].gdr_rkey, d->stride);
    if ((d->send_staged && !d->send_gdr) || (d->recv_staged && !d->recv_gdr))
      BRG__INFO("init", "GPUDirect RDMA not used between hosts: %s",
                mine->gdr_why[0]                 ? mine->gdr_why
                : d->send_staged && !d->send_gdr ? all[c->next].gdr_why
                                                 : all[c->prev].gdr_why);
  }
  if (s == BRG_SUCCESS) {
    int share = 0;
    for (int r = 0; r < c->nranks; r++) share += !memcmp(all[r].uuid, mine->uuid, 16);
    char desc[256];
    api->describe(desc, sizeof desc);
    BRG__INFO("init",
              "device ring: step mode (a copy or reduce kernel per slice and step, "
              "ordered by interprocess events; no kernel waits for another process), "
              "%d slots of %zu bytes in GPU memory; %d of %d ranks on this GPU%s; %s%s%s",
              d->nslots, d->slice_bytes, share, c->nranks,
              share > 1 ? (mps_running() ? ", MPS running"
                                         : ", no MPS: their kernels take turns on the GPU")
                        : "",
              desc,
              d->send_gdr      ? "; to the next host GPU to GPU (GPUDirect RDMA)"
              : d->send_staged ? "; to the next host through pinned host memory"
                               : "",
              d->recv_gdr      ? "; from the previous host GPU to GPU (GPUDirect RDMA)"
              : d->recv_staged ? "; from the previous host through pinned host memory"
                               : "");
    c->dev = d;
  } else {
    ring_release(d);
  }
  free(all);
  free(mine);
  return s;
}

brg_status brg__device_single(brg_comm *c, const brg__coll *k) {
  const brg__cuda_api *api = brg__device_api(NULL);
  size_t esize = brg_dtype_size(k->dtype);
  if (!k->recvbuf || k->recvbuf == k->sendbuf || k->count == 0) return BRG_SUCCESS;
  size_t elems = k->count;
  int e = api->copy(k->recvbuf, NULL, k->sendbuf, elems * esize, k->stream);
  return e ? cuda_fail(c, api, e, "copy kernel") : BRG_SUCCESS;
}

brg_status brg__device_prim(struct brg__ring_op *o, int prim_, const char *in, char *out,
                            size_t m) {
  brg__prim prim = (brg__prim)prim_;
  brg_comm *c = o->c;
  struct brg__dev_ring *d = o->dev;
  const brg__cuda_api *api = d->api;
  const brg__coll *k = o->coll;
  void *st = k->stream;
  d->last_stream = st;
  uint64_t bytes = (uint64_t)m * o->esize;
  int recvs = brg__prim_recvs(prim), sends = brg__prim_sends(prim);
  int rk = (int)(c->recv_pos % (uint64_t)d->nslots), sk = (int)(c->send_pos % (uint64_t)d->nslots);
  int e = 0;
  brg_status s;
  const char *hdr;
  char *hslot;
  size_t shift = (o->elem * o->esize) % 16;
  const char *r = d->fifo + (size_t)rk * d->stride + shift;
  char *slot = d->next_fifo ? d->next_fifo + (size_t)sk * d->stride + shift : NULL;
  if (recvs && d->recv_gdr) {
    /* the payload landed in the GPU slot itself (at shift 0) */
    if ((s = brg__ring_recv_acquire(o, &hdr, bytes)) != BRG_SUCCESS) return s;
    r = d->fifo + (size_t)rk * d->stride;
  } else if (recvs && d->recv_staged) {
    if ((s = brg__ring_recv_acquire(o, &hdr, bytes)) != BRG_SUCCESS) return s;
    r = d->recv_region_dev + (hdr - d->recv_region);
  } else if (recvs) {
    if ((s = brg__ring_recv_acquire(o, &hdr, 0)) != BRG_SUCCESS) return s;
    uint64_t theirs;
    memcpy(&theirs, hdr, sizeof theirs);
    if (theirs != bytes)
      return brg__comm_error(c, BRG_ERR_MISMATCH,
                             "collective mismatch: rank %d sent %llu bytes of GPU data at step %d "
                             "of %s #%llu, rank %d expected %llu",
                             c->prev, (unsigned long long)theirs, c->cur_step,
                             brg__coll_name(k->kind), (unsigned long long)k->seq, c->rank,
                             (unsigned long long)bytes);
    e = api->stream_wait_event(st, d->prev_send_ev[rk]);
    if (e) return cuda_fail(c, api, e, "cudaStreamWaitEvent (previous rank's slot)");
  }
  if (sends && d->send_gdr) {
    if ((s = brg__ring_send_acquire(o, bytes, &hslot)) != BRG_SUCCESS) return s;
    slot = d->gdr_send + (size_t)sk * d->stride;
  } else if (sends && d->send_staged) {
    if ((s = brg__ring_send_acquire(o, bytes, &hslot)) != BRG_SUCCESS) return s;
    slot = d->send_region_dev + (hslot - d->send_region);
  } else if (sends) {
    if ((s = brg__ring_send_acquire(o, 0, &hslot)) != BRG_SUCCESS) return s;
    /* One lap on, the slot is free once the next rank's kernel that read
     * it has run. */
    if (c->send_pos >= (uint64_t)d->nslots &&
        (e = api->stream_wait_event(st, d->next_rel_ev[sk])) != 0)
      return cuda_fail(c, api, e, "cudaStreamWaitEvent (next rank's slot)");
  }
  int n = c->nranks;
  brg_op mid = k->op == BRG_AVG ? BRG_SUM : k->op;
  if (m > 0) {
    switch (prim) {
    case BRG__PRIM_SEND: e = api->copy(slot, out, in, bytes, st); break;
    case BRG__PRIM_RECV_REDUCE_SEND:
      e = api->reduce(slot, NULL, r, in, m, k->dtype, mid, 1, st);
      break;
    case BRG__PRIM_RECV_REDUCE_COPY_SEND:
      e = api->reduce(out, slot, r, in, m, k->dtype, k->op, n, st);
      break;
    case BRG__PRIM_RECV_REDUCE_COPY:
      e = api->reduce(out, NULL, r, in, m, k->dtype, k->op, n, st);
      break;
    case BRG__PRIM_RECV_COPY_SEND: e = api->copy(out, slot, r, bytes, st); break;
    case BRG__PRIM_RECV: e = api->copy(out, NULL, r, bytes, st); break;
    case BRG__PRIM_COPY: e = api->copy(out, NULL, in, bytes, st); break;
    }
    if (e) return cuda_fail(c, api, e, "reduce/copy kernel launch");
  }
  if (sends) {
    if (!d->send_staged) memcpy(hslot, &bytes, sizeof bytes);
    if ((e = api->event_record(d->send_ev[sk], st)) != 0)
      return cuda_fail(c, api, e, "cudaEventRecord");
    /* The transport reads the slot from host memory: it must be written. */
    if (d->send_staged &&
        (s = event_wait(c, d, d->send_ev[sk], "cudaEventQuery (slot for the next host)")) !=
            BRG_SUCCESS)
      return s;
    brg__ring_send_post(o, d->send_staged ? bytes : 0);
  }
  if (recvs) {
    if ((e = api->event_record(d->rel_ev[rk], st)) != 0)
      return cuda_fail(c, api, e, "cudaEventRecord");
    if (d->recv_staged &&
        (s = event_wait(c, d, d->rel_ev[rk], "cudaEventQuery (slot from the previous host)")) !=
            BRG_SUCCESS)
      return s;
    brg__ring_recv_release(o);
  }
  return BRG_SUCCESS;
}
