// gemm_dmma.cu: fp64 GEMM on the sm_80+ fp64 tensor cores (DMMA, mma.sync m8n8k4.f64), f64
// accumulate, fused epilogue in f64 (gemm_params.cuh), any M, N, K, layouts and alignment.
//
//   D[z] = act(alpha * A[z] @ B[z] + beta * C[z] + bias) + R[z], every operand double.
//   A row-major or column-major, B [K, N] or [N, K] (run-time flags; they change only the
//   global-load index order).
//
// CTA tile 64 x 64 x kBK = 16, 4 warps as 2 x 2, each warp 32 x 32 of D: 4 m8 x 4 n8 DMMA tiles,
// 32 f64 accumulators (64 registers) per thread. Fragments (PTX ISA, mma.m8n8k4 .f64), g = lane
// / 4, t = lane % 4: a = A[g][t], b = B[t][g], d = D[g][2t, 2t + 1].
//
// Shared memory: two stages of A [64 m][kLdK] and B [64 n][kLdK] with k contiguous and kLdK =
// 20 (16 + 4 doubles of padding): a fragment load by a half-warp (g = 0..3, t = 0..3) touches
// double slots 20 g + t = 4 g + t (mod 16), 16 distinct 8-byte slots, no bank conflict. 40 KiB
// (static). The next tile waits in registers during the DMMAs (one __syncthreads per K tile).
//
// Loads are along each operand's contiguous dimension; elements past M, N or K load as zero.
// Grid (N tiles, M tiles, batch).
//
// Roofline: the fp64 tensor cores double the fp64 FMA rate of the CUDA cores on A100/H100.
#ifndef TS_GENERATED_PREAMBLE
#error "gemm_dmma.cu is compiled with a generated preamble (gemm/dmma.rs)"
#endif
#include "tessera/common.cuh"
#include "tessera/dtype.cuh"
#include "tessera/mma.cuh"
#include "tessera/gemm_params.cuh"

namespace {

constexpr int kThreads = 128;
constexpr int kBM = 64;
constexpr int kBN = 64;
constexpr int kBK = 16;
constexpr int kLdK = kBK + 4;
constexpr int kWarpTile = 32;
constexpr int kMmaM = kWarpTile / 8;  // 4
constexpr int kMmaN = kWarpTile / 8;  // 4
constexpr int kLoad = kBM * kBK / kThreads;  // 8 elements of each operand per thread per tile

struct Stage {
  double a[kBM][kLdK];
  double b[kBN][kLdK];
};

/// (row, k) of element `e` of a 64 x 16 tile whose operand is k-contiguous (`k_fast`) or
/// row-contiguous in memory, so that consecutive threads read consecutive addresses.
TS_DEVICE void tile_index(int e, bool k_fast, int& r, int& kk) {
  if (k_fast) {
    kk = e % kBK;
    r = e / kBK;
  } else {
    r = e % kBM;
    kk = e / kBM;
  }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(kThreads) gemm_dmma(const __grid_constant__ GemmParams p) {
  __shared__ Stage stage[2];
  const int z = blockIdx.z;
  const int m0 = blockIdx.y * kBM;
  const int n0 = blockIdx.x * kBN;
  const double* A = static_cast<const double*>(p.a) + z * p.stride_a;
  const double* B = static_cast<const double*>(p.b) + z * p.stride_b;
  const int tid = ts::thread_id();
  const int lane = ts::lane_id();
  const int g = lane >> 2;
  const int t = lane & 3;
  const int warp_m = ts::warp_id() >> 1;
  const int warp_n = ts::warp_id() & 1;
  // row-major A [M, K] and B stored [N, K] are k-contiguous
  const bool a_kfast = p.a_col_major == 0;
  const bool b_kfast = p.b_col_major != 0;

  double ra[kLoad], rb[kLoad];
  auto fetch = [&](int k0) {
#pragma unroll
    for (int i = 0; i < kLoad; ++i) {
      int r, kk;
      tile_index(tid + i * kThreads, a_kfast, r, kk);
      const int m = m0 + r, k = k0 + kk;
      ra[i] = 0.0;
      if (m < p.m && k < p.k) ra[i] = a_kfast ? A[(long long)m * p.lda + k] : A[(long long)k * p.lda + m];
      tile_index(tid + i * kThreads, b_kfast, r, kk);
      const int n = n0 + r, kb = k0 + kk;
      rb[i] = 0.0;
      if (n < p.n && kb < p.k) rb[i] = b_kfast ? B[(long long)n * p.ldb + kb] : B[(long long)kb * p.ldb + n];
    }
  };
  auto store = [&](Stage& s) {
#pragma unroll
    for (int i = 0; i < kLoad; ++i) {
      int r, kk;
      tile_index(tid + i * kThreads, a_kfast, r, kk);
      s.a[r][kk] = ra[i];
      tile_index(tid + i * kThreads, b_kfast, r, kk);
      s.b[r][kk] = rb[i];
    }
  };

  double acc[kMmaM][kMmaN][2];
#pragma unroll
  for (int i = 0; i < kMmaM; ++i)
#pragma unroll
    for (int j = 0; j < kMmaN; ++j) acc[i][j][0] = acc[i][j][1] = 0.0;

  const int k_tiles = (p.k + kBK - 1) / kBK;
  if (k_tiles > 0) {
    fetch(0);
    store(stage[0]);
    __syncthreads();
  }
  for (int kt = 0; kt < k_tiles; ++kt) {
    const bool more = kt + 1 < k_tiles;
    if (more) fetch((kt + 1) * kBK);
    const Stage& s = stage[kt & 1];
#pragma unroll
    for (int k4 = 0; k4 < kBK; k4 += 4) {
      double a[kMmaM], b[kMmaN];
#pragma unroll
      for (int i = 0; i < kMmaM; ++i) a[i] = s.a[warp_m * kWarpTile + i * 8 + g][k4 + t];
#pragma unroll
      for (int j = 0; j < kMmaN; ++j) b[j] = s.b[warp_n * kWarpTile + j * 8 + g][k4 + t];
#pragma unroll
      for (int i = 0; i < kMmaM; ++i)
#pragma unroll
        for (int j = 0; j < kMmaN; ++j) ts::mma_m8n8k4_f64(acc[i][j], a[i], b[j]);
    }
    if (more) {
      store(stage[(kt + 1) & 1]);
      __syncthreads();
    }
  }

#pragma unroll
  for (int i = 0; i < kMmaM; ++i)
#pragma unroll
    for (int j = 0; j < kMmaN; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int row = m0 + warp_m * kWarpTile + i * 8 + g;
        const int col = n0 + warp_n * kWarpTile + j * 8 + 2 * t + e;
        if (row < p.m && col < p.n) ts::gemm_store<double, double>(p, z, row, col, acc[i][j][e]);
      }
}
