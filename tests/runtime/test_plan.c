/*
 * One plan, its executors: the ring schedule of schedule.h (brg__sched) as
 * the host engine walks it (runtime/exec/host/ring.c, brg__ring_walk: the host and
 * step mode's GPU buffers alike, through brg__mem_ops) and as kernel
 * mode's ring kernel walks it (ring_kernel.cuh, brg_rk::walk, compiled for
 * the CPU in plan_kernel.cc), both recorded instead of run, against a
 * reference walk written here from the schedule's table (schedule.h's
 * header): every step's primitive, input and output offsets, element
 * count and step must be the same, in the same order.
 *
 * Every collective of the ring and the chain (allreduce, barrier,
 * reduce-scatter and all-gather in blocks, at a stride and whole,
 * broadcast and reduce from every root), in place and out of place, at
 * N = 1..9 on a ring whose order is not the rank order, every position,
 * uneven counts (0, 1, primes, N - 1, N + 1, 3N + 2) and slices of 1, 4,
 * 7 and 64 elements; the kernel's walk also cut over 2 and 3 channels.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan_record.h"
#include "ring_link.h"

#define CAP 65536

static plan_rec host_recs[CAP], kern_recs[CAP], ref_recs[CAP];
static size_t host_n;
static int failures;

/* The host engine's executor: its memory ops write each step down. */
static char dummy_slot[64];
static uint64_t rec_piece(const brg__ring_op *o, int send) {
  (void)o, (void)send;
  return UINT64_MAX;
}
static brg_status rec_recv(brg__ring_op *o, size_t shift, uint64_t bytes, const char **r) {
  (void)o, (void)shift, (void)bytes;
  *r = dummy_slot;
  return BRG_SUCCESS;
}
static brg_status rec_send(brg__ring_op *o, size_t shift, uint64_t bytes, char **slot) {
  (void)o, (void)shift, (void)bytes;
  *slot = dummy_slot;
  return BRG_SUCCESS;
}
static brg_status rec_apply(brg__ring_op *o, brg__prim prim, const char *in, char *out,
                            const char *r, char *slot, size_t m, const void **payload) {
  (void)r, (void)slot, (void)payload;
  if (host_n < CAP) {
    plan_rec *x = &host_recs[host_n];
    x->prim = (int)prim;
    x->step = o->r->cur_step;
    x->in = in ? (long)((in - (const char *)o->coll->sendbuf) / (long)o->esize) : -1;
    x->out = out ? (long)((out - (char *)o->coll->recvbuf) / (long)o->esize) : -1;
    x->count = m;
  }
  host_n++;
  return BRG_SUCCESS;
}
static brg_status rec_sent(brg__ring_op *o, uint64_t bytes, const void *payload) {
  (void)o, (void)bytes, (void)payload;
  return BRG_SUCCESS;
}
static brg_status rec_received(brg__ring_op *o) {
  (void)o;
  return BRG_SUCCESS;
}
static const brg__mem_ops rec_mem = {.name = "record",
                                     .piece = rec_piece,
                                     .recv = rec_recv,
                                     .send = rec_send,
                                     .apply = rec_apply,
                                     .sent = rec_sent,
                                     .received = rec_received};

typedef struct call {
  brg__coll_kind kind;
  int n, pos, root, whole, inplace;
  const int *ring;
  size_t count, stride, slice;
  const float *send;
  float *recv;
} call;

static void rec_push(plan_rec *out, size_t *k, brg__prim prim, int step, const float *send,
                     const float *recv, const float *in, const float *o, size_t m) {
  if (*k < CAP)
    out[*k] = (plan_rec){.prim = (int)prim,
                         .step = step,
                         .in = in ? (long)(in - send) : -1,
                         .out = o ? (long)(o - recv) : -1,
                         .count = m};
  (*k)++;
}

static size_t ref_part_count(size_t count, int parts, int i) {
  return count / (size_t)parts + ((size_t)i < count % (size_t)parts);
}
static size_t ref_part_offset(size_t count, int parts, int i) {
  size_t off = 0;
  for (int j = 0; j < i; j++) off += ref_part_count(count, parts, j);
  return off;
}

/* Channel ch of nch's part of rank id's chunk (ring collectives). */
static size_t ref_piece(const call *cl, int nch, int ch, int id, size_t *off) {
  size_t share = ref_part_count(cl->count, nch, ch), base = ref_part_offset(cl->count, nch, ch);
  if (cl->kind != BRG__COLL_REDUCE_SCATTER && cl->kind != BRG__COLL_ALL_GATHER) {
    *off = base + ref_part_offset(share, cl->n, id);
    return ref_part_count(share, cl->n, id);
  }
  if (!cl->whole) {
    *off = (cl->stride ? cl->stride : cl->count) * (size_t)id + base;
    return share;
  }
  size_t blk = ref_part_count(cl->count, cl->n, id);
  *off = ref_part_offset(cl->count, cl->n, id) + ref_part_offset(blk, nch, ch);
  return ref_part_count(blk, nch, ch);
}

static size_t ref_slices(size_t cnt, size_t se) {
  return cnt == 0 ? 1 : (cnt + se - 1) / se;
}

/* The reference: schedule.h's table, step by step. */
static size_t ref_walk(const call *cl, int nch, int ch, plan_rec *out) {
  int n = cl->n, p = cl->pos;
  size_t k = 0, se = cl->slice;
  const float *send = cl->send;
  float *recv = cl->recv;
  if (n < 2) return 0;
  size_t share = ref_part_count(cl->count, nch, ch), base = ref_part_offset(cl->count, nch, ch);
  if (cl->kind == BRG__COLL_BROADCAST || cl->kind == BRG__COLL_REDUCE) {
    int bcast = cl->kind == BRG__COLL_BROADCAST, rp = 0;
    for (int i = 0; i < n; i++)
      if (cl->ring[i] == cl->root) rp = i;
    /* broadcast: the root's position sends first; reduce: the one after
     * it, so that the root receives last */
    int hop = ((p - (bcast ? rp : rp + 1)) % n + 2 * n) % n;
    brg__prim prim = hop == 0      ? BRG__PRIM_SEND
                     : hop < n - 1 ? (bcast ? BRG__PRIM_RECV_COPY_SEND : BRG__PRIM_RECV_REDUCE_SEND)
                     : bcast       ? BRG__PRIM_RECV
                                   : BRG__PRIM_RECV_REDUCE_COPY;
    for (size_t sl = 0; sl < ref_slices(share, se); sl++) {
      size_t e = base + sl * se, m = e - base < share ? share - (e - base) : 0;
      if (m > se) m = se;
      const float *in = bcast && hop != 0 ? NULL : send + e;
      float *o = recv + e;
      if (bcast && hop == 0 && cl->inplace) o = NULL; /* the root fills its own output */
      if (!bcast && hop != n - 1) o = NULL;
      rec_push(out, &k, prim, hop, send, recv, in, o, m);
    }
    return k;
  }
  int rs = cl->kind == BRG__COLL_REDUCE_SCATTER, ag = cl->kind == BRG__COLL_ALL_GATHER;
  int t0 = ag ? n - 1 : 0, t1 = rs ? n - 1 : 2 * n - 2;
  size_t max_sl = 0, off;
  for (int i = 0; i < n; i++) {
    size_t s = ref_slices(ref_piece(cl, nch, ch, i, &off), se);
    if (s > max_sl) max_sl = s;
  }
  for (size_t sl = 0; sl < max_sl; sl++)
    for (int t = t0; t <= t1; t++) {
      int id = cl->ring[((p - 1 - t) % n + 2 * n) % n];
      size_t cnt = ref_piece(cl, nch, ch, id, &off);
      if (sl >= ref_slices(cnt, se)) continue;
      size_t m = sl * se < cnt ? cnt - sl * se : 0;
      if (m > se) m = se;
      size_t e = off + sl * se, own = cl->whole ? e : base + sl * se;
      brg__prim prim = t == 0          ? BRG__PRIM_SEND
                       : t < n - 1     ? BRG__PRIM_RECV_REDUCE_SEND
                       : t == n - 1    ? BRG__PRIM_RECV_REDUCE_COPY_SEND
                       : t < 2 * n - 2 ? BRG__PRIM_RECV_COPY_SEND
                                       : BRG__PRIM_RECV;
      const float *in = send ? send + e : NULL;
      float *o = recv ? recv + e : NULL;
      if (rs) {
        o = t == t1 ? recv + own : NULL;
        if (t == t1) prim = BRG__PRIM_RECV_REDUCE_COPY;
      } else if (ag) {
        in = t == t0 ? send + own : NULL;
        if (t == t0) prim = BRG__PRIM_SEND;
      } else if (prim == BRG__PRIM_SEND) {
        o = NULL;
      }
      rec_push(out, &k, prim, t, send, recv, in, o, m);
    }
  return k;
}

static size_t host_walk(const call *cl) {
  brg_comm *c = calloc(1, sizeof *c);
  c->nranks = cl->n;
  c->ring.pos = cl->pos;
  c->ring.order = (int *)cl->ring;
  brg__coll k = {.kind = cl->kind,
                 .dtype = BRG_FLOAT32,
                 .op = BRG_SUM,
                 .root = cl->root,
                 .whole = (unsigned char)cl->whole,
                 .sendbuf = cl->send,
                 .recvbuf = cl->recv,
                 .count = cl->count,
                 .stride = cl->stride};
  brg__ring_op o = {.c = c,
                    .r = &c->ring,
                    .coll = &k,
                    .esize = sizeof(float),
                    .slice_elems = cl->slice,
                    .mem = &rec_mem};
  host_n = 0;
  brg_status s = brg__ring_walk(&o);
  if (s != BRG_SUCCESS) {
    fprintf(stderr, "host walk: %s\n", brg_status_string(s));
    failures++;
  }
  free(c);
  return host_n;
}

static size_t kernel_walk(const call *cl, int nch, int ch) {
  brg__rk_args a;
  memset(&a, 0, sizeof a);
  a.kind = (int)cl->kind;
  a.nranks = cl->n;
  a.pos = cl->pos;
  a.root = cl->root;
  a.ring = cl->ring;
  a.sendbuf = cl->send;
  a.recvbuf = cl->recv;
  a.count = cl->count;
  a.whole = cl->whole;
  a.stride = cl->stride;
  a.nchannels = nch;
  return plan_kernel_walk(&a, ch, cl->slice, kern_recs, CAP);
}

static void describe(const call *cl, int nch, int ch) {
  fprintf(stderr,
          "  %s N=%d pos %d root %d count %zu stride %zu whole %d %s slice %zu, channel %d of "
          "%d\n",
          brg__coll_name(cl->kind), cl->n, cl->pos, cl->root, cl->count, cl->stride, cl->whole,
          cl->inplace ? "in place" : "out of place", cl->slice, ch, nch);
}

/* The walks must agree step by step. */
static int same(const char *what, const plan_rec *x, size_t nx, const plan_rec *ref, size_t nr,
                const call *cl, int nch, int ch) {
  if (nx > CAP || nr > CAP) {
    fprintf(stderr, "%s: %zu and %zu steps, more than the test records\n", what, nx, nr);
    describe(cl, nch, ch);
    return 0;
  }
  for (size_t i = 0; i < nx || i < nr; i++) {
    if (i < nx && i < nr && x[i].prim == ref[i].prim && x[i].step == ref[i].step &&
        x[i].in == ref[i].in && x[i].out == ref[i].out && x[i].count == ref[i].count)
      continue;
    fprintf(stderr, "%s differs from the reference at step %zu of %zu (reference %zu):\n", what, i,
            nx, nr);
    if (i < nx)
      fprintf(stderr, "  %s: %s step %d in %ld out %ld count %zu\n", what,
              brg__prim_name((brg__prim)x[i].prim), x[i].step, x[i].in, x[i].out, x[i].count);
    if (i < nr)
      fprintf(stderr, "  reference: %s step %d in %ld out %ld count %zu\n",
              brg__prim_name((brg__prim)ref[i].prim), ref[i].step, ref[i].in, ref[i].out,
              ref[i].count);
    describe(cl, nch, ch);
    return 0;
  }
  return 1;
}

static void check(const call *cl, size_t *walks) {
  size_t nr = ref_walk(cl, 1, 0, ref_recs);
  size_t nh = host_walk(cl);
  if (!same("host engine", host_recs, nh, ref_recs, nr, cl, 1, 0)) failures++;
  for (int nch = 1; nch <= 3; nch++)
    for (int ch = 0; ch < nch; ch++) {
      if (nch > 1) nr = ref_walk(cl, nch, ch, ref_recs);
      size_t nk = kernel_walk(cl, nch, ch);
      if (!same("ring kernel", kern_recs, nk, ref_recs, nr, cl, nch, ch)) failures++;
    }
  *walks += 1;
  if (failures > 10) {
    fprintf(stderr, "stopping after %d differences\n", failures);
    exit(1);
  }
}

int main(void) {
  static const brg__coll_kind kinds[] = {BRG__COLL_ALLREDUCE,      BRG__COLL_BARRIER,
                                         BRG__COLL_REDUCE_SCATTER, BRG__COLL_ALL_GATHER,
                                         BRG__COLL_BROADCAST,      BRG__COLL_REDUCE};
  static const size_t slices[] = {1, 4, 7, 64};
  static float sendbuf[4096], recvbuf[4096];
  size_t walks = 0;
  for (int n = 1; n <= 9; n++) {
    int ring[9];
    for (int i = 0; i < n; i++) ring[i] = (2 * n - 1 - i + 2) % n; /* reversed, turned */
    size_t counts[] = {
        0, 1, 2, 3, 5, 7, 13, 31, 97, (size_t)n - 1, (size_t)n + 1, 3 * (size_t)n + 2};
    for (size_t ki = 0; ki < sizeof kinds / sizeof *kinds; ki++) {
      brg__coll_kind kind = kinds[ki];
      int blocks = kind == BRG__COLL_REDUCE_SCATTER || kind == BRG__COLL_ALL_GATHER;
      int chain = kind == BRG__COLL_BROADCAST || kind == BRG__COLL_REDUCE;
      for (size_t ci = 0; ci < sizeof counts / sizeof *counts; ci++) {
        size_t count = kind == BRG__COLL_BARRIER ? 0 : counts[ci];
        if (kind == BRG__COLL_BARRIER && ci > 0) break;
        for (int form = 0; form < (blocks ? 3 : 1); form++) /* blocks, at a stride, whole */
          for (int inplace = 0; inplace < 2; inplace++)
            for (int root = 0; root < (chain ? n : 1); root++)
              for (size_t si = 0; si < sizeof slices / sizeof *slices; si++)
                for (int pos = 0; pos < n; pos++) {
                  call cl = {.kind = kind,
                             .n = n,
                             .pos = pos,
                             .root = chain ? root : -1,
                             .whole = form == 2,
                             .inplace = inplace,
                             .ring = ring,
                             .count = count,
                             .stride = form == 1 ? count + 3 : 0,
                             .slice = slices[si],
                             .send = sendbuf,
                             .recv = inplace ? sendbuf : recvbuf};
                  if (kind == BRG__COLL_BARRIER) cl.send = cl.recv = NULL;
                  check(&cl, &walks);
                }
      }
    }
  }
  if (failures) return 1;
  printf("%zu walks: the host engine and the ring kernel follow the reference step by step\n",
         walks);
  return 0;
}
