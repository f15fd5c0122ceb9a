/*
 * What the policy (policy.c) asks of the hierarchy (hier.c) to choose an
 * allreduce's algorithm: the hosts' shape as the ring lists them, whether
 * hier can run on it, the making of its communicators, and the INFO lines
 * said once per communicator and kind of choice.
 */
#ifndef BRG_HIER_H
#define BRG_HIER_H

#include "internal.h"

/* The hosts as the ring lists them (grouped, topology.c): how many, the
 * fewest and most ranks on one, and this rank's host, index on it and the
 * number of ranks on it. */
typedef struct brg__hier_shape {
  int hosts, min_local, max_local;
  int host, local_rank, host_ranks;
} brg__hier_shape;

void brg__hier_shape_of(const brg_comm *c, brg__hier_shape *sh);

/* Whether the hosts have the shape hier needs: two or more, one at least
 * with two ranks or more (hosts may differ in rank count). */
static inline int brg__hier_fits(const brg__hier_shape *sh) {
  return sh->hosts >= 2 && sh->max_local >= 2;
}

/* Whether the hosts have the same number of ranks (GPU buffers run hier
 * only there). */
static inline int brg__hier_even(const brg__hier_shape *sh) {
  return sh->min_local == sh->max_local;
}

/* Makes the hierarchy's pieces (a collective over c; c->hier_state
 * 1 after, -1 when that failed, said on c). */
brg_status brg__hier_make(brg_comm *c, const brg__hier_shape *sh);

/* INFO, once per communicator and kind of choice (c->hier_logged). */
enum {
  BRG__LOGGED_FORCED_RING = 1,
  BRG__LOGGED_AUTO_RING = 2,
  BRG__LOGGED_AUTO_HIER = 4,
  BRG__LOGGED_FORCED_HIER = 8,
  BRG__LOGGED_SHAPE = 16,
  BRG__LOGGED_DEVICE = 32,
  BRG__LOGGED_CAPTURED = 64,
  BRG__LOGGED_CAPTURED_HIER = 128,
  BRG__LOGGED_AUTO_TREE = 256,
  BRG__LOGGED_AUTO_RHD = 512,
  BRG__LOGGED_FORCED_LAT = 1024,
  BRG__LOGGED_DEVICE_LAT = 2048,
  BRG__LOGGED_PIECES = 4096,
  BRG__LOGGED_STAGED_TREE = 8192,
  BRG__LOGGED_STAGED_RHD = 16384,
  BRG__LOGGED_UNSTAGED_CAPTURED = 32768,
};

/* 1 the first time `what` is asked on c. */
int brg__hier_first_time(brg_comm *c, unsigned what);

#endif
