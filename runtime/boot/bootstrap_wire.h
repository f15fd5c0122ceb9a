/*
 * Bootstrap messages on the wire, shared by the root (bootstrap_root.c)
 * and the ranks (bootstrap.c).
 *
 * Wire layouts (all integers little-endian, offsets in bytes). Version 3:
 * the job secret never travels. Whoever accepts a bootstrap connection
 * (the root, a tree parent, a ring neighbour) first sends a challenge
 * with a fresh random nonce; the dialer's first message carries, where
 * versions 1 and 2 carried the secret, a proof: the first 16 bytes of
 * HMAC-SHA-256(secret, challenge nonce || the message with the proof
 * field zeroed), and a nonce of its own. Every answer on that connection
 * carries, in the same place, a tag: the first 16 bytes of
 * HMAC-SHA-256(secret, "BRGT" || the dialer's nonce). So a peer proves it
 * holds the secret without sending it, a recorded message is no use on
 * another connection, and a dialer knows the answer comes from a holder
 * of the secret. Proofs and tags are compared in constant time.
 *
 *   challenge, acceptor -> dialer, right after accept: 24 bytes
 *     0 u32 magic "BRGN"   4 u32 version (3)   8 nonce[16]
 *
 *   hello, rank -> root: 184 bytes, then the blob
 *     0 u32 magic   4 proof[16]   20 i32 rank   24 i32 nranks   28 addr[64]
 *     92 u16 port   94 u16 zero    96 u32 blob_bytes  100 i32 pid  104 host[64]
 *     168 nonce[16]  184 blob (the proof covers the blob too)
 *
 *   reply, root -> rank: 28 bytes, then the payload
 *     0 u32 magic "BRGT"   4 tag[16]   20 u32 status   24 u32 payload bytes
 *     status 0: u32 nranks, u32 blob_bytes, then the rank's tree parent
 *               (rank (r-1)/2): addr[64], u16 port, u16 zero; all zero for
 *               rank 0. The root holds no blob and sends O(1) bytes per rank.
 *     else:     the error text (no NUL), at most BOOT_MAX_ERRTEXT bytes
 *
 *   The table then spreads over a binary tree of the ranks (parent (r-1)/2,
 *   children 2r+1 and 2r+2): each child dials its parent's ring listener and
 *   says who it is, every rank gathers its subtree and sends it up, and
 *   rank 0, which then holds every entry, sends the table down:
 *
 *   tree hello, child -> parent (after the parent's challenge): 44 bytes
 *     0 u32 magic "BRGA"   4 proof[16]   20 i32 from_rank   24 i32 to_rank
 *     28 nonce[16]
 *   gather, child -> parent, once the child's subtree is complete:
 *     0 u32 count (the size of the child's subtree), then count times
 *     i32 rank, addr[64], u16 port, u16 zero, blob
 *   table, parent -> child: a reply with status 0 (tagged for that child)
 *     whose payload is u32 nranks, u32 blob_bytes, then per rank in rank
 *     order addr[64], u16 port, u16 zero, blob
 *
 *   The table takes 2*ceil(log2(N+1)) hops, and no rank sends more than
 *   three tables.
 *
 *   confirm, rank -> root, once the rank's communicator is set up: 8 bytes
 *     0 u32 magic "BRGC"   4 i32 rank
 *   and the root's answer once every rank has confirmed: a reply with
 *   status 0 and no payload (or, when the job failed, the error reply).
 *   A rank claimed by two live processes fails the job: every rank that
 *   holds a connection to the root, and every one that comes later, gets
 *   the error reply naming both claimants.
 *
 *   ring hello, connector -> acceptor (after the acceptor's challenge): 44
 *   bytes, laid out as the tree hello with magic "BRGR"
 *
 *   ring message: u32 type, u32 len (<= BRG__BOOT_MAX_MSG), payload
 *
 * Every socket is non-blocking and every wait is a poll() with a deadline, so
 * no peer (dead, silent or hostile) can hold a thread forever. Every send uses
 * MSG_NOSIGNAL so a vanished peer is an error code, never a SIGPIPE.
 */
#ifndef BRG_BOOTSTRAP_WIRE_H
#define BRG_BOOTSTRAP_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "bootstrap_id.h"
#include "sock.h"

typedef struct brg__bootstrap brg__bootstrap; /* bootstrap.h */

#define BOOT_SUBSYS "bootstrap"
/* 2: the root hands out tree parents, the tree spreads the table;
 * 3: challenge and response, no secret on the wire. */
#define BOOT_VERSION 3u
#define BOOT_CHALLENGE_MAGIC 0x4252474eu /* "BRGN" */
#define BOOT_TABLE_MAGIC 0x42524754u     /* "BRGT" */
#define BOOT_RING_MAGIC 0x42524752u      /* "BRGR" */
#define BOOT_CONFIRM_MAGIC 0x42524743u   /* "BRGC" */
#define BOOT_TREE_MAGIC 0x42524741u      /* "BRGA" */
#define BOOT_CONFIRM_BYTES 8

#define BOOT_SECRET_BYTES 16
#define BOOT_ADDR_BYTES 64
#define BOOT_HELLO_HDR 184
#define BOOT_HELLO_NONCE 168 /* where the hello's nonce is */
#define BOOT_NONCE_BYTES 16
#define BOOT_CHALLENGE_BYTES 24
#define BOOT_HOST_BYTES 64
#define BOOT_REPLY_HDR 28
#define BOOT_TABLE_HDR 8   /* nranks, blob_bytes */
#define BOOT_ENTRY_HDR 68  /* addr, port, zero */
#define BOOT_RING_HELLO 44 /* and the tree hello */
#define BOOT_RING_HELLO_NONCE 28
#define BOOT_NEIGH_BYTES (BOOT_TABLE_HDR + BOOT_ENTRY_HDR) /* the root's answer */
#define BOOT_GATHER_HDR 4                                  /* count */
#define BOOT_GATHER_RANK 4                                 /* before each entry */
#define BOOT_FRAME_HDR 8
#define BOOT_MAX_ERRTEXT 1024

#define BOOT_CONN_TIMEOUT_MS 2000 /* an accepted connection has this long to say who it is */
#define BOOT_DRAIN_MS 1000        /* a refused one this long to read our answer and hang up */
#define BOOT_REPLY_SEND_MS 500    /* sending a short error answer */
#define BOOT_TABLE_SEND_MS 10000  /* sending the table to one rank */
#define BOOT_CLAIMED_TWICE " was claimed twice" /* in the root's text when that failed the job */
#define BOOT_VERDICT_MS 100       /* a failed rank waits this long for the root's word on why */
#define BOOT_TREE_VERDICT_MS 1000 /* the same when its tree neighbour failed */
#define BOOT_RETRY_MS 50          /* between connection attempts while nobody listens */
#define BOOT_MAX_PENDING 256      /* accepted connections that have not said who they are */
#define BOOT_MIN_PENDING_MS 200   /* none is dropped to make room for another before this */
#define BOOT_FD_RESERVE 64        /* descriptors the root leaves its process (rank 0's own) */
#define BOOT_BACKLOG 4096         /* the kernel caps it at somaxconn */
/* The ring listener: a neighbour sends its 28-byte hello right after it
 * connects (a rank descheduled in between on a loaded host still makes
 * it), and the oldest of too many strangers makes room for the next, so
 * strangers delay nobody. */
#define BOOT_RING_CONN_TIMEOUT_MS 2000
#define BOOT_RING_MAX_PENDING 64
/* A tree child's hello may lag its connect on a crowded host (hundreds of
 * ranks on a few cores): it gets longer, and strangers still make room for
 * each other through BOOT_RING_MAX_PENDING. */
#define BOOT_TREE_CONN_TIMEOUT_MS 5000
#define BOOT_PEER_LEN BRG__HOSTPORT_LEN

_Static_assert(sizeof(brg__boot_id) <= sizeof(brg_unique_id),
               "the bootstrap id must fit in brg_unique_id");
_Static_assert(offsetof(brg__boot_id, checksum) + sizeof(uint32_t) == sizeof(brg__boot_id),
               "the checksum must be the last field of the id");
_Static_assert(sizeof(((brg__boot_id *)0)->addr) == BOOT_ADDR_BYTES, "addr size");
_Static_assert(sizeof(((brg__boot_hello *)0)->addr) == BOOT_ADDR_BYTES, "addr size");
_Static_assert(sizeof(((brg__boot_id *)0)->secret) == BOOT_SECRET_BYTES, "secret size");

/* Little-endian integers in wire buffers. */
static inline void boot_put_u16(uint8_t *p, uint16_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
}
static inline void boot_put_u32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint16_t boot_get_u16(const uint8_t *p) {
  return (uint16_t)(p[0] | (p[1] << 8));
}
static inline uint32_t boot_get_u32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Fills out with len random bytes (getrandom). */
brg_status brg__boot_random(uint8_t *out, size_t len, brg__errbuf *err);

/* Challenge and response (layouts above). A challenge with a fresh nonce
 * (written to `nonce` too); fixed_nonce, when not NULL, is used instead
 * (the fuzzer's). */
brg_status brg__boot_challenge_make(uint8_t m[BOOT_CHALLENGE_BYTES], uint8_t *nonce,
                                    const uint8_t *fixed_nonce, brg__errbuf *err);
/* Reads the acceptor's challenge on fd into nonce: BRG__IO_* (BRG__IO_ERR
 * with *why set when it is not a challenge of this version). */
int brg__boot_challenge_read(int fd, uint8_t *nonce, int64_t deadline, const char **why);
/* Writes the proof of a first message of `len` bytes (its bytes 4..20)
 * for the acceptor's nonce; verify says whether it holds, in constant time. */
void brg__boot_sign(uint8_t *msg, size_t len, const uint8_t *secret, const uint8_t *nonce);
int brg__boot_verify(const uint8_t *msg, size_t len, const uint8_t *secret, const uint8_t *nonce);
/* A ring or tree hello (BOOT_RING_HELLO bytes) checked against the magic
 * expected and the challenge its sender was given: 1 with *from and *to
 * set, or 0 with the reason in *why. */
int brg__boot_peer_hello_check(const uint8_t *m, uint32_t magic, const uint8_t *secret,
                               const uint8_t *challenge, int32_t *from, int32_t *to,
                               const char **why);
/* The tag of every answer on a connection whose dialer sent `nonce`. */
void brg__boot_answer_tag(uint8_t *tag, const uint8_t *secret, const uint8_t *nonce);
/* Decodes without logging; the root reports refusals its own way. */
brg_status brg__boot_hello_parse(const void *buf, size_t len, brg__boot_hello *h, brg__errbuf *why);
/* Builds the root's error answer (tagged with `tag`) into buf
 * (BOOT_REPLY_HDR + BOOT_MAX_ERRTEXT bytes) and returns its length. */
size_t brg__boot_reply_error(uint8_t *buf, const uint8_t *tag, brg_status st, const char *text);

/* The root's judgement of connections (service, admission, the tree
 * parents) without its listener or thread: each of the nfds non-blocking
 * sockets is sent a challenge with `nonce` and served as an accepted
 * connection for `rounds` rounds, and the parents sent when every rank
 * arrived. Takes the fds (closes them all). For the fuzzer. */
void brg__boot_root_serve(const uint8_t *secret, const uint8_t *nonce, const int *fds, int nfds,
                          int rounds);
/* A rank's bootstrap around sockets already open (fd_next, fd_prev may be
 * -1), listening nowhere but advertised at 127.0.0.1:listen_port; it takes
 * the fds. For the fuzzer and tests of the ring messages and the table:
 * the answers it reads (brg__bootstrap_read_table, _read_neigh) must carry
 * the tag for a dialer's nonce of 16 zero bytes. */
brg_status brg__bootstrap_wrap(brg__bootstrap **bs, int rank, int nranks, const uint8_t *secret,
                               uint16_t listen_port, int fd_next, int fd_prev, int timeout_ms,
                               brg__errbuf *err);
/* Reads and checks a table (as a tree parent sends it) on fd as
 * brg__bootstrap_init does. */
brg_status brg__bootstrap_read_table(brg__bootstrap *bs, int fd, size_t blob_bytes, void *all_blobs,
                                     brg__errbuf *err);
/* Reads and checks the root's answer (the tree parent) on fd as
 * brg__bootstrap_init does; fills parent_addr (BOOT_ADDR_BYTES) and *port. */
brg_status brg__bootstrap_read_neigh(brg__bootstrap *bs, int fd, size_t blob_bytes,
                                     char *parent_addr, uint16_t *parent_port, brg__errbuf *err);

/* The tree's all-gather (bootstrap_tree.c). */
typedef struct brg__boot_tree {
  int rank, nranks;
  const uint8_t *secret;
  const uint8_t *fixed_nonce; /* NULL: fresh challenges (the fuzzer fixes them) */
  int listen_fd;              /* where children dial in */
  int root_fd; /* watched: the root speaks before the release only when the job failed */
  const char *parent_addr; /* rank > 0 */
  uint16_t parent_port;
  const uint8_t *entry; /* this rank's: addr[64], u16 port, u16 zero, blob */
  size_t blob_bytes;
  int64_t deadline;
  int timeout_ms;
} brg__boot_tree;

/* Runs this rank's part of the all-gather; on success *table (malloc'd,
 * *table_bytes long) is the whole table as a parent sends it: the reply
 * header, then the payload. *root_spoke set (and BRG_ERR_REMOTE) when the
 * root said something first: the caller hears it. */
brg_status brg__boot_tree_gather(const brg__boot_tree *t, uint8_t **table, size_t *table_bytes,
                                 int *root_spoke, brg__errbuf *err);
/* Whether rank r is in the subtree of rank c. */
int brg__boot_tree_has(int c, int r);
/* Reads one child's gather (after its hello) from fd into the table
 * (filled[] per rank), checking every count, rank and entry; for the tree
 * and the fuzzer. */
brg_status brg__boot_tree_read_gather(const brg__boot_tree *t, int fd, int child, uint8_t *table,
                                      uint8_t *filled, int *root_spoke, brg__errbuf *err);

#endif
