/*
 * --peer mpi: the MPI library the benchmark was built against, timed beside
 * brigade. The program is started by mpirun; MPI_Init comes first, rank 0
 * makes brigade's unique id and MPI_Bcasts it, then every rank joins
 * brigade's communicator with it, so both libraries see the same ranks.
 *
 * MPI has no half or bfloat16 type and no average; those rows print n/a.
 */
#include "peer.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char describe_buf[MPI_MAX_LIBRARY_VERSION_STRING + 16];

static MPI_Datatype mpi_type(brg_dtype dt) {
  switch (dt) {
  case BRG_INT8: return MPI_INT8_T;
  case BRG_UINT8: return MPI_UINT8_T;
  case BRG_INT32: return MPI_INT32_T;
  case BRG_UINT32: return MPI_UINT32_T;
  case BRG_INT64: return MPI_INT64_T;
  case BRG_UINT64: return MPI_UINT64_T;
  case BRG_FLOAT32: return MPI_FLOAT;
  case BRG_FLOAT64: return MPI_DOUBLE;
  default: return MPI_DATATYPE_NULL;
  }
}

static MPI_Op mpi_op(brg_op op) {
  switch (op) {
  case BRG_SUM: return MPI_SUM;
  case BRG_PROD: return MPI_PROD;
  case BRG_MIN: return MPI_MIN;
  case BRG_MAX: return MPI_MAX;
  default: return MPI_OP_NULL;
  }
}

static int mpi_fail(const char *what, int rc) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "error %d", rc);
  fprintf(stderr, "peer mpi: %s failed: %s\n", what, msg);
  return -1;
}

static int launch(int *argc, char ***argv, brg_comm **comm) {
  int rc, rank, size;
  if ((rc = MPI_Init(argc, argv)) != MPI_SUCCESS) return mpi_fail("MPI_Init", rc);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const char *ws = getenv("WORLD_SIZE");
  if (size == 1 && ws != NULL && atoi(ws) > 1) {
    /* under brigade-run or torchrun every process is its own MPI world */
    fprintf(stderr,
            "peer mpi: MPI sees 1 rank but WORLD_SIZE is %s: start the program with "
            "mpirun -np N, not another launcher\n",
            ws);
    MPI_Finalize();
    return -1;
  }
  brg_unique_id id;
  memset(&id, 0, sizeof id);
  if (rank == 0) {
    brg_status st = brg_get_unique_id(&id);
    if (st != BRG_SUCCESS) {
      fprintf(stderr, "peer mpi: brg_get_unique_id failed: %s\n", brg_comm_last_error(NULL));
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  }
  if ((rc = MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD)) != MPI_SUCCESS)
    return mpi_fail("MPI_Bcast (unique id)", rc);
  brg_status st = brg_comm_init(comm, size, &id, rank);
  if (st != BRG_SUCCESS) {
    fprintf(stderr, "peer mpi: rank %d: brg_comm_init failed: %s\n", rank,
            brg_comm_last_error(NULL));
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  return 0;
}

static int open_peer(brg_comm *comm, int rank, int nranks) {
  int size;
  (void)comm;
  (void)rank;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size != nranks) {
    fprintf(stderr, "peer mpi: MPI has %d ranks, brigade %d\n", size, nranks);
    return -1;
  }
  return 0;
}

static const char *mpi_describe(void) {
  char v[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(v, &len);
  char *nl = strchr(v, '\n');
  if (nl) *nl = '\0';
  char *comma = strchr(v, ',');
  if (comma) *comma = '\0'; /* "Open MPI v4.1.4, package: ..." */
  snprintf(describe_buf, sizeof describe_buf, "%s", v);
  return describe_buf;
}

static const char *unsupported(bench_kind kind, brg_dtype dt, brg_op op, int in_place) {
  if (mpi_type(dt) == MPI_DATATYPE_NULL) return "MPI has no half or bfloat16 type";
  if ((kind == BENCH_ALLREDUCE || kind == BENCH_REDUCE_SCATTER || kind == BENCH_REDUCE) &&
      mpi_op(op) == MPI_OP_NULL)
    return "MPI has no average op";
  if (kind == BENCH_REDUCE_SCATTER && in_place)
    return "in-place MPI_Reduce_scatter_block leaves the result at the front of the buffer";
  if (kind == BENCH_BROADCAST && !in_place) return "MPI_Bcast works in place only";
  return NULL;
}

static int prepare(const bench_peer_call *pc) {
  (void)pc;
  return 0;
}

static int run(const bench_peer_call *pc) {
  const bench_call *c = &pc->c;
  MPI_Datatype t = mpi_type(c->dtype);
  MPI_Op op = mpi_op(c->op);
  int n = (int)c->count, rc, rank;
  if ((size_t)n != c->count) {
    fprintf(stderr, "peer mpi: count %zu does not fit an int\n", c->count);
    return -1;
  }
  const void *send = pc->in_place ? MPI_IN_PLACE : c->send;
  switch (pc->kind) {
  case BENCH_ALLREDUCE: rc = MPI_Allreduce(send, c->recv, n, t, op, MPI_COMM_WORLD); break;
  case BENCH_REDUCE_SCATTER:
    rc = MPI_Reduce_scatter_block(c->send, c->recv, n, t, op, MPI_COMM_WORLD);
    break;
  case BENCH_ALL_GATHER: rc = MPI_Allgather(send, n, t, c->recv, n, t, MPI_COMM_WORLD); break;
  case BENCH_BROADCAST: rc = MPI_Bcast(c->recv, n, t, c->root, MPI_COMM_WORLD); break;
  case BENCH_REDUCE:
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (pc->in_place && rank != c->root) send = c->send;
    rc = MPI_Reduce(send, c->recv, n, t, op, c->root, MPI_COMM_WORLD);
    break;
  default: return -1;
  }
  return rc == MPI_SUCCESS ? 0 : mpi_fail("the MPI collective", rc);
}

/* A barrier that does not go through brigade, so no rank destroys its
 * brigade communicator while another is still inside brg_barrier. */
static void close_peer(void) {
  MPI_Barrier(MPI_COMM_WORLD);
}

static void finalize(void) {
  MPI_Finalize();
}

const bench_peer bench_peer_mpi = {
    .name = "mpi",
    .launcher = "mpirun -np N",
    .nalgs = 1,
    .algs = (const char *const[]){"mpi"},
    .launch = launch,
    .open = open_peer,
    .describe = mpi_describe,
    .unsupported = unsupported,
    .prepare = prepare,
    .run = run,
    .close = close_peer,
    .finalize = finalize,
};
