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
    if (o < n) o += (size_t)snprintf(tried + o, n - o, "%s: %s; ", BRG_CUDA_MODULE_BUILD, dlerror());
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
  api->set_max_blocks((int)brg__device_int(BRG__DEVICE_BLOCKS)); /* 1..1024, as the module takes */
  char why[256] = "";
  if (api->probe(why, sizeof why) <= 0) {
    snprintf(load_why, sizeof load_why, "no usable GPU: %s", why);
    /* The module stays open: cudart cannot be unloaded cleanly once started. */
    return;
  }
  char desc[256];
  api->describe(desc, sizeof desc);
  BRG__INFO("init", "CUDA module loaded: %s", desc);
  loaded_api = api;
}

const brg__cuda_api *brg__device_api(const char **why) {
  pthread_once(&load_once, load);
  if (!loaded_api && why) *why = load_why;
  return loaded_api;
}

brg_status brg__device_check_call(brg_comm *c, const char *fn, const void *sendbuf,
                                  const void *recvbuf, brg_stream stream) {
  (void)stream;
  c->cuda_seen = 1;
  const char *why = "";
  const brg__cuda_api *api = brg__device_api(&why);
  if (!api)
    return brg__comm_error(c, BRG_ERR_UNAVAILABLE,
                           "%s: a stream was given, but device collectives are unavailable: %s "
                           "(host buffers take stream = NULL)", fn, why);
  const void *bufs[2] = {sendbuf, recvbuf};
  const char *names[2] = {"sendbuf", "recvbuf"};
  for (int i = 0; i < 2; i++) {
    int dev = -1;
    if (bufs[i] && !api->pointer_is_device(bufs[i], &dev))
      return brg__comm_error(c, BRG_ERR_INVALID_ARGUMENT,
                             "%s: a stream was given, but %s %p is host memory (host buffers "
                             "take stream = NULL, device buffers a stream)", fn, names[i],
                             bufs[i]);
  }
  return BRG_SUCCESS;
}

/* Whether the process has the CUDA driver loaded, looked at no more than
 * once a second until it is: host calls then check their pointers, since a
 * GPU pointer given without a stream would otherwise crash in a memcpy. */
static int driver_loaded(brg_comm *c) {
  if (c->cuda_seen) return 1;
  static __thread int64_t last_probe_ns;
  int64_t now = brg__now_ns();
  if (last_probe_ns && now - last_probe_ns < 1000000000) return 0;
  last_probe_ns = now;
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (!h) return 0;
  dlclose(h);
  c->cuda_seen = 1;
  return 1;
}

brg_status brg__device_check_host_call(brg_comm *c, const char *fn, const void *sendbuf,
                                       const void *recvbuf) {
  if (!driver_loaded(c)) return BRG_SUCCESS;
  const brg__cuda_api *api = brg__device_api(NULL);
  if (!api) return BRG_SUCCESS;
  const void *bufs[2] = {sendbuf, recvbuf};
  const char *names[2] = {"sendbuf", "recvbuf"};
  for (int i = 0; i < 2; i++) {
    int dev = -1;
    if (bufs[i] && api->pointer_is_device(bufs[i], &dev))
      return brg__comm_error(c, BRG_ERR_INVALID_ARGUMENT,
                             "%s: %s %p is GPU memory (device %d) but no stream was given: "
                             "device buffers need a CUDA stream", fn, names[i], bufs[i], dev);
  }
  return BRG_SUCCESS;
}
