// gemm_sm90.cu: dense GEMM for Hopper (sm_90a) with a fused epilogue:
//   D[b] = act(alpha * sa[m] sb[n] * A[b] B[b] + beta * C[b] + bias) + R[b]
// Operands f16 / bf16 (f32 accumulation), f32 read as tf32 by the tensor cores (opt-in, f32
// accumulation), fp8 e4m3 / e5m2 (f32 accumulation; the per-tensor or per-row sa and
// per-tensor or per-column sb scales of torch._scaled_mm; f32 / f16 / bf16 out, or fp8 out:
// D = fp8(sr * d) with the result scale sr, saturating, and amax = max |d| raised by atomics),
// int8 (s32 accumulation; s32 out with no epilogue, as torch._int_mm, or f32 / f16 / bf16 out
// dequantised by sa, sb and the epilogue).
// TMA loads into an mbarrier ring, wgmma from shared memory, one producer and two consumer
// warpgroups (setmaxnreg), persistent CTAs over a grouped tile order, TMA-store epilogue.
//
// Preamble (gemm/hopper.rs, kernel_key): Elem (ts::f16, ts::bf16, float = tf32, ts::fp8e4m3,
// ts::fp8e5m2, int8_t), OutT (16-bit Elem: Elem or float; tf32: float; fp8: f16, bf16, float,
// ts::fp8e4m3 or ts::fp8e5m2; int8: int, f16, bf16 or float), kBlockN (128 or 256 output columns per CTA tile), kStages
// (ring depth), kBNK (B stored [N, K], K-major; false: [K, N], N-major, 16-bit Elem only: the
// other wgmma types read K-major operands only), kGlu (the GLU epilogue, 16-bit operands),
// kPingPong (the ping-pong schedule below; kBlockN = 128).
// Every k-block is one 128-byte swizzle row of each operand row: kBlockK = 128 / sizeof(Elem)
// elements (64 for 16-bit, 32 tf32, 128 for 8-bit), four wgmma k-steps of 32 bytes; the ring's
// byte sizes are the same for every Elem.
//
// Layouts (row-major, element strides; hopper.rs builds the tensor maps, 4-D with a trailing
// extent-1 dimension so that the shared 4-D TMA wrappers serve them):
//   A [batch][M][lda]            map (K, M, batch, 1), box (kBlockK, 128)      -> [128 rows][128 B]
//   B kBNK  [batch][N][ldb]      map (K, N, batch, 1), box (kBlockK, kBlockN)  -> [kBlockN rows][128 B]
//   B !kBNK [batch][K][ldb]      map (N, K, batch, 1), box (64, 64) x kBlockN/64
//                                -> kBlockN/64 column blocks of [64 k rows][128 B]
//   D [batch][M][ldd] (OutT)     map (N, M, batch, 1), box (kStoreCols, 64), TMA stores clip
//   C, R [batch][M][ld] and bias [N] (all OutT): plain loads, bounds-checked.
//   sa (f32, [1] or [M]) and sb (f32, [1] or [N]) scales: plain loads, null = 1 (8-bit Elem).
//   sr (f32 [1], fp8 OutT): the result scale, null = 1; amax (f32 [1], fp8 OutT, or null): the
//   caller zeroes it, each warp raises it once per tile with atomicMax on the bits (|d| >= 0
//   orders as its bits, and a NaN, 0x7fc00000 and up, beats every number, so NaN propagates).
// Every tile is stored as 128-byte rows with TMA's 128-byte swizzle (16-byte chunk j of row r at
// chunk j ^ (r % 8)), 1024-byte aligned: the canonical SW128 layouts wgmma reads (wgmma.cuh).
// Rows, columns and k past the tensor load as zeros (so a K tail adds 0), stores past it are
// clipped: any M, N, K >= 1 runs with no special path.
//
// CTA: 384 threads = 3 warpgroups, 1 CTA per SM, grid = min(tiles, SMs), CTA tile 128 x kBlockN
// x 64 (k-block).
//   WG0 (producer, 40 registers): thread 0 walks the CTA's tiles and their k-blocks, and for each
//     waits for a free ring slot (empty barrier), announces the slot's bytes (expect_tx) and
//     issues the A and B copies, which complete on the slot's full barrier.
//   WG1, WG2 (consumers, 232 registers): rows 64 (w - 1) .. 64 w - 1 of the tile, an m64 x
//     kBlockN f32 (s32 for int8) accumulator (kBlockN / 2 registers per thread). Per k-block:
//     wait full, four wgmma k-steps of 32 bytes, commit; the previous k-block's batch is then waited for
//     (wgmma_wait<1>) and its slot released, so one batch is always queued behind the running one.
//   Ping-pong (kPingPong): the CTA's tiles alternate between the consumers, each computing all
//     128 rows of its tile as two m64 x 128 accumulators (64 registers each) and passing over
//     the other's k-blocks in the ring; a consumer starts its tile's MMAs when the other has
//     issued its last ones (named turn barriers), so one consumer's epilogue runs while the
//     other's MMAs do, and a slot is released by the 4 warps of its consumer. The producer's
//     order is unchanged.
//   Epilogue (per consumer, its 64 rows; ping-pong: its tile's two 64-row halves): fragments
//     (x sa x sb for 8-bit Elem) -> gemm_epilogue (epilogue.cuh; skipped for int out) -> OutT
//     into one of two 8 KiB staging buffers per consumer, in 128-byte column chunks (kStoreCols
//     columns), each chunk stored by one TMA store while the next one is being written. The
//     producer keeps filling the ring for the next tile meanwhile.
//
// GLU variant (kGlu; gemm::Glu, SwiGLU / GeGLU): B has 2N columns interleaved at granularity 1
// (column 2j the gate, 2j + 1 the up projection of output column j) and p.n counts them (2N);
// D has N = p.n / 2 columns. The main loop is unchanged (the CTA tile is 128 x kBlockN columns of
// B); in the wgmma accumulator layout a thread holds column pairs (c, c + 1) with c even, i.e.
// the gate and up of output column c / 2, so the epilogue computes
// act(alpha g + bias[c]) * (alpha u + bias[c + 1]) in registers (gemm_glu_t) and the output tile
// is 128 x kBlockN / 2: half as many 128-byte store chunks, each fed by twice as many
// accumulator blocks (one OutT per thread and row, 4 output columns per 8-column block). The D
// tensor map and its box are the same (128-byte column chunks of N columns). No C, residual or
// scales (hopper_supports refuses them).
//
// Clusters (p.cluster_m = 2, a run-time choice of the plan): CTAs 2c and 2c + 1 form a cluster
// and take vertically adjacent tiles (rows m0 and m0 + 128, the same columns), which read the
// same B tile: each loads its own A and half of B, multicast into both CTAs' ring slots, so the
// L2 -> shared traffic per k-block drops from 16 + 32 KiB to 16 + 16 KiB per CTA (128 x 256).
// Each CTA's empty barrier then counts the consumer warps of both CTAs (a slot is refilled only
// when both have read it); the full barriers are unchanged (each CTA's receives all the slot's
// bytes). The CTAs start after a cluster barrier (both barrier sets initialised) and end with
// one (the peer's last releases land on this CTA's barriers). With an odd tile-row count the
// last cluster row's second tile lies past M: it loads zeros, shares its B half, stores nothing.
//
// Tile order (tile_of): batch-major, then groups of p.group_m cluster-tile rows (tile rows
// without clusters); inside a group the row runs fastest. Cluster c takes cluster tiles c, c +
// clusters, ...: the ~SM-count tiles in flight together cover a near-square block of D, whose A
// rows and B columns stay in L2.
//
// Shared memory (offsets from the 1024-aligned base; hopper.rs shared_bytes adds 1024 of slack):
//   A ring   kStages x 16 KiB
//   B ring   kStages x kBlockN x 128 B
//   staging  2 consumers x 2 buffers x 8 KiB
//   barriers full[kStages], empty[kStages]
// kBlockN = 256: 4 stages (192 KiB + 32 KiB); 128: 6 stages (192 KiB + 32 KiB).
//
// Roofline: 2 M N K flops over (M K + N K) elements read once per tile row/column in the ideal
// order; at 128 x 256 tiles each 16-bit k-block moves 48 KiB for 4 MFLOP (85 flop/B from shared
// memory, ~170 flop/B from L2 with the grouped order; twice that for 8-bit operands, half for
// tf32, matching the tensor cores' rate ratios): compute-bound on H100/H200 for the issue's
// shapes.
#include "tessera/cluster.cuh"
#include "tessera/gemm_epilogue.cuh"
#include "tessera/mbarrier.cuh"
#include "tessera/tma.cuh"
#include "tessera/wgmma.cuh"

#ifndef TS_GENERATED_PREAMBLE
// Defaults so the file can be read and compiled on its own; the plan always prepends its own.
#include "tessera/dtype.cuh"
using Elem = ts::bf16;  // ts::f16, ts::bf16, float (tf32), ts::fp8e4m3, ts::fp8e5m2, int8_t
using OutT = ts::bf16;
constexpr int kBlockN = 256;
constexpr int kStages = 4;
constexpr bool kBNK = true;
constexpr bool kGlu = false;
constexpr bool kPingPong = false;
#endif

/// The kernel parameter, mirrored by `GemmParams` in gemm/hopper.rs (512 bytes).
struct GemmParams {
  ts::TensorMap a_map;
  ts::TensorMap b_map;
  ts::TensorMap d_map;
  const void* c;         // OutT [batch][M][ldc], or null (then beta is ignored)
  const void* residual;  // OutT [batch][M][ldr], or null
  const void* bias;      // OutT [N] (the same for every batch), or null
  long long ldc, c_batch_stride;  // elements
  long long ldr, r_batch_stride;  // elements
  float alpha, beta;
  int m, n, k, batch;  // n: B's columns (2N with kGlu; D then has n / 2)
  int tiles_m, tiles_n, k_blocks, group_m;
  int activation;  // epilogue.cuh codes 0..4
  int pad_;
  const float* scale_a;  // [1] or [M] (scale_a_rows), or null = 1
  const float* scale_b;  // [1] or [N] (scale_b_cols), or null = 1
  int scale_a_rows;      // 1: scale_a[row], 0: scale_a[0]
  int scale_b_cols;      // 1: scale_b[col], 0: scale_b[0]
  const float* scale_result;  // [1] or null = 1 (fp8 OutT)
  float* amax;                // [1] or null (fp8 OutT): max |d| over D, zeroed by the caller
  int cluster_m;              // CTAs per cluster (1 or 2): 2 share each B tile (see the header)
  int cluster_rows;           // ceil(tiles_m / cluster_m): rows of cluster tiles
};

#if defined(TS_HAS_WGMMA) && defined(TS_HAS_TMA)

namespace {

constexpr int kThreads = 384;
constexpr int kBlockM = 128;
constexpr int kBlockK = 128 / int(sizeof(Elem));  // one 128-byte swizzle row of Elem
constexpr int kConsumers = 2;
constexpr int kConsumerRows = 64;  // one wgmma M: the rows of one accumulator half
// Accumulator halves per consumer: cooperative, each consumer holds its 64 rows of the tile;
// ping-pong, each holds all 128 rows of its own tile as two m64 halves.
constexpr int kHalves = kPingPong ? 2 : 1;
constexpr int kKSteps = kBlockK / ts::wgmma_k<Elem>;  // wgmma k-steps (32 bytes each) per k-block
constexpr uint32_t kABytes = kBlockM * 128;
constexpr uint32_t kBBytes = kBlockN * 128;
constexpr uint32_t kBColBlockBytes = kBlockK * 128;  // !kBNK: one 64-column block of the B tile
using Acc = typename ts::WgmmaAcc<Elem>::type;       // f32, or s32 for int8
constexpr bool kIntOut = ts::is_same_v<OutT, int>;   // int8 -> s32 out, no epilogue
constexpr bool kScaled = sizeof(Elem) == 1;          // fp8 / int8: sa, sb scales
constexpr bool kFp8Out = sizeof(OutT) == 1;          // fp8 out: result scale, amax
// exp by __expf in the epilogue where the output's rounding (16-bit, fp8) dwarfs its error
constexpr bool kFastExp = sizeof(OutT) <= 2;
constexpr uint32_t kStageBytes = kABytes + kBBytes;  // expect_tx per slot (boxes count whole,
                                                     // zero-filled parts included)
constexpr int kAccRegs = kBlockN / 2;
constexpr int kStoreCols = 128 / int(sizeof(OutT));  // columns per 128-byte store chunk
constexpr int kOutCols = kGlu ? kBlockN / 2 : kBlockN;  // output columns of a tile
constexpr int kChunks = kOutCols / kStoreCols;
// 8-column accumulator blocks per chunk (a block gives 4 output columns with a GLU)
constexpr int kBlocksPerChunk = kGlu ? kStoreCols / 4 : kStoreCols / 8;
// blocks whose column terms the epilogue loads ahead of their stores (registers: 4 per block)
constexpr int kPreloadBlocks = kBlocksPerChunk < 8 ? kBlocksPerChunk : 8;
static_assert(kBlocksPerChunk % kPreloadBlocks == 0, "whole preload groups per chunk");
constexpr uint32_t kChunkBytes = kConsumerRows * 128;
constexpr int kStoreBuffers = 2;
// arrivals that release a ring slot: every consumer warp (cooperative) or the owner's (ping-pong)
constexpr uint32_t kConsumerWarps = kPingPong ? 4 : 4 * kConsumers;
// setmaxnreg budgets: 128 * (producer + 2 consumers) <= the 384 * 168 registers held at launch
// (__launch_bounds__(384, 1)); setmaxnreg.inc waits for the producer's release, so a larger sum
// would hang the consumers.
constexpr int kProducerRegs = 40;
constexpr int kConsumerRegs = 232;
constexpr int kLaunchRegs = (65536 / kThreads) / 8 * 8;
static_assert(128 * (kProducerRegs + kConsumers * kConsumerRegs) <= kThreads * kLaunchRegs,
              "setmaxnreg budgets exceed the registers held at launch");
static_assert(kKSteps == 4, "four 32-byte k-steps per 128-byte k-block");
static_assert(sizeof(Elem) == 2 || kBNK, "tf32, fp8 and int8 wgmma read B K-major ([N, K]) only");
static_assert(sizeof(Elem) == 2 ? (ts::is_same_v<OutT, Elem> || ts::is_same_v<OutT, float>)
              : ts::is_same_v<Elem, float> ? ts::is_same_v<OutT, float>
              : (ts::is_same_v<OutT, ts::f16> || ts::is_same_v<OutT, ts::bf16> || ts::is_same_v<OutT, float> ||
                 (ts::is_same_v<OutT, int> && ts::is_same_v<Elem, int8_t>) ||
                 ((ts::is_same_v<OutT, ts::fp8e4m3> || ts::is_same_v<OutT, ts::fp8e5m2>) &&
                  !ts::is_same_v<Elem, int8_t>)),
              "output: 16-bit operands -> the operand type or f32; tf32 -> f32; fp8 -> f16, bf16, f32 or fp8; "
              "int8 -> s32, f16, bf16 or f32");
static_assert(kBlockN == 128 || kBlockN == 256, "CTA tile: 128 x 128 or 128 x 256");
static_assert(!kPingPong || kBlockN == 128, "ping-pong: 128 x 128 tiles (two m64n128 accumulators per consumer)");
static_assert(kOutCols % kStoreCols == 0, "whole store chunks per tile");
static_assert(!kGlu || (sizeof(Elem) == 2 && !kIntOut), "the GLU epilogue takes 16-bit operands");
static_assert(sizeof(GemmParams) == 576, "GemmParams layout (hopper.rs)");

/// Named barriers (0 is __syncthreads): consumer w's epilogue syncs its 128 threads on 1 + w;
/// ping-pong: consumer w waits for its turn at the tensor cores on 3 + w (its 128 threads sync,
/// the other consumer's 128 arrive).
constexpr uint32_t kStoreBarrier0 = 1;
constexpr uint32_t kTurnBarrier0 = 3;

/// Shared-memory carve-up (offsets from the 1024-aligned base); every tile 1024-aligned.
struct Smem {
  static constexpr uint32_t a = 0;
  static constexpr uint32_t b = a + kStages * kABytes;
  static constexpr uint32_t store = b + kStages * kBBytes;
  static constexpr uint32_t bars = store + kConsumers * kStoreBuffers * kChunkBytes;
  static constexpr uint32_t end = bars + 16 * kStages;  // full[kStages], empty[kStages]
};
static_assert(Smem::b % 1024 == 0 && Smem::store % 1024 == 0, "1024-byte aligned tiles");
static_assert(Smem::end + 1024 <= 227 * 1024, "shared memory of one CTA (hopper.rs shared_bytes)");

/// A ring position: slot index and the parity of its current phase. Producer and consumers walk
/// the same sequence of (tile, k-block) pairs, so their positions agree slot by slot.
struct Ring {
  int slot = 0;
  uint32_t phase = 0;
  TS_DEVICE void advance() {
    if (++slot == kStages) {
      slot = 0;
      phase ^= 1;
    }
  }
  /// Passes n positions (ping-pong: the other consumer's tile).
  TS_DEVICE void skip(int n) {
    const int s = slot + n;
    phase ^= uint32_t(s / kStages) & 1u;
    slot = s % kStages;
  }
};

/// One output tile: first row, first column, batch.
struct Tile {
  int m0, n0, b;
};

/// This CTA's place in the launch: its rank in the cluster and the cluster's index and count
/// (without clusters, rank 0 and the CTA's own index and count). A 1-D cluster of two is CTAs
/// 2c and 2c + 1.
struct Place {
  uint32_t rank;
  int cluster, clusters;
};

TS_DEVICE Place place_of(const GemmParams& p) {
  Place pl;
  pl.rank = p.cluster_m > 1 ? ts::cluster_rank() : 0u;
  pl.cluster = blockIdx.x / p.cluster_m;
  pl.clusters = gridDim.x / p.cluster_m;
  return pl;
}

/// Cluster tile t of the launch, as seen by the CTA of rank `rank` (see the header: batch,
/// then groups of group_m cluster-tile rows, row fastest inside a group; rank r takes tile row
/// cluster_m * row + r of the cluster tile). The last group of a batch may have fewer rows.
TS_DEVICE Tile tile_of(const GemmParams& p, int t, uint32_t rank) {
  const int per_batch = p.cluster_rows * p.tiles_n;
  const int b = t / per_batch;
  int r = t - b * per_batch;
  const int group_tiles = p.group_m * p.tiles_n;
  const int g = r / group_tiles;
  const int first_row = g * p.group_m;
  const int rows = min(p.cluster_rows - first_row, p.group_m);
  r -= g * group_tiles;
  Tile tl;
  tl.m0 = ((first_row + r % rows) * p.cluster_m + int(rank)) * kBlockM;
  tl.n0 = (r / rows) * kBlockN;
  tl.b = b;
  return tl;
}

/// Cluster tiles of the launch (tiles, without clusters).
TS_DEVICE int tile_count(const GemmParams& p) { return p.cluster_rows * p.tiles_n * p.batch; }

// ---- producer ------------------------------------------------------------------------------

/// Copies k-block `kb` of tile `tl` into ring slot `slot`, completing on `full`. In a cluster
/// of two, each CTA loads its own A and half of the shared B tile (rank r: B rows / column
/// blocks of half r), multicast into the same slot of both CTAs: each slot then receives all
/// kStageBytes on each CTA's `full`, half of B from the peer.
TS_DEVICE void load_stage(const GemmParams& p, uint8_t* smem, uint64_t* full, int slot, const Tile& tl, int kb,
                          uint32_t rank, uint64_t policy) {
  uint8_t* a_dst = smem + Smem::a + slot * kABytes;
  uint8_t* b_dst = smem + Smem::b + slot * kBBytes;
  const int k0 = kb * kBlockK;
  // Announce the whole slot before the copies: a copy may complete before a later arrival, and
  // the phase must not complete on the first copy's bytes alone.
  ts::mbar_arrive_expect_tx(full, kStageBytes);
  ts::tma_load_4d(a_dst, &p.a_map, full, k0, tl.m0, tl.b, 0, policy);
  if (p.cluster_m > 1) {
    constexpr uint16_t kBoth = 0b11;
    if constexpr (kBNK) {  // the B map's box is kBlockN / 2 rows (hopper.rs map_shapes)
      ts::tma_load_4d_multicast(b_dst + rank * (kBBytes / 2), &p.b_map, full, k0, tl.n0 + int(rank) * (kBlockN / 2),
                                tl.b, 0, kBoth, policy);
    } else {
      constexpr int kHalfBlocks = kBlockN / 128;  // 64-column blocks per half
#pragma unroll
      for (int i = 0; i < kHalfBlocks; ++i) {
        const int j = int(rank) * kHalfBlocks + i;
        ts::tma_load_4d_multicast(b_dst + j * kBColBlockBytes, &p.b_map, full, tl.n0 + 64 * j, k0, tl.b, 0, kBoth,
                                  policy);
      }
    }
  } else if constexpr (kBNK) {
    ts::tma_load_4d(b_dst, &p.b_map, full, k0, tl.n0, tl.b, 0, policy);
  } else {
#pragma unroll
    for (int j = 0; j < kBlockN / 64; ++j)
      ts::tma_load_4d(b_dst + j * kBColBlockBytes, &p.b_map, full, tl.n0 + 64 * j, k0, tl.b, 0, policy);
  }
}

/// The producer (one thread): every k-block of every tile of this CTA, in the consumers' order.
/// A slot is reused once every consumer warp of the cluster released it (eight per CTA: the
/// peer's B half lands in this CTA's slot as well, and this one's in the peer's): waiting on the empty barrier with
/// the parity before the ring's current one passes at once on the first lap (a fresh barrier's
/// preceding phase counts as complete) and afterwards waits for the release of the lap before.
TS_DEVICE void producer(const GemmParams& p, uint8_t* smem, uint64_t* full, uint64_t* empty, const Place& pl) {
  ts::tma_prefetch_map(&p.a_map);
  ts::tma_prefetch_map(&p.b_map);
  // Every A tile row and B tile column is read by many CTAs (tiles_n and tiles_m of them).
  const uint64_t policy = ts::l2_policy<ts::L2Evict::kNormal>();
  Ring ring;
  const int tiles = tile_count(p);
  for (int t = pl.cluster; t < tiles; t += pl.clusters) {
    const Tile tl = tile_of(p, t, pl.rank);
    for (int kb = 0; kb < p.k_blocks; ++kb) {
      ts::mbar_wait(&empty[ring.slot], ring.phase ^ 1);
      load_stage(p, smem, &full[ring.slot], ring.slot, tl, kb, pl.rank, policy);
      ring.advance();
    }
  }
}

// ---- consumers -----------------------------------------------------------------------------

/// acc (+)= A(slot rows of this consumer) B(slot): four wgmma k-steps. A is K-major: step k by
/// 32 bytes inside the 128-byte swizzled row. B [N, K] is K-major the same way; B [K, N] is
/// N-major (kTransB = 1): step k by 16 rows (2048 bytes), 64-column blocks kBColBlockBytes apart
/// (the descriptor's leading byte offset). `accumulate` false overwrites acc (first k-block).
/// Ping-pong: each k-step runs for both accumulator halves (A rows 0-63 and 64-127 of the slot,
/// 8 KiB apart) against the same B.
/// (A template on the accumulator type only so that the N-major branch, f16 / bf16 only, is not
/// instantiated for the other operand types.)
template <typename AccT>
TS_DEVICE void issue_kblock(AccT (&acc)[kHalves][kAccRegs], uint32_t a_tile, uint32_t b_tile, bool accumulate) {
  const uint64_t db0 = ts::wgmma_desc_sw128(b_tile, kBNK ? 16u : kBColBlockBytes);
#pragma unroll
  for (int kk = 0; kk < kKSteps; ++kk) {
    const int scale_d = (accumulate || kk > 0) ? 1 : 0;
#pragma unroll
    for (int h = 0; h < kHalves; ++h) {
      const uint64_t da = ts::wgmma_desc_advance(ts::wgmma_desc_sw128(a_tile + h * kConsumerRows * 128, 16), kk * 32);
      if constexpr (kBNK) {
        ts::wgmma_ss_kmajor<Elem, kBlockN>(acc[h], da, ts::wgmma_desc_advance(db0, kk * 32), scale_d);
      } else {
        ts::wgmma_ss<Elem, kBlockN, 1>(acc[h], da, ts::wgmma_desc_advance(db0, kk * 16 * 128), scale_d);
      }
    }
  }
}

/// Shared address of ring slot `slot` of the A or B ring (`ring_base` its start), read from
/// lane 0: warp-uniform to ptxas, so the wgmma descriptors stay in uniform registers.
TS_DEVICE uint32_t slot_addr(uint32_t ring_base, int slot, uint32_t slot_bytes) {
  return __shfl_sync(0xffffffffu, ring_base + slot * slot_bytes, 0);
}

/// The k-loop of one tile for consumer `wg`: acc = A B over all k-blocks. One wgmma batch stays
/// queued behind the running one: after committing k-block kb, wgmma_wait<1> retires kb - 1,
/// whose slot is then released (the arrival is predicated, not branched, inside the window
/// where a wgmma is in flight: ptxas serialises wgmma around branches there, C7520). wgmmas of
/// one shape that accumulate into the same registers are ordered by the hardware, so no fence
/// is needed between the batches; the wgmma_fence before each batch orders the first batch
/// after the epilogue's reads of the previous tile's accumulators.
/// In a cluster the slot is released on the peer's empty barrier as well (`peer_empty`, the
/// cluster address of its empty[0]; predicated like the local arrival).
/// Ping-pong: the consumer reads all 128 rows of the A slot; `pass_turn` hands the tensor cores
/// to the other consumer once the last batch is issued (its first batch then queues behind
/// this one's last).
TS_DEVICE void mainloop(const GemmParams& p, uint32_t smem_base, uint64_t* full, uint64_t* empty,
                        uint32_t peer_empty, Ring& ring, int wg, bool warp_leader, bool pass_turn,
                        Acc (&acc)[kHalves][kAccRegs]) {
  const bool clustered = p.cluster_m > 1;
  const uint32_t a_ring = smem_base + Smem::a + (kPingPong ? 0 : wg * kConsumerRows * 128);
  const uint32_t b_ring = smem_base + Smem::b;
  int prev_slot = 0;
#pragma unroll
  for (int h = 0; h < kHalves; ++h) ts::wgmma_fence_acc(acc[h]);
  for (int kb = 0; kb < p.k_blocks; ++kb) {
    ts::mbar_wait(&full[ring.slot], ring.phase);
    ts::wgmma_fence();
    issue_kblock(acc, slot_addr(a_ring, ring.slot, kABytes), slot_addr(b_ring, ring.slot, kBBytes), kb > 0);
    ts::wgmma_commit();
    ts::wgmma_wait<1>();
    ts::mbar_arrive_if(&empty[prev_slot], warp_leader && kb > 0);
    ts::mbar_arrive_cluster_if(peer_empty + 8 * prev_slot, clustered && warp_leader && kb > 0);
    prev_slot = ring.slot;
    ring.advance();
  }
  if (kPingPong && pass_turn) ts::named_barrier_arrive(kTurnBarrier0 + (wg ^ 1), 256);
  ts::wgmma_wait<0>();
#pragma unroll
  for (int h = 0; h < kHalves; ++h) ts::wgmma_fence_acc(acc[h]);
  ts::mbar_arrive_if(&empty[prev_slot], warp_leader && p.k_blocks > 0);
  ts::mbar_arrive_cluster_if(peer_empty + 8 * prev_slot, clustered && warp_leader && p.k_blocks > 0);
}

/// Two consecutive OutT values at `ptr` (columns col, col + 1 of a row of C or R, or of the
/// bias), the ones at or past column n read as 0. Pairs start at even columns of rows whose
/// stride is a multiple of 16 bytes and whose base is aligned to a pair (hopper_supports), so the
/// pair load is aligned. load_pair_inside: the same where the caller knows col + 1 < n.
/// Templates (on OutT) so that s32 outputs, which have no epilogue inputs, never instantiate it.
template <typename T>
TS_DEVICE void load_pair_inside(const T* ptr, float& x0, float& x1) {
  if constexpr (ts::is_same_v<T, float>) {
    const float2 v = *reinterpret_cast<const float2*>(ptr);
    x0 = v.x;
    x1 = v.y;
  } else {
    const uint32_t w = *reinterpret_cast<const uint32_t*>(ptr);
    const ts::Array<float, 2> f = ts::is_same_v<T, ts::f16> ? ts::unpack_f16x2(w) : ts::unpack_bf16x2(w);
    x0 = f[0];
    x1 = f[1];
  }
}
template <typename T>
TS_DEVICE void load_pair(const T* ptr, int col, int n, float& x0, float& x1) {
  if (col + 1 < n) {
    load_pair_inside(ptr, x0, x1);
  } else {
    x0 = col < n ? ts::to_float(ptr[0]) : 0.0f;
    x1 = 0.0f;
  }
}

/// Stores a pair of outputs at byte column `bc` of row `r` of a staging buffer laid out as TMA's
/// 128-byte swizzle expects: 16-byte chunk j of row r sits at chunk j ^ (r % 8). For 16-bit
/// outputs a warp's 32 stores (8 rows x 16 bytes, one chunk per row) land in 8 distinct chunk
/// columns: no bank conflict; f32 pairs conflict two ways.
TS_DEVICE uint8_t* staged_at(uint8_t* buf, int r, int bc) {
  return buf + r * 128 + ((((bc >> 4) ^ (r & 7)) << 4) | (bc & 15));
}
/// Stores one output at byte column `bc` of row `r` of a staging buffer (the GLU epilogue: one
/// output column per thread and row of an accumulator block; a warp's 16 stores per row half
/// hit 8 rows x 8 bytes, rows r and r + 8 of a thread sharing banks: two wavefronts, as the
/// plain epilogue's two pair stores). A template (T = OutT) so that s32 outputs never
/// instantiate it.
template <typename T>
TS_DEVICE void stage_one(uint8_t* buf, int r, int bc, float y) {
  *reinterpret_cast<T*>(staged_at(buf, r, bc)) = ts::from_float<T>(y);
}
/// Stores a pair of s32 outputs (int8 operands, s32 out: the accumulators as they are).
TS_DEVICE void stage_int_pair(uint8_t* buf, int r, int bc, int y0, int y1) {
  *reinterpret_cast<int2*>(staged_at(buf, r, bc)) = make_int2(y0, y1);
}
TS_DEVICE void stage_pair(uint8_t* buf, int r, int bc, float y0, float y1) {
  uint8_t* dst = staged_at(buf, r, bc);
  if constexpr (ts::is_same_v<OutT, float>) {
    *reinterpret_cast<float2*>(dst) = make_float2(y0, y1);
  } else if constexpr (ts::is_same_v<OutT, ts::f16>) {
    *reinterpret_cast<uint32_t*>(dst) = ts::pack_f16x2(y0, y1);
  } else if constexpr (ts::is_same_v<OutT, ts::fp8e4m3>) {
    *reinterpret_cast<uint16_t*>(dst) = ts::pack_e4m3x2(y0, y1);  // round to nearest even, satfinite
  } else if constexpr (ts::is_same_v<OutT, ts::fp8e5m2>) {
    *reinterpret_cast<uint16_t*>(dst) = ts::pack_e5m2x2(y0, y1);
  } else {
    *reinterpret_cast<uint32_t*>(dst) = ts::pack_bf16x2(y0, y1);
  }
}

/// The column terms of kPreloadBlocks consecutive 8-column accumulator blocks for this thread's
/// pair (B columns col0 + 8 j, + 1; with a GLU the (gate, up) of output column / 2): the bias
/// pair (0 without a bias) and the column scales of 8-bit operands (1 without). kChecked false:
/// the caller knows every column is inside (< p.n), so each pair is one aligned load; true: the
/// ones past p.n read as 0.
template <bool kChecked>
TS_DEVICE void load_column_terms(const GemmParams& p, int col0, float (&col_bias)[kPreloadBlocks][2],
                                 float (&col_scale)[kPreloadBlocks][2]) {
#pragma unroll
  for (int j = 0; j < kPreloadBlocks; ++j) {
    const int col = col0 + 8 * j;
    col_bias[j][0] = col_bias[j][1] = 0.0f;
    col_scale[j][0] = col_scale[j][1] = 1.0f;
    if constexpr (!kIntOut) {
      if (p.bias != nullptr) {
        const OutT* ptr = static_cast<const OutT*>(p.bias) + col;
        if constexpr (kChecked) {
          load_pair(ptr, col, p.n, col_bias[j][0], col_bias[j][1]);
        } else {
          load_pair_inside(ptr, col_bias[j][0], col_bias[j][1]);
        }
      }
    }
    if (kScaled && p.scale_b != nullptr) {
      if (p.scale_b_cols) {
        col_scale[j][0] = !kChecked || col < p.n ? p.scale_b[col] : 0.0f;
        col_scale[j][1] = !kChecked || col + 1 < p.n ? p.scale_b[col + 1] : 0.0f;
      } else {
        col_scale[j][0] = col_scale[j][1] = p.scale_b[0];
      }
    }
  }
}

/// The epilogue of one tile for consumer `wg` (its 64 rows), activation kAct: D = act(alpha acc +
/// beta C + bias) + R in 128-byte column chunks; kInputs false (no C and no R: the GEMM's usual
/// case) leaves those terms and their row checks out, so that a chunk's elements form one
/// branch-free block the compiler interleaves (with the C and R loads predicated per element
/// pair, each element's activation ran as its own dependent chain). Per chunk: the store leader (thread 0) waits
/// until the chunk's staging buffer is no longer read by the store before last, the warpgroup
/// syncs, every thread writes its fragments (fence.proxy.async: visible to the TMA engine), syncs
/// again, and the leader issues the chunk's TMA store. With kInputs, the one of C and R a call
/// lacks is added as 0 (two epilogue forms per activation instead of eight per input set; beta
/// and the null pointer go together: C is never read when it is absent); the only difference from
/// leaving it out is the sign of a zero result (-0 + 0 = +0). A missing bias is added as 0 the
/// same way (a register term, no branch). Chunks wholly past column n and
/// consumers wholly past row m store nothing (uniform over the warpgroup). 8-bit operands
/// multiply the accumulators by sa[row] sb[col] first (s32 converted to f32); s32 outputs store
/// the accumulators unchanged. fp8 outputs track max |d| over the thread's in-range elements,
/// store fp8(sr * d), and raise p.amax once per warp at the end.
template <int kAct, bool kInputs>
TS_DEVICE void epilogue(const GemmParams& p, uint8_t* smem, const Acc (&acc)[kAccRegs], const Tile& tl, int wg,
                        int half, uint32_t& stores) {
  const int tid = threadIdx.x % 128;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int row_base = tl.m0 + half * kConsumerRows;
  if (row_base >= p.m) return;
  const int r_local = warp * 16 + lane / 4;  // and r_local + 8
  const uint32_t bar = kStoreBarrier0 + wg;
  const OutT* c_rows = p.c != nullptr ? static_cast<const OutT*>(p.c) + tl.b * p.c_batch_stride : nullptr;
  const OutT* r_rows =
      p.residual != nullptr ? static_cast<const OutT*>(p.residual) + tl.b * p.r_batch_stride : nullptr;
  const float beta = p.c != nullptr ? p.beta : 0.0f;
  // D's columns: B's with a GLU halved
  const int out_n0 = kGlu ? tl.n0 / 2 : tl.n0;
  const int out_n = kGlu ? p.n / 2 : p.n;
  const float result_scale = kFp8Out && p.scale_result != nullptr ? *p.scale_result : 1.0f;
  uint32_t amax_bits = 0;  // fp8 out: max |d| of this thread's elements, as bits
  // 8-bit operands: the row scales of this thread's two rows, loaded once per tile (the staging
  // stores between uses would otherwise make the compiler reload them for every block)
  float row_scale[2] = {1.0f, 1.0f};
  if (kScaled && p.scale_a != nullptr) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = row_base + r_local + 8 * h;
      if (row < p.m) row_scale[h] = p.scale_a[p.scale_a_rows ? row : 0];
    }
  }
#pragma unroll
  for (int ch = 0; ch < kChunks; ++ch) {
    if (out_n0 + ch * kStoreCols >= out_n) break;
    uint8_t* buf = smem + Smem::store + (wg * kStoreBuffers + stores % kStoreBuffers) * kChunkBytes;
    if (tid == 0) ts::tma_store_wait_read_pending<kStoreBuffers - 1>();
    ts::named_barrier_sync(bar, 128);
#pragma unroll
    for (int g0 = 0; g0 < kBlocksPerChunk; g0 += kPreloadBlocks) {
      // The column terms (bias pairs, column scales) of kPreloadBlocks blocks in registers before
      // their staging stores: a global load after a staging store (a generic pointer the compiler
      // cannot tell from the bias) is not hoisted above it, so loading them per block would expose
      // one global-load latency per 8-column block.
      float col_bias[kPreloadBlocks][2], col_scale[kPreloadBlocks][2];
      const int first_col = tl.n0 + 8 * (ch * kBlocksPerChunk + g0);
      if (first_col + 8 * kPreloadBlocks <= p.n) {  // uniform: every column inside, no checks
        load_column_terms<false>(p, first_col + 2 * (lane % 4), col_bias, col_scale);
      } else {
        load_column_terms<true>(p, first_col + 2 * (lane % 4), col_bias, col_scale);
      }
#pragma unroll
      for (int j = 0; j < kPreloadBlocks; ++j) {
        const int lb = g0 + j;
        const int i = ch * kBlocksPerChunk + lb;  // 8-column accumulator block
        const int cc = 8 * lb + 2 * (lane % 4);   // column inside the chunk
        const int col = tl.n0 + ch * kStoreCols + cc;
        if constexpr (kIntOut) {
#pragma unroll
          for (int h = 0; h < 2; ++h)
            stage_int_pair(buf, r_local + 8 * h, cc * 4, acc[4 * i + 2 * h], acc[4 * i + 2 * h + 1]);
        } else if constexpr (kGlu) {
          // B columns (col, col + 1) = (gate, up) of output column col / 2, at oc in the chunk
          const int oc = 4 * lb + lane % 4;
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const float y = ts::gemm_glu_t<kAct, true, float, kFastExp>(float(acc[4 * i + 2 * h]), float(acc[4 * i + 2 * h + 1]),
                                                               p.alpha, col_bias[j][0], col_bias[j][1]);
            stage_one<OutT>(buf, r_local + 8 * h, oc * int(sizeof(OutT)), y);
          }
        } else {
          const float bias0 = col_bias[j][0], bias1 = col_bias[j][1];
          const float sb0 = col_scale[j][0], sb1 = col_scale[j][1];
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int r = r_local + 8 * h;
            const int row = row_base + r;
            float c0 = 0.0f, c1 = 0.0f, res0 = 0.0f, res1 = 0.0f;
            const float sa = row_scale[h];
            if constexpr (kInputs) {
              if (row < p.m) {
                if (c_rows != nullptr) load_pair(c_rows + (long long)row * p.ldc + col, col, p.n, c0, c1);
                if (r_rows != nullptr) load_pair(r_rows + (long long)row * p.ldr + col, col, p.n, res0, res1);
              }
            }
            float x0 = float(acc[4 * i + 2 * h]), x1 = float(acc[4 * i + 2 * h + 1]);
            if constexpr (kScaled) {
              x0 *= sa * sb0;
              x1 *= sa * sb1;
            }
            float y0 = ts::gemm_epilogue<kAct, true, kInputs, kInputs, kFastExp>(x0, p.alpha, beta, c0, bias0, res0);
            float y1 = ts::gemm_epilogue<kAct, true, kInputs, kInputs, kFastExp>(x1, p.alpha, beta, c1, bias1, res1);
            if constexpr (kFp8Out) {
              if (row < p.m && col < p.n) amax_bits = max(amax_bits, __float_as_uint(fabsf(y0)));
              if (row < p.m && col + 1 < p.n) amax_bits = max(amax_bits, __float_as_uint(fabsf(y1)));
              y0 *= result_scale;
              y1 *= result_scale;
            }
            stage_pair(buf, r, cc * int(sizeof(OutT)), y0, y1);
          }
        }
      }
    }
    ts::fence_proxy_async();
    ts::named_barrier_sync(bar, 128);
    if (tid == 0) {
      ts::tma_store_4d(&p.d_map, buf, out_n0 + ch * kStoreCols, row_base, tl.b, 0);
      ts::tma_store_commit();
    }
    ++stores;
  }
  if constexpr (kFp8Out) {
    if (p.amax != nullptr) {
#pragma unroll
      for (int offset = 16; offset > 0; offset /= 2)
        amax_bits = max(amax_bits, __shfl_xor_sync(0xffffffffu, amax_bits, offset));
      if (lane == 0) atomicMax(reinterpret_cast<unsigned int*>(p.amax), amax_bits);
    }
  }
}

/// The epilogue of a consumer's accumulators: its 64 rows of the tile (cooperative), or both
/// 64-row halves of its own tile (ping-pong).
template <int kAct, bool kInputs>
TS_DEVICE void epilogue_tile(const GemmParams& p, uint8_t* smem, const Acc (&acc)[kHalves][kAccRegs], const Tile& tl,
                             int wg, uint32_t& stores) {
#pragma unroll
  for (int h = 0; h < kHalves; ++h) epilogue<kAct, kInputs>(p, smem, acc[h], tl, wg, kPingPong ? h : wg, stores);
}

/// The epilogue with the call's activation and inputs (one uniform switch per tile): C or R
/// present selects the kInputs form; s32 outputs, GLUs and fp8 outputs never have them
/// (hopper_supports), so only the other kernels instantiate both forms.
template <bool kInputs>
TS_DEVICE void epilogue_act(const GemmParams& p, uint8_t* smem, const Acc (&acc)[kHalves][kAccRegs], const Tile& tl, int wg,
                            uint32_t& stores) {
  if constexpr (kIntOut) {  // s32 out: no epilogue terms (hopper_supports), one instantiation
    epilogue_tile<ts::kActNone, false>(p, smem, acc, tl, wg, stores);
  } else if constexpr (kGlu) {  // the gate's activation (the plan passes silu, gelu or gelu_tanh)
    switch (p.activation) {
      case ts::kActGeluErf: epilogue_tile<ts::kActGeluErf, false>(p, smem, acc, tl, wg, stores); break;
      case ts::kActGeluTanh: epilogue_tile<ts::kActGeluTanh, false>(p, smem, acc, tl, wg, stores); break;
      case ts::kActSilu: epilogue_tile<ts::kActSilu, false>(p, smem, acc, tl, wg, stores); break;
      default: epilogue_tile<ts::kActNone, false>(p, smem, acc, tl, wg, stores); break;
    }
  } else {
    switch (p.activation) {
      case ts::kActRelu: epilogue_tile<ts::kActRelu, kInputs>(p, smem, acc, tl, wg, stores); break;
      case ts::kActGeluErf: epilogue_tile<ts::kActGeluErf, kInputs>(p, smem, acc, tl, wg, stores); break;
      case ts::kActGeluTanh: epilogue_tile<ts::kActGeluTanh, kInputs>(p, smem, acc, tl, wg, stores); break;
      case ts::kActSilu: epilogue_tile<ts::kActSilu, kInputs>(p, smem, acc, tl, wg, stores); break;
      default: epilogue_tile<ts::kActNone, kInputs>(p, smem, acc, tl, wg, stores); break;
    }
  }
}

TS_DEVICE void epilogue_any(const GemmParams& p, uint8_t* smem, const Acc (&acc)[kHalves][kAccRegs], const Tile& tl, int wg,
                            uint32_t& stores) {
  constexpr bool kMayHaveInputs = !kIntOut && !kGlu && !kFp8Out;
  if (kMayHaveInputs && (p.c != nullptr || p.residual != nullptr)) {
    epilogue_act<kMayHaveInputs>(p, smem, acc, tl, wg, stores);
  } else {
    epilogue_act<false>(p, smem, acc, tl, wg, stores);
  }
}

TS_DEVICE void consumer(const GemmParams& p, uint8_t* smem, uint64_t* full, uint64_t* empty, int wg,
                        const Place& pl) {
  const bool warp_leader = threadIdx.x % 32 == 0;
  const uint32_t smem_base = ts::smem_addr(smem);
  const uint32_t peer_empty = p.cluster_m > 1 ? ts::map_shared_rank(ts::smem_addr(empty), pl.rank ^ 1u) : 0u;
  if (wg == 0 && threadIdx.x % 128 == 0) ts::tma_prefetch_map(&p.d_map);
  Ring ring;
  uint32_t stores = 0;
  const int tiles = tile_count(p);
  // Ping-pong: the CTA's tiles alternate between the consumers (its i-th tile is consumer i % 2's),
  // each passing over the other's k-blocks in the ring; a consumer starts a tile's MMAs once the
  // other has issued its last ones (turn barriers), so one's epilogue overlaps the other's MMAs.
  const int step = kPingPong ? 2 : 1;
  const int first = kPingPong ? wg : 0;
  if (kPingPong && wg == 1) ring.skip(p.k_blocks);
  for (int t = pl.cluster + first * pl.clusters; t < tiles; t += step * pl.clusters) {
    const Tile tl = tile_of(p, t, pl.rank);
    // Zeroed although the first k-step overwrites it (scale_d = 0): the wgmma asm reads its
    // accumulators ("+f"), which must not be undefined values to the compiler.
    Acc acc[kHalves][kAccRegs];
#pragma unroll
    for (int h = 0; h < kHalves; ++h) {
#pragma unroll
      for (int i = 0; i < kAccRegs; ++i) acc[h][i] = Acc(0);
    }
    // ping-pong: wait for the turn unless this is the CTA's first tile; pass it on when the
    // CTA has a next tile (the other consumer's), so arrivals and waits pair up
    if (kPingPong && t != pl.cluster) ts::named_barrier_sync(kTurnBarrier0 + wg, 256);
    const bool pass_turn = t + pl.clusters < tiles;
    mainloop(p, smem_base, full, empty, peer_empty, ring, wg, warp_leader, pass_turn, acc);
    epilogue_any(p, smem, acc, tl, wg, stores);
    if (kPingPong) ring.skip(p.k_blocks);
  }
  // The staging buffers must outlive the stores that read them.
  if (threadIdx.x % 128 == 0) ts::tma_store_wait_all();
}

}  // namespace

extern "C" __global__ void __launch_bounds__(kThreads, 1) gemm_sm90(const __grid_constant__ GemmParams p) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  // The tiles need 1024-byte alignment (128-byte swizzle); the plan adds 1024 bytes of slack.
  uint8_t* smem = smem_raw + ((1024 - (ts::smem_addr(smem_raw) & 1023)) & 1023);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + Smem::bars);
  uint64_t* empty = full + kStages;
  const Place pl = place_of(p);
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      ts::mbar_init(&full[s], 1);  // the producer's expect_tx arrival (+ bytes)
      // one arrival per consumer warp of the cluster
      ts::mbar_init(&empty[s], kConsumerWarps * uint32_t(p.cluster_m));
    }
    ts::mbar_init_fence();
  }
  // In a cluster the peer arrives on these barriers and multicasts into this ring: both CTAs'
  // barriers are initialised before either touches the other's.
  if (p.cluster_m > 1) {
    ts::cluster_sync();
  } else {
    __syncthreads();
  }
  // Programmatic dependent launch: the set-up above overlaps the previous kernel's tail; no
  // global memory access (loads of A, B, C, scales; stores of D) before the wait.
  ts::wait_prior_grids();
  ts::allow_dependent_grids();
  // Broadcast from lane 0: warp-uniform to the compiler (uniform-register descriptor math).
  const int wg = __shfl_sync(0xffffffffu, int(threadIdx.x / 128), 0);
  if (wg == 0) {
    ts::setmaxnreg_dec<kProducerRegs>();
    if (threadIdx.x == 0) producer(p, smem, full, empty, pl);
  } else {
    ts::setmaxnreg_inc<kConsumerRegs>();
    consumer(p, smem, full, empty, wg - 1, pl);
  }
  // The peer's last slot releases arrive on this CTA's barriers: neither CTA exits before both
  // are done (cluster.cuh's rule).
  if (p.cluster_m > 1) {
    __syncwarp();
    ts::cluster_sync();
  }
}

#else

extern "C" __global__ void gemm_sm90(const __grid_constant__ GemmParams p) {
  // Built for a target without wgmma/TMA: the plan never launches this path there.
  __trap();
}

#endif
