/*
 * Rendezvous from the environment, as launchers set it: torchrun
 * (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), brigade-run, mpirun
 * (OMPI_COMM_WORLD_*), PMI and srun (SLURM_*). Without MASTER_ADDR: a
 * PMIx server's exchange (mpirun, srun --mpi=pmix), else Slurm's step
 * (launch.c).
 */
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hash.h"
#include "internal.h"
#include "launch.h"
#include "secret.h"
#include "settings.h"

/* The first of `names` that is set: its value in *out and its name in
 * *found. A value that is not a number is reported here, with *found set,
 * so the caller keeps this message rather than saying "not set". */
static brg_status env_int(const char *const *names, int *out, const char **found) {
  for (int i = 0; names[i]; i++) {
    const char *v = getenv(names[i]);
    if (!v || !*v) continue;
    *found = names[i];
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || *end || x < 0 || x > 1 << 30)
      return brg__fail_no_comm(BRG_ERR_INVALID_ARGUMENT,
                               "brg_comm_init_env: %s=\"%s\" is not a valid number", names[i], v);
    *out = (int)x;
    return BRG_SUCCESS;
  }
  return BRG_ERR_INVALID_ARGUMENT;
}

/* Whether any of `names` is set (to anything). */
static int launcher_present(const char *const *names) {
  for (int i = 0; names[i]; i++) {
    const char *v = getenv(names[i]);
    if (v && *v) return 1;
  }
  return 0;
}

/* No launcher at all: a communicator of one rank, as `./prog` alone means. */
static brg_status init_alone(brg_comm **comm) {
  BRG__INFO("init", "brg_comm_init_env: no launcher variables (RANK, WORLD_SIZE, MASTER_ADDR, "
                    "MASTER_PORT, OMPI_COMM_WORLD_*, PMI_*, SLURM_*): running as a single rank");
  brg__errbuf err = {0};
  brg__boot_id bid;
  brg_status s = brg__boot_root_start("127.0.0.1", 0, NULL,
                                      (int)brg__core_int(BRG__CORE_TIMEOUT_MS), &bid, &err);
  if (s != BRG_SUCCESS) return brg__fail_no_comm_err(s, &err, NULL);
  return brg__comm_init_opts(comm, 1, &bid, 0, NULL);
}

/* Under a PMIx server: rank 0 starts the root on its own address (a free
 * port, or BRIGADE_PORT) with a fresh secret and hands the root's id to
 * the others through the server's store. *tried 0: no PMIx here or no
 * libpmix (the caller goes on without it). */
static brg_status init_pmix(brg_comm **comm, int rank, int size, int *tried) {
  brg__errbuf err = {0};
  int prank = -1;
  *tried = 0;
  if (brg__pmix_start(&prank, &err) < 0) {
    BRG__INFO("init", "brg_comm_init_env: %s", err.msg);
    return BRG_ERR_UNAVAILABLE;
  }
  *tried = 1;
  if (prank != rank)
    BRG__WARN("init", "brg_comm_init_env: PMIx says rank %d, the environment %d: taking PMIx's",
              prank, rank);
  rank = prank;
  if (rank < 0 || rank >= size)
    return brg__fail_no_comm(BRG_ERR_INVALID_ARGUMENT,
                             "brg_comm_init_env: PMIx rank %d of a job of %d", rank, size);
  brg__boot_id bid;
  char hex[2 * sizeof bid + 1] = "";
  brg_status s = BRG_SUCCESS;
  if (rank == 0) {
    char addr[64];
    s = brg__boot_local_addr(addr, sizeof addr, &err);
    if (s == BRG_SUCCESS)
      s = brg__boot_root_start(addr, (uint16_t)brg__core_int(BRG__CORE_PORT), NULL,
                               (int)brg__core_int(BRG__CORE_TIMEOUT_MS), &bid, &err);
    const uint8_t *b = (const uint8_t *)&bid;
    for (size_t i = 0; s == BRG_SUCCESS && i < sizeof bid; i++)
      snprintf(hex + 2 * i, 3, "%02x", b[i]);
  }
  /* every task fences, rank 0's failure or not: the others would wait */
  if (brg__pmix_share(rank, hex, sizeof hex, &err) < 0 && s == BRG_SUCCESS) s = BRG_ERR_SYSTEM;
  if (s == BRG_SUCCESS && rank != 0) {
    if (strlen(hex) != 2 * sizeof bid || brg__hex_bytes(hex, (uint8_t *)&bid, sizeof bid) != 0)
      return brg__fail_no_comm(BRG_ERR_REMOTE,
                               "brg_comm_init_env: rank 0 published no bootstrap id through "
                               "PMIx (its root did not start: see its log)");
  }
  if (s != BRG_SUCCESS) return brg__fail_no_comm_err(s, &err, "brg_comm_init_env (PMIx): ");
  BRG__INFO("init", "brg_comm_init_env: the rendezvous through PMIx (rank %d of %d)", rank, size);
  s = brg__comm_init_opts(comm, size, &bid, rank, NULL);
  if (rank == 0) brg__boot_root_linger(s != BRG_SUCCESS ? 5000 : 1000);
  return s;
}

brg_status brg_comm_init_env(brg_comm **comm) {
  if (!comm) return brg__fail_no_comm(BRG_ERR_INVALID_ARGUMENT, "brg_comm_init_env: comm is NULL");
  brg__errbuf err = {0};
  brg_status s = brg__settings_load(&err);
  if (s != BRG_SUCCESS) return brg__fail_no_comm_err(s, &err, NULL);
  brg__log_init();
  static const char *const rank_vars[] = {"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK",
                                          "SLURM_PROCID", NULL};
  static const char *const size_vars[] = {"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE",
                                          "SLURM_NTASKS", NULL};
  if (!launcher_present(rank_vars) && !launcher_present(size_vars)) {
    const char *maddr = getenv("MASTER_ADDR"), *mport = getenv("MASTER_PORT");
    if ((!maddr || !*maddr) && (!mport || !*mport)) return init_alone(comm);
  }
  int rank = -1, size = -1;
  const char *rank_name = NULL, *size_name = NULL;
  if (env_int(rank_vars, &rank, &rank_name) != BRG_SUCCESS) {
    if (rank_name) return BRG_ERR_INVALID_ARGUMENT;
    return brg__fail_no_comm(BRG_ERR_INVALID_ARGUMENT,
                             "brg_comm_init_env: RANK is not set (nor OMPI_COMM_WORLD_RANK, "
                             "PMI_RANK or SLURM_PROCID); start the program with brigade-run, "
                             "torchrun, mpirun or srun");
  }
  if (env_int(size_vars, &size, &size_name) != BRG_SUCCESS) {
    if (size_name) return BRG_ERR_INVALID_ARGUMENT;
    return brg__fail_no_comm(BRG_ERR_INVALID_ARGUMENT,
                             "brg_comm_init_env: WORLD_SIZE is not set (nor OMPI_COMM_WORLD_SIZE, "
                             "PMI_SIZE or SLURM_NTASKS)");
  }
  if (size < 1 || rank >= size)
    return brg__fail_no_comm(BRG_ERR_INVALID_ARGUMENT, "brg_comm_init_env: %s=%d but %s=%d",
                             rank_name, rank, size_name, size);
  const char *maddr = getenv("MASTER_ADDR"), *mport = getenv("MASTER_PORT");
  /* No MASTER_ADDR: a PMIx server's store, else Slurm's step. */
  char slurm_host[256], slurm_from[200] = "";
  int slurm_port = 0;
  if (!maddr || !*maddr) {
    int tried = 0;
    if (brg__pmix_present()) {
      s = init_pmix(comm, rank, size, &tried);
      if (tried) return s;
    }
    int r = brg__slurm_rendezvous(slurm_host, sizeof slurm_host, &slurm_port, slurm_from,
                                  sizeof slurm_from, &err);
    if (r < 0) return brg__fail_no_comm_err(BRG_ERR_INVALID_ARGUMENT, &err, "brg_comm_init_env: ");
    if (r > 0) {
      maddr = slurm_host;
      BRG__INFO("init", "brg_comm_init_env: rendezvous at %s port %d (%s)", slurm_host, slurm_port,
                slurm_from);
    }
  }
  if (!maddr || !*maddr)
    return brg__fail_no_comm(BRG_ERR_INVALID_ARGUMENT,
                             "brg_comm_init_env: MASTER_ADDR is not set (the host of rank 0; "
                             "under Slurm, SLURM_JOB_ID and SLURM_STEP_NODELIST give it, under "
                             "a PMIx launcher, libpmix)");
  /* BRIGADE_PORT, when set, is the port; otherwise MASTER_PORT, which
   * under torchrun the elastic agent's own store holds: then the next one;
   * under Slurm without either, the step's own. */
  long port = (long)brg__core_int(BRG__CORE_PORT);
  const char *port_from = "BRIGADE_PORT";
  if (port == 0 && (!mport || !*mport) && slurm_port) {
    port = slurm_port;
    port_from = "SLURM_JOB_ID and SLURM_STEP_ID";
  } else if (port == 0) {
    port_from = "MASTER_PORT";
    if (!mport || !*mport)
      return brg__fail_no_comm(BRG_ERR_INVALID_ARGUMENT,
                               "brg_comm_init_env: MASTER_PORT is not set (a free TCP port on "
                               "rank 0's host; or set BRIGADE_PORT)");
    char *end;
    port = strtol(mport, &end, 10);
    if (*end || port < 1 || port > 65535)
      return brg__fail_no_comm(BRG_ERR_INVALID_ARGUMENT, "MASTER_PORT=\"%s\" is not a port number",
                               mport);
    const char *elastic = getenv("TORCHELASTIC_RUN_ID");
    if (elastic && *elastic) {
      port = port == 65535 ? 65534 : port + 1;
      port_from = "MASTER_PORT + 1";
    }
  }

  /* The job secret: BRIGADE_SECRET (brigade-run sets a random one), else
   * derived from the rendezvous itself, which only keeps strays out. */
  uint8_t secret[16];
  const char *hex = brg__core_str(BRG__CORE_SECRET);
  if (hex[0]) {
    char why[200];
    if (brg__secret_parse(hex, secret, why, sizeof why) != 0)
      return brg__fail_no_comm(BRG_ERR_INVALID_ARGUMENT, "BRIGADE_SECRET %s", why);
  } else {
    char seed[256];
    /* Not WORLD_SIZE: ranks that disagree on it must reach the root, which
     * names both sizes, rather than be refused for a different secret. */
    int n = snprintf(seed, sizeof seed, "brigade:%s:%ld", maddr, port);
    uint64_t h1 = brg__fnv1a64(BRG__FNV64_INIT, seed, (size_t)n);
    uint64_t h2 = brg__fnv1a64(h1 ^ 0x9e3779b97f4a7c15ull, seed, (size_t)n);
    memcpy(secret, &h1, 8);
    memcpy(secret + 8, &h2, 8);
  }

  /* MASTER_ADDR may be a name: resolve it to the numeric address in the id. */
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
  int g = getaddrinfo(maddr, NULL, &hints, &res);
  if (g != 0 || !res)
    return brg__fail_no_comm(BRG_ERR_INVALID_ARGUMENT, "MASTER_ADDR=\"%s\" does not resolve: %s",
                             maddr, gai_strerror(g));
  char numeric[64];
  g = getnameinfo(res->ai_addr, res->ai_addrlen, numeric, sizeof numeric, NULL, 0, NI_NUMERICHOST);
  freeaddrinfo(res);
  if (g != 0)
    return brg__fail_no_comm(BRG_ERR_INVALID_ARGUMENT, "MASTER_ADDR=\"%s\": %s", maddr,
                             gai_strerror(g));

  /* A derived secret is known to anyone who can reach the rendezvous. */
  int loopback = strncmp(numeric, "127.", 4) == 0 || strcmp(numeric, "::1") == 0;
  if (!hex[0] && !loopback && rank == 0)
    BRG__WARN("init",
              "BRIGADE_SECRET is not set: the job secret is derived from MASTER_ADDR and "
              "MASTER_PORT, which anyone who can reach %s can compute and use to join this job "
              "(it keeps stray connections out, no more); set BRIGADE_SECRET to the same random "
              "32 hex digits or more on every rank "
              "(e.g. export BRIGADE_SECRET=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \\n') "
              "before torchrun, mpirun -x BRIGADE_SECRET, srun --export=ALL)",
              numeric);

  brg__boot_id bid;
  if (rank == 0) {
    s = brg__boot_root_start(numeric, (uint16_t)port, secret,
                             (int)brg__core_int(BRG__CORE_TIMEOUT_MS), &bid, &err);
    if (s != BRG_SUCCESS) {
      /* The usual cause: another program (torch's store, under mp.spawn)
       * holds the port. The other ranks cannot tell; say it here. */
      if (s == BRG_ERR_SYSTEM && strstr(err.msg, "cannot listen on")) {
        size_t n = strlen(err.msg);
        snprintf(err.msg + n, sizeof err.msg - n,
                 " (the port of %s; if another program, such as torch's store, holds it, set "
                 "BRIGADE_PORT to a free port%s)",
                 port_from,
                 slurm_port ? "; under Slurm, rank 0 must run on the step's first node" : "");
      }
      return brg__fail_no_comm_err(s, &err, "rank 0: ");
    }
  }
  if ((s = brg__boot_id_make(&bid, numeric, (uint16_t)port, secret, &err)) != BRG_SUCCESS)
    return brg__fail_no_comm_err(s, &err, NULL);
  s = brg__comm_init_opts(comm, size, &bid, rank, NULL);
  /* The root lives in this process: when the job failed, give it a moment
   * to tell the ranks still on their way why, rather than vanish; when it
   * succeeded, the root is closing its last sockets after the release. */
  if (rank == 0) brg__boot_root_linger(s != BRG_SUCCESS ? 5000 : 1000);
  return s;
}
