/*
 * The rendezvous that launchers give without MASTER_ADDR and MASTER_PORT
 * (launch.c, for rendezvous.c): Slurm's step (its node list and job id)
 * and a PMIx server's key-value exchange (Open MPI's mpirun, srun
 * --mpi=pmix), libpmix opened at run time.
 */
#ifndef BRG_LAUNCH_H
#define BRG_LAUNCH_H

#include <stddef.h>

#include "status.h"

/* The first host of a Slurm host list ("node[01-04,07],gpu3" -> "node01";
 * each bracket's first number, its zero padding kept). -1 and a message
 * in *err when the list is malformed. */
int brg__slurm_first_host(const char *list, char *host, size_t host_bytes, brg__errbuf *err);

/* The rendezvous port of a Slurm step: 12000 + (job * 100 + step) mod
 * 20000, below Linux's ephemeral ports, the same on every task of the
 * step and different for the next step of the job. */
int brg__slurm_port(unsigned long job, unsigned long step);

/* A task of an srun step (SLURM_JOB_ID, a numeric SLURM_STEP_ID and a
 * node list set): the first node of the step, its port, and the
 * variables they came from, for messages. 0: not an srun step's task;
 * -1: malformed (*err says why). */
int brg__slurm_rendezvous(char *host, size_t host_bytes, int *port, char *from, size_t from_bytes,
                          brg__errbuf *err);

/* A PMIx server's key-value exchange (Open MPI's mpirun, srun --mpi=pmix;
 * PMIX_NAMESPACE set), through libpmix opened at run time. */
/* 1 when the environment names a PMIx server. */
int brg__pmix_present(void);
/* Joins it: this task's rank in *rank. 0: joined; -1: no libpmix here or
 * PMIx_Init failed (*err says which). */
int brg__pmix_start(int *rank, brg__errbuf *err);
/* Rank 0 publishes `value` (a string); after a fence of every task the
 * others read it into `value`. Then leaves PMIx. 0: done; -1: failed. */
int brg__pmix_share(int rank, char *value, size_t value_bytes, brg__errbuf *err);

#endif
