/*
 * The FIFO every transport presents to the ring engine, and the wait that
 * backs off from spinning to yielding to sleeping on a futex, so that ranks
 * oversubscribing the cores do not starve each other.
 */
#include <stdarg.h>
#include <stdio.h>
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "transport.h"

_Static_assert(sizeof(brg__slot_meta) == 64, "slot meta is one cache line");
_Static_assert(offsetof(brg__slot_meta, inline_data) % 8 == 0, "inline data is 8-byte aligned");

#define PAGE 4096

static size_t meta_offset(void) {
  return (sizeof(brg__fifo_ctrl) + 63) & ~(size_t)63;
}
static size_t data_offset(int nslots) {
  size_t end = meta_offset() + (size_t)nslots * sizeof(brg__slot_meta);
  return (end + PAGE - 1) & ~(size_t)(PAGE - 1);
}

size_t brg__fifo_region_bytes(int nslots, size_t slot_bytes) {
  return data_offset(nslots) + (size_t)nslots * slot_bytes;
}

void brg__fifo_attach(brg__fifo *f, void *region, int nslots, size_t slot_bytes, int init) {
  char *base = region;
  f->ctrl = (brg__fifo_ctrl *)base;
  f->meta = (brg__slot_meta *)(base + meta_offset());
  f->data = base + data_offset(nslots);
  f->nslots = nslots;
  f->slot_bytes = slot_bytes;
  if (init) {
    /* Touch every page now so the first collective does not pay for faults. */
    memset(base, 0, brg__fifo_region_bytes(nslots, slot_bytes));
  }
}

brg_status brg__fifo_alloc(brg__fifo *f, int nslots, size_t slot_bytes, brg__errbuf *err) {
  size_t bytes = brg__fifo_region_bytes(nslots, slot_bytes);
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    return brg__error(err, BRG_ERR_NO_MEMORY, "init", "mmap of a %zu-byte FIFO: %s", bytes,
                      strerror(errno));
  brg__fifo_attach(f, p, nslots, slot_bytes, 1);
  return BRG_SUCCESS;
}

void brg__fifo_free(brg__fifo *f) {
  if (f->ctrl) munmap(f->ctrl, brg__fifo_region_bytes(f->nslots, f->slot_bytes));
  memset(f, 0, sizeof *f);
}

static void futex_wait(volatile uint64_t *word, uint32_t seen, long ns) {
  struct timespec ts = {0, ns};
  /* The counter's low 32 bits on a little-endian machine share its address. */
  syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, seen, &ts, NULL, 0);
}

static void futex_wake(volatile uint64_t *word) {
  syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

brg_status brg__wait_ge(volatile uint64_t *word, volatile uint32_t *waiters, uint64_t target,
                        const brg__waiter *w) {
  if (__atomic_load_n(word, __ATOMIC_ACQUIRE) >= target) return BRG_SUCCESS;
  int spin = w ? w->spin : 1000;
  for (int i = 0; i < spin; i++) {
    brg__cpu_relax();
    if (__atomic_load_n(word, __ATOMIC_ACQUIRE) >= target) return BRG_SUCCESS;
  }
  /* Yield for up to ~200 us before sleeping: when ranks outnumber cores,
   * the peer we wait for is often runnable and this hands it the core. */
  int64_t t0 = brg__now_ns();
  for (int i = 1; spin >= 0; i++) {
    sched_yield();
    if (__atomic_load_n(word, __ATOMIC_ACQUIRE) >= target) return BRG_SUCCESS;
    if (i % 16 == 0 && brg__now_ns() - t0 > 200000) break;
  }
  for (;;) {
    if (w && w->check) {
      brg_status s = w->check(w->arg);
      /* Data that arrived before the failure is still good. */
      if (s != BRG_SUCCESS)
        return __atomic_load_n(word, __ATOMIC_ACQUIRE) >= target ? BRG_SUCCESS : s;
    }
    __atomic_fetch_add(waiters, 1, __ATOMIC_SEQ_CST);
    uint64_t v = __atomic_load_n(word, __ATOMIC_SEQ_CST);
    if (v < target) futex_wait(word, (uint32_t)v, 1000000);
    __atomic_fetch_sub(waiters, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(word, __ATOMIC_ACQUIRE) >= target) return BRG_SUCCESS;
  }
}

brg_status brg__wait_flag(volatile uint64_t *flag, uint64_t expect, volatile uint64_t *word,
                          volatile uint32_t *waiters, const brg__waiter *w) {
  int spin = w ? w->spin : 1000;
  for (int i = 0; i < spin; i++) {
    if (__atomic_load_n(flag, __ATOMIC_ACQUIRE) == expect) return BRG_SUCCESS;
    brg__cpu_relax();
  }
  for (;;) {
    brg_status s = brg__wait_ge(word, waiters, expect, w);
    if (__atomic_load_n(flag, __ATOMIC_ACQUIRE) == expect) return BRG_SUCCESS;
    if (s != BRG_SUCCESS) return s;
    brg__cpu_relax();
  }
}

void brg__publish(volatile uint64_t *word, volatile uint32_t *waiters, uint64_t value) {
  __atomic_store_n(word, value, __ATOMIC_SEQ_CST);
  if (__atomic_load_n(waiters, __ATOMIC_SEQ_CST)) futex_wake(word);
}

int brg__fifo_mark_closed(brg__fifo *f, brg_status s, const char *fmt, ...) {
  /* Only the winner of the claim writes closed_why, so two closers cannot
   * interleave their texts; readers acquire `closed` before reading it. */
  uint32_t zero = 0;
  if (!__atomic_compare_exchange_n(&f->ctrl->closing, &zero, 1, 0, __ATOMIC_ACQ_REL,
                                   __ATOMIC_RELAXED))
    return 0;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(f->ctrl->closed_why, sizeof f->ctrl->closed_why, fmt, ap);
  va_end(ap);
  __atomic_store_n(&f->ctrl->closed, (uint32_t)s, __ATOMIC_RELEASE);
  return 1;
}

void brg__fifo_wake_all(brg__fifo *f) {
  if (!f->ctrl) return;
  futex_wake(&f->ctrl->tail);
  futex_wake(&f->ctrl->head);
}

/* ---- a FIFO link as a byte stream (transport.h) ----------------------- */

size_t brg__fifo_stream_fill(brg__fifo *f, const void *buf, size_t bytes, uint64_t *tail) {
  uint64_t t = *tail, head = __atomic_load_n(&f->ctrl->head, __ATOMIC_ACQUIRE);
  size_t took = 0;
  while (took < bytes && t < head + (uint64_t)f->nslots) {
    size_t n = bytes - took < f->slot_bytes ? bytes - took : f->slot_bytes;
    memcpy(brg__fifo_slot(f, t), (const char *)buf + took, n);
    brg__slot_meta *m = brg__fifo_meta(f, t);
    memset(m, 0, offsetof(brg__slot_meta, flag));
    m->bytes = (uint32_t)n;
    took += n;
    t++;
  }
  *tail = t;
  return took;
}

size_t brg__fifo_stream_take(brg__fifo *f, void *buf, size_t bytes, size_t *off, uint64_t *head) {
  uint64_t h = *head, tail = __atomic_load_n(&f->ctrl->tail, __ATOMIC_ACQUIRE);
  size_t got = 0;
  while (got < bytes && h < tail) {
    /* The sender's word for how full its slot is: never past the slot. */
    size_t in = brg__fifo_meta(f, h)->bytes;
    if (in > f->slot_bytes) in = f->slot_bytes;
    size_t n = in - *off < bytes - got ? in - *off : bytes - got;
    memcpy((char *)buf + got, brg__fifo_slot(f, h) + *off, n);
    got += n;
    *off += n;
    if (*off == in) {
      *off = 0;
      h++;
    }
  }
  *head = h;
  return got;
}

/* ---- the proxy entry of a FIFO link (transport.h) ---------------------- */

int brg__fifo_proxy_fill(brg__conn *c, const brg__proxy_slot *s, int copy, uint64_t *pos) {
  brg__fifo *f = &c->fifo;
  if (__atomic_load_n(&f->ctrl->closed, __ATOMIC_ACQUIRE)) return -1;
  if (s->bytes > f->slot_bytes || s->channel > UINT16_MAX ||
      (s->what != BRG__PROXY_DATA && s->what != BRG__PROXY_CALL)) {
    brg__fifo_mark_closed(f, BRG_ERR_INTERNAL,
                          "a proxy slot of kind %u for channel %u with %u bytes, on a link of "
                          "%zu-byte slots",
                          s->what, s->channel, s->bytes, f->slot_bytes);
    brg__fifo_wake_all(f);
    return -1;
  }
  /* Only this end's one posting thread moves the tail. */
  uint64_t n = __atomic_load_n(&f->ctrl->tail, __ATOMIC_RELAXED);
  if (n + 1 > __atomic_load_n(&f->ctrl->head, __ATOMIC_ACQUIRE) + (uint64_t)f->nslots) return 0;
  brg__slot_meta *m = brg__fifo_meta(f, n);
  memset(m, 0, offsetof(brg__slot_meta, inline_data));
  m->seq = s->seq;
  m->bytes = s->bytes;
  m->device = (uint8_t)(s->device != 0);
  m->proxy = (uint8_t)s->what;
  m->channel = (uint16_t)s->channel;
  if (!s->device && s->bytes) {
    if (s->bytes <= BRG__INLINE_BYTES)
      memcpy(m->inline_data, s->data, s->bytes);
    else if (copy)
      memcpy(brg__fifo_slot(f, n), s->data, s->bytes);
  }
  __atomic_store_n(&m->flag, n + 1, __ATOMIC_RELEASE);
  brg__publish(&f->ctrl->tail, &f->ctrl->tail_waiters, n + 1);
  *pos = n;
  return 1;
}

int brg__fifo_proxy_post(brg__conn *c, const brg__proxy_slot *s, const brg__waiter *w) {
  (void)w; /* a FIFO link never waits: it is full or it takes the slot */
  uint64_t pos;
  return brg__fifo_proxy_fill(c, s, 1, &pos);
}

uint64_t brg__fifo_proxy_sent(brg__conn *c) {
  return __atomic_load_n(&c->fifo.ctrl->head, __ATOMIC_ACQUIRE);
}

int brg__fifo_proxy_poll(brg__conn *c, uint64_t n, brg__proxy_slot *s) {
  brg__fifo *f = &c->fifo;
  const brg__slot_meta *m = brg__fifo_meta(f, n);
  if (__atomic_load_n(&m->flag, __ATOMIC_ACQUIRE) != n + 1)
    return __atomic_load_n(&f->ctrl->closed, __ATOMIC_ACQUIRE) ? -1 : 0;
  if ((m->proxy != BRG__PROXY_DATA && m->proxy != BRG__PROXY_CALL) || m->bytes > f->slot_bytes) {
    brg__fifo_mark_closed(f, BRG_ERR_REMOTE,
                          "rank %d sent a slot that is no proxy slot (kind %u, %u bytes, slots of "
                          "%zu bytes)",
                          c->peer, m->proxy, m->bytes, f->slot_bytes);
    brg__fifo_wake_all(f);
    return -1;
  }
  const char *data = m->bytes <= BRG__INLINE_BYTES ? m->inline_data : brg__fifo_slot(f, n);
  if (c->landed && c->landed[n % (uint64_t)f->nslots]) data = c->landed[n % (uint64_t)f->nslots];
  *s = (brg__proxy_slot){.what = m->proxy,
                         .channel = m->channel,
                         .seq = m->seq,
                         .bytes = m->bytes,
                         .device = m->device,
                         .data = m->device ? NULL : data};
  return 1;
}

void brg__fifo_proxy_release(brg__conn *c, uint64_t n) {
  brg__publish(&c->fifo.ctrl->head, &c->fifo.ctrl->head_waiters, n);
}

/* What a proxy thread starts with: its function, and the rank its lines are
 * logged under (the rank of the thread that started it). */
typedef struct proxy_start {
  void *(*fn)(void *);
  void *arg;
  int rank;
} proxy_start;

static void *proxy_main(void *p) {
  proxy_start s = *(proxy_start *)p;
  free(p);
  brg__log_set_thread_rank(s.rank);
  return s.fn(s.arg);
}

brg_status brg__proxy_start(pthread_t *thread, void *(*fn)(void *), void *arg, const char *name,
                            brg__errbuf *err) {
  proxy_start *s = malloc(sizeof *s);
  if (!s)
    return brg__error(err, BRG_ERR_NO_MEMORY, "init", "starting thread %s: out of memory", name);
  *s = (proxy_start){.fn = fn, .arg = arg, .rank = brg__log_thread_rank()};
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int rc = pthread_create(thread, NULL, proxy_main, s);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc != 0) free(s);
  if (rc != 0)
    return brg__error(err, BRG_ERR_SYSTEM, "init", "starting thread %s: %s", name, strerror(rc));
  pthread_setname_np(*thread, name);
  return BRG_SUCCESS;
}
