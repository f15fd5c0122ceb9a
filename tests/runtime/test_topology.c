/*
 * Topology: the identities the bootstrap table brings are checked before
 * anything prints them (terminated, printable, the right rank number); the
 * ring order follows the NICs (rails) where hosts have several.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static void fill(brg__peer_info *p, int n) {
  memset(p, 0, (size_t)n * sizeof *p);
  for (int k = 0; k < n; k++) {
    p[k].rank = k;
    p[k].pid = 100 + k;
    strcpy(p[k].hostname, "node-a");
    strcpy(p[k].addr, "10.0.0.1");
  }
}

/* The check fails with BRG_ERR_REMOTE and names rank 2 and the field. */
static void expect_bad(brg__peer_info *p, const char *field) {
  brg__errbuf err = {0};
  assert_int_equal(brg__topology_check_peers(p, 3, &err), BRG_ERR_REMOTE);
  assert_non_null(strstr(err.msg, "rank 2"));
  assert_non_null(strstr(err.msg, field));
}

static void test_good(void **state) {
  (void)state;
  brg__peer_info p[3];
  fill(p, 3);
  brg__errbuf err = {0};
  assert_int_equal(brg__topology_check_peers(p, 3, &err), BRG_SUCCESS);
  /* A name that fills its field but for the NUL is fine. */
  memset(p[1].hostname, 'h', sizeof p[1].hostname - 1);
  p[1].hostname[sizeof p[1].hostname - 1] = 0;
  assert_int_equal(brg__topology_check_peers(p, 3, &err), BRG_SUCCESS);
}

static void test_unterminated(void **state) {
  (void)state;
  brg__peer_info p[3];
  fill(p, 3);
  memset(p[2].hostname, 'h', sizeof p[2].hostname);
  expect_bad(p, "host name");
  fill(p, 3);
  memset(p[2].addr, '1', sizeof p[2].addr);
  expect_bad(p, "address");
}

static void test_unprintable(void **state) {
  (void)state;
  brg__peer_info p[3];
  fill(p, 3);
  p[2].hostname[2] = '\033';
  expect_bad(p, "host name");
  fill(p, 3);
  p[2].addr[0] = 0;
  expect_bad(p, "address");
}

static void test_wrong_rank(void **state) {
  (void)state;
  brg__peer_info p[3];
  fill(p, 3);
  p[2].rank = 1;
  expect_bad(p, "rank number");
  fill(p, 3);
  p[2].pid = 0;
  expect_bad(p, "pid");
}

/* H hosts of M ranks, rank r on host r mod H (as the multi-host tests
 * lay them out), local index l of a host on NIC l*K/M (its address). */
typedef struct shape {
  int H, M, K;
  brg__peer_info p[64];
  int ring[64];
} shape;

static int host_of(const shape *s, int r) {
  return r % s->H;
}
static int nic_of(const shape *s, int r) {
  return (r / s->H) * s->K / s->M;
}

/* The ring ring_rotate = j makes on rank `rank` of the shape. */
static void order(shape *s, int j) {
  int n = s->H * s->M;
  memset(s->p, 0, sizeof s->p);
  for (int r = 0; r < n; r++) {
    s->p[r].rank = r;
    s->p[r].host_hash = 1000 + (uint64_t)host_of(s, r);
    snprintf(s->p[r].addr, sizeof s->p[r].addr, "10.77.%d.%d", nic_of(s, r), host_of(s, r) + 1);
  }
  brg_comm *c = calloc(1, sizeof *c);
  assert_non_null(c);
  c->nranks = n;
  c->rank = n - 1;
  c->peers = s->p;
  c->ring.order = s->ring;
  c->ring_rotate = j;
  brg__topology_order(c);
  assert_int_equal(c->ring.order[c->ring.pos], c->rank);
  free(c);
}

static void expect_ring(shape *s, int j, const char *want) {
  order(s, j);
  char got[256] = "";
  size_t o = 0;
  for (int i = 0; i < s->H * s->M; i++) {
    int cross = i > 0 && host_of(s, s->ring[i]) != host_of(s, s->ring[i - 1]);
    o += (size_t)snprintf(got + o, sizeof got - o, "%s%d", cross ? " | " : (i ? " " : ""),
                          s->ring[i]);
  }
  assert_string_equal(got, want);
}

/* The rule's cases by hand (those the multi-host tests log too). */
static void test_rails_cases(void **state) {
  (void)state;
  shape s = {.H = 2, .M = 4, .K = 2};
  expect_ring(&s, 0, "0 4 6 2 | 1 5 7 3"); /* NIC 0: ranks 0 2 and 1 3 */
  expect_ring(&s, 1, "4 0 2 6 | 5 1 3 7");
  s = (shape){.H = 4, .M = 2, .K = 2}; /* a NIC per rank: alternate */
  expect_ring(&s, 0, "0 4 | 5 1 | 2 6 | 7 3");
  expect_ring(&s, 1, "4 0 | 1 5 | 6 2 | 3 7");
  s = (shape){.H = 2, .M = 3, .K = 1}; /* one NIC: each host turned by j */
  expect_ring(&s, 0, "0 2 4 | 1 3 5");
  expect_ring(&s, 1, "2 4 0 | 3 5 1");
}

/* Every shape up to 6 hosts of 8 ranks and 8 NICs: each host's ranks
 * once, in one stretch; with two NICs or more, every hop between hosts
 * has both ends on one NIC index, but the hop that closes a ring over an
 * odd number of hosts where the ring's NIC has a single rank; and ring j
 * on NIC j mod K where that NIC has two ranks or more. */
static void test_rails_every_shape(void **state) {
  (void)state;
  int checked = 0;
  for (int H = 2; H <= 6; H++)
    for (int M = 1; M <= 8; M++)
      for (int K = 1; K <= M; K++)
        for (int j = 0; j < K + 1; j++) {
          shape s = {.H = H, .M = M, .K = K};
          order(&s, j);
          int n = H * M, seen[64] = {0}, off = 0, single = 0, on_n = 0;
          for (int l = 0; l < M; l++) on_n += l * K / M == j % K;
          single = on_n == 1;
          for (int i = 0; i < n; i++) {
            int a = s.ring[i], b = s.ring[(i + 1) % n];
            assert_true(a >= 0 && a < n && !seen[a]);
            seen[a] = 1;
            if (i % M == M - 1) { /* the stretch ends: a hop between hosts */
              assert_int_not_equal(host_of(&s, a), host_of(&s, b));
              if (K >= 2 && nic_of(&s, a) != nic_of(&s, b)) off++;
              if (K >= 2 && !single) assert_int_equal(nic_of(&s, a), j % K);
            } else {
              assert_int_equal(host_of(&s, a), host_of(&s, b));
            }
          }
          assert_true(off <= (H % 2 && single && M > 1 ? 1 : 0));
          checked++;
        }
  assert_true(checked > 500);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_good),        cmocka_unit_test(test_unterminated),
      cmocka_unit_test(test_unprintable), cmocka_unit_test(test_wrong_rank),
      cmocka_unit_test(test_rails_cases), cmocka_unit_test(test_rails_every_shape),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
