/*
 * The two links of a ring rank, as the engine uses them: a slot towards
 * the next rank is acquired and posted, a slot from the previous rank is
 * acquired (its header checked against this rank's own call) and
 * released. While a wait sleeps, ring_check looks for what should stop
 * it: an abort, a neighbour's notice or hang-up, a broken link, the
 * deadline. The host data path (ring.c) and the device data path
 * (device_step.c) both hand slots over through these functions.
 */
#include <poll.h>
#include <stdio.h>
#include <string.h>

#include "clock.h"
#include "ring_link.h"
#include "settings.h"
#include "trace.h"

/* How long a wait goes on after a neighbour said goodbye before it names
 * that neighbour as gone too early: longer than a network link's flush at
 * close (IB_CLOSE_GRACE_MS, 1 s), with room for a loaded machine. */
#define BRG__DEPARTED_GRACE_NS 3000000000LL
/* How long a wait goes on after its link closed before it names that link
 * (BRG__NOTE_GRACE_MS): a neighbour that stopped wrote its notice on its
 * ring socket first, and the notice names the rank that failed, where the
 * closed link names only the neighbour that gave up on it. */
#define BRG__CLOSED_GRACE_NS ((int64_t)BRG__NOTE_GRACE_MS * 1000000)

void brg__ring_took_bye(brg__ring *r, int dir, const char *data, uint32_t len) {
  r->departed[dir] = 1;
  r->departed_ns[dir] = brg__now_ns();
  if (len == sizeof(uint64_t)) memcpy(&r->departed_word[dir], data, sizeof(uint64_t));
}

static brg_status ring_news(brg__ring *r, const brg_comm *names, int peer, brg_status s,
                            uint32_t type, char *buf, uint32_t len, const char *text);

/* Reads what arrived on a ring socket while we were waiting: an abort
 * notice from a neighbour, a goodbye, or the hang-up of one that died. */
static brg_status check_ring_socket(brg__ring *r, int dir) {
  brg_comm *c = r->comm;
  int peer = dir == BRG__RING_NEXT ? r->next : r->prev;
  char buf[BRG__BOOT_MAX_MSG + 1];
  uint32_t type = 0, len = 0;
  brg__errbuf err = {0};
  brg_status s = BRG_SUCCESS;
  if (c->piece_of) {
    /* A piece has no sockets: its owner's tell what stops it (in the
     * owner's numbering). It looks without taking, since the owner's waits
     * take what they read, and a goodbye there is the owner's
     * neighbour's, not this ring's. */
    if (brg__live_peek(c, dir, &peer, &s, &type, buf, &len, err.msg, sizeof err.msg) <= 0 ||
        (s == BRG_SUCCESS && type == BRG__MSG_BYE))
      return BRG_SUCCESS;
    return ring_news(r, c->piece_of, peer, s, type, buf, len, err.msg);
  }
  int fd = brg__bootstrap_fd(c->bs, dir);
  if (fd < 0 || r->departed[dir]) return BRG_SUCCESS;
  /* Once ready, the liveness thread reads the socket and keeps the rest. */
  int got = brg__live_take(c, dir, &s, &type, buf, &len, err.msg, sizeof err.msg);
  if (got == 0) return BRG_SUCCESS;
  if (got < 0) {
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    if (poll(&pfd, 1, 0) <= 0) return BRG_SUCCESS;
    s = brg__bootstrap_recv(c->bs, dir, &type, buf, BRG__BOOT_MAX_MSG, &len, 0, &err);
    if (s == BRG_ERR_TIMEOUT) return BRG_SUCCESS;
  }
  if (s == BRG_SUCCESS && type == BRG__MSG_BYE) {
    brg__ring_took_bye(r, dir, buf, len);
    return BRG_SUCCESS;
  }
  return ring_news(r, c, peer, s, type, buf, len, err.msg);
}

/* What a ring socket brought from `peer` (the failure s, text, or the
 * message type, buf, len), as the error that stops a wait; BRG_SUCCESS
 * for a heartbeat. `names` is the communicator whose socket it is, whose
 * table and numbering the message speaks in (a piece's owner's). buf has
 * room for a terminator at len. */
static brg_status ring_news(brg__ring *r, const brg_comm *names, int peer, brg_status s,
                            uint32_t type, char *buf, uint32_t len, const char *text) {
  brg_comm *c = r->comm;
  if (s != BRG_SUCCESS)
    return brg__comm_error(c, BRG_ERR_REMOTE, "rank %d (pid %d on %s) is gone: %s", peer,
                           names->peers[peer].pid, names->peers[peer].hostname, text);
  if (type == BRG__MSG_BEAT) return BRG_SUCCESS;
  if (type == BRG__MSG_ABORT && len >= 4) {
    brg_status rs;
    memcpy(&rs, buf, 4);
    buf[len] = 0;
    if (rs <= BRG_IN_PROGRESS || rs > BRG_ERR_INTERNAL) rs = BRG_ERR_REMOTE;
    if (rs == BRG_ERR_ABORTED || rs == BRG_ERR_TIMEOUT) rs = BRG_ERR_REMOTE;
    /* Say what this rank itself was waiting for: with cascading timeouts
     * that names the rank that really stalled. */
    int waited = names == c ? r->wait_peer : brg__rank_up(c, r->wait_peer);
    if (waited != peer && r->wait_start_ns)
      return brg__comm_error(
          c, rs, "%s; rank %d was itself waiting %lld ms for rank %d to %s", buf + 4, names->rank,
          (long long)((brg__now_ns() - r->wait_start_ns) / 1000000), waited, r->wait_what);
    return brg__comm_error(c, rs, "%s", buf + 4);
  }
  return brg__comm_error(c, BRG_ERR_REMOTE, "unexpected message type %u from rank %d", type, peer);
}

/* The waiter's check: called about every millisecond while a wait sleeps.
 * Its messages number ranks as the communicator a piece is a piece of
 * does (brg__rank_up), the numbering the application knows. */
static brg_status ring_check(void *arg) {
  brg__ring *r = arg;
  brg_comm *c = r->comm;
  if (__atomic_load_n(&c->aborted, __ATOMIC_ACQUIRE))
    return brg__comm_error(c, BRG_ERR_ABORTED, "aborted by brg_comm_abort");
  /* Notices first: they name the rank that failed, which a broken link
   * further along the ring does not. During setup the ring sockets carry
   * the setup messages themselves. */
  for (int dir = 0; c->ready && dir < 2; dir++) {
    brg_status s = check_ring_socket(r, dir);
    if (s != BRG_SUCCESS) return s;
  }
  /* A split's set-up: a member gone from the parent never comes. */
  char why[BRG__ERRLEN / 2];
  if (!c->ready && brg__bootstrap_watch(c->bs, why, sizeof why))
    return brg__comm_error(c, BRG_ERR_REMOTE, "%s", why);
  brg__conn *w = r->wait_conn;
  uint32_t closed =
      w && w->fifo.ctrl ? __atomic_load_n(&w->fifo.ctrl->closed, __ATOMIC_ACQUIRE) : 0;
  if (closed) {
    int64_t now = brg__now_ns();
    if (!r->closed_ns) r->closed_ns = now;
    if (c->ready && now - r->closed_ns < BRG__CLOSED_GRACE_NS) return BRG_SUCCESS;
    const brg__peer_info *pi = w->peer >= 0 && w->peer < c->nranks ? &c->peers[w->peer] : NULL;
    return brg__comm_error(
        c, (brg_status)closed,
        "%s link with rank %d (pid %d on %s) closed while waiting for it to %s: %s",
        w->ops ? w->ops->name : "?", brg__rank_up(c, w->peer), pi ? pi->pid : -1,
        pi ? pi->hostname : "?", r->wait_what,
        w->fifo.ctrl->closed_why[0] ? w->fifo.ctrl->closed_why : "no reason given");
  }
  int64_t now = brg__now_ns();
  if (!r->wait_start_ns) r->wait_start_ns = now;
  int dir = r->wait_peer == r->next ? BRG__RING_NEXT : BRG__RING_PREV;
  /* A neighbour that left cleanly sent all it had, but says goodbye before
   * its links have flushed (a network link's close lets its proxy deliver
   * for up to a second): allow a moment for data still on the wire, from
   * the later of the wait's start and the goodbye, then say who left too
   * early. */
  int64_t since = r->departed_ns[dir] > r->wait_start_ns ? r->departed_ns[dir] : r->wait_start_ns;
  if (c->ready && !r->departed_ok && r->departed[dir] && now - since > BRG__DEPARTED_GRACE_NS)
    return brg__comm_error(c, BRG_ERR_REMOTE,
                           "rank %d destroyed its communicator while rank %d was still waiting "
                           "for it to %s (did the ranks call different numbers of collectives?)",
                           brg__rank_up(c, r->wait_peer), brg__rank_up(c, c->rank), r->wait_what);
  /* A rank whose heartbeats stopped: its host vanished without closing a
   * socket (the kernel's own retransmissions would take many minutes to
   * give up), or it was stopped. Named long before the timeout. */
  if (c->silent_fail_ms > 0 && c->silent_fail_ms < c->timeout_ms) {
    int64_t silent_ms = 0;
    int quiet = brg__live_silent(c, &silent_ms), limit = brg__live_silent_limit_ms(c);
    if (quiet >= 0 && silent_ms >= limit)
      return brg__comm_error(c, BRG_ERR_REMOTE,
                             "rank %d (pid %d on %s) has been silent for %lld ms (host gone, "
                             "cut off or stopped; BRIGADE_SILENT_TIMEOUT_MS=%d, %d in effect) "
                             "while rank %d waited for rank %d to %s",
                             brg__rank_up(c, quiet), c->peers[quiet].pid, c->peers[quiet].hostname,
                             (long long)silent_ms, c->silent_fail_ms, limit,
                             brg__rank_up(c, c->rank), brg__rank_up(c, r->wait_peer), r->wait_what);
  }
  if (now - r->wait_start_ns > (int64_t)c->timeout_ms * 1000000) {
    char what[160] = "setup";
    if (r->cur)
      brg__coll_describe(what, sizeof what, r->cur->kind, r->cur->seq, r->cur->count, r->cur->dtype,
                         r->cur->op, r->cur->root, r->cur->device);
    /* The rank that went silent, whether or not it is the one waited for. */
    char silent[192];
    brg__live_silent_note(c, silent, sizeof silent);
    return brg__comm_error(c, BRG_ERR_TIMEOUT,
                           "timeout: no progress for %d ms in %s at step %d, waiting for rank "
                           "%d (pid %d on %s) to %s%s",
                           c->timeout_ms, what, r->cur_step, brg__rank_up(c, r->wait_peer),
                           c->peers[r->wait_peer].pid, c->peers[r->wait_peer].hostname,
                           r->wait_what, silent);
  }
  return BRG_SUCCESS;
}

void brg__ring_init(brg__ring *r, brg_comm *c) {
  r->comm = c;
  r->waiter.spin = (int)brg__core_int(BRG__CORE_SPIN);
  r->waiter.check = ring_check;
  r->waiter.arg = r;
  r->waiter_sleep = r->waiter;
  r->waiter_sleep.spin = -1;
}

/* The waiter's check on a ring with no ring sockets of its own. */
static brg_status net_check(void *arg) {
  brg__ring *r = arg;
  brg_comm *c = r->comm;
  if (__atomic_load_n(&c->aborted, __ATOMIC_ACQUIRE)) return BRG_ERR_ABORTED;
  int nb[2] = {r->next, r->prev};
  char why[BRG__ERRLEN / 2];
  if (brg__live_gone(c, nb, 2, "the communicator", why, sizeof why) >= 0) return BRG_ERR_REMOTE;
  return BRG_SUCCESS;
}

void brg__ring_init_net(brg__ring *r, brg_comm *c) {
  brg__ring_init(r, c);
  r->waiter.check = r->waiter_sleep.check = net_check;
}

/* The waiter for waits on link `l`. */
static const brg__waiter *link_waiter(const brg__ring *r, const brg__conn *l) {
  return l->ops && l->ops->sleeps ? &r->waiter_sleep : &r->waiter;
}

/* Waits for a free slot in the FIFO to the next rank; small slices go in
 * the slot header itself. The receiver's head is re-read only when the
 * last value seen says the FIFO is full. */
brg_status brg__ring_send_acquire(brg__ring_op *o, size_t bytes, char **slot) {
  brg_comm *c = o->c;
  brg__ring *r = o->r;
  brg__fifo *f = &r->send.fifo;
  if (r->send_pos + 1 > r->send_head + (uint64_t)f->nslots) {
    r->send_head = __atomic_load_n(&f->ctrl->head, __ATOMIC_ACQUIRE);
    if (r->send_pos + 1 > r->send_head + (uint64_t)f->nslots) {
      r->wait_what = "free a slot (it is not receiving)";
      r->wait_peer = r->next;
      r->wait_conn = &r->send;
      r->wait_start_ns = 0;
      int64_t w0 = c->trace ? brg__now_ns() : 0;
      brg_status s = brg__wait_ge(&f->ctrl->head, &f->ctrl->head_waiters,
                                  r->send_pos + 1 - (uint64_t)f->nslots, link_waiter(r, &r->send));
      if (c->trace) brg__trace_wait(c, r->next, 1, w0);
      if (s != BRG_SUCCESS) return s;
      r->send_head = __atomic_load_n(&f->ctrl->head, __ATOMIC_ACQUIRE);
    }
  }
  *slot = bytes <= BRG__INLINE_BYTES ? brg__fifo_meta(f, r->send_pos)->inline_data
                                     : brg__fifo_slot(f, r->send_pos);
  return BRG_SUCCESS;
}

brg_status brg__ring_send_post(brg__ring_op *o, size_t bytes, const void *payload) {
  brg_comm *c = o->c;
  brg__ring *r = o->r;
  brg__fifo *f = &r->send.fifo;
  uint64_t pos = r->send_pos;
  brg__slot_meta *m = brg__fifo_meta(f, pos);
  /* Small payloads travel in the header, wherever they were. */
  if (payload && bytes <= BRG__INLINE_BYTES) {
    if (bytes) memcpy(m->inline_data, payload, bytes);
    payload = NULL;
  }
  m->seq = o->coll->seq;
  m->count = o->coll->count;
  m->kind = (uint32_t)o->coll->kind;
  m->bytes = (uint32_t)bytes;
  m->dtype = (uint16_t)o->coll->dtype;
  m->op = (uint16_t)o->coll->op;
  m->root = o->coll->root;
  m->step = (uint32_t)r->cur_step;
  m->device = o->dev != NULL;
  r->send_pos++;
  c->bytes_sent += bytes;
  __atomic_store_n(&m->flag, r->send_pos, __ATOMIC_RELEASE);
  brg__publish(&f->ctrl->tail, &f->ctrl->tail_waiters, r->send_pos);
  if (!r->send.ops || !r->send.ops->send_now) return BRG_SUCCESS;
  r->wait_what = "take data (its link is full)";
  r->wait_peer = r->next;
  r->wait_conn = &r->send;
  r->wait_start_ns = 0;
  brg_status s = r->send.ops->send_now(&r->send, pos, payload, link_waiter(r, &r->send));
  /* A link the transport found broken is reported as a wait on it would
   * be (a neighbour's notice first: it names the rank that failed); a stop
   * by the check was reported by the check. */
  if (s != BRG_SUCCESS && __atomic_load_n(&f->ctrl->closed, __ATOMIC_ACQUIRE)) {
    /* The check gives the closure a moment for the notice (ring_check):
     * asked again until it says, within that moment and a little more. */
    int64_t until = brg__now_ns() + 2 * BRG__CLOSED_GRACE_NS;
    brg_status why;
    while ((why = r->waiter.check(r->waiter.arg)) == BRG_SUCCESS && brg__now_ns() < until)
      brg__sleep_ms(1);
    if (why != BRG_SUCCESS) return why;
  }
  return s;
}

/* Waits for the next slot from the previous rank and checks its header. */
brg_status brg__ring_recv_acquire(brg__ring_op *o, const char **slot, size_t bytes) {
  brg_comm *c = o->c;
  brg__ring *r = o->r;
  brg__fifo *f = &r->recv.fifo;
  brg__slot_meta *m = brg__fifo_meta(f, r->recv_pos);
  if (__atomic_load_n(&m->flag, __ATOMIC_ACQUIRE) != r->recv_pos + 1) {
    r->wait_what = "send data";
    r->wait_peer = r->prev;
    r->wait_conn = &r->recv;
    r->wait_start_ns = 0;
    int64_t w0 = c->trace ? brg__now_ns() : 0;
    brg_status s = brg__wait_flag(&m->flag, r->recv_pos + 1, &f->ctrl->tail, &f->ctrl->tail_waiters,
                                  link_waiter(r, &r->recv));
    if (c->trace) brg__trace_wait(c, r->prev, 0, w0);
    if (s != BRG_SUCCESS) return s;
  }
  const brg__coll *k = o->coll;
  /* Two all_to_alls compare only which call they are (ring.c's announce):
   * their counts and dtypes are the blocks' to check. */
  int a2a = k->kind == BRG__COLL_ALL_TO_ALL && m->kind == (uint32_t)k->kind;
  if (m->seq != k->seq || m->kind != (uint32_t)k->kind || m->bytes != bytes ||
      m->device != (o->dev != NULL) ||
      (!a2a && (m->count != k->count || m->dtype != (uint16_t)k->dtype ||
                m->op != (uint16_t)k->op || m->root != k->root))) {
    char mine[160], theirs[160];
    brg__coll_describe(mine, sizeof mine, k->kind, k->seq, k->count, k->dtype, k->op, k->root,
                       o->dev != NULL);
    brg__coll_describe(theirs, sizeof theirs, (brg__coll_kind)m->kind, m->seq, m->count, m->dtype,
                       m->op, m->root, (int)m->device);
    return brg__comm_error(c, BRG_ERR_MISMATCH,
                           "collective mismatch: rank %d called %s but rank %d called %s",
                           brg__rank_up(c, c->rank), mine, brg__rank_up(c, r->prev), theirs);
  }
  *slot = bytes <= BRG__INLINE_BYTES ? m->inline_data : brg__fifo_slot(f, r->recv_pos);
  /* The payload may have gone straight to the buffer offered for it. */
  if (r->recv.landed && r->recv.landed[r->recv_pos % (uint64_t)f->nslots])
    *slot = r->recv.landed[r->recv_pos % (uint64_t)f->nslots];
  return BRG_SUCCESS;
}

void brg__ring_recv_release(brg__ring_op *o) {
  brg__ring *r = o->r;
  brg__fifo *f = &r->recv.fifo;
  r->recv_pos++;
  brg__publish(&f->ctrl->head, &f->ctrl->head_waiters, r->recv_pos);
}
