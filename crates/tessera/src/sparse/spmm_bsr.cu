// spmm_bsr.cu: C = alpha * A B + beta * C for a block-sparse A (BSR or Blocked-ELL, square
// kBlock x kBlock blocks; sparse/bsr.rs launches it) and dense B (cols x n), C (rows x n),
// deterministic (every output summed in one fixed order).
//
// Layout. Blocks as in sparse/block.rs: block k's values row-major at values + k * kBlock^2.
// BSR (p.ell_width == 0): block row br holds blocks block_offsets[br] .. block_offsets[br + 1]
// with block columns block_indices[k]. Blocked-ELL (p.ell_width > 0): block row br holds slots
// br * ell_width .. + ell_width, a slot with block column -1 is padding and only padding follows
// it. The last block row and column may reach past rows / cols: B is never read past cols (a
// zero instead) and C never written past rows. B and C share one layout: row-major (element
// (r, j) at r * ld + j) or column-major (r + j * ld), kColMajor. Val is the type of A, B and C;
// beta == 0 means C is not read.
//
// Paths (kTensorCores):
//   tensor cores (Val f16 / bf16, kBlock 16 or 32): a warp per (block row, tile of kN8 * 8
//     columns). For each block of the row and each k16 step of it, the A fragments of its
//     kBlock / 16 m16 tiles come straight from global memory (32-bit loads: two consecutive
//     elements of a block row are one A register, mma.cuh's fragment layout), the B fragments
//     (B[k rows of the step][8 columns], "col" operand) from 16-bit loads packed in pairs, and
//     mma.sync m16n8k16 accumulates in f32. Rounding: A and B are used as stored (no rounding
//     before the MMA), sums in f32, as cuBLAS / cuSPARSE do for half inputs.
//   tensor cores, staged B (kStaged; row-major, n % 8 == 0, an opt-in until measured): as
//     above, but each block's B tile (kBlock rows x kN8 * 8 columns) is copied to the warp's
//     shared memory with cp.async (16-byte chunks, zero-filled past cols / n), double buffered
//     (block k + 1 in flight while block k computes), and the B fragments come from
//     ldmatrix.x4.trans (two n8 tiles x both k halves of a k16 step per instruction). Rows are
//     padded by 16 bytes (kStride), so the 8 row addresses of an ldmatrix hit distinct banks.
//     Shared memory: kWarps * 2 * kBlock * kStride * 2 bytes (20 KiB for kBlock 32, kN8 4).
//   CUDA cores (every Val and kBlock; the fp32 / fp64 path: fp32 keeps fp32 products and sums,
//     no tf32 rounding): a warp per (block row, tile of 32 columns), lane l owns column
//     j0 + l: for each block it loads the kBlock B elements of its column (coalesced across the
//     warp in row-major), then each block row of A (one 16-byte broadcast load per 16 bytes,
//     the same address for every lane) and accumulates kBlock sums in Acc (double for double,
//     else float).
// CTA = kBlockThreads / 32 warps; grid = ceil(block_rows * tiles / warps per CTA), the warps of
// a CTA on consecutive tiles of one block row (its A blocks shared through L1).
// No shared memory.
//
// Roofline. A is read once per column tile; B rows of each stored block are gathered once per
// block (kBlock rows x the tile), from L2 when B fits; C written once. Per stored block the
// tensor path does kBlock^2 * tile MACs on the tensor cores for kBlock^2 * 2 bytes of A: for
// 16 x 16 blocks the kernel is bound by the B gathers (L2 bandwidth), not by the MMAs.
#include "tessera/common.cuh"
#include "tessera/dtype.cuh"
#include "tessera/vec.cuh"
#include "tessera/mma.cuh"
#include "tessera/async_copy.cuh"

#ifndef TS_GENERATED_PREAMBLE
using Val = ts::f16;
using Idx = int;
constexpr int kBlock = 16;
constexpr bool kColMajor = false;
constexpr bool kTensorCores = true;
constexpr bool kStaged = false;
constexpr int kN8 = 4;
constexpr int kBlockThreads = 128;
#endif

using Acc = ts::conditional_t<ts::is_same_v<Val, double>, double, float>;
constexpr int kWarps = kBlockThreads / 32;
constexpr bool kHalf = ts::is_same_v<Val, ts::f16> || ts::is_same_v<Val, ts::bf16>;
static_assert(!kTensorCores || (kHalf && kBlock % 16 == 0), "tensor cores: f16/bf16 values, kBlock 16 or 32");
static_assert(!kStaged || (kTensorCores && !kColMajor), "staged B: the row-major tensor-core path");
static_assert(kBlock == 2 || kBlock == 4 || kBlock == 8 || kBlock == 16 || kBlock == 32, "kBlock: 2..32, power of 2");

struct BsrParams {
  const Idx* block_offsets;  // [block_rows + 1] (BSR; unused for Blocked-ELL)
  const Idx* block_indices;  // [blocks] block columns (Blocked-ELL: -1 for padding)
  const Val* values;         // [blocks * kBlock * kBlock]
  const Val* b;              // B (SpMM) or x (SpMV)
  Val* c;                    // C (SpMM) or y (SpMV)
  long long rows;
  long long cols;
  long long n;
  long long ldb;
  long long ldc;
  long long block_rows;
  long long ell_width;  // 0: BSR; else Blocked-ELL slots per block row
  double alpha;
  double beta;
};
static_assert(sizeof(BsrParams) == 112, "BsrParams and its Rust mirror (bsr.rs) differ");

namespace {

/// The stored blocks of block row br: [begin, end) of block_indices / values.
TS_DEVICE void block_range(const BsrParams& p, long long br, long long& begin, long long& end) {
  if (p.ell_width > 0) {
    begin = br * p.ell_width;
    end = begin + p.ell_width;
  } else {
    begin = (long long)p.block_offsets[br];
    end = (long long)p.block_offsets[br + 1];
  }
}

/// Position of element (r, j) of B or C with leading dimension ld.
TS_DEVICE long long dense_at(long long r, long long j, long long ld) { return kColMajor ? r + j * ld : r * ld + j; }

/// C element (r, j) = alpha * sum + beta * C, for r < rows and j < n (C not read when beta == 0).
TS_DEVICE void write_c(const BsrParams& p, long long r, long long j, Acc sum) {
  if (r >= p.rows || j >= p.n) return;
  const long long at = dense_at(r, j, p.ldc);
  Acc out = (Acc)p.alpha * sum;
  if (p.beta != 0.0) out += (Acc)p.beta * ts::convert<Acc>(p.c[at]);
  p.c[at] = ts::convert<Val>(out);
}

/// The raw 16 bits of B element (r, j) (V: f16 or bf16), or +0 outside the B of cols x n.
template <class V>
TS_DEVICE uint32_t b_bits(const BsrParams& p, const V* b, long long r, long long j) {
  if (r >= p.cols || j >= p.n) return 0u;
  return (uint32_t)b[dense_at(r, j, p.ldb)].bits;
}

/// Tensor cores: this warp's kBlock rows x kN8 * 8 columns from j0; kM16 = kBlock / 16 m16
/// tiles of a block row, also k16 steps of a block. A template (V = Val), so that variants
/// without tensor cores never instantiate it.
template <class V, int kM16>
TS_DEVICE void tensor_core_tile(const BsrParams& p, long long br, long long j0) {
  const int lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  float acc[kM16][kN8][4];
#pragma unroll
  for (int mt = 0; mt < kM16; ++mt)
#pragma unroll
    for (int nt = 0; nt < kN8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.0f;
  long long begin, end;
  block_range(p, br, begin, end);
#pragma unroll 1
  for (long long k = begin; k < end; ++k) {
    const long long bc = (long long)p.block_indices[k];
    if (bc < 0) break;  // Blocked-ELL padding: the rest of the row is padding too
    const V* block = p.values + k * (kBlock * kBlock);
#pragma unroll
    for (int ks = 0; ks < kM16; ++ks) {
      // B fragments of this k16 step: b0 = B[2t, 2t+1][g], b1 = B[2t+8, 2t+9][g] of each n8
      const long long k0 = bc * kBlock + ks * 16 + 2 * t;
      uint32_t bf[kN8][2];
#pragma unroll
      for (int nt = 0; nt < kN8; ++nt) {
        const long long j = j0 + nt * 8 + g;
        bf[nt][0] = b_bits<V>(p, p.b, k0, j) | (b_bits<V>(p, p.b, k0 + 1, j) << 16);
        bf[nt][1] = b_bits<V>(p, p.b, k0 + 8, j) | (b_bits<V>(p, p.b, k0 + 9, j) << 16);
      }
#pragma unroll
      for (int mt = 0; mt < kM16; ++mt) {
        // A fragment: a0 = A[g][2t, 2t+1], a1 = A[g+8][..], a2 = A[g][2t+8, ..], a3 = A[g+8][2t+8, ..]
        const V* a_at = block + (mt * 16 + g) * kBlock + ks * 16 + 2 * t;
        uint32_t a[4];
        a[0] = ts::ld_global_b32(a_at);
        a[1] = ts::ld_global_b32(a_at + 8 * kBlock);
        a[2] = ts::ld_global_b32(a_at + 8);
        a[3] = ts::ld_global_b32(a_at + 8 * kBlock + 8);
#pragma unroll
        for (int nt = 0; nt < kN8; ++nt) ts::mma_m16n8k16<V>(acc[mt][nt], a, bf[nt][0], bf[nt][1]);
      }
    }
  }
  // C/D fragment: c0, c1 = C[g][2t, 2t+1], c2, c3 = C[g+8][2t, 2t+1]
#pragma unroll
  for (int mt = 0; mt < kM16; ++mt) {
    const long long r = br * kBlock + mt * 16 + g;
#pragma unroll
    for (int nt = 0; nt < kN8; ++nt) {
      const long long j = j0 + nt * 8 + 2 * t;
      write_c(p, r, j, acc[mt][nt][0]);
      write_c(p, r, j + 1, acc[mt][nt][1]);
      write_c(p, r + 8, j, acc[mt][nt][2]);
      write_c(p, r + 8, j + 1, acc[mt][nt][3]);
    }
  }
}

/// Tensor cores with B staged in shared memory (kStaged): this warp's kBlock rows x kN8 * 8
/// columns from j0 (row-major B and C, n % 8 == 0: every 8-column chunk is whole and 16-byte
/// aligned). A template, so that other variants never instantiate it.
template <class V, int kM16>
TS_DEVICE void tensor_core_tile_staged(const BsrParams& p, long long br, long long j0) {
  constexpr int kStride = kN8 * 8 + 8;       // halves per staged row (16 bytes of padding)
  constexpr int kStage = kBlock * kStride;   // halves per stage
  constexpr int kChunks = kBlock * kN8;      // 16-byte chunks per stage
  static_assert(kChunks % 32 == 0 || kChunks < 32, "chunks per lane");
  __shared__ alignas(16) uint16_t staged[kWarps][2][kStage];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, t = lane % 4;
  // Starts the copies of block k's B tile into stage s (one commit group).
  auto prefetch = [&](long long k, int s) {
    const long long r0 = (long long)p.block_indices[k] * kBlock;
#pragma unroll
    for (int c = lane; c < kChunks; c += 32) {
      const int row = c / kN8, q = c % kN8;
      const long long r = r0 + row, j = j0 + q * 8;
      const bool valid = r < p.cols && j < p.n;
      const V* src = p.b + (valid ? r * p.ldb + j : 0);
      ts::cp_async_16_zfill(ts::smem_addr(&staged[warp][s][row * kStride + q * 8]), src, valid);
    }
    ts::cp_async_commit();
  };
  float acc[kM16][kN8][4];
#pragma unroll
  for (int mt = 0; mt < kM16; ++mt)
#pragma unroll
    for (int nt = 0; nt < kN8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.0f;
  long long begin, end;
  block_range(p, br, begin, end);
  // Blocked-ELL: the real blocks end at the first padding slot
  if (p.ell_width > 0) {
    long long real = begin;
    while (real < end && (long long)p.block_indices[real] >= 0) ++real;
    end = real;
  }
  if (begin < end) prefetch(begin, 0);
  int s = 0;
#pragma unroll 1
  for (long long k = begin; k < end; ++k, s ^= 1) {
    if (k + 1 < end) {
      prefetch(k + 1, s ^ 1);
      ts::cp_async_wait<1>();  // block k's group is done, block k + 1's may still fly
    } else {
      ts::cp_async_wait<0>();
    }
    __syncwarp();  // every lane's copies of block k are visible to the warp
    const V* block = p.values + k * (kBlock * kBlock);
#pragma unroll
    for (int ks = 0; ks < kM16; ++ks) {
      // ldmatrix.x4.trans: lane l addresses row l % 8 of matrix l / 8; matrix m holds k rows
      // ks * 16 + (m % 2) * 8 .. + 8 and columns (nt + m / 2) * 8 .. + 8 (nt + 1 = nt for one n8)
      uint32_t bf[kN8][2];
#pragma unroll
      for (int nt = 0; nt < kN8; nt += 2) {
        const int m = lane / 8;
        const int krow = ks * 16 + (m % 2) * 8 + lane % 8;
        const int ncol = (kN8 > 1 ? nt + m / 2 : nt) * 8;
        uint32_t r[4];
        ts::ldmatrix_x4_trans(r, ts::smem_addr(&staged[warp][s][krow * kStride + ncol]));
        bf[nt][0] = r[0];
        bf[nt][1] = r[1];
        if constexpr (kN8 > 1) {
          bf[nt + 1][0] = r[2];
          bf[nt + 1][1] = r[3];
        }
      }
#pragma unroll
      for (int mt = 0; mt < kM16; ++mt) {
        const V* a_at = block + (mt * 16 + g) * kBlock + ks * 16 + 2 * t;
        uint32_t a[4];
        a[0] = ts::ld_global_b32(a_at);
        a[1] = ts::ld_global_b32(a_at + 8 * kBlock);
        a[2] = ts::ld_global_b32(a_at + 8);
        a[3] = ts::ld_global_b32(a_at + 8 * kBlock + 8);
#pragma unroll
        for (int nt = 0; nt < kN8; ++nt) ts::mma_m16n8k16<V>(acc[mt][nt], a, bf[nt][0], bf[nt][1]);
      }
    }
    __syncwarp();  // stage s is read before the next iteration's prefetch overwrites it
  }
#pragma unroll
  for (int mt = 0; mt < kM16; ++mt) {
    const long long r = br * kBlock + mt * 16 + g;
#pragma unroll
    for (int nt = 0; nt < kN8; ++nt) {
      const long long j = j0 + nt * 8 + 2 * t;
      write_c(p, r, j, acc[mt][nt][0]);
      write_c(p, r, j + 1, acc[mt][nt][1]);
      write_c(p, r + 8, j, acc[mt][nt][2]);
      write_c(p, r + 8, j + 1, acc[mt][nt][3]);
    }
  }
}

/// CUDA cores: this lane's column j of the warp's block row.
TS_DEVICE void cuda_core_column(const BsrParams& p, long long br, long long j) {
  constexpr int kPack = ts::kPack16<Val> < kBlock ? ts::kPack16<Val> : kBlock;  // elements per A load
  constexpr int kChunk = kBlock < 8 ? kBlock : 8;  // B rows (block columns) per chunk
  static_assert(kChunk % kPack == 0, "a chunk holds whole packs");
  Acc acc[kBlock];
#pragma unroll
  for (int i = 0; i < kBlock; ++i) acc[i] = 0;
  const bool live = j < p.n;
  long long begin, end;
  block_range(p, br, begin, end);
#pragma unroll 1
  for (long long k = begin; k < end; ++k) {
    const long long bc = (long long)p.block_indices[k];
    if (bc < 0) break;  // Blocked-ELL padding
    // B rows bc * kBlock .. + kBlock of this lane's column (kstep apart), in chunks of at most
    // 8; for each chunk every row of the block: its chunk of A (broadcast loads, all issued
    // first). Register pressure, found by compiling every variant: the B loads are ordered
    // (vec.cuh's asm loads; plain loads let ptxas hoist all 32 of a 32 x 32 block above the
    // sums), and 32 x 32 blocks take their chunks one at a time (unrolled, ptxas interleaved
    // them and spilled on sm_80); chunks of 16 spilled with 64-bit indices.
    const long long r0 = bc * kBlock;
    const Val* b_at = p.b + dense_at(r0, live ? j : 0, p.ldb);
    const long long kstep = kColMajor ? 1 : p.ldb;
    const Val* block = p.values + k * (kBlock * kBlock);
#pragma unroll(kBlock == 32 ? 1 : kBlock / kChunk)
    for (int c0 = 0; c0 < kBlock; c0 += kChunk) {
      Acc bv[kChunk];
#pragma unroll
      for (int kk = 0; kk < kChunk; ++kk)
        bv[kk] = live && r0 + c0 + kk < p.cols ? ts::convert<Acc>(ts::load_scalar(b_at + (c0 + kk) * kstep)) : (Acc)0;
#pragma unroll
      for (int i = 0; i < kBlock; ++i) {
        ts::Pack<Val, kPack> row[kChunk / kPack];
#pragma unroll
        for (int q = 0; q < kChunk / kPack; ++q) row[q] = ts::load_pack<kPack>(block + i * kBlock + c0 + q * kPack);
#pragma unroll
        for (int q = 0; q < kChunk / kPack; ++q)
#pragma unroll
          for (int e = 0; e < kPack; ++e) acc[i] += ts::convert<Acc>(row[q][e]) * bv[q * kPack + e];
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kBlock; ++i) write_c(p, br * kBlock + i, j, acc[i]);
}

}  // namespace

extern "C" __global__ void __launch_bounds__(kBlockThreads) spmm_bsr(const __grid_constant__ BsrParams p) {
  constexpr long long kTileCols = kTensorCores ? kN8 * 8 : 32;
  const long long tiles = (p.n + kTileCols - 1) / kTileCols;
  const long long pair = (long long)blockIdx.x * kWarps + threadIdx.x / 32;
  // a whole warp takes the same branch (the pair is per warp): mma.sync needs all 32 lanes
  if (pair >= p.block_rows * tiles) return;
  const long long br = pair / tiles;
  const long long j0 = (pair % tiles) * kTileCols;
  if constexpr (kStaged) tensor_core_tile_staged<Val, kBlock / 16>(p, br, j0);
  else if constexpr (kTensorCores) tensor_core_tile<Val, kBlock / 16>(p, br, j0);
  else cuda_core_column(p, br, j0 + threadIdx.x % 32);
}
