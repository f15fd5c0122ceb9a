/*
 * What the host hands a kernel-mode launch (ring_kernel.cuh): plain C, so
 * that the runtime fills it without CUDA headers and the CUDA module's
 * table (brg_cuda.h, ring_launch) carries it as bytes.
 */
#ifndef BRG_RING_ARGS_H
#define BRG_RING_ARGS_H

#include <stddef.h>
#include <stdint.h>

#define BRG__RK_MAX_CHANNELS 16

/*
 * The one-shot allreduce (ring_kernel.cuh, channel::oneshot) between the
 * ranks of one host, at most BRG__RK_MAX_PEERS of them. Each rank owns an
 * area in GPU memory that every other rank maps:
 *
 *   0                        its call counter (only it writes it)
 *   FLAGS + 64 r             the last call whose input rank r has written
 *   DATA + (b N + r) slot    rank r's input in buffer b (0 or 1)
 *
 * Calls alternate between the two buffers, so that a rank one call ahead
 * writes into the other buffer.
 */
#define BRG__RK_MAX_PEERS 16
#define BRG__RK_OS_FLAGS 64
#define BRG__RK_OS_DATA 2048

/* Bytes of one rank's one-shot area for inputs of up to slot_bytes. */
static inline size_t brg__rk_os_bytes(int nranks, size_t slot_bytes) {
  return BRG__RK_OS_DATA + 2 * (size_t)nranks * slot_bytes;
}

/* *status after a launch: 0, or why a channel stopped. */
#define BRG__RK_OK 0
#define BRG__RK_ABORTED 1

/* One channel's link to both neighbours (ring_kernel.cuh draws it). */
typedef struct brg__rk_link {
  char *send_slots;          /* the next rank's receive slots of this channel */
  uint64_t *send_tail;       /* the next rank's tail: slots this rank posted */
  const uint64_t *send_head; /* own: slots the next rank has taken */
  const char *recv_slots;    /* own receive slots */
  const uint64_t *recv_tail; /* own: slots the previous rank posted */
  uint64_t *recv_head;       /* the previous rank's head: slots this rank took */
  uint64_t *counters;        /* own: [0] posted, [1] taken, across launches */
  /* A link to another host, through the host proxy (runtime/device_ring.c):
   * the bytes of each posted slot, nslots entries beside the send tail,
   * which the proxy reads to know how much of the slot to put on the
   * network. NULL on a link within the host. */
  uint64_t *send_sizes;
} brg__rk_link;

/* What a one-shot launch needs beyond the call (args.oneshot set). */
typedef struct brg__rk_oneshot {
  char *area[BRG__RK_MAX_PEERS]; /* rank r's area, as this rank reaches it */
  size_t slot_bytes;             /* room for one rank's input, a multiple of 256 */
  int rank;                      /* this rank */
} brg__rk_oneshot;

typedef struct brg__rk_args {
  int kind; /* the runtime's brg__coll_kind: 1 allreduce .. 5 reduce */
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
  size_t slot_bytes;     /* a multiple of 16 */
  const int *abort_word; /* nonzero: stop */
  int *status;           /* a channel that stops writes why */
  brg__rk_link chan[BRG__RK_MAX_CHANNELS];
  int oneshot; /* 1: an allreduce by the one-shot path, one channel */
  brg__rk_oneshot os;
} brg__rk_args;

#endif
