/*
 * Kernel benchmark: bytes per second the CUDA reduce kernel moves, against
 * a device-to-device cudaMemcpy of the same size in the same run.
 *
 *   gpu_kernel_bench [-b min_bytes] [-e max_bytes] [-n iters] [-w warmup] [-B blocks]
 *
 * Bytes moved: reduce reads two inputs and writes one output (3 x size;
 * 4 x size with a second output, the recv-reduce-copy-send form); memcpy
 * reads and writes once (2 x size). "vs copy" is the reduce rate over the
 * copy rate, both counted that way: 100% means the reduce streams through
 * HBM as fast as the copy engine does. Timing uses CUDA events around
 * `iters` back-to-back launches after `warmup` untimed ones.
 *
 * Each sum runs with the grid the collectives use (at most -B blocks, the
 * default of BRIGADE_DEVICE_BLOCKS unless given) and with the full GPU
 * (every block that fits at once, at most 1024). At 256 MiB the last lines
 * hold float32, bfloat16 and float16 against the targets: 90%, 90% and 85%
 * of the copy rate. Exits 77 when there is no GPU.
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "brigade.h"
#include "brg_cuda.h"
#include "cuda_check.h"

static size_t parse_size(const char *s) {
  char *end;
  double v = strtod(s, &end);
  switch (*end) {
  case 'G':
  case 'g': v *= 1 << 30; break;
  case 'M':
  case 'm': v *= 1 << 20; break;
  case 'K':
  case 'k': v *= 1 << 10; break;
  }
  return (size_t)v;
}

struct timer {
  cudaEvent_t start, stop;
};

/* Average seconds per call of fn over iters calls. */
template <class Fn> static double time_it(timer &t, int warmup, int iters, Fn fn) {
  for (int i = 0; i < warmup; i++) BRG_CUDA_CHECK((cudaError_t)fn());
  BRG_CUDA_CHECK(cudaEventRecord(t.start, 0));
  for (int i = 0; i < iters; i++) BRG_CUDA_CHECK((cudaError_t)fn());
  BRG_CUDA_CHECK(cudaEventRecord(t.stop, 0));
  BRG_CUDA_CHECK(cudaEventSynchronize(t.stop));
  float ms = 0;
  BRG_CUDA_CHECK(cudaEventElapsedTime(&ms, t.start, t.stop));
  return ms / 1e3 / iters;
}

#define DEFAULT_BLOCKS 32 /* BRIGADE_DEVICE_BLOCKS's default */
#define FULL_BLOCKS 1024  /* the largest bound: the grid is then what fits */
#define TARGET_BYTES ((size_t)256 << 20)

int main(int argc, char **argv) {
  size_t min_bytes = 1 << 20, max_bytes = (size_t)256 << 20;
  int iters = 20, warmup = 5, blocks = DEFAULT_BLOCKS;
  for (int i = 1; i < argc; i += 2) {
    if (i + 1 < argc && !strcmp(argv[i], "-b"))
      min_bytes = parse_size(argv[i + 1]);
    else if (i + 1 < argc && !strcmp(argv[i], "-e"))
      max_bytes = parse_size(argv[i + 1]);
    else if (i + 1 < argc && !strcmp(argv[i], "-n"))
      iters = atoi(argv[i + 1]);
    else if (i + 1 < argc && !strcmp(argv[i], "-w"))
      warmup = atoi(argv[i + 1]);
    else if (i + 1 < argc && !strcmp(argv[i], "-B"))
      blocks = atoi(argv[i + 1]);
    else {
      fprintf(stderr,
              "usage: %s [-b min_bytes] [-e max_bytes] [-n iters] [-w warmup] [-B blocks]\n",
              argv[0]);
      return 2;
    }
  }
  const brg__cuda_api *api = brg__cuda_module_api();
  if (api->kern.set_max_blocks(blocks) != 0) {
    fprintf(stderr, "gpu_kernel_bench: -B %d: the grid bound is 1 to %d blocks\n", blocks,
            FULL_BLOCKS);
    return 2;
  }
  char why[256];
  if (api->drv.probe(why, sizeof why) <= 0) {
    printf("gpu_kernel_bench: skipped: %s\n", why);
    return 77;
  }
  char desc[256];
  api->drv.describe(desc, sizeof desc);
  printf("# %s\n", desc);

  char *a, *b, *d0, *d1;
  BRG_CUDA_CHECK(cudaMalloc(&a, max_bytes));
  BRG_CUDA_CHECK(cudaMalloc(&b, max_bytes));
  BRG_CUDA_CHECK(cudaMalloc(&d0, max_bytes));
  BRG_CUDA_CHECK(cudaMalloc(&d1, max_bytes));
  /* Small values (0x3c00 / 0x3f80 in the halves, about 1.0), so no op
   * turns into Inf or NaN handling along the way. */
  BRG_CUDA_CHECK(cudaMemset(a, 0x3c, max_bytes));
  BRG_CUDA_CHECK(cudaMemset(b, 0x3c, max_bytes));
  BRG_CUDA_CHECK(cudaDeviceSynchronize());
  timer t;
  BRG_CUDA_CHECK(cudaEventCreate(&t.start));
  BRG_CUDA_CHECK(cudaEventCreate(&t.stop));

  int sms = 0, dev = 0;
  BRG_CUDA_CHECK(cudaGetDevice(&dev));
  BRG_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  printf("# GB/s = bytes read + written per second (1e9); vs copy = reduce GB/s / memcpy GB/s\n");
  printf("# grids: B = at most %d blocks of 256 threads (-B; BRIGADE_DEVICE_BLOCKS), "
         "full = every block that fits on the %d SMs (at most %d)\n",
         blocks, sms, FULL_BLOCKS);
  printf("%12s %10s %10s %10s %10s %8s %12s %8s %10s %8s\n", "bytes", "memcpy", "dtype", "time(us)",
         "reduce B", "vs copy", "reduce2out B", "vs copy", "reduce full", "vs copy");
  struct {
    brg_dtype dtype;
    const char *name;
    size_t size;
    double target;       /* share of the copy rate the sum must reach at 256 MiB */
    double at_target[2]; /* measured there: grid B, full grid; < 0: not measured */
  } dts[] = {{BRG_FLOAT32, "float32", 4, 90, {-1, -1}},
             {BRG_BFLOAT16, "bfloat16", 2, 90, {-1, -1}},
             {BRG_FLOAT16, "float16", 2, 85, {-1, -1}}};
  for (size_t size = min_bytes; size <= max_bytes; size *= 4) {
    double tc = time_it(t, warmup, iters,
                        [&] { return cudaMemcpyAsync(d0, a, size, cudaMemcpyDeviceToDevice, 0); });
    double copy_gbs = 2.0 * size / tc / 1e9;
    for (auto &d : dts) {
      brg_dtype dt = d.dtype;
      size_t n = size / d.size;
      auto sum1 = [&] { return api->kern.reduce(d0, NULL, a, b, n, dt, BRG_SUM, 1, NULL); };
      BRG_CUDA_CHECK((cudaError_t)api->kern.set_max_blocks(blocks));
      double tr = time_it(t, warmup, iters, sum1);
      double tr2 = time_it(t, warmup, iters,
                           [&] { return api->kern.reduce(d0, d1, a, b, n, dt, BRG_SUM, 1, NULL); });
      BRG_CUDA_CHECK((cudaError_t)api->kern.set_max_blocks(FULL_BLOCKS));
      double tf = time_it(t, warmup, iters, sum1);
      double r_gbs = 3.0 * size / tr / 1e9, r2_gbs = 4.0 * size / tr2 / 1e9;
      double f_gbs = 3.0 * size / tf / 1e9;
      printf("%12zu %10.1f %10s %10.1f %10.1f %7.1f%% %12.1f %7.1f%% %11.1f %7.1f%%\n", size,
             copy_gbs, d.name, tr * 1e6, r_gbs, 100.0 * r_gbs / copy_gbs, r2_gbs,
             100.0 * r2_gbs / copy_gbs, f_gbs, 100.0 * f_gbs / copy_gbs);
      if (size == TARGET_BYTES) {
        d.at_target[0] = 100.0 * r_gbs / copy_gbs;
        d.at_target[1] = 100.0 * f_gbs / copy_gbs;
      }
    }
  }
  /* The verdicts, one line per grid; device-check.sh copies "# GPU" lines
   * into its summary. */
  for (int g = 0; g < 2; g++) {
    if (dts[0].at_target[g] < 0) break;
    char grid[32];
    if (g == 0)
      snprintf(grid, sizeof grid, "%d blocks", blocks);
    else
      snprintf(grid, sizeof grid, "full grid");
    printf("# GPU sum vs copy at %zu bytes, %s:", TARGET_BYTES, grid);
    for (auto &d : dts)
      printf(" %s %.1f%% (target %.0f%%) %s;", d.name, d.at_target[g], d.target,
             d.at_target[g] >= d.target ? "ok" : "BELOW");
    printf("\n");
  }
  cudaFree(a);
  cudaFree(b);
  cudaFree(d0);
  cudaFree(d1);
  return 0;
}
