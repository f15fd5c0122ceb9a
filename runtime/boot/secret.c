/* SHA-256, HMAC-SHA-256 and BRIGADE_SECRET's rules (secret.h). */
#include "secret.h"

#include <stdio.h>
#include <string.h>

static const uint32_t sha_k[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

static uint32_t ror(uint32_t x, int n) {
  return (x >> n) | (x << (32 - n));
}

static void sha_block(uint32_t h[8], const uint8_t *p) {
  uint32_t w[64];
  for (int i = 0; i < 16; i++)
    w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 |
           p[4 * i + 3];
  for (int i = 16; i < 64; i++) {
    uint32_t s0 = ror(w[i - 15], 7) ^ ror(w[i - 15], 18) ^ (w[i - 15] >> 3);
    uint32_t s1 = ror(w[i - 2], 17) ^ ror(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
  for (int i = 0; i < 64; i++) {
    uint32_t t1 =
        k + (ror(e, 6) ^ ror(e, 11) ^ ror(e, 25)) + ((e & f) ^ (~e & g)) + sha_k[i] + w[i];
    uint32_t t2 = (ror(a, 2) ^ ror(a, 13) ^ ror(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
    k = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  h[0] += a;
  h[1] += b;
  h[2] += c;
  h[3] += d;
  h[4] += e;
  h[5] += f;
  h[6] += g;
  h[7] += k;
}

void brg__sha256_init(brg__sha256 *s) {
  static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  memcpy(s->h, h0, sizeof h0);
  s->bytes = 0;
  s->have = 0;
}

void brg__sha256_update(brg__sha256 *s, const void *data, size_t len) {
  const uint8_t *p = data;
  s->bytes += len;
  while (len > 0) {
    size_t take = 64 - s->have < len ? 64 - s->have : len;
    memcpy(s->buf + s->have, p, take);
    s->have += take;
    p += take;
    len -= take;
    if (s->have == 64) {
      sha_block(s->h, s->buf);
      s->have = 0;
    }
  }
}

void brg__sha256_final(brg__sha256 *s, uint8_t out[BRG__SHA256_BYTES]) {
  uint64_t bits = s->bytes * 8;
  uint8_t pad = 0x80;
  brg__sha256_update(s, &pad, 1);
  pad = 0;
  while (s->have != 56) brg__sha256_update(s, &pad, 1);
  uint8_t len[8];
  for (int i = 0; i < 8; i++) len[i] = (uint8_t)(bits >> (56 - 8 * i));
  brg__sha256_update(s, len, 8);
  for (int i = 0; i < 8; i++)
    for (int j = 0; j < 4; j++) out[4 * i + j] = (uint8_t)(s->h[i] >> (24 - 8 * j));
  memset(s, 0, sizeof *s);
}

void brg__hmac_sha256(const uint8_t *key, size_t key_len, const void *a, size_t a_len,
                      const void *b, size_t b_len, const void *c, size_t c_len,
                      uint8_t out[BRG__SHA256_BYTES]) {
  uint8_t k[64], pad[64], inner[BRG__SHA256_BYTES];
  brg__sha256 s;
  memset(k, 0, sizeof k);
  if (key_len > sizeof k) {
    brg__sha256_init(&s);
    brg__sha256_update(&s, key, key_len);
    brg__sha256_final(&s, k);
  } else if (key_len) {
    memcpy(k, key, key_len);
  }
  for (int i = 0; i < 64; i++) pad[i] = k[i] ^ 0x36;
  brg__sha256_init(&s);
  brg__sha256_update(&s, pad, 64);
  if (a) brg__sha256_update(&s, a, a_len);
  if (b) brg__sha256_update(&s, b, b_len);
  if (c) brg__sha256_update(&s, c, c_len);
  brg__sha256_final(&s, inner);
  for (int i = 0; i < 64; i++) pad[i] = k[i] ^ 0x5c;
  brg__sha256_init(&s);
  brg__sha256_update(&s, pad, 64);
  brg__sha256_update(&s, inner, sizeof inner);
  brg__sha256_final(&s, out);
  memset(k, 0, sizeof k);
  memset(pad, 0, sizeof pad);
}

int brg__ct_equal(const void *x, const void *y, size_t n) {
  const volatile uint8_t *a = x, *b = y;
  uint8_t d = 0;
  for (size_t i = 0; i < n; i++) d |= a[i] ^ b[i];
  return d == 0;
}

static int hexval(char ch) {
  if (ch >= '0' && ch <= '9') return ch - '0';
  if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
  if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
  return -1;
}

int brg__hex_bytes(const char *hex, uint8_t *out, size_t n) {
  for (size_t i = 0; i < n; i++) {
    int hi = hexval(hex[2 * i]), lo = hi < 0 ? -1 : hexval(hex[2 * i + 1]);
    if (lo < 0) return -1;
    out[i] = (uint8_t)(hi << 4 | lo);
  }
  return 0;
}

int brg__secret_parse(const char *hex, uint8_t out[16], char *why, size_t why_bytes) {
  uint8_t bytes[128];
  size_t n = strlen(hex);
  for (size_t i = 0; i < n; i++)
    if (hexval(hex[i]) < 0) {
      snprintf(why, why_bytes, "is not hexadecimal (character %zu)", i + 1);
      return -1;
    }
  if (n % 2) {
    snprintf(why, why_bytes, "has an odd number of hex digits (%zu)", n);
    return -1;
  }
  if (n < 32 || n > 2 * sizeof bytes) {
    snprintf(why, why_bytes,
             "has %zu hex digits (%zu bits): it needs 32 to %zu (128 bits at least; e.g. "
             "od -An -N16 -tx1 /dev/urandom | tr -d ' \\n')",
             n, 4 * n, 2 * sizeof bytes);
    return -1;
  }
  size_t len = n / 2;
  brg__hex_bytes(hex, bytes, len); /* every digit was checked above */
  /* A piece repeated over the whole (twice at least): such a secret holds
   * no more than that piece. Longer periods are left alone: a random
   * secret has one of them as often as its last byte equals its first
   * (1 in 256), and must never be refused. */
  for (size_t p = 1; 2 * p <= len; p++) {
    size_t i = p;
    while (i < len && bytes[i] == bytes[i - p]) i++;
    if (i == len) {
      snprintf(why, why_bytes,
               "repeats its first %zu bytes over all %zu: a repeated pattern is no random "
               "secret (it holds at most %zu bits); use random bytes",
               p, len, 8 * p);
      return -1;
    }
  }
  if (len == 16) {
    memcpy(out, bytes, 16);
  } else {
    uint8_t d[BRG__SHA256_BYTES];
    brg__sha256 s;
    brg__sha256_init(&s);
    brg__sha256_update(&s, bytes, len);
    brg__sha256_final(&s, d);
    memcpy(out, d, 16);
  }
  return 0;
}
