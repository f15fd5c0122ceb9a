/*
 * The latency-bound allreduces (BRIGADE_ALGO=tree, rhd, or auto where the
 * cost model picks them), following schedule_lat.h over the
 * point-to-point links (p2p.c) on host buffers: GPU buffers' own host
 * copies where the policy staged them (device_exec.c's staged executor). Positions are the ring's
 * (host by host), so the short hops of both schedules stay within a host.
 *
 * The messages travel on p2p.c's links (shm within a host, tcp or
 * ibverbs between hosts), moved by this thread itself while it waits
 * (brg__p2p_drive_wait), not handed to the p2p thread: a hop costs what
 * the link costs, not two thread wake-ups.
 *
 * Every message of one allreduce travels on p2p's collective channel,
 * numbered by the collective: a rank posts its receives from a peer in the
 * order the peer sends to it, because both run the same program, step by
 * step, and a step sends at most one message to a given rank. A rank
 * whose call differs (count, dtype) meets BRG_ERR_MISMATCH at the first
 * message whose size differs.
 *
 * Every element ends with the same bits on every rank: the tree's root
 * computes it and sends it down; in rhd one rank reduces each block to the
 * end, and the doubling rounds and the unfolding only copy. BRG_AVG sums
 * throughout and divides once, where the block (or slice) is complete.
 */
#include <stdlib.h>
#include <string.h>

#include "exec.h"
#include "internal.h"
#include "kernels.h"
#include "schedule_lat.h"
#include "trace.h"

typedef struct lat {
  brg_comm *c;
  const brg__coll *k;
  size_t esize;
  char fn[64];
  brg__p2p_op *ops; /* every receive and send of the call */
  size_t nops, used;
  brg_status s; /* the first failure */
  char why[BRG__ERRLEN];
  /* Tracing only: each op's phase, round and tree (set in `tag` before
   * lat_op) and when a send was handed over. */
  struct lat_tag {
    int64_t t0;
    int16_t phase, tree;
    int32_t round;
  } * tags, tag;
} lat;

static void keep(lat *l, brg_status s) {
  if (s == BRG_SUCCESS || l->s != BRG_SUCCESS) return;
  l->s = s;
  snprintf(l->why, sizeof l->why, "%s", brg_comm_last_error(l->c));
}

/* A receive (is_send 0) or send of m elements at buf with the rank at
 * position pos; NULL once the call has failed. */
static brg__p2p_op *lat_op(lat *l, int pos, void *buf, size_t m, int is_send) {
  if (l->s != BRG_SUCCESS) return NULL;
  if (l->used == l->nops) {
    keep(l, brg__comm_error(l->c, BRG_ERR_INTERNAL, "%s: more than the %zu messages counted", l->fn,
                            l->nops));
    return NULL;
  }
  brg__p2p_op *op = &l->ops[l->used++];
  int64_t t0 = l->tags ? brg__now_ns() : 0;
  *op = (brg__p2p_op){.buf = buf,
                      .count = m,
                      .num = l->k->seq,
                      .peer = l->c->ring.order[pos],
                      .dtype = (uint32_t)l->k->dtype,
                      .chan = BRG__P2P_A2A,
                      .is_send = is_send};
  keep(l, is_send ? brg__p2p_isend(l->c, l->fn, op) : brg__p2p_post(l->c, op));
  if (l->tags) {
    l->tags[op - l->ops] = l->tag;
    l->tags[op - l->ops].t0 = t0;
  }
  return op;
}

static void lat_wait(lat *l, brg__p2p_op *op) {
  if (!op || l->s != BRG_SUCCESS) return;
  int64_t t0 = l->tags ? brg__now_ns() : 0;
  keep(l, brg__p2p_drive_wait(l->c, l->fn, op));
  if (l->tags && l->s == BRG_SUCCESS) {
    /* a receive: the wait for it; a send: from its hand-over until the
     * sending thread had written its last byte (op->last_ns) */
    const struct lat_tag *g = &l->tags[op - l->ops];
    int64_t t1 = brg__now_ns(), left = op->last_ns < t1 ? op->last_ns : t1;
    brg__trace_lat(l->c, op->is_send, op->peer, op->count * l->esize, g->phase, g->round, g->tree,
                   op->is_send ? g->t0 : t0, op->is_send ? left : t1, op->last_ns);
  }
}

/* brg__reduce, traced as a reduction of the current tag's phase. */
static void lat_reduce(lat *l, void *dst, const void *a, const void *b, size_t m, brg_op op) {
  int64_t t0 = l->tags ? brg__now_ns() : 0;
  brg__reduce(dst, NULL, a, b, m, l->k->dtype, op, l->c->nranks);
  if (l->tags)
    brg__trace_lat(l->c, 2, -1, m * l->esize, l->tag.phase, l->tag.round, l->tag.tree, t0,
                   brg__now_ns(), 0);
}

/* Scratch of the communicator, grown to `bytes`. */
static char *lat_scratch(lat *l, size_t bytes) {
  brg_comm *c = l->c;
  if (bytes > c->lat_scratch_bytes) {
    char *p = realloc(c->lat_scratch, bytes);
    if (!p) {
      keep(l, brg__comm_error(c, BRG_ERR_NO_MEMORY, "%s: out of memory for %zu bytes of scratch",
                              l->fn, bytes));
      return NULL;
    }
    c->lat_scratch = p;
    c->lat_scratch_bytes = bytes;
  }
  return c->lat_scratch;
}

/* Elements of half t of the buffer, as both trees cut it. */
static size_t half_off(size_t count, int t) {
  return brg__part_offset(count, 2, t);
}
static size_t half_cnt(size_t count, int t) {
  return brg__part_count(count, 2, t);
}

/*
 * Double binary tree, pipelined. Step i of the program does, for each tree
 * t, up(t, i) (slice i: receive the children's partial sums, add this
 * rank's input, send the sum to the parent; the root keeps the result)
 * and then down(t, i - lag) (receive the result from the parent, send it
 * to the children). The downs run `lag` slices behind the ups, so a rank
 * keeps slices going up while the first come back down. Every receive is
 * posted before the first step, in program order: the children's into
 * scratch, the parent's straight into the output.
 */
static void run_tree(lat *l) {
  brg_comm *c = l->c;
  const brg__coll *k = l->k;
  int n = c->nranks, pos = c->ring.pos;
  size_t es = l->esize, count = k->count;
  size_t se = brg__slice_elems(c, k);
  size_t slices[2], most = 0;
  brg__tree_node nd[2];
  for (int t = 0; t < 2; t++) {
    nd[t] = brg__dbtree_node(n, t, pos);
    slices[t] = half_cnt(count, t) ? brg__slice_total(half_cnt(count, t), se) : 0;
    if (slices[t] > most) most = slices[t];
  }
  /* A slice's round trip to the root and back is 2(D-1) hops: the ups run
   * that far ahead, and twice more, so that the links carry slices both
   * ways while the first come back (every receive is posted already). */
  size_t lag = 4 * (size_t)brg__dbtree_depth(n);
  if (lag > most) lag = most;
  /* the children's partial sums: scratch[t][child] holds half t */
  char *scratch = lat_scratch(l, 2 * (half_cnt(count, 0) + half_cnt(count, 1)) * es);
  if (!scratch) return;
  char *from_child[2][2];
  size_t at = 0;
  for (int t = 0; t < 2; t++)
    for (int ch = 0; ch < 2; ch++) {
      from_child[t][ch] = scratch + at * es;
      at += half_cnt(count, t);
    }
  /* ops: per tree and slice, 3 receives then 3 sends */
  brg__p2p_op **slot = calloc(2 * most * 6, sizeof *slot);
  if (!slot) {
    keep(l, brg__comm_error(c, BRG_ERR_NO_MEMORY, "%s: out of memory", l->fn));
    return;
  }
#define SLOT(t, i, j) slot[((size_t)(t)*most + (i)) * 6 + (j)]
  const char *in = k->sendbuf;
  char *out = k->recvbuf;
  brg_op mid = k->op == BRG_AVG ? BRG_SUM : k->op;
  /* the receives, step by step as below */
  for (size_t i = 0; i < most + lag; i++)
    for (int dir = 0; dir < 2; dir++)
      for (int t = 0; t < 2; t++) {
        size_t sl = dir == 0 ? i : i - lag;
        if ((dir == 1 && i < lag) || sl >= slices[t]) continue;
        size_t e = half_off(count, t) + brg__slice_offset(sl, se);
        size_t m = brg__slice_count(half_cnt(count, t), se, sl);
        size_t he = e - half_off(count, t);
        l->tag = (struct lat_tag){.phase = dir ? BRG__TRACE_DOWN : BRG__TRACE_UP,
                                  .tree = (int16_t)t,
                                  .round = (int32_t)sl};
        for (int ch = 0; dir == 0 && ch < 2; ch++)
          if (nd[t].child[ch] >= 0)
            SLOT(t, sl, ch) = lat_op(l, nd[t].child[ch], from_child[t][ch] + he * es, m, 0);
        if (dir == 1 && nd[t].parent >= 0)
          SLOT(t, sl, 2) = lat_op(l, nd[t].parent, out + e * es, m, 0);
      }
  for (size_t i = 0; i < most + lag && l->s == BRG_SUCCESS; i++)
    for (int dir = 0; dir < 2; dir++)
      for (int t = 0; t < 2 && l->s == BRG_SUCCESS; t++) {
        size_t sl = dir == 0 ? i : i - lag;
        if ((dir == 1 && i < lag) || sl >= slices[t]) continue;
        size_t e = half_off(count, t) + brg__slice_offset(sl, se);
        size_t m = brg__slice_count(half_cnt(count, t), se, sl);
        size_t he = e - half_off(count, t);
        const brg__tree_node *d = &nd[t];
        int root = d->parent < 0, kids = (d->child[0] >= 0) + (d->child[1] >= 0);
        l->tag = (struct lat_tag){.phase = dir ? BRG__TRACE_DOWN : BRG__TRACE_UP,
                                  .tree = (int16_t)t,
                                  .round = (int32_t)sl};
        if (dir == 0) {
          /* up: in (+) child 0 (+) child 1, the root's last addition final */
          const char *acc = in + e * es;
          int done = 0;
          for (int ch = 0; ch < 2; ch++) {
            if (d->child[ch] < 0) continue;
            lat_wait(l, SLOT(t, sl, ch));
            if (l->s != BRG_SUCCESS) break;
            int last = root && ++done == kids;
            lat_reduce(l, out + e * es, acc, from_child[t][ch] + he * es, m, last ? k->op : mid);
            acc = out + e * es;
          }
          if (root || l->s != BRG_SUCCESS) continue;
          SLOT(t, sl, 3) = lat_op(l, d->parent, (char *)acc, m, 1);
        } else {
          /* down: the result from the parent (the root has it) to the children */
          if (!root) lat_wait(l, SLOT(t, sl, 2));
          for (int ch = 0; ch < 2; ch++)
            if (d->child[ch] >= 0)
              SLOT(t, sl, 4 + ch) = lat_op(l, d->child[ch], out + e * es, m, 1);
        }
      }
  for (size_t i = 0; i < 2 * most * 6; i++)
    if (slot[i] && slot[i]->is_send) lat_wait(l, slot[i]);
#undef SLOT
  free(slot);
}

/* Elements of rhd blocks [lo, hi) of count cut into p2 blocks. */
static void rhd_range(size_t count, int p2, int lo, int hi, size_t *off, size_t *m) {
  *off = brg__part_offset(count, p2, lo);
  *m = brg__part_offset(count, p2, hi) - *off;
}

/* Recursive doubling alone (k->doubling, small calls): round j exchanges
 * the whole buffer with the halving round's partner, nearest first, each
 * received into its own part of `into` (count elements a round, posted
 * before the first send), and both partners reduce the lower virtual
 * rank's side first: every rank of a group holds the same bits, so every
 * rank ends with the same bits. */
static void rhd_doubling(lat *l, const brg__rhd *r, char *out, char *into) {
  const brg__coll *k = l->k;
  int n = l->c->nranks;
  size_t es = l->esize, count = k->count;
  brg_op mid = k->op == BRG_AVG ? BRG_SUM : k->op;
  brg__p2p_op *rx[32] = {0};
  for (int j = r->rounds - 1; j >= 0; j--) {
    int w = brg__rhd_partner(r->p2, r->vrank, j);
    l->tag = (struct lat_tag){.phase = BRG__TRACE_SWAP, .tree = -1, .round = j};
    rx[j] = lat_op(l, brg__rhd_pos(n, w), into + (size_t)j * count * es, count, 0);
  }
  for (int j = r->rounds - 1; j >= 0 && l->s == BRG_SUCCESS; j--) {
    int w = brg__rhd_partner(r->p2, r->vrank, j);
    char *theirs = into + (size_t)j * count * es;
    l->tag = (struct lat_tag){.phase = BRG__TRACE_SWAP, .tree = -1, .round = j};
    brg__p2p_op *tx = lat_op(l, brg__rhd_pos(n, w), out, count, 1);
    lat_wait(l, rx[j]);
    lat_wait(l, tx); /* out is read by the send until it is done */
    if (l->s != BRG_SUCCESS) break;
    brg_op op = j == 0 ? k->op : mid;
    if (r->vrank < w)
      lat_reduce(l, out, out, theirs, count, op);
    else
      lat_reduce(l, out, theirs, out, count, op);
  }
}

/* Recursive halving and doubling (schedule_lat.h): all on the output, the
 * partner's halves received into scratch and added; small calls by
 * recursive doubling alone (rhd_doubling). */
static void run_rhd(lat *l) {
  brg_comm *c = l->c;
  const brg__coll *k = l->k;
  int n = c->nranks;
  size_t es = l->esize, count = k->count;
  brg__rhd r = brg__rhd_of(n, c->ring.pos);
  char *out = k->recvbuf;
  brg_op mid = k->op == BRG_AVG ? BRG_SUM : k->op;
  l->tag = (struct lat_tag){.phase = BRG__TRACE_UNFOLD, .tree = -1};
  if (r.vrank < 0) { /* folds: its input to the odd position, the result back */
    brg__p2p_op *rx = lat_op(l, r.fold, out, count, 0);
    l->tag.phase = BRG__TRACE_FOLD;
    brg__p2p_op *tx = lat_op(l, r.fold, (char *)k->sendbuf, count, 1);
    lat_wait(l, tx);
    lat_wait(l, rx);
    return;
  }
  /* The fold's buffer, then every halving round's half: the windows
   * shrink by half, but a window of P/2 blocks may hold more than half
   * the elements (count < P), so P more; or every doubling round's buffer. */
  /* Doubling alone where the policy allows it (k->doubling) and every
   * block of the halving holds an element: with fewer elements than P
   * blocks, halving sends only the non-empty ones, fewer messages than
   * doubling's one a round on every rank (measured at 8 bytes from 4
   * ranks on). */
  int doubling = k->doubling && count >= (size_t)r.p2;
  size_t more = doubling ? (size_t)r.rounds * count : count + (size_t)r.p2;
  char *scratch = lat_scratch(l, (count + more) * es);
  if (!scratch) return;
  char *halves = scratch + count * es;
  if (r.fold >= 0) {
    l->tag.phase = BRG__TRACE_FOLD;
    brg__p2p_op *rx = lat_op(l, r.fold, scratch, count, 0);
    lat_wait(l, rx);
    if (l->s != BRG_SUCCESS) return;
    lat_reduce(l, out, k->sendbuf, scratch, count, mid);
  } else if (out != k->sendbuf) {
    brg__copy(out, NULL, k->sendbuf, count * es);
  }
  if (doubling) {
    rhd_doubling(l, &r, out, halves);
    l->tag = (struct lat_tag){.phase = BRG__TRACE_UNFOLD, .tree = -1};
    if (r.fold >= 0 && l->s == BRG_SUCCESS) lat_wait(l, lat_op(l, r.fold, out, count, 1));
    return;
  }
  /* Every exchange's receive, posted now (each partner's halving one, then
   * its doubling one), so that what comes early lands in place: a
   * doubling round receives into the window this rank sent away in the
   * halving round of the same partner, which the partner sends back only
   * after it has all of it. */
  brg__p2p_op *hrx[32] = {0}, *drx[32] = {0};
  size_t hoff[32], at = 0;
  for (int j = 0; j < r.rounds; j++) {
    int w = brg__rhd_partner(r.p2, r.vrank, j), lo, hi;
    size_t ko, km;
    brg__rhd_window(r.p2, r.vrank, j, &lo, &hi);
    rhd_range(count, r.p2, lo, hi, &ko, &km);
    hoff[j] = at;
    l->tag = (struct lat_tag){.phase = BRG__TRACE_HALVING, .tree = -1, .round = j};
    if (km) hrx[j] = lat_op(l, brg__rhd_pos(n, w), halves + at * es, km, 0);
    at += km;
  }
  for (int j = r.rounds - 1; j >= 0; j--) {
    int w = brg__rhd_partner(r.p2, r.vrank, j), plo, phi;
    size_t po, pm;
    brg__rhd_window(r.p2, w, j, &plo, &phi);
    rhd_range(count, r.p2, plo, phi, &po, &pm);
    l->tag = (struct lat_tag){.phase = BRG__TRACE_DOUBLING, .tree = -1, .round = j};
    if (pm) drx[j] = lat_op(l, brg__rhd_pos(n, w), out + po * es, pm, 0);
  }
  for (int j = 0; j < r.rounds && l->s == BRG_SUCCESS; j++) {
    int w = brg__rhd_partner(r.p2, r.vrank, j), lo, hi, plo, phi;
    brg__rhd_window(r.p2, r.vrank, j, &lo, &hi);
    brg__rhd_window(r.p2, w, j, &plo, &phi);
    size_t ko, km, so, sm;
    rhd_range(count, r.p2, lo, hi, &ko, &km);
    rhd_range(count, r.p2, plo, phi, &so, &sm);
    l->tag = (struct lat_tag){.phase = BRG__TRACE_HALVING, .tree = -1, .round = j};
    brg__p2p_op *tx = sm ? lat_op(l, brg__rhd_pos(n, w), out + so * es, sm, 1) : NULL;
    lat_wait(l, hrx[j]);
    if (l->s != BRG_SUCCESS) break;
    int last = j == r.rounds - 1;
    if (km)
      lat_reduce(l, out + ko * es, out + ko * es, halves + hoff[j] * es, km, last ? k->op : mid);
    lat_wait(l, tx);
  }
  for (int j = r.rounds - 1; j >= 0 && l->s == BRG_SUCCESS; j--) {
    int w = brg__rhd_partner(r.p2, r.vrank, j), lo, hi;
    brg__rhd_window(r.p2, r.vrank, j, &lo, &hi);
    size_t mo, mm;
    rhd_range(count, r.p2, lo, hi, &mo, &mm);
    l->tag = (struct lat_tag){.phase = BRG__TRACE_DOUBLING, .tree = -1, .round = j};
    brg__p2p_op *tx = mm ? lat_op(l, brg__rhd_pos(n, w), out + mo * es, mm, 1) : NULL;
    lat_wait(l, drx[j]);
    lat_wait(l, tx);
  }
  l->tag = (struct lat_tag){.phase = BRG__TRACE_UNFOLD, .tree = -1};
  if (r.fold >= 0 && l->s == BRG_SUCCESS) lat_wait(l, lat_op(l, r.fold, out, count, 1));
}

/* Operations a call may issue, at most. */
static size_t lat_ops_needed(const brg_comm *c, const brg__coll *k) {
  if (k->lat == BRG__ALGO_RHD) return 4 * (size_t)brg__log2_exact(brg__pow2_floor(c->nranks)) + 4;
  size_t se = brg__slice_elems(c, k);
  return 2 * 6 * (brg__slice_total(half_cnt(k->count, 0), se) + 1);
}

static brg_status lat_body(brg_comm *c, brg__coll *k) {
  lat l = {.c = c, .k = k, .esize = brg_dtype_size(k->dtype)};
  snprintf(l.fn, sizeof l.fn, "allreduce #%llu (%s)", (unsigned long long)k->seq,
           brg__algo_name(k->lat));
  c->ring.cur = k;
  if (c->nranks == 1 || k->count == 0) {
    if (k->count && k->recvbuf != k->sendbuf)
      brg__copy(k->recvbuf, NULL, k->sendbuf, k->count * l.esize);
    c->ring.cur = NULL;
    return BRG_SUCCESS;
  }
  l.nops = lat_ops_needed(c, k);
  l.ops = calloc(l.nops, sizeof *l.ops);
  if (c->trace) l.tags = calloc(l.nops, sizeof *l.tags); /* without: untraced */
  if (!l.ops) {
    free(l.tags);
    c->ring.cur = NULL;
    return brg__comm_error(c, BRG_ERR_NO_MEMORY, "%s: out of memory", l.fn);
  }
  /* This thread moves the messages on the links itself (p2p.c): a hop
   * costs no wake-up of the p2p thread and of this one. */
  brg__p2p_drive_begin(c);
  if (k->lat == BRG__ALGO_TREE)
    run_tree(&l);
  else
    run_rhd(&l);
  brg__p2p_drive_end(c);
  if (l.s != BRG_SUCCESS) {
    /* What is still posted or queued points into the caller's buffers and
     * the scratch: stopping the communicator makes every wait give it back,
     * and its peers hear the cause. The cause is said and the communicator
     * marked broken first, so that a call issued meanwhile (the
     * asynchronous mode's return before they run) reports it, not the
     * stop (progress.c). */
    if (strcmp(l.why, brg_comm_last_error(c)) != 0) brg__comm_error(c, l.s, "%s", l.why);
    __atomic_store_n(&c->broken, l.s, __ATOMIC_RELEASE);
    brg__comm_stop_why(c, l.why);
    for (size_t i = 0; i < l.used; i++)
      if (!__atomic_load_n(&l.ops[i].done, __ATOMIC_ACQUIRE))
        (void)brg__p2p_wait(c, l.fn, &l.ops[i]);
    if (strcmp(l.why, brg_comm_last_error(c)) != 0) brg__comm_error(c, l.s, "%s", l.why);
  }
  free(l.ops);
  free(l.tags);
  c->ring.cur = NULL;
  return l.s;
}

brg_status brg__lat_run(brg_comm *c, brg__coll *k) {
  k->seq = ++c->seq;
  return brg__trace_run(c, k, lat_body);
}

const brg__exec_ops brg__exec_lat = BRG__EXEC_COMPOSITE("lat", brg__lat_run);
