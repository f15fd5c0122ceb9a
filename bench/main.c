/*
 * bench_main: opens the communicator (from a launcher's variables, or
 * alone) and the GPU (-G), then runs the sweep of common.c's driver.
 */
#include "bench_internal.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---------------------------------------------------------------- state */

static bench *current; /* for bench_device_mode() */

int bench_device_mode(void) {
  return current != NULL && current->gpu != NULL;
}

static void *alloc_touched(size_t bytes) {
  bytes = (bytes + ALIGN - 1) / ALIGN * ALIGN; /* aligned_alloc wants a multiple */
  void *p = aligned_alloc(ALIGN, bytes);
  if (p == NULL) {
    fprintf(stderr, "%s: cannot allocate %zu bytes\n", bench_prog, bytes);
    exit(1);
  }
  memset(p, 0, bytes); /* fault every page in now, not inside the timed loop */
  return p;
}

/* ----------------------------------------------------------- communicator */

/* Under a launcher, its rank; without one, brg_comm_init_env runs alone. */
static void comm_open(bench *b, int *argc, char ***argv) {
  brg_status st;
  if (b->peer != NULL && b->peer->launch != NULL) {
    if (b->peer->launch(argc, argv, &b->comm) != 0) exit(1);
  } else if ((st = brg_comm_init_env(&b->comm)) != BRG_SUCCESS) {
    b->comm = NULL;
    bench_die_status(b, "brg_comm_init_env", st);
  }
  if ((st = brg_comm_rank(b->comm, &b->rank)) != BRG_SUCCESS)
    bench_die_status(b, "brg_comm_rank", st);
  if ((st = brg_comm_size(b->comm, &b->nranks)) != BRG_SUCCESS)
    bench_die_status(b, "brg_comm_size", st);
}

/* This rank's place among the ranks of its host: LOCAL_RANK (torchrun,
 * brigade-run), OMPI_COMM_WORLD_LOCAL_RANK (mpirun), SLURM_LOCALID (srun);
 * 0 when no launcher says. */
static int local_rank(void) {
  static const char *const vars[] = {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
    const char *v = getenv(vars[i]);
    if (v && *v) return atoi(v);
  }
  return 0;
}

static void gpu_open(bench *b) {
  char why[512] = "";
  b->gpu = brg__cuda_open_beside((const void *)&brg_allreduce, why, sizeof why);
  if (b->gpu == NULL) {
    fprintf(stderr, "%s: rank %d: -G: no usable GPU: %s\n", bench_prog, b->rank, why);
    brg_comm_abort(b->comm);
    exit(2);
  }
  /* One GPU per local rank, as torchrun users do: LOCAL_RANK modulo the
   * GPUs this process sees, unless -g says which. */
  int ngpu = b->gpu->drv.probe(NULL, 0), want = b->o.gpu >= 0 ? b->o.gpu : local_rank() % ngpu;
  if (want >= ngpu) {
    fprintf(stderr, "%s: rank %d: -g %d: this process sees %d GPU(s)\n", bench_prog, b->rank, want,
            ngpu);
    brg_comm_abort(b->comm);
    exit(2);
  }
  bench_gpu_check(b, "cudaSetDevice", b->gpu->drv.set_device(want));
  bench_gpu_check(b, "cudaMalloc", b->gpu->drv.mem_alloc((void **)&b->dsend, b->reg_bytes));
  bench_gpu_check(b, "cudaMalloc", b->gpu->drv.mem_alloc((void **)&b->drecv, b->reg_bytes));
  bench_gpu_check(b, "cudaStreamCreate", b->gpu->drv.stream_create(&b->stream));
  bench_gpu_check(b, "cudaEventCreate", b->gpu->drv.event_create_timing(&b->ev_start));
  bench_gpu_check(b, "cudaEventCreate", b->gpu->drv.event_create_timing(&b->ev_end));
  /* Which ranks share this GPU: the roofline counts their HBM traffic. */
  unsigned char *uuids = calloc((size_t)b->nranks, 16), mine[16] = {0};
  if (!uuids) exit(1);
  bench_gpu_check(b, "cudaGetDeviceProperties", b->gpu->drv.device_uuid(mine));
  brg_status st = brg_all_gather(mine, uuids, 16, BRG_UINT8, b->comm, NULL);
  if (st != BRG_SUCCESS) bench_die_status(b, "brg_all_gather (GPU ids)", st);
  b->gpu_share = 0;
  for (int r = 0; r < b->nranks; r++) b->gpu_share += memcmp(uuids + 16 * r, mine, 16) == 0;
  free(uuids);
  b->gpu->drv.describe(b->gpu_desc, sizeof b->gpu_desc);
}

int bench_main(int argc, char **argv, const bench_coll *coll) {
  bench b = {.coll = coll};
  brg_status st;
  current = &b;
  if (argc > 0 && argv[0] != NULL) {
    const char *slash = strrchr(argv[0], '/');
    bench_prog = slash ? slash + 1 : argv[0];
  }
  setvbuf(stdout, NULL, _IOLBF, 0); /* rows appear as they finish, also through a pipe */
  if (bench_parse_args(argc, argv, coll, &b.o) != 0) return 2;
  if (b.o.peer != NULL && (b.peer = bench_peer_find(b.o.peer)) == NULL) {
    fprintf(stderr, "%s: --peer %s: not in this build (built: %s)\n", bench_prog, b.o.peer,
            bench_peers_built());
    return 2;
  }
  if (b.o.roofline < 0) b.o.roofline = coll->kind == BENCH_ALLREDUCE;

  comm_open(&b, &argc, &argv);
  if (bench_has_root(coll->kind) && b.o.root >= b.nranks) {
    if (b.rank == 0) fprintf(stderr, "%s: -r %d: only %d ranks\n", bench_prog, b.o.root, b.nranks);
    brg_comm_destroy(b.comm);
    if (b.peer && b.peer->finalize) b.peer->finalize();
    return 2;
  }
  if (b.o.device && b.peer != NULL && strcmp(b.peer->name, "nccl") != 0) {
    if (b.rank == 0)
      fprintf(stderr, "%s: --peer %s takes host buffers; with -G only --peer nccl\n", bench_prog,
              b.peer->name);
    brg_comm_destroy(b.comm);
    if (b.peer->finalize) b.peer->finalize();
    return 2;
  }
  b.reg_bytes = b.o.max_bytes < 64 ? 64 : b.o.max_bytes;
  if (b.o.device) gpu_open(&b);
  if (b.peer != NULL && b.peer->open(b.comm, b.rank, b.nranks) != 0) {
    fprintf(stderr, "%s: rank %d: cannot start peer %s (the reason is above; it runs under %s)\n",
            bench_prog, b.rank, b.peer->name, b.peer->launcher);
    brg_comm_abort(b.comm);
    return 1;
  }
  if (b.rank == 0 && b.o.csv != NULL) {
    b.csv = fopen(b.o.csv, "w");
    if (b.csv == NULL) {
      fprintf(stderr, "%s: cannot write %s: %s\n", bench_prog, b.o.csv, strerror(errno));
      brg_comm_abort(b.comm);
      return 1;
    }
    fprintf(b.csv, "collective,library,alg,nranks,placement,bytes,count,dtype,op,time_us,"
                   "algbw_GBps,busbw_GBps,wrong\n");
  }

  if (b.rank == 0) bench_print_header(&b);
  bench_print_ranks(&b);

  if (b.gpu && b.rank == 0)
    printf("# GPU buffers (-G): %s; %d of %d ranks on this GPU; CUDA-event timing\n", b.gpu_desc,
           b.gpu_share, b.nranks);
  b.sendreg = alloc_touched(b.reg_bytes);
  b.recvreg = alloc_touched(b.reg_bytes);
  b.pat_in = alloc_touched(PERIOD * 8);
  b.pat_expect = alloc_touched(PERIOD * 8);
  b.pat_poison = alloc_touched(PERIOD * 8);
  b.pat_tmp = alloc_touched(PERIOD * 8);
  if (b.o.roofline) bench_roofline(&b);

  if (b.rank == 0) bench_print_columns(&b);
  int nops = bench_is_reduction(coll->kind) ? b.o.nops : 1;
  for (int d = 0; d < b.o.ndtypes; d++)
    for (int k = 0; k < nops; k++)
      bench_sweep(&b, b.o.dtypes[d], bench_is_reduction(coll->kind) ? (int)b.o.ops[k] : PLAIN_DATA);

  if (b.rank == 0) bench_print_footer(&b);
  if (b.csv != NULL) fclose(b.csv);

  /* No rank may tear down while a neighbour is still finishing the last
   * collective: line up on brigade, then (where there is one) on the peer,
   * which does not go through brigade. */
  if ((st = brg_barrier(b.comm)) != BRG_SUCCESS) bench_die_status(&b, "brg_barrier", st);
  if (b.peer != NULL && b.peer->close != NULL) b.peer->close();
  st = brg_comm_destroy(b.comm);
  b.comm = NULL;
  if (st != BRG_SUCCESS) bench_die_status(&b, "brg_comm_destroy", st);
  if (b.peer != NULL && b.peer->finalize != NULL) b.peer->finalize();
  if (b.gpu) {
    b.gpu->drv.event_destroy(b.ev_start);
    b.gpu->drv.event_destroy(b.ev_end);
    b.gpu->drv.stream_destroy(b.stream);
    b.gpu->drv.mem_free(b.dsend);
    b.gpu->drv.mem_free(b.drecv);
  }
  free(b.sendreg);
  free(b.recvreg);
  free(b.pat_in);
  free(b.pat_expect);
  free(b.pat_poison);
  free(b.pat_tmp);
  return b.wrong_total ? 1 : 0;
}
