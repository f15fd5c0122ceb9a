/* The notice a stopping rank writes on its point-to-point connections
 * (runtime/exec/p2p/p2p.c, brg__p2p_notify): its bytes read in any pieces
 * among doorbells, and every malformed form refused with a reason; then two
 * ranks as threads of this process, over tcp and over shm: a rank that
 * aborts and destroys its communicator leaves its peer a failed receive
 * that gives the abort's cause ("rank 1 ... stopped: ..."), not the
 * hang-up alone; and a malformed notice on a live connection fails the
 * sends on it with a message that says so. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "internal.h"

/* Feeds a notice's bytes to rx in pieces of `step`; returns what the last
 * piece's take said and how many pieces said 1. */
static int feed(brg__p2p_note_rx *rx, const char *b, size_t n, size_t step, int *ones) {
  int r = 0;
  *ones = 0;
  for (size_t at = 0; at < n; at += step) {
    r = brg__p2p_note_take(rx, b + at, n - at < step ? n - at : step);
    *ones += r == 1;
  }
  return r;
}

static void expect_why(const brg__p2p_note_rx *rx, const char *part) {
  if (!strstr(rx->why, part)) fail_msg("\"%s\" does not say \"%s\"", rx->why, part);
}

static void test_note_bytes(void **state) {
  (void)state;
  char b[3 + BRG__P2P_NOTE_MAX + 8];
  const char *text = "allreduce #5 (tree): receive from rank 2 failed: rank 2 hung up";
  size_t n = brg__p2p_note_make(b, sizeof b, text);
  assert_int_equal(n, 3 + strlen(text));
  assert_int_equal((unsigned char)b[0], BRG__P2P_NOTE_MARK);
  /* Whole, and byte by byte: complete at its last byte only. */
  for (size_t step = 1; step <= n; step = step * 3 + 1) {
    brg__p2p_note_rx rx = {0};
    int ones;
    assert_int_equal(feed(&rx, b, n, step, &ones), 1);
    assert_int_equal(ones, 1);
    assert_true(rx.done);
    assert_string_equal(rx.text, text);
  }
  /* Among doorbells, a second notice read past: the first is kept. */
  char two[2 * sizeof b + 8];
  size_t m = 0;
  two[m++] = 1;
  memcpy(two + m, b, n);
  m += n;
  two[m++] = 1;
  two[m++] = 1;
  m += brg__p2p_note_make(two + m, sizeof two - m, "a later one");
  two[m++] = 1;
  brg__p2p_note_rx rx = {0};
  int ones;
  feed(&rx, two, m, 7, &ones);
  assert_int_equal(rx.state, 0);
  assert_string_equal(rx.text, text);
  assert_int_equal(brg__p2p_note_ended(&rx), 0);
  /* Doorbells only: nothing, and a clean end. */
  brg__p2p_note_rx bells = {0};
  char ones3[3] = {1, 1, 1};
  assert_int_equal(brg__p2p_note_take(&bells, ones3, 3), 0);
  assert_int_equal(brg__p2p_note_ended(&bells), 0);
  assert_false(bells.done);
  /* Control bytes and NULs in the text are shown as '?'. */
  const char raw[] = {(char)BRG__P2P_NOTE_MARK, 5, 0, 'a', 0, '\n', 0x7f, 'z'};
  brg__p2p_note_rx ctl = {0};
  assert_int_equal(brg__p2p_note_take(&ctl, raw, sizeof raw), 1);
  assert_string_equal(ctl.text, "a???z");
  /* A text too long is cut in its middle to the most a notice holds, its
   * start and its end (the cause from further away) kept; an empty one
   * says so. */
  char lng[BRG__P2P_NOTE_MAX + 50];
  memset(lng, 'x', sizeof lng - 1);
  memcpy(lng, "allreduce #3", 12);
  memcpy(lng + sizeof lng - 1 - 15, "rank 2 hung up.", 15);
  lng[sizeof lng - 1] = 0;
  assert_int_equal(brg__p2p_note_make(b, sizeof b, lng), 3 + BRG__P2P_NOTE_MAX);
  brg__p2p_note_rx cut = {0};
  assert_int_equal(brg__p2p_note_take(&cut, b, 3 + BRG__P2P_NOTE_MAX), 1);
  assert_int_equal(strlen(cut.text), BRG__P2P_NOTE_MAX);
  assert_memory_equal(cut.text, "allreduce #3x", 13);
  assert_non_null(strstr(cut.text, "xxx ... xxx"));
  assert_string_equal(cut.text + BRG__P2P_NOTE_MAX - 16, "xrank 2 hung up.");
  /* At the most, whole. */
  lng[BRG__P2P_NOTE_MAX] = 0;
  assert_int_equal(brg__p2p_note_make(b, sizeof b, lng), 3 + BRG__P2P_NOTE_MAX);
  brg__p2p_note_rx whole = {0};
  assert_int_equal(brg__p2p_note_take(&whole, b, 3 + BRG__P2P_NOTE_MAX), 1);
  assert_string_equal(whole.text, lng);
  assert_int_equal(brg__p2p_note_make(b, sizeof b, ""), 3 + strlen("(no cause given)"));
  /* No room: nothing written. */
  assert_int_equal(brg__p2p_note_make(b, 10, text), 0);
}

static void test_note_malformed(void **state) {
  (void)state;
  struct {
    const char *bytes;
    size_t n;
    const char *why;
  } bad[] = {
      {"\x01\x02", 2, "byte 0x02 is neither a doorbell nor the start of a notice"},
      {"\xff", 1, "byte 0xff"},
      {"\x6e\x00\x00", 3, "a notice of 0 bytes (1 to 300 are allowed)"},
      {"\x6e\xff\xff", 3, "a notice of 65535 bytes"},
      {"\x6e\x2d\x01", 3, "a notice of 301 bytes"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    brg__p2p_note_rx rx = {0};
    assert_int_equal(brg__p2p_note_take(&rx, bad[i].bytes, bad[i].n), -1);
    expect_why(&rx, bad[i].why);
    /* and it stays so, whatever comes after */
    assert_int_equal(brg__p2p_note_take(&rx, "\x01", 1), -1);
    assert_int_equal(brg__p2p_note_ended(&rx), -1);
    expect_why(&rx, bad[i].why);
  }
  /* The connection ends inside a notice: in its length, in its text. */
  brg__p2p_note_rx rx = {0};
  assert_int_equal(brg__p2p_note_take(&rx, "\x01\x6e\x0a", 3), 0);
  assert_int_equal(brg__p2p_note_ended(&rx), -1);
  expect_why(&rx, "the connection ended 2 bytes into a notice");
  brg__p2p_note_rx rx2 = {0};
  assert_int_equal(brg__p2p_note_take(&rx2,
                                      "\x6e\x0a\x00"
                                      "abcd",
                                      7),
                   0);
  assert_int_equal(brg__p2p_note_ended(&rx2), -1);
  expect_why(&rx2, "the connection ended 7 bytes into a notice");
}

/* ------------------------------------------------ two ranks, one process */

typedef struct rank_arg {
  int rank;
  const brg_unique_id *id;
  brg_comm *comm;
  brg_status init;
} rank_arg;

static void *rank_init(void *p) {
  rank_arg *a = p;
  a->init = brg_comm_init(&a->comm, 2, a->id, a->rank);
  return NULL;
}

/* Two ranks over `transports`, with a message each way (so each has a
 * connection to the other, and one from it). */
static void pair(const char *transports, brg_comm *c[2]) {
  setenv("BRIGADE_TRANSPORTS", transports, 1);
  setenv("BRIGADE_TIMEOUT_MS", "20000", 1);
  setenv("BRIGADE_ALGO", "ring", 1);
  brg_unique_id id;
  assert_int_equal(brg_get_unique_id(&id), BRG_SUCCESS);
  rank_arg a[2];
  pthread_t t[2];
  for (int r = 0; r < 2; r++) {
    a[r] = (rank_arg){.rank = r, .id = &id};
    assert_int_equal(pthread_create(&t[r], NULL, rank_init, &a[r]), 0);
  }
  for (int r = 0; r < 2; r++) pthread_join(t[r], NULL);
  for (int r = 0; r < 2; r++) {
    if (a[r].init != BRG_SUCCESS) fail_msg("rank %d: init: %s", r, brg_comm_last_error(NULL));
    c[r] = a[r].comm;
  }
  for (int from = 0; from < 2; from++) {
    int32_t out = 40 + from, in = 0;
    brg_request rs, rr;
    assert_int_equal(brg_irecv(&in, 1, BRG_INT32, from, c[1 - from], &rr), BRG_SUCCESS);
    assert_int_equal(brg_isend(&out, 1, BRG_INT32, 1 - from, c[from], &rs), BRG_SUCCESS);
    assert_int_equal(brg_wait(&rs), BRG_SUCCESS);
    assert_int_equal(brg_wait(&rr), BRG_SUCCESS);
    assert_int_equal(in, 40 + from);
  }
}

static void expect_msg(const char *m, const char *part) {
  if (!strstr(m, part)) fail_msg("\"%s\" does not say \"%s\"", m, part);
}

/* Rank 1 aborts (its cause: "the communicator was aborted") and goes; rank
 * 0's receive from it fails with that cause. */
static void stop_told(const char *transports) {
  brg_comm *c[2];
  pair(transports, c);
  int32_t in = 0;
  brg_request rr;
  assert_int_equal(brg_irecv(&in, 1, BRG_INT32, 1, c[0], &rr), BRG_SUCCESS);
  assert_int_equal(brg_comm_abort(c[1]), BRG_SUCCESS);
  brg_comm_destroy(c[1]);
  assert_int_equal(brg_wait(&rr), BRG_ERR_REMOTE);
  const char *m = brg_comm_last_error(c[0]);
  expect_msg(m, "from rank 1");
  expect_msg(m, "rank 1 (pid");
  expect_msg(m, ") stopped: the communicator was aborted");
  brg_comm_destroy(c[0]);
}

static void test_stop_told_tcp(void **state) {
  (void)state;
  stop_told("tcp");
}

static void test_stop_told_shm(void **state) {
  (void)state;
  stop_told("shm");
}

/* The port a socket's address holds (v4 or v6); -1: none. */
static int port_of(const struct sockaddr_storage *ss) {
  if (ss->ss_family == AF_INET) return ntohs(((const struct sockaddr_in *)ss)->sin_port);
  if (ss->ss_family == AF_INET6) return ntohs(((const struct sockaddr_in6 *)ss)->sin6_port);
  return -1;
}

/* Garbage on rank 0's end of the connection rank 1 dialed (rank 0's
 * listener took it: its local port is the listener's): rank 1 reads it
 * where it watches for rank 0's hang-up, and its sends to rank 0 fail
 * saying what was wrong. */
static void test_malformed_on_wire(void **state) {
  (void)state;
  brg_comm *c[2];
  pair("tcp", c);
  int port = (int)c[0]->peers[0].p2p_port, fd = -1, found = 0;
  for (int f = 3; f < 4096; f++) {
    struct sockaddr_storage me, them;
    socklen_t ml = sizeof me, tl = sizeof them;
    if (getsockname(f, (struct sockaddr *)&me, &ml) != 0 || port_of(&me) != port) continue;
    if (getpeername(f, (struct sockaddr *)&them, &tl) != 0) continue; /* the listener */
    fd = f;
    found++;
  }
  assert_int_equal(found, 1);
  assert_int_equal(send(fd, "\x6e\xff\xff", 3, MSG_NOSIGNAL), 3);
  /* Its thread reads it at once; sends that left before that succeed. */
  brg_status s = BRG_SUCCESS;
  int32_t v = 7;
  for (int i = 0; i < 500 && s == BRG_SUCCESS; i++) {
    struct timespec ts = {0, 10 * 1000000L};
    nanosleep(&ts, NULL);
    s = brg_send(&v, 1, BRG_INT32, 0, c[1], NULL);
  }
  assert_int_equal(s, BRG_ERR_REMOTE);
  const char *m = brg_comm_last_error(c[1]);
  expect_msg(m, "rank 0 (pid");
  expect_msg(m, "sent a malformed notice on its point-to-point connection: a notice of 65535 "
                "bytes (1 to 300 are allowed)");
  brg_comm_destroy(c[1]);
  brg_comm_destroy(c[0]);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_note_bytes),        cmocka_unit_test(test_note_malformed),
      cmocka_unit_test(test_stop_told_tcp),     cmocka_unit_test(test_stop_told_shm),
      cmocka_unit_test(test_malformed_on_wire),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
