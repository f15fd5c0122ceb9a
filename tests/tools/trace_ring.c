/*
 * A rank of the trace tests, started by brigade-run: CALLS allreduces of
 * COUNT float32 elements, every element checked, then destroy (which writes
 * BRIGADE_TRACE_FILE).
 *
 *   trace_ring COUNT CALLS [STOP_RANK STOP_MS]
 *   trace_ring COUNT CALLS mismatch RANK
 *
 * With STOP_RANK, that rank stops itself with SIGSTOP for STOP_MS before
 * its last call (a child it forked sends SIGCONT), so the others wait for
 * it inside that call. With mismatch, RANK passes COUNT+1 to its last call;
 * every rank must then fail, and exits at once without destroying its
 * communicator, so only the trace written at the error remains.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "brigade.h"

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Stopped for ms milliseconds by a real SIGSTOP; returns how long it was. */
static double stop_self(int ms) {
  pid_t me = getpid();
  double t0 = now_ms();
  pid_t child = fork();
  if (child < 0) return -1;
  if (child == 0) {
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
    kill(me, SIGCONT);
    _exit(0);
  }
  raise(SIGSTOP);
  waitpid(child, NULL, 0);
  return now_ms() - t0;
}

int main(int argc, char **argv) {
  if (argc != 3 && argc != 5) {
    fprintf(stderr, "usage: %s COUNT CALLS [STOP_RANK STOP_MS]\n", argv[0]);
    return 2;
  }
  size_t count = strtoull(argv[1], NULL, 10);
  int calls = atoi(argv[2]);
  int mismatch = argc == 5 && !strcmp(argv[3], "mismatch");
  int stop_rank = argc == 5 && !mismatch ? atoi(argv[3]) : -1;
  int stop_ms = argc == 5 && !mismatch ? atoi(argv[4]) : 0;
  int odd_rank = mismatch ? atoi(argv[4]) : -1;
  brg_comm *comm;
  brg_status s = brg_comm_init_env(&comm);
  if (s != BRG_SUCCESS) {
    fprintf(stderr, "brg_comm_init_env: %s: %s\n", brg_status_string(s), brg_comm_last_error(NULL));
    return 1;
  }
  int rank, n;
  brg_comm_rank(comm, &rank);
  brg_comm_size(comm, &n);
  float *buf = malloc((count + 1) * sizeof *buf);
  if (!buf && count) return 1;
  int bad = 0;
  for (int call = 0; call < calls && !bad; call++) {
    /* Small integers: every sum is exact in float32, in any order. */
    size_t cnt = rank == odd_rank && call == calls - 1 ? count + 1 : count;
    for (size_t i = 0; i < cnt; i++) buf[i] = (float)((rank + 1) * (int)(i % 13) + call);
    if (rank == stop_rank && call == calls - 1)
      printf("rank %d stopped for %.1f ms\n", rank, stop_self(stop_ms));
    s = brg_allreduce(buf, buf, cnt, BRG_FLOAT32, BRG_SUM, comm, NULL);
    if (mismatch && call == calls - 1) {
      printf("rank %d: last call: %s\n", rank, brg_status_string(s));
      fflush(stdout);
      _exit(s == BRG_SUCCESS ? 1 : 0);
    }
    if (s != BRG_SUCCESS) {
      fprintf(stderr, "rank %d: allreduce: %s: %s\n", rank, brg_status_string(s),
              brg_comm_last_error(comm));
      return 1;
    }
    for (size_t i = 0; i < count && bad < 5; i++) {
      float want = (float)((n * (n + 1) / 2) * (int)(i % 13) + n * call);
      if (buf[i] != want) {
        fprintf(stderr, "rank %d call %d: element %zu is %g, expected %g\n", rank, call, i,
                (double)buf[i], (double)want);
        bad++;
      }
    }
  }
  free(buf);
  if ((s = brg_comm_destroy(comm)) != BRG_SUCCESS) {
    fprintf(stderr, "rank %d: destroy: %s\n", rank, brg_status_string(s));
    return 1;
  }
  return bad ? 1 : 0;
}
