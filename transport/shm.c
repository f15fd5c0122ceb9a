/*
 * shm: ranks on one host. The receive FIFO of each link is a POSIX
 * shared-memory segment created by the receiver and mapped by the sender,
 * who writes slices straight into it. Its name ends in a random nonce, so
 * that no other process (another user watching /dev/shm included) can
 * predict it and make it first; it is created with O_EXCL, a name that
 * exists already is never opened but replaced by a fresh nonce, and the
 * receiver tells its sender the name over the ring socket. The name exists
 * only until both ends have it mapped: the sender unlinks it as soon as it
 * has attached (the receiver mapped it at setup), and the receiver at
 * recv_connect or close in case no sender came, so a rank killed at any
 * later point (during the rest of the setup included) leaves nothing behind
 * in /dev/shm. A receiver killed between making the name and telling it:
 * its sender, giving up on the link, unlinks this user's files under the
 * link's prefix (brg__shm_forget), never another user's.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
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

static int shm_create(char *name, size_t n, const char *prefix);

static int shm_available(char *why, size_t n) {
  char name[64], prefix[32];
  snprintf(prefix, sizeof prefix, "/brigade-probe-%d-", (int)getpid());
  int fd = shm_create(name, sizeof name, prefix);
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

/* A FIFO's name: the communicator, the two ranks, and a random nonce, so
 * that no other process can know it before it exists (and make it first,
 * or open it). The prefix without the nonce is what brg__shm_forget looks
 * for. */
static void fifo_prefix(char *name, size_t n, uint64_t comm_id, int receiver, int sender) {
  snprintf(name, n, "/brigade-%016llx-%d-from-%d-", (unsigned long long)comm_id, receiver, sender);
}

static int shm_nonce(uint64_t *out) {
  size_t done = 0;
  while (done < sizeof *out) {
    ssize_t k = getrandom((char *)out + done, sizeof *out - done, 0);
    if (k < 0 && errno != EINTR) return -1;
    if (k > 0) done += (size_t)k;
  }
  return 0;
}

/* Creates a new segment under a fresh name (O_EXCL): a name that exists
 * already (by chance, or made by another process) is never opened, only
 * replaced by another nonce. Returns the fd, or -1 with errno. */
static int shm_create(char *name, size_t n, const char *prefix) {
  for (int attempt = 0; attempt < 8; attempt++) {
    uint64_t nonce;
    if (shm_nonce(&nonce) != 0) return -1;
    snprintf(name, n, "%s%016llx", prefix, (unsigned long long)nonce);
    int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR | O_NOFOLLOW, 0600);
    if (fd >= 0 || errno != EEXIST) return fd;
  }
  errno = EEXIST;
  return -1;
}

/* The receiver died between making its FIFO and telling the name: only
 * this job's own files of that link are taken away (this user's, under
 * the link's prefix), never another user's. */
void brg__shm_forget(uint64_t comm_id, int receiver, int sender) {
  char prefix[64];
  fifo_prefix(prefix, sizeof prefix, comm_id, receiver, sender);
  DIR *d = opendir("/dev/shm");
  if (!d) return;
  struct dirent *e;
  size_t plen = strlen(prefix + 1);
  while ((e = readdir(d)) != NULL) {
    struct stat st;
    if (strncmp(e->d_name, prefix + 1, plen) != 0) continue;
    if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode) ||
        st.st_uid != geteuid())
      continue;
    char name[300];
    snprintf(name, sizeof name, "/%s", e->d_name);
    shm_unlink(name);
  }
  closedir(d);
}

static brg_status shm_recv_setup(brg__conn *c, const brg__conn_params *p, void *info,
                                 brg__errbuf *err) {
  shm_priv *sp = calloc(1, sizeof *sp);
  if (!sp) return brg__error(err, BRG_ERR_NO_MEMORY, "shm", "out of memory");
  c->priv = sp;
  c->fifo.nslots = p->nslots;
  c->fifo.slot_bytes = p->slot_bytes;
  char prefix[64];
  fifo_prefix(prefix, sizeof prefix, p->comm_id, p->rank, p->peer);
  size_t bytes = brg__fifo_region_bytes(p->nslots, p->slot_bytes);
  int fd = shm_create(sp->name, sizeof sp->name, prefix);
  if (fd < 0)
    return brg__error(err, BRG_ERR_SYSTEM, "shm", "shm_open %s*: %s", prefix, strerror(errno));
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
  int fd = shm_open(sp->name, O_RDWR | O_NOFOLLOW, 0);
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
