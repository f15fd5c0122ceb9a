/*
 * The communicator: creation (bootstrap, ring order, transport per link),
 * destruction, the public collective entry points with their argument
 * checks, and the progress engine that runs collectives in issue order.
 */
#include <errno.h>
#include <netdb.h>
#include <arpa/inet.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "settings.h"
#include "device.h"
#include "internal.h"
#include "kernels.h"

void brg__ring_waiter_init(brg_comm *c);

/* ---- errors ---- */

static brg_status fail_no_comm(brg_status s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static brg_status fail_no_comm(brg_status s, const char *fmt, ...) {
  char msg[BRG__ERRLEN];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  brg__log_init();
  BRG__WARN("init", "%s", msg);
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
  if (comm->magic != BRG__COMM_MAGIC) return "not a valid communicator";
  return comm->last_error;
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

/* ---- identity of this host ---- */

static uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

/* Ranks with equal hashes share memory: same kernel boot, same host name,
 * same network namespace (namespaces stand for hosts in the multi-host tests). */
static uint64_t host_hash(char *hostname, size_t n) {
  uint64_t h = 14695981039346656037ull;
  gethostname(hostname, n - 1);
  hostname[n - 1] = 0;
  h = fnv1a(h, hostname, strlen(hostname));
  char boot[64] = "";
  FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
  if (f) {
    if (!fgets(boot, sizeof boot, f)) boot[0] = 0;
    fclose(f);
  }
  h = fnv1a(h, boot, strlen(boot));
  struct stat st;
  if (stat("/proc/self/ns/net", &st) == 0) h = fnv1a(h, &st.st_ino, sizeof st.st_ino);
  return h;
}

/* ---- unique id ---- */

brg_status brg_get_unique_id(brg_unique_id *id) {
  if (!id) return fail_no_comm(BRG_ERR_INVALID_ARGUMENT, "brg_get_unique_id: id is NULL");
  brg__errbuf err;
  brg_status s = brg__settings_load(&err);
  if (s != BRG_SUCCESS) return fail_no_comm(s, "%s", err.msg);
  brg__log_init();
  char addr[64];
  if ((s = brg__boot_local_addr(addr, sizeof addr, &err)) != BRG_SUCCESS)
    return fail_no_comm(s, "%s", err.msg);
  brg__boot_id bid;
  s = brg__boot_root_start(addr, 0, NULL, (int)brg__core_int(BRG__CORE_TIMEOUT_MS), &bid, &err);
  if (s != BRG_SUCCESS) return fail_no_comm(s, "%s", err.msg);
  memset(id, 0, sizeof *id);
  memcpy(id->internal, &bid, sizeof bid);
  return BRG_SUCCESS;
}

/* ---- creation ---- */

static int cmp_host_then_rank(const void *a, const void *b, void *arg) {
  const brg__peer_info *p = arg;
  int x = *(const int *)a, y = *(const int *)b;
  /* Hosts in the order of their lowest rank, ranks in order within a host. */
  int fx = x, fy = y;
  for (int i = 0; i < x; i++)
    if (p[i].host_hash == p[x].host_hash) { fx = i; break; }
  for (int i = 0; i < y; i++)
    if (p[i].host_hash == p[y].host_hash) { fy = i; break; }
  if (fx != fy) return fx - fy;
  return x - y;
}

static void log_ring(brg_comm *c) {
  if (!brg__log_enabled(BRG__LOG_INFO, "init")) return;
  char line[1024];
  size_t o = 0;
  for (int i = 0; i < c->nranks && o + 32 < sizeof line; i++) {
    int r = c->ring[i];
    int boundary = i > 0 && c->peers[r].host_hash != c->peers[c->ring[i - 1]].host_hash;
    o += (size_t)snprintf(line + o, sizeof line - o, "%s%d", boundary ? " | " : (i ? " " : ""), r);
  }
  BRG__INFO("init", "ring order (| separates hosts): %s", line);
}

static brg_status exchange(brg_comm *c, int send_dir, const void *msg, uint32_t len, int recv_dir,
                           uint32_t want, void *out, uint32_t max, uint32_t *got,
                           brg__errbuf *err) {
  brg_status s = brg__bootstrap_send(c->bs, send_dir, want, msg, len, err);
  if (s != BRG_SUCCESS) return s;
  uint32_t type = 0;
  char buf[BRG__BOOT_MAX_MSG + 1];
  s = brg__bootstrap_recv(c->bs, recv_dir, &type, buf, BRG__BOOT_MAX_MSG, got, c->timeout_ms, err);
  if (s != BRG_SUCCESS) return s;
  if (type == want && *got <= max) {
    memcpy(out, buf, *got);
    return BRG_SUCCESS;
  }
  if (type == BRG__MSG_ABORT && *got > 4) {
    buf[*got] = 0;
    return brg__error(err, BRG_ERR_REMOTE, "init", "%s", buf + 4);
  }
  return brg__error(err, BRG_ERR_REMOTE, "init",
                    "expected message %u from rank %d, got type %u of %u bytes", want,
                    recv_dir == BRG__RING_NEXT ? c->next : c->prev, type, *got);
}

/* Sets up the two links of this rank: from prev (receive) and to next (send). */
static brg_status connect_ring(brg_comm *c, const uint8_t *secret, brg__errbuf *err) {
  const char *allow = brg__core_str(BRG__CORE_TRANSPORTS);
  const brg__transport_ops *tsend = brg__transport_pick(&c->peers[c->rank], &c->peers[c->next], allow);
  const brg__transport_ops *trecv = brg__transport_pick(&c->peers[c->prev], &c->peers[c->rank], allow);
  if (!tsend || !trecv)
    return brg__error(err, BRG_ERR_UNAVAILABLE, "init",
                      "no transport can link rank %d and rank %d (BRIGADE_TRANSPORTS=\"%s\")",
                      c->rank, tsend ? c->prev : c->next, allow);
  brg__conn_params ps = {.rank = c->rank, .peer = c->next, .nranks = c->nranks,
                         .self_info = &c->peers[c->rank], .peer_info = &c->peers[c->next],
                         .nslots = c->nslots, .slot_bytes = c->slot_bytes, .comm_id = c->comm_id,
                         .secret = secret, .timeout_ms = c->timeout_ms, .waiter = &c->waiter};
  brg__conn_params pr = ps;
  pr.peer = c->prev;
  pr.peer_info = &c->peers[c->prev];

  /* Receiver side first: its info travels to prev, whose sender connects. */
  char info[BRG__CONN_INFO_BYTES + 32], peer_info[BRG__CONN_INFO_BYTES + 32];
  memset(info, 0, sizeof info);
  snprintf(info, 32, "%s", trecv->name);
  c->recv.ops = trecv;
  c->recv.peer = c->prev;
  c->recv_open = 1;
  brg_status s = trecv->recv_setup(&c->recv, &pr, info + 32, err);
  if (s != BRG_SUCCESS) return s;
  uint32_t got = 0;
  s = exchange(c, BRG__RING_PREV, info, sizeof info, BRG__RING_NEXT, BRG__MSG_CONN_INFO, peer_info,
               sizeof peer_info, &got, err);
  if (s != BRG_SUCCESS) return s;
  if (got != sizeof peer_info || strncmp(peer_info, tsend->name, 32) != 0) {
    peer_info[31] = 0;
    return brg__error(err, BRG_ERR_MISMATCH, "init",
                      "rank %d chose transport \"%s\" for the link from rank %d, which chose "
                      "\"%s\" (is BRIGADE_TRANSPORTS the same on every rank?)",
                      c->next, got == sizeof peer_info ? peer_info : "?", c->rank, tsend->name);
  }
  c->send.ops = tsend;
  c->send.peer = c->next;
  c->send_open = 1;
  s = tsend->send_connect(&c->send, &ps, peer_info + 32, err);
  if (s != BRG_SUCCESS) return s;
  char ack = 1, ack_in;
  s = exchange(c, BRG__RING_NEXT, &ack, 1, BRG__RING_PREV, BRG__MSG_ATTACHED, &ack_in, 1, &got,
               err);
  if (s != BRG_SUCCESS) return s;
  s = trecv->recv_connect(&c->recv, &pr, err);
  if (s != BRG_SUCCESS) return s;
  BRG__INFO("init", "link to rank %d (next) via %s, from rank %d (prev) via %s; %d slots x %zu bytes",
            c->next, tsend->name, c->prev, trecv->name, c->nslots, c->slot_bytes);
  return BRG_SUCCESS;
}

static void *worker_main(void *arg);

static void comm_free(brg_comm *c) {
  /* A neighbour still finishing the last collective must not take our
   * hang-up for a crash: say goodbye first. */
  if (c->ready && c->bs && c->nranks > 1) {
    pthread_mutex_lock(&c->ring_lock);
    for (int dir = 0; dir < 2; dir++) brg__bootstrap_send(c->bs, dir, BRG__MSG_BYE, "", 0, NULL);
    pthread_mutex_unlock(&c->ring_lock);
  }
  if (c->worker_started) {
    pthread_mutex_lock(&c->qlock);
    c->stop = 1;
    pthread_cond_broadcast(&c->qcond);
    pthread_mutex_unlock(&c->qlock);
    pthread_join(c->worker, NULL);
  }
  brg__device_ring_free(c);
  if (c->send_open && c->send.ops) c->send.ops->close(&c->send);
  if (c->recv_open && c->recv.ops) c->recv.ops->close(&c->recv);
  if (c->bs) brg__bootstrap_destroy(c->bs);
  pthread_mutex_destroy(&c->err_lock);
  pthread_mutex_destroy(&c->ring_lock);
  pthread_mutex_destroy(&c->qlock);
  pthread_cond_destroy(&c->qcond);
  pthread_cond_destroy(&c->donecond);
  free(c->scratch);
  free(c->ring);
  free(c->peers);
  c->magic = 0;
  free(c);
}

static brg_status comm_create(brg_comm **out, int nranks, const brg__boot_id *id, int rank) {
  brg__errbuf err;
  brg_status s = brg__settings_load(&err);
  if (s != BRG_SUCCESS) return fail_no_comm(s, "%s", err.msg);
  brg__log_init();
  if ((s = brg__boot_id_check(id, &err)) != BRG_SUCCESS) return fail_no_comm(s, "%s", err.msg);

  brg_comm *c = calloc(1, sizeof *c);
  if (!c) return fail_no_comm(BRG_ERR_NO_MEMORY, "out of memory creating a communicator");
  c->magic = BRG__COMM_MAGIC;
  c->rank = rank;
  c->nranks = nranks;
  pthread_mutex_init(&c->err_lock, NULL);
  pthread_mutex_init(&c->ring_lock, NULL);
  pthread_mutex_init(&c->qlock, NULL);
  pthread_cond_init(&c->qcond, NULL);
  pthread_cond_init(&c->donecond, NULL);
  c->timeout_ms = (int)brg__core_int(BRG__CORE_TIMEOUT_MS);
  c->nslots = (int)brg__core_int(BRG__CORE_STEPS);
  c->slot_bytes = (size_t)brg__core_int(BRG__CORE_SLICE_BYTES) & ~(size_t)63;
  c->comm_id = fnv1a(14695981039346656037ull, id, sizeof *id);
  brg__ring_waiter_init(c);
  brg__log_set_rank(rank);

  c->peers = calloc((size_t)nranks, sizeof *c->peers);
  c->ring = calloc((size_t)nranks, sizeof *c->ring);
  if (!c->peers || !c->ring) {
    s = BRG_ERR_NO_MEMORY;
    snprintf(err.msg, sizeof err.msg, "out of memory for %d ranks", nranks);
    goto err_free;
  }
  brg__peer_info me;
  memset(&me, 0, sizeof me);
  me.rank = rank;
  me.pid = (int32_t)getpid();
  me.host_hash = host_hash(me.hostname, sizeof me.hostname);
  if ((s = brg__boot_local_addr(me.addr, sizeof me.addr, &err)) != BRG_SUCCESS) goto err_free;
  /* A little longer than the root waits, so that the root's list of the
   * ranks that never came arrives before this rank gives up on its own. */
  int boot_wait = c->timeout_ms + (c->timeout_ms / 10 < 2000 ? c->timeout_ms / 10 + 1000 : 2000);
  s = brg__bootstrap_init(&c->bs, id, rank, nranks, &me, sizeof me, c->peers, boot_wait, &err);
  if (s != BRG_SUCCESS) goto err_free;

  for (int i = 0; i < nranks; i++) c->ring[i] = i;
  qsort_r(c->ring, (size_t)nranks, sizeof *c->ring, cmp_host_then_rank, c->peers);
  for (int i = 0; i < nranks; i++)
    if (c->ring[i] == rank) c->pos = i;
  c->next = c->ring[(c->pos + 1) % nranks];
  c->prev = c->ring[(c->pos + nranks - 1) % nranks];
  if (rank == 0) log_ring(c);

  /* Ranks that outnumber the cores must not burn each other's time slices:
   * a waiter yields at once (the rank it waits for may be the one it would
   * delay), then sleeps (unless BRIGADE_SPIN says otherwise). */
  int local = 0;
  for (int i = 0; i < nranks; i++) local += c->peers[i].host_hash == me.host_hash;
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  if (local > cores && !brg__config_is_set(&brg__core_config, BRG__CORE_SPIN)) {
    c->waiter.spin = 0;
    BRG__INFO("init", "%d ranks share %ld cores on this host: waits yield at once", local, cores);
  }

  if (nranks > 1) {
    if ((s = brg__bootstrap_ring_connect(c->bs, c->next, c->prev, &err)) != BRG_SUCCESS)
      goto err_free;
    if ((s = connect_ring(c, brg__bootstrap_secret(c->bs), &err)) != BRG_SUCCESS) {
      brg__comm_notify_abort(c, s, err.msg);
      goto err_free;
    }
  }
  c->stream_bytes = (size_t)brg__core_int(BRG__CORE_STREAM_BYTES);
  c->small_bytes = (size_t)brg__core_int(BRG__CORE_SMALL_BYTES);
  if (c->small_bytes > c->slot_bytes) c->small_bytes = c->slot_bytes;
  if (nranks > 1 && c->small_bytes > 0) {
    c->scratch = malloc((size_t)nranks * c->small_bytes);
    if (c->scratch) memset(c->scratch, 0, (size_t)nranks * c->small_bytes); /* touch it now */
    else c->small_bytes = 0;
  }
  if (pthread_create(&c->worker, NULL, worker_main, c) != 0) {
    s = BRG_ERR_SYSTEM;
    snprintf(err.msg, sizeof err.msg, "pthread_create for the progress thread failed");
    goto err_free;
  }
  c->worker_started = 1;
  c->ready = 1;
  BRG__INFO("init", "rank %d of %d ready (pid %d on %s, kernels %s)", rank, nranks, me.pid,
            me.hostname, brg__kernels_isa());
  *out = c;
  return BRG_SUCCESS;

err_free:
  comm_free(c);
  return fail_no_comm(s, "%s", err.msg);
}

brg_status brg_comm_init(brg_comm **comm, int nranks, const brg_unique_id *id, int rank) {
  if (!comm) return fail_no_comm(BRG_ERR_INVALID_ARGUMENT, "brg_comm_init: comm is NULL");
  if (!id) return fail_no_comm(BRG_ERR_INVALID_ARGUMENT, "brg_comm_init: id is NULL");
  if (nranks < 1 || nranks > BRG__BOOT_MAX_RANKS)
    return fail_no_comm(BRG_ERR_INVALID_ARGUMENT, "brg_comm_init: nranks=%d is not in [1, %d]",
                        nranks, BRG__BOOT_MAX_RANKS);
  if (rank < 0 || rank >= nranks)
    return fail_no_comm(BRG_ERR_INVALID_ARGUMENT, "brg_comm_init: rank=%d is not in [0, %d)",
                        rank, nranks);
  brg__boot_id bid;
  memcpy(&bid, id->internal, sizeof bid);
  return comm_create(comm, nranks, &bid, rank);
}

/* ---- environment rendezvous (torchrun, brigade-run, mpirun, srun) ---- */

static brg_status env_int(const char *const *names, int *out, const char **found) {
  for (int i = 0; names[i]; i++) {
    const char *v = getenv(names[i]);
    if (!v || !*v) continue;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || *end || x < 0 || x > 1 << 30)
      return fail_no_comm(BRG_ERR_INVALID_ARGUMENT, "%s=\"%s\" is not a valid number", names[i], v);
    *out = (int)x;
    *found = names[i];
    return BRG_SUCCESS;
  }
  return BRG_ERR_INVALID_ARGUMENT;
}

static int hexval(char ch) {
  if (ch >= '0' && ch <= '9') return ch - '0';
  if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
  if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
  return -1;
}

brg_status brg_comm_init_env(brg_comm **comm) {
  if (!comm) return fail_no_comm(BRG_ERR_INVALID_ARGUMENT, "brg_comm_init_env: comm is NULL");
  brg__errbuf err;
  brg_status s = brg__settings_load(&err);
  if (s != BRG_SUCCESS) return fail_no_comm(s, "%s", err.msg);
  brg__log_init();
  static const char *const rank_vars[] = {"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", NULL};
  static const char *const size_vars[] = {"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", NULL};
  int rank = -1, size = -1;
  const char *rank_name = NULL, *size_name = NULL;
  if (env_int(rank_vars, &rank, &rank_name) != BRG_SUCCESS) {
    if (rank_name) return BRG_ERR_INVALID_ARGUMENT;
    return fail_no_comm(BRG_ERR_INVALID_ARGUMENT,
                        "brg_comm_init_env: RANK is not set (nor OMPI_COMM_WORLD_RANK, "
                        "PMI_RANK or SLURM_PROCID); start the program with brigade-run, "
                        "torchrun, mpirun or srun");
  }
  if (env_int(size_vars, &size, &size_name) != BRG_SUCCESS) {
    if (size_name) return BRG_ERR_INVALID_ARGUMENT;
    return fail_no_comm(BRG_ERR_INVALID_ARGUMENT,
                        "brg_comm_init_env: WORLD_SIZE is not set (nor OMPI_COMM_WORLD_SIZE, "
                        "PMI_SIZE or SLURM_NTASKS)");
  }
  if (size < 1 || rank >= size)
    return fail_no_comm(BRG_ERR_INVALID_ARGUMENT, "brg_comm_init_env: %s=%d but %s=%d", rank_name,
                        rank, size_name, size);
  const char *maddr = getenv("MASTER_ADDR"), *mport = getenv("MASTER_PORT");
  if (!maddr || !*maddr)
    return fail_no_comm(BRG_ERR_INVALID_ARGUMENT,
                        "brg_comm_init_env: MASTER_ADDR is not set (the host of rank 0)");
  if (!mport || !*mport)
    return fail_no_comm(BRG_ERR_INVALID_ARGUMENT,
                        "brg_comm_init_env: MASTER_PORT is not set (a free TCP port on rank 0's host)");
  char *end;
  long port = strtol(mport, &end, 10);
  if (*end || port < 1 || port > 65535)
    return fail_no_comm(BRG_ERR_INVALID_ARGUMENT, "MASTER_PORT=\"%s\" is not a port number", mport);
  /* Under torchrun the elastic agent's own store holds MASTER_PORT. */
  const char *elastic = getenv("TORCHELASTIC_RUN_ID");
  if (elastic && *elastic) port = port == 65535 ? 65534 : port + 1;

  /* The job secret: BRIGADE_SECRET (brigade-run sets a random one), else
   * derived from the rendezvous itself, which only keeps strays out. */
  uint8_t secret[16];
  const char *hex = brg__core_str(BRG__CORE_SECRET);
  if (hex[0]) {
    size_t n = strlen(hex);
    if (n < 2 || n % 2)
      return fail_no_comm(BRG_ERR_INVALID_ARGUMENT, "BRIGADE_SECRET must be an even number of hex digits");
    memset(secret, 0, sizeof secret);
    for (size_t i = 0; i < n; i++) {
      int v = hexval(hex[i]);
      if (v < 0) return fail_no_comm(BRG_ERR_INVALID_ARGUMENT, "BRIGADE_SECRET is not hexadecimal");
      secret[(i / 2) % 16] ^= (uint8_t)(v << (i % 2 ? 0 : 4));
    }
  } else {
    char seed[256];
    int n = snprintf(seed, sizeof seed, "brigade:%s:%ld:%d", maddr, port, size);
    uint64_t h1 = fnv1a(14695981039346656037ull, seed, (size_t)n);
    uint64_t h2 = fnv1a(h1 ^ 0x9e3779b97f4a7c15ull, seed, (size_t)n);
    memcpy(secret, &h1, 8);
    memcpy(secret + 8, &h2, 8);
  }

  /* MASTER_ADDR may be a name: resolve it to the numeric address in the id. */
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
  int g = getaddrinfo(maddr, NULL, &hints, &res);
  if (g != 0 || !res)
    return fail_no_comm(BRG_ERR_INVALID_ARGUMENT, "MASTER_ADDR=\"%s\" does not resolve: %s", maddr,
                        gai_strerror(g));
  char numeric[64];
  g = getnameinfo(res->ai_addr, res->ai_addrlen, numeric, sizeof numeric, NULL, 0, NI_NUMERICHOST);
  freeaddrinfo(res);
  if (g != 0)
    return fail_no_comm(BRG_ERR_INVALID_ARGUMENT, "MASTER_ADDR=\"%s\": %s", maddr, gai_strerror(g));

  brg__boot_id bid;
  if (rank == 0) {
    s = brg__boot_root_start(numeric, (uint16_t)port, secret, (int)brg__core_int(BRG__CORE_TIMEOUT_MS),
                             &bid, &err);
    if (s != BRG_SUCCESS) return fail_no_comm(s, "rank 0: %s", err.msg);
  }
  if ((s = brg__boot_id_make(&bid, numeric, (uint16_t)port, secret, &err)) != BRG_SUCCESS)
    return fail_no_comm(s, "%s", err.msg);
  return comm_create(comm, size, &bid, rank);
}

/* ---- small accessors ---- */

static brg_status check_comm(const brg_comm *c, const char *fn) {
  if (!c) return fail_no_comm(BRG_ERR_INVALID_ARGUMENT, "%s: comm is NULL", fn);
  if (c->magic != BRG__COMM_MAGIC)
    return fail_no_comm(BRG_ERR_INVALID_ARGUMENT, "%s: not a valid communicator (destroyed?)", fn);
  return BRG_SUCCESS;
}

brg_status brg_comm_rank(const brg_comm *comm, int *rank) {
  brg_status s = check_comm(comm, "brg_comm_rank");
  if (s != BRG_SUCCESS) return s;
  if (!rank)
    return brg__comm_error((brg_comm *)comm, BRG_ERR_INVALID_ARGUMENT, "brg_comm_rank: rank is NULL");
  *rank = comm->rank;
  return BRG_SUCCESS;
}

brg_status brg_comm_size(const brg_comm *comm, int *size) {
  brg_status s = check_comm(comm, "brg_comm_size");
  if (s != BRG_SUCCESS) return s;
  if (!size)
    return brg__comm_error((brg_comm *)comm, BRG_ERR_INVALID_ARGUMENT, "brg_comm_size: size is NULL");
  *size = comm->nranks;
  return BRG_SUCCESS;
}

brg_status brg_comm_bytes_sent(const brg_comm *comm, uint64_t *bytes) {
  brg_status s = check_comm(comm, "brg_comm_bytes_sent");
  if (s != BRG_SUCCESS) return s;
  if (!bytes)
    return brg__comm_error((brg_comm *)comm, BRG_ERR_INVALID_ARGUMENT, "brg_comm_bytes_sent: bytes is NULL");
  *bytes = __atomic_load_n(&comm->bytes_sent, __ATOMIC_RELAXED);
  return BRG_SUCCESS;
}

brg_status brg_comm_abort(brg_comm *comm) {
  brg_status s = check_comm(comm, "brg_comm_abort");
  if (s != BRG_SUCCESS) return s;
  __atomic_store_n(&comm->aborted, 1, __ATOMIC_SEQ_CST);
  brg__fifo_wake_all(&comm->send.fifo);
  brg__fifo_wake_all(&comm->recv.fifo);
  pthread_mutex_lock(&comm->qlock);
  pthread_cond_broadcast(&comm->qcond);
  pthread_mutex_unlock(&comm->qlock);
  brg__comm_notify_abort(comm, BRG_ERR_REMOTE, "the communicator was aborted");
  return BRG_SUCCESS;
}

brg_status brg_comm_destroy(brg_comm *comm) {
  brg_status s = check_comm(comm, "brg_comm_destroy");
  if (s != BRG_SUCCESS) return s;
  pthread_mutex_lock(&comm->qlock);
  int pending = comm->busy || comm->qhead;
  pthread_mutex_unlock(&comm->qlock);
  /* Collectives still queued cannot finish once this rank is gone. */
  if (pending) brg_comm_abort(comm);
  comm_free(comm);
  return BRG_SUCCESS;
}

/* ---- progress: running collectives in issue order ---- */

static brg_status run_one(brg_comm *c, brg__coll *k) {
  if (__atomic_load_n(&c->aborted, __ATOMIC_ACQUIRE))
    return brg__comm_error(c, BRG_ERR_ABORTED, "communicator was aborted");
  if (c->broken)
    return c->broken; /* last_error still holds the first failure */
  brg_status s = brg__coll_execute(c, k);
  if (s != BRG_SUCCESS) {
    c->broken = s;
    if (s != BRG_ERR_ABORTED) brg__comm_notify_abort(c, s, c->last_error);
  }
  return s;
}

static void *worker_main(void *arg) {
  brg_comm *c = arg;
  pthread_mutex_lock(&c->qlock);
  for (;;) {
    while (!c->stop && (c->busy || !c->qhead)) pthread_cond_wait(&c->qcond, &c->qlock);
    if (!c->qhead && c->stop) break;
    if (!c->qhead) continue;
    brg__req *r = c->qhead;
    c->qhead = r->next;
    if (!c->qhead) c->qtail = NULL;
    c->busy = 1;
    pthread_mutex_unlock(&c->qlock);
    brg_status s = c->stop ? BRG_ERR_ABORTED : run_one(c, &r->coll);
    pthread_mutex_lock(&c->qlock);
    c->busy = 0;
    r->status = s;
    __atomic_store_n(&r->done, 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&c->donecond);
  }
  pthread_mutex_unlock(&c->qlock);
  return NULL;
}

static void enqueue(brg_comm *c, brg__req *r) {
  r->next = NULL;
  r->done = 0;
  r->comm = c;
  r->magic = BRG__REQ_MAGIC;
  if (c->qtail) c->qtail->next = r;
  else c->qhead = r;
  c->qtail = r;
  pthread_cond_signal(&c->qcond);
}

static brg_status wait_req(brg__req *r) {
  brg_comm *c = r->comm;
  if (__atomic_load_n(&r->done, __ATOMIC_ACQUIRE)) return r->status;
  pthread_mutex_lock(&c->qlock);
  while (!r->done) pthread_cond_wait(&c->donecond, &c->qlock);
  pthread_mutex_unlock(&c->qlock);
  return r->status;
}

/* A blocking call runs on the caller's thread when nothing is queued ahead
 * of it (no hand-off latency), otherwise it queues behind and waits. */
static brg_status run_blocking(brg_comm *c, brg__coll *k) {
  pthread_mutex_lock(&c->qlock);
  if (!c->busy && !c->qhead) {
    c->busy = 1;
    pthread_mutex_unlock(&c->qlock);
    brg_status s = run_one(c, k);
    pthread_mutex_lock(&c->qlock);
    c->busy = 0;
    /* Wake the worker only when work queued up meanwhile: a wake-up per
     * call would cost a context switch on a rank pinned to one core. */
    if (c->qhead) pthread_cond_signal(&c->qcond);
    pthread_mutex_unlock(&c->qlock);
    return s;
  }
  brg__req r;
  memset(&r, 0, sizeof r);
  r.coll = *k;
  enqueue(c, &r);
  pthread_mutex_unlock(&c->qlock);
  return wait_req(&r);
}

/* ---- argument checks shared by the collectives ---- */

static brg_status check_call(brg_comm *c, const char *fn, const void *sendbuf, const void *recvbuf,
                             size_t count, size_t send_elems, size_t recv_elems, brg_dtype dtype,
                             int check_op, brg_op op, int root, brg_stream stream) {
  brg_status s = check_comm(c, fn);
  if (s != BRG_SUCCESS) return s;
  if ((unsigned)dtype >= BRG_NUM_DTYPES)
    return brg__comm_error(c, BRG_ERR_INVALID_ARGUMENT, "%s: unknown dtype %d", fn, (int)dtype);
  if (check_op && (unsigned)op >= BRG_NUM_OPS)
    return brg__comm_error(c, BRG_ERR_INVALID_ARGUMENT, "%s: unknown op %d", fn, (int)op);
  if (root != -1 && (root < 0 || root >= c->nranks))
    return brg__comm_error(c, BRG_ERR_INVALID_ARGUMENT, "%s: root %d is not in [0, %d)", fn, root,
                           c->nranks);
  size_t esize = brg_dtype_size(dtype);
  size_t limit = (SIZE_MAX / 4) / esize / (size_t)c->nranks;
  if (count > limit)
    return brg__comm_error(c, BRG_ERR_INVALID_ARGUMENT, "%s: count %zu is too large", fn, count);
  if (send_elems && !sendbuf)
    return brg__comm_error(c, BRG_ERR_INVALID_ARGUMENT, "%s: sendbuf is NULL with count %zu", fn,
                           count);
  if (recv_elems && !recvbuf)
    return brg__comm_error(c, BRG_ERR_INVALID_ARGUMENT, "%s: recvbuf is NULL with count %zu", fn,
                           count);
  s = stream ? brg__device_check_call(c, fn, sendbuf, recvbuf, stream)
             : brg__device_check_host_call(c, fn, sendbuf, recvbuf);
  if (s != BRG_SUCCESS) return s;
  if (send_elems && recv_elems && sendbuf != recvbuf) {
    const char *a = sendbuf, *b = recvbuf;
    size_t sa = send_elems * esize, sb = recv_elems * esize;
    int overlap = a < b + sb && b < a + sa;
    /* In place in NCCL's sense: one buffer lies exactly at this rank's block of the other. */
    int nccl_inplace = (b == a + (size_t)c->rank * sb && sb * (size_t)c->nranks == sa) ||
                       (a == b + (size_t)c->rank * sa && sa * (size_t)c->nranks == sb);
    if (overlap && !nccl_inplace)
      return brg__comm_error(c, BRG_ERR_INVALID_ARGUMENT,
                             "%s: sendbuf and recvbuf overlap without being in place", fn);
  }
  if (__atomic_load_n(&c->aborted, __ATOMIC_ACQUIRE))
    return brg__comm_error(c, BRG_ERR_ABORTED, "%s: communicator was aborted", fn);
  if (c->broken) return c->broken;
  return BRG_SUCCESS;
}

#define COLL(KIND, SB, RB, CNT, DT, OP, ROOT) \
  {.kind = (KIND), .dtype = (DT), .op = (OP), .root = (ROOT), .sendbuf = (SB), .recvbuf = (RB), .count = (CNT)}

brg_status brg_allreduce(const void *sendbuf, void *recvbuf, size_t count, brg_dtype dtype,
                         brg_op op, brg_comm *comm, brg_stream stream) {
  brg_status s = check_call(comm, "brg_allreduce", sendbuf, recvbuf, count, count, count, dtype, 1,
                            op, -1, stream);
  if (s != BRG_SUCCESS) return s;
  brg__coll k = COLL(BRG__COLL_ALLREDUCE, sendbuf, recvbuf, count, dtype, op, -1);
  k.stream = stream;
  return run_blocking(comm, &k);
}

brg_status brg_reduce_scatter(const void *sendbuf, void *recvbuf, size_t recvcount,
                              brg_dtype dtype, brg_op op, brg_comm *comm, brg_stream stream) {
  size_t n = comm && comm->magic == BRG__COMM_MAGIC ? (size_t)comm->nranks : 1;
  brg_status s = check_call(comm, "brg_reduce_scatter", sendbuf, recvbuf, recvcount,
                            recvcount * n, recvcount, dtype, 1, op, -1, stream);
  if (s != BRG_SUCCESS) return s;
  brg__coll k = COLL(BRG__COLL_REDUCE_SCATTER, sendbuf, recvbuf, recvcount, dtype, op, -1);
  k.stream = stream;
  return run_blocking(comm, &k);
}

brg_status brg_all_gather(const void *sendbuf, void *recvbuf, size_t sendcount, brg_dtype dtype,
                          brg_comm *comm, brg_stream stream) {
  size_t n = comm && comm->magic == BRG__COMM_MAGIC ? (size_t)comm->nranks : 1;
  brg_status s = check_call(comm, "brg_all_gather", sendbuf, recvbuf, sendcount, sendcount,
                            sendcount * n, dtype, 0, BRG_SUM, -1, stream);
  if (s != BRG_SUCCESS) return s;
  brg__coll k = COLL(BRG__COLL_ALL_GATHER, sendbuf, recvbuf, sendcount, dtype, BRG_SUM, -1);
  k.stream = stream;
  return run_blocking(comm, &k);
}

brg_status brg_broadcast(const void *sendbuf, void *recvbuf, size_t count, brg_dtype dtype,
                         int root, brg_comm *comm, brg_stream stream) {
  brg_status s = check_comm(comm, "brg_broadcast");
  if (s != BRG_SUCCESS) return s;
  if (root < 0 || root >= comm->nranks)
    return brg__comm_error(comm, BRG_ERR_INVALID_ARGUMENT, "brg_broadcast: root %d is not in [0, %d)",
                           root, comm->nranks);
  int is_root = comm->rank == root;
  s = check_call(comm, "brg_broadcast", is_root ? sendbuf : NULL, recvbuf, count,
                 is_root ? count : 0, count, dtype, 0, BRG_SUM, root, stream);
  if (s != BRG_SUCCESS) return s;
  brg__coll k = COLL(BRG__COLL_BROADCAST, is_root ? sendbuf : NULL, recvbuf, count, dtype, BRG_SUM, root);
  k.stream = stream;
  return run_blocking(comm, &k);
}

brg_status brg_reduce(const void *sendbuf, void *recvbuf, size_t count, brg_dtype dtype, brg_op op,
                      int root, brg_comm *comm, brg_stream stream) {
  brg_status s = check_comm(comm, "brg_reduce");
  if (s != BRG_SUCCESS) return s;
  if (root < 0 || root >= comm->nranks)
    return brg__comm_error(comm, BRG_ERR_INVALID_ARGUMENT, "brg_reduce: root %d is not in [0, %d)",
                           root, comm->nranks);
  int is_root = comm->rank == root;
  s = check_call(comm, "brg_reduce", sendbuf, is_root ? recvbuf : NULL, count, count,
                 is_root ? count : 0, dtype, 1, op, root, stream);
  if (s != BRG_SUCCESS) return s;
  brg__coll k = COLL(BRG__COLL_REDUCE, sendbuf, is_root ? recvbuf : NULL, count, dtype, op, root);
  k.stream = stream;
  return run_blocking(comm, &k);
}

brg_status brg_barrier(brg_comm *comm) {
  brg_status s = check_call(comm, "brg_barrier", NULL, NULL, 0, 0, 0, BRG_INT8, 1, BRG_SUM, -1, NULL);
  if (s != BRG_SUCCESS) return s;
  brg__coll k = COLL(BRG__COLL_BARRIER, NULL, NULL, 0, BRG_INT8, BRG_SUM, -1);
  return run_blocking(comm, &k);
}

/* ---- asynchronous allreduce ---- */

brg_status brg_iallreduce(const void *sendbuf, void *recvbuf, size_t count, brg_dtype dtype,
                          brg_op op, brg_comm *comm, brg_request *request) {
  brg_status s = check_call(comm, "brg_iallreduce", sendbuf, recvbuf, count, count, count, dtype,
                            1, op, -1, NULL);
  if (s != BRG_SUCCESS) return s;
  if (!request)
    return brg__comm_error(comm, BRG_ERR_INVALID_ARGUMENT, "brg_iallreduce: request is NULL");
  brg__req *r = (brg__req *)request;
  if (r->magic == BRG__REQ_MAGIC && !__atomic_load_n(&r->done, __ATOMIC_ACQUIRE))
    return brg__comm_error(comm, BRG_ERR_INVALID_USAGE, "brg_iallreduce: request is still in flight");
  memset(r, 0, sizeof *r);
  brg__coll k = COLL(BRG__COLL_ALLREDUCE, sendbuf, recvbuf, count, dtype, op, -1);
  r->coll = k;
  pthread_mutex_lock(&comm->qlock);
  enqueue(comm, r);
  pthread_mutex_unlock(&comm->qlock);
  return BRG_SUCCESS;
}

brg_status brg_test(brg_request *request, int *done) {
  if (!request || !done) return fail_no_comm(BRG_ERR_INVALID_ARGUMENT, "brg_test: NULL argument");
  brg__req *r = (brg__req *)request;
  if (r->magic != BRG__REQ_MAGIC)
    return fail_no_comm(BRG_ERR_INVALID_ARGUMENT, "brg_test: request was never issued");
  if (!__atomic_load_n(&r->done, __ATOMIC_ACQUIRE)) {
    *done = 0;
    return BRG_IN_PROGRESS;
  }
  *done = 1;
  return r->status;
}

brg_status brg_wait(brg_request *request) {
  if (!request) return fail_no_comm(BRG_ERR_INVALID_ARGUMENT, "brg_wait: request is NULL");
  brg__req *r = (brg__req *)request;
  if (r->magic != BRG__REQ_MAGIC)
    return fail_no_comm(BRG_ERR_INVALID_ARGUMENT, "brg_wait: request was never issued");
  return wait_req(r);
}
