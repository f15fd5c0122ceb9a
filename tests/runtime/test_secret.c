/*
 * secret.c: SHA-256 against FIPS 180-4's examples, HMAC-SHA-256 against
 * RFC 4231's test cases 1 to 7 (case 5, truncated, compared on its 16
 * bytes), the constant-time comparison, and BRIGADE_SECRET's rules.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "secret.h"

static size_t unhex(const char *h, uint8_t *out) {
  size_t n = strlen(h) / 2;
  for (size_t i = 0; i < n; i++) sscanf(h + 2 * i, "%2hhx", &out[i]);
  return n;
}

static void expect_hex(const uint8_t *got, const char *want) {
  uint8_t w[64];
  size_t n = unhex(want, w);
  assert_memory_equal(got, w, n);
}

static void test_sha256(void **state) {
  (void)state;
  static const struct {
    const char *msg, *digest;
  } v[] = {
      {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
      {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
      {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
       "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
  };
  for (size_t k = 0; k < sizeof v / sizeof v[0]; k++) {
    uint8_t d[32];
    brg__sha256 s;
    brg__sha256_init(&s);
    /* in uneven pieces, so that the block boundary falls inside an update */
    size_t n = strlen(v[k].msg), a = n / 3;
    brg__sha256_update(&s, v[k].msg, a);
    brg__sha256_update(&s, v[k].msg + a, n - a);
    brg__sha256_final(&s, d);
    expect_hex(d, v[k].digest);
  }
  /* A million 'a's (FIPS 180-4's long example). */
  static char block[1000];
  memset(block, 'a', sizeof block);
  uint8_t d[32];
  brg__sha256 s;
  brg__sha256_init(&s);
  for (int i = 0; i < 1000; i++) brg__sha256_update(&s, block, sizeof block);
  brg__sha256_final(&s, d);
  expect_hex(d, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

static void test_hmac_rfc4231(void **state) {
  (void)state;
  static uint8_t key131[131], data6[64], data7[160];
  memset(key131, 0xaa, sizeof key131);
  static const char t6[] = "Test Using Larger Than Block-Size Key - Hash Key First";
  static const char t7[] = "This is a test using a larger than block-size key and a larger than "
                           "block-size data. The key needs to be hashed before being used by the "
                           "HMAC algorithm.";
  memcpy(data6, t6, sizeof t6 - 1);
  memcpy(data7, t7, sizeof t7 - 1);
  uint8_t k1[20], k3[20], k4[25], k5[20], d3[50], d4[50];
  memset(k1, 0x0b, sizeof k1);
  memset(k3, 0xaa, sizeof k3);
  memset(d3, 0xdd, sizeof d3);
  for (int i = 0; i < 25; i++) k4[i] = (uint8_t)(i + 1);
  memset(d4, 0xcd, sizeof d4);
  memset(k5, 0x0c, sizeof k5);
  const struct {
    const uint8_t *key;
    size_t key_len;
    const void *data;
    size_t data_len;
    const char *mac;
  } v[] = {
      {k1, 20, "Hi There", 8, "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"},
      {(const uint8_t *)"Jefe", 4, "what do ya want for nothing?", 28,
       "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"},
      {k3, 20, d3, 50, "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"},
      {k4, 25, d4, 50, "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"},
      {k5, 20, "Test With Truncation", 20, "a3b6167473100ee06e0c796c2955552b"},
      {key131, 131, data6, sizeof t6 - 1,
       "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"},
      {key131, 131, data7, sizeof t7 - 1,
       "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2"},
  };
  for (size_t k = 0; k < sizeof v / sizeof v[0]; k++) {
    uint8_t mac[32];
    /* the message in three pieces, as the bootstrap passes them */
    size_t a = v[k].data_len / 3, b = v[k].data_len / 2;
    const uint8_t *p = v[k].data;
    brg__hmac_sha256(v[k].key, v[k].key_len, p, a, p + a, b - a, p + b, v[k].data_len - b, mac);
    expect_hex(mac, v[k].mac);
    uint8_t whole[32];
    brg__hmac_sha256(v[k].key, v[k].key_len, p, v[k].data_len, NULL, 0, NULL, 0, whole);
    assert_memory_equal(mac, whole, 32);
  }
}

static void test_ct_equal(void **state) {
  (void)state;
  uint8_t a[16], b[16];
  for (int i = 0; i < 16; i++) a[i] = b[i] = (uint8_t)(i * 13);
  assert_true(brg__ct_equal(a, b, 16));
  for (int i = 0; i < 16; i++)
    for (int bit = 0; bit < 8; bit++) {
      b[i] ^= (uint8_t)(1 << bit);
      assert_false(brg__ct_equal(a, b, 16));
      b[i] ^= (uint8_t)(1 << bit);
    }
  assert_true(brg__ct_equal(a, b, 0));
}

static void expect_refused(const char *hex, const char *needle) {
  uint8_t out[16];
  char why[200] = "";
  if (brg__secret_parse(hex, out, why, sizeof why) == 0)
    fail_msg("BRIGADE_SECRET=\"%s\" was taken", hex);
  if (!strstr(why, needle))
    fail_msg("BRIGADE_SECRET=\"%s\": \"%s\" lacks \"%s\"", hex, why, needle);
}

static void test_secret_rules(void **state) {
  (void)state;
  expect_refused("00", "2 hex digits (8 bits)");
  expect_refused("abab", "4 hex digits");
  expect_refused("0123456789abcdef0123456789abcde", "odd number");
  expect_refused("0123456789abcdef0123456789abcdeg", "not hexadecimal");
  expect_refused("00000000000000000000000000000000", "repeats its first 1 bytes");
  expect_refused("0011223344556677889900112233445566778899001122334455667788990011",
                 "repeats its first 10 bytes");
  /* Two equal halves: XOR-folding them once gave a secret of zeros. */
  expect_refused("3f9a0c47e1b2d85a6c0e9f1374b2a8d53f9a0c47e1b2d85a6c0e9f1374b2a8d5",
                 "repeats its first 16 bytes");
  char longer[300];
  memset(longer, '7', 258);
  longer[258] = 0;
  expect_refused(longer, "needs 32 to 256");

  /* 32 digits: the bytes themselves. */
  uint8_t out[16], want[16];
  char why[200];
  const char *s32 = "3F9A0C47e1b2d85a6c0e9f1374b2a8d5";
  assert_int_equal(brg__secret_parse(s32, out, why, sizeof why), 0);
  unhex("3f9a0c47e1b2d85a6c0e9f1374b2a8d5", want);
  assert_memory_equal(out, want, 16);
  /* A random secret whose last bytes equal its first (1 in 256 of them,
   * 1 in 65536): no piece repeats, and brigade-run's may be such. */
  assert_int_equal(brg__secret_parse("3f9a0c47e1b2d85a6c0e9f1374b2a83f", out, why, sizeof why), 0);
  assert_int_equal(brg__secret_parse("3f9a0c47e1b2d85a6c0e9f1374b23f9a", out, why, sizeof why), 0);
  /* Longer: SHA-256 of the bytes, its first 16 (not a fold: the halves
   * below XOR to zero bytes where they are equal, the hash does not). */
  const char *s64 = "3f9a0c47e1b2d85a6c0e9f1374b2a8d5c1d2e3f405162738495a6b7c8d9eafb0";
  assert_int_equal(brg__secret_parse(s64, out, why, sizeof why), 0);
  uint8_t bytes[32], d[32];
  unhex(s64, bytes);
  brg__sha256 s;
  brg__sha256_init(&s);
  brg__sha256_update(&s, bytes, 32);
  brg__sha256_final(&s, d);
  assert_memory_equal(out, d, 16);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sha256),
      cmocka_unit_test(test_hmac_rfc4231),
      cmocka_unit_test(test_ct_equal),
      cmocka_unit_test(test_secret_rules),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
