// softmax.cu: row-wise softmax / log_softmax over the last dimension, f32 compute.
//
// What. For each row of a rows x cols matrix, with x = scale * in:
//     softmax     = exp(x - max) / sum,        sum = sum_j exp(x_j - max)
//     log_softmax = x - max - ln(sum)
// computed in the log2 domain with s = scale_log2e (= scale * log2 e, computed on the host):
//     m = max_j round(in_j * s)       (found as round(s * max in) for s > 0, round(s * min in) for
//                                      s < 0: rounding is monotonic, no multiply per element)
//     d_j = fma(in_j, s, -m)          (the product is never rounded on its own)
//     softmax = 2^d_j / sum_j 2^d_j,  log_softmax = d_j * ln 2 - ln(sum_j 2^d_j).
// Every pass evaluates the same d_j, so the max element's residual (in*s - m, below half an ulp
// of m) cancels between numerator and denominator, and rows of huge logits (|in * s| ~ 1e5 with
// near ties) keep f32 accuracy; rounding t = in * s first would cost ~|t| * 2^-24 relative (a
// 1e-3 error, seen on an H200 in an earlier version). The kernel reads `scale_log2e` only;
// `scale` is in the struct for the record.
// Special rows, exactly as the CPU reference (reference.rs):
//   * any NaN in the row (also 0 * inf from the scale): the whole output row is NaN (the row
//     max is NaN-propagating and the row's 1/sum or -ln(sum) is then forced to NaN);
//   * every element -inf: softmax 0 everywhere, log_softmax -inf everywhere, no NaN (the shift
//     subtracted from -inf is 0, not -inf; 1/sum and -ln(sum) are replaced by 0 when sum = 0);
//   * k elements +inf: they share the mass (softmax 1/k, log_softmax -ln k), the rest get 0 /
//     -inf: d_j is clamped at 1 (ts::shifted_fma), which turns +inf - +inf = NaN into 1 for all k
//     of them and never touches a regular d_j (<= half an ulp of m) while |m| < 2^24.
// Exponentials are MUFU.EX2 (ex2.approx.ftz, ~2 ulp). Softmax outputs are evaluated as
// 2^(d + 1) * (1 / (2 sum)) (kProbBias), so results down to 2^-127 (~5.9e-39) survive the flush
// to zero and come out as subnormals from the final (non-ftz) multiply: every output >= 1e-38 is
// kept (fp16 outputs, which flush below 2^-24 anyway, take 2^d * (1 / sum)). The clamp of d_j
// can only act where the row max m is +inf, NaN or |m| >= 2^22 (ts::clamp_may_act); elsewhere
// the kernels take a copy of their term loops without it (the same values, one instruction less
// per element). Caveats: |in * s| >= 2^128 overflows f32 and is treated as that infinity (the f64
// reference still sees a finite value); beyond |m| >= 2^24 the clamp may shave the residual of
// the top element (f32 has no fractional exponent bits left there anyway).
//
// Layout. InT in (float, f16, bf16), OutT out (any tessera storage type), both row-major with
// element row strides in_stride, out_stride >= cols. out may alias in exactly (out == in and
// out_stride == in_stride): every element is read by the thread that later writes it, and all of
// a row's reads happen before any of its writes (path 0: the row is in registers before the
// reductions; path 1: cached in shared memory before the block reduction; path 2: pass 2 reads
// each element in the same thread just before writing it, after the block reduction that ends
// pass 1). Rows never overlap (stride >= cols). Loads and stores are ordered asm volatile.
//
// Paths (kPath, one per compiled variant); every path grid-strides over rows, so any grid >= 1
// is correct:
//   0  warp per row(s), row in registers. A group of kWarpWidth lanes (32, or 16/8/4/2/1 for
//      short rows: 32/kWarpWidth groups per warp) owns kRowsPerWarp rows at a time. Lane l of a
//      group holds, for pack slot j < kColsPerThread / kPack, the kPack columns starting at
//      (j * kWarpWidth + l) * kPack (consecutive lanes read consecutive 16-byte chunks), so a row
//      has at most kWarpWidth * kColsPerThread columns. Columns >= cols and rows >= rows hold
//      the input-type infinity that the scale maps to -inf and are not stored; a pack straddling
//      `cols` is loaded/stored element by element. All loads of an iteration are issued first,
//      then max (sub-warp butterfly), sum, write. No shared memory.
//      CTA = kBlockThreads (128) threads; rows per CTA iteration
//      rows_per_cta = (kBlockThreads / kWarpWidth) * kRowsPerWarp;
//      grid = min(ceil(rows / rows_per_cta), cap).
//      Tunings (kWarpTuning, each a Rust path; Auto takes 2 for rows of <= 32 input bytes per
//      lane and 0 otherwise, plan.rs): 0 "warp": evict-first loads (.cs). 1 "warp-nc": loads
//      with L1::no_allocate and the default L2 policy. 2 "warp-v2": as 1, and for short rows
//      (<= 32 input bytes per lane per iteration, e.g. 128 columns) a register double buffer:
//      before reducing iteration i, each lane group issues the loads of its rows of iteration
//      i + 1 (rows step = gridDim.x * rows_per_cta further; masked past the end), so a lane
//      has its next rows in flight while it reduces and stores; the grid is one wave of
//      resident CTAs, so every CTA runs several iterations (sm_90a registers: fp32 cols 128 32
//      as tuning 0, fp16 cols 128 56 vs 48). Longer fp32 rows (> 64 bytes per lane) instead get
//      an occupancy floor of 7 CTAs per SM on sm_90+ (72-register cap; fp32 cols 1024: 71-72
//      registers vs 75-83, 7 CTAs per SM instead of 5-6).
//   1  CTA per row, row cached in shared memory: kBlockThreads (128..1024) threads,
//      grid = min(rows, cap). Pass A streams the row from global once (batches of kUnroll = 4
//      16-byte loads per thread), stores the inputs in shared memory as f32 and keeps a running
//      max (or min, s < 0); block max of round(s * extreme); pass B sums 2^d from shared memory;
//      block sum; pass C writes from shared memory. Each thread only touches its own
//      shared-memory slots (the same index mapping in all passes), so no barrier is needed
//      besides the two reductions.
//      Dynamic shared memory: exactly round_up(cols * 4, 16) bytes (the Rust side passes it and
//      raises cudaFuncAttributeMaxDynamicSharedMemorySize above 48 KiB). Layout: the
//      P = cols / kPack full packs are stored as kPack/4 planes of float4 chunks (plane h holds
//      floats 4h..4h+3 of every pack, chunk index h * P + q), so a warp's 16-byte chunk
//      stores/loads hit consecutive addresses (no bank conflicts); the cols % kPack tail floats
//      follow at P * kPack. Static shared memory: 2 * kBlockThreads/32 floats.
//   2  CTA per row, uncached: kBlockThreads (128..1024) threads, grid = min(rows, cap). Pass 1
//      reads the row (L1::no_allocate, leaving it in L2 for pass 2), folding each batch of
//      kUnroll packs into a per-thread OnlineSoftmax state (m, d) with one rescale per batch
//      (OnlineSoftmax::update_chunk_fma: the same d_j as above, relative to the thread's m);
//      block merge of the states; pass 2 re-reads the row (evict-first) and writes. No dynamic
//      shared memory; static: 2 * kBlockThreads/32 (m, d) pairs of 8 bytes.
//      64-bit row offsets; column indices are int (cols < 2^31; tested at 2^24).
//
// Roofline: memory-bound (about 8 instructions per element). Bytes = rows * cols * (sizeof(InT)
// + sizeof(OutT)) for paths 0 and 1 (read once, write once); path 2 reads the input twice, so
// its ceiling is 2/3 of copy bandwidth (less where L2 serves the second read). Target: >= 90% of
// the device-to-device copy bandwidth for paths 0 and 1 at large rows * cols.
//
// Ladder (f16 path 0 at cols 1024 and 128; each step measured on the H200, the numbers in this
// folder's NOTES.md):
//   1. first version: t = in * s rounded into registers, per-element masking selects, ex2
//      without .ftz for subnormal outputs.
//   2. prefetching the next rows into a second register buffer: slower (96 -> 128 registers,
//      fewer warps per SM); dropped.
//   3. raw packs kept as 32-bit words (no PRMT per 16-bit element), masked columns filled with
//      the input-type infinity instead of per-element selects, max over unscaled inputs and
//      d = fma(in, s, -m) (no FMUL per element), ex2.ftz with the +1 bias instead of the
//      4-instruction subnormal fix-up: faster on both row lengths (68 registers instead of 96).
//   4. paths 1 and 2 switched to the same fma form (accuracy on huge logits; speed unchanged).
//   5. grid-stride loop bounded per CTA instead of per warp: ptxas proves convergence at the
//      shuffles and drops their non-converged fallbacks (and an 8-byte stack frame on sm_80),
//      which the short rows gain from.
//   6. tunings 1 and 2 (warp-nc, warp-v2) for the shapes still behind torch (fp32 cols 128,
//      log_softmax fp32 cols 1024): the load hint alone changes nothing; the prefetch of tuning 2
//      gains on 128-column rows and nothing on 1024 columns, so Auto takes it for short rows only.
//   7. evict-first output stores (st.global.cs) on paths 0-2: faster at cols 128, 1024 and 4096.
//      More waves per grid, 256/512-thread CTAs or two rows per warp were level or slower.
//
// Launch contract (the Rust side upholds it; see the static_asserts below):
//   * kPack > 1 only when in and out are 16-byte aligned and in_stride, out_stride are multiples
//     of kPack; kPack * sizeof(InT) <= 16 (kPack = 16 / sizeof(InT), a smaller power of two, or
//     1). cols need not be a multiple of kPack (the tail is handled element-wise). Output packs
//     wider than 16 bytes (f16 in, f32 out) are stored as 16-byte pieces.
//   * Path 0: kWarpWidth in {1, 2, 4, 8, 16, 32}; kColsPerThread a multiple of kPack, at most 32
//     (any such value, not only powers of two); cols <= kWarpWidth * kColsPerThread;
//     kRowsPerWarp in {1, 2}; kBlockThreads a multiple of 32 (128 is what was tuned);
//     kWarpTuning in {0, 1, 2} (any grid is correct for each; 2 is meant for one wave).
//   * Paths 1 and 2: kBlockThreads a multiple of 32 in [128, 1024]; path 1 needs the dynamic
//     shared memory above.
//   * scale_log2e finite and non-zero (path 0 picks max or min of the inputs by its sign).
//   * rows < 2^62, cols < 2^31.

#include "tessera/common.cuh"
#include "tessera/dtype.cuh"
#include "tessera/vec.cuh"
#include "tessera/math.cuh"
#include "tessera/reduce.cuh"
#include "tessera/online_softmax.cuh"

// ---- specialisation constants -------------------------------------------------------------------
// The generated preamble defines TS_GENERATED_PREAMBLE and the constants below; these defaults
// only make the file compile on its own (editor, standalone checks).
#ifndef TS_GENERATED_PREAMBLE
using InT = ts::f16;
using OutT = ts::f16;
constexpr bool kLogSoftmax = false;
constexpr int kPath = 0;
constexpr int kBlockThreads = 128;
constexpr int kPack = 8;
constexpr int kColsPerThread = 8;
constexpr int kRowsPerWarp = 1;
constexpr int kWarpWidth = 32;
constexpr int kWarpTuning = 0;
#endif

static_assert(kPath == 0 || kPath == 1 || kPath == 2, "kPath must be 0, 1 or 2");
static_assert(kBlockThreads % 32 == 0 && kBlockThreads >= 32 && kBlockThreads <= 1024,
              "kBlockThreads must be a multiple of 32 in [32, 1024]");
static_assert(kPath == 0 || kBlockThreads >= 128, "block paths use 128..1024 threads");
static_assert(kPack >= 1 && ts::is_pow2(kPack) && kPack * (int)sizeof(InT) <= 16,
              "kPack must be a power of two with kPack * sizeof(InT) <= 16");
static_assert(kPath != 0 || (ts::is_pow2(kWarpWidth) && kWarpWidth <= 32),
              "kWarpWidth must be 1, 2, 4, 8, 16 or 32");
static_assert(kPath != 0 || (kColsPerThread % kPack == 0 && kColsPerThread >= kPack && kColsPerThread <= 32),
              "kColsPerThread must be a multiple of kPack, at most 32");
static_assert(kPath != 0 || kRowsPerWarp == 1 || kRowsPerWarp == 2, "kRowsPerWarp must be 1 or 2");
static_assert(kWarpTuning >= 0 && kWarpTuning <= 2 && (kPath == 0 || kWarpTuning == 0),
              "kWarpTuning: 0, 1 or 2, warp path only");
static_assert(ts::is_same_v<InT, float> || ts::is_same_v<InT, ts::f16> || ts::is_same_v<InT, ts::bf16>,
              "InT must be float, ts::f16 or ts::bf16 (path 0 masks with the input type's infinity)");
static_assert(ts::is_storage_type_v<OutT>, "unsupported OutT");

// ---- parameters (mirrored by #[repr(C)] SoftmaxParams in softmax/plan.rs) ------------------------
struct SoftmaxParams {
  const void* in;         // rows x cols InT, row i at in + i * in_stride elements
  void* out;              // OutT, row stride out_stride elements; may alias in exactly
  long long rows;
  long long cols;
  long long in_stride;    // elements, >= cols
  long long out_stride;   // elements, >= cols
  float scale_log2e;      // scale * log2(e)
  float scale;            // the user's scale (informational; the kernel uses scale_log2e)
};
// Offsets: in 0, out 8, rows 16, cols 24, in_stride 32, out_stride 40, scale_log2e 48, scale 52.
static_assert(sizeof(SoftmaxParams) == 56 && alignof(SoftmaxParams) == 8,
              "SoftmaxParams layout changed: update the Rust mirror");

namespace softmax {

constexpr int kWarps = kBlockThreads / ts::kWarpSize;
/// Packs loaded per thread before any is consumed (block paths): 4 x 16 B in flight per thread.
constexpr int kUnroll = 4;
/// Cache hints: inputs read once are evict-first. Outputs are stored evict-first too
/// (st.global.cs): they still land in L2, where a small output stays for the next kernel, but a
/// large one is the first to leave, before lines still to be read: faster than the default
/// write-back policy at every row length measured. The cluster kernels (softmax_cluster.cu)
/// keep write-back stores: evict-first did not pay there (see this folder's NOTES.md).
constexpr ts::CacheLoad kLoadOnce = ts::CacheLoad::kStreaming;
constexpr ts::CacheLoad kLoadKeep = ts::CacheLoad::kNoAllocate;
constexpr ts::CacheStore kStoreHint = ts::CacheStore::kStreaming;
/// Warp-path tunings (Rust: the "warp", "warp-nc" and "warp-v2" paths): 0 loads evict-first
/// (.cs); 1 loads with L1::no_allocate and the default L2 policy; 2 as 1, and for rows of at
/// most kMaxPrefetchBytes per lane each lane group also loads its rows of the next grid-stride
/// iteration before reducing the current ones (a register double buffer; the Rust side then
/// launches one wave of resident CTAs, so every CTA runs several iterations); longer rows get
/// an occupancy floor instead (kWarpOccupancyFloor).
constexpr ts::CacheLoad kWarpLoad = kWarpTuning == 0 ? kLoadOnce : ts::CacheLoad::kNoAllocate;
/// Input bytes per lane per iteration up to which tuning 2 prefetches (two 16-byte packs: short
/// rows, where the second buffer costs 0-11 registers; the ladder's step 2 found a prefetch of
/// 1024-column rows slower: 96 -> 128 registers).
constexpr int kMaxPrefetchBytes = 32;
constexpr bool kWarpPrefetch =
    kWarpTuning == 2 && kRowsPerWarp * kColsPerThread * (int)sizeof(InT) <= kMaxPrefetchBytes;
/// Tuning 2 without the prefetch, for rows of more than kFloorMinBytes input bytes per lane
/// (fp32 rows of 513..1024 columns): CTAs of 128 threads per SM asked of ptxas, a 72-register
/// cap (896 threads per SM; the heuristic gives fp32 1024-column rows 75-83 registers: 5-6
/// CTAs; 16-bit rows stay at their 56-62). Only for 16-byte variants on sm_90+: a 64-register
/// cap spilled 8-40 bytes on sm_90a (fp32 1024 columns), the 72-register cap 8 bytes on
/// sm_80..89 (log_softmax fp32) and 8-52 bytes for scalar variants of 30-32 columns per lane.
/// 0 = no floor (the heuristic).
constexpr int kFloorMinBytes = 64;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
constexpr int kWarpOccupancyFloor =
    kPack > 1 && kRowsPerWarp * kColsPerThread * (int)sizeof(InT) > kFloorMinBytes ? 7 : 0;
#else
constexpr int kWarpOccupancyFloor = 0;
#endif

using InPack = ts::Pack<InT, kPack>;
/// An InPack as 32-bit words (itself when smaller than a word): what path 0 keeps in registers.
using RawWords =
    ts::conditional_t<(sizeof(InPack) >= 4), ts::Array<uint32_t, (int)(sizeof(InPack) + 3) / 4>, InPack>;

/// Softmax outputs are 2^(d + kProbBias) * (kProbScale / sum) (ts::softmax_prob_bias: 1, or 0 for
/// fp16 outputs); path 0 folds the bias into its FMA.
constexpr float kProbBias = ts::softmax_prob_bias<OutT>;
constexpr float kProbScale = ts::softmax_prob_scale<OutT>;
/// Path 0 keeps the clamp of d_j on every row for 16-bit and scalar-loaded inputs: the
/// clamp-free copy of the term loop (taken where ts::clamp_may_act(m) is false) gained on fp32
/// 1024-column rows (75 -> 70 registers) but cost the 16-bit kernels registers (fp16 cols 1024:
/// 56 -> 63) and time, and the scalar fp32 ones up to 52 registers (cols 960: 64 -> 116; see this
/// folder's NOTES.md).
constexpr bool kWarpClampAlways = sizeof(InT) < 4 || kPack == 1;

/// The per-row output transform of paths 1 and 2, built once the row max m = max_j round(x_j * s)
/// and the sum of 2^(x * s - m) (as ts::exp2_fma computes its terms) are known.
struct RowFinish {
  float s;          // scale_log2e
  float neg_shift;  // -softmax_shift(m): -m, or 0 for an all -inf row
  float coef;       // softmax: 2^-kProbBias / sum (0 for an all -inf row);
                    // log_softmax: -ln(sum) (0 for an all -inf row); NaN for a NaN row

  TS_DEVICE static RowFinish make(float s, float m, float sum) {
    RowFinish f;
    f.s = s;
    f.neg_shift = -ts::softmax_shift(m);
    if constexpr (kLogSoftmax) {
      f.coef = sum == 0.0f ? 0.0f : -logf(sum);   // once per row: the accurate logf
    } else {
      f.coef = sum == 0.0f ? 0.0f : kProbScale * ts::fast_rcp(sum);
    }
    if (ts::is_nan(m)) f.coef = m;
    return f;
  }
  TS_DEVICE float operator()(float x) const {
    const float d = ts::shifted_fma(x, s, neg_shift);
    if constexpr (kLogSoftmax) {
      return fmaf(d, ts::kLn2, coef);
    } else if constexpr (kProbBias != 0.0f) {
      return ts::exp2_approx(d + kProbBias) * coef;
    } else {
      return ts::exp2_approx(d) * coef;
    }
  }
};

// =================================================================================================
// Path 0: a group of kWarpWidth lanes per row, kRowsPerWarp rows per group, row in registers.
//
// Registers hold the unscaled inputs x (converted to f32). With s = scale_log2e:
//   m   = max_j round(x_j * s), found as round(s * max_j x_j) (s > 0) or round(s * min_j x_j)
//         (s < 0): rounding is monotonic, so this is the same value without a multiply per element;
//   d_j = min(fma(x_j, s, b - shift), b + 1) with b = 0 (log_softmax) or kProbBias (softmax),
//         the min left out on fp32 rows where it cannot act (kWarpClampAlways).
// The fma keeps x_j * s unrounded, and the same d_j feeds the sum and the output, so the max
// element's residual x*s - m cancels between numerator and denominator. The clamp at b + 1 only
// acts on +inf - +inf = NaN (an exact d_j is <= b plus a sub-ulp residual): every +inf element then
// gets 2^(b+1) and the row normalises to 1/k each (log: (b+1) ln 2 - ln(k 2^(b+1)) = -ln k).
// Masked columns and rows are filled with the input-type infinity that x * s maps to -inf.
// =================================================================================================
TS_DEVICE void softmax_warp_rows(const SoftmaxParams& p) {
  constexpr int kW = kWarpWidth;
  constexpr int kR = kRowsPerWarp;
  constexpr int kC = kColsPerThread;
  constexpr int kSlots = kC / kPack;                       // packs per row per lane
  constexpr int kRowsPerWarpIter = (ts::kWarpSize / kW) * kR;
  constexpr float kBias = kLogSoftmax ? 0.0f : kProbBias;

  const InT* in = static_cast<const InT*>(p.in);
  OutT* out = static_cast<OutT*>(p.out);
  const long long rows = p.rows, in_stride = p.in_stride, out_stride = p.out_stride;
  const int cols = (int)p.cols;
  const float s = p.scale_log2e;
  const bool positive = s > 0.0f;                          // uniform; s != 0 (validated on the host)
  const int lane = ts::lane_id();
  const int group = lane / kW;        // which row group of the warp
  const int gl = lane % kW;           // lane within the group

  // What a masked element holds: an infinity that the scale maps to -inf.
  const InT fill = ts::from_float<InT>(positive ? ts::kNegInf : ts::kPosInf);
  InPack fill_pack;
#pragma unroll
  for (int k = 0; k < kPack; ++k) fill_pack[k] = fill;
  const RawWords fill_words = ts::bit_cast<RawWords>(fill_pack);

  // The loop runs over CTA-sized row blocks, so its bound depends on blockIdx / gridDim only:
  // ptxas sees a CTA-uniform branch and knows every warp is converged at the full-mask shuffles
  // below (with a per-warp bound it also emits a non-converged fallback for each shuffle, which
  // on sm_80 can be outlined into a subroutine with a stack frame). Rows past the end take part
  // masked.
  constexpr long long kRowsPerCta = (long long)kWarps * kRowsPerWarpIter;
  const long long step = (long long)gridDim.x * kRowsPerCta;
  const long long lane_row = (long long)ts::warp_id() * kRowsPerWarpIter + (long long)group * kR;

  // Loads the kR rows from row0 into raw (rows >= rows and columns >= cols get the fill).
  // A pack straddling `cols` (only when cols % kPack != 0) is read element by element.
  auto load_rows = [&](long long row0, RawWords (&raw)[kR][kSlots]) {
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      const bool valid = row0 + r < rows;
      const InT* src = in + (row0 + r) * in_stride;
#pragma unroll
      for (int j = 0; j < kSlots; ++j) {
        const int c = (j * kW + gl) * kPack;
        // raw holds 32-bit words and is only assigned whole packs: element-typed registers
        // merged across these branches would cost one PRMT per 16-bit element.
        if (valid && c + kPack <= cols) {
          raw[r][j] = ts::bit_cast<RawWords>(ts::load_pack<kPack, kWarpLoad>(src + c));
        } else if (kPack > 1 && valid && c < cols) {
          InPack pk = fill_pack;
#pragma unroll
          for (int k = 0; k < kPack; ++k) {
            if (c + k < cols) pk[k] = ts::load_scalar<kWarpLoad>(src + c + k);
          }
          raw[r][j] = ts::bit_cast<RawWords>(pk);
        } else {
          raw[r][j] = fill_words;
        }
      }
    }
  };

  RawWords raw[kR][kSlots];
  if constexpr (kWarpPrefetch) load_rows((long long)blockIdx.x * kRowsPerCta + lane_row, raw);
  for (long long cta_base = (long long)blockIdx.x * kRowsPerCta; cta_base < rows; cta_base += step) {
    const long long row0 = cta_base + lane_row;

    // ---- load: every access of the iteration first (with kWarpPrefetch: this iteration's rows
    // are already in raw; the next iteration's loads are issued before any reduction) ----
    [[maybe_unused]] RawWords next[kR][kSlots];
    if constexpr (kWarpPrefetch) {
      load_rows(row0 + step, next);
    } else {
      load_rows(row0, raw);
    }
    float x[kR][kC];
#pragma unroll
    for (int r = 0; r < kR; ++r) {
#pragma unroll
      for (int j = 0; j < kSlots; ++j) {
        const ts::Array<float, kPack> f = ts::to_floats(ts::bit_cast<InPack>(raw[r][j]));
#pragma unroll
        for (int k = 0; k < kPack; ++k) x[r][j * kPack + k] = f[k];
      }
    }

    // ---- row max of x * s (NaN-propagating), over the lane's slots then the group ----
    float m[kR];
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      float v = x[r][0];
      if (positive) {
#pragma unroll
        for (int i = 1; i < kC; ++i) v = ts::max_nan(v, x[r][i]);
      } else {
#pragma unroll
        for (int i = 1; i < kC; ++i) v = ts::min_nan(v, x[r][i]);
      }
      m[r] = ts::warp_allreduce_max<kW>(__fmul_rn(v, s));
    }

    // ---- d = x * s - m (+ bias), the sum of 2^d; softmax keeps 2^d for the write ----
    float coef[kR];
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      const float shift = kBias - ts::softmax_shift(m[r]);
      float sum = 0.0f;
      // the clamp only where it can act (ts::clamp_may_act: +inf, NaN or huge rows); the same d
      auto terms = [&](auto clamp) {
#pragma unroll
        for (int i = 0; i < kC; ++i) {
          const float f = fmaf(x[r][i], s, shift);
          float d = f;
          if constexpr (decltype(clamp)::value) d = fminf(f, kBias + 1.0f);
          if constexpr (kLogSoftmax) {
            x[r][i] = d;
            sum += ts::exp2_approx(d);
          } else {
            x[r][i] = ts::exp2_approx(d);
            sum += x[r][i];
          }
        }
      };
      if (kWarpClampAlways || ts::clamp_may_act(m[r])) {
        terms(ts::bool_constant<true>{});
      } else {
        terms(ts::bool_constant<false>{});
      }
      sum = ts::warp_allreduce_sum<kW>(sum);
      if constexpr (kLogSoftmax) {
        coef[r] = sum == 0.0f ? 0.0f : -logf(sum);
      } else {
        coef[r] = sum == 0.0f ? 0.0f : ts::fast_rcp(sum);
      }
      if (ts::is_nan(m[r])) coef[r] = m[r];
    }

    // ---- write ----
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      if (row0 + r >= rows) continue;
      OutT* dst = out + (row0 + r) * out_stride;
#pragma unroll
      for (int j = 0; j < kSlots; ++j) {
        const int c = (j * kW + gl) * kPack;
        ts::Array<float, kPack> o;
#pragma unroll
        for (int k = 0; k < kPack; ++k) {
          const float v = x[r][j * kPack + k];
          o[k] = kLogSoftmax ? fmaf(v, ts::kLn2, coef[r]) : v * coef[r];
        }
        if (c + kPack <= cols) {
          ts::store_floats<kStoreHint>(dst + c, o);
        } else if (kPack > 1 && c < cols) {
#pragma unroll
          for (int k = 0; k < kPack; ++k) {
            if (c + k < cols) ts::store_scalar<kStoreHint>(dst + c + k, ts::from_float<OutT>(o[k]));
          }
        }
      }
    }
    if constexpr (kWarpPrefetch) {
#pragma unroll
      for (int r = 0; r < kR; ++r) {
#pragma unroll
        for (int j = 0; j < kSlots; ++j) raw[r][j] = next[r][j];
      }
    }
  }
}

// =================================================================================================
// Path 1: a CTA per row, the row cached in shared memory as f32.
// =================================================================================================
template <typename Ext>
TS_DEVICE void block_cached_rows(const SoftmaxParams& p, float (&red)[2][kWarps]) {
  constexpr int kT = kBlockThreads;
  constexpr int kChunk = kPack < 4 ? kPack : 4;     // floats per shared-memory access
  constexpr int kPlanes = kPack / kChunk;           // shared-memory planes per pack
  using Chunk = ts::Array<float, kChunk>;

  float* cache = ts::dynamic_smem<float>();
  Chunk* chunks = reinterpret_cast<Chunk*>(cache);

  const InT* in = static_cast<const InT*>(p.in);
  OutT* out = static_cast<OutT*>(p.out);
  const long long rows = p.rows, in_stride = p.in_stride, out_stride = p.out_stride;
  const int cols = (int)p.cols;
  const int packs = cols / kPack;                   // full packs
  const int tail = packs * kPack;                   // cols - tail < kPack <= kT: <= 1 element per thread
  const float s = p.scale_log2e;
  const int tid = ts::thread_id();

  for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
    const InT* src = in + row * in_stride;
    OutT* dst = out + row * out_stride;

    // ---- pass A: global -> shared (x as f32), running extreme of x ----
    float ext = Ext::kIdentity;
    auto stash = [&](int q, const InPack& pk) {
      const ts::Array<float, kPack> f = ts::to_floats(pk);
#pragma unroll
      for (int h = 0; h < kPlanes; ++h) {
        Chunk ch;
#pragma unroll
        for (int k = 0; k < kChunk; ++k) {
          ch[k] = f[h * kChunk + k];
          ext = Ext{}(ext, ch[k]);
        }
        chunks[h * packs + q] = ch;
      }
    };
    int q = tid;
    for (; q + (kUnroll - 1) * kT < packs; q += kUnroll * kT) {
      InPack raw[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) raw[u] = ts::load_pack<kPack, kLoadOnce>(src + (q + u * kT) * kPack);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) stash(q + u * kT, raw[u]);
    }
    for (; q < packs; q += kT) stash(q, ts::load_pack<kPack, kLoadOnce>(src + q * kPack));
    if (const int c = tail + tid; c < cols) {
      const float v = ts::to_float(ts::load_scalar<kLoadOnce>(src + c));
      cache[c] = v;
      ext = Ext{}(ext, v);
    }
    const float m = ts::block_allreduce_max<kT>(__fmul_rn(ext, s), red[0]);

    // ---- pass B: sum from shared memory (own slots only) ----
    const float neg_shift = -ts::softmax_shift(m);
    float sum = 0.0f;
#pragma unroll 4
    for (int q2 = tid; q2 < packs; q2 += kT) {
#pragma unroll
      for (int h = 0; h < kPlanes; ++h) {
        const Chunk ch = chunks[h * packs + q2];
#pragma unroll
        for (int k = 0; k < kChunk; ++k) sum += ts::exp2_fma(ch[k], s, neg_shift);
      }
    }
    if (const int c = tail + tid; c < cols) sum += ts::exp2_fma(cache[c], s, neg_shift);
    // red[1] vs red[0]: the barrier inside this reduction also orders the next row's red[0]
    // writes after every thread's red[0] reads above (see reduce.cuh).
    const RowFinish fin = RowFinish::make(s, m, ts::block_allreduce_sum<kT>(sum, red[1]));

    // ---- pass C: shared -> global ----
#pragma unroll 2
    for (int q2 = tid; q2 < packs; q2 += kT) {
      ts::Array<float, kPack> o;
#pragma unroll
      for (int h = 0; h < kPlanes; ++h) {
        const Chunk ch = chunks[h * packs + q2];
#pragma unroll
        for (int k = 0; k < kChunk; ++k) o[h * kChunk + k] = fin(ch[k]);
      }
      ts::store_floats<kStoreHint>(dst + q2 * kPack, o);
    }
    if (const int c = tail + tid; c < cols) {
      ts::store_scalar<kStoreHint>(dst + c, ts::from_float<OutT>(fin(cache[c])));
    }
  }
}

/// The row extreme is a max of x for s > 0 and a min for s < 0 (the max of x * s either way):
/// one instantiation per sign keeps it a single FMNMX per element.
TS_DEVICE void softmax_block_cached(const SoftmaxParams& p) {
  __shared__ float red[2][kWarps];
  if (p.scale_log2e > 0.0f) {
    block_cached_rows<ts::MaxOp>(p, red);
  } else {
    block_cached_rows<ts::MinOp>(p, red);
  }
}

// =================================================================================================
// Path 2: a CTA per row, two passes over global memory with an online (m, d) state.
// =================================================================================================
template <typename Ext>
TS_DEVICE void block_uncached_rows(const SoftmaxParams& p, ts::OnlineSoftmax (&red)[2][kWarps]) {
  constexpr int kT = kBlockThreads;

  const InT* in = static_cast<const InT*>(p.in);
  OutT* out = static_cast<OutT*>(p.out);
  const long long rows = p.rows, in_stride = p.in_stride, out_stride = p.out_stride;
  const int cols = (int)p.cols;
  const int packs = cols / kPack;
  const int tail = packs * kPack;                   // cols - tail < kPack <= kT: <= 1 element per thread
  const float s = p.scale_log2e;
  const int tid = ts::thread_id();
  int parity = 0;

  // Folds N inputs into the thread's state: one extreme, one rescale, N exp2.
  auto fold = [&](ts::OnlineSoftmax& st, const auto& x) {
    float ext = x[0];
#pragma unroll
    for (int i = 1; i < x.size(); ++i) ext = Ext{}(ext, x[i]);
    st.update_chunk_fma(x, s, __fmul_rn(ext, s));
  };

  for (long long row = blockIdx.x; row < rows; row += gridDim.x, parity ^= 1) {
    const InT* src = in + row * in_stride;
    OutT* dst = out + row * out_stride;

    // ---- pass 1: per-thread online state ----
    ts::OnlineSoftmax st = ts::OnlineSoftmax::empty();
    int q = tid;
    for (; q + (kUnroll - 1) * kT < packs; q += kUnroll * kT) {
      InPack raw[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) raw[u] = ts::load_pack<kPack, kLoadKeep>(src + (q + u * kT) * kPack);
      ts::Array<float, kUnroll * kPack> x;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const ts::Array<float, kPack> f = ts::to_floats(raw[u]);
#pragma unroll
        for (int k = 0; k < kPack; ++k) x[u * kPack + k] = f[k];
      }
      fold(st, x);
    }
    for (; q < packs; q += kT) fold(st, ts::to_floats(ts::load_pack<kPack, kLoadKeep>(src + q * kPack)));
    if (const int c = tail + tid; c < cols) {
      ts::Array<float, 1> x;
      x[0] = ts::to_float(ts::load_scalar<kLoadKeep>(src + c));
      fold(st, x);
    }

    // Alternating buffers: the next row's writes to red[parity ^ 1] come after this reduction's
    // barrier, which every thread reaches only after reading the previous row's red[parity ^ 1].
    st = ts::block_allreduce_softmax<kT>(st, red[parity]);
    const RowFinish fin = RowFinish::make(s, st.m, st.d);

    // ---- pass 2: re-read (each element by the thread that then writes it), write ----
    q = tid;
    for (; q + (kUnroll - 1) * kT < packs; q += kUnroll * kT) {
      InPack raw[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) raw[u] = ts::load_pack<kPack, kLoadOnce>(src + (q + u * kT) * kPack);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const ts::Array<float, kPack> f = ts::to_floats(raw[u]);
        ts::Array<float, kPack> o;
#pragma unroll
        for (int k = 0; k < kPack; ++k) o[k] = fin(f[k]);
        ts::store_floats<kStoreHint>(dst + (q + u * kT) * kPack, o);
      }
    }
    for (; q < packs; q += kT) {
      const ts::Array<float, kPack> f = ts::to_floats(ts::load_pack<kPack, kLoadOnce>(src + q * kPack));
      ts::Array<float, kPack> o;
#pragma unroll
      for (int k = 0; k < kPack; ++k) o[k] = fin(f[k]);
      ts::store_floats<kStoreHint>(dst + q * kPack, o);
    }
    if (const int c = tail + tid; c < cols) {
      const float v = ts::to_float(ts::load_scalar<kLoadOnce>(src + c));
      ts::store_scalar<kStoreHint>(dst + c, ts::from_float<OutT>(fin(v)));
    }
  }
}

TS_DEVICE void softmax_block_uncached(const SoftmaxParams& p) {
  __shared__ ts::OnlineSoftmax red[2][kWarps];
  if (p.scale_log2e > 0.0f) {
    block_uncached_rows<ts::MaxOp>(p, red);
  } else {
    block_uncached_rows<ts::MinOp>(p, red);
  }
}

}  // namespace softmax

// =================================================================================================
// Entry point: one path per compiled variant.
// =================================================================================================
// Without a minimum-blocks hint, ptxas picks a register target for occupancy and sometimes
// spills to reach it (seen on sm_90a: block paths squeezed to 32 registers at 1024 threads; 21
// of 3640 warp-path variants, all with a widening output (f16/bf16 -> f32) or with
// kColsPerThread > kPack at kWarpWidth < 32, 4-76 bytes at 48-80 registers; on sm_86/sm_89,
// log_softmax tiles of 2 rows x 24 columns, 8-20 bytes at 80-96 registers). An explicit minimum
// replaces the heuristic by a plain cap: block paths ask for 1024 resident threads per SM (a
// 64-register cap, ~45 used); those warp-path variants for one CTA (255-register cap: they use
// what the row needs). Other warp-path variants keep the heuristic (0 = no minimum): it is
// faster there (fewer registers, more warps; e.g. f16 cols 768: 64 vs 80 registers).
constexpr bool kWarpNeedsCap = sizeof(OutT) > sizeof(InT) ||
                              (kWarpWidth < 32 && kColsPerThread > kPack) ||
                              kRowsPerWarp * kColsPerThread > 32;
constexpr bool kWarpFloor = kWarpTuning == 2 && !softmax::kWarpPrefetch && softmax::kWarpOccupancyFloor > 0;
constexpr int kMinBlocksPerSm = kPath != 0   ? 1024 / kBlockThreads
                                : kWarpFloor ? softmax::kWarpOccupancyFloor
                                : kWarpNeedsCap ? 1
                                                : 0;

extern "C" __global__ void __launch_bounds__(kBlockThreads, kMinBlocksPerSm)
    softmax_kernel(const __grid_constant__ SoftmaxParams p) {
  ts::wait_prior_grids();  // programmatic dependent launch: no global access before this
  ts::allow_dependent_grids();
  if constexpr (kPath == 0) {
    softmax::softmax_warp_rows(p);
  } else if constexpr (kPath == 1) {
    softmax::softmax_block_cached(p);
  } else {
    softmax::softmax_block_uncached(p);
  }
}
