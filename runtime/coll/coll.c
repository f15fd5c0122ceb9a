/*
 * The collectives of the public API: argument checks, then the call is
 * handed to the progress layer (inline or queued, in issue order).
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "device.h"
#include "exec.h"
#include "internal.h"

static brg_status check_call(brg_comm *c, const char *fn, const void *sendbuf, const void *recvbuf,
                             size_t count, size_t send_elems, size_t recv_elems, brg_dtype dtype,
                             int check_op, brg_op op, int root, brg_stream stream, brg__coll *k) {
  brg_status s = brg__check_comm(c, fn);
  if (s != BRG_SUCCESS) return s;
  if ((unsigned)dtype >= BRG_NUM_DTYPES)
    return brg__comm_error(c, BRG_ERR_INVALID_ARGUMENT, "%s: unknown dtype %d", fn, (int)dtype);
  if (check_op && (unsigned)op >= BRG_NUM_OPS)
    return brg__comm_error(c, BRG_ERR_INVALID_ARGUMENT, "%s: unknown op %d", fn, (int)op);
  if (check_op && op >= BRG_BAND && dtype >= BRG_FLOAT16)
    return brg__comm_error(c, BRG_ERR_INVALID_ARGUMENT,
                           "%s: op %s takes integer dtypes only, not %s", fn, brg_op_name(op),
                           brg_dtype_name(dtype));
  if (root != -1 && (root < 0 || root >= c->nranks))
    return brg__comm_error(c, BRG_ERR_INVALID_ARGUMENT, "%s: root %d is not in [0, %d)", fn, root,
                           c->nranks);
  size_t esize = brg_dtype_size(dtype);
  size_t limit = (SIZE_MAX / 4) / esize / (size_t)c->nranks;
  if (count > limit)
    return brg__comm_error(c, BRG_ERR_INVALID_ARGUMENT, "%s: count %zu is too large", fn, count);
  if (send_elems && !sendbuf)
    return brg__comm_error(c, BRG_ERR_INVALID_ARGUMENT, "%s: sendbuf is NULL with count %zu", fn,
                           count);
  if (recv_elems && !recvbuf)
    return brg__comm_error(c, BRG_ERR_INVALID_ARGUMENT, "%s: recvbuf is NULL with count %zu", fn,
                           count);
  k->stream = stream;
  s = brg__device_check_call(c, fn, sendbuf, recvbuf, stream, k);
  if (s != BRG_SUCCESS) return s;
  if (send_elems && recv_elems && sendbuf != recvbuf) {
    const char *a = sendbuf, *b = recvbuf;
    size_t sa = send_elems * esize, sb = recv_elems * esize;
    int overlap = a < b + sb && b < a + sa;
    /* In place in NCCL's sense: one buffer lies exactly at this rank's block of the other. */
    int nccl_inplace = (b == a + (size_t)c->rank * sb && sb * (size_t)c->nranks == sa) ||
                       (a == b + (size_t)c->rank * sa && sa * (size_t)c->nranks == sb);
    if (overlap && !nccl_inplace)
      return brg__comm_error(c, BRG_ERR_INVALID_ARGUMENT,
                             "%s: sendbuf and recvbuf overlap without being in place", fn);
  }
  if (__atomic_load_n(&c->aborted, __ATOMIC_ACQUIRE)) return brg__comm_aborted(c, fn);
  /* Written by whichever thread ran the failed call (the communicator may
   * be shared by threads, or the progress thread): read atomically. */
  return __atomic_load_n(&c->broken, __ATOMIC_ACQUIRE);
}

#define COLL(KIND, SB, RB, CNT, DT, OP, ROOT)                                                      \
  (brg__coll) {                                                                                    \
    .kind = (KIND), .dtype = (DT), .op = (OP), .root = (ROOT), .sendbuf = (SB), .recvbuf = (RB),   \
    .count = (CNT)                                                                                 \
  }

/* Each collective's checks fill k; the blocking form runs it, the
 * non-blocking form (stream NULL, host buffers) queues it on a request. */

static brg_status prep_allreduce(const char *fn, const void *sendbuf, void *recvbuf, size_t count,
                                 brg_dtype dtype, brg_op op, brg_comm *comm, brg_stream stream,
                                 brg__coll *k) {
  *k = COLL(BRG__COLL_ALLREDUCE, sendbuf, recvbuf, count, dtype, op, -1);
  return check_call(comm, fn, sendbuf, recvbuf, count, count, count, dtype, 1, op, -1, stream, k);
}

static brg_status prep_reduce_scatter(const char *fn, const void *sendbuf, void *recvbuf,
                                      size_t recvcount, brg_dtype dtype, brg_op op, brg_comm *comm,
                                      brg_stream stream, brg__coll *k) {
  size_t n = comm && comm->magic == BRG__COMM_MAGIC ? (size_t)comm->nranks : 1;
  *k = COLL(BRG__COLL_REDUCE_SCATTER, sendbuf, recvbuf, recvcount, dtype, op, -1);
  return check_call(comm, fn, sendbuf, recvbuf, recvcount, recvcount * n, recvcount, dtype, 1, op,
                    -1, stream, k);
}

static brg_status prep_all_gather(const char *fn, const void *sendbuf, void *recvbuf,
                                  size_t sendcount, brg_dtype dtype, brg_comm *comm,
                                  brg_stream stream, brg__coll *k) {
  size_t n = comm && comm->magic == BRG__COMM_MAGIC ? (size_t)comm->nranks : 1;
  *k = COLL(BRG__COLL_ALL_GATHER, sendbuf, recvbuf, sendcount, dtype, BRG_SUM, -1);
  return check_call(comm, fn, sendbuf, recvbuf, sendcount, sendcount, sendcount * n, dtype, 0,
                    BRG_SUM, -1, stream, k);
}

static brg_status prep_broadcast(const char *fn, const void *sendbuf, void *recvbuf, size_t count,
                                 brg_dtype dtype, int root, brg_comm *comm, brg_stream stream,
                                 brg__coll *k) {
  brg_status s = brg__check_comm(comm, fn);
  if (s != BRG_SUCCESS) return s;
  if (root < 0 || root >= comm->nranks)
    return brg__comm_error(comm, BRG_ERR_INVALID_ARGUMENT, "%s: root %d is not in [0, %d)", fn,
                           root, comm->nranks);
  int is_root = comm->rank == root;
  *k = COLL(BRG__COLL_BROADCAST, is_root ? sendbuf : NULL, recvbuf, count, dtype, BRG_SUM, root);
  return check_call(comm, fn, is_root ? sendbuf : NULL, recvbuf, count, is_root ? count : 0, count,
                    dtype, 0, BRG_SUM, root, stream, k);
}

static brg_status prep_reduce(const char *fn, const void *sendbuf, void *recvbuf, size_t count,
                              brg_dtype dtype, brg_op op, int root, brg_comm *comm,
                              brg_stream stream, brg__coll *k) {
  brg_status s = brg__check_comm(comm, fn);
  if (s != BRG_SUCCESS) return s;
  if (root < 0 || root >= comm->nranks)
    return brg__comm_error(comm, BRG_ERR_INVALID_ARGUMENT, "%s: root %d is not in [0, %d)", fn,
                           root, comm->nranks);
  int is_root = comm->rank == root;
  *k = COLL(BRG__COLL_REDUCE, sendbuf, is_root ? recvbuf : NULL, count, dtype, op, root);
  return check_call(comm, fn, sendbuf, is_root ? recvbuf : NULL, count, count, is_root ? count : 0,
                    dtype, 1, op, root, stream, k);
}

static brg_status prep_barrier(const char *fn, brg_comm *comm, brg__coll *k) {
  *k = COLL(BRG__COLL_BARRIER, NULL, NULL, 0, BRG_INT8, BRG_SUM, -1);
  return check_call(comm, fn, NULL, NULL, 0, 0, 0, BRG_INT8, 1, BRG_SUM, -1, NULL, k);
}

/* Runs a checked collective through the executor the policy picks. */
static brg_status run_issued(brg_comm *comm, brg__coll *k) {
  return brg__exec_issue(comm, k);
}

/* Queues a checked host collective on the caller's request. */
static brg_status issue(brg_comm *comm, const char *fn, const brg__coll *k, brg_request *request) {
  if (k->staged)
    return brg__comm_error(comm, BRG_ERR_INVALID_ARGUMENT,
                           "%s: the buffers are GPU memory: the non-blocking form takes host "
                           "buffers (the blocking form takes GPU buffers, staged through host "
                           "memory)",
                           fn);
  if (k->device)
    return brg__comm_error(comm, BRG_ERR_INVALID_ARGUMENT,
                           "%s: the buffers are GPU memory: device collectives are asynchronous "
                           "on their stream already (use the blocking form with a stream)",
                           fn);
  /* The policy before the request's checks: an allreduce's hierarchy is
   * made at the same call on every rank. */
  brg__coll x = *k;
  brg_status s = brg__exec_choose(comm, &x);
  if (s != BRG_SUCCESS) return s;
  if (!request) return brg__comm_error(comm, BRG_ERR_INVALID_ARGUMENT, "%s: request is NULL", fn);
  brg__req *r = (brg__req *)request;
  if (brg__req_in_flight(r))
    return brg__comm_error(comm, BRG_ERR_INVALID_USAGE, "%s: request is still in flight", fn);
  memset(r, 0, sizeof *r);
  r->coll = x;
  return brg__progress_enqueue(comm, r);
}

brg_status brg_allreduce(const void *sendbuf, void *recvbuf, size_t count, brg_dtype dtype,
                         brg_op op, brg_comm *comm, brg_stream stream) {
  brg__coll k;
  brg_status s =
      prep_allreduce("brg_allreduce", sendbuf, recvbuf, count, dtype, op, comm, stream, &k);
  return s != BRG_SUCCESS ? s : run_issued(comm, &k);
}

brg_status brg_reduce_scatter(const void *sendbuf, void *recvbuf, size_t recvcount, brg_dtype dtype,
                              brg_op op, brg_comm *comm, brg_stream stream) {
  brg__coll k;
  brg_status s = prep_reduce_scatter("brg_reduce_scatter", sendbuf, recvbuf, recvcount, dtype, op,
                                     comm, stream, &k);
  return s != BRG_SUCCESS ? s : run_issued(comm, &k);
}

brg_status brg_all_gather(const void *sendbuf, void *recvbuf, size_t sendcount, brg_dtype dtype,
                          brg_comm *comm, brg_stream stream) {
  brg__coll k;
  brg_status s =
      prep_all_gather("brg_all_gather", sendbuf, recvbuf, sendcount, dtype, comm, stream, &k);
  return s != BRG_SUCCESS ? s : run_issued(comm, &k);
}

brg_status brg_broadcast(const void *sendbuf, void *recvbuf, size_t count, brg_dtype dtype,
                         int root, brg_comm *comm, brg_stream stream) {
  brg__coll k;
  brg_status s =
      prep_broadcast("brg_broadcast", sendbuf, recvbuf, count, dtype, root, comm, stream, &k);
  return s != BRG_SUCCESS ? s : run_issued(comm, &k);
}

brg_status brg_reduce(const void *sendbuf, void *recvbuf, size_t count, brg_dtype dtype, brg_op op,
                      int root, brg_comm *comm, brg_stream stream) {
  brg__coll k;
  brg_status s =
      prep_reduce("brg_reduce", sendbuf, recvbuf, count, dtype, op, root, comm, stream, &k);
  return s != BRG_SUCCESS ? s : run_issued(comm, &k);
}

/* No non-blocking form (yet): the checks and the run in one. */
brg_status brg_all_to_all(const void *sendbuf, void *recvbuf, size_t count, brg_dtype dtype,
                          brg_comm *comm, brg_stream stream) {
  const char *fn = "brg_all_to_all";
  brg_status s = brg__check_comm(comm, fn);
  if (s != BRG_SUCCESS) return s;
  if (stream)
    return brg__comm_error(comm, BRG_ERR_INVALID_ARGUMENT,
                           "%s: host buffers only: stream must be NULL", fn);
  size_t n = (size_t)comm->nranks;
  brg__coll k = COLL(BRG__COLL_ALL_TO_ALL, sendbuf, recvbuf, count, dtype, BRG_SUM, -1);
  s = check_call(comm, fn, sendbuf, recvbuf, count, count * n, count * n, dtype, 0, BRG_SUM, -1,
                 NULL, &k);
  if (s == BRG_SUCCESS && k.device)
    s = brg__comm_error(comm, BRG_ERR_INVALID_ARGUMENT,
                        "%s: the buffers are GPU memory: all_to_all takes host buffers only", fn);
  return s != BRG_SUCCESS ? s : run_issued(comm, &k);
}

/* gather and scatter (rooted.c): the root's side holds N blocks, the
 * other ranks' one. Host buffers with stream NULL, or GPU buffers (with a
 * stream, or NULL for the legacy default stream) in the blocking forms,
 * staged through host memory; each rank chooses for itself, so ranks with
 * host buffers and ranks with GPU buffers may meet in one call. */
static brg_status prep_rooted(const char *fn, brg__coll_kind kind, const void *sendbuf,
                              void *recvbuf, size_t count, brg_dtype dtype, int root,
                              brg_comm *comm, brg_stream stream, brg__coll *k) {
  brg_status s = brg__check_comm(comm, fn);
  if (s != BRG_SUCCESS) return s;
  if (root < 0 || root >= comm->nranks)
    return brg__comm_error(comm, BRG_ERR_INVALID_ARGUMENT, "%s: root %d is not in [0, %d)", fn,
                           root, comm->nranks);
  size_t n = (size_t)comm->nranks;
  int is_root = comm->rank == root, gather = kind == BRG__COLL_GATHER;
  if (gather && !is_root) recvbuf = NULL;
  if (!gather && !is_root) sendbuf = NULL;
  size_t send_elems = gather ? count : is_root ? count * n : 0;
  size_t recv_elems = !gather ? count : is_root ? count * n : 0;
  *k = COLL(kind, sendbuf, recvbuf, count, dtype, BRG_SUM, root);
  k->staged = 1; /* if the buffers are GPU memory */
  s = check_call(comm, fn, sendbuf, recvbuf, count, send_elems, recv_elems, dtype, 0, BRG_SUM, root,
                 stream, k);
  if (s == BRG_SUCCESS && !k->device) k->staged = 0;
  return s;
}

brg_status brg_gather(const void *sendbuf, void *recvbuf, size_t sendcount, brg_dtype dtype,
                      int root, brg_comm *comm, brg_stream stream) {
  brg__coll k;
  brg_status s = prep_rooted("brg_gather", BRG__COLL_GATHER, sendbuf, recvbuf, sendcount, dtype,
                             root, comm, stream, &k);
  if (s != BRG_SUCCESS) return s;
  return run_issued(comm, &k);
}

brg_status brg_scatter(const void *sendbuf, void *recvbuf, size_t recvcount, brg_dtype dtype,
                       int root, brg_comm *comm, brg_stream stream) {
  brg__coll k;
  brg_status s = prep_rooted("brg_scatter", BRG__COLL_SCATTER, sendbuf, recvbuf, recvcount, dtype,
                             root, comm, stream, &k);
  if (s != BRG_SUCCESS) return s;
  return run_issued(comm, &k);
}

brg_status brg_igather(const void *sendbuf, void *recvbuf, size_t sendcount, brg_dtype dtype,
                       int root, brg_comm *comm, brg_request *request) {
  brg__coll k;
  brg_status s = prep_rooted("brg_igather", BRG__COLL_GATHER, sendbuf, recvbuf, sendcount, dtype,
                             root, comm, NULL, &k);
  return s != BRG_SUCCESS ? s : issue(comm, "brg_igather", &k, request);
}

brg_status brg_iscatter(const void *sendbuf, void *recvbuf, size_t recvcount, brg_dtype dtype,
                        int root, brg_comm *comm, brg_request *request) {
  brg__coll k;
  brg_status s = prep_rooted("brg_iscatter", BRG__COLL_SCATTER, sendbuf, recvbuf, recvcount, dtype,
                             root, comm, NULL, &k);
  return s != BRG_SUCCESS ? s : issue(comm, "brg_iscatter", &k, request);
}

/* ---- point-to-point ---- */

/* The checks of a send or receive: the collectives' (dtype, count, NULL
 * buffer, GPU memory, abort), and the peer's range. */
static brg_status check_p2p(brg_comm *c, const char *fn, const void *buf, size_t count,
                            brg_dtype dtype, int peer, brg_stream stream, int is_send) {
  brg_status s = brg__check_comm(c, fn);
  if (s != BRG_SUCCESS) return s;
  if (peer == BRG_ANY_SOURCE && is_send)
    return brg__comm_error(c, BRG_ERR_INVALID_ARGUMENT,
                           "%s: peer BRG_ANY_SOURCE (-1) is for receives; a send names its "
                           "rank in [0, %d)",
                           fn, c->nranks);
  if ((peer < 0 && peer != BRG_ANY_SOURCE) || peer >= c->nranks)
    return brg__comm_error(c, BRG_ERR_INVALID_ARGUMENT,
                           "%s: peer %d is not in [0, %d) nor BRG_ANY_SOURCE (-1)", fn, peer,
                           c->nranks);
  if (stream)
    return brg__comm_error(c, BRG_ERR_INVALID_ARGUMENT,
                           "%s: host buffers only: stream must be NULL", fn);
  brg__coll k = COLL(BRG__COLL_ALL_TO_ALL, NULL, NULL, count, dtype, BRG_SUM, -1);
  s = check_call(c, fn, is_send ? buf : NULL, is_send ? NULL : buf, count, is_send ? count : 0,
                 is_send ? 0 : count, dtype, 0, BRG_SUM, -1, NULL, &k);
  if (s == BRG_SUCCESS && k.device)
    return brg__comm_error(c, BRG_ERR_INVALID_ARGUMENT,
                           "%s: the buffer is GPU memory: point-to-point takes host buffers only",
                           fn);
  return s;
}

static brg_status p2p_request(brg_comm *c, const char *fn, brg_request *request, int is_send,
                              brg__req **out) {
  if (!request) return brg__comm_error(c, BRG_ERR_INVALID_ARGUMENT, "%s: request is NULL", fn);
  brg__req *r = (brg__req *)request;
  if (brg__req_in_flight(r))
    return brg__comm_error(c, BRG_ERR_INVALID_USAGE, "%s: request is still in flight", fn);
  memset(r, 0, sizeof *r);
  r->comm = c;
  r->p2p_op.is_send = is_send;
  r->magic = BRG__REQ_P2P_MAGIC;
  *out = r;
  return BRG_SUCCESS;
}

/* A tag is the caller's, in [0, INT_MAX] (as an MPI tag, but without
 * a wildcard: a receive names the tag it takes). */
static brg_status check_tag(brg_comm *c, const char *fn, int tag) {
  if (tag < 0)
    return brg__comm_error(c, BRG_ERR_INVALID_ARGUMENT,
                           "%s: tag %d is negative (tags are in [0, INT_MAX])", fn, tag);
  return BRG_SUCCESS;
}

static brg_status send_tagged(const char *fn, const void *buf, size_t count, brg_dtype dtype,
                              int peer, int tag, brg_comm *comm, brg_stream stream) {
  brg_status s = check_p2p(comm, fn, buf, count, dtype, peer, stream, 1);
  if (s == BRG_SUCCESS) s = check_tag(comm, fn, tag);
  if (s != BRG_SUCCESS) return s;
  brg__p2p_op op = {.buf = (char *)buf,
                    .count = count,
                    .tag = (uint32_t)tag,
                    .peer = peer,
                    .dtype = (uint32_t)dtype,
                    .chan = BRG__P2P_USER,
                    .is_send = 1};
  s = brg__p2p_isend(comm, fn, &op);
  return s != BRG_SUCCESS ? s : brg__p2p_wait(comm, fn, &op);
}

static brg_status recv_tagged(const char *fn, void *buf, size_t count, brg_dtype dtype, int peer,
                              int tag, brg_comm *comm, brg_stream stream) {
  brg_status s = check_p2p(comm, fn, buf, count, dtype, peer, stream, 0);
  if (s == BRG_SUCCESS) s = check_tag(comm, fn, tag);
  if (s != BRG_SUCCESS) return s;
  brg__p2p_op op = {.buf = buf,
                    .count = count,
                    .tag = (uint32_t)tag,
                    .peer = peer,
                    .dtype = (uint32_t)dtype,
                    .chan = BRG__P2P_USER,
                    .any = peer == BRG_ANY_SOURCE};
  s = brg__p2p_post(comm, &op);
  return s != BRG_SUCCESS ? s : brg__p2p_wait(comm, fn, &op);
}

/* A send joins its peer's send queue: it has finished once its bytes have
 * all left buf, which the receiver's early-message cap may hold back. */
static brg_status isend_tagged(const char *fn, const void *buf, size_t count, brg_dtype dtype,
                               int peer, int tag, brg_comm *comm, brg_request *request) {
  brg_status s = check_p2p(comm, fn, buf, count, dtype, peer, NULL, 1);
  if (s == BRG_SUCCESS) s = check_tag(comm, fn, tag);
  brg__req *r = NULL;
  if (s == BRG_SUCCESS) s = p2p_request(comm, fn, request, 1, &r);
  if (s != BRG_SUCCESS) return s;
  r->p2p_op = (brg__p2p_op){.buf = (char *)buf,
                            .count = count,
                            .tag = (uint32_t)tag,
                            .peer = peer,
                            .dtype = (uint32_t)dtype,
                            .chan = BRG__P2P_USER,
                            .is_send = 1,
                            .comm_serial = comm->serial};
  return brg__p2p_isend(comm, fn, &r->p2p_op); /* a failure finishes the request */
}

static brg_status irecv_tagged(const char *fn, void *buf, size_t count, brg_dtype dtype, int peer,
                               int tag, brg_comm *comm, brg_request *request) {
  brg_status s = check_p2p(comm, fn, buf, count, dtype, peer, NULL, 0);
  if (s == BRG_SUCCESS) s = check_tag(comm, fn, tag);
  brg__req *r = NULL;
  if (s == BRG_SUCCESS) s = p2p_request(comm, fn, request, 0, &r);
  if (s != BRG_SUCCESS) return s;
  r->p2p_op = (brg__p2p_op){.buf = buf,
                            .count = count,
                            .tag = (uint32_t)tag,
                            .peer = peer,
                            .dtype = (uint32_t)dtype,
                            .chan = BRG__P2P_USER,
                            .any = peer == BRG_ANY_SOURCE,
                            .comm_serial = comm->serial};
  s = brg__p2p_post(comm, &r->p2p_op);
  if (s != BRG_SUCCESS) r->magic = 0; /* never issued */
  return s;
}

brg_status brg_send(const void *buf, size_t count, brg_dtype dtype, int peer, brg_comm *comm,
                    brg_stream stream) {
  return send_tagged("brg_send", buf, count, dtype, peer, 0, comm, stream);
}

brg_status brg_recv(void *buf, size_t count, brg_dtype dtype, int peer, brg_comm *comm,
                    brg_stream stream) {
  return recv_tagged("brg_recv", buf, count, dtype, peer, 0, comm, stream);
}

brg_status brg_isend(const void *buf, size_t count, brg_dtype dtype, int peer, brg_comm *comm,
                     brg_request *request) {
  return isend_tagged("brg_isend", buf, count, dtype, peer, 0, comm, request);
}

brg_status brg_irecv(void *buf, size_t count, brg_dtype dtype, int peer, brg_comm *comm,
                     brg_request *request) {
  return irecv_tagged("brg_irecv", buf, count, dtype, peer, 0, comm, request);
}

brg_status brg_send_tagged(const void *buf, size_t count, brg_dtype dtype, int peer, int tag,
                           brg_comm *comm, brg_stream stream) {
  return send_tagged("brg_send_tagged", buf, count, dtype, peer, tag, comm, stream);
}

brg_status brg_recv_tagged(void *buf, size_t count, brg_dtype dtype, int peer, int tag,
                           brg_comm *comm, brg_stream stream) {
  return recv_tagged("brg_recv_tagged", buf, count, dtype, peer, tag, comm, stream);
}

brg_status brg_isend_tagged(const void *buf, size_t count, brg_dtype dtype, int peer, int tag,
                            brg_comm *comm, brg_request *request) {
  return isend_tagged("brg_isend_tagged", buf, count, dtype, peer, tag, comm, request);
}

brg_status brg_irecv_tagged(void *buf, size_t count, brg_dtype dtype, int peer, int tag,
                            brg_comm *comm, brg_request *request) {
  return irecv_tagged("brg_irecv_tagged", buf, count, dtype, peer, tag, comm, request);
}

brg_status brg_request_source(const brg_request *request, int *source) {
  const char *fn = "brg_request_source";
  if (!request || !source)
    return brg__fail_no_comm(BRG_ERR_INVALID_ARGUMENT, "%s: NULL argument", fn);
  const brg__req *r = (const brg__req *)request;
  if (r->magic != BRG__REQ_P2P_MAGIC || r->p2p_op.is_send)
    return brg__fail_no_comm(BRG_ERR_INVALID_ARGUMENT,
                             "%s: the request is not a receive (brg_irecv)", fn);
  const brg__p2p_op *op = &r->p2p_op;
  if (!__atomic_load_n(&op->done, __ATOMIC_ACQUIRE))
    return brg__fail_no_comm(BRG_ERR_INVALID_USAGE,
                             "%s: the receive has not finished (brg_test or brg_wait first)", fn);
  /* Written under the p2p lock before `done` (release). */
  int peer = op->peer;
  if (peer < 0)
    return brg__fail_no_comm(BRG_ERR_INVALID_USAGE,
                             "%s: no message came for the receive (it ended with %s)", fn,
                             brg_status_string(op->status));
  *source = peer;
  return BRG_SUCCESS;
}

brg_status brg_barrier(brg_comm *comm) {
  brg__coll k;
  brg_status s = prep_barrier("brg_barrier", comm, &k);
  return s != BRG_SUCCESS ? s : run_issued(comm, &k);
}

brg_status brg_comm_device_setup(brg_comm *comm, int device) {
  const char *fn = "brg_comm_device_setup";
  brg_status s = brg__check_comm(comm, fn);
  if (s != BRG_SUCCESS) return s;
  brg__coll k = COLL(BRG__COLL_BARRIER, NULL, NULL, 0, BRG_INT8, BRG_SUM, -1);
  if ((s = brg__device_choose(comm, fn, device, &k.gpu)) != BRG_SUCCESS) return s;
  if (comm->nranks == 1) return BRG_SUCCESS;
  if (__atomic_load_n(&comm->aborted, __ATOMIC_ACQUIRE))
    return brg__comm_error(comm, BRG_ERR_ABORTED, "%s: communicator was aborted", fn);
  if ((s = __atomic_load_n(&comm->broken, __ATOMIC_ACQUIRE)) != BRG_SUCCESS) return s;
  /* The device executors' setup alone, in issue order, where it has not
   * run yet. */
  k.device = 1;
  k.setup_only = 1;
  k.exec = brg__exec_leaf(comm, &k);
  if (k.exec == &brg__exec_device && (s = brg__exec_device_links(comm, &k)) == BRG_SUCCESS)
    s = brg__progress_run(comm, &k);
  if (s != BRG_SUCCESS) return s;
  /* BRIGADE_ALGO=hier: the hierarchy's device rings too. */
  brg_comm *parts[2];
  if ((s = brg__hier_device_prepare(comm, &parts[0], &parts[1])) != BRG_SUCCESS) return s;
  for (int i = 0; i < 2 && parts[i]; i++)
    if ((s = brg_comm_device_setup(parts[i], k.gpu)) != BRG_SUCCESS)
      return brg__comm_error(comm, s, "%s: the device setup of the hierarchical allreduce's %s: %s",
                             fn, i ? "communicator across hosts" : "communicator within the host",
                             brg_comm_last_error(parts[i]));
  return BRG_SUCCESS;
}

/* ---- non-blocking forms ---- */

brg_status brg_iallreduce(const void *sendbuf, void *recvbuf, size_t count, brg_dtype dtype,
                          brg_op op, brg_comm *comm, brg_request *request) {
  brg__coll k;
  brg_status s =
      prep_allreduce("brg_iallreduce", sendbuf, recvbuf, count, dtype, op, comm, NULL, &k);
  return s != BRG_SUCCESS ? s : issue(comm, "brg_iallreduce", &k, request);
}

brg_status brg_ireduce_scatter(const void *sendbuf, void *recvbuf, size_t recvcount,
                               brg_dtype dtype, brg_op op, brg_comm *comm, brg_request *request) {
  brg__coll k;
  brg_status s = prep_reduce_scatter("brg_ireduce_scatter", sendbuf, recvbuf, recvcount, dtype, op,
                                     comm, NULL, &k);
  return s != BRG_SUCCESS ? s : issue(comm, "brg_ireduce_scatter", &k, request);
}

brg_status brg_iall_gather(const void *sendbuf, void *recvbuf, size_t sendcount, brg_dtype dtype,
                           brg_comm *comm, brg_request *request) {
  brg__coll k;
  brg_status s =
      prep_all_gather("brg_iall_gather", sendbuf, recvbuf, sendcount, dtype, comm, NULL, &k);
  return s != BRG_SUCCESS ? s : issue(comm, "brg_iall_gather", &k, request);
}

brg_status brg_ibroadcast(const void *sendbuf, void *recvbuf, size_t count, brg_dtype dtype,
                          int root, brg_comm *comm, brg_request *request) {
  brg__coll k;
  brg_status s =
      prep_broadcast("brg_ibroadcast", sendbuf, recvbuf, count, dtype, root, comm, NULL, &k);
  return s != BRG_SUCCESS ? s : issue(comm, "brg_ibroadcast", &k, request);
}

brg_status brg_ireduce(const void *sendbuf, void *recvbuf, size_t count, brg_dtype dtype, brg_op op,
                       int root, brg_comm *comm, brg_request *request) {
  brg__coll k;
  brg_status s =
      prep_reduce("brg_ireduce", sendbuf, recvbuf, count, dtype, op, root, comm, NULL, &k);
  return s != BRG_SUCCESS ? s : issue(comm, "brg_ireduce", &k, request);
}

brg_status brg_ibarrier(brg_comm *comm, brg_request *request) {
  brg__coll k;
  brg_status s = prep_barrier("brg_ibarrier", comm, &k);
  return s != BRG_SUCCESS ? s : issue(comm, "brg_ibarrier", &k, request);
}

/* A point-to-point request whose communicator was destroyed: the destroy
 * finished it (as aborted, if it was still outstanding), and what it says
 * comes from the request alone. */
static brg_status p2p_orphan(const char *fn, const brg__req *r) {
  const brg__p2p_op *op = &r->p2p_op;
  brg_status s = __atomic_load_n(&op->done, __ATOMIC_ACQUIRE) ? op->status : BRG_ERR_ABORTED;
  if (s == BRG_SUCCESS) return s;
  const char *dn = brg_dtype_name((brg_dtype)op->dtype);
  char who[32] = "any rank";
  if (op->peer >= 0) snprintf(who, sizeof who, "rank %d", op->peer);
  if (s == BRG_ERR_ABORTED)
    return brg__fail_no_comm(s,
                             "%s: %s of %llu x %s %s %s: the communicator was aborted or "
                             "destroyed before it finished",
                             fn, op->is_send ? "send" : "receive", (unsigned long long)op->count,
                             dn ? dn : "?", op->is_send ? "to" : "from", who);
  return brg__fail_no_comm(s,
                           "%s: %s of %llu x %s %s %s failed (%s) before the communicator "
                           "was destroyed",
                           fn, op->is_send ? "send" : "receive", (unsigned long long)op->count,
                           dn ? dn : "?", op->is_send ? "to" : "from", who, brg_status_string(s));
}

brg_status brg_test(brg_request *request, int *done) {
  if (!request || !done)
    return brg__fail_no_comm(BRG_ERR_INVALID_ARGUMENT, "brg_test: NULL argument");
  brg__req *r = (brg__req *)request;
  if (r->magic == BRG__REQ_P2P_MAGIC) {
    if (!brg__comm_live(r->comm, r->p2p_op.comm_serial)) {
      *done = 1;
      return p2p_orphan("brg_test", r);
    }
    *done = __atomic_load_n(&r->p2p_op.done, __ATOMIC_ACQUIRE);
    if (!*done) return BRG_IN_PROGRESS;
    return r->p2p_op.status == BRG_SUCCESS
               ? r->p2p_op.status
               : brg__p2p_wait(r->comm, "brg_test", &r->p2p_op); /* names the failure */
  }
  if (r->magic != BRG__REQ_MAGIC)
    return brg__fail_no_comm(BRG_ERR_INVALID_ARGUMENT, "brg_test: request was never issued");
  if (!__atomic_load_n(&r->done, __ATOMIC_ACQUIRE)) {
    *done = 0;
    return BRG_IN_PROGRESS;
  }
  *done = 1;
  return r->status;
}

brg_status brg_wait(brg_request *request) {
  if (!request) return brg__fail_no_comm(BRG_ERR_INVALID_ARGUMENT, "brg_wait: request is NULL");
  brg__req *r = (brg__req *)request;
  if (r->magic == BRG__REQ_P2P_MAGIC)
    return brg__comm_live(r->comm, r->p2p_op.comm_serial)
               ? brg__p2p_wait(r->comm, "brg_wait", &r->p2p_op)
               : p2p_orphan("brg_wait", r);
  if (r->magic != BRG__REQ_MAGIC)
    return brg__fail_no_comm(BRG_ERR_INVALID_ARGUMENT, "brg_wait: request was never issued");
  return brg__progress_wait(r);
}
