/*
 * The bootstrap table's all-gather over a binary tree of the ranks, so that
 * the root only admits ranks and hands each its parent (layouts in
 * bootstrap_wire.h):
 *
 *                 0            up:   each rank waits for its children's
 *              /     \               subtrees, adds its own entry and sends
 *             1       2              the lot to its parent
 *            / \     / \     down:   rank 0 holds every entry; the table
 *           3   4   5   6            goes down the same edges
 *
 * 2*ceil(log2(N+1)) hops in all, and each rank sends at most three tables
 * and receives one. Children dial their parent's ring listener (a ring
 * neighbour cannot dial it before the table exists, which needs this rank's
 * subtree first), strangers there are dropped as at the ring, and while it
 * waits a rank watches its connection to the root, which speaks before the
 * release only when the job failed.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bootstrap_wire.h"
#include "clock.h"
#include "secret.h"

#define TREE_ROOT_SPOKE 100 /* a wait's answer beside BRG__IO_* */

int brg__boot_tree_has(int c, int r) {
  while (r > c) r = (r - 1) / 2;
  return r == c;
}

static int tree_subtree_size(int c, int n) {
  /* Level by level: the subtree of c holds [c*2^d + 2^d - 1, +2^d) at depth d. */
  long long first = c, width = 1, size = 0;
  while (first < n) {
    long long last = first + width - 1;
    size += (last < n ? last : n - 1) - first + 1;
    first = 2 * first + 1;
    width *= 2;
  }
  return (int)size;
}

static size_t tree_entry_bytes(const brg__boot_tree *t) {
  return BOOT_ENTRY_HDR + t->blob_bytes;
}

static uint8_t *tree_slot(const brg__boot_tree *t, uint8_t *table, int rank) {
  return table + BOOT_REPLY_HDR + BOOT_TABLE_HDR + (size_t)rank * tree_entry_bytes(t);
}

/* Waits until fd is readable, or the root speaks, or the deadline. */
static int tree_wait(const brg__boot_tree *t, int fd, short events) {
  for (;;) {
    struct pollfd p[2] = {{.fd = fd, .events = events}, {.fd = t->root_fd, .events = POLLIN}};
    int64_t now = brg__now_ms();
    if (t->deadline >= 0 && now >= t->deadline) return BRG__IO_TIMEOUT;
    int left = t->deadline < 0 ? -1 : (int)(t->deadline - now);
    int rc = poll(p, t->root_fd >= 0 ? 2 : 1, left);
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) return BRG__IO_ERR;
    if (t->root_fd >= 0 && p[1].revents) return TREE_ROOT_SPOKE;
    if (p[0].revents) return BRG__IO_OK;
  }
}

/* recv_all that gives way to the root's word. */
static int tree_recv(const brg__boot_tree *t, int fd, void *buf, size_t len) {
  int rc = tree_wait(t, fd, POLLIN);
  if (rc != BRG__IO_OK) return rc;
  return brg__sock_recv_all(fd, buf, len, t->deadline);
}

/* The dialer's stop check: the root spoke (it fails the job early). */
static int root_spoke_now(void *arg) {
  const brg__boot_tree *t = arg;
  if (t->root_fd < 0) return 0;
  struct pollfd p = {.fd = t->root_fd, .events = POLLIN};
  return poll(&p, 1, 0) == 1;
}

static brg_status tree_io_error(const brg__boot_tree *t, int rc, int *root_spoke, brg__errbuf *err,
                                const char *what, int peer) {
  if (rc == TREE_ROOT_SPOKE) {
    *root_spoke = 1;
    return brg__error_quiet(err, BRG_ERR_REMOTE, "the bootstrap root spoke");
  }
  if (rc == BRG__IO_TIMEOUT)
    return brg__error(err, BRG_ERR_TIMEOUT, BOOT_SUBSYS,
                      "rank %d: %s tree rank %d: nothing within %d ms (that rank or one below it "
                      "is stuck?)",
                      t->rank, what, peer, t->timeout_ms);
  if (rc == BRG__IO_EOF)
    return brg__error(err, BRG_ERR_REMOTE, BOOT_SUBSYS,
                      "rank %d: %s tree rank %d: it closed the connection (process died?)", t->rank,
                      what, peer);
  return brg__error(err, BRG_ERR_SYSTEM, BOOT_SUBSYS, "rank %d: %s tree rank %d: %s", t->rank, what,
                    peer, strerror(errno));
}

brg_status brg__boot_tree_read_gather(const brg__boot_tree *t, int fd, int child, uint8_t *table,
                                      uint8_t *filled, int *root_spoke, brg__errbuf *err) {
  uint8_t b[BOOT_GATHER_HDR];
  int rc = tree_recv(t, fd, b, sizeof b);
  if (rc != BRG__IO_OK) return tree_io_error(t, rc, root_spoke, err, "the gather from", child);
  uint32_t count = boot_get_u32(b), want = (uint32_t)tree_subtree_size(child, t->nranks);
  if (count != want)
    return brg__error(err, BRG_ERR_REMOTE, BOOT_SUBSYS,
                      "rank %d: malformed gather from tree child rank %d: %u entries, its subtree "
                      "has %u",
                      t->rank, child, count, want);
  for (uint32_t i = 0; i < count; i++) {
    rc = tree_recv(t, fd, b, BOOT_GATHER_RANK);
    if (rc != BRG__IO_OK) return tree_io_error(t, rc, root_spoke, err, "the gather from", child);
    int32_t r = (int32_t)boot_get_u32(b);
    if (r < 0 || r >= t->nranks || !brg__boot_tree_has(child, r) || filled[r])
      return brg__error(err, BRG_ERR_REMOTE, BOOT_SUBSYS,
                        "rank %d: malformed gather from tree child rank %d: entry for rank %d "
                        "(%s)",
                        t->rank, child, (int)r,
                        r < 0 || r >= t->nranks ? "out of range"
                        : filled[r]             ? "given twice"
                                                : "not in its subtree");
    uint8_t *e = tree_slot(t, table, r);
    rc = brg__sock_recv_all(fd, e, tree_entry_bytes(t), t->deadline);
    if (rc != BRG__IO_OK) return tree_io_error(t, rc, root_spoke, err, "the gather from", child);
    if (!memchr(e, '\0', BOOT_ADDR_BYTES) || !brg__sock_addr_is_numeric((const char *)e) ||
        boot_get_u16(e + 64) == 0 || boot_get_u16(e + 66) != 0)
      return brg__error(err, BRG_ERR_REMOTE, BOOT_SUBSYS,
                        "rank %d: malformed gather from tree child rank %d: bad address for rank "
                        "%d",
                        t->rank, child, (int)r);
    filled[r] = 1;
  }
  return BRG_SUCCESS;
}

/* A connection to the listener that has not yet said who it is. */
typedef struct tree_pending {
  int fd;
  uint8_t challenge[BOOT_NONCE_BYTES]; /* sent on accept */
  uint32_t got;
  int64_t deadline;
  uint8_t m[BOOT_RING_HELLO];
} tree_pending;

typedef struct tree_accept {
  const brg__boot_tree *t;
  int child[2], nchild;
  int fd[2];                         /* per child, once it proved itself */
  uint8_t tag[2][BOOT_SECRET_BYTES]; /* of the answers to each child */
  int npending;
  tree_pending q[BOOT_RING_MAX_PENDING];
} tree_accept;

static void tree_pending_drop(tree_accept *a, int i, const char *why) {
  BRG__WARN(BOOT_SUBSYS,
            "rank %d: dropped a connection to its listener (expected tree children): %s",
            a->t->rank, why);
  close(a->q[i].fd);
  memmove(&a->q[i], &a->q[i + 1], (size_t)(a->npending - i - 1) * sizeof a->q[0]);
  a->npending--;
}

static void tree_pending_read(tree_accept *a, int i) {
  tree_pending *e = &a->q[i];
  ssize_t n = recv(e->fd, e->m + e->got, sizeof e->m - e->got, MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
  if (n <= 0) {
    tree_pending_drop(a, i, "it hung up");
    return;
  }
  e->got += (uint32_t)n;
  if (e->got < sizeof e->m) return;
  int32_t from = -1, to = -1;
  const char *bad = NULL;
  int ok = brg__boot_peer_hello_check(e->m, BOOT_TREE_MAGIC, a->t->secret, e->challenge, &from, &to,
                                      &bad);
  int k = -1;
  for (int j = 0; j < a->nchild && ok; j++)
    if (from == a->child[j] && a->fd[j] < 0) k = j;
  if (!ok) {
    tree_pending_drop(a, i, bad);
  } else if (to != a->t->rank || k < 0) {
    char why[96];
    snprintf(why, sizeof why, "it says it is rank %d connecting to rank %d", (int)from, (int)to);
    tree_pending_drop(a, i, why);
  } else {
    a->fd[k] = e->fd;
    brg__boot_answer_tag(a->tag[k], a->t->secret, e->m + BOOT_RING_HELLO_NONCE);
    memmove(&a->q[i], &a->q[i + 1], (size_t)(a->npending - i - 1) * sizeof a->q[0]);
    a->npending--;
  }
}

/* Accepts the children; each has proved itself with its tree hello. */
static brg_status tree_accept_children(tree_accept *a, int *root_spoke, brg__errbuf *err) {
  const brg__boot_tree *t = a->t;
  for (;;) {
    int missing = -1;
    for (int j = 0; j < a->nchild; j++)
      if (a->fd[j] < 0) missing = a->child[j];
    if (missing < 0) return BRG_SUCCESS;
    int64_t now = brg__now_ms();
    if (t->deadline >= 0 && now >= t->deadline)
      return brg__error(err, BRG_ERR_TIMEOUT, BOOT_SUBSYS,
                        "rank %d: tree child rank %d did not connect within %d ms", t->rank,
                        missing, t->timeout_ms);
    for (int i = a->npending - 1; i >= 0; i--)
      if (now >= a->q[i].deadline) tree_pending_drop(a, i, "it did not introduce itself in time");
    struct pollfd pfd[2 + BOOT_RING_MAX_PENDING];
    int np = 0;
    int64_t wake = t->deadline;
    pfd[np++] = (struct pollfd){.fd = t->listen_fd, .events = POLLIN};
    pfd[np++] = (struct pollfd){.fd = t->root_fd, .events = POLLIN};
    for (int i = 0; i < a->npending; i++) {
      pfd[np++] = (struct pollfd){.fd = a->q[i].fd, .events = POLLIN};
      wake = brg__deadline_min(wake, a->q[i].deadline);
    }
    int left = wake < 0 ? -1 : wake <= now ? 0 : (int)(wake - now);
    if (poll(pfd, (nfds_t)np, left) < 0) {
      if (errno == EINTR) continue;
      return brg__error(err, BRG_ERR_SYSTEM, BOOT_SUBSYS, "rank %d: poll on its listener: %s",
                        t->rank, strerror(errno));
    }
    if (t->root_fd >= 0 && pfd[1].revents) {
      *root_spoke = 1;
      return brg__error_quiet(err, BRG_ERR_REMOTE, "the bootstrap root spoke");
    }
    for (int i = a->npending - 1; i >= 0; i--)
      if (pfd[2 + i].revents) tree_pending_read(a, i);
    if (!(pfd[0].revents & POLLIN)) continue;
    for (int k = 0; k < BOOT_RING_MAX_PENDING / 4; k++) {
      int fd = accept4(t->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        if ((errno == EMFILE || errno == ENFILE) && a->npending > 0) {
          /* Strangers hold the descriptors: the oldest makes room, the
           * listen queue keeps the rest. */
          tree_pending_drop(a, 0, "out of file descriptors");
          break;
        }
        if (errno == EMFILE || errno == ENFILE)
          return brg__error(err, BRG_ERR_SYSTEM, BOOT_SUBSYS,
                            "rank %d: accepting its tree children: %s (out of file descriptors: "
                            "raise ulimit -n)",
                            t->rank, strerror(errno));
        if (errno == ENOBUFS || errno == ENOMEM) break;
        return brg__error(err, BRG_ERR_SYSTEM, BOOT_SUBSYS, "rank %d: accept on its listener: %s",
                          t->rank, strerror(errno));
      }
      uint8_t ch[BOOT_CHALLENGE_BYTES], nonce[BOOT_NONCE_BYTES];
      if (brg__boot_challenge_make(ch, nonce, t->fixed_nonce, NULL) != BRG_SUCCESS ||
          send(fd, ch, sizeof ch, MSG_DONTWAIT | MSG_NOSIGNAL) != (ssize_t)sizeof ch) {
        close(fd); /* a fresh socket takes 24 bytes: this one is gone already */
        continue;
      }
      if (a->npending == BOOT_RING_MAX_PENDING)
        tree_pending_drop(a, 0, "too many connections that have not introduced themselves");
      a->q[a->npending] =
          (tree_pending){.fd = fd, .got = 0, .deadline = now + BOOT_TREE_CONN_TIMEOUT_MS};
      memcpy(a->q[a->npending++].challenge, nonce, sizeof nonce);
    }
  }
}

/* Sends count + the entries of this rank's subtree up to the parent. */
static brg_status tree_send_up(const brg__boot_tree *t, int fd, uint8_t *table, int parent,
                               brg__errbuf *err) {
  int count = tree_subtree_size(t->rank, t->nranks);
  size_t eb = tree_entry_bytes(t);
  size_t bytes = BOOT_GATHER_HDR + (size_t)count * (BOOT_GATHER_RANK + eb);
  uint8_t *m = malloc(bytes);
  if (!m)
    return brg__error(err, BRG_ERR_NO_MEMORY, BOOT_SUBSYS,
                      "rank %d: no memory for a %zu-byte gather", t->rank, bytes);
  boot_put_u32(m, (uint32_t)count);
  uint8_t *p = m + BOOT_GATHER_HDR;
  for (int r = t->rank; r < t->nranks; r++) {
    if (!brg__boot_tree_has(t->rank, r)) continue;
    boot_put_u32(p, (uint32_t)r);
    memcpy(p + BOOT_GATHER_RANK, tree_slot(t, table, r), eb);
    p += BOOT_GATHER_RANK + eb;
  }
  int rc = brg__sock_send_all(fd, m, bytes, t->deadline, NULL);
  free(m);
  if (rc == BRG__IO_OK) return BRG_SUCCESS;
  int dummy = 0;
  return tree_io_error(t, rc, &dummy, err, "sending its subtree to", parent);
}

brg_status brg__boot_tree_gather(const brg__boot_tree *t, uint8_t **table_out,
                                 size_t *table_bytes_out, int *root_spoke, brg__errbuf *err) {
  *root_spoke = 0;
  size_t eb = tree_entry_bytes(t);
  size_t body = BOOT_TABLE_HDR + (size_t)t->nranks * eb, total = BOOT_REPLY_HDR + body;
  int parent = t->rank > 0 ? (t->rank - 1) / 2 : -1;
  uint8_t *table = calloc(1, total), *filled = calloc((size_t)t->nranks, 1);
  tree_accept a = {.t = t, .fd = {-1, -1}};
  int up = -1;
  brg_status st = BRG_SUCCESS;
  if (!table || !filled) {
    st = brg__error(err, BRG_ERR_NO_MEMORY, BOOT_SUBSYS, "rank %d: no memory for a %zu-byte table",
                    t->rank, total);
    goto out;
  }
  boot_put_u32(table, BOOT_TABLE_MAGIC);
  boot_put_u32(table + 20, BRG_SUCCESS);
  boot_put_u32(table + 24, (uint32_t)body);
  boot_put_u32(table + BOOT_REPLY_HDR, (uint32_t)t->nranks);
  boot_put_u32(table + BOOT_REPLY_HDR + 4, (uint32_t)t->blob_bytes);
  memcpy(tree_slot(t, table, t->rank), t->entry, eb);
  filled[t->rank] = 1;
  for (int c = 2 * t->rank + 1; c <= 2 * t->rank + 2 && c < t->nranks; c++) a.child[a.nchild++] = c;

  /* The parent's listener was open before its hello reached the root, so
   * a refusal means the parent gave up: the job failed, and the root says
   * why (the dial stops when it speaks). */
  if (parent >= 0) {
    int e = 0;
    brg__sock_dialer d = {.retry_ms = BOOT_RETRY_MS,
                          .retry_max_ms = BOOT_RETRY_MS,
                          .stop = root_spoke_now,
                          .arg = (void *)t};
    int rc = brg__sock_dial(t->parent_addr, t->parent_port, t->deadline, &d, &up, &e);
    if (rc == BRG__IO_STOPPED) {
      st = tree_io_error(t, TREE_ROOT_SPOKE, root_spoke, err, "dialing", parent);
      goto out;
    }
    if (rc != BRG__IO_OK) {
      st = brg__error(
          err, rc == BRG__IO_TIMEOUT ? BRG_ERR_TIMEOUT : BRG_ERR_SYSTEM, BOOT_SUBSYS,
          "rank %d could not connect to its tree parent rank %d at %s:%u: %s%s", t->rank, parent,
          t->parent_addr, t->parent_port, e ? strerror(e) : "timed out",
          e == EMFILE || e == ENFILE ? " (out of file descriptors: raise ulimit -n)" : "");
      goto out;
    }
    /* The parent speaks first: its challenge. */
    uint8_t challenge[BOOT_NONCE_BYTES];
    const char *bad = NULL;
    rc = tree_wait(t, up, POLLIN);
    if (rc == BRG__IO_OK) rc = brg__boot_challenge_read(up, challenge, t->deadline, &bad);
    if (rc != BRG__IO_OK) {
      st = bad ? brg__error(err, BRG_ERR_REMOTE, BOOT_SUBSYS, "rank %d: tree parent rank %d: %s",
                            t->rank, parent, bad)
               : tree_io_error(t, rc, root_spoke, err, "the challenge of", parent);
      goto out;
    }
    uint8_t m[BOOT_RING_HELLO];
    boot_put_u32(m, BOOT_TREE_MAGIC);
    boot_put_u32(m + 20, (uint32_t)t->rank);
    boot_put_u32(m + 24, (uint32_t)parent);
    if ((st = brg__boot_random(m + BOOT_RING_HELLO_NONCE, BOOT_NONCE_BYTES, err)) != BRG_SUCCESS)
      goto out;
    brg__boot_sign(m, sizeof m, t->secret, challenge);
    /* What the parent's table will carry. */
    brg__boot_answer_tag(table + 4, t->secret, m + BOOT_RING_HELLO_NONCE);
    rc = brg__sock_send_all(up, m, sizeof m, t->deadline, NULL);
    if (rc != BRG__IO_OK) {
      st = tree_io_error(t, rc, root_spoke, err, "saying hello to", parent);
      goto out;
    }
  }
  if ((st = tree_accept_children(&a, root_spoke, err)) != BRG_SUCCESS) goto out;
  for (int j = 0; j < a.nchild; j++)
    if ((st = brg__boot_tree_read_gather(t, a.fd[j], a.child[j], table, filled, root_spoke, err)) !=
        BRG_SUCCESS)
      goto out;

  if (parent >= 0) {
    if ((st = tree_send_up(t, up, table, parent, err)) != BRG_SUCCESS) goto out;
    /* The table down: the same header and size that rank 0 built. */
    uint8_t hdr[BOOT_REPLY_HDR + BOOT_TABLE_HDR];
    int rc = tree_recv(t, up, hdr, sizeof hdr);
    if (rc != BRG__IO_OK) {
      st = tree_io_error(t, rc, root_spoke, err, "waiting for the table from", parent);
      goto out;
    }
    if (!brg__ct_equal(hdr, table, sizeof hdr)) {
      st = brg__error(err, BRG_ERR_REMOTE, BOOT_SUBSYS,
                      "rank %d: malformed table from tree parent rank %d (header differs)", t->rank,
                      parent);
      goto out;
    }
    rc = brg__sock_recv_all(up, table + sizeof hdr, total - sizeof hdr, t->deadline);
    if (rc != BRG__IO_OK) {
      st = tree_io_error(t, rc, root_spoke, err, "the table from", parent);
      goto out;
    }
  }
  for (int j = 0; j < a.nchild; j++) {
    memcpy(table + 4, a.tag[j], BOOT_SECRET_BYTES);
    int rc = brg__sock_send_all(a.fd[j], table, total, t->deadline, NULL);
    if (rc != BRG__IO_OK) {
      st = tree_io_error(t, rc, root_spoke, err, "sending the table to", a.child[j]);
      goto out;
    }
  }
out:
  for (int i = 0; i < a.npending; i++) close(a.q[i].fd);
  for (int j = 0; j < 2; j++) brg__sock_close(&a.fd[j]);
  brg__sock_close(&up);
  free(filled);
  if (st != BRG_SUCCESS) {
    free(table);
    return st;
  }
  *table_out = table;
  *table_bytes_out = total;
  return BRG_SUCCESS;
}
