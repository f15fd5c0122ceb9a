/*
 * A communicator's link set (linkset.c): what the runtime makes inside it
 * for itself and its liveness thread serves. The extra rings (comm.c's
 * brg__comm_ring_make) are links alone, with no sockets of their own: the
 * thread watches their kernels with what the owner's sockets say. The
 * hierarchy's pieces are communicators split over the owner (split.c)
 * that run no liveness thread: the owner's beats on their ring sockets
 * and reads them too, and they start a point-to-point thread only if one
 * is used (p2p.c). A ring or a piece keeps one thread to run collectives,
 * since its part runs at the same time as the owner's. (Kernel mode's
 * links between hosts are links alone on a ring, its net ring, comm.c.)
 */
#ifndef BRG_LINKSET_H
#define BRG_LINKSET_H

#include <pthread.h>
#include <stdint.h>

#include "internal.h"

typedef struct brg__linkset {
  pthread_mutex_t lock; /* the pieces; the liveness thread holds it while it serves them */
  brg_comm **piece;
  int n, cap;
  uint64_t gen; /* bumped whenever a piece joins or leaves */
} brg__linkset;

/* The communicator whose set c's pieces join: c itself, or the owner of
 * the set c belongs to (a piece's own pieces join the top one). */
brg_comm *brg__linkset_owner(brg_comm *c);
/* Makes owner's set (once, before its liveness thread starts). */
brg_status brg__linkset_init(brg_comm *owner, brg__errbuf *err);
/* piece joins owner's set: the owner's liveness thread serves it from the
 * next beat on. */
brg_status brg__linkset_join(brg_comm *owner, brg_comm *piece, brg__errbuf *err);
/* piece leaves; once this returns, no thread of the owner touches it. */
void brg__linkset_leave(brg_comm *owner, brg_comm *piece);
/* Frees owner's set (after every piece left). */
void brg__linkset_free(brg_comm *owner);

#endif
