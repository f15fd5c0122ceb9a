/*
 * Bucket assignment: which parameters share a flat buffer and one allreduce.
 * Pure arithmetic, no ranks, so it is unit-tested on its own.
 */
#ifndef BRG_REDUCER_BUCKETS_H
#define BRG_REDUCER_BUCKETS_H

#include <stddef.h>
#include "brigade.h"

/*
 * Fills parameters into buckets in `fill_order` (a permutation of
 * 0..nparams-1; the reducer passes reverse registration order, or after the
 * rebuild the observed ready order).
 *
 * Each dtype has its own open bucket. A parameter that would push its open
 * bucket past the bucket's cap closes that bucket first, and a bucket that
 * reaches its cap closes; so a bucket never exceeds its cap unless it holds
 * a single parameter larger than the cap. The first bucket opened (the first
 * to launch) is capped at first_cap, every later one at cap.
 *
 * Buckets are numbered in the order they were opened, which is the order of
 * their first parameter in fill_order; that is the launch order. Within a
 * bucket parameters keep fill order.
 *
 * Outputs, all caller-allocated:
 *   members[nparams]        parameter indices, bucket after bucket
 *   bucket_start[nparams+1] bucket k holds members[bucket_start[k] .. bucket_start[k+1])
 *   bucket_of[nparams]      bucket of each parameter (indexed by parameter)
 *   *nbuckets
 * Fails with BRG_ERR_INVALID_ARGUMENT when fill_order is not a permutation
 * or a dtype is out of range, BRG_ERR_NO_MEMORY when scratch space is short.
 */
brg_status brg__bucket_assign(size_t nparams, const size_t *count, const brg_dtype *dtype,
                              const size_t *fill_order, size_t first_cap, size_t cap,
                              size_t *members, size_t *bucket_start, size_t *bucket_of,
                              size_t *nbuckets);

#endif
