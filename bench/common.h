/*
 * Shared driver of the *_perf benchmarks: option parsing, buffers, the
 * timing loop, the nccl-tests-style table and the data check.
 *
 * A benchmark program only says which collective it times and how to call
 * it; everything else lives in common.c and the files it names. Only the
 * public header is used, so these programs see brigade exactly as an
 * application does.
 */
#ifndef BRG_BENCH_COMMON_H
#define BRG_BENCH_COMMON_H

#include <stddef.h>
#include "brigade.h"

typedef enum {
  BENCH_ALLREDUCE,
  BENCH_REDUCE_SCATTER,
  BENCH_ALL_GATHER,
  BENCH_BROADCAST,
  BENCH_REDUCE,
} bench_kind;

/* One call of the collective, with NCCL's meaning of `count`: elements per
 * rank for all-reduce, broadcast and reduce; recvcount for reduce-scatter;
 * sendcount for all-gather. */
typedef struct bench_call {
  const void *send;
  void *recv;
  size_t count;
  brg_dtype dtype;
  brg_op op;
  int root;
  brg_comm *comm;
  void *stream; /* -G: a CUDA stream, and send/recv are GPU memory; else NULL */
} bench_call;

typedef struct bench_coll {
  const char *name; /* "all_reduce", for messages */
  bench_kind kind;
  brg_status (*run)(const bench_call *c);
  const char *call_name; /* "brg_allreduce", for error messages */
} bench_coll;

/* 1 when the run uses GPU buffers (-G / --device). */
int bench_device_mode(void);

/* Parses argv, runs the sweep, prints the table; returns the exit status. */
int bench_main(int argc, char **argv, const bench_coll *coll);

#endif
