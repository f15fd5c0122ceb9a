/*
 * shm: ranks on one host. The receive FIFO of each link is a POSIX
 * shared-memory segment created by the receiver and mapped by the sender,
 * who writes slices straight into it. The name exists only until both ends
 * have it mapped: the sender unlinks it as soon as it has attached (the
 * receiver mapped it at setup), and the receiver at recv_connect or close
 * in case no sender came, so a rank killed at any later point (during the
 * rest of the setup included) leaves nothing behind in /dev/shm. A
 * receiver killed between making the name and telling it: its sender,
 * giving up on the link, unlinks it (brg__shm_forget; the name follows
 * from the communicator and the two ranks).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "transport.h"

typedef struct shm_priv {
  char name[64];
  void *region;
  size_t bytes;
  int linked; /* name still exists and this end created it */
  size_t off; /* receiving end of a stream (try_recv): bytes of slot `head` read */
} shm_priv;

static int shm_can_connect(const brg__peer_info *self, const brg__peer_info *peer) {
  return self->host_hash == peer->host_hash;
}

static int shm_available(char *why, size_t n) {
  char name[64];
  snprintf(name, sizeof name, "/brigade-probe-%d", (int)getpid());
  int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) {
    snprintf(why, n, "shm_open: %s", strerror(errno));
    return 0;
  }
  close(fd);
  shm_unlink(name);
  return 1;
}

static brg_status map_segment(brg__conn *c, shm_priv *sp, int fd, size_t bytes, int init,
                              brg__errbuf *err) {
  int flags = MAP_SHARED | (init ? 0 : MAP_POPULATE);
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, flags, fd, 0);
  if (p == MAP_FAILED)
    return brg__error(err, BRG_ERR_NO_MEMORY, "shm", "mmap %s (%zu bytes): %s", sp->name, bytes,
                      strerror(errno));
  sp->region = p;
  sp->bytes = bytes;
  brg__fifo_attach(&c->fifo, p, c->fifo.nslots, c->fifo.slot_bytes, init);
  return BRG_SUCCESS;
}

static void fifo_name(char *name, size_t n, uint64_t comm_id, int receiver, int sender) {
  snprintf(name, n, "/brigade-%016llx-%d-from-%d", (unsigned long long)comm_id, receiver, sender);
}

void brg__shm_forget(uint64_t comm_id, int receiver, int sender) {
  char name[64];
  fifo_name(name, sizeof name, comm_id, receiver, sender);
  shm_unlink(name);
}

static brg_status shm_recv_setup(brg__conn *c, const brg__conn_params *p, void *info,
                                 brg__errbuf *err) {
  shm_priv *sp = calloc(1, sizeof *sp);
  if (!sp) return brg__error(err, BRG_ERR_NO_MEMORY, "shm", "out of memory");
  c->priv = sp;
  c->fifo.nslots = p->nslots;
  c->fifo.slot_bytes = p->slot_bytes;
  fifo_name(sp->name, sizeof sp->name, p->comm_id, p->rank, p->peer);
  size_t bytes = brg__fifo_region_bytes(p->nslots, p->slot_bytes);
  int fd = shm_open(sp->name, O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0)
    return brg__error(err, BRG_ERR_SYSTEM, "shm", "shm_open %s: %s", sp->name, strerror(errno));
  sp->linked = 1;
  if (ftruncate(fd, (off_t)bytes) != 0) {
    int e = errno;
    close(fd);
    return brg__error(err, BRG_ERR_SYSTEM, "shm", "ftruncate %s to %zu bytes: %s", sp->name, bytes,
                      strerror(e));
  }
  brg_status s = map_segment(c, sp, fd, bytes, 1, err);
  close(fd);
  if (s != BRG_SUCCESS) return s;
  memset(info, 0, BRG__CONN_INFO_BYTES);
  memcpy(info, sp->name, sizeof sp->name);
  BRG__TRACE("shm", "receive FIFO %s from rank %d: %d x %zu bytes", sp->name, p->peer, p->nslots,
             p->slot_bytes);
  return BRG_SUCCESS;
}

static brg_status shm_send_connect(brg__conn *c, const brg__conn_params *p, const void *info,
                                   brg__errbuf *err) {
  shm_priv *sp = calloc(1, sizeof *sp);
  if (!sp) return brg__error(err, BRG_ERR_NO_MEMORY, "shm", "out of memory");
  c->priv = sp;
  c->fifo.nslots = p->nslots;
  c->fifo.slot_bytes = p->slot_bytes;
  memcpy(sp->name, info, sizeof sp->name);
  sp->name[sizeof sp->name - 1] = 0;
  if (strncmp(sp->name, "/brigade-", 9) != 0)
    return brg__error(err, BRG_ERR_REMOTE, "shm", "rank %d sent a malformed shm name", p->peer);
  size_t bytes = brg__fifo_region_bytes(p->nslots, p->slot_bytes);
  int fd = shm_open(sp->name, O_RDWR, 0);
  /* The receiver unlinks its FIFO only once attached to, or when it gives
   * up on the link: missing, it is gone. */
  if (fd < 0 && errno == ENOENT)
    return brg__error(err, BRG_ERR_REMOTE, "shm",
                      "rank %d is gone: it gave up on the link from rank %d (or exited) before "
                      "this rank could attach to its FIFO %s",
                      p->peer, p->rank, sp->name);
  if (fd < 0)
    return brg__error(err, BRG_ERR_SYSTEM, "shm", "shm_open %s (FIFO of rank %d): %s", sp->name,
                      p->peer, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || (size_t)st.st_size != bytes) {
    close(fd);
    return brg__error(err, BRG_ERR_REMOTE, "shm", "%s has %lld bytes, expected %zu", sp->name,
                      (long long)st.st_size, bytes);
  }
  brg_status s = map_segment(c, sp, fd, bytes, 0, err);
  close(fd);
  /* Both ends have it mapped: the name has done its work. */
  if (s == BRG_SUCCESS) shm_unlink(sp->name);
  return s;
}

static brg_status shm_recv_connect(brg__conn *c, const brg__conn_params *p, brg__errbuf *err) {
  (void)p;
  (void)err;
  shm_priv *sp = c->priv;
  if (sp->linked) {
    shm_unlink(sp->name);
    sp->linked = 0;
  }
  return BRG_SUCCESS;
}

static void shm_close(brg__conn *c) {
  shm_priv *sp = c->priv;
  if (!sp) return;
  if (sp->linked) shm_unlink(sp->name);
  if (sp->region) munmap(sp->region, sp->bytes);
  free(sp);
  c->priv = NULL;
  memset(&c->fifo, 0, sizeof c->fifo);
}

/*
 * The link as a byte stream (try_send, try_recv, ready). Each slot holds
 * up to slot_bytes of the stream, meta.bytes saying how many; the sender
 * publishes tail once per call, the receiver head. A side about to sleep
 * raises the other side's waiters word (tail_waiters: the receiver waits
 * for tail, head_waiters: the sender for head) and looks again; a side
 * that publishes and finds it raised lowers it and has its caller ring.
 * Both the raise and the publish are sequentially consistent, and each
 * side looks at the other's word after its own store, so either the
 * sleeper sees the new counter or the publisher sees the raised word.
 */
static int take_ring(volatile uint32_t *waiters) {
  return __atomic_load_n(waiters, __ATOMIC_SEQ_CST) &&
         __atomic_exchange_n(waiters, 0, __ATOMIC_SEQ_CST);
}

static ssize_t shm_try_send(brg__conn *c, const void *buf, size_t bytes, int *ring) {
  brg__fifo *f = &c->fifo;
  uint64_t tail = f->ctrl->tail;
  size_t took = brg__fifo_stream_fill(f, buf, bytes, &tail);
  if (!took) return 0;
  __atomic_store_n(&f->ctrl->tail, tail, __ATOMIC_SEQ_CST);
  if (take_ring(&f->ctrl->tail_waiters)) *ring = 1;
  return (ssize_t)took;
}

static ssize_t shm_try_recv(brg__conn *c, void *buf, size_t bytes, int *ring) {
  brg__fifo *f = &c->fifo;
  shm_priv *sp = c->priv;
  uint64_t head0 = f->ctrl->head, head = head0;
  size_t got = brg__fifo_stream_take(f, buf, bytes, &sp->off, &head);
  if (head != head0) {
    __atomic_store_n(&f->ctrl->head, head, __ATOMIC_SEQ_CST);
    if (take_ring(&f->ctrl->head_waiters)) *ring = 1;
  }
  return (ssize_t)got;
}

static int shm_ready(brg__conn *c, int sending, int arm) {
  brg__fifo_ctrl *k = c->fifo.ctrl;
  uint64_t room = (uint64_t)c->fifo.nslots;
  if (sending) {
    if (k->tail < __atomic_load_n(&k->head, __ATOMIC_ACQUIRE) + room) return 1;
    if (!arm) return 0;
    __atomic_store_n(&k->head_waiters, 1, __ATOMIC_SEQ_CST);
    return k->tail < __atomic_load_n(&k->head, __ATOMIC_SEQ_CST) + room;
  }
  if (k->head < __atomic_load_n(&k->tail, __ATOMIC_ACQUIRE)) return 1;
  if (!arm) return 0;
  __atomic_store_n(&k->tail_waiters, 1, __ATOMIC_SEQ_CST);
  return k->head < __atomic_load_n(&k->tail, __ATOMIC_SEQ_CST);
}

const brg__transport_ops brg__transport_shm = {
    .name = "shm",
    .carries = BRG__CARRIES_HOST | BRG__CARRIES_DEVICE,
    .can_connect = shm_can_connect,
    .available = shm_available,
    .recv_setup = shm_recv_setup,
    .send_connect = shm_send_connect,
    .recv_connect = shm_recv_connect,
    .close = shm_close,
    .try_send = shm_try_send,
    .try_recv = shm_try_recv,
    .ready = shm_ready,
    .proxy_post = brg__fifo_proxy_post,
    .proxy_sent = brg__fifo_proxy_sent,
    .proxy_poll = brg__fifo_proxy_poll,
    .proxy_release = brg__fifo_proxy_release,
};
