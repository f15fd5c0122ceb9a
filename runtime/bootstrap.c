/*
 * Bootstrap: the unique id, the root thread that gathers one hello per rank
 * and answers with the table of all ranks, and the ring sockets.
 *
 * Wire layouts (all integers little-endian, offsets in bytes):
 *
 *   hello, rank -> root: 100 bytes, then the blob
 *     0 u32 magic   4 secret[16]   20 i32 rank   24 i32 nranks   28 addr[64]
 *     92 u16 port   94 u16 zero    96 u32 blob_bytes             100 blob
 *
 *   reply, root -> rank: 28 bytes, then the payload
 *     0 u32 magic "BRGT"   4 secret[16]   20 u32 status   24 u32 payload bytes
 *     status 0: u32 nranks, u32 blob_bytes, then per rank in rank order
 *               addr[64], u16 port, u16 zero, blob
 *     else:     the error text (no NUL), at most BOOT_MAX_ERRTEXT bytes
 *
 *   ring hello, connector -> acceptor: 28 bytes
 *     0 u32 magic "BRGR"   4 secret[16]   20 i32 from_rank   24 i32 to_rank
 *
 *   ring message: u32 type, u32 len (<= BRG__BOOT_MAX_MSG), payload
 *
 * Every socket is non-blocking and every wait is a poll() with a deadline, so
 * no peer (dead, silent or hostile) can hold a thread forever. Every send uses
 * MSG_NOSIGNAL so a vanished peer is an error code, never a SIGPIPE.
 */
#include "bootstrap.h"

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

#include "clock.h"
#include "settings.h"
#include "hash.h"
#include "sock.h"

#define BOOT_SUBSYS "bootstrap"
#define BOOT_VERSION 1u
#define BOOT_TABLE_MAGIC 0x42524754u /* "BRGT" */
#define BOOT_RING_MAGIC 0x42524752u  /* "BRGR" */

#define BOOT_SECRET_BYTES 16
#define BOOT_ADDR_BYTES 64
#define BOOT_HELLO_HDR 100
#define BOOT_REPLY_HDR 28
#define BOOT_TABLE_HDR 8  /* nranks, blob_bytes */
#define BOOT_ENTRY_HDR 68 /* addr, port, zero */
#define BOOT_RING_HELLO 28
#define BOOT_FRAME_HDR 8
#define BOOT_MAX_ERRTEXT 1024

#define BOOT_CONN_TIMEOUT_MS 2000 /* an accepted connection has this long to say who it is */
#define BOOT_DRAIN_MS 1000        /* a refused one this long to read our answer and hang up */
#define BOOT_REPLY_SEND_MS 500    /* sending a short error answer */
#define BOOT_TABLE_SEND_MS 10000  /* sending the table to one rank */
#define BOOT_RETRY_MS 50          /* between connection attempts while nobody listens */
#define BOOT_MAX_PENDING 256      /* accepted connections that have not said who they are */
#define BOOT_BACKLOG 4096         /* the kernel caps it at somaxconn */
#define BOOT_PEER_LEN BRG__HOSTPORT_LEN

_Static_assert(sizeof(brg__boot_id) <= sizeof(brg_unique_id),
               "the bootstrap id must fit in brg_unique_id");
_Static_assert(offsetof(brg__boot_id, checksum) + sizeof(uint32_t) == sizeof(brg__boot_id),
               "the checksum must be the last field of the id");
_Static_assert(sizeof(((brg__boot_id *)0)->addr) == BOOT_ADDR_BYTES, "addr size");
_Static_assert(sizeof(((brg__boot_hello *)0)->addr) == BOOT_ADDR_BYTES, "addr size");
_Static_assert(sizeof(((brg__boot_id *)0)->secret) == BOOT_SECRET_BYTES, "secret size");


/* ---------------------------------------------------------------- helpers */

static void put_u16(uint8_t *p, uint16_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
}
static void put_u32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint16_t get_u16(const uint8_t *p) {
  return (uint16_t)(p[0] | (p[1] << 8));
}
static uint32_t get_u32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static brg_status boot_random(uint8_t *out, size_t len, brg__errbuf *err) {
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
    brg_status st = boot_random(tmp.secret, sizeof tmp.secret, err);
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
  put_u32(p, h->magic);
  memcpy(p + 4, h->secret, BOOT_SECRET_BYTES);
  put_u32(p + 20, (uint32_t)h->rank);
  put_u32(p + 24, (uint32_t)h->nranks);
  memset(p + 28, 0, BOOT_ADDR_BYTES);
  memcpy(p + 28, h->addr, alen);
  put_u16(p + 92, h->port);
  put_u16(p + 94, 0);
  put_u32(p + 96, h->blob_bytes);
  if (h->blob_bytes) memcpy(p + BOOT_HELLO_HDR, h->blob, h->blob_bytes);
  return total;
}

/* Decodes without logging; the root reports refusals its own way. */
static brg_status boot_hello_parse(const void *buf, size_t len, brg__boot_hello *h,
                                   brg__errbuf *why) {
  const uint8_t *p = buf;
  if (len < BOOT_HELLO_HDR)
    return brg__error_quiet(why, BRG_ERR_REMOTE, "hello of %zu bytes is shorter than its %d-byte header",
                      len, BOOT_HELLO_HDR);
  brg__boot_hello t;
  memset(&t, 0, sizeof t);
  t.magic = get_u32(p);
  if (t.magic != BRG__BOOT_MAGIC)
    return brg__error_quiet(why, BRG_ERR_REMOTE, "not a brigade hello (magic 0x%08x)", t.magic);
  memcpy(t.secret, p + 4, BOOT_SECRET_BYTES);
  t.rank = (int32_t)get_u32(p + 20);
  t.nranks = (int32_t)get_u32(p + 24);
  memcpy(t.addr, p + 28, BOOT_ADDR_BYTES);
  t.port = get_u16(p + 92);
  uint16_t zero = get_u16(p + 94);
  t.blob_bytes = get_u32(p + 96);
  if (t.blob_bytes > BRG__BOOT_MAX_BLOB)
    return brg__error_quiet(why, BRG_ERR_REMOTE, "hello carries a %u-byte blob (at most %d)",
                      t.blob_bytes, BRG__BOOT_MAX_BLOB);
  if (len != BOOT_HELLO_HDR + (size_t)t.blob_bytes)
    return brg__error_quiet(why, BRG_ERR_REMOTE,
                      "hello of %zu bytes does not match its header (%d) plus blob (%u)", len,
                      BOOT_HELLO_HDR, t.blob_bytes);
  if (t.nranks < 1 || t.nranks > BRG__BOOT_MAX_RANKS)
    return brg__error_quiet(why, BRG_ERR_REMOTE, "hello says nranks=%d (must be 1..%d)", (int)t.nranks,
                      BRG__BOOT_MAX_RANKS);
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
    return brg__error_quiet(why, BRG_ERR_REMOTE, "rank %d's hello has a bad address '%s'", (int)t.rank,
                      t.addr);
  if (t.port == 0)
    return brg__error_quiet(why, BRG_ERR_REMOTE, "rank %d's hello has port 0", (int)t.rank);
  t.blob = t.blob_bytes ? p + BOOT_HELLO_HDR : NULL;
  *h = t;
  return BRG_SUCCESS;
}

brg_status brg__boot_hello_decode(const void *buf, size_t len, brg__boot_hello *h,
                                  brg__errbuf *err) {
  if (!buf || !h)
    return brg__error(err, BRG_ERR_INVALID_ARGUMENT, BOOT_SUBSYS, "hello decode: NULL argument");
  brg__errbuf why;
  brg_status st = boot_hello_parse(buf, len, h, &why);
  if (st != BRG_SUCCESS) return brg__error(err, st, BOOT_SUBSYS, "%s", why.msg);
  return BRG_SUCCESS;
}

/* Builds the root's error answer into buf (BOOT_REPLY_HDR + BOOT_MAX_ERRTEXT
 * bytes) and returns its length. */
static size_t boot_reply_error(uint8_t *buf, const uint8_t *secret, brg_status st,
                               const char *text) {
  size_t n = strnlen(text, BOOT_MAX_ERRTEXT);
  put_u32(buf, BOOT_TABLE_MAGIC);
  memcpy(buf + 4, secret, BOOT_SECRET_BYTES);
  put_u32(buf + 20, (uint32_t)st);
  put_u32(buf + 24, (uint32_t)n);
  memcpy(buf + BOOT_REPLY_HDR, text, n);
  return BOOT_REPLY_HDR + n;
}

/* ------------------------------------------------------------------- root */

/*
 * One thread, one poll loop. Connections that have not yet sent a complete
 * hello sit in `conns` with a deadline; a complete, accepted hello moves its
 * socket to rank_fd[rank] and its fields into the reply table, which is
 * built in place so that sending it at the end is one write per rank.
 */
typedef struct boot_conn {
  int fd;
  int draining;     /* refused: read and discard until the peer hangs up */
  int64_t deadline; /* dropped when it passes */
  uint32_t have, want;
  char peer[BOOT_PEER_LEN];
  uint8_t buf[BOOT_HELLO_HDR + BRG__BOOT_MAX_BLOB];
} boot_conn;

typedef struct boot_root {
  int lfd;
  uint8_t secret[BOOT_SECRET_BYTES];
  char where[BOOT_PEER_LEN];
  int timeout_ms;
  int64_t deadline;
  boot_conn *conns[BOOT_MAX_PENDING];
  int nconns;
  int32_t nranks; /* 0 until the first accepted hello sets it */
  int32_t first_rank;
  uint32_t blob_bytes;
  int32_t arrived;
  int *rank_fd;
  uint8_t *table;
  size_t table_bytes;
} boot_root;

static uint8_t *boot_root_entry(boot_root *r, int rank) {
  size_t entry = BOOT_ENTRY_HDR + (size_t)r->blob_bytes;
  return r->table + BOOT_REPLY_HDR + BOOT_TABLE_HDR + (size_t)rank * entry;
}

static void boot_conn_drop(boot_root *r, int i) {
  brg__sock_close(&r->conns[i]->fd);
  free(r->conns[i]);
  r->conns[i] = NULL; /* compacted after the pass, so accept order is kept */
}

/* Tells a peer that proved it belongs to this job why it was refused, then
 * waits for it to hang up, so that closing does not reset the answer away. */
static void boot_conn_refuse(boot_root *r, int i, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void boot_conn_refuse(boot_root *r, int i, const char *fmt, ...) {
  boot_conn *c = r->conns[i];
  char text[BOOT_MAX_ERRTEXT];
  uint8_t buf[BOOT_REPLY_HDR + BOOT_MAX_ERRTEXT];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  BRG__WARN(BOOT_SUBSYS, "bootstrap root %s: refused the connection from %s: %s", r->where, c->peer,
            text);
  size_t n = boot_reply_error(buf, r->secret, BRG_ERR_REMOTE, text);
  (void)brg__sock_send_all(c->fd, buf, n, brg__now_ms() + BOOT_REPLY_SEND_MS, NULL);
  shutdown(c->fd, SHUT_WR);
  c->draining = 1;
  c->deadline = brg__now_ms() + BOOT_DRAIN_MS;
}

/* Whether a rank's held connection is still there (it has nothing to send
 * us, so readability means hang-up or a protocol violation). */
static int boot_fd_alive(int fd) {
  struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
  if (poll(&p, 1, 0) <= 0) return 1;
  if (p.revents & (POLLHUP | POLLERR | POLLRDHUP | POLLNVAL)) return 0;
  uint8_t b;
  ssize_t n = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
  return n > 0 || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR));
}

static void boot_root_forget(boot_root *r, int rank, const char *why) {
  char peer[BOOT_PEER_LEN];
  brg__sock_peer_str(r->rank_fd[rank], peer, sizeof peer);
  BRG__WARN(BOOT_SUBSYS, "bootstrap root %s: rank %d (%s) %s; waiting for it to join again",
            r->where, rank, peer, why);
  brg__sock_close(&r->rank_fd[rank]);
  r->arrived--;
}

/* Takes a well-formed hello with the right secret, or refuses it. Returns 1
 * when the connection left the pending list. */
static int boot_root_admit(boot_root *r, int i, const brg__boot_hello *h) {
  boot_conn *c = r->conns[i];
  if (r->nranks == 0) {
    size_t entry = BOOT_ENTRY_HDR + (size_t)h->blob_bytes;
    size_t bytes = BOOT_REPLY_HDR + BOOT_TABLE_HDR + (size_t)h->nranks * entry;
    uint8_t *table = calloc(1, bytes);
    int *rank_fd = malloc((size_t)h->nranks * sizeof *rank_fd);
    if (!table || !rank_fd) {
      free(table);
      free(rank_fd);
      boot_conn_refuse(r, i, "the bootstrap root has no memory for a table of %d ranks",
                       (int)h->nranks);
      return 0;
    }
    for (int k = 0; k < h->nranks; k++) rank_fd[k] = -1;
    put_u32(table, BOOT_TABLE_MAGIC);
    memcpy(table + 4, r->secret, BOOT_SECRET_BYTES);
    put_u32(table + 20, BRG_SUCCESS);
    put_u32(table + 24, (uint32_t)(bytes - BOOT_REPLY_HDR));
    put_u32(table + BOOT_REPLY_HDR, (uint32_t)h->nranks);
    put_u32(table + BOOT_REPLY_HDR + 4, h->blob_bytes);
    r->table = table;
    r->table_bytes = bytes;
    r->rank_fd = rank_fd;
    r->nranks = h->nranks;
    r->blob_bytes = h->blob_bytes;
    r->first_rank = h->rank;
  } else if (h->nranks != r->nranks) {
    boot_conn_refuse(r, i, "rank %d says nranks=%d but rank %d said %d", (int)h->rank,
                     (int)h->nranks, (int)r->first_rank, (int)r->nranks);
    return 0;
  } else if (h->blob_bytes != r->blob_bytes) {
    boot_conn_refuse(r, i,
                     "rank %d sent a %u-byte blob but rank %d sent %u bytes (all ranks must "
                     "send the same size)",
                     (int)h->rank, h->blob_bytes, (int)r->first_rank, r->blob_bytes);
    return 0;
  } else if (r->rank_fd[h->rank] >= 0) {
    if (boot_fd_alive(r->rank_fd[h->rank])) {
      boot_conn_refuse(r, i, "rank %d joined twice (first from %s, again from %s)", (int)h->rank,
                       (const char *)boot_root_entry(r, h->rank), c->peer);
      return 0;
    }
    boot_root_forget(r, h->rank, "hung up");
  }

  uint8_t *e = boot_root_entry(r, h->rank);
  memset(e, 0, BOOT_ADDR_BYTES);
  memcpy(e, h->addr, strnlen(h->addr, BOOT_ADDR_BYTES - 1));
  put_u16(e + 64, h->port);
  put_u16(e + 66, 0);
  if (h->blob_bytes) memcpy(e + BOOT_ENTRY_HDR, h->blob, h->blob_bytes);
  r->rank_fd[h->rank] = c->fd;
  r->arrived++;
  BRG__TRACE(BOOT_SUBSYS, "bootstrap root %s: rank %d of %d arrived from %s (%d/%d)", r->where,
             (int)h->rank, (int)r->nranks, c->peer, (int)r->arrived, (int)r->nranks);
  free(c);
  r->conns[i] = NULL;
  return 1;
}

/* Reads what a pending connection has for us. Returns 1 when it left the
 * pending list. */
static int boot_conn_service(boot_root *r, int i) {
  boot_conn *c = r->conns[i];
  if (c->draining) {
    uint8_t junk[512];
    for (int k = 0; k < 16; k++) { /* bounded: a flood cannot starve the others */
      ssize_t n = recv(c->fd, junk, sizeof junk, MSG_DONTWAIT);
      if (n > 0) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
      boot_conn_drop(r, i);
      return 1;
    }
    return 0;
  }

  ssize_t n = recv(c->fd, c->buf + c->have, c->want - c->have, MSG_DONTWAIT);
  if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
    BRG__WARN(BOOT_SUBSYS,
              "bootstrap root %s: the connection from %s ended after %u bytes, before a "
              "complete hello%s%s",
              r->where, c->peer, c->have, n < 0 ? ": " : "", n < 0 ? strerror(errno) : "");
    boot_conn_drop(r, i);
    return 1;
  }
  if (n < 0) return 0;
  c->have += (uint32_t)n;
  if (c->have < c->want) return 0;

  if (c->want == BOOT_HELLO_HDR) {
    uint32_t magic = get_u32(c->buf);
    if (magic != BRG__BOOT_MAGIC) {
      BRG__WARN(BOOT_SUBSYS,
                "bootstrap root %s: dropped the connection from %s: not a brigade rank "
                "(magic 0x%08x)",
                r->where, c->peer, magic);
      boot_conn_drop(r, i);
      return 1;
    }
    if (memcmp(c->buf + 4, r->secret, BOOT_SECRET_BYTES) != 0) {
      BRG__WARN(BOOT_SUBSYS,
                "bootstrap root %s: dropped the connection from %s: wrong secret (a rank of "
                "another job, or a stale unique id?)",
                r->where, c->peer);
      boot_conn_drop(r, i);
      return 1;
    }
    uint32_t blob_bytes = get_u32(c->buf + 96);
    if (blob_bytes > BRG__BOOT_MAX_BLOB) {
      boot_conn_refuse(r, i, "hello carries a %u-byte blob (at most %d)", blob_bytes,
                       BRG__BOOT_MAX_BLOB);
      return 0;
    }
    c->want = BOOT_HELLO_HDR + blob_bytes;
    if (c->have < c->want) return 0;
  }

  brg__boot_hello h;
  brg__errbuf why;
  if (boot_hello_parse(c->buf, c->have, &h, &why) != BRG_SUCCESS) {
    boot_conn_refuse(r, i, "%s", why.msg);
    return 0;
  }
  return boot_root_admit(r, i, &h);
}

static void boot_root_accept(boot_root *r) {
  while (r->nconns < BOOT_MAX_PENDING) {
    struct sockaddr_storage ss;
    socklen_t sslen = sizeof ss;
    int fd = accept4(r->lfd, (struct sockaddr *)&ss, &sslen, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      BRG__WARN(BOOT_SUBSYS, "bootstrap root %s: accept: %s", r->where, strerror(errno));
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
        brg__sleep_ms(100); /* the backlog keeps them; do not spin */
      return;
    }
    boot_conn *c = calloc(1, sizeof *c);
    if (!c) {
      close(fd);
      BRG__WARN(BOOT_SUBSYS, "bootstrap root %s: out of memory accepting a connection", r->where);
      return;
    }
    c->fd = fd;
    c->want = BOOT_HELLO_HDR;
    c->deadline = brg__now_ms() + BOOT_CONN_TIMEOUT_MS;
    brg__sock_addr_str((struct sockaddr *)&ss, sslen, c->peer, sizeof c->peer);
    r->conns[r->nconns++] = c;
  }
}

static void boot_root_compact(boot_root *r) {
  int k = 0;
  for (int i = 0; i < r->nconns; i++)
    if (r->conns[i]) r->conns[k++] = r->conns[i];
  r->nconns = k;
}

/* Ranks that hung up after their hello are taken out again, so the table
 * never names a rank that is known to be gone. Returns how many. */
static int boot_root_prune(boot_root *r) {
  int gone = 0;
  for (int k = 0; k < r->nranks; k++) {
    if (r->rank_fd[k] >= 0 && !boot_fd_alive(r->rank_fd[k])) {
      boot_root_forget(r, k, "hung up before every rank had arrived");
      gone++;
    }
  }
  return gone;
}

static void boot_root_give_up(boot_root *r) {
  if (r->nranks == 0) {
    BRG__WARN(BOOT_SUBSYS, "bootstrap root %s: no rank arrived within %d ms; closing", r->where,
              r->timeout_ms);
    return;
  }
  char list[512];
  size_t used = 0;
  int missing = 0, listed = 0;
  list[0] = '\0';
  for (int k = 0; k < r->nranks; k++) {
    if (r->rank_fd[k] >= 0) continue;
    missing++;
    if (used + 16 < sizeof list - 32) {
      used += (size_t)snprintf(list + used, sizeof list - used, "%s%d", listed ? "," : "", k);
      listed++;
    }
  }
  if (listed < missing) snprintf(list + used, sizeof list - used, ",... (%d in all)", missing);
  char text[BOOT_MAX_ERRTEXT];
  snprintf(text, sizeof text, "%s %s never reached the bootstrap root at %s within %d ms",
           missing == 1 ? "rank" : "ranks", list, r->where, r->timeout_ms);
  BRG__WARN(BOOT_SUBSYS, "%s", text);
  uint8_t buf[BOOT_REPLY_HDR + BOOT_MAX_ERRTEXT];
  size_t n = boot_reply_error(buf, r->secret, BRG_ERR_TIMEOUT, text);
  for (int k = 0; k < r->nranks; k++) {
    if (r->rank_fd[k] < 0) continue;
    (void)brg__sock_send_all(r->rank_fd[k], buf, n, brg__now_ms() + BOOT_REPLY_SEND_MS, NULL);
    brg__sock_close(&r->rank_fd[k]);
  }
}

static void boot_root_send_tables(boot_root *r) {
  /* Nobody else may join this communicator now. */
  brg__sock_close(&r->lfd);
  for (int k = 0; k < r->nranks; k++) {
    int rc = brg__sock_send_all(r->rank_fd[k], r->table, r->table_bytes,
                           brg__now_ms() + BOOT_TABLE_SEND_MS, NULL);
    if (rc != BRG__IO_OK)
      BRG__WARN(BOOT_SUBSYS, "bootstrap root %s: could not send the table to rank %d: %s", r->where,
                k,
                rc == BRG__IO_TIMEOUT ? "it stopped reading"
                : rc == BRG__IO_EOF   ? "it hung up"
                                      : strerror(errno));
    brg__sock_close(&r->rank_fd[k]);
  }
  BRG__INFO(BOOT_SUBSYS, "bootstrap root %s: all %d ranks arrived; table sent", r->where,
            (int)r->nranks);
}

static void boot_root_free(boot_root *r) {
  for (int i = 0; i < r->nconns; i++)
    if (r->conns[i]) boot_conn_drop(r, i);
  if (r->rank_fd)
    for (int k = 0; k < r->nranks; k++) brg__sock_close(&r->rank_fd[k]);
  brg__sock_close(&r->lfd);
  free(r->rank_fd);
  free(r->table);
  free(r);
}

static void *boot_root_main(void *arg) {
  boot_root *r = arg;
  struct pollfd pfd[BOOT_MAX_PENDING + 1];
  for (;;) {
    if (r->nranks > 0 && r->arrived == r->nranks && boot_root_prune(r) == 0) break;
    int64_t now = brg__now_ms();
    if (r->deadline >= 0 && now >= r->deadline) {
      boot_root_give_up(r);
      goto out;
    }
    int64_t wake = r->deadline;
    int n = 0;
    int listening = r->nconns < BOOT_MAX_PENDING;
    if (listening) pfd[n++] = (struct pollfd){.fd = r->lfd, .events = POLLIN};
    for (int i = 0; i < r->nconns; i++) {
      pfd[n++] = (struct pollfd){.fd = r->conns[i]->fd, .events = POLLIN};
      if (wake < 0 || r->conns[i]->deadline < wake) wake = r->conns[i]->deadline;
    }
    int timeout = -1;
    if (wake >= 0) timeout = wake <= now ? 0 : (int)(wake - now > INT_MAX ? INT_MAX : wake - now);
    if (poll(pfd, (nfds_t)n, timeout) < 0) {
      if (errno != EINTR) {
        BRG__WARN(BOOT_SUBSYS, "bootstrap root %s: poll: %s", r->where, strerror(errno));
        brg__sleep_ms(10);
      }
      continue;
    }
    now = brg__now_ms();
    int base = listening ? 1 : 0;
    for (int i = 0; i < r->nconns; i++) {
      if (pfd[base + i].revents && boot_conn_service(r, i)) continue;
      boot_conn *c = r->conns[i];
      if (c && now >= c->deadline) {
        if (!c->draining)
          BRG__WARN(BOOT_SUBSYS,
                    "bootstrap root %s: dropped the connection from %s: no complete hello "
                    "within %d ms",
                    r->where, c->peer, BOOT_CONN_TIMEOUT_MS);
        boot_conn_drop(r, i);
      }
    }
    boot_root_compact(r);
    if (listening && (pfd[0].revents & POLLIN)) boot_root_accept(r);
  }
  boot_root_send_tables(r);
out:
  boot_root_free(r);
  return NULL;
}

brg_status brg__boot_root_start(const char *addr, uint16_t port, const uint8_t *secret,
                                int timeout_ms, brg__boot_id *id, brg__errbuf *err) {
  brg__log_init();
  if (!addr || !id)
    return brg__error(err, BRG_ERR_INVALID_ARGUMENT, BOOT_SUBSYS, "bootstrap root: NULL argument");
  boot_root *r = calloc(1, sizeof *r);
  if (!r) return brg__error(err, BRG_ERR_NO_MEMORY, BOOT_SUBSYS, "bootstrap root: out of memory");
  r->lfd = -1;
  uint16_t bound = 0;
  brg__boot_id tmp;
  brg_status st = brg__sock_listen(addr, port, BOOT_BACKLOG, BOOT_SUBSYS, "bootstrap root", &r->lfd, &bound, err);
  if (st != BRG_SUCCESS) goto err_free;
  st = brg__boot_id_make(&tmp, addr, bound, secret, err);
  if (st != BRG_SUCCESS) goto err_free;
  memcpy(r->secret, tmp.secret, sizeof r->secret);
  char where[BOOT_PEER_LEN];
  brg__sock_hostport(where, sizeof where, addr, bound);
  memcpy(r->where, where, sizeof where);
  r->timeout_ms = timeout_ms;
  r->deadline = brg__deadline_ms(timeout_ms);

  pthread_attr_t attr;
  pthread_t thread;
  int rc = pthread_attr_init(&attr);
  if (rc == 0) {
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    rc = pthread_create(&thread, &attr, boot_root_main, r);
    pthread_attr_destroy(&attr);
  }
  if (rc != 0) {
    st = brg__error(err, BRG_ERR_SYSTEM, BOOT_SUBSYS, "bootstrap root: pthread_create: %s",
                    strerror(rc));
    goto err_free;
  }
  /* The thread owns r from here on. */
  BRG__INFO(BOOT_SUBSYS, "bootstrap root listening at %s (waiting up to %d ms)", where, timeout_ms);
  *id = tmp;
  return BRG_SUCCESS;

err_free:
  brg__sock_close(&r->lfd);
  free(r);
  return st;
}

/* ------------------------------------------------------------ local addr */

/* Interfaces that exist on many hosts with the same address and reach no
 * other host: never picked unless asked for by name. */
static int boot_if_is_local_only(const char *name) {
  return strncmp(name, "docker", 6) == 0 || strncmp(name, "virbr", 5) == 0;
}

static brg_status boot_if_addr(const char *ifname, char *out, size_t out_bytes, brg__errbuf *err) {
  struct ifaddrs *ifs = NULL;
  int named = ifname && ifname[0];
  if (getifaddrs(&ifs) < 0)
    return brg__error(err, BRG_ERR_SYSTEM, BOOT_SUBSYS, "getifaddrs: %s", strerror(errno));
  int found = 0;
  /* IPv4 first; IPv6 (global scope) only for an interface asked for by name. */
  for (int pass = 0; pass < (named ? 2 : 1) && !found; pass++) {
    int family = pass == 0 ? AF_INET : AF_INET6;
    for (struct ifaddrs *a = ifs; a && !found; a = a->ifa_next) {
      if (!a->ifa_addr || a->ifa_addr->sa_family != family || !(a->ifa_flags & IFF_UP)) continue;
      if (named) {
        /* A prefix, as NCCL_SOCKET_IFNAME: "eth" matches eth0. */
        if (strncmp(a->ifa_name, ifname, strlen(ifname)) != 0) continue;
      } else if ((a->ifa_flags & IFF_LOOPBACK) || boot_if_is_local_only(a->ifa_name)) {
        continue;
      }
      if (family == AF_INET6 &&
          IN6_IS_ADDR_LINKLOCAL(&((struct sockaddr_in6 *)a->ifa_addr)->sin6_addr))
        continue;
      socklen_t len = family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
      if (getnameinfo(a->ifa_addr, len, out, (socklen_t)out_bytes, NULL, 0, NI_NUMERICHOST) == 0)
        found = 1;
    }
  }
  freeifaddrs(ifs);
  if (found) return BRG_SUCCESS;
  if (named)
    return brg__error(err, BRG_ERR_INVALID_ARGUMENT, BOOT_SUBSYS,
                      "BRIGADE_SOCKET_IFNAME=%s: no interface of that name is up with an IP "
                      "address",
                      ifname);
  snprintf(out, out_bytes, "127.0.0.1");
  BRG__INFO(BOOT_SUBSYS, "no network interface is up; advertising 127.0.0.1 (one host only)");
  return BRG_SUCCESS;
}

brg_status brg__boot_local_addr(char *addr, size_t addr_bytes, brg__errbuf *err) {
  if (!addr || addr_bytes == 0)
    return brg__error(err, BRG_ERR_INVALID_ARGUMENT, BOOT_SUBSYS, "local address: no buffer");
  char out[NI_MAXHOST];
  const char *want = brg__core_str(BRG__CORE_BOOTSTRAP_ADDR);
  if (want && want[0]) {
    /* A name or a numeric address; IPv4 preferred when a name has both. */
    struct addrinfo hints, *res = NULL;
    int rc = EAI_NONAME;
    memset(&hints, 0, sizeof hints);
    hints.ai_socktype = SOCK_STREAM;
    for (int pass = 0; pass < 2 && !res; pass++) {
      hints.ai_family = pass == 0 ? AF_INET : AF_UNSPEC;
      rc = getaddrinfo(want, NULL, &hints, &res);
      if (rc != 0) res = NULL;
    }
    if (!res)
      return brg__error(err, BRG_ERR_INVALID_ARGUMENT, BOOT_SUBSYS,
                        "BRIGADE_BOOTSTRAP_ADDR=%s is not an address: %s", want, gai_strerror(rc));
    rc = getnameinfo(res->ai_addr, res->ai_addrlen, out, sizeof out, NULL, 0, NI_NUMERICHOST);
    freeaddrinfo(res);
    if (rc != 0)
      return brg__error(err, BRG_ERR_INVALID_ARGUMENT, BOOT_SUBSYS, "BRIGADE_BOOTSTRAP_ADDR=%s: %s",
                        want, gai_strerror(rc));
  } else {
    brg_status st = boot_if_addr(brg__core_str(BRG__CORE_SOCKET_IFNAME), out, sizeof out, err);
    if (st != BRG_SUCCESS) return st;
  }
  size_t n = strlen(out);
  if (n >= addr_bytes || n >= BOOT_ADDR_BYTES)
    return brg__error(err, BRG_ERR_INVALID_ARGUMENT, BOOT_SUBSYS,
                      "local address %s does not fit in %zu bytes", out, addr_bytes);
  memcpy(addr, out, n + 1);
  return BRG_SUCCESS;
}

/* ------------------------------------------------------------ rank side */

typedef struct boot_peer {
  char addr[BOOT_ADDR_BYTES];
  uint16_t port;
} boot_peer;

struct brg__bootstrap {
  int rank, nranks;
  int timeout_ms;
  uint8_t secret[BOOT_SECRET_BYTES];
  int listen_fd;
  char listen_addr[BOOT_ADDR_BYTES];
  uint16_t listen_port;
  boot_peer *peers;
  int fd[2]; /* BRG__RING_NEXT, BRG__RING_PREV */
  int peer_rank[2];
  int broken[2]; /* a frame was cut or garbled: the stream cannot be trusted */
  uint32_t rx_have[2];
  uint8_t rx_buf[2][BOOT_FRAME_HDR + BRG__BOOT_MAX_MSG];
};

/* Reads and checks the root's answer; fills bs->peers and all_blobs. */
static brg_status boot_read_table(brg__bootstrap *bs, int fd, const char *root, size_t blob_bytes,
                                  void *all_blobs, int64_t deadline, brg__errbuf *err) {
  uint8_t hdr[BOOT_REPLY_HDR];
  int rc = brg__sock_recv_all(fd, hdr, sizeof hdr, deadline);
  if (rc == BRG__IO_EOF)
    return brg__error(err, BRG_ERR_REMOTE, BOOT_SUBSYS,
                      "rank %d: the bootstrap root at %s closed the connection without an "
                      "answer (wrong secret, or it already served its communicator?)",
                      bs->rank, root);
  if (rc == BRG__IO_TIMEOUT)
    return brg__error(err, BRG_ERR_TIMEOUT, BOOT_SUBSYS,
                      "rank %d: no answer from the bootstrap root at %s within %d ms (the other "
                      "ranks did not all arrive?)",
                      bs->rank, root, bs->timeout_ms);
  if (rc != BRG__IO_OK)
    return brg__error(err, BRG_ERR_SYSTEM, BOOT_SUBSYS,
                      "rank %d: receiving from the bootstrap root at %s: %s", bs->rank, root,
                      strerror(errno));
  uint32_t status = get_u32(hdr + 20), len = get_u32(hdr + 24);
  if (get_u32(hdr) != BOOT_TABLE_MAGIC || memcmp(hdr + 4, bs->secret, BOOT_SECRET_BYTES) != 0)
    return brg__error(err, BRG_ERR_REMOTE, BOOT_SUBSYS,
                      "rank %d: %s answered with something that is not a brigade bootstrap "
                      "table (is that port the bootstrap root of this job?)",
                      bs->rank, root);

  if (status != BRG_SUCCESS) {
    char text[BOOT_MAX_ERRTEXT + 1];
    if (len > BOOT_MAX_ERRTEXT)
      return brg__error(err, BRG_ERR_REMOTE, BOOT_SUBSYS,
                        "rank %d: malformed answer from the bootstrap root at %s (error text "
                        "of %u bytes)",
                        bs->rank, root, len);
    rc = brg__sock_recv_all(fd, text, len, deadline);
    if (rc != BRG__IO_OK) len = 0;
    text[len] = '\0';
    for (uint32_t k = 0; k < len; k++)
      if (text[k] < 0x20 || text[k] > 0x7e) text[k] = '?';
    if (status == BRG_ERR_TIMEOUT)
      return brg__error(err, BRG_ERR_TIMEOUT, BOOT_SUBSYS, "rank %d: %s", bs->rank, text);
    return brg__error(err, BRG_ERR_REMOTE, BOOT_SUBSYS,
                      "rank %d: the bootstrap root at %s refused this rank: %s", bs->rank, root,
                      text);
  }

  size_t entry = BOOT_ENTRY_HDR + blob_bytes;
  size_t expect = BOOT_TABLE_HDR + (size_t)bs->nranks * entry;
  if (len != expect)
    return brg__error(err, BRG_ERR_REMOTE, BOOT_SUBSYS,
                      "rank %d: malformed table from the bootstrap root at %s (%u bytes, "
                      "expected %zu)",
                      bs->rank, root, len, expect);
  uint8_t *t = malloc(expect);
  if (!t)
    return brg__error(err, BRG_ERR_NO_MEMORY, BOOT_SUBSYS,
                      "rank %d: no memory for a bootstrap table of %zu bytes", bs->rank, expect);
  brg_status st = BRG_SUCCESS;
  rc = brg__sock_recv_all(fd, t, expect, deadline);
  if (rc != BRG__IO_OK) {
    st = brg__error(err, rc == BRG__IO_TIMEOUT ? BRG_ERR_TIMEOUT : BRG_ERR_REMOTE, BOOT_SUBSYS,
                    "rank %d: the table from the bootstrap root at %s was cut short", bs->rank,
                    root);
    goto out;
  }
  if (get_u32(t) != (uint32_t)bs->nranks || get_u32(t + 4) != blob_bytes) {
    st = brg__error(err, BRG_ERR_REMOTE, BOOT_SUBSYS,
                    "rank %d: the bootstrap table is for %u ranks with %u-byte blobs, expected "
                    "%d and %zu",
                    bs->rank, get_u32(t), get_u32(t + 4), bs->nranks, blob_bytes);
    goto out;
  }
  for (int k = 0; k < bs->nranks; k++) {
    const uint8_t *e = t + BOOT_TABLE_HDR + (size_t)k * entry;
    boot_peer *p = &bs->peers[k];
    memcpy(p->addr, e, BOOT_ADDR_BYTES);
    p->port = get_u16(e + 64);
    if (!memchr(p->addr, '\0', BOOT_ADDR_BYTES) || !brg__sock_addr_is_numeric(p->addr) || p->port == 0 ||
        get_u16(e + 66) != 0) {
      st = brg__error(err, BRG_ERR_REMOTE, BOOT_SUBSYS,
                      "rank %d: malformed bootstrap table entry for rank %d", bs->rank, k);
      goto out;
    }
  }
  if (bs->peers[bs->rank].port != bs->listen_port ||
      strcmp(bs->peers[bs->rank].addr, bs->listen_addr) != 0) {
    st = brg__error(err, BRG_ERR_REMOTE, BOOT_SUBSYS,
                    "rank %d: the bootstrap table lists this rank at %s:%u, not at %s:%u", bs->rank,
                    bs->peers[bs->rank].addr, bs->peers[bs->rank].port, bs->listen_addr,
                    bs->listen_port);
    goto out;
  }
  for (int k = 0; k < bs->nranks && blob_bytes; k++)
    memcpy((uint8_t *)all_blobs + (size_t)k * blob_bytes,
           t + BOOT_TABLE_HDR + (size_t)k * entry + BOOT_ENTRY_HDR, blob_bytes);
out:
  free(t);
  return st;
}

brg_status brg__bootstrap_init(brg__bootstrap **bs_out, const brg__boot_id *id, int rank,
                               int nranks, const void *blob, size_t blob_bytes, void *all_blobs,
                               int timeout_ms, brg__errbuf *err) {
  brg__log_init();
  if (!bs_out || !id)
    return brg__error(err, BRG_ERR_INVALID_ARGUMENT, BOOT_SUBSYS, "bootstrap: NULL argument");
  if (nranks < 1 || nranks > BRG__BOOT_MAX_RANKS)
    return brg__error(err, BRG_ERR_INVALID_ARGUMENT, BOOT_SUBSYS,
                      "bootstrap: nranks=%d (must be 1..%d)", nranks, BRG__BOOT_MAX_RANKS);
  if (rank < 0 || rank >= nranks)
    return brg__error(err, BRG_ERR_INVALID_ARGUMENT, BOOT_SUBSYS,
                      "bootstrap: rank %d out of range for nranks=%d", rank, nranks);
  if (blob_bytes > BRG__BOOT_MAX_BLOB || (blob_bytes && (!blob || !all_blobs)))
    return brg__error(err, BRG_ERR_INVALID_ARGUMENT, BOOT_SUBSYS,
                      "bootstrap: bad blob (%zu bytes, at most %d, buffers must be given)",
                      blob_bytes, BRG__BOOT_MAX_BLOB);
  brg_status st = brg__boot_id_check(id, err);
  if (st != BRG_SUCCESS) return st;

  char root[BOOT_PEER_LEN];
  brg__sock_hostport(root, sizeof root, id->addr, id->port);
  int64_t deadline = brg__deadline_ms(timeout_ms);
  int fd = -1;
  brg__bootstrap *bs = calloc(1, sizeof *bs);
  if (!bs) return brg__error(err, BRG_ERR_NO_MEMORY, BOOT_SUBSYS, "bootstrap: out of memory");
  bs->rank = rank;
  bs->nranks = nranks;
  bs->timeout_ms = timeout_ms;
  bs->listen_fd = bs->fd[0] = bs->fd[1] = -1;
  bs->peer_rank[0] = bs->peer_rank[1] = -1;
  memcpy(bs->secret, id->secret, BOOT_SECRET_BYTES);
  bs->peers = calloc((size_t)nranks, sizeof *bs->peers);
  if (!bs->peers) {
    st = brg__error(err, BRG_ERR_NO_MEMORY, BOOT_SUBSYS, "bootstrap: out of memory");
    goto err_free;
  }

  st = brg__boot_local_addr(bs->listen_addr, sizeof bs->listen_addr, err);
  if (st != BRG_SUCCESS) goto err_free;
  st = brg__sock_listen(bs->listen_addr, 0, BOOT_BACKLOG, BOOT_SUBSYS, "ring listener", &bs->listen_fd, &bs->listen_port, err);
  if (st != BRG_SUCCESS) goto err_free;

  int e = 0;
  int rc = brg__sock_connect(id->addr, id->port, deadline, BOOT_RETRY_MS, &fd, &e);
  if (rc == BRG__IO_TIMEOUT) {
    st = brg__error(err, BRG_ERR_TIMEOUT, BOOT_SUBSYS,
                    "rank %d could not reach the bootstrap root at %s within %d ms (last "
                    "error: %s)",
                    rank, root, timeout_ms, e ? strerror(e) : "none");
    goto err_free;
  }
  if (rc != BRG__IO_OK) {
    st = brg__error(err, BRG_ERR_SYSTEM, BOOT_SUBSYS,
                    "rank %d: connecting to the bootstrap root at %s: %s", rank, root, strerror(e));
    goto err_free;
  }

  uint8_t hello_buf[BOOT_HELLO_HDR + BRG__BOOT_MAX_BLOB];
  brg__boot_hello h;
  memset(&h, 0, sizeof h);
  h.magic = BRG__BOOT_MAGIC;
  memcpy(h.secret, id->secret, BOOT_SECRET_BYTES);
  h.rank = rank;
  h.nranks = nranks;
  memcpy(h.addr, bs->listen_addr, sizeof h.addr);
  h.port = bs->listen_port;
  h.blob_bytes = (uint32_t)blob_bytes;
  h.blob = blob;
  size_t n = brg__boot_hello_encode(&h, hello_buf, sizeof hello_buf);
  if (n == 0) {
    st = brg__error(err, BRG_ERR_INTERNAL, BOOT_SUBSYS, "rank %d: cannot encode hello", rank);
    goto err_close;
  }
  rc = brg__sock_send_all(fd, hello_buf, n, deadline, NULL);
  if (rc != BRG__IO_OK) {
    st = brg__error(err,
                    rc == BRG__IO_TIMEOUT ? BRG_ERR_TIMEOUT
                    : rc == BRG__IO_EOF   ? BRG_ERR_REMOTE
                                          : BRG_ERR_SYSTEM,
                    BOOT_SUBSYS, "rank %d: sending the hello to the bootstrap root at %s: %s", rank,
                    root,
                    rc == BRG__IO_TIMEOUT ? "timed out"
                    : rc == BRG__IO_EOF   ? "the root closed the connection"
                                          : strerror(errno));
    goto err_close;
  }
  st = boot_read_table(bs, fd, root, blob_bytes, all_blobs, deadline, err);
  if (st != BRG_SUCCESS) goto err_close;
  close(fd);
  BRG__TRACE(BOOT_SUBSYS, "rank %d: bootstrap table from %s received (%d ranks)", rank, root,
             nranks);
  *bs_out = bs;
  return BRG_SUCCESS;

err_close:
  close(fd);
err_free:
  brg__bootstrap_destroy(bs);
  return st;
}

/* Accepts connections on the ring listener until one proves to be `prev`. */
static brg_status boot_ring_accept(brg__bootstrap *bs, int prev, int64_t deadline, int *fd_out,
                                   brg__errbuf *err) {
  char where[BOOT_PEER_LEN];
  brg__sock_hostport(where, sizeof where, bs->peers[prev].addr, bs->peers[prev].port);
  for (;;) {
    int rc = brg__sock_wait(bs->listen_fd, POLLIN, deadline);
    if (rc == BRG__IO_TIMEOUT)
      return brg__error(err, BRG_ERR_TIMEOUT, BOOT_SUBSYS,
                        "rank %d: ring predecessor rank %d (%s) did not connect within %d ms",
                        bs->rank, prev, where, bs->timeout_ms);
    if (rc != BRG__IO_OK)
      return brg__error(err, BRG_ERR_SYSTEM, BOOT_SUBSYS, "rank %d: poll on ring listener: %s",
                        bs->rank, strerror(errno));
    struct sockaddr_storage ss;
    socklen_t sslen = sizeof ss;
    int fd = accept4(bs->listen_fd, (struct sockaddr *)&ss, &sslen, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED)
        continue;
      return brg__error(err, BRG_ERR_SYSTEM, BOOT_SUBSYS, "rank %d: accept on ring listener: %s",
                        bs->rank, strerror(errno));
    }
    char peer[BOOT_PEER_LEN];
    brg__sock_addr_str((struct sockaddr *)&ss, sslen, peer, sizeof peer);
    int64_t conn_deadline = brg__now_ms() + BOOT_CONN_TIMEOUT_MS;
    if (deadline >= 0 && deadline < conn_deadline) conn_deadline = deadline;
    uint8_t m[BOOT_RING_HELLO];
    rc = brg__sock_recv_all(fd, m, sizeof m, conn_deadline);
    const char *why = NULL;
    char whybuf[96];
    if (rc != BRG__IO_OK) {
      why = rc == BRG__IO_TIMEOUT ? "it did not introduce itself in time" : "it hung up";
    } else if (get_u32(m) != BOOT_RING_MAGIC) {
      why = "not a brigade ring connection";
    } else if (memcmp(m + 4, bs->secret, BOOT_SECRET_BYTES) != 0) {
      why = "wrong secret";
    } else if ((int32_t)get_u32(m + 20) != prev || (int32_t)get_u32(m + 24) != bs->rank) {
      snprintf(whybuf, sizeof whybuf, "it says it is rank %d connecting to rank %d",
               (int)(int32_t)get_u32(m + 20), (int)(int32_t)get_u32(m + 24));
      why = whybuf;
    }
    if (!why) {
      *fd_out = fd;
      return BRG_SUCCESS;
    }
    BRG__WARN(BOOT_SUBSYS,
              "rank %d: dropped a connection to the ring listener from %s (expected rank %d): %s",
              bs->rank, peer, prev, why);
    close(fd);
  }
}

brg_status brg__bootstrap_ring_connect(brg__bootstrap *bs, int next, int prev, brg__errbuf *err) {
  if (!bs)
    return brg__error(err, BRG_ERR_INVALID_ARGUMENT, BOOT_SUBSYS, "ring connect: NULL bootstrap");
  if (bs->nranks == 1) {
    brg__sock_close(&bs->listen_fd);
    return BRG_SUCCESS;
  }
  if (next < 0 || next >= bs->nranks || prev < 0 || prev >= bs->nranks || next == bs->rank ||
      prev == bs->rank)
    return brg__error(err, BRG_ERR_INVALID_ARGUMENT, BOOT_SUBSYS,
                      "ring connect: rank %d of %d cannot have next=%d prev=%d", bs->rank,
                      bs->nranks, next, prev);
  if (bs->fd[0] >= 0 || bs->fd[1] >= 0 || bs->listen_fd < 0)
    return brg__error(err, BRG_ERR_INVALID_USAGE, BOOT_SUBSYS,
                      "ring connect: rank %d already opened its ring sockets", bs->rank);

  int64_t deadline = brg__deadline_ms(bs->timeout_ms);
  const boot_peer *pn = &bs->peers[next];
  char where[BOOT_PEER_LEN];
  brg__sock_hostport(where, sizeof where, pn->addr, pn->port);
  int nfd = -1, pfd = -1, e = 0;
  brg_status st;

  /* Connect first, then accept: the listen backlog completes our connection
   * while `next` is still busy with its own connect, so no order of arrival
   * deadlocks. */
  int rc = brg__sock_connect(pn->addr, pn->port, deadline, BOOT_RETRY_MS, &nfd, &e);
  if (rc != BRG__IO_OK)
    return brg__error(err, rc == BRG__IO_TIMEOUT ? BRG_ERR_TIMEOUT : BRG_ERR_SYSTEM, BOOT_SUBSYS,
                      "rank %d could not connect to its ring successor rank %d at %s within %d "
                      "ms: %s",
                      bs->rank, next, where, bs->timeout_ms, e ? strerror(e) : "timed out");
  uint8_t m[BOOT_RING_HELLO];
  put_u32(m, BOOT_RING_MAGIC);
  memcpy(m + 4, bs->secret, BOOT_SECRET_BYTES);
  put_u32(m + 20, (uint32_t)bs->rank);
  put_u32(m + 24, (uint32_t)next);
  rc = brg__sock_send_all(nfd, m, sizeof m, deadline, NULL);
  if (rc != BRG__IO_OK) {
    st = brg__error(err, rc == BRG__IO_TIMEOUT ? BRG_ERR_TIMEOUT : BRG_ERR_REMOTE, BOOT_SUBSYS,
                    "rank %d: ring successor rank %d at %s closed the connection (process "
                    "died?)",
                    bs->rank, next, where);
    goto err_close;
  }
  st = boot_ring_accept(bs, prev, deadline, &pfd, err);
  if (st != BRG_SUCCESS) goto err_close;

  brg__sock_nodelay(nfd);
  brg__sock_nodelay(pfd);
  brg__sock_close(&bs->listen_fd);
  bs->fd[BRG__RING_NEXT] = nfd;
  bs->fd[BRG__RING_PREV] = pfd;
  bs->peer_rank[BRG__RING_NEXT] = next;
  bs->peer_rank[BRG__RING_PREV] = prev;
  BRG__INFO(BOOT_SUBSYS, "rank %d: ring sockets open (next rank %d at %s, prev rank %d)", bs->rank,
            next, where, prev);
  return BRG_SUCCESS;

err_close:
  brg__sock_close(&nfd);
  return st;
}

static brg_status boot_ring_check(const brg__bootstrap *bs, int dir, const char *what,
                                  brg__errbuf *err) {
  if (!bs || (dir != BRG__RING_NEXT && dir != BRG__RING_PREV))
    return brg__error(err, BRG_ERR_INVALID_ARGUMENT, BOOT_SUBSYS, "%s: bad bootstrap or direction",
                      what);
  if (bs->fd[dir] < 0)
    return brg__error(err, BRG_ERR_INVALID_USAGE, BOOT_SUBSYS,
                      "%s: rank %d has no ring socket to its %s", what, bs->rank,
                      dir == BRG__RING_NEXT ? "successor" : "predecessor");
  if (bs->broken[dir])
    return brg__error(err, BRG_ERR_REMOTE, BOOT_SUBSYS,
                      "%s: the ring socket of rank %d to rank %d is unusable after an earlier "
                      "error",
                      what, bs->rank, bs->peer_rank[dir]);
  return BRG_SUCCESS;
}

/* Not marked broken: every later call meets the same hang-up and says so. */
static brg_status boot_ring_gone(brg__bootstrap *bs, int dir, brg__errbuf *err) {
  return brg__error(err, BRG_ERR_REMOTE, BOOT_SUBSYS,
                    "rank %d: ring neighbour rank %d closed the connection (process died?)",
                    bs->rank, bs->peer_rank[dir]);
}

brg_status brg__bootstrap_send(brg__bootstrap *bs, int dir, uint32_t type, const void *data,
                               uint32_t len, brg__errbuf *err) {
  brg_status st = boot_ring_check(bs, dir, "ring send", err);
  if (st != BRG_SUCCESS) return st;
  if (len > BRG__BOOT_MAX_MSG || (len && !data))
    return brg__error(err, BRG_ERR_INVALID_ARGUMENT, BOOT_SUBSYS,
                      "ring send: %u-byte message (at most %d, data must be given)", len,
                      BRG__BOOT_MAX_MSG);
  uint8_t frame[BOOT_FRAME_HDR + BRG__BOOT_MAX_MSG];
  put_u32(frame, type);
  put_u32(frame + 4, len);
  if (len) memcpy(frame + BOOT_FRAME_HDR, data, len);
  size_t total = BOOT_FRAME_HDR + (size_t)len, sent = 0;
  int rc = brg__sock_send_all(bs->fd[dir], frame, total, brg__deadline_ms(bs->timeout_ms), &sent);
  if (rc == BRG__IO_OK) return BRG_SUCCESS;
  if (sent > 0) bs->broken[dir] = 1;
  if (rc == BRG__IO_EOF) return boot_ring_gone(bs, dir, err);
  if (rc == BRG__IO_TIMEOUT)
    return brg__error(err, BRG_ERR_TIMEOUT, BOOT_SUBSYS,
                      "rank %d: sending to ring neighbour rank %d made no progress within %d ms",
                      bs->rank, bs->peer_rank[dir], bs->timeout_ms);
  return brg__error(err, BRG_ERR_SYSTEM, BOOT_SUBSYS, "rank %d: send to ring neighbour rank %d: %s",
                    bs->rank, bs->peer_rank[dir], strerror(errno));
}

brg_status brg__bootstrap_recv(brg__bootstrap *bs, int dir, uint32_t *type, void *data,
                               uint32_t max_len, uint32_t *len, int timeout_ms, brg__errbuf *err) {
  brg_status st = boot_ring_check(bs, dir, "ring recv", err);
  if (st != BRG_SUCCESS) return st;
  if (max_len && !data)
    return brg__error(err, BRG_ERR_INVALID_ARGUMENT, BOOT_SUBSYS, "ring recv: no buffer");
  /* A message that arrives in pieces is kept between calls, so a timeout
   * never loses the stream's framing. */
  int64_t deadline = timeout_ms < 0 ? -1 : brg__now_ms() + timeout_ms;
  uint8_t *b = bs->rx_buf[dir];
  uint32_t *have = &bs->rx_have[dir];
  int peer = bs->peer_rank[dir];
  for (;;) {
    uint32_t want = BOOT_FRAME_HDR;
    if (*have >= BOOT_FRAME_HDR) {
      uint32_t mlen = get_u32(b + 4);
      if (mlen > BRG__BOOT_MAX_MSG) {
        bs->broken[dir] = 1;
        return brg__error(err, BRG_ERR_REMOTE, BOOT_SUBSYS,
                          "rank %d: malformed message from ring neighbour rank %d (length %u, "
                          "at most %d)",
                          bs->rank, peer, mlen, BRG__BOOT_MAX_MSG);
      }
      want = BOOT_FRAME_HDR + mlen;
      if (*have == want) {
        *have = 0;
        if (mlen > max_len)
          return brg__error(err, BRG_ERR_REMOTE, BOOT_SUBSYS,
                            "rank %d: ring neighbour rank %d sent a %u-byte message of type %u; "
                            "at most %u expected",
                            bs->rank, peer, mlen, get_u32(b), max_len);
        if (mlen) memcpy(data, b + BOOT_FRAME_HDR, mlen);
        if (type) *type = get_u32(b);
        if (len) *len = mlen;
        return BRG_SUCCESS;
      }
    }
    ssize_t n = recv(bs->fd[dir], b + *have, want - *have, MSG_DONTWAIT);
    if (n > 0) {
      *have += (uint32_t)n;
      continue;
    }
    if (n == 0 || errno == ECONNRESET || errno == EPIPE) return boot_ring_gone(bs, dir, err);
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK)
      return brg__error(err, BRG_ERR_SYSTEM, BOOT_SUBSYS,
                        "rank %d: recv from ring neighbour rank %d: %s", bs->rank, peer,
                        strerror(errno));
    int rc = brg__sock_wait(bs->fd[dir], POLLIN, deadline);
    if (rc == BRG__IO_TIMEOUT) {
      /* A zero timeout is a question, not a failure: answer it quietly. */
      if (timeout_ms == 0)
        return brg__error_quiet(err, BRG_ERR_TIMEOUT, "rank %d: no message from ring neighbour rank %d",
                          bs->rank, peer);
      return brg__error(err, BRG_ERR_TIMEOUT, BOOT_SUBSYS,
                        "rank %d: no message from ring neighbour rank %d within %d ms", bs->rank,
                        peer, timeout_ms);
    }
    if (rc != BRG__IO_OK)
      return brg__error(err, BRG_ERR_SYSTEM, BOOT_SUBSYS,
                        "rank %d: poll on the ring socket to rank %d: %s", bs->rank, peer,
                        strerror(errno));
  }
}

const char *brg__bootstrap_peer_addr(const brg__bootstrap *bs, int rank, uint16_t *port) {
  if (!bs || rank < 0 || rank >= bs->nranks) return NULL;
  if (port) *port = bs->peers[rank].port;
  return bs->peers[rank].addr;
}

int brg__bootstrap_fd(const brg__bootstrap *bs, int dir) {
  if (!bs || (dir != BRG__RING_NEXT && dir != BRG__RING_PREV)) return -1;
  return bs->fd[dir];
}

const uint8_t *brg__bootstrap_secret(const brg__bootstrap *bs) {
  return bs ? bs->secret : NULL;
}

void brg__bootstrap_destroy(brg__bootstrap *bs) {
  if (!bs) return;
  brg__sock_close(&bs->fd[BRG__RING_NEXT]);
  brg__sock_close(&bs->fd[BRG__RING_PREV]);
  brg__sock_close(&bs->listen_fd);
  free(bs->peers);
  free(bs);
}
