/*
 * Topology: which ranks share a host, and the ring order, in which ranks
 * of one host are neighbours so that only one link per host boundary
 * crosses the network.
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
    int r = c->ring[i];
    int boundary = i > 0 && c->peers[r].host_hash != c->peers[c->ring[i - 1]].host_hash;
    o += (size_t)snprintf(line + o, cap - o, "%s%d", boundary ? " | " : (i ? " " : ""), r);
  }
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

void brg__topology_order(brg_comm *c) {
  for (int i = 0; i < c->nranks; i++) c->ring[i] = i;
  qsort_r(c->ring, (size_t)c->nranks, sizeof *c->ring, cmp_host_then_rank, c->peers);
  /* An extra ring (init.c) turns each host's stretch of the ring by
   * ring_rotate places, so that it leaves the host from another rank. */
  int *host_run = c->ring_rotate > 0 ? malloc((size_t)c->nranks * sizeof *host_run) : NULL;
  for (int a = 0, b; host_run && a < c->nranks; a = b) {
    uint64_t h = c->peers[c->ring[a]].host_hash;
    for (b = a; b < c->nranks && c->peers[c->ring[b]].host_hash == h; b++) {}
    int len = b - a;
    for (int i = 0; i < len; i++) host_run[i] = c->ring[a + (i + c->ring_rotate) % len];
    memcpy(c->ring + a, host_run, (size_t)len * sizeof *host_run);
  }
  free(host_run);
  for (int i = 0; i < c->nranks; i++)
    if (c->ring[i] == c->rank) c->pos = i;
  c->next = c->ring[(c->pos + 1) % c->nranks];
  c->prev = c->ring[(c->pos + c->nranks - 1) % c->nranks];
  if (c->rank == 0) log_ring(c);

  /* Ranks that outnumber the cores must not burn each other's time slices:
   * a waiter yields at once (the rank it waits for may be the one it would
   * delay), then sleeps (unless BRIGADE_SPIN says otherwise). */
  int local = 0;
  for (int i = 0; i < c->nranks; i++) local += c->peers[i].host_hash == c->peers[c->rank].host_hash;
  long cores = usable_cores();
  if (local > cores && !brg__config_is_set(&brg__core_config, BRG__CORE_SPIN)) {
    c->waiter.spin = 0;
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
