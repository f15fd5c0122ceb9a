/*
 * Step mode: per slice and step one copy or reduce kernel on the caller's
 * stream, ordered by interprocess events (device_ring.c draws it); its
 * FIFO, its events, and the memory operations of ring.c's run_prim.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device_ring_int.h"

/* Waits for an event with the communicator's checks (abort, a neighbour
 * gone, the deadline) between polls, so that a dead peer's work that never
 * comes cannot hold the calling thread. */
brg_status brg__dev_event_wait(brg_comm *c, struct brg__dev_ring *d, void *ev, const char *what) {
  const brg__cuda_api *api = d->api;
  c->ring.wait_start_ns = 0;
  for (int i = 0;; i++) {
    int e = api->drv.event_query(ev);
    if (e == 0) return BRG_SUCCESS;
    if (e != -1) return brg__dev_cuda_fail(c, api, e, what);
    if (i < 100) continue;
    brg_status s = c->ring.waiter.check ? c->ring.waiter.check(c->ring.waiter.arg) : BRG_SUCCESS;
    if (s != BRG_SUCCESS) return s;
    brg__sleep_ms(i < 1000 ? 0 : 1);
  }
}

/* Pins and maps the host FIFO of a network link for kernels. */
static int map_host_fifo(const brg__cuda_api *api, const brg__fifo *f, char **region, char **dev) {
  char *base = (char *)f->ctrl;
  void *dp = NULL;
  int e = api->drv.host_register(base, brg__fifo_region_bytes(f->nslots, f->slot_bytes), &dp);
  if (e) return e;
  *region = base;
  *dev = dp;
  return 0;
}

/* GPUDirect RDMA on step mode's staged links, where the transport and the
 * GPU allow it; whether it then runs is decided with the neighbour. */
static void setup_gdr(struct brg__dev_ring *d, dev_blob *b) {
  if (!brg__device_int(BRG__DEVICE_IB_GDR)) {
    snprintf(b->gdr_why, sizeof b->gdr_why, "off (BRIGADE_IB_GDR=0)");
    return;
  }
  brg__dev_gdr_offer o = {&b->gdr_send_ok, &b->gdr_recv_ok, &b->gdr_rkey, b->gdr_why,
                          sizeof b->gdr_why};
  brg__dev_gdr_offer_slots(d, d->send_staged ? d->link_send : NULL,
                           d->recv_staged ? d->link_recv : NULL,
                           (size_t)d->nslots * d->st.gdr_stride, &d->st.fifo, &d->st.gdr_send, &o);
  d->st.send_reg = b->gdr_send_ok;
  d->st.recv_reg = b->gdr_recv_ok;
}

/* The receive FIFO's size: GPU slots of a GPUDirect link from another
 * host, or slices from a rank of this host. */
static size_t fifo_bytes(const struct brg__dev_ring *d) {
  return (size_t)d->nslots * (d->recv_staged ? d->st.gdr_stride : d->stride);
}

/* This rank's own half: FIFO, events and mapped host FIFOs, described in `b`. */
void brg__dev_step_local(brg_comm *c, struct brg__dev_ring *d, dev_blob *b, const dev_blob *prev) {
  const brg__cuda_api *api = d->api;
  int e = 0;
  const char *what = "cudaGetDeviceProperties";
  if (!e && d->send_staged) {
    what = "cudaHostRegister of the send FIFO (staged link)";
    e = map_host_fifo(api, &c->ring.send.fifo, &d->st.send_region, &d->st.send_region_dev);
  }
  if (!e && d->recv_staged) {
    what = "cudaHostRegister of the receive FIFO (staged link)";
    e = map_host_fifo(api, &c->ring.recv.fifo, &d->st.recv_region, &d->st.recv_region_dev);
  }
  if (!e && !d->recv_staged) {
    /* The previous rank's kernels write this FIFO (a cuda_ipc link):
     * where they cannot reach this GPU, it is pinned host memory that both
     * GPUs reach. */
    brg__errbuf err = {0};
    if (brg__dev_link_export(c, d, &d->st.fifo_in, c->ring.prev, b, prev, fifo_bytes(d), d->stride,
                             1, b->fifo_info, &err) != BRG_SUCCESS) {
      snprintf(b->why, sizeof b->why, "%.191s", err.msg);
      return;
    }
    d->st.fifo = d->st.fifo_in.fifo.data;
  } else if (!e) {
    /* Exported memory, which the GPUDirect link can register. */
    unsigned char handle[HB];
    what = "cudaMalloc of the GPU slots of the staged link from the previous rank";
    e = api->drv.ipc_mem_export((void **)&d->st.fifo, fifo_bytes(d), handle);
  }
  for (int k = 0; !e && k < d->nslots; k++) {
    what = "creating interprocess events";
    e = api->drv.ipc_event_export(&d->st.send_ev[k], b->send_ev[k]);
    if (!e) e = api->drv.ipc_event_export(&d->st.rel_ev[k], b->rel_ev[k]);
    b->send_ev_ptr[k] = (uint64_t)(uintptr_t)d->st.send_ev[k];
    b->rel_ev_ptr[k] = (uint64_t)(uintptr_t)d->st.rel_ev[k];
  }
  b->fifo_ptr = (uint64_t)(uintptr_t)d->st.fifo;
  if (!e) setup_gdr(d, b);
  if (e) {
    snprintf(b->why, sizeof b->why, "%s: %s (%zu bytes of FIFO)", what,
             e == -1 ? strerror(errno) : api->drv.error_string(e), fifo_bytes(d));
    return;
  }
  b->ok = 1;
}

/* A neighbour's events: its pointers in this process, or opened from its
 * handles (`handles`: nslots of HB bytes). */
static brg_status peer_events(brg_comm *c, struct brg__dev_ring *d, const dev_blob *self,
                              const dev_blob *peer, const uint64_t *ptrs, const void *handles,
                              void **out, int *opened, const char *what) {
  if (peer->process == self->process) {
    for (int k = 0; k < d->nslots; k++) out[k] = (void *)(uintptr_t)ptrs[k];
    return BRG_SUCCESS;
  }
  *opened = 1;
  for (int k = 0; k < d->nslots; k++) {
    int e = d->api->drv.ipc_event_open(&out[k], (const unsigned char *)handles + (size_t)k * HB);
    if (e) return brg__dev_cuda_fail(c, d->api, e, what);
  }
  return BRG_SUCCESS;
}

/* The links to the neighbours, from their blobs. */
static brg_status setup_links(brg_comm *c, struct brg__dev_ring *d, const dev_blob *self,
                              const dev_blob *next, const dev_blob *prev) {
  brg_status s = BRG_SUCCESS;
  if (!d->send_staged) {
    s = brg__dev_link_map(c, d, &d->st.fifo_out, c->ring.next, self, next,
                          (size_t)d->nslots * d->stride, d->stride, next->fifo_info);
    d->st.next_fifo = d->st.fifo_out.fifo.data;
    if (s == BRG_SUCCESS)
      s = peer_events(c, d, self, next, next->rel_ev_ptr, next->rel_ev, d->st.next_rel_ev,
                      &d->st.next_opened, "cudaIpcOpenEventHandle (next rank's events)");
  }
  /* (a staged link's slots are the host transport's FIFO) */
  if (s == BRG_SUCCESS && !d->recv_staged)
    s = peer_events(c, d, self, prev, prev->send_ev_ptr, prev->send_ev, d->st.prev_send_ev,
                    &d->st.prev_opened, "cudaIpcOpenEventHandle (previous rank's events)");
  return s;
}

/* Kernel mode runs instead: step mode's events go unused (nobody opened
 * them). Its FIFO stays until destroy (ring_release): freeing GPU memory
 * waits for all work on the device, and the neighbours' kernels, which a
 * rank of this process on the same GPU may have launched already, wait for
 * this rank's. */
void brg__dev_step_unused(struct brg__dev_ring *d) {
  const brg__cuda_api *api = d->api;
  for (int k = 0; k < d->nslots; k++) {
    if (d->st.send_ev[k]) api->drv.event_destroy(d->st.send_ev[k]);
    if (d->st.rel_ev[k]) api->drv.event_destroy(d->st.rel_ev[k]);
    d->st.send_ev[k] = d->st.rel_ev[k] = NULL;
  }
}

/* What step mode runs with, at INFO. */
static void step_log(brg_comm *c, struct brg__dev_ring *d, const dev_blob *mine,
                     const dev_blob *all, int kwho, const char *kwhy) {
  int share = 0;
  for (int r = 0; r < c->nranks; r++) share += !memcmp(all[r].uuid, mine->uuid, 16);
  char desc[256];
  d->api->drv.describe(desc, sizeof desc);
  BRG__INFO("init", "device ring: not kernel mode: rank %d: %s", kwho, kwhy ? kwhy : "?");
  BRG__INFO("init",
            "device ring: step mode (a copy or reduce kernel per slice and step, "
            "ordered by interprocess events; no kernel waits for another process), "
            "%d slots of %zu bytes (a slice) in GPU memory; %d of %d ranks on this GPU%s; "
            "%s%s%s%s",
            d->nslots, d->slice_bytes, share, c->nranks,
            share > 1
                ? (mine->mps ? ", MPS running" : ", no MPS: their kernels take turns on the GPU")
                : "",
            desc,
            d->st.send_gdr   ? "; to the next rank GPU to GPU (GPUDirect RDMA)"
            : d->send_staged ? "; to the next rank through pinned host memory (staged link)"
                             : "",
            d->st.recv_gdr   ? "; from the previous rank GPU to GPU (GPUDirect RDMA)"
            : d->recv_staged ? "; from the previous rank through pinned host memory (staged link)"
                             : "",
            d->async ? "; host side on the communicator's thread, the call returns at once "
                       "(the caller's stream waits on a flag)"
                     : "");
  if (d->send_staged || d->recv_staged)
    BRG__INFO("init", "device ring: a slice crosses a staged link (%s) in slots of %zu bytes",
              (d->send_staged ? d->send_t : d->recv_t)->name, c->slice_bytes);
}

/* Step mode chosen: the links to the neighbours, GPUDirect RDMA where both
 * ends registered, asynchronous mode where asked; then the ring is
 * published (c->dev). */
brg_status brg__dev_step_finish(brg_comm *c, struct brg__dev_ring *d, const dev_blob *mine,
                                const dev_blob *all, int kwho, const char *kwhy) {
  brg_status s = setup_links(c, d, mine, &all[c->ring.next], &all[c->ring.prev]);
  if (s != BRG_SUCCESS) return s;
  /* GPUDirect runs on a link when both of its ends registered. */
  d->st.send_gdr = d->send_staged && mine->gdr_send_ok && all[c->ring.next].gdr_recv_ok;
  d->st.recv_gdr = d->recv_staged && all[c->ring.prev].gdr_send_ok && mine->gdr_recv_ok;
  if (d->st.send_gdr)
    c->ring.send.ops->dev_remote(&c->ring.send, all[c->ring.next].fifo_ptr,
                                 all[c->ring.next].gdr_rkey, d->st.gdr_stride);
  if ((d->send_staged && !d->st.send_gdr) || (d->recv_staged && !d->st.recv_gdr))
    BRG__INFO("init", "GPUDirect RDMA not used on the staged links: %s",
              mine->gdr_why[0]                    ? mine->gdr_why
              : d->send_staged && !d->st.send_gdr ? all[c->ring.next].gdr_why
                                                  : all[c->ring.prev].gdr_why);
  char why[192];
  if (d->async && brg__dev_async_setup(d, why, sizeof why) != 0) {
    d->async = 0;
    BRG__INFO("init",
              "device collectives keep their host side on the calling thread (the call "
              "returns when the collective is done on ranks with a staged link): %s",
              why);
  }
  step_log(c, d, mine, all, kwho, kwhy);
  __atomic_store_n(&c->dev, d, __ATOMIC_RELEASE);
  return BRG_SUCCESS;
}

/* ---- step mode: the memory operations of ring.c's run_prim ---- */

/* A link between hosts takes a slice in pieces of the network transport's
 * slot; a link between two GPUs of this host takes the whole slice in one
 * slot, which the pieces' kernels fill or read at their offsets. */
static uint64_t dev_piece(const struct brg__ring_op *o, int send) {
  const struct brg__dev_ring *d = o->dev;
  return send ? d->st.send_piece : d->st.recv_piece;
}

/* Receives from the previous rank: where piece `bytes` is to be read
 * (*r), once its writer has run (the stream waits, or the host waited). */
static brg_status dev_recv(struct brg__ring_op *o, size_t shift, uint64_t bytes, const char **r) {
  brg_comm *c = o->c;
  struct brg__dev_ring *d = o->dev;
  const brg__cuda_api *api = d->api;
  const brg__coll *k = o->coll;
  int rk = (int)(o->r->recv_pos % (uint64_t)d->nslots), e;
  const char *hdr;
  brg_status s;
  if (d->st.recv_gdr) {
    /* the piece landed in the GPU slot itself (at shift 0) */
    if ((s = brg__ring_recv_acquire(o, &hdr, bytes)) != BRG_SUCCESS) return s;
    if ((e = api->drv.flush_rdma_writes()) != 0)
      return brg__dev_cuda_fail(c, api, e, "flushing GPUDirect RDMA writes");
    *r = d->st.fifo + (size_t)rk * d->st.gdr_stride;
    return BRG_SUCCESS;
  }
  if (d->recv_staged) {
    if ((s = brg__ring_recv_acquire(o, &hdr, bytes)) != BRG_SUCCESS) return s;
    *r = d->st.recv_region_dev + (hdr - d->st.recv_region);
    return BRG_SUCCESS;
  }
  if ((s = brg__ring_recv_acquire(o, &hdr, 0)) != BRG_SUCCESS) return s;
  uint64_t theirs;
  memcpy(&theirs, hdr, sizeof theirs);
  if (theirs != bytes)
    return brg__comm_error(c, BRG_ERR_MISMATCH,
                           "collective mismatch: rank %d sent %llu bytes of GPU data at step %d "
                           "of %s #%llu, rank %d expected %llu",
                           o->r->prev, (unsigned long long)theirs, o->r->cur_step,
                           brg__coll_name(k->kind), (unsigned long long)k->seq, c->rank,
                           (unsigned long long)bytes);
  e = api->drv.stream_wait_event(k->stream, d->st.prev_send_ev[rk]);
  if (e) return brg__dev_cuda_fail(c, api, e, "cudaStreamWaitEvent (previous rank's slot)");
  *r = d->st.fifo + (size_t)rk * d->stride + shift;
  return BRG_SUCCESS;
}

/* Sends to the next rank: where piece `bytes` is to be written (*slot),
 * once the slot is free. */
static brg_status dev_send(struct brg__ring_op *o, size_t shift, uint64_t bytes, char **slot) {
  brg_comm *c = o->c;
  struct brg__dev_ring *d = o->dev;
  const brg__cuda_api *api = d->api;
  int sk = (int)(o->r->send_pos % (uint64_t)d->nslots), e;
  char *hslot;
  brg_status s;
  if (d->st.send_gdr) {
    if ((s = brg__ring_send_acquire(o, bytes, &hslot)) != BRG_SUCCESS) return s;
    *slot = d->st.gdr_send + (size_t)sk * d->st.gdr_stride;
    return BRG_SUCCESS;
  }
  if (d->send_staged) {
    if ((s = brg__ring_send_acquire(o, bytes, &hslot)) != BRG_SUCCESS) return s;
    *slot = d->st.send_region_dev + (hslot - d->st.send_region);
    return BRG_SUCCESS;
  }
  if ((s = brg__ring_send_acquire(o, 0, &hslot)) != BRG_SUCCESS) return s;
  /* One lap on, the slot is free once the next rank's kernel that read it
   * has run. */
  if (o->r->send_pos >= (uint64_t)d->nslots &&
      (e = api->drv.stream_wait_event(o->coll->stream, d->st.next_rel_ev[sk])) != 0)
    return brg__dev_cuda_fail(c, api, e, "cudaStreamWaitEvent (next rank's slot)");
  *slot = d->st.next_fifo + (size_t)sk * d->stride + shift;
  memcpy(hslot, &bytes, sizeof bytes);
  return BRG_SUCCESS;
}

/* The kernel of a primitive on one piece: m elements of input `in` and
 * output `out`, reading received slot `r` and writing the next rank's slot
 * `slot`, on the collective's stream. */
static brg_status dev_apply(struct brg__ring_op *o, brg__prim prim, const char *in, char *out,
                            const char *r, char *slot, size_t m, const void **payload) {
  struct brg__dev_ring *d = o->dev;
  const brg__cuda_api *api = d->api;
  const brg__coll *k = o->coll;
  brg_op mid = k->op == BRG_AVG ? BRG_SUM : k->op;
  size_t bytes = m * o->esize;
  int n = o->c->nranks, e = 0;
  void *st = k->stream;
  (void)payload; /* kernels always write the slot */
  d->last_stream = st;
  if (m == 0) return BRG_SUCCESS;
  brg__prim_math w = brg__prim_math_of(prim);
  void *d0 = brg__prim_buf(w.dst0, in, r, out, slot), *d1 = brg__prim_buf(w.dst1, in, r, out, slot);
  const void *x = brg__prim_buf(w.a, in, r, out, slot), *y = brg__prim_buf(w.b, in, r, out, slot);
  if (w.reduce)
    e = api->kern.reduce(d0, d1, x, y, m, k->dtype, w.last ? k->op : mid, w.last ? n : 1, st);
  else
    e = api->kern.copy(d0, d1, x, bytes, st);
  return e ? brg__dev_cuda_fail(o->c, api, e, "reduce/copy kernel launch") : BRG_SUCCESS;
}

/* Hands a written slot to the next rank: an event says when the kernel
 * has written it; the network transport reads it from host memory, so for
 * a link between hosts the host waits for that first. */
static brg_status dev_sent(struct brg__ring_op *o, uint64_t bytes, const void *payload) {
  brg_comm *c = o->c;
  struct brg__dev_ring *d = o->dev;
  int sk = (int)(o->r->send_pos % (uint64_t)d->nslots), e;
  brg_status s;
  (void)payload;
  if ((e = d->api->drv.event_record(d->st.send_ev[sk], o->coll->stream)) != 0)
    return brg__dev_cuda_fail(c, d->api, e, "cudaEventRecord");
  if (d->send_staged &&
      (s = brg__dev_event_wait(c, d, d->st.send_ev[sk],
                               "cudaEventQuery (slot of the staged link to the next rank)")) !=
          BRG_SUCCESS)
    return s;
  return brg__ring_send_post(o, d->send_staged ? bytes : 0, NULL);
}

/* Hands a read slot back to the previous rank, once the kernel that read it
 * has run (the previous rank's stream waits for the event; for a link
 * between hosts the host waits before freeing the slot). */
static brg_status dev_received(struct brg__ring_op *o) {
  brg_comm *c = o->c;
  struct brg__dev_ring *d = o->dev;
  int rk = (int)(o->r->recv_pos % (uint64_t)d->nslots), e;
  brg_status s;
  if ((e = d->api->drv.event_record(d->st.rel_ev[rk], o->coll->stream)) != 0)
    return brg__dev_cuda_fail(c, d->api, e, "cudaEventRecord");
  if (d->recv_staged &&
      (s = brg__dev_event_wait(
           c, d, d->st.rel_ev[rk],
           "cudaEventQuery (slot of the staged link from the previous rank)")) != BRG_SUCCESS)
    return s;
  brg__ring_recv_release(o);
  return BRG_SUCCESS;
}

const brg__mem_ops brg__mem_device = {
    .name = "GPU",
    .piece = dev_piece,
    .recv = dev_recv,
    .send = dev_send,
    .apply = dev_apply,
    .sent = dev_sent,
    .received = dev_received,
};
