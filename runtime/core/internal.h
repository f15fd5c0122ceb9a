/* The communicator and the collective descriptors the runtime passes around. */
#ifndef BRG_INTERNAL_H
#define BRG_INTERNAL_H

#include <pthread.h>
#include <stdint.h>

#include "bootstrap.h"
#include "brigade.h"
#include "clock.h"
#include "log.h"
#include "schedule.h" /* brg__coll_kind */
#include "transport.h"

const char *brg__coll_name(brg__coll_kind kind);

/* One collective call, as the ring engine sees it. */
typedef struct brg__coll {
  brg__coll_kind kind;
  brg_dtype dtype;
  brg_op op;
  int root;   /* rank, or -1 */
  int device; /* 1: a device collective, buffers in GPU memory */
  int gpu;    /* the device of its buffers */
  /* A device collective whose host side runs on the communicator's thread
   * (device_async.c, brg__device_async_begin): `stream` is then the ring's
   * own, which waits for start_ev, recorded on the caller's stream; the
   * caller's stream waits for the ring's flag to reach `ticket`. */
  uint32_t ticket;
  unsigned char async : 1;
  /* Reduce-scatter and all-gather over one full-size buffer of `count`
   * elements cut into N balanced chunks as allreduce cuts it (chunk r,
   * rank r's, at brg__part_offset): the phases of hier.c within a host. */
  unsigned char whole : 1;
  unsigned char captured : 1;   /* issued on a stream capturing a CUDA graph (kernel mode) */
  unsigned char setup_only : 1; /* brg_comm_device_setup: the device setup, no collective */
  unsigned char staged : 1;     /* gather/scatter on GPU buffers, through host memory (rooted.c) */
  unsigned char doubling : 1;   /* lat.c's rhd by recursive doubling alone (policy.c) */
  unsigned char lat;            /* BRG__ALGO_TREE or _RHD: an allreduce lat.c runs; 0: none */
  /* Its executor (exec.h), chosen once as it is issued (policy.c:
   * hier.c's choice, then rings.c's, else the leaf of its memory); NULL
   * until then. progress.c runs it through this. (The flags are bits so
   * that a brg__req still fits a brg_request.) */
  const struct brg__exec_ops *exec;
  const void *sendbuf;
  void *recvbuf;
  size_t count; /* the call's count argument */
  void *stream; /* its CUDA stream (NULL: the legacy default stream) */
  uint64_t seq; /* set when it runs */
  void *start_ev;
  /* Reduce-scatter and all-gather (not whole): elements from rank r's
   * block of the full-size buffer to rank r+1's; 0: count. A part of the
   * call on one of several rings has a count below the stride. */
  size_t stride;
} brg__coll;

/* A point-to-point operation on a request (p2p.c): a receive waiting in
 * its peer's queue of receives, or a send in its peer's send queue.
 * Guarded by the p2p lock. */
typedef struct brg__p2p_op {
  struct brg__p2p_op *next; /* the peer's queue of posted receives, or of sends */
  char *buf;                /* a send's data (never written) */
  uint64_t count;
  uint64_t got;    /* payload bytes landed (a send: left) */
  int64_t last_ns; /* when it was posted or bytes last moved */
  uint64_t num;    /* the message's number between the pair (a2a: the collective's) */
  int32_t peer;
  uint32_t dtype;
  uint8_t chan;    /* BRG__P2P_USER or BRG__P2P_A2A */
  uint8_t is_send; /* a send: finished once its bytes have all left */
  /* A receive posted with BRG_ANY_SOURCE: `peer` is -1 until a message
   * is matched to it, then the sender's rank. */
  uint8_t any;
  /* What the sender said, for BRG_ERR_MISMATCH (with peer_count and
   * peer_num below; narrow, so that a brg__req fits a brg_request). */
  uint8_t peer_dtype;
  uint32_t tag; /* a user message's tag (brg_send_tagged; 0 otherwise) */
  volatile int done;
  brg_status status;
  uint64_t peer_count, peer_num;
  /* A posted receive's place among the communicator's posted receives
   * (compared modulo 2^32: far fewer are ever outstanding at once). */
  uint32_t order;
  /* A request's: its communicator's serial, so that brg_wait and brg_test
   * on it never read a destroyed communicator (brg__comm_live). */
  uint32_t comm_serial;
} brg__p2p_op;

/* The layout behind brg_request. */
typedef struct brg__req {
  union {
    brg__coll coll;
    brg__p2p_op p2p_op; /* magic BRG__REQ_P2P_MAGIC */
  };
  struct brg__req *next;
  brg_comm *comm;
  uint32_t magic;
  volatile int done;
  brg_status status;
  int detached; /* nobody waits for it: the worker frees it (device collectives) */
} brg__req;
_Static_assert(sizeof(brg__req) <= sizeof(brg_request), "brg_request too small");

#define BRG__REQ_MAGIC 0x62726772u
#define BRG__REQ_P2P_MAGIC 0x62726770u /* brg_isend / brg_irecv: p2p_op, finished by p2p.c */

/* A request issued and not yet finished: it must not be issued again. */
static inline int brg__req_in_flight(brg__req *r) {
  if (r->magic == BRG__REQ_P2P_MAGIC) return !__atomic_load_n(&r->p2p_op.done, __ATOMIC_ACQUIRE);
  return r->magic == BRG__REQ_MAGIC && !__atomic_load_n(&r->done, __ATOMIC_ACQUIRE);
}

/* Ring-socket message types. */
enum {
  BRG__MSG_CONN_INFO = 1,
  BRG__MSG_ATTACHED = 2,
  BRG__MSG_ABORT = 3,
  BRG__MSG_BYE = 4,
  BRG__MSG_CLOCK = 5, /* trace clock offsets at init (trace.c) */
  BRG__MSG_BEAT = 6,  /* liveness.c */
};

#define BRG__TRANSPORTS_MAX 128

/* A ring as one rank walks it: its place on it, its links to the two
 * neighbours, and where the ring engine (exec/host/ring.c, through
 * link/ring_link.c) stands on them. A communicator embeds its own ring
 * (brg_comm.ring); the communicator it names (`comm`) keeps the ring's
 * error state, settings, peer table, trace and ring sockets. */
typedef struct brg__ring {
  struct brg_comm *comm; /* whose errors, settings, peers and ring sockets it uses */
  int pos;               /* this rank's place on the ring */
  int *order;            /* position -> rank */
  int next, prev;        /* ranks of the ring neighbours */

  brg__conn send, recv;        /* to next, from prev */
  int send_open, recv_open;    /* setup started: close() owed */
  uint64_t send_pos, recv_pos; /* slots posted to next / consumed from prev */
  uint64_t send_head;          /* next's head as last read */
  brg__waiter waiter;
  brg__waiter waiter_sleep; /* waiter's check, no spinning: for links whose ops->sleeps */

  /* What the engine is waiting for, for error messages and the deadline. */
  const brg__coll *cur;
  int cur_step;
  const char *wait_what;
  int wait_peer;
  brg__conn *wait_conn;   /* the link the engine is blocked on */
  int departed[2];        /* neighbour (by ring direction) destroyed its communicator */
  int64_t departed_ns[2]; /* when this rank read that goodbye (brg__now_ns) */
  /* What that goodbye carried: the graph replays' blocks its kernels had
   * begun (brg__exec_bye_word; 0 without a word) */
  uint64_t departed_word[2];
  int departed_ok; /* the wait does not need the neighbours (kernel mode's drain) */
  int64_t wait_start_ns;
  int64_t closed_ns; /* when a wait first found its link closed (ring_link.c); 0: never */
} brg__ring;

struct brg_comm {
  uint32_t magic;
  int rank, nranks;
  brg__ring ring;        /* its own ring: place, links, the engine's state on them */
  brg__peer_info *peers; /* by rank */
  brg__bootstrap *bs;
  uint64_t comm_id;
  uint32_t serial; /* in the table of live communicators (errors.c) */

  int nslots;         /* FIFO slots per link (BRIGADE_STEPS) */
  size_t slice_bytes; /* the pipeline unit (BRIGADE_SLICE_BYTES): one slice per slot */
  int timeout_ms;     /* brg_comm_config's, or BRIGADE_TIMEOUT_MS */
  int silent_fail_ms; /* BRIGADE_SILENT_TIMEOUT_MS, 0: off */
  char transports[BRG__TRANSPORTS_MAX]; /* allowed transports, "" = all (brg_comm_config's,
                                           or BRIGADE_TRANSPORTS) */
  int transports_from_config;

  char *scratch;     /* nranks * small_bytes, for small allreduces */
  char *lat_scratch; /* lat.c's, grown to the largest call */
  size_t lat_scratch_bytes;
  size_t small_bytes;
  size_t nt_bytes; /* collectives this large write outputs with non-temporal stores */
  uint64_t seq;    /* collectives run so far */
  uint64_t bytes_sent;

  struct brg__trace *trace; /* BRIGADE_TRACE_FILE's recorder (trace.c), NULL when off */
  struct brg__p2p *p2p;     /* p2p.c: the listener, its thread, links to any rank */
  /* The listener the liveness thread watches until p2p.c's thread runs,
   * and that thread's start when someone dials it: set by p2p.c at its
   * start (liveness.c sits on a lower floor and calls them through these). */
  int (*p2p_door)(brg_comm *c);
  brg_status (*p2p_need)(brg_comm *c, brg__errbuf *err);

  struct brg__dev_ring *dev; /* device collectives' state (device_ring.c), made at first use */
  /* The leaf executor of its device collectives once `dev` is made (step or
   * kernel mode: device_exec.c publishes it), which policy.c picks
   * at issue; NULL before. */
  const struct brg__exec_ops *dev_exec;
  int *kabort; /* kernel mode's abort word (host memory the kernels poll); NULL: none */
  /* Kernel mode's watchdog (device_watch.c), which the liveness thread runs
   * every beat once kabort is set: 1 and why when it stopped the kernels. */
  int (*kwatch)(brg_comm *c, char *why, size_t n);
  int cuda_seen; /* the CUDA driver is loaded: host calls check for GPU pointers */
  int gpu;       /* the device of its device collectives; -1 before the first */

  /* hier.c: the allreduce algorithm (BRIGADE_ALGO) and the pieces of the
   * hierarchical one (comm.c's brg__comm_piece_make), made at its first
   * use. */
  int algo;               /* brg__algo */
  int hier_state;         /* 0: not made yet, 1: made, -1: cannot be made (flat ring) */
  unsigned hier_logged;   /* which choices INFO has told already */
  uint64_t auto_last;     /* auto's last choice: bytes << 8 | (algo + 1); 0: none */
  uint64_t auto_dev_last; /* the same for GPU buffers (policy.c, device_choice) */
  uint64_t
      rhd_doubling; /* rhd's recursive doubling up to this many bytes, plus 1; 0: unknown yet */
  struct brg_comm *local; /* this host's ranks */
  struct brg_comm *cross; /* the ranks of this local index on every host */
  struct brg_comm *fold;  /* on a host of more ranks than the fewest: those it reduces into one */
  /* Rings 1..nrings-1 (init.c, comm.c's brg__comm_piece_make): links of
   * this communicator's, each with the thread that runs its part of a
   * collective; ring 0 is this one's. nrings 0 or 1: one ring. */
  brg_comm **rings;
  int nrings;
  /* A piece of another communicator (comm.c's brg__comm_piece_make: an
   * extra ring, the hierarchy's local, cross and fold): the one it is a
   * piece of, whose table, settings, secret and liveness serve it, and
   * members[k], rank k's rank there; it has no bootstrap, ring sockets,
   * listener or trace of its own. NULL for a communicator. */
  struct brg_comm *piece_of;
  int *members;
  uint32_t pieces_made; /* brg__comm_piece_make's calls on this one, for their ids */
  /* Kernel mode's links between hosts (device_proxy.c's host proxy): a
   * second pair of links on this communicator's ring, to next and from
   * prev, made before the device setup where the ring leaves a host
   * (brg__comm_netring); its `comm` is this communicator, whose errors,
   * settings and liveness serve it (it has no threads of its own). */
  struct brg__ring *netring;
  int netring_state; /* 0: not made yet, 1: made or not needed, -1: making it failed */
  int ring_rotate;   /* this ring's turn inside each host (an extra ring's number) */

  struct brg__live *live; /* liveness.c: heartbeats, the ring sockets' reader once ready */
  /* linkset.h: the pieces this communicator's threads serve (its rings
   * and hierarchy), or, for such a piece, the
   * communicator whose set it belongs to. */
  struct brg__linkset *links;
  struct brg_comm *link_owner;
  int ready;            /* setup finished: ring sockets carry only aborts, beats, goodbyes */
  volatile int aborted; /* brg_comm_abort was called (from any thread): atomic access */
  brg_status broken;    /* sticky: first error of a collective */
  pthread_mutex_t err_lock;
  pthread_mutex_t ring_lock; /* writes to ring sockets */
  char last_error[BRG__ERRLEN];

  /* Progress: collectives run in issue order, on the worker thread or
   * inline on the caller's thread when nothing else is queued. */
  pthread_t worker;
  int worker_started;
  pthread_mutex_t qlock;
  pthread_cond_t qcond;    /* worker: work queued or busy cleared */
  pthread_cond_t donecond; /* callers: a request finished */
  brg__req *qhead, *qtail;
  int busy;
  int stop;
  int ndetached; /* queued device collectives of the asynchronous mode */
};

#define BRG__COMM_MAGIC 0x62726763u
/*
 * Who does what in runtime/, one folder per floor, from the top floor down.
 * Each file calls only files listed after it: those of its own folder that
 * follow it, and every file of the floors below (tests/tools/check_docs.py
 * holds the code to this list). A lower floor runs code of a higher one
 * only through a pointer the higher one hands down: brg__coll.exec (set
 * by coll/policy.c, called by exec/progress.c), kwatch (set by kernel mode, called
 * by core/liveness.c), p2p_door and p2p_need (set by exec/p2p/p2p.c, called
 * by core/liveness.c), the body brg__trace_run times.
 *
 * coll/     the collectives
 *   coll.c        entry points and argument checks
 *   policy.c      the policy: each call's executor (exec/exec.h), chosen
 *                 once at issue, and each allreduce's algorithm
 *                 (BRIGADE_ALGO, plan/model.c for auto); the composite
 *                 executors hier, rings and lat are their files'
 *   hier.c        the hierarchical allreduce (hier.h: what policy.c asks
 *                 of it); its pieces come from comm/comm.c
 *                 (brg__comm_piece_make, on the caller's thread before the
 *                 first hier allreduce is issued); brg__hier_run runs its
 *                 phases
 *   rings.c       a collective cut over the rings of comm/init.c
 *   lat.c         tree and rhd allreduces over exec/p2p/p2p.c's links
 * comm/     communicators: made, split, destroyed
 *   rendezvous.c  brg_comm_init_env: the launcher's variables
 *   launch.c      PMIx's store and Slurm's step, where no MASTER_ADDR is set
 *   init.c        brg_comm_init, brg_comm_init_config, the extra rings
 *   split.c       brg_comm_split: two all-gathers over the parent
 *                 (exec/progress.c)
 *   comm.c        create (bootstrap, topology, links), accessors, destroy;
 *                 links set up over all-gathers: kernel mode's net ring,
 *                 the extra rings
 * exec/     what runs a collective, a subfolder per executor
 *   progress.c    issue order: the worker thread; runs each call through
 *                 its executor, whichever it is; the all-gather that splits
 *                 and sub-communicators exchange over their parent
 *   stop.c        brg__comm_stop: what brg_comm_abort does below the API
 *   device_exec.c the device executors (step, kernel, one rank, staged)
 *                 and the device ring's drain, stop, free and abort
 *   device_setup.c  the device ring's lifetime: its setup (a collective of
 *                 host/ring.c), the drain and the free
 *   host/ring.c   the host executor: the seven primitives and the ring and
 *                 chain walks (brg__ring_engine, which step mode's executor
 *                 runs too); an all_to_all, gather or scatter goes to p2p/
 *   kernel/device_kernel.c  kernel mode: its regions, one-shot, a launch
 *   kernel/device_watch.c   kernel mode's faults, watchdog and drain
 *   kernel/device_proxy.c   kernel mode's host proxy between hosts
 *   step/device_step.c      step mode: the primitives on GPU buffers
 *   step/device_async.c     step mode's asynchronous mode
 *   p2p/alltoall.c  all_to_all over p2p.c's links
 *   p2p/rooted.c  gather and scatter over them
 *   p2p/p2p.c     send and recv over links to any rank
 * plan/     sizes and choices every rank makes alike
 *   slice.c       the slice: the host ring's, step mode's, a staged link's
 *   model.c       the cost model: auto's algorithm, kernel mode's shape
 * device/   the device ring's state
 *   device_ring.c its links and memory, shared by every mode
 *   device.c      the CUDA module, opened at first use
 * link/     the ring's links
 *   ring_link.c   slots to and from the neighbours on a brg__ring, the
 *                 waiter's checks
 * core/     this header: the communicator and its ring (brg__ring)
 *   trace.c       BRIGADE_TRACE_FILE: spans of collectives, steps, slices, waits
 *   liveness.c    heartbeats on the ring sockets: which rank went silent
 *   linkset.c     the pieces (rings, hierarchy) a
 *                 communicator's threads serve (liveness.c serves them)
 *   topology.c    hosts and ring order
 *   errors.c      last errors, abort notices, how collectives are named
 * boot/     before a communicator exists
 *   bootstrap_root.c  the root
 *   bootstrap.c   the rank side: the hello, the table, the ring sockets
 *   bootstrap_tree.c  the peer table's all-gather over a binary tree
 *   bootstrap_wire.c  the unique id and the messages: layouts, parsing
 *   settings.c    the runtime's settings and the one table of all sections
 *   secret.c      BRIGADE_SECRET's rules; SHA-256 and HMAC-SHA-256 for the
 *                 bootstrap's challenge and response
 */

/* comm.c: a piece of o that the runtime runs collectives on (init.c's
 * extra rings, hier.c's local, cross and fold), as brg_comm_split would
 * group o's ranks (the ranks of this one's color in (key, rank) order,
 * none for BRG_SPLIT_NOCOLOR: *out NULL), its ring inside each host
 * turned by `rotate` places; a collective over o that every rank calls
 * alike. It is no communicator: o's table (renumbered), settings, secret
 * and liveness, links of its own set up over o's all-gathers, a thread
 * for its collectives; no bootstrap, ring sockets, listener or trace.
 * The thread's error says why it failed, on every rank alike. */
brg_status brg__comm_piece_make(brg_comm *o, int color, int key, int rotate, brg_comm **out);
/* comm.c, for split.c and brg__comm_piece_make: the group of rank `me`
 * among n ranks whose (color, key), all-gathered, are all[]: its members
 * (ranks of the n) in (key, rank) order into members[], their count
 * returned, and me's place among them in *rank (-1 where color is
 * BRG_SPLIT_NOCOLOR: no group, 0 returned). */
typedef struct brg__split_entry {
  int32_t color, key;
} brg__split_entry;
int brg__split_group(const brg__split_entry *all, int n, int color, int me, int *members,
                     int *rank);
/* Rank k of c in the numbering of the communicator it is a piece of; k
 * for a communicator. */
static inline int brg__rank_up(const brg_comm *c, int k) {
  return c->members && k >= 0 && k < c->nranks ? c->members[k] : k;
}

/* progress.c: an all-gather of `bytes` per rank over comm (in issue order
 * with its collectives); split.c: what a rank of the parent that joins no
 * new communicator does in its place: both exchanges with nothing to say. */
brg_status brg__split_gather(brg_comm *comm, const void *mine, void *all, size_t bytes);
brg_status brg__split_stand_by(brg_comm *parent);

/* What each rank says in the second exchange of a split: whether its
 * set-up worked, and why not. */
typedef struct brg__split_confirm {
  int32_t status;
  char why[188];
} brg__split_confirm;

/* comm.c: before the first device collective (on the caller's thread, at
 * the same call on every rank), the net ring (c->netring) device_proxy.c's
 * host proxy carries kernel mode's slots between hosts on, where the ring
 * leaves a host and BRIGADE_DEVICE_MODE is not step: links to next and
 * from prev set up over three all-gathers of c (the receiving ends' info,
 * the senders' attach, every rank's status), so that a failure on one
 * rank is reported on all. */
brg_status brg__comm_netring(brg_comm *c);

/* The allreduce algorithms of BRIGADE_ALGO (hier.c picks one). */
typedef enum {
  BRG__ALGO_AUTO = 0,
  BRG__ALGO_RING = 1,
  BRG__ALGO_HIER = 2,
  BRG__ALGO_TREE = 3,
  BRG__ALGO_RHD = 4,
} brg__algo;
/* settings.c: BRIGADE_ALGO's value as a brg__algo, or -1 when it names none. */
int brg__algo_parse(const char *name);
const char *brg__algo_name(int algo);
/* Runs allreduce k hierarchically: its three phases on the hierarchy's
 * communicators, each through their progress (a failure stops both). */
brg_status brg__hier_run(brg_comm *c, brg__coll *k);
/* rings.c: the run of a k cut over c's rings (policy.c chose it),
 * one part per ring at once. */
brg_status brg__rings_run(brg_comm *c, brg__coll *k);
/* brg_comm_device_setup under BRIGADE_ALGO=hier, where the hosts fit it:
 * makes the hierarchy's pieces now (a collective, like the setup)
 * and gives them in *local and *cross, whose device rings the setup then
 * makes too, so that an allreduce captured in a CUDA graph can run hier;
 * NULL where allreduces will not run hier. */
brg_status brg__hier_device_prepare(brg_comm *c, brg_comm **local, brg_comm **cross);
/* (progress.c runs it in three phases on the two communicators; comm.c
 * aborts and destroys them with their parent.) */

/* errors.c: records an error on the communicator (last_error, WARN log)
 * and returns s. */
brg_status brg__comm_error(brg_comm *c, brg_status s, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* For calls without a communicator: logs the message and keeps it as the
 * thread's error (brg_comm_last_error(NULL)); returns s. */
brg_status brg__fail_no_comm(brg_status s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* The same for a message in an errbuf, logged unless it already was. */
brg_status brg__fail_no_comm_err(brg_status s, const brg__errbuf *err, const char *prefix);
/* BRG_SUCCESS for a live communicator, else the error (fn names the call):
 * a destroyed one is told by the table of live communicators, never by
 * reading its memory (brg_comm_destroy twice is a clean error). */
brg_status brg__check_comm(const brg_comm *c, const char *fn);
/* That table: register at creation (the communicator's serial, never 0 nor
 * reused; 0 when out of memory), unregister just before the memory goes;
 * live: whether c is registered (with that serial, unless serial is 0). */
uint32_t brg__comm_register(const brg_comm *c);
void brg__comm_unregister(const brg_comm *c);
int brg__comm_live(const brg_comm *c, uint32_t serial);
/* Tells both ring neighbours that this rank failed, once. */
void brg__comm_notify_abort(brg_comm *c, brg_status s, const char *text);
/* BRG_ERR_ABORTED for a call (fn, or NULL) on an aborted communicator.
 * Where a failure stopped it (lat.c, hier.c and rings.c stop it when
 * theirs fail: c->broken is set), last_error keeps that cause, which the
 * asynchronous mode's calls, returning before they run, report only at a
 * later call; else last_error says it was aborted. */
brg_status brg__comm_aborted(brg_comm *c, const char *fn);
/* "allreduce #3 (count 7, float32, sum, root -1)" */
void brg__coll_describe(char *out, size_t n, brg__coll_kind kind, uint64_t seq, uint64_t count,
                        int dtype, int op, int root, int device);

/* liveness.c: a thread per communicator beats on both ring sockets every
 * BRG__BEAT_MS and reads them, and on those of the pieces of its link set
 * (linkset.h), which have no thread of their own; a rank unheard of for
 * BRG__SILENT_MS is silent. start/stop/free around the communicator's
 * ready life (after stop, the thread goes on for the pieces until free). */
#define BRG__BEAT_MS 100
#define BRG__SILENT_MS 1000
brg_status brg__live_start(brg_comm *c, brg__errbuf *err);
void brg__live_stop(brg_comm *c); /* the caller reads the ring sockets from then on */
void brg__live_free(brg_comm *c);
/* What the thread read from `dir` other than heartbeats: 1 and the message
 * (s == BRG_SUCCESS: type, data, len) or the socket's failure (s, text);
 * 0 when nothing waits; -1 when no thread reads (the caller reads itself). */
int brg__live_take(brg_comm *c, int dir, brg_status *s, uint32_t *type, char *data, uint32_t *len,
                   char *text, size_t text_bytes);
/* The same without taking it, from the sockets that speak for c (an
 * extra ring's owner's), with the neighbour of `dir` on them in *peer. */
int brg__live_peek(brg_comm *c, int dir, int *peer, brg_status *s, uint32_t *type, char *data,
                   uint32_t *len, char *text, size_t text_bytes);
/* The rank silent the longest and for how long (*silent_ms), -1: none. */
int brg__live_silent(brg_comm *c, int64_t *silent_ms);
/* For a timeout's message: "; rank R (pid P on H) has been silent for T ms
 * (stopped, hung or cut off)" of the rank silent the longest, whether or
 * not it is the one waited for, else "". */
void brg__live_silent_note(brg_comm *c, char *note, size_t note_bytes);
/* How long rank `rank` has been silent, in ms; -1 when it is not (or
 * liveness does not run). */
int64_t brg__live_silent_rank(brg_comm *c, int rank);
/* Whether one of `ranks` (n of them; NULL: any rank) of c is gone as far
 * as liveness knows, without taking anything from it: a neighbour that
 * hung up, or one silent for brg__live_silent_limit_ms; or whether a
 * neighbour sent an abort notice. Returns that rank (the neighbour for a
 * notice; for a piece, one its owner's sockets name is numbered as there)
 * with a sentence in `why` that calls c `whose` ("the parent
 * communicator"), or -1. Any thread. */
int brg__live_gone(brg_comm *c, const int *ranks, int n, const char *whose, char *why,
                   size_t why_bytes);
/* How long a rank may be silent before kernels are stopped for it:
 * BRIGADE_SILENT_TIMEOUT_MS where set and shorter than the timeout. */
int brg__live_silent_limit_ms(const brg_comm *c);

/* topology.c: the identity of this host (equal on ranks that share memory),
 * and the ring order with c->pos, c->next, c->prev. */
uint64_t brg__topology_host_hash(char *hostname, size_t n);
void brg__topology_order(brg_comm *c);
/* 1 when c's ranks are on more than one host. */
int brg__topology_across(const brg_comm *c);
/* The ring's ranks in order, "|" between hosts ("0 2 | 1 3"), for logs. */
void brg__topology_ring_line(const brg_comm *c, char *line, size_t cap);
/* The NIC map: nic[i] is rank i's network device on its host, the index
 * of the address it advertises among its host's distinct addresses in
 * local rank order. Returns the fewest NICs on a host (0 on failure). */
int brg__topology_nics(const brg_comm *c, int *nic);
/* Logs the NIC map at INFO (every rank), where a host has two or more. */
void brg__topology_log_nics(const brg_comm *c);
/* Checks the identities the bootstrap table brought (rank number, pid,
 * host name and address terminated and printable) before anything prints
 * them; BRG_ERR_REMOTE names the rank whose identity is malformed. */
brg_status brg__topology_check_peers(const brg__peer_info *peers, int n, brg__errbuf *err);

/* comm.c: a communicator from a bootstrap id (rendezvous.c, brg_comm_init),
 * with the settings of the environment or, brg__comm_create_opts, these
 * (a NULL transports or a timeout_ms of -1: the environment's). */
typedef struct brg__comm_opts {
  int timeout_ms;
  const char *transports;
  /* split.c: the members meet over this communicator instead of at a root
   * (members[new rank] = rank in the parent); every rank of the parent
   * takes part in the two exchanges, members through brg__comm_create_opts,
   * the others through brg__split_stand_by. */
  brg_comm *parent;
  const int *members;
} brg__comm_opts;
brg_status brg__comm_create(brg_comm **out, int nranks, const brg__boot_id *id, int rank);
/* init.c: brg__comm_create_opts, then the extra rings (BRIGADE_RINGS). */
brg_status brg__comm_init_opts(brg_comm **out, int nranks, const brg__boot_id *id, int rank,
                               const brg__comm_opts *opts);
brg_status brg__comm_create_opts(brg_comm **out, int nranks, const brg__boot_id *id, int rank,
                                 const brg__comm_opts *opts);

/* progress.c: runs a collective in issue order on the caller's thread and
 * returns its status (inline when nothing is queued ahead of it). */
brg_status brg__progress_run(brg_comm *c, brg__coll *k);
/* stop.c: what brg_comm_abort does to c and the communicators it runs on
 * (rings, hierarchy); NULL: nothing. Any thread. The _why form tells the
 * ranks that hear of it why (a failure of another communicator that
 * their waits on this one could not see), the plain one that it was
 * aborted. */
void brg__comm_stop(brg_comm *c);
void brg__comm_stop_why(brg_comm *c, const char *why);
/* stop.c: tells every rank this one has links with (its ring neighbours,
 * its point-to-point peers) that it failed with s, and why. */
void brg__comm_tell(brg_comm *c, brg_status s, const char *why);
/* Queues a request for the worker thread (started here on a piece's first
 * queued call); brg__progress_wait waits for it. One that cannot be
 * queued is finished at once with the failure, which it returns. */
brg_status brg__progress_enqueue(brg_comm *c, brg__req *r);
/* Waits, up to the communicator's timeout, for queued device collectives
 * of the asynchronous mode to finish (nobody else waits for them); returns
 * 1 once nothing is queued or running, 0 when other work is queued or the
 * time ran out. */
int brg__progress_settle(brg_comm *c);
brg_status brg__progress_wait(brg__req *r);
/* A communicator's worker, at its creation (a piece's starts at its first
 * queued call); stop joins it, if it ran, and no worker starts after. */
brg_status brg__progress_start(brg_comm *c, brg__errbuf *err);
void brg__progress_stop(brg_comm *c);

/* p2p.c: point-to-point messages between any two ranks, on a TCP
 * connection from each sender to each receiver it uses, made at the first
 * message; a thread per communicator takes in what arrives (into the
 * posted receive, or memory of its own until one is posted). open makes
 * the listener before the bootstrap (its port travels in the peer table),
 * start allows the thread once the table is known, free undoes both. */
enum { BRG__P2P_USER = 0, BRG__P2P_A2A = 1 };
brg_status brg__p2p_open(brg_comm *c, const char *addr, uint32_t *port, brg__errbuf *err);
brg_status brg__p2p_start(brg_comm *c, brg__errbuf *err);
void brg__p2p_free(brg_comm *c);
/* The thread starts at the first send or receive (brg__p2p_need, err NULL:
 * the message goes to the communicator's last error), or once someone
 * dials the listener, whose descriptor the liveness thread watches until
 * then (brg__p2p_door_fd: -1 once the thread runs). */
brg_status brg__p2p_need(brg_comm *c, brg__errbuf *err);
int brg__p2p_door_fd(brg_comm *c);
/* Abort: every posted receive and queued send finishes as aborted (and
 * every later one at once); waiters look again. */
void brg__p2p_abort(brg_comm *c);
/* The cause of a stop, for the ranks this one has point-to-point links
 * with: written once (the first cause) on every connection, before any
 * link closes, so that a peer that then sees this rank hang up fails with
 * "rank R stopped: why" (the rank that really failed, which `why` names)
 * rather than with the hang-up alone. Any thread. */
void brg__p2p_notify(brg_comm *c, const char *why);
/* How long a stop's notice may trail the hang-up it explains: the
 * stopping rank writes it before its links close, but on another
 * connection (p2p's own, or the ring socket the liveness thread reads),
 * so a rank that sees a link end looks for the notice this long before it
 * names the link alone (p2p.c, link/ring_link.c); and how long p2p.c's
 * notice may take to be written. */
#define BRG__NOTE_GRACE_MS 100
/* The notice on the wire: among the one-byte doorbells a connection
 * carries after its hello, BRG__P2P_NOTE_MARK, the text's length (u16,
 * little endian, 1 to BRG__P2P_NOTE_MAX), the text. note_make writes one
 * (its size; 0 when buf is too small), a longer text cut in its middle
 * (" ... "): its end names the cause, its start the rank's own call;
 * note_take reads a connection's bytes as they come, in any pieces: 1 once
 * a notice is complete (its text in rx->text, the first one's, control
 * bytes shown as '?'), -1 when what came is malformed (rx->why says how;
 * every later call is -1), else 0; note_ended is told the connection's
 * end: -1 when it cut a notice short. */
#define BRG__P2P_NOTE_MARK 0x6e
#define BRG__P2P_NOTE_MAX 300 /* with the peer's message around it, within BRG__ERRLEN */
typedef struct brg__p2p_note_rx {
  int state; /* 0: between messages, 1 and 2: the length's bytes, 3: the text; -1: malformed */
  unsigned len, got;
  int done; /* a notice came: text is the first one's */
  char text[BRG__P2P_NOTE_MAX + 1];
  char why[128];
} brg__p2p_note_rx;
size_t brg__p2p_note_make(char *buf, size_t bytes, const char *text);
int brg__p2p_note_take(brg__p2p_note_rx *rx, const void *buf, size_t n);
int brg__p2p_note_ended(brg__p2p_note_rx *rx);
/* Queues a send (op filled by the caller: buf, count, dtype, peer, chan,
 * num); it leaves from the p2p thread or at once, and completes once its
 * bytes have all left buf. fn names the call. */
brg_status brg__p2p_isend(brg_comm *c, const char *fn, brg__p2p_op *op);
/* Blocking send: brg__p2p_isend, then brg__p2p_wait. */
brg_status brg__p2p_send(brg_comm *c, const char *fn, uint32_t chan, uint64_t num, const void *buf,
                         uint64_t count, brg_dtype dtype, int peer);
/* Posts a receive (op filled by the caller: buf, count, dtype, peer,
 * chan, num); it completes on the p2p thread or at once. */
brg_status brg__p2p_post(brg_comm *c, brg__p2p_op *op);
/* Waits for a posted receive or a queued send (up to the timeout without
 * progress); on failure the operation is withdrawn and the communicator's
 * last error says why. */
brg_status brg__p2p_wait(brg_comm *c, const char *fn, brg__p2p_op *op);
/* Takes back a queued send that has not finished (it finishes with `s`)
 * and tells its receiver that the send was cut short. */
void brg__p2p_cancel_send(brg_comm *c, brg__p2p_op *op, brg_status s);
/* Between drive_begin and drive_end the calling thread moves the links'
 * bytes itself, in brg__p2p_drive_wait (a brg__p2p_wait that polls the
 * links before it sleeps), and the p2p thread only serves the door and
 * watches hang-ups until a wait sleeps: lat.c's messages then take no
 * thread hand-off. */
void brg__p2p_drive_begin(brg_comm *c);
void brg__p2p_drive_end(brg_comm *c);
brg_status brg__p2p_drive_wait(brg_comm *c, const char *fn, brg__p2p_op *op);
/* alltoall.c: the collective all_to_all, run by ring.c's engine in issue
 * order. */
brg_status brg__p2p_all_to_all(brg_comm *c, const brg__coll *k);

/* slice.c: the slice policy, the one place that sizes the pipeline unit.
 * brg__slice_bytes decides it for a path, once (comm.c for the host ring,
 * at create; device_setup.c for the device ring); brg__slice_elems is
 * what a collective's walk uses, in elements of its dtype (at least 1):
 * the host ring's slice, or step mode's for GPU buffers. */
typedef enum {
  BRG__SLICE_HOST,   /* the host ring's: c->slice_bytes */
  BRG__SLICE_STEP,   /* step mode's GPU slice */
  BRG__SLICE_KERNEL, /* kernel mode's slot */
} brg__slice_path;
size_t brg__slice_bytes(const brg_comm *c, brg__slice_path path);
size_t brg__slice_elems(const brg_comm *c, const brg__coll *k);

/* lat.c: the latency-bound allreduces (k->lat: double binary tree or
 * recursive halving and doubling) over point-to-point links, on the
 * calling thread, host buffers. */
brg_status brg__lat_run(brg_comm *c, brg__coll *k);

/* rooted.c: gather and scatter on the point-to-point links, run by
 * ring.c's engine in issue order. */
brg_status brg__rooted_run(brg_comm *c, const brg__coll *k);

/* ring.c: the host executor's run: one collective on host buffers to
 * completion on the calling thread, over this communicator's ring. */
brg_status brg__coll_execute(brg_comm *c, brg__coll *coll);

#endif
