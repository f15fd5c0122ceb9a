/*
 * The memory roofline: a STREAM-style copy by two threads, each copying its
 * half of a 512 MiB source into its half of a 512 MiB destination (1 GiB in
 * all, about 4x the 260 MiB L3 of the machines we run on, so the copy goes to
 * DRAM). B counts bytes read plus bytes written per second, the best of a
 * few passes. An allreduce of S bytes on N ranks of one host has to read the
 * N inputs and write the N outputs, 2NS bytes, so algbw <= B / 2N and
 * busbw = algbw 2(N-1)/N <= B (N-1) / N^2.
 */
#include "bench_internal.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define COPY_BYTES ((size_t)512 << 20) /* per buffer, both threads together */
#define COPY_THREADS 2
#define COPY_PASSES 5

typedef struct copy_arg {
  char *dst;
  const char *src;
  size_t bytes;
  pthread_barrier_t *bar;
  double *pass_s; /* written by thread 0 */
  int id;
} copy_arg;

static void *copy_thread(void *p) {
  copy_arg *a = p;
  memset(a->dst, 1, a->bytes); /* each thread faults in its own pages */
  memset((char *)a->src, 2, a->bytes);
  memcpy(a->dst, a->src, a->bytes); /* warm */
  for (int i = 0; i < COPY_PASSES; i++) {
    pthread_barrier_wait(a->bar);
    double t0 = bench_now_s();
    memcpy(a->dst, a->src, a->bytes);
    pthread_barrier_wait(a->bar);
    if (a->id == 0) a->pass_s[i] = bench_now_s() - t0;
  }
  return NULL;
}

/* Bytes read + written per second, or 0 when it could not be measured. */
static double measure_copy_rate(void) {
  char *src = aligned_alloc(ALIGN, COPY_BYTES), *dst = aligned_alloc(ALIGN, COPY_BYTES);
  double pass_s[COPY_PASSES] = {0}, best = 0;
  pthread_barrier_t bar;
  pthread_t th[COPY_THREADS];
  copy_arg args[COPY_THREADS];
  int started = 0;
  if (src == NULL || dst == NULL) goto out;
  pthread_barrier_init(&bar, NULL, COPY_THREADS);
  for (int i = 0; i < COPY_THREADS; i++) {
    size_t part = COPY_BYTES / COPY_THREADS;
    args[i] = (copy_arg){.dst = dst + i * part,
                         .src = src + i * part,
                         .bytes = part,
                         .bar = &bar,
                         .pass_s = pass_s,
                         .id = i};
    if (pthread_create(&th[i], NULL, copy_thread, &args[i]) != 0) break;
    started++;
  }
  if (started < COPY_THREADS) {
    /* a started thread would wait on the barrier for ever */
    fprintf(stderr, "%s: cannot start the copy threads (run with -R 0)\n", bench_prog);
    exit(1);
  }
  for (int i = 0; i < COPY_THREADS; i++) pthread_join(th[i], NULL);
  pthread_barrier_destroy(&bar);
  for (int i = 0; i < COPY_PASSES; i++)
    if (pass_s[i] > 0 && (best == 0 || pass_s[i] < best)) best = pass_s[i];
out:
  free(src);
  free(dst);
  return best > 0 ? 2.0 * (double)COPY_BYTES / best : 0;
}

/*
 * The GPU roofline (-G): cudaMemcpy device to device of 256 MiB, bytes read
 * plus written per second, the best of a few. The ring in step mode moves,
 * per rank and allreduce of S bytes, (6N-4)/N x S bytes through HBM: the
 * first step reads and writes a chunk (2), N-2 reduce steps read two and
 * write one (3 each), the middle step reads two and writes two (4), N-2
 * copy steps read one and write two (3 each), the last reads and writes one
 * (2), in chunks of S/N. With G ranks on one GPU its HBM carries G times
 * that, so busbw <= copy rate / (G (6N-4)/N) x 2(N-1)/N.
 */
#define GPU_COPY_BYTES ((size_t)256 << 20)

static double measure_gpu_copy_rate(bench *b) {
  void *src = NULL, *dst = NULL;
  double best = 0;
  if (b->gpu->drv.mem_alloc(&src, GPU_COPY_BYTES) || b->gpu->drv.mem_alloc(&dst, GPU_COPY_BYTES)) {
    fprintf(stderr, "%s: no room for the 2 x 256 MiB copy of the roofline\n", bench_prog);
  } else {
    b->gpu->drv.mem_set(src, 1, GPU_COPY_BYTES);
    b->gpu->drv.mem_copy(dst, src, GPU_COPY_BYTES);
    /* Timed by events on the legacy stream, where cudaMemcpy runs. */
    for (int i = 0; i < 10; i++) {
      float ms = 0;
      bench_gpu_check(b, "cudaEventRecord", b->gpu->drv.event_record(b->ev_start, NULL));
      bench_gpu_check(b, "cudaMemcpy", b->gpu->drv.mem_copy(dst, src, GPU_COPY_BYTES));
      bench_gpu_check(b, "cudaEventRecord", b->gpu->drv.event_record(b->ev_end, NULL));
      bench_gpu_check(b, "cudaEventSynchronize", b->gpu->drv.event_sync(b->ev_end));
      bench_gpu_check(b, "cudaEventElapsedTime",
                      b->gpu->drv.event_elapsed_ms(&ms, b->ev_start, b->ev_end));
      double dt = (double)ms / 1e3;
      if (dt > 0 && (best == 0 || dt < best)) best = dt;
    }
  }
  if (src) b->gpu->drv.mem_free(src);
  if (dst) b->gpu->drv.mem_free(dst);
  return best > 0 ? 2.0 * (double)GPU_COPY_BYTES / best : 0;
}

void bench_roofline(bench *b) {
  brg_status st;
  if ((st = brg_barrier(b->comm)) != BRG_SUCCESS) bench_die_status(b, "brg_barrier", st);
  double rate = b->rank != 0 ? 0 : b->gpu ? measure_gpu_copy_rate(b) : measure_copy_rate();
  if ((st = brg_broadcast(&rate, &rate, 1, BRG_FLOAT64, 0, b->comm, NULL)) != BRG_SUCCESS)
    bench_die_status(b, "brg_broadcast (copy rate)", st);
  b->copy_rate = rate;
  double n = b->nranks;
  if (b->gpu) {
    if (b->nranks > 1 && b->coll->kind == BENCH_ALLREDUCE)
      b->roof_busbw = rate / 1e9 / (b->gpu_share * (6 * n - 4) / n) * 2 * (n - 1) / n;
    if (b->rank != 0) return;
    printf("# GPU roofline: cudaMemcpy device to device %.1f GB/s (read + write, 256 MiB)\n",
           rate / 1e9);
    if (b->roof_busbw > 0)
      printf("#   the ring moves (6N-4)/N x size through HBM per rank, %d rank(s) per GPU: "
             "%%roof = HBM bytes per second / copy rate (busbw <= %.2f GB/s)\n",
             b->gpu_share, b->roof_busbw);
    if (b->csv)
      fprintf(b->csv, "#gpu_copy_rate_GBps,%.3f\n#roof_busbw_GBps,%.4f\n", rate / 1e9,
              b->roof_busbw);
    return;
  }
  if (b->nranks > 1) b->roof_busbw = rate / 1e9 * (n - 1) / (n * n);
  if (b->rank != 0) return;
  printf("# Memory roofline: two-thread copy %.1f GB/s (read + write, 2 x 512 MiB buffers)\n",
         rate / 1e9);
  if (b->nranks > 1)
    printf("#   allreduce reads N inputs and writes N outputs: busbw <= B (N-1)/N^2 = %.2f GB/s "
           "for N = %d (%%roof column)\n",
           b->roof_busbw, b->nranks);
  if (b->csv)
    fprintf(b->csv, "#copy_rate_GBps,%.3f\n#roof_busbw_GBps,%.4f\n", rate / 1e9, b->roof_busbw);
}
