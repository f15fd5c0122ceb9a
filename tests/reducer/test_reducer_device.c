/*
 * The reducer's device form against its host form, over forked ranks, on
 * the CUDA module BRIGADE_CUDA_MODULE names (the emulated one in CI, whose
 * streams run asynchronously with random delays).
 *
 * Every scenario (a flag or a hook) runs three backward passes twice: once
 * with host buffers through the host form, once with GPU buffers through
 * the device form, where each gradient is produced by a copy on one of
 * three streams, in a shuffled order that differs per rank and per pass,
 * and marked ready on the stream that produced it. The device gradients
 * must equal the host ones bit for bit, in every element (with
 * BRIGADE_SMALL_BYTES=0, so that host and device collectives sum in the same
 * ring order at every size).
 *
 * `order` checks that the ordering is what makes that true: a producer
 * stream held back by a flag in host memory (released 100 ms later) writes
 * the gradients; marked on that stream, the results are right; marked on
 * another stream (broken on purpose), the reducer packs stale gradients and
 * the results must come out wrong, which the test requires. `errors`: bad
 * input to the device form and the stream calls, each named.
 *
 *   test_reducer_device SCENARIO N     exits 77 without a GPU (1 with
 *                                      BRIGADE_TEST_NO_SKIP set)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../kernels/cuda/brg_cuda.h"
#include "../multiproc/harness.h"
#include "brigade_reducer.h"

#define NPARAMS 9
#define NSTREAMS 3
#define NSTEPS 3

static const brg__cuda_api *api;

typedef struct scenario {
  const char *name;
  unsigned flags;
  brg_reducer_hook hook;
  int unused; /* parameters 2 (everywhere) and 5 (on rank 0) are never marked */
  int nosync; /* the second pass is BRG_REDUCER_NO_SYNC */
} scenario;

static const scenario scenarios[] = {
    {"average", 0, BRG_REDUCER_HOOK_ALLREDUCE, 0, 0},
    {"sum", BRG_REDUCER_SUM, BRG_REDUCER_HOOK_ALLREDUCE, 0, 0},
    {"view", BRG_REDUCER_GRAD_AS_VIEW, BRG_REDUCER_HOOK_ALLREDUCE, 0, 0},
    {"nosync", 0, BRG_REDUCER_HOOK_ALLREDUCE, 0, 1},
    {"find_unused", BRG_REDUCER_FIND_UNUSED, BRG_REDUCER_HOOK_ALLREDUCE, 1, 0},
    {"find_unused_view", BRG_REDUCER_FIND_UNUSED | BRG_REDUCER_GRAD_AS_VIEW,
     BRG_REDUCER_HOOK_ALLREDUCE, 1, 0},
    {"static_graph", BRG_REDUCER_STATIC_GRAPH | BRG_REDUCER_FIND_UNUSED, BRG_REDUCER_HOOK_ALLREDUCE,
     1, 0},
    {"no_rebuild", BRG_REDUCER_NO_REBUILD, BRG_REDUCER_HOOK_ALLREDUCE, 0, 0},
    {"fp16", 0, BRG_REDUCER_HOOK_FP16, 0, 0},
    {"bf16_view", BRG_REDUCER_GRAD_AS_VIEW, BRG_REDUCER_HOOK_BF16, 0, 1},
    {"custom", 0, BRG_REDUCER_HOOK_CUSTOM, 0, 0},
};

/* Sizes: empty, one element, primes, and some around the 16-byte vector. */
static const size_t counts[NPARAMS] = {0, 1, 13, 4099, 65537, 7, 1000003, 255, 3};
static const brg_dtype dtypes[NPARAMS] = {BRG_FLOAT32, BRG_FLOAT32, BRG_FLOAT64,
                                          BRG_FLOAT32, BRG_FLOAT32, BRG_FLOAT64,
                                          BRG_FLOAT32, BRG_FLOAT16, BRG_BFLOAT16};

static int unused_here(const scenario *sc, int rank, size_t p) {
  return sc->unused && (p == 2 || (p == 5 && rank == 0));
}

/* The gradient of parameter p on `rank` in pass `step`: values with a
 * fraction, so that averaging and half casts round. */
static void fill(void *buf, brg_dtype dt, size_t n, int rank, int step, size_t p) {
  for (size_t i = 0; i < n; i++) {
    double v =
        (double)((i * 7 + p * 13 + (size_t)step * 31 + (size_t)rank * 17) % 1001) / 37.0 - 11.0;
    switch (dt) {
    case BRG_FLOAT32: ((float *)buf)[i] = (float)v; break;
    case BRG_FLOAT64: ((double *)buf)[i] = v; break;
    case BRG_FLOAT16: {
      _Float16 h = (_Float16)v;
      memcpy((uint16_t *)buf + i, &h, 2);
      break;
    }
    default: { /* bfloat16: the top half of the float */
      float f = (float)v;
      uint32_t u;
      memcpy(&u, &f, 4);
      ((uint16_t *)buf)[i] = (uint16_t)(u >> 16);
    }
    }
  }
}

/* A custom hook: a sum allreduce (the reducer divides nothing for it). */
static brg_status hook_launch(void *arg, brg_comm *comm, brg_reducer_bucket *b) {
  (void)arg;
  if (b->stream) /* device form */
    return brg_allreduce(b->data, b->data, b->count, b->dtype, BRG_SUM, comm, b->stream);
  return brg_iallreduce(b->data, b->data, b->count, b->dtype, BRG_SUM, comm, b->request);
}

typedef struct run {
  const scenario *sc;
  int device;
  void *grad[NPARAMS];   /* registered buffers (NULL with views) */
  void *staged[NPARAMS]; /* device form: the values a producer copies in */
  void *out[NPARAMS];    /* host copies of the final gradients, per step */
} run;

static size_t bytes_of(size_t p) {
  return counts[p] * brg_dtype_size(dtypes[p]);
}

/* Three passes through one form; the final gradients of each synced pass
 * land in out[step][p]. */
static int passes(mp_ctx *ctx, const scenario *sc, int device, void *out[NSTEPS][NPARAMS]) {
  brg_reducer_param prm[NPARAMS];
  void *grad[NPARAMS] = {0}, *src[NPARAMS] = {0}, *st[NSTREAMS] = {0};
  int view = (sc->flags & BRG_REDUCER_GRAD_AS_VIEW) != 0;
  for (size_t p = 0; p < NPARAMS; p++) {
    size_t b = bytes_of(p) ? bytes_of(p) : 1;
    if (device) {
      if (api->drv.mem_alloc(&src[p], b) || (!view && api->drv.mem_alloc(&grad[p], b)))
        return mp_fail("cudaMalloc"), 1;
    } else if (!view) {
      grad[p] = calloc(1, b);
    }
    prm[p] = (brg_reducer_param){
        .name = NULL, .count = counts[p], .dtype = dtypes[p], .grad = view ? NULL : grad[p]};
  }
  for (int k = 0; device && k < NSTREAMS; k++)
    if (api->drv.stream_create(&st[k])) return mp_fail("cudaStreamCreate"), 1;
  brg_reducer_config cfg = {.flags = sc->flags | (device ? BRG_REDUCER_DEVICE : 0),
                            .hook = sc->hook,
                            .hook_launch = sc->hook == BRG_REDUCER_HOOK_CUSTOM ? hook_launch : NULL,
                            .first_bucket_cap_bytes = 4096,
                            .bucket_cap_bytes = 1 << 20};
  brg_reducer *red = NULL;
  brg_status s = brg_reducer_create(&red, ctx->comm, prm, NPARAMS, &cfg);
  if (s != BRG_SUCCESS)
    return mp_fail("%s create: %s", device ? "device" : "host", brg_reducer_last_error(NULL)), 1;
  unsigned seed = (unsigned)(ctx->rank * 7919 + 17);
  size_t order[NPARAMS];
  void *host = malloc(bytes_of(6));
  for (int step = 0; step < NSTEPS; step++) {
    int nosync = sc->nosync && step == 1;
    s = brg_reducer_prepare(red, nosync ? BRG_REDUCER_NO_SYNC : 0);
    MP_CHECK(s == BRG_SUCCESS, "prepare: %s", brg_reducer_last_error(red));
    /* A static graph keeps its ready order: the same shuffle every pass. */
    if (sc->flags & BRG_REDUCER_STATIC_GRAPH) seed = (unsigned)(ctx->rank * 7919 + 17);
    for (size_t p = 0; p < NPARAMS; p++) order[p] = p;
    for (size_t p = NPARAMS - 1; p > 0; p--) { /* shuffled, per rank and pass */
      size_t j = (size_t)rand_r(&seed) % (p + 1), t = order[p];
      order[p] = order[j];
      order[j] = t;
    }
    for (size_t k = 0; k < NPARAMS; k++) {
      size_t p = order[k];
      if (unused_here(sc, ctx->rank, p)) continue;
      void *g = NULL;
      brg_reducer_grad(red, p, &g);
      fill(host, dtypes[p], counts[p], ctx->rank, step, p);
      if (!device) {
        if (counts[p]) memcpy(g, host, bytes_of(p));
        s = brg_reducer_mark_ready(red, p);
      } else {
        /* The value waits in src; a copy on stream p % 3 produces it. */
        void *ps = st[p % NSTREAMS];
        if (counts[p]) {
          api->drv.stream_sync(ps); /* src is rewritten synchronously below */
          api->drv.mem_copy(src[p], host, bytes_of(p));
          api->kern.copy(g, NULL, src[p], bytes_of(p), ps);
        }
        s = brg_reducer_mark_ready_on(red, p, ps);
      }
      MP_CHECK(s == BRG_SUCCESS, "mark_ready(%zu): %s", p, brg_reducer_last_error(red));
    }
    s = device ? brg_reducer_finalize_on(red, st[0]) : brg_reducer_finalize(red);
    MP_CHECK(s == BRG_SUCCESS, "finalize: %s", brg_reducer_last_error(red));
    /* st[0] waits for the reducer, which waited for the producers; a
     * no-sync pass orders nothing, so every producer stream is waited for. */
    for (int k = 0; device && k < NSTREAMS; k++) api->drv.stream_sync(st[k]);
    for (size_t p = 0; p < NPARAMS; p++) {
      void *g = NULL;
      brg_reducer_grad(red, p, &g);
      if (!counts[p]) continue;
      if (device)
        api->drv.mem_copy(out[step][p], g, bytes_of(p));
      else
        memcpy(out[step][p], g, bytes_of(p));
    }
  }
  brg_reducer_destroy(red);
  free(host);
  for (size_t p = 0; p < NPARAMS; p++) {
    if (device) {
      api->drv.mem_free(src[p]);
      if (grad[p]) api->drv.mem_free(grad[p]);
    } else {
      free(grad[p]);
    }
  }
  for (int k = 0; device && k < NSTREAMS; k++) api->drv.stream_destroy(st[k]);
  return 0;
}

/* The module's table in this rank (never in the parent: CUDA must start
 * after the fork). */
static int open_api(void) {
  char why[256];
  if (!api) api = brg__cuda_open(getenv("BRIGADE_CUDA_MODULE"), why, sizeof why);
  if (!api) mp_fail("no GPU: %s", why);
  return api != NULL;
}

static int body_scenario(mp_ctx *ctx) {
  const scenario *sc = ctx->arg;
  if (!open_api()) return 1;
  void *want[NSTEPS][NPARAMS], *got[NSTEPS][NPARAMS];
  for (int t = 0; t < NSTEPS; t++)
    for (size_t p = 0; p < NPARAMS; p++) {
      want[t][p] = calloc(1, bytes_of(p) + 1);
      got[t][p] = calloc(1, bytes_of(p) + 1);
    }
  if (passes(ctx, sc, 0, want) || passes(ctx, sc, 1, got)) return 1;
  for (int t = 0; t < NSTEPS; t++)
    for (size_t p = 0; p < NPARAMS; p++) {
      size_t es = brg_dtype_size(dtypes[p]);
      for (size_t i = 0; i < counts[p]; i++)
        if (memcmp((char *)want[t][p] + i * es, (char *)got[t][p] + i * es, es)) {
          mp_fail("%s: pass %d, parameter %zu (%s), element %zu of %zu differs from the host "
                  "reducer's",
                  sc->name, t, p, brg_dtype_name(dtypes[p]), i, counts[p]);
          return 1;
        }
      free(want[t][p]);
      free(got[t][p]);
    }
  return 0;
}

/* ================================================================= order */

#define ORDER_COUNT 100003u

/* One pass with one float32 parameter produced behind a held flag; returns
 * the number of wrong elements of the average. */
static size_t held_pass(mp_ctx *ctx, int mark_on_producer) {
  void *g = NULL, *src = NULL, *prod = NULL, *other = NULL, *flag_dev = NULL;
  uint32_t *flag = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (flag == MAP_FAILED || api->drv.host_register(flag, 4096, &flag_dev) ||
      api->drv.mem_alloc(&g, ORDER_COUNT * 4) || api->drv.mem_alloc(&src, ORDER_COUNT * 4) ||
      api->drv.stream_create(&prod) || api->drv.stream_create(&other)) {
    mp_fail("setup");
    return 1;
  }
  float *h = malloc(ORDER_COUNT * 4);
  for (size_t i = 0; i < ORDER_COUNT; i++) h[i] = -1.0f; /* stale */
  api->drv.mem_copy(g, h, ORDER_COUNT * 4);
  for (size_t i = 0; i < ORDER_COUNT; i++) h[i] = (float)(i % 1000 + (size_t)ctx->rank);
  api->drv.mem_copy(src, h, ORDER_COUNT * 4);
  brg_reducer_param prm = {.count = ORDER_COUNT, .dtype = BRG_FLOAT32, .grad = g};
  brg_reducer_config cfg = {.flags = BRG_REDUCER_DEVICE | BRG_REDUCER_SUM};
  brg_reducer *red = NULL;
  if (brg_reducer_create(&red, ctx->comm, &prm, 1, &cfg) != BRG_SUCCESS) {
    mp_fail("create: %s", brg_reducer_last_error(NULL));
    return 1;
  }
  brg_reducer_prepare(red, 0);
  /* The producer's copy waits for the flag, which the host raises later. */
  api->drv.stream_wait_value(prod, flag_dev, 1);
  api->kern.copy(g, NULL, src, ORDER_COUNT * 4, prod);
  brg_reducer_mark_ready_on(red, 0, mark_on_producer ? prod : other);
  mp_sleep_ms(100);
  __atomic_store_n(flag, 1, __ATOMIC_RELEASE);
  brg_status s = brg_reducer_finalize(red);
  MP_CHECK(s == BRG_SUCCESS, "finalize: %s", brg_reducer_last_error(red));
  api->drv.stream_sync(prod);
  api->drv.mem_copy(h, g, ORDER_COUNT * 4);
  size_t wrong = 0;
  int n = ctx->nranks;
  for (size_t i = 0; i < ORDER_COUNT; i++)
    wrong += h[i] != (float)(n * (int)(i % 1000) + n * (n - 1) / 2);
  brg_reducer_destroy(red);
  api->drv.stream_destroy(prod);
  api->drv.stream_destroy(other);
  api->drv.mem_free(g);
  api->drv.mem_free(src);
  api->drv.host_unregister(flag);
  munmap(flag, 4096);
  free(h);
  return wrong;
}

static int body_order(mp_ctx *ctx) {
  if (!open_api()) return 1;
  size_t right = held_pass(ctx, 1);
  MP_CHECK(right == 0, "marked on the producer's stream: %zu wrong elements", right);
  size_t broken = held_pass(ctx, 0);
  MP_CHECK(broken > 0,
           "marked on another stream than the producer's, the reducer still read the final "
           "gradient: this test cannot see a broken ordering");
  mp_info("ordering broken on purpose: %zu of %u elements wrong, as they must be", broken,
          ORDER_COUNT);
  return 0;
}

/* ================================================================ errors */

static int expect(brg_status got, brg_status want, const char *msg, const char *text) {
  if (got != want || !strstr(msg, text))
    mp_fail("got %s \"%s\", expected %s with \"%s\"", brg_status_string(got), msg,
            brg_status_string(want), text);
  return got == want;
}

static int body_errors(mp_ctx *ctx) {
  if (!open_api()) return 1;
  float host[4] = {0};
  void *g = NULL, *st = NULL;
  if (api->drv.mem_alloc(&g, 16) || api->drv.stream_create(&st)) return mp_fail("setup"), 1;
  brg_reducer *red = NULL;
  /* GPU form, host gradient: the parameter is named. */
  brg_reducer_param prm[2] = {{.name = "w", .count = 4, .dtype = BRG_FLOAT32, .grad = g},
                              {.name = "bias", .count = 4, .dtype = BRG_FLOAT32, .grad = host}};
  brg_reducer_config dev = {.flags = BRG_REDUCER_DEVICE}, hostcfg = {.stream = st};
  expect(brg_reducer_create(&red, ctx->comm, prm, 2, &dev), BRG_ERR_INVALID_ARGUMENT,
         brg_reducer_last_error(NULL), "bias");
  /* Host form with a stream. */
  prm[0].grad = host;
  expect(brg_reducer_create(&red, ctx->comm, prm, 2, &hostcfg), BRG_ERR_INVALID_ARGUMENT,
         brg_reducer_last_error(NULL), "BRG_REDUCER_DEVICE");
  /* Host form: the stream calls refuse. */
  if (brg_reducer_create(&red, ctx->comm, prm, 2, NULL) != BRG_SUCCESS)
    return mp_fail("create: %s", brg_reducer_last_error(NULL)), 1;
  brg_reducer_prepare(red, 0);
  expect(brg_reducer_mark_ready_on(red, 0, st), BRG_ERR_INVALID_ARGUMENT,
         brg_reducer_last_error(red), "host buffers");
  brg_reducer_mark_ready(red, 0);
  brg_reducer_mark_ready(red, 1);
  expect(brg_reducer_finalize_on(red, st), BRG_ERR_INVALID_ARGUMENT, brg_reducer_last_error(red),
         "brg_reducer_finalize");
  expect(brg_reducer_finalize(red), BRG_SUCCESS, "", "");
  brg_reducer_destroy(red);
  /* Device form: a parameter marked twice is named at finalize, after
   * every bucket still went out. */
  prm[0].grad = g;
  prm[1].grad = (char *)g + 8;
  prm[0].count = prm[1].count = 2;
  if (brg_reducer_create(&red, ctx->comm, prm, 2, &dev) != BRG_SUCCESS)
    return mp_fail("device create: %s", brg_reducer_last_error(NULL)), 1;
  brg_reducer_prepare(red, 0);
  brg_reducer_mark_ready_on(red, 0, st);
  brg_reducer_mark_ready_on(red, 1, st);
  brg_reducer_mark_ready_on(red, 1, st);
  expect(brg_reducer_finalize_on(red, st), BRG_ERR_INVALID_USAGE, brg_reducer_last_error(red),
         "'bias' (#1) was marked ready twice");
  api->drv.stream_sync(st);
  brg_reducer_destroy(red);
  api->drv.stream_destroy(st);
  api->drv.mem_free(g);
  return 0;
}

/* ================================================================== main */

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s all|SCENARIO|order|errors N\n", argv[0]);
    return 2;
  }
  int n = atoi(argv[2]);
  /* Look for a GPU in a child: CUDA must not start in the parent. */
  pid_t pid = fork();
  if (pid == 0) {
    char why[256] = "";
    const char *path = getenv("BRIGADE_CUDA_MODULE");
    if (path && brg__cuda_open(path, why, sizeof why)) _exit(0);
    printf("no GPU: %s\n", path ? why : "BRIGADE_CUDA_MODULE is not set");
    _exit(getenv("BRIGADE_TEST_NO_SKIP") ? 1 : 77);
  }
  int wst = 0;
  if (pid < 0 || waitpid(pid, &wst, 0) != pid || !WIFEXITED(wst)) return 1;
  if (WEXITSTATUS(wst) != 0) return WEXITSTATUS(wst);
  mp_opts o = {.nranks = n, .deadline_ms = 240000, .init = MP_INIT_ID, .victim = -1};
  if (!strcmp(argv[1], "order")) {
    o.name = "order";
    return mp_run(&o, body_order, NULL);
  }
  if (!strcmp(argv[1], "errors")) {
    o.name = "errors";
    return mp_run(&o, body_errors, NULL);
  }
  int rc = 0, found = 0;
  for (size_t i = 0; i < sizeof scenarios / sizeof scenarios[0]; i++) {
    if (strcmp(argv[1], "all") && strcmp(argv[1], scenarios[i].name)) continue;
    found = 1;
    o.name = scenarios[i].name;
    rc |= mp_run(&o, body_scenario, (void *)&scenarios[i]);
  }
  if (!found) fprintf(stderr, "unknown scenario %s\n", argv[1]);
  return found ? rc : 2;
}
