// gemm_simt.cu: register-tiled GEMM on the CUDA cores, for exact fp32 (no tf32), fp64 where
// DMMA is absent, and fp16/bf16 operands that miss the tensor-core path's alignment rule.
//
//   D[z] = act(alpha * A[z] @ B[z] + beta * C[z] + bias) + R[z]   (gemm_params.cuh)
//   In = float, double, ts::f16 or ts::bf16; Acc = float (double for double); Out any storage type.
//   A row-major or column-major, B [K, N] or [N, K] (run-time flags: only the global-load index
//   order depends on them); no alignment rule (scalar loads).
//
// 256 threads as 16 x 16, each computing a kTM x kTM block of D: CTA tile kBM = kBN = 16 kTM
// (128 for kTM = 8, float accumulate; 64 for kTM = 4, double) by kBK = 8, two CTAs per SM (at
// most 128 registers a thread: without the bound ptxas took 168 on sm_8x). Shared memory: two
// stages of A^T [kBK][kBM] and B [kBK][kBN] in Acc (16 KiB for float, 16 KiB for double);
// the next tile's elements wait in registers while the current one is multiplied (one
// __syncthreads per K tile). Thread (ty, tx) owns kTM / 4 fragments of 4 consecutive rows,
// 64 ty.. apart: rows 4 ty + 64 f + 0..3 (frag_index), and the same for columns with tx, so
// each k step reads its A and B values as 16-byte vectors (LDS.128: a quarter of the shared
// load instructions of one scalar load per value, which left the FMA pipe short of issue
// slots); the 16 threads of a half-warp read 256 consecutive bytes of B. On sm_8x a thread owns
// rows ty + 16 i and columns tx + 16 j with scalar loads (see kVectorFrags).
//
// Loads are ordered along the operand's contiguous dimension (coalesced); elements past M, N or
// K load as zero. Grid (N tiles, M tiles, batch).
//
// GLU variant (kGlu, gemm::Glu): p.n counts B's 2N columns (gate 2j, up 2j + 1), D has N = p.n / 2.
// The CTA still multiplies kBN columns of B; a thread's column pair (j = 2q, 2q + 1) holds the
// gate and up of one output column: with vector fragments two consecutive tile columns c, c + 1
// (c even), output column (n0 + c) / 2; on sm_8x B's columns are permuted in shared memory to
// the same effect (b_tile_col). The CTA writes kBN / 2 output columns (grid over 2N / kBN B
// tiles, as without a GLU).
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

constexpr int kFrag = 4;  // consecutive rows (columns) of one thread fragment
static_assert(kTM % kFrag == 0, "whole fragments per thread");

// sm_90: the vector fragments of the header. sm_8x keeps the strided ownership (rows ty + 16 i,
// scalar shared loads): the vector form needs a few more registers, and ptxas spills the fp32
// operand variants there at the 128 registers that two CTAs per SM allow.
#if __CUDA_ARCH__ >= 900
constexpr bool kVectorFrags = true;
#else
constexpr bool kVectorFrags = false;
#endif

/// Tile row (column) of a thread's element i (0..kTM) for thread coordinate t (ty or tx):
/// fragment i / 4 of 4 consecutive rows at 4 t + 64 f (sm_90), or t + 16 i (sm_8x).
TS_DEVICE int frag_index(int t, int i) {
  if constexpr (kVectorFrags) return (i / kFrag) * (kDim * kFrag) + t * kFrag + i % kFrag;
  else return t + kDim * i;
}

/// The tile column of B that shared-memory column `c` holds: `c` itself, or with a GLU on sm_8x
/// the permutation that puts the gate and up of one output column in a thread's column pair
/// (strided ownership: shared columns tx + 16 (2q) and tx + 16 (2q + 1) hold B columns
/// 2 (tx + 16 q) and 2 (tx + 16 q) + 1). With vector fragments a pair is already two
/// consecutive columns.
TS_DEVICE int b_tile_col(int c) {
  if constexpr (kGlu && !kVectorFrags) return 2 * ((c % kDim) + kDim * (c / (2 * kDim))) + (c / kDim) % 2;
  else return c;
}

/// Output column (of N = p.n / 2) of a thread's GLU pair q (elements 2q, 2q + 1) in the tile at n0.
TS_DEVICE int glu_out_col(int n0, int tx, int q) {
  if constexpr (kVectorFrags) return (n0 + frag_index(tx, 2 * q)) / 2;
  else return n0 / 2 + tx + kDim * q;
}

/// A thread's kTM values in shared row `row` (frag_index order), for the k step's multiply:
/// 16-byte vector loads (4 floats, or 2 x 2 doubles) with vector fragments.
TS_DEVICE void load_frag(const Acc* row, int t, Acc (&out)[kTM]) {
  if constexpr (!kVectorFrags) {
#pragma unroll
    for (int i = 0; i < kTM; ++i) out[i] = row[frag_index(t, i)];
    return;
  }
#pragma unroll
  for (int f = 0; f < kTM / kFrag; ++f) {
    const Acc* at = row + f * (kDim * kFrag) + t * kFrag;
    if constexpr (ts::is_same_v<Acc, float>) {
      const float4 v = *reinterpret_cast<const float4*>(at);
      out[f * kFrag + 0] = v.x;
      out[f * kFrag + 1] = v.y;
      out[f * kFrag + 2] = v.z;
      out[f * kFrag + 3] = v.w;
    } else {
      const double2 v0 = *reinterpret_cast<const double2*>(at);
      const double2 v1 = *reinterpret_cast<const double2*>(at + 2);
      out[f * kFrag + 0] = v0.x;
      out[f * kFrag + 1] = v0.y;
      out[f * kFrag + 2] = v1.x;
      out[f * kFrag + 3] = v1.y;
    }
  }
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

struct __align__(16) Stage {
  Acc a[kBK][kBM];
  Acc b[kBK][kBN];
};

}  // namespace

extern "C" __global__ void __launch_bounds__(kThreads, 2) gemm_simt(const __grid_constant__ GemmParams p) {
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
      load_frag(s.a[kk], ty, av);
      load_frag(s.b[kk], tx, bv);
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
    // acc[i][2q] and acc[i][2q + 1]: tile columns c, c + 1 (c even), the gate and up of
    // output column (n0 + c) / 2
#pragma unroll
    for (int i = 0; i < kTM; ++i)
#pragma unroll
      for (int q = 0; q < kTM / 2; ++q) {
        const int row = m0 + frag_index(ty, i);
        const int col = glu_out_col(n0, tx, q);
        if (row < p.m && 2 * col + 1 < p.n) ts::gemm_store_glu<Out, Acc>(p, z, row, col, acc[i][2 * q], acc[i][2 * q + 1]);
      }
  } else {
#pragma unroll
    for (int i = 0; i < kTM; ++i)
#pragma unroll
      for (int j = 0; j < kTM; ++j) {
        const int row = m0 + frag_index(ty, i);
        const int col = n0 + frag_index(tx, j);
        if (row < p.m && col < p.n) ts::gemm_store<Out, Acc>(p, z, row, col, acc[i][j]);
      }
  }
}
