/* test_plan's kernel half: kernel mode's walk (ring_kernel.cuh, brg_rk::walk)
 * compiled for the CPU, its steps recorded instead of run. One thread per
 * block is enough: the walk is the same in every thread. */
#include "ring_kernel.cuh"

#include "plan_record.h"

static unsigned cur_block;
unsigned brg_simt_emu_tid() {
  return 0;
}
unsigned brg_simt_emu_nthreads() {
  return 1;
}
unsigned brg_simt_emu_block() {
  return cur_block;
}
void brg_simt_emu_sync() {}
void brg_simt_emu_pause() {}
void brg_simt_emu_published() {}

namespace {
/* The executor: what the channel's prim would run, written down. */
struct recorder {
  int step = 0;
  size_t at = 0; /* the slice's first element (the kernel's slot shift) */
  const float *send;
  float *recv;
  plan_rec *out;
  size_t n = 0, cap;
  bool prim(brg__prim p, const float *in, float *o, size_t m) {
    if (n < cap) {
      plan_rec &r = out[n];
      r.prim = (int)p;
      r.in = in ? (long)(in - send) : -1;
      r.out = o ? (long)(o - recv) : -1;
      r.count = m;
      r.step = step;
    }
    n++;
    return true;
  }
};
} // namespace

extern "C" size_t plan_kernel_walk(const brg__rk_args *a, int channel, size_t slot_elems,
                                   plan_rec *out, size_t cap) {
  recorder x;
  x.send = static_cast<const float *>(a->sendbuf);
  x.recv = static_cast<float *>(a->recvbuf);
  x.out = out;
  x.cap = cap;
  cur_block = (unsigned)channel;
  brg_rk::walk<float>(*a, slot_elems, x);
  return x.n;
}
