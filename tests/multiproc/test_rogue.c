/*
 * A rogue process claims an honest rank's number first (issue 15, part 2).
 *
 * Three honest ranks start as torchrun would start them (MASTER_ADDR,
 * MASTER_PORT, WORLD_SIZE, RANK; no BRIGADE_SECRET, so the secret is
 * derived from what any local process can read). A fourth process, started
 * with rank 0 and before ranks 1 and 2, claims rank 2 with the same
 * variables and would contribute 1000 to every element instead of 3. The
 * honest rank 2 comes next, rank 1 last, so that the second claim reaches
 * the rendezvous while the job is still forming (a claim that comes after
 * the release cannot be told from a stray late process: see docs/api.md's
 * security section; test_bootstrap covers a claim during the ranks' set-up).
 *
 * Every honest rank must fail brg_comm_init_env with BRG_ERR_REMOTE and a
 * message that says rank 2 was claimed twice and names both claimants (pid
 * and host). A rank whose init succeeds fails the test, and so, louder, does
 * an allreduce that returns anything but 1 + 2 + 3 in every element: the
 * result must never be silently wrong.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

#define COUNT 1000
#define ROGUE 3     /* the harness's fourth process */
#define CLAIMED 2   /* the rank it claims */
#define LATE_MS 300 /* the honest rank 2 starts this much after rank 0 and the rogue, */
#define LAST_MS 450 /* and rank 1 this much: the claim comes while the job forms */

static int g_port;

static int body(mp_ctx *ctx) {
  int me = ctx->rank == ROGUE ? CLAIMED : ctx->rank;
  if (ctx->rank == 2) mp_sleep_ms(LATE_MS);
  if (ctx->rank == 1) mp_sleep_ms(LAST_MS);
  char port[16], rank[16];
  snprintf(port, sizeof port, "%d", g_port);
  snprintf(rank, sizeof rank, "%d", me);
  unsetenv("BRIGADE_SECRET");
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", port, 1);
  setenv("WORLD_SIZE", "3", 1);
  setenv("RANK", rank, 1);
  brg_comm *c = NULL;
  brg_status st = brg_comm_init_env(&c);
  const char *m = brg_comm_last_error(st == BRG_SUCCESS ? c : NULL);
  if (!m) m = "(no message)";
  if (ctx->rank != ROGUE) {
    if (st == BRG_SUCCESS) {
      mp_fail("brg_comm_init_env succeeded although rank %d was claimed twice", CLAIMED);
    } else {
      MP_CHECK(st == BRG_ERR_REMOTE, "init: %s, expected BRG_ERR_REMOTE: %s", brg_status_string(st),
               m);
      char want[64];
      MP_CHECK(mp_contains(m, "rank 2 was claimed twice"),
               "the message does not say rank %d was claimed twice: \"%s\"", CLAIMED, m);
      for (int q = CLAIMED; q <= ROGUE; q++) {
        snprintf(want, sizeof want, "pid %d on ", (int)ctx->shared->pids[q]);
        MP_CHECK(mp_contains(m, want), "the message does not name %s(%s): \"%s\"", want,
                 q == ROGUE ? "the rogue" : "the honest rank 2", m);
      }
    }
  }
  if (st != BRG_SUCCESS) return 0;
  int32_t *s = malloc(COUNT * sizeof *s), *r = malloc(COUNT * sizeof *r);
  if (!s || !r) return 1;
  for (int i = 0; i < COUNT; i++) s[i] = ctx->rank == ROGUE ? 1000 : me + 1;
  st = brg_allreduce(s, r, COUNT, BRG_INT32, BRG_SUM, c, NULL);
  if (st == BRG_SUCCESS && ctx->rank != ROGUE) {
    int bad = 0;
    for (int i = 0; i < COUNT; i++) bad += r[i] != 6;
    if (bad)
      mp_fail("SILENTLY WRONG: the allreduce returned BRG_SUCCESS with %d of %d elements wrong "
              "(element 0 is %d, expected 6)",
              bad, COUNT, (int)r[0]);
  }
  free(s);
  free(r);
  brg_comm_destroy(c);
  return 0;
}

int main(void) {
  g_port = mp_free_port();
  mp_opts o = {.name = "a rogue claims rank 2 first",
               .nranks = 4,
               .deadline_ms = mp_env_int("BRIGADE_TIMEOUT_MS", 10000) * 3 + 30000,
               .init = MP_INIT_BARE,
               .victim = -1};
  return mp_run(&o, body, NULL) ? 1 : 0;
}
