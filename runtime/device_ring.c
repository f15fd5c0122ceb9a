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
#include <sched.h>
#include <stdarg.h>
#include <stddef.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <errno.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "device.h"
#include "internal.h"
#include "cuda/ring_args.h"
#include "ring_link.h"
#include "settings.h"

#define HB BRG__CUDA_IPC_HANDLE_BYTES

/* A payload sits in its GPU slot at the same offset from a 16-byte boundary
 * as its elements in the caller's buffers (counted from the start of the
 * collective, so every rank agrees), which keeps the kernels on their
 * 16-byte vector path when chunks start at odd elements. */
#define SLOT_SHIFT_ROOM 256

/* The asynchronous mode's flag lives alone in a page of pinned memory. */
#define FLAG_PAGE 4096

struct brg__dev_ring {
  const brg__cuda_api *api;
  int nslots;
  size_t slice_bytes; /* the pipeline unit: one slice per GPU slot */
  size_t stride;      /* slice_bytes + room to shift a payload */
  /* The device links' transports (brg__device_link): cuda_ipc, where the
   * next rank's kernels write this rank's memory, or the host link's, which
   * stages GPU payloads through its FIFO in pinned host memory. */
  const brg__transport_ops *send_t, *recv_t;
  brg__conn fifo_in, fifo_out;        /* cuda_ipc: own receive FIFO, the next rank's */
  char *fifo;                         /* own receive FIFO, as kernels reach it */
  char *next_fifo;                    /* the next rank's */
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
  int stuck;         /* own work could not drain: nothing may be freed */
  /* Bytes per slot on each link: the slice on CUDA IPC links, the network
   * transport's slot on links between hosts (a slice crosses those in
   * several pieces). GPU slots on a GPUDirect link are gdr_stride apart. */
  size_t send_piece, recv_piece, gdr_stride;
  /* Asynchronous mode: the host side of each collective runs on the
   * communicator's thread on `proxy` (a stream of this ring's GPU); the
   * caller's stream waits for *flag to reach the collective's ticket, which
   * proxy writes once the collective has run. */
  int async;
  void *proxy;
  uint32_t *flag_host; /* a page of pinned host memory */
  void *flag_dev;
  uint32_t issued; /* tickets handed out (under the communicator's qlock) */
  void *proxy_ev;  /* recorded on proxy after each flag write */
  pthread_mutex_t ev_lock;
  void **spare_ev; /* start events not in use */
  int nspare, capspare;
  /* Each caller stream seen, with an event recorded after its latest wait
   * on the flag: the flag page is freed only once all of them have run. */
  struct {
    void *stream, *ev;
  } callers[16];
  int ncallers;
  /* Kernel mode (kernels/cuda/ring_kernel.cuh): a collective is one
   * launch whose channels wait on the neighbours' flags. Each rank's
   * region holds, per channel, its tail, head and counters and its
   * receive slots; both neighbours write into it. */
  int kmode_req;  /* BRIGADE_DEVICE_MODE: 0 auto, 1 kernel, 2 step */
  int kernel;     /* collectives run in kernel mode */
  int kchannels;  /* thread blocks per launch */
  size_t kslot;   /* bytes per slot */
  size_t kstride; /* bytes per channel in a region */
  char *kregion;  /* own (GPU memory: kin, a cuda_ipc receive end) */
  char *knext, *kprev;
  brg__conn kin, knext_c, kprev_c; /* own region; the neighbours', mapped (cuda_ipc) */
  int *kring;                      /* position -> rank, GPU memory */
  int *kwords;                     /* a pinned page: [0] abort, [16] status, watch records */
  int *kwords_dev;
  size_t kctrl;   /* bytes per channel before its slots: words, then a meta per slot */
  void *kdone_ev; /* recorded after each launch outside a graph capture */
  int kdone_set;  /* kdone_ev was recorded: the next launch waits for it */
  /* Another rank of this communicator in this process has this GPU: its
   * legacy stream (NULL) is theirs too, where kernels would queue behind
   * each other's spinning ones. */
  int kshared_gpu;
  int kthreads; /* another rank of this communicator is in this process */
  /* The watchdog (brg__device_watch, on the liveness thread): per channel
   * the progress last seen and since when it stands still. */
  uint64_t wd_progress[BRG__RK_MAX_CHANNELS], wd_started[BRG__RK_MAX_CHANNELS];
  int64_t wd_since[BRG__RK_MAX_CHANNELS];
  int wd_fired;         /* the watchdog stopped the kernels */
  brg_status perr_code; /* with perr: the status the next call returns (0: BRG_ERR_REMOTE) */
  /* Streams that captured kernel-mode launches into graphs, with an event
   * each that the drain at destroy records there: replays have no done
   * event of their own. After a capture, the abort word's page outlives
   * the communicator (a replay after destroy finds it set and ends). */
  void *gstream[8], *gdone_ev[8];
  int ngstreams, graphs;
  /* The one-shot allreduce (ring_args.h): each rank's area follows the
   * channels in its region, and every rank reaches every other's. */
  size_t kos_limit;                   /* BRIGADE_DEVICE_SMALL_BYTES (0: none) */
  size_t kos_slot, kos_bytes;         /* room per input; bytes of an area */
  int oneshot;                        /* small allreduces take it */
  char *kos_area[BRG__RK_MAX_PEERS];  /* rank r's area, as reached here */
  brg__conn kos_c[BRG__RK_MAX_PEERS]; /* regions this path mapped itself */
  char step_why[256];                 /* why collectives run in step mode, for a captured call */
  /* Kernel mode's links between hosts: the same words and slots as a
   * region's channel, in pinned host memory of this rank (PCTRL: tail at
   * 0, head at 64, the posted slots' sizes at 128), and the host proxy's
   * two threads in place of the neighbour: tx carries the slots this
   * rank's kernels post to the network link to the next rank, rx writes
   * what arrives from the previous rank into the slots its kernels read.
   * Slots of all channels share the link; a slot's header names its
   * channel. */
  brg_comm *net;               /* c->devnet, whose links they use */
  size_t pstride;              /* bytes per channel */
  char *psend, *precv;         /* host addresses (NULL: the link stays in the host) */
  char *psend_dev, *precv_dev; /* the same, as the kernels reach them */
  /* GPUDirect RDMA on those links (kernel mode has one channel there):
   * the channel's slots are GPU memory registered with the proxy's link,
   * which carries slot n from kgdr_sbuf + (n % nslots) kslot here to the
   * next rank's kgdr_rbuf at the same offset; the words stay in psend and
   * precv. A slot is free again once the link says it went (tx), and the
   * link's slot once the kernel took it (rx). */
  int kgdr_send, kgdr_recv;    /* the links run that way */
  char *kgdr_sbuf, *kgdr_rbuf; /* nslots * kslot of GPU memory each */
  int gpu;                     /* this rank's device index (the proxy's flushes) */
  pthread_t ptx, prx;          /* running when ptx_on, prx_on */
  int ptx_on, prx_on;
  int pstop;                            /* atomic: the threads return */
  uint64_t psent[BRG__RK_MAX_CHANNELS]; /* atomic: slots tx has carried, per channel */
  char perr[BRG__ERRLEN];               /* what stopped the proxy or the watchdog ("": nothing) */
  /* Several rings (progress.c): part r of a device collective runs on
   * ring r's communicator on rstream[r], which waits for fork_ev on the
   * caller's stream; the caller's stream waits for join_ev[r] after it. */
  void *fork_ev;
  void *rstream[BRG__DEVICE_MAX_RINGS], *join_ev[BRG__DEVICE_MAX_RINGS];
};

/* Per channel of a region: tail at 0, head at 64, counters at 128 (posted,
 * taken, the busy word, headers sent and checked), at 192 the headers the
 * next rank checked; then from KMETA one brg__rk_meta per slot and from
 * khdr(d) the mailbox of BRG__RK_HDRS headers, both written by the
 * previous rank; the slots follow at d->kctrl. */
#define KMETA 256
#define KACK 192
#define PCTRL 1024      /* per channel of a link between hosts: tail, head, sizes at 128 */
#define KSTATUS_WORD 16 /* in kwords, a cache line after the abort word */
#define KWATCH 1024     /* in kwords: a brg__rk_watch per channel */

static int kernel_watch(brg_comm *c, char *why, size_t n);

/* What each rank tells every other one at setup. */
typedef struct dev_blob {
  int32_t ok; /* 1: this rank's side is ready */
  int32_t pid;
  uint64_t process; /* random per process: ranks in one process */
  int32_t gpu;      /* the device index in this rank's process */
  int32_t nslots;
  int32_t mps; /* 1: MPS serves this rank's GPU work (mps_verdict) */
  uint64_t slice_bytes;
  unsigned char uuid[16];           /* of the GPU */
  char why[192];                    /* when not ok */
  uint64_t fifo_ptr;                /* GPU slots of a GPUDirect link */
  int32_t gdr_send_ok, gdr_recv_ok; /* GPU memory registered with the network link */
  uint32_t gdr_rkey;                /* of fifo_ptr's slots, on the link from prev */
  int32_t mps_driver;               /* 1: the driver told mps, 0: the control pipe did */
  char gdr_why[128];                /* why not, for the log */
  int32_t kmode_req;                /* BRIGADE_DEVICE_MODE of this rank */
  int32_t kernel_ok;                /* its kernel-mode region is ready */
  int32_t kchannels;
  int32_t kos_ok; /* every rank's GPU reaches its one-shot area */
  uint64_t kos_slot;
  uint64_t kslot;
  char kwhy[128];                     /* why kernel mode cannot run here */
  int32_t kgdr_send_ok, kgdr_recv_ok; /* kernel mode's slots registered with the proxy's links */
  uint32_t kgdr_rkey;                 /* of kgdr_rptr, on the link from prev */
  int32_t pad3;
  uint64_t kgdr_rptr;
  char kgdr_why[128];                               /* why not, for the log */
  unsigned char kregion_info[BRG__CONN_INFO_BYTES]; /* cuda_ipc: the kernel-mode region */
  unsigned char fifo_info[BRG__CONN_INFO_BYTES];    /* cuda_ipc: step mode's FIFO */
  uint64_t send_ev_ptr[BRG__MAX_SLOTS], rel_ev_ptr[BRG__MAX_SLOTS];
  unsigned char send_ev[BRG__MAX_SLOTS][HB];
  unsigned char rel_ev[BRG__MAX_SLOTS][HB];
} dev_blob;

static brg_status cuda_fail(brg_comm *c, const brg__cuda_api *api, int e, const char *what) {
  return brg__comm_error(c, BRG_ERR_SYSTEM, "rank %d: CUDA %s failed: %s", c->rank, what,
                         api->drv.error_string(e));
}

/* Zeroed host memory, pinned and mapped for kernels (*host, *dev); 0, a
 * CUDA error, or -1 with errno. */
static int pinned_alloc(const brg__cuda_api *api, size_t bytes, char **host, char **dev) {
  void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return -1;
  memset(m, 0, bytes);
  void *dp = NULL;
  int e = api->drv.host_register(m, bytes, &dp);
  if (e) {
    munmap(m, bytes);
    return e;
  }
  *host = m;
  *dev = dp;
  return 0;
}

static void pinned_free(const brg__cuda_api *api, char *host, size_t bytes) {
  if (!host) return;
  api->drv.host_unregister(host);
  munmap(host, bytes);
}

/* Bytes of a link's host region (every channel's words and slots). */
static size_t pregion_bytes(const struct brg__dev_ring *d) {
  return (size_t)d->kchannels * d->pstride;
}

size_t brg__device_ring_slice_bytes(const struct brg__dev_ring *d) {
  return d->slice_bytes;
}

/* Stops the host proxy's threads, if any run. */
static void proxy_join(struct brg__dev_ring *d) {
  __atomic_store_n(&d->pstop, 1, __ATOMIC_RELEASE);
  if (d->ptx_on) pthread_join(d->ptx, NULL);
  if (d->prx_on) pthread_join(d->prx, NULL);
  d->ptx_on = d->prx_on = 0;
}

/* ---- the device links of cuda_ipc ---- */

static brg__gpu_desc gpu_desc(const dev_blob *b) {
  brg__gpu_desc g = {.process = b->process, .pid = b->pid, .gpu = b->gpu};
  memcpy(g.uuid, b->uuid, sizeof g.uuid);
  return g;
}

/* A cuda_ipc link with rank `peer` (blob `other`) over `bytes` of memory:
 * slots of `slot` bytes; the receiver's memory may be pinned host memory
 * where `fallback`. */
static void link_params(brg_comm *c, struct brg__dev_ring *d, int peer, const dev_blob *self,
                        const dev_blob *other, size_t bytes, size_t slot, int fallback,
                        brg__gpu_link_params *g, brg__conn_params *p) {
  *g = (brg__gpu_link_params){.api = d->api,
                              .self = gpu_desc(self),
                              .peer = gpu_desc(other),
                              .bytes = bytes,
                              .host_fallback = fallback};
  *p = (brg__conn_params){.rank = c->rank,
                          .peer = peer,
                          .nranks = c->nranks,
                          .self_info = &c->peers[c->rank],
                          .peer_info = &c->peers[peer],
                          .nslots = d->nslots,
                          .slot_bytes = slot,
                          .comm_id = c->comm_id,
                          .timeout_ms = c->timeout_ms,
                          .waiter = &c->waiter,
                          .gpu = g};
}

/* The receiving end: this rank's memory, described in `info` for the
 * ranks that map it. */
static brg_status link_export(brg_comm *c, struct brg__dev_ring *d, brg__conn *l, int peer,
                              const dev_blob *self, const dev_blob *other, size_t bytes,
                              size_t slot, int fallback, void *info, brg__errbuf *err) {
  brg__gpu_link_params g;
  brg__conn_params p;
  link_params(c, d, peer, self, other, bytes, slot, fallback, &g, &p);
  l->ops = &brg__transport_cuda_ipc;
  l->peer = peer;
  return l->ops->recv_setup(l, &p, info, err);
}

/* The sending end: rank `peer`'s memory, mapped here from its `info`. */
static brg_status link_map(brg_comm *c, struct brg__dev_ring *d, brg__conn *l, int peer,
                           const dev_blob *self, const dev_blob *other, size_t bytes, size_t slot,
                           const void *info) {
  brg__gpu_link_params g;
  brg__conn_params p;
  brg__errbuf err = {0};
  link_params(c, d, peer, self, other, bytes, slot, 0, &g, &p);
  l->ops = &brg__transport_cuda_ipc;
  l->peer = peer;
  brg_status s = l->ops->send_connect(l, &p, info, &err);
  return s == BRG_SUCCESS ? s : brg__comm_error(c, s, "device collectives: %s", err.msg);
}

static void link_close(brg__conn *l) {
  if (l->ops) l->ops->close(l);
  l->ops = NULL;
}

const brg__transport_ops *brg__device_link(const brg_comm *c, int from, int to) {
  return brg__transport_pick(&c->peers[from], &c->peers[to], c->transports, BRG__CARRIES_DEVICE);
}

int brg__device_staged_any(const brg_comm *c) {
  for (int i = 0; c->nranks > 1 && i < c->nranks; i++) {
    const brg__transport_ops *t = brg__device_link(c, c->ring[i], c->ring[(i + 1) % c->nranks]);
    if (!t || !t->gpu_memory) return 1;
  }
  return 0;
}

/* Frees the device ring. Only once this rank's own work has drained and
 * both neighbours said theirs has (comm.c): their streams wait on this
 * rank's events and write its FIFO, and its stream waits on theirs. */
static void stream_user_drop(const struct brg__dev_ring *d);

static void ring_release(struct brg__dev_ring *d) {
  const brg__cuda_api *api = d->api;
  stream_user_drop(d);
  proxy_join(d);
  for (int k = 0; k < d->nslots; k++) {
    if (d->prev_opened && d->prev_send_ev[k]) api->drv.event_destroy(d->prev_send_ev[k]);
    if (d->next_opened && d->next_rel_ev[k]) api->drv.event_destroy(d->next_rel_ev[k]);
  }
  link_close(&d->fifo_out);
  if (d->send_reg) d->link_send->ops->dev_register(d->link_send, NULL, 0, -1, 0, NULL, NULL);
  if (d->recv_reg) d->link_recv->ops->dev_register(d->link_recv, NULL, 0, -1, 0, NULL, NULL);
  if (d->send_region) api->drv.host_unregister(d->send_region);
  if (d->recv_region) api->drv.host_unregister(d->recv_region);
  for (int k = 0; k < d->nslots; k++) {
    if (d->send_ev[k]) api->drv.event_destroy(d->send_ev[k]);
    if (d->rel_ev[k]) api->drv.event_destroy(d->rel_ev[k]);
  }
  if (d->fifo_in.ops)
    link_close(&d->fifo_in);
  else if (d->fifo)
    api->drv.mem_free(d->fifo); /* a GPUDirect link's slots */
  if (d->gdr_send) api->drv.mem_free(d->gdr_send);
  if (d->proxy) api->drv.stream_destroy(d->proxy);
  if (d->proxy_ev) api->drv.event_destroy(d->proxy_ev);
  for (int i = 0; i < d->nspare; i++) api->drv.event_destroy(d->spare_ev[i]);
  free(d->spare_ev);
  for (int i = 0; i < d->ncallers; i++) api->drv.event_destroy(d->callers[i].ev);
  pinned_free(api, (char *)d->flag_host, FLAG_PAGE);
  for (int r = 0; r < BRG__RK_MAX_PEERS; r++) link_close(&d->kos_c[r]);
  link_close(&d->knext_c);
  link_close(&d->kprev_c);
  link_close(&d->kin);
  if (d->kring) api->drv.mem_free(d->kring);
  if (d->kdone_ev) api->drv.event_destroy(d->kdone_ev);
  for (int i = 0; i < d->ngstreams; i++)
    if (d->gdone_ev[i]) api->drv.event_destroy(d->gdone_ev[i]);
  /* A graph that captured a launch may be replayed after this (the user's
   * error, docs/device.md): its kernels read the abort word first, set by
   * the drain, and end; so the page stays. */
  if (!d->graphs) pinned_free(api, (char *)d->kwords, FLAG_PAGE);
  for (int r = 0; r < BRG__DEVICE_MAX_RINGS; r++) {
    if (d->rstream[r]) api->drv.stream_destroy(d->rstream[r]);
    if (d->join_ev[r]) api->drv.event_destroy(d->join_ev[r]);
  }
  if (d->fork_ev) api->drv.event_destroy(d->fork_ev);
  /* (the proxy's links deregistered these when they closed) */
  if (d->kgdr_sbuf) api->drv.mem_free(d->kgdr_sbuf);
  if (d->kgdr_rbuf) api->drv.mem_free(d->kgdr_rbuf);
  pinned_free(api, d->psend, pregion_bytes(d));
  pinned_free(api, d->precv, pregion_bytes(d));
  pthread_mutex_destroy(&d->ev_lock);
  free(d);
}

/* Waits for an event with the communicator's checks (abort, a neighbour
 * gone, the deadline) between polls, so that a dead peer's work that never
 * comes cannot hold the calling thread. */
static brg_status event_wait(brg_comm *c, struct brg__dev_ring *d, void *ev, const char *what) {
  const brg__cuda_api *api = d->api;
  c->wait_start_ns = 0;
  for (int i = 0;; i++) {
    int e = api->drv.event_query(ev);
    if (e == 0) return BRG_SUCCESS;
    if (e != -1) return cuda_fail(c, api, e, what);
    if (i < 100) continue;
    brg_status s = c->waiter.check ? c->waiter.check(c->waiter.arg) : BRG_SUCCESS;
    if (s != BRG_SUCCESS) return s;
    brg__sleep_ms(i < 1000 ? 0 : 1);
  }
}

/* ---- asynchronous mode ---- */

/* Sets the flag from the host to `ticket` unless it is already there or
 * beyond (in the flag's wrapping order). */
static void flag_raise(struct brg__dev_ring *d, uint32_t ticket) {
  uint32_t cur = __atomic_load_n(d->flag_host, __ATOMIC_ACQUIRE);
  while ((int32_t)(ticket - cur) > 0 &&
         !__atomic_compare_exchange_n(d->flag_host, &cur, ticket, 0, __ATOMIC_RELEASE,
                                      __ATOMIC_ACQUIRE)) {}
}

/* The ring's stream, its flag and its events, on the ring's GPU. Where the
 * driver cannot make a stream wait on a flag, collectives keep their host
 * side on the calling thread; 0 or the reason in why. */
static int setup_async(struct brg__dev_ring *d, char *why, size_t cap) {
  const brg__cuda_api *api = d->api;
  const char *what = "cudaStreamCreate";
  int e = api->drv.stream_create(&d->proxy);
  if (!e) {
    what = "cudaEventCreate";
    e = api->drv.event_create(&d->proxy_ev);
  }
  if (!e) {
    what = "the flag page";
    e = pinned_alloc(api, FLAG_PAGE, (char **)&d->flag_host, (char **)&d->flag_dev);
  }
  if (!e) {
    what = "cuStreamWaitValue32";
    /* The flag is 0: this wait passes at once, and shows that the driver has them. */
    e = api->drv.stream_wait_value(d->proxy, d->flag_dev, 0);
  }
  if (e) snprintf(why, cap, "%s: %s", what, e == -1 ? strerror(errno) : api->drv.error_string(e));
  return e;
}

/* A start event from the spares, or a new one; NULL when none can be made. */
static void *start_event(struct brg__dev_ring *d) {
  void *ev = NULL;
  pthread_mutex_lock(&d->ev_lock);
  if (d->nspare > 0) ev = d->spare_ev[--d->nspare];
  pthread_mutex_unlock(&d->ev_lock);
  if (!ev && d->api->drv.event_create(&ev) != 0) ev = NULL;
  return ev;
}

static void spare_event(struct brg__dev_ring *d, void *ev) {
  pthread_mutex_lock(&d->ev_lock);
  if (d->nspare == d->capspare) {
    int cap = d->capspare ? 2 * d->capspare : 16;
    void **a = realloc(d->spare_ev, (size_t)cap * sizeof *a);
    if (a) {
      d->spare_ev = a;
      d->capspare = cap;
    }
  }
  if (d->nspare < d->capspare) {
    d->spare_ev[d->nspare++] = ev;
    ev = NULL;
  }
  pthread_mutex_unlock(&d->ev_lock);
  if (ev) d->api->drv.event_destroy(ev);
}

/* The event recorded on a caller's stream after its waits on the flag. */
static void *caller_event(struct brg__dev_ring *d, void *stream) {
  for (int i = 0; i < d->ncallers; i++)
    if (d->callers[i].stream == stream) return d->callers[i].ev;
  int n = (int)(sizeof d->callers / sizeof d->callers[0]);
  if (d->ncallers == n) return NULL;
  void *ev = NULL;
  if (d->api->drv.event_create(&ev) != 0) return NULL;
  d->callers[d->ncallers].stream = stream;
  d->callers[d->ncallers].ev = ev;
  d->ncallers++;
  return ev;
}

int brg__device_ring_async(const struct brg__dev_ring *d) {
  return d && d->async;
}

brg_status brg__device_async_begin(brg_comm *c, brg__coll *k) {
  struct brg__dev_ring *d = c->dev;
  const brg__cuda_api *api = d->api;
  void *ev = start_event(d), *after = caller_event(d, k->stream);
  if (!ev || !after) {
    if (ev) spare_event(d, ev);
    return brg__comm_error(c, BRG_ERR_SYSTEM,
                           "rank %d: %s: no event for the caller's stream %p (more than %d "
                           "streams, or cudaEventCreate failed)",
                           c->rank, brg__coll_name(k->kind), k->stream,
                           (int)(sizeof d->callers / sizeof d->callers[0]));
  }
  uint32_t ticket = d->issued + 1;
  int e = api->drv.event_record(ev, k->stream);
  if (!e) e = api->drv.stream_wait_value(k->stream, d->flag_dev, ticket);
  if (!e) e = api->drv.event_record(after, k->stream);
  if (e) {
    spare_event(d, ev);
    return cuda_fail(c, api, e, "ordering the caller's stream after the collective");
  }
  d->issued = ticket;
  k->async = 1;
  k->ticket = ticket;
  k->start_ev = ev;
  k->stream = d->proxy;
  return BRG_SUCCESS;
}

brg_status brg__device_async_start(brg_comm *c, brg__coll *k) {
  struct brg__dev_ring *d = c->dev;
  int e = d->api->drv.stream_wait_event(d->proxy, k->start_ev);
  spare_event(d, k->start_ev);
  k->start_ev = NULL;
  return e ? cuda_fail(c, d->api, e, "cudaStreamWaitEvent (the caller's stream)") : BRG_SUCCESS;
}

void brg__device_async_end(brg_comm *c, brg__coll *k, brg_status s) {
  struct brg__dev_ring *d = c->dev;
  const brg__cuda_api *api = d->api;
  if (k->start_ev) {
    spare_event(d, k->start_ev);
    k->start_ev = NULL;
  }
  /* In stream order after the collective; and from the host at once when
   * it failed, so that the caller's stream does not wait for work that may
   * never run (the error reaches the caller at its next call). */
  int e = api->drv.stream_write_value(d->proxy, d->flag_dev, k->ticket);
  if (!e) e = api->drv.event_record(d->proxy_ev, d->proxy);
  if (s != BRG_SUCCESS || e) flag_raise(d, k->ticket);
}

/* Whether every event this rank recorded has run, polled until the
 * deadline (ms, -1 never). */
static int own_work_drained(struct brg__dev_ring *d, int64_t deadline) {
  const brg__cuda_api *api = d->api;
  for (int i = 0;; i++) {
    int pending = 0;
    for (int k = 0; k < d->nslots && !pending; k++) {
      if (d->send_ev[k] && api->drv.event_query(d->send_ev[k]) == -1) pending = 1;
      if (d->rel_ev[k] && api->drv.event_query(d->rel_ev[k]) == -1) pending = 1;
    }
    if (d->proxy_ev && api->drv.event_query(d->proxy_ev) == -1) pending = 1;
    if (d->kdone_ev && api->drv.event_query(d->kdone_ev) == -1) pending = 1;
    for (int g = 0; g < d->ngstreams && !pending; g++)
      if (d->gdone_ev[g] && api->drv.event_query(d->gdone_ev[g]) == -1) pending = 1;
    for (int r = 0; r < BRG__DEVICE_MAX_RINGS && !pending; r++)
      if (d->join_ev[r] && api->drv.event_query(d->join_ev[r]) == -1) pending = 1;
    for (int k = 0; k < d->ncallers && !pending; k++)
      if (api->drv.event_query(d->callers[k].ev) == -1) pending = 1;
    if (!pending) return 1;
    if (brg__deadline_passed(deadline)) return 0;
    brg__sleep_ms(i < 100 ? 0 : 1);
  }
}

/* Kernel mode: every channel of this rank's kernels stops at its next
 * wait, writing ABORTED to the status word. */
static void kernel_stop(struct brg__dev_ring *d) {
  if (d->kwords) __atomic_store_n(&d->kwords[0], 1, __ATOMIC_RELEASE);
}

/* ---- kernel mode: the host proxy of links between hosts ---- */

/* A channel's words in a link's host region. */
static uint64_t *pword(char *region, const struct brg__dev_ring *d, int ch, size_t at) {
  return (uint64_t *)(region + (size_t)ch * d->pstride + at);
}

static int proxy_stopping(struct brg__dev_ring *d) {
  return __atomic_load_n(&d->pstop, __ATOMIC_ACQUIRE) ||
         __atomic_load_n(&d->kwords[0], __ATOMIC_ACQUIRE);
}

/* The proxy's waiter check: the proxy stops, or the kernels were stopped. */
static brg_status proxy_check(void *arg) {
  return proxy_stopping(arg) ? BRG_ERR_ABORTED : BRG_SUCCESS;
}

/* Nothing to do: yield at first, then sleep a little longer each time (at
 * most 200 us), so an idle proxy costs little and a busy one reacts at once. */
static void proxy_idle(int *idle) {
  if (++*idle < 64) {
    sched_yield();
    return;
  }
  struct timespec ts = {0, *idle < 2000 ? 20000 : 200000};
  nanosleep(&ts, NULL);
}

/* The proxy gives up: the kernels stop at their next wait, and the next
 * call says why (with what the liveness thread learnt of the neighbours). */
static void *proxy_fail(struct brg__dev_ring *d, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void *proxy_fail(struct brg__dev_ring *d, const char *fmt, ...) {
  if (!__atomic_load_n(&d->pstop, __ATOMIC_ACQUIRE)) {
    char text[sizeof d->perr];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&d->ev_lock);
    if (!d->perr[0]) memcpy(d->perr, text, sizeof text);
    pthread_mutex_unlock(&d->ev_lock);
  }
  kernel_stop(d);
  return NULL;
}

static const char *link_why(const brg__conn *l) {
  return l->fifo.ctrl->closed_why[0] ? l->fifo.ctrl->closed_why : "no reason given";
}

/* tx: every slot a channel's kernel posted to the next host goes into the
 * network link's next slot, its header naming the channel and the bytes
 * (the kernel wrote them beside the tail); once the link holds it, the
 * channel's head says the slot is free. */
/* Each proxy thread sleeps in short naps while idle: with the default
 * timer slack (50 us) a 20 us nap would take 70. */
static void proxy_nap_precise(void) {
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
}

static void *proxy_tx(void *arg) {
  struct brg__dev_ring *d = arg;
  proxy_nap_precise();
  brg__conn *l = &d->net->send;
  brg__fifo *f = &l->fifo;
  brg__waiter w = {.spin = -1, .check = proxy_check, .arg = d};
  uint64_t pos = 0, freed = 0;
  for (int idle = 0; !proxy_stopping(d);) {
    int moved = 0;
    if (d->kgdr_send) {
      /* The one channel's slot n is the link's: free once the link sent it. */
      uint64_t h = __atomic_load_n(&f->ctrl->head, __ATOMIC_ACQUIRE);
      if (h > freed) {
        freed = h;
        __atomic_store_n(pword(d->psend, d, 0, 64), h, __ATOMIC_RELEASE);
        moved = 1;
      }
    }
    for (int ch = 0; ch < d->kchannels && !proxy_stopping(d); ch++) {
      uint64_t sent = d->psent[ch];
      if (__atomic_load_n(pword(d->psend, d, ch, 0), __ATOMIC_ACQUIRE) <= sent) continue;
      if (__atomic_load_n(&f->ctrl->closed, __ATOMIC_ACQUIRE))
        return proxy_fail(d, "the %s link to rank %d broke: %s", l->ops->name, l->peer,
                          link_why(l));
      if (pos + 1 > __atomic_load_n(&f->ctrl->head, __ATOMIC_ACQUIRE) + (uint64_t)f->nslots)
        break; /* the network link is full: its own proxy frees slots */
      uint64_t k = sent % (uint64_t)d->nslots;
      uint64_t bytes = *pword(d->psend, d, ch, 128 + 8 * k);
      const char *payload = d->psend + (size_t)ch * d->pstride + PCTRL + k * d->kslot;
      if (bytes > d->kslot)
        return proxy_fail(d, "a kernel posted %llu bytes in a slot of %zu to rank %d",
                          (unsigned long long)bytes, d->kslot, l->peer);
      brg__slot_meta *m = brg__fifo_meta(f, pos);
      memset(m, 0, offsetof(brg__slot_meta, inline_data));
      m->seq = sent + 1;
      m->bytes = (uint32_t)bytes;
      m->root = ch;
      if (d->kgdr_send) {
        m->device = 1; /* the link reads it from GPU slot pos % nslots */
        payload = NULL;
      } else if (bytes <= BRG__INLINE_BYTES) {
        memcpy(m->inline_data, payload, bytes);
        payload = NULL;
      } else if (!l->ops->send_now) {
        memcpy(brg__fifo_slot(f, pos), payload, bytes);
      }
      __atomic_store_n(&m->flag, pos + 1, __ATOMIC_RELEASE);
      brg__publish(&f->ctrl->tail, &f->ctrl->tail_waiters, pos + 1);
      if (l->ops->send_now) {
        brg_status st = l->ops->send_now(l, pos, payload, &w);
        if (st != BRG_SUCCESS && proxy_stopping(d)) return NULL;
        if (st != BRG_SUCCESS)
          return proxy_fail(d, "sending to rank %d on the %s link failed: %s", l->peer,
                            l->ops->name, link_why(l));
      }
      pos++;
      __atomic_store_n(&d->psent[ch], sent + 1, __ATOMIC_RELEASE);
      if (!d->kgdr_send) __atomic_store_n(pword(d->psend, d, ch, 64), sent + 1, __ATOMIC_RELEASE);
      moved = 1;
    }
    if (moved)
      idle = 0;
    else
      proxy_idle(&idle);
  }
  return NULL;
}

/* rx: each slot that arrives from the previous host goes into the next
 * slot of the channel its header names, once that channel's kernel has
 * freed it, and the channel's tail says so. A channel whose slots are all
 * taken holds back the ones behind it: its kernel frees them without
 * waiting for any other channel (a ring step takes a slot in and puts one
 * out, so the channel's slots around the ring never all fill). */
static void *proxy_rx(void *arg) {
  struct brg__dev_ring *d = arg;
  proxy_nap_precise();
  brg__conn *l = &d->net->recv;
  brg__fifo *f = &l->fifo;
  uint64_t pos = 0, got[BRG__RK_MAX_CHANNELS] = {0}, released = 0;
  if (d->kgdr_recv) d->api->drv.set_device(d->gpu); /* its flushes are for this GPU */
  for (int idle = 0; !proxy_stopping(d);) {
    if (d->kgdr_recv) {
      /* The link's slot n is the one channel's: the previous rank may
       * write it again once the kernel took it. */
      uint64_t h = __atomic_load_n(pword(d->precv, d, 0, 64), __ATOMIC_ACQUIRE);
      if (h > released) {
        released = h;
        brg__publish(&f->ctrl->head, &f->ctrl->head_waiters, h);
        idle = 0;
      }
    }
    brg__slot_meta *m = brg__fifo_meta(f, pos);
    if (__atomic_load_n(&m->flag, __ATOMIC_ACQUIRE) != pos + 1) {
      if (__atomic_load_n(&f->ctrl->closed, __ATOMIC_ACQUIRE))
        return proxy_fail(d, "the %s link from rank %d broke: %s", l->ops->name, l->peer,
                          link_why(l));
      proxy_idle(&idle);
      continue;
    }
    int ch = m->root;
    uint64_t bytes = m->bytes;
    if (ch < 0 || ch >= d->kchannels || bytes > d->kslot || m->seq != got[ch] + 1 ||
        (int)m->device != d->kgdr_recv)
      return proxy_fail(d,
                        "rank %d sent a kernel-mode slot this rank cannot place (channel %d of "
                        "%d, %llu bytes of at most %zu, slot %llu where %llu was due, %s where "
                        "%s was due)",
                        l->peer, ch, d->kchannels, (unsigned long long)bytes, d->kslot,
                        (unsigned long long)m->seq, (unsigned long long)(got[ch] + 1),
                        m->device ? "GPU memory" : "host memory",
                        d->kgdr_recv ? "GPU memory" : "host memory");
    while (got[ch] - __atomic_load_n(pword(d->precv, d, ch, 64), __ATOMIC_ACQUIRE) >=
           (uint64_t)d->nslots) {
      if (proxy_stopping(d)) return NULL;
      proxy_idle(&idle);
    }
    uint64_t k = got[ch] % (uint64_t)d->nslots;
    if (d->kgdr_recv) {
      /* Landed in GPU slot pos % nslots (= k: one channel); the running
       * kernel may read it once the writes are flushed to the GPU. */
      int e = bytes ? d->api->drv.flush_rdma_writes() : 0;
      if (e)
        return proxy_fail(d, "flushing GPUDirect RDMA writes from rank %d: %s", l->peer,
                          d->api->drv.error_string(e));
    } else {
      const char *src = bytes <= BRG__INLINE_BYTES ? m->inline_data : brg__fifo_slot(f, pos);
      memcpy(d->precv + (size_t)ch * d->pstride + PCTRL + k * d->kslot, src, bytes);
    }
    got[ch]++;
    __atomic_store_n(pword(d->precv, d, ch, 0), got[ch], __ATOMIC_RELEASE);
    pos++;
    if (!d->kgdr_recv) brg__publish(&f->ctrl->head, &f->ctrl->head_waiters, pos);
    idle = 0;
  }
  return NULL;
}

/* Starts the proxy on c->devnet's links, which must join the same
 * neighbours as the ring's own. */
static brg_status proxy_start(brg_comm *c, struct brg__dev_ring *d) {
  brg_comm *n = c->devnet;
  if (!n || n->nranks != c->nranks || n->next != c->next || n->prev != c->prev)
    return brg__comm_error(c, BRG_ERR_INTERNAL,
                           "rank %d: kernel mode's links between hosts do not join this ring's "
                           "neighbours (%d and %d)",
                           c->rank, c->prev, c->next);
  d->net = n;
  brg__errbuf err;
  brg_status s = BRG_SUCCESS;
  if (d->send_staged &&
      (s = brg__proxy_start(&d->ptx, proxy_tx, d, "brg-kproxy-tx", &err)) == BRG_SUCCESS)
    d->ptx_on = 1;
  if (s == BRG_SUCCESS && d->recv_staged &&
      (s = brg__proxy_start(&d->prx, proxy_rx, d, "brg-kproxy-rx", &err)) == BRG_SUCCESS)
    d->prx_on = 1;
  return s == BRG_SUCCESS ? s : brg__comm_error(c, s, "%s", err.msg);
}

/* Whether tx has carried every slot the kernels posted to the next host. */
static int proxy_flushed(struct brg__dev_ring *d) {
  for (int ch = 0; d->psend && ch < d->kchannels; ch++)
    if (__atomic_load_n(pword(d->psend, d, ch, 0), __ATOMIC_ACQUIRE) >
        __atomic_load_n(&d->psent[ch], __ATOMIC_ACQUIRE))
      return 0;
  return 1;
}

void brg__device_proxy_stop(brg_comm *c) {
  if (c->dev) proxy_join(c->dev);
}

void brg__device_abort(brg_comm *c) {
  struct brg__dev_ring *d = __atomic_load_n(&c->dev, __ATOMIC_ACQUIRE);
  if (d) kernel_stop(d);
}

static brg_status kernel_drain_wait(brg_comm *c, struct brg__dev_ring *d);

/* The streams that captured launches: an event after what they hold now
 * (graph replays launched there), where they are not capturing again. */
static void graph_streams_mark(struct brg__dev_ring *d) {
  const brg__cuda_api *api = d->api;
  for (int i = 0; i < d->ngstreams; i++) {
    int capturing = 0;
    if (api->drv.stream_capturing(d->gstream[i], &capturing) != 0 || capturing) {
      api->drv.last_error();
      continue;
    }
    if (!d->gdone_ev[i] && api->drv.event_create(&d->gdone_ev[i]) != 0) continue;
    api->drv.event_record(d->gdone_ev[i], d->gstream[i]);
  }
}

/* Kernel mode's drain. After graphs captured launches, their replays on
 * the streams they were captured on are waited for too, and then the
 * abort word is set for good: a replay that comes later ends at once. */
static brg_status kernel_drain(brg_comm *c, struct brg__dev_ring *d) {
  if (d->graphs) graph_streams_mark(d);
  brg_status s = kernel_drain_wait(c, d);
  if (d->graphs) kernel_stop(d);
  return s;
}

/* Kernel mode: waits for this rank's kernels with the communicator's
 * checks (the ring sockets, the timeout), since no liveness thread runs
 * any more; a neighbour gone or silent stops the kernels, and the stream
 * drains. */
static brg_status kernel_drain_wait(brg_comm *c, struct brg__dev_ring *d) {
  c->cur = NULL;
  c->wait_conn = NULL;
  c->wait_peer = c->next;
  c->wait_what = "finish its device collectives";
  c->wait_start_ns = 0;
  /* A neighbour that drained and left has taken every slot this rank's
   * kernels posted to it and posted every slot they read: they finish
   * without it. */
  c->departed_ok = 1;
  for (int i = 0;; i++) {
    if (own_work_drained(d, 0) && proxy_flushed(d)) return BRG_SUCCESS;
    brg_status s = c->waiter.check ? c->waiter.check(c->waiter.arg) : BRG_SUCCESS;
    if (s != BRG_SUCCESS) {
      kernel_stop(d);
      int drained = own_work_drained(d, brg__deadline_ms(5000));
      d->stuck = !drained;
      char why[BRG__ERRLEN / 2];
      snprintf(why, sizeof why, "%.*s", (int)sizeof why - 1, c->last_error);
      return brg__comm_error(c, s,
                             "rank %d: device work on stream %p was stopped before it finished "
                             "(%s): %s",
                             c->rank, d->last_stream,
                             drained ? "the stream drained"
                                     : "the stream did not drain within 5 s "
                                       "and its FIFOs stay allocated",
                             why);
    }
    brg__sleep_ms(i < 100 ? 0 : 1);
  }
}

brg_status brg__device_ring_drain(brg_comm *c) {
  struct brg__dev_ring *d = c->dev;
  if (!d) return BRG_SUCCESS;
  /* A communicator that failed will not see its kernels' peers again. */
  if (__atomic_load_n(&c->broken, __ATOMIC_ACQUIRE) != BRG_SUCCESS ||
      __atomic_load_n(&c->aborted, __ATOMIC_ACQUIRE))
    kernel_stop(d);
  if (d->kernel) return kernel_drain(c, d);
  if (own_work_drained(d, brg__deadline_ms(c->timeout_ms))) return BRG_SUCCESS;
  d->stuck = 1;
  /* The callers' streams must not wait for the ring's own forever: its
   * flag jumps to the last ticket (what they then read is not the
   * collectives' result, which the error below says). */
  if (d->flag_host) flag_raise(d, d->issued);
  char stream[160];
  if (d->async)
    snprintf(stream, sizeof stream,
             "its own stream %p (the callers' streams no longer wait for it, and what they read "
             "is not a result)",
             d->proxy);
  else if (d->last_stream)
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
  int e = api->drv.host_register(base, brg__fifo_region_bytes(f->nslots, f->slot_bytes), &dp);
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
  int e = d->api->drv.dmabuf_export(p, bytes, &fd, &off);
  if (e) {
    snprintf(why, cap, "no dmabuf for GPU memory: %s", d->api->drv.error_string(e));
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

/* What one rank offers for GPUDirect RDMA on its staged links. */
typedef struct gdr_offer {
  int32_t *send_ok, *recv_ok; /* set where registered */
  uint32_t *rkey;             /* of the receive slots */
  char *why;                  /* why not, for the log */
  size_t why_bytes;
} gdr_offer;

/* Registers GPU slots (`bytes` each way) with a staged send and receive
 * link (NULL: that link is not staged): the receive slots at *rbuf (made
 * here when NULL), the send slots made at *sbuf. */
static void gdr_offer_slots(struct brg__dev_ring *d, brg__conn *send, brg__conn *recv, size_t bytes,
                            char **rbuf, char **sbuf, const gdr_offer *o) {
  unsigned char unused[HB];
  /* Kernels may read what the network wrote only after a flush (or on a
   * GPU that orders those writes itself). */
  int e = recv ? d->api->drv.flush_rdma_writes() : 0;
  if (e) {
    snprintf(o->why, o->why_bytes, "receive: %s", d->api->drv.error_string(e));
  } else if (recv) {
    /* Exported memory, of which every driver makes a dmabuf. */
    e = *rbuf ? 0 : d->api->drv.ipc_mem_export((void **)rbuf, bytes, unused);
    if (e)
      snprintf(o->why, o->why_bytes, "cudaMalloc: %s", d->api->drv.error_string(e));
    else if (gdr_register(d, recv, *rbuf, bytes, o->rkey, o->why, o->why_bytes) == 0)
      *o->recv_ok = 1;
  }
  if (send) {
    e = d->api->drv.ipc_mem_export((void **)sbuf, bytes, unused);
    if (e)
      snprintf(o->why, o->why_bytes, "cudaMalloc: %s", d->api->drv.error_string(e));
    else if (gdr_register(d, send, *sbuf, bytes, NULL, o->why, o->why_bytes) == 0)
      *o->send_ok = 1;
  }
}

/* GPUDirect RDMA on step mode's staged links, where the transport and the
 * GPU allow it; whether it then runs is decided with the neighbour. */
static void setup_gdr(struct brg__dev_ring *d, dev_blob *b) {
  if (!brg__device_int(BRG__DEVICE_IB_GDR)) {
    snprintf(b->gdr_why, sizeof b->gdr_why, "off (BRIGADE_IB_GDR=0)");
    return;
  }
  gdr_offer o = {&b->gdr_send_ok, &b->gdr_recv_ok, &b->gdr_rkey, b->gdr_why, sizeof b->gdr_why};
  gdr_offer_slots(d, d->send_staged ? d->link_send : NULL, d->recv_staged ? d->link_recv : NULL,
                  (size_t)d->nslots * d->gdr_stride, &d->fifo, &d->gdr_send, &o);
  d->send_reg = b->gdr_send_ok;
  d->recv_reg = b->gdr_recv_ok;
}

/* Whether kernels of `peer`'s GPU reach this rank's GPU memory. */
static int reaches(const struct brg__dev_ring *d, const dev_blob *self, const dev_blob *peer) {
  brg__gpu_desc a = gpu_desc(self), b = gpu_desc(peer);
  return brg__cuda_ipc_reaches(d->api, &a, &b);
}

/* ---- kernel mode: setup ---- */

/* GPUDirect RDMA on kernel mode's staged links (one channel there): GPU
 * slots registered with the proxy's links, where the transport and the GPU
 * allow it; whether it then runs is decided with the neighbour. */
static void setup_kernel_gdr(brg_comm *c, struct brg__dev_ring *d, dev_blob *b) {
  if (!d->send_staged && !d->recv_staged) return;
  if (!brg__device_int(BRG__DEVICE_IB_GDR)) {
    snprintf(b->kgdr_why, sizeof b->kgdr_why, "off (BRIGADE_IB_GDR=0)");
    return;
  }
  if (d->kchannels != 1 || c->devnet->nslots != d->nslots) {
    snprintf(b->kgdr_why, sizeof b->kgdr_why, "%d channels, %d slots on the proxy's links",
             d->kchannels, c->devnet->nslots);
    return;
  }
  /* The proxy flushes what the network wrote before it raises a tail. */
  gdr_offer o = {&b->kgdr_send_ok, &b->kgdr_recv_ok, &b->kgdr_rkey, b->kgdr_why,
                 sizeof b->kgdr_why};
  gdr_offer_slots(d, d->send_staged ? &c->devnet->send : NULL,
                  d->recv_staged ? &c->devnet->recv : NULL, (size_t)d->nslots * d->kslot,
                  &d->kgdr_rbuf, &d->kgdr_sbuf, &o);
  b->kgdr_rptr = (uint64_t)(uintptr_t)d->kgdr_rbuf;
}

static const char *kmode_name(int m) {
  return m == 0 ? "auto" : m == 1 ? "kernel" : m == 2 ? "step" : "?";
}

/* The region of one rank: per channel the control words and the slots. */
static size_t kregion_bytes(const struct brg__dev_ring *d) {
  return (size_t)d->kchannels * d->kstride + d->kos_bytes;
}

/* This rank's kernel-mode half: its region (which both neighbours' kernels
 * write), the ring order and the abort and status words, and for a link
 * to another host the host region the proxy serves; b->kernel_ok, or why
 * not in b->kwhy. Neighbours of this host whose GPUs cannot reach this one
 * keep the ring in step mode. */
static void setup_kernel_local(brg_comm *c, struct brg__dev_ring *d, dev_blob *b,
                               const dev_blob *all, int staged) {
  const brg__cuda_api *api = d->api;
  const dev_blob *prev = &all[c->prev], *next = &all[c->next];
  b->kmode_req = d->kmode_req;
  b->kchannels = d->kchannels;
  b->kslot = d->kslot;
  b->kos_slot = d->kos_slot;
  if (d->kmode_req == 2) {
    snprintf(b->kwhy, sizeof b->kwhy, "BRIGADE_DEVICE_MODE=step");
    return;
  }
  if (staged && !c->devnet) {
    snprintf(b->kwhy, sizeof b->kwhy,
             "the ring has device links staged through host links and the proxy's "
             "communicator for them was not made");
    return;
  }
  if (staged && c->devnet->send.fifo.slot_bytes < d->kslot) {
    snprintf(b->kwhy, sizeof b->kwhy,
             "the staged links' slots (%zu bytes) are smaller than kernel mode's (%zu)",
             c->devnet->send.fifo.slot_bytes, d->kslot);
    return;
  }
  if ((!d->recv_staged && !reaches(d, b, prev)) || (!d->send_staged && !reaches(d, b, next))) {
    snprintf(b->kwhy, sizeof b->kwhy,
             "rank %d's GPU cannot reach the GPU of a neighbour (no peer access)", c->rank);
    return;
  }
  /* Both neighbours' kernels write the region: it is the receiving end of
   * a cuda_ipc link that each of them maps (the previous rank's, or the
   * next's where the link from the previous one is staged). */
  brg__errbuf err = {0};
  const dev_blob *writer = !d->recv_staged ? prev : !d->send_staged ? next : b;
  if (link_export(c, d, &d->kin, !d->recv_staged ? c->prev : c->next, b, writer, kregion_bytes(d),
                  d->kslot, 0, b->kregion_info, &err) != BRG_SUCCESS) {
    snprintf(b->kwhy, sizeof b->kwhy, "%.127s", err.msg);
    return;
  }
  d->kregion = d->kin.fifo.data;
  const char *what = "clearing the kernel-mode FIFOs";
  int e = api->drv.mem_set(d->kregion, 0, kregion_bytes(d));
  if (!e) {
    what = "cudaMalloc of the ring order";
    e = api->drv.mem_alloc((void **)&d->kring, (size_t)c->nranks * sizeof(int));
  }
  if (!e) {
    what = "copying the ring order";
    e = api->drv.mem_copy(d->kring, c->ring, (size_t)c->nranks * sizeof(int));
  }
  if (!e) {
    what = "cudaEventCreate";
    e = api->drv.event_create(&d->kdone_ev);
  }
  if (!e) {
    what = "the abort and status words";
    e = pinned_alloc(api, FLAG_PAGE, (char **)&d->kwords, (char **)&d->kwords_dev);
  }
  if (!e && d->send_staged) {
    what = "pinned host memory for the slots to the next rank (staged link)";
    e = pinned_alloc(api, pregion_bytes(d), &d->psend, &d->psend_dev);
  }
  if (!e && d->recv_staged) {
    what = "pinned host memory for the slots from the previous rank (staged link)";
    e = pinned_alloc(api, pregion_bytes(d), &d->precv, &d->precv_dev);
  }
  if (e) {
    snprintf(b->kwhy, sizeof b->kwhy, "%s: %s", what,
             e == -1 ? strerror(errno) : api->drv.error_string(e));
    return;
  }
  setup_kernel_gdr(c, d, b);
  b->kernel_ok = 1;
  b->kos_ok = d->kos_slot > 0 && !staged; /* one hop reaches the ranks of cuda_ipc links only */
  for (int r = 0; b->kos_ok && r < c->nranks; r++) b->kos_ok &= reaches(d, b, &all[r]);
}

/* Rank `rank`'s region, mapped here (in one process, its pointer). */
static brg_status kernel_map(brg_comm *c, struct brg__dev_ring *d, const dev_blob *self,
                             const dev_blob *peer, int rank, brg__conn *l, char **out) {
  brg_status s =
      link_map(c, d, l, rank, self, peer, kregion_bytes(d), d->kslot, peer->kregion_info);
  if (s == BRG_SUCCESS) *out = l->fifo.data;
  return s;
}

/* The neighbours' regions; a staged link's neighbour is the proxy's. */
static brg_status setup_kernel_links(brg_comm *c, struct brg__dev_ring *d, const dev_blob *self,
                                     const dev_blob *next, const dev_blob *prev) {
  brg_status s = BRG_SUCCESS;
  if (!d->send_staged) s = kernel_map(c, d, self, next, c->next, &d->knext_c, &d->knext);
  if (s != BRG_SUCCESS || d->recv_staged) return s;
  if (c->prev == c->next && !d->send_staged) {
    d->kprev = d->knext; /* two ranks: one mapping serves both links */
    return BRG_SUCCESS;
  }
  return kernel_map(c, d, self, prev, c->prev, &d->kprev_c, &d->kprev);
}

/* The one-shot path, where every rank's GPU reaches every rank's area (all
 * ranks decide alike, from the same blobs): every region mapped here. */
static brg_status setup_oneshot(brg_comm *c, struct brg__dev_ring *d, const dev_blob *self,
                                const dev_blob *all) {
  int who = -1;
  for (int r = 0; r < c->nranks; r++)
    if (!all[r].kos_ok && who < 0) who = r;
  if (!d->kos_slot) return BRG_SUCCESS;
  if (brg__device_staged_any(c)) {
    BRG__INFO("init", "device ring: no one-shot allreduce: device links of the ring are staged "
                      "through host links (ranks on several hosts, or cuda_ipc not among "
                      "BRIGADE_TRANSPORTS), so small allreduces take the ring");
    return BRG_SUCCESS;
  }
  if (who >= 0) {
    BRG__INFO("init",
              "device ring: no one-shot allreduce: a GPU cannot reach rank %d's (no peer access), "
              "so small allreduces take the ring",
              who);
    return BRG_SUCCESS;
  }
  size_t off = (size_t)d->kchannels * d->kstride;
  for (int r = 0; r < c->nranks; r++) {
    char *base = r == c->rank   ? d->kregion
                 : r == c->next ? d->knext
                 : r == c->prev ? d->kprev
                                : NULL;
    if (!base) {
      brg_status s = kernel_map(c, d, self, &all[r], r, &d->kos_c[r], &base);
      if (s != BRG_SUCCESS) return s;
    }
    d->kos_area[r] = base + off;
  }
  d->oneshot = 1;
  return BRG_SUCCESS;
}

/* Whether ranks r and q are of different processes on one GPU. */
static int shares_gpu(const brg_comm *c, const dev_blob *all, int r, int q) {
  return !memcmp(all[r].uuid, all[q].uuid, 16) && all[r].process != all[q].process &&
         c->peers[r].host_hash == c->peers[q].host_hash;
}

/* Why kernel mode does not run, from every rank's description; NULL when
 * it can. Forced (BRIGADE_DEVICE_MODE=kernel), only a rank that cannot
 * stops it; automatic, so do ranks of different processes on one GPU
 * without MPS, whose kernels would take turns while spinning. */
static const char *kernel_refused(const brg_comm *c, const dev_blob *all, int *who) {
  for (int r = 0; r < c->nranks; r++)
    if (!all[r].kernel_ok) {
      *who = r;
      return all[r].kwhy;
    }
  if (all[0].kmode_req == 0)
    for (int r = 0; r < c->nranks; r++)
      for (int q = 0; q < r; q++)
        if (shares_gpu(c, all, r, q) && !all[r].mps) {
          *who = r;
          return "ranks of different processes share a GPU and MPS is not running: their "
                 "kernels would take turns on it (BRIGADE_DEVICE_MODE=kernel forces it)";
        }
  return NULL;
}

/* The receive FIFO's size: GPU slots of a GPUDirect link from another
 * host, or slices from a rank of this host. */
static size_t fifo_bytes(const struct brg__dev_ring *d) {
  return (size_t)d->nslots * (d->recv_staged ? d->gdr_stride : d->stride);
}

/* This rank's own half: FIFO, events and mapped host FIFOs, described in `b`. */
static void setup_local(brg_comm *c, struct brg__dev_ring *d, dev_blob *b, const dev_blob *prev) {
  const brg__cuda_api *api = d->api;
  int e = 0;
  const char *what = "cudaGetDeviceProperties";
  if (!e && d->send_staged) {
    what = "cudaHostRegister of the send FIFO (staged link)";
    e = map_host_fifo(api, &c->send.fifo, &d->send_region, &d->send_region_dev);
  }
  if (!e && d->recv_staged) {
    what = "cudaHostRegister of the receive FIFO (staged link)";
    e = map_host_fifo(api, &c->recv.fifo, &d->recv_region, &d->recv_region_dev);
  }
  if (!e && !d->recv_staged) {
    /* The previous rank's kernels write this FIFO (a cuda_ipc link):
     * where they cannot reach this GPU, it is pinned host memory that both
     * GPUs reach. */
    brg__errbuf err = {0};
    if (link_export(c, d, &d->fifo_in, c->prev, b, prev, fifo_bytes(d), d->stride, 1, b->fifo_info,
                    &err) != BRG_SUCCESS) {
      snprintf(b->why, sizeof b->why, "%.191s", err.msg);
      return;
    }
    d->fifo = d->fifo_in.fifo.data;
  } else if (!e) {
    /* Exported memory, which the GPUDirect link can register. */
    unsigned char handle[HB];
    what = "cudaMalloc of the GPU slots of the staged link from the previous rank";
    e = api->drv.ipc_mem_export((void **)&d->fifo, fifo_bytes(d), handle);
  }
  for (int k = 0; !e && k < d->nslots; k++) {
    what = "creating interprocess events";
    e = api->drv.ipc_event_export(&d->send_ev[k], b->send_ev[k]);
    if (!e) e = api->drv.ipc_event_export(&d->rel_ev[k], b->rel_ev[k]);
    b->send_ev_ptr[k] = (uint64_t)(uintptr_t)d->send_ev[k];
    b->rel_ev_ptr[k] = (uint64_t)(uintptr_t)d->rel_ev[k];
  }
  b->fifo_ptr = (uint64_t)(uintptr_t)d->fifo;
  if (!e) setup_gdr(d, b);
  if (e) {
    snprintf(b->why, sizeof b->why, "%s: %s (%zu bytes of FIFO)", what,
             e == -1 ? strerror(errno) : api->drv.error_string(e), fifo_bytes(d));
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

/* A neighbour's events: its pointers in this process, or opened from its
 * handles (`handles`: nslots of HB bytes). */
static brg_status peer_events(brg_comm *c, struct brg__dev_ring *d, const dev_blob *self,
                              const dev_blob *peer, const uint64_t *ptrs, const void *handles,
                              void **out, int *opened, const char *what) {
  if (peer->process == self->process) {
    for (int k = 0; k < d->nslots; k++) out[k] = (void *)(uintptr_t)ptrs[k];
    return BRG_SUCCESS;
  }
  *opened = 1;
  for (int k = 0; k < d->nslots; k++) {
    int e = d->api->drv.ipc_event_open(&out[k], (const unsigned char *)handles + (size_t)k * HB);
    if (e) return cuda_fail(c, d->api, e, what);
  }
  return BRG_SUCCESS;
}

/* The links to the neighbours, from their blobs. */
static brg_status setup_links(brg_comm *c, struct brg__dev_ring *d, const dev_blob *self,
                              const dev_blob *next, const dev_blob *prev) {
  brg_status s = BRG_SUCCESS;
  if (!d->send_staged) {
    s = link_map(c, d, &d->fifo_out, c->next, self, next, (size_t)d->nslots * d->stride, d->stride,
                 next->fifo_info);
    d->next_fifo = d->fifo_out.fifo.data;
    if (s == BRG_SUCCESS)
      s = peer_events(c, d, self, next, next->rel_ev_ptr, next->rel_ev, d->next_rel_ev,
                      &d->next_opened, "cudaIpcOpenEventHandle (next rank's events)");
  }
  /* (a staged link's slots are the host transport's FIFO) */
  if (s == BRG_SUCCESS && !d->recv_staged)
    s = peer_events(c, d, self, prev, prev->send_ev_ptr, prev->send_ev, d->prev_send_ev,
                    &d->prev_opened, "cudaIpcOpenEventHandle (previous rank's events)");
  return s;
}

/* Whether MPS serves this process's work on `gpu`: the driver's answer
 * where it has one (cudaDevAttrMpsEnabled), else whether the control
 * daemon's pipe is there; *driver says which. Every rank puts its verdict
 * in its blob, and ranks that share a GPU must agree (a rank that guessed
 * alone could take kernel mode while the other took step mode). */
static int mps_verdict(const brg__cuda_api *api, int gpu, int32_t *driver) {
  int on = 0;
  if (api->drv.mps_enabled(gpu, &on) == 0) {
    *driver = 1;
    return on;
  }
  *driver = 0;
  const char *dir = getenv("CUDA_MPS_PIPE_DIRECTORY");
  char path[512];
  snprintf(path, sizeof path, "%s/control", dir && dir[0] ? dir : "/tmp/nvidia-mps");
  return access(path, F_OK) == 0;
}

static const char *mps_words(const dev_blob *b) {
  return b->mps ? (b->mps_driver ? "MPS running (the driver says)"
                                 : "MPS running (its control pipe is there)")
                : (b->mps_driver ? "no MPS (the driver says)" : "no MPS (no control pipe)");
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
  /* A device link without GPU memory of its own stages through the host
   * link, which then is of the same transport (every transport that
   * carries host collectives carries device ones this way). Both ends of
   * each link chose alike: init checked (comm.c). */
  d->send_t = brg__device_link(c, c->rank, c->next);
  d->recv_t = brg__device_link(c, c->prev, c->rank);
  d->send_staged = !d->send_t || !d->send_t->gpu_memory;
  d->recv_staged = !d->recv_t || !d->recv_t->gpu_memory;
  if ((d->send_staged && c->nranks > 1 && d->send_t != c->send.ops) ||
      (d->recv_staged && c->nranks > 1 && d->recv_t != c->recv.ops)) {
    int from = d->send_staged ? c->rank : c->prev, to = d->send_staged ? c->next : c->rank;
    free(d);
    free(all);
    free(mine);
    return brg__comm_error(c, BRG_ERR_INTERNAL,
                           "device collectives: no transport carries GPU memory from rank %d to "
                           "rank %d, and the host link's transport is not the one chosen",
                           from, to);
  }
  /* Every rank slices alike (the slice is the pipeline unit); each link
   * carries a slice in slots of its own size. */
  d->send_piece = d->send_staged ? c->slice_bytes : d->slice_bytes;
  d->recv_piece = d->recv_staged ? c->slice_bytes : d->slice_bytes;
  d->gdr_stride = c->slice_bytes + SLOT_SHIFT_ROOM;
  int staged = brg__device_staged_any(c);
  /* A staged link takes a slice in pieces of the host link's slot. A step
   * that only sends (the first) fills the link with a whole slice before
   * the next rank reads any of it, and the next step holds a received
   * piece while it waits for a free slot: a slice of more pieces than half
   * the slots could fill the ring's links all around and stall it. */
  size_t staged_cap = ((size_t)(d->nslots > 3 ? d->nslots / 2 : 1) * c->slice_bytes) & ~(size_t)255;
  if (staged && staged_cap && d->slice_bytes > staged_cap) d->slice_bytes = staged_cap;
  int proxy = (int)brg__device_int(BRG__DEVICE_PROXY);
  d->async = proxy < 0 ? staged : proxy;
  const char *mode = brg__device_str(BRG__DEVICE_MODE);
  d->kmode_req = !strcmp(mode, "auto")     ? 0
                 : !strcmp(mode, "kernel") ? 1
                 : !strcmp(mode, "step")   ? 2
                                           : -1;
  if (d->kmode_req < 0) {
    free(d);
    free(all);
    free(mine);
    return brg__comm_error(c, BRG_ERR_INVALID_ARGUMENT,
                           "BRIGADE_DEVICE_MODE=\"%s\" is not a mode (auto, kernel or step)", mode);
  }
  int blocks = (int)brg__device_int(BRG__DEVICE_BLOCKS);
  d->kchannels = (int)brg__device_int(BRG__DEVICE_CHANNELS);
  if (d->kchannels == 0) d->kchannels = blocks < 8 ? blocks : 8;
  if (d->kchannels > BRG__RK_MAX_CHANNELS) d->kchannels = BRG__RK_MAX_CHANNELS;
  /* With staged links, one channel: channels sharing the proxy's link
   * could block each other across launches (a launch's slots waiting
   * behind the next launch's in a full channel), and the host link, not
   * the channel count, bounds such a ring. Every rank sees `staged` alike. */
  if (staged) d->kchannels = 1;
  d->kslot = c->slice_bytes & ~(size_t)255;
  d->kctrl = (KMETA + (size_t)d->nslots * sizeof(brg__rk_meta) +
              BRG__RK_HDRS * sizeof(brg__rk_hdr) + 255) &
             ~(size_t)255;
  d->kstride = d->kctrl + (size_t)d->nslots * d->kslot;
  d->pstride = PCTRL + (size_t)d->nslots * d->kslot;
  d->kos_limit = (size_t)brg__device_int(BRG__DEVICE_SMALL_BYTES);
  if (d->kos_limit && c->nranks >= 2 && c->nranks <= BRG__RK_MAX_PEERS) {
    d->kos_slot = (d->kos_limit + 255) & ~(size_t)255;
    d->kos_bytes = brg__rk_os_bytes(c->nranks, d->kos_slot);
  }
  pthread_mutex_init(&d->ev_lock, NULL);
  mine->pid = (int32_t)getpid();
  mine->process = process_token();
  if (api->drv.get_device(&mine->gpu) != 0) mine->gpu = 0;
  d->gpu = mine->gpu;
  mine->nslots = d->nslots;
  mine->slice_bytes = d->slice_bytes;
  if (api->drv.device_uuid(mine->uuid) != 0) memset(mine->uuid, 0, sizeof mine->uuid);
  mine->mps = mps_verdict(api, mine->gpu, &mine->mps_driver);
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
  setup_kernel_local(c, st->d, mine, all, brg__device_staged_any(c));
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
  for (int r = 0; s == BRG_SUCCESS && r < c->nranks; r++)
    if (all[r].kmode_req != mine->kmode_req || all[r].kchannels != mine->kchannels ||
        all[r].kslot != mine->kslot)
      s = brg__comm_error(c, BRG_ERR_MISMATCH,
                          "device collectives: rank %d has BRIGADE_DEVICE_MODE %s with %d "
                          "channels of %llu-byte slots, rank %d %s with %d of %llu (set "
                          "BRIGADE_DEVICE_MODE, BRIGADE_DEVICE_CHANNELS and BRIGADE_SLICE_BYTES "
                          "alike on every rank)",
                          r, kmode_name(all[r].kmode_req), all[r].kchannels,
                          (unsigned long long)all[r].kslot, c->rank, kmode_name(mine->kmode_req),
                          mine->kchannels, (unsigned long long)mine->kslot);
  for (int r = 0; s == BRG_SUCCESS && r < c->nranks; r++)
    if (all[r].kos_slot != mine->kos_slot)
      s = brg__comm_error(c, BRG_ERR_MISMATCH,
                          "device collectives: rank %d has one-shot slots of %llu bytes, rank %d "
                          "of %llu (set BRIGADE_DEVICE_SMALL_BYTES alike on every rank)",
                          r, (unsigned long long)all[r].kos_slot, c->rank,
                          (unsigned long long)mine->kos_slot);
  for (int r = 0; s == BRG_SUCCESS && r < c->nranks; r++)
    for (int q = 0; s == BRG_SUCCESS && q < r; q++)
      if (shares_gpu(c, all, r, q) && all[r].mps != all[q].mps)
        s = brg__comm_error(c, BRG_ERR_MISMATCH,
                            "device collectives: ranks %d and %d share a GPU in different "
                            "processes, but rank %d finds %s and rank %d %s (their kernels would "
                            "take different modes; run every process of the GPU under the MPS "
                            "daemon or none, with one CUDA_MPS_PIPE_DIRECTORY)",
                            q, r, q, mps_words(&all[q]), r, mps_words(&all[r]));
  int kwho = -1;
  const char *kwhy = s == BRG_SUCCESS ? kernel_refused(c, all, &kwho) : NULL;
  if (s == BRG_SUCCESS && kwhy && d->kmode_req == 1)
    s = brg__comm_error(c, BRG_ERR_INVALID_USAGE,
                        "device collectives: BRIGADE_DEVICE_MODE=kernel, but rank %d cannot run "
                        "them in kernel mode: %s",
                        kwho, kwhy);
  d->kernel = s == BRG_SUCCESS && !kwhy;
  snprintf(d->step_why, sizeof d->step_why, "%s",
           d->kmode_req == 2 ? "BRIGADE_DEVICE_MODE=step"
           : kwhy            ? kwhy
                             : "");
  for (int r = 0; d->kernel && r < c->nranks; r++)
    if (r != c->rank && all[r].process == mine->process) {
      d->kthreads = 1;
      if (!memcmp(all[r].uuid, mine->uuid, 16)) d->kshared_gpu = 1;
    }
  if (d->kernel) s = setup_kernel_links(c, d, mine, &all[c->next], &all[c->prev]);
  if (s == BRG_SUCCESS && d->kernel) s = setup_oneshot(c, d, mine, all);
  if (s == BRG_SUCCESS && d->kernel) {
    /* GPUDirect runs on a staged link when both of its ends registered. */
    d->kgdr_send = d->send_staged && mine->kgdr_send_ok && all[c->next].kgdr_recv_ok;
    d->kgdr_recv = d->recv_staged && all[c->prev].kgdr_send_ok && mine->kgdr_recv_ok;
    if (d->kgdr_send)
      c->devnet->send.ops->dev_remote(&c->devnet->send, all[c->next].kgdr_rptr,
                                      all[c->next].kgdr_rkey, d->kslot);
    if ((d->send_staged && !d->kgdr_send) || (d->recv_staged && !d->kgdr_recv))
      BRG__INFO("init", "device ring: kernel mode: GPUDirect RDMA not used on the staged links: %s",
                mine->kgdr_why[0]                 ? mine->kgdr_why
                : d->send_staged && !d->kgdr_send ? all[c->next].kgdr_why
                                                  : all[c->prev].kgdr_why);
  }
  if (s == BRG_SUCCESS && d->kernel && (d->send_staged || d->recv_staged)) s = proxy_start(c, d);
  if (s == BRG_SUCCESS && !d->kernel) s = setup_links(c, d, mine, &all[c->next], &all[c->prev]);
  if (s == BRG_SUCCESS && d->kernel) {
    d->async = 0; /* a launch returns at once by itself */
    /* The step mode's FIFO and events go unused: nobody mapped them yet. */
    if (d->fifo_in.ops)
      link_close(&d->fifo_in);
    else if (d->fifo)
      api->drv.mem_free(d->fifo);
    d->fifo = NULL;
    for (int k = 0; k < d->nslots; k++) {
      if (d->send_ev[k]) api->drv.event_destroy(d->send_ev[k]);
      if (d->rel_ev[k]) api->drv.event_destroy(d->rel_ev[k]);
      d->send_ev[k] = d->rel_ev[k] = NULL;
    }
    char desc[256];
    api->drv.describe(desc, sizeof desc);
    BRG__INFO("init",
              "device ring: kernel mode (%s): one kernel per collective, %d channels (thread "
              "blocks) with %d slots of %zu bytes each in GPU memory, waiting on the "
              "neighbours' flags; %s",
              d->kmode_req == 1 ? "BRIGADE_DEVICE_MODE=kernel"
                                : "automatic: the GPUs of neighbours in a host reach each other "
                                  "and no two processes share a GPU without MPS",
              d->kchannels, d->nslots, d->kslot, desc);
    if (d->send_staged || d->recv_staged)
      BRG__INFO("init",
                "device ring: kernel mode over staged links: %s%s%s%s%s, carried by the host "
                "proxy on %s links with slots of %zu bytes (the kernels wait on its flags; the "
                "call still returns at once)",
                d->send_staged ? "to the next rank " : "",
                !d->send_staged ? ""
                : d->kgdr_send  ? "GPU to GPU (GPUDirect RDMA)"
                                : "through pinned host memory",
                d->send_staged && d->recv_staged ? " and " : "",
                d->recv_staged ? "from the previous rank " : "",
                !d->recv_staged ? ""
                : d->kgdr_recv  ? "GPU to GPU (GPUDirect RDMA)"
                                : "through pinned host memory",
                (d->send_staged ? &c->devnet->send : &c->devnet->recv)->ops->name,
                c->devnet->send.fifo.slot_bytes);
    if (d->oneshot)
      BRG__INFO("init",
                "device ring: allreduces up to %zu bytes (BRIGADE_DEVICE_SMALL_BYTES) go in one "
                "hop: each rank writes its input to all %d ranks, which sum them in rank order",
                d->kos_limit, c->nranks);
    c->kwatch = kernel_watch;
    __atomic_store_n(&c->kabort, d->kwords, __ATOMIC_RELEASE);
    __atomic_store_n(&c->dev, d, __ATOMIC_RELEASE);
  } else if (s == BRG_SUCCESS) {
    /* GPUDirect runs on a link when both of its ends registered. */
    d->send_gdr = d->send_staged && mine->gdr_send_ok && all[c->next].gdr_recv_ok;
    d->recv_gdr = d->recv_staged && all[c->prev].gdr_send_ok && mine->gdr_recv_ok;
    if (d->send_gdr)
      c->send.ops->dev_remote(&c->send, all[c->next].fifo_ptr, all[c->next].gdr_rkey,
                              d->gdr_stride);
    if ((d->send_staged && !d->send_gdr) || (d->recv_staged && !d->recv_gdr))
      BRG__INFO("init", "GPUDirect RDMA not used on the staged links: %s",
                mine->gdr_why[0]                 ? mine->gdr_why
                : d->send_staged && !d->send_gdr ? all[c->next].gdr_why
                                                 : all[c->prev].gdr_why);
  }
  if (s == BRG_SUCCESS && d->async && !d->kernel) {
    char why[192];
    if (setup_async(d, why, sizeof why) != 0) {
      d->async = 0;
      BRG__INFO("init",
                "device collectives keep their host side on the calling thread (the call "
                "returns when the collective is done on ranks with a staged link): %s",
                why);
    }
  }
  if (s == BRG_SUCCESS && !d->kernel) {
    int share = 0;
    for (int r = 0; r < c->nranks; r++) share += !memcmp(all[r].uuid, mine->uuid, 16);
    char desc[256];
    api->drv.describe(desc, sizeof desc);
    BRG__INFO("init", "device ring: not kernel mode: rank %d: %s", kwho, kwhy ? kwhy : "?");
    BRG__INFO("init",
              "device ring: step mode (a copy or reduce kernel per slice and step, "
              "ordered by interprocess events; no kernel waits for another process), "
              "%d slots of %zu bytes (a slice) in GPU memory; %d of %d ranks on this GPU%s; "
              "%s%s%s%s",
              d->nslots, d->slice_bytes, share, c->nranks,
              share > 1
                  ? (mine->mps ? ", MPS running" : ", no MPS: their kernels take turns on the GPU")
                  : "",
              desc,
              d->send_gdr      ? "; to the next rank GPU to GPU (GPUDirect RDMA)"
              : d->send_staged ? "; to the next rank through pinned host memory (staged link)"
                               : "",
              d->recv_gdr      ? "; from the previous rank GPU to GPU (GPUDirect RDMA)"
              : d->recv_staged ? "; from the previous rank through pinned host memory (staged link)"
                               : "",
              d->async ? "; host side on the communicator's thread, the call returns at once "
                         "(the caller's stream waits on a flag)"
                       : "");
    if (d->send_staged || d->recv_staged)
      BRG__INFO("init", "device ring: a slice crosses a staged link (%s) in slots of %zu bytes",
                (d->send_staged ? d->send_t : d->recv_t)->name, c->slice_bytes);
    __atomic_store_n(&c->dev, d, __ATOMIC_RELEASE);
  } else if (s != BRG_SUCCESS) {
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
  int e = api->kern.copy(k->recvbuf, NULL, k->sendbuf, elems * esize, k->stream);
  return e ? cuda_fail(c, api, e, "copy kernel") : BRG_SUCCESS;
}

brg_status brg__device_fork(brg_comm *c, void *stream, int rings, void **streams) {
  struct brg__dev_ring *d = c->dev;
  const brg__cuda_api *api = d->api;
  int e = d->fork_ev ? 0 : api->drv.event_create(&d->fork_ev);
  for (int r = 1; !e && r < rings; r++) {
    if (!d->rstream[r]) e = api->drv.stream_create(&d->rstream[r]);
    if (!e && !d->join_ev[r]) e = api->drv.event_create(&d->join_ev[r]);
  }
  if (!e) e = api->drv.event_record(d->fork_ev, stream);
  for (int r = 1; !e && r < rings; r++) {
    e = api->drv.stream_wait_event(d->rstream[r], d->fork_ev);
    streams[r] = d->rstream[r];
  }
  return e ? cuda_fail(c, api, e, "forking the rings' streams from the caller's") : BRG_SUCCESS;
}

brg_status brg__device_join(brg_comm *c, void *stream, int rings) {
  struct brg__dev_ring *d = c->dev;
  const brg__cuda_api *api = d->api;
  int e = 0;
  for (int r = 1; !e && r < rings; r++) {
    e = api->drv.event_record(d->join_ev[r], d->rstream[r]);
    if (!e) e = api->drv.stream_wait_event(stream, d->join_ev[r]);
  }
  return e ? cuda_fail(c, api, e, "joining the rings' streams into the caller's") : BRG_SUCCESS;
}

brg_status brg__device_divide(brg_comm *c, void *buf, size_t count, brg_dtype dtype, int divisor,
                              void *stream) {
  const brg__cuda_api *api = brg__device_api(NULL);
  int e = count ? api->kern.divide(buf, buf, count, (int)dtype, divisor, stream) : 0;
  return e ? cuda_fail(c, api, e, "divide kernel (BRG_AVG)") : BRG_SUCCESS;
}

/* ---- step mode: the memory operations of ring.c's run_prim ---- */

/* A link between hosts takes a slice in pieces of the network transport's
 * slot; a link between two GPUs of this host takes the whole slice in one
 * slot, which the pieces' kernels fill or read at their offsets. */
static uint64_t dev_piece(const struct brg__ring_op *o, int send) {
  const struct brg__dev_ring *d = o->dev;
  return send ? d->send_piece : d->recv_piece;
}

/* Receives from the previous rank: where piece `bytes` is to be read
 * (*r), once its writer has run (the stream waits, or the host waited). */
static brg_status dev_recv(struct brg__ring_op *o, size_t shift, uint64_t bytes, const char **r) {
  brg_comm *c = o->c;
  struct brg__dev_ring *d = o->dev;
  const brg__cuda_api *api = d->api;
  const brg__coll *k = o->coll;
  int rk = (int)(c->recv_pos % (uint64_t)d->nslots), e;
  const char *hdr;
  brg_status s;
  if (d->recv_gdr) {
    /* the piece landed in the GPU slot itself (at shift 0) */
    if ((s = brg__ring_recv_acquire(o, &hdr, bytes)) != BRG_SUCCESS) return s;
    if ((e = api->drv.flush_rdma_writes()) != 0)
      return cuda_fail(c, api, e, "flushing GPUDirect RDMA writes");
    *r = d->fifo + (size_t)rk * d->gdr_stride;
    return BRG_SUCCESS;
  }
  if (d->recv_staged) {
    if ((s = brg__ring_recv_acquire(o, &hdr, bytes)) != BRG_SUCCESS) return s;
    *r = d->recv_region_dev + (hdr - d->recv_region);
    return BRG_SUCCESS;
  }
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
  e = api->drv.stream_wait_event(k->stream, d->prev_send_ev[rk]);
  if (e) return cuda_fail(c, api, e, "cudaStreamWaitEvent (previous rank's slot)");
  *r = d->fifo + (size_t)rk * d->stride + shift;
  return BRG_SUCCESS;
}

/* Sends to the next rank: where piece `bytes` is to be written (*slot),
 * once the slot is free. */
static brg_status dev_send(struct brg__ring_op *o, size_t shift, uint64_t bytes, char **slot) {
  brg_comm *c = o->c;
  struct brg__dev_ring *d = o->dev;
  const brg__cuda_api *api = d->api;
  int sk = (int)(c->send_pos % (uint64_t)d->nslots), e;
  char *hslot;
  brg_status s;
  if (d->send_gdr) {
    if ((s = brg__ring_send_acquire(o, bytes, &hslot)) != BRG_SUCCESS) return s;
    *slot = d->gdr_send + (size_t)sk * d->gdr_stride;
    return BRG_SUCCESS;
  }
  if (d->send_staged) {
    if ((s = brg__ring_send_acquire(o, bytes, &hslot)) != BRG_SUCCESS) return s;
    *slot = d->send_region_dev + (hslot - d->send_region);
    return BRG_SUCCESS;
  }
  if ((s = brg__ring_send_acquire(o, 0, &hslot)) != BRG_SUCCESS) return s;
  /* One lap on, the slot is free once the next rank's kernel that read it
   * has run. */
  if (c->send_pos >= (uint64_t)d->nslots &&
      (e = api->drv.stream_wait_event(o->coll->stream, d->next_rel_ev[sk])) != 0)
    return cuda_fail(c, api, e, "cudaStreamWaitEvent (next rank's slot)");
  *slot = d->next_fifo + (size_t)sk * d->stride + shift;
  memcpy(hslot, &bytes, sizeof bytes);
  return BRG_SUCCESS;
}

/* The kernel of a primitive on one piece: m elements of input `in` and
 * output `out`, reading received slot `r` and writing the next rank's slot
 * `slot`, on the collective's stream. */
static brg_status dev_apply(struct brg__ring_op *o, brg__prim prim, const char *in, char *out,
                            const char *r, char *slot, size_t m, const void **payload) {
  struct brg__dev_ring *d = o->dev;
  const brg__cuda_api *api = d->api;
  const brg__coll *k = o->coll;
  brg_op mid = k->op == BRG_AVG ? BRG_SUM : k->op;
  size_t bytes = m * o->esize;
  int n = o->c->nranks, e = 0;
  void *st = k->stream;
  (void)payload; /* kernels always write the slot */
  d->last_stream = st;
  if (m == 0) return BRG_SUCCESS;
  brg__prim_math w = brg__prim_math_of(prim);
  void *d0 = brg__prim_buf(w.dst0, in, r, out, slot), *d1 = brg__prim_buf(w.dst1, in, r, out, slot);
  const void *x = brg__prim_buf(w.a, in, r, out, slot), *y = brg__prim_buf(w.b, in, r, out, slot);
  if (w.reduce)
    e = api->kern.reduce(d0, d1, x, y, m, k->dtype, w.last ? k->op : mid, w.last ? n : 1, st);
  else
    e = api->kern.copy(d0, d1, x, bytes, st);
  return e ? cuda_fail(o->c, api, e, "reduce/copy kernel launch") : BRG_SUCCESS;
}

/* Hands a written slot to the next rank: an event says when the kernel
 * has written it; the network transport reads it from host memory, so for
 * a link between hosts the host waits for that first. */
static brg_status dev_sent(struct brg__ring_op *o, uint64_t bytes, const void *payload) {
  brg_comm *c = o->c;
  struct brg__dev_ring *d = o->dev;
  int sk = (int)(c->send_pos % (uint64_t)d->nslots), e;
  brg_status s;
  (void)payload;
  if ((e = d->api->drv.event_record(d->send_ev[sk], o->coll->stream)) != 0)
    return cuda_fail(c, d->api, e, "cudaEventRecord");
  if (d->send_staged &&
      (s = event_wait(c, d, d->send_ev[sk],
                      "cudaEventQuery (slot of the staged link to the next rank)")) != BRG_SUCCESS)
    return s;
  return brg__ring_send_post(o, d->send_staged ? bytes : 0, NULL);
}

/* Hands a read slot back to the previous rank, once the kernel that read it
 * has run (the previous rank's stream waits for the event; for a link
 * between hosts the host waits before freeing the slot). */
static brg_status dev_received(struct brg__ring_op *o) {
  brg_comm *c = o->c;
  struct brg__dev_ring *d = o->dev;
  int rk = (int)(c->recv_pos % (uint64_t)d->nslots), e;
  brg_status s;
  if ((e = d->api->drv.event_record(d->rel_ev[rk], o->coll->stream)) != 0)
    return cuda_fail(c, d->api, e, "cudaEventRecord");
  if (d->recv_staged &&
      (s = event_wait(c, d, d->rel_ev[rk],
                      "cudaEventQuery (slot of the staged link from the previous rank)")) !=
          BRG_SUCCESS)
    return s;
  brg__ring_recv_release(o);
  return BRG_SUCCESS;
}

const brg__mem_ops brg__mem_device = {
    .name = "GPU",
    .piece = dev_piece,
    .recv = dev_recv,
    .send = dev_send,
    .apply = dev_apply,
    .sent = dev_sent,
    .received = dev_received,
};

/* ---- kernel mode: a collective ---- */

int brg__device_kernel_mode(const struct brg__dev_ring *d) {
  return d && d->kernel;
}

/* Channel ch's watch record (ring_args.h), in the pinned page. */
static brg__rk_watch *watch_rec(const struct brg__dev_ring *d, int ch) {
  return (brg__rk_watch *)((char *)d->kwords + KWATCH) + ch;
}

/* A call from a watch record, "allreduce #3 (count 7, ...)". */
static void watch_call(char *out, size_t n, const brg__rk_call *src) {
  uint64_t v[3];
  brg__rk_call x;
  for (int i = 0; i < 3; i++) v[i] = __atomic_load_n((const uint64_t *)src + i, __ATOMIC_RELAXED);
  memcpy(&x, v, sizeof x);
  brg__coll_describe(out, n, (brg__coll_kind)x.kind, x.seq, x.count, x.dtype, x.op, x.root, 1);
}

/* What a channel that stopped on a fault found (ring_kernel.cuh's checks),
 * in why; its status, or BRG_SUCCESS when none did. */
static brg_status kernel_fault(const brg_comm *c, const struct brg__dev_ring *d, char *why,
                               size_t n) {
  for (int ch = 0; ch < d->kchannels; ch++) {
    brg__rk_watch *w = watch_rec(d, ch);
    int code = __atomic_load_n(&w->code, __ATOMIC_ACQUIRE);
    if (code == BRG__RK_OK || code == BRG__RK_ABORTED) continue;
    char mine[160], theirs[160];
    int step = __atomic_load_n(&w->step, __ATOMIC_RELAXED);
    int oneshot = __atomic_load_n(&w->wait, __ATOMIC_RELAXED) == BRG__RK_WAIT_ONESHOT;
    int from = oneshot ? __atomic_load_n(&w->peer, __ATOMIC_RELAXED) : c->prev;
    watch_call(mine, sizeof mine, &w->mine);
    if (code == BRG__RK_MISMATCH) {
      watch_call(theirs, sizeof theirs, &w->theirs);
      snprintf(why, n, "collective mismatch: rank %d called %s but rank %d called %s", c->rank,
               mine, from, theirs);
      return BRG_ERR_MISMATCH;
    }
    if (code == BRG__RK_BUSY) {
      snprintf(why, n,
               "rank %d: a kernel-mode launch of %s found another launch of this communicator "
               "running in channel %d (graph launches, or launches on streams, that nothing "
               "orders): it stopped instead of taking the other one's slots",
               c->rank, mine, ch);
      return BRG_ERR_INVALID_USAGE;
    }
    if (oneshot)
      snprintf(why, n,
               "rank %d: kernel-mode %s found a stale one-shot flag of rank %d: call %llu where "
               "call %llu was due (one-shot areas out of step)",
               c->rank, mine, from, (unsigned long long)w->found, (unsigned long long)w->expected);
    else
      snprintf(why, n,
               "rank %d: kernel-mode %s, channel %d, step %d: a stale slot from rank %d: it is "
               "marked as post %llu of the link where post %llu was due (FIFO positions out of "
               "step)",
               c->rank, mine, ch, step, from, (unsigned long long)w->found,
               (unsigned long long)w->expected);
    return BRG_ERR_INTERNAL;
  }
  return BRG_SUCCESS;
}

/* Why this rank's kernels were stopped, for the call after. */
static brg_status kernel_stopped(brg_comm *c, struct brg__dev_ring *d) {
  char why[BRG__ERRLEN];
  brg_status s = kernel_fault(c, d, why, sizeof why);
  if (s != BRG_SUCCESS) return brg__comm_error(c, s, "%s", why);
  s = BRG_ERR_REMOTE;
  snprintf(why, sizeof why, "the communicator was aborted");
  pthread_mutex_lock(&d->ev_lock);
  if (d->perr[0]) snprintf(why, sizeof why, "%s", d->perr);
  brg_status own = d->perr_code;
  pthread_mutex_unlock(&d->ev_lock);
  /* The watchdog's own verdict (the neighbours' notices that follow it are
   * its echo). */
  if (own != BRG_SUCCESS) return brg__comm_error(c, own, "%s", why);
  for (int dir = 0; dir < 2; dir++) {
    char buf[BRG__BOOT_MAX_MSG + 1], text[BRG__ERRLEN / 2];
    uint32_t type = 0, len = 0;
    brg_status ls;
    if (brg__live_take(c, dir, &ls, &type, buf, &len, text, sizeof text) != 1) continue;
    int peer = dir == BRG__RING_NEXT ? c->next : c->prev;
    if (ls != BRG_SUCCESS) {
      snprintf(why, sizeof why, "rank %d (pid %d on %.64s) is gone: %.150s", peer,
               c->peers[peer].pid, c->peers[peer].hostname, text);
      break;
    }
    if (type == BRG__MSG_ABORT && len > 4) {
      buf[len] = 0;
      snprintf(why, sizeof why, "%.*s", (int)(sizeof why - 1), buf + 4);
      break;
    }
  }
  int64_t silent_ms = 0;
  int quiet = brg__live_silent(c, &silent_ms);
  if (quiet >= 0 && silent_ms >= brg__live_silent_limit_ms(c)) {
    s = silent_ms >= c->timeout_ms ? BRG_ERR_TIMEOUT : BRG_ERR_REMOTE;
    snprintf(why, sizeof why, "rank %d (pid %d on %s) has been silent for %lld ms", quiet,
             c->peers[quiet].pid, c->peers[quiet].hostname, (long long)silent_ms);
  }
  if (__atomic_load_n(&c->aborted, __ATOMIC_ACQUIRE)) s = BRG_ERR_ABORTED;
  return brg__comm_error(c, s,
                         "rank %d: a device collective's kernel stopped waiting for its "
                         "neighbours: %s",
                         c->rank, why);
}

/* The watchdog of kernel mode, on the liveness thread (c->kwatch), every
 * beat: a channel that stopped on a fault, or a launch in flight whose
 * progress has stood still for the timeout (a peer that never launches,
 * calls that deadlock), stops this rank's kernels through the abort word;
 * the reason waits for the next call and brg_comm_get_async_error. 1 and
 * the reason in why when it stopped them now. */
static int kernel_watch(brg_comm *c, char *why, size_t n) {
  struct brg__dev_ring *d = __atomic_load_n(&c->dev, __ATOMIC_ACQUIRE);
  if (!d || !d->kernel || d->wd_fired) return 0;
  char text[BRG__ERRLEN];
  brg_status s = kernel_fault(c, d, text, sizeof text);
  int64_t now = brg__now_ns();
  for (int ch = 0; s == BRG_SUCCESS && ch < d->kchannels; ch++) {
    brg__rk_watch *w = watch_rec(d, ch);
    uint64_t started = __atomic_load_n(&w->started, __ATOMIC_RELAXED);
    uint64_t progress = __atomic_load_n(&w->progress, __ATOMIC_RELAXED);
    if (started == __atomic_load_n(&w->finished, __ATOMIC_RELAXED)) {
      d->wd_since[ch] = 0; /* nothing in flight */
      continue;
    }
    if (!d->wd_since[ch] || started != d->wd_started[ch] || progress != d->wd_progress[ch]) {
      d->wd_since[ch] = now;
      d->wd_started[ch] = started;
      d->wd_progress[ch] = progress;
      continue;
    }
    int64_t still_ms = (now - d->wd_since[ch]) / 1000000;
    if (still_ms < c->timeout_ms) continue;
    int wait = __atomic_load_n(&w->wait, __ATOMIC_RELAXED);
    int step = __atomic_load_n(&w->step, __ATOMIC_RELAXED);
    int peer = wait == BRG__RK_WAIT_RECV   ? c->prev
               : wait == BRG__RK_WAIT_SEND ? c->next
                                           : __atomic_load_n(&w->peer, __ATOMIC_RELAXED);
    if (peer < 0 || peer >= c->nranks) peer = c->prev;
    char call[160];
    watch_call(call, sizeof call, &w->mine);
    snprintf(text, sizeof text,
             "rank %d: kernel-mode %s made no progress for %lld ms (BRIGADE_TIMEOUT_MS %d): "
             "channel %d waits at step %d for rank %d (pid %d on %s) %s; the kernels were "
             "stopped",
             c->rank, call, (long long)still_ms, c->timeout_ms, ch, step, peer, c->peers[peer].pid,
             c->peers[peer].hostname,
             wait == BRG__RK_WAIT_RECV   ? "to post a slot"
             : wait == BRG__RK_WAIT_SEND ? "to free a slot"
                                         : "to raise its one-shot flag");
    s = BRG_ERR_TIMEOUT;
  }
  if (s == BRG_SUCCESS) return 0;
  pthread_mutex_lock(&d->ev_lock);
  if (!d->perr[0] || d->perr_code == BRG_SUCCESS) {
    snprintf(d->perr, sizeof d->perr, "%s", text);
    d->perr_code = s;
  }
  pthread_mutex_unlock(&d->ev_lock);
  d->wd_fired = 1;
  kernel_stop(d);
  snprintf(why, n, "%s", text);
  return 1;
}

brg_status brg__device_async_error(brg_comm *c) {
  struct brg__dev_ring *d = __atomic_load_n(&c->dev, __ATOMIC_ACQUIRE);
  if (!d || !d->kernel || !d->kwords) return BRG_SUCCESS;
  if (!__atomic_load_n(&d->kwords[0], __ATOMIC_ACQUIRE) &&
      __atomic_load_n(&d->kwords[KSTATUS_WORD], __ATOMIC_ACQUIRE) == BRG__RK_OK)
    return BRG_SUCCESS;
  return kernel_stopped(c, d);
}

brg_status brg__device_capture_check(brg_comm *c, const char *fn, brg__coll *k) {
  const brg__cuda_api *api = brg__device_api(NULL);
  int capturing = 0;
  if (api->drv.stream_capturing(k->stream, &capturing) != 0 || !capturing) {
    api->drv.last_error(); /* a query that failed leaves no error behind */
    return BRG_SUCCESS;
  }
  struct brg__dev_ring *d = __atomic_load_n(&c->dev, __ATOMIC_ACQUIRE);
  if (c->nranks > 1 && !d)
    return brg__comm_error(c, BRG_ERR_INVALID_USAGE,
                           "%s: stream %p is capturing a CUDA graph, but this communicator has "
                           "not set up its device collectives yet (GPU memory and IPC with its "
                           "neighbours, which cannot be made during a capture): call "
                           "brg_comm_device_setup(comm, %d) on every rank before capturing, or "
                           "run one device collective outside the capture first",
                           fn, k->stream, k->gpu);
  if (c->nranks > 1 && d && !d->kernel)
    return brg__comm_error(c, BRG_ERR_INVALID_USAGE,
                           "%s: stream %p is capturing a CUDA graph, but this communicator runs "
                           "its device collectives in step mode (%s), driven slice by slice from "
                           "the host, which a graph cannot hold: capture needs kernel mode",
                           fn, k->stream, d->step_why);
  k->captured = 1;
  return BRG_SUCCESS;
}

/* Kernel mode's ranks in this process, with the stream each launched on
 * last: a stream two ranks of one communicator share would queue one's
 * kernel behind the other's, which waits for it. Only ranks that have
 * another rank of their communicator in this process are listed (ranks as
 * threads), so the lock is not on other processes' hot path. */
#define STREAM_USERS 64
static pthread_mutex_t stream_users_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
  const struct brg__dev_ring *d;
  uint64_t comm_id;
  int rank;
  void *stream;
} stream_users[STREAM_USERS];

static void stream_user_drop(const struct brg__dev_ring *d) {
  pthread_mutex_lock(&stream_users_lock);
  for (int i = 0; i < STREAM_USERS; i++)
    if (stream_users[i].d == d) stream_users[i].d = NULL;
  pthread_mutex_unlock(&stream_users_lock);
}

/* -1, or the rank of c's communicator in this process that launched on
 * `stream` last; this rank is recorded as its last user. */
static int stream_taken(const brg_comm *c, const struct brg__dev_ring *d, void *stream) {
  int who = -1, mine = -1, free_at = -1;
  pthread_mutex_lock(&stream_users_lock);
  for (int i = 0; i < STREAM_USERS; i++) {
    if (!stream_users[i].d) {
      if (free_at < 0) free_at = i;
    } else if (stream_users[i].d == d) {
      mine = i;
    } else if (stream_users[i].comm_id == c->comm_id && stream_users[i].stream == stream) {
      who = stream_users[i].rank;
    }
  }
  if (mine < 0) mine = free_at;
  if (mine >= 0 && who < 0) {
    stream_users[mine].d = d;
    stream_users[mine].comm_id = c->comm_id;
    stream_users[mine].rank = c->rank;
    stream_users[mine].stream = stream;
  }
  pthread_mutex_unlock(&stream_users_lock);
  return who;
}

/* A stream that captured a launch, for the drain at destroy. */
static void graph_stream_note(struct brg__dev_ring *d, void *stream) {
  d->graphs = 1;
  for (int i = 0; i < d->ngstreams; i++)
    if (d->gstream[i] == stream) return;
  if (d->ngstreams < (int)(sizeof d->gstream / sizeof d->gstream[0]))
    d->gstream[d->ngstreams++] = stream;
}

brg_status brg__device_kernel_run(brg_comm *c, brg__coll *k) {
  struct brg__dev_ring *d = c->dev;
  const brg__cuda_api *api = d->api;
  if (__atomic_load_n(&d->kwords[0], __ATOMIC_ACQUIRE) ||
      __atomic_load_n(&d->kwords[KSTATUS_WORD], __ATOMIC_ACQUIRE) != BRG__RK_OK)
    return kernel_stopped(c, d);
  if (!k->stream && d->kshared_gpu) {
    char desc[160];
    brg__coll_describe(desc, sizeof desc, k->kind, k->seq, k->count, k->dtype, k->op, k->root, 1);
    return brg__comm_error(c, BRG_ERR_INVALID_USAGE,
                           "rank %d: %s on the legacy default stream (stream NULL), but another "
                           "rank of this communicator in this process has the same GPU, whose "
                           "legacy stream is theirs too: a kernel-mode collective waits for its "
                           "neighbours inside the kernel, so the second rank's kernel would queue "
                           "behind the first one's, which waits for it, for ever. Give each rank "
                           "a stream of its own (cudaStreamCreate), or set "
                           "BRIGADE_DEVICE_MODE=step",
                           c->rank, desc);
  }
  int other = k->stream && d->kthreads ? stream_taken(c, d, k->stream) : -1;
  if (other >= 0)
    return brg__comm_error(c, BRG_ERR_INVALID_USAGE,
                           "rank %d: %s on stream %p, which rank %d of this communicator, in "
                           "this process, launched on too: a kernel-mode collective waits for "
                           "its neighbours inside the kernel, so one rank's kernel would queue "
                           "behind the other's, which waits for it. Give each rank a stream of "
                           "its own, or set BRIGADE_DEVICE_MODE=step",
                           c->rank, brg__coll_name(k->kind), k->stream, other);
  /* Launches of this communicator run one after another, whatever streams
   * they come on: each starts from the FIFO positions the last one left.
   * (A captured launch cannot wait for work outside its capture; a graph's
   * launches are ordered by the streams the caller launches them on, and
   * the busy word catches two at once.) */
  if (!k->captured && d->kdone_set) {
    int e = api->drv.stream_wait_event(k->stream, d->kdone_ev);
    if (e) return cuda_fail(c, api, e, "cudaStreamWaitEvent (the previous kernel-mode launch)");
  }
  brg__rk_args a;
  memset(&a, 0, sizeof a);
  a.kind = (int)k->kind;
  a.dtype = (int)k->dtype;
  a.op = (int)k->op;
  a.nranks = c->nranks;
  a.pos = c->pos;
  a.root = k->root;
  a.ring = d->kring;
  a.sendbuf = k->sendbuf;
  a.recvbuf = k->recvbuf;
  a.count = k->count;
  a.whole = k->whole;
  a.stride = k->stride;
  a.nslots = d->nslots;
  a.nchannels = d->kchannels;
  a.slot_bytes = d->kslot;
  a.abort_word = d->kwords_dev;
  a.status = d->kwords_dev + KSTATUS_WORD;
  a.watch = (brg__rk_watch *)((char *)d->kwords_dev + KWATCH);
  a.call = (brg__rk_call){.seq = k->seq,
                          .count = k->count,
                          .root = k->root,
                          .kind = (uint8_t)k->kind,
                          .dtype = (uint8_t)k->dtype,
                          .op = (uint8_t)k->op};
  for (int ch = 0; ch < d->kchannels; ch++) {
    char *own = d->kregion + (size_t)ch * d->kstride;
    brg__rk_link *l = &a.chan[ch];
    if (d->send_staged) { /* the proxy's region plays the next rank's and this rank's part */
      char *p = d->psend_dev + (size_t)ch * d->pstride;
      l->send_slots = d->kgdr_send ? d->kgdr_sbuf : p + PCTRL;
      l->send_tail = (uint64_t *)p;
      l->send_head = (const uint64_t *)(p + 64);
      l->send_sizes = (uint64_t *)(p + 128);
    } else {
      char *next = d->knext + (size_t)ch * d->kstride;
      l->send_slots = next + d->kctrl;
      l->send_meta = (brg__rk_meta *)(next + KMETA);
      l->send_hdr = (brg__rk_hdr *)(next + KMETA + (size_t)d->nslots * sizeof(brg__rk_meta));
      l->hdr_acked = (const uint64_t *)(own + KACK);
      l->send_tail = (uint64_t *)next;
      l->send_head = (const uint64_t *)(own + 64);
    }
    if (d->recv_staged) {
      char *p = d->precv_dev + (size_t)ch * d->pstride;
      l->recv_slots = d->kgdr_recv ? d->kgdr_rbuf : p + PCTRL;
      l->recv_tail = (const uint64_t *)p;
      l->recv_head = (uint64_t *)(p + 64);
    } else {
      char *prev = d->kprev + (size_t)ch * d->kstride;
      l->recv_slots = own + d->kctrl;
      l->recv_meta = (const brg__rk_meta *)(own + KMETA);
      l->recv_hdr = (const brg__rk_hdr *)(own + KMETA + (size_t)d->nslots * sizeof(brg__rk_meta));
      l->hdr_ack = (uint64_t *)(prev + KACK);
      l->recv_tail = (const uint64_t *)own;
      l->recv_head = (uint64_t *)(prev + 64);
    }
    l->counters = (uint64_t *)(own + 128);
  }
  int one = d->oneshot && k->kind == BRG__COLL_ALLREDUCE && k->count > 0 &&
            k->count <= d->kos_limit / brg_dtype_size(k->dtype);
  if (one) {
    a.oneshot = 1;
    a.os.rank = c->rank;
    a.os.slot_bytes = d->kos_slot;
    memcpy(a.os.area, d->kos_area, sizeof a.os.area);
  }
  int e = api->kern.ring_launch(&a, sizeof a, one ? 1 : d->kchannels, 512, k->stream);
  /* An event recorded into a capture cannot be waited for outside it: the
   * drain at destroy waits for the launches made outside graphs, and the
   * caller for its graphs' launches. */
  if (!e && !k->captured) e = api->drv.event_record(d->kdone_ev, k->stream);
  if (!e && !k->captured) d->kdone_set = 1;
  if (!e && k->captured) graph_stream_note(d, k->stream);
  d->last_stream = k->stream;
  return e ? cuda_fail(c, api, e, "launching the kernel-mode collective") : BRG_SUCCESS;
}
