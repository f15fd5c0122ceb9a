/*
 * brg_comm_split: groups, their order, NOCOLOR, collectives on the new
 * communicators (checked element by element against what the test works
 * out from the colors and keys itself), the parent still working beside
 * them, and destroy in either order.
 *
 *   test_split N     (the transport from BRIGADE_TRANSPORTS)
 *
 * Rounds, each with its own colors and keys for every rank:
 *   0  two colors (rank % 2), keys falling with the rank: reversed order
 *   1  the last rank NOCOLOR, the others one color, equal keys: old order
 *   2  every rank its own color: communicators of one rank
 *   3  rank 0 NOCOLOR, the others one color, keys rising; then a split
 *      of that split by new rank % 2 with keys falling (nested)
 * Destroy order alternates between ranks and rounds (the child first, or
 * after more work on the parent); in the last round the parent goes first
 * and the child still works after it.
 *
 * First, a split in which the last rank cannot open a descriptor: it fails
 * naming EMFILE, every other rank fails at once naming it (not after
 * BRIGADE_TIMEOUT_MS), and the parent still works.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "harness.h"

typedef struct plan {
  int color[MP_MAX_RANKS], key[MP_MAX_RANKS];
} plan;

static void make_plan(int round, int n, plan *p) {
  for (int r = 0; r < n; r++) {
    switch (round) {
    case 0:
      p->color[r] = r % 2;
      p->key[r] = 100 - r;
      break;
    case 1:
      p->color[r] = r == n - 1 ? BRG_SPLIT_NOCOLOR : 7;
      p->key[r] = 0;
      break;
    case 2:
      p->color[r] = 1000 + r;
      p->key[r] = r;
      break;
    default:
      p->color[r] = r == 0 ? BRG_SPLIT_NOCOLOR : 5;
      p->key[r] = r * 10;
      break;
    }
  }
}

/* The group of rank `me`, in the order the new communicator must have. */
static int expected_group(const plan *p, int n, int me, int *members) {
  int size = 0;
  if (p->color[me] == BRG_SPLIT_NOCOLOR) return 0;
  for (int r = 0; r < n; r++)
    if (p->color[r] == p->color[me]) members[size++] = r;
  /* selection sort by (key, rank) */
  for (int i = 0; i < size; i++)
    for (int j = i + 1; j < size; j++) {
      int a = members[i], b = members[j];
      if (p->key[b] < p->key[a] || (p->key[b] == p->key[a] && b < a)) {
        members[i] = b;
        members[j] = a;
      }
    }
  return size;
}

/* Collectives on a new communicator whose members (old ranks, in new rank
 * order) are known: all_gather of old ranks, allreduce, broadcast from
 * the last new rank, reduce_scatter. */
static int check_group(brg_comm *c, const int *members, int size, int old_rank, const char *tag) {
  int rank = -1, sz = -1;
  brg_status st;
  if ((st = brg_comm_rank(c, &rank)) != BRG_SUCCESS ||
      (st = brg_comm_size(c, &sz)) != BRG_SUCCESS) {
    mp_fail("%s: rank/size: %s", tag, brg_status_string(st));
    return 0;
  }
  int want_rank = -1;
  for (int i = 0; i < size; i++)
    if (members[i] == old_rank) want_rank = i;
  if (rank != want_rank || sz != size) {
    mp_fail("%s: new rank %d of %d, expected %d of %d", tag, rank, sz, want_rank, size);
    return 0;
  }
  /* all_gather: every rank's old rank lands at its new rank's place */
  int32_t mine = old_rank, got[MP_MAX_RANKS];
  if ((st = brg_all_gather(&mine, got, 1, BRG_INT32, c, NULL)) != BRG_SUCCESS) {
    mp_fail("%s: all_gather: %s: %s", tag, brg_status_string(st), brg_comm_last_error(c));
    return 0;
  }
  for (int i = 0; i < size; i++)
    MP_CHECK(got[i] == members[i], "%s: all_gather block %d holds old rank %d, expected %d", tag, i,
             got[i], members[i]);
  /* allreduce over 1001 elements */
  enum { COUNT = 1001 };
  int64_t v[COUNT];
  for (int i = 0; i < COUNT; i++) v[i] = (int64_t)(old_rank + 1) * (i + 3);
  if ((st = brg_allreduce(v, v, COUNT, BRG_INT64, BRG_SUM, c, NULL)) != BRG_SUCCESS) {
    mp_fail("%s: allreduce: %s: %s", tag, brg_status_string(st), brg_comm_last_error(c));
    return 0;
  }
  int64_t sum = 0;
  for (int i = 0; i < size; i++) sum += members[i] + 1;
  for (int i = 0; i < COUNT; i++)
    if (v[i] != sum * (i + 3)) {
      mp_fail("%s: allreduce element %d is %lld, expected %lld", tag, i, (long long)v[i],
              (long long)(sum * (i + 3)));
      break;
    }
  /* broadcast from the last new rank */
  float b[257];
  for (int i = 0; i < 257; i++) b[i] = rank == size - 1 ? (float)(old_rank * 1000 + i) : -1.0f;
  if ((st = brg_broadcast(b, b, 257, BRG_FLOAT32, size - 1, c, NULL)) != BRG_SUCCESS) {
    mp_fail("%s: broadcast: %s: %s", tag, brg_status_string(st), brg_comm_last_error(c));
    return 0;
  }
  for (int i = 0; i < 257; i++)
    if (b[i] != (float)(members[size - 1] * 1000 + i)) {
      mp_fail("%s: broadcast element %d is %g, expected %d", tag, i, b[i],
              members[size - 1] * 1000 + i);
      break;
    }
  /* reduce_scatter, 5 per rank, max */
  int32_t rs_in[5 * MP_MAX_RANKS], rs_out[5];
  for (int i = 0; i < 5 * size; i++) rs_in[i] = old_rank * 100 + i;
  if ((st = brg_reduce_scatter(rs_in, rs_out, 5, BRG_INT32, BRG_MAX, c, NULL)) != BRG_SUCCESS) {
    mp_fail("%s: reduce_scatter: %s: %s", tag, brg_status_string(st), brg_comm_last_error(c));
    return 0;
  }
  int maxold = 0;
  for (int i = 0; i < size; i++) maxold = members[i] > maxold ? members[i] : maxold;
  for (int i = 0; i < 5; i++)
    MP_CHECK(rs_out[i] == maxold * 100 + rank * 5 + i,
             "%s: reduce_scatter element %d is %d, expected %d", tag, i, rs_out[i],
             maxold * 100 + rank * 5 + i);
  return 1;
}

static int parent_ok(brg_comm *c, int n, const char *tag) {
  int32_t v[3] = {1, 2, 3};
  brg_status st = brg_allreduce(v, v, 3, BRG_INT32, BRG_SUM, c, NULL);
  if (st != BRG_SUCCESS || v[0] != n || v[2] != 3 * n) {
    mp_fail("%s: allreduce on the parent: %s (%d %d)", tag, brg_status_string(st), v[0], v[2]);
    return 0;
  }
  return 1;
}

/* The last rank's split fails for want of descriptors; the others hear
 * which rank failed at once. */
static int failed_member(brg_comm *parent, int n, int me) {
  struct rlimit old, low;
  if (me == n - 1) {
    /* The next descriptor would be the lowest free number: none from it on. */
    int probe = dup(0);
    MP_CHECK(probe >= 0 && getrlimit(RLIMIT_NOFILE, &old) == 0, "probe the descriptors");
    close(probe);
    low = old;
    low.rlim_cur = (rlim_t)probe;
    MP_CHECK(setrlimit(RLIMIT_NOFILE, &low) == 0, "lower RLIMIT_NOFILE");
  }
  brg_comm *nc = NULL;
  int64_t t0 = mp_now_ns();
  brg_status st = brg_comm_split(parent, 0, me, &nc);
  int64_t took = (mp_now_ns() - t0) / 1000000;
  const char *m = brg_comm_last_error(NULL);
  if (me == n - 1) MP_CHECK(setrlimit(RLIMIT_NOFILE, &old) == 0, "restore RLIMIT_NOFILE");
  MP_CHECK(st != BRG_SUCCESS && nc == NULL, "a split with a failing member succeeded");
  char want[96];
  if (me == n - 1)
    snprintf(want, sizeof want, "Too many open files");
  else
    snprintf(want, sizeof want, "rank %d of the new communicator (rank %d of its parent)", n - 1,
             n - 1);
  MP_CHECK(m && strstr(m, want), "failed split: \"%s\" does not name \"%s\"", m ? m : "(null)",
           want);
  MP_CHECK(took < 10000, "the failed split took %lld ms", (long long)took);
  return parent_ok(parent, n, "after a failed split");
}

static int body(mp_ctx *ctx) {
  int n = ctx->nranks, me = ctx->rank;
  brg_comm *parent = ctx->comm;

  /* Bad arguments fail locally, on every rank alike, and change nothing. */
  brg_comm *sentinel = (brg_comm *)(uintptr_t)0x1234, *nc = sentinel;
  MP_CHECK(brg_comm_split(parent, 0, 0, NULL) == BRG_ERR_INVALID_ARGUMENT, "newcomm NULL");
  MP_CHECK(brg_comm_split(parent, -2, 0, &nc) == BRG_ERR_INVALID_ARGUMENT && nc == sentinel,
           "color -2 is not refused (or *newcomm was written)");
  const char *m = brg_comm_last_error(NULL);
  MP_CHECK(m && strstr(m, "color -2"), "color -2: the message does not name it: \"%s\"",
           m ? m : "(null)");
  MP_CHECK(brg_comm_split(NULL, 0, 0, &nc) == BRG_ERR_INVALID_ARGUMENT && nc == sentinel,
           "comm NULL is not refused");

  if (!failed_member(parent, n, me)) return 1;

  for (int round = 0; round < 4; round++) {
    plan p;
    memset(&p, 0, sizeof p);
    make_plan(round, n, &p);
    int members[MP_MAX_RANKS];
    int size = expected_group(&p, n, me, members);
    char tag[64];
    snprintf(tag, sizeof tag, "round %d (color %d, key %d)", round, p.color[me], p.key[me]);
    nc = sentinel;
    brg_status st = brg_comm_split(parent, p.color[me], p.key[me], &nc);
    if (st != BRG_SUCCESS) {
      mp_fail("%s: brg_comm_split: %s: %s", tag, brg_status_string(st), brg_comm_last_error(NULL));
      return 1;
    }
    if (size == 0) {
      MP_CHECK(nc == NULL, "%s: NOCOLOR got a communicator", tag);
      nc = NULL;
    } else if (!nc || nc == sentinel) {
      mp_fail("%s: no communicator", tag);
      return 1;
    } else if (!check_group(nc, members, size, me, tag)) {
      return 1;
    }
    /* The parent works beside the child. */
    if (!parent_ok(parent, n, tag)) return 1;

    if (round == 3 && nc) {
      /* A split of the split: by new rank % 2, keys falling. */
      int nr = -1;
      brg_comm_rank(nc, &nr);
      int sub_members[MP_MAX_RANKS], sub = 0;
      for (int i = 0; i < size; i++)
        if (i % 2 == nr % 2) sub_members[sub++] = members[i];
      for (int i = 0; i < sub / 2; i++) { /* keys fall with the new rank: reversed */
        int t = sub_members[i];
        sub_members[i] = sub_members[sub - 1 - i];
        sub_members[sub - 1 - i] = t;
      }
      brg_comm *nn = NULL;
      char tag2[80];
      snprintf(tag2, sizeof tag2, "%s, nested", tag);
      st = brg_comm_split(nc, nr % 2, -nr, &nn);
      if (st != BRG_SUCCESS || !nn) {
        mp_fail("%s: brg_comm_split: %s: %s", tag2, brg_status_string(st),
                brg_comm_last_error(NULL));
        return 1;
      }
      if (!check_group(nn, sub_members, sub, me, tag2)) return 1;
      MP_CHECK(brg_comm_destroy(nn) == BRG_SUCCESS, "%s: destroy", tag2);
    }

    /* Destroy order: some ranks the child first, others after more work on
     * the parent, and in the last round the parent before the child. */
    if (round == 3) {
      MP_CHECK(brg_comm_destroy(parent) == BRG_SUCCESS, "destroy the parent before the child");
      ctx->comm = NULL;
      parent = NULL;
      if (nc) {
        int nr = -1;
        brg_comm_rank(nc, &nr);
        /* The child still works without its parent. */
        int32_t x = 1;
        st = brg_allreduce(&x, &x, 1, BRG_INT32, BRG_SUM, nc, NULL);
        MP_CHECK(st == BRG_SUCCESS && x == size,
                 "%s: allreduce on the child after the parent is gone: %s, %d (expected %d)", tag,
                 brg_status_string(st), x, size);
        MP_CHECK(brg_comm_destroy(nc) == BRG_SUCCESS, "%s: destroy the child", tag);
      }
    } else if ((me + round) % 2 == 0) {
      if (nc) MP_CHECK(brg_comm_destroy(nc) == BRG_SUCCESS, "%s: destroy the child", tag);
      if (!parent_ok(parent, n, tag)) return 1;
    } else {
      if (!parent_ok(parent, n, tag)) return 1;
      if (nc) MP_CHECK(brg_comm_destroy(nc) == BRG_SUCCESS, "%s: destroy the child", tag);
    }
  }
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s N\n", argv[0]);
    return 2;
  }
  int n = atoi(argv[1]);
  char name[64];
  snprintf(name, sizeof name, "split N=%d %s", n, mp_transport());
  mp_opts o = {.name = name, .nranks = n, .deadline_ms = 120000, .init = MP_INIT_ID};
  return mp_run(&o, body, NULL) ? 1 : 0;
}
