/*
 * What the network transports (tcp, ibverbs) share: the state every link
 * keeps beside its wire, and the steps of its life that do not depend on
 * the wire.
 *
 *   open    private state (starting with a brg__net_link) and the local FIFO
 *   dial    sender: connect to the receiver's listener, send a hello
 *   accept  receiver: take the connections whose hello is right
 *   start   the proxy thread
 *   stop    tell the proxy to stop, wake it, wait for it
 *   close   the listener, the FIFO, the private state
 *
 * A hello is the first thing a sender says on a connection: each transport
 * has its own, and each carries a magic number, the job's secret and the
 * sender's rank, which brg__net_hello_ok checks.
 *
 * Each transport's private struct has a brg__net_link as its first member,
 * so c->priv points at both.
 */
#ifndef BRG_NET_H
#define BRG_NET_H

#include <poll.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "sock.h"
#include "transport.h"

typedef struct brg__net_link {
  int sender; /* 1 on the send end of the link */
  int peer;
  brg__fifo fifo; /* the local FIFO; c->fifo is a copy of it */
  int listen_fd;  /* the receiver's, until its sender is in */
  int thread_started;
  pthread_t thread;
  int stopping; /* set by stop, read by the proxy (atomically) */
  char peer_addr[BRG__HOSTPORT_LEN];
} brg__net_link;

/* The caller's waiter check during setup: an abort stops connecting too. */
brg_status brg__net_check(const brg__conn_params *p);

/* Allocates `bytes` of zeroed private state, which begins with a
 * brg__net_link, and the local FIFO. c->priv is set first, so that close
 * cleans up whatever a failed open left. `name` ("tcp") begins error
 * messages, which go to `subsys`. */
brg_status brg__net_open(brg__conn *c, const brg__conn_params *p, int sender, size_t bytes,
                         const char *name, const char *subsys, brg__errbuf *err);

/* Connects to the receiver at addr:port (`where` names it in messages),
 * trying again while nobody listens there yet as `d` says (its retry pauses
 * and socket buffers), until the deadline or p's waiter check stops it.
 * *fd_out is blocking, with TCP_NODELAY. */
brg_status brg__net_dial(const brg__conn_params *p, const char *subsys, const char *addr,
                         uint16_t port, const char *where, int64_t deadline,
                         const brg__sock_dialer *d, int *fd_out, brg__errbuf *err);

/* Sends a hello of `bytes` on a fresh connection to `where` before the
 * deadline. */
brg_status brg__net_hello_send(const brg__conn_params *p, const char *subsys, int fd,
                               const void *hello, size_t bytes, const char *where, int64_t deadline,
                               brg__errbuf *err);

#define BRG__NET_MAX_PENDING 32 /* connections part way through their hello */
#define BRG__NET_HELLO_MAX 2048 /* the largest hello */
/* A connection has this long to send its hello. Strangers cannot hold up
 * a rank with it (the oldest pending makes way for a newcomer); a rank of
 * the job descheduled between its connect and its hello on a loaded host
 * must not be refused, and has been for more than 500 ms. */
#define BRG__NET_HELLO_MS 2000
#define BRG__NET_BACKLOG 4096 /* listen queue; the kernel caps it at somaxconn */

/* Judges a complete hello from `from` that came on fd (now blocking, with
 * TCP_NODELAY): 1 keeps the connection (fd is the callee's now), 0 refuses
 * it after a warning that says why. `hello` may be unaligned. */
typedef int (*brg__net_take_fn)(void *arg, const brg__conn_params *p, int fd, const void *hello,
                                const char *from);

/* The door of a listener: the connections part way through their hello.
 * Up to BRG__NET_MAX_PENDING may be at once, the oldest making way for a
 * newcomer, and each is dropped once it has taken BRG__NET_HELLO_MS, so a
 * silent or slow stranger holds up nobody. brg__net_accept runs one to
 * completion; a thread that serves a listener for good (runtime/exec/p2p/p2p.c)
 * polls one among its other descriptors. */
typedef struct brg__net_pending {
  int fd;
  size_t got;
  int64_t deadline;
  char from[BRG__HOSTPORT_LEN];
  unsigned char hello[BRG__NET_HELLO_MAX];
} brg__net_pending;

typedef struct brg__net_door {
  int listen_fd;
  const brg__conn_params *p; /* passed to take (may be NULL) */
  const char *subsys;
  size_t hello_bytes; /* 1 to BRG__NET_HELLO_MAX */
  brg__net_take_fn take;
  void *arg;
  char *kept_from; /* NULL, or BRG__HOSTPORT_LEN bytes: who was kept last */
  int max_pending; /* fewer pending at once than BRG__NET_MAX_PENDING; 0: that many */
  int npending;
  brg__net_pending q[BRG__NET_MAX_PENDING];
} brg__net_door;

#define BRG__NET_DOOR_FDS (1 + BRG__NET_MAX_PENDING)
/* Drops the connections whose hello is overdue; returns the earliest
 * deadline of those left (-1: none). */
int64_t brg__net_door_expire(brg__net_door *d);
/* The listener, then the pending connections, for poll (at most
 * BRG__NET_DOOR_FDS); returns how many. */
int brg__net_door_fds(const brg__net_door *d, struct pollfd *pfd);
/* After poll on what brg__net_door_fds gave: reads the hellos that came,
 * adding the connections take() keeps to *kept (while below `want`), then
 * accepts newcomers. 0, or -1 with errno when accept fails for good. */
int brg__net_door_serve(brg__net_door *d, const struct pollfd *pfd, int want, int *kept);
/* Closes every pending connection. */
void brg__net_door_drop(brg__net_door *d);

/* Accepts connections on l->listen_fd until take() has kept `want` of
 * them, then closes the listener; l->peer_addr names the last one kept.
 * Each must first send a hello of hello_bytes (at most BRG__NET_HELLO_MAX).
 * Up to BRG__NET_MAX_PENDING may be part way through theirs at once, the
 * oldest making way for a newcomer, and each is dropped once it has taken
 * BRG__NET_HELLO_MS, so a silent or slow stranger holds up nobody. Fails at the deadline or when p's waiter check says so. */
brg_status brg__net_accept(brg__net_link *l, const brg__conn_params *p, const char *subsys,
                           size_t hello_bytes, int want, brg__net_take_fn take, void *arg,
                           int64_t deadline, brg__errbuf *err);

/* The data-connection hellos of tcp and ibverbs, judged as their
 * listeners judge them (exposed for the fuzzer). tcp: the socket index the
 * hello claims, or -1 (after a warning) when it is refused; fds are the
 * link's sockets so far (-1: not yet). ibverbs: 1 when taken, else 0. */
extern const size_t brg__tcp_hello_bytes, brg__ib_hello_bytes;
int brg__tcp_hello_check(const brg__conn_params *p, const char *from, const void *hello, int nsocks,
                         const int *fds);
int brg__ib_hello_check(const brg__conn_params *p, const char *from, const void *hello, int nslots,
                        int nqps);

/* What every hello must show: its magic (magic_ok), the job's secret and
 * the rank p expects. 1 when it does; else 0 and a warning about the
 * connection from `from` that says what was wrong with the `what` hello. */
int brg__net_hello_ok(const brg__conn_params *p, const char *subsys, const char *from,
                      const char *what, int magic_ok, const uint8_t *secret, int rank);

/* Starts the proxy: send_fn(arg) named brg-<tag>-send on the send end,
 * recv_fn(arg) named brg-<tag>-recv on the receive end. */
brg_status brg__net_start(brg__net_link *l, void *(*send_fn)(void *), void *(*recv_fn)(void *),
                          void *arg, const char *tag, brg__errbuf *err);

/* The receive proxy's peer said goodbye: the link is closed for the engine,
 * which learns it once it has consumed what arrived, and that is no
 * failure. */
void brg__net_peer_left(brg__net_link *l, const char *subsys);

/* Raises `stopping`, wakes the proxy and waits up to wait_ms (-1: as long as
 * it takes) for it to end. 1 when it has ended or never started. */
int brg__net_stop(brg__net_link *l, int wait_ms);

/* Frees what brg__net_open made (the proxy must have ended) and closes the
 * listener; c->priv is NULL after. */
void brg__net_close(brg__conn *c);

#endif
