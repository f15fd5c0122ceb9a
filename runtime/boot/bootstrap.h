/*
 * Bootstrap: how ranks find each other.
 *
 * A unique id holds a magic, a random secret, the root's address and port,
 * and a checksum. The root (a thread started by brg_get_unique_id, or by
 * rank 0 under brg_comm_init_env) collects one hello per rank and answers
 * every rank with its parent in a binary tree of the ranks; the table of
 * all ranks' blobs then spreads over that tree (bootstrap_tree.c).
 * Connections that do not present the secret are refused; every length
 * read from a socket is checked against a bound before use.
 *
 * After the table, each rank opens a persistent "ring socket" to its ring
 * successor and accepts one from its predecessor. Ring sockets carry small
 * framed messages (transport connection info, abort notices) and their
 * hang-up tells a rank that a neighbour died.
 */
#ifndef BRG_BOOTSTRAP_H
#define BRG_BOOTSTRAP_H

#include <stddef.h>
#include <stdint.h>
#include "brigade.h"
#include "log.h"

#include "bootstrap_id.h"

/* Starts a root thread listening on addr:port (port 0: any free port) that
 * serves one communicator and then exits (also after `timeout_ms` without
 * all ranks, telling those that came which ranks never arrived; <= 0 waits
 * forever). Fills `id`. */
brg_status brg__boot_root_start(const char *addr, uint16_t port, const uint8_t *secret,
                                int timeout_ms, brg__boot_id *id, brg__errbuf *err);

/* The bytes every bootstrap root of this process has read and written on
 * its sockets so far (for the init benchmark). */
void brg__boot_root_stats(uint64_t *bytes_in, uint64_t *bytes_out);

/* Waits (up to max_ms) until the roots this process started have finished:
 * a root whose job failed keeps telling the ranks that arrive late why,
 * until every rank has been told or its deadline. */
void brg__boot_root_linger(int max_ms);

/* The address this process advertises: BRIGADE_BOOTSTRAP_ADDR, else the
 * first up non-loopback IPv4 address (of BRIGADE_SOCKET_IFNAME if set),
 * else 127.0.0.1. */
brg_status brg__boot_local_addr(char *addr, size_t addr_bytes, brg__errbuf *err);

typedef struct brg__bootstrap brg__bootstrap;

/* Joins the root and the tree: sends this rank's blob, receives every rank's blob into
 * `all_blobs` (nranks * blob_bytes, in rank order; every rank must pass the
 * same blob_bytes). Retries connecting until timeout_ms (the root may not be
 * listening yet); timeout_ms <= 0 waits forever. The same timeout bounds
 * ring_connect and each send. A missing rank is BRG_ERR_TIMEOUT, a refusal
 * by the root BRG_ERR_REMOTE, both with the root's explanation. */
brg_status brg__bootstrap_init(brg__bootstrap **bs, const brg__boot_id *id, int rank, int nranks,
                               const void *blob, size_t blob_bytes, void *all_blobs, int timeout_ms,
                               brg__errbuf *err);

/* A communicator split from another needs no root: its members already
 * know each other. brg__bootstrap_open opens this rank's ring listener and
 * writes the head of its table entry (BRG__BOOT_ENTRY_HDR bytes: address,
 * port) into `entry`; the caller gathers every member's entry (that head,
 * then the blob) over the parent, in the new rank order, and hands the lot
 * to brg__bootstrap_set_table, which checks it as a root's table is
 * checked. brg__bootstrap_confirm is then a no-op: the caller confirms over
 * the parent. */
#define BRG__BOOT_ENTRY_HDR 68
brg_status brg__bootstrap_open(brg__bootstrap **bs, int rank, int nranks, const uint8_t *secret,
                               int timeout_ms, uint8_t *entry, brg__errbuf *err);
brg_status brg__bootstrap_set_table(brg__bootstrap *bs, const uint8_t *entries, size_t blob_bytes,
                                    void *all_blobs, brg__errbuf *err);

/* A check that the waits of the set-up (the ring sockets' connection,
 * brg__bootstrap_recv with a timeout) make every BRG__BOOT_WATCH_MS:
 * nonzero, with a reason in `why`, ends the wait at once with
 * BRG_ERR_REMOTE and that reason. A split's members watch their parent's
 * liveness this way, so a member that died while the new communicator
 * formed does not hold the others up to the timeout. NULL: none. */
#define BRG__BOOT_WATCH_MS 100
typedef int (*brg__boot_watch_fn)(void *arg, char *why, size_t why_bytes);
void brg__bootstrap_set_watch(brg__bootstrap *bs, brg__boot_watch_fn fn, void *arg);
/* Asks the watch (for the waits of the transports' set-up): nonzero with
 * its reason in `why` when the set-up should stop; 0 without a watch. */
int brg__bootstrap_watch(brg__bootstrap *bs, char *why, size_t why_bytes);

/* Opens the ring sockets: connects to `next` and accepts from `prev` (both
 * may be the same rank when nranks == 2; nothing happens when nranks == 1). */
brg_status brg__bootstrap_ring_connect(brg__bootstrap *bs, int next, int prev, brg__errbuf *err);

enum { BRG__RING_NEXT = 0, BRG__RING_PREV = 1 };

/* Framed messages on a ring socket: type, length (<= BRG__BOOT_MAX_MSG), payload. */
brg_status brg__bootstrap_send(brg__bootstrap *bs, int dir, uint32_t type, const void *data,
                               uint32_t len, brg__errbuf *err);
/* Blocks up to timeout_ms for the next message on that ring socket (< 0:
 * forever; 0: only a message already there, and a quiet BRG_ERR_TIMEOUT
 * otherwise). A message larger than max_len is consumed and refused with
 * BRG_ERR_REMOTE. Calls on one direction must not overlap; the two
 * directions may be used from different threads. */
brg_status brg__bootstrap_recv(brg__bootstrap *bs, int dir, uint32_t *type, void *data,
                               uint32_t max_len, uint32_t *len, int timeout_ms, brg__errbuf *err);
/* Where rank `rank`'s ring listener was (numeric address; *port set when
 * not NULL), as the bootstrap table said: for logs and topology. NULL when
 * out of range. */
const char *brg__bootstrap_peer_addr(const brg__bootstrap *bs, int rank, uint16_t *port);
/* Tells the root that this rank's communicator is set up and waits (up to
 * the bootstrap's timeout) until every rank has said so. The root releases
 * nobody before then, so a rank that two processes claimed fails the job
 * on every rank, with BRG_ERR_REMOTE and a message naming both claimants. */
brg_status brg__bootstrap_confirm(brg__bootstrap *bs, brg__errbuf *err);
/* After this rank's set-up failed (*st, err): when the root has failed the
 * job (a rank claimed twice, another rank gone), its reason is appended to
 * err and *st becomes BRG_ERR_REMOTE, so that every rank says what went
 * wrong first. Waits a moment for the root's word; a no-op without one. */
void brg__bootstrap_verdict(brg__bootstrap *bs, brg_status *st, brg__errbuf *err);
/* File descriptor of a ring socket (for poll), -1 when absent. */
int brg__bootstrap_fd(const brg__bootstrap *bs, int dir);
/* The key data connections present in their hellos (BRG__SECRET_BYTES):
 * HMAC-SHA-256 of the job secret, so the secret itself never travels. */
const uint8_t *brg__bootstrap_secret(const brg__bootstrap *bs);
void brg__bootstrap_destroy(brg__bootstrap *bs);

#endif
