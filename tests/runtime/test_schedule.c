/* The ring schedule, checked by replaying it symbolically: every position
 * tracks which ranks' contributions each chunk holds, and the replay must
 * end with every chunk complete everywhere, each contribution counted once. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "schedule.h"

static void test_parts_cover(void **state) {
  (void)state;
  size_t counts[] = {0, 1, 2, 7, 31, 1000003, 65536};
  for (size_t ci = 0; ci < sizeof counts / sizeof *counts; ci++) {
    for (int n = 1; n <= 9; n++) {
      size_t sum = 0, lo = (size_t)-1, hi = 0;
      for (int i = 0; i < n; i++) {
        assert_int_equal(brg__part_offset(counts[ci], n, i), sum);
        size_t c = brg__part_count(counts[ci], n, i);
        sum += c;
        if (c < lo) lo = c;
        if (c > hi) hi = c;
      }
      assert_int_equal(sum, counts[ci]);
      assert_true(hi - lo <= 1);
    }
  }
}

static void test_slices_cover(void **state) {
  (void)state;
  size_t ns[] = {0, 1, 5, 8, 9, 100, 4097};
  size_t se[] = {1, 4, 8, 4096};
  for (size_t a = 0; a < sizeof ns / sizeof *ns; a++)
    for (size_t b = 0; b < sizeof se / sizeof *se; b++) {
      size_t total = brg__slice_total(ns[a], se[b]), covered = 0;
      assert_true(total >= 1);
      for (size_t s = 0; s < total; s++) {
        assert_int_equal(brg__slice_offset(s, se[b]), covered);
        size_t m = brg__slice_count(ns[a], se[b], s);
        assert_true(m <= se[b]);
        if (ns[a] > 0) assert_true(m > 0);
        covered += m;
      }
      assert_int_equal(covered, ns[a]);
    }
}

/* Replay of allreduce on N positions: have[p][c] is the bitmask of
 * contributions position p holds for chunk c; final[p][c] is set when p has
 * written the finished chunk c to its output. */
static void replay(int n) {
  uint32_t have[16][16], msg[16];
  int final[16][16];
  memset(final, 0, sizeof final);
  memset(msg, 0, sizeof msg);
  for (int p = 0; p < n; p++)
    for (int c = 0; c < n; c++) have[p][c] = 1u << p;
  int sends = 0;
  for (int t = 0; t < brg__ring_steps(n); t++) {
    uint32_t in[16];
    /* Deliver what was sent at step t-1 to the next position. */
    for (int p = 0; p < n; p++) in[(p + 1) % n] = msg[p];
    for (int p = 0; p < n; p++) {
      int c = brg__ring_chunk(p, n, t);
      brg__prim prim = brg__ring_prim(n, t);
      if (t > 0) {
        /* What arrives must be the chunk this position works on. */
        int sender_chunk = brg__ring_chunk((p + n - 1) % n, n, t - 1);
        assert_int_equal(sender_chunk, c);
      }
      switch (prim) {
      case BRG__PRIM_SEND:
        msg[p] = have[p][c];
        sends++;
        break;
      case BRG__PRIM_RECV_REDUCE_SEND:
        assert_int_equal(in[p] & have[p][c], 0); /* nothing counted twice */
        have[p][c] |= in[p];
        msg[p] = have[p][c];
        sends++;
        break;
      case BRG__PRIM_RECV_REDUCE_COPY_SEND:
        assert_int_equal(in[p] & have[p][c], 0);
        have[p][c] |= in[p];
        assert_int_equal(c, p); /* reduce-scatter ends on the owner's chunk */
        assert_int_equal(have[p][c], (1u << n) - 1);
        final[p][c] = 1;
        msg[p] = have[p][c];
        sends++;
        break;
      case BRG__PRIM_RECV_COPY_SEND:
        assert_int_equal(in[p], (1u << n) - 1);
        have[p][c] = in[p];
        final[p][c] = 1;
        msg[p] = in[p];
        sends++;
        break;
      case BRG__PRIM_RECV:
        assert_int_equal(in[p], (1u << n) - 1);
        final[p][c] = 1;
        break;
      default: fail();
      }
    }
  }
  for (int p = 0; p < n; p++)
    for (int c = 0; c < n; c++) assert_true(final[p][c]);
  /* 2(N-1) chunk sends per position: the bandwidth-optimal count. */
  assert_int_equal(sends, n * 2 * (n - 1));
}

static void test_allreduce_replay(void **state) {
  (void)state;
  for (int n = 2; n <= 12; n++) replay(n);
}

static void test_prims(void **state) {
  (void)state;
  assert_int_equal(brg__ring_prim(2, 0), BRG__PRIM_SEND);
  assert_int_equal(brg__ring_prim(2, 1), BRG__PRIM_RECV_REDUCE_COPY_SEND);
  assert_int_equal(brg__ring_prim(2, 2), BRG__PRIM_RECV);
  assert_int_equal(brg__ring_prim(4, 1), BRG__PRIM_RECV_REDUCE_SEND);
  assert_int_equal(brg__ring_prim(4, 4), BRG__PRIM_RECV_COPY_SEND);
  assert_int_equal(brg__ring_steps(4), 7);
}

static void test_chain(void **state) {
  (void)state;
  for (int n = 1; n <= 8; n++)
    for (int first = 0; first < n; first++) {
      int seen[8] = {0};
      for (int p = 0; p < n; p++) {
        int h = brg__chain_hop(p, first, n);
        assert_true(h >= 0 && h < n);
        seen[h]++;
        /* The next position is one hop further. */
        if (h < n - 1) assert_int_equal(brg__chain_hop((p + 1) % n, first, n), h + 1);
      }
      for (int h = 0; h < n; h++) assert_int_equal(seen[h], 1);
    }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_parts_cover),
      cmocka_unit_test(test_slices_cover),
      cmocka_unit_test(test_allreduce_replay),
      cmocka_unit_test(test_prims),
      cmocka_unit_test(test_chain),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
