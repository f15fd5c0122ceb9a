/*
 * brigade-info --model: the cost model of runtime/plan/model.c, the one
 * BRIGADE_ALGO=auto chooses by, as a table (bench/model calls it with
 * --tsv for its predictions and plots).
 *
 *   brigade-info --model                       64..4096 ranks, 8 per host
 *   brigade-info --model --hosts 4 --per-host 2 [--sizes 4K,1M,64M]
 *   --no-hier: hosts that differ in rank count (hier cannot run)
 *   links: --alpha-net S --beta-net S/B --gbit-net G --alpha-shm S --beta-shm S/B
 *          --alpha-tcp S --beta-tcp S/B --alpha-p2p S --beta-p2p S/B --beta-xchg S/B
 *          (shm's), --alpha-p2p-tcp S --beta-p2p-tcp S/B --beta-xchg-tcp S/B,
 *          or --model-file PATH (brigade-info --calibrate's) with those overriding it;
 *   shape: --nics K --rings R --small B --slice B; --tcp: tcp within a host;
 *          --cores C: a host's cores (ranks beyond them wait for turns);
 *          --layout 3,3,2: the flat ring on hosts of those rank counts
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "info_model.h"
#include "internal.h"
#include "model.h"
#include "settings.h"

#define MAX_LAYOUT 4096
#define MAX_SIZES 64

static int parse_size(const char *s, size_t *out) {
  char *end;
  double v = strtod(s, &end);
  if (end == s || v < 0) return -1;
  double mul = 1;
  switch (*end) {
  case 'k':
  case 'K':
    mul = 1024;
    end++;
    break;
  case 'm':
  case 'M':
    mul = 1024.0 * 1024;
    end++;
    break;
  case 'g':
  case 'G':
    mul = 1024.0 * 1024 * 1024;
    end++;
    break;
  default: break;
  }
  if (*end == 'B' || *end == 'b') end++;
  if (*end) return -1;
  *out = (size_t)(v * mul);
  return 0;
}

static void size_name(size_t b, char *out, size_t cap) {
  if (b >= (1u << 20) && b % (1u << 20) == 0)
    snprintf(out, cap, "%zuM", b >> 20);
  else if (b >= 1024 && b % 1024 == 0)
    snprintf(out, cap, "%zuK", b >> 10);
  else
    snprintf(out, cap, "%zu", b);
}

static void time_cell(double t, char *out, size_t cap) {
  if (t < 0)
    snprintf(out, cap, "-");
  else if (t < 1e-3)
    snprintf(out, cap, "%.1fus", t * 1e6);
  else if (t < 1)
    snprintf(out, cap, "%.2fms", t * 1e3);
  else
    snprintf(out, cap, "%.2fs", t);
}

static void print_shape(const brg__model_shape *sh, const brg__model_links *ln, const size_t *sizes,
                        int nsizes, int tsv, int header) {
  if (tsv) {
    for (int i = 0; i < nsizes; i++) {
      int plan, algo = brg__model_auto(sh, ln, sizes[i], &plan);
      for (int p = 0; p < BRG__PLAN_COUNT; p++)
        printf("%d\t%d\t%zu\t%s\t%.17g\n", sh->hosts, sh->local, sizes[i], brg__plan_name(p),
               brg__model_time(p, sh, ln, sizes[i]));
      printf("%d\t%d\t%zu\tauto\t%s/%s\n", sh->hosts, sh->local, sizes[i], brg__algo_name(algo),
             brg__plan_name(plan));
    }
    return;
  }
  if (header) {
    printf("%6s %9s %8s", "ranks", "HxM", "size");
    for (int p = 0; p < BRG__PLAN_COUNT; p++) printf(" %9s", brg__plan_name(p));
    printf("  auto\n");
  }
  for (int i = 0; i < nsizes; i++) {
    char hm[32], sz[32], cell[32];
    snprintf(hm, sizeof hm, "%dx%d", sh->hosts, sh->local);
    size_name(sizes[i], sz, sizeof sz);
    printf("%6d %9s %8s", sh->hosts * sh->local, hm, sz);
    for (int p = 0; p < BRG__PLAN_COUNT; p++) {
      time_cell(brg__model_time(p, sh, ln, sizes[i]), cell, sizeof cell);
      printf(" %9s", cell);
    }
    int plan, algo = brg__model_auto(sh, ln, sizes[i], &plan);
    printf("  %s (%s)\n", brg__algo_name(algo), brg__plan_name(plan));
  }
}

int brg__info_model(int argc, char **argv) {
  brg__model_links ln = brg__model_default_links;
  brg__model_shape sh = {.hosts = 0,
                         .local = 8,
                         .nics = 1,
                         .rings = 1,
                         .small_bytes = 4096,
                         .slice_bytes = 128 * 1024};
  size_t sizes[MAX_SIZES] = {8, 4096, 65536, 1 << 20, 64 << 20};
  int nsizes = 5, tsv = 0, max_ranks = 4096, min_ranks = 64;
  int layout[MAX_LAYOUT], nlayout = 0;
  /* a model file first, whatever its place: the flags below override it */
  for (int i = 0; i + 1 < argc; i++)
    if (!strcmp(argv[i], "--model-file")) {
      brg__errbuf err = {0};
      if (brg__model_read(argv[i + 1], &ln, &err) != BRG_SUCCESS) {
        fprintf(stderr, "brigade-info --model: %s\n", err.msg);
        return 2;
      }
    }
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--tsv") || !strcmp(a, "--no-hier") || !strcmp(a, "--tcp")) {
      tsv |= !strcmp(a, "--tsv");
      sh.no_hier |= !strcmp(a, "--no-hier");
      sh.local_tcp |= !strcmp(a, "--tcp");
      continue;
    }
    if (!v) goto usage;
    i++;
    double d = atof(v);
    size_t z;
    if (!strcmp(a, "--hosts"))
      sh.hosts = atoi(v);
    else if (!strcmp(a, "--per-host"))
      sh.local = atoi(v);
    else if (!strcmp(a, "--nics"))
      sh.nics = atoi(v);
    else if (!strcmp(a, "--rings"))
      sh.rings = atoi(v);
    else if (!strcmp(a, "--min-ranks"))
      min_ranks = atoi(v);
    else if (!strcmp(a, "--max-ranks"))
      max_ranks = atoi(v);
    else if (!strcmp(a, "--small") && !parse_size(v, &z))
      sh.small_bytes = z;
    else if (!strcmp(a, "--slice") && !parse_size(v, &z))
      sh.slice_bytes = z;
    else if (!strcmp(a, "--alpha-net"))
      ln.net_alpha = d;
    else if (!strcmp(a, "--beta-net"))
      ln.net_beta = d;
    else if (!strcmp(a, "--gbit-net") && d > 0)
      ln.net_beta = 8.0 / (d * 1e9);
    else if (!strcmp(a, "--alpha-shm"))
      ln.shm_alpha = d;
    else if (!strcmp(a, "--beta-shm"))
      ln.shm_beta = d;
    else if (!strcmp(a, "--alpha-tcp"))
      ln.tcp_alpha = d;
    else if (!strcmp(a, "--beta-tcp"))
      ln.tcp_beta = d;
    else if (!strcmp(a, "--layout")) {
      char buf[1024];
      snprintf(buf, sizeof buf, "%s", v);
      for (char *save, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (nlayout == MAX_LAYOUT || atoi(t) < 1) goto usage;
        layout[nlayout++] = atoi(t);
      }
    } else if (!strcmp(a, "--cores"))
      sh.cores = atoi(v);
    else if (!strcmp(a, "--alpha-wake"))
      ln.wake_alpha = d;
    else if (!strcmp(a, "--beta-xchg"))
      ln.xchg_beta = d;
    else if (!strcmp(a, "--model-file"))
      ; /* read above */
    else if (!strcmp(a, "--alpha-p2p"))
      ln.p2p_alpha = d;
    else if (!strcmp(a, "--beta-p2p"))
      ln.p2p_beta = d;
    else if (!strcmp(a, "--alpha-p2p-tcp"))
      ln.p2p_tcp_alpha = d;
    else if (!strcmp(a, "--beta-p2p-tcp"))
      ln.p2p_tcp_beta = d;
    else if (!strcmp(a, "--beta-xchg-tcp"))
      ln.xchg_tcp_beta = d;
    else if (!strcmp(a, "--sizes")) {
      nsizes = 0;
      char buf[1024];
      snprintf(buf, sizeof buf, "%s", v);
      for (char *save, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (nsizes == MAX_SIZES || parse_size(t, &sizes[nsizes])) goto usage;
        nsizes++;
      }
    } else
      goto usage;
  }
  if (sh.local < 1 || sh.nics < 1 || sh.rings < 1 || sh.hosts < 0 || nsizes == 0) goto usage;
  if (nlayout > 0) { /* the flat ring on hosts of these rank counts */
    for (int i = 0; i < nsizes; i++) {
      double t = brg__model_ring_layout(layout, nlayout, &ln, sh.small_bytes, sizes[i]);
      if (tsv) {
        for (int h = 0; h < nlayout; h++) printf("%s%d", h ? "," : "", layout[h]);
        printf("\t%zu\tring\t%.17g\n", sizes[i], t);
      } else {
        printf("%10zu B  ring %.1f us\n", sizes[i], t * 1e6);
      }
    }
    return 0;
  }
  char cores_note[96] = "";
  if (sh.cores > 0)
    snprintf(cores_note, sizeof cores_note, "; %d cores a host, a turn %.1f us a queued rank",
             sh.cores, ln.wake_alpha * 1e6);
  if (!tsv) {
    printf("# brigade's allreduce cost model (runtime/plan/model.c); BRIGADE_ALGO=auto takes the "
           "fastest of the flat ring engine (ring, rings or small, as it would run), hier, tree "
           "and rhd\n");
    printf("# links: net alpha %.1f us, %.3f GB/s; shm alpha %.1f us, %.2f GB/s; tcp alpha %.1f "
           "us, %.2f GB/s; p2p alpha %.1f us, %.2f GB/s, exchanges %.2f GB/s over shm, %.1f us, "
           "%.2f GB/s, %.2f GB/s over tcp; %s within a host; %d NIC(s) per host, %d ring(s), "
           "small path up to %zu B, slices of %zu B%s\n",
           ln.net_alpha * 1e6, 1e-9 / ln.net_beta, ln.shm_alpha * 1e6, 1e-9 / ln.shm_beta,
           ln.tcp_alpha * 1e6, 1e-9 / ln.tcp_beta, ln.p2p_alpha * 1e6, 1e-9 / ln.p2p_beta,
           1e-9 / ln.xchg_beta, ln.p2p_tcp_alpha * 1e6, 1e-9 / ln.p2p_tcp_beta,
           1e-9 / ln.xchg_tcp_beta, sh.local_tcp ? "tcp" : "shm", sh.nics, sh.rings, sh.small_bytes,
           sh.slice_bytes, cores_note);
  }
  if (sh.hosts > 0) {
    print_shape(&sh, &ln, sizes, nsizes, tsv, 1);
    return 0;
  }
  int per_host = sh.local;
  for (int n = min_ranks; n <= max_ranks; n *= 2) {
    sh.hosts = n <= per_host ? 1 : n / per_host;
    sh.local = n <= per_host ? n : per_host;
    print_shape(&sh, &ln, sizes, nsizes, tsv, n == min_ranks);
  }
  return 0;
usage:
  fprintf(stderr, "usage: brigade-info --model [--hosts H --per-host M] [--sizes 8,4K,1M] "
                  "[--nics K] [--rings R] [--small B] [--slice B] [--min-ranks N] "
                  "[--max-ranks N] [--no-hier] [--alpha-net S] [--beta-net S/B | --gbit-net G] "
                  "[--alpha-shm S] [--beta-shm S/B] [--tcp] [--alpha-tcp S] [--beta-tcp S/B] "
                  "[--alpha-p2p S] [--beta-p2p S/B] [--beta-xchg S/B] [--alpha-p2p-tcp S] "
                  "[--beta-p2p-tcp S/B] [--beta-xchg-tcp S/B] [--cores C] [--alpha-wake S] "
                  "[--model-file PATH] "
                  "[--tsv]\n");
  return 2;
}

int brg__info_device_shape(int argc, char **argv) {
  int link = -1;
  for (int l = 0; argc >= 1 && l < BRG__DLINK_COUNT; l++)
    if (!strcmp(argv[0], brg__dlink_name(l))) link = l;
  int nranks = argc >= 2 ? atoi(argv[1]) : 0, nslots = argc >= 3 ? atoi(argv[2]) : 8;
  if (link < 0 || nranks < 1 || nslots < 1) {
    fprintf(stderr,
            "usage: brigade-info --device-shape nvlink|pcie|host NRANKS [NSLOTS [SIZE...]]\n"
            "kernel mode's channels and slot bytes by the model (runtime/plan/model.c), one\n"
            "line a size (none, or 0: the shape a communicator is set up with):\n"
            "link, ranks, bytes, channels, slot bytes, why\n");
    return 2;
  }
  for (int i = 3; i < (argc > 3 ? argc : 4); i++) {
    size_t bytes = 0;
    if (i < argc && parse_size(argv[i], &bytes)) {
      fprintf(stderr, "brigade-info --device-shape: not a size: %s\n", argv[i]);
      return 2;
    }
    brg__device_shape sh = brg__model_device_shape(link, nranks, nslots, bytes);
    printf("%s\t%d\t%zu\t%d\t%zu\t%s\n", brg__dlink_name(link), nranks, bytes, sh.channels,
           sh.slot_bytes, sh.why);
  }
  return 0;
}

/* Kernel mode's predictions, for bench/model gpu: the figures, then per
 * size the path the communicator runs with this process's settings
 * (BRIGADE_DEVICE_SMALL_BYTES, _LL_BYTES, _DIRECT_BYTES) and its time, the
 * ring at three fixed shapes (8 channels of 128 KiB posting with fences;
 * 24 of 512 KiB with one release; 24 in LL lines), and the one-shot path
 * with and without LL. */
int brg__info_device_model(int argc, char **argv) {
  int link = BRG__DLINK_NVLINK, gpus = 8, nsizes = 0;
  size_t sizes[MAX_SIZES];
  brg__gpu_costs c;
  int i = 0;
  if (argc >= 1)
    for (int l = 0; l < BRG__DLINK_COUNT; l++)
      if (!strcmp(argv[0], brg__dlink_name(l))) link = l, i = 1;
  c = brg__model_gpu_costs(link);
  for (; i < argc; i++) {
    const char *a = argv[i];
    double *f = NULL;
    for (int k = 0; k < BRG__GPU_COST_FIELDS && !f; k++) {
      const char *n = brg__gpu_cost_name(k);
      if (!strncmp(a, "--", 2) && strlen(a + 2) == strlen(n)) {
        int same = 1;
        for (size_t j = 0; n[j]; j++) same &= a[2 + j] == (n[j] == '_' ? '-' : n[j]);
        if (same) f = brg__gpu_cost_field(&c, k);
      }
    }
    char *end = NULL;
    if (f && i + 1 < argc) {
      *f = strtod(argv[++i], &end);
      if (*end || *f < 0) goto usage;
    } else if (!strcmp(a, "--gpus") && i + 1 < argc) {
      gpus = (int)strtol(argv[++i], &end, 10);
      if (*end || gpus < 1 || gpus > 4096) goto usage;
    } else if (a[0] != '-' && nsizes < MAX_SIZES && !parse_size(a, &sizes[nsizes])) {
      nsizes++;
    } else {
      goto usage;
    }
  }
  if (!nsizes) {
    static const size_t dflt[] = {8, 64 << 10, 1 << 20, 16 << 20, 256 << 20, 1u << 30};
    for (nsizes = 0; nsizes < 6; nsizes++) sizes[nsizes] = dflt[nsizes];
  }
  for (int k = 0; k < BRG__GPU_COST_FIELDS; k++)
    printf("const\t%s\t%g\n", brg__gpu_cost_name(k), *brg__gpu_cost_field(&c, k));
  brg__device_shape full = brg__model_device_shape(link, gpus, 8, 0);
  size_t small = (size_t)brg__device_int(BRG__DEVICE_SMALL_BYTES);
  size_t ll = brg__model_ll_limit(gpus, small);
  size_t direct = (size_t)brg__device_int(BRG__DEVICE_DIRECT);
  if (direct < small) direct = small;
  int most = full.channels < 32 ? full.channels : 32;
  printf("limits\t%zu\t%zu\t%zu\t%zu\t%d\t%zu\t%s\n", ll, small, direct,
         brg__model_ll_crossover(&c, gpus), full.channels, full.slot_bytes, full.why);
  for (int s = 0; s < nsizes; s++) {
    double S = (double)sizes[s], t;
    char path[64];
    if (gpus > 1 && sizes[s] <= ll) {
      snprintf(path, sizeof path, "one-shot LL, 1 block");
      t = brg__model_gpu_oneshot_ll(&c, S, gpus);
    } else if (gpus > 1 && sizes[s] <= small) {
      int b = brg__model_direct_blocks(sizes[s], most);
      snprintf(path, sizeof path, "one-shot, %d blocks", b);
      t = brg__model_gpu_oneshot_many(&c, S, gpus, b);
    } else if (gpus > 1 && sizes[s] <= direct) {
      int b = brg__model_direct_blocks(sizes[s], most);
      snprintf(path, sizeof path, "two-shot, %d blocks", b);
      t = brg__model_gpu_twoshot(&c, S, gpus, b);
    } else {
      brg__device_shape sh = brg__model_device_shape(link, gpus, 8, sizes[s]);
      snprintf(path, sizeof path, "ring, %d channels of %zu KiB", sh.channels, sh.slot_bytes >> 10);
      t = brg__model_gpu_ring_call(&c, S, gpus, sh.channels, sh.slot_bytes);
    }
    printf("run\t%zu\t%s\t%.9g\n", sizes[s], path, t);
    printf("ring\t%zu\t%.9g\t%.9g\t%.9g\n", sizes[s],
           brg__model_gpu_ring(&c, S, gpus, 8, 128 << 10, c.post_us, c.hop_us, 0),
           brg__model_gpu_ring(&c, S, gpus, 24, 512 << 10, c.release_us, c.hop_us, 0),
           brg__model_gpu_ring(&c, S, gpus, 24, 512 << 10, 0.0, c.ll_hop_us, 1));
    printf("oneshot\t%zu\t%.9g\t%.9g\n", sizes[s], brg__model_gpu_oneshot_ll(&c, S, gpus),
           brg__model_gpu_oneshot_plain(&c, S, gpus));
  }
  return 0;
usage:
  fprintf(stderr,
          "usage: brigade-info --device-model [nvlink|pcie|host] [--gpus N] [--NAME VALUE...] "
          "[SIZE...]\n"
          "kernel mode's predicted allreduce times between the GPUs of one host by the model\n"
          "(runtime/plan/model.c), tab-separated: const NAME VALUE for each figure (NAME: ");
  for (int k = 0; k < BRG__GPU_COST_FIELDS; k++)
    fprintf(stderr, "%s%s", k ? ", " : "", brg__gpu_cost_name(k));
  fprintf(stderr, "; --link-gbs 900 sets link_gbs); limits LL_BYTES SMALL_BYTES DIRECT_BYTES "
                  "LL_CROSSOVER CHANNELS SLOT WHY; then per size: run SIZE PATH SECONDS (what the\n"
                  "communicator runs, with this process's BRIGADE_DEVICE_* settings), ring SIZE "
                  "TODAY TUNED LL, oneshot SIZE LL PLAIN\n");
  return 2;
}
