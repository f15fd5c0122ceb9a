/*
 * Traces: what every rank did in time, as Chrome trace event JSON (the
 * format Perfetto and chrome://tracing open), one file per rank.
 *
 * BRIGADE_TRACE_FILE names the file (%r rank, %h host, %p pid, as in
 * BRIGADE_DEBUG_FILE). The engine records one span per collective, per
 * step and per slice, and the time a slice spent waiting for a neighbour
 * as a span of its own inside the slice. Events go into a ring buffer of
 * BRIGADE_TRACE_EVENTS entries made and touched at init (the newest win
 * when it is full); the file is written at destroy and when a collective
 * fails. With tracing off, the engine's only cost is a test of c->trace.
 * Device collectives are traced from the host: a slice's span is the time
 * its slots were handed over and its kernel enqueued, not when it ran.
 *
 * Timestamps are CLOCK_MONOTONIC, which every process of one host shares,
 * plus an offset to the clock of the rank at ring position 0, measured at
 * init by a ping-pong over the ring sockets between neighbours on
 * different hosts (0 on one host). Each file's metadata holds the offset,
 * its error bound, the host, and a CLOCK_REALTIME base.
 */
#ifndef BRG_TRACE_H
#define BRG_TRACE_H

#include <stdint.h>

#include "internal.h"
#include "schedule.h"

typedef struct brg__trace brg__trace;

/* 1 when BRIGADE_TRACE_FILE is set for this process. */
int brg__trace_wanted(void);

/* After the ring is connected: measures this rank's clock offset (every rank
 * takes part when any rank traces, `any`), then, when this rank traces,
 * makes c->trace. */
brg_status brg__trace_open(brg_comm *c, int any, brg__errbuf *err);
/* Writes the file (again: the newest events win) and keeps recording. */
void brg__trace_flush(brg_comm *c);
/* Writes the file and frees the trace. */
void brg__trace_close(brg_comm *c);

/* Runs body(c, k), as one collective in c's trace when c has one. */
brg_status brg__trace_run(brg_comm *c, brg__coll *k, brg_status (*body)(brg_comm *, brg__coll *));

/* The engine's hooks, called only when c->trace is set. */
int64_t brg__trace_coll_begin(brg__trace *t);
void brg__trace_coll_end(brg_comm *c, const brg__coll *k, int64_t t0, brg_status s);
int64_t brg__trace_slice_begin(brg__trace *t);
/* A slice of collective `seq` ended: its chunk, its first element and its
 * index in the chunk, as the engine walks it (ring_link.h's
 * brg__trace_slice_end hands them over). */
void brg__trace_slice(brg_comm *c, uint64_t seq, int chunk, size_t elem, size_t slice,
                      brg__prim prim, uint64_t bytes, int64_t t0, brg_status s);
/* A wait that began at t0 and ends now: for a slot from `peer` (send 0)
 * or for a free slot at `peer` (send 1). */
void brg__trace_wait(brg_comm *c, int peer, int send, int64_t t0);

/* The phases of a latency-bound allreduce's messages (lat.c). */
enum {
  BRG__TRACE_UP,       /* tree: partial sums to the parent */
  BRG__TRACE_DOWN,     /* tree: the result to the children */
  BRG__TRACE_FOLD,     /* rhd: an extra rank's input to its partner */
  BRG__TRACE_HALVING,  /* rhd: reduce-scatter rounds */
  BRG__TRACE_DOUBLING, /* rhd: all-gather rounds */
  BRG__TRACE_UNFOLD,   /* rhd: the result back to the extra rank */
  BRG__TRACE_SWAP      /* rhd, small calls: recursive doubling alone, whole buffers swapped and
                          added */
};
/* A message or reduction of a latency-bound allreduce: what 0 a receive
 * (t0 to t1 the wait for it, data_ns when its last byte landed), 1 a send
 * (t0 handed to the point-to-point links, t1 its last byte written), 2 a
 * reduction of `bytes`; with the rank it went to or came from, its phase,
 * its round (the tree's slice, rhd's round) and tree (0, 1, or -1). */
void brg__trace_lat(brg_comm *c, int what, int peer, uint64_t bytes, int phase, int round, int tree,
                    int64_t t0, int64_t t1, int64_t data_ns);

#endif
