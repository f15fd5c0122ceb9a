/*
 * What a collective called with a stream answers, on any machine:
 *
 * - without a usable GPU (no module, no driver, no device): every
 *   collective returns BRG_ERR_UNAVAILABLE and the last error names the
 *   missing piece, while host collectives on the same communicator work;
 * - with a GPU: host buffers with a stream, device buffers without one
 *   and a mix of the two are BRG_ERR_INVALID_ARGUMENT; device buffers with
 *   a stream run (one rank: recvbuf = sendbuf, on the stream).
 *
 * This test runs everywhere (it never skips); with BRIGADE_CUDA_MODULE
 * naming the emulated module it takes the GPU branch without a GPU.
 */
#include <stdio.h>
#include <string.h>

#include "brigade.h"
#include "device.h"

static int failures;

#define EXPECT(cond, ...)                 \
  do {                                    \
    if (!(cond)) {                        \
      fprintf(stderr, "FAIL: " __VA_ARGS__); \
      fprintf(stderr, "\n");              \
      failures++;                         \
    }                                     \
  } while (0)

static void expect_status(brg_comm *c, const char *what, brg_status got, brg_status want,
                          const char *needle) {
  const char *msg = brg_comm_last_error(c);
  printf("%-40s -> %s: %s\n", what, brg_status_string(got), got == BRG_SUCCESS ? "" : msg);
  EXPECT(got == want, "%s returned %s, expected %s", what, brg_status_string(got),
         brg_status_string(want));
  if (needle) EXPECT(strstr(msg, needle) != NULL, "%s: message \"%s\" lacks \"%s\"", what, msg, needle);
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
  expect_status(c, "brg_reduce(stream)", brg_reduce(a, b, n, BRG_FLOAT32, BRG_MAX, 0, c, st),
                want, needle);
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
    if (api->mem_alloc(&da, 256) || api->mem_alloc(&db, 256) || api->stream_create(&st)) {
      EXPECT(0, "cudaMalloc or cudaStreamCreate failed");
    } else {
      expect_status(c, "brg_allreduce(device, no stream)",
                    brg_allreduce(da, db, 64, BRG_FLOAT32, BRG_SUM, c, NULL),
                    BRG_ERR_INVALID_ARGUMENT, "no stream was given");
      expect_status(c, "brg_allreduce(host send, device recv)",
                    brg_allreduce(host_a, db, 64, BRG_FLOAT32, BRG_SUM, c, st),
                    BRG_ERR_INVALID_ARGUMENT, "host memory");
      expect_status(c, "brg_broadcast(device send, host recv)",
                    brg_broadcast(da, host_b, 64, BRG_FLOAT32, 0, c, st),
                    BRG_ERR_INVALID_ARGUMENT, "host memory");
      api->mem_copy(da, host_a, sizeof host_a);
      api->mem_set(db, 0, sizeof host_b);
      expect_status(c, "brg_allreduce(device, stream)",
                    brg_allreduce(da, db, 64, BRG_FLOAT32, BRG_SUM, c, st), BRG_SUCCESS, NULL);
      EXPECT(api->stream_sync(st) == 0, "stream synchronize");
      memset(host_b, 0, sizeof host_b);
      api->mem_copy(host_b, db, sizeof host_b);
      for (int i = 0; i < 64; i++) EXPECT(host_b[i] == (float)i, "device allreduce element %d", i);
      api->stream_destroy(st);
    }
    api->mem_free(da);
    api->mem_free(db);
  }

  /* The host path is untouched by the failed device calls. */
  expect_status(c, "brg_allreduce(host)",
                brg_allreduce(host_a, host_b, 64, BRG_FLOAT32, BRG_SUM, c, NULL), BRG_SUCCESS,
                NULL);
  for (int i = 0; i < 64; i++) EXPECT(host_b[i] == (float)i, "host allreduce element %d", i);
  brg_comm_destroy(c);
  if (failures) return 1;
  printf("test_device_calls: ok\n");
  return 0;
}
