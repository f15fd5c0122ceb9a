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

const brg__transport_ops brg__transport_shm = {
    .name = "shm",
    .carries = BRG__CARRIES_HOST | BRG__CARRIES_DEVICE,
    .can_connect = shm_can_connect,
    .available = shm_available,
    .recv_setup = shm_recv_setup,
    .send_connect = shm_send_connect,
    .recv_connect = shm_recv_connect,
    .close = shm_close,
};
