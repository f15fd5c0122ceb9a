/*
 * The device ring's lifetime (device.h): built at the first device
 * collective in three steps around two all-gathers (prepare, local,
 * finish), each mode's part set up by its own file; drained and freed at
 * destroy.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "device_ring_int.h"

static void ring_release(struct brg__dev_ring *d);

static const char *kmode_name(int m) {
  return m == 0 ? "auto" : m == 1 ? "kernel" : m == 2 ? "step" : "?";
}

/* A random number per process, so that ranks can tell that they share one
 * (pids repeat across PID namespaces). */
static pthread_mutex_t token_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t token;
static pid_t token_pid; /* a forked child makes its own */

static uint64_t process_token(void) {
  pthread_mutex_lock(&token_lock);
  if (token == 0 || token_pid != getpid()) {
    if (getrandom(&token, sizeof token, 0) != (ssize_t)sizeof token)
      token = (uint64_t)brg__now_ns() ^ ((uint64_t)getpid() << 32);
    token |= 1;
    token_pid = getpid();
  }
  uint64_t t = token;
  pthread_mutex_unlock(&token_lock);
  return t;
}

/* Whether MPS serves this process's work on `gpu`: the driver's answer
 * where it has one (cudaDevAttrMpsEnabled), else whether the control
 * daemon's pipe is there; *driver says which. Every rank puts its verdict
 * in its blob, and ranks that share a GPU must agree (a rank that guessed
 * alone could take kernel mode while the other took step mode). */
static int mps_verdict(const brg__cuda_api *api, int gpu, int32_t *driver) {
  int on = 0;
  if (api->drv.mps_enabled(gpu, &on) == 0) {
    *driver = 1;
    return on;
  }
  *driver = 0;
  const char *dir = getenv("CUDA_MPS_PIPE_DIRECTORY");
  char path[512];
  snprintf(path, sizeof path, "%s/control", dir && dir[0] ? dir : "/tmp/nvidia-mps");
  return access(path, F_OK) == 0;
}

static const char *mps_words(const dev_blob *b) {
  return b->mps ? (b->mps_driver ? "MPS running (the driver says)"
                                 : "MPS running (its control pipe is there)")
                : (b->mps_driver ? "no MPS (the driver says)" : "no MPS (no control pipe)");
}

/* Building the device ring (brg__device_ring_setup), in three steps
 * around two all-gathers over the host ring (of `mine` into `all`,
 * blob_bytes each): prepare says which GPU this rank has; local, given every rank's GPU, sets up this rank's own half
 * (its receive FIFO in GPU memory, or in pinned host memory where the
 * previous rank's GPU cannot reach it) and describes it; finish checks
 * every rank's description, connects to the neighbours and frees the
 * descriptions. Each step takes the status of the all-gather before it. */
typedef struct brg__dev_setup {
  struct brg__dev_ring *d;
  void *mine, *all;
  size_t blob_bytes;
} brg__dev_setup;

/* The device links' transports and the step-mode slice. A device link
 * without GPU memory of its own stages through the host link, which then
 * is of the same transport (every transport that carries host collectives
 * carries device ones this way). Both ends of each link chose alike: init
 * checked (comm.c). */
static brg_status prepare_links(brg_comm *c, struct brg__dev_ring *d) {
  d->nslots = c->nslots;
  d->slice_bytes = brg__slice_bytes(c, BRG__SLICE_STEP);
  d->link_send = &c->ring.send;
  d->link_recv = &c->ring.recv;
  d->send_t = brg__device_link(c, c->rank, c->ring.next);
  d->recv_t = brg__device_link(c, c->ring.prev, c->rank);
  d->send_staged = !d->send_t || !d->send_t->gpu_memory;
  d->recv_staged = !d->recv_t || !d->recv_t->gpu_memory;
  if ((d->send_staged && c->nranks > 1 && d->send_t != c->ring.send.ops) ||
      (d->recv_staged && c->nranks > 1 && d->recv_t != c->ring.recv.ops)) {
    int from = d->send_staged ? c->rank : c->ring.prev,
        to = d->send_staged ? c->ring.next : c->rank;
    return brg__comm_error(c, BRG_ERR_INTERNAL,
                           "device collectives: no transport carries GPU memory from rank %d to "
                           "rank %d, and the host link's transport is not the one chosen",
                           from, to);
  }
  /* Every rank slices alike (the slice is the pipeline unit); each link
   * carries a slice in slots of its own size. */
  d->st.send_piece = d->send_staged ? c->slice_bytes : d->slice_bytes;
  d->st.recv_piece = d->recv_staged ? c->slice_bytes : d->slice_bytes;
  d->st.gdr_stride = c->slice_bytes + SLOT_SHIFT_ROOM;
  return BRG_SUCCESS;
}

/* Asynchronous mode (BRIGADE_DEVICE_PROXY; -1: where a device link of the
 * ring is staged through a host link). */
static int async_for(int staged) {
  int proxy = (int)brg__device_int(BRG__DEVICE_PROXY);
  return proxy < 0 ? staged : proxy;
}

int brg__device_async_mode(const brg_comm *c) {
  const struct brg__dev_ring *d = __atomic_load_n(&c->dev, __ATOMIC_ACQUIRE);
  if (d) return brg__device_ring_async(d);
  return c->nranks > 1 && async_for(brg__device_staged_any(c));
}

/* Asynchronous mode, the requested mode (BRIGADE_DEVICE_MODE) and kernel
 * mode's sizes. */
static brg_status prepare_modes(brg_comm *c, struct brg__dev_ring *d, int staged) {
  d->async = async_for(staged);
  const char *mode = brg__device_str(BRG__DEVICE_MODE);
  d->k.mode_req = !strcmp(mode, "auto")     ? 0
                  : !strcmp(mode, "kernel") ? 1
                  : !strcmp(mode, "step")   ? 2
                                            : -1;
  if (d->k.mode_req < 0)
    return brg__comm_error(c, BRG_ERR_INVALID_ARGUMENT,
                           "BRIGADE_DEVICE_MODE=\"%s\" is not a mode (auto, kernel or step)", mode);
  brg__dev_kernel_sizes(c, d, staged);
  return BRG_SUCCESS;
}

/* The hardware queues (connections) CUDA gives each GPU of this process:
 * CUDA_DEVICE_MAX_CONNECTIONS, read by CUDA as it starts, 8 unless set,
 * 1 to 32. */
static int hardware_queues(void) {
  const char *v = getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  int n = v && *v ? atoi(v) : 8;
  return n < 1 ? 1 : n > 32 ? 32 : n;
}

/* What this rank tells every other one first: its process, GPU and slots. */
static void describe_rank(const brg_comm *c, const brg__cuda_api *api, struct brg__dev_ring *d,
                          dev_blob *mine) {
  mine->pid = (int32_t)getpid();
  mine->process = process_token();
  if (api->drv.get_device(&mine->gpu) != 0) mine->gpu = 0;
  d->px.gpu = mine->gpu;
  mine->nslots = d->nslots;
  mine->slice_bytes = d->slice_bytes;
  if (api->drv.device_uuid(mine->uuid) != 0) memset(mine->uuid, 0, sizeof mine->uuid);
  mine->mps = mps_verdict(api, mine->gpu, &mine->mps_driver);
  mine->streams = 1 + (d->async ? 1 : 0) + (c->nrings > 1 ? c->nrings - 1 : 0);
  mine->connections = hardware_queues();
  mine->ksms = d->k.sms;
  mine->kper_sm = d->k.per_sm;
}

static brg_status brg__device_ring_prepare(brg_comm *c, brg__dev_setup *st) {
  const char *why = "";
  const brg__cuda_api *api = brg__device_api(&why);
  if (!api) return brg__comm_error(c, BRG_ERR_UNAVAILABLE, "device collectives: %s", why);
  struct brg__dev_ring *d = calloc(1, sizeof *d);
  dev_blob *all = calloc((size_t)c->nranks, sizeof *all), *mine = calloc(1, sizeof *mine);
  int staged = brg__device_staged_any(c);
  brg_status s = BRG_SUCCESS;
  if (!d || !all || !mine)
    s = brg__comm_error(c, BRG_ERR_NO_MEMORY, "device collectives: out of host memory");
  if (s == BRG_SUCCESS) {
    d->api = api;
    s = prepare_links(c, d);
  }
  if (s == BRG_SUCCESS) s = prepare_modes(c, d, staged);
  if (s != BRG_SUCCESS) {
    free(d);
    free(all);
    free(mine);
    return s;
  }
  pthread_mutex_init(&d->ev_lock, NULL);
  describe_rank(c, api, d, mine);
  d->stride = d->slice_bytes + SLOT_SHIFT_ROOM;
  st->d = d;
  st->mine = mine;
  st->all = all;
  st->blob_bytes = sizeof *mine;
  return BRG_SUCCESS;
}

static brg_status brg__device_ring_local(brg_comm *c, brg__dev_setup *st, brg_status gathered) {
  dev_blob *mine = st->mine, *all = st->all;
  if (gathered != BRG_SUCCESS) return gathered;
  brg__dev_kernel_local(c, st->d, mine, all, brg__device_staged_any(c));
  brg__dev_step_local(c, st->d, mine, &all[c->ring.prev]);
  /* Every kernel loaded now, before the last all-gather: under lazy
   * loading a collective's first launch would load its kernel, which may
   * wait for all work on the GPU, a neighbour's kernel that waits for this
   * rank among it. A GPU the kernels were not built for fails here. */
  int e = st->d->api->drv.load_kernels();
  if (e && mine->ok) {
    mine->ok = 0;
    snprintf(mine->why, sizeof mine->why, "loading the CUDA module's kernels: %s",
             st->d->api->drv.error_string(e));
  }
  /* A failed half is described in `mine` (ok = 0, why): the second
   * all-gather still runs, so every rank learns it. */
  return BRG_SUCCESS;
}

/* Whether every rank's description agrees with this rank's: its half set
 * up, and the slots, slices, modes, one-shot areas and MPS alike. */
/* Ranks of one process on one GPU (threads) each keep streams of their own
 * there, and a GPU runs the streams of a process in
 * CUDA_DEVICE_MAX_CONNECTIONS hardware queues, each in issue order: where
 * there are more streams than queues, two streams share one, and a
 * rank's spinning kernel, or its wait for a neighbour, holds back the
 * neighbour's work queued behind it, which it waits for. Refused, with
 * the numbers, on every rank alike (from the blobs). */
static brg_status queues_suffice(brg_comm *c, const dev_blob *all) {
  for (int r = 0; r < c->nranks; r++) {
    int ranks = 0, streams = 0, first = -1;
    for (int q = 0; q < c->nranks; q++)
      if (all[q].process == all[r].process && !memcmp(all[q].uuid, all[r].uuid, 16)) {
        if (first < 0) first = q;
        ranks++;
        streams += all[q].streams;
      }
    if (first != r || ranks < 2 || streams <= all[r].connections) continue;
    return brg__comm_error(
        c, BRG_ERR_UNAVAILABLE,
        "device collectives: %d ranks of this communicator (rank %d first) run in one process "
        "(pid %d) on one GPU with %d streams there (each rank's caller's stream, and its "
        "proxy's and rings' where it has them), more than the %d hardware queues CUDA gives a "
        "GPU (CUDA_DEVICE_MAX_CONNECTIONS): streams that share a queue run in turn, and one "
        "rank's kernel or wait would hold back a neighbour's that it waits for. Set "
        "CUDA_DEVICE_MAX_CONNECTIONS=%d (at most 32) before the process starts CUDA, or run "
        "fewer ranks per process",
        ranks, r, all[r].pid, streams, all[r].connections, streams <= 32 ? streams : 32);
  }
  return BRG_SUCCESS;
}

static brg_status blobs_agree(brg_comm *c, const dev_blob *mine, const dev_blob *all) {
  brg_status s = BRG_SUCCESS;
  for (int r = 0; s == BRG_SUCCESS && r < c->nranks; r++) {
    if (!all[r].ok)
      s = brg__comm_error(c, BRG_ERR_SYSTEM,
                          "device collectives: rank %d could not set up its "
                          "GPU side: %s",
                          r, all[r].why);
    else if (all[r].nslots != mine->nslots || all[r].slice_bytes != mine->slice_bytes)
      s = brg__comm_error(c, BRG_ERR_INVALID_USAGE,
                          "device collectives: rank %d has %d GPU slots of %llu bytes, rank %d "
                          "%d of %llu (set BRIGADE_STEPS and BRIGADE_DEVICE_SLICE_BYTES alike "
                          "on every rank)",
                          r, all[r].nslots, (unsigned long long)all[r].slice_bytes, c->rank,
                          mine->nslots, (unsigned long long)mine->slice_bytes);
  }
  for (int r = 0; s == BRG_SUCCESS && r < c->nranks; r++)
    if (all[r].kmode_req != mine->kmode_req || all[r].kchannels != mine->kchannels ||
        all[r].kslot != mine->kslot)
      s = brg__comm_error(c, BRG_ERR_MISMATCH,
                          "device collectives: rank %d has BRIGADE_DEVICE_MODE %s with %d "
                          "channels of %llu-byte slots, rank %d %s with %d of %llu (set "
                          "BRIGADE_DEVICE_MODE, BRIGADE_DEVICE_CHANNELS and BRIGADE_SLICE_BYTES "
                          "alike on every rank)",
                          r, kmode_name(all[r].kmode_req), all[r].kchannels,
                          (unsigned long long)all[r].kslot, c->rank, kmode_name(mine->kmode_req),
                          mine->kchannels, (unsigned long long)mine->kslot);
  /* The limits themselves, not only the slots they round up to: each
   * rank picks a call's path (ring, one-shot, LL) by its own limits, and
   * ranks that pick differently wait for each other until the watchdog. */
  for (int r = 0; s == BRG_SUCCESS && r < c->nranks; r++)
    if (all[r].kos_limit != mine->kos_limit || all[r].kll_limit != mine->kll_limit)
      s = brg__comm_error(c, BRG_ERR_MISMATCH,
                          "device collectives: rank %d sends allreduces of up to %llu bytes "
                          "in one hop (BRIGADE_DEVICE_SMALL_BYTES) and of up to %llu bytes as LL "
                          "lines (BRIGADE_DEVICE_LL_BYTES), but rank %d up to %llu and %llu: "
                          "the ranks would take different paths for the same call (set "
                          "BRIGADE_DEVICE_SMALL_BYTES and BRIGADE_DEVICE_LL_BYTES alike on "
                          "every rank)",
                          r, (unsigned long long)all[r].kos_limit,
                          (unsigned long long)all[r].kll_limit, c->rank,
                          (unsigned long long)mine->kos_limit, (unsigned long long)mine->kll_limit);
  for (int r = 0; s == BRG_SUCCESS && r < c->nranks; r++)
    if (all[r].kring_ll_limit != mine->kring_ll_limit)
      s = brg__comm_error(c, BRG_ERR_MISMATCH,
                          "device collectives: rank %d sends ring slots as LL lines for calls "
                          "of up to %llu bytes, rank %d up to %llu: the ranks would send and "
                          "read the same slots in different forms (set "
                          "BRIGADE_DEVICE_RING_LL_BYTES alike on every rank)",
                          r, (unsigned long long)all[r].kring_ll_limit, c->rank,
                          (unsigned long long)mine->kring_ll_limit);
  for (int r = 0; s == BRG_SUCCESS && r < c->nranks; r++)
    if (all[r].kdirect_limit != mine->kdirect_limit)
      s = brg__comm_error(c, BRG_ERR_MISMATCH,
                          "device collectives: rank %d takes the two-shot path for allreduces "
                          "of up to %llu bytes, rank %d up to %llu: the ranks would take "
                          "different paths for the same call (set BRIGADE_DEVICE_DIRECT_BYTES "
                          "alike on every rank)",
                          r, (unsigned long long)all[r].kdirect_limit, c->rank,
                          (unsigned long long)mine->kdirect_limit);
  for (int r = 0; s == BRG_SUCCESS && r < c->nranks; r++)
    if (all[r].kos_slot != mine->kos_slot || all[r].kll_slot != mine->kll_slot)
      s = brg__comm_error(c, BRG_ERR_MISMATCH,
                          "device collectives: rank %d has one-shot slots of %llu bytes (LL: "
                          "%llu), rank %d of %llu (%llu) (set BRIGADE_DEVICE_SMALL_BYTES and "
                          "BRIGADE_DEVICE_LL_BYTES alike on every rank)",
                          r, (unsigned long long)all[r].kos_slot,
                          (unsigned long long)all[r].kll_slot, c->rank,
                          (unsigned long long)mine->kos_slot, (unsigned long long)mine->kll_slot);
  for (int r = 0; s == BRG_SUCCESS && r < c->nranks; r++)
    for (int q = 0; s == BRG_SUCCESS && q < r; q++)
      if (brg__dev_shares_gpu(c, all, r, q) && all[r].mps != all[q].mps)
        s = brg__comm_error(c, BRG_ERR_MISMATCH,
                            "device collectives: ranks %d and %d share a GPU in different "
                            "processes, but rank %d finds %s and rank %d %s (their kernels would "
                            "take different modes; run every process of the GPU under the MPS "
                            "daemon or none, with one CUDA_MPS_PIPE_DIRECTORY)",
                            q, r, q, mps_words(&all[q]), r, mps_words(&all[r]));
  if (s == BRG_SUCCESS) s = queues_suffice(c, all);
  return s;
}

static brg_status brg__device_ring_finish(brg_comm *c, brg__dev_setup *st, brg_status gathered) {
  struct brg__dev_ring *d = st->d;
  dev_blob *mine = st->mine, *all = st->all;
  brg_status s = gathered == BRG_SUCCESS ? blobs_agree(c, mine, all) : gathered;
  int kwho = -1;
  const char *kwhy = s == BRG_SUCCESS ? brg__dev_kernel_refused(c, all, &kwho) : NULL;
  if (s == BRG_SUCCESS && kwhy && d->k.mode_req == 1)
    s = brg__comm_error(c, all[kwho].kunfit ? BRG_ERR_UNAVAILABLE : BRG_ERR_INVALID_USAGE,
                        "device collectives: BRIGADE_DEVICE_MODE=kernel, but rank %d cannot run "
                        "them in kernel mode: %s",
                        kwho, kwhy);
  d->k.on = s == BRG_SUCCESS && !kwhy;
  snprintf(d->step_why, sizeof d->step_why, "%s",
           d->k.mode_req == 2 ? "BRIGADE_DEVICE_MODE=step"
           : kwhy             ? kwhy
                              : "");
  if (d->k.on)
    s = brg__dev_kernel_finish(c, d, mine, all);
  else if (s == BRG_SUCCESS)
    s = brg__dev_step_finish(c, d, mine, all, kwho, kwhy);
  if (s != BRG_SUCCESS) ring_release(d);
  free(all);
  free(mine);
  return s;
}

/* The first device collective builds the device ring on every rank, over
 * the host ring: each rank says which GPU it has, then sets up its own half
 * and describes it, and each rank connects to its neighbours'. Every rank
 * takes part in both all-gathers even when its own half failed, so that
 * all of them learn which rank could not and why, instead of timing out.
 * The all-gathers run on the calling thread, in issue order (the device
 * executors' setup, device_exec.c, calls this before the collective that
 * needed the ring). */
brg_status brg__device_ring_setup(brg_comm *c) {
  brg__dev_setup st = {0};
  brg_status s = brg__device_ring_prepare(c, &st);
  if (s != BRG_SUCCESS) return s;
  brg__coll g = {.kind = BRG__COLL_ALL_GATHER,
                 .dtype = BRG_UINT8,
                 .op = BRG_SUM,
                 .root = -1,
                 .sendbuf = st.mine,
                 .recvbuf = st.all,
                 .count = st.blob_bytes};
  s = brg__coll_execute(c, &g);
  s = brg__device_ring_local(c, &st, s);
  if (s == BRG_SUCCESS) {
    brg__coll g2 = g;
    s = brg__coll_execute(c, &g2);
  }
  return brg__device_ring_finish(c, &st, s);
}

/* ---- teardown ---- */

/* Frees the device ring. Only once this rank's own work has drained and
 * both neighbours said theirs has (comm.c): their streams wait on this
 * rank's events and write its FIFO, and its stream waits on theirs. */
static void ring_release(struct brg__dev_ring *d) {
  const brg__cuda_api *api = d->api;
  brg__dev_stream_user_drop(d);
  brg__dev_proxy_join(d);
  for (int k = 0; k < d->nslots; k++) {
    if (d->st.prev_opened && d->st.prev_send_ev[k]) api->drv.event_destroy(d->st.prev_send_ev[k]);
    if (d->st.next_opened && d->st.next_rel_ev[k]) api->drv.event_destroy(d->st.next_rel_ev[k]);
  }
  brg__dev_link_close(&d->st.fifo_out);
  if (d->st.send_reg) d->link_send->ops->dev_register(d->link_send, NULL, 0, -1, 0, NULL, NULL);
  if (d->st.recv_reg) d->link_recv->ops->dev_register(d->link_recv, NULL, 0, -1, 0, NULL, NULL);
  if (d->st.send_region) api->drv.host_unregister(d->st.send_region);
  if (d->st.recv_region) api->drv.host_unregister(d->st.recv_region);
  for (int k = 0; k < d->nslots; k++) {
    if (d->st.send_ev[k]) api->drv.event_destroy(d->st.send_ev[k]);
    if (d->st.rel_ev[k]) api->drv.event_destroy(d->st.rel_ev[k]);
  }
  if (d->st.fifo_in.ops)
    brg__dev_link_close(&d->st.fifo_in);
  else if (d->st.fifo)
    api->drv.mem_free(d->st.fifo); /* a GPUDirect link's slots */
  if (d->st.gdr_send) api->drv.mem_free(d->st.gdr_send);
  if (d->proxy) api->drv.stream_destroy(d->proxy);
  if (d->proxy_ev) api->drv.event_destroy(d->proxy_ev);
  for (int i = 0; i < d->nspare; i++) api->drv.event_destroy(d->spare_ev[i]);
  free(d->spare_ev);
  for (int i = 0; i < d->ncallers; i++) api->drv.event_destroy(d->callers[i].ev);
  brg__dev_pinned_free(api, (char *)d->flag_host, FLAG_PAGE);
  brg__dev_pinned_free(api, d->stage_host, d->stage_bytes);
  for (int i = 0; i < d->nstage_old; i++)
    brg__dev_pinned_free(api, d->stage_old[i].host, d->stage_old[i].bytes);
  if (d->stage_ev) api->drv.event_destroy(d->stage_ev);
  for (int r = 0; r < BRG__RK_MAX_PEERS; r++) brg__dev_link_close(&d->k.os.conn[r]);
  brg__dev_link_close(&d->k.next_c);
  brg__dev_link_close(&d->k.prev_c);
  brg__dev_link_close(&d->k.in);
  if (d->k.ring) api->drv.mem_free(d->k.ring);
  if (d->k.done_ev) api->drv.event_destroy(d->k.done_ev);
  for (int i = 0; i < d->k.ngstreams; i++)
    if (d->k.gdone_ev[i]) api->drv.event_destroy(d->k.gdone_ev[i]);
  /* A graph that captured a launch may be replayed after this (the user's
   * error, docs/device.md): its kernels read the abort word first, set by
   * the drain, and end; so the page stays. */
  if (!d->k.graphs) brg__dev_pinned_free(api, (char *)d->k.words, KWORDS_BYTES);
  for (int r = 0; r < BRG__DEVICE_MAX_RINGS; r++) {
    if (d->rstream[r]) api->drv.stream_destroy(d->rstream[r]);
    if (d->join_ev[r]) api->drv.event_destroy(d->join_ev[r]);
  }
  if (d->fork_ev) api->drv.event_destroy(d->fork_ev);
  /* (the proxy's links deregistered these when they closed) */
  if (d->px.gdr.sbuf) api->drv.mem_free(d->px.gdr.sbuf);
  if (d->px.gdr.rbuf) api->drv.mem_free(d->px.gdr.rbuf);
  brg__dev_pinned_free(api, d->px.send, brg__dev_pregion_bytes(d));
  brg__dev_pinned_free(api, d->px.recv, brg__dev_pregion_bytes(d));
  pthread_mutex_destroy(&d->ev_lock);
  free(d);
}

uint64_t brg__device_bye_word(const brg_comm *c) {
  const struct brg__dev_ring *d = __atomic_load_n(&c->dev, __ATOMIC_ACQUIRE);
  return d && d->k.on ? brg__dev_kernel_bye_word(d) : 0;
}

brg_status brg__device_ring_settle(brg_comm *c, uint64_t theirs) {
  struct brg__dev_ring *d = c->dev;
  return d && d->k.on ? brg__dev_kernel_settle(c, d, theirs) : BRG_SUCCESS;
}

brg_status brg__device_ring_drain(brg_comm *c) {
  struct brg__dev_ring *d = c->dev;
  if (!d) return BRG_SUCCESS;
  /* A communicator that failed will not see its kernels' peers again. */
  if (__atomic_load_n(&c->broken, __ATOMIC_ACQUIRE) != BRG_SUCCESS ||
      __atomic_load_n(&c->aborted, __ATOMIC_ACQUIRE))
    brg__dev_kernel_stop(d);
  if (d->k.on) return brg__dev_kernel_drain(c, d);
  if (brg__dev_own_work_drained(d, brg__deadline_ms(c->timeout_ms))) return BRG_SUCCESS;
  d->stuck = 1;
  /* The callers' streams must not wait for the ring's own forever: its
   * flag jumps to the last ticket (what they then read is not the
   * collectives' result, which the error below says). */
  if (d->flag_host) brg__dev_flag_raise(d, d->issued);
  char stream[160];
  if (d->async)
    snprintf(stream, sizeof stream,
             "its own stream %p (the callers' streams no longer wait for it, and what they read "
             "is not a result)",
             d->proxy);
  else if (d->last_stream)
    snprintf(stream, sizeof stream, "stream %p", d->last_stream);
  else
    snprintf(stream, sizeof stream, "the legacy default stream");
  return brg__comm_error(c, BRG_ERR_REMOTE,
                         "rank %d: device work on %s did not finish within %d ms: it waits for "
                         "rank %d (pid %d on %s) or rank %d (pid %d on %s), gone or stalled; the "
                         "GPU FIFO and events stay allocated, since that stream may still use "
                         "them",
                         c->rank, stream, c->timeout_ms, c->ring.prev, c->peers[c->ring.prev].pid,
                         c->peers[c->ring.prev].hostname, c->ring.next, c->peers[c->ring.next].pid,
                         c->peers[c->ring.next].hostname);
}

void brg__device_ring_free(brg_comm *c) {
  struct brg__dev_ring *d = c->dev;
  if (!d) return;
  c->dev = NULL;
  if (d->stuck) return; /* left to the stream that still waits: freeing it would crash */
  ring_release(d);
}
