#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"

#define KiB (1LL << 10)
#define MiB (1LL << 20)
#define GiB (1LL << 30)

const brg__cfg_entry brg__cfg_table[BRG__CFG_COUNT] = {
    [BRG__CFG_DEBUG] = {"BRIGADE_DEBUG", BRG__CFG_KIND_STRING, "", 0, 0,
                        "log level: WARN, INFO or TRACE (empty: silent)"},
    [BRG__CFG_DEBUG_SUBSYS] = {"BRIGADE_DEBUG_SUBSYS", BRG__CFG_KIND_STRING, "", 0, 0,
                               "comma-separated subsystems to log (init,boot,ring,shm,tcp,"
                               "coll,ib); empty: all"},
    [BRG__CFG_DEBUG_FILE] = {"BRIGADE_DEBUG_FILE", BRG__CFG_KIND_STRING, "", 0, 0,
                             "log file instead of stderr; %r rank, %h host, %p pid"},
    [BRG__CFG_TIMEOUT_MS] = {"BRIGADE_TIMEOUT_MS", BRG__CFG_KIND_INT, "600000", 100, INT_MAX,
                             "how long a rank waits for a peer (bootstrap or collective) "
                             "before failing with a timeout"},
    [BRG__CFG_SLICE_BYTES] = {"BRIGADE_SLICE_BYTES", BRG__CFG_KIND_SIZE, "128K", 4 * KiB,
                              64 * MiB, "pipeline unit: bytes per FIFO slot"},
    [BRG__CFG_STEPS] = {"BRIGADE_STEPS", BRG__CFG_KIND_INT, "8", 1, 64,
                        "FIFO slots per connection"},
    [BRG__CFG_TRANSPORTS] = {"BRIGADE_TRANSPORTS", BRG__CFG_KIND_STRING, "", 0, 0,
                             "comma-separated transports allowed (shm,tcp,ibverbs); empty: all"},
    [BRG__CFG_BOOTSTRAP_ADDR] = {"BRIGADE_BOOTSTRAP_ADDR", BRG__CFG_KIND_STRING, "", 0, 0,
                                 "numeric address this rank advertises; empty: automatic"},
    [BRG__CFG_SOCKET_IFNAME] = {"BRIGADE_SOCKET_IFNAME", BRG__CFG_KIND_STRING, "", 0, 0,
                                "network interface to take the address from"},
    [BRG__CFG_SPIN] = {"BRIGADE_SPIN", BRG__CFG_KIND_INT, "2000", 0, 100000000,
                       "busy polls before a waiting rank yields the core"},
    [BRG__CFG_TCP_SOCKBUF] = {"BRIGADE_TCP_SOCKBUF", BRG__CFG_KIND_SIZE, "4M", 0, 1 * GiB,
                              "socket buffer size for tcp links (0: kernel default)"},
    [BRG__CFG_TCP_NSOCKS] = {"BRIGADE_TCP_NSOCKS", BRG__CFG_KIND_INT, "1", 1, 16,
                             "sockets per tcp link"},
    [BRG__CFG_SECRET] = {"BRIGADE_SECRET", BRG__CFG_KIND_STRING, "", 0, 0,
                         "job secret (hex) for brg_comm_init_env; brigade-run sets it"},
    [BRG__CFG_IB_BACKEND] = {"BRIGADE_IB_BACKEND", BRG__CFG_KIND_STRING, "auto", 0, 0,
                             "verbs backend: auto, verbs or soft (software, over sockets)"},
    [BRG__CFG_IB_HCA] = {"BRIGADE_IB_HCA", BRG__CFG_KIND_STRING, "", 0, 0,
                         "RDMA device and port, e.g. mlx5_0:1; empty: first active port"},
    [BRG__CFG_IB_GID_INDEX] = {"BRIGADE_IB_GID_INDEX", BRG__CFG_KIND_INT, "-1", -1, 255,
                               "GID index for RoCE; -1: automatic"},
    [BRG__CFG_IB_QPS_PER_LINK] = {"BRIGADE_IB_QPS_PER_LINK", BRG__CFG_KIND_INT, "1", 1, 16,
                                  "queue pairs per ring link"},
    [BRG__CFG_IB_TIMEOUT] = {"BRIGADE_IB_TIMEOUT", BRG__CFG_KIND_INT, "18", 1, 31,
                             "verbs QP local ack timeout exponent"},
    [BRG__CFG_IB_RETRY_CNT] = {"BRIGADE_IB_RETRY_CNT", BRG__CFG_KIND_INT, "7", 0, 7,
                               "verbs QP retry count"},
    [BRG__CFG_IB_ALLOW_LOCAL] = {"BRIGADE_IB_ALLOW_LOCAL", BRG__CFG_KIND_INT, "0", 0, 1,
                                 "1: ibverbs may also link ranks on one host (for tests; "
                                 "shm is faster there)"},
    [BRG__CFG_SMALL_BYTES] = {"BRIGADE_SMALL_BYTES", BRG__CFG_KIND_SIZE, "4K", 0, 64 * KiB,
                              "allreduce of at most this many bytes gathers every input around "
                              "the ring (N-1 steps instead of 2N-2) and reduces locally; 0: off"},
    [BRG__CFG_STREAM_BYTES] = {"BRIGADE_STREAM_BYTES", BRG__CFG_KIND_SIZE, "32M", 0,
                               1LL << 50,
                               "collectives of at least this many bytes write their output with "
                               "non-temporal stores (it would not stay in cache anyway); 0: never"},
    [BRG__CFG_DEVICE_SLICE_BYTES] = {"BRIGADE_DEVICE_SLICE_BYTES", BRG__CFG_KIND_SIZE, "4M",
                                     4 * KiB, 1 * GiB,
                                     "pipeline unit of device collectives: bytes per slot of the "
                                     "GPU FIFO (BRIGADE_STEPS slots per rank)"},
    [BRG__CFG_CUDA_MODULE] = {"BRIGADE_CUDA_MODULE", BRG__CFG_KIND_STRING, "", 0, 0,
                              "path of the CUDA module to open (libbrigade_cuda.so or a "
                              "stand-in with the same table); empty: beside the library"},
    [BRG__CFG_IB_GDR] = {"BRIGADE_IB_GDR", BRG__CFG_KIND_INT, "1", 0, 1,
                         "1: device collectives between hosts send GPU memory over ibverbs "
                         "directly (GPUDirect RDMA, dmabuf) where it works; 0: always stage "
                         "through pinned host memory"},
};

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static brg_status load_status = BRG_SUCCESS;
static brg__errbuf load_err;
static const char *values[BRG__CFG_COUNT];
static int64_t ints[BRG__CFG_COUNT];
static int is_set[BRG__CFG_COUNT];

brg_status brg__config_parse_int(const char *s, int64_t *out) {
  if (!s || !*s) return BRG_ERR_INVALID_ARGUMENT;
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno || end == s || *end) return BRG_ERR_INVALID_ARGUMENT;
  *out = v;
  return BRG_SUCCESS;
}

brg_status brg__config_parse_size(const char *s, int64_t *out) {
  if (!s || !*s || *s == '-' || *s == '+') return BRG_ERR_INVALID_ARGUMENT;
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || end == s) return BRG_ERR_INVALID_ARGUMENT;
  unsigned long long mult = 1;
  if (*end) {
    switch (*end) {
    case 'k': case 'K': mult = KiB; break;
    case 'm': case 'M': mult = MiB; break;
    case 'g': case 'G': mult = GiB; break;
    default: return BRG_ERR_INVALID_ARGUMENT;
    }
    end++;
    if (*end == 'i') end++;              /* KiB */
    if (*end == 'B' || *end == 'b') end++;
    if (*end) return BRG_ERR_INVALID_ARGUMENT;
  }
  if (v > (unsigned long long)INT64_MAX / mult) return BRG_ERR_INVALID_ARGUMENT;
  *out = (int64_t)(v * mult);
  return BRG_SUCCESS;
}

static brg_status parse_entry(int i, const char *v, int64_t *out, brg__errbuf *err) {
  const brg__cfg_entry *e = &brg__cfg_table[i];
  if (e->kind == BRG__CFG_KIND_STRING) return BRG_SUCCESS;
  brg_status s = e->kind == BRG__CFG_KIND_INT ? brg__config_parse_int(v, out)
                                              : brg__config_parse_size(v, out);
  /* No logging here: the logger itself reads this table. */
  if (s != BRG_SUCCESS) {
    if (err)
      snprintf(err->msg, sizeof err->msg, "%s=\"%s\" is not %s", e->name, v,
               e->kind == BRG__CFG_KIND_INT ? "an integer" : "a size (like 64K or 4M)");
    return BRG_ERR_INVALID_ARGUMENT;
  }
  if (*out < e->min || *out > e->max) {
    if (err)
      snprintf(err->msg, sizeof err->msg, "%s=%s is out of range [%lld, %lld]", e->name, v,
               (long long)e->min, (long long)e->max);
    return BRG_ERR_INVALID_ARGUMENT;
  }
  return BRG_SUCCESS;
}

static void load(void) {
  for (int i = 0; i < BRG__CFG_COUNT; i++) {
    const brg__cfg_entry *e = &brg__cfg_table[i];
    const char *v = getenv(e->name);
    is_set[i] = v != NULL && *v != 0;
    values[i] = is_set[i] ? v : e->defval;
    if (parse_entry(i, e->defval, &ints[i], NULL) != BRG_SUCCESS) ints[i] = 0;
    if (is_set[i] && load_status == BRG_SUCCESS) {
      int64_t x = 0;
      brg_status s = parse_entry(i, v, &x, &load_err);
      if (s != BRG_SUCCESS) {
        load_status = s;
        values[i] = e->defval;
      } else {
        ints[i] = x;
      }
    }
  }
}

brg_status brg__config_load(brg__errbuf *err) {
  pthread_once(&load_once, load);
  if (load_status != BRG_SUCCESS && err) *err = load_err;
  return load_status;
}

int64_t brg__config_int(brg__cfg_id id) {
  brg__config_load(NULL);
  return ints[id];
}

const char *brg__config_str(brg__cfg_id id) {
  brg__config_load(NULL);
  return values[id];
}

int brg__config_is_set(brg__cfg_id id) {
  brg__config_load(NULL);
  return is_set[id];
}

void brg__config_print(FILE *f) {
  brg__config_load(NULL);
  for (int i = 0; i < BRG__CFG_COUNT; i++) {
    const brg__cfg_entry *e = &brg__cfg_table[i];
    fprintf(f, "  %-24s = %-10s %s(default \"%s\")\n      %s\n", e->name, values[i],
            is_set[i] ? "[set] " : "", e->defval, e->help);
  }
}
