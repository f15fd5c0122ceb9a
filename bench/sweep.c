/*
 * The timing sweep: the buffers of each row, one call of brigade or of the
 * peer, the timed loop with its data check, and the rows of one dtype and op.
 */
#include "bench_internal.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

double bench_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int bench_is_reduction(bench_kind k) {
  return k != BENCH_ALL_GATHER && k != BENCH_BROADCAST;
}
int bench_has_root(bench_kind k) {
  return k == BENCH_BROADCAST || k == BENCH_REDUCE;
}

static double bus_factor(bench_kind k, int n) {
  switch (k) {
  case BENCH_ALLREDUCE: return 2.0 * (n - 1) / n;
  case BENCH_REDUCE_SCATTER:
  case BENCH_ALL_GATHER: return (double)(n - 1) / n;
  default: return 1.0;
  }
}

static row_geom geometry(const bench *b, size_t bytes, brg_dtype dt) {
  size_t elems = bytes / bench_dt_size(dt), n = (size_t)b->nranks;
  row_geom g = {0};
  switch (b->coll->kind) {
  case BENCH_REDUCE_SCATTER:
    g.count = elems / n;
    g.total = g.send_elems = g.count * n;
    g.recv_elems = g.count;
    g.recv_off = (size_t)b->rank * g.count;
    break;
  case BENCH_ALL_GATHER:
    g.count = g.send_elems = elems / n;
    g.total = g.recv_elems = g.count * n;
    g.send_off = (size_t)b->rank * g.count;
    break;
  default: g.count = g.total = g.send_elems = g.recv_elems = elems; break;
  }
  return g;
}

static void call_buffers(const bench *b, const row_geom *g, size_t es, int in_place, char **send,
                         char **recv) {
  if (in_place) {
    *send = b->recvreg + g->send_off * es;
    *recv = b->recvreg + g->recv_off * es;
  } else {
    *send = b->sendreg;
    *recv = b->recvreg;
  }
}

/* The device mirror of a pointer into sendreg or recvreg (-G). */
static char *on_device(const bench *b, char *host) {
  if (b->gpu == NULL || host == NULL) return host;
  if (host >= b->sendreg && host < b->sendreg + b->reg_bytes) return b->dsend + (host - b->sendreg);
  return b->drecv + (host - b->recvreg);
}

/* Bytes of each region a row uses. */
static size_t row_extent(const row_geom *g, size_t es) {
  size_t e = g->total > g->send_elems ? g->total : g->send_elems;
  if (g->recv_elems > e) e = g->recv_elems;
  return e * es;
}

/* -G: host regions -> device (up) or back (down, after the stream is done). */
static void gpu_move(bench *b, const row_geom *g, size_t es, int up) {
  if (b->gpu == NULL) return;
  size_t n = row_extent(g, es);
  if (!up) bench_gpu_check(b, "cudaStreamSynchronize", b->gpu->drv.stream_sync(b->stream));
  bench_gpu_check(b, "cudaMemcpy",
                  up ? b->gpu->drv.mem_copy(b->dsend, b->sendreg, n)
                     : b->gpu->drv.mem_copy(b->sendreg, b->dsend, n));
  bench_gpu_check(b, "cudaMemcpy",
                  up ? b->gpu->drv.mem_copy(b->drecv, b->recvreg, n)
                     : b->gpu->drv.mem_copy(b->recvreg, b->drecv, n));
}

/* Poisons the output, then writes this rank's input (in place the input
 * overwrites the part of the output it shares). */
static void init_data(bench *b, const row_geom *g, brg_dtype dt, int in_place) {
  size_t es = bench_dt_size(dt);
  char *send, *recv;
  call_buffers(b, g, es, in_place, &send, &recv);
  if (b->coll->kind == BENCH_ALL_GATHER) {
    for (int r = 0; r < b->nranks; r++) {
      bench_make_input(b->pat_tmp, dt, PLAIN_DATA, b->nranks, r);
      bench_make_poison(b->pat_tmp, b->pat_tmp, es);
      bench_pattern_fill(recv + (size_t)r * g->count * es, b->pat_tmp, es, 0, g->count);
    }
  } else {
    size_t start = b->coll->kind == BENCH_REDUCE_SCATTER ? (size_t)b->rank * g->count : 0;
    bench_pattern_fill(recv, b->pat_poison, es, start, g->recv_elems);
  }
  if (!(b->coll->kind == BENCH_BROADCAST && in_place && b->rank != b->o.root))
    bench_pattern_fill(send, b->pat_in, es, 0, g->send_elems);
  gpu_move(b, g, es, 1);
}

/* Wrong elements on this rank after one call on init_data's buffers. */
static uint64_t check_data(bench *b, const row_geom *g, brg_dtype dt, int in_place) {
  size_t es = bench_dt_size(dt);
  char *send, *recv;
  uint64_t wrong = 0;
  call_buffers(b, g, es, in_place, &send, &recv);
  gpu_move(b, g, es, 0);
  switch (b->coll->kind) {
  case BENCH_ALL_GATHER:
    for (int r = 0; r < b->nranks; r++) {
      bench_make_input(b->pat_tmp, dt, PLAIN_DATA, b->nranks, r);
      wrong += bench_pattern_wrong(recv + (size_t)r * g->count * es, b->pat_tmp, dt, 0, g->count);
    }
    break;
  case BENCH_REDUCE_SCATTER:
    wrong += bench_pattern_wrong(recv, b->pat_expect, dt, (size_t)b->rank * g->count, g->count);
    break;
  case BENCH_REDUCE:
    if (b->rank == b->o.root)
      wrong += bench_pattern_wrong(recv, b->pat_expect, dt, 0, g->recv_elems);
    break;
  default: wrong += bench_pattern_wrong(recv, b->pat_expect, dt, 0, g->recv_elems); break;
  }
  /* The send buffer is const: out of place it must come back untouched. */
  if (!in_place) wrong += bench_pattern_wrong(send, b->pat_in, dt, 0, g->send_elems);
  return wrong;
}

/* The call of one placement of one row, on the buffers it uses. */
static bench_call make_call(bench *b, const row_geom *g, brg_dtype dt, brg_op op, int in_place) {
  char *send, *recv;
  call_buffers(b, g, bench_dt_size(dt), in_place, &send, &recv);
  return (bench_call){.send = on_device(b, send),
                      .recv = on_device(b, recv),
                      .count = g->count,
                      .dtype = dt,
                      .op = op,
                      .root = b->o.root,
                      .comm = b->comm,
                      .stream = b->stream};
}

/* One call: brigade's when alg < 0, else the peer's algorithm `alg`. */
static void run_call(bench *b, const row_geom *g, brg_dtype dt, brg_op op, int in_place, int alg) {
  bench_call c = make_call(b, g, dt, op, in_place);
  if (alg >= 0) {
    bench_peer_call pc = {.c = c, .kind = b->coll->kind, .in_place = in_place, .alg = alg};
    if (b->peer->run(&pc) != 0) {
      fprintf(stderr, "%s: rank %d: peer %s (%s) failed\n", bench_prog, b->rank, b->peer->name,
              b->peer->algs[alg]);
      fflush(stdout);
      brg_comm_abort(b->comm);
      exit(1);
    }
    return;
  }
  brg_status st = b->coll->run(&c);
  if (st != BRG_SUCCESS) bench_die_status(b, b->coll->call_name, st);
}

/* Times one placement of one row for brigade (alg < 0) or a peer algorithm,
 * then checks one more call's data. */
static timing time_calls(bench *b, const row_geom *g, brg_dtype dt, brg_op op, int in_place,
                         int alg) {
  brg_status st;
  timing t = {0, 0, 0};

  init_data(b, g, dt, in_place);
  if (alg >= 0) {
    bench_peer_call pc = {.c = make_call(b, g, dt, op, in_place),
                          .kind = b->coll->kind,
                          .in_place = in_place,
                          .alg = alg};
    if (b->peer->prepare(&pc) != 0) {
      fprintf(stderr, "%s: rank %d: peer %s: set-up failed\n", bench_prog, b->rank, b->peer->name);
      brg_comm_abort(b->comm);
      exit(1);
    }
  }
  for (int i = 0; i < b->o.warmup; i++) run_call(b, g, dt, op, in_place, alg);
  if (b->gpu) bench_gpu_check(b, "cudaStreamSynchronize", b->gpu->drv.stream_sync(b->stream));
  if ((st = brg_barrier(b->comm)) != BRG_SUCCESS) bench_die_status(b, "brg_barrier", st);
  double t0 = bench_now_s();
  if (b->gpu)
    bench_gpu_check(b, "cudaEventRecord", b->gpu->drv.event_record(b->ev_start, b->stream));
  for (int i = 0; i < b->o.iters; i++) run_call(b, g, dt, op, in_place, alg);
  t.host_usec = (bench_now_s() - t0) * 1e6 / b->o.iters;
  if (b->gpu) {
    float ms = 0;
    bench_gpu_check(b, "cudaEventRecord", b->gpu->drv.event_record(b->ev_end, b->stream));
    bench_gpu_check(b, "cudaStreamSynchronize", b->gpu->drv.stream_sync(b->stream));
    bench_gpu_check(b, "cudaEventElapsedTime",
                    b->gpu->drv.event_elapsed_ms(&ms, b->ev_start, b->ev_end));
    t.usec = (double)ms * 1e3 / b->o.iters;
  } else {
    t.usec = (bench_now_s() - t0) * 1e6 / b->o.iters;
  }
  if ((st = brg_allreduce(&t.usec, &t.usec, 1, BRG_FLOAT64, BRG_MAX, b->comm, NULL)) != BRG_SUCCESS)
    bench_die_status(b, "brg_allreduce (time)", st);
  if ((st = brg_allreduce(&t.host_usec, &t.host_usec, 1, BRG_FLOAT64, BRG_MAX, b->comm, NULL)) !=
      BRG_SUCCESS)
    bench_die_status(b, "brg_allreduce (host time)", st);

  if (b->o.check) {
    init_data(b, g, dt, in_place);
    run_call(b, g, dt, op, in_place, alg);
    t.wrong = check_data(b, g, dt, in_place);
    if ((st = brg_allreduce(&t.wrong, &t.wrong, 1, BRG_UINT64, BRG_SUM, b->comm, NULL)) !=
        BRG_SUCCESS)
      bench_die_status(b, "brg_allreduce (#wrong)", st);
  }
  return t;
}

static void note_peer_skip(bench *b, const char *why) {
  for (int i = 0; i < b->npeer_skips; i++)
    if (strcmp(b->peer_skips[i], why) == 0) return;
  if (b->npeer_skips < (int)(sizeof b->peer_skips / sizeof b->peer_skips[0]))
    b->peer_skips[b->npeer_skips++] = why;
}

/* Times one placement of one row, brigade and then the peer; prints its
 * columns on rank 0. */
static void time_placement(bench *b, const row_geom *g, brg_dtype dt, int op, int in_place) {
  brg_op bop = op == PLAIN_DATA ? BRG_SUM : (brg_op)op;
  size_t es = bench_dt_size(dt);
  double bytes = (double)(g->total * es);
  double factor = bus_factor(b->coll->kind, b->nranks);

  timing t = time_calls(b, g, dt, bop, in_place, -1);
  b->wrong_total += t.wrong;
  double algbw = t.usec > 0 ? bytes / t.usec / 1e3 : 0; /* GB/s */
  double busbw = algbw * factor;
  b->bw_sum += busbw;
  b->bw_rows++;
  b->last_busbw[in_place] = busbw;
  b->last_host_usec[in_place] = t.host_usec;
  bench_csv_row(b, "brigade", "ring", in_place, g->total * es, g->count, dt, op, &t, algbw, busbw);
  char tbuf[32], wbuf[32];
  bench_format_time(tbuf, sizeof tbuf, t.usec);
  bench_format_wrong(b, wbuf, sizeof wbuf, t.wrong);
  if (b->rank == 0) {
    printf("  %7s  %6.2f  %6.2f  %5s", tbuf, algbw, busbw, wbuf);
    if (b->roof_busbw > 0) printf("  %5.1f", 100.0 * busbw / b->roof_busbw);
  }
  if (b->peer == NULL) return;

  b->last_peer[in_place] = 0;
  const char *why = b->peer->unsupported(b->coll->kind, dt, bop, in_place);
  if (why != NULL) {
    note_peer_skip(b, why);
    if (b->rank == 0) {
      printf("  %7s  %6s  %5s", "n/a", "n/a", "n/a");
      if (b->peer->nalgs > 1) printf("  %7s", "n/a");
      printf("  %6s", "n/a");
    }
    return;
  }
  timing best = {0, 0, 0};
  int best_alg = 0;
  uint64_t peer_wrong = 0;
  for (int a = 0; a < b->peer->nalgs; a++) {
    timing pt = time_calls(b, g, dt, bop, in_place, a);
    peer_wrong += pt.wrong;
    double pbus = pt.usec > 0 ? bytes / pt.usec / 1e3 * factor : 0;
    bench_csv_row(b, b->peer->name, b->peer->algs[a], in_place, g->total * es, g->count, dt, op,
                  &pt, pbus / factor, pbus);
    if (a == 0 || pt.usec < best.usec) {
      best = pt;
      best_alg = a;
    }
  }
  b->peer_wrong_total += peer_wrong;
  double pbusbw = best.usec > 0 ? bytes / best.usec / 1e3 * factor : 0;
  b->last_peer[in_place] = pbusbw;
  if (b->rank != 0) return;
  bench_format_time(tbuf, sizeof tbuf, best.usec);
  bench_format_wrong(b, wbuf, sizeof wbuf, peer_wrong);
  printf("  %7s  %6.2f  %5s", tbuf, pbusbw, wbuf);
  if (b->peer->nalgs > 1) printf("  %7s", b->peer->algs[best_alg]);
  /* the ratio of busbw is the ratio of times; times stay meaningful at 0 bytes */
  printf("  %6.2f", t.usec > 0 ? best.usec / t.usec : 0.0);
}

void bench_sweep(bench *b, brg_dtype dt, int op) {
  size_t es = bench_dt_size(dt);
  bench_make_input(b->pat_in, dt, bench_is_reduction(b->coll->kind) ? op : PLAIN_DATA, b->nranks,
                   b->rank);
  if (bench_is_reduction(b->coll->kind))
    bench_make_reduced(b->pat_expect, dt, (brg_op)op, b->nranks);
  else if (b->coll->kind == BENCH_BROADCAST)
    bench_make_input(b->pat_expect, dt, PLAIN_DATA, b->nranks, b->o.root);
  else
    bench_make_input(b->pat_expect, dt, PLAIN_DATA, b->nranks, b->rank); /* unused */
  bench_make_poison(b->pat_poison, b->pat_expect, es);

  size_t size = b->o.min_bytes;
  for (;;) {
    row_geom g = geometry(b, size, dt);
    if (b->rank == 0)
      printf("%12zu  %12zu  %8s  %6s  %6d", g.total * es, g.total, bench_dtype_print[dt],
             op == PLAIN_DATA ? "none" : bench_op_print[op],
             bench_has_root(b->coll->kind) ? b->o.root : -1);
    time_placement(b, &g, dt, op, 0);
    time_placement(b, &g, dt, op, 1);
    b->last_bytes = g.total * es;
    if (b->rank == 0) printf("\n");
    /* GPU buffers: how long a call held the calling thread (a stream
     * collective should only enqueue), as a comment line parsers skip */
    if (b->rank == 0 && b->gpu)
      printf("#  host time per call: %.2f us out of place, %.2f us in place\n",
             b->last_host_usec[0], b->last_host_usec[1]);
    size_t next = b->o.step_factor > 1 ? size * b->o.step_factor : size + b->o.step_bytes;
    if (next <= size || next > b->o.max_bytes) break;
    size = next;
  }
}
