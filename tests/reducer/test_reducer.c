/*
 * The reducer over real ranks: the parent forks N processes that build a
 * communicator and run every scenario below through the public headers only,
 * checking every element of every gradient against a reference computed
 * here.
 *
 * Exact scenarios use small integers: rank r's gradient is base + (2r - N + 1),
 * so the ranks' values sum to N * base and the average is exactly base in
 * every dtype, float16 and bfloat16 included.
 *
 *   test_reducer -n N [-s scenario]
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "brigade.h"
#include "brigade_reducer.h"

static int g_rank, g_n;
static const char *g_scn = "setup";

#define CHECK(cond, ...)                                                                           \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      fprintf(stderr, "rank %d [%s] %s:%d: check failed: %s: ", g_rank, g_scn, __FILE__, __LINE__, \
              #cond);                                                                              \
      fprintf(stderr, __VA_ARGS__);                                                                \
      fputc('\n', stderr);                                                                         \
      fflush(stderr);                                                                              \
      _exit(1);                                                                                    \
    }                                                                                              \
  } while (0)

#define OK(red, call)                                                                              \
  do {                                                                                             \
    brg_status s_ = (call);                                                                        \
    CHECK(s_ == BRG_SUCCESS, "%s returned %s: %s", #call, brg_status_string(s_),                   \
          brg_reducer_last_error(red));                                                            \
  } while (0)

#define EXPECT_ERR(red, call, want, text)                                                          \
  do {                                                                                             \
    brg_status s_ = (call);                                                                        \
    CHECK(s_ == (want), "%s returned %s, expected %s (%s)", #call, brg_status_string(s_),          \
          brg_status_string(want), brg_reducer_last_error(red));                                   \
    CHECK(strstr(brg_reducer_last_error(red), (text)) != NULL, "error text '%s' lacks '%s'",       \
          brg_reducer_last_error(red), (text));                                                    \
  } while (0)

/* ---- values ---------------------------------------------------------- */

static void put(void *buf, brg_dtype dt, size_t i, double v) {
  switch (dt) {
  case BRG_FLOAT32: ((float *)buf)[i] = (float)v; break;
  case BRG_FLOAT64: ((double *)buf)[i] = v; break;
  case BRG_FLOAT16: {
    _Float16 h = (_Float16)v;
    memcpy((uint16_t *)buf + i, &h, 2);
    break;
  }
  case BRG_BFLOAT16: { /* the values used here are exact in bfloat16 */
    float f = (float)v;
    uint32_t u;
    memcpy(&u, &f, 4);
    ((uint16_t *)buf)[i] = (uint16_t)(u >> 16);
    break;
  }
  default: CHECK(0, "dtype %d", (int)dt);
  }
}

static double get(const void *buf, brg_dtype dt, size_t i) {
  switch (dt) {
  case BRG_FLOAT32: return ((const float *)buf)[i];
  case BRG_FLOAT64: return ((const double *)buf)[i];
  case BRG_FLOAT16: {
    _Float16 h;
    memcpy(&h, (const uint16_t *)buf + i, 2);
    return (double)h;
  }
  case BRG_BFLOAT16: {
    uint32_t u = (uint32_t)((const uint16_t *)buf)[i] << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
  }
  default: CHECK(0, "dtype %d", (int)dt);
  }
  return 0;
}

static double base(int step, size_t p, size_t i) {
  return (double)((i * 7 + p * 13 + (size_t)step * 5) % 33) - 16.0;
}
static double grad_value(int rank, int step, size_t p, size_t i) {
  return base(step, p, i) + (double)(2 * rank - g_n + 1);
}

/* Inexact values in [-1, 1) for the compression hooks. */
static double rnd_value(int rank, int step, size_t p, size_t i) {
  uint64_t x = ((uint64_t)rank << 48) ^ ((uint64_t)step << 40) ^ ((uint64_t)p << 28) ^ i;
  x ^= x >> 33, x *= 0xff51afd7ed558ccdull, x ^= x >> 33, x *= 0xc4ceb9fe1a85ec53ull, x ^= x >> 33;
  return (double)(x >> 11) * 0x1p-52 - 1.0;
}

static uint64_t rng_next(uint64_t *s) {
  *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
  return *s;
}

static void shuffle(size_t *a, size_t n, uint64_t seed) {
  uint64_t s = seed * 2654435761u + 1;
  for (size_t i = n; i-- > 1;) {
    size_t j = rng_next(&s) % (i + 1), t = a[i];
    a[i] = a[j], a[j] = t;
  }
}

/* ---- a model ----------------------------------------------------------- */

#define MAXP 64

typedef struct model {
  size_t n;
  size_t count[MAXP];
  brg_dtype dt[MAXP];
  char name[MAXP][16];
  void *grad[MAXP]; /* our buffers in copy mode */
  void *data[MAXP];
  brg_reducer_param p[MAXP];
} model;

static void model_init(model *m, size_t n, const size_t *count, const brg_dtype *dt, int view) {
  memset(m, 0, sizeof(*m));
  m->n = n;
  for (size_t p = 0; p < n; p++) {
    m->count[p] = count[p];
    m->dt[p] = dt ? dt[p] : BRG_FLOAT32;
    snprintf(m->name[p], sizeof(m->name[p]), "p%u", (unsigned)p);
    size_t bytes = count[p] * brg_dtype_size(m->dt[p]) + 8;
    m->grad[p] = view ? NULL : calloc(1, bytes);
    m->data[p] = calloc(1, bytes);
    m->p[p] = (brg_reducer_param){.name = m->name[p],
                                  .count = count[p],
                                  .dtype = m->dt[p],
                                  .data = m->data[p],
                                  .grad = m->grad[p]};
  }
}

static void model_free(model *m) {
  for (size_t p = 0; p < m->n; p++) free(m->grad[p]), free(m->data[p]);
}

static void *gradp(brg_reducer *red, size_t p) {
  void *g = NULL;
  OK(red, brg_reducer_grad(red, p, &g));
  return g;
}

static void fill(brg_reducer *red, model *m, size_t p, int step, int accumulate) {
  void *g = gradp(red, p);
  for (size_t i = 0; i < m->count[p]; i++)
    put(g, m->dt[p], i, (accumulate ? get(g, m->dt[p], i) : 0) + grad_value(g_rank, step, p, i));
}

/* Every element of parameter p equals the average (or sum) of `steps`. */
static void expect_exact(brg_reducer *red, model *m, size_t p, const int *steps, int nsteps,
                         int sum) {
  const void *g = gradp(red, p);
  for (size_t i = 0; i < m->count[p]; i++) {
    double want = 0;
    for (int k = 0; k < nsteps; k++) want += base(steps[k], p, i);
    if (sum) want *= g_n;
    double got = get(g, m->dt[p], i);
    CHECK(got == want, "param %zu (%s) element %zu: got %g, want %g", p, brg_dtype_name(m->dt[p]),
          i, got, want);
  }
}

static void mark(brg_reducer *red, size_t p) {
  OK(red, brg_reducer_mark_ready(red, p));
}

/* ---- scenarios --------------------------------------------------------- */

static const size_t uneven_count[] = {1,    3, 1000, 70000, 5, 262151, 17,  4096,
                                      9999, 2, 123,  40000, 1, 65536,  777, 33};
#define NUNEVEN (sizeof(uneven_count) / sizeof(uneven_count[0]))

typedef struct marker_arg {
  brg_reducer *red;
  model *m;
  const size_t *order;
  size_t n, stride, first;
  int step;
} marker_arg;

/* A gradient hook on its own thread: write the gradient, then mark it. */
static void *marker_thread(void *a_) {
  marker_arg *a = a_;
  uint64_t s = (uint64_t)a->first * 977 + (uint64_t)g_rank + 1;
  for (size_t k = a->first; k < a->n; k += a->stride) {
    fill(a->red, a->m, a->order[k], a->step, 0);
    if (rng_next(&s) % 4 == 0) sched_yield();
    mark(a->red, a->order[k]);
  }
  return NULL;
}

/* Steps of shuffled (per rank, per step) ready orders, one thread or many;
 * every element checked after every finalize. */
static void run_exact(brg_comm *comm, const size_t *count, const brg_dtype *dt, size_t n,
                      unsigned flags, int nthreads, int steps) {
  model m;
  int view = (flags & BRG_REDUCER_GRAD_AS_VIEW) != 0, sum = (flags & BRG_REDUCER_SUM) != 0;
  model_init(&m, n, count, dt, view);
  brg_reducer *red = NULL;
  brg_reducer_config cfg = {
      .first_bucket_cap_bytes = 4096, .bucket_cap_bytes = 65536, .flags = flags};
  OK(NULL, brg_reducer_create(&red, comm, m.p, n, &cfg));
  size_t nb0;
  OK(red, brg_reducer_num_buckets(red, &nb0));
  CHECK(nb0 > 3, "want several buckets, got %zu", nb0);
  for (int step = 0; step < steps; step++) {
    size_t order[MAXP];
    for (size_t k = 0; k < n; k++) order[k] = k;
    shuffle(order, n, (uint64_t)step * 1000 + (uint64_t)g_rank);
    OK(red, brg_reducer_prepare(red, 0));
    if (nthreads <= 1) {
      for (size_t k = 0; k < n; k++) fill(red, &m, order[k], step, 0);
      for (size_t k = 0; k < n; k++) mark(red, order[k]);
    } else {
      pthread_t th[8];
      marker_arg a[8];
      for (int t = 0; t < nthreads; t++) {
        a[t] = (marker_arg){red, &m, order, n, (size_t)nthreads, (size_t)t, step};
        CHECK(pthread_create(&th[t], NULL, marker_thread, &a[t]) == 0, "pthread_create");
      }
      for (int t = 0; t < nthreads; t++) pthread_join(th[t], NULL);
    }
    OK(red, brg_reducer_finalize(red));
    for (size_t p = 0; p < n; p++) expect_exact(red, &m, p, &step, 1, sum);
  }
  OK(red, brg_reducer_destroy(red));
  model_free(&m);
}

static void scn_uneven(brg_comm *comm) {
  run_exact(comm, uneven_count, NULL, NUNEVEN, 0, 1, 3);
  run_exact(comm, uneven_count, NULL, NUNEVEN, BRG_REDUCER_GRAD_AS_VIEW, 1, 3);
  run_exact(comm, uneven_count, NULL, NUNEVEN, BRG_REDUCER_SUM, 1, 2);
  run_exact(comm, uneven_count, NULL, NUNEVEN, BRG_REDUCER_NO_REBUILD, 1, 2);
}

static void scn_dtypes(brg_comm *comm) {
  static const brg_dtype cyc[4] = {BRG_FLOAT32, BRG_FLOAT16, BRG_FLOAT64, BRG_BFLOAT16};
  brg_dtype dt[NUNEVEN];
  for (size_t p = 0; p < NUNEVEN; p++) dt[p] = cyc[(p * 3 + p / 4) % 4];
  run_exact(comm, uneven_count, dt, NUNEVEN, 0, 1, 3);
  run_exact(comm, uneven_count, dt, NUNEVEN, BRG_REDUCER_GRAD_AS_VIEW, 1, 3);
  run_exact(comm, uneven_count, dt, NUNEVEN, BRG_REDUCER_SUM, 1, 2);
}

static void scn_threads(brg_comm *comm) {
  run_exact(comm, uneven_count, NULL, NUNEVEN, 0, 4, 4);
  run_exact(comm, uneven_count, NULL, NUNEVEN, BRG_REDUCER_GRAD_AS_VIEW, 3, 4);
}

static uint64_t bytes_sent(brg_comm *comm) {
  uint64_t b = 0;
  CHECK(brg_comm_bytes_sent(comm, &b) == BRG_SUCCESS, "brg_comm_bytes_sent");
  return b;
}

static void sync_step(brg_reducer *red, model *m, int step) {
  OK(red, brg_reducer_prepare(red, 0));
  for (size_t p = m->n; p-- > 0;) fill(red, m, p, step, 0), mark(red, p);
  OK(red, brg_reducer_finalize(red));
}

/* K no-sync micro-steps accumulate locally; the synced step reduces the sum
 * once and sends exactly what one plain step sends. */
static void scn_nosync(brg_comm *comm) {
  for (int view = 0; view < 2; view++) {
    model m;
    model_init(&m, NUNEVEN, uneven_count, NULL, view);
    brg_reducer *red;
    brg_reducer_config cfg = {.first_bucket_cap_bytes = 4096,
                              .bucket_cap_bytes = 65536,
                              .flags = view ? BRG_REDUCER_GRAD_AS_VIEW : 0};
    OK(NULL, brg_reducer_create(&red, comm, m.p, m.n, &cfg));
    sync_step(red, &m, 0); /* the first step also rebuilds */
    uint64_t b0 = bytes_sent(comm);
    sync_step(red, &m, 1);
    uint64_t one_step = bytes_sent(comm) - b0;
    CHECK(one_step > 0, "a synced step sent nothing");
    int steps[4] = {2, 3, 4, 5};
    b0 = bytes_sent(comm);
    for (int k = 0; k < 4; k++) {
      OK(red, brg_reducer_prepare(red, k < 3 ? BRG_REDUCER_NO_SYNC : 0));
      size_t order[MAXP];
      for (size_t q = 0; q < m.n; q++) order[q] = q;
      shuffle(order, m.n, (uint64_t)k * 31 + (uint64_t)g_rank);
      for (size_t q = 0; q < m.n; q++)
        fill(red, &m, order[q], steps[k], k > 0), mark(red, order[q]);
      OK(red, brg_reducer_finalize(red));
      if (k < 3) CHECK(bytes_sent(comm) == b0, "no-sync micro-step %d communicated", k);
    }
    CHECK(bytes_sent(comm) - b0 == one_step, "4 micro-steps sent %llu bytes, one step sends %llu",
          (unsigned long long)(bytes_sent(comm) - b0), (unsigned long long)one_step);
    for (size_t p = 0; p < m.n; p++) expect_exact(red, &m, p, steps, 4, 0);
    OK(red, brg_reducer_destroy(red));
    model_free(&m);
  }
}

static const size_t small_count[8] = {10, 300, 7, 5000, 64, 1000, 3, 2048};

/* Backward leaves parameters unmarked without FIND_UNUSED: finalize names
 * them, every rank still finishes the step, and the reducer carries on. */
static void scn_unused_error(brg_comm *comm) {
  model m;
  model_init(&m, 8, small_count, NULL, 0);
  brg_reducer *red;
  brg_reducer_config cfg = {.first_bucket_cap_bytes = 1024, .bucket_cap_bytes = 8192};
  OK(NULL, brg_reducer_create(&red, comm, m.p, m.n, &cfg));
  OK(red, brg_reducer_prepare(red, 0));
  for (size_t p = 8; p-- > 0;)
    if (p != 2 && p != 5) fill(red, &m, p, 0, 0), mark(red, p);
  EXPECT_ERR(red, brg_reducer_finalize(red), BRG_ERR_INVALID_USAGE,
             "2 parameter(s) were not marked ready");
  const char *e = brg_reducer_last_error(red);
  CHECK(strstr(e, "'p2' (#2)") && strstr(e, "'p5' (#5)") && strstr(e, "BRG_REDUCER_FIND_UNUSED"),
        "error text: %s", e);
  CHECK(!strstr(e, "'p3'"), "error text names a used parameter: %s", e);
  for (size_t p = 0; p < 8; p++)
    if (p != 2 && p != 5) {
      int st = 0;
      expect_exact(red, &m, p, &st, 1, 0);
    }
  sync_step(red, &m, 1);
  int st = 1;
  for (size_t p = 0; p < 8; p++) expect_exact(red, &m, p, &st, 1, 0);
  OK(red, brg_reducer_destroy(red));
  model_free(&m);
}

/* Is parameter p used by this rank in the find_unused / static scenarios?
 * 3: by nobody; 5: by even ranks only. */
static int uses(size_t p, int rank) {
  return p != 3 && !(p == 5 && rank % 2 == 1);
}

static void expect_partial(brg_reducer *red, model *m, size_t p, int step) {
  const float *g = gradp(red, p);
  for (size_t i = 0; i < m->count[p]; i++) {
    double sum = 0;
    for (int r = 0; r < g_n; r++)
      if (uses(p, r)) sum += grad_value(r, step, p, i);
    double want = sum / g_n;
    CHECK(fabs(g[i] - want) <= 1e-6 * fabs(want), "param %zu element %zu: got %g want %g", p, i,
          g[i], want);
  }
}

static void expect_const(brg_reducer *red, model *m, size_t p, float v) {
  const float *g = gradp(red, p);
  for (size_t i = 0; i < m->count[p]; i++)
    CHECK(g[i] == v, "param %zu element %zu: got %g want %g", p, i, g[i], v);
}

static void set_const(brg_reducer *red, model *m, size_t p, float v) {
  float *g = gradp(red, p);
  for (size_t i = 0; i < m->count[p]; i++) g[i] = v;
}

/* FIND_UNUSED: 3 is unused everywhere (copy mode: left untouched; views:
 * zero), 5 only on some ranks (average over all ranks, zeros included), and
 * 6 is used only in a no-sync micro-step (its accumulated gradient counts). */
static void scn_find_unused(brg_comm *comm) {
  for (int view = 0; view < 2; view++) {
    model m;
    model_init(&m, 8, small_count, NULL, view);
    brg_reducer *red;
    brg_reducer_config cfg = {.first_bucket_cap_bytes = 1024,
                              .bucket_cap_bytes = 8192,
                              .flags =
                                  BRG_REDUCER_FIND_UNUSED | (view ? BRG_REDUCER_GRAD_AS_VIEW : 0)};
    OK(NULL, brg_reducer_create(&red, comm, m.p, m.n, &cfg));
    for (int step = 0; step < 3; step++) {
      set_const(red, &m, 3, 777.0f);
      OK(red, brg_reducer_prepare(red, 0));
      for (size_t p = 8; p-- > 0;)
        if (uses(p, g_rank)) fill(red, &m, p, step, 0), mark(red, p);
      OK(red, brg_reducer_finalize(red));
      for (size_t p = 0; p < 8; p++) {
        if (p == 3)
          expect_const(red, &m, p, view ? 0.0f : 777.0f);
        else if (p == 5)
          expect_partial(red, &m, p, step);
        else
          expect_exact(red, &m, p, &step, 1, 0);
      }
    }
    /* micro-step 10 uses everything it uses normally; synced step 11 skips 6 */
    OK(red, brg_reducer_prepare(red, BRG_REDUCER_NO_SYNC));
    for (size_t p = 0; p < 8; p++)
      if (uses(p, g_rank)) fill(red, &m, p, 10, 0), mark(red, p);
    OK(red, brg_reducer_finalize(red));
    OK(red, brg_reducer_prepare(red, 0));
    for (size_t p = 0; p < 8; p++)
      if (uses(p, g_rank) && p != 6) fill(red, &m, p, 11, 1), mark(red, p);
    OK(red, brg_reducer_finalize(red));
    int both[2] = {10, 11}, ten = 10;
    expect_exact(red, &m, 0, both, 2, 0);
    expect_exact(red, &m, 6, &ten, 1, 0);
    OK(red, brg_reducer_destroy(red));
    model_free(&m);
  }
}

/* STATIC_GRAPH: the first step fixes the used set (3 unused, 5 on even ranks)
 * and the order; later steps skip the agreement; changes are reported. */
static void scn_static(brg_comm *comm) {
  model m;
  model_init(&m, 8, small_count, NULL, 0);
  brg_reducer *red;
  brg_reducer_config cfg = {
      .first_bucket_cap_bytes = 1024, .bucket_cap_bytes = 8192, .flags = BRG_REDUCER_STATIC_GRAPH};
  OK(NULL, brg_reducer_create(&red, comm, m.p, m.n, &cfg));
  uint64_t sent[4];
  for (int step = 0; step < 4; step++) {
    uint64_t b0 = bytes_sent(comm);
    set_const(red, &m, 3, 777.0f);
    OK(red, brg_reducer_prepare(red, 0));
    for (size_t p = 8; p-- > 0;)
      if (uses(p, g_rank)) fill(red, &m, p, step, 0), mark(red, p);
    OK(red, brg_reducer_finalize(red));
    sent[step] = bytes_sent(comm) - b0;
    for (size_t p = 0; p < 8; p++) {
      if (p == 3)
        expect_const(red, &m, p, 777.0f);
      else if (p == 5)
        expect_partial(red, &m, p, step);
      else
        expect_exact(red, &m, p, &step, 1, 0);
    }
  }
  CHECK(sent[2] == sent[3] && sent[1] == sent[2] && sent[1] < sent[0],
        "static steps should skip the agreement: sent %llu %llu %llu %llu",
        (unsigned long long)sent[0], (unsigned long long)sent[1], (unsigned long long)sent[2],
        (unsigned long long)sent[3]);

  /* 3 is marked now */
  OK(red, brg_reducer_prepare(red, 0));
  for (size_t p = 8; p-- > 0;)
    if (uses(p, g_rank) || p == 3) {
      if (p == 3)
        EXPECT_ERR(red, brg_reducer_mark_ready(red, p), BRG_ERR_INVALID_USAGE,
                   "static graph: parameter 'p3' (#3) was unused in the first step");
      else
        fill(red, &m, p, 4, 0), mark(red, p);
    }
  EXPECT_ERR(red, brg_reducer_finalize(red), BRG_ERR_INVALID_USAGE, "'p3' (#3) was unused");

  /* 6 is not marked */
  OK(red, brg_reducer_prepare(red, 0));
  for (size_t p = 8; p-- > 0;)
    if (uses(p, g_rank) && p != 6) fill(red, &m, p, 5, 0), mark(red, p);
  EXPECT_ERR(red, brg_reducer_finalize(red), BRG_ERR_INVALID_USAGE,
             "static graph: 1 parameter(s) used in the first step were not marked ready in this "
             "backward: 'p6' (#6)");

  /* a different order: reported, gradients still right */
  OK(red, brg_reducer_prepare(red, 0));
  for (size_t p = 0; p < 8; p++)
    if (uses(p, g_rank)) fill(red, &m, p, 6, 0), mark(red, p);
  EXPECT_ERR(red, brg_reducer_finalize(red), BRG_ERR_INVALID_USAGE,
             "static graph: the ready order changed at position 0: 'p0' (#0) now, 'p7' (#7)");
  int six = 6;
  expect_exact(red, &m, 0, &six, 1, 0);
  expect_partial(red, &m, 5, 6);
  OK(red, brg_reducer_destroy(red));
  model_free(&m);
}

/* The buckets follow rank 0's ready order after the first step; views move
 * with their contents. */
static void scn_rebuild(brg_comm *comm) {
  for (int view = 0; view < 2; view++) {
    model m;
    model_init(&m, NUNEVEN, uneven_count, NULL, view);
    brg_reducer *red;
    brg_reducer_config cfg = {.first_bucket_cap_bytes = 4096,
                              .bucket_cap_bytes = 65536,
                              .flags = view ? BRG_REDUCER_GRAD_AS_VIEW : 0};
    OK(NULL, brg_reducer_create(&red, comm, m.p, m.n, &cfg));

    size_t nb, k = 0, got[MAXP], order0[MAXP], mine[MAXP];
    OK(red, brg_reducer_num_buckets(red, &nb));
    for (size_t b = 0; b < nb; b++) {
      size_t np;
      const size_t *ps;
      OK(red, brg_reducer_bucket_layout(red, b, NULL, NULL, &np, &ps));
      for (size_t j = 0; j < np; j++) got[k++] = ps[j];
    }
    for (size_t q = 0; q < m.n; q++)
      CHECK(got[q] == m.n - 1 - q, "initial buckets not in reverse order at %zu", q);

    for (size_t q = 0; q < m.n; q++) order0[q] = mine[q] = q;
    shuffle(order0, m.n, 4242);
    shuffle(mine, m.n, 99 + (uint64_t)g_rank);
    const size_t *order = g_rank == 0 ? order0 : mine;
    OK(red, brg_reducer_prepare(red, 0));
    for (size_t q = 0; q < m.n; q++) fill(red, &m, order[q], 0, 0), mark(red, order[q]);
    OK(red, brg_reducer_finalize(red));
    int zero = 0;
    for (size_t p = 0; p < m.n; p++) expect_exact(red, &m, p, &zero, 1, 0);

    OK(red, brg_reducer_num_buckets(red, &nb));
    k = 0;
    for (size_t b = 0; b < nb; b++) {
      size_t np;
      const size_t *ps;
      brg_dtype dt;
      OK(red, brg_reducer_bucket_layout(red, b, &dt, NULL, &np, &ps));
      for (size_t j = 0; j < np; j++) got[k++] = ps[j];
    }
    for (size_t q = 0; q < m.n; q++)
      CHECK(got[q] == order0[q], "rebuilt buckets differ from rank 0's order at %zu", q);
    for (int step = 1; step < 3; step++) {
      sync_step(red, &m, step);
      for (size_t p = 0; p < m.n; p++) expect_exact(red, &m, p, &step, 1, 0);
    }
    OK(red, brg_reducer_destroy(red));
    model_free(&m);
  }
}

static brg_status max_launch(void *arg, brg_comm *comm, brg_reducer_bucket *b) {
  (*(int *)arg)++;
  return brg_iallreduce(b->data, b->data, b->count, b->dtype, BRG_MAX, comm, b->request);
}
static brg_status double_finish(void *arg, brg_comm *comm, brg_reducer_bucket *b) {
  (void)arg, (void)comm;
  float *d = b->data;
  for (size_t i = 0; i < b->count; i++) d[i] *= 2;
  return BRG_SUCCESS;
}

/* float16 / bfloat16 compression against the float32 average, and a custom
 * hook. */
static void scn_hooks(brg_comm *comm) {
  static const brg_dtype dts[6] = {BRG_FLOAT32, BRG_FLOAT64, BRG_FLOAT32,
                                   BRG_FLOAT32, BRG_FLOAT64, BRG_FLOAT32};
  static const size_t cnt[6] = {5000, 777, 70000, 3, 20000, 12345};
  uint64_t plain_bytes = 0;
  for (int hook = 0; hook < 3; hook++) {
    for (int view = 0; view < 2; view++) {
      model m;
      model_init(&m, 6, cnt, dts, view);
      brg_reducer *red;
      brg_reducer_config cfg = {.first_bucket_cap_bytes = 4096,
                                .bucket_cap_bytes = 65536,
                                .flags = view ? BRG_REDUCER_GRAD_AS_VIEW : 0,
                                .hook = hook == 1   ? BRG_REDUCER_HOOK_FP16
                                        : hook == 2 ? BRG_REDUCER_HOOK_BF16
                                                    : BRG_REDUCER_HOOK_ALLREDUCE};
      OK(NULL, brg_reducer_create(&red, comm, m.p, m.n, &cfg));
      double tol = hook == 1 ? 2e-3 : hook == 2 ? 2e-2 : 1e-6;
      for (int step = 0; step < 3; step++) {
        uint64_t b0 = bytes_sent(comm);
        OK(red, brg_reducer_prepare(red, 0));
        for (size_t p = m.n; p-- > 0;) {
          void *g = gradp(red, p);
          for (size_t i = 0; i < m.count[p]; i++) put(g, m.dt[p], i, rnd_value(g_rank, step, p, i));
          mark(red, p);
        }
        OK(red, brg_reducer_finalize(red));
        uint64_t sent = bytes_sent(comm) - b0;
        if (step == 2 && hook == 0 && view == 0) plain_bytes = sent;
        if (step == 2 && hook > 0) { /* 2 bytes an element on the wire instead of 4 or 8 */
          double payload = 0, half_payload = 0;
          for (size_t p = 0; p < m.n; p++)
            payload += (double)(m.count[p] * brg_dtype_size(m.dt[p])),
                half_payload += 2.0 * (double)m.count[p];
          double want = (double)plain_bytes * half_payload / payload;
          CHECK(fabs((double)sent - want) <= 0.01 * want,
                "compressed step sent %llu bytes, want %.0f", (unsigned long long)sent, want);
        }
        double maxerr = 0;
        for (size_t p = 0; p < m.n; p++) {
          const void *g = gradp(red, p);
          for (size_t i = 0; i < m.count[p]; i++) {
            double want = 0;
            for (int r = 0; r < g_n; r++)
              want += (m.dt[p] == BRG_FLOAT32 ? (double)(float)rnd_value(r, step, p, i)
                                              : rnd_value(r, step, p, i));
            want /= g_n;
            double err = fabs(get(g, m.dt[p], i) - want);
            CHECK(err <= tol, "hook %d param %zu element %zu: got %.9g want %.9g", hook, p, i,
                  get(g, m.dt[p], i), want);
            if (err > maxerr) maxerr = err;
          }
        }
        if (hook > 0)
          CHECK(maxerr > 1e-6, "hook %d: results exact, was anything compressed?", hook);
      }
      OK(red, brg_reducer_destroy(red));
      model_free(&m);
    }
  }

  /* custom: allreduce MAX, then finish doubles */
  model m;
  model_init(&m, NUNEVEN, uneven_count, NULL, 0);
  int launches = 0;
  brg_reducer *red;
  brg_reducer_config cfg = {.first_bucket_cap_bytes = 4096,
                            .bucket_cap_bytes = 65536,
                            .hook = BRG_REDUCER_HOOK_CUSTOM,
                            .hook_launch = max_launch,
                            .hook_finish = double_finish,
                            .hook_arg = &launches};
  OK(NULL, brg_reducer_create(&red, comm, m.p, m.n, &cfg));
  size_t nb;
  for (int step = 0; step < 2; step++) {
    OK(red, brg_reducer_num_buckets(red, &nb));
    launches = 0;
    sync_step(red, &m, step);
    CHECK((size_t)launches == nb, "custom hook launched %d times for %zu buckets", launches, nb);
    for (size_t p = 0; p < m.n; p++) {
      const float *g = gradp(red, p);
      for (size_t i = 0; i < m.count[p]; i++)
        CHECK(g[i] == 2 * grad_value(g_n - 1, step, p, i), "custom hook: param %zu element %zu: %g",
              p, i, g[i]);
    }
  }
  OK(red, brg_reducer_destroy(red));
  model_free(&m);
}

/* Parameter lists that differ across ranks are refused at create. */
static void scn_mismatch(brg_comm *comm) {
  size_t cnt[8];
  memcpy(cnt, small_count, sizeof(cnt));
  if (g_rank == g_n - 1) cnt[3]++;
  model m;
  model_init(&m, 8, cnt, NULL, 0);
  brg_reducer *red = NULL;
  EXPECT_ERR(NULL, brg_reducer_create(&red, comm, m.p, 8, NULL), BRG_ERR_MISMATCH,
             "parameter 'p3' (#3) differs across ranks");
  CHECK(red == NULL, "reducer set on failure");
  model_free(&m);

  model_init(&m, 8, small_count, NULL, 0);
  EXPECT_ERR(NULL, brg_reducer_create(&red, comm, m.p, g_rank == 0 ? 7 : 8, NULL), BRG_ERR_MISMATCH,
             "the parameter count differs across ranks");
  brg_reducer_config cfg = {.bucket_cap_bytes = g_rank == 0 ? 1 << 20 : 2 << 20};
  EXPECT_ERR(NULL, brg_reducer_create(&red, comm, m.p, 8, &cfg), BRG_ERR_MISMATCH,
             "bucket_cap_bytes differs");
  /* the communicator is still in step */
  OK(NULL, brg_reducer_create(&red, comm, m.p, 8, NULL));
  sync_step(red, &m, 0);
  OK(red, brg_reducer_destroy(red));
  model_free(&m);
}

static void scn_usage(brg_comm *comm) {
  model m;
  model_init(&m, 8, small_count, NULL, 0);
  brg_reducer *red;
  m.p[2].grad = NULL;
  EXPECT_ERR(NULL, brg_reducer_create(&red, comm, m.p, 8, NULL), BRG_ERR_INVALID_ARGUMENT,
             "parameter #2 p2 has no grad buffer");
  m.p[2].grad = m.grad[2];
  brg_reducer_config vcfg = {.flags = BRG_REDUCER_GRAD_AS_VIEW};
  EXPECT_ERR(NULL, brg_reducer_create(&red, comm, m.p, 8, &vcfg), BRG_ERR_INVALID_ARGUMENT,
             "grad must be NULL with BRG_REDUCER_GRAD_AS_VIEW");
  brg_reducer_config ccfg = {.hook = BRG_REDUCER_HOOK_CUSTOM};
  EXPECT_ERR(NULL, brg_reducer_create(&red, comm, m.p, 8, &ccfg), BRG_ERR_INVALID_ARGUMENT,
             "needs hook_launch");

  OK(NULL, brg_reducer_create(&red, comm, m.p, 8, NULL));
  EXPECT_ERR(red, brg_reducer_mark_ready(red, 0), BRG_ERR_INVALID_USAGE,
             "brg_reducer_mark_ready('p0' (#0)) called before brg_reducer_prepare");
  EXPECT_ERR(red, brg_reducer_finalize(red), BRG_ERR_INVALID_USAGE,
             "brg_reducer_finalize called without brg_reducer_prepare");
  OK(red, brg_reducer_prepare(red, 0));
  EXPECT_ERR(red, brg_reducer_prepare(red, 0), BRG_ERR_INVALID_USAGE,
             "a new backward started before brg_reducer_finalize ended the previous one");
  EXPECT_ERR(red, brg_reducer_broadcast_params(red, 0), BRG_ERR_INVALID_USAGE, "during a backward");
  EXPECT_ERR(red, brg_reducer_mark_ready(red, 99), BRG_ERR_INVALID_ARGUMENT, "out of range");
  for (size_t p = 8; p-- > 0;) {
    fill(red, &m, p, 0, 0);
    mark(red, p);
    if (p == 4)
      EXPECT_ERR(red, brg_reducer_mark_ready(red, 4), BRG_ERR_INVALID_USAGE,
                 "parameter 'p4' (#4) was marked ready twice in one backward pass");
  }
  /* finalize reports the first error of the pass (the bad index) */
  EXPECT_ERR(red, brg_reducer_finalize(red), BRG_ERR_INVALID_ARGUMENT, "out of range");
  int zero = 0;
  for (size_t p = 0; p < 8; p++) expect_exact(red, &m, p, &zero, 1, 0);
  sync_step(red, &m, 1);
  OK(red, brg_reducer_destroy(red));
  model_free(&m);
}

/* Replicas start equal: every parameter's data comes from the root. */
static void scn_broadcast(brg_comm *comm) {
  static const brg_dtype dts[4] = {BRG_FLOAT32, BRG_FLOAT64, BRG_FLOAT16, BRG_BFLOAT16};
  brg_dtype dt[8];
  for (int p = 0; p < 8; p++) dt[p] = dts[p % 4];
  model m;
  model_init(&m, 8, small_count, dt, 0);
  m.p[6].data = NULL; /* skipped on every rank */
  brg_reducer *red;
  OK(NULL, brg_reducer_create(&red, comm, m.p, 8, NULL));
  for (int root = 0; root < g_n; root += g_n - 1) {
    for (size_t p = 0; p < 8; p++)
      for (size_t i = 0; i < m.count[p]; i++)
        put(m.data[p], dt[p], i, grad_value(g_rank, (int)p, p, i));
    OK(red, brg_reducer_broadcast_params(red, root));
    for (size_t p = 0; p < 8; p++)
      for (size_t i = 0; i < m.count[p]; i++) {
        double want = grad_value(p == 6 ? g_rank : root, (int)p, p, i);
        CHECK(get(m.data[p], dt[p], i) == want, "root %d param %zu element %zu: %g want %g", root,
              p, i, get(m.data[p], dt[p], i), want);
      }
    if (g_n == 1) break;
  }
  OK(red, brg_reducer_destroy(red));
  model_free(&m);
}

static const struct {
  const char *name;
  void (*fn)(brg_comm *);
} scenarios[] = {
    {"uneven", scn_uneven},     {"dtypes", scn_dtypes},       {"threads", scn_threads},
    {"nosync", scn_nosync},     {"unused", scn_unused_error}, {"find_unused", scn_find_unused},
    {"static", scn_static},     {"rebuild", scn_rebuild},     {"hooks", scn_hooks},
    {"mismatch", scn_mismatch}, {"usage", scn_usage},         {"broadcast", scn_broadcast},
};
#define NSCN (sizeof(scenarios) / sizeof(scenarios[0]))

/* ---- ranks --------------------------------------------------------------- */

static int rank_main(int rank, int n, int idfd, const char *only) {
  g_rank = rank, g_n = n;
  alarm(280);
  brg_unique_id id;
  size_t got = 0;
  while (got < sizeof(id)) {
    ssize_t r = read(idfd, (char *)&id + got, sizeof(id) - got);
    if (r <= 0) {
      fprintf(stderr, "rank %d: no unique id from the parent\n", rank);
      return 1;
    }
    got += (size_t)r;
  }
  brg_comm *comm;
  brg_status st = brg_comm_init(&comm, n, &id, rank);
  CHECK(st == BRG_SUCCESS, "brg_comm_init: %s: %s", brg_status_string(st),
        brg_comm_last_error(NULL));
  for (size_t s = 0; s < NSCN; s++) {
    if (only && strcmp(only, scenarios[s].name) != 0) continue;
    g_scn = scenarios[s].name;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    scenarios[s].fn(comm);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (rank == 0)
      printf("ok   %-12s N=%d  %.2f s\n", g_scn, n,
             (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9);
    fflush(stdout);
  }
  brg_comm_destroy(comm);
  return 0;
}

int main(int argc, char **argv) {
  int n = 2;
  const char *only = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "-n") && i + 1 < argc)
      n = atoi(argv[++i]);
    else if (!strcmp(argv[i], "-s") && i + 1 < argc)
      only = argv[++i];
    else {
      fprintf(stderr, "usage: %s [-n ranks] [-s scenario]\nscenarios:", argv[0]);
      for (size_t s = 0; s < NSCN; s++) fprintf(stderr, " %s", scenarios[s].name);
      fputc('\n', stderr);
      return 2;
    }
  }
  if (n < 1 || n > 16) return 2;

  /* Fork the ranks before the parent touches the library, then hand each
   * the id through a pipe. */
  pid_t pid[16];
  int fds[16][2];
  for (int r = 0; r < n; r++) {
    if (pipe(fds[r]) != 0) return perror("pipe"), 1;
    pid[r] = fork();
    if (pid[r] < 0) return perror("fork"), 1;
    if (pid[r] == 0) {
      close(fds[r][1]);
      _exit(rank_main(r, n, fds[r][0], only));
    }
    close(fds[r][0]);
  }
  brg_unique_id id;
  brg_status st = brg_get_unique_id(&id);
  if (st != BRG_SUCCESS) {
    fprintf(stderr, "brg_get_unique_id: %s\n", brg_comm_last_error(NULL));
    for (int r = 0; r < n; r++)
      if (pid[r] > 0) kill(pid[r], SIGKILL);
    return 1;
  }
  for (int r = 0; r < n; r++) {
    if (write(fds[r][1], &id, sizeof(id)) != (ssize_t)sizeof(id)) perror("write");
    close(fds[r][1]);
  }

  int failed = 0, left = n;
  while (left > 0) {
    int status;
    pid_t w = waitpid(-1, &status, 0);
    if (w < 0) {
      if (errno == EINTR) continue;
      break;
    }
    left--;
    int r = 0;
    while (r < n && pid[r] != w) r++;
    int ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!ok && !failed) {
      failed = 1;
      if (WIFSIGNALED(status))
        fprintf(stderr, "rank %d killed by signal %d (%s)\n", r, WTERMSIG(status),
                WTERMSIG(status) == SIGALRM ? "deadline" : strsignal(WTERMSIG(status)));
      else
        fprintf(stderr, "rank %d exited with %d\n", r, WEXITSTATUS(status));
      for (int q = 0; q < n; q++) /* the others would wait on it until the timeout */
        if (q != r && pid[q] > 0) kill(pid[q], SIGKILL);
    }
    if (r < n) pid[r] = -1;
  }
  if (!failed) printf("all scenarios passed on %d ranks\n", n);
  return failed;
}
