/* broadcast_perf: times brg_broadcast (see common.c for the driver). */
#include "common.h"

static brg_status run(const bench_call *c) {
  return brg_broadcast(c->send, c->recv, c->count, c->dtype, c->root, c->comm, c->stream);
}

int main(int argc, char **argv) {
  static const bench_coll coll = {
      .name = "broadcast", .kind = BENCH_BROADCAST, .run = run, .call_name = "brg_broadcast"};
  return bench_main(argc, argv, &coll);
}
