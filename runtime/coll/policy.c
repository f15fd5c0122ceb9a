/*
 * The policy that picks a collective's executor once, at issue: the
 * hierarchy's choice (hier.c), the rings (rings.c) or the leaf executor
 * of its buffers' memory (exec.h).
 */
#include "exec.h"

/* Whether k is cut over the communicator's rings (BRIGADE_RINGS): a
 * allreduce, reduce-scatter, all-gather, broadcast or reduce that gives
 * every ring at least a slice (of each rank's block, for reduce-scatter
 * and all-gather), where its leaf executor can run the parts at once. The
 * count is the same on every rank, so every rank decides alike. */
static int rings_take(const brg_comm *c, const brg__coll *k, const brg__exec_ops *leaf) {
  int cut = k->kind == BRG__COLL_ALLREDUCE || k->kind == BRG__COLL_REDUCE_SCATTER ||
            k->kind == BRG__COLL_ALL_GATHER || k->kind == BRG__COLL_BROADCAST ||
            k->kind == BRG__COLL_REDUCE;
  int ok = c->nrings > 1 && cut && !k->whole &&
           k->count * brg_dtype_size(k->dtype) >= (size_t)c->nrings * c->slice_bytes;
  return ok && (!leaf->parts_ok || leaf->parts_ok(c, k, c->nrings));
}

/* The first device call's: kernel mode's links between hosts for this
 * communicator and its rings (comm/split.c), before the device setup that
 * uses them; brg_comm_device_setup's
 * (setup_only) asks each ring. */
brg_status brg__exec_device_links(brg_comm *c, brg__coll *k) {
  if ((c->devnet_state != 0 && !k->setup_only) || __atomic_load_n(&c->dev, __ATOMIC_ACQUIRE))
    return BRG_SUCCESS;
  brg_status s = brg__comm_devnet(c);
  for (int r = 1; s == BRG_SUCCESS && r < c->nrings; r++) s = brg__comm_devnet(c->rings[r]);
  return s;
}

brg_status brg__exec_choose(brg_comm *c, brg__coll *k) {
  const brg__exec_ops *leaf = brg__exec_leaf(c, k);
  brg_status s = leaf == &brg__exec_device ? brg__exec_device_links(c, k) : BRG_SUCCESS;
  if (s == BRG_SUCCESS && k->kind == BRG__COLL_ALLREDUCE) s = brg__hier_prepare(c, k);
  if (s != BRG_SUCCESS) return s;
  if (!k->exec && rings_take(c, k, leaf)) k->exec = &brg__exec_rings;
  if (!k->exec) k->exec = leaf;
  return BRG_SUCCESS;
}

brg_status brg__exec_issue(brg_comm *c, brg__coll *k) {
  brg_status s = brg__exec_choose(c, k);
  return s != BRG_SUCCESS ? s : brg__progress_run(c, k);
}
