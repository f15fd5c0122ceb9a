/*
 * Point-to-point and all_to_all on forked ranks: brg_send, brg_recv,
 * brg_isend, brg_irecv, their tagged forms and brg_all_to_all, every byte of every message
 * checked against a pattern the receiver computes itself from (sender,
 * receiver, message tag, byte index).
 *
 *   test_p2p N case...   (the transport of the ring from BRIGADE_TRANSPORTS)
 *
 * Cases:
 *   fallback  (first, N = 2, shm) the shm link from rank 0 to rank 1
 *             cannot be set up (rank 1 may not size files): those messages take the
 *             table's next transport, tcp, where it is allowed, the other
 *             way shm, every byte checked; with shm alone the send fails
 *             (BRG_ERR_UNAVAILABLE, naming shm's failure)
 *   links     (first) the first messages of each pair take the link of
 *             the transport table: shm where shm is allowed (2 shm FIFOs
 *             mapped, 2 sockets more), tcp where only tcp is (no FIFO, 4
 *             sockets more: a connection and a tcp link each way),
 *             ibverbs where only it is (an eventfd each way)
 *   ring      every dtype and count: each rank sends to the next and
 *             receives from the previous (even ranks send first, odd ranks
 *             receive first), blocking and non-blocking
 *   pairs     every rank to every rank, itself included, all sends before
 *             any receive, counts differing per pair, in-order matching of
 *             several messages per pair
 *   crossed   pairs (0,1), (2,3) send 32 MiB to each other first and only
 *             then receive: eager sends must not deadlock
 *   a2a       all_to_all for every dtype and count, in and out of place,
 *             between allreduces whose results are checked too
 *   mismatch  a receive of the wrong count, then of the wrong dtype:
 *             BRG_ERR_MISMATCH naming both; the next message still matches
 *   args      bad peer, NULL buffer, a stream, unknown dtype, request reuse
 *   timeout   rank 0 receives from a live rank that never sends:
 *             BRG_ERR_TIMEOUT naming it, after the timeout and within 5 s more
 *   dies      the last rank is killed while the others wait to receive from
 *             it: an error naming it within the timeout + 5 s
 *   threads   a ring of messages on a second thread while the first runs
 *             allreduces and all_to_alls on the same communicator
 *   a2a_mismatch
 *             all_to_all with rank 0 passing count 8 and the others 9:
 *             BRG_ERR_MISMATCH on every rank naming both counts (the last
 *             rank of 3 or more comes 300 ms late), nothing written past
 *             either buffer, the next collective (in place) fails at once
 *   a2a_mismatch_inplace
 *             the same with the in-place call first
 *   a2a_other rank 0 calls all_to_all, the others allreduce: BRG_ERR_MISMATCH
 *             naming both on every rank within 8 s (the timeout is 30 s)
 *   early     (BRIGADE_P2P_EARLY_BYTES small, 1 MiB) rank 0 isends far more
 *             than the cap, and a message larger than it, before rank 1
 *             posts any receive: every isend returns at once, rank 1's
 *             resident memory grows by less than 12 MiB of the 29 MiB sent,
 *             the last isends stay unfinished until rank 1 receives (where
 *             the socket buffers could not hold them all), then every byte
 *             arrives; a blocking send larger than the cap goes through to
 *             a receive posted late
 *   any       receives from any source (BRG_ANY_SOURCE) on rank 0, posted
 *             before and after the messages came, beside receives naming
 *             the sender, blocking, past the early cap; the sender
 *             brg_request_source names, every byte, each sender's order
 *   tags      brg_*_tagged: each rank sends tag 7, then tag 8, to the next,
 *             which receives tag 8 first, with its receives posted first and
 *             with the messages in early memory; receives from any source
 *             with a tag beside receives of another tag naming each sender;
 *             a negative tag refused
 *   held      (a 1 MiB cap, a short timeout) rank 0 sends 2 MiB, then 32 MiB
 *             (more where the socket buffers could hold that)
 *             that rank 1 never receives: the second send fails with
 *             BRG_ERR_TIMEOUT naming rank 1 and BRIGADE_P2P_EARLY_BYTES within
 *             the timeout + 5 s; the first still arrives whole
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "harness.h"

static const brg_dtype DTYPES[BRG_NUM_DTYPES] = {BRG_INT8,    BRG_UINT8,  BRG_INT32,   BRG_UINT32,
                                                 BRG_INT64,   BRG_UINT64, BRG_FLOAT16, BRG_BFLOAT16,
                                                 BRG_FLOAT32, BRG_FLOAT64};
static const size_t COUNTS[] = {0, 1, 7, 4099};
#define BIG_COUNT 1000003

/* Byte k of message `tag` from rank `src` to rank `dst`: a mix that no two
 * (src, dst, tag) share at any k. */
static unsigned char pat(int src, int dst, int tag, size_t k) {
  uint64_t x =
      ((uint64_t)(src + 1) << 48) ^ ((uint64_t)(dst + 1) << 32) ^ ((uint64_t)tag << 20) ^ k;
  x ^= x >> 29;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 32;
  return (unsigned char)x;
}

static void fill(unsigned char *b, size_t bytes, int src, int dst, int tag) {
  for (size_t k = 0; k < bytes; k++) b[k] = pat(src, dst, tag, k);
}

/* Every byte against the pattern; the first wrong one is reported. */
static int check(const unsigned char *b, size_t bytes, int src, int dst, int tag,
                 const char *what) {
  for (size_t k = 0; k < bytes; k++)
    if (b[k] != pat(src, dst, tag, k)) {
      mp_fail("%s: byte %zu of the message from rank %d to rank %d (tag %d) is 0x%02x, expected "
              "0x%02x",
              what, k, src, dst, tag, b[k], pat(src, dst, tag, k));
      return 1;
    }
  return 0;
}

static void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p) {
    mp_fail("out of memory for %zu bytes", n);
    exit(1);
  }
  return p;
}

#define OK(call)                                                                                   \
  do {                                                                                             \
    brg_status st_ = (call);                                                                       \
    if (st_ != BRG_SUCCESS) {                                                                      \
      mp_fail("%s: %s: %s", #call, brg_status_string(st_), brg_comm_last_error(c));                \
      return 1;                                                                                    \
    }                                                                                              \
  } while (0)

static int case_ring(mp_ctx *ctx) {
  brg_comm *c = ctx->comm;
  int n = ctx->nranks, r = ctx->rank, next = (r + 1) % n, prev = (r - 1 + n) % n;
  int tag = 0;
  for (int d = 0; d < BRG_NUM_DTYPES; d++) {
    size_t es = brg_dtype_size(DTYPES[d]);
    for (size_t ci = 0; ci <= sizeof COUNTS / sizeof *COUNTS; ci++) {
      /* The large count for two dtypes only: time. */
      if (ci == sizeof COUNTS / sizeof *COUNTS && d != 0 && d != 9) continue;
      size_t count = ci < sizeof COUNTS / sizeof *COUNTS ? COUNTS[ci] : BIG_COUNT;
      size_t bytes = count * es;
      unsigned char *s = xmalloc(bytes), *g = xmalloc(bytes);
      fill(s, bytes, r, next, tag);
      memset(g, 0xee, bytes);
      int nb = (tag & 1) != 0; /* every other message non-blocking */
      if (!nb) {
        if (r % 2 == 0) {
          OK(brg_send(s, count, DTYPES[d], next, c, NULL));
          OK(brg_recv(g, count, DTYPES[d], prev, c, NULL));
        } else {
          OK(brg_recv(g, count, DTYPES[d], prev, c, NULL));
          OK(brg_send(s, count, DTYPES[d], next, c, NULL));
        }
      } else {
        brg_request rs, rr;
        OK(brg_irecv(g, count, DTYPES[d], prev, c, &rr));
        OK(brg_isend(s, count, DTYPES[d], next, c, &rs));
        OK(brg_wait(&rs));
        int done = 0;
        brg_status st;
        while ((st = brg_test(&rr, &done)) == BRG_IN_PROGRESS && !done) mp_sleep_ms(0);
        OK(st);
      }
      char what[96];
      snprintf(what, sizeof what, "ring %s count %zu%s", brg_dtype_name(DTYPES[d]), count,
               nb ? " (isend/irecv)" : "");
      int bad = check(g, bytes, prev, r, tag, what);
      free(s);
      free(g);
      if (bad) return 1;
      tag++;
    }
  }
  return 0;
}

/* Message m from src to dst has this count: every pair different, 0 too. */
static size_t pair_count(int src, int dst, int m) {
  return (size_t)((src * 7 + dst * 3 + m * 5) % 11) * 97 + (size_t)m;
}

static int case_pairs(mp_ctx *ctx) {
  brg_comm *c = ctx->comm;
  int n = ctx->nranks, r = ctx->rank;
  enum { MSGS = 3 };
  for (int d = 0; d < BRG_NUM_DTYPES; d++) {
    brg_dtype dt = DTYPES[d];
    size_t es = brg_dtype_size(dt);
    /* Even dtypes: blocking sends to everyone, then blocking receives.
     * Odd ones: every receive posted first (irecv), then isends. */
    unsigned char *in[MP_MAX_RANKS][MSGS];
    brg_request rq[MP_MAX_RANKS][MSGS];
    for (int j = 0; j < n; j++)
      for (int m = 0; m < MSGS; m++) {
        in[j][m] = xmalloc(pair_count(j, r, m) * es);
        memset(in[j][m], 0xee, pair_count(j, r, m) * es);
        if (d % 2) OK(brg_irecv(in[j][m], pair_count(j, r, m), dt, j, c, &rq[j][m]));
      }
    for (int m = 0; m < MSGS; m++)
      for (int i = 0; i < n; i++) {
        int j = (r + i) % n;
        size_t cnt = pair_count(r, j, m);
        unsigned char *s = xmalloc(cnt * es);
        fill(s, cnt * es, r, j, d * MSGS + m);
        if (d % 2) {
          brg_request sq;
          OK(brg_isend(s, cnt, dt, j, c, &sq));
          OK(brg_wait(&sq));
        } else {
          OK(brg_send(s, cnt, dt, j, c, NULL));
        }
        free(s);
      }
    int bad = 0;
    for (int i = 0; i < n; i++) {
      int j = (r - i + n) % n;
      for (int m = 0; m < MSGS; m++) {
        if (d % 2)
          OK(brg_wait(&rq[j][m]));
        else
          OK(brg_recv(in[j][m], pair_count(j, r, m), dt, j, c, NULL));
        char what[64];
        snprintf(what, sizeof what, "pairs %s message %d", brg_dtype_name(dt), m);
        bad |= check(in[j][m], pair_count(j, r, m) * es, j, r, d * MSGS + m, what);
        free(in[j][m]);
      }
    }
    if (bad) return 1;
  }
  return 0;
}

static int case_crossed(mp_ctx *ctx) {
  brg_comm *c = ctx->comm;
  int r = ctx->rank, peer = r ^ 1;
  if (peer >= ctx->nranks) return 0;                 /* the odd one out */
  size_t count = (size_t)8 << 20, bytes = count * 4; /* 32 MiB */
  unsigned char *s = xmalloc(bytes), *g = xmalloc(bytes);
  fill(s, bytes, r, peer, 77);
  memset(g, 0xee, bytes);
  int64_t t0 = mp_now_ns();
  OK(brg_send(s, count, BRG_FLOAT32, peer, c, NULL));
  OK(brg_recv(g, count, BRG_FLOAT32, peer, c, NULL));
  mp_info("crossed: 32 MiB each way, send before recv, in %.0f ms", (mp_now_ns() - t0) / 1e6);
  int bad = check(g, bytes, peer, r, 77, "crossed");
  free(s);
  free(g);
  return bad;
}

/* Mappings of brigade's shm FIFOs in this process (deleted names too). */
static int shm_maps(void) {
  FILE *f = fopen("/proc/self/maps", "r");
  if (!f) return -1;
  char line[512];
  int n = 0;
  while (fgets(line, sizeof line, f))
    if (strstr(line, "/dev/shm/brigade-") && strstr(line, "-from-")) n++;
  fclose(f);
  return n;
}

/* Descriptors this process holds whose link starts with `kind`
 * ("socket:", "anon_inode:[eventfd]"). */
static int fds_of(const char *kind) {
  DIR *d = opendir("/proc/self/fd");
  if (!d) return -1;
  int n = 0;
  for (struct dirent *e; (e = readdir(d));) {
    char path[300], to[64];
    snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
    ssize_t k = readlink(path, to, sizeof to - 1);
    if (k > 0 && (to[k] = 0, !strncmp(to, kind, strlen(kind)))) n++;
  }
  closedir(d);
  return n;
}

/* Run first: the first messages between pairs (0,1), (2,3) take a link
 * of the transport table where shm is allowed (one more FIFO mapped each
 * way: the one this rank receives on, the peer's it sends into), one of
 * tcp where only tcp is (a socket of its own each way beside the two
 * connections: 4 sockets more, where p2p's own TCP would make 2), and
 * one of ibverbs where only it is (its readiness an eventfd each way).
 * Every byte checked. */
static int case_links(mp_ctx *ctx) {
  brg_comm *c = ctx->comm;
  int r = ctx->rank, peer = r ^ 1;
  int32_t one = 1; /* barriers: around the count, and after (no later case links to it first) */
  if (peer >= ctx->nranks) {
    for (int i = 0; i < 3; i++) OK(brg_allreduce(&one, &one, 1, BRG_INT32, BRG_SUM, c, NULL));
    return 0;
  }
  const char *tr = getenv("BRIGADE_TRANSPORTS");
  int shm = !tr || !*tr || strstr(tr, "shm") != NULL;
  /* The peer's first send dials this rank, and this rank's liveness
   * thread takes the connection in as it comes, calls or no calls: both
   * count only once both have counted (the first allreduce sets up what
   * it needs before the count, the second holds the peer back). */
  OK(brg_allreduce(&one, &one, 1, BRG_INT32, BRG_SUM, c, NULL));
  int before = shm_maps(), socks = fds_of("socket:"), evs = fds_of("anon_inode:[eventfd]");
  OK(brg_allreduce(&one, &one, 1, BRG_INT32, BRG_SUM, c, NULL));
  size_t bytes = 3 << 20;
  unsigned char *s = xmalloc(bytes), *g = xmalloc(bytes);
  fill(s, bytes, r, peer, 91);
  memset(g, 0xee, bytes);
  OK(brg_send(s, bytes, BRG_UINT8, peer, c, NULL));
  OK(brg_recv(g, bytes, BRG_UINT8, peer, c, NULL));
  int bad = check(g, bytes, peer, r, 91, "links");
  int after = shm_maps(), socks_after = fds_of("socket:");
  int evs_after = fds_of("anon_inode:[eventfd]");
  MP_CHECK(before >= 0 && after - before == (shm ? 2 : 0),
           "point-to-point to rank %d mapped %d shm FIFOs (BRIGADE_TRANSPORTS=%s): expected %d "
           "(%s)",
           peer, after - before, tr ? tr : "", shm ? 2 : 0,
           shm ? "its link and the peer's over shm" : "no FIFO");
  int tcp = !shm && tr && !strcmp(tr, "tcp");
  if (shm || tcp)
    MP_CHECK(socks >= 0 && socks_after - socks == (tcp ? 4 : 2),
             "point-to-point to rank %d made %d sockets (BRIGADE_TRANSPORTS=%s): expected %d (%s)",
             peer, socks_after - socks, tr ? tr : "", tcp ? 4 : 2,
             tcp ? "a connection and a tcp link each way" : "a connection each way");
  /* An ibverbs link's readiness is an eventfd of its own, one each way. */
  int ib = tr && !strcmp(tr, "ibverbs");
  MP_CHECK(evs >= 0 && evs_after - evs == (ib ? 2 : 0),
           "point-to-point to rank %d made %d eventfds (BRIGADE_TRANSPORTS=%s): expected %d (%s)",
           peer, evs_after - evs, tr ? tr : "", ib ? 2 : 0,
           ib ? "an ibverbs link each way" : "no ibverbs link");
  OK(brg_allreduce(&one, &one, 1, BRG_INT32, BRG_SUM, c, NULL));
  free(s);
  free(g);
  return bad || mp_failures();
}

/* Run first, N = 2 over shm: rank 1 may not size a file while the first
 * message from rank 0 sets up its link (RLIMIT_FSIZE of one page: the
 * FIFO's ftruncate fails with EFBIG; shm names cannot be taken ahead, they
 * end in a random nonce), so that its recv_setup fails. Where tcp is allowed too, that pair's messages take
 * the table's next transport, a tcp link, and arrive all the same; where
 * shm is the only one, rank 0's send fails with BRG_ERR_UNAVAILABLE
 * naming shm's failure (no link could be set up). Either way rank 1's
 * messages to rank 0 take shm (one FIFO mapped on each rank). */
static int case_fallback(mp_ctx *ctx) {
  brg_comm *c = ctx->comm;
  int r = ctx->rank, peer = 1 - r;
  int32_t one = 1;
  if (ctx->nranks != 2) return mp_fail("fallback runs at N = 2"), 1;
  const char *tr = getenv("BRIGADE_TRANSPORTS");
  int tcp = tr && strstr(tr, "tcp") != NULL;
  int before = shm_maps();
  struct rlimit fsize_was = {RLIM_INFINITY, RLIM_INFINITY};
  if (r == 1) {
    signal(SIGXFSZ, SIG_IGN);
    getrlimit(RLIMIT_FSIZE, &fsize_was);
    struct rlimit small = {4096, fsize_was.rlim_max};
    MP_CHECK(setrlimit(RLIMIT_FSIZE, &small) == 0, "setrlimit: %s", strerror(errno));
  }
  OK(brg_allreduce(&one, &one, 1, BRG_INT32, BRG_SUM, c, NULL)); /* rank 1 cannot size files */
  size_t bytes = 3 << 20;
  unsigned char *s = xmalloc(bytes), *g = xmalloc(bytes);
  fill(s, bytes, r, peer, 93);
  memset(g, 0xee, bytes);
  int bad = 0;
  if (r == 0) {
    brg_status st = brg_send(s, bytes, BRG_UINT8, peer, c, NULL);
    const char *e = brg_comm_last_error(c);
    if (tcp)
      MP_CHECK(st == BRG_SUCCESS, "send to rank 1 with its shm link refused: %s (%s)",
               brg_status_string(st), e);
    else
      MP_CHECK(st == BRG_ERR_UNAVAILABLE && mp_contains(e, "no link to rank 1") &&
                   mp_contains(e, "shm: ") && mp_contains(e, "File too large"),
               "send to rank 1 over shm alone, its shm link refused: %s (%s), expected "
               "BRG_ERR_UNAVAILABLE naming shm's failure",
               brg_status_string(st), e);
    OK(brg_recv(g, bytes, BRG_UINT8, peer, c, NULL));
    bad = check(g, bytes, peer, r, 93, "fallback");
  } else {
    if (tcp) {
      OK(brg_recv(g, bytes, BRG_UINT8, peer, c, NULL));
      bad = check(g, bytes, peer, r, 93, "fallback");
    }
    OK(brg_send(s, bytes, BRG_UINT8, peer, c, NULL));
  }
  int after = shm_maps();
  MP_CHECK(after - before == 1,
           "rank %d mapped %d shm FIFOs for point-to-point: expected 1 (rank 1 -> 0 over shm, "
           "0 -> 1 %s)",
           r, after - before, tcp ? "over tcp" : "none");
  OK(brg_allreduce(&one, &one, 1, BRG_INT32, BRG_SUM, c, NULL));
  if (r == 1) setrlimit(RLIMIT_FSIZE, &fsize_was);
  OK(brg_allreduce(&one, &one, 1, BRG_INT32, BRG_SUM, c, NULL)); /* free again */
  free(s);
  free(g);
  return bad || mp_failures();
}

/* An allreduce whose result is known: sum of (rank + 1) over the ranks. */
static int allreduce_check(brg_comm *c, int n, int r) {
  int32_t v[5];
  for (int i = 0; i < 5; i++) v[i] = (r + 1) * (i + 1);
  OK(brg_allreduce(v, v, 5, BRG_INT32, BRG_SUM, c, NULL));
  for (int i = 0; i < 5; i++)
    if (v[i] != n * (n + 1) / 2 * (i + 1)) {
      mp_fail("allreduce between all_to_alls: element %d is %d, expected %d", i, v[i],
              n * (n + 1) / 2 * (i + 1));
      return 1;
    }
  return 0;
}

static int case_a2a(mp_ctx *ctx) {
  brg_comm *c = ctx->comm;
  int n = ctx->nranks, r = ctx->rank, tag = 1000;
  for (int d = 0; d < BRG_NUM_DTYPES; d++) {
    size_t es = brg_dtype_size(DTYPES[d]);
    for (size_t ci = 0; ci <= sizeof COUNTS / sizeof *COUNTS; ci++) {
      if (ci == sizeof COUNTS / sizeof *COUNTS && d != 4) continue;
      size_t count = ci < sizeof COUNTS / sizeof *COUNTS ? COUNTS[ci] : BIG_COUNT;
      size_t bb = count * es; /* one block */
      for (int inplace = 0; inplace < 2; inplace++, tag++) {
        unsigned char *s = xmalloc(bb * (size_t)n), *g = inplace ? s : xmalloc(bb * (size_t)n);
        for (int j = 0; j < n; j++) fill(s + (size_t)j * bb, bb, r, j, tag);
        if (!inplace) memset(g, 0xee, bb * (size_t)n);
        OK(brg_all_to_all(s, g, count, DTYPES[d], c, NULL));
        char what[96];
        snprintf(what, sizeof what, "all_to_all %s count %zu %s", brg_dtype_name(DTYPES[d]), count,
                 inplace ? "in place" : "out of place");
        int bad = 0;
        for (int j = 0; j < n && !bad; j++) bad = check(g + (size_t)j * bb, bb, j, r, tag, what);
        /* Out of place the input stays as it was. */
        for (int j = 0; j < n && !bad && !inplace; j++)
          bad = check(s + (size_t)j * bb, bb, r, j, tag, "all_to_all's sendbuf afterwards");
        if (!inplace) free(g);
        free(s);
        if (bad) return 1;
      }
      if (allreduce_check(c, n, r)) return 1;
    }
  }
  return 0;
}

static int case_mismatch(mp_ctx *ctx) {
  brg_comm *c = ctx->comm;
  int r = ctx->rank;
  if (r > 1 || ctx->nranks < 2) return 0;
  float f[8] = {0};
  int32_t k[8] = {0};
  if (r == 0) {
    for (int i = 0; i < 8; i++) f[i] = (float)i + 0.5f;
    OK(brg_send(f, 7, BRG_FLOAT32, 1, c, NULL)); /* received as 8 */
    OK(brg_send(f, 7, BRG_FLOAT32, 1, c, NULL)); /* received as int32 */
    OK(brg_send(f, 8, BRG_FLOAT32, 1, c, NULL)); /* matches */
    return 0;
  }
  brg_status st = brg_recv(f, 8, BRG_FLOAT32, 0, c, NULL);
  const char *e = brg_comm_last_error(c);
  MP_CHECK(st == BRG_ERR_MISMATCH && mp_names_rank(e, 0) && strstr(e, "7 x float32") &&
               strstr(e, "8 x float32"),
           "count mismatch: %s: %s (expected BRG_ERR_MISMATCH naming rank 0, 7 and 8 x float32)",
           brg_status_string(st), e);
  st = brg_recv(k, 7, BRG_INT32, 0, c, NULL);
  e = brg_comm_last_error(c);
  MP_CHECK(st == BRG_ERR_MISMATCH && strstr(e, "7 x int32") && strstr(e, "7 x float32"),
           "dtype mismatch: %s: %s (expected BRG_ERR_MISMATCH naming int32 and float32)",
           brg_status_string(st), e);
  memset(f, 0, sizeof f);
  OK(brg_recv(f, 8, BRG_FLOAT32, 0, c, NULL));
  for (int i = 0; i < 8; i++)
    MP_CHECK(f[i] == (float)i + 0.5f, "after the mismatches: element %d is %g, expected %g", i,
             (double)f[i], (double)i + 0.5);
  return 0;
}

/* Bytes past a buffer that nothing may write. */
#define GUARD 64

/* Two all_to_alls with the counts of a2a_mismatch, out of place and in
 * place, the first of them as `first_inplace` says. */
static int a2a_mismatch_run(mp_ctx *ctx, int first_inplace) {
  brg_comm *c = ctx->comm;
  int n = ctx->nranks, r = ctx->rank;
  if (n < 2) return 0;
  size_t count = r == 0 ? 8 : 9, bb = count * sizeof(int32_t);
  for (int call = 0; call < 2; call++) {
    int inplace = call ^ first_inplace;
    unsigned char *s = xmalloc(bb * (size_t)n + GUARD);
    unsigned char *g = inplace ? s : xmalloc(bb * (size_t)n + GUARD);
    for (int j = 0; j < n; j++) fill(s + (size_t)j * bb, bb, r, j, 7000 + inplace);
    memset(s + bb * (size_t)n, 0xa5, GUARD);
    if (!inplace) memset(g, 0xee, bb * (size_t)n + GUARD);
    /* The last rank comes late: the others have found the mismatch by
     * then, and it must still hear of it rather than of their leaving. */
    if (r == n - 1 && n > 2 && call == 0) mp_sleep_ms(300);
    brg_status st = brg_all_to_all(s, g, count, BRG_INT32, c, NULL);
    const char *e = brg_comm_last_error(c);
    if (call == 0) {
      MP_CHECK(st == BRG_ERR_MISMATCH && mp_contains(e, "all_to_all") &&
                   mp_contains(e, "8 x int32") && mp_contains(e, "9 x int32") &&
                   (r == 0 ? mp_names_rank(e, 1) || mp_names_rank(e, n - 1) : mp_names_rank(e, 0)),
               "all_to_all %s with counts 8 (rank 0) and 9 (the others): %s: \"%s\" (expected "
               "BRG_ERR_MISMATCH naming all_to_all, 8 x int32, 9 x int32 and the other rank)",
               inplace ? "in place" : "out of place", brg_status_string(st), e);
    } else {
      /* The communicator failed with the first: the second fails at once. */
      MP_CHECK(st != BRG_SUCCESS, "all_to_all after a mismatch succeeded");
    }
    for (size_t k = 0; k < GUARD; k++) {
      if (s[bb * (size_t)n + k] != 0xa5 || (!inplace && g[bb * (size_t)n + k] != 0xee)) {
        mp_fail("all_to_all mismatch wrote byte %zu past the end of a buffer", k);
        break;
      }
    }
    /* Out of place the input stays as it was. */
    for (int j = 0; j < n && !inplace; j++)
      if (check(s + (size_t)j * bb, bb, r, j, 7000, "sendbuf after the mismatch")) break;
    if (!inplace) free(g);
    free(s);
  }
  return 0;
}

/* Rank 0 calls all_to_all where the others call allreduce: every rank
 * stops with BRG_ERR_MISMATCH naming all_to_all and allreduce, long
 * before the timeout. */
static int case_a2a_other(mp_ctx *ctx) {
  brg_comm *c = ctx->comm;
  int n = ctx->nranks, r = ctx->rank;
  if (n < 2) return 0;
  size_t count = 4099;
  float *s = xmalloc(count * (size_t)n * sizeof(float) + GUARD);
  float *g = xmalloc(count * (size_t)n * sizeof(float) + GUARD);
  for (size_t i = 0; i < count * (size_t)n; i++) s[i] = (float)i;
  int64_t t0 = mp_now_ns();
  brg_status st = r == 0 ? brg_all_to_all(s, g, count, BRG_FLOAT32, c, NULL)
                         : brg_allreduce(s, g, count, BRG_FLOAT32, BRG_SUM, c, NULL);
  double ms = (mp_now_ns() - t0) / 1e6;
  const char *e = brg_comm_last_error(c);
  MP_CHECK(st != BRG_SUCCESS, "rank %d: %s against the others' %s succeeded", r,
           r == 0 ? "all_to_all" : "allreduce", r == 0 ? "allreduce" : "all_to_all");
  /* Ranks beside rank 0 find the mismatch; the others hear of it. */
  MP_CHECK(st == BRG_ERR_MISMATCH && mp_contains(e, "all_to_all") && mp_contains(e, "allreduce"),
           "rank %d: %s: \"%s\" (expected BRG_ERR_MISMATCH naming all_to_all and allreduce)", r,
           brg_status_string(st), e);
  MP_CHECK(ms < 8000, "rank %d failed after %.0f ms, expected well within the 30 s timeout: %s", r,
           ms, e);
  free(s);
  free(g);
  return 0;
}

static int case_a2a_mismatch(mp_ctx *ctx) {
  return a2a_mismatch_run(ctx, 0);
}
static int case_a2a_mismatch_inplace(mp_ctx *ctx) {
  return a2a_mismatch_run(ctx, 1);
}

/* The early case's messages: counts of int32 cycling through odd sizes,
 * a quarter of them 1 MiB and a bit. */
#define EARLY_MSGS 100
static const size_t EARLY_COUNTS[] = {0, 1, 7, 4099, 262147};
#define EARLY_BIG 2097157 /* int32: 8 MiB and a bit, larger than the cap */

/* The last of the three numbers of a tcp_rmem-like file, or -1. */
static long sysctl_max(const char *path) {
  FILE *f = fopen(path, "r");
  long a, b, m = -1;
  if (f) {
    if (fscanf(f, "%ld %ld %ld", &a, &b, &m) != 3) m = -1;
    fclose(f);
  }
  return m;
}

/* Resident bytes of this process, or -1. */
static long rss_bytes(void) {
  FILE *f = fopen("/proc/self/statm", "r");
  long size = 0, res = -1;
  if (f) {
    if (fscanf(f, "%ld %ld", &size, &res) != 2) res = -1;
    fclose(f);
  }
  return res < 0 ? -1 : res * 4096;
}

static int case_early(mp_ctx *ctx) {
  brg_comm *c = ctx->comm;
  int r = ctx->rank;
  if (ctx->nranks < 2) return 0;
  if (r > 1)
    return brg_barrier(c) != BRG_SUCCESS || brg_barrier(c) != BRG_SUCCESS ||
           brg_barrier(c) != BRG_SUCCESS;
  size_t total = 0;
  for (int i = 0; i <= EARLY_MSGS; i++)
    total += (i < EARLY_MSGS ? EARLY_COUNTS[i % 5] : EARLY_BIG) * sizeof(int32_t);
  unsigned char *buf = xmalloc(total);
  unsigned char *p = buf;
  /* Rank 1's resident memory before anything is sent: it may grow by the
   * cap and a message while nothing is received, not by all that was sent. */
  long rss0 = r == 1 ? rss_bytes() : 0;
  OK(brg_barrier(c));
  if (r == 0) {
    brg_request *rq = xmalloc(sizeof *rq * (EARLY_MSGS + 1));
    int64_t t0 = mp_now_ns();
    for (int i = 0; i <= EARLY_MSGS; i++) {
      size_t count = i < EARLY_MSGS ? EARLY_COUNTS[i % 5] : EARLY_BIG;
      fill(p, count * 4, 0, 1, 8000 + i);
      OK(brg_isend(p, count, BRG_INT32, 1, c, &rq[i]));
      p += count * 4;
    }
    double ms = (mp_now_ns() - t0) / 1e6;
    MP_CHECK(ms < 5000,
             "isend of %zu bytes to a rank that posted nothing took %.0f ms: isend "
             "must not wait for the receiver",
             total, ms);
    OK(brg_barrier(c)); /* rank 1 posts nothing before it */
    mp_sleep_ms(300);
    int done = 0, alldone = 1;
    for (int i = 0; i <= EARLY_MSGS; i++) {
      int d = 0;
      brg_status st = brg_test(&rq[i], &d);
      MP_CHECK(st == BRG_SUCCESS || st == BRG_IN_PROGRESS, "brg_test of isend %d: %s: %s", i,
               brg_status_string(st), brg_comm_last_error(c));
      done += d;
      alldone &= d;
    }
    /* Socket buffers (up to tcp_rmem's and tcp_wmem's largest) may hold
     * the rest: the check holds only where they cannot. */
    long bufs =
        sysctl_max("/proc/sys/net/ipv4/tcp_rmem") + sysctl_max("/proc/sys/net/ipv4/tcp_wmem");
    MP_CHECK(!alldone || bufs < 0 || (size_t)bufs + (4u << 20) >= total,
             "all %d isends (%zu bytes) finished before rank 1 posted a receive: "
             "rank 1 took more than BRIGADE_P2P_EARLY_BYTES (1 MiB) plus socket buffers",
             EARLY_MSGS + 1, total);
    mp_info("early: %d of %d isends finished before rank 1 posted a receive", done, EARLY_MSGS + 1);
    for (int i = 0; i <= EARLY_MSGS; i++) OK(brg_wait(&rq[i]));
    free(rq);
    /* A blocking send larger than the cap, to a receive posted later. */
    fill(buf, EARLY_BIG * 4, 0, 1, 9000);
    OK(brg_send(buf, EARLY_BIG, BRG_INT32, 1, c, NULL));
    OK(brg_barrier(c));
  } else {
    OK(brg_barrier(c));
    mp_sleep_ms(600);
    long grew = rss_bytes() - rss0;
    MP_CHECK(rss0 > 0 && grew < 12L << 20,
             "rank 1 grew by %ld KiB while it received nothing of %zu bytes sent to it: "
             "BRIGADE_P2P_EARLY_BYTES is 1 MiB",
             grew >> 10, total);
    mp_info("early: rank 1 grew by %ld KiB before posting a receive", grew >> 10);
    for (int i = 0; i <= EARLY_MSGS; i++) {
      size_t count = i < EARLY_MSGS ? EARLY_COUNTS[i % 5] : EARLY_BIG;
      memset(p, 0xee, count * 4);
      OK(brg_recv(p, count, BRG_INT32, 0, c, NULL));
      if (check(p, count * 4, 0, 1, 8000 + i, "early message")) return 1;
      p += count * 4;
    }
    mp_sleep_ms(300);
    memset(buf, 0xee, EARLY_BIG * 4);
    OK(brg_recv(buf, EARLY_BIG, BRG_INT32, 0, c, NULL));
    if (check(buf, EARLY_BIG * 4, 0, 1, 9000, "send larger than the cap")) return 1;
    OK(brg_barrier(c));
  }
  free(buf);
  return 0;
}

static int case_held(mp_ctx *ctx) {
  brg_comm *c = ctx->comm;
  int r = ctx->rank;
  if (ctx->nranks < 2) return 0;
  if (r > 1) return brg_barrier(c) != BRG_SUCCESS;
  size_t small = 524289, big = 8388613; /* int32: 2 MiB and 32 MiB, and a bit */
  /* More than the socket buffers could take while nobody reads. */
  long bufs = sysctl_max("/proc/sys/net/ipv4/tcp_rmem") + sysctl_max("/proc/sys/net/ipv4/tcp_wmem");
  if (bufs > 0 && (size_t)bufs / 4 + (2u << 20) > big) big = (size_t)bufs / 4 + (2u << 20);
  unsigned char *buf = xmalloc(big * 4);
  if (r == 0) {
    fill(buf, small * 4, 0, 1, 9500);
    OK(brg_send(buf, small, BRG_INT32, 1, c, NULL)); /* fits: nothing else is kept */
    int64_t t0 = mp_now_ns();
    brg_status st = brg_send(buf, big, BRG_INT32, 1, c, NULL);
    double ms = (mp_now_ns() - t0) / 1e6;
    const char *e = brg_comm_last_error(c);
    int tmo = mp_env_int("BRIGADE_TIMEOUT_MS", 0);
    MP_CHECK(st == BRG_ERR_TIMEOUT && mp_names_rank(e, 1) &&
                 mp_contains(e, "BRIGADE_P2P_EARLY_BYTES"),
             "a send held back by a receiver that never receives: %s: \"%s\" (expected "
             "BRG_ERR_TIMEOUT naming rank 1 and BRIGADE_P2P_EARLY_BYTES)",
             brg_status_string(st), e);
    MP_CHECK(ms >= tmo - 100 && ms < tmo + 5000,
             "the held send failed after %.0f ms (timeout %d ms)", ms, tmo);
    __atomic_store_n(&mp_shared_area()->flags[0], 1, __ATOMIC_RELEASE);
  } else {
    /* The first message is kept early meanwhile (received, it would free
     * room for the second). */
    MP_CHECK(mp_wait_flag(0, 60000), "rank 0 never said its held send ended");
    memset(buf, 0xee, small * 4);
    OK(brg_recv(buf, small, BRG_INT32, 0, c, NULL));
    if (check(buf, small * 4, 0, 1, 9500, "the message before the held one")) return 1;
  }
  free(buf);
  OK(brg_barrier(c));
  return 0;
}

static int expect_invalid(brg_comm *c, brg_status st, const char *what, const char *word) {
  const char *e = brg_comm_last_error(c);
  if (st != BRG_ERR_INVALID_ARGUMENT || !mp_contains(e, word)) {
    mp_fail("%s: %s: %s (expected BRG_ERR_INVALID_ARGUMENT and \"%s\")", what,
            brg_status_string(st), e, word);
    return 1;
  }
  return 0;
}

static int case_args(mp_ctx *ctx) {
  brg_comm *c = ctx->comm;
  int n = ctx->nranks, bad = 0;
  int32_t v[4] = {0};
  int dummy_stream;
  bad |= expect_invalid(c, brg_send(v, 4, BRG_INT32, n, c, NULL), "send to rank N", "peer");
  bad |= expect_invalid(c, brg_send(v, 4, BRG_INT32, -1, c, NULL), "send to -1", "peer");
  bad |= expect_invalid(c, brg_recv(v, 4, BRG_INT32, n + 3, c, NULL), "recv from N+3", "peer");
  brg_request rq;
  memset(&rq, 0, sizeof rq);
  bad |= expect_invalid(c, brg_irecv(v, 4, BRG_INT32, n, c, &rq), "irecv from N", "peer");
  bad |= expect_invalid(c, brg_isend(v, 4, BRG_INT32, -2, c, &rq), "isend to -2", "peer");
  bad |= expect_invalid(c, brg_send(NULL, 4, BRG_INT32, 0, c, NULL), "send of NULL", "NULL");
  bad |= expect_invalid(c, brg_recv(NULL, 4, BRG_INT32, 0, c, NULL), "recv into NULL", "NULL");
  bad |= expect_invalid(c, brg_send(v, 4, (brg_dtype)42, 0, c, NULL), "unknown dtype", "dtype");
  bad |= expect_invalid(c, brg_send(v, 4, BRG_INT32, 0, c, &dummy_stream), "stream", "stream");
  bad |= expect_invalid(c, brg_all_to_all(v, v, 1, BRG_INT32, c, &dummy_stream), "a2a stream",
                        "stream");
  if (n >= 2) {
    int32_t *big = xmalloc(sizeof(int32_t) * 4 * (size_t)n);
    bad |= expect_invalid(c, brg_all_to_all(big, big + 1, 2, BRG_INT32, c, NULL), "a2a overlap",
                          "overlap");
    free(big);
  }
  /* A request still in flight is not reused (its message is sent after
   * the barrier below). */
  int32_t w[2];
  int from = (ctx->rank + 1) % n;
  OK(brg_irecv(w, 2, BRG_INT32, from, c, &rq));
  brg_status st = brg_irecv(w, 2, BRG_INT32, from, c, &rq);
  MP_CHECK(st == BRG_ERR_INVALID_USAGE, "irecv on a request in flight: %s (%s)",
           brg_status_string(st), brg_comm_last_error(c));
  OK(brg_barrier(c)); /* the message comes only now: the request was in flight above */
  int32_t out[2] = {ctx->rank, 7};
  OK(brg_send(out, 2, BRG_INT32, (ctx->rank - 1 + n) % n, c, NULL));
  OK(brg_wait(&rq));
  MP_CHECK(w[0] == from && w[1] == 7, "after the refusals: got %d %d, expected %d 7", w[0], w[1],
           from);
  /* The communicator still works for collectives. */
  if (allreduce_check(c, n, ctx->rank)) return 1;
  return bad;
}

static int case_timeout(mp_ctx *ctx) {
  brg_comm *c = ctx->comm;
  int tmo = mp_env_int("BRIGADE_TIMEOUT_MS", 0);
  if (ctx->rank != 0) {
    mp_wait_flag(0, tmo + 10000); /* alive, silent, until rank 0 is done */
    return 0;
  }
  int32_t v[3];
  int64_t t0 = mp_now_ns();
  brg_status st = brg_recv(v, 3, BRG_INT32, 1, c, NULL);
  double ms = (mp_now_ns() - t0) / 1e6;
  const char *e = brg_comm_last_error(c);
  MP_CHECK(st == BRG_ERR_TIMEOUT && mp_names_rank(e, 1) && ms >= tmo && ms <= tmo + 5000,
           "recv from a silent rank 1: %s after %.0f ms (timeout %d ms): %s", brg_status_string(st),
           ms, tmo, e);
  mp_info("silent peer: %s after %.0f ms: %s", brg_status_string(st), ms, e);
  __atomic_store_n(&ctx->shared->flags[0], 1, __ATOMIC_RELEASE);
  return 0;
}

static int case_dies(mp_ctx *ctx) {
  brg_comm *c = ctx->comm;
  int n = ctx->nranks, victim = n - 1, tmo = mp_env_int("BRIGADE_TIMEOUT_MS", 0);
  /* Everyone has a link to the victim first: a message from it. */
  int32_t v[4] = {ctx->rank};
  if (ctx->rank == victim) {
    for (int j = 0; j < victim; j++) OK(brg_send(v, 1, BRG_INT32, j, c, NULL));
    __atomic_store_n(&ctx->shared->progress[ctx->rank], 1, __ATOMIC_RELEASE);
    for (;;) mp_sleep_ms(1000); /* killed by the harness */
  }
  OK(brg_recv(v, 1, BRG_INT32, victim, c, NULL));
  MP_CHECK(v[0] == victim, "first message from the victim: %d", v[0]);
  __atomic_store_n(&ctx->shared->progress[ctx->rank], 1, __ATOMIC_RELEASE);
  int64_t t0 = mp_now_ns();
  brg_status st = brg_recv(v, 4, BRG_INT32, victim, c, NULL);
  double ms = (mp_now_ns() - t0) / 1e6;
  const char *e = brg_comm_last_error(c);
  MP_CHECK((st == BRG_ERR_REMOTE || st == BRG_ERR_TIMEOUT) && mp_names_rank(e, victim) &&
               ms <= tmo + 5000,
           "recv from rank %d, killed meanwhile: %s after %.0f ms (timeout %d ms): %s", victim,
           brg_status_string(st), ms, tmo, e);
  mp_info("dead peer: %s after %.0f ms: %s", brg_status_string(st), ms, e);
  /* A send to it fails too, naming it. */
  st = brg_send(v, 4, BRG_INT32, victim, c, NULL);
  if (st == BRG_SUCCESS) st = brg_send(v, 4, BRG_INT32, victim, c, NULL); /* in flight once */
  MP_CHECK(st != BRG_SUCCESS && mp_names_rank(brg_comm_last_error(c), victim),
           "send to the dead rank %d: %s: %s", victim, brg_status_string(st),
           brg_comm_last_error(c));
  return 0;
}

/* The other thread of case_threads: a checked ring of messages. */
static void *ring_thread(void *arg) {
  mp_ctx *ctx = arg;
  brg_comm *c = ctx->comm;
  int n = ctx->nranks, r = ctx->rank, next = (r + 1) % n, prev = (r - 1 + n) % n;
  unsigned char s[3000], g[3000];
  for (int m = 0; m < 40; m++) {
    size_t bytes = (size_t)(m * 73) % sizeof s;
    fill(s, bytes, r, next, 5000 + m);
    brg_status st = brg_send(s, bytes, BRG_UINT8, next, c, NULL);
    if (st == BRG_SUCCESS) st = brg_recv(g, bytes, BRG_UINT8, prev, c, NULL);
    if (st != BRG_SUCCESS) {
      mp_fail("ring thread, message %d: %s: %s", m, brg_status_string(st), brg_comm_last_error(c));
      return NULL;
    }
    if (check(g, bytes, prev, r, 5000 + m, "ring thread")) return NULL;
  }
  return NULL;
}

/* Point-to-point on a second thread while this one runs collectives,
 * all_to_all among them, on the same communicator. */
static int case_threads(mp_ctx *ctx) {
  brg_comm *c = ctx->comm;
  int n = ctx->nranks, r = ctx->rank;
  pthread_t t;
  if (pthread_create(&t, NULL, ring_thread, ctx) != 0) {
    mp_fail("pthread_create failed");
    return 1;
  }
  int bad = 0;
  for (int round = 0; round < 20 && !bad; round++) {
    bad = allreduce_check(c, n, r);
    unsigned char s[64 * MP_MAX_RANKS], g[64 * MP_MAX_RANKS];
    for (int j = 0; j < n; j++) fill(s + 64 * j, 64, r, j, 6000 + round);
    brg_status st = brg_all_to_all(s, g, 64, BRG_INT8, c, NULL);
    if (st != BRG_SUCCESS) {
      mp_fail("all_to_all beside the ring thread: %s: %s", brg_status_string(st),
              brg_comm_last_error(c));
      bad = 1;
    }
    for (int j = 0; j < n && !bad; j++)
      bad = check(g + 64 * j, 64, j, r, 6000 + round, "all_to_all beside the ring thread");
  }
  pthread_join(t, NULL);
  return bad;
}

/* One receive from any source: it must finish with BRG_SUCCESS, and its
 * message is the next from its sender (got[src] of them came before). */
static int any_check(brg_comm *c, brg_request *rq, unsigned char *buf, size_t bytes, int r,
                     int tag0, int *got, int n, const char *what) {
  brg_status st = brg_wait(rq);
  if (st != BRG_SUCCESS) {
    mp_fail("%s: %s: %s", what, brg_status_string(st), brg_comm_last_error(c));
    return 1;
  }
  int src = -7;
  st = brg_request_source(rq, &src);
  if (st != BRG_SUCCESS || src < 0 || src >= n) {
    mp_fail("%s: brg_request_source: %s, source %d: %s", what, brg_status_string(st), src,
            brg_comm_last_error(NULL));
    return 1;
  }
  return check(buf, bytes, src, r, tag0 + got[src]++, what);
}

/* Receives from any source (BRG_ANY_SOURCE) on rank 0, every byte checked
 * against the pattern of the sender brg_request_source names, and that each
 * sender's messages came in its order:
 *   early:  every rank (rank 0 too) sends K messages before rank 0 posts
 *           its N*K receives from any source
 *   late:   the N*K receives are posted before any message is sent
 *   mixed:  a receive naming rank 1, then one from any source: rank 1's
 *           first message goes to the first (posted first), its second to
 *           the second; then rank 1's third to a blocking brg_recv from
 *           any source
 *   big:    rank 1 sends two messages of 2 MiB (past a small
 *           BRIGADE_P2P_EARLY_BYTES, the second waits in the socket) before
 *           rank 0 posts two receives from any source
 *   args:   a send to BRG_ANY_SOURCE, rank -2, brg_request_source on a send,
 *           on a receive still running and with NULL */
static int case_any(mp_ctx *ctx) {
  brg_comm *c = ctx->comm;
  int n = ctx->nranks, r = ctx->rank;
  enum { K = 3, COUNT = 17, BIG = 1 << 19 };
  size_t bytes = COUNT * sizeof(int32_t);
  unsigned char *s = xmalloc(K * bytes), *g = xmalloc((size_t)n * K * bytes);
  brg_request *rq = xmalloc((size_t)n * K * sizeof *rq), sq[K];
  int got[MP_MAX_RANKS] = {0}, bad = 0;
  for (int phase = 0; phase < 2 && !bad; phase++) {
    int tag0 = 7000 + 100 * phase;
    for (int k = 0; k < K; k++) fill(s + k * bytes, bytes, r, 0, tag0 + k);
    memset(g, 0xee, (size_t)n * K * bytes);
    memset(got, 0, sizeof got);
    if (phase == 1 && r == 0)
      for (int i = 0; i < n * K; i++)
        OK(brg_irecv(g + i * bytes, COUNT, BRG_INT32, BRG_ANY_SOURCE, c, &rq[i]));
    if (phase == 1) bad |= allreduce_check(c, n, r); /* posted before anything is sent */
    for (int k = 0; k < K; k++) OK(brg_isend(s + k * bytes, COUNT, BRG_INT32, 0, c, &sq[k]));
    if (phase == 0) bad |= allreduce_check(c, n, r); /* sent before anything is posted */
    if (r == 0) {
      if (phase == 0)
        for (int i = 0; i < n * K; i++)
          OK(brg_irecv(g + i * bytes, COUNT, BRG_INT32, BRG_ANY_SOURCE, c, &rq[i]));
      for (int i = 0; i < n * K && !bad; i++)
        bad |= any_check(c, &rq[i], g + i * bytes, bytes, 0, tag0, got, n,
                         phase ? "any source, posted first" : "any source, posted last");
      for (int j = 0; j < n && !bad; j++)
        if (got[j] != K) {
          mp_fail("any source: %d messages from rank %d, expected %d", got[j], j, K);
          bad = 1;
        }
    }
    for (int k = 0; k < K; k++) OK(brg_wait(&sq[k]));
    /* No rank runs ahead into the next part while rank 0 still receives
     * from any source. */
    if (!bad) bad |= allreduce_check(c, n, r);
  }
  if (n >= 2 && !bad && r < 2) {
    int tag0 = 7300;
    if (r == 1) {
      for (int k = 0; k < 3; k++) {
        fill(s, bytes, 1, 0, tag0 + k);
        OK(brg_send(s, COUNT, BRG_INT32, 0, c, NULL));
      }
    } else {
      brg_request named;
      OK(brg_irecv(g, COUNT, BRG_INT32, 1, c, &named));
      OK(brg_irecv(g + bytes, COUNT, BRG_INT32, BRG_ANY_SOURCE, c, &rq[0]));
      OK(brg_wait(&named));
      bad |= check(g, bytes, 1, 0, tag0, "receive naming rank 1, posted before one from any");
      memset(got, 0, sizeof got);
      got[1] = 1;
      bad |= any_check(c, &rq[0], g + bytes, bytes, 0, tag0, got, n, "any source after a named");
      OK(brg_recv(g, COUNT, BRG_INT32, BRG_ANY_SOURCE, c, NULL));
      bad |= check(g, bytes, 1, 0, tag0 + 2, "blocking brg_recv from any source");
    }
  }
  if (n >= 2 && !bad && r < 2) {
    int tag0 = 7400;
    unsigned char *b = xmalloc(2 * (size_t)BIG * 4);
    if (r == 1) {
      for (int k = 0; k < 2; k++) fill(b + k * (size_t)BIG * 4, (size_t)BIG * 4, 1, 0, tag0 + k);
      for (int k = 0; k < 2; k++)
        OK(brg_isend(b + k * (size_t)BIG * 4, BIG, BRG_FLOAT32, 0, c, &sq[k]));
      bad |= allreduce_check(c, n, r);
      for (int k = 0; k < 2; k++) OK(brg_wait(&sq[k]));
    } else {
      bad |= allreduce_check(c, n, r); /* rank 1's isends are out */
      memset(b, 0xee, 2 * (size_t)BIG * 4);
      memset(got, 0, sizeof got);
      for (int k = 0; k < 2; k++)
        OK(brg_irecv(b + k * (size_t)BIG * 4, BIG, BRG_FLOAT32, BRG_ANY_SOURCE, c, &rq[k]));
      for (int k = 0; k < 2 && !bad; k++)
        bad |= any_check(c, &rq[k], b + k * (size_t)BIG * 4, (size_t)BIG * 4, 0, tag0, got, n,
                         "2 MiB from any source");
    }
    free(b);
  } else if (n >= 2 && !bad) {
    bad |= allreduce_check(c, n, r);
  }
  if (!bad) {
    brg_status st = brg_send(s, 1, BRG_INT32, BRG_ANY_SOURCE, c, NULL);
    if (st != BRG_ERR_INVALID_ARGUMENT || !mp_contains(brg_comm_last_error(c), "BRG_ANY_SOURCE"))
      bad = 1,
      mp_fail("send to BRG_ANY_SOURCE: %s: %s", brg_status_string(st), brg_comm_last_error(c));
    st = brg_irecv(g, 1, BRG_INT32, -2, c, &rq[0]);
    if (st != BRG_ERR_INVALID_ARGUMENT || !mp_contains(brg_comm_last_error(c), "-2"))
      bad = 1,
      mp_fail("receive from rank -2: %s: %s", brg_status_string(st), brg_comm_last_error(c));
    int src = -7;
    OK(brg_irecv(g, 2, BRG_INT32, BRG_ANY_SOURCE, c, &rq[0])); /* nothing is on its way */
    st = brg_request_source(&rq[0], &src);
    if (st != BRG_ERR_INVALID_USAGE || src != -7)
      bad = 1, mp_fail("brg_request_source on a running receive: %s", brg_status_string(st));
    if (brg_request_source(&rq[0], NULL) != BRG_ERR_INVALID_ARGUMENT)
      bad = 1, mp_fail("brg_request_source with NULL was accepted");
    OK(brg_isend(s, 1, BRG_INT32, r, c, &sq[0]));
    st = brg_request_source(&sq[0], &src);
    if (st != BRG_ERR_INVALID_ARGUMENT || src != -7)
      bad = 1, mp_fail("brg_request_source on a send: %s", brg_status_string(st));
    /* 1 element sent to itself for a receive of 2: a mismatch that names the sender. */
    st = brg_wait(&rq[0]);
    if (st != BRG_ERR_MISMATCH || brg_request_source(&rq[0], &src) != BRG_SUCCESS || src != r ||
        !mp_names_rank(brg_comm_last_error(c), r))
      bad = 1, mp_fail("receive of 2 from any source, 1 sent to itself: %s, source %d: %s",
                       brg_status_string(st), src, brg_comm_last_error(c));
    OK(brg_wait(&sq[0]));
  }
  free(s);
  free(g);
  free(rq);
  return bad;
}

/* Tags (brg_*_tagged): each rank sends tag 7, then tag 8, to the next
 * rank, which posts its receive of tag 8 first: each buffer must get its
 * own tag's message (the same size, so a swap shows only in the bytes).
 * Once with the receives posted before anything is sent, once with both
 * messages waiting in early memory. Then receives from any source with a
 * tag: rank 0 posts N of tag 3 from any source, and one of tag 4 naming
 * each rank; every rank sends tag 4, then tag 3, to rank 0: each receive
 * gets its tag's message, the any-source ones one from each rank. Then a
 * negative tag: BRG_ERR_INVALID_ARGUMENT. */
static int case_tags(mp_ctx *ctx) {
  brg_comm *c = ctx->comm;
  int n = ctx->nranks, r = ctx->rank, next = (r + 1) % n, prev = (r - 1 + n) % n, bad = 0;
  enum { COUNT = 1031 };
  size_t bytes = COUNT * sizeof(int32_t);
  unsigned char *s7 = xmalloc(bytes), *s8 = xmalloc(bytes), *g7 = xmalloc(bytes),
                *g8 = xmalloc(bytes);
  fill(s7, bytes, r, next, 7);
  fill(s8, bytes, r, next, 8);
  for (int early = 0; early < 2 && !bad; early++) {
    brg_request q7, q8, w7, w8;
    memset(g7, 0xee, bytes);
    memset(g8, 0xee, bytes);
    if (!early) {
      OK(brg_irecv_tagged(g8, COUNT, BRG_INT32, prev, 8, c, &q8));
      OK(brg_irecv_tagged(g7, COUNT, BRG_INT32, prev, 7, c, &q7));
      OK(brg_barrier(c)); /* posted before anything is sent */
    }
    OK(brg_isend_tagged(s7, COUNT, BRG_INT32, next, 7, c, &w7));
    OK(brg_isend_tagged(s8, COUNT, BRG_INT32, next, 8, c, &w8));
    if (early) {
      OK(brg_wait(&w7));
      OK(brg_wait(&w8));
      OK(brg_barrier(c));
      usleep(50 * 1000); /* both arrive before their receives */
      OK(brg_irecv_tagged(g8, COUNT, BRG_INT32, prev, 8, c, &q8));
      OK(brg_recv_tagged(g7, COUNT, BRG_INT32, prev, 7, c, NULL));
      OK(brg_wait(&q8));
    } else {
      OK(brg_wait(&q8));
      OK(brg_wait(&q7));
      OK(brg_wait(&w7));
      OK(brg_wait(&w8));
    }
    const char *what = early ? "tags, from early memory" : "tags, receives posted first";
    bad |= check(g8, bytes, prev, r, 8, what) || check(g7, bytes, prev, r, 7, what);
  }
  if (!bad) {
    /* From any source, with a tag: sent tag 4 first, received tag 3 first. */
    brg_request any[MP_MAX_RANKS], named[MP_MAX_RANKS], w4, w3;
    unsigned char *ga = xmalloc((size_t)n * bytes), *gn = xmalloc((size_t)n * bytes);
    memset(ga, 0xee, (size_t)n * bytes);
    memset(gn, 0xee, (size_t)n * bytes);
    if (r == 0) {
      for (int i = 0; i < n; i++)
        OK(brg_irecv_tagged(ga + i * bytes, COUNT, BRG_INT32, BRG_ANY_SOURCE, 3, c, &any[i]));
      for (int j = 0; j < n; j++)
        OK(brg_irecv_tagged(gn + j * bytes, COUNT, BRG_INT32, j, 4, c, &named[j]));
    }
    OK(brg_barrier(c));
    fill(s7, bytes, r, 0, 4);
    fill(s8, bytes, r, 0, 3);
    OK(brg_isend_tagged(s7, COUNT, BRG_INT32, 0, 4, c, &w4));
    OK(brg_isend_tagged(s8, COUNT, BRG_INT32, 0, 3, c, &w3));
    if (r == 0) {
      int seen[MP_MAX_RANKS] = {0};
      for (int i = 0; i < n && !bad; i++) {
        int src = -1;
        OK(brg_wait(&any[i]));
        OK(brg_request_source(&any[i], &src));
        if (src < 0 || src >= n || seen[src]++) {
          mp_fail("tags, any source: receive %d took a message from rank %d twice or out of "
                  "range",
                  i, src);
          bad = 1;
          break;
        }
        bad |= check(ga + i * bytes, bytes, src, 0, 3, "tag 3 from any source");
      }
      for (int j = 0; j < n && !bad; j++) {
        OK(brg_wait(&named[j]));
        bad |= check(gn + j * bytes, bytes, j, 0, 4, "tag 4 naming its sender");
      }
    }
    OK(brg_wait(&w4));
    OK(brg_wait(&w3));
    free(ga);
    free(gn);
  }
  if (!bad) {
    brg_request q;
    brg_status st = brg_send_tagged(s7, 1, BRG_INT32, next, -1, c, NULL);
    const char *e = brg_comm_last_error(c);
    if (st != BRG_ERR_INVALID_ARGUMENT || !strstr(e, "tag -1"))
      bad = 1, mp_fail("brg_send_tagged with tag -1: %s: %s", brg_status_string(st), e);
    st = brg_irecv_tagged(g7, 1, BRG_INT32, prev, INT32_MIN, c, &q);
    if (st != BRG_ERR_INVALID_ARGUMENT)
      bad = 1, mp_fail("brg_irecv_tagged with a negative tag: %s", brg_status_string(st));
  }
  if (!bad) OK(brg_barrier(c)); /* nothing of this part meets the next one's receives */
  free(s7);
  free(s8);
  free(g7);
  free(g8);
  return bad;
}

typedef struct {
  const char *name;
  int (*fn)(mp_ctx *);
} part;
static const part PARTS[] = {{"fallback", case_fallback},
                             {"links", case_links},
                             {"ring", case_ring},
                             {"pairs", case_pairs},
                             {"crossed", case_crossed},
                             {"a2a", case_a2a},
                             {"mismatch", case_mismatch},
                             {"args", case_args},
                             {"timeout", case_timeout},
                             {"dies", case_dies},
                             {"threads", case_threads},
                             {"a2a_mismatch", case_a2a_mismatch},
                             {"a2a_other", case_a2a_other},
                             {"early", case_early},
                             {"held", case_held},
                             {"a2a_mismatch_inplace", case_a2a_mismatch_inplace},
                             {"any", case_any},
                             {"tags", case_tags}};
#define NPARTS (sizeof PARTS / sizeof *PARTS)

static int want[NPARTS];

static int body(mp_ctx *ctx) {
  for (size_t p = 0; p < NPARTS; p++) {
    if (!want[p]) continue;
    int64_t t0 = mp_now_ns();
    if (PARTS[p].fn(ctx) != 0 || mp_failures()) return 1;
    if (ctx->rank == 0) mp_info("%s: %.0f ms", PARTS[p].name, (mp_now_ns() - t0) / 1e6);
  }
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s N case...\n", argv[0]);
    return 2;
  }
  int n = atoi(argv[1]), dies = 0;
  for (int a = 2; a < argc; a++) {
    size_t p = 0;
    while (p < NPARTS && strcmp(argv[a], PARTS[p].name) != 0) p++;
    if (p == NPARTS) {
      fprintf(stderr, "unknown case %s\n", argv[a]);
      return 2;
    }
    want[p] = 1;
    dies |= strcmp(argv[a], "dies") == 0;
  }
  char name[96];
  snprintf(name, sizeof name, "p2p N=%d %s", n, mp_transport());
  mp_opts o = {
      .name = name,
      .nranks = n,
      .deadline_ms = mp_env_int("MP_DEADLINE_MS", 120000),
      .init = MP_INIT_ID,
      .victim = dies ? n - 1 : -1,
      .victim_signal = SIGKILL,
      .victim_after = 1,
      .victim_delay_ms = 300,
  };
  return mp_run(&o, body, NULL) ? 1 : 0;
}
