/*
 * The allreduce cost model. Every link is two numbers, alpha (s, one small
 * message hop to hop: software, wake-up and wire) and beta (s/byte once it
 * streams, reductions included). H hosts of M ranks, N = H*M, in ring
 * order host by host; K network devices per host; S bytes.
 *
 * Ring latency is a chain of hops round the ring: L consecutive links pay
 * A(L) = q*(H*a_net + (N-H)*a_shm) + k*a_net + (L mod N - k)*a_shm, with
 * q = L div N and k = min(H, ceil((L mod N)/M)) (the worst window starts
 * on a network link).
 *
 *   ring   A(2(N-1)) + 2(N-1)/N * S * b_max     (b_max: the slowest link kind)
 *   small  A(N-1) + (N-1) * S * b_max            (S <= BRIGADE_SMALL_BYTES)
 *   rings  A(2(N-1)) + 2(N-1)/N * S/R * max(b_shm, b_net*ceil(R/K))
 *   hier   2*((M-1)*a_shm + (M-1)/M*S*b_shm)     (within the hosts, twice)
 *          + 2(H-1)*a_net + 2(H-1)/H * S/M * b_net*ceil(M/K)
 *            (or its small form, (H-1) hops of S/M, when S/M is small);
 *          hosts of C to M' ranks: the same with M = C, plus a reduce
 *          and a broadcast of S in chains of ceil(M'/C) ranks,
 *          2*((ceil(M'/C)-1)*a_shm + S*b_shm)
 *   tree   D = floor(log2 N) + 1 levels; up and down 2(D-1) levels, of
 *          which those whose distance in positions reaches M cross hosts
 *          (all but the lowest log2(M) levels); every level is two
 *          point-to-point messages one after the other (a parent's two
 *          children; p2p_alpha each, plus a_net between hosts).
 *          Bytes: each half of S through one tree, pipelined in slices:
 *          2S through a rank (or a host's devices) plus the pipeline's fill,
 *          2(D-1) slices.
 *   rhd    P = 2^floor(log2 N): log2(P) halving rounds and as many
 *          doubling ones; the round of distance d exchanges S*d/P per rank
 *          (xchg_beta a byte: sent and received at once, then added),
 *          between hosts (all M ranks of a host at once through its
 *          devices) when d >= M; N > P adds a fold and an unfold of S.
 *
 * The hops within a host are shm's, or tcp's where the transports allowed
 * leave no shm (BRIGADE_TRANSPORTS=tcp): the shape says which, and the
 * ring's, the tree's and rhd's links there (p2p_ and xchg_ fields) take
 * that transport's alpha and beta.
 * Where a host's M ranks outnumber its C cores, every hop waits
 * wake_alpha * (M/C - 1) per thread it wakes, the tree's bytes take M/C
 * times as long and rhd's exchanges (M/C)^1.5 times (brg__model_time).
 *
 * Left out: the overlap of hier's phases over pieces (BRIGADE_HIER_PIECES): the model
 * adds them up.
 */
#include "model.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hash.h"
#include "internal.h"
#include "schedule_lat.h"
#include "settings.h"

/* Calibrated on the CI machine (2 cores). The network: from
 * all_reduce_perf at 4 hosts x 2 ranks over tcp with MH_SHAPE="delay 20us
 * rate 2gbit" (docs/multihost.md has the runs): its hop includes the
 * transport's hand-off and the receiver's wake-up. Within a host: fitted
 * (brigade-info --calibrate --times) to the median of ten runs of its
 * probes at --ranks 4 (4 ranks on the 2 cores; five of the wake probe, on
 * 16), rounded; p2p_alpha's fit came out below
 * a microsecond's noise (the 2 turns a message waits there took all of the
 * tree's 17 us) and is set to 1 us. bench/auto_check.py at 4 to 64 ranks
 * over shm and tcp checked the choices they make (docs/multihost.md). */
const brg__model_links brg__model_default_links = {
    .net_alpha = 60e-6,
    .net_beta = 1.0 / 250e6,
    .shm_alpha = 0.5e-6,
    .shm_beta = 1.0 / 6.5e9,
    .tcp_alpha = 12e-6,
    .tcp_beta = 1.0 / 2.1e9,
    .p2p_alpha = 1e-6,
    .p2p_beta = 1.0 / 11e9,
    .xchg_beta = 1.0 / 5.8e9,
    .wake_alpha = 1.4e-6,
    .p2p_tcp_alpha = 4e-6,
    .p2p_tcp_beta = 1.0 / 10.5e9,
    .xchg_tcp_beta = 1.0 / 3.6e9,
};

static const char *const field_names[] = {
    "net_alpha",     "net_beta",     "shm_alpha",    "shm_beta",  "tcp_alpha",
    "tcp_beta",      "p2p_alpha",    "p2p_beta",     "xchg_beta", "wake_alpha",
    "p2p_tcp_alpha", "p2p_tcp_beta", "xchg_tcp_beta"};

_Static_assert(sizeof(brg__model_links) == BRG__MODEL_FIELDS * sizeof(double) &&
                   sizeof field_names / sizeof *field_names == BRG__MODEL_FIELDS,
               "every field of brg__model_links has a name");

static const char *const plan_names[BRG__PLAN_COUNT] = {"ring", "rings", "small",
                                                        "hier", "tree",  "rhd"};

const char *brg__plan_name(int plan) {
  return plan >= 0 && plan < BRG__PLAN_COUNT ? plan_names[plan] : "?";
}

static double chain(long L, int H, int M, const brg__model_links *ln) {
  int N = H * M;
  if (N < 2 || L <= 0) return 0;
  if (H == 1) return (double)L * ln->shm_alpha;
  if (M == 1) return (double)L * ln->net_alpha;
  long q = L / N, r = L % N;
  long k = (r + M - 1) / M;
  if (k > H) k = H;
  return (double)q * (H * ln->net_alpha + (N - H) * ln->shm_alpha) + (double)k * ln->net_alpha +
         (double)(r - k) * ln->shm_alpha;
}

static double beta_max(int H, int M, const brg__model_links *ln, double net_share) {
  double b = 0;
  if (M > 1) b = ln->shm_beta;
  if (H > 1 && ln->net_beta * net_share > b) b = ln->net_beta * net_share;
  return b;
}

static int ceil_div(int a, int b) {
  return (a + b - 1) / b;
}

double brg__model_ring_layout(const int *layout, int hosts, const brg__model_links *ln,
                              size_t small_bytes, size_t bytes) {
  int N = 0, most = 0;
  for (int h = 0; h < hosts; h++) {
    N += layout[h] > 0 ? layout[h] : 0;
    if (layout[h] > most) most = layout[h];
  }
  if (N < 2) return 0;
  double *a = malloc((size_t)N * sizeof *a);
  if (!a) return -1;
  int at = 0;
  for (int h = 0; h < hosts; h++)
    for (int r = 0; r < layout[h]; r++)
      a[at++] = r == layout[h] - 1 && hosts > 1 ? ln->net_alpha : ln->shm_alpha;
  int small = bytes > 0 && bytes <= small_bytes;
  long steps = small ? N - 1 : 2L * (N - 1), q = steps / N, rem = steps % N;
  double all = 0, worst = 0;
  for (int i = 0; i < N; i++) all += a[i];
  for (int p = 0; p < N; p++) { /* the window of rem links from p */
    double w = 0;
    for (long k = 0; k < rem; k++) w += a[(p + k) % N];
    if (w > worst) worst = w;
  }
  free(a);
  double b = 0;
  if (most > 1) b = ln->shm_beta;
  if (hosts > 1 && ln->net_beta > b) b = ln->net_beta;
  double S = (double)bytes;
  return q * all + worst + (small ? (N - 1) * S * b : 2.0 * (N - 1) / N * S * b);
}

int brg__model_flat_plan(const brg__model_shape *sh, size_t bytes) {
  if (bytes > 0 && bytes <= sh->small_bytes) return BRG__PLAN_SMALL;
  if (sh->rings > 1 && bytes >= (size_t)sh->rings * sh->slice_bytes) return BRG__PLAN_RINGS;
  return BRG__PLAN_RING;
}

static double ring_time(const brg__model_shape *sh, const brg__model_links *ln, double S, int rings,
                        int small) {
  int H = sh->hosts, M = sh->local, N = H * M;
  if (small) return chain(N - 1, H, M, ln) + (N - 1) * S * beta_max(H, M, ln, 1);
  double share = rings > 1 ? (double)ceil_div(rings, sh->nics > 0 ? sh->nics : 1) : 1;
  return chain(2L * (N - 1), H, M, ln) +
         2.0 * (N - 1) / N * (S / rings) * beta_max(H, M, ln, share);
}

/* A point-to-point hop's alpha, within a host or between hosts. */
static double p2p_alpha(const brg__model_links *ln, int cross) {
  return ln->p2p_alpha + (cross ? ln->net_alpha : 0);
}

static int host_of(int pos, int M) {
  return pos / M;
}

/* The tree's and rhd's hops follow the schedules themselves
 * (schedule_lat.h) on positions host by host: a hop crosses hosts where
 * its two positions lie on different hosts, and a host's devices carry
 * every crossing hop of its ranks at once. */
static double tree_time(const brg__model_shape *sh, const brg__model_links *ln, double S) {
  int H = sh->hosts, M = sh->local, N = H * M;
  int D = brg__dbtree_depth(N);
  int *edges = calloc((size_t)H, sizeof *edges); /* crossing hops per host */
  int *stack = malloc((size_t)N * sizeof *stack);
  double *path = malloc((size_t)N * sizeof *path); /* alphas from the root down */
  double lat = 0;
  for (int t = 0; edges && stack && path && t < 2; t++) {
    int top = 0;
    stack[top++] = brg__dbtree_root(N, t);
    path[stack[0]] = 0;
    while (top > 0) {
      int q = stack[--top];
      brg__tree_node nd = brg__dbtree_node(N, t, q);
      if (path[q] > lat) lat = path[q];
      for (int i = 0; i < 2; i++) {
        int ch = nd.child[i];
        if (ch < 0) continue;
        int cross = host_of(q, M) != host_of(ch, M);
        /* a level: the parent's two children one after the other */
        path[ch] = path[q] + p2p_alpha(ln, cross) + ln->p2p_alpha;
        if (cross) {
          edges[host_of(q, M)]++;
          edges[host_of(ch, M)]++;
        }
        stack[top++] = ch;
      }
    }
  }
  free(stack);
  free(path);
  int most = 0;
  for (int h = 0; edges && h < H; h++)
    if (edges[h] > most) most = edges[h];
  free(edges);
  /* each crossing hop moves half the buffer each way */
  double nic = most * (S / 2) * ln->net_beta / (sh->nics > 0 ? sh->nics : 1);
  double rank = 2 * S * ln->p2p_beta;
  double slice = fmin(S / 2, (double)sh->slice_bytes);
  double b = fmax(ln->p2p_beta, H > 1 ? ln->net_beta : 0);
  return 2 * lat + fmax(nic, rank) + 2.0 * (D - 1) * slice * b;
}

/* One exchange of `part` bytes between every rank and its partner
 * (partner_of), the largest number of a host's ranks crossing at once. */
static double rhd_round(const brg__model_shape *sh, const brg__model_links *ln, double part,
                        int crossing, int any) {
  double b = part * ln->xchg_beta;
  if (any) b = fmax(b, part * crossing * ln->net_beta / (sh->nics > 0 ? sh->nics : 1));
  return p2p_alpha(ln, any) + b;
}

/* rhd's rounds: with `doubling` 0, recursive halving then doubling (each
 * round of the pair moves the partner's share of the window, S * d / P);
 * with 1, recursive doubling alone (each round moves all S once, and
 * every rank reduces it): half the rounds, more bytes. */
static double rhd_rounds(const brg__model_shape *sh, const brg__model_links *ln, double S,
                         int doubling) {
  int H = sh->hosts, M = sh->local, N = H * M;
  int P = brg__pow2_floor(N), E = N - P;
  double t = 0;
  if (E > 0) { /* the fold and the unfold: 2i sends to 2i+1 */
    int most = 0, run = 0, host = -1;
    for (int i = 0; i < E; i++) {
      if (host_of(2 * i, M) != host) {
        host = host_of(2 * i, M);
        run = 0;
      }
      if (host_of(2 * i, M) != host_of(2 * i + 1, M) && ++run > most) most = run;
    }
    t += 2 * rhd_round(sh, ln, S, most, most > 0);
  }
  for (int d = P / 2; d >= 1; d /= 2) {
    /* virtual ranks lie on the positions in order, so a host's are a run */
    int most = 0, run = 0, host = -1;
    for (int v = 0; v < P; v++) {
      int p = brg__rhd_pos(N, v), q = brg__rhd_pos(N, v ^ d);
      if (host_of(p, M) != host) {
        host = host_of(p, M);
        run = 0;
      }
      if (host_of(p, M) != host_of(q, M) && ++run > most) most = run;
    }
    t += doubling ? rhd_round(sh, ln, S, most, most > 0)
                  : 2 * rhd_round(sh, ln, S * d / P, most, most > 0);
  }
  return t;
}

/* rhd: halving then doubling; with sh->rhd_doubling as lat.c runs it,
 * recursive doubling alone up to the size brg__model_rhd_doubling_bytes
 * finds. */
static double rhd_time(const brg__model_shape *sh, const brg__model_links *ln, double S) {
  double halving = rhd_rounds(sh, ln, S, 0);
  return sh->rhd_doubling ? fmin(halving, rhd_rounds(sh, ln, S, 1)) : halving;
}

/* On uneven hosts (local_min C, local_max M) C rings cross hosts; a host
 * of more ranks first reduces each group of ranks of equal index modulo C
 * into its first (a chain of up to ceil(M/C) ranks carrying S) and
 * broadcasts the result back last. */
static double hier_time(const brg__model_shape *sh, const brg__model_links *ln, double S) {
  int H = sh->hosts, M = sh->local;
  double fold = 0;
  if (sh->local_min > 0 && sh->local_min < sh->local_max) {
    int F = ceil_div(sh->local_max, sh->local_min);
    M = sh->local_min;
    fold = 2 * ((F - 1) * ln->shm_alpha + S * ln->shm_beta);
  }
  double local = (M - 1) * ln->shm_alpha + (double)(M - 1) / M * S * ln->shm_beta;
  double shard = S / M, bn = ln->net_beta * ceil_div(M, sh->nics > 0 ? sh->nics : 1);
  double cross = shard > 0 && shard <= (double)sh->small_bytes
                     ? (H - 1) * ln->net_alpha + (H - 1) * shard * bn
                     : 2 * (H - 1) * ln->net_alpha + 2.0 * (H - 1) / H * shard * bn;
  return fold + 2 * local + cross;
}

/* The links the formulas use on shape sh. */
static brg__model_links links_on(const brg__model_shape *sh, const brg__model_links *links) {
  int M = sh->local;
  /* the formulas' hops within a host are the ring's link there */
  brg__model_links local = *links;
  if (sh->local_tcp) {
    local.shm_alpha = links->tcp_alpha;
    local.shm_beta = links->tcp_beta;
    local.p2p_alpha = links->p2p_tcp_alpha;
    local.p2p_beta = links->p2p_tcp_beta;
    local.xchg_beta = links->xchg_tcp_beta;
  }
  /* A host of M ranks on C < M cores (busy = M/C): each hop waits for
   * its receiver's turn, about busy - 1 ranks queued per core, once per
   * thread it wakes: a ring hop over shm wakes the rank, over tcp a proxy
   * thread at each end too; a point-to-point message, moved by the
   * collective's own thread, pays two turns over shm and three over tcp
   * (counts fitted to bench/auto_check.py's runs on a 2-core machine at 4
   * to 64 ranks). The ring's bytes, one copy a rank through shared
   * memory, were not seen to slow: its hops are most of its time there.
   * The tree's, every rank's slices moving at once, share the cores (busy
   * times as long). rhd's rounds are not pipelined: every rank exchanges
   * at once and waits for its partner's turn as well as its own, and its
   * bytes were seen to take about busy^1.5 times as long (the same runs). */
  if (sh->cores > 0 && M > sh->cores) {
    double busy = (double)M / sh->cores, q = busy - 1, w = links->wake_alpha;
    local.shm_alpha += (sh->local_tcp ? 3 : 1) * w * q;
    local.net_alpha += 3 * w * q;
    local.p2p_alpha += (sh->local_tcp ? 3 : 2) * w * q;
    local.p2p_beta *= busy;
    local.xchg_beta *= busy * sqrt(busy);
  }
  return local;
}

double brg__model_time(int plan, const brg__model_shape *sh, const brg__model_links *links,
                       size_t bytes) {
  int H = sh->hosts, M = sh->local, N = H * M;
  double S = (double)bytes;
  if (N < 2) return 0;
  brg__model_links local = links_on(sh, links);
  const brg__model_links *ln = &local;
  switch (plan) {
  case BRG__PLAN_RING: return ring_time(sh, ln, S, 1, 0);
  case BRG__PLAN_RINGS:
    if (sh->rings < 2 || bytes < (size_t)sh->rings * sh->slice_bytes) return -1;
    return ring_time(sh, ln, S, sh->rings, 0);
  case BRG__PLAN_SMALL:
    if (bytes == 0 || bytes > sh->small_bytes) return -1;
    return ring_time(sh, ln, S, 1, 1);
  case BRG__PLAN_HIER:
    if (H < 2 || (M < 2 && sh->local_max < 2) || sh->no_hier) return -1;
    return hier_time(sh, ln, S);
  case BRG__PLAN_TREE: return tree_time(sh, ln, S);
  case BRG__PLAN_RHD: return rhd_time(sh, ln, S);
  }
  return -1;
}

size_t brg__model_rhd_doubling_bytes(const brg__model_shape *sh, const brg__model_links *links) {
  if (sh->hosts * sh->local < 2) return 0;
  brg__model_links ln = links_on(sh, links);
  /* both grow linearly with the bytes (piecewise, where a host's links
   * saturate), doubling the faster: the last size where it still wins */
  size_t lo = 0, hi = (size_t)1 << 30;
  if (rhd_rounds(sh, &ln, (double)hi, 1) <= rhd_rounds(sh, &ln, (double)hi, 0)) return hi;
  while (hi - lo > 1) {
    size_t mid = lo + (hi - lo) / 2;
    if (rhd_rounds(sh, &ln, (double)mid, 1) <= rhd_rounds(sh, &ln, (double)mid, 0))
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

int brg__model_auto(const brg__model_shape *shape, const brg__model_links *ln, size_t bytes,
                    int *plan_out) {
  brg__model_shape halving = *shape, *sh = &halving;
  halving.rhd_doubling = 0; /* rhd compared by its halving (model.h) */
  static const struct {
    int algo, plan;
  } cand[] = {{BRG__ALGO_RING, -1},
              {BRG__ALGO_HIER, BRG__PLAN_HIER},
              {BRG__ALGO_TREE, BRG__PLAN_TREE},
              {BRG__ALGO_RHD, BRG__PLAN_RHD}};
  int best = BRG__ALGO_RING, best_plan = brg__model_flat_plan(sh, bytes);
  double best_t = brg__model_time(best_plan, sh, ln, bytes);
  for (size_t i = 1; i < sizeof cand / sizeof cand[0]; i++) {
    double t = brg__model_time(cand[i].plan, sh, ln, bytes);
    if (t >= 0 && t < best_t) {
      best_t = t;
      best = cand[i].algo;
      best_plan = cand[i].plan;
    }
  }
  if (plan_out) *plan_out = best_plan;
  return best;
}

/* ---- model files ---------------------------------------------------------- */

const char *brg__model_field_name(int i) {
  return i >= 0 && i < BRG__MODEL_FIELDS ? field_names[i] : NULL;
}

double *brg__model_field(brg__model_links *ln, int i) {
  return i >= 0 && i < BRG__MODEL_FIELDS ? (double *)ln + i : NULL;
}

brg_status brg__model_read(const char *path, brg__model_links *ln, brg__errbuf *err) {
  FILE *f = fopen(path, "r");
  if (!f)
    return brg__error_quiet(err, BRG_ERR_INVALID_ARGUMENT, "model file %s: cannot open: %s", path,
                            strerror(errno));
  char line[256];
  int no = 0;
  brg_status s = BRG_SUCCESS;
  while (s == BRG_SUCCESS && fgets(line, sizeof line, f)) {
    no++;
    char *hash = strchr(line, '#');
    if (hash) *hash = 0;
    char name[64], extra[2];
    double v;
    int n = sscanf(line, "%63s %lf %1s", name, &v, extra);
    if (n <= 0) continue; /* blank or a comment */
    int i = 0;
    while (i < BRG__MODEL_FIELDS && (n < 1 || strcmp(name, field_names[i]))) i++;
    if (n != 2 || i == BRG__MODEL_FIELDS || !(v > 0) || !(v < 1))
      s = brg__error_quiet(err, BRG_ERR_INVALID_ARGUMENT,
                           "model file %s, line %d: expected a link's name (net_alpha, "
                           "shm_beta, ...) and a number of seconds or seconds per byte "
                           "between 0 and 1, got \"%.60s\"",
                           path, no, strtok(line, "\n"));
    else
      *brg__model_field(ln, i) = v;
  }
  if (s == BRG_SUCCESS && ferror(f))
    s = brg__error_quiet(err, BRG_ERR_INVALID_ARGUMENT, "model file %s: read error", path);
  fclose(f);
  return s;
}

brg_status brg__model_write(const char *path, const brg__model_links *ln, const char *comment,
                            brg__errbuf *err) {
  FILE *f = fopen(path, "w");
  if (!f)
    return brg__error_quiet(err, BRG_ERR_INVALID_ARGUMENT, "model file %s: cannot create: %s", path,
                            strerror(errno));
  if (comment) fputs(comment, f);
  brg__model_links copy = *ln;
  for (int i = 0; i < BRG__MODEL_FIELDS; i++)
    fprintf(f, "%s %.6g\n", field_names[i], *brg__model_field(&copy, i));
  if (fclose(f) != 0)
    return brg__error_quiet(err, BRG_ERR_INVALID_ARGUMENT, "model file %s: write error: %s", path,
                            strerror(errno));
  return BRG_SUCCESS;
}

/* BRIGADE_MODEL_FILE's links, kept while the setting stays the same. */
static pthread_mutex_t links_lock = PTHREAD_MUTEX_INITIALIZER;
static brg__model_links links_now;
static int links_set;
static char links_path[4096];

brg_status brg__model_setup(uint64_t *fingerprint, brg__errbuf *err) {
  const char *path = brg__core_str(BRG__CORE_MODEL_FILE);
  brg_status s = BRG_SUCCESS;
  pthread_mutex_lock(&links_lock);
  if (!links_set || strcmp(path, links_path)) {
    brg__model_links ln = brg__model_default_links;
    brg__errbuf e = {0};
    if (path[0] && (s = brg__model_read(path, &ln, &e)) != BRG_SUCCESS)
      brg__error_quiet(err, s, "BRIGADE_MODEL_FILE: %s", e.msg);
    if (s == BRG_SUCCESS) {
      links_now = ln;
      links_set = 1;
      snprintf(links_path, sizeof links_path, "%s", path);
    }
  }
  brg__model_links copy = links_now;
  pthread_mutex_unlock(&links_lock);
  if (s != BRG_SUCCESS) return s;
  /* the numbers as text: equal files give equal fingerprints everywhere */
  uint64_t h = BRG__FNV64_INIT;
  for (int i = 0; i < BRG__MODEL_FIELDS; i++) {
    char v[32];
    int n = snprintf(v, sizeof v, "%.6g;", *brg__model_field(&copy, i));
    h = brg__fnv1a64(h, v, (size_t)n);
  }
  *fingerprint = h;
  return BRG_SUCCESS;
}

const brg__model_links *brg__model_links_now(void) {
  /* set before any communicator exists (brg__model_setup at init) and
   * only replaced when the setting changes between communicators */
  return links_set ? &links_now : &brg__model_default_links;
}

/* ---- kernel mode's shape ------------------------------------------------ */

/* Per link kind: its bandwidth per direction and the share data gets, one
 * channel's streaming rate (a 512-thread block copying or reducing over
 * the link) and what a slot's post costs it (fences and the flag's round
 * trip), the estimates bench/model's `gpu` command starts from (H200,
 * NVLink 4; PCIe 5 x16). */
static const struct {
  const char *name;
  double link_gbs, link_eff, chan_gbs, post_us;
} dlinks[BRG__DLINK_COUNT] = {
    [BRG__DLINK_NVLINK] = {"nvlink", 450.0, 0.85, 25.0, 2.5},
    [BRG__DLINK_PCIE] = {"pcie", 55.0, 0.8, 12.0, 3.5},
    [BRG__DLINK_HOST] = {"host", 25.0, 0.8, 12.0, 5.0},
};

#define DSHAPE_MAX_CHANNELS 32
#define DSHAPE_MIN_SLOT ((size_t)64 << 10)
#define DSHAPE_MAX_SLOT ((size_t)1 << 20)
#define DSHAPE_REGION ((size_t)128 << 20)
#define DSHAPE_MIN_SHARE ((size_t)8 << 10)

const char *brg__dlink_name(int link) {
  return link >= 0 && link < BRG__DLINK_COUNT ? dlinks[link].name : "?";
}

/* Channels that fill the link when each streams `slot`-byte slots. */
static int channels_for(int link, size_t slot) {
  double t = (double)slot / (dlinks[link].chan_gbs * 1e9) + dlinks[link].post_us * 1e-6;
  double rate = (double)slot / t;
  int ch = (int)ceil(dlinks[link].link_eff * dlinks[link].link_gbs * 1e9 / rate);
  return ch < 1 ? 1 : ch > DSHAPE_MAX_CHANNELS ? DSHAPE_MAX_CHANNELS : ch;
}

/* The region's shape for a link: channels and slot (the largest slot whose
 * channels' slots fit the region budget). */
static void shape_full(int link, int nslots, int *ch_out, size_t *slot_out) {
  size_t slot = DSHAPE_MAX_SLOT;
  int ch = channels_for(link, slot);
  while (slot > DSHAPE_MIN_SLOT && (size_t)ch * (size_t)nslots * slot > DSHAPE_REGION) {
    slot /= 2;
    ch = channels_for(link, slot);
  }
  *ch_out = ch;
  *slot_out = slot;
}

/* A given buffer in a region of `ch` channels of `slot`-byte slots: a ring
 * step carries bytes / nranks, cut over the channels, each at least one
 * pass of its block (8 KiB) while there are enough, in the smallest slot
 * that holds its share. */
static void shape_for(int nranks, size_t bytes, int *ch, size_t *slot) {
  if (!bytes) return;
  size_t step = bytes / (size_t)nranks, share;
  if (step / DSHAPE_MIN_SHARE < (size_t)*ch)
    *ch = step / DSHAPE_MIN_SHARE ? (int)(step / DSHAPE_MIN_SHARE) : 1;
  share = (step + (size_t)*ch - 1) / (size_t)*ch;
  while (*slot / 2 >= DSHAPE_MIN_SLOT && *slot / 2 >= share) *slot /= 2;
}

void brg__model_device_call(int nranks, size_t bytes, int *channels, size_t *slot_bytes) {
  if (nranks < 2 || !bytes) return;
  int ch = *channels;
  size_t slot = *slot_bytes;
  shape_for(nranks, bytes, &ch, &slot);
  *channels = ch < *channels ? ch : *channels;
  *slot_bytes = slot < *slot_bytes ? slot : *slot_bytes;
}

brg__device_shape brg__model_device_shape(int link, int nranks, int nslots, size_t bytes) {
  brg__device_shape sh = {1, 0, ""};
  if (link < 0 || link >= BRG__DLINK_COUNT) link = BRG__DLINK_HOST;
  if (nslots < 1) nslots = 1;
  if (link == BRG__DLINK_HOST || nranks < 2) {
    snprintf(sh.why, sizeof sh.why,
             nranks < 2 ? "one rank: nothing to carry"
                        : "a host link: one channel, in the host link's slots (the link, not "
                          "the channels, bounds the ring)");
    return sh;
  }
  int ch, full;
  size_t slot, full_slot;
  shape_full(link, nslots, &full, &full_slot);
  ch = full;
  slot = full_slot;
  shape_for(nranks, bytes, &ch, &slot);
  double rate = (double)full_slot /
                ((double)full_slot / (dlinks[link].chan_gbs * 1e9) + dlinks[link].post_us * 1e-6);
  snprintf(sh.why, sizeof sh.why,
           "%s: %.0f GB/s x %.2f takes %d channels of %.1f GB/s with %zu KiB slots (%d slots "
           "each within %zu MiB)%s",
           dlinks[link].name, dlinks[link].link_gbs, dlinks[link].link_eff, full, rate / 1e9,
           full_slot >> 10, nslots, DSHAPE_REGION >> 20,
           ch < full || slot < full_slot ? "; fewer or smaller for this buffer" : "");
  sh.channels = ch;
  sh.slot_bytes = slot;
  return sh;
}

/* ---- kernel mode's times ------------------------------------------------ */

/* The GPU's own figures, the same on every link kind (H200 SXM): HBM3e,
 * a launch, a flag's hop, a release, an LL line's hop. */
#define GPU_HBM_GBS 4800.0
#define GPU_LAUNCH_US 4.0
#define GPU_HOP_US 1.5
#define GPU_RELEASE_US 0.8
#define GPU_LL_HOP_US 0.8

brg__gpu_costs brg__model_gpu_costs(int link) {
  if (link < 0 || link >= BRG__DLINK_COUNT) link = BRG__DLINK_HOST;
  brg__gpu_costs c = {.link_gbs = dlinks[link].link_gbs,
                      .link_eff = dlinks[link].link_eff,
                      .hbm_gbs = GPU_HBM_GBS,
                      .chan_gbs = dlinks[link].chan_gbs,
                      .launch_us = GPU_LAUNCH_US,
                      .hop_us = GPU_HOP_US,
                      .post_us = dlinks[link].post_us,
                      .release_us = GPU_RELEASE_US,
                      .ll_hop_us = GPU_LL_HOP_US};
  return c;
}

static const char *const gpu_cost_names[BRG__GPU_COST_FIELDS] = {
    "link_gbs", "link_eff", "hbm_gbs",    "chan_gbs", "launch_us",
    "hop_us",   "post_us",  "release_us", "ll_hop_us"};

const char *brg__gpu_cost_name(int i) {
  return i >= 0 && i < BRG__GPU_COST_FIELDS ? gpu_cost_names[i] : NULL;
}

double *brg__gpu_cost_field(brg__gpu_costs *c, int i) {
  return i >= 0 && i < BRG__GPU_COST_FIELDS ? (double *)c + i : NULL;
}

/* Data's share of the link, in bytes a second. */
static double gpu_link(const brg__gpu_costs *c) {
  return c->link_eff * c->link_gbs * 1e9;
}

double brg__model_gpu_ring(const brg__gpu_costs *c, double S, int N, int chans, double slot,
                           double post_us, double hop_us, int ll) {
  if (N < 2) return c->launch_us * 1e-6;
  double per_chan = slot / (slot / (c->chan_gbs * 1e9) + post_us * 1e-6);
  double bw = chans * per_chan;
  if (bw > gpu_link(c)) bw = gpu_link(c);
  if (bw > c->hbm_gbs * 1e9 / 3) bw = c->hbm_gbs * 1e9 / 3;
  if (ll) bw /= 2; /* half of every 16-byte store is the flag */
  return c->launch_us * 1e-6 + 2.0 * (N - 1) * hop_us * 1e-6 + 2.0 * (N - 1) / N * S / bw;
}

double brg__model_gpu_ring_call(const brg__gpu_costs *c, double S, int N, int chans, size_t slot) {
  double share = N > 0 && chans > 0 ? ceil(S / ((double)N * chans)) : S;
  double piece = share < (double)slot ? share : (double)slot;
  return brg__model_gpu_ring(c, S, N, chans, piece < 1 ? 1 : piece, c->post_us, c->hop_us, 0);
}

/* Every rank writes its input to all N in LL lines (N-1 remote writes
 * share the link, each twice the data), one hop, and sums N inputs. */
double brg__model_gpu_oneshot_ll(const brg__gpu_costs *c, double S, int N) {
  return (c->launch_us + c->ll_hop_us) * 1e-6 + 2.0 * (N - 1) * S / gpu_link(c);
}

/* The input once to every rank, then a release and a flag, whose round
 * trip the readers wait for. */
double brg__model_gpu_oneshot_plain(const brg__gpu_costs *c, double S, int N) {
  return (c->launch_us + c->hop_us + c->release_us) * 1e-6 + (N - 1) * S / gpu_link(c);
}

/* Bytes a second that `blocks` blocks move over the link. */
static double gpu_blocks_bw(const brg__gpu_costs *c, int blocks) {
  double bw = blocks * c->chan_gbs * 1e9;
  return bw < gpu_link(c) ? bw : gpu_link(c);
}

/* Each block writes its part to all N ranks, one release a flag, one hop,
 * then folds the N inputs of its part. */
double brg__model_gpu_oneshot_many(const brg__gpu_costs *c, double S, int N, int blocks) {
  return (c->launch_us + c->hop_us + c->release_us) * 1e-6 +
         (N - 1) * S / gpu_blocks_bw(c, blocks) + (N + 1) * S / (c->hbm_gbs * 1e9);
}

/* Reduce-scatter (each rank's block p to rank p), a hop, the fold of a
 * block, all-gather (the result to every rank), a hop: 2 (N-1)/N S over
 * the link, two releases and hops. */
double brg__model_gpu_twoshot(const brg__gpu_costs *c, double S, int N, int blocks) {
  return (c->launch_us + 2 * (c->hop_us + c->release_us)) * 1e-6 +
         2.0 * (N - 1) / N * S / gpu_blocks_bw(c, blocks) + (N + 1) * S / N / (c->hbm_gbs * 1e9);
}

#define DIRECT_SHARE ((size_t)8 << 10)
int brg__model_direct_blocks(size_t bytes, int most) {
  size_t b = bytes / DIRECT_SHARE;
  return b < 1 || most < 1 ? 1 : b > (size_t)most ? most : (int)b;
}

/* What LL saves a post (a fence and a flag's round trip, in whole
 * nanoseconds) times the bytes NVLink carries in a nanosecond (whole GB/s
 * of data), as the closed forms are stated. */
static size_t ll_saved_bytes(void) {
  const brg__gpu_costs c = brg__model_gpu_costs(BRG__DLINK_NVLINK);
  size_t saved_ns = (size_t)llround((c.hop_us + c.release_us - c.ll_hop_us) * 1e3);
  return saved_ns * (size_t)(c.link_eff * c.link_gbs);
}

/* The largest power of two from 256 up to `pays`, 0 when none. */
static size_t pow2_within(size_t pays) {
  size_t b = 256;
  while (b * 2 <= pays) b *= 2;
  return b <= pays ? b : 0;
}

size_t brg__model_ll_bytes(int N) {
  return N < 2 ? 0 : pow2_within(ll_saved_bytes() / (size_t)(N - 1));
}

size_t brg__model_ring_ll_bytes(int N) {
  return N < 2 ? 0 : pow2_within(ll_saved_bytes() * (size_t)N);
}

/* A size setting that also takes auto: the model's value for auto, the
 * size given, or 0 for a value settings.c refused at load. */
static size_t size_or_auto(brg__device_cfg_id id, size_t model) {
  const char *v = brg__device_str(id);
  int64_t b = 0;
  if (!strcmp(v, "auto")) return model;
  return brg__config_parse_size(v, &b) == BRG_SUCCESS && b > 0 ? (size_t)b : 0;
}

size_t brg__model_ring_ll_limit(int N) {
  return size_or_auto(BRG__DEVICE_RING_LL, brg__model_ring_ll_bytes(N));
}

size_t brg__model_ll_limit(int N, size_t oneshot_bytes) {
  size_t b = size_or_auto(BRG__DEVICE_LL_BYTES, brg__model_ll_bytes(N));
  return b < oneshot_bytes ? b : oneshot_bytes;
}

size_t brg__model_ll_crossover(const brg__gpu_costs *c, int N) {
  size_t S = 256;
  while (S < ((size_t)64 << 20) &&
         brg__model_gpu_oneshot_ll(c, 2.0 * S, N) < brg__model_gpu_oneshot_plain(c, 2.0 * S, N))
    S *= 2;
  return S;
}

/* ---- GPU buffers staged through host memory ------------------------------- */

/* One synchronous copy between a GPU buffer and host memory (the CUDA
 * module's mem_copy on pageable memory): about 10 us of driver call and
 * wait, then PCIe at about 20 GB/s (PCIe 4 x16 carries 25 at best;
 * pageable memory gets less). Estimates until a GPU measures them. */
#define STAGE_ALPHA 10e-6
#define STAGE_BETA (1.0 / 20e9)

double brg__model_stage_time(size_t bytes) {
  return 2 * (STAGE_ALPHA + (double)bytes * STAGE_BETA);
}

int brg__model_auto_staged(const brg__model_shape *shape, const brg__model_links *ln, size_t bytes,
                           double t[3]) {
  brg__model_shape halving = *shape, *sh = &halving;
  halving.rhd_doubling = 0; /* as brg__model_auto */
  t[0] = brg__model_time(brg__model_flat_plan(sh, bytes), sh, ln, bytes);
  t[1] = brg__model_time(BRG__PLAN_TREE, sh, ln, bytes);
  t[2] = brg__model_time(BRG__PLAN_RHD, sh, ln, bytes);
  for (int i = 1; i < 3; i++)
    if (t[i] >= 0) t[i] += brg__model_stage_time(bytes);
  static const int algo[3] = {BRG__ALGO_RING, BRG__ALGO_TREE, BRG__ALGO_RHD};
  int best = 0;
  for (int i = 1; i < 3 && sh->hosts > 1; i++)
    if (t[i] >= 0 && t[i] < t[best]) best = i;
  return algo[best];
}
