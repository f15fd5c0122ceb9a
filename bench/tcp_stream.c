/*
 * tcp_stream: one TCP stream over loopback, the ceiling for brigade's tcp
 * links on this machine.
 *
 * A sender thread writes blocks of --block bytes from one buffer, a
 * receiver thread reads them into another, both on sockets with the same
 * buffer sizes brigade's tcp links ask for (BRIGADE_TCP_SOCKBUF, 4 MiB by
 * default) and TCP_NODELAY. Both threads block in the kernel: nothing spins.
 * Prints the best and the median GB/s (bytes moved one way per second)
 * of --reps runs of --bytes each.
 *
 * --bidir runs two such streams at once, in opposite directions, as the
 * two links of a rank in a ring of two carry: each rank sends and receives
 * at once. Its GB/s (per direction) is the ceiling for an N = 2
 * allreduce's busbw, which is also bytes sent per rank per second.
 *
 *   build/bench/tcp_stream [--bytes 1G] [--block 1M] [--sockbuf 4M] [--reps 5] [--bidir]
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

typedef struct stream {
  int fd;
  char *buf;
  size_t block, total;
  int receives; /* 1: the receiving end */
  int failed;
} stream;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* 4K, 1M, 1G and plain numbers. */
static size_t parse_size(const char *s) {
  char *end;
  double v = strtod(s, &end);
  switch (*end) {
  case 'k':
  case 'K': v *= 1024; break;
  case 'm':
  case 'M': v *= 1024 * 1024; break;
  case 'g':
  case 'G': v *= 1024.0 * 1024 * 1024; break;
  default: break;
  }
  return (size_t)v;
}

/* Moves s->total bytes in blocks: sends from s->buf, or receives into it. */
static void *pump(void *arg) {
  stream *s = arg;
  for (size_t done = 0; done < s->total;) {
    size_t len = s->total - done < s->block ? s->total - done : s->block;
    ssize_t n = s->receives ? recv(s->fd, s->buf, len, MSG_WAITALL)
                            : send(s->fd, s->buf, len, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      perror(s->receives ? "tcp_stream: recv" : "tcp_stream: send");
      s->failed = 1;
      return NULL;
    }
    done += (size_t)n;
  }
  return NULL;
}

static void sock_setup(int fd, int sockbuf) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (sockbuf > 0) {
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sockbuf, sizeof sockbuf);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sockbuf, sizeof sockbuf);
  }
}

/* A connected pair over 127.0.0.1; buffers are set before the handshake,
 * as brigade does, so they decide the window scale. */
static int connect_pair(int sockbuf, int *tx, int *rx) {
  int l = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  sock_setup(l, sockbuf);
  if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof a) != 0 || listen(l, 1) != 0 ||
      getsockname(l, (struct sockaddr *)&a, &len) != 0)
    return -1;
  *tx = socket(AF_INET, SOCK_STREAM, 0);
  sock_setup(*tx, sockbuf);
  if (*tx < 0 || connect(*tx, (struct sockaddr *)&a, sizeof a) != 0) return -1;
  *rx = accept(l, NULL, NULL);
  close(l);
  if (*rx < 0) return -1;
  sock_setup(*rx, 0);
  return 0;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  size_t total = 1024u * 1024 * 1024, block = 1024 * 1024, sockbuf = 4 * 1024 * 1024;
  int reps = 5, bidir = 0;
  for (int i = 1; i < argc; i++) {
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(argv[i], "--bytes") && v)
      total = parse_size(v), i++;
    else if (!strcmp(argv[i], "--block") && v)
      block = parse_size(v), i++;
    else if (!strcmp(argv[i], "--sockbuf") && v)
      sockbuf = parse_size(v), i++;
    else if (!strcmp(argv[i], "--reps") && v)
      reps = atoi(v), i++;
    else if (!strcmp(argv[i], "--bidir"))
      bidir = 1;
    else {
      fprintf(stderr, "usage: %s [--bytes 1G] [--block 1M] [--sockbuf 4M] [--reps 5] [--bidir]\n",
              argv[0]);
      return 2;
    }
  }
  if (block == 0 || total == 0 || reps < 1 || reps > 100) {
    fprintf(stderr, "tcp_stream: --bytes and --block must be > 0, --reps 1 to 100\n");
    return 2;
  }
  int nstreams = bidir ? 2 : 1, rc = 0;
  char *bufs[4] = {NULL, NULL, NULL, NULL};
  for (int i = 0; i < 2 * nstreams; i++) {
    if (!(bufs[i] = malloc(block))) {
      rc = 1;
      goto out;
    }
    memset(bufs[i], i, block); /* touched before the clock starts */
  }
  double gbs[100];
  for (int r = 0; r < reps && rc == 0; r++) {
    stream st[4];
    pthread_t th[4];
    for (int k = 0; k < nstreams; k++) {
      int tx, rx;
      if (connect_pair((int)sockbuf, &tx, &rx) != 0) {
        perror("tcp_stream: loopback connection");
        for (int j = 0; j < 2 * k; j++) close(st[j].fd);
        rc = 1;
        goto out;
      }
      st[2 * k] = (stream){.fd = tx, .buf = bufs[2 * k], .block = block, .total = total};
      st[2 * k + 1] =
          (stream){.fd = rx, .buf = bufs[2 * k + 1], .block = block, .total = total, .receives = 1};
    }
    double t0 = now_s();
    for (int i = 0; i < 2 * nstreams; i++) pthread_create(&th[i], NULL, pump, &st[i]);
    for (int i = 0; i < 2 * nstreams; i++) pthread_join(th[i], NULL);
    double t = now_s() - t0;
    for (int i = 0; i < 2 * nstreams; i++) {
      close(st[i].fd);
      if (st[i].failed) rc = 1;
    }
    gbs[r] = (double)total / t / 1e9;
  }
  if (rc != 0) goto out;
  qsort(gbs, (size_t)reps, sizeof gbs[0], cmp_double);
  printf("tcp_stream: loopback, %s, %zu bytes x %d, block %zu, sockbuf %zu\n",
         bidir ? "2 streams in opposite directions" : "1 stream", total, reps, block, sockbuf);
  printf("best %.2f GB/s  median %.2f GB/s%s\n", gbs[reps - 1], gbs[reps / 2],
         bidir ? " (per direction)" : "");
out:
  for (int i = 0; i < 4; i++) free(bufs[i]);
  return rc;
}
