/*
 * Strangers on every listener a job opens: the job forms anyway, in about
 * the time it takes undisturbed, computes right, and keeps none of their
 * connections.
 *
 *   test_flood N
 *
 * Each rank runs the real library. This program defines listen(), so the
 * library's calls to it land here first: the real listen() runs, and the
 * port is posted on a board shared with the parent, whose attacker thread
 * at once opens SILENT connections that never say anything (500 per
 * listener, fewer only where the file limit forbids) and then keeps
 * sending garbage connections (random bytes, cut-off brigade magics) to
 * every listener it knows, 50 a second each, through init and the
 * collectives that follow (FLOOD_SILENT=n sets another count of silent
 * connections, for measurements by hand). The rank waits in listen() until the silent
 * connections are in the listen queue (that wait is not counted), so every
 * listener meets them before anyone could connect to it.
 *
 * A first run without the attacker gives the undisturbed init time; the run
 * with it must form the job within 2 s more (each rank times its own
 * brg_comm_init_env), get every element of every allreduce (and of one
 * point-to-point message per rank, over links dialed then) right, and,
 * while the attacker still holds its silent connections open, leave each
 * rank with no more descriptors than the job itself needs; after destroy,
 * exactly the ones it had before init.
 */

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"

#define MAX_LISTENERS 64
#define SILENT_MAX 500
#define GARBAGE_PER_S 50
#define SLACK_MS 2000
#define COUNT (1 << 16)
#define ROUNDS 40

typedef struct listener {
  int32_t posted; /* 1 once port/addr are valid */
  int32_t acked;  /* the attacker's silent connections are queued */
  int32_t rank;
  int32_t family;
  struct sockaddr_storage addr;
} listener;

typedef struct board {
  int32_t n; /* listeners posted */
  int32_t attack;
  int32_t stop;
  int32_t silent_per_listener;
  int32_t master_port;
  int32_t nranks;
  int32_t done; /* ranks past their body */
  int64_t init_ms[8];
  listener l[MAX_LISTENERS];
} board;

static board *g_board;
static int g_rank = -1;
static int64_t g_hook_ns; /* time this rank spent waiting in listen() */

int listen(int fd, int backlog) {
  static int (*real_listen)(int, int);
  if (!real_listen) real_listen = (int (*)(int, int))dlsym(RTLD_NEXT, "listen");
  int rc = real_listen(fd, backlog);
  if (rc != 0 || !g_board || g_rank < 0 || !__atomic_load_n(&g_board->attack, __ATOMIC_ACQUIRE))
    return rc;
  int64_t t0 = mp_now_ns();
  int i = __atomic_fetch_add(&g_board->n, 1, __ATOMIC_ACQ_REL);
  if (i < MAX_LISTENERS) {
    listener *l = &g_board->l[i];
    socklen_t len = sizeof l->addr;
    getsockname(fd, (struct sockaddr *)&l->addr, &len);
    l->rank = g_rank;
    __atomic_store_n(&l->posted, 1, __ATOMIC_RELEASE);
    /* Wait (at most 5 s) for the strangers to be queued. */
    while (!__atomic_load_n(&l->acked, __ATOMIC_ACQUIRE) && mp_now_ns() - t0 < 5000000000LL)
      mp_sleep_ms(1);
  }
  g_hook_ns += mp_now_ns() - t0;
  return rc;
}

static int count_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  if (!d) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (e->d_name[0] != '.') n++;
  closedir(d);
  return n - 1; /* the directory's own */
}

/* A connection to l, not waited for (loopback completes it at once). */
static int open_to(const listener *l) {
  int fd = socket(l->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  socklen_t len =
      l->addr.ss_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
  if (connect(fd, (const struct sockaddr *)&l->addr, len) != 0 && errno != EINPROGRESS) {
    close(fd);
    return -1;
  }
  return fd;
}

typedef struct attacker {
  int *silent;
  int nsilent, cap;
  uint64_t rng;
  long garbage_sent;
} attacker;

static uint64_t next_rand(attacker *a) {
  a->rng ^= a->rng << 13;
  a->rng ^= a->rng >> 7;
  a->rng ^= a->rng << 17;
  return a->rng;
}

static void send_garbage(attacker *a, const listener *l) {
  int fd = open_to(l);
  if (fd < 0) return;
  uint8_t buf[512];
  size_t n = 1 + next_rand(a) % sizeof buf;
  for (size_t k = 0; k < n; k++) buf[k] = (uint8_t)next_rand(a);
  /* Now and then the start of something brigade would recognise. */
  static const uint8_t magics[][4] = {{0x52, 0x47, 0x52, 0x42}, {0x54, 0x47, 0x52, 0x42}};
  if (next_rand(a) % 3 == 0) memcpy(buf, magics[next_rand(a) % 2], 4);
  (void)send(fd, buf, n, MSG_NOSIGNAL | MSG_DONTWAIT);
  close(fd);
  a->garbage_sent++;
}

static void *attack_main(void *arg) {
  attacker *a = arg;
  board *b = g_board;
  int handled = 0;
  int64_t next_garbage = mp_now_ns();
  int64_t give_up = mp_now_ns() + 90000000000LL; /* in case a rank never finishes */
  while (!__atomic_load_n(&b->stop, __ATOMIC_ACQUIRE) &&
         __atomic_load_n(&b->done, __ATOMIC_ACQUIRE) < b->nranks && mp_now_ns() < give_up) {
    int n = __atomic_load_n(&b->n, __ATOMIC_ACQUIRE);
    if (n > MAX_LISTENERS) n = MAX_LISTENERS;
    while (handled < n && __atomic_load_n(&b->l[handled].posted, __ATOMIC_ACQUIRE)) {
      listener *l = &b->l[handled];
      for (int k = 0; k < b->silent_per_listener && a->nsilent < a->cap; k++) {
        int fd = open_to(l);
        if (fd >= 0) a->silent[a->nsilent++] = fd;
      }
      for (int k = 0; k < 5; k++) send_garbage(a, l);
      __atomic_store_n(&l->acked, 1, __ATOMIC_RELEASE);
      handled++;
    }
    int64_t now = mp_now_ns();
    if (now >= next_garbage) {
      for (int i = 0; i < handled; i++) send_garbage(a, &b->l[i]);
      next_garbage = now + 1000000000LL / GARBAGE_PER_S;
    }
    mp_sleep_ms(1);
  }
  return NULL;
}

typedef struct run_cfg {
  int attacked;
} run_cfg;

static void set_env_int(const char *name, int v) {
  char buf[32];
  snprintf(buf, sizeof buf, "%d", v);
  setenv(name, buf, 1);
}

static int body_run(mp_ctx *ctx);

static int body(mp_ctx *ctx) {
  int rc = body_run(ctx);
  __atomic_fetch_add(&g_board->done, 1, __ATOMIC_ACQ_REL);
  return rc;
}

static int body_run(mp_ctx *ctx) {
  run_cfg *cfg = ctx->arg;
  g_rank = ctx->rank;
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  set_env_int("MASTER_PORT", g_board->master_port);
  set_env_int("RANK", ctx->rank);
  set_env_int("WORLD_SIZE", ctx->nranks);
  set_env_int("LOCAL_RANK", ctx->rank);
  set_env_int("LOCAL_WORLD_SIZE", ctx->nranks);

  int fds0 = count_fds();
  int64_t t0 = mp_now_ns();
  brg_comm *comm = NULL;
  brg_status st = brg_comm_init_env(&comm);
  int64_t init_ms = (mp_now_ns() - t0 - g_hook_ns) / 1000000;
  if (st != BRG_SUCCESS) {
    mp_fail("brg_comm_init_env (%s): %s: %s", cfg->attacked ? "attacked" : "undisturbed",
            brg_status_string(st), brg_comm_last_error(NULL));
    return 1;
  }
  g_board->init_ms[ctx->rank] = init_ms;
  int fds1 = count_fds();

  int32_t *x = malloc(COUNT * sizeof *x);
  int32_t base = 0;
  for (int r = 0; r < ctx->nranks; r++) base += r * 1000;
  for (int round = 0; round < ROUNDS && mp_failures() == 0; round++) {
    for (int i = 0; i < COUNT; i++) x[i] = ctx->rank * 1000 + (i + round) % 997;
    st = brg_allreduce(x, x, COUNT, BRG_INT32, BRG_SUM, comm, NULL);
    if (st != BRG_SUCCESS) {
      mp_fail("allreduce round %d: %s: %s", round, brg_status_string(st),
              brg_comm_last_error(comm));
      break;
    }
    for (int i = 0; i < COUNT; i++) {
      int32_t want = base + ctx->nranks * ((i + round) % 997);
      if (x[i] != want) {
        mp_fail("allreduce round %d: element %d is %d, expected %d", round, i, x[i], want);
        break;
      }
    }
    mp_sleep_ms(10); /* spread the rounds over the garbage */
  }
  /* Point-to-point links are dialed now, through the same crowd on the
   * point-to-point listeners: a message to the next rank, from the
   * previous one, both checked. */
  int next = (ctx->rank + 1) % ctx->nranks, prev = (ctx->rank - 1 + ctx->nranks) % ctx->nranks;
  for (int i = 0; i < COUNT; i++) x[i] = ctx->rank * 7919 + next * 31 + i;
  st = brg_send(x, COUNT, BRG_INT32, next, comm, NULL);
  if (st == BRG_SUCCESS) st = brg_recv(x, COUNT, BRG_INT32, prev, comm, NULL);
  if (st != BRG_SUCCESS)
    mp_fail("send to rank %d, recv from rank %d: %s: %s", next, prev, brg_status_string(st),
            brg_comm_last_error(comm));
  for (int i = 0; i < COUNT && st == BRG_SUCCESS; i++)
    if (x[i] != prev * 7919 + ctx->rank * 31 + i) {
      mp_fail("recv from rank %d: element %d is %d, expected %d", prev, i, x[i],
              prev * 7919 + ctx->rank * 31 + i);
      break;
    }
  free(x);
  st = brg_comm_destroy(comm);
  MP_CHECK(st == BRG_SUCCESS, "brg_comm_destroy: %s", brg_status_string(st));
  int fds2 = count_fds();
  /* The job's own: two ring sockets, the link sockets, a pipe or two,
   * the point-to-point listener and its eventfd; and up to 8 strangers
   * that listener, open for the communicator's life, holds while their
   * hello is due (runtime/exec/p2p/p2p.c, P2P_MAX_PENDING; 2 s each). */
  MP_CHECK(fds1 - fds0 <= 16 + 8, "%d descriptors open after init, %d before (strangers kept?)",
           fds1, fds0);
  MP_CHECK(fds2 == fds0, "%d descriptors open after destroy, %d before init", fds2, fds0);
  mp_info("init %lld ms (%s), descriptors %d -> %d -> %d", (long long)init_ms,
          cfg->attacked ? "attacked" : "undisturbed", fds0, fds1, fds2);
  return mp_failures() ? 1 : 0;
}

static int64_t run_once(int n, int attacked, attacker *a) {
  run_cfg cfg = {.attacked = attacked};
  memset(g_board, 0, sizeof *g_board);
  g_board->master_port = mp_free_port();
  g_board->nranks = n;
  g_board->silent_per_listener = a ? a->cap / (1 + 2 * n) : 0;
  int most = mp_env_int("FLOOD_SILENT", SILENT_MAX); /* to measure other counts by hand */
  if (g_board->silent_per_listener > most) g_board->silent_per_listener = most;
  __atomic_store_n(&g_board->attack, attacked, __ATOMIC_RELEASE);
  char name[64];
  snprintf(name, sizeof name, "flood-N%d-%s%s", n, mp_transport(), attacked ? "" : "-quiet");
  mp_opts o = {.name = name,
               .nranks = n,
               .deadline_ms = mp_env_int("MP_DEADLINE_MS", 100000),
               .init = MP_INIT_BARE,
               .victim = -1,
               .parent_thread = attacked ? attack_main : NULL,
               .parent_arg = a};
  int rc = mp_run(&o, body, &cfg);
  __atomic_store_n(&g_board->stop, 1, __ATOMIC_RELEASE);
  if (rc != 0) return -1;
  int64_t worst = 0;
  for (int r = 0; r < n; r++)
    if (g_board->init_ms[r] > worst) worst = g_board->init_ms[r];
  return worst;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 3;
  if (n < 2 || n > 8) {
    fprintf(stderr, "usage: test_flood N (2..8)\n");
    return 2;
  }
  g_board = mmap(NULL, sizeof *g_board, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (g_board == MAP_FAILED) return 2;

  /* Room for the silent connections (the attacker's ends live here). */
  struct rlimit rl;
  getrlimit(RLIMIT_NOFILE, &rl);
  rl.rlim_cur = rl.rlim_max;
  setrlimit(RLIMIT_NOFILE, &rl);
  getrlimit(RLIMIT_NOFILE, &rl);
  attacker a = {.rng = 0x9e3779b97f4a7c15ull};
  a.cap = (int)(rl.rlim_cur > 256 + (rlim_t)SILENT_MAX * (1 + 2 * n) ? SILENT_MAX * (1 + 2 * n)
                                                                     : (int)rl.rlim_cur - 256);
  a.silent = calloc((size_t)a.cap, sizeof *a.silent);

  int64_t quiet = run_once(n, 0, NULL);
  if (quiet < 0) {
    free(a.silent);
    fprintf(stderr, "FAIL: the undisturbed run failed\n");
    return 1;
  }
  int64_t t_attack0 = mp_now_ns();
  int64_t loud = run_once(n, 1, &a);
  int64_t attack_ms = (mp_now_ns() - t_attack0) / 1000000;
  int listeners = g_board->n;
  for (int i = 0; i < a.nsilent; i++) close(a.silent[i]);
  free(a.silent);
  printf("N=%d %s: init %lld ms undisturbed, %lld ms with %d listeners attacked (%d silent "
         "connections each, %ld garbage connections in %lld ms)\n",
         n, mp_transport(), (long long)quiet, (long long)loud, listeners,
         g_board->silent_per_listener, a.garbage_sent, (long long)attack_ms);
  if (loud < 0) {
    fprintf(stderr, "FAIL: the attacked run failed\n");
    return 1;
  }
  if (listeners < 1 + n) {
    fprintf(stderr, "FAIL: only %d listeners were seen (expected at least %d)\n", listeners, 1 + n);
    return 1;
  }
  if (loud > quiet + SLACK_MS) {
    fprintf(stderr, "FAIL: init took %lld ms under attack, %lld ms without (more than %d ms)\n",
            (long long)loud, (long long)quiet, SLACK_MS);
    return 1;
  }
  printf("PASS\n");
  return 0;
}
