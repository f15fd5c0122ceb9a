/*
 * Logging and error reporting.
 *
 * BRIGADE_DEBUG=WARN|INFO|TRACE sets the level, BRIGADE_DEBUG_SUBSYS a
 * comma-separated list of subsystems to show (default all), and
 * BRIGADE_DEBUG_FILE a file name where %r becomes the rank, %h the host name
 * and %p the process id. Lines look like
 *   host:pid:rank brigade INFO [ring] text
 */
#ifndef BRG_LOG_H
#define BRG_LOG_H

#include <stdarg.h>
#include <stddef.h>
#include "brigade.h"
#include "status.h"

/* The subsystems lines are logged under. */
#define BRG__LOG_SUBSYSTEMS "init,bootstrap,ring,coll,shm,tcp,ib"

enum { BRG__LOG_NONE = 0, BRG__LOG_WARN = 1, BRG__LOG_INFO = 2, BRG__LOG_TRACE = 3 };

extern int brg__log_level; /* set from BRIGADE_DEBUG on first use; NONE until then */

void brg__log_init(void); /* idempotent; reads the log's settings */
/* Checks BRIGADE_DEBUG_SUBSYS: every name one of BRG__LOG_SUBSYSTEMS. */
brg_status brg__log_check(brg__errbuf *err);
/* The log's settings (BRIGADE_DEBUG*), a section of the one settings table. */
extern struct brg__cfg_section brg__log_config;
/* The rank lines are labelled with: this thread's, else the process's
 * (the last rank created in it). set_rank sets both; a thread that works
 * for one rank (a progress or proxy thread) sets its own. */
void brg__log_set_rank(int rank);
void brg__log_set_thread_rank(int rank);
int brg__log_thread_rank(void);
int brg__log_enabled(int level, const char *subsys);
/* Expands %r (rank), %h (host) and %p (pid) in a file name pattern, as for
 * BRIGADE_DEBUG_FILE (also BRIGADE_TRACE_FILE). */
void brg__log_expand_path(char *out, size_t n, const char *pattern, int rank);
/* Opens a file brigade writes on the user's behalf (the debug log, a
 * trace) so that nobody else can turn it into an attack: a symbolic link
 * is never followed (O_NOFOLLOW), a new file is made with mode 0644 less
 * the umask, and an existing one is taken only when it is a regular file
 * owned by this user (or the null device); a path ending in '/' is an
 * error. Nothing is truncated. Returns the descriptor (O_CLOEXEC; O_APPEND
 * with append), or -1 with the reason in why ("is a symbolic link"). */
int brg__open_own_file(const char *path, int append, char *why, size_t why_bytes);
/* Whether fd is a file brg__open_own_file would take (why as there). */
int brg__own_file_ok(int fd, char *why, size_t why_bytes);
void brg__log(int level, const char *subsys, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define BRG__LOG_AT(level, subsys, ...)                                                            \
  do {                                                                                             \
    if (brg__log_level >= (level) && brg__log_enabled((level), (subsys)))                          \
      brg__log((level), (subsys), __VA_ARGS__);                                                    \
  } while (0)
#define BRG__WARN(subsys, ...) BRG__LOG_AT(BRG__LOG_WARN, subsys, __VA_ARGS__)
#define BRG__INFO(subsys, ...) BRG__LOG_AT(BRG__LOG_INFO, subsys, __VA_ARGS__)
#define BRG__TRACE(subsys, ...) BRG__LOG_AT(BRG__LOG_TRACE, subsys, __VA_ARGS__)

/* Formats the message into `eb` (when not NULL), logs it at WARN under
 * `subsys`, and returns `status`, so error paths read
 *   return brg__error(err, BRG_ERR_SYSTEM, "tcp", "connect %s: %s", a, strerror(errno)); */
brg_status brg__error(brg__errbuf *eb, brg_status status, const char *subsys, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* The message of the last failure on this thread that had no communicator
 * to hold it (what brg_comm_last_error(NULL) returns). */
void brg__set_thread_error(const char *msg);
const char *brg__thread_error(void);

#endif
