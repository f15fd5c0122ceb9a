/*
 * Lifetimes through the C API: point-to-point requests outstanding when
 * their communicator is aborted or destroyed (every posted receive and
 * queued send finishes as aborted; brg_wait and brg_test on them afterwards
 * touch nothing of the communicator), and a communicator destroyed twice.
 * Forked ranks (tests/multiproc/harness.c); a rank that reads freed memory
 * dies by a signal, which the harness reports.
 *
 * Also: sends to this rank itself count against BRIGADE_P2P_EARLY_BYTES
 * (selfcap): past the cap they wait for their receives.
 *
 * And: a stopped peer fails a point-to-point wait at
 * BRIGADE_SILENT_TIMEOUT_MS, as it does a collective (stopped).
 *
 * And: a send cut short by its timeout (the receiver's early memory full)
 * is told to the receiver as that, a live sender whose wait timed out,
 * with no word of a death (cutshort).
 *
 * And: a member whose part of brg_comm_split fails leaves the others an
 * error that says brg_comm_split and which ranks of the parent the new
 * communicator's rank numbers are (splitfail).
 *
 * And: a rank killed while the others split communicators off their
 * parent in a loop; each survivor's split (or a call after it) fails within
 * the timeout, with a message that says brg_comm_split (splitkill).
 *
 * And: a member that dies while the new communicator forms (after the
 * members exchanged their addresses over the parent, at its first
 * connection to another member) fails the others at the scale of
 * BRIGADE_SILENT_TIMEOUT_MS, not of BRIGADE_TIMEOUT_MS, with a message
 * that says brg_comm_split and names it by its rank in the parent
 * (splitdies).
 *
 * And: a member that dies while it makes its shm FIFO of the new
 * communicator (the name made, not yet told to its sender) leaves nothing
 * in /dev/shm (splitshm).
 *
 * And: a sender killed in the middle of a message is told to the receiver
 * as dead, not as a send cut short (killmid).
 *
 *   test_lifetimes CASE   CASE: self, abort, peer, twice, selfcap, stopped, cutshort,
 *                               killmid, splitfail, splitkill, splitdies, splitshm
 */
#include <dirent.h>
#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <sys/resource.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "brigade.h"
#include "harness.h"

/* A finished request's status and the message brg_wait leaves. */
static void expect_ended(const char *what, brg_request *rq, brg_status want, const char *needle) {
  int done = 0;
  brg_status s = brg_test(rq, &done);
  MP_CHECK(done == 1, "%s: brg_test says not done (status %s)", what, brg_status_string(s));
  MP_CHECK(s == want, "%s: brg_test gave %s, expected %s", what, brg_status_string(s),
           brg_status_string(want));
  s = brg_wait(rq);
  MP_CHECK(s == want, "%s: brg_wait gave %s, expected %s", what, brg_status_string(s),
           brg_status_string(want));
  const char *m = brg_comm_last_error(NULL);
  MP_CHECK(!needle || mp_contains(m, needle), "%s: message \"%s\" lacks \"%s\"", what, m, needle);
}

/* One rank: receives from itself posted, then the communicator destroyed. */
static int body_self(mp_ctx *x) {
  float buf[4] = {0};
  brg_request rq[3];
  MP_CHECK(brg_irecv(buf, 4, BRG_FLOAT32, 0, x->comm, &rq[0]) == BRG_SUCCESS, "irecv");
  MP_CHECK(brg_irecv(buf, 4, BRG_FLOAT32, 0, x->comm, &rq[1]) == BRG_SUCCESS, "irecv");
  /* Finished before the destroy, with a mismatch: its message survives. */
  double d[2] = {1, 2};
  MP_CHECK(brg_send(d, 2, BRG_FLOAT64, 0, x->comm, NULL) == BRG_SUCCESS, "send to self");
  MP_CHECK(brg_comm_destroy(x->comm) == BRG_SUCCESS, "destroy: %s", brg_comm_last_error(NULL));
  x->comm = NULL;
  expect_ended("receive matched by a mismatched send", &rq[0], BRG_ERR_MISMATCH, "rank 0");
  expect_ended("receive outstanding at destroy", &rq[1], BRG_ERR_ABORTED, "destroyed");
  /* And once more: the request stays finished. */
  expect_ended("second wait", &rq[1], BRG_ERR_ABORTED, "destroyed");
  memset(&rq[2], 0, sizeof rq[2]);
  return mp_failures();
}

/* One rank: brg_comm_abort finishes what is outstanding, at once. */
static int body_abort(mp_ctx *x) {
  float buf[4] = {0};
  brg_request rq;
  brg_request any;
  MP_CHECK(brg_irecv(buf, 4, BRG_FLOAT32, 0, x->comm, &rq) == BRG_SUCCESS, "irecv");
  MP_CHECK(brg_irecv(buf, 4, BRG_FLOAT32, BRG_ANY_SOURCE, x->comm, &any) == BRG_SUCCESS,
           "irecv from any source");
  MP_CHECK(brg_comm_abort(x->comm) == BRG_SUCCESS, "abort");
  int done = 0;
  brg_status s = brg_test(&rq, &done);
  MP_CHECK(done == 1 && s == BRG_ERR_ABORTED, "after abort: brg_test gave done %d, %s", done,
           brg_status_string(s));
  s = brg_wait(&rq);
  MP_CHECK(s == BRG_ERR_ABORTED, "after abort: brg_wait gave %s", brg_status_string(s));
  MP_CHECK(mp_contains(brg_comm_last_error(x->comm), "aborted"), "message: %s",
           brg_comm_last_error(x->comm));
  /* A receive from any source that no message reached: aborted, no sender. */
  s = brg_wait(&any);
  MP_CHECK(s == BRG_ERR_ABORTED && mp_contains(brg_comm_last_error(x->comm), "any rank"),
           "receive from any source after abort: %s: %s", brg_status_string(s),
           brg_comm_last_error(x->comm));
  int src = -7;
  s = brg_request_source(&any, &src);
  MP_CHECK(s == BRG_ERR_INVALID_USAGE && src == -7, "its source: %s, %d", brg_status_string(s),
           src);
  return mp_failures();
}

/* Two ranks: rank 0 queues sends rank 1 never receives (more than its
 * early memory and the socket hold) and a receive rank 1 never sends, then
 * destroys. */
static int body_peer(mp_ctx *x) {
  enum { N = 16 << 20 }; /* 64 MiB: more than a loopback link's socket buffers take */
  if (x->rank == 1) {
    mp_wait_flag(0, 30000); /* rank 0 is done */
    return mp_failures();
  }
  float *big = calloc(N, sizeof *big), in[8];
  brg_request rq[4];
  for (int i = 0; i < 3; i++)
    MP_CHECK(brg_isend(big, N, BRG_FLOAT32, 1, x->comm, &rq[i]) == BRG_SUCCESS, "isend %d: %s", i,
             brg_comm_last_error(x->comm));
  MP_CHECK(brg_irecv(in, 8, BRG_FLOAT32, 1, x->comm, &rq[3]) == BRG_SUCCESS, "irecv");
  int done = 0;
  MP_CHECK(brg_test(&rq[2], &done) == BRG_IN_PROGRESS && !done, "the last send finished");
  MP_CHECK(brg_comm_destroy(x->comm) == BRG_SUCCESS, "destroy: %s", brg_comm_last_error(NULL));
  x->comm = NULL;
  expect_ended("send queued at destroy", &rq[2], BRG_ERR_ABORTED, "rank 1");
  expect_ended("receive posted at destroy", &rq[3], BRG_ERR_ABORTED, "rank 1");
  __atomic_store_n(&x->shared->flags[0], 1, __ATOMIC_SEQ_CST);
  free(big);
  return mp_failures();
}

/* brg_comm_destroy twice, and calls on the destroyed communicator. */
static int body_twice(mp_ctx *x) {
  brg_comm *c = x->comm;
  x->comm = NULL;
  MP_CHECK(brg_comm_destroy(c) == BRG_SUCCESS, "destroy");
  brg_status s = brg_comm_destroy(c);
  MP_CHECK(s == BRG_ERR_INVALID_ARGUMENT, "second destroy gave %s", brg_status_string(s));
  MP_CHECK(mp_contains(brg_comm_last_error(NULL), "destroyed"), "message: %s",
           brg_comm_last_error(NULL));
  float v = 1;
  s = brg_allreduce(&v, &v, 1, BRG_FLOAT32, BRG_SUM, c, NULL);
  MP_CHECK(s == BRG_ERR_INVALID_ARGUMENT, "allreduce on a destroyed comm gave %s",
           brg_status_string(s));
  MP_CHECK(mp_contains(brg_comm_last_error(c), "not a valid communicator"),
           "last error of a destroyed comm: %s", brg_comm_last_error(c));
  return mp_failures();
}

/* One rank, BRIGADE_P2P_EARLY_BYTES=1M: eight isends of 1 MiB to itself;
 * the first lands in early memory, the rest wait for receives, then every
 * message arrives whole and in order. */
static int body_selfcap(mp_ctx *x) {
  enum { K = 8, N = 1 << 18 };
  float *out = malloc((size_t)K * N * sizeof *out), *in = malloc((size_t)N * sizeof *in);
  brg_request rq[K];
  for (int k = 0; k < K; k++) {
    for (int i = 0; i < N; i++) out[(size_t)k * N + i] = (float)(k * 1000 + i % 1000);
    MP_CHECK(brg_isend(out + (size_t)k * N, N, BRG_FLOAT32, 0, x->comm, &rq[k]) == BRG_SUCCESS,
             "isend %d: %s", k, brg_comm_last_error(x->comm));
  }
  int waiting = 0;
  for (int k = 0; k < K; k++) {
    int done = 0;
    brg_test(&rq[k], &done);
    waiting += !done;
  }
  MP_CHECK(waiting == K - 1,
           "%d of %d sends to self wait for their receives, expected %d "
           "(BRIGADE_P2P_EARLY_BYTES=1M holds one)",
           waiting, K, K - 1);
  for (int k = 0; k < K; k++) {
    MP_CHECK(brg_recv(in, N, BRG_FLOAT32, 0, x->comm, NULL) == BRG_SUCCESS, "recv %d: %s", k,
             brg_comm_last_error(x->comm));
    int bad = 0;
    for (int i = 0; i < N; i++) bad += in[i] != (float)(k * 1000 + i % 1000);
    MP_CHECK(bad == 0, "message %d: %d wrong elements", k, bad);
  }
  for (int k = 0; k < K; k++)
    MP_CHECK(brg_wait(&rq[k]) == BRG_SUCCESS, "send %d: %s", k, brg_comm_last_error(x->comm));
  free(out);
  free(in);
  return mp_failures();
}

/* Two ranks, BRIGADE_SILENT_TIMEOUT_MS=1000 and BRIGADE_TIMEOUT_MS=30000:
 * rank 1 is stopped (SIGSTOP) while rank 0 waits for a message from it,
 * then while rank 0 sends it more than its socket holds. Both fail in a
 * few seconds, naming rank 1 as silent. */
static int body_stopped(mp_ctx *x) {
  __atomic_store_n(&x->shared->progress[x->rank], 1, __ATOMIC_RELEASE);
  if (x->rank == 1) {
    for (int i = 0; i < 600; i++) mp_sleep_ms(100); /* stopped meanwhile, then killed */
    return 0;
  }
  float v[4];
  for (int k = 0; k < 2; k++) {
    int64_t t0 = mp_now_ns();
    brg_status s;
    float *big = NULL;
    if (k == 0) {
      s = brg_recv(v, 4, BRG_FLOAT32, 1, x->comm, NULL);
    } else {
      big = calloc(16 << 20, sizeof *big);
      s = brg_send(big, 16 << 20, BRG_FLOAT32, 1, x->comm, NULL);
      free(big);
    }
    double ms = (mp_now_ns() - t0) / 1e6;
    const char *e = brg_comm_last_error(x->comm);
    MP_CHECK(s == BRG_ERR_REMOTE && mp_contains(e, "silent") && mp_names_rank(e, 1) && ms < 10000,
             "%s a stopped rank 1: %s after %.0f ms (silent limit 1000 ms, timeout 30000 ms): %s",
             k ? "send to" : "receive from", brg_status_string(s), ms, e);
    mp_info("%s a stopped rank: %s after %.0f ms: %s", k ? "send to" : "receive from",
            brg_status_string(s), ms, e);
  }
  return mp_failures();
}

/* Two ranks, BRIGADE_P2P_EARLY_BYTES=1M, BRIGADE_TIMEOUT_MS=2000: rank 1
 * sends two messages of 64 MiB while rank 0 posts nothing until the
 * second has timed out on rank 1 part way (the first lands in early memory).
 * Rank 0 then gets the first whole and a failure for the second that says
 * the send was cut short, at once. Rank 1 stays alive throughout. */
static int body_cutshort(mp_ctx *x) {
  /* 64 MiB: more than the socket buffers of a loopback link can take
   * (tcp_rmem's ceiling is 32 MiB here, tcp_wmem's 4 MiB). */
  enum { N = 16 << 20 };
  int32_t *buf = calloc(N, sizeof *buf);
  if (x->rank == 1) {
    for (int i = 0; i < N; i++) buf[i] = i;
    MP_CHECK(brg_send(buf, N, BRG_INT32, 0, x->comm, NULL) == BRG_SUCCESS, "first send: %s",
             brg_comm_last_error(x->comm));
    brg_status s = brg_send(buf, N, BRG_INT32, 0, x->comm, NULL);
    MP_CHECK(s == BRG_ERR_TIMEOUT, "second send: %s, expected a timeout: %s", brg_status_string(s),
             brg_comm_last_error(x->comm));
    __atomic_store_n(&x->shared->flags[1], 1, __ATOMIC_SEQ_CST);
    mp_wait_flag(0, 30000); /* alive until rank 0 is done */
    free(buf);
    return mp_failures();
  }
  /* Nothing posted until rank 1's second send has given up. */
  MP_CHECK(mp_wait_flag(1, 30000), "rank 1's second send never ended");
  MP_CHECK(brg_recv(buf, N, BRG_INT32, 1, x->comm, NULL) == BRG_SUCCESS, "first recv: %s",
           brg_comm_last_error(x->comm));
  int bad = 0;
  for (int i = 0; i < N; i++) bad += buf[i] != i;
  MP_CHECK(bad == 0, "first message: %d wrong elements", bad);
  int64_t t0 = mp_now_ns();
  brg_status s = brg_recv(buf, N, BRG_INT32, 1, x->comm, NULL);
  double ms = (mp_now_ns() - t0) / 1e6;
  const char *e = brg_comm_last_error(x->comm);
  MP_CHECK(s == BRG_ERR_REMOTE && mp_contains(e, "is alive and cut its send") &&
               mp_contains(e, "timed out") && !mp_contains(e, "died") && ms < 1000,
           "second recv: %s after %.0f ms: %s", brg_status_string(s), ms, e);
  mp_info("second recv: %s after %.0f ms: %s", brg_status_string(s), ms, e);
  __atomic_store_n(&x->shared->flags[0], 1, __ATOMIC_SEQ_CST);
  free(buf);
  return mp_failures();
}

/* Whether process pid is gone (exited or a zombie), within timeout_ms. */
static int gone_within(int pid, int timeout_ms) {
  char path[64], st[256];
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  for (int64_t end = mp_now_ns() + (int64_t)timeout_ms * 1000000; mp_now_ns() < end;) {
    FILE *f = fopen(path, "r");
    if (!f) return 1;
    size_t n = fread(st, 1, sizeof st - 1, f);
    fclose(f);
    st[n] = 0;
    const char *p = strrchr(st, ')');
    if (p && p[1] == ' ' && p[2] == 'Z') return 1;
    mp_sleep_ms(10);
  }
  return 0;
}

/* Two ranks, BRIGADE_P2P_EARLY_BYTES=1M: rank 1 sends 64 MiB to rank 0
 * (kept in early memory, rank 0 posts no receive), then isends 64 MiB more
 * (held: the socket fills) and is killed (SIGKILL) part way through. Rank
 * 0 then gets the first whole, and a failure for the second naming rank 1
 * as dead, with no word of a send cut short (the other end of cutshort). */
static int body_killmid(mp_ctx *x) {
  enum { N = 16 << 20 };
  int32_t *buf = calloc(N, sizeof *buf);
  if (x->rank == 1) {
    for (int i = 0; i < N; i++) buf[i] = i;
    MP_CHECK(brg_send(buf, N, BRG_INT32, 0, x->comm, NULL) == BRG_SUCCESS, "first send: %s",
             brg_comm_last_error(x->comm));
    brg_request rq;
    MP_CHECK(brg_isend(buf, N, BRG_INT32, 0, x->comm, &rq) == BRG_SUCCESS, "isend: %s",
             brg_comm_last_error(x->comm));
    __atomic_store_n(&x->shared->progress[1], 1, __ATOMIC_RELEASE);
    for (int i = 0; i < 600; i++) mp_sleep_ms(100); /* killed meanwhile */
    return 0;
  }
  __atomic_store_n(&x->shared->progress[0], 1, __ATOMIC_RELEASE);
  MP_CHECK(gone_within(x->shared->pids[1], 20000), "rank 1 was not killed");
  MP_CHECK(brg_recv(buf, N, BRG_INT32, 1, x->comm, NULL) == BRG_SUCCESS, "first recv: %s",
           brg_comm_last_error(x->comm));
  int bad = 0;
  for (int i = 0; i < N; i++) bad += buf[i] != i;
  MP_CHECK(bad == 0, "first message: %d wrong elements", bad);
  brg_status s = brg_recv(buf, N, BRG_INT32, 1, x->comm, NULL);
  const char *e = brg_comm_last_error(x->comm);
  MP_CHECK(s == BRG_ERR_REMOTE && mp_contains(e, "died") && !mp_contains(e, "cut") &&
               mp_names_rank(e, 1),
           "receive from rank 1, killed mid-message: %s: %s", brg_status_string(s), e);
  mp_info("receive from a rank killed mid-message: %s: %s", brg_status_string(s), e);
  free(buf);
  return mp_failures();
}

/* Three ranks, BRIGADE_TIMEOUT_MS=3000: ranks 1 and 2 form color 0 (its
 * ranks 0 and 1), rank 0 takes no part; rank 2 has no file descriptor
 * left, so its side of the new communicator fails at once and rank 1 waits
 * for it until the timeout (3 s). Both errors begin with brg_comm_split and map
 * the new ranks to the parent's. */
static int body_splitfail(mp_ctx *x) {
  brg_comm *nc = NULL;
  struct rlimit old;
  getrlimit(RLIMIT_NOFILE, &old);
  int held[4096], nheld = 0;
  if (x->rank == 2) {
    /* The descriptors open now, and the holes between them filled, are
     * all it may have. */
    int top = 0;
    for (int fd = 0; fd < 4096; fd++)
      if (fcntl(fd, F_GETFD) != -1) top = fd;
    struct rlimit lim = {.rlim_cur = (rlim_t)top + 1, .rlim_max = old.rlim_max};
    setrlimit(RLIMIT_NOFILE, &lim);
    for (int fd; nheld < 4096 && (fd = dup(0)) >= 0;) held[nheld++] = fd;
  }
  brg_status s = brg_comm_split(x->comm, x->rank == 0 ? BRG_SPLIT_NOCOLOR : 0, x->rank, &nc);
  if (x->rank == 2) {
    while (nheld > 0) close(held[--nheld]);
    setrlimit(RLIMIT_NOFILE, &old);
  }
  const char *e = brg_comm_last_error(NULL);
  if (x->rank == 0) {
    MP_CHECK(s == BRG_SUCCESS && !nc, "rank 0 (no color): %s: %s", brg_status_string(s), e);
  } else {
    MP_CHECK(s != BRG_SUCCESS && !strncmp(e, "brg_comm_split: ", 16) &&
                 mp_contains(e, "are ranks 1, 2 here"),
             "rank %d: %s: the message should begin with brg_comm_split and map the new ranks "
             "to ranks 1, 2: %s",
             x->rank, brg_status_string(s), e);
    mp_info("rank %d: %s: %s", x->rank, brg_status_string(s), e);
  }
  if (nc) brg_comm_destroy(nc);
  return mp_failures();
}

/* Three ranks, BRIGADE_TIMEOUT_MS=3000: splits of the whole communicator
 * in a loop, each new one used for an allreduce and destroyed; rank 2 is
 * killed after the third, at some point of the loop. */
static int body_splitkill(mp_ctx *x) {
  for (int k = 0; k < 1000; k++) {
    __atomic_store_n(&x->shared->progress[x->rank], k + 1, __ATOMIC_RELEASE);
    brg_comm *nc = NULL;
    int64_t t0 = mp_now_ns();
    brg_status s = brg_comm_split(x->comm, 0, x->rank, &nc);
    double ms = (mp_now_ns() - t0) / 1e6;
    if (s != BRG_SUCCESS) {
      const char *e = brg_comm_last_error(NULL);
      MP_CHECK(!strncmp(e, "brg_comm_split: ", 16) && ms < 3000 + 2000,
               "split %d after the kill: %s after %.0f ms (timeout 3000 ms): %s", k,
               brg_status_string(s), ms, e);
      mp_info("split %d: %s after %.0f ms: %s", k, brg_status_string(s), ms, e);
      return mp_failures();
    }
    float v = 1;
    s = brg_allreduce(&v, &v, 1, BRG_FLOAT32, BRG_SUM, nc, NULL);
    brg_comm_destroy(nc);
    if (s != BRG_SUCCESS) {
      mp_info("the allreduce on split %d: %s (rank 2 went meanwhile)", k, brg_status_string(s));
      return mp_failures(); /* the parent is broken for the next split too */
    }
    MP_CHECK(v == 3, "split %d: allreduce gave %g", k, v);
  }
  mp_fail("rank 2 was never killed");
  return mp_failures();
}

/* The victim of splitdies: SIGKILL at its first call of syscall nr
 * (connect(2) there) from now on
 * (seccomp sends SIGSYS, whose handler kills the process), which in a
 * split is the new communicator's first ring connection, made after the
 * members have exchanged their addresses over the parent. */
static void die_at_connect(int sig) {
  (void)sig;
  kill(getpid(), SIGKILL);
}

static int kill_at(long nr) {
#if defined(__x86_64__)
  const unsigned arch = AUDIT_ARCH_X86_64;
#elif defined(__aarch64__)
  const unsigned arch = AUDIT_ARCH_AARCH64;
#else
  return -1;
#endif
  struct sock_filter f[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, arch, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (unsigned)nr, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_TRAP),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  struct sock_fprog prog = {.len = sizeof f / sizeof f[0], .filter = f};
  signal(SIGSYS, die_at_connect);
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return -1;
  return (int)syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &prog);
}

/* Four ranks, BRIGADE_TIMEOUT_MS=30000, BRIGADE_SILENT_TIMEOUT_MS=2000:
 * one split of everyone in reverse order (parent rank r is new rank 3-r);
 * rank 2 dies at its first connection of the new communicator. The others
 * fail well within the timeout, each with a message that begins with
 * brg_comm_split and says that rank 2 of the parent is gone. */
static int body_splitdies(mp_ctx *x) {
  if (x->rank == 2 && kill_at(SYS_connect) != 0) {
    mp_info("no seccomp filter here (%m): rank 2 exits before the split instead");
    kill(getpid(), SIGKILL);
  }
  brg_comm *nc = NULL;
  int64_t t0 = mp_now_ns();
  brg_status s = brg_comm_split(x->comm, 0, x->nranks - 1 - x->rank, &nc);
  double ms = (mp_now_ns() - t0) / 1e6;
  const char *e = brg_comm_last_error(NULL);
  MP_CHECK(s != BRG_SUCCESS && !nc, "the split succeeded without rank 2");
  /* Told by the parent's liveness, or by the parent's failure or abort
   * (in the parent's words, which number its own ranks): rank 2 with the
   * victim's pid either way. */
  char direct[96], told[64];
  snprintf(direct, sizeof direct, "rank 2 of the parent communicator (pid %d ",
           (int)x->shared->pids[2]);
  snprintf(told, sizeof told, "rank 2 (pid %d ", (int)x->shared->pids[2]);
  int named =
      mp_contains(e, direct) || (mp_contains(e, "the parent communicator") && mp_contains(e, told));
  MP_CHECK(!strncmp(e, "brg_comm_split: ", 16) && named,
           "%s: the message should begin with brg_comm_split and say that rank 2 of the "
           "parent is gone: %s",
           brg_status_string(s), e);
  MP_CHECK(ms < 15000, "failed after %.0f ms (BRIGADE_SILENT_TIMEOUT_MS 2000, timeout 30000)", ms);
  mp_info("%s after %.0f ms: %s", brg_status_string(s), ms, e);
  if (nc) brg_comm_destroy(nc);
  return mp_failures();
}

/* The empty shm FIFOs from rank 1 to rank 2 (of any communicator: the
 * split's id is not known here) in /dev/shm, their names in `names` (at
 * most `cap` bytes); how many. Rank 2 died before it sized its FIFO, so
 * the harness, which watches what ranks map, cannot see this one. */
static int empty_fifos(char *names, size_t cap) {
  static const char tail[] = "-2-from-1";
  const size_t tlen = sizeof tail - 1;
  DIR *d = opendir("/dev/shm");
  int n = 0;
  size_t o = 0;
  names[0] = 0;
  for (struct dirent *e; d && (e = readdir(d));) {
    size_t len = strlen(e->d_name);
    if (strncmp(e->d_name, "brigade-", 8) || len < 8 + tlen || strcmp(e->d_name + len - tlen, tail))
      continue;
    char path[300];
    struct stat st;
    snprintf(path, sizeof path, "/dev/shm/%s", e->d_name);
    if (stat(path, &st) != 0 || st.st_size != 0) continue;
    n++;
    if (o + len + 2 < cap) o += (size_t)snprintf(names + o, cap - o, "%s ", e->d_name);
  }
  if (d) closedir(d);
  return n;
}

/* Three ranks (shm): rank 2 dies at its first ftruncate(2) of a split,
 * which sizes its receive FIFO from rank 1: the name exists, and rank 1
 * has not heard it. The survivors fail, and the name is gone: rank 1,
 * giving up on the link, unlinks the name it was never told. */

/* A victim that kills itself at a chosen point (a seccomp filter); the
 * harness expects its SIGKILL and never signals it itself. */
static void self_killed_victim(mp_opts *o, int rank) {
  o->victim = rank;
  o->victim_signal = SIGKILL;
  o->victim_after = 1 << 30;
}

static int body_splitshm(mp_ctx *x) {
  if (x->rank == 2 && kill_at(SYS_ftruncate) != 0) {
    mp_info("no seccomp filter here (%m): rank 2 exits before the split instead");
    kill(getpid(), SIGKILL);
  }
  char before[4096], after[4096];
  int nbefore = x->rank == 1 ? empty_fifos(before, sizeof before) : 0;
  brg_comm *nc = NULL;
  brg_status s = brg_comm_split(x->comm, 0, x->rank, &nc);
  MP_CHECK(s != BRG_SUCCESS && !nc, "the split succeeded without rank 2");
  if (x->rank == 1) {
    int nafter = empty_fifos(after, sizeof after);
    MP_CHECK(nafter <= nbefore,
             "rank 2's FIFO was left in /dev/shm: before the split: [%s]; after: [%s]", before,
             after);
  }
  mp_info("%s: %s", brg_status_string(s), brg_comm_last_error(NULL));
  if (nc) brg_comm_destroy(nc);
  return mp_failures();
}

int main(int argc, char **argv) {
  const char *which = argc > 1 ? argv[1] : "self";
  mp_body_fn body = NULL;
  int n = 1;
  if (!strcmp(which, "self")) body = body_self;
  if (!strcmp(which, "abort")) body = body_abort;
  if (!strcmp(which, "twice")) body = body_twice;
  mp_opts o = {.name = NULL, .nranks = 1, .deadline_ms = 60000, .victim = -1};
  if (!strcmp(which, "stopped")) {
    body = body_stopped, n = 2;
    setenv("BRIGADE_SILENT_TIMEOUT_MS", "1000", 1);
    setenv("BRIGADE_TIMEOUT_MS", "30000", 1);
    o.victim = 1;
    o.victim_signal = SIGSTOP;
    o.victim_after = 1;
    o.victim_delay_ms = 200;
  }
  if (!strcmp(which, "cutshort")) {
    body = body_cutshort, n = 2;
    setenv("BRIGADE_P2P_EARLY_BYTES", "1M", 1);
    setenv("BRIGADE_TIMEOUT_MS", "2000", 1);
  }
  if (!strcmp(which, "killmid")) {
    body = body_killmid, n = 2;
    setenv("BRIGADE_P2P_EARLY_BYTES", "1M", 1);
    o.victim = 1;
    o.victim_signal = SIGKILL;
    o.victim_after = 1;
    o.victim_delay_ms = 200;
  }
  if (!strcmp(which, "splitkill")) {
    body = body_splitkill, n = 3;
    setenv("BRIGADE_TIMEOUT_MS", "3000", 1);
    o.victim = 2;
    o.victim_signal = SIGKILL;
    o.victim_after = 3;
    o.victim_delay_ms = 5;
  }
  if (!strcmp(which, "splitdies")) {
    body = body_splitdies, n = 4;
    setenv("BRIGADE_TIMEOUT_MS", "30000", 1);
    setenv("BRIGADE_SILENT_TIMEOUT_MS", "2000", 1);
    self_killed_victim(&o, 2);
  }
  if (!strcmp(which, "splitshm")) {
    body = body_splitshm, n = 3;
    setenv("BRIGADE_TRANSPORTS", "shm", 1);
    setenv("BRIGADE_TIMEOUT_MS", "30000", 1);
    self_killed_victim(&o, 2);
  }
  if (!strcmp(which, "splitfail")) {
    body = body_splitfail, n = 3;
    setenv("BRIGADE_TIMEOUT_MS", "3000", 1);
  }
  if (!strcmp(which, "selfcap")) {
    body = body_selfcap;
    setenv("BRIGADE_P2P_EARLY_BYTES", "1M", 1);
  }
  if (!strcmp(which, "peer")) {
    body = body_peer, n = 2;
    /* Rank 1 keeps the first message and holds the second: the third
     * cannot leave, whatever the timing. */
    setenv("BRIGADE_P2P_EARLY_BYTES", "1M", 1);
  }
  if (!body) {
    fprintf(stderr, "unknown case %s\n", which);
    return 2;
  }
  char name[64];
  snprintf(name, sizeof name, "lifetimes-%s", which);
  o.name = name;
  o.nranks = n;
  return mp_run(&o, body, NULL);
}
