/*
 * brigade-run: starts N ranks of a program on this host, torchrun style.
 *
 *   brigade-run -n N [--tag-output] [--bind] [--] PROGRAM [ARGS...]
 *
 * Each rank gets MASTER_ADDR=127.0.0.1, a MASTER_PORT that was free a moment
 * ago, RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, and a BRIGADE_SECRET
 * of 32 random hex digits shared by the job (brigade derives the job secret
 * from it, so a stray process cannot join). brg_comm_init_env reads them.
 *
 * A job fails as a whole: when one rank exits non-zero or dies of a signal,
 * the others get SIGTERM and, after a grace period, SIGKILL. Each rank runs
 * in its own process group so that shells and their children go too.
 * SIGINT, SIGTERM and SIGHUP sent to brigade-run are passed on to every rank,
 * with the same SIGKILL after the grace period (at once on a second signal).
 * The exit status is 0 only when every rank exited 0.
 *
 * With --tag-output every line a rank writes is prefixed with "[rank] ". The
 * ranks' stdout and stderr then come through pipes and are written out one
 * whole line per write, so lines of different ranks never mix.
 *
 * With --bind rank r runs on the r-th of N equal shares of the CPUs
 * brigade-run may use (contiguous in their order, one CPU at least), as
 * mpirun binds its ranks by default, so that benchmarks side by side with
 * MPI's compare like with like (unbound, 2 ranks on 2 CPUs timed brigade's
 * tree and rhd over tcp at ~31 us a call after phases of Gloo's blocking
 * collectives, against ~7 us bound). With more ranks than CPUs no rank is
 * bound, as mpirun --oversubscribe does.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define GRACE_MS 3000
#define MAX_RANKS 4096
#define LINE_MAX_BYTES 65536 /* longer lines are cut into pieces of this size */

typedef struct out_stream {
  int fd;    /* read end of the rank's pipe, -1 once closed */
  int dest;  /* STDOUT_FILENO or STDERR_FILENO */
  char *buf; /* partial line not written yet */
  size_t len;
} out_stream;

typedef struct rank_proc {
  pid_t pid;  /* 0 once reaped */
  int status; /* from waitpid */
  out_stream out[2];
} rank_proc;

typedef struct job {
  int n;
  int tag;
  int bind;
  rank_proc *ranks;
  int alive;
  int failed; /* a rank failed, or we were signalled: the job is over */
  int exit_code;
  int term_sent; /* SIGTERM went out to the ranks */
  int kill_sent;
  int64_t kill_at_ms; /* when to escalate to SIGKILL; 0 = not scheduled */
  int signals_seen;
  int forwarded_sig; /* the signal we passed on, 0 if none */
} job;

static void usage(FILE *f) {
  fprintf(f,
          "usage: brigade-run -n N [--tag-output] [--bind] [--] PROGRAM [ARGS...]\n"
          "Starts N ranks of PROGRAM on this host with the environment brigade's\n"
          "brg_comm_init_env reads (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE,\n"
          "LOCAL_RANK, LOCAL_WORLD_SIZE, BRIGADE_SECRET).\n"
          "GPUs: rank r gets LOCAL_RANK=r; brigade's *_perf tools (-G) and tests use\n"
          "GPU LOCAL_RANK modulo the GPUs the process sees (-g overrides), and a\n"
          "device collective runs on the GPU its buffers are on. To give each rank\n"
          "a GPU set of its own, start it with CUDA_VISIBLE_DEVICES in a wrapper.\n"
          "\n"
          "  -n, --nproc N       number of ranks\n"
          "  -t, --tag-output    prefix every output line with \"[rank] \"\n"
          "  -b, --bind          rank r runs on the r-th of N equal shares of the CPUs\n"
          "                      (none bound when N is more than the CPUs)\n"
          "  -h, --help          this text\n"
          "\n"
          "If a rank fails, the others are stopped (SIGTERM, then SIGKILL after %d s)\n"
          "and brigade-run exits non-zero; it exits 0 only if every rank does.\n",
          GRACE_MS / 1000);
}

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* A TCP port nobody listens on right now. Another process could take it
 * before rank 0 binds it; rank 0 then fails to start and says so. */
static int pick_free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  int port = -1;
  if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
      getsockname(fd, (struct sockaddr *)&a, &len) == 0)
    port = ntohs(a.sin_port);
  close(fd);
  return port;
}

static int make_secret(char hex[33]) {
  unsigned char raw[16];
  size_t got = 0;
  while (got < sizeof raw) {
    ssize_t r = getrandom(raw + got, sizeof raw - got, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    got += (size_t)r;
  }
  for (size_t i = 0; i < sizeof raw; i++) snprintf(hex + 2 * i, 3, "%02x", raw[i]);
  return 0;
}

static void write_all(int fd, const char *p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return; /* our own stdout is gone: nothing sensible left to do */
    }
    p += w;
    n -= (size_t)w;
  }
}

/* Writes "[rank] " + line (+ '\n' when missing) in one write. */
static void emit_line(int rank, int dest, const char *line, size_t len, int add_newline) {
  char prefix[24];
  int plen = snprintf(prefix, sizeof prefix, "[%d] ", rank);
  static char out[LINE_MAX_BYTES + 32];
  memcpy(out, prefix, (size_t)plen);
  memcpy(out + plen, line, len);
  size_t total = (size_t)plen + len;
  if (add_newline) out[total++] = '\n';
  write_all(dest, out, total);
}

/* Reads what the pipe has; writes out every complete line. Returns 0 at EOF. */
static int drain_stream(int rank, out_stream *s) {
  for (;;) {
    ssize_t r = read(s->fd, s->buf + s->len, LINE_MAX_BYTES - s->len);
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) return 1;
      r = 0; /* treat a read error as the end of the stream */
    }
    if (r == 0) {
      if (s->len > 0) emit_line(rank, s->dest, s->buf, s->len, 1);
      s->len = 0;
      close(s->fd);
      s->fd = -1;
      return 0;
    }
    s->len += (size_t)r;
    size_t start = 0;
    for (size_t i = s->len - (size_t)r; i < s->len; i++)
      if (s->buf[i] == '\n') {
        emit_line(rank, s->dest, s->buf + start, i + 1 - start, 0);
        start = i + 1;
      }
    if (start == 0 && s->len == LINE_MAX_BYTES) { /* no newline in sight: cut here */
      emit_line(rank, s->dest, s->buf, s->len, 1);
      start = s->len;
    }
    memmove(s->buf, s->buf + start, s->len - start);
    s->len -= start;
  }
}

static void signal_ranks(job *j, int sig, int except) {
  for (int r = 0; r < j->n; r++)
    if (r != except && j->ranks[r].pid > 0) kill(-j->ranks[r].pid, sig);
}

/* The first failure ends the job: stop everyone else. */
static void fail_job(job *j, int code, int failed_rank) {
  if (!j->failed) {
    j->failed = 1;
    j->exit_code = code;
  }
  if (!j->term_sent) {
    signal_ranks(j, SIGTERM, failed_rank);
    j->term_sent = 1;
    j->kill_at_ms = now_ms() + GRACE_MS;
  }
}

static void reap(job *j) {
  for (;;) {
    int status;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid <= 0) return;
    for (int r = 0; r < j->n; r++) {
      rank_proc *p = &j->ranks[r];
      if (p->pid != pid) continue;
      p->pid = 0;
      p->status = status;
      j->alive--;
      if (WIFEXITED(status) && WEXITSTATUS(status) == 0) break;
      /* What a failed rank leaves in its process group (the children of a
       * shell, say) would keep running and hold the output pipes. */
      kill(-pid, SIGKILL);
      if (j->term_sent && WIFSIGNALED(status) &&
          (WTERMSIG(status) == SIGTERM || WTERMSIG(status) == SIGKILL ||
           WTERMSIG(status) == j->forwarded_sig))
        break; /* stopped by us */
      if (WIFEXITED(status)) {
        fprintf(stderr, "brigade-run: rank %d exited with status %d\n", r, WEXITSTATUS(status));
        fail_job(j, WEXITSTATUS(status), r);
      } else if (WIFSIGNALED(status)) {
        fprintf(stderr, "brigade-run: rank %d killed by signal %d (%s)\n", r, WTERMSIG(status),
                strsignal(WTERMSIG(status)));
        fail_job(j, 128 + WTERMSIG(status), r);
      }
      break;
    }
  }
}

/* --bind: rank r's share of the `allowed` CPUs (n ranks, n at most their
 * count): CPUs r*k/n to (r+1)*k/n - 1 in their order, k of them. */
static void cpu_share(int r, int n, const cpu_set_t *allowed, cpu_set_t *mine) {
  int k = CPU_COUNT(allowed), from = (int)((int64_t)r * k / n),
      to = (int)((int64_t)(r + 1) * k / n);
  CPU_ZERO(mine);
  for (int cpu = 0, i = 0; cpu < CPU_SETSIZE && i < to; cpu++) {
    if (!CPU_ISSET(cpu, allowed)) continue;
    if (i >= from) CPU_SET(cpu, mine);
    i++;
  }
}

/* In the child: becomes rank `r` and execs the program. Never returns. */
static void exec_rank(int r, int n, int port, const char *secret, int tag, int pipes[2][2],
                      const sigset_t *oldmask, const cpu_set_t *cpus, char **argv) {
  char buf[32];
  setpgid(0, 0);
  if (cpus && sched_setaffinity(0, sizeof *cpus, cpus) != 0)
    fprintf(stderr, "brigade-run: rank %d: --bind: sched_setaffinity: %s (not bound)\n", r,
            strerror(errno));
  prctl(PR_SET_PDEATHSIG, SIGTERM); /* if brigade-run dies, so do the ranks */
  sigprocmask(SIG_SETMASK, oldmask, NULL);
  signal(SIGPIPE, SIG_DFL);
  if (tag) {
    dup2(pipes[0][1], STDOUT_FILENO);
    dup2(pipes[1][1], STDERR_FILENO);
    close(pipes[0][0]);
    close(pipes[0][1]);
    close(pipes[1][0]);
    close(pipes[1][1]);
  }
  /* Only rank 0 keeps stdin, and not a terminal: a rank in a background
   * process group reading the terminal would be stopped. */
  if (r != 0 || isatty(STDIN_FILENO)) {
    int fd = open("/dev/null", O_RDONLY);
    if (fd >= 0 && fd != STDIN_FILENO) {
      dup2(fd, STDIN_FILENO);
      close(fd);
    }
  }
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  snprintf(buf, sizeof buf, "%d", port);
  setenv("MASTER_PORT", buf, 1);
  snprintf(buf, sizeof buf, "%d", r);
  setenv("RANK", buf, 1);
  setenv("LOCAL_RANK", buf, 1);
  snprintf(buf, sizeof buf, "%d", n);
  setenv("WORLD_SIZE", buf, 1);
  setenv("LOCAL_WORLD_SIZE", buf, 1);
  setenv("BRIGADE_SECRET", secret, 1);
  execvp(argv[0], argv);
  fprintf(stderr, "brigade-run: rank %d: cannot run %s: %s\n", r, argv[0], strerror(errno));
  _exit(127);
}

int main(int argc, char **argv) {
  static const struct option longopts[] = {
      {"nproc", required_argument, NULL, 'n'}, {"nproc-per-node", required_argument, NULL, 'n'},
      {"tag-output", no_argument, NULL, 't'},  {"bind", no_argument, NULL, 'b'},
      {"help", no_argument, NULL, 'h'},        {NULL, 0, NULL, 0},
  };
  job j = {.n = 0};
  int c;
  /* '+': stop at the program name so its own options stay its own. */
  while ((c = getopt_long(argc, argv, "+n:tbh", longopts, NULL)) != -1) {
    switch (c) {
    case 'n': {
      char *end;
      long v = strtol(optarg, &end, 10);
      if (*optarg == '\0' || *end != '\0' || v < 1 || v > MAX_RANKS) {
        fprintf(stderr, "brigade-run: -n: need a number of ranks in 1..%d, got '%s'\n", MAX_RANKS,
                optarg);
        return 2;
      }
      j.n = (int)v;
      break;
    }
    case 't': j.tag = 1; break;
    case 'b': j.bind = 1; break;
    case 'h': usage(stdout); return 0;
    default: usage(stderr); return 2;
    }
  }
  if (j.n == 0 || optind >= argc) {
    fprintf(stderr, "brigade-run: %s\n", j.n == 0 ? "-n N is required" : "no program given");
    usage(stderr);
    return 2;
  }
  char **prog_argv = argv + optind;
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (j.bind && sched_getaffinity(0, sizeof allowed, &allowed) != 0) {
    fprintf(stderr, "brigade-run: --bind: sched_getaffinity: %s (the ranks are not bound)\n",
            strerror(errno));
    j.bind = 0;
  } else if (j.bind && j.n > CPU_COUNT(&allowed)) {
    fprintf(stderr, "brigade-run: --bind: %d ranks on %d CPUs: the ranks are not bound\n", j.n,
            CPU_COUNT(&allowed));
    j.bind = 0;
  }

  int port = pick_free_port();
  if (port < 0) {
    fprintf(stderr, "brigade-run: cannot find a free port: %s\n", strerror(errno));
    return 1;
  }
  char secret[33];
  if (make_secret(secret) != 0) {
    fprintf(stderr, "brigade-run: getrandom: %s\n", strerror(errno));
    return 1;
  }

  /* Signals arrive through a signalfd, in the same poll as the output. */
  sigset_t mask, oldmask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGCHLD);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGHUP);
  sigprocmask(SIG_BLOCK, &mask, &oldmask);
  int sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sfd < 0) {
    fprintf(stderr, "brigade-run: signalfd: %s\n", strerror(errno));
    return 1;
  }
  signal(SIGPIPE, SIG_IGN);

  j.ranks = calloc((size_t)j.n, sizeof *j.ranks);
  if (j.ranks == NULL) {
    fprintf(stderr, "brigade-run: out of memory\n");
    return 1;
  }
  fflush(NULL);
  for (int r = 0; r < j.n; r++) {
    rank_proc *p = &j.ranks[r];
    int pipes[2][2] = {{-1, -1}, {-1, -1}};
    p->out[0].fd = p->out[1].fd = -1;
    if (j.tag) {
      for (int k = 0; k < 2; k++) {
        if (pipe2(pipes[k], O_CLOEXEC) != 0 || (p->out[k].buf = malloc(LINE_MAX_BYTES)) == NULL) {
          fprintf(stderr, "brigade-run: pipe: %s\n", strerror(errno));
          fail_job(&j, 1, -1);
          break;
        }
        p->out[k].fd = pipes[k][0];
        p->out[k].dest = k == 0 ? STDOUT_FILENO : STDERR_FILENO;
      }
      if (j.failed) break;
    }
    pid_t pid = fork();
    if (pid < 0) {
      fprintf(stderr, "brigade-run: fork: %s\n", strerror(errno));
      fail_job(&j, 1, -1);
      break;
    }
    if (pid == 0) {
      cpu_set_t mine;
      if (j.bind) cpu_share(r, j.n, &allowed, &mine);
      exec_rank(r, j.n, port, secret, j.tag, pipes, &oldmask, j.bind ? &mine : NULL, prog_argv);
    }
    setpgid(pid, pid); /* also here, so kill(-pid) works before the child runs */
    p->pid = pid;
    j.alive++;
    if (j.tag) {
      close(pipes[0][1]);
      close(pipes[1][1]);
      fcntl(p->out[0].fd, F_SETFL, O_NONBLOCK);
      fcntl(p->out[1].fd, F_SETFL, O_NONBLOCK);
    }
  }

  struct pollfd *pfds = calloc(1 + 2 * (size_t)j.n, sizeof *pfds);
  out_stream **streams = calloc(1 + 2 * (size_t)j.n, sizeof *streams);
  int *stream_rank = calloc(1 + 2 * (size_t)j.n, sizeof *stream_rank);
  if (pfds == NULL || streams == NULL || stream_rank == NULL) {
    fprintf(stderr, "brigade-run: out of memory\n");
    fail_job(&j, 1, -1);
  }
  int64_t drain_until = 0; /* after the last rank: how long to wait for stray output */

  for (;;) {
    int open_streams = 0, npfd = 0;
    if (pfds != NULL) {
      pfds[npfd++] = (struct pollfd){.fd = sfd, .events = POLLIN};
      for (int r = 0; r < j.n; r++)
        for (int k = 0; k < 2; k++)
          if (j.ranks[r].out[k].fd >= 0) {
            streams[npfd] = &j.ranks[r].out[k];
            stream_rank[npfd] = r;
            pfds[npfd++] = (struct pollfd){.fd = j.ranks[r].out[k].fd, .events = POLLIN};
            open_streams++;
          }
    }
    if (j.alive == 0) {
      /* Every rank is gone. Pipes stay open only if a rank left a process
       * outside its group holding them; give that a moment, not forever. */
      if (open_streams == 0 || pfds == NULL) break;
      if (drain_until == 0) drain_until = now_ms() + 200;
      if (now_ms() >= drain_until) break;
    }

    int timeout = -1;
    int64_t t = now_ms();
    if (j.kill_at_ms && !j.kill_sent) timeout = (int)(j.kill_at_ms > t ? j.kill_at_ms - t : 0);
    if (drain_until) timeout = (int)(drain_until > t ? drain_until - t : 0);

    int ready;
    if (pfds != NULL) {
      ready = poll(pfds, (nfds_t)npfd, timeout);
    } else {
      struct pollfd one = {.fd = sfd, .events = POLLIN};
      ready = poll(&one, 1, timeout);
    }
    if (ready < 0 && errno != EINTR) {
      fprintf(stderr, "brigade-run: poll: %s\n", strerror(errno));
      fail_job(&j, 1, -1);
    }

    struct signalfd_siginfo si;
    while (read(sfd, &si, sizeof si) == (ssize_t)sizeof si) {
      if (si.ssi_signo == SIGCHLD) continue; /* reaped below */
      j.signals_seen++;
      if (j.signals_seen == 1) {
        fprintf(stderr, "brigade-run: got %s, passing it to the ranks\n",
                strsignal((int)si.ssi_signo));
        if (!j.failed) {
          j.failed = 1;
          j.exit_code = 128 + (int)si.ssi_signo;
        }
        j.forwarded_sig = (int)si.ssi_signo;
        signal_ranks(&j, j.forwarded_sig, -1);
        j.term_sent = 1;
        j.kill_at_ms = now_ms() + GRACE_MS;
      } else {
        fprintf(stderr, "brigade-run: got %s again, killing the ranks\n",
                strsignal((int)si.ssi_signo));
        signal_ranks(&j, SIGKILL, -1);
        j.kill_sent = 1;
      }
    }
    reap(&j);

    if (pfds != NULL)
      for (int i = 1; i < npfd; i++)
        if (pfds[i].revents & (POLLIN | POLLHUP | POLLERR))
          drain_stream(stream_rank[i], streams[i]);

    if (j.kill_at_ms && !j.kill_sent && now_ms() >= j.kill_at_ms && j.alive > 0) {
      for (int r = 0; r < j.n; r++)
        if (j.ranks[r].pid > 0)
          fprintf(stderr,
                  "brigade-run: rank %d still running %d s after being told to stop, "
                  "sending SIGKILL\n",
                  r, GRACE_MS / 1000);
      signal_ranks(&j, SIGKILL, -1);
      j.kill_sent = 1;
    }
  }

  /* Whatever was cut off by the drain deadline still gets written. */
  for (int r = 0; r < j.n; r++)
    for (int k = 0; k < 2; k++) {
      out_stream *s = &j.ranks[r].out[k];
      if (s->fd >= 0) {
        if (s->len > 0) emit_line(r, s->dest, s->buf, s->len, 1);
        close(s->fd);
      }
      free(s->buf);
    }
  free(pfds);
  free(streams);
  free(stream_rank);
  free(j.ranks);
  close(sfd);
  if (j.failed && j.exit_code == 0) j.exit_code = 1;
  return j.exit_code > 255 ? 255 : j.exit_code;
}
