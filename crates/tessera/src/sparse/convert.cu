// convert.cu: format conversions of sparse matrices on the device (sparse/convert.rs drives
// them): CSR -> CSR of the transpose, COO -> CSR, CSR -> BSR, BSR -> Blocked-ELL, and the
// structure counts of a matrix's descriptor. Every result is deterministic: positions come from stable sorts and integer
// counts (integer atomics commute), never from the order in which threads arrive.
//
// What. The building blocks, launched in sequence by the host:
//   conv_expand_rows    row_of[k] = the row of nonzero k (CSR offsets -> COO rows).
//   conv_radix_hist     one pass of a stable LSD radix sort by 8-bit digits: each tile's digit
//                       histogram, stored digit-major (hist[d * tiles + tile]) so that one
//                       exclusive scan over it gives every (digit, tile) its first output slot
//                       in stable order.
//   conv_scan           exclusive prefix sum in place (one CTA; the total into scan[n]).
//   conv_radix_scatter  the pass's stable scatter of (key, perm): within a tile, a key's rank
//                       among equal digits is (warps before it) + (earlier items of its warp,
//                       by match_any and a per-warp digit count) + (lanes before it).
//   conv_count          counts[key[i]] += 1 (integer atomics): row lengths to scan into offsets.
//   conv_gather         out[i] = src[perm[i]] (indices).
//   conv_heads          flags[p] = 1 where sorted (row, col) p starts a run of equal entries;
//                       the first duplicate position (atomicMin) for Duplicates::Reject.
//   conv_check_range    the first position of an index outside 0..bound (atomicMin).
//   conv_structure      descriptor counts, for rows with nondecreasing columns: distinct
//                       aligned b x b blocks (b = 2 << shift, one launch per b), and with
//                       b = 2 the entry pairs within rows and those in one 32-column line;
//                       integer atomics.
//   conv_block_rows     keys_out[i] = keys_in[i] / block (rows -> block rows).
//   conv_bsr_heads      flags[i] = 1 where sorted entry i (sorted by block row, then column,
//                       then input position) starts a new block (block row or block column
//                       changes).
//   conv_bsr_blocks     for each block head: its block row and block column at slot flags[i].
//   conv_gather_values  values_out[i] = values_in[perm[i]]        (TS_CONV_VALUES only)
//   conv_sum_runs       each run of equal sorted (row, col) summed in f64 in input order and
//                       rounded once, written compacted                (TS_CONV_VALUES only)
//   conv_bsr_fill       each run of equal (row, col) among the sorted entries (adjacent: the
//                       sort keeps input order among equal columns) summed in f64 in input
//                       order and rounded once (a run of one copied unchanged) into its place
//                       in its block's b x b row-major values (zeroed first)  (TS_CONV_VALUES)
//   conv_panel_keys     each nonzero's column panel (the sort key) and panel row (counted into
//                       the panels' offsets), for the column panels of spmv_panels.cu.
//   conv_panel_columns  each entry's column within its panel, 16 bits, in panel order; with
//                       no permutation and no panel keys, the matrix's columns narrowed to 16
//                       bits (the compact columns of spmv_csr.cu, cols <= 65536).
//   conv_bell_fill      BSR block s (of block row keys_in[s]) copied to Blocked-ELL slot
//                       br * width + (s - offsets[br]), values and block column; one thread
//                       per value                                      (TS_CONV_VALUES only)
//
// Each variant compiles one entry (its TS_CONV_<ENTRY> switch), the value kernels only with
// TS_CONV_VALUES (Val defined).
//
// Layout. Idx (int or long long) for indices, offsets, permutations, flags and counts (all
// below nnz or the dimensions, which the host checked fit Idx); counters unsigned long long.
//
// Work mapping. Elementwise kernels: one thread per element, grid-stride, kBlockThreads per
// CTA. Radix kernels: one tile of kTile = kBlockThreads * kItems keys per CTA, kBlockThreads ==
// 256 (one thread per digit when combining warps). Scan: one CTA of kBlockThreads threads
// walking the array in chunks of kBlockThreads * kScanItems. expand_rows and structure: one
// warp per row.
// Shared memory: radix scatter (kBlockThreads / 32) * 256 * 4 + 256 * sizeof(Idx) bytes
// (10 KiB with long long); radix hist 1 KiB; scan kBlockThreads * kScanItems * sizeof(Idx)
// (16 KiB with long long) + 32 * sizeof(Idx).
//
// Roofline. Conversions run once per matrix. A radix pass reads and writes key and perm once
// (4 sizeof(Idx) bytes per nonzero); the number of passes is ceil(bits of the largest key / 8).
// The single-CTA scan moves 2 sizeof(Idx) bytes per element at one SM's bandwidth, which
// bounds the conversion at hundreds of millions of nonzeros (a decoupled look-back scan is the
// upgrade when it matters).
#include "tessera/dtype.cuh"

#ifndef TS_GENERATED_PREAMBLE
using Idx = int;
using Val = float;
#define TS_CONV_VALUES 1
#define TS_CONV_EXPAND_ROWS 1
#define TS_CONV_RADIX_HIST 1
#define TS_CONV_SCAN 1
#define TS_CONV_RADIX_SCATTER 1
#define TS_CONV_COUNT 1
#define TS_CONV_GATHER 1
#define TS_CONV_HEADS 1
#define TS_CONV_CHECK_RANGE 1
#define TS_CONV_STRUCTURE 1
#define TS_CONV_GATHER_VALUES 1
#define TS_CONV_SUM_RUNS 1
#define TS_CONV_BLOCK_ROWS 1
#define TS_CONV_BSR_HEADS 1
#define TS_CONV_BSR_BLOCKS 1
#define TS_CONV_BSR_FILL 1
#define TS_CONV_BELL_FILL 1
#define TS_CONV_PANEL_KEYS 1
#define TS_CONV_PANEL_COLUMNS 1
constexpr int kBlockThreads = 256;
constexpr int kItems = 8;
constexpr int kScanItems = 4;
#endif

static_assert(kBlockThreads == 256, "radix kernels use one thread per 8-bit digit");
constexpr int kDigits = 256;
constexpr int kWarps = kBlockThreads / 32;
constexpr int kTile = kBlockThreads * kItems;
using UIdx = ts::conditional_t<sizeof(Idx) == 8, unsigned long long, unsigned int>;

struct ConvParams {
  const Idx* offsets;            // [rows + 1] CSR offsets (expand_rows, structure)
  const Idx* indices;            // CSR column indices (structure)
  const Idx* keys_in;            // [n] keys to sort / count / check / gather from
  const Idx* perm_in;            // [n] permutation (radix, gather); null: the identity
  Idx* keys_out;                 // [n]
  Idx* perm_out;                 // [n]
  Idx* scan;                     // hist / scanned array ([n + 1]: the total lands in scan[n])
  const Idx* rows_in;            // [n] sorted rows (heads, sum_runs)
  const Idx* cols_in;            // [n] sorted columns (heads, sum_runs)
  const Idx* flags;              // [n + 1] scanned head flags (sum_runs)
  const void* values_in;         // Val (gather_values, sum_runs)
  void* values_out;              // Val
  unsigned long long* counters;  // first bad / duplicate position, or structure counts [7]
  long long n;                   // elements
  long long rows;                // rows (expand_rows, structure)
  long long bound;               // check_range: indices must be in 0..bound
  int shift;                     // radix: digit = (key >> shift) & 255
  int tiles;                     // radix: tiles of kTile keys
  long long block;               // BSR / Blocked-ELL: the block side b
  long long width;               // Blocked-ELL: block slots per block row; panels: columns per panel
};
static_assert(sizeof(ConvParams) == 152, "ConvParams and its Rust mirror (convert.rs) differ");

namespace {

/// This thread's first element and the grid's stride, for grid-stride loops.
TS_DEVICE long long grid_first() { return (long long)blockIdx.x * kBlockThreads + threadIdx.x; }
TS_DEVICE long long grid_stride() { return (long long)gridDim.x * kBlockThreads; }

TS_DEVICE int digit_of(Idx key, int shift) { return (int)(((UIdx)key >> shift) & (kDigits - 1)); }

/// The key and permutation entry of element i of a radix pass (perm_in null: the identity).
TS_DEVICE Idx perm_at(const ConvParams& p, long long i) { return p.perm_in ? p.perm_in[i] : (Idx)i; }

TS_DEVICE void atomic_add_count(Idx* at, Idx v) {
  if constexpr (sizeof(Idx) == 8) atomicAdd((unsigned long long*)at, (unsigned long long)v);
  else atomicAdd((unsigned int*)at, (unsigned int)v);
}

/// Inclusive sum over the warp (shuffle-up ladder).
TS_DEVICE Idx warp_inclusive_sum(Idx v) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const Idx o = __shfl_up_sync(0xffffffffu, v, d);
    if (lane >= d) v += o;
  }
  return v;
}

/// Exclusive sum over the CTA in thread order; `total` gets the CTA's sum. `warp_sums` holds 32.
TS_DEVICE Idx block_exclusive_sum(Idx v, Idx* warp_sums, Idx& total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const Idx inclusive = warp_inclusive_sum(v);
  if (lane == 31) warp_sums[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    const Idx w = lane < kBlockThreads / 32 ? warp_sums[lane] : (Idx)0;
    const Idx wi = warp_inclusive_sum(w);
    if (lane < kBlockThreads / 32) warp_sums[lane] = wi - w;
    if (lane == kBlockThreads / 32 - 1) warp_sums[31] = wi;
  }
  __syncthreads();
  const Idx out = warp_sums[warp] + inclusive - v;
  total = warp_sums[31];
  __syncthreads();  // warp_sums is reused by the next call
  return out;
}

/// First position in the sorted (nondecreasing) row [begin, end) of a column >= c.
TS_DEVICE long long lower_bound(const Idx* cols, long long begin, long long end, long long c) {
  while (begin < end) {
    const long long mid = begin + (end - begin) / 2;
    if ((long long)cols[mid] < c) begin = mid + 1;
    else end = mid;
  }
  return begin;
}

}  // namespace

#ifdef TS_CONV_EXPAND_ROWS
extern "C" __global__ void __launch_bounds__(kBlockThreads) conv_expand_rows(const __grid_constant__ ConvParams p) {
  const long long row = (long long)blockIdx.x * kWarps + threadIdx.x / 32;
  if (row >= p.rows) return;
  const long long end = (long long)p.offsets[row + 1];
  for (long long k = (long long)p.offsets[row] + threadIdx.x % 32; k < end; k += 32) p.keys_out[k] = (Idx)row;
}
#endif


#ifdef TS_CONV_RADIX_HIST
extern "C" __global__ void __launch_bounds__(kBlockThreads) conv_radix_hist(const __grid_constant__ ConvParams p) {
  __shared__ unsigned int counts[kDigits];
  counts[threadIdx.x] = 0;
  __syncthreads();
  const long long first = (long long)blockIdx.x * kTile;
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    const long long at = first + i * kBlockThreads + threadIdx.x;
    if (at < p.n) atomicAdd(&counts[digit_of(p.keys_in[at], p.shift)], 1u);
  }
  __syncthreads();
  p.scan[(long long)threadIdx.x * p.tiles + blockIdx.x] = (Idx)counts[threadIdx.x];
}
#endif


#ifdef TS_CONV_SCAN
extern "C" __global__ void __launch_bounds__(kBlockThreads) conv_scan(const __grid_constant__ ConvParams p) {
  constexpr int kChunk = kBlockThreads * kScanItems;
  __shared__ Idx chunk[kChunk];
  __shared__ Idx warp_sums[32];
  Idx carry = 0;
  for (long long base = 0; base < p.n; base += kChunk) {
#pragma unroll
    for (int i = 0; i < kScanItems; ++i) {
      const long long at = base + i * kBlockThreads + threadIdx.x;
      chunk[i * kBlockThreads + threadIdx.x] = at < p.n ? p.scan[at] : (Idx)0;
    }
    __syncthreads();
    // each thread its kScanItems consecutive elements, then the threads' sums across the CTA
    Idx mine[kScanItems];
    Idx sum = 0;
#pragma unroll
    for (int i = 0; i < kScanItems; ++i) {
      mine[i] = sum;
      sum += chunk[threadIdx.x * kScanItems + i];
    }
    Idx total;
    const Idx before = carry + block_exclusive_sum(sum, warp_sums, total);
#pragma unroll
    for (int i = 0; i < kScanItems; ++i) chunk[threadIdx.x * kScanItems + i] = before + mine[i];
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kScanItems; ++i) {
      const long long at = base + i * kBlockThreads + threadIdx.x;
      if (at < p.n) p.scan[at] = chunk[i * kBlockThreads + threadIdx.x];
    }
    carry += total;
    __syncthreads();
  }
  if (threadIdx.x == 0) p.scan[p.n] = carry;
}
#endif


#ifdef TS_CONV_RADIX_SCATTER
extern "C" __global__ void __launch_bounds__(kBlockThreads) conv_radix_scatter(const __grid_constant__ ConvParams p) {
  __shared__ unsigned int warp_counts[kWarps][kDigits];  // then: each warp's first slot per digit
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) warp_counts[w][threadIdx.x] = 0;
  __syncthreads();
  // Each warp owns kItems * 32 consecutive keys, taken 32 at a time in order: an item's rank
  // among its digit within the warp is the warp's count so far plus the equal lanes before it.
  const long long first = (long long)blockIdx.x * kTile + (long long)warp * kItems * 32;
  const unsigned int lanes_before = (1u << lane) - 1u;
  Idx keys[kItems], perms[kItems];
  unsigned int ranks[kItems];
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    const long long at = first + i * 32 + lane;
    const bool valid = at < p.n;
    keys[i] = valid ? p.keys_in[at] : (Idx)0;
    perms[i] = valid ? perm_at(p, at) : (Idx)0;
    const int d = valid ? digit_of(keys[i], p.shift) : kDigits;  // kDigits: no digit
    const unsigned int peers = __match_any_sync(0xffffffffu, d);
    ranks[i] = valid ? warp_counts[warp][d] + __popc(peers & lanes_before) : 0u;
    __syncwarp();
    if (valid && lane == 31 - __clz(peers)) warp_counts[warp][d] += __popc(peers);
    __syncwarp();
  }
  __syncthreads();
  // Thread t owns digit t: the tile's first output slot for it (from the scanned histogram),
  // and each warp's offset from there, in warp order (below kTile: 32 bits suffice).
  __shared__ Idx tile_first[kDigits];
  {
    tile_first[threadIdx.x] = p.scan[(long long)threadIdx.x * p.tiles + blockIdx.x];
    unsigned int run = 0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const unsigned int c = warp_counts[w][threadIdx.x];
      warp_counts[w][threadIdx.x] = run;
      run += c;
    }
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    const long long at = first + i * 32 + lane;
    if (at < p.n) {
      const int d = digit_of(keys[i], p.shift);
      const long long slot = (long long)tile_first[d] + warp_counts[warp][d] + ranks[i];
      p.keys_out[slot] = keys[i];
      p.perm_out[slot] = perms[i];
    }
  }
}
#endif


#ifdef TS_CONV_COUNT
extern "C" __global__ void __launch_bounds__(kBlockThreads) conv_count(const __grid_constant__ ConvParams p) {
  for (long long i = grid_first(); i < p.n; i += grid_stride()) atomic_add_count(p.scan + p.keys_in[i], (Idx)1);
}
#endif


#ifdef TS_CONV_GATHER
extern "C" __global__ void __launch_bounds__(kBlockThreads) conv_gather(const __grid_constant__ ConvParams p) {
  for (long long i = grid_first(); i < p.n; i += grid_stride()) p.keys_out[i] = p.keys_in[p.perm_in[i]];
}
#endif


#ifdef TS_CONV_HEADS
extern "C" __global__ void __launch_bounds__(kBlockThreads) conv_heads(const __grid_constant__ ConvParams p) {
  for (long long i = grid_first(); i < p.n; i += grid_stride()) {
    const bool head = i == 0 || p.rows_in[i] != p.rows_in[i - 1] || p.cols_in[i] != p.cols_in[i - 1];
    p.scan[i] = head ? (Idx)1 : (Idx)0;
    if (!head) atomicMin(p.counters, (unsigned long long)i);
  }
}
#endif


#ifdef TS_CONV_CHECK_RANGE
extern "C" __global__ void __launch_bounds__(kBlockThreads) conv_check_range(const __grid_constant__ ConvParams p) {
  for (long long i = grid_first(); i < p.n; i += grid_stride()) {
    const long long v = (long long)p.keys_in[i];
    if (v < 0 || v >= p.bound) atomicMin(p.counters, (unsigned long long)i);
  }
}
#endif


// One launch per block side b = 2 << shift (shift = 0..4) adds to counters[2 + shift] the
// distinct nonempty aligned b x b blocks; the launch with shift 0 also counts into [0] the entry
// pairs within rows and into [1] those whose columns share a 32-column line. An entry opens its
// block when no earlier entry of its row and no earlier row of its block-row holds a column of
// the block (a binary search per earlier row: the rows' columns are nondecreasing).
#ifdef TS_CONV_STRUCTURE
extern "C" __global__ void __launch_bounds__(kBlockThreads) conv_structure(const __grid_constant__ ConvParams p) {
  const long long row = (long long)blockIdx.x * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const long long b = 2ll << p.shift;
  unsigned long long pairs = 0, local = 0, blocks = 0;
  if (row < p.rows) {
    const long long begin = (long long)p.offsets[row], end = (long long)p.offsets[row + 1];
    for (long long k = begin + lane; k < end; k += 32) {
      const long long c = (long long)p.indices[k];
      const long long prev = k > begin ? (long long)p.indices[k - 1] : -1;
      if (k > begin) {
        pairs += 1;
        local += (c / 32 == prev / 32) ? 1 : 0;
      }
      const long long bc = c / b;
      if (k > begin && prev / b == bc) continue;  // not the first of its block in this row
      bool first = true;
      for (long long r = row - row % b; r < row && first; ++r) {
        const long long rb = (long long)p.offsets[r], re = (long long)p.offsets[r + 1];
        const long long at = lower_bound(p.indices, rb, re, bc * b);
        first = !(at < re && (long long)p.indices[at] < (bc + 1) * b);
      }
      blocks += first ? 1 : 0;
    }
  }
  // the warp's counts, then one atomic per counter per warp
#pragma unroll
  for (int m = 16; m > 0; m /= 2) {
    pairs += __shfl_xor_sync(0xffffffffu, pairs, m);
    local += __shfl_xor_sync(0xffffffffu, local, m);
    blocks += __shfl_xor_sync(0xffffffffu, blocks, m);
  }
  if (lane == 0 && row < p.rows) {
    if (p.shift == 0) {
      atomicAdd(p.counters + 0, pairs);
      atomicAdd(p.counters + 1, local);
    }
    atomicAdd(p.counters + 2 + p.shift, blocks);
  }
}
#endif


#ifdef TS_CONV_BLOCK_ROWS
extern "C" __global__ void __launch_bounds__(kBlockThreads) conv_block_rows(const __grid_constant__ ConvParams p) {
  for (long long i = grid_first(); i < p.n; i += grid_stride()) p.keys_out[i] = (Idx)((long long)p.keys_in[i] / p.block);
}
#endif


// Sorted entry i: input position perm_in[i], block row keys_in[i], column indices[perm_in[i]].
#ifdef TS_CONV_BSR_HEADS
extern "C" __global__ void __launch_bounds__(kBlockThreads) conv_bsr_heads(const __grid_constant__ ConvParams p) {
  for (long long i = grid_first(); i < p.n; i += grid_stride()) {
    bool head = i == 0 || p.keys_in[i] != p.keys_in[i - 1];
    if (!head) {
      const long long bc = (long long)p.indices[p.perm_in[i]] / p.block;
      head = bc != (long long)p.indices[p.perm_in[i - 1]] / p.block;
    }
    p.scan[i] = head ? (Idx)1 : (Idx)0;
  }
}
#endif


// flags: the scanned head marks (n + 1 entries); a head i writes its block's block row
// (keys_out) and block column (perm_out) at slot flags[i].
#ifdef TS_CONV_BSR_BLOCKS
extern "C" __global__ void __launch_bounds__(kBlockThreads) conv_bsr_blocks(const __grid_constant__ ConvParams p) {
  for (long long i = grid_first(); i < p.n; i += grid_stride()) {
    const Idx slot = p.flags[i];
    if (p.flags[i + 1] == slot) continue;  // not a head
    p.keys_out[slot] = p.keys_in[i];
    p.perm_out[slot] = (Idx)((long long)p.indices[p.perm_in[i]] / p.block);
  }
}
#endif


// Column panels (sparse/spmv_panels.cu): nonzero k of row keys_in[k] (from expand_rows) is in
// panel indices[k] / width: keys_out[k] = that panel (the sort key: a stable sort of A's
// row-major entries by panel gives panel, row, A's order), perm_out[k] = panel * rows + row
// (its panel row: counted and scanned into the panels' offsets).
#ifdef TS_CONV_PANEL_KEYS
extern "C" __global__ void __launch_bounds__(kBlockThreads) conv_panel_keys(const __grid_constant__ ConvParams p) {
  for (long long i = grid_first(); i < p.n; i += grid_stride()) {
    const long long panel = (long long)p.indices[i] / p.width;
    p.keys_out[i] = (Idx)panel;
    p.perm_out[i] = (Idx)(panel * p.rows + (long long)p.keys_in[i]);
  }
}
#endif

// The column within its panel of entry i in panel order, as 16 bits into values_out:
// indices[perm_in[i]] - keys_in[i] * width (perm_in null: the identity; keys_in null: panel 0).
#ifdef TS_CONV_PANEL_COLUMNS
extern "C" __global__ void __launch_bounds__(kBlockThreads) conv_panel_columns(const __grid_constant__ ConvParams p) {
  unsigned short* out = (unsigned short*)p.values_out;
  for (long long i = grid_first(); i < p.n; i += grid_stride()) {
    const long long col = (long long)p.indices[perm_at(p, i)];
    const long long panel = p.keys_in ? (long long)p.keys_in[i] : 0;
    out[i] = (unsigned short)(col - panel * p.width);
  }
}
#endif


#ifdef TS_CONV_VALUES
namespace {

template <class V>
TS_DEVICE double value_to_double(V v) {
  if constexpr (ts::is_same_v<V, double> || ts::is_same_v<V, float>) return (double)v;
  else return (double)ts::to_float(v);
}

/// `v` rounded once to Val (as the host's `from_f64`): halves go through a float rounded to
/// odd, which has enough spare bits that its round-to-nearest-even to the half is the single
/// correct rounding of `v`.
template <class V>
TS_DEVICE V value_from_double(double v) {
  if constexpr (ts::is_same_v<V, double>) return v;
  else if constexpr (ts::is_same_v<V, float>) return (float)v;
  else {
    const float toward_zero = __double2float_rz(v);
    unsigned int bits = __float_as_uint(toward_zero);
    if ((double)toward_zero != v) bits |= 1u;  // inexact (or NaN): make the last bit sticky
    return ts::from_float<V>(__uint_as_float(bits));
  }
}

}  // namespace

#ifdef TS_CONV_GATHER_VALUES
extern "C" __global__ void __launch_bounds__(kBlockThreads) conv_gather_values(const __grid_constant__ ConvParams p) {
  const Val* in = (const Val*)p.values_in;
  Val* out = (Val*)p.values_out;
  for (long long i = grid_first(); i < p.n; i += grid_stride()) out[i] = in[p.perm_in[i]];
}
#endif


// Entry i is a run's head where flags[i + 1] > flags[i] (flags: scanned head marks, n + 1
// entries); the run ends at the next head. keys_out/perm_out receive the run's row and column,
// values_out its sum, all at slot flags[i]. A run of one copies its value unchanged.
#ifdef TS_CONV_SUM_RUNS
extern "C" __global__ void __launch_bounds__(kBlockThreads) conv_sum_runs(const __grid_constant__ ConvParams p) {
  const Val* in = (const Val*)p.values_in;
  Val* out = (Val*)p.values_out;
  for (long long i = grid_first(); i < p.n; i += grid_stride()) {
    const Idx slot = p.flags[i];
    if (p.flags[i + 1] == slot) continue;  // not a head
    const Idx r = p.rows_in[i], c = p.cols_in[i];
    long long j = i + 1;
    while (j < p.n && p.rows_in[j] == r && p.cols_in[j] == c) ++j;
    Val v = in[p.perm_in[i]];
    if (j > i + 1) {
      double sum = value_to_double(v);
      for (long long k = i + 1; k < j; ++k) sum += value_to_double(in[p.perm_in[k]]);
      v = value_from_double<Val>(sum);
    }
    p.keys_out[slot] = r;
    p.perm_out[slot] = c;
    out[slot] = v;
  }
}
#endif

// Sorted entry i: input position o = perm_in[i], row rows_in[o], column indices[o]; its block
// is flags[i + 1] - 1 (flags: scanned block heads, n + 1 entries). The first entry of each run
// of equal (row, column) writes the run's sum.
#ifdef TS_CONV_BSR_FILL
extern "C" __global__ void __launch_bounds__(kBlockThreads) conv_bsr_fill(const __grid_constant__ ConvParams p) {
  const Val* in = (const Val*)p.values_in;
  Val* out = (Val*)p.values_out;
  for (long long i = grid_first(); i < p.n; i += grid_stride()) {
    const Idx o = p.perm_in[i];
    const Idx r = p.rows_in[o], c = p.indices[o];
    if (i > 0) {
      const Idx prev = p.perm_in[i - 1];
      if (p.rows_in[prev] == r && p.indices[prev] == c) continue;  // inside a run
    }
    long long j = i + 1;
    while (j < p.n && p.rows_in[p.perm_in[j]] == r && p.indices[p.perm_in[j]] == c) ++j;
    Val v = in[o];
    if (j > i + 1) {
      double sum = value_to_double(v);
      for (long long k = i + 1; k < j; ++k) sum += value_to_double(in[p.perm_in[k]]);
      v = value_from_double<Val>(sum);
    }
    const long long slot = (long long)p.flags[i + 1] - 1;
    const long long b = p.block;
    out[slot * b * b + ((long long)r % b) * b + (long long)c % b] = v;
  }
}
#endif


// n = BSR blocks * b * b: element e of BSR block s (block row keys_in[s], offsets: the BSR
// block offsets, indices: its block columns) to slot br * width + (s - offsets[br]).
#ifdef TS_CONV_BELL_FILL
extern "C" __global__ void __launch_bounds__(kBlockThreads) conv_bell_fill(const __grid_constant__ ConvParams p) {
  const Val* in = (const Val*)p.values_in;
  Val* out = (Val*)p.values_out;
  const long long bb = p.block * p.block;
  for (long long i = grid_first(); i < p.n; i += grid_stride()) {
    const long long s = i / bb, e = i % bb;
    const long long br = (long long)p.keys_in[s];
    const long long dst = br * p.width + (s - (long long)p.offsets[br]);
    out[dst * bb + e] = in[i];
    if (e == 0) p.keys_out[dst] = p.indices[s];
  }
}
#endif

#endif  // TS_CONV_VALUES
