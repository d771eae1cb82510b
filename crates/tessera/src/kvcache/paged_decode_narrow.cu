// paged_decode_narrow.cu: paged GQA decode for at most 8 query rows per CTA, keys as the MMA's M.
//
// Computes what paged_decode.cu computes (same parameters, same outputs and partials):
//   O[b, qi, h] = softmax_j(Q[b, qi, h] . K[b, j, kvh] * scale) V[b, j, kvh]
// for the query rows r = qi * group + hh of one KV head, but transposed, so that the few query
// rows of a decode step (group * q_len, typically 4 or 8) fill the MMA's n8 instead of wasting
// most of an m16:
//   S^T = K Q^T     mma.m16n8k16: A = 16 keys x 16 dims of K, B = Q^T (8 query rows)
//   online softmax per query column (a lane holds columns 2t, 2t+1 of keys g, g + 8)
//   O^T += V^T P^T  A = V^T (16 dims x 16 keys), B = P^T from S^T by movmatrix.trans
// Against the query-rows kernel this halves the MMAs and the O accumulators (D / 4 floats per
// lane) and needs no Q tile in shared memory. Rows beyond 8 take further CTAs (grid.z), each
// reading the K/V again; the planner uses this kernel when a KV head serves <= 8 rows.
//
// fp8 cache: no staging tile. The K and V fragments are converted from the e4m3 tile in
// registers. K: a lane reads 16 bytes of key row g (and g + 8) per 64 dims; word w of the 16
// bytes at dims 64 j + 16 t holds the lane's two A elements of k-step 4 j + w in its low half
// and the two of the +8 columns in its high half, so the dims are contracted in a permuted
// order and Q^T is loaded in the same order (b0 = Q[g][64 j + 16 t + 4 w + {0, 1}], b1 = +{2, 3}).
// V: a lane reads 16 dims (16 g .. 16 g + 15 per 128) of keys 2t, 2t + 1, 2t + 8, 2t + 9; byte
// permutes pair the keys column by column (dtype.cuh e4m3_interleave_to_f16x2), so O^T row
// (d tile dt, row g | g + 8) is dim 128 (dt / 8) + 16 g + 2 (dt % 8) + {0 | 1} (D = 64: 8 g + 2 dt).
// fp8 tiles are stored with chunk c of row r at c ^ ((r & 6) ^ ((r & 1) << 2)) (D = 64:
// c ^ ((r >> 1) & 3)), so the K and V reads above are free of bank conflicts for D >= 128
// (D = 64: the V reads, 8 bytes per lane, are 2-way conflicted). The O^T rows staged for the
// warp merge are conflicted for fp8 (dims 16 g apart); that happens once per CTA.
// Relies on the planner: a chunk starts at a multiple of kTileKeys (tiles of several pages
// start at a page), and Q rows are 16-byte aligned (the fp8 path loads Q 8 bytes at a time).
// Scales: the K scale of a page multiplies its scores; O is accumulated in units of the
// warp's first V scale, probabilities carrying the ratio of their page's scale to it.
//
// Work mapping: grid (Hkv, work items, ceil(rows / 8)), as paged_decode.cu; every warp runs
// its own cp.async pipeline of kStages K/V tiles over a contiguous run of tiles of the chunk
// (paged_decode_common.cuh TileLoader), no CTA barrier in the main loop; the warps merge their
// (m, l, O) through shared memory at the end.
//
// Shared memory (decode.rs `DecodeVariant::shared_bytes`): per warp kStages x (K tile, V tile
// of kTileKeys x D cache elements, fp8 scales); the merge reuses it (kWarps x 8 x (D + 4) f32
// + (m, l) pairs).
//
// Roofline: each K/V byte is read once per step: time >= KV bytes / HBM bandwidth (4.8 TB/s on
// the H200). The kernel aims to stay memory-bound for fp8 too, where the bytes per key halve
// and the instructions per key must follow.
#include "tessera/mma.cuh"
#include "tessera/paged_decode_common.cuh"

namespace {

constexpr int kRows = 8;                 // query rows of a CTA: the MMA's n8
constexpr int kKSteps = kHeadDim / 16;   // k16 steps of S^T = K Q^T
constexpr int kKeyTiles = kTileKeys / 16;  // m16 key tiles of a tile (k16 steps of O^T += V^T P^T)
constexpr int kDimTiles = kHeadDim / 16;   // m16 tiles of O^T
constexpr int kWarpBytes = kStages * kStageBytes;
/// Unroll the main loop by the stage count (stage offsets become constants) where the
/// registers allow it.
constexpr bool kUnrollStages = kHeadDim <= 128;

static_assert(kTileKeys % 16 == 0, "whole m16 key tiles");

// ---- fp8 tiles ------------------------------------------------------------------------------
/// The chunk XOR of row r of an fp8 tile (see the header comment).
TS_DEVICE constexpr int fp8_swizzle(int r) { return kCacheChunks >= 8 ? (r & 6) ^ ((r & 1) << 2) : (r >> 1) & 3; }
TS_DEVICE int fp8_offset(int r, int c) { return r * kCacheRow + (((c & ~7) | ((c & 7) ^ fp8_swizzle(r))) << 4); }

/// The K/V tile layout (TileLoader): fp8 tiles as above, 2-byte tiles swizzled for ldmatrix.
struct NarrowTile {
  static constexpr bool kSwizzled = true;
  static TS_DEVICE int offset(int r, int c) { return kFp8 ? fp8_offset(r, c) : swizzled(r, c); }
};

/// The O^T row (dimension) of d tile dt, fragment row g (+ 8 when `upper`).
TS_DEVICE int out_dim(int dt, int g, int upper) {
  if constexpr (!kFp8) {
    return dt * 16 + g + 8 * upper;
  } else if constexpr (kHeadDim >= 128) {
    return 128 * (dt / 8) + 16 * g + 2 * (dt % 8) + upper;
  } else {
    return 8 * g + 2 * dt + upper;
  }
}

// Q^T fragments of the lane (b0, b1 per k-step), in the contraction order of the K fragments.
using QFragments = uint32_t[kKSteps][2];
using Scores = float[kKeyTiles][4];   // S^T: [key tile][c0..c3]: keys g, g + 8 x query cols 2t, 2t + 1
using Accum = float[kDimTiles][4];    // O^T: [dim tile][c0..c3]

/// Loads the lane's Q^T fragments for query row `row` (zeros when row >= p.rows).
TS_DEVICE void load_q(QFragments& qf, const DecodeParams& p, int b, int kvh, int row) {
  const int t = lane_id() & 3;
  const bool valid = row < p.rows;
  const int qi = valid ? row / p.group : 0;
  const int h = kvh * p.group + (valid ? row % p.group : 0);
  const Elem* q = static_cast<const Elem*>(p.q) + b * p.q_stride_b + qi * p.q_stride_n + h * p.q_stride_h;
#pragma unroll
  for (int s = 0; s < kKSteps; ++s) {
    if constexpr (kFp8) {
      // dims 64 j + 16 t + 4 w + {0, 1} and + {2, 3} for k-step s = 4 j + w
      const U32x2 v = valid ? *reinterpret_cast<const U32x2*>(q + 64 * (s / 4) + 16 * t + 4 * (s % 4)) : U32x2{0, 0};
      qf[s][0] = v.x;
      qf[s][1] = v.y;
    } else {
      qf[s][0] = valid ? *reinterpret_cast<const uint32_t*>(q + 16 * s + 2 * t) : 0u;
      qf[s][1] = valid ? *reinterpret_cast<const uint32_t*>(q + 16 * s + 8 + 2 * t) : 0u;
    }
  }
}

/// S^T = K Q^T for the warp's tile of kTileKeys keys at shared address sk (cache tile). Each
/// key tile accumulates its even and odd k-steps separately (two MMA chains of kKSteps / 2
/// instead of one of kKSteps: the tile's latency is what a decode warp waits on).
TS_DEVICE void qk_tile(Scores& s, const QFragments& qf, uint32_t sk, const unsigned char* k_tile) {
  float part[kKeyTiles][2][4];
#pragma unroll
  for (int kt = 0; kt < kKeyTiles; ++kt)
#pragma unroll
    for (int h = 0; h < 2; ++h) part[kt][h][0] = part[kt][h][1] = part[kt][h][2] = part[kt][h][3] = 0.0f;
  if constexpr (kFp8) {
    const int g = lane_id() >> 2;
    const int t = lane_id() & 3;
#pragma unroll
    for (int kt = 0; kt < kKeyTiles; ++kt) {
#pragma unroll
      for (int j = 0; j < kHeadDim / 64; ++j) {
        const U32x4 lo = *reinterpret_cast<const U32x4*>(k_tile + fp8_offset(kt * 16 + g, t + 4 * j));
        const U32x4 hi = *reinterpret_cast<const U32x4*>(k_tile + fp8_offset(kt * 16 + g + 8, t + 4 * j));
        const uint32_t wl[4] = {lo.x, lo.y, lo.z, lo.w};
        const uint32_t wh[4] = {hi.x, hi.y, hi.z, hi.w};
#pragma unroll
        for (int w = 0; w < 4; ++w) {
          uint32_t a[4];
          e4m3x4_to_f16x4(wl[w], a[0], a[2]);  // row g: columns 2t.. | 2t + 8..
          e4m3x4_to_f16x4(wh[w], a[1], a[3]);  // row g + 8
#pragma unroll
          for (int e = 0; e < 4; ++e) a[e] = f16x2_to_elem(a[e]);
          mma_m16n8k16<Elem>(part[kt][w & 1], a, qf[4 * j + w][0], qf[4 * j + w][1]);
        }
      }
    }
  } else {
    const LaneAddr k = lane_addr_a(sk);
#pragma unroll
    for (int kt = 0; kt < kKeyTiles; ++kt)
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks) {
        uint32_t a[4];
        ldmatrix_x4(a, k.at(kt * 16, 2 * ks));
        mma_m16n8k16<Elem>(part[kt][ks & 1], a, qf[ks][0], qf[ks][1]);
      }
  }
#pragma unroll
  for (int kt = 0; kt < kKeyTiles; ++kt)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[kt][e] = part[kt][0][e] + part[kt][1][e];
}

/// O^T += V^T P^T with P^T (probabilities of S^T's layout) moved into B fragments, V at sv.
TS_DEVICE void pv_tile(Accum& acc, const Scores& p, uint32_t sv, const unsigned char* v_tile) {
#pragma unroll
  for (int kt = 0; kt < kKeyTiles; ++kt) {
    // keys g | g + 8 x query cols 2t, 2t + 1 -> keys 2t, 2t + 1 | 2t + 8, 2t + 9 x query col g
    const uint32_t b0 = movmatrix_trans(pack2<Elem>(p[kt][0], p[kt][1]));
    const uint32_t b1 = movmatrix_trans(pack2<Elem>(p[kt][2], p[kt][3]));
    if constexpr (kFp8) {
      const int g = lane_id() >> 2;
      const int r0 = kt * 16 + 2 * (lane_id() & 3);  // keys r0, r0 + 1, r0 + 8, r0 + 9
      if constexpr (kHeadDim >= 128) {
#pragma unroll
        for (int j = 0; j < kHeadDim / 128; ++j) {
          U32x4 rows[4];
#pragma unroll
          for (int i = 0; i < 4; ++i)
            rows[i] = *reinterpret_cast<const U32x4*>(v_tile + fp8_offset(r0 + (i & 1) + 8 * (i >> 1), g + 8 * j));
          const uint32_t w[4][4] = {{rows[0].x, rows[0].y, rows[0].z, rows[0].w},
                                    {rows[1].x, rows[1].y, rows[1].z, rows[1].w},
                                    {rows[2].x, rows[2].y, rows[2].z, rows[2].w},
                                    {rows[3].x, rows[3].y, rows[3].z, rows[3].w}};
#pragma unroll
          for (int i = 0; i < 4; ++i) {  // word i: dims 16 g + 4 i .. + 3 = d tiles 8 j + 2 i, + 1
            uint32_t lo[4];
            uint32_t hi[4];
            e4m3_interleave_to_f16x2(w[0][i], w[1][i], lo);  // keys r0, r0 + 1
            e4m3_interleave_to_f16x2(w[2][i], w[3][i], hi);  // keys r0 + 8, r0 + 9
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const uint32_t a[4] = {f16x2_to_elem(lo[2 * h]), f16x2_to_elem(lo[2 * h + 1]), f16x2_to_elem(hi[2 * h]),
                                     f16x2_to_elem(hi[2 * h + 1])};
              mma_m16n8k16<Elem>(acc[8 * j + 2 * i + h], a, b0, b1);
            }
          }
        }
      } else {
        // D = 64: 8 bytes (dims 8 g .. 8 g + 7) of each key
        uint32_t w[4][2];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int r = r0 + (i & 1) + 8 * (i >> 1);
          const U32x2 v = *reinterpret_cast<const U32x2*>(v_tile + fp8_offset(r, g >> 1) + 8 * (g & 1));
          w[i][0] = v.x;
          w[i][1] = v.y;
        }
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          uint32_t lo[4];
          uint32_t hi[4];
          e4m3_interleave_to_f16x2(w[0][i], w[1][i], lo);
          e4m3_interleave_to_f16x2(w[2][i], w[3][i], hi);
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const uint32_t a[4] = {f16x2_to_elem(lo[2 * h]), f16x2_to_elem(lo[2 * h + 1]), f16x2_to_elem(hi[2 * h]),
                                   f16x2_to_elem(hi[2 * h + 1])};
            mma_m16n8k16<Elem>(acc[2 * i + h], a, b0, b1);
          }
        }
      }
    } else {
      const LaneAddr v = lane_addr_b(sv);
#pragma unroll
      for (int dt = 0; dt < kDimTiles; ++dt) {
        uint32_t a[4];
        ldmatrix_x4_trans(a, v.at(kt * 16, 2 * dt));
        mma_m16n8k16<Elem>(acc[dt], a, b0, b1);
      }
    }
  }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(kThreads, kMinCtasPerSm)
    paged_decode_narrow(const __grid_constant__ ts::DecodeParams p) {
  ts::wait_prior_grids();  // programmatic dependent launch: no global access before this
  const int kvh = blockIdx.x;
  const int item = blockIdx.y;
  const int row_base = blockIdx.z * kRows;  // first query row of this CTA
  const DecodeChunk ch = chunk_of(p, item);
  const int lane = lane_id();
  const int warp = warp_id();
  const int g = lane >> 2;
  const int t = lane & 3;

  unsigned char* smem = dynamic_smem<unsigned char>();
  unsigned char* s_warp = smem + warp * kWarpBytes;

  // ---- this warp's tiles ------------------------------------------------------------------
  int t_begin;
  const TileLoader<NarrowTile> loader = warp_tile_loader<NarrowTile>(p, ch, kvh, warp, s_warp, t_begin);
  const int t_end = loader.t_end;
  const int warp_end = loader.warp_end;
  int next_pages = loader.pages_of(t_begin);
  unroll_for<kStages - 1>([&](auto i) {
    const int pages = next_pages;
    next_pages = loader.pages_of(t_begin + decltype(i)::value + 1);
    loader.issue(t_begin + decltype(i)::value, pages, decltype(i)::value);
  });

  // ---- per-lane state: query columns 2t, 2t + 1 ----------------------------------------------
  QFragments qf;
  load_q(qf, p, ch.b, kvh, row_base + g);
  Accum acc;
#pragma unroll
  for (int dt = 0; dt < kDimTiles; ++dt) acc[dt][0] = acc[dt][1] = acc[dt][2] = acc[dt][3] = 0.0f;
  OnlineSoftmax state[2] = {OnlineSoftmax::empty(), OnlineSoftmax::empty()};
  VScaleRef v_ref;  // fp8
  // keys < row_limit[e] are visible to query column 2t + e (causal with q_len > 1)
  int row_limit[2];
#pragma unroll
  for (int e = 0; e < 2; ++e) row_limit[e] = visible_key_limit(p, ch, row_base + 2 * t + e);
  const int causal_from = ch.len - p.q_len + 1;  // row 0's limit: tiles past it need the mask

  // one pipeline step: tile t in stage `stage_index` (= (t - t_begin) % kStages)
  auto step = [&](int tile, int stage_index) {
    cp_async_wait<kStages - 2>();  // the tile landed for this lane ...
    __syncwarp();                  // ... for the whole warp, which is also done with the last one
    {
      const int pages = next_pages;
      next_pages = loader.pages_of(tile + kStages);
      loader.issue(tile + kStages - 1, pages, stage_index == 0 ? kStages - 1 : stage_index - 1);
    }
    const unsigned char* k_tile = s_warp + stage_index * kStageBytes;
    const unsigned char* v_tile = k_tile + kCacheTile;
    const uint32_t sk = smem_addr(k_tile);

    Scores s;
    qk_tile(s, qf, sk, k_tile);

    const int tok0 = ch.begin + tile * kTileKeys;
    float v_scale[kKeyTiles][2];
    if constexpr (kFp8) {
      const float* sc = reinterpret_cast<const float*>(v_tile + kCacheTile);
      v_ref.take_first(sc);
#pragma unroll
      for (int kt = 0; kt < kKeyTiles; ++kt)
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          const int pg = kTilePages == 1 ? 0 : (kt * 16 + g + 8 * u) / kPageSize;
          v_scale[kt][u] = v_ref.ratio(sc + pg * 4);
          const float k_scale = sc[pg * 4];
          s[kt][2 * u] *= k_scale;
          s[kt][2 * u + 1] *= k_scale;
        }
    }
    if (tok0 + kTileKeys > warp_end || tok0 + kTileKeys > causal_from) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int hi = min(warp_end, row_limit[e]) - tok0;
#pragma unroll
        for (int kt = 0; kt < kKeyTiles; ++kt)
#pragma unroll
          for (int u = 0; u < 2; ++u)
            if (kt * 16 + g + 8 * u >= hi) s[kt][2 * u + e] = kNegInf;
      }
    }

    // online softmax of the lane's query columns (e = 0: elements 0, 2; e = 1: elements 1, 3)
    float factors[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float mx = kNegInf;
#pragma unroll
      for (int kt = 0; kt < kKeyTiles; ++kt) mx = max_nan(mx, max_nan(s[kt][e], s[kt][2 + e]));
      mx = max_nan(mx, shfl_xor(mx, 4));
      mx = max_nan(mx, shfl_xor(mx, 8));
      mx = max_nan(mx, shfl_xor(mx, 16));
      OnlineSoftmax& st = state[e];
      factors[e] = st.rescale(max_nan(st.m, mx * p.scale_log2));
      const float neg_shift = -softmax_shift(st.m);
      float sum = 0.0f;
#pragma unroll
      for (int kt = 0; kt < kKeyTiles; ++kt)
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          float& x = s[kt][2 * u + e];
          x = exp2_fma(x, p.scale_log2, neg_shift);
          sum += x;
          if constexpr (kFp8) x *= v_scale[kt][u];
        }
      st.d += sum;
    }
    // rescale O only when some column's max grew in this tile (rare after the first tiles)
    if (__any_sync(kFullMask, factors[0] != 1.0f || factors[1] != 1.0f)) {
#pragma unroll
      for (int dt = 0; dt < kDimTiles; ++dt) {
        acc[dt][0] *= factors[0];
        acc[dt][1] *= factors[1];
        acc[dt][2] *= factors[0];
        acc[dt][3] *= factors[1];
      }
    }

    pv_tile(acc, s, sk + kCacheTile, v_tile);
  };
  for_each_tile<kUnrollStages>(t_begin, t_end, step);

  // the next kernel may launch once every CTA is past its main loop (where the trigger sits made
  // no difference; long decodes, slower with PDL, launch without it: see this folder's NOTES.md)
  ts::allow_dependent_grids();
  // ---- merge the warps: (m, l) per query row and O through shared memory ----------------------
  if constexpr (kFp8) v_ref.apply(acc);
  cp_async_wait_all();
  __syncthreads();  // every warp is done with its pipeline area
  float* s_o = reinterpret_cast<float*>(smem);                                  // [kWarps][kRows][kMergePitch]
  float2* s_ml = reinterpret_cast<float2*>(s_o + kWarps * kRows * kMergePitch);  // [kWarps][kRows]
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    float l = state[e].d;  // the lane's keys g, g + 8 of every tile: sum over g
    l += shfl_xor(l, 4);
    l += shfl_xor(l, 8);
    l += shfl_xor(l, 16);
    const int row = 2 * t + e;
    if (g == 0) s_ml[warp * kRows + row] = make_float2(state[e].m, l);
    float* dst = s_o + (warp * kRows + row) * kMergePitch;
#pragma unroll
    for (int dt = 0; dt < kDimTiles; ++dt) {
      dst[out_dim(dt, g, 0)] = acc[dt][e];
      dst[out_dim(dt, g, 1)] = acc[dt][2 + e];
    }
  }
  __syncthreads();
  merge_warps_and_store<kRows>(p, ch, kvh, row_base, s_o, s_ml);
}
