/*
 * --peer gloo: Gloo's ring and ring-chunked allreduce over its TCP transport
 * (loopback), timed beside brigade under brigade-run.
 *
 * Rendezvous goes through a Gloo file store in a fresh directory that rank 0
 * creates and broadcasts over brigade. Gloo's algorithm objects are built for
 * one buffer and count (they allocate and register their inboxes then), so
 * gloo_prepare() builds them outside the timed loop and keeps the last ones.
 *
 * Gloo's ring algorithms work in place on a list of buffers: out-of-place
 * rows and the other collectives print n/a, as do bfloat16 and average,
 * which Gloo does not provide.
 */
#include "peer.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <chrono>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include <gloo/allreduce_ring.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/config.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/types.h>

namespace {

struct state {
  std::shared_ptr<gloo::rendezvous::Context> context;
  std::string dir;
  int rank = 0;
  /* the algorithm objects of the last gloo_prepare(), one per entry of algs */
  std::unique_ptr<gloo::Algorithm> alg[2];
  bench_peer_call key{};
  bool have_key = false;
};

state *g;

const char *const alg_names[] = {"ring", "chunked"};

template <typename T> const gloo::ReductionFunction<T> *gloo_fn(brg_op op) {
  switch (op) {
  case BRG_SUM: return gloo::ReductionFunction<T>::sum;
  case BRG_PROD: return gloo::ReductionFunction<T>::product;
  case BRG_MIN: return gloo::ReductionFunction<T>::min;
  case BRG_MAX: return gloo::ReductionFunction<T>::max;
  default: return nullptr;
  }
}

template <typename T>
std::unique_ptr<gloo::Algorithm> make_alg(int which, void *buf, size_t count, brg_op op) {
  std::vector<T *> ptrs{static_cast<T *>(buf)};
  if (which == 0)
    return std::unique_ptr<gloo::Algorithm>(
        new gloo::AllreduceRing<T>(g->context, ptrs, (int)count, gloo_fn<T>(op)));
  return std::unique_ptr<gloo::Algorithm>(
      new gloo::AllreduceRingChunked<T>(g->context, ptrs, (int)count, gloo_fn<T>(op)));
}

std::unique_ptr<gloo::Algorithm> make_typed(int which, const bench_call &c) {
  switch (c.dtype) {
  case BRG_INT8: return make_alg<int8_t>(which, c.recv, c.count, c.op);
  case BRG_UINT8: return make_alg<uint8_t>(which, c.recv, c.count, c.op);
  case BRG_INT32: return make_alg<int32_t>(which, c.recv, c.count, c.op);
  case BRG_UINT32: return make_alg<uint32_t>(which, c.recv, c.count, c.op);
  case BRG_INT64: return make_alg<int64_t>(which, c.recv, c.count, c.op);
  case BRG_UINT64: return make_alg<uint64_t>(which, c.recv, c.count, c.op);
  case BRG_FLOAT16: return make_alg<gloo::float16>(which, c.recv, c.count, c.op);
  case BRG_FLOAT32: return make_alg<float>(which, c.recv, c.count, c.op);
  case BRG_FLOAT64: return make_alg<double>(which, c.recv, c.count, c.op);
  default: return nullptr;
  }
}

/* Removes the store's files; the directory holds nothing else. */
void remove_store(const std::string &dir) {
  DIR *d = opendir(dir.c_str());
  if (d == nullptr) return;
  while (struct dirent *e = readdir(d)) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    unlink((dir + "/" + e->d_name).c_str());
  }
  closedir(d);
  rmdir(dir.c_str());
}

int open_peer(brg_comm *comm, int rank, int nranks) {
  char dir[256] = {0};
  if (rank == 0) {
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/brigade-gloo-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (mkdtemp(dir) == nullptr) {
      perror("peer gloo: mkdtemp");
      dir[0] = '\0';
    }
  }
  brg_status st = brg_broadcast(dir, dir, sizeof dir, BRG_UINT8, 0, comm, NULL);
  if (st != BRG_SUCCESS) {
    fprintf(stderr, "peer gloo: brg_broadcast (store directory) failed: %s\n",
            brg_comm_last_error(comm));
    return -1;
  }
  if (dir[0] == '\0') return -1;
  dir[sizeof dir - 1] = '\0';
  try {
    g = new state;
    g->dir = dir;
    g->rank = rank;
    gloo::transport::tcp::attr attr("127.0.0.1");
    auto dev = gloo::transport::tcp::CreateDevice(attr);
    gloo::rendezvous::FileStore store(dir);
    g->context = std::make_shared<gloo::rendezvous::Context>(rank, nranks);
    g->context->setTimeout(std::chrono::seconds(120));
    g->context->connectFullMesh(store, dev);
  } catch (const std::exception &e) {
    fprintf(stderr, "peer gloo: rank %d: connecting through %s failed: %s\n", rank, dir, e.what());
    return -1;
  }
  return 0;
}

const char *gloo_describe(void) {
  static char buf[64];
  snprintf(buf, sizeof buf, "Gloo %d.%d.%d, tcp transport on 127.0.0.1", GLOO_VERSION_MAJOR,
           GLOO_VERSION_MINOR, GLOO_VERSION_PATCH);
  return buf;
}

const char *unsupported(bench_kind kind, brg_dtype dt, brg_op op, int in_place) {
  if (kind != BENCH_ALLREDUCE) return "only Gloo's allreduce is wired up";
  if (!in_place) return "Gloo's ring allreduce works in place";
  if (dt == BRG_BFLOAT16) return "Gloo has no bfloat16 type";
  if (op == BRG_AVG) return "Gloo has no average op";
  return nullptr;
}

bool same_call(const bench_peer_call &a, const bench_peer_call &b) {
  return a.c.recv == b.c.recv && a.c.count == b.c.count && a.c.dtype == b.c.dtype &&
         a.c.op == b.c.op;
}

int gloo_prepare(const bench_peer_call *pc) {
  if (g->have_key && same_call(g->key, *pc)) return 0;
  try {
    for (int i = 0; i < 2; i++) g->alg[i].reset();
    for (int i = 0; i < 2; i++) g->alg[i] = make_typed(i, pc->c);
  } catch (const std::exception &e) {
    fprintf(stderr, "peer gloo: rank %d: building the algorithms failed: %s\n", g->rank, e.what());
    return -1;
  }
  if (!g->alg[0] || !g->alg[1]) return -1;
  g->key = *pc;
  g->have_key = true;
  return 0;
}

int gloo_run(const bench_peer_call *pc) {
  if (gloo_prepare(pc) != 0) return -1;
  try {
    g->alg[pc->alg]->run();
  } catch (const std::exception &e) {
    fprintf(stderr, "peer gloo: rank %d: %s allreduce failed: %s\n", g->rank, alg_names[pc->alg],
            e.what());
    return -1;
  }
  return 0;
}

void close_peer(void) {
  if (g == nullptr) return;
  for (int i = 0; i < 2; i++) g->alg[i].reset();
  g->context.reset();
  if (g->rank == 0) remove_store(g->dir);
  delete g;
  g = nullptr;
}

} // namespace

extern "C" const bench_peer bench_peer_gloo = {
    /* .name = */ "gloo",
    /* .launcher = */ "brigade-run -n N",
    /* .nalgs = */ 2,
    /* .algs = */ alg_names,
    /* .launch = */ nullptr,
    /* .open = */ open_peer,
    /* .describe = */ gloo_describe,
    /* .unsupported = */ unsupported,
    /* .prepare = */ gloo_prepare,
    /* .run = */ gloo_run,
    /* .close = */ close_peer,
    /* .finalize = */ nullptr,
};
