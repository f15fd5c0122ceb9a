/*
 * The tcp transport: the fallback that works between any two ranks that
 * reach each other over IP.
 *
 * Both ends of a link keep a FIFO of their own, and one proxy thread per end
 * moves slots across the wire between them:
 *
 *   engine -> send FIFO -> send proxy ==socket(s)==> recv proxy -> recv FIFO -> engine
 *
 * On the wire a slot is its brg__slot_meta followed by meta.bytes of payload.
 * With several sockets per link, slot n travels on socket n % nsocks and the
 * receiver reads slot n from that same socket, so the stream stays in order
 * with no sequence numbers on the wire.
 *
 * The send proxy gives a slot back to the engine (head++) as soon as the
 * kernel has taken its bytes. The receive proxy only fills slots the engine
 * has released (tail < head + nslots), so TCP flow control is all the
 * back-pressure the wire needs.
 *
 * A data connection opens with a hello {magic, job secret, sender rank,
 * socket index}; the receiver drops connections whose hello is wrong and
 * keeps listening until the right sender arrives or the timeout passes. An
 * orderly close() of the send side ends the stream with a goodbye slot, so
 * the receiver can tell a finished peer from a dead one.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "net.h"
#include "transport.h"

#define TCP_INFO_MAGIC 0x42524754u  /* "BRGT" */
#define TCP_HELLO_MAGIC 0x42524748u /* "BRGH" */
#define TCP_BYE_MAGIC 0x6279652062726721ull
#define TCP_MAX_SOCKS 16
#define TCP_MAX_PENDING 8      /* unauthenticated connections held at once */
#define TCP_CLOSE_GRACE_MS 500 /* how long close() lets the send proxy flush */
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

typedef struct tcp_conn {
  brg__net_link l; /* first: c->priv points at both */
  int nsocks;
  int fds[TCP_MAX_SOCKS];
  brg__waiter waiter; /* the proxy's: stops on `stopping` or ctrl->closed */
} tcp_conn;

static brg_status tcp_proxy_check(void *arg) {
  tcp_conn *t = arg;
  if (__atomic_load_n(&t->l.stopping, __ATOMIC_ACQUIRE)) return BRG_ERR_ABORTED;
  uint32_t closed = __atomic_load_n(&t->l.fifo.ctrl->closed, __ATOMIC_ACQUIRE);
  return closed ? (brg_status)closed : BRG_SUCCESS;
}

static void sockaddr_text(const struct sockaddr *sa, socklen_t len, char *out, size_t n) {
  char host[NI_MAXHOST], serv[NI_MAXSERV];
  if (getnameinfo(sa, len, host, sizeof host, serv, sizeof serv, NI_NUMERICHOST | NI_NUMERICSERV) !=
      0) {
    snprintf(out, n, "?");
    return;
  }
  snprintf(out, n, sa->sa_family == AF_INET6 ? "[%s]:%s" : "%s:%s", host, serv);
}

/* Options every socket gets before it connects or listens (buffer sizes must
 * be set before the handshake to affect the window scale). */
static void socket_tune(int fd) {
  int64_t buf = brg__config_int(&tcp_config, TCP_CFG_SOCKBUF);
  if (buf > 0) {
    int v = buf > INT_MAX / 2 ? INT_MAX / 2 : (int)buf;
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &v, sizeof v);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &v, sizeof v);
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static int set_blocking(int fd, int blocking) {
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0) return -1;
  fl = blocking ? fl & ~O_NONBLOCK : fl | O_NONBLOCK;
  return fcntl(fd, F_SETFL, fl);
}

/* Sends the whole iovec (modified in place). 0, or -1 with errno. */
static int send_all(int fd, struct iovec *iov, int iovcnt, int flags) {
  while (iovcnt > 0) {
    struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)iovcnt};
    ssize_t n = sendmsg(fd, &msg, flags | MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    while (iovcnt > 0 && (size_t)n >= iov->iov_len) {
      n -= (ssize_t)iov->iov_len;
      iov++;
      iovcnt--;
    }
    if (iovcnt > 0) {
      iov->iov_base = (char *)iov->iov_base + n;
      iov->iov_len -= (size_t)n;
    }
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

static void *send_proxy(void *arg) {
  tcp_conn *t = arg;
  brg__fifo *f = &t->l.fifo;
  brg__fifo_ctrl *ctrl = f->ctrl;
  uint64_t sent = __atomic_load_n(&ctrl->head, __ATOMIC_ACQUIRE);
  for (;;) {
    uint64_t tail = __atomic_load_n(&ctrl->tail, __ATOMIC_ACQUIRE);
    for (; sent < tail; sent++) {
      const brg__slot_meta *m = brg__fifo_meta(f, sent);
      if (m->bytes > f->slot_bytes) {
        char why[96];
        snprintf(why, sizeof why, "slot of %u bytes in a FIFO of %zu-byte slots", m->bytes,
                 f->slot_bytes);
        proxy_fail(t, "send", why);
        return NULL;
      }
      struct iovec iov[2] = {{(void *)m, sizeof *m}, {brg__fifo_slot(f, sent), m->bytes}};
      if (send_all(t->fds[sent % (uint64_t)t->nsocks], iov, 2, 0) != 0) {
        proxy_fail(t, "send", strerror(errno));
        return NULL;
      }
      brg__publish(&ctrl->head, &ctrl->head_waiters, sent + 1);
    }
    if (__atomic_load_n(&t->l.stopping, __ATOMIC_ACQUIRE)) {
      /* Flush what the engine published before close, then say goodbye
       * (best effort: a peer that does not read just sees the end). */
      if (__atomic_load_n(&ctrl->tail, __ATOMIC_ACQUIRE) > sent) continue;
      brg__slot_meta bye = {.seq = UINT64_MAX, .count = TCP_BYE_MAGIC};
      struct iovec iov = {&bye, sizeof bye};
      send_all(t->fds[sent % (uint64_t)t->nsocks], &iov, 1, MSG_DONTWAIT);
      return NULL;
    }
    brg_status s = brg__wait_ge(&ctrl->tail, &ctrl->tail_waiters, sent + 1, &t->waiter);
    if (s != BRG_SUCCESS && !__atomic_load_n(&t->l.stopping, __ATOMIC_ACQUIRE))
      return NULL; /* someone else marked the link closed */
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
    if (r == 0) r = recv_all(fd, brg__fifo_slot(f, tail), m->bytes);
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
  if (bye) {
    brg__fifo_mark_closed(&t->l.fifo, BRG_ERR_REMOTE, "rank %d closed its link", t->l.peer);
    BRG__INFO("tcp", "rank %d (%s) closed its link", t->l.peer, t->l.peer_addr);
    brg__fifo_wake_all(f);
  } else {
    proxy_fail(t, what, why);
  }
  return NULL;
}

static brg_status proxy_start(tcp_conn *t, brg__errbuf *err) {
  return brg__net_start(&t->l, t->l.sender ? send_proxy : recv_proxy, t, "tcp", err);
}

/* The private state and the local FIFO; close() cleans up after either. */
static brg_status conn_open(brg__conn *c, const brg__conn_params *p, int sender, int nsocks,
                            brg__errbuf *err) {
  brg_status s = brg__net_open(c, p, sender, sizeof(tcp_conn), "tcp", "tcp", err);
  if (s != BRG_SUCCESS) return s;
  tcp_conn *t = c->priv;
  t->nsocks = nsocks;
  for (int i = 0; i < TCP_MAX_SOCKS; i++) t->fds[i] = -1;
  t->waiter.spin = p->waiter ? p->waiter->spin : 1000;
  t->waiter.check = tcp_proxy_check;
  t->waiter.arg = t;
  return BRG_SUCCESS;
}

static brg_status addr_resolve(const char *addr, uint16_t port, int passive, struct addrinfo **res,
                               brg__errbuf *err) {
  char serv[8];
  snprintf(serv, sizeof serv, "%u", (unsigned)port);
  struct addrinfo hints = {.ai_socktype = SOCK_STREAM,
                           .ai_flags =
                               AI_NUMERICHOST | AI_NUMERICSERV | (passive ? AI_PASSIVE : 0)};
  int rc = getaddrinfo(addr, serv, &hints, res);
  if (rc != 0)
    return brg__error(err, BRG_ERR_INVALID_ARGUMENT, "tcp", "tcp address '%s': %s", addr,
                      gai_strerror(rc));
  return BRG_SUCCESS;
}

static brg_status tcp_recv_setup(brg__conn *c, const brg__conn_params *p, void *info,
                                 brg__errbuf *err) {
  int64_t nsocks = brg__config_int(&tcp_config, TCP_CFG_NSOCKS);
  if (nsocks < 1) nsocks = 1;
  if (nsocks > TCP_MAX_SOCKS) nsocks = TCP_MAX_SOCKS;
  brg_status s = conn_open(c, p, 0, (int)nsocks, err);
  if (s != BRG_SUCCESS) return s;
  tcp_conn *t = c->priv;

  const char *addr = p->self_info->addr;
  if (!addr[0] || strnlen(addr, sizeof p->self_info->addr) >= TCP_ADDR_BYTES)
    return brg__error(err, BRG_ERR_INVALID_ARGUMENT, "tcp",
                      "tcp link from rank %d: this rank has no usable address", p->peer);
  struct addrinfo *ai;
  s = addr_resolve(addr, 0, 1, &ai, err);
  if (s != BRG_SUCCESS) return s;
  int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    s = brg__error(err, BRG_ERR_SYSTEM, "tcp", "tcp listener socket: %s", strerror(errno));
    freeaddrinfo(ai);
    return s;
  }
  t->l.listen_fd = fd;
  socket_tune(fd); /* accepted sockets inherit the buffer sizes */
  if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, TCP_MAX_PENDING + t->nsocks) != 0) {
    s = brg__error(err, BRG_ERR_SYSTEM, "tcp", "tcp listener on %s: %s", addr, strerror(errno));
    freeaddrinfo(ai);
    return s;
  }
  freeaddrinfo(ai);
  struct sockaddr_storage ss;
  socklen_t len = sizeof ss;
  if (getsockname(fd, (struct sockaddr *)&ss, &len) != 0)
    return brg__error(err, BRG_ERR_SYSTEM, "tcp", "getsockname: %s", strerror(errno));
  uint16_t port = ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                           : ((struct sockaddr_in *)&ss)->sin_port;

  tcp_conn_info ti = {
      .magic = htonl(TCP_INFO_MAGIC), .port = port, .nsocks = htons((uint16_t)t->nsocks)};
  snprintf(ti.addr, sizeof ti.addr, "%s", addr);
  memset(info, 0, BRG__CONN_INFO_BYTES);
  memcpy(info, &ti, sizeof ti);
  BRG__TRACE("tcp", "listening for rank %d on %s port %u (%d sockets)", p->peer, addr,
             (unsigned)ntohs(port), t->nsocks);
  return BRG_SUCCESS;
}

/* One connection to the receiver's listener, retried while it refuses (it
 * may be busy) until the deadline. */
static brg_status connect_one(const brg__conn_params *p, const struct addrinfo *ai,
                              const char *where, int64_t deadline, int *out, brg__errbuf *err) {
  int backoff_ms = 1, refused = 0;
  for (;;) {
    brg_status s = brg__net_check(p);
    if (s != BRG_SUCCESS)
      return brg__error(err, s, "tcp", "connecting to rank %d at %s: %s", p->peer, where,
                        brg_status_string(s));
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return brg__error(err, BRG_ERR_SYSTEM, "tcp", "tcp socket: %s", strerror(errno));
    socket_tune(fd);
    int e = 0;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) e = errno;
    while (e == EINPROGRESS || e == EINTR) {
      struct pollfd pfd = {.fd = fd, .events = POLLOUT};
      int left = brg__ms_left_capped(deadline, 100);
      if (left == 0) {
        e = ETIMEDOUT;
        break;
      }
      int n = poll(&pfd, 1, left);
      if (n < 0 && errno != EINTR) {
        e = errno;
        break;
      }
      if (n > 0) {
        socklen_t len = sizeof e;
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &len) != 0) e = errno;
        break;
      }
      if ((s = brg__net_check(p)) != BRG_SUCCESS) {
        close(fd);
        return brg__error(err, s, "tcp", "connecting to rank %d at %s: %s", p->peer, where,
                          brg_status_string(s));
      }
    }
    if (e == 0 && set_blocking(fd, 1) == 0) {
      *out = fd;
      return BRG_SUCCESS;
    }
    close(fd);
    if (e == ECONNREFUSED) refused = 1;
    if (e == ETIMEDOUT && refused) e = ECONNREFUSED; /* the more useful of the two */
    if (e == ECONNREFUSED && !brg__deadline_passed(deadline)) {
      brg__sleep_ms(brg__ms_left_capped(deadline, backoff_ms));
      if (backoff_ms < 100) backoff_ms *= 2;
      continue;
    }
    if (e == ETIMEDOUT || e == ECONNREFUSED)
      return brg__error(err, BRG_ERR_TIMEOUT, "tcp",
                        "connecting to rank %d at %s: no connection within %d ms (%s)", p->peer,
                        where, p->timeout_ms, strerror(e));
    return brg__error(err, BRG_ERR_SYSTEM, "tcp", "connecting to rank %d at %s: %s", p->peer, where,
                      strerror(e ? e : errno));
  }
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
  brg_status s = conn_open(c, p, 1, nsocks, err);
  if (s != BRG_SUCCESS) return s;
  tcp_conn *t = c->priv;
  snprintf(t->l.peer_addr, sizeof t->l.peer_addr, strchr(ti.addr, ':') ? "[%s]:%u" : "%s:%u", ti.addr,
           (unsigned)ntohs(ti.port));

  struct addrinfo *ai;
  s = addr_resolve(ti.addr, ntohs(ti.port), 0, &ai, err);
  if (s != BRG_SUCCESS) return s;
  int64_t deadline = brg__deadline_ms(p->timeout_ms);
  for (int i = 0; i < nsocks && s == BRG_SUCCESS; i++) {
    s = connect_one(p, ai, t->l.peer_addr, deadline, &t->fds[i], err);
    if (s != BRG_SUCCESS) break;
    tcp_hello h = {.magic = htonl(TCP_HELLO_MAGIC),
                   .rank = (int32_t)htonl((uint32_t)p->rank),
                   .index = htons((uint16_t)i),
                   .nsocks = htons((uint16_t)nsocks)};
    memcpy(h.secret, p->secret, BRG__SECRET_BYTES);
    struct iovec iov = {&h, sizeof h};
    if (send_all(t->fds[i], &iov, 1, 0) != 0)
      s = brg__error(err, BRG_ERR_SYSTEM, "tcp", "hello to rank %d at %s: %s", p->peer,
                     t->l.peer_addr, strerror(errno));
  }
  freeaddrinfo(ai);
  if (s != BRG_SUCCESS) return s;
  BRG__TRACE("tcp", "connected to rank %d at %s (%d sockets)", p->peer, t->l.peer_addr, nsocks);
  return proxy_start(t, err);
}

typedef struct pending {
  int fd;
  size_t got;
  tcp_hello hello;
  char addr[TCP_ADDR_BYTES + 8];
} pending;

static void pending_drop(pending *q, int *npending, int i) {
  close(q[i].fd);
  q[i] = q[--*npending];
}

/* Checks a complete hello; on success the socket becomes link socket `index`. */
static int hello_accept(tcp_conn *t, const brg__conn_params *p, pending *q) {
  const tcp_hello *h = &q->hello;
  uint8_t diff = 0;
  for (int i = 0; i < BRG__SECRET_BYTES; i++) diff |= h->secret[i] ^ p->secret[i];
  int rank = (int32_t)ntohl((uint32_t)h->rank);
  int index = ntohs(h->index);
  if (ntohl(h->magic) != TCP_HELLO_MAGIC) {
    BRG__WARN("tcp", "refused connection from %s: not a brigade tcp hello", q->addr);
  } else if (diff) {
    BRG__WARN("tcp", "refused connection from %s: bad secret", q->addr);
  } else if (rank != p->peer) {
    BRG__WARN("tcp", "refused connection from %s: rank %d, expected rank %d", q->addr, rank,
              p->peer);
  } else if (ntohs(h->nsocks) != t->nsocks || index >= t->nsocks || t->fds[index] >= 0) {
    BRG__WARN("tcp", "refused connection from %s: socket %d of %d, expected one of %d", q->addr,
              index, ntohs(h->nsocks), t->nsocks);
  } else if (set_blocking(q->fd, 1) != 0) {
    BRG__WARN("tcp", "dropped connection from %s: fcntl: %s", q->addr, strerror(errno));
  } else {
    t->fds[index] = q->fd;
    snprintf(t->l.peer_addr, sizeof t->l.peer_addr, "%s", q->addr);
    return 1;
  }
  return 0;
}

static brg_status tcp_recv_connect(brg__conn *c, const brg__conn_params *p, brg__errbuf *err) {
  tcp_conn *t = c->priv;
  if (!t || t->l.listen_fd < 0)
    return brg__error(err, BRG_ERR_INTERNAL, "tcp", "tcp recv_connect without recv_setup");
  pending q[TCP_MAX_PENDING];
  int npending = 0, connected = 0;
  int64_t deadline = brg__deadline_ms(p->timeout_ms);
  brg_status s = BRG_SUCCESS;
  while (connected < t->nsocks) {
    if ((s = brg__net_check(p)) != BRG_SUCCESS) {
      brg__error(err, s, "tcp", "waiting for rank %d to connect: %s", p->peer,
                 brg_status_string(s));
      break;
    }
    int left = brg__ms_left_capped(deadline, 100);
    if (left == 0) {
      s = brg__error(err, BRG_ERR_TIMEOUT, "tcp",
                     "rank %d did not connect within %d ms (%d of %d sockets)", p->peer,
                     p->timeout_ms, connected, t->nsocks);
      break;
    }
    struct pollfd pfd[1 + TCP_MAX_PENDING];
    pfd[0] = (struct pollfd){.fd = t->l.listen_fd, .events = POLLIN};
    for (int i = 0; i < npending; i++)
      pfd[1 + i] = (struct pollfd){.fd = q[i].fd, .events = POLLIN};
    int n = poll(pfd, (nfds_t)(1 + npending), left);
    if (n < 0) {
      if (errno == EINTR) continue;
      s = brg__error(err, BRG_ERR_SYSTEM, "tcp", "poll: %s", strerror(errno));
      break;
    }
    /* Pending connections first (indices shift as they are dropped). */
    for (int i = npending - 1; i >= 0; i--) {
      if (!pfd[1 + i].revents) continue;
      ssize_t r =
          recv(q[i].fd, (char *)&q[i].hello + q[i].got, sizeof q[i].hello - q[i].got, MSG_DONTWAIT);
      if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
      if (r <= 0) {
        BRG__WARN("tcp", "refused connection from %s: closed before its hello", q[i].addr);
        pending_drop(q, &npending, i);
        continue;
      }
      q[i].got += (size_t)r;
      if (q[i].got < sizeof q[i].hello) continue;
      if (hello_accept(t, p, &q[i])) {
        connected++;
        q[i] = q[--npending];
      } else {
        pending_drop(q, &npending, i);
      }
    }
    if (pfd[0].revents) {
      struct sockaddr_storage ss;
      socklen_t len = sizeof ss;
      int fd = accept4(t->l.listen_fd, (struct sockaddr *)&ss, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED) continue;
        s = brg__error(err, BRG_ERR_SYSTEM, "tcp", "accept: %s", strerror(errno));
        break;
      }
      if (npending == TCP_MAX_PENDING) {
        BRG__WARN("tcp", "refused connection from %s: no hello in time", q[0].addr);
        pending_drop(q, &npending, 0);
      }
      pending *e = &q[npending++];
      e->fd = fd;
      e->got = 0;
      sockaddr_text((struct sockaddr *)&ss, len, e->addr, sizeof e->addr);
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
  }
  while (npending > 0) pending_drop(q, &npending, npending - 1);
  if (s != BRG_SUCCESS) return s;
  close(t->l.listen_fd);
  t->l.listen_fd = -1;
  BRG__TRACE("tcp", "rank %d connected from %s (%d sockets)", p->peer, t->l.peer_addr, t->nsocks);
  return proxy_start(t, err);
}

static void tcp_close(brg__conn *c) {
  tcp_conn *t = c->priv;
  if (!t) return;
  /* Give the send proxy a moment to flush and say goodbye; a peer that does
   * not read must not hold us up longer than that, and a receive proxy
   * blocked in recv() needs its sockets shut down. */
  if (!brg__net_stop(&t->l, t->l.sender ? TCP_CLOSE_GRACE_MS : 0)) {
    for (int i = 0; i < t->nsocks; i++)
      if (t->fds[i] >= 0) shutdown(t->fds[i], SHUT_RDWR);
    brg__net_stop(&t->l, -1);
  }
  for (int i = 0; i < TCP_MAX_SOCKS; i++) brg__sock_close(&t->fds[i]);
  brg__net_close(c);
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
    .config = &tcp_config,
    .can_connect = tcp_can_connect,
    .available = tcp_available,
    .recv_setup = tcp_recv_setup,
    .send_connect = tcp_send_connect,
    .recv_connect = tcp_recv_connect,
    .close = tcp_close,
};
