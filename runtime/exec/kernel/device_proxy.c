/*
 * Kernel mode's host proxy: on a link between hosts the neighbour's words
 * and slots are in pinned host memory of this rank, and two threads play
 * the neighbour, carrying what the kernels post over the network link.
 * They move slots only through the link's proxy entry
 * (brg__transport_ops.proxy_post / proxy_sent / proxy_poll /
 * proxy_release), each slot naming its channel, so whatever transport
 * carries the link (tcp, ibverbs, shm) is driven alike.
 *
 * The call headers go the same way: the header a launch's channel writes
 * into its mailbox at the start (its call: ring_args.h, brg__rk_hdr) goes
 * on the network link in a slot of its own (a BRG__PROXY_CALL slot, the
 * call its payload), and the previous rank's arrive in the channel's mailbox of the link from
 * it, where the kernel compares them with its own call as it does within
 * a host: calls that differ between hosts stop the kernels with
 * BRG_ERR_MISMATCH naming both calls (device_watch.c), not at the
 * watchdog's timeout. On a link that runs GPUDirect RDMA a call's slot
 * writes no GPU slot: the channel's data slot number n is in GPU slot
 * n % nslots (transport.h), and a GPU slot is free again once the link
 * slot that carried it is.
 */
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>

#include "device_ring_int.h"

/* Stops the host proxy's threads, if any run. */
void brg__dev_proxy_join(struct brg__dev_ring *d) {
  __atomic_store_n(&d->px.stop, 1, __ATOMIC_RELEASE);
  if (d->px.tx_on) pthread_join(d->px.tx, NULL);
  if (d->px.rx_on) pthread_join(d->px.rx, NULL);
  d->px.tx_on = d->px.rx_on = 0;
}

/* Channel ch's words in a link's host region. */
static struct brg__dev_plink *plink(char *region, const struct brg__dev_ring *d, int ch) {
  return (struct brg__dev_plink *)(region + (size_t)ch * d->px.stride);
}

/* Entry k of a channel's mailbox of call headers in a link's host region. */
static brg__rk_hdr *phdr(char *region, const struct brg__dev_ring *d, int ch, uint64_t k) {
  return &plink(region, d, ch)->hdr[k % BRG__RK_HDRS];
}

/* The call in mailbox entry k, once every word of it carries entry k's
 * flag (ring_args.h): 1 then, 0 while some word has not come. */
static int phdr_get(const brg__rk_hdr *h, uint64_t k, brg__rk_call *call) {
  uint32_t f = brg__rk_hdr_flag(k);
  uint64_t w[BRG__RK_CALL_WORDS];
  for (int i = 0; i < BRG__RK_CALL_WORDS; i++) {
    w[i] = __atomic_load_n(&h->w[i], __ATOMIC_ACQUIRE);
    if (!brg__rk_has_flag(w[i], f)) return 0;
  }
  return brg__rk_call_of_words(w, f, call);
}

/* Mailbox entry k holds `call`: each word stored whole beside the flag. */
static void phdr_put(brg__rk_hdr *h, uint64_t k, const brg__rk_call *call) {
  uint64_t w[BRG__RK_CALL_WORDS];
  brg__rk_call_words(call, brg__rk_hdr_flag(k), w);
  for (int i = 0; i < BRG__RK_CALL_WORDS; i++) __atomic_store_n(&h->w[i], w[i], __ATOMIC_RELEASE);
}

/* Whether call headers go on the link to the next rank, and come on the
 * one from the previous rank: on every staged link. */
static int hdrs_out(const struct brg__dev_ring *d) {
  return d->send_staged;
}
static int hdrs_in(const struct brg__dev_ring *d) {
  return d->recv_staged;
}

void brg__dev_proxy_hdrs(const struct brg__dev_ring *d, int ch, brg__rk_link *l) {
  if (hdrs_out(d)) {
    char *p = d->px.send_dev + (size_t)ch * d->px.stride;
    l->send_hdr = ((struct brg__dev_plink *)p)->hdr;
    l->hdr_acked = &((struct brg__dev_plink *)p)->hdr_ack; /* tx: headers it carried */
  }
  if (hdrs_in(d)) {
    char *p = d->px.recv_dev + (size_t)ch * d->px.stride;
    l->recv_hdr = ((struct brg__dev_plink *)p)->hdr;
    l->hdr_ack = &((struct brg__dev_plink *)p)->hdr_ack; /* the kernel: headers it checked */
  }
}

static int proxy_stopping(struct brg__dev_ring *d) {
  return __atomic_load_n(&d->px.stop, __ATOMIC_ACQUIRE) ||
         __atomic_load_n(&d->k.words->abort, __ATOMIC_ACQUIRE);
}

/* The proxy's waiter check: the proxy stops, or the kernels were stopped. */
static brg_status proxy_check(void *arg) {
  return proxy_stopping(arg) ? BRG_ERR_ABORTED : BRG_SUCCESS;
}

/* Nothing to do: yield at first, then sleep a little longer each time (at
 * most 200 us), so an idle proxy costs little and a busy one reacts at once. */
static void proxy_idle(int *idle) {
  if (++*idle < 64) {
    sched_yield();
    return;
  }
  struct timespec ts = {0, *idle < 2000 ? 20000 : 200000};
  nanosleep(&ts, NULL);
}

/* The proxy gives up: the kernels stop at their next wait, and the next
 * call says why (with what the liveness thread learnt of the neighbours). */
static void *proxy_fail(struct brg__dev_ring *d, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void *proxy_fail(struct brg__dev_ring *d, const char *fmt, ...) {
  if (!__atomic_load_n(&d->px.stop, __ATOMIC_ACQUIRE)) {
    char text[sizeof d->k.stop_why];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&d->ev_lock);
    if (!d->k.stop_why[0]) memcpy(d->k.stop_why, text, sizeof text);
    pthread_mutex_unlock(&d->ev_lock);
  }
  brg__dev_kernel_stop(d);
  return NULL;
}

static const char *link_why(const brg__conn *l) {
  return l->fifo.ctrl->closed_why[0] ? l->fifo.ctrl->closed_why : "no reason given";
}

/* The network link failed under the proxy (unless the proxy stops). */
static void *proxy_link_fail(struct brg__dev_ring *d, const brg__conn *l, const char *dir) {
  if (proxy_stopping(d)) return NULL;
  return proxy_fail(d, "the %s link %s rank %d broke: %s", l->ops->name, dir, l->peer, link_why(l));
}

/* Each proxy thread sleeps in short naps while idle: with the default
 * timer slack (50 us) a 20 us nap would take 70. */
static void proxy_nap_precise(void) {
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
}

/* tx: the header channel ch's kernel wrote at its next launch's start, in
 * a network slot of its own ahead of the slots it posts after it; 1 when
 * it went, 0 when none is due or the network link is full, -1 when the
 * proxy gave up. Once on the link, its mailbox entry is free again. */
static int proxy_tx_hdr(struct brg__dev_ring *d, brg__conn *l, brg__waiter *w, int ch,
                        uint64_t *pos, uint64_t *hsent) {
  uint64_t k = hsent[ch];
  const brg__rk_hdr *h = phdr(d->px.send, d, ch, k);
  brg__rk_call call;
  if (!phdr_get(h, k, &call)) return 0;
  brg__proxy_slot s = {.what = BRG__PROXY_CALL,
                       .channel = (uint32_t)ch,
                       .seq = k + 1,
                       .bytes = sizeof call,
                       .data = &call};
  int r = l->ops->proxy_post(l, &s, w);
  if (r < 0) proxy_link_fail(d, l, "to");
  if (r <= 0) return r;
  (*pos)++;
  hsent[ch] = k + 1;
  __atomic_store_n(&plink(d->px.send, d, ch)->hdr_ack, k + 1, __ATOMIC_RELEASE);
  return 1;
}

/* tx: every slot a channel's kernel posted to the next host goes on the
 * network link as the link's next slot, naming the channel and the bytes
 * (the kernel wrote them beside the tail); once the link holds it, the
 * channel's head says the slot is free. */
static void *proxy_tx(void *arg) {
  struct brg__dev_ring *d = arg;
  proxy_nap_precise();
  brg__conn *l = &d->px.net->send;
  brg__waiter w = {.spin = -1, .check = proxy_check, .arg = d};
  uint64_t pos = 0, freed = 0, hsent[BRG__RK_MAX_CHANNELS] = {0};
  /* GPUDirect: the link position of the channel's slot n, at n % nslots */
  uint64_t gpos[BRG__MAX_SLOTS] = {0};
  for (int idle = 0; !proxy_stopping(d);) {
    int moved = 0;
    for (int ch = 0; hdrs_out(d) && ch < d->k.channels; ch++) {
      int r = proxy_tx_hdr(d, l, &w, ch, &pos, hsent);
      if (r < 0) return NULL;
      moved |= r;
    }
    if (d->px.gdr.send) {
      /* The one channel's slot n is free once the link sent the link slot
       * that carried it (calls go between). */
      uint64_t h = l->ops->proxy_sent(l), fr = freed;
      while (fr < d->px.sent[0] && gpos[fr % (uint64_t)d->nslots] < h) fr++;
      if (fr > freed) {
        freed = fr;
        __atomic_store_n(&plink(d->px.send, d, 0)->head, fr, __ATOMIC_RELEASE);
        moved = 1;
      }
    }
    for (int ch = 0; ch < d->k.channels && !proxy_stopping(d); ch++) {
      uint64_t sent = d->px.sent[ch];
      if (__atomic_load_n(&plink(d->px.send, d, ch)->tail, __ATOMIC_ACQUIRE) <= sent) continue;
      uint64_t k = sent % (uint64_t)d->nslots;
      uint64_t bytes = plink(d->px.send, d, ch)->sizes[k];
      if (bytes > d->k.slot)
        return proxy_fail(d, "a kernel posted %llu bytes in a slot of %zu to rank %d",
                          (unsigned long long)bytes, d->k.slot, l->peer);
      /* With GPUDirect the link reads it from GPU slot (seq - 1) % nslots = k. */
      brg__proxy_slot s = {.what = BRG__PROXY_DATA,
                           .channel = (uint32_t)ch,
                           .seq = sent + 1,
                           .bytes = (uint32_t)bytes,
                           .device = d->px.gdr.send,
                           .data = d->px.gdr.send ? NULL
                                                  : d->px.send + (size_t)ch * d->px.stride +
                                                        PLINK_CTRL + k * d->k.slot};
      int r = l->ops->proxy_post(l, &s, &w);
      if (r < 0) return proxy_link_fail(d, l, "to");
      if (r == 0) break; /* the network link is full: its own proxy frees slots */
      gpos[k] = pos++;
      __atomic_store_n(&d->px.sent[ch], sent + 1, __ATOMIC_RELEASE);
      if (!d->px.gdr.send)
        __atomic_store_n(&plink(d->px.send, d, ch)->head, sent + 1, __ATOMIC_RELEASE);
      moved = 1;
    }
    if (moved)
      idle = 0;
    else
      proxy_idle(&idle);
  }
  return NULL;
}

/* rx: a launch's call header, into the channel's mailbox once the kernel
 * has checked the one BRG__RK_HDRS before it; 1 when it went there, -1
 * when the proxy gave up or stops. */
static int proxy_rx_hdr(struct brg__dev_ring *d, const brg__conn *l, const brg__proxy_slot *s,
                        uint64_t *hgot, int *idle) {
  uint64_t ch = s->channel;
  if (!hdrs_in(d) || ch >= (uint64_t)d->k.channels || s->seq != hgot[ch] + 1 ||
      s->bytes != sizeof(brg__rk_call)) {
    proxy_fail(d,
               "rank %d sent a kernel-mode call header this rank cannot place "
               "(channel %llu of %d, header %llu where %llu was due, %u bytes%s)",
               l->peer, (unsigned long long)ch, d->k.channels, (unsigned long long)s->seq,
               (unsigned long long)(ch < (uint64_t)d->k.channels ? hgot[ch] + 1 : 0), s->bytes,
               hdrs_in(d) ? "" : ", on a link that carries none");
    return -1;
  }
  while (hgot[ch] - __atomic_load_n(&plink(d->px.recv, d, (int)ch)->hdr_ack, __ATOMIC_ACQUIRE) >=
         (uint64_t)BRG__RK_HDRS) {
    if (proxy_stopping(d)) return -1;
    proxy_idle(idle);
  }
  brg__rk_call call;
  memcpy(&call, s->data, sizeof call);
  phdr_put(phdr(d->px.recv, d, (int)ch, hgot[ch]), hgot[ch], &call);
  hgot[ch]++;
  return 1;
}

/* rx: each slot that arrives from the previous host goes into the next
 * slot of the channel it names, once that channel's kernel has freed it,
 * and the channel's tail says so. A channel whose slots are all taken
 * holds back the ones behind it: its kernel frees them without waiting
 * for any other channel (a ring step takes a slot in and puts one out, so
 * the channel's slots around the ring never all fill). */
static void *proxy_rx(void *arg) {
  struct brg__dev_ring *d = arg;
  proxy_nap_precise();
  brg__conn *l = &d->px.net->recv;
  uint64_t pos = 0, got[BRG__RK_MAX_CHANNELS] = {0}, released = 0;
  uint64_t hgot[BRG__RK_MAX_CHANNELS] = {0};
  /* GPUDirect: the link position of the channel's slot n, at n % nslots */
  uint64_t gpos[BRG__MAX_SLOTS] = {0};
  if (d->px.gdr.recv) d->api->drv.set_device(d->px.gpu); /* its flushes are for this GPU */
  for (int idle = 0; !proxy_stopping(d);) {
    if (d->px.gdr.recv) {
      /* The one channel's slots land in its GPU slots: the previous rank
       * may write the link's slots again up to the one that carried the
       * first slot the kernel has not taken (calls between them are in
       * the mailbox), and all of them once it took every one. */
      uint64_t h = __atomic_load_n(&plink(d->px.recv, d, 0)->head, __ATOMIC_ACQUIRE);
      uint64_t rel = h < got[0] ? gpos[h % (uint64_t)d->nslots] : pos;
      if (rel > released) {
        released = rel;
        l->ops->proxy_release(l, rel);
        idle = 0;
      }
    }
    brg__proxy_slot s;
    int r = l->ops->proxy_poll(l, pos, &s);
    if (r < 0) return proxy_link_fail(d, l, "from");
    if (r == 0) {
      proxy_idle(&idle);
      continue;
    }
    if (s.what == BRG__PROXY_CALL) {
      if (proxy_rx_hdr(d, l, &s, hgot, &idle) < 0) return NULL;
      if (!d->px.gdr.recv) l->ops->proxy_release(l, pos + 1);
      pos++;
      idle = 0;
      continue;
    }
    uint64_t ch = s.channel, bytes = s.bytes;
    if (ch >= (uint64_t)d->k.channels || bytes > d->k.slot || s.seq != got[ch] + 1 ||
        s.device != d->px.gdr.recv)
      return proxy_fail(d,
                        "rank %d sent a kernel-mode slot this rank cannot place (channel %llu of "
                        "%d, %llu bytes of at most %zu, slot %llu where %llu was due, %s where "
                        "%s was due)",
                        l->peer, (unsigned long long)ch, d->k.channels, (unsigned long long)bytes,
                        d->k.slot, (unsigned long long)s.seq,
                        (unsigned long long)(ch < (uint64_t)d->k.channels ? got[ch] + 1 : 0),
                        s.device ? "GPU memory" : "host memory",
                        d->px.gdr.recv ? "GPU memory" : "host memory");
    while (got[ch] - __atomic_load_n(&plink(d->px.recv, d, (int)ch)->head, __ATOMIC_ACQUIRE) >=
           (uint64_t)d->nslots) {
      if (proxy_stopping(d)) return NULL;
      proxy_idle(&idle);
    }
    uint64_t k = got[ch] % (uint64_t)d->nslots;
    if (d->px.gdr.recv) {
      /* Landed in GPU slot k ((seq - 1) % nslots); the running kernel may
       * read it once the writes are flushed to the GPU. */
      gpos[k] = pos;
      int e = bytes ? d->api->drv.flush_rdma_writes() : 0;
      if (e)
        return proxy_fail(d, "flushing GPUDirect RDMA writes from rank %d: %s", l->peer,
                          d->api->drv.error_string(e));
    } else {
      memcpy(d->px.recv + (size_t)ch * d->px.stride + PLINK_CTRL + k * d->k.slot, s.data, bytes);
    }
    got[ch]++;
    __atomic_store_n(&plink(d->px.recv, d, (int)ch)->tail, got[ch], __ATOMIC_RELEASE);
    pos++;
    if (!d->px.gdr.recv) l->ops->proxy_release(l, pos);
    idle = 0;
  }
  return NULL;
}

/* Starts the proxy on c->netring's links, which must join the same
 * neighbours as the ring's own. */
brg_status brg__dev_proxy_start(brg_comm *c, struct brg__dev_ring *d) {
  brg__ring *n = c->netring;
  if (!n || n->comm != c || n->next != c->ring.next || n->prev != c->ring.prev)
    return brg__comm_error(c, BRG_ERR_INTERNAL,
                           "rank %d: kernel mode's links between hosts do not join this ring's "
                           "neighbours (%d and %d)",
                           c->rank, c->ring.prev, c->ring.next);
  d->px.net = n;
  brg__errbuf err;
  brg_status s = BRG_SUCCESS;
  if (d->send_staged &&
      (s = brg__proxy_start(&d->px.tx, proxy_tx, d, "brg-kproxy-tx", &err)) == BRG_SUCCESS)
    d->px.tx_on = 1;
  if (s == BRG_SUCCESS && d->recv_staged &&
      (s = brg__proxy_start(&d->px.rx, proxy_rx, d, "brg-kproxy-rx", &err)) == BRG_SUCCESS)
    d->px.rx_on = 1;
  return s == BRG_SUCCESS ? s : brg__comm_error(c, s, "%s", err.msg);
}

/* Whether tx has carried every slot and call header the kernels posted to
 * the next host (the next rank's launch waits for the header to end). */
int brg__dev_proxy_flushed(struct brg__dev_ring *d) {
  for (int ch = 0; d->px.send && ch < d->k.channels; ch++) {
    if (__atomic_load_n(&plink(d->px.send, d, ch)->tail, __ATOMIC_ACQUIRE) >
        __atomic_load_n(&d->px.sent[ch], __ATOMIC_ACQUIRE))
      return 0;
    uint64_t k = __atomic_load_n(&plink(d->px.send, d, ch)->hdr_ack, __ATOMIC_ACQUIRE);
    brg__rk_call call;
    if (phdr_get(phdr(d->px.send, d, ch, k), k, &call)) return 0;
  }
  return 1;
}

void brg__device_proxy_stop(brg_comm *c) {
  if (c->dev) brg__dev_proxy_join(c->dev);
}

/* GPUDirect RDMA on kernel mode's staged links (one channel there): GPU
 * slots registered with the proxy's links, where the transport and the GPU
 * allow it; whether it then runs is decided with the neighbour. */
void brg__dev_proxy_gdr(brg_comm *c, struct brg__dev_ring *d, dev_blob *b) {
  if (!d->send_staged && !d->recv_staged) return;
  if (!brg__device_int(BRG__DEVICE_IB_GDR)) {
    snprintf(b->kgdr_why, sizeof b->kgdr_why, "off (BRIGADE_IB_GDR=0)");
    return;
  }
  int nslots = (d->send_staged ? &c->netring->send : &c->netring->recv)->fifo.nslots;
  if (d->k.channels != 1 || nslots != d->nslots) {
    snprintf(b->kgdr_why, sizeof b->kgdr_why, "%d channels, %d slots on the proxy's links",
             d->k.channels, nslots);
    return;
  }
  /* The proxy flushes what the network wrote before it raises a tail. */
  brg__dev_gdr_offer o = {&b->kgdr_send_ok, &b->kgdr_recv_ok, &b->kgdr_rkey, b->kgdr_why,
                          sizeof b->kgdr_why};
  brg__dev_gdr_offer_slots(d, d->send_staged ? &c->netring->send : NULL,
                           d->recv_staged ? &c->netring->recv : NULL, (size_t)d->nslots * d->k.slot,
                           &d->px.gdr.rbuf, &d->px.gdr.sbuf, &o);
  b->kgdr_rptr = (uint64_t)(uintptr_t)d->px.gdr.rbuf;
}

/* Kernel mode's staged links: GPUDirect runs on one when both of its ends
 * registered (brg__dev_proxy_gdr). */
void brg__dev_proxy_gdr_choose(brg_comm *c, struct brg__dev_ring *d, const dev_blob *mine,
                               const dev_blob *all) {
  d->px.gdr.send = d->send_staged && mine->kgdr_send_ok && all[c->ring.next].kgdr_recv_ok;
  d->px.gdr.recv = d->recv_staged && all[c->ring.prev].kgdr_send_ok && mine->kgdr_recv_ok;
  if (d->px.gdr.send)
    c->netring->send.ops->dev_remote(&c->netring->send, all[c->ring.next].kgdr_rptr,
                                     all[c->ring.next].kgdr_rkey, d->k.slot);
  if ((d->send_staged && !d->px.gdr.send) || (d->recv_staged && !d->px.gdr.recv))
    BRG__INFO("init", "device ring: kernel mode: GPUDirect RDMA not used on the staged links: %s",
              mine->kgdr_why[0]                   ? mine->kgdr_why
              : d->send_staged && !d->px.gdr.send ? all[c->ring.next].kgdr_why
                                                  : all[c->ring.prev].kgdr_why);
}
