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
 * in ms) pairs, the rank's top bit set where it left the communicator. What a rank learned from one direction goes out only the
 * other way, so no report returns to its source and a rank that comes
 * back is forgotten within a beat or two.
 *
 * Other messages the thread reads (abort notices, goodbyes, a hang-up) wait
 * in a one-message slot per direction for the engine's waiter check, which
 * handles them exactly as if it had read them itself.
 *
 * Slow is not gone. A rank can miss its beats without being gone when its
 * cores are busy (64 ranks on 2 cores: a process waits seconds for a
 * turn), so:
 *  - silence is judged up to the last time this thread looked at its
 *    sockets, not up to now: a reader that was itself kept from running
 *    has not missed anything yet;
 *  - a rank of this host that looks silent has its process looked at
 *    (/proc/PID/stat, every beat while it looks silent): one that is
 *    running, runnable or asleep is alive, and its silence starts over;
 *    one stopped (state T), a zombie, gone, or a new process under its
 *    pid (another start time) is not, and its silence runs on;
 *  - ranks of other hosts cannot be looked at: the limit grows to twice
 *    the longest pause this rank has seen in a neighbour that then spoke
 *    again, or in its own thread's turns (brg__live_silent_limit_ms).
 */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>

#include "clock.h"
#include "internal.h"
#include "linkset.h"

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
  int threaded; /* the thread of a link set's owner runs (from start to free) */
  int running;  /* atomic: a thread reads the ring sockets */
  int stop;     /* atomic */
  pthread_mutex_t lock;
  int64_t heard_ns[2]; /* each neighbour's last message */
  /* Reported by each direction: rank -> when it went silent (local clock), 0: not. */
  int64_t *learned[2];
  live_slot slot[2];
  int kernels_stopped; /* kernel mode: this thread set the abort word */
  int64_t polled_ns;   /* this thread's last look at the sockets (lock held) */
  int64_t pause_ms;    /* the longest pause seen in a neighbour or this thread (atomic) */
  /* Ranks of this host: each process's start time as /proc had it at
   * start (0: not one of this host's, or not visible from here), and the
   * last time /proc showed it alive and not stopped (lock held). */
  unsigned long long *started;
  int64_t *alive_ns;
  int left[2]; /* the neighbour said goodbye or hung up: its process says nothing of it */
  unsigned char *learned_left[2]; /* reported by each direction: rank k left (the same) */
  /* A piece's (brg_comm.piece_of): the one of the communicator it is a
   * piece of, whose sockets and silences speak for it (in that one's
   * numbering: brg__rank_up); it has none of its own. */
  struct brg__live *via;
};

/* Whose sockets and silences speak for c: a piece's owner's. */
static brg__live *live_of(const brg_comm *c) {
  return c->live && c->live->via ? c->live->via : c->live;
}

/* Whether rank k left the communicator as far as this rank knows (lock held). */
static int left_of(const brg__live *l, int k) {
  const brg_comm *c = l->c;
  for (int dir = 0; dir < 2; dir++)
    if ((c->nranks > 1 && (dir == BRG__RING_NEXT ? c->ring.next : c->ring.prev) == k &&
         l->left[dir]) ||
        (l->learned_left[dir] && l->learned_left[dir][k]))
      return 1;
  return 0;
}

static void put_u32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get_u32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static int neighbour(const brg_comm *c, int dir) {
  return dir == BRG__RING_NEXT ? c->ring.next : c->ring.prev;
}

/* Whether the neighbour of `dir` has been unheard of for `ms` as far as
 * this thread has looked (lock held). */
static int unheard(const brg__live *l, int dir, int64_t now, int64_t ms) {
  int64_t seen = l->polled_ns && l->polled_ns < now ? l->polled_ns : now;
  return seen - l->heard_ns[dir] >= ms * 1000000;
}

/* When rank k went silent as heartbeats tell it (lock held), 0: it is not. */
static int64_t beat_silent_since(const brg__live *l, int k, int64_t now) {
  const brg_comm *c = l->c;
  int64_t since = 0;
  for (int dir = 0; dir < 2; dir++) {
    if (neighbour(c, dir) == k && unheard(l, dir, now, BRG__SILENT_MS)) since = l->heard_ns[dir];
    int64_t t = l->learned[dir][k];
    if (t && (!since || t < since)) since = t;
  }
  return since;
}

/* The same, where a process of this host seen alive since restarts it. */
static int64_t silent_since(const brg__live *l, int k, int64_t now) {
  int64_t since = beat_silent_since(l, k, now);
  if (since && l->alive_ns && l->alive_ns[k] > since && !left_of(l, k)) {
    since = l->alive_ns[k];
    if (now - since < (int64_t)BRG__SILENT_MS * 1000000) since = 0;
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
    if (neighbour(c, from) == k && unheard(l, from, now, BRG__SILENT_MS)) since = l->heard_ns[from];
    int left = l->learned_left[from][k] || (neighbour(c, from) == k && l->left[from]);
    /* a process of this host seen alive since is not reported */
    if (since && l->alive_ns && l->alive_ns[k] > since && !left) {
      since = l->alive_ns[k];
      if (now - since < (int64_t)BRG__SILENT_MS * 1000000) since = 0;
    }
    if (!since) continue;
    put_u32(buf + 4 + 8 * n, (uint32_t)k | (left ? 0x80000000u : 0));
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
  memset(l->learned_left[dir], 0, (size_t)c->nranks);
  if (len < 4) return;
  uint32_t n = get_u32(buf);
  if (n > (len - 4) / 8) n = (len - 4) / 8;
  for (uint32_t i = 0; i < n; i++) {
    uint32_t k = get_u32(buf + 4 + 8 * i), age = get_u32(buf + 8 + 8 * i);
    int left = (k & 0x80000000u) != 0;
    k &= 0x7fffffffu;
    if (k >= (uint32_t)c->nranks || (int)k == c->rank) continue;
    to[k] = now - (int64_t)age * 1000000;
    l->learned_left[dir][k] = (unsigned char)left;
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
  if (s == BRG_SUCCESS) {
    /* a neighbour that paused and spoke again: how long the pauses get here */
    int64_t pause = (now - l->heard_ns[dir]) / 1000000 - BRG__BEAT_MS;
    if (pause > __atomic_load_n(&l->pause_ms, __ATOMIC_RELAXED))
      __atomic_store_n(&l->pause_ms, pause, __ATOMIC_RELAXED);
    l->heard_ns[dir] = now;
  }
  if (s == BRG_SUCCESS && type == BRG__MSG_BEAT) {
    beat_decode(l, dir, (const uint8_t *)data, len, now);
  } else {
    if (s != BRG_SUCCESS || type == BRG__MSG_BYE || type == BRG__MSG_ABORT) l->left[dir] = 1;
    sl->s = s;
    sl->type = type;
    sl->len = len;
    memcpy(sl->data, data, len);
    memcpy(sl->text, err.msg, sizeof sl->text);
    sl->full = 1;
  }
  pthread_mutex_unlock(&l->lock);
}

void brg__live_silent_note(brg_comm *c, char *note, size_t note_bytes) {
  int64_t silent_ms = 0;
  int quiet = brg__live_silent(c, &silent_ms);
  note[0] = 0;
  if (quiet >= 0)
    snprintf(note, note_bytes,
             "; rank %d (pid %d on %s) has been silent for %lld ms (stopped, hung or cut off)",
             quiet, c->peers[quiet].pid, c->peers[quiet].hostname, (long long)silent_ms);
}

int brg__live_silent_limit_ms(const brg_comm *c) {
  if (c->silent_fail_ms <= 0 || c->silent_fail_ms >= c->timeout_ms) return c->timeout_ms;
  /* twice the longest pause seen, when that is longer: a rank that paused
   * that long once and came back may do so again */
  const brg__live *l = live_of(c);
  int64_t pause = l ? __atomic_load_n(&l->pause_ms, __ATOMIC_RELAXED) : 0;
  int64_t limit = c->silent_fail_ms;
  if (2 * pause > limit) limit = 2 * pause;
  return limit < c->timeout_ms ? (int)limit : c->timeout_ms;
}

/* /proc/PID/stat's state letter and start time (field 22); 0: unreadable. */
static char proc_state(int pid, unsigned long long *started) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  char *p = strrchr(buf, ')'); /* the command name may hold anything */
  if (!p || p[1] != ' ' || !p[2]) return 0;
  char state = p[2];
  p += 3;
  for (int field = 4; field <= 22 && p; field++) {
    p = strchr(p, ' ');
    if (p) p++;
  }
  *started = p ? strtoull(p, NULL, 10) : 0;
  return state;
}

/* Whether rank k of this host is alive: its process still the one that
 * started, not stopped, not a zombie. */
static int proc_alive(const brg__live *l, int k) {
  unsigned long long started = 0;
  char st = proc_state(l->c->peers[k].pid, &started);
  return st && st != 'T' && st != 't' && st != 'Z' && st != 'X' && st != 'x' &&
         started == l->started[k];
}

/* Every beat: the processes of this host's ranks that look silent, looked
 * at (the /proc reads outside the lock). */
static void look_at_processes(brg__live *l, int64_t now) {
  brg_comm *c = l->c;
  if (!l->started) return;
  for (int k = 0; k < c->nranks; k++) {
    if (!l->started[k]) continue;
    pthread_mutex_lock(&l->lock);
    int since = 0, left = left_of(l, k);
    for (int dir = 0; dir < 2; dir++) {
      if ((neighbour(c, dir) == k && unheard(l, dir, now, BRG__SILENT_MS / 2)) ||
          l->learned[dir][k])
        since = 1;
    }
    pthread_mutex_unlock(&l->lock);
    if (left) continue; /* it left this communicator, whatever its process does */
    if (!since || !proc_alive(l, k)) continue;
    pthread_mutex_lock(&l->lock);
    l->alive_ns[k] = now;
    pthread_mutex_unlock(&l->lock);
  }
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
  /* A piece hears through its owner's sockets, and tells the news on
   * them. */
  brg__live *src = l->via ? l->via : l;
  brg_comm *oc = src->c;
  int stop = 0;
  char why[BRG__ERRLEN / 2] = "";
  if (c->kwatch && c->kwatch(c, why, sizeof why)) {
    /* it stopped them: the neighbours' kernels may wait for this rank's */
    l->kernels_stopped = 1;
    brg__comm_notify_abort(oc, BRG_ERR_REMOTE, why);
    return;
  }
  pthread_mutex_lock(&src->lock);
  for (int dir = 0; dir < 2 && !stop; dir++) {
    live_slot *sl = &src->slot[dir];
    int peer = neighbour(oc, dir);
    if (sl->full && sl->s != BRG_SUCCESS) {
      stop = 1;
      snprintf(why, sizeof why, "rank %d (pid %d on %.64s) is gone: %.150s", peer,
               oc->peers[peer].pid, oc->peers[peer].hostname, sl->text);
    } else if (sl->full && sl->type == BRG__MSG_ABORT) {
      stop = 1;
      int len = (int)(sl->len > 4 ? sl->len - 4 : 0);
      snprintf(why, sizeof why, "%.*s", len < (int)sizeof why ? len : (int)sizeof why - 1,
               sl->data + 4);
    }
  }
  pthread_mutex_unlock(&src->lock);
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
  brg__comm_notify_abort(oc, BRG_ERR_REMOTE, why);
}

/* One pass's view of what the thread serves: the owner's state and each
 * of its pieces' (linkset.h), taken under the set's lock. */
typedef struct live_pass {
  brg__live **l;
  int n, cap;
  struct pollfd *pfd;
  int *who, *dir; /* per pollfd: the entry of l, and the direction (-1: the p2p door) */
  int npfd, pcap;
} live_pass;

static int pass_room(live_pass *p, int lives) {
  if (lives > p->cap) {
    brg__live **l = realloc(p->l, (size_t)lives * sizeof *l);
    if (!l) return 0;
    p->l = l;
    p->cap = lives;
  }
  if (3 * lives > p->pcap) {
    int cap = 3 * lives;
    struct pollfd *pfd = realloc(p->pfd, (size_t)cap * sizeof *pfd);
    if (pfd) p->pfd = pfd;
    int *who = pfd ? realloc(p->who, (size_t)cap * sizeof *who) : NULL;
    if (who) p->who = who;
    int *dir = who ? realloc(p->dir, (size_t)cap * sizeof *dir) : NULL;
    if (dir) p->dir = dir;
    if (!dir) return 0;
    p->pcap = cap;
  }
  return 1;
}

/* The owner's thread: beats and reads on its ring sockets, watches its
 * point-to-point listener until that one's thread runs (p2p.c starts it
 * at the first use or caller), and watches its own and its pieces'
 * kernels (a piece has no sockets or listener: kernels_watch hears for it
 * through the owner's). */
static void *live_main(void *arg) {
  brg__live *owner = arg;
  brg_comm *oc = owner->c;
  brg__linkset *set = oc->links;
  brg__log_set_thread_rank(oc->rank);
  live_pass p = {0};
  int64_t next_beat = 0;
  while (!__atomic_load_n(&owner->stop, __ATOMIC_ACQUIRE)) {
    int64_t now = brg__now_ns();
    pthread_mutex_lock(&set->lock);
    p.n = p.npfd = 0;
    if (!pass_room(&p, 1 + set->n)) {
      pthread_mutex_unlock(&set->lock);
      struct timespec ts = {0, BRG__BEAT_MS * 1000000L};
      nanosleep(&ts, NULL); /* out of memory: try again at the next beat */
      continue;
    }
    if (__atomic_load_n(&owner->running, __ATOMIC_ACQUIRE)) p.l[p.n++] = owner;
    for (int i = 0; i < set->n; i++)
      if (set->piece[i]->live && __atomic_load_n(&set->piece[i]->live->running, __ATOMIC_ACQUIRE))
        p.l[p.n++] = set->piece[i]->live;
    uint64_t gen = set->gen;
    int beat = now >= next_beat;
    /* this thread's own turn came late: its cores are that busy */
    int64_t late = beat && next_beat ? (now - next_beat) / 1000000 : 0;
    if (beat) next_beat = now + (int64_t)BRG__BEAT_MS * 1000000;
    for (int i = 0; i < p.n; i++) {
      brg__live *l = p.l[i];
      if (beat) {
        if (late > __atomic_load_n(&l->pause_ms, __ATOMIC_RELAXED))
          __atomic_store_n(&l->pause_ms, late, __ATOMIC_RELAXED);
        for (int dir = 0; dir < 2; dir++) beat_send(l, dir, now);
        look_at_processes(l, now);
      }
      /* A direction whose slot is full is not read until the waiter took it. */
      pthread_mutex_lock(&l->lock);
      for (int dir = 0; dir < 2; dir++) {
        int fd = brg__bootstrap_fd(l->c->bs, dir);
        if (fd >= 0 && !l->slot[dir].full) {
          p.pfd[p.npfd] = (struct pollfd){.fd = fd, .events = POLLIN};
          p.who[p.npfd] = i;
          p.dir[p.npfd++] = dir;
        }
      }
      pthread_mutex_unlock(&l->lock);
      int (*door_of)(brg_comm *) = __atomic_load_n(&l->c->p2p_door, __ATOMIC_ACQUIRE);
      int door = door_of ? door_of(l->c) : -1;
      if (door >= 0) {
        p.pfd[p.npfd] = (struct pollfd){.fd = door, .events = POLLIN};
        p.who[p.npfd] = i;
        p.dir[p.npfd++] = -1;
      }
    }
    pthread_mutex_unlock(&set->lock);
    int wait_ms = (int)((next_beat - now) / 1000000) + 1;
    int r = poll(p.pfd, (nfds_t)p.npfd, wait_ms < BRG__BEAT_MS ? wait_ms : BRG__BEAT_MS);
    pthread_mutex_lock(&set->lock);
    /* A piece that joined or left meanwhile: its descriptors are looked
     * at again in the next pass. */
    if (set->gen != gen) {
      pthread_mutex_unlock(&set->lock);
      continue;
    }
    for (int i = 0; r > 0 && i < p.npfd; i++) {
      if (!p.pfd[i].revents) continue;
      brg__live *l = p.l[p.who[i]];
      if (p.dir[i] >= 0)
        live_read(l, p.dir[i]);
      else {
        brg__errbuf quiet = {0}; /* a failure is the next send's or receive's to report */
        brg_status (*need)(brg_comm *, brg__errbuf *) =
            __atomic_load_n(&l->c->p2p_need, __ATOMIC_ACQUIRE);
        if (need) need(l->c, &quiet); /* someone dials it: its thread takes the call */
      }
    }
    /* what was there when it looked has been read: silence counts up to here */
    int64_t looked = brg__now_ns();
    for (int i = 0; i < p.n; i++) {
      pthread_mutex_lock(&p.l[i]->lock);
      p.l[i]->polled_ns = looked;
      pthread_mutex_unlock(&p.l[i]->lock);
      kernels_watch(p.l[i]);
    }
    pthread_mutex_unlock(&set->lock);
  }
  free(p.l);
  free(p.pfd);
  free(p.who);
  free(p.dir);
  return NULL;
}

/* A piece's: no sockets to read, the owner's thread watches its kernels
 * (kernels_watch) with what the owner's sockets and silences say. */
static brg_status live_start_piece(brg_comm *c, brg__errbuf *err) {
  brg__live *l = calloc(1, sizeof *l);
  if (!l) return brg__error(err, BRG_ERR_NO_MEMORY, "init", "liveness: out of memory");
  l->c = c;
  l->via = c->piece_of->live;
  pthread_mutex_init(&l->lock, NULL);
  c->live = l;
  __atomic_store_n(&l->running, l->via && __atomic_load_n(&l->via->threaded, __ATOMIC_ACQUIRE),
                   __ATOMIC_RELEASE);
  brg_status s = brg__linkset_join(c->link_owner, c, err);
  if (s != BRG_SUCCESS) __atomic_store_n(&l->running, 0, __ATOMIC_RELEASE);
  return s;
}

brg_status brg__live_start(brg_comm *c, brg__errbuf *err) {
  if (c->nranks > 1 && c->piece_of) return live_start_piece(c, err);
  if (c->nranks < 2 || !c->bs) return BRG_SUCCESS;
  brg__live *l = calloc(1, sizeof *l);
  if (l) {
    l->learned[0] = calloc((size_t)c->nranks, sizeof(int64_t));
    l->learned[1] = calloc((size_t)c->nranks, sizeof(int64_t));
    l->learned_left[0] = calloc((size_t)c->nranks, 1);
    l->learned_left[1] = calloc((size_t)c->nranks, 1);
  }
  if (!l || !l->learned[0] || !l->learned[1] || !l->learned_left[0] || !l->learned_left[1]) {
    if (l) {
      free(l->learned[0]);
      free(l->learned[1]);
      free(l->learned_left[0]);
      free(l->learned_left[1]);
    }
    free(l);
    return brg__error(err, BRG_ERR_NO_MEMORY, "init", "liveness: out of memory");
  }
  l->c = c;
  pthread_mutex_init(&l->lock, NULL);
  /* This host's other ranks, as /proc shows them now (they have just
   * joined, so each pid is still its rank's process). */
  l->started = calloc((size_t)c->nranks, sizeof *l->started);
  l->alive_ns = calloc((size_t)c->nranks, sizeof *l->alive_ns);
  int local = 0;
  for (int k = 0; l->started && l->alive_ns && k < c->nranks; k++) {
    if (k == c->rank || c->peers[k].host_hash != c->peers[c->rank].host_hash) continue;
    char st = proc_state(c->peers[k].pid, &l->started[k]);
    if (!st || st == 'Z') l->started[k] = 0;
    local += l->started[k] != 0;
  }
  if (!local) { /* nothing to look at: heartbeats alone */
    free(l->started);
    free(l->alive_ns);
    l->started = NULL;
    l->alive_ns = NULL;
  }
  l->heard_ns[0] = l->heard_ns[1] = brg__now_ns();
  c->live = l;
  brg_status s = brg__linkset_init(c, err);
  if (s != BRG_SUCCESS) return s;
  __atomic_store_n(&l->running, 1, __ATOMIC_RELEASE);
  s = brg__proxy_start(&l->thread, live_main, l, "brg-live", err);
  if (s == BRG_SUCCESS)
    __atomic_store_n(&l->threaded, 1, __ATOMIC_RELEASE);
  else
    __atomic_store_n(&l->running, 0, __ATOMIC_RELEASE);
  return s;
}

/* Nobody reads l's sockets from now on: the waits read them themselves. */
static void live_unserved(brg__live *l) {
  pthread_mutex_lock(&l->lock);
  __atomic_store_n(&l->running, 0, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&l->lock);
}

/* The thread stops serving c: the owner's own sockets, or a piece that
 * leaves its set. The owner's thread goes on for the pieces, each served
 * until it is destroyed itself, and ends with the owner (brg__live_free). */
void brg__live_stop(brg_comm *c) {
  brg__live *l = c->live;
  if (!l) return;
  if (c->link_owner) {
    brg__linkset_leave(c->link_owner, c); /* the thread no longer touches it */
    live_unserved(l);
    return;
  }
  if (!c->links) return;
  /* Between passes (the thread holds the lock for one), and the pass that
   * polls now looks again (gen). */
  pthread_mutex_lock(&c->links->lock);
  c->links->gen++;
  live_unserved(l);
  pthread_mutex_unlock(&c->links->lock);
}

void brg__live_free(brg_comm *c) {
  brg__live *l = c->live;
  if (!l) return;
  brg__live_stop(c);
  if (l->threaded) {
    __atomic_store_n(&l->stop, 1, __ATOMIC_RELEASE);
    pthread_join(l->thread, NULL);
    __atomic_store_n(&l->threaded, 0, __ATOMIC_RELEASE);
  }
  pthread_mutex_destroy(&l->lock);
  free(l->learned[0]);
  free(l->learned[1]);
  free(l->learned_left[0]);
  free(l->learned_left[1]);
  free(l->started);
  free(l->alive_ns);
  free(l);
  c->live = NULL;
  brg__linkset_free(c);
}

/* brg__live_take (take 1) and brg__live_peek (take 0) on l. */
static int slot_read(brg__live *l, int dir, int take, brg_status *s, uint32_t *type, char *data,
                     uint32_t *len, char *text, size_t text_bytes) {
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
    sl->full = !take;
    r = 1;
  } else if (__atomic_load_n(&l->running, __ATOMIC_ACQUIRE)) {
    r = 0;
  }
  pthread_mutex_unlock(&l->lock);
  return r;
}

int brg__live_take(brg_comm *c, int dir, brg_status *s, uint32_t *type, char *data, uint32_t *len,
                   char *text, size_t text_bytes) {
  return slot_read(c->live, dir, 1, s, type, data, len, text, text_bytes);
}

int brg__live_peek(brg_comm *c, int dir, int *peer, brg_status *s, uint32_t *type, char *data,
                   uint32_t *len, char *text, size_t text_bytes) {
  brg__live *l = live_of(c);
  if (l) *peer = neighbour(l->c, dir);
  return slot_read(l, dir, 0, s, type, data, len, text, text_bytes);
}

int64_t brg__live_silent_rank(brg_comm *c, int rank) {
  brg__live *l = live_of(c);
  if (!l || rank == c->rank || rank < 0 || rank >= c->nranks) return -1;
  int64_t now = brg__now_ns(), since = 0;
  pthread_mutex_lock(&l->lock);
  if (__atomic_load_n(&l->running, __ATOMIC_ACQUIRE))
    since = silent_since(l, brg__rank_up(c, rank), now);
  pthread_mutex_unlock(&l->lock);
  return since ? (now - since) / 1000000 : -1;
}

int brg__live_silent(brg_comm *c, int64_t *silent_ms) {
  brg__live *l = live_of(c);
  if (!l) return -1;
  int64_t now = brg__now_ns(), best = 0;
  int who = -1;
  pthread_mutex_lock(&l->lock);
  if (__atomic_load_n(&l->running, __ATOMIC_ACQUIRE)) {
    for (int k = 0; k < c->nranks; k++) {
      if (k == c->rank) continue;
      int64_t since = silent_since(l, brg__rank_up(c, k), now);
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

/* Whether rank k, in the numbering of l's sockets, is one of c's `ranks`
 * (all of them when ranks is NULL). */
static int among(const brg_comm *c, int k, const int *ranks, int n) {
  if (!ranks) return 1;
  for (int i = 0; i < n; i++)
    if (brg__rank_up(c, ranks[i]) == k) return 1;
  return 0;
}

int brg__live_gone(brg_comm *c, const int *ranks, int n, const char *whose, char *why,
                   size_t why_bytes) {
  brg__live *l = live_of(c);
  if (!l) return -1;
  const brg_comm *oc = l->c; /* whose numbering the sockets speak in: a piece's owner's */
  int who = -1;
  int64_t now = brg__now_ns(), since = 0;
  pthread_mutex_lock(&l->lock);
  for (int dir = 0; dir < 2 && who == -1; dir++) {
    const live_slot *sl = &l->slot[dir];
    int peer = neighbour(oc, dir);
    if (sl->full && sl->s != BRG_SUCCESS && among(c, peer, ranks, n)) {
      who = peer;
      snprintf(why, why_bytes, "rank %d of %s (pid %d on %.64s) is gone: %.200s", peer, whose,
               oc->peers[peer].pid, oc->peers[peer].hostname, sl->text);
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
    int64_t t = silent_since(l, brg__rank_up(c, k), now);
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
