/*
 * Kernel mode's co-residency: N ranks as threads of one process on one
 * GPU, each on its own stream, whose blocks must all run at once (they
 * wait for each other's flags). On the emulated module with few block
 * slots (BRIGADE_EMU_SMS x BRIGADE_EMU_BLOCKS_PER_SM), as on a small GPU.
 *
 *   test_device_occupancy N fit     every rank's allreduce (float32 sum)
 *                                   and broadcast are right, and no more
 *                                   blocks ran at once than the GPU holds
 *   test_device_occupancy N unfit   not even one channel a rank fits:
 *                                   every rank's first collective fails
 *                                   with BRG_ERR_UNAVAILABLE naming the
 *                                   numbers, at once (no watchdog)
 *
 * Run with BRIGADE_DEVICE_MODE=kernel and more channels than fit
 * (BRIGADE_DEVICE_CHANNELS): setup must shape them down rather than
 * launch blocks that wait for ever for blocks that cannot start.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "brigade.h"
#include "device.h"

#define COUNT 300007
#define MAXN 8

static const brg__cuda_api *api;
static brg_unique_id id;
static int nranks = 4, unfit;
static int failures[MAXN];

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void *rank_main(void *arg) {
  int rank = (int)(long)arg;
  brg_comm *c = NULL;
  float *host = malloc(COUNT * sizeof *host);
  void *d = NULL, *st = NULL;
  brg_status s = brg_comm_init(&c, nranks, &id, rank);
  if (s != BRG_SUCCESS || !host || api->drv.mem_alloc(&d, COUNT * sizeof *host) ||
      api->drv.stream_create(&st)) {
    fprintf(stderr, "rank %d: setup failed: %s\n", rank, c ? brg_comm_last_error(c) : "");
    failures[rank]++;
    goto out;
  }
  for (int i = 0; i < COUNT; i++) host[i] = (float)((i % 1000) + rank);
  api->drv.mem_copy(d, host, COUNT * sizeof *host);
  s = brg_allreduce(d, d, COUNT, BRG_FLOAT32, BRG_SUM, c, st);
  if (unfit) {
    const char *msg = brg_comm_last_error(c);
    printf("rank %d: %s: %s\n", rank, brg_status_string(s), msg);
    if (s != BRG_ERR_UNAVAILABLE || !strstr(msg, "blocks at once") || !strstr(msg, "SMs x")) {
      fprintf(stderr, "rank %d: FAIL: expected BRG_ERR_UNAVAILABLE naming the GPU's blocks\n",
              rank);
      failures[rank]++;
    }
    goto out;
  }
  if (s == BRG_SUCCESS) s = brg_broadcast(d, d, 7, BRG_FLOAT32, nranks - 1, c, st);
  if (s != BRG_SUCCESS) {
    fprintf(stderr, "rank %d: %s: %s\n", rank, brg_status_string(s), brg_comm_last_error(c));
    failures[rank]++;
    goto out;
  }
  api->drv.stream_sync(st);
  brg_status as = BRG_SUCCESS;
  brg_comm_get_async_error(c, &as);
  if (as != BRG_SUCCESS) {
    fprintf(stderr, "rank %d: FAIL: the kernels stopped: %s: %s\n", rank, brg_status_string(as),
            brg_comm_last_error(c));
    failures[rank]++;
    goto out;
  }
  api->drv.mem_copy(host, d, COUNT * sizeof *host);
  /* sum over ranks of (i % 1000 + r) = N (i % 1000) + N(N-1)/2 */
  for (int i = 0; i < COUNT; i++) {
    float want = (float)(nranks * (i % 1000) + nranks * (nranks - 1) / 2);
    if (host[i] != want) {
      if (failures[rank] < 5)
        fprintf(stderr, "rank %d: element %d is %g, expected %g\n", rank, i, host[i], want);
      failures[rank]++;
    }
  }
out:
  if (st) api->drv.stream_destroy(st);
  if (d) api->drv.mem_free(d);
  free(host);
  if (c) brg_comm_destroy(c);
  return NULL;
}

int main(int argc, char **argv) {
  if (argc > 1) nranks = atoi(argv[1]);
  unfit = argc > 2 && !strcmp(argv[2], "unfit");
  if (nranks < 2 || nranks > MAXN) return 2;
  const char *why = "";
  api = brg__device_api(&why);
  if (!api) {
    fprintf(stderr, "FAIL: no GPU: %s\n", why);
    return 1;
  }
  /* the emulated module's count of blocks that ran at once */
  const char *path = getenv("BRIGADE_CUDA_MODULE");
  void *mod = path ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : NULL;
  unsigned (*most)(int) = mod ? (unsigned (*)(int))dlsym(mod, "brg__emu_blocks_most") : NULL;
  if (!most) {
    fprintf(stderr, "FAIL: %s is not the emulated module (no brg__emu_blocks_most)\n", path);
    return 1;
  }
  if (brg_get_unique_id(&id) != BRG_SUCCESS) return 1;
  double t0 = now_s();
  pthread_t th[MAXN];
  for (long r = 0; r < nranks; r++) pthread_create(&th[r], NULL, rank_main, (void *)r);
  int bad = 0;
  for (int r = 0; r < nranks; r++) {
    pthread_join(th[r], NULL);
    bad += failures[r];
  }
  const char *sms = getenv("BRIGADE_EMU_SMS"), *per = getenv("BRIGADE_EMU_BLOCKS_PER_SM");
  unsigned cap = sms && per ? (unsigned)(atoi(sms) * atoi(per)) : 0, ran = most(0);
  printf("%d ranks on one GPU of %u block slots: at most %u blocks ran at once, %.1f s\n", nranks,
         cap, ran, now_s() - t0);
  if (!unfit && (ran == 0 || (cap && ran > cap))) {
    fprintf(stderr, "FAIL: %u blocks ran at once on a GPU of %u slots\n", ran, cap);
    bad++;
  }
  printf("test_device_occupancy N=%d %s: %s\n", nranks, unfit ? "unfit" : "fit",
         bad ? "FAILED" : "ok");
  return bad ? 1 : 0;
}
