/*
 * A short figure of the device allreduce on ONE GPU, for device-check.sh:
 * N ranks as threads of one process, each on its own stream of the current
 * GPU, time a float32 sum out of place and in place at a few sizes (the mode is
 * BRIGADE_DEVICE_MODE's: kernel or step), beside the GPU's own
 * device-to-device copy rate (the roofline of ranks that share one HBM: a
 * ring step reads two buffers and writes one) and, where libnccl.so.2
 * loads, NCCL's allreduce on the same GPU at N = 1 (NCCL refuses two ranks
 * on one GPU). Times come from events on rank 0's stream; every rank's
 * result of the last call at each size is checked (every element).
 *
 *   device_perf N SIZES ITERS     SIZES: bytes, comma-separated (K, M, G)
 *
 * Two lines per size (out of place, in place): mode N bytes us algbw busbw (GB/s; busbw =
 * algbw * 2(N-1)/N, as nccl-tests). Exits 77 without a GPU.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "brigade.h"
#include "device.h"

#define MAXN 8
#define MAXSIZES 16

static const brg__cuda_api *api;
static brg_unique_id id;
static int nranks, iters, nsizes, failures;
static size_t sizes[MAXSIZES];
static pthread_barrier_t bar;
static double us_of[MAXSIZES], us_in[MAXSIZES]; /* out of place, in place */

static size_t parse_size(const char *s) {
  char *end;
  double v = strtod(s, &end);
  size_t m = *end == 'K' ? 1u << 10 : *end == 'M' ? 1u << 20 : *end == 'G' ? 1u << 30 : 1;
  return (size_t)(v * (double)m);
}

/* in[i] = (i % 251) + rank: the sum is N (i % 251) + N(N-1)/2, exact in float. */
static int check(const float *h, size_t n, int rank, size_t bytes) {
  for (size_t i = 0; i < n; i++) {
    float want = (float)(nranks * (int)(i % 251) + nranks * (nranks - 1) / 2);
    if (h[i] != want) {
      fprintf(stderr, "rank %d, %zu bytes: element %zu is %g, expected %g\n", rank, bytes, i, h[i],
              want);
      return 1;
    }
  }
  return 0;
}

/* A rank whose call failed would leave the others at the next barrier:
 * the whole run ends here (the error is printed already). */
static void fail_now(void) {
  printf("device_perf: FAILED (errors above)\n");
  fflush(NULL);
  _exit(1);
}

static void *rank_main(void *arg) {
  int rank = (int)(long)arg, bad = 0;
  size_t maxb = 0;
  for (int k = 0; k < nsizes; k++) maxb = sizes[k] > maxb ? sizes[k] : maxb;
  size_t maxn = maxb / 4;
  brg_comm *c = NULL;
  void *send = NULL, *recv = NULL, *st = NULL, *ev0 = NULL, *ev1 = NULL;
  float *h = malloc(maxn * sizeof *h);
  if (brg_comm_init(&c, nranks, &id, rank) != BRG_SUCCESS || !h ||
      api->drv.mem_alloc(&send, maxb) || api->drv.mem_alloc(&recv, maxb) ||
      api->drv.stream_create(&st) || api->drv.event_create_timing(&ev0) ||
      api->drv.event_create_timing(&ev1)) {
    fprintf(stderr, "rank %d: setup failed: %s\n", rank, brg_comm_last_error(c));
    fail_now();
  }
  if (!bad) {
    for (size_t i = 0; i < maxn; i++) h[i] = (float)((int)(i % 251) + rank);
    api->drv.mem_copy(send, h, maxn * 4);
  }
  for (int k = 0; k < nsizes; k++) {
    size_t n = sizes[k] / 4;
    pthread_barrier_wait(&bar);
    if (bad) continue;
    brg_status s = brg_allreduce(send, recv, n, BRG_FLOAT32, BRG_SUM, c, st); /* warm-up */
    api->drv.stream_sync(st);
    pthread_barrier_wait(&bar);
    api->drv.event_record(ev0, st);
    for (int i = 0; s == BRG_SUCCESS && i < iters; i++)
      s = brg_allreduce(send, recv, n, BRG_FLOAT32, BRG_SUM, c, st);
    api->drv.event_record(ev1, st);
    if (s != BRG_SUCCESS || api->drv.stream_sync(st) != 0) {
      fprintf(stderr, "rank %d: allreduce of %zu bytes: %s\n", rank, sizes[k],
              brg_comm_last_error(c));
      fail_now();
    }
    float ms = 0;
    api->drv.event_elapsed_ms(&ms, ev0, ev1);
    if (rank == 0) us_of[k] = 1000.0 * ms / iters;
    api->drv.mem_copy(h, recv, n * 4);
    bad |= check(h, n, rank, sizes[k]);
    for (size_t i = 0; i < maxn; i++) h[i] = (float)((int)(i % 251) + rank);
    /* In place: one call checked, then the timed ones (whose sums grow,
     * still finite in float). */
    api->drv.mem_copy(recv, h, n * 4);
    pthread_barrier_wait(&bar);
    s = brg_allreduce(recv, recv, n, BRG_FLOAT32, BRG_SUM, c, st);
    if (s != BRG_SUCCESS || api->drv.stream_sync(st) != 0) {
      fprintf(stderr, "rank %d: in-place allreduce of %zu bytes: %s\n", rank, sizes[k],
              brg_comm_last_error(c));
      fail_now();
    }
    api->drv.mem_copy(h, recv, n * 4);
    bad |= check(h, n, rank, sizes[k]);
    for (size_t i = 0; i < maxn; i++) h[i] = (float)((int)(i % 251) + rank);
    pthread_barrier_wait(&bar);
    api->drv.event_record(ev0, st);
    for (int i = 0; s == BRG_SUCCESS && i < iters; i++)
      s = brg_allreduce(recv, recv, n, BRG_FLOAT32, BRG_SUM, c, st);
    api->drv.event_record(ev1, st);
    if (s != BRG_SUCCESS || api->drv.stream_sync(st) != 0) {
      fail_now();
    }
    api->drv.event_elapsed_ms(&ms, ev0, ev1);
    if (rank == 0) us_in[k] = 1000.0 * ms / iters;
  }
  if (c) brg_comm_destroy(c);
  if (ev0) api->drv.event_destroy(ev0);
  if (ev1) api->drv.event_destroy(ev1);
  if (st) api->drv.stream_destroy(st);
  api->drv.mem_free(send);
  api->drv.mem_free(recv);
  free(h);
  __atomic_add_fetch(&failures, bad, __ATOMIC_RELAXED);
  return NULL;
}

/* GB/s of a device-to-device copy of `bytes` (read + write counted once,
 * as nccl-tests counts an allreduce's bytes). */
static double copy_rate(size_t bytes) {
  void *a = NULL, *b = NULL, *st = NULL, *e0 = NULL, *e1 = NULL;
  double gbs = 0;
  if (!api->drv.mem_alloc(&a, bytes) && !api->drv.mem_alloc(&b, bytes) &&
      !api->drv.stream_create(&st) && !api->drv.event_create_timing(&e0) &&
      !api->drv.event_create_timing(&e1)) {
    api->kern.copy(b, NULL, a, bytes, st);
    api->drv.event_record(e0, st);
    for (int i = 0; i < iters; i++) api->kern.copy(b, NULL, a, bytes, st);
    api->drv.event_record(e1, st);
    api->drv.stream_sync(st);
    float ms = 0;
    if (!api->drv.event_elapsed_ms(&ms, e0, e1) && ms > 0) gbs = (double)bytes * iters / (ms * 1e6);
  }
  if (e0) api->drv.event_destroy(e0);
  if (e1) api->drv.event_destroy(e1);
  if (st) api->drv.stream_destroy(st);
  api->drv.mem_free(a);
  api->drv.mem_free(b);
  return gbs;
}

/* NCCL's allreduce at N = 1 on this GPU, where libnccl.so.2 loads (its
 * ABI: ncclUniqueId is 128 bytes, ncclFloat32 7, ncclSum 0). */
static void nccl_beside(void) {
  void *h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    printf("# nccl: not loaded (%s)\n", dlerror());
    return;
  }
  typedef int (*getid_fn)(void *);
  typedef int (*init_fn)(void **, int, char[128], int);
  typedef int (*ar_fn)(const void *, void *, size_t, int, int, void *, void *);
  typedef int (*destroy_fn)(void *);
  void *f[4] = {dlsym(h, "ncclGetUniqueId"), dlsym(h, "ncclCommInitRank"),
                dlsym(h, "ncclAllReduce"), dlsym(h, "ncclCommDestroy")};
  getid_fn getid;
  init_fn init;
  ar_fn ar;
  destroy_fn destroy;
  memcpy(&getid, &f[0], sizeof getid);
  memcpy(&init, &f[1], sizeof init);
  memcpy(&ar, &f[2], sizeof ar);
  memcpy(&destroy, &f[3], sizeof destroy);
  char nid[128];
  void *comm = NULL, *st = NULL, *a = NULL, *b = NULL, *e0 = NULL, *e1 = NULL;
  size_t maxb = 0;
  for (int k = 0; k < nsizes; k++) maxb = sizes[k] > maxb ? sizes[k] : maxb;
  if (!getid || !init || !ar || !destroy || getid(nid) || init(&comm, 1, nid, 0) ||
      api->drv.mem_alloc(&a, maxb) || api->drv.mem_alloc(&b, maxb) || api->drv.stream_create(&st) ||
      api->drv.event_create_timing(&e0) || api->drv.event_create_timing(&e1)) {
    printf("# nccl: loaded, but could not set up a communicator of one rank\n");
  } else {
    for (int k = 0; k < nsizes; k++) {
      size_t n = sizes[k] / 4;
      ar(a, b, n, 7, 0, comm, st);
      api->drv.event_record(e0, st);
      for (int i = 0; i < iters; i++) ar(a, b, n, 7, 0, comm, st);
      api->drv.event_record(e1, st);
      api->drv.stream_sync(st);
      float ms = 0;
      api->drv.event_elapsed_ms(&ms, e0, e1);
      double us = 1000.0 * ms / iters;
      printf("nccl    N=1 %12zu %10.2f us %8.2f GB/s algbw (N = 1: a copy)\n", sizes[k], us,
             us > 0 ? (double)sizes[k] / (us * 1e3) : 0);
    }
  }
  if (comm) destroy(comm);
  if (e0) api->drv.event_destroy(e0);
  if (e1) api->drv.event_destroy(e1);
  if (st) api->drv.stream_destroy(st);
  api->drv.mem_free(a);
  api->drv.mem_free(b);
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s N SIZES ITERS\n", argv[0]);
    return 2;
  }
  nranks = atoi(argv[1]);
  iters = atoi(argv[3]);
  if (nranks < 1 || nranks > MAXN || iters < 1) {
    fprintf(stderr, "device_perf: N must be 1 to %d and ITERS at least 1\n", MAXN);
    return 2;
  }
  char *list = strdup(argv[2]);
  for (char *t = strtok(list, ","); t && nsizes < MAXSIZES; t = strtok(NULL, ","))
    if ((sizes[nsizes] = parse_size(t) & ~(size_t)3) > 0) nsizes++;
  free(list);
  const char *why = "";
  api = brg__device_api(&why);
  if (!api) {
    printf("skipped: no GPU: %s\n", why);
    return 77;
  }
  api->drv.set_device(0);
  const char *mode = getenv("BRIGADE_DEVICE_MODE");
  char desc[256];
  api->drv.describe(desc, sizeof desc);
  size_t cb = sizes[nsizes - 1] > (64u << 20) ? sizes[nsizes - 1] : (64u << 20);
  double copy = copy_rate(cb);
  printf("# %s\n# copy %zu bytes device to device: %.1f GB/s\n", desc, cb, copy);
  if (brg_get_unique_id(&id) != BRG_SUCCESS) return 1;
  pthread_barrier_init(&bar, NULL, (unsigned)nranks);
  pthread_t th[MAXN];
  for (int r = 0; r < nranks; r++) pthread_create(&th[r], NULL, rank_main, (void *)(long)r);
  for (int r = 0; r < nranks; r++) pthread_join(th[r], NULL);
  double f = nranks > 1 ? 2.0 * (nranks - 1) / nranks : 1.0;
  for (int k = 0; k < nsizes; k++)
    for (int ip = 0; ip < 2; ip++) {
      double us = ip ? us_in[k] : us_of[k];
      double alg = us > 0 ? (double)sizes[k] / (us * 1e3) : 0;
      printf("%-7s N=%d %12zu %10.2f us %8.2f GB/s algbw %8.2f GB/s busbw (%.0f%% of copy)%s\n",
             mode && *mode ? mode : "auto", nranks, sizes[k], us, alg, alg * f,
             copy > 0 ? 100.0 * alg * f / copy : 0, ip ? " in place" : "");
    }
  const char *nccl = getenv("DEVICE_PERF_NCCL");
  if (nccl && *nccl) nccl_beside();
  printf("device_perf: %s\n", failures ? "FAILED (wrong elements or errors above)" : "ok");
  return failures ? 1 : 0;
}
