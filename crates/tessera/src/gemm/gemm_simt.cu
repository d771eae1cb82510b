// gemm_simt.cu: register-tiled GEMM on the CUDA cores, for exact fp32 (no tf32), fp64 where
// DMMA is absent, and fp16/bf16 operands that miss the tensor-core path's alignment rule.
//
//   D[z] = act(alpha * A[z] @ B[z] + beta * C[z] + bias) + R[z]   (gemm_params.cuh)
//   In = float, double, ts::f16 or ts::bf16; Acc = float (double for double); Out any storage type.
//   A row-major or column-major, B [K, N] or [N, K] (run-time flags: only the global-load index
//   order depends on them); no alignment rule (scalar loads).
//
// 256 threads as 16 x 16, each computing a kTM x kTM block of D: CTA tile kBM = kBN = 16 kTM
// (128 for kTM = 8, float accumulate; 64 for kTM = 4, double) by kBK = 8. Shared memory: two
// stages of A^T [kBK][kBM] and B [kBK][kBN] in Acc (16 KiB for float, 16 KiB for double);
// the next tile's elements wait in registers while the current one is multiplied (one
// __syncthreads per K tile). Thread (ty, tx) owns rows ty + 16 i and columns tx + 16 j (strided,
// so the 16 threads of a half-warp read 16 consecutive shared words).
//
// Loads are ordered along the operand's contiguous dimension (coalesced); elements past M, N or
// K load as zero. Grid (N tiles, M tiles, batch).
//
// GLU variant (kGlu, gemm::Glu): p.n counts B's 2N columns (gate 2j, up 2j + 1), D has N = p.n / 2.
// The CTA still multiplies kBN columns of B, but permuted in shared memory so that a thread's
// column pair (j = 2q, 2q + 1), i.e. shared columns tx + 16 (2q) and tx + 16 (2q + 1), holds
// B columns 2 (tx + 16 q) and 2 (tx + 16 q) + 1 of the tile: the gate and up of output column
// tx + 16 q. The CTA writes kBN / 2 output columns (grid over 2N / kBN B tiles, as without a GLU).
//
// Roofline: kTM^2 FMAs per 2 kTM shared loads per k; fp32 peaks at 2 flops per FMA per core.
#ifndef TS_GENERATED_PREAMBLE
#error "gemm_simt.cu is compiled with a generated preamble (gemm/simt.rs)"
#endif
#include "tessera/common.cuh"
#include "tessera/dtype.cuh"
#include "tessera/gemm_params.cuh"

namespace {

constexpr int kThreads = 256;
constexpr int kDim = 16;  // threads per side
constexpr int kBM = kDim * kTM;
constexpr int kBN = kDim * kTM;
constexpr int kBK = 8;
constexpr int kLoadA = kBM * kBK / kThreads;  // elements of each operand per thread per tile
constexpr int kLoadB = kBN * kBK / kThreads;
static_assert(kBM * kBK % kThreads == 0, "whole elements per thread");

/// (row, k) of the A tile's element `e` of this thread, ordered so that consecutive threads
/// read consecutive addresses: along k when A is row-major, along m when column-major.
TS_DEVICE void a_index(int e, bool col_major, int& r, int& kk) {
  if (col_major) {
    r = e % kBM;
    kk = e / kBM;
  } else {
    kk = e % kBK;
    r = e / kBK;
  }
}

/// The tile column of B that shared-memory column `c` holds: `c` itself, or with a GLU the
/// permutation of the header (gate and up of one output column in a thread's column pair).
TS_DEVICE int b_tile_col(int c) {
  if constexpr (kGlu) return 2 * ((c % kDim) + kDim * (c / (2 * kDim))) + (c / kDim) % 2;
  else return c;
}

/// (k, col) of the B tile's element `e`: along n when B is [K, N], along k when stored [N, K].
TS_DEVICE void b_index(int e, bool col_major, int& kk, int& c) {
  if (col_major) {
    kk = e % kBK;
    c = e / kBK;
  } else {
    c = e % kBN;
    kk = e / kBN;
  }
}

struct Stage {
  Acc a[kBK][kBM];
  Acc b[kBK][kBN];
};

}  // namespace

extern "C" __global__ void __launch_bounds__(kThreads) gemm_simt(const __grid_constant__ GemmParams p) {
  __shared__ Stage stage[2];
  const int z = blockIdx.z;
  const int m0 = blockIdx.y * kBM;
  const int n0 = blockIdx.x * kBN;
  const In* A = static_cast<const In*>(p.a) + z * p.stride_a;
  const In* B = static_cast<const In*>(p.b) + z * p.stride_b;
  const int tid = ts::thread_id();
  const int tx = tid % kDim;
  const int ty = tid / kDim;
  const bool a_cm = p.a_col_major != 0;
  const bool b_cm = p.b_col_major != 0;

  Acc ra[kLoadA], rb[kLoadB];
  auto fetch = [&](int k0) {
#pragma unroll
    for (int i = 0; i < kLoadA; ++i) {
      int r, kk;
      a_index(tid + i * kThreads, a_cm, r, kk);
      const int m = m0 + r, k = k0 + kk;
      ra[i] = Acc(0);
      if (m < p.m && k < p.k) ra[i] = ts::gemm_load_as<Acc>(a_cm ? A[(long long)k * p.lda + m] : A[(long long)m * p.lda + k]);
    }
#pragma unroll
    for (int i = 0; i < kLoadB; ++i) {
      int kk, c;
      b_index(tid + i * kThreads, b_cm, kk, c);
      const int n = n0 + b_tile_col(c), k = k0 + kk;
      rb[i] = Acc(0);
      if (n < p.n && k < p.k) rb[i] = ts::gemm_load_as<Acc>(b_cm ? B[(long long)n * p.ldb + k] : B[(long long)k * p.ldb + n]);
    }
  };
  auto store = [&](Stage& s) {
#pragma unroll
    for (int i = 0; i < kLoadA; ++i) {
      int r, kk;
      a_index(tid + i * kThreads, a_cm, r, kk);
      s.a[kk][r] = ra[i];
    }
#pragma unroll
    for (int i = 0; i < kLoadB; ++i) {
      int kk, c;
      b_index(tid + i * kThreads, b_cm, kk, c);
      s.b[kk][c] = rb[i];
    }
  };

  Acc acc[kTM][kTM];
#pragma unroll
  for (int i = 0; i < kTM; ++i)
#pragma unroll
    for (int j = 0; j < kTM; ++j) acc[i][j] = Acc(0);

  const int k_tiles = (p.k + kBK - 1) / kBK;
  if (k_tiles > 0) {
    fetch(0);
    store(stage[0]);
    __syncthreads();
  }
  for (int kt = 0; kt < k_tiles; ++kt) {
    const bool more = kt + 1 < k_tiles;
    if (more) fetch((kt + 1) * kBK);  // global loads in flight during the FMAs below
    const Stage& s = stage[kt & 1];
#pragma unroll
    for (int kk = 0; kk < kBK; ++kk) {
      Acc av[kTM], bv[kTM];
#pragma unroll
      for (int i = 0; i < kTM; ++i) av[i] = s.a[kk][ty + kDim * i];
#pragma unroll
      for (int j = 0; j < kTM; ++j) bv[j] = s.b[kk][tx + kDim * j];
#pragma unroll
      for (int i = 0; i < kTM; ++i)
#pragma unroll
        for (int j = 0; j < kTM; ++j) acc[i][j] = gemm_fma(av[i], bv[j], acc[i][j]);
    }
    if (more) {
      // the other stage was last read in iteration kt - 1, before the barrier that ended it
      store(stage[(kt + 1) & 1]);
      __syncthreads();
    }
  }

  if constexpr (kGlu) {
    // acc[i][2q] and acc[i][2q + 1]: gate and up of output column n0 / 2 + tx + 16 q
#pragma unroll
    for (int i = 0; i < kTM; ++i)
#pragma unroll
      for (int q = 0; q < kTM / 2; ++q) {
        const int row = m0 + ty + kDim * i;
        const int col = n0 / 2 + tx + kDim * q;
        if (row < p.m && 2 * col + 1 < p.n) ts::gemm_store_glu<Out, Acc>(p, z, row, col, acc[i][2 * q], acc[i][2 * q + 1]);
      }
  } else {
#pragma unroll
    for (int i = 0; i < kTM; ++i)
#pragma unroll
      for (int j = 0; j < kTM; ++j) {
        const int row = m0 + ty + kDim * i;
        const int col = n0 + tx + kDim * j;
        if (row < p.m && col < p.n) ts::gemm_store<Out, Acc>(p, z, row, col, acc[i][j]);
      }
  }
}
