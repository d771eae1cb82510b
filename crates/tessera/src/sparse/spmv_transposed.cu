// spmv_transposed.cu: y = alpha * A^T x + beta * y for a CSR matrix A (rows x cols) without a
// transposed copy: x has rows elements, y has cols. For matrices whose second (transposed) copy
// does not fit; NOT deterministic (the sums into y are atomic, in arrival order), unlike
// spmv_csr.cu on an explicit CSR of A^T, which is also faster.
//
// Layout. As spmv_csr.cu; Val is float or double (atomicAdd on the value type).
//
// Work mapping. Two launches on one stream:
//   spmv_t_scale: y *= beta (y = 0 when beta == 0, not read), one thread per element,
//     grid-stride.
//   spmv_t_scatter: a group of kLanes lanes per row r (kBlockThreads / kLanes rows per CTA):
//     s = alpha * x[r], then lane l adds s * values[k] into y[indices[k]] for k = begin + l,
//     begin + l + kLanes, ... (atomicAdd; consecutive lanes touch consecutive nonzeros).
// No shared memory.
//
// Roofline. A once (values, indices, offsets), x once, y read-modify-written by atomics in L2
// (one per nonzero).
#include "tessera/common.cuh"

#ifndef TS_GENERATED_PREAMBLE
using Val = float;
using Idx = int;
constexpr int kLanes = 8;
constexpr int kBlockThreads = 256;
#endif

struct SpmvTParams {
  const Idx* offsets;
  const Idx* indices;
  const Val* values;
  const Val* x;  // [rows]
  Val* y;        // [cols]
  long long rows;
  long long cols;
  double alpha;
  double beta;
};

extern "C" __global__ void __launch_bounds__(kBlockThreads) spmv_t_scale(const __grid_constant__ SpmvTParams p) {
  const long long stride = (long long)gridDim.x * kBlockThreads;
  for (long long i = (long long)blockIdx.x * kBlockThreads + threadIdx.x; i < p.cols; i += stride) {
    p.y[i] = p.beta == 0.0 ? (Val)0 : (Val)(p.beta * (double)p.y[i]);
  }
}

extern "C" __global__ void __launch_bounds__(kBlockThreads) spmv_t_scatter(const __grid_constant__ SpmvTParams p) {
  constexpr int kRowsPerCta = kBlockThreads / kLanes;
  const long long row = (long long)blockIdx.x * kRowsPerCta + threadIdx.x / kLanes;
  const int lane = threadIdx.x % kLanes;
  if (row >= p.rows) return;
  const Val s = (Val)(p.alpha * (double)p.x[row]);
  const long long end = (long long)p.offsets[row + 1];
  for (long long k = (long long)p.offsets[row] + lane; k < end; k += kLanes) {
    atomicAdd(p.y + p.indices[k], s * p.values[k]);
  }
}
