// spmv_panels.cu: y = alpha * A x + beta * y for a CSR matrix A (rows x cols) kept as column
// panels: x is read a panel at a time into shared memory, so the gathers of x never leave the
// SM, and a column index takes 16 bits. Deterministic. The layout is made once per matrix on
// the device (sparse/convert.rs, panels); the plan and launch are sparse/spmv_panels.rs.
//
// What. A's columns are cut into `panels` panels of `width` columns (the last one shorter).
// Panel p holds the entries of columns [p * width, (p + 1) * width), row by row, and within a
// row in A's order. Panel row (p, r) has the entries offsets[p * rows + r] .. offsets[p * rows
// + r + 1]; each with its value and its column within the panel (unsigned 16-bit: width <=
// 65536). With one panel the offsets and values are A's own (only the 16-bit columns are new).
//   spmv_panels: panel row (p, r) dotted with x's panel; with one panel that is the row's sum and
//     y[r] is written at once; else the sum goes to partials[p * rows + r].
//   spmv_panels_reduce (more than one panel): y[r] = alpha * (partials[r] + partials[rows + r]
//     + ...) + beta * y[r], panels added in order.
// Every sum is formed in an order fixed by the matrix (a group's lanes in a fixed interleave and
// butterfly, the panels in order), so repeated calls give bitwise identical y. beta == 0 does not
// read y. Values Val (float, double, ts::f16, ts::bf16), x and y of the same type; products and
// sums in Acc (double for double values, else float).
//
// Layout. offsets[panels * rows + 1] (Idx: int or long long), columns[nnz] (unsigned short),
// values[nnz] Val, x[cols], y[rows]; partials[panels * rows] Acc (more than one panel).
//
// Work mapping. spmv_panels: grid (chunks, panels); CTA (c, p) stages x[p * width ..) (at most
// width elements) into shared memory, then takes rows [c * rows_per_cta, (c + 1) * rows_per_cta)
// of panel p, a group of kLanes lanes per row (kBlockThreads / kLanes rows at a time). Lane l of
// a group takes entries begin + l, begin + l + kLanes, ... (consecutive lanes read consecutive
// columns and values: coalesced, streaming), two at a time for loads in flight. The reduce: one
// thread per row, grid-stride.
// Shared memory: width * sizeof(Val) bytes of x (dynamic; 48 KiB at the default width, up to the
// GPU's opt-in limit for a forced one).
//
// Roofline. Memory bound on the streams: nnz * (sizeof(Val) + 2) bytes of values and columns
// (the row kernel moves nnz * (sizeof(Val) + sizeof(Idx)) and gathers one 32-byte L2 sector of x
// per nonzero when x is larger than L1 and its columns are scattered), plus panels * rows *
// sizeof(Idx) of offsets, panels * rows * 2 sizeof(Acc) of partials, and x read once per chunk
// from L2. It pays when x is spread over many panels whose rows hold several entries each (A^T of
// a wide tall least-squares matrix); with a few panels x stays in L1/L2 and the row kernels win
// (spmv_panels.rs, panels_pay).
#include "tessera/dtype.cuh"
#include "tessera/spmv_load.cuh"

#ifndef TS_GENERATED_PREAMBLE
using Val = float;
using Idx = int;
constexpr int kLanes = 8;
constexpr int kBlockThreads = 256;
#endif

using Acc = ts::conditional_t<ts::is_same_v<Val, double>, double, float>;

struct PanelParams {
  const Idx* offsets;             // [panels * rows + 1]
  const unsigned short* columns;  // [nnz] column within the panel
  const Val* values;              // [nnz] in panel order
  const Val* x;
  Val* y;
  Acc* partials;       // [panels * rows] (more than one panel)
  const double* skip;  // the product's skip flag (null: never)
  long long rows;
  long long cols;
  long long width;         // columns per panel (the last panel may be shorter)
  long long rows_per_cta;  // rows of one chunk
  long long panels;
  double alpha;
  double beta;
};

namespace {

/// x[col0 .. col0 + count) into shared memory: 16 bytes per thread per step when the panel
/// starts and ends on 16-byte boundaries (the default widths), else one element (coalesced).
TS_DEVICE void stage_x_panel(Val* xs, const Val* x, long long col0, int count) {
  const Val* src = x + col0;
  const int bytes = count * (int)sizeof(Val);
  if (((reinterpret_cast<unsigned long long>(src) | (unsigned long long)bytes) & 15ull) == 0) {
    const uint4* s4 = reinterpret_cast<const uint4*>(src);
    uint4* d4 = reinterpret_cast<uint4*>(xs);
    for (int i = threadIdx.x; i < bytes / 16; i += kBlockThreads) d4[i] = __ldg(s4 + i);
  } else {
    for (int i = threadIdx.x; i < count; i += kBlockThreads) xs[i] = src[i];
  }
}

/// The dot product of panel entries [begin, end) with the staged x, lane `lane` of kLanes, two
/// entries per step (two accumulators, added at the end: a fixed order).
TS_DEVICE Acc panel_dot(const PanelParams& p, const Val* xs, long long begin, long long end, int lane) {
  Acc a0 = 0, a1 = 0;
  long long j = begin + lane;
  for (; j + kLanes < end; j += 2 * kLanes) {
    const unsigned short c0 = load_stream(p.columns + j);
    const unsigned short c1 = load_stream(p.columns + j + kLanes);
    const Val v0 = load_stream(p.values + j);
    const Val v1 = load_stream(p.values + j + kLanes);
    a0 += ts::convert<Acc>(v0) * ts::convert<Acc>(xs[c0]);
    a1 += ts::convert<Acc>(v1) * ts::convert<Acc>(xs[c1]);
  }
  if (j < end) a0 += ts::convert<Acc>(load_stream(p.values + j)) * ts::convert<Acc>(xs[load_stream(p.columns + j)]);
  return a0 + a1;
}

}  // namespace

extern "C" __global__ void __launch_bounds__(kBlockThreads) spmv_panels(const __grid_constant__ PanelParams p) {
  if (skip_requested(p.skip)) return;
  extern __shared__ __align__(16) unsigned char panel_smem[];
  Val* xs = reinterpret_cast<Val*>(panel_smem);
  const long long panel = blockIdx.y;
  const long long col0 = panel * p.width;
  const long long left = p.cols - col0;
  stage_x_panel(xs, p.x, col0, (int)(left < p.width ? left : p.width));
  __syncthreads();

  const long long first = (long long)blockIdx.x * p.rows_per_cta;
  const long long stop = first + p.rows_per_cta < p.rows ? first + p.rows_per_cta : p.rows;
  const int lane = threadIdx.x % kLanes;
  const long long base = panel * p.rows;
  // every lane of a group walks the same rows (groups never straddle warps: kLanes | 32)
  for (long long row = first + threadIdx.x / kLanes; row < stop; row += kBlockThreads / kLanes) {
    const long long begin = (long long)p.offsets[base + row];
    const long long end = (long long)p.offsets[base + row + 1];
    const Acc sum = group_sum<kLanes>(panel_dot(p, xs, begin, end, lane));
    if (lane == 0) {
      if (p.panels == 1) store_y(p.y, row, sum, p.alpha, p.beta);
      else p.partials[base + row] = sum;
    }
  }
}

extern "C" __global__ void __launch_bounds__(kBlockThreads) spmv_panels_reduce(const __grid_constant__ PanelParams p) {
  if (skip_requested(p.skip)) return;
  for (long long row = (long long)blockIdx.x * kBlockThreads + threadIdx.x; row < p.rows;
       row += (long long)gridDim.x * kBlockThreads) {
    Acc sum = 0;
    for (long long q = 0; q < p.panels; ++q) sum += p.partials[q * p.rows + row];
    store_y(p.y, row, sum, p.alpha, p.beta);
  }
}
