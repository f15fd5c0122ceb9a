/* Bootstrap messages: the unique id, the hello, the root's error answer
 * (layouts in bootstrap_wire.h). Every length read is checked before use. */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <limits.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "bootstrap_wire.h"
#include "clock.h"
#include "hash.h"
#include "secret.h"
#include "settings.h"

brg_status brg__boot_random(uint8_t *out, size_t len, brg__errbuf *err) {
  size_t done = 0;
  while (done < len) {
    ssize_t n = getrandom(out + done, len - done, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return brg__error(err, BRG_ERR_SYSTEM, BOOT_SUBSYS, "getrandom: %s", strerror(errno));
    }
    done += (size_t)n;
  }
  return BRG_SUCCESS;
}

/* ------------------------------------------------ challenge and response */

brg_status brg__boot_challenge_make(uint8_t m[BOOT_CHALLENGE_BYTES], uint8_t *nonce,
                                    const uint8_t *fixed_nonce, brg__errbuf *err) {
  boot_put_u32(m, BOOT_CHALLENGE_MAGIC);
  boot_put_u32(m + 4, BOOT_VERSION);
  if (fixed_nonce) {
    memcpy(m + 8, fixed_nonce, BOOT_NONCE_BYTES);
  } else {
    brg_status st = brg__boot_random(m + 8, BOOT_NONCE_BYTES, err);
    if (st != BRG_SUCCESS) return st;
  }
  memcpy(nonce, m + 8, BOOT_NONCE_BYTES);
  return BRG_SUCCESS;
}

int brg__boot_challenge_read(int fd, uint8_t *nonce, int64_t deadline, const char **why) {
  uint8_t m[BOOT_CHALLENGE_BYTES];
  int rc = brg__sock_recv_all(fd, m, sizeof m, deadline);
  if (rc != BRG__IO_OK) return rc;
  if (boot_get_u32(m) != BOOT_CHALLENGE_MAGIC) {
    *why = "what it sent first is not a brigade challenge";
    return BRG__IO_ERR;
  }
  if (boot_get_u32(m + 4) != BOOT_VERSION) {
    *why = boot_get_u32(m + 4) < BOOT_VERSION
               ? "it runs an older brigade (its bootstrap challenge is of an earlier version)"
               : "it runs a newer brigade (its bootstrap challenge is of a later version)";
    return BRG__IO_ERR;
  }
  memcpy(nonce, m + 8, BOOT_NONCE_BYTES);
  return BRG__IO_OK;
}

static void boot_proof(uint8_t *out, const uint8_t *msg, size_t len, const uint8_t *secret,
                       const uint8_t *nonce) {
  static const uint8_t zero[BOOT_SECRET_BYTES];
  uint8_t head[BOOT_NONCE_BYTES + 4], mac[BRG__SHA256_BYTES];
  memcpy(head, nonce, BOOT_NONCE_BYTES);
  memcpy(head + BOOT_NONCE_BYTES, msg, 4);
  brg__hmac_sha256(secret, BOOT_SECRET_BYTES, head, sizeof head, zero, sizeof zero, msg + 20,
                   len - 20, mac);
  memcpy(out, mac, BOOT_SECRET_BYTES);
}

void brg__boot_sign(uint8_t *msg, size_t len, const uint8_t *secret, const uint8_t *nonce) {
  boot_proof(msg + 4, msg, len, secret, nonce);
}

int brg__boot_verify(const uint8_t *msg, size_t len, const uint8_t *secret, const uint8_t *nonce) {
  uint8_t want[BOOT_SECRET_BYTES];
  if (len < 20) return 0;
  boot_proof(want, msg, len, secret, nonce);
  return brg__ct_equal(want, msg + 4, BOOT_SECRET_BYTES);
}

int brg__boot_peer_hello_check(const uint8_t *m, uint32_t magic, const uint8_t *secret,
                               const uint8_t *challenge, int32_t *from, int32_t *to,
                               const char **why) {
  if (boot_get_u32(m) != magic) {
    *why = magic == BOOT_TREE_MAGIC ? "not a brigade tree connection"
                                    : "not a brigade ring connection";
    return 0;
  }
  if (!brg__boot_verify(m, BOOT_RING_HELLO, secret, challenge)) {
    *why = "no proof of the job's secret";
    return 0;
  }
  *from = (int32_t)boot_get_u32(m + 20);
  *to = (int32_t)boot_get_u32(m + 24);
  return 1;
}

void brg__boot_answer_tag(uint8_t *tag, const uint8_t *secret, const uint8_t *nonce) {
  uint8_t mac[BRG__SHA256_BYTES];
  brg__hmac_sha256(secret, BOOT_SECRET_BYTES, "BRGT", 4, nonce, BOOT_NONCE_BYTES, NULL, 0, mac);
  memcpy(tag, mac, BOOT_SECRET_BYTES);
}

/* --------------------------------------------------------------------- id */

brg_status brg__boot_id_make(brg__boot_id *id, const char *addr, uint16_t port,
                             const uint8_t *secret, brg__errbuf *err) {
  if (!id || !addr)
    return brg__error(err, BRG_ERR_INVALID_ARGUMENT, BOOT_SUBSYS, "unique id: NULL argument");
  size_t n = strnlen(addr, BOOT_ADDR_BYTES);
  if (n == 0 || n >= BOOT_ADDR_BYTES || !brg__sock_addr_is_numeric(addr))
    return brg__error(err, BRG_ERR_INVALID_ARGUMENT, BOOT_SUBSYS,
                      "unique id: root address '%.63s' is not a numeric IPv4 or IPv6 address",
                      addr);
  if (port == 0)
    return brg__error(err, BRG_ERR_INVALID_ARGUMENT, BOOT_SUBSYS, "unique id: root port is 0");

  brg__boot_id tmp;
  memset(&tmp, 0, sizeof tmp);
  tmp.magic = BRG__BOOT_MAGIC;
  tmp.version = BOOT_VERSION;
  if (secret) {
    memcpy(tmp.secret, secret, sizeof tmp.secret);
  } else {
    brg_status st = brg__boot_random(tmp.secret, sizeof tmp.secret, err);
    if (st != BRG_SUCCESS) return st;
  }
  memcpy(tmp.addr, addr, n);
  tmp.port = port;
  tmp.checksum = brg__fnv1a32(&tmp, offsetof(brg__boot_id, checksum));
  *id = tmp;
  return BRG_SUCCESS;
}

brg_status brg__boot_id_check(const brg__boot_id *id, brg__errbuf *err) {
  static const char bad[] = "the unique id is corrupted or not a brigade id";
  if (!id) return brg__error(err, BRG_ERR_INVALID_ARGUMENT, BOOT_SUBSYS, "unique id is NULL");
  if (id->magic != BRG__BOOT_MAGIC)
    return brg__error(err, BRG_ERR_INVALID_ARGUMENT, BOOT_SUBSYS,
                      "%s (magic 0x%08x, expected 0x%08x)", bad, id->magic, BRG__BOOT_MAGIC);
  if (id->version != BOOT_VERSION)
    return brg__error(err, BRG_ERR_INVALID_ARGUMENT, BOOT_SUBSYS,
                      "%s (version %u; this library reads version %u)", bad, id->version,
                      BOOT_VERSION);
  uint32_t sum = brg__fnv1a32(id, offsetof(brg__boot_id, checksum));
  if (sum != id->checksum)
    return brg__error(err, BRG_ERR_INVALID_ARGUMENT, BOOT_SUBSYS,
                      "%s (checksum 0x%08x, computed 0x%08x)", bad, id->checksum, sum);
  if (!memchr(id->addr, '\0', sizeof id->addr))
    return brg__error(err, BRG_ERR_INVALID_ARGUMENT, BOOT_SUBSYS,
                      "%s (root address not terminated)", bad);
  if (!brg__sock_addr_is_numeric(id->addr))
    return brg__error(err, BRG_ERR_INVALID_ARGUMENT, BOOT_SUBSYS,
                      "%s (root address '%s' is not numeric)", bad, id->addr);
  if (id->port == 0)
    return brg__error(err, BRG_ERR_INVALID_ARGUMENT, BOOT_SUBSYS, "%s (root port 0)", bad);
  return BRG_SUCCESS;
}

/* ------------------------------------------------------------------ hello */

size_t brg__boot_hello_encode(const brg__boot_hello *h, void *buf, size_t cap) {
  if (!h || !buf || h->blob_bytes > BRG__BOOT_MAX_BLOB || (h->blob_bytes && !h->blob)) return 0;
  size_t alen = strnlen(h->addr, BOOT_ADDR_BYTES);
  if (alen >= BOOT_ADDR_BYTES) return 0;
  size_t total = BOOT_HELLO_HDR + (size_t)h->blob_bytes;
  if (cap < total) return 0;
  uint8_t *p = buf;
  boot_put_u32(p, h->magic);
  memcpy(p + 4, h->proof, BOOT_SECRET_BYTES);
  boot_put_u32(p + 20, (uint32_t)h->rank);
  boot_put_u32(p + 24, (uint32_t)h->nranks);
  memset(p + 28, 0, BOOT_ADDR_BYTES);
  memcpy(p + 28, h->addr, alen);
  boot_put_u16(p + 92, h->port);
  boot_put_u16(p + 94, 0);
  boot_put_u32(p + 96, h->blob_bytes);
  boot_put_u32(p + 100, (uint32_t)h->pid);
  memset(p + 104, 0, BOOT_HOST_BYTES);
  memcpy(p + 104, h->host, strnlen(h->host, BOOT_HOST_BYTES - 1));
  memcpy(p + BOOT_HELLO_NONCE, h->nonce, BOOT_NONCE_BYTES);
  if (h->blob_bytes) memcpy(p + BOOT_HELLO_HDR, h->blob, h->blob_bytes);
  return total;
}

/* Decodes without logging; the root reports refusals its own way. */
brg_status brg__boot_hello_parse(const void *buf, size_t len, brg__boot_hello *h,
                                 brg__errbuf *why) {
  const uint8_t *p = buf;
  if (len < BOOT_HELLO_HDR)
    return brg__error_quiet(why, BRG_ERR_REMOTE,
                            "hello of %zu bytes is shorter than its %d-byte header", len,
                            BOOT_HELLO_HDR);
  brg__boot_hello t;
  memset(&t, 0, sizeof t);
  t.magic = boot_get_u32(p);
  if (t.magic != BRG__BOOT_MAGIC)
    return brg__error_quiet(why, BRG_ERR_REMOTE, "not a brigade hello (magic 0x%08x)", t.magic);
  memcpy(t.proof, p + 4, BOOT_SECRET_BYTES);
  memcpy(t.nonce, p + BOOT_HELLO_NONCE, BOOT_NONCE_BYTES);
  t.rank = (int32_t)boot_get_u32(p + 20);
  t.nranks = (int32_t)boot_get_u32(p + 24);
  memcpy(t.addr, p + 28, BOOT_ADDR_BYTES);
  t.port = boot_get_u16(p + 92);
  uint16_t zero = boot_get_u16(p + 94);
  t.blob_bytes = boot_get_u32(p + 96);
  t.pid = (int32_t)boot_get_u32(p + 100);
  memcpy(t.host, p + 104, BOOT_HOST_BYTES);
  if (t.blob_bytes > BRG__BOOT_MAX_BLOB)
    return brg__error_quiet(why, BRG_ERR_REMOTE, "hello carries a %u-byte blob (at most %d)",
                            t.blob_bytes, BRG__BOOT_MAX_BLOB);
  if (len != BOOT_HELLO_HDR + (size_t)t.blob_bytes)
    return brg__error_quiet(why, BRG_ERR_REMOTE,
                            "hello of %zu bytes does not match its header (%d) plus blob (%u)", len,
                            BOOT_HELLO_HDR, t.blob_bytes);
  if (t.nranks < 1 || t.nranks > BRG__BOOT_MAX_RANKS)
    return brg__error_quiet(why, BRG_ERR_REMOTE, "hello says nranks=%d (must be 1..%d)",
                            (int)t.nranks, BRG__BOOT_MAX_RANKS);
  if (t.rank < 0 || t.rank >= t.nranks)
    return brg__error_quiet(why, BRG_ERR_REMOTE, "hello says rank %d of nranks=%d", (int)t.rank,
                            (int)t.nranks);
  if (zero != 0)
    return brg__error_quiet(why, BRG_ERR_REMOTE, "rank %d's hello has a nonzero reserved field",
                            (int)t.rank);
  if (!memchr(t.addr, '\0', BOOT_ADDR_BYTES))
    return brg__error_quiet(why, BRG_ERR_REMOTE, "rank %d's hello has an unterminated address",
                            (int)t.rank);
  if (!brg__sock_addr_is_numeric(t.addr))
    return brg__error_quiet(why, BRG_ERR_REMOTE, "rank %d's hello has a bad address '%s'",
                            (int)t.rank, t.addr);
  if (t.port == 0)
    return brg__error_quiet(why, BRG_ERR_REMOTE, "rank %d's hello has port 0", (int)t.rank);
  if (!memchr(t.host, '\0', BOOT_HOST_BYTES))
    return brg__error_quiet(why, BRG_ERR_REMOTE, "rank %d's hello has an unterminated host name",
                            (int)t.rank);
  for (char *c = t.host; *c; c++) /* printed in other ranks' messages */
    if (*c < 0x21 || *c > 0x7e) *c = '?';
  t.blob = t.blob_bytes ? p + BOOT_HELLO_HDR : NULL;
  *h = t;
  return BRG_SUCCESS;
}

brg_status brg__boot_hello_decode(const void *buf, size_t len, brg__boot_hello *h,
                                  brg__errbuf *err) {
  if (!buf || !h)
    return brg__error(err, BRG_ERR_INVALID_ARGUMENT, BOOT_SUBSYS, "hello decode: NULL argument");
  brg__errbuf why;
  brg_status st = brg__boot_hello_parse(buf, len, h, &why);
  if (st != BRG_SUCCESS) return brg__error(err, st, BOOT_SUBSYS, "%s", why.msg);
  return BRG_SUCCESS;
}

/* Builds the root's error answer into buf (BOOT_REPLY_HDR + BOOT_MAX_ERRTEXT
 * bytes) and returns its length. */
size_t brg__boot_reply_error(uint8_t *buf, const uint8_t *tag, brg_status st, const char *text) {
  size_t n = strnlen(text, BOOT_MAX_ERRTEXT);
  boot_put_u32(buf, BOOT_TABLE_MAGIC);
  memcpy(buf + 4, tag, BOOT_SECRET_BYTES);
  boot_put_u32(buf + 20, (uint32_t)st);
  boot_put_u32(buf + 24, (uint32_t)n);
  memcpy(buf + BOOT_REPLY_HDR, text, n);
  return BOOT_REPLY_HDR + n;
}
