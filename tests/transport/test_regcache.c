/*
 * The registration cache of the ibverbs transport (transport/regcache.c):
 *   - against a fake verbs table that records every registration, so each
 *     test knows exactly which page-aligned ranges were registered and
 *     deregistered: rounding, hits inside a registration, adjacent and
 *     overlapping ranges, reference counts, LRU eviction of idle entries
 *     only, invalidation, a full backend, destroy, bad arguments, threads;
 *   - against the software backend: a remote write lands through the rkey of
 *     a cached registration, at an address the caller never asked for but
 *     that lies in the registered pages.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "regcache.h"
#include "transport.h"
#include "verbs_api.h"

/* ---- a fake backend --------------------------------------------------------- */

#define FAKE_REGS 65536 /* registrations a test may make in all */

typedef struct fake_reg {
  uintptr_t addr;
  size_t len;
  int live;
} fake_reg;

static struct {
  pthread_mutex_t lock;
  fake_reg regs[FAKE_REGS];
  int nregs;      /* registrations ever made (index + 1 is the key) */
  int live;       /* registered now */
  int deregs;     /* deregistrations */
  int live_limit; /* > 0: mr_reg fails with NO_MEMORY beyond this many live */
} fake = {.lock = PTHREAD_MUTEX_INITIALIZER};

static brg_status fake_mr_reg(brg__vb_ctx *ctx, void *addr, size_t len, brg__vb_mr *out,
                              brg__errbuf *err) {
  (void)ctx;
  pthread_mutex_lock(&fake.lock);
  if ((fake.live_limit > 0 && fake.live >= fake.live_limit) ||
      fake.nregs == (int)(sizeof fake.regs / sizeof fake.regs[0])) {
    pthread_mutex_unlock(&fake.lock);
    return brg__error(err, BRG_ERR_NO_MEMORY, "ib", "fake verbs: out of registrations");
  }
  int k = fake.nregs++;
  fake.regs[k] = (fake_reg){(uintptr_t)addr, len, 1};
  fake.live++;
  pthread_mutex_unlock(&fake.lock);
  *out = (brg__vb_mr){.addr = addr, .len = len, .lkey = (uint32_t)k + 1, .rkey = (uint32_t)k + 1};
  return BRG_SUCCESS;
}

static void fake_mr_dereg(brg__vb_ctx *ctx, brg__vb_mr *mr) {
  (void)ctx;
  pthread_mutex_lock(&fake.lock);
  fake_reg *r = &fake.regs[mr->lkey - 1];
  assert_true(r->live); /* never twice */
  assert_int_equal(r->addr, (uintptr_t)mr->addr);
  r->live = 0;
  fake.live--;
  fake.deregs++;
  pthread_mutex_unlock(&fake.lock);
  memset(mr, 0, sizeof *mr);
}

static const brg__vb_ops fake_ops = {
    .name = "fake",
    .mr_reg = fake_mr_reg,
    .mr_dereg = fake_mr_dereg,
};

static long page;
static char *mem; /* 64 pages, page-aligned: the fake never touches them */
static char fake_ctx_storage[64];
#define FAKE_CTX ((brg__vb_ctx *)(void *)fake_ctx_storage)

static int setup(void **state) {
  (void)state;
  memset(fake.regs, 0, sizeof fake.regs);
  fake.nregs = fake.live = fake.deregs = fake.live_limit = 0;
  return 0;
}

static brg__regcache *cache_new(size_t max_idle, size_t max_idle_bytes) {
  brg__regcache *rc = NULL;
  brg__errbuf err;
  assert_int_equal(brg__regcache_create(&rc, &fake_ops, FAKE_CTX, max_idle, max_idle_bytes, &err),
                   BRG_SUCCESS);
  assert_non_null(rc);
  return rc;
}

static const brg__vb_mr *get_ok(brg__regcache *rc, const void *addr, size_t len) {
  const brg__vb_mr *mr = NULL;
  brg__errbuf err;
  assert_int_equal(brg__regcache_get(rc, addr, len, &mr, &err), BRG_SUCCESS);
  assert_non_null(mr);
  /* Whatever it returns covers what was asked, in whole pages. */
  assert_true((uintptr_t)mr->addr <= (uintptr_t)addr);
  assert_true((uintptr_t)mr->addr + mr->len >= (uintptr_t)addr + len);
  assert_int_equal((uintptr_t)mr->addr % (uintptr_t)page, 0);
  assert_int_equal(mr->len % (size_t)page, 0);
  return mr;
}

static brg__regcache_stats stats(brg__regcache *rc) {
  brg__regcache_stats st;
  brg__regcache_stats_get(rc, &st);
  return st;
}

static char *pg(int i) {
  return mem + (size_t)i * (size_t)page;
}

/* ---- the cases -------------------------------------------------------------- */

static void bad_arguments(void **state) {
  (void)state;
  brg__regcache *rc = cache_new(0, 0);
  const brg__vb_mr *mr = (const brg__vb_mr *)(uintptr_t)0x1; /* must stay untouched */
  brg__errbuf err = {0};
  assert_int_equal(brg__regcache_get(rc, NULL, 100, &mr, &err), BRG_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(err.msg, "NULL address"));
  assert_int_equal(brg__regcache_get(rc, pg(0), 0, &mr, &err), BRG_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(err.msg, "empty range"));
  assert_int_equal(brg__regcache_get(rc, (void *)(UINTPTR_MAX - 10), 100, &mr, &err),
                   BRG_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(err.msg, "wraps"));
  assert_ptr_equal(mr, (const brg__vb_mr *)(uintptr_t)0x1);
  assert_int_equal(fake.nregs, 0);
  brg__regcache *none = NULL;
  assert_int_equal(brg__regcache_create(&none, &fake_ops, NULL, 0, 0, &err),
                   BRG_ERR_INVALID_ARGUMENT);
  assert_null(none);
  brg__regcache_put(rc, NULL); /* no-ops */
  brg__regcache_put(NULL, NULL);
  brg__regcache_invalidate(rc, NULL, 10);
  brg__regcache_destroy(NULL);
  brg__regcache_destroy(rc);
}

static void rounds_to_pages(void **state) {
  (void)state;
  brg__regcache *rc = cache_new(0, 0);
  /* 10 bytes inside page 3: exactly page 3 */
  const brg__vb_mr *a = get_ok(rc, pg(3) + 100, 10);
  assert_ptr_equal(a->addr, pg(3));
  assert_int_equal(a->len, page);
  assert_int_equal(fake.regs[0].addr, (uintptr_t)pg(3));
  assert_int_equal(fake.regs[0].len, page);
  /* 10 bytes straddling pages 5 and 6: both */
  const brg__vb_mr *b = get_ok(rc, pg(6) - 4, 10);
  assert_ptr_equal(b->addr, pg(5));
  assert_int_equal(b->len, 2 * page);
  /* a page-aligned whole page: that page, not one more */
  const brg__vb_mr *c = get_ok(rc, pg(8), (size_t)page);
  assert_ptr_equal(c->addr, pg(8));
  assert_int_equal(c->len, page);
  assert_int_equal(fake.nregs, 3);
  brg__regcache_put(rc, a);
  brg__regcache_put(rc, b);
  brg__regcache_put(rc, c);
  brg__regcache_destroy(rc);
  assert_int_equal(fake.live, 0);
}

static void inside_is_a_hit(void **state) {
  (void)state;
  brg__regcache *rc = cache_new(0, 0);
  const brg__vb_mr *big = get_ok(rc, pg(0), 4 * (size_t)page);
  /* anything inside pages 0..3, aligned or not, is the same registration */
  const brg__vb_mr *in1 = get_ok(rc, pg(1) + 5, 100);
  const brg__vb_mr *in2 = get_ok(rc, pg(2) + 17, 2 * (size_t)page - 17);
  const brg__vb_mr *in3 = get_ok(rc, pg(0), 4 * (size_t)page);
  assert_ptr_equal(in1, big);
  assert_ptr_equal(in2, big);
  assert_ptr_equal(in3, big);
  assert_int_equal(in1->rkey, big->rkey);
  assert_int_equal(fake.nregs, 1);
  brg__regcache_stats st = stats(rc);
  assert_int_equal(st.hits, 3);
  assert_int_equal(st.misses, 1);
  assert_int_equal(st.entries, 1);
  assert_int_equal(st.bytes, 4 * (size_t)page);
  /* one byte past the registration is not covered */
  const brg__vb_mr *past = get_ok(rc, pg(3) + 10, (size_t)page);
  assert_ptr_not_equal(past, big);
  assert_int_equal(fake.nregs, 2);
  for (int i = 0; i < 4; i++) brg__regcache_put(rc, big);
  brg__regcache_put(rc, past);
  brg__regcache_destroy(rc);
  assert_int_equal(fake.live, 0);
  assert_int_equal(fake.deregs, 2);
}

static void adjacent_and_overlapping(void **state) {
  (void)state;
  brg__regcache *rc = cache_new(0, 0);
  const brg__vb_mr *p0 = get_ok(rc, pg(0), (size_t)page);
  const brg__vb_mr *p1 = get_ok(rc, pg(1), (size_t)page); /* adjacent: its own */
  assert_ptr_not_equal(p0, p1);
  assert_int_equal(fake.nregs, 2);
  /* pages 0..1 together: neither entry covers it, so a third registration */
  const brg__vb_mr *both = get_ok(rc, pg(0) + 10, (size_t)page);
  assert_ptr_not_equal(both, p0);
  assert_ptr_not_equal(both, p1);
  assert_ptr_equal(both->addr, pg(0));
  assert_int_equal(both->len, 2 * (size_t)page);
  assert_int_equal(fake.nregs, 3);
  /* overlapping the middle of pages 0..1: covered by that one */
  const brg__vb_mr *mid = get_ok(rc, pg(0) + page / 2, (size_t)page);
  assert_ptr_equal(mid, both);
  /* overlapping pages 1..2: nothing covers page 2 */
  const brg__vb_mr *p12 = get_ok(rc, pg(1) + 1, (size_t)page);
  assert_ptr_equal(p12->addr, pg(1));
  assert_int_equal(p12->len, 2 * (size_t)page);
  assert_int_equal(fake.nregs, 4);
  brg__regcache_stats st = stats(rc);
  assert_int_equal(st.hits, 1);
  assert_int_equal(st.misses, 4);
  brg__regcache_put(rc, p0);
  brg__regcache_put(rc, p1);
  brg__regcache_put(rc, both);
  brg__regcache_put(rc, mid);
  brg__regcache_put(rc, p12);
  assert_int_equal(fake.deregs, 0); /* idle entries are kept */
  brg__regcache_destroy(rc);
  assert_int_equal(fake.live, 0);
  assert_int_equal(fake.deregs, 4);
}

static void refcounts(void **state) {
  (void)state;
  brg__regcache *rc = cache_new(0, 0);
  const brg__vb_mr *a = get_ok(rc, pg(2), 100);
  const brg__vb_mr *b = get_ok(rc, pg(2) + 200, 100);
  assert_ptr_equal(a, b);
  brg__regcache_stats st = stats(rc);
  assert_int_equal(st.entries, 1);
  assert_int_equal(st.idle, 0);
  brg__regcache_put(rc, a);
  st = stats(rc);
  assert_int_equal(st.idle, 0); /* one reference left */
  brg__regcache_put(rc, b);
  st = stats(rc);
  assert_int_equal(st.idle, 1);
  assert_int_equal(st.idle_bytes, page);
  assert_int_equal(fake.deregs, 0);
  /* idle, still registered: the next get is a hit with no registration */
  const brg__vb_mr *c = get_ok(rc, pg(2) + 50, 10);
  assert_ptr_equal(c, a);
  assert_int_equal(fake.nregs, 1);
  st = stats(rc);
  assert_int_equal(st.idle, 0);
  assert_int_equal(st.hits, 2);
  brg__regcache_put(rc, c);
  brg__regcache_destroy(rc);
  assert_int_equal(fake.deregs, 1);
}

static int live_at(const char *addr) {
  for (int k = 0; k < fake.nregs; k++)
    if (fake.regs[k].live && fake.regs[k].addr == (uintptr_t)addr) return 1;
  return 0;
}

static void eviction_by_count(void **state) {
  (void)state;
  brg__regcache *rc = cache_new(2, 0); /* at most 2 idle entries */
  const brg__vb_mr *m[6];
  for (int i = 0; i < 6; i++) m[i] = get_ok(rc, pg(2 * i), 10);
  /* In use, none may go, whatever the bound says. */
  assert_int_equal(fake.live, 6);
  brg__regcache_put(rc, m[1]);
  brg__regcache_put(rc, m[2]);
  assert_int_equal(fake.deregs, 0);
  /* touch 1 again so 2 is the least recently used */
  brg__regcache_put(rc, get_ok(rc, pg(2), 1));
  brg__regcache_put(rc, m[3]); /* 3 idle > 2: the LRU idle one (2) goes */
  assert_int_equal(fake.deregs, 1);
  assert_false(live_at(pg(4)));
  assert_true(live_at(pg(2)));
  assert_true(live_at(pg(6)));
  brg__regcache_put(rc, m[4]); /* then 1 */
  assert_int_equal(fake.deregs, 2);
  assert_false(live_at(pg(2)));
  /* the referenced ones are all still there */
  assert_true(live_at(pg(0)));
  assert_true(live_at(pg(10)));
  brg__regcache_stats st = stats(rc);
  assert_int_equal(st.evictions, 2);
  assert_int_equal(st.idle, 2);
  assert_int_equal(st.entries, 4);
  /* an evicted range registers anew */
  const brg__vb_mr *again = get_ok(rc, pg(4), 10);
  assert_int_equal(fake.nregs, 7);
  brg__regcache_put(rc, again);
  brg__regcache_put(rc, m[0]);
  brg__regcache_put(rc, m[5]);
  st = stats(rc);
  assert_int_equal(st.idle, 2);
  brg__regcache_destroy(rc);
  assert_int_equal(fake.live, 0);
}

static void eviction_by_bytes(void **state) {
  (void)state;
  brg__regcache *rc = cache_new(100, 3 * (size_t)page); /* idle bytes bound */
  const brg__vb_mr *a = get_ok(rc, pg(0), 2 * (size_t)page);
  const brg__vb_mr *b = get_ok(rc, pg(4), 2 * (size_t)page);
  const brg__vb_mr *c = get_ok(rc, pg(8), 1);
  brg__regcache_put(rc, a); /* 2 pages idle */
  brg__regcache_put(rc, b); /* 4 pages idle > 3: a goes */
  assert_false(live_at(pg(0)));
  assert_true(live_at(pg(4)));
  brg__regcache_put(rc, c); /* 3 pages: fits */
  assert_true(live_at(pg(8)));
  brg__regcache_stats st = stats(rc);
  assert_int_equal(st.idle_bytes, 3 * (size_t)page);
  assert_int_equal(st.evictions, 1);
  brg__regcache_destroy(rc);
  assert_int_equal(fake.live, 0);
}

static void full_backend_evicts_idle(void **state) {
  (void)state;
  fake.live_limit = 3;
  brg__regcache *rc = cache_new(0, 0);
  const brg__vb_mr *a = get_ok(rc, pg(0), 1);
  const brg__vb_mr *b = get_ok(rc, pg(2), 1);
  const brg__vb_mr *c = get_ok(rc, pg(4), 1);
  brg__regcache_put(rc, b);
  /* the backend is full; the cache gives back its idle entry and retries */
  const brg__vb_mr *d = get_ok(rc, pg(6), 1);
  assert_false(live_at(pg(2)));
  assert_int_equal(fake.live, 3);
  /* nothing idle to give back: the backend's error comes through */
  const brg__vb_mr *e = NULL;
  brg__errbuf err = {0};
  assert_int_equal(brg__regcache_get(rc, pg(8), 1, &e, &err), BRG_ERR_NO_MEMORY);
  assert_non_null(strstr(err.msg, "out of registrations"));
  assert_null(e);
  brg__regcache_put(rc, a);
  brg__regcache_put(rc, c);
  brg__regcache_put(rc, d);
  brg__regcache_destroy(rc);
  assert_int_equal(fake.live, 0);
}

static void invalidate(void **state) {
  (void)state;
  brg__regcache *rc = cache_new(0, 0);
  const brg__vb_mr *idle = get_ok(rc, pg(0), 2 * (size_t)page);
  const brg__vb_mr *used = get_ok(rc, pg(4), (size_t)page);
  const brg__vb_mr *other = get_ok(rc, pg(8), (size_t)page);
  brg__regcache_put(rc, idle);
  brg__regcache_put(rc, other);
  /* freeing one byte of page 1 drops the idle entry of pages 0..1 */
  brg__regcache_invalidate(rc, pg(1) + 100, 1);
  assert_false(live_at(pg(0)));
  /* freeing memory still in use: kept until its last put, but never a hit */
  brg__regcache_invalidate(rc, pg(4), (size_t)page);
  assert_true(live_at(pg(4)));
  const brg__vb_mr *fresh = get_ok(rc, pg(4), 10);
  assert_ptr_not_equal(fresh, used);
  assert_int_equal(fake.nregs, 4);
  brg__regcache_put(rc, used); /* the stale one goes now */
  assert_int_equal(fake.deregs, 2);
  assert_true(live_at(pg(4))); /* the fresh registration */
  /* ranges that only touch an entry's edges leave it alone */
  brg__regcache_invalidate(rc, pg(7), (size_t)page);
  brg__regcache_invalidate(rc, pg(9), (size_t)page);
  assert_true(live_at(pg(8)));
  brg__regcache_stats st = stats(rc);
  assert_int_equal(st.invalidations, 2);
  brg__regcache_put(rc, fresh);
  brg__regcache_destroy(rc);
  assert_int_equal(fake.live, 0);
}

static void destroy_deregisters_all(void **state) {
  (void)state;
  brg__regcache *rc = cache_new(0, 0);
  for (int i = 0; i < 10; i++) brg__regcache_put(rc, get_ok(rc, pg(3 * i), 100));
  const brg__vb_mr *busy = get_ok(rc, pg(40), 100); /* a leak the cache reports */
  (void)busy;
  assert_int_equal(fake.live, 11);
  brg__regcache_destroy(rc);
  assert_int_equal(fake.live, 0);
  assert_int_equal(fake.deregs, 11);
}

typedef struct thread_arg {
  brg__regcache *rc;
  int seed;
} thread_arg;

static void *hammer(void *p) {
  thread_arg *a = p;
  unsigned s = (unsigned)a->seed;
  const brg__vb_mr *held[4] = {0};
  for (int i = 0; i < 8000; i++) { /* at most 4 x 8000 gets: fits FAKE_REGS */
    s = s * 1103515245u + 12345u;
    int k = (int)(s >> 16) % 4;
    if (held[k]) {
      brg__regcache_put(a->rc, held[k]);
      held[k] = NULL;
    } else {
      int first = (int)(s >> 8) % 16;
      size_t len = 1 + (size_t)((s >> 4) % (unsigned)(3 * page));
      brg__errbuf err;
      if (brg__regcache_get(a->rc, pg(first) + (s % 64), len, &held[k], &err) != BRG_SUCCESS)
        return "get failed";
      if ((uintptr_t)held[k]->addr > (uintptr_t)pg(first) + (s % 64) ||
          (uintptr_t)held[k]->addr + held[k]->len < (uintptr_t)pg(first) + (s % 64) + len)
        return "registration does not cover the range";
    }
  }
  for (int k = 0; k < 4; k++) brg__regcache_put(a->rc, held[k]);
  return NULL;
}

static void threads(void **state) {
  (void)state;
  brg__regcache *rc = cache_new(4, 0);
  pthread_t t[4];
  thread_arg args[4];
  for (int i = 0; i < 4; i++) {
    args[i] = (thread_arg){rc, i + 1};
    assert_int_equal(pthread_create(&t[i], NULL, hammer, &args[i]), 0);
  }
  for (int i = 0; i < 4; i++) {
    void *r;
    pthread_join(t[i], &r);
    if (r) fail_msg("thread %d: %s", i, (const char *)r);
  }
  brg__regcache_stats st = stats(rc);
  assert_int_equal(st.entries, st.idle); /* every reference was given back */
  assert_true(st.idle <= 4);
  assert_int_equal(st.misses, fake.nregs);
  assert_int_equal((size_t)fake.live, st.entries);
  brg__regcache_destroy(rc);
  assert_int_equal(fake.live, 0);
  assert_int_equal(fake.deregs, fake.nregs);
}

/* ---- the software backend ------------------------------------------------------ */

static void soft_write_through_cached_key(void **state) {
  (void)state;
  const brg__vb_ops *vb = &brg__vb_soft;
  brg__errbuf err;
  brg__vb_ctx *ca, *cb;
  assert_int_equal(vb->ctx_open(&ca, "127.0.0.1", &err), BRG_SUCCESS);
  assert_int_equal(vb->ctx_open(&cb, "127.0.0.1", &err), BRG_SUCCESS);
  brg__regcache *rca, *rcb;
  assert_int_equal(brg__regcache_create(&rca, vb, ca, 0, 0, &err), BRG_SUCCESS);
  assert_int_equal(brg__regcache_create(&rcb, vb, cb, 0, 0, &err), BRG_SUCCESS);
  char *src =
      mmap(NULL, 4 * (size_t)page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  char *dst =
      mmap(NULL, 4 * (size_t)page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  assert_true(src != MAP_FAILED && dst != MAP_FAILED);
  for (int i = 0; i < 4 * page; i++) src[i] = (char)(i * 13 + 5);
  /* The target asks for 100 bytes in page 1, the source for 64 in page 2. */
  const brg__vb_mr *mb = get_ok(rcb, dst + page + 300, 100);
  const brg__vb_mr *ma = get_ok(rca, src + 2 * page + 7, 64);
  /* a second ask inside the same pages is the same registration */
  assert_ptr_equal(get_ok(rcb, dst + page, 1), mb);
  brg__regcache_put(rcb, mb);
  brg__vb_qp *a, *b;
  brg__vb_qp_info ia, ib;
  assert_int_equal(vb->qp_create(ca, 8, 8, &a, &ia, &err), BRG_SUCCESS);
  assert_int_equal(vb->qp_create(cb, 8, 8, &b, &ib, &err), BRG_SUCCESS);
  assert_int_equal(vb->qp_connect(a, &ib, 1, 5000, &err), BRG_SUCCESS);
  assert_int_equal(vb->qp_connect(b, &ia, 0, 5000, &err), BRG_SUCCESS);
  /* Writes anywhere in the registered pages land, also outside what was
   * asked for: the rounding is what the key covers. */
  assert_int_equal(vb->post_write(a, 1, ma, src + 2 * page, (uint32_t)page,
                                  (uint64_t)(uintptr_t)(dst + page), mb->rkey, 0, 0, 1),
                   BRG_SUCCESS);
  /* One byte past the pages is refused. */
  assert_int_equal(vb->post_write(a, 2, ma, src + 2 * page, 2,
                                  (uint64_t)(uintptr_t)(dst + 2 * page - 1), mb->rkey, 0, 0, 1),
                   BRG_SUCCESS);
  brg__vb_wc wc[2];
  int got = 0;
  for (int i = 0; i < 5000 && got < 2; i++) {
    got += vb->poll(a, wc + got, 2 - got);
    if (got < 2) usleep(1000);
  }
  assert_int_equal(got, 2);
  assert_int_equal(wc[0].status, BRG__VB_WC_SUCCESS);
  assert_int_equal(wc[1].status, BRG__VB_WC_REM_ACCESS);
  assert_memory_equal(dst + page, src + 2 * page, (size_t)page);
  assert_int_equal(dst[2 * page], 0);
  vb->qp_destroy(a);
  vb->qp_destroy(b);
  brg__regcache_put(rca, ma);
  brg__regcache_put(rcb, mb);
  brg__regcache_stats st = stats(rcb);
  assert_int_equal(st.hits, 1);
  assert_int_equal(st.misses, 1);
  brg__regcache_invalidate(rca, src, 4 * (size_t)page);
  brg__regcache_invalidate(rcb, dst, 4 * (size_t)page);
  assert_int_equal(stats(rca).entries, 0);
  assert_int_equal(stats(rcb).entries, 0);
  munmap(src, 4 * (size_t)page);
  munmap(dst, 4 * (size_t)page);
  brg__regcache_destroy(rca);
  brg__regcache_destroy(rcb);
  vb->ctx_close(ca);
  vb->ctx_close(cb);
}

int main(void) {
  page = sysconf(_SC_PAGESIZE);
  mem = mmap(NULL, 64 * (size_t)page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup(bad_arguments, setup),
      cmocka_unit_test_setup(rounds_to_pages, setup),
      cmocka_unit_test_setup(inside_is_a_hit, setup),
      cmocka_unit_test_setup(adjacent_and_overlapping, setup),
      cmocka_unit_test_setup(refcounts, setup),
      cmocka_unit_test_setup(eviction_by_count, setup),
      cmocka_unit_test_setup(eviction_by_bytes, setup),
      cmocka_unit_test_setup(full_backend_evicts_idle, setup),
      cmocka_unit_test_setup(invalidate, setup),
      cmocka_unit_test_setup(destroy_deregisters_all, setup),
      cmocka_unit_test_setup(threads, setup),
      cmocka_unit_test(soft_write_through_cached_key),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  munmap(mem, 64 * (size_t)page);
  return failed;
}
