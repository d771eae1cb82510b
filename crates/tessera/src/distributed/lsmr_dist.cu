// lsmr_dist.cu: the vector kernels of distributed LSMR (distributed/lsmr.rs, the device backend
// of its host-driven loop). The host runs the scalar recurrences in f64 (linalg/lsmr.rs's
// Recurrence, the same code as the CPU reference) and, per iteration, launches:
//   dist_axpby     u = A_i v - alpha u           (local rows; then ||u_i||^2, summed over ranks)
//   dist_axpby     u *= 1 / beta
//   (A_i^T u_i, then one NCCL all-reduce of the n-vector into atu)
//   dist_axpby     v = atu - beta v              (then ||v||^2: v is the same on every rank)
//   dist_axpby     v *= 1 / alpha
//   dist_update_x  hbar = hbar * f_hbar + h; x += f_x * hbar; h = h * f_h + v  (then ||x||^2)
//   (the start: dist_axpby u = b_i, which measures ||b_i||^2, and u -= A_i x0)
//
// Each kernel writes one partial sum of squares (in double) per CTA to partials[blockIdx.x]:
// a fixed grid (host: min(ceil(len / kBlockThreads), kMaxPartials) CTAs, grid-stride), a fixed
// block tree, and the host adds the partials in order: bitwise reproducible, no atomics.
// Arithmetic in double, each stored element rounded once to Val; the squares are of the
// stored (rounded) values, as the host reference measures what it stores.
//
// Launch: kBlockThreads threads per CTA, gridDim.x CTAs as above, gridDim.y = 1. Shared memory:
// kBlockThreads / 32 doubles (block reduction). Bytes per element: axpby 3 Val (2 when a or b
// is 0), update_x 7 Val (read hbar, h, x, v; write hbar, x, h). Bandwidth bound.
//
// Invariants the Rust side upholds: every pointer addresses >= len elements (x may alias y in
// axpby; then a == 0 and x is not read); partials holds >= gridDim.x doubles; len < 2^62.
#include "tessera/common.cuh"
#include "tessera/reduce.cuh"

#ifndef TS_GENERATED_PREAMBLE
using Val = float;
constexpr int kBlockThreads = 256;
#endif

// Field order = the Rust mirror (DistParams in distributed/lsmr.rs), 80 bytes.
struct DistParams {
  const Val* x;      // axpby: x (not read when a == 0); update_x: v
  Val* y;            // axpby: y (not read when b == 0); update_x: x
  Val* h;            // update_x
  Val* hbar;         // update_x
  double* partials;  // [gridDim.x]
  double a;          // axpby: y = a x + b y; update_x: the hbar factor
  double b;          // update_x: the x step
  double c;          // update_x: the h factor
  long long len;
  long long pad;
};

namespace {

struct SumD {
  TS_DEVICE double operator()(double a, double b) const { return a + b; }
};

// Thread 0 writes the CTA's sum of v to partials[blockIdx.x].
TS_DEVICE void write_partial(double v, double* partials, double* smem) {
  v = ts::block_allreduce<kBlockThreads>(v, SumD{}, 0.0, smem);
  if (threadIdx.x == 0) partials[blockIdx.x] = v;
}

}  // namespace

// y = a x + b y (a term whose factor is 0 is not read: y may be unset when b == 0, x may
// alias y when a == 0); partials of the new y^2.
extern "C" __global__ void __launch_bounds__(kBlockThreads) dist_axpby(const __grid_constant__ DistParams p) {
  __shared__ double smem[kBlockThreads / 32];
  double s = 0.0;
  const long long stride = (long long)gridDim.x * kBlockThreads;
  for (long long i = (long long)blockIdx.x * kBlockThreads + threadIdx.x; i < p.len; i += stride) {
    double r = (p.b != 0.0) ? (double)p.y[i] * p.b : 0.0;
    if (p.a != 0.0) r += p.a * (double)p.x[i];
    const Val y = (Val)r;
    p.y[i] = y;
    s += (double)y * (double)y;
  }
  write_partial(s, p.partials, smem);
}

// hbar = hbar * a + h; x = x + b * hbar (the new, stored hbar); h = h * c + v; partials of the
// new x^2. Each element is read and written by one thread.
extern "C" __global__ void __launch_bounds__(kBlockThreads) dist_update_x(const __grid_constant__ DistParams p) {
  __shared__ double smem[kBlockThreads / 32];
  double s = 0.0;
  const long long stride = (long long)gridDim.x * kBlockThreads;
  for (long long i = (long long)blockIdx.x * kBlockThreads + threadIdx.x; i < p.len; i += stride) {
    const Val hbar = (Val)((double)p.hbar[i] * p.a + (double)p.h[i]);
    p.hbar[i] = hbar;
    const Val x = (Val)((double)p.y[i] + p.b * (double)hbar);
    p.y[i] = x;
    p.h[i] = (Val)((double)p.h[i] * p.c + (double)p.x[i]);
    s += (double)x * (double)x;
  }
  write_partial(s, p.partials, smem);
}
