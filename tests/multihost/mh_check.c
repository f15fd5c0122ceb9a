/*
 * One rank of the multi-host test, started by run.sh inside a network
 * namespace with the environment rendezvous (MASTER_ADDR, MASTER_PORT, RANK,
 * WORLD_SIZE). Uses only the public header, as an application would.
 *
 *   mh_check check   allreduce / reduce_scatter / all_gather / broadcast at
 *                    several sizes and types; every element of every result
 *                    is checked against values computed here independently
 *   mh_check loop    allreduce until it fails (for the fault tests): prints
 *                    "looping" once the first one succeeded, then, on the
 *                    first failure, "error <status> after <ms> ms: <detail>"
 *
 * Exit 0 when every check passed, 1 on a wrong value or an unexpected error,
 * 3 when the loop ended in an error (what the fault tests want).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "brigade.h"

static int rank = -1, nranks = 0;
static int failures;

#define CHECK_OK(call)                                                                             \
  do {                                                                                             \
    brg_status s_ = (call);                                                                        \
    if (s_ != BRG_SUCCESS) {                                                                       \
      printf("rank %d: FAIL %s: %s (%s)\n", rank, #call, brg_status_string(s_),                    \
             brg_comm_last_error(comm));                                                           \
      fflush(stdout);                                                                              \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

static void bad(const char *what, size_t count, size_t i, double got, double want) {
  if (failures++ < 5)
    printf("rank %d: FAIL %s count %zu: element %zu is %.17g, expected %.17g\n", rank, what, count,
           i, got, want);
}

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Small integers, so float sums are exact whatever the order. */
static float fval(int r, size_t i) {
  return (float)((r + 1) * 3 + (int)(i % 101));
}
static int32_t ival(int r, size_t i) {
  return (int32_t)((r + 1) * 100003 + (int32_t)(i % 7919)) * (r % 2 ? -1 : 1);
}

static void check_allreduce(brg_comm *comm, size_t count) {
  float *fs = malloc(count * sizeof *fs), *fr = malloc(count * sizeof *fr);
  int32_t *is = malloc(count * sizeof *is), *ir = malloc(count * sizeof *ir);
  if (!fs || !fr || !is || !ir) exit(1);
  for (size_t i = 0; i < count; i++) fs[i] = fval(rank, i), is[i] = ival(rank, i);
  CHECK_OK(brg_allreduce(fs, fr, count, BRG_FLOAT32, BRG_SUM, comm, NULL));
  for (size_t i = 0; i < count; i++) {
    double want = 0;
    for (int r = 0; r < nranks; r++) want += fval(r, i);
    if (fr[i] != (float)want) bad("allreduce float32 sum", count, i, fr[i], want);
  }
  CHECK_OK(brg_allreduce(is, ir, count, BRG_INT32, BRG_MAX, comm, NULL));
  for (size_t i = 0; i < count; i++) {
    int32_t want = ival(0, i);
    for (int r = 1; r < nranks; r++)
      if (ival(r, i) > want) want = ival(r, i);
    if (ir[i] != want) bad("allreduce int32 max", count, i, ir[i], want);
  }
  /* in place */
  CHECK_OK(brg_allreduce(is, is, count, BRG_INT32, BRG_SUM, comm, NULL));
  for (size_t i = 0; i < count; i++) {
    int64_t want = 0;
    for (int r = 0; r < nranks; r++) want += ival(r, i);
    if (is[i] != (int32_t)want) bad("allreduce int32 sum in place", count, i, is[i], (double)want);
  }
  free(fs), free(fr), free(is), free(ir);
}

static void check_reduce_scatter(brg_comm *comm, size_t recvcount) {
  size_t total = recvcount * (size_t)nranks;
  float *s = malloc(total * sizeof *s + 1), *out = malloc(recvcount * sizeof *out + 1);
  if (!s || !out) exit(1);
  for (size_t i = 0; i < total; i++) s[i] = fval(rank, i);
  CHECK_OK(brg_reduce_scatter(s, out, recvcount, BRG_FLOAT32, BRG_SUM, comm, NULL));
  for (size_t i = 0; i < recvcount; i++) {
    size_t g = (size_t)rank * recvcount + i;
    double want = 0;
    for (int r = 0; r < nranks; r++) want += fval(r, g);
    if (out[i] != (float)want) bad("reduce_scatter float32 sum", recvcount, i, out[i], want);
  }
  free(s), free(out);
}

static void check_all_gather(brg_comm *comm, size_t sendcount) {
  int32_t *s = malloc(sendcount * sizeof *s + 1),
          *out = malloc(sendcount * (size_t)nranks * sizeof *out + 1);
  if (!s || !out) exit(1);
  for (size_t i = 0; i < sendcount; i++) s[i] = ival(rank, i);
  CHECK_OK(brg_all_gather(s, out, sendcount, BRG_INT32, comm, NULL));
  for (int r = 0; r < nranks; r++)
    for (size_t i = 0; i < sendcount; i++)
      if (out[(size_t)r * sendcount + i] != ival(r, i))
        bad("all_gather int32", sendcount, (size_t)r * sendcount + i,
            out[(size_t)r * sendcount + i], ival(r, i));
  free(s), free(out);
}

static void check_broadcast(brg_comm *comm, size_t count, int root) {
  double *buf = malloc(count * sizeof *buf + 1);
  if (!buf) exit(1);
  for (size_t i = 0; i < count; i++) buf[i] = rank == root ? (double)i * 0.5 + root : -1.0;
  CHECK_OK(brg_broadcast(buf, buf, count, BRG_FLOAT64, root, comm, NULL));
  for (size_t i = 0; i < count; i++)
    if (buf[i] != (double)i * 0.5 + root)
      bad("broadcast float64", count, i, buf[i], (double)i * 0.5 + root);
  free(buf);
}

static int run_check(brg_comm *comm) {
  static const size_t sizes[] = {1, 7, 1000, 65537, 1000003};
  for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
    size_t n = sizes[k];
    check_allreduce(comm, n);
    check_reduce_scatter(comm, n / (size_t)nranks + 1);
    check_all_gather(comm, n / (size_t)nranks + 1);
    for (int root = 0; root < nranks; root++) check_broadcast(comm, n, root);
  }
  CHECK_OK(brg_barrier(comm));
  if (failures) {
    printf("rank %d: FAIL %d wrong values\n", rank, failures);
    return 1;
  }
  printf("rank %d of %d: OK (allreduce, reduce_scatter, all_gather, broadcast; every element)\n",
         rank, nranks);
  return 0;
}

static int run_loop(brg_comm *comm) {
  size_t count = 1 << 20;
  float *s = malloc(count * sizeof *s), *r = malloc(count * sizeof *r);
  if (!s || !r) return 1;
  for (size_t i = 0; i < count; i++) s[i] = fval(rank, i);
  int64_t t0 = now_ms();
  for (long iter = 0;; iter++) {
    t0 = now_ms();
    brg_status st = brg_allreduce(s, r, count, BRG_FLOAT32, BRG_SUM, comm, NULL);
    if (st != BRG_SUCCESS) {
      printf("rank %d: error %s after %lld ms in iteration %ld: %s\n", rank, brg_status_string(st),
             (long long)(now_ms() - t0), iter, brg_comm_last_error(comm));
      fflush(stdout);
      free(s), free(r);
      return 3;
    }
    if (iter == 0) {
      printf("rank %d: looping\n", rank);
      fflush(stdout);
    }
  }
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "check";
  brg_comm *comm = NULL;
  setvbuf(stdout, NULL, _IOLBF, 0);
  brg_status s = brg_comm_init_env(&comm);
  if (s != BRG_SUCCESS) {
    printf("rank ?: FAIL brg_comm_init_env: %s (%s)\n", brg_status_string(s),
           brg_comm_last_error(NULL));
    return 1;
  }
  brg_comm_rank(comm, &rank);
  brg_comm_size(comm, &nranks);
  int rc = strcmp(mode, "loop") == 0 ? run_loop(comm) : run_check(comm);
  if (rc == 3) brg_comm_abort(comm);
  brg_comm_destroy(comm);
  return rc;
}
