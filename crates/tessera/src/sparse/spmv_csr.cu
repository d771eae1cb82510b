// spmv_csr.cu: y = alpha * A x + beta * y for a CSR matrix A (rows x cols), deterministic.
//
// What. Every row's sum is formed in one fixed order (independent of timing and of the grid),
// so y is bitwise reproducible run to run: a row is split over the lanes of its group in a
// fixed interleave, the lanes' partial sums meet in a fixed butterfly, and a long row's segment
// sums are added in segment order by whichever CTA finishes that row last. beta == 0 means y is
// not read (NaN in y is overwritten), as BLAS. Values Val (float, double, ts::f16, ts::bf16),
// x and y of the same type; products and sums in Acc (double for double values, else float).
//
// Layout. offsets[rows + 1], indices[nnz] (Idx: int or long long; columns in 0..cols, any
// order within a row), values[nnz] Val; x[cols], y[rows] contiguous.
//   Compact columns (TS_SPMV_COMPACT_COLUMNS, the plan's SpmvTuning::compact_columns, cols <=
//   65536 only): indices points to the matrix's columns narrowed to 16 bits (Col = unsigned
//   short: a copy made once on the device and cached on the CsrMatrix, sparse/spmv_compact.rs);
//   offsets stay Idx. Every kernel below reads its columns through Col, so the row, binned and
//   long-row kernels all have the option; without the switch Col = Idx (unchanged).
//
// Work mapping. Two kernels, chosen by the plan (sparse/spmv.rs) from the row lengths:
//   spmv_csr_rows: a group of kLanes lanes (1..32, a power of two) per row, kBlockThreads / kLanes
//     rows per CTA, grid = ceil(rows / rows per CTA). Lane l takes nonzeros start + l,
//     start + l + kLanes, ... (consecutive lanes read consecutive indices and values), two at a
//     time for loads in flight; the group reduces with shuffles and its lane 0 writes y. Rows
//     longer than p.long_threshold are skipped: they belong to the second kernel.
//   spmv_csr_binned (opt-in, SpmvTuning::binned): for rows of very different lengths, the short
//     rows binned by length on the host into groups of 2, 4, 8, 16 or 32 lanes per row (about
//     four nonzeros per lane); each CTA belongs to one bin and reads its rows from a row list.
//   spmv_csr_long_rows: the long rows cut into segments of kSegmentNnz nonzeros, one CTA per
//     segment (grid = segments). The CTA reduces its segment (warp shuffles, then the warps'
//     sums in shared memory, in warp order) into partials[segment]; the last CTA of its row to
//     finish (a per-row counter, reset by that CTA for the next call: no memset per call, CUDA
//     graph safe) adds the row's partials in segment order and writes y.
// Shared memory: kBlockThreads / 32 Acc (long-row kernel only).
// Not a programmatic dependent launch: measured slower in LSMR's chain (sparse/NOTES.md).
//
// Roofline. Memory bound: each nonzero moves sizeof(Val) + sizeof(Col) bytes once and gathers
// one x element (from L2 when x fits there); offsets and y once per row. Index and value loads
// are streaming (evict-first: read once); x loads go through the read-only path (reused).
// Bytes per nonzero with int columns / 16-bit columns: fp32 8 / 6 (-25%), fp64 12 / 10 (-17%),
// fp16 and bf16 6 / 4 (-33%); with long long columns fp32 12 / 6. On matrices whose x stays in
// L1/L2 (narrow ones: the tall least-squares matrices, 256^2 tomography) the streams are most
// of the DRAM traffic, so the saving is close to those ratios there (not yet measured).
#include "tessera/dtype.cuh"
#include "tessera/spmv_load.cuh"

#ifndef TS_GENERATED_PREAMBLE
using Val = float;
using Idx = int;
constexpr int kLanes = 8;
constexpr int kBlockThreads = 256;
constexpr int kSegmentNnz = 4096;
#endif

#ifdef TS_SPMV_COMPACT_COLUMNS
using Col = unsigned short;  // columns narrowed to 16 bits (cols <= 65536)
#else
using Col = Idx;
#endif

using Acc = ts::conditional_t<ts::is_same_v<Val, double>, double, float>;

struct SpmvParams {
  const Idx* offsets;
  const Col* indices;  // [nnz] columns: Idx, or 16 bits with TS_SPMV_COMPACT_COLUMNS
  const Val* values;
  const Val* x;
  Val* y;
  long long rows;
  long long long_threshold;  // rows of more nonzeros are the long-row kernel's
  double alpha;
  double beta;
  // long-row kernel only
  const long long* long_rows;     // [long_count] row index of each long row
  const int* segment_row;         // [segments] index into long_rows of each segment
  const int* segment_first;       // [long_count] first segment of each long row
  Acc* partials;                  // [segments]
  unsigned int* row_done;         // [long_count] segments finished; 0 between calls
  // binned kernel only: the short rows grouped by length into kBins bins of 2, 4, 8, 16 and 32
  // lanes per row; bin b owns CTAs [bin_first_cta[b], bin_first_cta[b + 1]) and the rows
  // bin_rows[bin_first_row[b] ..  bin_first_row[b + 1])
  const long long* bin_rows;
  // when not null and *skip != 0 at the time the kernels run, the call does nothing (a product
  // queued ahead of a stop decided on the device: LSMR's stop flag)
  const double* skip;
  int bin_first_cta[6];
  int bin_first_row[6];
};

namespace {

/// The dot product of row entries [begin, end) with x, lane `lane` of a group of `kWidth`,
/// two nonzeros per step for loads in flight (two accumulators, added at the end: a fixed order).
template <int kWidth>
TS_DEVICE Acc lane_dot(const SpmvParams& p, long long begin, long long end, int lane) {
  Acc a0 = 0, a1 = 0;
  long long j = begin + lane;
  for (; j + kWidth < end; j += 2 * kWidth) {
    const Col c0 = load_stream(p.indices + j);
    const Col c1 = load_stream(p.indices + j + kWidth);
    const Val v0 = load_stream(p.values + j);
    const Val v1 = load_stream(p.values + j + kWidth);
    a0 += ts::convert<Acc>(v0) * load_x<Acc>(p.x, c0);
    a1 += ts::convert<Acc>(v1) * load_x<Acc>(p.x, c1);
  }
  if (j < end) a0 += ts::convert<Acc>(load_stream(p.values + j)) * load_x<Acc>(p.x, load_stream(p.indices + j));
  return a0 + a1;
}

/// y[row] = alpha * sum + beta * y[row] (y not read when beta == 0).
TS_DEVICE void write_y(const SpmvParams& p, long long row, Acc sum) { store_y(p.y, row, sum, p.alpha, p.beta); }

}  // namespace

extern "C" __global__ void __launch_bounds__(kBlockThreads) spmv_csr_rows(const __grid_constant__ SpmvParams p) {
  if (skip_requested(p.skip)) return;
  constexpr int kRowsPerCta = kBlockThreads / kLanes;
  const long long row = (long long)blockIdx.x * kRowsPerCta + threadIdx.x / kLanes;
  const int lane = threadIdx.x % kLanes;
  // Every lane of a group takes the same branch; groups never straddle warps (kLanes | 32).
  if (row >= p.rows) return;
  const long long begin = (long long)p.offsets[row];
  const long long end = (long long)p.offsets[row + 1];
  if (end - begin > p.long_threshold) return;
  const Acc sum = group_sum<kLanes>(lane_dot<kLanes>(p, begin, end, lane));
  if (lane == 0) write_y(p, row, sum);
}

/// The binned kernel's work for one CTA of bin `b`: groups of kWidth lanes over its rows.
template <int kWidth>
TS_DEVICE void binned_rows(const SpmvParams& p, int b, int cta_in_bin) {
  constexpr int kRowsPerCta = kBlockThreads / kWidth;
  const long long at = (long long)cta_in_bin * kRowsPerCta + threadIdx.x / kWidth;
  const int lane = threadIdx.x % kWidth;
  if (p.bin_first_row[b] + at >= p.bin_first_row[b + 1]) return;  // the whole group
  const long long row = p.bin_rows[p.bin_first_row[b] + at];
  const long long begin = (long long)p.offsets[row];
  const long long end = (long long)p.offsets[row + 1];
  const Acc sum = group_sum<kWidth>(lane_dot<kWidth>(p, begin, end, lane));
  if (lane == 0) write_y(p, row, sum);
}

// spmv_csr_binned: for rows of very different lengths (the plan bins them by length): CTA
// blockIdx.x finds its bin and runs that bin's lanes per row. Long rows are the long-row
// kernel's, as with spmv_csr_rows.
extern "C" __global__ void __launch_bounds__(kBlockThreads) spmv_csr_binned(const __grid_constant__ SpmvParams p) {
  if (skip_requested(p.skip)) return;
  const int cta = blockIdx.x;
  int b = 0;
#pragma unroll
  for (int i = 1; i < 5; ++i) b += cta >= p.bin_first_cta[i] ? 1 : 0;
  const int in_bin = cta - p.bin_first_cta[b];
  switch (b) {
    case 0: binned_rows<2>(p, b, in_bin); break;
    case 1: binned_rows<4>(p, b, in_bin); break;
    case 2: binned_rows<8>(p, b, in_bin); break;
    case 3: binned_rows<16>(p, b, in_bin); break;
    default: binned_rows<32>(p, b, in_bin); break;
  }
}

extern "C" __global__ void __launch_bounds__(kBlockThreads) spmv_csr_long_rows(const __grid_constant__ SpmvParams p) {
  if (skip_requested(p.skip)) return;
  __shared__ Acc warp_sums[kBlockThreads / 32];
  const int segment = blockIdx.x;
  const int k = p.segment_row[segment];
  const long long row = p.long_rows[k];
  const long long row_begin = (long long)p.offsets[row];
  const long long row_end = (long long)p.offsets[row + 1];
  const int first = p.segment_first[k];
  const long long begin = row_begin + (long long)(segment - first) * kSegmentNnz;
  const long long end = begin + kSegmentNnz < row_end ? begin + kSegmentNnz : row_end;

  const Acc mine = group_sum<32>(lane_dot<kBlockThreads>(p, begin, end, threadIdx.x));
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = mine;
  __syncthreads();
  if (threadIdx.x == 0) {
    Acc s = 0;
#pragma unroll
    for (int w = 0; w < kBlockThreads / 32; ++w) s += warp_sums[w];
    p.partials[segment] = s;
    // Publish the partial before counting this segment done (release), and read the others'
    // only after seeing the count complete (acquire).
    __threadfence();
    const int segments = (int)((row_end - row_begin + kSegmentNnz - 1) / kSegmentNnz);
    const unsigned int done = atomicAdd(p.row_done + k, 1u) + 1u;
    if (done == (unsigned int)segments) {
      __threadfence();
      Acc total = 0;
      for (int s2 = 0; s2 < segments; ++s2) total += *(volatile Acc*)(p.partials + first + s2);
      write_y(p, row, total);
      p.row_done[k] = 0;  // ready for the next call (stream order separates calls)
    }
  }
}
