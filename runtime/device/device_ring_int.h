/*
 * The device ring's own state and the helpers its files share (device_ring.c
 * and the rooms it is split into). Only those files include this header;
 * the rest of the runtime sees device.h. The calls run one way, down the
 * runtime's floors (internal.h): the lifetime (device_setup.c) calls the
 * modes and the host engine (exec/host/ring.c, for the setup's own
 * collective); kernel mode calls step mode's helpers; every mode calls the
 * shared helpers (device_ring.c), never back.
 *
 *   exec/device_setup.c       the ring's lifetime: the setup around two
 *                             all-gathers, the drain and the free
 *   exec/kernel/device_kernel.c  kernel mode: its regions, the one-shot
 *                             path, a launch
 *   exec/kernel/device_watch.c   kernel mode: faults, the watchdog, the drain
 *   exec/kernel/device_proxy.c   kernel mode's host proxy on the links
 *                             between hosts
 *   exec/step/device_step.c   step mode: its FIFO and events, brg__mem_device
 *   exec/step/device_async.c  step mode's asynchronous mode: the ring's
 *                             stream, flag and tickets
 *   device/device_ring.c      what every mode uses: the cuda_ipc links,
 *                             pinned memory, GPUDirect offers, the fork
 *                             and join of rings
 */
#ifndef BRIGADE_DEVICE_RING_INT_H
#define BRIGADE_DEVICE_RING_INT_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

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

/* Kernel mode's words in pinned host memory that the host and the kernels
 * share outside the regions (allocated as KWORDS_BYTES): the abort word
 * the kernels stop on, the status a channel that stopped writes, the
 * blocks of captured launches (graph replays, on any stream) that began
 * and, BRG__RK_ENDED words on, that ended (brg__rk_args.launches), for the
 * drain at destroy, and a watch record per channel. A cache line each, so
 * that a channel's writes do not share a line with another's. */
struct brg__dev_kwords {
  _Alignas(64) int abort;
  _Alignas(64) int status;
  _Alignas(64) uint64_t launches[2 * BRG__RK_ENDED];
  _Alignas(64) brg__rk_watch watch[BRG__RK_MAX_CHANNELS];
};
#define KWORDS_BYTES ((sizeof(struct brg__dev_kwords) + FLAG_PAGE - 1) & ~(size_t)(FLAG_PAGE - 1))

/* One channel of a rank's kernel-mode region (GPU memory), before its
 * slots (at brg__dev_kernel.ctrl): the words, a cache line each, then what
 * the previous rank writes beside its slots. */
struct brg__dev_kchan {
  _Alignas(64) uint64_t tail;                     /* slots the previous rank posted (it writes) */
  _Alignas(64) uint64_t head;                     /* slots the next rank took (it writes) */
  _Alignas(64) uint64_t counters[8];              /* own: brg__rk_link.counters */
  _Alignas(64) uint64_t hdr_acked;                /* headers the next rank checked (it writes) */
  _Alignas(64) brg__rk_meta meta[BRG__MAX_SLOTS]; /* the previous rank's, one per slot */
  brg__rk_hdr hdr[BRG__RK_HDRS];                  /* the previous rank's mailbox of calls */
};

/* One channel of a link between hosts in kernel mode: the same words and
 * slots as a region's channel, in pinned host memory of this rank, where
 * the host proxy plays the neighbour; the slots follow at PLINK_CTRL. */
struct brg__dev_plink {
  _Alignas(64) uint64_t tail; /* posted: by the kernel (to next), the proxy (from prev) */
  _Alignas(64) uint64_t head; /* taken: by the proxy (to next), the kernel (from prev) */
  _Alignas(64) uint64_t sizes[BRG__MAX_SLOTS]; /* bytes of each posted slot (to next) */
  _Alignas(64) uint64_t hdr_ack;               /* headers taken from the mailbox */
  _Alignas(64) brg__rk_hdr hdr[BRG__RK_HDRS];  /* the call headers: the kernel's on the
                                                * link to next, the previous rank's on
                                                * the link from it */
};
#define PLINK_CTRL ((sizeof(struct brg__dev_plink) + 4095) & ~(size_t)4095)

/* Step mode (device_step.c): its FIFO and events. */
struct brg__dev_step {
  brg__conn fifo_in, fifo_out;        /* cuda_ipc: own receive FIFO, the next rank's */
  char *fifo;                         /* own receive FIFO, as kernels reach it */
  char *next_fifo;                    /* the next rank's */
  void *send_ev[BRG__MAX_SLOTS];      /* recorded after writing next's slot k */
  void *rel_ev[BRG__MAX_SLOTS];       /* recorded after consuming own slot k */
  void *prev_send_ev[BRG__MAX_SLOTS]; /* the previous rank's send_ev */
  void *next_rel_ev[BRG__MAX_SLOTS];  /* the next rank's rel_ev */
  int prev_opened, next_opened;       /* those came from ipc_event_open */
  /* GPU memory straight on the network (GPUDirect RDMA) on links to
   * other hosts: */
  int send_gdr, recv_gdr; /* the link runs that way */
  int send_reg, recv_reg; /* registered with the link */
  char *gdr_send;         /* device slots the sender's kernels write */
  /* ...else the transport's host FIFO regions, mapped: */
  char *send_region, *recv_region; /* host addresses (NULL: not registered) */
  char *send_region_dev, *recv_region_dev;
  /* Bytes per slot on each link: the slice on CUDA IPC links, the network
   * transport's slot on links between hosts (a slice crosses those in
   * several pieces). GPU slots on a GPUDirect link are gdr_stride apart. */
  size_t send_piece, recv_piece, gdr_stride;
};

/* Kernel mode's one-shot allreduce (ring_args.h): each rank's area
 * follows the channels in its region, and every rank reaches every
 * other's. */
struct brg__dev_oneshot {
  size_t limit;                      /* BRIGADE_DEVICE_SMALL_BYTES (0: none) */
  size_t slot, bytes;                /* room per input; bytes of an area */
  size_t ll_limit, ll_slot;          /* LL form: up to brg__model_ll_limit; room per input */
  int on;                            /* small allreduces take it */
  char *area[BRG__RK_MAX_PEERS];     /* rank r's area, as reached here */
  brg__conn conn[BRG__RK_MAX_PEERS]; /* regions this path mapped itself */
  /* The direct paths on many blocks (ring_args.h), in an area after the
   * one-shot area: the one-shot form above ll_limit up to limit, the
   * two-shot form above it up to dlimit (BRIGADE_DEVICE_DIRECT_BYTES). */
  size_t dlimit;        /* the largest allreduce the direct paths take (at least limit) */
  size_t dslot, dbytes; /* room per rank's input; bytes of an area (0: no direct paths) */
};

/* Kernel mode (kernels/cuda/ring_kernel.cuh): a collective is one launch
 * whose channels wait on the neighbours' flags. Each rank's region holds,
 * per channel, a brg__dev_kchan and its receive slots; both neighbours
 * write into it. */
struct brg__dev_kernel {
  int mode_req;       /* BRIGADE_DEVICE_MODE: 0 auto, 1 kernel, 2 step */
  int on;             /* collectives run in kernel mode */
  int channels;       /* thread blocks per launch (the most a call runs) */
  size_t slot;        /* bytes per slot (the most a call uses) */
  int shape_per_call; /* a call takes the model's shape for its size within those */
  size_t ctrl;        /* bytes per channel before its slots (a brg__dev_kchan) */
  size_t stride;      /* bytes per channel in a region */
  /* The ring's LL form (ring_kernel.cuh, prim_ll): calls of up to
   * ring_ll_limit bytes (BRIGADE_DEVICE_RING_LL_BYTES; 0: none) send their
   * slots as LL lines, in LL slots of ring_ll bytes that follow each
   * channel's plain slots (0: none made). */
  size_t ring_ll_limit, ring_ll;
  char *region; /* own (GPU memory: in, a cuda_ipc receive end) */
  char *next, *prev;
  /* co-residency: the GPU's SMs (0: no bound known), the kernel's blocks a SM */
  int sms, per_sm;
  brg__conn in, next_c, prev_c;              /* own region; the neighbours', mapped (cuda_ipc) */
  int *ring;                                 /* position -> rank, GPU memory */
  struct brg__dev_kwords *words, *words_dev; /* pinned: as the host and the kernels reach it */
  void *done_ev; /* recorded after each launch outside a graph capture */
  int done_set;  /* done_ev was recorded: the next launch waits for it */
  /* Another rank of this communicator in this process has this GPU: its
   * legacy stream (NULL) is theirs too, where kernels would queue behind
   * each other's spinning ones. */
  int shared_gpu;
  int threads; /* another rank of this communicator is in this process */
  /* Streams that captured kernel-mode launches into graphs, with an event
   * each that the drain at destroy records there: replays have no done
   * event of their own. After a capture, the words' page outlives the
   * communicator (a replay after destroy finds abort set and ends). */
  void *gstream[8], *gdone_ev[8];
  int ngstreams, graphs;
  int settle; /* the drain left the replays' abort to brg__dev_kernel_settle */
  struct brg__dev_oneshot os;
  brg_status stop_code; /* with stop_why: the status the next call returns (0: BRG_ERR_REMOTE) */
  char stop_why[BRG__ERRLEN]; /* what stopped the proxy or the watchdog ("": nothing) */
};

/* The watchdog (brg__device_watch, on the liveness thread): per channel
 * the progress last seen and since when it stands still. */
struct brg__dev_watchdog {
  uint64_t progress[BRG__RK_MAX_CHANNELS], started[BRG__RK_MAX_CHANNELS];
  int64_t since[BRG__RK_MAX_CHANNELS];
  int fired; /* the watchdog stopped the kernels */
};

/* GPUDirect RDMA on kernel mode's links between hosts (one channel
 * there): the channel's slots are GPU memory registered with the proxy's
 * link, which carries the channel's slot n from sbuf + (n % nslots) slot
 * here to the next rank's rbuf at the same offset (its number says which:
 * transport.h's brg__proxy_slot), with the call headers in network slots
 * of their own between; the words stay in the proxy's host regions. A
 * slot is free again once the link says the network slot that carried it
 * went (tx), and the link's slots up to it once the kernel took it (rx). */
struct brg__dev_kgdr {
  int send, recv;    /* the links run that way */
  char *sbuf, *rbuf; /* nslots * slot of GPU memory each */
};

/* Kernel mode's links between hosts: per channel a brg__dev_plink and
 * its slots in pinned host memory of this rank, and the host proxy's two
 * threads in place of the neighbour: tx carries the slots this rank's
 * kernels post to the network link to the next rank, rx writes what
 * arrives from the previous rank into the slots its kernels read. Slots
 * of all channels share the link; a slot's header names its channel. */
struct brg__dev_proxy {
  brg__ring *net;            /* c->netring, whose links they use */
  size_t stride;             /* bytes per channel */
  char *send, *recv;         /* host addresses (NULL: the link stays in the host) */
  char *send_dev, *recv_dev; /* the same, as the kernels reach them */
  struct brg__dev_kgdr gdr;
  int gpu;          /* this rank's device index (the proxy's flushes) */
  pthread_t tx, rx; /* running when tx_on, rx_on */
  int tx_on, rx_on;
  int stop;                            /* atomic: the threads return */
  uint64_t sent[BRG__RK_MAX_CHANNELS]; /* atomic: slots tx has carried, per channel */
};

struct brg__dev_ring {
  const brg__cuda_api *api;
  int nslots;
  size_t slice_bytes; /* the pipeline unit: one slice per GPU slot */
  size_t stride;      /* slice_bytes + room to shift a payload */
  /* The device links' transports (brg__device_link): cuda_ipc, where the
   * next rank's kernels write this rank's memory, or the host link's, which
   * stages GPU payloads through its FIFO in pinned host memory. */
  const brg__transport_ops *send_t, *recv_t;
  /* Links to other hosts: the transport's host FIFO regions. */
  int send_staged, recv_staged;
  brg__conn *link_send, *link_recv; /* the communicator's links */
  void *last_stream;                /* the stream of the latest device collective */
  int stuck;                        /* own work could not drain: nothing may be freed */
  struct brg__dev_step st;
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
  /* Allreduces staged through host memory in the asynchronous mode
   * (device_exec.c, brg__exec_staged_async): pinned host memory of
   * stage_bytes, mapped for the copy kernels (stage_dev), grown on demand
   * and kept until the ring is freed, and the event the host waits on for
   * the copy to it. Memory outgrown stays in stage_old until then too:
   * unregistering it waits for the whole GPU, where a caller's stream may
   * wait on the flag of the very call that grows it. Each growth at least
   * doubles from a page, so fewer than 52 are ever outgrown. Only the
   * thread that runs the call touches them (calls on a communicator run
   * one at a time, progress.c). */
  char *stage_host, *stage_dev;
  size_t stage_bytes;
  void *stage_ev;
  struct {
    char *host;
    size_t bytes;
  } stage_old[52];
  int nstage_old;
  struct brg__dev_kernel k;
  struct brg__dev_watchdog wd;
  struct brg__dev_proxy px;
  char step_why[256]; /* why collectives run in step mode, for a captured call */
  /* Several rings (progress.c): part r of a device collective runs on
   * ring r's communicator on rstream[r], which waits for fork_ev on the
   * caller's stream; the caller's stream waits for join_ev[r] after it. */
  void *fork_ev;
  void *rstream[BRG__DEVICE_MAX_RINGS], *join_ev[BRG__DEVICE_MAX_RINGS];
};

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
  uint64_t kll_slot; /* room for a rank's LL lines (0: no LL form) */
  /* The sizes that pick a call's path, as given (kos_slot and kll_slot
   * round them up, so ranks whose slots agree may still differ here). */
  uint64_t kos_limit, kll_limit;
  uint64_t kslot;
  char kwhy[256];                     /* why kernel mode cannot run here */
  int32_t kgdr_send_ok, kgdr_recv_ok; /* kernel mode's slots registered with the proxy's links */
  uint32_t kgdr_rkey;                 /* of kgdr_rptr, on the link from prev */
  /* kernel mode: its GPU's SMs (0: no bound known), the kernel's blocks a
   * SM, 1 where it was refused as not even one channel a rank fits */
  int32_t ksms, kper_sm, kunfit;
  uint64_t kgdr_rptr;
  char kgdr_why[128];                               /* why not, for the log */
  unsigned char kregion_info[BRG__CONN_INFO_BYTES]; /* cuda_ipc: the kernel-mode region */
  unsigned char fifo_info[BRG__CONN_INFO_BYTES];    /* cuda_ipc: step mode's FIFO */
  uint64_t send_ev_ptr[BRG__MAX_SLOTS], rel_ev_ptr[BRG__MAX_SLOTS];
  unsigned char send_ev[BRG__MAX_SLOTS][HB];
  unsigned char rel_ev[BRG__MAX_SLOTS][HB];
  int32_t streams;     /* this rank's streams on its GPU (the caller's, the proxy's, the rings') */
  int32_t connections; /* its process's hardware queues per GPU (CUDA_DEVICE_MAX_CONNECTIONS) */
  uint64_t kdirect_limit;  /* the two-shot path's limit (BRIGADE_DEVICE_DIRECT_BYTES) */
  uint64_t kring_ll_limit; /* the ring's LL form's limit (BRIGADE_DEVICE_RING_LL_BYTES) */
} dev_blob;

/* What one rank offers for GPUDirect RDMA on its staged links. */
typedef struct brg__dev_gdr_offer {
  int32_t *send_ok, *recv_ok; /* set where registered */
  uint32_t *rkey;             /* of the receive slots */
  char *why;                  /* why not, for the log */
  size_t why_bytes;
} brg__dev_gdr_offer;

/* ---- shared helpers ---- */

/* A CUDA error as the communicator's error (device_ring.c). */
brg_status brg__dev_cuda_fail(brg_comm *c, const brg__cuda_api *api, int e, const char *what);
/* Zeroed host memory, pinned and mapped for kernels (*host, *dev); 0, a
 * CUDA error, or -1 with errno. */
int brg__dev_pinned_alloc(const brg__cuda_api *api, size_t bytes, char **host, char **dev);
void brg__dev_pinned_free(const brg__cuda_api *api, char *host, size_t bytes);

/* Bytes of a link's host region (every channel's words and slots). */
static inline size_t brg__dev_pregion_bytes(const struct brg__dev_ring *d) {
  return (size_t)d->k.channels * d->px.stride;
}

/* Kernel mode: every channel of this rank's kernels stops at its next
 * wait, writing ABORTED to the status word. */
static inline void brg__dev_kernel_stop(struct brg__dev_ring *d) {
  if (d->k.words) __atomic_store_n(&d->k.words->abort, 1, __ATOMIC_RELEASE);
}

/* cuda_ipc links (device_ring.c): the receiving end, this rank's memory
 * described in `info`; the sending end, rank `peer`'s memory mapped here. */
brg_status brg__dev_link_export(brg_comm *c, struct brg__dev_ring *d, brg__conn *l, int peer,
                                const dev_blob *self, const dev_blob *other, size_t bytes,
                                size_t slot, int fallback, void *info, brg__errbuf *err);
brg_status brg__dev_link_map(brg_comm *c, struct brg__dev_ring *d, brg__conn *l, int peer,
                             const dev_blob *self, const dev_blob *other, size_t bytes, size_t slot,
                             const void *info);
void brg__dev_link_close(brg__conn *l);
/* Whether kernels of `peer`'s GPU reach this rank's GPU memory. */
int brg__dev_reaches(const struct brg__dev_ring *d, const dev_blob *self, const dev_blob *peer);
/* GPUDirect RDMA: GPU slots offered on staged links (device_ring.c). */
void brg__dev_gdr_offer_slots(struct brg__dev_ring *d, brg__conn *send, brg__conn *recv,
                              size_t bytes, char **rbuf, char **sbuf, const brg__dev_gdr_offer *o);
/* Whether every event this rank recorded has run, polled until the
 * deadline (ms, -1 never). */
int brg__dev_own_work_drained(struct brg__dev_ring *d, int64_t deadline);
/* Whether ranks r and q are of different processes on one GPU
 * (device_ring.c). */
int brg__dev_shares_gpu(const brg_comm *c, const dev_blob *all, int r, int q);

/* ---- step mode (device_step.c) ---- */
void brg__dev_step_local(brg_comm *c, struct brg__dev_ring *d, dev_blob *b, const dev_blob *prev);
brg_status brg__dev_step_finish(brg_comm *c, struct brg__dev_ring *d, const dev_blob *mine,
                                const dev_blob *all, int kwho, const char *kwhy);
/* Frees step mode's FIFO and events where kernel mode runs instead. */
void brg__dev_step_unused(struct brg__dev_ring *d);
/* Waits for event ev with the communicator's checks (abort, a neighbour
 * gone, the deadline) between polls; what names the wait in an error. */
brg_status brg__dev_event_wait(brg_comm *c, struct brg__dev_ring *d, void *ev, const char *what);

/* ---- kernel mode (device_kernel.c, device_watch.c) ---- */
void brg__dev_kernel_sizes(brg_comm *c, struct brg__dev_ring *d, int staged);
void brg__dev_kernel_local(brg_comm *c, struct brg__dev_ring *d, dev_blob *b, const dev_blob *all,
                           int staged);
const char *brg__dev_kernel_refused(const brg_comm *c, const dev_blob *all, int *who);
brg_status brg__dev_kernel_finish(brg_comm *c, struct brg__dev_ring *d, const dev_blob *mine,
                                  const dev_blob *all);
void brg__dev_stream_user_drop(const struct brg__dev_ring *d);
brg_status brg__dev_kernel_stopped(brg_comm *c, struct brg__dev_ring *d);
int brg__dev_kernel_watch(brg_comm *c, char *why, size_t n);
brg_status brg__dev_kernel_drain(brg_comm *c, struct brg__dev_ring *d);
uint64_t brg__dev_kernel_bye_word(const struct brg__dev_ring *d);
brg_status brg__dev_kernel_settle(brg_comm *c, struct brg__dev_ring *d, uint64_t theirs);

/* ---- asynchronous mode (device_async.c) ---- */
void brg__dev_flag_raise(struct brg__dev_ring *d, uint32_t ticket);
int brg__dev_async_setup(struct brg__dev_ring *d, char *why, size_t cap);

/* ---- kernel mode's host proxy (device_proxy.c) ---- */
void brg__dev_proxy_gdr(brg_comm *c, struct brg__dev_ring *d, dev_blob *b);
void brg__dev_proxy_gdr_choose(brg_comm *c, struct brg__dev_ring *d, const dev_blob *mine,
                               const dev_blob *all);
brg_status brg__dev_proxy_start(brg_comm *c, struct brg__dev_ring *d);
int brg__dev_proxy_flushed(struct brg__dev_ring *d);
/* A channel's call headers on the staged links (kernel_chans). */
void brg__dev_proxy_hdrs(const struct brg__dev_ring *d, int ch, brg__rk_link *l);
void brg__dev_proxy_join(struct brg__dev_ring *d);

#endif
