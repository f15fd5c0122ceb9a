/*
 * Runs fuzz inputs without libFuzzer: every file given, or every file of
 * every directory given, once through LLVMFuzzerTestOneInput. The seed
 * corpus runs this way in every build (and under ASan and UBSan in the
 * sanitizer pass), so a seed that crashes fails the ordinary test suite.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    perror(path);
    return 1;
  }
  static uint8_t buf[65537];
  size_t n = fread(buf, 1, sizeof buf, f);
  fclose(f);
  LLVMFuzzerTestOneInput(buf, n);
  return 0;
}

int main(int argc, char **argv) {
  LLVMFuzzerInitialize(&argc, &argv);
  int files = 0, bad = 0;
  for (int i = 1; i < argc; i++) {
    struct stat st;
    if (stat(argv[i], &st) != 0) {
      perror(argv[i]);
      return 1;
    }
    if (!S_ISDIR(st.st_mode)) {
      bad |= run_file(argv[i]);
      files++;
      continue;
    }
    DIR *dir = opendir(argv[i]);
    if (!dir) {
      perror(argv[i]);
      return 1;
    }
    struct dirent *e;
    while ((e = readdir(dir)) != NULL) {
      if (e->d_name[0] == '.') continue;
      char path[4096];
      snprintf(path, sizeof path, "%s/%s", argv[i], e->d_name);
      bad |= run_file(path);
      files++;
    }
    closedir(dir);
  }
  printf("replay: %d inputs\n", files);
  if (files == 0) {
    fprintf(stderr, "replay: no inputs\n");
    return 1;
  }
  return bad;
}
