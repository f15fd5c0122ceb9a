/* The latency-bound schedules (schedule_lat.h) at N = 1..70: both trees of
 * the double binary tree are trees (one root, parents and children agree,
 * every position reached, no deeper than brg__dbtree_depth) and no
 * position but one at odd N is inside both; recursive halving and
 * doubling, replayed symbolically on sets of contributions, ends with
 * every block holding every position's contribution exactly once on every
 * position. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "schedule_lat.h"

#define MAXN 70

static void test_pow2(void **state) {
  (void)state;
  assert_int_equal(brg__pow2_floor(1), 1);
  assert_int_equal(brg__pow2_floor(7), 4);
  assert_int_equal(brg__pow2_floor(8), 8);
  assert_int_equal(brg__pow2_floor(1023), 512);
  assert_int_equal(brg__log2_exact(1), 0);
  assert_int_equal(brg__log2_exact(64), 6);
  assert_int_equal(brg__dbtree_depth(1), 1);
  assert_int_equal(brg__dbtree_depth(2), 2);
  assert_int_equal(brg__dbtree_depth(1024), 11);
  assert_int_equal(brg__dbtree_depth(1023), 10);
}

/* The depth of p in tree t, walking up; fails on a cycle. */
static int depth_of(int n, int t, int p) {
  int d = 1;
  for (int q = p; brg__dbtree_node(n, t, q).parent >= 0; q = brg__dbtree_node(n, t, q).parent) {
    d++;
    assert_true(d <= n);
  }
  return d;
}

static void test_trees(void **state) {
  (void)state;
  for (int n = 1; n <= MAXN; n++) {
    int interior[2][MAXN] = {{0}};
    for (int t = 0; t < 2; t++) {
      int roots = 0, seen[MAXN] = {0};
      for (int p = 0; p < n; p++) {
        brg__tree_node nd = brg__dbtree_node(n, t, p);
        if (nd.parent < 0) {
          roots++;
          assert_int_equal(p, brg__dbtree_root(n, t));
        } else {
          assert_in_range(nd.parent, 0, n - 1);
          brg__tree_node up = brg__dbtree_node(n, t, nd.parent);
          assert_true(up.child[0] == p || up.child[1] == p);
        }
        for (int i = 0; i < 2; i++) {
          int ch = nd.child[i];
          if (ch < 0) continue;
          assert_in_range(ch, 0, n - 1);
          assert_int_equal(brg__dbtree_node(n, t, ch).parent, p);
          assert_int_equal(seen[ch]++, 0); /* nobody's child twice */
          interior[t][p] = 1;
        }
        assert_true(nd.child[0] != nd.child[1] || nd.child[0] < 0);
        assert_true(depth_of(n, t, p) <= brg__dbtree_depth(n));
      }
      assert_int_equal(roots, 1);
      for (int p = 0; p < n; p++) assert_int_equal(seen[p], p != brg__dbtree_root(n, t));
    }
    int both = 0;
    for (int p = 0; p < n; p++) both += interior[0][p] && interior[1][p];
    assert_true(both <= (n % 2 ? 1 : 0));
  }
}

/* Contributions as bit sets: block b of position p holds have[p][b]. */
static void test_rhd_replay(void **state) {
  (void)state;
  static uint64_t have[MAXN][64], next[MAXN][64];
  for (int n = 1; n <= 64; n++) {
    int p2 = brg__pow2_floor(n);
    uint64_t all = n == 64 ? ~0ull : (1ull << n) - 1;
    memset(have, 0, sizeof have);
    for (int p = 0; p < n; p++)
      for (int b = 0; b < p2; b++) have[p][b] = 1ull << p;
    /* fold: the even position's buffer into the odd one */
    for (int p = 0; p < n; p++) {
      brg__rhd r = brg__rhd_of(n, p);
      assert_int_equal(r.p2, p2);
      if (r.vrank < 0) {
        assert_int_equal(brg__rhd_of(n, r.fold).fold, p);
        for (int b = 0; b < p2; b++) have[r.fold][b] |= have[p][b];
      } else {
        assert_int_equal(brg__rhd_pos(n, r.vrank), p);
      }
    }
    for (int j = 0; j < brg__log2_exact(p2); j++) {
      memcpy(next, have, sizeof next);
      for (int v = 0; v < p2; v++) {
        int w = brg__rhd_partner(p2, v, j), lo, hi, plo, phi;
        brg__rhd_window(p2, v, j, &lo, &hi);
        brg__rhd_window(p2, w, j - 1, &plo, &phi);
        assert_true(lo >= plo && hi <= phi); /* the partner holds what v keeps */
        int p = brg__rhd_pos(n, v), q = brg__rhd_pos(n, w);
        for (int b = lo; b < hi; b++) {
          assert_int_equal(have[p][b] & have[q][b], 0); /* each contribution once */
          next[p][b] = have[p][b] | have[q][b];
        }
      }
      memcpy(have, next, sizeof have);
    }
    for (int v = 0; v < p2; v++) {
      int lo, hi;
      brg__rhd_window(p2, v, brg__log2_exact(p2) - 1, &lo, &hi);
      assert_int_equal(lo, v);
      assert_int_equal(hi, v + 1);
      assert_true(have[brg__rhd_pos(n, v)][v] == all);
    }
    /* doubling: the rounds back, each taking the partner's window */
    for (int j = brg__log2_exact(p2) - 1; j >= 0; j--) {
      memcpy(next, have, sizeof next);
      for (int v = 0; v < p2; v++) {
        int w = brg__rhd_partner(p2, v, j), lo, hi;
        brg__rhd_window(p2, w, j, &lo, &hi);
        for (int b = lo; b < hi; b++) next[brg__rhd_pos(n, v)][b] = have[brg__rhd_pos(n, w)][b];
      }
      memcpy(have, next, sizeof have);
    }
    for (int p = 0; p < n; p++) {
      brg__rhd r = brg__rhd_of(n, p);
      for (int b = 0; b < p2; b++) assert_true((r.vrank < 0 ? have[r.fold][b] : have[p][b]) == all);
    }
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_pow2),
      cmocka_unit_test(test_trees),
      cmocka_unit_test(test_rhd_replay),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
