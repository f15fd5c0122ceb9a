/*
 * A bounded soak of what a training job does to a communicator, with faults:
 * each cycle splits a fresh communicator off a long-lived one and runs on it
 * an allreduce, a ring of isend/irecv, an all_to_all and a send to itself,
 * every element checked; every third cycle one rank (a different one each
 * time) aborts the fresh communicator while an iallreduce is in flight. The
 * survivors' calls end (success with the right values, or an error) within
 * seconds, and everyone destroys it. At the end the process has the file
 * descriptors and threads it had before the first cycle: nothing leaks
 * across some hundred init/abort/destroy cycles.
 *
 *   test_soak N SECONDS      (BRIGADE_TIMEOUT_MS bounds a stuck cycle)
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "brigade.h"
#include "harness.h"

static int count_dir(const char *path) {
  DIR *d = opendir(path);
  int n = 0;
  if (!d) return -1;
  for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

/* Threads may take a moment to be reaped after their join. */
static int settled(const char *path, int want) {
  int n = count_dir(path);
  for (int i = 0; i < 50 && n != want; i++) {
    mp_sleep_ms(20);
    n = count_dir(path);
  }
  return n;
}

static int seconds = 10;

static int cycle(mp_ctx *x, brg_comm *base, int k) {
  int n = x->nranks, r = x->rank;
  brg_comm *c = NULL;
  brg_status s = brg_comm_split(base, 0, r, &c);
  MP_CHECK(s == BRG_SUCCESS && c, "cycle %d: split: %s", k, brg_comm_last_error(NULL));
  if (!c) return 1;
  enum { M = 1000 };
  float a[M], b[M];
  for (int i = 0; i < M; i++) a[i] = (float)(r + 1) * (float)(i % 97 + k % 5);
  int abort_cycle = k % 3 == 2, victim = (k / 3) % n;
  if (abort_cycle) {
    brg_request rq;
    s = brg_iallreduce(a, b, M, BRG_FLOAT32, BRG_SUM, c, &rq);
    MP_CHECK(s == BRG_SUCCESS, "cycle %d: iallreduce: %s", k, brg_comm_last_error(c));
    if (r == victim) brg_comm_abort(c);
    int64_t t0 = mp_now_ns();
    s = brg_wait(&rq);
    double ms = (mp_now_ns() - t0) / 1e6;
    MP_CHECK(s == BRG_SUCCESS || s == BRG_ERR_ABORTED || s == BRG_ERR_REMOTE,
             "cycle %d (rank %d aborts): %s: %s", k, victim, brg_status_string(s),
             brg_comm_last_error(c));
    MP_CHECK(ms < 5000, "cycle %d: the wait after rank %d's abort took %.0f ms", k, victim, ms);
    for (int i = 0; s == BRG_SUCCESS && i < M; i++)
      if (b[i] != (float)(n * (n + 1) / 2) * (float)(i % 97 + k % 5)) {
        mp_fail("cycle %d: allreduce element %d is %g", k, i, b[i]);
        break;
      }
  } else {
    s = brg_allreduce(a, b, M, BRG_FLOAT32, BRG_SUM, c, NULL);
    MP_CHECK(s == BRG_SUCCESS, "cycle %d: allreduce: %s", k, brg_comm_last_error(c));
    int bad = 0;
    for (int i = 0; i < M; i++) bad += b[i] != (float)(n * (n + 1) / 2) * (float)(i % 97 + k % 5);
    MP_CHECK(bad == 0, "cycle %d: allreduce: %d wrong elements", k, bad);
    /* A ring of messages, and one to itself. */
    int32_t out[64], in[64], self_in[8], self_out[8];
    for (int i = 0; i < 64; i++) out[i] = r * 1000 + k + i;
    for (int i = 0; i < 8; i++) self_out[i] = -r - i;
    brg_request rq[2];
    MP_CHECK(brg_irecv(in, 64, BRG_INT32, (r - 1 + n) % n, c, &rq[0]) == BRG_SUCCESS, "irecv");
    MP_CHECK(brg_isend(out, 64, BRG_INT32, (r + 1) % n, c, &rq[1]) == BRG_SUCCESS, "isend");
    MP_CHECK(brg_send(self_out, 8, BRG_INT32, r, c, NULL) == BRG_SUCCESS, "send to self: %s",
             brg_comm_last_error(c));
    MP_CHECK(brg_recv(self_in, 8, BRG_INT32, r, c, NULL) == BRG_SUCCESS, "recv from self");
    MP_CHECK(brg_wait(&rq[0]) == BRG_SUCCESS && brg_wait(&rq[1]) == BRG_SUCCESS,
             "cycle %d: ring: %s", k, brg_comm_last_error(c));
    int from = (r - 1 + n) % n;
    bad = 0;
    for (int i = 0; i < 64; i++) bad += in[i] != from * 1000 + k + i;
    for (int i = 0; i < 8; i++) bad += self_in[i] != -r - i;
    MP_CHECK(bad == 0, "cycle %d: %d wrong p2p elements", k, bad);
    /* all_to_all: block j of rank r is r * 100 + j. */
    int64_t sa[16], ra[16];
    for (int j = 0; j < n; j++) sa[j] = r * 100 + j;
    s = brg_all_to_all(sa, ra, 1, BRG_INT64, c, NULL);
    MP_CHECK(s == BRG_SUCCESS, "cycle %d: all_to_all: %s", k, brg_comm_last_error(c));
    for (int j = 0; s == BRG_SUCCESS && j < n; j++)
      MP_CHECK(ra[j] == j * 100 + r, "cycle %d: all_to_all block %d is %lld", k, j,
               (long long)ra[j]);
  }
  brg_comm_destroy(c);
  /* Everyone is done with this cycle's communicator before the next. */
  s = brg_barrier(base);
  MP_CHECK(s == BRG_SUCCESS, "cycle %d: barrier on the long-lived communicator: %s", k,
           brg_comm_last_error(base));
  return s != BRG_SUCCESS;
}

static int body(mp_ctx *x) {
  brg_comm *base = x->comm;
  /* The baseline once the long-lived communicator and its threads run. */
  brg_barrier(base);
  int fds = count_dir("/proc/self/fd"), threads = count_dir("/proc/self/task");
  int64_t end = mp_now_ns() + (int64_t)seconds * 1000000000;
  int k = 0, go = 1;
  while (go && !mp_failures()) {
    if (cycle(x, base, k++)) break;
    /* Rank 0 decides when to stop, for every rank. */
    int32_t more = x->rank == 0 ? mp_now_ns() < end : 0;
    if (brg_broadcast(&more, &more, 1, BRG_INT32, 0, base, NULL) != BRG_SUCCESS) break;
    go = more;
  }
  int f = settled("/proc/self/fd", fds), t = settled("/proc/self/task", threads);
  MP_CHECK(f == fds, "%d file descriptors after %d cycles, %d before", f, k, fds);
  /* A leak is a thread more; one fewer is a thread of the start that was
   * still ending when the baseline was taken (under load, the bootstrap's
   * last threads may outlive the first barrier). */
  MP_CHECK(t <= threads, "%d threads after %d cycles, %d before", t, k, threads);
  if (x->rank == 0)
    mp_info("%d cycles (%d aborted), fds %d -> %d, threads %d -> %d", k, k / 3, fds, f, threads, t);
  return mp_failures();
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 3;
  seconds = argc > 2 ? atoi(argv[2]) : 10;
  char name[64];
  snprintf(name, sizeof name, "soak-N%d-%s", n, mp_transport());
  mp_opts o = {.name = name,
               .nranks = n,
               .deadline_ms = (seconds + 60) * 1000,
               .init = MP_INIT_ID,
               .victim = -1};
  return mp_run(&o, body, NULL);
}
