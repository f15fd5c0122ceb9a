/*
 * The one table of settings. Every BRIGADE_* variable the library reads is
 * listed in config.c with its default and help text; nothing else calls
 * getenv for a BRIGADE_ setting.
 */
#ifndef BRG_CONFIG_H
#define BRG_CONFIG_H

#include <stdint.h>
#include <stdio.h>
#include "brigade.h"
#include "log.h"

typedef enum {
  BRG__CFG_DEBUG,            /* WARN|INFO|TRACE */
  BRG__CFG_DEBUG_SUBSYS,     /* comma list */
  BRG__CFG_DEBUG_FILE,       /* path with %r %h %p */
  BRG__CFG_TIMEOUT_MS,       /* int */
  BRG__CFG_SLICE_BYTES,      /* size */
  BRG__CFG_STEPS,            /* int, FIFO slots per connection */
  BRG__CFG_TRANSPORTS,       /* comma list of transport names, empty = all */
  BRG__CFG_BOOTSTRAP_ADDR,   /* address this rank advertises; empty = auto */
  BRG__CFG_SOCKET_IFNAME,    /* interface to take the address from; empty = auto */
  BRG__CFG_SPIN,             /* int, busy polls before yielding */
  BRG__CFG_TCP_SOCKBUF,      /* size, SO_SNDBUF/SO_RCVBUF for tcp; 0 = kernel default */
  BRG__CFG_TCP_NSOCKS,       /* int, sockets per tcp link */
  BRG__CFG_SECRET,           /* job secret for brg_comm_init_env (hex); empty = derived */
  BRG__CFG_IB_BACKEND,       /* auto|verbs|soft */
  BRG__CFG_IB_HCA,
  BRG__CFG_IB_GID_INDEX,
  BRG__CFG_IB_QPS_PER_LINK,
  BRG__CFG_IB_TIMEOUT,
  BRG__CFG_IB_RETRY_CNT,
  BRG__CFG_IB_ALLOW_LOCAL,   /* int 0|1, let ibverbs link ranks of one host (tests) */
  BRG__CFG_SMALL_BYTES,      /* size: allreduce at or below this gathers then reduces */
  BRG__CFG_STREAM_BYTES,     /* size: collectives this large write outputs with NT stores */
  BRG__CFG_DEVICE_SLICE_BYTES, /* size: bytes per slot of a device (GPU) FIFO */
  BRG__CFG_CUDA_MODULE,      /* path of the CUDA module; empty = search */
  BRG__CFG_IB_GDR,           /* int 0|1: GPU memory straight on the network (GPUDirect RDMA) */
  BRG__CFG_COUNT
} brg__cfg_id;

typedef enum { BRG__CFG_KIND_STRING, BRG__CFG_KIND_INT, BRG__CFG_KIND_SIZE } brg__cfg_kind;

typedef struct brg__cfg_entry {
  const char *name;    /* environment variable */
  brg__cfg_kind kind;
  const char *defval;
  int64_t min, max;    /* bounds for INT and SIZE */
  const char *help;
} brg__cfg_entry;

extern const brg__cfg_entry brg__cfg_table[BRG__CFG_COUNT];

/* Reads every variable of the table from the environment and checks it. The
 * first call does the work; later calls return its result. A value that does
 * not parse or is out of bounds is an error naming the variable. */
brg_status brg__config_load(brg__errbuf *err);

/* Values after a successful load (defaults before). */
int64_t brg__config_int(brg__cfg_id id);
const char *brg__config_str(brg__cfg_id id);
/* Where the value came from: 1 when set in the environment, 0 for the default. */
int brg__config_is_set(brg__cfg_id id);

/* Parsers, exposed for unit tests. "64K", "1M", "2G", plain bytes; an int
 * with optional sign. Both reject trailing junk, empty strings and overflow. */
brg_status brg__config_parse_size(const char *s, int64_t *out);
brg_status brg__config_parse_int(const char *s, int64_t *out);

/* Prints the table: name, value, default, help. */
void brg__config_print(FILE *f);

#endif
