/*
 * The software verbs backend: one TCP socket per queue pair and one progress
 * thread per queue pair that plays both the requester and the responder of
 * an RC queue pair.
 *
 *   post_write -> send queue -> progress ==socket==> progress -> registered memory
 *                                  ^                     |      (checked by rkey)
 *                                  +------- ACK/NAK -----+
 *
 * On the wire a message is a soft_hdr, then `len` payload bytes for writes.
 * The responder checks the rkey and the bounds before it places a byte; a
 * write-with-immediate then consumes the oldest posted receive and completes
 * it with the immediate. Every write is acknowledged in order (ACKs carry a
 * count), and the requester completes its work requests only on the ACK, as
 * an RC queue pair does, so a completion means the data is in place.
 * A NAK (bad rkey, out of bounds, no receive posted) fails that work request
 * and moves both queue pairs to error: what was posted after it is flushed.
 *
 * All socket I/O happens on the progress thread, non-blocking, so a full
 * socket never stops this side from reading (two ends writing to each other
 * cannot deadlock).
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "clock.h"
#include "sock.h"
#include "transport.h"
#include "verbs_api.h"

/* A queue pair listener. */
#define SOFT_PENDING 16    /* connections part way through their hello */
#define SOFT_HELLO_MS 2000 /* a connection has this long to send it (transport/net.h) */
#define SOFT_BACKLOG 4096  /* the kernel caps it at somaxconn */

#define SOFT_HELLO_MAGIC 0x42525651u /* "BRVQ" */
#define SOFT_MAX_MRS 1024            /* a power of two; one context serves all links of a process */
#define SOFT_STAGE_BYTES 65536       /* payload staged per step, each way */
#define SOFT_ATOMIC_BYTES 64         /* writes this small are placed word by word */

enum { SOFT_WRITE = 1, SOFT_WRITE_IMM = 2, SOFT_ACK = 3 };

typedef struct soft_hdr {
  uint8_t op;
  uint8_t status; /* ACK: BRG__VB_WC_* */
  uint16_t pad;
  uint32_t len; /* WRITE: payload bytes; ACK: how many work requests */
  uint64_t raddr;
  uint32_t rkey;
  uint32_t imm;
} soft_hdr;

typedef struct soft_hello {
  uint32_t magic;
  uint32_t to_qpn;   /* the passive end's token */
  uint32_t from_qpn; /* the active end's token */
  uint32_t pad;
} soft_hello;

typedef struct soft_mr {
  uintptr_t addr;
  size_t len;
  uint32_t rkey; /* 0: free entry */
} soft_mr;

struct brg__vb_ctx {
  char addr[64];
  pthread_mutex_t lock;
  soft_mr mrs[SOFT_MAX_MRS];
  uint32_t key_seed, key_next;
};

typedef struct soft_swr {
  uint64_t wr_id;
  const char *laddr;
  uint32_t len;
  uint64_t raddr;
  uint32_t rkey;
  uint32_t imm;
  uint8_t with_imm, signaled;
} soft_swr;

struct brg__vb_qp {
  brg__vb_ctx *ctx;
  int listen_fd, fd;
  int wake[2];
  uint32_t token;
  pthread_t thread;
  int thread_started;
  void (*notify)(void *);
  void *notify_arg;
  int stopping; /* set by qp_destroy, read by the progress thread (atomically) */

  pthread_mutex_t lock; /* everything below */
  int error;            /* nonzero BRG__VB_WC_*: the queue pair is in error */
  int max_send, max_recv, cq_cap;
  soft_swr *sq;
  uint64_t sq_tail, sq_sent, sq_done; /* posted, picked for the wire, acknowledged */
  uint64_t *rq;
  uint64_t rq_head, rq_tail;
  brg__vb_wc *cq;
  uint64_t cq_head, cq_tail;
  uint32_t ack_ok; /* responder: writes placed and not yet acknowledged */
  int ack_err;     /* responder: a NAK to send after them */

  /* progress thread only: the message coming in */
  soft_hdr in_hdr;
  size_t in_got;
  int in_payload, in_bad;
  char *in_dst;
  size_t in_left, in_staged;
  char *in_stage; /* payload received, not yet placed (or thrown away) */
  /* The message going out, under out_lock: the progress thread sends, and so
   * does post_write when the socket is free, which saves a thread hop. */
  pthread_mutex_t out_lock;
  int out_broken;
  soft_hdr out_hdr;
  const char *out_payload;
  size_t out_len, out_off;
  char *out_stage; /* payload bytes [stage_at, stage_at + stage_len) */
  size_t stage_at, stage_len;
  int out_busy, out_is_write;
};

static const char *wc_text(int status) {
  switch (status) {
  case BRG__VB_WC_SUCCESS: return "success";
  case BRG__VB_WC_REM_ACCESS: return "remote access error (soft: bad rkey or out of bounds)";
  case BRG__VB_WC_RNR: return "receiver not ready (soft: no receive posted)";
  case BRG__VB_WC_FLUSH: return "work request flushed";
  case BRG__VB_WC_TRANSPORT: return "transport error (soft: connection lost)";
  default: return "error";
  }
}

/* Test hook (brg__vb_soft_test_bad_rkey): write-with-immediates still to spoil. */
static int test_bad_rkey;

void brg__vb_soft_test_bad_rkey(int n) {
  __atomic_store_n(&test_bad_rkey, n, __ATOMIC_SEQ_CST);
}

static int soft_probe(char *why, size_t why_bytes) {
  (void)why;
  (void)why_bytes;
  return 1;
}

static brg_status soft_ctx_open(brg__vb_ctx **out, const char *addr, brg__errbuf *err) {
  if (!addr || !addr[0] || strlen(addr) >= sizeof((brg__vb_ctx *)0)->addr)
    return brg__error(err, BRG_ERR_INVALID_ARGUMENT, "ib", "soft verbs: no usable address");
  brg__vb_ctx *c = calloc(1, sizeof *c);
  if (!c) return brg__error(err, BRG_ERR_NO_MEMORY, "ib", "soft verbs: out of memory");
  snprintf(c->addr, sizeof c->addr, "%s", addr);
  pthread_mutex_init(&c->lock, NULL);
  if (getrandom(&c->key_seed, sizeof c->key_seed, 0) != sizeof c->key_seed)
    c->key_seed = (uint32_t)brg__now_ms() ^ (uint32_t)getpid();
  *out = c;
  return BRG_SUCCESS;
}

static void soft_ctx_close(brg__vb_ctx *c) {
  if (!c) return;
  pthread_mutex_destroy(&c->lock);
  free(c);
}

static brg_status soft_mr_reg(brg__vb_ctx *c, void *addr, size_t len, brg__vb_mr *out,
                              brg__errbuf *err) {
  pthread_mutex_lock(&c->lock);
  int slot = -1;
  for (int i = 0; i < SOFT_MAX_MRS && slot < 0; i++)
    if (!c->mrs[i].rkey) slot = i;
  if (slot < 0) {
    pthread_mutex_unlock(&c->lock);
    return brg__error(err, BRG_ERR_NO_MEMORY, "ib", "soft verbs: more than %d memory regions",
                      SOFT_MAX_MRS);
  }
  uint32_t key;
  do { /* keys look random so a stale or guessed one does not match */
    key = (c->key_seed + 0x9e3779b9u * ++c->key_next) & ~(uint32_t)(SOFT_MAX_MRS - 1);
    key |= (uint32_t)slot;
  } while (key == 0);
  c->mrs[slot] = (soft_mr){(uintptr_t)addr, len, key};
  pthread_mutex_unlock(&c->lock);
  *out = (brg__vb_mr){.addr = addr, .len = len, .lkey = key, .rkey = key, .impl = NULL};
  return BRG_SUCCESS;
}

/* The memory behind the dmabuf must already be mapped at iova here: writes
 * land through that mapping. */
static brg_status soft_mr_reg_dmabuf(brg__vb_ctx *c, int fd, uint64_t offset, size_t len,
                                     void *iova, brg__vb_mr *out, brg__errbuf *err) {
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0)
    return brg__error(err, BRG_ERR_INVALID_ARGUMENT, "ib", "soft verbs: dmabuf fd %d: %s", fd,
                      strerror(errno));
  if ((uint64_t)st.st_size < offset + len)
    return brg__error(err, BRG_ERR_INVALID_ARGUMENT, "ib",
                      "soft verbs: dmabuf of %lld bytes has no %zu bytes at offset %llu",
                      (long long)st.st_size, len, (unsigned long long)offset);
  return soft_mr_reg(c, iova, len, out, err);
}

static void soft_mr_dereg(brg__vb_ctx *c, brg__vb_mr *mr) {
  if (!mr->rkey) return;
  pthread_mutex_lock(&c->lock);
  soft_mr *m = &c->mrs[mr->rkey & (SOFT_MAX_MRS - 1)];
  if (m->rkey == mr->rkey) memset(m, 0, sizeof *m);
  pthread_mutex_unlock(&c->lock);
  memset(mr, 0, sizeof *mr);
}

/* The responder's check: where a write of len bytes to (raddr, rkey) goes,
 * or NULL when the key is unknown or the range leaves the region. */
static char *mr_target(brg__vb_ctx *c, uint64_t raddr, uint32_t rkey, size_t len) {
  char *dst = NULL;
  pthread_mutex_lock(&c->lock);
  const soft_mr *m = &c->mrs[rkey & (SOFT_MAX_MRS - 1)];
  if (rkey && m->rkey == rkey && raddr >= m->addr && raddr - m->addr <= m->len &&
      len <= m->len - (raddr - m->addr))
    dst = (char *)(uintptr_t)raddr;
  pthread_mutex_unlock(&c->lock);
  return dst;
}

/* ---- completions (lock held) -------------------------------------------- */

static void cq_push(brg__vb_qp *q, uint64_t wr_id, int opcode, int status, uint32_t imm,
                    uint32_t len) {
  if (q->cq_tail - q->cq_head >= (uint64_t)q->cq_cap) return; /* cannot happen: one per request */
  q->cq[q->cq_tail++ % (uint64_t)q->cq_cap] = (brg__vb_wc){.wr_id = wr_id,
                                                           .status = status,
                                                           .opcode = opcode,
                                                           .imm = imm,
                                                           .byte_len = len,
                                                           .status_text = wc_text(status)};
}

/* Moves the queue pair to error: the first outstanding send fails with
 * `status`, everything else posted is flushed. */
static void qp_fail(brg__vb_qp *q, int status) {
  if (q->error) return;
  q->error = status;
  int first = 1;
  for (; q->sq_done < q->sq_tail; q->sq_done++) {
    const soft_swr *w = &q->sq[q->sq_done % (uint64_t)q->max_send];
    cq_push(q, w->wr_id, BRG__VB_OP_WRITE, first ? status : BRG__VB_WC_FLUSH, 0, 0);
    first = 0;
  }
  q->sq_sent = q->sq_tail;
  for (; q->rq_head < q->rq_tail; q->rq_head++)
    cq_push(q, q->rq[q->rq_head % (uint64_t)q->max_recv], BRG__VB_OP_RECV_IMM, BRG__VB_WC_FLUSH, 0,
            0);
}

/* ---- the progress thread ------------------------------------------------ */

/* A complete header came in: decide where its payload goes. */
static void in_header(brg__vb_qp *q) {
  soft_hdr *h = &q->in_hdr;
  if (h->op == SOFT_ACK) {
    pthread_mutex_lock(&q->lock);
    if (h->status == BRG__VB_WC_SUCCESS) {
      for (uint32_t i = 0; i < h->len && q->sq_done < q->sq_sent; i++, q->sq_done++) {
        const soft_swr *w = &q->sq[q->sq_done % (uint64_t)q->max_send];
        if (w->signaled) cq_push(q, w->wr_id, BRG__VB_OP_WRITE, BRG__VB_WC_SUCCESS, 0, w->len);
      }
    } else {
      qp_fail(q, h->status);
    }
    pthread_mutex_unlock(&q->lock);
    if (q->notify) q->notify(q->notify_arg);
    q->in_got = 0;
    return;
  }
  q->in_payload = 1;
  q->in_left = h->len;
  pthread_mutex_lock(&q->lock);
  int err = q->error || q->ack_err; /* nothing is placed after a refused write */
  pthread_mutex_unlock(&q->lock);
  q->in_dst = err || h->len == 0 ? NULL : mr_target(q->ctx, h->raddr, h->rkey, h->len);
  q->in_bad = !err && h->len > 0 && !q->in_dst;
}

/* A write's payload is all in (or thrown away): acknowledge it, complete a
 * receive for a write-with-immediate. */
static void in_done(brg__vb_qp *q) {
  soft_hdr *h = &q->in_hdr;
  pthread_mutex_lock(&q->lock);
  if (!q->error && !q->ack_err) {
    if (q->in_bad) {
      q->ack_err = BRG__VB_WC_REM_ACCESS;
    } else if (h->op == SOFT_WRITE_IMM && q->rq_head == q->rq_tail) {
      q->ack_err = BRG__VB_WC_RNR;
    } else {
      if (h->op == SOFT_WRITE_IMM)
        cq_push(q, q->rq[q->rq_head++ % (uint64_t)q->max_recv], BRG__VB_OP_RECV_IMM,
                BRG__VB_WC_SUCCESS, h->imm, h->len);
      q->ack_ok++;
    }
  }
  pthread_mutex_unlock(&q->lock);
  if (q->notify) q->notify(q->notify_arg);
  q->in_got = 0;
  q->in_payload = 0;
}

/*
 * The NIC's DMA, played by this thread: a peer's write landing in
 * registered memory that the application polls without a lock, and a
 * write's payload read out of registered memory that the application
 * rewrites once the peer has it. What orders these accesses runs through
 * the peer, so the payload is staged: read out of registered memory before
 * it is sent, and placed into it after it arrived. The wire (every queue
 * pair of a context leads to the same peer process) is then a
 * happens-before edge from each staging to each later placement, which is
 * how ThreadSanitizer models a pipe or a socket within one process; the
 * soft_wire_* annotations say so to it, and are empty in other builds.
 * A write of at most SOFT_ATOMIC_BYTES (a clear-to-send entry) is placed a
 * word at a time in address order with release stores, so an application
 * that acquires its last word sees the words before it, as it expects of a
 * NIC that places data in order.
 */
#if defined(__SANITIZE_THREAD__)
#define SOFT_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define SOFT_TSAN 1
#endif
#endif
#ifdef SOFT_TSAN
void __tsan_acquire(void *addr);
void __tsan_release(void *addr);
static void soft_wire_release(brg__vb_ctx *ctx) {
  __tsan_release(ctx);
}
static void soft_wire_acquire(brg__vb_ctx *ctx) {
  __tsan_acquire(ctx);
}
#else
static void soft_wire_release(brg__vb_ctx *ctx) {
  (void)ctx;
}
static void soft_wire_acquire(brg__vb_ctx *ctx) {
  (void)ctx;
}
#endif

/* Places what was staged of the write coming in. */
static void in_place(brg__vb_qp *q) {
  soft_wire_acquire(q->ctx);
  char *dst = q->in_dst;
  size_t n = q->in_staged;
  if (n == q->in_hdr.len && n <= SOFT_ATOMIC_BYTES && n % 8 == 0 && (uintptr_t)dst % 8 == 0) {
    for (size_t k = 0; k < n; k += 8) {
      uint64_t w;
      memcpy(&w, q->in_stage + k, 8);
      __atomic_store_n((uint64_t *)(void *)(dst + k), w, __ATOMIC_RELEASE);
    }
  } else {
    memcpy(dst, q->in_stage, n);
  }
  q->in_dst += n;
  q->in_staged = 0;
}

/* Reads what the socket has. 0 to go on, -1 when the connection ended. */
static int progress_in(brg__vb_qp *q) {
  for (;;) {
    ssize_t n;
    if (!q->in_payload) {
      n = recv(q->fd, (char *)&q->in_hdr + q->in_got, sizeof q->in_hdr - q->in_got, MSG_DONTWAIT);
      if (n > 0) {
        q->in_got += (size_t)n;
        if (q->in_got == sizeof q->in_hdr) {
          if (q->in_hdr.op < SOFT_WRITE || q->in_hdr.op > SOFT_ACK) return -1;
          in_header(q);
          if (q->in_payload && q->in_left == 0) in_done(q);
        }
        continue;
      }
    } else {
      /* Without a destination, the stage takes it and forgets it. */
      size_t want = q->in_left, room = SOFT_STAGE_BYTES - q->in_staged;
      if (want > room) want = room;
      n = recv(q->fd, q->in_stage + q->in_staged, want, MSG_DONTWAIT);
      if (n > 0) {
        q->in_left -= (size_t)n;
        if (q->in_dst) {
          q->in_staged += (size_t)n;
          if (q->in_staged == SOFT_STAGE_BYTES || q->in_left == 0) in_place(q);
        }
        if (q->in_left == 0) in_done(q);
        continue;
      }
    }
    if (n == 0) return -1;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    return -1;
  }
}

/* Picks the next message to send (lock held): ACKs first, then writes. */
static int out_next(brg__vb_qp *q) {
  if (q->ack_ok) {
    q->out_hdr = (soft_hdr){.op = SOFT_ACK, .status = BRG__VB_WC_SUCCESS, .len = q->ack_ok};
    q->ack_ok = 0;
    q->out_payload = NULL;
    q->out_is_write = 0;
  } else if (q->ack_err > 0) {
    q->out_hdr = (soft_hdr){.op = SOFT_ACK, .status = (uint8_t)q->ack_err, .len = 1};
    q->ack_err = -1; /* sent; the responder accepts nothing more */
    qp_fail(q, BRG__VB_WC_FLUSH);
    q->out_payload = NULL;
    q->out_is_write = 0;
  } else if (!q->error && q->sq_sent < q->sq_tail) {
    /* Counted as sent when picked: its ACK may be read by the progress thread
     * before the thread that sends it gets to run again. */
    const soft_swr *w = &q->sq[q->sq_sent++ % (uint64_t)q->max_send];
    q->out_hdr = (soft_hdr){.op = w->with_imm ? SOFT_WRITE_IMM : SOFT_WRITE,
                            .len = w->len,
                            .raddr = w->raddr,
                            .rkey = w->rkey,
                            .imm = w->imm};
    q->out_payload = w->laddr;
    q->out_is_write = 1;
  } else {
    return 0;
  }
  q->out_len = sizeof q->out_hdr + (q->out_is_write ? q->out_hdr.len : 0);
  q->out_off = 0;
  q->stage_at = q->stage_len = 0;
  q->out_busy = 1;
  return 1;
}

/* Writes what the socket takes. 0 to go on, -1 when the connection failed. */
static int progress_out(brg__vb_qp *q) {
  for (;;) {
    if (!q->out_busy) {
      pthread_mutex_lock(&q->lock);
      int more = out_next(q);
      pthread_mutex_unlock(&q->lock);
      if (!more) return 0;
    }
    struct iovec iov[2];
    int n = 0;
    if (q->out_off < sizeof q->out_hdr)
      iov[n++] = (struct iovec){(char *)&q->out_hdr + q->out_off, sizeof q->out_hdr - q->out_off};
    if (q->out_is_write && q->out_hdr.len) {
      size_t off = q->out_off > sizeof q->out_hdr ? q->out_off - sizeof q->out_hdr : 0;
      if (off == q->stage_at + q->stage_len) {
        /* The next piece of the payload leaves registered memory here. */
        size_t left = q->out_hdr.len - off;
        q->stage_at = off;
        q->stage_len = left < SOFT_STAGE_BYTES ? left : SOFT_STAGE_BYTES;
        memcpy(q->out_stage, q->out_payload + off, q->stage_len);
        soft_wire_release(q->ctx);
      }
      iov[n++] =
          (struct iovec){q->out_stage + (off - q->stage_at), q->stage_at + q->stage_len - off};
    }
    struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)n};
    ssize_t r = sendmsg(q->fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
      return -1;
    }
    q->out_off += (size_t)r;
    if (q->out_off == q->out_len) q->out_busy = 0;
  }
}

static int out_wanted(brg__vb_qp *q) {
  pthread_mutex_lock(&q->out_lock);
  int busy = q->out_busy;
  pthread_mutex_unlock(&q->out_lock);
  if (busy) return 1;
  pthread_mutex_lock(&q->lock);
  int want = q->ack_ok || q->ack_err > 0 || (!q->error && q->sq_sent < q->sq_tail);
  pthread_mutex_unlock(&q->lock);
  return want;
}

static void *soft_progress(void *arg) {
  brg__vb_qp *q = arg;
  while (!__atomic_load_n(&q->stopping, __ATOMIC_ACQUIRE)) {
    struct pollfd pfd[2] = {{.fd = q->fd, .events = POLLIN | (out_wanted(q) ? POLLOUT : 0)},
                            {.fd = q->wake[0], .events = POLLIN}};
    int n = poll(pfd, 2, 100);
    if (n < 0 && errno != EINTR) break;
    if (n <= 0) continue;
    if (pfd[1].revents) {
      char buf[64];
      while (read(q->wake[0], buf, sizeof buf) > 0) {}
    }
    if (__atomic_load_n(&q->stopping, __ATOMIC_ACQUIRE)) break;
    int broken = 0;
    if (pfd[0].revents & (POLLIN | POLLERR | POLLHUP)) broken = progress_in(q) != 0;
    if (!broken) {
      pthread_mutex_lock(&q->out_lock);
      broken = progress_out(q) != 0 || q->out_broken;
      pthread_mutex_unlock(&q->out_lock);
    }
    if (broken) {
      pthread_mutex_lock(&q->lock);
      qp_fail(q, BRG__VB_WC_TRANSPORT);
      pthread_mutex_unlock(&q->lock);
      if (q->notify) q->notify(q->notify_arg);
      break;
    }
  }
  return NULL;
}

static void qp_wake(brg__vb_qp *q) {
  char b = 1;
  ssize_t r = write(q->wake[1], &b, 1);
  (void)r; /* a full pipe already wakes the thread */
}

/* ---- queue pairs ---------------------------------------------------------- */

static brg_status soft_qp_create(brg__vb_ctx *ctx, int max_send, int max_recv, brg__vb_qp **out,
                                 brg__vb_qp_info *info, brg__errbuf *err) {
  brg__vb_qp *q = calloc(1, sizeof *q);
  if (!q) return brg__error(err, BRG_ERR_NO_MEMORY, "ib", "soft verbs: out of memory");
  q->ctx = ctx;
  q->listen_fd = q->fd = q->wake[0] = q->wake[1] = -1;
  pthread_mutex_init(&q->lock, NULL);
  pthread_mutex_init(&q->out_lock, NULL);
  q->max_send = max_send;
  q->max_recv = max_recv;
  q->cq_cap = max_send + max_recv + 8;
  q->sq = calloc((size_t)max_send, sizeof *q->sq);
  q->rq = calloc((size_t)max_recv, sizeof *q->rq);
  q->cq = calloc((size_t)q->cq_cap, sizeof *q->cq);
  q->in_stage = malloc(SOFT_STAGE_BYTES);
  q->out_stage = malloc(SOFT_STAGE_BYTES);
  *out = q; /* from here on qp_destroy cleans up */
  if (!q->sq || !q->rq || !q->cq || !q->in_stage || !q->out_stage)
    return brg__error(err, BRG_ERR_NO_MEMORY, "ib", "soft verbs: out of memory");
  if (pipe2(q->wake, O_CLOEXEC | O_NONBLOCK) != 0)
    return brg__error(err, BRG_ERR_SYSTEM, "ib", "soft verbs: pipe: %s", strerror(errno));
  if (getrandom(&q->token, sizeof q->token, 0) != sizeof q->token)
    q->token = (uint32_t)brg__now_ms() * 2654435761u;

  uint16_t port;
  brg_status s = brg__sock_listen(ctx->addr, 0, SOFT_BACKLOG, "ib",
                                  "soft verbs: queue pair listener", &q->listen_fd, &port, err);
  if (s != BRG_SUCCESS) return s;
  memset(info, 0, sizeof *info);
  info->qpn = q->token;
  info->port = port;
  snprintf(info->addr, sizeof info->addr, "%s", ctx->addr);
  return BRG_SUCCESS;
}

/* The active end connects to the passive end's listener and names both
 * queue pairs. */
static brg_status dial(brg__vb_qp *q, const brg__vb_qp_info *r, int64_t deadline, int timeout_ms,
                       brg__errbuf *err) {
  if (!memchr(r->addr, 0, sizeof r->addr) || !brg__sock_addr_is_numeric(r->addr))
    return brg__error(err, BRG_ERR_INVALID_ARGUMENT, "ib", "soft verbs: bad peer address");
  brg__sock_dialer d = {.retry_ms = 10, .retry_max_ms = 10, .refused_only = 1};
  int e = 0;
  int rc = brg__sock_dial(r->addr, r->port, deadline, &d, &q->fd, &e);
  if (rc != BRG__IO_OK)
    return brg__error(err,
                      rc == BRG__IO_TIMEOUT || e == ETIMEDOUT ? BRG_ERR_TIMEOUT : BRG_ERR_SYSTEM,
                      "ib", "soft verbs: connecting the queue pair to %s port %u within %d ms: %s",
                      r->addr, (unsigned)r->port, timeout_ms, strerror(e));
  soft_hello h = {.magic = SOFT_HELLO_MAGIC, .to_qpn = r->qpn, .from_qpn = q->token};
  rc = brg__sock_send_all(q->fd, &h, sizeof h, deadline, NULL);
  if (rc != BRG__IO_OK)
    return brg__error(err, BRG_ERR_SYSTEM, "ib", "soft verbs: queue pair hello: %s",
                      brg__sock_io_why(rc));
  return BRG_SUCCESS;
}

typedef struct soft_pending {
  int fd;
  uint32_t got;
  int64_t deadline;
  soft_hello h;
} soft_pending;

static void soft_pending_drop(soft_pending *q, int *n, int i, const char *why) {
  BRG__WARN("ib", "soft verbs: dropped a connection to a queue pair listener: %s", why);
  close(q[i].fd);
  memmove(&q[i], &q[i + 1], (size_t)(*n - i - 1) * sizeof q[0]);
  (*n)--;
}

/* The passive end takes the connection whose hello names both queue pairs.
 * Every pending connection is read side by side, each for at most
 * SOFT_HELLO_MS, the oldest making room for a newcomer, so no stranger on
 * the listener holds the peer's connection up. */
static brg_status answer(brg__vb_qp *q, const brg__vb_qp_info *r, int64_t deadline, int timeout_ms,
                         brg__errbuf *err) {
  soft_pending p[SOFT_PENDING];
  int np = 0;
  brg_status s = BRG_SUCCESS;
  while (q->fd < 0) {
    int64_t now = brg__now_ms(), wake = deadline;
    if (brg__deadline_passed(deadline)) {
      s = brg__error(err, BRG_ERR_TIMEOUT, "ib",
                     "soft verbs: the peer queue pair did not connect within %d ms", timeout_ms);
      break;
    }
    for (int i = np - 1; i >= 0; i--)
      if (now >= p[i].deadline) soft_pending_drop(p, &np, i, "no hello in time");
    struct pollfd pfd[1 + SOFT_PENDING];
    pfd[0] = (struct pollfd){.fd = q->listen_fd, .events = POLLIN};
    for (int i = 0; i < np; i++) {
      pfd[1 + i] = (struct pollfd){.fd = p[i].fd, .events = POLLIN};
      wake = brg__deadline_min(wake, p[i].deadline);
    }
    int left = brg__ms_left(wake);
    if (poll(pfd, (nfds_t)(1 + np), left) < 0) {
      if (errno == EINTR) continue;
      s = brg__error(err, BRG_ERR_SYSTEM, "ib", "soft verbs: poll: %s", strerror(errno));
      break;
    }
    /* Oldest first; a removal moves those after it down. */
    for (int i = 0, k = 0, n = np; k < n && q->fd < 0; k++) {
      int before = np;
      soft_pending *e = &p[i];
      if (pfd[1 + k].revents) {
        ssize_t got = recv(e->fd, (char *)&e->h + e->got, sizeof e->h - e->got, MSG_DONTWAIT);
        if (got > 0) e->got += (uint32_t)got;
        if (got == 0 || (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
          soft_pending_drop(p, &np, i, "it hung up");
        } else if (e->got == sizeof e->h) {
          if (e->h.magic == SOFT_HELLO_MAGIC && e->h.to_qpn == q->token &&
              e->h.from_qpn == r->qpn) {
            q->fd = e->fd;
            memmove(&p[i], &p[i + 1], (size_t)(np - i - 1) * sizeof p[0]);
            np--;
          } else {
            soft_pending_drop(p, &np, i, "not our peer queue pair");
          }
        }
      }
      if (np == before) i++;
    }
    for (int k = 0; k < SOFT_PENDING / 4 && q->fd < 0 && (pfd[0].revents & POLLIN); k++) {
      int fd = accept4(q->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) break;
      if (np == SOFT_PENDING) soft_pending_drop(p, &np, 0, "newer connections wait");
      p[np++] = (soft_pending){.fd = fd, .deadline = brg__now_ms() + SOFT_HELLO_MS};
    }
  }
  for (int i = 0; i < np; i++) close(p[i].fd);
  return s;
}

static brg_status soft_qp_connect(brg__vb_qp *q, const brg__vb_qp_info *r, int active,
                                  int timeout_ms, brg__errbuf *err) {
  int64_t deadline = brg__deadline_ms(timeout_ms);
  brg_status s =
      active ? dial(q, r, deadline, timeout_ms, err) : answer(q, r, deadline, timeout_ms, err);
  if (s != BRG_SUCCESS) return s;
  brg__sock_close(&q->listen_fd);
  brg__sock_nodelay(q->fd);
  /* All its I/O is the progress thread's, which must never block in it. */
  if (brg__sock_set_blocking(q->fd, 0) != 0)
    return brg__error(err, BRG_ERR_SYSTEM, "ib", "soft verbs: fcntl: %s", strerror(errno));
  s = brg__proxy_start(&q->thread, soft_progress, q, "brg-ib-soft", err);
  if (s != BRG_SUCCESS) return s;
  q->thread_started = 1;
  return BRG_SUCCESS;
}

static void soft_qp_destroy(brg__vb_qp *q) {
  if (!q) return;
  if (q->thread_started) {
    __atomic_store_n(&q->stopping, 1, __ATOMIC_RELEASE);
    qp_wake(q);
    pthread_join(q->thread, NULL);
  }
  brg__sock_close(&q->fd);
  brg__sock_close(&q->listen_fd);
  brg__sock_close(&q->wake[0]);
  brg__sock_close(&q->wake[1]);
  pthread_mutex_destroy(&q->lock);
  pthread_mutex_destroy(&q->out_lock);
  free(q->sq);
  free(q->rq);
  free(q->cq);
  free(q->in_stage);
  free(q->out_stage);
  free(q);
}

/* ---- the data path ---------------------------------------------------------- */

static brg_status soft_post_write(brg__vb_qp *q, uint64_t wr_id, const brg__vb_mr *lmr,
                                  const void *laddr, uint32_t len, uint64_t raddr, uint32_t rkey,
                                  int with_imm, uint32_t imm, int signaled) {
  const char *l = laddr, *base = lmr->addr;
  if (len && (l < base || (size_t)(l - base) > lmr->len || len > lmr->len - (size_t)(l - base)))
    return BRG_ERR_INVALID_ARGUMENT; /* a local protection error, caught at post time */
  if (with_imm && __atomic_load_n(&test_bad_rkey, __ATOMIC_RELAXED) > 0 &&
      __atomic_sub_fetch(&test_bad_rkey, 1, __ATOMIC_SEQ_CST) >= 0)
    rkey ^= ~(uint32_t)(SOFT_MAX_MRS - 1); /* same table slot, another key: never valid */
  pthread_mutex_lock(&q->lock);
  if (q->sq_tail - q->sq_done >= (uint64_t)q->max_send) {
    pthread_mutex_unlock(&q->lock);
    return BRG_ERR_INTERNAL; /* send queue overflow: the caller's accounting is wrong */
  }
  if (q->error) {
    cq_push(q, wr_id, BRG__VB_OP_WRITE, BRG__VB_WC_FLUSH, 0, 0);
    pthread_mutex_unlock(&q->lock);
    return BRG_SUCCESS;
  }
  q->sq[q->sq_tail++ % (uint64_t)q->max_send] = (soft_swr){.wr_id = wr_id,
                                                           .laddr = l,
                                                           .len = len,
                                                           .raddr = raddr,
                                                           .rkey = rkey,
                                                           .imm = imm,
                                                           .with_imm = (uint8_t) !!with_imm,
                                                           .signaled = (uint8_t) !!signaled};
  pthread_mutex_unlock(&q->lock);
  /* Send right away when nobody else is sending; the progress thread takes
   * over what the socket does not accept now (and a failure). */
  int pending = 1;
  if (q->thread_started && pthread_mutex_trylock(&q->out_lock) == 0) {
    if (progress_out(q) != 0) q->out_broken = 1;
    pending = q->out_busy || q->out_broken;
    pthread_mutex_unlock(&q->out_lock);
  }
  if (pending) qp_wake(q);
  return BRG_SUCCESS;
}

static brg_status soft_post_recv(brg__vb_qp *q, uint64_t wr_id) {
  pthread_mutex_lock(&q->lock);
  brg_status s = BRG_SUCCESS;
  if (q->rq_tail - q->rq_head >= (uint64_t)q->max_recv)
    s = BRG_ERR_INTERNAL;
  else if (q->error)
    cq_push(q, wr_id, BRG__VB_OP_RECV_IMM, BRG__VB_WC_FLUSH, 0, 0);
  else
    q->rq[q->rq_tail++ % (uint64_t)q->max_recv] = wr_id;
  pthread_mutex_unlock(&q->lock);
  return s;
}

static int soft_poll(brg__vb_qp *q, brg__vb_wc *wc, int max) {
  int n = 0;
  pthread_mutex_lock(&q->lock);
  while (n < max && q->cq_head < q->cq_tail) wc[n++] = q->cq[q->cq_head++ % (uint64_t)q->cq_cap];
  pthread_mutex_unlock(&q->lock);
  return n;
}

static void soft_qp_notify(brg__vb_qp *q, void (*fn)(void *), void *arg) {
  q->notify = fn;
  q->notify_arg = arg;
}

const brg__vb_ops brg__vb_soft = {
    .name = "soft",
    .probe = soft_probe,
    .ctx_open = soft_ctx_open,
    .ctx_close = soft_ctx_close,
    .mr_reg = soft_mr_reg,
    .mr_dereg = soft_mr_dereg,
    .mr_reg_dmabuf = soft_mr_reg_dmabuf,
    .qp_create = soft_qp_create,
    .qp_connect = soft_qp_connect,
    .qp_destroy = soft_qp_destroy,
    .post_write = soft_post_write,
    .post_recv = soft_post_recv,
    .poll = soft_poll,
    .qp_notify = soft_qp_notify,
};
