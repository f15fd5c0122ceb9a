/*
 * The real CUDA module's answers that need no GPU, on every machine where
 * it is built:
 *
 * - set_max_blocks takes 1 to 1024 and refuses the rest;
 * - error_string explains the module's own code for a device or driver
 *   without dmabuf support, which the runtime logs when it falls back to
 *   staging;
 * - with a driver older than the toolkit (LD_LIBRARY_PATH names the fake
 *   libcuda.so.1 of old_driver/, a driver for CUDA 12.2), the probe says
 *   which CUDA version the driver supports and which one it needs.
 *
 *   test_module_nogpu MODULE_PATH
 */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "brg_cuda.h"

static int failures;

static void expect(int ok, const char *what, const char *detail) {
  if (ok) return;
  fprintf(stderr, "FAIL %s: %s\n", what, detail);
  failures++;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s MODULE_PATH\n", argv[0]);
    return 2;
  }
  void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    fprintf(stderr, "%s\n", dlerror());
    return 1;
  }
  const brg__cuda_api *api = brg__cuda_table(h);
  if (!api || api->abi != BRG__CUDA_ABI) {
    fprintf(stderr, "%s: no table of interface %d\n", argv[1], BRG__CUDA_ABI);
    return 1;
  }

  char detail[96];
  static const struct {
    int blocks, ok;
  } bounds[] = {{0, 0}, {-1, 0}, {1, 1}, {32, 1}, {1024, 1}, {1025, 0}};
  for (size_t i = 0; i < sizeof bounds / sizeof bounds[0]; i++) {
    int e = api->kern.set_max_blocks(bounds[i].blocks);
    snprintf(detail, sizeof detail, "set_max_blocks(%d) returned %d", bounds[i].blocks, e);
    expect((e == 0) == bounds[i].ok, "grid bound", detail);
  }

  const char *s = api->drv.error_string(BRG__CUDA_ERR_NO_DMABUF);
  printf("error_string(BRG__CUDA_ERR_NO_DMABUF): %s\n", s);
  expect(s && strstr(s, "dmabuf") && strstr(s, "not supported"), "dmabuf error text",
         s ? s : "NULL");
  /* device_ring.c's brg__dev_gdr_offer_slots logs it behind "no dmabuf for GPU memory: " in 128 bytes. */
  expect(s && strlen(s) < 128 - 27, "dmabuf error text", "too long for the runtime's log");

  char why[256] = "";
  int n = api->drv.probe(why, sizeof why);
  printf("probe with a driver for CUDA 12.2: %d: %s\n", n, why);
  expect(n <= 0, "old driver", "the probe found a device");
  expect(strstr(why, "driver supports CUDA 12.2") != NULL, "old driver", "no driver version");
  expect(strstr(why, "built with CUDA ") != NULL, "old driver", "no toolkit version");
  expect(strstr(why, "or newer") != NULL, "old driver", "no minimum version");

  if (failures) {
    fprintf(stderr, "test_module_nogpu: %d checks failed\n", failures);
    return 1;
  }
  printf("test_module_nogpu: ok\n");
  return 0;
}
