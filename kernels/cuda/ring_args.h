/*
 * What the host hands a kernel-mode launch (ring_kernel.cuh): plain C, so
 * that the runtime fills it without CUDA headers and the CUDA module's
 * table (brg_cuda.h, ring_launch) carries it as bytes.
 */
#ifndef BRG_RING_ARGS_H
#define BRG_RING_ARGS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "hd.h" /* functions the kernel calls too */

#define BRG__RK_MAX_CHANNELS 32

/*
 * The one-shot allreduce (ring_kernel.cuh, channel::oneshot) between the
 * ranks of one host, at most BRG__RK_MAX_PEERS of them. Each rank owns an
 * area in GPU memory that every other rank maps:
 *
 *   0                        its call counter (only it writes it)
 *   FLAGS + 64 r             the last call whose input rank r has written,
 *                            then rank r's calls (brg__rk_call) into buffer
 *                            0 and buffer 1
 *   DATA + (b N + r) slot    rank r's input in buffer b (0 or 1)
 *   LL + (b N + r) ll_slot   rank r's LL lines in buffer b, where
 *                            LL = DATA + 2 N slot
 *
 * Calls alternate between the two buffers, so that a rank one call ahead
 * writes into the other buffer.
 *
 * The LL form of the one-shot path (low latency: no fence, no flag of its
 * own) sends 16-byte lines, each two 8-byte halves of 4 data bytes and a
 * 4-byte flag, every half stored and loaded whole: a half whose flag is
 * the call's (brg__rk_ll_flag) holds the call's data, whatever order the
 * halves land in. A rank's lines in a buffer: first the call (its flagged
 * words, brg__rk_call_words, two to a line: BRG__RK_LL_CALL_LINES lines),
 * then its input, 8 bytes a line.
 */
#define BRG__RK_MAX_PEERS 16
#define BRG__RK_OS_FLAGS 64
#define BRG__RK_OS_DATA 2048
#define BRG__RK_LL_LINE 16
#define BRG__RK_LL_CALL_LINES 3 /* BRG__RK_CALL_WORDS / 2 */

/*
 * The direct paths of an allreduce between the ranks of one host, on many
 * blocks (ring_kernel.cuh, channel::direct): block b of B takes part b of
 * the data (brg__part_* over the blocks), with flags of its own, so that
 * no block waits for another of its rank. The one-shot form: every rank
 * writes its part b into every rank's area, which folds the N inputs. The
 * two-shot form (reduce-scatter, then all-gather, through the peers'
 * memory): every rank writes its input's block p (brg__part_* over the N
 * ranks), part b of it, into rank p's area; rank p folds block p and
 * writes the result into every rank's area, which copies it out. Each
 * rank's direct area, after its one-shot area in its region, is a
 * brg__rk_direct_head, then from BRG__RK_DIRECT_DATA two buffers (the
 * call's parity) of N slots: in buffer c, slot r holds rank r's input (its
 * part for this rank) and, half a slot on, the two-shot's result of rank
 * r's block.
 */
#define BRG__RK_DIRECT_BLOCKS 32
#define BRG__RK_ONESHOT_MANY 1 /* brg__rk_oneshot.direct: the one-shot form on many blocks */
#define BRG__RK_TWOSHOT 2      /* the two-shot form */

/* Bytes of one rank's one-shot area for inputs of up to slot_bytes, and
 * LL inputs of up to ll_slot bytes of lines (0: no LL form). */
static inline size_t brg__rk_os_bytes(int nranks, size_t slot_bytes, size_t ll_slot) {
  return BRG__RK_OS_DATA + 2 * (size_t)nranks * (slot_bytes + ll_slot);
}

/* Room for the LL lines of an input of up to `bytes` bytes, a multiple of
 * 256 (0 for 0: no LL form). */
static inline size_t brg__rk_ll_slot(size_t bytes) {
  if (!bytes) return 0;
  size_t lines = BRG__RK_LL_CALL_LINES + (bytes + 7) / 8;
  return (lines * BRG__RK_LL_LINE + 255) & ~(size_t)255;
}

/* The flag of the LL lines of one-shot call `call` (1 and up): never 0
 * (what a fresh area holds), and any two calls fewer than 2^32 - 1 apart
 * differ, so that lines left in a buffer by an earlier call never pass for
 * this one's. */
static inline BRG_HD uint32_t brg__rk_ll_flag(uint64_t call) {
  return (uint32_t)(call % 0xffffffffu) + 1;
}

/*
 * The ring's LL form: a slot of ll_slot bytes holds 16-byte lines, first
 * the call (BRG__RK_LL_CALL_LINES lines, as the one-shot path's), then the
 * slice, 8 bytes a line; every half of every line carries the flag of the
 * slot's position on the link, brg__rk_ll_flag(posted + 1), so that lines
 * of the slot's earlier rounds never pass. A slice's bytes in a slot of
 * ll_slot bytes (a multiple of 16, so that slices keep a chunk's offset
 * from 16 bytes as the plain slots do; 0 where no line of data fits).
 */
static inline BRG_HD size_t brg__rk_ring_ll_payload(size_t ll_slot) {
  size_t lines = ll_slot / BRG__RK_LL_LINE;
  if (lines <= BRG__RK_LL_CALL_LINES) return 0;
  return ((lines - BRG__RK_LL_CALL_LINES) * 8) & ~(size_t)15;
}

/* The word of brg__rk_args.launches that counts the blocks that ended
 * (a cache line after the count of those that began). */
#define BRG__RK_ENDED 8

/* *status after a launch: 0, or why a channel stopped (the channel's
 * watch record says more). */
#define BRG__RK_OK 0
#define BRG__RK_ABORTED 1  /* the abort word was set */
#define BRG__RK_MISMATCH 2 /* a neighbour's call differs from this rank's */
#define BRG__RK_STALE 3    /* a slot or one-shot flag not from the call expected */
#define BRG__RK_BUSY 4     /* another launch of this communicator runs in the channel */

/* A call as every rank's kernel compares it (24 bytes): the host's call
 * number, the element count, the root, and the collective, dtype and op
 * (brg__coll_kind, brg_dtype, brg_op). */
typedef struct brg__rk_call {
  uint64_t seq, count;
  int32_t root;
  uint8_t kind, dtype, op, pad;
} brg__rk_call;

/* A call as flagged words, the form in which one rank's call reaches
 * another's kernel without a fence on either side (the header mailbox,
 * the one-shot path's LL call lines, the host proxy's copies of them): the
 * call's six 4-byte words, each in the low half of an 8-byte word whose
 * high half is a flag (never 0) that says which entry or call the word
 * belongs to. Each 8-byte word is stored and loaded whole, so the reader
 * has the call once every word carries the flag it expects. */
#define BRG__RK_CALL_WORDS 6
#ifdef __cplusplus
static_assert(sizeof(brg__rk_call) == 4 * BRG__RK_CALL_WORDS, "a call is six 4-byte words");
static_assert(2 * BRG__RK_LL_CALL_LINES == BRG__RK_CALL_WORDS, "two call words an LL line");
#else
_Static_assert(sizeof(brg__rk_call) == 4 * BRG__RK_CALL_WORDS, "a call is six 4-byte words");
_Static_assert(2 * BRG__RK_LL_CALL_LINES == BRG__RK_CALL_WORDS, "two call words an LL line");
#endif

/* 4 bytes of data beside flag f, as one word. */
static inline BRG_HD uint64_t brg__rk_flagged(uint32_t data, uint32_t f) {
  return (uint64_t)f << 32 | data;
}

/* Whether word w carries flag f. */
static inline BRG_HD int brg__rk_has_flag(uint64_t w, uint32_t f) {
  return (uint32_t)(w >> 32) == f;
}

/* `call` as flagged words, each beside flag f. */
static inline BRG_HD void brg__rk_call_words(const brg__rk_call *call, uint32_t f,
                                             uint64_t w[BRG__RK_CALL_WORDS]) {
  uint32_t v[BRG__RK_CALL_WORDS];
  memcpy(v, call, sizeof v);
  for (int i = 0; i < BRG__RK_CALL_WORDS; i++) w[i] = brg__rk_flagged(v[i], f);
}

/* The call in words w, when every one carries flag f: 1 then, 0 (and
 * *call untouched) when some word does not. */
static inline BRG_HD int brg__rk_call_of_words(const uint64_t w[BRG__RK_CALL_WORDS], uint32_t f,
                                               brg__rk_call *call) {
  uint32_t v[BRG__RK_CALL_WORDS];
  for (int i = 0; i < BRG__RK_CALL_WORDS; i++) {
    if (!brg__rk_has_flag(w[i], f)) return 0;
    v[i] = (uint32_t)w[i];
  }
  memcpy(call, v, sizeof v);
  return 1;
}

/* The flag of one phase (0: inputs, 1: two-shot results) of one rank's
 * block: the last call it wrote, and its call in buffer 0 and 1. */
typedef struct brg__rk_dline {
  uint64_t flag;
  brg__rk_call call[2];
  uint64_t pad;
} brg__rk_dline;
typedef struct brg__rk_direct_head {
  /* block b's calls so far (only it writes it; block 0 also those of the
   * blocks a launch did not run, so that all agree), a page */
  uint64_t calls[BRG__RK_DIRECT_BLOCKS];
  uint64_t pad[512 - BRG__RK_DIRECT_BLOCKS];
  brg__rk_dline line[2][BRG__RK_MAX_PEERS][BRG__RK_DIRECT_BLOCKS]; /* [phase][rank][block] */
} brg__rk_direct_head;
#define BRG__RK_DIRECT_DATA sizeof(brg__rk_direct_head)
#ifdef __cplusplus
static_assert(sizeof(brg__rk_dline) == 64, "a flag line is a cache line");
static_assert(offsetof(brg__rk_direct_head, line) == 4096, "the lines start a page on");
#else
_Static_assert(sizeof(brg__rk_dline) == 64, "a flag line is a cache line");
_Static_assert(offsetof(brg__rk_direct_head, line) == 4096, "the lines start a page on");
#endif

/* Bytes of one rank's direct area whose slots are slot_bytes each. */
static inline size_t brg__rk_direct_bytes(int nranks, size_t slot_bytes) {
  return BRG__RK_DIRECT_DATA + 2 * (size_t)nranks * slot_bytes;
}

/* What the sender writes beside each slot it posts (64 bytes, in the
 * receiver's region): the slot's position on the link and the call. */
typedef struct brg__rk_meta {
  uint64_t post; /* posted + 1 when written: the receiver expects taken + 1 */
  brg__rk_call call;
  uint64_t pad[4];
} brg__rk_meta;

/* The call a channel announces to the next rank at each launch, into the
 * next rank's mailbox of BRG__RK_HDRS entries. Every rank checks its
 * previous rank's entry while it waits and before it ends, so that calls
 * that differ are found even where no slot goes between them (two
 * broadcast roots) or where they took different paths (one-shot and ring).
 * Entry k is the call's flagged words (brg__rk_call_words) with flag
 * brg__rk_hdr_flag(k): once all six carry it, it holds call k, without a
 * fence on either side (the LL form, as the one-shot path's lines). */
#define BRG__RK_HDRS 64
typedef struct brg__rk_hdr {
  uint64_t w[BRG__RK_CALL_WORDS];
  uint64_t pad[2];
} brg__rk_hdr;

/* The flag of mailbox entry k (0 and up): the LL flag of call k + 1, so any
 * two entries fewer than 2^32 - 1 apart differ. */
static inline BRG_HD uint32_t brg__rk_hdr_flag(uint64_t k) {
  return brg__rk_ll_flag(k + 1);
}

/* What a channel tells the host while it runs, in pinned host memory
 * (128 bytes each): the host's watchdog sees a launch in flight
 * (started != finished) whose progress stands still, and reads why a
 * channel stopped. Written by the channel's thread 0 only, off the hot
 * path (each write crosses PCIe): progress every few steps, what it waits
 * for when it polls the abort word, both at the launch's end. */
#define BRG__RK_WAIT_NONE 0
#define BRG__RK_WAIT_RECV 1    /* a slot from the previous rank */
#define BRG__RK_WAIT_SEND 2    /* a free slot of the next rank */
#define BRG__RK_WAIT_ONESHOT 3 /* the one-shot flag of rank `peer` */
typedef struct brg__rk_watch {
  uint64_t progress;          /* bumped at every step passed */
  uint64_t started, finished; /* launches begun and ended in this channel */
  int32_t code;               /* BRG__RK_*: why the channel stopped */
  int32_t step;               /* the ring step or chain hop it is at */
  int32_t wait;               /* BRG__RK_WAIT_* */
  int32_t peer;               /* one-shot: the rank waited for; a fault: the rank whose
                               * flag or call it compared (-1: the previous rank) */
  uint64_t expected, found;   /* STALE: the position expected and what was there */
  brg__rk_call mine, theirs;  /* the calls compared (MISMATCH) */
  uint64_t pad[3];
} brg__rk_watch;

/* One channel's link to both neighbours (ring_kernel.cuh draws it). */
typedef struct brg__rk_link {
  char *send_slots;          /* the next rank's receive slots of this channel */
  uint64_t *send_tail;       /* the next rank's tail: slots this rank posted */
  const uint64_t *send_head; /* own: slots the next rank has taken */
  const char *recv_slots;    /* own receive slots */
  const uint64_t *recv_tail; /* own: slots the previous rank posted */
  uint64_t *recv_head;       /* the previous rank's head: slots this rank took */
  /* own: [0] posted, [1] taken, across launches; [2] the busy word;
   * [3] headers sent, [4] headers checked; [5] steps passed and [6]
   * launches begun, which the watch record shows the host */
  uint64_t *counters;
  brg__rk_meta *send_meta;       /* the next rank's, one per slot (NULL: not checked) */
  const brg__rk_meta *recv_meta; /* own, one per slot, the previous rank writes them */
  brg__rk_hdr *send_hdr;         /* the next rank's mailbox (NULL: no headers) */
  const brg__rk_hdr *recv_hdr;   /* own mailbox, the previous rank writes it */
  const uint64_t *hdr_acked;     /* own: headers the next rank checked */
  uint64_t *hdr_ack;             /* the previous rank's hdr_acked */
  /* A link to another host, through the host proxy (runtime/exec/kernel/device_proxy.c):
   * the bytes of each posted slot, nslots entries beside the send tail,
   * which the proxy reads to know how much of the slot to put on the
   * network. NULL on a link within the host. */
  uint64_t *send_sizes;
  /* The ring's LL slots (args.ring_ll), nslots of ring_ll bytes each, apart
   * from the plain slots so that a plain slot's data is never read as a
   * line: the next rank's, and own. NULL: no LL form on this link. */
  char *send_ll;
  const char *recv_ll;
} brg__rk_link;

/* What a one-shot launch needs beyond the call (args.oneshot set). */
typedef struct brg__rk_oneshot {
  char *area[BRG__RK_MAX_PEERS]; /* rank r's area, as this rank reaches it */
  size_t slot_bytes;             /* room for one rank's input, a multiple of 256 */
  size_t ll_slot;                /* room for one rank's LL lines (brg__rk_ll_slot) */
  int rank;                      /* this rank */
  int ll;                        /* 1: the LL form (the call's lines fit ll_slot) */
  int direct;                    /* 0, or BRG__RK_ONESHOT_MANY, BRG__RK_TWOSHOT: many blocks */
  size_t direct_off;             /* rank r's direct area: area[r] + direct_off */
  size_t dslot;                  /* room for one rank's input in a direct area, a multiple of 256 */
} brg__rk_oneshot;

typedef struct brg__rk_args {
  int kind; /* brg__coll_kind (kernels/schedule.h) */
  int dtype, op;
  int nranks, pos; /* this rank's place on the ring */
  int root;        /* broadcast and reduce: the root's rank */
  const int *ring; /* position -> rank, nranks entries, readable by the kernel */
  const void *sendbuf;
  void *recvbuf;
  size_t count; /* the call's count argument */
  /* Reduce-scatter and all-gather over one buffer of count elements, rank
   * r's block at brg__part_offset(count, N, r) as allreduce cuts it (the
   * phases of a hierarchical allreduce within a host); 0: blocks of count. */
  int whole;
  /* Reduce-scatter and all-gather (not whole): elements from rank r's
   * block to rank r+1's (0: count), for a part of a call cut over several
   * rings, whose count is below the stride. */
  size_t stride;
  int nslots;
  int nchannels;
  size_t slot_bytes; /* this call's slots: bytes used of each, a multiple of 16 */
  /* Bytes from one slot to the next in a channel's slots (0: slot_bytes):
   * the room setup made, which a call's shape (slot_bytes) may use in
   * part, so that slots of calls of different shapes never overlap. */
  size_t slot_stride;
  int *abort_word;      /* nonzero: stop (a channel that finds a fault sets it) */
  int *status;          /* a channel that stops writes why */
  brg__rk_watch *watch; /* one per channel, pinned host memory */
  /* A launch captured into a graph, whose replays may run on any stream:
   * every block adds 1 to launches[0] before it reads the abort word and
   * to launches[BRG__RK_ENDED] once it is done, so that the host's drain
   * at destroy waits for the replays it has no event of (NULL: launches
   * the host has an event of, uncounted). In host memory that outlives
   * the communicator, as the abort word does. */
  uint64_t *launches;
  brg__rk_call call; /* this rank's call, as its neighbours compare it */
  brg__rk_link chan[BRG__RK_MAX_CHANNELS];
  /* 0, or the bytes of one of the ring's LL slots (a multiple of 256):
   * the ring sends its slots as LL lines (link.send_ll, recv_ll), flagged
   * with the slot's position on the link, instead of posting the tail
   * behind a fence (ring_kernel.cuh, prim_ll). */
  size_t ring_ll;
  int oneshot; /* 1: an allreduce by a one-hop path (os.direct: on nchannels blocks, else one) */
  brg__rk_oneshot os;
} brg__rk_args;

#endif
