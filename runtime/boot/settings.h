/*
 * The runtime's settings, and the one table of every section.
 *
 * The runtime owns three sections, "core" (the ring and its communicator),
 * "device" (device collectives) and "trace" (trace.c); the log and each
 * transport own theirs. The table is those sections in a fixed order: log,
 * core, device, trace, then one per transport of brg__transports[] that has
 * settings.
 */
#ifndef BRG_SETTINGS_H
#define BRG_SETTINGS_H

#include <stdio.h>

#include "config.h"

/* The most bytes of one host FIFO (BRIGADE_SLICE_BYTES x BRIGADE_STEPS):
 * 64M x 16, 16M x 64. */
#define BRG__FIFO_MAX_BYTES ((int64_t)1 << 30)

typedef enum {
  BRG__CORE_TIMEOUT_MS,     /* int */
  BRG__CORE_SLICE_BYTES,    /* size: the pipeline unit, bytes per FIFO slot */
  BRG__CORE_STEPS,          /* int, FIFO slots per connection */
  BRG__CORE_TRANSPORTS,     /* comma list of transport names, empty = all */
  BRG__CORE_BOOTSTRAP_ADDR, /* address this rank advertises; empty = auto */
  BRG__CORE_SOCKET_IFNAME,  /* interface to take the address from; empty = auto */
  BRG__CORE_SPIN,           /* int, busy polls before yielding */
  BRG__CORE_SECRET,         /* job secret for brg_comm_init_env (hex); empty = derived */
  BRG__CORE_SMALL_BYTES,    /* size: allreduce at or below this gathers then reduces */
  BRG__CORE_STREAM_BYTES,   /* size: collectives this large write outputs with NT stores */
  BRG__CORE_PORT,           /* int: rendezvous port of brg_comm_init_env; 0 = from MASTER_PORT */
  BRG__CORE_SILENT_MS,      /* int: BRIGADE_SILENT_TIMEOUT_MS; 0 = off */
  BRG__CORE_ALGO,           /* allreduce algorithm: ring | hier | auto (hier.c) */
  BRG__CORE_RINGS,          /* int: rings an allreduce is cut over; 0 = automatic */
  BRG__CORE_P2P_EARLY,      /* size: bytes kept for point-to-point receives not yet posted */
  BRG__CORE_HIER_PIECES,    /* int: pieces hier's phases overlap over; 0 = automatic */
  BRG__CORE_MODEL_FILE,     /* path of the cost model's links (model.c); empty = built in */
  BRG__CORE_RHD_DOUBLING,   /* string auto|size: rhd by recursive doubling alone up to this */
  BRG__CORE_COUNT
} brg__core_cfg_id;

typedef enum {
  BRG__DEVICE_SLICE_BYTES, /* size: the pipeline unit of device collectives */
  BRG__DEVICE_CUDA_MODULE, /* path of the CUDA module; empty = search */
  BRG__DEVICE_IB_GDR,      /* int 0|1: GPU memory straight on the network (GPUDirect RDMA) */
  BRG__DEVICE_BLOCKS,      /* int: most thread blocks of one kernel launch */
  BRG__DEVICE_PROXY,       /* int -1|0|1: the host side on the communicator's thread */
  BRG__DEVICE_MODE,        /* string auto|kernel|step: one kernel per collective, or per step */
  BRG__DEVICE_CHANNELS,    /* int: kernel mode's thread blocks (channels); 0 = automatic */
  BRG__DEVICE_SMALL_BYTES, /* size: kernel mode's one-shot allreduce up to this; 0 = off */
  BRG__DEVICE_LL_BYTES,    /* string auto|size: its LL form up to this; 0 = off */
  BRG__DEVICE_DIRECT,      /* size: the two-shot allreduce up to this; 0 = off */
  BRG__DEVICE_RING_LL,     /* string auto|size: the ring's LL form up to this; 0 = off */
  BRG__DEVICE_COUNT
} brg__device_cfg_id;

typedef enum {
  BRG__TRACE_FILE,   /* path pattern of the per-rank trace; empty = off */
  BRG__TRACE_EVENTS, /* int: events kept per rank (a ring buffer) */
  BRG__TRACE_COUNT
} brg__trace_cfg_id;

extern brg__cfg_section brg__core_config;
extern brg__cfg_section brg__device_config;
extern brg__cfg_section brg__trace_config;

static inline int64_t brg__core_int(brg__core_cfg_id id) {
  return brg__config_int(&brg__core_config, id);
}
static inline const char *brg__core_str(brg__core_cfg_id id) {
  return brg__config_str(&brg__core_config, id);
}
static inline int64_t brg__device_int(brg__device_cfg_id id) {
  return brg__config_int(&brg__device_config, id);
}
static inline const char *brg__device_str(brg__device_cfg_id id) {
  return brg__config_str(&brg__device_config, id);
}

#define BRG__SETTINGS_MAX_SECTIONS 16

/* The sections of the table, in order; returns how many (at most max). */
int brg__settings_sections(brg__cfg_section **out, int max);

/* The entry of a variable in any section (loaded), or NULL. */
const brg__cfg_entry *brg__settings_find(const char *name);

/* 1 when no other host could reach this one at that address (the
 * unspecified address, broadcast, multicast). */
struct sockaddr;
int brg__addr_unusable(const struct sockaddr *sa);

/* Loads every section; the first bad value is the error. */
brg_status brg__settings_load(brg__errbuf *err);

/* Prints every section as one table: name, value, default, help. */
void brg__settings_print(FILE *f);
/* Every setting as a Markdown table (docs/settings.md is this output). */
void brg__settings_print_markdown(FILE *f);

#endif
