/*
 * base/sock.c: a dial bound to a source address leaves from it (and fails
 * at once, naming why, from an address this host does not have), and the
 * descriptor limit is raised to the hard limit only when it is too low.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "clock.h"
#include "sock.h"

static int listen_local(uint16_t *port) {
  int fd = -1;
  brg__errbuf err;
  assert_int_equal(brg__sock_listen("127.0.0.1", 0, 16, "test", "listener", &fd, port, &err),
                   BRG_SUCCESS);
  return fd;
}

/* Accepts one connection (waiting up to 5 s) and returns its peer's address. */
static void accept_peer(int lfd, char *peer, size_t bytes) {
  assert_int_equal(brg__sock_wait(lfd, POLLIN, brg__now_ms() + 5000), BRG__IO_OK);
  struct sockaddr_in sa;
  socklen_t len = sizeof sa;
  int fd = accept(lfd, (struct sockaddr *)&sa, &len);
  assert_true(fd >= 0);
  assert_non_null(inet_ntop(AF_INET, &sa.sin_addr, peer, (socklen_t)bytes));
  close(fd);
}

static void test_dial_binds_source(void **state) {
  (void)state;
  uint16_t port;
  int lfd = listen_local(&port);
  /* Every 127/8 address is this host's: the accepted peer shows which. */
  const char *srcs[] = {"127.0.0.2", "127.0.0.3", NULL};
  for (int i = 0; i < 3; i++) {
    brg__sock_dialer d = {.retry_ms = 10, .retry_max_ms = 10, .bind_addr = srcs[i]};
    int fd = -1, e = 0;
    assert_int_equal(brg__sock_dial("127.0.0.1", port, brg__now_ms() + 5000, &d, &fd, &e),
                     BRG__IO_OK);
    char peer[64];
    accept_peer(lfd, peer, sizeof peer);
    assert_string_equal(peer, srcs[i] ? srcs[i] : "127.0.0.1");
    close(fd);
  }
  /* An IPv6 source for an IPv4 destination is left to the kernel. */
  brg__sock_dialer d6 = {.retry_ms = 10, .retry_max_ms = 10, .bind_addr = "::1"};
  int fd = -1, e = 0;
  assert_int_equal(brg__sock_dial("127.0.0.1", port, brg__now_ms() + 5000, &d6, &fd, &e),
                   BRG__IO_OK);
  char peer[64];
  accept_peer(lfd, peer, sizeof peer);
  close(fd);
  close(lfd);
}

static void test_dial_bad_source(void **state) {
  (void)state;
  uint16_t port;
  int lfd = listen_local(&port);
  /* TEST-NET-3: no host has it, so bind fails before anything is sent. */
  brg__sock_dialer d = {.retry_ms = 10, .retry_max_ms = 10, .bind_addr = "203.0.113.77"};
  int fd = -1, e = 0;
  int64_t t0 = brg__now_ms();
  assert_int_equal(brg__sock_dial("127.0.0.1", port, t0 + 5000, &d, &fd, &e), BRG__IO_ERR);
  assert_int_equal(e, EADDRNOTAVAIL);
  assert_true(brg__now_ms() - t0 < 1000); /* not retried until the deadline */
  brg__sock_dialer bad = {.retry_ms = 10, .retry_max_ms = 10, .bind_addr = "not-an-address"};
  assert_int_equal(brg__sock_dial("127.0.0.1", port, t0 + 5000, &bad, &fd, &e), BRG__IO_ERR);
  assert_int_equal(e, EINVAL);
  close(lfd);
}

static void test_raise_nofile(void **state) {
  (void)state;
  struct rlimit old, rl;
  assert_int_equal(getrlimit(RLIMIT_NOFILE, &old), 0);
  if (old.rlim_max != RLIM_INFINITY && old.rlim_max < 128) skip();
  rl = old;
  rl.rlim_cur = 64;
  assert_int_equal(setrlimit(RLIMIT_NOFILE, &rl), 0);
  /* Enough already: left alone. */
  assert_int_equal(brg__sock_raise_nofile(32, "test"), 64);
  assert_int_equal(getrlimit(RLIMIT_NOFILE, &rl), 0);
  assert_int_equal(rl.rlim_cur, 64);
  /* Too low: raised to the hard limit. */
  long now = brg__sock_raise_nofile(100, "test");
  assert_int_equal(getrlimit(RLIMIT_NOFILE, &rl), 0);
  assert_int_equal(rl.rlim_cur, old.rlim_max);
  assert_int_equal(now, (long)old.rlim_max);
  assert_int_equal(setrlimit(RLIMIT_NOFILE, &old), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_dial_binds_source),
      cmocka_unit_test(test_dial_bad_source),
      cmocka_unit_test(test_raise_nofile),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
