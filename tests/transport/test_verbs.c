/*
 * The verbs layer under the ibverbs transport:
 *   - the software backend keeps RC semantics: a write lands at (addr, rkey),
 *     a write-with-immediate consumes a posted receive and carries the
 *     immediate, completions come in posting order, and a wrong rkey, an
 *     out-of-bounds write or a missing receive is a failed completion that
 *     flushes what was posted after it;
 *   - the real backend's parameter building (queue-pair attributes for INIT,
 *     RTR and RTS, GID choice, BRIGADE_IB_HCA parsing), which the software
 *     backend cannot exercise, and its "no device" answer where there is none.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "settings.h"
#include "transport.h"
#include "verbs_api.h"

/* ---- the software backend --------------------------------------------------- */

typedef struct pair {
  brg__vb_ctx *ca, *cb;
  brg__vb_qp *a, *b; /* a writes, b is written to */
  char *src, *dst;
  brg__vb_mr mra, mrb;
} pair;

#define BUF 8192

static void pair_open(pair *p) {
  const brg__vb_ops *vb = &brg__vb_soft;
  brg__errbuf err;
  memset(p, 0, sizeof *p);
  assert_int_equal(vb->ctx_open(&p->ca, "127.0.0.1", &err), BRG_SUCCESS);
  assert_int_equal(vb->ctx_open(&p->cb, "127.0.0.1", &err), BRG_SUCCESS);
  p->src = calloc(1, BUF);
  p->dst = calloc(1, BUF);
  assert_non_null(p->src);
  assert_non_null(p->dst);
  assert_int_equal(vb->mr_reg(p->ca, p->src, BUF, &p->mra, &err), BRG_SUCCESS);
  assert_int_equal(vb->mr_reg(p->cb, p->dst, BUF, &p->mrb, &err), BRG_SUCCESS);
  brg__vb_qp_info ia, ib;
  assert_int_equal(vb->qp_create(p->ca, 16, 16, &p->a, &ia, &err), BRG_SUCCESS);
  assert_int_equal(vb->qp_create(p->cb, 16, 16, &p->b, &ib, &err), BRG_SUCCESS);
  /* The active end dials first; the passive end finds it in its backlog. */
  assert_int_equal(vb->qp_connect(p->a, &ib, 1, 5000, &err), BRG_SUCCESS);
  assert_int_equal(vb->qp_connect(p->b, &ia, 0, 5000, &err), BRG_SUCCESS);
}

static void pair_close(pair *p) {
  const brg__vb_ops *vb = &brg__vb_soft;
  vb->qp_destroy(p->a);
  vb->qp_destroy(p->b);
  vb->mr_dereg(p->ca, &p->mra);
  vb->mr_dereg(p->cb, &p->mrb);
  vb->ctx_close(p->ca);
  vb->ctx_close(p->cb);
  free(p->src);
  free(p->dst);
}

/* Waits up to 5 s for n completions. */
static void wait_wc(brg__vb_qp *q, brg__vb_wc *wc, int n) {
  int got = 0;
  for (int i = 0; i < 5000 && got < n; i++) {
    got += brg__vb_soft.poll(q, wc + got, n - got);
    if (got < n) usleep(1000);
  }
  assert_int_equal(got, n);
}

static void soft_write_and_imm(void **state) {
  (void)state;
  pair p;
  pair_open(&p);
  const brg__vb_ops *vb = &brg__vb_soft;
  for (int i = 0; i < BUF; i++) p.src[i] = (char)(i * 7 + 1);
  assert_int_equal(vb->post_recv(p.b, 77), BRG_SUCCESS);
  assert_int_equal(vb->post_recv(p.b, 78), BRG_SUCCESS);
  /* unsignalled write, then two signalled writes-with-immediate */
  assert_int_equal(
      vb->post_write(p.a, 1, &p.mra, p.src, 4096, (uint64_t)(uintptr_t)p.dst, p.mrb.rkey, 0, 0, 0),
      BRG_SUCCESS);
  assert_int_equal(vb->post_write(p.a, 2, &p.mra, p.src + 4096, 100,
                                  (uint64_t)(uintptr_t)(p.dst + 4096), p.mrb.rkey, 1, 0xabcd, 1),
                   BRG_SUCCESS);
  assert_int_equal(vb->post_write(p.a, 3, &p.mra, p.src + 5000, 0, 0, 0, 1, 42, 1), BRG_SUCCESS);
  brg__vb_wc wc[2];
  wait_wc(p.a, wc, 2);
  assert_int_equal(wc[0].status, BRG__VB_WC_SUCCESS);
  assert_int_equal(wc[0].wr_id, 2); /* the unsignalled one gives none; order kept */
  assert_int_equal(wc[1].wr_id, 3);
  wait_wc(p.b, wc, 2);
  assert_int_equal(wc[0].opcode, BRG__VB_OP_RECV_IMM);
  assert_int_equal(wc[0].wr_id, 77);
  assert_int_equal(wc[0].imm, 0xabcd);
  assert_int_equal(wc[0].byte_len, 100);
  assert_int_equal(wc[1].wr_id, 78);
  assert_int_equal(wc[1].imm, 42);
  assert_memory_equal(p.dst, p.src, 4196);
  pair_close(&p);
}

/* A write the target must refuse fails with `want`; the next is flushed and
 * the target's memory is untouched. */
static void soft_refused(uint64_t raddr_off, uint32_t len, int bad_key, int with_imm, int want) {
  pair p;
  pair_open(&p);
  const brg__vb_ops *vb = &brg__vb_soft;
  memset(p.src, 0x5a, BUF);
  uint32_t rkey = bad_key ? p.mrb.rkey ^ 0x100 : p.mrb.rkey;
  assert_int_equal(vb->post_write(p.a, 1, &p.mra, p.src, len,
                                  (uint64_t)(uintptr_t)p.dst + raddr_off, rkey, with_imm, 9, 0),
                   BRG_SUCCESS);
  assert_int_equal(
      vb->post_write(p.a, 2, &p.mra, p.src, 16, (uint64_t)(uintptr_t)p.dst, p.mrb.rkey, 0, 0, 1),
      BRG_SUCCESS);
  brg__vb_wc wc[2];
  wait_wc(p.a, wc, 2);
  assert_int_equal(wc[0].wr_id, 1); /* reported even though it was unsignalled */
  assert_int_equal(wc[0].status, want);
  assert_non_null(wc[0].status_text);
  assert_int_equal(wc[1].wr_id, 2);
  assert_int_equal(wc[1].status, BRG__VB_WC_FLUSH);
  for (int i = 0; i < BUF; i++) assert_int_equal(p.dst[i], 0);
  pair_close(&p);
}

static void soft_wrong_rkey(void **state) {
  (void)state;
  soft_refused(0, 64, 1, 0, BRG__VB_WC_REM_ACCESS);
}

static void soft_out_of_bounds(void **state) {
  (void)state;
  soft_refused(BUF - 32, 64, 0, 0, BRG__VB_WC_REM_ACCESS);
}

static void soft_no_receive(void **state) {
  (void)state;
  soft_refused(0, 0, 0, 1, BRG__VB_WC_RNR);
}

static void soft_peer_gone(void **state) {
  (void)state;
  pair p;
  pair_open(&p);
  const brg__vb_ops *vb = &brg__vb_soft;
  assert_int_equal(vb->post_recv(p.b, 5), BRG_SUCCESS);
  vb->qp_destroy(p.a);
  p.a = NULL;
  brg__vb_wc wc;
  wait_wc(p.b, &wc, 1);
  assert_int_equal(wc.wr_id, 5);
  assert_int_equal(wc.status, BRG__VB_WC_FLUSH);
  brg__vb_qp *b = p.b;
  p.b = NULL;
  vb->qp_destroy(b);
  pair_close(&p);
}

static void soft_local_bounds(void **state) {
  (void)state;
  pair p;
  pair_open(&p);
  assert_int_not_equal(brg__vb_soft.post_write(p.a, 1, &p.mra, p.src + BUF - 8, 64,
                                               (uint64_t)(uintptr_t)p.dst, p.mrb.rkey, 0, 0, 1),
                       BRG_SUCCESS);
  pair_close(&p);
}

/* ---- the transport says plainly why it is not there ------------------------ */

static void transport_unavailable_says_why(void **state) {
  (void)state;
  char why[256] = "";
  if (brg__transport_ibverbs.available(why, sizeof why)) {
    skip(); /* a machine with an RDMA device */
  }
  assert_true(strncmp(why, "no device", 9) == 0);
  brg__peer_info a = {.host_hash = 1}, b = {.host_hash = 2};
  assert_int_equal(brg__transport_ibverbs.can_connect(&a, &b), 0);
}

/* ---- the real backend's parameters ------------------------------------------- */

#ifdef BRG_HAVE_VERBS_H
static void real_attr_init(void **state) {
  (void)state;
  struct ibv_qp_attr a;
  int mask = brg__verbs_attr_init(&a, 2);
  assert_int_equal(a.qp_state, IBV_QPS_INIT);
  assert_int_equal(a.port_num, 2);
  assert_int_equal(a.pkey_index, 0);
  assert_int_equal(a.qp_access_flags, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  assert_int_equal(mask, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

static void real_attr_rtr_infiniband(void **state) {
  (void)state;
  brg__vb_qp_info r = {.qpn = 0x1234,
                       .psn = 0xfabcdef,
                       .lid = 17,
                       .link_layer = IBV_LINK_LAYER_INFINIBAND,
                       .mtu = IBV_MTU_2048};
  struct ibv_qp_attr a;
  int mask = brg__verbs_attr_rtr(&a, &r, 1, 0, IBV_MTU_4096);
  assert_int_equal(a.qp_state, IBV_QPS_RTR);
  assert_int_equal(a.dest_qp_num, 0x1234);
  assert_int_equal(a.rq_psn, 0xabcdef);       /* 24 bits */
  assert_int_equal(a.path_mtu, IBV_MTU_2048); /* the smaller end */
  assert_int_equal(a.ah_attr.is_global, 0);
  assert_int_equal(a.ah_attr.dlid, 17);
  assert_int_equal(a.ah_attr.port_num, 1);
  assert_int_equal(a.max_dest_rd_atomic, 1);
  assert_true(a.min_rnr_timer > 0);
  assert_int_equal(mask, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                             IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
}

static void real_attr_rtr_roce(void **state) {
  (void)state;
  brg__vb_qp_info r = {.qpn = 7, .link_layer = IBV_LINK_LAYER_ETHERNET, .mtu = IBV_MTU_4096};
  for (int i = 0; i < 16; i++) r.gid[i] = (uint8_t)(0xf0 + i);
  struct ibv_qp_attr a;
  brg__verbs_attr_rtr(&a, &r, 1, 3, IBV_MTU_1024);
  assert_int_equal(a.path_mtu, IBV_MTU_1024);
  assert_int_equal(a.ah_attr.is_global, 1);
  assert_memory_equal(a.ah_attr.grh.dgid.raw, r.gid, 16);
  assert_int_equal(a.ah_attr.grh.sgid_index, 3);
  assert_int_equal(a.ah_attr.grh.hop_limit, 255);
  assert_int_equal(a.ah_attr.dlid, 0);
}

static void real_attr_rts(void **state) {
  (void)state;
  struct ibv_qp_attr a;
  int mask = brg__verbs_attr_rts(&a, 0x1000001, 18, 7);
  assert_int_equal(a.qp_state, IBV_QPS_RTS);
  assert_int_equal(a.sq_psn, 1);
  assert_int_equal(a.timeout, 18);
  assert_int_equal(a.retry_cnt, 7);
  assert_int_equal(a.rnr_retry, 7);
  assert_int_equal(a.max_rd_atomic, 1);
  assert_int_equal(mask, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                             IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

static void real_pick_gid(void **state) {
  (void)state;
  union ibv_gid g[5];
  memset(g, 0, sizeof g);
  int types[5] = {0, 1, 0, 1, 1};
  /* 0: link-local v1; 1: link-local v2; 2: zero... set below; 3: v4-mapped v2 */
  g[0].raw[0] = 0xfe, g[0].raw[1] = 0x80, g[0].raw[15] = 1;
  g[1] = g[0];
  g[3].raw[10] = 0xff, g[3].raw[11] = 0xff, g[3].raw[12] = 10, g[3].raw[15] = 1;
  g[4] = g[3];
  assert_int_equal(brg__verbs_pick_gid(g, types, 5, -1), 3); /* first v2 IPv4-mapped */
  assert_int_equal(brg__verbs_pick_gid(g, types, 3, -1), 1); /* first v2 */
  int v1only[2] = {0, 0};
  assert_int_equal(brg__verbs_pick_gid(g, v1only, 2, -1), 0);
  assert_int_equal(brg__verbs_pick_gid(g, types, 5, 0), 0);  /* asked for */
  assert_int_equal(brg__verbs_pick_gid(g, types, 5, 2), -1); /* asked for an empty one */
  assert_int_equal(brg__verbs_pick_gid(g, types, 5, 9), -1);
  union ibv_gid zero[2];
  memset(zero, 0, sizeof zero);
  assert_int_equal(brg__verbs_pick_gid(zero, types, 2, -1), -1);
}

static void real_parse_hca(void **state) {
  (void)state;
  char dev[32];
  int port;
  assert_int_equal(brg__verbs_parse_hca("mlx5_0:1", dev, sizeof dev, &port), 0);
  assert_string_equal(dev, "mlx5_0");
  assert_int_equal(port, 1);
  assert_int_equal(brg__verbs_parse_hca("rxe0", dev, sizeof dev, &port), 0);
  assert_string_equal(dev, "rxe0");
  assert_int_equal(port, 0);
  assert_int_equal(brg__verbs_parse_hca("", dev, sizeof dev, &port), 0);
  assert_string_equal(dev, "");
  assert_int_equal(brg__verbs_parse_hca("mlx5_0:", dev, sizeof dev, &port), -1);
  assert_int_equal(brg__verbs_parse_hca("mlx5_0:x", dev, sizeof dev, &port), -1);
  assert_int_equal(brg__verbs_parse_hca(":1", dev, sizeof dev, &port), -1);
  assert_int_equal(brg__verbs_parse_hca("mlx5_0:0", dev, sizeof dev, &port), -1);
}

static void real_probe_no_device(void **state) {
  (void)state;
  char why[256] = "";
  if (brg__vb_real->probe(why, sizeof why)) skip();
  assert_true(strncmp(why, "no device", 9) == 0);
}
#endif

int main(void) {
  unsetenv("BRIGADE_IB_BACKEND");
  brg__errbuf err;
  if (brg__settings_load(&err) != BRG_SUCCESS) return 1;
  brg__log_init();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(soft_write_and_imm),
      cmocka_unit_test(soft_wrong_rkey),
      cmocka_unit_test(soft_out_of_bounds),
      cmocka_unit_test(soft_no_receive),
      cmocka_unit_test(soft_peer_gone),
      cmocka_unit_test(soft_local_bounds),
      cmocka_unit_test(transport_unavailable_says_why),
#ifdef BRG_HAVE_VERBS_H
      cmocka_unit_test(real_attr_init),
      cmocka_unit_test(real_attr_rtr_infiniband),
      cmocka_unit_test(real_attr_rtr_roce),
      cmocka_unit_test(real_attr_rts),
      cmocka_unit_test(real_pick_gid),
      cmocka_unit_test(real_parse_hca),
      cmocka_unit_test(real_probe_no_device),
#endif
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
