#include "settings.h"

#include <arpa/inet.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include "secret.h"
#include "transport.h"
#include "verbs_api.h"

int brg__algo_parse(const char *name); /* below; internal.h declares it */

static brg__cfg_entry core_entries[BRG__CORE_COUNT] = {
    [BRG__CORE_TIMEOUT_MS] = {"BRIGADE_TIMEOUT_MS", BRG__CFG_KIND_INT, "600000", 100, INT_MAX,
                              "how long a rank waits for a peer (bootstrap or collective) "
                              "before failing with a timeout"},
    [BRG__CORE_SLICE_BYTES] =
        {"BRIGADE_SLICE_BYTES", BRG__CFG_KIND_SIZE, "128K", 4 * BRG__KiB, 64 * BRG__MiB,
         "pipeline unit: bytes per FIFO slot (unset: 128K, or 512K on a ring with a tcp link)"},
    [BRG__CORE_STEPS] = {"BRIGADE_STEPS", BRG__CFG_KIND_INT, "8", 1, 64,
                         "FIFO slots per connection"},
    [BRG__CORE_TRANSPORTS] =
        {"BRIGADE_TRANSPORTS", BRG__CFG_KIND_STRING, "", 0, 0,
         "comma-separated transports allowed (cuda_ipc,shm,ibverbs,tcp); empty: all"},
    [BRG__CORE_BOOTSTRAP_ADDR] =
        {"BRIGADE_BOOTSTRAP_ADDR", BRG__CFG_KIND_STRING, "", 0, 0,
         "address (or host name) this rank advertises; not an address no other "
         "host could reach it at (0.0.0.0, ::, broadcast, multicast); "
         "empty: automatic"},
    [BRG__CORE_SOCKET_IFNAME] = {"BRIGADE_SOCKET_IFNAME", BRG__CFG_KIND_STRING, "", 0, 0,
                                 "network interface to take the address from"},
    [BRG__CORE_SPIN] = {"BRIGADE_SPIN", BRG__CFG_KIND_INT, "2000", 0, 100000000,
                        "busy polls before a waiting rank yields the core"},
    [BRG__CORE_SECRET] =
        {"BRIGADE_SECRET", BRG__CFG_KIND_STRING, "", 0, 0,
         "job secret for brg_comm_init_env: 32 to 256 hex digits (at least 128 bits) "
         "that do not repeat a shorter pattern, refused otherwise (used as is at "
         "32 digits, hashed to 128 bits when longer); brigade-run sets a random "
         "one; empty: derived from MASTER_ADDR and MASTER_PORT, which keeps "
         "strays out but not a user who can compute it"},
    [BRG__CORE_SMALL_BYTES] = {"BRIGADE_SMALL_BYTES", BRG__CFG_KIND_SIZE, "4K", 0, 64 * BRG__KiB,
                               "allreduce of at most this many bytes gathers every input around "
                               "the ring (N-1 steps instead of 2N-2) and reduces locally; 0: off"},
    [BRG__CORE_STREAM_BYTES] =
        {"BRIGADE_STREAM_BYTES", BRG__CFG_KIND_SIZE, "32M", 0, 1LL << 50,
         "collectives of at least this many bytes write their output with "
         "non-temporal stores (it would not stay in cache anyway); 0: never"},
    [BRG__CORE_PORT] = {"BRIGADE_PORT", BRG__CFG_KIND_INT, "0", 0, 65535,
                        "TCP port rank 0 serves brg_comm_init_env's rendezvous on, for when "
                        "MASTER_PORT is taken by another store (torch's under mp.spawn); "
                        "0: MASTER_PORT (MASTER_PORT + 1 under torchrun)"},
    [BRG__CORE_SILENT_MS] =
        {"BRIGADE_SILENT_TIMEOUT_MS", BRG__CFG_KIND_INT, "5000", 0, INT_MAX,
         "a waiting rank fails once another rank's heartbeats have been missing this long "
         "(its host vanished or it stopped; a busy rank keeps beating), before "
         "BRIGADE_TIMEOUT_MS; 0: off (at least 1000 in effect)"},
    [BRG__CORE_ALGO] = {"BRIGADE_ALGO", BRG__CFG_KIND_STRING, "auto", 0, 0,
                        "allreduce algorithm: ring (one ring over every rank), hier "
                        "(reduce-scatter within each host, allreduce across hosts, all-gather "
                        "within each host), tree (double binary tree), rhd (recursive halving "
                        "and doubling) or auto (the fastest by the cost model, brigade-info "
                        "--model); GPU buffers run tree and rhd on host copies (auto takes them "
                        "across hosts where they win with the copies; in the asynchronous mode "
                        "of BRIGADE_DEVICE_PROXY the communicator's thread stages them and the "
                        "call returns at once), except in a CUDA graph, where they take the "
                        "ring; the same on every rank"},
    [BRG__CORE_RINGS] = {"BRIGADE_RINGS", BRG__CFG_KIND_INT, "0", 0, 64,
                         "rings a large allreduce is cut over, each leaving every host through "
                         "a different local rank; 0: one per network address a host's ranks "
                         "advertise on a job of several hosts, else 1"},
    [BRG__CORE_P2P_EARLY] =
        {"BRIGADE_P2P_EARLY_BYTES", BRG__CFG_KIND_SIZE, "64M", 0, 1LL << 50,
         "bytes of point-to-point messages a rank keeps for receives it has not posted yet "
         "(one message always fits when none is kept); beyond it senders wait for receives"},
    [BRG__CORE_HIER_PIECES] = {"BRIGADE_HIER_PIECES", BRG__CFG_KIND_INT, "0", 0, 64,
                               "pieces a hierarchical allreduce of host buffers is cut into, "
                               "so that one piece crosses hosts while the next is reduced "
                               "within the host; 1: its phases one after another, 0: "
                               "automatic (up to 8); the same on every rank"},
    [BRG__CORE_MODEL_FILE] = {"BRIGADE_MODEL_FILE", BRG__CFG_KIND_STRING, "", 0, 0,
                              "the cost model's links (alpha and beta of shm, tcp, the "
                              "network, point-to-point), as brigade-info --calibrate writes "
                              "them; BRIGADE_ALGO=auto chooses by them; the same on every "
                              "rank; empty: the built-in ones"},
    [BRG__CORE_RHD_DOUBLING] = {"BRIGADE_RHD_DOUBLING_BYTES", BRG__CFG_KIND_STRING, "auto", 0, 0,
                                "rhd allreduces up to this many bytes, of at least P elements "
                                "(the largest power of two up to the ranks), run recursive "
                                "doubling alone (log2 P rounds, each exchanging the whole "
                                "buffer) instead of halving then doubling (twice the rounds, "
                                "shrinking shares); auto: where the cost model finds it faster "
                                "(brigade-info --model); 0: never; the same on every rank"},
};

static brg__cfg_entry device_entries[BRG__DEVICE_COUNT] = {
    [BRG__DEVICE_SLICE_BYTES] = {"BRIGADE_DEVICE_SLICE_BYTES", BRG__CFG_KIND_SIZE, "4M",
                                 4 * BRG__KiB, 1 * BRG__GiB,
                                 "pipeline unit of device collectives: bytes per slot of the "
                                 "GPU FIFO (BRIGADE_STEPS slots per rank)"},
    [BRG__DEVICE_CUDA_MODULE] = {"BRIGADE_CUDA_MODULE", BRG__CFG_KIND_STRING, "", 0, 0,
                                 "path of the CUDA module to open (libbrigade_cuda.so or a "
                                 "stand-in with the same table); empty: beside the library"},
    [BRG__DEVICE_IB_GDR] = {"BRIGADE_IB_GDR", BRG__CFG_KIND_INT, "1", 0, 1,
                            "1: device collectives between hosts send GPU memory over ibverbs "
                            "directly (GPUDirect RDMA, dmabuf) where it works; 0: always stage "
                            "through pinned host memory"},
    [BRG__DEVICE_BLOCKS] = {"BRIGADE_DEVICE_BLOCKS", BRG__CFG_KIND_INT, "32", 1, 1024,
                            "most thread blocks (256 threads each) of one reduce or copy kernel "
                            "of a device collective, so that it leaves most SMs to the "
                            "computation beside it (NCCL uses 16 to 32); more can be faster "
                            "on an idle GPU"},
    [BRG__DEVICE_PROXY] = {"BRIGADE_DEVICE_PROXY", BRG__CFG_KIND_INT, "-1", -1, 1,
                           "1: the host side of a device collective runs on the communicator's "
                           "thread and the call returns at once, the caller's stream waiting on "
                           "a flag; 0: on the calling thread; -1: 1 when the ring has a link "
                           "between hosts"},
    [BRG__DEVICE_MODE] = {"BRIGADE_DEVICE_MODE", BRG__CFG_KIND_STRING, "auto", 0, 0,
                          "kernel: a device collective is one kernel that waits on its "
                          "neighbours' flags; step: a kernel per slice and step, ordered by "
                          "events; auto: kernel where every link stays inside the host and no "
                          "two processes share a GPU without MPS"},
    [BRG__DEVICE_CHANNELS] = {"BRIGADE_DEVICE_CHANNELS", BRG__CFG_KIND_INT, "0", 0, 32,
                              "kernel mode: thread blocks of a collective's kernel, each with "
                              "its share of the data and its own FIFOs; 0: the model's choice for "
                              "the links (brigade-info --device-shape), at most "
                              "BRIGADE_DEVICE_BLOCKS; its slots are BRIGADE_SLICE_BYTES when "
                              "set, else the model's"},
    [BRG__DEVICE_SMALL_BYTES] = {"BRIGADE_DEVICE_SMALL_BYTES", BRG__CFG_KIND_SIZE, "64K", 0,
                                 4 * BRG__MiB,
                                 "kernel mode, ranks of one host: an allreduce up to this many "
                                 "bytes goes in one hop (each rank writes its input to every "
                                 "rank, which sums the N inputs in rank order; on many blocks "
                                 "above BRIGADE_DEVICE_LL_BYTES) instead of around the ring; 0: "
                                 "no one-hop path (nor the two-shot one)"},
    [BRG__DEVICE_LL_BYTES] = {"BRIGADE_DEVICE_LL_BYTES", BRG__CFG_KIND_STRING, "auto", 0, 0,
                              "kernel mode: a one-shot allreduce up to this many bytes sends "
                              "its data in LL lines (each 4 data bytes beside a flag, stored "
                              "whole: no fence, no flag of its own); auto: where the cost "
                              "model finds it faster (64K up to 9 ranks, 32K up to 16), at most "
                              "BRIGADE_DEVICE_SMALL_BYTES; 0: never"},
    [BRG__DEVICE_DIRECT] = {"BRIGADE_DEVICE_DIRECT_BYTES", BRG__CFG_KIND_SIZE, "16M", 0,
                            256 * BRG__MiB,
                            "kernel mode, ranks of one host: an allreduce above "
                            "BRIGADE_DEVICE_SMALL_BYTES and up to this many bytes takes "
                            "the two-shot path on many blocks (each rank reduces its "
                            "block of every rank's input and writes the result to every "
                            "rank, through the peers' memory) instead of the ring; it "
                            "takes about 4 times this in GPU memory a rank; 0: the ring"},
    [BRG__DEVICE_RING_LL] = {"BRIGADE_DEVICE_RING_LL_BYTES", BRG__CFG_KIND_STRING, "0", 0, 0,
                             "kernel mode, links within a host: a collective up to this many "
                             "bytes that takes the ring (not a one-hop path) sends its slots "
                             "as LL lines (8 data bytes and their flags in 16, stored whole: "
                             "no tail, no system fence per slot), in LL slots of their own "
                             "(BRIGADE_STEPS x 32 KiB of GPU memory a channel); auto: where the "
                             "cost model finds it faster (512K a rank on NVLink 4); 0: never"},
};

static brg__cfg_entry trace_entries[BRG__TRACE_COUNT] = {
    [BRG__TRACE_FILE] = {"BRIGADE_TRACE_FILE", BRG__CFG_KIND_STRING, "", 0, 0,
                         "write a Chrome trace (Perfetto) of every collective, step and slice to "
                         "this file at destroy and on error; %r rank, %h host, %p pid; empty: "
                         "off (brigade-trace merges and draws the files)"},
    [BRG__TRACE_EVENTS] = {"BRIGADE_TRACE_EVENTS", BRG__CFG_KIND_INT, "65536", 64, 1 << 24,
                           "events a traced rank keeps (80 bytes each, allocated at init); "
                           "when full the newest replace the oldest"},
};

brg__cfg_section brg__core_config = BRG__CFG_SECTION("core", core_entries);
brg__cfg_section brg__device_config = BRG__CFG_SECTION("device", device_entries);
brg__cfg_section brg__trace_config = BRG__CFG_SECTION("trace", trace_entries);

int brg__settings_sections(brg__cfg_section **out, int max) {
  brg__cfg_section *own[] = {&brg__log_config, &brg__core_config, &brg__device_config,
                             &brg__trace_config};
  int n = 0;
  for (size_t i = 0; i < sizeof own / sizeof own[0]; i++)
    if (n < max) out[n++] = own[i];
  for (int i = 0; brg__transports[i]; i++)
    if (brg__transports[i]->config && n < max) out[n++] = brg__transports[i]->config;
  return n;
}

/* A value shortened for a message. */
#define SHOWN(v) (int)(strlen(v) > 64 ? 64 : strlen(v)), (v), strlen(v) > 64 ? "..." : ""

static int one_of(const char *v, const char *const *names) {
  for (int i = 0; names[i]; i++)
    if (!strcmp(v, names[i])) return 1;
  return 0;
}

/* Letters, digits and `extra`, at least one, at most `max`. */
static int word_ok(const char *v, const char *extra, size_t max) {
  size_t n = strlen(v);
  if (n == 0 || n > max) return 0;
  for (const char *c = v; *c; c++)
    if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
          strchr(extra, *c)))
      return 0;
  return 1;
}

/* BRIGADE_IB_HCA: DEVICE or DEVICE:PORT (port 1..255). */
static int hca_ok(const char *v) {
  if (!*v) return 1;
  const char *colon = strchr(v, ':');
  char dev[64];
  size_t len = colon ? (size_t)(colon - v) : strlen(v);
  if (len == 0 || len >= sizeof dev) return 0;
  memcpy(dev, v, len);
  dev[len] = 0;
  if (!word_ok(dev, "_-.", sizeof dev - 1)) return 0;
  if (!colon) return 1;
  char *end;
  long p = strtol(colon + 1, &end, 10);
  return end != colon + 1 && !*end && colon[1] >= '0' && colon[1] <= '9' && p >= 1 && p <= 255;
}

int brg__addr_unusable(const struct sockaddr *sa) {
  if (sa->sa_family == AF_INET) {
    uint32_t a = ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr);
    return a == 0 || a == 0xffffffffu || (a >> 28) == 0xe; /* any, broadcast, multicast */
  }
  if (sa->sa_family == AF_INET6) {
    const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
    return IN6_IS_ADDR_UNSPECIFIED(a) || IN6_IS_ADDR_MULTICAST(a);
  }
  return 1;
}

/* BRIGADE_BOOTSTRAP_ADDR: a numeric address is checked here (a name is
 * resolved where it is used, and checked the same way there); an address
 * that reaches no one (0.0.0.0, ::, broadcast, multicast) would send every
 * peer dialling itself. */
static brg_status bootstrap_addr_check(const char *v, brg__errbuf *err) {
  if (!*v) return BRG_SUCCESS;
  if (!word_ok(v, ".-:%_", 255))
    return brg__error_quiet(err, BRG_ERR_INVALID_ARGUMENT,
                            "BRIGADE_BOOTSTRAP_ADDR=\"%.*s%s\" is neither a numeric address nor "
                            "a host name",
                            SHOWN(v));
  struct addrinfo hints, *res = NULL;
  memset(&hints, 0, sizeof hints);
  hints.ai_flags = AI_NUMERICHOST;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(v, NULL, &hints, &res) != 0 || !res) return BRG_SUCCESS; /* a name */
  int bad = brg__addr_unusable(res->ai_addr);
  freeaddrinfo(res);
  if (bad)
    return brg__error_quiet(err, BRG_ERR_INVALID_ARGUMENT,
                            "BRIGADE_BOOTSTRAP_ADDR=\"%.*s%s\" is an address no other rank can "
                            "reach this one at (unspecified, broadcast or multicast); give this "
                            "host's own address",
                            SHOWN(v));
  return BRG_SUCCESS;
}

/* The string settings with a fixed form, checked whether or not this job
 * uses them: a typo is an error at once, naming the variable, rather than
 * a silent fallback or a surprise on the first job that does use it. */
static brg_status settings_check_strings(brg__errbuf *err) {
  static const char *const backends[] = {"auto", "verbs", "soft", NULL};
  static const char *const modes[] = {"auto", "kernel", "step", NULL};
  const char *v = brg__config_str(&brg__ib_config, BRG__IB_CFG_BACKEND);
  if (!one_of(v, backends))
    return brg__error_quiet(err, BRG_ERR_INVALID_ARGUMENT,
                            "BRIGADE_IB_BACKEND=\"%.*s%s\" is not auto, verbs or soft", SHOWN(v));
  v = brg__config_str(&brg__ib_config, BRG__IB_CFG_HCA);
  if (!hca_ok(v))
    return brg__error_quiet(err, BRG_ERR_INVALID_ARGUMENT,
                            "BRIGADE_IB_HCA=\"%.*s%s\" is not DEVICE or DEVICE:PORT (a device "
                            "name such as mlx5_0, a port 1 to 255)",
                            SHOWN(v));
  v = brg__device_str(BRG__DEVICE_MODE);
  if (!one_of(v, modes))
    return brg__error_quiet(err, BRG_ERR_INVALID_ARGUMENT,
                            "BRIGADE_DEVICE_MODE=\"%.*s%s\" is not auto, kernel or step", SHOWN(v));
  v = brg__device_str(BRG__DEVICE_CUDA_MODULE);
  if (*v) {
    struct stat st;
    if (strchr(v, '/') ? stat(v, &st) != 0 || !S_ISREG(st.st_mode)
                       : !word_ok(v, "_-.+", 255) || !strstr(v, ".so"))
      return brg__error_quiet(
          err, BRG_ERR_INVALID_ARGUMENT, "BRIGADE_CUDA_MODULE=\"%.*s%s\" is %s", SHOWN(v),
          strchr(v, '/') ? "not a file" : "neither a path nor a library name (lib...so)");
  }
  v = brg__core_str(BRG__CORE_SECRET);
  if (*v) {
    uint8_t secret[BRG__SECRET_BYTES];
    char why[160];
    if (brg__secret_parse(v, secret, why, sizeof why) != 0)
      return brg__error_quiet(err, BRG_ERR_INVALID_ARGUMENT, "BRIGADE_SECRET %s", why);
  }
  return bootstrap_addr_check(brg__core_str(BRG__CORE_BOOTSTRAP_ADDR), err);
}

/* A setting that takes auto or a size of 0 to max (shown as max_words). */
static brg_status auto_or_size(const char *name, const char *v, int64_t max, const char *max_words,
                               brg__errbuf *err) {
  int64_t b = 0;
  if (!strcmp(v, "auto") || (brg__config_parse_size(v, &b) == BRG_SUCCESS && b >= 0 && b <= max))
    return BRG_SUCCESS;
  return brg__error_quiet(err, BRG_ERR_INVALID_ARGUMENT,
                          "%s=\"%.64s%s\" is neither auto nor a size of 0 to %s", name, v,
                          strlen(v) > 64 ? "..." : "", max_words);
}

brg_status brg__settings_load(brg__errbuf *err) {
  brg__cfg_section *all[BRG__SETTINGS_MAX_SECTIONS];
  int n = brg__settings_sections(all, BRG__SETTINGS_MAX_SECTIONS);
  for (int i = 0; i < n; i++) {
    brg_status s = brg__config_load(all[i], err);
    if (s != BRG_SUCCESS) return s;
  }
  const char *algo = brg__core_str(BRG__CORE_ALGO);
  if (brg__algo_parse(algo) < 0)
    return brg__error_quiet(
        err, BRG_ERR_INVALID_ARGUMENT,
        "BRIGADE_ALGO=\"%.64s%s\" is not an allreduce algorithm (ring, hier, tree, rhd or auto)",
        algo, strlen(algo) > 64 ? "..." : "");
  brg_status vs = auto_or_size("BRIGADE_DEVICE_LL_BYTES", brg__device_str(BRG__DEVICE_LL_BYTES),
                               4 * BRG__MiB, "4M", err);
  if (vs == BRG_SUCCESS)
    vs = auto_or_size("BRIGADE_DEVICE_RING_LL_BYTES", brg__device_str(BRG__DEVICE_RING_LL),
                      256 * BRG__MiB, "256M", err);
  if (vs == BRG_SUCCESS)
    vs = auto_or_size("BRIGADE_RHD_DOUBLING_BYTES", brg__core_str(BRG__CORE_RHD_DOUBLING), BRG__GiB,
                      "1G", err);
  if (vs == BRG_SUCCESS) vs = settings_check_strings(err);
  if (vs != BRG_SUCCESS) return vs;
  /* Each in range, the two together may still ask for more memory than a
   * host has: each ring link's FIFO is slice x steps, and a rank maps
   * several (its own and its neighbours', per ring). */
  int64_t slice = brg__core_int(BRG__CORE_SLICE_BYTES), steps = brg__core_int(BRG__CORE_STEPS);
  if (slice * steps > BRG__FIFO_MAX_BYTES)
    return brg__error_quiet(err, BRG_ERR_INVALID_ARGUMENT,
                            "BRIGADE_SLICE_BYTES=%s with BRIGADE_STEPS=%lld makes each ring "
                            "link's FIFO %lld MiB, over the %d MiB brigade allows (a rank maps "
                            "several such FIFOs); lower one of them",
                            brg__core_str(BRG__CORE_SLICE_BYTES), (long long)steps,
                            (long long)((slice * steps) >> 20), (int)(BRG__FIFO_MAX_BYTES >> 20));
  return brg__log_check(err);
}

const brg__cfg_entry *brg__settings_find(const char *name) {
  brg__cfg_section *all[BRG__SETTINGS_MAX_SECTIONS];
  int n = brg__settings_sections(all, BRG__SETTINGS_MAX_SECTIONS);
  for (int i = 0; i < n; i++) {
    brg__config_load(all[i], NULL);
    for (int j = 0; j < all[i]->count; j++)
      if (!strcmp(all[i]->entries[j].name, name)) return &all[i]->entries[j];
  }
  return NULL;
}

void brg__settings_print(FILE *f) {
  brg__cfg_section *all[BRG__SETTINGS_MAX_SECTIONS];
  int n = brg__settings_sections(all, BRG__SETTINGS_MAX_SECTIONS);
  for (int i = 0; i < n; i++) brg__config_print(all[i], f);
}

void brg__settings_print_markdown(FILE *f) {
  brg__cfg_section *all[BRG__SETTINGS_MAX_SECTIONS];
  int n = brg__settings_sections(all, BRG__SETTINGS_MAX_SECTIONS);
  fputs("| variable | default | meaning |\n|---|---|---|\n", f);
  for (int i = 0; i < n; i++) brg__config_print_markdown(all[i], f);
}

/* BRIGADE_ALGO's names (hier.c), in brg__algo order. */
static const char *const algo_names[] = {"auto", "ring", "hier", "tree", "rhd"};

int brg__algo_parse(const char *name) {
  for (int i = 0; i < (int)(sizeof algo_names / sizeof algo_names[0]); i++)
    if (!strcmp(name, algo_names[i])) return i;
  return -1;
}

const char *brg__algo_name(int algo) {
  return algo >= 0 && algo < (int)(sizeof algo_names / sizeof algo_names[0]) ? algo_names[algo]
                                                                             : "?";
}
