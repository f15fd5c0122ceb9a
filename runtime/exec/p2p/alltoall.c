/*
 * all_to_all: every rank sends a block to every other over point-to-point
 * (p2p.c), on a channel of its own (BRG__P2P_A2A), run by ring.c's engine
 * in issue order like every collective.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "kernels.h"

/* The call's failure so far: the first, except that a mismatch beats
 * anything else (a rank that found one leaves, and its peers should hear
 * why rather than that it went); `why` keeps its message. */
static void a2a_keep(brg_comm *c, brg_status *s, char *why, size_t n, brg_status st) {
  if (st == BRG_SUCCESS ||
      (*s != BRG_SUCCESS && (*s == BRG_ERR_MISMATCH || st != BRG_ERR_MISMATCH)))
    return;
  *s = st;
  snprintf(why, n, "%s", brg_comm_last_error(c));
}

/* Out of place every receive is posted first, so blocks land straight in
 * recvbuf; in place every block has left before any receive is posted.
 * The blocks' frames carry the collective's number, count and dtype, which
 * every receive checks: ranks that pass different counts or dtypes all
 * fail with BRG_ERR_MISMATCH (each rank receives from every other, so
 * each meets a rank that differs from it), and a block that does not fit
 * its receive is dropped, never written. So that every rank hears of a
 * mismatch, a failed send does not stop the others, and every receive is
 * waited for. ops[i] receives from rank r - i, ops[n + i] sends to
 * rank r + i. */
brg_status brg__p2p_all_to_all(brg_comm *c, const brg__coll *k) {
  int n = c->nranks, r = c->rank;
  size_t bytes = k->count * brg_dtype_size(k->dtype);
  int inplace = k->sendbuf == k->recvbuf;
  char fn[64], why[BRG__ERRLEN] = "";
  snprintf(fn, sizeof fn, "all_to_all #%llu", (unsigned long long)k->seq);
  brg__p2p_op *ops = calloc(2 * (size_t)n, sizeof *ops);
  if (!ops) return brg__comm_error(c, BRG_ERR_NO_MEMORY, "%s: out of memory", fn);
  const char *send = k->sendbuf;
  char *recv = k->recvbuf;
  brg_status s = BRG_SUCCESS;
  int posted = 0;
  for (int pass = 0; pass < 2; pass++) {
    if (pass == (inplace ? 1 : 0)) {
      for (int i = 1; i < n; i++) {
        int src = (r - i + n) % n;
        ops[i] = (brg__p2p_op){.buf = recv + (size_t)src * bytes,
                               .count = k->count,
                               .num = k->seq,
                               .peer = src,
                               .dtype = (uint32_t)k->dtype,
                               .chan = BRG__P2P_A2A};
        brg_status st = brg__p2p_post(c, &ops[i]);
        a2a_keep(c, &s, why, sizeof why, st);
        if (st != BRG_SUCCESS) break;
        posted = i;
      }
    } else {
      for (int i = 1; i < n; i++) {
        int dst = (r + i) % n;
        ops[n + i] = (brg__p2p_op){.buf = (char *)send + (size_t)dst * bytes,
                                   .count = k->count,
                                   .num = k->seq,
                                   .peer = dst,
                                   .dtype = (uint32_t)k->dtype,
                                   .chan = BRG__P2P_A2A,
                                   .is_send = 1};
        a2a_keep(c, &s, why, sizeof why, brg__p2p_isend(c, fn, &ops[n + i]));
      }
      /* In place the receives land where the blocks leave from. */
      for (int i = 1; i < n && inplace; i++)
        if (!__atomic_load_n(&ops[n + i].done, __ATOMIC_ACQUIRE) ||
            ops[n + i].status == BRG_SUCCESS)
          a2a_keep(c, &s, why, sizeof why, brg__p2p_wait(c, fn, &ops[n + i]));
    }
  }
  for (int i = 1; i <= posted; i++) a2a_keep(c, &s, why, sizeof why, brg__p2p_wait(c, fn, &ops[i]));
  for (int i = 1; i < n; i++) {
    brg__p2p_op *op = &ops[n + i];
    if (s == BRG_SUCCESS) {
      a2a_keep(c, &s, why, sizeof why, brg__p2p_wait(c, fn, op));
      continue;
    }
    /* Failed: the rest are taken back before their memory goes. */
    brg__p2p_cancel_send(c, op, s);
  }
  free(ops);
  if (s == BRG_SUCCESS) {
    if (!inplace && bytes)
      brg__copy(recv + (size_t)r * bytes, NULL, send + (size_t)r * bytes, bytes);
    return s;
  }
  /* The message of the failure kept, if a later one replaced it. */
  if (strcmp(why, brg_comm_last_error(c)) != 0) brg__comm_error(c, s, "%s", why);
  return s;
}
