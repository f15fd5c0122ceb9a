/*
 * What a collective called with a stream answers, on any machine:
 *
 * - without a usable GPU (no module, no driver, no device): every
 *   collective returns BRG_ERR_UNAVAILABLE and the last error names the
 *   missing piece, while host collectives on the same communicator work;
 * - with a GPU: host buffers with a stream and a mix of host and device
 *   buffers are BRG_ERR_INVALID_ARGUMENT; device buffers run on their
 *   stream, or with stream NULL on the legacy default stream (as NCCL takes
 *   stream 0); buffers on two GPUs are BRG_ERR_INVALID_ARGUMENT, and a
 *   communicator used on a second GPU is BRG_ERR_INVALID_USAGE naming both
 *   (with two GPUs, which the emulated module has); gather and scatter on
 *   device buffers have their result in place when they return, and refuse
 *   a stream that captures a graph.
 *
 * This test runs everywhere (it never skips); with BRIGADE_CUDA_MODULE
 * naming the emulated module it takes the GPU branch without a GPU.
 */
#include <stdio.h>
#include <string.h>

#include "brigade.h"
#include "device.h"

static int failures;

#define EXPECT(cond, ...)                                                                          \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      fprintf(stderr, "FAIL: " __VA_ARGS__);                                                       \
      fprintf(stderr, "\n");                                                                       \
      failures++;                                                                                  \
    }                                                                                              \
  } while (0)

static void expect_status(brg_comm *c, const char *what, brg_status got, brg_status want,
                          const char *needle) {
  const char *msg = brg_comm_last_error(c);
  printf("%-40s -> %s: %s\n", what, brg_status_string(got), got == BRG_SUCCESS ? "" : msg);
  EXPECT(got == want, "%s returned %s, expected %s", what, brg_status_string(got),
         brg_status_string(want));
  if (needle)
    EXPECT(strstr(msg, needle) != NULL, "%s: message \"%s\" lacks \"%s\"", what, msg, needle);
}

/* Every collective with a stream on buffers a and b (count elements). */
static void all_collectives(brg_comm *c, void *a, void *b, size_t n, brg_status want,
                            const char *needle) {
  brg_stream st = (brg_stream)(uintptr_t)0x1; /* never used: the calls stop at the check */
  expect_status(c, "brg_allreduce(stream)", brg_allreduce(a, b, n, BRG_FLOAT32, BRG_SUM, c, st),
                want, needle);
  expect_status(c, "brg_reduce_scatter(stream)",
                brg_reduce_scatter(a, b, n, BRG_FLOAT32, BRG_SUM, c, st), want, needle);
  expect_status(c, "brg_all_gather(stream)", brg_all_gather(a, b, n, BRG_FLOAT32, c, st), want,
                needle);
  expect_status(c, "brg_broadcast(stream)", brg_broadcast(a, b, n, BRG_FLOAT32, 0, c, st), want,
                needle);
  expect_status(c, "brg_reduce(stream)", brg_reduce(a, b, n, BRG_FLOAT32, BRG_MAX, 0, c, st), want,
                needle);
}

int main(void) {
  brg_unique_id id;
  brg_comm *c = NULL;
  if (brg_get_unique_id(&id) != BRG_SUCCESS || brg_comm_init(&c, 1, &id, 0) != BRG_SUCCESS) {
    fprintf(stderr, "cannot build a one-rank communicator: %s\n", brg_comm_last_error(NULL));
    return 1;
  }
  float host_a[64], host_b[64];
  for (int i = 0; i < 64; i++) host_a[i] = (float)i;

  const char *why = "";
  const brg__cuda_api *api = brg__device_api(&why);
  printf("device: %s\n", api ? "usable GPU" : why);
  if (!api) {
    all_collectives(c, host_a, host_b, 64, BRG_ERR_UNAVAILABLE, why);
  } else {
    all_collectives(c, host_a, host_b, 64, BRG_ERR_INVALID_ARGUMENT, "host memory");
    void *da = NULL, *db = NULL, *st = NULL;
    if (api->drv.mem_alloc(&da, 256) || api->drv.mem_alloc(&db, 256) ||
        api->drv.stream_create(&st)) {
      EXPECT(0, "cudaMalloc or cudaStreamCreate failed");
    } else {
      char want[512];
      snprintf(want, sizeof want,
               "brg_allreduce: recvbuf %p is GPU memory (device 0) but sendbuf %p is host memory: "
               "both buffers must be on the GPU (with a stream, or NULL for the legacy default "
               "stream) or both in host memory (stream NULL)",
               db, (void *)host_a);
      expect_status(c, "brg_allreduce(host send, device recv, no stream)",
                    brg_allreduce(host_a, db, 64, BRG_FLOAT32, BRG_SUM, c, NULL),
                    BRG_ERR_INVALID_ARGUMENT, want);
      expect_status(c, "brg_allreduce(host send, device recv)",
                    brg_allreduce(host_a, db, 64, BRG_FLOAT32, BRG_SUM, c, st),
                    BRG_ERR_INVALID_ARGUMENT, "host memory");
      expect_status(c, "brg_broadcast(device send, host recv)",
                    brg_broadcast(da, host_b, 64, BRG_FLOAT32, 0, c, st), BRG_ERR_INVALID_ARGUMENT,
                    "host memory");
      api->drv.mem_copy(da, host_a, sizeof host_a);
      api->drv.mem_set(db, 0, sizeof host_b);
      expect_status(c, "brg_allreduce(device, stream)",
                    brg_allreduce(da, db, 64, BRG_FLOAT32, BRG_SUM, c, st), BRG_SUCCESS, NULL);
      EXPECT(api->drv.stream_sync(st) == 0, "stream synchronize");
      memset(host_b, 0, sizeof host_b);
      api->drv.mem_copy(host_b, db, sizeof host_b);
      for (int i = 0; i < 64; i++) EXPECT(host_b[i] == (float)i, "device allreduce element %d", i);

      /* Stream 0: device buffers on the legacy default stream. */
      for (int i = 0; i < 64; i++) host_a[i] = (float)(3 * i);
      api->drv.mem_copy(da, host_a, sizeof host_a);
      api->drv.mem_set(db, 0, sizeof host_b);
      expect_status(c, "brg_allreduce(device, stream 0)",
                    brg_allreduce(da, db, 64, BRG_FLOAT32, BRG_SUM, c, NULL), BRG_SUCCESS, NULL);
      EXPECT(api->drv.stream_sync(NULL) == 0, "legacy stream synchronize");
      memset(host_b, 0, sizeof host_b);
      api->drv.mem_copy(host_b, db, sizeof host_b);
      for (int i = 0; i < 64; i++)
        EXPECT(host_b[i] == (float)(3 * i), "stream-0 allreduce element %d", i);

      /* The non-blocking forms take host buffers only. */
      brg_request rq;
      expect_status(c, "brg_iallreduce(device)",
                    brg_iallreduce(da, db, 64, BRG_FLOAT32, BRG_SUM, c, &rq),
                    BRG_ERR_INVALID_ARGUMENT, "brg_iallreduce: the buffers are GPU memory");
      expect_status(c, "brg_ireduce_scatter(device)",
                    brg_ireduce_scatter(da, db, 64, BRG_FLOAT32, BRG_SUM, c, &rq),
                    BRG_ERR_INVALID_ARGUMENT, "brg_ireduce_scatter: the buffers are GPU memory");
      expect_status(c, "brg_iall_gather(device)", brg_iall_gather(da, db, 64, BRG_FLOAT32, c, &rq),
                    BRG_ERR_INVALID_ARGUMENT, "brg_iall_gather: the buffers are GPU memory");
      expect_status(c, "brg_ibroadcast(device)", brg_ibroadcast(da, db, 64, BRG_FLOAT32, 0, c, &rq),
                    BRG_ERR_INVALID_ARGUMENT, "brg_ibroadcast: the buffers are GPU memory");
      expect_status(c, "brg_ireduce(device)",
                    brg_ireduce(da, db, 64, BRG_FLOAT32, BRG_SUM, 0, c, &rq),
                    BRG_ERR_INVALID_ARGUMENT, "brg_ireduce: the buffers are GPU memory");
      expect_status(c, "brg_ireduce(host send, device recv)",
                    brg_ireduce(host_a, db, 64, BRG_FLOAT32, BRG_SUM, 0, c, &rq),
                    BRG_ERR_INVALID_ARGUMENT, "host memory");

      /* gather and scatter on GPU buffers, staged through host memory: the
       * result is in place when the call returns (one rank: its block). A
       * stream that captures a graph, and the non-blocking forms, refuse. */
      for (int i = 0; i < 64; i++) host_a[i] = (float)(5 * i + 1);
      api->drv.mem_copy(da, host_a, sizeof host_a);
      api->drv.mem_set(db, 0, sizeof host_b);
      expect_status(c, "brg_gather(device, stream)", brg_gather(da, db, 64, BRG_FLOAT32, 0, c, st),
                    BRG_SUCCESS, NULL);
      memset(host_b, 0, sizeof host_b);
      api->drv.mem_copy(host_b, db, sizeof host_b);
      for (int i = 0; i < 64; i++)
        EXPECT(host_b[i] == (float)(5 * i + 1), "device gather element %d", i);
      api->drv.mem_set(da, 0, sizeof host_a);
      expect_status(c, "brg_scatter(device, stream 0)",
                    brg_scatter(db, da, 64, BRG_FLOAT32, 0, c, NULL), BRG_SUCCESS, NULL);
      memset(host_b, 0, sizeof host_b);
      api->drv.mem_copy(host_b, da, sizeof host_b);
      for (int i = 0; i < 64; i++)
        EXPECT(host_b[i] == (float)(5 * i + 1), "device scatter element %d", i);
      expect_status(c, "brg_gather(host, stream)",
                    brg_gather(host_a, host_b, 64, BRG_FLOAT32, 0, c, st), BRG_ERR_INVALID_ARGUMENT,
                    "host memory");
      expect_status(c, "brg_igather(device)", brg_igather(da, db, 64, BRG_FLOAT32, 0, c, &rq),
                    BRG_ERR_INVALID_ARGUMENT,
                    "brg_igather: the buffers are GPU memory: the non-blocking form takes host "
                    "buffers (the blocking form takes GPU buffers, staged through host memory)");
      if (api->drv.capture_begin(st, 1) == 0) {
        expect_status(c, "brg_scatter(device, capturing)",
                      brg_scatter(db, da, 64, BRG_FLOAT32, 0, c, st), BRG_ERR_INVALID_USAGE,
                      "staged through host memory by the calling thread");
        void *graph = NULL;
        EXPECT(api->drv.capture_end(st, &graph) == 0, "capture_end");
        if (graph) api->drv.graph_destroy(graph);
      } else {
        EXPECT(0, "capture_begin failed");
      }

      /* A second GPU: buffers split across two GPUs, then a communicator
       * that has run on GPU 0 given buffers on GPU 1. */
      int ndev = api->drv.probe(NULL, 0);
      void *d1 = NULL;
      if (ndev >= 2 && api->drv.set_device(1) == 0 && api->drv.mem_alloc(&d1, 256) == 0) {
        api->drv.set_device(0);
        snprintf(want, sizeof want,
                 "brg_allreduce: sendbuf %p is on GPU 0 but recvbuf %p on GPU 1: a collective's "
                 "buffers must be on one GPU",
                 da, d1);
        expect_status(c, "brg_allreduce(GPU 0 send, GPU 1 recv)",
                      brg_allreduce(da, d1, 64, BRG_FLOAT32, BRG_SUM, c, st),
                      BRG_ERR_INVALID_ARGUMENT, want);
        snprintf(want, sizeof want,
                 "brg_allreduce: this communicator runs its device collectives on GPU 0, but "
                 "sendbuf %p is on GPU 1: use one communicator per GPU",
                 d1);
        expect_status(c, "brg_allreduce(GPU 1 buffers)",
                      brg_allreduce(d1, d1, 64, BRG_FLOAT32, BRG_SUM, c, NULL),
                      BRG_ERR_INVALID_USAGE, want);
        api->drv.mem_free(d1);
      } else {
        api->drv.set_device(0);
        printf("one GPU: the two-GPU cases are not run\n");
      }
      api->drv.stream_destroy(st);
    }
    api->drv.mem_free(da);
    api->drv.mem_free(db);
  }

  /* The host path is untouched by the failed device calls. */
  expect_status(c, "brg_allreduce(host)",
                brg_allreduce(host_a, host_b, 64, BRG_FLOAT32, BRG_SUM, c, NULL), BRG_SUCCESS,
                NULL);
  for (int i = 0; i < 64; i++) EXPECT(host_b[i] == host_a[i], "host allreduce element %d", i);
  brg_comm_destroy(c);
  if (failures) return 1;
  printf("test_device_calls: ok\n");
  return 0;
}
