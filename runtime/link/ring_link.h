/*
 * The ring engine's slot handshake (ring_link.c), shared by the host data
 * path (ring.c) and the device data path (device_step.c). Both walk the
 * same schedule and the same host FIFOs; they differ only in where the
 * payload lives.
 */
#ifndef BRG_RING_LINK_H
#define BRG_RING_LINK_H

#include "internal.h"
#include "schedule.h"
#include "trace.h"

struct brg__dev_ring;
struct brg__mem_ops;

/* One collective as the engine runs it. */
typedef struct brg__ring_op {
  brg_comm *c;  /* whose errors, settings and trace */
  brg__ring *r; /* the ring it runs on: links, positions, waits */
  const brg__coll *coll;
  size_t esize;
  size_t slice_elems;
  int nt;                         /* write outputs with non-temporal stores (host) */
  int direct;                     /* the next link sends host payloads from anywhere */
  int windows;                    /* offer the all-gather outputs to the previous link */
  const struct brg__mem_ops *mem; /* where the payloads live: brg__mem_host, brg__mem_device */
  struct brg__dev_ring *dev;      /* device collective: payloads in GPU memory */
  size_t elem;                    /* the current slice's first element in the whole
                                 collective, the same on every rank */
  int chunk;                      /* the current slice's chunk (for the trace) */
  size_t slice;                   /* and its index in the chunk */
} brg__ring_op;

/*
 * What run_prim (ring.c) asks of the memory a collective's payloads live
 * in, for each piece of a slice, in this order: recv (where the received
 * piece is to be read, once it is there), send (where the piece for the
 * next rank is to be written, once that slot is free), apply (the
 * primitive's arithmetic), sent (hand the written slot to the next rank)
 * and received (hand the read slot back). A link whose slots hold less
 * than a slice (`piece`) takes the slice in pieces, a slot and an apply
 * each; the other link takes the whole slice in one slot, whose pieces
 * are written or read at their offsets. Both ends of a link cut alike,
 * since both know the slice and the link's slot size.
 *
 * brg__mem_host (ring.c): the CPU reads and writes the transports' slots.
 * brg__mem_device (device_step.c): kernels on the collective's stream
 * read and write slots in GPU memory (or pinned host memory), ordered by
 * events; the host side only enqueues.
 */
typedef struct brg__mem_ops {
  const char *name; /* "host", "GPU" (the trace) */
  /* The most payload bytes a slot of the link to the next rank (send = 1)
   * or from the previous one takes; UINT64_MAX: a whole slice. */
  uint64_t (*piece)(const brg__ring_op *o, int send);
  /* `shift`: the piece's offset from a 16-byte boundary in the caller's
   * buffers, which a slot in GPU memory keeps. */
  brg_status (*recv)(brg__ring_op *o, size_t shift, uint64_t bytes, const char **r);
  brg_status (*send)(brg__ring_op *o, size_t shift, uint64_t bytes, char **slot);
  /* The primitive on m elements of `in` and `out` (NULL where unused),
   * reading received `r`, writing `slot`; *payload is where the link sends
   * from when that is not the slot (NULL: the slot). */
  brg_status (*apply)(brg__ring_op *o, brg__prim prim, const char *in, char *out, const char *r,
                      char *slot, size_t m, const void **payload);
  brg_status (*sent)(brg__ring_op *o, uint64_t bytes, const void *payload);
  brg_status (*received)(brg__ring_op *o);
} brg__mem_ops;
extern const brg__mem_ops brg__mem_host, brg__mem_device;

/* Runs the plan of schedule.h for o's collective (a ring or chain one,
 * N >= 2) through o->mem, step by step (ring.c): the host engine's and
 * step mode's walk. */
brg_status brg__ring_walk(brg__ring_op *o);

/* A neighbour's goodbye (BRG__MSG_BYE) read from direction dir, by the
 * ring's waits or by destroy: it has departed, now, with the word its
 * payload carries (brg__exec_bye_word's; none: 0). */
void brg__ring_took_bye(brg__ring *r, int dir, const char *data, uint32_t len);

/* Ties ring r to communicator c (whose errors, settings, peers and ring
 * sockets it uses) and sets its waiter: the waiter's check stops waits on
 * abort, a neighbour's notice or hang-up, a broken link, or the deadline. */
void brg__ring_init(brg__ring *r, brg_comm *c);

/* Ties ring r to its owner c without ring sockets of its own (kernel
 * mode's net ring, comm.c): its waits stop on c's abort, or once c's
 * liveness says a neighbour is gone or sent an abort notice; they read
 * nothing from c's ring sockets, which c's own waits take. */
void brg__ring_init_net(brg__ring *r, brg_comm *c);

/* Waits for a free slot towards the next rank; *slot is where `bytes` of
 * host payload go (the header's inline bytes when they fit). */
brg_status brg__ring_send_acquire(brg__ring_op *o, size_t bytes, char **slot);
/* Publishes the slot with its header. Where the link sends on the
 * engine's thread (ops->send_now), the payload goes from `payload` when it
 * is not NULL (the slot was left unwritten), and this returns once it is
 * sent. */
brg_status brg__ring_send_post(brg__ring_op *o, size_t bytes, const void *payload);
/* 1 when the link to the next rank can send a host payload from anywhere. */
static inline int brg__ring_send_direct(const brg__ring_op *o) {
  return !o->dev && o->r->send.ops && o->r->send.ops->send_now;
}
/* Waits for the next slot from the previous rank and checks that its header
 * names this collective with `bytes` of payload. */
brg_status brg__ring_recv_acquire(brg__ring_op *o, const char **slot, size_t bytes);
/* Hands the slot back to the previous rank. */
void brg__ring_recv_release(brg__ring_op *o);
/* 1 when the link from the previous rank can land payloads in the
 * engine's own buffers (ops->recv_window). */
static inline int brg__ring_recv_windows(const brg__ring_op *o) {
  return !o->dev && o->r->recv.ops && o->r->recv.ops->recv_window;
}

/* The trace's record of a slice that ended (trace.c), from where the
 * engine stands. */
static inline void brg__trace_slice_end(const brg__ring_op *o, brg__prim prim, uint64_t bytes,
                                        int64_t t0, brg_status s) {
  brg__trace_slice(o->c, o->coll->seq, o->chunk, o->elem, o->slice, prim, bytes, t0, s);
}

#endif
