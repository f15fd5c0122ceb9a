/*
 * Every collective, every dtype (and op), in place and out of place, over a
 * range of counts, checked element by element against a reference the test
 * computes itself.
 *
 *   test_collectives N [part...]     parts: barrier allreduce reduce_scatter
 *                                    all_gather broadcast reduce bytes async
 *                                    lifecycle; the non-blocking forms:
 *                                    ibarrier iallreduce ireduce_scatter
 *                                    iall_gather ibroadcast ireduce imulti;
 *                                    gather scatter igather iscatter bitwise
 *
 * With no part named, the blocking parts of the first group run (the i*
 * parts and the last group are named by the tests that want them).
 *
 * The transport comes from BRIGADE_TRANSPORTS (set per test by meson).
 *
 * Inputs are chosen so the exact answer is known in every dtype:
 *  - integers: full-range random bits, wrap-around arithmetic modulo 2^bits;
 *    avg is the wrapped sum divided by N, truncating toward zero;
 *  - floats, sum/avg: k * scale with small random k, so every partial sum is
 *    exact (|partial| <= 136 units in bfloat16, which holds 256 exactly);
 *    for avg the last rank's k makes the sum a multiple of N;
 *  - floats, prod: values from {1, 2, -1, 0.5, -2, -0.5};
 *  - floats, min/max: distinct k * scale;
 *  - all_gather/broadcast: random bit patterns, which must arrive bit-exact.
 * Values differ per rank, per element and per call. Element i takes table
 * entry i mod P (P = min(count, 65521), a prime), so building the reference
 * costs N*P per call while checking stays a memcmp per element.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <math.h>
#include <sys/wait.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "../../kernels/cuda/brg_cuda.h"

#define PERIOD 65521u /* prime, so shifted chunks do not line up with the table */
#define GUARD 256     /* bytes checked on both sides of every output */
#define BIG 1000003u  /* the large count */
#define MAX_ELEMS (BIG + MP_MAX_RANKS)

/* ------------------------------------------------------------- dtypes */

typedef struct dinfo {
  brg_dtype dt;
  const char *name;
  size_t size;
  int is_float, is_signed, bits;
  /* float parameters: scale and bounds of k for sum/avg and for min/max */
  double scale;
  int64_t k_sum, k_minmax;
} dinfo;

static const dinfo DTYPES[BRG_NUM_DTYPES] = {
    {BRG_INT8, "int8", 1, 0, 1, 8, 0, 0, 0},
    {BRG_UINT8, "uint8", 1, 0, 0, 8, 0, 0, 0},
    {BRG_INT32, "int32", 4, 0, 1, 32, 0, 0, 0},
    {BRG_UINT32, "uint32", 4, 0, 0, 32, 0, 0, 0},
    {BRG_INT64, "int64", 8, 0, 1, 64, 0, 0, 0},
    {BRG_UINT64, "uint64", 8, 0, 0, 64, 0, 0, 0},
    {BRG_FLOAT16, "float16", 2, 1, 1, 16, 0.25, 16, 1000},
    {BRG_BFLOAT16, "bfloat16", 2, 1, 1, 16, 0.25, 16, 200},
    {BRG_FLOAT32, "float32", 4, 1, 1, 32, 1.0 / 16, 1 << 20, 1 << 23},
    {BRG_FLOAT64, "float64", 8, 1, 1, 64, 1.0 / 1024, 1LL << 49, 1LL << 52},
};
static const char *OPS[BRG_NUM_OPS] = {"sum", "prod", "min", "max", "avg", "band", "bor", "bxor"};
static const brg_op OPV[BRG_NUM_OPS] = {BRG_SUM, BRG_PROD, BRG_MIN, BRG_MAX,
                                        BRG_AVG, BRG_BAND, BRG_BOR, BRG_BXOR};
/* The ops every dtype takes; the bitwise ones (integers only) follow and
 * have a part of their own. */
#define ARITH_OPS 5

/* Half-precision conversions written here, independent of the library. */
static uint16_t to_f16(double v) {
  uint16_t sign = signbit(v) ? 0x8000 : 0;
  v = fabs(v);
  if (v == 0) return sign;
  if (isnan(v)) return 0x7e00;
  int e;
  double m = frexp(v, &e); /* v = m * 2^e, m in [0.5, 1) */
  int E = e + 14;          /* v = (2m) * 2^(e-1), biased exponent e-1+15 */
  if (E >= 31) return sign | 0x7c00;
  if (E <= 0) return sign | (uint16_t)nearbyint(ldexp(v, 24));
  uint32_t f = (uint32_t)nearbyint((2 * m - 1) * 1024);
  if (f == 1024) {
    f = 0;
    if (++E >= 31) return sign | 0x7c00;
  }
  return sign | (uint16_t)(E << 10) | (uint16_t)f;
}

static double from_f16(uint16_t h) {
  int E = (h >> 10) & 31, f = h & 1023;
  double v = E == 0 ? ldexp(f, -24) : E == 31 ? (f ? NAN : INFINITY) : ldexp(1024 + f, E - 25);
  return (h & 0x8000) ? -v : v;
}

static uint16_t to_bf16(double v) {
  float f = (float)v;
  uint32_t u;
  memcpy(&u, &f, 4);
  if (isnan(f)) return 0x7fc0;
  u += 0x7fff + ((u >> 16) & 1);
  return (uint16_t)(u >> 16);
}

static double from_bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* One value: integers sign- or zero-extended to 64 bits, floats as double. */
typedef union num {
  uint64_t u;
  int64_t i;
  double d;
} num;

static uint64_t mask_bits(int bits) {
  return bits == 64 ? ~0ull : (1ull << bits) - 1;
}

static num int_norm(const dinfo *di, uint64_t u) {
  num n;
  u &= mask_bits(di->bits);
  if (di->is_signed && di->bits < 64 && (u >> (di->bits - 1)) & 1) u |= ~mask_bits(di->bits);
  n.u = u;
  return n;
}

static void encode(const dinfo *di, num v, void *dst) {
  if (!di->is_float) {
    memcpy(dst, &v.u, di->size); /* little-endian: the low bytes */
    return;
  }
  switch (di->dt) {
  case BRG_FLOAT16: {
    uint16_t h = to_f16(v.d);
    memcpy(dst, &h, 2);
    break;
  }
  case BRG_BFLOAT16: {
    uint16_t h = to_bf16(v.d);
    memcpy(dst, &h, 2);
    break;
  }
  case BRG_FLOAT32: {
    float f = (float)v.d;
    memcpy(dst, &f, 4);
    break;
  }
  default: memcpy(dst, &v.d, 8);
  }
}

static double decode_float(const dinfo *di, const void *src) {
  uint16_t h;
  float f;
  double d;
  switch (di->dt) {
  case BRG_FLOAT16: memcpy(&h, src, 2); return from_f16(h);
  case BRG_BFLOAT16: memcpy(&h, src, 2); return from_bf16(h);
  case BRG_FLOAT32: memcpy(&f, src, 4); return f;
  default: memcpy(&d, src, 8); return d;
  }
}

static void describe_elem(const dinfo *di, const void *p, char *out, size_t cap) {
  uint64_t u = 0;
  memcpy(&u, p, di->size);
  if (di->is_float)
    snprintf(out, cap, "%.17g (0x%0*llx)", decode_float(di, p), (int)di->size * 2,
             (unsigned long long)u);
  else if (di->is_signed)
    snprintf(out, cap, "%lld (0x%0*llx)", (long long)int_norm(di, u).i, (int)di->size * 2,
             (unsigned long long)u);
  else
    snprintf(out, cap, "%llu (0x%0*llx)", (unsigned long long)u, (int)di->size * 2,
             (unsigned long long)u);
}

/* ----------------------------------------------------- value generation */

static uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static uint64_t raw_at(uint64_t seed, int q, uint64_t j) {
  return mix64(mix64(seed * 0x100000001b3ull + (uint64_t)q) ^ j);
}

static int64_t pick_k(uint64_t raw, int64_t K) {
  return (int64_t)(raw % (uint64_t)(2 * K + 1)) - K;
}

/* The N ranks' values at table index j for a reduction. */
static void gen_reduce_vals(const dinfo *di, int op, int n, uint64_t seed, uint64_t j, num *v) {
  if (!di->is_float) {
    for (int q = 0; q < n; q++) {
      uint64_t raw = raw_at(seed, q, j);
      if (OPV[op] == BRG_PROD && (raw >> 62) != 0) raw |= 1; /* mostly odd: products stay nonzero */
      v[q] = int_norm(di, raw);
    }
    return;
  }
  static const double prodset[6] = {1, 2, -1, 0.5, -2, -0.5};
  int64_t S = 0;
  for (int q = 0; q < n; q++) {
    uint64_t raw = raw_at(seed, q, j);
    switch (OPV[op]) {
    case BRG_PROD: v[q].d = prodset[raw % 6]; break;
    case BRG_MIN:
    case BRG_MAX: v[q].d = (double)pick_k(raw, di->k_minmax) * di->scale; break;
    case BRG_AVG: {
      int64_t k = pick_k(raw, di->k_sum);
      if (q == n - 1) k -= (((S + k) % n) + n) % n; /* sum becomes a multiple of n */
      S += k;
      v[q].d = (double)k * di->scale;
      break;
    }
    default: v[q].d = (double)pick_k(raw, di->k_sum) * di->scale;
    }
  }
}

static num ref_reduce(const dinfo *di, int op, int n, const num *v) {
  num r = v[0];
  if (!di->is_float) {
    for (int q = 1; q < n; q++) {
      switch (OPV[op]) {
      case BRG_PROD: r.u *= v[q].u; break;
      case BRG_MIN:
        if (di->is_signed ? v[q].i < r.i : v[q].u < r.u) r = v[q];
        break;
      case BRG_MAX:
        if (di->is_signed ? v[q].i > r.i : v[q].u > r.u) r = v[q];
        break;
      case BRG_BAND: r.u &= v[q].u; break;
      case BRG_BOR: r.u |= v[q].u; break;
      case BRG_BXOR: r.u ^= v[q].u; break;
      default: r.u += v[q].u;
      }
    }
    r = int_norm(di, r.u);
    if (OPV[op] == BRG_AVG) {
      if (di->is_signed)
        r.i = r.i / n; /* C division: truncates toward zero */
      else
        r.u = r.u / (uint64_t)n;
      r = int_norm(di, r.u);
    }
    return r;
  }
  for (int q = 1; q < n; q++) {
    switch (OPV[op]) {
    case BRG_PROD: r.d *= v[q].d; break;
    case BRG_MIN: r.d = v[q].d < r.d ? v[q].d : r.d; break;
    case BRG_MAX: r.d = v[q].d > r.d ? v[q].d : r.d; break;
    default: r.d += v[q].d;
    }
  }
  if (OPV[op] == BRG_AVG) r.d /= n;
  return r;
}

/* ---------------------------------------------------------- the state */

typedef struct run {
  int rank, n;
  brg_comm *comm;
  uint64_t call;                        /* collective calls so far, the same on every rank */
  unsigned char *sbase, *rbase, *xbase; /* send, recv and spare regions with guards */
  unsigned char *own, *ref;             /* PERIOD elements each */
  unsigned char *tabs;                  /* MP_MAX_RANKS tables of PERIOD elements */
  num *vals;
  int broken; /* a call failed: the ranks are out of step, stop */
  int nb;     /* the non-blocking forms (brg_i*) and brg_test/brg_wait instead */
  brg_request req;
  int64_t t_parts[16];
  /* MP_DEVICE=1: device mirrors of sbase/rbase and the stream */
  const brg__cuda_api *dapi;
  unsigned char *dsbase, *drbase;
  size_t region;
  void *stream;
} run;

static void *xmalloc(size_t n) {
  void *p = malloc(n);
  if (!p) {
    mp_fail("out of memory (%zu bytes)", n);
    exit(1);
  }
  memset(p, 0x5a, n); /* touch every page before the clock matters */
  return p;
}

static size_t period_of(size_t count) {
  return count < PERIOD ? (count ? count : 1) : PERIOD;
}

/* buf[i] = tab[(start + i) % P] */
static void fill_pattern(unsigned char *buf, size_t count, size_t esz, const unsigned char *tab,
                         size_t P, size_t start) {
  size_t i = 0, j = start % P;
  while (i < count) {
    size_t len = P - j < count - i ? P - j : count - i;
    memcpy(buf + i * esz, tab + j * esz, len * esz);
    i += len;
    j = 0;
  }
}

/* Compares buf[i] with tab[(start + i) % P]; floats compare by value (so
 * +0 == -0) unless bitwise. Returns the number of wrong elements. */
static size_t check_pattern(const char *what, const dinfo *di, const unsigned char *buf,
                            size_t count, const unsigned char *tab, size_t P, size_t start,
                            int bitwise) {
  size_t esz = di->size, bad = 0, i = 0, j = start % P;
  while (i < count) {
    size_t len = P - j < count - i ? P - j : count - i;
    if (memcmp(buf + i * esz, tab + j * esz, len * esz) != 0) {
      for (size_t k = 0; k < len; k++) {
        const unsigned char *got = buf + (i + k) * esz, *exp = tab + (j + k) * esz;
        if (memcmp(got, exp, esz) == 0) continue;
        if (!bitwise && di->is_float && decode_float(di, got) == decode_float(di, exp)) continue;
        if (bad < 5) {
          char g[96], e[96];
          describe_elem(di, got, g, sizeof g);
          describe_elem(di, exp, e, sizeof e);
          mp_fail("%s: element %zu is %s, expected %s", what, i + k, g, e);
        }
        bad++;
      }
    }
    i += len;
    j = 0;
  }
  if (bad > 5) mp_fail("%s: %zu of %zu elements wrong in all", what, bad, count);
  return bad;
}

static void set_guards(unsigned char *p, size_t bytes) {
  memset(p - GUARD, 0xa5, GUARD);
  memset(p + bytes, 0xa5, GUARD);
}

static void check_guards(const char *what, const unsigned char *p, size_t bytes) {
  for (size_t k = 0; k < GUARD; k++) {
    if (p[-(ptrdiff_t)GUARD + (ptrdiff_t)k] != 0xa5) {
      mp_fail("%s: wrote %zu bytes before the start of recvbuf", what, GUARD - k);
      break;
    }
  }
  for (size_t k = GUARD; k > 0; k--) {
    if (p[bytes + k - 1] != 0xa5) {
      mp_fail("%s: wrote past the end of recvbuf (byte %zu after it)", what, k - 1);
      break;
    }
  }
}

static int call_ok(run *R, const char *what, brg_status st) {
  if (st == BRG_SUCCESS) return 1;
  mp_fail("%s returned %s: %s", what, brg_status_string(st), brg_comm_last_error(R->comm));
  R->broken = 1;
  return 0;
}

/* ---- device mode ---- */

/* The CUDA module the library will open (the same file, so one instance). */
static const brg__cuda_api *device_api(char *why, size_t cap) {
  const char *path = getenv("BRIGADE_CUDA_MODULE");
  if (!path || !*path) {
    snprintf(why, cap, "MP_DEVICE=1 needs BRIGADE_CUDA_MODULE");
    return NULL;
  }
  return brg__cuda_open(path, why, cap);
}

/* Where a host pointer into sbase/rbase lives in the device mirror. */
static void *dptr(run *R, const void *p) {
  const unsigned char *c = p;
  if (!R->dapi || !c) return (void *)c;
  if (c >= R->sbase && c < R->sbase + R->region) return R->dsbase + (c - R->sbase);
  if (c >= R->rbase && c < R->rbase + R->region) return R->drbase + (c - R->rbase);
  return (void *)c;
}

/* Copies the first GUARD + ext + GUARD bytes of both regions to the device. */
static void dev_up(run *R, size_t sext, size_t rext) {
  if (!R->dapi) return;
  R->dapi->drv.mem_copy(R->dsbase, R->sbase, sext + 2 * GUARD);
  R->dapi->drv.mem_copy(R->drbase, R->rbase, rext + 2 * GUARD);
}

/* After a device call: wait for the stream and copy both regions back. */
static brg_status dev_down(run *R, brg_status st, size_t sext, size_t rext) {
  if (!R->dapi || st != BRG_SUCCESS) return st;
  int e = R->dapi->drv.stream_sync(R->stream);
  if (e) {
    mp_fail("stream synchronize: %s", R->dapi->drv.error_string(e));
    return BRG_ERR_SYSTEM;
  }
  R->dapi->drv.mem_copy(R->sbase, R->dsbase, sext + 2 * GUARD);
  R->dapi->drv.mem_copy(R->rbase, R->drbase, rext + 2 * GUARD);
  return st;
}

/* CALL runs on the device mirrors when MP_DEVICE=1 (S and RB: the pointers
 * it is given; SE, RE: bytes used past the start of each region). */
#define ON_DEVICE(R, SE, RE, CALL) (dev_up(R, SE, RE), dev_down(R, (CALL), SE, RE))
#define D(p) dptr(R, p)

/* Completes a non-blocking call: a few brg_test polls, then brg_wait. */
static brg_status nb_finish(run *R, brg_status st) {
  if (st != BRG_SUCCESS) return st;
  for (int k = 0; k < 3; k++) {
    int done = -1;
    st = brg_test(&R->req, &done);
    if (done == 1) return st;
    if (done != 0 || st != BRG_IN_PROGRESS) {
      mp_fail("brg_test on a running request: %s, done=%d", brg_status_string(st), done);
      return st == BRG_SUCCESS ? BRG_ERR_INTERNAL : st;
    }
  }
  return brg_wait(&R->req);
}

/* The blocking call (on the device mirrors when MP_DEVICE=1), or with
 * R->nb its non-blocking form on R->req, completed. */
#define COLL_CALL(R, SE, RE, BLOCKING, NB)                                                         \
  ((R)->nb ? nb_finish(R, (NB)) : ON_DEVICE(R, SE, RE, BLOCKING))

static void label(char *buf, size_t cap, const char *coll, const dinfo *di, int op, size_t count,
                  int inplace, int root) {
  int l = snprintf(buf, cap, "%s %s", coll, di->name);
  if (op >= 0) l += snprintf(buf + l, cap - (size_t)l, " %s", OPS[op]);
  l += snprintf(buf + l, cap - (size_t)l, " count=%zu %s", count,
                inplace ? "in-place" : "out-of-place");
  if (root >= 0) snprintf(buf + l, cap - (size_t)l, " root=%d", root);
}

/* Builds own[j] (this rank's input) and ref[j] (the reduction) for j < P. */
static void build_reduce_tables(run *R, const dinfo *di, int op, size_t P, uint64_t seed) {
  for (size_t j = 0; j < P; j++) {
    gen_reduce_vals(di, op, R->n, seed, j, R->vals);
    encode(di, R->vals[R->rank], R->own + j * di->size);
    encode(di, ref_reduce(di, op, R->n, R->vals), R->ref + j * di->size);
  }
}

/* Random bit patterns of rank q (for the copy collectives) into tab. */
static void build_copy_table(const dinfo *di, int q, size_t P, uint64_t seed, unsigned char *tab) {
  for (size_t j = 0; j < P; j++) {
    uint64_t raw = raw_at(seed, q, j);
    memcpy(tab + j * di->size, &raw, di->size);
  }
}

/* ---------------------------------------------------------- collectives */

static unsigned char *sendp(run *R) {
  return R->sbase + GUARD;
}
static unsigned char *recvp(run *R) {
  return R->rbase + GUARD;
}

static void do_allreduce(run *R, const dinfo *di, int op, size_t count, int inplace) {
  char what[160];
  label(what, sizeof what, "allreduce", di, op, count, inplace, -1);
  uint64_t seed = ++R->call;
  size_t P = period_of(count), bytes = count * di->size;
  build_reduce_tables(R, di, op, P, seed);
  unsigned char *s = sendp(R), *r = inplace ? s : recvp(R);
  fill_pattern(s, count, di->size, R->own, P, 0);
  if (!inplace) memset(r, 0xcd, bytes);
  set_guards(r, bytes);
  if (!call_ok(R, what,
               COLL_CALL(R, bytes, bytes,
                         brg_allreduce(D(s), D(r), count, di->dt, OPV[op], R->comm, R->stream),
                         brg_iallreduce(s, r, count, di->dt, OPV[op], R->comm, &R->req))))
    return;
  check_pattern(what, di, r, count, R->ref, P, 0, 0);
  check_guards(what, r, bytes);
  if (!inplace) check_pattern("allreduce changed its sendbuf", di, s, count, R->own, P, 0, 1);
}

/* fresh: build new inputs; otherwise reuse the last call's (the tables are
 * the expensive part; a new root gets the same inputs, and a root's recvbuf
 * is still poisoned before every call). */
static void do_reduce(run *R, const dinfo *di, int op, size_t count, int inplace, int root,
                      int fresh) {
  char what[160];
  label(what, sizeof what, "reduce", di, op, count, inplace, root);
  size_t P = period_of(count), bytes = count * di->size;
  if (fresh) build_reduce_tables(R, di, op, P, ++R->call);
  unsigned char *s = sendp(R), *r = inplace ? s : recvp(R);
  fill_pattern(s, count, di->size, R->own, P, 0);
  if (!inplace) memset(r, 0xcd, bytes);
  set_guards(r, bytes);
  if (!call_ok(R, what,
               COLL_CALL(R, bytes, bytes,
                         brg_reduce(D(s), D(r), count, di->dt, OPV[op], root, R->comm, R->stream),
                         brg_ireduce(s, r, count, di->dt, OPV[op], root, R->comm, &R->req))))
    return;
  if (R->rank == root) check_pattern(what, di, r, count, R->ref, P, 0, 0);
  check_guards(what, r, bytes);
  if (!inplace) check_pattern("reduce changed its sendbuf", di, s, count, R->own, P, 0, 1);
}

/* recvcount per rank; in place means recvbuf = sendbuf + rank * recvcount (NCCL). */
static void do_reduce_scatter(run *R, const dinfo *di, int op, size_t rc, int inplace) {
  char what[160];
  label(what, sizeof what, "reduce_scatter", di, op, rc, inplace, -1);
  uint64_t seed = ++R->call;
  size_t total = rc * (size_t)R->n, P = period_of(total), esz = di->size;
  build_reduce_tables(R, di, op, P, seed);
  unsigned char *s = sendp(R);
  unsigned char *r = inplace ? s + (size_t)R->rank * rc * esz : recvp(R);
  fill_pattern(s, total, esz, R->own, P, 0);
  if (inplace) {
    set_guards(s, total * esz);
  } else {
    memset(r, 0xcd, rc * esz);
    set_guards(r, rc * esz);
  }
  if (!call_ok(R, what,
               COLL_CALL(R, total * esz, rc * esz,
                         brg_reduce_scatter(D(s), D(r), rc, di->dt, OPV[op], R->comm, R->stream),
                         brg_ireduce_scatter(s, r, rc, di->dt, OPV[op], R->comm, &R->req))))
    return;
  check_pattern(what, di, r, rc, R->ref, P, (size_t)R->rank * rc, 0);
  if (inplace) {
    check_guards(what, s, total * esz);
  } else {
    check_guards(what, r, rc * esz);
    check_pattern("reduce_scatter changed its sendbuf", di, s, total, R->own, P, 0, 1);
  }
}

/* sendcount per rank; in place means sendbuf = recvbuf + rank * sendcount (NCCL). */
/* Block q of r (count elements each, n blocks) is rank q's copy pattern:
 * its table at tabs + q * stride elements, of period P. */
static void check_blocks(const char *what, const dinfo *di, const unsigned char *r, size_t count,
                         int n, const unsigned char *tabs, size_t stride, size_t P) {
  for (int q = 0; q < n; q++) {
    char w2[240];
    snprintf(w2, sizeof w2, "%s, block from rank %d", what, q);
    check_pattern(w2, di, r + (size_t)q * count * di->size, count,
                  tabs + (size_t)q * stride * di->size, P, 0, 1);
  }
}

static void do_all_gather(run *R, const dinfo *di, size_t sc, int inplace) {
  char what[160];
  label(what, sizeof what, "all_gather", di, -1, sc, inplace, -1);
  uint64_t seed = ++R->call;
  size_t P = period_of(sc), esz = di->size, total = sc * (size_t)R->n;
  for (int q = 0; q < R->n; q++)
    build_copy_table(di, q, P, seed, R->tabs + (size_t)q * PERIOD * esz);
  const unsigned char *mine = R->tabs + (size_t)R->rank * PERIOD * esz;
  unsigned char *r = recvp(R);
  unsigned char *s = inplace ? r + (size_t)R->rank * sc * esz : sendp(R);
  memset(r, 0xcd, total * esz);
  fill_pattern(s, sc, esz, mine, P, 0);
  set_guards(r, total * esz);
  if (!call_ok(R, what,
               COLL_CALL(R, sc * esz, total * esz,
                         brg_all_gather(D(s), D(r), sc, di->dt, R->comm, R->stream),
                         brg_iall_gather(s, r, sc, di->dt, R->comm, &R->req))))
    return;
  check_blocks(what, di, r, sc, R->n, R->tabs, PERIOD, P);
  check_guards(what, r, total * esz);
  if (!inplace) check_pattern("all_gather changed its sendbuf", di, s, sc, mine, P, 0, 1);
}

static void do_broadcast(run *R, const dinfo *di, size_t count, int inplace, int root) {
  char what[160];
  label(what, sizeof what, "broadcast", di, -1, count, inplace, root);
  uint64_t seed = ++R->call;
  size_t P = period_of(count), esz = di->size, bytes = count * esz;
  build_copy_table(di, root, P, seed, R->own);
  unsigned char *s = sendp(R), *r = inplace ? s : recvp(R);
  if (R->rank == root) {
    fill_pattern(s, count, esz, R->own, P, 0);
  } else {
    memset(s, 0x3c, bytes); /* not the root's data: must not be sent */
  }
  if (!inplace) memset(r, 0xcd, bytes);
  if (inplace && R->rank != root) memset(r, 0xcd, bytes);
  set_guards(r, bytes);
  if (!call_ok(R, what,
               COLL_CALL(R, bytes, bytes,
                         brg_broadcast(D(s), D(r), count, di->dt, root, R->comm, R->stream),
                         brg_ibroadcast(s, r, count, di->dt, root, R->comm, &R->req))))
    return;
  check_pattern(what, di, r, count, R->own, P, 0, 1);
  check_guards(what, r, bytes);
  if (!inplace && R->rank == root)
    check_pattern("broadcast changed the root's sendbuf", di, s, count, R->own, P, 0, 1);
}

/* sendcount per rank; in place means the root's sendbuf = recvbuf + root *
 * sendcount. The other ranks pass recvbuf NULL. */
static void do_gather(run *R, const dinfo *di, size_t sc, int inplace, int root) {
  char what[160];
  label(what, sizeof what, R->nb ? "igather" : "gather", di, -1, sc, inplace, root);
  uint64_t seed = ++R->call;
  size_t P = period_of(sc), esz = di->size, total = sc * (size_t)R->n;
  for (int q = 0; q < R->n; q++)
    build_copy_table(di, q, P, seed, R->tabs + (size_t)q * PERIOD * esz);
  const unsigned char *mine = R->tabs + (size_t)R->rank * PERIOD * esz;
  int is_root = R->rank == root;
  unsigned char *r = is_root ? recvp(R) : NULL;
  unsigned char *s = inplace && is_root ? r + (size_t)R->rank * sc * esz : sendp(R);
  if (is_root) memset(r, 0xcd, total * esz);
  fill_pattern(s, sc, esz, mine, P, 0);
  if (is_root) set_guards(r, total * esz);
  if (!call_ok(R, what,
               COLL_CALL(R, sc * esz, total * esz,
                         brg_gather(D(s), D(r), sc, di->dt, root, R->comm, R->stream),
                         brg_igather(s, r, sc, di->dt, root, R->comm, &R->req))))
    return;
  if (!is_root) {
    check_pattern("gather changed its sendbuf", di, s, sc, mine, P, 0, 1);
    return;
  }
  check_blocks(what, di, r, sc, R->n, R->tabs, PERIOD, P);
  check_guards(what, r, total * esz);
  if (!inplace) check_pattern("gather changed the root's sendbuf", di, s, sc, mine, P, 0, 1);
}

/* recvcount per rank; in place means the root's recvbuf = sendbuf + root *
 * recvcount. The other ranks pass sendbuf NULL. */
static void do_scatter(run *R, const dinfo *di, size_t rc, int inplace, int root) {
  char what[160];
  label(what, sizeof what, R->nb ? "iscatter" : "scatter", di, -1, rc, inplace, root);
  uint64_t seed = ++R->call;
  size_t P = period_of(rc), esz = di->size, total = rc * (size_t)R->n;
  for (int q = 0; q < R->n; q++)
    build_copy_table(di, q, P, seed, R->tabs + (size_t)q * PERIOD * esz);
  const unsigned char *mine = R->tabs + (size_t)R->rank * PERIOD * esz;
  int is_root = R->rank == root;
  unsigned char *s = is_root ? sendp(R) : NULL;
  unsigned char *r = inplace && is_root ? s + (size_t)R->rank * rc * esz : recvp(R);
  if (is_root) {
    for (int q = 0; q < R->n; q++)
      fill_pattern(s + (size_t)q * rc * esz, rc, esz, R->tabs + (size_t)q * PERIOD * esz, P, 0);
    set_guards(s, total * esz);
  }
  if (!inplace || !is_root) {
    memset(r, 0xcd, rc * esz);
    set_guards(r, rc * esz);
  }
  if (!call_ok(R, what,
               COLL_CALL(R, total * esz, rc * esz,
                         brg_scatter(D(s), D(r), rc, di->dt, root, R->comm, R->stream),
                         brg_iscatter(s, r, rc, di->dt, root, R->comm, &R->req))))
    return;
  check_pattern(what, di, r, rc, mine, P, 0, 1);
  if (!inplace || !is_root) check_guards(what, r, rc * esz);
  if (is_root)
    for (int q = 0; q < R->n; q++)
      check_pattern("scatter changed the root's sendbuf", di, s + (size_t)q * rc * esz, rc,
                    R->tabs + (size_t)q * PERIOD * esz, P, 0, 1);
}

/* ------------------------------------------------------------- the plan */

static const size_t COUNTS[] = {0, 1, 7, 31, 4099, 65537, 262147, BIG};
#define NCOUNTS (sizeof COUNTS / sizeof COUNTS[0])

/* MP_MATRIX=pairs: every pair of factors instead of their full product.
 * Each count meets every dtype, each (count, dtype) both placements, and
 * each op meets every count, every dtype and both placements, in a fifth
 * of the calls (and half of them for the collectives without an op). The
 * runs that repeat the code paths of a full run with another transport
 * setting (slices, FIFO depth, more ranks, a sanitizer) take it. */
static int pairs_only = 0;

static int skip_op(size_t ci, int d, int op, int ip) {
  return pairs_only && op != (int)((ci + (size_t)d + (size_t)ip) % ARITH_OPS);
}

static int skip_place(size_t ci, int d, int ip) {
  return pairs_only && ip != (int)((ci + (size_t)d) % 2);
}

/* Roots to try: all of them for small N, first/last/middle otherwise. */
static int roots_for(int n, int *roots) {
  if (n <= 4) {
    for (int i = 0; i < n; i++) roots[i] = i;
    return n;
  }
  roots[0] = 0;
  roots[1] = n - 1;
  roots[2] = n / 2;
  return 3;
}

/* recvcount/sendcount per rank for reduce_scatter and all_gather: the big
 * case keeps the total near BIG. */
static size_t per_rank_count(size_t c, int n) {
  return c == BIG ? (BIG + (size_t)n - 1) / (size_t)n : c;
}

static void part_allreduce(run *R) {
  for (size_t ci = 0; ci < NCOUNTS; ci++) {
    for (int d = 0; d < BRG_NUM_DTYPES; d++)
      for (int op = 0; op < ARITH_OPS; op++)
        for (int ip = 0; ip < 2; ip++) {
          if (R->broken) return;
          if (skip_op(ci, d, op, ip)) continue;
          do_allreduce(R, &DTYPES[d], op, COUNTS[ci], ip);
        }
  }
}

static void part_reduce_scatter(run *R) {
  for (size_t ci = 0; ci < NCOUNTS; ci++) {
    if (COUNTS[ci] == 262147) continue; /* 65537 and BIG/N cover the mid and large range */
    size_t rc = per_rank_count(COUNTS[ci], R->n);
    for (int d = 0; d < BRG_NUM_DTYPES; d++)
      for (int op = 0; op < ARITH_OPS; op++)
        for (int ip = 0; ip < 2; ip++) {
          if (R->broken) return;
          if (skip_op(ci, d, op, ip)) continue;
          do_reduce_scatter(R, &DTYPES[d], op, rc, ip);
        }
  }
}

static void part_all_gather(run *R) {
  for (size_t ci = 0; ci < NCOUNTS; ci++) {
    if (COUNTS[ci] == 262147) continue;
    size_t sc = per_rank_count(COUNTS[ci], R->n);
    for (int d = 0; d < BRG_NUM_DTYPES; d++)
      for (int ip = 0; ip < 2; ip++) {
        if (R->broken) return;
        if (skip_place(ci, d, ip)) continue;
        do_all_gather(R, &DTYPES[d], sc, ip);
      }
  }
}

static void part_broadcast(run *R) {
  int roots[MP_MAX_RANKS], nr = roots_for(R->n, roots);
  for (size_t ci = 0; ci < NCOUNTS; ci++) {
    for (int d = 0; d < BRG_NUM_DTYPES; d++)
      for (int ip = 0; ip < 2; ip++) {
        if (skip_place(ci, d, ip)) continue;
        if (COUNTS[ci] == BIG) { /* one root per large call, rotating */
          if (R->broken) return;
          do_broadcast(R, &DTYPES[d], COUNTS[ci], ip, (d * 2 + ip + 1) % R->n);
          continue;
        }
        for (int k = 0; k < nr; k++) {
          if (R->broken) return;
          do_broadcast(R, &DTYPES[d], COUNTS[ci], ip, roots[k]);
        }
      }
  }
}

static void part_reduce(run *R) {
  int roots[MP_MAX_RANKS], nr = roots_for(R->n, roots);
  for (size_t ci = 0; ci < NCOUNTS; ci++) {
    for (int d = 0; d < BRG_NUM_DTYPES; d++)
      for (int op = 0; op < ARITH_OPS; op++)
        for (int ip = 0; ip < 2; ip++) {
          if (skip_op(ci, d, op, ip)) continue;
          if (COUNTS[ci] >= 262147) {
            if (R->broken) return;
            do_reduce(R, &DTYPES[d], op, COUNTS[ci], ip, (d * 10 + op * 2 + ip + 1) % R->n, 1);
            continue;
          }
          for (int k = 0; k < nr; k++) {
            if (R->broken) return;
            do_reduce(R, &DTYPES[d], op, COUNTS[ci], ip, roots[k], k == 0);
          }
        }
  }
}

static brg_status barrier_call(run *R) {
  return R->nb ? nb_finish(R, brg_ibarrier(R->comm, &R->req)) : brg_barrier(R->comm);
}

/* A barrier returns on no rank before the last rank has entered it. */
static void part_barrier(run *R) {
  mp_shared *sh = mp_shared_area();
  if (!call_ok(R, "barrier", barrier_call(R))) return;
  if (R->n == 1) return;
  for (int round = 0; round < 3 && !R->broken; round++) {
    int late = (round * 5 + 1) % R->n;
    if (R->rank == late) {
      mp_sleep_ms(200);
      __atomic_store_n(&sh->vals[0], mp_now_ns(), __ATOMIC_RELEASE);
    }
    if (!call_ok(R, "barrier", barrier_call(R))) return;
    int64_t out = mp_now_ns(), in = __atomic_load_n(&sh->vals[0], __ATOMIC_ACQUIRE);
    MP_CHECK(in != 0 && out >= in,
             "barrier round %d returned before rank %d entered it (%.1f ms early)", round, late,
             in ? (double)(in - out) / 1e6 : 200.0);
    if (!call_ok(R, "barrier", barrier_call(R))) return;
    if (R->rank == late) __atomic_store_n(&sh->vals[0], 0, __ATOMIC_RELEASE);
    if (!call_ok(R, "barrier", barrier_call(R))) return;
  }
}

/* One large allreduce sends 2(N-1)/N of the buffer from every rank. */
static void part_bytes(run *R) {
  const dinfo *di = &DTYPES[8]; /* float32 */
  uint64_t before = 0, after = 0;
  if (!call_ok(R, "brg_comm_bytes_sent", brg_comm_bytes_sent(R->comm, &before))) return;
  do_allreduce(R, di, 0, BIG, 0);
  if (R->broken) return;
  if (!call_ok(R, "brg_comm_bytes_sent", brg_comm_bytes_sent(R->comm, &after))) return;
  double S = (double)BIG * (double)di->size;
  double expect = 2.0 * (R->n - 1) / R->n * S;
  double tol = (double)R->n * (double)di->size + 1024.0 * 1024.0;
  double got = (double)(after - before);
  MP_CHECK(after >= before && fabs(got - expect) <= tol,
           "one allreduce of %.0f bytes sent %.0f bytes, expected 2(N-1)/N * S = %.0f (+-%.0f)", S,
           got, expect, tol);
}

/* Asynchronous allreduce: back-to-back requests, test/wait, ordering with
 * blocking calls, request reuse. */
typedef struct async_case {
  int d, op;
  size_t count;
  int inplace;
  unsigned char *s, *r, *own, *ref;
  size_t P;
} async_case;

static void async_prepare(run *R, async_case *a, uint64_t seed) {
  const dinfo *di = &DTYPES[a->d];
  a->P = period_of(a->count);
  for (size_t j = 0; j < a->P; j++) {
    gen_reduce_vals(di, a->op, R->n, seed, j, R->vals);
    encode(di, R->vals[R->rank], a->own + j * di->size);
    encode(di, ref_reduce(di, a->op, R->n, R->vals), a->ref + j * di->size);
  }
  fill_pattern(a->s, a->count, di->size, a->own, a->P, 0);
  if (!a->inplace) memset(a->r, 0xcd, a->count * di->size);
  set_guards(a->inplace ? a->s : a->r, a->count * di->size);
}

static void async_check(run *R, async_case *a, const char *tag) {
  (void)R;
  const dinfo *di = &DTYPES[a->d];
  char what[200];
  snprintf(what, sizeof what, "%s: iallreduce %s %s count=%zu %s", tag, di->name, OPS[a->op],
           a->count, a->inplace ? "in-place" : "out-of-place");
  unsigned char *out = a->inplace ? a->s : a->r;
  check_pattern(what, di, out, a->count, a->ref, a->P, 0, 0);
  check_guards(what, out, a->count * di->size);
}

static brg_status async_issue(run *R, async_case *a, brg_request *req) {
  return brg_iallreduce(a->s, a->inplace ? a->s : a->r, a->count, DTYPES[a->d].dt, OPV[a->op],
                        R->comm, req);
}

static void part_async(run *R) {
  mp_shared *sh = mp_shared_area();
  async_case cases[4] = {
      {.d = 8, .op = 0, .count = 262147, .inplace = 0}, /* float32 sum */
      {.d = 2, .op = 0, .count = 65537, .inplace = 1},  /* int32 sum, in place */
      {.d = 9, .op = 3, .count = 300007, .inplace = 0}, /* float64 max */
      {.d = 7, .op = 4, .count = 4099, .inplace = 0},   /* bfloat16 avg */
  };
  for (int k = 0; k < 4; k++) {
    size_t bytes = cases[k].count * 8 + 2 * GUARD;
    cases[k].s = (unsigned char *)xmalloc(bytes) + GUARD;
    cases[k].r = (unsigned char *)xmalloc(bytes) + GUARD;
    cases[k].own = xmalloc(PERIOD * 8);
    cases[k].ref = xmalloc(PERIOD * 8);
  }
  brg_request req[4];

  /* 1. Four requests back to back, waited on out of order. */
  for (int k = 0; k < 4; k++) async_prepare(R, &cases[k], ++R->call);
  for (int k = 0; k < 4; k++) {
    memset(&req[k], 0xee, sizeof req[k]);
    if (!call_ok(R, "brg_iallreduce", async_issue(R, &cases[k], &req[k]))) goto out;
  }
  static const int order[4] = {2, 0, 3, 1};
  for (int k = 0; k < 4; k++)
    if (!call_ok(R, "brg_wait", brg_wait(&req[order[k]]))) goto out;
  for (int k = 0; k < 4; k++) async_check(R, &cases[k], "back-to-back");

  /* 2. brg_test: in progress while the peers have not joined yet. */
  async_prepare(R, &cases[0], ++R->call);
  if (R->rank == 0) {
    if (!call_ok(R, "brg_iallreduce", async_issue(R, &cases[0], &req[0]))) goto out;
    int done = -1;
    brg_status st = brg_test(&req[0], &done);
    if (R->n > 1)
      MP_CHECK(st == BRG_IN_PROGRESS && done == 0,
               "brg_test before the peers joined: %s, done=%d (expected BRG_IN_PROGRESS, 0)",
               brg_status_string(st), done);
    __atomic_store_n(&sh->flags[1], 1, __ATOMIC_RELEASE);
    int64_t end = mp_now_ns() + 60 * 1000000000LL;
    for (;;) {
      done = -1;
      st = brg_test(&req[0], &done);
      if (done == 1) break;
      if (done != 0 || st != BRG_IN_PROGRESS) {
        mp_fail("brg_test while running: %s, done=%d", brg_status_string(st), done);
        R->broken = 1;
        goto out;
      }
      if (mp_now_ns() > end) {
        mp_fail("brg_test never reported completion within 60 s");
        R->broken = 1;
        goto out;
      }
      usleep(100);
    }
    if (!call_ok(R, "brg_test (final status)", st)) goto out;
  } else {
    if (!mp_wait_flag(1, 60000)) {
      mp_fail("rank 0 never got past its first brg_test");
      R->broken = 1;
      goto out;
    }
    if (!call_ok(R, "brg_iallreduce", async_issue(R, &cases[0], &req[0]))) goto out;
    if (!call_ok(R, "brg_wait", brg_wait(&req[0]))) goto out;
  }
  async_check(R, &cases[0], "test/wait");

  /* 3. Collectives run in issue order, blocking calls included: once a
   * blocking allreduce returns, the iallreduce issued before it is done. */
  async_prepare(R, &cases[2], ++R->call);
  async_prepare(R, &cases[3], ++R->call);
  if (!call_ok(R, "brg_iallreduce", async_issue(R, &cases[2], &req[2]))) goto out;
  {
    async_case *b = &cases[3];
    brg_status st = brg_allreduce(b->s, b->r, b->count, DTYPES[b->d].dt, OPV[b->op], R->comm, NULL);
    if (!call_ok(R, "brg_allreduce after brg_iallreduce", st)) goto out;
    int done = -1;
    st = brg_test(&req[2], &done);
    MP_CHECK(done == 1 && st == BRG_SUCCESS,
             "a blocking allreduce returned before the iallreduce issued earlier had finished "
             "(brg_test: %s, done=%d)",
             brg_status_string(st), done);
    if (done != 1 && !call_ok(R, "brg_wait", brg_wait(&req[2]))) goto out;
    async_check(R, &cases[3], "blocking after async");
    async_check(R, &cases[2], "async before blocking");
  }

  /* 4. A finished request can be reused. */
  async_prepare(R, &cases[1], ++R->call);
  if (!call_ok(R, "brg_iallreduce (reused request)", async_issue(R, &cases[1], &req[0]))) goto out;
  if (!call_ok(R, "brg_wait (reused request)", brg_wait(&req[0]))) goto out;
  async_check(R, &cases[1], "reused request");
  {
    int done = -1;
    brg_status st = brg_test(&req[0], &done);
    MP_CHECK(done == 1 && st == BRG_SUCCESS, "brg_test after brg_wait: %s, done=%d",
             brg_status_string(st), done);
  }
out:
  for (int k = 0; k < 4; k++) {
    free(cases[k].s - GUARD);
    free(cases[k].r - GUARD);
    free(cases[k].own);
    free(cases[k].ref);
  }
}

/* The non-blocking forms through the same element-by-element checks as the
 * blocking ones: every dtype, op, count, root, in and out of place. */
static void with_nb(run *R, void (*fn)(run *)) {
  R->nb = 1;
  fn(R);
  R->nb = 0;
}
static void part_ibarrier(run *R) {
  with_nb(R, part_barrier);
}
static void part_iallreduce(run *R) {
  with_nb(R, part_allreduce);
}
static void part_ireduce_scatter(run *R) {
  with_nb(R, part_reduce_scatter);
}
static void part_iall_gather(run *R) {
  with_nb(R, part_all_gather);
}
static void part_ibroadcast(run *R) {
  with_nb(R, part_broadcast);
}
static void part_ireduce(run *R) {
  with_nb(R, part_reduce);
}

/* Every kind of non-blocking collective outstanding at once, each on its
 * own buffers, completed in an order that changes every round (some by
 * polling brg_test, some by brg_wait), then every element checked. */
enum {
  IK_ALLREDUCE,
  IK_REDUCE_SCATTER,
  IK_ALL_GATHER,
  IK_BROADCAST,
  IK_REDUCE,
  IK_BARRIER,
  IK_NUM
};
static const char *const IK_NAMES[IK_NUM] = {"iallreduce", "ireduce_scatter", "iall_gather",
                                             "ibroadcast", "ireduce",         "ibarrier"};

typedef struct icase {
  int kind, d, op, root, inplace;
  size_t count; /* per rank for reduce_scatter and all_gather */
  size_t P;
  unsigned char *s, *r, *own, *ref, *tabs, *out;
  brg_request req;
} icase;

static void icase_prepare(run *R, icase *c, uint64_t seed) {
  const dinfo *di = &DTYPES[c->d];
  size_t esz = di->size, n = (size_t)R->n, cnt = c->count;
  switch (c->kind) {
  case IK_ALLREDUCE:
  case IK_REDUCE:
  case IK_REDUCE_SCATTER: {
    size_t total = c->kind == IK_REDUCE_SCATTER ? cnt * n : cnt;
    c->P = period_of(total);
    for (size_t j = 0; j < c->P; j++) {
      gen_reduce_vals(di, c->op, R->n, seed, j, R->vals);
      encode(di, R->vals[R->rank], c->own + j * esz);
      encode(di, ref_reduce(di, c->op, R->n, R->vals), c->ref + j * esz);
    }
    fill_pattern(c->s, total, esz, c->own, c->P, 0);
    if (c->kind == IK_REDUCE_SCATTER) {
      c->out = c->inplace ? c->s + (size_t)R->rank * cnt * esz : c->r;
      if (c->inplace)
        set_guards(c->s, total * esz);
      else {
        memset(c->r, 0xcd, cnt * esz);
        set_guards(c->r, cnt * esz);
      }
    } else {
      c->out = c->inplace ? c->s : c->r;
      if (!c->inplace) memset(c->r, 0xcd, cnt * esz);
      set_guards(c->out, cnt * esz);
    }
    break;
  }
  case IK_ALL_GATHER:
    c->P = period_of(cnt);
    for (int q = 0; q < R->n; q++) build_copy_table(di, q, c->P, seed, c->tabs + q * c->P * esz);
    c->out = c->r;
    memset(c->r, 0xcd, cnt * n * esz);
    if (c->inplace) c->s = c->r + (size_t)R->rank * cnt * esz;
    fill_pattern(c->s, cnt, esz, c->tabs + (size_t)R->rank * c->P * esz, c->P, 0);
    set_guards(c->r, cnt * n * esz);
    break;
  case IK_BROADCAST:
    c->P = period_of(cnt);
    build_copy_table(di, c->root, c->P, seed, c->own);
    if (R->rank == c->root)
      fill_pattern(c->s, cnt, esz, c->own, c->P, 0);
    else
      memset(c->s, 0x3c, cnt * esz);
    c->out = c->inplace ? c->s : c->r;
    if (!c->inplace || R->rank != c->root) memset(c->out, 0xcd, cnt * esz);
    set_guards(c->out, cnt * esz);
    break;
  default: break;
  }
}

static brg_status icase_issue(run *R, icase *c) {
  brg_dtype dt = DTYPES[c->d].dt;
  brg_op op = OPV[c->op];
  switch (c->kind) {
  case IK_ALLREDUCE: return brg_iallreduce(c->s, c->out, c->count, dt, op, R->comm, &c->req);
  case IK_REDUCE_SCATTER:
    return brg_ireduce_scatter(c->s, c->out, c->count, dt, op, R->comm, &c->req);
  case IK_ALL_GATHER: return brg_iall_gather(c->s, c->r, c->count, dt, R->comm, &c->req);
  case IK_BROADCAST: return brg_ibroadcast(c->s, c->out, c->count, dt, c->root, R->comm, &c->req);
  case IK_REDUCE: return brg_ireduce(c->s, c->out, c->count, dt, op, c->root, R->comm, &c->req);
  default: return brg_ibarrier(R->comm, &c->req);
  }
}

static void icase_check(run *R, icase *c, int round) {
  const dinfo *di = &DTYPES[c->d];
  size_t esz = di->size, cnt = c->count, n = (size_t)R->n;
  char what[200];
  snprintf(what, sizeof what, "outstanding round %d: %s %s %s count=%zu %s root=%d", round,
           IK_NAMES[c->kind], di->name, OPS[c->op], cnt, c->inplace ? "in-place" : "out-of-place",
           c->root);
  switch (c->kind) {
  case IK_ALLREDUCE:
  case IK_REDUCE:
    if (c->kind == IK_ALLREDUCE || R->rank == c->root)
      check_pattern(what, di, c->out, cnt, c->ref, c->P, 0, 0);
    check_guards(what, c->out, cnt * esz);
    break;
  case IK_REDUCE_SCATTER:
    check_pattern(what, di, c->out, cnt, c->ref, c->P, (size_t)R->rank * cnt, 0);
    check_guards(what, c->inplace ? c->s : c->r, (c->inplace ? cnt * n : cnt) * esz);
    break;
  case IK_ALL_GATHER:
    check_blocks(what, di, c->r, cnt, R->n, c->tabs, c->P, c->P);
    check_guards(what, c->r, cnt * n * esz);
    break;
  case IK_BROADCAST:
    check_pattern(what, di, c->out, cnt, c->own, c->P, 0, 1);
    check_guards(what, c->out, cnt * esz);
    break;
  default: break;
  }
}

static void part_imulti(run *R) {
  /* Two of each kind in flight per round. */
  enum { PER = 2 * IK_NUM, ROUNDS = BRG_NUM_DTYPES };
  static const size_t counts[] = {0, 1, 13, 4099, 65537, 262147};
  icase cs[PER];
  size_t maxc = 262147 + 64, n = (size_t)R->n;
  for (int k = 0; k < PER; k++) {
    memset(&cs[k], 0, sizeof cs[k]);
    size_t area = maxc * n * 8 + 2 * GUARD;
    cs[k].s = (unsigned char *)xmalloc(area) + GUARD;
    cs[k].r = (unsigned char *)xmalloc(area) + GUARD;
    cs[k].own = xmalloc(PERIOD * 8);
    cs[k].ref = xmalloc(PERIOD * 8);
    cs[k].tabs = xmalloc(n * PERIOD * 8);
  }
  unsigned char *sbase[PER];
  for (int k = 0; k < PER; k++) sbase[k] = cs[k].s;
  for (int round = 0; round < ROUNDS && !R->broken; round++) {
    for (int k = 0; k < PER; k++) {
      icase *c = &cs[k];
      c->s = sbase[k];
      c->kind = k % IK_NUM;
      c->d = (round + k) % BRG_NUM_DTYPES;
      c->op = (round + k / IK_NUM + c->kind) % ARITH_OPS;
      c->inplace = (round + k) & 1;
      c->root = (round + k) % R->n;
      c->count = counts[(size_t)(round * 5 + k) % (sizeof counts / sizeof counts[0])];
      if (c->kind == IK_REDUCE_SCATTER || c->kind == IK_ALL_GATHER)
        c->count = c->count / n + (c->count > 0); /* per rank, total near count */
      icase_prepare(R, c, ++R->call);
    }
    int issued = 0;
    for (; issued < PER; issued++) {
      memset(&cs[issued].req, 0xee, sizeof cs[issued].req); /* garbage: must not matter */
      brg_status st = icase_issue(R, &cs[issued]);
      if (!call_ok(R, IK_NAMES[cs[issued].kind], st)) break;
    }
    /* Completion order: a rotation of the reverse, different every round. */
    for (int j = 0; j < issued; j++) {
      int k = (issued - 1 - j + round) % issued;
      icase *c = &cs[k];
      brg_status st;
      if ((j + round) % 3 == 0) {
        int done = 0;
        int64_t end = mp_now_ns() + 120 * 1000000000LL;
        do {
          st = brg_test(&c->req, &done);
          if (!done && st != BRG_IN_PROGRESS) {
            mp_fail("brg_test on a running %s: %s", IK_NAMES[c->kind], brg_status_string(st));
            break;
          }
          if (!done) usleep(50);
        } while (!done && mp_now_ns() < end);
        if (!done) {
          mp_fail("round %d: %s never completed by brg_test", round, IK_NAMES[c->kind]);
          st = brg_wait(&c->req);
        }
      } else {
        st = brg_wait(&c->req);
      }
      if (!call_ok(R, IK_NAMES[c->kind], st)) continue;
      int done = -1;
      st = brg_test(&c->req, &done);
      MP_CHECK(done == 1 && st == BRG_SUCCESS, "brg_test after completion of %s: %s, done=%d",
               IK_NAMES[c->kind], brg_status_string(st), done);
    }
    if (R->broken) break;
    for (int k = 0; k < PER; k++) icase_check(R, &cs[k], round);
  }
  for (int k = 0; k < PER; k++) {
    free(sbase[k] - GUARD);
    free(cs[k].r - GUARD);
    free(cs[k].own);
    free(cs[k].ref);
    free(cs[k].tabs);
  }
}

/* Communicators come and go: build one, use it, destroy it, again and
 * again. A rank that finishes its last call and destroys its communicator
 * must not break the call its neighbours are still finishing. Rank 0 makes
 * each id and passes it on through the shared area. */
static void part_lifecycle(run *R) {
  mp_shared *sh = mp_shared_area();
  enum { ROUNDS = 12, ID_SLOT = 2 * MP_MAX_RANKS };
  for (int g = 1; g <= ROUNDS && !R->broken; g++) {
    brg_unique_id id;
    if (R->rank == 0) {
      if (!call_ok(R, "brg_get_unique_id", brg_get_unique_id(&id))) return;
      memcpy(&sh->vals[ID_SLOT], &id, sizeof id);
      __atomic_store_n(&sh->flags[2], g, __ATOMIC_RELEASE);
    } else {
      int64_t end = mp_now_ns() + 60 * 1000000000LL;
      while (__atomic_load_n(&sh->flags[2], __ATOMIC_ACQUIRE) != g) {
        if (mp_now_ns() > end) {
          mp_fail("lifecycle round %d: rank 0 published no id", g);
          R->broken = 1;
          return;
        }
        usleep(200);
      }
      memcpy(&id, &sh->vals[ID_SLOT], sizeof id);
    }
    brg_comm *c = NULL;
    brg_status st = brg_comm_init(&c, R->n, &id, R->rank);
    if (st != BRG_SUCCESS) {
      mp_fail("lifecycle round %d: brg_comm_init: %s: %s", g, brg_status_string(st),
              brg_comm_last_error(NULL));
      R->broken = 1;
      return;
    }
    /* Alternate the last call before destroy: allreduce, barrier, broadcast. */
    int32_t v[257], want = 0;
    for (int q = 0; q < R->n; q++) want += (q + 1) * g;
    for (int i = 0; i < 257; i++) v[i] = (R->rank + 1) * g;
    const char *what = g % 3 == 0 ? "barrier" : g % 3 == 1 ? "allreduce" : "broadcast";
    if (g % 3 == 0)
      st = brg_barrier(c);
    else if (g % 3 == 1)
      st = brg_allreduce(v, v, 257, BRG_INT32, BRG_SUM, c, NULL);
    else
      st = brg_broadcast(v, v, 257, BRG_INT32, (g / 3) % R->n, c, NULL);
    if (st != BRG_SUCCESS) {
      mp_fail("lifecycle round %d: %s (the last call before destroy): %s: %s", g, what,
              brg_status_string(st), brg_comm_last_error(c));
      R->broken = 1;
    } else if (g % 3 == 1) {
      for (int i = 0; i < 257; i++)
        if (v[i] != want) {
          mp_fail("lifecycle round %d: allreduce element %d is %d, expected %d", g, i, v[i], want);
          break;
        }
    } else if (g % 3 == 2) {
      int32_t bw = ((g / 3) % R->n + 1) * g;
      for (int i = 0; i < 257; i++)
        if (v[i] != bw) {
          mp_fail("lifecycle round %d: broadcast element %d is %d, expected %d", g, i, v[i], bw);
          break;
        }
    }
    st = brg_comm_destroy(c);
    if (st != BRG_SUCCESS) {
      mp_fail("lifecycle round %d: brg_comm_destroy: %s", g, brg_status_string(st));
      R->broken = 1;
    }
  }
}

/* gather and scatter: every dtype, both placements, every root (first,
 * last and middle from N = 5), counts to past the early-message cap. */
static const size_t ROOTED_COUNTS[] = {0, 1, 7, 4099, 65537};

static void part_rooted(run *R, int gather) {
  int roots[MP_MAX_RANKS], nr = roots_for(R->n, roots);
  for (size_t ci = 0; ci < sizeof ROOTED_COUNTS / sizeof *ROOTED_COUNTS; ci++)
    for (int d = 0; d < BRG_NUM_DTYPES; d++)
      for (int ip = 0; ip < 2; ip++)
        for (int k = 0; k < nr; k++) {
          if (R->broken) return;
          if (skip_place(ci, d, ip)) continue;
          if (gather)
            do_gather(R, &DTYPES[d], ROOTED_COUNTS[ci], ip, roots[k]);
          else
            do_scatter(R, &DTYPES[d], ROOTED_COUNTS[ci], ip, roots[k]);
        }
}
static void part_gather(run *R) {
  part_rooted(R, 1);
}
static void part_scatter(run *R) {
  part_rooted(R, 0);
}

/* The bitwise ops: every integer dtype with allreduce, reduce_scatter and
 * reduce; floating-point dtypes are refused with a message that names the
 * op and the dtype, before anything is sent. */
static void part_bitwise(run *R) {
  static const size_t counts[] = {1, 7, 4099, 65537};
  for (size_t ci = 0; ci < sizeof counts / sizeof *counts; ci++)
    for (int d = 0; d < BRG_NUM_DTYPES; d++)
      for (int op = ARITH_OPS; op < BRG_NUM_OPS; op++)
        for (int ip = 0; ip < 2; ip++) {
          if (R->broken) return;
          if (DTYPES[d].is_float) {
            if (ci > 0 || ip > 0) continue;
            float x[4] = {0};
            brg_status st = brg_allreduce(x, x, 4, DTYPES[d].dt, OPV[op], R->comm, NULL);
            const char *msg = brg_comm_last_error(R->comm);
            char want[64];
            snprintf(want, sizeof want, "op %s takes integer dtypes only, not %s", OPS[op],
                     DTYPES[d].name);
            if (st != BRG_ERR_INVALID_ARGUMENT || !strstr(msg, want))
              mp_fail("allreduce %s %s: %s, \"%s\"; expected BRG_ERR_INVALID_ARGUMENT, \"%s\"",
                      DTYPES[d].name, OPS[op], brg_status_string(st), msg, want);
            continue;
          }
          do_allreduce(R, &DTYPES[d], op, counts[ci], ip);
          do_reduce_scatter(R, &DTYPES[d], op, counts[ci], ip);
          do_reduce(R, &DTYPES[d], op, counts[ci], ip, (int)(ci + (size_t)d) % R->n, 1);
        }
}
static void part_igather(run *R) {
  with_nb(R, part_gather);
}
static void part_iscatter(run *R) {
  with_nb(R, part_scatter);
}

/* ------------------------------------------------------------------ main */

typedef struct part {
  const char *name;
  void (*fn)(run *R);
} part;

static const part PARTS[] = {
    {"barrier", part_barrier},
    {"allreduce", part_allreduce},
    {"reduce_scatter", part_reduce_scatter},
    {"all_gather", part_all_gather},
    {"broadcast", part_broadcast},
    {"reduce", part_reduce},
    {"bytes", part_bytes},
    {"async", part_async},
    {"lifecycle", part_lifecycle},
    {"ibarrier", part_ibarrier},
    {"iallreduce", part_iallreduce},
    {"ireduce_scatter", part_ireduce_scatter},
    {"iall_gather", part_iall_gather},
    {"ibroadcast", part_ibroadcast},
    {"ireduce", part_ireduce},
    {"imulti", part_imulti},
    /* Named only, as the i* parts. */
    {"gather", part_gather},
    {"scatter", part_scatter},
    {"igather", part_igather},
    {"iscatter", part_iscatter},
    {"bitwise", part_bitwise},
};
#define NPARTS (sizeof PARTS / sizeof PARTS[0])

typedef struct plan {
  int want[NPARTS];
} plan;

static int body(mp_ctx *ctx) {
  const plan *pl = ctx->arg;
  run R = {.rank = ctx->rank, .n = ctx->nranks, .comm = ctx->comm};
  size_t region = MAX_ELEMS * 8 + 2 * GUARD;
  R.sbase = xmalloc(region);
  R.rbase = xmalloc(region);
  R.region = region;
  if (getenv("MP_DEVICE") && atoi(getenv("MP_DEVICE"))) {
    char why[256] = "";
    int e = 0;
    R.dapi = device_api(why, sizeof why);
    if (!R.dapi) {
      mp_fail("no GPU in the rank although the parent found one: %s", why);
      return 1;
    }
    /* One GPU per rank where there are several (all ranks of a run are on
     * one host): rank modulo the GPUs, as LOCAL_RANK would give. */
    int ngpu = R.dapi->drv.probe(NULL, 0);
    if (ngpu > 1 && (e = R.dapi->drv.set_device(ctx->rank % ngpu)) != 0) {
      mp_fail("cudaSetDevice(%d): %s", ctx->rank % ngpu, R.dapi->drv.error_string(e));
      return 1;
    }
    if ((e = R.dapi->drv.mem_alloc((void **)&R.dsbase, region)) != 0 ||
        (e = R.dapi->drv.mem_alloc((void **)&R.drbase, region)) != 0 ||
        (e = R.dapi->drv.stream_create(&R.stream)) != 0) {
      mp_fail("device buffers: %s", R.dapi->drv.error_string(e));
      return 1;
    }
  }
  R.own = xmalloc(PERIOD * 8);
  R.ref = xmalloc(PERIOD * 8);
  R.tabs = xmalloc((size_t)R.n * PERIOD * 8);
  R.vals = calloc(MP_MAX_RANKS, sizeof(num));
  for (size_t p = 0; p < NPARTS && !R.broken; p++) {
    if (!pl->want[p]) continue;
    int64_t t = mp_now_ns();
    int before = mp_failures();
    PARTS[p].fn(&R);
    if (R.rank == 0)
      mp_info("%-15s %s (%.2f s)", PARTS[p].name, mp_failures() == before ? "ok" : "FAILED",
              (double)(mp_now_ns() - t) / 1e9);
  }
  if (!R.broken) call_ok(&R, "final barrier", brg_barrier(R.comm));
  if (R.dapi) {
    R.dapi->drv.stream_destroy(R.stream);
    R.dapi->drv.mem_free(R.dsbase);
    R.dapi->drv.mem_free(R.drbase);
  }
  free(R.sbase);
  free(R.rbase);
  free(R.own);
  free(R.ref);
  free(R.tabs);
  free(R.vals);
  return 0;
}

static int self_test(void) {
  /* The reference conversions, against values whose encodings are known. */
  struct {
    double v;
    uint16_t h, b;
  } k[] = {{1.0, 0x3c00, 0x3f80},
           {-2.0, 0xc000, 0xc000},
           {0.25, 0x3400, 0x3e80},
           {65504.0, 0x7bff, 0x4780},
           {0.0, 0, 0},
           {5.9604644775390625e-08, 0x0001, 0x3380}};
  int bad = 0;
  for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
    if (to_f16(k[i].v) != k[i].h || from_f16(k[i].h) != k[i].v) bad = 1;
    if (to_bf16(k[i].v) != k[i].b) bad = 1;
  }
  for (int d = 0; d < BRG_NUM_DTYPES; d++) {
    const char *nm = brg_dtype_name(DTYPES[d].dt);
    if (brg_dtype_size(DTYPES[d].dt) != DTYPES[d].size || !nm || strcmp(nm, DTYPES[d].name) != 0) {
      fprintf(stderr, "dtype %d: brg_dtype_size %zu / brg_dtype_name %s, expected %zu / %s\n", d,
              brg_dtype_size(DTYPES[d].dt), nm ? nm : "NULL", DTYPES[d].size, DTYPES[d].name);
      bad = 1;
    }
  }
  for (int op = 0; op < BRG_NUM_OPS; op++) {
    const char *nm = brg_op_name(OPV[op]);
    if (!nm || strcmp(nm, OPS[op]) != 0) {
      fprintf(stderr, "op %d: brg_op_name %s, expected %s\n", op, nm ? nm : "NULL", OPS[op]);
      bad = 1;
    }
  }
  if (bad) fprintf(stderr, "self test failed\n");
  return bad;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s N [part...]\n", argv[0]);
    return 2;
  }
  int n = atoi(argv[1]);
  plan pl;
  /* Every part before "gather" but the i* ones. */
  int unnamed = 1;
  for (size_t p = 0; p < NPARTS; p++) {
    unnamed &= strcmp(PARTS[p].name, "gather") != 0;
    pl.want[p] = argc == 2 && unnamed && PARTS[p].name[0] != 'i';
  }
  for (int a = 2; a < argc; a++) {
    size_t p = 0;
    while (p < NPARTS && strcmp(argv[a], PARTS[p].name) != 0) p++;
    if (p == NPARTS) {
      fprintf(stderr, "unknown part %s\n", argv[a]);
      return 2;
    }
    pl.want[p] = 1;
  }
  if (self_test()) return 1;
  const char *matrix = getenv("MP_MATRIX");
  if (matrix && strcmp(matrix, "pairs") == 0) {
    pairs_only = 1;
  } else if (matrix && *matrix && strcmp(matrix, "full") != 0) {
    fprintf(stderr, "MP_MATRIX=%s: expected full or pairs\n", matrix);
    return 2;
  }
  int device = getenv("MP_DEVICE") && atoi(getenv("MP_DEVICE"));
  if (device) {
    /* The collectives that take GPU buffers (gather and scatter, staged
     * through host memory, only when named). */
    static const char *const dev_parts[] = {
        "allreduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "gather", "scatter"};
    for (size_t p = 0; p < NPARTS; p++) {
      int ok = 0;
      for (size_t q = 0; q < sizeof dev_parts / sizeof *dev_parts; q++)
        ok |= strcmp(PARTS[p].name, dev_parts[q]) == 0;
      if (!ok) pl.want[p] = 0;
    }
    /* Look for a GPU in a child: CUDA must not start in the parent, whose
     * ranks are forked later. */
    pid_t pid = fork();
    if (pid == 0) {
      char why[256] = "";
      if (device_api(why, sizeof why)) _exit(0);
      printf("no GPU for the device collectives: %s\n", why);
      _exit(getenv("BRIGADE_TEST_NO_SKIP") ? 1 : 77);
    }
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st)) return 1;
    if (WEXITSTATUS(st) != 0) return WEXITSTATUS(st);
  }
  char name[64];
  snprintf(name, sizeof name, "collectives N=%d %s%s%s", n, mp_transport(), device ? " device" : "",
           pairs_only ? " (pairs)" : "");
  const char *tr = getenv("BRIGADE_TRANSPORTS");
  mp_opts o = {
      .name = name,
      .nranks = n,
      .deadline_ms = mp_env_int("MP_DEADLINE_MS", 600000),
      .init = MP_INIT_ID,
      .expect_shm = n > 1 && tr && strcmp(tr, "shm") == 0,
      .expect_no_shm = tr && strcmp(tr, "tcp") == 0,
  };
  return mp_run(&o, body, &pl) ? 1 : 0;
}
