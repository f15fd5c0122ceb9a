/* all_gather_perf: times brg_all_gather (see common.c for the driver). */
#include "common.h"

static brg_status run(const bench_call *c) {
  return brg_all_gather(c->send, c->recv, c->count, c->dtype, c->comm, c->stream);
}

int main(int argc, char **argv) {
  static const bench_coll coll = {
      .name = "all_gather", .kind = BENCH_ALL_GATHER, .run = run, .call_name = "brg_all_gather"};
  return bench_main(argc, argv, &coll);
}
