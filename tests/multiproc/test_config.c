/*
 * brg_comm_init_config: settings per communicator.
 *
 *   test_config bad        one rank: every bad field is refused and named
 *   test_config N          N ranks, three communicators in each process:
 *                          A (tcp, 800 ms), B (shm, 60 s) and C (all unset:
 *                          the environment's BRIGADE_TRANSPORTS=tcp and
 *                          BRIGADE_TIMEOUT_MS=3000, which meson sets)
 *
 * B is also split, and its child must take B's transports.
 *
 * Which transport a communicator took shows in /proc/self/maps (shm maps
 * /dev/shm/brigade-* files, tcp none); which timeout it took shows in how
 * long a collective waits for a rank that does not come.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

#define ENV_TIMEOUT_MS 3000 /* BRIGADE_TIMEOUT_MS, set by meson */
#define A_TIMEOUT_MS 800

static double ms_since(int64_t t0) {
  return (double)(mp_now_ns() - t0) / 1e6;
}

/* Mappings of brigade's shm FIFOs in this process. */
static int shm_maps(void) {
  FILE *f = fopen("/proc/self/maps", "r");
  if (!f) return -1;
  char line[512];
  int n = 0;
  while (fgets(line, sizeof line, f))
    if (strstr(line, "/dev/shm/brigade-")) n++;
  fclose(f);
  return n;
}

/* ------------------------------------------------------------ bad values */

static void expect_bad(const brg_unique_id *id, const brg_comm_config *cfg, const char *what,
                       const char *field, const char *also) {
  brg_comm *const SENTINEL = (brg_comm *)(uintptr_t)0x1234;
  brg_comm *c = SENTINEL;
  int64_t t0 = mp_now_ns();
  brg_status st = brg_comm_init_config(&c, 1, id, 0, cfg);
  const char *m = brg_comm_last_error(NULL);
  MP_CHECK(st == BRG_ERR_INVALID_ARGUMENT, "%s: returned %s, expected BRG_ERR_INVALID_ARGUMENT",
           what, brg_status_string(st));
  MP_CHECK(c == SENTINEL, "%s: failed but wrote *comm", what);
  MP_CHECK(m && strstr(m, field), "%s: the message does not name %s: \"%s\"", what, field,
           m ? m : "(null)");
  MP_CHECK(!also || (m && strstr(m, also)), "%s: the message does not say \"%s\": \"%s\"", what,
           also, m ? m : "(null)");
  MP_CHECK(ms_since(t0) < 2000, "%s: took %.0f ms to fail", what, ms_since(t0));
  if (st == BRG_SUCCESS && c != SENTINEL) brg_comm_destroy(c);
}

static int body_bad(mp_ctx *ctx) {
  const brg_unique_id *id = ctx->id;
  brg_comm_config cfg = BRG_COMM_CONFIG_INIT;
  MP_CHECK(cfg.size == sizeof cfg && cfg.version == BRG_COMM_CONFIG_VERSION &&
               cfg.timeout_ms == BRG_CONFIG_UNSET && cfg.transports == NULL,
           "BRG_COMM_CONFIG_INIT does not leave every field unset");

  cfg.size = 0;
  expect_bad(id, &cfg, "size 0", "cfg->size", "BRG_COMM_CONFIG_INIT");
  cfg.size = sizeof cfg - 1;
  expect_bad(id, &cfg, "size too small", "cfg->size", NULL);
  cfg.size = sizeof cfg + 8;
  expect_bad(id, &cfg, "size of a later brigade", "cfg->size", NULL);
  cfg = (brg_comm_config)BRG_COMM_CONFIG_INIT;
  cfg.version = 0;
  expect_bad(id, &cfg, "version 0", "cfg->version", NULL);
  cfg.version = BRG_COMM_CONFIG_VERSION + 1;
  expect_bad(id, &cfg, "version of a later brigade", "cfg->version", NULL);

  static const int bad_timeouts[] = {0, 99, -2, -100000};
  for (size_t k = 0; k < sizeof bad_timeouts / sizeof bad_timeouts[0]; k++) {
    cfg = (brg_comm_config)BRG_COMM_CONFIG_INIT;
    cfg.timeout_ms = bad_timeouts[k];
    char what[64], val[32];
    snprintf(what, sizeof what, "timeout_ms=%d", bad_timeouts[k]);
    snprintf(val, sizeof val, "=%d", bad_timeouts[k]);
    expect_bad(id, &cfg, what, "cfg->timeout_ms", val);
  }

  static const struct {
    const char *list, *bad;
  } bad_lists[] = {{"shmm", "\"shmm\""},
                   {"tcp,bogus", "\"bogus\""},
                   {",tcp", "\"\""},
                   {"TCP", "\"TCP\""},
                   {"shm tcp", "\"shm tcp\""}};
  for (size_t k = 0; k < sizeof bad_lists / sizeof bad_lists[0]; k++) {
    cfg = (brg_comm_config)BRG_COMM_CONFIG_INIT;
    cfg.transports = bad_lists[k].list;
    char what[64];
    snprintf(what, sizeof what, "transports=\"%s\"", bad_lists[k].list);
    expect_bad(id, &cfg, what, "cfg->transports", bad_lists[k].bad);
  }
  char longlist[400];
  memset(longlist, 0, sizeof longlist);
  for (int k = 0; k < 90; k++) strcat(longlist, "tcp,");
  cfg = (brg_comm_config)BRG_COMM_CONFIG_INIT;
  cfg.transports = longlist;
  expect_bad(id, &cfg, "a transports list of 360 characters", "cfg->transports", "at most");

  brg_comm *c = (brg_comm *)(uintptr_t)0x1234;
  cfg = (brg_comm_config)BRG_COMM_CONFIG_INIT;
  MP_CHECK(brg_comm_init_config(NULL, 1, id, 0, &cfg) == BRG_ERR_INVALID_ARGUMENT,
           "comm NULL is not refused");
  MP_CHECK(brg_comm_init_config(&c, 1, NULL, 0, &cfg) == BRG_ERR_INVALID_ARGUMENT,
           "id NULL is not refused");
  MP_CHECK(brg_comm_init_config(&c, 1, id, 1, &cfg) == BRG_ERR_INVALID_ARGUMENT,
           "rank 1 of 1 is not refused");

  /* The id is untouched by all that: a good config on it works, "" allows
   * every transport and 5000 is a fine timeout. */
  cfg.transports = "";
  cfg.timeout_ms = 5000;
  c = NULL;
  brg_status st = brg_comm_init_config(&c, 1, id, 0, &cfg);
  if (st != BRG_SUCCESS) {
    mp_fail("a good config after the bad ones: %s: %s", brg_status_string(st),
            brg_comm_last_error(NULL));
    return 1;
  }
  int32_t v[5] = {1, 2, 3, 4, 5};
  st = brg_allreduce(v, v, 5, BRG_INT32, BRG_SUM, c, NULL);
  MP_CHECK(st == BRG_SUCCESS && v[0] == 1 && v[4] == 5, "allreduce on 1 rank: %s",
           brg_status_string(st));
  MP_CHECK(brg_comm_destroy(c) == BRG_SUCCESS, "brg_comm_destroy");
  /* cfg NULL is brg_comm_init. */
  brg_unique_id id2;
  if ((st = brg_get_unique_id(&id2)) != BRG_SUCCESS) {
    mp_fail("brg_get_unique_id: %s", brg_status_string(st));
    return 1;
  }
  c = NULL;
  st = brg_comm_init_config(&c, 1, &id2, 0, NULL);
  MP_CHECK(st == BRG_SUCCESS, "brg_comm_init_config with cfg NULL: %s: %s", brg_status_string(st),
           brg_comm_last_error(NULL));
  if (st == BRG_SUCCESS) brg_comm_destroy(c);
  return 0;
}

/* --------------------------------------------- three communicators per rank */

/* Rank 0 makes an id and passes it on through the shared area (slot g). */
static int share_id(mp_ctx *ctx, int g, brg_unique_id *id) {
  mp_shared *sh = ctx->shared;
  int64_t *slot = &sh->vals[g * 2 * (int)(sizeof *id / sizeof(int64_t))];
  if (ctx->rank == 0) {
    brg_status st = brg_get_unique_id(id);
    if (st != BRG_SUCCESS) {
      mp_fail("brg_get_unique_id: %s", brg_status_string(st));
      return 0;
    }
    memcpy(slot, id, sizeof *id);
    __atomic_store_n(&sh->flags[g], 1, __ATOMIC_RELEASE);
    return 1;
  }
  if (!mp_wait_flag(g, 30000)) {
    mp_fail("rank 0 published no id %d", g);
    return 0;
  }
  memcpy(id, slot, sizeof *id);
  return 1;
}

static int allreduce_ok(brg_comm *c, mp_ctx *ctx, const char *what) {
  enum { COUNT = 1009 };
  int64_t v[COUNT];
  for (int i = 0; i < COUNT; i++) v[i] = (int64_t)(ctx->rank + 1) * (i + 7);
  brg_status st = brg_allreduce(v, v, COUNT, BRG_INT64, BRG_SUM, c, NULL);
  if (st != BRG_SUCCESS) {
    mp_fail("%s: allreduce: %s: %s", what, brg_status_string(st), brg_comm_last_error(c));
    return 0;
  }
  int64_t ranks = (int64_t)ctx->nranks * (ctx->nranks + 1) / 2;
  for (int i = 0; i < COUNT; i++)
    if (v[i] != ranks * (i + 7)) {
      mp_fail("%s: allreduce element %d is %lld, expected %lld", what, i, (long long)v[i],
              (long long)(ranks * (i + 7)));
      return 0;
    }
  return 1;
}

static int body_multi(mp_ctx *ctx) {
  int n = ctx->nranks, rank = ctx->rank;
  brg_comm *a = NULL, *b = NULL, *c = NULL;
  brg_comm_config ca = BRG_COMM_CONFIG_INIT, cb = BRG_COMM_CONFIG_INIT, cc = BRG_COMM_CONFIG_INIT;
  ca.timeout_ms = A_TIMEOUT_MS;
  ca.transports = "tcp";
  cb.timeout_ms = 60000;
  char shm_list[8] = "shm"; /* copied at init: overwritten below */
  cb.transports = shm_list;
  brg_status st;

  /* A: tcp (as the environment says, but with its own timeout). */
  int m0 = shm_maps();
  if ((st = brg_comm_init_config(&a, n, ctx->id, rank, &ca)) != BRG_SUCCESS) {
    mp_fail("init A: %s: %s", brg_status_string(st), brg_comm_last_error(NULL));
    return 1;
  }
  int m1 = shm_maps();
  MP_CHECK(m1 == m0, "communicator A (transports \"tcp\") mapped %d shm FIFOs", m1 - m0);

  /* B: shm, although BRIGADE_TRANSPORTS=tcp. */
  brg_unique_id idb, idc;
  if (!share_id(ctx, 1, &idb)) return 1;
  if ((st = brg_comm_init_config(&b, n, &idb, rank, &cb)) != BRG_SUCCESS) {
    mp_fail("init B: %s: %s", brg_status_string(st), brg_comm_last_error(NULL));
    return 1;
  }
  strcpy(shm_list, "xyz");
  int m2 = shm_maps();
  if (n > 1)
    MP_CHECK(m2 > m1,
             "communicator B (transports \"shm\", BRIGADE_TRANSPORTS=tcp) mapped no shm FIFO");

  /* C: every field unset, so the environment's tcp. */
  if (!share_id(ctx, 2, &idc)) return 1;
  if ((st = brg_comm_init_config(&c, n, &idc, rank, &cc)) != BRG_SUCCESS) {
    mp_fail("init C: %s: %s", brg_status_string(st), brg_comm_last_error(NULL));
    return 1;
  }
  int m3 = shm_maps();
  MP_CHECK(m3 == m2, "communicator C (unset, BRIGADE_TRANSPORTS=tcp) mapped %d shm FIFOs", m3 - m2);

  if (!allreduce_ok(a, ctx, "A") || !allreduce_ok(b, ctx, "B") || !allreduce_ok(c, ctx, "C"))
    return 1;

  /* A split keeps its parent's transports: B's child maps shm FIFOs of
   * its own, although the environment says tcp. */
  brg_comm *bs = NULL;
  if ((st = brg_comm_split(b, 0, rank, &bs)) != BRG_SUCCESS || !bs) {
    mp_fail("split of B: %s: %s", brg_status_string(st), brg_comm_last_error(NULL));
    return 1;
  }
  int m4 = shm_maps();
  if (n > 1) MP_CHECK(m4 > m3, "the split of B (transports \"shm\") mapped no shm FIFO");
  if (!allreduce_ok(bs, ctx, "B's split")) return 1;
  MP_CHECK(brg_comm_destroy(bs) == BRG_SUCCESS, "destroy B's split");

  if (n > 1) {
    /* B waits 60 s: rank 0 coming 4 s late (past the environment's 3 s) is fine. */
    if (rank == 0) mp_sleep_ms(ENV_TIMEOUT_MS + 1000);
    int64_t t0 = mp_now_ns();
    if (!allreduce_ok(b, ctx, "B, rank 0 late by 4 s")) return 1;
    if (rank != 0)
      MP_CHECK(ms_since(t0) > ENV_TIMEOUT_MS, "B's allreduce returned before rank 0 came");

    /* A waits 800 ms: rank 0 does not come, the others time out after
     * A's timeout, well before the environment's. */
    if (rank != 0) {
      int32_t v[3] = {1, 2, 3};
      t0 = mp_now_ns();
      st = brg_allreduce(v, v, 3, BRG_INT32, BRG_SUM, a, NULL);
      double ms = ms_since(t0);
      const char *m = brg_comm_last_error(a);
      if (rank == 1 || n == 2) {
        /* rank 1 waits on rank 0 directly; others may hear of it as a remote error */
        MP_CHECK(st == BRG_ERR_TIMEOUT || st == BRG_ERR_REMOTE,
                 "A's allreduce without rank 0: %s, expected a timeout", brg_status_string(st));
      } else {
        MP_CHECK(st != BRG_SUCCESS, "A's allreduce without rank 0 succeeded");
      }
      MP_CHECK(ms >= A_TIMEOUT_MS - 50 && ms < ENV_TIMEOUT_MS - 500,
               "A's allreduce without rank 0 failed after %.0f ms; A's timeout is %d ms, the "
               "environment's %d ms",
               ms, A_TIMEOUT_MS, ENV_TIMEOUT_MS);
      MP_CHECK(n > 2 || st != BRG_ERR_TIMEOUT || mp_names_rank(m, 0),
               "A's timeout message does not name rank 0: \"%s\"", m ? m : "(null)");
      __atomic_add_fetch(&ctx->shared->flags[3], 1, __ATOMIC_ACQ_REL);
    } else {
      int64_t end = mp_now_ns() + 30000000000LL;
      while (__atomic_load_n(&ctx->shared->flags[3], __ATOMIC_ACQUIRE) < n - 1 && mp_now_ns() < end)
        mp_sleep_ms(10);
    }
    /* A is gone on every rank; B and C still work. */
    brg_comm_destroy(a);
    a = NULL;
    if (!allreduce_ok(b, ctx, "B after A failed") || !allreduce_ok(c, ctx, "C after A failed"))
      return 1;
  }
  if (a) MP_CHECK(brg_comm_destroy(a) == BRG_SUCCESS, "destroy A");
  MP_CHECK(brg_comm_destroy(c) == BRG_SUCCESS, "destroy C");
  MP_CHECK(brg_comm_destroy(b) == BRG_SUCCESS, "destroy B");
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s bad|N\n", argv[0]);
    return 2;
  }
  if (strcmp(argv[1], "bad") == 0) {
    mp_opts o = {.name = "config: bad values", .nranks = 1, .init = MP_INIT_NONE};
    return mp_run(&o, body_bad, NULL) ? 1 : 0;
  }
  int n = atoi(argv[1]);
  char name[64];
  snprintf(name, sizeof name, "config N=%d", n);
  mp_opts o = {.name = name, .nranks = n, .deadline_ms = 120000, .init = MP_INIT_NONE};
  return mp_run(&o, body_multi, NULL) ? 1 : 0;
}
