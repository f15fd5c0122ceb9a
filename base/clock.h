/*
 * Monotonic time and deadlines, for every layer.
 *
 * A deadline is an absolute brg__now_ms() value; -1 never comes. Setup code
 * turns a timeout of 0 or less into "no limit" with brg__deadline_ms().
 */
#ifndef BRG_CLOCK_H
#define BRG_CLOCK_H

#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <time.h>

static inline int64_t brg__now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline int64_t brg__now_ms(void) {
  return brg__now_ns() / 1000000;
}

/* The deadline timeout_ms from now, or -1 (never) for timeout_ms <= 0. */
static inline int64_t brg__deadline_ms(int timeout_ms) {
  return timeout_ms > 0 ? brg__now_ms() + timeout_ms : -1;
}

/* Milliseconds until the deadline, as poll() takes them: -1 for never, 0
 * once it has passed. */
static inline int brg__ms_left(int64_t deadline) {
  if (deadline < 0) return -1;
  int64_t left = deadline - brg__now_ms();
  if (left <= 0) return 0;
  return left > INT_MAX ? INT_MAX : (int)left;
}

/* brg__ms_left(), but at most `most`: for a wait that wakes now and then to
 * look around (an abort, a second connection). */
static inline int brg__ms_left_capped(int64_t deadline, int most) {
  int left = brg__ms_left(deadline);
  return left < 0 || left > most ? most : left;
}

/* CLOCK_REALTIME ms from now, as pthread_cond_timedwait and
 * pthread_timedjoin_np take it. */
static inline struct timespec brg__realtime_in_ms(int ms) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_sec += ms / 1000;
  ts.tv_nsec += (long)(ms % 1000) * 1000000L;
  ts.tv_sec += ts.tv_nsec / 1000000000L;
  ts.tv_nsec %= 1000000000L;
  return ts;
}

/* The earlier of two deadlines. */
static inline int64_t brg__deadline_min(int64_t a, int64_t b) {
  if (a < 0) return b;
  if (b < 0) return a;
  return a < b ? a : b;
}

static inline int brg__deadline_passed(int64_t deadline) {
  return deadline >= 0 && brg__now_ms() >= deadline;
}

/* Sleeps ms milliseconds, resuming after signals. */
static inline void brg__sleep_ms(int ms) {
  struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {}
}

/* One pause of a spinning wait: tells the core the loop spins (the
 * sibling hyperthread and the power state profit), a no-op elsewhere. */
static inline void brg__cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

#endif
