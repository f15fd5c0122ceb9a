/*
 * The link set of a communicator (linkset.h): which pieces its liveness
 * thread serves besides the communicator itself. A piece joins once its
 * links are ready (comm.c's brg__comm_piece_make, through liveness.c) and
 * leaves when it is destroyed, before its links close; the thread takes
 * the set's lock for each pass over the pieces, so leaving waits for a
 * pass in flight to end.
 */
#include <stdlib.h>

#include "linkset.h"

brg_comm *brg__linkset_owner(brg_comm *c) {
  return c->link_owner ? c->link_owner : c;
}

brg_status brg__linkset_init(brg_comm *owner, brg__errbuf *err) {
  if (owner->links) return BRG_SUCCESS;
  brg__linkset *s = calloc(1, sizeof *s);
  if (!s) return brg__error(err, BRG_ERR_NO_MEMORY, "init", "link set: out of memory");
  pthread_mutex_init(&s->lock, NULL);
  owner->links = s;
  return BRG_SUCCESS;
}

brg_status brg__linkset_join(brg_comm *owner, brg_comm *piece, brg__errbuf *err) {
  brg__linkset *s = owner->links;
  if (!s)
    return brg__error(err, BRG_ERR_INTERNAL, "init",
                      "link set: the owner of a piece has no set (it runs no liveness thread)");
  pthread_mutex_lock(&s->lock);
  if (s->n == s->cap) {
    int cap = s->cap ? 2 * s->cap : 8;
    brg_comm **p = realloc(s->piece, (size_t)cap * sizeof *p);
    if (!p) {
      pthread_mutex_unlock(&s->lock);
      return brg__error(err, BRG_ERR_NO_MEMORY, "init", "link set: out of memory");
    }
    s->piece = p;
    s->cap = cap;
  }
  s->piece[s->n++] = piece;
  s->gen++;
  pthread_mutex_unlock(&s->lock);
  return BRG_SUCCESS;
}

void brg__linkset_leave(brg_comm *owner, brg_comm *piece) {
  brg__linkset *s = owner->links;
  if (!s) return;
  pthread_mutex_lock(&s->lock);
  for (int i = 0; i < s->n; i++)
    if (s->piece[i] == piece) {
      s->piece[i] = s->piece[--s->n];
      s->gen++;
      break;
    }
  pthread_mutex_unlock(&s->lock);
}

void brg__linkset_free(brg_comm *owner) {
  brg__linkset *s = owner->links;
  if (!s) return;
  pthread_mutex_destroy(&s->lock);
  free(s->piece);
  free(s);
  owner->links = NULL;
}
