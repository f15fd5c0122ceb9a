/*
 * Multi-process test harness: the parent forks N ranks, hands them a unique
 * id (or torchrun-style environment variables), each rank builds a
 * communicator and runs a body; the parent waits with a deadline, kills
 * everything that outlives it, and says which rank failed and why.
 *
 * The parent hosts the bootstrap root (brg_get_unique_id starts it), so it
 * stays alive until every rank has exited. Children are forked before the
 * parent touches the library, so no child inherits a lock held by a library
 * thread.
 *
 * Every run also checks that the ranks left no /dev/shm/brigade* file
 * behind: the parent watches which such files the ranks map or hold open
 * while they run and checks, after they are gone, that none is left.
 */
#ifndef MP_HARNESS_H
#define MP_HARNESS_H

#include <stdint.h>
#include <stddef.h>
#include "brigade.h"

#define MP_MAX_RANKS 64
#define MP_REASON_BYTES 512

/* One page-aligned area shared by the parent and all ranks of a run. */
typedef struct mp_shared {
  int32_t pids[MP_MAX_RANKS];
  int32_t progress[MP_MAX_RANKS]; /* bodies bump it; the parent's victim trigger reads it */
  int64_t signal_ns;              /* CLOCK_MONOTONIC when the parent signalled the victim */
  int32_t flags[32];              /* free for bodies and parent threads */
  int64_t vals[4 * MP_MAX_RANKS]; /* free for bodies */
  char reason[MP_MAX_RANKS][MP_REASON_BYTES]; /* first failure of each rank */
} mp_shared;

enum {
  MP_INIT_ID,   /* parent: brg_get_unique_id; ranks: brg_comm_init */
  MP_INIT_ENV,  /* ranks: MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE, brg_comm_init_env */
  MP_INIT_NONE, /* the body builds (or fails to build) its communicator itself; ctx->id is valid */
  MP_INIT_BARE, /* no unique id, no communicator: the body does everything */
};

typedef struct mp_ctx {
  int rank, nranks;
  brg_comm *comm;          /* built by the harness (NULL with MP_INIT_NONE); the harness
                              destroys it after the body unless the body set it to NULL */
  const brg_unique_id *id; /* the id of this run (MP_INIT_ID and MP_INIT_NONE) */
  mp_shared *shared;
  void *arg;
} mp_ctx;

/* Returns 0 on success; any other value (or a call to mp_fail) fails the rank. */
typedef int (*mp_body_fn)(mp_ctx *ctx);

typedef struct mp_opts {
  const char *name; /* shown in every message */
  int nranks;
  int deadline_ms; /* the whole run; 0: 120000 */
  int init;        /* MP_INIT_* */
  int master_port; /* MP_INIT_ENV: MASTER_PORT (MASTER_ADDR is 127.0.0.1) */
  /* Optional victim: once every rank's progress counter reaches victim_after,
   * wait victim_delay_ms, then send victim_signal to rank `victim`. SIGSTOP'd
   * victims get SIGKILL once every other rank has exited. The victim is
   * expected to die by SIGKILL. victim < 0: none. */
  int victim;
  int victim_signal;
  int victim_after;
  int victim_delay_ms;
  /* Optional thread run in the parent while the ranks run (joined after). */
  void *(*parent_thread)(void *arg);
  void *parent_arg;
  int expect_no_shm; /* fail if a rank maps a brigade shm file (tcp-only runs) */
  int expect_shm;    /* fail if no rank maps a brigade shm file (shm runs, N >= 2) */
} mp_opts;

/* Runs the ranks; returns 0 when every rank passed and nothing leaked. */
int mp_run(const mp_opts *opts, mp_body_fn body, void *arg);

/* The shared area of the current (or next) run; valid in the parent and in ranks. */
mp_shared *mp_shared_area(void);

/* In a rank: records a failure (printed on stderr with the rank). */
void mp_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int mp_failures(void);
/* In a rank: prints an informational line with the rank. */
void mp_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#define MP_CHECK(cond, ...)                                                                        \
  do {                                                                                             \
    if (!(cond)) mp_fail(__VA_ARGS__);                                                             \
  } while (0)

/* Helpers. */
int64_t mp_now_ns(void); /* CLOCK_MONOTONIC, same clock in every process */
void mp_sleep_ms(int ms);
int mp_env_int(const char *name, int defval);
const char *mp_transport(void); /* BRIGADE_TRANSPORTS, "default" when unset */
/* A TCP port on 127.0.0.1 that was free a moment ago. */
int mp_free_port(void);
/* Does `msg` name rank r ("rank 2", "ranks 1, 2 and 3", "rank=2", "peer 2")? */
int mp_names_rank(const char *msg, int r);
/* Case-insensitive substring. */
int mp_contains(const char *haystack, const char *needle);
/* Waits until flags[i] != 0 or timeout; returns 1 when set. */
int mp_wait_flag(int i, int timeout_ms);

#endif
