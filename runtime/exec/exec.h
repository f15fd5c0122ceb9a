/*
 * Executors: what runs a collective once it is issued. coll.c checks a
 * call and issues it, the policy (coll/policy.c, brg__exec_choose) picks its
 * executor once, at issue, into brg__coll.exec, progress.c orders the
 * calls and runs each through that executor without knowing which it is:
 *
 *   coll.c -> policy.c -> progress.c -> k->exec: setup, run, end
 *
 * Leaf executors run a call on one communicator's ring:
 *   brg__exec_host     the ring engine on host buffers (ring.c)
 *   brg__exec_step     step mode: the same engine on GPU buffers
 *   brg__exec_kernel   kernel mode: one launch per call
 *   brg__exec_single   GPU buffers on a one-rank communicator
 *   brg__exec_device   GPU buffers before the device ring is made: its
 *                      setup makes it, its run takes step or kernel mode
 *   brg__exec_staged   gather, scatter and (k->lat) lat.c's tree and rhd
 *                      allreduces on GPU buffers, through host copies
 *   brg__exec_staged_async  the same allreduces in the device ring's
 *                      asynchronous mode: on the communicator's thread,
 *                      the copies on the ring's stream
 * (the device ones in device_exec.c). Composite executors run a call as
 * calls of leaf executors on the communicator's pieces (comm.c's
 * brg__comm_piece_make), or over point-to-point links (lat), each
 * defined in the file of its run, with BRG__EXEC_COMPOSITE:
 *   brg__exec_hier     hier.c's phases on the hierarchy's pieces
 *   brg__exec_rings    rings.c's parts, one per ring
 *   brg__exec_lat      lat.c's tree and rhd over point-to-point links
 * A composite's hooks other than run are those of the leaf executor of
 * its buffers' memory on its communicator.
 */
#ifndef BRG_EXEC_H
#define BRG_EXEC_H

#include "internal.h"

/* What an executor's setup made current on the thread that runs a call,
 * for its end to undo: `entered` once it did (always, for an executor
 * with nothing to make current); a setup that fails before it leaves the
 * communicator as it was (the call did not run). */
typedef struct brg__exec_frame {
  int entered;
  int saved;
} brg__exec_frame;

typedef struct brg__exec_ops {
  const char *name;
  /* On the issuing thread: 1 when the call returns at once and runs later
   * on the communicator's thread, queued detached (device collectives of
   * the asynchronous mode); NULL: never. Such a call's begin runs on the
   * issuing thread with the queue's lock held (its place in the queue is
   * its place in the stream's order), between enter and leave (the GPU of
   * its buffers made current; enter keeps in *saved what leave restores). */
  int (*detached)(brg_comm *c, const brg__coll *k);
  brg_status (*enter)(brg_comm *c, const brg__coll *k, int *saved);
  void (*leave)(brg_comm *c, const brg__coll *k, int saved);
  brg_status (*begin)(brg_comm *c, brg__coll *k);
  /* On the thread that runs it, in issue order, before run: its context
   * made current (f) and what the executor must have made first (a
   * collective over the ring at the first call, on every rank alike).
   * NULL: nothing. */
  brg_status (*setup)(brg_comm *c, brg__coll *k, brg__exec_frame *f);
  /* The collective itself, to completion on the calling thread (on the
   * stream, for GPU buffers). */
  brg_status (*run)(brg_comm *c, brg__coll *k);
  /* After run with its status, or in its place when it never runs (f as
   * setup left it; zeroes where setup never ran). NULL: nothing. */
  void (*end)(brg_comm *c, brg__coll *k, brg_status s, brg__exec_frame *f);
  /* For a composite that runs `parts` parts of k at once (rings.c):
   * whether this executor can (parts_ok; NULL: yes), and streams of their
   * own for parts 1..parts-1 that start after k's stream holds now (fork),
   * k's stream continuing after all of them (join). NULL: the parts share
   * no stream. */
  int (*parts_ok)(const brg_comm *c, const brg__coll *k, int parts);
  brg_status (*fork)(brg_comm *c, const brg__coll *k, int parts, void **streams);
  brg_status (*join)(brg_comm *c, const brg__coll *k, int parts);
  /* buf[i] /= divisor for `count` elements of k's dtype in k's memory (on
   * its stream): BRG_AVG's division where a composite sums throughout
   * (hier.c). */
  brg_status (*divide)(brg_comm *c, const brg__coll *k, void *buf, size_t count, int divisor);
} brg__exec_ops;

extern const brg__exec_ops brg__exec_host;
extern const brg__exec_ops brg__exec_step, brg__exec_kernel, brg__exec_single, brg__exec_device,
    brg__exec_staged, brg__exec_staged_async;
extern const brg__exec_ops brg__exec_hier, brg__exec_rings, brg__exec_lat;

/* A composite executor (hier.c, rings.c, lat.c each define theirs): RUN
 * runs its parts; its other hooks are its leaf's, looked up at each
 * (progress.c). */
int brg__exec_leaf_detached(brg_comm *c, const brg__coll *k);
brg_status brg__exec_leaf_enter(brg_comm *c, const brg__coll *k, int *saved);
void brg__exec_leaf_leave(brg_comm *c, const brg__coll *k, int saved);
brg_status brg__exec_leaf_begin(brg_comm *c, brg__coll *k);
brg_status brg__exec_leaf_setup(brg_comm *c, brg__coll *k, brg__exec_frame *f);
void brg__exec_leaf_end(brg_comm *c, brg__coll *k, brg_status s, brg__exec_frame *f);
#define BRG__EXEC_COMPOSITE(NAME, RUN)                                                             \
  {                                                                                                \
    .name = (NAME), .detached = brg__exec_leaf_detached, .enter = brg__exec_leaf_enter,            \
    .leave = brg__exec_leaf_leave, .begin = brg__exec_leaf_begin, .setup = brg__exec_leaf_setup,   \
    .run = (RUN), .end = brg__exec_leaf_end                                                        \
  }

/* The policy, at issue: the executor of a checked call of the public API
 * (for the first device call, kernel mode's links between hosts; then
 * hier.c's choice for an allreduce, the
 * rings where they take it, else the leaf). May run a collective over c
 * (the hierarchy's pieces, kernel mode's links at their first
 * use), so every rank calls it at the same call. */
brg_status brg__exec_choose(brg_comm *c, brg__coll *k);
/* Kernel mode's links between hosts, for the first device call and for
 * brg_comm_device_setup (k->setup_only): before the device setup. */
brg_status brg__exec_device_links(brg_comm *c, brg__coll *k);
/* Then hands k to progress.c: the blocking call's issue. */
brg_status brg__exec_issue(brg_comm *c, brg__coll *k);
/* The leaf executor of k on c: where its buffers are, and for GPU buffers
 * the mode the device ring published (c->dev_exec). What progress.c gives
 * a call issued without one (the runtime's own calls, and the parts of a
 * composite's); in progress.c. */
const brg__exec_ops *brg__exec_leaf(const brg_comm *c, const brg__coll *k);

/* The communicator's side of the executors, for comm.c and stop.c: whether calls on
 * c may still run on a stream after they returned (the device ring is
 * made), whose work destroy then drains before the goodbyes; the drain
 * (the message on c); stopping what carries such work between hosts once
 * the neighbours said goodbye; freeing it; and the error such work met
 * after its call returned (brg_comm_get_async_error). */
int brg__exec_outlives(const brg_comm *c);
/* Stops c's work that waits outside the host engine (its kernels) at its
 * next wait; any thread (stop.c). */
void brg__exec_abort(brg_comm *c);
brg_status brg__exec_drain(brg_comm *c);
/* The word c's goodbye carries, and after both neighbours' goodbyes (or
 * their hang-ups) the last of the drain, given the larger of their words:
 * kernel mode's graph replays, on streams no call named, count the blocks
 * they began, so that a replay of this rank's still queued where a
 * neighbour's ran is waited for, and only then does the abort word stop
 * the ones that come later (device_watch.c). */
uint64_t brg__exec_bye_word(const brg_comm *c);
brg_status brg__exec_settle(brg_comm *c, uint64_t theirs);
void brg__exec_stop(brg_comm *c);
void brg__exec_free(brg_comm *c);
brg_status brg__exec_async_error(brg_comm *c);

/* ring.c: the ring engine on ring r of c (c's own: &c->ring) with the
 * payloads in `mem` (ring_link.h's brg__mem_ops; `dev` the device ring for
 * brg__mem_device, else NULL), inside the call's trace span. The host
 * executor's run is it with brg__mem_host on c's ring (brg__coll_execute). */
struct brg__mem_ops;
brg_status brg__ring_engine(brg_comm *c, brg__ring *r, brg__coll *k, const struct brg__mem_ops *mem,
                            struct brg__dev_ring *dev);

#endif
