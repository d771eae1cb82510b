// spmv_merge.cu: y = alpha * A x + beta * y for a CSR matrix A (rows x cols) with the nonzeros
// balanced across threads by the merge path (Merrill & Garland, "Merge-based parallel sparse
// matrix-vector multiplication", SC16), deterministic. Opt-in: SpmvTuning::merge_path
// (sparse/spmv.rs, the launch in sparse/spmv_merge.rs).
//
// What. The merge list of A is its row ends merged with its nonzeros: rows + nnz items. Row end
// r is item offsets[r + 1] + r (it follows the row's last nonzero; an empty row's end follows
// the previous row end). Item d is reached at the point (i, j), i + j = d, of the merge path:
// i row ends and j nonzeros consumed. Consuming nonzero j adds values[j] * x[indices[j]] to the
// running row sum; consuming row end r emits row r (empty rows too) and restarts the sum. Every
// thread consumes kItemsPerThread consecutive items whatever the row lengths, so a row of 18k
// nonzeros costs what 18k rows of one cost, and no lane idles on a short row.
// Deterministic: a row's sum is formed in an order fixed by the matrix alone (a thread's
// products left to right; the pieces of a row spanning threads left to right; the pieces of a
// row spanning CTAs left to right), every y element has exactly one writer, and there are no
// atomics. Values Val (float, double, ts::f16, ts::bf16), x and y of the same type; products
// and sums in Acc (double for double values, else float); beta == 0 does not read y.
//
// Layout. offsets[rows + 1], indices[nnz] (Idx: int or long long; columns in 0..cols, any
// order within a row), values[nnz] Val, x[cols], y[rows]. Per CTA of spmv_merge, one slot each
// (allocated by the plan, never per call; written before read in every call, so nothing is
// reset): carry_row (long long), carry_sum and head_sum (Acc, in 8-byte slots).
//
// Work mapping. Two kernels, stream ordered:
//   spmv_merge: CTA b owns the items [b * kTileItems, (b + 1) * kTileItems) (kTileItems =
//     kItemsPerThread * kBlockThreads = 7 * 256 = 1792; grid = ceil((rows + nnz) / kTileItems)).
//     1. Lanes 0 and 1 find the tile's first and last points (i0, j0) and (i1, j1) by a binary
//        search on offsets (path_row: log2(rows) steps, from L2).
//     2. Staging, coalesced: the tile's row ends offsets[i0 + 1 .. i1] (as ints relative to j0)
//        and the products values[j] * x[indices[j]], j in [j0, j1): thread t takes j0 + t,
//        j0 + t + 256, ..., so consecutive lanes read consecutive indices and values (streaming)
//        and each thread has up to kItemsPerThread independent x gathers in flight.
//     3. Thread t finds its first point (tile diagonal t * kItemsPerThread) by a binary search on
//        the staged row ends and consumes its items from shared memory only: a product adds to
//        the running sum; a row end writes y[row], except the thread's first row end (that row
//        may have started in an earlier thread), whose partial it keeps. Its trailing sum (its
//        part of the row it ends inside) is its carry, in shared memory.
//     4. After a barrier, the thread of a first row end adds, left to right, the carries of the
//        run of threads before it in that row (back to the thread whose own items hold a row end,
//        or thread 0), then its partial, and writes y[row]. The one exception is the tile's first
//        row end when the tile starts inside that row (j0 > offsets[i0]): its sum goes to
//        head_sum[b] for the fixup. The last thread adds the run of carries ending at itself into
//        the tile's carry-out: carry_row[b] = i1, carry_sum[b] = that sum; or carry_row[b] = -1
//        when the tile holds no nonzero of row i1 (it ended exactly on a row end; the last tile
//        always does).
//   spmv_merge_fixup: one thread per CTA b of spmv_merge (grid = ceil(ctas / kBlockThreads)). A run
//     of CTAs b .. m - 1 with one carry row r >= 0 (b == 0 or carry_row[b - 1] != r starts it) is
//     a row that spans them and ends in CTA m (the first CTA after the run, which wrote
//     head_sum[m]); the thread of b adds carry_sum[b .. m) in CTA order, then head_sum[m], and
//     writes y[r] = alpha * sum + beta * y[r]: rounded once, y read once.
//
// Shared memory (static): kTileItems * max(4, sizeof(Acc)) + 8 bytes of staging (row ends and
// products never exceed kTileItems together): 7 KiB for float and half values, 14 KiB for double;
// plus a carry (Acc) and a row-end flag (int) per thread: 9240 / 17432 bytes per CTA in all.
// Registers: __launch_bounds__(256, kMinCtasPerSm = 6) holds spmv_merge to 40 registers (no
// spills on sm_80/86/89/90a), so 6 CTAs (1536 threads) fit an SM by registers; by shared memory
// 6 fit everywhere except fp64 on sm_86/sm_89 (100 KiB: 5). The fixup takes ~12 registers.
//
// Why 7 items per thread: an odd count puts the threads' walks through shared memory (thread t
// starts near word 7t) on different banks; seven independent gathers per thread in the staging
// loop keep enough loads in flight; tiles of 1792 items make the per-CTA searches, the barrier
// and the 24 bytes of carry-out a small fraction of a tile's work (CUB's merge-based SpMV uses 7
// items per thread for 4-byte values as well).
// Why stage products, not raw nonzeros: staged values and indices would leave each x gather to
// the sequential walk, one dependent gather per item; staging the products makes every global
// load of the tile coalesced (indices, values) or independent (x), and takes one Acc of shared
// memory per nonzero instead of a Val and an Idx.
//
// Roofline. Memory bound, as the row kernel: each nonzero moves sizeof(Val) + sizeof(Idx) bytes
// once and gathers one x element (from L2 when x fits there); offsets and y once per row; the two
// searches of each tile (log2(rows) offsets each, from L2) and 24 bytes of carries per CTA on
// top. Unlike the row kernel the work per thread does not depend on the row lengths.
#include "tessera/dtype.cuh"
#include "tessera/spmv_load.cuh"

#ifndef TS_GENERATED_PREAMBLE
using Val = float;
using Idx = int;
constexpr int kItemsPerThread = 7;
constexpr int kBlockThreads = 256;
#endif

using Acc = ts::conditional_t<ts::is_same_v<Val, double>, double, float>;
constexpr int kTileItems = kItemsPerThread * kBlockThreads;
/// Bytes per staged item: a row end (int) or a product (Acc).
constexpr int kSlotBytes = sizeof(Acc) > sizeof(int) ? (int)sizeof(Acc) : (int)sizeof(int);
/// Staging bytes: row ends, padded to 8 bytes, then products.
constexpr int kStagingBytes = kTileItems * kSlotBytes + 8;
/// CTAs of spmv_merge per SM the registers must allow (at most 42 registers a thread): without
/// it ptxas chose 32 registers for fp32 values with 64-bit indices on sm_80 and spilled; with it
/// every variant takes 39-40 registers and spills nothing (fp64 48 -> 40).
constexpr int kMinCtasPerSm = 6;

struct MergeParams {
  const Idx* offsets;
  const Idx* indices;
  const Val* values;
  const Val* x;
  Val* y;
  long long rows;
  long long nnz;         // offsets[rows]
  long long ctas;        // grid of spmv_merge: ceil((rows + nnz) / kTileItems)
  double alpha;
  double beta;
  long long* carry_row;  // [ctas] the row the tile ends inside, or -1
  Acc* carry_sum;        // [ctas] the tile's nonzeros of that row, summed
  Acc* head_sum;         // [ctas] the tile's part of the row it starts inside, when it ends there
  const double* skip;    // when not null and *skip != 0 as the kernels run, the call does nothing
};

namespace {

/// The merge-path point of diagonal d (0 <= d <= rows + nnz): how many row ends come before item
/// d, i.e. the smallest i in [max(0, d - nnz), min(d, rows)] with offsets[i + 1] + i >= d. The
/// point is (i, d - i).
TS_DEVICE long long path_row(const MergeParams& p, long long d) {
  long long lo = d > p.nnz ? d - p.nnz : 0;
  long long hi = d < p.rows ? d : p.rows;
  while (lo < hi) {
    const long long mid = (lo + hi) >> 1;
    if ((long long)p.offsets[mid + 1] + mid < d) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/// The same search inside a tile, on its staged row ends: the row ends before tile diagonal
/// `d` of a tile of `rows_in` row ends and `nnz_in` nonzeros (end[k] = offsets[i0 + 1 + k] - j0).
TS_DEVICE int tile_path_row(const int* end, int rows_in, int nnz_in, int d) {
  int lo = d > nnz_in ? d - nnz_in : 0;
  int hi = d < rows_in ? d : rows_in;
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (end[mid] + mid < d) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/// The carries of the run of threads that ends at `last` inside one row, added left to right:
/// back from `last` over the threads without a row end of their own (their whole range lies in
/// the row), down to the first thread with one (the row starts there) or to thread 0.
TS_DEVICE Acc run_sum(const Acc* carry, const int* has_end, int last) {
  int first = last;
  while (first > 0 && !has_end[first]) --first;
  Acc s = carry[first];
  for (int u = first + 1; u <= last; ++u) s += carry[u];
  return s;
}

}  // namespace

extern "C" __global__ void __launch_bounds__(kBlockThreads, kMinCtasPerSm) spmv_merge(const __grid_constant__ MergeParams p) {
  if (skip_requested(p.skip)) return;  // the fix-up skips as well
  __shared__ unsigned long long s_staging[kStagingBytes / 8];
  __shared__ Acc s_carry[kBlockThreads];
  __shared__ int s_has_end[kBlockThreads];
  __shared__ long long s_point[2];

  const int t = threadIdx.x;
  const long long total = p.rows + p.nnz;
  const long long d0 = (long long)blockIdx.x * kTileItems;
  const long long d1 = d0 + kTileItems < total ? d0 + kTileItems : total;
  // 1. the tile's first and last points
  if (t < 2) s_point[t] = path_row(p, t == 0 ? d0 : d1);
  __syncthreads();
  const long long i0 = s_point[0], j0 = d0 - i0;
  const long long i1 = s_point[1], j1 = d1 - i1;
  const int rows_in = (int)(i1 - i0), nnz_in = (int)(j1 - j0), items = (int)(d1 - d0);
  int* s_end = reinterpret_cast<int*>(s_staging);
  Acc* s_prod = reinterpret_cast<Acc*>(s_staging + (rows_in + 1) / 2);

  // 2. staging: row ends, then products (all loads issued before the first x gather)
#pragma unroll
  for (int k = 0; k < kItemsPerThread; ++k) {
    const int e = t + k * kBlockThreads;
    if (e < rows_in) s_end[e] = (int)((long long)p.offsets[i0 + 1 + e] - j0);
  }
  Idx col[kItemsPerThread];
  Val val[kItemsPerThread];
#pragma unroll
  for (int k = 0; k < kItemsPerThread; ++k) {
    const int e = t + k * kBlockThreads;
    if (e < nnz_in) {
      col[k] = load_stream(p.indices + j0 + e);
      val[k] = load_stream(p.values + j0 + e);
    }
  }
#pragma unroll
  for (int k = 0; k < kItemsPerThread; ++k) {
    const int e = t + k * kBlockThreads;
    if (e < nnz_in) s_prod[e] = ts::convert<Acc>(val[k]) * load_x<Acc>(p.x, col[k]);
  }
  __syncthreads();

  // 3. this thread's items, in merge order
  const int d = t * kItemsPerThread < items ? t * kItemsPerThread : items;
  int k = tile_path_row(s_end, rows_in, nnz_in, d);  // row ends consumed (local row)
  int jl = d - k;                                     // nonzeros consumed (local)
  Acc sum = 0, first_sum = 0;
  int first_row = -1;  // local row of this thread's first row end
#pragma unroll
  for (int it = 0; it < kItemsPerThread; ++it) {
    if (d + it < items) {
      if (k < rows_in && s_end[k] <= jl) {  // row end k: every nonzero of the row consumed
        if (first_row < 0) {
          first_row = k;
          first_sum = sum;
        } else {
          store_y(p.y, i0 + k, sum, p.alpha, p.beta);
        }
        sum = 0;
        ++k;
      } else {
        sum += s_prod[jl];
        ++jl;
      }
    }
  }
  s_carry[t] = sum;
  s_has_end[t] = first_row >= 0;
  __syncthreads();

  // 4. first row ends with the carries of the threads before them; the tile's carry-out
  if (first_row >= 0) {
    const Acc row_sum = t > 0 ? run_sum(s_carry, s_has_end, t - 1) + first_sum : first_sum;
    if (first_row == 0 && j0 > (long long)p.offsets[i0]) p.head_sum[blockIdx.x] = row_sum;
    else store_y(p.y, i0 + first_row, row_sum, p.alpha, p.beta);
  }
  if (t == kBlockThreads - 1) {
    const bool inside = j1 > (long long)p.offsets[i1];  // the tile holds nonzeros of row i1
    p.carry_row[blockIdx.x] = inside ? i1 : -1;
    p.carry_sum[blockIdx.x] = inside ? run_sum(s_carry, s_has_end, t) : Acc(0);
  }
}

extern "C" __global__ void __launch_bounds__(kBlockThreads) spmv_merge_fixup(const __grid_constant__ MergeParams p) {
  if (skip_requested(p.skip)) return;
  const long long b = (long long)blockIdx.x * kBlockThreads + threadIdx.x;
  if (b >= p.ctas) return;
  const long long r = p.carry_row[b];
  if (r < 0 || (b > 0 && p.carry_row[b - 1] == r)) return;  // not the start of a run
  Acc s = p.carry_sum[b];
  long long m = b + 1;
  while (m < p.ctas && p.carry_row[m] == r) s += p.carry_sum[m++];
  if (m == p.ctas) return;  // unreachable: the last tile ends on the last row end
  s += p.head_sum[m];
  store_y(p.y, r, s, p.alpha, p.beta);
}
