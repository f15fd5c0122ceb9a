/*
 * Fault trials and a soak, on forked ranks through the public API.
 *
 *   test_faults faults N   MP_FAULT_TRIALS trials (default 6): in each, a
 *                          random rank gets SIGKILL or SIGSTOP (by turns;
 *                          MP_FAULT_SIGNALS=kill or stop: that one only) at a
 *                          random moment of an allreduce loop of random
 *                          sizes. Every survivor must fail with BRG_ERR_REMOTE or
 *                          BRG_ERR_TIMEOUT, a message that names the victim
 *                          (and, when it was stopped, how long it has been
 *                          silent), within BRIGADE_TIMEOUT_MS + 5 s of the
 *                          signal, and answer the next call with an error at
 *                          once. Every allreduce before the signal is checked
 *                          element by element.
 *   test_faults soak N     MP_SOAK_SECONDS (default 20) of collectives chosen
 *                          at random, the same on every rank (allreduce in
 *                          and out of place, iallreduce, reduce_scatter,
 *                          all_gather, broadcast, reduce, barrier), random
 *                          counts, dtypes and ops; every element of every
 *                          result, and every send buffer, is checked against
 *                          values computed here.
 *
 * The seed is printed (and taken from MP_SEED when set) so that a failure
 * can be replayed.
 */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "harness.h"

#define SLACK_MS 5000 /* as test_errors allows: the suite runs beside other tests on 2 cores */

static int g_timeout_ms;
static uint64_t g_seed;

/* splitmix64: the same stream in every rank for the same seed. */
static uint64_t rnd(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static double ms_between(int64_t a, int64_t b) {
  return (double)(b - a) / 1e6;
}

/* ================================================================ faults */

#define FAULT_MAX_COUNT (1u << 21)

typedef struct fault_trial {
  int victim, sig;
} fault_trial;

static float fault_value(int rank, size_t i, int iter) {
  return (float)((int)((i * 7 + (size_t)rank * 13 + (size_t)iter) % 101) - 50);
}

static int body_fault(mp_ctx *ctx) {
  const fault_trial *t = ctx->arg;
  mp_shared *sh = ctx->shared;
  brg_comm *c = ctx->comm;
  float *s = malloc(FAULT_MAX_COUNT * sizeof(float)), *r = malloc(FAULT_MAX_COUNT * sizeof(float));
  if (!s || !r) return 1;
  uint64_t rs = g_seed ^ 0xfa17u;
  brg_status st = BRG_SUCCESS;
  int64_t start = mp_now_ns();
  for (int iter = 0;; iter++) {
    size_t count = 1024 + rnd(&rs) % (FAULT_MAX_COUNT - 1024);
    for (size_t i = 0; i < count; i++) s[i] = fault_value(ctx->rank, i, iter);
    st = brg_allreduce(s, r, count, BRG_FLOAT32, BRG_SUM, c, NULL);
    if (st != BRG_SUCCESS) break;
    for (size_t i = 0; i < count; i++) {
      float want = 0;
      for (int q = 0; q < ctx->nranks; q++) want += fault_value(q, i, iter);
      if (r[i] != want) {
        mp_fail("iteration %d, %zu elements: element %zu is %g, expected %g", iter, count, i,
                (double)r[i], (double)want);
        goto out;
      }
    }
    __atomic_store_n(&sh->progress[ctx->rank], iter + 1, __ATOMIC_RELEASE);
    if (mp_now_ns() - start > 60 * 1000000000LL) {
      mp_fail("still no error 60 s after the loop started (rank %d was %s)", t->victim,
              t->sig == SIGKILL ? "killed" : "stopped");
      goto out;
    }
  }
  {
    int64_t t_err = mp_now_ns(), t_sig = __atomic_load_n(&sh->signal_ns, __ATOMIC_ACQUIRE);
    const char *m = brg_comm_last_error(c);
    if (!m) m = "(no message)";
    if (!t_sig) {
      mp_fail("allreduce failed before rank %d was signalled: %s: %s", t->victim,
              brg_status_string(st), m);
      goto out;
    }
    double el = ms_between(t_sig, t_err);
    MP_CHECK(st == BRG_ERR_REMOTE || st == BRG_ERR_TIMEOUT,
             "after rank %d was %s: %s, expected BRG_ERR_REMOTE or BRG_ERR_TIMEOUT: %s", t->victim,
             t->sig == SIGKILL ? "killed" : "stopped", brg_status_string(st), m);
    MP_CHECK(el <= g_timeout_ms + SLACK_MS,
             "the error came %.0f ms after rank %d was signalled (timeout %d ms + %d ms)", el,
             t->victim, g_timeout_ms, SLACK_MS);
    MP_CHECK(mp_names_rank(m, t->victim), "the error message does not name rank %d: \"%s\"",
             t->victim, m);
    if (t->sig == SIGSTOP)
      MP_CHECK(mp_contains(m, "silent for"),
               "the error message does not say how long rank %d has been silent: \"%s\"", t->victim,
               m);
    int64_t t1 = mp_now_ns();
    brg_status st2 = brg_allreduce(s, r, 1000, BRG_FLOAT32, BRG_SUM, c, NULL);
    MP_CHECK(st2 != BRG_SUCCESS, "an allreduce after the failure succeeded");
    MP_CHECK(ms_between(t1, mp_now_ns()) <= SLACK_MS,
             "an allreduce after the failure took %.0f ms to return", ms_between(t1, mp_now_ns()));
  }
out:
  brg_comm_destroy(c); /* must come back, whatever it says about the victim */
  ctx->comm = NULL;
  free(s);
  free(r);
  return 0;
}

static int run_faults(int n) {
  int trials = mp_env_int("MP_FAULT_TRIALS", 6), bad = 0;
  const char *sigs = getenv("MP_FAULT_SIGNALS");
  if (!sigs || !sigs[0]) sigs = "both";
  if (strcmp(sigs, "both") && strcmp(sigs, "kill") && strcmp(sigs, "stop")) {
    fprintf(stderr, "test_faults: MP_FAULT_SIGNALS=%s: expected kill, stop or both\n", sigs);
    return 1;
  }
  uint64_t ps = g_seed;
  for (int k = 0; k < trials; k++) {
    int kill = !strcmp(sigs, "kill") || (!strcmp(sigs, "both") && k % 2 == 0);
    fault_trial t = {.victim = (int)(rnd(&ps) % (uint64_t)n), .sig = kill ? SIGKILL : SIGSTOP};
    int after = 1 + (int)(rnd(&ps) % 3), delay = (int)(rnd(&ps) % 40);
    char name[128];
    snprintf(name, sizeof name, "trial %d: rank %d %s after %d allreduces + %d ms", k, t.victim,
             t.sig == SIGKILL ? "killed" : "stopped", after, delay);
    printf("test_faults: %s\n", name);
    fflush(stdout);
    g_seed = rnd(&ps); /* each trial's sizes */
    mp_opts o = {.name = name,
                 .nranks = n,
                 .deadline_ms = g_timeout_ms * 2 + 60000,
                 .init = MP_INIT_ID,
                 .victim = t.victim,
                 .victim_signal = t.sig,
                 .victim_after = after,
                 .victim_delay_ms = delay};
    bad |= mp_run(&o, body_fault, &t);
  }
  return bad;
}

/* ================================================================== soak */

static const brg_dtype k_dtypes[] = {BRG_INT8,    BRG_UINT8,  BRG_INT32,   BRG_UINT32,
                                     BRG_INT64,   BRG_UINT64, BRG_FLOAT16, BRG_BFLOAT16,
                                     BRG_FLOAT32, BRG_FLOAT64};
static const char *const k_dtype_names[] = {"int8",   "uint8",   "int32",    "uint32",  "int64",
                                            "uint64", "float16", "bfloat16", "float32", "float64"};
static const char *const k_op_names[] = {"sum", "prod", "min", "max", "avg"};

static size_t dtype_size(brg_dtype d) {
  switch (d) {
  case BRG_INT8:
  case BRG_UINT8: return 1;
  case BRG_FLOAT16:
  case BRG_BFLOAT16: return 2;
  case BRG_INT32:
  case BRG_UINT32:
  case BRG_FLOAT32: return 4;
  default: return 8;
  }
}

static int dtype_signed(brg_dtype d) {
  return d != BRG_UINT8 && d != BRG_UINT32 && d != BRG_UINT64;
}

/* Half-precision bits of a small integer (|v| <= 2048: exact). */
static uint16_t half_of_int(long v) {
  uint16_t sign = v < 0 ? 0x8000 : 0;
  unsigned long a = (unsigned long)(v < 0 ? -v : v);
  if (a == 0) return sign;
  int e = 63 - __builtin_clzl(a);
  return (uint16_t)(sign | (uint16_t)((e + 15) << 10) | (uint16_t)((a << (10 - e)) & 0x3ff));
}

static uint16_t bf16_of_int(long v) {
  float f = (float)v;
  uint32_t b;
  memcpy(&b, &f, 4);
  return (uint16_t)(b >> 16); /* small integers: the low half is zero */
}

/* Stores integer v (or, for avg, the double x) as element i of dtype d. */
static void put(brg_dtype d, void *buf, size_t i, long v, double x, int use_x) {
  uint8_t *p = (uint8_t *)buf + i * dtype_size(d);
  switch (d) {
  case BRG_INT8: *(int8_t *)p = (int8_t)v; break;
  case BRG_UINT8: *(uint8_t *)p = (uint8_t)v; break;
  case BRG_INT32: *(int32_t *)p = (int32_t)v; break;
  case BRG_UINT32: *(uint32_t *)p = (uint32_t)v; break;
  case BRG_INT64: *(int64_t *)p = (int64_t)v; break;
  case BRG_UINT64: *(uint64_t *)p = (uint64_t)v; break;
  case BRG_FLOAT16: *(uint16_t *)p = half_of_int(v); break;
  case BRG_BFLOAT16: *(uint16_t *)p = bf16_of_int(v); break;
  case BRG_FLOAT32: *(float *)p = use_x ? (float)x : (float)v; break;
  default: *(double *)p = use_x ? x : (double)v; break;
  }
}

/* The largest integer every partial result of dtype d holds exactly: a
 * 16-bit or 32-bit float rounds beyond it, so the order in which ranks
 * reduce would change the value (the integer types wrap the same way in
 * every order, so theirs only keeps the reference's long arithmetic
 * defined). */
static long exact_limit(brg_dtype d) {
  switch (d) {
  case BRG_FLOAT16: return 2048;
  case BRG_BFLOAT16: return 256;
  case BRG_FLOAT32: return 1L << 24;
  case BRG_FLOAT64: return 1L << 53;
  default: return 1L << 62;
  }
}

/* How many ranks may each give a factor of up to 3 so that every partial
 * product stays within exact_limit(d): 5 for bfloat16, 33 for float64. */
static int prod_factors(brg_dtype d) {
  long lim = exact_limit(d), p = 1;
  int k = 0;
  while (p <= lim / 3) p *= 3, k++;
  return k;
}

/* The input of rank r of n, element i: small integers whose sums,
 * products, minima and maxima are exact in every dtype at every n. For a
 * product only one rank in `stride` gives a factor other than 1, so that
 * at most prod_factors(d) factors meet; for a sum the values shrink as n
 * grows, so that no partial sum of a float leaves exact_limit(d). */
static long soak_in(brg_dtype d, brg_op op, uint64_t salt, int n, int r, size_t i) {
  if (op == BRG_PROD) {
    int k = prod_factors(d), stride = (n + k - 1) / k;
    if ((size_t)r % (size_t)stride != (i + salt) % (size_t)stride) return 1;
    return 1 + (long)((i * 7 + (size_t)r * 3 + salt) % 3);
  }
  long m = exact_limit(d) / n < 8 ? exact_limit(d) / n : 8;
  long v = (long)((i * 13 + (size_t)r * 5 + salt) % (size_t)(2 * m + 1));
  return dtype_signed(d) ? v - m : v;
}

static long soak_reduced(brg_dtype d, brg_op op, uint64_t salt, int n, size_t i) {
  long acc = soak_in(d, op, salt, n, 0, i);
  for (int r = 1; r < n; r++) {
    long v = soak_in(d, op, salt, n, r, i);
    if (op == BRG_SUM || op == BRG_AVG)
      acc += v;
    else if (op == BRG_PROD)
      acc *= v;
    else if (op == BRG_MIN)
      acc = v < acc ? v : acc;
    else
      acc = v > acc ? v : acc;
  }
  return acc;
}

/* Compares element i of got with the expected integer (or, for avg, the
 * exact mean within the dtype's rounding). 1 when it matches. */
static int same(brg_dtype d, const void *got, size_t i, long v, int avg, int n) {
  size_t sz = dtype_size(d);
  if (avg) {
    double want = (double)v / n, g;
    if (d == BRG_FLOAT32)
      g = ((const float *)got)[i];
    else
      g = ((const double *)got)[i];
    double tol = (d == BRG_FLOAT32 ? 1e-6 : 1e-12) * (fabs(want) + 1);
    return fabs(g - want) <= tol;
  }
  uint8_t want[8];
  put(d, want, 0, v, 0, 0);
  return memcmp((const uint8_t *)got + i * sz, want, sz) == 0;
}

static size_t soak_count(uint64_t *rs) {
  uint64_t k = rnd(rs) % 10;
  if (k < 5) return 1 + rnd(rs) % 1024;
  if (k < 9) return 1024 + rnd(rs) % (64 * 1024);
  return 64 * 1024 + rnd(rs) % (1024 * 1024);
}

enum {
  C_ALLREDUCE,
  C_IALLREDUCE,
  C_REDUCE_SCATTER,
  C_ALL_GATHER,
  C_BROADCAST,
  C_REDUCE,
  C_BARRIER
};
static const char *const k_coll_names[] = {
    "allreduce", "iallreduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "barrier"};

static int body_soak(mp_ctx *ctx) {
  brg_comm *c = ctx->comm;
  int n = ctx->nranks, me = ctx->rank;
  int seconds = mp_env_int("MP_SOAK_SECONDS", 20);
  size_t cap = (size_t)(1024 * 1024 + 64 * 1024) * (size_t)n * 8; /* soak_count's most, n times */
  uint8_t *s = malloc(cap), *r = malloc(cap), *s0 = malloc(cap);
  if (!s || !r || !s0) return 1;
  uint64_t rs = g_seed;
  int64_t start = mp_now_ns();
  long calls = 0, elements = 0;
  for (int iter = 0;; iter++) {
    /* Rank 0 says when time is up; every rank learns it in the same call. */
    int32_t stop = me == 0 && ms_between(start, mp_now_ns()) > seconds * 1000.0, stop_all = 0;
    brg_status st = brg_allreduce(&stop, &stop_all, 1, BRG_INT32, BRG_MAX, c, NULL);
    if (st != BRG_SUCCESS) {
      mp_fail("stop vote %d: %s: %s", iter, brg_status_string(st), brg_comm_last_error(c));
      break;
    }
    if (stop_all) break;
    int coll = (int)(rnd(&rs) % 7), di = (int)(rnd(&rs) % 10);
    brg_dtype d = k_dtypes[di];
    brg_op op = (brg_op)(rnd(&rs) % 5);
    int is_float = d == BRG_FLOAT32 || d == BRG_FLOAT64;
    if (op == BRG_AVG && !is_float) op = BRG_SUM; /* the mean of integers is not exact */
    size_t count = soak_count(&rs), sz = dtype_size(d);
    int root = (int)(rnd(&rs) % (uint64_t)n), in_place = (int)(rnd(&rs) % 2);
    uint64_t salt = rnd(&rs) % 1000;
    size_t in_n = coll == C_REDUCE_SCATTER ? count * (size_t)n : count;
    size_t out_n = coll == C_ALL_GATHER ? count * (size_t)n : count;
    if (coll == C_ALL_GATHER || coll == C_BROADCAST) op = BRG_SUM; /* inputs only */
    for (size_t i = 0; i < in_n; i++) put(d, s, i, soak_in(d, op, salt, n, me, i), 0, 0);
    memcpy(s0, s, in_n * sz);
    memset(r, 0xa5, out_n * sz);
    const void *sb = s;
    void *rb = r;
    if (in_place) {
      /* in place: the input sits where NCCL expects it in the output */
      size_t off = coll == C_ALL_GATHER ? (size_t)me * count : 0;
      if (coll == C_REDUCE_SCATTER) {
        memcpy(r, s, in_n * sz);
        sb = r;
        rb = r + (size_t)me * count * sz;
      } else {
        memcpy(r + off * sz, s, in_n * sz);
        sb = r + off * sz;
      }
    }
    brg_request req;
    switch (coll) {
    case C_ALLREDUCE: st = brg_allreduce(sb, rb, count, d, op, c, NULL); break;
    case C_IALLREDUCE:
      st = brg_iallreduce(sb, rb, count, d, op, c, &req);
      if (st == BRG_SUCCESS) st = brg_wait(&req);
      break;
    case C_REDUCE_SCATTER: st = brg_reduce_scatter(sb, rb, count, d, op, c, NULL); break;
    case C_ALL_GATHER: st = brg_all_gather(sb, rb, count, d, c, NULL); break;
    case C_BROADCAST: st = brg_broadcast(sb, rb, count, d, root, c, NULL); break;
    case C_REDUCE: st = brg_reduce(sb, rb, count, d, op, root, c, NULL); break;
    default: st = brg_barrier(c); break;
    }
    calls++;
    char what[160];
    snprintf(what, sizeof what, "call %d: %s%s of %zu %s, %s, root %d", iter, k_coll_names[coll],
             in_place ? " in place" : "", count, k_dtype_names[di], k_op_names[op], root);
    if (st != BRG_SUCCESS) {
      mp_fail("%s: %s: %s", what, brg_status_string(st), brg_comm_last_error(c));
      break;
    }
    if (!in_place && memcmp(s, s0, in_n * sz) != 0) {
      mp_fail("%s: the send buffer changed", what);
      break;
    }
    if (coll == C_BARRIER || (coll == C_REDUCE && me != root)) continue;
    const uint8_t *out = rb;
    size_t bad_i = SIZE_MAX;
    long want = 0;
    for (size_t i = 0; i < out_n && bad_i == SIZE_MAX; i++) {
      if (coll == C_ALL_GATHER)
        want = soak_in(d, op, salt, n, (int)(i / count), i % count);
      else if (coll == C_BROADCAST)
        want = soak_in(d, op, salt, n, root, i);
      else if (coll == C_REDUCE_SCATTER)
        want = soak_reduced(d, op, salt, n, (size_t)me * count + i);
      else
        want = soak_reduced(d, op, salt, n, i);
      if (!same(d, out, i, want, op == BRG_AVG && coll != C_ALL_GATHER && coll != C_BROADCAST, n))
        bad_i = i;
    }
    if (bad_i != SIZE_MAX) {
      mp_fail("%s: element %zu is wrong (expected %ld%s; seed %llu)", what, bad_i, want,
              op == BRG_AVG ? " / nranks" : "", (unsigned long long)g_seed);
      break;
    }
    elements += (long)out_n;
  }
  if (me == 0)
    mp_info("soak: %ld collectives, %ld elements checked in %.1f s", calls, elements,
            ms_between(start, mp_now_ns()) / 1000.0);
  free(s);
  free(r);
  free(s0);
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s faults|soak N\n", argv[0]);
    return 2;
  }
  int n = atoi(argv[2]);
  if (n < 2 || n > MP_MAX_RANKS) {
    fprintf(stderr, "test_faults: N must be 2..%d\n", MP_MAX_RANKS);
    return 2;
  }
  g_timeout_ms = mp_env_int("BRIGADE_TIMEOUT_MS", 0);
  const char *seed = getenv("MP_SEED");
  g_seed = seed ? strtoull(seed, NULL, 0) : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
  printf("test_faults %s N=%d over %s, seed %llu (MP_SEED replays it)\n", argv[1], n,
         mp_transport(), (unsigned long long)g_seed);
  fflush(stdout);
  if (!strcmp(argv[1], "faults")) {
    if (g_timeout_ms <= 0) {
      fprintf(stderr, "test_faults faults: set BRIGADE_TIMEOUT_MS\n");
      return 2;
    }
    return run_faults(n) ? 1 : 0;
  }
  if (!strcmp(argv[1], "soak")) {
    mp_opts o = {.name = "soak",
                 .nranks = n,
                 .deadline_ms = (mp_env_int("MP_SOAK_SECONDS", 20) + 60) * 1000,
                 .init = MP_INIT_ID};
    return mp_run(&o, body_soak, NULL) ? 1 : 0;
  }
  fprintf(stderr, "test_faults: unknown mode %s\n", argv[1]);
  return 2;
}
