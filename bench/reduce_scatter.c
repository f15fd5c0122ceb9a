/* reduce_scatter_perf: times brg_reduce_scatter (see common.c for the driver). */
#include "common.h"

static brg_status run(const bench_call *c) {
  return brg_reduce_scatter(c->send, c->recv, c->count, c->dtype, c->op, c->comm, c->stream);
}

int main(int argc, char **argv) {
  static const bench_coll coll = {.name = "reduce_scatter",
                                  .kind = BENCH_REDUCE_SCATTER,
                                  .run = run,
                                  .call_name = "brg_reduce_scatter"};
  return bench_main(argc, argv, &coll);
}
