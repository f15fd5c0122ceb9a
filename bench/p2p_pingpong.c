/*
 * p2p_pingpong: point-to-point bandwidth and latency between two ranks of
 * this host, over each way p2p can carry them, side by side in one run.
 *
 *   p2p_pingpong [--sizes 8,4K,64K,1M,16M] [--reps R] [--transports tcp:shm,tcp]
 *
 * For each entry of --transports (colon-separated BRIGADE_TRANSPORTS
 * values; the default compares "tcp", where point-to-point takes a tcp
 * link of the transport table over loopback, with "shm,tcp", where it
 * takes the shm link; "ibverbs" takes an ibverbs link, on one host with
 * BRIGADE_IB_BACKEND=soft and BRIGADE_IB_ALLOW_LOCAL=1 in the
 * environment) two ranks are forked and build a communicator
 * limited to those transports. For each size, rank 0 sends and rank 1
 * sends the message back, R times after a warm-up; the best and median
 * round trips give latency (half a round trip) and bandwidth (bytes moved
 * one way per second, 2 x size per round trip). Every message is checked
 * on its last run (first and last element). The rows of the entries are
 * printed beside each other, with the ratio of the last to the first.
 */
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "brigade.h"

#define PP_MAX_SIZES 16
#define PP_MAX_CONFIGS 4

typedef struct pp_shared {
  brg_unique_id id;
  char transports[64];
  int nsizes, reps;
  size_t sizes[PP_MAX_SIZES];
  double best_s[PP_MAX_SIZES], median_s[PP_MAX_SIZES];
  int failed;
  char error[512];
} pp_shared;

static double pp_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int pp_cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static int pp_fail(pp_shared *sh, const char *what, brg_status s) {
  sh->failed = 1;
  snprintf(sh->error, sizeof sh->error, "%s: %s: %s", what, brg_status_string(s),
           brg_comm_last_error(NULL));
  return 1;
}

/* A rank: waits for the release, then runs every size. */
static int pp_rank(pp_shared *sh, int gate, int rank) {
  char ch;
  while (read(gate, &ch, 1) < 0 && errno == EINTR) {}
  brg_comm_config cfg = BRG_COMM_CONFIG_INIT;
  cfg.transports = sh->transports;
  brg_comm *comm = NULL;
  brg_status s = brg_comm_init_config(&comm, 2, &sh->id, rank, &cfg);
  if (s != BRG_SUCCESS) return pp_fail(sh, "brg_comm_init_config", s);
  size_t most = 0;
  for (int k = 0; k < sh->nsizes; k++)
    if (sh->sizes[k] > most) most = sh->sizes[k];
  size_t n = most / 4 ? most / 4 : 1;
  uint32_t *buf = malloc(n * 4);
  double *t = malloc(sizeof(double) * (size_t)sh->reps);
  if (!buf || !t) return pp_fail(sh, "malloc", BRG_ERR_NO_MEMORY);
  int peer = 1 - rank;
  for (int k = 0; k < sh->nsizes; k++) {
    size_t count = sh->sizes[k] / 4 ? sh->sizes[k] / 4 : 1;
    for (int r = -2; r < sh->reps; r++) {
      uint32_t tag = (uint32_t)(k * 100003 + r + 7);
      double t0 = pp_now();
      if (rank == 0) {
        buf[0] = tag;
        buf[count - 1] = ~tag;
        if ((s = brg_send(buf, count, BRG_UINT32, peer, comm, NULL)) != BRG_SUCCESS)
          return pp_fail(sh, "brg_send", s);
        if ((s = brg_recv(buf, count, BRG_UINT32, peer, comm, NULL)) != BRG_SUCCESS)
          return pp_fail(sh, "brg_recv", s);
      } else {
        if ((s = brg_recv(buf, count, BRG_UINT32, peer, comm, NULL)) != BRG_SUCCESS)
          return pp_fail(sh, "brg_recv", s);
        if ((s = brg_send(buf, count, BRG_UINT32, peer, comm, NULL)) != BRG_SUCCESS)
          return pp_fail(sh, "brg_send", s);
      }
      if (buf[0] != tag || buf[count - 1] != ~tag) {
        sh->failed = 1;
        snprintf(sh->error, sizeof sh->error, "rank %d: message of %zu bytes came back wrong", rank,
                 count * 4);
        return 1;
      }
      if (r >= 0) t[r] = pp_now() - t0;
    }
    if (rank == 0) {
      qsort(t, (size_t)sh->reps, sizeof *t, pp_cmp);
      sh->best_s[k] = t[0];
      sh->median_s[k] = t[sh->reps / 2];
    }
  }
  free(buf);
  free(t);
  brg_comm_destroy(comm);
  return 0;
}

static int pp_run(pp_shared *sh) {
  int gate[2];
  if (pipe(gate) != 0) return perror("pipe"), 1;
  pid_t pids[2];
  for (int r = 0; r < 2; r++) {
    fflush(NULL);
    pids[r] = fork();
    if (pids[r] < 0) return perror("fork"), 1;
    if (pids[r] == 0) {
      close(gate[1]);
      _exit(pp_rank(sh, gate[0], r));
    }
  }
  close(gate[0]);
  brg_status s = brg_get_unique_id(&sh->id);
  if (s != BRG_SUCCESS) fprintf(stderr, "brg_get_unique_id: %s\n", brg_status_string(s));
  close(gate[1]);
  int bad = s != BRG_SUCCESS;
  for (int r = 0; r < 2; r++) {
    int ws = 0;
    while (waitpid(pids[r], &ws, 0) < 0 && errno == EINTR) {}
    bad |= !WIFEXITED(ws) || WEXITSTATUS(ws) != 0;
  }
  if (bad) fprintf(stderr, "p2p_pingpong: %s: %s\n", sh->transports, sh->error);
  return bad;
}

static size_t pp_size(const char *s) {
  char *end;
  double v = strtod(s, &end);
  if (*end == 'K' || *end == 'k') v *= 1024;
  if (*end == 'M' || *end == 'm') v *= 1024 * 1024;
  if (*end == 'G' || *end == 'g') v *= 1024.0 * 1024 * 1024;
  return (size_t)v;
}

static void pp_human(char *out, size_t n, size_t b) {
  if (b >= (1u << 20) && b % (1u << 20) == 0)
    snprintf(out, n, "%zuM", b >> 20);
  else if (b >= 1024 && b % 1024 == 0)
    snprintf(out, n, "%zuK", b >> 10);
  else
    snprintf(out, n, "%zu", b);
}

int main(int argc, char **argv) {
  const char *sizes = "8,4K,64K,1M,16M", *configs = "tcp:shm,tcp";
  int reps = 20;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--sizes") && i + 1 < argc)
      sizes = argv[++i];
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
      reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--transports") && i + 1 < argc)
      configs = argv[++i];
    else {
      fprintf(stderr, "usage: p2p_pingpong [--sizes 8,4K,64K,1M,16M] [--reps R] "
                      "[--transports tcp:shm,tcp]\n");
      return 2;
    }
  }
  if (reps < 1) reps = 1;
  pp_shared *sh = mmap(NULL, sizeof(pp_shared) * PP_MAX_CONFIGS, PROT_READ | PROT_WRITE,
                       MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (sh == MAP_FAILED) return perror("mmap"), 1;
  char cfgs[256];
  snprintf(cfgs, sizeof cfgs, "%s", configs);
  int ncfg = 0;
  for (char *save, *c = strtok_r(cfgs, ":", &save); c && ncfg < PP_MAX_CONFIGS;
       c = strtok_r(NULL, ":", &save)) {
    pp_shared *x = &sh[ncfg++];
    snprintf(x->transports, sizeof x->transports, "%s", c);
    x->reps = reps;
    char list[256];
    snprintf(list, sizeof list, "%s", sizes);
    for (char *save2, *z = strtok_r(list, ",", &save2); z && x->nsizes < PP_MAX_SIZES;
         z = strtok_r(NULL, ",", &save2))
      x->sizes[x->nsizes++] = pp_size(z);
  }
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  printf("# p2p_pingpong: 2 ranks on one host (%ld cores), brg_send/brg_recv ping-pong, %d "
         "round trips per size after 2 warm-ups\n",
         cores, reps);
  int bad = 0;
  for (int k = 0; k < ncfg; k++) bad |= pp_run(&sh[k]);
  printf("# GB/s: bytes one way per second (2 x size per round trip); lat: half a round trip\n");
  printf("%8s", "size");
  for (int k = 0; k < ncfg; k++)
    printf("  %-27s", sh[k].transports[0] ? sh[k].transports : "(all)");
  if (ncfg > 1) printf("  %s", "best ratio");
  printf("\n%8s", "");
  for (int k = 0; k < ncfg; k++) printf("  %8s %8s %9s", "best GB/s", "med GB/s", "best us");
  printf("\n");
  for (int i = 0; i < sh[0].nsizes; i++) {
    char hs[24];
    pp_human(hs, sizeof hs, sh[0].sizes[i]);
    printf("%8s", hs);
    for (int k = 0; k < ncfg; k++) {
      double b = sh[k].best_s[i], m = sh[k].median_s[i];
      double bytes = 2.0 * (double)sh[k].sizes[i];
      if (sh[k].failed || b <= 0)
        printf("  %8s %8s %9s", "-", "-", "-");
      else
        printf("  %9.3f %8.3f %9.1f", bytes / b / 1e9, bytes / m / 1e9, b / 2 * 1e6);
    }
    if (ncfg > 1 && sh[0].best_s[i] > 0 && sh[ncfg - 1].best_s[i] > 0)
      printf("  %9.2fx", sh[0].best_s[i] / sh[ncfg - 1].best_s[i]);
    printf("\n");
  }
  return bad;
}
