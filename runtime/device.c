/*
 * Loader of the CUDA module. libbrigade.so has no link-time dependency on
 * CUDA: the module is found and opened here, at the first device call, in
 * this order:
 *
 *   1. beside the library that holds this code (installed trees);
 *   2. the module of the build tree this library came from (tests, bench);
 *   3. the dynamic loader's own search (LD_LIBRARY_PATH, ldconfig).
 *
 * The module links cudart statically, and cudart opens libcuda.so.1 itself,
 * so a machine without the driver loads the module fine and fails at the
 * probe with the driver's reason.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "device.h"
#include "device_config.h"
#include "settings.h"
#include "internal.h"

#define MODULE_NAME "libbrigade_cuda.so"

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static const brg__cuda_api *loaded_api;
static char load_why[BRG__ERRLEN];

static void *open_module(char *tried, size_t n) {
  char path[4096];
  size_t o = 0;
  Dl_info info;
  /* 0. BRIGADE_CUDA_MODULE names it. */
  const char *forced = brg__device_str(BRG__DEVICE_CUDA_MODULE);
  if (forced && forced[0]) {
    void *h = dlopen(forced, RTLD_NOW | RTLD_LOCAL);
    if (!h) snprintf(tried, n, "BRIGADE_CUDA_MODULE=%s: %s", forced, dlerror());
    return h;
  }
  /* 1. Beside the library (or executable) this code was linked into. */
  if (dladdr((void *)&brg__device_api, &info) && info.dli_fname && strchr(info.dli_fname, '/')) {
    snprintf(path, sizeof path, "%s", info.dli_fname);
    *strrchr(path, '/') = 0;
    size_t len = strlen(path);
    snprintf(path + len, sizeof path - len, "/%s", MODULE_NAME);
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (h) return h;
    o += (size_t)snprintf(tried + o, n - o, "%s: %s; ", path, dlerror());
  }
  /* 2. The build tree, when it is still there. */
  if (BRG_CUDA_MODULE_BUILD[0] && access(BRG_CUDA_MODULE_BUILD, F_OK) == 0) {
    void *h = dlopen(BRG_CUDA_MODULE_BUILD, RTLD_NOW | RTLD_LOCAL);
    if (h) return h;
    if (o < n)
      o += (size_t)snprintf(tried + o, n - o, "%s: %s; ", BRG_CUDA_MODULE_BUILD, dlerror());
  }
  /* 3. The loader's search path. */
  void *h = dlopen(MODULE_NAME, RTLD_NOW | RTLD_LOCAL);
  if (h) return h;
  if (o < n) snprintf(tried + o, n - o, "%s", dlerror());
  return NULL;
}

static void load(void) {
  brg__log_init();
  const char *forced = brg__device_str(BRG__DEVICE_CUDA_MODULE);
  if (BRG_CUDA_NOT_BUILT[0] && !(forced && forced[0])) {
    snprintf(load_why, sizeof load_why, "brigade was built without CUDA (%s)", BRG_CUDA_NOT_BUILT);
    return;
  }
  char tried[BRG__ERRLEN - 64];
  tried[0] = 0;
  void *h = open_module(tried, sizeof tried);
  if (!h) {
    snprintf(load_why, sizeof load_why, "the CUDA module could not be loaded: %s", tried);
    return;
  }
  const brg__cuda_api *api = brg__cuda_table(h);
  if (!api || api->abi != BRG__CUDA_ABI) {
    snprintf(load_why, sizeof load_why,
             "the CUDA module does not match this library (interface %d, expected %d)",
             api ? api->abi : -1, BRG__CUDA_ABI);
    dlclose(h);
    return;
  }
  api->kern.set_max_blocks(
      (int)brg__device_int(BRG__DEVICE_BLOCKS)); /* 1..1024, as the module takes */
  char why[256] = "";
  if (api->drv.probe(why, sizeof why) <= 0) {
    snprintf(load_why, sizeof load_why, "no usable GPU: %s", why);
    /* The module stays open: cudart cannot be unloaded cleanly once started. */
    return;
  }
  char desc[256];
  api->drv.describe(desc, sizeof desc);
  BRG__INFO("init", "CUDA module loaded: %s", desc);
  loaded_api = api;
}

const brg__cuda_api *brg__device_api(const char **why) {
  pthread_once(&load_once, load);
  if (!loaded_api && why) *why = load_why;
  return loaded_api;
}

/* Whether the process has the CUDA driver or the configured CUDA module
 * loaded, looked at no more than once a second until it is: only then can
 * a buffer be GPU memory, and host calls look at their pointers. */
static int driver_loaded(brg_comm *c) {
  if (__atomic_load_n(&c->cuda_seen, __ATOMIC_RELAXED)) return 1;
  static __thread int64_t last_probe_ns;
  int64_t now = brg__now_ns();
  if (last_probe_ns && now - last_probe_ns < 1000000000) return 0;
  last_probe_ns = now;
  const char *forced = brg__device_str(BRG__DEVICE_CUDA_MODULE);
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (!h && forced && forced[0]) h = dlopen(forced, RTLD_NOW | RTLD_NOLOAD);
  if (!h) return 0;
  dlclose(h);
  __atomic_store_n(&c->cuda_seen, 1, __ATOMIC_RELAXED);
  return 1;
}

/* The communicator's GPU is the first one a device collective used. */
static brg_status claim_gpu(brg_comm *c, const char *fn, int d, const char *whose) {
  int expect = -1;
  if (!__atomic_compare_exchange_n(&c->gpu, &expect, d, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE) &&
      expect != d)
    return brg__comm_error(c, BRG_ERR_INVALID_USAGE,
                           "%s: this communicator runs its device collectives on GPU %d, but %s "
                           "is on GPU %d: use one communicator per GPU",
                           fn, expect, whose, d);
  return BRG_SUCCESS;
}

brg_status brg__device_choose(brg_comm *c, const char *fn, int device, int *gpu) {
  const char *why = "";
  const brg__cuda_api *api = brg__device_api(&why);
  if (!api)
    return brg__comm_error(c, BRG_ERR_UNAVAILABLE, "%s: device collectives are unavailable: %s", fn,
                           why);
  int n = api->drv.probe(NULL, 0);
  if (device < 0 && api->drv.get_device(&device) != 0) device = 0;
  if (device >= n)
    return brg__comm_error(c, BRG_ERR_INVALID_ARGUMENT, "%s: device %d is not in [0, %d)", fn,
                           device, n);
  __atomic_store_n(&c->cuda_seen, 1, __ATOMIC_RELAXED);
  char whose[32];
  snprintf(whose, sizeof whose, "device %d", device);
  brg_status s = claim_gpu(c, fn, device, whose);
  if (s == BRG_SUCCESS) *gpu = device;
  return s;
}

brg_status brg__device_classify(brg_comm *c, const char *fn, const void *sendbuf,
                                const void *recvbuf, brg_stream stream, int *device, int *gpu) {
  *device = 0;
  *gpu = -1;
  if (!stream && !driver_loaded(c)) return BRG_SUCCESS;
  const char *why = "";
  const brg__cuda_api *api = brg__device_api(&why);
  if (!api) {
    if (!stream) return BRG_SUCCESS; /* no GPU: every buffer is host memory */
    return brg__comm_error(c, BRG_ERR_UNAVAILABLE,
                           "%s: a stream was given, but device collectives are unavailable: %s "
                           "(host buffers take stream = NULL)",
                           fn, why);
  }
  __atomic_store_n(&c->cuda_seen, 1, __ATOMIC_RELAXED);
  const void *bufs[2] = {sendbuf, recvbuf};
  const char *names[2] = {"sendbuf", "recvbuf"};
  int dev[2] = {-1, -1}, on_gpu[2] = {0, 0}, nbuf = 0, ngpu = 0;
  for (int i = 0; i < 2; i++) {
    if (!bufs[i]) continue;
    nbuf++;
    on_gpu[i] = api->drv.pointer_is_device(bufs[i], &dev[i]);
    ngpu += on_gpu[i];
  }
  if (ngpu == 0) {
    if (!stream) return BRG_SUCCESS;
    for (int i = 0; i < 2; i++)
      if (bufs[i])
        return brg__comm_error(c, BRG_ERR_INVALID_ARGUMENT,
                               "%s: a stream was given, but %s %p is host memory (host buffers "
                               "take stream = NULL, device buffers a stream or NULL)",
                               fn, names[i], bufs[i]);
    /* no buffer at all (count 0): a device collective on the stream */
  }
  if (ngpu < nbuf) {
    int h = on_gpu[0] ? 1 : 0, g = 1 - h;
    return brg__comm_error(c, BRG_ERR_INVALID_ARGUMENT,
                           "%s: %s %p is GPU memory (device %d) but %s %p is host memory: both "
                           "buffers must be on the GPU (with a stream, or NULL for the legacy "
                           "default stream) or both in host memory (stream NULL)",
                           fn, names[g], bufs[g], dev[g], names[h], bufs[h]);
  }
  if (ngpu == 2 && dev[0] != dev[1])
    return brg__comm_error(c, BRG_ERR_INVALID_ARGUMENT,
                           "%s: sendbuf %p is on GPU %d but recvbuf %p on GPU %d: a collective's "
                           "buffers must be on one GPU",
                           fn, sendbuf, dev[0], recvbuf, dev[1]);
  int d = ngpu ? (on_gpu[0] ? dev[0] : dev[1]) : -1;
  if (d < 0 && api->drv.get_device(&d) != 0) d = 0; /* no buffer: the current device */
  char whose[64] = "the current device";
  if (ngpu)
    snprintf(whose, sizeof whose, "%s %p", on_gpu[0] ? "sendbuf" : "recvbuf",
             on_gpu[0] ? sendbuf : recvbuf);
  brg_status s = claim_gpu(c, fn, d, whose);
  if (s != BRG_SUCCESS) return s;
  *device = 1;
  *gpu = d;
  return BRG_SUCCESS;
}

brg_status brg__device_enter(brg_comm *c, int gpu, int *prev) {
  const brg__cuda_api *api = brg__device_api(NULL);
  *prev = -1;
  int cur = -1;
  int e = api->drv.get_device(&cur);
  if (!e && cur == gpu) return BRG_SUCCESS;
  if (!e) e = api->drv.set_device(gpu);
  if (e)
    return brg__comm_error(c, BRG_ERR_SYSTEM, "rank %d: cudaSetDevice(%d) failed: %s", c->rank, gpu,
                           api->drv.error_string(e));
  *prev = cur;
  return BRG_SUCCESS;
}

void brg__device_leave(int prev) {
  if (prev >= 0) brg__device_api(NULL)->drv.set_device(prev);
}

brg_status brg__device_check_call(brg_comm *c, const char *fn, const void *sendbuf,
                                  const void *recvbuf, brg_stream stream, brg__coll *k) {
  brg_status s = brg__device_classify(c, fn, sendbuf, recvbuf, stream, &k->device, &k->gpu);
  if (s != BRG_SUCCESS || !k->device) return s;
  const brg__cuda_api *api = brg__device_api(NULL);
  int capturing = 0;
  if (api->drv.stream_capturing(stream, &capturing) != 0 || !capturing) {
    api->drv.last_error(); /* a query that failed leaves no error behind */
    return BRG_SUCCESS;
  }
  if (!k->staged) return brg__device_capture_check(c, fn, k); /* kernel mode's rules */
  /* Staged through host memory by the calling thread, which waits for
   * the stream: nothing a CUDA graph can hold. */
  api->drv.last_error();
  return brg__comm_error(c, BRG_ERR_INVALID_USAGE,
                         "%s: stream %p is capturing a CUDA graph, but %s on GPU buffers is "
                         "staged through host memory by the calling thread, which a graph "
                         "cannot hold: call it outside the capture",
                         fn, stream, brg__coll_name(k->kind));
}
