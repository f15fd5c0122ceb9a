/*
 * Peers: another collective library timed beside brigade in the same run
 * (--peer mpi, --peer gloo), on the same buffers, sizes, dtypes and ops, with
 * the same data check, so every row can print a ratio.
 *
 * A peer is a small table of functions. Each one is compiled only when its
 * library was found at build time (bench/meson.build); common.c lists the
 * ones that were.
 */
#ifndef BRG_BENCH_PEER_H
#define BRG_BENCH_PEER_H

#include "common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One call of the peer: brigade's call, plus what a peer needs to pick its
 * own entry point. */
typedef struct bench_peer_call {
  bench_call c;
  bench_kind kind;
  int in_place;
  int alg; /* index into bench_peer.algs */
} bench_peer_call;

typedef struct bench_peer {
  const char *name;     /* what --peer takes */
  const char *launcher; /* how the program must be started with this peer */
  int nalgs;            /* algorithms timed per row; the fastest is reported */
  const char *const *algs;

  /* For a peer that is also the launcher (MPI): starts it and builds
   * brigade's communicator through it. NULL when ranks come from brigade's
   * own launcher. Returns 0 or prints why not and returns -1. */
  int (*launch)(int *argc, char ***argv, brg_comm **comm);
  /* Connects the peer once brigade's communicator exists. 0 or -1. */
  int (*open)(brg_comm *comm, int rank, int nranks);
  /* One line that names the library and its version. */
  const char *(*describe)(void);
  /* NULL when the peer can run this call, else a short reason. */
  const char *(*unsupported)(bench_kind kind, brg_dtype dtype, brg_op op, int in_place);
  /* Untimed set-up for the calls that follow with these arguments (Gloo
   * builds its algorithm objects here). 0 or -1. */
  int (*prepare)(const bench_peer_call *pc);
  /* One call. 0 or -1 (the peer prints why). */
  int (*run)(const bench_peer_call *pc);
  /* Every rank, after a final brg_barrier, before brigade's communicator is
   * destroyed. */
  void (*close)(void);
  /* After it is destroyed, last thing before exit (MPI_Finalize). */
  void (*finalize)(void);
} bench_peer;

extern const bench_peer bench_peer_mpi;
extern const bench_peer bench_peer_gloo;
extern const bench_peer bench_peer_nccl;

#ifdef __cplusplus
}
#endif

#endif
