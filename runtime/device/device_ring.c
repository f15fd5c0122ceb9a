/*
 * Device collectives: the ring of ring.c with its payloads in GPU memory.
 *
 * The schedule, the slices and the host FIFOs are the host engine's; what
 * changes is where the bytes go. Each rank owns a receive FIFO of
 * BRIGADE_STEPS slots in its own GPU memory, exported with CUDA IPC and
 * mapped by the previous rank. Per slice and step a rank enqueues one copy
 * or reduce kernel on the caller's stream that reads its own slot and
 * writes the next rank's slot, exactly as the host primitive would:
 *
 *   prev rank                         this rank
 *   kernel writes my slot k  ---+
 *   record send_ev[k]           |
 *   host header for slot k  ----+-->  wait for the header (host)
 *                                     stream waits for prev's send_ev[k]
 *                                     kernel reads slot k (+ input) -> next
 *                                     record rel_ev[k]
 *   (slot k again, one lap on:) <---  host head++ (slot k is free)
 *   stream waits for rel_ev[k]
 *
 * So the only waiting is on the host (for headers, which come as soon as a
 * peer has enqueued its work) and in the streams (for events). No kernel
 * spins on another process's kernel, which matters on a GPU shared by
 * several processes without MPS: there the processes' kernels run in
 * turns, and a kernel spinning for another one would stall for a whole
 * time slice or forever. The call returns once its work is enqueued.
 *
 * Two ranks in one process use each other's pointers and events directly.
 *
 * A link between hosts has no CUDA IPC: there the slots are the network
 * transport's own host FIFO (tcp or ibverbs), pinned and mapped for
 * kernels. The sender's kernel writes the slot in host memory, the host
 * waits for it and posts the slot for the transport to carry; the
 * receiver's kernel reads the slot that arrived, and the host waits for it
 * before handing the slot back. Those waits make the call return only when
 * the collective is done on ranks with such a link. Where both ends can
 * register GPU memory with an ibverbs link (GPUDirect RDMA: the
 * transport's dev_register and dev_remote), the slots stay in GPU memory
 * and the link moves them GPU to GPU instead (BRIGADE_IB_GDR).
 *
 * This file holds what every mode uses: the cuda_ipc links, pinned host
 * memory, GPUDirect offers and the fork and join of several rings. Each
 * mode has a file of its own, and the ring's setup and teardown another
 * (device_ring_int.h lists them).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "device_ring_int.h"

brg_status brg__dev_cuda_fail(brg_comm *c, const brg__cuda_api *api, int e, const char *what) {
  return brg__comm_error(c, BRG_ERR_SYSTEM, "rank %d: CUDA %s failed: %s", c->rank, what,
                         api->drv.error_string(e));
}

/* Zeroed host memory, pinned and mapped for kernels (*host, *dev); 0, a
 * CUDA error, or -1 with errno. */
int brg__dev_pinned_alloc(const brg__cuda_api *api, size_t bytes, char **host, char **dev) {
  void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return -1;
  memset(m, 0, bytes);
  void *dp = NULL;
  int e = api->drv.host_register(m, bytes, &dp);
  if (e) {
    munmap(m, bytes);
    return e;
  }
  *host = m;
  *dev = dp;
  return 0;
}

void brg__dev_pinned_free(const brg__cuda_api *api, char *host, size_t bytes) {
  if (!host) return;
  api->drv.host_unregister(host);
  munmap(host, bytes);
}

size_t brg__device_ring_slice_bytes(const struct brg__dev_ring *d) {
  return d->slice_bytes;
}

/* ---- the device links of cuda_ipc ---- */

static brg__gpu_desc gpu_desc(const dev_blob *b) {
  brg__gpu_desc g = {.process = b->process, .pid = b->pid, .gpu = b->gpu};
  memcpy(g.uuid, b->uuid, sizeof g.uuid);
  return g;
}

/* A cuda_ipc link with rank `peer` (blob `other`) over `bytes` of memory:
 * slots of `slot` bytes; the receiver's memory may be pinned host memory
 * where `fallback`. */
static void link_params(brg_comm *c, struct brg__dev_ring *d, int peer, const dev_blob *self,
                        const dev_blob *other, size_t bytes, size_t slot, int fallback,
                        brg__gpu_link_params *g, brg__conn_params *p) {
  *g = (brg__gpu_link_params){.api = d->api,
                              .self = gpu_desc(self),
                              .peer = gpu_desc(other),
                              .bytes = bytes,
                              .host_fallback = fallback};
  *p = (brg__conn_params){.rank = c->rank,
                          .peer = peer,
                          .nranks = c->nranks,
                          .self_info = &c->peers[c->rank],
                          .peer_info = &c->peers[peer],
                          .nslots = d->nslots,
                          .slot_bytes = slot,
                          .comm_id = c->comm_id,
                          .timeout_ms = c->timeout_ms,
                          .waiter = &c->ring.waiter,
                          .gpu = g};
}

/* The receiving end: this rank's memory, described in `info` for the
 * ranks that map it. */
brg_status brg__dev_link_export(brg_comm *c, struct brg__dev_ring *d, brg__conn *l, int peer,
                                const dev_blob *self, const dev_blob *other, size_t bytes,
                                size_t slot, int fallback, void *info, brg__errbuf *err) {
  brg__gpu_link_params g;
  brg__conn_params p;
  link_params(c, d, peer, self, other, bytes, slot, fallback, &g, &p);
  l->ops = &brg__transport_cuda_ipc;
  l->peer = peer;
  return l->ops->recv_setup(l, &p, info, err);
}

/* The sending end: rank `peer`'s memory, mapped here from its `info`. */
brg_status brg__dev_link_map(brg_comm *c, struct brg__dev_ring *d, brg__conn *l, int peer,
                             const dev_blob *self, const dev_blob *other, size_t bytes, size_t slot,
                             const void *info) {
  brg__gpu_link_params g;
  brg__conn_params p;
  brg__errbuf err = {0};
  link_params(c, d, peer, self, other, bytes, slot, 0, &g, &p);
  l->ops = &brg__transport_cuda_ipc;
  l->peer = peer;
  brg_status s = l->ops->send_connect(l, &p, info, &err);
  return s == BRG_SUCCESS ? s : brg__comm_error(c, s, "device collectives: %s", err.msg);
}

void brg__dev_link_close(brg__conn *l) {
  if (l->ops) l->ops->close(l);
  l->ops = NULL;
}

const brg__transport_ops *brg__device_link(const brg_comm *c, int from, int to) {
  return brg__transport_pick(&c->peers[from], &c->peers[to], c->transports, BRG__CARRIES_DEVICE);
}

int brg__device_staged_any(const brg_comm *c) {
  for (int i = 0; c->nranks > 1 && i < c->nranks; i++) {
    const brg__transport_ops *t =
        brg__device_link(c, c->ring.order[i], c->ring.order[(i + 1) % c->nranks]);
    if (!t || !t->gpu_memory) return 1;
  }
  return 0;
}

/* Whether every event this rank recorded has run, polled until the
 * deadline (ms, -1 never). */
int brg__dev_own_work_drained(struct brg__dev_ring *d, int64_t deadline) {
  const brg__cuda_api *api = d->api;
  for (int i = 0;; i++) {
    int pending = 0;
    for (int k = 0; k < d->nslots && !pending; k++) {
      if (d->st.send_ev[k] && api->drv.event_query(d->st.send_ev[k]) == -1) pending = 1;
      if (d->st.rel_ev[k] && api->drv.event_query(d->st.rel_ev[k]) == -1) pending = 1;
    }
    if (d->proxy_ev && api->drv.event_query(d->proxy_ev) == -1) pending = 1;
    if (d->k.done_ev && api->drv.event_query(d->k.done_ev) == -1) pending = 1;
    for (int g = 0; g < d->k.ngstreams && !pending; g++)
      if (d->k.gdone_ev[g] && api->drv.event_query(d->k.gdone_ev[g]) == -1) pending = 1;
    for (int r = 0; r < BRG__DEVICE_MAX_RINGS && !pending; r++)
      if (d->join_ev[r] && api->drv.event_query(d->join_ev[r]) == -1) pending = 1;
    for (int k = 0; k < d->ncallers && !pending; k++)
      if (api->drv.event_query(d->callers[k].ev) == -1) pending = 1;
    if (!pending) return 1;
    if (brg__deadline_passed(deadline)) return 0;
    brg__sleep_ms(i < 100 ? 0 : 1);
  }
}

void brg__device_abort(brg_comm *c) {
  struct brg__dev_ring *d = __atomic_load_n(&c->dev, __ATOMIC_ACQUIRE);
  if (d) brg__dev_kernel_stop(d);
}

/* Registers GPU memory with a network link; 0 or the reason in why. */
static int gdr_register(struct brg__dev_ring *d, brg__conn *link, void *p, size_t bytes,
                        uint32_t *rkey, char *why, size_t cap) {
  if (!link->ops->dev_register) {
    snprintf(why, cap, "the %s transport cannot carry GPU memory", link->ops->name);
    return -1;
  }
  int fd = -1;
  unsigned long long off = 0;
  int e = d->api->drv.dmabuf_export(p, bytes, &fd, &off);
  if (e) {
    snprintf(why, cap, "no dmabuf for GPU memory: %s", d->api->drv.error_string(e));
    return -1;
  }
  brg__errbuf err;
  brg_status s = link->ops->dev_register(link, p, bytes, fd, off, rkey, &err);
  close(fd);
  if (s != BRG_SUCCESS) {
    size_t n = strlen(err.msg) < cap - 1 ? strlen(err.msg) : cap - 1;
    memcpy(why, err.msg, n);
    why[n] = 0;
    return -1;
  }
  return 0;
}

/* Registers GPU slots (`bytes` each way) with a staged send and receive
 * link (NULL: that link is not staged): the receive slots at *rbuf (made
 * here when NULL), the send slots made at *sbuf. */
void brg__dev_gdr_offer_slots(struct brg__dev_ring *d, brg__conn *send, brg__conn *recv,
                              size_t bytes, char **rbuf, char **sbuf, const brg__dev_gdr_offer *o) {
  unsigned char unused[HB];
  /* Kernels may read what the network wrote only after a flush (or on a
   * GPU that orders those writes itself). */
  int e = recv ? d->api->drv.flush_rdma_writes() : 0;
  if (e) {
    snprintf(o->why, o->why_bytes, "receive: %s", d->api->drv.error_string(e));
  } else if (recv) {
    /* Exported memory, of which every driver makes a dmabuf. */
    e = *rbuf ? 0 : d->api->drv.ipc_mem_export((void **)rbuf, bytes, unused);
    if (e)
      snprintf(o->why, o->why_bytes, "cudaMalloc: %s", d->api->drv.error_string(e));
    else if (gdr_register(d, recv, *rbuf, bytes, o->rkey, o->why, o->why_bytes) == 0)
      *o->recv_ok = 1;
  }
  if (send) {
    e = d->api->drv.ipc_mem_export((void **)sbuf, bytes, unused);
    if (e)
      snprintf(o->why, o->why_bytes, "cudaMalloc: %s", d->api->drv.error_string(e));
    else if (gdr_register(d, send, *sbuf, bytes, NULL, o->why, o->why_bytes) == 0)
      *o->send_ok = 1;
  }
}

/* Whether ranks r and q are of different processes on one GPU. */
int brg__dev_shares_gpu(const brg_comm *c, const dev_blob *all, int r, int q) {
  return !memcmp(all[r].uuid, all[q].uuid, 16) && all[r].process != all[q].process &&
         c->peers[r].host_hash == c->peers[q].host_hash;
}

/* Whether kernels of `peer`'s GPU reach this rank's GPU memory. */
int brg__dev_reaches(const struct brg__dev_ring *d, const dev_blob *self, const dev_blob *peer) {
  brg__gpu_desc a = gpu_desc(self), b = gpu_desc(peer);
  return brg__cuda_ipc_reaches(d->api, &a, &b);
}

brg_status brg__device_single(brg_comm *c, const brg__coll *k) {
  const brg__cuda_api *api = brg__device_api(NULL);
  size_t esize = brg_dtype_size(k->dtype);
  if (!k->recvbuf || k->recvbuf == k->sendbuf || k->count == 0) return BRG_SUCCESS;
  size_t elems = k->count;
  int e = api->kern.copy(k->recvbuf, NULL, k->sendbuf, elems * esize, k->stream);
  return e ? brg__dev_cuda_fail(c, api, e, "copy kernel") : BRG_SUCCESS;
}

brg_status brg__device_fork(brg_comm *c, void *stream, int rings, void **streams) {
  struct brg__dev_ring *d = c->dev;
  const brg__cuda_api *api = d->api;
  int e = d->fork_ev ? 0 : api->drv.event_create(&d->fork_ev);
  for (int r = 1; !e && r < rings; r++) {
    if (!d->rstream[r]) e = api->drv.stream_create(&d->rstream[r]);
    if (!e && !d->join_ev[r]) e = api->drv.event_create(&d->join_ev[r]);
  }
  if (!e) e = api->drv.event_record(d->fork_ev, stream);
  for (int r = 1; !e && r < rings; r++) {
    e = api->drv.stream_wait_event(d->rstream[r], d->fork_ev);
    streams[r] = d->rstream[r];
  }
  return e ? brg__dev_cuda_fail(c, api, e, "forking the rings' streams from the caller's")
           : BRG_SUCCESS;
}

brg_status brg__device_join(brg_comm *c, void *stream, int rings) {
  struct brg__dev_ring *d = c->dev;
  const brg__cuda_api *api = d->api;
  int e = 0;
  for (int r = 1; !e && r < rings; r++) {
    e = api->drv.event_record(d->join_ev[r], d->rstream[r]);
    if (!e) e = api->drv.stream_wait_event(stream, d->join_ev[r]);
  }
  return e ? brg__dev_cuda_fail(c, api, e, "joining the rings' streams into the caller's")
           : BRG_SUCCESS;
}

brg_status brg__device_divide(brg_comm *c, void *buf, size_t count, brg_dtype dtype, int divisor,
                              void *stream) {
  const brg__cuda_api *api = brg__device_api(NULL);
  int e = count ? api->kern.divide(buf, buf, count, (int)dtype, divisor, stream) : 0;
  return e ? brg__dev_cuda_fail(c, api, e, "divide kernel (BRG_AVG)") : BRG_SUCCESS;
}
