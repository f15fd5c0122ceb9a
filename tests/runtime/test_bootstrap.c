/*
 * Bootstrap: the unique id, the hello wire format, and whole rendezvous runs
 * with ranks as threads of this process (root on 127.0.0.1, ephemeral ports),
 * including strangers that send garbage, ranks that never come, and ring
 * neighbours that hang up.
 *
 * Every test is bounded: each wait inside has a timeout, and alarm() kills
 * the process if a test still hangs.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "bootstrap.h"
#include "bootstrap_wire.h"
#include "secret.h"
#include "sock.h"

#define TEST_ALARM_S 60

/* ---------------------------------------------------------------- helpers */

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms) {
  struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) { /* xorshift64*: reproducible garbage */
  rng ^= rng >> 12;
  rng ^= rng << 25;
  rng ^= rng >> 27;
  return rng * 2685821657736338717ull;
}
static void rnd_fill(void *buf, size_t len) {
  uint8_t *p = buf;
  for (size_t i = 0; i < len; i++) p[i] = (uint8_t)(rnd() >> 56);
}

/* The id's checksum as the format defines it (FNV-1a 32 over the bytes
 * before it), so tests can forge ids that only the other checks catch. */
static uint32_t fnv1a(const void *data, size_t len) {
  const uint8_t *p = data;
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < len; i++) {
    h ^= p[i];
    h *= 16777619u;
  }
  return h;
}
static void reseal(brg__boot_id *id) {
  id->checksum = fnv1a(id, offsetof(brg__boot_id, checksum));
}

static void expect_msg(const brg__errbuf *err, const char *needle) {
  if (!strstr(err->msg, needle))
    fail_msg("message \"%s\" does not contain \"%s\"", err->msg, needle);
}

static int tcp_connect_local(uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  assert_true(fd >= 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
  struct timeval tv = {.tv_sec = 5};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

static void send_bytes(int fd, const void *buf, size_t len) {
  assert_int_equal(send(fd, buf, len, MSG_NOSIGNAL), (ssize_t)len);
}

/* A hello as a rank would send it, for hand-made connections to the root:
 * the root's challenge read from fd first, the hello signed for it. */
static size_t make_hello(int fd, uint8_t *buf, size_t cap, const uint8_t *secret, int rank,
                         int nranks, uint32_t blob_bytes) {
  static const uint8_t blob[BRG__BOOT_MAX_BLOB];
  brg__boot_hello h;
  memset(&h, 0, sizeof h);
  h.magic = BRG__BOOT_MAGIC;
  uint8_t challenge[16];
  const char *why = NULL;
  assert_int_equal(brg__boot_challenge_read(fd, challenge, now_ms() + 5000, &why), BRG__IO_OK);
  for (int i = 0; i < 16; i++) h.nonce[i] = (uint8_t)(rank * 16 + i);
  h.rank = rank;
  h.nranks = nranks;
  strcpy(h.addr, "127.0.0.1");
  h.port = 9;
  h.blob_bytes = blob_bytes;
  h.pid = 4242;
  strcpy(h.host, "rogue-host");
  h.blob = blob;
  size_t n = brg__boot_hello_encode(&h, buf, cap);
  brg__boot_sign(buf, n, secret, challenge);
  return n;
}

/* Whether the root closed a hand-made connection (EOF or reset), waiting up
 * to the socket's receive timeout. Reads and ignores an error answer. */
static int closed_by_peer(int fd) {
  uint8_t b[2048];
  for (;;) {
    ssize_t n = recv(fd, b, sizeof b, 0);
    if (n > 0) continue;
    if (n == 0) return 1;
    return errno == ECONNRESET;
  }
}

static brg_status start_root(int timeout_ms, brg__boot_id *id) {
  brg__errbuf err = {0};
  brg_status st = brg__boot_root_start("127.0.0.1", 0, NULL, timeout_ms, id, &err);
  if (st != BRG_SUCCESS) fail_msg("root start: %s", err.msg);
  return st;
}

/* ------------------------------------------------------------- rank runs */

typedef struct rank_run {
  brg__boot_id id;
  int rank, nranks, timeout_ms;
  size_t blob_bytes;
  int ring;     /* open ring sockets after init */
  int exchange; /* and pass a message both ways around the ring */
  int setup_ms; /* then this long (the rest of a communicator's set-up) before confirming */
  brg_status st;
  brg__errbuf err;
  uint8_t *all;
  brg__bootstrap *bs;
  int64_t elapsed_ms;
  char fail[256]; /* checks that failed inside the thread */
} rank_run;

static uint8_t blob_byte(int rank, size_t i) {
  return (uint8_t)(rank * 37 + i * 11 + 1);
}

static void *rank_main(void *arg) {
  rank_run *a = arg;
  int64_t t0 = now_ms();
  uint8_t blob[BRG__BOOT_MAX_BLOB];
  for (size_t i = 0; i < a->blob_bytes; i++) blob[i] = blob_byte(a->rank, i);
  if (!a->bs) { /* else init ran before: this run only opens the ring */
    a->all = a->blob_bytes ? calloc((size_t)a->nranks, a->blob_bytes) : NULL;
    a->st = brg__bootstrap_init(&a->bs, &a->id, a->rank, a->nranks, blob, a->blob_bytes, a->all,
                                a->timeout_ms, &a->err);
  }
  if (a->st == BRG_SUCCESS && a->ring) {
    int n = a->nranks, next = (a->rank + 1) % n, prev = (a->rank + n - 1) % n;
    a->st = brg__bootstrap_ring_connect(a->bs, next, prev, &a->err);
    if (a->st == BRG_SUCCESS && a->exchange && n > 1) {
      /* Around the ring forward (to next), then backward (to prev). */
      for (int pass = 0; pass < 2 && a->st == BRG_SUCCESS; pass++) {
        int to = pass == 0 ? BRG__RING_NEXT : BRG__RING_PREV;
        int from = pass == 0 ? BRG__RING_PREV : BRG__RING_NEXT;
        int from_rank = pass == 0 ? prev : next;
        char msg[64], got[64], expect[64];
        snprintf(msg, sizeof msg, "pass %d from rank %d", pass, a->rank);
        snprintf(expect, sizeof expect, "pass %d from rank %d", pass, from_rank);
        a->st = brg__bootstrap_send(a->bs, to, 100u + (uint32_t)pass, msg,
                                    (uint32_t)strlen(msg) + 1, &a->err);
        if (a->st != BRG_SUCCESS) break;
        uint32_t type = 0, len = 0;
        a->st = brg__bootstrap_recv(a->bs, from, &type, got, sizeof got, &len, 10000, &a->err);
        if (a->st != BRG_SUCCESS) break;
        if (type != 100u + (uint32_t)pass || len != strlen(expect) + 1 || strcmp(got, expect))
          snprintf(a->fail, sizeof a->fail, "rank %d pass %d got type %u \"%.40s\"", a->rank, pass,
                   type, got);
      }
    }
  }
  /* The root releases nobody before every rank has confirmed. */
  if (a->st == BRG_SUCCESS && a->ring) {
    if (a->setup_ms) sleep_ms(a->setup_ms);
    a->st = brg__bootstrap_confirm(a->bs, &a->err);
  }
  a->elapsed_ms = now_ms() - t0;
  return NULL;
}

static rank_run *runs_new(const brg__boot_id *id, int nranks, size_t blob_bytes, int timeout_ms) {
  rank_run *r = calloc((size_t)nranks, sizeof *r);
  assert_non_null(r);
  for (int k = 0; k < nranks; k++) {
    r[k].id = *id;
    r[k].rank = k;
    r[k].nranks = nranks;
    r[k].blob_bytes = blob_bytes;
    r[k].timeout_ms = timeout_ms;
    r[k].ring = 1;
    r[k].exchange = 1;
  }
  return r;
}

/* Runs the ranks listed in `which` (all when NULL) as threads and waits. */
static void runs_go(rank_run *r, const int *which, int count) {
  pthread_t t[64];
  assert_true(count <= 64);
  for (int k = 0; k < count; k++)
    assert_int_equal(pthread_create(&t[k], NULL, rank_main, &r[which ? which[k] : k]), 0);
  for (int k = 0; k < count; k++) pthread_join(t[k], NULL);
}

static void runs_free(rank_run *r, int nranks) {
  for (int k = 0; k < nranks; k++) {
    brg__bootstrap_destroy(r[k].bs);
    free(r[k].all);
  }
  free(r);
}

static void expect_success(rank_run *r, int nranks) {
  for (int k = 0; k < nranks; k++) {
    if (r[k].st != BRG_SUCCESS)
      fail_msg("rank %d: %s: %s", k, brg_status_string(r[k].st), r[k].err.msg);
    if (r[k].fail[0]) fail_msg("%s", r[k].fail);
  }
}

/* The root closes its listener once it has served the communicator. */
static void expect_root_gone(uint16_t port) {
  int64_t t0 = now_ms();
  for (;;) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int rc = connect(fd, (struct sockaddr *)&sa, sizeof sa);
    int e = errno;
    close(fd);
    if (rc < 0 && e == ECONNREFUSED) return;
    if (now_ms() - t0 > 3000) fail_msg("bootstrap root still listening on port %u", port);
    sleep_ms(20);
  }
}

/* ------------------------------------------------------------------- ids */

static void test_id_round_trip(void **state) {
  (void)state;
  brg__errbuf err = {0};
  uint8_t secret[16];
  for (int i = 0; i < 16; i++) secret[i] = (uint8_t)(i * 7 + 3);
  brg__boot_id id;
  assert_int_equal(brg__boot_id_make(&id, "10.1.2.3", 4242, secret, &err), BRG_SUCCESS);
  assert_int_equal(brg__boot_id_check(&id, &err), BRG_SUCCESS);
  assert_string_equal(id.addr, "10.1.2.3");
  assert_int_equal(id.port, 4242);
  assert_memory_equal(id.secret, secret, 16);

  /* Through the public id's bytes, as an application would pass it on. */
  brg_unique_id uid;
  memset(&uid, 0xa5, sizeof uid);
  memcpy(uid.internal, &id, sizeof id);
  brg__boot_id back;
  memcpy(&back, uid.internal, sizeof back);
  assert_int_equal(brg__boot_id_check(&back, &err), BRG_SUCCESS);

  /* IPv6 numeric addresses are fine too. */
  assert_int_equal(brg__boot_id_make(&id, "::1", 1, secret, &err), BRG_SUCCESS);
  assert_int_equal(brg__boot_id_check(&id, &err), BRG_SUCCESS);

  /* Fresh secrets differ. */
  brg__boot_id a, b;
  assert_int_equal(brg__boot_id_make(&a, "127.0.0.1", 5, NULL, &err), BRG_SUCCESS);
  assert_int_equal(brg__boot_id_make(&b, "127.0.0.1", 5, NULL, &err), BRG_SUCCESS);
  assert_memory_not_equal(a.secret, b.secret, 16);

  /* What make refuses. */
  assert_int_equal(brg__boot_id_make(&id, "not-an-address", 5, NULL, &err),
                   BRG_ERR_INVALID_ARGUMENT);
  assert_int_equal(brg__boot_id_make(&id, "", 5, NULL, &err), BRG_ERR_INVALID_ARGUMENT);
  assert_int_equal(brg__boot_id_make(&id, "127.0.0.1", 0, NULL, &err), BRG_ERR_INVALID_ARGUMENT);
  char longaddr[200];
  memset(longaddr, '1', sizeof longaddr - 1);
  longaddr[sizeof longaddr - 1] = '\0';
  assert_int_equal(brg__boot_id_make(&id, longaddr, 5, NULL, &err), BRG_ERR_INVALID_ARGUMENT);
  assert_int_equal(brg__boot_id_check(NULL, &err), BRG_ERR_INVALID_ARGUMENT);
}

static void expect_bad_id(const brg__boot_id *id) {
  brg__errbuf err = {0};
  assert_int_equal(brg__boot_id_check(id, &err), BRG_ERR_INVALID_ARGUMENT);
  expect_msg(&err, "corrupted or not a brigade id");
}

static void test_id_corruption(void **state) {
  (void)state;
  brg__errbuf err = {0};
  brg__boot_id good;
  assert_int_equal(brg__boot_id_make(&good, "192.168.7.9", 31337, NULL, &err), BRG_SUCCESS);

  /* Any flipped bit anywhere: magic, version, secret, address (also after
   * its terminator), port, pad, checksum. */
  for (size_t off = 0; off < sizeof good; off++) {
    for (int bit = 0; bit < 8; bit++) {
      brg__boot_id id = good;
      ((uint8_t *)&id)[off] ^= (uint8_t)(1u << bit);
      expect_bad_id(&id);
    }
  }

  /* Forged with a valid checksum: the field checks still catch them. */
  brg__boot_id id = good;
  id.magic = 0x12345678;
  reseal(&id);
  expect_bad_id(&id);
  id = good;
  id.version = 99;
  reseal(&id);
  expect_bad_id(&id);
  id = good;
  memset(id.addr, '7', sizeof id.addr);
  reseal(&id);
  expect_bad_id(&id);
  id = good;
  memset(id.addr, 0, sizeof id.addr);
  reseal(&id);
  expect_bad_id(&id);
  id = good;
  strcpy(id.addr, "example.org");
  reseal(&id);
  expect_bad_id(&id);
  id = good;
  id.port = 0;
  reseal(&id);
  expect_bad_id(&id);

  /* Ids that are not ids at all. */
  for (int k = 0; k < 1000; k++) {
    brg_unique_id uid;
    rnd_fill(&uid, sizeof uid);
    memcpy(&id, uid.internal, sizeof id);
    expect_bad_id(&id);
  }
  memset(&id, 0, sizeof id);
  expect_bad_id(&id);
}

/* ----------------------------------------------------------------- hello */

static brg__boot_hello sample_hello(uint8_t *blob, uint32_t blob_bytes) {
  brg__boot_hello h;
  memset(&h, 0, sizeof h);
  h.magic = BRG__BOOT_MAGIC;
  for (int i = 0; i < 16; i++) h.proof[i] = (uint8_t)(0xf0 ^ i), h.nonce[i] = (uint8_t)(3 * i);
  h.rank = 3;
  h.nranks = 5;
  strcpy(h.addr, "10.0.0.17");
  h.port = 50123;
  for (uint32_t i = 0; i < blob_bytes; i++) blob[i] = (uint8_t)(i * 13 + 5);
  h.blob_bytes = blob_bytes;
  h.blob = blob;
  return h;
}

static void test_hello_round_trip(void **state) {
  (void)state;
  static uint8_t blob[BRG__BOOT_MAX_BLOB], buf[2 * BRG__BOOT_MAX_BLOB];
  brg__errbuf err = {0};
  const uint32_t sizes[] = {0, 1, 77, BRG__BOOT_MAX_BLOB};
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
    brg__boot_hello h = sample_hello(blob, sizes[s]), d;
    size_t n = brg__boot_hello_encode(&h, buf, sizeof buf);
    assert_true(n > sizes[s]);
    assert_int_equal(brg__boot_hello_encode(&h, buf, n - 1), 0); /* too small a buffer */
    assert_int_equal(brg__boot_hello_encode(&h, buf, n), n);
    assert_int_equal(brg__boot_hello_decode(buf, n, &d, &err), BRG_SUCCESS);
    assert_int_equal(d.magic, h.magic);
    assert_memory_equal(d.proof, h.proof, 16);
    assert_memory_equal(d.nonce, h.nonce, 16);
    assert_int_equal(d.rank, 3);
    assert_int_equal(d.nranks, 5);
    assert_string_equal(d.addr, "10.0.0.17");
    assert_int_equal(d.port, 50123);
    assert_int_equal(d.blob_bytes, sizes[s]);
    if (sizes[s]) {
      /* The blob is read in place. */
      assert_true((const uint8_t *)d.blob >= buf && (const uint8_t *)d.blob + sizes[s] <= buf + n);
      assert_memory_equal(d.blob, blob, sizes[s]);
    }
  }
  /* IPv6 ring address. */
  brg__boot_hello h = sample_hello(blob, 4), d;
  strcpy(h.addr, "fd00::1:2");
  size_t n = brg__boot_hello_encode(&h, buf, sizeof buf);
  assert_int_equal(brg__boot_hello_decode(buf, n, &d, &err), BRG_SUCCESS);
  assert_string_equal(d.addr, "fd00::1:2");

  /* What encode refuses to write. */
  h = sample_hello(blob, 4);
  h.blob_bytes = BRG__BOOT_MAX_BLOB + 1;
  assert_int_equal(brg__boot_hello_encode(&h, buf, sizeof buf), 0);
  h = sample_hello(blob, 4);
  memset(h.addr, 'x', sizeof h.addr);
  assert_int_equal(brg__boot_hello_encode(&h, buf, sizeof buf), 0);
  h = sample_hello(blob, 4);
  h.blob = NULL;
  assert_int_equal(brg__boot_hello_encode(&h, buf, sizeof buf), 0);
}

static void expect_bad_hello(const uint8_t *buf, size_t len, const char *needle) {
  brg__errbuf err = {0};
  brg__boot_hello d;
  brg_status st = brg__boot_hello_decode(buf, len, &d, &err);
  if (st == BRG_SUCCESS) fail_msg("garbage hello accepted (%s)", needle ? needle : "truncated");
  assert_int_equal(st, BRG_ERR_REMOTE);
  if (needle) expect_msg(&err, needle);
}

static void put32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void test_hello_rejects_bad(void **state) {
  (void)state;
  static uint8_t blob[64], buf[2048], bad[2048];
  brg__boot_hello h = sample_hello(blob, 40);
  size_t n = brg__boot_hello_encode(&h, buf, sizeof buf);
  assert_int_equal(n, 224);

  for (size_t len = 0; len < n; len++) expect_bad_hello(buf, len, NULL); /* truncated */
  memcpy(bad, buf, n);
  expect_bad_hello(bad, n + 1, "does not match"); /* trailing bytes */

  /* Field by field, on a copy of a good hello. The layout is fixed:
   * magic@0 proof@4 rank@20 nranks@24 addr@28 port@92 zero@94 blob_bytes@96
   * pid@100 host@104. */
  struct {
    size_t off;
    uint32_t val;
    int width;
    const char *needle;
  } cases[] = {
      {0, 0xdeadbeef, 4, "magic"},
      {96, BRG__BOOT_MAX_BLOB + 1, 4, "at most"},
      {96, 0xffffffff, 4, "at most"},
      {96, 39, 4, "does not match"},
      {96, 41, 4, "does not match"},
      {24, 0, 4, "nranks=0"},
      {24, 0x80000000u, 4, "nranks="},
      {24, BRG__BOOT_MAX_RANKS + 1, 4, "nranks="},
      {24, 3, 4, "rank 3 of nranks=3"},
      {20, 0xffffffff, 4, "rank -1"},
      {92, 0, 2, "port 0"},
      {94, 7, 2, "reserved"},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    memcpy(bad, buf, n);
    if (cases[c].width == 4) {
      put32(bad + cases[c].off, cases[c].val);
    } else {
      bad[cases[c].off] = (uint8_t)cases[c].val;
      bad[cases[c].off + 1] = (uint8_t)(cases[c].val >> 8);
    }
    expect_bad_hello(bad, n, cases[c].needle);
  }
  memcpy(bad, buf, n);
  memset(bad + 28, '9', 64); /* unterminated address */
  expect_bad_hello(bad, n, "unterminated");
  memcpy(bad, buf, n);
  memcpy(bad + 28, "my-host\0", 8); /* names are not addresses */
  expect_bad_hello(bad, n, "bad address");
  memcpy(bad, buf, n);
  memset(bad + 104, 'h', 64); /* unterminated host name */
  expect_bad_hello(bad, n, "unterminated host");

  brg__errbuf err;
  brg__boot_hello d;
  assert_int_equal(brg__boot_hello_decode(NULL, 10, &d, &err), BRG_ERR_INVALID_ARGUMENT);
  assert_int_equal(brg__boot_hello_decode(buf, n, NULL, &err), BRG_ERR_INVALID_ARGUMENT);
}

static void test_hello_garbage(void **state) {
  (void)state;
  static uint8_t blob[BRG__BOOT_MAX_BLOB], good[2048];
  uint8_t *buf = malloc(2048); /* heap, so ASan sees any read past len */
  assert_non_null(buf);
  brg__boot_hello h = sample_hello(blob, 0);
  brg__errbuf err;
  int accepted = 0;
  for (int it = 0; it < 200000; it++) {
    size_t len = (size_t)(rnd() % 1300);
    uint8_t *p = buf + 2048 - len; /* flush against the end of the allocation */
    if (it % 2 == 0) {
      rnd_fill(p, len);
    } else {
      /* A good hello with a few bytes changed: reaches the deeper checks. */
      h.blob_bytes = (uint32_t)(rnd() % 200);
      size_t n = brg__boot_hello_encode(&h, good, sizeof good);
      assert_true(n > 0);
      for (int k = 0, m = (int)(rnd() % 4); k < m; k++) good[rnd() % n] = (uint8_t)rnd();
      len = rnd() % 8 == 0 ? (size_t)(rnd() % (n + 8)) : n;
      if (len > n) len = n;
      p = buf + 2048 - len;
      memcpy(p, good, len);
    }
    brg__boot_hello d;
    if (brg__boot_hello_decode(p, len, &d, &err) == BRG_SUCCESS) {
      accepted++;
      assert_int_equal(d.magic, BRG__BOOT_MAGIC);
      assert_true(d.nranks >= 1 && d.nranks <= BRG__BOOT_MAX_RANKS);
      assert_true(d.rank >= 0 && d.rank < d.nranks);
      assert_true(d.blob_bytes <= BRG__BOOT_MAX_BLOB);
      assert_int_equal(len, 184 + (size_t)d.blob_bytes);
      assert_non_null(memchr(d.addr, 0, sizeof d.addr));
      assert_true(d.port != 0);
    }
  }
  assert_true(accepted > 0); /* the mutated half does get through sometimes */
  free(buf);
}

/* ------------------------------------------------------------ whole runs */

static void run_ring(int nranks, size_t blob_bytes) {
  brg__boot_id id;
  start_root(20000, &id);
  rank_run *r = runs_new(&id, nranks, blob_bytes, 15000);
  runs_go(r, NULL, nranks);
  expect_success(r, nranks);
  for (int k = 0; k < nranks; k++) {
    for (int j = 0; j < nranks; j++)
      for (size_t i = 0; i < blob_bytes; i++)
        if (r[k].all[(size_t)j * blob_bytes + i] != blob_byte(j, i))
          fail_msg("rank %d: byte %zu of rank %d's blob is wrong", k, i, j);
    int next = brg__bootstrap_fd(r[k].bs, BRG__RING_NEXT);
    int prev = brg__bootstrap_fd(r[k].bs, BRG__RING_PREV);
    if (nranks == 1) {
      assert_int_equal(next, -1);
      assert_int_equal(prev, -1);
    } else {
      assert_true(next >= 0 && prev >= 0 && next != prev); /* two sockets, also for N=2 */
    }
    /* The data links' key: HMAC of the secret, the same on every rank. */
    uint8_t key[32];
    brg__hmac_sha256(id.secret, 16, "brigade data links", 18, NULL, 0, NULL, 0, key);
    assert_memory_equal(brg__bootstrap_secret(r[k].bs), key, 16);
    assert_memory_not_equal(brg__bootstrap_secret(r[k].bs), id.secret, 16);
  }
  assert_int_equal(brg__bootstrap_fd(r[0].bs, 7), -1);
  expect_root_gone(id.port);
  runs_free(r, nranks);
}

static void test_ring_1(void **state) {
  (void)state;
  run_ring(1, 40);
}
static void test_ring_2(void **state) {
  (void)state;
  run_ring(2, 0);
}
static void test_ring_3(void **state) {
  (void)state;
  run_ring(3, 40);
}
static void test_ring_5(void **state) {
  (void)state;
  run_ring(5, BRG__BOOT_MAX_BLOB);
}
static void test_ring_12(void **state) {
  (void)state;
  run_ring(12, 8);
}

/* Every tree shape up to 17 ranks (full, one child short, one child
 * missing at the last level) spreads every blob to every rank. */
static void test_tree_sizes(void **state) {
  (void)state;
  for (int n = 4; n <= 17; n++)
    if (n != 5 && n != 12) run_ring(n, 24);
}

/* Rank 2 of 3 (a leaf, child of rank 0) as a hand-made process: it sends
 * its hello and reads the root's answer, then stays silent (gone = 0) or
 * hangs up on the root (gone = 1). */
static void run_tree_child_fails(int gone) {
  brg__boot_id id;
  start_root(20000, &id);
  /* Only rank 0 (which waits for rank 2) has a short deadline. */
  rank_run *r = runs_new(&id, 3, 8, 10000);
  if (!gone) r[0].timeout_ms = 1500;
  pthread_t t[2];
  int64_t t0 = now_ms();
  for (int k = 0; k < 2; k++) assert_int_equal(pthread_create(&t[k], NULL, rank_main, &r[k]), 0);
  uint8_t buf[2048];
  int fake = tcp_connect_local(id.port);
  send_bytes(fake, buf, make_hello(fake, buf, sizeof buf, id.secret, 2, 3, 8));
  uint8_t hdr[28 + 76];
  assert_int_equal(brg__sock_recv_all(fake, hdr, sizeof hdr, now_ms() + 5000), BRG__IO_OK);
  assert_int_equal(hdr[20], 0); /* status 0: its parent, rank 0 */
  if (gone) close(fake);
  for (int k = 0; k < 2; k++) pthread_join(t[k], NULL);
  int64_t took = now_ms() - t0;
  if (!gone) {
    /* Rank 0 names the child that never came; rank 1 hears why from the
     * root, which saw rank 0 hang up. */
    if (r[0].st != BRG_ERR_TIMEOUT)
      fail_msg("rank 0: %s: %s", brg_status_string(r[0].st), r[0].err.msg);
    expect_msg(&r[0].err, "tree child rank 2 did not connect within 1500 ms");
    if (r[1].st != BRG_ERR_REMOTE)
      fail_msg("rank 1: %s: %s", brg_status_string(r[1].st), r[1].err.msg);
    expect_msg(&r[1].err, "rank 0 (pid ");
    close(fake);
  } else {
    /* The root fails the job as soon as rank 2 hangs up. */
    for (int k = 0; k < 2; k++) {
      if (r[k].st != BRG_ERR_REMOTE)
        fail_msg("rank %d: %s: %s", k, brg_status_string(r[k].st), r[k].err.msg);
      expect_msg(&r[k].err, "rank 2 (pid 4242 on rogue-host) hung up");
    }
  }
  if (took > 5000) fail_msg("the ranks were told after %lld ms", (long long)took);
  for (int k = 0; k < 2; k++) assert_null(r[k].bs);
  runs_free(r, 3);
  expect_root_gone(id.port);
}

static void test_tree_child_silent(void **state) {
  (void)state;
  run_tree_child_fails(0);
}

static void test_tree_child_gone(void **state) {
  (void)state;
  run_tree_child_fails(1);
}

/* Strangers at the root's door while the real ranks join. */
static void test_foreign_connections(void **state) {
  (void)state;
  brg__boot_id id;
  start_root(20000, &id);
  uint8_t buf[2048];

  int garbage = tcp_connect_local(id.port);
  rnd_fill(buf, 300);
  send_bytes(garbage, buf, 300);

  /* A well-formed hello for rank 0 with the wrong secret: if the root took
   * it, the real rank 0 would be refused as a duplicate. */
  uint8_t wrong[16];
  memcpy(wrong, id.secret, 16);
  wrong[5] ^= 1;
  int stranger = tcp_connect_local(id.port);
  size_t n = make_hello(stranger, buf, sizeof buf, wrong, 0, 3, 8);
  send_bytes(stranger, buf, n);

  /* Silent: must not hold up the others. */
  int silent = tcp_connect_local(id.port);

  /* Right secret, absurd lengths: refused with an answer. */
  int absurd = tcp_connect_local(id.port);
  n = make_hello(absurd, buf, sizeof buf, id.secret, 0, 3, 0);
  put32(buf + 96, 1u << 30);
  send_bytes(absurd, buf, n);

  /* Random tails after a correct magic and secret, and cut-off hellos. */
  int fuzz[24];
  for (int k = 0; k < 24; k++) {
    fuzz[k] = tcp_connect_local(id.port);
    n = make_hello(fuzz[k], buf, sizeof buf, id.secret, 1, 3, 8);
    if (k % 3 == 0) {
      rnd_fill(buf + 20, n - 20);
    } else if (k % 3 == 1) {
      rnd_fill(buf + 20, 8); /* rank and nranks */
    } else {
      n = (size_t)(rnd() % n);
    }
    send_bytes(fuzz[k], buf, n);
    if (k % 2) close(fuzz[k]), fuzz[k] = -1; /* some hang up at once */
  }

  int64_t t0 = now_ms();
  rank_run *r = runs_new(&id, 3, 8, 15000);
  runs_go(r, NULL, 3);
  expect_success(r, 3);
  /* The silent connection cost nothing: the root did not wait on it. */
  if (now_ms() - t0 >= 1900) fail_msg("ranks took %lld ms", (long long)(now_ms() - t0));

  assert_true(closed_by_peer(garbage));
  assert_true(closed_by_peer(stranger));
  assert_true(closed_by_peer(absurd));
  assert_true(closed_by_peer(silent));
  close(garbage);
  close(stranger);
  close(absurd);
  close(silent);
  for (int k = 0; k < 24; k++)
    if (fuzz[k] >= 0) close(fuzz[k]);
  expect_root_gone(id.port);
  runs_free(r, 3);
}

/* A connection that says nothing is dropped after about 2 s. */
static void test_silent_connection_dropped(void **state) {
  (void)state;
  brg__boot_id id;
  start_root(10000, &id);
  int silent = tcp_connect_local(id.port);
  int64_t t0 = now_ms();
  assert_true(closed_by_peer(silent));
  int64_t took = now_ms() - t0;
  if (took < 1500 || took > 4000)
    fail_msg("silent connection dropped after %lld ms", (long long)took);
  close(silent);
  /* The root is still serving. */
  rank_run *r = runs_new(&id, 1, 4, 5000);
  runs_go(r, NULL, 1);
  expect_success(r, 1);
  runs_free(r, 1);
}

/* Ranks of this job that get it wrong hear why from the root. */
static void test_root_refusals(void **state) {
  (void)state;
  brg__boot_id id;
  start_root(20000, &id);
  brg__errbuf err = {0};
  uint8_t buf[2048], blob[16] = {0}, all[64];
  brg__bootstrap *bs = NULL;

  /* Rank 0 of 2 arrives by hand and stays; rank 1 says 3 ranks, or sends
   * a blob of another size: the job fails, and both ranks are told both
   * values (rank 0 too, rather than wait for a rank 1 that never comes). */
  for (int which = 0; which < 2; which++) {
    brg__boot_id jid;
    start_root(20000, &jid);
    int fake0 = tcp_connect_local(jid.port);
    size_t n = make_hello(fake0, buf, sizeof buf, jid.secret, 0, 2, 8);
    send_bytes(fake0, buf, n);
    sleep_ms(100);
    const char *needle = which == 0 ? "says WORLD_SIZE (nranks) is 3, rank 0 (pid 4242 on "
                                      "rogue-host) said 2"
                                    : "sent 16 bytes, rank 0 said 8";
    assert_int_equal(brg__bootstrap_init(&bs, &jid, 1, which == 0 ? 3 : 2, blob,
                                         which == 0 ? 8 : 16, all, 5000, &err),
                     BRG_ERR_REMOTE);
    expect_msg(&err, needle);
    uint8_t hdr[28];
    static char text[2048];
    assert_int_equal(brg__sock_recv_all(fake0, hdr, sizeof hdr, now_ms() + 5000), BRG__IO_OK);
    uint32_t len = (uint32_t)hdr[24] | (uint32_t)hdr[25] << 8;
    assert_true(hdr[20] != 0 && len > 0 && len < sizeof text);
    assert_int_equal(brg__sock_recv_all(fake0, text, len, now_ms() + 5000), BRG__IO_OK);
    text[len] = '\0';
    if (!strstr(text, needle)) fail_msg("rank 0 was told \"%s\"", text);
    close(fake0);
    expect_root_gone(jid.port);
  }

  int fake0 = tcp_connect_local(id.port);
  size_t n = make_hello(fake0, buf, sizeof buf, id.secret, 0, 2, 8);
  send_bytes(fake0, buf, n);
  sleep_ms(100);

  /* The hand-made rank 0 hangs up: the real one takes its place, and the
   * table never names the dead one. */
  close(fake0);
  sleep_ms(50);
  rank_run *r = runs_new(&id, 2, 8, 10000);
  runs_go(r, NULL, 2);
  expect_success(r, 2);
  runs_free(r, 2);
  expect_root_gone(id.port);
}

/* A rank claimed by a second live process fails the whole job: every rank
 * (the rogue that came first included) is told, with both claimants' pid
 * and host, instead of the first claimant silently taking the rank.
 * `when`: 0, the rogue claims rank 1 before anyone else; 1, the honest
 * ranks have all arrived, the table is out, and the rogue comes during
 * their set-up. */
static void run_claimed_twice(int when) {
  brg__boot_id id;
  start_root(20000, &id);
  uint8_t buf[2048];
  int rogue = -1;
  if (when == 0) {
    rogue = tcp_connect_local(id.port);
    size_t n = make_hello(rogue, buf, sizeof buf, id.secret, 1, 3, 8);
    send_bytes(rogue, buf, n);
    sleep_ms(100);
  }
  rank_run *r = runs_new(&id, 3, 8, 10000);
  if (when == 1) /* the table is out; the ranks set up their transports */
    for (int k = 0; k < 3; k++) r[k].setup_ms = 800;
  pthread_t t[3];
  for (int k = 0; k < 3; k++) assert_int_equal(pthread_create(&t[k], NULL, rank_main, &r[k]), 0);
  if (when == 1) {
    sleep_ms(300);
    rogue = tcp_connect_local(id.port);
    size_t n = make_hello(rogue, buf, sizeof buf, id.secret, 1, 3, 8);
    send_bytes(rogue, buf, n);
  }
  for (int k = 0; k < 3; k++) pthread_join(t[k], NULL);
  char mine[32];
  snprintf(mine, sizeof mine, "pid %d on ", (int)getpid());
  for (int k = 0; k < 3; k++) {
    if (r[k].st != BRG_ERR_REMOTE)
      fail_msg("rank %d: %s, expected BRG_ERR_REMOTE: %s", k, brg_status_string(r[k].st),
               r[k].err.msg);
    expect_msg(&r[k].err, "rank 1 was claimed twice");
    expect_msg(&r[k].err, "pid 4242 on rogue-host");
    expect_msg(&r[k].err, mine);
  }
  /* The rogue is told too (after the table, when the table went out
   * before the second claim). */
  uint8_t hdr[28];
  static char text[1 << 16];
  uint32_t len = 0;
  for (int answers = 0; answers < 2; answers++) {
    assert_int_equal(brg__sock_recv_all(rogue, hdr, sizeof hdr, now_ms() + 5000), BRG__IO_OK);
    len = (uint32_t)hdr[24] | (uint32_t)hdr[25] << 8 | (uint32_t)hdr[26] << 16 |
          (uint32_t)hdr[27] << 24;
    assert_true(len < sizeof text);
    assert_int_equal(brg__sock_recv_all(rogue, text, len, now_ms() + 5000), BRG__IO_OK);
    if (hdr[20] != 0) break; /* the error, not the table */
  }
  assert_true(hdr[20] != 0 && len > 0 && len <= 1024);
  text[len] = '\0';
  if (!strstr(text, "rank 1 was claimed twice")) fail_msg("the rogue was told \"%s\"", text);
  close(rogue);
  runs_free(r, 3);
  expect_root_gone(id.port);
}

static void test_claimed_twice_first(void **state) {
  (void)state;
  run_claimed_twice(0);
}

static void test_claimed_twice_late(void **state) {
  (void)state;
  run_claimed_twice(1);
}

static void run_missing(int nranks, const int *present, int npresent, const char *needle) {
  brg__boot_id id;
  start_root(1500, &id);
  rank_run *r = runs_new(&id, nranks, 8, 10000);
  int64_t t0 = now_ms();
  runs_go(r, present, npresent);
  int64_t took = now_ms() - t0;
  for (int k = 0; k < npresent; k++) {
    rank_run *a = &r[present[k]];
    if (a->st != BRG_ERR_TIMEOUT)
      fail_msg("rank %d: %s: %s", a->rank, brg_status_string(a->st), a->err.msg);
    expect_msg(&a->err, needle);
    expect_msg(&a->err, "within 1350 ms (the timeout of 1500 ms");
    assert_null(a->bs);
  }
  if (took > 4000) fail_msg("the error came after %lld ms", (long long)took);
  expect_root_gone(id.port);
  runs_free(r, nranks);
}

static void test_missing_rank(void **state) {
  (void)state;
  const int present[] = {0, 2};
  run_missing(3, present, 2, "rank 1 never reached the bootstrap root at 127.0.0.1:");
}

static void test_missing_ranks(void **state) {
  (void)state;
  const int present[] = {1, 0};
  run_missing(4, present, 2, "ranks 2,3 never reached the bootstrap root at 127.0.0.1:");
}

static void test_root_unreachable(void **state) {
  (void)state;
  /* A port nobody listens on. */
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof sa;
  assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
  assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
  close(fd);
  brg__errbuf err = {0};
  brg__boot_id id;
  assert_int_equal(brg__boot_id_make(&id, "127.0.0.1", ntohs(sa.sin_port), NULL, &err),
                   BRG_SUCCESS);
  brg__bootstrap *bs = NULL;
  int64_t t0 = now_ms();
  assert_int_equal(brg__bootstrap_init(&bs, &id, 0, 2, NULL, 0, NULL, 500, &err), BRG_ERR_TIMEOUT);
  int64_t took = now_ms() - t0;
  assert_true(took >= 450 && took < 3000);
  char where[64];
  snprintf(where, sizeof where, "127.0.0.1:%u", ntohs(sa.sin_port));
  expect_msg(&err, where);
  expect_msg(&err, "500 ms");
  assert_null(bs);
}

static void test_bad_arguments(void **state) {
  (void)state;
  brg__errbuf err = {0};
  brg__boot_id id;
  brg__bootstrap *bs = NULL;
  uint8_t blob[8] = {0}, all[16];
  assert_int_equal(brg__boot_id_make(&id, "127.0.0.1", 1, NULL, &err), BRG_SUCCESS);
  assert_int_equal(brg__bootstrap_init(&bs, &id, 2, 2, blob, 8, all, 100, &err),
                   BRG_ERR_INVALID_ARGUMENT);
  assert_int_equal(brg__bootstrap_init(&bs, &id, 0, 0, blob, 8, all, 100, &err),
                   BRG_ERR_INVALID_ARGUMENT);
  assert_int_equal(
      brg__bootstrap_init(&bs, &id, 0, 2, blob, BRG__BOOT_MAX_BLOB + 1, all, 100, &err),
      BRG_ERR_INVALID_ARGUMENT);
  id.port ^= 1; /* now the checksum is wrong */
  assert_int_equal(brg__bootstrap_init(&bs, &id, 0, 2, blob, 8, all, 100, &err),
                   BRG_ERR_INVALID_ARGUMENT);
  expect_msg(&err, "corrupted or not a brigade id");
  assert_null(bs);

  char addr[64];
  assert_int_equal(brg__boot_local_addr(addr, sizeof addr, &err), BRG_SUCCESS);
  assert_true(strlen(addr) > 0);
  assert_int_equal(brg__boot_local_addr(addr, 2, &err), BRG_ERR_INVALID_ARGUMENT);
  assert_int_equal(brg__bootstrap_fd(NULL, BRG__RING_NEXT), -1);
  brg__bootstrap_destroy(NULL);
}

/* Two ranks, then the ring sockets misbehave in each way a peer can. */
static void test_ring_failures(void **state) {
  (void)state;
  brg__boot_id id;
  start_root(20000, &id);
  rank_run *r = runs_new(&id, 2, 4, 10000);
  for (int k = 0; k < 2; k++) r[k].exchange = 0;
  runs_go(r, NULL, 2);
  expect_success(r, 2);
  brg__bootstrap *b0 = r[0].bs, *b1 = r[1].bs;
  brg__errbuf err = {0};
  uint8_t data[BRG__BOOT_MAX_MSG + 1];
  uint32_t type, len;

  /* Nothing sent: a timeout, quick when asked for none. */
  int64_t t0 = now_ms();
  assert_int_equal(
      brg__bootstrap_recv(b0, BRG__RING_PREV, &type, data, sizeof data, &len, 150, &err),
      BRG_ERR_TIMEOUT);
  assert_true(now_ms() - t0 >= 140);
  expect_msg(&err, "rank 1");
  assert_int_equal(brg__bootstrap_recv(b0, BRG__RING_PREV, &type, data, sizeof data, &len, 0, &err),
                   BRG_ERR_TIMEOUT);

  /* Bad arguments. */
  assert_int_equal(brg__bootstrap_send(b0, BRG__RING_NEXT, 1, data, BRG__BOOT_MAX_MSG + 1, &err),
                   BRG_ERR_INVALID_ARGUMENT);
  assert_int_equal(brg__bootstrap_send(b0, 5, 1, data, 1, &err), BRG_ERR_INVALID_ARGUMENT);

  /* Largest and empty messages, then one larger than the reader expects:
   * refused, but the stream stays in step. */
  memset(data, 0x5a, sizeof data);
  assert_int_equal(brg__bootstrap_send(b0, BRG__RING_NEXT, 7, data, BRG__BOOT_MAX_MSG, &err),
                   BRG_SUCCESS);
  assert_int_equal(brg__bootstrap_send(b0, BRG__RING_NEXT, 8, NULL, 0, &err), BRG_SUCCESS);
  assert_int_equal(brg__bootstrap_send(b0, BRG__RING_NEXT, 9, data, 100, &err), BRG_SUCCESS);
  assert_int_equal(brg__bootstrap_send(b0, BRG__RING_NEXT, 10, "ok", 3, &err), BRG_SUCCESS);
  uint8_t got[BRG__BOOT_MAX_MSG];
  assert_int_equal(
      brg__bootstrap_recv(b1, BRG__RING_PREV, &type, got, sizeof got, &len, 5000, &err),
      BRG_SUCCESS);
  assert_int_equal(type, 7);
  assert_int_equal(len, BRG__BOOT_MAX_MSG);
  assert_memory_equal(got, data, BRG__BOOT_MAX_MSG);
  assert_int_equal(brg__bootstrap_recv(b1, BRG__RING_PREV, &type, NULL, 0, &len, 5000, &err),
                   BRG_SUCCESS);
  assert_int_equal(type, 8);
  assert_int_equal(len, 0);
  assert_int_equal(brg__bootstrap_recv(b1, BRG__RING_PREV, &type, got, 10, &len, 5000, &err),
                   BRG_ERR_REMOTE);
  expect_msg(&err, "100-byte message");
  assert_int_equal(brg__bootstrap_recv(b1, BRG__RING_PREV, &type, got, 10, &len, 5000, &err),
                   BRG_SUCCESS);
  assert_int_equal(type, 10);
  assert_string_equal((char *)got, "ok");

  /* A message that trickles in across a timeout is not lost. */
  int raw = brg__bootstrap_fd(b1, BRG__RING_NEXT); /* rank 1 -> rank 0's PREV */
  uint8_t frame[12];
  put32(frame, 21);
  put32(frame + 4, 4);
  memcpy(frame + 8, "abc", 4);
  send_bytes(raw, frame, 6);
  assert_int_equal(brg__bootstrap_recv(b0, BRG__RING_PREV, &type, got, sizeof got, &len, 50, &err),
                   BRG_ERR_TIMEOUT);
  send_bytes(raw, frame + 6, 6);
  assert_int_equal(
      brg__bootstrap_recv(b0, BRG__RING_PREV, &type, got, sizeof got, &len, 5000, &err),
      BRG_SUCCESS);
  assert_int_equal(type, 21);
  assert_string_equal((char *)got, "abc");

  /* A garbled length: malformed, and the socket is done for. */
  put32(frame, 1);
  put32(frame + 4, 0x7fffffff);
  send_bytes(raw, frame, 8);
  assert_int_equal(
      brg__bootstrap_recv(b0, BRG__RING_PREV, &type, got, sizeof got, &len, 5000, &err),
      BRG_ERR_REMOTE);
  expect_msg(&err, "malformed message");
  assert_int_equal(brg__bootstrap_recv(b0, BRG__RING_PREV, &type, got, sizeof got, &len, 0, &err),
                   BRG_ERR_REMOTE);

  /* Rank 1 dies: rank 0 hears it on its other socket, by poll and by recv,
   * and its sends fail instead of killing it with SIGPIPE. */
  brg__bootstrap_destroy(b1);
  r[1].bs = NULL;
  struct pollfd p = {.fd = brg__bootstrap_fd(b0, BRG__RING_NEXT), .events = POLLIN};
  assert_int_equal(poll(&p, 1, 5000), 1);
  assert_int_equal(
      brg__bootstrap_recv(b0, BRG__RING_NEXT, &type, got, sizeof got, &len, 5000, &err),
      BRG_ERR_REMOTE);
  expect_msg(&err, "ring neighbour rank 1 closed the connection (process died?)");

  brg__boot_id id2;
  start_root(20000, &id2);
  rank_run *s = runs_new(&id2, 2, 4, 10000);
  for (int k = 0; k < 2; k++) s[k].exchange = 0;
  runs_go(s, NULL, 2);
  expect_success(s, 2);
  brg__bootstrap_destroy(s[1].bs);
  s[1].bs = NULL;
  brg_status st = BRG_SUCCESS;
  for (int k = 0; k < 1000 && st == BRG_SUCCESS; k++) {
    st = brg__bootstrap_send(s[0].bs, BRG__RING_NEXT, 1, data, 1000, &err);
    if (st == BRG_SUCCESS) sleep_ms(1);
  }
  assert_int_equal(st, BRG_ERR_REMOTE);
  expect_msg(&err, "closed the connection");
  runs_free(s, 2);
  runs_free(r, 2);
}

/* Strangers at a rank's ring listener are turned away; prev still gets in.
 * The ring hello is 44 bytes: magic "BRGR", proof, from_rank, to_rank,
 * nonce (bootstrap_wire.h); the proof is for the listener's challenge. */
static void test_ring_stranger(void **state) {
  (void)state;
  brg__boot_id id;
  start_root(20000, &id);
  rank_run *r = runs_new(&id, 3, 4, 10000);
  for (int k = 0; k < 3; k++) r[k].ring = 0;
  runs_go(r, NULL, 3);
  expect_success(r, 3);

  uint16_t port = 0;
  const char *addr = brg__bootstrap_peer_addr(r[0].bs, 1, &port);
  assert_non_null(addr);
  assert_null(brg__bootstrap_peer_addr(r[0].bs, 3, NULL));
  struct sockaddr_storage ss;
  memset(&ss, 0, sizeof ss);
  socklen_t sslen;
  if (strchr(addr, ':')) {
    struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
    s6->sin6_family = AF_INET6;
    s6->sin6_port = htons(port);
    assert_int_equal(inet_pton(AF_INET6, addr, &s6->sin6_addr), 1);
    sslen = sizeof *s6;
  } else {
    struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
    s4->sin_family = AF_INET;
    s4->sin_port = htons(port);
    assert_int_equal(inet_pton(AF_INET, addr, &s4->sin_addr), 1);
    sslen = sizeof *s4;
  }
  uint8_t m[6][44];
  for (int k = 0; k < 6; k++) {
    memset(m[k], 0, sizeof m[k]);
    put32(m[k], 0x42524752u);
    put32(m[k] + 20, 0); /* rank 0 to rank 1: right, unless changed below */
    put32(m[k] + 24, 1);
  }
  put32(m[2] + 20, 2); /* rank 2 is not rank 1's predecessor */
  put32(m[3] + 24, 2); /* meant for rank 2 */
  int fds[7];
  uint8_t old_challenge[16];
  for (int k = 0; k < 7; k++) {
    fds[k] = socket(ss.ss_family, SOCK_STREAM, 0);
    assert_int_equal(connect(fds[k], (struct sockaddr *)&ss, sslen), 0);
    struct timeval tv = {.tv_sec = 5};
    setsockopt(fds[k], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  }
  /* The listener is not accepting before ring_connect: the challenges come
   * then, and each stranger answers its own (the last one stays silent). */
  for (int k = 0; k < 3; k++) r[k].ring = 1;
  pthread_t t[3];
  for (int k = 0; k < 3; k++) assert_int_equal(pthread_create(&t[k], NULL, rank_main, &r[k]), 0);
  for (int k = 0; k < 6; k++) {
    uint8_t challenge[16];
    const char *why = NULL;
    assert_int_equal(brg__boot_challenge_read(fds[k], challenge, now_ms() + 5000, &why),
                     BRG__IO_OK);
    if (k == 0) {
      rnd_fill(m[0], 44); /* garbage */
    } else if (k == 1) {
      brg__boot_sign(m[1], 44, id.secret, challenge);
      m[1][9] ^= 0x40; /* a wrong proof */
    } else if (k == 4) {
      memcpy(m[4] + 4, id.secret, 16); /* the secret itself is no proof */
    } else if (k == 5) {
      brg__boot_sign(m[5], 44, id.secret, old_challenge); /* another connection's proof */
    } else {
      brg__boot_sign(m[k], 44, id.secret, challenge);
    }
    if (k == 0) memcpy(old_challenge, challenge, 16);
    send_bytes(fds[k], m[k], 44);
  }
  for (int k = 0; k < 3; k++) pthread_join(t[k], NULL);

  expect_success(r, 3);
  for (int k = 0; k < 7; k++) {
    assert_true(closed_by_peer(fds[k]));
    close(fds[k]);
  }
  runs_free(r, 3);
}

static int setup_alarm(void **state) {
  (void)state;
  alarm(TEST_ALARM_S);
  return 0;
}
static int teardown_alarm(void **state) {
  (void)state;
  alarm(0);
  return 0;
}

#define T(f) cmocka_unit_test_setup_teardown(f, setup_alarm, teardown_alarm)

int main(void) {
  const struct CMUnitTest tests[] = {
      T(test_id_round_trip),
      T(test_id_corruption),
      T(test_hello_round_trip),
      T(test_hello_rejects_bad),
      T(test_hello_garbage),
      T(test_bad_arguments),
      T(test_ring_1),
      T(test_ring_2),
      T(test_ring_3),
      T(test_ring_5),
      T(test_ring_12),
      T(test_tree_sizes),
      T(test_tree_child_silent),
      T(test_tree_child_gone),
      T(test_foreign_connections),
      T(test_silent_connection_dropped),
      T(test_root_refusals),
      T(test_claimed_twice_first),
      T(test_claimed_twice_late),
      T(test_missing_rank),
      T(test_missing_ranks),
      T(test_root_unreachable),
      T(test_ring_failures),
      T(test_ring_stranger),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
