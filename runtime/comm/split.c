/*
 * brg_comm_split: new communicators from groups of an existing one, built
 * on the existing pieces. Every rank all-gathers (color, key) over the
 * parent; the first rank of each group (in (key, old rank) order) makes a
 * unique id (a fresh secret; no root), and a second all-gather hands it to
 * the group; then each group forms as brg_comm_init would, with the
 * parent's settings, except that its members meet over the parent: a
 * third all-gather carries every rank's bootstrap table entry and a fourth
 * its set-up status (comm.c), in which ranks outside every group take part
 * with nothing to say.
 */
#include <stdlib.h>
#include <string.h>

#include "bootstrap.h"
#include "internal.h"
#include "settings.h"

/* What each rank contributes to the second exchange: its group's id when
 * it leads one, or why it could not make it. */
typedef struct split_id {
  int32_t status; /* BRG_SUCCESS: id is valid (leaders only) */
  int32_t leader; /* 1 when this rank leads its group */
  brg_unique_id id;
  char why[192];
} split_id;

/* A failure of the exchange over the parent: in the parent's last error
 * (where the collective put it) and in the thread's, which the caller of a
 * failed split reads. */
static brg_status exchange_failed(brg_comm *comm, brg_status s, const char *what) {
  char msg[BRG__ERRLEN];
  snprintf(msg, sizeof msg, "%s", brg_comm_last_error(comm));
  return brg__fail_no_comm(s, "brg_comm_split: %s over the parent communicator failed: %s", what,
                           msg);
}

brg_status brg_comm_split(brg_comm *comm, int color, int key, brg_comm **newcomm) {
  brg_status s = brg__check_comm(comm, "brg_comm_split");
  if (s != BRG_SUCCESS) {
    brg__fail_no_comm(s, "brg_comm_split: %s", brg_comm_last_error(comm));
    return s;
  }
  if (!newcomm) {
    brg__fail_no_comm(BRG_ERR_INVALID_ARGUMENT, "brg_comm_split: newcomm is NULL");
    return brg__comm_error(comm, BRG_ERR_INVALID_ARGUMENT, "brg_comm_split: newcomm is NULL");
  }
  if (color < 0 && color != BRG_SPLIT_NOCOLOR) {
    brg__fail_no_comm(BRG_ERR_INVALID_ARGUMENT,
                      "brg_comm_split: color %d is negative (a color is >= 0, or "
                      "BRG_SPLIT_NOCOLOR for no new communicator)",
                      color);
    return brg__comm_error(comm, BRG_ERR_INVALID_ARGUMENT,
                           "brg_comm_split: color %d is negative (a color is >= 0, or "
                           "BRG_SPLIT_NOCOLOR for no new communicator)",
                           color);
  }
  int n = comm->nranks, me = comm->rank;
  brg__split_entry mine = {color, key};
  brg__split_entry *all = calloc((size_t)n, sizeof *all);
  split_id *ids = calloc((size_t)n, sizeof *ids);
  int *members = calloc((size_t)n, sizeof *members);
  if (!all || !ids || !members) {
    s = brg__fail_no_comm(BRG_ERR_NO_MEMORY, "brg_comm_split: out of memory for %d ranks", n);
    goto out;
  }
  s = brg__split_gather(comm, &mine, all, sizeof mine);
  if (s != BRG_SUCCESS) {
    s = exchange_failed(comm, s, "exchanging colors and keys");
    goto out;
  }

  /* This rank's group in (key, old rank) order. */
  int newrank, size = brg__split_group(all, n, color, me, members, &newrank);

  split_id out;
  memset(&out, 0, sizeof out);
  if (newrank == 0) {
    /* An id with a fresh secret and no root: the group meets over the
     * parent (the address is never dialled). */
    brg__errbuf e = {0};
    brg__boot_id bid;
    out.leader = 1;
    out.status = brg__boot_id_make(&bid, "127.0.0.1", 1, NULL, &e);
    if (out.status == BRG_SUCCESS)
      memcpy(out.id.internal, &bid, sizeof bid);
    else
      snprintf(out.why, sizeof out.why, "%.*s", (int)sizeof out.why - 1, e.msg);
  }
  /* Every rank takes part, even one whose id failed: its group learns why. */
  s = brg__split_gather(comm, &out, ids, sizeof out);
  if (s != BRG_SUCCESS) {
    s = exchange_failed(comm, s, "handing out the new communicators' ids");
    goto out;
  }
  if (color == BRG_SPLIT_NOCOLOR) {
    *newcomm = NULL;
    s = brg__split_stand_by(comm);
    goto out;
  }
  const split_id *lead = &ids[members[0]];
  if (!lead->leader) {
    brg__split_stand_by(comm);
    s = brg__fail_no_comm(BRG_ERR_INTERNAL, "brg_comm_split: rank %d did not lead its group",
                          members[0]);
    goto out;
  }
  if (lead->status != BRG_SUCCESS) {
    brg__split_stand_by(comm);
    char why[sizeof lead->why + 1];
    memcpy(why, lead->why, sizeof lead->why);
    why[sizeof lead->why] = 0;
    s = brg__fail_no_comm(BRG_ERR_REMOTE,
                          "brg_comm_split: rank %d could not make the id of color %d's "
                          "communicator: %s",
                          members[0], color, why);
    goto out;
  }
  brg__boot_id bid;
  memcpy(&bid, lead->id.internal, sizeof bid);
  brg__comm_opts opts = {.timeout_ms = comm->timeout_ms,
                         .transports = comm->transports_from_config ? comm->transports : NULL,
                         .parent = comm,
                         .members = members};
  brg_comm *nc = NULL;
  s = brg__comm_create_opts(&nc, size, &bid, newrank, &opts);
  if (s != BRG_SUCCESS) {
    /* The sentence speaks of the new communicator's ranks: say which
     * ranks of this one they are. */
    char why[BRG__ERRLEN], map[200];
    snprintf(why, sizeof why, "%s", brg_comm_last_error(NULL));
    size_t o = 0;
    for (int i = 0; i < size && o + 16 < sizeof map; i++)
      o += (size_t)snprintf(map + o, sizeof map - o, "%s%d", i ? ", " : "", members[i]);
    if (o + 16 >= sizeof map) snprintf(map + o, sizeof map - o, ", ...");
    s = brg__fail_no_comm(s,
                          "brg_comm_split: rank %d: forming color %d's communicator of %d ranks "
                          "failed (in what follows rank i is the new communicator's: its ranks "
                          "0, 1, ... are ranks %s here): %s",
                          me, color, size, map, why);
  }
  if (s == BRG_SUCCESS) {
    BRG__INFO("init", "split: rank %d of %d is rank %d of %d (color %d, key %d)", me, n, newrank,
              size, color, key);
    *newcomm = nc;
  }
out:
  free(all);
  free(ids);
  free(members);
  return s;
}

brg_status brg__split_stand_by(brg_comm *parent) {
  size_t eb = BRG__BOOT_ENTRY_HDR + sizeof(brg__peer_info);
  size_t n = (size_t)parent->nranks;
  uint8_t *mine = calloc(1, eb), *all = calloc(n, eb);
  brg__split_confirm ok = {.status = BRG_SUCCESS}, *oks = calloc(n, sizeof ok);
  brg_status s = BRG_SUCCESS;
  if (!mine || !all || !oks)
    s = brg__fail_no_comm(BRG_ERR_NO_MEMORY, "brg_comm_split: out of memory for %zu ranks", n);
  else if ((s = brg__split_gather(parent, mine, all, eb)) != BRG_SUCCESS ||
           (s = brg__split_gather(parent, &ok, oks, sizeof ok)) != BRG_SUCCESS)
    s = exchange_failed(parent, s, "standing by while the new communicators met");
  free(mine);
  free(all);
  free(oks);
  return s;
}
