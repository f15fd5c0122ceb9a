/* Kernel mode's kernels of one dtype: ring_kernel.cuh as __global__
 * kernels, one thread block per channel, one kernel per op, so that each
 * gets the registers its own path needs. Compiled once per dtype with
 * -DBRG_RK_DTYPE=<tag> (kernels/cuda/meson.build): the objects build in
 * parallel, and each defines its dtype's table (ring_kernel_table.h). */
#include <cuda_runtime.h>

#include "brg_cuda.h"
#include "ring_kernel.cuh"
#include "ring_kernel_table.h"

#ifndef BRG_RK_DTYPE
#error "compile with -DBRG_RK_DTYPE=i8|u8|i32|u32|i64|u64|f16|bf16|f32|f64"
#endif

#define BRG__RK_CAT2(a, b) a##b
#define BRG__RK_CAT(a, b) BRG__RK_CAT2(a, b)

namespace {

using brg_rk_launch::kernel_fn;
using D = brg_ew::BRG__RK_CAT(tag_, BRG_RK_DTYPE);

template <int OP>
__global__ void __launch_bounds__(brg_rk_launch::MAX_THREADS) ring_kernel(const brg__rk_args a) {
  brg_rk::run_op<D, OP>(a);
}

/* The bitwise ops' kernels exist for integer dtypes only. */
template <int OP> constexpr kernel_fn bitwise_kernel() {
  if constexpr (D::integer)
    return ring_kernel<OP>;
  else
    return nullptr;
}

static_assert(BRG_SUM == 0 && BRG_PROD == 1 && BRG_MIN == 2 && BRG_MAX == 3 && BRG_AVG == 4 &&
                  BRG_BAND == 5 && BRG_BOR == 6 && BRG_BXOR == 7 && BRG_NUM_OPS == 8,
              "the table lists the ops in brg_op's order");

} // namespace

namespace brg_rk_launch {

extern const kernel_fn BRG__RK_CAT(table_, BRG_RK_DTYPE)[BRG_NUM_OPS] = {
    ring_kernel<BRG_SUM>,      ring_kernel<BRG_PROD>,     ring_kernel<BRG_MIN>,
    ring_kernel<BRG_MAX>,      ring_kernel<BRG_AVG>,      bitwise_kernel<BRG_BAND>(),
    bitwise_kernel<BRG_BOR>(), bitwise_kernel<BRG_BXOR>()};

} // namespace brg_rk_launch
