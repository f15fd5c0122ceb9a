/*
 * The cuda_ipc step mode, end to end on one GPU: N forked processes in a
 * ring, each with a FIFO of slots in its own device memory that the
 * previous process maps through CUDA IPC. Per slice, rank r copies its
 * input into the next rank's slot with the copy engine, records an
 * interprocess event and says so on the host; the next rank makes its
 * stream wait for that event and reduces the slot with its own input.
 * Credits travel back the same way. No kernel waits on another process, so
 * this cannot hang when the kernels of the processes are time-sliced
 * (no MPS). Every element of out = input(prev) (op) input(self) is checked
 * against the CPU kernel (same_bits.h), for float32 and bfloat16 sum and
 * int32 max.
 *
 *   test_ipc_gpu N                  (N >= 2; exits 77 when there is no GPU)
 *   test_ipc_gpu N bench [bytes [slot_bytes]]   (the allreduce timed; see bench_rank)
 *
 * With BRG_TEST_FAKE_DEVICE=1 it runs on the CPU instead (see fake_api).
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "brigade.h"
#include "device.h"
#include "kernels.h"
#include "schedule.h"
#include "same_bits.h"

#define SKIP 77
#define NSLOTS 4
#define HB BRG__CUDA_IPC_HANDLE_BYTES

static const brg__cuda_api *api;
static size_t slot_bytes = (size_t)1 << 20; /* bench mode may change it */
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

/*
 * BRG_TEST_FAKE_DEVICE=1: the same test over a stand-in for the CUDA module
 * that works on host memory (POSIX shared memory for the IPC FIFOs, copies
 * and reductions done at once by the CPU kernels, events as no-ops since
 * the work is finished when it is enqueued). It checks the host side of
 * the protocol (the schedule, slot reuse, credits, the reference) on
 * machines without a GPU; the GPU run adds the stream and event ordering.
 */
#define FAKE_MAPS 64
static struct { void *p; size_t bytes; char name[48]; int owner; } fake_maps[FAKE_MAPS];

static void fake_map_add(void *p, size_t bytes, const char *name, int owner) {
  for (int i = 0; i < FAKE_MAPS; i++)
    if (!fake_maps[i].p) {
      fake_maps[i].p = p;
      fake_maps[i].bytes = bytes;
      snprintf(fake_maps[i].name, sizeof fake_maps[i].name, "%s", name);
      fake_maps[i].owner = owner;
      return;
    }
  abort();
}
static int fake_unmap(void *p) {
  for (int i = 0; i < FAKE_MAPS; i++)
    if (fake_maps[i].p == p) {
      munmap(p, fake_maps[i].bytes);
      if (fake_maps[i].owner) shm_unlink(fake_maps[i].name);
      fake_maps[i].p = NULL;
      return 1;
    }
  return 0;
}
static int fake_probe(char *why, size_t n) { (void)why; (void)n; return 1; }
static void fake_describe(char *out, size_t n) { snprintf(out, n, "fake device (host memory)"); }
static const char *fake_error_string(int e) { return e ? "fake device error" : "no error"; }
static int fake_pointer_is_device(const void *p, int *d) { (void)p; (void)d; return 1; }
static int fake_reduce(void *d0, void *d1, const void *a, const void *b, size_t n, int dt, int op,
                       int div, void *st) {
  (void)st;
  brg__reduce(d0, d1, a, b, n, (brg_dtype)dt, (brg_op)op, div);
  return 0;
}
static int fake_copy(void *d0, void *d1, const void *s, size_t bytes, void *st) {
  (void)st;
  brg__copy(d0, d1, s, bytes);
  return 0;
}
static int fake_divide(void *d, const void *s, size_t n, int dt, int div, void *st) {
  (void)st;
  brg__divide(d, s, n, (brg_dtype)dt, div);
  return 0;
}
static int fake_alloc(void **p, size_t bytes) { *p = malloc(bytes ? bytes : 1); return *p ? 0 : 1; }
static int fake_free(void *p) {
  if (!fake_unmap(p)) free(p);
  return 0;
}
static int fake_mem_copy(void *d, const void *s, size_t b) { memmove(d, s, b); return 0; }
static int fake_mem_set(void *p, int v, size_t b) { memset(p, v, b); return 0; }
static int fake_nop1(void *x) { (void)x; return 0; }
static int fake_nop2(void *x, void *y) { (void)x; (void)y; return 0; }
static int fake_last_error(void) { return 0; }
static int fake_mem_export(void **p, size_t bytes, void *handle) {
  static int serial;
  char name[48];
  snprintf(name, sizeof name, "/brg-test-fakegpu-%d-%d", (int)getpid(), serial++);
  int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0 || ftruncate(fd, (off_t)bytes) != 0) return 1;
  void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (m == MAP_FAILED) return 1;
  memset(handle, 0, HB);
  memcpy(handle, &bytes, sizeof bytes);
  snprintf((char *)handle + 8, HB - 8, "%s", name);
  fake_map_add(m, bytes, name, 1);
  *p = m;
  return 0;
}
static int fake_mem_open(void **p, const void *handle) {
  size_t bytes;
  memcpy(&bytes, handle, sizeof bytes);
  const char *name = (const char *)handle + 8;
  int fd = shm_open(name, O_RDWR, 0);
  if (fd < 0) return 1;
  void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (m == MAP_FAILED) return 1;
  fake_map_add(m, bytes, name, 0);
  *p = m;
  return 0;
}
static int fake_mem_close(void *p) { return fake_unmap(p) ? 0 : 1; }
static int fake_event_export(void **ev, void *handle) {
  *ev = (void *)1;
  memset(handle, 0, HB);
  return 0;
}
static int fake_event_open(void **ev, const void *handle) {
  (void)handle;
  *ev = (void *)1;
  return 0;
}
static int fake_stream_create(void **st) { *st = (void *)1; return 0; }
static int fake_uuid(unsigned char u[16]) { memset(u, 0, 16); return 0; }

static const brg__cuda_api fake_api = {
    .abi = BRG__CUDA_ABI,
    .probe = fake_probe,
    .describe = fake_describe,
    .error_string = fake_error_string,
    .pointer_is_device = fake_pointer_is_device,
    .reduce = fake_reduce,
    .copy = fake_copy,
    .divide = fake_divide,
    .mem_alloc = fake_alloc,
    .mem_free = fake_free,
    .mem_copy = fake_mem_copy,
    .mem_set = fake_mem_set,
    .stream_sync = fake_nop1,
    .last_error = fake_last_error,
    .ipc_mem_export = fake_mem_export,
    .ipc_mem_open = fake_mem_open,
    .ipc_mem_close = fake_mem_close,
    .ipc_event_export = fake_event_export,
    .ipc_event_open = fake_event_open,
    .event_destroy = fake_nop1,
    .event_record = fake_nop2,
    .stream_wait_event = fake_nop2,
    .event_sync = fake_nop1,
    .stream_create = fake_stream_create,
    .stream_destroy = fake_nop1,
    .device_uuid = fake_uuid,
};

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

/* Both directions of one rank's place in the ring: the device FIFO it
 * receives into, the next rank's FIFO it writes into, the events that
 * order the two, and the host sockets that say when to wait for which. */
typedef struct {
  int rank, nranks;
  int to_next, from_prev;
  void *stream;
  void *fifo, *peer_fifo;
  void *filled[NSLOTS], *consumed[NSLOTS];          /* ours, exported */
  void *peer_filled[NSLOTS], *peer_consumed[NSLOTS]; /* the neighbours' */
  uint64_t spos, rpos;                              /* slots sent / received */
} link_t;

static void link_open(link_t *l, int r, int n, int to_next, int from_prev) {
  memset(l, 0, sizeof *l);
  l->rank = r;
  l->nranks = n;
  l->to_next = to_next;
  l->from_prev = from_prev;
  CK(api->stream_create(&l->stream));
  to_prev_msg tp, from_next;
  to_next_msg tn, from_prev_msg;
  memset(&tp, 0, sizeof tp);
  memset(&tn, 0, sizeof tn);
  CK(api->ipc_mem_export(&l->fifo, NSLOTS * slot_bytes, tp.fifo));
  for (int s = 0; s < NSLOTS; s++) {
    CK(api->ipc_event_export(&l->consumed[s], tp.consumed[s]));
    CK(api->ipc_event_export(&l->filled[s], tn.filled[s]));
  }
  xfer(from_prev, &tp, sizeof tp, 1);
  xfer(to_next, &tn, sizeof tn, 1);
  xfer(to_next, &from_next, sizeof from_next, 0);
  xfer(from_prev, &from_prev_msg, sizeof from_prev_msg, 0);
  CK(api->ipc_mem_open(&l->peer_fifo, from_next.fifo));
  for (int s = 0; s < NSLOTS; s++) {
    CK(api->ipc_event_open(&l->peer_consumed[s], from_next.consumed[s]));
    CK(api->ipc_event_open(&l->peer_filled[s], from_prev_msg.filled[s]));
  }
}

/* Send side: a free slot of the next rank's FIFO, with our stream ordered
 * after the next rank's last read of it. */
static char *send_acquire(link_t *l) {
  int s = (int)(l->spos % NSLOTS);
  if (l->spos >= NSLOTS) {
    char msg;
    xfer(l->to_next, &msg, 1, 0);
    CK(api->stream_wait_event(l->stream, l->peer_consumed[s]));
  }
  return (char *)l->peer_fifo + (size_t)s * slot_bytes;
}
static void send_post(link_t *l) {
  char msg = 'F';
  CK(api->event_record(l->filled[l->spos % NSLOTS], l->stream));
  xfer(l->to_next, &msg, 1, 1);
  l->spos++;
}
/* Receive side: the next filled slot of our FIFO, our stream ordered after
 * the previous rank's write of it. */
static const char *recv_acquire(link_t *l) {
  int s = (int)(l->rpos % NSLOTS);
  char msg;
  xfer(l->from_prev, &msg, 1, 0);
  CK(api->stream_wait_event(l->stream, l->peer_filled[s]));
  return (const char *)l->fifo + (size_t)s * slot_bytes;
}
static void recv_release(link_t *l) {
  char msg = 'C';
  CK(api->event_record(l->consumed[l->rpos % NSLOTS], l->stream));
  xfer(l->from_prev, &msg, 1, 1);
  l->rpos++;
}

static void link_close(link_t *l) {
  CK(api->stream_sync(l->stream));
  /* Credits for the last slots are still in the socket. */
  for (uint64_t k = 0; k < (l->spos < NSLOTS ? l->spos : NSLOTS); k++) {
    char msg;
    xfer(l->to_next, &msg, 1, 0);
  }
  /* Everyone stops using the peer's memory before anyone frees its own. */
  char bye = 'B';
  xfer(l->to_next, &bye, 1, 1);
  xfer(l->from_prev, &bye, 1, 0);
  for (int s = 0; s < NSLOTS; s++) {
    api->event_destroy(l->peer_filled[s]);
    api->event_destroy(l->peer_consumed[s]);
  }
  api->ipc_mem_close(l->peer_fifo);
  xfer(l->from_prev, &bye, 1, 1);
  xfer(l->to_next, &bye, 1, 0);
  for (int s = 0; s < NSLOTS; s++) {
    api->event_destroy(l->filled[s]);
    api->event_destroy(l->consumed[s]);
  }
  api->mem_free(l->fifo);
  api->stream_destroy(l->stream);
}

/* Rank q's input: a function of q alone, so every rank can rebuild all of
 * them for its reference. */
static void make_input(unsigned char *p, size_t bytes, int q, brg_dtype dt, brg_op op) {
  uint64_t s = (0x9e3779b97f4a7c15ull ^ (uint64_t)dt << 8 ^ (uint64_t)op) +
               (uint64_t)q * 0x100000001b3ull;
  for (size_t i = 0; i < bytes; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    p[i] = (unsigned char)(s >> 56);
  }
  if (dt == BRG_BFLOAT16 || dt == BRG_FLOAT16) /* moderate exponents: more arithmetic, fewer NaNs */
    for (size_t i = 1; i < bytes; i += 2) p[i] = (unsigned char)(0x3c + (p[i] & 7));
}

static int check(const char *what, const unsigned char *got, const unsigned char *want,
                 size_t count, size_t es, brg_dtype dt, brg_op op) {
  size_t diff = brg_test_first_diff(got, want, count, es, dt, op);
  if (diff == count) return 0;
  fprintf(stderr, "rank %d: %s %s %s count %zu: element %zu differs from the CPU result\n",
          rank_id, what, brg_dtype_name(dt), brg_op_name(op), count, diff);
  return 1;
}

/* Neighbour exchange: out = input(prev) (op) input(self), slice by slice. */
static int neighbour_case(link_t *l, brg_dtype dt, brg_op op, size_t count) {
  int r = l->rank, n = l->nranks;
  size_t es = brg_dtype_size(dt), bytes = count * es, slice = slot_bytes / es;
  unsigned char *mine = malloc(bytes), *prev = malloc(bytes), *want = malloc(bytes),
                *got = malloc(bytes);
  make_input(mine, bytes, r, dt, op);
  make_input(prev, bytes, (r + n - 1) % n, dt, op);
  brg__reduce(want, NULL, prev, mine, count, dt, op, 1);
  void *d_in, *d_out;
  CK(api->mem_alloc(&d_in, bytes));
  CK(api->mem_alloc(&d_out, bytes));
  CK(api->mem_copy(d_in, mine, bytes));
  for (size_t off = 0; off < count; off += slice) {
    size_t m = count - off < slice ? count - off : slice;
    char *slot = send_acquire(l);
    CK(api->copy(slot, NULL, (char *)d_in + off * es, m * es, l->stream));
    send_post(l);
    const char *in = recv_acquire(l);
    CK(api->reduce((char *)d_out + off * es, NULL, in, (char *)d_in + off * es, m, dt, op, 1,
                   l->stream));
    recv_release(l);
  }
  CK(api->stream_sync(l->stream));
  CK(api->mem_copy(got, d_out, bytes));
  int bad = check("neighbour", got, want, count, es, dt, op);
  api->mem_free(d_in);
  api->mem_free(d_out);
  free(mine);
  free(prev);
  free(want);
  free(got);
  return bad;
}

/*
 * Allreduce in step mode, following schedule.h slice by slice exactly as
 * the host engine (runtime/ring.c) does, with each primitive one copy or
 * reduce on the stream: a prototype of the device ring for ranks that
 * share a GPU. Positions are ranks here.
 */
static void allreduce_device(link_t *l, const char *in, char *out, size_t count, brg_dtype dt,
                             brg_op op) {
  int n = l->nranks, p = l->rank;
  size_t es = brg_dtype_size(dt), slice = slot_bytes / es;
  brg_op mid = op == BRG_AVG ? BRG_SUM : op;
  size_t max_slices = 0;
  for (int i = 0; i < n; i++) {
    size_t ns = brg__slice_total(brg__part_count(count, n, i), slice);
    if (ns > max_slices) max_slices = ns;
  }
  for (size_t sl = 0; sl < max_slices; sl++)
    for (int t = 0; t <= 2 * n - 2; t++) {
      int id = brg__ring_chunk(p, n, t);
      size_t cnt = brg__part_count(count, n, id);
      if (sl >= brg__slice_total(cnt, slice)) continue;
      size_t m = brg__slice_count(cnt, slice, sl);
      size_t e = brg__part_offset(count, n, id) + brg__slice_offset(sl, slice);
      const char *src = in + e * es;
      char *dst = out + e * es;
      brg__prim prim = brg__ring_prim(n, t);
      int recvs = prim != BRG__PRIM_SEND;
      int sends = prim != BRG__PRIM_RECV;
      const char *rslot = recvs ? recv_acquire(l) : NULL;
      char *sslot = sends ? send_acquire(l) : NULL;
      if (m) switch (prim) {
        case BRG__PRIM_SEND: CK(api->copy(sslot, NULL, src, m * es, l->stream)); break;
        case BRG__PRIM_RECV_REDUCE_SEND:
          CK(api->reduce(sslot, NULL, rslot, src, m, dt, mid, 1, l->stream));
          break;
        case BRG__PRIM_RECV_REDUCE_COPY_SEND:
          CK(api->reduce(dst, sslot, rslot, src, m, dt, op, n, l->stream));
          break;
        case BRG__PRIM_RECV_COPY_SEND: CK(api->copy(dst, sslot, rslot, m * es, l->stream)); break;
        case BRG__PRIM_RECV: CK(api->copy(dst, NULL, rslot, m * es, l->stream)); break;
        default: break;
        }
      if (sends) send_post(l);
      if (recvs) recv_release(l);
    }
}

static int allreduce_case(link_t *l, brg_dtype dt, brg_op op, size_t count, int in_place) {
  int n = l->nranks;
  size_t es = brg_dtype_size(dt), bytes = count * es;
  unsigned char *in = malloc(bytes ? bytes : 1), *acc = malloc(bytes ? bytes : 1),
                *want = malloc(bytes ? bytes : 1), *got = malloc(bytes ? bytes : 1);
  /* Reference in the ring's own order: chunk c starts at position c+1 and
   * ends at position c, which applies op (avg: sum, then divide by n). */
  brg_op mid = op == BRG_AVG ? BRG_SUM : op;
  for (int c = 0; c < n; c++) {
    size_t off = brg__part_offset(count, n, c) * es, cnt = brg__part_count(count, n, c);
    make_input(in, bytes, (c + 1) % n, dt, op);
    memcpy(acc + off, in + off, cnt * es);
    for (int j = 2; j < n; j++) {
      make_input(in, bytes, (c + j) % n, dt, op);
      brg__reduce(acc + off, NULL, acc + off, in + off, cnt, dt, mid, 1);
    }
    make_input(in, bytes, c, dt, op);
    brg__reduce(want + off, NULL, acc + off, in + off, cnt, dt, op, n);
  }
  make_input(in, bytes, l->rank, dt, op);
  void *d_in = NULL, *d_out = NULL;
  CK(api->mem_alloc(&d_in, bytes ? bytes : 16));
  CK(api->mem_alloc(&d_out, bytes ? bytes : 16));
  CK(api->mem_copy(d_in, in, bytes));
  CK(api->mem_set(d_out, 0xee, bytes));
  char *dout = in_place ? d_in : d_out;
  allreduce_device(l, d_in, dout, count, dt, op);
  CK(api->stream_sync(l->stream));
  CK(api->mem_copy(got, dout, bytes));
  int bad = check(in_place ? "allreduce in place" : "allreduce", got, want, count, es, dt, op);
  api->mem_free(d_in);
  api->mem_free(d_out);
  free(in);
  free(acc);
  free(want);
  free(got);
  return bad;
}

static int run_rank(int r, int n, int to_next, int from_prev) {
  rank_id = r;
  link_t l;
  link_open(&l, r, n, to_next, from_prev);
  int bad = 0;
  /* Counts: odd, not multiples of the slice, and smaller than the ring. */
  bad |= neighbour_case(&l, BRG_FLOAT32, BRG_SUM, (9u << 20) / 4 + 3);
  bad |= neighbour_case(&l, BRG_BFLOAT16, BRG_SUM, (5u << 20) / 2 + 1);
  bad |= neighbour_case(&l, BRG_INT32, BRG_MAX, 1001);
  static const struct { brg_dtype dt; brg_op op; size_t count; } ar[] = {
      {BRG_FLOAT32, BRG_SUM, 3000017}, {BRG_BFLOAT16, BRG_SUM, 1000003},
      {BRG_FLOAT32, BRG_AVG, 262147},  {BRG_INT64, BRG_PROD, 77777},
      {BRG_FLOAT16, BRG_MAX, 5},       {BRG_INT8, BRG_MIN, 1},
      {BRG_UINT32, BRG_SUM, 0},
  };
  for (size_t i = 0; i < sizeof ar / sizeof ar[0]; i++)
    for (int ip = 0; ip < 2; ip++) bad |= allreduce_case(&l, ar[i].dt, ar[i].op, ar[i].count, ip);
  link_close(&l);
  return bad;
}


static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* A token once around a second ring of sockets: no rank leaves before
 * every rank has arrived (after two rounds). */
static void ring_barrier(int bar_next, int bar_prev) {
  for (int round = 0; round < 2; round++) {
    char b = 'b';
    xfer(bar_next, &b, 1, 1);
    xfer(bar_prev, &b, 1, 0);
  }
}

/*
 * Bench mode: allreduce of `bytes` of float32 sum in step mode, every rank
 * on the same GPU. Prints the time per call and the HBM bytes all ranks
 * move per second (reads + writes of every copy and reduce: (6N-4)/N x
 * bytes per rank), next to a device-to-device copy measured alone (2 x
 * bytes per copy). Wall-clock timing around stream synchronisation; the
 * calls are large enough (default 256 MiB) for that to be accurate.
 */
static int bench_rank(int r, int n, int to_next, int from_prev, int bar_next, int bar_prev,
                      size_t bytes, int iters) {
  rank_id = r;
  link_t l;
  link_open(&l, r, n, to_next, from_prev);
  size_t count = bytes / 4;
  void *d_in, *d_out;
  CK(api->mem_alloc(&d_in, bytes));
  CK(api->mem_alloc(&d_out, bytes));
  CK(api->mem_set(d_in, 0, bytes));
  double copy_gbs = 0;
  if (r == 0) { /* the copy rate, with the other ranks idle */
    CK(api->copy(d_out, NULL, d_in, bytes, l.stream));
    CK(api->stream_sync(l.stream));
    double t0 = now_s();
    for (int i = 0; i < 5; i++) CK(api->copy(d_out, NULL, d_in, bytes, l.stream));
    CK(api->stream_sync(l.stream));
    copy_gbs = 5 * 2.0 * (double)bytes / (now_s() - t0) / 1e9;
  }
  ring_barrier(bar_next, bar_prev);
  allreduce_device(&l, d_in, d_out, count, BRG_FLOAT32, BRG_SUM); /* warm-up */
  CK(api->stream_sync(l.stream));
  ring_barrier(bar_next, bar_prev);
  double t0 = now_s();
  for (int i = 0; i < iters; i++) allreduce_device(&l, d_in, d_out, count, BRG_FLOAT32, BRG_SUM);
  CK(api->stream_sync(l.stream));
  ring_barrier(bar_next, bar_prev);
  double t = (now_s() - t0) / iters;
  if (r == 0) {
    double hbm = (double)(6 * n - 4) * (double)bytes / t / 1e9;
    printf("step-mode allreduce float32 sum, %d ranks on one GPU, %zu bytes, %zu-byte slots: "
           "%.3f ms per call, algbw %.1f GB/s, HBM %.1f GB/s = %.1f%% of the D2D copy rate "
           "(%.1f GB/s)\n", n, bytes, slot_bytes, t * 1e3, (double)bytes / t / 1e9, hbm,
           100.0 * hbm / copy_gbs, copy_gbs);
  }
  api->mem_free(d_in);
  api->mem_free(d_out);
  link_close(&l);
  return 0;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 2;
  int bench = argc > 2 && strcmp(argv[2], "bench") == 0;
  size_t bench_bytes = argc > 3 ? (size_t)strtoull(argv[3], NULL, 0) : (size_t)256 << 20;
  if (argc > 4) slot_bytes = (size_t)strtoull(argv[4], NULL, 0) & ~(size_t)255;
  if (slot_bytes < 256) slot_bytes = 256;
  if (n < 2 || n > 16 || (argc > 2 && !bench)) {
    fprintf(stderr, "usage: test_ipc_gpu N [bench [bytes [slot_bytes]]]   (N in 2..16)\n");
    return 2;
  }
  int socks[16][2], bars[16][2];
  for (int r = 0; r < n; r++)
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, socks[r]) != 0 ||
        socketpair(AF_UNIX, SOCK_STREAM, 0, bars[r]) != 0)
      return 1;
  /* Fork first: CUDA must not be initialised in a process that forks. */
  pid_t pids[16];
  for (int r = 0; r < n; r++) {
    pids[r] = fork();
    if (pids[r] < 0) return 1;
    if (pids[r] == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL); /* a parent killed by a time limit takes us along */
      alarm(bench ? 300 : 120);
      const char *why = "";
      const char *fake = getenv("BRG_TEST_FAKE_DEVICE");
      api = fake && *fake == '1' ? &fake_api : brg__device_api(&why);
      if (!api) {
        if (r == 0) printf("test_ipc_gpu: skipped: %s\n", why);
        fflush(stdout);
        _exit(SKIP);
      }
      int to_next = socks[r][0], from_prev = socks[(r + n - 1) % n][1];
      int bad = bench ? bench_rank(r, n, to_next, from_prev, bars[r][0],
                                   bars[(r + n - 1) % n][1], bench_bytes, 5)
                      : run_rank(r, n, to_next, from_prev);
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
  if (bench) return 0;
  const char *fake = getenv("BRG_TEST_FAKE_DEVICE");
  printf("test_ipc_gpu: %d ranks on %s, step mode: neighbour exchange and allreduce match the "
         "CPU\n", n, fake && *fake == '1' ? "the fake device (host memory)" : "one GPU");
  return 0;
}
