/*
 * What an outsider (another local user, a program without the job's
 * secret) and a job's own inconsistent settings can do to a starting job.
 * Each case as a new user would meet it:
 *
 *   shmsquat   every shm name the ranks would use, ring and point-to-point
 *              (the communicator id from the unique id, p2p's XOR
 *              0x7032700000000000), made first by another user (nobody,
 *              when run as root): the job still sets up over shm, its
 *              allreduce and point-to-point messages arrive, and the
 *              squatted files are still there, untouched (shmsquatp2p:
 *              the point-to-point names only, which a watcher of the ring's
 *              names in /dev/shm could predict).
 *   strangers  300 connections held on the root's port while rank 0 has
 *              RLIMIT_NOFILE 128: the job still starts (strangers are
 *              dropped, oldest first), within the timeout.
 *   secret     a rank's first bytes to the root (a listener here that
 *              sends a version-3 challenge) do not contain the secret.
 *   worldsize  ranks that disagree on WORLD_SIZE: each is told both sizes.
 *   bootwait   a rank whose root never comes gives up at BRIGADE_TIMEOUT_MS
 *              (2000 ms), not later, and says 2000 ms.
 *
 * Weak secrets and unchecked settings are in test_settings_sweep.c.
 *
 *   test_outsiders CASE
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "brigade.h"
#include "harness.h"

static void clear_launcher_env(void) {
  static const char *const vars[] = {
      "MASTER_ADDR",          "MASTER_PORT",      "RANK",       "WORLD_SIZE",
      "LOCAL_RANK",           "LOCAL_WORLD_SIZE", "GROUP_RANK", "OMPI_COMM_WORLD_RANK",
      "OMPI_COMM_WORLD_SIZE", "PMI_RANK",         "PMI_SIZE",   "SLURM_PROCID",
      "SLURM_NTASKS"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) unsetenv(vars[i]);
}

static void set_env(int port, int rank, int size) {
  char b[32];
  clear_launcher_env();
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  snprintf(b, sizeof b, "%d", port);
  setenv("MASTER_PORT", b, 1);
  snprintf(b, sizeof b, "%d", rank);
  setenv("RANK", b, 1);
  snprintf(b, sizeof b, "%d", size);
  setenv("WORLD_SIZE", b, 1);
}

static int64_t ms_since(int64_t t0_ns) {
  return (mp_now_ns() - t0_ns) / 1000000;
}

/* ============================================================ shmsquat */

#define SQUAT_RANKS 3
#define SQUAT_MAX 16

/* The names brigade derived from the unique id alone: FNV-1a 64 of the id's
 * 96 bytes is the communicator id; ring FIFO r-from-s, and point-to-point
 * links under the id XOR "p2p". */
static int squat_p2p_only;

static int squat_names(const brg_unique_id *id, char names[SQUAT_MAX][96]) {
  uint64_t h = 14695981039346656037ull;
  const uint8_t *p = (const uint8_t *)id;
  for (int i = 0; i < 96; i++) h = (h ^ p[i]) * 1099511628211ull;
  int n = 0;
  for (int r = 0; r < SQUAT_RANKS; r++) {
    if (!squat_p2p_only)
      snprintf(names[n++], 96, "/dev/shm/brigade-%016llx-%d-from-%d", (unsigned long long)h, r,
               (r + SQUAT_RANKS - 1) % SQUAT_RANKS);
    for (int s = 0; s < SQUAT_RANKS; s++)
      if (s != r)
        snprintf(names[n++], 96, "/dev/shm/brigade-%016llx-%d-from-%d",
                 (unsigned long long)(h ^ 0x7032700000000000ull), r, s);
  }
  return n;
}

/* Another user's files (nobody's, as root), made in a child that is no rank. */
static int squat(char names[SQUAT_MAX][96], int n) {
  pid_t pid = fork();
  if (pid == 0) {
    for (int i = 0; i < n; i++) {
      int fd = open(names[i], O_CREAT | O_EXCL | O_WRONLY, 0644);
      if (fd < 0) _exit(1);
      if (write(fd, "squat", 5) != 5) _exit(1);
      if (geteuid() == 0 && fchown(fd, 65534, 65534) != 0) _exit(1);
      close(fd);
    }
    _exit(0);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

static int body_shmsquat(mp_ctx *x) {
  char names[SQUAT_MAX][96];
  int n = squat_names(x->id, names);
  if (x->rank == 0) {
    if (squat(names, n) != 0) {
      mp_fail("could not make the squatter's files");
      return 1;
    }
    __atomic_store_n(&x->shared->flags[0], 1, __ATOMIC_RELEASE);
  } else if (!mp_wait_flag(0, 10000)) {
    mp_fail("the squatter never finished");
    return 1;
  }
  brg_comm *c = NULL;
  brg_status s = brg_comm_init(&c, x->nranks, x->id, x->rank);
  if (s != BRG_SUCCESS) {
    mp_fail("brg_comm_init beside squatted shm names: %s: %s", brg_status_string(s),
            brg_comm_last_error(NULL));
    return 1;
  }
  float v[64];
  for (int i = 0; i < 64; i++) v[i] = (float)(x->rank + 1) * (float)i;
  s = brg_allreduce(v, v, 64, BRG_FLOAT32, BRG_SUM, c, NULL);
  MP_CHECK(s == BRG_SUCCESS, "allreduce: %s: %s", brg_status_string(s), brg_comm_last_error(c));
  for (int i = 0; i < 64 && s == BRG_SUCCESS; i++)
    MP_CHECK(v[i] == 6.0f * (float)i, "allreduce element %d is %g, expected %g", i, v[i], 6.0 * i);
  /* Point-to-point around the ring over shm: each rank sends to next. */
  int out[32], in[32];
  for (int i = 0; i < 32; i++) out[i] = x->rank * 1000 + i;
  int next = (x->rank + 1) % x->nranks, prev = (x->rank + x->nranks - 1) % x->nranks;
  brg_request rq[2];
  s = brg_irecv(in, 32, BRG_INT32, prev, c, &rq[0]);
  if (s == BRG_SUCCESS) s = brg_isend(out, 32, BRG_INT32, next, c, &rq[1]);
  if (s == BRG_SUCCESS) s = brg_wait(&rq[1]);
  if (s == BRG_SUCCESS) s = brg_wait(&rq[0]);
  MP_CHECK(s == BRG_SUCCESS, "point-to-point beside squatted names: %s: %s", brg_status_string(s),
           brg_comm_last_error(c));
  for (int i = 0; i < 32 && s == BRG_SUCCESS; i++)
    MP_CHECK(in[i] == prev * 1000 + i, "p2p element %d is %d, expected %d", i, in[i],
             prev * 1000 + i);
  brg_comm_destroy(c);
  /* The squatter's files: still there, still its own. */
  __atomic_fetch_add(&x->shared->flags[1], 1, __ATOMIC_ACQ_REL);
  if (x->rank == 0) {
    int64_t t0 = mp_now_ns();
    while (__atomic_load_n(&x->shared->flags[1], __ATOMIC_ACQUIRE) < x->nranks &&
           ms_since(t0) < 10000)
      mp_sleep_ms(5);
    for (int i = 0; i < n; i++) {
      struct stat st;
      char buf[8] = {0};
      int fd = open(names[i], O_RDONLY);
      MP_CHECK(fd >= 0 && fstat(fd, &st) == 0 && read(fd, buf, sizeof buf) == 5 &&
                   !memcmp(buf, "squat", 5) && st.st_uid == (geteuid() == 0 ? 65534u : geteuid()),
               "the squatter's %s was removed or changed", names[i]);
      if (fd >= 0) close(fd);
      unlink(names[i]);
    }
  }
  return 0;
}

/* =========================================================== strangers */

typedef struct strangers_arg {
  int port;
  int held;
} strangers_arg;

/* The parent holds 300 connections on the root's port, made as soon as it
 * listens, then lets rank 1 start. */
static void *strangers_thread(void *argp) {
  strangers_arg *a = argp;
  static int fds[300];
  int n = 0;
  int64_t t0 = mp_now_ns();
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)a->port)};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  while (n < 300 && ms_since(t0) < 10000) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) {
      fds[n++] = fd;
      continue;
    }
    if (fd >= 0) close(fd);
    mp_sleep_ms(2);
  }
  a->held = n;
  __atomic_store_n(&mp_shared_area()->flags[0], 1, __ATOMIC_RELEASE);
  mp_wait_flag(2, 30000); /* every rank is through */
  for (int i = 0; i < n; i++) close(fds[i]);
  return NULL;
}

static int body_strangers(mp_ctx *x) {
  strangers_arg *a = x->arg;
  set_env(a->port, x->rank, x->nranks);
  setenv("BRIGADE_SECRET", "8f3a1c9e5b7d2f4a6c8e0b1d3f5a7c9e", 1);
  if (x->rank == 0) {
    struct rlimit rl = {128, 128};
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0) {
      mp_fail("setrlimit: %s", strerror(errno));
      return 1;
    }
  } else if (!mp_wait_flag(0, 15000)) {
    mp_fail("the strangers never connected");
    return 1;
  }
  int64_t t0 = mp_now_ns();
  brg_comm *c = NULL;
  brg_status s = brg_comm_init_env(&c);
  if (x->rank == 1) __atomic_fetch_add(&x->shared->flags[2], 1, __ATOMIC_ACQ_REL);
  if (s != BRG_SUCCESS) {
    mp_fail("brg_comm_init_env beside 300 held connections (rank 0 at 128 descriptors): %s: %s",
            brg_status_string(s), brg_comm_last_error(NULL));
    return 1;
  }
  MP_CHECK(ms_since(t0) < 8000, "init took %lld ms", (long long)ms_since(t0));
  int v = x->rank + 1;
  s = brg_allreduce(&v, &v, 1, BRG_INT32, BRG_SUM, c, NULL);
  MP_CHECK(s == BRG_SUCCESS && v == 3, "allreduce: %s, %d", brg_status_string(s), v);
  brg_comm_destroy(c);
  return 0;
}

/* ============================================================== secret */

/* A listener at MASTER_PORT that challenges like a version-3 root; what
 * the rank sends first must not hold the secret's bytes. */
static int body_secret(mp_ctx *x) {
  (void)x;
  static const char hex[] = "0123456789abcdeffedcba9876543210";
  uint8_t secret[16];
  for (int i = 0; i < 16; i++) sscanf(hex + 2 * i, "%2hhx", &secret[i]);
  int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t slen = sizeof sa;
  if (lfd < 0 || bind(lfd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(lfd, 4) != 0 ||
      getsockname(lfd, (struct sockaddr *)&sa, &slen) != 0) {
    mp_fail("listener: %s", strerror(errno));
    return 1;
  }
  pid_t pid = fork();
  if (pid == 0) {
    close(lfd);
    set_env(ntohs(sa.sin_port), 1, 2);
    setenv("BRIGADE_SECRET", hex, 1);
    setenv("BRIGADE_TIMEOUT_MS", "3000", 1);
    brg_comm *c = NULL;
    brg_comm_init_env(&c);
    _exit(0);
  }
  uint8_t got[4096];
  size_t have = 0;
  struct pollfd p = {.fd = lfd, .events = POLLIN};
  int fd = poll(&p, 1, 5000) == 1 ? accept(lfd, NULL, NULL) : -1;
  if (fd >= 0) {
    uint8_t ch[24] = {0x4e, 0x47, 0x52, 0x42, 3, 0, 0, 0};
    for (int i = 8; i < 24; i++) ch[i] = (uint8_t)(i * 37);
    if (send(fd, ch, sizeof ch, MSG_NOSIGNAL) != (ssize_t)sizeof ch) mp_info("challenge not sent");
    int64_t t0 = mp_now_ns();
    while (have < sizeof got && ms_since(t0) < 1000) {
      struct pollfd q = {.fd = fd, .events = POLLIN};
      if (poll(&q, 1, 100) != 1) continue;
      ssize_t n = recv(fd, got + have, sizeof got - have, 0);
      if (n <= 0) break;
      have += (size_t)n;
    }
    close(fd);
  }
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  close(lfd);
  MP_CHECK(have >= 184, "the rank sent %zu bytes, not a whole hello", have);
  for (size_t i = 0; i + 16 <= have; i++)
    MP_CHECK(memcmp(got + i, secret, 16) != 0, "the rank's hello carries the secret at byte %zu",
             i);
  return 0;
}

/* =========================================================== worldsize */

static int body_worldsize(mp_ctx *x) {
  int port = *(int *)x->arg;
  set_env(port, x->rank, x->rank == 0 ? 2 : 3);
  unsetenv("BRIGADE_SECRET"); /* derived: the same on both ranks */
  setenv("BRIGADE_TIMEOUT_MS", "2000", 1);
  brg_comm *c = NULL;
  brg_status s = brg_comm_init_env(&c);
  if (s == BRG_SUCCESS) {
    mp_fail("brg_comm_init_env succeeded with WORLD_SIZE 2 on rank 0 and 3 on rank 1");
    brg_comm_destroy(c);
    return 1;
  }
  const char *m = brg_comm_last_error(NULL);
  /* Whichever rank came first, its size is the one "said". */
  MP_CHECK(strstr(m, "WORLD_SIZE") && ((strstr(m, " is 3") && strstr(m, " said 2")) ||
                                       (strstr(m, " is 2") && strstr(m, " said 3"))),
           "rank %d (WORLD_SIZE %d) was not told both sizes: %s (%s)", x->rank,
           x->rank == 0 ? 2 : 3, brg_status_string(s), m);
  return 0;
}

/* ============================================================ bootwait */

static int body_bootwait(mp_ctx *x) {
  (void)x;
  set_env(mp_free_port(), 1, 2); /* nobody listens there */
  setenv("BRIGADE_TIMEOUT_MS", "2000", 1);
  int64_t t0 = mp_now_ns();
  brg_comm *c = NULL;
  brg_status s = brg_comm_init_env(&c);
  int64_t took = ms_since(t0);
  const char *m = brg_comm_last_error(NULL);
  MP_CHECK(s == BRG_ERR_TIMEOUT, "expected BRG_ERR_TIMEOUT, got %s: %s", brg_status_string(s), m);
  MP_CHECK(took >= 1900 && took <= 2400, "gave up after %lld ms with BRIGADE_TIMEOUT_MS=2000",
           (long long)took);
  MP_CHECK(strstr(m, "within 2000 ms") != NULL, "the message does not say 2000 ms: %s", m);
  return 0;
}

int main(int argc, char **argv) {
  const char *which = argc > 1 ? argv[1] : "";
  mp_opts o = {.name = which, .deadline_ms = 40000, .victim = -1};
  mp_body_fn body = NULL;
  void *arg = NULL;
  static strangers_arg sa;
  static int port;
  if (!strcmp(which, "shmsquat") || !strcmp(which, "shmsquatp2p")) {
    squat_p2p_only = !strcmp(which, "shmsquatp2p");
    setenv("BRIGADE_TRANSPORTS", "shm", 1);
    o.nranks = SQUAT_RANKS;
    o.init = MP_INIT_NONE;
    o.expect_shm = 1;
    body = body_shmsquat;
  } else if (!strcmp(which, "strangers")) {
    sa.port = mp_free_port();
    o.nranks = 2;
    o.init = MP_INIT_BARE;
    o.parent_thread = strangers_thread;
    o.parent_arg = &sa;
    setenv("BRIGADE_TIMEOUT_MS", "10000", 1);
    body = body_strangers;
    arg = &sa;
  } else if (!strcmp(which, "secret")) {
    o.nranks = 1;
    o.init = MP_INIT_BARE;
    body = body_secret;
  } else if (!strcmp(which, "worldsize")) {
    port = mp_free_port();
    o.nranks = 2;
    o.init = MP_INIT_BARE;
    body = body_worldsize;
    arg = &port;
  } else if (!strcmp(which, "bootwait")) {
    o.nranks = 1;
    o.init = MP_INIT_BARE;
    body = body_bootwait;
  } else {
    fprintf(stderr,
            "usage: test_outsiders shmsquat|shmsquatp2p|strangers|secret|worldsize|bootwait\n");
    return 2;
  }
  int rc = mp_run(&o, body, arg);
  if (!strcmp(which, "strangers") && sa.held < 300) {
    fprintf(stderr, "[strangers] only %d connections were held\n", sa.held);
    rc = 1;
  }
  return rc;
}
