/* What the network transports share: see net.h. */
#include "net.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"

brg_status brg__net_check(const brg__conn_params *p) {
  if (p->waiter && p->waiter->check) return p->waiter->check(p->waiter->arg);
  return BRG_SUCCESS;
}

brg_status brg__net_open(brg__conn *c, const brg__conn_params *p, int sender, size_t bytes,
                         const char *name, const char *subsys, brg__errbuf *err) {
  if (p->nslots < 1 || p->nslots > BRG__MAX_SLOTS || p->slot_bytes == 0 ||
      p->slot_bytes > UINT32_MAX)
    return brg__error(err, BRG_ERR_INVALID_ARGUMENT, subsys,
                      "%s link with rank %d: bad FIFO shape (%d slots of %zu bytes)", name, p->peer,
                      p->nslots, p->slot_bytes);
  brg__net_link *l = calloc(1, bytes);
  if (!l)
    return brg__error(err, BRG_ERR_NO_MEMORY, subsys, "%s link with rank %d: out of memory", name,
                      p->peer);
  l->sender = sender;
  l->peer = p->peer;
  l->listen_fd = -1;
  snprintf(l->peer_addr, sizeof l->peer_addr, "%s", p->peer_info ? p->peer_info->addr : "?");
  brg_status s = brg__fifo_alloc(&l->fifo, p->nslots, p->slot_bytes, err);
  if (s != BRG_SUCCESS) {
    free(l);
    return s;
  }
  c->priv = l;
  c->peer = p->peer;
  c->fifo = l->fifo;
  return BRG_SUCCESS;
}

/* The dialer's stop(): p's waiter check, whose status the error reports. */
typedef struct net_stop {
  const brg__conn_params *p;
  brg_status s;
} net_stop;

static int net_stopped(void *arg) {
  net_stop *n = arg;
  n->s = brg__net_check(n->p);
  return n->s != BRG_SUCCESS;
}

brg_status brg__net_dial(const brg__conn_params *p, const char *subsys, const char *addr,
                         uint16_t port, const char *where, int64_t deadline,
                         const brg__sock_dialer *d, int *fd_out, brg__errbuf *err) {
  if (!brg__sock_addr_is_numeric(addr))
    return brg__error(err, BRG_ERR_INVALID_ARGUMENT, subsys,
                      "rank %d is at '%s', not a numeric IPv4 or IPv6 address", p->peer, addr);
  net_stop stop = {.p = p};
  brg__sock_dialer how = *d;
  how.refused_only = 1; /* anything else will not mend before the deadline */
  how.stop = net_stopped;
  how.arg = &stop;
  int fd = -1, e = 0;
  int rc = brg__sock_dial(addr, port, deadline, &how, &fd, &e);
  if (rc == BRG__IO_OK && brg__sock_set_blocking(fd, 1) != 0) {
    e = errno;
    close(fd);
    rc = BRG__IO_ERR;
  }
  if (rc == BRG__IO_STOPPED)
    return brg__error(err, stop.s, subsys, "connecting to rank %d at %s: %s", p->peer, where,
                      brg_status_string(stop.s));
  if (rc == BRG__IO_TIMEOUT || (rc != BRG__IO_OK && e == ETIMEDOUT))
    return brg__error(err, BRG_ERR_TIMEOUT, subsys,
                      "connecting to rank %d at %s: no connection within %d ms (%s)", p->peer,
                      where, p->timeout_ms, strerror(e));
  if (rc != BRG__IO_OK)
    return brg__error(err, BRG_ERR_SYSTEM, subsys, "connecting to rank %d at %s: %s", p->peer,
                      where, strerror(e));
  brg__sock_nodelay(fd);
  *fd_out = fd;
  return BRG_SUCCESS;
}

brg_status brg__net_hello_send(const brg__conn_params *p, const char *subsys, int fd,
                               const void *hello, size_t bytes, const char *where, int64_t deadline,
                               brg__errbuf *err) {
  int rc = brg__sock_send_all(fd, hello, bytes, deadline, NULL);
  if (rc == BRG__IO_OK) return BRG_SUCCESS;
  return brg__error(err, rc == BRG__IO_TIMEOUT ? BRG_ERR_TIMEOUT : BRG_ERR_SYSTEM, subsys,
                    "hello to rank %d at %s: %s", p->peer, where, brg__sock_io_why(rc));
}

/* Forgets q[i], closing it unless it was kept; the others keep their
 * order (oldest first). */
static void pending_remove(brg__net_door *d, int i, int kept) {
  if (!kept) close(d->q[i].fd);
  memmove(&d->q[i], &d->q[i + 1], (size_t)(d->npending - i - 1) * sizeof d->q[0]);
  d->npending--;
}

static void pending_drop_oldest(brg__net_door *d, const char *why) {
  BRG__WARN(d->subsys, "refused connection from %s: %s", d->q[0].from, why);
  pending_remove(d, 0, 0);
}

int64_t brg__net_door_expire(brg__net_door *d) {
  int64_t now = brg__now_ms(), next = -1;
  for (int i = d->npending - 1; i >= 0; i--) {
    if (now >= d->q[i].deadline) {
      BRG__WARN(d->subsys, "refused connection from %s: no hello within %d ms", d->q[i].from,
                BRG__NET_HELLO_MS);
      pending_remove(d, i, 0);
    }
  }
  for (int i = 0; i < d->npending; i++) next = brg__deadline_min(next, d->q[i].deadline);
  return next;
}

/* Reads more of q[i]'s hello; once it is complete, take() judges it.
 * 1 when the connection was kept. */
static int pending_read(brg__net_door *d, int i) {
  brg__net_pending *e = &d->q[i];
  ssize_t r = recv(e->fd, e->hello + e->got, d->hello_bytes - e->got, MSG_DONTWAIT);
  if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
  if (r <= 0) {
    BRG__WARN(d->subsys, "refused connection from %s: closed before its hello", e->from);
    pending_remove(d, i, 0);
    return 0;
  }
  e->got += (size_t)r;
  if (e->got < d->hello_bytes) return 0;
  int kept = 0;
  if (brg__sock_set_blocking(e->fd, 1) != 0)
    BRG__WARN(d->subsys, "dropped connection from %s: fcntl: %s", e->from, strerror(errno));
  else
    kept = d->take(d->arg, d->p, e->fd, e->hello, e->from);
  if (kept && d->kept_from) snprintf(d->kept_from, BRG__HOSTPORT_LEN, "%s", e->from);
  pending_remove(d, i, kept);
  return kept;
}

/* New connections join the pending ones, a batch per round so that those
 * already taken get read before the oldest make room. 0, or -1 with errno. */
static int pending_add(brg__net_door *d) {
  int cap = d->max_pending > 0 && d->max_pending < BRG__NET_MAX_PENDING ? d->max_pending
                                                                        : BRG__NET_MAX_PENDING;
  for (int k = 0; k < (cap + 3) / 4; k++) {
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    int fd = accept4(d->listen_fd, (struct sockaddr *)&ss, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        /* The listen queue keeps the rest; the oldest stranger makes room. */
        if (d->npending > 0) pending_drop_oldest(d, "out of file descriptors");
        return 0;
      }
      return -1;
    }
    if (d->npending >= cap) pending_drop_oldest(d, "no hello yet, and newer connections wait");
    brg__net_pending *e = &d->q[d->npending++];
    e->fd = fd;
    e->got = 0;
    e->deadline = brg__now_ms() + BRG__NET_HELLO_MS;
    brg__sock_addr_str((struct sockaddr *)&ss, len, e->from, sizeof e->from);
    brg__sock_nodelay(fd);
  }
  return 0;
}

int brg__net_door_fds(const brg__net_door *d, struct pollfd *pfd) {
  pfd[0] = (struct pollfd){.fd = d->listen_fd, .events = POLLIN};
  for (int i = 0; i < d->npending; i++)
    pfd[1 + i] = (struct pollfd){.fd = d->q[i].fd, .events = POLLIN};
  return 1 + d->npending;
}

int brg__net_door_serve(brg__net_door *d, const struct pollfd *pfd, int want, int *kept) {
  /* Pending connections first, oldest first; a removal moves those after
   * it down, so `i` counts what stays and `k` walks the poll array. */
  for (int i = 0, k = 0, n = d->npending; k < n && *kept < want; k++) {
    int before = d->npending;
    if (pfd[1 + k].revents) *kept += pending_read(d, i);
    if (d->npending == before) i++;
  }
  if (*kept < want && pfd[0].revents) return pending_add(d);
  return 0;
}

void brg__net_door_drop(brg__net_door *d) {
  while (d->npending > 0) pending_remove(d, d->npending - 1, 0);
}

brg_status brg__net_accept(brg__net_link *l, const brg__conn_params *p, const char *subsys,
                           size_t hello_bytes, int want, brg__net_take_fn take, void *arg,
                           int64_t deadline, brg__errbuf *err) {
  if (hello_bytes == 0 || hello_bytes > BRG__NET_HELLO_MAX)
    return brg__error(err, BRG_ERR_INTERNAL, subsys, "a hello of %zu bytes", hello_bytes);
  brg__net_door d = {.listen_fd = l->listen_fd,
                     .p = p,
                     .subsys = subsys,
                     .hello_bytes = hello_bytes,
                     .take = take,
                     .arg = arg,
                     .kept_from = l->peer_addr};
  int kept = 0;
  brg_status s = BRG_SUCCESS;
  while (kept < want) {
    if ((s = brg__net_check(p)) != BRG_SUCCESS) {
      brg__error(err, s, subsys, "waiting for rank %d to connect: %s", p->peer,
                 brg_status_string(s));
      break;
    }
    int64_t soonest = brg__net_door_expire(&d);
    int left = brg__ms_left_capped(deadline, 100);
    if (left == 0) {
      if (want > 1)
        s = brg__error(err, BRG_ERR_TIMEOUT, subsys,
                       "rank %d did not connect within %d ms (%d of %d connections)", p->peer,
                       p->timeout_ms, kept, want);
      else
        s = brg__error(err, BRG_ERR_TIMEOUT, subsys, "rank %d did not connect within %d ms",
                       p->peer, p->timeout_ms);
      break;
    }
    int until_expiry = brg__ms_left(soonest);
    if (until_expiry >= 0 && until_expiry < left) left = until_expiry;
    struct pollfd pfd[BRG__NET_DOOR_FDS];
    int nfds = brg__net_door_fds(&d, pfd);
    if (poll(pfd, (nfds_t)nfds, left) < 0) {
      if (errno == EINTR) continue;
      s = brg__error(err, BRG_ERR_SYSTEM, subsys, "poll: %s", strerror(errno));
      break;
    }
    if (brg__net_door_serve(&d, pfd, want, &kept) != 0) {
      s = brg__error(err, BRG_ERR_SYSTEM, subsys, "accept: %s", strerror(errno));
      break;
    }
  }
  brg__net_door_drop(&d);
  if (s != BRG_SUCCESS) return s;
  brg__sock_close(&l->listen_fd);
  return BRG_SUCCESS;
}

int brg__net_hello_ok(const brg__conn_params *p, const char *subsys, const char *from,
                      const char *what, int magic_ok, const uint8_t *secret, int rank) {
  uint8_t diff = 0; /* every byte, whatever the first differs in */
  for (int i = 0; i < BRG__SECRET_BYTES; i++) diff |= secret[i] ^ p->secret[i];
  if (!magic_ok)
    BRG__WARN(subsys, "refused connection from %s: not a brigade %s hello", from, what);
  else if (diff)
    BRG__WARN(subsys, "refused connection from %s: bad secret", from);
  else if (rank != p->peer)
    BRG__WARN(subsys, "refused connection from %s: rank %d, expected rank %d", from, rank, p->peer);
  else
    return 1;
  return 0;
}

brg_status brg__net_start(brg__net_link *l, void *(*send_fn)(void *), void *(*recv_fn)(void *),
                          void *arg, const char *tag, brg__errbuf *err) {
  char name[16];
  snprintf(name, sizeof name, "brg-%s-%s", tag, l->sender ? "send" : "recv");
  brg_status s = brg__proxy_start(&l->thread, l->sender ? send_fn : recv_fn, arg, name, err);
  if (s == BRG_SUCCESS) l->thread_started = 1;
  return s;
}

void brg__net_peer_left(brg__net_link *l, const char *subsys) {
  brg__fifo_mark_closed(&l->fifo, BRG_ERR_REMOTE, "rank %d closed its link", l->peer);
  BRG__INFO(subsys, "rank %d (%s) closed its link", l->peer, l->peer_addr);
  brg__fifo_wake_all(&l->fifo);
}

int brg__net_stop(brg__net_link *l, int wait_ms) {
  __atomic_store_n(&l->stopping, 1, __ATOMIC_RELEASE);
  if (!l->thread_started) return 1;
  brg__fifo_wake_all(&l->fifo);
  if (wait_ms == 0) return 0;
  if (wait_ms > 0) {
    struct timespec ts = brg__realtime_in_ms(wait_ms);
    if (pthread_timedjoin_np(l->thread, NULL, &ts) != 0) return 0;
  } else {
    pthread_join(l->thread, NULL);
  }
  l->thread_started = 0;
  return 1;
}

void brg__net_close(brg__conn *c) {
  brg__net_link *l = c->priv;
  if (!l) return;
  brg__sock_close(&l->listen_fd);
  brg__fifo_free(&l->fifo);
  memset(&c->fifo, 0, sizeof c->fifo);
  c->landed = NULL;
  free(l);
  c->priv = NULL;
}
