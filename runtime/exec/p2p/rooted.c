/*
 * gather and scatter: the rooted collectives that move blocks, not sums.
 *
 * Each block goes straight between the root and its rank on the
 * point-to-point links (p2p.c), on the channel all_to_all uses, numbered
 * by the collective:
 *
 *   gather:   rank j --block j--> root      (root: recvbuf[j])
 *   scatter:  root --sendbuf[j]--> rank j   (rank j: recvbuf)
 *
 * One step: the root's link carries N - 1 blocks either way, as many as a
 * ring through the root would, without the ring's N - 1 hops of latency.
 * ring.c's engine runs these in issue order after a header-only slot to
 * the next rank, which catches a neighbour that called something else;
 * the blocks' own headers catch ranks that differ in count or dtype.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"
#include "internal.h"
#include "kernels.h"

/* Keeps the call's first failure, except that a mismatch beats anything
 * else; `why` keeps its message for the end. */
static void keep(brg_comm *c, brg_status *s, char *why, size_t n, brg_status st) {
  if (st == BRG_SUCCESS ||
      (*s != BRG_SUCCESS && (*s == BRG_ERR_MISMATCH || st != BRG_ERR_MISMATCH)))
    return;
  *s = st;
  snprintf(why, n, "%s", brg_comm_last_error(c));
}

/* The root posts a receive from every other rank, or queues a send to
 * every other rank; then waits for all of them (each finishes, or fails at
 * the communicator's timeout and is withdrawn), so nothing is left to land
 * in the caller's buffers after the call returns. */
static brg_status root_side(brg_comm *c, const brg__coll *k, const char *fn, int gather) {
  int n = c->nranks, r = c->rank;
  size_t bytes = k->count * brg_dtype_size(k->dtype);
  brg__p2p_op *ops = calloc((size_t)n, sizeof *ops);
  if (!ops) return brg__comm_error(c, BRG_ERR_NO_MEMORY, "%s: out of memory", fn);
  char why[BRG__ERRLEN] = "";
  brg_status s = BRG_SUCCESS;
  int issued = 0;
  for (int i = 1; i < n; i++) {
    int peer = (r + i) % n;
    char *block = gather ? (char *)k->recvbuf + (size_t)peer * bytes
                         : (char *)k->sendbuf + (size_t)peer * bytes;
    ops[i] = (brg__p2p_op){.buf = block,
                           .count = k->count,
                           .num = k->seq,
                           .peer = peer,
                           .dtype = (uint32_t)k->dtype,
                           .chan = BRG__P2P_A2A,
                           .is_send = !gather};
    brg_status st = gather ? brg__p2p_post(c, &ops[i]) : brg__p2p_isend(c, fn, &ops[i]);
    keep(c, &s, why, sizeof why, st);
    if (st != BRG_SUCCESS && gather) break; /* a receive that was never posted */
    issued = i;
  }
  for (int i = 1; i <= issued; i++) keep(c, &s, why, sizeof why, brg__p2p_wait(c, fn, &ops[i]));
  free(ops);
  if (s != BRG_SUCCESS) {
    if (strcmp(why, brg_comm_last_error(c)) != 0) brg__comm_error(c, s, "%s", why);
    return s;
  }
  /* The root's own block, unless it is in place already. */
  if (gather)
    brg__copy((char *)k->recvbuf + (size_t)r * bytes, NULL, k->sendbuf, bytes);
  else
    brg__copy(k->recvbuf, NULL, (const char *)k->sendbuf + (size_t)r * bytes, bytes);
  return BRG_SUCCESS;
}

brg_status brg__rooted_run(brg_comm *c, const brg__coll *k) {
  int gather = k->kind == BRG__COLL_GATHER;
  char fn[64];
  snprintf(fn, sizeof fn, "%s #%llu", brg__coll_name(k->kind), (unsigned long long)k->seq);
  if (c->rank == k->root) return root_side(c, k, fn, gather);
  if (gather)
    return brg__p2p_send(c, fn, BRG__P2P_A2A, k->seq, k->sendbuf, k->count, k->dtype, k->root);
  brg__p2p_op op = {.buf = k->recvbuf,
                    .count = k->count,
                    .num = k->seq,
                    .peer = k->root,
                    .dtype = (uint32_t)k->dtype,
                    .chan = BRG__P2P_A2A};
  brg_status s = brg__p2p_post(c, &op);
  return s != BRG_SUCCESS ? s : brg__p2p_wait(c, fn, &op);
}
