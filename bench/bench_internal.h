/*
 * What the files of the *_perf driver share: the options, the state of one
 * run, and the functions one file calls in another. The *_perf programs
 * themselves see only common.h.
 */
#ifndef BRG_BENCH_INTERNAL_H
#define BRG_BENCH_INTERNAL_H

#include "common.h"
#include "peer.h"
#include "../kernels/cuda/brg_cuda.h"

#include <stdint.h>
#include <stdio.h>

#define PERIOD 30030u /* 2*3*5*7*11*13 */
#define ALIGN 4096u
#define PLAIN_DATA (-1) /* "op" of the data pattern of non-reducing collectives */

/* argv[0] without its directory, for messages (set by bench_main). */
extern const char *bench_prog;

/* What the table prints for each dtype and op (args.c). */
extern const char *const bench_dtype_print[BRG_NUM_DTYPES];
extern const char *const bench_op_print[BRG_NUM_OPS];

/* --------------------------------------------------------------- options */

typedef struct bench_opts {
  size_t min_bytes, max_bytes;
  size_t step_bytes; /* used when step_factor <= 1 */
  size_t step_factor;
  int iters, warmup, check, blocking, root;
  int roofline;     /* -1: default (on for all_reduce) */
  int device;       /* -G: GPU buffers on a CUDA stream */
  int gpu;          /* -g: the GPU to use; -1: LOCAL_RANK modulo the GPUs seen */
  const char *peer; /* --peer NAME, or NULL */
  const char *csv;  /* --csv PATH, or NULL */
  int ndtypes, nops;
  brg_dtype dtypes[BRG_NUM_DTYPES];
  brg_op ops[BRG_NUM_OPS];
} bench_opts;

/* ---------------------------------------------------------------- state */

typedef struct bench {
  const bench_coll *coll;
  bench_opts o;
  brg_comm *comm;
  int rank, nranks;
  char *sendreg, *recvreg; /* out of place: send / recv; in place: recvreg holds both */
  size_t reg_bytes;
  /* patterns of the current dtype and op, PERIOD elements each */
  unsigned char *pat_in, *pat_expect, *pat_poison, *pat_tmp;
  double bw_sum;
  int bw_rows;
  uint64_t wrong_total;
  const bench_peer *peer;
  uint64_t peer_wrong_total;
  const char *peer_skips[8]; /* distinct reasons for n/a peer columns */
  int npeer_skips;
  double copy_rate;         /* bytes read + written per second, 0 when not measured */
  double roof_busbw;        /* GB/s: the allreduce busbw the copy rate allows */
  double last_busbw[2];     /* largest size so far: brigade out of place, in place */
  double last_host_usec[2]; /* -G: how long a call of that size held the calling thread */
  double last_peer[2];      /* the peer's, 0 when n/a */
  size_t last_bytes;
  FILE *csv;
  /* -G */
  const brg__cuda_api *gpu;
  char *dsend, *drecv; /* device mirrors of sendreg and recvreg */
  void *stream, *ev_start, *ev_end;
  int gpu_share; /* ranks on this rank's GPU */
  char gpu_desc[256];
} bench;

/* Geometry of one row. `count` is the collective's argument; `total` the
 * elements the size column and the bandwidth count. */
typedef struct row_geom {
  size_t count, total, send_elems, recv_elems;
  size_t send_off, recv_off; /* in place: element offsets into recvreg */
} row_geom;

typedef struct timing {
  double usec; /* per call, the slowest rank's */
  uint64_t wrong;
  double host_usec; /* -G: per call, the time the calls held the calling thread (slowest rank) */
} timing;

/* common.c */
const char *bench_peers_built(void);
/* The peer called `name` among those built, or NULL. */
const bench_peer *bench_peer_find(const char *name);
void bench_die_status(bench *b, const char *what, brg_status st);
void bench_gpu_check(bench *b, const char *what, int e);

/* args.c */
int bench_parse_args(int argc, char **argv, const bench_coll *coll, bench_opts *o);

/* reference.c */
size_t bench_dt_size(brg_dtype dt);
void bench_make_input(unsigned char *pat, brg_dtype dt, int op, int nranks, int r);
void bench_make_reduced(unsigned char *pat, brg_dtype dt, brg_op op, int nranks);
void bench_make_poison(unsigned char *dst, const unsigned char *pat, size_t es);
void bench_pattern_fill(void *dst, const unsigned char *pat, size_t es, size_t start, size_t n);
size_t bench_pattern_wrong(const void *buf, const unsigned char *pat, brg_dtype dt, size_t start,
                           size_t n);

/* sweep.c */
double bench_now_s(void);
int bench_is_reduction(bench_kind k);
int bench_has_root(bench_kind k);
void bench_sweep(bench *b, brg_dtype dt, int op);

/* roofline.c */
void bench_roofline(bench *b);

/* report.c */
void bench_format_time(char *buf, size_t len, double usec);
void bench_format_wrong(const bench *b, char *buf, size_t len, uint64_t wrong);
void bench_csv_row(bench *b, const char *library, const char *alg, int in_place, size_t bytes,
                   size_t count, brg_dtype dt, int op, const timing *t, double algbw, double busbw);
void bench_print_ranks(bench *b);
void bench_print_header(const bench *b);
void bench_print_columns(const bench *b);
void bench_print_footer(const bench *b);

#endif
