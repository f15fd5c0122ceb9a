/*
 * Point-to-point: messages between any two ranks (all_to_all runs on them:
 * alltoall.c).
 *
 * Each rank listens on one TCP port, opened before the bootstrap so that
 * the peer table carries it. The first message from A to B dials B's
 * listener; the link of the transport table set up over that connection
 * (below) carries A's messages to B and nothing back (B's messages to A
 * take B's own), so two ranks that dial each other at once need no
 * tie-break, and order per pair is the link's stream order.
 *
 * A thread per communicator ("brg-p2p") is the progress engine of both
 * directions. It reads every incoming link as bytes arrive: a
 * message whose receive is posted lands in that receive's buffer;
 * otherwise it lands in memory of its own ("unexpected", or early) until
 * its receive is posted, and is copied then. Early memory for the user's
 * messages is capped per communicator (BRIGADE_P2P_EARLY_BYTES): a header
 * whose message does not fit is held, the thread stops reading that
 * link, and its flow control (a full FIFO, a full socket) holds the
 * sender back until a receive is posted or early memory
 * is freed. One message always fits when no
 * early memory is in use, so two ranks that each send one message first
 * and receive afterwards never deadlock, at any size. all_to_all's blocks
 * are not capped: a rank is at most one all_to_all ahead of another.
 *
 * Sends are queued per peer (brg__p2p_isend): the caller writes what the
 * link takes at once, the thread writes the rest as room comes (the
 * receiver's doorbell, or the link's descriptor), and a send finishes
 * once its last byte has left its buffer.
 * brg_send is a queued send and a wait. A collective that waits on one
 * message after another (lat.c's tree and rhd) drives the links from its
 * own thread instead (brg__p2p_drive_wait, at the end of this file).
 *
 *   A: isend(B) -> A's send queue for B --[hello on the connection; frames
 *        on the link]--> B's brg-p2p thread -> posted receive, early
 *                                    memory, or held (B stops reading)
 *
 * A receive from any source (BRG_ANY_SOURCE) waits in a queue of the
 * communicator's own. A message from a peer goes to whichever was posted
 * first: the peer's oldest receive or the oldest receive from any source
 * (each posted receive takes a number, `order`); a receive from any
 * source posted while messages wait in early memory takes the one that
 * arrived first (each takes a number, `arrival`).
 *
 * Wire: a hello once per connection (magic, both ranks, the communicator's
 * id and secret, the transport the frames are to take), then frames: a
 * header (channel, number, count, dtype), then count * size(dtype)
 * payload bytes. Channel BRG__P2P_A2A carries all_to_all's blocks
 * (numbered by the collective), apart from the user's messages (numbered
 * per pair).
 *
 * A rank that stops (its collective failed, brg_comm_abort: stop.c, and a
 * ring collective's failure: progress.c) writes the cause on each of its
 * connections, both ways, before any of its links closes
 * (brg__p2p_notify; the notice's layout is internal.h's). A peer that
 * then sees it hang up fails with "rank R stopped: <its cause>", which
 * names the rank that died first, rather than naming R: a tree's or
 * rhd's partner gives up on a dead rank and hangs up on the others. The
 * connection carries the notice before its own end, and a link with a
 * descriptor of its own ends after the connections (brg__p2p_free closes
 * them first), so the notice is read there first (conn_drain, note_look).
 *
 * Where the frames travel. The connection is always made: it carries the
 * hello, tells the hang-up of either end, and carries the notice of a
 * send cut short. Between two ranks that the transport table would link
 * with a transport that has the non-blocking byte stream (try_send,
 * try_recv and the readiness hook `ready`, transport/transport.h: shm
 * between ranks of one host, tcp or ibverbs between hosts), the frames
 * take a link of that transport, set up over the connection at the first
 * message: the receiver makes its end (recv_setup, as a byte stream) and
 * answers with its info, the sender attaches (send_connect) and says
 * whether it did, naming the next transport of the table to try when it
 * did not (each failure is logged at INFO): the fallback is the table's,
 * and when no transport is left the connection is dropped and the send
 * fails with the reasons. The links are of two kinds:
 *
 *   doorbells (shm): the bytes arrive in memory, so the connection
 *     carries one-byte doorbells instead of frames: a thread with nothing
 *     to move arms its links (ready) before it polls, and the other end's
 *     try_send or try_recv that changes that rings it, the sender on its
 *     connection, the receiver back on the same connection. The stream's
 *     end is the connection's, once the link is read.
 *   a descriptor of its own (ready_fd: tcp's socket, ibverbs' eventfd,
 *     which its proxies write as slots land and credits return): the
 *     thread polls it, and the link ends itself (its end, close, or its
 *     process's exit: try_recv says ended; a failure: broken). The
 *     connection is then only the hello, the hang-up the sender watches
 *     for, and the cut notice's door; a send cut short ends the link's
 *     stream (end) rather than the connection.
 *
 * cuda_ipc has no byte stream and carries device collectives only. The
 * code above the bytes (queues, early memory, holding a sender back) is
 * the same for every link; link_recv and link_send are where the kinds
 * part.
 *
 * One lock guards both sides (queues, the thread's reads into posted
 * buffers and writes from queued sends); each peer's send lock serializes
 * the dial of its connection.
 *
 * Why a transport needs the byte stream to carry point-to-point: a ring
 * link is driven by a thread that waits on it in lockstep with one other
 * link, where a wait that blocks is right (shm's waits sleep on head and
 * tail, tcp's send_now sleeps while the wire is full). Here one thread
 * serves every peer and must never block in a send (two ranks each
 * sending to the other first would deadlock if their threads slept in
 * send_now), and the early-memory cap holds one sender back without
 * stalling the others: a send that returns at once with what the link
 * took, and a readiness hook for the thread's poll, are what the table
 * needed.
 */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "secret.h"
#include "kernels.h"
#include "net.h"
#include "settings.h"
#include "sock.h"

#define P2P_MAGIC 0x70327062u /* "bp2p" */
#define P2P_CHANS 2
#define P2P_DISCARD_BYTES 65536
/* Bytes read from or written to one peer before the others get a turn. */
#define P2P_BUDGET (4u << 20)
#define P2P_DIAL_MS 3000 /* a listener that refuses this long is a dead rank */
#define P2P_CUT_MS 1000  /* how long a notice of a send cut short may take */
#define P2P_BELL 1       /* a doorbell's byte */
/* The listener stays open for the communicator's life: strangers that
 * never say hello may hold this many descriptors, each for
 * BRG__NET_HELLO_MS (the ring's listeners close after init). */
#define P2P_MAX_PENDING 8
/* A link of the transport table: its slots (shm's FIFO, ibverbs' FIFOs
 * at both ends; a tcp stream's bytes wait in its socket), and what its
 * FIFO's name is told apart from the ring links' by (xor'ed into the
 * communicator's id). */
#define P2P_LINK_SLOTS 8
#define P2P_LINK_SLOT_BYTES (256u << 10)
#define P2P_LINK_ID UINT64_C(0x7032700000000000)
#define P2P_LINK_NAME 16

typedef struct p2p_hello {
  uint32_t magic;
  int32_t from, to;
  /* Nonzero: not a link but a notice on a connection of its own: the
   * sender cut the message it was sending on its link short, with this
   * brg_status, and closes its link next (cut_notice). */
  uint32_t cut;
  uint64_t comm_id;
  uint8_t secret[BRG__SECRET_BYTES];
  /* The transport of the table the frames are to travel on. The
   * receiver answers with a p2p_link_reply, the sender with a
   * p2p_link_ack: attached, or not and the next transport to try ("":
   * none, the connection is dropped). */
  char link[P2P_LINK_NAME];
} p2p_hello;

typedef struct p2p_link_ack {
  uint32_t magic;
  uint32_t attached; /* 1: the sender attached to the link the reply named */
  char next[P2P_LINK_NAME];
} p2p_link_ack;

typedef struct p2p_link_reply {
  uint32_t magic;
  int32_t status; /* BRG_SUCCESS: info is the link's, from recv_setup */
  char info[BRG__CONN_INFO_BYTES];
  char why[BRG__ERRLEN]; /* why not, otherwise */
} p2p_link_reply;

typedef struct p2p_hdr {
  uint32_t magic;
  uint32_t chan;
  uint64_t num;
  uint64_t count;
  uint32_t dtype;
  uint32_t tag; /* the user's (brg_send_tagged); all_to_all's blocks: 0 */
} p2p_hdr;

/* A message that arrived before its receive. */
typedef struct p2p_unexp {
  struct p2p_unexp *next;
  p2p_hdr h;
  char *data;
  uint64_t got;
  uint64_t early;   /* bytes it counts against the early cap */
  uint64_t arrival; /* its place among the messages that arrived early */
  int complete;
} p2p_unexp;

typedef struct p2p_peer {
  int rank;
  /* Links of the transport table the frames travel on, set with out_fd
   * and in_fd and kept until brg__p2p_free. On a link with doorbells (shm) the
   * connection carries the hello, the hang-up and one-byte doorbells
   * both ways: the sender's to wake a receiver waiting for bytes, the
   * receiver's (on the same connection, back) to wake a sender waiting
   * for room. A link with a descriptor of its own (tcp, ibverbs) is
   * polled there. */
  brg__conn out_link, in_link;
  /* Sending side. send_lock serializes the dial; out_fd is set once,
   * under both locks; the rest is under the p2p lock. */
  pthread_mutex_t send_lock;
  int out_fd;    /* non-blocking once the hello is out */
  uint64_t sent; /* user messages whose frame started */
  brg__p2p_op *sendq, *sendq_tail;
  p2p_hdr out_hdr;  /* the frame at the head of sendq */
  uint64_t out_off; /* its bytes written, header included */
  brg_status out_broken;
  char out_why[BRG__ERRLEN];
  /* Receiving side: the p2p lock. */
  int in_fd;
  /* A driver reads the link (drive_pass): the doorbells stay for the
   * thread, which may have armed the link and sleeps until they come. */
  int keep_bells;
  int held;       /* hdr is in but its message fits nowhere yet: in_fd is not read */
  int64_t hup_ns; /* it hung up out_fd before its own link came in */
  int watch_out;  /* the thread polls out_fd for a hang-up */
  /* A send on out_fd was cut short with this status: the receiver is to
   * be told (cut_notice), then out_fd shut down. */
  brg_status cut_pending;
  /* The peer said it cut its message in flight short, with this status:
   * the end of stream that follows is not its death. */
  brg_status cut_by_peer;
  p2p_hdr hdr;    /* the header being read */
  size_t hdr_got; /* its bytes read so far */
  int in_payload; /* a header is in and `left` payload bytes follow */
  uint64_t left;
  brg__p2p_op *cur_op;  /* where the payload lands: a posted receive, */
  p2p_unexp *cur_unexp; /* unexpected memory, or (neither) nowhere */
  uint64_t arrived;     /* user messages whose header came */
  brg__p2p_op *posted[P2P_CHANS], *posted_tail[P2P_CHANS];
  p2p_unexp *unexp[P2P_CHANS], *unexp_tail[P2P_CHANS];
  brg_status gone; /* the link from this peer is over */
  char gone_why[BRG__ERRLEN];
  /* What came on the connections (0: in_fd, 1: out_fd) besides doorbells:
   * the cause of the peer's stop (the first notice), or what was wrong
   * with what came (conn_drain). */
  brg__p2p_note_rx note_rx[2];
  char note[BRG__P2P_NOTE_MAX + 1];
  char note_bad[160];
} p2p_peer;

typedef struct brg__p2p {
  brg__net_door door; /* the listener and the connections still to say hello */
  int wake_fd;        /* eventfd: the thread looks again (new link, stop) */
  pthread_t thread;
  int armed;   /* the peer table is known: the thread may start */
  int refused; /* atomic: a start failed; the liveness thread stops watching the door */
  int started; /* atomic: the thread runs (started under start_lock) */
  int stop;
  pthread_mutex_t start_lock;
  pthread_mutex_t lock;
  pthread_cond_t cond; /* an operation finished or a peer went */
  p2p_peer **peer;     /* by rank, made at first use */
  int *active;         /* ranks with a link for the thread to poll */
  int nactive;
  uint64_t early_bytes;        /* user messages in early memory, bytes */
  uint64_t early_cap;          /* BRIGADE_P2P_EARLY_BYTES */
  brg__p2p_op *any, *any_tail; /* posted receives from any source */
  uint32_t posts;              /* receives posted, for their `order` */
  uint64_t arrivals;           /* messages that arrived early, for their `arrival` */
  /* Callers that drive the links themselves (brg__p2p_drive_begin): while
   * above 0 the thread leaves the links' bytes and room to them and
   * watches only the door and the hang-ups. */
  int driven;
  /* The thread's poll set was made while driven, without the links: it
   * must wake to watch them for anyone who waits (links_wanted). */
  int links_out;
  int noticed; /* brg__p2p_notify has written its notice */
  char discard[P2P_DISCARD_BYTES];
} brg__p2p;

static void wake_thread(brg__p2p *p) {
  uint64_t one = 1;
  ssize_t r = write(p->wake_fd, &one, sizeof one);
  (void)r; /* the counter saturating still wakes the thread */
}

/* Whether the thread's poll set lacks the links (made while a caller
 * drove them, brg__p2p_drive_begin) although nobody drives them now: a
 * receive posted or a wait begun must wake it. The caller holds the
 * lock. */
static int links_wanted(const brg__p2p *p) {
  return p->links_out && !p->driven;
}

/* A doorbell: one byte on the connection the other end polls. A full
 * socket already holds a ring the other end has yet to read. */
static void ring_bell(int fd) {
  char b = 1;
  ssize_t r = send(fd, &b, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
  (void)r;
}

size_t brg__p2p_note_make(char *buf, size_t bytes, const char *text) {
  if (!text || !text[0]) text = "(no cause given)";
  size_t len = strlen(text), head = len, gap = 0;
  if (len > BRG__P2P_NOTE_MAX) {
    /* A cause that came from further away (a stop's notice, an abort's)
     * ends the text: the end is kept whole. */
    head = BRG__P2P_NOTE_MAX / 3;
    gap = 5; /* " ... " */
  }
  size_t tail = len > BRG__P2P_NOTE_MAX ? BRG__P2P_NOTE_MAX - head - gap : 0;
  size_t n = head + gap + tail;
  if (bytes < 3 + n) return 0;
  buf[0] = (char)BRG__P2P_NOTE_MARK;
  buf[1] = (char)(n & 0xff);
  buf[2] = (char)(n >> 8);
  memcpy(buf + 3, text, head);
  memcpy(buf + 3 + head, " ... ", gap);
  memcpy(buf + 3 + head + gap, text + len - tail, tail);
  return 3 + n;
}

static int note_bad(brg__p2p_note_rx *rx, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int note_bad(brg__p2p_note_rx *rx, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(rx->why, sizeof rx->why, fmt, ap);
  va_end(ap);
  rx->state = -1;
  return -1;
}

int brg__p2p_note_take(brg__p2p_note_rx *rx, const void *buf, size_t n) {
  const unsigned char *b = buf;
  int complete = 0;
  for (size_t i = 0; i < n; i++) {
    unsigned x = b[i];
    switch (rx->state) {
    case 0:
      if (x == P2P_BELL) break;
      if (x != BRG__P2P_NOTE_MARK)
        return note_bad(rx, "byte 0x%02x is neither a doorbell nor the start of a notice", x);
      rx->state = 1;
      break;
    case 1:
      rx->len = x;
      rx->state = 2;
      break;
    case 2:
      rx->len |= x << 8;
      if (rx->len == 0 || rx->len > BRG__P2P_NOTE_MAX)
        return note_bad(rx, "a notice of %u bytes (1 to %d are allowed)", rx->len,
                        BRG__P2P_NOTE_MAX);
      rx->got = 0;
      rx->state = 3;
      break;
    case 3:
      /* The first notice's text is kept; a later one is read past. */
      if (!rx->done) rx->text[rx->got] = x < 0x20 || x == 0x7f ? '?' : (char)x;
      if (++rx->got < rx->len) break;
      if (!rx->done) rx->text[rx->got] = 0;
      rx->done = complete = 1;
      rx->state = 0;
      break;
    default: return -1;
    }
  }
  return rx->state < 0 ? -1 : complete;
}

int brg__p2p_note_ended(brg__p2p_note_rx *rx) {
  if (rx->state < 0) return -1;
  if (rx->state == 0) return 0;
  return note_bad(rx, "the connection ended %u bytes into a notice",
                  rx->state == 3 ? 3 + rx->got : (unsigned)rx->state);
}

/* Reads what waits on one of the peer's connections (which: 0 its in_fd,
 * 1 its out_fd): doorbells, and the notice of the peer's stop, whose text
 * is kept (pr->note, the first). 1 while the connection is open; 0 at
 * its end, when it broke (a reset is an end: the connection carries no
 * data), or when what came is malformed (pr->note_bad says how). The
 * caller holds the lock. */
static int conn_drain(p2p_peer *pr, int which) {
  int fd = which ? pr->out_fd : pr->in_fd;
  brg__p2p_note_rx *rx = &pr->note_rx[which];
  char b[512];
  int open = 0;
  while (fd >= 0 && rx->state >= 0) {
    ssize_t n = recv(fd, b, sizeof b, MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n > 0) {
      brg__p2p_note_take(rx, b, (size_t)n);
      continue;
    }
    open = n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
    if (!open) brg__p2p_note_ended(rx);
    break;
  }
  if (rx->done && !pr->note[0]) snprintf(pr->note, sizeof pr->note, "%s", rx->text);
  if (rx->state < 0 && !pr->note_bad[0]) snprintf(pr->note_bad, sizeof pr->note_bad, "%s", rx->why);
  return open && rx->state >= 0;
}

/* A link with a descriptor of its own ended or broke: the notice of the
 * peer's stop, when it sent one, came on its connections before (it wrote
 * it as it stopped, and closes its connections before its links). Read
 * there, waiting up to wait_ms while one is still open and none has
 * come. The caller holds the lock. */
static void note_look(p2p_peer *pr, int wait_ms) {
  int64_t deadline = brg__deadline_ms(wait_ms);
  for (;;) {
    struct pollfd fds[2];
    nfds_t n = 0;
    for (int w = 0; w < 2; w++)
      if (conn_drain(pr, w))
        fds[n++] = (struct pollfd){.fd = w ? pr->out_fd : pr->in_fd, .events = POLLIN};
    int ms = brg__ms_left(deadline);
    if (pr->note[0] || pr->note_bad[0] || n == 0 || ms <= 0) return;
    if (poll(fds, n, ms) < 0 && errno != EINTR) return;
  }
}

/* Why the peer hung up, for what fails with it: the cause it gave when it
 * stopped (brg__p2p_notify), what was wrong with what came on its
 * connection, or else what fmt says. The caller holds the lock. */
static void hup_why(brg_comm *c, const p2p_peer *pr, char *why, size_t bytes, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void hup_why(brg_comm *c, const p2p_peer *pr, char *why, size_t bytes, const char *fmt,
                    ...) {
  const brg__peer_info *pi = &c->peers[pr->rank];
  if (pr->note_bad[0]) {
    snprintf(why, bytes,
             "rank %d (pid %d on %s) sent a malformed notice on its point-to-point connection: %s",
             pr->rank, pi->pid, pi->hostname, pr->note_bad);
  } else if (pr->note[0]) {
    snprintf(why, bytes, "rank %d (pid %d on %s) stopped: %s", pr->rank, pi->pid, pi->hostname,
             pr->note);
  } else {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, bytes, fmt, ap);
    va_end(ap);
  }
}

/* Whether a table link is rung with doorbells on the connection (shm,
 * whose bytes arrive in memory) rather than polled on a descriptor of
 * its own (ready_fd: tcp's socket, ibverbs' eventfd). */
static int link_bells(const brg__conn *l) {
  return l->ops && !l->ops->ready_fd;
}

/* What poll watches for bytes from this peer: its link's descriptor, or
 * the connection (the frames, or a link's doorbells and hang-up). */
static int in_poll_fd(p2p_peer *pr, short *events) {
  *events = POLLIN;
  return pr->in_link.ops && pr->in_link.ops->ready_fd
             ? pr->in_link.ops->ready_fd(&pr->in_link, events)
             : pr->in_fd;
}

/* The bytes under a peer's frames, as recv() and send() on a
 * non-blocking socket would give them: -1 with EAGAIN when nothing moves now,
 * -1 with another errno when the link broke, 0 from link_recv at the end
 * of the stream. On a link with doorbells (shm) the end is the
 * connection's, once what the link holds is read: the sender publishes
 * before it hangs up; a link with a descriptor of its own (tcp,
 * ibverbs) ends itself.
 * The caller holds the p2p lock. */
static ssize_t link_recv(p2p_peer *pr, void *dst, size_t want) {
  brg__conn *l = &pr->in_link;
  for (int pass = 0; pass < 2; pass++) {
    int ring = 0;
    ssize_t n = l->ops->try_recv(l, dst, want, &ring);
    if (ring) ring_bell(pr->in_fd);
    if (n > 0) return n;
    if (n == BRG__STREAM_ENDED) return 0;
    if (n < 0) return -1; /* broken: errno says why */
    if (!link_bells(l)) {
      errno = EAGAIN;
      return -1;
    }
    if (pass == 0 && (pr->keep_bells || conn_drain(pr, 0))) {
      errno = EAGAIN;
      return -1;
    }
  }
  return 0;
}

static ssize_t link_send(p2p_peer *pr, const void *src, size_t want) {
  brg__conn *l = &pr->out_link;
  int ring = 0;
  ssize_t n = l->ops->try_send(l, src, want, &ring);
  if (ring) ring_bell(pr->out_fd);
  if (n > 0) return n;
  if (n < 0) return -1; /* broken: errno says why */
  errno = EAGAIN;
  return -1;
}

/* What a link of the table between this rank and `peer` is set up with. */
static brg__conn_params link_params(brg_comm *c, int peer) {
  return (brg__conn_params){.rank = c->rank,
                            .peer = peer,
                            .nranks = c->nranks,
                            .self_info = &c->peers[c->rank],
                            .peer_info = &c->peers[peer],
                            .nslots = P2P_LINK_SLOTS,
                            .slot_bytes = P2P_LINK_SLOT_BYTES,
                            .comm_id = c->comm_id ^ P2P_LINK_ID,
                            .secret = brg__bootstrap_secret(c->bs),
                            .timeout_ms = c->timeout_ms,
                            .stream = 1};
}

/* Whether a transport can carry point-to-point: the byte stream that
 * never blocks (try_send, try_recv, ready; with a descriptor of its own,
 * its end too). */
static int link_capable(const brg__transport_ops *t) {
  return t && t->try_send && t->try_recv && t->ready && (!t->ready_fd || t->end);
}

/* The peer's state, made at first use; the caller holds the p2p lock. */
static p2p_peer *get_peer(brg_comm *c, int rank) {
  brg__p2p *p = c->p2p;
  if (p->peer[rank]) return p->peer[rank];
  p2p_peer *pr = calloc(1, sizeof *pr);
  if (!pr) return NULL;
  pthread_mutex_init(&pr->send_lock, NULL);
  pr->rank = rank;
  pr->out_fd = -1;
  pr->in_fd = -1;
  p->peer[rank] = pr;
  p->active[p->nactive++] = rank;
  return pr;
}

static p2p_peer *peer_locked(brg_comm *c, int rank) {
  pthread_mutex_lock(&c->p2p->lock);
  p2p_peer *pr = get_peer(c, rank);
  pthread_mutex_unlock(&c->p2p->lock);
  return pr;
}

static void op_finish(brg__p2p *p, brg__p2p_op *op, brg_status s) {
  op->status = s;
  __atomic_store_n(&op->done, 1, __ATOMIC_RELEASE);
  pthread_cond_broadcast(&p->cond);
}

/* An operation that never reached a queue: nobody else sees it. */
static void op_finish_quiet(brg__p2p_op *op, brg_status s) {
  op->status = s;
  __atomic_store_n(&op->done, 1, __ATOMIC_RELEASE);
}

/* Whether a message fits the receive: count and dtype, and for
 * all_to_all the collective's number. */
static int op_matches(const brg__p2p_op *op, const p2p_hdr *h) {
  return op->count == h->count && op->dtype == h->dtype &&
         (op->chan != BRG__P2P_A2A || op->num == h->num);
}

static void op_mismatch(brg__p2p *p, brg__p2p_op *op, const p2p_hdr *h) {
  op->peer_count = h->count;
  op->peer_dtype = (uint8_t)h->dtype; /* below BRG_NUM_DTYPES: hdr_valid */
  op->peer_num = h->num;
  op_finish(p, op, BRG_ERR_MISMATCH);
}

static void push_op(p2p_peer *pr, brg__p2p_op *op) {
  op->next = NULL;
  if (pr->posted_tail[op->chan])
    pr->posted_tail[op->chan]->next = op;
  else
    pr->posted[op->chan] = op;
  pr->posted_tail[op->chan] = op;
}

static brg__p2p_op *pop_op(p2p_peer *pr, uint32_t chan) {
  brg__p2p_op *op = pr->posted[chan];
  if (!op) return NULL;
  pr->posted[chan] = op->next;
  if (!op->next) pr->posted_tail[chan] = NULL;
  return op;
}

/* The first operation of a queue that takes messages of `tag`, and the
 * one before it (NULL when it is the head). */
static brg__p2p_op *find_tag(brg__p2p_op *head, uint32_t tag, brg__p2p_op **prev) {
  *prev = NULL;
  for (brg__p2p_op *op = head; op; *prev = op, op = op->next)
    if (op->tag == tag) return op;
  return NULL;
}

/* Takes op (after prev, or the head) out of a queue. */
static void unlink_op(brg__p2p_op **head, brg__p2p_op **tail, brg__p2p_op *prev, brg__p2p_op *op) {
  if (prev)
    prev->next = op->next;
  else
    *head = op->next;
  if (*tail == op) *tail = prev;
  op->next = NULL;
}

/* The receive a message of `tag` from pr on chan goes to (NULL: none is
 * posted): the peer's oldest for that tag, or the oldest from any source
 * for that tag when that was posted first; taken out of its queue with
 * `take`. Receives of other tags wait on: tags are matched per (source,
 * tag), each in order. */
static brg__p2p_op *next_recv(brg__p2p *p, p2p_peer *pr, uint32_t chan, uint32_t tag, int take) {
  brg__p2p_op *prev, *any_prev = NULL;
  brg__p2p_op *op = find_tag(pr->posted[chan], tag, &prev);
  brg__p2p_op *any = chan == BRG__P2P_USER ? find_tag(p->any, tag, &any_prev) : NULL;
  if (!any || (op && (int32_t)(op->order - any->order) < 0)) {
    if (take && op) unlink_op(&pr->posted[chan], &pr->posted_tail[chan], prev, op);
    return op;
  }
  if (take) {
    unlink_op(&p->any, &p->any_tail, any_prev, any);
    any->peer = pr->rank;
  }
  return any;
}

/* The first message of `tag` from pr in early memory, and the one before
 * it. */
static p2p_unexp *find_early(p2p_peer *pr, uint32_t chan, uint32_t tag, p2p_unexp **prev) {
  *prev = NULL;
  for (p2p_unexp *u = pr->unexp[chan]; u; *prev = u, u = u->next)
    if (u->h.tag == tag) return u;
  return NULL;
}

/* The link from this peer is over: what waits on it fails. Messages that
 * arrived whole stay for their receives. */
static void peer_gone(brg__p2p *p, p2p_peer *pr, brg_status s, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void peer_gone(brg__p2p *p, p2p_peer *pr, brg_status s, const char *fmt, ...) {
  if (pr->gone) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(pr->gone_why, sizeof pr->gone_why, fmt, ap);
  va_end(ap);
  pr->gone = s;
  pr->watch_out = 0;
  brg__sock_close(&pr->in_fd);
  if (pr->cur_op) op_finish(p, pr->cur_op, s);
  pr->cur_op = NULL;
  pr->cur_unexp = NULL; /* stays in the queue, incomplete: its receive fails */
  pr->in_payload = 0;
  pr->held = 0;
  for (uint32_t ch = 0; ch < P2P_CHANS; ch++)
    for (brg__p2p_op *op; (op = pop_op(pr, ch));) op_finish(p, op, s);
  pthread_cond_broadcast(&p->cond);
}

/* Whether a user message of `bytes` may wait in early memory: under the
 * cap, or any size when none is in use. */
static int early_fits(const brg__p2p *p, uint64_t bytes) {
  return p->early_bytes == 0 ||
         (p->early_bytes <= p->early_cap && bytes <= p->early_cap - p->early_bytes);
}

/* A header came (from the wire, or from this rank to itself): decides
 * where its payload lands. 0; 1 when it may land nowhere yet (no receive,
 * early memory full: the caller holds it and retries); -1 when no memory
 * could take it. */
static int begin_message(brg__p2p *p, p2p_peer *pr, const p2p_hdr *h) {
  uint64_t bytes = h->count * brg_dtype_size((brg_dtype)h->dtype);
  p2p_unexp *before;
  int direct = !find_early(pr, h->chan, h->tag, &before) && next_recv(p, pr, h->chan, h->tag, 0);
  if (!direct && h->chan == BRG__P2P_USER && !early_fits(p, bytes)) return 1;
  pr->cur_op = NULL;
  pr->cur_unexp = NULL;
  pr->left = bytes;
  pr->in_payload = 1;
  if (direct) {
    brg__p2p_op *op = next_recv(p, pr, h->chan, h->tag, 1);
    op->num = op->chan == BRG__P2P_A2A ? op->num : h->num;
    if (op_matches(op, h))
      pr->cur_op = op;
    else
      op_mismatch(p, op, h); /* and the payload goes nowhere */
    return 0;
  }
  p2p_unexp *u = calloc(1, sizeof *u);
  if (!u || (bytes && !(u->data = malloc(bytes)))) {
    free(u);
    return -1;
  }
  u->h = *h;
  u->early = h->chan == BRG__P2P_USER ? bytes : 0;
  u->arrival = p->arrivals++;
  p->early_bytes += u->early;
  if (pr->unexp_tail[h->chan])
    pr->unexp_tail[h->chan]->next = u;
  else
    pr->unexp[h->chan] = u;
  pr->unexp_tail[h->chan] = u;
  pr->cur_unexp = u;
  return 0;
}

static void end_message(brg__p2p *p, p2p_peer *pr) {
  if (pr->cur_op) op_finish(p, pr->cur_op, BRG_SUCCESS);
  if (pr->cur_unexp) {
    pr->cur_unexp->complete = 1;
    pthread_cond_broadcast(&p->cond);
  }
  pr->cur_op = NULL;
  pr->cur_unexp = NULL;
  pr->in_payload = 0;
  pr->hdr_got = 0;
}

/* Where the next payload bytes of the current message land, and how many
 * may land there at once. */
static char *payload_dest(brg__p2p *p, p2p_peer *pr, uint64_t *room) {
  if (pr->cur_op) {
    *room = pr->left;
    return pr->cur_op->buf + pr->cur_op->got;
  }
  if (pr->cur_unexp) {
    *room = pr->left;
    return pr->cur_unexp->data + pr->cur_unexp->got;
  }
  *room = pr->left < P2P_DISCARD_BYTES ? pr->left : P2P_DISCARD_BYTES;
  return p->discard;
}

static void payload_landed(p2p_peer *pr, uint64_t n) {
  pr->left -= n;
  if (pr->cur_op) {
    pr->cur_op->got += n;
    pr->cur_op->last_ns = brg__now_ns();
  } else if (pr->cur_unexp) {
    pr->cur_unexp->got += n;
  }
}

static int hdr_valid(const p2p_hdr *h) {
  if (h->magic != P2P_MAGIC || h->chan >= P2P_CHANS || h->dtype >= BRG_NUM_DTYPES) return 0;
  return h->count <= (UINT64_C(1) << 60) / brg_dtype_size((brg_dtype)h->dtype);
}

static void no_memory(brg_comm *c, p2p_peer *pr, int rank) {
  peer_gone(c->p2p, pr, BRG_ERR_NO_MEMORY,
            "out of memory for a message of %llu x %s from rank %d, which arrived before "
            "its receive",
            (unsigned long long)pr->hdr.count, brg_dtype_name((brg_dtype)pr->hdr.dtype), rank);
}

/* A held header tries again for a place to land; the caller holds the
 * lock. */
static void resume_held(brg_comm *c, p2p_peer *pr, int rank) {
  brg__p2p *p = c->p2p;
  int rc = begin_message(p, pr, &pr->hdr);
  if (rc == 1) return;
  pr->held = 0;
  if (rc != 0)
    no_memory(c, pr, rank);
  else if (pr->left == 0)
    end_message(p, pr);
}

/* Reads what the peer sent, up to a budget; the caller holds the lock. */
static void read_peer(brg_comm *c, p2p_peer *pr, int rank) {
  brg__p2p *p = c->p2p;
  size_t budget = P2P_BUDGET;
  while (budget > 0 && pr->in_fd >= 0) {
    char *dest;
    uint64_t want;
    if (!pr->in_payload) {
      dest = (char *)&pr->hdr + pr->hdr_got;
      want = sizeof pr->hdr - pr->hdr_got;
    } else {
      dest = payload_dest(p, pr, &want);
      if (want > budget) want = budget;
    }
    ssize_t n = link_recv(pr, dest, want);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    /* It hung up: the cause it gave, if it stopped, came first on the
     * connection (a link with doorbells ends with it: read already; one
     * that said it cut its send short is alive, and its connections stay
     * open: no wait). */
    if (n <= 0 && !link_bells(&pr->in_link))
      note_look(pr, pr->cut_by_peer ? 0 : BRG__NOTE_GRACE_MS);
    char why[BRG__ERRLEN];
    if (n <= 0 && (pr->in_payload || pr->hdr_got > 0) && pr->cut_by_peer) {
      /* It said so first (cut_notice): alive, and its send gave up (its
       * link then ended, or broke when it closed before this end read
       * what the link still held). */
      hup_why(c, pr, why, sizeof why,
              "rank %d (pid %d on %s) is alive and cut its send of %llu x %s short: %s", rank,
              c->peers[rank].pid, c->peers[rank].hostname, (unsigned long long)pr->hdr.count,
              brg_dtype_name((brg_dtype)pr->hdr.dtype),
              pr->cut_by_peer == BRG_ERR_TIMEOUT
                  ? "its wait timed out (no receive posted here for it, early memory "
                    "BRIGADE_P2P_EARLY_BYTES full)"
              : pr->cut_by_peer == BRG_ERR_ABORTED ? "its communicator was aborted"
                                                   : brg_status_string(pr->cut_by_peer));
      peer_gone(p, pr, BRG_ERR_REMOTE, "%s", why);
      return;
    }
    if (n == 0 && (pr->in_payload || pr->hdr_got > 0)) {
      hup_why(c, pr, why, sizeof why,
              "rank %d (pid %d on %s) hung up in the middle of a message of %llu x %s without "
              "saying why: it died or destroyed its communicator",
              rank, c->peers[rank].pid, c->peers[rank].hostname, (unsigned long long)pr->hdr.count,
              brg_dtype_name((brg_dtype)pr->hdr.dtype));
      peer_gone(p, pr, BRG_ERR_REMOTE, "%s", why);
      return;
    }
    if (n <= 0) {
      hup_why(c, pr, why, sizeof why,
              "rank %d (pid %d on %s) hung up (%s): it died or destroyed its communicator", rank,
              c->peers[rank].pid, c->peers[rank].hostname,
              n == 0 ? "end of stream" : strerror(errno));
      peer_gone(p, pr, BRG_ERR_REMOTE, "%s", why);
      return;
    }
    budget -= (size_t)n;
    if (!pr->in_payload) {
      pr->hdr_got += (size_t)n;
      if (pr->hdr_got < sizeof pr->hdr) continue;
      if (!hdr_valid(&pr->hdr) || (pr->hdr.chan == BRG__P2P_USER && pr->hdr.num != pr->arrived)) {
        peer_gone(p, pr, BRG_ERR_REMOTE, "rank %d sent a malformed message header", rank);
        return;
      }
      if (pr->hdr.chan == BRG__P2P_USER) pr->arrived++;
      int rc = begin_message(p, pr, &pr->hdr);
      if (rc == 1) {
        /* No room: the rest stays in the link until a receive is posted
         * or early memory is freed (resume_held). */
        pr->held = 1;
        BRG__TRACE("p2p",
                   "rank %d: holding a message of %llu x %s from rank %d: %llu bytes of early "
                   "memory in use, BRIGADE_P2P_EARLY_BYTES is %llu",
                   c->rank, (unsigned long long)pr->hdr.count,
                   brg_dtype_name((brg_dtype)pr->hdr.dtype), rank,
                   (unsigned long long)p->early_bytes, (unsigned long long)p->early_cap);
        return;
      }
      if (rc != 0) {
        no_memory(c, pr, rank);
        return;
      }
    } else {
      payload_landed(pr, (uint64_t)n);
    }
    if (pr->in_payload && pr->left == 0) end_message(p, pr);
  }
}

/* The link to this peer is over: every queued send fails, and so does
 * every later one. The caller holds the lock. */
static void sendq_fail(brg__p2p *p, p2p_peer *pr, brg_status s, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void sendq_fail(brg__p2p *p, p2p_peer *pr, brg_status s, const char *fmt, ...) {
  if (!pr->out_broken) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pr->out_why, sizeof pr->out_why, fmt, ap);
    va_end(ap);
    pr->out_broken = s;
  }
  for (brg__p2p_op *op; (op = pr->sendq);) {
    pr->sendq = op->next;
    op_finish(p, op, pr->out_broken);
  }
  pr->sendq_tail = NULL;
  pr->out_off = 0;
}

/* Writes the peer's queued sends until the link takes no more, up to a
 * budget; the caller holds the lock. Runs on the thread as room comes and
 * on the caller of brg__p2p_isend. */
static void write_peer(brg_comm *c, p2p_peer *pr, int rank) {
  brg__p2p *p = c->p2p;
  size_t budget = P2P_BUDGET;
  while (pr->sendq && pr->out_fd >= 0 && !pr->out_broken && budget > 0) {
    brg__p2p_op *op = pr->sendq;
    uint64_t bytes = op->count * brg_dtype_size((brg_dtype)op->dtype);
    if (pr->out_off == 0) {
      /* A user message takes its number when its frame's first byte
       * leaves (below): a send withdrawn before that leaves no gap, and
       * one whose link was full at its start keeps its number. */
      if (op->chan == BRG__P2P_USER) op->num = pr->sent;
      pr->out_hdr = (p2p_hdr){.magic = P2P_MAGIC,
                              .chan = op->chan,
                              .num = op->num,
                              .count = op->count,
                              .dtype = op->dtype,
                              .tag = op->tag};
    }
    const char *src;
    uint64_t want;
    if (pr->out_off < sizeof pr->out_hdr) {
      src = (const char *)&pr->out_hdr + pr->out_off;
      want = sizeof pr->out_hdr - pr->out_off;
    } else {
      uint64_t done = pr->out_off - sizeof pr->out_hdr;
      src = op->buf + done;
      want = bytes - done;
      if (want > budget) want = budget;
    }
    if (want > 0) {
      ssize_t n = link_send(pr, src, want);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      if (n <= 0) {
        /* The cause it gave, if it stopped, came on a connection first. */
        int e = errno;
        char why[BRG__ERRLEN];
        note_look(pr, BRG__NOTE_GRACE_MS);
        hup_why(c, pr, why, sizeof why, "rank %d (pid %d on %s) is gone: %s", rank,
                c->peers[rank].pid, c->peers[rank].hostname,
                n < 0 ? strerror(e) : "the link took nothing");
        sendq_fail(p, pr, BRG_ERR_REMOTE, "%s", why);
        return;
      }
      if (pr->out_off == 0 && op->chan == BRG__P2P_USER) pr->sent++;
      pr->out_off += (uint64_t)n;
      budget -= (size_t)n;
      op->last_ns = brg__now_ns();
      if (pr->out_off > sizeof pr->out_hdr) op->got = pr->out_off - sizeof pr->out_hdr;
    }
    if (pr->out_off == sizeof pr->out_hdr + bytes) {
      pr->sendq = op->next;
      if (!pr->sendq) pr->sendq_tail = NULL;
      pr->out_off = 0;
      op->got = bytes;
      op_finish(p, op, BRG_SUCCESS);
    }
  }
}

/* Takes a send that will not finish out of the queue; one cut short leaves
 * the stream unreadable, so the link is over. The caller holds the lock. */
static void withdraw_send(brg__p2p *p, p2p_peer *pr, brg__p2p_op *op, brg_status s) {
  if (pr->sendq == op && pr->out_off > 0) {
    sendq_fail(p, pr, s, "a send to this rank was cut short (%s) and left the link unreadable",
               brg_status_string(s));
    /* The receiver learns it at once, mid-message, rather than at its
     * own timeout or this rank's exit: told why, then the link shut down
     * (cut_notice, outside the lock). */
    if (pr->out_fd >= 0) pr->cut_pending = s;
    return;
  }
  brg__p2p_op **pp = &pr->sendq, *prev = NULL;
  while (*pp && *pp != op) {
    prev = *pp;
    pp = &(*pp)->next;
  }
  if (!*pp) return;
  *pp = op->next;
  if (pr->sendq_tail == op) pr->sendq_tail = prev;
}

/* The receiving end of the table link a hello asks for (fd is
 * blocking): sets it up, tells the sender where it is (or why not) and
 * waits for the sender's word: attached, or the next transport to try.
 * 1 with *link set; 0 when the connection is to be dropped (no link
 * could be had, or the sender went). */
static int link_accept(brg_comm *c, int fd, const p2p_hello *h, brg__conn *link) {
  char name[P2P_LINK_NAME];
  memcpy(name, h->link, sizeof name);
  name[sizeof name - 1] = 0;
  brg__conn_params prm = link_params(c, h->from);
  /* A transport at a time, each tried once. */
  for (int round = 0; name[0] && brg__transports[round]; round++) {
    const brg__transport_ops *t = NULL;
    for (int i = 0; brg__transports[i]; i++)
      if (!strcmp(brg__transports[i]->name, name)) t = brg__transports[i];
    p2p_link_reply rep = {.magic = P2P_MAGIC};
    if (!link_capable(t) || !brg__transport_allowed(c->transports, name) ||
        !t->can_connect(&c->peers[h->from], &c->peers[c->rank])) {
      rep.status = BRG_ERR_UNAVAILABLE;
      snprintf(rep.why, sizeof rep.why,
               "transport \"%s\" cannot carry point-to-point from rank %d to rank %d here", name,
               h->from, c->rank);
    } else {
      brg__errbuf e = {0};
      link->ops = t;
      rep.status = t->recv_setup(link, &prm, rep.info, &e);
      if (rep.status != BRG_SUCCESS) snprintf(rep.why, sizeof rep.why, "%s", e.msg);
    }
    if (rep.status != BRG_SUCCESS && link->ops) {
      link->ops->close(link);
      link->ops = NULL;
    }
    int64_t deadline = brg__deadline_ms(c->timeout_ms);
    p2p_link_ack ack;
    if (brg__sock_send_all(fd, &rep, sizeof rep, deadline, NULL) != BRG__IO_OK ||
        brg__sock_recv_all(fd, &ack, sizeof ack, deadline) != BRG__IO_OK ||
        ack.magic != P2P_MAGIC || (ack.attached && !link->ops)) {
      BRG__WARN("p2p", "rank %d: rank %d dropped its connection while setting up its %s link",
                c->rank, h->from, name);
      if (link->ops) link->ops->close(link);
      link->ops = NULL;
      return 0;
    }
    if (ack.attached) {
      brg__errbuf e = {0};
      if (link->ops->recv_connect(link, &prm, &e) == BRG_SUCCESS) return 1;
      BRG__WARN("p2p", "rank %d: the %s link from rank %d: %s", c->rank, name, h->from, e.msg);
      link->ops->close(link);
      link->ops = NULL;
      return 0; /* the sender writes to it: the connection cannot go on */
    }
    if (link->ops) link->ops->close(link);
    link->ops = NULL;
    memcpy(name, ack.next, sizeof name);
    name[sizeof name - 1] = 0;
  }
  return 0;
}

/* A complete hello on a connection the listener's door took in (fd is
 * blocking now): kept when it names this rank and comes from another rank
 * of this communicator that has no link to it yet. */
static int hello_take(void *arg, const brg__conn_params *unused, int fd, const void *hello,
                      const char *from) {
  (void)unused;
  brg_comm *c = arg;
  p2p_hello h;
  memcpy(&h, hello, sizeof h);
  int ok = h.magic == P2P_MAGIC && h.to == c->rank && h.from >= 0 && h.from < c->nranks &&
           h.from != c->rank && h.comm_id == c->comm_id &&
           brg__ct_equal(h.secret, brg__bootstrap_secret(c->bs), BRG__SECRET_BYTES);
  if (!ok) {
    BRG__WARN("p2p",
              "rank %d: refused a point-to-point connection from %s: not a rank of this "
              "communicator",
              c->rank, from);
    return 0;
  }
  brg__p2p *p = c->p2p;
  if (h.cut) {
    /* Noted before the answer, which the sender waits for before it
     * closes its link: the end of that link is read after this. */
    pthread_mutex_lock(&p->lock);
    p2p_peer *pr = get_peer(c, h.from);
    if (pr) pr->cut_by_peer = (brg_status)h.cut;
    pthread_mutex_unlock(&p->lock);
    char ack = 1;
    ssize_t w = send(fd, &ack, 1, MSG_NOSIGNAL);
    (void)w; /* without the answer the sender closes its link all the same */
    BRG__INFO("p2p", "rank %d: rank %d cut a send to it short (%s)", c->rank, h.from,
              brg_status_string((brg_status)h.cut));
    return 0;
  }
  brg__conn link = {.peer = h.from};
  if (!h.link[0]) {
    BRG__WARN("p2p", "rank %d: refused a point-to-point connection from rank %d that names no link",
              c->rank, h.from);
    return 0;
  }
  if (!link_accept(c, fd, &h, &link)) return 0;
  if (brg__sock_set_blocking(fd, 0) != 0) {
    BRG__WARN("p2p", "rank %d: dropped the link from rank %d: fcntl: %s", c->rank, h.from,
              strerror(errno));
    link.ops->close(&link);
    return 0;
  }
  pthread_mutex_lock(&p->lock);
  p2p_peer *pr = get_peer(c, h.from);
  int kept = pr && pr->in_fd < 0 && !pr->gone;
  if (kept) {
    pr->in_fd = fd;
    pr->in_link = link;
  }
  pthread_mutex_unlock(&p->lock);
  if (!kept) link.ops->close(&link);
  if (kept)
    BRG__INFO("p2p", "rank %d: link from rank %d over %s", c->rank, h.from, link.ops->name);
  else
    BRG__WARN("p2p", "rank %d: refused a second point-to-point connection from rank %d (%s)",
              c->rank, h.from, from);
  return kept;
}

/* POLLIN on a connection this rank only writes: doorbells (a link with
 * them), the cause of the peer's stop (kept for the hang-up that follows)
 * or its hang-up. What it sent on its own link is read to that link's
 * end first, so only a peer that never linked to this rank is gone from
 * this alone, and only once a connection it made just before could have
 * said hello (hup_check). */
static void check_out(brg_comm *c, p2p_peer *pr, int rank) {
  if (conn_drain(pr, 1)) return;
  pr->watch_out = 0;
  char why[BRG__ERRLEN];
  hup_why(c, pr, why, sizeof why,
          "rank %d (pid %d on %s) hung up: it died or destroyed its communicator", rank,
          c->peers[rank].pid, c->peers[rank].hostname);
  sendq_fail(c->p2p, pr, BRG_ERR_REMOTE, "%s", why);
  if (pr->in_fd < 0) pr->hup_ns = brg__now_ns();
}

/* A peer that hung up without a link to this rank: gone once the door has
 * had time to take a connection it made before. 1 while still waiting. */
static int hup_check(brg__p2p *p, p2p_peer *pr) {
  if (!pr->hup_ns || pr->gone) return 0;
  if (pr->in_fd >= 0) {
    pr->hup_ns = 0; /* its link came: its own end of stream tells */
    return 0;
  }
  if (brg__now_ns() - pr->hup_ns < (int64_t)(BRG__NET_HELLO_MS + 100) * 1000000) return 1;
  peer_gone(p, pr, BRG_ERR_REMOTE, "%s", pr->out_why);
  return 0;
}

static void *p2p_main(void *arg) {
  brg_comm *c = arg;
  brg__p2p *p = c->p2p;
  brg__log_set_thread_rank(c->rank);
  /* Per peer: what it sends here, the connection to it, and the link to
   * it where that has a descriptor of its own. */
  size_t cap = 1 + BRG__NET_DOOR_FDS + 3 * (size_t)c->nranks;
  struct pollfd *fds = calloc(cap, sizeof *fds);
  int *who = calloc(cap, sizeof *who);
  /* 1: a table link is ready at once, whatever poll says of its fd. */
  char *now = calloc(cap, 1);
  /* What each entry is: IN, OUT (the connection), OUT_LINK (the link's
   * own descriptor, for room). */
  enum { IN, OUT, OUT_LINK };
  char *kind = calloc(cap, 1);
  if (!fds || !who || !now || !kind) {
    BRG__WARN("p2p", "rank %d: out of memory for the point-to-point thread", c->rank);
    free(fds);
    free(who);
    free(now);
    free(kind);
    return NULL;
  }
  pthread_mutex_lock(&p->lock);
  while (!p->stop) {
    /* The door is the thread's own: served without the lock. */
    pthread_mutex_unlock(&p->lock);
    int wait_ms = brg__ms_left_capped(brg__net_door_expire(&p->door), 1000);
    fds[0] = (struct pollfd){.fd = p->wake_fd, .events = POLLIN};
    int door = brg__net_door_fds(&p->door, fds + 1), n = 1 + door;
    pthread_mutex_lock(&p->lock);
    for (int i = 0; i < p->nactive; i++) {
      int rank = p->active[i];
      p2p_peer *pr = p->peer[rank];
      if (hup_check(p, pr) && wait_ms > 50) wait_ms = 50;
      if (pr->held) resume_held(c, pr, rank);
      if (pr->in_fd >= 0 && !pr->held && !p->driven) {
        /* A link with doorbells is armed before the sleep: its sender
         * rings once it publishes. */
        now[n] = link_bells(&pr->in_link) && pr->in_link.ops->ready(&pr->in_link, 0, 1);
        who[n] = rank;
        kind[n] = IN;
        short iev;
        int ifd = in_poll_fd(pr, &iev);
        fds[n++] = (struct pollfd){.fd = ifd, .events = iev};
      }
      int sending = pr->sendq && pr->out_fd >= 0 && !pr->out_broken && !p->driven;
      int bells = link_bells(&pr->out_link);
      /* On a link with doorbells room comes as a doorbell (POLLIN), and
       * so does the hang-up; a link with a descriptor of its own says so
       * there (POLLOUT). */
      short ev = pr->watch_out || (sending && bells) ? POLLIN : 0;
      if (ev) {
        now[n] = sending && bells && pr->out_link.ops->ready(&pr->out_link, 1, 1);
        who[n] = rank;
        kind[n] = OUT;
        fds[n++] = (struct pollfd){.fd = pr->out_fd, .events = ev};
      }
      if (sending && !bells) {
        short lev = POLLOUT;
        int lfd = pr->out_link.ops->ready_fd(&pr->out_link, &lev);
        now[n] = 0;
        who[n] = rank;
        kind[n] = OUT_LINK;
        fds[n++] = (struct pollfd){.fd = lfd, .events = lev};
      }
    }
    for (int i = 1 + door; i < n; i++)
      if (now[i]) wait_ms = 0;
    p->links_out = p->driven > 0;
    pthread_mutex_unlock(&p->lock);
    int r = poll(fds, (nfds_t)n, wait_ms);
    if (r > 0 && fds[0].revents) {
      uint64_t v;
      ssize_t got = read(p->wake_fd, &v, sizeof v);
      (void)got;
    }
    int kept = 0;
    if (r > 0 && brg__net_door_serve(&p->door, fds + 1, INT_MAX, &kept) != 0)
      BRG__WARN("p2p", "rank %d: accept on the point-to-point listener: %s", c->rank,
                strerror(errno));
    pthread_mutex_lock(&p->lock);
    for (int i = 1 + door; r >= 0 && i < n; i++) {
      if (!(r > 0 && fds[i].revents) && !now[i]) continue;
      if (kind[i] != IN) continue;
      p2p_peer *pr = p->peer[who[i]];
      short iev;
      if (pr->in_fd >= 0 && in_poll_fd(pr, &iev) == fds[i].fd) read_peer(c, pr, who[i]);
    }
    for (int i = 1 + door; r >= 0 && i < n; i++) {
      short rev = r > 0 ? fds[i].revents : 0;
      if ((!rev && !now[i]) || kind[i] == IN) continue;
      p2p_peer *pr = p->peer[who[i]];
      if (pr->out_fd < 0) continue;
      if (kind[i] == OUT_LINK) {
        if (rev) write_peer(c, pr, who[i]);
        continue;
      }
      if (pr->out_fd != fds[i].fd) continue;
      int bells = link_bells(&pr->out_link);
      if ((rev & (POLLIN | POLLERR | POLLHUP)) && (pr->watch_out || bells))
        check_out(c, pr, who[i]);
      if (bells && (rev || now[i])) write_peer(c, pr, who[i]);
    }
  }
  pthread_mutex_unlock(&p->lock);
  free(fds);
  free(who);
  free(now);
  free(kind);
  return NULL;
}

brg_status brg__p2p_open(brg_comm *c, const char *addr, uint32_t *port, brg__errbuf *err) {
  brg__p2p *p = calloc(1, sizeof *p);
  if (!p) return brg__error_quiet(err, BRG_ERR_NO_MEMORY, "out of memory for point-to-point");
  p->door = (brg__net_door){.listen_fd = -1,
                            .subsys = "p2p",
                            .hello_bytes = sizeof(p2p_hello),
                            .take = hello_take,
                            .arg = c,
                            .max_pending = P2P_MAX_PENDING};
  p->wake_fd = -1;
  p->early_cap = (uint64_t)brg__core_int(BRG__CORE_P2P_EARLY);
  pthread_mutex_init(&p->start_lock, NULL);
  pthread_mutex_init(&p->lock, NULL);
  pthread_cond_init(&p->cond, NULL);
  c->p2p = p;
  p->peer = calloc((size_t)c->nranks, sizeof *p->peer);
  p->active = calloc((size_t)c->nranks, sizeof *p->active);
  if (!p->peer || !p->active)
    return brg__error_quiet(err, BRG_ERR_NO_MEMORY, "out of memory for point-to-point");
  p->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (p->wake_fd < 0) return brg__error(err, BRG_ERR_SYSTEM, "p2p", "eventfd: %s", strerror(errno));
  uint16_t got = 0;
  brg_status s = brg__sock_listen(addr, 0, BRG__NET_BACKLOG, "p2p", "point-to-point listener",
                                  &p->door.listen_fd, &got, err);
  *port = got;
  return s;
}

/* The thread starts when it has work, not with the communicator: most
 * communicators (and every piece of a link set) never send a message. */
brg_status brg__p2p_start(brg_comm *c, brg__errbuf *err) {
  (void)err;
  c->p2p->armed = 1;
  /* for the liveness thread, a floor below, which watches the listener */
  __atomic_store_n(&c->p2p_door, brg__p2p_door_fd, __ATOMIC_RELEASE);
  __atomic_store_n(&c->p2p_need, brg__p2p_need, __ATOMIC_RELEASE);
  return BRG_SUCCESS;
}

brg_status brg__p2p_need(brg_comm *c, brg__errbuf *err) {
  brg__p2p *p = c->p2p;
  if (__atomic_load_n(&p->started, __ATOMIC_ACQUIRE)) return BRG_SUCCESS;
  brg__errbuf e = {0};
  brg_status s = BRG_SUCCESS;
  pthread_mutex_lock(&p->start_lock);
  if (!p->armed)
    s = brg__error_quiet(&e, BRG_ERR_INTERNAL,
                         "point-to-point used before the communicator is ready");
  else if (!__atomic_load_n(&p->started, __ATOMIC_ACQUIRE) &&
           (s = brg__proxy_start(&p->thread, p2p_main, c, "brg-p2p", &e)) == BRG_SUCCESS)
    __atomic_store_n(&p->started, 1, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&p->start_lock);
  if (s == BRG_SUCCESS) return s;
  __atomic_store_n(&p->refused, 1, __ATOMIC_RELEASE); /* the next send or receive tries again */
  if (err) {
    *err = e;
    return s;
  }
  return brg__comm_error(c, s, "starting the point-to-point thread: %s", e.msg);
}

int brg__p2p_door_fd(brg_comm *c) {
  brg__p2p *p = c->p2p;
  if (!p || !p->armed || __atomic_load_n(&p->started, __ATOMIC_ACQUIRE) ||
      __atomic_load_n(&p->refused, __ATOMIC_ACQUIRE))
    return -1;
  return p->door.listen_fd;
}

void brg__p2p_notify(brg_comm *c, const char *why) {
  brg__p2p *p = c->p2p;
  if (!p) return;
  char note[3 + BRG__P2P_NOTE_MAX];
  size_t len = brg__p2p_note_make(note, sizeof note, why);
  /* One deadline for all: a connection whose reader left doorbells unread
   * until its socket filled takes the rest as room comes (a peer left with
   * part of it calls it malformed), and holds up the others no longer. */
  int64_t deadline = brg__deadline_ms(BRG__NOTE_GRACE_MS);
  pthread_mutex_lock(&p->lock);
  if (!p->noticed) {
    p->noticed = 1;
    for (int i = 0; i < p->nactive; i++) {
      p2p_peer *pr = p->peer[p->active[i]];
      if (pr->rank == c->rank) continue;
      if (pr->in_fd >= 0) (void)brg__sock_send_all(pr->in_fd, note, len, deadline, NULL);
      if (pr->out_fd >= 0) (void)brg__sock_send_all(pr->out_fd, note, len, deadline, NULL);
    }
  }
  pthread_mutex_unlock(&p->lock);
}

/* Every receive posted and every send queued finishes as aborted: the
 * rest of a message arriving goes nowhere, and a send cut short leaves the
 * link unusable (sendq_fail). The caller holds the lock. */
static void abort_all(brg__p2p *p) {
  for (int i = 0; i < p->nactive; i++) {
    p2p_peer *pr = p->peer[p->active[i]];
    if (pr->cur_op) op_finish(p, pr->cur_op, BRG_ERR_ABORTED);
    pr->cur_op = NULL;
    for (uint32_t ch = 0; ch < P2P_CHANS; ch++)
      for (brg__p2p_op *op; (op = pop_op(pr, ch));) op_finish(p, op, BRG_ERR_ABORTED);
    if (pr->sendq) sendq_fail(p, pr, BRG_ERR_ABORTED, "the communicator was aborted");
  }
  for (brg__p2p_op *op; (op = p->any);) {
    p->any = op->next;
    op_finish(p, op, BRG_ERR_ABORTED);
  }
  p->any_tail = NULL;
  pthread_cond_broadcast(&p->cond);
}

void brg__p2p_abort(brg_comm *c) {
  if (!c->p2p) return;
  pthread_mutex_lock(&c->p2p->lock);
  abort_all(c->p2p);
  pthread_mutex_unlock(&c->p2p->lock);
}

void brg__p2p_free(brg_comm *c) {
  brg__p2p *p = c->p2p;
  if (!p) return;
  if (__atomic_load_n(&p->started, __ATOMIC_ACQUIRE)) {
    pthread_mutex_lock(&p->lock);
    p->stop = 1;
    pthread_mutex_unlock(&p->lock);
    wake_thread(p);
    pthread_join(p->thread, NULL);
  }
  /* What is still outstanding finishes now: its requests outlive p. */
  pthread_mutex_lock(&p->lock);
  abort_all(p);
  pthread_mutex_unlock(&p->lock);
  for (int i = 0; i < p->nactive; i++) {
    p2p_peer *pr = p->peer[p->active[i]];
    brg__sock_close(&pr->in_fd);
    brg__sock_close(&pr->out_fd);
    if (pr->in_link.ops) pr->in_link.ops->close(&pr->in_link);
    if (pr->out_link.ops) pr->out_link.ops->close(&pr->out_link);
    for (int ch = 0; ch < P2P_CHANS; ch++)
      for (p2p_unexp *u = pr->unexp[ch], *next; u; u = next) {
        next = u->next;
        free(u->data);
        free(u);
      }
    pthread_mutex_destroy(&pr->send_lock);
    free(pr);
  }
  brg__net_door_drop(&p->door);
  brg__sock_close(&p->door.listen_fd);
  brg__sock_close(&p->wake_fd);
  pthread_mutex_destroy(&p->lock);
  pthread_mutex_destroy(&p->start_lock);
  pthread_cond_destroy(&p->cond);
  free(p->peer);
  free(p->active);
  free(p);
  c->p2p = NULL;
}

/* The next transport of the table, from *at on, that may carry the frames
 * to `rank`: allowed (BRIGADE_TRANSPORTS), carrying host memory,
 * accepting the pair and with the byte stream (link_capable), in the
 * table's order, the one the ring links would take first. NULL when none
 * is left. */
static const brg__transport_ops *next_link(brg_comm *c, int rank, int *at) {
  for (; brg__transports[*at]; (*at)++) {
    const brg__transport_ops *t = brg__transports[*at];
    if ((t->carries & BRG__CARRIES_HOST) && link_capable(t) &&
        brg__transport_allowed(c->transports, t->name) &&
        t->can_connect(&c->peers[c->rank], &c->peers[rank])) {
      (*at)++;
      return t;
    }
  }
  return NULL;
}

/* The sending end of the table link the receiver answered about:
 * attaches to what it set up. BRG__IO_OK with link->ops set, or NULL and
 * `why` saying why not (the caller tries the next transport); otherwise
 * why the connection failed. */
static int link_connect(brg_comm *c, int fd, int rank, const brg__transport_ops *t, brg__conn *link,
                        char *why, size_t why_bytes) {
  int64_t deadline = brg__deadline_ms(c->timeout_ms);
  p2p_link_reply rep;
  int rc = brg__sock_recv_all(fd, &rep, sizeof rep, deadline);
  if (rc != BRG__IO_OK) {
    /* It may have made the link's name and died before saying so. */
    if (t == &brg__transport_shm) brg__shm_forget(c->comm_id ^ P2P_LINK_ID, rank, c->rank);
    return rc;
  }
  brg__conn_params prm = link_params(c, rank);
  rep.why[sizeof rep.why - 1] = 0;
  if (rep.magic != P2P_MAGIC || rep.status != BRG_SUCCESS) {
    snprintf(why, why_bytes, "%s", rep.magic != P2P_MAGIC ? "a malformed answer" : rep.why);
    return BRG__IO_OK;
  }
  brg__errbuf e = {0};
  link->ops = t;
  if (t->send_connect(link, &prm, rep.info, &e) != BRG_SUCCESS) {
    snprintf(why, why_bytes, "%s", e.msg);
    t->close(link);
    link->ops = NULL;
  }
  return BRG__IO_OK;
}

/* The connection to `rank` and the link its frames take, made at the
 * first use: the transports of the table that may carry the pair are
 * tried in order until one links (each failure at INFO); the caller
 * holds the peer's send lock. */
static brg_status ensure_out(brg_comm *c, p2p_peer *pr, int rank, char *why, size_t why_bytes) {
  if (pr->out_fd >= 0) return BRG_SUCCESS;
  const brg__peer_info *pi = &c->peers[rank];
  int at = 0;
  const brg__transport_ops *t = next_link(c, rank, &at);
  if (!t) {
    snprintf(why, why_bytes,
             "no transport can carry point-to-point to rank %d (pid %d): BRIGADE_TRANSPORTS=%.64s",
             rank, pi->pid, c->transports);
    return BRG_ERR_UNAVAILABLE;
  }
  int64_t deadline = brg__deadline_ms(c->timeout_ms < P2P_DIAL_MS ? c->timeout_ms : P2P_DIAL_MS);
  int fd = -1, e = 0;
  int rc = brg__sock_connect(pi->addr, (uint16_t)pi->p2p_port, deadline, 50, &fd, &e);
  if (rc != BRG__IO_OK) {
    char hp[BRG__HOSTPORT_LEN];
    brg__sock_hostport(hp, sizeof hp, pi->addr, pi->p2p_port);
    snprintf(why, why_bytes, "cannot reach rank %d (pid %d on %s) at %s: %s", rank, pi->pid,
             pi->hostname, hp, e ? strerror(e) : brg__sock_io_why(rc));
    return BRG_ERR_REMOTE;
  }
  brg__sock_nodelay(fd);
  p2p_hello h = {.magic = P2P_MAGIC, .from = c->rank, .to = rank, .comm_id = c->comm_id};
  memcpy(h.secret, brg__bootstrap_secret(c->bs), BRG__SECRET_BYTES);
  /* The frames ride the transport the ring links would take between the
   * two (the first that carries point-to-point: link_capable); where its
   * link cannot be set up, the next. */
  snprintf(h.link, sizeof h.link, "%s", t->name);
  rc = brg__sock_send_all(fd, &h, sizeof h, brg__deadline_ms(c->timeout_ms), NULL);
  brg__conn link = {.peer = rank};
  char failed[BRG__ERRLEN] = "";
  while (rc == BRG__IO_OK) {
    char no[BRG__ERRLEN] = "";
    rc = link_connect(c, fd, rank, t, &link, no, sizeof no);
    if (rc != BRG__IO_OK) break;
    p2p_link_ack ack = {.magic = P2P_MAGIC, .attached = link.ops != NULL};
    const brg__transport_ops *next = NULL;
    if (!link.ops) {
      BRG__INFO("p2p", "rank %d: point-to-point to rank %d: no %s link: %s", c->rank, rank, t->name,
                no);
      size_t used = strlen(failed);
      snprintf(failed + used, sizeof failed - used, "%s%s: %s", used ? "; " : "", t->name, no);
      if ((next = next_link(c, rank, &at))) snprintf(ack.next, sizeof ack.next, "%s", next->name);
    }
    rc = brg__sock_send_all(fd, &ack, sizeof ack, brg__deadline_ms(c->timeout_ms), NULL);
    if (link.ops || !next) break;
    t = next;
  }
  if (rc == BRG__IO_OK && !link.ops) {
    snprintf(why, why_bytes, "no link to rank %d (pid %d on %s) could be set up: %s", rank, pi->pid,
             pi->hostname, failed);
    close(fd);
    return BRG_ERR_UNAVAILABLE;
  }
  if (rc != BRG__IO_OK) {
    snprintf(why, why_bytes, "rank %d (pid %d on %s) dropped the connection: %s", rank, pi->pid,
             pi->hostname, brg__sock_io_why(rc));
    if (link.ops) link.ops->close(&link);
    close(fd);
    return BRG_ERR_REMOTE;
  }
  if (brg__sock_set_blocking(fd, 0) != 0) {
    snprintf(why, why_bytes, "fcntl on the connection to rank %d: %s", rank, strerror(errno));
    link.ops->close(&link);
    close(fd);
    return BRG_ERR_SYSTEM;
  }
  pthread_mutex_lock(&c->p2p->lock);
  pr->out_link = link;
  pr->out_fd = fd;
  pr->watch_out = !pr->gone;
  pthread_mutex_unlock(&c->p2p->lock);
  wake_thread(c->p2p);
  BRG__INFO("p2p", "rank %d: link to rank %d over %s", c->rank, rank, link.ops->name);
  return BRG_SUCCESS;
}

/* A message to this rank itself, delivered now: 0; 1 when it cannot land
 * yet (no receive posted and early memory full: it counts against
 * BRIGADE_P2P_EARLY_BYTES as any other); -1 when out of memory. The caller
 * holds the lock. */
static int deliver_self(brg__p2p *p, p2p_peer *pr, brg__p2p_op *op) {
  p2p_hdr h = {.magic = P2P_MAGIC,
               .chan = op->chan,
               .num = op->chan == BRG__P2P_A2A ? op->num : pr->sent,
               .count = op->count,
               .dtype = op->dtype,
               .tag = op->tag};
  int rc = begin_message(p, pr, &h);
  if (rc != 0) return rc;
  uint64_t bytes = op->count * brg_dtype_size((brg_dtype)op->dtype), room;
  char *dest = payload_dest(p, pr, &room);
  if (bytes && (pr->cur_op || pr->cur_unexp)) memcpy(dest, op->buf, bytes);
  payload_landed(pr, bytes);
  end_message(p, pr);
  if (op->chan == BRG__P2P_USER) pr->sent++;
  op->got = bytes;
  return 0;
}

/* Sends to this rank itself that waited for room land, in order, once a
 * receive is posted or early memory is freed. The caller holds the lock. */
static void drain_self(brg_comm *c) {
  brg__p2p *p = c->p2p;
  p2p_peer *pr = p->peer[c->rank];
  while (pr && pr->sendq) {
    brg__p2p_op *op = pr->sendq;
    int rc = deliver_self(p, pr, op);
    if (rc == 1) return;
    pr->sendq = op->next;
    if (!pr->sendq) pr->sendq_tail = NULL;
    op_finish(p, op, rc == 0 ? BRG_SUCCESS : BRG_ERR_NO_MEMORY);
  }
}

/* A send to this rank itself: delivered at once when it fits, else queued
 * (brg_wait waits for the receive, up to the timeout). */
static brg_status send_self(brg_comm *c, const char *fn, brg__p2p_op *op) {
  brg__p2p *p = c->p2p;
  pthread_mutex_lock(&p->lock);
  p2p_peer *pr = get_peer(c, c->rank);
  brg_status s = BRG_ERR_NO_MEMORY;
  int rc = -1;
  if (pr && __atomic_load_n(&c->aborted, __ATOMIC_ACQUIRE)) {
    s = BRG_ERR_ABORTED;
  } else if (pr && !pr->sendq && (rc = deliver_self(p, pr, op)) != 1) {
    s = rc == 0 ? BRG_SUCCESS : BRG_ERR_NO_MEMORY;
  } else if (pr) {
    if (pr->sendq_tail)
      pr->sendq_tail->next = op;
    else
      pr->sendq = op;
    pr->sendq_tail = op;
    pthread_mutex_unlock(&p->lock);
    return BRG_SUCCESS; /* in flight until its receive is posted */
  }
  pthread_mutex_unlock(&p->lock);
  op_finish_quiet(op, s);
  if (s == BRG_ERR_ABORTED)
    return brg__comm_error(c, s, "%s: send to rank %d: communicator was aborted", fn, c->rank);
  if (s != BRG_SUCCESS)
    return brg__comm_error(c, s, "%s: send to self: out of memory for %llu x %s", fn,
                           (unsigned long long)op->count, brg_dtype_name((brg_dtype)op->dtype));
  return s;
}

brg_status brg__p2p_isend(brg_comm *c, const char *fn, brg__p2p_op *op) {
  brg__p2p *p = c->p2p;
  brg_dtype dtype = (brg_dtype)op->dtype;
  op->next = NULL;
  op->done = 0;
  op->got = 0;
  op->status = BRG_IN_PROGRESS;
  op->last_ns = brg__now_ns();
  op->is_send = 1;
  int peer = op->peer;
  brg_status s;
  if (peer == c->rank) return send_self(c, fn, op);
  if ((s = brg__p2p_need(c, NULL)) != BRG_SUCCESS) {
    op_finish_quiet(op, s);
    return s;
  }
  p2p_peer *pr = peer_locked(c, peer);
  if (!pr) {
    op_finish_quiet(op, BRG_ERR_NO_MEMORY);
    return brg__comm_error(c, BRG_ERR_NO_MEMORY, "%s: out of memory", fn);
  }
  char why[sizeof pr->out_why];
  pthread_mutex_lock(&pr->send_lock);
  /* A peer whose hang-up the thread has seen takes nothing more: the
   * kernel may still accept a write or two before it learns of it. */
  pthread_mutex_lock(&p->lock);
  if (!pr->out_broken && pr->gone) {
    pr->out_broken = BRG_ERR_REMOTE;
    snprintf(pr->out_why, sizeof pr->out_why, "%s", pr->gone_why);
  }
  s = pr->out_broken;
  memcpy(why, pr->out_why, sizeof why);
  pthread_mutex_unlock(&p->lock);
  if (s == BRG_SUCCESS && (s = ensure_out(c, pr, peer, why, sizeof why)) != BRG_SUCCESS) {
    pthread_mutex_lock(&p->lock); /* for brg_wait's message; a later send dials again */
    memcpy(pr->out_why, why, sizeof why);
    pthread_mutex_unlock(&p->lock);
  }
  pthread_mutex_unlock(&pr->send_lock);
  int queued = 0;
  if (s == BRG_SUCCESS) {
    pthread_mutex_lock(&p->lock);
    if (!pr->out_broken && __atomic_load_n(&c->aborted, __ATOMIC_ACQUIRE)) {
      s = BRG_ERR_ABORTED;
      snprintf(why, sizeof why, "the communicator was aborted");
    } else if (pr->out_broken) {
      s = pr->out_broken;
      memcpy(why, pr->out_why, sizeof why);
    } else {
      if (pr->sendq_tail)
        pr->sendq_tail->next = op;
      else
        pr->sendq = op;
      pr->sendq_tail = op;
      write_peer(c, pr, peer);          /* what the link takes at once */
      queued = !op->done && !p->driven; /* a driver writes the rest */
    }
    pthread_mutex_unlock(&p->lock);
  }
  if (queued) wake_thread(p); /* to watch for room */
  if (s == BRG_SUCCESS) return s;
  op_finish_quiet(op, s);
  return brg__comm_error(c, s, "%s: send of %llu x %s to rank %d failed: %s", fn,
                         (unsigned long long)op->count, brg_dtype_name(dtype), peer, why);
}

brg_status brg__p2p_send(brg_comm *c, const char *fn, uint32_t chan, uint64_t num, const void *buf,
                         uint64_t count, brg_dtype dtype, int peer) {
  brg__p2p_op op = {.buf = (char *)buf,
                    .count = count,
                    .num = num,
                    .peer = peer,
                    .dtype = (uint32_t)dtype,
                    .chan = chan,
                    .is_send = 1};
  brg_status s = brg__p2p_isend(c, fn, &op);
  return s != BRG_SUCCESS ? s : brg__p2p_wait(c, fn, &op);
}

/* The peer whose user message of `tag` in early memory arrived first, or
 * NULL. */
static p2p_peer *oldest_early(brg__p2p *p, uint32_t tag) {
  p2p_peer *best = NULL;
  uint64_t first = 0;
  for (int i = 0; i < p->nactive; i++) {
    p2p_peer *pr = p->peer[p->active[i]];
    p2p_unexp *prev, *u = find_early(pr, BRG__P2P_USER, tag, &prev);
    if (u && (!best || u->arrival < first)) {
      best = pr;
      first = u->arrival;
    }
  }
  return best;
}

brg_status brg__p2p_post(brg_comm *c, brg__p2p_op *op) {
  brg__p2p *p = c->p2p;
  uint32_t chan = op->chan;
  op->done = 0;
  op->got = 0;
  op->status = BRG_IN_PROGRESS;
  op->last_ns = brg__now_ns();
  if (op->any || op->peer != c->rank) {
    brg_status s = brg__p2p_need(c, NULL);
    if (s != BRG_SUCCESS) {
      op_finish_quiet(op, s);
      return s;
    }
  }
  pthread_mutex_lock(&p->lock);
  op->order = p->posts++;
  p2p_peer *pr = op->any ? oldest_early(p, op->tag) : get_peer(c, op->peer);
  if (!pr && !op->any) {
    pthread_mutex_unlock(&p->lock);
    return brg__comm_error(c, BRG_ERR_NO_MEMORY, "out of memory posting a receive");
  }
  p2p_unexp *before = NULL, *u = pr ? find_early(pr, op->chan, op->tag, &before) : NULL;
  if (u) {
    /* The oldest message of its tag that came before its receive is this
     * one's (those of other tags stay for theirs). */
    if (op->any) op->peer = pr->rank;
    if (before)
      before->next = u->next;
    else
      pr->unexp[op->chan] = u->next;
    if (pr->unexp_tail[op->chan] == u) pr->unexp_tail[op->chan] = before;
    if (!op_matches(op, &u->h)) {
      op_mismatch(p, op, &u->h);
      if (pr->cur_unexp == u) pr->cur_unexp = NULL; /* the rest goes nowhere */
    } else {
      if (op->chan == BRG__P2P_USER) op->num = u->h.num;
      if (u->got) brg__copy(op->buf, NULL, u->data, u->got);
      op->got = u->got;
      if (u->complete) {
        op_finish(p, op, BRG_SUCCESS);
      } else if (pr->cur_unexp == u) {
        pr->cur_unexp = NULL; /* the rest lands in the receive's buffer */
        pr->cur_op = op;
      } else {
        op_finish(p, op, pr->gone ? pr->gone : BRG_ERR_REMOTE); /* cut off by a hang-up */
      }
    }
    p->early_bytes -= u->early;
    free(u->data);
    free(u);
  } else if (pr && pr->gone) {
    op_finish(p, op, pr->gone);
  } else if (__atomic_load_n(&c->aborted, __ATOMIC_ACQUIRE)) {
    op_finish(p, op, BRG_ERR_ABORTED); /* abort_all has run, or is waiting for the lock */
  } else if (op->any) {
    op->next = NULL;
    if (p->any_tail)
      p->any_tail->next = op;
    else
      p->any = op;
    p->any_tail = op;
  } else {
    push_op(pr, op);
  }
  drain_self(c); /* a send to itself may land now: here, or in early memory freed */
  /* A held message may land now: in this receive, or in the early memory
   * it freed; and a thread that left the links out watches them again. */
  int wake = chan == BRG__P2P_USER || links_wanted(p);
  pthread_mutex_unlock(&p->lock);
  if (wake) wake_thread(p);
  return BRG_SUCCESS;
}

/* Takes a receive that will not finish out of its peer's hands (or out of
 * the queue of receives from any source); the caller holds the lock. */
static void withdraw(brg__p2p *p, p2p_peer *pr, brg__p2p_op *op) {
  if (op->any && op->peer < 0) {
    brg__p2p_op **pp = &p->any, *prev = NULL;
    while (*pp && *pp != op) {
      prev = *pp;
      pp = &(*pp)->next;
    }
    if (!*pp) return;
    *pp = op->next;
    if (p->any_tail == op) p->any_tail = prev;
    return;
  }
  if (!pr) return;
  if (pr->cur_op == op) {
    pr->cur_op = NULL; /* the rest of its message goes nowhere */
    return;
  }
  brg__p2p_op **pp = &pr->posted[op->chan], *prev = NULL;
  while (*pp && *pp != op) {
    prev = *pp;
    pp = &(*pp)->next;
  }
  if (!*pp) return;
  *pp = op->next;
  if (pr->posted_tail[op->chan] == op) pr->posted_tail[op->chan] = prev;
}

/* A receive from a rank that never linked to this one learns of its death
 * through this rank's own link to it. */
static void watch_peer(brg_comm *c, brg__p2p_op *op) {
  if (op->any || op->peer == c->rank) return;
  p2p_peer *pr = peer_locked(c, op->peer);
  if (!pr) return;
  pthread_mutex_lock(&pr->send_lock);
  char why[256];
  brg_status s = pr->out_broken ? BRG_SUCCESS : ensure_out(c, pr, op->peer, why, sizeof why);
  pthread_mutex_unlock(&pr->send_lock);
  /* Unreachable: gone, unless its own link to this rank still works. One
   * that answered but could not be linked to (BRG_ERR_UNAVAILABLE) is not
   * gone: its own link tells of it. */
  if (s != BRG_ERR_REMOTE) return;
  pthread_mutex_lock(&c->p2p->lock);
  if (pr->in_fd < 0) peer_gone(c->p2p, pr, s, "%s", why);
  pthread_mutex_unlock(&c->p2p->lock);
}

/* A send to `rank` was cut short (withdraw_send): tells the receiver so on
 * a connection of its own, waits (briefly) for its answer, then shuts the
 * link down, so that the receiver's failed receive says that this rank cut
 * the send short rather than that it died. Called without the lock. */
static void cut_notice(brg_comm *c, int rank) {
  brg__p2p *p = c->p2p;
  pthread_mutex_lock(&p->lock);
  p2p_peer *pr = rank >= 0 && rank != c->rank ? p->peer[rank] : NULL;
  brg_status s = pr ? pr->cut_pending : BRG_SUCCESS;
  if (pr) pr->cut_pending = BRG_SUCCESS;
  pthread_mutex_unlock(&p->lock);
  if (s == BRG_SUCCESS) return;
  const brg__peer_info *pi = &c->peers[rank];
  int64_t deadline = brg__deadline_ms(c->timeout_ms < P2P_CUT_MS ? c->timeout_ms : P2P_CUT_MS);
  int fd = -1, e = 0;
  /* A peer found silent or gone (BRG_ERR_REMOTE) has nobody to hear it. */
  if (s != BRG_ERR_REMOTE &&
      brg__sock_connect(pi->addr, (uint16_t)pi->p2p_port, deadline, 50, &fd, &e) == BRG__IO_OK) {
    p2p_hello h = {
        .magic = P2P_MAGIC, .from = c->rank, .to = rank, .cut = (uint32_t)s, .comm_id = c->comm_id};
    memcpy(h.secret, brg__bootstrap_secret(c->bs), BRG__SECRET_BYTES);
    char ack;
    if (brg__sock_send_all(fd, &h, sizeof h, deadline, NULL) != BRG__IO_OK ||
        brg__sock_recv_all(fd, &ack, 1, deadline) != BRG__IO_OK)
      BRG__WARN("p2p", "rank %d: rank %d did not hear that a send to it was cut short", c->rank,
                rank);
    close(fd);
  }
  /* out_fd and out_link are set once and closed only by brg__p2p_free.
   * The stream ends where the receiver reads it: a link with a
   * descriptor of its own ends itself (the thread no longer sends on it:
   * out_broken), one with doorbells ends with the connection. */
  if (pr->out_link.ops->end)
    pr->out_link.ops->end(&pr->out_link);
  else
    shutdown(pr->out_fd, SHUT_WR);
}

/* Why a send failed, for the caller. */
static brg_status send_failed(brg_comm *c, const char *fn, const brg__p2p_op *op, brg_status s,
                              const char *why) {
  const brg__peer_info *pi = &c->peers[op->peer];
  const char *dn = brg_dtype_name((brg_dtype)op->dtype);
  uint64_t bytes = op->count * brg_dtype_size((brg_dtype)op->dtype);
  switch (s) {
  case BRG_ERR_TIMEOUT: {
    /* The rank that went silent, as a receive's timeout names it: the
     * receiver itself when it was stopped. */
    char quiet_why[192];
    brg__live_silent_note(c, quiet_why, sizeof quiet_why);
    return brg__comm_error(
        c, s,
        "%s: send of %llu x %s to rank %d (pid %d on %s) timed out: it took no more for %d ms "
        "(%llu of %llu bytes out; its receives are not posted and its early memory, "
        "BRIGADE_P2P_EARLY_BYTES, is full, or it is stuck)%s",
        fn, (unsigned long long)op->count, dn, op->peer, pi->pid, pi->hostname, c->timeout_ms,
        (unsigned long long)op->got, (unsigned long long)bytes, quiet_why);
  }
  case BRG_ERR_ABORTED:
    return brg__comm_error(c, s, "%s: send to rank %d: communicator was aborted", fn, op->peer);
  default:
    return brg__comm_error(c, s, "%s: send of %llu x %s (%llu bytes) to rank %d failed: %s", fn,
                           (unsigned long long)op->count, dn, (unsigned long long)bytes, op->peer,
                           why[0] ? why : brg_status_string(s));
  }
}

brg_status brg__p2p_wait(brg_comm *c, const char *fn, brg__p2p_op *op) {
  brg__p2p *p = c->p2p;
  if (!op->is_send && !__atomic_load_n(&op->done, __ATOMIC_ACQUIRE)) watch_peer(c, op);
  if (!__atomic_load_n(&op->done, __ATOMIC_ACQUIRE)) {
    pthread_mutex_lock(&p->lock);
    int wake = links_wanted(p);
    pthread_mutex_unlock(&p->lock);
    if (wake) wake_thread(p);
  }
  /* The timeout runs from the later of the last progress and this wait:
   * an irecv posted long before its brg_wait is not late for that. */
  int64_t start = brg__now_ns();
  pthread_mutex_lock(&p->lock);
  brg_status s = BRG_SUCCESS;
  /* A peer whose heartbeats stopped (stopped, hung, its host gone) fails
   * the wait at BRIGADE_SILENT_TIMEOUT_MS, as a collective's would. */
  int silent_limit =
      c->silent_fail_ms > 0 && c->silent_fail_ms < c->timeout_ms ? brg__live_silent_limit_ms(c) : 0;
  int64_t silent_ms = -1, next_look = 0;
  while (!op->done) {
    int64_t since = op->last_ns > start ? op->last_ns : start, now = brg__now_ns();
    int peer = op->peer; /* -1: a receive from any source that no message reached yet */
    if (silent_limit && peer >= 0 && now >= next_look) {
      /* Its lock is the liveness thread's: not taken under the p2p lock. */
      pthread_mutex_unlock(&p->lock);
      silent_ms = brg__live_silent_rank(c, peer);
      silent_limit = brg__live_silent_limit_ms(c); /* it grows with the pauses seen */
      pthread_mutex_lock(&p->lock);
      next_look = now + 100 * 1000000LL;
      if (op->done) break;
    }
    if (__atomic_load_n(&c->aborted, __ATOMIC_ACQUIRE))
      s = BRG_ERR_ABORTED;
    else if (silent_limit && peer >= 0 && silent_ms >= silent_limit &&
             now - since > 1000000LL * silent_limit)
      s = BRG_ERR_REMOTE;
    else if (now - since > (int64_t)c->timeout_ms * 1000000)
      s = BRG_ERR_TIMEOUT;
    if (s != BRG_SUCCESS) {
      p2p_peer *pr = peer >= 0 ? p->peer[peer] : NULL;
      if (op->is_send)
        withdraw_send(p, pr, op, s);
      else
        withdraw(p, pr, op);
      op_finish(p, op, s);
      break;
    }
    struct timespec ts = brg__realtime_in_ms(50);
    pthread_cond_timedwait(&p->cond, &p->lock, &ts);
  }
  int silent = s == BRG_ERR_REMOTE && op->status == BRG_ERR_REMOTE;
  s = op->status;
  p2p_peer *pr = op->peer >= 0 ? p->peer[op->peer] : NULL;
  char gone_why[512] = "";
  if (silent)
    snprintf(gone_why, sizeof gone_why,
             "rank %d (pid %d on %s) has been silent for %lld ms (host gone, cut off or stopped; "
             "BRIGADE_SILENT_TIMEOUT_MS=%d)",
             op->peer, c->peers[op->peer].pid, c->peers[op->peer].hostname, (long long)silent_ms,
             c->silent_fail_ms);
  else if (pr)
    snprintf(gone_why, sizeof gone_why, "%s", op->is_send ? pr->out_why : pr->gone_why);
  /* It told why it stopped (brg__p2p_notify): that names the cause. */
  int told = pr && (pr->note[0] || pr->note_bad[0]);
  pthread_mutex_unlock(&p->lock);
  if (s == BRG_SUCCESS) return s;
  /* A partner that hung up without saying why may have failed for another
   * rank's death (a tree's or rhd's partner gives up on the rank it waited
   * for): the rank liveness saw go, when it is another one, is the cause.
   * Read with p2p's lock released (liveness.c calls into p2p.c under its
   * own). */
  if (!silent && !told && pr && op->peer >= 0 && s == BRG_ERR_REMOTE) {
    char why[256];
    int gone = brg__live_gone(c, NULL, 0, "the communicator", why, sizeof why);
    size_t at = strlen(gone_why);
    if (gone >= 0 && gone != op->peer && at < sizeof gone_why)
      snprintf(gone_why + at, sizeof gone_why - at, "; %s", why);
  }
  if (op->is_send) cut_notice(c, op->peer);
  if (op->is_send) return send_failed(c, fn, op, s, gone_why);
  /* Who it waited for: a receive from any source names its sender once
   * a message reached it. */
  char from[128] = "any rank (BRG_ANY_SOURCE)";
  if (op->peer >= 0)
    snprintf(from, sizeof from, "rank %d (pid %d on %s)", op->peer, c->peers[op->peer].pid,
             c->peers[op->peer].hostname);
  const char *dn = brg_dtype_name((brg_dtype)op->dtype);
  switch (s) {
  case BRG_ERR_MISMATCH: {
    const char *pd = brg_dtype_name((brg_dtype)op->peer_dtype);
    if (op->chan == BRG__P2P_A2A && op->num == op->peer_num)
      return brg__comm_error(c, s,
                             "%s: ranks disagree on the block: rank %d called it with %llu x %s "
                             "per block, rank %d with %llu x %s (every rank must pass the same "
                             "count and dtype; the block is dropped)",
                             fn, c->rank, (unsigned long long)op->count, dn, op->peer,
                             (unsigned long long)op->peer_count, pd ? pd : "?");
    if (op->chan == BRG__P2P_A2A && op->num != op->peer_num)
      return brg__comm_error(
          c, s,
          "%s: rank %d expects the block of collective #%llu (%llu x %s) "
          "from rank %d, which sent one of its collective #%llu (%llu x %s)",
          fn, c->rank, (unsigned long long)op->num, (unsigned long long)op->count, dn, op->peer,
          (unsigned long long)op->peer_num, (unsigned long long)op->peer_count, pd ? pd : "?");
    return brg__comm_error(c, s,
                           "%s: rank %d receives %llu x %s from rank %d%s with tag %u, which "
                           "sent %llu x %s (message #%llu between them; the message is dropped)",
                           fn, c->rank, (unsigned long long)op->count, dn, op->peer,
                           op->any ? " (the first to send to a receive from any source)" : "",
                           op->tag, (unsigned long long)op->peer_count, pd ? pd : "?",
                           (unsigned long long)op->peer_num);
  }
  case BRG_ERR_TIMEOUT: {
    /* The rank that went silent, whether or not it is the one waited for
     * (a tree's or rhd's partner may itself wait for a stopped rank), as
     * the ring's timeout names it. */
    char quiet_why[192];
    brg__live_silent_note(c, quiet_why, sizeof quiet_why);
    return brg__comm_error(
        c, s,
        "%s: receive of %llu x %s from %s timed out: "
        "nothing arrived for %d ms (%llu of %llu bytes in)%s",
        fn, (unsigned long long)op->count, dn, from, c->timeout_ms, (unsigned long long)op->got,
        (unsigned long long)(op->count * brg_dtype_size((brg_dtype)op->dtype)), quiet_why);
  }
  case BRG_ERR_ABORTED:
    return brg__comm_error(c, s, "%s: receive from %s: communicator was aborted", fn, from);
  default:
    return brg__comm_error(c, s, "%s: receive of %llu x %s from %s failed: %s", fn,
                           (unsigned long long)op->count, dn, from, gone_why);
  }
}

/* Takes back a queued send that has not finished (it finishes with `s`)
 * and tells its receiver that it was cut short. */
void brg__p2p_cancel_send(brg_comm *c, brg__p2p_op *op, brg_status s) {
  pthread_mutex_lock(&c->p2p->lock);
  if (!op->done) withdraw_send(c->p2p, c->p2p->peer[op->peer], op, s);
  pthread_mutex_unlock(&c->p2p->lock);
  cut_notice(c, op->peer);
}

/*
 * Driving the links from the caller's thread (lat.c's tree and rhd).
 *
 * A message waited for through the thread costs two hand-offs a hop: the
 * sender's doorbell wakes the receiver's thread, which reads the message
 * and wakes the waiter on the condition. A collective that waits on one
 * message after another pays them at every hop, 100 us and more where
 * ranks share cores, against the few us of the ring's shm hand-off. So
 * between brg__p2p_drive_begin and brg__p2p_drive_end the thread leaves
 * the links' bytes alone (it still serves the door and watches the
 * hang-ups), and brg__p2p_drive_wait moves them itself: every link read
 * and every queued send written, with the code the thread runs and under
 * the same lock, so matching, early memory, order per peer and
 * BRG_ERR_MISMATCH are the thread's, and a user message that arrives
 * meanwhile lands where the thread would have put it.
 *
 * It waits as the ring's engine does (transport/fifo.c, brg__wait_ge):
 * BRIGADE_SPIN polls, then yields for up to ~200 us. A wait longer than
 * that hands the links back to the thread and sleeps in brg__p2p_wait, whose
 * timeout, silence and hang-up checks then name a peer that died: the
 * passes here only look at links that are ready, and an shm link's end
 * is its connection's, which the thread reads.
 */
#define P2P_DRIVE_YIELD_NS 200000
/* The spin's polls end here too: a tcp link's readiness is a poll(2),
 * 2,000 of which take a millisecond where the ring's loads take tens of
 * microseconds. */
#define P2P_DRIVE_SPIN_NS 20000

/* One pass over every link: what arrived is read into its receive (or
 * early memory), and queued sends take the room there is. The caller
 * holds the lock. */
static void drive_pass(brg_comm *c) {
  brg__p2p *p = c->p2p;
  for (int i = 0; i < p->nactive; i++) {
    int rank = p->active[i];
    p2p_peer *pr = p->peer[rank];
    if (rank == c->rank) continue;
    if (pr->held) resume_held(c, pr, rank);
    if (pr->in_fd >= 0 && !pr->held && pr->in_link.ops->ready(&pr->in_link, 0, 0)) {
      pr->keep_bells = 1;
      read_peer(c, pr, rank);
      pr->keep_bells = 0;
    }
    if (pr->sendq && pr->out_fd >= 0 && !pr->out_broken) write_peer(c, pr, rank);
  }
}

/* Whether the thread must take the links back now: a send is queued or
 * a message held (the thread polls for their room only from a poll set
 * made with them, and a send queued while driven did not wake it), or a
 * receive waits while its poll set lacks the links. The caller holds the
 * lock. */
static int links_needed(brg_comm *c) {
  brg__p2p *p = c->p2p;
  int recv = p->any != NULL;
  for (int i = 0; i < p->nactive; i++) {
    p2p_peer *pr = p->peer[p->active[i]];
    if (pr->sendq || pr->held) return 1;
    recv |= pr->posted[0] || pr->posted[1] || pr->cur_op;
  }
  return recv && p->links_out;
}

static void drive_set(brg_comm *c, int delta) {
  brg__p2p *p = c->p2p;
  pthread_mutex_lock(&p->lock);
  p->driven += delta;
  /* The thread arms and polls the links again, woken now when someone
   * waits on them, else by the next one who does (links_wanted): waking
   * it after every collective would cost more than the hops it saves. */
  int wake = p->driven == 0 && links_needed(c);
  pthread_mutex_unlock(&p->lock);
  if (wake) wake_thread(p);
}

void brg__p2p_drive_begin(brg_comm *c) {
  drive_set(c, 1);
}

void brg__p2p_drive_end(brg_comm *c) {
  drive_set(c, -1);
}

brg_status brg__p2p_drive_wait(brg_comm *c, const char *fn, brg__p2p_op *op) {
  brg__p2p *p = c->p2p;
  int spin = c->ring.waiter.spin;
  int64_t s0 = 0, t0 = 0;
  /* A receive's link, once linked (set once, kept until brg__p2p_free):
   * the spin polls its readiness alone, a load as cheap as the ring's,
   * and takes the lock for a pass only when something came. */
  brg__conn *in = NULL;
  for (int i = 0; !__atomic_load_n(&op->done, __ATOMIC_ACQUIRE); i++) {
    if (__atomic_load_n(&c->aborted, __ATOMIC_ACQUIRE)) break;
    if (i == 0 || i >= spin || !in || in->ops->ready(in, 0, 0)) {
      pthread_mutex_lock(&p->lock);
      drive_pass(c);
      p2p_peer *pr = !op->is_send && op->peer >= 0 ? p->peer[op->peer] : NULL;
      in = pr && pr->in_fd >= 0 ? &pr->in_link : NULL;
      pthread_mutex_unlock(&p->lock);
    }
    if (__atomic_load_n(&op->done, __ATOMIC_ACQUIRE)) break;
    if (i < spin) {
      if (i % 64 == 0) {
        int64_t now = brg__now_ns();
        if (!s0) s0 = now;
        if (now - s0 > P2P_DRIVE_SPIN_NS) spin = i;
      }
      brg__cpu_relax();
      continue;
    }
    int64_t now = brg__now_ns();
    if (!t0) t0 = now;
    if (now - t0 > P2P_DRIVE_YIELD_NS) break;
    sched_yield();
  }
  if (__atomic_load_n(&op->done, __ATOMIC_ACQUIRE)) return brg__p2p_wait(c, fn, op);
  /* A long wait: the thread takes the links back while this one sleeps. */
  drive_set(c, -1);
  brg_status s = brg__p2p_wait(c, fn, op);
  drive_set(c, 1);
  return s;
}
