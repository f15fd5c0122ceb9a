/*
 * Device collectives between ranks that are threads of one process: the
 * device ring then uses the neighbour's FIFO pointer and events directly
 * instead of CUDA IPC (which refuses a process's own memory). N threads,
 * each a rank with its own stream, allreduce float32 sum (odd count,
 * several slots per chunk) and broadcast; every element checked, and a
 * failure says why (the call's error, or the communicator's asynchronous
 * one: a kernel the watchdog stopped).
 *
 *   test_device_threads [N] [perthread]   exits 77 when there is no GPU
 *
 * perthread: every rank passes cudaStreamPerThread (0x2), which is a
 * stream of its own in each thread, not a shared one.
 *
 * With TEST_EXPECT_UNAVAILABLE=1 the ranks' streams are more than the GPU's
 * hardware queues (CUDA_DEVICE_MAX_CONNECTIONS): every rank's allreduce
 * must fail with BRG_ERR_UNAVAILABLE naming that setting, not hang.
 *
 * Under the emulated module's lazy loading (BRIGADE_EMU_LAZY_LOAD, on with
 * BRIGADE_EMU_STRICT), no kernel may be loaded at a launch: the first
 * launch of a kernel waits there for every kernel of the process, which
 * includes the neighbours' spinning ones, so the setup loads them all
 * before its last all-gather (brg__emu_launch_loads must stay 0).
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "brigade.h"
#include "device.h"

#define COUNT 1000003
#define MAXN 8

static const brg__cuda_api *api;
static brg_unique_id id;
static int nranks = 2;
static int per_thread, expect_unavailable;
static int failures[MAXN];
/* Synchronous copies run on the legacy stream, which waits for every
 * blocking stream (the per-thread ones among them): the ranks copy in and
 * out while no kernel of theirs is queued. */
static pthread_barrier_t copied;

static void *rank_main(void *arg) {
  int rank = (int)(long)arg;
  brg_comm *c = NULL;
  float *host = malloc(COUNT * sizeof *host);
  void *d = NULL, *st = NULL;
  brg_status s = brg_comm_init(&c, nranks, &id, rank);
  int e = 0;
  if (per_thread) st = (void *)2; /* cudaStreamPerThread */
  if (s != BRG_SUCCESS || !host || (e = api->drv.mem_alloc(&d, COUNT * sizeof *host)) != 0 ||
      (!per_thread && (e = api->drv.stream_create(&st)) != 0)) {
    fprintf(stderr, "rank %d: setup failed: %s%s%s\n", rank,
            s != BRG_SUCCESS ? brg_comm_last_error(c) : "", e ? api->drv.error_string(e) : "",
            !host ? "out of host memory" : "");
    failures[rank]++;
    pthread_barrier_wait(&copied); /* the others go on to their calls, and fail */
    pthread_barrier_wait(&copied);
    goto out;
  }
  for (int i = 0; i < COUNT; i++) host[i] = (float)((i % 1000) + rank);
  api->drv.mem_copy(d, host, COUNT * sizeof *host);
  pthread_barrier_wait(&copied);
  s = brg_allreduce(d, d, COUNT, BRG_FLOAT32, BRG_SUM, c, st);
  if (expect_unavailable) {
    const char *m = brg_comm_last_error(c);
    if (s != BRG_ERR_UNAVAILABLE || !strstr(m, "CUDA_DEVICE_MAX_CONNECTIONS")) {
      fprintf(stderr,
              "rank %d: expected BRG_ERR_UNAVAILABLE naming CUDA_DEVICE_MAX_CONNECTIONS, "
              "got %s: %s\n",
              rank, brg_status_string(s), m);
      failures[rank]++;
    }
    pthread_barrier_wait(&copied);
    goto out;
  }
  if (s == BRG_SUCCESS) s = brg_broadcast(d, d, 7, BRG_FLOAT32, nranks - 1, c, st);
  if (s != BRG_SUCCESS) {
    fprintf(stderr, "rank %d: %s: %s\n", rank, brg_status_string(s), brg_comm_last_error(c));
    failures[rank]++;
  }
  api->drv.stream_sync(st);
  pthread_barrier_wait(&copied);
  if (s != BRG_SUCCESS) goto out;
  brg_status async = BRG_SUCCESS;
  if (brg_comm_get_async_error(c, &async) != BRG_SUCCESS || async != BRG_SUCCESS) {
    fprintf(stderr, "rank %d: asynchronous error %s: %s\n", rank, brg_status_string(async),
            brg_comm_last_error(c));
    failures[rank]++;
  }
  api->drv.mem_copy(host, d, COUNT * sizeof *host);
  /* sum over ranks of (i % 1000 + r) = N (i % 1000) + N(N-1)/2; the first 7
   * were then broadcast, which changes nothing (every rank has the sum). */
  for (int i = 0; i < COUNT; i++) {
    float want = (float)(nranks * (i % 1000) + nranks * (nranks - 1) / 2);
    if (host[i] != want) {
      if (failures[rank] < 5)
        fprintf(stderr, "rank %d: element %d is %g, expected %g\n", rank, i, host[i], want);
      failures[rank]++;
    }
  }
out:
  if (st && !per_thread) api->drv.stream_destroy(st);
  if (d) api->drv.mem_free(d);
  free(host);
  if (c) brg_comm_destroy(c);
  return NULL;
}

int main(int argc, char **argv) {
  if (argc > 1) nranks = atoi(argv[1]);
  per_thread = argc > 2 && !strcmp(argv[2], "perthread");
  expect_unavailable = getenv("TEST_EXPECT_UNAVAILABLE") && atoi(getenv("TEST_EXPECT_UNAVAILABLE"));
  if (nranks < 1 || nranks > MAXN) return 2;
  const char *why = "";
  api = brg__device_api(&why);
  if (!api) {
    /* The emulated module's runs must not skip: a module that does not load
     * there is a failure. */
    if (getenv("BRIGADE_TEST_NO_SKIP")) {
      fprintf(stderr, "FAIL: no GPU: %s\n", why);
      exit(1);
    }
    printf("skipped: %s\n", why);
    return 77;
  }
  if (brg_get_unique_id(&id) != BRG_SUCCESS) return 1;
  pthread_barrier_init(&copied, NULL, (unsigned)nranks);
  pthread_t th[MAXN];
  for (long r = 0; r < nranks; r++) pthread_create(&th[r], NULL, rank_main, (void *)r);
  int bad = 0;
  for (int r = 0; r < nranks; r++) {
    pthread_join(th[r], NULL);
    bad += failures[r];
  }
  const char *path = getenv("BRIGADE_CUDA_MODULE");
  void *mod = path ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : NULL;
  long (*launch_loads)(void) = NULL;
  if (mod) *(void **)&launch_loads = dlsym(mod, "brg__emu_launch_loads");
  const char *lazy = getenv("BRIGADE_EMU_LAZY_LOAD"), *strict = getenv("BRIGADE_EMU_STRICT");
  int lazy_on = lazy && *lazy ? atoi(lazy) != 0 : strict && atoi(strict) != 0;
  if (launch_loads && lazy_on && !expect_unavailable && launch_loads() != 0) {
    fprintf(stderr,
            "FAIL: %ld kernel(s) loaded at a launch, each waiting for every kernel of the "
            "process there (the setup's load_kernels should have loaded them all)\n",
            launch_loads());
    bad++;
  }
  printf("test_device_threads N=%d%s: %s\n", nranks, per_thread ? " (cudaStreamPerThread)" : "",
         bad ? "FAILED" : "ok");
  return bad ? 1 : 0;
}
