/*
 * brigade: ring allreduce for processes on one host or many.
 *
 * Every call returns a brg_status. When a call fails, brg_comm_last_error()
 * says why (which peer, which step, which system call); for failures that
 * happen before a communicator exists, pass NULL to read the message of the
 * last such failure on the calling thread.
 *
 * Semantics follow NCCL: sendbuf == recvbuf means in place, BRG_AVG divides
 * the sum by the number of ranks, and every rank of a communicator must call
 * the same collectives in the same order with matching arguments (a mismatch
 * is detected and reported as BRG_ERR_MISMATCH).
 */
#ifndef BRIGADE_H
#define BRIGADE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define BRG_VERSION_MAJOR 0
#define BRG_VERSION_MINOR 1
#define BRG_VERSION_PATCH 0

#define BRG_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[BRG_UNIQUE_ID_BYTES];
} brg_unique_id;
typedef struct brg_comm brg_comm;
typedef void *brg_stream; /* NULL: host buffers, call blocks until done */

typedef enum {
  BRG_SUCCESS = 0,
  BRG_IN_PROGRESS,
  BRG_ERR_INVALID_ARGUMENT,
  BRG_ERR_INVALID_USAGE,
  BRG_ERR_SYSTEM,
  BRG_ERR_TIMEOUT,
  BRG_ERR_REMOTE,
  BRG_ERR_MISMATCH,
  BRG_ERR_UNAVAILABLE,
  BRG_ERR_ABORTED,
  BRG_ERR_NO_MEMORY,
  BRG_ERR_INTERNAL
} brg_status;
typedef enum {
  BRG_INT8,
  BRG_UINT8,
  BRG_INT32,
  BRG_UINT32,
  BRG_INT64,
  BRG_UINT64,
  BRG_FLOAT16,
  BRG_BFLOAT16,
  BRG_FLOAT32,
  BRG_FLOAT64
} brg_dtype;
/* BRG_BAND, BRG_BOR and BRG_BXOR (bitwise and, or, exclusive or) take the
 * integer dtypes only; with a floating-point dtype a call fails with
 * BRG_ERR_INVALID_ARGUMENT naming the op and the dtype. */
typedef enum { BRG_SUM, BRG_PROD, BRG_MIN, BRG_MAX, BRG_AVG, BRG_BAND, BRG_BOR, BRG_BXOR } brg_op;

#define BRG_NUM_DTYPES 10
#define BRG_NUM_OPS 8

/* The version of the library that runs (the macros above are the version of
 * the header a program was built against). No argument may be NULL. */
brg_status brg_get_version(int *major, int *minor, int *patch);

const char *brg_status_string(brg_status s);
const char *brg_dtype_name(brg_dtype dtype); /* "float32"…, or NULL when out of range */
const char *brg_op_name(brg_op op);          /* "sum"…, or NULL when out of range */
size_t brg_dtype_size(brg_dtype dtype);      /* bytes per element, 0 when out of range */

brg_status brg_get_unique_id(brg_unique_id *id);
brg_status brg_comm_init(brg_comm **comm, int nranks, const brg_unique_id *id, int rank);
brg_status brg_comm_init_env(brg_comm **comm); /* torchrun / mpirun / srun / brigade-run env */

/*
 * Per-communicator settings (as NCCL's ncclConfig_t). Start from
 * BRG_COMM_CONFIG_INIT, which leaves every field unset, and set the ones you
 * want; an unset field takes its value from the environment, as brg_comm_init
 * does for all of them. size and version come first so that the struct can
 * grow: a library refuses a config larger or of a later version than it
 * knows, with BRG_ERR_INVALID_ARGUMENT.
 *
 *   timeout_ms   how long a rank waits for a peer during init and in
 *                collectives before BRG_ERR_TIMEOUT; in [100, INT_MAX], or
 *                BRG_CONFIG_UNSET for BRIGADE_TIMEOUT_MS. (The bootstrap root
 *                that brg_get_unique_id starts waits BRIGADE_TIMEOUT_MS for
 *                the ranks: the id is made before any config.)
 *   transports   the transports the ring may use, comma-separated names
 *                ("shm", "tcp", "ibverbs"), "" for all, or NULL for
 *                BRIGADE_TRANSPORTS; an unknown name is refused. Every rank
 *                must allow the same ones. The string is copied.
 *
 * brg_comm_init_config with cfg NULL is brg_comm_init. A bad field makes it
 * return BRG_ERR_INVALID_ARGUMENT before it contacts anyone, and
 * brg_comm_last_error(NULL) names the field.
 */
#define BRG_COMM_CONFIG_VERSION 1
#define BRG_CONFIG_UNSET (-1)
typedef struct brg_comm_config {
  size_t size;      /* sizeof(brg_comm_config) */
  unsigned version; /* BRG_COMM_CONFIG_VERSION */
  int timeout_ms;
  const char *transports;
} brg_comm_config;
#define BRG_COMM_CONFIG_INIT                                                                       \
  { sizeof(brg_comm_config), BRG_COMM_CONFIG_VERSION, BRG_CONFIG_UNSET, NULL }

brg_status brg_comm_init_config(brg_comm **comm, int nranks, const brg_unique_id *id, int rank,
                                const brg_comm_config *cfg);

/*
 * A collective over comm (every rank calls it, in order with its other
 * collectives): ranks that pass the same color form a new communicator,
 * ranked by (key, rank in comm); a rank that passes BRG_SPLIT_NOCOLOR
 * takes part but gets *newcomm = NULL. As NCCL's ncclCommSplit and torch's
 * new_group. The new communicator has comm's timeout and transports, is
 * independent of comm once made (either may be destroyed first), and
 * is destroyed with brg_comm_destroy. A negative color other than
 * BRG_SPLIT_NOCOLOR is BRG_ERR_INVALID_ARGUMENT. On failure *newcomm is
 * left alone and brg_comm_last_error(NULL) says why.
 */
#define BRG_SPLIT_NOCOLOR (-1)
brg_status brg_comm_split(brg_comm *comm, int color, int key, brg_comm **newcomm);

brg_status brg_comm_rank(const brg_comm *comm, int *rank);
brg_status brg_comm_size(const brg_comm *comm, int *size);
const char *brg_comm_last_error(const brg_comm *comm);
brg_status brg_comm_abort(brg_comm *comm);
brg_status brg_comm_destroy(brg_comm *comm);

/* Payload bytes this rank has sent to its ring neighbour since the
 * communicator was created: an allreduce of S bytes adds 2(N-1)/N * S. */
brg_status brg_comm_bytes_sent(const brg_comm *comm, uint64_t *bytes);

/* The error that stopped the communicator, or BRG_SUCCESS while it works:
 * a collective that failed after its call returned (the device collectives'
 * asynchronous mode, a queued brg_iallreduce) shows here at once, as with
 * NCCL's ncclCommGetAsyncError; brg_comm_last_error says why. */
brg_status brg_comm_get_async_error(const brg_comm *comm, brg_status *status);

brg_status brg_allreduce(const void *sendbuf, void *recvbuf, size_t count, brg_dtype dtype,
                         brg_op op, brg_comm *comm, brg_stream stream);
brg_status brg_reduce_scatter(const void *sendbuf, void *recvbuf, size_t recvcount, brg_dtype dtype,
                              brg_op op, brg_comm *comm, brg_stream stream);
brg_status brg_all_gather(const void *sendbuf, void *recvbuf, size_t sendcount, brg_dtype dtype,
                          brg_comm *comm, brg_stream stream);
brg_status brg_broadcast(const void *sendbuf, void *recvbuf, size_t count, brg_dtype dtype,
                         int root, brg_comm *comm, brg_stream stream);
brg_status brg_reduce(const void *sendbuf, void *recvbuf, size_t count, brg_dtype dtype, brg_op op,
                      int root, brg_comm *comm, brg_stream stream);
brg_status brg_barrier(brg_comm *comm);

/*
 * Device collectives and CUDA graphs.
 *
 * A device collective (buffers in GPU memory) sets up the communicator's
 * device path the first time one runs: GPU memory, IPC mappings with the
 * ring neighbours, the choice of kernel or step mode. Every rank does it
 * at the same call, as a collective. brg_comm_device_setup does only that,
 * for GPU `device` (-1: the calling thread's current device), on every
 * rank; BRG_SUCCESS at once when it ran already. It also makes the device
 * paths of the communicators the collectives run on besides this one (the
 * rings of BRIGADE_RINGS; under BRIGADE_ALGO=hier, the hierarchy's two).
 *
 * In kernel mode a device collective issued on a stream that is capturing
 * a CUDA graph is captured: each launch of the graph runs it again on what
 * the buffers then hold, every rank launching its graphs in the same
 * order, with its other device collectives, as it would issue the calls.
 * The setup cannot run during a capture (it allocates): a captured call
 * before it, or one in step mode, fails with BRG_ERR_INVALID_USAGE and
 * changes nothing. Graphs must finish (synchronize their streams) before
 * brg_comm_destroy, and must not be launched after it.
 */
brg_status brg_comm_device_setup(brg_comm *comm, int device);

/*
 * Non-blocking host collectives.
 *
 * The request is caller-owned storage (embed it in your own struct; brigade
 * never allocates one). brg_i<collective> checks its arguments as the
 * blocking form does, queues the collective on the communicator's worker
 * thread and returns at once; the buffers must stay valid and untouched
 * until brg_test reports completion or brg_wait returns. Collectives run in
 * the order they were issued, blocking calls included, and every rank must
 * issue the same sequence, as with the blocking forms. Any number of
 * requests may be outstanding, and they may be tested or waited on in any
 * order.
 *
 * These calls take host buffers only (GPU buffers are refused with
 * BRG_ERR_INVALID_ARGUMENT: the blocking forms with a stream are
 * asynchronous on that stream already). The arguments mean what they mean
 * for the blocking form of the same name.
 *
 * brg_test sets *done to 1 once the collective has finished and then returns
 * its final status (BRG_SUCCESS or the error it ended with); while it runs,
 * *done is 0 and the return value is BRG_IN_PROGRESS. brg_wait blocks until
 * the collective has finished and returns its final status. After completion
 * the request may be reused for a new call; reusing one still in flight is
 * BRG_ERR_INVALID_USAGE.
 */
typedef struct brg_request {
  uint64_t internal[16];
} brg_request;

brg_status brg_iallreduce(const void *sendbuf, void *recvbuf, size_t count, brg_dtype dtype,
                          brg_op op, brg_comm *comm, brg_request *request);
brg_status brg_ireduce_scatter(const void *sendbuf, void *recvbuf, size_t recvcount,
                               brg_dtype dtype, brg_op op, brg_comm *comm, brg_request *request);
brg_status brg_iall_gather(const void *sendbuf, void *recvbuf, size_t sendcount, brg_dtype dtype,
                           brg_comm *comm, brg_request *request);
brg_status brg_ibroadcast(const void *sendbuf, void *recvbuf, size_t count, brg_dtype dtype,
                          int root, brg_comm *comm, brg_request *request);
brg_status brg_ireduce(const void *sendbuf, void *recvbuf, size_t count, brg_dtype dtype, brg_op op,
                       int root, brg_comm *comm, brg_request *request);
brg_status brg_ibarrier(brg_comm *comm, brg_request *request);
brg_status brg_test(brg_request *request, int *done);
brg_status brg_wait(brg_request *request);

/*
 * Point-to-point and all-to-all (host buffers).
 *
 * brg_send sends count elements of dtype from buf to rank `peer`; brg_recv
 * receives them from `peer` into buf. Messages between a pair of ranks are
 * matched in order per tag (these calls are tag 0; the tagged forms are
 * below): the k-th send of a tag from A to B is B's k-th receive of that
 * tag from A (brg_send and brg_isend count alike, as do brg_recv and
 * brg_irecv). A
 * receive whose count or dtype differs from its send fails with
 * BRG_ERR_MISMATCH naming both, and the message is dropped. peer may be
 * the calling rank (the message is copied); a peer outside [0, N) is
 * BRG_ERR_INVALID_ARGUMENT.
 *
 * Sends are eager up to a cap: brg_send returns once the data has left
 * buf, and each communicator keeps a thread that takes incoming messages
 * into the receive posted for them or, when none is posted yet, into
 * memory of its own, freed when the receive is posted. That memory is
 * capped by BRIGADE_P2P_EARLY_BYTES (default 64 MiB) per communicator;
 * beyond it the receiver stops reading and the sender is held back until
 * receives are posted (a held brg_send fails with BRG_ERR_TIMEOUT once
 * nothing moved for the communicator's timeout). One message of any size
 * is always taken when no such memory is in use, so two ranks that each
 * send one message to the other first and receive afterwards never
 * deadlock (as torch.distributed users do). Links to other ranks are made
 * at the first message (a TCP connection from each sender to each
 * receiver it uses, on the address the bootstrap exchanged); init opens
 * only a listener.
 *
 * A receive waits up to the communicator's timeout for its message (while
 * bytes keep arriving it keeps waiting) and then fails with
 * BRG_ERR_TIMEOUT naming the peer; a peer that dies, aborts or destroys its
 * communicator makes sends to it and receives from it fail with
 * BRG_ERR_REMOTE naming it. Point-to-point calls do not take the
 * collectives' queue: they may run beside collectives and beside each
 * other on the same communicator from several threads; messages of one
 * pair are matched in the order the calls reach the library.
 *
 * stream must be NULL: GPU buffers and streams are refused with
 * BRG_ERR_INVALID_ARGUMENT.
 *
 * brg_isend / brg_irecv are the non-blocking forms on caller-owned
 * requests (brg_test, brg_wait, as for the collectives): brg_isend
 * returns without waiting for the receiver (the first message to a peer
 * makes the link first) and completes once the data has left buf (it may
 * do so before it returns; buf must stay untouched until then); brg_wait
 * on a send fails with BRG_ERR_TIMEOUT when nothing more of it left for
 * the communicator's timeout;
 * brg_irecv completes once its message has arrived. brg_wait on a receive
 * fails with BRG_ERR_TIMEOUT when nothing of the message arrived for the
 * communicator's timeout, counted from the brg_wait call; brg_test never
 * times out.
 *
 * A receive from BRG_ANY_SOURCE takes the first message that reaches this
 * rank from any rank (itself included): among the messages that arrived
 * before it was posted, the oldest; otherwise the next to arrive. A
 * message goes to the receive posted first among those that name its
 * sender and those from BRG_ANY_SOURCE, so each pair's order still
 * holds. brg_request_source tells which rank sent the message that a
 * finished brg_irecv took (brg_recv with BRG_ANY_SOURCE cannot tell: use
 * brg_irecv and brg_wait). Such a receive is not failed by one peer going
 * away, since another may still send: it waits up to the communicator's
 * timeout for a message to begin, and fails with the sender's error when
 * a message that began is cut off. Sends take no BRG_ANY_SOURCE.
 *
 * brg_all_to_all is a collective (every rank calls it, in order with its
 * other collectives), as MPI_Alltoall and torch's all_to_all_single with
 * equal splits: sendbuf holds N blocks of count elements, block j goes to
 * rank j; recvbuf holds N blocks, block j came from rank j. In place
 * (sendbuf == recvbuf) is allowed; other overlaps are refused with
 * BRG_ERR_INVALID_ARGUMENT. Its blocks travel on the point-to-point links,
 * apart from the user's messages.
 */
brg_status brg_send(const void *buf, size_t count, brg_dtype dtype, int peer, brg_comm *comm,
                    brg_stream stream);
brg_status brg_recv(void *buf, size_t count, brg_dtype dtype, int peer, brg_comm *comm,
                    brg_stream stream);
brg_status brg_all_to_all(const void *sendbuf, void *recvbuf, size_t count, brg_dtype dtype,
                          brg_comm *comm, brg_stream stream);
brg_status brg_isend(const void *buf, size_t count, brg_dtype dtype, int peer, brg_comm *comm,
                     brg_request *request);
brg_status brg_irecv(void *buf, size_t count, brg_dtype dtype, int peer, brg_comm *comm,
                     brg_request *request);
/*
 * Tagged forms: a message carries a tag in [0, INT_MAX] (a negative tag is
 * BRG_ERR_INVALID_ARGUMENT), and a receive takes the oldest message of its
 * tag from its source, whatever messages of other tags came before it:
 * messages are matched in order per (source, tag), as Gloo's and MPI's
 * are. A message of another tag that arrives first waits in early memory
 * for its own receive (against BRIGADE_P2P_EARLY_BYTES: past the cap the
 * link is held, and a receive of a later tag then waits for that memory
 * to be freed). A receive from BRG_ANY_SOURCE takes the oldest message of
 * its tag from any rank. brg_send, brg_recv, brg_isend and brg_irecv are
 * tag 0. There is no tag wildcard.
 */
brg_status brg_send_tagged(const void *buf, size_t count, brg_dtype dtype, int peer, int tag,
                           brg_comm *comm, brg_stream stream);
brg_status brg_recv_tagged(void *buf, size_t count, brg_dtype dtype, int peer, int tag,
                           brg_comm *comm, brg_stream stream);
brg_status brg_isend_tagged(const void *buf, size_t count, brg_dtype dtype, int peer, int tag,
                            brg_comm *comm, brg_request *request);
brg_status brg_irecv_tagged(void *buf, size_t count, brg_dtype dtype, int peer, int tag,
                            brg_comm *comm, brg_request *request);
/* The rank a receive from any source takes its message from. */
#define BRG_ANY_SOURCE (-1)
/* *source = the rank whose message the receive of `request` (brg_irecv)
 * took, once brg_test or brg_wait has said it finished (with BRG_SUCCESS,
 * or with the error of that message: a mismatch, a cut-off message).
 * BRG_ERR_INVALID_USAGE while it runs or when no message came (a timeout,
 * an abort), BRG_ERR_INVALID_ARGUMENT for a request that is not a
 * receive. It reads the request alone, so it also works after the
 * communicator is destroyed. */
brg_status brg_request_source(const brg_request *request, int *source);

/*
 * Rooted collectives on the point-to-point links, as MPI_Gather and
 * MPI_Scatter (and torch's gather and scatter): every rank calls them, in
 * order with its other collectives, with the same count, dtype and root.
 *
 * brg_gather: every rank's sendbuf holds sendcount elements; the root's
 * recvbuf receives N blocks of sendcount, block j from rank j. recvbuf is
 * ignored (may be NULL) on the other ranks. In place: the root's sendbuf
 * is its own block of recvbuf (recvbuf + root * sendcount elements).
 *
 * brg_scatter: the root's sendbuf holds N blocks of recvcount elements,
 * block j for rank j; every rank's recvbuf receives its block. sendbuf is
 * ignored (may be NULL) on the other ranks. In place: the root's recvbuf
 * is its own block of sendbuf.
 *
 * Each block goes straight between the root and its rank (one step; the
 * root's link carries N - 1 blocks, as a ring's would). Host buffers take
 * stream NULL. GPU buffers (blocking forms only; stream NULL is the legacy
 * default stream) are staged through host memory by the calling thread:
 * it waits for the stream, copies the send buffer to the host, moves the
 * blocks as for host buffers, and has copied the result into recvbuf when
 * it returns (so the call blocks, and cannot be captured in a CUDA graph:
 * BRG_ERR_INVALID_USAGE). Each rank's buffers are its own choice: ranks
 * with host and with GPU buffers may meet in one call. The non-blocking
 * forms take host buffers and queue the call as the other collectives' do
 * (brg_test, brg_wait). A rank that differs in count, dtype or root fails
 * with BRG_ERR_MISMATCH.
 */
brg_status brg_gather(const void *sendbuf, void *recvbuf, size_t sendcount, brg_dtype dtype,
                      int root, brg_comm *comm, brg_stream stream);
brg_status brg_scatter(const void *sendbuf, void *recvbuf, size_t recvcount, brg_dtype dtype,
                       int root, brg_comm *comm, brg_stream stream);
brg_status brg_igather(const void *sendbuf, void *recvbuf, size_t sendcount, brg_dtype dtype,
                       int root, brg_comm *comm, brg_request *request);
brg_status brg_iscatter(const void *sendbuf, void *recvbuf, size_t recvcount, brg_dtype dtype,
                        int root, brg_comm *comm, brg_request *request);

#ifdef __cplusplus
}
#endif

#endif /* BRIGADE_H */
