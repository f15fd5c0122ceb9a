/*
 * Building the device ring (device.h): prepare, local and finish around
 * the two all-gathers that the progress layer runs.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "device_ring_int.h"

static const char *kmode_name(int m) {
  return m == 0 ? "auto" : m == 1 ? "kernel" : m == 2 ? "step" : "?";
}

/* Whether ranks r and q are of different processes on one GPU. */
int brg__dev_shares_gpu(const brg_comm *c, const dev_blob *all, int r, int q) {
  return !memcmp(all[r].uuid, all[q].uuid, 16) && all[r].process != all[q].process &&
         c->peers[r].host_hash == c->peers[q].host_hash;
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
  d->link_send = &c->send;
  d->link_recv = &c->recv;
  d->send_t = brg__device_link(c, c->rank, c->next);
  d->recv_t = brg__device_link(c, c->prev, c->rank);
  d->send_staged = !d->send_t || !d->send_t->gpu_memory;
  d->recv_staged = !d->recv_t || !d->recv_t->gpu_memory;
  if ((d->send_staged && c->nranks > 1 && d->send_t != c->send.ops) ||
      (d->recv_staged && c->nranks > 1 && d->recv_t != c->recv.ops)) {
    int from = d->send_staged ? c->rank : c->prev, to = d->send_staged ? c->next : c->rank;
    return brg__comm_error(c, BRG_ERR_INTERNAL,
                           "device collectives: no transport carries GPU memory from rank %d to "
                           "rank %d, and the host link's transport is not the one chosen",
                           from, to);
  }
  /* Every rank slices alike (the slice is the pipeline unit); each link
   * carries a slice in slots of its own size. */
  d->send_piece = d->send_staged ? c->slice_bytes : d->slice_bytes;
  d->recv_piece = d->recv_staged ? c->slice_bytes : d->slice_bytes;
  d->gdr_stride = c->slice_bytes + SLOT_SHIFT_ROOM;
  return BRG_SUCCESS;
}

/* Asynchronous mode (BRIGADE_DEVICE_PROXY), the requested mode
 * (BRIGADE_DEVICE_MODE) and kernel mode's sizes. */
static brg_status prepare_modes(brg_comm *c, struct brg__dev_ring *d, int staged) {
  int proxy = (int)brg__device_int(BRG__DEVICE_PROXY);
  d->async = proxy < 0 ? staged : proxy;
  const char *mode = brg__device_str(BRG__DEVICE_MODE);
  d->kmode_req = !strcmp(mode, "auto")     ? 0
                 : !strcmp(mode, "kernel") ? 1
                 : !strcmp(mode, "step")   ? 2
                                           : -1;
  if (d->kmode_req < 0)
    return brg__comm_error(c, BRG_ERR_INVALID_ARGUMENT,
                           "BRIGADE_DEVICE_MODE=\"%s\" is not a mode (auto, kernel or step)", mode);
  brg__dev_kernel_sizes(c, d, staged);
  return BRG_SUCCESS;
}

/* What this rank tells every other one first: its process, GPU and slots. */
static void describe_rank(const brg__cuda_api *api, struct brg__dev_ring *d, dev_blob *mine) {
  mine->pid = (int32_t)getpid();
  mine->process = process_token();
  if (api->drv.get_device(&mine->gpu) != 0) mine->gpu = 0;
  d->gpu = mine->gpu;
  mine->nslots = d->nslots;
  mine->slice_bytes = d->slice_bytes;
  if (api->drv.device_uuid(mine->uuid) != 0) memset(mine->uuid, 0, sizeof mine->uuid);
  mine->mps = mps_verdict(api, mine->gpu, &mine->mps_driver);
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
  describe_rank(api, d, mine);
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
  brg__dev_step_local(c, st->d, mine, &all[c->prev]);
  /* A failed half is described in `mine` (ok = 0, why): the second
   * all-gather still runs, so every rank learns it. */
  return BRG_SUCCESS;
}

/* Whether every rank's description agrees with this rank's: its half set
 * up, and the slots, slices, modes, one-shot areas and MPS alike. */
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
  for (int r = 0; s == BRG_SUCCESS && r < c->nranks; r++)
    if (all[r].kos_slot != mine->kos_slot)
      s = brg__comm_error(c, BRG_ERR_MISMATCH,
                          "device collectives: rank %d has one-shot slots of %llu bytes, rank %d "
                          "of %llu (set BRIGADE_DEVICE_SMALL_BYTES alike on every rank)",
                          r, (unsigned long long)all[r].kos_slot, c->rank,
                          (unsigned long long)mine->kos_slot);
  for (int r = 0; s == BRG_SUCCESS && r < c->nranks; r++)
    for (int q = 0; s == BRG_SUCCESS && q < r; q++)
      if (brg__dev_shares_gpu(c, all, r, q) && all[r].mps != all[q].mps)
        s = brg__comm_error(c, BRG_ERR_MISMATCH,
                            "device collectives: ranks %d and %d share a GPU in different "
                            "processes, but rank %d finds %s and rank %d %s (their kernels would "
                            "take different modes; run every process of the GPU under the MPS "
                            "daemon or none, with one CUDA_MPS_PIPE_DIRECTORY)",
                            q, r, q, mps_words(&all[q]), r, mps_words(&all[r]));
  return s;
}

static brg_status brg__device_ring_finish(brg_comm *c, brg__dev_setup *st, brg_status gathered) {
  struct brg__dev_ring *d = st->d;
  dev_blob *mine = st->mine, *all = st->all;
  brg_status s = gathered == BRG_SUCCESS ? blobs_agree(c, mine, all) : gathered;
  int kwho = -1;
  const char *kwhy = s == BRG_SUCCESS ? brg__dev_kernel_refused(c, all, &kwho) : NULL;
  if (s == BRG_SUCCESS && kwhy && d->kmode_req == 1)
    s = brg__comm_error(c, BRG_ERR_INVALID_USAGE,
                        "device collectives: BRIGADE_DEVICE_MODE=kernel, but rank %d cannot run "
                        "them in kernel mode: %s",
                        kwho, kwhy);
  d->kernel = s == BRG_SUCCESS && !kwhy;
  snprintf(d->step_why, sizeof d->step_why, "%s",
           d->kmode_req == 2 ? "BRIGADE_DEVICE_MODE=step"
           : kwhy            ? kwhy
                             : "");
  if (d->kernel)
    s = brg__dev_kernel_finish(c, d, mine, all);
  else if (s == BRG_SUCCESS)
    s = brg__dev_step_finish(c, d, mine, all, kwho, kwhy);
  if (s != BRG_SUCCESS) brg__dev_ring_release(d);
  free(all);
  free(mine);
  return s;
}

/* The first device collective builds the device ring on every rank, over
 * the host ring: each rank says which GPU it has, then sets up its own half
 * and describes it, and each rank connects to its neighbours'. Every rank
 * takes part in both all-gathers even when its own half failed, so that
 * all of them learn which rank could not and why, instead of timing out.
 * The all-gathers run on the calling thread, in issue order (progress.c
 * calls this before the collective that needed the ring). */
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
