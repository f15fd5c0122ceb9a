/*
 * The real verbs backend: libibverbs opened with dlopen("libibverbs.so.1")
 * and its entry points resolved at run time, so libbrigade.so loads on
 * machines without rdma-core and says "no device" instead of failing.
 *
 * Only the control path goes through resolved symbols; ibv_post_send,
 * ibv_post_recv and ibv_poll_cq are inline in <infiniband/verbs.h> and call
 * the provider through the context's ops table, so the data path needs none.
 *
 * The queue-pair attributes for INIT, RTR and RTS and the GID choice are
 * built by pure functions (declared in verbs_api.h) that the unit tests pin
 * down, since the software backend cannot exercise them.
 */
#include "verbs_api.h"

#ifndef BRG_HAVE_VERBS_H

const brg__vb_ops *const brg__vb_real = NULL;

#else

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

/* ---- parameter building (pure) ------------------------------------------- */

int brg__verbs_attr_init(struct ibv_qp_attr *a, uint8_t port) {
  memset(a, 0, sizeof *a);
  a->qp_state = IBV_QPS_INIT;
  a->pkey_index = 0;
  a->port_num = port;
  a->qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  return IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
}

int brg__verbs_attr_rtr(struct ibv_qp_attr *a, const brg__vb_qp_info *remote, uint8_t port,
                        int local_gid_index, enum ibv_mtu local_mtu) {
  memset(a, 0, sizeof *a);
  a->qp_state = IBV_QPS_RTR;
  /* Both ends must agree on the path MTU: the smaller of the two ports'. */
  a->path_mtu =
      remote->mtu && (enum ibv_mtu)remote->mtu < local_mtu ? (enum ibv_mtu)remote->mtu : local_mtu;
  a->dest_qp_num = remote->qpn;
  a->rq_psn = remote->psn & 0xffffff;
  a->max_dest_rd_atomic = 1;
  a->min_rnr_timer = 12;
  a->ah_attr.port_num = port;
  a->ah_attr.sl = 0;
  if (remote->link_layer == IBV_LINK_LAYER_INFINIBAND && remote->lid != 0) {
    a->ah_attr.is_global = 0;
    a->ah_attr.dlid = remote->lid;
  } else {
    /* RoCE (or InfiniBand across subnets): routed by GID. */
    a->ah_attr.is_global = 1;
    memcpy(a->ah_attr.grh.dgid.raw, remote->gid, 16);
    a->ah_attr.grh.sgid_index = (uint8_t)(local_gid_index < 0 ? 0 : local_gid_index);
    a->ah_attr.grh.hop_limit = 255;
    a->ah_attr.grh.flow_label = 0;
    a->ah_attr.grh.traffic_class = 0;
  }
  return IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
         IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
}

int brg__verbs_attr_rts(struct ibv_qp_attr *a, uint32_t psn, int timeout, int retry_cnt) {
  memset(a, 0, sizeof *a);
  a->qp_state = IBV_QPS_RTS;
  a->sq_psn = psn & 0xffffff;
  a->timeout = (uint8_t)timeout;
  a->retry_cnt = (uint8_t)retry_cnt;
  a->rnr_retry = 7; /* receives are always posted ahead; 7 means retry forever */
  a->max_rd_atomic = 1;
  return IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
         IBV_QP_MAX_QP_RD_ATOMIC;
}

static int gid_zero(const union ibv_gid *g) {
  for (int i = 0; i < 16; i++)
    if (g->raw[i]) return 0;
  return 1;
}

static int gid_v4_mapped(const union ibv_gid *g) {
  static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return memcmp(g->raw, prefix, sizeof prefix) == 0;
}

int brg__verbs_pick_gid(const union ibv_gid *gids, const int *gid_types, int n, int wanted) {
  if (wanted >= 0) return wanted < n && !gid_zero(&gids[wanted]) ? wanted : -1;
  int v2 = -1, any = -1;
  for (int i = 0; i < n; i++) {
    if (gid_zero(&gids[i])) continue;
    if (gid_types[i] == 1 && gid_v4_mapped(&gids[i])) return i;
    if (gid_types[i] == 1 && v2 < 0) v2 = i;
    if (any < 0) any = i;
  }
  return v2 >= 0 ? v2 : any;
}

int brg__verbs_parse_hca(const char *spec, char *dev, size_t dev_bytes, int *port) {
  *port = 0;
  dev[0] = 0;
  if (!spec || !*spec) return 0;
  const char *colon = strchr(spec, ':');
  size_t len = colon ? (size_t)(colon - spec) : strlen(spec);
  if (len == 0 || len >= dev_bytes) return -1;
  memcpy(dev, spec, len);
  dev[len] = 0;
  if (colon) {
    char *end;
    long p = strtol(colon + 1, &end, 10);
    if (end == colon + 1 || *end || p < 1 || p > 255) return -1;
    *port = (int)p;
  }
  return 0;
}

/* ---- libibverbs, resolved at run time ------------------------------------------ */

static struct {
  void *lib;
  struct ibv_device **(*get_device_list)(int *);
  void (*free_device_list)(struct ibv_device **);
  const char *(*get_device_name)(struct ibv_device *);
  struct ibv_context *(*open_device)(struct ibv_device *);
  int (*close_device)(struct ibv_context *);
  int (*query_device)(struct ibv_context *, struct ibv_device_attr *);
  int (*query_port)(struct ibv_context *, uint8_t, struct _compat_ibv_port_attr *);
  int (*query_gid)(struct ibv_context *, uint8_t, int, union ibv_gid *);
  struct ibv_pd *(*alloc_pd)(struct ibv_context *);
  int (*dealloc_pd)(struct ibv_pd *);
  struct ibv_mr *(*reg_mr)(struct ibv_pd *, void *, size_t, int);
  int (*dereg_mr)(struct ibv_mr *);
  struct ibv_cq *(*create_cq)(struct ibv_context *, int, void *, struct ibv_comp_channel *, int);
  int (*destroy_cq)(struct ibv_cq *);
  struct ibv_qp *(*create_qp)(struct ibv_pd *, struct ibv_qp_init_attr *);
  int (*destroy_qp)(struct ibv_qp *);
  int (*modify_qp)(struct ibv_qp *, struct ibv_qp_attr *, int);
  const char *(*wc_status_str)(enum ibv_wc_status);
  /* optional: rdma-core 34 and later */
  struct ibv_mr *(*reg_dmabuf_mr)(struct ibv_pd *, uint64_t, size_t, uint64_t, int, int);
} ibv;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static char load_why[160];

static void lib_load(void) {
  ibv.lib = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!ibv.lib) {
    snprintf(load_why, sizeof load_why, "no device (libibverbs.so.1 not found: install rdma-core)");
    return;
  }
  struct {
    const char *name;
    void **slot;
  } syms[] = {
#define SYM(field, name)                                                                           \
  { name, (void **)&ibv.field }
      SYM(get_device_list, "ibv_get_device_list"),
      SYM(free_device_list, "ibv_free_device_list"),
      SYM(get_device_name, "ibv_get_device_name"),
      SYM(open_device, "ibv_open_device"),
      SYM(close_device, "ibv_close_device"),
      SYM(query_device, "ibv_query_device"),
      SYM(query_port, "ibv_query_port"),
      SYM(query_gid, "ibv_query_gid"),
      SYM(alloc_pd, "ibv_alloc_pd"),
      SYM(dealloc_pd, "ibv_dealloc_pd"),
      SYM(reg_mr, "ibv_reg_mr"),
      SYM(dereg_mr, "ibv_dereg_mr"),
      SYM(create_cq, "ibv_create_cq"),
      SYM(destroy_cq, "ibv_destroy_cq"),
      SYM(create_qp, "ibv_create_qp"),
      SYM(destroy_qp, "ibv_destroy_qp"),
      SYM(modify_qp, "ibv_modify_qp"),
      SYM(wc_status_str, "ibv_wc_status_str"),
#undef SYM
  };
  for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
    *syms[i].slot = dlsym(ibv.lib, syms[i].name);
    if (!*syms[i].slot) {
      snprintf(load_why, sizeof load_why, "no device (libibverbs.so.1 lacks %s)", syms[i].name);
      dlclose(ibv.lib);
      ibv.lib = NULL;
      return;
    }
  }
  void *dm = dlsym(ibv.lib, "ibv_reg_dmabuf_mr");
  memcpy(&ibv.reg_dmabuf_mr, &dm, sizeof dm);
}

/* What the inline ibv_query_port of the header does, with the resolved
 * fallback instead of a link-time one. */
static int port_query(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr) {
  struct verbs_context *vctx = verbs_get_ctx_op(ctx, query_port);
  if (vctx) return vctx->query_port(ctx, port, attr, sizeof *attr);
  memset(attr, 0, sizeof *attr);
  return ibv.query_port(ctx, port, (struct _compat_ibv_port_attr *)attr);
}

static int real_probe(char *why, size_t why_bytes) {
  pthread_once(&load_once, lib_load);
  if (!ibv.lib) {
    snprintf(why, why_bytes, "%s", load_why);
    return 0;
  }
  int n = 0;
  struct ibv_device **list = ibv.get_device_list(&n);
  if (list) ibv.free_device_list(list);
  if (n <= 0) {
    snprintf(why, why_bytes,
             "no device (libibverbs found no RDMA device; BRIGADE_IB_BACKEND=soft runs the "
             "software backend)");
    return 0;
  }
  return 1;
}

struct brg__vb_ctx {
  struct ibv_context *ctx;
  struct ibv_pd *pd;
  uint8_t port;
  struct ibv_port_attr attr;
  int gid_index;
  union ibv_gid gid;
  char name[64];
};

struct brg__vb_qp {
  brg__vb_ctx *ctx;
  struct ibv_cq *cq;
  struct ibv_qp *qp;
  uint32_t psn;
};

/* GID types from sysfs: 1 for "RoCE v2", 0 otherwise. */
static int gid_type(const char *dev, int port, int index) {
  char path[256], text[32] = "";
  snprintf(path, sizeof path, "/sys/class/infiniband/%s/ports/%d/gid_attrs/types/%d", dev, port,
           index);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  if (!fgets(text, sizeof text, f)) text[0] = 0;
  fclose(f);
  return strncmp(text, "RoCE v2", 7) == 0;
}

static brg_status gid_choose(brg__vb_ctx *c, brg__errbuf *err) {
  int wanted = (int)brg__config_int(&brg__ib_config, BRG__IB_CFG_GID_INDEX);
  if (c->attr.link_layer == IBV_LINK_LAYER_INFINIBAND && wanted < 0) {
    c->gid_index = 0;
    if (ibv.query_gid(c->ctx, c->port, 0, &c->gid) != 0) memset(&c->gid, 0, sizeof c->gid);
    return BRG_SUCCESS;
  }
  enum { MAX_GIDS = 32 };
  union ibv_gid gids[MAX_GIDS];
  int types[MAX_GIDS];
  int n = c->attr.gid_tbl_len < MAX_GIDS ? c->attr.gid_tbl_len : MAX_GIDS;
  if (wanted >= n) n = wanted + 1 <= MAX_GIDS ? wanted + 1 : MAX_GIDS;
  for (int i = 0; i < n; i++) {
    if (ibv.query_gid(c->ctx, c->port, i, &gids[i]) != 0) memset(&gids[i], 0, sizeof gids[i]);
    types[i] = gid_type(c->name, c->port, i);
  }
  c->gid_index = brg__verbs_pick_gid(gids, types, n, wanted);
  if (c->gid_index < 0)
    return brg__error(err, BRG_ERR_UNAVAILABLE, "ib", "%s port %u: no usable GID%s", c->name,
                      (unsigned)c->port, wanted >= 0 ? " at BRIGADE_IB_GID_INDEX" : "");
  c->gid = gids[c->gid_index];
  return BRG_SUCCESS;
}

static void real_ctx_close(brg__vb_ctx *c) {
  if (!c) return;
  if (c->pd) ibv.dealloc_pd(c->pd);
  if (c->ctx) ibv.close_device(c->ctx);
  free(c);
}

static brg_status real_ctx_open(brg__vb_ctx **out, const char *addr, brg__errbuf *err) {
  (void)addr;
  char want[64];
  int want_port;
  const char *spec = brg__config_str(&brg__ib_config, BRG__IB_CFG_HCA);
  if (brg__verbs_parse_hca(spec, want, sizeof want, &want_port) != 0)
    return brg__error(err, BRG_ERR_INVALID_ARGUMENT, "ib",
                      "BRIGADE_IB_HCA=\"%s\" is not DEVICE or DEVICE:PORT", spec);
  brg__vb_ctx *c = calloc(1, sizeof *c);
  if (!c) return brg__error(err, BRG_ERR_NO_MEMORY, "ib", "out of memory");
  int n = 0;
  struct ibv_device **list = ibv.get_device_list(&n);
  for (int i = 0; list && i < n && !c->ctx; i++) {
    const char *name = ibv.get_device_name(list[i]);
    if (want[0] && strcmp(name, want) != 0) continue;
    struct ibv_context *ctx = ibv.open_device(list[i]);
    if (!ctx) continue;
    struct ibv_device_attr da;
    int nports = ibv.query_device(ctx, &da) == 0 ? da.phys_port_cnt : 1;
    for (int p = 1; p <= nports && !c->ctx; p++) {
      if (want_port && p != want_port) continue;
      struct ibv_port_attr pa;
      if (port_query(ctx, (uint8_t)p, &pa) != 0 || pa.state != IBV_PORT_ACTIVE) continue;
      c->ctx = ctx;
      c->port = (uint8_t)p;
      c->attr = pa;
      snprintf(c->name, sizeof c->name, "%s", name);
    }
    if (!c->ctx) ibv.close_device(ctx);
  }
  if (list) ibv.free_device_list(list);
  if (!c->ctx) {
    free(c);
    return brg__error(err, BRG_ERR_UNAVAILABLE, "ib", "no active RDMA port%s%s",
                      spec[0] ? " on " : "", spec);
  }
  brg_status s = gid_choose(c, err);
  if (s == BRG_SUCCESS && !(c->pd = ibv.alloc_pd(c->ctx)))
    s = brg__error(err, BRG_ERR_SYSTEM, "ib", "ibv_alloc_pd on %s: %s", c->name, strerror(errno));
  if (s != BRG_SUCCESS) {
    real_ctx_close(c);
    return s;
  }
  BRG__TRACE("ib", "%s port %u (%s), GID index %d", c->name, (unsigned)c->port,
             c->attr.link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "InfiniBand", c->gid_index);
  *out = c;
  return BRG_SUCCESS;
}

static brg_status real_mr_reg(brg__vb_ctx *c, void *addr, size_t len, brg__vb_mr *out,
                              brg__errbuf *err) {
  struct ibv_mr *mr =
      ibv.reg_mr(c->pd, addr, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (!mr)
    return brg__error(err, BRG_ERR_SYSTEM, "ib", "ibv_reg_mr of %zu bytes on %s: %s", len, c->name,
                      strerror(errno));
  *out = (brg__vb_mr){.addr = addr, .len = len, .lkey = mr->lkey, .rkey = mr->rkey, .impl = mr};
  return BRG_SUCCESS;
}

static brg_status real_mr_reg_dmabuf(brg__vb_ctx *c, int fd, uint64_t offset, size_t len,
                                     void *iova, brg__vb_mr *out, brg__errbuf *err) {
  if (!ibv.reg_dmabuf_mr)
    return brg__error(err, BRG_ERR_UNAVAILABLE, "ib",
                      "libibverbs has no ibv_reg_dmabuf_mr (rdma-core 34 or later needed)");
  struct ibv_mr *mr = ibv.reg_dmabuf_mr(c->pd, offset, len, (uint64_t)(uintptr_t)iova, fd,
                                        IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (!mr)
    return brg__error(err, BRG_ERR_SYSTEM, "ib", "ibv_reg_dmabuf_mr of %zu bytes on %s: %s", len,
                      c->name, strerror(errno));
  *out = (brg__vb_mr){.addr = iova, .len = len, .lkey = mr->lkey, .rkey = mr->rkey, .impl = mr};
  return BRG_SUCCESS;
}

static void real_mr_dereg(brg__vb_ctx *c, brg__vb_mr *mr) {
  (void)c;
  if (mr->impl) ibv.dereg_mr(mr->impl);
  memset(mr, 0, sizeof *mr);
}

static void real_qp_destroy(brg__vb_qp *q) {
  if (!q) return;
  if (q->qp) ibv.destroy_qp(q->qp);
  if (q->cq) ibv.destroy_cq(q->cq);
  free(q);
}

static brg_status real_qp_create(brg__vb_ctx *c, int max_send, int max_recv, brg__vb_qp **out,
                                 brg__vb_qp_info *info, brg__errbuf *err) {
  brg__vb_qp *q = calloc(1, sizeof *q);
  if (!q) return brg__error(err, BRG_ERR_NO_MEMORY, "ib", "out of memory");
  q->ctx = c;
  *out = q;
  if (!(q->cq = ibv.create_cq(c->ctx, max_send + max_recv, NULL, NULL, 0)))
    return brg__error(err, BRG_ERR_SYSTEM, "ib", "ibv_create_cq: %s", strerror(errno));
  struct ibv_qp_init_attr ia = {.send_cq = q->cq,
                                .recv_cq = q->cq,
                                .qp_type = IBV_QPT_RC,
                                .cap = {.max_send_wr = (uint32_t)max_send,
                                        .max_recv_wr = (uint32_t)max_recv,
                                        .max_send_sge = 1,
                                        .max_recv_sge = 1}};
  if (!(q->qp = ibv.create_qp(c->pd, &ia)))
    return brg__error(err, BRG_ERR_SYSTEM, "ib", "ibv_create_qp: %s", strerror(errno));
  struct ibv_qp_attr a;
  int mask = brg__verbs_attr_init(&a, c->port);
  if ((errno = ibv.modify_qp(q->qp, &a, mask)) != 0)
    return brg__error(err, BRG_ERR_SYSTEM, "ib", "queue pair to INIT: %s", strerror(errno));
  if (getrandom(&q->psn, sizeof q->psn, 0) != sizeof q->psn) q->psn = 0x5eed;
  q->psn &= 0xffffff;
  memset(info, 0, sizeof *info);
  info->qpn = q->qp->qp_num;
  info->psn = q->psn;
  info->lid = c->attr.lid;
  info->link_layer = c->attr.link_layer;
  info->mtu = (uint8_t)c->attr.active_mtu;
  info->gid_index = (uint8_t)c->gid_index;
  memcpy(info->gid, c->gid.raw, 16);
  return BRG_SUCCESS;
}

static brg_status real_qp_connect(brg__vb_qp *q, const brg__vb_qp_info *r, int active,
                                  int timeout_ms, brg__errbuf *err) {
  (void)active;
  (void)timeout_ms;
  struct ibv_qp_attr a;
  int mask = brg__verbs_attr_rtr(&a, r, q->ctx->port, q->ctx->gid_index, q->ctx->attr.active_mtu);
  if ((errno = ibv.modify_qp(q->qp, &a, mask)) != 0)
    return brg__error(err, BRG_ERR_SYSTEM, "ib", "queue pair to RTR (peer qpn %u): %s", r->qpn,
                      strerror(errno));
  mask = brg__verbs_attr_rts(&a, q->psn, (int)brg__config_int(&brg__ib_config, BRG__IB_CFG_TIMEOUT),
                             (int)brg__config_int(&brg__ib_config, BRG__IB_CFG_RETRY_CNT));
  if ((errno = ibv.modify_qp(q->qp, &a, mask)) != 0)
    return brg__error(err, BRG_ERR_SYSTEM, "ib", "queue pair to RTS: %s", strerror(errno));
  return BRG_SUCCESS;
}

static brg_status real_post_write(brg__vb_qp *q, uint64_t wr_id, const brg__vb_mr *lmr,
                                  const void *laddr, uint32_t len, uint64_t raddr, uint32_t rkey,
                                  int with_imm, uint32_t imm, int signaled) {
  struct ibv_sge sge = {.addr = (uint64_t)(uintptr_t)laddr, .length = len, .lkey = lmr->lkey};
  struct ibv_send_wr wr = {.wr_id = wr_id,
                           .sg_list = len ? &sge : NULL,
                           .num_sge = len ? 1 : 0,
                           .opcode = with_imm ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE,
                           .send_flags = signaled ? IBV_SEND_SIGNALED : 0,
                           .imm_data = htobe32(imm),
                           .wr.rdma = {.remote_addr = raddr, .rkey = rkey}};
  struct ibv_send_wr *bad;
  return ibv_post_send(q->qp, &wr, &bad) == 0 ? BRG_SUCCESS : BRG_ERR_SYSTEM;
}

static brg_status real_post_recv(brg__vb_qp *q, uint64_t wr_id) {
  struct ibv_recv_wr wr = {.wr_id = wr_id, .sg_list = NULL, .num_sge = 0}, *bad;
  return ibv_post_recv(q->qp, &wr, &bad) == 0 ? BRG_SUCCESS : BRG_ERR_SYSTEM;
}

static int wc_status(enum ibv_wc_status s) {
  switch (s) {
  case IBV_WC_SUCCESS: return BRG__VB_WC_SUCCESS;
  case IBV_WC_REM_ACCESS_ERR: return BRG__VB_WC_REM_ACCESS;
  case IBV_WC_RNR_RETRY_EXC_ERR: return BRG__VB_WC_RNR;
  case IBV_WC_WR_FLUSH_ERR: return BRG__VB_WC_FLUSH;
  case IBV_WC_RETRY_EXC_ERR: return BRG__VB_WC_TRANSPORT;
  default: return BRG__VB_WC_OTHER;
  }
}

static int real_poll(brg__vb_qp *q, brg__vb_wc *out, int max) {
  struct ibv_wc wc[16];
  if (max > 16) max = 16;
  int n = ibv_poll_cq(q->cq, max, wc);
  if (n < 0) return -1;
  for (int i = 0; i < n; i++)
    out[i] = (brg__vb_wc){.wr_id = wc[i].wr_id,
                          .status = wc_status(wc[i].status),
                          .opcode = wc[i].status == IBV_WC_SUCCESS &&
                                            wc[i].opcode == IBV_WC_RECV_RDMA_WITH_IMM
                                        ? BRG__VB_OP_RECV_IMM
                                        : BRG__VB_OP_WRITE,
                          .imm = be32toh(wc[i].imm_data),
                          .byte_len = wc[i].byte_len,
                          .status_text = ibv.wc_status_str(wc[i].status)};
  return n;
}

static const brg__vb_ops real_ops = {
    .name = "verbs",
    .probe = real_probe,
    .ctx_open = real_ctx_open,
    .ctx_close = real_ctx_close,
    .mr_reg = real_mr_reg,
    .mr_dereg = real_mr_dereg,
    .mr_reg_dmabuf = real_mr_reg_dmabuf,
    .qp_create = real_qp_create,
    .qp_connect = real_qp_connect,
    .qp_destroy = real_qp_destroy,
    .post_write = real_post_write,
    .post_recv = real_post_recv,
    .poll = real_poll,
    .qp_notify = NULL,
};

const brg__vb_ops *const brg__vb_real = &real_ops;

#endif
