/*
 * The cuda_ipc transport (transport/cuda_ipc.c) on its own, without a
 * communicator: one link, receiver and sender as the runtime would call
 * them, and every byte of what crosses it checked.
 *
 *   procs    receiver and sender are forked processes that exchange their
 *            GPU descriptions and the 256-byte info over a socketpair:
 *            receiver on GPU 0 and sender on GPU 1, the reverse, and both
 *            on GPU 0;
 *   threads  two threads of this process (one `process` token): the
 *            sender's fifo.data is the receiver's pointer;
 *   bad      a zeroed or garbage info, a size that differs, no GPU
 *            parameters; close() after every failure.
 *
 * In each link the sender's kernel (kern.copy on its stream) writes ranges
 * of the receiver's memory (one byte, 7, 4099, the whole region, at odd
 * offsets); the receiver reads the whole region back with mem_copy and
 * compares it with what it must hold: the ranges written so far, from
 * pat(), and zero elsewhere. Then the receiver's kernel writes and the
 * sender's kernel reads through its mapping. Afterwards no shared memory
 * name of this run's comm_id is left in /dev/shm.
 *
 * Each process of a link makes a context on its own GPU only, and in the
 * "visible" cases each process sees only its own GPU (as with a
 * CUDA_VISIBLE_DEVICES per process; BRIGADE_EMU_VISIBLE on the emulated
 * module): the peer's GPU, which it cannot name, must still be found
 * reachable by its UUID, the link in GPU memory.
 *
 *   test_cuda_ipc_link           exits 77 without a GPU
 *   test_cuda_ipc_link nopeer    BRIGADE_EMU_NO_PEER=1: GPUs 0 and 1 do not
 *                                reach each other; their links must fall
 *                                back to pinned host memory (host_fallback
 *                                1) or fail naming it (host_fallback 0)
 *
 * BRIGADE_TEST_NO_SKIP=1: no GPU is a failure. The parent never touches
 * CUDA before it forks (a CUDA context does not survive fork): a child
 * probes the GPUs for it.
 */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "device.h"
#include "transport.h"

#define SKIP 77
#define NSLOTS 4
#define SLOT_BYTES 16384
#define REGION ((size_t)NSLOTS * SLOT_BYTES)
#define CHILD_ALARM_S 45

static uint64_t comm_id;
static int nopeer;

/* The ranges a kernel writes, in order: the whole region first, then odd
 * sizes at odd offsets, the first and last byte among them. */
typedef struct range {
  size_t off, len;
} range;
static const range fwd[] = {{0, REGION},           {0, 1},       {5, 7},    {REGION - 1, 1},
                            {REGION - 4099, 4099}, {4097, 4099}, {12289, 7}};
static const range back[] = {{0, REGION}, {3, 1}, {REGION - 7, 7}, {777, 4099}};
#define NFWD (int)(sizeof fwd / sizeof fwd[0])
#define NBACK (int)(sizeof back / sizeof back[0])
#define FWD_SEED(k) (1u + (unsigned)(k))
#define BACK_SEED(k) (101u + (unsigned)(k))

/* Byte i of the region as written with `seed`: never 0 (the region starts
 * zeroed), and different for every seed below 255 at every i, so a write
 * that did not happen shows wherever it should have been. */
static unsigned char pat(unsigned seed, size_t i) {
  uint32_t h = (uint32_t)i * 2654435761u;
  h ^= h >> 15;
  h *= 0x2c1b3c6du;
  h ^= h >> 12;
  return (unsigned char)((h % 255u + seed) % 255u + 1u);
}

/* One end of a link under test. */
typedef struct end {
  const brg__cuda_api *api;
  const char *who; /* for messages: "procs 0<-1 receiver" */
  int fd;          /* to the other end */
  int failures;
} end;

#define EXPECT(e, cond, ...)                                                                       \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      fprintf(stderr, "FAIL: %s: ", (e)->who);                                                     \
      fprintf(stderr, __VA_ARGS__);                                                                \
      fprintf(stderr, "\n");                                                                       \
      (e)->failures++;                                                                             \
    }                                                                                              \
  } while (0)

static int cuda_ok(end *e, int rc, const char *what) {
  EXPECT(e, rc == 0, "%s: %s", what, e->api->drv.error_string(rc));
  return rc == 0;
}

static int xwrite(end *e, const void *p, size_t n) {
  const char *c = p;
  while (n > 0) {
    ssize_t w = write(e->fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      EXPECT(e, 0, "writing to the other end: %s", strerror(errno));
      return 0;
    }
    c += w;
    n -= (size_t)w;
  }
  return 1;
}

static int xread(end *e, void *p, size_t n) {
  char *c = p;
  while (n > 0) {
    ssize_t r = read(e->fd, c, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      EXPECT(e, 0, "reading from the other end: %s", r == 0 ? "it went away" : strerror(errno));
      return 0;
    }
    c += r;
    n -= (size_t)r;
  }
  return 1;
}

/* Round markers: each end checks it is at the step the other one is. */
static int ack_send(end *e, uint32_t round) {
  return xwrite(e, &round, sizeof round);
}
static int ack_wait(end *e, uint32_t round) {
  uint32_t got = 0;
  if (!xread(e, &got, sizeof got)) return 0;
  EXPECT(e, got == round, "out of step: the other end says %u, expected %u", got, round);
  return got == round;
}

static uint64_t random64(void) {
  uint64_t v = 0;
  while (getrandom(&v, sizeof v, 0) != (ssize_t)sizeof v) {}
  return v;
}

static void desc_of(end *e, brg__gpu_desc *d, uint64_t process, int gpu) {
  memset(d, 0, sizeof *d);
  d->process = process;
  d->pid = (int32_t)getpid();
  d->gpu = gpu;
  cuda_ok(e, e->api->drv.device_uuid(d->uuid), "device_uuid");
}

static brg__conn_params params_of(int rank, int peer, const brg__gpu_link_params *g) {
  return (brg__conn_params){.rank = rank,
                            .peer = peer,
                            .nranks = 2,
                            .nslots = NSLOTS,
                            .slot_bytes = SLOT_BYTES,
                            .comm_id = comm_id,
                            .timeout_ms = 30000,
                            .gpu = g};
}

/* Names in /dev/shm of this run's host FIFOs; with `unlink_them`, removed. */
static int shm_names_left(int unlink_them) {
  char needle[64];
  snprintf(needle, sizeof needle, "brigade-gpufifo-%016llx", (unsigned long long)comm_id);
  DIR *d = opendir("/dev/shm");
  if (!d) return 0;
  int n = 0;
  struct dirent *de;
  while ((de = readdir(d)) != NULL) {
    if (!strstr(de->d_name, needle)) continue;
    n++;
    if (unlink_them) {
      fprintf(stderr, "left in /dev/shm: %s (removed)\n", de->d_name);
      char path[512];
      snprintf(path, sizeof path, "/dev/shm/%s", de->d_name);
      unlink(path);
    }
  }
  closedir(d);
  return n;
}

/* Writes pat(seed) at [r.off, r.off + r.len) of `dst` with a kernel on
 * `st`, from `dsrc` (device memory of this end's GPU), and waits for it. */
static int kernel_write(end *e, char *dst, void *dsrc, unsigned char *host, range r, unsigned seed,
                        void *st) {
  for (size_t i = 0; i < r.len; i++) host[i] = pat(seed, r.off + i);
  return cuda_ok(e, e->api->drv.mem_copy(dsrc, host, r.len), "mem_copy to the source") &&
         cuda_ok(e, e->api->kern.copy(dst + r.off, NULL, dsrc, r.len, st),
                 "kern.copy into the link's memory") &&
         cuda_ok(e, e->api->drv.stream_sync(st), "stream_sync after kern.copy");
}

/* `got` (the whole region) against `want` after writing r with seed. */
static void check_region(end *e, const unsigned char *got, unsigned char *want, range r,
                         unsigned seed, const char *how) {
  for (size_t i = 0; i < r.len; i++) want[r.off + i] = pat(seed, r.off + i);
  size_t bad = 0, first = REGION;
  for (size_t i = 0; i < REGION; i++)
    if (got[i] != want[i]) {
      if (!bad) first = i;
      bad++;
    }
  EXPECT(e, bad == 0,
         "%s after writing [%zu, +%zu) (seed %u): %zu of %zu bytes wrong, the first at %zu: "
         "0x%02x, expected 0x%02x",
         how, r.off, r.len, seed, bad, REGION, first, got[first < REGION ? first : 0],
         want[first < REGION ? first : 0]);
}

/* A link to set up: receiver's GPU <- sender's GPU. */
typedef struct link_case {
  const char *name;
  int recv_gpu, send_gpu;
  int host_fallback;
  int expect_on_host;
  /* receiver first tries host_fallback 0, which must fail (no peer access) */
  int expect_no_fallback_fails;
  int threads; /* both ends in this process (one process token) */
  /* each end's process sees its own GPU only (BRIGADE_EMU_VISIBLE, as a
   * per-process CUDA_VISIBLE_DEVICES), as its device 0 */
  int visible;
} link_case;

/* What the receiver sends after recv_setup. */
typedef struct setup_msg {
  int32_t status;
  int32_t on_host;
  uint64_t ptr; /* its fifo.data */
  unsigned char info[BRG__CONN_INFO_BYTES];
} setup_msg;

/* The emulated module's count of devices this process made a context on
 * (brg__emu_context(-1)); -1 with another module. */
static int contexts_made(void) {
  const char *path = getenv("BRIGADE_CUDA_MODULE");
  void *h = path ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : NULL;
  void *sym = h ? dlsym(h, "brg__emu_context") : NULL;
  int (*fn)(int);
  memcpy(&fn, &sym, sizeof fn);
  int n = fn ? fn(-1) : -1;
  if (h) dlclose(h);
  return n;
}

/* A process with one end makes a context on its own GPU only: finding the
 * peer's GPU must not visit the others (a context costs memory and
 * time on each, and every process would have one on every GPU). */
static void check_contexts(end *e, const link_case *lc) {
  int n = lc->threads ? -1 : contexts_made();
  EXPECT(e, n < 0 || n == 1, "this process made contexts on %d devices, expected 1 (its own)", n);
}

/* An end on `gpu` tells the other its GPU and learns the other's. */
static int meet(end *e, int gpu, uint64_t process, brg__gpu_desc *self, brg__gpu_desc *peer) {
  if (!cuda_ok(e, e->api->drv.set_device(gpu), "set_device")) return 0;
  desc_of(e, self, process, gpu);
  return xwrite(e, self, sizeof *self) && xread(e, peer, sizeof *peer);
}

/* Closes an end's link (which must leave the conn clear) and frees its
 * GPU buffer, stream and host buffers. */
static void finish(end *e, brg__conn *c, void *dbuf, void *st, void *got, void *want, void *host) {
  c->ops->close(c);
  EXPECT(e, c->priv == NULL && c->fifo.data == NULL, "close left the conn set");
  if (dbuf) e->api->drv.mem_free(dbuf);
  if (st) e->api->drv.stream_destroy(st);
  free(got);
  free(want);
  free(host);
}

static void receiver(end *e, const link_case *lc, uint64_t process) {
  const brg__cuda_api *api = e->api;
  brg__gpu_desc self, peer;
  if (!meet(e, lc->visible ? 0 : lc->recv_gpu, process, &self, &peer)) return;
  brg__gpu_link_params g = {.api = api, .self = self, .peer = peer, .bytes = REGION};
  brg__conn_params p = params_of(1, 0, &g);
  brg__errbuf err = {0};
  brg__conn c = {.ops = &brg__transport_cuda_ipc, .peer = 0};
  setup_msg m = {0};

  if (lc->expect_no_fallback_fails) {
    brg_status s = c.ops->recv_setup(&c, &p, m.info, &err);
    EXPECT(e, s == BRG_ERR_UNAVAILABLE, "recv_setup with host_fallback 0 returned %s, expected %s",
           brg_status_string(s), brg_status_string(BRG_ERR_UNAVAILABLE));
    EXPECT(e, strstr(err.msg, "no peer access") != NULL,
           "recv_setup's message \"%s\" does not name \"no peer access\"", err.msg);
    c.ops->close(&c);
    EXPECT(e, c.priv == NULL && c.fifo.data == NULL, "close left the conn set");
    memset(&err, 0, sizeof err);
  }
  g.host_fallback = lc->host_fallback;
  brg_status s = c.ops->recv_setup(&c, &p, m.info, &err);
  EXPECT(e, s == BRG_SUCCESS, "recv_setup: %s: %s", brg_status_string(s), err.msg);
  void *st = NULL;
  unsigned char *got = calloc(1, REGION), *want = calloc(1, REGION), *host = calloc(1, REGION);
  void *dsrc = NULL;
  if (!got || !want || !host) {
    EXPECT(e, 0, "out of host memory");
    s = BRG_ERR_NO_MEMORY;
  }
  if (s == BRG_SUCCESS) {
    check_contexts(e, lc);
    m.on_host = brg__cuda_ipc_on_host(&c);
    m.ptr = (uint64_t)(uintptr_t)c.fifo.data;
    EXPECT(e, m.on_host == lc->expect_on_host, "on_host %d, expected %d", m.on_host,
           lc->expect_on_host);
    EXPECT(e, c.fifo.data && c.fifo.nslots == NSLOTS && c.fifo.slot_bytes == SLOT_BYTES,
           "fifo view: data %p, %d slots of %zu", (void *)c.fifo.data, c.fifo.nslots,
           c.fifo.slot_bytes);
    EXPECT(e, !c.fifo.ctrl && !c.fifo.meta, "a gpu_memory link has no ctrl or meta");
    /* The name the sender's process opens is there while the link is (so
     * the check afterwards that it is gone means something); one process
     * needs none. */
    int names = shm_names_left(0), want_names = m.on_host && !lc->threads;
    EXPECT(e, names == want_names, "%d host FIFO names of this run in /dev/shm, expected %d", names,
           want_names);
    /* Zeroed before the sender sees it: the reference starts at zero. */
    if (!cuda_ok(e, api->drv.mem_copy(c.fifo.data, want, REGION), "zeroing the region"))
      s = BRG_ERR_SYSTEM;
  }
  m.status = s;
  if (!xwrite(e, &m, sizeof m) || s != BRG_SUCCESS) goto out;
  int32_t sent = 0;
  if (!xread(e, &sent, sizeof sent) || sent != BRG_SUCCESS) goto out;

  for (int k = 0; k < NFWD; k++) {
    if (!ack_wait(e, (uint32_t)k)) goto out;
    memset(got, 0xee, REGION);
    if (!cuda_ok(e, api->drv.mem_copy(got, c.fifo.data, REGION), "mem_copy of the region"))
      goto out;
    check_region(e, got, want, fwd[k], FWD_SEED(k), "receiver's mem_copy");
    if (!ack_send(e, 50u + (uint32_t)k)) goto out; /* checked: the next may come */
  }
  if (!cuda_ok(e, api->drv.stream_create(&st), "stream_create") ||
      !cuda_ok(e, api->drv.mem_alloc(&dsrc, REGION), "mem_alloc"))
    goto out;
  for (int k = 0; k < NBACK; k++) {
    if (!kernel_write(e, c.fifo.data, dsrc, host, back[k], BACK_SEED(k), st) ||
        !ack_send(e, 100u + (uint32_t)k) || !ack_wait(e, 150u + (uint32_t)k))
      goto out;
  }
  /* The sender unmaps first; the owner frees after. */
  ack_wait(e, 200u);
out:
  finish(e, &c, dsrc, st, got, want, host);
}

static void sender(end *e, const link_case *lc, uint64_t process) {
  const brg__cuda_api *api = e->api;
  brg__gpu_desc self, peer;
  if (!meet(e, lc->visible ? 0 : lc->send_gpu, process, &self, &peer)) return;
  setup_msg m;
  if (!xread(e, &m, sizeof m) || m.status != BRG_SUCCESS) return;
  brg__gpu_link_params g = {
      .api = api, .self = self, .peer = peer, .bytes = REGION, .host_fallback = lc->host_fallback};
  brg__conn_params p = params_of(0, 1, &g);
  brg__errbuf err = {0};
  brg__conn c = {.ops = &brg__transport_cuda_ipc, .peer = 1};
  void *st = NULL, *dbuf = NULL;
  unsigned char *got = calloc(1, REGION), *want = calloc(1, REGION), *host = calloc(1, REGION);
  int32_t s = c.ops->send_connect(&c, &p, m.info, &err);
  EXPECT(e, s == BRG_SUCCESS, "send_connect: %s: %s", brg_status_string(s), err.msg);
  if (s == BRG_SUCCESS && (!got || !want || !host)) {
    EXPECT(e, 0, "out of host memory");
    s = BRG_ERR_NO_MEMORY;
  }
  if (s == BRG_SUCCESS) {
    check_contexts(e, lc);
    /* Mapped by both ends: the name is gone already, so that a rank
     * killed from now on leaves nothing in /dev/shm. */
    int names = shm_names_left(0);
    EXPECT(e, names == 0, "%d host FIFO names of this run in /dev/shm once the sender mapped it",
           names);
    int on_host = brg__cuda_ipc_on_host(&c);
    EXPECT(e, on_host == lc->expect_on_host, "on_host %d, expected %d", on_host,
           lc->expect_on_host);
    EXPECT(e, c.fifo.data && c.fifo.nslots == NSLOTS && c.fifo.slot_bytes == SLOT_BYTES,
           "fifo view: data %p, %d slots of %zu", (void *)c.fifo.data, c.fifo.nslots,
           c.fifo.slot_bytes);
    if (lc->threads)
      EXPECT(e, (uint64_t)(uintptr_t)c.fifo.data == m.ptr,
             "fifo.data %p is not the receiver's pointer 0x%llx", (void *)c.fifo.data,
             (unsigned long long)m.ptr);
    if (!cuda_ok(e, api->drv.stream_create(&st), "stream_create") ||
        !cuda_ok(e, api->drv.mem_alloc(&dbuf, REGION), "mem_alloc"))
      s = BRG_ERR_SYSTEM;
  }
  if (!xwrite(e, &s, sizeof s) || s != BRG_SUCCESS) goto out;

  for (int k = 0; k < NFWD; k++) {
    if (!kernel_write(e, c.fifo.data, dbuf, host, fwd[k], FWD_SEED(k), st) ||
        !ack_send(e, (uint32_t)k) || !ack_wait(e, 50u + (uint32_t)k))
      goto out;
    for (size_t i = 0; i < fwd[k].len; i++) want[fwd[k].off + i] = pat(FWD_SEED(k), fwd[k].off + i);
  }
  /* What the receiver's kernel wrote, read by this end's kernel through
   * the mapping. */
  for (int k = 0; k < NBACK; k++) {
    if (!ack_wait(e, 100u + (uint32_t)k)) goto out;
    memset(got, 0xee, REGION);
    if (!cuda_ok(e, api->kern.copy(dbuf, NULL, c.fifo.data, REGION, st),
                 "kern.copy from the link's memory") ||
        !cuda_ok(e, api->drv.stream_sync(st), "stream_sync") ||
        !cuda_ok(e, api->drv.mem_copy(got, dbuf, REGION), "mem_copy"))
      goto out;
    check_region(e, got, want, back[k], BACK_SEED(k), "sender's kernel read through its mapping");
    if (!ack_send(e, 150u + (uint32_t)k)) goto out;
  }
  c.ops->close(&c);
  ack_send(e, 200u);
out:
  finish(e, &c, dbuf, st, got, want, host); /* a second close is a no-op */
}

/* ---- the two ends as processes ---- */

static const brg__cuda_api *child_api(void) {
  const char *why = "";
  const brg__cuda_api *api = brg__device_api(&why);
  if (!api)
    fprintf(stderr, "FAIL: child %d: no GPU after the probe found one: %s\n", getpid(), why);
  return api;
}

static pid_t spawn_end(const link_case *lc, int fd, int other_fd, int recv) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid != 0) return pid;
  close(other_fd);
  alarm(CHILD_ALARM_S);
  char who[96];
  snprintf(who, sizeof who, "%s %s", lc->name, recv ? "receiver" : "sender");
  if (lc->visible) { /* before the module is first loaded here */
    char g[16];
    snprintf(g, sizeof g, "%d", recv ? lc->recv_gpu : lc->send_gpu);
    setenv("BRIGADE_EMU_VISIBLE", g, 1);
  }
  end e = {.api = child_api(), .who = who, .fd = fd};
  if (!e.api) _exit(1);
  if (recv)
    receiver(&e, lc, random64());
  else
    sender(&e, lc, random64());
  fflush(NULL);
  _exit(e.failures ? 1 : 0);
}

static int child_failed(pid_t pid, const char *name, const char *role) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return 0;
  if (WIFSIGNALED(status))
    fprintf(stderr, "FAIL: %s: the %s died of signal %d\n", name, role, WTERMSIG(status));
  else
    fprintf(stderr, "FAIL: %s: the %s failed (exit %d)\n", name, role, WEXITSTATUS(status));
  return 1;
}

static int run_procs(const link_case *lc) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) {
    fprintf(stderr, "FAIL: socketpair: %s\n", strerror(errno));
    return 1;
  }
  pid_t r = spawn_end(lc, sv[0], sv[1], 1);
  pid_t s = spawn_end(lc, sv[1], sv[0], 0);
  close(sv[0]);
  close(sv[1]);
  int bad = child_failed(r, lc->name, "receiver") + child_failed(s, lc->name, "sender");
  return bad;
}

/* ---- the two ends as threads ---- */

typedef struct thread_end {
  end e;
  const link_case *lc;
  uint64_t process;
  int recv;
} thread_end;

static void *thread_main(void *arg) {
  thread_end *t = arg;
  if (t->recv)
    receiver(&t->e, t->lc, t->process);
  else
    sender(&t->e, t->lc, t->process);
  /* An end that stopped early must not leave the other waiting. */
  shutdown(t->e.fd, SHUT_RDWR);
  return NULL;
}

static int run_threads(const brg__cuda_api *api, const link_case *lc) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) {
    fprintf(stderr, "FAIL: socketpair: %s\n", strerror(errno));
    return 1;
  }
  char rwho[96], swho[96];
  snprintf(rwho, sizeof rwho, "%s receiver", lc->name);
  snprintf(swho, sizeof swho, "%s sender", lc->name);
  uint64_t process = random64();
  thread_end te[2] = {{.e = {.api = api, .who = rwho, .fd = sv[0]}, lc, process, 1},
                      {.e = {.api = api, .who = swho, .fd = sv[1]}, lc, process, 0}};
  pthread_t th[2];
  for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, thread_main, &te[i]);
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  close(sv[0]);
  close(sv[1]);
  return te[0].e.failures + te[1].e.failures;
}

/* ---- bad input ---- */

static void expect_fails(end *e, const char *what, brg__conn *c, brg_status got, brg_status want,
                         const brg__errbuf *err, const char *needle) {
  printf("  %-44s -> %s: %s\n", what, brg_status_string(got), err->msg);
  if (want != BRG_SUCCESS)
    EXPECT(e, got == want, "%s returned %s, expected %s", what, brg_status_string(got),
           brg_status_string(want));
  else
    EXPECT(e, got != BRG_SUCCESS, "%s succeeded", what);
  EXPECT(e, err->msg[0] != 0, "%s: no message", what);
  if (needle)
    EXPECT(e, strstr(err->msg, needle) != NULL, "%s: message \"%s\" lacks \"%s\"", what, err->msg,
           needle);
  c->ops->close(c);
  EXPECT(e, c->priv == NULL && c->fifo.data == NULL, "%s: close left the conn set", what);
  c->ops->close(c); /* and again */
}

static int run_bad_input(const brg__cuda_api *api) {
  end e = {.api = api, .who = "bad input", .fd = -1};
  const brg__transport_ops *ops = &brg__transport_cuda_ipc;
  if (!cuda_ok(&e, api->drv.set_device(0), "set_device")) return e.failures;
  /* A receiver of this process on GPU 0, for a sender on GPU 0. */
  brg__gpu_desc self;
  desc_of(&e, &self, random64(), 0);
  brg__gpu_link_params g = {.api = api, .self = self, .peer = self, .bytes = REGION};
  brg__conn_params p = params_of(1, 0, &g);
  brg__errbuf err = {0};
  brg__conn rc = {.ops = ops}, c = {.ops = ops};
  unsigned char info[BRG__CONN_INFO_BYTES];

  /* No GPU parameters, on either end. */
  brg__conn_params nog = params_of(1, 0, NULL);
  expect_fails(&e, "recv_setup without gpu params", &c, ops->recv_setup(&c, &nog, info, &err),
               BRG_ERR_INVALID_USAGE, &err, "cuda_ipc");
  memset(&err, 0, sizeof err);
  memset(info, 0, sizeof info);
  expect_fails(&e, "send_connect without gpu params", &c, ops->send_connect(&c, &nog, info, &err),
               BRG_ERR_INVALID_USAGE, &err, "cuda_ipc");
  brg__gpu_link_params noapi = g;
  noapi.api = NULL;
  brg__conn_params pa = params_of(1, 0, &noapi);
  memset(&err, 0, sizeof err);
  expect_fails(&e, "recv_setup without the module's table", &c,
               ops->recv_setup(&c, &pa, info, &err), BRG_ERR_INVALID_USAGE, &err, "cuda_ipc");

  /* Infos that are not cuda_ipc's. */
  brg__conn_params ps = params_of(0, 1, &g);
  memset(&err, 0, sizeof err);
  memset(info, 0, sizeof info);
  expect_fails(&e, "send_connect of a zeroed info", &c, ops->send_connect(&c, &ps, info, &err),
               BRG_SUCCESS, &err, "cuda_ipc");
  memset(&err, 0, sizeof err);
  memset(info, 0xff, sizeof info);
  expect_fails(&e, "send_connect of an all-ones info", &c, ops->send_connect(&c, &ps, info, &err),
               BRG_SUCCESS, &err, "cuda_ipc");

  /* A real info, for memory of another size than the sender expects. */
  memset(&err, 0, sizeof err);
  brg_status s = ops->recv_setup(&rc, &p, info, &err);
  EXPECT(&e, s == BRG_SUCCESS, "recv_setup: %s: %s", brg_status_string(s), err.msg);
  if (s == BRG_SUCCESS) {
    brg__gpu_link_params g2 = g;
    g2.bytes = REGION + 4096;
    brg__conn_params p2 = params_of(0, 1, &g2);
    memset(&err, 0, sizeof err);
    expect_fails(&e, "send_connect, bytes differ from the info's", &c,
                 ops->send_connect(&c, &p2, info, &err), BRG_ERR_MISMATCH, &err, NULL);
    g2.bytes = REGION - 1;
    memset(&err, 0, sizeof err);
    expect_fails(&e, "send_connect, one byte less than the info's", &c,
                 ops->send_connect(&c, &p2, info, &err), BRG_ERR_MISMATCH, &err, NULL);
    /* The info, corrupted in its first word only (the magic leads it). */
    unsigned char bad[BRG__CONN_INFO_BYTES];
    memcpy(bad, info, sizeof bad);
    bad[0] ^= 0x5a;
    memset(&err, 0, sizeof err);
    expect_fails(&e, "send_connect, info's first byte changed", &c,
                 ops->send_connect(&c, &ps, bad, &err), BRG_SUCCESS, &err, "cuda_ipc");
    /* The untouched info still connects. */
    memset(&err, 0, sizeof err);
    s = ops->send_connect(&c, &ps, info, &err);
    EXPECT(&e, s == BRG_SUCCESS, "send_connect after the failures: %s: %s", brg_status_string(s),
           err.msg);
    EXPECT(&e, s != BRG_SUCCESS || c.fifo.data == rc.fifo.data,
           "one process, one GPU: the sender's pointer %p is not the receiver's %p",
           (void *)c.fifo.data, (void *)rc.fifo.data);
    ops->close(&c);
  }
  ops->close(&rc);
  EXPECT(&e, rc.priv == NULL, "close left the receiver's conn set");
  return e.failures;
}

/* In nopeer mode, without host_fallback: a receiver whose sender is on
 * another GPU of this process, and one in another process (its GPU found
 * by UUID), both refused with the reason. */
static int run_no_fallback(const brg__cuda_api *api) {
  end e = {.api = api, .who = "host_fallback 0", .fd = -1};
  const brg__transport_ops *ops = &brg__transport_cuda_ipc;
  brg__gpu_desc self, peer;
  if (!cuda_ok(&e, api->drv.set_device(1), "set_device(1)")) return e.failures;
  desc_of(&e, &peer, random64(), 1);
  if (!cuda_ok(&e, api->drv.set_device(0), "set_device(0)")) return e.failures;
  desc_of(&e, &self, random64(), 0);
  for (int same = 0; same < 2; same++) {
    if (same) peer.process = self.process;
    brg__gpu_link_params g = {.api = api, .self = self, .peer = peer, .bytes = REGION};
    brg__conn_params p = params_of(1, 0, &g);
    brg__errbuf err = {0};
    brg__conn c = {.ops = ops};
    unsigned char info[BRG__CONN_INFO_BYTES];
    expect_fails(&e,
                 same ? "recv_setup, GPU 0 <- GPU 1, one process"
                      : "recv_setup, GPU 0 <- GPU 1 of another process",
                 &c, ops->recv_setup(&c, &p, info, &err), BRG_ERR_UNAVAILABLE, &err,
                 "no peer access");
    int dev = -1;
    api->drv.get_device(&dev);
    EXPECT(&e, dev == 0, "recv_setup left device %d current, not 0", dev);
  }
  return e.failures;
}

/* The GPUs, asked in a child: its exit status is the number of devices
 * (at most 15), plus 16 when GPU 1 reaches GPU 0's memory. */
static int probe(int *ndev, int *peer10, char *why, size_t why_bytes) {
  int pfd[2];
  if (pipe(pfd) != 0) return -1;
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    close(pfd[0]);
    const char *w = "";
    const brg__cuda_api *api = brg__device_api(&w);
    int code = 0;
    if (api) {
      int n = api->drv.probe(NULL, 0), can = 0;
      if (n >= 2) api->drv.can_access_peer(&can, 1, 0);
      code = (n > 15 ? 15 : n) | (can ? 16 : 0);
    } else {
      ssize_t wr = write(pfd[1], w, strlen(w));
      (void)wr;
    }
    _exit(code);
  }
  close(pfd[1]);
  ssize_t n = read(pfd[0], why, why_bytes - 1);
  why[n > 0 ? n : 0] = 0;
  close(pfd[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
  if (!WIFEXITED(status)) return -1;
  *ndev = WEXITSTATUS(status) & 15;
  *peer10 = (WEXITSTATUS(status) & 16) != 0;
  return 0;
}

static int skip_or_fail(const char *why) {
  if (getenv("BRIGADE_TEST_NO_SKIP") && atoi(getenv("BRIGADE_TEST_NO_SKIP"))) {
    fprintf(stderr, "FAIL: %s\n", why);
    return 1;
  }
  printf("skipped: %s\n", why);
  return SKIP;
}

int main(int argc, char **argv) {
  nopeer = argc > 1 && !strcmp(argv[1], "nopeer");
  /* Before the module is first loaded: it reads this once. */
  if (nopeer) setenv("BRIGADE_EMU_NO_PEER", "1", 1);
  comm_id = random64();
  setvbuf(stdout, NULL, _IOLBF, 0);

  int ndev = 0, peer10 = 0;
  char why[512] = "";
  if (probe(&ndev, &peer10, why, sizeof why) != 0) {
    fprintf(stderr, "FAIL: the probe child died\n");
    return 1;
  }
  if (ndev <= 0) return skip_or_fail(why[0] ? why : "no GPU");
  if (nopeer && (ndev < 2 || peer10))
    return skip_or_fail("nopeer: wants two GPUs without peer access between them (the emulated "
                        "module with BRIGADE_EMU_NO_PEER=1)");
  printf("cuda_ipc link test: %d GPUs, GPU 1 %s GPU 0, comm_id %016llx%s\n", ndev,
         peer10 ? "reaches" : "does not reach", (unsigned long long)comm_id,
         nopeer ? " (nopeer)" : "");

  /* Where GPU 1 cannot reach GPU 0 the link falls back to host memory;
   * a link of one GPU never does. */
  int cross_host = !peer10;
  link_case cases[] = {
      {"procs 0<-1", 0, 1, 1, cross_host, nopeer, 0, 0},
      {"procs 1<-0", 1, 0, cross_host, cross_host, 0, 0, 0},
      {"procs 0<-0", 0, 0, 0, 0, 0, 0, 0},
      {"procs 0<-0 fallback allowed", 0, 0, 1, 0, 0, 0, 0},
      /* a process per GPU that sees only its own: the peer's GPU is found
       * by UUID, and peer access decides as before */
      {"procs 0<-1 visible", 0, 1, 1, cross_host, 0, 0, 1},
      {"procs 1<-0 visible", 1, 0, 1, cross_host, 0, 0, 1},
      /* (threads last: the parent loads the module for them, and a
       * process forked after that would inherit it) */
      {"threads 0<-1", 0, 1, 1, cross_host, nopeer, 1, 0},
      {"threads 0<-0", 0, 0, 0, 0, 0, 1, 0},
  };
  int failures = 0;
  const brg__cuda_api *api = NULL;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const link_case *lc = &cases[i];
    if (lc->recv_gpu >= ndev || lc->send_gpu >= ndev) {
      printf("%-32s skipped: %d GPU(s)\n", lc->name, ndev);
      continue;
    }
    int bad;
    if (lc->threads) {
      /* The parent's first CUDA call: no fork after this. */
      if (!api) {
        const char *w = "";
        api = brg__device_api(&w);
        if (!api) {
          fprintf(stderr, "FAIL: no GPU in the parent after the probe found one: %s\n", w);
          return 1;
        }
      }
      bad = run_threads(api, lc);
    } else {
      bad = run_procs(lc);
    }
    int left = shm_names_left(1);
    if (left) fprintf(stderr, "FAIL: %s: %d host FIFO names left in /dev/shm\n", lc->name, left);
    bad += left;
    printf("%-32s %s\n", lc->name, bad ? "FAILED" : "ok");
    failures += bad;
  }
  if (!api) {
    const char *w = "";
    api = brg__device_api(&w);
    if (!api) {
      fprintf(stderr, "FAIL: no GPU in the parent after the probe found one: %s\n", w);
      return 1;
    }
  }
  if (nopeer) {
    int bad = run_no_fallback(api);
    printf("%-32s %s\n", "host_fallback 0, no peer", bad ? "FAILED" : "ok");
    failures += bad;
  }
  int bad = run_bad_input(api);
  printf("%-32s %s\n", "bad input", bad ? "FAILED" : "ok");
  failures += bad;
  int left = shm_names_left(1);
  if (left) fprintf(stderr, "FAIL: %d host FIFO names left in /dev/shm at the end\n", left);
  failures += left;
  printf("test_cuda_ipc_link%s: %s\n", nopeer ? " nopeer" : "", failures ? "FAILED" : "ok");
  return failures ? 1 : 0;
}
