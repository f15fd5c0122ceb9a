/*
 * The report: the nccl-tests style header, column heads and footer rank 0
 * prints, the cells of time and #wrong, and the rows of --csv.
 */
#include "bench_internal.h"

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

void bench_format_time(char *buf, size_t len, double usec) {
  if (usec >= 10000.0)
    snprintf(buf, len, "%7.0f", usec);
  else if (usec >= 100.0)
    snprintf(buf, len, "%7.1f", usec);
  else
    snprintf(buf, len, "%7.2f", usec);
}

void bench_format_wrong(const bench *b, char *buf, size_t len, uint64_t wrong) {
  if (b->o.check)
    snprintf(buf, len, "%" PRIu64, wrong);
  else
    snprintf(buf, len, "N/A");
}

void bench_csv_row(bench *b, const char *library, const char *alg, int in_place, size_t bytes,
                   size_t count, brg_dtype dt, int op, const timing *t, double algbw,
                   double busbw) {
  if (b->csv == NULL || b->rank != 0) return;
  char wbuf[32];
  bench_format_wrong(b, wbuf, sizeof wbuf, t->wrong);
  fprintf(b->csv, "%s,%s,%s,%d,%s,%zu,%zu,%s,%s,%.3f,%.4f,%.4f,%s\n", b->coll->name, library, alg,
          b->nranks, in_place ? "in-place" : "out-of-place", bytes, count, bench_dtype_print[dt],
          op == PLAIN_DATA ? "none" : bench_op_print[op], t->usec, algbw, busbw, wbuf);
}

/* "#  Rank  0 Pid  1234 on host" for every rank, gathered to all. */
void bench_print_ranks(bench *b) {
  typedef struct {
    int32_t pid;
    char host[60];
  } rank_info;
  rank_info self = {.pid = (int32_t)getpid()};
  if (gethostname(self.host, sizeof self.host - 1) != 0) snprintf(self.host, sizeof self.host, "?");
  rank_info *all = calloc((size_t)b->nranks, sizeof *all);
  if (all == NULL) {
    fprintf(stderr, "%s: out of memory\n", bench_prog);
    exit(1);
  }
  brg_status st = brg_all_gather(&self, all, sizeof self, BRG_UINT8, b->comm, NULL);
  if (st != BRG_SUCCESS) bench_die_status(b, "brg_all_gather (rank list)", st);
  if (b->rank == 0) {
    printf("#\n# Using ranks\n");
    for (int r = 0; r < b->nranks; r++) {
      all[r].host[sizeof all[r].host - 1] = '\0';
      printf("#  Rank %2d Pid %6d on %10s\n", r, (int)all[r].pid, all[r].host);
    }
    printf("#\n");
  }
  free(all);
}

void bench_print_header(const bench *b) {
  const bench_opts *o = &b->o;
  printf("# %s_perf: brigade %d.%d.%d  nRanks %d minBytes %zu maxBytes %zu ", b->coll->name,
         BRG_VERSION_MAJOR, BRG_VERSION_MINOR, BRG_VERSION_PATCH, b->nranks, o->min_bytes,
         o->max_bytes);
  if (o->step_factor > 1)
    printf("step: %zu(factor)", o->step_factor);
  else
    printf("step: %zu(bytes)", o->step_bytes);
  printf(" warmup iters: %d iters: %d validation: %d blocking: %d\n", o->warmup, o->iters, o->check,
         o->blocking);
  const char *tr = getenv("BRIGADE_TRANSPORTS");
  printf("# transports: %s\n", tr && *tr ? tr : "default (BRIGADE_TRANSPORTS unset)");
  if (b->peer != NULL) {
    printf("# peer: %s; ratio = brigade busbw / peer busbw (> 1: brigade is faster)",
           b->peer->describe());
    if (b->peer->nalgs > 1) {
      printf("; peer algorithms:");
      for (int a = 0; a < b->peer->nalgs; a++) printf(" %s", b->peer->algs[a]);
      printf(" (the fastest is shown)");
    }
    printf("\n");
  }
}

/* One placement's column group: brigade's, then the peer's. */
static void print_group(const bench *b, int line) {
  static const char *const head[2][9] = {
      {"time", "algbw", "busbw", "#wrong", "%roof", "time", "busbw", "#wrong", "alg"},
      {"(us)", "(GB/s)", "(GB/s)", "", "", "(us)", "(GB/s)", "", ""},
  };
  const char *const *h = head[line];
  printf("  %7s  %6s  %6s %6s", h[0], h[1], h[2], h[3]);
  if (b->roof_busbw > 0) printf("  %5s", h[4]);
  if (b->peer == NULL) return;
  printf("  %7s  %6s %6s", h[5], h[6], h[7]);
  if (b->peer->nalgs > 1) printf("  %7s", h[8]);
  printf("  %6s", line == 0 ? "ratio" : "");
}

void bench_print_columns(const bench *b) {
  int group = 2 + 2 + 8 + 8 + 7 + (b->roof_busbw > 0 ? 7 : 0);
  if (b->peer != NULL) group += 9 + 8 + 7 + 8 + (b->peer->nalgs > 1 ? 9 : 0);
  char left[64], right[64];
  snprintf(left, sizeof left, "out-of-place%s%s", b->peer ? " / " : "",
           b->peer ? b->peer->name : "");
  snprintf(right, sizeof right, "in-place%s%s", b->peer ? " / " : "", b->peer ? b->peer->name : "");
  printf("#%51s%-*s%s\n", "", group, left, right);
  printf("#%11s  %12s  %8s  %6s  %6s", "size", "count", "type", "redop", "root");
  print_group(b, 0);
  print_group(b, 0);
  printf("\n#%11s  %12s  %8s  %6s  %6s", "(B)", "(elements)", "", "", "");
  print_group(b, 1);
  print_group(b, 1);
  printf("\n");
}

void bench_print_footer(const bench *b) {
  printf("# Out of bounds values : %" PRIu64 " %s\n", b->wrong_total,
         b->wrong_total ? "FAILED" : "OK");
  printf("# Avg bus bandwidth    : %g \n", b->bw_rows ? b->bw_sum / b->bw_rows : 0.0);
  if (b->roof_busbw > 0 && b->bw_rows > 0) {
    printf("# Roofline at %zu B: brigade reaches %.0f%% (out of place) and %.0f%% (in place) of "
           "%.2f GB/s",
           b->last_bytes, 100.0 * b->last_busbw[0] / b->roof_busbw,
           100.0 * b->last_busbw[1] / b->roof_busbw, b->roof_busbw);
    if (b->peer != NULL)
      for (int p = 0; p < 2; p++)
        if (b->last_peer[p] > 0)
          printf("; %s %.0f%% (%s)", b->peer->name, 100.0 * b->last_peer[p] / b->roof_busbw,
                 p ? "in place" : "out of place");
    printf("\n");
  }
  if (b->peer != NULL) {
    printf("# Peer %s out of bounds values : %" PRIu64 " %s\n", b->peer->name, b->peer_wrong_total,
           b->peer_wrong_total ? "FAILED" : "OK");
    for (int i = 0; i < b->npeer_skips; i++)
      printf("# Peer %s n/a: %s\n", b->peer->name, b->peer_skips[i]);
  }
  printf("#\n");
}
