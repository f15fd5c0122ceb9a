/*
 * libFuzzer target over everything brigade reads from a socket before it
 * trusts the peer: the bootstrap hello and unique id, the root's service of
 * pending connections (admission and the table it sends), the table a rank
 * reads from the root, the framed messages of the ring sockets, the
 * data-connection hellos of the tcp and ibverbs transports (through the
 * transport's own listener loop, brg__net_accept), and the two messages of
 * the table's tree: the gather a child sends its parent and the root's
 * answer naming a rank's tree parent.
 *
 * Also the first messages of the ring and tree sockets (the peer hello
 * checked against the listener's challenge) and the challenge a dialer
 * reads first. Proofs are for a challenge nonce of zeros, which every
 * fuzzed acceptor sends; the root's target can sign its hellos itself, so
 * that mutations reach admission.
 *
 * Input: byte 0 picks the target (0xf0 the peer hello, 0xf1 the challenge,
 * else modulo 8), the rest is that target's bytes. The real code runs on real sockets: socket pairs filled with the
 * input, or loopback TCP connections for the transport listener. Every
 * target checks what it can about the answer (a decoded hello re-encodes to
 * the same bytes, a refused table leaves no state behind, every descriptor
 * is closed again), so a wrong result is a crash, not only a sanitizer
 * report.
 *
 * Built with clang -fsanitize=fuzzer,address,undefined by quickstart.sh
 * (meson -Dfuzz=enabled); the same file linked with replay.c runs the seed
 * corpus (tests/fuzz/corpus) as an ordinary test in every build.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bootstrap.h"
#include "bootstrap_wire.h"
#include "clock.h"
#include "hash.h"
#include "log.h"
#include "net.h"
#include "secret.h"

#define FZ_MAX_CONNS 8

/* The secret every target's peer is expected to present (the seeds do). */
static const uint8_t fz_secret[BOOT_SECRET_BYTES] = {
    0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a};

/* The nonce of every challenge the fuzzed acceptors send (the seeds' proofs
 * are made for it), and of the tag the wrapped bootstraps expect. */
static const uint8_t fz_nonce[BOOT_NONCE_BYTES];

static void fz_die(const char *what) {
  fprintf(stderr, "fuzz_bootstrap: %s\n", what);
  abort();
}

/* Splits the input into up to FZ_MAX_CONNS pieces: u16 length, bytes. */
typedef struct fz_piece {
  const uint8_t *p;
  size_t n;
} fz_piece;

static int fz_split(const uint8_t *d, size_t len, fz_piece *out, int max) {
  int k = 0;
  while (len >= 2 && k < max) {
    size_t n = (size_t)(d[0] | d[1] << 8);
    d += 2;
    len -= 2;
    if (n > len) n = len;
    out[k++] = (fz_piece){d, n};
    d += n;
    len -= n;
  }
  return k;
}

/* A connected pair; pair[0] is what brigade reads, pair[1] the peer. */
static void fz_pair(int pair[2]) {
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, pair) != 0)
    fz_die("socketpair");
  int sz = 1 << 18;
  setsockopt(pair[1], SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);
  setsockopt(pair[0], SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);
}

static void fz_write(int fd, const uint8_t *p, size_t n) {
  while (n > 0) {
    ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w <= 0) fz_die("a socket pair took less than the input");
    p += w;
    n -= (size_t)w;
  }
}

static void fz_drain_close(int fd) {
  uint8_t junk[4096];
  while (recv(fd, junk, sizeof junk, MSG_DONTWAIT) > 0) {}
  close(fd);
}

/* 0: the hello a rank sends the root; what decodes re-encodes to the same
 * bytes. */
static void fz_hello(const uint8_t *d, size_t len) {
  brg__boot_hello h;
  brg__errbuf err;
  if (brg__boot_hello_decode(d, len, &h, &err) != BRG_SUCCESS) {
    if (err.msg[0] == '\0') fz_die("a refused hello without a reason");
    return;
  }
  if (!memchr(h.addr, '\0', sizeof h.addr)) fz_die("a decoded hello with an unterminated addr");
  if (h.blob_bytes > BRG__BOOT_MAX_BLOB) fz_die("a decoded hello with an oversized blob");
  /* What decodes encodes again to a hello that decodes to the same fields
   * (bytes after the address's NUL are not kept). */
  uint8_t again[BOOT_HELLO_HDR + BRG__BOOT_MAX_BLOB];
  size_t n = brg__boot_hello_encode(&h, again, sizeof again);
  brg__boot_hello h2;
  if (n != BOOT_HELLO_HDR + h.blob_bytes || n > len ||
      brg__boot_hello_decode(again, n, &h2, &err) != BRG_SUCCESS || h2.rank != h.rank ||
      h2.nranks != h.nranks || h2.port != h.port || h2.blob_bytes != h.blob_bytes ||
      memcmp(h2.proof, h.proof, sizeof h.proof) != 0 ||
      memcmp(h2.nonce, h.nonce, sizeof h.nonce) != 0 || strcmp(h2.addr, h.addr) != 0 ||
      (h.blob_bytes && memcmp(h2.blob, h.blob, h.blob_bytes) != 0))
    fz_die("a decoded hello does not encode to the same hello");
}

/* 1: the unique id; byte 0 bit 0 set: with a correct checksum, so the
 * fields behind it are reached. */
static void fz_id(const uint8_t *d, size_t len) {
  if (len < 1) return;
  brg__boot_id id;
  memset(&id, 0, sizeof id);
  memcpy(&id, d + 1, len - 1 < sizeof id ? len - 1 : sizeof id);
  if (d[0] & 1) {
    id.magic = BRG__BOOT_MAGIC;
    id.version = BOOT_VERSION;
    id.checksum = brg__fnv1a32(&id, offsetof(brg__boot_id, checksum));
  }
  brg__errbuf err;
  brg_status st = brg__boot_id_check(&id, &err);
  if (st == BRG_SUCCESS && (!memchr(id.addr, '\0', sizeof id.addr) || id.port == 0))
    fz_die("a unique id passed its check with a bad address or port");
}

/* The hello at the start of a piece, when there is a whole one: its
 * length, else 0. */
static size_t fz_hello_len(const fz_piece *pc) {
  if (pc->n < BOOT_HELLO_HDR) return 0;
  size_t n = BOOT_HELLO_HDR + boot_get_u32(pc->p + 96);
  return boot_get_u32(pc->p + 96) <= BRG__BOOT_MAX_BLOB && n <= pc->n ? n : 0;
}

/* 2: the root serving up to 8 connections at once. Byte 0: rounds (bits
 * 0-6, modulo 6), and bit 7: the pieces' hellos are signed here for the
 * root's challenge, so that mutated hellos still reach admission. */
static void fz_root(const uint8_t *d, size_t len) {
  if (len < 1) return;
  int rounds = 1 + (d[0] & 0x7f) % 6, sign = d[0] & 0x80;
  fz_piece pc[FZ_MAX_CONNS];
  int n = fz_split(d + 1, len - 1, pc, FZ_MAX_CONNS);
  int mine[FZ_MAX_CONNS] = {0}, peer[FZ_MAX_CONNS] = {0};
  static uint8_t copy[65536];
  for (int i = 0; i < n; i++) {
    int pair[2];
    fz_pair(pair);
    mine[i] = pair[0];
    peer[i] = pair[1];
    size_t h = fz_hello_len(&pc[i]);
    if (sign && h) {
      memcpy(copy, pc[i].p, pc[i].n);
      brg__boot_sign(copy, h, fz_secret, fz_nonce);
      fz_write(peer[i], copy, pc[i].n);
    } else {
      fz_write(peer[i], pc[i].p, pc[i].n);
    }
  }
  brg__boot_root_serve(fz_secret, fz_nonce, mine, n, rounds);
  /* The root speaks first, its challenge; what it answered after that must
   * be a reply tagged for that piece's hello, and only for a hello that
   * proved the secret. */
  for (int i = 0; i < n; i++) {
    uint8_t ch[BOOT_CHALLENGE_BYTES], hdr[BOOT_REPLY_HDR];
    if (recv(peer[i], ch, sizeof ch, MSG_DONTWAIT) == (ssize_t)sizeof ch &&
        (boot_get_u32(ch) != BOOT_CHALLENGE_MAGIC || memcmp(ch + 8, fz_nonce, 16) != 0))
      fz_die("the root's first words are not its challenge");
    ssize_t r = recv(peer[i], hdr, sizeof hdr, MSG_DONTWAIT);
    if (r == (ssize_t)sizeof hdr) {
      size_t h = fz_hello_len(&pc[i]);
      uint8_t tag[16];
      if (!h) fz_die("the root answered a connection that sent no whole hello");
      brg__boot_answer_tag(tag, fz_secret, pc[i].p + BOOT_HELLO_NONCE);
      if (boot_get_u32(hdr) != BOOT_TABLE_MAGIC || memcmp(hdr + 4, tag, 16) != 0)
        fz_die("the root answered without its magic and the hello's tag");
      if (!sign && !brg__boot_verify(pc[i].p, h, fz_secret, fz_nonce))
        fz_die("the root answered a hello that does not prove the secret");
    }
    fz_drain_close(peer[i]);
  }
}

/* 0xf0: a ring or tree hello (44 bytes after byte 1) as a listener checks
 * it against its challenge. Byte 1 bit 0: signed here first; bit 1: the
 * tree's magic. Accepted exactly when the magic and the proof hold. */
static void fz_peer_hello(const uint8_t *d, size_t len) {
  if (len < 1 + BOOT_RING_HELLO) return;
  uint8_t m[BOOT_RING_HELLO];
  memcpy(m, d + 1, sizeof m);
  uint32_t magic = d[0] & 2 ? BOOT_TREE_MAGIC : BOOT_RING_MAGIC;
  if (d[0] & 1) brg__boot_sign(m, sizeof m, fz_secret, fz_nonce);
  int32_t from = -1, to = -1;
  const char *why = NULL;
  int ok = brg__boot_peer_hello_check(m, magic, fz_secret, fz_nonce, &from, &to, &why);
  int want = boot_get_u32(m) == magic && brg__boot_verify(m, sizeof m, fz_secret, fz_nonce);
  if (ok != want) fz_die("a peer hello judged against its magic and proof");
  if (ok && (from != (int32_t)boot_get_u32(m + 20) || to != (int32_t)boot_get_u32(m + 24)))
    fz_die("a peer hello's ranks read wrong");
  if (!ok && !why) fz_die("a refused peer hello without a reason");
  /* Any single flipped bit of a passing hello fails it. */
  if (ok) {
    m[4 + d[1 + BOOT_RING_HELLO - 1] % (BOOT_RING_HELLO - 4)] ^= 1;
    if (brg__boot_peer_hello_check(m, magic, fz_secret, fz_nonce, &from, &to, &why))
      fz_die("a peer hello with a flipped bit passed");
  }
}

/* 0xf1: the challenge a dialer reads first, from a socket. */
static void fz_challenge(const uint8_t *d, size_t len) {
  int pair[2];
  fz_pair(pair);
  fz_write(pair[1], d, len);
  shutdown(pair[1], SHUT_WR);
  uint8_t nonce[BOOT_NONCE_BYTES];
  const char *why = NULL;
  int rc = brg__boot_challenge_read(pair[0], nonce, brg__now_ms() + 50, &why);
  if (rc == BRG__IO_OK &&
      (len < BOOT_CHALLENGE_BYTES || boot_get_u32(d) != BOOT_CHALLENGE_MAGIC ||
       boot_get_u32(d + 4) != BOOT_VERSION || memcmp(nonce, d + 8, sizeof nonce) != 0))
    fz_die("a challenge passed that is not one");
  if (rc == BRG__IO_ERR && len >= BOOT_CHALLENGE_BYTES && !why)
    fz_die("a refused challenge without a reason");
  close(pair[0]);
  close(pair[1]);
}

/* What the table's and the tree parent's readers share: rank d[1] % N of
 * N = 1 + d[0] % 8, blobs of d[2] % 64 bytes, a bootstrap around no
 * sockets, and d[3..] waiting on pair[0] (the peer's end shut). */
static brg__bootstrap *fz_reader(const uint8_t *d, size_t len, int pair[2], int *nranks, int *rank,
                                 size_t *blob_bytes) {
  *nranks = 1 + d[0] % 8;
  *rank = d[1] % *nranks;
  *blob_bytes = d[2] % 64;
  fz_pair(pair);
  fz_write(pair[1], d + 3, len - 3);
  shutdown(pair[1], SHUT_WR);
  brg__bootstrap *bs;
  brg__errbuf err;
  if (brg__bootstrap_wrap(&bs, *rank, *nranks, fz_secret, (uint16_t)(20000 + *rank), -1, -1, 100,
                          &err) != BRG_SUCCESS)
    fz_die("bootstrap wrap");
  return bs;
}

/* 3: the table a rank reads from the root. */
static void fz_table(const uint8_t *d, size_t len) {
  if (len < 3) return;
  int nranks, rank, pair[2];
  size_t blob_bytes;
  brg__bootstrap *bs = fz_reader(d, len, pair, &nranks, &rank, &blob_bytes);
  brg__errbuf err;
  uint8_t *blobs = malloc((size_t)nranks * blob_bytes + 1);
  if (!blobs) fz_die("malloc");
  brg_status st = brg__bootstrap_read_table(bs, pair[0], blob_bytes, blobs, &err);
  if (st == BRG_SUCCESS) {
    for (int k = 0; k < nranks; k++) {
      uint16_t port;
      const char *a = brg__bootstrap_peer_addr(bs, k, &port);
      if (!a || !memchr(a, '\0', BOOT_ADDR_BYTES) || port == 0)
        fz_die("a table passed with a bad entry");
    }
  } else if (err.msg[0] == '\0') {
    fz_die("a refused table without a reason");
  }
  free(blobs);
  brg__bootstrap_destroy(bs);
  close(pair[0]);
  close(pair[1]);
}

/* 4: framed messages on a ring socket, read until the stream ends. */
static void fz_ring(const uint8_t *d, size_t len) {
  if (len < 1) return;
  uint32_t max_len = d[0] & 1 ? BRG__BOOT_MAX_MSG : (uint32_t)(d[0] >> 1) * 8;
  int pair[2];
  fz_pair(pair);
  fz_write(pair[1], d + 1, len - 1);
  shutdown(pair[1], SHUT_WR);
  brg__bootstrap *bs;
  brg__errbuf err;
  if (brg__bootstrap_wrap(&bs, 1, 3, fz_secret, 20001, -1, pair[0], 100, &err) != BRG_SUCCESS)
    fz_die("bootstrap wrap");
  static uint8_t buf[BRG__BOOT_MAX_MSG];
  for (int k = 0; k < 1024; k++) {
    uint32_t type, got = UINT32_MAX;
    brg_status st = brg__bootstrap_recv(bs, BRG__RING_PREV, &type, buf, max_len, &got, 0, &err);
    if (st != BRG_SUCCESS) break;
    if (got > max_len) fz_die("a ring message longer than the caller's buffer");
  }
  brg__bootstrap_destroy(bs); /* closes pair[0] */
  close(pair[1]);
}

/* 5: the data-connection hellos of tcp (byte 0 even) and ibverbs, on a real
 * loopback listener through brg__net_accept. */
typedef struct fz_door {
  int ib, nsocks;
  int fds[FZ_MAX_CONNS];
} fz_door;

static int fz_take(void *arg, const brg__conn_params *p, int fd, const void *hello,
                   const char *from) {
  fz_door *door = arg;
  if (door->ib) {
    if (!brg__ib_hello_check(p, from, hello, p->nslots, 2)) return 0;
    for (int i = 0; i < door->nsocks; i++)
      if (door->fds[i] < 0) {
        door->fds[i] = fd;
        return 1;
      }
    fz_die("the ib listener kept more connections than it wanted");
  }
  int index = brg__tcp_hello_check(p, from, hello, door->nsocks, door->fds);
  if (index < 0) return 0;
  if (index >= door->nsocks || door->fds[index] >= 0)
    fz_die("a tcp hello was taken for a socket index out of range or taken");
  door->fds[index] = fd;
  return 1;
}

static void fz_net(const uint8_t *d, size_t len) {
  if (len < 1) return;
  fz_door door = {.ib = d[0] & 1, .nsocks = door.ib ? 1 : 1 + (d[0] >> 1) % 3};
  for (int i = 0; i < FZ_MAX_CONNS; i++) door.fds[i] = -1;
  fz_piece pc[FZ_MAX_CONNS];
  int n = fz_split(d + 1, len - 1, pc, FZ_MAX_CONNS);
  brg__net_link l;
  memset(&l, 0, sizeof l);
  uint16_t port = 0;
  brg__errbuf err;
  if (brg__sock_listen("127.0.0.1", 0, 64, "fuzz", "fuzz listener", &l.listen_fd, &port, &err) !=
      BRG_SUCCESS)
    fz_die("listen");
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int cl[FZ_MAX_CONNS] = {0};
  for (int i = 0; i < n; i++) {
    cl[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (cl[i] < 0 || connect(cl[i], (struct sockaddr *)&sa, sizeof sa) != 0) fz_die("connect");
    if (pc[i].n) fz_write(cl[i], pc[i].p, pc[i].n);
  }
  brg__conn_params p = {
      .rank = 1, .peer = 0, .nranks = 2, .nslots = 4, .secret = fz_secret, .timeout_ms = 5};
  size_t hello_bytes = door.ib ? brg__ib_hello_bytes : brg__tcp_hello_bytes;
  brg_status st = brg__net_accept(&l, &p, "fuzz", hello_bytes, door.nsocks, fz_take, &door,
                                  brg__now_ms() + 5, &err);
  int kept = 0;
  for (int i = 0; i < door.nsocks; i++)
    if (door.fds[i] >= 0) {
      kept++;
      close(door.fds[i]);
    }
  if (st == BRG_SUCCESS && (kept != door.nsocks || l.listen_fd >= 0))
    fz_die("the listener said done without every socket, or kept listening");
  if (l.listen_fd >= 0) close(l.listen_fd);
  for (int i = 0; i < n; i++) close(cl[i]);
}

/* 6: a tree child's gather (after its hello), read by its parent. */
static void fz_gather(const uint8_t *d, size_t len) {
  if (len < 3) return;
  int nranks = 2 + d[0] % 15, rank = d[1] % (nranks / 2);
  int child = 2 * rank + 1 + ((d[2] & 1) && 2 * rank + 2 < nranks);
  size_t blob_bytes = (size_t)(d[2] >> 1) % 32, entry = BOOT_ENTRY_HDR + blob_bytes;
  int pair[2];
  fz_pair(pair);
  fz_write(pair[1], d + 3, len - 3);
  shutdown(pair[1], SHUT_WR);
  brg__boot_tree t = {.rank = rank,
                      .nranks = nranks,
                      .secret = fz_secret,
                      .listen_fd = -1,
                      .root_fd = -1,
                      .blob_bytes = blob_bytes,
                      .deadline = brg__now_ms() + 100,
                      .timeout_ms = 100};
  size_t bytes = BOOT_REPLY_HDR + BOOT_TABLE_HDR + (size_t)nranks * entry;
  uint8_t *table = calloc(1, bytes), *filled = calloc((size_t)nranks, 1);
  if (!table || !filled) fz_die("calloc");
  int spoke = 0;
  brg__errbuf err;
  brg_status st = brg__boot_tree_read_gather(&t, pair[0], child, table, filled, &spoke, &err);
  if (st == BRG_SUCCESS) {
    for (int r = 0; r < nranks; r++) {
      if (filled[r] != brg__boot_tree_has(child, r))
        fz_die("a gather passed that does not fill exactly the child's subtree");
      const uint8_t *e = table + BOOT_REPLY_HDR + BOOT_TABLE_HDR + (size_t)r * entry;
      if (filled[r] && (!memchr(e, '\0', BOOT_ADDR_BYTES) || boot_get_u16(e + 64) == 0))
        fz_die("a gather passed with a bad entry");
    }
  } else if (err.msg[0] == '\0' || spoke) {
    fz_die("a refused gather without a reason");
  }
  free(table);
  free(filled);
  close(pair[0]);
  close(pair[1]);
}

/* 7: the root's answer naming a rank's tree parent. */
static void fz_neigh(const uint8_t *d, size_t len) {
  if (len < 3) return;
  int nranks, rank, pair[2];
  size_t blob_bytes;
  brg__bootstrap *bs = fz_reader(d, len, pair, &nranks, &rank, &blob_bytes);
  brg__errbuf err;
  char addr[BOOT_ADDR_BYTES];
  uint16_t port = 1;
  brg_status st = brg__bootstrap_read_neigh(bs, pair[0], blob_bytes, addr, &port, &err);
  if (st == BRG_SUCCESS) {
    if (rank == 0
            ? port != 0 || addr[0] != '\0'
            : port == 0 || !memchr(addr, '\0', sizeof addr) || !brg__sock_addr_is_numeric(addr))
      fz_die("an answer passed with a bad tree parent");
  } else if (err.msg[0] == '\0') {
    fz_die("a refused answer without a reason");
  }
  brg__bootstrap_destroy(bs);
  close(pair[0]);
  close(pair[1]);
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  /* Every refusal is logged, so the messages' formatting is fuzzed too,
   * into a file nobody reads. */
  setenv("BRIGADE_DEBUG", "WARN", 0);
  setenv("BRIGADE_DEBUG_FILE", "/dev/null", 0);
  brg__log_init();
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1 || size > 65536) return 0;
  const uint8_t *d = data + 1;
  size_t n = size - 1;
  if (data[0] == 0xf0) {
    fz_peer_hello(d, n);
    return 0;
  }
  if (data[0] == 0xf1) {
    fz_challenge(d, n);
    return 0;
  }
  switch (data[0] % 8) {
  case 0: fz_hello(d, n); break;
  case 1: fz_id(d, n); break;
  case 2: fz_root(d, n); break;
  case 3: fz_table(d, n); break;
  case 4: fz_ring(d, n); break;
  case 6: fz_gather(d, n); break;
  case 7: fz_neigh(d, n); break;
  default: fz_net(d, n); break;
  }
  return 0;
}
