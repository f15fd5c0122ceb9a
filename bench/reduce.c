/* reduce_perf: times brg_reduce (see common.c for the driver). */
#include "common.h"

static brg_status run(const bench_call *c) {
  return brg_reduce(c->send, c->recv, c->count, c->dtype, c->op, c->root, c->comm, c->stream);
}

int main(int argc, char **argv) {
  static const bench_coll coll = {
      .name = "reduce", .kind = BENCH_REDUCE, .run = run, .call_name = "brg_reduce"};
  return bench_main(argc, argv, &coll);
}
