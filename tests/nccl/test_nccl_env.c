/*
 * NCCL_* variables under libbrigade_nccl.so: set before the first call,
 * they are taken as the BRIGADE_* variables with their meaning (checked in
 * the environment brigade reads), a BRIGADE_* variable set by the user
 * wins, and the ones brigade has no meaning for are named in one WARN.
 * The mapping must reach brigade itself: NCCL_DEBUG=INFO makes brigade's
 * own bootstrap say where its root listens, and NCCL_SOCKET_IFNAME=lo
 * makes it listen on the loopback address. No GPU is needed
 * (ncclGetUniqueId opens no CUDA module).
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <nccl.h>

static int failures;

static void expect_env(const char *name, const char *want) {
  const char *got = getenv(name);
  if (want ? !got || strcmp(got, want) : got != NULL) {
    fprintf(stderr, "FAIL: %s is %s%s%s, expected %s%s%s\n", name, got ? "\"" : "",
            got ? got : "unset", got ? "\"" : "", want ? "\"" : "", want ? want : "unset",
            want ? "\"" : "");
    failures++;
  }
}

/* The line of `log` holding `a` must also hold `b` (NULL: a alone). */
static void expect_line(const char *log, const char *a, const char *b) {
  for (const char *p = log; (p = strstr(p, a)) != NULL; p++) {
    const char *start = p, *end = strchr(p, '\n');
    while (start > log && start[-1] != '\n') start--;
    if (!b) return;
    const char *q = strstr(start, b);
    if (q && (!end || q < end)) return;
  }
  fprintf(stderr, "FAIL: no log line with \"%s\"%s%s%s\n", a, b ? " and \"" : "", b ? b : "",
          b ? "\"" : "");
  failures++;
}

int main(void) {
  /* What a job tuned for NCCL might carry. */
  setenv("NCCL_DEBUG", "INFO", 1);
  setenv("NCCL_DEBUG_SUBSYS", "INIT,BOOTSTRAP,GRAPH", 1);
  setenv("NCCL_ALGO", "Tree", 1);
  setenv("NCCL_PROTO", "^LL", 1);
  setenv("NCCL_IB_DISABLE", "1", 1);
  setenv("NCCL_SHM_DISABLE", "1", 1);
  setenv("NCCL_P2P_DISABLE", "0", 1);
  setenv("NCCL_SOCKET_IFNAME", "=lo,eth", 1);
  setenv("NCCL_IB_HCA", "^mlx5_1", 1);
  setenv("NCCL_BUFFSIZE", "8388608", 1);
  setenv("NCCL_MAX_NCHANNELS", "48", 1);
  setenv("NCCL_IB_TIMEOUT", "14", 1);
  setenv("BRIGADE_IB_TIMEOUT", "20", 1); /* set by the user: wins */
  setenv("NCCL_NTHREADS", "512", 1);
  setenv("NCCL_LAUNCH_MODE", "GROUP", 1);
  unsetenv("BRIGADE_DEBUG");
  unsetenv("BRIGADE_ALGO");
  unsetenv("BRIGADE_TRANSPORTS");
  unsetenv("BRIGADE_SOCKET_IFNAME");
  unsetenv("BRIGADE_IB_HCA");
  unsetenv("BRIGADE_STEPS");

  /* stderr into a file for the length of the first call. */
  char path[] = "/tmp/brigade-nccl-env-XXXXXX";
  int fd = mkstemp(path);
  int saved = dup(2);
  if (fd < 0 || saved < 0) return perror("mkstemp"), 1;
  fflush(stderr);
  dup2(fd, 2);
  ncclUniqueId id;
  ncclResult_t r = ncclGetUniqueId(&id);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  char log[16384];
  ssize_t n = pread(fd, log, sizeof log - 1, 0);
  log[n > 0 ? n : 0] = 0;
  close(fd);
  unlink(path);
  fprintf(stderr, "--- the library's stderr:\n%s---\n", log);
  if (r != ncclSuccess) {
    fprintf(stderr, "FAIL: ncclGetUniqueId: %s: %s\n", ncclGetErrorString(r),
            ncclGetLastError(NULL));
    failures++;
  }

  expect_env("BRIGADE_DEBUG", "INFO");
  expect_env("BRIGADE_DEBUG_SUBSYS", "init,bootstrap");
  expect_env("BRIGADE_ALGO", "tree");
  expect_env("BRIGADE_DEVICE_LL_BYTES", "0");
  expect_env("BRIGADE_DEVICE_RING_LL_BYTES", "0");
  expect_env("BRIGADE_TRANSPORTS", "cuda_ipc,tcp");
  expect_env("BRIGADE_SOCKET_IFNAME", "lo");
  expect_env("BRIGADE_IB_HCA", NULL);
  expect_env("BRIGADE_SLICE_BYTES", "1048576"); /* 8 MiB over 8 slots */
  expect_env("BRIGADE_DEVICE_SLICE_BYTES", "1048576");
  expect_env("BRIGADE_DEVICE_CHANNELS", "32");
  expect_env("BRIGADE_IB_TIMEOUT", "20");

  expect_line(log, "INFO [init] NCCL_ALGO=Tree taken as BRIGADE_ALGO=tree", NULL);
  expect_line(log, "NCCL_IB_DISABLE=1", "taken as BRIGADE_TRANSPORTS=cuda_ipc,tcp");
  expect_line(log, "NCCL_DEBUG_SUBSYS=INIT,BOOTSTRAP,GRAPH taken as", "no GRAPH subsystem");
  expect_line(log, "NCCL_MAX_NCHANNELS=48 taken as BRIGADE_DEVICE_CHANNELS=32", "at most 32");
  expect_line(log, "NCCL_IB_TIMEOUT=14 not applied: BRIGADE_IB_TIMEOUT=20 is set", NULL);
  expect_line(log, "WARN [init] NCCL_IB_HCA=^mlx5_1 not applied", NULL);
  /* One WARN names both variables brigade has no meaning for. */
  expect_line(log, "WARN [init] NCCL_", "NCCL_NTHREADS");
  expect_line(log, "NCCL_NTHREADS", "NCCL_LAUNCH_MODE");
  expect_line(log, "NCCL_LAUNCH_MODE", "no meaning in brigade");
  /* Brigade itself read them: its own INFO line, on the loopback. */
  expect_line(log, "[bootstrap] bootstrap root listening at 127.0.0.1:", NULL);

  /* ncclResetDebugInit takes NCCL_DEBUG again (over its own earlier
   * value, which was not the user's). */
  setenv("NCCL_DEBUG", "WARN", 1);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  ncclResetDebugInit();
#pragma GCC diagnostic pop
  expect_env("BRIGADE_DEBUG", "WARN");

  printf("%s: NCCL_* variables mapped (%d failures)\n", failures ? "FAIL" : "ok", failures);
  return failures ? 1 : 0;
}
