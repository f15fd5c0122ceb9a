/*
 * The slice policy (runtime/plan/slice.c): the host ring's slice from the
 * setting or the links' preference, step mode's capped on a ring with a
 * staged link, kernel mode's slot, and what a collective's walk uses.
 * Every figure is worked out here from the settings' documented defaults.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "settings.h"

#define KiB ((size_t)1024)

/* The settings read anew from the environment. */
static void reload(void) {
  brg__cfg_section *s[] = {&brg__core_config, &brg__device_config};
  for (int i = 0; i < 2; i++) {
    s[i]->loaded = 0;
    s[i]->status = BRG_SUCCESS;
  }
}

static void setup_env(const char *slice, const char *dev_slice) {
  unsetenv("BRIGADE_SLICE_BYTES");
  unsetenv("BRIGADE_DEVICE_SLICE_BYTES");
  if (slice) setenv("BRIGADE_SLICE_BYTES", slice, 1);
  if (dev_slice) setenv("BRIGADE_DEVICE_SLICE_BYTES", dev_slice, 1);
  reload();
}

/* A ring of n ranks, on one host or each on its own, over `transports`. */
typedef struct ring {
  brg_comm c;
  brg__peer_info peers[4];
  int order[4];
} ring;

static brg_comm *make(ring *r, int n, int hosts, const char *transports, int nslots) {
  memset(r, 0, sizeof *r);
  for (int k = 0; k < n; k++) {
    r->peers[k].rank = k;
    r->peers[k].host_hash = hosts ? 1000u + (uint64_t)k : 1000u;
    r->order[k] = k;
  }
  r->c.nranks = n;
  r->c.peers = r->peers;
  r->c.ring.order = r->order;
  r->c.nslots = nslots;
  snprintf(r->c.transports, sizeof r->c.transports, "%s", transports);
  r->c.slice_bytes = brg__slice_bytes(&r->c, BRG__SLICE_HOST);
  return &r->c;
}

static void test_host(void **state) {
  (void)state;
  ring r;
  setup_env(NULL, NULL);
  /* unset: the default, 128K; raised to 512K by a tcp link of the ring */
  assert_int_equal(make(&r, 3, 0, "shm", 8)->slice_bytes, 128 * KiB);
  assert_int_equal(make(&r, 3, 1, "tcp", 8)->slice_bytes, 512 * KiB);
  assert_int_equal(make(&r, 1, 1, "tcp", 8)->slice_bytes, 128 * KiB); /* no link */
  /* set: the setting, whatever the links, down to a multiple of 64 */
  setup_env("64K", NULL);
  assert_int_equal(make(&r, 3, 1, "tcp", 8)->slice_bytes, 64 * KiB);
  setup_env("4200", NULL);
  assert_int_equal(make(&r, 2, 0, "shm", 8)->slice_bytes, 4160);
}

static void test_step(void **state) {
  (void)state;
  ring r;
  setup_env(NULL, NULL);
  /* One rank has no link: the setting, 4M. */
  assert_int_equal(brg__slice_bytes(make(&r, 1, 0, "shm", 8), BRG__SLICE_STEP), 4096 * KiB);
  /* Links without GPU memory (shm, tcp) stage the slice: at most half the
   * slots' worth of host slices, at least one. */
  assert_int_equal(brg__slice_bytes(make(&r, 3, 0, "shm", 8), BRG__SLICE_STEP), 4 * 128 * KiB);
  assert_int_equal(brg__slice_bytes(make(&r, 3, 1, "tcp", 8), BRG__SLICE_STEP), 4 * 512 * KiB);
  assert_int_equal(brg__slice_bytes(make(&r, 3, 1, "tcp", 2), BRG__SLICE_STEP), 512 * KiB);
  /* Below the cap, the setting, down to a multiple of 256. */
  setup_env(NULL, "100000");
  assert_int_equal(brg__slice_bytes(make(&r, 3, 0, "shm", 8), BRG__SLICE_STEP), 99840);
}

static void test_kernel(void **state) {
  (void)state;
  ring r;
  setup_env("4200", NULL);
  /* the host slice (4160) down to a multiple of 256 */
  assert_int_equal(brg__slice_bytes(make(&r, 2, 0, "shm", 8), BRG__SLICE_KERNEL), 4096);
  setup_env(NULL, NULL);
  assert_int_equal(brg__slice_bytes(make(&r, 2, 1, "tcp", 8), BRG__SLICE_KERNEL), 512 * KiB);
}

static void test_elems(void **state) {
  (void)state;
  ring r;
  setup_env(NULL, NULL);
  brg_comm *c = make(&r, 3, 0, "shm", 8);
  brg__coll k = {.kind = BRG__COLL_ALLREDUCE, .dtype = BRG_FLOAT32, .count = 1};
  assert_int_equal(brg__slice_elems(c, &k), 128 * KiB / 4);
  k.dtype = BRG_FLOAT64;
  assert_int_equal(brg__slice_elems(c, &k), 128 * KiB / 8);
  c->slice_bytes = 4; /* never 0 elements */
  assert_int_equal(brg__slice_elems(c, &k), 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_host),
      cmocka_unit_test(test_step),
      cmocka_unit_test(test_kernel),
      cmocka_unit_test(test_elems),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
