/*
 * Launchers that give no MASTER_ADDR and MASTER_PORT (launch.h).
 *
 * Slurm: every task of a step knows the step's node list and the job's
 * and step's ids, so every task computes the same rendezvous: the first
 * node of the list (where srun's block and cyclic distributions place
 * task 0) and a port derived from the two ids. Only srun's tasks (a
 * numeric step id): a batch script's own process is no step's task.
 *
 * PMIx: the server runs a key-value store for its tasks; rank 0 puts its
 * root's id there, every task fences, the others get it. libpmix is
 * opened with dlopen, so brigade neither needs its headers nor depends on
 * it: what is used of its ABI (stable since PMIx 2) is declared here.
 */
#include "launch.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* ---- Slurm ---------------------------------------------------------------- */

int brg__slurm_first_host(const char *list, char *host, size_t host_bytes, brg__errbuf *err) {
  size_t o = 0;
  const char *p = list;
  while (*p == ' ') p++;
  if (!*p || *p == ',') goto bad;
  /* the first entry: up to a comma outside brackets; each bracket gives
   * its first number ("[01-04,07]" -> "01") */
  while (*p && *p != ',') {
    if (*p == '[') {
      p++;
      const char *start = p;
      while (*p >= '0' && *p <= '9') p++;
      if (p == start || (*p != '-' && *p != ',' && *p != ']')) goto bad;
      for (const char *q = start; q < p; q++) {
        if (o + 1 >= host_bytes) goto bad;
        host[o++] = *q;
      }
      while (*p && *p != ']') p++;
      if (*p != ']') goto bad;
      p++;
      continue;
    }
    if (*p == ']' || *p == ' ' || o + 1 >= host_bytes) goto bad;
    host[o++] = *p++;
  }
  if (o == 0) goto bad;
  host[o] = 0;
  return 0;
bad:
  if (host_bytes) host[0] = 0;
  brg__error_quiet(err, BRG_ERR_INVALID_ARGUMENT,
                   "the Slurm node list \"%.200s\" is not a host list (\"node[01-04,07],gpu3\")",
                   list);
  return -1;
}

int brg__slurm_port(unsigned long job, unsigned long step) {
  return 12000 + (int)(((job % 20000) * 100 + step % 100) % 20000);
}

/* A Slurm id: a number. */
static int slurm_id(const char *name, unsigned long *out, brg__errbuf *err) {
  const char *v = getenv(name);
  char *end;
  errno = 0;
  unsigned long x = v ? strtoul(v, &end, 10) : 0;
  if (!v || !*v || errno || *end) {
    brg__error_quiet(err, BRG_ERR_INVALID_ARGUMENT, "%s=\"%.40s\" is not a Slurm id", name,
                     v ? v : "");
    return -1;
  }
  *out = x;
  return 0;
}

int brg__slurm_rendezvous(char *host, size_t host_bytes, int *port, char *from, size_t from_bytes,
                          brg__errbuf *err) {
  static const char *const lists[] = {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST",
                                      NULL};
  const char *job = getenv("SLURM_JOB_ID"), *list = NULL, *list_name = NULL;
  if (!job || !*job) job = getenv("SLURM_JOBID");
  for (int i = 0; lists[i] && !list; i++) {
    const char *v = getenv(lists[i]);
    if (v && *v) list = v, list_name = lists[i];
  }
  const char *step_name = getenv("SLURM_STEP_ID")  ? "SLURM_STEP_ID"
                          : getenv("SLURM_STEPID") ? "SLURM_STEPID"
                                                   : NULL;
  /* Only srun's tasks: a batch script's own process (no step id, or the
   * "batch" step) is not one of a step's tasks, and would wait for the
   * others in vain */
  const char *step = step_name ? getenv(step_name) : NULL;
  if (!job || !*job || !list || !step || *step < '0' || *step > '9') return 0;
  unsigned long job_id = 0, step_id = 0;
  const char *job_name =
      getenv("SLURM_JOB_ID") && *getenv("SLURM_JOB_ID") ? "SLURM_JOB_ID" : "SLURM_JOBID";
  if (slurm_id(job_name, &job_id, err) < 0) return -1;
  if (slurm_id(step_name, &step_id, err) < 0) return -1;
  if (brg__slurm_first_host(list, host, host_bytes, err) < 0) return -1;
  *port = brg__slurm_port(job_id, step_id);
  snprintf(from, from_bytes, "the first node of %s and a port from %s=%lu, %s=%lu", list_name,
           job_name, job_id, step_name ? step_name : "step", step_id);
  return 1;
}

/* ---- PMIx ----------------------------------------------------------------- */

/* What brigade uses of PMIx's ABI (pmix_common.h, PMIx 2 and later). */
#define PMIX_MAX_NSLEN 255
#define PMIX_SUCCESS 0
#define PMIX_STRING 3
#define PMIX_GLOBAL 3
typedef struct pmix_proc {
  char nspace[PMIX_MAX_NSLEN + 1];
  uint32_t rank;
} pmix_proc_t;
/* pmix_value_t: a uint16_t type, then an 8-aligned union whose largest
 * member is under 64 bytes; brigade sets and reads its string only. */
typedef struct pmix_value {
  uint16_t type;
  union {
    char *string;
    char room[64];
  } data;
} pmix_value_t;

static struct {
  void *lib;
  int (*init)(pmix_proc_t *proc, void *info, size_t ninfo);
  int (*end)(const void *info, size_t ninfo); /* PMIx_Finalize */
  int (*put)(uint8_t scope, const char *key, pmix_value_t *val);
  int (*commit)(void);
  int (*fence)(const pmix_proc_t *procs, size_t nprocs, const void *info, size_t ninfo);
  int (*get)(const pmix_proc_t *proc, const char *key, const void *info, size_t ninfo,
             pmix_value_t **val);
  const char *(*error_string)(int status);
  pmix_proc_t me;
} px;

#define PMIX_KEY "brigade.root"

int brg__pmix_present(void) {
  const char *ns = getenv("PMIX_NAMESPACE");
  return ns && *ns;
}

static const char *pmix_why(int st) {
  return px.error_string ? px.error_string(st) : "?";
}

int brg__pmix_start(int *rank, brg__errbuf *err) {
  static const char *const names[] = {"libpmix.so.2", "libpmix.so", NULL};
  char tried[256] = "";
  for (int i = 0; names[i] && !px.lib; i++) {
    px.lib = dlopen(names[i], RTLD_NOW | RTLD_GLOBAL);
    if (!px.lib) snprintf(tried, sizeof tried, "%s", dlerror());
  }
  if (!px.lib) {
    brg__error_quiet(err, BRG_ERR_UNAVAILABLE,
                     "PMIX_NAMESPACE is set but libpmix cannot be opened (%s); set MASTER_ADDR "
                     "and MASTER_PORT instead",
                     tried);
    return -1;
  }
  *(void **)&px.init = dlsym(px.lib, "PMIx_Init");
  *(void **)&px.end = dlsym(px.lib, "PMIx_Finalize");
  *(void **)&px.put = dlsym(px.lib, "PMIx_Put");
  *(void **)&px.commit = dlsym(px.lib, "PMIx_Commit");
  *(void **)&px.fence = dlsym(px.lib, "PMIx_Fence");
  *(void **)&px.get = dlsym(px.lib, "PMIx_Get");
  *(void **)&px.error_string = dlsym(px.lib, "PMIx_Error_string");
  if (!px.init || !px.end || !px.put || !px.commit || !px.fence || !px.get) {
    brg__error_quiet(err, BRG_ERR_UNAVAILABLE,
                     "libpmix lacks PMIx_Init, PMIx_Put, PMIx_Commit, PMIx_Fence or PMIx_Get");
    return -1;
  }
  memset(&px.me, 0, sizeof px.me);
  int st = px.init(&px.me, NULL, 0);
  if (st != PMIX_SUCCESS) {
    brg__error_quiet(err, BRG_ERR_SYSTEM, "PMIx_Init failed: %s (%d)", pmix_why(st), st);
    return -1;
  }
  *rank = (int)px.me.rank;
  return 0;
}

int brg__pmix_share(int rank, char *value, size_t value_bytes, brg__errbuf *err) {
  int st = PMIX_SUCCESS;
  const char *what = "PMIx_Put";
  if (rank == 0) {
    pmix_value_t v;
    memset(&v, 0, sizeof v);
    v.type = PMIX_STRING;
    v.data.string = value;
    st = px.put(PMIX_GLOBAL, PMIX_KEY, &v);
  }
  if (st == PMIX_SUCCESS) what = "PMIx_Commit", st = px.commit();
  if (st == PMIX_SUCCESS) what = "PMIx_Fence", st = px.fence(NULL, 0, NULL, 0);
  if (st == PMIX_SUCCESS && rank != 0) {
    pmix_proc_t root = px.me;
    root.rank = 0;
    pmix_value_t *got = NULL;
    what = "PMIx_Get of rank 0's " PMIX_KEY;
    st = px.get(&root, PMIX_KEY, NULL, 0, &got);
    if (st == PMIX_SUCCESS && (!got || got->type != PMIX_STRING || !got->data.string)) st = -1;
    if (st == PMIX_SUCCESS) snprintf(value, value_bytes, "%s", got->data.string);
    /* What PMIX_VALUE_RELEASE does for a string (pmix_free is free): the
     * string, then the value. Another type (never here) is left. */
    if (got && got->type == PMIX_STRING) {
      free(got->data.string);
      free(got);
    }
  }
  px.end(NULL, 0);
  if (st == PMIX_SUCCESS) return 0;
  brg__error_quiet(err, BRG_ERR_SYSTEM, "%s failed: %s (%d)", what,
                   st == -1 ? "not a string" : pmix_why(st), st);
  return -1;
}
