/* all_reduce_perf: times brg_allreduce (see common.c for the driver). */
#include "common.h"

static brg_status run(const bench_call *c) {
  return brg_allreduce(c->send, c->recv, c->count, c->dtype, c->op, c->comm, c->stream);
}

int main(int argc, char **argv) {
  static const bench_coll coll = {
      .name = "all_reduce", .kind = BENCH_ALLREDUCE, .run = run, .call_name = "brg_allreduce"};
  return bench_main(argc, argv, &coll);
}
