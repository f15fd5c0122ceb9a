/* The settings table and its parsers. Loading happens once per process, so
 * the environment cases run in forked children. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "settings.h"

static void test_parse_size(void **state) {
  (void)state;
  int64_t v;
  assert_int_equal(brg__config_parse_size("0", &v), BRG_SUCCESS);
  assert_int_equal(v, 0);
  assert_int_equal(brg__config_parse_size("4096", &v), BRG_SUCCESS);
  assert_int_equal(v, 4096);
  assert_int_equal(brg__config_parse_size("64K", &v), BRG_SUCCESS);
  assert_int_equal(v, 65536);
  assert_int_equal(brg__config_parse_size("1m", &v), BRG_SUCCESS);
  assert_int_equal(v, 1 << 20);
  assert_int_equal(brg__config_parse_size("2GiB", &v), BRG_SUCCESS);
  assert_int_equal(v, 2LL << 30);
  assert_int_equal(brg__config_parse_size("1MB", &v), BRG_SUCCESS);
  assert_int_equal(v, 1 << 20);
  const char *bad[] = {
      "", "K", "-1", "+5", "12Q", "1K2", "1 K", "99999999999999999999", "9999999999999G", "0x10"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    v = 12345;
    assert_int_equal(brg__config_parse_size(bad[i], &v), BRG_ERR_INVALID_ARGUMENT);
    assert_int_equal(v, 12345); /* output untouched on failure */
  }
}

static void test_parse_int(void **state) {
  (void)state;
  int64_t v;
  assert_int_equal(brg__config_parse_int("-1", &v), BRG_SUCCESS);
  assert_int_equal(v, -1);
  assert_int_equal(brg__config_parse_int("600000", &v), BRG_SUCCESS);
  assert_int_equal(v, 600000);
  const char *bad[] = {"", "abc", "1.5", "12x", "99999999999999999999999"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
    assert_int_equal(brg__config_parse_int(bad[i], &v), BRG_ERR_INVALID_ARGUMENT);
}

static void test_table(void **state) {
  (void)state;
  brg__cfg_section *all[BRG__SETTINGS_MAX_SECTIONS];
  int nsec = brg__settings_sections(all, BRG__SETTINGS_MAX_SECTIONS);
  assert_true(nsec >= 5); /* log, core, device, tcp, ibverbs */
  const brg__cfg_entry *seen[256];
  int nseen = 0;
  for (int k = 0; k < nsec; k++)
    for (int i = 0; i < all[k]->count; i++) {
      const brg__cfg_entry *e = &all[k]->entries[i];
      assert_non_null(e->name);
      assert_int_equal(strncmp(e->name, "BRIGADE_", 8), 0);
      assert_non_null(e->help);
      assert_true(strlen(e->help) > 10);
      if (e->kind != BRG__CFG_KIND_STRING) {
        int64_t v;
        brg_status s = e->kind == BRG__CFG_KIND_INT ? brg__config_parse_int(e->defval, &v)
                                                    : brg__config_parse_size(e->defval, &v);
        assert_int_equal(s, BRG_SUCCESS);
        assert_true(v >= e->min && v <= e->max);
      }
      for (int j = 0; j < nseen; j++) assert_string_not_equal(e->name, seen[j]->name);
      assert_true(nseen < 256);
      seen[nseen++] = e;
    }
}

/* Runs a load in a child with one variable set; returns the child's verdict:
 * 0 loaded with the expected int value, 1 rejected with the name in the message. */
static int load_in_child(const char *name, const char *value, int64_t expect) {
  pid_t pid = fork();
  if (pid == 0) {
    setenv(name, value, 1);
    brg__errbuf err = {0};
    brg_status s = brg__settings_load(&err);
    const brg__cfg_entry *e = brg__settings_find(name);
    if (s == BRG_SUCCESS) _exit(e && e->ival == expect && e->is_set ? 0 : 3);
    _exit(strstr(err.msg, name) ? 1 : 4);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 99;
}

static void test_env(void **state) {
  (void)state;
  assert_int_equal(load_in_child("BRIGADE_STEPS", "4", 4), 0);
  assert_int_equal(load_in_child("BRIGADE_SLICE_BYTES", "256K", 262144), 0);
  assert_int_equal(load_in_child("BRIGADE_STEPS", "lots", 0), 1);
  assert_int_equal(load_in_child("BRIGADE_STEPS", "1000", 0), 1);
  assert_int_equal(load_in_child("BRIGADE_TIMEOUT_MS", "5", 0), 1);
  assert_int_equal(load_in_child("BRIGADE_SLICE_BYTES", "1G", 0), 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_parse_size),
      cmocka_unit_test(test_parse_int),
      cmocka_unit_test(test_table),
      cmocka_unit_test(test_env),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
