/* launch.c: the first host of Slurm host lists and the step's port. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "internal.h"
#include "launch.h"

static void test_first_host(void **state) {
  (void)state;
  static const char *const cases[][2] = {
      {"node[01-04,07],gpu3", "node01"},
      {"gpu3", "gpu3"},
      {"gpu3,node[1-2]", "gpu3"},
      {"node[7,1-3]", "node7"},
      {"rack1-node[009-012]", "rack1-node009"},
      {"r[2-3]n[05-06]", "r2n05"},
      {"node[10]", "node10"},
      {"cn-17.cluster.example", "cn-17.cluster.example"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char host[64];
    brg__errbuf err = {0};
    assert_int_equal(brg__slurm_first_host(cases[i][0], host, sizeof host, &err), 0);
    assert_string_equal(host, cases[i][1]);
  }
  static const char *const bad[] = {"",       ",node1", "node[",   "node[a-b]",
                                    "node[]", "node]1", "node[1-2"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char host[64];
    brg__errbuf err = {0};
    assert_int_equal(brg__slurm_first_host(bad[i], host, sizeof host, &err), -1);
    assert_non_null(strstr(err.msg, "is not a host list"));
  }
  /* a name longer than the room is refused, not cut */
  char tiny[4];
  brg__errbuf err = {0};
  assert_int_equal(brg__slurm_first_host("node[01-02]", tiny, sizeof tiny, &err), -1);
}

static void test_port(void **state) {
  (void)state;
  for (unsigned long job = 0; job < 50000; job += 7)
    for (unsigned long step = 0; step < 4; step++) {
      int p = brg__slurm_port(job, step);
      assert_true(p >= 12000 && p < 32000);
      /* the next step of the same job has another port */
      assert_int_not_equal(p, brg__slurm_port(job, step + 1));
    }
  assert_int_equal(brg__slurm_port(4242, 1), brg__slurm_port(4242, 1));
}

/* Which environments are an srun step's task. */
static void test_rendezvous_env(void **state) {
  (void)state;
  char host[64], from[200];
  int port = 0;
  brg__errbuf err = {0};
  unsetenv("SLURM_JOBID");
  unsetenv("SLURM_STEPID");
  unsetenv("SLURM_NODELIST");
  unsetenv("SLURM_JOB_NODELIST");
  setenv("SLURM_JOB_ID", "4242", 1);
  setenv("SLURM_STEP_NODELIST", "cn[07-09]", 1);
  unsetenv("SLURM_STEP_ID"); /* a batch script's own process */
  assert_int_equal(brg__slurm_rendezvous(host, sizeof host, &port, from, sizeof from, &err), 0);
  setenv("SLURM_STEP_ID", "batch", 1);
  assert_int_equal(brg__slurm_rendezvous(host, sizeof host, &port, from, sizeof from, &err), 0);
  setenv("SLURM_STEP_ID", "2", 1);
  assert_int_equal(brg__slurm_rendezvous(host, sizeof host, &port, from, sizeof from, &err), 1);
  assert_string_equal(host, "cn07");
  assert_int_equal(port, brg__slurm_port(4242, 2));
  assert_non_null(strstr(from, "SLURM_STEP_NODELIST"));
  setenv("SLURM_STEP_NODELIST", "cn[x]", 1);
  assert_int_equal(brg__slurm_rendezvous(host, sizeof host, &port, from, sizeof from, &err), -1);
  assert_non_null(strstr(err.msg, "cn[x]"));
  setenv("SLURM_STEP_NODELIST", "cn1", 1);
  setenv("SLURM_JOB_ID", "12a", 1);
  assert_int_equal(brg__slurm_rendezvous(host, sizeof host, &port, from, sizeof from, &err), -1);
  assert_non_null(strstr(err.msg, "SLURM_JOB_ID"));
  unsetenv("SLURM_JOB_ID");
  unsetenv("SLURM_STEP_ID");
  unsetenv("SLURM_STEP_NODELIST");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rendezvous_env),
      cmocka_unit_test(test_first_host),
      cmocka_unit_test(test_port),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
