/*
 * Asynchronous mode (BRIGADE_DEVICE_PROXY): the host side of a step-mode
 * collective runs on the communicator's thread on the ring's own stream,
 * and the caller's stream waits on a flag that stream writes.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device_ring_int.h"

/* Sets the flag from the host to `ticket` unless it is already there or
 * beyond (in the flag's wrapping order). */
void brg__dev_flag_raise(struct brg__dev_ring *d, uint32_t ticket) {
  uint32_t cur = __atomic_load_n(d->flag_host, __ATOMIC_ACQUIRE);
  while ((int32_t)(ticket - cur) > 0 &&
         !__atomic_compare_exchange_n(d->flag_host, &cur, ticket, 0, __ATOMIC_RELEASE,
                                      __ATOMIC_ACQUIRE)) {}
}

/* The ring's stream, its flag and its events, on the ring's GPU. Where the
 * driver cannot make a stream wait on a flag, collectives keep their host
 * side on the calling thread; 0 or the reason in why. */
int brg__dev_async_setup(struct brg__dev_ring *d, char *why, size_t cap) {
  const brg__cuda_api *api = d->api;
  const char *what = "cudaStreamCreate";
  int e = api->drv.stream_create(&d->proxy);
  if (!e) {
    what = "cudaEventCreate";
    e = api->drv.event_create(&d->proxy_ev);
  }
  if (!e) {
    what = "the flag page";
    e = brg__dev_pinned_alloc(api, FLAG_PAGE, (char **)&d->flag_host, (char **)&d->flag_dev);
  }
  if (!e) {
    what = "cuStreamWaitValue32";
    /* The flag is 0: this wait passes at once, and shows that the driver has them. */
    e = api->drv.stream_wait_value(d->proxy, d->flag_dev, 0);
  }
  if (e) snprintf(why, cap, "%s: %s", what, e == -1 ? strerror(errno) : api->drv.error_string(e));
  return e;
}

/* A start event from the spares, or a new one; NULL when none can be made. */
static void *start_event(struct brg__dev_ring *d) {
  void *ev = NULL;
  pthread_mutex_lock(&d->ev_lock);
  if (d->nspare > 0) ev = d->spare_ev[--d->nspare];
  pthread_mutex_unlock(&d->ev_lock);
  if (!ev && d->api->drv.event_create(&ev) != 0) ev = NULL;
  return ev;
}

static void spare_event(struct brg__dev_ring *d, void *ev) {
  pthread_mutex_lock(&d->ev_lock);
  if (d->nspare == d->capspare) {
    int cap = d->capspare ? 2 * d->capspare : 16;
    void **a = realloc(d->spare_ev, (size_t)cap * sizeof *a);
    if (a) {
      d->spare_ev = a;
      d->capspare = cap;
    }
  }
  if (d->nspare < d->capspare) {
    d->spare_ev[d->nspare++] = ev;
    ev = NULL;
  }
  pthread_mutex_unlock(&d->ev_lock);
  if (ev) d->api->drv.event_destroy(ev);
}

/* The event recorded on a caller's stream after its waits on the flag. */
static void *caller_event(struct brg__dev_ring *d, void *stream) {
  for (int i = 0; i < d->ncallers; i++)
    if (d->callers[i].stream == stream) return d->callers[i].ev;
  int n = (int)(sizeof d->callers / sizeof d->callers[0]);
  if (d->ncallers == n) return NULL;
  void *ev = NULL;
  if (d->api->drv.event_create(&ev) != 0) return NULL;
  d->callers[d->ncallers].stream = stream;
  d->callers[d->ncallers].ev = ev;
  d->ncallers++;
  return ev;
}

int brg__device_ring_async(const struct brg__dev_ring *d) {
  return d && d->async;
}

brg_status brg__device_async_begin(brg_comm *c, brg__coll *k) {
  struct brg__dev_ring *d = c->dev;
  const brg__cuda_api *api = d->api;
  void *ev = start_event(d), *after = caller_event(d, k->stream);
  if (!ev || !after) {
    if (ev) spare_event(d, ev);
    return brg__comm_error(c, BRG_ERR_SYSTEM,
                           "rank %d: %s: no event for the caller's stream %p (more than %d "
                           "streams, or cudaEventCreate failed)",
                           c->rank, brg__coll_name(k->kind), k->stream,
                           (int)(sizeof d->callers / sizeof d->callers[0]));
  }
  uint32_t ticket = d->issued + 1;
  int e = api->drv.event_record(ev, k->stream);
  if (!e) e = api->drv.stream_wait_value(k->stream, d->flag_dev, ticket);
  if (!e) e = api->drv.event_record(after, k->stream);
  if (e) {
    spare_event(d, ev);
    return brg__dev_cuda_fail(c, api, e, "ordering the caller's stream after the collective");
  }
  d->issued = ticket;
  k->async = 1;
  k->ticket = ticket;
  k->start_ev = ev;
  k->stream = d->proxy;
  return BRG_SUCCESS;
}

brg_status brg__device_async_start(brg_comm *c, brg__coll *k) {
  struct brg__dev_ring *d = c->dev;
  int e = d->api->drv.stream_wait_event(d->proxy, k->start_ev);
  spare_event(d, k->start_ev);
  k->start_ev = NULL;
  return e ? brg__dev_cuda_fail(c, d->api, e, "cudaStreamWaitEvent (the caller's stream)")
           : BRG_SUCCESS;
}

void brg__device_async_end(brg_comm *c, brg__coll *k, brg_status s) {
  struct brg__dev_ring *d = c->dev;
  const brg__cuda_api *api = d->api;
  if (k->start_ev) {
    spare_event(d, k->start_ev);
    k->start_ev = NULL;
  }
  /* In stream order after the collective; and from the host at once when
   * it failed, so that the caller's stream does not wait for work that may
   * never run (the error reaches the caller at its next call). */
  int e = api->drv.stream_write_value(d->proxy, d->flag_dev, k->ticket);
  if (!e) e = api->drv.event_record(d->proxy_ev, d->proxy);
  if (s != BRG_SUCCESS || e) brg__dev_flag_raise(d, k->ticket);
}
