/*
 * Traces (trace.h): a ring buffer of fixed-size events filled by the
 * engine's hooks, written out as Chrome trace event JSON.
 *
 * In the file, pid is the rank and tid a track: 0 collectives, 1 slices
 * (with their waits nested inside). A step of a pipelined collective
 * overlaps the steps around it (slices run step after step, one slice at a
 * time), so steps are async spans ("b"/"e"), which trace viewers stack
 * where they overlap. Their id is process-scoped ("id2": {"local": step}):
 * a plain "id" is global, so in a merged file Perfetto would put every
 * rank's step t on one track and pair one rank's begin with another's
 * end. With a local id each rank has one row per step, which holds that
 * step of every collective in turn.
 */
#include "trace.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "schedule.h"
#include "settings.h"

enum { EV_COLL = 1, EV_STEP, EV_SLICE, EV_WAIT, EV_LAT };

typedef struct trace_ev {
  int64_t t0, t1;       /* CLOCK_MONOTONIC ns */
  uint64_t seq;         /* the collective's number */
  uint64_t bytes;       /* coll: payload per rank; step, slice: bytes moved */
  uint64_t elem;        /* coll: count; slice: first element; step: slices */
  int64_t wait_ns;      /* slice: waiting for the previous rank's slot; lat: data landed */
  int64_t wait_send_ns; /* slice: waiting for a free slot at the next rank */
  int32_t step, chunk;  /* lat: round, tree */
  int32_t slice;        /* slice index in its chunk; wait, lat: the peer */
  uint8_t type, what;   /* what: prim (slice, step), kind (coll), send (wait), lat's what */
  uint8_t dtype, op;
  int16_t status;
  int16_t root; /* coll: root; lat: phase */
} trace_ev;

typedef struct trace_step {
  int64_t t0, t1;
  uint64_t bytes;
  uint32_t slices;
  int32_t chunk;
  int prim;
} trace_step;

struct brg__trace {
  trace_ev *ev;
  uint64_t cap, n; /* n: events ever recorded; the newest cap are kept */
  char path[512];
  int64_t offset_ns, offset_err_ns; /* add to CLOCK_MONOTONIC: rank at position 0's clock */
  int64_t mono_base_ns, real_base_ns;
  int64_t wait_ns, wait_send_ns; /* of the slice in progress */
  int64_t last_ns;               /* end of the last slice, or start of the collective */
  trace_step *steps;             /* of the collective in progress */
  int nsteps, max_steps;
  int writes_failed;
  mode_t mode; /* the trace file's, as made at init (0644 less the umask) */
};

enum { CLOCK_ROUNDS = 8 };

typedef struct clock_msg {
  int64_t mono_ns;   /* the sender's CLOCK_MONOTONIC when it answered */
  int64_t offset_ns; /* the sender's offset to the reference */
  int64_t err_ns;    /* and its error bound */
} clock_msg;

int brg__trace_wanted(void) {
  return brg__config_str(&brg__trace_config, BRG__TRACE_FILE)[0] != 0;
}

/* Clock offsets along the ring: position 0 is the reference; position p
 * asks p-1 (which already knows its own offset) for the time, CLOCK_ROUNDS
 * times, and keeps the answer with the shortest round trip, whose error is
 * at most half of it. Neighbours on one host share CLOCK_MONOTONIC and
 * take p-1's offset as it is. Then p answers p+1. */
static brg_status clock_sync(brg_comm *c, int64_t *off, int64_t *off_err, brg__errbuf *err) {
  *off = 0;
  *off_err = 0;
  const uint64_t me = c->peers[c->rank].host_hash;
  clock_msg m;
  uint32_t type = 0, len = 0;
  if (c->ring.pos > 0) {
    int same = c->peers[c->ring.prev].host_hash == me;
    int64_t best = INT64_MAX;
    for (int i = 0; i < (same ? 1 : CLOCK_ROUNDS); i++) {
      int64_t t0 = brg__now_ns();
      brg_status s = brg__bootstrap_send(c->bs, BRG__RING_PREV, BRG__MSG_CLOCK, &t0, 8, err);
      if (s == BRG_SUCCESS)
        s = brg__bootstrap_recv(c->bs, BRG__RING_PREV, &type, &m, sizeof m, &len, c->timeout_ms,
                                err);
      if (s != BRG_SUCCESS) return s;
      int64_t t1 = brg__now_ns();
      if (type != BRG__MSG_CLOCK || len != sizeof m)
        return brg__error(err, BRG_ERR_REMOTE, "init",
                          "trace clock: rank %d answered with message type %u of %u bytes",
                          c->ring.prev, type, len);
      if (same) {
        *off = m.offset_ns;
        *off_err = m.err_ns;
      } else if (t1 - t0 < best) {
        best = t1 - t0;
        *off = m.mono_ns + m.offset_ns - (t0 + (t1 - t0) / 2);
        *off_err = m.err_ns + (best + 1) / 2;
      }
    }
  }
  if (c->ring.pos < c->nranks - 1) {
    int same = c->peers[c->ring.next].host_hash == me;
    for (int i = 0; i < (same ? 1 : CLOCK_ROUNDS); i++) {
      int64_t ping;
      brg_status s = brg__bootstrap_recv(c->bs, BRG__RING_NEXT, &type, &ping, sizeof ping, &len,
                                         c->timeout_ms, err);
      if (s != BRG_SUCCESS) return s;
      if (type != BRG__MSG_CLOCK)
        return brg__error(err, BRG_ERR_REMOTE, "init",
                          "trace clock: rank %d sent message type %u (is BRIGADE_TRACE_FILE "
                          "set the same way on every rank's host?)",
                          c->ring.next, type);
      m = (clock_msg){.mono_ns = brg__now_ns(), .offset_ns = *off, .err_ns = *off_err};
      if ((s = brg__bootstrap_send(c->bs, BRG__RING_NEXT, BRG__MSG_CLOCK, &m, sizeof m, err)) !=
          BRG_SUCCESS)
        return s;
    }
  }
  return BRG_SUCCESS;
}

brg_status brg__trace_open(brg_comm *c, int any, brg__errbuf *err) {
  int64_t off = 0, off_err = 0;
  if (any && c->nranks > 1) {
    brg_status s = clock_sync(c, &off, &off_err, err);
    if (s != BRG_SUCCESS) return s;
  }
  if (!brg__trace_wanted()) return BRG_SUCCESS;
  brg__trace *t = calloc(1, sizeof *t);
  if (!t) return brg__error(err, BRG_ERR_NO_MEMORY, "init", "out of memory for the trace");
  t->cap = (uint64_t)brg__config_int(&brg__trace_config, BRG__TRACE_EVENTS);
  t->max_steps = 2 * c->nranks;
  t->ev = calloc(t->cap, sizeof *t->ev);
  t->steps = calloc((size_t)t->max_steps, sizeof *t->steps);
  if (!t->ev || !t->steps) {
    free(t->ev);
    free(t->steps);
    free(t);
    return brg__error(err, BRG_ERR_NO_MEMORY, "init",
                      "out of memory for %llu trace events (BRIGADE_TRACE_EVENTS)",
                      (unsigned long long)brg__config_int(&brg__trace_config, BRG__TRACE_EVENTS));
  }
  memset(t->ev, 0, t->cap * sizeof *t->ev); /* touch it now, not while tracing */
  const char *pattern = brg__config_str(&brg__trace_config, BRG__TRACE_FILE);
  brg__log_expand_path(t->path, sizeof t->path, pattern, c->rank);
  /* Ranks writing one file would overwrite each other's traces. A path
   * that names a directory ("adir/", or an existing "adir") stays one:
   * the check below refuses it, as it does with one rank. */
  size_t plen = strlen(t->path);
  struct stat st;
  int is_dir = plen && stat(t->path, &st) == 0 && S_ISDIR(st.st_mode);
  if (c->nranks > 1 && !strstr(pattern, "%r") && !strstr(pattern, "%p") && plen &&
      t->path[plen - 1] != '/' && !is_dir) {
    size_t len = strlen(t->path);
    snprintf(t->path + len, sizeof t->path - len, ".%d", c->rank);
    BRG__WARN("init", "BRIGADE_TRACE_FILE=%s names no rank (%%r) or pid (%%p): rank %d writes %s",
              pattern, c->rank, t->path);
  }
  /* Fail now, not at the end of the job, on a path that cannot be written
   * or that someone else could have planted (brg__open_own_file). The
   * file is not truncated: the trace replaces it at the end. */
  char why[160];
  int fd = brg__open_own_file(t->path, 0, why, sizeof why);
  if (fd >= 0 && fstat(fd, &st) == 0) t->mode = st.st_mode & 0777;
  if (fd >= 0) close(fd);
  if (fd < 0) {
    char path[sizeof t->path];
    memcpy(path, t->path, sizeof path);
    free(t->ev);
    free(t->steps);
    free(t);
    return brg__error(err, BRG_ERR_INVALID_ARGUMENT, "init",
                      "BRIGADE_TRACE_FILE=%.64s%s: cannot write the trace %.200s%s: %s", pattern,
                      strlen(pattern) > 64 ? "..." : "", path, strlen(path) > 200 ? "..." : "",
                      why);
  }
  t->offset_ns = off;
  t->offset_err_ns = off_err;
  struct timespec rt;
  clock_gettime(CLOCK_REALTIME, &rt);
  t->mono_base_ns = brg__now_ns();
  t->real_base_ns = (int64_t)rt.tv_sec * 1000000000 + rt.tv_nsec;
  c->trace = t;
  BRG__INFO("init", "tracing to %s (%llu events, clock offset %lld ns +- %lld ns)", t->path,
            (unsigned long long)t->cap, (long long)off, (long long)off_err);
  return BRG_SUCCESS;
}

static trace_ev *ev_new(brg__trace *t) {
  trace_ev *e = &t->ev[t->n % t->cap];
  t->n++;
  return e;
}

brg_status brg__trace_run(brg_comm *c, brg__coll *k, brg_status (*body)(brg_comm *, brg__coll *)) {
  if (__builtin_expect(c->trace == NULL, 1)) return body(c, k);
  int64_t t0 = brg__trace_coll_begin(c->trace);
  brg_status s = body(c, k);
  brg__trace_coll_end(c, k, t0, s);
  return s;
}

int64_t brg__trace_coll_begin(brg__trace *t) {
  t->nsteps = t->max_steps;
  memset(t->steps, 0, (size_t)t->nsteps * sizeof *t->steps);
  t->last_ns = brg__now_ns();
  return t->last_ns;
}

void brg__trace_coll_end(brg_comm *c, const brg__coll *k, int64_t t0, brg_status s) {
  brg__trace *t = c->trace;
  int64_t t1 = brg__now_ns();
  for (int i = 0; i < t->nsteps; i++) {
    const trace_step *st = &t->steps[i];
    if (!st->slices) continue;
    trace_ev *e = ev_new(t);
    *e = (trace_ev){.type = EV_STEP,
                    .t0 = st->t0,
                    .t1 = st->t1,
                    .seq = k->seq,
                    .bytes = st->bytes,
                    .elem = st->slices,
                    .step = i,
                    .chunk = st->chunk,
                    .what = (uint8_t)st->prim};
  }
  size_t esize = brg_dtype_size(k->dtype);
  uint64_t bytes = (uint64_t)k->count * esize;
  if (k->kind == BRG__COLL_ALL_GATHER || k->kind == BRG__COLL_REDUCE_SCATTER)
    bytes *= (uint64_t)c->nranks;
  trace_ev *e = ev_new(t);
  *e = (trace_ev){.type = EV_COLL,
                  .t0 = t0,
                  .t1 = t1,
                  .seq = k->seq,
                  .bytes = bytes,
                  .elem = k->count,
                  .what = (uint8_t)k->kind,
                  .dtype = (uint8_t)k->dtype,
                  .op = (uint8_t)k->op,
                  .root = (int16_t)k->root,
                  .chunk = k->device,
                  .status = (int16_t)s};
}

/* A slice begins where the one before it ended (or its collective began):
 * one clock read per slice, not two, since a read can cost hundreds of ns
 * on a virtual machine. The loop's bookkeeping between slices counts as
 * the next slice's work. */
int64_t brg__trace_slice_begin(brg__trace *t) {
  t->wait_ns = 0;
  t->wait_send_ns = 0;
  return t->last_ns;
}

void brg__trace_slice(brg_comm *c, uint64_t seq, int chunk, size_t elem, size_t slice,
                      brg__prim prim, uint64_t bytes, int64_t t0, brg_status s) {
  brg__trace *t = c->trace;
  int64_t t1 = brg__now_ns();
  t->last_ns = t1;
  int step = c->ring.cur_step;
  if (step >= 0 && step < t->nsteps) {
    trace_step *st = &t->steps[step];
    if (!st->slices) {
      st->t0 = t0;
      st->chunk = chunk;
      st->prim = prim;
    }
    st->t1 = t1;
    st->slices++;
    st->bytes += bytes;
  }
  trace_ev *e = ev_new(t);
  *e = (trace_ev){.type = EV_SLICE,
                  .t0 = t0,
                  .t1 = t1,
                  .seq = seq,
                  .bytes = bytes,
                  .elem = elem,
                  .wait_ns = t->wait_ns,
                  .wait_send_ns = t->wait_send_ns,
                  .step = step,
                  .chunk = chunk,
                  .slice = (int32_t)slice,
                  .what = (uint8_t)prim,
                  .status = (int16_t)s};
}

void brg__trace_wait(brg_comm *c, int peer, int send, int64_t t0) {
  brg__trace *t = c->trace;
  int64_t t1 = brg__now_ns();
  if (send)
    t->wait_send_ns += t1 - t0;
  else
    t->wait_ns += t1 - t0;
  trace_ev *e = ev_new(t);
  *e = (trace_ev){.type = EV_WAIT,
                  .t0 = t0,
                  .t1 = t1,
                  .seq = c->ring.cur ? c->ring.cur->seq : 0,
                  .step = c->ring.cur_step,
                  .slice = peer,
                  .what = (uint8_t)send};
}

void brg__trace_lat(brg_comm *c, int what, int peer, uint64_t bytes, int phase, int round, int tree,
                    int64_t t0, int64_t t1, int64_t data_ns) {
  brg__trace *t = c->trace;
  trace_ev *e = ev_new(t);
  *e = (trace_ev){.type = EV_LAT,
                  .t0 = t0,
                  .t1 = t1 > t0 ? t1 : t0,
                  .seq = c->ring.cur ? c->ring.cur->seq : 0,
                  .bytes = bytes,
                  .wait_ns = data_ns,
                  .step = round,
                  .chunk = tree,
                  .slice = peer,
                  .what = (uint8_t)what,
                  .root = (int16_t)phase};
}

/* Microseconds with nanosecond digits, on the reference clock. */
static void put_us(FILE *f, const char *key, int64_t ns) {
  int neg = ns < 0;
  uint64_t a = neg ? (uint64_t)(-ns) : (uint64_t)ns;
  fprintf(f, "\"%s\":%s%llu.%03llu", key, neg ? "-" : "", (unsigned long long)(a / 1000),
          (unsigned long long)(a % 1000));
}

static void put_span(FILE *f, const brg__trace *t, const char *ph, int rank, int tid, int64_t t0,
                     int64_t t1) {
  fprintf(f, "{\"ph\":\"%s\",\"pid\":%d,\"tid\":%d,", ph, rank, tid);
  put_us(f, "ts", t0 + t->offset_ns);
  if (t1 >= t0) {
    fputc(',', f);
    put_us(f, "dur", t1 - t0);
  }
}

static void put_event(FILE *f, const brg__trace *t, const trace_ev *e, const brg_comm *c) {
  int r = c->rank;
  switch (e->type) {
  case EV_COLL: {
    const char *dn = brg_dtype_name((brg_dtype)e->dtype), *on = brg_op_name((brg_op)e->op);
    const char *kn = brg__coll_name((brg__coll_kind)e->what);
    put_span(f, t, "X", r, 0, e->t0, e->t1);
    fprintf(f,
            ",\"cat\":\"collective\",\"name\":\"%s #%llu\",\"args\":{\"seq\":%llu,\"kind\":\"%s\","
            "\"count\":%llu,\"dtype\":\"%s\",\"op\":\"%s\",\"root\":%d,\"bytes\":%llu,"
            "\"device\":%d,\"status\":\"%s\"}}",
            kn, (unsigned long long)e->seq, (unsigned long long)e->seq, kn,
            (unsigned long long)e->elem, dn ? dn : "?", on ? on : "-", e->root,
            (unsigned long long)e->bytes, e->chunk, brg_status_string((brg_status)e->status));
    break;
  }
  case EV_STEP:
    for (int end = 0; end < 2; end++) {
      put_span(f, t, end ? "e" : "b", r, 0, end ? e->t1 : e->t0, -1);
      fprintf(f, ",\"cat\":\"step\",\"id2\":{\"local\":\"step %d\"},\"name\":\"step %d %s\"",
              e->step, e->step, brg__prim_name((brg__prim)e->what));
      if (!end)
        fprintf(f,
                ",\"args\":{\"seq\":%llu,\"step\":%d,\"chunk\":%d,\"prim\":\"%s\",\"bytes\":%llu,"
                "\"slices\":%llu}",
                (unsigned long long)e->seq, e->step, e->chunk, brg__prim_name((brg__prim)e->what),
                (unsigned long long)e->bytes, (unsigned long long)e->elem);
      fputs(end ? "}" : "},\n", f);
    }
    break;
  case EV_SLICE: {
    brg__prim p = (brg__prim)e->what;
    put_span(f, t, "X", r, 1, e->t0, e->t1);
    fprintf(f,
            ",\"cat\":\"slice\",\"name\":\"%s\",\"args\":{\"seq\":%llu,\"step\":%d,\"chunk\":%d,"
            "\"slice\":%d,\"prim\":\"%s\",\"bytes\":%llu,\"elem\":%llu,\"recv_from\":%d,"
            "\"send_to\":%d,",
            brg__prim_name((brg__prim)p), (unsigned long long)e->seq, e->step, e->chunk, e->slice,
            brg__prim_name((brg__prim)p), (unsigned long long)e->bytes, (unsigned long long)e->elem,
            brg__prim_recvs(p) ? c->ring.prev : -1, brg__prim_sends(p) ? c->ring.next : -1);
    put_us(f, "wait_recv_us", e->wait_ns);
    fputc(',', f);
    put_us(f, "wait_send_us", e->wait_send_ns);
    fprintf(f, ",\"status\":\"%s\"}}", brg_status_string((brg_status)e->status));
    break;
  }
  case EV_LAT: {
    static const char *const whats[] = {"recv", "send", "reduce"};
    static const char *const phases[] = {"up",       "down",   "fold", "halving",
                                         "doubling", "unfold", "swap"};
    const char *w = e->what < 3 ? whats[e->what] : "?";
    const char *ph = e->root >= 0 && e->root < 7 ? phases[e->root] : "?";
    put_span(f, t, "X", r, 1, e->t0, e->t1);
    if (e->what == 2)
      fprintf(f, ",\"cat\":\"msg\",\"name\":\"reduce %s\",", ph);
    else
      fprintf(f, ",\"cat\":\"msg\",\"name\":\"%s %s rank %d\",", w, e->what ? "to" : "from",
              e->slice);
    fprintf(f,
            "\"args\":{\"seq\":%llu,\"what\":\"%s\",\"peer\":%d,\"bytes\":%llu,\"phase\":\"%s\","
            "\"round\":%d,\"tree\":%d,",
            (unsigned long long)e->seq, w, e->what == 2 ? -1 : e->slice,
            (unsigned long long)e->bytes, ph, e->step, e->chunk);
    /* a receive's data landed at (its wait's end at the latest) */
    int64_t in = e->what == 0 && e->wait_ns > 0 && e->wait_ns < e->t1 ? e->wait_ns : e->t1;
    put_us(f, "data_us", in + t->offset_ns);
    fputs("}}", f);
    break;
  }
  case EV_WAIT:
    put_span(f, t, "X", r, 1, e->t0, e->t1);
    fprintf(f,
            ",\"cat\":\"wait\",\"name\":\"wait for rank %d\",\"args\":{\"seq\":%llu,\"step\":%d,"
            "\"peer\":%d,\"for\":\"%s\"}}",
            e->slice, (unsigned long long)e->seq, e->step, e->slice,
            e->what ? "free slot" : "data");
    break;
  }
}

/* Writes the events kept, oldest first, to a temporary file of a name
 * nobody could guess (mkstemp, in the trace's directory) renamed over the
 * trace, so that a reader never sees half a file and a planted link
 * receives nothing. */
static void trace_write(brg_comm *c) {
  brg__trace *t = c->trace;
  char tmp[sizeof t->path + 16];
  snprintf(tmp, sizeof tmp, "%s.XXXXXX", t->path);
  int fd = mkostemp(tmp, O_CLOEXEC);
  FILE *f = NULL;
  if (fd >= 0 && (fchmod(fd, t->mode ? t->mode : 0600) != 0 || !(f = fdopen(fd, "w")))) {
    int e = errno;
    close(fd);
    unlink(tmp);
    errno = e;
  }
  if (!f) {
    if (!t->writes_failed++)
      BRG__WARN("init", "trace: cannot write a temporary file beside %s: %s", t->path,
                strerror(errno));
    return;
  }
  int r = c->rank;
  fprintf(f, "{\"traceEvents\":[\n");
  fprintf(f,
          "{\"ph\":\"M\",\"pid\":%d,\"name\":\"process_name\",\"args\":{\"name\":\"rank %d "
          "(%s, pid %d)\"}},\n",
          r, r, c->peers[r].hostname, (int)getpid());
  fprintf(f,
          "{\"ph\":\"M\",\"pid\":%d,\"name\":\"process_sort_index\",\"args\":{\"sort_index\":"
          "%d}},\n",
          r, r);
  static const char *tracks[] = {"collectives", "slices"};
  for (int i = 0; i < 2; i++)
    fprintf(f,
            "{\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"name\":\"thread_name\",\"args\":{\"name\":"
            "\"%s\"}},\n",
            r, i, tracks[i]);
  uint64_t kept = t->n < t->cap ? t->n : t->cap;
  for (uint64_t i = t->n - kept; i < t->n; i++) {
    put_event(f, t, &t->ev[i % t->cap], c);
    fputs(",\n", f);
  }
  /* Ends the list without a trailing comma. */
  fprintf(f, "{\"ph\":\"M\",\"pid\":%d,\"name\":\"process_labels\",\"args\":{\"labels\":\"%s\"}}",
          r, c->peers[r].hostname);
  fprintf(f, "\n],\n\"displayTimeUnit\":\"ns\",\n\"metadata\":{\"brigade_trace\":1,");
  fprintf(f, "\"rank\":%d,\"nranks\":%d,\"pos\":%d,\"next\":%d,\"prev\":%d,\"ring\":[", r,
          c->nranks, c->ring.pos, c->ring.next, c->ring.prev);
  for (int i = 0; i < c->nranks; i++) fprintf(f, "%s%d", i ? "," : "", c->ring.order[i]);
  fprintf(f, "],\"host\":\"%s\",\"host_hash\":\"%016llx\",\"pid\":%d,\"comm_id\":\"%016llx\",",
          c->peers[r].hostname, (unsigned long long)c->peers[r].host_hash, (int)getpid(),
          (unsigned long long)c->comm_id);
  fprintf(f, "\"transport_send\":\"%s\",\"transport_recv\":\"%s\",\"slice_bytes\":%zu,",
          c->ring.send.ops ? c->ring.send.ops->name : "",
          c->ring.recv.ops ? c->ring.recv.ops->name : "", c->slice_bytes);
  fprintf(f, "\"clock\":\"CLOCK_MONOTONIC\",\"clock_ref_rank\":%d,", c->ring.order[0]);
  fprintf(f, "\"clock_offset_ns\":%lld,\"clock_offset_err_ns\":%lld,", (long long)t->offset_ns,
          (long long)t->offset_err_ns);
  fprintf(f, "\"monotonic_base_ns\":%lld,\"realtime_base_ns\":%lld,", (long long)t->mono_base_ns,
          (long long)t->real_base_ns);
  fprintf(f, "\"events\":%llu,\"events_kept\":%llu,\"events_dropped\":%llu}}\n",
          (unsigned long long)t->n, (unsigned long long)kept, (unsigned long long)(t->n - kept));
  int bad = ferror(f);
  /* What is at the path now must still be this user's own regular file (or
   * nothing): rename replaces a link planted since init rather than
   * following it, but a file of someone else's stays theirs. */
  char why[160] = "";
  int cur = open(t->path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  int ok = cur < 0 ? errno == ENOENT || errno == ELOOP : brg__own_file_ok(cur, why, sizeof why);
  if (cur >= 0) close(cur);
  if (fclose(f) != 0 || bad || !ok || rename(tmp, t->path) != 0) {
    if (!t->writes_failed++)
      BRG__WARN("init", "trace: writing %s failed%s%s", t->path, why[0] ? ": " : "", why);
    unlink(tmp);
  }
}

void brg__trace_flush(brg_comm *c) {
  if (c->trace) trace_write(c);
}

void brg__trace_close(brg_comm *c) {
  brg__trace *t = c->trace;
  if (!t) return;
  trace_write(c);
  c->trace = NULL;
  free(t->ev);
  free(t->steps);
  free(t);
}
