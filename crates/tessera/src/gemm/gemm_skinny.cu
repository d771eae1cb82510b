// gemm_skinny.cu: the decode GEMM, M <= 16 rows of activations times a weight matrix stored
// [N, K] (B column-major), fp16/bf16 in, f32 accumulate on the tensor cores; bandwidth-bound:
// every weight byte is read once, 16 bytes per load, streamed past L1.
//
//   D[z] = act(alpha * A[z] @ W[z]^T + beta * C[z] + bias) + R[z]   (gemm_params.cuh)
//   A [M <= 16, K] row-major (lda), W [N, K] row-major (ldb); Elem = f16 / bf16, Out any.
//
// One warp owns 8 output columns (8 weight rows) and all 16 (zero-padded) rows of A: a single
// m16n8k16 accumulator tile. Lane (g = lane / 4, t = lane % 4) loads 16 bytes of weight row g at
// k = k0 + 8 t: the 8 values e0..e7 feed two MMAs as their k slots {2t, 2t+1, 2t+8, 2t+9}
// = (e0, e1, e2, e3) and (e4, e5, e6, e7). The sum over k does not depend on which slot holds
// which k, so the A fragments use the same map: row g (and g + 8) of A at the same 8 k, read as
// 16 bytes from shared memory. So a warp reads 4 x 16 contiguous bytes per weight row per step
// (whole 32-byte sectors) with no shuffles or transposes.
//
// CTA: 8 warps = 64 columns. K is cut into kChunkK = 256 slices; a slice of A [16][256] is staged
// in shared memory by cp.async (two stages, row pitch kLdA = 288 elements = 576 bytes, which is
// 64 mod 128, so the 8 lanes of a quarter warp (g = 0, 1; t = 0..3) read 8 distinct 16-byte bank
// groups): 18 KiB. Each lane issues its 8 weight loads of a slice before the MMAs that use them.
//
// Split-K (grid y = splits): CTA (x, s) covers K range [s * k_per_split, (s + 1) * k_per_split)
// (a multiple of kChunkK). With one split the epilogue runs here; with several, each CTA writes
// its f32 partial tile to workspace[s][z][M][N] and gemm_splitk.cu sums the splits in order
// (deterministic) and runs the epilogue.
//
// Tails: weight rows >= N load zeros and write nothing; the ragged K end of a row loads element
// by element; A rows >= M and k >= K are zero-filled by cp.async. Host-checked rules (plan.rs):
// A and W 16-byte aligned, lda, ldb and batch strides multiples of 8 elements, M <= 16.
//
// Roofline: bytes = 2 N K (weights) + small; at M = 16 that is 16 flops per weight byte, which
// the tensor cores absorb, so the kernel runs at the memory bandwidth.
#ifndef TS_GENERATED_PREAMBLE
#error "gemm_skinny.cu is compiled with a generated preamble (gemm/skinny.rs)"
#endif
#include "tessera/common.cuh"
#include "tessera/dtype.cuh"
#include "tessera/vec.cuh"
#include "tessera/async_copy.cuh"
#include "tessera/mma.cuh"
#include "tessera/gemm_params.cuh"

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kColsPerWarp = 8;
constexpr int kRows = 16;                  // rows of A (M padded to the MMA's m16)
constexpr int kChunkK = 256;               // k per shared stage of A
constexpr int kLdA = kChunkK + 32;         // row pitch in elements (576 bytes)
constexpr int kVec = 8;                    // elements per 16-byte load
constexpr int kLoads = kChunkK / (4 * kVec);  // weight loads per lane per slice (8)
static_assert(kRows * kChunkK / kVec % kThreads == 0, "whole A chunks per thread");

/// Starts the copies of A rows 0..15, k in [k0, k0 + kChunkK) (limited to k_end) into `smem`.
TS_DEVICE void load_a(uint32_t smem, const Elem* a, const GemmParams& p, int k0, int k_end) {
  constexpr int kPerRow = kChunkK / kVec;
#pragma unroll
  for (int i = 0; i < kRows * kPerRow / kThreads; ++i) {
    const int id = ts::thread_id() + i * kThreads;
    const int r = id / kPerRow;
    const int c = id % kPerRow;
    const int k = k0 + c * kVec;
    const int valid = r < p.m ? ts::min_c(kVec, k_end - k) : 0;
    const int bytes = valid > 0 ? valid * (int)sizeof(Elem) : 0;
    const Elem* src = bytes > 0 ? a + (long long)r * p.lda + k : a;
    ts::cp_async_16_zfill_bytes(smem + (r * kLdA + c * kVec) * (int)sizeof(Elem), src, bytes);
  }
}

/// 8 weights of row `w` at k .. k + 7, zero past k_end (or for a row past N: w == nullptr).
TS_DEVICE ts::U32x4 load_w(const Elem* w, int k, int k_end) {
  if (w != nullptr && k + kVec <= k_end) return ts::ld_global_b128<ts::CacheLoad::kStreaming>(w + k);
  uint16_t e[kVec];
#pragma unroll
  for (int i = 0; i < kVec; ++i) e[i] = (w != nullptr && k + i < k_end) ? w[k + i].bits : (uint16_t)0;
  ts::U32x4 v;
  v.x = e[0] | ((uint32_t)e[1] << 16);
  v.y = e[2] | ((uint32_t)e[3] << 16);
  v.z = e[4] | ((uint32_t)e[5] << 16);
  v.w = e[6] | ((uint32_t)e[7] << 16);
  return v;
}

}  // namespace

extern "C" __global__ void __launch_bounds__(kThreads) gemm_skinny(const __grid_constant__ GemmParams p) {
  ts::wait_prior_grids();  // programmatic dependent launch: no global access before this
  ts::allow_dependent_grids();
  __shared__ alignas(16) Elem a_smem[2][kRows * kLdA];
  const int z = blockIdx.z;
  const int split = blockIdx.y;
  const int lane = ts::lane_id();
  const int g = lane >> 2;
  const int t = lane & 3;
  const int n_warp = blockIdx.x * (kWarps * kColsPerWarp) + ts::warp_id() * kColsPerWarp;
  const Elem* a = static_cast<const Elem*>(p.a) + z * p.stride_a;
  const int n_row = n_warp + g;
  const Elem* w = n_row < p.n ? static_cast<const Elem*>(p.b) + z * p.stride_b + (long long)n_row * p.ldb : nullptr;
  const int k_begin = split * p.k_per_split;
  const int k_end = ts::min_c(p.k, k_begin + p.k_per_split);
  const int slices = k_end > k_begin ? (k_end - k_begin + kChunkK - 1) / kChunkK : 0;
  const uint32_t smem = ts::smem_addr(&a_smem[0][0]);
  constexpr int kStageBytes = kRows * kLdA * (int)sizeof(Elem);

  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (slices > 0) load_a(smem, a, p, k_begin, k_end);
  ts::cp_async_commit();
  for (int s = 0; s < slices; ++s) {
    const int k0 = k_begin + s * kChunkK;
    ts::U32x4 wv[kLoads];
#pragma unroll
    for (int j = 0; j < kLoads; ++j) wv[j] = load_w(w, k0 + j * 4 * kVec + t * kVec, k_end);
    ts::cp_async_wait_all();
    __syncthreads();  // slice s of A is visible; every warp is done with slice s - 1's stage
    if (s + 1 < slices) load_a(smem + ((s + 1) & 1) * kStageBytes, a, p, k0 + kChunkK, k_end);
    ts::cp_async_commit();
    const Elem* as = &a_smem[s & 1][0];
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
      const int kk = j * 4 * kVec + t * kVec;
      const ts::U32x4 lo = *reinterpret_cast<const ts::U32x4*>(as + g * kLdA + kk);        // row g
      const ts::U32x4 hi = *reinterpret_cast<const ts::U32x4*>(as + (g + 8) * kLdA + kk);  // row g + 8
      const uint32_t a0[4] = {lo.x, hi.x, lo.y, hi.y};
      const uint32_t a1[4] = {lo.z, hi.z, lo.w, hi.w};
      ts::mma_m16n8k16<Elem>(acc, a0, wv[j].x, wv[j].y);
      ts::mma_m16n8k16<Elem>(acc, a1, wv[j].z, wv[j].w);
    }
  }
  ts::cp_async_wait_all();

  // accumulator e is D[g + 8 (e / 2)][n_warp + 2 t + e % 2]
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int row = g + 8 * (e >> 1);
    const int col = n_warp + 2 * t + (e & 1);
    if (row >= p.m || col >= p.n) continue;
    if (p.splits == 1) {
      ts::gemm_store<Out, float>(p, z, row, col, acc[e]);
    } else {
      p.workspace[(((long long)split * p.batch + z) * p.m + row) * p.n + col] = acc[e];
    }
  }
}
