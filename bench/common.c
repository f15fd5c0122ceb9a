/*
 * The benchmark driver shared by all *_perf programs.
 *
 * For every dtype, op and size it times -n back-to-back calls (after -w
 * untimed ones), out of place and then in place, and prints one row like
 * nccl-tests: average time per call (the slowest rank's), algorithm
 * bandwidth (bytes / time) and bus bandwidth (algbw times the share of the
 * data each link has to carry for that collective).
 *
 * The data check (-c 1) is a separate call after the timed loop: fresh
 * inputs, the output poisoned, one call, then every element of the output
 * is compared with a reference computed here from the inputs, never by
 * brigade. Inputs are small integers (and powers of two for prod) chosen so
 * that the exact result is representable in every dtype, half and bfloat16
 * included, whatever order the ranks combine them in; integer types wrap,
 * and the reference wraps the same way.
 *
 * Inputs repeat with a period of PERIOD elements, so buffers are filled and
 * checked with memcpy/memcmp of one precomputed period rather than element
 * by element. PERIOD has odd factors, so an output shifted by a power-of-two
 * number of elements (a misplaced chunk or slice) never matches by chance.
 *
 * With --peer, each placement of each row is then timed and checked the
 * same way through a peer library (peer.h), and the row gains the peer's
 * columns and the ratio of bus bandwidths. all_reduce_perf starts by
 * measuring the machine's copy rate, the memory roofline (see roofline.c).
 *
 * With -G (--device) the buffers are GPU memory and every call goes on a
 * CUDA stream; inputs are built on the host as above and copied up, outputs
 * copied down for the check, and the timed loop is measured with CUDA
 * events. The GPU is reached through brigade's CUDA module
 * (libbrigade_cuda.so, opened with dlopen like the library does), so the
 * programs never link against CUDA.
 *
 * One file per concern: main.c opens the communicator and the GPU and runs
 * the rest; args.c reads the command line, reference.c holds the expected
 * values and the check of every element, sweep.c times the calls,
 * roofline.c measures the copy rate, report.c prints the table and the CSV.
 * This file holds what they all use: the program's name, the peers that
 * were built, and how a rank dies.
 */
#include "bench_internal.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *bench_prog = "brigade_perf";

/* ----------------------------------------------------------------- peers */

/* The peers this build has (bench/meson.build defines BENCH_HAVE_*). */
static const bench_peer *const peers[] = {
#ifdef BENCH_HAVE_MPI
    &bench_peer_mpi,
#endif
#ifdef BENCH_HAVE_GLOO
    &bench_peer_gloo,
#endif
#ifdef BENCH_HAVE_NCCL
    &bench_peer_nccl,
#endif
    NULL,
};

const char *bench_peers_built(void) {
  static char buf[64];
  buf[0] = '\0';
  for (size_t i = 0; peers[i] != NULL; i++)
    snprintf(buf + strlen(buf), sizeof buf - strlen(buf), "%s%s", i ? ", " : "", peers[i]->name);
  return buf[0] ? buf : "none in this build";
}

const bench_peer *bench_peer_find(const char *name) {
  for (size_t i = 0; peers[i] != NULL; i++)
    if (strcmp(peers[i]->name, name) == 0) return peers[i];
  return NULL;
}

void bench_die_status(bench *b, const char *what, brg_status st) {
  fprintf(stderr, "%s: rank %d: %s failed: %s: %s\n", bench_prog, b->rank, what,
          brg_status_string(st),
          b->comm ? brg_comm_last_error(b->comm) : brg_comm_last_error(NULL));
  fflush(stdout);
  if (b->comm) brg_comm_abort(b->comm);
  exit(1);
}

void bench_gpu_check(bench *b, const char *what, int e) {
  if (e == 0) return;
  fprintf(stderr, "%s: rank %d: %s failed: %s\n", bench_prog, b->rank, what,
          b->gpu->drv.error_string(e));
  if (b->comm) brg_comm_abort(b->comm);
  exit(1);
}
