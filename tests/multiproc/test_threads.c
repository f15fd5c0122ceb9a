/* The threads a rank runs: a communicator of N = 4 ranks on 4 rings
 * (BRIGADE_RINGS, from the environment) must run its extra rings on the
 * communicator's own threads, so a rank has at most MP_MAX_THREADS threads
 * (its main one included) once an allreduce cut over every ring has run.
 * Every element of that allreduce is checked against the sum computed
 * here, and the count of threads is read from /proc/self/task. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static int threads_now(void) {
  DIR *d = opendir("/proc/self/task");
  if (!d) return -1;
  int n = 0;
  for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

static int body(mp_ctx *ctx) {
  int most = mp_env_int("MP_MAX_THREADS", 6);
  size_t count = (size_t)1 << 20; /* 4 MiB of float32: cut over every ring */
  float *buf = malloc(count * sizeof *buf);
  MP_CHECK(buf != NULL, "out of memory");
  if (!buf) return 1;
  for (int round = 0; round < 2; round++) {
    for (size_t j = 0; j < count; j++) buf[j] = (float)((ctx->rank * 5 + j * 3) % 17);
    brg_status st = brg_allreduce(buf, buf, count, BRG_FLOAT32, BRG_SUM, ctx->comm, NULL);
    MP_CHECK(st == BRG_SUCCESS, "allreduce: %s", brg_comm_last_error(ctx->comm));
    if (st != BRG_SUCCESS) break;
    size_t bad = 0, first = 0;
    for (size_t j = 0; j < count; j++) {
      float want = 0;
      for (int r = 0; r < ctx->nranks; r++) want += (float)((r * 5 + j * 3) % 17);
      if (buf[j] != want && !bad++) first = j;
    }
    MP_CHECK(bad == 0, "round %d: %zu elements wrong, the first at %zu", round, bad, first);
  }
  int n = threads_now();
  printf("rank %d: %d threads (at most %d)\n", ctx->rank, n, most);
  fflush(stdout);
  MP_CHECK(n > 0 && n <= most,
           "rank %d runs %d threads after an allreduce on its rings, at most %d "
           "allowed",
           ctx->rank, n, most);
  free(buf);
  return 0;
}

int main(int argc, char **argv) {
  mp_opts o = {.name = "threads",
               .nranks = argc > 1 ? atoi(argv[1]) : 4,
               .init = MP_INIT_ID,
               .victim = -1,
               .deadline_ms = mp_env_int("MP_DEADLINE_MS", 60000)};
  return mp_run(&o, body, NULL);
}
