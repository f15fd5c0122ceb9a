/*
 * Kernel mode (kernels/cuda/ring_kernel.cuh): a collective is one launch
 * whose channels wait on the neighbours' flags. Its regions, the one-shot
 * path, the choice of mode, and a launch.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device_ring_int.h"
#include "model.h"

/* Threads of a kernel-mode block (ring_launch). */
#define KTHREADS 512

/* Bytes of one of the ring's LL slots (ring_args.h, brg__rk_ring_ll_payload:
 * 16 KiB of data less the call's lines), as NCCL's LL buffers: a slice
 * of a mid-size call's step on a channel, in half the bytes of the plain
 * slot the model gives such a call. */
#define RING_LL_SLOT ((size_t)32 << 10)

/* The region of one rank: per channel the control words and the slots. */
static size_t kregion_bytes(const struct brg__dev_ring *d) {
  return (size_t)d->k.channels * d->k.stride + d->k.os.bytes + d->k.os.dbytes;
}

/* Bytes of a region that must start at zero: all but the direct area's
 * slots, which a call reads only after its writer's flag says so (and
 * which a large two-shot limit would otherwise have written in full). */
static size_t kregion_clear_bytes(const struct brg__dev_ring *d) {
  return (size_t)d->k.channels * d->k.stride + d->k.os.bytes +
         (d->k.os.dbytes ? BRG__RK_DIRECT_DATA : 0);
}

/*
 * Co-residency: a kernel-mode launch's blocks wait for each other's flags,
 * and for the other ranks' blocks, so every block of every rank on a GPU
 * must run at once; a GPU runs at most SMs x blocks per SM of them
 * (ring_occupancy), the rest waiting for a block to end, which a spinning
 * block never does. Each GPU holds the channels of every rank on it
 * (ranks as threads, and processes under MPS, which share its SMs; the
 * count of all of them even without MPS, where kernel mode is forced).
 * A rank's launches run one after another (done_ev), so its one-hop
 * launches (one block, or at most its channels on the direct paths) never
 * run beside its ring launch: channels x ranks bounds what a GPU runs at
 * once. Every rank takes the fewest channels
 * any GPU fits from the same descriptions, so all agree; 0 when not even
 * one channel a rank fits (b->kwhy says why, with the numbers).
 */
static int kernel_fit(brg_comm *c, struct brg__dev_ring *d, const dev_blob *all, dev_blob *b) {
  int fit = d->k.channels, who = -1, sharing = 0;
  for (int r = 0; r < c->nranks; r++) {
    if (all[r].ksms <= 0 || all[r].kper_sm <= 0) continue; /* no bound known */
    int n = 0;
    for (int q = 0; q < c->nranks; q++)
      n += !memcmp(all[r].uuid, all[q].uuid, 16) && c->peers[r].host_hash == c->peers[q].host_hash;
    int per = all[r].ksms * all[r].kper_sm / n;
    if (per < fit) {
      fit = per;
      who = r;
      sharing = n;
    }
  }
  if (who < 0) return 1;
  int cap = all[who].ksms * all[who].kper_sm;
  if (fit < 1) {
    b->kunfit = 1;
    snprintf(b->kwhy, sizeof b->kwhy,
             "%d ranks share rank %d's GPU, which runs %d blocks at once (%d SMs x %d) and "
             "kernel mode needs %d (one channel a rank) running together",
             sharing, who, cap, all[who].ksms, all[who].kper_sm, sharing);
    return 0;
  }
  BRG__INFO("init",
            "device ring: kernel mode's channels %d -> %d: %d ranks share rank %d's GPU, which "
            "runs %d blocks of %d threads at once (%d SMs x %d a SM), and every channel of "
            "every rank there must run at once",
            d->k.channels, fit, sharing, who, cap, KTHREADS, all[who].ksms, all[who].kper_sm);
  d->k.channels = fit;
  return 1;
}

/* This rank's kernel-mode half: its region (which both neighbours' kernels
 * write), the ring order and the abort and status words, and for a link
 * to another host the host region the proxy serves; b->kernel_ok, or why
 * not in b->kwhy. Neighbours of this host whose GPUs cannot reach this one
 * keep the ring in step mode. */
void brg__dev_kernel_local(brg_comm *c, struct brg__dev_ring *d, dev_blob *b, const dev_blob *all,
                           int staged) {
  const brg__cuda_api *api = d->api;
  const dev_blob *prev = &all[c->ring.prev], *next = &all[c->ring.next];
  b->kmode_req = d->k.mode_req;
  b->kchannels = d->k.channels;
  b->kslot = d->k.slot;
  b->kos_slot = d->k.os.slot;
  b->kll_slot = d->k.os.ll_slot;
  b->kos_limit = d->k.os.limit;
  b->kll_limit = d->k.os.ll_limit;
  b->kdirect_limit = d->k.os.dlimit;
  b->kring_ll_limit = d->k.ring_ll_limit;
  if (d->k.mode_req == 2) {
    snprintf(b->kwhy, sizeof b->kwhy, "BRIGADE_DEVICE_MODE=step");
    return;
  }
  if (!kernel_fit(c, d, all, b)) return;
  const brg__ring *net = c->netring;
  if (staged && !net) {
    snprintf(b->kwhy, sizeof b->kwhy,
             "the ring has device links staged through host links and the proxy's "
             "links for them were not made");
    return;
  }
  if (staged && net->send.fifo.slot_bytes < d->k.slot) {
    snprintf(b->kwhy, sizeof b->kwhy,
             "the staged links' slots (%zu bytes) are smaller than kernel mode's (%zu)",
             net->send.fifo.slot_bytes, d->k.slot);
    return;
  }
  if (staged && (!net->send.ops->proxy_post || !net->recv.ops->proxy_post)) {
    snprintf(b->kwhy, sizeof b->kwhy, "the staged links' transport (%s) has no proxy entry",
             (net->send.ops->proxy_post ? net->recv.ops : net->send.ops)->name);
    return;
  }
  if ((!d->recv_staged && !brg__dev_reaches(d, b, prev)) ||
      (!d->send_staged && !brg__dev_reaches(d, b, next))) {
    snprintf(b->kwhy, sizeof b->kwhy,
             "rank %d's GPU cannot reach the GPU of a neighbour (no peer access)", c->rank);
    return;
  }
  /* Both neighbours' kernels write the region: it is the receiving end of
   * a cuda_ipc link that each of them maps (the previous rank's, or the
   * next's where the link from the previous one is staged). */
  brg__errbuf err = {0};
  const dev_blob *writer = !d->recv_staged ? prev : !d->send_staged ? next : b;
  if (brg__dev_link_export(c, d, &d->k.in, !d->recv_staged ? c->ring.prev : c->ring.next, b, writer,
                           kregion_bytes(d), d->k.slot, 0, b->kregion_info, &err) != BRG_SUCCESS) {
    snprintf(b->kwhy, sizeof b->kwhy, "%.127s", err.msg);
    return;
  }
  d->k.region = d->k.in.fifo.data;
  const char *what = "clearing the kernel-mode FIFOs";
  int e = api->drv.mem_set(d->k.region, 0, kregion_clear_bytes(d));
  if (!e) {
    what = "cudaMalloc of the ring order";
    e = api->drv.mem_alloc((void **)&d->k.ring, (size_t)c->nranks * sizeof(int));
  }
  if (!e) {
    what = "copying the ring order";
    e = api->drv.mem_copy(d->k.ring, c->ring.order, (size_t)c->nranks * sizeof(int));
  }
  if (!e) {
    what = "cudaEventCreate";
    e = api->drv.event_create(&d->k.done_ev);
  }
  if (!e) {
    what = "the abort and status words";
    e = brg__dev_pinned_alloc(api, KWORDS_BYTES, (char **)&d->k.words, (char **)&d->k.words_dev);
  }
  if (!e && d->send_staged) {
    what = "pinned host memory for the slots to the next rank (staged link)";
    e = brg__dev_pinned_alloc(api, brg__dev_pregion_bytes(d), &d->px.send, &d->px.send_dev);
  }
  if (!e && d->recv_staged) {
    what = "pinned host memory for the slots from the previous rank (staged link)";
    e = brg__dev_pinned_alloc(api, brg__dev_pregion_bytes(d), &d->px.recv, &d->px.recv_dev);
  }
  if (e) {
    snprintf(b->kwhy, sizeof b->kwhy, "%s: %s", what,
             e == -1 ? strerror(errno) : api->drv.error_string(e));
    return;
  }
  brg__dev_proxy_gdr(c, d, b);
  b->kernel_ok = 1;
  b->kos_ok = d->k.os.slot > 0 && !staged; /* one hop reaches the ranks of cuda_ipc links only */
  for (int r = 0; b->kos_ok && r < c->nranks; r++) b->kos_ok &= brg__dev_reaches(d, b, &all[r]);
}

/* Rank `rank`'s region, mapped here (in one process, its pointer). */
static brg_status kernel_map(brg_comm *c, struct brg__dev_ring *d, const dev_blob *self,
                             const dev_blob *peer, int rank, brg__conn *l, char **out) {
  brg_status s =
      brg__dev_link_map(c, d, l, rank, self, peer, kregion_bytes(d), d->k.slot, peer->kregion_info);
  if (s == BRG_SUCCESS) *out = l->fifo.data;
  return s;
}

/* The neighbours' regions; a staged link's neighbour is the proxy's. */
static brg_status setup_kernel_links(brg_comm *c, struct brg__dev_ring *d, const dev_blob *self,
                                     const dev_blob *next, const dev_blob *prev) {
  brg_status s = BRG_SUCCESS;
  if (!d->send_staged) s = kernel_map(c, d, self, next, c->ring.next, &d->k.next_c, &d->k.next);
  if (s != BRG_SUCCESS || d->recv_staged) return s;
  if (c->ring.prev == c->ring.next && !d->send_staged) {
    d->k.prev = d->k.next; /* two ranks: one mapping serves both links */
    return BRG_SUCCESS;
  }
  return kernel_map(c, d, self, prev, c->ring.prev, &d->k.prev_c, &d->k.prev);
}

/* The one-shot path, where every rank's GPU reaches every rank's area (all
 * ranks decide alike, from the same blobs): every region mapped here. */
static brg_status setup_oneshot(brg_comm *c, struct brg__dev_ring *d, const dev_blob *self,
                                const dev_blob *all) {
  int who = -1;
  for (int r = 0; r < c->nranks; r++)
    if (!all[r].kos_ok && who < 0) who = r;
  if (!d->k.os.slot) return BRG_SUCCESS;
  if (brg__device_staged_any(c)) {
    BRG__INFO("init", "device ring: no one-shot allreduce: device links of the ring are staged "
                      "through host links (ranks on several hosts, or cuda_ipc not among "
                      "BRIGADE_TRANSPORTS), so small allreduces take the ring");
    return BRG_SUCCESS;
  }
  if (who >= 0) {
    BRG__INFO("init",
              "device ring: no one-shot allreduce: a GPU cannot reach rank %d's (no peer access), "
              "so small allreduces take the ring",
              who);
    return BRG_SUCCESS;
  }
  size_t off = (size_t)d->k.channels * d->k.stride;
  for (int r = 0; r < c->nranks; r++) {
    char *base = r == c->rank        ? d->k.region
                 : r == c->ring.next ? d->k.next
                 : r == c->ring.prev ? d->k.prev
                                     : NULL;
    if (!base) {
      brg_status s = kernel_map(c, d, self, &all[r], r, &d->k.os.conn[r], &base);
      if (s != BRG_SUCCESS) return s;
    }
    d->k.os.area[r] = base + off;
  }
  d->k.os.on = 1;
  return BRG_SUCCESS;
}

/* Why kernel mode does not run, from every rank's description; NULL when
 * it can. Forced (BRIGADE_DEVICE_MODE=kernel), only a rank that cannot
 * stops it; automatic, so do ranks of different processes on one GPU
 * without MPS, whose kernels would take turns while spinning. */
const char *brg__dev_kernel_refused(const brg_comm *c, const dev_blob *all, int *who) {
  for (int r = 0; r < c->nranks; r++)
    if (!all[r].kernel_ok) {
      *who = r;
      return all[r].kwhy;
    }
  if (all[0].kmode_req == 0)
    for (int r = 0; r < c->nranks; r++)
      for (int q = 0; q < r; q++)
        if (brg__dev_shares_gpu(c, all, r, q) && !all[r].mps) {
          *who = r;
          return "ranks of different processes share a GPU and MPS is not running: their "
                 "kernels would take turns on it (BRIGADE_DEVICE_MODE=kernel forces it)";
        }
  return NULL;
}

/* Kernel mode's channels and slots. BRIGADE_DEVICE_CHANNELS (when not 0)
 * and BRIGADE_SLICE_BYTES (when set) decide; else the model
 * (brg__model_device_shape), for the links every rank sees alike here:
 * staged ones (the host link bounds the ring: one channel, in the host
 * link's slots), or GPU to GPU, which setup does not yet tell apart by
 * NVLink or PCIe and sizes for NVLink (on PCIe the extra channels cost
 * memory, not time). Channels stay within the kernel's limit and
 * BRIGADE_DEVICE_BLOCKS. */
static void kernel_shape(brg_comm *c, struct brg__dev_ring *d, int staged) {
  int link = staged ? BRG__DLINK_HOST : BRG__DLINK_NVLINK;
  brg__device_shape m = brg__model_device_shape(link, c->nranks, d->nslots, 0);
  int blocks = (int)brg__device_int(BRG__DEVICE_BLOCKS);
  int set_ch = (int)brg__device_int(BRG__DEVICE_CHANNELS);
  int set_slot = brg__config_is_set(&brg__core_config, BRG__CORE_SLICE_BYTES);
  const char *ch_from = set_ch ? "BRIGADE_DEVICE_CHANNELS" : "the model";
  d->k.channels = set_ch ? set_ch : m.channels;
  if (!set_ch && d->k.channels > blocks) {
    d->k.channels = blocks;
    ch_from = "the model, within BRIGADE_DEVICE_BLOCKS";
  }
  if (d->k.channels > BRG__RK_MAX_CHANNELS) {
    d->k.channels = BRG__RK_MAX_CHANNELS;
    ch_from = set_ch ? "BRIGADE_DEVICE_CHANNELS, within the kernel's limit"
                     : "the model, within the kernel's limit";
  }
  if (staged) {
    d->k.channels = 1;
    ch_from = "a staged link: one";
  }
  /* a call takes the model's shape for its size (kernel_call_shape) only
   * where the model shaped the region and the links are GPU to GPU */
  d->k.shape_per_call = !staged && !set_ch && !set_slot && m.slot_bytes;
  /* a slot of a staged link carries one of the host link's whole */
  d->k.slot =
      staged || set_slot || !m.slot_bytes ? brg__slice_bytes(c, BRG__SLICE_KERNEL) : m.slot_bytes;
  BRG__INFO("init",
            "device ring: kernel mode's shape, if it runs: %d channels (%s) with %zu-byte slots "
            "(%s); the model for %s links of %d ranks: %s",
            d->k.channels, ch_from, d->k.slot,
            staged     ? "the host link's slot"
            : set_slot ? "BRIGADE_SLICE_BYTES"
                       : "the model",
            brg__dlink_name(link), c->nranks, m.why);
}

/* Kernel mode's sizes: channels, slots and the layout of a region's
 * channel (brg__dev_kchan). With staged links, one channel: channels sharing the
 * proxy's link could block each other across launches (a launch's slots
 * waiting behind the next launch's in a full channel), and the host link,
 * not the channel count, bounds such a ring. Every rank sees `staged`
 * alike. */
void brg__dev_kernel_sizes(brg_comm *c, struct brg__dev_ring *d, int staged) {
  kernel_shape(c, d, staged);
  /* co-residency, for kernel_fit once every rank's is known */
  d->k.sms = d->k.per_sm = 0;
  int e = d->api->kern.ring_occupancy(KTHREADS, &d->k.sms, &d->k.per_sm);
  if (e) {
    BRG__INFO("init",
              "device ring: the GPU's occupancy for kernel mode is unknown (%s): its channels "
              "are not checked against what it runs at once",
              d->api->drv.error_string(e));
    d->api->drv.last_error();
    d->k.sms = d->k.per_sm = 0;
  }
  d->k.ctrl = (sizeof(struct brg__dev_kchan) + 255) & ~(size_t)255;
  /* the ring's LL slots: links within a host only (a proxy carries a
   * slot once its tail says so, which the LL form never posts) */
  d->k.ring_ll_limit = staged ? 0 : brg__model_ring_ll_limit(c->nranks);
  d->k.ring_ll = d->k.ring_ll_limit && c->nranks > 1 ? RING_LL_SLOT : 0;
  d->k.stride = d->k.ctrl + (size_t)d->nslots * (d->k.slot + d->k.ring_ll);
  d->px.stride = PLINK_CTRL + (size_t)d->nslots * d->k.slot;
  d->k.os.limit = (size_t)brg__device_int(BRG__DEVICE_SMALL_BYTES);
  if (d->k.os.limit && c->nranks >= 2 && c->nranks <= BRG__RK_MAX_PEERS) {
    d->k.os.slot = (d->k.os.limit + 255) & ~(size_t)255;
    d->k.os.ll_limit = brg__model_ll_limit(c->nranks, d->k.os.limit);
    d->k.os.ll_slot = brg__rk_ll_slot(d->k.os.ll_limit);
    d->k.os.bytes = brg__rk_os_bytes(c->nranks, d->k.os.slot, d->k.os.ll_slot);
    /* the direct paths: a rank's slot holds a one-shot input, or a
     * two-shot block (at most dlimit / N bytes and an element, shifted by
     * up to 15 bytes: ring_kernel.cuh, bshift) and its result in a half
     * each */
    size_t two = (size_t)brg__device_int(BRG__DEVICE_DIRECT);
    d->k.os.dlimit = two > d->k.os.limit ? two : d->k.os.limit;
    size_t half = (d->k.os.dlimit / (size_t)c->nranks + 32 + 255) & ~(size_t)255;
    d->k.os.dslot = 2 * half > d->k.os.slot ? 2 * half : d->k.os.slot;
    d->k.os.dbytes = brg__rk_direct_bytes(c->nranks, d->k.os.dslot);
  }
}

/* What kernel mode runs with, at INFO. */
static void kernel_log(brg_comm *c, struct brg__dev_ring *d) {
  char desc[256];
  d->api->drv.describe(desc, sizeof desc);
  BRG__INFO("init",
            "device ring: kernel mode (%s): one kernel per collective, %d channels (thread "
            "blocks) with %d slots of %zu bytes each in GPU memory, waiting on the "
            "neighbours' flags; %s",
            d->k.mode_req == 1 ? "BRIGADE_DEVICE_MODE=kernel"
                               : "automatic: the GPUs of neighbours in a host reach each other "
                                 "and no two processes share a GPU without MPS",
            d->k.channels, d->nslots, d->k.slot, desc);
  if (d->send_staged || d->recv_staged)
    BRG__INFO("init",
              "device ring: kernel mode over staged links: %s%s%s%s%s, carried by the host "
              "proxy on %s links with slots of %zu bytes (the kernels wait on its flags; the "
              "call still returns at once)",
              d->send_staged ? "to the next rank " : "",
              !d->send_staged  ? ""
              : d->px.gdr.send ? "GPU to GPU (GPUDirect RDMA)"
                               : "through pinned host memory",
              d->send_staged && d->recv_staged ? " and " : "",
              d->recv_staged ? "from the previous rank " : "",
              !d->recv_staged  ? ""
              : d->px.gdr.recv ? "GPU to GPU (GPUDirect RDMA)"
                               : "through pinned host memory",
              (d->send_staged ? &c->netring->send : &c->netring->recv)->ops->name,
              c->netring->send.fifo.slot_bytes);
  if (d->k.os.on)
    BRG__INFO("init",
              "device ring: allreduces up to %zu bytes (BRIGADE_DEVICE_SMALL_BYTES) go in one "
              "hop: each rank writes its input to all %d ranks, which sum them in rank order",
              d->k.os.limit, c->nranks);
  if (d->k.os.on && d->k.os.dbytes && d->k.os.ll_limit < d->k.os.limit)
    BRG__INFO("init",
              "device ring: one-hop allreduces above %zu bytes (the LL form's) run on many "
              "blocks, each with its part of the data and flags of its own",
              d->k.os.ll_limit);
  if (d->k.os.on && d->k.os.dlimit > d->k.os.limit)
    BRG__INFO("init",
              "device ring: allreduces above %zu bytes and up to %zu "
              "(BRIGADE_DEVICE_DIRECT_BYTES) take the two-shot path on many blocks: each rank "
              "reduces its block of every rank's input and writes it to every rank (%zu bytes "
              "of GPU memory)",
              d->k.os.limit, d->k.os.dlimit, d->k.os.dbytes);
  if (d->k.ring_ll)
    BRG__INFO(
        "init",
        "device ring: calls up to %zu bytes that take the ring (BRIGADE_DEVICE_RING_LL_BYTES) "
        "send their slots as LL lines, data and flag in one store: no tail, no system fence "
        "per slot (%zu bytes of LL slots a channel)",
        d->k.ring_ll_limit, (size_t)d->nslots * d->k.ring_ll);
  if (d->k.os.on && d->k.os.ll_limit)
    BRG__INFO("init",
              "device ring: one-shot allreduces up to %zu bytes (BRIGADE_DEVICE_LL_BYTES) send "
              "LL lines, data and flag in one store: no fence, no flag of their own",
              d->k.os.ll_limit);
}

/* Kernel mode chosen: the neighbours' regions, the one-shot path and the
 * proxy of staged links; then the ring is published (c->dev). */
brg_status brg__dev_kernel_finish(brg_comm *c, struct brg__dev_ring *d, const dev_blob *mine,
                                  const dev_blob *all) {
  for (int r = 0; r < c->nranks; r++)
    if (r != c->rank && all[r].process == mine->process) {
      d->k.threads = 1;
      if (!memcmp(all[r].uuid, mine->uuid, 16)) d->k.shared_gpu = 1;
    }
  brg_status s = setup_kernel_links(c, d, mine, &all[c->ring.next], &all[c->ring.prev]);
  if (s == BRG_SUCCESS) s = setup_oneshot(c, d, mine, all);
  if (s == BRG_SUCCESS) brg__dev_proxy_gdr_choose(c, d, mine, all);
  if (s == BRG_SUCCESS && (d->send_staged || d->recv_staged)) s = brg__dev_proxy_start(c, d);
  if (s != BRG_SUCCESS) return s;
  d->async = 0; /* a launch returns at once by itself */
  brg__dev_step_unused(d);
  kernel_log(c, d);
  c->kwatch = brg__dev_kernel_watch;
  __atomic_store_n(&c->kabort, &d->k.words->abort, __ATOMIC_RELEASE);
  __atomic_store_n(&c->dev, d, __ATOMIC_RELEASE);
  return BRG_SUCCESS;
}

/* ---- kernel mode: a collective ---- */

int brg__device_kernel_mode(const struct brg__dev_ring *d) {
  return d && d->k.on;
}

brg_status brg__device_capture_check(brg_comm *c, const char *fn, brg__coll *k) {
  const brg__cuda_api *api = brg__device_api(NULL);
  int capturing = 0;
  if (api->drv.stream_capturing(k->stream, &capturing) != 0 || !capturing) {
    api->drv.last_error(); /* a query that failed leaves no error behind */
    return BRG_SUCCESS;
  }
  struct brg__dev_ring *d = __atomic_load_n(&c->dev, __ATOMIC_ACQUIRE);
  if (c->nranks > 1 && !d)
    return brg__comm_error(c, BRG_ERR_INVALID_USAGE,
                           "%s: stream %p is capturing a CUDA graph, but this communicator has "
                           "not set up its device collectives yet (GPU memory and IPC with its "
                           "neighbours, which cannot be made during a capture): call "
                           "brg_comm_device_setup(comm, %d) on every rank before capturing, or "
                           "run one device collective outside the capture first",
                           fn, k->stream, k->gpu);
  if (c->nranks > 1 && d && !d->k.on)
    return brg__comm_error(c, BRG_ERR_INVALID_USAGE,
                           "%s: stream %p is capturing a CUDA graph, but this communicator runs "
                           "its device collectives in step mode (%s), driven slice by slice from "
                           "the host, which a graph cannot hold: capture needs kernel mode",
                           fn, k->stream, d->step_why);
  k->captured = 1;
  return BRG_SUCCESS;
}

/* Kernel mode's ranks in this process, with the stream each launched on
 * last: a stream two ranks of one communicator share would queue one's
 * kernel behind the other's, which waits for it. Only ranks that have
 * another rank of their communicator in this process are listed (ranks as
 * threads), so the lock is not on other processes' hot path. */
#define STREAM_USERS 64
static pthread_mutex_t stream_users_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
  const struct brg__dev_ring *d;
  uint64_t comm_id;
  int rank;
  void *stream;
} stream_users[STREAM_USERS];

void brg__dev_stream_user_drop(const struct brg__dev_ring *d) {
  pthread_mutex_lock(&stream_users_lock);
  for (int i = 0; i < STREAM_USERS; i++)
    if (stream_users[i].d == d) stream_users[i].d = NULL;
  pthread_mutex_unlock(&stream_users_lock);
}

/* -1, or the rank of c's communicator in this process that launched on
 * `stream` last; this rank is recorded as its last user. */
static int stream_taken(const brg_comm *c, const struct brg__dev_ring *d, void *stream) {
  int who = -1, mine = -1, free_at = -1;
  pthread_mutex_lock(&stream_users_lock);
  for (int i = 0; i < STREAM_USERS; i++) {
    if (!stream_users[i].d) {
      if (free_at < 0) free_at = i;
    } else if (stream_users[i].d == d) {
      mine = i;
    } else if (stream_users[i].comm_id == c->comm_id && stream_users[i].stream == stream) {
      who = stream_users[i].rank;
    }
  }
  if (mine < 0) mine = free_at;
  if (mine >= 0 && who < 0) {
    stream_users[mine].d = d;
    stream_users[mine].comm_id = c->comm_id;
    stream_users[mine].rank = c->rank;
    stream_users[mine].stream = stream;
  }
  pthread_mutex_unlock(&stream_users_lock);
  return who;
}

/* A stream that captured a launch, for the drain at destroy. */
static void graph_stream_note(struct brg__dev_ring *d, void *stream) {
  d->k.graphs = 1;
  for (int i = 0; i < d->k.ngstreams; i++)
    if (d->k.gstream[i] == stream) return;
  if (d->k.ngstreams < (int)(sizeof d->k.gstream / sizeof d->k.gstream[0]))
    d->k.gstream[d->k.ngstreams++] = stream;
}

/* A launch on a stream where another rank of this communicator in this
 * process would queue behind it (or it behind them) is refused. */
static brg_status stream_refused(brg_comm *c, const struct brg__dev_ring *d, const brg__coll *k) {
  /* cudaStreamLegacy (0x1) is the legacy stream, as NULL is;
   * cudaStreamPerThread (0x2) is each host thread's own default stream, so
   * two threads passing it pass two streams: it stands for the thread. */
  int legacy = !k->stream || (uintptr_t)k->stream == 1;
  void *key = (uintptr_t)k->stream == 2 ? (void *)(uintptr_t)pthread_self() : k->stream;
  if (legacy && d->k.shared_gpu) {
    char desc[160];
    brg__coll_describe(desc, sizeof desc, k->kind, k->seq, k->count, k->dtype, k->op, k->root, 1);
    return brg__comm_error(c, BRG_ERR_INVALID_USAGE,
                           "rank %d: %s on the legacy default stream (stream %p), but another "
                           "rank of this communicator in this process has the same GPU, whose "
                           "legacy stream is theirs too: a kernel-mode collective waits for its "
                           "neighbours inside the kernel, so the second rank's kernel would queue "
                           "behind the first one's, which waits for it, for ever. Give each rank "
                           "a stream of its own (cudaStreamCreate), or set "
                           "BRIGADE_DEVICE_MODE=step",
                           c->rank, desc, k->stream);
  }
  int other = !legacy && d->k.threads ? stream_taken(c, d, key) : -1;
  if (other >= 0)
    return brg__comm_error(c, BRG_ERR_INVALID_USAGE,
                           "rank %d: %s on stream %p%s, which rank %d of this communicator, in "
                           "this process, launched on too: a kernel-mode collective waits for "
                           "its neighbours inside the kernel, so one rank's kernel would queue "
                           "behind the other's, which waits for it. Give each rank a stream of "
                           "its own, or set BRIGADE_DEVICE_MODE=step",
                           c->rank, brg__coll_name(k->kind), k->stream,
                           key != k->stream ? " (cudaStreamPerThread, from the same thread)" : "",
                           other);
  return BRG_SUCCESS;
}

/* Each channel's link words and slots, as the kernels reach them: the
 * neighbours' regions, or a staged link's host region that the proxy
 * serves. */
static void kernel_chans(const struct brg__dev_ring *d, brg__rk_args *args) {
  for (int ch = 0; ch < d->k.channels; ch++) {
    char *own_base = d->k.region + (size_t)ch * d->k.stride;
    struct brg__dev_kchan *own = (struct brg__dev_kchan *)own_base;
    brg__rk_link *l = &args->chan[ch];
    if (d->send_staged) { /* the proxy's region plays the next rank's and this rank's part */
      char *p = d->px.send_dev + (size_t)ch * d->px.stride;
      struct brg__dev_plink *pl = (struct brg__dev_plink *)p;
      l->send_slots = d->px.gdr.send ? d->px.gdr.sbuf : p + PLINK_CTRL;
      l->send_tail = &pl->tail;
      l->send_head = &pl->head;
      l->send_sizes = pl->sizes;
    } else {
      char *next_base = d->k.next + (size_t)ch * d->k.stride;
      struct brg__dev_kchan *next = (struct brg__dev_kchan *)next_base;
      l->send_slots = next_base + d->k.ctrl;
      l->send_meta = next->meta;
      l->send_hdr = next->hdr;
      l->hdr_acked = &own->hdr_acked;
      l->send_tail = &next->tail;
      l->send_head = &own->head;
      if (d->k.ring_ll) l->send_ll = next_base + d->k.ctrl + (size_t)d->nslots * d->k.slot;
    }
    if (d->recv_staged) {
      char *p = d->px.recv_dev + (size_t)ch * d->px.stride;
      struct brg__dev_plink *pl = (struct brg__dev_plink *)p;
      l->recv_slots = d->px.gdr.recv ? d->px.gdr.rbuf : p + PLINK_CTRL;
      l->recv_tail = &pl->tail;
      l->recv_head = &pl->head;
    } else {
      struct brg__dev_kchan *prev = (struct brg__dev_kchan *)(d->k.prev + (size_t)ch * d->k.stride);
      l->recv_slots = own_base + d->k.ctrl;
      l->recv_meta = own->meta;
      l->recv_hdr = own->hdr;
      l->hdr_ack = &prev->hdr_acked;
      l->recv_tail = &own->tail;
      l->recv_head = &prev->head;
      if (d->k.ring_ll) l->recv_ll = own_base + d->k.ctrl + (size_t)d->nslots * d->k.slot;
    }
    l->counters = own->counters;
    brg__dev_proxy_hdrs(d, ch, l);
  }
}

/* Bytes of the buffer a call reduces or carries, as the model counts an
 * allreduce's: the whole of what every rank ends with. */
static size_t call_bytes(const brg_comm *c, const brg__coll *k) {
  size_t b = k->count * brg_dtype_size(k->dtype);
  if ((k->kind == BRG__COLL_REDUCE_SCATTER || k->kind == BRG__COLL_ALL_GATHER) && !k->whole)
    b *= (size_t)c->nranks;
  return b;
}

/* A ring call's channels and slot: the model's for its size
 * (brg__model_device_call), within what setup made; every rank computes
 * the same from the same call. */
static void kernel_call_shape(const brg_comm *c, const struct brg__dev_ring *d, const brg__coll *k,
                              int *channels, size_t *slot) {
  *channels = d->k.channels;
  *slot = d->k.slot;
  if (d->k.shape_per_call) brg__model_device_call(c->nranks, call_bytes(c, k), channels, slot);
}

/* Blocks of a direct launch of `bytes` (brg__model_direct_blocks), within
 * the channels setup made (each block uses its channel's words). */
static int direct_blocks(const struct brg__dev_ring *d, size_t bytes) {
  return brg__model_direct_blocks(
      bytes, d->k.channels < BRG__RK_DIRECT_BLOCKS ? d->k.channels : BRG__RK_DIRECT_BLOCKS);
}

brg_status brg__device_kernel_run(brg_comm *c, brg__coll *k) {
  struct brg__dev_ring *d = c->dev;
  const brg__cuda_api *api = d->api;
  if (__atomic_load_n(&d->k.words->abort, __ATOMIC_ACQUIRE) ||
      __atomic_load_n(&d->k.words->status, __ATOMIC_ACQUIRE) != BRG__RK_OK)
    return brg__dev_kernel_stopped(c, d);
  brg_status s = stream_refused(c, d, k);
  if (s != BRG_SUCCESS) return s;
  /* Launches of this communicator run one after another, whatever streams
   * they come on: each starts from the FIFO positions the last one left.
   * (A captured launch cannot wait for work outside its capture; a graph's
   * launches are ordered by the streams the caller launches them on, and
   * the busy word catches two at once.) */
  if (!k->captured && d->k.done_set) {
    int e = api->drv.stream_wait_event(k->stream, d->k.done_ev);
    if (e)
      return brg__dev_cuda_fail(c, api, e, "cudaStreamWaitEvent (the previous kernel-mode launch)");
  }
  brg__rk_args a;
  memset(&a, 0, sizeof a);
  a.kind = (int)k->kind;
  a.dtype = (int)k->dtype;
  a.op = (int)k->op;
  a.nranks = c->nranks;
  a.pos = c->ring.pos;
  a.root = k->root;
  a.ring = d->k.ring;
  a.sendbuf = k->sendbuf;
  a.recvbuf = k->recvbuf;
  a.count = k->count;
  a.whole = k->whole;
  a.stride = k->stride;
  a.nslots = d->nslots;
  kernel_call_shape(c, d, k, &a.nchannels, &a.slot_bytes);
  a.slot_stride = d->k.slot;
  a.abort_word = &d->k.words_dev->abort;
  a.status = &d->k.words_dev->status;
  a.watch = d->k.words_dev->watch;
  /* A captured launch's replays may run on any stream, where no event of
   * this rank follows them: their blocks count themselves for the drain. */
  if (k->captured) a.launches = d->k.words_dev->launches;
  a.call = (brg__rk_call){.seq = k->seq,
                          .count = k->count,
                          .root = k->root,
                          .kind = (uint8_t)k->kind,
                          .dtype = (uint8_t)k->dtype,
                          .op = (uint8_t)k->op};
  kernel_chans(d, &a);
  size_t es = brg_dtype_size(k->dtype);
  int one = d->k.os.on && k->kind == BRG__COLL_ALLREDUCE && k->count > 0 &&
            k->count <= (d->k.os.dbytes ? d->k.os.dlimit : d->k.os.limit) / es;
  int blocks = a.nchannels;
  if (one) {
    a.oneshot = 1;
    a.os.rank = c->rank;
    a.os.slot_bytes = d->k.os.slot;
    a.os.ll_slot = d->k.os.ll_slot;
    a.os.ll = k->count * es <= d->k.os.ll_limit;
    memcpy(a.os.area, d->k.os.area, sizeof a.os.area);
    blocks = 1;
    if (!a.os.ll && d->k.os.dbytes) {
      a.os.direct = k->count <= d->k.os.limit / es ? BRG__RK_ONESHOT_MANY : BRG__RK_TWOSHOT;
      a.os.direct_off = d->k.os.bytes;
      a.os.dslot = d->k.os.dslot;
      a.nchannels = blocks = direct_blocks(d, k->count * es);
    }
  }
  /* the ring's LL form, for the calls up to its limit that take the ring */
  if (!one && c->nranks > 1 && d->k.ring_ll && call_bytes(c, k) <= d->k.ring_ll_limit)
    a.ring_ll = d->k.ring_ll;
  int e = api->kern.ring_launch(&a, sizeof a, blocks, KTHREADS, k->stream);
  /* An event recorded into a capture cannot be waited for outside it: the
   * drain at destroy waits for the launches made outside graphs, and the
   * caller for its graphs' launches. */
  if (!e && !k->captured) e = api->drv.event_record(d->k.done_ev, k->stream);
  if (!e && !k->captured) d->k.done_set = 1;
  if (!e && k->captured) graph_stream_note(d, k->stream);
  d->last_stream = k->stream;
  return e ? brg__dev_cuda_fail(c, api, e, "launching the kernel-mode collective") : BRG_SUCCESS;
}
