/*
 * Failure behaviour through the public API: bad arguments, corrupted ids,
 * foreign connections to the bootstrap root, ranks that never arrive, die,
 * stall or are aborted, mismatched collectives, incomplete environments.
 * Nothing may hang: every run has a deadline, and every error must come
 * with a message that names what went wrong.
 *
 *   test_errors CASE [N]
 *
 * CASE: args garbage garbage_open absent kill stop abort mismatch env log launch
 * threads.
 * The transport comes from BRIGADE_TRANSPORTS, the library timeout from
 * BRIGADE_TIMEOUT_MS (both set per test by meson).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"

extern char **environ;

static int g_timeout_ms; /* BRIGADE_TIMEOUT_MS of this test */

static double ms_since(int64_t t0) {
  return (double)(mp_now_ns() - t0) / 1e6;
}

static const char *errmsg(const brg_comm *c) {
  const char *m = brg_comm_last_error(c);
  return m ? m : "(null)";
}

static int nonempty(const char *m) {
  return m && *m;
}

/* ------------------------------------------------ simple value checking */

/* Each rank's input: (rank + 1) + (i % 13); the sum is exact in float32. */
static void fill_in(float *s, size_t count, int rank) {
  for (size_t i = 0; i < count; i++) s[i] = (float)(rank + 1) + (float)(i % 13);
}

static int check_sum(const float *r, size_t count, int n, size_t stride, const char *what) {
  for (size_t i = 0; i < count; i += stride) {
    float want = (float)(n * (n + 1) / 2) + (float)n * (float)(i % 13);
    if (r[i] != want) {
      mp_fail("%s: element %zu is %g, expected %g", what, i, r[i], want);
      return 0;
    }
  }
  return 1;
}

static int small_allreduce_ok(brg_comm *c, int rank, int n, const char *what) {
  float s[1000], r[1000];
  fill_in(s, 1000, rank);
  memset(r, 0, sizeof r);
  brg_status st = brg_allreduce(s, r, 1000, BRG_FLOAT32, BRG_SUM, c, NULL);
  if (st != BRG_SUCCESS) {
    mp_fail("%s: allreduce returned %s: %s", what, brg_status_string(st), errmsg(c));
    return 0;
  }
  return check_sum(r, 1000, n, 1, what);
}

/* ================================================================= args */

/* A bad call must return BRG_ERR_INVALID_ARGUMENT at once, with a message
 * of its own in brg_comm_last_error(comm_for_msg): before the call, another
 * bad call (`reset`) leaves a different message there, so a stale message
 * from an earlier failure does not pass. */
static char g_prev[1024];

static void remember(const brg_comm *c) {
  const char *m = brg_comm_last_error(c);
  snprintf(g_prev, sizeof g_prev, "%s", m ? m : "");
}

#define EXPECT_INVALID_R(reset, call, comm_for_msg)                                                \
  do {                                                                                             \
    (void)(reset);                                                                                 \
    remember(comm_for_msg);                                                                        \
    int64_t t0_ = mp_now_ns();                                                                     \
    brg_status st_ = (call);                                                                       \
    const char *m_ = brg_comm_last_error(comm_for_msg);                                            \
    MP_CHECK(st_ == BRG_ERR_INVALID_ARGUMENT, "%s returned %s, expected BRG_ERR_INVALID_ARGUMENT", \
             #call, brg_status_string(st_));                                                       \
    MP_CHECK(nonempty(m_), "%s: brg_comm_last_error(%s) is empty", #call, #comm_for_msg);          \
    MP_CHECK(!m_ || strcmp(m_, g_prev) != 0,                                                       \
             "%s failed but brg_comm_last_error(%s) still holds the previous message \"%s\"",      \
             #call, #comm_for_msg, g_prev);                                                        \
    MP_CHECK(ms_since(t0_) < 5000, "%s took %.0f ms to fail", #call, ms_since(t0_));               \
  } while (0)

/* Resets: a bad call on the communicator (root out of range), another one
 * for calls about roots (unknown dtype), and one with no communicator. */
#define RESET_C (brg_reduce(s, r, 10, BRG_FLOAT32, BRG_SUM, -1, c, NULL))
#define RESET_ROOT (brg_all_gather(s, r, 10, (brg_dtype)77, c, NULL))
#define RESET_NULL (brg_comm_init_env(NULL))
#define EXPECT_INVALID(call, comm_for_msg)                                                         \
  EXPECT_INVALID_R((comm_for_msg) ? RESET_C : RESET_NULL, call, comm_for_msg)

static int body_args_precomm(mp_ctx *ctx) {
  const brg_unique_id *id = ctx->id;
  brg_comm *const SENTINEL = (brg_comm *)(uintptr_t)0x1234;
  brg_comm *c;

  /* Helpers reject what is out of range. */
  MP_CHECK(brg_dtype_name((brg_dtype)99) == NULL, "brg_dtype_name(99) is not NULL");
  MP_CHECK(brg_op_name((brg_op)99) == NULL, "brg_op_name(99) is not NULL");
  MP_CHECK(brg_dtype_size((brg_dtype)99) == 0, "brg_dtype_size(99) is not 0");
  MP_CHECK(brg_dtype_size((brg_dtype)-1) == 0, "brg_dtype_size(-1) is not 0");
  for (int s = BRG_SUCCESS; s <= BRG_ERR_INTERNAL; s++)
    MP_CHECK(nonempty(brg_status_string((brg_status)s)), "brg_status_string(%d) is empty", s);

  /* The library's version: the header's, and the project's (meson). */
  int vmaj = -1, vmin = -1, vpat = -1;
  brg_status vs = brg_get_version(&vmaj, &vmin, &vpat);
  char vtext[64];
  snprintf(vtext, sizeof vtext, "%d.%d.%d", vmaj, vmin, vpat);
  MP_CHECK(vs == BRG_SUCCESS && vmaj == BRG_VERSION_MAJOR && vmin == BRG_VERSION_MINOR &&
               vpat == BRG_VERSION_PATCH && strcmp(vtext, MP_PROJECT_VERSION) == 0,
           "brg_get_version: %s, %s; the header says %d.%d.%d, meson.build %s",
           brg_status_string(vs), vtext, BRG_VERSION_MAJOR, BRG_VERSION_MINOR, BRG_VERSION_PATCH,
           MP_PROJECT_VERSION);
  EXPECT_INVALID_R(brg_comm_init_env(NULL), brg_get_version(NULL, &vmin, &vpat), NULL);
  EXPECT_INVALID_R(brg_comm_init_env(NULL), brg_get_version(&vmaj, NULL, &vpat), NULL);
  EXPECT_INVALID_R(brg_comm_init_env(NULL), brg_get_version(&vmaj, &vmin, NULL), NULL);

  EXPECT_INVALID_R(brg_comm_init_env(NULL), brg_get_unique_id(NULL), NULL);
  EXPECT_INVALID_R(brg_get_unique_id(NULL), brg_comm_init(NULL, 1, id, 0), NULL);
  EXPECT_INVALID_R(brg_get_unique_id(NULL), brg_comm_init_env(NULL), NULL);

  struct {
    int nranks, rank;
  } bad[] = {{0, 0}, {-1, 0}, {1, 1}, {1, -1}, {2, 5}, {3, 3}, {-5, -5}};
  for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
    c = SENTINEL;
    (void)brg_get_unique_id(NULL);
    remember(NULL);
    int64_t t0 = mp_now_ns();
    brg_status st = brg_comm_init(&c, bad[k].nranks, id, bad[k].rank);
    MP_CHECK(st == BRG_ERR_INVALID_ARGUMENT,
             "brg_comm_init(nranks=%d, rank=%d) returned %s, expected BRG_ERR_INVALID_ARGUMENT",
             bad[k].nranks, bad[k].rank, brg_status_string(st));
    MP_CHECK(nonempty(brg_comm_last_error(NULL)) && strcmp(brg_comm_last_error(NULL), g_prev),
             "brg_comm_init(nranks=%d, rank=%d): brg_comm_last_error(NULL) is empty or stale",
             bad[k].nranks, bad[k].rank);
    MP_CHECK(c == SENTINEL, "brg_comm_init(nranks=%d, rank=%d) failed but wrote *comm",
             bad[k].nranks, bad[k].rank);
    MP_CHECK(ms_since(t0) < 5000, "brg_comm_init(nranks=%d, rank=%d) took %.0f ms to fail",
             bad[k].nranks, bad[k].rank, ms_since(t0));
  }
  c = SENTINEL;
  EXPECT_INVALID_R(brg_get_unique_id(NULL), brg_comm_init(&c, 1, NULL, 0), NULL);
  MP_CHECK(c == SENTINEL, "brg_comm_init(id=NULL) failed but wrote *comm");

  /* Corrupted ids: every byte flipped, all zero, and single flipped bytes
   * spread over the start of the id. */
  brg_unique_id bad_id;
  struct {
    const char *what;
    int off; /* -1: all bytes, -2: all zero */
  } flips[] = {{"every byte flipped", -1}, {"all zero", -2},        {"byte 0 flipped", 0},
               {"byte 1 flipped", 1},      {"byte 5 flipped", 5},   {"byte 9 flipped", 9},
               {"byte 17 flipped", 17},    {"byte 24 flipped", 24}, {"byte 40 flipped", 40},
               {"byte 63 flipped", 63}};
  for (size_t k = 0; k < sizeof flips / sizeof flips[0]; k++) {
    memcpy(&bad_id, id, sizeof bad_id);
    if (flips[k].off == -1)
      for (size_t b = 0; b < sizeof bad_id; b++) bad_id.internal[b] ^= (char)0xff;
    else if (flips[k].off == -2)
      memset(&bad_id, 0, sizeof bad_id);
    else
      bad_id.internal[flips[k].off] ^= (char)0x5a;
    c = SENTINEL;
    (void)brg_get_unique_id(NULL);
    remember(NULL);
    int64_t t0 = mp_now_ns();
    brg_status st = brg_comm_init(&c, 1, &bad_id, 0);
    MP_CHECK(st == BRG_ERR_INVALID_ARGUMENT,
             "brg_comm_init with a corrupted id (%s) returned %s, expected "
             "BRG_ERR_INVALID_ARGUMENT",
             flips[k].what, brg_status_string(st));
    MP_CHECK(nonempty(brg_comm_last_error(NULL)) && strcmp(brg_comm_last_error(NULL), g_prev),
             "corrupted id (%s): brg_comm_last_error(NULL) is empty or stale", flips[k].what);
    MP_CHECK(c == SENTINEL, "corrupted id (%s): failed but wrote *comm", flips[k].what);
    MP_CHECK(ms_since(t0) < 5000, "corrupted id (%s): took %.0f ms to fail", flips[k].what,
             ms_since(t0));
    if (st == BRG_SUCCESS && c != SENTINEL) brg_comm_destroy(c);
  }

  /* The untouched id still works after all that. */
  c = NULL;
  brg_status st = brg_comm_init(&c, 1, id, 0);
  if (st != BRG_SUCCESS) {
    mp_fail("brg_comm_init with the good id after the bad calls: %s: %s", brg_status_string(st),
            errmsg(NULL));
    return 1;
  }
  small_allreduce_ok(c, 0, 1, "allreduce after bad init calls");
  st = brg_comm_destroy(c);
  MP_CHECK(st == BRG_SUCCESS, "brg_comm_destroy: %s", brg_status_string(st));
  return 0;
}

static int body_args_comm(mp_ctx *ctx) {
  brg_comm *c = ctx->comm;
  int n = ctx->nranks;
  float s[64], r[64 * MP_MAX_RANKS];
  fill_in(s, 64, ctx->rank);
  const brg_dtype BADT = (brg_dtype)99, BADT2 = (brg_dtype)-1;
  const brg_op BADO = (brg_op)99, BADO2 = (brg_op)-1;

  /* Every rank makes the same bad calls; each must fail locally. */
  EXPECT_INVALID(brg_allreduce(NULL, r, 10, BRG_FLOAT32, BRG_SUM, c, NULL), c);
  EXPECT_INVALID(brg_allreduce(s, NULL, 10, BRG_FLOAT32, BRG_SUM, c, NULL), c);
  EXPECT_INVALID(brg_allreduce(s, r, 10, BADT, BRG_SUM, c, NULL), c);
  EXPECT_INVALID(brg_allreduce(s, r, 10, BADT2, BRG_SUM, c, NULL), c);
  EXPECT_INVALID(brg_allreduce(s, r, 10, BRG_FLOAT32, BADO, c, NULL), c);
  EXPECT_INVALID(brg_allreduce(s, r, 10, BRG_FLOAT32, BADO2, c, NULL), c);
  EXPECT_INVALID(brg_allreduce(s, r, 10, BRG_FLOAT32, BRG_SUM, NULL, NULL), NULL);

  EXPECT_INVALID(brg_reduce_scatter(NULL, r, 10, BRG_FLOAT32, BRG_SUM, c, NULL), c);
  EXPECT_INVALID(brg_reduce_scatter(s, NULL, 10, BRG_FLOAT32, BRG_SUM, c, NULL), c);
  EXPECT_INVALID(brg_reduce_scatter(s, r, 10, BADT, BRG_SUM, c, NULL), c);
  EXPECT_INVALID(brg_reduce_scatter(s, r, 10, BRG_FLOAT32, BADO, c, NULL), c);
  EXPECT_INVALID(brg_reduce_scatter(s, r, 10, BRG_FLOAT32, BRG_SUM, NULL, NULL), NULL);

  EXPECT_INVALID(brg_all_gather(NULL, r, 10, BRG_FLOAT32, c, NULL), c);
  EXPECT_INVALID(brg_all_gather(s, NULL, 10, BRG_FLOAT32, c, NULL), c);
  EXPECT_INVALID(brg_all_gather(s, r, 10, BADT, c, NULL), c);
  EXPECT_INVALID(brg_all_gather(s, r, 10, BRG_FLOAT32, NULL, NULL), NULL);

  /* (A NULL sendbuf is legal on non-root ranks, so it is not tried here.) */
  EXPECT_INVALID(brg_broadcast(s, NULL, 10, BRG_FLOAT32, 0, c, NULL), c);
  EXPECT_INVALID(brg_broadcast(s, r, 10, BADT, 0, c, NULL), c);
  EXPECT_INVALID_R(RESET_ROOT, brg_broadcast(s, r, 10, BRG_FLOAT32, -1, c, NULL), c);
  EXPECT_INVALID_R(RESET_ROOT, brg_broadcast(s, r, 10, BRG_FLOAT32, n, c, NULL), c);
  EXPECT_INVALID(brg_broadcast(s, r, 10, BRG_FLOAT32, 0, NULL, NULL), NULL);

  /* (A NULL recvbuf is legal on non-root ranks, so it is not tried here.) */
  EXPECT_INVALID(brg_reduce(NULL, r, 10, BRG_FLOAT32, BRG_SUM, 0, c, NULL), c);
  EXPECT_INVALID(brg_reduce(s, r, 10, BADT, BRG_SUM, 0, c, NULL), c);
  EXPECT_INVALID(brg_reduce(s, r, 10, BRG_FLOAT32, BADO, 0, c, NULL), c);
  EXPECT_INVALID_R(RESET_ROOT, brg_reduce(s, r, 10, BRG_FLOAT32, BRG_SUM, -1, c, NULL), c);
  EXPECT_INVALID_R(RESET_ROOT, brg_reduce(s, r, 10, BRG_FLOAT32, BRG_SUM, n, c, NULL), c);
  EXPECT_INVALID(brg_reduce(s, r, 10, BRG_FLOAT32, BRG_SUM, 0, NULL, NULL), NULL);

  EXPECT_INVALID(brg_barrier(NULL), NULL);

  brg_request req;
  EXPECT_INVALID(brg_iallreduce(NULL, r, 10, BRG_FLOAT32, BRG_SUM, c, &req), c);
  EXPECT_INVALID(brg_iallreduce(s, NULL, 10, BRG_FLOAT32, BRG_SUM, c, &req), c);
  EXPECT_INVALID(brg_iallreduce(s, r, 10, BADT, BRG_SUM, c, &req), c);
  EXPECT_INVALID(brg_iallreduce(s, r, 10, BRG_FLOAT32, BADO, c, &req), c);
  EXPECT_INVALID(brg_iallreduce(s, r, 10, BRG_FLOAT32, BRG_SUM, c, NULL), c);
  EXPECT_INVALID(brg_iallreduce(s, r, 10, BRG_FLOAT32, BRG_SUM, NULL, &req), NULL);
  EXPECT_INVALID(brg_ireduce_scatter(NULL, r, 10, BRG_FLOAT32, BRG_SUM, c, &req), c);
  EXPECT_INVALID(brg_ireduce_scatter(s, NULL, 10, BRG_FLOAT32, BRG_SUM, c, &req), c);
  EXPECT_INVALID(brg_ireduce_scatter(s, r, 10, BADT, BRG_SUM, c, &req), c);
  EXPECT_INVALID(brg_ireduce_scatter(s, r, 10, BRG_FLOAT32, BADO, c, &req), c);
  EXPECT_INVALID(brg_ireduce_scatter(s, r, 10, BRG_FLOAT32, BRG_SUM, c, NULL), c);
  EXPECT_INVALID(brg_ireduce_scatter(s, r, 10, BRG_FLOAT32, BRG_SUM, NULL, &req), NULL);
  EXPECT_INVALID(brg_iall_gather(NULL, r, 10, BRG_FLOAT32, c, &req), c);
  EXPECT_INVALID(brg_iall_gather(s, NULL, 10, BRG_FLOAT32, c, &req), c);
  EXPECT_INVALID(brg_iall_gather(s, r, 10, BADT, c, &req), c);
  EXPECT_INVALID(brg_iall_gather(s, r, 10, BRG_FLOAT32, c, NULL), c);
  EXPECT_INVALID(brg_iall_gather(s, r, 10, BRG_FLOAT32, NULL, &req), NULL);
  EXPECT_INVALID(brg_ibroadcast(s, NULL, 10, BRG_FLOAT32, 0, c, &req), c);
  EXPECT_INVALID(brg_ibroadcast(s, r, 10, BADT, 0, c, &req), c);
  EXPECT_INVALID_R(RESET_ROOT, brg_ibroadcast(s, r, 10, BRG_FLOAT32, -1, c, &req), c);
  EXPECT_INVALID_R(RESET_ROOT, brg_ibroadcast(s, r, 10, BRG_FLOAT32, n, c, &req), c);
  EXPECT_INVALID(brg_ibroadcast(s, r, 10, BRG_FLOAT32, 0, c, NULL), c);
  EXPECT_INVALID(brg_ibroadcast(s, r, 10, BRG_FLOAT32, 0, NULL, &req), NULL);
  EXPECT_INVALID(brg_ireduce(NULL, r, 10, BRG_FLOAT32, BRG_SUM, 0, c, &req), c);
  EXPECT_INVALID(brg_ireduce(s, r, 10, BADT, BRG_SUM, 0, c, &req), c);
  EXPECT_INVALID(brg_ireduce(s, r, 10, BRG_FLOAT32, BADO, 0, c, &req), c);
  EXPECT_INVALID_R(RESET_ROOT, brg_ireduce(s, r, 10, BRG_FLOAT32, BRG_SUM, -1, c, &req), c);
  EXPECT_INVALID_R(RESET_ROOT, brg_ireduce(s, r, 10, BRG_FLOAT32, BRG_SUM, n, c, &req), c);
  EXPECT_INVALID(brg_ireduce(s, r, 10, BRG_FLOAT32, BRG_SUM, 0, c, NULL), c);
  EXPECT_INVALID(brg_ireduce(s, r, 10, BRG_FLOAT32, BRG_SUM, 0, NULL, &req), NULL);
  EXPECT_INVALID(brg_ibarrier(c, NULL), c);
  EXPECT_INVALID(brg_ibarrier(NULL, &req), NULL);
  int done = 0;
  EXPECT_INVALID(brg_test(NULL, &done), NULL);
  EXPECT_INVALID(brg_wait(NULL), NULL);

  int v = -7;
  uint64_t b = 777;
  EXPECT_INVALID(brg_comm_rank(NULL, &v), NULL);
  EXPECT_INVALID(brg_comm_rank(c, NULL), c);
  EXPECT_INVALID(brg_comm_size(NULL, &v), NULL);
  EXPECT_INVALID(brg_comm_size(c, NULL), c);
  MP_CHECK(v == -7, "brg_comm_rank/size failed but wrote their output (%d)", v);
  EXPECT_INVALID(brg_comm_bytes_sent(NULL, &b), NULL);
  EXPECT_INVALID(brg_comm_bytes_sent(c, NULL), c);
  MP_CHECK(b == 777, "brg_comm_bytes_sent failed but wrote its output");
  EXPECT_INVALID(brg_comm_abort(NULL), NULL);

  /* The communicator is still in step and works. */
  small_allreduce_ok(c, ctx->rank, n, "allreduce after the bad calls");
  brg_status st = brg_barrier(c);
  MP_CHECK(st == BRG_SUCCESS, "barrier after the bad calls: %s: %s", brg_status_string(st),
           errmsg(c));
  return 0;
}

static int case_args(int n) {
  int bad = 0;
  mp_opts o = {.name = "args: before a communicator",
               .nranks = 1,
               .deadline_ms = 30000,
               .init = MP_INIT_NONE};
  bad |= mp_run(&o, body_args_precomm, NULL);
  mp_opts o2 = {
      .name = "args: on a communicator", .nranks = n, .deadline_ms = 60000, .init = MP_INIT_ID};
  bad |= mp_run(&o2, body_args_comm, NULL);
  return bad;
}

/* ============================================================== garbage */

typedef struct garbage_arg {
  int port;
  int keep_open; /* hold every connection open until the ranks are done */
  int nranks;
} garbage_arg;

static int connect_port(int port, int timeout_ms) {
  int64_t end = mp_now_ns() + (int64_t)timeout_ms * 1000000;
  for (;;) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0) return fd;
    if (fd >= 0) close(fd);
    if (mp_now_ns() > end) return -1;
    mp_sleep_ms(10);
  }
}

static void send_all(int fd, const void *p, size_t len) {
  const char *c = p;
  while (len > 0) {
    ssize_t k = send(fd, c, len, MSG_NOSIGNAL);
    if (k <= 0) return; /* the root may hang up on us: that is fine */
    c += k;
    len -= (size_t)k;
  }
}

static void *garbage_thread(void *argp) {
  garbage_arg *g = argp;
  mp_shared *sh = mp_shared_area();
  int fds[16], nfd = 0;
  int fd = connect_port(g->port, 20000);
  if (fd < 0) {
    fprintf(stderr, "[garbage] could not connect to the root at port %d\n", g->port);
    __atomic_store_n(&sh->flags[0], 2, __ATOMIC_RELEASE);
    return NULL;
  }
  fds[nfd++] = fd;
  /* 1: random bytes */
  static unsigned char junk[1 << 20];
  uint64_t x = 0x243f6a8885a308d3ull;
  for (size_t i = 0; i < sizeof junk; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    junk[i] = (unsigned char)x;
  }
  send_all(fd, junk, 4096);
  /* 2: all ones (huge lengths wherever a length is read) */
  static const unsigned char ones[64] = {
      0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
      0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
      0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
      0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
      0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
  if ((fd = connect_port(g->port, 2000)) >= 0) {
    fds[nfd++] = fd;
    send_all(fd, ones, sizeof ones);
  }
  /* 3: a plausible magic in both byte orders, then huge lengths and ranks */
  unsigned char hdr[64];
  memset(hdr, 0xff, sizeof hdr);
  memcpy(hdr, "BRG11GRB", 8);
  uint32_t bigrank = 0x7fffffff;
  memcpy(hdr + 24, &bigrank, 4);
  if ((fd = connect_port(g->port, 2000)) >= 0) {
    fds[nfd++] = fd;
    send_all(fd, hdr, sizeof hdr);
  }
  /* 4: a different protocol */
  static const char http[] = "GET / HTTP/1.1\r\nHost: localhost\r\n\r\n";
  if ((fd = connect_port(g->port, 2000)) >= 0) {
    fds[nfd++] = fd;
    send_all(fd, http, sizeof http - 1);
  }
  /* 5: a megabyte of noise */
  if ((fd = connect_port(g->port, 2000)) >= 0) {
    fds[nfd++] = fd;
    send_all(fd, junk, sizeof junk);
  }
  /* 6: connect and say nothing (only left open in garbage_open) */
  if ((fd = connect_port(g->port, 2000)) >= 0) fds[nfd++] = fd;
  /* 7: a few bytes, then silence */
  if ((fd = connect_port(g->port, 2000)) >= 0) {
    fds[nfd++] = fd;
    send_all(fd, "BRG1", 4);
  }
  if (!g->keep_open) {
    for (int i = 0; i < nfd; i++) close(fds[i]);
    nfd = 0;
  }
  /* Let the root chew on it (well under its per-connection limit, so the
   * silent ones are still pending) before the real ranks come. */
  mp_sleep_ms(300);
  __atomic_store_n(&sh->flags[0], 1, __ATOMIC_RELEASE);
  if (g->keep_open) {
    /* until every rank is through (or gave up) */
    int64_t end = mp_now_ns() + 60 * 1000000000LL;
    while (__atomic_load_n(&sh->flags[1], __ATOMIC_ACQUIRE) < g->nranks && mp_now_ns() < end)
      mp_sleep_ms(10);
    for (int i = 0; i < nfd; i++) close(fds[i]);
  }
  return NULL;
}

static int body_garbage(mp_ctx *ctx) {
  mp_shared *sh = ctx->shared;
  const garbage_arg *g = ctx->arg;
  char buf[32];
  if (ctx->rank != 0) {
    /* The others join only after the garbage went in. */
    if (!mp_wait_flag(0, 30000) || __atomic_load_n(&sh->flags[0], __ATOMIC_ACQUIRE) != 1) {
      mp_fail("the garbage sender never got through to the root");
      __atomic_fetch_add(&sh->flags[1], 1, __ATOMIC_ACQ_REL);
      return 1;
    }
  }
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  snprintf(buf, sizeof buf, "%d", g->port);
  setenv("MASTER_PORT", buf, 1);
  snprintf(buf, sizeof buf, "%d", ctx->rank);
  setenv("RANK", buf, 1);
  setenv("LOCAL_RANK", buf, 1);
  snprintf(buf, sizeof buf, "%d", ctx->nranks);
  setenv("WORLD_SIZE", buf, 1);
  setenv("LOCAL_WORLD_SIZE", buf, 1);
  brg_comm *c = NULL;
  int64_t t0 = mp_now_ns();
  brg_status st = brg_comm_init_env(&c);
  if (st != BRG_SUCCESS) {
    mp_fail("brg_comm_init_env after garbage at the root: %s: %s (after %.0f ms)",
            brg_status_string(st), errmsg(NULL), ms_since(t0));
    __atomic_fetch_add(&sh->flags[1], 1, __ATOMIC_ACQ_REL);
    return 1;
  }
  small_allreduce_ok(c, ctx->rank, ctx->nranks, "allreduce after garbage at the root");
  st = brg_comm_destroy(c);
  MP_CHECK(st == BRG_SUCCESS, "brg_comm_destroy: %s", brg_status_string(st));
  __atomic_fetch_add(&sh->flags[1], 1, __ATOMIC_ACQ_REL);
  return 0;
}

static int case_garbage(int n, int keep_open) {
  garbage_arg g = {.port = mp_free_port(), .keep_open = keep_open, .nranks = n};
  if (g.port <= 0) {
    fprintf(stderr, "no free port\n");
    return 1;
  }
  mp_opts o = {.name = keep_open ? "foreign connections left open at the root"
                                 : "garbage sent to the root",
               .nranks = n,
               .deadline_ms = 30000,
               .init = MP_INIT_BARE,
               .parent_thread = garbage_thread,
               .parent_arg = &g};
  return mp_run(&o, body_garbage, &g);
}

/* =============================================================== absent */

static int body_absent(mp_ctx *ctx) {
  int absent = *(const int *)ctx->arg;
  if (ctx->rank == absent) return 0; /* never shows up */
  brg_comm *const SENTINEL = (brg_comm *)(uintptr_t)0x1234;
  brg_comm *c = SENTINEL;
  int64_t t0 = mp_now_ns();
  brg_status st = brg_comm_init(&c, ctx->nranks, ctx->id, ctx->rank);
  double el = ms_since(t0);
  const char *m = errmsg(NULL);
  if (st == BRG_SUCCESS) {
    mp_fail("brg_comm_init succeeded although rank %d never arrived", absent);
    if (c && c != SENTINEL) brg_comm_destroy(c);
    return 1;
  }
  MP_CHECK(st == BRG_ERR_TIMEOUT, "brg_comm_init without rank %d: %s, expected BRG_ERR_TIMEOUT: %s",
           absent, brg_status_string(st), m);
  MP_CHECK(el <= g_timeout_ms + 5000.0, "brg_comm_init took %.0f ms to time out (timeout %d ms)",
           el, g_timeout_ms);
  MP_CHECK(mp_names_rank(m, absent), "the timeout message does not name rank %d: \"%s\"", absent,
           m);
  MP_CHECK(c == SENTINEL, "brg_comm_init failed but wrote *comm");
  return 0;
}

static int case_absent(int n) {
  int bad = 0;
  int absent[2] = {n - 1, 0};
  for (int k = 0; k < 2; k++) {
    char name[64];
    snprintf(name, sizeof name, "rank %d never arrives", absent[k]);
    mp_opts o = {
        .name = name, .nranks = n, .deadline_ms = g_timeout_ms + 20000, .init = MP_INIT_NONE};
    bad |= mp_run(&o, body_absent, &absent[k]);
  }
  return bad;
}

/* ======================================================== kill and stop */

#define LOOP_COUNT (1u << 21) /* 8 MiB of float32 per allreduce */
#define VICTIM 1

/* BRIGADE_ALGO names the tree or rhd, which lat.c runs on p2p's links. */
static int lat_algo(void) {
  const char *a = getenv("BRIGADE_ALGO");
  return a && (!strcmp(a, "tree") || !strcmp(a, "rhd"));
}

static int body_victim_loop(mp_ctx *ctx) {
  int sig = *(const int *)ctx->arg;
  mp_shared *sh = ctx->shared;
  brg_comm *c = ctx->comm;
  float *s = malloc(LOOP_COUNT * sizeof(float)), *r = malloc(LOOP_COUNT * sizeof(float));
  if (!s || !r) return 1;
  fill_in(s, LOOP_COUNT, ctx->rank);
  memset(r, 0, LOOP_COUNT * sizeof(float));
  brg_status st = BRG_SUCCESS;
  int64_t start = mp_now_ns();
  int iter = 0;
  for (;;) {
    st = brg_allreduce(s, r, LOOP_COUNT, BRG_FLOAT32, BRG_SUM, c, NULL);
    if (st != BRG_SUCCESS) break;
    if (!check_sum(r, LOOP_COUNT, ctx->nranks, 997, "allreduce in the loop")) break;
    __atomic_store_n(&sh->progress[ctx->rank], ++iter, __ATOMIC_RELEASE);
    if (mp_now_ns() - start > 60 * 1000000000LL) {
      mp_fail("still no error 60 s after the loop started (rank %d was %s)", VICTIM,
              sig == SIGKILL ? "killed" : "stopped");
      break;
    }
  }
  int64_t t_err = mp_now_ns(), t_sig = __atomic_load_n(&sh->signal_ns, __ATOMIC_ACQUIRE);
  if (st != BRG_SUCCESS) {
    const char *m = errmsg(c);
    double el = t_sig ? (double)(t_err - t_sig) / 1e6 : -1;
    if (!t_sig) {
      mp_fail("allreduce failed before rank %d was signalled: %s: %s", VICTIM,
              brg_status_string(st), m);
    } else {
      if (sig == SIGKILL)
        MP_CHECK(st == BRG_ERR_REMOTE || st == BRG_ERR_TIMEOUT,
                 "after rank %d was killed: %s, expected BRG_ERR_REMOTE or BRG_ERR_TIMEOUT: %s",
                 VICTIM, brg_status_string(st), m);
      else
        MP_CHECK(st == BRG_ERR_TIMEOUT || st == BRG_ERR_REMOTE,
                 "after rank %d was stopped: %s, expected BRG_ERR_TIMEOUT: %s", VICTIM,
                 brg_status_string(st), m);
      MP_CHECK(el <= g_timeout_ms + 5000.0,
               "the error came %.0f ms after rank %d was signalled (timeout %d ms)", el, VICTIM,
               g_timeout_ms);
      /* A killed rank is named by every survivor (its neighbours see it die
       * and say so to the others). So is a stopped one: it stops beating on
       * the ring sockets, and every survivor's timeout (or the notice of a
       * neighbour's) names the rank silent the longest, and for how long.
       * The tree and rhd (BRIGADE_ALGO) talk to partners that are not ring
       * neighbours: a survivor may hear first that a partner which failed
       * hung up, and names that rank; rank 0 checks below that the
       * victim's partners name it. */
      int named = mp_names_rank(m, VICTIM);
      sh->vals[MP_MAX_RANKS + ctx->rank] = named;
      if (lat_algo())
        MP_CHECK(named || mp_contains(m, "hung up"),
                 "the error message names neither rank %d nor a rank that hung up: \"%s\"", VICTIM,
                 m);
      else
        MP_CHECK(named, "the error message does not name rank %d: \"%s\"", VICTIM, m);
      if (sig == SIGSTOP)
        MP_CHECK(mp_contains(m, "silent for"),
                 "the error message does not say how long rank %d has been silent: \"%s\"", VICTIM,
                 m);
    }
    sh->vals[ctx->rank] = st;
    /* A broken communicator answers further calls with an error, promptly. */
    int64_t t1 = mp_now_ns();
    brg_status st2 = brg_allreduce(s, r, 1000, BRG_FLOAT32, BRG_SUM, c, NULL);
    MP_CHECK(st2 != BRG_SUCCESS, "an allreduce after the failure succeeded");
    MP_CHECK(ms_since(t1) <= g_timeout_ms + 5000.0,
             "an allreduce after the failure took %.0f ms to return", ms_since(t1));
  }
  __atomic_fetch_add(&sh->flags[0], 1, __ATOMIC_ACQ_REL);
  /* destroy must come back, whatever it says about the dead peer */
  brg_comm_destroy(c);
  ctx->comm = NULL;
  if (sig == SIGKILL && lat_algo() && ctx->rank == 0) {
    int survivors = ctx->nranks - 1;
    int64_t end = mp_now_ns() + (int64_t)(g_timeout_ms + 10000) * 1000000;
    while (__atomic_load_n(&sh->flags[0], __ATOMIC_ACQUIRE) < survivors && mp_now_ns() < end)
      mp_sleep_ms(5);
    int named = 0;
    for (int q = 0; q < ctx->nranks; q++)
      if (q != VICTIM) named += (int)sh->vals[MP_MAX_RANKS + q];
    MP_CHECK(named > 0, "no rank's error message names the killed rank %d", VICTIM);
  }
  if (sig == SIGSTOP && ctx->rank == 0) {
    /* Stalls are found by timeouts: at least one rank must report one. */
    int survivors = ctx->nranks - 1;
    int64_t end = mp_now_ns() + (int64_t)(g_timeout_ms + 10000) * 1000000;
    while (__atomic_load_n(&sh->flags[0], __ATOMIC_ACQUIRE) < survivors && mp_now_ns() < end)
      mp_sleep_ms(5);
    int timeouts = 0;
    for (int q = 0; q < ctx->nranks; q++)
      if (q != VICTIM && sh->vals[q] == BRG_ERR_TIMEOUT) timeouts++;
    MP_CHECK(timeouts > 0, "no rank reported BRG_ERR_TIMEOUT for the stopped rank %d", VICTIM);
    int named = 0;
    for (int q = 0; q < ctx->nranks; q++)
      if (q != VICTIM) named += (int)sh->vals[MP_MAX_RANKS + q];
    MP_CHECK(named > 0, "no rank's error message names the stopped rank %d", VICTIM);
  }
  free(s);
  free(r);
  return 0;
}

static int case_victim(int n, int sig) {
  char name[96];
  snprintf(name, sizeof name, "rank %d %s in an allreduce loop", VICTIM,
           sig == SIGKILL ? "killed" : "stopped");
  mp_opts o = {.name = name,
               .nranks = n,
               .deadline_ms = g_timeout_ms * 2 + 60000,
               .init = MP_INIT_ID,
               .victim = VICTIM,
               .victim_signal = sig,
               .victim_after = 2,
               .victim_delay_ms = 7};
  return mp_run(&o, body_victim_loop, &sig);
}

/* ================================================================ abort */

typedef struct abort_arg {
  brg_comm *comm;
  int delay_ms;
  brg_status st;
} abort_arg;

static void *abort_thread(void *p) {
  abort_arg *a = p;
  mp_sleep_ms(a->delay_ms);
  a->st = brg_comm_abort(a->comm);
  return NULL;
}

static int body_abort(mp_ctx *ctx) {
  int use_wait = *(const int *)ctx->arg;
  mp_shared *sh = ctx->shared;
  brg_comm *c = ctx->comm;
  if (ctx->rank != 0) {
    /* never calls the collective; leaves once rank 0 is done */
    if (!mp_wait_flag(0, 60000)) mp_fail("rank 0 never finished");
    brg_comm_destroy(c);
    ctx->comm = NULL;
    return 0;
  }
  static float s[4096], r[4096];
  fill_in(s, 4096, 0);
  abort_arg a = {.comm = c, .delay_ms = 300, .st = BRG_ERR_INTERNAL};
  pthread_t t;
  pthread_create(&t, NULL, abort_thread, &a);
  int64_t t0 = mp_now_ns();
  brg_status st;
  const char *what;
  if (use_wait) {
    brg_request req;
    what = "brg_wait";
    st = brg_iallreduce(s, r, 4096, BRG_FLOAT32, BRG_SUM, c, &req);
    if (st == BRG_SUCCESS)
      st = brg_wait(&req);
    else
      mp_fail("brg_iallreduce: %s: %s", brg_status_string(st), errmsg(c));
  } else {
    what = "brg_allreduce";
    st = brg_allreduce(s, r, 4096, BRG_FLOAT32, BRG_SUM, c, NULL);
  }
  double el = ms_since(t0);
  pthread_join(t, NULL);
  MP_CHECK(a.st == BRG_SUCCESS, "brg_comm_abort from another thread returned %s",
           brg_status_string(a.st));
  MP_CHECK(st == BRG_ERR_ABORTED,
           "%s returned %s after brg_comm_abort, expected "
           "BRG_ERR_ABORTED: %s",
           what, brg_status_string(st), errmsg(c));
  MP_CHECK(el >= 250, "%s returned after %.0f ms, before the abort at 300 ms", what, el);
  MP_CHECK(el <= 10000, "%s returned %.0f ms after it started (abort at 300 ms)", what, el);
  MP_CHECK(nonempty(brg_comm_last_error(c)), "no message after the abort");
  int64_t t1 = mp_now_ns();
  st = brg_allreduce(s, r, 16, BRG_FLOAT32, BRG_SUM, c, NULL);
  MP_CHECK(st != BRG_SUCCESS, "an allreduce on an aborted communicator succeeded");
  MP_CHECK(ms_since(t1) < 10000, "an allreduce on an aborted communicator took %.0f ms",
           ms_since(t1));
  st = brg_comm_destroy(c);
  MP_CHECK(st == BRG_SUCCESS, "brg_comm_destroy after brg_comm_abort: %s", brg_status_string(st));
  ctx->comm = NULL;
  __atomic_store_n(&sh->flags[0], 1, __ATOMIC_RELEASE);
  return 0;
}

static int case_abort(int n) {
  int bad = 0;
  for (int w = 0; w < 2; w++) {
    mp_opts o = {.name = w ? "brg_comm_abort unblocks brg_wait"
                           : "brg_comm_abort unblocks brg_allreduce",
                 .nranks = n,
                 .deadline_ms = 60000,
                 .init = MP_INIT_ID};
    bad |= mp_run(&o, body_abort, &w);
  }
  return bad;
}

/* ============================================================= mismatch */

enum { MM_COUNT, MM_KIND, MM_DTYPE, MM_OP, MM_N };
static const char *MM_NAMES[MM_N] = {"count 100 vs 200", "allreduce vs broadcast",
                                     "float32 vs int32", "sum vs max"};

static int names_both(int kind, const char *m) {
  switch (kind) {
  case MM_COUNT: return mp_contains(m, "100") && mp_contains(m, "200");
  case MM_KIND:
    return (mp_contains(m, "allreduce") || mp_contains(m, "all_reduce") ||
            mp_contains(m, "all-reduce")) &&
           (mp_contains(m, "broadcast") || mp_contains(m, "bcast"));
  case MM_DTYPE: return mp_contains(m, "float32") && mp_contains(m, "int32");
  default: return mp_contains(m, "sum") && mp_contains(m, "max");
  }
}

static int body_mismatch(mp_ctx *ctx) {
  int kind = *(const int *)ctx->arg;
  mp_shared *sh = ctx->shared;
  brg_comm *c = ctx->comm;
  static int32_t s[200], r[200];
  for (int i = 0; i < 200; i++) s[i] = ctx->rank + i;
  int first = ctx->rank == 0;
  brg_status st;
  switch (kind) {
  case MM_COUNT: st = brg_allreduce(s, r, first ? 100 : 200, BRG_FLOAT32, BRG_SUM, c, NULL); break;
  case MM_KIND:
    st = first ? brg_allreduce(s, r, 100, BRG_FLOAT32, BRG_SUM, c, NULL)
               : brg_broadcast(s, r, 100, BRG_FLOAT32, 0, c, NULL);
    break;
  case MM_DTYPE:
    st = brg_allreduce(s, r, 100, first ? BRG_FLOAT32 : BRG_INT32, BRG_SUM, c, NULL);
    break;
  default: st = brg_allreduce(s, r, 100, BRG_FLOAT32, first ? BRG_SUM : BRG_MAX, c, NULL);
  }
  const char *m = errmsg(c);
  MP_CHECK(st == BRG_ERR_MISMATCH || st == BRG_ERR_REMOTE,
           "mismatched call (%s) returned %s, expected BRG_ERR_MISMATCH or BRG_ERR_REMOTE: %s",
           MM_NAMES[kind], brg_status_string(st), m);
  if (st == BRG_ERR_MISMATCH)
    MP_CHECK(names_both(kind, m), "the mismatch message does not name both calls (%s): \"%s\"",
             MM_NAMES[kind], m);
  sh->vals[ctx->rank] = st;
  __atomic_fetch_add(&sh->flags[0], 1, __ATOMIC_ACQ_REL);
  if (ctx->rank == 0) {
    int64_t end = mp_now_ns() + 20 * 1000000000LL;
    while (__atomic_load_n(&sh->flags[0], __ATOMIC_ACQUIRE) < ctx->nranks && mp_now_ns() < end)
      mp_sleep_ms(5);
    int mm = 0;
    for (int q = 0; q < ctx->nranks; q++) mm += sh->vals[q] == BRG_ERR_MISMATCH;
    MP_CHECK(mm > 0, "no rank reported BRG_ERR_MISMATCH (%s)", MM_NAMES[kind]);
  }
  brg_comm_destroy(c);
  ctx->comm = NULL;
  return 0;
}

static int case_mismatch(int n) {
  int bad = 0;
  for (int k = 0; k < MM_N; k++) {
    char name[96];
    snprintf(name, sizeof name, "mismatch: %s", MM_NAMES[k]);
    mp_opts o = {.name = name, .nranks = n, .deadline_ms = 30000, .init = MP_INIT_ID};
    bad |= mp_run(&o, body_mismatch, &k);
  }
  return bad;
}

/* ======================================================= rings mismatch */

/* The last rank asks for two rings, the others for one (BRIGADE_RINGS is
 * read at init): every rank's init must fail with BRG_ERR_MISMATCH naming
 * the setting, at once rather than at the timeout. */
static int body_rings_mismatch(mp_ctx *ctx) {
  setenv("BRIGADE_RINGS", ctx->rank == ctx->nranks - 1 ? "2" : "1", 1);
  brg_comm *c = NULL;
  int64_t t0 = mp_now_ns();
  brg_status st = brg_comm_init(&c, ctx->nranks, ctx->id, ctx->rank);
  const char *m = brg_comm_last_error(NULL);
  MP_CHECK(st == BRG_ERR_MISMATCH, "init with BRIGADE_RINGS differing between ranks: %s (%s)",
           brg_status_string(st), m);
  MP_CHECK(mp_contains(m, "BRIGADE_RINGS"), "the message does not name BRIGADE_RINGS: \"%s\"", m);
  MP_CHECK(ms_since(t0) < g_timeout_ms / 2.0, "init took %.0f ms to fail (timeout %d ms)",
           ms_since(t0), g_timeout_ms);
  if (st == BRG_SUCCESS) brg_comm_destroy(c);
  return 0;
}

static int case_rings_mismatch(int n) {
  mp_opts o = {.name = "rings mismatch", .nranks = n, .deadline_ms = 60000, .init = MP_INIT_NONE};
  return mp_run(&o, body_rings_mismatch, NULL);
}

/* ================================================== transports mismatch */

/* The last rank leaves cuda_ipc out of its transports, the others allow
 * it: the host links agree (shm), the device links would not (cuda_ipc
 * against shm staging), so init must fail with BRG_ERR_MISMATCH naming
 * the transports, at once, on the ranks of the links concerned; the
 * others fail too, their neighbours gone, well before the timeout. */
static int body_transports_mismatch(mp_ctx *ctx) {
  int last = ctx->rank == ctx->nranks - 1;
  setenv("BRIGADE_TRANSPORTS", last ? "shm" : "cuda_ipc,shm", 1);
  brg_comm *c = NULL;
  int64_t t0 = mp_now_ns();
  brg_status st = brg_comm_init(&c, ctx->nranks, ctx->id, ctx->rank);
  const char *m = brg_comm_last_error(NULL);
  int ends = last || ctx->rank == 0 || ctx->rank == ctx->nranks - 2;
  MP_CHECK(st != BRG_SUCCESS, "init with BRIGADE_TRANSPORTS differing in cuda_ipc succeeded");
  if (ends) {
    MP_CHECK(st == BRG_ERR_MISMATCH || st == BRG_ERR_REMOTE,
             "init with BRIGADE_TRANSPORTS differing between ranks: %s (%s)", brg_status_string(st),
             m);
    MP_CHECK(mp_contains(m, "cuda_ipc") || st == BRG_ERR_REMOTE,
             "the message does not name cuda_ipc: \"%s\"", m);
  }
  MP_CHECK(ms_since(t0) < g_timeout_ms / 2.0, "init took %.0f ms to fail (timeout %d ms)",
           ms_since(t0), g_timeout_ms);
  if (st == BRG_SUCCESS) brg_comm_destroy(c);
  return 0;
}

static int case_transports_mismatch(int n) {
  mp_opts o = {
      .name = "transports mismatch", .nranks = n, .deadline_ms = 60000, .init = MP_INIT_NONE};
  return mp_run(&o, body_transports_mismatch, NULL);
}

/* ================================================================== env */

typedef struct env_case {
  const char *what;
  const char *addr, *port, *rank, *size; /* NULL: unset; "$PORT": a free port */
  const char *must_name;                 /* variable the message must name; NULL: any of them */
  int ok;                                /* expected to succeed */
  const char *exact;                     /* the whole message, where it is the point */
} env_case;

static void clear_launcher_env(void) {
  static const char *prefixes[] = {
      "MASTER_ADDR=", "MASTER_PORT=", "RANK=", "WORLD_SIZE=", "LOCAL_RANK=", "LOCAL_WORLD_SIZE=",
      "GROUP_RANK=",  "OMPI_",        "PMI",   "SLURM_",      "MV2_",        "PMIX"};
  for (;;) {
    int again = 0;
    for (char **e = environ; *e && !again; e++) {
      for (size_t k = 0; k < sizeof prefixes / sizeof prefixes[0]; k++) {
        if (strncmp(*e, prefixes[k], strlen(prefixes[k])) != 0) continue;
        char name[256];
        size_t l = strcspn(*e, "=");
        if (l >= sizeof name) continue;
        memcpy(name, *e, l);
        name[l] = 0;
        unsetenv(name);
        again = 1;
        break;
      }
    }
    if (!again) break;
  }
}

static int body_env(mp_ctx *ctx) {
  const env_case *ec = ctx->arg;
  char port[16];
  snprintf(port, sizeof port, "%d", mp_free_port());
  clear_launcher_env();
#define SETV(var, v)                                                                               \
  if (v) setenv(var, strcmp(v, "$PORT") == 0 ? port : v, 1)
  SETV("MASTER_ADDR", ec->addr);
  SETV("MASTER_PORT", ec->port);
  SETV("RANK", ec->rank);
  SETV("WORLD_SIZE", ec->size);
#undef SETV
  brg_comm *const SENTINEL = (brg_comm *)(uintptr_t)0x1234;
  brg_comm *c = SENTINEL;
  int64_t t0 = mp_now_ns();
  brg_status st = brg_comm_init_env(&c);
  const char *m = errmsg(NULL);
  if (ec->ok) {
    if (st != BRG_SUCCESS) {
      mp_fail("%s: brg_comm_init_env: %s: %s", ec->what, brg_status_string(st), m);
      return 1;
    }
    small_allreduce_ok(c, 0, 1, "allreduce on an env communicator");
    st = brg_comm_destroy(c);
    MP_CHECK(st == BRG_SUCCESS, "brg_comm_destroy: %s", brg_status_string(st));
    return 0;
  }
  if (st == BRG_SUCCESS) {
    mp_fail("%s: brg_comm_init_env succeeded", ec->what);
    brg_comm_destroy(c);
    return 1;
  }
  MP_CHECK(st != BRG_IN_PROGRESS, "%s: brg_comm_init_env returned BRG_IN_PROGRESS", ec->what);
  MP_CHECK(c == SENTINEL, "%s: brg_comm_init_env failed but wrote *comm", ec->what);
  MP_CHECK(ms_since(t0) < 5000, "%s: brg_comm_init_env took %.0f ms to fail", ec->what,
           ms_since(t0));
  if (ec->exact)
    MP_CHECK(strcmp(m, ec->exact) == 0, "%s: the message is \"%s\", expected \"%s\"", ec->what, m,
             ec->exact);
  if (ec->must_name) {
    MP_CHECK(strstr(m, ec->must_name) != NULL, "%s: the message does not name %s: \"%s\"", ec->what,
             ec->must_name, m);
  } else {
    MP_CHECK(strstr(m, "MASTER_ADDR") || strstr(m, "MASTER_PORT") || strstr(m, "RANK") ||
                 strstr(m, "WORLD_SIZE"),
             "%s: the message names no variable: \"%s\"", ec->what, m);
  }
  return 0;
}

static int case_env(void) {
  static const env_case cases[] = {
      {"nothing set (one rank)", NULL, NULL, NULL, NULL, NULL, 1, NULL},
      {"MASTER_ADDR missing", NULL, "$PORT", "0", "1", "MASTER_ADDR", 0, NULL},
      {"MASTER_PORT missing", "127.0.0.1", NULL, "0", "1", "MASTER_PORT", 0, NULL},
      {"RANK missing", "127.0.0.1", "$PORT", NULL, "1", "RANK", 0, NULL},
      {"WORLD_SIZE missing", "127.0.0.1", "$PORT", "0", NULL, "WORLD_SIZE", 0, NULL},
      {"RANK not a number", "127.0.0.1", "$PORT", "abc", "1", "RANK", 0,
       "brg_comm_init_env: RANK=\"abc\" is not a valid number"},
      {"WORLD_SIZE not a number", "127.0.0.1", "$PORT", "0", "2x", "WORLD_SIZE", 0,
       "brg_comm_init_env: WORLD_SIZE=\"2x\" is not a valid number"},
      {"WORLD_SIZE zero", "127.0.0.1", "$PORT", "0", "0", "WORLD_SIZE", 0, NULL},
      {"RANK >= WORLD_SIZE", "127.0.0.1", "$PORT", "1", "1", "RANK", 0, NULL},
      {"MASTER_PORT out of range", "127.0.0.1", "99999", "0", "1", "MASTER_PORT", 0, NULL},
      {"everything set", "127.0.0.1", "$PORT", "0", "1", NULL, 1, NULL},
  };
  int bad = 0;
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    char name[96];
    snprintf(name, sizeof name, "init_env: %s", cases[k].what);
    mp_opts o = {.name = name, .nranks = 1, .deadline_ms = 20000, .init = MP_INIT_BARE};
    bad |= mp_run(&o, body_env, (void *)&cases[k]);
  }
  return bad;
}

/* ================================================================== log */

/* Reads a whole file into buf (NUL-terminated); returns its length. */
static size_t read_file(const char *path, char *buf, size_t cap) {
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  size_t n = fread(buf, 1, cap - 1, f);
  fclose(f);
  buf[n] = 0;
  return n;
}

static int count_of(const char *hay, const char *needle) {
  int n = 0;
  for (const char *p = hay; (p = strstr(p, needle)) != NULL; p += strlen(needle)) n++;
  return n;
}

/* A failure without a communicator is logged once, by the function that saw
 * it, and brg_comm_last_error(NULL) holds the whole sentence: rank 0 cannot
 * listen on MASTER_PORT because another socket holds it. */
static int body_log_once(mp_ctx *ctx) {
  (void)ctx;
  char path[128];
  snprintf(path, sizeof path, "/tmp/brigade-test-log-once.%d", (int)getpid());
  unlink(path);
  clear_launcher_env();
  setenv("BRIGADE_DEBUG", "WARN", 1);
  setenv("BRIGADE_DEBUG_FILE", path, 1);
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t slen = sizeof sa;
  if (lfd < 0 || bind(lfd, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(lfd, 1) < 0 ||
      getsockname(lfd, (struct sockaddr *)&sa, &slen) < 0) {
    mp_fail("cannot hold a port for the test: %s", strerror(errno));
    return 1;
  }
  char port[16];
  snprintf(port, sizeof port, "%d", ntohs(sa.sin_port));
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", port, 1);
  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "1", 1);
  brg_comm *c = NULL;
  brg_status st = brg_comm_init_env(&c);
  close(lfd);
  MP_CHECK(st == BRG_ERR_SYSTEM, "brg_comm_init_env on a held port returned %s",
           brg_status_string(st));
  char want[512];
  snprintf(want, sizeof want,
           "rank 0: bootstrap root: cannot listen on 127.0.0.1:%s: Address already in use (the "
           "port of MASTER_PORT; if another program, such as torch's store, holds it, set "
           "BRIGADE_PORT to a free port)",
           port);
  const char *m = errmsg(NULL);
  MP_CHECK(strcmp(m, want) == 0, "the message is \"%s\", expected \"%s\"", m, want);
  char log[16384];
  read_file(path, log, sizeof log);
  unlink(path);
  int n = count_of(log, "cannot listen on");
  MP_CHECK(n == 1, "the failure was logged %d times, not once:\n%s", n, log);
  return 0;
}

/* Ranks that are threads of one process each get their own rank on their
 * log lines: every "rank R of N ready" line is labelled with R. */
typedef struct log_thread {
  const brg_unique_id *id;
  int rank, nranks;
  brg_status st;
} log_thread;

static void *log_thread_main(void *arg) {
  log_thread *t = arg;
  brg_comm *c = NULL;
  t->st = brg_comm_init(&c, t->nranks, t->id, t->rank);
  if (t->st != BRG_SUCCESS) return NULL;
  int32_t x = t->rank, y = 0;
  t->st = brg_allreduce(&x, &y, 1, BRG_INT32, BRG_SUM, c, NULL);
  brg_comm_destroy(c);
  return NULL;
}

static int body_log_rank(mp_ctx *ctx) {
  (void)ctx;
  enum { N = 3 };
  char path[128];
  snprintf(path, sizeof path, "/tmp/brigade-test-log-rank.%d", (int)getpid());
  unlink(path);
  setenv("BRIGADE_DEBUG", "INFO", 1);
  setenv("BRIGADE_DEBUG_SUBSYS", "init", 1);
  setenv("BRIGADE_DEBUG_FILE", path, 1);
  brg_unique_id id;
  brg_status st = brg_get_unique_id(&id);
  MP_CHECK(st == BRG_SUCCESS, "brg_get_unique_id: %s", errmsg(NULL));
  if (st != BRG_SUCCESS) return 1;
  pthread_t th[N];
  log_thread t[N];
  for (int r = 0; r < N; r++) {
    t[r] = (log_thread){.id = &id, .rank = r, .nranks = N};
    pthread_create(&th[r], NULL, log_thread_main, &t[r]);
  }
  for (int r = 0; r < N; r++) {
    pthread_join(th[r], NULL);
    MP_CHECK(t[r].st == BRG_SUCCESS, "rank %d (a thread): %s", r, brg_status_string(t[r].st));
  }
  char log[65536];
  read_file(path, log, sizeof log);
  unlink(path);
  int ready = 0;
  for (char *line = strtok(log, "\n"); line; line = strtok(NULL, "\n")) {
    const char *p = strstr(line, "] rank ");
    int labelled = -1, said = -1, of = 0;
    if (!p || sscanf(p, "] rank %d of %d ready", &said, &of) != 2) continue;
    /* host:pid:rank brigade INFO [init] ... */
    const char *sp = strchr(line, ' ');
    const char *colon = sp ? sp : line;
    while (colon > line && colon[-1] != ':') colon--;
    labelled = atoi(colon);
    ready++;
    MP_CHECK(labelled == said, "a line of rank %d is labelled rank %d: %s", said, labelled, line);
  }
  MP_CHECK(ready == N, "%d \"ready\" lines in the log, expected %d", ready, N);
  return 0;
}

static int case_log(void) {
  int bad = 0;
  mp_opts o = {.name = "log: an error without a communicator is logged once",
               .nranks = 1,
               .deadline_ms = 20000,
               .init = MP_INIT_BARE};
  bad |= mp_run(&o, body_log_once, NULL);
  mp_opts o2 = {.name = "log: ranks as threads label their own lines",
                .nranks = 1,
                .deadline_ms = 60000,
                .init = MP_INIT_BARE};
  bad |= mp_run(&o2, body_log_rank, NULL);
  return bad;
}

/* ======================================================== derived secret */

/* A secret derived from the rendezvous on a non-loopback address draws a
 * warning that says how to set a real one; on loopback, or with
 * BRIGADE_SECRET set, there is none. */
typedef struct secret_case {
  const char *what;
  int loopback, secret, warn;
} secret_case;

static int body_secret(mp_ctx *ctx) {
  const secret_case *sc = ctx->arg;
  char addr[64] = "127.0.0.1";
  if (!sc->loopback) {
    struct ifaddrs *ifs = NULL, *a;
    int found = 0;
    if (getifaddrs(&ifs) == 0)
      for (a = ifs; a && !found; a = a->ifa_next)
        if (a->ifa_addr && a->ifa_addr->sa_family == AF_INET && !(a->ifa_flags & IFF_LOOPBACK) &&
            (a->ifa_flags & IFF_UP))
          found = inet_ntop(AF_INET, &((struct sockaddr_in *)a->ifa_addr)->sin_addr, addr,
                            sizeof addr) != NULL;
    if (ifs) freeifaddrs(ifs);
    if (!found) {
      mp_info("%s: no non-loopback IPv4 address here; nothing to check", sc->what);
      return 0;
    }
  }
  char path[128], port[16];
  snprintf(path, sizeof path, "/tmp/brigade-test-secret.%d", (int)getpid());
  unlink(path);
  snprintf(port, sizeof port, "%d", mp_free_port());
  clear_launcher_env();
  setenv("BRIGADE_DEBUG", "WARN", 1);
  setenv("BRIGADE_DEBUG_FILE", path, 1);
  setenv("MASTER_ADDR", addr, 1);
  setenv("MASTER_PORT", port, 1);
  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "1", 1);
  if (sc->secret)
    setenv("BRIGADE_SECRET", "00112233445566778899aabbccddeeff", 1);
  else
    unsetenv("BRIGADE_SECRET");
  brg_comm *c = NULL;
  brg_status st = brg_comm_init_env(&c);
  if (st != BRG_SUCCESS) {
    mp_fail("%s: brg_comm_init_env at %s: %s: %s", sc->what, addr, brg_status_string(st),
            errmsg(NULL));
    return 1;
  }
  brg_comm_destroy(c);
  char text[8192];
  read_file(path, text, sizeof text);
  unlink(path);
  int warned = strstr(text, "BRIGADE_SECRET is not set") != NULL;
  MP_CHECK(warned == sc->warn, "%s (MASTER_ADDR=%s): %s: \"%s\"", sc->what, addr,
           sc->warn ? "no warning about the derived secret" : "an unexpected warning", text);
  return 0;
}

static int case_secret(void) {
  static const secret_case cases[] = {
      {"derived secret, non-loopback address", 0, 0, 1},
      {"derived secret, loopback address", 1, 0, 0},
      {"BRIGADE_SECRET set, non-loopback address", 0, 1, 0},
  };
  int bad = 0;
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    mp_opts o = {.name = cases[k].what, .nranks = 1, .deadline_ms = 20000, .init = MP_INIT_BARE};
    bad |= mp_run(&o, body_secret, (void *)&cases[k]);
  }
  return bad;
}

/* =============================================================== launch */

/* What a launcher's environment leads to: no launcher at all (one rank, said
 * at INFO), MASTER_PORT held by another program (torch's store under
 * mp.spawn) with and without BRIGADE_PORT, and BRIGADE_DEBUG_SUBSYS with a
 * name that is not a subsystem. */

typedef struct store_arg {
  int lfd;  /* listening on MASTER_PORT, as another program's store */
  int port; /* that port */
  int brigade_port;
  int nranks;
} store_arg;

/* Accepts and hangs up on every connection, as a store that does not speak
 * brigade's protocol does, until every rank is through. */
static void *foreign_store_thread(void *argp) {
  store_arg *a = argp;
  mp_shared *sh = mp_shared_area();
  int64_t end = mp_now_ns() + 30 * 1000000000LL;
  while (__atomic_load_n(&sh->flags[1], __ATOMIC_ACQUIRE) < a->nranks && mp_now_ns() < end) {
    struct pollfd p = {.fd = a->lfd, .events = POLLIN};
    if (poll(&p, 1, 20) == 1) {
      int fd = accept(a->lfd, NULL, NULL);
      if (fd >= 0) close(fd);
    }
  }
  return NULL;
}

static int hold_port(int *port_out) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t slen = sizeof sa;
  if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(fd, 16) < 0 ||
      getsockname(fd, (struct sockaddr *)&sa, &slen) < 0) {
    fprintf(stderr, "cannot hold a port for the test: %s\n", strerror(errno));
    if (fd >= 0) close(fd);
    return -1;
  }
  *port_out = ntohs(sa.sin_port);
  return fd;
}

static void set_launcher_env(int master_port, int brigade_port, int rank, int nranks) {
  char buf[32];
  clear_launcher_env();
  unsetenv("BRIGADE_PORT");
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  snprintf(buf, sizeof buf, "%d", master_port);
  setenv("MASTER_PORT", buf, 1);
  if (brigade_port > 0) {
    snprintf(buf, sizeof buf, "%d", brigade_port);
    setenv("BRIGADE_PORT", buf, 1);
  }
  snprintf(buf, sizeof buf, "%d", rank);
  setenv("RANK", buf, 1);
  snprintf(buf, sizeof buf, "%d", nranks);
  setenv("WORLD_SIZE", buf, 1);
}

/* MASTER_PORT is another program's; BRIGADE_PORT moves brigade aside. */
static int body_port(mp_ctx *ctx) {
  const store_arg *a = ctx->arg;
  set_launcher_env(a->port, a->brigade_port, ctx->rank, ctx->nranks);
  brg_comm *c = NULL;
  brg_status st = brg_comm_init_env(&c);
  if (st != BRG_SUCCESS) {
    mp_fail("brg_comm_init_env with BRIGADE_PORT=%d beside a held MASTER_PORT=%d: %s: %s",
            a->brigade_port, a->port, brg_status_string(st), errmsg(NULL));
    __atomic_fetch_add(&ctx->shared->flags[1], 1, __ATOMIC_ACQ_REL);
    return 1;
  }
  small_allreduce_ok(c, ctx->rank, ctx->nranks, "allreduce on a BRIGADE_PORT communicator");
  st = brg_comm_destroy(c);
  MP_CHECK(st == BRG_SUCCESS, "brg_comm_destroy: %s", brg_status_string(st));
  __atomic_fetch_add(&ctx->shared->flags[1], 1, __ATOMIC_ACQ_REL);
  return 0;
}

/* MASTER_PORT is another program's and nothing moves brigade aside: rank 0
 * cannot listen and says so with the way out; the others, who can only see
 * that whoever answers at that port hangs up, name both possible causes. */
static int body_port_held(mp_ctx *ctx) {
  const store_arg *a = ctx->arg;
  set_launcher_env(a->port, 0, ctx->rank, ctx->nranks);
  brg_comm *c = NULL;
  int64_t t0 = mp_now_ns();
  brg_status st = brg_comm_init_env(&c);
  const char *m = errmsg(NULL);
  __atomic_fetch_add(&ctx->shared->flags[1], 1, __ATOMIC_ACQ_REL);
  if (st == BRG_SUCCESS) {
    mp_fail("brg_comm_init_env succeeded although MASTER_PORT is another program's");
    brg_comm_destroy(c);
    return 1;
  }
  MP_CHECK(ms_since(t0) < 5000, "brg_comm_init_env took %.0f ms to fail", ms_since(t0));
  if (ctx->rank == 0) {
    MP_CHECK(st == BRG_ERR_SYSTEM, "rank 0: %s, expected BRG_ERR_SYSTEM", brg_status_string(st));
    MP_CHECK(strstr(m, "cannot listen on") && strstr(m, "Address already in use") &&
                 strstr(m, "MASTER_PORT") && strstr(m, "set BRIGADE_PORT"),
             "rank 0's message does not name the held port and BRIGADE_PORT: \"%s\"", m);
  } else {
    MP_CHECK(st == BRG_ERR_REMOTE, "rank %d: %s, expected BRG_ERR_REMOTE", ctx->rank,
             brg_status_string(st));
    MP_CHECK(strstr(m, "not this job's rank 0") && strstr(m, "could not listen") &&
                 strstr(m, "BRIGADE_PORT") && strstr(m, "brigade older"),
             "rank %d's message does not name both causes: \"%s\"", ctx->rank, m);
  }
  return 0;
}

/* No launcher variables at all: one rank, and an INFO line that says so. */
static int body_alone(mp_ctx *ctx) {
  (void)ctx;
  char path[128];
  snprintf(path, sizeof path, "/tmp/brigade-test-alone.%d", (int)getpid());
  unlink(path);
  clear_launcher_env();
  setenv("BRIGADE_DEBUG", "INFO", 1);
  setenv("BRIGADE_DEBUG_FILE", path, 1);
  brg_comm *c = NULL;
  brg_status st = brg_comm_init_env(&c);
  char log[16384];
  read_file(path, log, sizeof log);
  unlink(path);
  if (st != BRG_SUCCESS) {
    mp_fail("brg_comm_init_env without a launcher: %s: %s", brg_status_string(st), errmsg(NULL));
    return 1;
  }
  int rank = -1, size = -1;
  brg_comm_rank(c, &rank);
  brg_comm_size(c, &size);
  MP_CHECK(rank == 0 && size == 1, "without a launcher: rank %d of %d, expected 0 of 1", rank,
           size);
  MP_CHECK(strstr(log, "INFO [init] brg_comm_init_env: no launcher variables") &&
               strstr(log, "running as a single rank"),
           "no INFO line says the rank runs alone:\n%s", log);
  small_allreduce_ok(c, 0, 1, "allreduce on a communicator of one");
  st = brg_comm_destroy(c);
  MP_CHECK(st == BRG_SUCCESS, "brg_comm_destroy: %s", brg_status_string(st));
  return 0;
}

/* BRIGADE_DEBUG_SUBSYS: every name must be a subsystem. */
typedef struct subsys_case {
  const char *value;
  const char *bad; /* the name the message must quote; NULL: accepted */
} subsys_case;

static int body_subsys(mp_ctx *ctx) {
  const subsys_case *sc = ctx->arg;
  clear_launcher_env();
  setenv("BRIGADE_DEBUG_SUBSYS", sc->value, 1);
  brg_unique_id id;
  brg_status st = brg_get_unique_id(&id);
  const char *m = errmsg(NULL);
  if (!sc->bad) {
    MP_CHECK(st == BRG_SUCCESS, "BRIGADE_DEBUG_SUBSYS=%s refused: %s", sc->value, m);
    if (st != BRG_SUCCESS) return 1;
    brg_comm *c = NULL;
    st = brg_comm_init(&c, 1, &id, 0);
    MP_CHECK(st == BRG_SUCCESS, "brg_comm_init with BRIGADE_DEBUG_SUBSYS=%s: %s", sc->value,
             errmsg(NULL));
    if (st == BRG_SUCCESS) brg_comm_destroy(c);
    return 0;
  }
  MP_CHECK(st == BRG_ERR_INVALID_ARGUMENT, "BRIGADE_DEBUG_SUBSYS=%s: %s, expected refusal",
           sc->value, brg_status_string(st));
  char want[256];
  snprintf(want, sizeof want,
           "BRIGADE_DEBUG_SUBSYS=\"%s\": \"%s\" is not a subsystem; the subsystems are "
           "init,bootstrap,ring,coll,shm,tcp,ib (or all)",
           sc->value, sc->bad);
  MP_CHECK(strcmp(m, want) == 0, "the message is \"%s\", expected \"%s\"", m, want);
  brg_comm *c = NULL;
  st = brg_comm_init_env(&c);
  MP_CHECK(st == BRG_ERR_INVALID_ARGUMENT && strstr(errmsg(NULL), "is not a subsystem"),
           "brg_comm_init_env with BRIGADE_DEBUG_SUBSYS=%s: %s: %s", sc->value,
           brg_status_string(st), errmsg(NULL));
  return 0;
}

/* BRIGADE_ALGO must name an algorithm: refused before anything starts. */
static int body_bad_algo(mp_ctx *ctx) {
  (void)ctx;
  clear_launcher_env();
  setenv("BRIGADE_ALGO", "fastest", 1);
  brg_unique_id id;
  brg_status st = brg_get_unique_id(&id);
  const char *want =
      "BRIGADE_ALGO=\"fastest\" is not an allreduce algorithm (ring, hier, tree, rhd or auto)";
  MP_CHECK(st == BRG_ERR_INVALID_ARGUMENT && strcmp(errmsg(NULL), want) == 0,
           "brg_get_unique_id with BRIGADE_ALGO=fastest: %s: \"%s\", expected \"%s\"",
           brg_status_string(st), errmsg(NULL), want);
  brg_comm *c = NULL;
  st = brg_comm_init_env(&c);
  MP_CHECK(st == BRG_ERR_INVALID_ARGUMENT && strstr(errmsg(NULL), "BRIGADE_ALGO=\"fastest\""),
           "brg_comm_init_env with BRIGADE_ALGO=fastest: %s: %s", brg_status_string(st),
           errmsg(NULL));
  return 0;
}

/* BRIGADE_DEVICE_LL_BYTES is auto or a size of 0 to 4M: refused before
 * anything starts, named (the settings load once per process: one value). */
static int body_bad_ll(mp_ctx *ctx) {
  (void)ctx;
  clear_launcher_env();
  setenv("BRIGADE_DEVICE_LL_BYTES", "8M", 1);
  brg_unique_id id;
  brg_status st = brg_get_unique_id(&id);
  const char *want = "BRIGADE_DEVICE_LL_BYTES=\"8M\" is neither auto nor a size of 0 to 4M";
  MP_CHECK(st == BRG_ERR_INVALID_ARGUMENT && strcmp(errmsg(NULL), want) == 0,
           "brg_get_unique_id with BRIGADE_DEVICE_LL_BYTES=8M: %s: \"%s\", expected \"%s\"",
           brg_status_string(st), errmsg(NULL), want);
  return 0;
}

static int case_launch(void) {
  int bad = 0;
  mp_opts o = {.name = "launch: no launcher runs as one rank",
               .nranks = 1,
               .deadline_ms = 20000,
               .init = MP_INIT_BARE};
  bad |= mp_run(&o, body_alone, NULL);

  mp_opts ao = {.name = "launch: BRIGADE_ALGO=fastest is refused",
                .nranks = 1,
                .deadline_ms = 20000,
                .init = MP_INIT_BARE};
  bad |= mp_run(&ao, body_bad_algo, NULL);

  mp_opts lo = {.name = "launch: BRIGADE_DEVICE_LL_BYTES out of range is refused",
                .nranks = 1,
                .deadline_ms = 20000,
                .init = MP_INIT_BARE};
  bad |= mp_run(&lo, body_bad_ll, NULL);

  static const subsys_case subsys[] = {{"boot", "boot"},   {"init,boot,ring", "boot"},
                                       {"init,", ""},      {"init,bootstrap,ring,coll", NULL},
                                       {"INIT,Tcp", NULL}, {"all", NULL}};
  for (size_t k = 0; k < sizeof subsys / sizeof subsys[0]; k++) {
    char name[96];
    snprintf(name, sizeof name, "launch: BRIGADE_DEBUG_SUBSYS=%s", subsys[k].value);
    mp_opts so = {.name = name, .nranks = 1, .deadline_ms = 20000, .init = MP_INIT_BARE};
    bad |= mp_run(&so, body_subsys, (void *)&subsys[k]);
  }

  for (int held = 0; held < 2; held++) {
    for (int n = 2; n <= 3; n++) {
      store_arg a = {.nranks = n};
      a.lfd = hold_port(&a.port);
      if (a.lfd < 0) return 1;
      a.brigade_port = held ? 0 : mp_free_port();
      char name[96];
      snprintf(name, sizeof name, "launch: MASTER_PORT held by another program, %s, N=%d",
               held ? "no BRIGADE_PORT" : "BRIGADE_PORT set", n);
      mp_opts po = {.name = name,
                    .nranks = n,
                    .deadline_ms = 30000,
                    .init = MP_INIT_BARE,
                    .parent_thread = foreign_store_thread,
                    .parent_arg = &a};
      bad |= mp_run(&po, held ? body_port_held : body_port, &a);
      close(a.lfd);
    }
  }
  return bad;
}

/* ============================================================== threads */

/* What docs/api.md ("Threads") promises for one communicator used by
 * several threads at once: the calls are serialized (memory-safe, each
 * either right to the last element or an error), and since nothing orders
 * the threads the same way on every rank, calls that pair up differently
 * across ranks are caught as BRG_ERR_MISMATCH (here their counts differ),
 * never wrong numbers or a hang. Then, with one lock per rank taken around
 * each call in the same agreed order, the same calls all succeed. */

#define TH_THREADS 2
#define TH_ITERS 200

typedef struct th_arg {
  mp_ctx *ctx;
  int t;                  /* thread index: count 64 * (t + 1) */
  pthread_mutex_t *order; /* NULL: race; else taken in turn (t = iteration parity) */
  int *turn;
  pthread_cond_t *cond;
  brg_status st;
  int done, wrong;
} th_arg;

static void *th_main(void *argp) {
  th_arg *a = argp;
  int n = a->ctx->nranks, r = a->ctx->rank;
  size_t count = 64u * (size_t)(a->t + 1);
  float in[128], out[128];
  for (int it = 0; it < TH_ITERS; it++) {
    for (size_t i = 0; i < count; i++) in[i] = (float)(r + 1 + (int)i % 3);
    if (a->order) {
      pthread_mutex_lock(a->order);
      while (*a->turn != a->t) pthread_cond_wait(a->cond, a->order);
    }
    brg_status st = brg_allreduce(in, out, count, BRG_FLOAT32, BRG_SUM, a->ctx->comm, NULL);
    if (a->order) {
      *a->turn = (a->t + 1) % TH_THREADS;
      pthread_cond_broadcast(a->cond);
      pthread_mutex_unlock(a->order);
    }
    if (st != BRG_SUCCESS) {
      a->st = st;
      break;
    }
    for (size_t i = 0; i < count; i++)
      if (out[i] != (float)(n * (n + 1) / 2 + n * ((int)i % 3))) a->wrong++;
    a->done++;
  }
  return NULL;
}

static int body_threads(mp_ctx *ctx) {
  int ordered = *(const int *)ctx->arg;
  pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
  pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
  int turn = 0;
  pthread_t th[TH_THREADS];
  th_arg a[TH_THREADS];
  for (int t = 0; t < TH_THREADS; t++) {
    a[t] = (th_arg){.ctx = ctx, .t = t, .st = BRG_SUCCESS};
    if (ordered) a[t].order = &lock, a[t].turn = &turn, a[t].cond = &cond;
    pthread_create(&th[t], NULL, th_main, &a[t]);
  }
  for (int t = 0; t < TH_THREADS; t++) pthread_join(th[t], NULL);
  for (int t = 0; t < TH_THREADS; t++) {
    MP_CHECK(a[t].wrong == 0, "thread %d: %d wrong elements in %d calls that succeeded", t,
             a[t].wrong, a[t].done);
    if (ordered)
      MP_CHECK(a[t].st == BRG_SUCCESS && a[t].done == TH_ITERS,
               "thread %d, calls in an agreed order: %s after %d calls: %s", t,
               brg_status_string(a[t].st), a[t].done, errmsg(ctx->comm));
    else
      MP_CHECK(a[t].st == BRG_SUCCESS || a[t].st == BRG_ERR_MISMATCH || a[t].st == BRG_ERR_REMOTE,
               "thread %d, racing calls: %s (expected success, BRG_ERR_MISMATCH or, when the "
               "other rank saw it first, BRG_ERR_REMOTE): %s",
               t, brg_status_string(a[t].st), errmsg(ctx->comm));
  }
  if (!ordered)
    mp_info("racing threads: %d and %d calls succeeded, then %s", a[0].done, a[1].done,
            brg_status_string(a[0].st != BRG_SUCCESS ? a[0].st : a[1].st));
  return 0;
}

static int case_threads(int n) {
  int bad = 0;
  for (int ordered = 0; ordered < 2; ordered++) {
    char name[96];
    snprintf(name, sizeof name, "threads: two threads on one communicator, %s",
             ordered ? "in an agreed order" : "racing");
    mp_opts o = {.name = name, .nranks = n, .deadline_ms = 60000, .init = MP_INIT_ID};
    bad |= mp_run(&o, body_threads, &ordered);
  }
  return bad;
}

/* ================================================================= main */

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr,
            "usage: %s "
            "args|garbage|garbage_open|absent|kill|stop|abort|mismatch|rings_mismatch|transports_"
            "mismatch|"
            "env|log|secret|"
            "launch|"
            "threads [N]\n",
            argv[0]);
    return 2;
  }
  const char *c = argv[1];
  int n = argc > 2 ? atoi(argv[2]) : 2;
  g_timeout_ms = mp_env_int("BRIGADE_TIMEOUT_MS", 0);
  if (g_timeout_ms <= 0 && (!strcmp(c, "absent") || !strcmp(c, "kill") || !strcmp(c, "stop"))) {
    fprintf(stderr, "%s needs BRIGADE_TIMEOUT_MS\n", c);
    return 2;
  }
  if (!strcmp(c, "args")) return case_args(n);
  if (!strcmp(c, "garbage")) return case_garbage(n, 0);
  if (!strcmp(c, "garbage_open")) return case_garbage(n, 1);
  if (!strcmp(c, "absent")) return case_absent(n);
  if (!strcmp(c, "kill")) return case_victim(n, SIGKILL);
  if (!strcmp(c, "stop")) return case_victim(n, SIGSTOP);
  if (!strcmp(c, "abort")) return case_abort(n);
  if (!strcmp(c, "mismatch")) return case_mismatch(n);
  if (!strcmp(c, "rings_mismatch")) return case_rings_mismatch(n);
  if (!strcmp(c, "transports_mismatch")) return case_transports_mismatch(n);
  if (!strcmp(c, "env")) return case_env();
  if (!strcmp(c, "log")) return case_log();
  if (!strcmp(c, "secret")) return case_secret();
  if (!strcmp(c, "launch")) return case_launch();
  if (!strcmp(c, "threads")) return case_threads(n);
  fprintf(stderr, "unknown case %s\n", c);
  return 2;
}
