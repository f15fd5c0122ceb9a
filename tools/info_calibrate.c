/*
 * brigade-info --calibrate: measures the cost model's links on this
 * machine and writes a model file (runtime/plan/model.c's format) that
 * BRIGADE_MODEL_FILE loads and bench/model reads.
 *
 * It forks N ranks (--ranks, default 4) on this host for each probe, times
 * allreduces (the best of several batches, rank 0's clock), and fits each
 * link's alpha and beta with the model's own formulas: the model's time of
 * a plan is linear in one link's alpha and beta, so two sizes give both.
 *
 *   shm:  the ring over shm, 4 KiB and 256 KiB         -> shm_alpha, shm_beta
 *   tcp:  the ring over tcp, 4 KiB and 256 KiB         -> tcp_alpha, tcp_beta
 *   p2p:  the double binary tree over shm, 8 B, 256 KiB -> p2p_alpha, p2p_beta
 *         and over tcp                                 -> p2p_tcp_alpha, p2p_tcp_beta
 *   rhd:  recursive halving/doubling (never doubling
 *         alone), 256 KiB, shm                         -> xchg_beta
 *         and tcp                                      -> xchg_tcp_beta
 *   wake: the ring over shm, 4 KiB, on more ranks than
 *         cores (8 per core, at most 64)               -> wake_alpha
 *
 * Bytes are timed at 256 KiB, no larger: around the sizes where the
 * algorithms' times cross, whose buffers stay in the caches (a ring of
 * 1 MiB buffers pays for memory, which the small sizes never do).
 *
 * The fits take the machine's cores as the runtime does (a host's ranks
 * beyond its cores wait their turn, wake_alpha a queued rank), so that the
 * links' alphas hold only what a hop costs on a core of its own; the
 * alphas and wake_alpha are fitted in turn until they settle, since each
 * probe on more ranks than cores sees both.
 *
 * --times fits times given (us, in the order the probes print) instead of
 * measuring, and --cores sets the cores the fits assume: another
 * machine's figures fitted here, and the fit checked against times made
 * from known links (test_model_file.py).
 *
 * The network between hosts cannot be measured from one host: net_alpha
 * and net_beta are kept from BRIGADE_MODEL_FILE when it is set, else the
 * built-in ones (docs/multihost.md: calibrating once per machine type).
 */
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "brigade.h"
#include "info_model.h"
#include "internal.h"
#include "model.h"
#include "settings.h"

#define SLICE (128 * 1024) /* BRIGADE_SLICE_BYTES of every probe, and of the fits' shape */

typedef struct probe {
  const char *name, *transports, *algo;
  size_t bytes;
  int wake; /* on the wake probe's rank count, not --ranks */
} probe;

typedef struct result {
  double seconds; /* rank 0's best mean per call; 0: failed */
  char why[256];
} result;

static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof sa;
  int port = -1;
  if (fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
      getsockname(fd, (struct sockaddr *)&sa, &len) == 0)
    port = ntohs(sa.sin_port);
  if (fd >= 0) close(fd);
  return port;
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* One rank of a probe (a forked child). */
static int rank_main(const probe *p, int rank, int n, int port, int iters, int batches,
                     result *out) {
  char v[32];
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  snprintf(v, sizeof v, "%d", port);
  setenv("MASTER_PORT", v, 1);
  snprintf(v, sizeof v, "%d", rank);
  setenv("RANK", v, 1);
  snprintf(v, sizeof v, "%d", n);
  setenv("WORLD_SIZE", v, 1);
  unsetenv("BRIGADE_PORT");
  unsetenv("TORCHELASTIC_RUN_ID");
  unsetenv("BRIGADE_MODEL_FILE"); /* forced algorithms: the model plays no part */
  setenv("BRIGADE_TRANSPORTS", p->transports, 1);
  setenv("BRIGADE_ALGO", p->algo, 1);
  setenv("BRIGADE_SMALL_BYTES", "0", 1);
  setenv("BRIGADE_RHD_DOUBLING_BYTES", "0", 1); /* rhd's probe: halving, as fitted */
  snprintf(v, sizeof v, "%d", SLICE);
  setenv("BRIGADE_SLICE_BYTES", v, 1);
  brg_comm *c = NULL;
  brg_status s = brg_comm_init_env(&c);
  if (s != BRG_SUCCESS) {
    snprintf(out->why, sizeof out->why, "init: %s", brg_comm_last_error(NULL));
    return 1;
  }
  size_t count = p->bytes / sizeof(float);
  float *in = calloc(count ? count : 1, sizeof *in), *res = calloc(count ? count : 1, sizeof *res);
  double best = 0;
  for (int b = -1; s == BRG_SUCCESS && b < batches && in && res; b++) {
    double t0 = now_s();
    for (int i = 0; i < iters && s == BRG_SUCCESS; i++)
      s = brg_allreduce(in, res, count, BRG_FLOAT32, BRG_SUM, c, NULL);
    double t = (now_s() - t0) / iters;
    if (b >= 0 && (best == 0 || t < best)) best = t; /* batch -1 warms up */
  }
  if (s != BRG_SUCCESS)
    snprintf(out->why, sizeof out->why, "allreduce: %s", brg_comm_last_error(c));
  else if (rank == 0)
    out->seconds = best;
  free(in);
  free(res);
  brg_comm_destroy(c);
  return s == BRG_SUCCESS ? 0 : 1;
}

/* Runs a probe on n forked ranks; rank 0's time, or 0 and a message. */
static double run_probe(const probe *p, int n, int iters, int batches, char *why, size_t why_n) {
  result *r =
      mmap(NULL, (size_t)n * sizeof *r, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (r == MAP_FAILED) {
    snprintf(why, why_n, "mmap: %s", strerror(errno));
    return 0;
  }
  memset(r, 0, (size_t)n * sizeof *r);
  int port = free_port();
  pid_t pid[64];
  fflush(NULL);
  for (int i = 0; i < n; i++) {
    pid[i] = fork();
    if (pid[i] == 0) _exit(rank_main(p, i, n, port, iters, batches, &r[i]));
  }
  int bad = 0;
  double deadline = now_s() + 120;
  for (int left = n; left > 0;) {
    int st;
    pid_t w = waitpid(-1, &st, WNOHANG);
    if (w > 0) {
      left--;
      bad |= !WIFEXITED(st) || WEXITSTATUS(st) != 0;
    } else if (now_s() > deadline) {
      for (int i = 0; i < n; i++) kill(pid[i], SIGKILL);
      while (waitpid(-1, NULL, 0) > 0) {}
      snprintf(why, why_n, "no result within 120 s");
      munmap(r, (size_t)n * sizeof *r);
      return 0;
    } else {
      usleep(10000);
    }
  }
  double t = r[0].seconds;
  if (bad || t <= 0) {
    t = 0;
    snprintf(why, why_n, "a rank failed");
    for (int i = 0; i < n; i++)
      if (r[i].why[0]) {
        snprintf(why, why_n, "rank %d: %s", i, r[i].why);
        break;
      }
  }
  munmap(r, (size_t)n * sizeof *r);
  return t;
}

static int cores_here(void) {
  long c = sysconf(_SC_NPROCESSORS_ONLN);
  return c > 0 && c < 1 << 20 ? (int)c : 0;
}

static int fit_cores; /* the cores a host has in the fits: this machine's, or --cores */

/* The model's time of `plan` on one host of n ranks (on this machine's
 * cores) with field fa (and fb, -1: none) set to a and b. */
static double model_at(int plan, int n, int tcp, brg__model_links ln, int fa, double a, int fb,
                       double b, size_t bytes) {
  brg__model_shape sh = {.hosts = 1,
                         .local = n,
                         .nics = 1,
                         .rings = 1,
                         .small_bytes = 0,
                         .slice_bytes = SLICE,
                         .local_tcp = tcp,
                         .cores = fit_cores};
  *brg__model_field(&ln, fa) = a;
  if (fb >= 0) *brg__model_field(&ln, fb) = b;
  return brg__model_time(plan, &sh, &ln, bytes);
}

/* Fits fields fa (an alpha) and fb (a beta) of *ln to times t1 at s1 and
 * t2 at s2 of `plan`: T(S) = c(S) + x(S) a + y(S) b, each part the model's
 * (the model is linear in one link's alpha and beta on one host). fb < 0:
 * fits fa alone to (s1, t1). Returns 0, or -1 where the fit is not positive. */
static int fit(int plan, int n, int tcp, brg__model_links *ln, int fa, int fb, size_t s1, double t1,
               size_t s2, double t2) {
  double c1 = model_at(plan, n, tcp, *ln, fa, 0, fb, 0, s1);
  double x1 = model_at(plan, n, tcp, *ln, fa, 1, fb, 0, s1) - c1;
  if (fb < 0) {
    double a = (t1 - c1) / x1;
    if (!(a > 0)) return -1;
    *brg__model_field(ln, fa) = a;
    return 0;
  }
  double y1 = model_at(plan, n, tcp, *ln, fa, 0, fb, 1, s1) - c1;
  double c2 = model_at(plan, n, tcp, *ln, fa, 0, fb, 0, s2);
  double x2 = model_at(plan, n, tcp, *ln, fa, 1, fb, 0, s2) - c2;
  double y2 = model_at(plan, n, tcp, *ln, fa, 0, fb, 1, s2) - c2;
  double det = x1 * y2 - x2 * y1;
  if (det == 0) return -1;
  double a = ((t1 - c1) * y2 - (t2 - c2) * y1) / det;
  double b = (x1 * (t2 - c2) - x2 * (t1 - c1)) / det;
  if (!(b > 0)) return -1;
  /* a small alpha lost in the noise of the large size: the small size alone */
  if (!(a > 0)) a = (t1 - c1 - y1 * b) / x1;
  if (!(a > 0)) a = 1e-7;
  *brg__model_field(ln, fa) = a;
  *brg__model_field(ln, fb) = b;
  return 0;
}

static int field_of(const char *name) {
  for (int i = 0; i < BRG__MODEL_FIELDS; i++)
    if (!strcmp(brg__model_field_name(i), name)) return i;
  return -1;
}

int brg__info_calibrate(int argc, char **argv) {
  const char *out = NULL;
  int n = 4, iters = 20, batches = 5, cores = cores_here();
  const char *times = NULL; /* --times: the probes' times given, not measured */
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!v) goto usage;
    i++;
    if (!strcmp(a, "--out"))
      out = v;
    else if (!strcmp(a, "--ranks"))
      n = atoi(v);
    else if (!strcmp(a, "--iters"))
      iters = atoi(v);
    else if (!strcmp(a, "--batches"))
      batches = atoi(v);
    else if (!strcmp(a, "--times"))
      times = v;
    else if (!strcmp(a, "--cores"))
      cores = atoi(v);
    else
      goto usage;
  }
  if (!out || n < 2 || n > 64 || iters < 1 || batches < 1 || cores < 0) goto usage;
  /* the network's links: the model file in force, if any */
  brg__model_links ln = brg__model_default_links;
  const char *base = getenv("BRIGADE_MODEL_FILE");
  brg__errbuf err = {0};
  if (base && *base && brg__model_read(base, &ln, &err) != BRG_SUCCESS) {
    fprintf(stderr, "brigade-info --calibrate: %s\n", err.msg);
    return 2;
  }
  /* the wake probe: 8 ranks a core (fewer barely queue: a rank spins a
   * while before it sleeps), at most 64, and more than --ranks */
  fit_cores = cores;
  int nw = 8 * (cores > 0 ? cores : 1);
  if (nw > 64) nw = 64;
  if (nw <= n) nw = n < 64 ? n + 1 : 64;
  const probe probes[] = {
      {"shm ring", "shm", "ring", 4096, 0},
      {"shm ring", "shm", "ring", 256 << 10, 0},
      {"tcp ring", "tcp", "ring", 4096, 0},
      {"tcp ring", "tcp", "ring", 256 << 10, 0},
      {"p2p tree", "shm", "tree", 8, 0},
      {"p2p tree", "shm", "tree", 256 << 10, 0},
      {"rhd exchanges", "shm", "rhd", 256 << 10, 0},
      {"p2p tree tcp", "tcp", "tree", 8, 0},
      {"p2p tree tcp", "tcp", "tree", 256 << 10, 0},
      {"rhd exch. tcp", "tcp", "rhd", 256 << 10, 0},
      {"wake shm ring", "shm", "ring", 4096, 1},
  };
  enum { NP = sizeof probes / sizeof probes[0] };
  double t[NP];
  char notes[3072];
  size_t at = 0;
  at += (size_t)snprintf(notes + at, sizeof notes - at,
                         "# %s by brigade-info --calibrate, %d ranks on one host of %d cores (the "
                         "wake probe %d):\n",
                         times ? "given (--times) and fitted" : "measured", n, cores, nw);
  for (int i = 0; i < NP; i++) {
    char why[300] = "";
    int ranks = probes[i].wake ? nw : n;
    if (times) { /* the i-th of the list, in us */
      char *end;
      t[i] = strtod(times, &end) * 1e-6;
      if (end == times || (*end != ',' && *end != 0) || (*end == 0 && i + 1 < NP) ||
          (*end == ',' && i + 1 == NP)) {
        fprintf(stderr,
                "brigade-info --calibrate: --times takes %d times in us, comma "
                "separated, in the order the probes print\n",
                NP);
        return 2;
      }
      times = *end ? end + 1 : end;
      snprintf(why, sizeof why, "not positive");
    } else {
      t[i] = run_probe(&probes[i], ranks, iters, batches, why, sizeof why);
    }
    if (t[i] <= 0) {
      fprintf(stderr, "brigade-info --calibrate: %s at %zu bytes on %d ranks: %s\n", probes[i].name,
              probes[i].bytes, ranks, why);
      return 1;
    }
    printf("%-14s %8zu B %2d ranks %10.1f us\n", probes[i].name, probes[i].bytes, ranks,
           t[i] * 1e6);
    if (at < sizeof notes)
      at += (size_t)snprintf(notes + at, sizeof notes - at,
                             "#   %s (BRIGADE_ALGO=%s, BRIGADE_TRANSPORTS=%s) %zu B, %d ranks: "
                             "%.1f us\n",
                             probes[i].name, probes[i].algo, probes[i].transports, probes[i].bytes,
                             ranks, t[i] * 1e6);
  }
  /* Each probe on more ranks than cores sees a link's alpha and the turns
   * (wake_alpha) at once: fit the links with the turns as they stand,
   * then the turns with those links, and again until both settle. */
  int bad = 0;
  for (int round = 0; round < 100 && !bad; round++) {
    double w0 = ln.wake_alpha;
    bad |= fit(BRG__PLAN_RING, n, 0, &ln, field_of("shm_alpha"), field_of("shm_beta"), 4096, t[0],
               256 << 10, t[1]);
    bad |= fit(BRG__PLAN_RING, n, 1, &ln, field_of("tcp_alpha"), field_of("tcp_beta"), 4096, t[2],
               256 << 10, t[3]);
    bad |= fit(BRG__PLAN_TREE, n, 0, &ln, field_of("p2p_alpha"), field_of("p2p_beta"), 8, t[4],
               256 << 10, t[5]);
    bad |= fit(BRG__PLAN_RHD, n, 0, &ln, field_of("xchg_beta"), -1, 256 << 10, t[6], 0, 0);
    bad |= fit(BRG__PLAN_TREE, n, 1, &ln, field_of("p2p_tcp_alpha"), field_of("p2p_tcp_beta"), 8,
               t[7], 256 << 10, t[8]);
    bad |= fit(BRG__PLAN_RHD, n, 1, &ln, field_of("xchg_tcp_beta"), -1, 256 << 10, t[9], 0, 0);
    if (cores <= 0 || nw <= cores) break; /* no turns to see */
    /* a wake_alpha the probe cannot show (its ranks were no slower than
     * the links say) is no turn at all */
    if (fit(BRG__PLAN_RING, nw, 0, &ln, field_of("wake_alpha"), -1, 4096, t[10], 0, 0) != 0)
      ln.wake_alpha = 1e-9;
    if (fabs(ln.wake_alpha - w0) <= 1e-9 * w0) break;
  }
  if (bad) {
    fprintf(stderr, "brigade-info --calibrate: the times do not fit the model (a negative alpha "
                    "or beta): the machine is too busy to measure; run it again\n");
    return 1;
  }
  char host[64] = "?";
  gethostname(host, sizeof host - 1);
  time_t now = time(NULL);
  char when[64];
  strftime(when, sizeof when, "%Y-%m-%d %H:%M UTC", gmtime(&now));
  char head[4096];
  snprintf(head, sizeof head,
           "# brigade cost model links (BRIGADE_MODEL_FILE; runtime/plan/model.c): seconds, and "
           "seconds per byte\n# host %s, %d cores, %s\n%s# net_alpha, net_beta: %s "
           "(not measured: one host cannot measure its network)\n",
           host, cores, when, notes,
           base && *base ? "kept from BRIGADE_MODEL_FILE" : "the built-in ones");
  if (brg__model_write(out, &ln, head, &err) != BRG_SUCCESS) {
    fprintf(stderr, "brigade-info --calibrate: %s\n", err.msg);
    return 1;
  }
  for (int i = 0; i < BRG__MODEL_FIELDS; i++)
    printf("%s %.6g\n", brg__model_field_name(i), *brg__model_field(&ln, i));
  printf("wrote %s\n", out);
  return 0;
usage:
  fprintf(stderr, "usage: brigade-info --calibrate --out FILE [--ranks N (2..64, default 4)] "
                  "[--iters N] [--batches N] [--times T,T,... (us: fit these, measure nothing)] "
                  "[--cores C (the fits' cores a host; default this machine's)]\n");
  return 2;
}
