/*
 * The bootstrap root: a thread on rank 0 (or the caller of
 * brg_get_unique_id) that gathers one hello per rank and answers every rank
 * with its parent in the tree that spreads the table (bootstrap_tree.c), so
 * its bytes are O(N). Connections that do not present the job's secret are
 * refused; none of them can hold the root longer than its deadline.
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
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "bootstrap.h"
#include "bootstrap_wire.h"
#include "clock.h"
#include "hash.h"
#include "secret.h"
#include "settings.h"

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
  int64_t accepted_ms;
  uint8_t challenge[BOOT_NONCE_BYTES]; /* the nonce it was sent */
  uint8_t tag[BOOT_SECRET_BYTES];      /* of answers to it, once its hello proved itself */
  uint32_t have, want;
  char peer[BOOT_PEER_LEN];
  uint8_t buf[BOOT_HELLO_HDR + BRG__BOOT_MAX_BLOB];
} boot_conn;

/* Who claimed a rank, for the message when two processes claim one. */
typedef struct boot_claim {
  int32_t pid;
  char host[BOOT_HOST_BYTES];
  char peer[BOOT_PEER_LEN];
} boot_claim;

typedef struct boot_root {
  int lfd;
  uint8_t secret[BOOT_SECRET_BYTES];
  const uint8_t *fixed_nonce; /* brg__boot_root_serve's; NULL: fresh challenges */
  char where[BOOT_PEER_LEN];
  int timeout_ms;
  int gather_ms; /* how long the hellos are awaited (a little under timeout_ms) */
  int64_t deadline;
  boot_conn *conns[BOOT_MAX_PENDING];
  int nconns;
  int pending_cap;     /* boot_root_pending_cap */
  int64_t accept_wake; /* the listener is not polled before this (all places taken) */
  int32_t nranks;      /* 0 until the first accepted hello sets it */
  int32_t first_rank;
  uint32_t blob_bytes;
  int32_t arrived;
  int *rank_fd;
  uint8_t *rank_tag; /* per rank: the tag of answers to it */
  uint8_t *table;
  size_t table_bytes;
  /* After the table: every rank confirms before anyone is released, and a
   * second live claim of a rank fails the job (`failed`, with the text
   * every rank is told, here and to those that come later). */
  int tables_sent;
  int32_t nconfirmed;
  uint8_t *confirmed; /* per rank */
  uint8_t *told;      /* per rank: has had the failure */
  boot_claim *claims; /* per rank: who claimed it */
  int failed;
  char fail_text[BOOT_MAX_ERRTEXT];
} boot_root;

/* What every root of this process read and wrote on its sockets. */
static uint64_t boot_bytes_in, boot_bytes_out;

void brg__boot_root_stats(uint64_t *bytes_in, uint64_t *bytes_out) {
  *bytes_in = __atomic_load_n(&boot_bytes_in, __ATOMIC_RELAXED);
  *bytes_out = __atomic_load_n(&boot_bytes_out, __ATOMIC_RELAXED);
}

static void boot_count(uint64_t *counter, ssize_t n) {
  if (n > 0) __atomic_fetch_add(counter, (uint64_t)n, __ATOMIC_RELAXED);
}

static int boot_send_all(int fd, const void *buf, size_t len, int64_t deadline, size_t *sent) {
  size_t done = 0;
  int rc = brg__sock_send_all(fd, buf, len, deadline, &done);
  boot_count(&boot_bytes_out, (ssize_t)done);
  if (sent) *sent = done;
  return rc;
}

static int boot_recv_all(int fd, void *buf, size_t len, int64_t deadline) {
  int rc = brg__sock_recv_all(fd, buf, len, deadline);
  if (rc == BRG__IO_OK) boot_count(&boot_bytes_in, (ssize_t)len);
  return rc;
}

/* Where each rank listens: all the root keeps of a hello (the blobs spread
 * over the tree, not through the root). */
static uint8_t *boot_root_entry(boot_root *r, int rank) {
  return r->table + (size_t)rank * BOOT_ENTRY_HDR;
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
  size_t n = brg__boot_reply_error(buf, c->tag, BRG_ERR_REMOTE, text);
  (void)boot_send_all(c->fd, buf, n, brg__now_ms() + BOOT_REPLY_SEND_MS, NULL);
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

/* Fails the job: every rank that holds a connection gets `text` now, every
 * rank that comes later gets it from boot_root_admit. */
static void boot_root_fail_all(boot_root *r, const char *text) {
  if (r->failed) return;
  r->failed = 1;
  snprintf(r->fail_text, sizeof r->fail_text, "%s", text);
  BRG__WARN(BOOT_SUBSYS, "bootstrap root %s: failing the job: %s", r->where, text);
  uint8_t buf[BOOT_REPLY_HDR + BOOT_MAX_ERRTEXT];
  size_t n = brg__boot_reply_error(buf, r->rank_tag, BRG_ERR_REMOTE, text);
  for (int k = 0; k < r->nranks; k++) {
    if (r->rank_fd[k] < 0) continue;
    memcpy(buf + 4, r->rank_tag + (size_t)k * BOOT_SECRET_BYTES, BOOT_SECRET_BYTES);
    (void)boot_send_all(r->rank_fd[k], buf, n, brg__now_ms() + BOOT_REPLY_SEND_MS, NULL);
    brg__sock_close(&r->rank_fd[k]);
    r->told[k] = 1;
  }
  /* Those still on their way are told until the deadline (or until every
   * rank has been told). */
  r->deadline = brg__now_ms() + (r->timeout_ms > 0 ? r->timeout_ms : 30000);
}

static int boot_root_all_told(const boot_root *r) {
  for (int k = 0; k < r->nranks; k++)
    if (!r->told[k]) return 0;
  return 1;
}

/* Takes a well-formed hello with the right secret, or refuses it. Returns 1
 * when the connection left the pending list. */
static int boot_root_admit(boot_root *r, int i, const brg__boot_hello *h) {
  boot_conn *c = r->conns[i];
  if (r->failed && r->nranks == 0) {
    boot_conn_refuse(r, i, "%s", r->fail_text);
    return 0;
  }
  if (r->nranks == 0) {
    /* The root holds one connection per rank until the release. */
    brg__sock_raise_nofile((long)h->nranks + 64, BOOT_SUBSYS);
    size_t bytes = (size_t)h->nranks * BOOT_ENTRY_HDR;
    uint8_t *table = calloc(1, bytes);
    int *rank_fd = malloc((size_t)h->nranks * sizeof *rank_fd);
    uint8_t *confirmed = calloc((size_t)h->nranks, 1), *told = calloc((size_t)h->nranks, 1);
    boot_claim *claims = calloc((size_t)h->nranks, sizeof *claims);
    uint8_t *rank_tag = calloc((size_t)h->nranks, BOOT_SECRET_BYTES);
    if (!table || !rank_fd || !confirmed || !told || !claims || !rank_tag) {
      free(rank_tag);
      free(table);
      free(rank_fd);
      free(confirmed);
      free(told);
      free(claims);
      boot_conn_refuse(r, i, "the bootstrap root has no memory for a table of %d ranks",
                       (int)h->nranks);
      return 0;
    }
    for (int k = 0; k < h->nranks; k++) rank_fd[k] = -1;
    r->table = table;
    r->table_bytes = bytes;
    r->rank_fd = rank_fd;
    r->rank_tag = rank_tag;
    r->confirmed = confirmed;
    r->told = told;
    r->claims = claims;
    r->nranks = h->nranks;
    r->blob_bytes = h->blob_bytes;
    r->first_rank = h->rank;
  } else if (h->nranks != r->nranks || h->blob_bytes != r->blob_bytes) {
    /* The job's shape differs between ranks: no rank can go on, and each
     * is told both values (the ranks already here too, rather than wait
     * for one that will never come). */
    char text[BOOT_MAX_ERRTEXT];
    if (h->nranks != r->nranks)
      snprintf(text, sizeof text,
               "the ranks disagree on the job's size: rank %d (pid %d on %s) says WORLD_SIZE "
               "(nranks) is %d, rank %d (pid %d on %s) said %d; every rank must start with the "
               "same",
               (int)h->rank, (int)h->pid, h->host, (int)h->nranks, (int)r->first_rank,
               (int)r->claims[r->first_rank].pid, r->claims[r->first_rank].host, (int)r->nranks);
    else
      snprintf(text, sizeof text,
               "the ranks disagree on their bootstrap record: rank %d (pid %d on %s) sent %u "
               "bytes, rank %d said %u (a different brigade build on those ranks?)",
               (int)h->rank, (int)h->pid, h->host, h->blob_bytes, (int)r->first_rank,
               r->blob_bytes);
    boot_root_fail_all(r, text);
    if (h->rank < r->nranks) r->told[h->rank] = 1;
    boot_conn_refuse(r, i, "%s", text);
    return 0;
  } else if (r->failed) {
    r->told[h->rank] = 1;
    boot_conn_refuse(r, i, "%s", r->fail_text);
    return 0;
  } else if (r->rank_fd[h->rank] >= 0 || r->tables_sent) {
    /* A rank claimed again: by a process that hung up and came back
     * (forgotten, before the table only), or by a second live process,
     * which fails the job on every rank rather than let either one in
     * silently. */
    if (r->rank_fd[h->rank] >= 0 && !r->tables_sent && !boot_fd_alive(r->rank_fd[h->rank])) {
      boot_root_forget(r, h->rank, "hung up");
    } else {
      const boot_claim *first = &r->claims[h->rank];
      char text[BOOT_MAX_ERRTEXT];
      snprintf(
          text, sizeof text,
          "rank %d" BOOT_CLAIMED_TWICE ": first by pid %d on %s (%s), then by pid %d on %s (%s); "
          "a process outside this job may hold its rank (a derived secret is no "
          "protection: set BRIGADE_SECRET to a per-job random value)",
          (int)h->rank, (int)first->pid, first->host, first->peer, (int)h->pid, h->host, c->peer);
      boot_root_fail_all(r, text);
      r->told[h->rank] = 1;
      boot_conn_refuse(r, i, "%s", text);
      return 0;
    }
  }

  uint8_t *e = boot_root_entry(r, h->rank);
  memset(e, 0, BOOT_ADDR_BYTES);
  memcpy(e, h->addr, strnlen(h->addr, BOOT_ADDR_BYTES - 1));
  boot_put_u16(e + 64, h->port);
  boot_put_u16(e + 66, 0);
  r->rank_fd[h->rank] = c->fd;
  memcpy(r->rank_tag + (size_t)h->rank * BOOT_SECRET_BYTES, c->tag, BOOT_SECRET_BYTES);
  r->claims[h->rank].pid = h->pid;
  snprintf(r->claims[h->rank].host, sizeof r->claims[h->rank].host, "%s", h->host);
  snprintf(r->claims[h->rank].peer, sizeof r->claims[h->rank].peer, "%s", c->peer);
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
      boot_count(&boot_bytes_in, n);
      if (n > 0) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
      boot_conn_drop(r, i);
      return 1;
    }
    return 0;
  }

  ssize_t n = recv(c->fd, c->buf + c->have, c->want - c->have, MSG_DONTWAIT);
  boot_count(&boot_bytes_in, n);
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
    uint32_t magic = boot_get_u32(c->buf);
    if (magic != BRG__BOOT_MAGIC) {
      BRG__WARN(BOOT_SUBSYS,
                "bootstrap root %s: dropped the connection from %s: not a brigade rank "
                "(magic 0x%08x)",
                r->where, c->peer, magic);
      boot_conn_drop(r, i);
      return 1;
    }
    uint32_t blob_bytes = boot_get_u32(c->buf + 96);
    if (blob_bytes > BRG__BOOT_MAX_BLOB) {
      /* Not proven yet (the proof covers the blob): no answer. */
      BRG__WARN(BOOT_SUBSYS,
                "bootstrap root %s: dropped the connection from %s: its hello announces a "
                "%u-byte blob (at most %d)",
                r->where, c->peer, blob_bytes, BRG__BOOT_MAX_BLOB);
      boot_conn_drop(r, i);
      return 1;
    }
    c->want = BOOT_HELLO_HDR + blob_bytes;
    if (c->have < c->want) return 0;
  }
  if (!brg__boot_verify(c->buf, c->have, r->secret, c->challenge)) {
    BRG__WARN(BOOT_SUBSYS,
              "bootstrap root %s: dropped the connection from %s: its hello does not prove the "
              "job's secret (a rank of another job, a stale unique id, a different "
              "BRIGADE_SECRET?)",
              r->where, c->peer);
    boot_conn_drop(r, i);
    return 1;
  }
  brg__boot_answer_tag(c->tag, r->secret, c->buf + BOOT_HELLO_NONCE);

  brg__boot_hello h;
  brg__errbuf why;
  if (brg__boot_hello_parse(c->buf, c->have, &h, &why) != BRG_SUCCESS) {
    boot_conn_refuse(r, i, "%s", why.msg);
    return 0;
  }
  return boot_root_admit(r, i, &h);
}

/* Out of descriptors: the job cannot gather its ranks, so it fails at once
 * with that reason. Closing the ranks' connections frees descriptors, so
 * those still in the listen queue are accepted after this and told too. */
static void boot_root_out_of_fds(boot_root *r, int e) {
  if (r->failed) {
    brg__sleep_ms(10); /* the told ranks' descriptors are closing; do not spin */
    return;
  }
  struct rlimit rl = {0, 0};
  getrlimit(RLIMIT_NOFILE, &rl);
  char text[BOOT_MAX_ERRTEXT];
  snprintf(text, sizeof text,
           "the bootstrap root at %s ran out of file descriptors (%s: %s) holding %d of %d ranks' "
           "connections; RLIMIT_NOFILE is %ld (hard %ld): raise it (ulimit -n) above the number "
           "of ranks",
           r->where, e == EMFILE ? "EMFILE" : "ENFILE", strerror(e), (int)r->arrived,
           (int)r->nranks, (long)rl.rlim_cur, (long)rl.rlim_max);
  boot_root_fail_all(r, text);
}

/* EMFILE before the first hello told the job's size (connections arrive
 * faster than hellos are read, under load): the soft limit raised to the
 * hard one, as the first hello would have (brg__sock_raise_nofile says when
 * it cannot); 1 when that made room. */
static int boot_root_more_fds(boot_root *r) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return 0;
  long want = (long)r->nconns + (long)r->nranks + 64;
  if (want <= (long)rl.rlim_cur) want = (long)rl.rlim_cur + 1;
  return brg__sock_raise_nofile(want, BOOT_SUBSYS) > (long)rl.rlim_cur;
}

/* Sends a new connection its challenge (a fresh socket's buffer takes it
 * whole): 0, or -1 when it could not be sent. */
static int boot_conn_challenge(boot_root *r, boot_conn *c) {
  uint8_t m[BOOT_CHALLENGE_BYTES];
  if (brg__boot_challenge_make(m, c->challenge, r->fixed_nonce, NULL) != BRG_SUCCESS) return -1;
  ssize_t n = send(c->fd, m, sizeof m, MSG_DONTWAIT | MSG_NOSIGNAL);
  boot_count(&boot_bytes_out, n);
  return n == (ssize_t)sizeof m ? 0 : -1;
}

/* How many connections that have not said who they are the root may hold:
 * BOOT_MAX_PENDING, fewer when the descriptors left are fewer. This
 * process keeps BOOT_FD_RESERVE descriptors for its own set-up (rank 0 is
 * a rank too), and one per rank yet to arrive; strangers get the rest. */
static int boot_root_pending_cap(const boot_root *r, int last_fd) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return BOOT_MAX_PENDING;
  long limit = (long)rl.rlim_cur;
  /* Descriptors are handed out lowest first: the newest one's number is
   * about how many are open. */
  long open_now = last_fd >= 0 ? last_fd + 1 : r->nconns + 16;
  long ranks_to_come = r->nranks > 0 ? (long)(r->nranks - r->arrived) : 1;
  long reserve = limit / 4 < BOOT_FD_RESERVE ? limit / 4 : BOOT_FD_RESERVE;
  long free_fds = limit - open_now - reserve - ranks_to_come;
  long cap = (long)r->nconns + free_fds;
  if (cap > BOOT_MAX_PENDING) cap = BOOT_MAX_PENDING;
  return cap < 1 ? 1 : (int)cap;
}

/* Makes room for one more pending connection by dropping the oldest that
 * has had BOOT_MIN_PENDING_MS to say who it is (a rank answers the
 * challenge within a round trip): 1 when there is room. */
static int boot_root_make_room(boot_root *r, int cap, int64_t now) {
  while (r->nconns >= cap && r->nconns > 0) {
    boot_conn *old = r->conns[0];
    if (now - old->accepted_ms < BOOT_MIN_PENDING_MS) return 0;
    if (!old->draining)
      BRG__WARN(BOOT_SUBSYS,
                "bootstrap root %s: dropped the connection from %s: no complete hello yet, and "
                "%d newer connections wait (room for %d)",
                r->where, old->peer, r->nconns - 1, cap);
    boot_conn_drop(r, 0);
    memmove(&r->conns[0], &r->conns[1], (size_t)(r->nconns - 1) * sizeof r->conns[0]);
    r->nconns--;
  }
  return r->nconns < cap;
}

/* Takes what waits in the listen queue, a batch per round so that the
 * connections already taken get read before the oldest are dropped; with
 * every pending place taken (BOOT_MAX_PENDING, or what the descriptors
 * left allow), the oldest stranger makes room, so strangers delay the job
 * but cannot fail it. */
static void boot_root_accept(boot_root *r) {
  for (int k = 0; k < BOOT_MAX_PENDING / 4; k++) {
    int64_t now = brg__now_ms();
    if (!boot_root_make_room(r, r->pending_cap, now)) {
      r->accept_wake = r->conns[0]->accepted_ms + BOOT_MIN_PENDING_MS;
      return; /* the listen queue keeps the rest */
    }
    struct sockaddr_storage ss;
    socklen_t sslen = sizeof ss;
    int fd = accept4(r->lfd, (struct sockaddr *)&ss, &sslen, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      if (errno == EMFILE && boot_root_more_fds(r)) continue;
      /* Out of descriptors. When the job's ranks would fit in what the
       * pending connections hold (strangers, or ranks yet to say hello),
       * fewer of those are kept from now on and the oldest make room;
       * when even all of them would not make room for every rank, the
       * job cannot gather at this limit: it fails now, saying so. */
      if ((errno == EMFILE || errno == ENFILE) && r->nconns > 0 &&
          (r->nranks == 0 || r->nranks - r->arrived <= r->nconns)) {
        r->pending_cap = r->nconns > 1 ? r->nconns - 1 : 1;
        continue;
      }
      if (errno == EMFILE || errno == ENFILE) {
        boot_root_out_of_fds(r, errno);
        return;
      }
      BRG__WARN(BOOT_SUBSYS, "bootstrap root %s: accept: %s", r->where, strerror(errno));
      if (errno == ENOBUFS || errno == ENOMEM) brg__sleep_ms(100); /* the backlog keeps them */
      return;
    }
    r->pending_cap = boot_root_pending_cap(r, fd);
    boot_conn *c = calloc(1, sizeof *c);
    if (!c) {
      close(fd);
      BRG__WARN(BOOT_SUBSYS, "bootstrap root %s: out of memory accepting a connection", r->where);
      return;
    }
    c->fd = fd;
    c->want = BOOT_HELLO_HDR;
    c->accepted_ms = now;
    c->deadline = now + BOOT_CONN_TIMEOUT_MS;
    brg__sock_addr_str((struct sockaddr *)&ss, sslen, c->peer, sizeof c->peer);
    if (boot_conn_challenge(r, c) != 0) {
      close(fd);
      free(c);
      continue;
    }
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
              r->gather_ms);
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
  snprintf(text, sizeof text,
           "%s %s never reached the bootstrap root at %s within %d ms (the timeout of %d ms less "
           "a margin, so that the ranks that came hear this before their own deadline)",
           missing == 1 ? "rank" : "ranks", list, r->where, r->gather_ms, r->timeout_ms);
  BRG__WARN(BOOT_SUBSYS, "%s", text);
  uint8_t buf[BOOT_REPLY_HDR + BOOT_MAX_ERRTEXT];
  size_t n = brg__boot_reply_error(buf, r->rank_tag, BRG_ERR_TIMEOUT, text);
  for (int k = 0; k < r->nranks; k++) {
    if (r->rank_fd[k] < 0) continue;
    memcpy(buf + 4, r->rank_tag + (size_t)k * BOOT_SECRET_BYTES, BOOT_SECRET_BYTES);
    (void)boot_send_all(r->rank_fd[k], buf, n, brg__now_ms() + BOOT_REPLY_SEND_MS, NULL);
    brg__sock_close(&r->rank_fd[k]);
  }
}

/* Sends every rank its tree parent (the table spreads over the tree); the
 * connections stay, for the confirmations, and so does the listener, so
 * that a second claim of a rank is still seen. */
static void boot_root_send_tables(boot_root *r) {
  uint8_t m[BOOT_REPLY_HDR + BOOT_NEIGH_BYTES];
  boot_put_u32(m, BOOT_TABLE_MAGIC);
  boot_put_u32(m + 20, BRG_SUCCESS);
  boot_put_u32(m + 24, BOOT_NEIGH_BYTES);
  boot_put_u32(m + BOOT_REPLY_HDR, (uint32_t)r->nranks);
  boot_put_u32(m + BOOT_REPLY_HDR + 4, r->blob_bytes);
  for (int k = 0; k < r->nranks; k++) {
    uint8_t *parent = m + BOOT_REPLY_HDR + BOOT_TABLE_HDR;
    memcpy(m + 4, r->rank_tag + (size_t)k * BOOT_SECRET_BYTES, BOOT_SECRET_BYTES);
    if (k == 0)
      memset(parent, 0, BOOT_ENTRY_HDR);
    else
      memcpy(parent, boot_root_entry(r, (k - 1) / 2), BOOT_ENTRY_HDR);
    int rc = boot_send_all(r->rank_fd[k], m, sizeof m, brg__now_ms() + BOOT_TABLE_SEND_MS, NULL);
    if (rc != BRG__IO_OK) {
      char text[256];
      snprintf(text, sizeof text,
               "the bootstrap root could not send the table to rank %d (pid %d on %s): %s", k,
               (int)r->claims[k].pid, r->claims[k].host,
               rc == BRG__IO_TIMEOUT ? "it stopped reading"
               : rc == BRG__IO_EOF   ? "it hung up"
                                     : strerror(errno));
      brg__sock_close(&r->rank_fd[k]);
      r->told[k] = 1;
      boot_root_fail_all(r, text);
      return;
    }
  }
  r->tables_sent = 1;
  /* The ranks' own set-up (ring, transports) may take several of their
   * timeouts, and each rank reports its own failure: the root's deadline
   * for the confirmations only keeps it from waiting forever. */
  r->deadline = r->timeout_ms > 0 ? brg__now_ms() + 4 * (int64_t)r->timeout_ms + 5000 : -1;
  BRG__INFO(BOOT_SUBSYS, "bootstrap root %s: all %d ranks arrived; tree parents sent", r->where,
            (int)r->nranks);
}

/* Reads rank k's confirmation (its connection was readable). */
static void boot_root_confirm(boot_root *r, int k) {
  uint8_t m[BOOT_CONFIRM_BYTES];
  int rc = boot_recv_all(r->rank_fd[k], m, sizeof m, brg__now_ms() + BOOT_REPLY_SEND_MS);
  if (rc == BRG__IO_OK && boot_get_u32(m) == BOOT_CONFIRM_MAGIC &&
      (int32_t)boot_get_u32(m + 4) == k) {
    r->confirmed[k] = 1;
    r->nconfirmed++;
    return;
  }
  char text[256];
  snprintf(text, sizeof text,
           "rank %d (pid %d on %s) %s before it confirmed its set-up (its brg_comm_init "
           "failed?)",
           k, (int)r->claims[k].pid, r->claims[k].host,
           rc == BRG__IO_OK ? "sent something else" : "hung up");
  brg__sock_close(&r->rank_fd[k]);
  r->told[k] = 1;
  boot_root_fail_all(r, text);
}

/* Every rank confirmed: releases them all. */
static void boot_root_release(boot_root *r) {
  /* Nobody else may join now; strangers go before the ranks are released. */
  brg__sock_close(&r->lfd);
  for (int i = 0; i < r->nconns; i++)
    if (r->conns[i]) boot_conn_drop(r, i);
  r->nconns = 0;
  uint8_t go[BOOT_REPLY_HDR];
  boot_put_u32(go, BOOT_TABLE_MAGIC);
  boot_put_u32(go + 20, BRG_SUCCESS);
  boot_put_u32(go + 24, 0);
  for (int k = 0; k < r->nranks; k++) {
    memcpy(go + 4, r->rank_tag + (size_t)k * BOOT_SECRET_BYTES, BOOT_SECRET_BYTES);
    (void)boot_send_all(r->rank_fd[k], go, sizeof go, brg__now_ms() + BOOT_REPLY_SEND_MS, NULL);
    brg__sock_close(&r->rank_fd[k]);
  }
  BRG__INFO(BOOT_SUBSYS, "bootstrap root %s: all %d ranks confirmed; released", r->where,
            (int)r->nranks);
}

/* The ranks that have not confirmed, for the message when time is up. */
static void boot_root_unconfirmed(boot_root *r) {
  char list[512];
  size_t used = 0;
  list[0] = '\0';
  for (int k = 0; k < r->nranks && used + 16 < sizeof list; k++)
    if (!r->confirmed[k])
      used += (size_t)snprintf(list + used, sizeof list - used, "%s%d", used ? "," : "", k);
  char text[BOOT_MAX_ERRTEXT];
  snprintf(text, sizeof text, "rank(s) %s did not confirm their set-up within %d ms", list,
           4 * r->timeout_ms + 5000);
  boot_root_fail_all(r, text);
}

static void boot_root_free(boot_root *r) {
  for (int i = 0; i < r->nconns; i++)
    if (r->conns[i]) boot_conn_drop(r, i);
  if (r->rank_fd)
    for (int k = 0; k < r->nranks; k++) brg__sock_close(&r->rank_fd[k]);
  brg__sock_close(&r->lfd);
  free(r->rank_fd);
  free(r->rank_tag);
  free(r->table);
  free(r->confirmed);
  free(r->told);
  free(r->claims);
  free(r);
}

/* Reads and judges what the pending connections sent; drops the overdue. */
static void boot_root_service_all(boot_root *r, const struct pollfd *pfd, int64_t now) {
  for (int i = 0; i < r->nconns; i++) {
    if (pfd[i].revents && boot_conn_service(r, i)) continue;
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
}

/*
 * Phases: gathering hellos until every rank has arrived; the tree parents
 * sent,
 * gathering confirmations until every rank has confirmed, then the release;
 * or, once the job has failed (a rank claimed twice, a rank gone before it
 * confirmed, time up), telling every rank why, until each has been told or
 * the deadline. The listener stays open until the end, so that a second
 * claim of a rank is seen however late in the set-up it comes.
 */
static int boot_roots_running; /* atomic: root threads of this process */

void brg__boot_root_linger(int max_ms) {
  int64_t end = brg__now_ms() + max_ms;
  while (__atomic_load_n(&boot_roots_running, __ATOMIC_ACQUIRE) > 0 && brg__now_ms() < end)
    brg__sleep_ms(10);
}

static void *boot_root_main(void *arg) {
  boot_root *r = arg;
  struct pollfd *pfd = NULL;
  int *pfd_rank = NULL;
  size_t cap = 0;
  for (;;) {
    if (r->failed) {
      if (r->nranks > 0 && boot_root_all_told(r)) break;
    } else if (r->tables_sent) {
      if (r->nconfirmed == r->nranks) {
        boot_root_release(r);
        break;
      }
    } else if (r->nranks > 0 && r->arrived == r->nranks && boot_root_prune(r) == 0) {
      boot_root_send_tables(r);
      continue;
    }
    int64_t now = brg__now_ms();
    if (r->deadline >= 0 && now >= r->deadline) {
      if (r->failed) break;
      if (r->tables_sent) {
        boot_root_unconfirmed(r);
        continue;
      }
      boot_root_give_up(r);
      break;
    }
    size_t need = 1 + BOOT_MAX_PENDING + (size_t)r->nranks;
    if (need > cap) {
      struct pollfd *np = realloc(pfd, need * sizeof *pfd);
      if (np) pfd = np;
      int *nr = realloc(pfd_rank, need * sizeof *pfd_rank);
      if (nr) pfd_rank = nr;
      if (!np || !nr) {
        boot_root_fail_all(r, "the bootstrap root ran out of memory");
        break;
      }
      cap = need;
    }
    int64_t wake = r->deadline;
    int n = 0;
    /* All places taken by strangers too young to drop: the listen queue
     * waits until the oldest may go. */
    int lsn_wait = r->accept_wake > now && r->nconns >= r->pending_cap;
    pfd[n++] = (struct pollfd){.fd = lsn_wait ? -1 : r->lfd, .events = POLLIN};
    if (lsn_wait && (wake < 0 || r->accept_wake < wake)) wake = r->accept_wake;
    for (int i = 0; i < r->nconns; i++) {
      pfd[n++] = (struct pollfd){.fd = r->conns[i]->fd, .events = POLLIN};
      if (wake < 0 || r->conns[i]->deadline < wake) wake = r->conns[i]->deadline;
    }
    int ranks_at = n;
    if (r->tables_sent && !r->failed)
      for (int k = 0; k < r->nranks; k++)
        if (r->rank_fd[k] >= 0 && !r->confirmed[k]) {
          pfd_rank[n] = k;
          pfd[n++] = (struct pollfd){.fd = r->rank_fd[k], .events = POLLIN};
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
    boot_root_service_all(r, pfd + 1, now);
    for (int j = ranks_at; j < n && !r->failed; j++)
      if (pfd[j].revents) boot_root_confirm(r, pfd_rank[j]);
    boot_root_compact(r);
    if ((pfd[0].revents & POLLIN) || (r->accept_wake && r->accept_wake <= now)) {
      r->accept_wake = 0;
      boot_root_accept(r);
    }
  }
  free(pfd);
  free(pfd_rank);
  boot_root_free(r);
  __atomic_fetch_sub(&boot_roots_running, 1, __ATOMIC_ACQ_REL);
  return NULL;
}

/* The root's whole judgement of connections, without its listener or its
 * thread: each fd (non-blocking, already connected) is served as an accepted
 * connection, a few rounds, in order; when every rank of a job arrived,
 * the tree parents are sent as the root would, and confirmations
 * already there are read (all of them: the release). For the fuzzer. */
void brg__boot_root_serve(const uint8_t *secret, const uint8_t *nonce, const int *fds, int nfds,
                          int rounds) {
  boot_root *r = calloc(1, sizeof *r);
  if (!r) return;
  r->lfd = -1;
  r->deadline = -1;
  memcpy(r->secret, secret, BOOT_SECRET_BYTES);
  r->fixed_nonce = nonce;
  snprintf(r->where, sizeof r->where, "(served fds)");
  for (int i = 0; i < nfds && r->nconns < BOOT_MAX_PENDING; i++) {
    boot_conn *c = calloc(1, sizeof *c);
    if (!c) break;
    c->fd = fds[i];
    c->want = BOOT_HELLO_HDR;
    c->deadline = brg__now_ms() + BOOT_CONN_TIMEOUT_MS;
    snprintf(c->peer, sizeof c->peer, "fd %d", fds[i]);
    r->conns[r->nconns++] = c;
    (void)boot_conn_challenge(r, c); /* the fuzzer's peer may be gone: served all the same */
  }
  for (int round = 0; round < rounds; round++) {
    for (int i = 0; i < r->nconns; i++)
      if (r->conns[i]) boot_conn_service(r, i);
    boot_root_compact(r);
  }
  if (r->nranks > 0 && r->arrived == r->nranks && boot_root_prune(r) == 0) {
    boot_root_send_tables(r);
    /* confirmations that are already there */
    for (int k = 0; k < r->nranks && r->tables_sent && !r->failed; k++) {
      struct pollfd p = {.fd = r->rank_fd[k], .events = POLLIN};
      if (poll(&p, 1, 0) == 1) boot_root_confirm(r, k);
    }
    if (r->tables_sent && !r->failed && r->nconfirmed == r->nranks) boot_root_release(r);
  }
  boot_root_free(r);
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
  brg_status st = brg__sock_listen(addr, port, BOOT_BACKLOG, BOOT_SUBSYS, "bootstrap root", &r->lfd,
                                   &bound, err);
  if (st != BRG_SUCCESS) goto err_free;
  st = brg__boot_id_make(&tmp, addr, bound, secret, err);
  if (st != BRG_SUCCESS) goto err_free;
  memcpy(r->secret, tmp.secret, sizeof r->secret);
  char where[BOOT_PEER_LEN];
  brg__sock_hostport(where, sizeof where, addr, bound);
  memcpy(r->where, where, sizeof where);
  r->timeout_ms = timeout_ms;
  r->pending_cap = boot_root_pending_cap(r, r->lfd);
  /* The ranks wait timeout_ms each, from their own start, which is after
   * this one for every rank that can reach the root: giving up a tenth
   * earlier (at most 2 s) brings them the list of the missing ranks before
   * their own deadlines. */
  r->gather_ms =
      timeout_ms > 0 ? timeout_ms - (timeout_ms / 10 < 2000 ? timeout_ms / 10 : 2000) : timeout_ms;
  r->deadline = brg__deadline_ms(r->gather_ms);

  pthread_attr_t attr;
  pthread_t thread;
  int rc = pthread_attr_init(&attr);
  if (rc == 0) {
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    __atomic_fetch_add(&boot_roots_running, 1, __ATOMIC_ACQ_REL);
    rc = pthread_create(&thread, &attr, boot_root_main, r);
    if (rc != 0) __atomic_fetch_sub(&boot_roots_running, 1, __ATOMIC_ACQ_REL);
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
