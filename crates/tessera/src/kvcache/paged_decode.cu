// paged_decode.cu: paged GQA decode attention over a paged KV cache, with split-KV.
//
// Computes, for every sequence b, KV head kvh and query row r = qi * group + hh (query head
// h = kvh * group + hh, query token qi < q_len),
//   O[b, qi, h] = softmax_j(Q[b, qi, h] . K[b, j, kvh] * scale) V[b, j, kvh]
// over the keys j <= seq_len - q_len + qi, reading K/V in place from the pages of the block
// table (kvcache_params.cuh). One CTA serves one (work item = (sequence, key chunk), KV head,
// row group) and all the query heads sharing that KV head, so every K/V byte is read once per
// step however large the group.
//
// Work mapping: grid (Hkv, num_items, row groups of 16 * kMBlocks rows); items come longest
// first, so the block scheduler runs the longest chunks of every head first. The CTA's key chunk is
// cut into tiles of kTileKeys keys and its kWarps warps take contiguous runs of tiles. Every
// warp runs its own cp.async pipeline of kStages K/V tiles in its private shared memory: no
// CTA barrier inside the main loop. Per tile a warp computes
//   S = Q K^T      mma.m16n8k16 (Q: 16 * kMBlocks rows; K fragments by ldmatrix)
//   online softmax per row (ts::OnlineSoftmax, log2 domain, scale folded into exp2)
//   O += P V       P packed to Elem in registers as the A operand, V by ldmatrix.trans
// and at the end the warps' (m, l, O) are merged through shared memory by the online-softmax
// rule; the CTA writes the output (single-chunk sequence) or a normalised f32 partial + LSE, and
// the CTA that finishes a split sequence's last chunk merges its partials (an arrival counter per
// (sequence, KV head, row group); merge_warps_and_store in paged_decode_common.cuh).
//
// Pages: the page id of each tile is loaded one tile ahead (a register per lane, lane l holding
// the tile's l-th page) and broadcast by shuffles when the copies are issued, so the table
// lookup never stalls the pipeline. Rows past the warp's last key are zero-filled, never read.
//
// fp8 cache (kFp8): tiles land as e4m3 bytes and each warp converts its tile to Elem in a
// private staging tile before the MMAs; the K scale of a page multiplies its score columns; O is
// accumulated in units of the warp's first V scale, each page's probabilities carrying the ratio
// of its V scale to that one (after the row sum); both scales are copied per stage with cp.async.
//
// Shared memory (decode.rs `DecodeVariant::shared_bytes`): the Q tile (16 kMBlocks rows x D
// Elem, swizzled), then per warp kStages x (K tile, V tile) of kTileKeys x D cache elements
// (swizzled when 2-byte; plain for fp8) [+ for fp8 the Elem staging K/V tiles and the per-stage
// scales]. The merge after the loop reuses the pipeline area.
//
// Roofline: decode reads each K/V byte once: time >= KV bytes / HBM bandwidth (4.8 TB/s peak on
// the H200, ~4.3 TB/s sustained by copies); the MMAs waste the unused rows of m16 but run far
// below the tensor-core limit.
#include "tessera/mma.cuh"
#include "tessera/paged_decode_common.cuh"

namespace {

using namespace ts;

constexpr int kRows = 16 * kMBlocks;                       // query rows of a CTA
constexpr int kKSteps = kHeadDim / 16;                     // k16 steps of S = Q K^T
constexpr int kSBlocks = kTileKeys / 8;                    // n8 key blocks of a tile
constexpr int kOBlocks = kHeadDim / 8;                     // n8 blocks of O
constexpr int kElemTile = kTileKeys * kElemRow;            // bytes of one Elem staging tile
constexpr int kWarpBytes = kStages * kStageBytes + (kFp8 ? 2 * kElemTile : 0);
constexpr bool kQInRegs = kMBlocks * kHeadDim <= 128;
/// Unroll the main loop by the stage count where the registers allow (one row block, D <= 128):
/// constant stage offsets, fewer instructions per tile (see this folder's NOTES.md); larger
/// variants would spill.
constexpr bool kUnrollStages = kMBlocks == 1 && kHeadDim <= 128;

using QFragments = uint32_t[kQInRegs ? kMBlocks : 1][kQInRegs ? kKSteps : 1][4];
using Scores = float[kMBlocks][kSBlocks][4];
using Accum = float[kMBlocks][kOBlocks][4];

/// s = Q K^T for the warp's tile of kTileKeys keys (K as a swizzled Elem tile at `sk`).
TS_DEVICE void qk_tile(Scores& s, const QFragments& qf, const LaneAddr& q, uint32_t sk) {
  const LaneAddr k = lane_addr_b(sk);
#pragma unroll
  for (int mb = 0; mb < kMBlocks; ++mb)
#pragma unroll
    for (int nb = 0; nb < kSBlocks; ++nb) s[mb][nb][0] = s[mb][nb][1] = s[mb][nb][2] = s[mb][nb][3] = 0.0f;
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
      uint32_t b[4];
      ldmatrix_x4(b, k.at(nb * 8, 2 * kk));
#pragma unroll
      for (int mb = 0; mb < kMBlocks; ++mb) {
        mma_m16n8k16<Elem>(s[mb][nb], a[mb], b[0], b[1]);
        mma_m16n8k16<Elem>(s[mb][nb + 1], a[mb], b[2], b[3]);
      }
    }
  }
}

/// acc += P V with P (probabilities in accumulator layout) packed to Elem, V at `sv`.
TS_DEVICE void pv_tile(Accum& acc, const Scores& p, uint32_t sv) {
  const LaneAddr v = lane_addr_a(sv);
#pragma unroll
  for (int kk = 0; kk < kTileKeys / 16; ++kk) {
    uint32_t a[kMBlocks][4];
#pragma unroll
    for (int mb = 0; mb < kMBlocks; ++mb) {
      pack_a_fragment<Elem>(a[mb], p[mb], kk);
    }
#pragma unroll
    for (int nb = 0; nb < kOBlocks; nb += 2) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, v.at(kk * 16, nb));
#pragma unroll
      for (int mb = 0; mb < kMBlocks; ++mb) {
        mma_m16n8k16<Elem>(acc[mb][nb], a[mb], b[0], b[1]);
        mma_m16n8k16<Elem>(acc[mb][nb + 1], a[mb], b[2], b[3]);
      }
    }
  }
}

/// The K/V tile layout (TileLoader): 2-byte tiles swizzled for ldmatrix, fp8 tiles plain rows
/// (dequant_tile converts them).
struct WideTile {
  static constexpr bool kSwizzled = !kFp8;
  static TS_DEVICE int offset(int r, int c) { return kFp8 ? r * kCacheRow + c * 16 : swizzled(r, c); }
};

/// Converts an e4m3 tile (plain rows of kHeadDim bytes) into a swizzled Elem tile.
TS_DEVICE void dequant_tile(unsigned char* dst, const unsigned char* src) {
  constexpr int kChunks = kTileKeys * kCacheChunks;  // 16 fp8 values each
#pragma unroll
  for (int i = 0; i < kChunks / kWarpSize; ++i) {
    const int idx = lane_id() + i * kWarpSize;
    const int r = idx / kCacheChunks;
    const int c = idx % kCacheChunks;
    const U32x4 raw = *reinterpret_cast<const U32x4*>(src + r * kCacheRow + c * 16);
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
    uint32_t out[8];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      // exact: every e4m3 value is an f16 (and a bf16)
      uint32_t lo;
      uint32_t hi;
      e4m3x4_to_f16x4(w[j], lo, hi);
      out[2 * j] = f16x2_to_elem(lo);
      out[2 * j + 1] = f16x2_to_elem(hi);
    }
    *reinterpret_cast<U32x4*>(dst + swizzled(r, 2 * c)) = U32x4{out[0], out[1], out[2], out[3]};
    *reinterpret_cast<U32x4*>(dst + swizzled(r, 2 * c + 1)) = U32x4{out[4], out[5], out[6], out[7]};
  }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(kThreads, kMinCtasPerSm) paged_decode(const __grid_constant__ ts::DecodeParams p) {
  ts::wait_prior_grids();  // programmatic dependent launch: no global access before this
  const int kvh = blockIdx.x;
  const int item = blockIdx.y;
  const int row_base = blockIdx.z * kRows;  // first query row of this CTA
  const DecodeChunk ch = chunk_of(p, item);
  const int lane = lane_id();
  const int warp = warp_id();

  unsigned char* smem = dynamic_smem<unsigned char>();
  unsigned char* s_q = smem;
  unsigned char* s_warp = smem + kRows * kElemRow + warp * kWarpBytes;

  // ---- Q rows of this CTA: cp.async, rows past p.rows zero-filled ------------------------
  {
    constexpr int kQChunks = kRows * (kElemRow / 16);
    const uint32_t base = smem_addr(s_q);
    for (int idx = thread_id(); idx < kQChunks; idx += kThreads) {
      const int r = idx / (kElemRow / 16);
      const int c = idx % (kElemRow / 16);
      const int row = row_base + r;
      const bool valid = row < p.rows;
      const int qi = valid ? row / p.group : 0;
      const int h = kvh * p.group + (valid ? row % p.group : 0);
      const Elem* src = static_cast<const Elem*>(p.q) + ch.b * p.q_stride_b + qi * p.q_stride_n + h * p.q_stride_h;
      cp_async_16_zfill(base + swizzled(r, c), src + c * (16 / (int)sizeof(Elem)), valid);
    }
    cp_async_commit();
  }

  // ---- this warp's tiles ------------------------------------------------------------------
  int t_begin;
  const TileLoader<WideTile> loader = warp_tile_loader<WideTile>(p, ch, kvh, warp, s_warp, t_begin);
  const int t_end = loader.t_end;
  const int warp_end = loader.warp_end;
  auto tile_pages = [&](int t) { return loader.pages_of(t); };
  auto issue = [&](int t, int pages, int stage) { loader.issue(t, pages, stage); };

  int next_pages = tile_pages(t_begin);
  unroll_for<kStages - 1>([&](auto i) {
    const int pages = next_pages;
    next_pages = tile_pages(t_begin + decltype(i)::value + 1);
    issue(t_begin + decltype(i)::value, pages, decltype(i)::value);
  });

  // ---- per-lane state: kMBlocks row blocks; the lane holds rows g and g + 8 of each -------
  const int col0 = 2 * (lane & 3);
  const LaneAddr q_addr = lane_addr_a(smem_addr(s_q));
  Accum acc;
  OnlineSoftmax state[kMBlocks][2];
  VScaleRef v_ref;  // fp8
#pragma unroll
  for (int mb = 0; mb < kMBlocks; ++mb) {
#pragma unroll
    for (int nb = 0; nb < kOBlocks; ++nb) acc[mb][nb][0] = acc[mb][nb][1] = acc[mb][nb][2] = acc[mb][nb][3] = 0.0f;
    state[mb][0] = state[mb][1] = OnlineSoftmax::empty();
  }
  // the query position limit of each of the lane's rows (causal with q_len > 1)
  int row_limit[kMBlocks][2];
#pragma unroll
  for (int mb = 0; mb < kMBlocks; ++mb)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = row_base + mb * 16 + (lane >> 2) + 8 * r;
      row_limit[mb][r] = visible_key_limit(p, ch, row);  // keys < this
    }
  const int causal_from = ch.len - p.q_len + 1;  // row 0's limit: tiles past it need the mask

  QFragments qf;
  cp_async_wait<kStages - 1>();  // Q landed for this thread ...
  __syncthreads();               // ... and for all threads
  if constexpr (kQInRegs) {
#pragma unroll
    for (int mb = 0; mb < kMBlocks; ++mb)
#pragma unroll
      for (int kk = 0; kk < kKSteps; ++kk) ldmatrix_x4(qf[mb][kk], q_addr.at(mb * 16, 2 * kk));
  }

  // one pipeline step: tile t in stage `stage_index` (= (t - t_begin) % kStages)
  auto step = [&](int t, int stage_index) {
    cp_async_wait<kStages - 2>();  // tile t landed for this lane ...
    __syncwarp();                  // ... for the whole warp, which is also done with tile t - 1
    {
      const int pages = next_pages;
      next_pages = tile_pages(t + kStages);
      issue(t + kStages - 1, pages, stage_index == 0 ? kStages - 1 : stage_index - 1);
    }
    unsigned char* stage = s_warp + stage_index * kStageBytes;
    uint32_t sk = smem_addr(stage);
    uint32_t sv = sk + kCacheTile;
    if constexpr (kFp8) {
      unsigned char* staging = s_warp + kStages * kStageBytes;
      dequant_tile(staging, stage);
      dequant_tile(staging + kElemTile, stage + kCacheTile);
      __syncwarp();
      sk = smem_addr(staging);
      sv = sk + kElemTile;
    }

    Scores s;
    qk_tile(s, qf, q_addr, sk);

    const int tok0 = ch.begin + t * kTileKeys;
    float v_scale[kSBlocks];
    if constexpr (kFp8) {
      const float* sc = reinterpret_cast<const float*>(stage + 2 * kCacheTile);
      v_ref.take_first(sc);
#pragma unroll
      for (int nb = 0; nb < kSBlocks; ++nb) {
        const int pg = (nb * 8 / kPageSize) % kTilePages;
        const float k_scale = sc[pg * 4];
        v_scale[nb] = v_ref.ratio(sc + pg * 4);  // O in units of the warp's first V scale
#pragma unroll
        for (int mb = 0; mb < kMBlocks; ++mb)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[mb][nb][e] *= k_scale;
      }
    }
    if (tok0 + kTileKeys > warp_end || tok0 + kTileKeys > causal_from) {
#pragma unroll
      for (int mb = 0; mb < kMBlocks; ++mb)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int hi = min(warp_end, row_limit[mb][r]) - (tok0 + col0);
#pragma unroll
          for (int nb = 0; nb < kSBlocks; ++nb)
#pragma unroll
            for (int e = 0; e < 2; ++e)
              if (nb * 8 + e >= hi) s[mb][nb][2 * r + e] = kNegInf;
        }
    }

    // online softmax of the lane's rows (r = 0: elements 0, 1; r = 1: elements 2, 3)
    float factors[kMBlocks][2];
#pragma unroll
    for (int mb = 0; mb < kMBlocks; ++mb)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float mx = quad_row_max(s[mb], r);
        OnlineSoftmax& st = state[mb][r];
        const float factor = st.rescale(max_nan(st.m, mx * p.scale_log2));
        st.d += exp2_row<true>(s[mb], r, p.scale_log2, -softmax_shift(st.m), [&](int nb, float& x) {
          if constexpr (kFp8) x *= v_scale[nb];
        });
        factors[mb][r] = factor;
      }
    // Rescale O only when some row's max grew in this tile (rare once the first tiles have
    // set the maxima): a warp-uniform branch that skips kMBlocks * D / 2 multiplies per lane.
    bool grew = false;
#pragma unroll
    for (int mb = 0; mb < kMBlocks; ++mb) grew = grew || factors[mb][0] != 1.0f || factors[mb][1] != 1.0f;
    if (__any_sync(kFullMask, grew)) {
#pragma unroll
      for (int mb = 0; mb < kMBlocks; ++mb)
#pragma unroll
        for (int nb = 0; nb < kOBlocks; ++nb) {
          acc[mb][nb][0] *= factors[mb][0];
          acc[mb][nb][1] *= factors[mb][0];
          acc[mb][nb][2] *= factors[mb][1];
          acc[mb][nb][3] *= factors[mb][1];
        }
    }

    pv_tile(acc, s, sv);
  };
  for_each_tile<kUnrollStages>(t_begin, t_end, step);

  // the next kernel may launch once every CTA is past its main loop (where the trigger sits made
  // no difference; long decodes, slower with PDL, launch without it: see this folder's NOTES.md)
  ts::allow_dependent_grids();
  // ---- merge the warps: (m, l) per row and O through shared memory -----------------------
  if constexpr (kFp8) v_ref.apply(acc);
  cp_async_wait_all();
  __syncthreads();  // every warp is done with its pipeline area
  float* s_o = reinterpret_cast<float*>(smem + kRows * kElemRow);            // [kWarps][kRows][kMergePitch]
  float2* s_ml = reinterpret_cast<float2*>(s_o + kWarps * kRows * kMergePitch);  // [kWarps][kRows]
#pragma unroll
  for (int mb = 0; mb < kMBlocks; ++mb)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float l = state[mb][r].d;
      l += shfl_xor(l, 1);
      l += shfl_xor(l, 2);
      const int row = mb * 16 + (lane >> 2) + 8 * r;
      if ((lane & 3) == 0) s_ml[warp * kRows + row] = make_float2(state[mb][r].m, l);
      float* dst = s_o + (warp * kRows + row) * kMergePitch + col0;
#pragma unroll
      for (int nb = 0; nb < kOBlocks; ++nb)
        *reinterpret_cast<float2*>(dst + nb * 8) = make_float2(acc[mb][nb][2 * r], acc[mb][nb][2 * r + 1]);
    }
  __syncthreads();
  merge_warps_and_store<kRows>(p, ch, kvh, row_base, s_o, s_ml);
}
