/*
 * The memory-registration cache (see regcache.h). A link registers a handful
 * of ranges, so the entries sit in one list and every lookup walks it. The
 * list is in order of last use (a get, or the put that left an entry idle):
 * the head was used last, and eviction takes idle entries from the tail.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "regcache.h"

typedef struct rc_entry {
  brg__vb_mr mr;        /* first: put() finds the entry from the mr it handed out */
  uintptr_t start, end; /* page-aligned [start, end) */
  long refs;
  int stale; /* invalidated while referenced: no more hits, dropped at the last put */
  struct rc_entry *prev, *next;
} rc_entry;

struct brg__regcache {
  const brg__vb_ops *vb;
  brg__vb_ctx *ctx;
  uintptr_t page;
  size_t max_idle, max_idle_bytes;
  pthread_mutex_t lock; /* everything below */
  rc_entry *head, *tail;
  brg__regcache_stats st;
};

/* ---- the list (lock held) ------------------------------------------------- */

static void list_unlink(brg__regcache *rc, rc_entry *e) {
  if (e->prev)
    e->prev->next = e->next;
  else
    rc->head = e->next;
  if (e->next)
    e->next->prev = e->prev;
  else
    rc->tail = e->prev;
  e->prev = e->next = NULL;
}

static void list_push_front(brg__regcache *rc, rc_entry *e) {
  e->prev = NULL;
  e->next = rc->head;
  if (rc->head) rc->head->prev = e;
  rc->head = e;
  if (!rc->tail) rc->tail = e;
}

static size_t entry_bytes(const rc_entry *e) {
  return (size_t)(e->end - e->start);
}

/* Deregisters and frees an entry; its counts leave the totals. */
static void entry_drop(brg__regcache *rc, rc_entry *e) {
  list_unlink(rc, e);
  rc->st.entries--;
  rc->st.bytes -= entry_bytes(e);
  if (e->refs == 0) {
    rc->st.idle--;
    rc->st.idle_bytes -= entry_bytes(e);
  }
  rc->vb->mr_dereg(rc->ctx, &e->mr);
  free(e);
}

/* Evicts least recently used idle entries until the idle ones fit the
 * bounds (`all`: every idle entry, to make room in a full backend).
 * Returns how many went. */
static int evict(brg__regcache *rc, int all) {
  int n = 0;
  rc_entry *e = rc->tail;
  while (e && (all || rc->st.idle > rc->max_idle || rc->st.idle_bytes > rc->max_idle_bytes)) {
    rc_entry *prev = e->prev;
    if (e->refs == 0) {
      entry_drop(rc, e);
      rc->st.evictions++;
      n++;
    }
    e = prev;
  }
  return n;
}

/* ---- the interface ------------------------------------------------------- */

brg_status brg__regcache_create(brg__regcache **out, const brg__vb_ops *vb, brg__vb_ctx *ctx,
                                size_t max_idle, size_t max_idle_bytes, brg__errbuf *err) {
  if (!out || !vb || !ctx)
    return brg__error(err, BRG_ERR_INVALID_ARGUMENT, "ib",
                      "registration cache: no backend or context to register with");
  brg__regcache *rc = calloc(1, sizeof *rc);
  if (!rc) return brg__error(err, BRG_ERR_NO_MEMORY, "ib", "registration cache: out of memory");
  long page = sysconf(_SC_PAGESIZE);
  rc->page = page > 0 ? (uintptr_t)page : 4096;
  rc->vb = vb;
  rc->ctx = ctx;
  rc->max_idle = max_idle ? max_idle : BRG__REGCACHE_MAX_IDLE;
  rc->max_idle_bytes = max_idle_bytes ? max_idle_bytes : BRG__REGCACHE_MAX_IDLE_BYTES;
  pthread_mutex_init(&rc->lock, NULL);
  *out = rc;
  return BRG_SUCCESS;
}

void brg__regcache_destroy(brg__regcache *rc) {
  if (!rc) return;
  pthread_mutex_lock(&rc->lock);
  size_t busy = rc->st.entries - rc->st.idle;
  if (busy)
    BRG__WARN("ib", "registration cache destroyed with %zu registration%s still in use", busy,
              busy > 1 ? "s" : "");
  while (rc->head) {
    rc_entry *e = rc->head;
    list_unlink(rc, e);
    rc->vb->mr_dereg(rc->ctx, &e->mr);
    free(e);
  }
  pthread_mutex_unlock(&rc->lock);
  pthread_mutex_destroy(&rc->lock);
  free(rc);
}

brg_status brg__regcache_get(brg__regcache *rc, const void *addr, size_t len,
                             const brg__vb_mr **out, brg__errbuf *err) {
  if (!rc || !out)
    return brg__error(err, BRG_ERR_INVALID_ARGUMENT, "ib", "registration cache: no cache");
  if (!addr)
    return brg__error(err, BRG_ERR_INVALID_ARGUMENT, "ib",
                      "registration cache: NULL address (%zu bytes)", len);
  if (len == 0)
    return brg__error(err, BRG_ERR_INVALID_ARGUMENT, "ib", "registration cache: empty range at %p",
                      addr);
  uintptr_t a = (uintptr_t)addr;
  if (len > UINTPTR_MAX - a || a + len > UINTPTR_MAX - (rc->page - 1))
    return brg__error(err, BRG_ERR_INVALID_ARGUMENT, "ib",
                      "registration cache: range of %zu bytes at %p wraps the address space", len,
                      addr);
  uintptr_t start = a & ~(rc->page - 1);
  uintptr_t end = (a + len + rc->page - 1) & ~(rc->page - 1);

  pthread_mutex_lock(&rc->lock);
  for (rc_entry *e = rc->head; e; e = e->next) {
    if (e->stale || e->start > start || e->end < end) continue;
    if (e->refs++ == 0) {
      rc->st.idle--;
      rc->st.idle_bytes -= entry_bytes(e);
    }
    list_unlink(rc, e);
    list_push_front(rc, e);
    rc->st.hits++;
    *out = &e->mr;
    pthread_mutex_unlock(&rc->lock);
    return BRG_SUCCESS;
  }
  rc_entry *e = calloc(1, sizeof *e);
  if (!e) {
    pthread_mutex_unlock(&rc->lock);
    return brg__error(err, BRG_ERR_NO_MEMORY, "ib", "registration cache: out of memory");
  }
  /* Registration happens under the lock: two threads asking for the same
   * range must not both register it, and this is setup, not the data path. */
  brg__errbuf first = {0};
  brg_status s = rc->vb->mr_reg(rc->ctx, (void *)start, end - start, &e->mr, &first);
  if (s != BRG_SUCCESS && rc->st.idle > 0) {
    /* The backend may be out of registrations: give back the idle ones. */
    evict(rc, 1);
    s = rc->vb->mr_reg(rc->ctx, (void *)start, end - start, &e->mr, &first);
  }
  if (s != BRG_SUCCESS) {
    pthread_mutex_unlock(&rc->lock);
    free(e);
    if (err) *err = first;
    return s;
  }
  e->start = start;
  e->end = end;
  e->refs = 1;
  list_push_front(rc, e);
  rc->st.misses++;
  rc->st.entries++;
  rc->st.bytes += end - start;
  BRG__TRACE("ib", "registered %#lx..%#lx (%zu bytes asked at %p), rkey %#x", (unsigned long)start,
             (unsigned long)end, len, addr, e->mr.rkey);
  *out = &e->mr;
  pthread_mutex_unlock(&rc->lock);
  return BRG_SUCCESS;
}

void brg__regcache_put(brg__regcache *rc, const brg__vb_mr *mr) {
  if (!rc || !mr) return;
  rc_entry *e = (rc_entry *)(uintptr_t)mr; /* mr is the entry's first member */
  pthread_mutex_lock(&rc->lock);
  if (e->refs <= 0) {
    BRG__WARN("ib", "registration cache: put of %#lx..%#lx without a get", (unsigned long)e->start,
              (unsigned long)e->end);
  } else if (--e->refs == 0) {
    rc->st.idle++;
    rc->st.idle_bytes += entry_bytes(e);
    if (e->stale) {
      entry_drop(rc, e);
    } else {
      /* Idle entries age from when they were last given back. */
      list_unlink(rc, e);
      list_push_front(rc, e);
      evict(rc, 0);
    }
  }
  pthread_mutex_unlock(&rc->lock);
}

void brg__regcache_invalidate(brg__regcache *rc, const void *addr, size_t len) {
  if (!rc || !addr || len == 0) return;
  uintptr_t a = (uintptr_t)addr;
  uintptr_t end = len > UINTPTR_MAX - a ? UINTPTR_MAX : a + len;
  pthread_mutex_lock(&rc->lock);
  for (rc_entry *e = rc->head, *next; e; e = next) {
    next = e->next;
    if (e->stale || e->end <= a || e->start >= end) continue;
    rc->st.invalidations++;
    if (e->refs == 0) {
      entry_drop(rc, e);
    } else {
      e->stale = 1;
      BRG__WARN("ib",
                "registration cache: memory at %#lx..%#lx freed while %ld reference%s to it remain",
                (unsigned long)e->start, (unsigned long)e->end, e->refs, e->refs > 1 ? "s" : "");
    }
  }
  pthread_mutex_unlock(&rc->lock);
}

void brg__regcache_stats_get(brg__regcache *rc, brg__regcache_stats *out) {
  pthread_mutex_lock(&rc->lock);
  *out = rc->st;
  pthread_mutex_unlock(&rc->lock);
}
