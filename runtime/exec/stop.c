/*
 * Stopping a communicator: what brg_comm_abort does below the API, and
 * what the runners (lat.c, hier.c, rings.c) and destroy (comm.c) call when
 * a collective fails in a way its peers must hear of.
 */
#include <pthread.h>

#include "exec.h"
#include "internal.h"

void brg__comm_tell(brg_comm *c, brg_status s, const char *why) {
  brg__comm_notify_abort(c, s, why);
  brg__p2p_notify(c, why);
}

/* What brg_comm_abort does, below it: every wait of this communicator
 * stops (its engine's, its queue's, its kernels', its point-to-point
 * ones), the ranks it has links with hear of it (brg__comm_tell), and so
 * do the communicators it runs its collectives on (rings, hierarchy),
 * each told `why`. Any thread. */
void brg__comm_stop_why(brg_comm *c, const char *why) {
  if (!c) return;
  __atomic_store_n(&c->aborted, 1, __ATOMIC_SEQ_CST);
  brg__exec_abort(c);
  brg__fifo_wake_all(&c->ring.send.fifo);
  brg__fifo_wake_all(&c->ring.recv.fifo);
  brg__p2p_abort(c);
  pthread_mutex_lock(&c->qlock);
  pthread_cond_broadcast(&c->qcond);
  pthread_cond_broadcast(&c->donecond);
  pthread_mutex_unlock(&c->qlock);
  brg__comm_tell(c, BRG_ERR_REMOTE, why);
  brg__comm_stop_why(__atomic_load_n(&c->local, __ATOMIC_ACQUIRE), why);
  brg__comm_stop_why(__atomic_load_n(&c->cross, __ATOMIC_ACQUIRE), why);
  brg__comm_stop_why(__atomic_load_n(&c->fold, __ATOMIC_ACQUIRE), why);
  /* Kernel mode's net ring: its proxy stops with the kernels (above);
   * a wait of it on a link looks again. */
  brg__ring *net = __atomic_load_n(&c->netring, __ATOMIC_ACQUIRE);
  if (net) {
    brg__fifo_wake_all(&net->send.fifo);
    brg__fifo_wake_all(&net->recv.fifo);
  }
  for (int r = 1; r < c->nrings; r++) brg__comm_stop_why(c->rings[r], why);
}

void brg__comm_stop(brg_comm *c) {
  brg__comm_stop_why(c, "the communicator was aborted");
}
