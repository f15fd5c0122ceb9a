/*
 * The policy that picks a collective's executor once, at issue: for an
 * allreduce its algorithm (BRIGADE_ALGO: ring, hier, tree, rhd, or auto,
 * the fastest by the cost model of plan/model.c; hier runs in hier.c,
 * tree and rhd in lat.c), then the rings (rings.c) or the leaf executor
 * of its buffers' memory (exec.h).
 */
#include <stdlib.h>
#include <string.h>

#include "device.h"
#include "exec.h"
#include "hier.h"
#include "model.h"
#include "settings.h"

/* Whether k is cut over the communicator's rings (BRIGADE_RINGS): a
 * allreduce, reduce-scatter, all-gather, broadcast or reduce that gives
 * every ring at least a slice (of each rank's block, for reduce-scatter
 * and all-gather), where its leaf executor can run the parts at once. The
 * count is the same on every rank, so every rank decides alike. */
static int rings_take(const brg_comm *c, const brg__coll *k, const brg__exec_ops *leaf) {
  int cut = k->kind == BRG__COLL_ALLREDUCE || k->kind == BRG__COLL_REDUCE_SCATTER ||
            k->kind == BRG__COLL_ALL_GATHER || k->kind == BRG__COLL_BROADCAST ||
            k->kind == BRG__COLL_REDUCE;
  int ok = c->nrings > 1 && cut && !k->whole &&
           k->count * brg_dtype_size(k->dtype) >= (size_t)c->nrings * c->slice_bytes;
  return ok && (!leaf->parts_ok || leaf->parts_ok(c, k, c->nrings));
}

/* The first device call's: kernel mode's links between hosts for this
 * communicator and its rings (comm/comm.c's net rings), before the device
 * setup that uses them; brg_comm_device_setup's
 * (setup_only) asks each ring. */
brg_status brg__exec_device_links(brg_comm *c, brg__coll *k) {
  if ((c->netring_state != 0 && !k->setup_only) || __atomic_load_n(&c->dev, __ATOMIC_ACQUIRE))
    return BRG_SUCCESS;
  brg_status s = brg__comm_netring(c);
  for (int r = 1; s == BRG_SUCCESS && r < c->nrings; r++) s = brg__comm_netring(c->rings[r]);
  return s;
}

/* The cost model's view of this communicator (model.c): its hosts (ranks
 * per host rounded up where they differ, and hier ruled out there), the
 * links its ring takes within a host (shm, or tcp where the transports
 * allowed leave no shm: every rank picks them alike, as the links' own
 * setup needs), its hosts' network devices (topology.c), its rings and
 * sizes. Only what every rank shares, so that all choose alike. */
static void model_shape_of(const brg_comm *c, const brg__hier_shape *sh, brg__model_shape *m) {
  *m = (brg__model_shape){.hosts = sh->hosts > 0 ? sh->hosts : 1,
                          .nics = 1,
                          .rings = c->nrings > 1 ? c->nrings : 1,
                          .small_bytes = c->small_bytes,
                          .slice_bytes = c->slice_bytes};
  m->local = (c->nranks + m->hosts - 1) / m->hosts;
  if (sh->hosts > 1 && sh->min_local != sh->max_local) {
    m->local_min = sh->min_local;
    m->local_max = sh->max_local;
  }
  m->no_hier = !brg__hier_fits(sh);
  for (int i = 0; i < c->nranks && c->nranks > 1; i++) {
    const brg__peer_info *a = &c->peers[c->ring.order[i]],
                         *b = &c->peers[c->ring.order[(i + 1) % c->nranks]];
    if (a->host_hash == b->host_hash &&
        brg__transport_pick(a, b, c->transports, BRG__CARRIES_HOST) != &brg__transport_shm) {
      m->local_tcp = 1;
      break;
    }
  }
  for (int i = 0; i < c->nranks; i++) /* the fewest of any host's */
    if (c->peers[i].cores > 0 && (m->cores == 0 || (int)c->peers[i].cores < m->cores))
      m->cores = (int)c->peers[i].cores;
  int *nic = sh->hosts > 1 ? malloc((size_t)c->nranks * sizeof *nic) : NULL;
  if (nic) {
    int k = brg__topology_nics(c, nic);
    if (k > 1) m->nics = k;
    free(nic);
  }
}

/* The shape as the log says it: "2 hosts x 4 ranks", or where hosts differ
 * "2 hosts of 3 to 5 ranks". */
static void shape_words(const brg__hier_shape *sh, const brg__model_shape *ms, char *buf,
                        size_t n) {
  if (sh->min_local == sh->max_local || sh->hosts < 2)
    snprintf(buf, n, "%d hosts x %d ranks", ms->hosts, ms->local);
  else
    snprintf(buf, n, "%d hosts of %d to %d ranks", sh->hosts, sh->min_local, sh->max_local);
}

/* Whether a GPU allreduce captured in a CUDA graph can run hier: the
 * hierarchy's pieces exist and both run their device collectives in
 * kernel mode (their device rings were made outside the capture). */
static int hier_capturable(const brg_comm *c) {
  if (c->hier_state <= 0) return 0;
  brg_comm *local = __atomic_load_n(&c->local, __ATOMIC_ACQUIRE);
  brg_comm *cross = __atomic_load_n(&c->cross, __ATOMIC_ACQUIRE);
  return brg__device_kernel_mode(__atomic_load_n(&local->dev, __ATOMIC_ACQUIRE)) &&
         brg__device_kernel_mode(__atomic_load_n(&cross->dev, __ATOMIC_ACQUIRE));
}

static unsigned auto_logged(int algo) {
  return algo == BRG__ALGO_HIER   ? BRG__LOGGED_AUTO_HIER
         : algo == BRG__ALGO_TREE ? BRG__LOGGED_AUTO_TREE
         : algo == BRG__ALGO_RHD  ? BRG__LOGGED_AUTO_RHD
                                  : BRG__LOGGED_AUTO_RING;
}

/* Why an allreduce of GPU buffers cannot be staged through host memory,
 * with the log's bit; NULL: it can. A CUDA graph cannot hold the host's
 * wait for the copies. (In the asynchronous mode the communicator's
 * thread waits, on the ring's own stream: brg__exec_staged_async.) */
static const char *unstageable(const brg__coll *k, unsigned *bit) {
  if (k->captured) {
    *bit = BRG__LOGGED_UNSTAGED_CAPTURED;
    return "captured in a CUDA graph, which cannot hold the staging's wait for the stream and "
           "copies on the calling thread";
  }
  return NULL;
}

/* Auto's choice at `bytes`, for host buffers (c->auto_last) and GPU ones
 * (c->auto_dev_last): the last size's is kept in *last (bytes << 8 |
 * algo + 1; 0: none), as loops call one size again and again and the
 * shape is O(N^2) to make; `choose` runs the model where the size is
 * another, and *shaped says it ran. Atomic, as threads may issue at once;
 * a store lost to another only runs the model again. */
static int auto_cached(uint64_t *last, size_t bytes, int *shaped, int (*choose)(void *),
                       void *arg) {
  uint64_t was = __atomic_load_n(last, __ATOMIC_RELAXED);
  if (was && was >> 8 == bytes) return (int)(was & 0xff) - 1;
  int algo = choose(arg);
  *shaped = 1;
  if (bytes < (1ull << 56))
    __atomic_store_n(last, (uint64_t)bytes << 8 | (uint64_t)(algo + 1), __ATOMIC_RELAXED);
  return algo;
}

/* What auto's model is asked, and what it leaves for the log. */
typedef struct auto_ask {
  const brg_comm *c;
  brg__hier_shape *sh;
  brg__model_shape *ms;
  const brg__model_links *ln;
  size_t bytes;
  double *t; /* the staged model's predictions (device_choice) */
} auto_ask;

static int ask_staged(void *arg) {
  auto_ask *a = arg;
  brg__hier_shape_of(a->c, a->sh);
  model_shape_of(a->c, a->sh, a->ms);
  return brg__model_auto_staged(a->ms, a->ln, a->bytes, a->t);
}

static int ask_host(void *arg) {
  auto_ask *a = arg;
  model_shape_of(a->c, a->sh, a->ms);
  return brg__model_auto(a->ms, a->ln, a->bytes, NULL);
}

/* An allreduce of GPU buffers under BRIGADE_ALGO=tree, rhd or auto: lat.c's
 * algorithm on host copies of the buffers (the staged executor, k->lat)
 * where it is forced, or where auto's model finds it and the copies faster
 * than the ring (across hosts, plan/model.c's brg__model_auto_staged), and
 * the call can be staged; else the device ring. Every rank chooses alike:
 * the shape, the settings, the size and the capture are the same on all. */
static brg_status device_choice(brg_comm *c, brg__coll *k) {
  int algo = c->algo;
  unsigned bit = 0;
  const char *why = NULL;
  if (algo == BRG__ALGO_AUTO) {
    size_t bytes = k->count * brg_dtype_size(k->dtype);
    brg__hier_shape sh = {0};
    brg__model_shape ms = {0};
    const brg__model_links *ln = brg__model_links_now();
    double t[3] = {0};
    int shaped = 0;
    auto_ask ask = {.c = c, .sh = &sh, .ms = &ms, .ln = ln, .bytes = bytes, .t = t};
    algo = auto_cached(&c->auto_dev_last, bytes, &shaped, ask_staged, &ask);
    int lat = algo == BRG__ALGO_TREE || algo == BRG__ALGO_RHD;
    unsigned said =
        lat ? (algo == BRG__ALGO_TREE ? BRG__LOGGED_STAGED_TREE : BRG__LOGGED_STAGED_RHD)
            : BRG__LOGGED_DEVICE;
    why = lat ? unstageable(k, &bit) : NULL;
    /* the choice told once, with what the model predicted (the shape
     * again where the size was the last one's) */
    if (!why && !(__atomic_load_n(&c->hier_logged, __ATOMIC_RELAXED) & said)) {
      if (!shaped) ask_staged(&ask);
      char shape[64];
      shape_words(&sh, &ms, shape, sizeof shape);
      if (!brg__hier_first_time(c, said)) {
        /* told by another thread meanwhile */
      } else if (ms.hosts < 2) {
        BRG__INFO("coll",
                  "allreduce algorithm for GPU buffers: ring (BRIGADE_ALGO=auto, all %d ranks "
                  "on one host: the device ring's paths there beat staging through host memory)",
                  c->nranks);
      } else {
        BRG__INFO("coll",
                  "allreduce algorithm for GPU buffers: %s%s (BRIGADE_ALGO=auto, %s, first at "
                  "%zu bytes: predicted ring %.0f us, tree %.0f us and rhd %.0f us, the last two "
                  "with %.0f us of copies to host memory and back%s; BRIGADE_ALGO=hier runs "
                  "them hierarchically; brigade-info --model)",
                  brg__algo_name(algo), lat ? " staged through host memory" : "", shape, bytes,
                  t[0] * 1e6, t[1] * 1e6, t[2] * 1e6, brg__model_stage_time(bytes) * 1e6,
                  lat && brg__device_async_mode(c)
                      ? "; asynchronous mode: the call returns at once, the communicator's "
                        "thread stages it"
                      : "");
      }
    }
    if (!lat) return BRG_SUCCESS;
  } else {
    why = unstageable(k, &bit);
  }
  if (why) {
    if (brg__hier_first_time(c, bit))
      BRG__INFO("coll", "allreduce algorithm for GPU buffers: ring, not %s (BRIGADE_ALGO=%s): %s",
                brg__algo_name(algo), brg__algo_name(c->algo), why);
    return BRG_SUCCESS;
  }
  /* In the asynchronous mode the call returns at once and the
   * communicator's thread stages it (making the device ring at the first
   * call, on every rank alike: all are in that mode or none). */
  int async = brg__device_async_mode(c);
  if (c->algo != BRG__ALGO_AUTO && brg__hier_first_time(c, BRG__LOGGED_DEVICE_LAT)) {
    if (async)
      BRG__INFO("coll",
                "allreduce algorithm for GPU buffers: %s staged through host memory "
                "(BRIGADE_ALGO=%s, %d ranks, asynchronous mode: the call returns at once; the "
                "communicator's thread copies the input to host memory on the device ring's "
                "stream once the caller's stream reaches the call, runs the %s there and copies "
                "the result back, and the caller's stream waits for that)",
                brg__algo_name(algo), brg__algo_name(algo), c->nranks, brg__algo_name(algo));
    else
      BRG__INFO("coll",
                "allreduce algorithm for GPU buffers: %s staged through host memory "
                "(BRIGADE_ALGO=%s, %d ranks: the call waits for its stream, copies the input to "
                "host memory, runs the %s there and copies the result back before it returns)",
                brg__algo_name(algo), brg__algo_name(algo), c->nranks, brg__algo_name(algo));
  }
  k->exec = async ? &brg__exec_staged_async : &brg__exec_staged;
  k->lat = (unsigned char)algo;
  return BRG_SUCCESS;
}

/* An allreduce's algorithm (BRIGADE_ALGO; plan/model.c for auto): k->exec
 * and k->lat for hier and the latency algorithms, left NULL for the
 * ring; the hierarchy's pieces made at the first hier call. */
static brg_status allreduce_choice(brg_comm *c, brg__coll *k) {
  k->exec = NULL;
  k->lat = 0;
  int lat_algo = c->algo == BRG__ALGO_TREE || c->algo == BRG__ALGO_RHD;
  if (c->algo == BRG__ALGO_RING || c->nranks < 2) {
    if (c->algo == BRG__ALGO_RING && brg__hier_first_time(c, BRG__LOGGED_FORCED_RING))
      BRG__INFO("coll", "allreduce algorithm: ring (BRIGADE_ALGO=ring)");
    return BRG_SUCCESS;
  }
  if (k->device && (c->algo == BRG__ALGO_AUTO || lat_algo)) return device_choice(c, k);
  if (lat_algo) {
    if (brg__hier_first_time(c, BRG__LOGGED_FORCED_LAT))
      BRG__INFO("coll", "allreduce algorithm: %s (BRIGADE_ALGO=%s, %d ranks)",
                brg__algo_name(c->algo), brg__algo_name(c->algo), c->nranks);
    k->exec = &brg__exec_lat;
    k->lat = (unsigned char)c->algo;
    return BRG_SUCCESS;
  }
  if (k->device && k->captured && !hier_capturable(c)) {
    if (brg__hier_first_time(c, BRG__LOGGED_CAPTURED))
      BRG__INFO("coll", "allreduce algorithm for GPU buffers captured in a CUDA graph: ring (the "
                        "hierarchy's device rings cannot be made during a capture: call "
                        "brg_comm_device_setup before capturing, or run one hier allreduce of GPU "
                        "buffers outside the capture first)");
    return BRG_SUCCESS;
  }
  brg__hier_shape sh;
  brg__hier_shape_of(c, &sh);
  size_t bytes = k->count * brg_dtype_size(k->dtype);
  if (c->algo == BRG__ALGO_AUTO) {
    brg__model_shape ms;
    const brg__model_links *ln = brg__model_links_now();
    /* the model walks the schedules (O(N) at large N) and the shape the
     * hosts (O(N^2)): the last size's choice is kept */
    int shaped = 0;
    auto_ask ask = {.c = c, .sh = &sh, .ms = &ms, .ln = ln, .bytes = bytes};
    int algo = auto_cached(&c->auto_last, bytes, &shaped, ask_host, &ask);
    if (brg__hier_first_time(c, auto_logged(algo))) {
      char shape[64], pred[160];
      if (!shaped) model_shape_of(c, &sh, &ms);
      shape_words(&sh, &ms, shape, sizeof shape);
      int flat = brg__model_flat_plan(&ms, bytes),
          shown[] = {flat, BRG__PLAN_HIER, BRG__PLAN_TREE, BRG__PLAN_RHD};
      size_t at = 0;
      for (int i = 0; i < 4; i++) {
        double t = brg__model_time(shown[i], &ms, ln, bytes);
        if (t >= 0 && at < sizeof pred)
          at += (size_t)snprintf(pred + at, sizeof pred - at, "%s%s %.0f us", at ? ", " : "",
                                 brg__plan_name(shown[i]), t * 1e6);
      }
      BRG__INFO("coll",
                "allreduce algorithm: %s (BRIGADE_ALGO=auto, %s, first at %zu bytes: predicted "
                "%s; the ring's hops within a host over %s, %d NIC(s) and %d cores a host, "
                "links %s; brigade-info --model)",
                brg__algo_name(algo), shape, bytes, pred, ms.local_tcp ? "tcp" : "shm", ms.nics,
                ms.cores,
                brg__core_str(BRG__CORE_MODEL_FILE)[0] ? brg__core_str(BRG__CORE_MODEL_FILE)
                                                       : "built in");
    }
    if (algo == BRG__ALGO_TREE || algo == BRG__ALGO_RHD) {
      k->exec = &brg__exec_lat;
      k->lat = (unsigned char)algo;
    }
    if (algo != BRG__ALGO_HIER) return BRG_SUCCESS;
  } else if (!brg__hier_fits(&sh) || (k->device && !brg__hier_even(&sh))) {
    if (brg__hier_first_time(c, BRG__LOGGED_SHAPE)) {
      if (sh.hosts < 2)
        BRG__INFO("coll", "allreduce algorithm: ring (BRIGADE_ALGO=%s: all %d ranks on one host)",
                  brg__algo_name(c->algo), c->nranks);
      else if (sh.min_local != sh.max_local)
        BRG__INFO("coll",
                  "allreduce algorithm for GPU buffers: ring (BRIGADE_ALGO=%s: hosts differ in "
                  "rank count, %d to %d ranks on %d hosts; GPU buffers run hier where every "
                  "host has the same number, host buffers run it on these hosts too)",
                  brg__algo_name(c->algo), sh.min_local, sh.max_local, sh.hosts);
      else
        BRG__INFO("coll",
                  "allreduce algorithm: ring (BRIGADE_ALGO=%s: one rank per host on %d hosts, "
                  "nothing to gather within a host)",
                  brg__algo_name(c->algo), sh.hosts);
    }
    return BRG_SUCCESS;
  } else if (brg__hier_first_time(c, k->captured ? BRG__LOGGED_CAPTURED_HIER
                                     : k->device ? BRG__LOGGED_DEVICE
                                                 : BRG__LOGGED_FORCED_HIER)) {
    if (brg__hier_even(&sh))
      BRG__INFO("coll", "allreduce algorithm%s: hier (BRIGADE_ALGO=hier, %d hosts x %d ranks)",
                k->captured ? " for GPU buffers captured in a CUDA graph"
                : k->device ? " for GPU buffers"
                            : "",
                sh.hosts, sh.min_local);
    else
      BRG__INFO("coll",
                "allreduce algorithm: hier (BRIGADE_ALGO=hier, %d hosts of %d to %d ranks: %d "
                "ring(s) across hosts, the ranks beyond them on a host reduced into them first "
                "and given the result last)",
                sh.hosts, sh.min_local, sh.max_local, sh.min_local);
  }
  if (c->hier_state < 0) return BRG_SUCCESS; /* making them failed before: said so then */
  brg_status s = c->hier_state == 0 ? brg__hier_make(c, &sh) : BRG_SUCCESS;
  /* GPU buffers: the links kernel mode needs between hosts, made here as
   * the communicators were (the device setup of each runs at its first phase). */
  if (s == BRG_SUCCESS && k->device) s = brg__comm_netring(c->cross);
  if (s != BRG_SUCCESS) return s;
  k->exec = &brg__exec_hier;
  return BRG_SUCCESS;
}

/* The largest rhd allreduce this communicator runs by recursive doubling
 * alone (BRIGADE_RHD_DOUBLING_BYTES; auto: plan/model.c's crossover on its
 * shape), found at its first rhd call and kept. */
static size_t rhd_doubling_bytes(brg_comm *c) {
  uint64_t known = __atomic_load_n(&c->rhd_doubling, __ATOMIC_RELAXED);
  if (known) return (size_t)(known - 1);
  const char *v = brg__core_str(BRG__CORE_RHD_DOUBLING);
  int64_t b = 0;
  size_t bytes = 0;
  if (!strcmp(v, "auto")) {
    brg__hier_shape sh;
    brg__model_shape ms;
    brg__hier_shape_of(c, &sh);
    model_shape_of(c, &sh, &ms);
    bytes = brg__model_rhd_doubling_bytes(&ms, brg__model_links_now());
    BRG__INFO("coll",
              "rhd allreduces up to %zu bytes run recursive doubling alone, larger ones "
              "halving then doubling (BRIGADE_RHD_DOUBLING_BYTES=auto: the cost model's "
              "crossover on %d ranks)",
              bytes, c->nranks);
  } else if (brg__config_parse_size(v, &b) == BRG_SUCCESS && b > 0) {
    bytes = (size_t)b; /* settings.c refused anything else at load */
  }
  __atomic_store_n(&c->rhd_doubling, (uint64_t)bytes + 1, __ATOMIC_RELAXED);
  return bytes;
}

brg_status brg__exec_choose(brg_comm *c, brg__coll *k) {
  const brg__exec_ops *leaf = brg__exec_leaf(c, k);
  brg_status s = leaf == &brg__exec_device ? brg__exec_device_links(c, k) : BRG_SUCCESS;
  if (s == BRG_SUCCESS && k->kind == BRG__COLL_ALLREDUCE) s = allreduce_choice(c, k);
  if (s != BRG_SUCCESS) return s;
  k->doubling =
      k->lat == BRG__ALGO_RHD && k->count * brg_dtype_size(k->dtype) <= rhd_doubling_bytes(c);
  if (!k->exec && rings_take(c, k, leaf)) k->exec = &brg__exec_rings;
  if (!k->exec) k->exec = leaf;
  return BRG_SUCCESS;
}

brg_status brg__exec_issue(brg_comm *c, brg__coll *k) {
  brg_status s = brg__exec_choose(c, k);
  return s != BRG_SUCCESS ? s : brg__progress_run(c, k);
}
