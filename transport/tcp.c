/*
 * The tcp transport: the fallback that works between any two ranks that
 * reach each other over IP.
 *
 * The data path, for one link (sender S, receiver R):
 *
 *   S engine --sendmsg()--> socket(s) --recv()--> R recv proxy --> R's output buffer
 *   (input, output or slot)                                    \-> R's recv FIFO
 *
 * - No send proxy. The sending engine sends each slot itself as it posts
 *   it (tcp_send_now), header and payload in one sendmsg(), the payload
 *   from wherever it already is: the user's input, the output it has just
 *   reduced into, or the receive slot it is forwarding. So a slice is not
 *   copied into a send FIFO first and no thread has to be woken to send
 *   it. The slot is free again as soon as the kernel holds the bytes.
 * - One receive proxy per link, blocked in recv(). Where the engine has
 *   offered a window for a slot (tcp_recv_window: the all-gather steps,
 *   whose slices only need to reach the output) and the payload has the
 *   offered size, the payload lands there; otherwise in the local receive
 *   FIFO, where the reduce-scatter steps read it beside their own input.
 *   c->landed tells the engine which.
 * - Nothing spins: the engine sleeps on the FIFO (ops.sleeps), in poll()
 *   while the socket is full, and the proxy in recv(). On a machine with
 *   few cores a spinning thread takes the core the kernel needs to copy
 *   the bytes. bench/tcp_stream measures one plain stream for comparison.
 *
 * On the wire a slot is its brg__slot_meta followed by meta.bytes of
 * payload. With several sockets per link (BRIGADE_TCP_NSOCKS), slot n
 * travels on socket n % nsocks and the receiver reads slot n from that same
 * socket, so the stream stays in order with no sequence numbers on the wire.
 *
 * The receive proxy only fills slots the engine has released
 * (tail < head + nslots), so TCP flow control is all the back-pressure the
 * wire needs.
 *
 * A data connection opens with a hello {magic, job secret, sender rank,
 * socket index}; the receiver drops connections whose hello is wrong and
 * keeps listening until the right sender arrives or the timeout passes. An
 * orderly close() of the send side ends the stream with a goodbye slot, so
 * the receiver can tell a finished peer from a dead one.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>

#include "clock.h"
#include "net.h"
#include "transport.h"

#define TCP_INFO_MAGIC 0x42524754u  /* "BRGT" */
#define TCP_HELLO_MAGIC 0x42524748u /* "BRGH" */
#define TCP_BYE_MAGIC 0x6279652062726721ull
#define TCP_MAX_SOCKS 16
#define TCP_ADDR_BYTES 64

enum { TCP_CFG_SOCKBUF, TCP_CFG_NSOCKS, TCP_CFG_COUNT };

static brg__cfg_entry tcp_entries[TCP_CFG_COUNT] = {
    [TCP_CFG_SOCKBUF] = {"BRIGADE_TCP_SOCKBUF", BRG__CFG_KIND_SIZE, "4M", 0, 1 * BRG__GiB,
                         "socket buffer size for tcp links (0: kernel default)"},
    [TCP_CFG_NSOCKS] = {"BRIGADE_TCP_NSOCKS", BRG__CFG_KIND_INT, "1", 1, TCP_MAX_SOCKS,
                        "sockets per tcp link"},
};

static brg__cfg_section tcp_config = BRG__CFG_SECTION("tcp", tcp_entries);

/* What the receiver tells the sender (inside the BRG__CONN_INFO_BYTES blob).
 * Integers in network byte order. */
typedef struct tcp_conn_info {
  uint32_t magic;
  uint16_t port;
  uint16_t nsocks;
  char addr[TCP_ADDR_BYTES];
} tcp_conn_info;
_Static_assert(sizeof(tcp_conn_info) <= BRG__CONN_INFO_BYTES, "tcp info fits the blob");

/* First bytes on every data connection. Integers in network byte order. */
typedef struct tcp_hello {
  uint32_t magic;
  int32_t rank;
  uint16_t index; /* which of the link's sockets this is */
  uint16_t nsocks;
  uint32_t pad;
  uint8_t secret[BRG__SECRET_BYTES];
} tcp_hello;

/* A receive window: where the engine wants slot `tag - 1`'s payload. */
typedef struct tcp_window {
  void *dst;
  size_t bytes;
  uint64_t tag; /* pos + 1, stored last (release) */
} tcp_window;

typedef struct tcp_conn {
  brg__net_link l; /* first: c->priv points at both */
  int nsocks;
  int fds[TCP_MAX_SOCKS];
  brg__waiter waiter; /* the proxy's: stops on `stopping` or ctrl->closed */
  /* Receive end: the engine's offers, and where each slot landed (c->landed). */
  tcp_window win[BRG__MAX_SLOTS];
  void *landed[BRG__MAX_SLOTS];
  int win_off;  /* offers withdrawn for good (seq_cst, against win_busy) */
  int win_busy; /* the proxy is receiving into an offered buffer */
  int cut;      /* send end: a slot was cut off part way (engine's thread only) */
  int stream;   /* a byte stream: fds[0] only, no proxy, no goodbye */
} tcp_conn;

static brg_status tcp_proxy_check(void *arg) {
  tcp_conn *t = arg;
  if (__atomic_load_n(&t->l.stopping, __ATOMIC_ACQUIRE)) return BRG_ERR_ABORTED;
  uint32_t closed = __atomic_load_n(&t->l.fifo.ctrl->closed, __ATOMIC_ACQUIRE);
  return closed ? (brg_status)closed : BRG_SUCCESS;
}

/* Socket buffer bytes for every tcp socket (0: the kernel's); set before
 * the handshake, they decide the window scale. */
static int tcp_sockbuf(void) {
  int64_t buf = brg__config_int(&tcp_config, TCP_CFG_SOCKBUF);
  return buf > INT_MAX / 2 ? INT_MAX / 2 : (int)buf;
}

/* Moves *iov past n bytes that went out, dropping spent entries from
 * *iovcnt and trimming a partly sent one. */
static void iov_advance(struct iovec **iov, int *iovcnt, size_t n) {
  while (*iovcnt > 0 && n >= (*iov)->iov_len) {
    n -= (*iov)->iov_len;
    (*iov)++;
    (*iovcnt)--;
  }
  if (*iovcnt > 0) {
    (*iov)->iov_base = (char *)(*iov)->iov_base + n;
    (*iov)->iov_len -= n;
  }
}

/* Sends the whole iovec (modified in place). 0, or -1 with errno. The data
 * path's own I/O, not base/sock.c's: a slot's header and payload in one
 * sendmsg() on a blocking socket, with no poll() per call. */
static int send_all(int fd, struct iovec *iov, int iovcnt, int flags) {
  while (iovcnt > 0) {
    struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)iovcnt};
    ssize_t n = sendmsg(fd, &msg, flags | MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    iov_advance(&iov, &iovcnt, (size_t)n);
  }
  return 0;
}

/* Receives exactly `len` bytes: 0 done, 1 end of stream before any byte,
 * 2 end of stream part way, -1 error with errno. */
static int recv_all(int fd, void *buf, size_t len) {
  size_t got = 0;
  while (got < len) {
    ssize_t n = recv(fd, (char *)buf + got, len - got, MSG_WAITALL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    if (n == 0) return got ? 2 : 1;
    got += (size_t)n;
  }
  return 0;
}

/* A proxy gives up: the engine sees `closed` through its wait check. */
static void proxy_fail(tcp_conn *t, const char *what, const char *why) {
  if (!__atomic_load_n(&t->l.stopping, __ATOMIC_ACQUIRE)) {
    brg__fifo_mark_closed(&t->l.fifo, BRG_ERR_REMOTE, "%s: %s", what, why);
    BRG__WARN("tcp", "link %s rank %d (%s) broke: %s: %s", t->l.sender ? "to" : "from", t->l.peer,
              t->l.peer_addr, what, why);
  }
  brg__fifo_wake_all(&t->l.fifo);
}

static int is_bye(const brg__slot_meta *m) {
  return m->seq == UINT64_MAX && m->count == TCP_BYE_MAGIC && m->bytes == 0;
}

/* The engine's own send (ops->send_now): no copy into the send FIFO when
 * the payload is elsewhere, and no proxy to wake. The socket is blocking;
 * MSG_DONTWAIT and poll() let the engine's check run while the wire is
 * full, so a stopped peer ends in a timeout instead of a hang. */
static brg_status tcp_send_now(brg__conn *c, uint64_t pos, const void *payload,
                               const brg__waiter *w) {
  tcp_conn *t = c->priv;
  brg__fifo *f = &t->l.fifo;
  brg__slot_meta *m = brg__fifo_meta(f, pos);
  if (m->bytes > f->slot_bytes) {
    char why[96];
    snprintf(why, sizeof why, "slot of %u bytes in a FIFO of %zu-byte slots", m->bytes,
             f->slot_bytes);
    proxy_fail(t, "send", why);
    return BRG_ERR_INTERNAL;
  }
  int fd = t->fds[pos % (uint64_t)t->nsocks];
  struct iovec iov[2] = {{m, sizeof *m},
                         {payload ? (void *)payload : brg__fifo_slot(f, pos), m->bytes}};
  struct iovec *v = iov;
  int left = 2;
  while (left > 0) {
    struct msghdr msg = {.msg_iov = v, .msg_iovlen = (size_t)left};
    ssize_t n = sendmsg(fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      struct pollfd pfd = {.fd = fd, .events = POLLOUT};
      if (poll(&pfd, 1, 1) == 0 && w && w->check) {
        brg_status s = w->check(w->arg);
        /* A slot cut off part way leaves the stream unreadable: no
         * goodbye may follow it. */
        if (s != BRG_SUCCESS && (v != iov || v->iov_len != sizeof *m)) t->cut = 1;
        if (s != BRG_SUCCESS) return s;
      }
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      proxy_fail(t, "send", strerror(errno));
      return BRG_ERR_REMOTE;
    }
    iov_advance(&v, &left, (size_t)n);
  }
  brg__publish(&f->ctrl->head, &f->ctrl->head_waiters, pos + 1);
  return BRG_SUCCESS;
}

/* The proxy entry's post: the slot's header into the send FIFO, then out
 * at once on the caller's thread, the payload straight from where it is. */
static int tcp_proxy_post(brg__conn *c, const brg__proxy_slot *s, const brg__waiter *w) {
  tcp_conn *t = c->priv;
  if (s->device) {
    brg__fifo_mark_closed(&t->l.fifo, BRG_ERR_INTERNAL, "a slot in GPU memory on a tcp link");
    return -1;
  }
  uint64_t pos;
  int r = brg__fifo_proxy_fill(c, s, 0, &pos);
  if (r <= 0) return r;
  const void *payload = s->bytes > BRG__INLINE_BYTES ? s->data : NULL;
  return tcp_send_now(c, pos, payload, w) == BRG_SUCCESS ? 1 : -1;
}

static void tcp_recv_window(brg__conn *c, uint64_t pos, void *dst, size_t bytes) {
  tcp_conn *t = c->priv;
  if (dst) {
    tcp_window *w = &t->win[pos % (uint64_t)t->l.fifo.nslots];
    w->dst = dst;
    w->bytes = bytes;
    __atomic_store_n(&w->tag, pos + 1, __ATOMIC_RELEASE);
    return;
  }
  /* Either the proxy sees win_off before it takes a window, or this sees
   * it busy: then the link is broken (the communicator is, already) so that
   * its recv() returns, and this waits until it has let go. */
  __atomic_store_n(&t->win_off, 1, __ATOMIC_SEQ_CST);
  if (!__atomic_load_n(&t->win_busy, __ATOMIC_SEQ_CST)) return;
  brg__fifo_mark_closed(&t->l.fifo, BRG_ERR_ABORTED, "receive window withdrawn mid-slot");
  for (int i = 0; i < t->nsocks; i++)
    if (t->fds[i] >= 0) shutdown(t->fds[i], SHUT_RDWR);
  while (__atomic_load_n(&t->win_busy, __ATOMIC_ACQUIRE)) {
    struct timespec ts = {0, 100000};
    nanosleep(&ts, NULL);
  }
}

static void *recv_proxy(void *arg) {
  tcp_conn *t = arg;
  brg__fifo *f = &t->l.fifo;
  brg__fifo_ctrl *ctrl = f->ctrl;
  uint64_t nslots = (uint64_t)f->nslots;
  uint64_t tail = __atomic_load_n(&ctrl->tail, __ATOMIC_ACQUIRE);
  const char *what = "recv", *why = NULL;
  char whybuf[96];
  int bye = 0;
  for (;;) {
    /* Never overrun: slot `tail` is ours once the engine has consumed tail - nslots. */
    uint64_t need = tail + 1 > nslots ? tail + 1 - nslots : 0;
    if (brg__wait_ge(&ctrl->head, &ctrl->head_waiters, need, &t->waiter) != BRG_SUCCESS)
      return NULL;
    int fd = t->fds[tail % (uint64_t)t->nsocks];
    /* The header lands in the FIFO after the payload: its flag says "complete". */
    brg__slot_meta hdr, *m = &hdr;
    int r = recv_all(fd, m, sizeof *m);
    if (r == 0 && is_bye(m)) {
      bye = 1;
      break;
    }
    if (r == 0 && m->bytes > f->slot_bytes) {
      snprintf(whybuf, sizeof whybuf, "malformed stream: slot of %u bytes, slots hold %zu",
               m->bytes, f->slot_bytes);
      why = whybuf;
      break;
    }
    /* The engine's window for this slot, if it offered one of this size. */
    void *dst = NULL;
    const tcp_window *w = &t->win[tail % nslots];
    if (r == 0 && m->bytes > 0 && __atomic_load_n(&w->tag, __ATOMIC_ACQUIRE) == tail + 1 &&
        w->bytes == m->bytes) {
      __atomic_store_n(&t->win_busy, 1, __ATOMIC_SEQ_CST);
      if (!__atomic_load_n(&t->win_off, __ATOMIC_SEQ_CST))
        dst = w->dst;
      else
        __atomic_store_n(&t->win_busy, 0, __ATOMIC_RELEASE);
    }
    if (r == 0) r = recv_all(fd, dst ? dst : brg__fifo_slot(f, tail), m->bytes);
    if (dst) __atomic_store_n(&t->win_busy, 0, __ATOMIC_RELEASE);
    t->landed[tail % nslots] = dst;
    if (r != 0) {
      why = r < 0    ? strerror(errno)
            : r == 1 ? "the peer closed the connection"
                     : "the peer closed the connection in the middle of a slot";
      break;
    }
    hdr.flag = 0;
    memcpy(brg__fifo_meta(f, tail), &hdr, sizeof hdr);
    brg__fifo_slot_complete(f, tail);
    tail++;
    brg__publish(&ctrl->tail, &ctrl->tail_waiters, tail);
  }
  if (__atomic_load_n(&t->l.stopping, __ATOMIC_ACQUIRE)) return NULL;
  /* Let the engine consume every slot that did arrive before it learns the
   * link is gone, so a peer that sent everything and then left costs nothing. */
  if (brg__wait_ge(&ctrl->head, &ctrl->head_waiters, tail, &t->waiter) != BRG_SUCCESS) return NULL;
  if (bye)
    brg__net_peer_left(&t->l, "tcp");
  else
    proxy_fail(t, what, why);
  return NULL;
}

/* The private state and the local FIFO; close() cleans up after either. */
static brg_status conn_open(brg__conn *c, const brg__conn_params *p, int sender, int nsocks,
                            brg__errbuf *err) {
  /* A byte stream's bytes wait in the socket: its FIFO is a token one. */
  brg__conn_params sp = *p;
  if (p->stream) {
    sp.nslots = 1;
    sp.slot_bytes = 64;
  }
  brg_status s = brg__net_open(c, &sp, sender, sizeof(tcp_conn), "tcp", "tcp", err);
  if (s != BRG_SUCCESS) return s;
  tcp_conn *t = c->priv;
  t->nsocks = p->stream ? 1 : nsocks;
  t->stream = p->stream;
  for (int i = 0; i < TCP_MAX_SOCKS; i++) t->fds[i] = -1;
  t->waiter.spin = -1; /* the proxy sleeps in recv() or on the FIFO, never spins */
  t->waiter.check = tcp_proxy_check;
  t->waiter.arg = t;
  if (!sender) c->landed = t->landed;
  return BRG_SUCCESS;
}

static brg_status tcp_recv_setup(brg__conn *c, const brg__conn_params *p, void *info,
                                 brg__errbuf *err) {
  int64_t nsocks = p->stream ? 1 : brg__config_int(&tcp_config, TCP_CFG_NSOCKS);
  if (nsocks < 1) nsocks = 1;
  if (nsocks > TCP_MAX_SOCKS) nsocks = TCP_MAX_SOCKS;
  brg_status s = conn_open(c, p, 0, (int)nsocks, err);
  if (s != BRG_SUCCESS) return s;
  tcp_conn *t = c->priv;

  const char *addr = p->self_info->addr;
  if (!addr[0] || strnlen(addr, sizeof p->self_info->addr) >= TCP_ADDR_BYTES)
    return brg__error(err, BRG_ERR_INVALID_ARGUMENT, "tcp",
                      "tcp link from rank %d: this rank has no usable address", p->peer);
  /* Accepted sockets inherit the listener's buffer sizes. */
  uint16_t port;
  s = brg__sock_listen_buf(addr, 0, BRG__NET_BACKLOG, tcp_sockbuf(), "tcp", "tcp listener",
                           &t->l.listen_fd, &port, err);
  if (s != BRG_SUCCESS) return s;

  tcp_conn_info ti = {
      .magic = htonl(TCP_INFO_MAGIC), .port = htons(port), .nsocks = htons((uint16_t)t->nsocks)};
  snprintf(ti.addr, sizeof ti.addr, "%s", addr);
  memset(info, 0, BRG__CONN_INFO_BYTES);
  memcpy(info, &ti, sizeof ti);
  BRG__TRACE("tcp", "listening for rank %d on %s port %u (%d sockets)", p->peer, addr,
             (unsigned)port, t->nsocks);
  return BRG_SUCCESS;
}

static brg_status tcp_send_connect(brg__conn *c, const brg__conn_params *p, const void *info,
                                   brg__errbuf *err) {
  tcp_conn_info ti;
  memcpy(&ti, info, sizeof ti);
  int nsocks = ntohs(ti.nsocks);
  if (ntohl(ti.magic) != TCP_INFO_MAGIC || nsocks < 1 || nsocks > TCP_MAX_SOCKS || ti.port == 0 ||
      !memchr(ti.addr, 0, sizeof ti.addr) || !ti.addr[0])
    return brg__error(err, BRG_ERR_INVALID_ARGUMENT, "tcp", "bad tcp connection info from rank %d",
                      p->peer);
  if (p->stream && nsocks != 1)
    return brg__error(err, BRG_ERR_INVALID_ARGUMENT, "tcp",
                      "tcp byte stream from rank %d: %d sockets offered, a stream takes one",
                      p->peer, nsocks);
  brg_status s = conn_open(c, p, 1, nsocks, err);
  if (s != BRG_SUCCESS) return s;
  tcp_conn *t = c->priv;
  brg__sock_hostport(t->l.peer_addr, sizeof t->l.peer_addr, ti.addr, ntohs(ti.port));

  /* The listener may be busy: retry soon, then less often. The data leaves
   * from the address this rank advertises (its NIC), not from wherever the
   * routing table points. */
  brg__sock_dialer d = {.retry_ms = 1,
                        .retry_max_ms = 100,
                        .sockbuf = tcp_sockbuf(),
                        .bind_addr = p->self_info->addr};
  int64_t deadline = brg__deadline_ms(p->timeout_ms);
  for (int i = 0; i < nsocks; i++) {
    s = brg__net_dial(p, "tcp", ti.addr, ntohs(ti.port), t->l.peer_addr, deadline, &d, &t->fds[i],
                      err);
    if (s != BRG_SUCCESS) return s;
    tcp_hello h = {.magic = htonl(TCP_HELLO_MAGIC),
                   .rank = (int32_t)htonl((uint32_t)p->rank),
                   .index = htons((uint16_t)i),
                   .nsocks = htons((uint16_t)nsocks)};
    memcpy(h.secret, p->secret, BRG__SECRET_BYTES);
    s = brg__net_hello_send(p, "tcp", t->fds[i], &h, sizeof h, t->l.peer_addr, deadline, err);
    if (s != BRG_SUCCESS) return s;
  }
  BRG__TRACE("tcp", "connected to rank %d at %s (%d sockets)", p->peer, t->l.peer_addr, nsocks);
  return BRG_SUCCESS; /* no send proxy: the engine sends (tcp_send_now) */
}

const size_t brg__tcp_hello_bytes = sizeof(tcp_hello);

int brg__tcp_hello_check(const brg__conn_params *p, const char *from, const void *hello, int nsocks,
                         const int *fds) {
  tcp_hello h;
  memcpy(&h, hello, sizeof h);
  int index = ntohs(h.index);
  if (!brg__net_hello_ok(p, "tcp", from, "tcp", ntohl(h.magic) == TCP_HELLO_MAGIC, h.secret,
                         (int32_t)ntohl((uint32_t)h.rank)))
    return -1;
  if (ntohs(h.nsocks) != nsocks || index >= nsocks || fds[index] >= 0) {
    BRG__WARN("tcp", "refused connection from %s: socket %d of %d, expected one of %d", from, index,
              ntohs(h.nsocks), nsocks);
    return -1;
  }
  return index;
}

/* Checks a complete hello; on success the socket becomes link socket `index`. */
static int hello_take(void *arg, const brg__conn_params *p, int fd, const void *hello,
                      const char *from) {
  tcp_conn *t = arg;
  int index = brg__tcp_hello_check(p, from, hello, t->nsocks, t->fds);
  if (index < 0) return 0;
  t->fds[index] = fd;
  return 1;
}

static brg_status tcp_recv_connect(brg__conn *c, const brg__conn_params *p, brg__errbuf *err) {
  tcp_conn *t = c->priv;
  if (!t || t->l.listen_fd < 0)
    return brg__error(err, BRG_ERR_INTERNAL, "tcp", "tcp recv_connect without recv_setup");
  brg_status s = brg__net_accept(&t->l, p, "tcp", sizeof(tcp_hello), t->nsocks, hello_take, t,
                                 brg__deadline_ms(p->timeout_ms), err);
  if (s != BRG_SUCCESS) return s;
  BRG__TRACE("tcp", "rank %d connected from %s (%d sockets)", p->peer, t->l.peer_addr, t->nsocks);
  if (t->stream) return BRG_SUCCESS; /* its reader polls and reads the socket itself */
  return brg__net_start(&t->l, NULL, recv_proxy, t, "tcp", err);
}

static void tcp_close(brg__conn *c) {
  tcp_conn *t = c->priv;
  if (!t) return;
  /* The engine has sent every slot it posted; a link that is not broken
   * ends its stream with a goodbye (best effort: a peer that does not read
   * just sees the end). */
  brg__fifo_ctrl *ctrl = t->l.fifo.ctrl;
  if (t->l.sender && ctrl && !t->cut && !t->stream &&
      !__atomic_load_n(&ctrl->closed, __ATOMIC_ACQUIRE)) {
    uint64_t sent = __atomic_load_n(&ctrl->head, __ATOMIC_ACQUIRE);
    int fd = t->fds[sent % (uint64_t)t->nsocks];
    brg__slot_meta bye = {.seq = UINT64_MAX, .count = TCP_BYE_MAGIC};
    struct iovec iov = {&bye, sizeof bye};
    if (fd >= 0) send_all(fd, &iov, 1, MSG_DONTWAIT);
  }
  /* A receive proxy blocked in recv() needs its sockets shut down. */
  if (!brg__net_stop(&t->l, 0)) {
    for (int i = 0; i < t->nsocks; i++)
      if (t->fds[i] >= 0) shutdown(t->fds[i], SHUT_RDWR);
    brg__net_stop(&t->l, -1);
  }
  for (int i = 0; i < TCP_MAX_SOCKS; i++) brg__sock_close(&t->fds[i]);
  brg__net_close(c);
}

/* The byte stream (brg__conn_params.stream). */
static ssize_t tcp_try_send(brg__conn *c, const void *buf, size_t bytes, int *ring) {
  (void)ring; /* the socket is the doorbell */
  tcp_conn *t = c->priv;
  if (!bytes) return 0;
  for (;;) {
    ssize_t n = send(t->fds[0], buf, bytes, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n >= 0) return n;
    if (errno == EINTR) continue;
    return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : BRG__STREAM_BROKEN;
  }
}

static ssize_t tcp_try_recv(brg__conn *c, void *buf, size_t bytes, int *ring) {
  (void)ring;
  tcp_conn *t = c->priv;
  if (!bytes) return 0;
  for (;;) {
    ssize_t n = recv(t->fds[0], buf, bytes, MSG_DONTWAIT);
    if (n > 0) return n;
    if (n == 0) return BRG__STREAM_ENDED;
    if (errno == EINTR) continue;
    return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : BRG__STREAM_BROKEN;
  }
}

static int tcp_ready(brg__conn *c, int sending, int arm) {
  (void)arm; /* the caller polls ready_fd */
  tcp_conn *t = c->priv;
  struct pollfd pfd = {.fd = t->fds[0], .events = sending ? POLLOUT : POLLIN};
  return poll(&pfd, 1, 0) > 0;
}

static int tcp_ready_fd(brg__conn *c, short *events) {
  tcp_conn *t = c->priv;
  *events = t->l.sender ? POLLOUT : POLLIN;
  return t->fds[0];
}

static void tcp_end(brg__conn *c) {
  tcp_conn *t = c->priv;
  if (t->fds[0] >= 0) shutdown(t->fds[0], SHUT_WR);
}

static int tcp_can_connect(const brg__peer_info *self, const brg__peer_info *peer) {
  (void)self;
  (void)peer;
  return 1;
}

static int tcp_available(char *why, size_t why_bytes) {
  (void)why;
  (void)why_bytes;
  return 1;
}

const brg__transport_ops brg__transport_tcp = {
    .name = "tcp",
    .carries = BRG__CARRIES_HOST | BRG__CARRIES_DEVICE,
    .listens = 1,
    .config = &tcp_config,
    .can_connect = tcp_can_connect,
    .available = tcp_available,
    .recv_setup = tcp_recv_setup,
    .send_connect = tcp_send_connect,
    .recv_connect = tcp_recv_connect,
    .close = tcp_close,
    .proxy_post = tcp_proxy_post,
    .proxy_sent = brg__fifo_proxy_sent,
    .proxy_poll = brg__fifo_proxy_poll,
    .proxy_release = brg__fifo_proxy_release,
    .sleeps = 1,
    .slice_bytes = 512 * 1024,
    .send_now = tcp_send_now,
    .recv_window = tcp_recv_window,
    .try_send = tcp_try_send,
    .try_recv = tcp_try_recv,
    .ready = tcp_ready,
    .ready_fd = tcp_ready_fd,
    .end = tcp_end,
};
