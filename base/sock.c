/* Sockets with deadlines: see sock.h. */
#include "sock.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "clock.h"

const char *brg__sock_io_why(int rc) {
  switch (rc) {
  case BRG__IO_OK: return "no error";
  case BRG__IO_EOF: return "the peer closed the connection";
  case BRG__IO_TIMEOUT: return "timed out";
  case BRG__IO_STOPPED: return "stopped";
  default: return strerror(errno);
  }
}

/* Waits for `events` on fd. Error and hang-up count as ready: the next
 * send/recv reports them with the right errno. */
int brg__sock_wait(int fd, short events, int64_t deadline) {
  for (;;) {
    struct pollfd p = {.fd = fd, .events = events};
    int n = poll(&p, 1, brg__ms_left(deadline));
    if (n > 0) return BRG__IO_OK;
    if (n == 0) {
      if (brg__deadline_passed(deadline)) return BRG__IO_TIMEOUT;
      continue;
    }
    if (errno != EINTR) return BRG__IO_ERR;
  }
}

/* Sends all of buf before `deadline`. `sent` (may be NULL) tells how far it
 * got, so a caller can tell a clean failure from one that cut a frame. */
int brg__sock_send_all(int fd, const void *buf, size_t len, int64_t deadline, size_t *sent) {
  const uint8_t *p = buf;
  size_t done = 0;
  int rc = BRG__IO_OK;
  while (done < len) {
    ssize_t n = send(fd, p + done, len - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      done += (size_t)n;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      rc = brg__sock_wait(fd, POLLOUT, deadline);
      if (rc != BRG__IO_OK) break;
      continue;
    }
    if (n == 0) errno = EIO;
    rc = (errno == EPIPE || errno == ECONNRESET) ? BRG__IO_EOF : BRG__IO_ERR;
    break;
  }
  if (sent) *sent = done;
  return rc;
}

/* Receives exactly len bytes before `deadline`. A reset counts as EOF: either
 * way the peer is gone. */
int brg__sock_recv_all(int fd, void *buf, size_t len, int64_t deadline) {
  uint8_t *p = buf;
  size_t done = 0;
  while (done < len) {
    ssize_t n = recv(fd, p + done, len - done, MSG_DONTWAIT);
    if (n > 0) {
      done += (size_t)n;
      continue;
    }
    if (n == 0) return BRG__IO_EOF;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      int rc = brg__sock_wait(fd, POLLIN, deadline);
      if (rc != BRG__IO_OK) return rc;
      continue;
    }
    return errno == ECONNRESET ? BRG__IO_EOF : BRG__IO_ERR;
  }
  return BRG__IO_OK;
}

/* Parses a numeric IPv4/IPv6 address (no name lookup). Returns 0 or a
 * getaddrinfo error code. */
int brg__sock_addr(const char *addr, uint16_t port, struct sockaddr_storage *ss, socklen_t *sslen) {
  struct addrinfo hints, *res = NULL;
  char portstr[8];
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
  snprintf(portstr, sizeof portstr, "%u", (unsigned)port);
  int rc = getaddrinfo(addr, portstr, &hints, &res);
  if (rc != 0) return rc;
  if (!res || res->ai_addrlen > sizeof *ss) {
    freeaddrinfo(res);
    return EAI_FAMILY;
  }
  memset(ss, 0, sizeof *ss);
  memcpy(ss, res->ai_addr, res->ai_addrlen);
  *sslen = res->ai_addrlen;
  freeaddrinfo(res);
  return 0;
}

int brg__sock_addr_is_numeric(const char *addr) {
  struct sockaddr_storage ss;
  socklen_t len;
  return addr[0] != '\0' && brg__sock_addr(addr, 1, &ss, &len) == 0;
}

/* "1.2.3.4:5" or "[::1]:5" */
void brg__sock_hostport(char *out, size_t out_bytes, const char *addr, unsigned port) {
  if (strchr(addr, ':'))
    snprintf(out, out_bytes, "[%.63s]:%u", addr, port);
  else
    snprintf(out, out_bytes, "%.63s:%u", addr, port);
}

void brg__sock_addr_str(const struct sockaddr *sa, socklen_t len, char *out, size_t out_bytes) {
  char host[NI_MAXHOST], serv[NI_MAXSERV];
  if (getnameinfo(sa, len, host, sizeof host, serv, sizeof serv, NI_NUMERICHOST | NI_NUMERICSERV) !=
      0) {
    snprintf(out, out_bytes, "(unknown peer)");
    return;
  }
  brg__sock_hostport(out, out_bytes, host, (unsigned)atoi(serv));
}

void brg__sock_peer_str(int fd, char *out, size_t out_bytes) {
  struct sockaddr_storage ss;
  socklen_t len = sizeof ss;
  if (getpeername(fd, (struct sockaddr *)&ss, &len) < 0)
    snprintf(out, out_bytes, "(unknown peer)");
  else
    brg__sock_addr_str((const struct sockaddr *)&ss, len, out, out_bytes);
}

long brg__sock_raise_nofile(long want, const char *subsys) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return -1;
  if (rl.rlim_cur == RLIM_INFINITY || (long)rl.rlim_cur >= want) return (long)rl.rlim_cur;
  if (rl.rlim_max == rl.rlim_cur) {
    BRG__WARN(subsys,
              "this process may open %ld file descriptors and needs about %ld; the hard limit "
              "is the same (raise ulimit -Hn)",
              (long)rl.rlim_cur, want);
    return (long)rl.rlim_cur;
  }
  rlim_t old = rl.rlim_cur;
  rl.rlim_cur = rl.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &rl) != 0) {
    BRG__WARN(subsys, "cannot raise RLIMIT_NOFILE from %ld to %ld: %s", (long)old,
              (long)rl.rlim_max, strerror(errno));
    return (long)old;
  }
  BRG__INFO(subsys, "raised RLIMIT_NOFILE from %ld to its hard limit %ld (about %ld needed)",
            (long)old, (long)rl.rlim_cur, want);
  return (long)rl.rlim_cur;
}

void brg__sock_close(int *fd) {
  if (*fd >= 0) close(*fd);
  *fd = -1;
}

/* Creates a non-blocking listener on addr:port and reports the port it got. */
brg_status brg__sock_listen(const char *addr, uint16_t port, int backlog, const char *subsys,
                            const char *what, int *fd_out, uint16_t *port_out, brg__errbuf *err) {
  return brg__sock_listen_buf(addr, port, backlog, 0, subsys, what, fd_out, port_out, err);
}

brg_status brg__sock_listen_buf(const char *addr, uint16_t port, int backlog, int sockbuf,
                                const char *subsys, const char *what, int *fd_out,
                                uint16_t *port_out, brg__errbuf *err) {
  struct sockaddr_storage ss;
  socklen_t sslen;
  char where[BRG__HOSTPORT_LEN];
  int gai = brg__sock_addr(addr, port, &ss, &sslen);
  if (gai != 0)
    return brg__error(err, BRG_ERR_INVALID_ARGUMENT, subsys,
                      "%s: '%s' is not a numeric IPv4 or IPv6 address (%s)", what, addr,
                      gai_strerror(gai));
  brg__sock_hostport(where, sizeof where, addr, port);
  int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return brg__error(err, BRG_ERR_SYSTEM, subsys, "%s: socket: %s", what, strerror(errno));
  if (sockbuf > 0) brg__sock_bufsize(fd, sockbuf);
  int one = 1;
  if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0) goto err_close;
  if (bind(fd, (struct sockaddr *)&ss, sslen) < 0) goto err_close;
  if (listen(fd, backlog) < 0) goto err_close;
  struct sockaddr_storage bound;
  socklen_t blen = sizeof bound;
  if (getsockname(fd, (struct sockaddr *)&bound, &blen) < 0) goto err_close;
  uint16_t p = bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                           : ((struct sockaddr_in *)&bound)->sin_port;
  *port_out = ntohs(p);
  *fd_out = fd;
  return BRG_SUCCESS;

err_close:;
  int e = errno;
  close(fd);
  return brg__error(err, BRG_ERR_SYSTEM, subsys, "%s: cannot listen on %s: %s", what, where,
                    strerror(e));
}

static int sock_retryable(int e) {
  return e == ECONNREFUSED || e == ETIMEDOUT || e == EHOSTUNREACH || e == ENETUNREACH ||
         e == ECONNRESET || e == ECONNABORTED || e == EAGAIN || e == EADDRNOTAVAIL || e == EINTR;
}

/* Waits for a connect() to finish; with a stop(), in slices of 100 ms
 * between which it is asked. */
static int dial_wait(int fd, int64_t deadline, const brg__sock_dialer *d) {
  if (!d->stop) return brg__sock_wait(fd, POLLOUT, deadline);
  for (;;) {
    int rc = brg__sock_wait(fd, POLLOUT, brg__deadline_min(deadline, brg__now_ms() + 100));
    if (rc != BRG__IO_TIMEOUT || brg__deadline_passed(deadline)) return rc;
    if (d->stop(d->arg)) return BRG__IO_STOPPED;
  }
}

int brg__sock_dial(const char *addr, uint16_t port, int64_t deadline, const brg__sock_dialer *d,
                   int *fd_out, int *last_errno) {
  struct sockaddr_storage ss, src;
  socklen_t sslen, srclen = 0;
  if (brg__sock_addr(addr, port, &ss, &sslen) != 0) {
    *last_errno = EINVAL;
    return BRG__IO_ERR;
  }
  if (d->bind_addr && d->bind_addr[0]) {
    if (brg__sock_addr(d->bind_addr, 0, &src, &srclen) != 0) {
      *last_errno = EINVAL;
      return BRG__IO_ERR;
    }
    if (src.ss_family != ss.ss_family) srclen = 0; /* another family: the kernel's choice */
  }
  *last_errno = 0;
  int pause = d->retry_ms;
  for (;;) {
    if (d->stop && d->stop(d->arg)) return BRG__IO_STOPPED;
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      *last_errno = errno;
      return BRG__IO_ERR;
    }
    if (d->sockbuf > 0) brg__sock_bufsize(fd, d->sockbuf);
    /* The source address picks the NIC, not the routing table (rails). */
    if (srclen && bind(fd, (struct sockaddr *)&src, srclen) < 0) {
      *last_errno = errno;
      close(fd);
      return BRG__IO_ERR;
    }
    int e = 0;
    if (connect(fd, (struct sockaddr *)&ss, sslen) < 0) {
      e = errno;
      /* Interrupted, the connection still goes on (POSIX). */
      if (e == EINPROGRESS || e == EINTR) {
        int rc = dial_wait(fd, deadline, d);
        if (rc != BRG__IO_OK) {
          e = rc == BRG__IO_TIMEOUT ? ETIMEDOUT : rc == BRG__IO_STOPPED ? ECANCELED : errno;
          close(fd);
          if (!*last_errno || rc != BRG__IO_TIMEOUT) *last_errno = e;
          return rc;
        }
        socklen_t elen = sizeof e;
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &elen) < 0) e = errno;
      }
    }
    if (e == 0) {
      *fd_out = fd;
      return BRG__IO_OK;
    }
    close(fd);
    *last_errno = e;
    if (d->refused_only ? e != ECONNREFUSED : !sock_retryable(e)) return BRG__IO_ERR;
    if (brg__deadline_passed(deadline)) return BRG__IO_TIMEOUT;
    brg__sleep_ms(brg__ms_left_capped(deadline, pause));
    if (pause < d->retry_max_ms) pause *= 2;
  }
}

int brg__sock_connect(const char *addr, uint16_t port, int64_t deadline, int retry_ms, int *fd_out,
                      int *last_errno) {
  brg__sock_dialer d = {.retry_ms = retry_ms, .retry_max_ms = retry_ms};
  return brg__sock_dial(addr, port, deadline, &d, fd_out, last_errno);
}

void brg__sock_nodelay(int fd) {
  int one = 1;
  /* Best effort: only latency depends on it. */
  (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

void brg__sock_bufsize(int fd, int bytes) {
  (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes);
  (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof bytes);
}

int brg__sock_set_blocking(int fd, int blocking) {
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0) return -1;
  fl = blocking ? fl & ~O_NONBLOCK : fl | O_NONBLOCK;
  return fcntl(fd, F_SETFL, fl);
}
