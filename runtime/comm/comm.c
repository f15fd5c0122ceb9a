/*
 * The communicator: the unique id, creation (bootstrap, topology, a
 * transport per ring link, the progress thread), accessors, abort and
 * destruction.
 */
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "device.h"
#include "exec.h"
#include "hash.h"
#include "internal.h"
#include "model.h"
#include "kernels.h"
#include "linkset.h"
#include "ring_link.h"
#include "settings.h"
#include "trace.h"

/* The version of the library that runs, which may differ from the header
 * a program was built against. */
brg_status brg_get_version(int *major, int *minor, int *patch) {
  if (!major || !minor || !patch)
    return brg__fail_no_comm(BRG_ERR_INVALID_ARGUMENT,
                             "brg_get_version: major, minor and patch must not be NULL");
  *major = BRG_VERSION_MAJOR;
  *minor = BRG_VERSION_MINOR;
  *patch = BRG_VERSION_PATCH;
  return BRG_SUCCESS;
}

brg_status brg_get_unique_id(brg_unique_id *id) {
  if (!id) return brg__fail_no_comm(BRG_ERR_INVALID_ARGUMENT, "brg_get_unique_id: id is NULL");
  brg__errbuf err = {0};
  brg_status s = brg__settings_load(&err);
  if (s != BRG_SUCCESS) return brg__fail_no_comm_err(s, &err, NULL);
  brg__log_init();
  char addr[64];
  if ((s = brg__boot_local_addr(addr, sizeof addr, &err)) != BRG_SUCCESS)
    return brg__fail_no_comm_err(s, &err, NULL);
  brg__boot_id bid;
  s = brg__boot_root_start(addr, 0, NULL, (int)brg__core_int(BRG__CORE_TIMEOUT_MS), &bid, &err);
  if (s != BRG_SUCCESS) return brg__fail_no_comm_err(s, &err, NULL);
  memset(id, 0, sizeof *id);
  memcpy(id->internal, &bid, sizeof bid);
  return BRG_SUCCESS;
}

static brg_status exchange(brg_comm *c, int send_dir, const void *msg, uint32_t len, int recv_dir,
                           uint32_t want, void *out, uint32_t max, uint32_t *got,
                           brg__errbuf *err) {
  brg_status s = brg__bootstrap_send(c->bs, send_dir, want, msg, len, err);
  if (s != BRG_SUCCESS) return s;
  uint32_t type = 0;
  char buf[BRG__BOOT_MAX_MSG + 1];
  /* A neighbour that is ready already beats: its heartbeats are skipped. */
  do
    s = brg__bootstrap_recv(c->bs, recv_dir, &type, buf, BRG__BOOT_MAX_MSG, got, c->timeout_ms,
                            err);
  while (s == BRG_SUCCESS && type == BRG__MSG_BEAT);
  if (s != BRG_SUCCESS) return s;
  if (type == want && *got <= max) {
    memcpy(out, buf, *got);
    return BRG_SUCCESS;
  }
  if (type == BRG__MSG_ABORT && *got > 4) {
    buf[*got] = 0;
    return brg__error(err, BRG_ERR_REMOTE, "init", "%s", buf + 4);
  }
  return brg__error(err, BRG_ERR_REMOTE, "init",
                    "expected message %u from rank %d, got type %u of %u bytes", want,
                    recv_dir == BRG__RING_NEXT ? c->ring.next : c->ring.prev, type, *got);
}

/* What the receiving end of a link tells its sender: the transport it
 * chose for the link and the one for device collectives on it
 * (brg__device_link's choice), which the sender checks, then the
 * transport's own connection info. */
enum { LINK_HEAD = 64, LINK_INFO = BRG__CONN_INFO_BYTES + LINK_HEAD };

/*
 * How the two ends of each of a ring's links meet during its setup
 * (ring_links): the receiving end's info goes to the sender (info), and
 * the sender says it attached (attached). The communicator's own ring
 * sends them over its ring sockets (sock_wire); kernel mode's net ring,
 * which has no ring sockets, all-gathers them over its owner (gather_wire).
 */
typedef struct link_wire link_wire;
struct link_wire {
  /* 1: every rank takes every step, with its status so far (st), even
   * after a failure of its own, since an all-gather needs every rank;
   * 0: a failure ends the setup at once, and the caller tells the
   * neighbours. */
  int together;
  /* This rank's info (LINK_INFO bytes) to prev; next's into peer, *got
   * bytes of it. */
  brg_status (*info)(brg__ring *r, void *arg, brg_status st, const char *mine, char *peer,
                     uint32_t *got, brg__errbuf *err);
  /* The link to next attached (st: whether it did); waits for the link
   * from prev to have attached. */
  brg_status (*attached)(brg__ring *r, void *arg, brg_status st, brg__errbuf *err);
  /* The sender's connect to next failed with s: a better reason, where
   * the wire knows one (NULL: none). */
  brg_status (*gave_up)(brg__ring *r, brg_status s, brg__errbuf *err);
};

/* How a ring's links are shaped and told apart from other links. */
typedef struct link_shape {
  int nslots;
  size_t slot_bytes;
  uint64_t comm_id; /* names (shm's FIFOs): one per ring of links */
  const uint8_t *secret;
  const char *what; /* for the INFO line: "" or "kernel mode's net ring: " */
} link_shape;

/* The link from prev, accepted on a thread of its own for transports that
 * listen: strangers on the listener are taken and dropped from the moment
 * it opens, whatever this rank's own connect to next is waiting for. */
typedef struct recv_side {
  brg__ring *r;
  brg__conn_params p;
  brg__waiter waiter;
  int64_t deadline;
  int cancel; /* atomic: the other half of the setup failed */
  pthread_t thread;
  brg_status s;
  brg__errbuf err;
} recv_side;

/* The accept thread's waiter check: it must not share ring_check's state
 * with the thread that connects to next. */
static brg_status recv_side_check(void *arg) {
  recv_side *r = arg;
  brg_comm *c = r->r->comm;
  if (__atomic_load_n(&c->aborted, __ATOMIC_ACQUIRE) ||
      __atomic_load_n(&r->cancel, __ATOMIC_ACQUIRE))
    return BRG_ERR_ABORTED;
  char why[BRG__ERRLEN / 2];
  if (brg__bootstrap_watch(c->bs, why, sizeof why)) return BRG_ERR_REMOTE;
  return brg__deadline_passed(r->deadline) ? BRG_ERR_TIMEOUT : BRG_SUCCESS;
}

static void *recv_side_main(void *arg) {
  recv_side *r = arg;
  r->s = r->r->recv.ops->recv_connect(&r->r->recv, &r->p, &r->err);
  return NULL;
}

/* Sets up ring r's two links: from prev (receive) and to next (send),
 * with the transports its owner (r->comm) allows, meeting the other ends
 * through w (arg: the wire's state). */
static brg_status ring_links(brg__ring *r, const link_shape *sh, const link_wire *w, void *arg,
                             brg__errbuf *err) {
  brg_comm *c = r->comm;
  const char *allow = c->transports;
  const brg__transport_ops *tsend =
      brg__transport_pick(&c->peers[c->rank], &c->peers[r->next], allow, BRG__CARRIES_HOST);
  const brg__transport_ops *trecv =
      brg__transport_pick(&c->peers[r->prev], &c->peers[c->rank], allow, BRG__CARRIES_HOST);
  brg_status s = BRG_SUCCESS;
  if (!tsend || !trecv) {
    s = brg__error(err, BRG_ERR_UNAVAILABLE, "init",
                   "no transport can link rank %d and rank %d (transports allowed: \"%s\", "
                   "from %s)",
                   c->rank, tsend ? r->prev : r->next, allow,
                   c->transports_from_config ? "brg_comm_config" : "BRIGADE_TRANSPORTS");
    if (!w->together) return s;
  }
  brg__conn_params ps = {.rank = c->rank,
                         .peer = r->next,
                         .nranks = c->nranks,
                         .self_info = &c->peers[c->rank],
                         .peer_info = &c->peers[r->next],
                         .nslots = sh->nslots,
                         .slot_bytes = sh->slot_bytes,
                         .comm_id = sh->comm_id,
                         .secret = sh->secret,
                         .timeout_ms = c->timeout_ms,
                         .waiter = &r->waiter};
  recv_side rs = {.r = r, .p = ps};
  rs.p.peer = r->prev;
  rs.p.peer_info = &c->peers[r->prev];

  /* Receiver side first: its info travels to prev, whose sender connects. */
  char info[LINK_INFO], peer_info[LINK_INFO];
  const brg__transport_ops *dsend = brg__transport_pick(&c->peers[c->rank], &c->peers[r->next],
                                                        allow, BRG__CARRIES_DEVICE),
                           *drecv = brg__transport_pick(&c->peers[r->prev], &c->peers[c->rank],
                                                        allow, BRG__CARRIES_DEVICE);
  memset(info, 0, sizeof info);
  int threaded = 0;
  if (s == BRG_SUCCESS) {
    snprintf(info, 32, "%s", trecv->name);
    snprintf(info + 32, 32, "%s", drecv ? drecv->name : "");
    r->recv.ops = trecv;
    r->recv.peer = r->prev;
    r->recv_open = 1;
    s = trecv->recv_setup(&r->recv, &rs.p, info + LINK_HEAD, err);
    if (s != BRG_SUCCESS && !w->together) return s;
  }
  if (s == BRG_SUCCESS && trecv->listens) {
    rs.waiter = (brg__waiter){.spin = r->waiter.spin, .check = recv_side_check, .arg = &rs};
    rs.p.waiter = &rs.waiter;
    rs.deadline = brg__deadline_ms(c->timeout_ms);
    s = brg__proxy_start(&rs.thread, recv_side_main, &rs, "brg-accept", err);
    if (s != BRG_SUCCESS && !w->together) return s;
    threaded = s == BRG_SUCCESS;
  }
  uint32_t got = 0;
  s = w->info(r, arg, s, info, peer_info, &got, err);
  if (s != BRG_SUCCESS) goto attached;
  if (got != sizeof peer_info || strncmp(peer_info, tsend->name, 32) != 0) {
    peer_info[31] = 0;
    s = brg__error(err, BRG_ERR_MISMATCH, "init",
                   "rank %d chose transport \"%s\" for the link from rank %d, which chose "
                   "\"%s\" (are the transports allowed the same on every rank?)",
                   r->next, got == sizeof peer_info ? peer_info : "?", c->rank, tsend->name);
    goto attached;
  }
  peer_info[63] = 0;
  if (strncmp(peer_info + 32, dsend ? dsend->name : "", 32) != 0) {
    s = brg__error(err, BRG_ERR_MISMATCH, "init",
                   "rank %d chose transport \"%s\" for device collectives on the link from rank "
                   "%d, which chose \"%s\" (are the transports allowed the same on every rank?)",
                   r->next, peer_info + 32, c->rank, dsend ? dsend->name : "");
    goto attached;
  }
  r->send.ops = tsend;
  r->send.peer = r->next;
  r->send_open = 1;
  s = tsend->send_connect(&r->send, &ps, peer_info + LINK_HEAD, err);
  if (s != BRG_SUCCESS && w->gave_up) s = w->gave_up(r, s, err);
attached:
  if (s == BRG_SUCCESS || w->together) s = w->attached(r, arg, s, err);
  if (s == BRG_SUCCESS && !threaded) s = trecv->recv_connect(&r->recv, &rs.p, err);
  if (threaded) {
    if (s != BRG_SUCCESS) __atomic_store_n(&rs.cancel, 1, __ATOMIC_RELEASE);
    pthread_join(rs.thread, NULL);
    if (s == BRG_SUCCESS && rs.s != BRG_SUCCESS) {
      s = rs.s;
      if (err) *err = rs.err;
    }
  }
  if (s != BRG_SUCCESS) return s;
  BRG__INFO("init",
            "%slink to rank %d (next) via %s, from rank %d (prev) via %s; %d slots x %zu bytes",
            sh->what, r->next, tsend->name, r->prev, trecv->name, sh->nslots, sh->slot_bytes);
  return BRG_SUCCESS;
}

/* A setup of ring r's links that failed: next may have died between
 * making its shm FIFO from this rank (named by comm_id) and telling its
 * name, which nobody else would unlink. */
static void forget_next_fifo(brg__ring *r, uint64_t comm_id) {
  brg_comm *c = r->comm;
  if (!r->send.fifo.data &&
      brg__transport_pick(&c->peers[c->rank], &c->peers[r->next], c->transports,
                          BRG__CARRIES_HOST) == &brg__transport_shm)
    brg__shm_forget(comm_id, r->next, c->rank);
}

/* Closes what ring_links opened (any part of it). */
static void ring_links_close(brg__ring *r) {
  if (r->send_open && r->send.ops) r->send.ops->close(&r->send);
  if (r->recv_open && r->recv.ops) r->recv.ops->close(&r->recv);
  r->send_open = r->recv_open = 0;
}

/* ---- the communicator's own ring: over its ring sockets ---- */

static brg_status sock_info(brg__ring *r, void *arg, brg_status st, const char *mine, char *peer,
                            uint32_t *got, brg__errbuf *err) {
  (void)arg;
  (void)st; /* not together: called only while the setup stands */
  return exchange(r->comm, BRG__RING_PREV, mine, LINK_INFO, BRG__RING_NEXT, BRG__MSG_CONN_INFO,
                  peer, LINK_INFO, got, err);
}

static brg_status sock_attached(brg__ring *r, void *arg, brg_status st, brg__errbuf *err) {
  (void)arg;
  (void)st;
  char ack = 1, ack_in;
  uint32_t got = 0;
  return exchange(r->comm, BRG__RING_NEXT, &ack, 1, BRG__RING_PREV, BRG__MSG_ATTACHED, &ack_in, 1,
                  &got, err);
}

/* The link to next failed to attach. Where next gave up first, its notice
 * is already on the ring socket: that says what really happened. */
static brg_status next_gave_up(brg__ring *ring, brg_status s, brg__errbuf *err) {
  brg_comm *c = ring->comm;
  uint32_t type = 0, got = 0;
  char buf[BRG__BOOT_MAX_MSG + 1];
  brg__errbuf quiet = {0};
  brg_status r;
  do r = brg__bootstrap_recv(c->bs, BRG__RING_NEXT, &type, buf, BRG__BOOT_MAX_MSG, &got, 0, &quiet);
  while (r == BRG_SUCCESS && type == BRG__MSG_BEAT);
  if (r != BRG_SUCCESS || type != BRG__MSG_ABORT || got <= 4) return s;
  buf[got] = 0;
  return brg__error(err, BRG_ERR_REMOTE, "init",
                    "rank %d gave up during setup, before rank %d could attach to it: %s",
                    ring->next, c->rank, buf + 4);
}

static const link_wire sock_wire = {
    .together = 0, .info = sock_info, .attached = sock_attached, .gave_up = next_gave_up};

/* Sets up the two links of this rank on its own ring. */
static brg_status connect_ring(brg_comm *c, const uint8_t *secret, brg__errbuf *err) {
  link_shape sh = {.nslots = c->nslots,
                   .slot_bytes = c->slice_bytes,
                   .comm_id = c->comm_id,
                   .secret = secret,
                   .what = ""};
  return ring_links(&c->ring, &sh, &sock_wire, NULL, err);
}

/* ---- links over all-gathers: kernel mode's net ring, the pieces ---- */

/* Whose all-gathers a ring's setup goes over: a piece's own ring's, the
 * communicator it is a piece of (it has no links yet); else the
 * communicator the ring belongs to (a net ring's). */
static brg_comm *over_whom(const brg__ring *r) {
  brg_comm *c = r->comm;
  return c->piece_of && r == &c->ring ? c->piece_of : c;
}

/* Rank k of r's communicator in the numbering of over_whom(r). */
static int gather_rank(const brg__ring *r, int k) {
  return over_whom(r) == r->comm ? k : brg__rank_up(r->comm, k);
}

/* A rank's word in each of the net ring's all-gathers: its status so far,
 * why it failed, and (in the first) its receiving end's info. */
typedef struct net_word {
  brg__split_confirm st;
  char info[LINK_INFO];
} net_word;

/* All-gathers each rank's status (and info) over the owner; fails with
 * the owner's error, else with rank `peer`'s failure (-1: none looked at).
 * *all holds every rank's word. */
static brg_status net_gather(brg__ring *r, brg_status st, const brg__errbuf *why, const char *info,
                             net_word *all, int peer, const char *peer_was, brg__errbuf *err) {
  brg_comm *c = over_whom(r);
  net_word mine;
  memset(&mine, 0, sizeof mine);
  mine.st.status = (int32_t)st;
  if (st != BRG_SUCCESS)
    snprintf(mine.st.why, sizeof mine.st.why, "%.*s", (int)sizeof mine.st.why - 1, why->msg);
  if (info) memcpy(mine.info, info, LINK_INFO);
  brg_status g = brg__split_gather(c, &mine, all, sizeof mine);
  if (st != BRG_SUCCESS) return st;
  if (g != BRG_SUCCESS)
    return brg__error(err, g, "init", "the all-gather over this communicator failed: %s",
                      brg_comm_last_error(c));
  int at = peer >= 0 ? gather_rank(r, peer) : -1;
  if (at >= 0 && all[at].st.status != BRG_SUCCESS)
    return brg__error(err, BRG_ERR_REMOTE, "init", "rank %d (%s) failed: %.*s", at, peer_was,
                      (int)sizeof all[at].st.why, all[at].st.why);
  return BRG_SUCCESS;
}

/* arg: every rank's word (nranks of them), for each gather in turn. */
static brg_status net_info(brg__ring *r, void *arg, brg_status st, const char *mine, char *peer,
                           uint32_t *got, brg__errbuf *err) {
  net_word *all = arg;
  brg__errbuf why = *err;
  brg_status s =
      net_gather(r, st, &why, mine, all, r->next, "next, setting up its receiving end", err);
  if (s != BRG_SUCCESS) return s;
  memcpy(peer, all[gather_rank(r, r->next)].info, LINK_INFO);
  *got = LINK_INFO;
  return BRG_SUCCESS;
}

static brg_status net_attached(brg__ring *r, void *arg, brg_status st, brg__errbuf *err) {
  brg__errbuf why = *err;
  return net_gather(r, st, &why, NULL, arg, r->prev, "prev, attaching to this rank", err);
}

static const link_wire gather_wire = {.together = 1, .info = net_info, .attached = net_attached};

/* The verdict of the all-gather that ends a set-up of links over an
 * owner (every rank's word in all[], n of them), for a rank whose own
 * set-up worked: BRG_ERR_REMOTE naming the rank that failed by itself,
 * before one that failed because its neighbour did (BRG_ERR_REMOTE) and
 * names it second hand; BRG_SUCCESS where none failed. */
static brg_status verdict(const net_word *all, int n, brg__errbuf *err) {
  int named = -1;
  for (int k = 0; k < n; k++)
    if (all[k].st.status != BRG_SUCCESS && (named < 0 || (all[named].st.status == BRG_ERR_REMOTE &&
                                                          all[k].st.status != BRG_ERR_REMOTE)))
      named = k;
  if (named < 0) return BRG_SUCCESS;
  return brg__error(err, BRG_ERR_REMOTE, "init", "rank %d failed its set-up: %.*s", named,
                    (int)sizeof all[named].st.why, all[named].st.why);
}

/* Sets up ring r's links over all-gathers of its owner (gather_wire),
 * then confirms them: nobody uses the links before every rank has
 * confirmed its own, so a failure on one rank is reported on all, naming
 * it. A failure leaves the links closed. */
static brg_status links_over_owner(brg__ring *r, const link_shape *sh, brg__errbuf *err) {
  int n = over_whom(r)->nranks;
  net_word *all = calloc((size_t)n, sizeof *all);
  if (!all) return brg__error(err, BRG_ERR_NO_MEMORY, "init", "out of memory for %d ranks", n);
  brg_status s = ring_links(r, sh, &gather_wire, all, err);
  brg__errbuf why = *err;
  s = net_gather(r, s, &why, NULL, all, -1, NULL, err);
  if (s == BRG_SUCCESS) s = verdict(all, n, err);
  free(all);
  if (s != BRG_SUCCESS) {
    forget_next_fifo(r, sh->comm_id);
    ring_links_close(r);
  }
  return s;
}

brg_status brg__comm_netring(brg_comm *c) {
  if (c->netring_state != 0 || c->nranks < 2) return BRG_SUCCESS;
  int staged = brg__device_staged_any(c);
  c->netring_state = 1;
  if (!staged || !strcmp(brg__device_str(BRG__DEVICE_MODE), "step")) return BRG_SUCCESS;
  c->netring_state = -1;
  int n = c->nranks;
  brg__ring *r = calloc(1, sizeof *r);
  int *order = calloc((size_t)n, sizeof *order);
  if (!r || !order) {
    free(r);
    free(order);
    return brg__comm_error(c, BRG_ERR_NO_MEMORY,
                           "device collectives: out of memory for kernel mode's links between "
                           "hosts (%d ranks)",
                           n);
  }
  /* The owner's place on its ring, links of its own. */
  brg__ring_init_net(r, c);
  memcpy(order, c->ring.order, (size_t)n * sizeof *order);
  r->order = order;
  r->pos = c->ring.pos;
  r->next = c->ring.next;
  r->prev = c->ring.prev;
  link_shape sh = {.nslots = c->nslots,
                   .slot_bytes = c->slice_bytes,
                   .comm_id = brg__fnv1a64(c->comm_id, "net ring", 8),
                   .secret = brg__bootstrap_secret((c->piece_of ? c->piece_of : c)->bs),
                   .what = "kernel mode's net ring: "};
  brg__errbuf err = {0};
  brg_status s = links_over_owner(r, &sh, &err);
  if (s != BRG_SUCCESS) {
    free(order);
    free(r);
    return brg__comm_error(c, s,
                           "device collectives: making kernel mode's links between hosts (a "
                           "second pair of links on this communicator's ring) failed: %s",
                           err.msg);
  }
  c->netring_state = 1;
  __atomic_store_n(&c->netring, r, __ATOMIC_RELEASE);
  return BRG_SUCCESS;
}

/* Closes the net ring's links, once its proxy stopped. */
static void netring_free(brg_comm *c) {
  brg__ring *r = __atomic_exchange_n(&c->netring, NULL, __ATOMIC_ACQ_REL);
  if (!r) return;
  ring_links_close(r);
  free(r->order);
  free(r);
}

/* ---- the runtime's own pieces of a communicator (rings, hierarchy) ---- */

static brg_status comm_free(brg_comm *c);

/* A rank of o with no links to set up (in no piece of two or more, or
 * failed before its links' set-up): links_over_owner's three all-gathers
 * with its status st, and the same verdict as the others'. */
static brg_status stand_by(brg_comm *o, brg_status st, brg__errbuf *err) {
  net_word mine, *all = calloc((size_t)o->nranks, sizeof *all);
  if (!all)
    return st != BRG_SUCCESS ? st
                             : brg__error(err, BRG_ERR_NO_MEMORY, "init",
                                          "out of memory for %d ranks", o->nranks);
  memset(&mine, 0, sizeof mine);
  mine.st.status = (int32_t)st;
  if (st != BRG_SUCCESS)
    snprintf(mine.st.why, sizeof mine.st.why, "%.*s", (int)sizeof mine.st.why - 1, err->msg);
  brg_status g = BRG_SUCCESS;
  for (int i = 0; i < 3 && g == BRG_SUCCESS; i++) g = brg__split_gather(o, &mine, all, sizeof mine);
  if (st == BRG_SUCCESS && g != BRG_SUCCESS)
    st = brg__error(err, g, "init", "the all-gather over this communicator failed: %s",
                    brg_comm_last_error(o));
  else if (st == BRG_SUCCESS)
    st = verdict(all, o->nranks, err);
  free(all);
  return st;
}

/* A piece's state: o's settings, its members' entries of o's table
 * renumbered 0..n-1 (members[i] is rank i's rank in o), its ring's order.
 * NULL when out of memory. */
static brg_comm *piece_new(brg_comm *o, const int *members, int n, int rank, int rotate,
                           uint64_t id) {
  brg_comm *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->magic = BRG__COMM_MAGIC;
  if (!(c->serial = brg__comm_register(c))) {
    free(c);
    return NULL;
  }
  c->rank = rank;
  c->nranks = n;
  c->gpu = -1;
  pthread_mutex_init(&c->err_lock, NULL);
  pthread_mutex_init(&c->ring_lock, NULL);
  pthread_mutex_init(&c->qlock, NULL);
  pthread_cond_init(&c->qcond, NULL);
  pthread_cond_init(&c->donecond, NULL);
  c->timeout_ms = o->timeout_ms;
  c->silent_fail_ms = o->silent_fail_ms;
  c->transports_from_config = o->transports_from_config;
  memcpy(c->transports, o->transports, sizeof c->transports);
  c->nslots = o->nslots;
  c->algo = o->algo;
  c->ring_rotate = rotate;
  c->piece_of = o;
  c->link_owner = brg__linkset_owner(o);
  c->comm_id = id;
  brg__ring_init(&c->ring, c);
  c->peers = calloc((size_t)n, sizeof *c->peers);
  c->members = calloc((size_t)n, sizeof *c->members);
  c->ring.order = calloc((size_t)n, sizeof *c->ring.order);
  if (!c->peers || !c->members || !c->ring.order) {
    comm_free(c);
    return NULL;
  }
  for (int i = 0; i < n; i++) {
    c->members[i] = members[i];
    c->peers[i] = o->peers[members[i]];
    c->peers[i].rank = i;
  }
  brg__topology_order(c);
  c->slice_bytes = brg__slice_bytes(c, BRG__SLICE_HOST);
  c->nt_bytes = o->nt_bytes;
  c->small_bytes = (size_t)brg__core_int(BRG__CORE_SMALL_BYTES);
  if (c->small_bytes > c->slice_bytes) c->small_bytes = c->slice_bytes;
  if (n > 1 && c->small_bytes > 0 && !(c->scratch = calloc((size_t)n, c->small_bytes)))
    c->small_bytes = 0;
  return c;
}

int brg__split_group(const brg__split_entry *all, int n, int color, int me, int *members,
                     int *rank) {
  int size = 0;
  *rank = -1;
  if (color == BRG_SPLIT_NOCOLOR) return 0;
  /* insertion sort, n is small */
  for (int r = 0; r < n; r++) {
    if (all[r].color != color) continue;
    int at = size++;
    while (at > 0 && all[members[at - 1]].key > all[r].key) {
      members[at] = members[at - 1];
      at--;
    }
    members[at] = r; /* r rises, so equal keys stay in rank order */
  }
  for (int i = 0; i < size; i++)
    if (members[i] == me) *rank = i;
  return size;
}

brg_status brg__comm_piece_make(brg_comm *o, int color, int key, int rotate, brg_comm **out) {
  *out = NULL;
  int n = o->nranks;
  uint32_t made = o->pieces_made++; /* alike on every rank: each call is a collective */
  brg__errbuf err = {0};
  brg__split_entry mine = {color, key}, *all = calloc((size_t)n, sizeof *all);
  int *members = calloc((size_t)n, sizeof *members);
  if (!all || !members) {
    free(all);
    free(members);
    return brg__fail_no_comm(BRG_ERR_NO_MEMORY, "out of memory for %d ranks", n);
  }
  brg_status s = brg__split_gather(o, &mine, all, sizeof mine);
  if (s != BRG_SUCCESS) {
    free(all);
    free(members);
    return brg__fail_no_comm(s, "the all-gather over this communicator failed: %s",
                             brg_comm_last_error(o));
  }
  int rank, size = brg__split_group(all, n, color, o->rank, members, &rank);
  free(all);
  brg_comm *c = NULL;
  if (rank >= 0) {
    uint64_t id = brg__fnv1a64(o->comm_id, &made, sizeof made);
    id = brg__fnv1a64(id, &color, sizeof color);
    if (!(c = piece_new(o, members, size, rank, rotate, id)))
      s = brg__error_quiet(&err, BRG_ERR_NO_MEMORY, "out of memory for a piece of %d ranks", size);
  }
  free(members);
  if (c && c->nranks > 1) {
    char what[48];
    if (rotate)
      snprintf(what, sizeof what, "ring %d: ", rotate);
    else
      snprintf(what, sizeof what, "piece %u: ", made);
    link_shape sh = {.nslots = c->nslots,
                     .slot_bytes = c->slice_bytes,
                     .comm_id = c->comm_id,
                     .secret = brg__bootstrap_secret(o->bs),
                     .what = what};
    s = links_over_owner(&c->ring, &sh, &err);
  } else {
    s = stand_by(o, s, &err);
  }
  /* Its thread starts at its first queued call (progress.c). */
  if (s == BRG_SUCCESS && c) s = brg__live_start(c, &err);
  if (s != BRG_SUCCESS) {
    if (c) comm_free(c);
    return brg__fail_no_comm_err(s, &err, NULL);
  }
  if (c) c->ready = 1;
  *out = c;
  return BRG_SUCCESS;
}

/* The goodbye carries the executors' word (brg__exec_bye_word), which
 * the neighbour's destroy waits on. */
static void say_goodbye(brg_comm *c) {
  uint64_t word = brg__exec_bye_word(c);
  pthread_mutex_lock(&c->ring_lock);
  for (int dir = 0; dir < 2; dir++)
    brg__bootstrap_send(c->bs, dir, BRG__MSG_BYE, &word, sizeof word, NULL);
  pthread_mutex_unlock(&c->ring_lock);
}

/* Waits, up to the timeout, for both neighbours' goodbyes (or hang-ups).
 * After a failure, not for a neighbour on another host: its streams never
 * touch this rank's memory, and a host that vanished would never answer. */
static void await_goodbyes(brg_comm *c) {
  int64_t deadline = brg__deadline_ms(c->timeout_ms);
  int failed = __atomic_load_n(&c->broken, __ATOMIC_ACQUIRE) != BRG_SUCCESS ||
               __atomic_load_n(&c->aborted, __ATOMIC_ACQUIRE);
  for (int dir = 0; dir < 2; dir++) {
    int peer = dir == BRG__RING_NEXT ? c->ring.next : c->ring.prev;
    if (failed && c->peers[peer].host_hash != c->peers[c->rank].host_hash) continue;
    /* What the liveness thread read before it stopped comes first. */
    char buf[BRG__BOOT_MAX_MSG + 1], text[BRG__ERRLEN];
    uint32_t type = 0, len = 0;
    brg_status s;
    if (brg__live_take(c, dir, &s, &type, buf, &len, text, sizeof text) == 1) {
      if (s != BRG_SUCCESS) continue;
      if (type == BRG__MSG_BYE) brg__ring_took_bye(&c->ring, dir, buf, len);
    }
    while (!c->ring.departed[dir]) {
      int left = brg__ms_left(deadline);
      if (left == 0) return;
      if (brg__bootstrap_recv(c->bs, dir, &type, buf, sizeof buf, &len, left, NULL) != BRG_SUCCESS)
        break; /* gone (or the deadline): nothing more will come */
      if (type == BRG__MSG_BYE) brg__ring_took_bye(&c->ring, dir, buf, len);
    }
  }
}

/* Piece i of c: its hierarchy's (0..2), then its rings 1.. (3..); NULL
 * where it has none. */
static brg_comm *piece_at(brg_comm *c, int i) {
  if (i == 0) return __atomic_load_n(&c->local, __ATOMIC_ACQUIRE);
  if (i == 1) return __atomic_load_n(&c->cross, __ATOMIC_ACQUIRE);
  if (i == 2) return __atomic_load_n(&c->fold, __ATOMIC_ACQUIRE);
  return i - 2 < c->nrings ? c->rings[i - 2] : NULL;
}

/* The pieces (rings, hierarchy) have no goodbyes of their own: where
 * they ran device collectives, each drains, then every rank waits for
 * every other (an all-gather over c) before any frees the memory its
 * neighbours on those pieces write into. Not after a failure, which a
 * rank may never come back from: then, as for a neighbour on another
 * host, nobody waits. */
static void pieces_drain(brg_comm *c) {
  int n = 2 + (c->nrings > 1 ? c->nrings : 1), device = 0;
  for (int i = 0; i < n; i++) device |= piece_at(c, i) && brg__exec_outlives(piece_at(c, i));
  if (!device || !c->ready || __atomic_load_n(&c->broken, __ATOMIC_ACQUIRE) != BRG_SUCCESS ||
      __atomic_load_n(&c->aborted, __ATOMIC_ACQUIRE))
    return;
  for (int i = 0; i < n; i++)
    if (piece_at(c, i) && brg__exec_outlives(piece_at(c, i))) brg__exec_drain(piece_at(c, i));
  char mine = 1, *all = calloc((size_t)c->nranks, 1);
  if (all) brg__split_gather(c, &mine, all, 1);
  free(all);
}

/* Frees everything create made. Device collectives end with a barrier:
 * this rank's own GPU work drains, then it waits for both neighbours to say
 * theirs has, since their streams use this rank's FIFO and events and its
 * stream theirs; only then is anything freed. Returns the drain's status
 * (the message is then the thread's last error). */
static brg_status comm_free(brg_comm *c) {
  brg_status s = BRG_SUCCESS;
  int ring = c->ready && c->bs && c->nranks > 1;
  pieces_drain(c);
  brg__live_stop(c); /* this thread and the engine's checks read the ring sockets now */
  if (brg__exec_outlives(c)) {
    brg__progress_stop(c);
    s = brg__exec_drain(c);
    if (ring) {
      say_goodbye(c);
      await_goodbyes(c);
    }
    /* What the neighbours' goodbyes say they began, this rank's work
     * finishes too (graph replays queued on streams no call named) */
    uint64_t theirs = c->ring.departed_word[0] > c->ring.departed_word[1]
                          ? c->ring.departed_word[0]
                          : c->ring.departed_word[1];
    brg_status settled = brg__exec_settle(c, ring ? theirs : 0);
    if (s == BRG_SUCCESS) s = settled;
  } else {
    /* A neighbour still finishing the last collective must not take our
     * hang-up for a crash: say goodbye first. */
    if (ring) say_goodbye(c);
    brg__progress_stop(c);
  }
  /* The hierarchy's pieces (hier.c), after the worker, the one
   * thread that may run on them, stopped. */
  brg_comm *local = __atomic_exchange_n(&c->local, NULL, __ATOMIC_ACQ_REL);
  brg_comm *cross = __atomic_exchange_n(&c->cross, NULL, __ATOMIC_ACQ_REL);
  brg_comm *fold = __atomic_exchange_n(&c->fold, NULL, __ATOMIC_ACQ_REL);
  if (local) brg_comm_destroy(local);
  if (cross) brg_comm_destroy(cross);
  if (fold) brg_comm_destroy(fold);
  /* Kernel mode's net ring: its proxy stops first (the neighbours said
   * goodbye above, so they have all its slots), then its links close. */
  brg__exec_stop(c);
  netring_free(c);
  /* The extra rings likewise; every rank tears them down in the same order,
   * so their neighbours are there to say goodbye to. */
  for (int r = 1; r < c->nrings; r++)
    if (c->rings[r]) brg_comm_destroy(c->rings[r]);
  free(c->rings);
  c->rings = NULL;
  c->nrings = 0;
  if (s != BRG_SUCCESS) brg__set_thread_error(c->last_error);
  brg__trace_close(c);
  brg__exec_free(c);
  brg__p2p_free(c); /* after the worker, which may be in an all_to_all */
  brg__live_free(c);
  ring_links_close(&c->ring);
  if (c->bs) brg__bootstrap_destroy(c->bs);
  pthread_mutex_destroy(&c->err_lock);
  pthread_mutex_destroy(&c->ring_lock);
  pthread_mutex_destroy(&c->qlock);
  pthread_cond_destroy(&c->qcond);
  pthread_cond_destroy(&c->donecond);
  free(c->scratch);
  free(c->lat_scratch);
  free(c->ring.order);
  free(c->peers);
  free(c->members);
  c->magic = 0;
  brg__comm_unregister(c);
  free(c);
  return s;
}

/* A communicator split from another (opts->parent) meets over its parent,
 * not at a root: each rank opens its ring listener, every rank of the
 * parent all-gathers its table entry (a zero one when it failed before it
 * had one), and each member picks its group's entries in the new rank
 * order. *phase: 1 once this exchange took place, 2 when the parent broke
 * (no further exchange). */
static brg_status boot_over_parent(brg_comm *c, const brg__comm_opts *o, const brg__boot_id *id,
                                   const brg__peer_info *me, brg_status before, int *phase,
                                   brg__errbuf *err) {
  size_t eb = BRG__BOOT_ENTRY_HDR + sizeof *me;
  int pn = o->parent->nranks;
  uint8_t *mine = calloc(1, eb), *all = calloc((size_t)pn, eb),
          *entries = calloc((size_t)c->nranks, eb);
  brg_status s = before;
  if (!mine || !all || !entries) {
    free(mine);
    free(all);
    free(entries);
    *phase = 2; /* cannot take part: the others time out */
    return brg__error(err, BRG_ERR_NO_MEMORY, "init", "out of memory for %d ranks", pn);
  }
  if (s == BRG_SUCCESS)
    s = brg__bootstrap_open(&c->bs, c->rank, c->nranks, id->secret, c->timeout_ms, mine, err);
  if (s == BRG_SUCCESS)
    memcpy(mine + BRG__BOOT_ENTRY_HDR, me, sizeof *me);
  else
    memset(mine, 0, eb); /* port 0: the others learn this rank failed */
  brg_status g = brg__split_gather(o->parent, mine, all, eb);
  *phase = g == BRG_SUCCESS ? 1 : 2;
  if (g != BRG_SUCCESS && s == BRG_SUCCESS)
    s = brg__error(err, g, "init", "meeting over the parent communicator: %s",
                   brg_comm_last_error(o->parent));
  for (int k = 0; k < c->nranks && s == BRG_SUCCESS; k++) {
    const uint8_t *e = all + (size_t)o->members[k] * eb;
    if (e[64] == 0 && e[65] == 0)
      s = brg__error(err, BRG_ERR_REMOTE, "init",
                     "rank %d of the new communicator (rank %d of its parent) failed before it "
                     "could join",
                     k, o->members[k]);
    memcpy(entries + (size_t)k * eb, e, eb);
  }
  if (s == BRG_SUCCESS) s = brg__bootstrap_set_table(c->bs, entries, sizeof *me, c->peers, err);
  free(mine);
  free(all);
  free(entries);
  return s;
}

/* The waits of a split's set-up watch the parent (bootstrap.h): one of
 * the members gone from it, or an abort of it, ends them at once. Ranks
 * of the parent outside the group may leave it meanwhile. */
typedef struct parent_watch_arg {
  const brg__comm_opts *o;
  int n; /* members */
} parent_watch_arg;

static int parent_watch(void *arg, char *why, size_t why_bytes) {
  const parent_watch_arg *w = arg;
  brg_comm *p = w->o->parent;
  if (brg__live_gone(p, w->o->members, w->n, "the parent communicator", why, why_bytes) >= 0)
    return 1;
  if (!__atomic_load_n(&p->aborted, __ATOMIC_ACQUIRE)) return 0;
  snprintf(why, why_bytes, "the parent communicator was aborted");
  return 1;
}

/* The release of a split's members, over the parent: every rank of the
 * parent says whether its set-up worked, and a member fails when one of
 * its group's did (naming it). */
static brg_status confirm_over_parent(brg_comm *c, const brg__comm_opts *o, brg_status mine,
                                      int *phase, brg__errbuf *err) {
  int pn = o->parent->nranks;
  brg__split_confirm m = {.status = (int32_t)mine};
  if (mine != BRG_SUCCESS) snprintf(m.why, sizeof m.why, "%.*s", (int)sizeof m.why - 1, err->msg);
  brg__split_confirm *all = calloc((size_t)pn, sizeof *all);
  if (!all) {
    *phase = 2;
    return mine != BRG_SUCCESS ? mine : brg__error(err, BRG_ERR_NO_MEMORY, "init", "out of memory");
  }
  brg_status g = brg__split_gather(o->parent, &m, all, sizeof m);
  *phase = 2;
  brg_status s = mine;
  if (s == BRG_SUCCESS && g != BRG_SUCCESS)
    s = brg__error(err, g, "init", "confirming over the parent communicator: %s",
                   brg_comm_last_error(o->parent));
  if (s != BRG_SUCCESS && g != BRG_SUCCESS && mine != BRG_SUCCESS &&
      !strstr(err->msg, "the parent communicator")) {
    /* The parent failed as well: a member gone from it is what went wrong
     * first, whatever this rank met on its way to noticing. */
    char here[sizeof err->msg];
    snprintf(here, sizeof here, "%s", err->msg);
    snprintf(err->msg, sizeof err->msg, "the parent communicator failed: %.290s; here: %.170s",
             brg_comm_last_error(o->parent), here);
  }
  for (int k = 0; k < c->nranks && s == BRG_SUCCESS; k++) {
    const brg__split_confirm *a = &all[o->members[k]];
    if (a->status != BRG_SUCCESS)
      s = brg__error(err, BRG_ERR_REMOTE, "init",
                     "rank %d of the new communicator (rank %d of its parent) failed its set-up: "
                     "%.*s",
                     k, o->members[k], (int)sizeof a->why, a->why);
  }
  free(all);
  return s;
}

brg_status brg__comm_create(brg_comm **out, int nranks, const brg__boot_id *id, int rank) {
  return brg__comm_create_opts(out, nranks, id, rank, NULL);
}

brg_status brg__comm_create_opts(brg_comm **out, int nranks, const brg__boot_id *id, int rank,
                                 const brg__comm_opts *opts) {
  brg__errbuf err = {0};
  brg_status s = brg__settings_load(&err);
  if (s != BRG_SUCCESS) return brg__fail_no_comm_err(s, &err, NULL);
  brg__log_init();
  if ((s = brg__boot_id_check(id, &err)) != BRG_SUCCESS)
    return brg__fail_no_comm_err(s, &err, NULL);

  brg_comm *c = calloc(1, sizeof *c);
  if (!c) return brg__fail_no_comm(BRG_ERR_NO_MEMORY, "out of memory creating a communicator");
  const brg__comm_opts *split = opts && opts->parent ? opts : NULL;
  int phase = 0;   /* split: the exchanges over the parent done so far */
  int ordered = 0; /* c->ring.next and c->ring.prev are known */
  parent_watch_arg watch = {.o = split, .n = nranks};
  c->magic = BRG__COMM_MAGIC;
  if (!(c->serial = brg__comm_register(c))) {
    free(c);
    return brg__fail_no_comm(BRG_ERR_NO_MEMORY, "out of memory creating a communicator");
  }
  c->rank = rank;
  c->gpu = -1;
  c->nranks = nranks;
  pthread_mutex_init(&c->err_lock, NULL);
  pthread_mutex_init(&c->ring_lock, NULL);
  pthread_mutex_init(&c->qlock, NULL);
  pthread_cond_init(&c->qcond, NULL);
  pthread_cond_init(&c->donecond, NULL);
  c->timeout_ms =
      opts && opts->timeout_ms != -1 ? opts->timeout_ms : (int)brg__core_int(BRG__CORE_TIMEOUT_MS);
  c->silent_fail_ms = (int)brg__core_int(BRG__CORE_SILENT_MS);
  c->transports_from_config = opts && opts->transports;
  snprintf(c->transports, sizeof c->transports, "%s",
           c->transports_from_config ? opts->transports : brg__core_str(BRG__CORE_TRANSPORTS));
  c->nslots = (int)brg__core_int(BRG__CORE_STEPS);
  c->comm_id = brg__fnv1a64(BRG__FNV64_INIT, id, sizeof *id);
  c->algo = brg__algo_parse(brg__core_str(BRG__CORE_ALGO)); /* checked by the load */
  brg__ring_init(&c->ring, c);
  brg__log_set_rank(rank);

  c->peers = calloc((size_t)nranks, sizeof *c->peers);
  c->ring.order = calloc((size_t)nranks, sizeof *c->ring.order);
  if (!c->peers || !c->ring.order) {
    s = brg__error_quiet(&err, BRG_ERR_NO_MEMORY, "out of memory for %d ranks", nranks);
    goto err_free;
  }
  brg__peer_info me;
  memset(&me, 0, sizeof me);
  me.rank = rank;
  me.pid = (int32_t)getpid();
  me.host_hash = brg__topology_host_hash(me.hostname, sizeof me.hostname);
  me.flags = brg__trace_wanted() ? BRG__PEER_TRACING : 0;
  me.algo = (uint32_t)c->algo;
  me.rings = (uint32_t)brg__core_int(BRG__CORE_RINGS);
  if ((s = brg__model_setup(&me.model, &err)) != BRG_SUCCESS) goto err_free;
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  me.cores = cores > 0 ? (uint32_t)cores : 0;
  if ((s = brg__boot_local_addr(me.addr, sizeof me.addr, &err)) != BRG_SUCCESS) goto err_free;
  if ((s = brg__p2p_open(c, me.addr, &me.p2p_port, &err)) != BRG_SUCCESS) {
    /* An address that parses but is not this host's: say where it came from. */
    const char *addr = brg__core_str(BRG__CORE_BOOTSTRAP_ADDR);
    size_t len = strlen(err.msg);
    if (addr[0] && len + 1 < sizeof err.msg)
      snprintf(err.msg + len, sizeof err.msg - len, " (BRIGADE_BOOTSTRAP_ADDR=%.64s%s)", addr,
               strlen(addr) > 64 ? "..." : "");
    goto err_free;
  }
  /* BRIGADE_TIMEOUT_MS, no more: the root gives up a little earlier
   * (brg__boot_root_start), so that its list of the ranks that never came
   * arrives before this rank gives up on its own. */
  int boot_wait = c->timeout_ms;
  if (split) {
    s = boot_over_parent(c, split, id, &me, BRG_SUCCESS, &phase, &err);
    brg__bootstrap_set_watch(c->bs, parent_watch, &watch);
  } else
    s = brg__bootstrap_init(&c->bs, id, rank, nranks, &me, sizeof me, c->peers, boot_wait, &err);
  if (s != BRG_SUCCESS) goto err_free;
  if ((s = brg__topology_check_peers(c->peers, nranks, &err)) != BRG_SUCCESS) goto err_free;
  /* Ranks that disagree would split into a hierarchy at different calls:
   * every rank sees the whole table, so all of them fail here at once. */
  for (int i = 0; i < nranks; i++)
    if (c->peers[i].algo != me.algo) {
      s = brg__error(&err, BRG_ERR_MISMATCH, "init",
                     "BRIGADE_ALGO is \"%s\" on rank %d but \"%s\" on rank %d: every rank "
                     "must use the same allreduce algorithm",
                     brg__algo_name(c->algo), rank, brg__algo_name((int)c->peers[i].algo), i);
      goto err_free;
    } else if (c->peers[i].rings != me.rings) {
      s = brg__error(&err, BRG_ERR_MISMATCH, "init",
                     "BRIGADE_RINGS is %u on rank %d but %u on rank %d (0: automatic); every "
                     "rank must set the same",
                     me.rings, rank, c->peers[i].rings, i);
      goto err_free;
    } else if (c->peers[i].model != me.model) {
      s = brg__error(&err, BRG_ERR_MISMATCH, "init",
                     "the cost model's links differ between rank %d and rank %d "
                     "(BRIGADE_MODEL_FILE=\"%.200s\" here): every rank must load the same "
                     "model file, or none",
                     rank, i, brg__core_str(BRG__CORE_MODEL_FILE));
      goto err_free;
    }

  brg__topology_order(c);
  ordered = 1;
  c->slice_bytes = brg__slice_bytes(c, BRG__SLICE_HOST);

  if (nranks > 1) {
    if ((s = brg__bootstrap_ring_connect(c->bs, c->ring.next, c->ring.prev, &err)) != BRG_SUCCESS)
      goto err_free;
    if ((s = connect_ring(c, brg__bootstrap_secret(c->bs), &err)) != BRG_SUCCESS) {
      brg__comm_notify_abort(c, s, err.msg);
      goto err_free;
    }
  }
  /* Nobody is released before every rank has confirmed its own set-up, so
   * a rank claimed by two processes fails the job on every rank. */
  brg__bootstrap_set_watch(c->bs, NULL, NULL); /* `watch` lives no longer than this call */
  s = split ? confirm_over_parent(c, split, BRG_SUCCESS, &phase, &err)
            : brg__bootstrap_confirm(c->bs, &err);
  if (s != BRG_SUCCESS) {
    brg__comm_notify_abort(c, s, err.msg);
    goto err_free;
  }
  int tracing = 0;
  for (int i = 0; i < nranks; i++) tracing |= (c->peers[i].flags & BRG__PEER_TRACING) != 0;
  if ((s = brg__trace_open(c, tracing, &err)) != BRG_SUCCESS) {
    brg__comm_notify_abort(c, s, err.msg);
    goto err_free;
  }
  c->nt_bytes = (size_t)brg__core_int(BRG__CORE_STREAM_BYTES);
  c->small_bytes = (size_t)brg__core_int(BRG__CORE_SMALL_BYTES);
  if (c->small_bytes > c->slice_bytes) c->small_bytes = c->slice_bytes;
  if (nranks > 1 && c->small_bytes > 0) {
    c->scratch = malloc((size_t)nranks * c->small_bytes);
    if (c->scratch)
      memset(c->scratch, 0, (size_t)nranks * c->small_bytes); /* touch it now */
    else
      c->small_bytes = 0;
  }
  if ((s = brg__progress_start(c, &err)) != BRG_SUCCESS) goto err_free;
  if ((s = brg__p2p_start(c, &err)) != BRG_SUCCESS) goto err_free;
  if ((s = brg__live_start(c, &err)) != BRG_SUCCESS) goto err_free;
  c->ready = 1;
  BRG__INFO("init", "rank %d of %d ready (pid %d on %s, kernels %s)", rank, nranks, me.pid,
            me.hostname, brg__kernels_isa());
  *out = c;
  return BRG_SUCCESS;

err_free:
  if (ordered && nranks > 1) forget_next_fifo(&c->ring, c->comm_id);
  /* A split's member that failed still takes part in the exchanges over
   * the parent, so that the others hear why instead of waiting. */
  if (split && phase == 0) {
    brg__errbuf keep = err;
    boot_over_parent(c, split, id, &me, s, &phase, &keep);
  }
  if (split && phase == 1) {
    /* A member gone from the parent is what went wrong first, whatever
     * this rank met on its way to noticing. */
    char gone[BRG__ERRLEN / 2];
    if (parent_watch(&watch, gone, sizeof gone) && !strstr(err.msg, gone)) {
      char here[sizeof err.msg];
      snprintf(here, sizeof here, "%s", err.msg);
      int room = (int)sizeof err.msg - (int)strlen(gone) - 9;
      snprintf(err.msg, sizeof err.msg, "%s; here: %.*s", gone, room > 0 ? room : 0, here);
    }
    confirm_over_parent(c, split, s, &phase, &err);
  }
  brg__bootstrap_verdict(c->bs, &s, &err); /* a job the root failed says why */
  comm_free(c);
  return brg__fail_no_comm_err(s, &err, NULL);
}

brg_status brg_comm_rank(const brg_comm *comm, int *rank) {
  brg_status s = brg__check_comm(comm, "brg_comm_rank");
  if (s != BRG_SUCCESS) return s;
  if (!rank)
    return brg__comm_error((brg_comm *)comm, BRG_ERR_INVALID_ARGUMENT,
                           "brg_comm_rank: rank is NULL");
  *rank = comm->rank;
  return BRG_SUCCESS;
}

brg_status brg_comm_size(const brg_comm *comm, int *size) {
  brg_status s = brg__check_comm(comm, "brg_comm_size");
  if (s != BRG_SUCCESS) return s;
  if (!size)
    return brg__comm_error((brg_comm *)comm, BRG_ERR_INVALID_ARGUMENT,
                           "brg_comm_size: size is NULL");
  *size = comm->nranks;
  return BRG_SUCCESS;
}

brg_status brg_comm_bytes_sent(const brg_comm *comm, uint64_t *bytes) {
  brg_status s = brg__check_comm(comm, "brg_comm_bytes_sent");
  if (s != BRG_SUCCESS) return s;
  if (!bytes)
    return brg__comm_error((brg_comm *)comm, BRG_ERR_INVALID_ARGUMENT,
                           "brg_comm_bytes_sent: bytes is NULL");
  *bytes = __atomic_load_n(&comm->bytes_sent, __ATOMIC_RELAXED);
  for (int r = 1; r < comm->nrings; r++)
    *bytes += __atomic_load_n(&comm->rings[r]->bytes_sent, __ATOMIC_RELAXED);
  return BRG_SUCCESS;
}

brg_status brg_comm_get_async_error(const brg_comm *comm, brg_status *status) {
  brg_status s = brg__check_comm(comm, "brg_comm_get_async_error");
  if (s != BRG_SUCCESS) return s;
  if (!status)
    return brg__comm_error((brg_comm *)comm, BRG_ERR_INVALID_ARGUMENT,
                           "brg_comm_get_async_error: status is NULL");
  *status = __atomic_load_n(&comm->broken, __ATOMIC_ACQUIRE);
  /* Kernel mode: a kernel that stopped after its call returned */
  if (*status == BRG_SUCCESS && !__atomic_load_n(&comm->aborted, __ATOMIC_ACQUIRE)) {
    brg_comm *c = (brg_comm *)comm;
    brg_status k = brg__exec_async_error(c);
    if (k != BRG_SUCCESS) {
      __atomic_store_n(&c->broken, k, __ATOMIC_RELEASE);
      brg__comm_notify_abort(c, k, c->last_error);
      *status = k;
    }
  }
  if (*status == BRG_SUCCESS && __atomic_load_n(&comm->aborted, __ATOMIC_ACQUIRE))
    *status = BRG_ERR_ABORTED;
  return BRG_SUCCESS;
}

brg_status brg_comm_abort(brg_comm *comm) {
  brg_status s = brg__check_comm(comm, "brg_comm_abort");
  if (s != BRG_SUCCESS) return s;
  brg__comm_stop(comm);
  return BRG_SUCCESS;
}

brg_status brg_comm_destroy(brg_comm *comm) {
  brg_status s = brg__check_comm(comm, "brg_comm_destroy");
  if (s != BRG_SUCCESS) return s;
  /* Device collectives that returned at once are finished first, as on
   * the ring within a host; other collectives still queued cannot finish
   * once this rank is gone. */
  if (!brg__progress_settle(comm)) brg_comm_abort(comm);
  return comm_free(comm);
}
