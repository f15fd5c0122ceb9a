/*
 * The bootstrap's identities on the wire: the unique id's layout and the
 * hello a rank sends to the root, with the limits every reader checks.
 * Built and checked by bootstrap_wire.c; used by the ranks (bootstrap.c)
 * and the root (bootstrap_root.c).
 */
#ifndef BRG_BOOTSTRAP_ID_H
#define BRG_BOOTSTRAP_ID_H

#include <stddef.h>
#include <stdint.h>
#include "brigade.h"
#include "log.h"

#define BRG__BOOT_MAGIC 0x42524731u /* "BRG1" */
#define BRG__BOOT_MAX_RANKS 65536
#define BRG__BOOT_MAX_BLOB 1024
#define BRG__BOOT_MAX_MSG 4096 /* largest ring-socket message payload */

/* The layout of brg_unique_id's bytes. */
typedef struct brg__boot_id {
  uint32_t magic;
  uint32_t version;
  uint8_t secret[16];
  char addr[64]; /* numeric IPv4 or IPv6 address of the root, NUL-terminated */
  uint16_t port; /* host byte order */
  uint16_t pad;
  uint32_t checksum; /* over all bytes before it */
} brg__boot_id;

/* Builds an id for a root listening at addr:port with a fresh secret from
 * getrandom (or the given one when `secret` is not NULL). */
brg_status brg__boot_id_make(brg__boot_id *id, const char *addr, uint16_t port,
                             const uint8_t *secret, brg__errbuf *err);
/* Checks magic, version, checksum and the address string. */
brg_status brg__boot_id_check(const brg__boot_id *id, brg__errbuf *err);

/* Wire encoding of the hello a rank sends to the root, exposed for tests.
 * encode returns the number of bytes written (0 when `cap` is too small);
 * decode checks every field and length and fills `h` (blob points into buf). */
typedef struct brg__boot_hello {
  uint32_t magic;
  uint8_t proof[16]; /* bootstrap_wire.h: written by brg__boot_sign after encoding */
  int32_t rank, nranks;
  char addr[64]; /* ring listener of this rank */
  uint16_t port;
  uint32_t blob_bytes;
  int32_t pid;       /* of the process that claims the rank, for messages */
  char host[64];     /* its host name, NUL-terminated, for messages */
  uint8_t nonce[16]; /* the rank's, for the tag of the root's answers */
  const void *blob;
} brg__boot_hello;
size_t brg__boot_hello_encode(const brg__boot_hello *h, void *buf, size_t cap);
brg_status brg__boot_hello_decode(const void *buf, size_t len, brg__boot_hello *h,
                                  brg__errbuf *err);

#endif
