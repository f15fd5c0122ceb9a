/*
 * Topology: the identities the bootstrap table brings are checked before
 * anything prints them (terminated, printable, the right rank number).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_good),
      cmocka_unit_test(test_unterminated),
      cmocka_unit_test(test_unprintable),
      cmocka_unit_test(test_wrong_rank),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
