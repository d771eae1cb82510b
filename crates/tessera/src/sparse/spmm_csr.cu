// spmm_csr.cu: C = alpha * A B + beta * C for a CSR matrix A (rows x cols) and dense B (cols x n),
// C (rows x n), deterministic (every output summed in one fixed order).
//
// Layout. A as in spmv_csr.cu (offsets, indices of type Idx, values of type Val). B and C share
// one layout: row-major (element (r, j) at r * ld + j) or column-major (at r + j * ld), with
// leading dimensions ldb, ldc. Val is also the type of B and C; products and sums in Acc
// (double for double, else float). beta == 0 means C is not read.
//
// Work mapping (kColMajor chooses):
//   row-major: a group of kLanes lanes (a power of two, kLanes | 32) per row and column tile of
//     kLanes * kVec columns; lane l owns columns j0 + l * kVec .. + kVec (consecutive lanes read
//     consecutive B elements of one B row). The group walks the row's nonzeros one at a time,
//     every lane reading the same index and value (one L1 request serves the group) and adding
//     value * B[index, its columns]. CTA = kBlockThreads lanes = kBlockThreads / kLanes
//     (row, tile) pairs, ordered row-major over (row, tile);
//     grid = ceil(rows * tiles / pairs per CTA).
//   column-major: a group of kLanes lanes per row and pass of kCols columns: lane l takes
//     nonzeros begin + l, begin + l + kLanes, ... as SpMV does, gathering B[index, j] for each of
//     the pass's kCols columns (column-major B keeps each column contiguous), then the group
//     reduces each column's partial sums with shuffles; lane c < kCols writes column j0 + c.
//     grid over (row, pass) pairs like the row-major mapping.
// No shared memory.
//
// Roofline. A is read once per column tile (row-major) or pass (column-major); B rows are
// gathered per nonzero (from L2 when B fits); C written once.
#include "tessera/dtype.cuh"

#ifndef TS_GENERATED_PREAMBLE
using Val = float;
using Idx = int;
constexpr int kLanes = 8;
constexpr int kVec = 4;
constexpr int kCols = 4;
constexpr bool kColMajor = false;
constexpr int kBlockThreads = 256;
#endif

using Acc = ts::conditional_t<ts::is_same_v<Val, double>, double, float>;

struct SpmmParams {
  const Idx* offsets;
  const Idx* indices;
  const Val* values;
  const Val* b;
  Val* c;
  long long rows;
  long long n;
  long long ldb;
  long long ldc;
  double alpha;
  double beta;
};

namespace {

/// The lanes of this thread's group of kWidth (aligned in its warp).
template <int kWidth>
TS_DEVICE unsigned int group_mask() {
  if constexpr (kWidth >= 32) return 0xffffffffu;
  else return ((1u << kWidth) - 1u) << ((threadIdx.x % 32) & ~(kWidth - 1));
}

/// C element (row, col) = alpha * sum + beta * C (C not read when beta == 0).
TS_DEVICE void write_c(const SpmmParams& p, long long at, Acc sum) {
  Acc out = (Acc)p.alpha * sum;
  if (p.beta != 0.0) out += (Acc)p.beta * ts::convert<Acc>(p.c[at]);
  p.c[at] = ts::convert<Val>(out);
}

/// Row-major B and C: this lane's kVec columns of (row, tile).
TS_DEVICE void row_major_tile(const SpmmParams& p, long long row, long long j0, int lane) {
  const unsigned int mask = group_mask<kLanes>();
  const long long begin = (long long)p.offsets[row];
  const long long end = (long long)p.offsets[row + 1];
  const long long my_col = j0 + (long long)lane * kVec;
  Acc acc[kVec];
#pragma unroll
  for (int v = 0; v < kVec; ++v) acc[v] = 0;
  // Every lane of the group reads the same index and value (one L1 request serves them).
  for (long long k = begin; k < end; ++k) {
    const long long index = (long long)p.indices[k];
    const Acc value = ts::convert<Acc>(p.values[k]);
    const Val* brow = p.b + index * p.ldb;
#pragma unroll
    for (int v = 0; v < kVec; ++v) {
      if (my_col + v < p.n) acc[v] += value * ts::convert<Acc>(brow[my_col + v]);
    }
  }
#pragma unroll
  for (int v = 0; v < kVec; ++v) {
    if (my_col + v < p.n) write_c(p, row * p.ldc + my_col + v, acc[v]);
  }
}

/// Column-major B and C: kCols columns from j0 of `row`, lanes over the row's nonzeros.
TS_DEVICE void col_major_pass(const SpmmParams& p, long long row, long long j0, int lane) {
  const unsigned int mask = group_mask<kLanes>();
  const long long begin = (long long)p.offsets[row];
  const long long end = (long long)p.offsets[row + 1];
  Acc acc[kCols];
#pragma unroll
  for (int c = 0; c < kCols; ++c) acc[c] = 0;
  for (long long k = begin + lane; k < end; k += kLanes) {
    const long long index = (long long)p.indices[k];
    const Acc value = ts::convert<Acc>(p.values[k]);
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      if (j0 + c < p.n) acc[c] += value * ts::convert<Acc>(p.b[index + (j0 + c) * p.ldb]);
    }
  }
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
#pragma unroll
    for (int m = kLanes / 2; m > 0; m /= 2) acc[c] += __shfl_xor_sync(mask, acc[c], m);
  }
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
    if (lane == c % kLanes && j0 + c < p.n) write_c(p, row + (j0 + c) * p.ldc, acc[c]);
  }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(kBlockThreads) spmm_csr(const __grid_constant__ SpmmParams p) {
  constexpr int kGroupsPerCta = kBlockThreads / kLanes;
  constexpr long long kTileCols = kColMajor ? kCols : (long long)kLanes * kVec;
  const long long tiles = (p.n + kTileCols - 1) / kTileCols;
  const long long pair = (long long)blockIdx.x * kGroupsPerCta + threadIdx.x / kLanes;
  const int lane = threadIdx.x % kLanes;
  // A whole group takes the same branch (the pair index is per group).
  if (pair >= p.rows * tiles) return;
  const long long row = pair / tiles;
  const long long j0 = (pair % tiles) * kTileCols;
  if constexpr (kColMajor) col_major_pass(p, row, j0, lane);
  else row_major_tile(p, row, j0, lane);
}
