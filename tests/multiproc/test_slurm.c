/*
 * A job that srun would start, with no MASTER_ADDR or MASTER_PORT: every
 * rank has only SLURM_* variables (its SLURM_PROCID, SLURM_NTASKS, a job id
 * and step id, and a step node list whose first node is this host), calls
 * brg_comm_init_env, and runs an allreduce checked against its sum.
 *
 *   test_slurm N
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

extern char **environ;

static void clear_launcher_env(void) {
  static const char *prefixes[] = {
      "MASTER_ADDR=", "MASTER_PORT=", "RANK=", "WORLD_SIZE=",   "LOCAL_RANK=", "OMPI_",
      "PMI",          "SLURM_",       "MV2_",  "BRIGADE_PORT=", "TORCHELASTIC"};
  for (int again = 1; again;) {
    again = 0;
    for (char **e = environ; *e && !again; e++)
      for (size_t k = 0; k < sizeof prefixes / sizeof prefixes[0] && !again; k++) {
        if (strncmp(*e, prefixes[k], strlen(prefixes[k])) != 0) continue;
        char name[256];
        size_t l = strcspn(*e, "=");
        if (l >= sizeof name) continue;
        memcpy(name, *e, l);
        name[l] = 0;
        unsetenv(name);
        again = 1;
      }
  }
}

static int body(mp_ctx *ctx) {
  const char *job = ctx->arg;
  char buf[32];
  clear_launcher_env();
  snprintf(buf, sizeof buf, "%d", ctx->rank);
  setenv("SLURM_PROCID", buf, 1);
  snprintf(buf, sizeof buf, "%d", ctx->nranks);
  setenv("SLURM_NTASKS", buf, 1);
  setenv("SLURM_JOB_ID", job, 1);
  setenv("SLURM_STEP_ID", "3", 1);
  setenv("SLURM_STEP_NODELIST", "localhost,node[02-04]", 1);
  brg_comm *c = NULL;
  brg_status st = brg_comm_init_env(&c);
  if (st != BRG_SUCCESS) {
    mp_fail("brg_comm_init_env with only SLURM_* variables: %s: %s", brg_status_string(st),
            brg_comm_last_error(NULL));
    return 1;
  }
  int rank = -1, size = -1;
  brg_comm_rank(c, &rank);
  brg_comm_size(c, &size);
  MP_CHECK(rank == ctx->rank && size == ctx->nranks, "rank %d of %d, expected %d of %d", rank, size,
           ctx->rank, ctx->nranks);
  double in[257], out[257];
  for (int i = 0; i < 257; i++) in[i] = ctx->rank * 1000.0 + i;
  st = brg_allreduce(in, out, 257, BRG_FLOAT64, BRG_SUM, c, NULL);
  MP_CHECK(st == BRG_SUCCESS, "allreduce: %s: %s", brg_status_string(st), brg_comm_last_error(c));
  double ranks = (double)ctx->nranks * (ctx->nranks - 1) / 2;
  for (int i = 0; st == BRG_SUCCESS && i < 257; i++)
    if (out[i] != 1000.0 * ranks + (double)ctx->nranks * i) {
      mp_fail("element %d is %g, expected %g", i, out[i], 1000.0 * ranks + ctx->nranks * i);
      break;
    }
  brg_comm_destroy(c);
  return mp_failures() ? 1 : 0;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 3;
  /* a job id of this run's own, so that runs side by side take different ports */
  char job[32];
  snprintf(job, sizeof job, "%d", (int)getpid());
  mp_opts o = {
      .name = "slurm", .nranks = n, .deadline_ms = 60000, .init = MP_INIT_BARE, .victim = -1};
  int rc = mp_run(&o, body, job);
  printf("%s: %d ranks from SLURM_* variables alone\n", rc ? "FAIL" : "ok", n);
  return rc ? 1 : 0;
}
