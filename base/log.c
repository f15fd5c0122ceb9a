#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "log.h"

enum { LOG_CFG_DEBUG, LOG_CFG_DEBUG_SUBSYS, LOG_CFG_DEBUG_FILE, LOG_CFG_COUNT };

static brg__cfg_entry log_entries[LOG_CFG_COUNT] = {
    [LOG_CFG_DEBUG] = {"BRIGADE_DEBUG", BRG__CFG_KIND_STRING, "", 0, 0,
                       "log level: WARN, INFO or TRACE (empty: silent)"},
    [LOG_CFG_DEBUG_SUBSYS] = {"BRIGADE_DEBUG_SUBSYS", BRG__CFG_KIND_STRING, "", 0, 0,
                              "comma-separated subsystems to log (" BRG__LOG_SUBSYSTEMS
                              "); empty: all"},
    [LOG_CFG_DEBUG_FILE] = {"BRIGADE_DEBUG_FILE", BRG__CFG_KIND_STRING, "", 0, 0,
                            "log file instead of stderr; %r rank, %h host, %p pid"},
};

brg__cfg_section brg__log_config = BRG__CFG_SECTION("log", log_entries);

int brg__log_level = BRG__LOG_NONE;

static pthread_once_t log_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static FILE *log_file;                /* NULL until the first line: stderr or the opened file */
static int log_rank = -1;             /* the process's, for threads that set none */
static __thread int thread_rank = -1; /* the calling thread's: ranks may be threads */
static char log_host[64];
static char log_subsys[256]; /* ",ring,shm," or "" for all */

static void log_setup(void) {
  const char *lvl = brg__config_str(&brg__log_config, LOG_CFG_DEBUG);
  if (!strcasecmp(lvl, "WARN"))
    brg__log_level = BRG__LOG_WARN;
  else if (!strcasecmp(lvl, "INFO"))
    brg__log_level = BRG__LOG_INFO;
  else if (!strcasecmp(lvl, "TRACE"))
    brg__log_level = BRG__LOG_TRACE;
  else
    brg__log_level = BRG__LOG_NONE;
  const char *sub = brg__config_str(&brg__log_config, LOG_CFG_DEBUG_SUBSYS);
  if (sub[0] && strcasecmp(sub, "ALL") != 0) {
    snprintf(log_subsys, sizeof log_subsys, ",%s,", sub);
    for (char *p = log_subsys; *p; p++) *p = (char)tolower((unsigned char)*p);
  }
  gethostname(log_host, sizeof log_host - 1);
  char *dot = strchr(log_host, '.');
  if (dot) *dot = 0;
}

brg_status brg__log_check(brg__errbuf *err) {
  brg__config_load(&brg__log_config, NULL);
  const char *lvl = brg__config_str(&brg__log_config, LOG_CFG_DEBUG);
  if (lvl[0] && strcasecmp(lvl, "NONE") != 0 && strcasecmp(lvl, "WARN") != 0 &&
      strcasecmp(lvl, "INFO") != 0 && strcasecmp(lvl, "TRACE") != 0) {
    if (err) {
      snprintf(err->msg, sizeof err->msg,
               "BRIGADE_DEBUG=\"%.64s%s\" is not a log level; the levels are WARN, INFO and "
               "TRACE (NONE or empty: silent)",
               lvl, strlen(lvl) > 64 ? "..." : "");
      err->logged = 0;
    }
    return BRG_ERR_INVALID_ARGUMENT;
  }
  const char *sub = brg__config_str(&brg__log_config, LOG_CFG_DEBUG_SUBSYS);
  if (!sub[0] || !strcasecmp(sub, "ALL")) return BRG_SUCCESS;
  static const char valid[] = "," BRG__LOG_SUBSYSTEMS ",";
  for (const char *p = sub;;) {
    size_t len = strcspn(p, ",");
    char key[64];
    int ok = len > 0 && len + 2 < sizeof key;
    if (ok) {
      snprintf(key, sizeof key, ",%.*s,", (int)len, p);
      for (char *k = key; *k; k++) *k = (char)tolower((unsigned char)*k);
      ok = strstr(valid, key) != NULL;
    }
    if (!ok) {
      if (err) {
        snprintf(err->msg, sizeof err->msg,
                 "BRIGADE_DEBUG_SUBSYS=\"%.64s%s\": \"%.*s\" is not a subsystem; the "
                 "subsystems are " BRG__LOG_SUBSYSTEMS " (or all)",
                 sub, strlen(sub) > 64 ? "..." : "", (int)(len < 64 ? len : 64), p);
        err->logged = 0;
      }
      return BRG_ERR_INVALID_ARGUMENT;
    }
    if (!p[len]) return BRG_SUCCESS;
    p += len + 1;
  }
}

void brg__log_init(void) {
  brg__errbuf err;
  brg__config_load(&brg__log_config, &err); /* a bad value is reported at init */
  pthread_once(&log_once, log_setup);
}

void brg__log_set_rank(int rank) {
  brg__log_init();
  thread_rank = rank;
  pthread_mutex_lock(&log_lock);
  log_rank = rank;
  pthread_mutex_unlock(&log_lock);
}

void brg__log_set_thread_rank(int rank) {
  thread_rank = rank;
}

int brg__log_thread_rank(void) {
  return thread_rank;
}

int brg__log_enabled(int level, const char *subsys) {
  if (level > brg__log_level) return 0;
  if (level == BRG__LOG_WARN || !log_subsys[0]) return 1;
  char key[64];
  snprintf(key, sizeof key, ",%s,", subsys);
  return strstr(log_subsys, key) != NULL;
}

void brg__log_expand_path(char *out, size_t n, const char *pattern, int rank) {
  brg__log_init();
  size_t o = 0;
  for (const char *s = pattern; *s && o + 1 < n; s++) {
    if (s[0] == '%' && s[1]) {
      char tmp[80];
      switch (s[1]) {
      case 'r': snprintf(tmp, sizeof tmp, "%d", rank); break;
      case 'h': snprintf(tmp, sizeof tmp, "%s", log_host); break;
      case 'p': snprintf(tmp, sizeof tmp, "%d", (int)getpid()); break;
      default: snprintf(tmp, sizeof tmp, "%%%c", s[1]); break;
      }
      s++;
      o += (size_t)snprintf(out + o, n - o, "%s", tmp);
      if (o >= n) o = n - 1;
    } else {
      out[o++] = *s;
    }
  }
  out[o] = 0;
}

int brg__own_file_ok(int fd, char *why, size_t why_bytes) {
  struct stat st;
  if (fstat(fd, &st) != 0) {
    snprintf(why, why_bytes, "fstat: %s", strerror(errno));
    return 0;
  }
  if (S_ISCHR(st.st_mode) && st.st_rdev == makedev(1, 3)) return 1; /* /dev/null */
  if (!S_ISREG(st.st_mode)) {
    snprintf(why, why_bytes, "it exists and is not a regular file (a %s)",
             S_ISDIR(st.st_mode)    ? "directory"
             : S_ISFIFO(st.st_mode) ? "FIFO"
             : S_ISSOCK(st.st_mode) ? "socket"
             : S_ISCHR(st.st_mode)  ? "character device"
             : S_ISBLK(st.st_mode)  ? "block device"
                                    : "special file");
    return 0;
  }
  if (st.st_uid != geteuid()) {
    snprintf(why, why_bytes, "it exists and belongs to uid %u, not to this user (uid %u)",
             (unsigned)st.st_uid, (unsigned)geteuid());
    return 0;
  }
  return 1;
}

int brg__open_own_file(const char *path, int append, char *why, size_t why_bytes) {
  size_t len = strlen(path);
  if (len == 0 || path[len - 1] == '/') {
    snprintf(why, why_bytes, "%s", len ? "it names a directory, not a file" : "the path is empty");
    return -1;
  }
  /* O_NONBLOCK: a FIFO planted at the path must not hang the open. */
  int fd =
      open(path, O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK | (append ? O_APPEND : 0),
           0644);
  if (fd < 0) {
    int e = errno;
    if (e == ELOOP)
      snprintf(why, why_bytes, "it is a symbolic link, which brigade does not follow");
    else if (e == EISDIR)
      snprintf(why, why_bytes, "it is a directory");
    else if (e == ENXIO)
      snprintf(why, why_bytes, "it is a FIFO or socket, not a regular file");
    else
      snprintf(why, why_bytes, "%s", strerror(e));
    errno = e;
    return -1;
  }
  if (!brg__own_file_ok(fd, why, why_bytes)) {
    close(fd);
    errno = EPERM;
    return -1;
  }
  int fl = fcntl(fd, F_GETFL);
  if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  return fd;
}

static FILE *log_stream(void) {
  if (log_file) return log_file;
  const char *pattern = brg__config_str(&brg__log_config, LOG_CFG_DEBUG_FILE);
  int rank = thread_rank >= 0 ? thread_rank : log_rank;
  /* A file named by rank waits for the rank: lines before it go to stderr. */
  if (pattern[0] && rank < 0 && strstr(pattern, "%r")) return stderr;
  if (pattern[0]) {
    char path[512], why[160];
    brg__log_expand_path(path, sizeof path, pattern, rank);
    int fd = brg__open_own_file(path, 1, why, sizeof why);
    if (fd >= 0 && !(log_file = fdopen(fd, "a"))) {
      snprintf(why, sizeof why, "fdopen: %s", strerror(errno));
      close(fd);
    }
    if (log_file) {
      setvbuf(log_file, NULL, _IOLBF, 0);
    } else {
      log_file = stderr;
      fprintf(stderr,
              "%s:%d brigade WARN [init] cannot write the debug log %s (BRIGADE_DEBUG_FILE=%s): "
              "%s; logging to stderr\n",
              log_host, (int)getpid(), path, pattern, why);
    }
  }
  if (!log_file) log_file = stderr;
  return log_file;
}

void brg__log(int level, const char *subsys, const char *fmt, ...) {
  static const char *names[] = {"NONE", "WARN", "INFO", "TRACE"};
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  pthread_mutex_lock(&log_lock);
  FILE *f = log_stream();
  int rank = thread_rank >= 0 ? thread_rank : log_rank;
  if (rank >= 0)
    fprintf(f, "%s:%d:%d brigade %s [%s] %s\n", log_host, (int)getpid(), rank, names[level], subsys,
            line);
  else
    fprintf(f, "%s:%d brigade %s [%s] %s\n", log_host, (int)getpid(), names[level], subsys, line);
  fflush(f);
  pthread_mutex_unlock(&log_lock);
}

brg_status brg__error(brg__errbuf *eb, brg_status status, const char *subsys, const char *fmt,
                      ...) {
  char msg[BRG__ERRLEN];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (eb) {
    memcpy(eb->msg, msg, sizeof msg);
    eb->logged = 1;
  }
  brg__log_init();
  BRG__WARN(subsys, "%s", msg);
  return status;
}

static __thread char thread_error[BRG__ERRLEN];

void brg__set_thread_error(const char *msg) {
  snprintf(thread_error, sizeof thread_error, "%s", msg ? msg : "");
}

const char *brg__thread_error(void) {
  return thread_error;
}
