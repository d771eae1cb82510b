// flash_sm80.cu: FlashAttention-2 forward for sm_80+ (ldmatrix + mma.sync + cp.async).
//
// Algorithm (Dao, "FlashAttention-2", 2023): a CTA owns one (batch, head, query tile of
// kBlockM rows, KV split). Its kThreads / 32 warps each own kMBlocks consecutive m16 row
// blocks (kBlockM / warps rows); every K/V fragment a warp loads feeds all of its row blocks.
// Per KV tile of kBlockN keys:
//   S = Q K^T          mma.m16n8k16, f32 accumulators (Q fragments from registers or smem)
//   scores             raw dot products (scale folded into the exp2 below) or, with kSoftcap,
//                      ts::attn_score_log2 applied element-wise; masked keys -> -inf
//   online softmax     per row: tile max over the 4 lanes of a quad (shuffles), rescale of
//                      the running state (ts::OnlineSoftmax::rescale), P = 2^(s * scale - m)
//                      (ts::exp2_fma_unclamped: a +inf score gives a NaN row), per-lane partial
//                      row sums. With kLazyRescale (D > 64, no softcap) the max moves only by
//                      more than 2^8 (ts::LazyStep; a row's first keys always move it), so the
//                      factor is exactly 1 almost always and O is rescaled only when a row of
//                      the warp moved (a warp-uniform branch that skips kMBlocks * D / 2
//                      multiplies per lane); otherwise O is rescaled every tile.
//   O += P V           P packed to Elem in registers is directly the A operand (mma.cuh);
//                      V fragments through ldmatrix.trans
// Epilogue: the row sums are reduced over the quad; O / l to Elem, staged through the warp's
// own rows of the Q tile in shared memory and written with 16-byte stores (rows < len_q,
// columns < head_dim); LSE = (m + log2 l) ln 2 when p.lse. A row that sees no key keeps
// m = -inf, l = 0: O = 0 and LSE = -inf, never NaN.
//
// Variants (preamble from plan.rs Variant::spec): Elem, kHeadDim (multiple of 32, <= 256; the
// real D = p.head_dim is a multiple of 8: columns beyond it are zero-filled on load, never
// stored), kBlockM (a multiple of 16 * warps), kBlockN (a multiple of 16), kThreads,
// kStages >= 2, kMasked (window / causal compiled in), kSoftcap, kSplit (write normalised f32
// partials instead).
//
// Grid (B * Hq, q_tiles, splits), blockIdx.z = split: the linear index of (x, y) walks sections
// of p.head_group batch-heads (b * Hq + h), each tile-major with its heads interleaved, query
// tile = q_tiles - 1 - (tile index), so the longest causal tiles of a section start first
// (work_tile; plan.rs sm80_head_group sizes the sections for K/V reuse in L2).
//
// Key tiles: a CTA visits only the tiles intersecting the visible key range of its rows,
// [first_key(first row), end_key(last row)) (ts::AttnMask); with kSplit, split z takes a
// contiguous, balanced share of those. Per-element masking runs only on tiles that cross a
// window edge or the end of the sequence (a uniform branch per tile).
//
// Shared memory (dynamic, Variant::shared_bytes): the Q tile (kBlockM rows), then kStages K
// tiles and kStages V tiles (kBlockN rows), each row kRowElems = round_up(kHeadDim, 64)
// elements (a multiple of 128 bytes). 16-byte chunk c of row r is stored at chunk
// c ^ (r % 8): the 8 row addresses of every ldmatrix phase and the 8 chunks of every cp.async
// phase then fall in 8 distinct 16-byte bank groups (no bank conflicts).
//
// Pipeline: the Q tile is the first commit group; K/V tile i is loaded into stage i % kStages
// with cp.async (zero-filled beyond len_k and p.head_dim); exactly one commit group per
// iteration (empty near the end) so that cp_async_wait<kStages - 2> always means "tile i has
// landed". The barrier after the wait also guarantees that every warp has finished tile
// i - 1, whose stage is refilled next. The refill is issued right after the barrier, or, with
// kTwoBodies (unmasked D = 64 and D = 128 / 64-key variants), behind the tile's Q K^T MMAs.
//
// Invariants the host upholds (plan.rs): q/k/v/o 16-byte aligned with row and head strides
// that are multiples of 8 elements; p.head_dim a multiple of 8 and <= kHeadDim; q_tiles =
// ceil(seqlen_q / kBlockM); for kSplit a workspace of num_splits * Hq * partial_rows rows of
// kHeadDim floats plus the LSEs.
//
// Tuning ladder (causal fp16 B=1 H=32 D=128 unless named; each step measured on the H200, the
// timings in this folder's NOTES.md, Ampere table):
//   1. 8 warps x 16 rows, 128 x 64 tiles, 2 stages, Q in registers (204-214 registers, one
//      CTA per SM).
//   2. 4 warps x 32 rows (two row blocks share every K/V fragment), 128 x 32 tiles, 3 stages,
//      Q re-read from shared memory (252-255 registers, 80 KiB, two CTAs per SM): faster than
//      step 1. Shipped for 64 < D <= 128 with a softcap, and without one where two CTAs of
//      step 3 do not fit an SM (A100, sm_86 / sm_89).
//   A 128 x 64 tile with two row blocks per warp spills (~90 bytes), as does 128 x 128 with
//   one; a 128-register cap for two 8-warp CTAs per SM spills too.
//   3. 128 x 64 tiles, 2 stages (96 KiB: two CTAs per SM on Hopper's 228 KiB, one on an
//      A100), scored in two 32-key sub-tiles with the first one's P packed to 16 bits (the
//      whole 64-key S spilled 60-88 bytes then), the K/V copy addresses as one register plus
//      constants: 255 registers, ~1230 instead of ~1370 SASS instructions per 64 keys; faster
//      causal and non-causal. Row sums as an MMA of P with ones (FlashInfer's way) were faster
//      still but failed sm80 verify cases (LSE off by up to 1.7e-3 against the 1e-3 budget: the
//      tensor cores add the 16-bit-rounded P).
//   4. Lazy rescaling with the O rescale behind a warp-uniform branch, and zero-fill copies
//      without a select of a safe source address (cp_async_16_zfill reads nothing then): the
//      whole 64-key S now fits in 255 registers without spills, so the sub-tiles went. ~875
//      SASS instructions per 64 keys (masked), and 16 independent accumulators per k step of
//      Q K^T instead of 8: faster at every causal length, GQA and varlen; D = 64 unchanged (it
//      keeps eager rescaling: with the lazy branch its softcap and split variants spill at
//      D = 32).
//   5. The work order in sections of batch-heads (plan.rs sm80_head_group): a section's K/V
//      stays in L2, which the longest causal rows gain from.
//   6. Sections also where only all heads' K/V together exceed L2 (the divisor of the heads
//      nearest two waves), in the power-capped state: faster from causal N = 4096 up,
//      non-causal, GQA and varlen.
//   7. Unmasked variants (D = 64, D = 128 with 64-key tiles): the tile body compiled twice, with
//      and without the per-element mask, and the next K/V copy issued behind Q K^T (kTwoBodies):
//      faster non-causal at D = 64 and D = 128.
//   8. The lazy factors computed only inside the rescale branch (ts::LazyStep: per row a compare
//      and a select instead of an exponential, a multiply of l and a test of the factor) and the
//      row sums started with their first term instead of 0 + x: 829 -> 803 SASS instructions per
//      masked D = 128 64-key tile, faster on every masked row in every round of its A/B.
//   Shipped for 64 < D <= 128 without softcap on GPUs with >= 194 KiB of shared memory per SM
//   (plan.rs sm80_tiles; softcap keeps 128 x 32 x 3 stages).
// D = 64 (non-causal bf16 B=4 H=16 N=8192): 4 warps x 32 rows over 128 x 64 tiles, 3 stages,
//   Q from shared memory (237 registers, two CTAs per SM) ran well ahead of 8 warps x 16 rows
//   over 128 x 128 tiles, Q in registers (174 registers, one CTA per SM). Shipped for D <= 64.
#include "tessera/attention_params.cuh"
#include "tessera/async_copy.cuh"
#include "tessera/math.cuh"
#include "tessera/mma.cuh"
#include "tessera/online_softmax.cuh"
#include "tessera/vec.cuh"

namespace {

using namespace ts;

constexpr int kWarps = kThreads / kWarpSize;
constexpr int kMBlocks = kBlockM / (16 * kWarps);     // m16 row blocks per warp
constexpr int kWarpRows = 16 * kMBlocks;
constexpr int kRowElems = (kHeadDim + 63) / 64 * 64;  // shared row pitch, a multiple of 128 B
constexpr int kChunks = kHeadDim / 8;                 // 16-byte chunks of a row that hold data
constexpr int kKSteps = kHeadDim / 16;                // k16 steps of S = Q K^T
constexpr int kSBlocks = kBlockN / 8;                 // n8 blocks of S (keys)
constexpr int kPSteps = kBlockN / 16;                 // k16 steps of O += P V
constexpr int kOBlocks = kHeadDim / 8;                // n8 blocks of O (head dim)
/// Q fragments stay in registers while they take at most 16 (kMBlocks * kKSteps * 4); beyond
/// that they are re-read from shared memory per k step to keep the O accumulator
/// (kMBlocks * D / 2 registers) and the scores spill-free (two row blocks of D = 64 with Q in
/// registers take 255 registers and spill).
constexpr bool kQInRegs = kMBlocks * kHeadDim <= 64;
/// Lazy rescaling of O (see the main loop). Not for D <= 64 or with a softcap, whose variants
/// rescale eagerly, every tile, with no branch: there the branch made ptxas spill (8-16 bytes
/// in the D = 32 split and softcap variants), and D = 64 did not gain from it (see this folder's
/// NOTES.md).
constexpr bool kLazyRescale = !kSoftcap && kHeadDim > 64;
/// The tile's work compiled twice, with and without the per-element mask (so that the common,
/// unmasked copy runs from Q K^T to the row maxima without a branch), and the next K/V copy
/// issued behind the Q K^T MMAs (branch-free: a zero-fill past the last tile): faster on the
/// non-causal D = 64 and D = 128 rows in every run. Not for masked variants: at causal D = 128 it
/// gained nothing on long rows once spill-free (an earlier gain came with a 4-byte epilogue
/// spill: a ptxas schedule, not a property of the code) and cost short rows (see this folder's
/// NOTES.md). Where the longer live ranges made ptxas spill (D = 96, 160, 256, the 32-key tiles,
/// split-KV partials), not either.
constexpr bool kTwoBodies = !kMasked && !kSplit && (kHeadDim == 64 || (kHeadDim == 128 && kBlockN == 64));

static_assert(kBlockM == kWarpRows * kWarps, "kBlockM: whole m16 row blocks per warp");
static_assert(kHeadDim % 32 == 0 && kHeadDim <= 256, "compiled head dim: a multiple of 32, <= 256");
static_assert(kBlockN % 16 == 0, "kBlockN: a multiple of 16");
static_assert(kStages >= 2, "at least double buffering");
static_assert(is_same_v<Elem, f16> || is_same_v<Elem, bf16>, "Elem: f16 or bf16");

/// Element offset, within its row, of 16-byte chunk c stored at chunk c ^ x (x < 8). Written
/// so that a compile-time c and a per-lane x leave at most 8 distinct per-lane values, whatever
/// c's high bits (ptxas keeps one register per value, not one per chunk).
TS_DEVICE int chunk_offset(int c, int x) { return ((c & ~7) | ((c & 7) ^ x)) << 3; }

/// Element offset of chunk c of row r in a swizzled shared tile.
TS_DEVICE int swizzle(int r, int c) { return r * kRowElems + chunk_offset(c, r & 7); }

/// The chunks c + 8 j, kJ <= j < kN, of one row (load_tile): each 128 j bytes past `dst` and `g`,
/// zero-filled unless the row is valid and the chunk lies below d_chunks; the padding chunks of
/// a generic head dim (>= kChunks) are skipped.
template <int kJ, int kN>
TS_DEVICE void copy_row_chunks(uint32_t dst, const Elem* g, int c, bool row_valid, int d_chunks) {
  if constexpr (kJ < kN) {
    const int chunk = c + 8 * kJ;
    if (kChunks == next_pow2(kChunks) || chunk < kChunks)
      cp_async_16_zfill_at<128 * kJ>(dst, g, row_valid && chunk < d_chunks);  // g unread unless valid
    copy_row_chunks<kJ + 1, kN>(dst, g, c, row_valid, d_chunks);
  }
}

/// Starts the copy of a kRows x kHeadDim tile from `src` (row stride `stride` elements) into
/// the shared tile `dst`: rows >= n_valid and chunks >= d_chunks are zero-filled instead.
/// kRowThreads (8, or fewer for a row of fewer chunks) threads share a row; each keeps the
/// chunk columns c, c + 8, c + 16, ... of that row (128 bytes apart in global and, the swizzle
/// permuting only within groups of 8 chunks, in shared memory too) and steps over rows. So one
/// global address per row serves all its chunks (immediate offsets), and at D = 128 half as
/// many rows per thread need an address as with one chunk per thread. kAllRows (the caller
/// knows n_valid >= kRows) drops the per-row test: the only predicates left are the chunks'.
/// kOneChunk keeps one chunk per thread (kLoadChunks threads per row). The two-body variants
/// load Q, K and V that way: with pairs their D = 128 / 64-key tile spilled 24 bytes on sm_90a
/// (pairs for Q alone were enough; pairs for K/V alone were not tried).
template <int kRows, bool kAllRows = false, bool kOneChunk = false>
TS_DEVICE void load_tile(Elem* dst, const Elem* src, long long stride, int n_valid, int d_chunks) {
  constexpr int kLoadChunks = next_pow2(kChunks);
  constexpr int kRowThreads = (kOneChunk || kLoadChunks < 8) ? kLoadChunks : 8;
  constexpr int kThreadChunks = kLoadChunks / kRowThreads;  // chunks per thread and row
  constexpr int kRowsPerPass = kThreads / kRowThreads;
  static_assert(kThreads % kRowThreads == 0 && kRows % kRowsPerPass == 0, "tile load shape");
  const int c = thread_id() % kRowThreads;
  const int r0 = thread_id() / kRowThreads;
  // With kRowsPerPass a multiple of 8 every row of this thread has the swizzle term of r0, so
  // its shared addresses are one register plus compile-time offsets.
  constexpr bool kSameSwizzle = kRowsPerPass % 8 == 0;
  const uint32_t base = smem_addr(dst) + (kSameSwizzle ? swizzle(r0, c) * (int)sizeof(Elem) : 0);
  const Elem* g = src + r0 * stride + c * 8;
#pragma unroll
  for (int i = 0; i < kRows / kRowsPerPass; ++i) {
    const int r = r0 + i * kRowsPerPass;
    const bool row_valid = kAllRows || r < n_valid;
    const uint32_t row_dst =
        base + (kSameSwizzle ? i * kRowsPerPass * kRowElems : swizzle(r, c)) * (int)sizeof(Elem);
    copy_row_chunks<0, kThreadChunks>(row_dst, g, c, row_valid, d_chunks);
    g += kRowsPerPass * stride;
  }
}

// Per-lane ldmatrix addressing. Lane l supplies row l % 8 of matrix l / 8 (mma.cuh); every
// row a lane addresses is = l % 8 (mod 8), so its swizzle term is fixed per lane, and the
// compile-time tile coordinates become constant offsets:
//   Q (A operand, 16 rows x k16):  matrix m -> rows +8 * (m & 1), chunk 2 kk + (m >> 1)
//   K (B operand, n16 x k16):      matrix m -> keys +8 * (m >> 1), chunk 2 kk + (m & 1)
//   V (B operand via .trans, k16 x n16): matrix m -> keys +8 * (m & 1), chunk nb + (m >> 1)
struct LaneAddr {
  uint32_t row;  // byte offset of the lane's row
  int x;         // the lane's chunk XOR (chunk bit from its matrix index ^ row % 8)
  TS_DEVICE uint32_t at(int row_const, int chunk_const) const {
    return row + (row_const * kRowElems + chunk_offset(chunk_const, x)) * (int)sizeof(Elem);
  }
};
TS_DEVICE LaneAddr lane_addr_a(uint32_t tile, int first_row) {  // Q and V
  const int l = lane_id();
  const int row = first_row + (l & 7) + ((l >> 3) & 1) * 8;
  return LaneAddr{tile + row * kRowElems * (int)sizeof(Elem), (l >> 4) ^ (l & 7)};
}
TS_DEVICE LaneAddr lane_addr_k(uint32_t tile) {
  const int l = lane_id();
  return LaneAddr{tile + ((l & 7) + (l >> 4) * 8) * kRowElems * (int)sizeof(Elem), ((l >> 3) & 1) ^ (l & 7)};
}

/// Q fragments of a warp: all k steps of all its row blocks in registers, or none (kQInRegs).
using QFragments = uint32_t[kQInRegs ? kMBlocks : 1][kQInRegs ? kKSteps : 1][4];

/// s += Q K^T for this warp's row blocks and the kBlockN keys of the K stage at `sk`.
TS_DEVICE void qk_tile(float (&s)[kMBlocks][kSBlocks][4], const QFragments& qf, const LaneAddr& q, uint32_t sk) {
  const LaneAddr k = lane_addr_k(sk);
#pragma unroll
  for (int kk = 0; kk < kKSteps; ++kk) {
    uint32_t a[kMBlocks][4];
#pragma unroll
    for (int mb = 0; mb < kMBlocks; ++mb) {
      if constexpr (kQInRegs) {
#pragma unroll
        for (int j = 0; j < 4; ++j) a[mb][j] = qf[mb][kk][j];
      } else {
        ldmatrix_x4(a[mb], q.at(mb * 16, 2 * kk));
      }
    }
#pragma unroll
    for (int nb = 0; nb < kSBlocks; nb += 2) {
      uint32_t b[4];  // keys nb*8.. (chunks 2kk, 2kk+1), then keys nb*8+8.. (the same chunks)
      ldmatrix_x4(b, k.at(nb * 8, 2 * kk));
#pragma unroll
      for (int mb = 0; mb < kMBlocks; ++mb) {
        mma_m16n8k16<Elem>(s[mb][nb], a[mb], b[0], b[1]);
        mma_m16n8k16<Elem>(s[mb][nb + 1], a[mb], b[2], b[3]);
      }
    }
  }
}

/// Row r of one row block's accumulator (r = 0: elements 0, 1; r = 1: elements 2, 3 of every
/// n8 block) times factor.
TS_DEVICE void rescale_row(float (&acc)[kOBlocks][4], int r, float factor) {
#pragma unroll
  for (int nb = 0; nb < kOBlocks; ++nb) {
    acc[nb][2 * r] *= factor;
    acc[nb][2 * r + 1] *= factor;
  }
}

/// acc += P V over the key tile's kPSteps k16 steps: p_frag(mb, kk, a) gives the A fragment
/// (P packed to Elem) of row block mb, step kk; V from the stage at `sv` through ldmatrix.trans.
template <typename PFrag>
TS_DEVICE void pv_tile(float (&acc)[kMBlocks][kOBlocks][4], uint32_t sv, PFrag p_frag) {
  const LaneAddr v = lane_addr_a(sv, 0);
#pragma unroll
  for (int kk = 0; kk < kPSteps; ++kk) {
    uint32_t a[kMBlocks][4];
#pragma unroll
    for (int mb = 0; mb < kMBlocks; ++mb) {
      p_frag(mb, kk, a[mb]);
    }
#pragma unroll
    for (int nb = 0; nb < kOBlocks; nb += 2) {
      uint32_t b[4];  // keys kk*16.. and kk*16+8.. of chunk nb, then the same keys of chunk nb+1
      ldmatrix_x4_trans(b, v.at(kk * 16, nb));
#pragma unroll
      for (int mb = 0; mb < kMBlocks; ++mb) {
        mma_m16n8k16<Elem>(acc[mb][nb], a[mb], b[0], b[1]);
        mma_m16n8k16<Elem>(acc[mb][nb + 1], a[mb], b[2], b[3]);
      }
    }
  }
}

/// The (batch-head, query tile) of this CTA, by its linear index l over the (B * Hq, q_tiles)
/// grid: sections of `group` consecutive batch-heads (the last one may hold fewer), taken in
/// order; within a section, tile-major with the batch-heads interleaved (tile 0 = the longest
/// under a causal mask, see the caller). The block index is read with asm volatile so that
/// every call re-derives the pair: the epilogue calls it again rather than ptxas holding the
/// head across the main loop (the 64-key tile has no register to spare; it spilled).
struct WorkTile {
  int batch_head;
  int tile;
};
TS_DEVICE WorkTile work_tile(int group) {
  uint32_t x, y;
  asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(x));
  asm volatile("mov.u32 %0, %%ctaid.y;" : "=r"(y));
  const int heads = gridDim.x;
  const int tiles = gridDim.y;
  const int l = (int)y * heads + (int)x;
  const int section = l / (group * tiles);
  const int first = section * group;
  const int size = min(group, heads - first);  // batch-heads in this section
  const int i = l - first * tiles;
  return WorkTile{first + i % size, i / size};
}

}  // namespace

extern "C" __global__ void __launch_bounds__(kThreads) flash_fwd_sm80(const __grid_constant__ ts::AttentionParams p) {
  const WorkTile w = work_tile(p.head_group);
  const int b = w.batch_head / p.heads_q;
  const int h = w.batch_head % p.heads_q;
  const int m0 = (p.q_tiles - 1 - w.tile) * kBlockM;
  const AttnSeq seq = attn_seq(p, b, h);
  if (m0 >= seq.len_q) return;  // varlen: a shorter sequence than the longest (uniform exit)
  const int rows = min(kBlockM, seq.len_q - m0);
  const AttnMask mask = AttnMask::of(p, seq);

  // ---- the key tiles this CTA (and split) visits ----------------------------------------
  int key_lo = 0;
  int key_hi = seq.len_k;
  if constexpr (kMasked) {
    key_lo = mask.first_key(m0);
    key_hi = mask.end_key(m0 + rows - 1);
  }
  int t_begin = key_lo / kBlockN;
  int t_end = key_hi > key_lo ? ceil_div(key_hi, kBlockN) : t_begin;
  if constexpr (kSplit) {
    const long long n = t_end - t_begin;
    const int z = blockIdx.z;
    t_end = t_begin + (int)(n * (z + 1) / p.num_splits);
    t_begin += (int)(n * z / p.num_splits);
  }

  // ---- shared memory and global tiles ---------------------------------------------------
  Elem* s_q = dynamic_smem<Elem>();
  Elem* s_k = s_q + kBlockM * kRowElems;
  Elem* s_v = s_k + kStages * kBlockN * kRowElems;
  constexpr int kStageElems = kBlockN * kRowElems;
  const Elem* g_q = static_cast<const Elem*>(p.q) + seq.q_off + m0 * p.q_stride_n;
  const Elem* g_k = static_cast<const Elem*>(p.k) + seq.k_off;
  const Elem* g_v = static_cast<const Elem*>(p.v) + seq.v_off;
  const int d_chunks = p.head_dim / 8;
  auto load_kv = [&](int t, bool live = true) {  // !live: zero-fills the stage, reads nothing
    const int n0 = t * kBlockN;
    const int stage = (unsigned)(t - t_begin) % kStages;
    const int n_valid = live ? seq.len_k - n0 : 0;
    auto copy = [&](auto all_rows) {
      constexpr bool kAll = decltype(all_rows)::value;
      load_tile<kBlockN, kAll, kTwoBodies>(s_k + stage * kStageElems, g_k + n0 * p.k_stride_n, p.k_stride_n, n_valid,
                                           d_chunks);
      load_tile<kBlockN, kAll, kTwoBodies>(s_v + stage * kStageElems, g_v + n0 * p.v_stride_n, p.v_stride_n, n_valid,
                                           d_chunks);
    };
    // every tile but the sequence's last has all its rows: no per-row tests (a uniform branch;
    // not with kTwoBodies, whose copy sits behind Q K^T, one chunk per thread)
    if (!kTwoBodies && n_valid >= kBlockN) copy(bool_constant<true>{});
    else copy(bool_constant<false>{});
  };

  // prologue: Q, then the first kStages - 1 K/V tiles, one commit group each
  load_tile<kBlockM, false, kTwoBodies>(s_q, g_q, p.q_stride_n, rows, d_chunks);
  cp_async_commit();
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    if (t_begin + i < t_end) load_kv(t_begin + i);
    cp_async_commit();
  }

  // ---- per-warp state: kMBlocks row blocks of 16; the lane holds rows g and g + 8 of each --
  const int lane = lane_id();
  const int wrow = warp_id() * kWarpRows;
  const int row0 = m0 + wrow + (lane >> 2);  // in-sequence query index of the lane's first row
  const int col0 = 2 * (lane & 3);           // the lane's first column in every n8 block
  const LaneAddr q_addr = lane_addr_a(smem_addr(s_q), wrow);
  float acc[kMBlocks][kOBlocks][4];
  OnlineSoftmax state[kMBlocks][2];
#pragma unroll
  for (int mb = 0; mb < kMBlocks; ++mb) {
#pragma unroll
    for (int nb = 0; nb < kOBlocks; ++nb) acc[mb][nb][0] = acc[mb][nb][1] = acc[mb][nb][2] = acc[mb][nb][3] = 0.0f;
    state[mb][0] = state[mb][1] = OnlineSoftmax::empty();
  }
  QFragments qf;
  if constexpr (kQInRegs) {
    if (t_begin < t_end) {
      cp_async_wait<kStages - 1>();  // the Q group has landed for this thread ...
      __syncthreads();               // ... and for every thread
#pragma unroll
      for (int mb = 0; mb < kMBlocks; ++mb)
#pragma unroll
        for (int kk = 0; kk < kKSteps; ++kk) ldmatrix_x4(qf[mb][kk], q_addr.at(mb * 16, 2 * kk));
    }
  }
  // scores are raw dot products scaled inside the exp2, or already log2 scores with kSoftcap
  const float score_scale = kSoftcap ? 1.0f : p.scale_log2;

  for (int t = t_begin; t < t_end; ++t) {
    cp_async_wait<kStages - 2>();  // tile t (and Q before it) landed for this thread ...
    __syncthreads();               // ... for every thread; every warp is done with tile t - 1
    if constexpr (!kTwoBodies) {
      if (t + kStages - 1 < t_end) load_kv(t + kStages - 1);
      cp_async_commit();
    }
    const int stage = (unsigned)(t - t_begin) % kStages;
    const uint32_t sk = smem_addr(s_k + stage * kStageElems);
    const uint32_t sv = smem_addr(s_v + stage * kStageElems);
    const int n0 = t * kBlockN;
    // per-element mask only where the tile crosses a window edge or the end of the keys
    bool edge = n0 + kBlockN > seq.len_k;
    if constexpr (kMasked) edge = edge || n0 < mask.first_key(m0 + rows - 1) || n0 + kBlockN > mask.end_key(m0);

    // The tile's work: with kTwoBodies, called once with the mask compiled in (edge tiles) and
    // once without; otherwise one body that masks behind a runtime branch.
    auto tile = [&](auto masked) {
      // S = Q K^T of the tile's keys n0 .. n0 + kBlockN - 1 (16 independent accumulators per
      // k step at D = 128 keep the tensor cores busy)
      float s[kMBlocks][kSBlocks][4];
#pragma unroll
      for (int mb = 0; mb < kMBlocks; ++mb)
#pragma unroll
        for (int nb = 0; nb < kSBlocks; ++nb) s[mb][nb][0] = s[mb][nb][1] = s[mb][nb][2] = s[mb][nb][3] = 0.0f;
      qk_tile(s, qf, q_addr, sk);
      if constexpr (kTwoBodies) {  // the next copy behind the MMAs, branch-free (zero-fill past t_end)
        load_kv(t + kStages - 1, t + kStages - 1 < t_end);
        cp_async_commit();
      }

      if constexpr (kSoftcap) {
#pragma unroll
        for (int mb = 0; mb < kMBlocks; ++mb)
#pragma unroll
          for (int nb = 0; nb < kSBlocks; ++nb)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[mb][nb][e] = attn_score_log2(p, s[mb][nb][e]);
      }

      if (decltype(masked)::value && edge) {
#pragma unroll
        for (int mb = 0; mb < kMBlocks; ++mb)
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            // the row's visible keys [lo, hi), relative to this lane's first column of the tile
            const int i = row0 + mb * 16 + r * 8;
            const int lo = (kMasked ? mask.first_key(i) : 0) - (n0 + col0);
            const int hi = (kMasked ? mask.end_key(i) : seq.len_k) - (n0 + col0);
#pragma unroll
            for (int nb = 0; nb < kSBlocks; ++nb)
#pragma unroll
              for (int e = 0; e < 2; ++e) {
                const int c = nb * 8 + e;
                if (c < lo || c >= hi) s[mb][nb][2 * r + e] = kNegInf;
              }
          }
      }

      // Online softmax of the lane's rows (r = 0: elements 0, 1; r = 1: elements 2, 3), turning
      // the scores into probabilities in place. With kLazyRescale a row's max moves only when the
      // tile raises it by more than kLazyRescaleSlack (ts::LazyStep: P <= 2^8), so O and d are
      // rescaled only when a row of the warp moved (a warp-uniform branch, rare after a row's
      // first keys: kMBlocks * D / 2 multiplies per lane skipped), and the factors are computed
      // only there. Otherwise every tile rescales.
      bool moved = false;
      float rise[kMBlocks][2];  // kLazyRescale: each row's LazyStep, for the branch
#pragma unroll
      for (int mb = 0; mb < kMBlocks; ++mb)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const float mx = quad_row_max(s[mb], r);
          // round(scale * max dot) = max round(scale * dot) as scale > 0 (see shifted_fma)
          OnlineSoftmax& st = state[mb][r];
          const float m_cand = max_nan(st.m, mx * score_scale);
          if constexpr (kLazyRescale) {
            const LazyStep step = LazyStep::of(st.m, m_cand);
            rise[mb][r] = step.rise;
            moved = moved || step.moved();
            st.m = step.max(st.m, m_cand);
          } else {
            rescale_row(acc[mb], r, st.rescale(m_cand));
          }
          // softcapped scores are bounded: the clamp never acts, it only keeps ptxas from spilling
          st.d += exp2_row<kSoftcap>(s[mb], r, score_scale, -softmax_shift(st.m));
        }
      if constexpr (kTwoBodies) {
        // never true: makes the vote wait for the row sums, so that ptxas keeps the exponentials
        // ahead of the branch (sunk into the P V block they measured slower: see this folder's
        // NOTES.md)
#pragma unroll
        for (int mb = 0; mb < kMBlocks; ++mb)
#pragma unroll
          for (int r = 0; r < 2; ++r) moved = moved || state[mb][r].d < 0.0f;
      }
      if (kLazyRescale && __any_sync(kFullMask, moved)) {  // a row's first keys; rare after them
#pragma unroll
        for (int mb = 0; mb < kMBlocks; ++mb)
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const LazyStep step{rise[mb][r]};
            const float factor = step.factor();
            rescale_row(acc[mb], r, factor);
            if (step.moved()) {
              // d holds d_old + the tile's terms: their sum is taken out again and d_old alone
              // rescaled, off by the rounding of that addition (half an ulp of d) times the factor
              // (< 2^-8; 1 only in rows that are empty or NaN anyway). The sum is recomputed from P
              // so that the source holds no register through the branch (ptxas keeps the first
              // one where it has room: the same value, exp2_row's order)
              const float sum = lane_row_sum(s[mb], r);
              state[mb][r].d = fmaf(state[mb][r].d - sum, factor, sum);
            }
          }
      }

      // O += P V, P packed to Elem as the A fragments
      pv_tile(acc, sv, [&](int mb, int kk, uint32_t (&a)[4]) { pack_a_fragment<Elem>(a, s[mb], kk); });
    };
    if (!kTwoBodies || edge) {
      tile(bool_constant<true>{});
    } else {
      tile(bool_constant<false>{});
    }
  }

  // ---- epilogue ---------------------------------------------------------------------------
  const WorkTile w_out = work_tile(p.head_group);  // re-derived, see work_tile
  const int batch_head = w_out.batch_head;
  const int head = batch_head % p.heads_q;
  // the lane's first row, re-derived as well with kTwoBodies (held across the loop it spilled)
  const int row_out = kTwoBodies ? (p.q_tiles - 1 - w_out.tile) * kBlockM + wrow + (lane >> 2) : row0;
  cp_async_wait_all();  // no copy may land in the Q tile after it is reused below
  __syncthreads();
  float inv_l[kMBlocks][2];
  float lse[kMBlocks][2];
#pragma unroll
  for (int mb = 0; mb < kMBlocks; ++mb)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float l = state[mb][r].d;
      l += shfl_xor(l, 1);
      l += shfl_xor(l, 2);
      inv_l[mb][r] = l > 0.0f ? 1.0f / l : 0.0f;
      lse[mb][r] = OnlineSoftmax{state[mb][r].m, l}.lse();  // -inf for a row that saw no key
    }

  if constexpr (kSplit) {
    // normalised f32 partials, written straight from the accumulators (8 bytes per lane)
    const long long base = ((long long)blockIdx.z * p.heads_q + head) * p.partial_rows + seq.row_q;
#pragma unroll
    for (int mb = 0; mb < kMBlocks; ++mb)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int i = row_out + mb * 16 + r * 8;
        if (i >= seq.len_q) continue;
        float* dst = p.o_partial + (base + i) * kHeadDim;
#pragma unroll
        for (int nb = 0; nb < kOBlocks; ++nb) {
          const int c = nb * 8 + col0;
          if (c < p.head_dim) {
            const float il = inv_l[mb][r];
            st_global_b64(dst + c, U32x2{__float_as_uint(acc[mb][nb][2 * r] * il),
                                         __float_as_uint(acc[mb][nb][2 * r + 1] * il)});
          }
        }
        if ((lane & 3) == 0) p.lse_partial[base + i] = lse[mb][r];
      }
  } else {
    // stage O / l as Elem in this warp's own rows of the Q tile, then 16-byte stores
#pragma unroll
    for (int mb = 0; mb < kMBlocks; ++mb)
#pragma unroll
      for (int nb = 0; nb < kOBlocks; ++nb)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int sr = wrow + mb * 16 + (lane >> 2) + r * 8;
          const float il = inv_l[mb][r];
          const uint32_t v = pack2<Elem>(acc[mb][nb][2 * r] * il, acc[mb][nb][2 * r + 1] * il);
          *reinterpret_cast<uint32_t*>(s_q + swizzle(sr, nb) + col0) = v;
        }
    __syncwarp();
    Elem* g_o = static_cast<Elem*>(p.o) + seq.o_off + m0 * p.o_stride_n;
    constexpr int kWarpChunks = kWarpRows * kChunks;
#pragma unroll
    for (int i = 0; i < ceil_div(kWarpChunks, kWarpSize); ++i) {
      const int idx = lane + i * kWarpSize;
      const int r = idx / kChunks;
      const int c = idx % kChunks;
      if ((kWarpChunks % kWarpSize == 0 || idx < kWarpChunks) && wrow + r < rows && c < d_chunks) {
        const U32x4 v = *reinterpret_cast<const U32x4*>(s_q + swizzle(wrow + r, c));
        st_global_b128(g_o + (wrow + r) * p.o_stride_n + c * 8, v);
      }
    }
    if (p.lse != nullptr && (lane & 3) == 0) {
      const long long lse_row = p.cu_seqlens_q != nullptr ? seq.row_q : 0;
#pragma unroll
      for (int mb = 0; mb < kMBlocks; ++mb)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int i = row_out + mb * 16 + r * 8;
          if (i < seq.len_q) p.lse[head * p.lse_stride_h + batch_head / p.heads_q * p.lse_stride_b + lse_row + i] = lse[mb][r];
        }
    }
  }
}
