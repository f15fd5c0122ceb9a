/*
 * A failed work completion on the ibverbs transport (software backend)
 * becomes BRG_ERR_REMOTE with a text that names the peer and the
 * completion's status string:
 *
 *   link   two ends of one ibverbs link in this process; slices flow, then
 *          the next write-with-immediate carries a wrong rkey
 *          (brg__vb_soft_test_bad_rkey). The peer refuses it as an RC
 *          responder does: the sender's completion fails with "remote access
 *          error", the receiver's posted receives are flushed. Both FIFOs
 *          must be closed with BRG_ERR_REMOTE and say so, naming the peer;
 *          the receiver's text also carries the sender's reason.
 *   comm   the same fault under a two-rank communicator (forked ranks, ring
 *          links over ibverbs only): both ranks' allreduce fails with
 *          BRG_ERR_REMOTE and brg_comm_last_error names the other rank and
 *          "remote access error" (rank 1 learns it from rank 0's failure
 *          notice on the link's control connection).
 *
 * Usage: test_verbs_errors link|comm. Exit 0 pass, 1 fail.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../multiproc/harness.h"
#include "settings.h"
#include "transport.h"
#include "verbs_api.h"

#define SETUP_TIMEOUT_MS 10000
#define FAIL_WITHIN_MS 5000 /* a failed completion must end the waits within this */
#define GOOD_SLICES 100

static int failures;

static void check(int cond, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void check(int cond, const char *fmt, ...) {
  if (cond) return;
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "FAIL: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  failures++;
}

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- link: the transport directly -------------------------------------------- */

typedef struct test_wait {
  brg__fifo *fifo;
  int64_t deadline;
} test_wait;

static brg_status wait_check(void *arg) {
  test_wait *tw = arg;
  if (tw->fifo && tw->fifo->ctrl) {
    uint32_t closed = __atomic_load_n(&tw->fifo->ctrl->closed, __ATOMIC_ACQUIRE);
    if (closed) return (brg_status)closed;
  }
  return now_ms() > tw->deadline ? BRG_ERR_TIMEOUT : BRG_SUCCESS;
}

static test_wait setup_wait = {.deadline = INT64_MAX};
static const brg__waiter setup_waiter = {.spin = 100, .check = wait_check, .arg = &setup_wait};

static brg__peer_info infos[2]; /* rank 0 sends, rank 1 receives */
static uint8_t secret[BRG__SECRET_BYTES];

static brg__conn_params params(int rank) {
  return (brg__conn_params){.rank = rank,
                            .peer = 1 - rank,
                            .nranks = 2,
                            .self_info = &infos[rank],
                            .peer_info = &infos[1 - rank],
                            .nslots = 4,
                            .slot_bytes = 8192,
                            .comm_id = 0x7e57,
                            .secret = secret,
                            .timeout_ms = SETUP_TIMEOUT_MS,
                            .waiter = &setup_waiter};
}

typedef struct sender_arg {
  brg__conn *c;
  char info[BRG__CONN_INFO_BYTES];
  brg_status s;
  brg__errbuf err;
} sender_arg;

static void *sender_connect(void *p) {
  sender_arg *a = p;
  brg__conn_params prm = params(0);
  a->s = a->c->ops->send_connect(a->c, &prm, a->info, &a->err);
  return NULL;
}

/* One slice of `bytes` bytes from the sender, as the engine publishes it. */
static brg_status produce(brg__conn *c, uint64_t i, uint32_t bytes, int64_t deadline) {
  brg__fifo *f = &c->fifo;
  test_wait tw = {.fifo = f, .deadline = deadline};
  const brg__waiter w = {.spin = 100, .check = wait_check, .arg = &tw};
  uint64_t need = i + 1 > (uint64_t)f->nslots ? i + 1 - (uint64_t)f->nslots : 0;
  brg_status s = brg__wait_ge(&f->ctrl->head, &f->ctrl->head_waiters, need, &w);
  if (s != BRG_SUCCESS) return s;
  memset(brg__fifo_slot(f, i), (int)(i & 0xff), bytes);
  brg__slot_meta *m = brg__fifo_meta(f, i);
  memset(m, 0, sizeof *m);
  m->seq = i + 1;
  m->bytes = bytes;
  brg__publish(&f->ctrl->tail, &f->ctrl->tail_waiters, i + 1);
  return BRG_SUCCESS;
}

static brg_status consume(brg__conn *c, uint64_t i, int64_t deadline) {
  brg__fifo *f = &c->fifo;
  test_wait tw = {.fifo = f, .deadline = deadline};
  const brg__waiter w = {.spin = 100, .check = wait_check, .arg = &tw};
  brg_status s = brg__wait_ge(&f->ctrl->tail, &f->ctrl->tail_waiters, i + 1, &w);
  if (s != BRG_SUCCESS) return s;
  const brg__slot_meta *m = brg__fifo_meta(f, i);
  check(m->seq == i + 1, "slice %llu: seq %llu", (unsigned long long)i, (unsigned long long)m->seq);
  const unsigned char *d = (const unsigned char *)brg__fifo_slot(f, i);
  for (uint32_t k = 0; k < m->bytes; k++)
    if (d[k] != (i & 0xff)) {
      check(0, "slice %llu: byte %u is %u, expected %u", (unsigned long long)i, k, d[k],
            (unsigned)(i & 0xff));
      break;
    }
  brg__publish(&f->ctrl->head, &f->ctrl->head_waiters, i + 1);
  return BRG_SUCCESS;
}

static const char *why(const brg__conn *c) {
  return c->fifo.ctrl ? c->fifo.ctrl->closed_why : "(no FIFO)";
}

static int case_link(void) {
  const brg__transport_ops *ops = &brg__transport_ibverbs;
  char avail[256] = "";
  if (!ops->available(avail, sizeof avail)) {
    fprintf(stderr, "FAIL: ibverbs unavailable with BRIGADE_IB_BACKEND=soft: %s\n", avail);
    return 1;
  }
  for (int r = 0; r < 2; r++) {
    infos[r].rank = r;
    infos[r].pid = getpid();
    infos[r].host_hash = 0x686f7374;
    snprintf(infos[r].hostname, sizeof infos[r].hostname, "localhost");
    snprintf(infos[r].addr, sizeof infos[r].addr, "127.0.0.1");
  }
  for (int i = 0; i < BRG__SECRET_BYTES; i++) secret[i] = (uint8_t)(i * 37 + 11);

  brg__conn rc = {.ops = ops}, sc = {.ops = ops};
  brg__errbuf err = {0};
  sender_arg sa = {.c = &sc};
  brg__conn_params p = params(1);
  brg_status s = ops->recv_setup(&rc, &p, sa.info, &err);
  if (s != BRG_SUCCESS) {
    fprintf(stderr, "FAIL: recv_setup: %s: %s\n", brg_status_string(s), err.msg);
    return 1;
  }
  pthread_t t;
  if (pthread_create(&t, NULL, sender_connect, &sa) != 0) return 1;
  s = ops->recv_connect(&rc, &p, &err);
  pthread_join(t, NULL);
  if (s != BRG_SUCCESS || sa.s != BRG_SUCCESS) {
    fprintf(stderr, "FAIL: connect: receiver %s (%s), sender %s (%s)\n", brg_status_string(s),
            err.msg, brg_status_string(sa.s), sa.err.msg);
    ops->close(&sc);
    ops->close(&rc);
    return 1;
  }

  /* The link works before the fault. */
  int64_t deadline = now_ms() + 30000;
  for (uint64_t i = 0; i < GOOD_SLICES && !failures; i++) {
    s = produce(&sc, i, (uint32_t)(i * 97 % 8193), deadline);
    check(s == BRG_SUCCESS, "sender, slice %llu: %s", (unsigned long long)i, brg_status_string(s));
    s = consume(&rc, i, deadline);
    check(s == BRG_SUCCESS, "receiver, slice %llu: %s", (unsigned long long)i,
          brg_status_string(s));
  }
  printf("  %d slices delivered before the fault\n", GOOD_SLICES);

  /* The next write-with-immediate carries a wrong rkey. */
  brg__vb_soft_test_bad_rkey(1);
  int64_t t0 = now_ms();
  s = produce(&sc, GOOD_SLICES, 1000, t0 + FAIL_WITHIN_MS);
  check(s == BRG_SUCCESS, "sender, the spoiled slice: %s", brg_status_string(s));
  /* Its slot never comes back: the wait ends on the closed link. */
  test_wait tw = {.fifo = &sc.fifo, .deadline = t0 + FAIL_WITHIN_MS};
  const brg__waiter w = {.spin = 100, .check = wait_check, .arg = &tw};
  s = brg__wait_ge(&sc.fifo.ctrl->head, &sc.fifo.ctrl->head_waiters, GOOD_SLICES + 1, &w);
  int64_t took = now_ms() - t0;
  check(s == BRG_ERR_REMOTE, "sender: wait for the spoiled slot ended with %s after %lld ms",
        brg_status_string(s), (long long)took);
  check(sc.fifo.ctrl->closed == BRG_ERR_REMOTE, "sender: closed is %u, expected BRG_ERR_REMOTE",
        sc.fifo.ctrl->closed);
  check(strstr(why(&sc), "remote access error") != NULL,
        "sender: \"%s\" lacks the completion status \"remote access error\"", why(&sc));
  check(strstr(why(&sc), "rank 1") != NULL, "sender: \"%s\" does not name rank 1", why(&sc));
  check(strstr(why(&sc), "soft") != NULL, "sender: \"%s\" does not name the backend", why(&sc));
  printf("  sender after %lld ms: %s: %s\n", (long long)took, brg_status_string(s), why(&sc));

  /* The receiver's queue pair went to error with the refusal. */
  s = consume(&rc, GOOD_SLICES, t0 + FAIL_WITHIN_MS);
  took = now_ms() - t0;
  check(s == BRG_ERR_REMOTE, "receiver: wait past the refused slice ended with %s after %lld ms",
        brg_status_string(s), (long long)took);
  check(strstr(why(&rc), "flushed") != NULL,
        "receiver: \"%s\" lacks the completion status \"flushed\"", why(&rc));
  check(strstr(why(&rc), "rank 0") != NULL, "receiver: \"%s\" does not name rank 0", why(&rc));
  check(strstr(why(&rc), "remote access error") != NULL,
        "receiver: \"%s\" lacks the sender's reason \"remote access error\"", why(&rc));
  printf("  receiver after %lld ms: %s: %s\n", (long long)took, brg_status_string(s), why(&rc));

  brg__vb_soft_test_bad_rkey(0);
  ops->close(&sc);
  ops->close(&rc);
  check(!sc.priv && !rc.priv, "close() left conn.priv set");
  return failures != 0;
}

/* ---- comm: through a communicator ------------------------------------------- */

#define COUNT (1 << 20) /* 4 MiB of float32: more slices than a FIFO holds */

static const char *errmsg(const brg_comm *c) {
  const char *m = brg_comm_last_error(c);
  return m ? m : "(null)";
}

static int body_comm(mp_ctx *ctx) {
  brg_comm *c = ctx->comm;
  float *s = malloc(COUNT * sizeof *s), *r = malloc(COUNT * sizeof *r);
  MP_CHECK(s && r, "out of memory");
  if (!s || !r) return 1;
  for (int i = 0; i < COUNT; i++) s[i] = (float)(ctx->rank + 1) * (float)(i % 1000);
  /* One good allreduce first: the links work. */
  brg_status st = brg_allreduce(s, r, COUNT, BRG_FLOAT32, BRG_SUM, c, NULL);
  MP_CHECK(st == BRG_SUCCESS, "allreduce before the fault: %s: %s", brg_status_string(st),
           errmsg(c));
  for (int i = 0; st == BRG_SUCCESS && i < COUNT; i++)
    if (r[i] != 3.0f * (float)(i % 1000)) {
      mp_fail("allreduce before the fault: element %d is %g, expected %g", i, (double)r[i],
              3.0 * (i % 1000));
      break;
    }
  /* Rank 0 spoils its next write only once rank 1 has everything of the
   * barrier: its proxy posts writes after the engine has moved on. */
  brg_status bs = brg_barrier(c);
  MP_CHECK(bs == BRG_SUCCESS, "barrier: %s: %s", brg_status_string(bs), errmsg(c));
  if (ctx->rank == 1) __atomic_store_n(&ctx->shared->flags[0], 1, __ATOMIC_SEQ_CST);
  if (ctx->rank == 0) {
    MP_CHECK(mp_wait_flag(0, 20000), "rank 1 did not get past the barrier");
    brg__vb_soft_test_bad_rkey(1);
  }
  st = brg_allreduce(s, r, COUNT, BRG_FLOAT32, BRG_SUM, c, NULL);
  const char *m = errmsg(c);
  mp_info("allreduce after the fault: %s: %s", brg_status_string(st), m);
  MP_CHECK(st == BRG_ERR_REMOTE, "allreduce after the fault returned %s, expected %s: %s",
           brg_status_string(st), brg_status_string(BRG_ERR_REMOTE), m);
  /* Rank 0's write failed; rank 1 saw its receives flushed and heard why
   * from rank 0. Either way both name the completion status and the peer. */
  MP_CHECK(mp_contains(m, "remote access error"),
           "the error lacks the completion status \"remote access error\": %s", m);
  MP_CHECK(mp_names_rank(m, 1 - ctx->rank), "the error does not name rank %d: %s", 1 - ctx->rank,
           m);
  free(s);
  free(r);
  return 0;
}

static int case_comm(void) {
  mp_opts o = {.name = "failed completion under a communicator",
               .nranks = 2,
               .deadline_ms = 60000,
               .init = MP_INIT_ID,
               .victim = -1};
  return mp_run(&o, body_comm, NULL);
}

int main(int argc, char **argv) {
  const char *which = argc > 1 ? argv[1] : "";
  /* The software backend, and ibverbs between ranks of one host. */
  setenv("BRIGADE_IB_BACKEND", "soft", 1);
  setenv("BRIGADE_IB_ALLOW_LOCAL", "1", 1);
  setenv("BRIGADE_DEBUG", "WARN", 0);
  signal(SIGPIPE, SIG_IGN);
  if (!strcmp(which, "comm")) {
    setenv("BRIGADE_TRANSPORTS", "ibverbs", 1);
    setenv("BRIGADE_TIMEOUT_MS", "20000", 0);
    int bad = case_comm();
    printf("%s\n", bad ? "FAIL" : "PASS");
    return bad ? 1 : 0;
  }
  if (strcmp(which, "link") != 0) {
    fprintf(stderr, "usage: %s link|comm\n", argv[0]);
    return 2;
  }
  brg__errbuf err = {0};
  if (brg__settings_load(&err) != BRG_SUCCESS) {
    fprintf(stderr, "FAIL: configuration: %s\n", err.msg);
    return 1;
  }
  brg__log_init();
  int bad = case_link();
  printf("%s\n", bad ? "FAIL" : "PASS");
  return bad;
}
