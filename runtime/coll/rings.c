/*
 * Several rings (BRIGADE_RINGS, made at init by init.c): a large
 * collective cut into one part per ring, the parts run at once, each on its
 * ring's communicator and links; on GPU buffers each part on a stream of
 * its own, forked from the caller's stream and joined back into it.
 */
#include <stdlib.h>

#include "device.h"
#include "internal.h"
#include "schedule.h"

/* Whether k is cut over the communicator's rings: a host allreduce,
 * reduce-scatter, all-gather, broadcast or reduce that gives every ring at
 * least a slice (of each rank's block, for reduce-scatter and all-gather).
 * The count is the same on every rank, so every rank decides alike. */
static int rings_take(const brg_comm *c, const brg__coll *k) {
  int cut = k->kind == BRG__COLL_ALLREDUCE || k->kind == BRG__COLL_REDUCE_SCATTER ||
            k->kind == BRG__COLL_ALL_GATHER || k->kind == BRG__COLL_BROADCAST ||
            k->kind == BRG__COLL_REDUCE;
  /* GPU buffers too, also captured in a CUDA graph when every ring runs
   * kernel mode (the forks and joins of the rings' streams are captured
   * with the parts; ring 0's own kernel mode the capture check required). */
  int dev_ok = !k->device || c->nrings <= BRG__DEVICE_MAX_RINGS;
  for (int r = 1; k->device && k->captured && dev_ok && r < c->nrings; r++)
    dev_ok = brg__device_kernel_mode(__atomic_load_n(&c->rings[r]->dev, __ATOMIC_ACQUIRE));
  return c->nrings > 1 && dev_ok && cut && !k->whole &&
         k->count * brg_dtype_size(k->dtype) >= (size_t)c->nrings * c->slice_bytes;
}

void brg__rings_choose(const brg_comm *c, brg__coll *k) {
  if (!k->runner && rings_take(c, k)) k->runner = brg__rings_run;
}

/* Part r of k's elements on ring r of `rings`: the same share of every
 * rank's block for reduce-scatter and all-gather, whose blocks stay where
 * they are in the full-size buffer (the part's stride is the call's
 * count); a contiguous share of the buffers otherwise. */
static brg__coll ring_part(const brg__coll *k, int rings, int r) {
  size_t esize = brg_dtype_size(k->dtype);
  size_t off = brg__part_offset(k->count, rings, r) * esize;
  brg__coll p = *k;
  p.runner = NULL; /* each part is one ring's engine's */
  p.count = brg__part_count(k->count, rings, r);
  if (k->kind == BRG__COLL_REDUCE_SCATTER || k->kind == BRG__COLL_ALL_GATHER)
    p.stride = k->stride ? k->stride : k->count;
  /* a buffer a rank does not have (broadcast, reduce) stays NULL */
  p.sendbuf = k->sendbuf ? (const char *)k->sendbuf + off : NULL;
  p.recvbuf = k->recvbuf ? (char *)k->recvbuf + off : NULL;
  return p;
}

/* The collective k cut into one part per ring: parts 1..R-1 queued on the
 * rings' own communicators, whose threads run them, part 0 here on this
 * one's ring. A part that fails stops the others (their peers hear it on
 * each ring), and the first failure is the call's. */
brg_status brg__rings_run(brg_comm *c, brg__coll *k) {
  int rings = c->nrings;
  brg__req *parts = calloc((size_t)rings, sizeof *parts);
  if (!parts) return brg__comm_error(c, BRG_ERR_NO_MEMORY, "out of memory for %d rings", rings);
  /* GPU buffers: each ring's part on a stream of its own, forked from the
   * caller's stream and joined back into it, so the rings run at once. */
  void *streams[BRG__DEVICE_MAX_RINGS] = {0};
  brg_status s = k->device ? brg__device_fork(c, k->stream, rings, streams) : BRG_SUCCESS;
  if (s != BRG_SUCCESS) {
    free(parts);
    return s;
  }
  for (int r = 1; r < rings; r++) {
    parts[r].coll = ring_part(k, rings, r);
    if (k->device) parts[r].coll.stream = streams[r];
    brg__progress_enqueue(c->rings[r], &parts[r]);
  }
  brg__coll k0 = ring_part(k, rings, 0);
  s = brg__coll_execute(c, &k0);
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
  if (k->device) {
    brg_status j = brg__device_join(c, k->stream, rings);
    if (s == BRG_SUCCESS) s = j;
  }
  return s;
}
