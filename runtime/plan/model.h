/*
 * The allreduce cost model (model.c): one set of alpha-beta formulas for
 * every algorithm the runtime runs, which BRIGADE_ALGO=auto uses to
 * choose (hier.c), `brigade-info --model` prints and bench/model calls.
 */
#ifndef BRG_MODEL_H
#define BRG_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

/* A link's alpha (s: a small message, hop to hop) and beta (s/byte). */
typedef struct brg__model_links {
  double net_alpha, net_beta;         /* a ring hop between hosts */
  double shm_alpha, shm_beta;         /* a ring hop within a host over shm */
  double tcp_alpha, tcp_beta;         /* a ring hop within a host over tcp (no shm allowed) */
  double p2p_alpha, p2p_beta;         /* a point-to-point message within a host over shm (tree
                                 and rhd); between hosts it pays p2p_alpha on top of the
                                 network's alpha */
  double xchg_beta;                   /* a byte of rhd's exchanges within a host over shm: each
                                 rank sends and receives a part at once, then adds it */
  double wake_alpha;                  /* where a host's ranks outnumber its cores: what a hop
                                 waits for each rank queued on a core, per thread it wakes */
  double p2p_tcp_alpha, p2p_tcp_beta; /* p2p_alpha and p2p_beta over tcp (no shm allowed) */
  double xchg_tcp_beta;               /* xchg_beta over tcp */
} brg__model_links;

/* H hosts of M ranks each, ordered host by host; K network devices per host. */
typedef struct brg__model_shape {
  int hosts, local, nics;
  int local_tcp;      /* the hops within a host (the ring's, tree's and rhd's) run over tcp
                         (shm not allowed) */
  int cores;          /* the fewest cores of a host (0: not known, taken as enough) */
  int rings;          /* BRIGADE_RINGS in effect (1: one ring) */
  size_t small_bytes; /* BRIGADE_SMALL_BYTES */
  size_t slice_bytes; /* BRIGADE_SLICE_BYTES */
  int no_hier;        /* hier does not run here (one rank per host, GPU buffers on uneven hosts) */
  /* rhd runs recursive doubling alone where it is faster (lat.c's small
   * calls); 0: rhd timed as halving then doubling, what its links were
   * fitted on and what auto compares (see brg__model_rhd_doubling_bytes) */
  int rhd_doubling;
  /* Hosts that differ in rank count: the fewest and most ranks on one
   * (local stays the ranks per host, rounded up, for the others); 0: even. */
  int local_min, local_max;
} brg__model_shape;

/* What the model times: the flat ring engine's three ways, and the others. */
typedef enum {
  BRG__PLAN_RING = 0, /* one ring, 2(N-1) steps */
  BRG__PLAN_RINGS,    /* the buffer cut over shape->rings rings */
  BRG__PLAN_SMALL,    /* the ring's gather of small buffers, N-1 steps */
  BRG__PLAN_HIER,
  BRG__PLAN_TREE,
  BRG__PLAN_RHD,
  BRG__PLAN_COUNT,
} brg__plan;

const char *brg__plan_name(int plan);
/* The links of the multi-host tests' shaped links (2 Gbit/s, 20 us; CI machine). */
extern const brg__model_links brg__model_default_links;

/* ---- model files (brigade-info --calibrate writes them) -------------------
 * Text, a name and a number a line ("shm_alpha 5e-06"; '#' starts a
 * comment); every name of brg__model_links, each in seconds or seconds per
 * byte; a name left out keeps its default. */
#define BRG__MODEL_FIELDS 13
/* The fields' names, in brg__model_links order, and each one's address in *ln. */
const char *brg__model_field_name(int i);
double *brg__model_field(brg__model_links *ln, int i);
/* Parses a model file into *ln (which holds the defaults to start from). */
brg_status brg__model_read(const char *path, brg__model_links *ln, brg__errbuf *err);
/* Writes *ln as a model file, `comment` lines first (NULL: none). */
brg_status brg__model_write(const char *path, const brg__model_links *ln, const char *comment,
                            brg__errbuf *err);
/* The links auto chooses by: BRIGADE_MODEL_FILE's when set (read at the
 * first communicator, and again when the setting changes), else the
 * defaults. brg__model_setup reads it (a bad file: BRG_ERR_INVALID_ARGUMENT
 * naming the file and line) and returns the links' fingerprint, which
 * every rank must share (comm.c compares them at init). */
brg_status brg__model_setup(uint64_t *fingerprint, brg__errbuf *err);
const brg__model_links *brg__model_links_now(void);
/* Seconds plan takes for an allreduce of `bytes`; a negative number where
 * the runtime does not run it on that shape or size. */
double brg__model_time(int plan, const brg__model_shape *sh, const brg__model_links *ln,
                       size_t bytes);
/* The largest allreduce (bytes) rhd runs as recursive doubling alone on
 * shape sh (log2 P rounds, each moving the whole buffer), where the model
 * finds it no slower than halving then doubling (2 log2 P rounds of
 * shrinking shares); the same on every rank. Auto's choice between the
 * algorithms does not count it (rhd_doubling 0): on ranks that outnumber
 * their cores the model charges the ring's hops 2 to 3 times what they
 * were measured to cost, which the halving's rounds, charged as much,
 * used to offset; with doubling's halved rounds counted, auto took rhd
 * over the ring at 8 and 16 ranks on 2 cores where the ring is faster. */
size_t brg__model_rhd_doubling_bytes(const brg__model_shape *sh, const brg__model_links *ln);
/* The flat ring on hosts that differ in rank count (layout[h]: host h's
 * ranks, in ring order): the chain by a walk over every window of the
 * ring's links (a network link after each host's last rank), the bytes at
 * the slowest link kind; the small path up to small_bytes. */
double brg__model_ring_layout(const int *layout, int hosts, const brg__model_links *ln,
                              size_t small_bytes, size_t bytes);
/* The plan the flat ring engine runs for `bytes` (small, rings or ring). */
int brg__model_flat_plan(const brg__model_shape *sh, size_t bytes);
/* BRIGADE_ALGO=auto's choice: BRG__ALGO_RING (the flat engine), _HIER,
 * _TREE or _RHD, the fastest of them by the model (ties: the earlier of
 * ring, hier, tree, rhd); *plan_out (if not NULL) the plan it runs. */
int brg__model_auto(const brg__model_shape *sh, const brg__model_links *ln, size_t bytes,
                    int *plan_out);

/* ---- kernel mode's shape ------------------------------------------------ */

/* The link a device ring's neighbours reach each other by. */
typedef enum {
  BRG__DLINK_NVLINK = 0, /* GPU to GPU over NVLink (NVSwitch) */
  BRG__DLINK_PCIE,       /* GPU to GPU over PCIe peer access */
  BRG__DLINK_HOST,       /* through pinned host memory or the host proxy's link */
  BRG__DLINK_COUNT,
} brg__dlink;

/* What the model picks for kernel mode: thread blocks (channels), each
 * with its own FIFOs, and the bytes of a slot; `why` a line for the log. */
typedef struct brg__device_shape {
  int channels;
  size_t slot_bytes;
  char why[200];
} brg__device_shape;

const char *brg__dlink_name(int link);
/* The shape for an allreduce of `bytes` on `nranks` GPUs in a ring whose
 * slowest link is `link`, each channel with `nslots` slots (0 bytes: the
 * shape for the largest buffers, what a communicator's regions are sized
 * for). Channels: enough to fill the link, at most 32, and no more than
 * give each 8 KiB of a ring step; slot: the largest power of two from
 * 64 KiB to 1 MiB whose channels' slots fit in 128 MiB, or the smallest
 * that holds a channel's share of a step of a smaller buffer. HOST links:
 * one channel and a slot of 0 (the host link's own). */
brg__device_shape brg__model_device_shape(int link, int nranks, int nslots, size_t bytes);
/* A call's shape within a region of *channels channels of *slot_bytes
 * slots (what setup made from brg__model_device_shape(.., 0)): the
 * model's channels and slot for an allreduce of `bytes` on nranks, never
 * more than the region's, without the log line: cheap enough for every
 * call, and the same on every rank. Unchanged for 0 bytes or one rank. */
void brg__model_device_call(int nranks, size_t bytes, int *channels, size_t *slot_bytes);

/* ---- kernel mode's times ------------------------------------------------ */

/* What a kernel-mode allreduce between the GPUs of one host costs, the
 * predictions bench/model gpu prints (through brigade-info --device-model)
 * and the limits the runtime's auto settings take from them. Estimates
 * from published hardware figures and the kernel's design, until a GPU
 * measures them (tests/gpu/device-check.sh). */
typedef struct brg__gpu_costs {
  double link_gbs;   /* the link, per GPU and direction */
  double link_eff;   /* the share of it data gets (headers, flow control) */
  double hbm_gbs;    /* the GPU's memory; a reduce reads two buffers, writes one */
  double chan_gbs;   /* one 512-thread block streaming over the link */
  double launch_us;  /* a kernel's launch to its first instruction */
  double hop_us;     /* a flag stored on one GPU seen by the next (store, poll, fence) */
  double post_us;    /* a ring slot's post: system fences and the flag's round trip */
  double release_us; /* a post with one release instead */
  double ll_hop_us;  /* an LL line: data and flag in one store, no fence */
} brg__gpu_costs;
#define BRG__GPU_COST_FIELDS 9

/* The figures for a link kind (brg__dlink; NVLINK: H200 SXM on NVLink 4),
 * and the fields by index, for the tools' --name value overrides. */
brg__gpu_costs brg__model_gpu_costs(int link);
const char *brg__gpu_cost_name(int i);
double *brg__gpu_cost_field(brg__gpu_costs *c, int i);

/* Seconds of an allreduce of S bytes on N GPUs: the ring at `chans`
 * channels posting `slot`-byte pieces at post_us each with hop_us hops
 * (ll: LL lines, half of every store a flag); the ring at a call's shape
 * (a post carries the channel's share of a step or a slot, whichever is
 * less); the one-shot path in LL lines on one block, and without LL
 * (a release and a flag); the one-shot and two-shot paths on `blocks`
 * blocks. */
double brg__model_gpu_ring(const brg__gpu_costs *c, double S, int N, int chans, double slot,
                           double post_us, double hop_us, int ll);
double brg__model_gpu_ring_call(const brg__gpu_costs *c, double S, int N, int chans, size_t slot);
double brg__model_gpu_oneshot_ll(const brg__gpu_costs *c, double S, int N);
double brg__model_gpu_oneshot_plain(const brg__gpu_costs *c, double S, int N);
double brg__model_gpu_oneshot_many(const brg__gpu_costs *c, double S, int N, int blocks);
double brg__model_gpu_twoshot(const brg__gpu_costs *c, double S, int N, int blocks);
/* Blocks of a direct (one-shot or two-shot) launch of `bytes`: one per
 * 8 KiB, at least 1, at most `most` (the channels setup made, within the
 * kernel's limit). */
int brg__model_direct_blocks(size_t bytes, int most);
/* BRIGADE_DEVICE_LL_BYTES=auto on N ranks: an LL line carries 8 data
 * bytes in 16, so each rank sends its N-1 peers twice the bytes; it saves
 * a fence and a flag's round trip (hop + release - ll_hop of NVLink's
 * figures). LL pays up to S = saved x link rate / (N-1), taken down to a
 * power of two (0 below 256 bytes). */
size_t brg__model_ll_bytes(int N);
/* The one place that decides which one-shot allreduces take the LL form
 * (ring_kernel.cuh, oneshot_ll): up to BRIGADE_DEVICE_LL_BYTES, else
 * (auto) brg__model_ll_bytes, and never beyond the one-shot limit. */
size_t brg__model_ll_limit(int N, size_t oneshot_bytes);
/* The one place that decides which ring calls take the LL form
 * (ring_kernel.cuh, prim_ll): up to BRIGADE_DEVICE_RING_LL_BYTES, else
 * (auto) brg__model_ring_ll_bytes. A ring step moves B/N bytes over the
 * link, and the LL form sends them twice over (8 data bytes in 16) to save
 * each slot's fence and flag round trip: it pays while a step's bytes
 * cross the link in less than that, B/N < saved x link rate, taken down
 * to a power of two (512 KiB a rank on NVLink 4: 2 MiB on 4 ranks, 4 MiB
 * on 8). */
size_t brg__model_ring_ll_bytes(int N);
size_t brg__model_ring_ll_limit(int N);
/* The size up to which the one-shot path's LL form beats its plain form
 * by the two formulas above, doubling from 256 bytes (what
 * brg__model_ll_bytes approximates in closed form). */
size_t brg__model_ll_crossover(const brg__gpu_costs *c, int N);

/* ---- GPU buffers staged through host memory ------------------------------- */

/* What staging an allreduce of `bytes` on GPU buffers through host memory
 * adds (device_exec.c's staged executor): two synchronous copies, the
 * input to host memory and the result back, each about 10 us and PCIe's
 * 20 GB/s (model.c). */
double brg__model_stage_time(size_t bytes);
/* BRIGADE_ALGO=auto's choice for GPU buffers: BRG__ALGO_TREE or _RHD
 * (lat.c on host copies) where, across hosts, it and the staging beat the
 * ring (the flat plan's time on the host links stands for the device
 * ring's, which crosses hosts on them too; ties: the ring), else
 * BRG__ALGO_RING; on one host always the ring (kernel mode's paths there
 * beat any host copy). t[0..2]: the ring's, the staged tree's and the
 * staged rhd's predicted seconds (negative: not run there). */
int brg__model_auto_staged(const brg__model_shape *sh, const brg__model_links *ln, size_t bytes,
                           double t[3]);

#endif
