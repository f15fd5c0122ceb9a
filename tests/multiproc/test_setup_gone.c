/*
 * A rank that gives up during setup is reported as gone by the rank that
 * comes too late to attach to it, with the reason it gave.
 *
 *   test_setup_gone     (N = 2, BRIGADE_TRANSPORTS=shm, BRIGADE_TIMEOUT_MS=1000)
 *
 * This program defines shm_open(), so the library's calls land here first.
 * In rank 1 the creation of its receive FIFO is held for 2.5 s, as if the
 * rank were descheduled: rank 0 times out waiting for rank 1's connection
 * details, tells its neighbour so, and removes its own FIFO. When rank 1
 * goes on, it finds rank 0's details (sent before rank 0 gave up) and tries
 * to attach to a FIFO that no longer exists. Rank 1 must fail with
 * BRG_ERR_REMOTE, name rank 0 as gone and give rank 0's reason, not an
 * errno from shm_open.
 */
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "harness.h"

static int g_rank = -1;
static int g_held;

int shm_open(const char *name, int oflag, mode_t mode) {
  static int (*real_shm_open)(const char *, int, mode_t);
  if (!real_shm_open)
    real_shm_open = (int (*)(const char *, int, mode_t))dlsym(RTLD_NEXT, "shm_open");
  if (g_rank == 1 && !g_held && (oflag & O_CREAT) && strncmp(name, "/brigade-", 9) == 0) {
    g_held = 1;
    mp_sleep_ms(2500);
  }
  return real_shm_open(name, oflag, mode);
}

static int body(mp_ctx *ctx) {
  g_rank = ctx->rank;
  brg_comm *comm = NULL;
  brg_status st = brg_comm_init(&comm, ctx->nranks, ctx->id, ctx->rank);
  const char *msg = brg_comm_last_error(NULL);
  if (st == BRG_SUCCESS) {
    mp_fail("brg_comm_init succeeded; expected it to fail");
    brg_comm_destroy(comm);
    return 1;
  }
  mp_info("%s: %s", brg_status_string(st), msg);
  if (ctx->rank == 0) {
    MP_CHECK(st == BRG_ERR_TIMEOUT, "rank 0: %s, expected a timeout", brg_status_string(st));
    MP_CHECK(mp_names_rank(msg, 1), "rank 0's message does not name rank 1: %s", msg);
  } else {
    MP_CHECK(st == BRG_ERR_REMOTE, "rank 1: %s, expected BRG_ERR_REMOTE", brg_status_string(st));
    MP_CHECK(mp_names_rank(msg, 0), "rank 1's message does not name rank 0: %s", msg);
    MP_CHECK(mp_contains(msg, "gave up"), "rank 1's message does not say rank 0 gave up: %s", msg);
    MP_CHECK(!mp_contains(msg, "No such file"), "rank 1 reports an errno, not the peer: %s", msg);
  }
  return mp_failures() ? 1 : 0;
}

int main(void) {
  mp_opts o = {.name = "setup-gone-N2-shm",
               .nranks = 2,
               .deadline_ms = 60000,
               .init = MP_INIT_NONE,
               .victim = -1};
  int rc = mp_run(&o, body, NULL);
  printf("%s\n", rc == 0 ? "PASS" : "FAIL");
  return rc == 0 ? 0 : 1;
}
