/*
 * How bytes move between two ranks.
 *
 * Every transport presents the same thing to the ring engine: a FIFO of
 * `nslots` slots of `slot_bytes` each, with a tail counter (slices published
 * by the sender) and a head counter (slices consumed by the receiver).
 *
 *   sender:   wait head + nslots > tail; write slot[tail % nslots]; tail++
 *   receiver: wait tail > head;          read  slot[head % nslots]; head++
 *
 * Memory transports (shm) give both ends a view of one FIFO that lives in the
 * receiver's memory. ibverbs gives the sender a local send FIFO and the
 * receiver a local receive FIFO, and proxy threads move slots across the wire
 * between them. tcp has no send proxy: a transport with `send_now` sends each
 * slot from the engine's own thread as it is posted, and the payload may come
 * from anywhere (the input, the output, a received slot), not only the slot;
 * one with `recv_window` lets the engine offer its output for a slot, and the
 * receive proxy lands the payload there instead of in the FIFO. The engine
 * asks for both (brg__ring_send_direct, brg__ring_recv_windows in
 * runtime/link/ring_link.h) and keeps the FIFO's order and credits either way.
 *
 * Device collectives take the same links (brg__transport_ops.carries): a
 * transport whose links have `gpu_memory` (cuda_ipc) gives the sender's
 * kernels a mapping of the receiver's GPU memory; the others stage GPU
 * payloads through their host FIFO, pinned and mapped for kernels.
 *
 * Each slot carries a small header (brg__slot_meta) that names the
 * collective it belongs to, so ranks that issue different collectives find
 * out at the first slice instead of hanging or computing garbage.
 */
#ifndef BRG_TRANSPORT_H
#define BRG_TRANSPORT_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include "brigade.h"
#include "config.h"
#include "log.h"

#define BRG__CACHELINE 64
#define BRG__MAX_SLOTS 64
#define BRG__CONN_INFO_BYTES 256
#define BRG__SECRET_BYTES 16

/* What a slot says about the collective it belongs to. The header is one
 * cache line that ends with `flag`, written last (release) with the slot's
 * position + 1: a receiver on a memory transport polls this one line and
 * finds header, flag and, for slices of up to BRG__INLINE_BYTES, the data
 * itself, so a small step costs a single cache-line transfer. */
#define BRG__INLINE_BYTES 16
typedef struct brg__slot_meta {
  uint64_t seq;   /* collective number on this communicator, from 1 */
  uint64_t count; /* the collective's count argument */
  uint32_t kind;  /* brg__coll_kind */
  uint32_t bytes; /* payload bytes in this slot */
  uint16_t dtype;
  uint16_t op;
  int32_t root;
  uint32_t step;    /* schedule step, for error messages */
  uint8_t device;   /* 1: a device collective; the payload (`bytes` of it) is in GPU memory */
  uint8_t proxy;    /* BRG__PROXY_*: what a slot of kernel mode's host proxy is; 0 elsewhere */
  uint16_t channel; /* a proxy slot's kernel-mode channel; 0 elsewhere */
  /* The payload when bytes <= BRG__INLINE_BYTES; 8-byte aligned for every dtype. */
  _Alignas(8) char inline_data[BRG__INLINE_BYTES];
  volatile uint64_t flag; /* slot position + 1 once the slot is complete */
} brg__slot_meta;

/* A slot of kernel mode's host proxy (brg__transport_ops.proxy_post):
 * which channel it is for, its number among that channel's slots of its
 * kind, and its payload. A BRG__PROXY_DATA slot is one a channel's kernel
 * posted (a slice, `bytes` of it); a BRG__PROXY_CALL slot is the call a
 * channel's kernel announced at a launch's start, its payload the call
 * (kernels/cuda/ring_args.h's brg__rk_call; the transport carries it as
 * bytes). The number counts each kind on its own: a channel's data slots
 * are 1, 2, 3, ... and so are its calls. */
#define BRG__PROXY_DATA 1
#define BRG__PROXY_CALL 2
typedef struct brg__proxy_slot {
  uint32_t what;    /* BRG__PROXY_DATA or BRG__PROXY_CALL */
  uint32_t channel; /* below 65536 */
  uint64_t seq;     /* from 1 */
  uint32_t bytes;   /* of payload, at most the link's slot_bytes */
  /* 1: the payload is in GPU memory registered on the link (dev_register,
   * dev_remote): it travels from this end's GPU slot (seq - 1) % nslots
   * to the other end's, whatever slots go between a channel's data slots
   * on the link (its calls); `data` is NULL then, on both ends. */
  int device;
  /* proxy_post: where the payload is (host memory), read before it
   * returns 1. proxy_poll: where it is on this end, until proxy_release
   * frees the slot. */
  const void *data;
} brg__proxy_slot;

/* Control words shared by the two ends of a FIFO, one cache line each. The
 * counters are monotonic; futex waits use their low 32 bits. `*_waiters` is
 * raised by a side that is about to sleep, so the other side knows to wake
 * it after publishing. */
typedef struct brg__fifo_ctrl {
  _Alignas(BRG__CACHELINE) volatile uint64_t tail;
  volatile uint32_t tail_waiters;
  _Alignas(BRG__CACHELINE) volatile uint64_t head;
  volatile uint32_t head_waiters;
  _Alignas(BRG__CACHELINE) volatile uint32_t closed; /* nonzero brg_status: this link is broken */
  uint32_t closing;     /* claimed by the one closer that writes closed_why */
  char closed_why[192]; /* what broke it, written before `closed` (release) */
} brg__fifo_ctrl;

typedef struct brg__fifo {
  brg__fifo_ctrl *ctrl;
  brg__slot_meta *meta; /* nslots entries */
  char *data;           /* nslots * slot_bytes */
  int nslots;
  size_t slot_bytes;
} brg__fifo;

/* What try_send and try_recv return besides a count (see below). */
#define BRG__STREAM_ENDED ((ssize_t)-1)
#define BRG__STREAM_BROKEN ((ssize_t)-2)

/* Bytes a FIFO occupies laid out contiguously: ctrl, meta array, data (the
 * data starts page-aligned). */
size_t brg__fifo_region_bytes(int nslots, size_t slot_bytes);
/* Points `f` into a region of brg__fifo_region_bytes(); with `init`, zeroes
 * the control words and touches every page of the region. */
void brg__fifo_attach(brg__fifo *f, void *region, int nslots, size_t slot_bytes, int init);
/* Anonymous private region for a network transport's local FIFO, touched. */
brg_status brg__fifo_alloc(brg__fifo *f, int nslots, size_t slot_bytes, brg__errbuf *err);
void brg__fifo_free(brg__fifo *f);

static inline char *brg__fifo_slot(const brg__fifo *f, uint64_t pos) {
  return f->data + (size_t)(pos % (uint64_t)f->nslots) * f->slot_bytes;
}
static inline brg__slot_meta *brg__fifo_meta(const brg__fifo *f, uint64_t pos) {
  return &f->meta[pos % (uint64_t)f->nslots];
}

/* A network transport's receive side calls this once slot `pos` has fully
 * landed in its local FIFO (payload and header, the header's flag still
 * 0): the flag, stored last with release order, is what hands the slot to
 * the engine. */
static inline void brg__fifo_slot_complete(const brg__fifo *f, uint64_t pos) {
  __atomic_store_n(&brg__fifo_meta(f, pos)->flag, pos + 1, __ATOMIC_RELEASE);
}

/*
 * Waiting. A waiter spins `spin` polls, then yields, then sleeps on a futex
 * in slices of at most 1 ms (spin < 0: it sleeps at once, neither spinning
 * nor yielding); between sleeps it calls `check` (when set),
 * which returns non-success to stop the wait with that status (peer gone,
 * communicator aborted, deadline passed).
 */
typedef struct brg__waiter {
  int spin;
  brg_status (*check)(void *arg);
  void *arg;
} brg__waiter;

/* Waits until *word >= target. Returns BRG_SUCCESS or what check returned. */
brg_status brg__wait_ge(volatile uint64_t *word, volatile uint32_t *waiters, uint64_t target,
                        const brg__waiter *w);
/* Waits until *flag == expect, polling that word while spinning and
 * sleeping on the futex of *word (published right after the flag). */
brg_status brg__wait_flag(volatile uint64_t *flag, uint64_t expect, volatile uint64_t *word,
                          volatile uint32_t *waiters, const brg__waiter *w);
/* Stores value into *word (release) and wakes sleepers on it. */
void brg__publish(volatile uint64_t *word, volatile uint32_t *waiters, uint64_t value);
/* Marks the link broken with status s unless it already is; 1 when this call
 * did it. Whoever waits on the FIFO sees it through its check, and the text
 * (printf format) in ctrl->closed_why, which the engine puts into the
 * communicator's last error. */
int brg__fifo_mark_closed(brg__fifo *f, brg_status s, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Wakes every sleeper of a FIFO (used on close/abort so nobody sleeps on). */
void brg__fifo_wake_all(brg__fifo *f);
/* A FIFO link as a byte stream (the try_send/try_recv of shm and ibverbs):
 * each slot holds up to slot_bytes of the stream, its meta.bytes saying how
 * many. fill copies what fits into the free slots from *tail on and moves
 * *tail past them; take copies out of the landed slots from *head on (the
 * first one from *off on) and moves *head past those it emptied. Neither
 * publishes: the transport does, its own way. Both return the bytes moved. */
size_t brg__fifo_stream_fill(brg__fifo *f, const void *buf, size_t bytes, uint64_t *tail);
size_t brg__fifo_stream_take(brg__fifo *f, void *buf, size_t bytes, size_t *off, uint64_t *head);

/* Starts a network transport's proxy thread (or a verbs backend's progress
 * thread) with every signal blocked (signals belong to the application's
 * threads) and names it. */
brg_status brg__proxy_start(pthread_t *thread, void *(*fn)(void *), void *arg, const char *name,
                            brg__errbuf *err);

/* What each rank tells every other rank at bootstrap. */
typedef struct brg__peer_info {
  int32_t rank;
  int32_t pid;
  uint32_t p2p_port;  /* its point-to-point listener (runtime/exec/p2p/p2p.c) */
  uint32_t rings;     /* BRIGADE_RINGS, which every rank must share (runtime/comm/init.c) */
  uint64_t host_hash; /* equal for ranks on one host */
  char hostname[64];
  char addr[64];  /* numeric address other hosts reach this rank at */
  uint32_t flags; /* BRG__PEER_* */
  uint32_t algo;  /* BRIGADE_ALGO, which every rank must share (runtime/coll/hier.c) */
  uint64_t model; /* the cost model's links' fingerprint, which every rank must share
                     (runtime/plan/model.c) */
  uint32_t cores; /* its host's online cores, for the cost model's shape */
} brg__peer_info;
#define BRG__PEER_TRACING 1u /* the rank writes a trace: clocks are measured at init */

/* A GPU as ranks describe it to each other when device collectives set up. */
typedef struct brg__gpu_desc {
  uint64_t process; /* random per process: equal for ranks of one process */
  int32_t pid;
  int32_t gpu;            /* the device index in that process */
  unsigned char uuid[16]; /* of the GPU */
} brg__gpu_desc;

struct brg__cuda_api;

/* What a link with `gpu_memory` needs besides brg__conn_params. */
typedef struct brg__gpu_link_params {
  const struct brg__cuda_api *api; /* the CUDA module */
  brg__gpu_desc self, peer;        /* this end's GPU, the other end's */
  size_t bytes;                    /* of the receiver's memory */
  /* 1: where the sender's GPU cannot reach the receiver's (no peer
   * access), the memory is pinned host memory that both GPUs reach. 0:
   * recv_setup fails there. */
  int host_fallback;
} brg__gpu_link_params;

/* Everything a transport needs to set up one direction of a link. */
typedef struct brg__conn_params {
  int rank, peer, nranks; /* this rank, the other end, communicator size */
  const brg__peer_info *self_info, *peer_info;
  int nslots;
  size_t slot_bytes;
  uint64_t comm_id;      /* unique per communicator (for names) */
  const uint8_t *secret; /* BRG__SECRET_BYTES, for authenticating data connections */
  int timeout_ms;
  const brg__waiter *waiter;       /* for blocking steps during setup and in proxies */
  const brg__gpu_link_params *gpu; /* links with `gpu_memory`; NULL elsewhere */
  /* 1: the link is to be a byte stream (try_send, try_recv), not slots
   * for the ring engine: tcp then makes one socket and no receive proxy. */
  int stream;
} brg__conn_params;

typedef struct brg__transport_ops brg__transport_ops;

/* One direction of a link, as seen from one end. */
typedef struct brg__conn {
  const brg__transport_ops *ops;
  brg__fifo fifo; /* the view the ring engine uses */
  int peer;
  void *priv; /* the transport's own state */
  /* Receiving end of a transport with recv_window: nslots entries, where
   * the payload of each complete slot landed: landed[pos % nslots] is the
   * buffer offered for slot pos when it went there, NULL when it is in the
   * slot. Read after the slot's flag. NULL elsewhere. */
  void *const *landed;
} brg__conn;

/*
 * A transport. Setup of the link sender -> receiver runs:
 *   receiver: recv_setup(info)       -> info travels to the sender over bootstrap
 *   sender:   send_connect(info)     -> the runtime then tells the receiver "attached"
 *   receiver: recv_connect()
 * close() is called on every conn whose setup started, on both ends, also
 * after a failed setup or an abort; it must not block on the peer.
 * A transport that sets `listens` accepts its sender on a listener opened by
 * recv_setup; its recv_connect may then run on a thread of its own from the
 * moment recv_setup returns, while send_connect runs, so that strangers
 * queued on the listener never wait on this rank's own connect.
 */
/* What a transport's links carry (brg__transport_ops.carries). */
#define BRG__CARRIES_HOST 1u   /* host collectives: payloads in host memory */
#define BRG__CARRIES_DEVICE 2u /* device collectives: payloads in GPU memory */

struct brg__transport_ops {
  const char *name;
  unsigned carries; /* BRG__CARRIES_* */
  /* 1: the link is memory that the sender's kernels write and the
   * receiver's read, GPU memory or pinned host memory (cuda_ipc). Its
   * conn's fifo.data is where, as this end's kernels reach it, and
   * fifo.ctrl and fifo.meta are NULL: headers travel on the host link and
   * kernel mode keeps its flags in that memory. A device link of a
   * transport without it stages GPU payloads through the host FIFO. */
  int gpu_memory;
  int listens;
  /* The transport's settings (BRIGADE_<NAME>_*), a section of the one
   * settings table; NULL when it has none. */
  brg__cfg_section *config;
  /* 1 when the transport can carry data between these two ranks. */
  int (*can_connect)(const brg__peer_info *self, const brg__peer_info *peer);
  /* Whether it can work on this machine at all; on 0, `why` says why. */
  int (*available)(char *why, size_t why_bytes);
  brg_status (*recv_setup)(brg__conn *c, const brg__conn_params *p, void *info, brg__errbuf *err);
  brg_status (*send_connect)(brg__conn *c, const brg__conn_params *p, const void *info,
                             brg__errbuf *err);
  brg_status (*recv_connect)(brg__conn *c, const brg__conn_params *p, brg__errbuf *err);
  void (*close)(brg__conn *c);

  /* 1: a rank waiting on this link sleeps at once instead of spinning or
   * yielding: the kernel moves the link's bytes, and on a machine with few
   * cores a spinning thread takes the core it needs. */
  int sleeps;
  /* The slice size a ring with this link on it runs at when
   * BRIGADE_SLICE_BYTES is not set (0: that setting's default). A link
   * that costs a system call per slice wants fewer, larger slices. */
  size_t slice_bytes;
  /* Optional (NULL: a proxy thread sends). The sending engine sends slot
   * `pos` itself, at once, on its own thread: the header from the local
   * FIFO, the payload (meta.bytes of it) from `payload`, or from the slot
   * when that is NULL. It returns once the kernel holds every byte, with
   * the slot free again (head = pos + 1), so the payload may come straight
   * from the caller's buffers. While the wire is full it sleeps, calling
   * w's check about every millisecond and returning what that returns. On
   * a broken link it marks the FIFO closed (ctrl->closed_why says why) and
   * returns that status. */
  brg_status (*send_now)(brg__conn *c, uint64_t pos, const void *payload, const brg__waiter *w);
  /* Optional (NULL: payloads always land in the FIFO). The receiving engine
   * offers `dst` as where the payload of slot `pos` may land instead of the
   * slot, when it is `bytes` long, for a pos below head + nslots;
   * c->landed says whether it did. dst NULL withdraws every offer: once it
   * returns, nothing more is written to an offered buffer (a payload on
   * its way into one is cut off by breaking the link). */
  void (*recv_window)(brg__conn *c, uint64_t pos, void *dst, size_t bytes);

  /* Optional, all three or none: the link as a byte stream that never
   * blocks, for one thread that serves many links at once
   * (runtime/exec/p2p/p2p.c). The link is set up with brg__conn_params.stream.
   * Each end's engine calls only its own side's.
   * try_send copies up to `bytes` from buf into the slots that are free
   * and publishes them; it returns how many it took, 0 when the link is
   * full. try_recv copies up to `bytes` of what has arrived into buf,
   * freeing each slot it empties, and returns how many, 0 when nothing
   * waits. Slot boundaries are the transport's own: a receiver may get a
   * send's bytes in other pieces than they were sent in. Either returns
   * BRG__STREAM_BROKEN when the link broke (errno says why), and try_recv
   * BRG__STREAM_ENDED once the sender ended the stream (end, close, or its
   * process's exit) and everything before that was read; a link with no
   * wire of its own (shm) returns neither: its end is told elsewhere.
   * ready is the readiness hook: 1 when this end's try_* would return
   * something other than 0 now (`sending`: try_send would take bytes;
   * else try_recv would give some, or say the stream ended or broke).
   * With `arm`, a link found not ready notes that this end is about to
   * sleep, and the other end's next try_* that changes that sets its
   * *ring: the caller of that try_* then wakes this end (runtime/exec/p2p/p2p.c
   * writes a byte on a socket the sleeper polls), once per arming. *ring
   * is only ever set, never cleared. */
  ssize_t (*try_send)(brg__conn *c, const void *buf, size_t bytes, int *ring);
  ssize_t (*try_recv)(brg__conn *c, void *buf, size_t bytes, int *ring);
  int (*ready)(brg__conn *c, int sending, int arm);
  /* Optional, with the byte stream, for a link whose readiness shows on
   * a descriptor of its own (tcp's socket, ibverbs' eventfd): ready_fd
   * gives it and the poll events that mean ready (*events: POLLOUT on a
   * tcp send end, POLLIN elsewhere), polled instead of arming; such a
   * link never sets *ring. The descriptor is level: it says ready while
   * this end's try_* has something to do, or may have. end, on the send
   * end, ends the stream: the receiver's try_recv says BRG__STREAM_ENDED
   * once it has read what came before (shm's end is the runtime's to
   * tell). */
  int (*ready_fd)(brg__conn *c, short *events);
  void (*end)(brg__conn *c);

  /* Optional (NULL where the transport cannot): GPU memory on the link
   * (GPUDirect RDMA), for device collectives between hosts.
   * dev_register registers `bytes` of device memory at p (a dmabuf: `fd`,
   * p at `offset` into it) with the link, giving its rkey: on the receiving
   * end it is where payloads of device slots land, on the sending end where
   * they are read from; p = NULL unregisters. dev_remote, on the sending end
   * once both ends registered, says where the receiver's slots are: from
   * then on a slot whose header has `device` set travels from local slot
   * k to remote slot k, `stride` bytes apart: k = n % nslots for the slot
   * at position n, (seq - 1) % nslots for a proxy slot (brg__proxy_slot). */
  brg_status (*dev_register)(brg__conn *c, void *p, size_t bytes, int fd, uint64_t offset,
                             uint32_t *rkey, brg__errbuf *err);
  void (*dev_remote)(brg__conn *c, uint64_t base, uint32_t rkey, size_t stride);

  /* Optional, all four or none: the proxy entry, through which kernel
   * mode's host proxy (runtime/exec/kernel/device_proxy.c) carries the slots of several
   * channels' kernels over one link between hosts, as NCCL's proxyProgress
   * does. Each end is driven by one thread of its own, which never blocks
   * long in them: a link that cannot take or give a slot now says so.
   * Positions count the link's slots from 0, whatever their channel.
   * proxy_post (send end) puts s on the link as its next slot: 1 once the
   * link has it (s->data may be reused), 0 while the link is full (try
   * again), -1 when the link is broken (ctrl->closed_why says why) or w's
   * check stopped it. proxy_sent (send end): the slots below it have left
   * this end (a device slot's GPU memory may be written again).
   * proxy_poll (receive end) fills *s with the slot at position n (n below
   * what was released + nslots): 1 when it has arrived, 0 while it has
   * not, -1 when it never will (the link is broken, or what came is no
   * proxy slot: ctrl->closed_why says which). proxy_release (receive end):
   * the slots below n are free again for the sender. */
  int (*proxy_post)(brg__conn *c, const brg__proxy_slot *s, const brg__waiter *w);
  uint64_t (*proxy_sent)(brg__conn *c);
  int (*proxy_poll)(brg__conn *c, uint64_t n, brg__proxy_slot *s);
  void (*proxy_release)(brg__conn *c, uint64_t n);
};

/* The proxy entry of a link that is a FIFO (fifo.c), which shm and
 * ibverbs give as theirs: proxy_post writes the slot into the FIFO and
 * publishes it, for the receiver (shm) or the link's send proxy (ibverbs);
 * brg__fifo_proxy_fill is its first half, for a transport that then sends
 * the slot itself (tcp): 1 with the slot's header in the FIFO (and the
 * payload, with `copy`, else only when it fits the header), 0 while the
 * FIFO is full, -1 when it is closed. */
int brg__fifo_proxy_fill(brg__conn *c, const brg__proxy_slot *s, int copy, uint64_t *pos);
int brg__fifo_proxy_post(brg__conn *c, const brg__proxy_slot *s, const brg__waiter *w);
uint64_t brg__fifo_proxy_sent(brg__conn *c);
int brg__fifo_proxy_poll(brg__conn *c, uint64_t n, brg__proxy_slot *s);
void brg__fifo_proxy_release(brg__conn *c, uint64_t n);

/* The transports in order of preference (transport.c), NULL-terminated. */
extern const brg__transport_ops *const brg__transports[];

/* Whether `allow` (comma list of names, NULL or "" for any) names it. */
int brg__transport_allowed(const char *allow, const char *name);
/* First transport allowed by `allow` (comma list of names, NULL or "" for
 * any) that carries `carries` (BRG__CARRIES_*) and whose can_connect
 * accepts the pair (self sends, peer receives), or NULL. */
const brg__transport_ops *brg__transport_pick(const brg__peer_info *self,
                                              const brg__peer_info *peer, const char *allow,
                                              unsigned carries);

extern const brg__transport_ops brg__transport_shm;
/* The shm FIFO that rank `receiver` made for the link from `sender`
 * loses its name: for a sender that gives up on the link before it
 * attached (the receiver may have died between making it and telling
 * its name, and nobody else would unlink it). */
void brg__shm_forget(uint64_t comm_id, int receiver, int sender);
extern const brg__transport_ops brg__transport_ibverbs;
extern const brg__transport_ops brg__transport_tcp;
extern const brg__transport_ops brg__transport_cuda_ipc;

/* cuda_ipc (cuda_ipc.c): whether kernels of `peer`'s GPU reach GPU memory
 * of `self`'s, asked in self's process without making a context on any
 * GPU: the same GPU, or peer access between the two (a GPU of another
 * process is found by its UUID, even where this process does not see it).
 * brg__cuda_ipc_reach also says how it decided, in why. */
int brg__cuda_ipc_reaches(const struct brg__cuda_api *api, const brg__gpu_desc *self,
                          const brg__gpu_desc *peer);
int brg__cuda_ipc_reach(const struct brg__cuda_api *api, const brg__gpu_desc *self,
                        const brg__gpu_desc *peer, char *why, size_t n);
/* Whether a cuda_ipc conn's memory is pinned host memory (host_fallback). */
int brg__cuda_ipc_on_host(const brg__conn *c);

#endif
