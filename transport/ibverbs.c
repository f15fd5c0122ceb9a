/*
 * The ibverbs transport: reliable-connected queue pairs, RDMA write with
 * immediate, and a clear-to-send FIFO, written against verbs_api.h so the
 * same protocol runs on libibverbs or on the software backend.
 *
 * Each end keeps a FIFO of its own, registered for RDMA; one proxy thread per
 * end drives the queue pair:
 *
 *   sender                                          receiver
 *   engine -> send FIFO                             recv FIFO -> engine
 *             |   <-- RDMA write: CTS entry n -----  (slot n is free: head + nslots > n)
 *             |       into the sender's CTS FIFO
 *             +-- RDMA write: payload of n ------->  data slot n
 *             +-- RDMA write-with-imm(n): header ->  slot n's header, receive completes:
 *                 without its flag (signalled:       the proxy sets the header's flag
 *                 the completion gives send slot     and tail = n + 1, so the engine
 *                 n back: head)                      sees the slot only once all of it
 *                                                    has landed
 *
 * A clear-to-send entry names the receiver's slot (meta and data address,
 * rkey, size) and ends with seq = n + 1, so the sender sees the entry of the
 * current lap only when its last word has landed. The sender writes slot n
 * only after reading entry n, so it never overruns a slot the engine still
 * reads. Payload writes are unsignalled (the signalled write-with-immediate
 * behind them covers them); the receiver signals one clear-to-send write in
 * nslots so its send queue drains. With several queue pairs per link
 * (BRIGADE_IB_QPS_PER_LINK) slot n travels on queue pair n % nqps and the
 * clear-to-send entries on queue pair 0.
 *
 * Beside the queue pairs each link keeps the TCP connection it was set up on
 * (the control connection): it carries the sender's hello {secret, rank,
 * queue pairs, CTS FIFO address and rkey} and, at an orderly close, a
 * goodbye byte from either end; its end is how either side learns quickly
 * that the other left or died, which a real queue pair only reports after
 * its retries run out. A receiver that leaves is an error only while the
 * sender still owes it slices.
 *
 * A link set up as a byte stream (brg__conn_params.stream: point-to-point,
 * runtime/exec/p2p/p2p.c) runs the same proxies; its engine is try_send and
 * try_recv, which copy the stream into and out of the local FIFO's slots
 * (meta.bytes of each) and never wait. Its readiness descriptor
 * (ready_fd) is an eventfd that the proxies write after each publish (a
 * send slot given back, a receive slot landed) and when the link closes;
 * try_* leave it readable while there is more to do and empty it
 * otherwise (looking again after emptying it), so poll sees it level,
 * as a socket's. end lets the send proxy deliver what was sent, say
 * goodbye and stop; the receiver's try_recv then says the stream ended
 * once it has read everything.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "net.h"
#include "regcache.h"
#include "transport.h"
#include "verbs_api.h"

#define IB_INFO_MAGIC 0x42524749u  /* "BRGI" */
#define IB_HELLO_MAGIC 0x42524948u /* "BRIH" */
#define IB_BYE 0x42
#define IB_FAIL 0x46           /* then a length byte and that many bytes of why */
#define IB_CLOSE_GRACE_MS 1000 /* how long close() lets the send proxy flush */
#define IB_PROXY_SPIN 64       /* most idle polls before a proxy yields */
#define IB_MAX_QPS 12          /* queue pairs per link: what fits the connection-info blob */

static brg__cfg_entry ib_entries[BRG__IB_CFG_COUNT] = {
    [BRG__IB_CFG_BACKEND] = {"BRIGADE_IB_BACKEND", BRG__CFG_KIND_STRING, "auto", 0, 0,
                             "verbs backend: auto, verbs or soft (software, over sockets)"},
    [BRG__IB_CFG_HCA] = {"BRIGADE_IB_HCA", BRG__CFG_KIND_STRING, "", 0, 0,
                         "RDMA device and port, e.g. mlx5_0:1; empty: first active port"},
    [BRG__IB_CFG_GID_INDEX] = {"BRIGADE_IB_GID_INDEX", BRG__CFG_KIND_INT, "-1", -1, 255,
                               "GID index for RoCE; -1: automatic"},
    [BRG__IB_CFG_QPS_PER_LINK] = {"BRIGADE_IB_QPS_PER_LINK", BRG__CFG_KIND_INT, "1", 1, 16,
                                  "queue pairs per ring link"},
    [BRG__IB_CFG_TIMEOUT] = {"BRIGADE_IB_TIMEOUT", BRG__CFG_KIND_INT, "18", 1, 31,
                             "verbs QP local ack timeout exponent"},
    [BRG__IB_CFG_RETRY_CNT] = {"BRIGADE_IB_RETRY_CNT", BRG__CFG_KIND_INT, "7", 0, 7,
                               "verbs QP retry count"},
    [BRG__IB_CFG_ALLOW_LOCAL] = {"BRIGADE_IB_ALLOW_LOCAL", BRG__CFG_KIND_INT, "0", 0, 1,
                                 "1: ibverbs may also link ranks on one host (for tests; "
                                 "shm is faster there)"},
};

brg__cfg_section brg__ib_config = BRG__CFG_SECTION("ibverbs", ib_entries);

/* One clear-to-send entry, written by the receiver into the sender's memory. */
typedef struct ib_cts {
  uint64_t meta_addr;
  uint64_t data_addr;
  uint32_t rkey;
  uint32_t size;
  volatile uint64_t seq; /* slot number + 1; last, so it lands last */
} ib_cts;

/* What differs between the queue pairs of one end. */
typedef struct ib_qp_wire {
  uint32_t qpn, psn;
  uint16_t port;
  uint16_t pad;
} ib_qp_wire;

/* Receiver -> sender over the bootstrap: the receiver decides how many queue
 * pairs the link has. The port's address (LID, GID) is the same for all;
 * the soft backend's queue pairs listen on ctrl_addr. */
typedef struct ib_conn_info {
  uint32_t magic;
  uint16_t ctrl_port;
  uint16_t nqps;
  char backend[8];
  char ctrl_addr[64];
  uint16_t lid;
  uint8_t link_layer, mtu, gid_index, pad[3];
  uint8_t gid[16];
  ib_qp_wire qps[IB_MAX_QPS];
} ib_conn_info;
_Static_assert(sizeof(ib_conn_info) <= BRG__CONN_INFO_BYTES, "ib info fits the blob");

/* Sender -> receiver, first bytes on the control connection. */
typedef struct ib_hello {
  uint32_t magic;
  int32_t rank;
  uint8_t secret[BRG__SECRET_BYTES];
  uint64_t cts_addr;
  uint32_t cts_rkey;
  uint32_t nslots;
  uint32_t nqps;
  uint32_t pad;
  brg__vb_qp_info qps[IB_MAX_QPS];
} ib_hello;
_Static_assert(sizeof(ib_hello) <= BRG__NET_HELLO_MAX, "the ib hello fits a pending connection");

/* A device context (soft: the address its queue pairs listen on) with its
 * registration cache, shared by every link of the process that uses the same
 * backend and address, and closed with the last of them. */
typedef struct ib_dev {
  struct ib_dev *next;
  const brg__vb_ops *vb;
  char addr[64];
  brg__vb_ctx *ctx;
  brg__regcache *cache;
  int refs; /* under dev_lock */
} ib_dev;

typedef struct ib_conn {
  brg__net_link l; /* first: c->priv points at both */
  const brg__vb_ops *vb;
  ib_dev *dev;
  brg__vb_ctx *ctx; /* dev->ctx */
  int nqps;
  brg__vb_qp *qp[IB_MAX_QPS]; /* slot n travels on qp[n % nqps]; CTS on qp[0] */
  size_t fifo_bytes;
  const brg__vb_mr *fifo_mr; /* from dev->cache, as is cts_mr */
  ib_cts *cts;               /* sender: the CTS FIFO written by the peer; receiver: staging */
  size_t cts_bytes;          /* whole pages: its registration exposes nothing else */
  const brg__vb_mr *cts_mr;
  uint64_t peer_cts_addr; /* receiver: where the sender's CTS FIFO is */
  uint32_t peer_cts_rkey;
  int ctrl_fd;
  int spin;
  /* Where the proxy sleeps: the FIFO counter the engine publishes to it
   * (sender: tail, receiver: head), and a count of backend events (a
   * completion queued, a peer's write landed) that also wakes it there. */
  volatile uint64_t *sleep_word;
  volatile uint32_t *sleep_waiters;
  uint32_t ev_seq;
  char peer_why[256]; /* the peer's failure notice (proxy thread only) */
  /* A byte stream (brg__conn_params.stream). */
  int kick_fd;   /* eventfd: the proxies' word that something changed; -1 elsewhere */
  size_t off;    /* receiving end: bytes of slot `head` read */
  int ending;    /* send end: deliver what was sent, say goodbye, stop (end) */
  int peer_done; /* receive end: the closing was the sender's goodbye */
  /* GPUDirect RDMA (dev_register / dev_remote) */
  brg__vb_mr gdr_mr;   /* registered device memory; rkey 0: none */
  char *gdr_local;     /* sender: where device slots are read from */
  uint64_t gdr_remote; /* sender: the receiver's device slots */
  uint32_t gdr_rkey;
  size_t gdr_stride;
  int gdr_on; /* sender: device slots go GPU to GPU (set last, read by the proxy) */
} ib_conn;

/* ---- which backend -------------------------------------------------------- */

static pthread_once_t pick_once = PTHREAD_ONCE_INIT;
static const brg__vb_ops *picked;
static char pick_why[200];

static void backend_pick(void) {
  const char *want = brg__config_str(&brg__ib_config, BRG__IB_CFG_BACKEND);
  if (!want || !*want) want = "auto";
  if (!strcmp(want, "soft")) {
    picked = &brg__vb_soft;
  } else if (!strcmp(want, "verbs") || !strcmp(want, "auto")) {
    char why[160] = "";
    if (!brg__vb_real)
      snprintf(pick_why, sizeof pick_why,
               "no device (the real verbs backend was not built; BRIGADE_IB_BACKEND=soft runs the "
               "software backend)");
    else if (brg__vb_real->probe(why, sizeof why))
      picked = brg__vb_real;
    else
      snprintf(pick_why, sizeof pick_why, "%s", why);
  } else {
    snprintf(pick_why, sizeof pick_why, "BRIGADE_IB_BACKEND=%s is not auto, verbs or soft", want);
  }
  if (picked)
    BRG__INFO("ib", "ibverbs backend: %s%s", picked->name,
              picked == &brg__vb_soft ? " (software verbs over TCP sockets, not RDMA)" : "");
  else
    BRG__INFO("ib", "ibverbs unavailable: %s", pick_why);
}

static const brg__vb_ops *backend(void) {
  pthread_once(&pick_once, backend_pick);
  return picked;
}

static int ib_available(char *why, size_t why_bytes) {
  if (backend()) return 1;
  snprintf(why, why_bytes, "%s", pick_why);
  return 0;
}

static int ib_can_connect(const brg__peer_info *self, const brg__peer_info *peer) {
  if (!backend()) return 0;
  return self->host_hash != peer->host_hash ||
         brg__config_int(&brg__ib_config, BRG__IB_CFG_ALLOW_LOCAL) != 0;
}

/* ---- the shared device context and its registration cache ------------------- */

static pthread_mutex_t dev_lock = PTHREAD_MUTEX_INITIALIZER;
static ib_dev *devs;

static brg_status dev_get(const brg__vb_ops *vb, const char *addr, ib_dev **out, brg__errbuf *err) {
  if (!addr || strlen(addr) >= sizeof devs->addr)
    return brg__error(err, BRG_ERR_INVALID_ARGUMENT, "ib", "ibverbs: no usable local address");
  brg_status s = BRG_SUCCESS;
  pthread_mutex_lock(&dev_lock);
  ib_dev *d = devs;
  while (d && (d->vb != vb || strcmp(d->addr, addr) != 0)) d = d->next;
  if (!d) {
    d = calloc(1, sizeof *d);
    if (!d) {
      s = brg__error(err, BRG_ERR_NO_MEMORY, "ib", "ibverbs: out of memory");
      goto out;
    }
    d->vb = vb;
    snprintf(d->addr, sizeof d->addr, "%s", addr);
    if ((s = vb->ctx_open(&d->ctx, addr, err)) != BRG_SUCCESS) goto err_free;
    if ((s = brg__regcache_create(&d->cache, vb, d->ctx, 0, 0, err)) != BRG_SUCCESS) goto err_ctx;
    d->next = devs;
    devs = d;
  }
  d->refs++;
  *out = d;
  goto out;
err_ctx:
  vb->ctx_close(d->ctx);
err_free:
  free(d);
out:
  pthread_mutex_unlock(&dev_lock);
  return s;
}

static void dev_put(ib_dev *d) {
  pthread_mutex_lock(&dev_lock);
  if (--d->refs > 0) {
    pthread_mutex_unlock(&dev_lock);
    return;
  }
  ib_dev **pp = &devs;
  while (*pp != d) pp = &(*pp)->next;
  *pp = d->next;
  pthread_mutex_unlock(&dev_lock);
  brg__regcache_stats st;
  brg__regcache_stats_get(d->cache, &st);
  BRG__INFO("ib",
            "registration cache of the %s backend at %s: %llu hits, %llu misses, %llu evicted, "
            "%llu invalidated; %zu registration%s (%zu bytes) left to deregister",
            d->vb->name, d->addr, (unsigned long long)st.hits, (unsigned long long)st.misses,
            (unsigned long long)st.evictions, (unsigned long long)st.invalidations, st.entries,
            st.entries == 1 ? "" : "s", st.bytes);
  brg__regcache_destroy(d->cache);
  d->vb->ctx_close(d->ctx);
  free(d);
}

/* ---- small helpers ---------------------------------------------------------- */

/* A backend event: wake the proxy if it sleeps. */
static void on_event(void *arg) {
  ib_conn *t = arg;
  __atomic_fetch_add(&t->ev_seq, 1, __ATOMIC_SEQ_CST);
  if (__atomic_load_n(t->sleep_waiters, __ATOMIC_SEQ_CST))
    syscall(SYS_futex, (uint32_t *)t->sleep_word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* A byte stream's descriptor: something changed (a publish, the close). */
static void kick(ib_conn *t) {
  if (t->kick_fd >= 0 && eventfd_write(t->kick_fd, 1) != 0) {
    /* a saturated counter is readable all the same */
  }
}

/* Idle backoff of a proxy: spin, then yield, then sleep on the engine's
 * counter until the engine publishes, the backend reports an event (both
 * wake the futex), or a short timeout passes. `word_seen` and `ev_seen` are
 * what the proxy saw before it found nothing to do, so an event in between
 * stops it from sleeping. Where the backend reports no events (real verbs)
 * the timeout is the polling interval. */
static void idle(ib_conn *t, int *rounds, uint64_t word_seen, uint32_t ev_seen) {
  int r = (*rounds)++;
  if (r < t->spin) {
    brg__cpu_relax();
  } else if (r < t->spin + 32) {
    sched_yield();
  } else {
    struct timespec ts = {0, t->vb->qp_notify ? 1000000 : 50000};
    __atomic_fetch_add(t->sleep_waiters, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(t->sleep_word, __ATOMIC_SEQ_CST) == word_seen &&
        __atomic_load_n(&t->ev_seq, __ATOMIC_SEQ_CST) == ev_seen &&
        !__atomic_load_n(&t->l.stopping, __ATOMIC_SEQ_CST))
      syscall(SYS_futex, (uint32_t *)t->sleep_word, FUTEX_WAIT, (uint32_t)word_seen, &ts, NULL, 0);
    __atomic_fetch_sub(t->sleep_waiters, 1, __ATOMIC_SEQ_CST);
  }
}

/* The link breaks: the engine sees `closed` through its wait check, and
 * closed_why says what broke first and whom it was with, so a truncated
 * text loses the address, not the reason. */
static void link_fail(ib_conn *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void link_fail(ib_conn *t, const char *fmt, ...) {
  char why[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof why, fmt, ap);
  va_end(ap);
  if (!__atomic_load_n(&t->l.stopping, __ATOMIC_ACQUIRE) &&
      brg__fifo_mark_closed(&t->l.fifo, BRG_ERR_REMOTE, "%s (%s rank %d at %s, %s verbs backend)",
                            why, t->l.sender ? "to" : "from", t->l.peer, t->l.peer_addr,
                            t->vb->name)) {
    BRG__WARN("ib", "link %s rank %d (%s, %s backend) broke: %s", t->l.sender ? "to" : "from",
              t->l.peer, t->l.peer_addr, t->vb->name, why);
    kick(t);
    /* The peer's end sees only the consequence (its receives flushed, a
     * write that never completes): tell it the cause, best effort. */
    if (t->ctrl_fd >= 0) {
      unsigned char msg[2 + 255];
      size_t n = strlen(why);
      if (n > 255) n = 255;
      msg[0] = IB_FAIL;
      msg[1] = (unsigned char)n;
      memcpy(msg + 2, why, n);
      if (send(t->ctrl_fd, msg, 2 + n, MSG_NOSIGNAL | MSG_DONTWAIT) < 0) {
        /* a peer that is gone hears nothing */
      }
    }
  }
  brg__fifo_wake_all(&t->l.fifo);
}

/* What a failed completion says: the backend's words for its status
 * (ibv_wc_status_str, or the software backend's equivalent). */
static const char *wc_why(const brg__vb_wc *wc) {
  return wc->status_text && wc->status_text[0] ? wc->status_text : "unknown completion error";
}

/* Control connection: 1 goodbye, 2 the peer's failure notice (its text in
 * t->peer_why), -1 ended without either, 0 nothing yet. */
static int ctrl_poll(ib_conn *t, int wait_ms) {
  struct pollfd pfd = {.fd = t->ctrl_fd, .events = POLLIN};
  if (poll(&pfd, 1, wait_ms) <= 0) return 0;
  unsigned char b, len;
  ssize_t n = recv(t->ctrl_fd, &b, 1, MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return 0;
  if (n != 1) return -1;
  if (b == IB_BYE) return 1;
  if (b != IB_FAIL) return -1;
  /* The rest of a notice is on its way: 100 ms for each part. */
  if (brg__sock_recv_all(t->ctrl_fd, &len, 1, brg__now_ms() + 100) != BRG__IO_OK ||
      brg__sock_recv_all(t->ctrl_fd, t->peer_why, len, brg__now_ms() + 100) != BRG__IO_OK)
    len = (unsigned char)snprintf(t->peer_why, sizeof t->peer_why, "no reason received");
  t->peer_why[len] = 0;
  return 2;
}

/* A goodbye on the control connection, best effort: a peer that is gone
 * needs none. */
static void ctrl_bye(ib_conn *t) {
  char bye = IB_BYE;
  if (send(t->ctrl_fd, &bye, 1, MSG_NOSIGNAL | MSG_DONTWAIT) != 1) {
    /* nobody to tell */
  }
}

/* Whether to look at the control connection now: a system call, so not on
 * every round of a spin, but on every round once the proxy sleeps. */
static int ctrl_due(const ib_conn *t, int rounds) {
  return (rounds & 127) == 0 || rounds >= t->spin;
}

/* ---- the proxies -------------------------------------------------------------- */

static void *send_proxy(void *arg) {
  ib_conn *t = arg;
  brg__fifo *f = &t->l.fifo;
  brg__fifo_ctrl *ctrl = f->ctrl;
  uint64_t ns = (uint64_t)f->nslots, nq = (uint64_t)t->nqps, sent = 0, done = 0;
  uint8_t written[BRG__MAX_SLOTS] = {0}; /* completed, maybe ahead of `done` */
  int64_t grace_end = 0, gone_at = 0;
  int gone = 0; /* the receiver closed its end: 1 with a goodbye, 2 failed, -1 went away */
  int rounds = 0;
  brg__vb_wc wc[16];
  for (;;) {
    int progress = 0;
    uint32_t ev = __atomic_load_n(&t->ev_seq, __ATOMIC_SEQ_CST);
    for (int q = 0; q < t->nqps; q++) {
      int n = t->vb->poll(t->qp[q], wc, 16);
      if (n < 0) {
        link_fail(t, "polling the completion queue of queue pair %d failed", q);
        return NULL;
      }
      for (int i = 0; i < n; i++) {
        if (wc[i].status != BRG__VB_WC_SUCCESS) {
          /* Payload writes are unsignalled and carry no slot; a failure
           * still completes them. */
          if (wc[i].wr_id == UINT64_MAX)
            link_fail(t, "RDMA write of a payload failed: %s", wc_why(&wc[i]));
          else
            link_fail(t, "RDMA write of slot %llu failed: %s", (unsigned long long)wc[i].wr_id,
                      wc_why(&wc[i]));
          return NULL;
        }
        if (wc[i].wr_id < done || wc[i].wr_id >= sent) {
          link_fail(t, "completion for slot %llu, expected one in [%llu, %llu)",
                    (unsigned long long)wc[i].wr_id, (unsigned long long)done,
                    (unsigned long long)sent);
          return NULL;
        }
        written[wc[i].wr_id % ns] = 1;
      }
    }
    /* Queue pairs complete independently; slots go back to the engine in order. */
    if (done < sent && written[done % ns]) {
      while (done < sent && written[done % ns]) written[done++ % ns] = 0;
      brg__publish(&ctrl->head, &ctrl->head_waiters, done);
      kick(t);
      progress = 1;
    }
    uint64_t tail = __atomic_load_n(&ctrl->tail, __ATOMIC_ACQUIRE);
    while (sent < tail) {
      const ib_cts *e = &t->cts[sent % ns];
      if (__atomic_load_n(&e->seq, __ATOMIC_ACQUIRE) != sent + 1) break;
      const brg__slot_meta *m = brg__fifo_meta(f, sent);
      if (m->bytes > f->slot_bytes || m->bytes > e->size) {
        link_fail(t, "slot of %u bytes, the peer's slots hold %u", m->bytes, e->size);
        return NULL;
      }
      brg_status s = BRG_SUCCESS;
      brg__vb_qp *qp = t->qp[sent % nq];
      if (m->bytes && m->device && __atomic_load_n(&t->gdr_on, __ATOMIC_ACQUIRE)) {
        /* A device slot: GPU memory to GPU memory (GPUDirect RDMA), in the
         * GPU slot of its position, or a proxy slot's of its number
         * (transport.h: calls go between a channel's data slots). */
        uint64_t k = m->proxy ? (m->seq - 1) % ns : sent % ns;
        size_t at = (size_t)k * t->gdr_stride;
        s = t->vb->post_write(qp, UINT64_MAX, &t->gdr_mr, t->gdr_local + at, m->bytes,
                              t->gdr_remote + at, t->gdr_rkey, 0, 0, 0);
      } else if (m->bytes) {
        s = t->vb->post_write(qp, UINT64_MAX, t->fifo_mr, brg__fifo_slot(f, sent), m->bytes,
                              e->data_addr, e->rkey, 0, 0, 0);
      }
      if (s == BRG_SUCCESS)
        s = t->vb->post_write(qp, sent, t->fifo_mr, m, offsetof(brg__slot_meta, flag), e->meta_addr,
                              e->rkey, 1, (uint32_t)sent, 1);
      if (s != BRG_SUCCESS) {
        link_fail(t, "posting the write of slot %llu: %s", (unsigned long long)sent,
                  brg_status_string(s));
        return NULL;
      }
      sent++;
      progress = 1;
    }
    /* A receiver that leaves is only an error while this end still owes it
     * slices: one that got everything may destroy its communicator before
     * the last completions reach this end. Completions still on their way
     * get a moment; a slice it never cleared to send does not. */
    if (!gone && ctrl_due(t, rounds) && (gone = ctrl_poll(t, 0)) != 0) gone_at = brg__now_ms();
    if (gone && __atomic_load_n(&ctrl->tail, __ATOMIC_ACQUIRE) > done &&
        (sent < __atomic_load_n(&ctrl->tail, __ATOMIC_ACQUIRE) || brg__now_ms() - gone_at > 500)) {
      if (gone == 2)
        link_fail(t, "rank %d broke its end with slot %llu still to deliver: %s", t->l.peer,
                  (unsigned long long)done, t->peer_why);
      else
        link_fail(t, "the peer %s with slot %llu still to deliver",
                  gone > 0 ? "closed its link" : "went away (control connection ended)",
                  (unsigned long long)done);
      return NULL;
    }
    int stopping = __atomic_load_n(&t->l.stopping, __ATOMIC_ACQUIRE);
    if (stopping || __atomic_load_n(&t->ending, __ATOMIC_ACQUIRE)) {
      if (gone) return NULL;
      /* A stream that ended waits for its receiver as long as it takes;
       * a close has its grace. */
      if (stopping && !grace_end) grace_end = brg__now_ms() + IB_CLOSE_GRACE_MS;
      if (done == __atomic_load_n(&ctrl->tail, __ATOMIC_ACQUIRE) && done == sent) {
        ctrl_bye(t);
        return NULL;
      }
      if (grace_end && brg__now_ms() > grace_end) return NULL;
    } else if (__atomic_load_n(&ctrl->closed, __ATOMIC_ACQUIRE)) {
      return NULL;
    }
    if (progress)
      rounds = 0;
    else
      idle(t, &rounds, tail, ev);
  }
}

static brg_status cts_post(ib_conn *t, uint64_t pos) {
  brg__fifo *f = &t->l.fifo;
  uint64_t ns = (uint64_t)f->nslots;
  ib_cts *e = &t->cts[pos % ns];
  e->meta_addr = (uint64_t)(uintptr_t)brg__fifo_meta(f, pos);
  e->data_addr = (uint64_t)(uintptr_t)brg__fifo_slot(f, pos);
  e->rkey = t->fifo_mr->rkey;
  e->size = (uint32_t)f->slot_bytes;
  e->seq = pos + 1;
  return t->vb->post_write(t->qp[0], UINT64_MAX, t->cts_mr, e, sizeof *e,
                           t->peer_cts_addr + (pos % ns) * sizeof *e, t->peer_cts_rkey, 0, 0,
                           pos % ns == ns - 1);
}

/* What the receive proxy knows: queue pair q carries slots q, q + nqps, ...
 * in order, and next[q] is the next one it must deliver; every slot below
 * tail = min(next[]) has been handed to the engine. */
typedef struct recv_state {
  uint64_t tail;
  uint64_t next[IB_MAX_QPS];
} recv_state;

/* Takes the completions of queue pair q. A completion makes its slot
 * visible to the engine: the sender writes the header without its `flag`,
 * and the flag is set here, so the engine never reads a slot before the
 * completion says that all of it has landed. 1 when something happened, 0
 * when nothing, 2 when a failed completion follows the peer's goodbye, -1
 * when the link failed (marked, unless `quiet`). */
static int recv_take(ib_conn *t, int q, recv_state *rs, int quiet) {
  brg__fifo *f = &t->l.fifo;
  brg__vb_wc wc[16];
  int n = t->vb->poll(t->qp[q], wc, 16);
  if (n < 0) {
    if (!quiet) link_fail(t, "polling the completion queue of queue pair %d failed", q);
    return -1;
  }
  for (int i = 0; i < n; i++) {
    if (wc[i].status != BRG__VB_WC_SUCCESS) {
      if (quiet) return -1;
      /* An orderly close tears the queue pairs down right after its
       * goodbye; a sender whose write failed says why. */
      int c = ctrl_poll(t, 50);
      if (c == 1) return 2;
      /* A failed completion's opcode is undefined; the wr_id tells (CTS
       * writes carry UINT64_MAX, receives their slot). */
      const char *what = wc[i].wr_id == UINT64_MAX ? "clear-to-send write" : "receive";
      if (c == 2)
        link_fail(t, "%s failed: %s; rank %d reported: %s", what, wc_why(&wc[i]), t->l.peer,
                  t->peer_why);
      else
        link_fail(t, "%s failed: %s", what, wc_why(&wc[i]));
      return -1;
    }
    if (wc[i].opcode != BRG__VB_OP_RECV_IMM) continue;
    uint64_t slot = rs->next[q];
    if (wc[i].imm != (uint32_t)slot) {
      if (!quiet)
        link_fail(t, "immediate %u on queue pair %d, expected slot %llu", wc[i].imm, q,
                  (unsigned long long)slot);
      return -1;
    }
    rs->next[q] += (uint64_t)t->nqps;
    brg__fifo_slot_complete(f, slot);
    if (t->vb->post_recv(t->qp[q], slot) != BRG_SUCCESS) {
      if (!quiet) link_fail(t, "posting a receive failed");
      return -1;
    }
  }
  uint64_t tail = rs->next[0];
  for (int k = 1; k < t->nqps; k++)
    if (rs->next[k] < tail) tail = rs->next[k];
  if (tail == rs->tail) return n > 0;
  rs->tail = tail;
  brg__publish(&f->ctrl->tail, &f->ctrl->tail_waiters, tail);
  kick(t);
  return 1;
}

static void *recv_proxy(void *arg) {
  ib_conn *t = arg;
  brg__fifo *f = &t->l.fifo;
  brg__fifo_ctrl *ctrl = f->ctrl;
  uint64_t ns = (uint64_t)f->nslots, cts = 0;
  recv_state rs = {0};
  for (int q = 0; q < t->nqps; q++) rs.next[q] = (uint64_t)q;
  int rounds = 0, bye = 0;
  while (!__atomic_load_n(&t->l.stopping, __ATOMIC_ACQUIRE)) {
    int progress = 0;
    uint32_t ev = __atomic_load_n(&t->ev_seq, __ATOMIC_SEQ_CST);
    for (int q = 0; q < t->nqps && !bye; q++) {
      int r = recv_take(t, q, &rs, 0);
      if (r < 0) return NULL;
      if (r == 2) bye = 1;
      if (r == 1) progress = 1;
    }
    int c = bye ? 1 : ctrl_due(t, rounds) ? ctrl_poll(t, 0) : 0;
    if (c != 0) {
      /* The sender left. Whatever it delivered was acknowledged before it
       * went, so take the completions still queued on every queue pair
       * (they finish independently), then stop. */
      int64_t until = brg__now_ms() + 20;
      while (brg__now_ms() < until) {
        int got = 0;
        for (int q = 0; q < t->nqps; q++) got |= recv_take(t, q, &rs, 1) > 0;
        if (!got) brg__sleep_ms(1);
      }
      if (c < 0) {
        link_fail(t, "the peer went away (control connection ended)");
        return NULL;
      }
      if (c == 2) {
        link_fail(t, "rank %d broke its end: %s", t->l.peer, t->peer_why);
        return NULL;
      }
      bye = 1;
      break;
    }
    uint64_t head = __atomic_load_n(&ctrl->head, __ATOMIC_ACQUIRE);
    for (; cts < head + ns; cts++) {
      if (cts_post(t, cts) != BRG_SUCCESS) {
        link_fail(t, "posting a clear-to-send write failed");
        return NULL;
      }
      progress = 1;
    }
    if (__atomic_load_n(&ctrl->closed, __ATOMIC_ACQUIRE)) return NULL;
    if (progress)
      rounds = 0;
    else
      idle(t, &rounds, head, ev);
  }
  if (bye && !__atomic_load_n(&t->l.stopping, __ATOMIC_ACQUIRE)) {
    __atomic_store_n(&t->peer_done, 1, __ATOMIC_RELEASE);
    brg__net_peer_left(&t->l, "ib");
    kick(t);
  }
  return NULL;
}

/* ---- setup -------------------------------------------------------------------- */

/* The local FIFO, the CTS array, the context and `nqps` queue pairs (their
 * connection info in qp_info[]); once the FIFO is there, close() cleans up
 * whatever a failed setup left. */
static brg_status conn_open(brg__conn *c, const brg__conn_params *p, int sender, int nqps,
                            brg__vb_qp_info *qp_info, brg__errbuf *err) {
  const brg__vb_ops *vb = backend();
  if (!vb) return brg__error(err, BRG_ERR_UNAVAILABLE, "ib", "ibverbs unavailable: %s", pick_why);
  brg_status s = brg__net_open(c, p, sender, sizeof(ib_conn), "ibverbs", "ib", err);
  if (s != BRG_SUCCESS) return s;
  ib_conn *t = c->priv;
  t->vb = vb;
  t->ctrl_fd = -1;
  t->kick_fd = -1;
  /* Level from the start: an empty send end has room. */
  if (p->stream && (t->kick_fd = eventfd(sender ? 1 : 0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0)
    return brg__error(err, BRG_ERR_SYSTEM, "ib", "ibverbs: eventfd: %s", strerror(errno));
  /* Where the backend wakes the proxy (soft), the proxy spins less than the
   * engine: each round polls the completion queues, and a spinning proxy
   * takes a core from the ranks it serves. Real verbs report nothing, so
   * there the proxy polls as long as the engine spins. */
  t->spin = p->waiter ? p->waiter->spin : 1000;
  if (vb->qp_notify && t->spin > IB_PROXY_SPIN) t->spin = IB_PROXY_SPIN;
  t->fifo_bytes = brg__fifo_region_bytes(p->nslots, p->slot_bytes);
  /* The cache registers whole pages, so the CTS array gets pages of its own
   * (as the FIFO has): a peer's key to it reaches nothing else. */
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  t->cts_bytes = ((size_t)p->nslots * sizeof *t->cts + page - 1) & ~(page - 1);
  void *cts = mmap(NULL, t->cts_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (cts == MAP_FAILED)
    return brg__error(err, BRG_ERR_NO_MEMORY, "ib", "ibverbs: mmap of the CTS FIFO: %s",
                      strerror(errno));
  t->cts = cts;
  if ((s = dev_get(vb, p->self_info->addr, &t->dev, err)) != BRG_SUCCESS) return s;
  t->ctx = t->dev->ctx;
  if ((s = brg__regcache_get(t->dev->cache, t->l.fifo.ctrl, t->fifo_bytes, &t->fifo_mr, err)) !=
      BRG_SUCCESS)
    return s;
  if ((s = brg__regcache_get(t->dev->cache, t->cts, t->cts_bytes, &t->cts_mr, err)) != BRG_SUCCESS)
    return s;
  t->sleep_word = sender ? &t->l.fifo.ctrl->tail : &t->l.fifo.ctrl->head;
  t->sleep_waiters = sender ? &t->l.fifo.ctrl->tail_waiters : &t->l.fifo.ctrl->head_waiters;
  for (; t->nqps < nqps; t->nqps++) {
    /* Room for a payload write and a write-with-immediate per slot. */
    s = vb->qp_create(t->ctx, 2 * p->nslots + 4, p->nslots, &t->qp[t->nqps], &qp_info[t->nqps],
                      err);
    if (s != BRG_SUCCESS) return s;
    if (vb->qp_notify) vb->qp_notify(t->qp[t->nqps], on_event, t);
  }
  return BRG_SUCCESS;
}

static brg_status ib_recv_setup(brg__conn *c, const brg__conn_params *p, void *info,
                                brg__errbuf *err) {
  ib_conn_info ci = {.magic = htonl(IB_INFO_MAGIC)};
  int nqps = (int)brg__config_int(&brg__ib_config, BRG__IB_CFG_QPS_PER_LINK);
  if (nqps < 1) nqps = 1;
  if (nqps > IB_MAX_QPS) {
    BRG__WARN("ib", "BRIGADE_IB_QPS_PER_LINK=%d: using %d queue pairs, the most a link has", nqps,
              IB_MAX_QPS);
    nqps = IB_MAX_QPS;
  }
  brg__vb_qp_info qi[IB_MAX_QPS];
  brg_status s = conn_open(c, p, 0, nqps, qi, err);
  if (s != BRG_SUCCESS) return s;
  ib_conn *t = c->priv;
  ci.nqps = htons((uint16_t)nqps);
  ci.lid = qi[0].lid;
  ci.link_layer = qi[0].link_layer;
  ci.mtu = qi[0].mtu;
  ci.gid_index = qi[0].gid_index;
  memcpy(ci.gid, qi[0].gid, sizeof ci.gid);
  for (int q = 0; q < nqps; q++)
    ci.qps[q] = (ib_qp_wire){.qpn = qi[q].qpn, .psn = qi[q].psn, .port = qi[q].port};

  const char *addr = p->self_info->addr;
  if (!addr[0] || strlen(addr) >= sizeof ci.ctrl_addr)
    return brg__error(err, BRG_ERR_INVALID_ARGUMENT, "ib",
                      "ibverbs link from rank %d: this rank has no usable address", p->peer);
  uint16_t port;
  s = brg__sock_listen(addr, 0, BRG__NET_BACKLOG, "ib", "ibverbs control listener", &t->l.listen_fd,
                       &port, err);
  if (s != BRG_SUCCESS) return s;
  ci.ctrl_port = htons(port);
  snprintf(ci.backend, sizeof ci.backend, "%s", t->vb->name);
  snprintf(ci.ctrl_addr, sizeof ci.ctrl_addr, "%s", addr);
  memset(info, 0, BRG__CONN_INFO_BYTES);
  memcpy(info, &ci, sizeof ci);
  return BRG_SUCCESS;
}

static brg_status ib_send_connect(brg__conn *c, const brg__conn_params *p, const void *info,
                                  brg__errbuf *err) {
  ib_conn_info ci;
  memcpy(&ci, info, sizeof ci);
  int nqps = ntohs(ci.nqps);
  if (ntohl(ci.magic) != IB_INFO_MAGIC || !memchr(ci.ctrl_addr, 0, sizeof ci.ctrl_addr) ||
      !memchr(ci.backend, 0, sizeof ci.backend) || nqps < 1 || nqps > IB_MAX_QPS)
    return brg__error(err, BRG_ERR_INVALID_ARGUMENT, "ib",
                      "bad ibverbs connection info from rank %d", p->peer);
  ib_hello h = {.magic = htonl(IB_HELLO_MAGIC),
                .rank = (int32_t)htonl((uint32_t)p->rank),
                .nqps = (uint32_t)nqps};
  brg_status s = conn_open(c, p, 1, nqps, h.qps, err);
  if (s != BRG_SUCCESS) return s;
  ib_conn *t = c->priv;
  if (strcmp(ci.backend, t->vb->name) != 0)
    return brg__error(err, BRG_ERR_MISMATCH, "ib",
                      "rank %d uses the %s verbs backend, this rank %s (set BRIGADE_IB_BACKEND "
                      "alike on every rank)",
                      p->peer, ci.backend, t->vb->name);
  brg__sock_hostport(t->l.peer_addr, sizeof t->l.peer_addr, ci.ctrl_addr, ntohs(ci.ctrl_port));
  int64_t deadline = brg__deadline_ms(p->timeout_ms);
  brg__sock_dialer d = {.retry_ms = 10, .retry_max_ms = 10};
  s = brg__net_dial(p, "ib", ci.ctrl_addr, ntohs(ci.ctrl_port), t->l.peer_addr, deadline, &d,
                    &t->ctrl_fd, err);
  if (s != BRG_SUCCESS) return s;
  memcpy(h.secret, p->secret, BRG__SECRET_BYTES);
  h.cts_addr = (uint64_t)(uintptr_t)t->cts;
  h.cts_rkey = t->cts_mr->rkey;
  h.nslots = (uint32_t)p->nslots;
  s = brg__net_hello_send(p, "ib", t->ctrl_fd, &h, sizeof h, t->l.peer_addr, deadline, err);
  if (s != BRG_SUCCESS) return s;
  for (int q = 0; q < nqps; q++) {
    brg__vb_qp_info r = {.qpn = ci.qps[q].qpn,
                         .psn = ci.qps[q].psn,
                         .lid = ci.lid,
                         .port = ci.qps[q].port,
                         .link_layer = ci.link_layer,
                         .mtu = ci.mtu,
                         .gid_index = ci.gid_index};
    memcpy(r.gid, ci.gid, sizeof r.gid);
    snprintf(r.addr, sizeof r.addr, "%s", ci.ctrl_addr);
    if ((s = t->vb->qp_connect(t->qp[q], &r, 1, p->timeout_ms, err)) != BRG_SUCCESS) return s;
  }
  BRG__INFO("ib", "link to rank %d at %s over the %s verbs backend, %d queue pair%s", p->peer,
            t->l.peer_addr, t->vb->name, nqps, nqps > 1 ? "s" : "");
  return brg__net_start(&t->l, send_proxy, recv_proxy, t, "ib", err);
}

/* Where hello_take puts what it kept. */
typedef struct ib_door {
  ib_conn *t;
  ib_hello *h;
} ib_door;

const size_t brg__ib_hello_bytes = sizeof(ib_hello);

int brg__ib_hello_check(const brg__conn_params *p, const char *from, const void *hello, int nslots,
                        int nqps) {
  ib_hello h;
  memcpy(&h, hello, sizeof h);
  if (!brg__net_hello_ok(p, "ib", from, "ibverbs", ntohl(h.magic) == IB_HELLO_MAGIC, h.secret,
                         (int32_t)ntohl((uint32_t)h.rank)))
    return 0;
  if (h.nslots != (uint32_t)nslots || h.nqps != (uint32_t)nqps) {
    BRG__WARN("ib", "refused connection from %s: %u slots and %u queue pairs, expected %d and %d",
              from, h.nslots, h.nqps, nslots, nqps);
    return 0;
  }
  return 1;
}

/* Checks a complete hello; on success the socket becomes the control
 * connection. */
static int hello_take(void *arg, const brg__conn_params *p, int fd, const void *hello,
                      const char *from) {
  ib_door *d = arg;
  if (!brg__ib_hello_check(p, from, hello, d->t->l.fifo.nslots, d->t->nqps)) return 0;
  memcpy(d->h, hello, sizeof *d->h);
  d->t->ctrl_fd = fd;
  return 1;
}

static brg_status ib_recv_connect(brg__conn *c, const brg__conn_params *p, brg__errbuf *err) {
  ib_conn *t = c->priv;
  if (!t || t->l.listen_fd < 0)
    return brg__error(err, BRG_ERR_INTERNAL, "ib", "ibverbs recv_connect without recv_setup");
  int64_t deadline = brg__deadline_ms(p->timeout_ms);
  ib_hello h;
  ib_door door = {.t = t, .h = &h};
  brg_status s = brg__net_accept(&t->l, p, "ib", sizeof h, 1, hello_take, &door, deadline, err);
  if (s != BRG_SUCCESS) return s;
  t->peer_cts_addr = h.cts_addr;
  t->peer_cts_rkey = h.cts_rkey;
  for (int q = 0; q < t->nqps; q++) {
    h.qps[q].addr[sizeof h.qps[q].addr - 1] = 0;
    /* What is left of the deadline: none left is the shortest wait, and no
     * deadline (-1) is no limit (0) for qp_connect. */
    int left = brg__ms_left(deadline);
    left = left < 0 ? 0 : left > 0 ? left : 1;
    if ((s = t->vb->qp_connect(t->qp[q], &h.qps[q], 0, left, err)) != BRG_SUCCESS) return s;
    for (int i = 0; i < t->l.fifo.nslots; i++)
      if ((s = t->vb->post_recv(t->qp[q], (uint64_t)i)) != BRG_SUCCESS)
        return brg__error(err, s, "ib", "posting receives for rank %d", p->peer);
  }
  BRG__INFO("ib", "link from rank %d at %s over the %s verbs backend, %d queue pair%s", p->peer,
            t->l.peer_addr, t->vb->name, t->nqps, t->nqps > 1 ? "s" : "");
  return brg__net_start(&t->l, send_proxy, recv_proxy, t, "ib", err);
}

static void ib_close(brg__conn *c) {
  ib_conn *t = c->priv;
  if (!t) return;
  brg__net_stop(&t->l, -1); /* the send proxy has its own grace to flush */
  /* So the sender can tell a finished receiver from a dead one. */
  if (!t->l.sender && t->ctrl_fd >= 0) ctrl_bye(t);
  for (int q = 0; q < IB_MAX_QPS; q++) /* a failed qp_create may leave one past nqps */
    if (t->qp[q]) t->vb->qp_destroy(t->qp[q]);
  if (t->dev) {
    /* The memory goes back to the system next: no registration may outlive it. */
    if (t->gdr_mr.rkey) t->vb->mr_dereg(t->ctx, &t->gdr_mr);
    brg__regcache_put(t->dev->cache, t->cts_mr);
    brg__regcache_put(t->dev->cache, t->fifo_mr);
    if (t->cts) brg__regcache_invalidate(t->dev->cache, t->cts, t->cts_bytes);
    if (t->l.fifo.ctrl) brg__regcache_invalidate(t->dev->cache, t->l.fifo.ctrl, t->fifo_bytes);
    dev_put(t->dev);
  }
  brg__sock_close(&t->ctrl_fd);
  brg__sock_close(&t->kick_fd);
  if (t->cts) munmap(t->cts, t->cts_bytes);
  brg__net_close(c);
}

static brg_status ib_dev_register(brg__conn *c, void *p, size_t bytes, int fd, uint64_t offset,
                                  uint32_t *rkey, brg__errbuf *err) {
  ib_conn *t = c->priv;
  if (!t) return brg__error(err, BRG_ERR_INVALID_USAGE, "ib", "link is not set up");
  if (t->gdr_mr.rkey) {
    __atomic_store_n(&t->gdr_on, 0, __ATOMIC_RELEASE);
    t->vb->mr_dereg(t->ctx, &t->gdr_mr);
    t->gdr_local = NULL;
  }
  if (!p) return BRG_SUCCESS;
  if (!t->vb->mr_reg_dmabuf)
    return brg__error(err, BRG_ERR_UNAVAILABLE, "ib", "the %s backend cannot register dmabufs",
                      t->vb->name);
  brg_status s = t->vb->mr_reg_dmabuf(t->ctx, fd, offset, bytes, p, &t->gdr_mr, err);
  if (s != BRG_SUCCESS) return s;
  t->gdr_local = p;
  if (rkey) *rkey = t->gdr_mr.rkey;
  return BRG_SUCCESS;
}

static void ib_dev_remote(brg__conn *c, uint64_t base, uint32_t rkey, size_t stride) {
  ib_conn *t = c->priv;
  if (!t || !t->gdr_mr.rkey) return;
  t->gdr_remote = base;
  t->gdr_rkey = rkey;
  t->gdr_stride = stride;
  __atomic_store_n(&t->gdr_on, 1, __ATOMIC_RELEASE);
}

/* ---- the byte stream (brg__conn_params.stream) ---------------------------------- */

/* Whether this end's try_* has something to do now: room (sending), bytes
 * (receiving), or the link closed. */
static int ib_stream_ready(ib_conn *t, int sending) {
  brg__fifo_ctrl *k = t->l.fifo.ctrl;
  if (__atomic_load_n(&k->closed, __ATOMIC_ACQUIRE)) return 1;
  uint64_t head = __atomic_load_n(&k->head, __ATOMIC_ACQUIRE);
  uint64_t tail = __atomic_load_n(&k->tail, __ATOMIC_ACQUIRE);
  return sending ? tail < head + (uint64_t)t->l.fifo.nslots : head < tail;
}

/* Leaves the descriptor readable while there is something to do, empty
 * otherwise: emptied first, then looked again, so a proxy's publish in
 * between (published, then written) is not lost. */
static void ib_stream_level(ib_conn *t, int sending) {
  eventfd_t v;
  if (ib_stream_ready(t, sending)) {
    kick(t);
    return;
  }
  if (eventfd_read(t->kick_fd, &v) != 0) {
    /* already empty */
  }
  if (ib_stream_ready(t, sending)) kick(t);
}

/* What a closed link says: the sender's goodbye ends the stream; anything
 * else broke it. */
static ssize_t ib_stream_closed(ib_conn *t) {
  if (__atomic_load_n(&t->peer_done, __ATOMIC_ACQUIRE)) return BRG__STREAM_ENDED;
  errno = ECONNRESET;
  return BRG__STREAM_BROKEN;
}

static ssize_t ib_try_send(brg__conn *c, const void *buf, size_t bytes, int *ring) {
  (void)ring; /* the descriptor is the doorbell */
  ib_conn *t = c->priv;
  brg__fifo *f = &t->l.fifo;
  if (__atomic_load_n(&f->ctrl->closed, __ATOMIC_ACQUIRE)) {
    errno = ECONNRESET;
    return BRG__STREAM_BROKEN;
  }
  uint64_t tail = f->ctrl->tail;
  size_t took = brg__fifo_stream_fill(f, buf, bytes, &tail);
  if (took) brg__publish(&f->ctrl->tail, &f->ctrl->tail_waiters, tail); /* wakes the proxy */
  ib_stream_level(t, 1);
  return (ssize_t)took;
}

static ssize_t ib_try_recv(brg__conn *c, void *buf, size_t bytes, int *ring) {
  (void)ring;
  ib_conn *t = c->priv;
  brg__fifo *f = &t->l.fifo;
  /* closed is read before tail: the proxy publishes every slot it landed
   * before it closes the link. */
  int closed = __atomic_load_n(&f->ctrl->closed, __ATOMIC_ACQUIRE) != 0;
  uint64_t head0 = f->ctrl->head, head = head0;
  size_t got = brg__fifo_stream_take(f, buf, bytes, &t->off, &head);
  if (head != head0) brg__publish(&f->ctrl->head, &f->ctrl->head_waiters, head); /* credits */
  if (!got && bytes && closed) return ib_stream_closed(t);
  ib_stream_level(t, 0);
  return (ssize_t)got;
}

static int ib_ready(brg__conn *c, int sending, int arm) {
  (void)arm; /* the caller polls ready_fd */
  return ib_stream_ready(c->priv, sending);
}

static int ib_ready_fd(brg__conn *c, short *events) {
  ib_conn *t = c->priv;
  *events = POLLIN; /* an eventfd is always writable: its counter says */
  return t->kick_fd;
}

static void ib_end(brg__conn *c) {
  ib_conn *t = c->priv;
  __atomic_store_n(&t->ending, 1, __ATOMIC_RELEASE);
  /* The proxy may sleep on tail: a publish of the same value wakes it. */
  brg__publish(&t->l.fifo.ctrl->tail, &t->l.fifo.ctrl->tail_waiters, t->l.fifo.ctrl->tail);
}

const brg__transport_ops brg__transport_ibverbs = {
    .name = "ibverbs",
    .carries = BRG__CARRIES_HOST | BRG__CARRIES_DEVICE,
    .listens = 1,
    .config = &brg__ib_config,
    .can_connect = ib_can_connect,
    .available = ib_available,
    .recv_setup = ib_recv_setup,
    .send_connect = ib_send_connect,
    .recv_connect = ib_recv_connect,
    .close = ib_close,
    .proxy_post = brg__fifo_proxy_post, /* the send proxy carries what the FIFO holds */
    .proxy_sent = brg__fifo_proxy_sent,
    .proxy_poll = brg__fifo_proxy_poll,
    .proxy_release = brg__fifo_proxy_release,
    .try_send = ib_try_send,
    .try_recv = ib_try_recv,
    .ready = ib_ready,
    .ready_fd = ib_ready_fd,
    .end = ib_end,
    .dev_register = ib_dev_register,
    .dev_remote = ib_dev_remote,
};
