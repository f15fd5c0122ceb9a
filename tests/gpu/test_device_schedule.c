/*
 * The slice order of the device path equals the host engine's.
 *
 * N forked ranks run each case twice, on host buffers and then on GPU
 * buffers with a stream, with equal slice sizes (BRIGADE_SLICE_BYTES =
 * BRIGADE_DEVICE_SLICE_BYTES) and BRIGADE_DEBUG=TRACE, which logs one line
 * per primitive: step, primitive, element count and the offsets into the
 * caller's buffers. The parent then reads every rank's trace and checks
 * that each GPU collective ran exactly the primitives, in the same order,
 * on the same slices, as the host collective before it. Cases: every
 * collective, N = 2..5, counts that are 0, 1, prime and not multiples of N
 * or of the slice, in place and out of place.
 *
 *   test_device_schedule N      (exits 77 when there is no GPU; with
 *                                BRIGADE_CUDA_MODULE naming the emulated
 *                                module it runs anywhere)
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "brigade.h"
#include "device.h"

#define SLICE "4K"
#define MAXLINES 200000

enum { AR, RS, AG, BC, RD };
static const size_t COUNTS[] = {0, 1, 7, 1021, 4099, 40009};
#define NCOUNTS (sizeof COUNTS / sizeof COUNTS[0])
#define MAXCOUNT 40009

static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
      getsockname(fd, (struct sockaddr *)&a, &len) != 0)
    return -1;
  close(fd);
  return ntohs(a.sin_port);
}

/* One call on buffers s, r (host or device); count as each API takes it. */
static brg_status call(int kind, void *s, void *r, size_t count, brg_comm *c, void *st) {
  switch (kind) {
  case AR: return brg_allreduce(s, r, count, BRG_FLOAT32, BRG_SUM, c, st);
  case RS: return brg_reduce_scatter(s, r, count, BRG_FLOAT32, BRG_MAX, c, st);
  case AG: return brg_all_gather(s, r, count, BRG_FLOAT32, c, st);
  case BC: return brg_broadcast(s, r, count, BRG_FLOAT32, 1, c, st);
  default: return brg_reduce(s, r, count, BRG_FLOAT32, BRG_AVG, 0, c, st);
  }
}

/* Buffers of one placement: NCCL's in-place layouts for rs and ag. */
static void place(int kind, char *sb, char *rb, size_t count, int rank, int inplace, void **s,
                  void **r) {
  *s = sb;
  *r = rb;
  if (!inplace) return;
  if (kind == RS)
    *r = sb + (size_t)rank * count * 4;
  else if (kind == AG)
    *s = rb + (size_t)rank * count * 4, *r = rb;
  else
    *r = sb;
}

static int rank_main(int rank, int n) {
  brg_comm *c = NULL;
  if (brg_comm_init_env(&c) != BRG_SUCCESS) {
    fprintf(stderr, "rank %d: init: %s\n", rank, brg_comm_last_error(NULL));
    return 1;
  }
  const brg__cuda_api *api = brg__device_api(NULL);
  size_t bytes = (size_t)MAXCOUNT * (size_t)n * 4 + 64;
  char *hs = calloc(1, bytes), *hr = calloc(1, bytes);
  void *ds = NULL, *dr = NULL, *st = NULL;
  if (!api || !hs || !hr || api->drv.mem_alloc(&ds, bytes) || api->drv.mem_alloc(&dr, bytes) ||
      api->drv.stream_create(&st)) {
    fprintf(stderr, "rank %d: no buffers\n", rank);
    return 1;
  }
  api->drv.mem_set(ds, 0, bytes);
  api->drv.mem_set(dr, 0, bytes);
  /* First a device call, so the device ring's set-up (two host all_gathers)
   * comes before the pairs. */
  if (brg_allreduce(ds, dr, 1, BRG_FLOAT32, BRG_SUM, c, st) != BRG_SUCCESS) goto fail;
  for (int kind = AR; kind <= RD; kind++)
    for (size_t ci = 0; ci < NCOUNTS; ci++)
      for (int ip = 0; ip < 2; ip++) {
        void *s, *r;
        place(kind, hs, hr, COUNTS[ci], rank, ip, &s, &r);
        if (call(kind, s, r, COUNTS[ci], c, NULL) != BRG_SUCCESS) goto fail;
        place(kind, ds, dr, COUNTS[ci], rank, ip, &s, &r);
        if (call(kind, s, r, COUNTS[ci], c, st) != BRG_SUCCESS) goto fail;
        if (api->drv.stream_sync(st)) goto fail;
      }
  brg_comm_destroy(c);
  return 0;
fail:
  fprintf(stderr, "rank %d: %s\n", rank, brg_comm_last_error(c));
  return 1;
}

typedef struct line {
  char coll[32];
  unsigned long long seq;
  char where[8];
  char rest[200]; /* "step ...: m elements, in +a, out +b" */
} line;

/* Reads one rank's trace; returns the number of primitive lines. */
static int read_trace(const char *path, line *out) {
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  char buf[512];
  int k = 0;
  while (fgets(buf, sizeof buf, f) && k < MAXLINES) {
    const char *p = strstr(buf, "[ring] ");
    line *l = &out[k];
    if (!p ||
        sscanf(p + 7, "%31s #%llu (%7[^)]) %199[^\n]", l->coll, &l->seq, l->where, l->rest) != 4)
      continue;
    k++;
  }
  fclose(f);
  return k;
}

/* Lines of collective `seq`, from index *i on; returns how many. */
static int take(const line *v, int nv, int *i, unsigned long long seq) {
  int start = *i;
  while (*i < nv && v[*i].seq == seq) (*i)++;
  return *i - start;
}

static int compare(int rank, const line *v, int nv) {
  int i = 0, pairs = 0, bad = 0;
  /* seq 1 and 2: the set-up all_gathers, seq 3: the first device call */
  while (i < nv && v[i].seq <= 3) i++;
  for (unsigned long long seq = 4; i < nv && !bad; seq += 2) {
    int h0 = i, nh = take(v, nv, &i, seq);
    int d0 = i, nd = take(v, nv, &i, seq + 1);
    if (nh == 0 || nd == 0) {
      fprintf(stderr, "rank %d: collective #%llu or #%llu left no trace\n", rank, seq, seq + 1);
      return 1;
    }
    if (strcmp(v[h0].where, "host") || strcmp(v[d0].where, "GPU")) {
      fprintf(stderr, "rank %d: #%llu should be host and #%llu GPU\n", rank, seq, seq + 1);
      return 1;
    }
    if (nh != nd || strcmp(v[h0].coll, v[d0].coll)) {
      fprintf(stderr, "rank %d: %s #%llu ran %d primitives on host, %s #%llu %d on the GPU\n", rank,
              v[h0].coll, seq, nh, v[d0].coll, seq + 1, nd);
      return 1;
    }
    for (int k = 0; k < nh; k++)
      if (strcmp(v[h0 + k].rest, v[d0 + k].rest)) {
        fprintf(stderr, "rank %d: %s #%llu primitive %d: host '%s', GPU '%s'\n", rank, v[h0].coll,
                seq, k, v[h0 + k].rest, v[d0 + k].rest);
        bad = 1;
        break;
      }
    pairs++;
  }
  int want = (RD - AR + 1) * (int)NCOUNTS * 2;
  if (!bad && pairs != want) {
    fprintf(stderr, "rank %d: %d collective pairs traced, expected %d\n", rank, pairs, want);
    bad = 1;
  }
  if (!bad) printf("rank %d: %d pairs, %d primitives, GPU order = host order\n", rank, pairs, nv);
  return bad;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 3;
  if (n < 2 || n > 16) return 2;
  /* Look for a GPU in a child: CUDA must not start before the fork. */
  pid_t probe = fork();
  if (probe == 0) {
    const char *why = "";
    if (brg__device_api(&why)) _exit(0);
    /* The emulated module's runs must not skip: a module that does not load
     * there is a failure. */
    if (getenv("BRIGADE_TEST_NO_SKIP")) {
      fprintf(stderr, "FAIL: no GPU: %s\n", why);
      exit(1);
    }
    printf("skipped: %s\n", why);
    _exit(77);
  }
  int stt = 0;
  if (probe < 0 || waitpid(probe, &stt, 0) != probe || !WIFEXITED(stt)) return 1;
  if (WEXITSTATUS(stt)) return WEXITSTATUS(stt);

  char dir[] = "/tmp/brigade-sched.XXXXXX";
  if (!mkdtemp(dir)) return 1;
  char port[16], file[64], nbuf[8];
  snprintf(port, sizeof port, "%d", free_port());
  snprintf(file, sizeof file, "%s/trace.%%r", dir);
  snprintf(nbuf, sizeof nbuf, "%d", n);
  pid_t pids[16];
  for (int r = 0; r < n; r++) {
    if ((pids[r] = fork()) == 0) {
      char rb[8];
      snprintf(rb, sizeof rb, "%d", r);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", port, 1);
      setenv("RANK", rb, 1);
      setenv("WORLD_SIZE", nbuf, 1);
      setenv("BRIGADE_DEBUG", "TRACE", 1);
      setenv("BRIGADE_DEBUG_SUBSYS", "ring", 1);
      setenv("BRIGADE_DEBUG_FILE", file, 1);
      setenv("BRIGADE_SLICE_BYTES", SLICE, 1);
      setenv("BRIGADE_DEVICE_SLICE_BYTES", SLICE, 1);
      setenv("BRIGADE_SMALL_BYTES", "0", 1);
      _exit(rank_main(r, n));
    }
  }
  int bad = 0;
  for (int r = 0; r < n; r++) {
    int s = 0;
    waitpid(pids[r], &s, 0);
    if (!WIFEXITED(s) || WEXITSTATUS(s)) {
      fprintf(stderr, "rank %d failed (status 0x%x)\n", r, s);
      bad = 1;
    }
  }
  line *v = malloc(sizeof(line) * MAXLINES);
  for (int r = 0; !bad && r < n; r++) {
    char path[96];
    snprintf(path, sizeof path, "%s/trace.%d", dir, r);
    int nv = read_trace(path, v);
    if (nv <= 0) {
      fprintf(stderr, "rank %d: no trace in %s\n", r, path);
      bad = 1;
    } else {
      bad |= compare(r, v, nv);
    }
  }
  for (int r = 0; r < n; r++) {
    char path[96];
    snprintf(path, sizeof path, "%s/trace.%d", dir, r);
    unlink(path);
  }
  rmdir(dir);
  free(v);
  printf("test_device_schedule N=%d: %s\n", n, bad ? "FAILED" : "ok");
  return bad;
}
