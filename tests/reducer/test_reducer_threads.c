/*
 * The reducer's device form with ranks as threads of one process on one
 * GPU, across its bucket rebuild. Under the emulated module's
 * BRIGADE_EMU_SYNC_FREE (cudaFree waits for all of the process's work on
 * the device, every stream) and kernel mode (each rank's collective is a
 * kernel that waits for its neighbours' kernels), GPU memory freed between
 * two passes waits for a neighbour's next bucket kernel, which waits for
 * this rank's next launch: a hang until the watchdog (BRIGADE_TIMEOUT_MS).
 * The reducer must keep what the rebuild retires until it is destroyed.
 *
 * Each rank registers float32 and float64 parameters, produces every
 * gradient with a copy on a stream of its own, marks it ready on that
 * stream in an order of its own, and runs NSTEPS blocking passes: the first
 * pass's ready order (rank 0's, registration order) differs from the
 * initial reverse-registration buckets, so the layout is rebuilt after it.
 * Three rounds: gradients in buffers of the caller's, then as bucket views
 * (which the rebuild carries into the new buckets), then in buffers with
 * rank 0 marking in reverse registration order, which rebuilds the same
 * buckets (where nothing may be allocated and freed either). After every
 * pass each element of each gradient is compared with the sum over ranks
 * computed here on the host (integer-valued, so the sum is exact in any
 * order). The test also checks that the layout did change (did not, in the
 * third).
 *
 * Whether a free in the passes hangs depends on a neighbour reaching its
 * next bucket first; so, on the emulated module, the device-wide waits
 * between the first prepare and the last finalize are also counted
 * (brg__emu_strict_counts, less the test's own synchronous copies), and
 * any is a failure that names the cause, at every run.
 *
 *   test_reducer_threads [N [ROUNDS]]   ROUNDS: digits of the rounds to run
 *                                       (default 012); exits 77 without a
 *                                       GPU (1 with BRIGADE_TEST_NO_SKIP)
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../kernels/cuda/brg_cuda.h"
#include "brigade.h"
#include "brigade_reducer.h"

#define MAXN 8
#define NPARAMS 7
#define NSTEPS 3

static const brg__cuda_api *api;
static brg_unique_id id;
static int nranks = 3;
static const char *rounds = "012";
static int failures[MAXN];
/* Between rounds and before the final frees: a rank's own cudaFree (or the
 * reducer's destroy) must not wait for a neighbour's kernel of the next
 * round, which waits for this rank. */
static pthread_barrier_t between;

static const size_t counts[NPARAMS] = {1000, 33, 5003, 7, 20011, 129, 3001};
static const brg_dtype dtypes[NPARAMS] = {BRG_FLOAT32, BRG_FLOAT64, BRG_FLOAT32, BRG_FLOAT32,
                                          BRG_FLOAT32, BRG_FLOAT64, BRG_FLOAT32};

static size_t bytes_of(size_t p) {
  return counts[p] * brg_dtype_size(dtypes[p]);
}

/* Where parameter p's result lands in the pinned buffer of all of them. */
static size_t out_at(size_t p) {
  size_t at = 0;
  for (size_t q = 0; q < p; q++) at += (bytes_of(q) + 63) / 64 * 64;
  return at;
}

/* The emulated module's count of device-wide waits other than kernel
 * loads (its strict rules); 0 on a GPU. */
static void (*strict_counts)(long *waits, long *loads);

/* The test's own synchronous copies in the passes, each one such wait
 * under BRIGADE_EMU_SYNC_FREE (behind the blocking streams). */
static long own_copies;

static long device_waits(void) {
  long waits = 0, loads = 0;
  if (strict_counts) strict_counts(&waits, &loads);
  return waits - loads;
}

/* Rank r's gradient of parameter p, element i, in pass `step`: an integer. */
static double value(int r, int step, size_t p, size_t i) {
  return (double)((i * 7 + p * 13 + (size_t)step * 31 + (size_t)r * 17) % 1001) - 500.0;
}

static void fill(void *buf, size_t p, int r, int step) {
  for (size_t i = 0; i < counts[p]; i++) {
    if (dtypes[p] == BRG_FLOAT32)
      ((float *)buf)[i] = (float)value(r, step, p, i);
    else
      ((double *)buf)[i] = value(r, step, p, i);
  }
}

static int report(int rank, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int report(int rank, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "rank %d: ", rank);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  failures[rank]++;
  return 1;
}

/* The buckets' parameter lists, one after another, with -1 between. */
static size_t layout_of(brg_reducer *red, long *out, size_t cap) {
  size_t nb = 0, k = 0;
  brg_reducer_num_buckets(red, &nb);
  for (size_t b = 0; b < nb; b++) {
    size_t n = 0;
    const size_t *members = NULL;
    brg_reducer_bucket_layout(red, b, NULL, NULL, &n, &members);
    for (size_t j = 0; j < n && k < cap; j++) out[k++] = (long)members[j];
    if (k < cap) out[k++] = -1;
  }
  return k;
}

static const char *round_name[3] = {"buffers", "views", "buffers, same buckets"};

/* One reducer, NSTEPS passes; 0 when every element was right. */
static int round_of(int rank, brg_comm *c, int round, void *prod, void **grad, void **src,
                    void **src_dev, void *out) {
  char what[160];
  int view = round == 1, same = round == 2;
  brg_reducer_param prm[NPARAMS];
  for (size_t p = 0; p < NPARAMS; p++)
    prm[p] = (brg_reducer_param){
        .name = NULL, .count = counts[p], .dtype = dtypes[p], .grad = view ? NULL : grad[p]};
  brg_reducer_config cfg = {.flags = BRG_REDUCER_DEVICE | BRG_REDUCER_SUM |
                                     (view ? BRG_REDUCER_GRAD_AS_VIEW : 0),
                            .first_bucket_cap_bytes = 4096,
                            .bucket_cap_bytes = 32768};
  brg_reducer *red = NULL;
  if (brg_reducer_create(&red, c, prm, NPARAMS, &cfg) != BRG_SUCCESS) {
    report(rank, "create: %s", brg_reducer_last_error(NULL));
    for (int k = 0; k < 5; k++) pthread_barrier_wait(&between); /* the others' waits */
    return 1;
  }
  /* The passes alone: nobody is in a synchronous call of the test's. */
  pthread_barrier_wait(&between);
  long waits0 = device_waits();
  pthread_barrier_wait(&between);
  long before[2 * NPARAMS + 2], after[2 * NPARAMS + 2];
  size_t nbefore = layout_of(red, before, 2 * NPARAMS + 2);
  int bad = 0;
  for (int step = 0; step < NSTEPS && !bad; step++) {
    snprintf(what, sizeof what, "%s, pass %d", round_name[round], step);
    /* src (pinned host memory) is rewritten: the last copies from it are
     * done. One wait, so that a rank gets to its next bucket as fast as the
     * reducer lets it. */
    api->drv.stream_sync(prod);
    for (size_t p = 0; p < NPARAMS; p++) fill(src[p], p, rank, step);
    if (brg_reducer_prepare(red, 0) != BRG_SUCCESS) {
      bad = report(rank, "%s: prepare: %s", what, brg_reducer_last_error(red));
      break;
    }
    /* Rank 0 marks in registration order (the rebuild takes its order),
     * the others in orders of their own (a step coprime with NPARAMS, which
     * is prime, so every parameter once). */
    for (size_t k = 0; k < NPARAMS && !bad; k++) {
      size_t p = (k * (size_t)(rank % (NPARAMS - 1) + 1) + (size_t)rank) % NPARAMS;
      if (same && rank == 0) p = NPARAMS - 1 - k; /* the order the buckets were made for */
      void *g = NULL;
      brg_reducer_grad(red, p, &g);
      api->kern.copy(g, NULL, src_dev[p], bytes_of(p), prod);
      if (brg_reducer_mark_ready_on(red, p, prod) != BRG_SUCCESS)
        bad = report(rank, "%s: mark_ready: %s", what, brg_reducer_last_error(red));
    }
    if (!bad && brg_reducer_finalize(red) != BRG_SUCCESS)
      bad = report(rank, "%s: finalize: %s", what, brg_reducer_last_error(red));
    brg_status async = BRG_SUCCESS;
    if (!bad && (brg_comm_get_async_error(c, &async) != BRG_SUCCESS || async != BRG_SUCCESS))
      bad = report(rank, "%s: the communicator's asynchronous error: %s", what,
                   brg_comm_last_error(c));
    /* Read back synchronously: without a round trip through a stream, a
     * rank that is done reaches its next bucket soon, while a neighbour
     * may still be in the rebuild. */
    for (size_t p = 0; p < NPARAMS && !bad; p++) {
      void *g = NULL;
      brg_reducer_grad(red, p, &g);
      api->drv.mem_copy((char *)out + out_at(p), g, bytes_of(p));
      __atomic_add_fetch(&own_copies, 1, __ATOMIC_RELAXED);
    }
    for (size_t p = 0; p < NPARAMS && !bad; p++) {
      const char *o = (const char *)out + out_at(p);
      for (size_t i = 0; i < counts[p]; i++) {
        double want = 0;
        for (int r = 0; r < nranks; r++) want += value(r, step, p, i);
        double got =
            dtypes[p] == BRG_FLOAT32 ? (double)((const float *)o)[i] : ((const double *)o)[i];
        if (got != want) {
          fprintf(stderr, "rank %d: %s: parameter %zu element %zu of %zu is %g, expected %g\n",
                  rank, what, p, i, counts[p], got, want);
          failures[rank]++;
          bad = 1;
          break;
        }
      }
    }
  }
  size_t nafter = layout_of(red, after, 2 * NPARAMS + 2);
  int unchanged = nbefore == nafter && !memcmp(before, after, nafter * sizeof(long));
  if (!bad && unchanged != same)
    bad = report(rank, "%s: the buckets %s after the first pass (the test needs %s)",
                 round_name[round], same ? "changed" : "were not rebuilt",
                 same ? "rank 0's order to be the one they were made for" : "a rebuild");
  /* Every rank's last collectives are done (blocking finalize) before any
   * rank's destroy frees. */
  pthread_barrier_wait(&between);
  /* Rank 0 alone reads and resets the counts (the next barrier orders it). */
  long waits = rank == 0
                   ? device_waits() - waits0 - __atomic_exchange_n(&own_copies, 0, __ATOMIC_RELAXED)
                   : 0;
  if (waits > 0)
    bad = report(rank,
                 "%s: %ld device-wide wait(s) of the emulated module during the passes (a GPU "
                 "free, unregister or legacy-stream copy between the first prepare and the last "
                 "finalize, which with ranks as threads can wait for a neighbour's kernel that "
                 "waits for this rank)",
                 round_name[round], waits);
  pthread_barrier_wait(&between); /* counted before anyone destroys */
  brg_reducer_destroy(red);
  pthread_barrier_wait(&between);
  return bad;
}

static void *rank_main(void *arg) {
  int rank = (int)(long)arg;
  brg_comm *c = NULL;
  void *prod = NULL, *grad[NPARAMS] = {0}, *src[NPARAMS] = {0}, *src_dev[NPARAMS] = {0};
  void *out = NULL, *out_dev = NULL;
  int reg[NPARAMS + 1] = {0};
  brg_status s = brg_comm_init(&c, nranks, &id, rank);
  int e = 0, ran = 0;
  if (s != BRG_SUCCESS) {
    report(rank, "setup: %s", brg_comm_last_error(c));
    goto out;
  }
  /* Producers copy from pinned host memory, on their stream. */
  e = api->drv.stream_create(&prod);
  for (size_t p = 0; p <= NPARAMS && !e; p++) {
    void **h = p < NPARAMS ? &src[p] : &out, **d = p < NPARAMS ? &src_dev[p] : &out_dev;
    size_t b = p < NPARAMS ? bytes_of(p) : out_at(NPARAMS);
    if (posix_memalign(h, 4096, b) != 0) {
      *h = NULL;
      report(rank, "setup: out of host memory");
      goto out;
    }
    e = api->drv.host_register(*h, b, d);
    reg[p] = !e;
    if (!e && p < NPARAMS) e = api->drv.mem_alloc(&grad[p], bytes_of(p));
  }
  /* The communicator's device side is set up before the rounds count. */
  if (!e) {
    s = brg_allreduce(grad[0], grad[0], counts[0], BRG_FLOAT32, BRG_SUM, c, prod);
    e = api->drv.stream_sync(prod);
  }
  if (e || s != BRG_SUCCESS) {
    report(rank, "setup: %s", e ? api->drv.error_string(e) : brg_comm_last_error(c));
    goto out;
  }
  pthread_barrier_wait(&between);
  /* Every round runs even after a failure of an earlier one (each then
   * fails too, and says where, once the communicator broke). */
  for (const char *r = rounds; *r; r++) round_of(rank, c, *r - '0', prod, grad, src, src_dev, out);
  ran = 1;
out:
  for (size_t k = 0; !ran && k < 1 + 5 * strlen(rounds); k++)
    pthread_barrier_wait(&between); /* the others' waits */
  pthread_barrier_wait(&between);
  if (prod) api->drv.stream_destroy(prod);
  for (size_t p = 0; p <= NPARAMS; p++) {
    void *h = p < NPARAMS ? src[p] : out;
    if (reg[p]) api->drv.host_unregister(h);
    free(h);
    if (p < NPARAMS && grad[p]) api->drv.mem_free(grad[p]);
  }
  if (c) brg_comm_destroy(c);
  return NULL;
}

int main(int argc, char **argv) {
  if (argc > 1) nranks = atoi(argv[1]);
  if (argc > 2) rounds = argv[2];
  if (nranks < 1 || nranks > MAXN || strspn(rounds, "012") != strlen(rounds)) {
    fprintf(stderr, "usage: %s [N (1 to %d) [ROUNDS (digits 0, 1, 2)]]\n", argv[0], MAXN);
    return 2;
  }
  char why[256] = "";
  const char *path = getenv("BRIGADE_CUDA_MODULE");
  api = path ? brg__cuda_open(path, why, sizeof why) : NULL;
  if (!api) {
    if (getenv("BRIGADE_TEST_NO_SKIP")) {
      fprintf(stderr, "FAIL: no GPU: %s\n", path ? why : "BRIGADE_CUDA_MODULE is not set");
      return 1;
    }
    printf("skipped: %s\n", path ? why : "BRIGADE_CUDA_MODULE is not set");
    return 77;
  }
  void *mod = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
  if (mod) *(void **)&strict_counts = dlsym(mod, "brg__emu_strict_counts");
  if (brg_get_unique_id(&id) != BRG_SUCCESS) return 1;
  pthread_barrier_init(&between, NULL, (unsigned)nranks);
  pthread_t th[MAXN];
  for (long r = 0; r < nranks; r++) pthread_create(&th[r], NULL, rank_main, (void *)r);
  int bad = 0;
  for (int r = 0; r < nranks; r++) {
    pthread_join(th[r], NULL);
    bad += failures[r];
  }
  printf("test_reducer_threads N=%d: %s\n", nranks, bad ? "FAILED" : "ok");
  return bad ? 1 : 0;
}
