/*
 * A communicator's link set (linkset.c): the pieces the runtime makes
 * inside it for itself (the extra rings, the hierarchy's local, cross and
 * fold: comm.c's brg__comm_piece_make), which its liveness thread serves.
 * A piece is no communicator: links of its own set up over the owner's
 * all-gathers, and no bootstrap, ring sockets or point-to-point listener;
 * its waits hear of failures through the owner's sockets, and the thread
 * watches its kernels with what those say. A piece keeps one thread to
 * run collectives, since its part runs at the same time as the owner's.
 * (Kernel mode's links between hosts are links alone on a ring, its net
 * ring, comm.c.)
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
