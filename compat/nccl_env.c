/*
 * NCCL_* variables under libbrigade_nccl.so: those with a brigade meaning
 * are set as the BRIGADE_* variable that has it, before brigade reads its
 * settings (it reads them once, at its first call), so that a job tuned
 * for NCCL keeps what it asked for. A BRIGADE_* variable the user set
 * wins. Each mapping is said at INFO ("NCCL_ALGO=Tree taken as
 * BRIGADE_ALGO=tree"); the NCCL_* variables brigade has no meaning for are
 * named in one WARN. The lines go to stderr at brigade's level
 * (BRIGADE_DEBUG, or NCCL_DEBUG mapped to it).
 *
 * The mapping runs at the library's first call that reaches brigade
 * (ncclGetUniqueId, a communicator's init, ncclMemAlloc ...), not at
 * load: a program may set NCCL_* in its own environment after it starts
 * (os.environ in Python) and before it makes a communicator.
 */
#include <ctype.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "nccl_env.h"

extern char **environ;

/* The BRIGADE_* variables this file set, so that a later pass
 * (ncclResetDebugInit) does not take its own as the user's. */
static const char *ours[32];
static int nours;

static int set_by_us(const char *name) {
  for (int i = 0; i < nours; i++)
    if (!strcmp(ours[i], name)) return 1;
  return 0;
}

/* BRIGADE_DEBUG's level, as brigade reads it: 0 silent, 1 WARN, 2 INFO,
 * 3 TRACE. */
static int level(void) {
  const char *v = getenv("BRIGADE_DEBUG");
  if (!v) return 0;
  if (!strcasecmp(v, "WARN")) return 1;
  if (!strcasecmp(v, "INFO")) return 2;
  if (!strcasecmp(v, "TRACE")) return 3;
  return 0;
}

static void say(int lvl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(int lvl, const char *fmt, ...) {
  if (level() < lvl) return;
  char host[64] = "", line[1024];
  gethostname(host, sizeof host - 1);
  char *dot = strchr(host, '.');
  if (dot) *dot = 0;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  fprintf(stderr, "%s:%d brigade %s [init] %s\n", host, (int)getpid(), lvl == 1 ? "WARN" : "INFO",
          line);
}

/* Sets `brg` to `value` for `nccl` (its text `why`, the NCCL setting as
 * the user wrote it), unless the user set `brg`; says which at INFO. */
static void apply(const char *why, const char *brg, const char *value, const char *note) {
  const char *had = getenv(brg);
  if (had && !set_by_us(brg)) {
    say(2, "%s not applied: %s=%s is set, and wins", why, brg, had);
    return;
  }
  setenv(brg, value, 1);
  if (!set_by_us(brg) && nours < (int)(sizeof ours / sizeof ours[0])) ours[nours++] = brg;
  say(2, "%s taken as %s=%s%s%s", why, brg, value, note && note[0] ? " " : "", note ? note : "");
}

/* An integer variable, or -1 (with a WARN) when it is not one. */
static long long int_of(const char *name, const char *v) {
  char *end = NULL;
  long long x = strtoll(v, &end, 0);
  if (!v[0] || *end || x < 0) {
    say(1, "%s=%s is not a non-negative integer: ignored", name, v);
    return -1;
  }
  return x;
}

/* The first name of an NCCL interface or HCA list ("=mlx5_0:1,mlx5_1"):
 * brigade takes one. 0 for an exclusion list ("^..."), which it cannot
 * express. */
static int first_of_list(const char *name, const char *v, char *out, size_t n, int *several) {
  if (v[0] == '^') {
    say(1, "%s=%s not applied: brigade takes one name (a prefix), not a list to exclude", name, v);
    return 0;
  }
  if (v[0] == '=') v++;
  size_t len = strcspn(v, ",");
  if (!len || len >= n) {
    say(1, "%s=%s not applied: no name in it", name, v);
    return 0;
  }
  memcpy(out, v, len);
  out[len] = 0;
  *several = v[len] == ',';
  return 1;
}

static int is_set(const char *v) {
  return v && v[0];
}

static int truthy(const char *v) {
  return is_set(v) && strcmp(v, "0") != 0;
}

/* The NCCL_* names this file reads: any other is named in the WARN. */
static const char *const known[] = {"NCCL_DEBUG",
                                    "NCCL_DEBUG_FILE",
                                    "NCCL_DEBUG_SUBSYS",
                                    "NCCL_SOCKET_IFNAME",
                                    "NCCL_IB_HCA",
                                    "NCCL_IB_DISABLE",
                                    "NCCL_P2P_DISABLE",
                                    "NCCL_SHM_DISABLE",
                                    "NCCL_NET",
                                    "NCCL_ALGO",
                                    "NCCL_PROTO",
                                    "NCCL_MIN_NCHANNELS",
                                    "NCCL_MAX_NCHANNELS",
                                    "NCCL_MIN_CTAS",
                                    "NCCL_MAX_CTAS",
                                    "NCCL_BUFFSIZE",
                                    "NCCL_IB_GID_INDEX",
                                    "NCCL_IB_TIMEOUT",
                                    "NCCL_IB_RETRY_CNT",
                                    "NCCL_IB_QPS_PER_CONNECTION",
                                    "NCCL_NET_GDR_LEVEL",
                                    "NCCL_COMM_ID",
                                    NULL};

static void debug_vars(void) {
  const char *d = getenv("NCCL_DEBUG");
  if (is_set(d)) {
    const char *to = !strcasecmp(d, "WARN") || !strcasecmp(d, "VERSION") || !strcasecmp(d, "ABORT")
                         ? "WARN"
                     : !strcasecmp(d, "INFO")  ? "INFO"
                     : !strcasecmp(d, "TRACE") ? "TRACE"
                     : !strcasecmp(d, "NONE")  ? "NONE"
                                               : NULL;
    char why[128];
    snprintf(why, sizeof why, "NCCL_DEBUG=%.64s", d);
    if (to)
      apply(why, "BRIGADE_DEBUG", to, NULL);
    else
      say(1, "%s not applied: NCCL's levels are VERSION, WARN, INFO, TRACE and ABORT", why);
  }
  const char *f = getenv("NCCL_DEBUG_FILE");
  if (is_set(f)) {
    char why[600];
    snprintf(why, sizeof why, "NCCL_DEBUG_FILE=%.512s", f);
    apply(why, "BRIGADE_DEBUG_FILE", f, "(%h host and %p pid read as NCCL reads them)");
  }
  const char *sub = getenv("NCCL_DEBUG_SUBSYS");
  if (is_set(sub)) {
    /* NCCL's subsystems that brigade has, by its names. */
    static const char *const map[][2] = {
        {"INIT", "init"},  {"COLL", "coll"},           {"P2P", "ring"}, {"SHM", "shm"},
        {"NET", "tcp,ib"}, {"BOOTSTRAP", "bootstrap"}, {"ALL", "all"}};
    char out[256] = "", dropped[256] = "", tok[64];
    if (sub[0] == '^') {
      say(1, "NCCL_DEBUG_SUBSYS=%.128s not applied: brigade has no list of subsystems to exclude",
          sub);
    } else {
      for (const char *p = sub; *p;) {
        size_t len = strcspn(p, ",");
        snprintf(tok, sizeof tok, "%.*s", (int)(len < 63 ? len : 63), p);
        const char *to = NULL;
        for (size_t i = 0; i < sizeof map / sizeof map[0] && !to; i++)
          if (!strcasecmp(tok, map[i][0])) to = map[i][1];
        char *dst = to ? out : dropped;
        size_t used = strlen(dst);
        if (tok[0]) snprintf(dst + used, sizeof out - used, "%s%s", used ? "," : "", to ? to : tok);
        p += len;
        if (*p) p++;
      }
      char why[400];
      snprintf(why, sizeof why, "NCCL_DEBUG_SUBSYS=%.128s", sub);
      char note[300] = "";
      if (dropped[0]) snprintf(note, sizeof note, "(brigade has no %.250s subsystem)", dropped);
      if (out[0])
        apply(why, "BRIGADE_DEBUG_SUBSYS", out, note);
      else
        say(1, "%s not applied: %s", why, note);
    }
  }
}

static void transport_vars(void) {
  const char *ib = getenv("NCCL_IB_DISABLE"), *p2p = getenv("NCCL_P2P_DISABLE");
  const char *shm = getenv("NCCL_SHM_DISABLE"), *net = getenv("NCCL_NET");
  int no_ib = truthy(ib), no_ipc = truthy(p2p), no_shm = truthy(shm), no_tcp = 0;
  if (is_set(net)) {
    if (!strcasecmp(net, "Socket"))
      no_ib = 1;
    else if (!strcasecmp(net, "IB"))
      no_tcp = 1;
    else
      say(1, "NCCL_NET=%.64s not applied: brigade's networks are Socket (tcp) and IB (ibverbs)",
          net);
  }
  if (!no_ib && !no_ipc && !no_shm && !no_tcp) return;
  char why[256] = "", list[64] = "";
  const char *names[][2] = {{"NCCL_P2P_DISABLE", p2p},
                            {"NCCL_SHM_DISABLE", shm},
                            {"NCCL_IB_DISABLE", ib},
                            {"NCCL_NET", net}};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (is_set(names[i][1]) &&
        (i == 3 ? !strcasecmp(net, "Socket") || !strcasecmp(net, "IB") : truthy(names[i][1])))
      snprintf(why + strlen(why), sizeof why - strlen(why), "%s%s=%.32s", why[0] ? " " : "",
               names[i][0], names[i][1]);
  const char *all[] = {"cuda_ipc", "shm", "ibverbs", "tcp"};
  int off[] = {no_ipc, no_shm, no_ib, no_tcp};
  for (int i = 0; i < 4; i++)
    if (!off[i])
      snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", list[0] ? "," : "", all[i]);
  if (!list[0]) {
    say(1, "%s not applied: it leaves brigade no transport", why);
    return;
  }
  apply(why, "BRIGADE_TRANSPORTS", list, NULL);
}

static void tuning_vars(void) {
  char why[256], val[64];
  const char *algo = getenv("NCCL_ALGO");
  if (is_set(algo)) {
    snprintf(why, sizeof why, "NCCL_ALGO=%.64s", algo);
    if (!strcasecmp(algo, "Ring") || !strcasecmp(algo, "Tree")) {
      snprintf(val, sizeof val, "%s", !strcasecmp(algo, "Ring") ? "ring" : "tree");
      apply(why, "BRIGADE_ALGO", val,
            "(the algorithm of allreduces of host buffers; device collectives run on the ring)");
    } else {
      say(1, "%s not applied: brigade takes one algorithm, Ring or Tree", why);
    }
  }
  const char *proto = getenv("NCCL_PROTO");
  if (is_set(proto)) {
    /* Brigade's protocols: LL lines for small one-shot allreduces and, where
     * set, for the ring's mid sizes, and its ring (Simple). LL128 has no
     * counterpart. */
    int exclude = proto[0] == '^', has_ll = 0;
    for (const char *p = proto + exclude; *p;) {
      size_t len = strcspn(p, ",");
      if (len == 2 && !strncasecmp(p, "LL", 2)) has_ll = 1;
      p += len;
      if (*p) p++;
    }
    snprintf(why, sizeof why, "NCCL_PROTO=%.64s", proto);
    if (exclude == has_ll) {
      apply(why, "BRIGADE_DEVICE_LL_BYTES", "0", "(no LL lines)");
      apply(why, "BRIGADE_DEVICE_RING_LL_BYTES", "0", "(no LL lines on the ring)");
    } else {
      say(2,
          "%s allows LL: BRIGADE_DEVICE_LL_BYTES and BRIGADE_DEVICE_RING_LL_BYTES stay at their "
          "values (brigade has no LL128)",
          why);
    }
  }
  const char *mx = getenv("NCCL_MAX_NCHANNELS"), *mn = getenv("NCCL_MIN_NCHANNELS");
  const char *mxc = getenv("NCCL_MAX_CTAS"), *mnc = getenv("NCCL_MIN_CTAS");
  const char *chname = is_set(mx)    ? "NCCL_MAX_NCHANNELS"
                       : is_set(mxc) ? "NCCL_MAX_CTAS"
                       : is_set(mn)  ? "NCCL_MIN_NCHANNELS"
                       : is_set(mnc) ? "NCCL_MIN_CTAS"
                                     : NULL;
  if (chname) {
    const char *v = getenv(chname);
    long long ch = int_of(chname, v);
    if (ch >= 0) {
      snprintf(why, sizeof why, "%s=%.32s", chname, v);
      snprintf(val, sizeof val, "%lld", ch < 1 ? 1 : ch > 32 ? 32 : ch);
      apply(why, "BRIGADE_DEVICE_CHANNELS", val,
            ch > 32 ? "(brigade fixes the count, at most 32)" : "(brigade fixes the count)");
    }
  }
  const char *buf = getenv("NCCL_BUFFSIZE");
  if (is_set(buf)) {
    long long bytes = int_of("NCCL_BUFFSIZE", buf);
    long long steps = getenv("BRIGADE_STEPS") ? atoll(getenv("BRIGADE_STEPS")) : 8;
    if (steps < 1) steps = 8;
    if (bytes >= 0) {
      long long slice = bytes / steps;
      snprintf(why, sizeof why, "NCCL_BUFFSIZE=%.32s", buf);
      if (slice < 4096 || slice > 64LL << 20) {
        say(1, "%s not applied: %lld bytes per slot (of %lld) is outside brigade's 4K to 64M", why,
            slice, steps);
      } else {
        snprintf(val, sizeof val, "%lld", slice);
        char note[96];
        snprintf(note, sizeof note, "(the buffer over %lld slots)", steps);
        apply(why, "BRIGADE_SLICE_BYTES", val, note);
        apply(why, "BRIGADE_DEVICE_SLICE_BYTES", val, note);
      }
    }
  }
}

static void network_vars(void) {
  char why[256], name[128];
  int several = 0;
  const char *ifn = getenv("NCCL_SOCKET_IFNAME");
  if (is_set(ifn) && first_of_list("NCCL_SOCKET_IFNAME", ifn, name, sizeof name, &several)) {
    snprintf(why, sizeof why, "NCCL_SOCKET_IFNAME=%.128s", ifn);
    apply(why, "BRIGADE_SOCKET_IFNAME", name,
          several ? "(the first of the list, as a prefix)" : "(as a prefix)");
  }
  const char *hca = getenv("NCCL_IB_HCA");
  if (is_set(hca) && first_of_list("NCCL_IB_HCA", hca, name, sizeof name, &several)) {
    snprintf(why, sizeof why, "NCCL_IB_HCA=%.128s", hca);
    apply(why, "BRIGADE_IB_HCA", name, several ? "(the first of the list)" : NULL);
  }
  static const char *const same[][2] = {{"NCCL_IB_GID_INDEX", "BRIGADE_IB_GID_INDEX"},
                                        {"NCCL_IB_TIMEOUT", "BRIGADE_IB_TIMEOUT"},
                                        {"NCCL_IB_RETRY_CNT", "BRIGADE_IB_RETRY_CNT"},
                                        {"NCCL_IB_QPS_PER_CONNECTION", "BRIGADE_IB_QPS_PER_LINK"}};
  for (size_t i = 0; i < sizeof same / sizeof same[0]; i++) {
    const char *v = getenv(same[i][0]);
    if (!is_set(v)) continue;
    snprintf(why, sizeof why, "%s=%.64s", same[i][0], v);
    apply(why, same[i][1], v, NULL);
  }
  const char *gdr = getenv("NCCL_NET_GDR_LEVEL");
  if (is_set(gdr)) {
    snprintf(why, sizeof why, "NCCL_NET_GDR_LEVEL=%.32s", gdr);
    if (!strcasecmp(gdr, "LOC") || !strcmp(gdr, "0"))
      apply(why, "BRIGADE_IB_GDR", "0", "(never GPUDirect RDMA)");
    else
      say(2, "%s: brigade uses GPUDirect RDMA wherever it works (BRIGADE_IB_GDR)", why);
  }
  const char *id = getenv("NCCL_COMM_ID");
  if (is_set(id))
    say(1,
        "NCCL_COMM_ID=%.128s not applied: brigade's ncclGetUniqueId makes its root in the "
        "calling process; hand its id to the other ranks",
        id);
}

/* One WARN naming every NCCL_* variable that has no brigade meaning. */
static void unknown_vars(void) {
  char names[1024] = "";
  int n = 0;
  for (char **e = environ; e && *e; e++) {
    if (strncmp(*e, "NCCL_", 5)) continue;
    size_t len = strcspn(*e, "=");
    int found = 0;
    for (int i = 0; known[i] && !found; i++)
      found = strlen(known[i]) == len && !strncmp(known[i], *e, len);
    if (found) continue;
    size_t used = strlen(names);
    if (used + len + 3 < sizeof names)
      snprintf(names + used, sizeof names - used, "%s%.*s", n ? ", " : "", (int)len, *e);
    n++;
  }
  if (n)
    say(1, "%s %s no meaning in brigade and %s ignored", names, n == 1 ? "has" : "have",
        n == 1 ? "is" : "are");
}

static void apply_all(void) {
  debug_vars();
  transport_vars();
  tuning_vars();
  network_vars();
  unknown_vars();
}

static pthread_once_t once = PTHREAD_ONCE_INIT;

void brg__nccl_env_apply(void) {
  pthread_once(&once, apply_all);
}

void brg__nccl_env_debug_again(void) {
  debug_vars();
}
