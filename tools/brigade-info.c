/*
 * brigade-info: what this build of brigade can do on this machine.
 *
 * Prints the version, the kernels' instruction set, every BRIGADE_* setting
 * (value, default, help) and, for each transport that was built, whether it
 * can work here and why not. It links the static core, so it reads the same
 * tables the library uses rather than a copy of them.
 */
#include <glob.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "brigade.h"
#include "settings.h"
#include "kernels.h"
#include "transport.h"
#include "device.h"
#include "info_model.h"

#ifndef BRG_NOT_BUILT
#define BRG_NOT_BUILT ""
#endif

/* The CUDA module of the installed tree this program belongs to. The
 * library finds its module beside itself, but this program links the core
 * statically and is installed in bindir, apart from the library: from
 * meson install, the module is in BRG_INFO_LIBDIR (relative to bindir);
 * from a wheel, in the package folder, lib/python3.X/{site,dist}-packages/
 * brigade beside bin (a venv, ~/.local, /usr/local), BRG_INFO_PYTHON's
 * first. Names it with BRIGADE_CUDA_MODULE (unless that is set), so that
 * the transports below are judged with the module the library would open;
 * prints what it did. */
static void find_installed_module(void) {
  const char *env = getenv("BRIGADE_CUDA_MODULE");
  char exe[PATH_MAX], pat[PATH_MAX + 64];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if ((env && *env) || n <= 0) return;
  exe[n] = 0;
  char *slash = strrchr(exe, '/');
  if (!slash) return;
  *slash = 0; /* bindir */
  char found[PATH_MAX + 64] = "";
#ifdef BRG_INFO_LIBDIR
  snprintf(pat, sizeof pat, "%s/%s/libbrigade_cuda.so", exe, BRG_INFO_LIBDIR);
  if (access(pat, F_OK) != 0 || realpath(pat, found) == NULL) found[0] = 0;
#endif
#ifdef BRG_INFO_PYTHON
  const char *pats[] = {"%s/../lib/" BRG_INFO_PYTHON "/*-packages/brigade/libbrigade_cuda.so",
                        "%s/../lib/python3*/*-packages/brigade/libbrigade_cuda.so"};
  for (int i = 0; i < 2 && !found[0]; i++) {
    glob_t g;
    snprintf(pat, sizeof pat, pats[i], exe);
    if (glob(pat, 0, NULL, &g) == 0 && g.gl_pathc > 0 && realpath(g.gl_pathv[0], found) == NULL)
      found[0] = 0;
    globfree(&g);
  }
#endif
  if (!found[0]) return;
  setenv("BRIGADE_CUDA_MODULE", found, 1);
  printf("CUDA module: %s (this installation's; BRIGADE_CUDA_MODULE names another)\n", found);
}

/* Whether `name` is in the comma list `allow` (empty: everything is). */
static int allowed(const char *allow, const char *name) {
  if (allow == NULL || *allow == '\0') return 1;
  size_t n = strlen(name);
  for (const char *p = allow;;) {
    const char *end = strchr(p, ',');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    if (len == n && strncmp(p, name, n) == 0) return 1;
    if (end == NULL) return 0;
    p = end + 1;
  }
}

/* docs/settings.md: the settings table from the library's own tables, the
 * same on every machine (a test compares the two). */
static int print_markdown(void) {
  printf("# Settings\n\n"
         "Every `BRIGADE_*` environment variable brigade reads, with its default and\n"
         "bounds. This page is the output of `brigade-info --markdown`; a test checks\n"
         "that it matches the library. `brigade-info` with no argument prints the same\n"
         "settings with the values in force on this machine.\n\n");
  brg__settings_print_markdown(stdout);
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 2 && strcmp(argv[1], "--markdown") == 0) return print_markdown();
  if (argc >= 2 && strcmp(argv[1], "--model") == 0) return brg__info_model(argc - 2, argv + 2);
  if (argc >= 2 && strcmp(argv[1], "--calibrate") == 0)
    return brg__info_calibrate(argc - 2, argv + 2);
  if (argc >= 2 && strcmp(argv[1], "--device-shape") == 0)
    return brg__info_device_shape(argc - 2, argv + 2);
  if (argc >= 2 && strcmp(argv[1], "--device-model") == 0)
    return brg__info_device_model(argc - 2, argv + 2);
  if (argc > 1) {
    int help = strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0;
    fprintf(help ? stdout : stderr,
            "usage: brigade-info [--markdown | --model [options] | --calibrate --out FILE |\n"
            "                     --device-shape ... | --device-model ...]\n"
            "Prints brigade's version, its settings (BRIGADE_* environment variables)\n"
            "and the transports that can run on this machine; --markdown prints the\n"
            "settings as the Markdown table of docs/settings.md; --model the allreduce cost\n"
            "model BRIGADE_ALGO=auto chooses by (brigade-info --model --help);\n"
            "--calibrate measures this host's links and writes a model file for\n"
            "BRIGADE_MODEL_FILE; --device-shape kernel mode's channels and slots by the model;\n"
            "--device-model its predicted times (brigade-info --device-model --help).\n");
    return help ? 0 : 2;
  }

  printf("brigade %d.%d.%d\n", BRG_VERSION_MAJOR, BRG_VERSION_MINOR, BRG_VERSION_PATCH);
  printf("kernels: %s\n", brg__kernels_isa());
  find_installed_module();

  brg__errbuf err = {0};
  brg_status st = brg__settings_load(&err);
  printf("\nsettings:\n");
  brg__settings_print(stdout);
  if (st != BRG_SUCCESS) printf("  error: %s (the library would refuse to start)\n", err.msg);

  const char *allow = brg__core_str(BRG__CORE_TRANSPORTS);
  printf("\ntransports:\n");
  for (int i = 0; brg__transports[i] != NULL; i++) {
    const brg__transport_ops *t = brg__transports[i];
    char why[256] = "";
    const char *gpu_why = "";
    int host = (t->carries & BRG__CARRIES_HOST) != 0;
    if (!host && !brg__device_api(&gpu_why))
      printf("  %s unavailable: %s", t->name, gpu_why);
    else if (t->available(why, sizeof why))
      printf("  %s: available", t->name);
    else
      printf("  %s unavailable: %s", t->name, why[0] ? why : "no reason given");
    if (!host) printf(" (device collectives only)");
    if (!allowed(allow, t->name)) printf(" (not allowed by BRIGADE_TRANSPORTS=%s)", allow);
    printf("\n");
  }
  if (BRG_NOT_BUILT[0] != '\0') printf("  not built: %s\n", BRG_NOT_BUILT);
  return st == BRG_SUCCESS ? 0 : 1;
}
