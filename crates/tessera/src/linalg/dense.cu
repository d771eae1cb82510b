// dense.cu: the two products of a dense matrix for the LSMR solver (linalg/dense_operator.rs,
// DenseOperator): y = alpha A x + beta y and y = alpha A^T x + beta y, f32 or f64 storage,
// row- or column-major, accumulated in double.
//
// What. The host sees the matrix as stored: S, `lines` lines of `len` elements each, line i at
// S + i * ld (ld >= len). Row-major A (m x n) is S = A (lines = m, len = n); column-major A is
// S = A^T (lines = n, len = m). Two kernels cover the four products:
//   dense_gemv_lines: y[i] = alpha * (S[i, :] . x) + beta * y[i]       (S x)
//                     row-major A x, column-major A^T u
//   dense_gemv_cols : y[c] = alpha * sum_i S[i, c] x[i] + beta * y[c]  (S^T x)
//                     row-major A^T u, column-major A x
//   dense_gemv_finish: the fixed-order sum of dense_gemv_cols' split partials.
// With `square` set, x is not read and the kernels sum S[i, c]^2 instead (the column norms of
// A at construction: dense_gemv_cols for row-major, dense_gemv_lines for column-major), written
// as doubles to `partials` (unscaled; y untouched).
//
// Accumulation. Products and sums in double for both storage types (f32 elements and x are
// widened; the result is rounded once to Val), so an f32 product carries one rounding, as the
// f64-update LSMR kernels do. beta == 0 does not read y (BLAS).
//
// Work mapping.
//   dense_gemv_lines: one warp per line, kBlockThreads / 32 lines per CTA; lanes stride the
//     line (coalesced: 32 consecutive elements per step), then a warp butterfly. Fine for
//     lines of a few hundred elements and more; short lines leave lanes idle.
//   dense_gemv_cols: one thread per column, kBlockThreads consecutive columns per CTA
//     (blockIdx.x), so each step reads kBlockThreads consecutive elements of one line
//     (coalesced); blockIdx.y is one of `splits` contiguous ranges of lines. With splits == 1
//     the thread writes y itself; otherwise partials[split][c] (double) and dense_gemv_finish
//     adds them in split order (deterministic, no atomics).
// Shared memory: none (the warp reduction is in registers).
//
// Roofline. Bandwidth bound: each product reads the matrix once (lines * len * sizeof(Val)),
// plus x (broadcast from L1/L2) and y; splits add 2 * splits * len doubles of partials (small
// next to the matrix when lines / splits >> 16). Target: the device-to-device copy rate.
#include "tessera/common.cuh"
#include "tessera/reduce.cuh"

#ifndef TS_GENERATED_PREAMBLE
using Val = float;
constexpr int kBlockThreads = 256;
#endif

struct GemvParams {
  const Val* a;      // S: lines x len, line stride ld
  const Val* x;      // lines: len elements; cols: lines elements (unread when square)
  Val* y;            // lines: lines elements; cols: len elements (unwritten when square)
  double* partials;  // cols with splits > 1: [splits][len]; square: the sums of squares
  long long lines, len, ld;
  double alpha, beta;
  int splits;        // cols: gridDim.y
  int square;        // 1: sums of squares of S (column norms), x and y unused
};

namespace {

struct SumD {
  TS_DEVICE double operator()(double a, double b) const { return a + b; }
};

// alpha * acc + beta * y (y not read when beta == 0), rounded once.
TS_DEVICE Val blend(double alpha, double acc, double beta, const Val* y) {
  return (Val)(beta == 0.0 ? alpha * acc : alpha * acc + beta * (double)*y);
}

}  // namespace

extern "C" __global__ void __launch_bounds__(kBlockThreads) dense_gemv_lines(const __grid_constant__ GemvParams p) {
  constexpr int kWarps = kBlockThreads / 32;
  const long long line = (long long)blockIdx.x * kWarps + threadIdx.x / 32;
  if (line >= p.lines) return;  // warp-uniform
  const Val* row = p.a + line * p.ld;
  double acc = 0.0;
  for (long long j = ts::lane_id(); j < p.len; j += 32) {
    const double a = (double)row[j];
    acc += p.square ? a * a : a * (double)p.x[j];
  }
  acc = ts::warp_allreduce<32>(acc, SumD{});
  if (ts::lane_id() != 0) return;
  if (p.square) p.partials[line] = acc;
  else p.y[line] = blend(p.alpha, acc, p.beta, p.y + line);
}

extern "C" __global__ void __launch_bounds__(kBlockThreads) dense_gemv_cols(const __grid_constant__ GemvParams p) {
  const long long c = (long long)blockIdx.x * kBlockThreads + threadIdx.x;
  if (c >= p.len) return;
  const long long per = (p.lines + p.splits - 1) / p.splits;
  const long long begin = (long long)blockIdx.y * per;
  const long long end = begin + per < p.lines ? begin + per : p.lines;
  double acc = 0.0;
  for (long long i = begin; i < end; ++i) {
    const double a = (double)p.a[i * p.ld + c];
    acc += p.square ? a * a : a * (double)p.x[i];
  }
  if (p.square) p.partials[c] = acc;  // the host launches square with one split
  else if (p.splits == 1) p.y[c] = blend(p.alpha, acc, p.beta, p.y + c);
  else p.partials[(long long)blockIdx.y * p.len + c] = acc;
}

extern "C" __global__ void __launch_bounds__(kBlockThreads) dense_gemv_finish(const __grid_constant__ GemvParams p) {
  const long long c = (long long)blockIdx.x * kBlockThreads + threadIdx.x;
  if (c >= p.len) return;
  double acc = 0.0;
  for (int s = 0; s < p.splits; ++s) acc += p.partials[(long long)s * p.len + c];
  p.y[c] = blend(p.alpha, acc, p.beta, p.y + c);
}
