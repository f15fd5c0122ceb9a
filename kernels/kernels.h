/*
 * Host reduce and copy kernels. They know nothing about ranks: they combine
 * and move arrays of elements.
 */
#ifndef BRG_KERNELS_H
#define BRG_KERNELS_H

#include <stddef.h>
#include "brigade.h"

/*
 * dst0[i] = a[i] (op) b[i] for i < count, and also dst1[i] = dst0[i] when
 * dst1 is not NULL. With BRG_AVG the pair is summed and the sum is then
 * divided by `divisor` (integer types: C division, truncating toward zero);
 * other ops ignore `divisor`. Any of dst0/dst1 may alias a or b exactly;
 * partial overlaps are not allowed. dtype and op must be valid; the bitwise
 * ops (BRG_BAND, BRG_BOR, BRG_BXOR) exist for integer dtypes only, and with
 * another dtype the call writes nothing.
 */
void brg__reduce(void *dst0, void *dst1, const void *a, const void *b, size_t count,
                 brg_dtype dtype, brg_op op, int divisor);

/* dst0 = src and, when dst1 is not NULL, dst1 = src (bytes). dst may equal src. */
void brg__copy(void *dst0, void *dst1, const void *src, size_t bytes);

/* dst = src (bytes) with non-temporal stores, for large outputs that should
 * not displace the cache. dst may equal src (nothing to do). */
void brg__copy_nt(void *dst, const void *src, size_t bytes);

/* dst[i] = src[i] / divisor in dtype arithmetic (BRG_AVG on one rank or the
 * root of a reduce that has no peers). dst may equal src. */
void brg__divide(void *dst, const void *src, size_t count, brg_dtype dtype, int divisor);

/* Name of the instruction set the kernels picked at run time ("avx512",
 * "avx2", "generic"). */
const char *brg__kernels_isa(void);

#endif
