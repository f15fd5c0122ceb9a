/*
 * The ring engine's slot handshake (ring_link.c), shared by the host data
 * path (ring.c) and the device data path (device_ring.c). Both walk the
 * same schedule and the same host FIFOs; they differ only in where the
 * payload lives.
 */
#ifndef BRG_RING_LINK_H
#define BRG_RING_LINK_H

#include "internal.h"
#include "schedule.h"

struct brg__dev_ring;

/* One collective as the engine runs it. */
typedef struct brg__ring_op {
  brg_comm *c;
  const brg__coll *coll;
  size_t esize;
  size_t slice_elems;
  int nt;                    /* write outputs with non-temporal stores (host) */
  struct brg__dev_ring *dev; /* device collective: payloads in GPU memory */
  size_t elem;               /* the current slice's first element in the whole
                                 collective, the same on every rank */
  int chunk;                 /* the current slice's chunk (for the trace) */
  size_t slice;              /* and its index in the chunk */
} brg__ring_op;

/* The communicator's waiter: its check stops waits on abort, a
 * neighbour's notice or hang-up, a broken link, or the deadline. */
void brg__ring_waiter_init(brg_comm *c);

/* Waits for a free slot towards the next rank; *slot is where `bytes` of
 * host payload go (the header's inline bytes when they fit). */
brg_status brg__ring_send_acquire(brg__ring_op *o, size_t bytes, char **slot);
/* Publishes the slot with its header. */
void brg__ring_send_post(brg__ring_op *o, size_t bytes);
/* Waits for the next slot from the previous rank and checks that its header
 * names this collective with `bytes` of payload. */
brg_status brg__ring_recv_acquire(brg__ring_op *o, const char **slot, size_t bytes);
/* Hands the slot back to the previous rank. */
void brg__ring_recv_release(brg__ring_op *o);

#endif
