/*
 * Memory-registration cache of the ibverbs transport.
 *
 * Registers page-aligned ranges through a verbs backend (verbs_api.h) and
 * hands the same registration to every later request it covers, so a buffer
 * is registered once however often it is asked for:
 *
 *   get(addr, len) --> rounds to [page_floor(addr), page_ceil(addr + len))
 *                  --> an entry covering it?  yes: refs++ (hit)
 *                                             no:  mr_reg the rounded range (miss)
 *   put(mr)        --> refs--; an entry with no refs stays cached (idle)
 *
 * Idle entries are kept in least-recently-used order and deregistered when
 * more than `max_idle` of them (or `max_idle_bytes` of them) pile up, when
 * their memory is invalidated, and at destroy. An entry in use is never
 * deregistered. The cache cannot see memory being freed: whoever frees
 * memory that went through it calls invalidate() first, since a registration
 * left behind would pin the old pages while a later mapping at the same
 * address is given its key. All calls are thread-safe.
 */
#ifndef BRG_REGCACHE_H
#define BRG_REGCACHE_H

#include <stddef.h>
#include <stdint.h>

#include "verbs_api.h"

/* Defaults of the idle bounds (create with 0 takes them). */
#define BRG__REGCACHE_MAX_IDLE 32
#define BRG__REGCACHE_MAX_IDLE_BYTES ((size_t)1 << 30)

typedef struct brg__regcache brg__regcache;

typedef struct brg__regcache_stats {
  uint64_t hits, misses;    /* get() served by a cached entry / by a new registration */
  uint64_t evictions;       /* idle entries deregistered for the bounds (or a full backend) */
  uint64_t invalidations;   /* entries dropped by invalidate() */
  size_t entries, idle;     /* now: registrations held, of them unreferenced */
  size_t bytes, idle_bytes; /* now: bytes those cover */
} brg__regcache_stats;

/* A cache over `ctx` of backend `vb`. max_idle / max_idle_bytes bound the
 * unreferenced entries kept; 0 takes the defaults above. */
brg_status brg__regcache_create(brg__regcache **out, const brg__vb_ops *vb, brg__vb_ctx *ctx,
                                size_t max_idle, size_t max_idle_bytes, brg__errbuf *err);
/* Deregisters every entry; entries still referenced are a caller bug and are
 * reported at WARN, then deregistered anyway. NULL is fine. */
void brg__regcache_destroy(brg__regcache *rc);

/* A registration covering [addr, addr + len), rounded out to pages, with one
 * reference taken. `*out` stays valid until the matching put(); its addr and
 * len are those of the page-aligned range, lkey/rkey serve any address in it.
 * NULL addr or zero len is BRG_ERR_INVALID_ARGUMENT. */
brg_status brg__regcache_get(brg__regcache *rc, const void *addr, size_t len,
                             const brg__vb_mr **out, brg__errbuf *err);
/* Drops the reference get() took. NULL is fine. */
void brg__regcache_put(brg__regcache *rc, const brg__vb_mr *mr);
/* The memory [addr, addr + len) is about to be freed: deregisters the idle
 * entries that overlap it, and makes those still referenced unreachable to
 * later get()s (they are deregistered at their last put()). */
void brg__regcache_invalidate(brg__regcache *rc, const void *addr, size_t len);

void brg__regcache_stats_get(brg__regcache *rc, brg__regcache_stats *out);

#endif
