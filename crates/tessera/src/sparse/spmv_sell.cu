// spmv_sell.cu: y = alpha * A x + beta * y for A in SELL-C-sigma (sparse/sell.rs builds it),
// deterministic.
//
// What. The rows, sorted by length (longest first) within windows of sigma rows, are cut into
// slices of kSliceRows (C = 32) consecutive sorted rows; a slice stores its rows padded to its
// longest, column-major (entry j of the slice's row l at slice_offsets[s] + j * C + l), so the
// 32 lanes of a warp read 32 consecutive indices and values at every step. Padding entries have
// value 0 and column 0 (read, multiplied by zero: no branch). One thread sums its row in stored
// order: bitwise reproducible. beta == 0 does not read y. Acc is double for double values,
// else float.
//
// Layout. slice_offsets[slices + 1] (Idx), slice_width[slices] (int), indices and values
// [slice_offsets[slices]], row_of[rows] (Idx: the original row of each sorted position);
// x[cols], y[rows].
//
// Work mapping. One thread per sorted row, a warp per slice, kBlockThreads / 32 slices per CTA.
// No shared memory.
//
// Roofline. Memory bound: each stored entry (padding included: the padding ratio the plan
// reports) moves sizeof(Val) + sizeof(Idx) bytes, coalesced, and gathers one x element; y
// once per row through row_of.
#include "tessera/dtype.cuh"

#ifndef TS_GENERATED_PREAMBLE
using Val = float;
using Idx = int;
constexpr int kBlockThreads = 256;
#endif

constexpr int kSliceRows = 32;
using Acc = ts::conditional_t<ts::is_same_v<Val, double>, double, float>;

struct SellParams {
  const Idx* slice_offsets;
  const int* slice_width;
  const Idx* indices;
  const Val* values;
  const Idx* row_of;
  const Val* x;
  Val* y;
  long long rows;
  double alpha;
  double beta;
};
static_assert(sizeof(SellParams) == 80, "SellParams and its Rust mirror (sell.rs) differ");

extern "C" __global__ void __launch_bounds__(kBlockThreads) spmv_sell(const __grid_constant__ SellParams p) {
  const long long sorted = (long long)blockIdx.x * kBlockThreads + threadIdx.x;
  if (sorted >= p.rows) return;
  const long long slice = sorted / kSliceRows;
  const int lane = (int)(sorted % kSliceRows);
  const int width = p.slice_width[slice];
  const long long base = (long long)p.slice_offsets[slice] + lane;
  Acc sum = 0;
  for (int j = 0; j < width; ++j) {
    const long long at = base + (long long)j * kSliceRows;
    sum += ts::convert<Acc>(p.values[at]) * ts::convert<Acc>(p.x[p.indices[at]]);
  }
  const long long row = (long long)p.row_of[sorted];
  Acc out = ts::convert<Acc>(p.alpha) * sum;
  if (p.beta != 0.0) out += ts::convert<Acc>(p.beta) * ts::convert<Acc>(p.y[row]);
  p.y[row] = ts::convert<Val>(out);
}
