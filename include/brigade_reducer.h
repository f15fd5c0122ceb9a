/*
 * brigade reducer: bucketed gradient allreduce for data-parallel training.
 *
 * What a framework embeds to overlap the gradient allreduce with its backward
 * pass, as PyTorch's DistributedDataParallel does with its C++ Reducer. It is
 * built only on brigade.h.
 *
 * Life of a training step:
 *
 *   brg_reducer_create(&red, comm, params, n, &cfg);   once; params in forward order
 *   brg_reducer_broadcast_params(red, 0);               once; replicas start equal
 *   for each step:
 *     brg_reducer_prepare(red, 0);                      before backward
 *     ... backward; as each gradient is complete:
 *     brg_reducer_mark_ready(red, i);                   any thread, any order
 *     brg_reducer_finalize(red);                        gradients now averaged
 *
 * Parameters are grouped into buckets in reverse registration order (the
 * order backward usually produces them), one dtype per bucket; the first
 * bucket is small so communication starts early. When every gradient of a
 * bucket is ready the bucket is launched as one asynchronous allreduce.
 * Buckets launch strictly in bucket order, so every rank issues the same
 * sequence of collectives whatever order its hooks fire in.
 *
 * Every call returns a brg_status; brg_reducer_last_error() says why a call
 * failed (which parameter, by name and index). Errors met inside
 * brg_reducer_mark_ready (which gradient hooks often cannot propagate) are
 * also returned by the next brg_reducer_finalize. A failing finalize still
 * issues every collective of the step, so the other ranks never hang on it.
 *
 * Buffers are host memory, or GPU memory with BRG_REDUCER_DEVICE (below).
 *
 * The device form (BRG_REDUCER_DEVICE): every parameter's grad (and data,
 * where given) is memory of one GPU, and so are the buckets, allocated once.
 * The reducer does all its GPU work on one communication stream
 * (config.stream, or one of its own when that is NULL):
 *
 *   brg_reducer_prepare(red, 0);
 *   ... backward; as each gradient is complete on stream s:
 *   brg_reducer_mark_ready_on(red, i, s);    returns at once
 *   brg_reducer_finalize_on(red, s2);        returns at once; work enqueued on
 *                                            s2 afterwards sees the averages
 *
 * mark_ready_on records an event on s and makes the communication stream
 * wait for it, then copies (or, with a compression hook, casts) the gradient
 * into its bucket there; a full bucket is a device allreduce on the
 * communication stream, launched in bucket order as on the host. Nothing
 * waits on the host: the producer's later work on s may run before the copy,
 * so s must not overwrite the gradient before finalize_on's stream has
 * waited (as with any stream-ordered library). mark_ready (no stream) means
 * the legacy default stream. finalize_on makes `caller` wait for the
 * communication stream (DDP's current_stream().wait_stream(comm_stream));
 * brg_reducer_finalize is the blocking form: on return the gradients are
 * final for every stream and the host. Errors are as on the host; a device
 * collective that fails after its call returned (see brigade.h's
 * asynchronous device mode) shows at the next call. The unused-parameter
 * agreement (find_unused, static graph) is a host collective over bitmaps
 * the reducer keeps on the host. broadcast_params runs on the communication
 * stream and waits for it. A custom hook gets the communication stream in
 * bucket->stream and enqueues its collective(s) there (bucket->request is
 * NULL); hook_finish is called at finalize without waiting for the
 * collective, so it too must enqueue its work on bucket->stream. The
 * calls make the parameters' GPU current while they run and restore the
 * caller's current device.
 */
#ifndef BRIGADE_REDUCER_H
#define BRIGADE_REDUCER_H

#include <stddef.h>
#include "brigade.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct brg_reducer brg_reducer;

/* One parameter, as registered at create. Arrays are given in forward order. */
typedef struct brg_reducer_param {
  const char *name; /* optional (copied); used in error messages */
  size_t count;     /* elements */
  brg_dtype dtype;
  void *data; /* the parameter's values, for brg_reducer_broadcast_params; may be NULL */
  void *grad; /* its gradient; must be NULL with BRG_REDUCER_GRAD_AS_VIEW */
} brg_reducer_param;

/* Flags of brg_reducer_config. */
#define BRG_REDUCER_SUM 0x01u          /* leave the sum over ranks instead of the average */
#define BRG_REDUCER_FIND_UNUSED 0x02u  /* unmarked parameters count as zero gradient */
#define BRG_REDUCER_STATIC_GRAPH 0x04u /* used set and ready order fixed after step one */
#define BRG_REDUCER_GRAD_AS_VIEW 0x08u /* gradients live inside the bucket buffers */
#define BRG_REDUCER_NO_REBUILD 0x10u   /* keep the registration-order buckets */
#define BRG_REDUCER_DEVICE 0x20u       /* parameters, gradients and buckets in GPU memory */

/* Flag of brg_reducer_prepare: this backward only accumulates locally. */
#define BRG_REDUCER_NO_SYNC 0x01u

typedef enum {
  BRG_REDUCER_HOOK_ALLREDUCE = 0, /* allreduce in the gradient dtype (default) */
  BRG_REDUCER_HOOK_FP16,  /* cast float32/float64 buckets to float16, allreduce, cast back */
  BRG_REDUCER_HOOK_BF16,  /* same with bfloat16 */
  BRG_REDUCER_HOOK_CUSTOM /* hook_launch / hook_finish below */
} brg_reducer_hook;

/* A bucket as a communication hook sees it. */
typedef struct brg_reducer_bucket {
  size_t index; /* position in launch order */
  void *data;   /* the bucket's gradients, packed in bucket order */
  size_t count; /* elements in data */
  brg_dtype dtype;
  int nranks;
  int average;          /* 1 unless BRG_REDUCER_SUM: divide by nranks */
  brg_request *request; /* the hook's (last) collective goes on this request (host form) */
  brg_stream stream;    /* device form: the communication stream, for the hook's work */
} brg_reducer_bucket;

/*
 * A custom hook. hook_launch is called once per bucket when the bucket is
 * complete, in bucket order, with the reducer locked (it must not call the
 * reducer); it issues an asynchronous collective on bucket->request (when it
 * issues several, the last one goes there: brigade runs collectives in issue
 * order). hook_finish (optional) runs in brg_reducer_finalize after the
 * request completed. After it, data holds exactly what every gradient of the
 * bucket becomes: the reducer divides nothing for a custom hook.
 */
typedef brg_status (*brg_reducer_hook_fn)(void *arg, brg_comm *comm, brg_reducer_bucket *bucket);

typedef struct brg_reducer_config {
  size_t bucket_cap_bytes;       /* 0: 25 MiB */
  size_t first_bucket_cap_bytes; /* 0: 1 MiB */
  unsigned flags;                /* BRG_REDUCER_* above */
  brg_reducer_hook hook;
  brg_reducer_hook_fn hook_launch;
  brg_reducer_hook_fn hook_finish;
  void *hook_arg;
  /* BRG_REDUCER_DEVICE: the communication stream (a stream of the
   * parameters' GPU), or NULL for one the reducer creates. Host form: NULL. */
  brg_stream stream;
} brg_reducer_config;

#define BRG_REDUCER_DEFAULT_BUCKET_CAP (25u << 20)
#define BRG_REDUCER_DEFAULT_FIRST_BUCKET_CAP (1u << 20)

/*
 * Registers the parameters and builds the buckets; every rank must pass the
 * same list (counts, dtypes) and the same configuration, which is checked
 * here with two small collectives (BRG_ERR_MISMATCH names the first
 * parameter that differs). cfg may be NULL for the defaults. The reducer
 * keeps `comm` but does not own it; destroy the reducer first.
 */
brg_status brg_reducer_create(brg_reducer **red, brg_comm *comm, const brg_reducer_param *params,
                              size_t nparams, const brg_reducer_config *cfg);
brg_status brg_reducer_destroy(brg_reducer *red);

/* Copies every parameter's data from `root` to all ranks (params without
 * data are skipped, on every rank alike). Call it outside a backward. */
brg_status brg_reducer_broadcast_params(brg_reducer *red, int root);

/* Starts a backward pass; flags is 0 or BRG_REDUCER_NO_SYNC. */
brg_status brg_reducer_prepare(brg_reducer *red, unsigned flags);

/* The gradient of parameter `param` (its registration index) is final for
 * this backward. Thread-safe. */
brg_status brg_reducer_mark_ready(brg_reducer *red, size_t param);
/* Device form: the gradient is complete once the work enqueued so far on
 * `producer` has run. Returns at once. */
brg_status brg_reducer_mark_ready_on(brg_reducer *red, size_t param, brg_stream producer);

/* Waits for every bucket and leaves each gradient equal to the average (or
 * sum) over ranks. After a NO_SYNC backward it only checks and returns. */
brg_status brg_reducer_finalize(brg_reducer *red);
/* Device form: as finalize, but returns once the work is enqueued; what is
 * enqueued on `caller` afterwards sees the final gradients. */
brg_status brg_reducer_finalize_on(brg_reducer *red, brg_stream caller);

/*
 * Where parameter `param`'s gradient lives: the registered buffer, or with
 * BRG_REDUCER_GRAD_AS_VIEW its place inside a bucket. Views move once, when
 * the buckets are rebuilt at the end of the first synced finalize (contents
 * kept); fetch them again after it, or set BRG_REDUCER_NO_REBUILD.
 */
brg_status brg_reducer_grad(const brg_reducer *red, size_t param, void **grad);

/* The bucket layout: number of buckets, and per bucket its dtype, element
 * count and parameters (registration indices, in bucket order). `params`
 * may be NULL to ask only for the count of parameters. */
brg_status brg_reducer_num_buckets(const brg_reducer *red, size_t *nbuckets);
brg_status brg_reducer_bucket_layout(const brg_reducer *red, size_t bucket, brg_dtype *dtype,
                                     size_t *count, size_t *nparams, const size_t **params);

const char *brg_reducer_last_error(const brg_reducer *red);

#ifdef __cplusplus
}
#endif

#endif /* BRIGADE_REDUCER_H */
