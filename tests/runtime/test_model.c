/* The cost model (runtime/plan/model.c): BRIGADE_ALGO=auto's choice is the
 * fastest algorithm the model times, on a grid of shapes and sizes; and
 * the formulas' known cases. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "internal.h"
#include "model.h"

/* A shape of the tests: H hosts of M ranks, one NIC and ring, the
 * default small path (4 KiB) and slice (128 KiB); cores unknown. */
static brg__model_shape shape_of(int hosts, int local) {
  return (brg__model_shape){.hosts = hosts,
                            .local = local,
                            .nics = 1,
                            .rings = 1,
                            .small_bytes = 4096,
                            .slice_bytes = 131072};
}

static void test_auto_is_fastest(void **state) {
  (void)state;
  const brg__model_links *ln = &brg__model_default_links;
  int hosts[] = {1, 2, 3, 4, 8, 16, 64, 128, 512};
  int locals[] = {1, 2, 3, 4, 8};
  size_t sizes[] = {0, 8, 4096, 4100, 65536, 1 << 20, 12 << 20, 64 << 20};
  int checked = 0, seen[5] = {0};
  for (size_t h = 0; h < sizeof hosts / sizeof *hosts; h++)
    for (size_t l = 0; l < sizeof locals / sizeof *locals; l++)
      for (int rings = 1; rings <= 4; rings *= 2)
        for (int no_hier = 0; no_hier < 3; no_hier++)
          for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
            /* no_hier 2: hosts of locals[l] - 1 to locals[l] ranks */
            brg__model_shape sh = {.hosts = hosts[h],
                                   .local = locals[l],
                                   .nics = rings,
                                   .rings = rings,
                                   .small_bytes = 4096,
                                   .slice_bytes = 128 * 1024,
                                   .no_hier = no_hier == 1};
            if (no_hier == 2 && (locals[l] < 2 || hosts[h] < 2)) continue;
            if (no_hier == 2) {
              sh.local_min = locals[l] - 1;
              sh.local_max = locals[l];
            }
            if (sh.hosts * sh.local < 2) continue;
            /* the candidates: the flat engine as it runs the size, hier, tree, rhd */
            int flat = sizes[s] && sizes[s] <= 4096                   ? BRG__PLAN_SMALL
                       : rings > 1 && sizes[s] >= rings * 128 * 1024u ? BRG__PLAN_RINGS
                                                                      : BRG__PLAN_RING;
            int cand[4] = {flat, BRG__PLAN_HIER, BRG__PLAN_TREE, BRG__PLAN_RHD};
            int algos[4] = {BRG__ALGO_RING, BRG__ALGO_HIER, BRG__ALGO_TREE, BRG__ALGO_RHD};
            int want = -1;
            double best = 0;
            for (int i = 0; i < 4; i++) {
              double t = brg__model_time(cand[i], &sh, ln, sizes[s]);
              if (i == 1 && (sh.hosts < 2 || sh.local < 2 || no_hier == 1)) assert_true(t < 0);
              if (i == 1 && no_hier == 2) assert_true(t > 0);
              if (t >= 0 && (want < 0 || t < best)) {
                best = t;
                want = i;
              }
            }
            int plan, got = brg__model_auto(&sh, ln, sizes[s], &plan);
            assert_int_equal(brg__model_flat_plan(&sh, sizes[s]), flat);
            assert_int_equal(got, algos[want]);
            assert_int_equal(plan, cand[want]);
            seen[got]++;
            checked++;
          }
  assert_true(checked > 2000);
  /* every algorithm wins somewhere on the grid */
  for (int a = BRG__ALGO_RING; a <= BRG__ALGO_RHD; a++) assert_true(seen[a] > 0);
}

static void test_known_cases(void **state) {
  (void)state;
  brg__model_links ln = brg__model_default_links;
  brg__model_shape two = {.hosts = 2, .local = 1, .nics = 1, .rings = 1, .slice_bytes = 131072};
  /* N = 2, one kind of link: 2 alpha + S beta */
  double t = brg__model_time(BRG__PLAN_RING, &two, &ln, 1000000);
  assert_true(t > 0.999 * (2 * ln.net_alpha + 1e6 * ln.net_beta) &&
              t < 1.001 * (2 * ln.net_alpha + 1e6 * ln.net_beta));
  /* 8 bytes at 1,024 ranks (128 hosts x 8): the fastest within 25 network alphas */
  brg__model_shape big = shape_of(128, 8);
  int plan;
  brg__model_auto(&big, &ln, 8, &plan);
  assert_true(plan == BRG__PLAN_TREE || plan == BRG__PLAN_RHD);
  assert_true(brg__model_time(plan, &big, &ln, 8) <= 25 * ln.net_alpha);
  /* the ring crosses all 128 host boundaries twice */
  assert_true(brg__model_time(BRG__PLAN_RING, &big, &ln, 8) > 2 * 128 * ln.net_alpha);
  /* a large buffer on a few hosts stays with the bandwidth-optimal ones */
  brg__model_shape small = shape_of(4, 2);
  int a = brg__model_auto(&small, &ln, 64 << 20, NULL);
  assert_true(a == BRG__ALGO_RING || a == BRG__ALGO_HIER);
  /* the plans the runtime does not run there */
  assert_true(brg__model_time(BRG__PLAN_RINGS, &small, &ln, 64 << 20) < 0);
  assert_true(brg__model_time(BRG__PLAN_SMALL, &small, &ln, 8192) < 0);
  assert_string_equal(brg__plan_name(BRG__PLAN_RHD), "rhd");
}

/* Hier on hosts that differ in rank count: C (the fewest) rings across
 * hosts, the other ranks reduced into them first and given the result
 * last. */
static void test_uneven_hier(void **state) {
  (void)state;
  brg__model_links ln = brg__model_default_links;
  double S = 1 << 20;
  /* 3 + 1: one ring across the hosts, carrying all of S; a fold of 3 */
  brg__model_shape a = shape_of(2, 2);
  a.local_min = 1;
  a.local_max = 3;
  double want = 2 * (2 * ln.shm_alpha + S * ln.shm_beta) + 2 * ln.net_alpha + S * ln.net_beta;
  double t = brg__model_time(BRG__PLAN_HIER, &a, &ln, (size_t)S);
  assert_true(t > 0.999 * want && t < 1.001 * want);
  /* 3 + 2: two rings across the hosts, a fold of 2 on the first */
  a.local = 3;
  a.local_min = 2;
  want = 2 * (ln.shm_alpha + S * ln.shm_beta) + 2 * (ln.shm_alpha + S / 2 * ln.shm_beta) +
         2 * ln.net_alpha + S / 2 * ln.net_beta * 2;
  t = brg__model_time(BRG__PLAN_HIER, &a, &ln, (size_t)S);
  assert_true(t > 0.999 * want && t < 1.001 * want);
  /* one rank per host still has no hier */
  brg__model_shape one = {.hosts = 4, .local = 1, .nics = 1, .rings = 1, .slice_bytes = 131072};
  assert_true(brg__model_time(BRG__PLAN_HIER, &one, &ln, (size_t)S) < 0);
}

/* Kernel mode's shape: channels that fill each link (checked against the
 * link's figures here), slots within the region budget, and for a given
 * buffer no more than it can use. */
static void test_device_shape(void **state) {
  (void)state;
  static const double link_rate[] = {450e9 * 0.85, 55e9 * 0.8}, chan[] = {25e9, 12e9},
                      post[] = {2.5e-6, 3.5e-6};
  size_t sizes[] = {1, 8, 4096, 65536, 1 << 20, 16 << 20, 256u << 20, (size_t)4 << 30};
  for (int link = BRG__DLINK_NVLINK; link <= BRG__DLINK_PCIE; link++)
    for (int n = 2; n <= 16; n *= 2)
      for (int nslots = 2; nslots <= 16; nslots *= 2) {
        brg__device_shape full = brg__model_device_shape(link, n, nslots, 0);
        size_t slot = full.slot_bytes;
        assert_true(slot >= 65536 && slot <= (1 << 20) && (slot & (slot - 1)) == 0);
        assert_true((size_t)full.channels * (size_t)nslots * slot <= ((size_t)128 << 20));
        /* enough channels, and one fewer would not do */
        double per = (double)slot / ((double)slot / chan[link] + post[link]);
        assert_true(full.channels * per >= link_rate[link] || full.channels == 32);
        assert_true((full.channels - 1) * per < link_rate[link]);
        /* the largest slot that fits: twice it would not */
        if (slot < (1 << 20)) {
          double per2 = (double)(2 * slot) / ((double)(2 * slot) / chan[link] + post[link]);
          int ch2 = (int)ceil(link_rate[link] / per2);
          assert_true((size_t)ch2 * (size_t)nslots * 2 * slot > ((size_t)128 << 20));
        }
        assert_non_null(strstr(full.why, brg__dlink_name(link)));
        int last = 0;
        for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
          brg__device_shape b = brg__model_device_shape(link, n, nslots, sizes[s]);
          size_t step = sizes[s] / (size_t)n;
          assert_true(b.channels >= 1 && b.channels <= full.channels && b.channels >= last);
          assert_true(b.channels == 1 || (size_t)b.channels * 8192 <= step);
          assert_true(b.slot_bytes >= 65536 && b.slot_bytes <= slot);
          size_t share = (step + (size_t)b.channels - 1) / (size_t)b.channels;
          assert_true(b.slot_bytes == 65536 || b.slot_bytes / 2 < share);
          assert_true(share <= b.slot_bytes || b.slot_bytes == slot);
          /* a call's shape at issue time, within the region's: the model's */
          int cch = full.channels;
          size_t cslot = full.slot_bytes;
          brg__model_device_call(n, sizes[s], &cch, &cslot);
          assert_int_equal(cch, b.channels);
          assert_int_equal(cslot, b.slot_bytes);
          /* ...and never more than a smaller region holds */
          cch = 3;
          cslot = 65536;
          brg__model_device_call(n, sizes[s], &cch, &cslot);
          assert_true(cch >= 1 && cch <= 3 && cslot == 65536);
          last = b.channels;
        }
      }
  /* NVLink takes more channels than PCIe; a host link and one rank, one */
  assert_true(brg__model_device_shape(BRG__DLINK_NVLINK, 8, 8, 0).channels >
              brg__model_device_shape(BRG__DLINK_PCIE, 8, 8, 0).channels);
  brg__device_shape h = brg__model_device_shape(BRG__DLINK_HOST, 8, 8, 0);
  assert_int_equal(h.channels, 1);
  assert_int_equal(h.slot_bytes, 0);
  h = brg__model_device_shape(BRG__DLINK_NVLINK, 1, 8, 1 << 20);
  assert_int_equal(h.channels, 1);
  /* H200 NVLink, 8 slots: what bench/model prints */
  brg__device_shape nv = brg__model_device_shape(BRG__DLINK_NVLINK, 8, 8, 0);
  assert_int_equal(nv.channels, 18);
  assert_int_equal(nv.slot_bytes, 512 * 1024);
}

/* The links within a host, and a host's cores: one host of N ranks on a
 * 2-core machine, the choices bench/auto_check.py measured as within 1.3x
 * of the fastest there (docs/multihost.md): over shm the ring, rhd at 8 B
 * from 32 ranks and the tree at 64 KiB on 64; over tcp rhd at 8 B, and at
 * 64 KiB rhd on 4 ranks, the tree from 8. */
static void test_links_within_host(void **state) {
  (void)state;
  const brg__model_links *ln = &brg__model_default_links;
  static const struct {
    int n, tcp, small, large; /* the choice at 8 B and at 64 KiB */
  } want[] = {
      {4, 0, BRG__ALGO_RING, BRG__ALGO_RING},  {8, 0, BRG__ALGO_RING, BRG__ALGO_RING},
      {16, 0, BRG__ALGO_RING, BRG__ALGO_RING}, {32, 0, BRG__ALGO_RHD, BRG__ALGO_RING},
      {64, 0, BRG__ALGO_RHD, BRG__ALGO_TREE},  {4, 1, BRG__ALGO_RHD, BRG__ALGO_RHD},
      {8, 1, BRG__ALGO_RHD, BRG__ALGO_TREE},   {16, 1, BRG__ALGO_RHD, BRG__ALGO_TREE},
      {32, 1, BRG__ALGO_RHD, BRG__ALGO_TREE},  {64, 1, BRG__ALGO_RHD, BRG__ALGO_TREE},
  };
  for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
    brg__model_shape sh = shape_of(1, want[i].n);
    sh.cores = 2;
    sh.local_tcp = want[i].tcp;
    assert_int_equal(brg__model_auto(&sh, ln, 8, NULL), want[i].small);
    assert_int_equal(brg__model_auto(&sh, ln, 65536, NULL), want[i].large);
    /* tcp's hops cost more than shm's, the ring's and the point-to-point ones */
    brg__model_shape other = sh;
    other.local_tcp = !sh.local_tcp;
    const brg__model_shape *t = sh.local_tcp ? &sh : &other, *m = sh.local_tcp ? &other : &sh;
    assert_true(brg__model_time(BRG__PLAN_RING, t, ln, 65536) >
                brg__model_time(BRG__PLAN_RING, m, ln, 65536));
    assert_true(brg__model_time(BRG__PLAN_TREE, t, ln, 8) >
                brg__model_time(BRG__PLAN_TREE, m, ln, 8));
    assert_true(brg__model_time(BRG__PLAN_RHD, t, ln, 65536) >
                brg__model_time(BRG__PLAN_RHD, m, ln, 65536));
  }
  brg__model_shape big = shape_of(1, 64);
  big.cores = 2;
  /* cores enough (or unknown): no queueing */
  brg__model_shape idle = big;
  idle.cores = 64;
  double t_idle = brg__model_time(BRG__PLAN_RHD, &idle, ln, 65536);
  idle.cores = 0;
  assert_true(brg__model_time(BRG__PLAN_RHD, &idle, ln, 65536) == t_idle);
  assert_true(brg__model_time(BRG__PLAN_RHD, &big, ln, 65536) > 10 * t_idle);
  /* the point-to-point hop within a host is the transport's: a file whose
   * tcp p2p is slow moves tcp's choice at 8 B and leaves shm's alone */
  brg__model_links slow = *ln;
  slow.p2p_tcp_alpha = 1e-3;
  slow.xchg_tcp_beta = 1e-7;
  brg__model_shape t4 = shape_of(1, 8);
  t4.cores = 2;
  t4.local_tcp = 1;
  assert_int_equal(brg__model_auto(&t4, &slow, 8, NULL), BRG__ALGO_RING);
  t4.local_tcp = 0;
  assert_true(brg__model_time(BRG__PLAN_RHD, &t4, &slow, 8) ==
              brg__model_time(BRG__PLAN_RHD, &t4, ln, 8));
}

/* Model files: what brg__model_write writes, brg__model_read reads back;
 * a name left out keeps the value it had; bad lines are named. */
static void test_model_file(void **state) {
  (void)state;
  char path[] = "/tmp/brg-model-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  brg__model_links a = brg__model_default_links, b = brg__model_default_links;
  a.shm_alpha = 1.5e-6;
  a.xchg_beta = 3.25e-9;
  brg__errbuf err = {0};
  assert_int_equal(brg__model_write(path, &a, "# a comment\n", &err), BRG_SUCCESS);
  memset(&b, 0, sizeof b);
  assert_int_equal(brg__model_read(path, &b, &err), BRG_SUCCESS);
  for (int i = 0; i < BRG__MODEL_FIELDS; i++)
    assert_true(fabs(*brg__model_field(&b, i) / *brg__model_field(&a, i) - 1) < 1e-5);
  FILE *f = fopen(path, "w");
  fputs("# only one\nshm_beta 2e-10 # with a comment\n", f);
  fclose(f);
  b = brg__model_default_links;
  assert_int_equal(brg__model_read(path, &b, &err), BRG_SUCCESS);
  assert_true(b.shm_beta == 2e-10 && b.shm_alpha == brg__model_default_links.shm_alpha);
  static const char *const bad[] = {"shm_alpha\n",           "shm_alpha x\n",
                                    "shm_gamma 1e-6\n",      "shm_alpha -1e-6\n",
                                    "shm_alpha 1e-6 2e-6\n", "net_beta 5\n"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    f = fopen(path, "w");
    fprintf(f, "net_alpha 1e-5\n%s", bad[i]);
    fclose(f);
    memset(&err, 0, sizeof err);
    assert_int_equal(brg__model_read(path, &b, &err), BRG_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "line 2"));
    assert_non_null(strstr(err.msg, path));
  }
  unlink(path);
  assert_int_equal(brg__model_read(path, &b, &err), BRG_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(err.msg, "cannot open"));
}

/* Kernel mode's times on cases worked by hand from the NVLink figures
 * (data's share of the link 0.85 x 450 = 382.5 GB/s), and the LL limits. */
static void test_gpu_times(void **state) {
  (void)state;
  brg__gpu_costs c = brg__model_gpu_costs(BRG__DLINK_NVLINK);
  double link = 0.85 * 450e9;
  /* one-shot LL, 8 GPUs, 8 B: launch + LL hop, 2 x 7 x 8 bytes over the link */
  assert_true(fabs(brg__model_gpu_oneshot_ll(&c, 8, 8) - (4.8e-6 + 112 / link)) < 1e-15);
  /* without LL: launch + hop + release, 7 x 8 bytes */
  assert_true(fabs(brg__model_gpu_oneshot_plain(&c, 8, 8) - (6.3e-6 + 56 / link)) < 1e-15);
  /* the ring, 2 GPUs, 1 MiB, one channel of 1 MiB slots posting at 2.5 us:
   * a channel streams 1 MiB in 1 MiB / 25 GB/s + 2.5 us */
  double S = 1 << 20, per = S / (S / 25e9 + 2.5e-6);
  assert_true(fabs(brg__model_gpu_ring(&c, S, 2, 1, S, 2.5, 1.5, 0) - (4e-6 + 3e-6 + S / per)) <
              1e-12);
  /* LL halves the rate: the same ring in LL lines takes twice the bytes' time */
  assert_true(fabs(brg__model_gpu_ring(&c, S, 2, 1, S, 2.5, 1.5, 1) - (4e-6 + 3e-6 + 2 * S / per)) <
              1e-12);
  /* the two-shot path's blocks: one per 8 KiB, 1 to the most */
  assert_int_equal(brg__model_direct_blocks(100, 18), 1);
  assert_int_equal(brg__model_direct_blocks(64 << 10, 18), 8);
  assert_int_equal(brg__model_direct_blocks(1 << 20, 18), 18);
  /* LL pays up to 1500 ns x 382 GB/s / (N-1), down to a power of two */
  assert_int_equal(brg__model_ll_bytes(1), 0);
  assert_int_equal(brg__model_ll_bytes(2), 512 << 10); /* 573000 */
  assert_int_equal(brg__model_ll_bytes(9), 64 << 10);  /* 71625 */
  assert_int_equal(brg__model_ll_bytes(10), 32 << 10); /* 63666 */
  assert_int_equal(brg__model_ll_bytes(71), 4 << 10);  /* 8185 */
  assert_int_equal(brg__model_ll_bytes(4096), 0);      /* 139 < 256 */
  /* the ring's LL form pays while a step's B/N bytes are under 573000 */
  assert_int_equal(brg__model_ring_ll_bytes(1), 0);
  assert_int_equal(brg__model_ring_ll_bytes(4), 2 << 20); /* 2292000 */
  assert_int_equal(brg__model_ring_ll_bytes(8), 4 << 20); /* 4584000 */
  /* and the doubling search of the two formulas agrees at 8 GPUs */
  assert_int_equal(brg__model_ll_crossover(&c, 8), 64 << 10);
}

/* BRIGADE_ALGO=auto for GPU buffers (brg__model_auto_staged): the ring on
 * one host; across hosts the staged tree or rhd only where its time and
 * two copies' beat the ring, on a grid; the copies decide somewhere (the
 * tree or rhd faster than the ring without them, the ring with them). */
/* rhd's recursive doubling alone: always at 2 ranks (one exchange
 * against two); elsewhere up to the crossover the model reports, where
 * rhd's time as lat.c runs it (rhd_doubling) is below the halving's, and
 * above it the halving's. Auto compares the halving's. */
static void test_rhd_doubling(void **state) {
  (void)state;
  const brg__model_links *ln = &brg__model_default_links;
  static const int shapes[][3] = {{1, 2, 0},  {1, 4, 0}, {1, 8, 1},  {1, 16, 0},
                                  {1, 64, 1}, {4, 2, 0}, {16, 1, 0}, {3, 3, 0}};
  for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
    brg__model_shape sh = shape_of(shapes[i][0], shapes[i][1]);
    sh.cores = 2;
    sh.local_tcp = shapes[i][2];
    brg__model_shape halving = sh;
    sh.rhd_doubling = 1;
    size_t x = brg__model_rhd_doubling_bytes(&sh, ln);
    if (sh.hosts * sh.local == 2) assert_int_equal(x, (size_t)1 << 30);
    assert_true(x >= 8); /* a few bytes: half the rounds always win */
    double below = brg__model_time(BRG__PLAN_RHD, &sh, ln, x / 2);
    assert_true(below < brg__model_time(BRG__PLAN_RHD, &halving, ln, x / 2));
    if (x < ((size_t)1 << 30)) {
      assert_true(x < ((size_t)64 << 20)); /* a large call halves */
      double above = brg__model_time(BRG__PLAN_RHD, &sh, ln, 2 * x + 64);
      assert_true(above == brg__model_time(BRG__PLAN_RHD, &halving, ln, 2 * x + 64));
    }
    assert_int_equal(brg__model_auto(&sh, ln, 8, NULL), brg__model_auto(&halving, ln, 8, NULL));
  }
}

static void test_auto_staged(void **state) {
  (void)state;
  const brg__model_links *ln = &brg__model_default_links;
  /* the copies: two of 10 us, PCIe at 20 GB/s (20 MB: 1 ms each) */
  assert_true(fabs(brg__model_stage_time(0) - 20e-6) < 1e-9);
  assert_true(fabs(brg__model_stage_time(20000000) - 2.02e-3) < 1e-9);
  int hosts[] = {1, 2, 3, 4, 8, 16, 64};
  int locals[] = {1, 2, 4, 8};
  size_t sizes[] = {0, 8, 4096, 65536, 1 << 20, 64 << 20};
  int checked = 0, copies_decide = 0, seen[5] = {0};
  for (size_t h = 0; h < sizeof hosts / sizeof *hosts; h++)
    for (size_t l = 0; l < sizeof locals / sizeof *locals; l++)
      for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        brg__model_shape sh = shape_of(hosts[h], locals[l]);
        if (sh.hosts * sh.local < 2) continue;
        double t[3];
        int got = brg__model_auto_staged(&sh, ln, sizes[s], t);
        double ring = brg__model_time(brg__model_flat_plan(&sh, sizes[s]), &sh, ln, sizes[s]);
        double stage = brg__model_stage_time(sizes[s]);
        double tree = brg__model_time(BRG__PLAN_TREE, &sh, ln, sizes[s]) + stage;
        double rhd = brg__model_time(BRG__PLAN_RHD, &sh, ln, sizes[s]) + stage;
        assert_true(fabs(t[0] - ring) <= 1e-12 && fabs(t[1] - tree) <= 1e-12 &&
                    fabs(t[2] - rhd) <= 1e-12);
        int want = BRG__ALGO_RING;
        if (sh.hosts > 1 && tree < ring && tree <= rhd) want = BRG__ALGO_TREE;
        if (sh.hosts > 1 && rhd < ring && rhd < tree) want = BRG__ALGO_RHD;
        assert_int_equal(got, want);
        if (sh.hosts > 1 && got == BRG__ALGO_RING && fmin(tree, rhd) - stage < ring)
          copies_decide++;
        seen[got]++;
        checked++;
      }
  assert_true(checked > 100);
  assert_true(copies_decide > 0);
  assert_true(seen[BRG__ALGO_RING] > 0 && seen[BRG__ALGO_TREE] + seen[BRG__ALGO_RHD] > 0);
  /* on the default links: 16 hosts x 1, a few bytes staged (rhd 720 us
   * and 20 of copies against the ring's small path, 900), 64 MiB on the
   * ring; 2 hosts x 2, the ring (its small path 125 us, rhd 240 and the
   * copies); one host of 8: always the ring */
  brg__model_shape wide = shape_of(16, 1);
  double t[3];
  int a = brg__model_auto_staged(&wide, ln, 8, t);
  assert_true(a == BRG__ALGO_TREE || a == BRG__ALGO_RHD);
  assert_int_equal(brg__model_auto_staged(&wide, ln, 64 << 20, t), BRG__ALGO_RING);
  brg__model_shape two = shape_of(2, 2);
  assert_int_equal(brg__model_auto_staged(&two, ln, 8, t), BRG__ALGO_RING);
  brg__model_shape one = shape_of(1, 8);
  for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
    assert_int_equal(brg__model_auto_staged(&one, ln, sizes[s], t), BRG__ALGO_RING);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_links_within_host), cmocka_unit_test(test_model_file),
      cmocka_unit_test(test_auto_is_fastest),   cmocka_unit_test(test_known_cases),
      cmocka_unit_test(test_uneven_hier),       cmocka_unit_test(test_device_shape),
      cmocka_unit_test(test_gpu_times),         cmocka_unit_test(test_auto_staged),
      cmocka_unit_test(test_rhd_doubling),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
