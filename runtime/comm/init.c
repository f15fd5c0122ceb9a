/*
 * The ways into a communicator (brg_comm_init, brg_comm_init_config and,
 * through brg__comm_init_opts, rendezvous.c's brg_comm_init_env), and the
 * extra rings a communicator gets once it exists.
 *
 * Several rings (BRIGADE_RINGS): an allreduce is cut into R parts, one per
 * ring, that run at once. Ring 0 is the communicator's own; ring r > 0 is
 * links of its own, not a communicator (comm.c's brg__comm_piece_make: set
 * up over the communicator's all-gathers, heard of through its liveness
 * thread, with a thread of its own for its part), whose order inside
 * every host is rotated by r, so each ring leaves a host through a
 * different local rank:
 *
 *     host A: a0 a1 a2      ring 0: a0 a1 a2 | b0 b1 b2   crosses a2 -> b0
 *     host B: b0 b1 b2      ring 1: a1 a2 a0 | b1 b2 b0   crosses a0 -> b1
 *                           ring 2: a2 a0 a1 | b2 b0 b1   crosses a1 -> b2
 *
 * Where each local rank has a network device of its own, every device
 * carries a ring's traffic. Each part is a flat ring allreduce, so every
 * rank gets the same bits, as with one ring.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "settings.h"

brg_status brg_comm_init(brg_comm **comm, int nranks, const brg_unique_id *id, int rank) {
  if (!comm) return brg__fail_no_comm(BRG_ERR_INVALID_ARGUMENT, "brg_comm_init: comm is NULL");
  if (!id) return brg__fail_no_comm(BRG_ERR_INVALID_ARGUMENT, "brg_comm_init: id is NULL");
  if (nranks < 1 || nranks > BRG__BOOT_MAX_RANKS)
    return brg__fail_no_comm(BRG_ERR_INVALID_ARGUMENT, "brg_comm_init: nranks=%d is not in [1, %d]",
                             nranks, BRG__BOOT_MAX_RANKS);
  if (rank < 0 || rank >= nranks)
    return brg__fail_no_comm(BRG_ERR_INVALID_ARGUMENT, "brg_comm_init: rank=%d is not in [0, %d)",
                             rank, nranks);
  brg__boot_id bid;
  memcpy(&bid, id->internal, sizeof bid);
  return brg__comm_init_opts(comm, nranks, &bid, rank, NULL);
}

/* The known transport names, comma-separated, for messages. */
static void transport_names(char *out, size_t cap) {
  size_t len = 0;
  out[0] = 0;
  for (int i = 0; brg__transports[i] && len < cap; i++)
    len += (size_t)snprintf(out + len, cap - len, "%s%s", i ? ", " : "", brg__transports[i]->name);
}

/* Every name of a comma-separated list is a transport; "" allows all. */
static brg_status check_transports(const char *list, brg__errbuf *err) {
  if (strlen(list) >= BRG__TRANSPORTS_MAX)
    return brg__error_quiet(err, BRG_ERR_INVALID_ARGUMENT,
                            "brg_comm_init_config: cfg->transports is %zu characters long "
                            "(at most %d)",
                            strlen(list), BRG__TRANSPORTS_MAX - 1);
  for (const char *p = list; *p;) {
    const char *end = strchr(p, ',');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    int known = 0;
    for (int i = 0; brg__transports[i] && !known; i++)
      known =
          len == strlen(brg__transports[i]->name) && strncmp(p, brg__transports[i]->name, len) == 0;
    if (!known) {
      char names[128];
      transport_names(names, sizeof names);
      return brg__error_quiet(err, BRG_ERR_INVALID_ARGUMENT,
                              "brg_comm_init_config: cfg->transports=\"%s\": \"%.*s\" is not a "
                              "transport (known: %s; \"\" allows all, NULL takes "
                              "BRIGADE_TRANSPORTS)",
                              list, (int)len, p, names);
    }
    if (!end) break;
    p = end + 1;
  }
  return BRG_SUCCESS;
}

/* The fields a config of this size and version carries, checked. */
static brg_status read_config(const brg_comm_config *cfg, brg__comm_opts *o, brg__errbuf *err) {
  o->timeout_ms = -1;
  o->transports = NULL;
  if (!cfg) return BRG_SUCCESS;
  size_t v1 = offsetof(brg_comm_config, transports) + sizeof cfg->transports;
  if (cfg->size < v1 || cfg->size > sizeof *cfg)
    return brg__error_quiet(err, BRG_ERR_INVALID_ARGUMENT,
                            "brg_comm_init_config: cfg->size is %zu, expected %zu (initialize the "
                            "config with BRG_COMM_CONFIG_INIT)",
                            cfg->size, sizeof *cfg);
  if (cfg->version < 1 || cfg->version > BRG_COMM_CONFIG_VERSION)
    return brg__error_quiet(err, BRG_ERR_INVALID_ARGUMENT,
                            "brg_comm_init_config: cfg->version is %u, this library knows 1 to %d "
                            "(initialize the config with BRG_COMM_CONFIG_INIT)",
                            cfg->version, BRG_COMM_CONFIG_VERSION);
  if (cfg->timeout_ms != BRG_CONFIG_UNSET) {
    const brg__cfg_entry *e = &brg__core_config.entries[BRG__CORE_TIMEOUT_MS];
    if (cfg->timeout_ms < e->min || cfg->timeout_ms > e->max)
      return brg__error_quiet(err, BRG_ERR_INVALID_ARGUMENT,
                              "brg_comm_init_config: cfg->timeout_ms=%d is not in [%lld, %lld] "
                              "(BRG_CONFIG_UNSET takes BRIGADE_TIMEOUT_MS)",
                              cfg->timeout_ms, (long long)e->min, (long long)e->max);
    o->timeout_ms = cfg->timeout_ms;
  }
  if (cfg->transports) {
    brg_status s = check_transports(cfg->transports, err);
    if (s != BRG_SUCCESS) return s;
    o->transports = cfg->transports;
  }
  return BRG_SUCCESS;
}

brg_status brg_comm_init_config(brg_comm **comm, int nranks, const brg_unique_id *id, int rank,
                                const brg_comm_config *cfg) {
  if (!comm)
    return brg__fail_no_comm(BRG_ERR_INVALID_ARGUMENT, "brg_comm_init_config: comm is NULL");
  if (!id) return brg__fail_no_comm(BRG_ERR_INVALID_ARGUMENT, "brg_comm_init_config: id is NULL");
  if (nranks < 1 || nranks > BRG__BOOT_MAX_RANKS)
    return brg__fail_no_comm(BRG_ERR_INVALID_ARGUMENT,
                             "brg_comm_init_config: nranks=%d is not in [1, %d]", nranks,
                             BRG__BOOT_MAX_RANKS);
  if (rank < 0 || rank >= nranks)
    return brg__fail_no_comm(BRG_ERR_INVALID_ARGUMENT,
                             "brg_comm_init_config: rank=%d is not in [0, %d)", rank, nranks);
  brg__errbuf err = {0};
  brg__comm_opts o = {.timeout_ms = -1};
  brg_status s = brg__settings_load(&err); /* the bounds of the settings table */
  if (s == BRG_SUCCESS) s = read_config(cfg, &o, &err);
  if (s != BRG_SUCCESS) return brg__fail_no_comm_err(s, &err, NULL);
  brg__boot_id bid;
  memcpy(&bid, id->internal, sizeof bid);
  return brg__comm_init_opts(comm, nranks, &bid, rank, &o);
}

/* Where every rank sits: host[i] (hosts numbered in order of their lowest
 * rank) and local[i] (its place among its host's ranks, in rank order).
 * Returns the ranks per host when every host has as many, else 0. */
static int host_layout(const brg_comm *c, int *host, int *local, int *nhosts) {
  int n = c->nranks, hosts = 0;
  for (int i = 0; i < n; i++) {
    host[i] = -1;
    local[i] = 0;
    for (int j = 0; j < i && host[i] < 0; j++)
      if (c->peers[j].host_hash == c->peers[i].host_hash) host[i] = host[j];
    if (host[i] < 0) host[i] = hosts++;
    for (int j = 0; j < i; j++) local[i] += host[j] == host[i];
  }
  *nhosts = hosts;
  int per = n / hosts;
  for (int i = 0; i < n; i++)
    if (local[i] >= per || n % hosts) return 0;
  return per;
}

/* The automatic ring count: one per network address the ranks of a host
 * advertise (each local rank may be given its own device through
 * BRIGADE_SOCKET_IFNAME), on a job of more than one host; else one. */
static int auto_rings(const brg_comm *c, const int *host, int nhosts, int per) {
  if (nhosts < 2 || per < 2) return 1;
  int fewest = per;
  for (int h = 0; h < nhosts; h++) {
    int distinct = 0;
    for (int i = 0; i < c->nranks; i++) {
      if (host[i] != h) continue;
      int seen = 0;
      for (int j = 0; j < i && !seen; j++)
        seen = host[j] == h && strcmp(c->peers[j].addr, c->peers[i].addr) == 0;
      distinct += !seen;
    }
    if (distinct < fewest) fewest = distinct;
  }
  return fewest;
}

/* Each ring's order (the same ranks as this communicator's), for
 * BRIGADE_DEBUG=INFO. */
static void log_rings(const brg_comm *c) {
  if (!brg__log_enabled(BRG__LOG_INFO, "init")) return;
  for (int r = 0; r < c->nrings; r++) {
    char line[1024];
    brg__topology_ring_line(r == 0 ? c : c->rings[r], line, sizeof line);
    BRG__INFO("init", "ring %d of %d (| separates hosts): %s", r, c->nrings, line);
  }
}

static brg_status rings_setup(brg_comm *c, char *why, size_t cap) {
  int n = c->nranks;
  if (n == 1) return BRG_SUCCESS;
  /* the same on every rank: init compared it in the peer table */
  int32_t want = (int32_t)brg__core_int(BRG__CORE_RINGS);
  brg_status s = BRG_SUCCESS;
  int *host = calloc((size_t)n, sizeof *host), *local = calloc((size_t)n, sizeof *local);
  if (!host || !local) {
    free(host);
    free(local);
    snprintf(why, cap, "out of memory for %d ranks", n);
    return BRG_ERR_NO_MEMORY;
  }
  int nhosts = 0, per = host_layout(c, host, local, &nhosts);
  int rings = want > 0 ? want : auto_rings(c, host, nhosts, per);
  /* the rings follow the NICs where hosts have several (topology.c) */
  int nics = nhosts > 1 && brg__topology_nics(c, local) >= 2; /* local[] is done with */
  if (nics) brg__topology_log_nics(c);
  if (rings > 1 && per == 0) {
    BRG__INFO("init", "%d rings asked for, but the hosts have different numbers of ranks: one ring",
              rings);
    rings = 1;
  } else if (rings > per && per > 0) {
    BRG__INFO("init", "%d rings asked for, but a host has %d ranks to leave it through: %d rings",
              rings, per, per);
    rings = per;
  }
  if (rings > 1) {
    c->rings = calloc((size_t)rings, sizeof *c->rings);
    if (!c->rings) {
      snprintf(why, cap, "out of memory for %d rings", rings);
      s = BRG_ERR_NO_MEMORY;
    }
  }
  for (int r = 1; r < rings && s == BRG_SUCCESS; r++) {
    /* The same ranks (so that messages name the same ones), the ring
     * inside each host turned by r. */
    s = brg__comm_piece_make(c, 0, c->rank, r, &c->rings[r]);
    if (s != BRG_SUCCESS) {
      snprintf(why, cap, "making ring %d of %d: %s", r, rings, brg_comm_last_error(NULL));
      break;
    }
    c->nrings = r + 1;
  }
  if (s == BRG_SUCCESS && rings > 1) {
    c->nrings = rings;
    log_rings(c);
    BRG__INFO("init",
              "%d rings (%s), %d host(s) x %d ranks: %s; an allreduce of at least %d x %zu bytes "
              "is cut over them all, a smaller one runs on ring 0",
              rings, want > 0 ? "BRIGADE_RINGS" : "one per network address of a host", nhosts, per,
              nics ? "ring r crosses hosts on rail r modulo the NICs (NIC map above)"
                   : "ring r leaves each host from its local rank r-1 (ring 0: the last)",
              rings, c->slice_bytes);
  }
  free(host);
  free(local);
  return s;
}

brg_status brg__comm_init_opts(brg_comm **out, int nranks, const brg__boot_id *id, int rank,
                               const brg__comm_opts *opts) {
  brg_comm *c = NULL;
  brg_status s = brg__comm_create_opts(&c, nranks, id, rank, opts);
  if (s != BRG_SUCCESS) return s;
  char why[BRG__ERRLEN - 64];
  why[0] = 0;
  if ((s = rings_setup(c, why, sizeof why)) != BRG_SUCCESS) {
    brg_comm_abort(c);
    brg_comm_destroy(c);
    return brg__fail_no_comm(s, "rank %d: %s", rank, why);
  }
  *out = c;
  return BRG_SUCCESS;
}
