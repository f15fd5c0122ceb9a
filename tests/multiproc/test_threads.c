/* The threads a rank runs: a communicator of N = 4 ranks on 4 rings
 * (BRIGADE_RINGS, from the environment) must run its extra rings with the
 * communicator's liveness thread and one thread per extra ring, so a rank
 * has at most MP_MAX_THREADS threads (its main one included) once an
 * allreduce cut over every ring has run.
 * Every element of that allreduce is checked against the sum computed
 * here, and the count of threads is read from /proc/self/task, less those
 * the process had before brg_comm_init (a sanitizer's own). The sockets
 * opened since (/proc/self/fd) are at most MP_MAX_SOCKETS where that is
 * set: over shm, the communicator's two ring sockets and its
 * point-to-point listener, none for an extra ring. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

/* The names of the threads, for the message. */
static void thread_names(char *out, size_t cap) {
  DIR *d = opendir("/proc/self/task");
  size_t o = 0;
  out[0] = 0;
  for (struct dirent *e; d && (e = readdir(d)) && o + 20 < cap;) {
    if (e->d_name[0] == '.') continue;
    char path[300], name[32] = "?";
    snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
    FILE *f = fopen(path, "r");
    if (f && fgets(name, sizeof name, f)) name[strcspn(name, "\n")] = 0;
    if (f) fclose(f);
    o += (size_t)snprintf(out + o, cap - o, "%s%s", o ? " " : "", name);
  }
  if (d) closedir(d);
}

/* The sockets this process has open (/proc/self/fd). */
static int sockets_now(void) {
  DIR *d = opendir("/proc/self/fd");
  if (!d) return -1;
  int n = 0;
  for (struct dirent *e; (e = readdir(d));) {
    if (e->d_name[0] == '.') continue;
    char path[300], to[64];
    snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
    ssize_t len = readlink(path, to, sizeof to - 1);
    n += len > 7 && strncmp(to, "socket:", 7) == 0;
  }
  closedir(d);
  return n;
}

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
  int most_sockets = mp_env_int("MP_MAX_SOCKETS", -1); /* -1: not counted */
  int before = threads_now(), sockets_before = sockets_now();
  brg_status st0 = brg_comm_init(&ctx->comm, ctx->nranks, ctx->id, ctx->rank);
  MP_CHECK(st0 == BRG_SUCCESS, "brg_comm_init: %s", brg_comm_last_error(NULL));
  if (st0 != BRG_SUCCESS) return 1;
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
  int n = threads_now() - before + 1, sockets = sockets_now() - sockets_before;
  char names[512];
  thread_names(names, sizeof names);
  printf("rank %d: %d threads (at most %d): %s; %d sockets\n", ctx->rank, n, most, names, sockets);
  fflush(stdout);
  MP_CHECK(before > 0 && n > 0 && n <= most,
           "rank %d runs %d threads after an allreduce on its rings, at most %d "
           "allowed",
           ctx->rank, n, most);
  MP_CHECK(most_sockets < 0 || sockets <= most_sockets,
           "rank %d has %d sockets open after an allreduce on its rings, at most %d allowed "
           "(an extra ring has no ring sockets or listener of its own)",
           ctx->rank, sockets, most_sockets);
  free(buf);
  return 0;
}

int main(int argc, char **argv) {
  mp_opts o = {.name = "threads",
               .nranks = argc > 1 ? atoi(argv[1]) : 4,
               .init = MP_INIT_NONE,
               .victim = -1,
               .deadline_ms = mp_env_int("MP_DEADLINE_MS", 60000)};
  return mp_run(&o, body, NULL);
}
