// gemm_sm80.cu: GEMM on the sm_80+ tensor cores (ldmatrix + mma.sync + a cp.async multistage
// pipeline) with the fused epilogue of gemm_params.cuh, any M, N, K.
//
//   D[z] = act(alpha * sa[m] sb[n] * A[z] @ B[z] + beta * C[z] + bias) + R[z]
//   A [M, K] row-major (lda), B [K, N] row-major (ldb, kBColMajor = false; 16-bit Elem only) or
//   stored [N, K] (kBColMajor = true, the weight layout).
//   Elem / Out / accumulate (the precision contracts of gemm/problem.rs):
//     ts::f16, ts::bf16   -> f16, bf16 or f32      mma m16n8k16, f32 accumulate
//     float (read as tf32) -> f32                  mma m16n8k8 .tf32, f32 accumulate
//     int8_t              -> int (the plain product, as torch._int_mm), or f16 / bf16 / f32
//                            dequantised by sa, sb  mma m16n8k32 .s8, s32 accumulate
//     ts::fp8e4m3, ts::fp8e5m2 (sm_89+) -> f16 / bf16 / f32, or fp8 (D = fp8(sr * d), saturating,
//                            with amax = max |d| raised by atomics)  mma m16n8k32, f32 accumulate
//   sa (f32 [1] or [M]) and sb (f32 [1] or [N]) are the 8-bit operands' dequantisation scales
//   (torch._scaled_mm's), null = 1.
//
// Every operand row of a K tile is 128 bytes: kBK = 128 / sizeof(Elem) elements (64 for 16-bit,
// 32 tf32, 128 for 8-bit) and four mma k-steps of 32 bytes. For the K-major operands (A, and B
// stored [N, K]) the fragments of m16n8k16 (16-bit), m16n8k8 (tf32) and m16n8k32 (8-bit) cover
// the same bytes: register j of a thread holds the 4 bytes at byte 4 (lane % 4) + 16 (j / 2) of
// row lane / 4 (+ 8 for odd j of A), so one ldmatrix addressing serves every Elem; only the mma
// instruction and the accumulator type (int for int8) change. ldmatrix.trans moves 16-bit
// elements, hence B [K, N] for 16-bit Elem only.
//
// CTA tile kBM x kBN x kBK = 128 x 128 x (128 bytes), 8 warps as 2 (M) x 4 (N), each warp 64 x 32
// of D: 4 m16 x 4 n8 mma tiles, 64 accumulators per thread. Grid (N tiles, M tiles, batch).
//
// Shared memory: kStages = 3 stages of an A tile [128 m][128 B] and a B tile ([128 n][128 B]
// for kBColMajor, else [64 k][256 B]), 16 KiB each: 96 KiB (dynamic, opt-in above 48 KiB; fits
// sm_86/89's 99 KiB). Rows are made of 16-byte chunks (kChunk elements); chunk c of row r is stored
// at chunk c ^ (r % 8) (XOR swizzle on the low three chunk bits), so both the cp.async writes of a
// row and the ldmatrix reads of 8 consecutive rows at one logical chunk hit 8 distinct 16-byte
// bank groups.
//
// Pipeline: tiles kt + 1 .. kt + kStages - 1 are in flight (one cp.async group each) while tile
// kt is multiplied; one __syncthreads per K tile. Tails: a chunk wholly past M, N or K is
// zero-filled by cp.async (src-size 0) and a ragged last chunk of a row copies only its valid
// bytes (the rest zero-filled), so the K tail contributes zeros and nothing outside an operand is
// read; the epilogue writes only rows < M and columns < N.
//
// GLU variant (kGlu, gemm::Glu, 16-bit Elem): p.n counts B's 2N columns (gate 2j, up 2j + 1,
// interleaved), D has N = p.n / 2 columns. The main loop is unchanged; the mma accumulator pair
// e = 0, 1 (and 2, 3) of a thread is the B column pair (2 tq, 2 tq + 1) of its n8 tile, i.e. the
// gate and up of one output column, so the epilogue computes act(gate) * up in registers and
// writes column col / 2: the CTA's output tile is 128 x 64.
//
// Host-checked rules (plan.rs): A, B 16-byte aligned; lda, ldb and the batch strides of A and B
// multiples of 16 bytes; M, N, K < 2^31; M tiles <= 65535 (grid y), batch <= 65535 (grid z).
//
// Roofline: 2 M N K flops; at 128 x 128 tiles each K tile reads (128 + 128) x 128 bytes for
// 2 x 128 x 128 x kBK flops: 64 flops per byte from L2 for 16-bit (128 for 8-bit, 32 for tf32,
// each matching its tensor-core rate), compute-bound on A100/H100.
#ifndef TS_GENERATED_PREAMBLE
#error "gemm_sm80.cu is compiled with a generated preamble (gemm/sm80.rs)"
#endif
#include "tessera/common.cuh"
#include "tessera/dtype.cuh"
#include "tessera/async_copy.cuh"
#include "tessera/mma.cuh"
#include "tessera/gemm_params.cuh"

namespace {

constexpr int kBM = 128;
constexpr int kBN = 128;
constexpr int kBK = 128 / int(sizeof(Elem));  // one 128-byte row per operand row
constexpr int kStages = 3;
constexpr int kThreads = 256;
constexpr int kWarpsM = 2;
constexpr int kWarpsN = 4;
constexpr int kWarpTileM = kBM / kWarpsM;  // 64
constexpr int kWarpTileN = kBN / kWarpsN;  // 32
constexpr int kMmaM = kWarpTileM / 16;     // 4 m16 tiles
constexpr int kMmaN = kWarpTileN / 8;      // 4 n8 tiles
constexpr int kChunk = 16 / int(sizeof(Elem));  // elements per 16-byte chunk
constexpr int kKSteps = 4;                      // mma k-steps of 32 bytes per K tile
using Acc = ts::MmaAcc<Elem>;                   // f32, or s32 for int8
constexpr bool kIntOut = ts::is_same_v<Out, int>;  // int8 -> s32 out, the plain product
constexpr bool kScaled = sizeof(Elem) == 1;        // fp8 / int8: sa, sb scales
constexpr bool kFp8Out = sizeof(Out) == 1;         // fp8 out: result scale, amax
constexpr int kTileElems = kBM * kBK;      // per operand and stage (A and B tiles have the same size)
static_assert(kBN * kBK == kTileElems, "A and B tiles share one size");
static_assert(kWarpsM * kWarpsN * 32 == kThreads, "8 warps");
static_assert(sizeof(Elem) == 2 || kBColMajor, "ldmatrix.trans moves 16-bit elements: B [K, N] for 16-bit Elem only");
static_assert(sizeof(Elem) == 2 || !kGlu, "the GLU epilogue takes 16-bit Elem");

/// Element offset in a tile of rows of `kRowChunks` chunks of the chunk `c` of row `r` (swizzled).
template <int kRowChunks>
TS_DEVICE int swz(int r, int c) {
  return r * (kRowChunks * kChunk) + ((c ^ (r & 7)) * kChunk);
}

/// Starts the copies of one rows x (kRowChunks chunks) tile of a row-major operand: row r of
/// the tile is global row row0 + r (valid below rows), chunk c starts at column col0 + 8c
/// (valid below cols; a ragged last chunk copies its valid bytes only).
template <int kRows, int kRowChunks>
TS_DEVICE void load_tile(uint32_t smem, const Elem* g, long long ld, int row0, int rows, int col0, int cols) {
  constexpr int kChunks = kRows * kRowChunks;
  static_assert(kChunks % kThreads == 0, "whole chunks per thread");
#pragma unroll
  for (int i = 0; i < kChunks / kThreads; ++i) {
    const int id = ts::thread_id() + i * kThreads;
    const int r = id / kRowChunks;
    const int c = id % kRowChunks;
    const int row = row0 + r;
    const int col = col0 + c * kChunk;
    const int valid = (row < rows) ? ts::min_c(kChunk, cols - col) : 0;
    const int bytes = valid > 0 ? valid * (int)sizeof(Elem) : 0;
    // a chunk with nothing to copy still needs an address: the operand's first element
    const Elem* src = bytes > 0 ? g + (long long)row * ld + col : g;
    ts::cp_async_16_zfill_bytes(smem + swz<kRowChunks>(r, c) * (int)sizeof(Elem), src, bytes);
  }
}

struct Tiles {
  const Elem* a;
  const Elem* b;
  int m0, n0;
};

/// Starts the copies of K tile `kt` into stage `s`.
TS_DEVICE void load_stage(const GemmParams& p, const Tiles& t, uint32_t smem, int s, int kt) {
  const uint32_t sa = smem + s * 2 * kTileElems * (int)sizeof(Elem);
  const uint32_t sb = sa + kTileElems * (int)sizeof(Elem);
  const int k0 = kt * kBK;
  load_tile<kBM, kBK / kChunk>(sa, t.a, p.lda, t.m0, p.m, k0, p.k);
  if constexpr (kBColMajor) {
    load_tile<kBN, kBK / kChunk>(sb, t.b, p.ldb, t.n0, p.n, k0, p.k);  // [n][k]
  } else {
    load_tile<kBK, kBN / kChunk>(sb, t.b, p.ldb, k0, p.k, t.n0, p.n);  // [k][n]
  }
}

/// The A fragments of 32-byte k-step kk for the warp's 4 m16 tiles (ldmatrix.x4: lane l
/// addresses row l % 16 at chunk 2 kk + l / 16).
TS_DEVICE void load_a_frags(uint32_t (&a)[kMmaM][4], uint32_t sa, int warp_m, int kk) {
  const int lane = ts::lane_id();
#pragma unroll
  for (int mi = 0; mi < kMmaM; ++mi) {
    const int r = warp_m * kWarpTileM + mi * 16 + (lane & 15);
    const int c = kk * 2 + (lane >> 4);
    ts::ldmatrix_x4(a[mi], sa + swz<kBK / kChunk>(r, c) * (int)sizeof(Elem));
  }
}

/// The B fragments {b0, b1} of 32-byte k-step kk for the warp's 4 n8 tiles, two tiles per
/// ldmatrix.x4.
TS_DEVICE void load_b_frags(uint32_t (&b)[kMmaN][2], uint32_t sb, int warp_n, int kk) {
  const int lane = ts::lane_id();
#pragma unroll
  for (int pair = 0; pair < kMmaN / 2; ++pair) {
    uint32_t r[4];
    const int nbase = warp_n * kWarpTileN + pair * 16;
    if constexpr (kBColMajor) {
      // [n][k] tile: matrices (n 0-7, chunk 2 kk), (n 0-7, chunk 2 kk + 1), (n 8-15, 2 kk), (n 8-15, 2 kk + 1)
      const int n = nbase + (lane & 7) + ((lane >> 4) << 3);
      const int c = kk * 2 + ((lane >> 3) & 1);
      ts::ldmatrix_x4(r, sb + swz<kBK / kChunk>(n, c) * (int)sizeof(Elem));
    } else {
      // [k][n] tile, transposed: matrices (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15)
      const int k = kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3);
      const int c = nbase / kChunk + (lane >> 4);
      ts::ldmatrix_x4_trans(r, sb + swz<kBN / kChunk>(k, c) * (int)sizeof(Elem));
    }
    b[2 * pair][0] = r[0];
    b[2 * pair][1] = r[1];
    b[2 * pair + 1][0] = r[2];
    b[2 * pair + 1][1] = r[3];
  }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(kThreads, 1) gemm_sm80(const __grid_constant__ GemmParams p) {
  const int z = blockIdx.z;
  Tiles t;
  t.m0 = blockIdx.y * kBM;
  t.n0 = blockIdx.x * kBN;
  t.a = static_cast<const Elem*>(p.a) + z * p.stride_a;
  t.b = static_cast<const Elem*>(p.b) + z * p.stride_b;
  const uint32_t smem = ts::smem_addr(ts::dynamic_smem<Elem>());
  const int warp_m = ts::warp_id() / kWarpsN;
  const int warp_n = ts::warp_id() % kWarpsN;
  const int k_tiles = (p.k + kBK - 1) / kBK;

  Acc acc[kMmaM][kMmaN][4];
#pragma unroll
  for (int mi = 0; mi < kMmaM; ++mi)
#pragma unroll
    for (int nj = 0; nj < kMmaN; ++nj)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mi][nj][e] = Acc(0);

  // prologue: tiles 0 .. kStages - 2 in flight, one group each (empty groups keep the count)
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < k_tiles) load_stage(p, t, smem, s, s);
    ts::cp_async_commit();
  }

  for (int kt = 0; kt < k_tiles; ++kt) {
    ts::cp_async_wait<kStages - 2>();  // tile kt has landed (for this thread)
    __syncthreads();                   // ... for every thread; and stage (kt - 1) % kStages is free
    const int next = kt + kStages - 1;
    if (next < k_tiles) load_stage(p, t, smem, next % kStages, next);
    ts::cp_async_commit();

    const uint32_t sa = smem + (kt % kStages) * 2 * kTileElems * (int)sizeof(Elem);
    const uint32_t sb = sa + kTileElems * (int)sizeof(Elem);
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
      uint32_t a[kMmaM][4];
      uint32_t b[kMmaN][2];
      load_a_frags(a, sa, warp_m, kk);
      load_b_frags(b, sb, warp_n, kk);
#pragma unroll
      for (int mi = 0; mi < kMmaM; ++mi)
#pragma unroll
        for (int nj = 0; nj < kMmaN; ++nj) ts::mma_k32bytes<Elem>(acc[mi][nj], a[mi], b[nj][0], b[nj][1]);
    }
  }
  ts::cp_async_wait_all();

  // epilogue: accumulator e of tile (mi, nj) is D[g + 8 (e / 2)][2 t + e % 2] of that tile
  const int g = ts::lane_id() >> 2;
  const int tq = ts::lane_id() & 3;
  const int row0 = t.m0 + warp_m * kWarpTileM + g;
  const int col0 = t.n0 + warp_n * kWarpTileN + 2 * tq;
  if constexpr (kGlu) {
#pragma unroll
    for (int mi = 0; mi < kMmaM; ++mi)
#pragma unroll
      for (int nj = 0; nj < kMmaN; ++nj)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = row0 + mi * 16 + 8 * h;
          const int col = col0 + nj * 8;  // even: gate; col + 1: up
          if (row < p.m && col + 1 < p.n)
            ts::gemm_store_glu<Out, float>(p, z, row, col / 2, acc[mi][nj][2 * h], acc[mi][nj][2 * h + 1]);
        }
  } else {
    // int8 -> s32: the plain product (the plan requires alpha = 1 and no other epilogue term);
    // 8-bit operands otherwise: the accumulator times sa[row] sb[col] (loaded once per row and
    // column), then the epilogue
    float sa[kMmaM][2], sb[kMmaN][2];
#pragma unroll
    for (int mi = 0; mi < kMmaM; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = row0 + mi * 16 + 8 * h;
        sa[mi][h] = kScaled && p.scale_a != nullptr && row < p.m ? p.scale_a[p.scale_a_rows ? row : 0] : 1.0f;
      }
#pragma unroll
    for (int nj = 0; nj < kMmaN; ++nj)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int col = col0 + nj * 8 + c;
        sb[nj][c] = kScaled && p.scale_b != nullptr && col < p.n ? p.scale_b[p.scale_b_cols ? col : 0] : 1.0f;
      }
    [[maybe_unused]] float result_scale = 1.0f;
    [[maybe_unused]] uint32_t amax_bits = 0;  // fp8 out: max |d| of this thread's elements, as bits
    if constexpr (kFp8Out) {
      if (p.scale_result != nullptr) result_scale = *p.scale_result;
    }
#pragma unroll
    for (int mi = 0; mi < kMmaM; ++mi)
#pragma unroll
      for (int nj = 0; nj < kMmaN; ++nj)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = row0 + mi * 16 + 8 * (e >> 1);
          const int col = col0 + nj * 8 + (e & 1);
          if (row >= p.m || col >= p.n) continue;
          if constexpr (kIntOut) {
            static_cast<int*>(p.d)[z * p.stride_d + (long long)row * p.ldd + col] = acc[mi][nj][e];
          } else {
            float v = float(acc[mi][nj][e]);
            if constexpr (kScaled) v *= sa[mi][e >> 1] * sb[nj][e & 1];
            if constexpr (kFp8Out) {
              const float d = ts::gemm_value<Out, float>(p, z, row, col, v);
              amax_bits = max(amax_bits, __float_as_uint(fabsf(d)));
              static_cast<Out*>(p.d)[z * p.stride_d + (long long)row * p.ldd + col] = ts::from_float<Out>(result_scale * d);
            } else {
              ts::gemm_store<Out, float>(p, z, row, col, v);
            }
          }
        }
    if constexpr (kFp8Out) {
      // one atomic per warp: |d| >= 0 orders as its bits, and a NaN (0x7fc00000 and up) beats
      // every number, so NaN propagates
      if (p.amax != nullptr) {
#pragma unroll
        for (int offset = 16; offset > 0; offset >>= 1)
          amax_bits = max(amax_bits, __shfl_xor_sync(0xffffffffu, amax_bits, offset));
        if (ts::lane_id() == 0) atomicMax(reinterpret_cast<unsigned int*>(p.amax), amax_bits);
      }
    }
  }
}
