/*
 * boot_init: how long brg_comm_init takes, and how many bytes the bootstrap
 * root moves, for N processes on this host.
 *
 *   boot_init [--ranks 2,4,...,256] [--reps R] [--check]
 *             [--root-nofile SOFT[:HARD]] [--expect-error TEXT]
 *
 * For each N the program forks N ranks first (before it touches the
 * library), then starts the bootstrap root in this process, hands the ranks
 * the unique id through shared memory and releases them all at once. Init
 * time is from the release until the last rank's brg_comm_init returned
 * (the slowest rank, which is what a job waits for); the per-rank median
 * is shown beside it. Root bytes are what the root read and wrote on its
 * sockets for that communicator. With more ranks than cores the ranks are
 * oversubscribed: the figures then include the scheduler's share, and say so.
 *
 * --check exits non-zero when an init fails, or when the root's bytes per
 * rank grow with N (more than 2x from the smallest N to the largest): the
 * cheap CI run uses it at small N.
 *
 * --root-nofile sets this process's RLIMIT_NOFILE (the root's; the ranks
 * keep theirs) after the ranks are forked. --expect-error turns the run
 * into a test of a failure: every rank must fail, each with TEXT in its
 * error, and the whole job within a quarter of BRIGADE_TIMEOUT_MS.
 */
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bootstrap.h"
#include "brigade.h"

#define BI_MAX_RANKS 1024
#define BI_MAX_SIZES 32

typedef struct bi_shared {
  brg_unique_id id;
  int64_t t_start_ns, t_done_ns[BI_MAX_RANKS];
  int32_t status[BI_MAX_RANKS];
  char error[BI_MAX_RANKS][512];
} bi_shared;

static long bi_soft = -1, bi_hard = -1; /* --root-nofile */

static int64_t bi_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int bi_cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? -1 : x > y;
}

/* A rank: waits for the release (its end of the pipe reads EOF), then
 * builds and destroys a communicator. */
static void bi_rank(bi_shared *sh, int gate, int rank, int nranks) {
  char c;
  while (read(gate, &c, 1) < 0 && errno == EINTR) {}
  brg_comm *comm = NULL;
  brg_status st = brg_comm_init(&comm, nranks, &sh->id, rank);
  sh->t_done_ns[rank] = bi_now_ns();
  sh->status[rank] = (int32_t)st;
  if (st != BRG_SUCCESS)
    snprintf(sh->error[rank], sizeof sh->error[rank], "%s", brg_comm_last_error(NULL));
  if (st == BRG_SUCCESS) brg_comm_destroy(comm);
  _exit(st == BRG_SUCCESS ? 0 : 1);
}

/* One init of N ranks; returns 0 when every rank succeeded. */
static int bi_run(bi_shared *sh, int nranks, double *init_ms, double *median_ms,
                  uint64_t *root_bytes) {
  memset(sh, 0, sizeof *sh);
  int gate[2];
  if (pipe(gate) != 0) return perror("pipe"), -1;
  pid_t *pids = calloc((size_t)nranks, sizeof *pids);
  if (!pids) return -1;
  for (int r = 0; r < nranks; r++) {
    pids[r] = fork();
    if (pids[r] < 0) {
      perror("fork");
      for (int k = 0; k < r; k++) kill(pids[k], SIGKILL);
      nranks = r;
      break;
    }
    if (pids[r] == 0) {
      close(gate[1]);
      bi_rank(sh, gate[0], r, nranks);
    }
  }
  close(gate[0]);
  if (bi_soft >= 0) {
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_cur = (rlim_t)bi_soft;
    if (bi_hard >= 0) rl.rlim_max = (rlim_t)bi_hard;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0) perror("boot_init: setrlimit");
  }
  uint64_t in0 = 0, out0 = 0, in1 = 0, out1 = 0;
  brg__boot_root_stats(&in0, &out0);
  brg_status st = brg_get_unique_id(&sh->id);
  if (st != BRG_SUCCESS)
    fprintf(stderr, "boot_init: brg_get_unique_id: %s\n", brg_status_string(st));
  sh->t_start_ns = bi_now_ns();
  /* the release: the ranks read the id and the start time after their
   * read of the gate returns, which the close orders after these stores */
  close(gate[1]);
  int failed = st != BRG_SUCCESS, shown_cause = 0;
  for (int r = 0; r < nranks; r++) {
    int ws = 0;
    while (waitpid(pids[r], &ws, 0) < 0 && errno == EINTR) {}
    if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0) {
      /* The first rank's error, and the first that is not the root's echo
       * of another rank's failure (the cause). */
      int echo = strstr(sh->error[r], "failed the job") != NULL;
      if (!failed || (!echo && !shown_cause)) {
        if (!WIFEXITED(ws))
          fprintf(stderr, "boot_init: N=%d: rank %d died of signal %d\n", nranks, r,
                  WIFSIGNALED(ws) ? WTERMSIG(ws) : 0);
        else
          fprintf(stderr, "boot_init: N=%d: rank %d failed (%s): %s\n", nranks, r,
                  brg_status_string((brg_status)sh->status[r]), sh->error[r]);
        shown_cause |= !echo;
      }
      failed = 1;
    }
  }
  free(pids);
  int64_t t_all_ns = bi_now_ns() - sh->t_start_ns;
  brg__boot_root_linger(5000);
  brg__boot_root_stats(&in1, &out1);
  int64_t *t = malloc((size_t)nranks * sizeof *t);
  if (!t) return -1;
  for (int r = 0; r < nranks; r++) t[r] = sh->t_done_ns[r] - sh->t_start_ns;
  qsort(t, (size_t)nranks, sizeof *t, bi_cmp_i64);
  *init_ms = failed ? (double)t_all_ns / 1e6 : (double)t[nranks - 1] / 1e6;
  *median_ms = (double)t[nranks / 2] / 1e6;
  *root_bytes = (in1 - in0) + (out1 - out0);
  free(t);
  return failed ? -1 : 0;
}

static int bi_parse_sizes(const char *s, int *sizes) {
  int n = 0;
  while (*s && n < BI_MAX_SIZES) {
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || v < 1 || v > BI_MAX_RANKS) return -1;
    sizes[n++] = (int)v;
    s = *end == ',' ? end + 1 : end;
    if (*end && *end != ',') return -1;
  }
  return n;
}

/* --expect-error: every rank failed with `text` in its error, in time. */
static int bi_expect(const bi_shared *sh, int n, const char *text, double ms) {
  long timeout_ms = 30000;
  const char *t = getenv("BRIGADE_TIMEOUT_MS");
  if (t && atol(t) > 0) timeout_ms = atol(t);
  for (int r = 0; r < n; r++)
    if (sh->status[r] == BRG_SUCCESS || !strstr(sh->error[r], text)) {
      fprintf(stderr, "boot_init: rank %d: expected a failure naming \"%s\", got %s: %s\n", r, text,
              brg_status_string((brg_status)sh->status[r]), sh->error[r]);
      return 1;
    }
  if (ms > timeout_ms / 4.0) {
    fprintf(stderr, "boot_init: the failure took %.0f ms (BRIGADE_TIMEOUT_MS %ld)\n", ms,
            timeout_ms);
    return 1;
  }
  printf("# every rank failed in %.0f ms naming \"%s\", e.g. rank %d: %s\n", ms, text, n - 1,
         sh->error[n - 1]);
  return 0;
}

int main(int argc, char **argv) {
  int sizes[BI_MAX_SIZES] = {2, 4, 8, 16, 32, 64, 128, 256};
  int nsizes = 8, reps = 1, check = 0;
  const char *expect = NULL;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--ranks") == 0 && i + 1 < argc) {
      nsizes = bi_parse_sizes(argv[++i], sizes);
      if (nsizes <= 0) {
        fprintf(stderr, "boot_init: --ranks wants a comma-separated list of 1..%d\n", BI_MAX_RANKS);
        return 2;
      }
    } else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
      reps = atoi(argv[++i]);
      if (reps < 1) reps = 1;
    } else if (strcmp(argv[i], "--check") == 0) {
      check = 1;
    } else if (strcmp(argv[i], "--root-nofile") == 0 && i + 1 < argc) {
      char *end;
      bi_soft = strtol(argv[++i], &end, 10);
      if (*end == ':') bi_hard = strtol(end + 1, &end, 10);
      if (*end || bi_soft < 1) {
        fprintf(stderr, "boot_init: --root-nofile SOFT[:HARD]\n");
        return 2;
      }
    } else if (strcmp(argv[i], "--expect-error") == 0 && i + 1 < argc) {
      expect = argv[++i];
    } else {
      fprintf(stderr, "usage: boot_init [--ranks 2,4,...] [--reps R] [--check]\n");
      return 2;
    }
  }
  bi_shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (sh == MAP_FAILED) return perror("mmap"), 1;
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  printf("# boot_init: brg_comm_init of N processes on one host with %ld cores%s\n", cores,
         "; N > cores is oversubscribed");
  printf("# %6s %12s %12s %12s %14s %s\n", "N", "init_ms", "median_ms", "root_bytes", "root_B/rank",
         "");
  int rc = 0;
  double first_per_rank = 0, last_per_rank = 0;
  for (int k = 0; k < nsizes; k++) {
    int n = sizes[k];
    double best = -1, best_med = 0;
    uint64_t bytes = 0;
    for (int r = 0; r < reps; r++) {
      double ms = 0, med = 0;
      uint64_t b = 0;
      int failed = bi_run(sh, n, &ms, &med, &b) != 0;
      if (expect) {
        rc |= failed ? bi_expect(sh, n, expect, ms) : 1;
        if (!failed) fprintf(stderr, "boot_init: N=%d succeeded; a failure was expected\n", n);
        continue;
      }
      if (failed) {
        rc = 1;
        continue;
      }
      if (best < 0 || ms < best) best = ms, best_med = med;
      bytes = b;
    }
    if (expect) continue;
    double per_rank = (double)bytes / n;
    if (k == 0) first_per_rank = per_rank;
    last_per_rank = per_rank;
    printf("  %6d %12.1f %12.1f %12llu %14.1f %s\n", n, best, best_med, (unsigned long long)bytes,
           per_rank, n > cores ? "(oversubscribed)" : "");
    fflush(stdout);
  }
  if (check && rc == 0 && nsizes > 1 && last_per_rank > 2 * first_per_rank) {
    fprintf(stderr,
            "boot_init: the root's bytes per rank grew from %.1f to %.1f: not O(N) in all\n",
            first_per_rank, last_per_rank);
    rc = 1;
  }
  munmap(sh, sizeof *sh);
  return rc;
}
