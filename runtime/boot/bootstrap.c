/*
 * Bootstrap, rank side: the address this rank advertises, the hello to the
 * root and the table it answers with, and the ring sockets to the two
 * neighbours that carry setup messages, abort notices and goodbyes.
 * Message layouts are in bootstrap_wire.h, the root in bootstrap_root.c.
 */
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

#include "bootstrap.h"
#include "bootstrap_wire.h"
#include "clock.h"
#include "hash.h"
#include "secret.h"
#include "settings.h"

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
    if (brg__addr_unusable(res->ai_addr)) {
      freeaddrinfo(res);
      return brg__error(err, BRG_ERR_INVALID_ARGUMENT, BOOT_SUBSYS,
                        "BRIGADE_BOOTSTRAP_ADDR=%s resolves to an address no other rank can reach "
                        "this one at (unspecified, broadcast or multicast)",
                        want);
    }
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

static void boot_set_secret(brg__bootstrap *bs, const uint8_t *secret);

typedef struct boot_peer {
  char addr[BOOT_ADDR_BYTES];
  uint16_t port;
} boot_peer;

struct brg__bootstrap {
  int rank, nranks;
  int timeout_ms;
  uint8_t secret[BOOT_SECRET_BYTES];
  uint8_t root_tag[BOOT_SECRET_BYTES]; /* of the root's answers (bootstrap_wire.h) */
  uint8_t link_key[BOOT_SECRET_BYTES]; /* brg__bootstrap_secret */
  int listen_fd;
  int root_fd; /* to the root, from the hello until brg__bootstrap_confirm */
  char root[BOOT_PEER_LEN];
  int rootless;      /* brg__bootstrap_open: its caller confirms */
  int heard;         /* the root's word: 1 released, -1 the job failed, 0 none yet */
  int claimed_twice; /* the job failed because a rank was claimed twice */
  char root_said[BOOT_MAX_ERRTEXT + BOOT_PEER_LEN + 64];
  char listen_addr[BOOT_ADDR_BYTES];
  uint16_t listen_port;
  boot_peer *peers;
  int fd[2]; /* BRG__RING_NEXT, BRG__RING_PREV */
  int peer_rank[2];
  int broken[2]; /* a frame was cut or garbled: the stream cannot be trusted (atomic: a
                  * direction's sender and its reader may be different threads) */
  uint32_t rx_have[2];
  uint8_t rx_buf[2][BOOT_FRAME_HDR + BRG__BOOT_MAX_MSG];
  brg__boot_watch_fn watch; /* brg__bootstrap_set_watch */
  void *watch_arg;
  int64_t watch_ms; /* atomic: brg__bootstrap_watch's last question */
};

void brg__bootstrap_set_watch(brg__bootstrap *bs, brg__boot_watch_fn fn, void *arg) {
  if (!bs) return;
  bs->watch = fn;
  bs->watch_arg = arg;
}

int brg__bootstrap_watch(brg__bootstrap *bs, char *why, size_t why_bytes) {
  if (!bs || !bs->watch) return 0;
  /* Waiter checks come about every millisecond: ask every few. */
  int64_t now = brg__now_ms(), last = __atomic_load_n(&bs->watch_ms, __ATOMIC_RELAXED);
  if (now - last < 10) return 0;
  __atomic_store_n(&bs->watch_ms, now, __ATOMIC_RELAXED);
  return bs->watch(bs->watch_arg, why, why_bytes);
}

/* The watch's verdict: BRG_SUCCESS to wait on, else the error that ends
 * the wait (`doing` says which). */
static brg_status boot_watched(brg__bootstrap *bs, const char *doing, brg__errbuf *err) {
  char why[BRG__ERRLEN / 2];
  why[0] = 0;
  if (!bs->watch || !bs->watch(bs->watch_arg, why, sizeof why)) return BRG_SUCCESS;
  return brg__error(err, BRG_ERR_REMOTE, BOOT_SUBSYS, "%s (rank %d stopped %s)", why, bs->rank,
                    doing);
}

/* How long a wait until `wake` may block before the watch looks again
 * (poll's timeout: -1 forever). */
static int boot_watch_slice(const brg__bootstrap *bs, int64_t wake, int64_t now) {
  int left = wake < 0 ? -1 : wake <= now ? 0 : (int)(wake - now);
  if (bs->watch && (left < 0 || left > BRG__BOOT_WATCH_MS)) left = BRG__BOOT_WATCH_MS;
  return left;
}

/* Reads the header of the root's (or a tree parent's) answer and, with
 * status 0, a payload of exactly `expect` bytes into *payload (malloc'd);
 * an error answer becomes this rank's error with the root's text. */
static brg_status boot_read_reply(brg__bootstrap *bs, int fd, const char *root, size_t expect,
                                  uint8_t **payload, int64_t deadline, brg__errbuf *err) {
  uint8_t hdr[BOOT_REPLY_HDR];
  int rc = brg__sock_recv_all(fd, hdr, sizeof hdr, deadline);
  if (rc == BRG__IO_EOF)
    return brg__error(err, BRG_ERR_REMOTE, BOOT_SUBSYS,
                      "rank %d: %s closed the connection without an answer: either the "
                      "program listening there is not this job's rank 0 (rank 0 could not "
                      "listen on that port: see its error; if another program holds the port, "
                      "set BRIGADE_PORT), or rank 0 refused this rank (a different "
                      "BRIGADE_SECRET, or its communicator was already complete)",
                      bs->rank, root);
  if (rc == BRG__IO_TIMEOUT)
    return brg__error(err, BRG_ERR_TIMEOUT, BOOT_SUBSYS,
                      "rank %d: no answer from the bootstrap root at %s within %d ms (the other "
                      "ranks did not all arrive, or the program listening there is not this "
                      "job's rank 0?)",
                      bs->rank, root, bs->timeout_ms);
  if (rc != BRG__IO_OK)
    return brg__error(err, BRG_ERR_SYSTEM, BOOT_SUBSYS,
                      "rank %d: receiving from the bootstrap root at %s: %s", bs->rank, root,
                      strerror(errno));
  uint32_t status = boot_get_u32(hdr + 20), len = boot_get_u32(hdr + 24);
  if (boot_get_u32(hdr) != BOOT_TABLE_MAGIC)
    return brg__error(err, BRG_ERR_REMOTE, BOOT_SUBSYS,
                      "rank %d: %s answered with something that is not a brigade bootstrap "
                      "table (is that port the bootstrap root of this job?)",
                      bs->rank, root);
  if (!brg__ct_equal(hdr + 4, bs->root_tag, BOOT_SECRET_BYTES))
    return brg__error(err, BRG_ERR_REMOTE, BOOT_SUBSYS,
                      "rank %d: %s answered without proof of this job's secret (is that port the "
                      "bootstrap root of this job?)",
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
  if (len != expect)
    return brg__error(err, BRG_ERR_REMOTE, BOOT_SUBSYS,
                      "rank %d: malformed answer from %s (%u bytes, expected %zu)", bs->rank, root,
                      len, expect);
  uint8_t *t = malloc(expect);
  if (!t)
    return brg__error(err, BRG_ERR_NO_MEMORY, BOOT_SUBSYS,
                      "rank %d: no memory for a bootstrap answer of %zu bytes", bs->rank, expect);
  rc = brg__sock_recv_all(fd, t, expect, deadline);
  if (rc != BRG__IO_OK) {
    free(t);
    return brg__error(err, rc == BRG__IO_TIMEOUT ? BRG_ERR_TIMEOUT : BRG_ERR_REMOTE, BOOT_SUBSYS,
                      "rank %d: the answer from %s was cut short", bs->rank, root);
  }
  *payload = t;
  return BRG_SUCCESS;
}

/* Checks a table's payload (nranks, blob_bytes, the entries); fills
 * bs->peers and all_blobs. */
static brg_status boot_parse_table(brg__bootstrap *bs, const uint8_t *t, const char *from,
                                   size_t blob_bytes, void *all_blobs, brg__errbuf *err) {
  size_t entry = BOOT_ENTRY_HDR + blob_bytes;
  if (boot_get_u32(t) != (uint32_t)bs->nranks || boot_get_u32(t + 4) != blob_bytes)
    return brg__error(err, BRG_ERR_REMOTE, BOOT_SUBSYS,
                      "rank %d: the bootstrap table from %s is for %u ranks with %u-byte blobs, "
                      "expected %d and %zu",
                      bs->rank, from, boot_get_u32(t), boot_get_u32(t + 4), bs->nranks, blob_bytes);
  for (int k = 0; k < bs->nranks; k++) {
    const uint8_t *e = t + BOOT_TABLE_HDR + (size_t)k * entry;
    boot_peer *p = &bs->peers[k];
    memcpy(p->addr, e, BOOT_ADDR_BYTES);
    p->port = boot_get_u16(e + 64);
    if (!memchr(p->addr, '\0', BOOT_ADDR_BYTES) || !brg__sock_addr_is_numeric(p->addr) ||
        p->port == 0 || boot_get_u16(e + 66) != 0)
      return brg__error(err, BRG_ERR_REMOTE, BOOT_SUBSYS,
                        "rank %d: malformed bootstrap table entry for rank %d (from %s)", bs->rank,
                        k, from);
  }
  if (bs->peers[bs->rank].port != bs->listen_port ||
      strcmp(bs->peers[bs->rank].addr, bs->listen_addr) != 0)
    return brg__error(err, BRG_ERR_REMOTE, BOOT_SUBSYS,
                      "rank %d: the bootstrap table lists this rank at %s:%u, not at %s:%u",
                      bs->rank, bs->peers[bs->rank].addr, bs->peers[bs->rank].port, bs->listen_addr,
                      bs->listen_port);
  for (int k = 0; k < bs->nranks && blob_bytes; k++)
    memcpy((uint8_t *)all_blobs + (size_t)k * blob_bytes,
           t + BOOT_TABLE_HDR + (size_t)k * entry + BOOT_ENTRY_HDR, blob_bytes);
  return BRG_SUCCESS;
}

/* Reads and checks a whole table on fd; fills bs->peers and all_blobs. */
static brg_status boot_read_table(brg__bootstrap *bs, int fd, const char *root, size_t blob_bytes,
                                  void *all_blobs, int64_t deadline, brg__errbuf *err) {
  size_t expect = BOOT_TABLE_HDR + (size_t)bs->nranks * (BOOT_ENTRY_HDR + blob_bytes);
  uint8_t *t = NULL;
  brg_status st = boot_read_reply(bs, fd, root, expect, &t, deadline, err);
  if (st != BRG_SUCCESS) return st;
  st = boot_parse_table(bs, t, root, blob_bytes, all_blobs, err);
  free(t);
  return st;
}

/* Reads and checks the root's answer: nranks, blob_bytes and the tree
 * parent's listener (rank 0: none). */
static brg_status boot_read_neigh(brg__bootstrap *bs, int fd, const char *root, size_t blob_bytes,
                                  char *parent_addr, uint16_t *parent_port, int64_t deadline,
                                  brg__errbuf *err) {
  uint8_t *t = NULL;
  brg_status st = boot_read_reply(bs, fd, root, BOOT_NEIGH_BYTES, &t, deadline, err);
  if (st != BRG_SUCCESS) return st;
  const uint8_t *e = t + BOOT_TABLE_HDR;
  if (boot_get_u32(t) != (uint32_t)bs->nranks || boot_get_u32(t + 4) != blob_bytes) {
    st = brg__error(err, BRG_ERR_REMOTE, BOOT_SUBSYS,
                    "rank %d: the bootstrap root at %s answered for %u ranks with %u-byte blobs, "
                    "expected %d and %zu",
                    bs->rank, root, boot_get_u32(t), boot_get_u32(t + 4), bs->nranks, blob_bytes);
  } else if (bs->rank == 0) {
    static const uint8_t zero[BOOT_ENTRY_HDR];
    if (memcmp(e, zero, BOOT_ENTRY_HDR) != 0)
      st = brg__error(err, BRG_ERR_REMOTE, BOOT_SUBSYS,
                      "rank 0: the bootstrap root at %s named a tree parent", root);
    parent_addr[0] = '\0';
    *parent_port = 0;
  } else if (!memchr(e, '\0', BOOT_ADDR_BYTES) || !brg__sock_addr_is_numeric((const char *)e) ||
             boot_get_u16(e + 64) == 0 || boot_get_u16(e + 66) != 0) {
    st = brg__error(err, BRG_ERR_REMOTE, BOOT_SUBSYS,
                    "rank %d: the bootstrap root at %s named a malformed tree parent", bs->rank,
                    root);
  } else {
    memcpy(parent_addr, e, BOOT_ADDR_BYTES);
    *parent_port = boot_get_u16(e + 64);
  }
  free(t);
  return st;
}

static int boot_root_hear(brg__bootstrap *bs, int64_t deadline);

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
  bs->listen_fd = bs->root_fd = bs->fd[0] = bs->fd[1] = -1;
  bs->peer_rank[0] = bs->peer_rank[1] = -1;
  boot_set_secret(bs, id->secret);
  bs->peers = calloc((size_t)nranks, sizeof *bs->peers);
  if (!bs->peers) {
    st = brg__error(err, BRG_ERR_NO_MEMORY, BOOT_SUBSYS, "bootstrap: out of memory");
    goto err_free;
  }

  st = brg__boot_local_addr(bs->listen_addr, sizeof bs->listen_addr, err);
  if (st != BRG_SUCCESS) goto err_free;
  st = brg__sock_listen(bs->listen_addr, 0, BOOT_BACKLOG, BOOT_SUBSYS, "ring listener",
                        &bs->listen_fd, &bs->listen_port, err);
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

  /* The root speaks first: its challenge. */
  uint8_t challenge[BOOT_NONCE_BYTES];
  const char *bad = NULL;
  rc = brg__boot_challenge_read(fd, challenge, deadline, &bad);
  if (rc != BRG__IO_OK) {
    if (rc == BRG__IO_EOF)
      st = brg__error(err, BRG_ERR_REMOTE, BOOT_SUBSYS,
                      "rank %d: %s closed the connection before its challenge: either the "
                      "program listening there is not this job's rank 0 (rank 0 could not "
                      "listen on that port: see its error; if another program holds the port, "
                      "set BRIGADE_PORT), or it is a brigade older than this one (bootstrap "
                      "version %u), or rank 0's communicator was already complete",
                      rank, root, BOOT_VERSION);
    else if (rc == BRG__IO_TIMEOUT)
      st = brg__error(err, BRG_ERR_TIMEOUT, BOOT_SUBSYS,
                      "rank %d: no challenge from the bootstrap root at %s within %d ms (is "
                      "the program listening there this job's rank 0?)",
                      rank, root, timeout_ms);
    else
      st = brg__error(err, BRG_ERR_REMOTE, BOOT_SUBSYS, "rank %d: the bootstrap root at %s: %s",
                      rank, root, bad ? bad : strerror(errno));
    goto err_close;
  }

  uint8_t hello_buf[BOOT_HELLO_HDR + BRG__BOOT_MAX_BLOB];
  brg__boot_hello h;
  memset(&h, 0, sizeof h);
  h.magic = BRG__BOOT_MAGIC;
  if ((st = brg__boot_random(h.nonce, sizeof h.nonce, err)) != BRG_SUCCESS) goto err_close;
  h.rank = rank;
  h.nranks = nranks;
  memcpy(h.addr, bs->listen_addr, sizeof h.addr);
  h.port = bs->listen_port;
  h.blob_bytes = (uint32_t)blob_bytes;
  h.pid = (int32_t)getpid();
  if (gethostname(h.host, sizeof h.host - 1) != 0) snprintf(h.host, sizeof h.host, "?");
  h.host[sizeof h.host - 1] = '\0';
  h.blob = blob;
  size_t n = brg__boot_hello_encode(&h, hello_buf, sizeof hello_buf);
  if (n == 0) {
    st = brg__error(err, BRG_ERR_INTERNAL, BOOT_SUBSYS, "rank %d: cannot encode hello", rank);
    goto err_close;
  }
  brg__boot_sign(hello_buf, n, bs->secret, challenge);
  brg__boot_answer_tag(bs->root_tag, bs->secret, h.nonce);
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
  char parent_addr[BOOT_ADDR_BYTES];
  uint16_t parent_port = 0;
  st = boot_read_neigh(bs, fd, root, blob_bytes, parent_addr, &parent_port, deadline, err);
  if (st != BRG_SUCCESS) goto err_close;
  /* Kept until brg__bootstrap_confirm: the root releases nobody before
   * every rank has confirmed. */
  bs->root_fd = fd;
  fd = -1;
  snprintf(bs->root, sizeof bs->root, "%s", root);

  /* The table spreads over the tree; the root only watched. */
  uint8_t entry[BOOT_ENTRY_HDR + BRG__BOOT_MAX_BLOB];
  memset(entry, 0, BOOT_ENTRY_HDR);
  memcpy(entry, bs->listen_addr, strnlen(bs->listen_addr, BOOT_ADDR_BYTES - 1));
  boot_put_u16(entry + 64, bs->listen_port);
  if (blob_bytes) memcpy(entry + BOOT_ENTRY_HDR, blob, blob_bytes);
  brg__boot_tree tree = {.rank = rank,
                         .nranks = nranks,
                         .secret = bs->secret,
                         .listen_fd = bs->listen_fd,
                         .root_fd = bs->root_fd,
                         .parent_addr = parent_addr,
                         .parent_port = parent_port,
                         .entry = entry,
                         .blob_bytes = blob_bytes,
                         .deadline = deadline,
                         .timeout_ms = timeout_ms};
  uint8_t *table = NULL;
  size_t table_bytes = 0;
  int root_spoke = 0;
  st = brg__boot_tree_gather(&tree, &table, &table_bytes, &root_spoke, err);
  if (st == BRG_ERR_REMOTE && !root_spoke) {
    /* A tree neighbour that hung up has hung up on the root too, and the
     * root tells every rank which rank that was: wait a moment for it (not
     * after this rank's own timeout: the root hears of that when this rank
     * hangs up). */
    struct pollfd p = {.fd = bs->root_fd, .events = POLLIN};
    root_spoke = poll(&p, 1, BOOT_TREE_VERDICT_MS) == 1;
  }
  if (st != BRG_SUCCESS && root_spoke) {
    /* The root failed the job (a rank gone, or claimed twice): its reason. */
    boot_root_hear(bs, brg__now_ms() + BOOT_VERDICT_MS);
    st = brg__error(err, BRG_ERR_REMOTE, BOOT_SUBSYS, "rank %d: %s", rank,
                    bs->heard < 0 ? bs->root_said
                                  : "the bootstrap root spoke before the table was complete");
  }
  if (st != BRG_SUCCESS) goto err_free;
  st = boot_parse_table(bs, table + BOOT_REPLY_HDR, "the bootstrap tree", blob_bytes, all_blobs,
                        err);
  free(table);
  if (st != BRG_SUCCESS) goto err_free;
  BRG__TRACE(BOOT_SUBSYS, "rank %d: bootstrap table from %s received (%d ranks)", rank, root,
             nranks);
  *bs_out = bs;
  return BRG_SUCCESS;

err_close:
  brg__sock_close(&fd);
err_free:
  brg__bootstrap_destroy(bs);
  return st;
}

/* A connection to the ring listener that has not yet said who it is. */
typedef struct boot_ring_pending {
  int fd;
  uint8_t challenge[BOOT_NONCE_BYTES]; /* sent on accept */
  uint32_t got;
  int64_t deadline;
  char peer[BOOT_PEER_LEN];
  uint8_t m[BOOT_RING_HELLO];
} boot_ring_pending;

/* The ring sockets' setup: the connection to `next` (dialled, then sent
 * our hello) and the one from `prev` (picked among everything that
 * connects to the listener) progress together in one poll loop, so neither
 * a neighbour busy with its own connect nor any number of strangers on the
 * listener can hold the other up. */
typedef struct boot_ring_setup {
  brg__bootstrap *bs;
  int next, prev;
  int64_t deadline;
  struct sockaddr_storage next_ss;
  socklen_t next_sslen;
  int out_fd;        /* to next: -1 between attempts */
  int out_connected; /* the handshake finished; sending the hello */
  uint32_t out_sent;
  uint8_t out_ch[BOOT_CHALLENGE_BYTES]; /* the successor's challenge, read before the hello */
  uint32_t out_ch_got;
  int out_done;
  int out_errno; /* what the last failed attempt said */
  int64_t out_retry_at;
  uint8_t out_m[BOOT_RING_HELLO];
  int in_fd; /* from prev, once proven */
  int npending;
  boot_ring_pending q[BOOT_RING_MAX_PENDING];
} boot_ring_setup;

static void ring_pending_drop(boot_ring_setup *r, int i, const char *why) {
  boot_ring_pending *e = &r->q[i];
  BRG__WARN(BOOT_SUBSYS,
            "rank %d: dropped a connection to the ring listener from %s (expected rank %d): %s",
            r->bs->rank, e->peer, r->prev, why);
  close(e->fd);
  memmove(&r->q[i], &r->q[i + 1], (size_t)(r->npending - i - 1) * sizeof r->q[0]);
  r->npending--;
}

/* Reads what q[i] has sent; a complete hello from `prev` with the secret
 * becomes the incoming ring socket, anything else is dropped. */
static void ring_pending_read(boot_ring_setup *r, int i) {
  boot_ring_pending *e = &r->q[i];
  ssize_t n = recv(e->fd, e->m + e->got, sizeof e->m - e->got, MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
  if (n <= 0) {
    ring_pending_drop(r, i, "it hung up");
    return;
  }
  e->got += (uint32_t)n;
  if (e->got < sizeof e->m) return;
  const brg__bootstrap *bs = r->bs;
  char whybuf[96];
  const char *why = NULL;
  int32_t from = -1, to = -1;
  if (!brg__boot_peer_hello_check(e->m, BOOT_RING_MAGIC, bs->secret, e->challenge, &from, &to,
                                  &why)) {
  } else if (from != r->prev || to != bs->rank) {
    snprintf(whybuf, sizeof whybuf, "it says it is rank %d connecting to rank %d", (int)from,
             (int)to);
    why = whybuf;
  }
  if (why) {
    ring_pending_drop(r, i, why);
    return;
  }
  r->in_fd = e->fd;
  memmove(&r->q[i], &r->q[i + 1], (size_t)(r->npending - i - 1) * sizeof r->q[0]);
  r->npending--;
}

/* Takes what waits in the listen queue, at most a batch per round so that
 * the connections already taken get read before the oldest are dropped.
 * 0, or -1 with errno on a failure other than running out of descriptors. */
static int ring_accept_some(boot_ring_setup *r) {
  for (int k = 0; k < BOOT_RING_MAX_PENDING / 4; k++) {
    struct sockaddr_storage ss;
    socklen_t sslen = sizeof ss;
    int fd =
        accept4(r->bs->listen_fd, (struct sockaddr *)&ss, &sslen, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        /* Make room: the oldest stranger goes, and the backlog keeps the rest. */
        if (r->npending > 0) ring_pending_drop(r, 0, "out of file descriptors");
        return 0;
      }
      return -1;
    }
    uint8_t ch[BOOT_CHALLENGE_BYTES], nonce[BOOT_NONCE_BYTES];
    if (brg__boot_challenge_make(ch, nonce, NULL, NULL) != BRG_SUCCESS ||
        send(fd, ch, sizeof ch, MSG_DONTWAIT | MSG_NOSIGNAL) != (ssize_t)sizeof ch) {
      close(fd); /* a fresh socket takes 24 bytes: this one is gone already */
      continue;
    }
    if (r->npending == BOOT_RING_MAX_PENDING)
      ring_pending_drop(r, 0, "too many connections that have not introduced themselves");
    boot_ring_pending *e = &r->q[r->npending++];
    e->fd = fd;
    memcpy(e->challenge, nonce, sizeof nonce);
    e->got = 0;
    e->deadline = brg__now_ms() + BOOT_RING_CONN_TIMEOUT_MS;
    brg__sock_addr_str((struct sockaddr *)&ss, sslen, e->peer, sizeof e->peer);
  }
  return 0;
}

/* One step of the connection to `next`. 0 to go on, -1 on an error that
 * will not mend (errno). */
static int ring_out_step(boot_ring_setup *r, short revents) {
  if (r->out_fd < 0) {
    if (brg__now_ms() < r->out_retry_at) return 0;
    r->out_fd = socket(r->next_ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (r->out_fd < 0) return -1;
    r->out_connected = 0;
    r->out_sent = 0;
    r->out_ch_got = 0;
    if (connect(r->out_fd, (struct sockaddr *)&r->next_ss, r->next_sslen) == 0)
      r->out_connected = 1;
    else if (errno != EINPROGRESS && errno != EINTR)
      goto retry;
    revents = 0;
  }
  if (!r->out_connected) {
    if (!revents) return 0;
    int e = 0;
    socklen_t elen = sizeof e;
    if (getsockopt(r->out_fd, SOL_SOCKET, SO_ERROR, &e, &elen) < 0) e = errno;
    if (e) {
      errno = e;
      goto retry;
    }
    r->out_connected = 1;
  }
  while (r->out_ch_got < sizeof r->out_ch) {
    ssize_t n =
        recv(r->out_fd, r->out_ch + r->out_ch_got, sizeof r->out_ch - r->out_ch_got, MSG_DONTWAIT);
    if (n > 0) {
      r->out_ch_got += (uint32_t)n;
      if (r->out_ch_got < sizeof r->out_ch) continue;
      if (boot_get_u32(r->out_ch) != BOOT_CHALLENGE_MAGIC ||
          boot_get_u32(r->out_ch + 4) != BOOT_VERSION) {
        errno = EPROTO; /* not this version's ring listener */
        return -1;
      }
      brg__boot_sign(r->out_m, sizeof r->out_m, r->bs->secret, r->out_ch + 8);
      break;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
    if (n == 0) errno = ECONNRESET;
    goto retry; /* the listener went away between accept and challenge: dial again */
  }
  while (r->out_sent < sizeof r->out_m) {
    ssize_t n = send(r->out_fd, r->out_m + r->out_sent, sizeof r->out_m - r->out_sent,
                     MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      r->out_sent += (uint32_t)n;
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
    return -1; /* the successor accepted and then went away */
  }
  r->out_done = 1;
  return 0;

retry:;
  int e = errno;
  r->out_errno = e;
  brg__sock_close(&r->out_fd);
  if (e != ECONNREFUSED && e != ETIMEDOUT && e != EHOSTUNREACH && e != ENETUNREACH &&
      e != ECONNRESET && e != ECONNABORTED && e != EAGAIN) {
    errno = e;
    return -1;
  }
  r->out_retry_at = brg__now_ms() + BOOT_RETRY_MS;
  return 0;
}

static brg_status ring_setup_run(boot_ring_setup *r, brg__errbuf *err) {
  brg__bootstrap *bs = r->bs;
  brg_status st;
  char where_next[BOOT_PEER_LEN], where_prev[BOOT_PEER_LEN];
  brg__sock_hostport(where_next, sizeof where_next, bs->peers[r->next].addr,
                     bs->peers[r->next].port);
  brg__sock_hostport(where_prev, sizeof where_prev, bs->peers[r->prev].addr,
                     bs->peers[r->prev].port);
  while (!r->out_done || r->in_fd < 0) {
    int64_t now = brg__now_ms();
    if (r->deadline >= 0 && now >= r->deadline) {
      if (!r->out_done)
        return brg__error(err, BRG_ERR_TIMEOUT, BOOT_SUBSYS,
                          "rank %d could not connect to its ring successor rank %d at %s within "
                          "%d ms: %s",
                          bs->rank, r->next, where_next, bs->timeout_ms,
                          r->out_errno ? strerror(r->out_errno) : "timed out");
      return brg__error(err, BRG_ERR_TIMEOUT, BOOT_SUBSYS,
                        "rank %d: ring predecessor rank %d (%s) did not connect within %d ms",
                        bs->rank, r->prev, where_prev, bs->timeout_ms);
    }
    /* Strangers that have not said who they are in time go first. */
    for (int i = r->npending - 1; i >= 0; i--)
      if (now >= r->q[i].deadline) ring_pending_drop(r, i, "it did not introduce itself in time");

    struct pollfd pfd[3 + BOOT_RING_MAX_PENDING];
    int np = 0, lsn = -1, out = -1, root = -1;
    int64_t wake = r->deadline;
    /* The root says nothing before the release unless the job failed (a
     * rank claimed twice): then that is this rank's error too. */
    if (bs->root_fd >= 0) {
      root = np;
      pfd[np++] = (struct pollfd){.fd = bs->root_fd, .events = POLLIN};
    }
    if (r->in_fd < 0) {
      lsn = np;
      pfd[np++] = (struct pollfd){.fd = bs->listen_fd, .events = POLLIN};
      for (int i = 0; i < r->npending; i++) {
        pfd[np++] = (struct pollfd){.fd = r->q[i].fd, .events = POLLIN};
        wake = brg__deadline_min(wake, r->q[i].deadline);
      }
    }
    if (!r->out_done) {
      if (r->out_fd >= 0) {
        out = np;
        short ev = r->out_connected && r->out_ch_got < sizeof r->out_ch ? POLLIN : POLLOUT;
        pfd[np++] = (struct pollfd){.fd = r->out_fd, .events = ev};
      } else {
        wake = brg__deadline_min(wake, r->out_retry_at);
      }
    }
    if ((st = boot_watched(bs, "connecting its ring sockets", err)) != BRG_SUCCESS) return st;
    if (poll(pfd, (nfds_t)np, boot_watch_slice(bs, wake, now)) < 0) {
      if (errno == EINTR) continue;
      return brg__error(err, BRG_ERR_SYSTEM, BOOT_SUBSYS, "rank %d: poll on ring sockets: %s",
                        bs->rank, strerror(errno));
    }
    /* The root's word before the release: the job failed. A second claim
     * of a rank is this rank's error too; other reasons are the echo of a
     * failure that this rank will see for itself. */
    if (root >= 0 && pfd[root].revents) {
      boot_root_hear(bs, brg__now_ms() + BOOT_VERDICT_MS);
      if (bs->heard < 0 && bs->claimed_twice)
        return brg__error(err, BRG_ERR_REMOTE, BOOT_SUBSYS, "rank %d: %s", bs->rank, bs->root_said);
      if (bs->heard > 0)
        return brg__error(err, BRG_ERR_REMOTE, BOOT_SUBSYS,
                          "rank %d: the bootstrap root released the job before this rank had "
                          "confirmed",
                          bs->rank);
      brg__sock_close(&bs->root_fd); /* nothing more to hear; do not poll it again */
    }
    if (!r->out_done && ring_out_step(r, out >= 0 ? pfd[out].revents : 0) != 0)
      return brg__error(err, BRG_ERR_REMOTE, BOOT_SUBSYS,
                        "rank %d: connecting to its ring successor rank %d at %s: %s (process "
                        "died?)",
                        bs->rank, r->next, where_next, strerror(errno));
    if (lsn < 0) continue;
    /* Pending connections from the last: a dropped one moves those after it. */
    for (int i = r->npending - 1; i >= 0 && r->in_fd < 0; i--)
      if (pfd[lsn + 1 + i].revents) ring_pending_read(r, i);
    if (r->in_fd < 0 && (pfd[lsn].revents & POLLIN) && ring_accept_some(r) != 0)
      return brg__error(err, BRG_ERR_SYSTEM, BOOT_SUBSYS, "rank %d: accept on ring listener: %s",
                        bs->rank, strerror(errno));
  }
  return BRG_SUCCESS;
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

  const boot_peer *pn = &bs->peers[next];
  char where[BOOT_PEER_LEN];
  brg__sock_hostport(where, sizeof where, pn->addr, pn->port);
  boot_ring_setup *r = calloc(1, sizeof *r);
  if (!r) return brg__error(err, BRG_ERR_NO_MEMORY, BOOT_SUBSYS, "ring connect: out of memory");
  r->bs = bs;
  r->next = next;
  r->prev = prev;
  r->deadline = brg__deadline_ms(bs->timeout_ms);
  r->out_fd = r->in_fd = -1;
  brg_status st = BRG_SUCCESS;
  if (brg__sock_addr(pn->addr, pn->port, &r->next_ss, &r->next_sslen) != 0) {
    st = brg__error(err, BRG_ERR_REMOTE, BOOT_SUBSYS,
                    "rank %d: ring successor rank %d is at '%s', not a numeric address", bs->rank,
                    next, pn->addr);
    goto out;
  }
  boot_put_u32(r->out_m, BOOT_RING_MAGIC);
  boot_put_u32(r->out_m + 20, (uint32_t)bs->rank);
  boot_put_u32(r->out_m + 24, (uint32_t)next);
  if ((st = brg__boot_random(r->out_m + BOOT_RING_HELLO_NONCE, BOOT_NONCE_BYTES, err)) !=
      BRG_SUCCESS)
    goto out;
  st = ring_setup_run(r, err);
out:
  for (int i = r->npending - 1; i >= 0; i--) close(r->q[i].fd);
  int nfd = r->out_fd, pfd = r->in_fd;
  free(r);
  if (st != BRG_SUCCESS) {
    brg__sock_close(&nfd);
    brg__sock_close(&pfd);
    return st;
  }
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
  if (__atomic_load_n(&bs->broken[dir], __ATOMIC_RELAXED))
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
  boot_put_u32(frame, type);
  boot_put_u32(frame + 4, len);
  if (len) memcpy(frame + BOOT_FRAME_HDR, data, len);
  size_t total = BOOT_FRAME_HDR + (size_t)len, sent = 0;
  int rc = brg__sock_send_all(bs->fd[dir], frame, total, brg__deadline_ms(bs->timeout_ms), &sent);
  if (rc == BRG__IO_OK) return BRG_SUCCESS;
  if (sent > 0) __atomic_store_n(&bs->broken[dir], 1, __ATOMIC_RELAXED);
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
      uint32_t mlen = boot_get_u32(b + 4);
      if (mlen > BRG__BOOT_MAX_MSG) {
        __atomic_store_n(&bs->broken[dir], 1, __ATOMIC_RELAXED);
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
                            bs->rank, peer, mlen, boot_get_u32(b), max_len);
        if (mlen) memcpy(data, b + BOOT_FRAME_HDR, mlen);
        if (type) *type = boot_get_u32(b);
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
    int64_t until = deadline;
    if (bs->watch && timeout_ms != 0) {
      if ((st = boot_watched(bs, "waiting for its ring neighbours", err)) != BRG_SUCCESS) return st;
      until = brg__deadline_min(deadline, brg__now_ms() + BRG__BOOT_WATCH_MS);
    }
    int rc = brg__sock_wait(bs->fd[dir], POLLIN, until);
    if (rc == BRG__IO_TIMEOUT && until != deadline) continue;
    if (rc == BRG__IO_TIMEOUT) {
      /* A zero timeout is a question, not a failure: answer it quietly. */
      if (timeout_ms == 0)
        return brg__error_quiet(err, BRG_ERR_TIMEOUT,
                                "rank %d: no message from ring neighbour rank %d", bs->rank, peer);
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

brg_status brg__bootstrap_wrap(brg__bootstrap **bs_out, int rank, int nranks, const uint8_t *secret,
                               uint16_t listen_port, int fd_next, int fd_prev, int timeout_ms,
                               brg__errbuf *err) {
  *bs_out = NULL;
  if (nranks < 1 || nranks > BRG__BOOT_MAX_RANKS || rank < 0 || rank >= nranks || !secret)
    return brg__error(err, BRG_ERR_INVALID_ARGUMENT, BOOT_SUBSYS, "bootstrap wrap: rank %d of %d",
                      rank, nranks);
  brg__bootstrap *bs = calloc(1, sizeof *bs);
  boot_peer *peers = bs ? calloc((size_t)nranks, sizeof *peers) : NULL;
  if (!peers) {
    free(bs);
    return brg__error(err, BRG_ERR_NO_MEMORY, BOOT_SUBSYS, "bootstrap wrap: out of memory");
  }
  bs->rank = rank;
  bs->nranks = nranks;
  bs->timeout_ms = timeout_ms;
  boot_set_secret(bs, secret);
  static const uint8_t zero_nonce[BOOT_NONCE_BYTES];
  brg__boot_answer_tag(bs->root_tag, bs->secret, zero_nonce);
  bs->listen_fd = -1;
  bs->root_fd = -1;
  snprintf(bs->listen_addr, sizeof bs->listen_addr, "127.0.0.1");
  bs->listen_port = listen_port;
  bs->peers = peers;
  bs->fd[BRG__RING_NEXT] = fd_next;
  bs->fd[BRG__RING_PREV] = fd_prev;
  bs->peer_rank[BRG__RING_NEXT] = (rank + 1) % nranks;
  bs->peer_rank[BRG__RING_PREV] = (rank + nranks - 1) % nranks;
  *bs_out = bs;
  return BRG_SUCCESS;
}

brg_status brg__bootstrap_read_table(brg__bootstrap *bs, int fd, size_t blob_bytes, void *all_blobs,
                                     brg__errbuf *err) {
  return boot_read_table(bs, fd, "(the given socket)", blob_bytes, all_blobs,
                         brg__deadline_ms(bs->timeout_ms), err);
}

brg_status brg__bootstrap_read_neigh(brg__bootstrap *bs, int fd, size_t blob_bytes,
                                     char *parent_addr, uint16_t *parent_port, brg__errbuf *err) {
  return boot_read_neigh(bs, fd, "(the given socket)", blob_bytes, parent_addr, parent_port,
                         brg__deadline_ms(bs->timeout_ms), err);
}

brg_status brg__bootstrap_open(brg__bootstrap **bs_out, int rank, int nranks, const uint8_t *secret,
                               int timeout_ms, uint8_t *entry, brg__errbuf *err) {
  brg__log_init();
  *bs_out = NULL;
  if (nranks < 1 || nranks > BRG__BOOT_MAX_RANKS || rank < 0 || rank >= nranks || !secret || !entry)
    return brg__error(err, BRG_ERR_INVALID_ARGUMENT, BOOT_SUBSYS, "bootstrap open: rank %d of %d",
                      rank, nranks);
  brg__bootstrap *bs = calloc(1, sizeof *bs);
  brg_status st = BRG_SUCCESS;
  if (!bs || !(bs->peers = calloc((size_t)nranks, sizeof *bs->peers))) {
    free(bs);
    return brg__error(err, BRG_ERR_NO_MEMORY, BOOT_SUBSYS, "bootstrap: out of memory");
  }
  bs->rank = rank;
  bs->nranks = nranks;
  bs->timeout_ms = timeout_ms;
  bs->rootless = 1;
  bs->listen_fd = bs->root_fd = bs->fd[0] = bs->fd[1] = -1;
  bs->peer_rank[0] = bs->peer_rank[1] = -1;
  boot_set_secret(bs, secret);
  st = brg__boot_local_addr(bs->listen_addr, sizeof bs->listen_addr, err);
  if (st == BRG_SUCCESS)
    st = brg__sock_listen(bs->listen_addr, 0, BOOT_BACKLOG, BOOT_SUBSYS, "ring listener",
                          &bs->listen_fd, &bs->listen_port, err);
  if (st != BRG_SUCCESS) {
    brg__bootstrap_destroy(bs);
    return st;
  }
  memset(entry, 0, BOOT_ENTRY_HDR);
  memcpy(entry, bs->listen_addr, strnlen(bs->listen_addr, BOOT_ADDR_BYTES - 1));
  boot_put_u16(entry + 64, bs->listen_port);
  *bs_out = bs;
  return BRG_SUCCESS;
}

brg_status brg__bootstrap_set_table(brg__bootstrap *bs, const uint8_t *entries, size_t blob_bytes,
                                    void *all_blobs, brg__errbuf *err) {
  if (!bs || !entries || blob_bytes > BRG__BOOT_MAX_BLOB || (blob_bytes && !all_blobs))
    return brg__error(err, BRG_ERR_INVALID_ARGUMENT, BOOT_SUBSYS, "bootstrap table: bad arguments");
  size_t body = BOOT_TABLE_HDR + (size_t)bs->nranks * (BOOT_ENTRY_HDR + blob_bytes);
  uint8_t *t = malloc(body);
  if (!t)
    return brg__error(err, BRG_ERR_NO_MEMORY, BOOT_SUBSYS, "rank %d: no memory for a table",
                      bs->rank);
  boot_put_u32(t, (uint32_t)bs->nranks);
  boot_put_u32(t + 4, (uint32_t)blob_bytes);
  memcpy(t + BOOT_TABLE_HDR, entries, body - BOOT_TABLE_HDR);
  brg_status st = boot_parse_table(bs, t, "the parent communicator", blob_bytes, all_blobs, err);
  free(t);
  return st;
}

/* Reads the root's word on root_fd (a release, or why the job failed) into
 * bs->heard / bs->root_said, and closes the connection: 1 released, -1 the
 * job failed (bs->root_said says why), 0 timed out or nothing readable. */
static int boot_root_hear(brg__bootstrap *bs, int64_t deadline) {
  uint8_t hdr[BOOT_REPLY_HDR];
  int rc = brg__sock_recv_all(bs->root_fd, hdr, sizeof hdr, deadline);
  if (rc == BRG__IO_TIMEOUT) return 0;
  if (rc != BRG__IO_OK) {
    snprintf(bs->root_said, sizeof bs->root_said,
             "the bootstrap root at %s closed the connection before every rank had confirmed "
             "(rank 0 died?)",
             bs->root);
  } else if (boot_get_u32(hdr) != BOOT_TABLE_MAGIC ||
             !brg__ct_equal(hdr + 4, bs->root_tag, BOOT_SECRET_BYTES)) {
    snprintf(bs->root_said, sizeof bs->root_said,
             "%s answered with something that is not from this job's bootstrap root", bs->root);
  } else if (boot_get_u32(hdr + 20) != BRG_SUCCESS) {
    uint32_t len = boot_get_u32(hdr + 24);
    char text[BOOT_MAX_ERRTEXT + 1];
    if (len > BOOT_MAX_ERRTEXT ||
        brg__sock_recv_all(bs->root_fd, text, len, deadline) != BRG__IO_OK)
      len = 0;
    text[len] = '\0';
    for (uint32_t k = 0; k < len; k++)
      if (text[k] < 0x20 || text[k] > 0x7e) text[k] = '?';
    snprintf(bs->root_said, sizeof bs->root_said, "the bootstrap root at %s failed the job: %s",
             bs->root, len ? text : "(no reason received)");
    bs->claimed_twice = strstr(text, BOOT_CLAIMED_TWICE) != NULL;
  } else if (boot_get_u32(hdr + 24) != 0) {
    snprintf(bs->root_said, sizeof bs->root_said, "malformed release from the bootstrap root at %s",
             bs->root);
  } else {
    brg__sock_close(&bs->root_fd);
    bs->heard = 1;
    return 1;
  }
  brg__sock_close(&bs->root_fd);
  bs->heard = -1;
  return -1;
}

void brg__bootstrap_verdict(brg__bootstrap *bs, brg_status *st, brg__errbuf *err) {
  if (!bs) return;
  if (bs->root_fd >= 0) {
    struct pollfd p = {.fd = bs->root_fd, .events = POLLIN};
    if (poll(&p, 1, BOOT_VERDICT_MS) == 1) boot_root_hear(bs, brg__now_ms() + BOOT_VERDICT_MS);
  }
  /* Only a rank claimed twice overrides this rank's own reason: other
   * failures the root reports are the consequence of one a rank saw. */
  if (bs->heard >= 0 || !bs->claimed_twice) return;
  char more[sizeof bs->root_said + 8];
  int m = snprintf(more, sizeof more, "; %s", bs->root_said);
  size_t n = strnlen(err->msg, sizeof err->msg), room = sizeof err->msg - 1 - n;
  size_t take = m < 0 ? 0 : (size_t)m < room ? (size_t)m : room;
  memcpy(err->msg + n, more, take); /* cut at the buffer's end, as messages are */
  err->msg[n + take] = '\0';
  BRG__WARN(BOOT_SUBSYS, "rank %d: %s", bs->rank, bs->root_said);
  *st = BRG_ERR_REMOTE;
}

brg_status brg__bootstrap_confirm(brg__bootstrap *bs, brg__errbuf *err) {
  if (!bs) return brg__error(err, BRG_ERR_INTERNAL, BOOT_SUBSYS, "bootstrap confirm: NULL");
  if (bs->rootless) return BRG_SUCCESS;
  int64_t deadline = brg__deadline_ms(bs->timeout_ms);
  if (bs->root_fd >= 0) {
    uint8_t m[BOOT_CONFIRM_BYTES];
    boot_put_u32(m, BOOT_CONFIRM_MAGIC);
    boot_put_u32(m + 4, (uint32_t)bs->rank);
    /* A root that already failed the job has said why: that answer wins
     * over the send's error. */
    (void)brg__sock_send_all(bs->root_fd, m, sizeof m, deadline, NULL);
    if (boot_root_hear(bs, deadline) == 0) {
      brg__sock_close(&bs->root_fd);
      return brg__error(err, BRG_ERR_TIMEOUT, BOOT_SUBSYS,
                        "rank %d: the bootstrap root at %s did not release the job within %d ms "
                        "(a rank did not finish setting up)",
                        bs->rank, bs->root, bs->timeout_ms);
    }
  }
  if (bs->heard > 0) return BRG_SUCCESS;
  if (bs->heard == 0)
    return brg__error(err, BRG_ERR_INTERNAL, BOOT_SUBSYS,
                      "rank %d: bootstrap confirm without a connection to the root", bs->rank);
  return brg__error(err, BRG_ERR_REMOTE, BOOT_SUBSYS, "rank %d: %s", bs->rank, bs->root_said);
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

/* The data connections' hellos (tcp, ibverbs, point-to-point) carry a key
 * derived from the job secret, not the secret itself. */
static void boot_set_secret(brg__bootstrap *bs, const uint8_t *secret) {
  static const char label[] = "brigade data links";
  uint8_t mac[BRG__SHA256_BYTES];
  memcpy(bs->secret, secret, BOOT_SECRET_BYTES);
  brg__hmac_sha256(secret, BOOT_SECRET_BYTES, label, sizeof label - 1, NULL, 0, NULL, 0, mac);
  memcpy(bs->link_key, mac, BOOT_SECRET_BYTES);
}

const uint8_t *brg__bootstrap_secret(const brg__bootstrap *bs) {
  return bs ? bs->link_key : NULL;
}

void brg__bootstrap_destroy(brg__bootstrap *bs) {
  if (!bs) return;
  brg__sock_close(&bs->fd[BRG__RING_NEXT]);
  brg__sock_close(&bs->fd[BRG__RING_PREV]);
  brg__sock_close(&bs->listen_fd);
  brg__sock_close(&bs->root_fd);
  free(bs->peers);
  free(bs);
}
