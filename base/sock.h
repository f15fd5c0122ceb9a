/*
 * Sockets with deadlines, for every layer that talks over TCP (bootstrap,
 * the tcp transport, the ibverbs control connection and its software
 * backend).
 *
 * Every socket these helpers make is non-blocking, every wait is a poll()
 * bounded by a deadline (base/clock.h: absolute ms, -1 never), and every send
 * uses MSG_NOSIGNAL, so no peer (dead, silent or hostile) can hold a thread
 * forever and a vanished peer is an error code, never a SIGPIPE.
 */
#ifndef BRG_SOCK_H
#define BRG_SOCK_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "brigade.h"
#include "log.h"

/* What an I/O helper returns. BRG__IO_STOPPED: a dialer's stop() said so. */
enum { BRG__IO_OK, BRG__IO_EOF, BRG__IO_TIMEOUT, BRG__IO_ERR, BRG__IO_STOPPED };

/* For an error message: what a BRG__IO code means; BRG__IO_ERR reads errno,
 * so call it before anything else can change that. */
const char *brg__sock_io_why(int rc);

/* Room for "[ipv6]:port". */
#define BRG__HOSTPORT_LEN 96

/* Waits for `events` on fd. Error and hang-up count as ready: the next
 * send/recv reports them with the right errno. */
int brg__sock_wait(int fd, short events, int64_t deadline);

/* Sends all of buf before `deadline`. `sent` (may be NULL) tells how far it
 * got, so a caller can tell a clean failure from one that cut a frame. */
int brg__sock_send_all(int fd, const void *buf, size_t len, int64_t deadline, size_t *sent);

/* Receives exactly len bytes before `deadline`. A reset counts as EOF: either
 * way the peer is gone. */
int brg__sock_recv_all(int fd, void *buf, size_t len, int64_t deadline);

/* Parses a numeric IPv4/IPv6 address (no name lookup). Returns 0 or a
 * getaddrinfo error code. */
int brg__sock_addr(const char *addr, uint16_t port, struct sockaddr_storage *ss, socklen_t *sslen);
int brg__sock_addr_is_numeric(const char *addr);

/* "1.2.3.4:5" or "[::1]:5" */
void brg__sock_hostport(char *out, size_t out_bytes, const char *addr, unsigned port);
/* The same for a socket address, and for the peer of a connected fd;
 * "(unknown peer)" where there is none. */
void brg__sock_addr_str(const struct sockaddr *sa, socklen_t len, char *out, size_t out_bytes);
void brg__sock_peer_str(int fd, char *out, size_t out_bytes);

/* Raises this process's soft RLIMIT_NOFILE to its hard limit when the soft
 * one is below `want` descriptors (logged under `subsys`). Returns the soft
 * limit in force afterwards (-1 when it cannot be read). */
long brg__sock_raise_nofile(long want, const char *subsys);

/* Closes *fd when open and marks it closed. */
void brg__sock_close(int *fd);

/* Creates a non-blocking listener on addr:port and reports the port it got.
 * Errors are logged under `subsys`, prefixed by `what`. */
brg_status brg__sock_listen(const char *addr, uint16_t port, int backlog, const char *subsys,
                            const char *what, int *fd_out, uint16_t *port_out, brg__errbuf *err);
/* The same with socket buffers of `sockbuf` bytes (0: the kernel's), set
 * before listen() so that accepted connections start with a window that
 * large. */
brg_status brg__sock_listen_buf(const char *addr, uint16_t port, int backlog, int sockbuf,
                                const char *subsys, const char *what, int *fd_out,
                                uint16_t *port_out, brg__errbuf *err);

/* How brg__sock_dial connects. */
typedef struct brg__sock_dialer {
  int retry_ms;     /* pause before the next attempt */
  int retry_max_ms; /* the pause doubles while below this */
  int refused_only; /* 1: only a refusal (nobody listens yet) is worth another
                       attempt; 0: every transient error is */
  int sockbuf;      /* > 0: socket buffer bytes, set before the handshake */
  /* NULL or "": the routing table picks the source address (and so the
   * NIC); else a numeric address of this host that every attempt binds to
   * first, when the destination has its family. */
  const char *bind_addr;
  /* NULL, or asked before each attempt and every 100 ms of a wait: nonzero
   * stops dialing with BRG__IO_STOPPED. */
  int (*stop)(void *arg);
  void *arg;
} brg__sock_dialer;

/* Connects to addr:port (numeric), trying again as `d` says until the
 * deadline. Returns a BRG__IO code and on BRG__IO_OK a non-blocking fd;
 * *last_errno says what went wrong (a refusal outlives a later timeout: it
 * says more). */
int brg__sock_dial(const char *addr, uint16_t port, int64_t deadline, const brg__sock_dialer *d,
                   int *fd_out, int *last_errno);

/* brg__sock_dial() retrying every retry_ms after any transient error. */
int brg__sock_connect(const char *addr, uint16_t port, int64_t deadline, int retry_ms, int *fd_out,
                      int *last_errno);

/* TCP_NODELAY, best effort: only latency depends on it. */
void brg__sock_nodelay(int fd);

/* SO_SNDBUF and SO_RCVBUF of `bytes`, best effort; on a connection they
 * count only when set before its handshake. */
void brg__sock_bufsize(int fd, int bytes);

/* Switches O_NONBLOCK; 0 or -1 with errno. */
int brg__sock_set_blocking(int fd, int blocking);

#endif
