/*
 * What the network transports (tcp, ibverbs) share: the state every link
 * keeps beside its wire, and the steps of its life that do not depend on
 * the wire.
 *
 *   open   private state (starting with a brg__net_link) and the local FIFO
 *   start  the proxy thread
 *   stop   tell the proxy to stop, wake it, wait for it
 *   close  the listener, the FIFO, the private state
 *
 * Each transport's private struct has a brg__net_link as its first member,
 * so c->priv points at both.
 */
#ifndef BRG_NET_H
#define BRG_NET_H

#include <pthread.h>
#include <stddef.h>

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

/* Starts the proxy fn(arg), named brg-<tag>-send or brg-<tag>-recv. */
brg_status brg__net_start(brg__net_link *l, void *(*fn)(void *), void *arg, const char *tag,
                          brg__errbuf *err);

/* Raises `stopping`, wakes the proxy and waits up to wait_ms (-1: as long as
 * it takes) for it to end. 1 when it has ended or never started. */
int brg__net_stop(brg__net_link *l, int wait_ms);

/* Frees what brg__net_open made (the proxy must have ended) and closes the
 * listener; c->priv is NULL after. */
void brg__net_close(brg__conn *c);

#endif
