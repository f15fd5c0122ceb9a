/*
 * A job started by Open MPI's mpirun, whose daemons serve PMIx, with no
 * MASTER_ADDR or MASTER_PORT: brg_comm_init_env finds PMIX_NAMESPACE,
 * opens libpmix at run time and takes rank 0's bootstrap id from the
 * server's store (runtime/comm/launch.c, rendezvous.c).
 *
 *   test_pmix N           runs itself under mpirun -np N and checks that
 *                         every rank formed through PMIx and passed
 *   test_pmix --rank      one rank (what mpirun starts)
 *
 * Skipped (77) where mpirun is not installed.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "brigade.h"

#define COUNT 1031 /* a prime: no multiple of the ranks or of a vector */

static int rank_main(void) {
  /* what brigade-run or torchrun would have set: none of it here */
  unsetenv("MASTER_ADDR");
  unsetenv("MASTER_PORT");
  unsetenv("RANK");
  unsetenv("WORLD_SIZE");
  if (!getenv("PMIX_NAMESPACE")) {
    fprintf(stderr, "test_pmix: PMIX_NAMESPACE is not set: mpirun started no PMIx server\n");
    return 1;
  }
  brg_comm *c = NULL;
  brg_status st = brg_comm_init_env(&c);
  if (st != BRG_SUCCESS) {
    fprintf(stderr, "test_pmix: brg_comm_init_env under mpirun: %s: %s\n", brg_status_string(st),
            brg_comm_last_error(NULL));
    return 1;
  }
  int rank = -1, size = -1, bad = 0;
  brg_comm_rank(c, &rank);
  brg_comm_size(c, &size);
  const char *orank = getenv("OMPI_COMM_WORLD_RANK"), *osize = getenv("OMPI_COMM_WORLD_SIZE");
  if (!orank || !osize || atoi(orank) != rank || atoi(osize) != size) {
    fprintf(stderr, "test_pmix: rank %d of %d, mpirun says %s of %s\n", rank, size,
            orank ? orank : "?", osize ? osize : "?");
    bad = 1;
  }
  /* out of place: a float64 sum; in place: an int32 max */
  static double in[COUNT], out[COUNT];
  static int32_t v[COUNT];
  for (int i = 0; i < COUNT; i++) {
    in[i] = rank * 1000.0 + i;
    v[i] = (int32_t)((i * 7 + rank * 13) % 101);
  }
  st = brg_allreduce(in, out, COUNT, BRG_FLOAT64, BRG_SUM, c, NULL);
  if (st == BRG_SUCCESS) st = brg_allreduce(v, v, COUNT, BRG_INT32, BRG_MAX, c, NULL);
  if (st != BRG_SUCCESS) {
    fprintf(stderr, "test_pmix: rank %d: allreduce: %s\n", rank, brg_comm_last_error(c));
    bad = 1;
  }
  double ranks = (double)size * (size - 1) / 2;
  for (int i = 0; st == BRG_SUCCESS && i < COUNT; i++) {
    int32_t want = -1;
    for (int r = 0; r < size; r++) {
      int32_t x = (int32_t)((i * 7 + r * 13) % 101);
      if (x > want) want = x;
    }
    if (out[i] != 1000.0 * ranks + (double)size * i || v[i] != want) {
      fprintf(stderr, "test_pmix: rank %d: element %d is %g and %d, expected %g and %d\n", rank, i,
              out[i], v[i], 1000.0 * ranks + (double)size * i, want);
      bad = 1;
      break;
    }
  }
  brg_comm_destroy(c);
  if (!bad) printf("test_pmix: rank %d of %d passed\n", rank, size);
  return bad;
}

/* Whether mpirun is on PATH. */
static int have_mpirun(void) {
  const char *path = getenv("PATH");
  char dir[4096], file[4200];
  for (const char *p = path ? path : ""; *p;) {
    size_t l = strcspn(p, ":");
    if (l > 0 && l < sizeof dir) {
      memcpy(dir, p, l);
      dir[l] = 0;
      snprintf(file, sizeof file, "%s/mpirun", dir);
      if (access(file, X_OK) == 0) return 1;
    }
    p += l + (p[l] == ':');
  }
  return 0;
}

int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "--rank")) return rank_main();
  int n = argc > 1 ? atoi(argv[1]) : 3;
  if (n < 1 || n > 16) {
    fprintf(stderr, "usage: test_pmix [N (1..16) | --rank]\n");
    return 2;
  }
  if (!have_mpirun()) {
    printf("SKIP: no mpirun on PATH (Debian: openmpi-bin)\n");
    return 77;
  }
  char self[4096];
  ssize_t l = readlink("/proc/self/exe", self, sizeof self - 1);
  if (l <= 0) {
    perror("test_pmix: /proc/self/exe");
    return 1;
  }
  self[l] = 0;
  /* mpirun refuses root without these; the ranks log where their
   * rendezvous came from */
  char cmd[8400];
  snprintf(cmd, sizeof cmd,
           "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 BRIGADE_DEBUG=INFO "
           "BRIGADE_DEBUG_SUBSYS=init timeout 90 mpirun --oversubscribe -np %d "
           "-x BRIGADE_DEBUG -x BRIGADE_DEBUG_SUBSYS %s '%s' --rank 2>&1",
           n, getenv("LSAN_OPTIONS") ? "-x LSAN_OPTIONS" : "", self);
  FILE *f = popen(cmd, "r");
  if (!f) {
    perror("test_pmix: popen");
    return 1;
  }
  char line[2048];
  int passed = 0, pmix = 0;
  while (fgets(line, sizeof line, f)) {
    fputs(line, stdout);
    passed += strstr(line, "test_pmix: rank ") && strstr(line, " passed") ? 1 : 0;
    pmix += strstr(line, "the rendezvous through PMIx") ? 1 : 0;
  }
  int rc = pclose(f);
  int ok = rc == 0 && passed == n && pmix == n;
  printf("%s: %d ranks under mpirun: exit %d, %d passed, %d formed through PMIx\n",
         ok ? "ok" : "FAIL", n, rc, passed, pmix);
  return ok ? 0 : 1;
}
