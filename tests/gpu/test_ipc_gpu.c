/*
 * The cuda_ipc step mode, end to end on one GPU: N forked processes in a
 * ring, each with a FIFO of slots in its own device memory that the
 * previous process maps through CUDA IPC. Per slice, rank r copies its
 * input into the next rank's slot with the copy engine, records an
 * interprocess event and says so on the host; the next rank makes its
 * stream wait for that event and reduces the slot with its own input.
 * Credits travel back the same way. No kernel waits on another process, so
 * this cannot hang when the kernels of the processes are time-sliced
 * (no MPS). Every element of out = input(prev) + input(self) is checked
 * against the CPU kernel, for float32 and bfloat16 sum and int32 max.
 *
 *   test_ipc_gpu N     (N >= 2; exits 77 when there is no GPU)
 */
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "brigade.h"
#include "device.h"
#include "kernels.h"

#define SKIP 77
#define NSLOTS 4
#define SLOT_BYTES ((size_t)1 << 20)
#define HB BRG__CUDA_IPC_HANDLE_BYTES

static const brg__cuda_api *api;
static int rank_id;

#define CK(call)                                                                             \
  do {                                                                                       \
    int e_ = (call);                                                                         \
    if (e_ != 0) {                                                                           \
      fprintf(stderr, "rank %d: %s:%d: %s: %s\n", rank_id, __FILE__, __LINE__, #call,        \
              api->error_string(e_));                                                        \
      exit(1);                                                                               \
    }                                                                                        \
  } while (0)

static void xfer(int fd, void *buf, size_t n, int out) {
  char *p = buf;
  while (n) {
    ssize_t k = out ? write(fd, p, n) : read(fd, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      fprintf(stderr, "rank %d: control socket %s failed\n", rank_id, out ? "write" : "read");
      exit(1);
    }
    p += k;
    n -= (size_t)k;
  }
}

/* What a rank tells its previous rank (it writes into our FIFO) and its
 * next rank (it reads what we write). */
typedef struct {
  unsigned char fifo[HB];              /* our receive FIFO */
  unsigned char consumed[NSLOTS][HB];  /* we recorded: slot read, free again */
} to_prev_msg;
typedef struct {
  unsigned char filled[NSLOTS][HB];    /* we recorded: slot written */
} to_next_msg;

static int run_rank(int r, int n, int to_next, int from_prev, brg_dtype dt, brg_op op,
                    size_t count) {
  rank_id = r;
  size_t es = brg_dtype_size(dt), bytes = count * es;
  size_t slice = SLOT_BYTES / es;
  uint64_t seed = 0x9e3779b97f4a7c15ull ^ (uint64_t)dt << 8 ^ (uint64_t)op;

  /* Inputs: rank q's input is a function of q alone, so every rank can
   * rebuild its previous rank's input for the reference. */
  unsigned char *in[2], *want = malloc(bytes), *got = malloc(bytes);
  for (int k = 0; k < 2; k++) {
    int q = k == 0 ? r : (r + n - 1) % n;
    in[k] = malloc(bytes);
    uint64_t s = seed + (uint64_t)q * 0x100000001b3ull;
    for (size_t i = 0; i < bytes; i++) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      in[k][i] = (unsigned char)(s >> 56);
    }
    if (dt == BRG_BFLOAT16) /* keep exponents moderate: fewer NaNs, more arithmetic */
      for (size_t i = 1; i < bytes; i += 2) in[k][i] = (unsigned char)(0x3c + (in[k][i] & 7));
  }
  brg__reduce(want, NULL, in[1], in[0], count, dt, op, 1);

  void *stream, *d_in, *d_out, *fifo, *peer_fifo;
  void *filled[NSLOTS], *consumed[NSLOTS], *peer_filled[NSLOTS], *peer_consumed[NSLOTS];
  CK(api->stream_create(&stream));
  CK(api->mem_alloc(&d_in, bytes));
  CK(api->mem_alloc(&d_out, bytes));
  CK(api->mem_copy(d_in, in[0], bytes));
  to_prev_msg tp;
  to_next_msg tn;
  memset(&tp, 0, sizeof tp);
  memset(&tn, 0, sizeof tn);
  CK(api->ipc_mem_export(&fifo, NSLOTS * SLOT_BYTES, tp.fifo));
  for (int s = 0; s < NSLOTS; s++) {
    CK(api->ipc_event_export(&consumed[s], tp.consumed[s]));
    CK(api->ipc_event_export(&filled[s], tn.filled[s]));
  }
  /* Exchange: to_next and from_prev are the two ends of our links. */
  to_prev_msg from_next;
  to_next_msg from_prev_msg;
  xfer(from_prev, &tp, sizeof tp, 1);
  xfer(to_next, &tn, sizeof tn, 1);
  xfer(to_next, &from_next, sizeof from_next, 0);
  xfer(from_prev, &from_prev_msg, sizeof from_prev_msg, 0);
  CK(api->ipc_mem_open(&peer_fifo, from_next.fifo));
  for (int s = 0; s < NSLOTS; s++) {
    CK(api->ipc_event_open(&peer_consumed[s], from_next.consumed[s]));
    CK(api->ipc_event_open(&peer_filled[s], from_prev_msg.filled[s]));
  }

  size_t nsl = (count + slice - 1) / slice;
  for (size_t k = 0; k < nsl; k++) {
    int s = (int)(k % NSLOTS);
    size_t off = k * slice, m = count - off < slice ? count - off : slice;
    char msg;
    /* Send: wait for the credit of the slot, then copy into it. */
    if (k >= NSLOTS) {
      xfer(to_next, &msg, 1, 0);
      CK(api->stream_wait_event(stream, peer_consumed[s]));
    }
    CK(api->copy((char *)peer_fifo + (size_t)s * SLOT_BYTES, NULL, (char *)d_in + off * es,
                 m * es, stream));
    CK(api->event_record(filled[s], stream));
    msg = 'F';
    xfer(to_next, &msg, 1, 1);
    /* Receive: wait for the slot, reduce it with our input, hand it back. */
    xfer(from_prev, &msg, 1, 0);
    CK(api->stream_wait_event(stream, peer_filled[s]));
    CK(api->reduce((char *)d_out + off * es, NULL, (char *)fifo + (size_t)s * SLOT_BYTES,
                   (char *)d_in + off * es, m, dt, op, 1, stream));
    CK(api->event_record(consumed[s], stream));
    msg = 'C';
    xfer(from_prev, &msg, 1, 1);
  }
  CK(api->stream_sync(stream));
  /* The last credits are still in the sockets; read them so no rank exits
   * while its previous rank is still writing into its FIFO. */
  for (size_t k = 0; k < (nsl < NSLOTS ? nsl : NSLOTS); k++) {
    char msg;
    xfer(to_next, &msg, 1, 0);
  }
  CK(api->mem_copy(got, d_out, bytes));

  int bad = 0;
  if (memcmp(got, want, bytes) != 0) {
    size_t i = 0;
    while (got[i] == want[i]) i++;
    fprintf(stderr, "rank %d: %s %s count %zu: element %zu differs from the CPU result\n", r,
            brg_dtype_name(dt), brg_op_name(op), count, i / es);
    bad = 1;
  }
  /* Everyone stops using the peer's memory before anyone frees its own. */
  char bye = 'B';
  xfer(to_next, &bye, 1, 1);
  xfer(from_prev, &bye, 1, 0);
  for (int s = 0; s < NSLOTS; s++) {
    api->event_destroy(peer_filled[s]);
    api->event_destroy(peer_consumed[s]);
  }
  api->ipc_mem_close(peer_fifo);
  xfer(from_prev, &bye, 1, 1);
  xfer(to_next, &bye, 1, 0);
  for (int s = 0; s < NSLOTS; s++) {
    api->event_destroy(filled[s]);
    api->event_destroy(consumed[s]);
  }
  api->mem_free(fifo);
  api->mem_free(d_in);
  api->mem_free(d_out);
  api->stream_destroy(stream);
  for (int k = 0; k < 2; k++) free(in[k]);
  free(want);
  free(got);
  return bad;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 2;
  if (n < 2 || n > 16) {
    fprintf(stderr, "usage: test_ipc_gpu N (2..16)\n");
    return 2;
  }
  /* Cases: dtype, op, count (odd, and not a multiple of the slice). */
  static const struct { brg_dtype dt; brg_op op; size_t count; } cases[] = {
      {BRG_FLOAT32, BRG_SUM, (9u << 20) / 4 + 3},
      {BRG_BFLOAT16, BRG_SUM, (5u << 20) / 2 + 1},
      {BRG_INT32, BRG_MAX, 1001},
  };
  int socks[16][2];
  for (int r = 0; r < n; r++)
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, socks[r]) != 0) return 1;
  /* Fork first: CUDA must not be initialised in a process that forks. */
  pid_t pids[16];
  for (int r = 0; r < n; r++) {
    pids[r] = fork();
    if (pids[r] < 0) return 1;
    if (pids[r] == 0) {
      alarm(120);
      const char *why = "";
      api = brg__device_api(&why);
      if (!api) {
        if (r == 0) printf("test_ipc_gpu: skipped: %s\n", why);
        fflush(stdout);
        _exit(SKIP);
      }
      int to_next = socks[r][0], from_prev = socks[(r + n - 1) % n][1];
      int bad = 0;
      for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        bad |= run_rank(r, n, to_next, from_prev, cases[c].dt, cases[c].op, cases[c].count);
      fflush(stdout);
      _exit(bad);
    }
  }
  int skipped = 0, failed = 0;
  for (int r = 0; r < n; r++) {
    int st = 0;
    waitpid(pids[r], &st, 0);
    if (WIFEXITED(st) && WEXITSTATUS(st) == SKIP) skipped++;
    else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      fprintf(stderr, "rank %d failed (%s %d)\n", r, WIFEXITED(st) ? "exit" : "signal",
              WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
      failed++;
    }
  }
  if (failed) {
    for (int r = 0; r < n; r++) kill(pids[r], SIGKILL);
    return 1;
  }
  if (skipped) return SKIP;
  printf("test_ipc_gpu: %d ranks on one GPU, step mode, results bit-equal to the CPU\n", n);
  return 0;
}
