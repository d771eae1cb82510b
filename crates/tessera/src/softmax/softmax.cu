// softmax.cu: row-wise softmax / log_softmax over the last dimension, f32 compute.
//
// What. For each row i of a rows x cols matrix (row i at in + i * in_stride elements), with
// x = scale * in:
//     softmax     = exp(x - max) / sum,            sum = sum_j exp(x_j - max)
//     log_softmax = x - max - ln(sum)
// computed in the log2 domain: t = in * scale_log2e (host-computed scale * log2 e),
// e_j = 2^(t_j - m) with m = max_j t_j, softmax = e_j / sum_j e_j,
// log_softmax = (t_j - m) * ln 2 - ln(sum_j e_j). (`scale` itself is not needed by the kernel:
// (t - m) * ln 2 is scale * (in - in_max) with one rounding less than scale*in - m*ln 2.)
// Special rows, exactly as the CPU reference (reference.rs):
//   * any NaN in the row (also 0 * inf from the scale): the whole output row is NaN
//     (the row max is NaN-propagating, the row's 1/sum or -ln(sum) is forced to NaN);
//   * every element -inf: softmax 0 everywhere, log_softmax -inf everywhere, no NaN;
//   * k elements +inf: they share the mass (softmax 1/k, log_softmax -ln k), the rest get 0 /
//     -inf (t - m is taken as 0 where t == m == +inf: see tessera/online_softmax.cuh).
//   The shifted exponent is min(t - shift, 0) with shift = m (0 when m = -inf); min drops the
//   NaN of +inf - +inf. Probabilities use ex2.approx without .ftz, so outputs down to the
//   subnormal range (< 1.18e-38) are kept rather than flushed.
//   Caveat: t is f32, so |scale * in| * log2 e beyond 3.4e38 overflows to +-inf and is treated
//   as an infinity (the f64 reference still sees a finite value there).
//
// Layout. InT in, OutT out, both row-major with element row strides (in_stride, out_stride >=
// cols). out may alias in exactly (out == in and out_stride == in_stride): every element is read
// by the thread that later writes it, and all of a row's reads happen before any of its writes
// (path 0: registers; path 1: a row is fully cached before the block reduction; path 2: pass 2
// reads each element in the same thread just before writing it, after the block reduction that
// ends pass 1). Rows never overlap (stride >= cols).
//
// Paths (kPath, one per compiled variant), all grid-striding over rows so any grid is correct:
//   0  warp per row(s): a group of kWarpWidth lanes (32, or 16/8/4/2/1 for short rows: several
//      groups per warp) owns kRowsPerWarp rows at a time. Lane l of a group holds, for pack slot
//      j < kColsPerThread / kPack, the kPack columns starting at (j * kWarpWidth + l) * kPack
//      (consecutive lanes read consecutive 16-byte chunks), so a row may have up to
//      kWarpWidth * kColsPerThread columns. Columns >= cols are -inf in registers and not
//      stored; a pack straddling `cols` is loaded/stored element by element. All loads of the
//      iteration are issued first, then max (sub-warp butterfly), sum, write. No shared memory.
//      Block kBlockThreads (128) threads; rows per CTA iteration
//      rows_per_cta = (kBlockThreads / kWarpWidth) * kRowsPerWarp.
//      grid = min(ceil(rows / rows_per_cta), cap).
//   1  block per row, row cached in shared memory: one CTA of kBlockThreads (128..1024) per row,
//      grid = min(rows, cap). Pass A streams the row from global once (batches of kUnroll
//      16-byte loads per thread), stores t = in * scale_log2e in shared memory as f32 and keeps
//      a running max; block max; pass B sums from shared memory; block sum; pass C writes from
//      shared memory. Each thread only ever touches its own shared-memory slots (same index
//      mapping in all passes), so rows need no barrier besides the two reductions.
//      Dynamic shared memory: exactly round_up(cols * 4, 16) bytes (Rust passes it and raises
//      cudaFuncAttributeMaxDynamicSharedMemorySize above 48 KiB). Shared-memory layout: the
//      P = cols / kPack full packs are stored as kPack/4 planes of float4 chunks (plane h holds
//      floats 4h..4h+3 of every pack: chunk index h * P + q), so a warp's 16-byte chunk
//      stores/loads hit consecutive addresses (no bank conflicts); the cols % kPack tail floats
//      follow at P * kPack. Static shared memory: 2 * kBlockThreads/32 floats.
//   2  block per row, uncached: one CTA (128..1024 threads) per row, grid = min(rows, cap).
//      Pass 1 reads the row (L1::no_allocate, keeping it in L2 for pass 2) folding each batch of
//      kUnroll packs into a per-thread OnlineSoftmax state (m, d) with one rescale per batch;
//      block merge of the states; pass 2 re-reads the row (evict-first) and writes. No dynamic
//      shared memory; static: 2 * kBlockThreads/32 (m, d) pairs. 64-bit row offsets; columns are
//      int (cols < 2^31; tested up to 2^24).
//
// Roofline: memory-bound (a few flops per element). Bytes = rows * cols * (sizeof(InT) +
// sizeof(OutT)) for paths 0 and 1 (read once, write once); path 2 reads the input twice (the
// second read partly from L2). Target >= 90% of the device-to-device copy bandwidth for paths
// 0 and 1 at large rows * cols. Accesses are 16 bytes per thread when kPack > 1.
//
// Launch contract (the Rust side upholds it; see the static_asserts below):
//   * kPack > 1 only when in and out are 16-byte aligned and in_stride, out_stride are multiples
//     of kPack; kPack * sizeof(InT) <= 16 (kPack = 16 / sizeof(InT) or 1). cols need not be a
//     multiple of kPack (the tail is handled element-wise).
//   * Path 0: kWarpWidth in {1, 2, 4, 8, 16, 32}, kColsPerThread a multiple of kPack, at most 32,
//     cols <= kWarpWidth * kColsPerThread, kRowsPerWarp in {1, 2}, kBlockThreads a multiple of 32.
//   * Paths 1 and 2: kBlockThreads a multiple of 32 in [128, 1024]; path 1 needs the dynamic
//     shared memory above.
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
#endif

static_assert(kPath == 0 || kPath == 1 || kPath == 2, "kPath must be 0, 1 or 2");
static_assert(kBlockThreads % 32 == 0 && kBlockThreads >= 32 && kBlockThreads <= 1024,
              "kBlockThreads must be a multiple of 32 in [32, 1024]");
static_assert(kPath == 0 || kBlockThreads >= 128, "block paths use 128..1024 threads");
static_assert(kPack >= 1 && ts::is_pow2(kPack) && kPack * (int)sizeof(InT) <= 16,
              "kPack must be a power of two with kPack * sizeof(InT) <= 16");
static_assert(kPath != 0 || (ts::is_pow2(kWarpWidth) && kWarpWidth <= 32), "kWarpWidth must be 1, 2, 4, 8, 16 or 32");
static_assert(kPath != 0 || (kColsPerThread % kPack == 0 && kColsPerThread >= kPack && kColsPerThread <= 32),
              "kColsPerThread must be a multiple of kPack, at most 32");
static_assert(kPath != 0 || kRowsPerWarp == 1 || kRowsPerWarp == 2, "kRowsPerWarp must be 1 or 2");
static_assert(ts::is_storage_type_v<InT> && ts::is_storage_type_v<OutT>, "unsupported InT/OutT");

// ---- parameters (mirrored by #[repr(C)] SoftmaxParams in softmax/mod.rs) ------------------------
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
/// Cache hints: inputs read once are evict-first; outputs use the default write-back policy so
/// the next kernel can find them in L2.
constexpr ts::CacheLoad kLoadOnce = ts::CacheLoad::kStreaming;
constexpr ts::CacheLoad kLoadKeep = ts::CacheLoad::kNoAllocate;
constexpr ts::CacheStore kStoreHint = ts::CacheStore::kDefault;

using InPack = ts::Pack<InT, kPack>;

/// The per-row output transform, built once the row max m (log2 domain) and the sum of
/// 2^(t - m) are known.
struct RowFinish {
  float shift;  // softmax_shift(m): m, or 0 for an all -inf row
  float coef;   // softmax: 1/sum (0 for an all -inf row); log_softmax: -ln(sum) (0 then); NaN for a NaN row

  TS_DEVICE static RowFinish make(float m, float sum) {
    RowFinish f;
    f.shift = ts::softmax_shift(m);
    if constexpr (kLogSoftmax) {
      f.coef = sum == 0.0f ? 0.0f : -logf(sum);   // once per row: the accurate logf
    } else {
      f.coef = sum == 0.0f ? 0.0f : ts::fast_rcp(sum);
    }
    if (ts::is_nan(m)) f.coef = m;
    return f;
  }
  /// min(t - m, 0): the log2-domain offset from the max, with the +inf and -inf conventions.
  TS_DEVICE float offset(float t) const { return fminf(t - shift, 0.0f); }
  /// 2^(t - m), subnormal results kept (it is an output).
  TS_DEVICE float prob_unnormalized(float t) const { return ts::exp2_approx_denorm(offset(t)); }
  TS_DEVICE float operator()(float t) const {
    if constexpr (kLogSoftmax) {
      return fmaf(offset(t), ts::kLn2, coef);
    } else {
      return prob_unnormalized(t) * coef;
    }
  }
};

/// 2^(t - m) for a sum only (flushing subnormal terms does not matter next to the max's 1).
TS_DEVICE float sum_term(float t, float shift) { return ts::exp2_shifted(t, shift); }

// =================================================================================================
// Path 0: a group of kWarpWidth lanes per row, kRowsPerWarp rows per group, row in registers.
// =================================================================================================
TS_DEVICE void softmax_warp_rows(const SoftmaxParams& p) {
  constexpr int kW = kWarpWidth;
  constexpr int kR = kRowsPerWarp;
  constexpr int kC = kColsPerThread;
  constexpr int kSlots = kC / kPack;                       // packs per row per lane
  constexpr int kRowsPerWarpIter = (ts::kWarpSize / kW) * kR;

  const InT* in = static_cast<const InT*>(p.in);
  OutT* out = static_cast<OutT*>(p.out);
  const long long rows = p.rows, in_stride = p.in_stride, out_stride = p.out_stride;
  const int cols = (int)p.cols;
  const float scale = p.scale_log2e;
  const int lane = ts::lane_id();
  const int group = lane / kW;        // which row group of the warp
  const int gl = lane % kW;           // lane within the group

  const long long warp_global = (long long)blockIdx.x * kWarps + ts::warp_id();
  const long long step = (long long)gridDim.x * kWarps * kRowsPerWarpIter;
  // The loop bound depends on the warp only, so every lane runs the same iterations and the
  // full-mask shuffles below stay convergent; rows past the end take part masked.
  for (long long base = warp_global * kRowsPerWarpIter; base < rows; base += step) {
    const long long row0 = base + (long long)group * kR;

    // ---- load: every access of the iteration first, then convert ----
    // A pack straddling `cols` (only when cols % kPack != 0) is read element by element; the
    // conversion below masks every column >= cols (and every row >= rows) to -inf.
    InPack raw[kR][kSlots];
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      const bool valid = row0 + r < rows;
      const InT* src = in + (row0 + r) * in_stride;
#pragma unroll
      for (int j = 0; j < kSlots; ++j) {
        const int c = (j * kW + gl) * kPack;
        InPack pk = {};
        if (valid && c + kPack <= cols) {
          pk = ts::load_pack<kPack, kLoadOnce>(src + c);
        } else if (kPack > 1 && valid && c < cols) {
#pragma unroll
          for (int k = 0; k < kPack; ++k) {
            if (c + k < cols) pk[k] = ts::load_scalar<kLoadOnce>(src + c + k);
          }
        }
        raw[r][j] = pk;
      }
    }
    float t[kR][kC];
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      const bool valid = row0 + r < rows;
#pragma unroll
      for (int j = 0; j < kSlots; ++j) {
        const int c = (j * kW + gl) * kPack;
        const ts::Array<float, kPack> f = ts::to_floats(raw[r][j]);
#pragma unroll
        for (int k = 0; k < kPack; ++k) t[r][j * kPack + k] = (valid && c + k < cols) ? f[k] * scale : ts::kNegInf;
      }
    }

    // ---- row max (NaN-propagating), over the lane's slots then the group ----
    float m[kR];
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      float v = t[r][0];
#pragma unroll
      for (int i = 1; i < kC; ++i) v = ts::max_nan(v, t[r][i]);
      m[r] = ts::warp_allreduce_max<kW>(v);
    }

    // ---- sum of 2^(t - m); softmax keeps the exponentials for the write ----
    RowFinish fin[kR];
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      const float shift = ts::softmax_shift(m[r]);
      float s = 0.0f;
#pragma unroll
      for (int i = 0; i < kC; ++i) {
        if constexpr (kLogSoftmax) {
          s += sum_term(t[r][i], shift);
        } else {
          t[r][i] = ts::exp2_approx_denorm(fminf(t[r][i] - shift, 0.0f));
          s += t[r][i];
        }
      }
      fin[r] = RowFinish::make(m[r], ts::warp_allreduce_sum<kW>(s));
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
          const float v = t[r][j * kPack + k];
          o[k] = kLogSoftmax ? fin[r](v) : v * fin[r].coef;
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
  }
}

// =================================================================================================
// Path 1: a CTA per row, the scaled row cached in shared memory as f32.
// =================================================================================================
TS_DEVICE void softmax_block_cached(const SoftmaxParams& p) {
  constexpr int kT = kBlockThreads;
  constexpr int kChunk = kPack < 4 ? kPack : 4;     // floats per shared-memory access
  constexpr int kPlanes = kPack / kChunk;           // shared-memory planes per pack
  using Chunk = ts::Array<float, kChunk>;

  __shared__ float red[2][kWarps];
  float* cache = ts::dynamic_smem<float>();
  Chunk* chunks = reinterpret_cast<Chunk*>(cache);

  const InT* in = static_cast<const InT*>(p.in);
  OutT* out = static_cast<OutT*>(p.out);
  const long long rows = p.rows, in_stride = p.in_stride, out_stride = p.out_stride;
  const int cols = (int)p.cols;
  const int packs = cols / kPack;                   // full packs
  const int tail = packs * kPack;                   // cols - tail < kPack <= kT: one element per thread at most
  const float scale = p.scale_log2e;
  const int tid = ts::thread_id();

  for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
    const InT* src = in + row * in_stride;
    OutT* dst = out + row * out_stride;

    // ---- pass A: global -> shared (t = in * scale_log2e), running max ----
    float mx = ts::kNegInf;
    auto stash = [&](int q, const InPack& pk) {
      const ts::Array<float, kPack> f = ts::to_floats(pk);
#pragma unroll
      for (int h = 0; h < kPlanes; ++h) {
        Chunk ch;
#pragma unroll
        for (int k = 0; k < kChunk; ++k) {
          ch[k] = f[h * kChunk + k] * scale;
          mx = ts::max_nan(mx, ch[k]);
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
      const float v = ts::to_float(ts::load_scalar<kLoadOnce>(src + c)) * scale;
      cache[c] = v;
      mx = ts::max_nan(mx, v);
    }
    mx = ts::block_allreduce_max<kT>(mx, red[0]);

    // ---- pass B: sum from shared memory (own slots only) ----
    const float shift = ts::softmax_shift(mx);
    float s = 0.0f;
#pragma unroll 4
    for (int q2 = tid; q2 < packs; q2 += kT) {
#pragma unroll
      for (int h = 0; h < kPlanes; ++h) {
        const Chunk ch = chunks[h * packs + q2];
#pragma unroll
        for (int k = 0; k < kChunk; ++k) s += sum_term(ch[k], shift);
      }
    }
    if (const int c = tail + tid; c < cols) s += sum_term(cache[c], shift);
    // red[1] vs red[0]: the barrier inside this reduction also orders the next row's red[0]
    // writes after every thread's red[0] reads above (see reduce.cuh).
    const RowFinish fin = RowFinish::make(mx, ts::block_allreduce_sum<kT>(s, red[1]));

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
    if (const int c = tail + tid; c < cols) ts::store_scalar<kStoreHint>(dst + c, ts::from_float<OutT>(fin(cache[c])));
  }
}

// =================================================================================================
// Path 2: a CTA per row, two passes over global memory with an online (m, d) state.
// =================================================================================================
TS_DEVICE void softmax_block_uncached(const SoftmaxParams& p) {
  constexpr int kT = kBlockThreads;
  __shared__ ts::OnlineSoftmax red[2][kWarps];

  const InT* in = static_cast<const InT*>(p.in);
  OutT* out = static_cast<OutT*>(p.out);
  const long long rows = p.rows, in_stride = p.in_stride, out_stride = p.out_stride;
  const int cols = (int)p.cols;
  const int packs = cols / kPack;
  const int tail = packs * kPack;                   // cols - tail < kPack <= kT: one element per thread at most
  const float scale = p.scale_log2e;
  const int tid = ts::thread_id();
  int parity = 0;

  for (long long row = blockIdx.x; row < rows; row += gridDim.x, parity ^= 1) {
    const InT* src = in + row * in_stride;
    OutT* dst = out + row * out_stride;

    // ---- pass 1: per-thread online state, one rescale per batch ----
    ts::OnlineSoftmax st = ts::OnlineSoftmax::empty();
    int q = tid;
    for (; q + (kUnroll - 1) * kT < packs; q += kUnroll * kT) {
      InPack raw[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) raw[u] = ts::load_pack<kPack, kLoadKeep>(src + (q + u * kT) * kPack);
      ts::Array<float, kUnroll * kPack> t;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const ts::Array<float, kPack> f = ts::to_floats(raw[u]);
#pragma unroll
        for (int k = 0; k < kPack; ++k) t[u * kPack + k] = f[k] * scale;
      }
      st.update_chunk(t);
    }
    for (; q < packs; q += kT) {
      ts::Array<float, kPack> t = ts::to_floats(ts::load_pack<kPack, kLoadKeep>(src + q * kPack));
#pragma unroll
      for (int k = 0; k < kPack; ++k) t[k] *= scale;
      st.update_chunk(t);
    }
    if (const int c = tail + tid; c < cols) st.update(ts::to_float(ts::load_scalar<kLoadKeep>(src + c)) * scale);

    // Alternating buffers: the next row's writes to red[parity ^ 1] come after this reduction's
    // barrier, which every thread reaches only after reading the previous row's red[parity ^ 1].
    st = ts::block_allreduce_softmax<kT>(st, red[parity]);
    const RowFinish fin = RowFinish::make(st.m, st.d);

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
        for (int k = 0; k < kPack; ++k) o[k] = fin(f[k] * scale);
        ts::store_floats<kStoreHint>(dst + (q + u * kT) * kPack, o);
      }
    }
    for (; q < packs; q += kT) {
      const ts::Array<float, kPack> f = ts::to_floats(ts::load_pack<kPack, kLoadOnce>(src + q * kPack));
      ts::Array<float, kPack> o;
#pragma unroll
      for (int k = 0; k < kPack; ++k) o[k] = fin(f[k] * scale);
      ts::store_floats<kStoreHint>(dst + q * kPack, o);
    }
    if (const int c = tail + tid; c < cols) {
      const float v = ts::to_float(ts::load_scalar<kLoadOnce>(src + c)) * scale;
      ts::store_scalar<kStoreHint>(dst + c, ts::from_float<OutT>(fin(v)));
    }
  }
}

}  // namespace softmax

// =================================================================================================
// Entry point: one path per compiled variant.
// =================================================================================================
extern "C" __global__ void __launch_bounds__(kBlockThreads) softmax_kernel(const __grid_constant__ SoftmaxParams p) {
  if constexpr (kPath == 0) {
    softmax::softmax_warp_rows(p);
  } else if constexpr (kPath == 1) {
    softmax::softmax_block_cached(p);
  } else {
    softmax::softmax_block_uncached(p);
  }
}
