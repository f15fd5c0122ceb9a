/*
 * The job secret and what proves it: SHA-256 and HMAC-SHA-256 (FIPS 180-4,
 * RFC 2104), the rules a BRIGADE_SECRET must meet, and a comparison whose
 * time does not depend on where two byte strings first differ.
 */
#ifndef BRG_SECRET_H
#define BRG_SECRET_H

#include <stddef.h>
#include <stdint.h>

#define BRG__SHA256_BYTES 32

typedef struct brg__sha256 {
  uint32_t h[8];
  uint64_t bytes;
  uint8_t buf[64];
  size_t have;
} brg__sha256;

void brg__sha256_init(brg__sha256 *s);
void brg__sha256_update(brg__sha256 *s, const void *data, size_t len);
void brg__sha256_final(brg__sha256 *s, uint8_t out[BRG__SHA256_BYTES]);

/* HMAC-SHA-256 of the concatenation of up to three pieces (NULL pieces
 * skipped). */
void brg__hmac_sha256(const uint8_t *key, size_t key_len, const void *a, size_t a_len,
                      const void *b, size_t b_len, const void *c, size_t c_len,
                      uint8_t out[BRG__SHA256_BYTES]);

/* 1 when the n bytes are equal, in time that depends on n only. */
int brg__ct_equal(const void *x, const void *y, size_t n);

/* BRIGADE_SECRET's rules: hex digits, at least 32 of them (128 bits), at
 * most 256, and no pattern repeated over the whole (00..., abab..., two
 * equal halves), which would hold fewer bits than its length says. The 16
 * bytes of a 32-digit secret are the secret; a longer one is hashed to 16
 * (SHA-256, its first 16 bytes), never folded. 0, or -1 with the reason in
 * `why` (a phrase that follows the variable's name). */
int brg__secret_parse(const char *hex, uint8_t out[16], char *why, size_t why_bytes);
/* The n bytes of 2n hex digits (either case) into out: 0, or -1 at a
 * character that is not a hex digit (out then partly written). */
int brg__hex_bytes(const char *hex, uint8_t *out, size_t n);

#endif
