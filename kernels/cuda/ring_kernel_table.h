/* Kernel mode's kernels, one table per dtype: ring_kernel_dtype.cu is
 * compiled once per dtype (kernels/cuda/meson.build), each object defining
 * its dtype's table, and ring_kernel.cu picks from them at launch. Ten
 * objects instead of one let nvcc's jobs run in parallel: the kernels are
 * most of the CUDA module's compile time. */
#ifndef BRG_RING_KERNEL_TABLE_H
#define BRG_RING_KERNEL_TABLE_H

#include "ring_args.h"

namespace brg_rk_launch {

constexpr int MAX_THREADS = 512;

typedef void (*kernel_fn)(const brg__rk_args);

/* One entry per op in brg_op's order; NULL where the dtype lacks the op
 * (the bitwise ops of floating-point dtypes). */
#define BRG__RK_TABLES(X) X(i8) X(u8) X(i32) X(u32) X(i64) X(u64) X(f16) X(bf16) X(f32) X(f64)
#define BRG__RK_DECLARE(t) extern const kernel_fn table_##t[];
BRG__RK_TABLES(BRG__RK_DECLARE)
#undef BRG__RK_DECLARE

} // namespace brg_rk_launch

#endif /* BRG_RING_KERNEL_TABLE_H */
