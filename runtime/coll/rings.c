/*
 * Several rings (BRIGADE_RINGS, made at init by init.c): a large
 * collective cut into one part per ring, the parts run at once, each on its
 * ring's links (comm.c's brg__comm_piece_make) by its ring's thread; on GPU
 * buffers each part on a stream of its own, forked from the caller's
 * stream and joined back into it.
 */
#include <stdlib.h>

#include "exec.h"
#include "internal.h"
#include "schedule.h"

/* Part r of k's elements on ring r of `rings`: the same share of every
 * rank's block for reduce-scatter and all-gather, whose blocks stay where
 * they are in the full-size buffer (the part's stride is the call's
 * count); a contiguous share of the buffers otherwise. */
static brg__coll ring_part(const brg__coll *k, int rings, int r) {
  size_t esize = brg_dtype_size(k->dtype);
  size_t off = brg__part_offset(k->count, rings, r) * esize;
  brg__coll p = *k;
  p.exec = NULL; /* each part is its ring's leaf executor's */
  p.count = brg__part_count(k->count, rings, r);
  if (k->kind == BRG__COLL_REDUCE_SCATTER || k->kind == BRG__COLL_ALL_GATHER)
    p.stride = k->stride ? k->stride : k->count;
  /* a buffer a rank does not have (broadcast, reduce) stays NULL */
  p.sendbuf = k->sendbuf ? (const char *)k->sendbuf + off : NULL;
  p.recvbuf = k->recvbuf ? (char *)k->recvbuf + off : NULL;
  return p;
}

/* The collective k cut into one part per ring: parts 1..R-1 queued for
 * the rings' threads, part 0 here on this communicator's own ring. A part
 * that fails stops the others (the peers hear of it through this
 * communicator's ring sockets once the call fails), and the first failure
 * is the call's. */
brg_status brg__rings_run(brg_comm *c, brg__coll *k) {
  int rings = c->nrings;
  brg__req *parts = calloc((size_t)rings, sizeof *parts);
  void **streams = calloc((size_t)rings, sizeof *streams);
  if (!parts || !streams) {
    free(parts);
    free(streams);
    return brg__comm_error(c, BRG_ERR_NO_MEMORY, "out of memory for %d rings", rings);
  }
  /* Each ring's part on a stream of its own where the executor has
   * streams (GPU buffers), forked from the caller's and joined back into
   * it, so the rings run at once. */
  const brg__exec_ops *leaf = brg__exec_leaf(c, k);
  brg_status s = leaf->fork ? leaf->fork(c, k, rings, streams) : BRG_SUCCESS;
  if (s != BRG_SUCCESS) {
    free(parts);
    free(streams);
    return s;
  }
  for (int r = 1; r < rings; r++) {
    parts[r].coll = ring_part(k, rings, r);
    if (leaf->fork) parts[r].coll.stream = streams[r];
    brg__progress_enqueue(c->rings[r], &parts[r]);
  }
  brg__coll k0 = ring_part(k, rings, 0);
  k0.exec = brg__exec_leaf(c, &k0);
  s = k0.exec->run(c, &k0);
  k->seq = k0.seq;
  /* The others' peers hear why (the first failure names the rank that
   * caused it), not just that this rank stopped. */
  if (s != BRG_SUCCESS)
    for (int r = 1; r < rings; r++) brg__comm_stop_why(c->rings[r], brg_comm_last_error(c));
  for (int r = 1; r < rings; r++) {
    brg_status p = brg__progress_wait(&parts[r]);
    if (p == BRG_SUCCESS || s != BRG_SUCCESS) continue;
    s = brg__comm_error(c, p, "%s (ring %d of %d)", brg_comm_last_error(c->rings[r]), r, rings);
    for (int q = 1; q < rings; q++) brg__comm_stop_why(c->rings[q], brg_comm_last_error(c));
  }
  free(parts);
  free(streams);
  if (leaf->join) {
    brg_status j = leaf->join(c, k, rings);
    if (s == BRG_SUCCESS) s = j;
  }
  return s;
}

const brg__exec_ops brg__exec_rings = BRG__EXEC_COMPOSITE("rings", brg__rings_run);
