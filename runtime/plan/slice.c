/*
 * The slice: the pipeline unit, one slice per FIFO slot, that a ring
 * collective streams around the ring. The host ring's is decided here, once
 * per communicator (comm.c, at create), and step mode's once per device
 * ring (device_setup.c); the engines that walk a collective (ring.c, lat.c)
 * ask for it in elements. Kernel mode's slot is the cost model's
 * (model.c, brg__model_device_shape, taken by device_kernel.c) unless a
 * staged link or BRIGADE_SLICE_BYTES makes it this file's
 * BRG__SLICE_KERNEL; its one-shot slots follow BRIGADE_DEVICE_SMALL_BYTES
 * (device_kernel.c), and point-to-point links have a slot of their own
 * (p2p.c). Every rank holds the same settings, peer table and ring order,
 * so every rank decides alike.
 */
#include "device.h"
#include "internal.h"
#include "settings.h"

/* The host ring's: BRIGADE_SLICE_BYTES where it is set, else the largest
 * any link of the ring prefers (the transport's slice_bytes), else that
 * setting's default; a multiple of 64 bytes. */
static size_t host_slice(const brg_comm *c) {
  size_t bytes = (size_t)brg__core_int(BRG__CORE_SLICE_BYTES);
  int links = c->nranks > 1 && !brg__config_is_set(&brg__core_config, BRG__CORE_SLICE_BYTES);
  for (int i = 0; links && i < c->nranks; i++) {
    const brg__transport_ops *t = brg__transport_pick(&c->peers[c->ring.order[i]],
                                                      &c->peers[c->ring.order[(i + 1) % c->nranks]],
                                                      c->transports, BRG__CARRIES_HOST);
    if (t && t->slice_bytes > bytes) bytes = t->slice_bytes;
  }
  return bytes & ~(size_t)63;
}

/* Step mode's: BRIGADE_DEVICE_SLICE_BYTES, a multiple of 256 bytes. A
 * staged link takes a slice in pieces of the host link's slot (the host
 * slice). A step that only sends (the first) fills the link with a whole
 * slice before the next rank reads any of it, and the next step holds a
 * received piece while it waits for a free slot: a slice of more pieces
 * than half the slots could fill the ring's links all around and stall
 * it, so on a ring with a staged link the slice is at most that. */
static size_t step_slice(const brg_comm *c) {
  size_t bytes = (size_t)brg__device_int(BRG__DEVICE_SLICE_BYTES) & ~(size_t)255;
  size_t staged_cap = ((size_t)(c->nslots > 3 ? c->nslots / 2 : 1) * c->slice_bytes) & ~(size_t)255;
  if (brg__device_staged_any(c) && staged_cap && bytes > staged_cap) bytes = staged_cap;
  return bytes;
}

size_t brg__slice_bytes(const brg_comm *c, brg__slice_path path) {
  switch (path) {
  case BRG__SLICE_HOST: return host_slice(c);
  case BRG__SLICE_STEP: return step_slice(c);
  case BRG__SLICE_KERNEL:
    /* a slot of the host link carries one whole (the proxy's links) */
    return c->slice_bytes & ~(size_t)255;
  }
  return 0;
}

size_t brg__slice_elems(const brg_comm *c, const brg__coll *k) {
  size_t esize = brg_dtype_size(k->dtype);
  size_t bytes = k->device && c->dev ? brg__device_ring_slice_bytes(c->dev) : c->slice_bytes;
  return bytes / esize ? bytes / esize : 1;
}
