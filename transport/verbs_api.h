/*
 * The narrow verbs interface the ibverbs transport is written against.
 *
 * Two backends implement it: real libibverbs opened with dlopen
 * (verbs_real.c) and a software backend that keeps the same semantics over a
 * TCP socket per queue pair (verbs_soft.c), so the transport's protocol runs
 * end to end on machines with no RDMA hardware:
 *
 *   - a write lands in the peer's registered memory at (remote_addr, rkey);
 *   - a write-with-immediate does the same, then consumes a receive the peer
 *     posted and gives the peer a completion carrying the immediate;
 *   - completions of one queue pair arrive in the order work was posted; an
 *     unsignalled write produces none, but its failure still shows in the
 *     next signalled one (the queue pair goes to error and flushes);
 *   - a wrong rkey or a write outside the registered range is a failed
 *     completion (BRG__VB_WC_REM_ACCESS), as a real RC queue pair reports it.
 */
#ifndef BRG_VERBS_API_H
#define BRG_VERBS_API_H

#include <stddef.h>
#include <stdint.h>
#include "brigade.h"
#include "config.h"
#include "log.h"

/* The ibverbs transport's settings (ibverbs.c), read by both backends. */
typedef enum {
  BRG__IB_CFG_BACKEND, /* auto|verbs|soft */
  BRG__IB_CFG_HCA,
  BRG__IB_CFG_GID_INDEX,
  BRG__IB_CFG_QPS_PER_LINK,
  BRG__IB_CFG_TIMEOUT,
  BRG__IB_CFG_RETRY_CNT,
  BRG__IB_CFG_ALLOW_LOCAL, /* int 0|1, let ibverbs link ranks of one host (tests) */
  BRG__IB_CFG_COUNT
} brg__ib_cfg_id;
extern brg__cfg_section brg__ib_config;

typedef struct brg__vb_ctx
    brg__vb_ctx;                      /* a device (or socket endpoint) with its protection domain */
typedef struct brg__vb_qp brg__vb_qp; /* a reliable-connected queue pair with its own CQ */

typedef struct brg__vb_mr {
  void *addr;
  size_t len;
  uint32_t lkey, rkey;
  void *impl;
} brg__vb_mr;

/* What one end of a queue pair tells the other so they can connect. Plain
 * bytes in network order where it matters; both backends use the same shape. */
typedef struct brg__vb_qp_info {
  uint32_t qpn;       /* queue pair number (soft: a random token) */
  uint32_t psn;       /* initial packet sequence number */
  uint16_t lid;       /* InfiniBand local id; 0 on RoCE */
  uint16_t port;      /* soft: TCP port of the queue pair's listener */
  uint8_t link_layer; /* 1 InfiniBand, 2 Ethernet (RoCE), 0 soft */
  uint8_t mtu;        /* enum ibv_mtu of the port */
  uint8_t gid_index;
  uint8_t pad;
  uint8_t gid[16];
  char addr[64]; /* soft: numeric address of the listener */
} brg__vb_qp_info;

enum {
  BRG__VB_WC_SUCCESS = 0,
  BRG__VB_WC_REM_ACCESS, /* wrong rkey or out of bounds at the target */
  BRG__VB_WC_RNR,        /* write-with-immediate found no posted receive */
  BRG__VB_WC_FLUSH,      /* the queue pair went to error before this ran */
  BRG__VB_WC_TRANSPORT,  /* the connection broke (real: retry exceeded) */
  BRG__VB_WC_OTHER,
};

enum { BRG__VB_OP_WRITE = 1, BRG__VB_OP_RECV_IMM = 2 };

typedef struct brg__vb_wc {
  uint64_t wr_id;
  int status;   /* BRG__VB_WC_* */
  int opcode;   /* BRG__VB_OP_WRITE for send side, BRG__VB_OP_RECV_IMM for receives */
  uint32_t imm; /* host order */
  uint32_t byte_len;
  const char *status_text; /* backend's own words (ibv_wc_status_str) */
} brg__vb_wc;

typedef struct brg__vb_ops {
  const char *name; /* "verbs" or "soft" */
  /* 1 when the backend can work here; otherwise `why` says why. */
  int (*probe)(char *why, size_t why_bytes);
  /* `addr` is the numeric address this rank advertises (soft listens there). */
  brg_status (*ctx_open)(brg__vb_ctx **out, const char *addr, brg__errbuf *err);
  void (*ctx_close)(brg__vb_ctx *ctx);
  /* Registration for local writes and remote writes. */
  brg_status (*mr_reg)(brg__vb_ctx *ctx, void *addr, size_t len, brg__vb_mr *out, brg__errbuf *err);
  void (*mr_dereg)(brg__vb_ctx *ctx, brg__vb_mr *mr);
  /* Registration of device memory given as a dmabuf (GPUDirect RDMA):
   * `len` bytes at `offset` into `fd`, addressed as `iova` in work requests.
   * The software backend needs the memory mapped at iova in this process
   * (the emulated CUDA module's is). */
  brg_status (*mr_reg_dmabuf)(brg__vb_ctx *ctx, int fd, uint64_t offset, size_t len, void *iova,
                              brg__vb_mr *out, brg__errbuf *err);
  /* A queue pair with room for max_send outstanding sends and max_recv
   * receives; `info` is what the peer needs to connect to it. */
  brg_status (*qp_create)(brg__vb_ctx *ctx, int max_send, int max_recv, brg__vb_qp **out,
                          brg__vb_qp_info *info, brg__errbuf *err);
  /* Connects to the peer's queue pair (real: INIT -> RTR -> RTS). `active`
   * is 1 on exactly one end of the pair (soft: that end dials);
   * timeout_ms <= 0: no limit. */
  brg_status (*qp_connect)(brg__vb_qp *qp, const brg__vb_qp_info *remote, int active,
                           int timeout_ms, brg__errbuf *err);
  void (*qp_destroy)(brg__vb_qp *qp);
  /* Posts an RDMA write of [laddr, laddr+len) (inside `lmr`) to
   * (raddr, rkey); with `with_imm` it is a write-with-immediate. */
  brg_status (*post_write)(brg__vb_qp *qp, uint64_t wr_id, const brg__vb_mr *lmr, const void *laddr,
                           uint32_t len, uint64_t raddr, uint32_t rkey, int with_imm, uint32_t imm,
                           int signaled);
  /* Posts a receive for one write-with-immediate (no scatter list needed). */
  brg_status (*post_recv)(brg__vb_qp *qp, uint64_t wr_id);
  /* Up to `max` completions; returns how many, or -1 when the CQ failed. */
  int (*poll)(brg__vb_qp *qp, brg__vb_wc *wc, int max);
  /* Asks the backend to call fn(arg) whenever a completion is queued or a
   * peer's write landed, so a waiting proxy can sleep instead of polling.
   * Set before qp_connect. NULL where the backend has no thread of its own
   * (real verbs: the proxy polls). */
  void (*qp_notify)(brg__vb_qp *qp, void (*fn)(void *arg), void *arg);
} brg__vb_ops;

extern const brg__vb_ops brg__vb_soft;
/* For tests: the next `n` write-with-immediates posted on any software queue
 * pair of this process carry a wrong rkey, so the peer rejects them as an RC
 * responder does (a remote access error at the requester; the responder's
 * queue pair flushes). 0 turns it off. */
void brg__vb_soft_test_bad_rkey(int n);
/* NULL where the build found no libibverbs headers. */
extern const brg__vb_ops *const brg__vb_real;

#ifdef BRG_HAVE_VERBS_H
#include <infiniband/verbs.h>

/* Parameter building of the real backend, pure so it can be unit-tested
 * without a device. Each returns the attribute mask to pass to ibv_modify_qp. */
int brg__verbs_attr_init(struct ibv_qp_attr *a, uint8_t port);
int brg__verbs_attr_rtr(struct ibv_qp_attr *a, const brg__vb_qp_info *remote, uint8_t port,
                        int local_gid_index, enum ibv_mtu local_mtu);
int brg__verbs_attr_rts(struct ibv_qp_attr *a, uint32_t psn, int timeout, int retry_cnt);

/* Picks the GID index to use on a port: `wanted` when >= 0, otherwise the
 * first RoCE v2 IPv4-mapped GID, else the first RoCE v2, else the first
 * non-zero one; gid_types[i] is 1 for RoCE v2, 0 otherwise. -1 when none. */
int brg__verbs_pick_gid(const union ibv_gid *gids, const int *gid_types, int n, int wanted);

/* Parses BRIGADE_IB_HCA ("mlx5_0:1", "mlx5_0", "" for any): 0 on success. */
int brg__verbs_parse_hca(const char *spec, char *dev, size_t dev_bytes, int *port);
#endif

#endif
