/*
 * Topology: which ranks share a host, and the ring order, in which ranks
 * of one host are neighbours so that only one link per host boundary
 * crosses the network.
 *
 * Where the ranks of a host advertise several addresses (each rank's
 * network device: BRIGADE_SOCKET_IFNAME or BRIGADE_BOOTSTRAP_ADDR per
 * process), each distinct address is a NIC, numbered on every host in
 * local rank order, and NIC n of every host is rail n. Ring j (the
 * communicator's own is ring 0; BRIGADE_RINGS' ring j turns by j) then
 * crosses hosts on one rail: with n = j mod K, it enters each host at the
 * first rank of NIC n and leaves from the last rank of NIC n, so both
 * ends of every hop between hosts are on NIC n. Where NIC n has a single
 * rank (a NIC per rank) a ring cannot enter and leave through it: ring j
 * enters the hosts at even places of the ring through NIC n and leaves
 * through NIC n+1, and the hosts at odd places the other way round, so
 * each hop still has both ends on one rail (n+1 after an even host, n
 * after an odd one); with an odd number of hosts the hop that closes the
 * ring crosses rails.
 */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hash.h"
#include "internal.h"
#include "settings.h"

/* Ranks with equal hashes share memory: same kernel boot, same host name,
 * same network namespace (namespaces stand for hosts in the multi-host tests). */
uint64_t brg__topology_host_hash(char *hostname, size_t n) {
  uint64_t h = BRG__FNV64_INIT;
  gethostname(hostname, n - 1);
  hostname[n - 1] = 0;
  h = brg__fnv1a64(h, hostname, strlen(hostname));
  char boot[64] = "";
  FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
  if (f) {
    if (!fgets(boot, sizeof boot, f)) boot[0] = 0;
    fclose(f);
  }
  h = brg__fnv1a64(h, boot, strlen(boot));
  struct stat st;
  if (stat("/proc/self/ns/net", &st) == 0) h = brg__fnv1a64(h, &st.st_ino, sizeof st.st_ino);
  return h;
}

int brg__topology_across(const brg_comm *c) {
  for (int r = 1; r < c->nranks; r++)
    if (c->peers[r].host_hash != c->peers[0].host_hash) return 1;
  return 0;
}

static int cmp_host_then_rank(const void *a, const void *b, void *arg) {
  const brg__peer_info *p = arg;
  int x = *(const int *)a, y = *(const int *)b;
  /* Hosts in the order of their lowest rank, ranks in order within a host. */
  int fx = x, fy = y;
  for (int i = 0; i < x; i++)
    if (p[i].host_hash == p[x].host_hash) {
      fx = i;
      break;
    }
  for (int i = 0; i < y; i++)
    if (p[i].host_hash == p[y].host_hash) {
      fy = i;
      break;
    }
  if (fx != fy) return fx - fy;
  return x - y;
}

void brg__topology_ring_line(const brg_comm *c, char *line, size_t cap) {
  size_t o = 0;
  line[0] = 0;
  for (int i = 0; i < c->nranks && o + 32 < cap; i++) {
    int r = c->ring.order[i];
    int boundary = i > 0 && c->peers[r].host_hash != c->peers[c->ring.order[i - 1]].host_hash;
    o += (size_t)snprintf(line + o, cap - o, "%s%d", boundary ? " | " : (i ? " " : ""), r);
  }
}

int brg__topology_nics(const brg_comm *c, int *nic) {
  int n = c->nranks, fewest = n + 1;
  for (int i = 0; i < n; i++) {
    nic[i] = -1;
    int nics = 0; /* distinct addresses of i's host among ranks below i */
    for (int j = 0; j < i && nic[i] < 0; j++) {
      if (c->peers[j].host_hash != c->peers[i].host_hash) continue;
      if (strcmp(c->peers[j].addr, c->peers[i].addr) == 0) nic[i] = nic[j];
    }
    if (nic[i] >= 0) continue;
    for (int j = 0; j < i; j++)
      if (c->peers[j].host_hash == c->peers[i].host_hash && nic[j] + 1 > nics) nics = nic[j] + 1;
    nic[i] = nics;
  }
  for (int i = 0; i < n; i++) { /* each host's count, at its first rank */
    int first = 1, most = 0;
    for (int j = 0; j < n; j++) {
      if (c->peers[j].host_hash != c->peers[i].host_hash) continue;
      if (j < i) first = 0;
      if (nic[j] + 1 > most) most = nic[j] + 1;
    }
    if (first && most < fewest) fewest = most;
  }
  return fewest > n ? 0 : fewest;
}

void brg__topology_log_nics(const brg_comm *c) {
  if (!brg__log_enabled(BRG__LOG_INFO, "init") || c->nranks < 2) return;
  int *nic = malloc((size_t)c->nranks * sizeof *nic);
  if (!nic) return;
  brg__topology_nics(c, nic);
  int most = 0;
  for (int i = 0; i < c->nranks; i++)
    if (nic[i] + 1 > most) most = nic[i] + 1;
  if (most > 1) {
    /* host by host (in order of their lowest rank), "rank:NIC" in rank order */
    char line[2048];
    size_t o = 0;
    line[0] = 0;
    for (int i = 0; i < c->nranks; i++) {
      int first = 1;
      for (int j = 0; j < i && first; j++) first = c->peers[j].host_hash != c->peers[i].host_hash;
      for (int j = i; first && j < c->nranks && o + 32 < sizeof line; j++)
        if (c->peers[j].host_hash == c->peers[i].host_hash)
          o += (size_t)snprintf(line + o, sizeof line - o, "%s%d:%d",
                                j == i ? (o ? " | " : "") : " ", j, nic[j]);
    }
    BRG__INFO("init", "NIC map (rank:NIC, | separates hosts, a NIC is an address): %s", line);
    for (int n = 0; n < most; n++) {
      o = 0;
      line[0] = 0;
      for (int i = 0; i < c->nranks && o + 64 < sizeof line; i++) {
        int r = c->ring.order[i];
        int seen = 0; /* one address per host */
        for (int j = 0; j < i && !seen; j++)
          seen = nic[c->ring.order[j]] == n &&
                 c->peers[c->ring.order[j]].host_hash == c->peers[r].host_hash;
        if (nic[r] != n || seen) continue;
        o += (size_t)snprintf(line + o, sizeof line - o, "%s%s", o ? " " : "", c->peers[r].addr);
      }
      BRG__INFO("init", "rail %d (NIC %d of each host): %s", n, n, line);
    }
  }
  free(nic);
}

static void log_ring(brg_comm *c) {
  if (!brg__log_enabled(BRG__LOG_INFO, "init")) return;
  char line[1024];
  brg__topology_ring_line(c, line, sizeof line);
  BRG__INFO("init", "ring order (| separates hosts): %s", line);
}

/* The cores this process may run on: its affinity mask (taskset, cpusets,
 * a container's cpuset), bounded by a cgroup v2 CPU quota (cpu.max) when
 * there is one; the online count when neither can be read. */
static long usable_cores(void) {
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) cores = CPU_COUNT(&set);
  FILE *f = fopen("/sys/fs/cgroup/cpu.max", "r");
  if (f) {
    long quota, period;
    if (fscanf(f, "%ld %ld", &quota, &period) == 2 && quota > 0 && period > 0) {
      long q = (quota + period - 1) / period;
      if (q < cores) cores = q;
    }
    fclose(f);
  }
  return cores < 1 ? 1 : cores;
}

/* The first or last rank (in the run's order) of NIC n in a host's run. */
static int nic_end(const int *run, int len, const int *nic, int n, int last) {
  int at = -1;
  for (int i = 0; i < len; i++)
    if (nic[run[i]] == n && (at < 0 || last)) at = run[i];
  return at;
}

/* Ring j's stretch of one host (run: its ranks in local order, len of
 * them, place: the host's place in the ring) by the rails (see the top of
 * this file): entry first, exit last, the others between in local order. */
static void rail_stretch(int *run, int len, const int *nic, int j, int place, int *out) {
  int K = 0;
  for (int i = 0; i < len; i++)
    if (nic[run[i]] + 1 > K) K = nic[run[i]] + 1;
  int n = j % K, on_n = 0;
  for (int i = 0; i < len; i++) on_n += nic[run[i]] == n;
  int entry, exit;
  if (on_n >= 2 || len < 2) {
    entry = nic_end(run, len, nic, n, 0);
    exit = nic_end(run, len, nic, n, 1);
  } else {
    int other = nic_end(run, len, nic, (n + 1) % K, 0);
    entry = place % 2 ? other : nic_end(run, len, nic, n, 0);
    exit = place % 2 ? nic_end(run, len, nic, n, 0) : other;
  }
  int o = 0;
  out[o++] = entry;
  for (int i = 0; i < len; i++)
    if (run[i] != entry && run[i] != exit) out[o++] = run[i];
  if (exit != entry) out[o++] = exit;
  memcpy(run, out, (size_t)len * sizeof *out);
}

void brg__topology_order(brg_comm *c) {
  for (int i = 0; i < c->nranks; i++) c->ring.order[i] = i;
  qsort_r(c->ring.order, (size_t)c->nranks, sizeof *c->ring.order, cmp_host_then_rank, c->peers);
  /* Several NICs on a host and several hosts: every ring by the rails.
   * Otherwise an extra ring (init.c) turns each host's stretch of the ring
   * by ring_rotate places, so that it leaves the host from another rank. */
  int *nic = brg__topology_across(c) ? malloc((size_t)c->nranks * sizeof *nic) : NULL;
  int *host_run = malloc((size_t)c->nranks * sizeof *host_run);
  int rails = nic && host_run && brg__topology_nics(c, nic) >= 2;
  for (int a = 0, b, place = 0; host_run && (rails || c->ring_rotate > 0) && a < c->nranks;
       a = b, place++) {
    uint64_t h = c->peers[c->ring.order[a]].host_hash;
    for (b = a; b < c->nranks && c->peers[c->ring.order[b]].host_hash == h; b++) {}
    int len = b - a;
    if (rails) {
      rail_stretch(c->ring.order + a, len, nic, c->ring_rotate, place, host_run);
      continue;
    }
    for (int i = 0; i < len; i++) host_run[i] = c->ring.order[a + (i + c->ring_rotate) % len];
    memcpy(c->ring.order + a, host_run, (size_t)len * sizeof *host_run);
  }
  free(host_run);
  free(nic);
  for (int i = 0; i < c->nranks; i++)
    if (c->ring.order[i] == c->rank) c->ring.pos = i;
  c->ring.next = c->ring.order[(c->ring.pos + 1) % c->nranks];
  c->ring.prev = c->ring.order[(c->ring.pos + c->nranks - 1) % c->nranks];
  if (c->rank == 0) log_ring(c);

  /* Ranks that outnumber the cores must not burn each other's time slices:
   * a waiter yields at once (the rank it waits for may be the one it would
   * delay), then sleeps (unless BRIGADE_SPIN says otherwise). */
  int local = 0;
  for (int i = 0; i < c->nranks; i++) local += c->peers[i].host_hash == c->peers[c->rank].host_hash;
  long cores = usable_cores();
  if (local > cores && !brg__config_is_set(&brg__core_config, BRG__CORE_SPIN)) {
    c->ring.waiter.spin = 0;
    BRG__INFO("init", "%d ranks share %ld cores on this host: waits yield at once", local, cores);
  }
}

/* Every string in a peer's identity must end within its field and be
 * printable before it is ever printed: the blob came over the network. */
static int field_ok(const char *s, size_t n) {
  const char *end = memchr(s, '\0', n);
  if (!end) return 0;
  for (const char *p = s; p < end; p++)
    if ((unsigned char)*p < 0x20 || (unsigned char)*p > 0x7e) return 0;
  return 1;
}

brg_status brg__topology_check_peers(const brg__peer_info *peers, int n, brg__errbuf *err) {
  for (int k = 0; k < n; k++) {
    const brg__peer_info *p = &peers[k];
    const char *bad = p->rank != k                                        ? "rank number"
                      : p->pid <= 0                                       ? "pid"
                      : !field_ok(p->hostname, sizeof p->hostname)        ? "host name"
                      : !field_ok(p->addr, sizeof p->addr) || !p->addr[0] ? "address"
                                                                          : NULL;
    if (bad)
      return brg__error(err, BRG_ERR_REMOTE, "init",
                        "rank %d sent a malformed identity in the bootstrap table (its %s)", k,
                        bad);
  }
  return BRG_SUCCESS;
}
