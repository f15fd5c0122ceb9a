/*
 * The hierarchical allreduce (policy.c chooses it, by BRIGADE_ALGO or the
 * cost model, and has this file make its communicators): a flat ring's chain of 2(N-1)
 * steps crosses the network about 2H times; this pays 2(H-1) network
 * hops across H hosts and 2(L-1) cheap ones within a host of L ranks.
 *
 *    host 0: ranks a0 a1        host 1: ranks b0 b1
 *    1. reduce-scatter within each host: a0 holds chunk 0 of a0+a1,
 *       a1 chunk 1 (likewise b0, b1)
 *    2. allreduce of chunk l among the ranks of local index l on every
 *       host (a0 with b0, a1 with b1): L rings at once, each over its own
 *       links
 *    3. all-gather within each host
 *
 * A large host allreduce runs the three phases over pieces of the buffer
 * (BRIGADE_HIER_PIECES; hier_pipelined): piece p crosses hosts while the
 * host's communicator reduce-scatters piece p+1 and all-gathers piece p-1.
 *
 * Every element ends with the same bits on every rank: phase 2 is a ring
 * allreduce (bit-identical among its ranks) and phase 3 only copies.
 * BRG_AVG sums throughout and divides once, after phase 2, by N.
 *
 * The two pieces (this host's ranks; the ranks of this local index) come
 * from comm.c's brg__comm_piece_make at the first hier allreduce, issued
 * before it;
 * every rank gets there at the same collective because the choice depends
 * only on what all ranks share (count, dtype, the host table, BRIGADE_ALGO,
 * which comm.c checks is equal everywhere at init). One host, or one rank
 * on every host, runs the flat ring.
 *
 * Hosts with different numbers of ranks, C the fewest: C rings cross the
 * hosts (local indices 0..C-1), and on a host of more ranks, those of
 * index C and beyond are first reduced into the rank of their index
 * modulo C (a reduce within the host) and given the result last (a
 * broadcast):
 *
 *    host 0: a0 a1 a2    host 1: b0 b1      (C = 2)
 *    0. a2's buffer reduced into a0
 *    1-3. as above among a0 a1 and b0 b1
 *    4. a0 broadcasts the result to a2
 *
 * Where C is 1 the whole buffer crosses hosts on one ring of the hosts'
 * first ranks. Every rank still ends with the same bits: a2 gets a0's.
 *
 * GPU buffers run hier when BRIGADE_ALGO=hier asks, on hosts of equal rank
 * counts (auto keeps them on the flat ring: the cost model is the host
 * links'): the three phases are
 * device collectives on the caller's stream, one after the other, each on
 * its communicator's own device ring (kernel mode within the host, and
 * across hosts through kernel mode's host proxy), and BRG_AVG's division a
 * divide kernel on the same stream.
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"
#include "exec.h"
#include "hier.h"
#include "internal.h"
#include "kernels.h"
#include "model.h"
#include "schedule.h"
#include "settings.h"
#include "trace.h"

void brg__hier_shape_of(const brg_comm *c, brg__hier_shape *sh) {
  memset(sh, 0, sizeof *sh);
  sh->min_local = INT_MAX;
  int run = 0;
  for (int i = 0; i <= c->nranks; i++) {
    int r = i < c->nranks ? c->ring.order[i] : -1;
    if (i > 0 && (r < 0 || c->peers[r].host_hash != c->peers[c->ring.order[i - 1]].host_hash)) {
      if (run < sh->min_local) sh->min_local = run;
      if (run > sh->max_local) sh->max_local = run;
      if (sh->host == sh->hosts - 1) sh->host_ranks = run;
      run = 0;
    }
    if (r < 0) break;
    if (run == 0) sh->hosts++;
    if (r == c->rank) {
      sh->host = sh->hosts - 1;
      sh->local_rank = run;
    }
    run++;
  }
}

int brg__hier_first_time(brg_comm *c, unsigned what) {
  return !(__atomic_fetch_or(&c->hier_logged, what, __ATOMIC_RELAXED) & what);
}

/* BRIGADE_HIER_PIECES must be the same on every rank (the pieces are
 * collectives of their own): its largest and smallest value over the job,
 * through the hierarchy's pieces (the fold's, then across hosts,
 * then within the host, then the fold's again for its other ranks). */
static brg_status pieces_agree(brg_comm *c, brg_comm *const *comms, int *lo, int *hi) {
  int64_t v = brg__core_int(BRG__CORE_HIER_PIECES), m[2] = {v, -v};
  for (int i = 0; i < 4; i++) {
    if (!comms[i]) continue;
    brg__coll a = {.kind = BRG__COLL_ALLREDUCE, .sendbuf = m, .recvbuf = m, .count = 2};
    a.dtype = BRG_INT64;
    a.op = BRG_MAX;
    a.root = -1;
    brg_status s = brg__progress_run(comms[i], &a);
    if (s != BRG_SUCCESS)
      return brg__comm_error(c, s, "allreduce: comparing BRIGADE_HIER_PIECES across ranks: %s",
                             brg_comm_last_error(comms[i]));
  }
  *hi = (int)m[0];
  *lo = (int)-m[1];
  return BRG_SUCCESS;
}

/* The pieces of the hierarchy. C, the fewest ranks on a host, is
 * the number of rings across hosts: local index l < C joins `cross` (the
 * ranks of index l on every host) and `local` (the C such ranks of its
 * host; none where C is 1). Where a host has more than C ranks, each of
 * its ranks joins `fold`, the ranks of its host whose index is the same
 * modulo C, whose first rank (index l mod C) takes part for them all; on
 * hosts of C ranks there is no fold (nor anywhere when the hosts are even). */
brg_status brg__hier_make(brg_comm *c, const brg__hier_shape *sh) {
  brg_comm *local = NULL, *cross = NULL, *fold = NULL;
  int C = sh->min_local, l = sh->local_rank, part = l < C;
  /* No traces of their own: they would take the parent's file names, and
   * the parent's trace shows each hier allreduce as one collective. Each
   * keyed by the local index, so that rank l of `local` holds chunk l on
   * every host (the index is the place in the ring's stretch of the host,
   * which the rails may order otherwise than by rank). */
  brg_status s =
      brg__comm_piece_make(c, part && C > 1 ? sh->host : BRG_SPLIT_NOCOLOR, l, 0, &local);
  if (s == BRG_SUCCESS)
    s = brg__comm_piece_make(c, part ? l : BRG_SPLIT_NOCOLOR, sh->host, 0, &cross);
  if (s == BRG_SUCCESS && sh->min_local != sh->max_local)
    s = brg__comm_piece_make(c, sh->host_ranks > C ? sh->host * C + l % C : BRG_SPLIT_NOCOLOR, l, 0,
                             &fold);
  if (s != BRG_SUCCESS) {
    char why[BRG__ERRLEN];
    snprintf(why, sizeof why, "%s", brg_comm_last_error(NULL));
    if (local) brg_comm_destroy(local);
    if (cross) brg_comm_destroy(cross);
    c->hier_state = -1;
    return brg__comm_error(c, s,
                           "allreduce (BRIGADE_ALGO=%s): making the pieces of the "
                           "hierarchical allreduce failed: %s",
                           brg__algo_name(c->algo), why);
  }
  /* They never split further: their own allreduces take the flat ring. */
  brg_comm *made[] = {local, cross, fold};
  for (int i = 0; i < 3; i++) {
    if (!made[i]) continue;
    made[i]->algo = BRG__ALGO_RING;
    made[i]->hier_state = -1;
    made[i]->hier_logged = ~0u;
  }
  __atomic_store_n(&c->local, local, __ATOMIC_RELEASE);
  __atomic_store_n(&c->cross, cross, __ATOMIC_RELEASE);
  __atomic_store_n(&c->fold, fold, __ATOMIC_RELEASE);
  int lo = 0, hi = 0;
  brg_comm *order[4] = {fold, cross, local, fold};
  if ((s = pieces_agree(c, order, &lo, &hi)) != BRG_SUCCESS) {
    c->hier_state = -1;
    return s;
  }
  if (lo != hi) {
    c->hier_state = -1;
    return brg__comm_error(c, BRG_ERR_MISMATCH,
                           "allreduce (BRIGADE_ALGO=%s): collective mismatch (BRIGADE_HIER_PIECES "
                           "is %lld on rank %d, and from %d to %d across the ranks; every rank "
                           "must set the same)",
                           brg__algo_name(c->algo), (long long)brg__core_int(BRG__CORE_HIER_PIECES),
                           c->rank, lo, hi);
  }
  c->hier_state = 1;
  if (!fold && sh->min_local == sh->max_local)
    BRG__INFO("coll",
              "hierarchical allreduce: rank %d is rank %d of %d on host %d and rank %d of %d "
              "across hosts",
              c->rank, local->rank, local->nranks, sh->host, cross->rank, cross->nranks);
  else if (part)
    BRG__INFO("coll",
              "hierarchical allreduce on hosts of %d to %d ranks (%d ring(s) across hosts): "
              "rank %d (index %d of %d on host %d) is rank %d of %d across hosts, taking part "
              "for %d rank(s) of its host",
              sh->min_local, sh->max_local, C, c->rank, l, sh->host_ranks, sh->host, cross->rank,
              cross->nranks, fold ? fold->nranks : 1);
  else
    BRG__INFO("coll",
              "hierarchical allreduce on hosts of %d to %d ranks (%d ring(s) across hosts): "
              "rank %d (index %d of %d on host %d) is reduced into and given the result by "
              "local index %d",
              sh->min_local, sh->max_local, C, c->rank, l, sh->host_ranks, sh->host, l % C);
  return BRG_SUCCESS;
}

brg_status brg__hier_device_prepare(brg_comm *c, brg_comm **local, brg_comm **cross) {
  *local = *cross = NULL;
  if (c->algo != BRG__ALGO_HIER || c->hier_state < 0) return BRG_SUCCESS;
  brg__hier_shape sh;
  brg__hier_shape_of(c, &sh);
  if (!brg__hier_fits(&sh) || !brg__hier_even(&sh)) return BRG_SUCCESS;
  brg_status s = c->hier_state == 0 ? brg__hier_make(c, &sh) : BRG_SUCCESS;
  if (s != BRG_SUCCESS) return s;
  *local = c->local;
  *cross = c->cross;
  return BRG_SUCCESS;
}

/* The pieces of the hierarchy number their ranks apart (rank 1 of a
 * host's `local` is not rank 1 here). Their waits name ranks in this
 * communicator's numbering (ring_link.c), but a failure's text `why` may
 * hold other messages of theirs, of this rank's pieces and of the pieces
 * of the ranks it came through. The processes it names by pid ("rank R
 * (pid P on H)") are named in this communicator's numbering in `legend`,
 * once each: "pid P on H is rank W here; ...", or "" where it names none. */
static void name_pids(const brg_comm *c, const char *why, char *legend, size_t cap) {
  size_t len = 0;
  legend[0] = 0;
  for (const char *p = why; (p = strstr(p, "(pid ")); p++) {
    char host[64], one[128];
    int pid, used = 0;
    if (sscanf(p, "(pid %d on %63[^) ])%n", &pid, host, &used) != 2 || used == 0) continue;
    int who = -1;
    for (int r = 0; r < c->nranks && who < 0; r++)
      if (c->peers[r].pid == pid && !strncmp(c->peers[r].hostname, host, sizeof host)) who = r;
    snprintf(one, sizeof one, "pid %d on %s is rank %d here", pid, host, who);
    if (who < 0 || strstr(legend, one)) continue; /* not a rank here, or named already */
    int n = snprintf(legend + len, cap - len, "%s%s", len ? "; " : "", one);
    if (n < 0 || (size_t)n >= cap - len) {
      legend[len] = 0; /* no room: it ends at the last one that fitted */
      break;
    }
    len += (size_t)n;
  }
}

/* A phase's failure, as this communicator's error: the collective, the
 * phase, the processes named in this numbering, and why. */
static brg_status phase_failed(brg_comm *c, brg_status s, const brg__coll *k, const char *what,
                               const char *why) {
  char desc[160], legend[200];
  brg__coll_describe(desc, sizeof desc, k->kind, k->seq, k->count, k->dtype, k->op, k->root, 0);
  name_pids(c, why, legend, sizeof legend);
  if (!legend[0]) return brg__comm_error(c, s, "%s (hier): %s failed: %s", desc, what, why);
  return brg__comm_error(c, s,
                         "%s (hier): %s failed (%s; a rank named below without its pid may be "
                         "numbered by the hierarchy's pieces): %s",
                         desc, what, legend, why);
}

/* The hierarchical allreduce (policy.c chose it and made its
 * communicators):
 * runs one phase on a communicator of the hierarchy; a failure aborts both,
 * so that the ranks waiting on this one in the other phase hear of it, and
 * of why (a rank of another host gone silent, say, which a rank waiting
 * within its host cannot see for itself). */
static brg_status phase(brg_comm *c, brg_comm *sub, brg__coll *p, const brg__coll *k,
                        const char *what) {
  brg_status s = brg__progress_run(sub, p);
  if (s == BRG_SUCCESS) return s;
  char why[BRG__ERRLEN];
  snprintf(why, sizeof why, "%s", sub->last_error);
  brg__comm_stop_why(c->local, why);
  brg__comm_stop_why(c->cross, why);
  brg__comm_stop_why(c->fold, why);
  return phase_failed(c, s, k, what, why);
}

static uint64_t sent_of(brg_comm *const *subs) {
  uint64_t n = 0;
  for (int i = 0; i < 3; i++)
    if (subs[i]) n += __atomic_load_n(&subs[i]->bytes_sent, __ATOMIC_RELAXED);
  return n;
}

/* How many pieces the phases of a host allreduce overlap over
 * (BRIGADE_HIER_PIECES; automatic: pieces of at least two slices per rank
 * of the host, at most 8). */
static int hier_pieces(const brg_comm *local, const brg__coll *k) {
  int64_t want = brg__core_int(BRG__CORE_HIER_PIECES);
  if (k->device || !local) return 1;
  size_t bytes = k->count * brg_dtype_size(k->dtype);
  size_t per = 2 * (size_t)local->nranks * local->slice_bytes, n = per ? bytes / per : 1;
  if (want > 0)
    n = (size_t)want;
  else if (n > 8)
    n = 8;
  if (n > k->count / (size_t)local->nranks) n = k->count / (size_t)local->nranks;
  return n < 1 ? 1 : (int)n;
}

/* The reduce-scatter, the allreduce across hosts and the all-gather of
 * `pieces` pieces of the buffer, overlapped: local's thread runs the
 * reduce-scatter of piece p+1 and the all-gather of piece p-1 while this
 * thread runs piece p across hosts. local's queue holds rs 0, rs 1, ag 0,
 * rs 2, ag 1, ... on every rank alike. */
static brg_status hier_pipelined(brg_comm *c, const brg__coll *k, const brg__coll *dev,
                                 const char *in, int pieces) {
  brg_comm *local = c->local, *cross = c->cross;
  size_t esize = brg_dtype_size(k->dtype);
  brg__req *rs = calloc((size_t)pieces, sizeof *rs), *ag = calloc((size_t)pieces, sizeof *ag);
  if (!rs || !ag) {
    free(rs);
    free(ag);
    return brg__comm_error(c, BRG_ERR_NO_MEMORY, "out of memory for %d pieces of hier", pieces);
  }
  for (int p = 0; p < pieces; p++) {
    size_t off = brg__part_offset(k->count, pieces, p) * esize;
    rs[p].coll = *dev;
    rs[p].coll.kind = BRG__COLL_REDUCE_SCATTER;
    rs[p].coll.count = brg__part_count(k->count, pieces, p);
    rs[p].coll.sendbuf = in + off;
    rs[p].coll.recvbuf = (char *)k->recvbuf + off;
    rs[p].coll.whole = 1;
    ag[p].coll = rs[p].coll;
    ag[p].coll.kind = BRG__COLL_ALL_GATHER;
    ag[p].coll.op = BRG_SUM;
    ag[p].coll.sendbuf = ag[p].coll.recvbuf;
  }
  if (brg__hier_first_time(c, BRG__LOGGED_PIECES))
    BRG__INFO("coll",
              "hierarchical allreduce in %d pieces (first at %zu bytes; BRIGADE_HIER_PIECES): "
              "one piece crosses hosts while the next is reduce-scattered within the host",
              pieces, k->count * esize);
  brg_status s = BRG_SUCCESS;
  const char *what = NULL;
  int queued_rs = 1, queued_ag = 0;
  brg__progress_enqueue(local, &rs[0]);
  for (int p = 0; p < pieces && s == BRG_SUCCESS; p++) {
    if ((s = brg__progress_wait(&rs[p])) != BRG_SUCCESS) {
      what = "the reduce-scatter within the host";
      break;
    }
    if (p + 1 < pieces) {
      brg__progress_enqueue(local, &rs[p + 1]);
      queued_rs++;
    }
    size_t n = rs[p].coll.count;
    size_t off = brg__part_offset(n, local->nranks, local->rank);
    size_t cnt = brg__part_count(n, local->nranks, local->rank);
    char *shard = (char *)rs[p].coll.recvbuf + off * esize;
    if (cnt > 0) {
      brg__coll ar = *dev;
      ar.kind = BRG__COLL_ALLREDUCE;
      ar.sendbuf = shard;
      ar.recvbuf = shard;
      ar.count = cnt;
      if ((s = phase(c, cross, &ar, k, "the allreduce across hosts")) != BRG_SUCCESS) break;
      if (k->op == BRG_AVG) brg__divide(shard, shard, cnt, k->dtype, c->nranks);
    }
    brg__progress_enqueue(local, &ag[p]);
    queued_ag++;
  }
  /* Every piece queued is waited for (it points into this frame); a
   * failure stopped local (phase) or is stopped here, so they end soon. */
  if (s != BRG_SUCCESS && what) {
    char why[BRG__ERRLEN];
    snprintf(why, sizeof why, "%s", local->last_error);
    brg__comm_stop_why(local, why);
    brg__comm_stop_why(cross, why);
  }
  for (int p = 0; p < queued_rs; p++) {
    brg_status q = brg__progress_wait(&rs[p]);
    if (s == BRG_SUCCESS && q != BRG_SUCCESS) s = q, what = "the reduce-scatter within the host";
  }
  for (int p = 0; p < queued_ag; p++) {
    brg_status q = brg__progress_wait(&ag[p]);
    if (s == BRG_SUCCESS && q != BRG_SUCCESS) s = q, what = "the all-gather within the host";
  }
  free(rs);
  free(ag);
  if (s != BRG_SUCCESS && what) {
    char why[BRG__ERRLEN];
    snprintf(why, sizeof why, "%s", local->last_error);
    brg__comm_stop_why(local, why);
    brg__comm_stop_why(cross, why);
    return phase_failed(c, s, k, what, why);
  }
  return s;
}

/* On uneven hosts a rank of a fold takes part for it: the fold's reduce
 * into its first rank comes first, its broadcast from there last; the
 * ranks of index C and beyond wait in that broadcast meanwhile. Where
 * C is 1 there is no reduce-scatter within the host: the whole buffer
 * crosses hosts. */
static brg_status hier_body(brg_comm *c, brg__coll *k) {
  brg_comm *local = c->local, *cross = c->cross, *fold = c->fold;
  brg_comm *subs[3] = {local, cross, fold};
  size_t esize = brg_dtype_size(k->dtype);
  uint64_t sent0 = sent_of(subs);
  brg_op sum = k->op == BRG_AVG ? BRG_SUM : k->op;
  /* GPU buffers: every phase a device collective on the caller's stream. */
  brg__coll dev = {
      .device = k->device, .gpu = k->gpu, .stream = k->stream, .captured = k->captured};
  dev.dtype = k->dtype;
  dev.op = sum;
  dev.root = -1;
  dev.count = k->count;
  brg_status s = BRG_SUCCESS;
  const char *in = k->sendbuf; /* what the phase across hosts starts from */
  int part = !fold || fold->rank == 0;
  if (fold) {
    brg__coll rd = dev;
    rd.kind = BRG__COLL_REDUCE;
    rd.root = 0;
    rd.sendbuf = k->sendbuf;
    rd.recvbuf = part ? k->recvbuf : NULL;
    if ((s = phase(c, fold, &rd, k, "the reduce within the host")) != BRG_SUCCESS) return s;
    in = k->recvbuf;
  }
  int pieces = part ? hier_pieces(local, k) : 1;
  if (part && pieces > 1) {
    if ((s = hier_pipelined(c, k, &dev, in, pieces)) != BRG_SUCCESS) return s;
  } else if (part) {
    /* This rank's chunk, as the reduce-scatter cut it (all of it without one). */
    size_t off = 0, cnt = k->count;
    if (local) {
      brg__coll rs = dev;
      rs.kind = BRG__COLL_REDUCE_SCATTER;
      rs.sendbuf = in;
      rs.recvbuf = k->recvbuf;
      rs.whole = 1;
      if ((s = phase(c, local, &rs, k, "the reduce-scatter within the host")) != BRG_SUCCESS)
        return s;
      in = k->recvbuf;
      off = brg__part_offset(k->count, local->nranks, local->rank);
      cnt = brg__part_count(k->count, local->nranks, local->rank);
    }
    char *shard = (char *)k->recvbuf + off * esize;
    if (cnt > 0) { /* the same on every rank of cross: all of them skip it */
      brg__coll ar = dev;
      ar.kind = BRG__COLL_ALLREDUCE;
      ar.sendbuf = in + off * esize;
      ar.recvbuf = shard;
      ar.count = cnt;
      if ((s = phase(c, cross, &ar, k, "the allreduce across hosts")) != BRG_SUCCESS) return s;
      if (k->op == BRG_AVG) s = brg__exec_leaf(c, k)->divide(c, k, shard, cnt, c->nranks);
      if (s != BRG_SUCCESS) return s;
    }
    if (local) {
      brg__coll ag = dev;
      ag.kind = BRG__COLL_ALL_GATHER;
      ag.op = BRG_SUM;
      ag.sendbuf = k->recvbuf;
      ag.recvbuf = k->recvbuf;
      ag.whole = 1;
      if ((s = phase(c, local, &ag, k, "the all-gather within the host")) != BRG_SUCCESS) return s;
    }
  }
  if (fold) {
    brg__coll bc = dev;
    bc.kind = BRG__COLL_BROADCAST;
    bc.op = BRG_SUM;
    bc.root = 0;
    bc.sendbuf = part ? k->recvbuf : NULL;
    bc.recvbuf = k->recvbuf;
    if ((s = phase(c, fold, &bc, k, "the broadcast within the host")) != BRG_SUCCESS) return s;
  }
  __atomic_fetch_add(&c->bytes_sent, sent_of(subs) - sent0, __ATOMIC_RELAXED);
  return BRG_SUCCESS;
}

brg_status brg__hier_run(brg_comm *c, brg__coll *k) {
  k->seq = ++c->seq;
  return brg__trace_run(c, k, hier_body);
}

const brg__exec_ops brg__exec_hier = BRG__EXEC_COMPOSITE("hier", brg__hier_run);
