/*
 * Errors: the communicator's last error, the thread's error for calls that
 * have no communicator, the abort notice to the ring neighbours, and how a
 * collective is named in messages; the table of live communicators.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

brg_status brg__fail_no_comm(brg_status s, const char *fmt, ...) {
  brg__errbuf err = {0};
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err.msg, sizeof err.msg, fmt, ap);
  va_end(ap);
  return brg__fail_no_comm_err(s, &err, NULL);
}

brg_status brg__fail_no_comm_err(brg_status s, const brg__errbuf *err, const char *prefix) {
  char msg[BRG__ERRLEN];
  snprintf(msg, sizeof msg, "%s%s", prefix ? prefix : "", err->msg);
  if (err->logged != 1) {
    brg__log_init();
    BRG__WARN("init", "%s", msg);
  }
  brg__set_thread_error(msg);
  return s;
}

brg_status brg__comm_error(brg_comm *c, brg_status s, const char *fmt, ...) {
  char msg[BRG__ERRLEN];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  pthread_mutex_lock(&c->err_lock);
  memcpy(c->last_error, msg, sizeof msg);
  pthread_mutex_unlock(&c->err_lock);
  BRG__WARN("coll", "rank %d: %s", c->rank, msg);
  return s;
}

const char *brg_comm_last_error(const brg_comm *comm) {
  if (!comm) return brg__thread_error();
  if (!brg__comm_live(comm, 0) || comm->magic != BRG__COMM_MAGIC)
    return "not a valid communicator (destroyed?)";
  return comm->last_error;
}

brg_status brg__comm_aborted(brg_comm *c, const char *fn) {
  if (__atomic_load_n(&c->broken, __ATOMIC_ACQUIRE) != BRG_SUCCESS) return BRG_ERR_ABORTED;
  return fn ? brg__comm_error(c, BRG_ERR_ABORTED, "%s: communicator was aborted", fn)
            : brg__comm_error(c, BRG_ERR_ABORTED, "communicator was aborted");
}

void brg__comm_notify_abort(brg_comm *c, brg_status s, const char *text) {
  if (!c->bs || c->nranks < 2) return;
  char buf[BRG__BOOT_MAX_MSG];
  memcpy(buf, &s, 4);
  int n = snprintf(buf + 4, sizeof buf - 4, "rank %d failed: %s", c->rank, text);
  uint32_t len = 4 + (uint32_t)(n < (int)sizeof buf - 4 ? n : (int)sizeof buf - 5);
  pthread_mutex_lock(&c->ring_lock);
  for (int dir = 0; dir < 2; dir++) brg__bootstrap_send(c->bs, dir, BRG__MSG_ABORT, buf, len, NULL);
  pthread_mutex_unlock(&c->ring_lock);
}

/* Live communicators, so that a destroyed one is told without reading its
 * memory: each has a serial number that is never reused, which requests
 * keep to tell their communicator from a new one at the same address. */
static pthread_mutex_t live_lock = PTHREAD_MUTEX_INITIALIZER;
static struct live_entry {
  const brg_comm *c;
  uint32_t serial;
} * live;
static size_t nlive, live_cap;
static uint32_t live_serial;

uint32_t brg__comm_register(const brg_comm *c) {
  uint32_t serial = 0;
  pthread_mutex_lock(&live_lock);
  if (nlive == live_cap) {
    size_t cap = live_cap ? 2 * live_cap : 16;
    struct live_entry *grown = realloc(live, cap * sizeof *grown);
    if (grown) {
      live = grown;
      live_cap = cap;
    }
  }
  if (nlive < live_cap) {
    if (++live_serial == 0) live_serial = 1;
    serial = live_serial;
    live[nlive++] = (struct live_entry){c, serial};
  }
  pthread_mutex_unlock(&live_lock);
  return serial;
}

void brg__comm_unregister(const brg_comm *c) {
  pthread_mutex_lock(&live_lock);
  for (size_t i = 0; i < nlive; i++)
    if (live[i].c == c) {
      live[i] = live[--nlive];
      break;
    }
  pthread_mutex_unlock(&live_lock);
}

int brg__comm_live(const brg_comm *c, uint32_t serial) {
  int found = 0;
  pthread_mutex_lock(&live_lock);
  for (size_t i = 0; i < nlive && !found; i++)
    found = live[i].c == c && (serial == 0 || live[i].serial == serial);
  pthread_mutex_unlock(&live_lock);
  return found;
}

brg_status brg__check_comm(const brg_comm *c, const char *fn) {
  if (!c) return brg__fail_no_comm(BRG_ERR_INVALID_ARGUMENT, "%s: comm is NULL", fn);
  if (!brg__comm_live(c, 0) || c->magic != BRG__COMM_MAGIC)
    return brg__fail_no_comm(BRG_ERR_INVALID_ARGUMENT, "%s: not a valid communicator (destroyed?)",
                             fn);
  return BRG_SUCCESS;
}

const char *brg__coll_name(brg__coll_kind kind) {
  switch (kind) {
  case BRG__COLL_ALLREDUCE: return "allreduce";
  case BRG__COLL_REDUCE_SCATTER: return "reduce_scatter";
  case BRG__COLL_ALL_GATHER: return "all_gather";
  case BRG__COLL_BROADCAST: return "broadcast";
  case BRG__COLL_REDUCE: return "reduce";
  case BRG__COLL_BARRIER: return "barrier";
  case BRG__COLL_ALL_TO_ALL: return "all_to_all";
  case BRG__COLL_GATHER: return "gather";
  case BRG__COLL_SCATTER: return "scatter";
  }
  return "unknown";
}

void brg__coll_describe(char *out, size_t n, brg__coll_kind kind, uint64_t seq, uint64_t count,
                        int dtype, int op, int root, int device) {
  const char *dn = brg_dtype_name((brg_dtype)dtype), *on = brg_op_name((brg_op)op);
  snprintf(out, n, "%s #%llu (count %llu, %s, %s, root %d%s)", brg__coll_name(kind),
           (unsigned long long)seq, (unsigned long long)count, dn ? dn : "?", on ? on : "-", root,
           device ? ", GPU buffers" : "");
}
