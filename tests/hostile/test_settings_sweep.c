/*
 * Garbage in every setting brigade-info lists: each value, one setting at a
 * time, in a child process that builds a one-rank communicator
 * (brg_comm_init_env without a launcher) in a scratch directory, runs an
 * allreduce and destroys it. A value is either taken (init and the
 * allreduce succeed) or refused with a message that names the setting;
 * never a crash, a hang (20 s alarm) or a refusal that does not say which
 * variable is wrong. And values that must be refused (test_settings_sweep's
 * strict list), by name, whether or not a host-only job uses the setting.
 *
 *   test_settings_sweep BRIGADE_INFO_PATH
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "brigade.h"

static char long9[5001], longx[5001];

static const char *values[] = {
    "abc",      "-1", "99999999999999999999999", "1e3", " 5", "0x10", "5 ",
    "%n%n%s%s", "-",  "18446744073709551616K",   long9, longx};
enum { NVALUES = sizeof values / sizeof values[0] };

static int child(const char *name, const char *value) {
  alarm(20);
  static const char *launcher[] = {"RANK",
                                   "WORLD_SIZE",
                                   "MASTER_ADDR",
                                   "MASTER_PORT",
                                   "LOCAL_RANK",
                                   "OMPI_COMM_WORLD_SIZE",
                                   "OMPI_COMM_WORLD_RANK",
                                   "SLURM_NTASKS",
                                   "SLURM_PROCID",
                                   "PMI_SIZE",
                                   "PMI_RANK"};
  for (size_t i = 0; i < sizeof launcher / sizeof launcher[0]; i++) unsetenv(launcher[i]);
  setenv(name, value, 1);
  brg_comm *c = NULL;
  brg_status s = brg_comm_init_env(&c);
  if (s == BRG_SUCCESS) {
    float v[4] = {1, 2, 3, 4};
    s = brg_allreduce(v, v, 4, BRG_FLOAT32, BRG_SUM, c, NULL);
    if (s != BRG_SUCCESS || v[3] != 4) {
      printf("%s=\"%.40s\": taken, but the allreduce gave %s (%s)\n", name, value,
             brg_status_string(s), brg_comm_last_error(c));
      return 1;
    }
    brg_comm_destroy(c);
    if (!strcmp(value, "abc") &&
        (!strcmp(name, "BRIGADE_DEBUG") || !strcmp(name, "BRIGADE_DEBUG_SUBSYS"))) {
      printf("%s=\"abc\": taken; it is no log level or subsystem\n", name);
      return 1;
    }
    return 0;
  }
  const char *m = brg_comm_last_error(NULL);
  if (!strstr(m, name)) {
    printf("%s=\"%.40s\": refused (%s) with a message that does not name it: %.300s\n", name, value,
           brg_status_string(s), m);
    return 1;
  }
  return 0;
}

/* A value that must be refused: init fails naming the variable. */
static int child_strict(const char *name, const char *value) {
  alarm(20);
  unsetenv("RANK");
  unsetenv("WORLD_SIZE");
  unsetenv("MASTER_ADDR");
  unsetenv("MASTER_PORT");
  setenv(name, value, 1);
  brg_comm *c = NULL;
  brg_status s = brg_comm_init_env(&c);
  if (s == BRG_SUCCESS) {
    printf("%s=\"%.64s\": taken, but it must be refused\n", name, value);
    brg_comm_destroy(c);
    return 1;
  }
  const char *m = brg_comm_last_error(NULL);
  if (!strstr(m, name)) {
    printf("%s=\"%.64s\": refused (%s) with a message that does not name it: %.300s\n", name, value,
           brg_status_string(s), m);
    return 1;
  }
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: test_settings_sweep BRIGADE_INFO_PATH\n");
    return 2;
  }
  memset(long9, '9', sizeof long9 - 1);
  memset(longx, 'x', sizeof longx - 1);
  char cmd[4200], line[1024];
  snprintf(cmd, sizeof cmd, "%s --markdown", argv[1]);
  FILE *p = popen(cmd, "r");
  if (!p) {
    perror("popen");
    return 1;
  }
  char names[128][64];
  int n = 0;
  while (fgets(line, sizeof line, p) && n < 128)
    if (!strncmp(line, "| `BRIGADE_", 11)) {
      char *end = strchr(line + 3, '`');
      if (end) snprintf(names[n++], sizeof names[0], "%.*s", (int)(end - line - 3), line + 3);
    }
  pclose(p);
  if (n < 30) {
    fprintf(stderr, "brigade-info listed only %d settings\n", n);
    return 1;
  }
  char dir[] = "/tmp/brigade-sweep-XXXXXX";
  if (!mkdtemp(dir) || chdir(dir) != 0) {
    perror("scratch directory");
    return 1;
  }
  int failed = 0, runs = 0;
  for (int i = 0; i < n; i++)
    for (int k = 0; k < NVALUES; k++) {
      fflush(stdout);
      pid_t pid = fork();
      if (pid == 0) {
        int rc = child(names[i], values[k]);
        fflush(stdout);
        _exit(rc);
      }
      int st = 0;
      while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
      runs++;
      if (WIFSIGNALED(st)) {
        printf("%s=\"%.40s\": the rank died from signal %d (%s)\n", names[i], values[k],
               WTERMSIG(st), WTERMSIG(st) == SIGALRM ? "hung for 20 s" : strsignal(WTERMSIG(st)));
        failed++;
      } else if (WEXITSTATUS(st) != 0) {
        failed++;
      }
    }
  /* Two settings each in range whose product is not: a FIFO of 4 GiB per
   * link (about 12 GiB per rank) is refused at once, naming both. */
  pid_t pid = fork();
  if (pid == 0) {
    setenv("BRIGADE_SLICE_BYTES", "64M", 1);
    int rc = child("BRIGADE_STEPS", "64");
    if (rc == 0 && !strstr(brg_comm_last_error(NULL), "BRIGADE_SLICE_BYTES")) {
      printf("BRIGADE_SLICE_BYTES=64M x BRIGADE_STEPS=64: not refused naming both (%s)\n",
             brg_comm_last_error(NULL));
      rc = 1;
    }
    fflush(stdout);
    _exit(rc);
  }
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
  runs++;
  failed += !WIFEXITED(st) || WEXITSTATUS(st) != 0;
  /* Values each setting's own sweep value may not reach: words outside a
   * setting's vocabulary, a module that is no file, an address no peer can
   * reach this rank at, and secrets under 128 bits or made of a repeated
   * pattern (which folding once turned into a secret of zeros). Each is
   * refused at init, naming the variable, on a host-only job too. */
  /* 32 random hex digits, twice: XOR-folding made this a secret of zeros. */
  static const char halves[] = "3f9a0c47e1b2d85a6c0e9f1374b2a8d53f9a0c47e1b2d85a6c0e9f1374b2a8d5";
  static const struct {
    const char *name, *value;
  } strict[] = {
      {"BRIGADE_IB_BACKEND", "abc"},    {"BRIGADE_DEVICE_MODE", "abc"},
      {"BRIGADE_CUDA_MODULE", "abc"},   {"BRIGADE_CUDA_MODULE", "/nonexistent/libbrigade_cuda.so"},
      {"BRIGADE_IB_HCA", "%n%n%s%s"},   {"BRIGADE_IB_HCA", "mlx5_0:0"},
      {"BRIGADE_BOOTSTRAP_ADDR", "0"},  {"BRIGADE_BOOTSTRAP_ADDR", "0.0.0.0"},
      {"BRIGADE_BOOTSTRAP_ADDR", "::"}, {"BRIGADE_SECRET", "00"},
      {"BRIGADE_SECRET", "abab"},       {"BRIGADE_SECRET", "00000000000000000000000000000000"},
      {"BRIGADE_SECRET", halves},
  };
  for (size_t k = 0; k < sizeof strict / sizeof strict[0]; k++) {
    fflush(stdout);
    pid = fork();
    if (pid == 0) {
      int rc = child_strict(strict[k].name, strict[k].value);
      fflush(stdout);
      _exit(rc);
    }
    st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
    runs++;
    failed += !WIFEXITED(st) || WEXITSTATUS(st) != 0;
  }
  /* Whatever the string settings made of their values, in the scratch directory. */
  if (system("rm -rf /tmp/brigade-sweep-??????") != 0) fprintf(stderr, "cleanup failed\n");
  printf("%d settings x %d values, one pair and %zu values refused by name: %d passed, %d "
         "failed\n",
         n, NVALUES, sizeof strict / sizeof strict[0], runs - failed, failed);
  return failed ? 1 : 0;
}
