/*
 * FNV-1a hashes: cheap checksums and identities, never security (secrets
 * keep strangers out, not these).
 */
#ifndef BRG_HASH_H
#define BRG_HASH_H

#include <stddef.h>
#include <stdint.h>

#define BRG__FNV64_INIT 14695981039346656037ull
#define BRG__FNV32_INIT 2166136261u

/* Folds n bytes at p into h (start from BRG__FNV64_INIT). */
static inline uint64_t brg__fnv1a64(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

static inline uint32_t brg__fnv1a32(const void *p, size_t n) {
  const unsigned char *b = p;
  uint32_t h = BRG__FNV32_INIT;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 16777619u;
  return h;
}

#endif
