// tessera/paged_decode_common.cuh: the parts of the two paged decode kernels that do not
// depend on how query rows meet the MMA (paged_decode.cu: query rows as M; paged_decode_narrow.cu:
// keys as M). Included after the generated preamble, whose constants it reads: Elem, Cache,
// kHeadDim, kPageSize, kWarps, kTileKeys, kStages, kFp8.
//
// Defines:
//   BoolTag / IntTag / unroll_for      compile-time flags and indices for generic lambdas
//   DecodeChunk, chunk_of(p, item)     the key range [begin, end) of a work item
//   f16x2_to_elem                      an f16x2 register (decoded fp8) as the query dtype
//   swizzled / LaneAddr                2-byte tiles with chunk c of row r at c ^ (r % 8), and the
//                                      per-lane ldmatrix addresses into them
//   TileLoader, warp_tile_loader       one warp's cp.async stream of K/V tiles (and fp8 scales)
//                                      through a pipeline of kStages stages in its shared memory
//   for_each_tile                      the warp's main loop over its tiles (optionally unrolled
//                                      by the stage count)
//   visible_key_limit                  the causal limit of a query row (speculative decoding)
//   VScaleRef                          fp8: the V-scale reference O is accumulated in
//   merge_warps_and_store<kRows>       merges the warps' (m, l, O) rows staged in shared memory
//                                      and writes the output, or the split-KV partial; the CTA
//                                      that writes its sequence's last partial then merges them all
//   merge_chunks_and_store<kRows>      that final merge of the partials of every chunk
//
// Stage layout (per warp, kStageBytes each): K tile, V tile (kTileKeys rows x kCacheRow bytes,
// placed by the kernel's own row/chunk -> offset map, e.g. a swizzle), then for fp8 the (k, v)
// scale pair of each page of the tile, 16 bytes apart.
#pragma once
#include "tessera/async_copy.cuh"
#include "tessera/kvcache_params.cuh"
#include "tessera/math.cuh"
#include "tessera/mma.cuh"
#include "tessera/online_softmax.cuh"
#include "tessera/vec.cuh"

namespace {

using namespace ts;

constexpr int kThreads = kWarps * kWarpSize;
constexpr int kCacheRow = kHeadDim * (int)sizeof(Cache);   // bytes of a cache row
constexpr int kCacheChunks = kCacheRow / 16;               // 16-byte chunks of a cache row
constexpr int kTilePages = kPageSize < kTileKeys ? kTileKeys / kPageSize : 1;
constexpr int kCacheTile = kTileKeys * kCacheRow;          // bytes of one K (or V) tile
constexpr int kScaleBytes = kFp8 ? 16 * kTilePages : 0;    // per stage: (k, v) per page, padded
constexpr int kStageBytes = 2 * kCacheTile + kScaleBytes;

static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256, "head dim 64, 128 or 256");
static_assert(kTileKeys == 16 || kTileKeys == 32 || kTileKeys == 64, "kTileKeys: 16, 32 or 64");
static_assert(kPageSize >= 8 && (kPageSize & (kPageSize - 1)) == 0, "page size: a power of two >= 8");
static_assert(kPageSize % kTileKeys == 0 || kTileKeys % kPageSize == 0, "a tile covers whole pages or lies in one");
static_assert(kTilePages <= kWarpSize, "page ids of a tile fit in a warp");
static_assert((kTileKeys * kCacheChunks) % kWarpSize == 0, "whole copies per lane");
static_assert(kWarpSize % kCacheChunks == 0 || kCacheChunks % kWarpSize == 0, "lane -> chunk map");
static_assert(kStages >= 2, "at least double buffering");
static_assert(is_same_v<Elem, f16> || is_same_v<Elem, bf16>, "Elem: f16 or bf16");
static_assert(kFp8 == is_same_v<Cache, fp8e4m3>, "kFp8 iff the cache is e4m3");
static_assert(kFp8 || is_same_v<Cache, Elem>, "a 2-byte cache has the query dtype");

/// A compile-time flag passed as an argument (selects a code path of a generic lambda).
template <bool B>
struct BoolTag {
  static constexpr bool value = B;
};

/// A compile-time int passed as an argument (the pipeline stage of an unrolled step).
template <int N>
struct IntTag {
  static constexpr int value = N;
};

/// Calls f(IntTag<0>{}), ..., f(IntTag<N - 1>{}): a loop whose index is a constant in each copy.
template <int N, int I = 0, typename F>
TS_DEVICE void unroll_for(F&& f) {
  if constexpr (I < N) {
    f(IntTag<I>{});
    unroll_for<N, I + 1>(f);
  }
}

/// The key range of one CTA: [begin, end) of sequence b, and whether it is b's only chunk.
struct DecodeChunk {
  int b;
  int slot;   // partial slot: item_indptr[b] + chunk index
  int begin;
  int end;
  int len;
  bool only;
};

TS_DEVICE DecodeChunk chunk_of(const DecodeParams& p, int item) {
  const int b = p.item_seq[item];
  const int k = p.item_seq[p.num_items + item];  // chunk index (packed after the sequence ids)
  const int first = p.item_indptr[b];
  const int n = p.item_indptr[b + 1] - first;
  const int len = p.tables.seq_lens[b];
  const int begin = min(k * p.chunk_tokens, len);
  const int end = k == n - 1 ? len : min(begin + p.chunk_tokens, len);
  return DecodeChunk{b, first + k, begin, end, len, n == 1};
}

/// One warp's stream of K/V tiles: tiles t_begin <= t < t_end of its chunk (kTileKeys keys
/// each), tile t into stage (t - t_begin) % kStages. Page ids are looked up one tile ahead:
/// pages_of(t) gives lane l < kTilePages the physical page of the tile's l-th page (0 past the
/// table), and issue() broadcasts them by shuffles. Rows at or past warp_end are zero-filled,
/// never read.
///
/// Copy i of lane l is 16-byte chunk l + 32 i of a tile: row r = l / kCacheChunks + i * kRowStep
/// (kRowStep = 32 / kCacheChunks, or 1 with kCacheChunks > 32 where r = (l + 32 i) /
/// kCacheChunks), chunk c fixed per lane. Its source is a per-lane offset plus i times a uniform
/// stride, and its destination (TileMap::offset(r, c)) repeats with period kDstPeriod in i
/// up to a multiple of 512 bytes (kRowStep rows of kCacheRow bytes), so both are computed once
/// per warp; a tile of several pages adds one base address per page (the page of copy i is a
/// constant). A copy then costs two 64-bit adds and its cp.async. That fast path is taken for
/// swizzled tiles (TileMap::kSwizzled: chunks XORed by a function of r % 8); plain-row tiles
/// (r * kCacheRow + c * 16) take the general path, which keeps no per-lane state (the wide fp8
/// kernel has no registers to spare).
///
/// TileMap, the kernel's tile layout: `static int offset(int r, int c)`, the byte of row r,
/// 16-byte chunk c within a K (or V) tile, and `static constexpr bool kSwizzled`.
template <typename TileMap>
struct TileLoader {
  static constexpr bool kSwizzled = TileMap::kSwizzled;
  static constexpr int kCopies = kTileKeys * kCacheChunks / kWarpSize;  // per lane, per K (and V) tile
  static constexpr int kRowStep = kCacheChunks <= kWarpSize ? kWarpSize / kCacheChunks : 0;
  // TileMap::offset(r, c) depends on r through r * kCacheRow and a swizzle of r % 8
  static constexpr int kDstPeriod = kRowStep == 0 ? 1 : min_c(kCopies, 8 / min_c(kRowStep, 8));

  const unsigned char* cache;
  const int* table;
  const float* scales;
  unsigned char* stages;  // the warp's kStages x kStageBytes
  long long token_bytes;  // one token of one page half: Hkv x kCacheRow
  long long head_off;     // kvh x kCacheRow
  int first_token;        // the chunk's first key
  int table_pages;
  int t_end;
  int warp_end;
  int heads_kv;
  int kvh;
  // kSwizzled: the lane's source offset from the tile's first row and its destinations, kept in
  // registers (unswizzled tiles take the general path, which needs no extra registers)
  int lane_src;
  int dst_base[kDstPeriod];

  TS_DEVICE void init_lane() {
    if constexpr (kSwizzled) {
      const int lane = lane_id();
      lane_src = (int)(lane / kCacheChunks * token_bytes) + lane % kCacheChunks * 16;
#pragma unroll
      for (int i = 0; i < kDstPeriod; ++i) {
        const int idx = lane + i * kWarpSize;
        dst_base[i] = TileMap::offset(idx / kCacheChunks, idx % kCacheChunks);
      }
    }
  }

  TS_DEVICE int pages_of(int t) const {
    const int lane = lane_id();
    const int lp = (first_token + t * kTileKeys) / kPageSize + lane;
    return (t < t_end && lane < kTilePages && lp < table_pages) ? __ldg(table + lp) : 0;
  }

  /// Starts the copies of tile t (pages from pages_of(t)) into stage `stage`, then commits one
  /// cp.async group (empty past t_end, so cp_async_wait<kStages - 2> stays exact). Row r,
  /// 16-byte chunk c of a tile lands at byte TileMap::offset(r, c) of its K (V) tile.
  TS_DEVICE void issue(int t, int pages, int stage) const {
    if (t < t_end) {
      const int lane = lane_id();
      const int tok0 = first_token + t * kTileKeys;
      const uint32_t sbase = smem_addr(stages + stage * kStageBytes);
      const long long v_offset = (long long)kPageSize * token_bytes;  // V half after the K half
      auto copy_tile = [&](auto full) {
        if constexpr (kRowStep > 0 && kSwizzled) {
          // the copies of a page are consecutive (kPageSize / kRowStep of them): one base
          // address per page of the tile, a constant stride per copy
          constexpr int kPerPage = kCopies / kTilePages;
          static_assert(kPageSize % kRowStep == 0 || kTilePages == 1, "a copy's page is a constant");
          const int lane_row = lane / kCacheChunks;
          const long long step = kRowStep * token_bytes;
#pragma unroll
          for (int pg = 0; pg < kTilePages; ++pg) {
            const unsigned char* src0 =
                cache + ((long long)__shfl_sync(kFullMask, pages, pg) * 2 * kPageSize + tok0 % kPageSize) * token_bytes +
                head_off + lane_src;
#pragma unroll
            for (int k = 0; k < kPerPage; ++k) {
              const int i = pg * kPerPage + k;
              const unsigned char* src = src0 + k * step;
              const uint32_t dst =
                  sbase + dst_base[i % kDstPeriod] + (i / kDstPeriod) * kDstPeriod * kRowStep * kCacheRow;
              if constexpr (decltype(full)::value) {
                cp_async_16(dst, src);                          // K
                cp_async_16(dst + kCacheTile, src + v_offset);  // V
              } else {
                const bool valid = tok0 + lane_row + i * kRowStep < warp_end;
                cp_async_16_zfill(dst, valid ? src : cache, valid);
                cp_async_16_zfill(dst + kCacheTile, valid ? src + v_offset : cache, valid);
              }
            }
          }
        } else {
          const unsigned char* tile_base =
              cache + ((long long)__shfl_sync(kFullMask, pages, 0) * 2 * kPageSize + tok0 % kPageSize) * token_bytes +
              head_off;
#pragma unroll
          for (int i = 0; i < kCopies; ++i) {
            const int idx = lane + i * kWarpSize;
            const int r = idx / kCacheChunks;
            const int c = idx % kCacheChunks;
            const unsigned char* src;
            if constexpr (kTilePages == 1) {
              src = tile_base + r * token_bytes + c * 16;
            } else {
              const int page = __shfl_sync(kFullMask, pages, r / kPageSize);
              src = cache + ((long long)page * 2 * kPageSize + r % kPageSize) * token_bytes + head_off + c * 16;
            }
            const uint32_t dst = sbase + TileMap::offset(r, c);
            if constexpr (decltype(full)::value) {
              cp_async_16(dst, src);
              cp_async_16(dst + kCacheTile, src + v_offset);
            } else {
              const bool valid = tok0 + r < warp_end;
              cp_async_16_zfill(dst, valid ? src : cache, valid);
              cp_async_16_zfill(dst + kCacheTile, valid ? src + v_offset : cache, valid);
            }
          }
        }
      };
      if (tok0 + kTileKeys <= warp_end) {  // no row past the warp's last key
        copy_tile(BoolTag<true>{});
      } else {
        copy_tile(BoolTag<false>{});
      }
      if constexpr (kFp8) {
        // (k, v) scale pair of each page of the tile: 8 bytes at [page][kvh][0..2)
        const int page = __shfl_sync(kFullMask, pages, lane % kTilePages);
        if (lane < kTilePages) cp_async_8(sbase + 2 * kCacheTile + lane * 16, scales + ((long long)page * heads_kv + kvh) * 2);
      }
    }
    cp_async_commit();
  }
};

/// The tile loader of warp `warp` of a CTA serving chunk `ch` of KV head kvh: the chunk's
/// kTileKeys tiles are split into contiguous runs, one per warp ([t_begin, t_end)); keys from
/// warp_end on belong to the next warp (or lie past the chunk) and are masked.
template <typename TileMap>
TS_DEVICE TileLoader<TileMap> warp_tile_loader(const DecodeParams& p, const DecodeChunk& ch, int kvh, int warp,
                                               unsigned char* s_warp, int& t_begin) {
  const int n_tiles = ceil_div(ch.end - ch.begin, kTileKeys);
  t_begin = n_tiles * warp / kWarps;
  const int t_end = n_tiles * (warp + 1) / kWarps;
  const int warp_end = min(ch.begin + t_end * kTileKeys, ch.end);
  TileLoader<TileMap> loader{static_cast<const unsigned char*>(p.cache),
                             p.tables.page_indices + p.tables.page_indptr[ch.b],
                             p.scales,
                             s_warp,
                             (long long)p.heads_kv * kCacheRow,
                             (long long)kvh * kCacheRow,
                             ch.begin,
                             ceil_div(ch.len, kPageSize),
                             t_end,
                             warp_end,
                             p.heads_kv,
                             kvh};
  loader.init_lane();
  return loader;
}

/// Runs step(t, stage) for the warp's tiles t_begin <= t < t_end, stage = (t - t_begin) %
/// kStages. kUnroll: the loop is unrolled by kStages so that every stage (and the addresses
/// derived from it) is a compile-time constant (fewer instructions per tile where the registers
/// allow it; see this folder's NOTES.md).
template <bool kUnroll, typename Step>
TS_DEVICE void for_each_tile(int t_begin, int t_end, Step&& step) {
  if constexpr (kUnroll) {
    for (int t = t_begin; t < t_end; t += kStages) {
      unroll_for<kStages>([&](auto i) {
        if (t + decltype(i)::value < t_end) step(t + decltype(i)::value, decltype(i)::value);
      });
    }
  } else {
    for (int t = t_begin; t < t_end; ++t) step(t, (t - t_begin) % kStages);
  }
}

/// Keys [0, limit) of the sequence are visible to query row `row` (r = qi * group + hh): query
/// token qi sits at position len - q_len + qi (causal speculative decoding). Row 0 has the
/// smallest limit, len - q_len + 1: tiles reaching it need the causal mask.
TS_DEVICE int visible_key_limit(const DecodeParams& p, const DecodeChunk& ch, int row) {
  return ch.len - p.q_len + min(row / p.group, p.q_len - 1) + 1;
}

/// fp8: O is accumulated in units of the warp's first V scale (`ref`, taken from its first
/// tile), so each page's probabilities carry the ratio of its V scale to that one (near 1 for
/// the pages of one sequence: P * ratio neither overflows nor underflows fp16).
struct VScaleRef {
  float ref = 0.0f;  // 0 until the warp's first tile
  float inv = 0.0f;
  /// Per tile, before ratio(): on the warp's first tile, takes the V scale of the tile's first
  /// page (its (K, V) scales at `first`) as the reference.
  TS_DEVICE void take_first(const float* first) {
    if (ref == 0.0f) {
      ref = first[1];
      inv = fast_rcp(ref);
    }
  }
  /// The ratio for the page whose (K, V) scales are at `page_scales`.
  TS_DEVICE float ratio(const float* page_scales) const { return page_scales[1] * inv; }
  /// Scales the accumulators (a float array of any shape) back to V units before the merge
  /// (nothing when the warp saw no tile).
  template <typename Accum>
  TS_DEVICE void apply(Accum& acc) const {
    if (ref != 0.0f) {
      float* x = reinterpret_cast<float*>(&acc);
#pragma unroll
      for (int i = 0; i < (int)(sizeof(Accum) / sizeof(float)); ++i) x[i] *= ref;
    }
  }
};

/// f16x2 -> Elem x2 (exact for the f16 values an e4m3 byte decodes to).
TS_DEVICE uint32_t f16x2_to_elem(uint32_t x) {
  if constexpr (is_same_v<Elem, f16>) {
    return x;
  } else {
    const Array<float, 2> f = unpack_f16x2(x);
    return pack2<Elem>(f[0], f[1]);
  }
}

// ---- swizzled Elem tiles: 16-byte chunk c of row r stored at chunk c ^ (r % 8) -------------
constexpr int kElemRow = kHeadDim * (int)sizeof(Elem);  // bytes of an Elem row
TS_DEVICE int chunk_offset(int c, int x) { return ((c & ~7) | ((c & 7) ^ x)) << 4; }
TS_DEVICE int swizzled(int r, int c) { return r * kElemRow + chunk_offset(c, r & 7); }

/// Per-lane ldmatrix addressing into a swizzled Elem tile (lane l supplies row l % 8 of
/// matrix l / 8; mma.cuh). Every row a lane addresses is = l % 8 (mod 8), so its XOR term is
/// fixed and compile-time tile coordinates become constant offsets.
struct LaneAddr {
  uint32_t row;  // shared address of the lane's row
  int x;         // the lane's chunk XOR
  TS_DEVICE uint32_t at(int row_const, int chunk_const) const {
    return row + row_const * kElemRow + chunk_offset(chunk_const, x);
  }
};
/// Matrix m -> rows + 8 (m & 1), chunk + (m >> 1): the A fragment of a row-major [m][k] tile,
/// or with .trans the B fragments of two n8 blocks of a [k][n] tile.
TS_DEVICE LaneAddr lane_addr_a(uint32_t tile) {
  const int l = lane_id();
  return LaneAddr{tile + ((l & 7) + ((l >> 3) & 1) * 8) * kElemRow, (l >> 4) ^ (l & 7)};
}
/// Matrix m -> rows + 8 (m >> 1), chunk + (m & 1): the B fragments of two n8 blocks of an
/// [n][k] tile, or with .trans the A fragment of a [k][m] tile.
TS_DEVICE LaneAddr lane_addr_b(uint32_t tile) {
  const int l = lane_id();
  return LaneAddr{tile + ((l & 7) + (l >> 4) * 8) * kElemRow, ((l >> 3) & 1) ^ (l & 7)};
}

/// Writes 4 output columns of query row `row` (of KV head kvh) and, from column 0, its LSE.
TS_DEVICE void store_output(const DecodeParams& p, int b, int kvh, int row, int c, float o0, float o1, float o2,
                            float o3, float lse) {
  const int qi = row / p.group;
  const int h = kvh * p.group + row % p.group;
  Elem* dst = static_cast<Elem*>(p.o) + b * p.o_stride_b + qi * p.o_stride_n + h * p.o_stride_h + c;
  st_global_b64(dst, U32x2{pack2<Elem>(o0, o1), pack2<Elem>(o2, o3)});
  if (p.lse != nullptr && c == 0) p.lse[((long long)b * p.q_len + qi) * p.heads_q + h] = lse;
}

/// Floats per row of the warps' staged O rows (breaks the 8-row bank pattern).
constexpr int kMergePitch = kHeadDim + 4;

/// Partials merged per batch of loads in merge_chunks_and_store (all issued before any is used).
constexpr int kChunkBatch = 4;

/// Split-KV, run by the one CTA of (sequence ch.b, KV head kvh, row group) that wrote the last
/// of the sequence's `count` partials (slots first .. first + count - 1): merges the normalised partials o_i with weights
/// 2^(x_i - m) / d (x_i = lse_i * log2 e, m = max_i x_i, d = sum_i 2^(x_i - m), folded batch by
/// batch into one ts::OnlineSoftmax) and writes the output and LSE. A chunk that saw no visible
/// key (lse_i = -inf, o_i = 0) weighs 0; a row no chunk saw gets O = 0 and LSE = -inf. The
/// partials were written by other CTAs of this grid: read from L2 (kL2Only) after the acquire.
template <int kRows>
TS_DEVICE void merge_chunks_and_store(const DecodeParams& p, const DecodeChunk& ch, int kvh, int row_base, int first,
                                      int count) {
  for (int idx = thread_id(); idx < kRows * (kHeadDim / 4); idx += kThreads) {
    const int grow = row_base + idx / (kHeadDim / 4);
    const int c = (idx % (kHeadDim / 4)) * 4;
    if (grow >= p.rows) continue;
    // partial row of slot s: (s * Hkv + kvh) * rows + grow
    const long long row0 = ((long long)first * p.heads_kv + kvh) * p.rows + grow;
    const long long slot_stride = (long long)p.heads_kv * p.rows;
    OnlineSoftmax st = OnlineSoftmax::empty();
    float o[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int i0 = 0; i0 < count; i0 += kChunkBatch) {
      Array<float, kChunkBatch> x;
      U32x4 v[kChunkBatch];
#pragma unroll
      for (int j = 0; j < kChunkBatch; ++j) {
        const long long row = row0 + (long long)min(i0 + j, count - 1) * slot_stride;
        x[j] = i0 + j < count ? __uint_as_float(ld_global_b32<CacheLoad::kL2Only>(p.lse_partial + row)) * kLog2e
                                 : kNegInf;
        v[j] = ld_global_b128<CacheLoad::kL2Only>(p.o_partial + row * kHeadDim + c);
      }
      const float factor = st.update_chunk(x);
      const float shift = softmax_shift(st.m);
#pragma unroll
      for (int e = 0; e < 4; ++e) o[e] *= factor;
#pragma unroll
      for (int j = 0; j < kChunkBatch; ++j) {
        const float w = exp2_shifted(x[j], shift);
        if (w == 0.0f) continue;  // an empty chunk, a batch's padding, or one negligible against the rest
        o[0] += w * __uint_as_float(v[j].x);
        o[1] += w * __uint_as_float(v[j].y);
        o[2] += w * __uint_as_float(v[j].z);
        o[3] += w * __uint_as_float(v[j].w);
      }
    }
    const float inv_d = st.d > 0.0f ? 1.0f / st.d : 0.0f;
    store_output(p, ch.b, kvh, grow, c, o[0] * inv_d, o[1] * inv_d, o[2] * inv_d, o[3] * inv_d, st.lse());
  }
}

/// After a __syncthreads: every warp w has staged, for each of the CTA's kRows query rows r,
/// its unnormalised O row at s_o[(w * kRows + r) * kMergePitch] and its (m, l) at
/// s_ml[w * kRows + r]. Merges them by the online-softmax rule and writes the output (a
/// sequence of one chunk) or the normalised f32 partial and LSE; rows >= p.rows are skipped.
/// s_ml[0] is reused for a flag afterwards.
///
/// Split-KV without a second kernel: after writing its partial, the CTA counts itself in
/// p.chunk_counters[(b * Hkv + kvh) * gridDim.z + blockIdx.z] (release: barrier, then a fence
/// and the atomic by thread 0). The CTA that brings the count to the sequence's chunk count is
/// the last of its sequence's chunks: it re-arms the counter to 0 for the next launch, acquires (fence) and
/// merges every partial (merge_chunks_and_store). No CTA ever waits for another.
template <int kRows>
TS_DEVICE void merge_warps_and_store(const DecodeParams& p, const DecodeChunk& ch, int kvh, int row_base,
                                     const float* s_o, float2* s_ml) {
  const long long part_row0 = ((long long)ch.slot * p.heads_kv + kvh) * p.rows;
  for (int idx = thread_id(); idx < kRows * (kHeadDim / 4); idx += kThreads) {
    const int row = idx / (kHeadDim / 4);
    const int c = (idx % (kHeadDim / 4)) * 4;
    const int grow = row_base + row;
    if (grow >= p.rows) continue;
    float m = kNegInf;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) m = max_nan(m, s_ml[w * kRows + row].x);
    const float shift = softmax_shift(m);
    float l = 0.0f;
    float o[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float2 ml = s_ml[w * kRows + row];
      const float f = exp2_shifted(ml.x, shift);  // 0 for a warp that saw no key
      if (f == 0.0f) continue;
      l += f * ml.y;
      const float4 ow = *reinterpret_cast<const float4*>(s_o + (w * kRows + row) * kMergePitch + c);
      o[0] += f * ow.x;
      o[1] += f * ow.y;
      o[2] += f * ow.z;
      o[3] += f * ow.w;
    }
    const float inv_l = l > 0.0f ? 1.0f / l : 0.0f;  // no visible key: O = 0, LSE = -inf
    if (ch.only) {
      store_output(p, ch.b, kvh, grow, c, o[0] * inv_l, o[1] * inv_l, o[2] * inv_l, o[3] * inv_l,
                   OnlineSoftmax{m, l}.lse());
    } else {
      float* dst = p.o_partial + (part_row0 + grow) * kHeadDim + c;
      *reinterpret_cast<float4*>(dst) = make_float4(o[0] * inv_l, o[1] * inv_l, o[2] * inv_l, o[3] * inv_l);
      if (c == 0) p.lse_partial[part_row0 + grow] = OnlineSoftmax{m, l}.lse();
    }
  }
  if (ch.only) return;

  // ---- split-KV: count this chunk in; the last one merges the sequence's partials -------------
  // the chunks of b, loaded here rather than kept live through the main loop (registers; the
  // volatile loads cannot be hoisted above the loop's asm)
  const int first = (int)ld_global_b32(p.item_indptr + ch.b);
  const int count = (int)ld_global_b32(p.item_indptr + ch.b + 1) - first;
  // every thread's partial stores happen before thread 0's fence, and every read of s_ml is done
  __syncthreads();
  int* s_last = reinterpret_cast<int*>(s_ml);  // s_ml is free now: the flag goes there
  if (thread_id() == 0) {
    // row group row_base / kRows = blockIdx.z (from row_base: nothing more kept live through the loop)
    unsigned int* counter = p.chunk_counters + ((long long)ch.b * p.heads_kv + kvh) * gridDim.z + row_base / kRows;
    __threadfence();  // release the CTA's partials (cumulative over the barrier above)
    const bool last = atomicAdd(counter, 1u) == (unsigned int)(count - 1);
    if (last) {
      *counter = 0u;    // every chunk has arrived: re-arm for the next launch
      __threadfence();  // acquire the other chunks' partials
    }
    *s_last = last;
  }
  __syncthreads();
  if (*s_last) merge_chunks_and_store<kRows>(p, ch, kvh, row_base, first, count);
}

}  // namespace
