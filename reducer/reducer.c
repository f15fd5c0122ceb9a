/*
 * The bucketed gradient reducer (see include/brigade_reducer.h).
 *
 * One backward pass, seen from here:
 *
 *   prepare ── mark_ready(p) ... ── finalize
 *                  │                   │
 *                  ├ pack p into its   ├ wait bucket 0, unpack; wait bucket 1, unpack; ...
 *                  │ bucket (copy or   │
 *                  │ cast, no lock)    │
 *                  └ bucket complete? launch every complete bucket from
 *                    next_launch on, in bucket order (under the lock)
 *
 * Only brigade.h is used: brg_iallreduce queues each bucket on the
 * communicator's worker thread, and brigade runs collectives in issue order,
 * so launching in bucket order is what keeps the ranks in step.
 *
 * The device form (BRG_REDUCER_DEVICE) keeps the buckets in GPU memory and
 * does all its GPU work on one communication stream, through the CUDA
 * module's table (the runtime's brg__device_api): mark_ready makes that
 * stream wait for the gradient's producer (an event recorded on the
 * producer's stream, waited for at once, so one event serves every mark),
 * then copies or casts the gradient into its bucket there; a full bucket is
 * a device allreduce on the same stream; finalize unpacks there too and
 * makes the caller's stream wait for it. The host never waits for the GPU
 * in a step, except in the blocking finalize. GPU memory is freed only at
 * destroy: the buckets the one rebuild replaces are kept until then
 * (red_dev.retired), since cudaFree waits for the whole device, which
 * includes neighbours' kernels that wait for this rank when ranks are
 * threads of one process.
 *
 * All memory (bucket buffers, per-parameter flags, the used-parameter
 * bitmap) is allocated and touched at create or at the one rebuild; the
 * backward pass itself allocates nothing.
 */
#include "brigade_reducer.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buckets.h"
#include "convert.h"
#include "device.h"

#define ERRLEN 4096
#define ZERO_BYTES (1u << 20) /* device zeros, copied from to clear a range */
#define SLAB_ALIGN 4096
#define BUCKET_ALIGN 64

enum { STATE_IDLE, STATE_BACKWARD, STATE_FINALIZING };

typedef struct red_bucket {
  brg_dtype dtype;
  size_t count;    /* elements */
  size_t first, n; /* members[first .. first+n) of the layout */
  size_t flat_at;  /* bytes into the slab, or (size_t)-1 without a flat buffer */
  size_t half_at;  /* bytes into the slab, or (size_t)-1 without a half buffer */
  void *flat;      /* count elements of dtype; NULL when compression needs none */
  uint16_t *half;  /* the float16/bfloat16 wire buffer of a compression hook, or NULL */
  size_t pending;  /* members not ready yet in this pass */
  int inflight;    /* a collective was issued on req and not yet waited */
  brg_request req;
} red_bucket;

/* Where every gradient sits; replaced as a whole by the rebuild. */
typedef struct red_layout {
  size_t nbuckets;
  red_bucket *buckets;
  size_t *members;      /* parameter indices, bucket after bucket */
  size_t *bucket_start; /* nparams + 1 */
  size_t *bucket_of;    /* per parameter */
  size_t *offset;       /* per parameter: elements into its bucket */
  size_t slab_bytes;
  void *slab; /* every flat and half buffer */
} red_layout;

typedef struct red_param {
  char *name; /* NULL when none was given */
  size_t count;
  brg_dtype dtype;
  void *data;
  void *grad; /* the registered gradient; NULL with views */
} red_param;

/* The device form's GPU side. */
typedef struct red_dev {
  const brg__cuda_api *api; /* NULL: the host form */
  int gpu;                  /* of every parameter */
  void *stream;             /* the communication stream */
  int own_stream;
  void *mark_ev; /* recorded on a producer's stream, waited for by `stream` at once */
  void *done_ev; /* recorded on `stream` at finalize, for the caller's stream */
  void *zeros;   /* ZERO_BYTES of zeros in GPU memory */
  /* Bucket slabs no longer in use, freed at destroy: cudaFree waits for all
   * of the process's work on the GPU, and with ranks as threads of one
   * process a neighbour's next collective kernel, which waits for this
   * rank, is part of that work. */
  void **retired;
  size_t nretired;
} red_dev;

struct brg_reducer {
  brg_comm *comm;
  red_dev dev;
  int rank, nranks;
  brg_reducer_config cfg;
  int view, average, find_unused, static_graph, rebuild;
  brg_dtype half; /* wire dtype of the compression hook; unused without one */
  int compress;

  size_t nparams;
  red_param *params;
  red_layout lay;

  pthread_mutex_t lock;
  pthread_cond_t marks_done;
  int state;
  int sync;           /* current pass communicates */
  int marks_inflight; /* mark_ready calls between their two locked sections */
  size_t next_launch; /* first bucket not launched in this pass */
  uint8_t *marked;    /* per parameter, this pass */
  size_t *order;      /* ready order of this pass */
  size_t norder;
  uint8_t *used_local;  /* marked in some pass since the last synced one: bitmap sendbuf */
  uint8_t *used_global; /* recvbuf: used on some rank */
  brg_request used_req;
  int used_inflight;
  uint64_t nsynced;   /* finished synced passes */
  int64_t *order_buf; /* the rebuild's broadcast of rank 0's order */

  /* Static graph: what the first synced pass saw. */
  int have_static;
  uint8_t *static_local, *static_global;
  size_t *static_order;
  size_t static_norder;

  brg_status pass_status; /* first error of the current pass */
  char pass_err[ERRLEN];
  char err[ERRLEN];
};

static __thread char create_err[ERRLEN];

/* ---- errors ---------------------------------------------------------- */

static brg_status vfail(brg_reducer *red, brg_status st, const char *fmt, va_list ap) {
  char *buf = red != NULL ? red->err : create_err;
  vsnprintf(buf, ERRLEN, fmt, ap);
  return st;
}

static brg_status fail(brg_reducer *red, brg_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static brg_status fail(brg_reducer *red, brg_status st, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vfail(red, st, fmt, ap);
  va_end(ap);
  return st;
}

/* An error of the current pass: returned now and again by finalize.
 * Caller holds the lock (or is the only thread in the pass). */
static brg_status fail_pass(brg_reducer *red, brg_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static brg_status fail_pass(brg_reducer *red, brg_status st, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vfail(red, st, fmt, ap);
  va_end(ap);
  if (red->pass_status == BRG_SUCCESS) {
    red->pass_status = st;
    memcpy(red->pass_err, red->err, ERRLEN);
  }
  return st;
}

/* "'fc.weight' (#160)", or "#160" for an unnamed parameter. */
static const char *pname(const brg_reducer *red, size_t p, char *buf, size_t len) {
  if (red->params[p].name != NULL)
    snprintf(buf, len, "'%s' (#%zu)", red->params[p].name, p);
  else
    snprintf(buf, len, "#%zu", p);
  return buf;
}

const char *brg_reducer_last_error(const brg_reducer *red) {
  return red != NULL ? red->err : create_err;
}

/* ---- layout ---------------------------------------------------------- */

static int compressible(const brg_reducer *red, brg_dtype dt) {
  return red->compress && (dt == BRG_FLOAT32 || dt == BRG_FLOAT64);
}

static size_t align_up(size_t x, size_t a) {
  return (x + a - 1) / a * a;
}

/* A device slab is retired, not freed: see red_dev.retired. Only when the
 * list cannot grow (no host memory) is it freed at once. */
static void layout_free(brg_reducer *red, red_layout *lay) {
  free(lay->buckets);
  free(lay->members);
  free(lay->bucket_start);
  free(lay->bucket_of);
  free(lay->offset);
  if (red->dev.api && lay->slab) {
    void **r = realloc(red->dev.retired, (red->dev.nretired + 1) * sizeof(*r));
    if (r != NULL) {
      red->dev.retired = r;
      r[red->dev.nretired++] = lay->slab;
    } else {
      red->dev.api->drv.mem_free(lay->slab);
    }
  } else {
    free(lay->slab);
  }
  memset(lay, 0, sizeof(*lay));
}

/* Builds buckets for parameters filled in `fill_order`: their members and
 * where each buffer sits in the slab (layout_place allocates it). */
static brg_status layout_build(brg_reducer *red, const size_t *fill_order, red_layout *lay) {
  size_t n = red->nparams;
  size_t *count = NULL;
  brg_dtype *dtype = NULL;
  brg_status st = BRG_ERR_NO_MEMORY;

  memset(lay, 0, sizeof(*lay));
  count = malloc(n * sizeof(*count));
  dtype = malloc(n * sizeof(*dtype));
  lay->members = malloc(n * sizeof(size_t));
  lay->bucket_start = malloc((n + 1) * sizeof(size_t));
  lay->bucket_of = malloc(n * sizeof(size_t));
  lay->offset = malloc(n * sizeof(size_t));
  if (!count || !dtype || !lay->members || !lay->bucket_start || !lay->bucket_of || !lay->offset)
    goto err;
  for (size_t p = 0; p < n; p++) {
    count[p] = red->params[p].count;
    dtype[p] = red->params[p].dtype;
  }
  st = brg__bucket_assign(n, count, dtype, fill_order, red->cfg.first_bucket_cap_bytes,
                          red->cfg.bucket_cap_bytes, lay->members, lay->bucket_start,
                          lay->bucket_of, &lay->nbuckets);
  if (st != BRG_SUCCESS) goto err;
  st = BRG_ERR_NO_MEMORY;
  lay->buckets = calloc(lay->nbuckets, sizeof(red_bucket));
  if (lay->buckets == NULL) goto err;

  /* Offsets, then one slab for every bucket buffer. */
  size_t slab_bytes = 0;
  for (size_t b = 0; b < lay->nbuckets; b++) {
    red_bucket *bk = &lay->buckets[b];
    bk->first = lay->bucket_start[b];
    bk->n = lay->bucket_start[b + 1] - bk->first;
    bk->dtype = red->params[lay->members[bk->first]].dtype;
    for (size_t k = bk->first; k < bk->first + bk->n; k++) {
      size_t p = lay->members[k];
      lay->offset[p] = bk->count;
      bk->count += red->params[p].count;
    }
    int cmp = compressible(red, bk->dtype);
    int need_flat = red->view || !cmp;
    bk->flat_at = need_flat ? slab_bytes : (size_t)-1;
    if (need_flat)
      slab_bytes = align_up(slab_bytes + bk->count * brg_dtype_size(bk->dtype), BUCKET_ALIGN);
    bk->half_at = cmp ? slab_bytes : (size_t)-1;
    if (cmp) slab_bytes = align_up(slab_bytes + bk->count * 2, BUCKET_ALIGN);
  }
  lay->slab_bytes = slab_bytes;
  free(count);
  free(dtype);
  return BRG_SUCCESS;

err:
  free(count);
  free(dtype);
  layout_free(red, lay);
  return st;
}

/* Allocates a built layout's slab, zeroed, and points its buckets into it.
 * At create the device slab is cleared synchronously; in a run (the
 * rebuild) on the communication stream, so that nothing waits for the
 * legacy stream, and what follows on that stream sees it cleared. */
static brg_status layout_place(brg_reducer *red, red_layout *lay, int in_run) {
  const brg__cuda_api *api = red->dev.api;
  if (lay->slab_bytes > 0 && api) {
    if (api->drv.mem_alloc(&lay->slab, lay->slab_bytes) != 0) {
      lay->slab = NULL;
      return BRG_ERR_NO_MEMORY;
    }
    for (size_t off = 0; in_run && off < lay->slab_bytes; off += ZERO_BYTES) {
      size_t n = lay->slab_bytes - off < ZERO_BYTES ? lay->slab_bytes - off : ZERO_BYTES;
      if (api->kern.copy((char *)lay->slab + off, NULL, red->dev.zeros, n, red->dev.stream) != 0)
        return BRG_ERR_SYSTEM;
    }
    if (!in_run && api->drv.mem_set(lay->slab, 0, lay->slab_bytes) != 0) return BRG_ERR_SYSTEM;
  } else if (lay->slab_bytes > 0) {
    if (posix_memalign(&lay->slab, SLAB_ALIGN, lay->slab_bytes) != 0) {
      lay->slab = NULL;
      return BRG_ERR_NO_MEMORY;
    }
    memset(lay->slab, 0, lay->slab_bytes); /* touch every page now, not in the first backward */
  }
  for (size_t b = 0; b < lay->nbuckets; b++) {
    red_bucket *bk = &lay->buckets[b];
    if (bk->flat_at != (size_t)-1 && bk->count > 0) bk->flat = (char *)lay->slab + bk->flat_at;
    if (bk->half_at != (size_t)-1 && bk->count > 0)
      bk->half = (uint16_t *)((char *)lay->slab + bk->half_at);
  }
  return BRG_SUCCESS;
}

static inline char *grad_in_bucket(const red_layout *lay, const red_param *prm, size_t p) {
  const red_bucket *bk = &lay->buckets[lay->bucket_of[p]];
  return (char *)bk->flat + lay->offset[p] * brg_dtype_size(prm->dtype);
}

/* ---- moving one gradient in and out of its bucket -------------------- */

/* ---- the device form's GPU work, on the communication stream ---------- */

static void dev_check(brg_reducer *red, int e, const char *what) {
  if (e)
    fail_pass(red, BRG_ERR_SYSTEM, "device reducer: %s failed: %s", what,
              red->dev.api->drv.error_string(e));
}

/* Clears [p, p + bytes) in stream order. */
static void dev_zero(brg_reducer *red, void *p, size_t bytes) {
  for (size_t off = 0; off < bytes; off += ZERO_BYTES) {
    size_t n = bytes - off < ZERO_BYTES ? bytes - off : ZERO_BYTES;
    dev_check(red,
              red->dev.api->kern.copy((char *)p + off, NULL, red->dev.zeros, n, red->dev.stream),
              "clearing a gradient");
  }
}

/* Makes the parameters' GPU current on this thread; *prev to restore. */
static void dev_enter(const brg_reducer *red, int *prev) {
  *prev = -1;
  if (!red->dev.api || red->dev.api->drv.get_device(prev) != 0 || *prev == red->dev.gpu) return;
  red->dev.api->drv.set_device(red->dev.gpu);
}
static void dev_leave(const brg_reducer *red, int prev) {
  if (red->dev.api && prev >= 0 && prev != red->dev.gpu) red->dev.api->drv.set_device(prev);
}

static void param_pack_device(brg_reducer *red, size_t p, int zero) {
  const brg__cuda_api *api = red->dev.api;
  red_layout *lay = &red->lay;
  red_param *prm = &red->params[p];
  red_bucket *bk = &lay->buckets[lay->bucket_of[p]];
  size_t bytes = prm->count * brg_dtype_size(prm->dtype);
  if (bk->half != NULL) {
    uint16_t *dst = bk->half + lay->offset[p];
    if (zero) {
      dev_zero(red, dst, prm->count * 2);
      if (red->view) dev_zero(red, grad_in_bucket(lay, prm, p), bytes);
    } else {
      const void *src = red->view ? grad_in_bucket(lay, prm, p) : prm->grad;
      float scale = red->average ? 1.0f / (float)red->nranks : 1.0f;
      dev_check(red,
                api->kern.cast(dst, red->half, src, prm->dtype, prm->count, scale, red->dev.stream),
                "the compression hook's cast");
    }
  } else if (zero) {
    dev_zero(red, grad_in_bucket(lay, prm, p), bytes);
  } else if (!red->view) {
    dev_check(red,
              api->kern.copy(grad_in_bucket(lay, prm, p), NULL, prm->grad, bytes, red->dev.stream),
              "copying a gradient into its bucket");
  }
}

static void param_unpack_device(brg_reducer *red, size_t p) {
  const brg__cuda_api *api = red->dev.api;
  red_layout *lay = &red->lay;
  red_param *prm = &red->params[p];
  red_bucket *bk = &lay->buckets[lay->bucket_of[p]];
  if (bk->half != NULL) {
    void *dst = red->view ? grad_in_bucket(lay, prm, p) : prm->grad;
    dev_check(red,
              api->kern.cast(dst, prm->dtype, bk->half + lay->offset[p], red->half, prm->count,
                             1.0f, red->dev.stream),
              "the compression hook's cast back");
  } else if (!red->view) {
    dev_check(red,
              api->kern.copy(prm->grad, NULL, grad_in_bucket(lay, prm, p),
                             prm->count * brg_dtype_size(prm->dtype), red->dev.stream),
              "copying a gradient out of its bucket");
  }
}

/* Puts parameter p's contribution into its bucket: its gradient, or zero. */
static void param_pack(brg_reducer *red, size_t p, int zero) {
  red_layout *lay = &red->lay;
  red_param *prm = &red->params[p];
  red_bucket *bk = &lay->buckets[lay->bucket_of[p]];
  size_t bytes = prm->count * brg_dtype_size(prm->dtype);
  if (prm->count == 0) return;
  if (red->dev.api) {
    param_pack_device(red, p, zero);
    return;
  }

  if (bk->half != NULL) {
    uint16_t *dst = bk->half + lay->offset[p];
    if (zero) {
      memset(dst, 0, prm->count * 2);
      if (red->view) memset(grad_in_bucket(lay, prm, p), 0, bytes);
    } else {
      const void *src = red->view ? grad_in_bucket(lay, prm, p) : prm->grad;
      float scale = red->average ? 1.0f / (float)red->nranks : 1.0f;
      brg__convert_to_half(dst, red->half, src, prm->dtype, prm->count, scale);
    }
  } else if (zero) {
    memset(grad_in_bucket(lay, prm, p), 0, bytes);
  } else if (!red->view) {
    memcpy(grad_in_bucket(lay, prm, p), prm->grad, bytes);
  }
}

/* Writes the reduced value back to parameter p's gradient. */
static void param_unpack(brg_reducer *red, size_t p) {
  red_layout *lay = &red->lay;
  red_param *prm = &red->params[p];
  red_bucket *bk = &lay->buckets[lay->bucket_of[p]];
  if (prm->count == 0) return;
  if (red->dev.api) {
    param_unpack_device(red, p);
    return;
  }

  if (bk->half != NULL) {
    void *dst = red->view ? grad_in_bucket(lay, prm, p) : prm->grad;
    brg__convert_from_half(dst, prm->dtype, bk->half + lay->offset[p], red->half, prm->count);
  } else if (!red->view) {
    memcpy(prm->grad, grad_in_bucket(lay, prm, p), prm->count * brg_dtype_size(prm->dtype));
  }
}

/* ---- launching and waiting ------------------------------------------- */

static void hook_bucket(brg_reducer *red, size_t b, brg_reducer_bucket *v) {
  red_bucket *bk = &red->lay.buckets[b];
  v->index = b;
  v->data = bk->flat;
  v->count = bk->count;
  v->dtype = bk->dtype;
  v->nranks = red->nranks;
  v->average = red->average;
  v->request = red->dev.api ? NULL : &bk->req;
  v->stream = red->dev.api ? red->dev.stream : NULL;
}

/* Issues bucket b's collective. Lock held. */
static void bucket_launch(brg_reducer *red, size_t b) {
  red_bucket *bk = &red->lay.buckets[b];
  brg_status st;
  if (bk->count == 0) return; /* every rank skips it alike */

  if (red->cfg.hook == BRG_REDUCER_HOOK_CUSTOM) {
    brg_reducer_bucket v;
    hook_bucket(red, b, &v);
    st = red->cfg.hook_launch(red->cfg.hook_arg, red->comm, &v);
  } else if (red->dev.api) {
    /* On the communication stream, after the packing there. */
    if (bk->half != NULL)
      st = brg_allreduce(bk->half, bk->half, bk->count, red->half, BRG_SUM, red->comm,
                         red->dev.stream);
    else
      st = brg_allreduce(bk->flat, bk->flat, bk->count, bk->dtype, red->average ? BRG_AVG : BRG_SUM,
                         red->comm, red->dev.stream);
  } else if (bk->half != NULL) {
    /* Prescaled by 1/N when packed, so the half-precision sum cannot overflow
     * where the average would not. */
    st = brg_iallreduce(bk->half, bk->half, bk->count, red->half, BRG_SUM, red->comm, &bk->req);
  } else {
    st = brg_iallreduce(bk->flat, bk->flat, bk->count, bk->dtype, red->average ? BRG_AVG : BRG_SUM,
                        red->comm, &bk->req);
  }
  if (st != BRG_SUCCESS)
    fail_pass(red, st, "bucket %zu (%zu elements of %s): launching its allreduce failed: %s: %s", b,
              bk->count, brg_dtype_name(bk->dtype), brg_status_string(st),
              brg_comm_last_error(red->comm));
  else
    bk->inflight = 1;
}

/* Launches every complete bucket from next_launch on, in order. Lock held. */
static void launch_ready(brg_reducer *red) {
  while (red->next_launch < red->lay.nbuckets && red->lay.buckets[red->next_launch].pending == 0)
    bucket_launch(red, red->next_launch++);
}

/* Parameter p is settled for this pass (ready or zero-filled). Lock held. */
static void param_settled(brg_reducer *red, size_t p) {
  red_bucket *bk = &red->lay.buckets[red->lay.bucket_of[p]];
  if (--bk->pending == 0) launch_ready(red);
}

/* Waits for bucket b; 1 when its data is good to unpack. */
static int bucket_wait(brg_reducer *red, size_t b) {
  red_bucket *bk = &red->lay.buckets[b];
  if (!bk->inflight) return bk->count == 0;
  bk->inflight = 0;
  /* Device form: what follows goes on the stream, after the collective. */
  brg_status st = red->dev.api ? BRG_SUCCESS : brg_wait(&bk->req);
  if (st != BRG_SUCCESS) {
    fail_pass(red, st, "bucket %zu (%zu elements of %s): allreduce failed: %s: %s", b, bk->count,
              brg_dtype_name(bk->dtype), brg_status_string(st), brg_comm_last_error(red->comm));
    return 0;
  }
  if (red->cfg.hook == BRG_REDUCER_HOOK_CUSTOM && red->cfg.hook_finish != NULL) {
    brg_reducer_bucket v;
    hook_bucket(red, b, &v);
    st = red->cfg.hook_finish(red->cfg.hook_arg, red->comm, &v);
    if (st != BRG_SUCCESS) {
      fail_pass(red, st, "bucket %zu: the communication hook's finish failed: %s", b,
                brg_status_string(st));
      return 0;
    }
  }
  return 1;
}

/* Waits for whatever is still in flight (teardown, or after an error). */
static void wait_all(brg_reducer *red) {
  for (size_t b = 0; b < red->lay.nbuckets; b++) {
    red_bucket *bk = &red->lay.buckets[b];
    if (bk->inflight) {
      bk->inflight = 0;
      if (!red->dev.api) brg_wait(&bk->req);
    }
  }
  if (red->dev.api && red->dev.stream) red->dev.api->drv.stream_sync(red->dev.stream);
  if (red->used_inflight) {
    red->used_inflight = 0;
    brg_wait(&red->used_req);
  }
}

/* ---- create / destroy ------------------------------------------------ */

/* Every rank must register the same parameters with the same settings, or
 * the bucket sequences differ and the job hangs or mixes gradients. Two small
 * allreduces (max of x and of -x) find the first difference. */
static brg_status check_ranks_agree(brg_reducer *red) {
  enum { NFIELD = 5 };
  static const char *field[NFIELD] = {"parameter count", "flags", "first_bucket_cap_bytes",
                                      "bucket_cap_bytes", "hook"};
  int64_t v[2 * NFIELD] = {(int64_t)red->nparams, (int64_t)red->cfg.flags,
                           (int64_t)red->cfg.first_bucket_cap_bytes,
                           (int64_t)red->cfg.bucket_cap_bytes, (int64_t)red->cfg.hook};
  for (int i = 0; i < NFIELD; i++) v[NFIELD + i] = -v[i];
  brg_status st = brg_allreduce(v, v, 2 * NFIELD, BRG_INT64, BRG_MAX, red->comm, NULL);
  if (st != BRG_SUCCESS)
    return fail(red, st, "brg_reducer_create: checking the parameter list across ranks: %s",
                brg_comm_last_error(red->comm));
  int64_t mine[NFIELD] = {(int64_t)red->nparams, (int64_t)red->cfg.flags,
                          (int64_t)red->cfg.first_bucket_cap_bytes,
                          (int64_t)red->cfg.bucket_cap_bytes, (int64_t)red->cfg.hook};
  for (int i = 0; i < NFIELD; i++)
    if (v[i] != -v[NFIELD + i])
      return fail(red, BRG_ERR_MISMATCH,
                  "brg_reducer_create: the %s differs across ranks: %lld on rank %d, "
                  "between %lld and %lld over all ranks",
                  field[i], (long long)mine[i], red->rank, (long long)-v[NFIELD + i],
                  (long long)v[i]);

  size_t n = red->nparams;
  int64_t *key = malloc(2 * n * sizeof(*key));
  if (key == NULL) return fail(red, BRG_ERR_NO_MEMORY, "brg_reducer_create: out of memory");
  for (size_t p = 0; p < n; p++) {
    const red_param *prm = &red->params[p];
    key[p] = (int64_t)prm->count * 32 + (int64_t)prm->dtype * 2 + (prm->data != NULL);
    key[n + p] = -key[p];
  }
  st = brg_allreduce(key, key, 2 * n, BRG_INT64, BRG_MAX, red->comm, NULL);
  if (st != BRG_SUCCESS) {
    free(key);
    return fail(red, st, "brg_reducer_create: checking the parameter list across ranks: %s",
                brg_comm_last_error(red->comm));
  }
  for (size_t p = 0; p < n; p++) {
    if (key[p] == -key[n + p]) continue;
    const red_param *prm = &red->params[p];
    int64_t mine = (int64_t)prm->count * 32 + (int64_t)prm->dtype * 2 + (prm->data != NULL);
    int64_t other = key[p] != mine ? key[p] : -key[n + p]; /* the max or the min, not ours */
    char nb[256];
    fail(red, BRG_ERR_MISMATCH,
         "brg_reducer_create: parameter %s differs across ranks: rank %d has %zu elements of %s "
         "(data %s), another rank %lld elements of %s (data %s)",
         pname(red, p, nb, sizeof(nb)), red->rank, prm->count, brg_dtype_name(prm->dtype),
         prm->data ? "given" : "NULL", (long long)(other / 32),
         brg_dtype_name((brg_dtype)((other / 2) % 16)), (other & 1) ? "given" : "NULL");
    free(key);
    return BRG_ERR_MISMATCH;
  }
  free(key);
  return BRG_SUCCESS;
}

/* The device form's stream, events and zeros, on the parameters' GPU. */
static brg_status dev_open(brg_reducer *red) {
  const brg__cuda_api *api = red->dev.api;
  int e = 0;
  const char *what = "cudaStreamCreate";
  if (red->cfg.stream) {
    red->dev.stream = red->cfg.stream;
  } else {
    e = api->drv.stream_create(&red->dev.stream);
    red->dev.own_stream = e == 0;
  }
  if (!e) {
    what = "cudaEventCreate";
    e = api->drv.event_create(&red->dev.mark_ev);
  }
  if (!e) e = api->drv.event_create(&red->dev.done_ev);
  if (!e) {
    what = "cudaMalloc of 1 MiB of zeros";
    e = api->drv.mem_alloc(&red->dev.zeros, ZERO_BYTES);
  }
  if (!e) e = api->drv.mem_set(red->dev.zeros, 0, ZERO_BYTES);
  if (e)
    return fail(NULL, BRG_ERR_SYSTEM, "brg_reducer_create: device form: %s failed on GPU %d: %s",
                what, red->dev.gpu, api->drv.error_string(e));
  /* The communicator's device path now (every rank creates its reducer
   * with the same flags), not at the first bucket's allreduce: its setup
   * loads the kernels, and under lazy loading (CUDA_MODULE_LOADING's
   * default) a load waits for all the device's work, where a producer's
   * stream may wait for this very thread to mark a gradient ready. */
  brg_status st = brg_comm_device_setup(red->comm, red->dev.gpu);
  if (st != BRG_SUCCESS)
    return fail(NULL, st,
                "brg_reducer_create: device form: the communicator's device setup on GPU %d: %s",
                red->dev.gpu, brg_comm_last_error(red->comm));
  return BRG_SUCCESS;
}

static void dev_close(brg_reducer *red) {
  const brg__cuda_api *api = red->dev.api;
  if (red->dev.own_stream) api->drv.stream_destroy(red->dev.stream);
  if (red->dev.mark_ev) api->drv.event_destroy(red->dev.mark_ev);
  if (red->dev.done_ev) api->drv.event_destroy(red->dev.done_ev);
  if (red->dev.zeros) api->drv.mem_free(red->dev.zeros);
}

/* Every buffer of the device form must be memory of one GPU. */
static brg_status dev_check_params(red_dev *dev, const brg_reducer_param *params, size_t n) {
  const char *why = "";
  dev->api = brg__device_api(&why);
  if (!dev->api)
    return fail(NULL, BRG_ERR_UNAVAILABLE, "brg_reducer_create: BRG_REDUCER_DEVICE: %s", why);
  dev->gpu = -1;
  for (size_t p = 0; p < n; p++) {
    const brg_reducer_param *q = &params[p];
    const void *buf[2] = {q->grad, q->data};
    static const char *what[2] = {"grad", "data"};
    for (int k = 0; k < 2; k++) {
      int gpu = -1;
      if (!buf[k] || q->count == 0) continue;
      if (!dev->api->drv.pointer_is_device(buf[k], &gpu))
        return fail(NULL, BRG_ERR_INVALID_ARGUMENT,
                    "brg_reducer_create: parameter #%zu %s: %s %p is host memory, but "
                    "BRG_REDUCER_DEVICE needs GPU memory",
                    p, q->name ? q->name : "", what[k], buf[k]);
      if (dev->gpu >= 0 && gpu != dev->gpu)
        return fail(NULL, BRG_ERR_INVALID_ARGUMENT,
                    "brg_reducer_create: parameter #%zu %s: %s is on GPU %d, earlier "
                    "parameters on GPU %d (one reducer, one GPU)",
                    p, q->name ? q->name : "", what[k], gpu, dev->gpu);
      dev->gpu = gpu;
    }
  }
  if (dev->gpu < 0 && dev->api->drv.get_device(&dev->gpu) != 0) dev->gpu = 0;
  return BRG_SUCCESS;
}

brg_status brg_reducer_destroy(brg_reducer *red) {
  if (red == NULL) return BRG_SUCCESS;
  int prev;
  dev_enter(red, &prev);
  wait_all(red);
  layout_free(red, &red->lay);
  /* The stream is done with them (wait_all): nothing in flight uses them. */
  for (size_t i = 0; i < red->dev.nretired; i++) red->dev.api->drv.mem_free(red->dev.retired[i]);
  free(red->dev.retired);
  if (red->dev.api) dev_close(red);
  dev_leave(red, prev);
  for (size_t p = 0; p < red->nparams; p++) free(red->params[p].name);
  free(red->params);
  free(red->marked);
  free(red->order);
  free(red->used_local);
  free(red->used_global);
  free(red->order_buf);
  free(red->static_local);
  free(red->static_global);
  free(red->static_order);
  pthread_cond_destroy(&red->marks_done);
  pthread_mutex_destroy(&red->lock);
  free(red);
  return BRG_SUCCESS;
}

brg_status brg_reducer_create(brg_reducer **out, brg_comm *comm, const brg_reducer_param *params,
                              size_t nparams, const brg_reducer_config *cfg) {
  brg_reducer_config c = {0};
  brg_status st;

  if (out == NULL || comm == NULL || params == NULL || nparams == 0)
    return fail(NULL, BRG_ERR_INVALID_ARGUMENT,
                "brg_reducer_create: reducer, comm and a non-empty parameter list are required");
  if (cfg != NULL) c = *cfg;
  if (c.bucket_cap_bytes == 0) c.bucket_cap_bytes = BRG_REDUCER_DEFAULT_BUCKET_CAP;
  if (c.first_bucket_cap_bytes == 0)
    c.first_bucket_cap_bytes = BRG_REDUCER_DEFAULT_FIRST_BUCKET_CAP;
  int device = (c.flags & BRG_REDUCER_DEVICE) != 0;
  if (c.stream != NULL && !device)
    return fail(NULL, BRG_ERR_INVALID_ARGUMENT,
                "brg_reducer_create: a stream was given for host buffers (set BRG_REDUCER_DEVICE "
                "for GPU buffers)");
  if ((unsigned)c.hook > BRG_REDUCER_HOOK_CUSTOM)
    return fail(NULL, BRG_ERR_INVALID_ARGUMENT, "brg_reducer_create: unknown hook %d", (int)c.hook);
  if (c.hook == BRG_REDUCER_HOOK_CUSTOM && c.hook_launch == NULL)
    return fail(NULL, BRG_ERR_INVALID_ARGUMENT,
                "brg_reducer_create: BRG_REDUCER_HOOK_CUSTOM needs hook_launch");
  if (c.flags & ~(unsigned)0x3f)
    return fail(NULL, BRG_ERR_INVALID_ARGUMENT, "brg_reducer_create: unknown flags 0x%x", c.flags);
  int view = (c.flags & BRG_REDUCER_GRAD_AS_VIEW) != 0;
  for (size_t p = 0; p < nparams; p++) {
    const brg_reducer_param *q = &params[p];
    const char *nm = q->name ? q->name : "";
    if (brg_dtype_size(q->dtype) == 0)
      return fail(NULL, BRG_ERR_INVALID_ARGUMENT,
                  "brg_reducer_create: parameter #%zu %s: bad dtype %d", p, nm, (int)q->dtype);
    if (view && q->grad != NULL)
      return fail(NULL, BRG_ERR_INVALID_ARGUMENT,
                  "brg_reducer_create: parameter #%zu %s: grad must be NULL with "
                  "BRG_REDUCER_GRAD_AS_VIEW (the reducer provides it, see brg_reducer_grad)",
                  p, nm);
    if (!view && q->grad == NULL && q->count > 0)
      return fail(NULL, BRG_ERR_INVALID_ARGUMENT,
                  "brg_reducer_create: parameter #%zu %s has no grad buffer", p, nm);
  }

  red_dev dev = {0};
  if (device && (st = dev_check_params(&dev, params, nparams)) != BRG_SUCCESS) return st;

  brg_reducer *red = calloc(1, sizeof(*red));
  if (red == NULL) return fail(NULL, BRG_ERR_NO_MEMORY, "brg_reducer_create: out of memory");
  red->dev = dev;
  int prev_gpu;
  dev_enter(red, &prev_gpu);
  pthread_mutex_init(&red->lock, NULL);
  pthread_cond_init(&red->marks_done, NULL);
  red->comm = comm;
  red->cfg = c;
  red->view = view;
  red->average = !(c.flags & BRG_REDUCER_SUM);
  red->find_unused = (c.flags & BRG_REDUCER_FIND_UNUSED) != 0;
  red->static_graph = (c.flags & BRG_REDUCER_STATIC_GRAPH) != 0;
  /* As DDP: with find_unused the graph may change every step, so an order
   * seen once is no better than registration order. */
  red->rebuild = !(c.flags & BRG_REDUCER_NO_REBUILD) && (!red->find_unused || red->static_graph);
  red->compress = c.hook == BRG_REDUCER_HOOK_FP16 || c.hook == BRG_REDUCER_HOOK_BF16;
  red->half = c.hook == BRG_REDUCER_HOOK_BF16 ? BRG_BFLOAT16 : BRG_FLOAT16;
  red->nparams = nparams;

  if ((st = brg_comm_rank(comm, &red->rank)) != BRG_SUCCESS ||
      (st = brg_comm_size(comm, &red->nranks)) != BRG_SUCCESS) {
    fail(NULL, st, "brg_reducer_create: bad communicator: %s", brg_comm_last_error(comm));
    goto err;
  }

  red->params = calloc(nparams, sizeof(*red->params));
  red->marked = calloc(nparams, 1);
  red->order = calloc(nparams, sizeof(size_t));
  red->used_local = calloc(nparams, 1);
  red->used_global = calloc(nparams, 1);
  red->order_buf = calloc(nparams, sizeof(int64_t));
  red->static_local = calloc(nparams, 1);
  red->static_global = calloc(nparams, 1);
  red->static_order = calloc(nparams, sizeof(size_t));
  if (!red->params || !red->marked || !red->order || !red->used_local || !red->used_global ||
      !red->order_buf || !red->static_local || !red->static_global || !red->static_order) {
    st = fail(NULL, BRG_ERR_NO_MEMORY, "brg_reducer_create: out of memory");
    goto err;
  }
  for (size_t p = 0; p < nparams; p++) {
    red->params[p].count = params[p].count;
    red->params[p].dtype = params[p].dtype;
    red->params[p].data = params[p].data;
    red->params[p].grad = params[p].grad;
    if (params[p].name != NULL && (red->params[p].name = strdup(params[p].name)) == NULL) {
      st = fail(NULL, BRG_ERR_NO_MEMORY, "brg_reducer_create: out of memory");
      goto err;
    }
  }

  if ((st = check_ranks_agree(red)) != BRG_SUCCESS) {
    memcpy(create_err, red->err, ERRLEN);
    goto err;
  }
  if (device && (st = dev_open(red)) != BRG_SUCCESS) goto err;

  /* Reverse registration order approximates the order backward produces. */
  for (size_t k = 0; k < nparams; k++) red->order[k] = nparams - 1 - k;
  if ((st = layout_build(red, red->order, &red->lay)) != BRG_SUCCESS ||
      (st = layout_place(red, &red->lay, 0)) != BRG_SUCCESS) {
    fail(NULL, st, "brg_reducer_create: building %zu parameters into buckets: %s", nparams,
         brg_status_string(st));
    goto err;
  }
  red->err[0] = '\0';
  dev_leave(red, prev_gpu);
  *out = red;
  return BRG_SUCCESS;

err:
  dev_leave(red, prev_gpu);
  brg_reducer_destroy(red);
  return st;
}

/* ---- queries --------------------------------------------------------- */

brg_status brg_reducer_grad(const brg_reducer *red, size_t p, void **grad) {
  if (red == NULL) return BRG_ERR_INVALID_ARGUMENT;
  /* The reducer's last error is its own, not part of what const keeps. */
  if (grad == NULL)
    return fail((brg_reducer *)red, BRG_ERR_INVALID_ARGUMENT, "brg_reducer_grad: grad is NULL");
  if (p >= red->nparams) {
    char idx[64];
    if (p > SIZE_MAX / 2)
      snprintf(idx, sizeof idx, "%zd", (ssize_t)p);
    else
      snprintf(idx, sizeof idx, "%zu", p);
    return fail((brg_reducer *)red, BRG_ERR_INVALID_ARGUMENT,
                "brg_reducer_grad: parameter %s out of range (%zu registered)", idx, red->nparams);
  }
  const red_param *prm = &red->params[p];
  if (!red->view)
    *grad = prm->grad;
  else
    *grad = prm->count > 0 ? grad_in_bucket(&red->lay, prm, p) : NULL;
  return BRG_SUCCESS;
}

brg_status brg_reducer_num_buckets(const brg_reducer *red, size_t *nbuckets) {
  if (red == NULL || nbuckets == NULL) return BRG_ERR_INVALID_ARGUMENT;
  *nbuckets = red->lay.nbuckets;
  return BRG_SUCCESS;
}

brg_status brg_reducer_bucket_layout(const brg_reducer *red, size_t b, brg_dtype *dtype,
                                     size_t *count, size_t *nparams, const size_t **params) {
  if (red == NULL || b >= red->lay.nbuckets) return BRG_ERR_INVALID_ARGUMENT;
  const red_bucket *bk = &red->lay.buckets[b];
  if (dtype) *dtype = bk->dtype;
  if (count) *count = bk->count;
  if (nparams) *nparams = bk->n;
  if (params) *params = red->lay.members + bk->first;
  return BRG_SUCCESS;
}

/* ---- one backward pass ----------------------------------------------- */

brg_status brg_reducer_broadcast_params(brg_reducer *red, int root) {
  if (red == NULL) return BRG_ERR_INVALID_ARGUMENT;
  if (root < 0 || root >= red->nranks)
    return fail(red, BRG_ERR_INVALID_ARGUMENT, "brg_reducer_broadcast_params: root %d of %d ranks",
                root, red->nranks);
  pthread_mutex_lock(&red->lock);
  int state = red->state;
  pthread_mutex_unlock(&red->lock);
  if (state != STATE_IDLE)
    return fail(red, BRG_ERR_INVALID_USAGE,
                "brg_reducer_broadcast_params: called during a backward pass");
  int prev;
  dev_enter(red, &prev);
  brg_status st = BRG_SUCCESS;
  for (size_t p = 0; p < red->nparams && st == BRG_SUCCESS; p++) {
    red_param *prm = &red->params[p];
    if (prm->data == NULL || prm->count == 0) continue;
    /* Device form: on the communication stream, which is then waited for. */
    st = brg_broadcast(prm->data, prm->data, prm->count, prm->dtype, root, red->comm,
                       red->dev.api ? red->dev.stream : NULL);
    if (st != BRG_SUCCESS) {
      char nb[256];
      fail(red, st, "brg_reducer_broadcast_params: parameter %s: %s", pname(red, p, nb, sizeof(nb)),
           brg_comm_last_error(red->comm));
    }
  }
  if (red->dev.api) {
    int e = red->dev.api->drv.stream_sync(red->dev.stream);
    if (e && st == BRG_SUCCESS)
      st = fail(red, BRG_ERR_SYSTEM, "brg_reducer_broadcast_params: the stream failed: %s",
                red->dev.api->drv.error_string(e));
  }
  dev_leave(red, prev);
  return st;
}

brg_status brg_reducer_prepare(brg_reducer *red, unsigned flags) {
  if (red == NULL) return BRG_ERR_INVALID_ARGUMENT;
  if (flags & ~BRG_REDUCER_NO_SYNC)
    return fail(red, BRG_ERR_INVALID_ARGUMENT, "brg_reducer_prepare: unknown flags 0x%x", flags);
  pthread_mutex_lock(&red->lock);
  if (red->state != STATE_IDLE) {
    pthread_mutex_unlock(&red->lock);
    return fail(red, BRG_ERR_INVALID_USAGE,
                "brg_reducer_prepare: a new backward started before brg_reducer_finalize ended "
                "the previous one");
  }
  int prev;
  dev_enter(red, &prev);
  red->state = STATE_BACKWARD;
  red->sync = !(flags & BRG_REDUCER_NO_SYNC);
  red->pass_status = BRG_SUCCESS;
  red->pass_err[0] = '\0';
  red->norder = 0;
  red->next_launch = 0;
  memset(red->marked, 0, red->nparams);
  if (red->sync) {
    for (size_t b = 0; b < red->lay.nbuckets; b++)
      red->lay.buckets[b].pending = red->lay.buckets[b].n;
    /* Static graph: what was unused in the first step is settled now, as
     * zero, so its buckets need not wait for finalize. */
    if (red->have_static)
      for (size_t p = 0; p < red->nparams; p++)
        if (!red->static_local[p]) {
          param_pack(red, p, 1);
          red->lay.buckets[red->lay.bucket_of[p]].pending--;
        }
    launch_ready(red);
  }
  dev_leave(red, prev);
  pthread_mutex_unlock(&red->lock);
  return BRG_SUCCESS;
}

brg_status brg_reducer_mark_ready(brg_reducer *red, size_t p) {
  return brg_reducer_mark_ready_on(red, p, NULL);
}

brg_status brg_reducer_mark_ready_on(brg_reducer *red, size_t p, brg_stream producer) {
  char nb[256];
  brg_status st;
  if (red == NULL) return BRG_ERR_INVALID_ARGUMENT;
  if (producer != NULL && !red->dev.api)
    return fail(red, BRG_ERR_INVALID_ARGUMENT,
                "brg_reducer_mark_ready_on: a stream was given, but this reducer is for host "
                "buffers");
  pthread_mutex_lock(&red->lock);
  if (p >= red->nparams) {
    /* A negative index from a caller that passed a signed one: shown as such. */
    char idx[64];
    if (p > SIZE_MAX / 2)
      snprintf(idx, sizeof idx, "%zd", (ssize_t)p);
    else
      snprintf(idx, sizeof idx, "%zu", p);
    st = red->state == STATE_BACKWARD
             ? fail_pass(red, BRG_ERR_INVALID_ARGUMENT,
                         "brg_reducer_mark_ready: parameter %s out of range (%zu registered)", idx,
                         red->nparams)
             : fail(red, BRG_ERR_INVALID_ARGUMENT,
                    "brg_reducer_mark_ready: parameter %s out of range (%zu registered)", idx,
                    red->nparams);
    goto out;
  }
  if (red->state == STATE_IDLE) {
    st = fail(red, BRG_ERR_INVALID_USAGE,
              "brg_reducer_mark_ready(%s) called before brg_reducer_prepare",
              pname(red, p, nb, sizeof(nb)));
    goto out;
  }
  if (red->state == STATE_FINALIZING) {
    st = fail(red, BRG_ERR_INVALID_USAGE,
              "brg_reducer_mark_ready(%s) called after brg_reducer_finalize started",
              pname(red, p, nb, sizeof(nb)));
    goto out;
  }
  if (red->marked[p]) {
    st = fail_pass(red, BRG_ERR_INVALID_USAGE,
                   "parameter %s was marked ready twice in one backward pass",
                   pname(red, p, nb, sizeof(nb)));
    goto out;
  }
  if (red->have_static && !red->static_local[p]) {
    st = fail_pass(red, BRG_ERR_INVALID_USAGE,
                   "static graph: parameter %s was unused in the first step but is marked ready "
                   "now (the used set may not change; drop BRG_REDUCER_STATIC_GRAPH)",
                   pname(red, p, nb, sizeof(nb)));
    goto out;
  }
  red->marked[p] = 1;
  red->used_local[p] = 1;
  red->order[red->norder++] = p;
  st = BRG_SUCCESS;
  if (!red->sync) goto out;
  if (red->dev.api) {
    /* All on the communication stream, in mark order, under the lock: it
     * waits for the producer's work so far, then packs and maybe launches. */
    int prev, e;
    dev_enter(red, &prev);
    e = red->dev.api->drv.event_record(red->dev.mark_ev, producer);
    if (!e) e = red->dev.api->drv.stream_wait_event(red->dev.stream, red->dev.mark_ev);
    if (e)
      st = fail_pass(red, BRG_ERR_SYSTEM,
                     "brg_reducer_mark_ready(%s): ordering after the producer stream %p failed: "
                     "%s",
                     pname(red, p, nb, sizeof(nb)), producer, red->dev.api->drv.error_string(e));
    param_pack(red, p, 0);
    param_settled(red, p);
    dev_leave(red, prev);
    goto out;
  }
  red->marks_inflight++;
  pthread_mutex_unlock(&red->lock);

  param_pack(red, p, 0); /* copies run in parallel when hooks fire from several threads */

  pthread_mutex_lock(&red->lock);
  param_settled(red, p);
  if (--red->marks_inflight == 0) pthread_cond_broadcast(&red->marks_done);
out:
  pthread_mutex_unlock(&red->lock);
  return st;
}

/* Backward left p unmarked where it should not have: not unused-by-design
 * under a static graph. */
static int param_missing(const brg_reducer *red, size_t p) {
  return !red->marked[p] && !(red->have_static && !red->static_local[p]);
}

/* Appends " 'a' (#1), 'b' (#2), ... and N more" for the missing parameters. */
static void list_missing(const brg_reducer *red, char *buf, size_t len) {
  size_t used = strlen(buf), shown = 0, total = 0;
  for (size_t p = 0; p < red->nparams; p++) {
    if (!param_missing(red, p)) continue;
    total++;
    char nb[256];
    pname(red, p, nb, sizeof(nb));
    if (used + strlen(nb) + 40 < len) {
      used += (size_t)snprintf(buf + used, len - used, "%s%s", shown ? ", " : " ", nb);
      shown++;
    }
  }
  if (shown < total) snprintf(buf + used, len - used, " ... and %zu more", total - shown);
}

/* The first synced pass: remember what static graph fixes, and rebuild the
 * buckets from the order gradients became ready (rank 0's order, so every
 * rank builds the same buckets). */
static void first_step_done(brg_reducer *red) {
  size_t n = red->nparams;
  if (red->static_graph) {
    memcpy(red->static_local, red->used_local, n);
    memcpy(red->static_global, red->used_global, n);
    memcpy(red->static_order, red->order, red->norder * sizeof(size_t));
    red->static_norder = red->norder;
    red->have_static = 1;
  }
  if (!red->rebuild) return;

  size_t k = 0;
  for (size_t i = 0; i < red->norder; i++) red->order_buf[k++] = (int64_t)red->order[i];
  for (size_t q = n; q-- > 0;)
    if (!red->marked[q]) red->order_buf[k++] = (int64_t)q;
  brg_status st = brg_broadcast(red->order_buf, red->order_buf, n, BRG_INT64, 0, red->comm, NULL);
  if (st != BRG_SUCCESS) {
    fail_pass(red, st, "rebuilding buckets: broadcasting rank 0's ready order failed: %s",
              brg_comm_last_error(red->comm));
    return;
  }
  size_t *fill = malloc(n * sizeof(*fill));
  if (fill == NULL) {
    fail_pass(red, BRG_ERR_NO_MEMORY, "rebuilding buckets: out of memory");
    return;
  }
  for (size_t i = 0; i < n; i++) {
    int64_t v = red->order_buf[i];
    fill[i] = v >= 0 && (uint64_t)v < n ? (size_t)v : (size_t)-1; /* assign rejects it */
  }
  red_layout nl;
  st = layout_build(red, fill, &nl);
  free(fill);
  if (st != BRG_SUCCESS) {
    fail_pass(red, st, "rebuilding buckets from rank 0's ready order: %s", brg_status_string(st));
    return;
  }
  int same =
      nl.nbuckets == red->lay.nbuckets &&
      memcmp(nl.members, red->lay.members, n * sizeof(size_t)) == 0 &&
      memcmp(nl.bucket_start, red->lay.bucket_start, (nl.nbuckets + 1) * sizeof(size_t)) == 0;
  if (same) {
    layout_free(red, &nl); /* no slab yet */
    return;
  }
  /* Allocated only now, when it is needed: an unused device slab could not
   * be freed before destroy either. */
  if ((st = layout_place(red, &nl, 1)) != BRG_SUCCESS) {
    fail_pass(red, st, "rebuilding buckets: %s %zu bytes of bucket memory: %s",
              st == BRG_ERR_NO_MEMORY ? "allocating" : "clearing", nl.slab_bytes,
              brg_status_string(st));
    layout_free(red, &nl);
    return;
  }
  if (red->dev.api) {
    /* All on the communication stream, after the last pass's work there;
     * the old slab is retired, not freed (red_dev.retired), so the host
     * does not wait for the stream here. */
    const brg__cuda_api *api = red->dev.api;
    if (red->view)
      for (size_t p = 0; p < n; p++)
        if (red->params[p].count > 0)
          dev_check(red,
                    api->kern.copy(grad_in_bucket(&nl, &red->params[p], p), NULL,
                                   grad_in_bucket(&red->lay, &red->params[p], p),
                                   red->params[p].count * brg_dtype_size(red->params[p].dtype),
                                   red->dev.stream),
                    "carrying gradients into the rebuilt buckets");
  } else if (red->view) { /* the gradients live in the buckets: carry them over */
    for (size_t p = 0; p < n; p++)
      if (red->params[p].count > 0)
        memcpy(grad_in_bucket(&nl, &red->params[p], p),
               grad_in_bucket(&red->lay, &red->params[p], p),
               red->params[p].count * brg_dtype_size(red->params[p].dtype));
  }
  layout_free(red, &red->lay);
  red->lay = nl;
}

/* The end of a pass. Device form: the caller's stream waits for the
 * communication stream (finalize_on), or the host does (blocking). */
static brg_status finalize(brg_reducer *red, brg_stream caller, int blocking);

brg_status brg_reducer_finalize(brg_reducer *red) {
  return finalize(red, NULL, 1);
}

brg_status brg_reducer_finalize_on(brg_reducer *red, brg_stream caller) {
  if (red != NULL && !red->dev.api)
    return fail(red, BRG_ERR_INVALID_ARGUMENT,
                "brg_reducer_finalize_on: this reducer is for host buffers (use "
                "brg_reducer_finalize)");
  return finalize(red, caller, 0);
}

static brg_status finalize(brg_reducer *red, brg_stream caller, int blocking) {
  char nb[256];
  if (red == NULL) return BRG_ERR_INVALID_ARGUMENT;
  pthread_mutex_lock(&red->lock);
  if (red->state != STATE_BACKWARD) {
    int state = red->state;
    pthread_mutex_unlock(&red->lock);
    return fail(red, BRG_ERR_INVALID_USAGE,
                state == STATE_IDLE ? "brg_reducer_finalize called without brg_reducer_prepare"
                                    : "brg_reducer_finalize called twice at once");
  }
  red->state = STATE_FINALIZING;
  while (red->marks_inflight > 0) pthread_cond_wait(&red->marks_done, &red->lock);
  pthread_mutex_unlock(&red->lock);
  /* From here on no other thread touches the pass: mark_ready refuses. */
  int prev_gpu;
  dev_enter(red, &prev_gpu);

  if (!red->sync) goto done;

  size_t n = red->nparams;
  int first = red->nsynced == 0;
  int agree_used = red->find_unused || (red->static_graph && first);

  /* Settle what backward did not mark, so every bucket launches. */
  int missing = 0;
  for (size_t p = 0; p < n; p++) {
    if (!param_missing(red, p)) continue;
    if (!agree_used) missing++;
    /* Zero unless it was used in a no-sync pass since the last sync. */
    param_pack(red, p, !(agree_used && red->used_local[p]));
    pthread_mutex_lock(&red->lock);
    param_settled(red, p);
    pthread_mutex_unlock(&red->lock);
  }
  if (missing > 0) {
    char msg[ERRLEN];
    if (red->have_static)
      snprintf(msg, sizeof(msg),
               "static graph: %d parameter(s) used in the first step were not marked ready in "
               "this backward:",
               missing);
    else
      snprintf(msg, sizeof(msg),
               "%d parameter(s) were not marked ready in this backward (if they are unused on "
               "purpose, create the reducer with BRG_REDUCER_FIND_UNUSED):",
               missing);
    list_missing(red, msg, sizeof(msg));
    fail_pass(red, BRG_ERR_INVALID_USAGE, "%s", msg);
  }
  if (agree_used) {
    brg_status st = brg_iallreduce(red->used_local, red->used_global, n, BRG_UINT8, BRG_MAX,
                                   red->comm, &red->used_req);
    if (st != BRG_SUCCESS)
      fail_pass(red, st, "agreeing on unused parameters: %s", brg_comm_last_error(red->comm));
    else
      red->used_inflight = 1;
  }

  /* Unpack each bucket as it arrives, overlapping the copies with the
   * buckets still on the wire. Gradients of a parameter unused here wait
   * for the agreement: if no rank used it, its gradient is left untouched. */
  for (size_t b = 0; b < red->lay.nbuckets; b++) {
    red_bucket *bk = &red->lay.buckets[b];
    if (!bucket_wait(red, b)) continue;
    for (size_t k = bk->first; k < bk->first + bk->n; k++) {
      size_t p = red->lay.members[k];
      if (agree_used && !red->used_local[p]) continue;
      if (red->have_static && !red->static_global[p] && !red->view) continue;
      param_unpack(red, p);
    }
  }
  if (red->used_inflight) {
    red->used_inflight = 0;
    brg_status st = brg_wait(&red->used_req);
    if (st != BRG_SUCCESS) {
      fail_pass(red, st, "agreeing on unused parameters: %s", brg_comm_last_error(red->comm));
    } else {
      for (size_t p = 0; p < n; p++)
        if (!red->used_local[p] && (red->used_global[p] || red->view)) param_unpack(red, p);
    }
  }

  /* Static graph: the ready order must match the first step's. */
  if (red->have_static && red->pass_status == BRG_SUCCESS) {
    size_t k = 0;
    while (k < red->norder && k < red->static_norder && red->order[k] == red->static_order[k]) k++;
    if (k < red->norder || k < red->static_norder) {
      char nb2[256];
      fail_pass(red, BRG_ERR_INVALID_USAGE,
                "static graph: the ready order changed at position %zu: %s now, %s in the first "
                "step (gradients were reduced correctly; drop BRG_REDUCER_STATIC_GRAPH if the "
                "order varies)",
                k, k < red->norder ? pname(red, red->order[k], nb, sizeof(nb)) : "nothing",
                k < red->static_norder ? pname(red, red->static_order[k], nb2, sizeof(nb2))
                                       : "nothing");
    }
  }

  if (first) first_step_done(red);
  red->nsynced++;
  memset(red->used_local, 0, n);

done:
  if (red->dev.api) {
    const brg__cuda_api *api = red->dev.api;
    int e = blocking ? api->drv.stream_sync(red->dev.stream)
                     : api->drv.event_record(red->dev.done_ev, red->dev.stream);
    if (!e && !blocking) e = api->drv.stream_wait_event(caller, red->dev.done_ev);
    if (e)
      fail_pass(red, BRG_ERR_SYSTEM, "brg_reducer_finalize: %s failed: %s",
                blocking ? "waiting for the communication stream"
                         : "ordering the caller's stream after the communication stream",
                api->drv.error_string(e));
  }
  dev_leave(red, prev_gpu);
  pthread_mutex_lock(&red->lock);
  red->state = STATE_IDLE;
  brg_status st = red->pass_status;
  if (st != BRG_SUCCESS) memcpy(red->err, red->pass_err, ERRLEN);
  pthread_mutex_unlock(&red->lock);
  return st;
}
