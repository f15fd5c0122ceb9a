/*
 * Liveness: which rank has gone silent. Once a communicator is ready, a
 * thread of each rank sends a heartbeat on both ring sockets every
 * BRG__BEAT_MS and is the one reader of those sockets. A neighbour whose
 * socket has carried nothing for BRG__SILENT_MS is silent; each heartbeat
 * also carries what its sender knows of silent ranks further along the
 * ring, so every rank learns of a stopped rank whatever its distance, over
 * the same sockets within a host and across hosts. A rank that is slow but
 * running keeps beating (the thread needs no help from the application);
 * a stopped, hung or cut-off one does not. A timeout's message names the
 * rank silent the longest and for how long.
 *
 * What a heartbeat carries (little endian u32s): a count, then (rank, age
 * in ms) pairs. What a rank learned from one direction goes out only the
 * other way, so no report returns to its source and a rank that comes
 * back is forgotten within a beat or two.
 *
 * Other messages the thread reads (abort notices, goodbyes, a hang-up) wait
 * in a one-message slot per direction for the engine's waiter check, which
 * handles them exactly as if it had read them itself.
 */
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include "clock.h"
#include "internal.h"

#define BEAT_MAX_PAIRS ((BRG__BOOT_MAX_MSG - 4) / 8)
#define BEAT_BACKLOG_BYTES 65536 /* a neighbour that leaves this much unread gets no beats */

/* What arrived on one direction and waits for the waiter check. */
typedef struct live_slot {
  int full;
  brg_status s; /* BRG_SUCCESS: a message (type, data, len); else the socket failed (text) */
  uint32_t type, len;
  char data[BRG__BOOT_MAX_MSG + 1];
  char text[BRG__ERRLEN];
} live_slot;

typedef struct brg__live brg__live;
struct brg__live {
  brg_comm *c;
  pthread_t thread;
  int running; /* atomic: the thread reads the ring sockets */
  int stop;    /* atomic */
  pthread_mutex_t lock;
  int64_t heard_ns[2]; /* each neighbour's last message */
  /* Reported by each direction: rank -> when it went silent (local clock), 0: not. */
  int64_t *learned[2];
  live_slot slot[2];
  int kernels_stopped; /* kernel mode: this thread set the abort word */
};

static void put_u32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get_u32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static int neighbour(const brg_comm *c, int dir) {
  return dir == BRG__RING_NEXT ? c->next : c->prev;
}

/* When rank k went silent as this rank sees it (lock held), 0: it is not. */
static int64_t silent_since(const brg__live *l, int k, int64_t now) {
  const brg_comm *c = l->c;
  int64_t since = 0;
  for (int dir = 0; dir < 2; dir++) {
    if (neighbour(c, dir) == k && now - l->heard_ns[dir] >= (int64_t)BRG__SILENT_MS * 1000000)
      since = l->heard_ns[dir];
    int64_t t = l->learned[dir][k];
    if (t && (!since || t < since)) since = t;
  }
  return since;
}

/* The heartbeat towards `dir`: the silent ranks this rank sees directly and
 * what the other direction told it (lock held). */
static uint32_t beat_encode(brg__live *l, int dir, uint8_t *buf, int64_t now) {
  brg_comm *c = l->c;
  int from = 1 - dir;
  uint32_t n = 0;
  for (int k = 0; k < c->nranks && n < BEAT_MAX_PAIRS; k++) {
    if (k == c->rank || k == neighbour(c, dir)) continue;
    int64_t since = l->learned[from][k];
    if (neighbour(c, from) == k && now - l->heard_ns[from] >= (int64_t)BRG__SILENT_MS * 1000000)
      since = l->heard_ns[from];
    if (!since) continue;
    put_u32(buf + 4 + 8 * n, (uint32_t)k);
    put_u32(buf + 8 + 8 * n, (uint32_t)((now - since) / 1000000));
    n++;
  }
  put_u32(buf, n);
  return 4 + 8 * n;
}

static void beat_decode(brg__live *l, int dir, const uint8_t *buf, uint32_t len, int64_t now) {
  brg_comm *c = l->c;
  int64_t *to = l->learned[dir];
  memset(to, 0, (size_t)c->nranks * sizeof *to);
  if (len < 4) return;
  uint32_t n = get_u32(buf);
  if (n > (len - 4) / 8) n = (len - 4) / 8;
  for (uint32_t i = 0; i < n; i++) {
    uint32_t k = get_u32(buf + 4 + 8 * i), age = get_u32(buf + 8 + 8 * i);
    if (k >= (uint32_t)c->nranks || (int)k == c->rank) continue;
    to[k] = now - (int64_t)age * 1000000;
  }
}

/* Sends a heartbeat unless the neighbour has left too much unread (it is
 * then not reading, and a blocked send would hold the ring lock). */
static void beat_send(brg__live *l, int dir, int64_t now) {
  brg_comm *c = l->c;
  int fd = brg__bootstrap_fd(c->bs, dir);
  int queued = 0;
  if (fd < 0 || (ioctl(fd, TIOCOUTQ, &queued) == 0 && queued > BEAT_BACKLOG_BYTES)) return;
  uint8_t buf[BRG__BOOT_MAX_MSG];
  pthread_mutex_lock(&l->lock);
  uint32_t len = beat_encode(l, dir, buf, now);
  pthread_mutex_unlock(&l->lock);
  pthread_mutex_lock(&c->ring_lock);
  brg__bootstrap_send(c->bs, dir, BRG__MSG_BEAT, buf, len, NULL);
  pthread_mutex_unlock(&c->ring_lock);
}

/* Reads one message from `dir`: heartbeats are taken in, anything else is
 * left in the slot for the waiter check. */
static void live_read(brg__live *l, int dir) {
  brg_comm *c = l->c;
  live_slot *sl = &l->slot[dir];
  uint32_t type = 0, len = 0;
  char data[BRG__BOOT_MAX_MSG + 1];
  brg__errbuf err = {0};
  brg_status s = brg__bootstrap_recv(c->bs, dir, &type, data, BRG__BOOT_MAX_MSG, &len, 0, &err);
  if (s == BRG_ERR_TIMEOUT) return;
  int64_t now = brg__now_ns();
  pthread_mutex_lock(&l->lock);
  if (s == BRG_SUCCESS) l->heard_ns[dir] = now;
  if (s == BRG_SUCCESS && type == BRG__MSG_BEAT) {
    beat_decode(l, dir, (const uint8_t *)data, len, now);
  } else {
    sl->s = s;
    sl->type = type;
    sl->len = len;
    memcpy(sl->data, data, len);
    memcpy(sl->text, err.msg, sizeof sl->text);
    sl->full = 1;
  }
  pthread_mutex_unlock(&l->lock);
}

int brg__live_silent_limit_ms(const brg_comm *c) {
  /* As the engine's waits (ring_link.c's check) */
  return c->silent_fail_ms > 0 && c->silent_fail_ms < c->timeout_ms ? c->silent_fail_ms
                                                                    : c->timeout_ms;
}

/* Kernel mode: no host thread waits during a device collective, so this
 * one stops the kernels (their abort word) once a neighbour is gone, sent
 * an abort, or a rank has been silent for the timeout; and tells the
 * neighbours, so that the news goes round the ring to kernels whose own
 * neighbours are alive. The next call says what happened. */
static void kernels_watch(brg__live *l) {
  brg_comm *c = l->c;
  int *word = __atomic_load_n(&c->kabort, __ATOMIC_ACQUIRE);
  if (!word || l->kernels_stopped) return;
  int stop = 0;
  char why[BRG__ERRLEN / 2] = "";
  if (c->kwatch && c->kwatch(c, why, sizeof why)) {
    /* it stopped them: the neighbours' kernels may wait for this rank's */
    l->kernels_stopped = 1;
    brg__comm_notify_abort(c, BRG_ERR_REMOTE, why);
    return;
  }
  pthread_mutex_lock(&l->lock);
  for (int dir = 0; dir < 2 && !stop; dir++) {
    live_slot *sl = &l->slot[dir];
    int peer = dir == BRG__RING_NEXT ? c->next : c->prev;
    if (sl->full && sl->s != BRG_SUCCESS) {
      stop = 1;
      snprintf(why, sizeof why, "rank %d (pid %d on %.64s) is gone: %.150s", peer,
               c->peers[peer].pid, c->peers[peer].hostname, sl->text);
    } else if (sl->full && sl->type == BRG__MSG_ABORT) {
      stop = 1;
      int len = (int)(sl->len > 4 ? sl->len - 4 : 0);
      snprintf(why, sizeof why, "%.*s", len < (int)sizeof why ? len : (int)sizeof why - 1,
               sl->data + 4);
    }
  }
  pthread_mutex_unlock(&l->lock);
  int64_t silent_ms = 0;
  int quiet = stop ? -1 : brg__live_silent(c, &silent_ms);
  if (quiet >= 0 && silent_ms >= brg__live_silent_limit_ms(c)) {
    stop = 1;
    snprintf(why, sizeof why, "rank %d (pid %d on %s) has been silent for %lld ms", quiet,
             c->peers[quiet].pid, c->peers[quiet].hostname, (long long)silent_ms);
  }
  if (!stop) return;
  l->kernels_stopped = 1;
  __atomic_store_n(word, 1, __ATOMIC_RELEASE);
  brg__comm_notify_abort(c, BRG_ERR_REMOTE, why);
}

static void *live_main(void *arg) {
  brg__live *l = arg;
  brg_comm *c = l->c;
  brg__log_set_thread_rank(c->rank);
  int64_t next_beat = 0;
  while (!__atomic_load_n(&l->stop, __ATOMIC_ACQUIRE)) {
    int64_t now = brg__now_ns();
    if (now >= next_beat) {
      for (int dir = 0; dir < 2; dir++) beat_send(l, dir, now);
      next_beat = now + (int64_t)BRG__BEAT_MS * 1000000;
    }
    /* A direction whose slot is full is not read until the waiter took it. */
    struct pollfd pfd[2];
    int dirs[2], n = 0;
    pthread_mutex_lock(&l->lock);
    for (int dir = 0; dir < 2; dir++) {
      int fd = brg__bootstrap_fd(c->bs, dir);
      if (fd >= 0 && !l->slot[dir].full) {
        pfd[n] = (struct pollfd){.fd = fd, .events = POLLIN};
        dirs[n++] = dir;
      }
    }
    pthread_mutex_unlock(&l->lock);
    int wait_ms = (int)((next_beat - now) / 1000000) + 1;
    if (poll(pfd, (nfds_t)n, wait_ms < BRG__BEAT_MS ? wait_ms : BRG__BEAT_MS) > 0)
      for (int i = 0; i < n; i++)
        if (pfd[i].revents) live_read(l, dirs[i]);
    kernels_watch(l);
  }
  return NULL;
}

brg_status brg__live_start(brg_comm *c, brg__errbuf *err) {
  if (c->nranks < 2 || !c->bs) return BRG_SUCCESS;
  brg__live *l = calloc(1, sizeof *l);
  if (l) {
    l->learned[0] = calloc((size_t)c->nranks, sizeof(int64_t));
    l->learned[1] = calloc((size_t)c->nranks, sizeof(int64_t));
  }
  if (!l || !l->learned[0] || !l->learned[1]) {
    if (l) {
      free(l->learned[0]);
      free(l->learned[1]);
    }
    free(l);
    return brg__error(err, BRG_ERR_NO_MEMORY, "init", "liveness: out of memory");
  }
  l->c = c;
  pthread_mutex_init(&l->lock, NULL);
  l->heard_ns[0] = l->heard_ns[1] = brg__now_ns();
  c->live = l;
  __atomic_store_n(&l->running, 1, __ATOMIC_RELEASE);
  brg_status s = brg__proxy_start(&l->thread, live_main, l, "brg-live", err);
  if (s != BRG_SUCCESS) __atomic_store_n(&l->running, 0, __ATOMIC_RELEASE);
  return s;
}

void brg__live_stop(brg_comm *c) {
  brg__live *l = c->live;
  if (!l || !__atomic_load_n(&l->running, __ATOMIC_ACQUIRE)) return;
  __atomic_store_n(&l->stop, 1, __ATOMIC_RELEASE);
  pthread_join(l->thread, NULL);
  pthread_mutex_lock(&l->lock);
  __atomic_store_n(&l->running, 0, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&l->lock);
}

void brg__live_free(brg_comm *c) {
  brg__live *l = c->live;
  if (!l) return;
  brg__live_stop(c);
  pthread_mutex_destroy(&l->lock);
  free(l->learned[0]);
  free(l->learned[1]);
  free(l);
  c->live = NULL;
}

int brg__live_take(brg_comm *c, int dir, brg_status *s, uint32_t *type, char *data, uint32_t *len,
                   char *text, size_t text_bytes) {
  brg__live *l = c->live;
  if (!l) return -1;
  pthread_mutex_lock(&l->lock);
  int r = -1;
  live_slot *sl = &l->slot[dir];
  if (sl->full) {
    *s = sl->s;
    *type = sl->type;
    *len = sl->len;
    memcpy(data, sl->data, sl->len);
    snprintf(text, text_bytes, "%s", sl->text);
    sl->full = 0;
    r = 1;
  } else if (__atomic_load_n(&l->running, __ATOMIC_ACQUIRE)) {
    r = 0;
  }
  pthread_mutex_unlock(&l->lock);
  return r;
}

int64_t brg__live_silent_rank(brg_comm *c, int rank) {
  brg__live *l = c->live;
  if (!l || rank == c->rank) return -1;
  int64_t now = brg__now_ns(), since = 0;
  pthread_mutex_lock(&l->lock);
  if (__atomic_load_n(&l->running, __ATOMIC_ACQUIRE)) since = silent_since(l, rank, now);
  pthread_mutex_unlock(&l->lock);
  return since ? (now - since) / 1000000 : -1;
}

int brg__live_silent(brg_comm *c, int64_t *silent_ms) {
  brg__live *l = c->live;
  if (!l) return -1;
  int64_t now = brg__now_ns(), best = 0;
  int who = -1;
  pthread_mutex_lock(&l->lock);
  if (__atomic_load_n(&l->running, __ATOMIC_ACQUIRE)) {
    for (int k = 0; k < c->nranks; k++) {
      if (k == c->rank) continue;
      int64_t since = silent_since(l, k, now);
      if (since && now - since > best) {
        best = now - since;
        who = k;
      }
    }
  }
  pthread_mutex_unlock(&l->lock);
  if (who >= 0) *silent_ms = best / 1000000;
  return who;
}

/* Whether rank k is one of `ranks` (all of them when ranks is NULL). */
static int among(int k, const int *ranks, int n) {
  if (!ranks) return 1;
  for (int i = 0; i < n; i++)
    if (ranks[i] == k) return 1;
  return 0;
}

int brg__live_gone(brg_comm *c, const int *ranks, int n, const char *whose, char *why,
                   size_t why_bytes) {
  brg__live *l = c->live;
  if (!l) return -1;
  int who = -1;
  int64_t now = brg__now_ns(), since = 0;
  pthread_mutex_lock(&l->lock);
  for (int dir = 0; dir < 2 && who == -1; dir++) {
    const live_slot *sl = &l->slot[dir];
    int peer = neighbour(c, dir);
    if (sl->full && sl->s != BRG_SUCCESS && among(peer, ranks, n)) {
      who = peer;
      snprintf(why, why_bytes, "rank %d of %s (pid %d on %.64s) is gone: %.200s", peer, whose,
               c->peers[peer].pid, c->peers[peer].hostname, sl->text);
    } else if (sl->full && sl->type == BRG__MSG_ABORT) {
      who = peer;
      int len = (int)(sl->len > 4 ? sl->len - 4 : 0);
      snprintf(why, why_bytes, "%s was aborted, as rank %d of it says: %.*s", whose, peer,
               len < 300 ? len : 300, sl->data + 4);
    }
  }
  /* Silent: the longest of those that count (a rank that said goodbye,
   * its slot full, goes silent too, but it is not one of them). */
  for (int i = 0; who == -1 && i < (ranks ? n : c->nranks); i++) {
    int k = ranks ? ranks[i] : i;
    if (k < 0 || k >= c->nranks || k == c->rank) continue;
    int64_t t = silent_since(l, k, now);
    if (t && (!since || t < since)) since = t, who = -2 - k;
  }
  pthread_mutex_unlock(&l->lock);
  if (who >= 0) return who;
  if (who == -1 || (now - since) / 1000000 < brg__live_silent_limit_ms(c)) return -1;
  who = -2 - who;
  snprintf(why, why_bytes, "rank %d of %s (pid %d on %.64s) has been silent for %lld ms", who,
           whose, c->peers[who].pid, c->peers[who].hostname, (long long)((now - since) / 1000000));
  return who;
}
