/* A step of a walk as test_plan records it: offsets in elements from the
 * send and receive buffers (-1: none). */
#ifndef PLAN_RECORD_H
#define PLAN_RECORD_H

#include <stddef.h>

#include "ring_args.h"

typedef struct plan_rec {
  int prim, step;
  long in, out;
  size_t count;
} plan_rec;

#ifdef __cplusplus
extern "C" {
#endif
/* Kernel mode's walk for channel `channel` of the launch `a`, into out
 * (cap entries); returns the number of steps (more than cap: cut off). */
size_t plan_kernel_walk(const brg__rk_args *a, int channel, size_t slot_elems, plan_rec *out,
                        size_t cap);
#ifdef __cplusplus
}
#endif

#endif
