/*
 * Transport conformance: every transport in brg__transports[] that says it is
 * available must carry slices between two processes exactly as the ring
 * engine expects, and a dead peer must end a wait instead of hanging it.
 *
 * The receiver is the parent and the sender a forked child (or the other way
 * round), and the connection info travels over a socketpair made before the
 * fork, the way the runtime carries it over its bootstrap sockets:
 *
 *   receiver: recv_setup -> info ----------> sender: send_connect
 *             recv_connect <--- "attached" --/
 *
 * Both ends then drive the FIFO with brg__wait_ge / brg__publish like the
 * engine does (and the sender calls send_now where the transport has it),
 * and the receiver checks every byte and every meta field.
 *
 * Usage: test_conformance [transport-name]   (default: every available one)
 * Exit 0 pass, 1 fail, 77 when no transport can run here.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "settings.h"
#include "transport.h"

#define SETUP_TIMEOUT_MS 10000
#define PHASE_TIMEOUT_MS 60000
#define DEATH_DETECT_MS 5000 /* a killed peer must be noticed within this */
#define NSLICES 10000

typedef struct test_link {
  const brg__transport_ops *ops;
  brg__peer_info info[2]; /* rank 0 sends, rank 1 receives */
  uint8_t secret[BRG__SECRET_BYTES];
  uint64_t comm_id;
  int nslots;
  size_t slot_bytes;
  int stream; /* set up as a byte stream (brg__conn_params.stream) */
} test_link;

/* ---- failing loudly ---------------------------------------------------- */

static char where[160];
static pid_t child_pid = -1;
static int stderr_saved = -1; /* stderr while the log is being captured */

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (stderr_saved >= 0) {
    fflush(stderr);
    dup2(stderr_saved, 2);
  }
  fprintf(stderr, "FAIL [%s] (pid %d): ", where, (int)getpid());
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  if (child_pid > 0) kill(child_pid, SIGKILL);
  exit(1);
}

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- bounded waits ------------------------------------------------------ */

/* What a test wait stops on: the link marked closed, or its deadline. */
typedef struct test_wait {
  brg__fifo *fifo;
  int64_t deadline;
  void (*tick)(void); /* called while sleeping, for the killer */
} test_wait;

static brg_status test_check(void *arg) {
  test_wait *tw = arg;
  if (tw->tick) tw->tick();
  if (tw->fifo && tw->fifo->ctrl) {
    uint32_t closed = __atomic_load_n(&tw->fifo->ctrl->closed, __ATOMIC_ACQUIRE);
    if (closed) return (brg_status)closed;
  }
  return now_ms() > tw->deadline ? BRG_ERR_TIMEOUT : BRG_SUCCESS;
}

static test_wait setup_wait;
static const brg__waiter setup_waiter = {.spin = 100, .check = test_check, .arg = &setup_wait};

static brg__conn_params params(const test_link *l, int rank) {
  setup_wait.deadline = now_ms() + SETUP_TIMEOUT_MS;
  brg__conn_params p = {
      .rank = rank,
      .peer = 1 - rank,
      .nranks = 2,
      .self_info = &l->info[rank],
      .peer_info = &l->info[1 - rank],
      .nslots = l->nslots,
      .slot_bytes = l->slot_bytes,
      .comm_id = l->comm_id,
      .secret = l->secret,
      .timeout_ms = SETUP_TIMEOUT_MS,
      .waiter = &setup_waiter,
      .stream = l->stream,
  };
  return p;
}

/* ---- the bootstrap stand-in: one socketpair ------------------------------ */

static void sock_write(int fd, const void *buf, size_t len) {
  const char *p = buf;
  while (len > 0) {
    ssize_t n = write(fd, p, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("socketpair write: %s", n < 0 ? strerror(errno) : "closed");
    p += n;
    len -= (size_t)n;
  }
}

/* Reads exactly len bytes within timeout_ms; returns 0, or -1 on EOF/timeout. */
static int sock_read(int fd, void *buf, size_t len, int timeout_ms) {
  char *p = buf;
  int64_t deadline = now_ms() + timeout_ms;
  while (len > 0) {
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    int64_t left = deadline - now_ms();
    if (left <= 0) return -1;
    int r = poll(&pfd, 1, (int)left);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    ssize_t n = read(fd, p, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return -1;
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

static void sock_expect(int fd, char want, const char *what) {
  char c = 0;
  if (sock_read(fd, &c, 1, PHASE_TIMEOUT_MS) != 0) fail("no '%s' from the peer process", what);
  if (c != want) fail("expected '%c' (%s) from the peer process, got '%c'", want, what, c);
}

/* ---- recognizable slices ------------------------------------------------- */

static uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}

/* Sizes cover the edges (empty, one byte, full, full-1) and random ones. */
static uint32_t slice_bytes(uint64_t i, size_t slot_bytes) {
  switch (i % 7) {
  case 0: return 0;
  case 1: return 1;
  case 2: return (uint32_t)slot_bytes;
  case 3: return (uint32_t)slot_bytes - 1;
  default: return (uint32_t)(mix(i) % (slot_bytes + 1));
  }
}

static void slice_fill(char *buf, uint64_t i, size_t n) {
  uint64_t s = mix(i + 0x5eed);
  size_t j = 0;
  for (; j + 8 <= n; j += 8) {
    uint64_t v = s + j * 0x9e3779b97f4a7c15ull;
    memcpy(buf + j, &v, 8);
  }
  for (; j < n; j++) buf[j] = (char)(s >> (8 * (j % 8)));
}

static void meta_fill(brg__slot_meta *m, uint64_t i, uint32_t bytes) {
  memset(m, 0, sizeof *m);
  m->seq = i + 1;
  m->count = mix(i) >> 1;
  m->kind = (uint32_t)(i % 6) + 1;
  m->bytes = bytes;
  m->dtype = (uint16_t)(i % BRG_NUM_DTYPES);
  m->op = (uint16_t)(i % BRG_NUM_OPS);
  m->root = (int32_t)(i % 5) - 1;
  m->step = (uint32_t)(i * 3);
}

static char *expect_buf;

static void slice_check(const brg__fifo *f, uint64_t i) {
  const brg__slot_meta *m = brg__fifo_meta(f, i);
  brg__slot_meta want;
  meta_fill(&want, i, slice_bytes(i, f->slot_bytes));
  if (m->seq != want.seq || m->count != want.count || m->kind != want.kind ||
      m->bytes != want.bytes || m->dtype != want.dtype || m->op != want.op ||
      m->root != want.root || m->step != want.step)
    fail("slice %llu: meta is seq %llu count %llu kind %u bytes %u dtype %u op %u root %d "
         "step %u, expected seq %llu count %llu kind %u bytes %u dtype %u op %u root %d step %u",
         (unsigned long long)i, (unsigned long long)m->seq, (unsigned long long)m->count, m->kind,
         m->bytes, m->dtype, m->op, m->root, m->step, (unsigned long long)want.seq,
         (unsigned long long)want.count, want.kind, want.bytes, want.dtype, want.op, want.root,
         want.step);
  const char *got = brg__fifo_slot(f, i);
  slice_fill(expect_buf, i, want.bytes);
  if (memcmp(got, expect_buf, want.bytes) != 0) {
    size_t k = 0;
    while (got[k] == expect_buf[k]) k++;
    fail("slice %llu (%u bytes): byte %zu is 0x%02x, expected 0x%02x", (unsigned long long)i,
         want.bytes, k, (unsigned char)got[k], (unsigned char)expect_buf[k]);
  }
}

/* ---- the engine's two loops ---------------------------------------------- */

/* Sends slices [from, to) as the engine would. Returns the wait status that
 * stopped it early, or BRG_SUCCESS. `next` (may be NULL) gets the first slice
 * not sent. */
static brg_status produce(brg__conn *c, uint64_t from, uint64_t to, test_wait *tw, uint64_t *next) {
  brg__fifo *f = &c->fifo;
  const brg__waiter w = {.spin = 100, .check = test_check, .arg = tw};
  brg_status s = BRG_SUCCESS;
  uint64_t i = from;
  for (; i < to; i++) {
    uint64_t need = i + 1 > (uint64_t)f->nslots ? i + 1 - (uint64_t)f->nslots : 0;
    s = brg__wait_ge(&f->ctrl->head, &f->ctrl->head_waiters, need, &w);
    if (s != BRG_SUCCESS) break;
    uint32_t bytes = slice_bytes(i, f->slot_bytes);
    slice_fill(brg__fifo_slot(f, i), i, bytes);
    meta_fill(brg__fifo_meta(f, i), i, bytes);
    brg__publish(&f->ctrl->tail, &f->ctrl->tail_waiters, i + 1);
    /* A transport without a send proxy sends on the engine's thread. */
    if (c->ops->send_now && (s = c->ops->send_now(c, i, NULL, &w)) != BRG_SUCCESS) break;
    if (tw->tick && i % 64 == 0) tw->tick();
  }
  if (next) *next = i;
  return s;
}

/* Receives and checks slices [from, to); same contract as produce. */
static brg_status consume(brg__conn *c, uint64_t from, uint64_t to, test_wait *tw, uint64_t *next) {
  brg__fifo *f = &c->fifo;
  const brg__waiter w = {.spin = 100, .check = test_check, .arg = tw};
  brg_status s = BRG_SUCCESS;
  uint64_t i = from;
  for (; i < to; i++) {
    s = brg__wait_ge(&f->ctrl->tail, &f->ctrl->tail_waiters, i + 1, &w);
    if (s != BRG_SUCCESS) break;
    slice_check(f, i);
    brg__publish(&f->ctrl->head, &f->ctrl->head_waiters, i + 1);
  }
  if (next) *next = i;
  return s;
}

/* ---- resources: what close() must give back ------------------------------ */

static int count_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  if (!d) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d))) n += e->d_name[0] != '.';
  closedir(d);
  return n - 1; /* the directory's own fd */
}

static int count_threads(void) {
  FILE *f = fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  int n = -1;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "Threads: %d", &n) == 1) break;
  fclose(f);
  return n;
}

/* Lines of /proc/self/maps that mention this link's shared-memory names. */
static int count_link_maps(const test_link *l) {
  char key[64];
  snprintf(key, sizeof key, "brigade-%016llx", (unsigned long long)l->comm_id);
  FILE *f = fopen("/proc/self/maps", "r");
  if (!f) return -1;
  char line[1024];
  int n = 0;
  while (fgets(line, sizeof line, f)) n += strstr(line, key) != NULL;
  fclose(f);
  return n;
}

static int count_link_names(const test_link *l) {
  char key[64];
  snprintf(key, sizeof key, "brigade-%016llx", (unsigned long long)l->comm_id);
  DIR *d = opendir("/dev/shm");
  if (!d) return 0;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d))) n += strstr(e->d_name, key) != NULL;
  closedir(d);
  return n;
}

typedef struct resources {
  int fds, threads;
} resources;

static resources resources_now(void) {
  return (resources){count_fds(), count_threads()};
}

static void resources_check(const test_link *l, resources before, const char *when) {
  /* Threads end a moment after join returns in /proc accounting; allow a beat. */
  resources after = resources_now();
  for (int tries = 0; tries < 100 && after.threads > before.threads; tries++) {
    usleep(10000);
    after = resources_now();
  }
  if (after.fds != before.fds)
    fail("%s: %d file descriptors open, %d before setup", when, after.fds, before.fds);
  if (after.threads != before.threads)
    fail("%s: %d threads, %d before setup", when, after.threads, before.threads);
  if (count_link_maps(l) != 0) fail("%s: the link's shared memory is still mapped", when);
}

/* ---- setting up both ends ------------------------------------------------ */

static void receiver_setup(const test_link *l, brg__conn *c, int sock) {
  memset(c, 0, sizeof *c);
  c->ops = l->ops;
  brg__conn_params p = params(l, 1);
  brg__errbuf err = {0};
  char info[BRG__CONN_INFO_BYTES];
  brg_status s = l->ops->recv_setup(c, &p, info, &err);
  if (s != BRG_SUCCESS) fail("recv_setup: %s: %s", brg_status_string(s), err.msg);
  sock_write(sock, info, sizeof info);
  sock_expect(sock, 'A', "attached");
  p = params(l, 1);
  s = l->ops->recv_connect(c, &p, &err);
  if (s != BRG_SUCCESS) fail("recv_connect: %s: %s", brg_status_string(s), err.msg);
}

static void sender_connect(const test_link *l, brg__conn *c, const void *info,
                           const uint8_t *secret, int rank) {
  memset(c, 0, sizeof *c);
  c->ops = l->ops;
  brg__conn_params p = params(l, 0);
  p.rank = rank;
  p.secret = secret;
  brg__errbuf err = {0};
  brg_status s = l->ops->send_connect(c, &p, info, &err);
  if (s != BRG_SUCCESS) fail("send_connect: %s: %s", brg_status_string(s), err.msg);
}

static void sender_setup(const test_link *l, brg__conn *c, int sock) {
  char info[BRG__CONN_INFO_BYTES];
  if (sock_read(sock, info, sizeof info, PHASE_TIMEOUT_MS) != 0)
    fail("no connection info from the receiver");
  sender_connect(l, c, info, l->secret, 0);
  sock_write(sock, "A", 1);
}

static pid_t fork_child(int sv[2], int *mine) {
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
    fail("socketpair: %s", strerror(errno));
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) fail("fork: %s", strerror(errno));
  if (pid == 0) {
    child_pid = -1;
    close(sv[0]);
    *mine = sv[1];
  } else {
    child_pid = pid;
    close(sv[1]);
    *mine = sv[0];
  }
  return pid;
}

/* Waits for the child to exit within timeout_ms; fails unless it exited 0
 * (or, with `killed`, died of SIGKILL). */
static void child_reap(int timeout_ms, int killed) {
  int64_t deadline = now_ms() + timeout_ms;
  int st;
  for (;;) {
    pid_t r = waitpid(child_pid, &st, WNOHANG);
    if (r == child_pid) break;
    if (r < 0) fail("waitpid: %s", strerror(errno));
    if (now_ms() > deadline) fail("the peer process did not finish within %d ms", timeout_ms);
    usleep(2000);
  }
  child_pid = -1;
  if (killed && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) return;
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
    fail("the peer process failed (%s %d)", WIFEXITED(st) ? "exit status" : "signal",
         WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
}

/* Memory transports share one FIFO and cannot see a peer die; the runtime
 * learns that from its bootstrap sockets. Network transports must. */
static int sees_peer_death(const brg__transport_ops *ops) {
  return strcmp(ops->name, "shm") != 0 && strcmp(ops->name, "cuda_ipc") != 0;
}

/* ---- the cases ------------------------------------------------------------ */

/* n slices, every byte checked. Normally the sender keeps its end open until
 * the receiver has checked everything; with `sender_closes_first` it closes
 * right after publishing the last slice, and the receiver must still get
 * every slice (close flushes what was published) and then, on a network
 * transport, see the link closed instead of waiting forever. */
static void case_stream(const test_link *l, uint64_t n, int sender_closes_first) {
  int sv[2], sock;
  resources before = resources_now();
  if (fork_child(sv, &sock) == 0) {
    brg__conn c;
    sender_setup(l, &c, sock);
    test_wait tw = {.fifo = &c.fifo, .deadline = now_ms() + PHASE_TIMEOUT_MS};
    brg_status s = produce(&c, 0, n, &tw, NULL);
    if (s != BRG_SUCCESS) fail("sender: wait for a free slot: %s", brg_status_string(s));
    if (!sender_closes_first) {
      /* Everything handed over (network: to the wire; memory: consumed). */
      const brg__waiter w = {.spin = 100, .check = test_check, .arg = &tw};
      s = brg__wait_ge(&c.fifo.ctrl->head, &c.fifo.ctrl->head_waiters, n, &w);
      if (s != BRG_SUCCESS)
        fail("sender: wait for the last slot to drain: %s", brg_status_string(s));
      sock_expect(sock, 'D', "done");
    }
    c.ops->close(&c);
    if (c.priv) fail("close() left conn.priv set");
    sock_write(sock, "C", 1);
    _exit(0);
  }
  brg__conn c;
  receiver_setup(l, &c, sock);
  test_wait tw = {.fifo = &c.fifo, .deadline = now_ms() + PHASE_TIMEOUT_MS};
  uint64_t got;
  brg_status s = consume(&c, 0, n, &tw, &got);
  if (s != BRG_SUCCESS)
    fail("receiver: wait for slice %llu of %llu: %s", (unsigned long long)got,
         (unsigned long long)n, brg_status_string(s));
  if (sender_closes_first) {
    sock_expect(sock, 'C', "closed");
    if (sees_peer_death(l->ops)) {
      tw.deadline = now_ms() + DEATH_DETECT_MS;
      s = consume(&c, n, n + 1, &tw, NULL);
      if (s != BRG_ERR_REMOTE)
        fail("receiver: waiting past the end of a closed link ended with %s, expected %s",
             brg_status_string(s), brg_status_string(BRG_ERR_REMOTE));
    }
  } else {
    sock_write(sock, "D", 1);
  }
  c.ops->close(&c);
  if (c.priv) fail("close() left conn.priv set");
  if (!sender_closes_first) sock_expect(sock, 'C', "closed");
  child_reap(PHASE_TIMEOUT_MS, 0);
  close(sock);
  resources_check(l, before, "after close");
  if (count_link_names(l) != 0) fail("a shared-memory name of the link is left in /dev/shm");
}

/* The sender is killed mid-stream: the receiver's wait must end. */
static void case_sender_dies(const test_link *l) {
  int sv[2], sock;
  resources before = resources_now();
  if (fork_child(sv, &sock) == 0) {
    brg__conn c;
    sender_setup(l, &c, sock);
    test_wait tw = {.fifo = &c.fifo, .deadline = now_ms() + PHASE_TIMEOUT_MS};
    produce(&c, 0, UINT64_MAX, &tw, NULL);
    fail("sender: was meant to be killed, but is still alive");
  }
  brg__conn c;
  receiver_setup(l, &c, sock);
  test_wait tw = {.fifo = &c.fifo, .deadline = now_ms() + PHASE_TIMEOUT_MS};
  uint64_t got;
  brg_status s = consume(&c, 0, 300, &tw, &got);
  if (s != BRG_SUCCESS)
    fail("receiver: before the kill, slice %llu: %s", (unsigned long long)got,
         brg_status_string(s));
  kill(child_pid, SIGKILL);
  child_reap(PHASE_TIMEOUT_MS, 1);
  int64_t t0 = now_ms();
  int expect_closed = sees_peer_death(l->ops);
  tw.deadline = t0 + (expect_closed ? DEATH_DETECT_MS : 300);
  s = consume(&c, got, UINT64_MAX, &tw, &got);
  int64_t took = now_ms() - t0;
  uint32_t closed = c.fifo.ctrl->closed;
  if (expect_closed) {
    if (s == BRG_ERR_TIMEOUT || !closed)
      fail("receiver: the dead sender went unnoticed for %lld ms (wait: %s, closed %u)",
           (long long)took, brg_status_string(s), closed);
    if (closed != BRG_ERR_REMOTE)
      fail("receiver: closed is %u (%s), expected BRG_ERR_REMOTE", closed,
           brg_status_string((brg_status)closed));
    printf("  sender killed: receiver saw %s after %lld ms (%llu slices checked)\n",
           brg_status_string((brg_status)closed), (long long)took, (unsigned long long)got);
  } else {
    if (s != BRG_ERR_TIMEOUT) fail("receiver: wait ended with %s", brg_status_string(s));
    printf("  sender killed: the FIFO cannot tell (as expected); checking cleanup\n");
  }
  c.ops->close(&c);
  close(sock);
  resources_check(l, before, "after close with a dead peer");
  if (count_link_names(l) != 0) fail("a shared-memory name of the link is left in /dev/shm");
}

static int killer_sock = -1;
static void kill_on_signal(void) {
  struct pollfd pfd = {.fd = killer_sock, .events = POLLIN};
  if (child_pid > 0 && poll(&pfd, 1, 0) == 1) {
    char b;
    if (read(killer_sock, &b, 1) == 1 && b == 'R') {
      kill(child_pid, SIGKILL);
      child_reap(PHASE_TIMEOUT_MS, 1);
    }
  }
}

/* The receiver is killed: the sender's wait for a free slot must end. */
static void case_receiver_dies(const test_link *l) {
  int sv[2], sock;
  resources before = resources_now();
  if (fork_child(sv, &sock) == 0) {
    brg__conn c;
    receiver_setup(l, &c, sock);
    test_wait tw = {.fifo = &c.fifo, .deadline = now_ms() + PHASE_TIMEOUT_MS};
    uint64_t got;
    brg_status s = consume(&c, 0, 300, &tw, &got);
    if (s != BRG_SUCCESS)
      fail("receiver: slice %llu: %s", (unsigned long long)got, brg_status_string(s));
    sock_write(sock, "R", 1);
    pause();
    _exit(1);
  }
  brg__conn c;
  sender_setup(l, &c, sock);
  killer_sock = sock;
  test_wait tw = {.fifo = &c.fifo, .deadline = now_ms() + PHASE_TIMEOUT_MS, .tick = kill_on_signal};
  uint64_t sent;
  brg_status s = produce(&c, 0, UINT64_MAX, &tw, &sent);
  if (child_pid > 0)
    fail("sender: stopped (%s) before the receiver was killed", brg_status_string(s));
  uint32_t closed = c.fifo.ctrl->closed;
  if (s == BRG_ERR_TIMEOUT || closed != BRG_ERR_REMOTE)
    fail("sender: the dead receiver went unnoticed (wait: %s, closed %u)", brg_status_string(s),
         closed);
  printf("  receiver killed: sender saw %s after %llu slices\n",
         brg_status_string((brg_status)closed), (unsigned long long)sent);
  c.ops->close(&c);
  close(sock);
  resources_check(l, before, "after close with a dead peer");
}

/* Connections with a wrong secret or from the wrong rank are refused, and the
 * right sender still gets through after them. */
static void case_tcp_auth(const test_link *l) {
  int sv[2], sock;
  resources before = resources_now();
  const uint64_t n = 200;
  if (fork_child(sv, &sock) == 0) {
    char info[BRG__CONN_INFO_BYTES];
    if (sock_read(sock, info, sizeof info, PHASE_TIMEOUT_MS) != 0)
      fail("no connection info from the receiver");
    uint8_t wrong[BRG__SECRET_BYTES];
    memcpy(wrong, l->secret, sizeof wrong);
    wrong[7] ^= 0x40;
    brg__conn bad_secret, bad_rank, good;
    sender_connect(l, &bad_secret, info, wrong, 0);
    sender_connect(l, &bad_rank, info, l->secret, 5);
    sender_connect(l, &good, info, l->secret, 0);
    sock_write(sock, "A", 1);
    test_wait tw = {.fifo = &good.fifo, .deadline = now_ms() + PHASE_TIMEOUT_MS};
    brg_status s = produce(&good, 0, n, &tw, NULL);
    if (s != BRG_SUCCESS) fail("sender: %s", brg_status_string(s));
    sock_expect(sock, 'D', "done");
    good.ops->close(&good);
    bad_rank.ops->close(&bad_rank);
    bad_secret.ops->close(&bad_secret);
    _exit(0);
  }
  /* Catch the receiver's log to see that it says why it refused. */
  int capture =
      brg__log_level >= BRG__LOG_WARN && !brg__settings_find("BRIGADE_DEBUG_FILE")->value[0];
  char logpath[] = "/tmp/brigade-conformance-XXXXXX";
  int logfd = -1;
  if (capture) {
    logfd = mkstemp(logpath);
    if (logfd < 0) fail("mkstemp: %s", strerror(errno));
    unlink(logpath);
    fflush(stderr);
    stderr_saved = dup(2);
    dup2(logfd, 2);
  }
  brg__conn c;
  receiver_setup(l, &c, sock);
  if (capture) {
    fflush(stderr);
    dup2(stderr_saved, 2);
    close(stderr_saved);
    stderr_saved = -1;
    char text[4096] = {0};
    ssize_t len = pread(logfd, text, sizeof text - 1, 0);
    close(logfd);
    if (len < 0) len = 0;
    text[len] = 0;
    fputs(text, stderr);
    if (!strstr(text, "refused connection from") || !strstr(text, "bad secret"))
      fail("the receiver did not log \"refused connection from ADDR: bad secret\"");
    if (!strstr(text, "expected rank 0"))
      fail("the receiver did not log the refusal of the connection from the wrong rank");
  }
  test_wait tw = {.fifo = &c.fifo, .deadline = now_ms() + PHASE_TIMEOUT_MS};
  uint64_t got;
  brg_status s = consume(&c, 0, n, &tw, &got);
  if (s != BRG_SUCCESS)
    fail("receiver: slice %llu from the right sender: %s", (unsigned long long)got,
         brg_status_string(s));
  sock_write(sock, "D", 1);
  c.ops->close(&c);
  child_reap(PHASE_TIMEOUT_MS, 0);
  close(sock);
  resources_check(l, before, "after close");
  printf("  wrong secret and wrong rank refused; the right sender got through\n");
}

/* close() after a setup that went nowhere, and setup steps that fail in
 * bounded time when the other end is missing. */
static void case_half_setup(const test_link *l) {
  resources before = resources_now();
  brg__errbuf err = {0};
  char info[BRG__CONN_INFO_BYTES];
  brg__conn rc = {.ops = l->ops}, sc = {.ops = l->ops};

  brg__conn_params p = params(l, 1);
  brg_status s = l->ops->recv_setup(&rc, &p, info, &err);
  if (s != BRG_SUCCESS) fail("recv_setup: %s: %s", brg_status_string(s), err.msg);
  l->ops->close(&rc);
  resources_check(l, before, "close after recv_setup alone");

  /* A receiver that went away: send_connect must give up, not hang. */
  s = l->ops->recv_setup(&rc, &p, info, &err);
  if (s != BRG_SUCCESS) fail("recv_setup: %s: %s", brg_status_string(s), err.msg);
  l->ops->close(&rc);
  p = params(l, 0);
  p.timeout_ms = 300;
  int64_t t0 = now_ms();
  s = l->ops->send_connect(&sc, &p, info, &err);
  int64_t took = now_ms() - t0;
  if (s == BRG_SUCCESS && sees_peer_death(l->ops))
    fail("send_connect to a receiver that closed its end succeeded");
  if (took > 3000) fail("send_connect to a closed receiver took %lld ms", (long long)took);
  l->ops->close(&sc);
  resources_check(l, before, "close after a failed send_connect");

  /* Both ends mapped, and the receiver killed before recv_connect: the
   * sender's attach leaves no name behind for a dead receiver to own. */
  p = params(l, 1);
  s = l->ops->recv_setup(&rc, &p, info, &err);
  if (s != BRG_SUCCESS) fail("recv_setup: %s: %s", brg_status_string(s), err.msg);
  sender_connect(l, &sc, info, l->secret, 0);
  if (count_link_names(l) != 0)
    fail("both ends mapped the FIFO, and %d name(s) of it remain in /dev/shm: a receiver killed "
         "now would leave them behind",
         count_link_names(l));
  l->ops->close(&sc);
  l->ops->close(&rc);
  resources_check(l, before, "close after setup and attach without recv_connect");

  if (sees_peer_death(l->ops)) {
    /* Nobody connects: recv_connect times out. */
    p = params(l, 1);
    s = l->ops->recv_setup(&rc, &p, info, &err);
    if (s != BRG_SUCCESS) fail("recv_setup: %s: %s", brg_status_string(s), err.msg);
    p.timeout_ms = 300;
    t0 = now_ms();
    s = l->ops->recv_connect(&rc, &p, &err);
    took = now_ms() - t0;
    if (s != BRG_ERR_TIMEOUT)
      fail("recv_connect with no sender returned %s, expected %s", brg_status_string(s),
           brg_status_string(BRG_ERR_TIMEOUT));
    if (took > 3000) fail("recv_connect with a 300 ms timeout took %lld ms", (long long)took);
    l->ops->close(&rc);
    resources_check(l, before, "close after a failed recv_connect");
  }
  printf("  close() after half a setup leaves nothing behind; missing peers fail in time\n");
}

/* Receive windows (transports with recv_window). Withdrawn while the link
 * is idle: nothing breaks, and the next slot lands in the FIFO. Withdrawn
 * while a payload is landing in the window (the sender stopped with SIGSTOP
 * part way through it): the link is marked broken, the withdrawal returns,
 * and the window is never written again, even once the sender goes on. */
#define WINDOW_BYTES (32u << 20)

static void window_sender(const test_link *l, int sock, char fill) {
  brg__conn c;
  sender_setup(l, &c, sock);
  sock_expect(sock, 'G', "go");
  brg__fifo *f = &c.fifo;
  memset(brg__fifo_slot(f, 0), fill, WINDOW_BYTES);
  meta_fill(brg__fifo_meta(f, 0), 0, WINDOW_BYTES);
  brg__publish(&f->ctrl->tail, &f->ctrl->tail_waiters, 1);
  test_wait tw = {.fifo = f, .deadline = now_ms() + PHASE_TIMEOUT_MS};
  const brg__waiter w = {.spin = 100, .check = test_check, .arg = &tw};
  if (c.ops->send_now) c.ops->send_now(&c, 0, NULL, &w);
  /* the receiver ends this process */
  sock_expect(sock, 'E', "end");
  c.ops->close(&c);
  _exit(0);
}

static void case_window_idle(const test_link *l) {
  int sv[2], sock;
  if (fork_child(sv, &sock) == 0) window_sender(l, sock, 0x5a);
  brg__conn c;
  receiver_setup(l, &c, sock);
  char *win = calloc(1, WINDOW_BYTES);
  if (!win) fail("out of memory");
  l->ops->recv_window(&c, 0, win, WINDOW_BYTES);
  l->ops->recv_window(&c, 0, NULL, 0);
  if (c.fifo.ctrl->closed) fail("withdrawing windows from an idle link broke it");
  sock_write(sock, "G", 1);
  test_wait tw = {.fifo = &c.fifo, .deadline = now_ms() + PHASE_TIMEOUT_MS};
  const brg__waiter w = {.spin = 100, .check = test_check, .arg = &tw};
  brg_status s = brg__wait_ge(&c.fifo.ctrl->tail, &c.fifo.ctrl->tail_waiters, 1, &w);
  if (s != BRG_SUCCESS) fail("the slot after the withdrawal: %s", brg_status_string(s));
  if (c.landed && c.landed[0]) fail("the slot landed in a withdrawn window");
  const char *slot = brg__fifo_slot(&c.fifo, 0);
  for (size_t i = 0; i < WINDOW_BYTES; i++)
    if (slot[i] != 0x5a || win[i] != 0)
      fail("byte %zu: slot 0x%02x (expected 0x5a), window 0x%02x (expected 0)", i,
           (unsigned char)slot[i], (unsigned char)win[i]);
  sock_write(sock, "E", 1);
  child_reap(PHASE_TIMEOUT_MS, 0);
  c.ops->close(&c);
  close(sock);
  free(win);
}

/* SIGSTOP, returning once the child has stopped. */
static void child_stop(void) {
  int st;
  kill(child_pid, SIGSTOP);
  if (waitpid(child_pid, &st, WUNTRACED) != child_pid || !WIFSTOPPED(st))
    fail("the sender did not stop");
}

/* The window, mapped twice: `win` is what the link writes and the test
 * checks once the withdrawal has returned (which orders the proxy's writes
 * before it); `peek` is a second view of the same pages, read while the
 * payload lands only to time the SIGSTOP. That read orders nothing and
 * ThreadSanitizer, which tracks addresses, does not see it as a read of
 * `win`. */
static void window_map(char **win, char **peek) {
  int fd = memfd_create("brg-test-window", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, WINDOW_BYTES) != 0) fail("memfd: %s", strerror(errno));
  *win = mmap(NULL, WINDOW_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  *peek = mmap(NULL, WINDOW_BYTES, PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  if (*win == MAP_FAILED || *peek == MAP_FAILED) fail("mmap: %s", strerror(errno));
}

static void window_unmap(char *win, char *peek) {
  munmap(win, WINDOW_BYTES);
  munmap(peek, WINDOW_BYTES);
}

/* Ends a window case: the sender killed, the link closed, the window freed. */
static void window_end(brg__conn *c, int sock, char *win, char *peek, char *seen) {
  kill(child_pid, SIGKILL);
  child_reap(PHASE_TIMEOUT_MS, 1);
  c->ops->close(c);
  close(sock);
  window_unmap(win, peek);
  free(seen);
}

/* 1 when the sender stopped part way through the window's payload, 0 when
 * the whole slot got through first (try again). */
static int window_mid_slot(const test_link *l, int attempt) {
  int sv[2], sock;
  if (fork_child(sv, &sock) == 0) window_sender(l, sock, 0x5a);
  brg__conn c;
  receiver_setup(l, &c, sock);
  char *win, *peek, *seen = malloc(WINDOW_BYTES);
  if (!seen) fail("out of memory");
  window_map(&win, &peek);
  l->ops->recv_window(&c, 0, win, WINDOW_BYTES);
  sock_write(sock, "G", 1);
  /* Let the sender run in bursts of a tenth of a millisecond until its
   * payload has begun landing in the window. */
  child_stop();
  int64_t deadline = now_ms() + PHASE_TIMEOUT_MS;
  while (!*(volatile char *)peek && !__atomic_load_n(&c.fifo.ctrl->tail, __ATOMIC_ACQUIRE)) {
    if (now_ms() > deadline) fail("the payload never reached the window");
    kill(child_pid, SIGCONT);
    usleep(100);
    child_stop();
    usleep(10000); /* what was on its way lands */
  }
  usleep(100000); /* the receiver now waits mid-slot */
  if (__atomic_load_n(&c.fifo.ctrl->tail, __ATOMIC_ACQUIRE) != 0) {
    printf("  attempt %d: the whole %u-byte slot arrived before the sender stopped\n", attempt,
           WINDOW_BYTES);
    window_end(&c, sock, win, peek, seen);
    return 0;
  }
  int64_t t0 = now_ms();
  l->ops->recv_window(&c, 0, NULL, 0);
  int64_t took = now_ms() - t0;
  uint32_t closed = __atomic_load_n(&c.fifo.ctrl->closed, __ATOMIC_ACQUIRE);
  if (!closed || !strstr(c.fifo.ctrl->closed_why, "withdrawn"))
    fail("withdrawing a window mid-slot left the link %s (%s)", closed ? "broken" : "open",
         c.fifo.ctrl->closed_why);
  if (took > 5000) fail("withdrawing a window mid-slot took %lld ms", (long long)took);
  memcpy(seen, win, WINDOW_BYTES);
  size_t landed = 0;
  while (landed < WINDOW_BYTES && win[landed] == 0x5a) landed++;
  kill(child_pid, SIGCONT);
  usleep(200000); /* the sender goes on: nothing more may reach the window */
  if (memcmp(seen, win, WINDOW_BYTES) != 0)
    fail("the window was written after its withdrawal returned");
  printf("  window withdrawn mid-slot (%zu of %u bytes landed): link broken in %lld ms, "
         "window untouched after\n",
         landed, WINDOW_BYTES, (long long)took);
  window_end(&c, sock, win, peek, seen);
  return 1;
}

static void case_window_mid_slot(const test_link *l) {
  for (int attempt = 1; attempt <= 5; attempt++)
    if (window_mid_slot(l, attempt)) return;
  fail("the sender never stopped part way through a slot");
}

/* ---- the link as a byte stream (try_send, try_recv, ready) ---------------- */

#define BELL 'b' /* a doorbell on the socketpair */
#define STREAM_BYTES (3u << 20)

static unsigned char stream_byte(uint64_t seed, uint64_t i) {
  return (unsigned char)(mix(seed ^ (i / 8)) >> (8 * (i % 8)));
}

/* The peer's 'D' (its stream done), read among the doorbells. */
static int peer_done;

/* Reads the doorbells waiting on sock without blocking (and a 'D' after
 * them); fails on anything else or its end. */
static void bells_drain(int sock) {
  char b[64];
  for (;;) {
    ssize_t n = recv(sock, b, sizeof b, MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n <= 0) fail("the peer process hung up mid-stream");
    for (ssize_t i = 0; i < n; i++) {
      if (b[i] == 'D' && !peer_done && i == n - 1)
        peer_done = 1;
      else if (b[i] != BELL || peer_done)
        fail("expected doorbells on the socketpair, got '%c'", b[i]);
    }
  }
}

/* Like sock_expect, past the doorbells that may still come. */
static void sock_expect_past_bells(int fd, char want, const char *what) {
  if (want == 'D' && peer_done) {
    peer_done = 0;
    return;
  }
  char c = BELL;
  while (c == BELL)
    if (sock_read(fd, &c, 1, PHASE_TIMEOUT_MS) != 0) fail("no '%s' from the peer process", what);
  if (c != want) fail("expected '%c' (%s) from the peer process, got '%c'", want, what, c);
}

/* The readiness rules, on a link whose sender is `out` here and whose
 * receiver is the peer (`first`: this end checks the sender's part, then
 * hands over with 'F'; the other end checks the receiver's). */
static void stream_rules_sender(brg__conn *out, const test_link *l, int sock) {
  size_t cap = (size_t)l->nslots * l->slot_bytes, took = 0;
  char *buf = calloc(1, cap + 1);
  if (!buf) fail("out of memory");
  if (!out->ops->ready(out, 1, 0)) fail("an empty link is not ready to send");
  int ring = 0;
  for (ssize_t n; (n = out->ops->try_send(out, buf, cap + 1 - took, &ring)) > 0;) took += (size_t)n;
  if (took != cap) fail("an empty link took %zu bytes before it was full, expected %zu", took, cap);
  if (ring) fail("try_send rang a receiver that never armed");
  if (out->ops->ready(out, 1, 0) || out->ops->ready(out, 1, 1))
    fail("a full link says it is ready to send");
  sock_write(sock, "F", 1);
  /* The receiver takes one byte, which frees nothing: no ring yet. Then
   * it empties a slot: the armed sender is rung (on the socketpair). */
  sock_expect(sock, BELL, "the doorbell of a freed slot");
  if (!out->ops->ready(out, 1, 0)) fail("a link with a slot freed is not ready to send");
  sock_expect(sock, 'E', "emptied"); /* before the next bytes go in */
  free(buf);
}

static void stream_rules_receiver(brg__conn *in, const test_link *l, int sock) {
  size_t cap = (size_t)l->nslots * l->slot_bytes;
  char *buf = malloc(cap);
  if (!buf) fail("out of memory");
  memset(buf, 0x5a, cap);
  sock_expect(sock, 'F', "filled");
  if (!in->ops->ready(in, 0, 0)) fail("a full link is not ready to receive");
  int ring = 0;
  if (in->ops->try_recv(in, buf, 1, &ring) != 1) fail("try_recv of one byte gave another count");
  if (ring) fail("try_recv rang the sender before it freed a slot");
  ssize_t n = in->ops->try_recv(in, buf + 1, l->slot_bytes - 1, &ring);
  if (n != (ssize_t)l->slot_bytes - 1) fail("try_recv gave %zd of the first slot's rest", n);
  if (!ring) fail("try_recv freed a slot and did not ring the armed sender");
  sock_write(sock, (char[]){BELL}, 1);
  ring = 0;
  size_t left = cap - l->slot_bytes;
  while (left > 0) {
    n = in->ops->try_recv(in, buf + cap - left, left, &ring);
    if (n <= 0) fail("try_recv: %zu bytes of a full link were missing", left);
    left -= (size_t)n;
  }
  if (ring) fail("try_recv rang twice for one arming");
  if (in->ops->ready(in, 0, 0)) fail("an empty link says it is ready to receive");
  for (size_t i = 0; i < cap; i++)
    if (buf[i] != 0) fail("byte %zu of the filled link changed", i);
  sock_write(sock, "E", 1);
  free(buf);
}

/* The readiness rules of a link whose readiness is a descriptor of its
 * own (ready_fd: tcp's socket, ibverbs' eventfd), whose room is the
 * kernel's or the proxies': an empty link is ready to send and takes
 * bytes until it is full (nothing taken, and no room said for 200 ms),
 * no ring ever; the receiver's descriptor says bytes, and every byte
 * comes; once the receiver has read them all the sender's descriptor
 * says room (POLLOUT) and ready agrees. A lost wakeup hangs a wait here
 * (the deadline says so). */
/* ev: POLLOUT for room, POLLIN for bytes; what the descriptor says it
 * with is the link's (ready_fd's events). */
static int fd_wait_ms(brg__conn *c, short ev, int ms) {
  struct pollfd pfd = {.fd = c->ops->ready_fd(c, &ev)};
  pfd.events = ev;
  if (pfd.fd < 0) fail("ready_fd gave no descriptor");
  int r = poll(&pfd, 1, ms);
  return r > 0;
}

static int fd_wait(brg__conn *c, short ev) {
  return fd_wait_ms(c, ev, PHASE_TIMEOUT_MS);
}

static void stream_rules_sender_fd(brg__conn *out, int sock) {
  enum { PIECE = 65536 };
  const uint64_t most = 1ull << 30; /* a link that never fills fails here */
  char *buf = calloc(1, PIECE);
  if (!buf) fail("out of memory");
  if (!out->ops->ready(out, 1, 0)) fail("an empty link is not ready to send");
  if (!fd_wait(out, POLLOUT)) fail("an empty link's descriptor does not say room");
  int ring = 0;
  uint64_t took = 0;
  for (;;) {
    ssize_t n = out->ops->try_send(out, buf, PIECE, &ring);
    if (n < 0) fail("try_send on a working link said it broke (%s)", strerror(errno));
    took += (uint64_t)n;
    if (took > most) fail("a link took %llu bytes and is not full", (unsigned long long)took);
    if (n == 0 && !fd_wait_ms(out, POLLOUT, 200)) break;
  }
  if (!took) fail("an empty link took nothing");
  if (ring) fail("a link with a descriptor of its own rang");
  sock_write(sock, "F", 1);
  sock_write(sock, &took, sizeof took);
  sock_expect(sock, 'E', "emptied");
  if (!fd_wait(out, POLLOUT)) fail("an emptied link's descriptor does not say room");
  if (!out->ops->ready(out, 1, 0)) fail("an emptied link is not ready to send");
  free(buf);
}

static void stream_rules_receiver_fd(brg__conn *in, int sock) {
  enum { PIECE = 100000 };
  char *buf = malloc(PIECE);
  if (!buf) fail("out of memory");
  sock_expect(sock, 'F', "filled");
  uint64_t took, got = 0;
  if (sock_read(sock, &took, sizeof took, PHASE_TIMEOUT_MS) != 0) fail("no count from the peer");
  if (!fd_wait(in, POLLIN)) fail("a full link's descriptor does not say bytes");
  if (!in->ops->ready(in, 0, 0)) fail("a full link is not ready to receive");
  int ring = 0;
  while (got < took) {
    size_t want = took - got < PIECE ? (size_t)(took - got) : PIECE;
    ssize_t n = in->ops->try_recv(in, buf, want, &ring);
    if (n < 0)
      fail("try_recv on a working link said it %s", n == BRG__STREAM_ENDED ? "ended" : "broke");
    if (n == 0 && !fd_wait(in, POLLIN))
      fail("%llu of %llu bytes of a full link never came", (unsigned long long)got,
           (unsigned long long)took);
    for (ssize_t i = 0; i < n; i++)
      if (buf[i] != 0) fail("byte %llu of the filled link changed", (unsigned long long)got + i);
    got += (uint64_t)n;
  }
  if (ring) fail("a link with a descriptor of its own rang");
  if (in->ops->try_recv(in, buf, 1, &ring) != 0 || in->ops->ready(in, 0, 0))
    fail("an emptied link says it has more");
  sock_write(sock, "E", 1);
  free(buf);
}

/* Both ends stream STREAM_BYTES to each other at once, far more than a
 * link holds, from one thread each that never blocks: what it cannot send
 * now waits while it receives, and a side with nothing to do arms its
 * links (ready) and sleeps on the socketpair, where the other side's
 * try_* that changed things has it rung. A ring lost, or a try_send that
 * blocks on a full link, hangs both ends (the deadline says so). Every
 * byte is checked; the pieces differ in size on each side. */
static void stream_crossed(brg__conn *out, brg__conn *in, int sock, uint64_t my_seed,
                           uint64_t peer_seed) {
  enum { PIECE = 40000 };
  unsigned char *src = malloc(PIECE), *dst = malloc(PIECE);
  if (!src || !dst) fail("out of memory");
  uint64_t sent = 0, got = 0, calls = 0;
  peer_done = 0;
  int64_t deadline = now_ms() + PHASE_TIMEOUT_MS;
  while (sent < STREAM_BYTES || got < STREAM_BYTES) {
    int moved = 0, ring = 0;
    if (sent < STREAM_BYTES) {
      size_t want = 1 + mix(my_seed + calls++) % PIECE;
      if (want > STREAM_BYTES - sent) want = STREAM_BYTES - sent;
      for (size_t i = 0; i < want; i++) src[i] = stream_byte(my_seed, sent + i);
      ssize_t n = out->ops->try_send(out, src, want, &ring);
      if (n < 0) fail("try_send on a working link said it broke (%s)", strerror(errno));
      if ((size_t)n > want) fail("try_send took %zd of %zu bytes", n, want);
      sent += (uint64_t)n;
      moved |= n > 0;
    }
    if (got < STREAM_BYTES) {
      size_t want = 1 + mix(my_seed ^ calls++) % PIECE;
      if (want > STREAM_BYTES - got) want = STREAM_BYTES - got;
      ssize_t n = in->ops->try_recv(in, dst, want, &ring);
      if (n < 0)
        fail("try_recv on a working link said it %s", n == BRG__STREAM_ENDED ? "ended" : "broke");
      if ((size_t)n > want) fail("try_recv gave %zd bytes for %zu", n, want);
      for (ssize_t i = 0; i < n; i++)
        if (dst[i] != stream_byte(peer_seed, got + i))
          fail("stream byte %llu is %02x, expected %02x", (unsigned long long)(got + i), dst[i],
               stream_byte(peer_seed, got + i));
      got += (uint64_t)n;
      moved |= n > 0;
    }
    if (ring) sock_write(sock, (char[]){BELL}, 1);
    if (moved) continue;
    int ready = (sent < STREAM_BYTES && out->ops->ready(out, 1, 1)) |
                (got < STREAM_BYTES && in->ops->ready(in, 0, 1));
    if (ready) continue;
    /* A link with a descriptor of its own is polled there. */
    struct pollfd pfd[3] = {{.fd = sock, .events = POLLIN}};
    int np = 1;
    short ev = POLLOUT;
    if (out->ops->ready_fd && sent < STREAM_BYTES) {
      pfd[np].fd = out->ops->ready_fd(out, &ev);
      pfd[np++].events = ev;
    }
    ev = POLLIN;
    if (in->ops->ready_fd && got < STREAM_BYTES) {
      pfd[np].fd = in->ops->ready_fd(in, &ev);
      pfd[np++].events = ev;
    }
    int64_t left = deadline - now_ms();
    if (left <= 0)
      fail("crossed stream stuck: %llu of %u bytes sent, %llu received (a lost doorbell, or a "
           "send that waits for room)",
           (unsigned long long)sent, STREAM_BYTES, (unsigned long long)got);
    if (poll(pfd, (nfds_t)np, (int)(left < 1000 ? left : 1000)) > 0 && pfd[0].revents)
      bells_drain(sock);
  }
  if (out->ops->end) {
    /* The stream's end: after every byte, the receiver hears it. */
    out->ops->end(out);
    for (;;) {
      int ring = 0;
      ssize_t n = in->ops->try_recv(in, dst, PIECE, &ring);
      if (n == BRG__STREAM_ENDED) break;
      if (n > 0) fail("%zd bytes came after the whole stream", n);
      if (n < 0) fail("a stream that ended says it broke (%s)", strerror(errno));
      if (!fd_wait(in, POLLIN)) fail("the peer ended its stream and the end never came");
    }
  }
  free(src);
  free(dst);
}

static void case_bytestream(const test_link *ab, const test_link *ba) {
  int sv[2], sock;
  resources before = resources_now();
  if (fork_child(sv, &sock) == 0) {
    /* The child: receiver of ab, sender of ba. */
    brg__conn in, out;
    receiver_setup(ab, &in, sock);
    sender_setup(ba, &out, sock);
    if (in.ops->ready_fd)
      stream_rules_receiver_fd(&in, sock);
    else
      stream_rules_receiver(&in, ab, sock);
    stream_crossed(&out, &in, sock, 2, 1);
    sock_write(sock, "D", 1);
    sock_expect_past_bells(sock, 'D', "done");
    in.ops->close(&in);
    out.ops->close(&out);
    _exit(0);
  }
  brg__conn in, out;
  sender_setup(ab, &out, sock);
  receiver_setup(ba, &in, sock);
  if (out.ops->ready_fd)
    stream_rules_sender_fd(&out, sock);
  else
    stream_rules_sender(&out, ab, sock);
  stream_crossed(&out, &in, sock, 1, 2);
  sock_write(sock, "D", 1);
  sock_expect_past_bells(sock, 'D', "done");
  in.ops->close(&in);
  out.ops->close(&out);
  child_reap(PHASE_TIMEOUT_MS, 0);
  close(sock);
  resources_check(ab, before, "after close");
  if (count_link_names(ab) != 0 || count_link_names(ba) != 0)
    fail("a shared-memory name of the links is left in /dev/shm");
}

/* ---- the proxy entry (proxy_post, proxy_sent, proxy_poll, proxy_release) -- */

#define PROXY_CHANNELS 3
#define PROXY_SLOTS 3000
#define PROXY_CALL_BYTES 24 /* a kernel's call, as kernel mode's proxy sends it */

/* Slot i of the stream: its channel and kind are drawn from i; its number
 * counts the slots of its channel and kind before it. */
typedef struct proxy_gen {
  uint64_t seq[PROXY_CHANNELS][2];
} proxy_gen;

static brg__proxy_slot proxy_next(proxy_gen *g, uint64_t i, size_t slot_bytes) {
  brg__proxy_slot s = {.channel = (uint32_t)(mix(i ^ 0xc4a7) % PROXY_CHANNELS)};
  int call = mix(i ^ 0xca11) % 6 == 0;
  s.what = call ? BRG__PROXY_CALL : BRG__PROXY_DATA;
  s.seq = ++g->seq[s.channel][call];
  s.bytes = call ? PROXY_CALL_BYTES : slice_bytes(i, slot_bytes);
  return s;
}

/* Waits for the link to take slot s: 1, or -1 when it refused for good.
 * 0 never comes back: a link full past the deadline fails the test. */
static int proxy_post_wait(brg__conn *c, const brg__proxy_slot *s, test_wait *tw) {
  const brg__waiter w = {.spin = 100, .check = test_check, .arg = tw};
  for (int tries = 0;; tries++) {
    int r = c->ops->proxy_post(c, s, &w);
    if (r != 0) return r;
    if (tw->tick) tw->tick();
    if (now_ms() > tw->deadline) fail("sender: the link stayed full past the deadline");
    if (tries > 100) usleep(50);
  }
}

/* The sender's side: slots [0, n) of every channel, interleaved, each
 * payload written into a buffer that is overwritten as soon as the link
 * took it. Returns the first slot not posted. */
static uint64_t proxy_produce(brg__conn *c, uint64_t n, test_wait *tw) {
  proxy_gen g = {0};
  char *buf = malloc(c->fifo.slot_bytes);
  if (!buf) fail("out of memory");
  uint64_t i = 0;
  for (; i < n; i++) {
    brg__proxy_slot s = proxy_next(&g, i, c->fifo.slot_bytes);
    slice_fill(buf, i, s.bytes);
    s.data = buf;
    if (proxy_post_wait(c, &s, tw) < 0) break;
    memset(buf, 0xee, s.bytes);
    if (tw->tick && i % 64 == 0) tw->tick();
  }
  free(buf);
  return i;
}

/* Fails unless polled slot `got` is slot i of the stream, every byte. */
static void proxy_slot_check(const brg__proxy_slot *got, const brg__proxy_slot *want, uint64_t i,
                             const char *when) {
  if (got->what != want->what || got->channel != want->channel || got->seq != want->seq ||
      got->bytes != want->bytes || got->device)
    fail("proxy slot %llu %s: kind %u channel %u number %llu, %u bytes%s; expected kind %u "
         "channel %u number %llu, %u bytes",
         (unsigned long long)i, when, got->what, got->channel, (unsigned long long)got->seq,
         got->bytes, got->device ? " in GPU memory" : "", want->what, want->channel,
         (unsigned long long)want->seq, want->bytes);
  slice_fill(expect_buf, i, want->bytes);
  if (want->bytes && (!got->data || memcmp(got->data, expect_buf, want->bytes) != 0))
    fail("proxy slot %llu %s: the %u bytes of its payload differ", (unsigned long long)i, when,
         want->bytes);
}

/* The receiver's side: polls slots [0, n), checking each as it arrives,
 * and releases them a few at a time (the link must keep a polled slot's
 * payload until then: checked again just before). Returns the first slot
 * that did not arrive; *r is what poll said of it. */
static uint64_t proxy_consume(brg__conn *c, uint64_t n, test_wait *tw, int *r) {
  proxy_gen g = {0};
  brg__proxy_slot held[BRG__MAX_SLOTS], want[BRG__MAX_SLOTS];
  uint64_t batch = c->fifo.nslots < 3 ? (uint64_t)c->fifo.nslots : 3, released = 0, i = 0;
  *r = 1;
  for (; i < n; i++) {
    want[i % batch] = proxy_next(&g, i, c->fifo.slot_bytes);
    for (int tries = 0; (*r = c->ops->proxy_poll(c, i, &held[i % batch])) == 0; tries++) {
      if (now_ms() > tw->deadline) return i;
      if (tries > 100) usleep(50);
    }
    if (*r < 0) return i;
    proxy_slot_check(&held[i % batch], &want[i % batch], i, "as it arrived");
    if (i + 1 - released == batch) {
      for (uint64_t k = released; k <= i; k++)
        proxy_slot_check(&held[k % batch], &want[k % batch], k, "before its release");
      released = i + 1;
      c->ops->proxy_release(c, released);
    }
  }
  c->ops->proxy_release(c, n);
  return i;
}

/* Every slot arrives in order, with its channel, kind, number and
 * payload; then a slot that is no proxy slot (an engine's) breaks the
 * link instead of being taken for one. */
static void case_proxy_stream(const test_link *l) {
  int sv[2], sock;
  resources before = resources_now();
  if (fork_child(sv, &sock) == 0) {
    brg__conn c;
    sender_setup(l, &c, sock);
    test_wait tw = {.fifo = &c.fifo, .deadline = now_ms() + PHASE_TIMEOUT_MS};
    uint64_t sent = proxy_produce(&c, PROXY_SLOTS, &tw);
    if (sent != PROXY_SLOTS)
      fail("sender: the link refused proxy slot %llu: %s", (unsigned long long)sent,
           c.fifo.ctrl->closed_why);
    while (c.ops->proxy_sent(&c) < PROXY_SLOTS) {
      if (now_ms() > tw.deadline) fail("sender: proxy_sent stayed below %d", PROXY_SLOTS);
      usleep(100);
    }
    /* One engine slot after them, as the engine posts it (flag and all). */
    brg__slot_meta *m = brg__fifo_meta(&c.fifo, PROXY_SLOTS);
    meta_fill(m, PROXY_SLOTS, 0);
    __atomic_store_n(&m->flag, PROXY_SLOTS + 1, __ATOMIC_RELEASE);
    brg__publish(&c.fifo.ctrl->tail, &c.fifo.ctrl->tail_waiters, PROXY_SLOTS + 1);
    const brg__waiter w = {.spin = 100, .check = test_check, .arg = &tw};
    if (c.ops->send_now && c.ops->send_now(&c, PROXY_SLOTS, NULL, &w) != BRG_SUCCESS)
      fail("sender: the engine slot: %s", c.fifo.ctrl->closed_why);
    sock_expect(sock, 'D', "done");
    c.ops->close(&c);
    _exit(0);
  }
  brg__conn c;
  receiver_setup(l, &c, sock);
  test_wait tw = {.fifo = &c.fifo, .deadline = now_ms() + PHASE_TIMEOUT_MS};
  int r;
  uint64_t got = proxy_consume(&c, PROXY_SLOTS, &tw, &r);
  if (got != PROXY_SLOTS)
    fail("receiver: proxy slot %llu of %d %s (%s)", (unsigned long long)got, PROXY_SLOTS,
         r < 0 ? "never came: the link broke" : "did not come in time",
         r < 0 ? c.fifo.ctrl->closed_why : "");
  brg__proxy_slot s;
  while ((r = c.ops->proxy_poll(&c, PROXY_SLOTS, &s)) == 0) {
    if (now_ms() > tw.deadline) fail("receiver: the engine slot after the proxy slots never came");
    usleep(100);
  }
  if (r > 0) fail("receiver: an engine's slot was taken for a proxy slot");
  if (!c.fifo.ctrl->closed || !strstr(c.fifo.ctrl->closed_why, "no proxy slot"))
    fail("receiver: an engine's slot left the link %s (%s)",
         c.fifo.ctrl->closed ? "broken" : "open", c.fifo.ctrl->closed_why);
  sock_write(sock, "D", 1);
  c.ops->close(&c);
  child_reap(PHASE_TIMEOUT_MS, 0);
  close(sock);
  resources_check(l, before, "after close");
  if (count_link_names(l) != 0) fail("a shared-memory name of the link is left in /dev/shm");
  printf("  proxy entry: %d slots of %d channels (data and calls) arrived in order, every byte "
         "checked; an engine's slot broke the link\n",
         PROXY_SLOTS, PROXY_CHANNELS);
}

/* A broken peer: the sender killed mid-stream (the receiver's poll says
 * -1 in time), then the receiver killed (the sender's post says -1 in
 * time): neither end hangs. */
static void case_proxy_peer_dies(const test_link *l) {
  int sv[2], sock;
  resources before = resources_now();
  if (fork_child(sv, &sock) == 0) {
    brg__conn c;
    sender_setup(l, &c, sock);
    test_wait tw = {.fifo = &c.fifo, .deadline = now_ms() + PHASE_TIMEOUT_MS};
    proxy_produce(&c, UINT64_MAX, &tw);
    fail("sender: was meant to be killed, but is still alive");
  }
  brg__conn c;
  receiver_setup(l, &c, sock);
  test_wait tw = {.fifo = &c.fifo, .deadline = now_ms() + PHASE_TIMEOUT_MS};
  int r;
  if (proxy_consume(&c, 200, &tw, &r) != 200) fail("receiver: before the kill: %d", r);
  kill(child_pid, SIGKILL);
  child_reap(PHASE_TIMEOUT_MS, 1);
  int64_t t0 = now_ms();
  tw.deadline = t0 + DEATH_DETECT_MS;
  uint64_t got = 200;
  brg__proxy_slot s;
  while ((r = c.ops->proxy_poll(&c, got, &s)) != 0 || now_ms() < tw.deadline) {
    if (r < 0) break;
    if (r > 0) c.ops->proxy_release(&c, ++got);
    if (r == 0) usleep(200);
  }
  if (r >= 0)
    fail("receiver: the killed sender went unnoticed by proxy_poll for %lld ms",
         (long long)(now_ms() - t0));
  printf("  proxy entry, sender killed: proxy_poll said -1 after %lld ms (%s)\n",
         (long long)(now_ms() - t0), c.fifo.ctrl->closed_why);
  c.ops->close(&c);
  close(sock);
  resources_check(l, before, "after close with a dead peer");

  if (fork_child(sv, &sock) == 0) {
    brg__conn rc;
    receiver_setup(l, &rc, sock);
    test_wait rw = {.fifo = &rc.fifo, .deadline = now_ms() + PHASE_TIMEOUT_MS};
    if (proxy_consume(&rc, 200, &rw, &r) != 200) fail("receiver: %d", r);
    sock_write(sock, "R", 1);
    pause();
    _exit(1);
  }
  sender_setup(l, &c, sock);
  killer_sock = sock;
  tw =
      (test_wait){.fifo = &c.fifo, .deadline = now_ms() + PHASE_TIMEOUT_MS, .tick = kill_on_signal};
  uint64_t sent = proxy_produce(&c, UINT64_MAX, &tw);
  if (child_pid > 0)
    fail("sender: the link refused slot %llu before the receiver was killed",
         (unsigned long long)sent);
  if (!c.fifo.ctrl->closed) fail("sender: proxy_post refused a slot on a link not marked broken");
  printf("  proxy entry, receiver killed: proxy_post said -1 after %llu slots (%s)\n",
         (unsigned long long)sent, c.fifo.ctrl->closed_why);
  c.ops->close(&c);
  close(sock);
  resources_check(l, before, "after close with a dead peer");
}

static void link_init(test_link *l, const brg__transport_ops *ops, int nslots, size_t slot_bytes) {
  static unsigned serial;
  memset(l, 0, sizeof *l);
  l->ops = ops;
  l->nslots = nslots;
  l->slot_bytes = slot_bytes;
  l->comm_id = ((uint64_t)getpid() << 20) ^ ((uint64_t)now_ms() << 32) ^ ++serial;
  for (int i = 0; i < BRG__SECRET_BYTES; i++) l->secret[i] = (uint8_t)mix(l->comm_id + i);
  for (int r = 0; r < 2; r++) {
    l->info[r].rank = r;
    l->info[r].pid = getpid();
    l->info[r].host_hash = 0x686f7374;
    snprintf(l->info[r].hostname, sizeof l->info[r].hostname, "localhost");
    snprintf(l->info[r].addr, sizeof l->info[r].addr, "127.0.0.1");
  }
}

static void *nothing(void *arg) {
  return arg;
}

int main(int argc, char **argv) {
  const char *only = argc > 1 ? argv[1] : NULL;
  setenv("BRIGADE_DEBUG", "WARN", 0);
  brg__errbuf err = {0};
  if (brg__settings_load(&err) != BRG_SUCCESS) {
    fprintf(stderr, "FAIL: configuration: %s\n", err.msg);
    return 1;
  }
  brg__log_init();
  signal(SIGPIPE, SIG_IGN);
  /* Sanitizers start a helper thread with the first thread; let that happen
   * before any thread count is taken. */
  pthread_t warm;
  if (pthread_create(&warm, NULL, nothing, NULL) == 0) pthread_join(warm, NULL);

  static const struct {
    int nslots;
    size_t slot_bytes;
  } shapes[] = {{1, 4096}, {2, 16384}, {8, 65536}};
  size_t max_slot = 65536;
  expect_buf = malloc(max_slot);
  if (!expect_buf) return 1;

  int ran = 0;
  for (int t = 0; brg__transports[t]; t++) {
    const brg__transport_ops *ops = brg__transports[t];
    if (only && strcmp(only, ops->name) != 0) continue;
    if (!(ops->carries & BRG__CARRIES_HOST)) {
      printf("transport %s: carries device collectives only (tests/gpu/test_cuda_ipc_link), "
             "skipped\n",
             ops->name);
      continue;
    }
    char why[256] = "";
    if (!ops->available(why, sizeof why)) {
      printf("transport %s: unavailable here (%s), skipped\n", ops->name, why);
      continue;
    }
    test_link l;
    link_init(&l, ops, 1, 4096);
    if (!ops->can_connect(&l.info[0], &l.info[1])) {
      printf("transport %s: cannot connect two processes on one host, skipped\n", ops->name);
      continue;
    }
    ran++;
    printf("transport %s (tcp sockets per link: %lld)\n", ops->name,
           (long long)brg__settings_find("BRIGADE_TCP_NSOCKS")->ival);
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
      link_init(&l, ops, shapes[k].nslots, shapes[k].slot_bytes);
      snprintf(where, sizeof where, "%s, %d slots of %zu bytes, stream", ops->name, l.nslots,
               l.slot_bytes);
      int64_t t0 = now_ms();
      case_stream(&l, NSLICES, 0);
      printf("  %d slots of %zu bytes: %d slices checked in %lld ms\n", l.nslots, l.slot_bytes,
             NSLICES, (long long)(now_ms() - t0));
    }
    link_init(&l, ops, 8, 16384);
    snprintf(where, sizeof where, "%s, sender closes first", ops->name);
    case_stream(&l, 1000, 1);
    printf("  sender closed right after its last slice: all 1000 slices arrived\n");
    link_init(&l, ops, 2, 4096);
    snprintf(where, sizeof where, "%s, half set up", ops->name);
    case_half_setup(&l);
    link_init(&l, ops, 4, 8192);
    snprintf(where, sizeof where, "%s, sender killed", ops->name);
    case_sender_dies(&l);
    if (sees_peer_death(ops)) {
      link_init(&l, ops, 4, 8192);
      snprintf(where, sizeof where, "%s, receiver killed", ops->name);
      case_receiver_dies(&l);
    }
    if (ops->recv_window) {
      link_init(&l, ops, 1, WINDOW_BYTES);
      snprintf(where, sizeof where, "%s, window withdrawn while idle", ops->name);
      case_window_idle(&l);
      link_init(&l, ops, 1, WINDOW_BYTES);
      snprintf(where, sizeof where, "%s, window withdrawn mid-slot", ops->name);
      case_window_mid_slot(&l);
    }
    if (ops->try_send || ops->try_recv || ops->ready) {
      if (!ops->try_send || !ops->try_recv || !ops->ready)
        fail("transport %s has part of the byte stream (try_send, try_recv, ready), not all",
             ops->name);
      if (!ops->ready_fd != !ops->end)
        fail("transport %s has one of ready_fd and end without the other", ops->name);
      for (int k = 0; k < 2; k++) {
        test_link ba;
        link_init(&l, ops, k ? 8 : 1, k ? 16384 : 4096);
        link_init(&ba, ops, k ? 3 : 2, k ? 4096 : 65536);
        l.stream = ba.stream = 1;
        snprintf(where, sizeof where, "%s, byte stream both ways at once (%d x %zu, %d x %zu)",
                 ops->name, l.nslots, l.slot_bytes, ba.nslots, ba.slot_bytes);
        int64_t t0 = now_ms();
        case_bytestream(&l, &ba);
        printf("  byte stream: readiness rules held; %u bytes each way at once, every byte "
               "checked, in %lld ms\n",
               STREAM_BYTES, (long long)(now_ms() - t0));
      }
    } else {
      printf("  no byte stream (try_send): point-to-point takes its own TCP over %s's pairs\n",
             ops->name);
    }
    if (ops->proxy_post || ops->proxy_sent || ops->proxy_poll || ops->proxy_release) {
      if (!ops->proxy_post || !ops->proxy_sent || !ops->proxy_poll || !ops->proxy_release)
        fail("transport %s has part of the proxy entry, not all", ops->name);
      link_init(&l, ops, 4, 8192);
      snprintf(where, sizeof where, "%s, proxy entry", ops->name);
      case_proxy_stream(&l);
      if (sees_peer_death(ops)) {
        link_init(&l, ops, 4, 8192);
        snprintf(where, sizeof where, "%s, proxy entry, a peer killed", ops->name);
        case_proxy_peer_dies(&l);
      }
    } else {
      printf("  no proxy entry: kernel mode's host proxy cannot take %s links\n", ops->name);
    }
    if (!strcmp(ops->name, "tcp")) {
      link_init(&l, ops, 2, 4096);
      snprintf(where, sizeof where, "%s, authentication", ops->name);
      case_tcp_auth(&l);
    }
  }
  free(expect_buf);
  if (!ran) {
    printf("no transport to test%s%s\n", only ? " named " : "", only ? only : "");
    return 77;
  }
  printf("PASS\n");
  return 0;
}
