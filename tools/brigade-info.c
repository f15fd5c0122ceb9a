/*
 * brigade-info: what this build of brigade can do on this machine.
 *
 * Prints the version, the kernels' instruction set, every BRIGADE_* setting
 * (value, default, help) and, for each transport that was built, whether it
 * can work here and why not. It links the static core, so it reads the same
 * tables the library uses rather than a copy of them.
 */
#include <stdio.h>
#include <string.h>

#include "brigade.h"
#include "settings.h"
#include "kernels.h"
#include "transport.h"
#include "device.h"
#include "info_model.h"

#ifndef BRG_NOT_BUILT
#define BRG_NOT_BUILT ""
#endif

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
  if (argc >= 2 && strcmp(argv[1], "--device-shape") == 0)
    return brg__info_device_shape(argc - 2, argv + 2);
  if (argc > 1) {
    int help = strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0;
    fprintf(help ? stdout : stderr,
            "usage: brigade-info [--markdown | --model [options] | --device-shape ...]\n"
            "Prints brigade's version, its settings (BRIGADE_* environment variables)\n"
            "and the transports that can run on this machine; --markdown prints the\n"
            "settings as the Markdown table of docs/settings.md; --model the allreduce cost\n"
            "model BRIGADE_ALGO=auto chooses by (brigade-info --model --help);\n"
            "--device-shape kernel mode's channels and slots by the model.\n");
    return help ? 0 : 2;
  }

  printf("brigade %d.%d.%d\n", BRG_VERSION_MAJOR, BRG_VERSION_MINOR, BRG_VERSION_PATCH);
  printf("kernels: %s\n", brg__kernels_isa());

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
