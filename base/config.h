/*
 * Settings read from BRIGADE_* variables, in sections.
 *
 * Each part of brigade that has settings owns one section: a table of
 * entries (name, kind, default, bounds, help) in the file that reads them,
 * as providers and components contribute their parameters in libfabric and
 * UCX. The log's section is in log.c, the runtime's in runtime/boot/settings.c,
 * each transport's beside the transport. The runtime gathers every section
 * into the one table that is checked at init and that brigade-info prints;
 * nothing calls getenv for a BRIGADE_ setting outside a section.
 */
#ifndef BRG_CONFIG_H
#define BRG_CONFIG_H

#include <stdint.h>
#include <stdio.h>

#include "brigade.h"
#include "status.h"

typedef enum { BRG__CFG_KIND_STRING, BRG__CFG_KIND_INT, BRG__CFG_KIND_SIZE } brg__cfg_kind;

typedef struct brg__cfg_entry {
  const char *name; /* environment variable */
  brg__cfg_kind kind;
  const char *defval;
  int64_t min, max; /* bounds for INT and SIZE */
  const char *help;
  /* Filled when the section loads. */
  const char *value;
  int64_t ival;
  int is_set;
} brg__cfg_entry;

typedef struct brg__cfg_section {
  const char *name; /* "log", "core", "tcp", ... */
  brg__cfg_entry *entries;
  int count;
  int loaded; /* set once, under the config lock */
  brg_status status;
  brg__errbuf err;
} brg__cfg_section;

/* A section over a table of entries indexed by the owner's enum. */
#define BRG__CFG_SECTION(sname, table)                                                             \
  { .name = (sname), .entries = (table), .count = (int)(sizeof(table) / sizeof((table)[0])) }

#define BRG__KiB (1LL << 10)
#define BRG__MiB (1LL << 20)
#define BRG__GiB (1LL << 30)

/* Reads every variable of the section from the environment and checks it.
 * The first call does the work; later calls return its result. A value that
 * does not parse or is out of bounds is an error naming the variable, and
 * that entry keeps its default. */
brg_status brg__config_load(brg__cfg_section *s, brg__errbuf *err);

/* Values (after loading the section; defaults where a value was bad). */
int64_t brg__config_int(brg__cfg_section *s, int id);
const char *brg__config_str(brg__cfg_section *s, int id);
/* 1 when set in the environment, 0 for the default. */
int brg__config_is_set(brg__cfg_section *s, int id);

/* Parsers, exposed for unit tests. "64K", "1M", "2G", plain bytes; an int
 * with optional sign. Both reject trailing junk, empty strings and overflow. */
brg_status brg__config_parse_size(const char *s, int64_t *out);
brg_status brg__config_parse_int(const char *s, int64_t *out);

/* Prints the section's entries: name, value, default, help. */
void brg__config_print(brg__cfg_section *s, FILE *f);
/* The same as rows of a Markdown table (name, default, help and bounds),
 * from the table alone: the environment plays no part. */
void brg__config_print_markdown(const brg__cfg_section *s, FILE *f);

#endif
