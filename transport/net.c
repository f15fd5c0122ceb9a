/* What the network transports share: see net.h. */
#include "net.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

brg_status brg__net_check(const brg__conn_params *p) {
  if (p->waiter && p->waiter->check) return p->waiter->check(p->waiter->arg);
  return BRG_SUCCESS;
}

brg_status brg__net_open(brg__conn *c, const brg__conn_params *p, int sender, size_t bytes,
                         const char *name, const char *subsys, brg__errbuf *err) {
  if (p->nslots < 1 || p->nslots > BRG__MAX_SLOTS || p->slot_bytes == 0 ||
      p->slot_bytes > UINT32_MAX)
    return brg__error(err, BRG_ERR_INVALID_ARGUMENT, subsys,
                      "%s link with rank %d: bad FIFO shape (%d slots of %zu bytes)", name,
                      p->peer, p->nslots, p->slot_bytes);
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

brg_status brg__net_start(brg__net_link *l, void *(*fn)(void *), void *arg, const char *tag,
                          brg__errbuf *err) {
  char name[16];
  snprintf(name, sizeof name, "brg-%s-%s", tag, l->sender ? "send" : "recv");
  brg_status s = brg__proxy_start(&l->thread, fn, arg, name, err);
  if (s == BRG_SUCCESS) l->thread_started = 1;
  return s;
}

int brg__net_stop(brg__net_link *l, int wait_ms) {
  __atomic_store_n(&l->stopping, 1, __ATOMIC_RELEASE);
  if (!l->thread_started) return 1;
  brg__fifo_wake_all(&l->fifo);
  if (wait_ms == 0) return 0;
  if (wait_ms > 0) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += wait_ms / 1000;
    ts.tv_nsec += (long)(wait_ms % 1000) * 1000000L;
    ts.tv_sec += ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
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
  free(l);
  c->priv = NULL;
}
