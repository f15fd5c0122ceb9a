/*
 * reducer_overlap: how much of the gradient allreduce the brigade reducer
 * hides behind the backward pass.
 *
 * A synthetic model is a list of layers, each a few parameter tensors. Its
 * backward visits the layers in reverse; per layer it spends a compute time
 * (sleep: the CPU is free, as while a GPU kernel runs; spin: real CPU work)
 * and then calls brg_reducer_mark_ready for that layer's tensors. The same
 * steps run in four modes:
 *
 *   compute only   backward without communication
 *   comm only      one allreduce of all gradients, nothing else
 *   naive          backward, then that one allreduce
 *   reducer        backward with the reducer: buckets overlap the compute
 *
 * With -G the gradients, the buckets and the flat buffer are GPU memory:
 * each layer's compute is a kernel that stays busy for its time on a
 * compute stream, the reducer (device form) is told each gradient is ready
 * on that stream, and a step ends when the compute stream has waited for
 * the reducer (finalize_on) and the host for the compute stream. On the
 * emulated CUDA module (BRIGADE_CUDA_MODULE) the "kernels" are sleeps of
 * a stream thread: those figures are not GPU figures.
 *
 * Ranks: forked here (-n), or taken from a launcher's environment
 * (brigade-run, torchrun: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).
 * Times are per step, the slowest rank's, median over the timed steps.
 */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "brigade.h"
#include "brigade_reducer.h"
#include "cuda/brg_cuda.h"

/* ---- models ------------------------------------------------------------ */

typedef struct layer {
  char name[64];
  size_t first, n; /* tensors [first, first+n) */
  size_t count;    /* elements in those tensors */
} layer;

typedef struct model {
  char name[256];
  size_t ntensors, nlayers, cap_t, cap_l;
  size_t *count;
  char (*tname)[96];
  char (*shape)[48];
  layer *layers;
  size_t total;
  int by_params; /* default split of compute: by parameter count (1) or uniform (0) */
} model;

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "reducer_overlap: ");
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  exit(1);
}

static void *xrealloc(void *p, size_t n) {
  p = realloc(p, n);
  if (p == NULL) die("out of memory");
  return p;
}

static void model_layer(model *m, const char *name) {
  if (m->nlayers == m->cap_l) {
    m->cap_l = m->cap_l ? 2 * m->cap_l : 64;
    m->layers = xrealloc(m->layers, m->cap_l * sizeof(*m->layers));
  }
  layer *l = &m->layers[m->nlayers++];
  snprintf(l->name, sizeof(l->name), "%s", name);
  l->first = m->ntensors, l->n = 0, l->count = 0;
}

/* Adds a tensor "a x b x ..." (up to 4 dims; 0 ends) to the last layer. */
static void model_tensor(model *m, const char *suffix, size_t d0, size_t d1, size_t d2, size_t d3) {
  if (m->ntensors == m->cap_t) {
    m->cap_t = m->cap_t ? 2 * m->cap_t : 256;
    m->count = xrealloc(m->count, m->cap_t * sizeof(*m->count));
    m->tname = xrealloc(m->tname, m->cap_t * sizeof(*m->tname));
    m->shape = xrealloc(m->shape, m->cap_t * sizeof(*m->shape));
  }
  layer *l = &m->layers[m->nlayers - 1];
  size_t t = m->ntensors++, c = d0;
  char *s = m->shape[t];
  int k = snprintf(s, sizeof(m->shape[t]), "%zu", d0);
  size_t dims[3] = {d1, d2, d3};
  for (int i = 0; i < 3 && dims[i]; i++) {
    c *= dims[i];
    k += snprintf(s + k, sizeof(m->shape[t]) - (size_t)k, "x%zu", dims[i]);
  }
  m->count[t] = c;
  snprintf(m->tname[t], sizeof(m->tname[t]), "%s%s%s", l->name, suffix[0] ? "." : "", suffix);
  l->n++, l->count += c, m->total += c;
}

/* torchvision's ResNet-50: 161 tensors, 25,557,032 parameters. A layer is
 * one convolution with its batch norm (or the final fully connected one). */
static void model_resnet50(model *m) {
  snprintf(m->name, sizeof(m->name), "resnet50");
  model_layer(m, "conv1");
  model_tensor(m, "weight", 64, 3, 7, 7);
  model_tensor(m, "bn.weight", 64, 0, 0, 0);
  model_tensor(m, "bn.bias", 64, 0, 0, 0);
  const int blocks[4] = {3, 4, 6, 3}, width[4] = {64, 128, 256, 512};
  size_t in = 64;
  for (int s = 0; s < 4; s++)
    for (int b = 0; b < blocks[s]; b++) {
      size_t w = (size_t)width[s], out = 4 * w;
      const size_t kin[3] = {in, w, w}, kout[3] = {w, w, out}, ks[3] = {1, 3, 1};
      for (int c = 0; c < 3; c++) {
        char nm[64];
        snprintf(nm, sizeof(nm), "layer%d.%d.conv%d", s + 1, b, c + 1);
        model_layer(m, nm);
        model_tensor(m, "weight", kout[c], kin[c], ks[c], ks[c]);
        model_tensor(m, "bn.weight", kout[c], 0, 0, 0);
        model_tensor(m, "bn.bias", kout[c], 0, 0, 0);
      }
      if (b == 0) {
        char nm[64];
        snprintf(nm, sizeof(nm), "layer%d.%d.downsample", s + 1, b);
        model_layer(m, nm);
        model_tensor(m, "weight", out, in, 1, 1);
        model_tensor(m, "bn.weight", out, 0, 0, 0);
        model_tensor(m, "bn.bias", out, 0, 0, 0);
      }
      in = out;
    }
  model_layer(m, "fc");
  model_tensor(m, "weight", 1000, 2048, 0, 0);
  model_tensor(m, "bias", 1000, 0, 0, 0);
}

/* GPT-2 small: 12 blocks of width 768, 50257-token vocabulary (tied output
 * embedding), 1024 positions: 148 tensors, 124,439,808 parameters. */
static void model_gpt2(model *m) {
  const size_t d = 768, vocab = 50257, ctx = 1024;
  snprintf(m->name, sizeof(m->name), "gpt2");
  m->by_params = 1;
  model_layer(m, "embed");
  model_tensor(m, "wte", vocab, d, 0, 0);
  model_tensor(m, "wpe", ctx, d, 0, 0);
  for (int b = 0; b < 12; b++) {
    char nm[64];
    static const char *sub[6] = {"ln_1", "attn.c_attn", "attn.c_proj",
                                 "ln_2", "mlp.c_fc",    "mlp.c_proj"};
    const size_t win[6] = {0, d, d, 0, d, 4 * d}, wout[6] = {d, 3 * d, d, d, 4 * d, d};
    for (int k = 0; k < 6; k++) {
      snprintf(nm, sizeof(nm), "h.%d.%s", b, sub[k]);
      model_layer(m, nm);
      if (win[k] == 0) {
        model_tensor(m, "weight", d, 0, 0, 0);
        model_tensor(m, "bias", d, 0, 0, 0);
      } else {
        model_tensor(m, "weight", win[k], wout[k], 0, 0);
        model_tensor(m, "bias", wout[k], 0, 0, 0);
      }
    }
  }
  model_layer(m, "ln_f");
  model_tensor(m, "weight", d, 0, 0, 0);
  model_tensor(m, "bias", d, 0, 0, 0);
}

/* A sizes file: one layer a line, "name shape shape ...", a shape being
 * "768" or "64x3x7x7"; '#' starts a comment. */
static void model_file(model *m, const char *path) {
  FILE *f = fopen(path, "r");
  if (f == NULL) die("%s: %s", path, strerror(errno));
  snprintf(m->name, sizeof(m->name), "%s", path);
  m->by_params = 1;
  char line[4096];
  int lineno = 0;
  while (fgets(line, sizeof(line), f)) {
    lineno++;
    char *hash = strchr(line, '#');
    if (hash) *hash = '\0';
    char *save = NULL, *tok = strtok_r(line, " \t\r\n", &save);
    if (tok == NULL) continue;
    model_layer(m, tok);
    int ntensor = 0;
    while ((tok = strtok_r(NULL, " \t\r\n", &save)) != NULL) {
      size_t dims[4] = {0, 0, 0, 0};
      int nd = 0;
      char *p = tok;
      while (*p) {
        if (nd == 4 || !isdigit((unsigned char)*p)) die("%s:%d: bad shape '%s'", path, lineno, tok);
        char *end;
        dims[nd++] = strtoull(p, &end, 10);
        if (dims[nd - 1] == 0) die("%s:%d: zero dimension in '%s'", path, lineno, tok);
        p = end;
        if (*p == 'x')
          p++;
        else if (*p)
          die("%s:%d: bad shape '%s'", path, lineno, tok);
      }
      char suffix[16];
      snprintf(suffix, sizeof(suffix), "%d", ntensor++);
      model_tensor(m, suffix, dims[0], dims[1], dims[2], dims[3]);
    }
    if (ntensor == 0)
      die("%s:%d: layer '%s' has no tensors", path, lineno, m->layers[m->nlayers - 1].name);
  }
  fclose(f);
  if (m->nlayers == 0) die("%s: no layers", path);
}

static void model_free(model *m) {
  free(m->count);
  free(m->tname);
  free(m->shape);
  free(m->layers);
  memset(m, 0, sizeof(*m));
}

static void model_dump(const model *m, FILE *f) {
  fprintf(f, "# %s: %zu tensors in %zu layers, %zu parameters (forward order)\n", m->name,
          m->ntensors, m->nlayers, m->total);
  for (size_t l = 0; l < m->nlayers; l++) {
    fprintf(f, "%s", m->layers[l].name);
    for (size_t t = m->layers[l].first; t < m->layers[l].first + m->layers[l].n; t++)
      fprintf(f, " %s", m->shape[t]);
    fputc('\n', f);
  }
}

/* ---- options ------------------------------------------------------------- */

typedef struct opts {
  int nranks;
  const char *model;
  int spin;
  double compute_ms; /* < 0: auto, the measured comm-only time */
  int layer_time;    /* -1 model default, 0 uniform, 1 by parameters */
  double cap_mb, first_cap_mb;
  brg_dtype dtype;
  brg_reducer_hook hook;
  int view;
  int write_grads;
  int iters, warmup;
  int json, dump;
  int device; /* -G */
} opts;

static void usage(FILE *f) {
  fprintf(f,
          "usage: reducer_overlap [options]\n"
          "Times a synthetic backward pass with and without the brigade reducer.\n\n"
          "  -n, --ranks N            ranks to fork here (default 2); ignored under a launcher\n"
          "  -m, --model M            resnet50 (default), gpt2, or a sizes file\n"
          "  -c, --compute KIND       sleep (default; the CPU is free, as under a GPU kernel)\n"
          "                           or spin (real CPU work)\n"
          "  -t, --compute-ms MS      backward compute per step; 'auto' (default): the measured\n"
          "                           comm-only time\n"
          "  -l, --layer-time HOW     uniform (same time per layer) or params (by parameter\n"
          "                           count); default uniform for resnet50, params otherwise\n"
          "  -b, --bucket-cap MB      bucket cap (default 25)\n"
          "  -f, --first-bucket-cap MB  first bucket cap (default 1)\n"
          "  -d, --dtype T            float32 (default), float64, float16, bfloat16\n"
          "  -k, --hook H             none (default), fp16, bf16\n"
          "  -v, --view 0|1           gradients as bucket views (default 1)\n"
          "  -g, --write-grads        backward writes every gradient before marking it ready\n"
          "  -i, --iters N            timed steps per mode (default 10)\n"
          "  -w, --warmup N           untimed steps per mode (default 3)\n"
          "  -G, --device             GPU buffers, the reducer's device form, compute as GPU\n"
          "                           kernels (GPU LOCAL_RANK or rank modulo the GPUs seen)\n"
          "  -j, --json               also print one JSON line of the results\n"
          "      --dump-model         print the model as a sizes file and exit\n"
          "  -h, --help\n");
}

static double parse_num(const char *s, const char *what) {
  char *end;
  double v = strtod(s, &end);
  if (*s == '\0' || *end != '\0' || !(v >= 0)) die("bad %s '%s'", what, s);
  return v;
}

static void parse_opts(int argc, char **argv, opts *o) {
  static const struct option lo[] = {{"ranks", 1, 0, 'n'},
                                     {"model", 1, 0, 'm'},
                                     {"compute", 1, 0, 'c'},
                                     {"compute-ms", 1, 0, 't'},
                                     {"layer-time", 1, 0, 'l'},
                                     {"bucket-cap", 1, 0, 'b'},
                                     {"first-bucket-cap", 1, 0, 'f'},
                                     {"dtype", 1, 0, 'd'},
                                     {"hook", 1, 0, 'k'},
                                     {"view", 1, 0, 'v'},
                                     {"write-grads", 0, 0, 'g'},
                                     {"iters", 1, 0, 'i'},
                                     {"warmup", 1, 0, 'w'},
                                     {"json", 0, 0, 'j'},
                                     {"device", 0, 0, 'G'},
                                     {"dump-model", 0, 0, 'D'},
                                     {"help", 0, 0, 'h'},
                                     {0, 0, 0, 0}};
  *o = (opts){.nranks = 2,
              .model = "resnet50",
              .compute_ms = -1,
              .layer_time = -1,
              .cap_mb = 25,
              .first_cap_mb = 1,
              .dtype = BRG_FLOAT32,
              .view = 1,
              .iters = 10,
              .warmup = 3};
  int c;
  while ((c = getopt_long(argc, argv, "n:m:c:t:l:b:f:d:k:v:gi:w:jGh", lo, NULL)) != -1) {
    switch (c) {
    case 'n': o->nranks = (int)parse_num(optarg, "rank count"); break;
    case 'm': o->model = optarg; break;
    case 'c':
      if (!strcmp(optarg, "sleep"))
        o->spin = 0;
      else if (!strcmp(optarg, "spin"))
        o->spin = 1;
      else
        die("--compute is sleep or spin");
      break;
    case 't':
      o->compute_ms = !strcmp(optarg, "auto") ? -1 : parse_num(optarg, "compute time");
      break;
    case 'l':
      if (!strcmp(optarg, "uniform"))
        o->layer_time = 0;
      else if (!strcmp(optarg, "params"))
        o->layer_time = 1;
      else
        die("--layer-time is uniform or params");
      break;
    case 'b': o->cap_mb = parse_num(optarg, "bucket cap"); break;
    case 'f': o->first_cap_mb = parse_num(optarg, "first bucket cap"); break;
    case 'd':
      if (!strcmp(optarg, "float32") || !strcmp(optarg, "float"))
        o->dtype = BRG_FLOAT32;
      else if (!strcmp(optarg, "float64") || !strcmp(optarg, "double"))
        o->dtype = BRG_FLOAT64;
      else if (!strcmp(optarg, "float16") || !strcmp(optarg, "half"))
        o->dtype = BRG_FLOAT16;
      else if (!strcmp(optarg, "bfloat16"))
        o->dtype = BRG_BFLOAT16;
      else
        die("unknown dtype '%s'", optarg);
      break;
    case 'k':
      if (!strcmp(optarg, "none"))
        o->hook = BRG_REDUCER_HOOK_ALLREDUCE;
      else if (!strcmp(optarg, "fp16"))
        o->hook = BRG_REDUCER_HOOK_FP16;
      else if (!strcmp(optarg, "bf16"))
        o->hook = BRG_REDUCER_HOOK_BF16;
      else
        die("--hook is none, fp16 or bf16");
      break;
    case 'v': o->view = (int)parse_num(optarg, "view") != 0; break;
    case 'g': o->write_grads = 1; break;
    case 'i': o->iters = (int)parse_num(optarg, "iters"); break;
    case 'w': o->warmup = (int)parse_num(optarg, "warmup"); break;
    case 'j': o->json = 1; break;
    case 'G': o->device = 1; break;
    case 'D': o->dump = 1; break;
    case 'h': usage(stdout); exit(0);
    default: usage(stderr); exit(2);
    }
  }
  if (optind < argc) die("unexpected argument '%s'", argv[optind]);
  if (o->iters < 1) die("--iters must be at least 1");
  if (o->nranks < 1 || o->nranks > 256) die("--ranks out of range");
}

/* ---- timing ---------------------------------------------------------------- */

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void compute(double seconds, int spin) {
  if (seconds <= 0) return;
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  double end = (double)t.tv_sec + (double)t.tv_nsec * 1e-9 + seconds;
  if (spin) {
    volatile double x = 1.0;
    while (now_s() < end)
      for (int i = 0; i < 200; i++) x = x * 1.0000001 + 1e-9;
    return;
  }
  long ns = t.tv_nsec + (long)(seconds * 1e9);
  t.tv_sec += ns / 1000000000L;
  t.tv_nsec = ns % 1000000000L;
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &t, NULL) == EINTR) {}
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* ---- one rank ---------------------------------------------------------------- */

enum { MODE_COMM, MODE_COMPUTE, MODE_NAIVE, MODE_REDUCER, NMODES };
static const char *mode_name[NMODES] = {
    "comm only", "compute only", "naive (backward, then allreduce)", "brigade reducer (overlap)"};

typedef struct bench {
  opts o;
  model m;
  brg_comm *comm;
  int rank, nranks;
  brg_reducer *red;
  void *flat;               /* every gradient, contiguous: the naive allreduce's buffer */
  const brg__cuda_api *gpu; /* -G */
  void *cstream;            /* -G: the compute stream */
  void **grad;              /* per tensor: where backward writes its gradient */
  double *layer_s;          /* compute seconds per layer */
  size_t esize;
} bench;

#define BRG_OK(call)                                                                               \
  do {                                                                                             \
    brg_status s_ = (call);                                                                        \
    if (s_ != BRG_SUCCESS)                                                                         \
      die("rank %d: %s: %s: %s", b->rank, #call, brg_status_string(s_),                            \
          b->red ? brg_reducer_last_error(b->red) : brg_comm_last_error(b->comm));                 \
  } while (0)

#define GPU_OK(call)                                                                               \
  do {                                                                                             \
    int e_ = (call);                                                                               \
    if (e_) die("rank %d: %s: %s", b->rank, #call, b->gpu->drv.error_string(e_));                  \
  } while (0)

static void backward(bench *b, int with_reducer) {
  for (size_t l = b->m.nlayers; l-- > 0;) {
    const layer *ly = &b->m.layers[l];
    if (b->gpu)
      GPU_OK(b->gpu->kern.busy((unsigned)(b->layer_s[l] * 1e6), b->cstream));
    else
      compute(b->layer_s[l], b->o.spin);
    for (size_t t = ly->first + ly->n; t-- > ly->first;) {
      if (b->o.write_grads) memset(b->grad[t], (int)(l & 0x3f), b->m.count[t] * b->esize);
      if (with_reducer && b->gpu)
        BRG_OK(brg_reducer_mark_ready_on(b->red, t, b->cstream));
      else if (with_reducer)
        BRG_OK(brg_reducer_mark_ready(b->red, t));
    }
  }
}

/* One step; returns the seconds the reducer's finalize waited (0 otherwise). */
static double step(bench *b, int mode) {
  double t0;
  void *st = b->cstream; /* NULL: host buffers */
  switch (mode) {
  case MODE_COMM:
    BRG_OK(brg_allreduce(b->flat, b->flat, b->m.total, b->o.dtype, BRG_AVG, b->comm, st));
    break;
  case MODE_COMPUTE: backward(b, 0); break;
  case MODE_NAIVE:
    backward(b, 0);
    BRG_OK(brg_allreduce(b->flat, b->flat, b->m.total, b->o.dtype, BRG_AVG, b->comm, st));
    break;
  case MODE_REDUCER:
    BRG_OK(brg_reducer_prepare(b->red, 0));
    backward(b, 1);
    t0 = now_s();
    if (b->gpu) {
      BRG_OK(brg_reducer_finalize_on(b->red, st));
      GPU_OK(b->gpu->drv.stream_sync(st));
    } else {
      BRG_OK(brg_reducer_finalize(b->red));
    }
    return now_s() - t0;
  }
  if (b->gpu) GPU_OK(b->gpu->drv.stream_sync(st));
  return 0;
}

static double median(double *t, int n) {
  qsort(t, (size_t)n, sizeof(double), cmp_double);
  return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

/* Median over steps of the slowest rank's step time, in seconds; *fin gets
 * the same for the time spent in finalize. */
static double time_mode(bench *b, int mode, double *fin) {
  int n = b->o.iters;
  double *t = calloc(2 * (size_t)n, sizeof(double));
  if (t == NULL) die("out of memory");
  for (int i = 0; i < b->o.warmup + n; i++) {
    BRG_OK(brg_barrier(b->comm));
    double t0 = now_s();
    double f = step(b, mode);
    double dt = now_s() - t0;
    if (i >= b->o.warmup) t[i - b->o.warmup] = dt, t[n + i - b->o.warmup] = f;
  }
  BRG_OK(brg_allreduce(t, t, 2 * (size_t)n, BRG_FLOAT64, BRG_MAX, b->comm, NULL));
  double med = median(t, n);
  if (fin) *fin = median(t + n, n);
  free(t);
  return med;
}

static void set_compute(bench *b, double total_s) {
  int by_params = b->o.layer_time >= 0 ? b->o.layer_time : b->m.by_params;
  for (size_t l = 0; l < b->m.nlayers; l++)
    b->layer_s[l] = by_params ? total_s * (double)b->m.layers[l].count / (double)b->m.total
                              : total_s / (double)b->m.nlayers;
}

static int run_rank(opts *o, brg_comm *comm) {
  bench bb = {.o = *o, .comm = comm}, *b = &bb;
  if (!strcmp(o->model, "resnet50"))
    model_resnet50(&b->m);
  else if (!strcmp(o->model, "gpt2"))
    model_gpt2(&b->m);
  else
    model_file(&b->m, o->model);
  BRG_OK(brg_comm_rank(comm, &b->rank));
  BRG_OK(brg_comm_size(comm, &b->nranks));
  b->esize = brg_dtype_size(o->dtype);

  /* Everything allocated and touched before any clock starts. */
  size_t bytes = b->m.total * b->esize;
  if (o->device) {
    char why[512] = "";
    b->gpu = brg__cuda_open_beside((const void *)&brg_allreduce, why, sizeof why);
    if (!b->gpu) die("rank %d: -G: no usable GPU: %s", b->rank, why);
    if (o->write_grads) die("-g (backward writes gradients on the host) does not go with -G");
    const char *lr = getenv("LOCAL_RANK");
    GPU_OK(b->gpu->drv.set_device((lr && *lr ? atoi(lr) : b->rank) % b->gpu->drv.probe(NULL, 0)));
    GPU_OK(b->gpu->drv.mem_alloc(&b->flat, bytes));
    GPU_OK(b->gpu->drv.mem_set(b->flat, 0, bytes));
    GPU_OK(b->gpu->drv.stream_create(&b->cstream));
  } else {
    if (posix_memalign(&b->flat, 4096, bytes) != 0) die("out of memory for %zu bytes", bytes);
    memset(b->flat, 0, bytes);
  }
  b->grad = calloc(b->m.ntensors, sizeof(void *));
  b->layer_s = calloc(b->m.nlayers, sizeof(double));
  brg_reducer_param *prm = calloc(b->m.ntensors, sizeof(*prm));
  if (!b->grad || !b->layer_s || !prm) die("out of memory");
  size_t off = 0;
  for (size_t t = 0; t < b->m.ntensors; t++) {
    b->grad[t] = (char *)b->flat + off * b->esize;
    prm[t] = (brg_reducer_param){.name = b->m.tname[t],
                                 .count = b->m.count[t],
                                 .dtype = o->dtype,
                                 .grad = o->view ? NULL : b->grad[t]};
    off += b->m.count[t];
  }
  brg_reducer_config cfg = {.bucket_cap_bytes = (size_t)(o->cap_mb * 1048576.0),
                            .first_bucket_cap_bytes = (size_t)(o->first_cap_mb * 1048576.0),
                            .flags = (o->view ? BRG_REDUCER_GRAD_AS_VIEW : 0) |
                                     (o->device ? BRG_REDUCER_DEVICE : 0),
                            .hook = o->hook};
  BRG_OK(brg_reducer_create(&b->red, comm, prm, b->m.ntensors, &cfg));
  free(prm);

  double res[NMODES];
  res[MODE_COMM] = time_mode(b, MODE_COMM, NULL);
  double compute_s = o->compute_ms >= 0 ? o->compute_ms * 1e-3 : res[MODE_COMM];
  BRG_OK(brg_broadcast(&compute_s, &compute_s, 1, BRG_FLOAT64, 0, comm, NULL));
  set_compute(b, compute_s);
  res[MODE_COMPUTE] = time_mode(b, MODE_COMPUTE, NULL);
  res[MODE_NAIVE] = time_mode(b, MODE_NAIVE, NULL);
  /* The first reducer step rebuilds the buckets (views move): warm up, then
   * point the backward at the gradients' new homes. */
  BRG_OK(brg_barrier(comm));
  step(b, MODE_REDUCER);
  if (o->view)
    for (size_t t = 0; t < b->m.ntensors; t++) BRG_OK(brg_reducer_grad(b->red, t, &b->grad[t]));
  double fin_s;
  res[MODE_REDUCER] = time_mode(b, MODE_REDUCER, &fin_s);
  size_t nbuckets;
  BRG_OK(brg_reducer_num_buckets(b->red, &nbuckets));

  if (b->rank == 0) {
    double comp = res[MODE_COMPUTE], comm_s = res[MODE_COMM], red = res[MODE_REDUCER];
    double hidden = 1.0 - (red - comp) / comm_s;
    if (hidden < 0) hidden = 0;
    if (hidden > 1) hidden = 1;
    double ratio = red / (comp > comm_s ? comp : comm_s);
    int by_params = o->layer_time >= 0 ? o->layer_time : b->m.by_params;
    static const char *hooks[3] = {"none", "fp16", "bf16"};
    printf("# reducer_overlap: brigade %d.%d.%d, %d ranks\n", BRG_VERSION_MAJOR, BRG_VERSION_MINOR,
           BRG_VERSION_PATCH, b->nranks);
    if (b->gpu) {
      char desc[256];
      b->gpu->drv.describe(desc, sizeof desc);
      printf("# GPU buffers (-G): %s; compute: a busy kernel per layer on a compute stream\n",
             desc);
    }
    printf("# model %s: %zu tensors in %zu layers, %.2f M parameters, %.1f MB of %s gradients\n",
           b->m.name, b->m.ntensors, b->m.nlayers, (double)b->m.total * 1e-6, (double)bytes * 1e-6,
           brg_dtype_name(o->dtype));
    printf("# backward: %s, %.1f ms per step (%s over layers)%s\n",
           b->gpu    ? "GPU kernels"
           : o->spin ? "spin"
                     : "sleep",
           compute_s * 1e3, by_params ? "by parameter count" : "uniform",
           o->compute_ms < 0 ? ", set to the comm-only time" : "");
    printf("# reducer: %zu buckets (first %.3g MiB, then %.3g MiB), %s, hook %s%s\n", nbuckets,
           o->first_cap_mb, o->cap_mb, o->view ? "gradients as bucket views" : "gradients copied",
           hooks[o->hook], o->write_grads ? ", backward writes gradients" : "");
    printf("# step times: median of %d steps (after %d warmup), slowest rank\n#\n", o->iters,
           o->warmup);
    printf("#  %-34s %10s\n", "mode", "step (ms)");
    static const int order[NMODES] = {MODE_COMPUTE, MODE_COMM, MODE_NAIVE, MODE_REDUCER};
    for (int k = 0; k < NMODES; k++)
      printf("   %-34s %10.2f\n", mode_name[order[k]], res[order[k]] * 1e3);
    printf("#  of the reducer's step: backward %.2f ms, then finalize %.2f ms\n",
           (red - fin_s) * 1e3, fin_s * 1e3);
    printf("#\n# communication hidden: %.1f %%   speedup over naive: %.2fx   "
           "reducer / max(compute, comm): %.3f\n",
           hidden * 100, res[MODE_NAIVE] / red, ratio);
    if (o->json)
      printf("{\"model\": \"%s\", \"ranks\": %d, \"tensors\": %zu, \"params\": %zu, \"dtype\": "
             "\"%s\", "
             "\"compute\": \"%s\", \"compute_ms\": %.3f, \"buckets\": %zu, \"view\": %d, "
             "\"hook\": \"%s\", \"compute_only_ms\": %.3f, \"comm_only_ms\": %.3f, "
             "\"naive_ms\": %.3f, \"reducer_ms\": %.3f, \"finalize_ms\": %.3f, "
             "\"hidden\": %.4f, \"speedup\": %.4f, \"ratio\": %.4f}\n",
             b->m.name, b->nranks, b->m.ntensors, b->m.total, brg_dtype_name(o->dtype),
             o->spin ? "spin" : "sleep", compute_s * 1e3, nbuckets, o->view, hooks[o->hook],
             comp * 1e3, comm_s * 1e3, res[MODE_NAIVE] * 1e3, red * 1e3, fin_s * 1e3, hidden,
             res[MODE_NAIVE] / red, ratio);
    fflush(stdout);
  }
  BRG_OK(brg_reducer_destroy(b->red));
  b->red = NULL;
  if (b->gpu) {
    b->gpu->drv.stream_destroy(b->cstream);
    b->gpu->drv.mem_free(b->flat);
  } else {
    free(b->flat);
  }
  free(b->grad);
  free(b->layer_s);
  model_free(&b->m);
  return 0;
}

int main(int argc, char **argv) {
  opts o;
  parse_opts(argc, argv, &o);
  if (o.dump) {
    model m = {0};
    if (!strcmp(o.model, "resnet50"))
      model_resnet50(&m);
    else if (!strcmp(o.model, "gpt2"))
      model_gpt2(&m);
    else
      model_file(&m, o.model);
    model_dump(&m, stdout);
    model_free(&m);
    return 0;
  }

  brg_comm *comm;
  if (getenv("WORLD_SIZE") != NULL) { /* under a launcher */
    brg_status st = brg_comm_init_env(&comm);
    if (st != BRG_SUCCESS) die("brg_comm_init_env: %s", brg_comm_last_error(NULL));
    int rc = run_rank(&o, comm);
    brg_comm_destroy(comm);
    return rc;
  }

  /* Fork the ranks first, then hand each the id through a pipe. */
  int n = o.nranks;
  pid_t *pid = calloc((size_t)n, sizeof(pid_t));
  int(*fds)[2] = calloc((size_t)n, sizeof(*fds));
  if (!pid || !fds) die("out of memory");
  for (int r = 0; r < n; r++) {
    if (pipe(fds[r]) != 0) die("pipe: %s", strerror(errno));
    pid[r] = fork();
    if (pid[r] < 0) die("fork: %s", strerror(errno));
    if (pid[r] == 0) {
      close(fds[r][1]);
      brg_unique_id id;
      if (read(fds[r][0], &id, sizeof(id)) != (ssize_t)sizeof(id)) _exit(1);
      brg_status st = brg_comm_init(&comm, n, &id, r);
      if (st != BRG_SUCCESS) {
        fprintf(stderr, "rank %d: brg_comm_init: %s\n", r, brg_comm_last_error(NULL));
        _exit(1);
      }
      int rc = run_rank(&o, comm);
      brg_comm_destroy(comm);
      _exit(rc);
    }
    close(fds[r][0]);
  }
  brg_unique_id id;
  if (brg_get_unique_id(&id) != BRG_SUCCESS) {
    fprintf(stderr, "reducer_overlap: brg_get_unique_id: %s\n", brg_comm_last_error(NULL));
    for (int r = 0; r < n; r++) kill(pid[r], SIGKILL);
    return 1;
  }
  for (int r = 0; r < n; r++) {
    if (write(fds[r][1], &id, sizeof(id)) != (ssize_t)sizeof(id)) perror("write");
    close(fds[r][1]);
  }
  int failed = 0;
  for (int left = n; left > 0;) {
    int status;
    pid_t w = waitpid(-1, &status, 0);
    if (w < 0) {
      if (errno == EINTR) continue;
      break;
    }
    left--;
    if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0) && !failed) {
      failed = 1;
      for (int r = 0; r < n; r++)
        if (pid[r] != w && pid[r] > 0) kill(pid[r], SIGKILL);
    }
    for (int r = 0; r < n; r++)
      if (pid[r] == w) pid[r] = -1;
  }
  free(pid);
  free(fds);
  return failed;
}
