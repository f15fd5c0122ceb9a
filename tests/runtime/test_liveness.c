/* Liveness (runtime/core/liveness.c): a rank of this host whose heartbeats stop
 * while its process is alive is slow, not gone. Three ranks as threads of
 * this process (one pid: /proc shows it running); rank 1's heartbeats are
 * held back for three times BRIGADE_SILENT_TIMEOUT_MS (its liveness
 * thread waits on the ring lock the test holds) while ranks 0 and 2 wait
 * for it in an allreduce, which must finish with the right sums. The
 * stopped process (state T), which must still be named, is the multiproc
 * faults tests' SIGSTOP trials. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "internal.h"

#define N 3
#define COUNT 1000
#define SILENT_MS 1000

typedef struct rank_arg {
  int rank;
  const brg_unique_id *id;
  brg_comm *comm;
  brg_status init, run;
  double out[COUNT];
  char why[BRG__ERRLEN];
  pthread_barrier_t *ready;
  pthread_mutex_t *hold; /* rank 1: waits on it before its allreduce */
} rank_arg;

static void *rank_main(void *p) {
  rank_arg *a = p;
  a->init = brg_comm_init(&a->comm, N, a->id, a->rank);
  pthread_barrier_wait(a->ready);
  if (a->init != BRG_SUCCESS) return NULL;
  pthread_barrier_wait(a->ready); /* the test holds rank 1's beats from here */
  if (a->hold) {
    pthread_mutex_lock(a->hold);
    pthread_mutex_unlock(a->hold);
  }
  double in[COUNT];
  for (int i = 0; i < COUNT; i++) in[i] = a->rank * 1000.0 + i;
  a->run = brg_allreduce(in, a->out, COUNT, BRG_FLOAT64, BRG_SUM, a->comm, NULL);
  if (a->run != BRG_SUCCESS) snprintf(a->why, sizeof a->why, "%s", brg_comm_last_error(a->comm));
  return NULL;
}

static void test_slow_rank_is_not_gone(void **state) {
  (void)state;
  setenv("BRIGADE_TRANSPORTS", "shm", 1);
  setenv("BRIGADE_SILENT_TIMEOUT_MS", "1000", 1);
  setenv("BRIGADE_TIMEOUT_MS", "30000", 1);
  setenv("BRIGADE_ALGO", "ring", 1);
  brg_unique_id id;
  assert_int_equal(brg_get_unique_id(&id), BRG_SUCCESS);
  pthread_barrier_t ready;
  pthread_barrier_init(&ready, NULL, N + 1);
  pthread_mutex_t hold = PTHREAD_MUTEX_INITIALIZER;
  rank_arg a[N];
  pthread_t t[N];
  memset(a, 0, sizeof a);
  for (int r = 0; r < N; r++) {
    a[r] = (rank_arg){.rank = r, .id = &id, .ready = &ready, .hold = r == 1 ? &hold : NULL};
    assert_int_equal(pthread_create(&t[r], NULL, rank_main, &a[r]), 0);
  }
  pthread_barrier_wait(&ready);
  for (int r = 0; r < N; r++) assert_int_equal(a[r].init, BRG_SUCCESS);
  /* Rank 1 sends no heartbeat (its liveness thread waits for the ring
   * lock) and joins the allreduce only after three silent limits. */
  pthread_mutex_lock(&hold);
  pthread_mutex_lock(&a[1].comm->ring_lock);
  pthread_barrier_wait(&ready);
  struct timespec ts = {3 * SILENT_MS / 1000, 0};
  nanosleep(&ts, NULL);
  pthread_mutex_unlock(&a[1].comm->ring_lock);
  pthread_mutex_unlock(&hold);
  for (int r = 0; r < N; r++) pthread_join(t[r], NULL);
  for (int r = 0; r < N; r++) {
    if (a[r].run != BRG_SUCCESS) fail_msg("rank %d: %s", r, a[r].why);
    for (int i = 0; i < COUNT; i++) assert_true(a[r].out[i] == 3000.0 + 3.0 * i);
  }
  for (int r = 0; r < N; r++) assert_int_equal(brg_comm_destroy(a[r].comm), BRG_SUCCESS);
  pthread_barrier_destroy(&ready);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_slow_rank_is_not_gone),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
