#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "harness.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static mp_shared *g_shared;
static int g_rank = -1; /* in a rank: its rank; -1 in the parent */
static const char *g_name = "multiproc";
static int g_failures;

/* ---------------------------------------------------------------- helpers */

int64_t mp_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void mp_sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

int mp_env_int(const char *name, int defval) {
  const char *s = getenv(name);
  return s && *s ? atoi(s) : defval;
}

const char *mp_transport(void) {
  const char *s = getenv("BRIGADE_TRANSPORTS");
  return s && *s ? s : "default";
}

int mp_free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  int port = -1;
  if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
      getsockname(fd, (struct sockaddr *)&a, &len) == 0)
    port = ntohs(a.sin_port);
  close(fd);
  return port;
}

int mp_contains(const char *h, const char *n) {
  if (!h || !n) return 0;
  size_t ln = strlen(n);
  for (; *h; h++)
    if (strncasecmp(h, n, ln) == 0) return 1;
  return 0;
}

int mp_names_rank(const char *msg, int r) {
  if (!msg) return 0;
  /* "rank 2", "ranks 1, 2", "ranks 1,2 and 3", "rank=2", "peer 2", "peer rank 2" */
  for (const char *p = msg; *p; p++) {
    if (strncasecmp(p, "rank", 4) != 0 && strncasecmp(p, "peer", 4) != 0) continue;
    const char *q = p + 4;
    if (*q == 's') q++;
    while (*q == ' ' || *q == '=' || *q == ':' || *q == '#') q++;
    while (isdigit((unsigned char)*q)) {
      char *stop;
      long v = strtol(q, &stop, 10);
      if (v == r) return 1;
      q = stop;
      if (*q == ',') q++;
      while (*q == ' ') q++;
      if (strncmp(q, "and ", 4) == 0) q += 4;
    }
  }
  return 0;
}

mp_shared *mp_shared_area(void) {
  if (!g_shared) {
    void *p =
        mmap(NULL, sizeof(mp_shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      perror("mmap shared area");
      exit(1);
    }
    g_shared = p;
  }
  return g_shared;
}

int mp_wait_flag(int i, int timeout_ms) {
  mp_shared *sh = mp_shared_area();
  int64_t end = mp_now_ns() + (int64_t)timeout_ms * 1000000;
  while (!__atomic_load_n(&sh->flags[i], __ATOMIC_ACQUIRE)) {
    if (mp_now_ns() > end) return 0;
    mp_sleep_ms(1);
  }
  return 1;
}

static void vlogf(const char *tag, const char *fmt, va_list ap) {
  char buf[2048];
  vsnprintf(buf, sizeof buf, fmt, ap);
  if (g_rank >= 0)
    fprintf(stderr, "[%s rank %d] %s%s\n", g_name, g_rank, tag, buf);
  else
    fprintf(stderr, "[%s] %s%s\n", g_name, tag, buf);
  fflush(stderr);
  if (*tag && g_rank >= 0 && g_rank < MP_MAX_RANKS && g_shared && g_shared->reason[g_rank][0] == 0)
    snprintf(g_shared->reason[g_rank], MP_REASON_BYTES, "%.*s", MP_REASON_BYTES - 1, buf);
}

void mp_fail(const char *fmt, ...) {
  va_list ap;
  g_failures++;
  if (g_failures > 50) return; /* one broken call must not flood the log */
  va_start(ap, fmt);
  vlogf("FAIL: ", fmt, ap);
  va_end(ap);
}

int mp_failures(void) {
  return g_failures;
}

void mp_info(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vlogf("", fmt, ap);
  va_end(ap);
}

/* ------------------------------------------------------- shm bookkeeping */

#define MP_MAX_SHM 4096
typedef struct name_set {
  char *names[MP_MAX_SHM];
  int n;
} name_set;

static int set_has(const name_set *s, const char *name) {
  for (int i = 0; i < s->n; i++)
    if (strcmp(s->names[i], name) == 0) return 1;
  return 0;
}

static void set_add(name_set *s, const char *name) {
  if (s->n < MP_MAX_SHM && !set_has(s, name)) s->names[s->n++] = strdup(name);
}

static void set_free(name_set *s) {
  for (int i = 0; i < s->n; i++) free(s->names[i]);
  s->n = 0;
}

static int is_brigade(const char *name) {
  return strncmp(name, "brigade", 7) == 0;
}

static void shm_list(name_set *s) {
  DIR *d = opendir("/dev/shm");
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d)))
    if (is_brigade(e->d_name)) set_add(s, e->d_name);
  closedir(d);
}

/* Pulls "brigade..." out of a path such as "/dev/shm/brigade-1-2 (deleted)". */
static void note_path(name_set *seen, int *memfd_seen, const char *path) {
  const char *p = strstr(path, "/dev/shm/brigade");
  if (p) {
    char name[256];
    snprintf(name, sizeof name, "%s", p + strlen("/dev/shm/"));
    name[strcspn(name, " \n")] = 0;
    set_add(seen, name);
    return;
  }
  /* (the emulated CUDA module's GPU memory is memfds too, not a transport's) */
  if (strstr(path, "memfd:brigade") && !strstr(path, "memfd:brigade-emu-gpu")) *memfd_seen = 1;
}

static void shm_sample(pid_t pid, name_set *seen, int *memfd_seen) {
  char path[64], line[1024];
  snprintf(path, sizeof path, "/proc/%d/maps", (int)pid);
  FILE *f = fopen(path, "r");
  if (f) {
    while (fgets(line, sizeof line, f))
      if (strstr(line, "brigade")) note_path(seen, memfd_seen, line);
    fclose(f);
  }
  snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
  DIR *d = opendir(path);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    char link[512], target[512];
    snprintf(link, sizeof link, "/proc/%d/fd/%s", (int)pid, e->d_name);
    ssize_t n = readlink(link, target, sizeof target - 1);
    if (n <= 0) continue;
    target[n] = 0;
    if (strstr(target, "brigade")) note_path(seen, memfd_seen, target);
  }
  closedir(d);
}

/* Does `name` hold `pid` as a whole decimal token? */
static int name_has_pid(const char *name, pid_t pid) {
  char tok[32];
  int l = snprintf(tok, sizeof tok, "%d", (int)pid);
  for (const char *p = strstr(name, tok); p; p = strstr(p + 1, tok)) {
    int before = p > name && isdigit((unsigned char)p[-1]);
    int after = isdigit((unsigned char)p[l]);
    if (!before && !after) return 1;
  }
  return 0;
}

/* --------------------------------------------------------------- the ranks */

static void set_env_int(const char *name, int v) {
  char buf[32];
  snprintf(buf, sizeof buf, "%d", v);
  setenv(name, buf, 1);
}

static void __attribute__((noreturn))
rank_main(const mp_opts *o, int rank, int idfd, pid_t parent, mp_body_fn body, void *arg) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(3);
  g_rank = rank;
  mp_shared *sh = mp_shared_area();
  __atomic_store_n(&sh->pids[rank], (int32_t)getpid(), __ATOMIC_RELEASE);

  brg_unique_id id;
  memset(&id, 0, sizeof id);
  if (o->init == MP_INIT_ID || o->init == MP_INIT_NONE) {
    size_t got = 0;
    while (got < sizeof id) {
      ssize_t n = read(idfd, (char *)&id + got, sizeof id - got);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        mp_fail("the parent sent no unique id (it failed to create one)");
        _exit(2);
      }
      got += (size_t)n;
    }
  }
  close(idfd);

  mp_ctx ctx = {.rank = rank, .nranks = o->nranks, .id = &id, .shared = sh, .arg = arg};
  if (o->init == MP_INIT_ID || o->init == MP_INIT_ENV) {
    brg_status st;
    if (o->init == MP_INIT_ENV) {
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      set_env_int("MASTER_PORT", o->master_port);
      set_env_int("RANK", rank);
      set_env_int("WORLD_SIZE", o->nranks);
      set_env_int("LOCAL_RANK", rank);
      set_env_int("LOCAL_WORLD_SIZE", o->nranks);
      st = brg_comm_init_env(&ctx.comm);
    } else {
      st = brg_comm_init(&ctx.comm, o->nranks, &id, rank);
    }
    if (st != BRG_SUCCESS) {
      mp_fail("%s: %s: %s", o->init == MP_INIT_ENV ? "brg_comm_init_env" : "brg_comm_init",
              brg_status_string(st), brg_comm_last_error(NULL));
      _exit(2);
    }
    int r = -1, n = -1;
    MP_CHECK(brg_comm_rank(ctx.comm, &r) == BRG_SUCCESS && r == rank,
             "brg_comm_rank says %d, expected %d", r, rank);
    MP_CHECK(brg_comm_size(ctx.comm, &n) == BRG_SUCCESS && n == o->nranks,
             "brg_comm_size says %d, expected %d", n, o->nranks);
  }

  int rc = body(&ctx);
  if (rc != 0 && mp_failures() == 0) mp_fail("body returned %d", rc);
  if (ctx.comm) {
    brg_status st = brg_comm_destroy(ctx.comm);
    MP_CHECK(st == BRG_SUCCESS, "brg_comm_destroy: %s: %s", brg_status_string(st),
             brg_comm_last_error(NULL));
  }
  fflush(stdout);
  fflush(stderr);
  _exit(mp_failures() ? 1 : 0);
}

/* -------------------------------------------------------------- the parent */

typedef struct rank_state {
  pid_t pid;
  int done;
  int status;
  int timed_out;
} rank_state;

static int g_cut_short_by = -1; /* rank whose failure shortened the deadline */

static void describe(const mp_opts *o, int r, const rank_state *s, const mp_shared *sh, int *bad) {
  int expect_kill = (r == o->victim);
  const char *why = sh->reason[r][0] ? sh->reason[r] : "";
  if (s->timed_out) {
    if (g_cut_short_by >= 0)
      fprintf(stderr, "[%s] rank %d was still running 30 s after rank %d failed (killed)%s%s\n",
              o->name, r, g_cut_short_by, *why ? "; first failure: " : "", why);
    else
      fprintf(stderr, "[%s] rank %d did not finish within the %d ms deadline (killed)%s%s\n",
              o->name, r, o->deadline_ms, *why ? "; first failure: " : "", why);
    *bad = 1;
  } else if (WIFSIGNALED(s->status)) {
    int sig = WTERMSIG(s->status);
    if (expect_kill && sig == SIGKILL) return;
    fprintf(stderr, "[%s] rank %d died from signal %d (%s)%s%s\n", o->name, r, sig, strsignal(sig),
            *why ? "; first failure: " : "", why);
    *bad = 1;
  } else if (WIFEXITED(s->status)) {
    int code = WEXITSTATUS(s->status);
    if (expect_kill) {
      fprintf(stderr, "[%s] rank %d (the victim) exited with %d before it was killed%s%s\n",
              o->name, r, code, *why ? ": " : "", why);
      *bad = 1;
    } else if (code != 0) {
      fprintf(stderr, "[%s] rank %d failed (exit %d): %s\n", o->name, r, code,
              *why ? why : "no reason recorded");
      *bad = 1;
    }
  }
}

int mp_run(const mp_opts *opts, mp_body_fn body, void *arg) {
  mp_opts o = *opts;
  if (!o.name) o.name = "run";
  if (o.deadline_ms <= 0) o.deadline_ms = 120000;
  if (o.nranks < 1 || o.nranks > MP_MAX_RANKS) {
    fprintf(stderr, "[%s] bad nranks %d\n", o.name, o.nranks);
    return 1;
  }
  if (o.victim_signal == 0) o.victim = -1;
  g_name = o.name;
  mp_shared *sh = mp_shared_area();
  memset(sh, 0, sizeof *sh);

  name_set before = {0}, seen = {0}, after = {0};
  int memfd_seen = 0;
  shm_list(&before);

  int64_t t0 = mp_now_ns();
  fflush(stdout);
  fflush(stderr);
  pid_t parent = getpid();
  rank_state st[MP_MAX_RANKS];
  int idfds[MP_MAX_RANKS];
  memset(st, 0, sizeof st);
  for (int r = 0; r < o.nranks; r++) {
    int p[2];
    if (pipe(p) != 0) {
      perror("pipe");
      return 1;
    }
    pid_t pid = fork();
    if (pid < 0) {
      perror("fork");
      return 1;
    }
    if (pid == 0) {
      close(p[1]);
      for (int k = 0; k < r; k++) close(idfds[k]);
      rank_main(&o, r, p[0], parent, body, arg);
    }
    close(p[0]);
    idfds[r] = p[1];
    st[r].pid = pid;
  }

  int bad = 0;
  g_cut_short_by = -1;
  if (o.init == MP_INIT_ID || o.init == MP_INIT_NONE) {
    brg_unique_id id;
    brg_status s = brg_get_unique_id(&id);
    if (s != BRG_SUCCESS) {
      fprintf(stderr, "[%s] brg_get_unique_id: %s: %s\n", o.name, brg_status_string(s),
              brg_comm_last_error(NULL));
      bad = 1;
    } else {
      for (int r = 0; r < o.nranks; r++)
        if (write(idfds[r], &id, sizeof id) != (ssize_t)sizeof id) bad = 1;
    }
  }
  for (int r = 0; r < o.nranks; r++) close(idfds[r]);

  pthread_t thr;
  int have_thr = 0;
  if (o.parent_thread) have_thr = pthread_create(&thr, NULL, o.parent_thread, o.parent_arg) == 0;

  int64_t deadline = t0 + (int64_t)o.deadline_ms * 1000000;
  int64_t trigger_ns = 0, last_sample = 0;
  int victim_signalled = 0, victim_killed = 0, remaining = o.nranks;
  while (remaining > 0) {
    int64_t now = mp_now_ns();
    if (now - last_sample > 50 * 1000000LL) {
      for (int r = 0; r < o.nranks; r++)
        if (!st[r].done) shm_sample(st[r].pid, &seen, &memfd_seen);
      last_sample = now;
    }
    for (int r = 0; r < o.nranks; r++) {
      if (st[r].done) continue;
      int status;
      pid_t w = waitpid(st[r].pid, &status, WNOHANG);
      if (w == st[r].pid) {
        st[r].done = 1;
        st[r].status = status;
        remaining--;
        int failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0) && r != o.victim;
        /* A failed rank can leave the others waiting for it: give them a
         * while to notice, not the whole deadline. */
        if (failed && deadline > now + 30000 * 1000000LL) {
          deadline = now + 30000 * 1000000LL;
          g_cut_short_by = r;
        }
      }
    }
    if (o.victim >= 0 && !victim_signalled && !st[o.victim].done) {
      int all = 1;
      for (int r = 0; r < o.nranks; r++)
        if (__atomic_load_n(&sh->progress[r], __ATOMIC_ACQUIRE) < o.victim_after) all = 0;
      if (all && trigger_ns == 0) trigger_ns = now + (int64_t)o.victim_delay_ms * 1000000;
      if (trigger_ns && now >= trigger_ns) {
        __atomic_store_n(&sh->signal_ns, mp_now_ns(), __ATOMIC_RELEASE);
        kill(st[o.victim].pid, o.victim_signal);
        victim_signalled = 1;
        victim_killed = o.victim_signal == SIGKILL;
      }
    }
    if (o.victim >= 0 && victim_signalled && !victim_killed && !st[o.victim].done) {
      int others = 0;
      for (int r = 0; r < o.nranks; r++)
        if (r != o.victim && !st[r].done) others++;
      if (others == 0) {
        kill(st[o.victim].pid, SIGKILL);
        victim_killed = 1;
      }
    }
    if (remaining == 0) break;
    if (now > deadline) {
      for (int r = 0; r < o.nranks; r++)
        if (!st[r].done) {
          kill(st[r].pid, SIGKILL);
          waitpid(st[r].pid, &st[r].status, 0);
          st[r].done = 1;
          st[r].timed_out = 1;
        }
      break;
    }
    mp_sleep_ms(5);
  }
  if (have_thr) pthread_join(thr, NULL);

  for (int r = 0; r < o.nranks; r++) describe(&o, r, &st[r], sh, &bad);

  /* Leftover shared memory: names a rank mapped or held open that still
   * exist, and new names that carry one of our ranks' pids. */
  shm_list(&after);
  int leaked = 0;
  for (int i = 0; i < after.n; i++) {
    const char *nm = after.names[i];
    int ours = set_has(&seen, nm);
    for (int r = 0; r < o.nranks && !ours; r++)
      if (!set_has(&before, nm) && name_has_pid(nm, st[r].pid)) ours = 1;
    if (!ours) continue;
    fprintf(stderr, "[%s] leaked /dev/shm/%s (removing it)\n", o.name, nm);
    char path[512];
    snprintf(path, sizeof path, "/dev/shm/%s", nm);
    unlink(path);
    leaked = 1;
  }
  if (leaked) bad = 1;
  int any_shm = seen.n > 0 || memfd_seen;
  if (o.expect_no_shm && any_shm) {
    fprintf(stderr, "[%s] ranks mapped brigade shared memory (%s) although only tcp was allowed\n",
            o.name, seen.n ? seen.names[0] : "memfd");
    bad = 1;
  }
  if (o.expect_shm && !any_shm) {
    fprintf(stderr,
            "[%s] no rank mapped a /dev/shm/brigade* or memfd:brigade* segment: "
            "was the shm transport used?\n",
            o.name);
    bad = 1;
  }
  set_free(&before);
  set_free(&seen);
  set_free(&after);

  double secs = (double)(mp_now_ns() - t0) / 1e9;
  printf("%s %s (%d ranks, %s, %.2f s)\n", bad ? "FAIL" : "ok  ", o.name, o.nranks, mp_transport(),
         secs);
  fflush(stdout);
  return bad;
}
