// tessera/gemm_params.cuh: the launch parameters of the non-Hopper GEMM kernels (sm_80 mma.sync,
// SIMT, DMMA, skinny and its split-K reduction) and the epilogue store they share. Mirrored by
// `GemmParams` in gemm/plan.rs (#[repr(C)], 240 bytes).
//
// Indexing: element (row, col) of batch entry z of a matrix X is X[z * stride_x + row * ldx + col]
// with 64-bit offsets (so only M, N, K and the grid need 32-bit ints). A column-major A (B) is
// indexed as its row-major transpose (k * lda + m; n * ldb + k).
//
// The epilogue terms are run-time flags of the launch, uniform over the grid (a branch that every
// thread takes the same way), and the activation a run-time code dispatched to the templates of
// gemm_epilogue.cuh: one kernel variant serves every epilogue. Absent terms enter as zeros added
// (alpha * acc + 0 * 0 + 0), which differs from leaving them out only in the sign of a zero.
// Kernels built with kGlu (a compile-time flag of their preamble) run the GLU epilogue instead
// (gemm_store_glu): there p.n counts B's 2N columns, D has N = p.n / 2, p.activation is the
// gate's activation.
#pragma once
#include "tessera/common.cuh"
#include "tessera/dtype.cuh"
#include "tessera/gemm_epilogue.cuh"

struct GemmParams {
  const void* a;
  const void* b;
  const void* c;         // C, or D itself (in place); nullptr when !has_c
  const void* bias;      // [N], D's dtype
  const void* residual;  // like D
  void* d;
  float* workspace;      // split-K partials [splits][batch][M][N] (skinny path)
  long long lda, ldb, ldc, ldr, ldd;
  long long stride_a, stride_b, stride_c, stride_r, stride_d;
  double alpha, beta;
  int m, n, k, batch;
  int a_col_major, b_col_major;  // run-time layouts (SIMT, DMMA); the sm80 kernel's are constants
  int activation, has_c, has_bias, has_residual;
  int splits, k_per_split;       // skinny split-K: CTAs along K and the K range of each
  // 8-bit operands (sm80 kernel): dequantisation scales, each null = 1
  const float* scale_a;       // [1] or [M] (scale_a_rows)
  const float* scale_b;       // [1] or [N] (scale_b_cols)
  const float* scale_result;  // fp8 Out: D = fp8(scale_result * d); null = 1
  float* amax;                // fp8 Out: max |d| over D raised by atomics (zeroed by the plan), or null
  int scale_a_rows;           // 1: scale_a[row], 0: scale_a[0]
  int scale_b_cols;           // 1: scale_b[col], 0: scale_b[0]
};
static_assert(sizeof(GemmParams) == 240, "GemmParams layout (plan.rs)");

namespace ts {

/// x as the accumulate type Acc (float or double).
template <typename Acc, typename T>
TS_DEVICE Acc gemm_load_as(T x) {
  if constexpr (is_same_v<Acc, double>) {
    if constexpr (is_same_v<T, double>) return x;
    else return (double)to_float(x);
  } else {
    return to_float(x);
  }
}

/// act(alpha acc + beta c + bias) + residual with the activation chosen at run time.
template <typename Acc>
TS_DEVICE Acc gemm_epilogue_rt(int activation, Acc acc, Acc alpha, Acc beta, Acc c, Acc bias, Acc residual) {
  switch (activation) {
    case kGemmActRelu:
      return gemm_epilogue_t<kGemmActRelu, true, true, true, Acc>(acc, alpha, beta, c, bias, residual);
    case kGemmActGeluErf:
      return gemm_epilogue_t<kGemmActGeluErf, true, true, true, Acc>(acc, alpha, beta, c, bias, residual);
    case kGemmActGeluTanh:
      return gemm_epilogue_t<kGemmActGeluTanh, true, true, true, Acc>(acc, alpha, beta, c, bias, residual);
    case kGemmActSilu:
      return gemm_epilogue_t<kGemmActSilu, true, true, true, Acc>(acc, alpha, beta, c, bias, residual);
    default:
      return gemm_epilogue_t<kGemmActNone, true, true, true, Acc>(acc, alpha, beta, c, bias, residual);
  }
}

/// The GLU epilogue with the gate activation chosen at run time (gemm_epilogue.cuh's gemm_glu_t;
/// absent biases enter as zeros).
template <typename Acc>
TS_DEVICE Acc gemm_glu_rt(int activation, Acc gate, Acc up, Acc alpha, Acc bias_gate, Acc bias_up) {
  switch (activation) {
    case kGemmActGeluErf: return gemm_glu_t<kGemmActGeluErf, true, Acc>(gate, up, alpha, bias_gate, bias_up);
    case kGemmActGeluTanh: return gemm_glu_t<kGemmActGeluTanh, true, Acc>(gate, up, alpha, bias_gate, bias_up);
    case kGemmActSilu: return gemm_glu_t<kGemmActSilu, true, Acc>(gate, up, alpha, bias_gate, bias_up);
    default: return gemm_glu_t<kGemmActNone, true, Acc>(gate, up, alpha, bias_gate, bias_up);
  }
}

/// The GLU form of gemm_store (kernels built with kGlu): `gate` and `up` are the accumulators
/// of B columns 2 col and 2 col + 1, D's column is `col`. With a GLU, p.n counts B's columns
/// (2N) and D has p.n / 2; the caller has checked row < m and 2 col + 1 < p.n. The bias has 2N
/// values (interleaved like B); C and R do not exist (the plan refuses them).
template <typename Out, typename Acc>
TS_DEVICE void gemm_store_glu(const GemmParams& p, int z, int row, int col, Acc gate, Acc up) {
  Acc bg = Acc(0), bu = Acc(0);
  if (p.has_bias) {
    bg = gemm_load_as<Acc>(static_cast<const Out*>(p.bias)[2 * col]);
    bu = gemm_load_as<Acc>(static_cast<const Out*>(p.bias)[2 * col + 1]);
  }
  const Acc d = gemm_glu_rt<Acc>(p.activation, gate, up, Acc(p.alpha), bg, bu);
  Out* out = static_cast<Out*>(p.d) + z * p.stride_d + (long long)row * p.ldd + col;
  if constexpr (is_same_v<Acc, double>) *out = d;
  else *out = from_float<Out>(d);
}

/// The epilogue's value for the accumulator of D[z][row][col] (before the cast to Out). The
/// caller has checked row < m and col < n. C, bias and R (Out elements) are read only when their
/// flag is set.
template <typename Out, typename Acc>
TS_DEVICE Acc gemm_value(const GemmParams& p, int z, int row, int col, Acc acc) {
  const Acc zero = Acc(0);
  Acc c = zero, bias = zero, res = zero;
  if (p.has_c) c = gemm_load_as<Acc>(static_cast<const Out*>(p.c)[z * p.stride_c + row * p.ldc + col]);
  if (p.has_bias) bias = gemm_load_as<Acc>(static_cast<const Out*>(p.bias)[col]);
  if (p.has_residual) res = gemm_load_as<Acc>(static_cast<const Out*>(p.residual)[z * p.stride_r + row * p.ldr + col]);
  const Acc beta = p.has_c ? Acc(p.beta) : zero;
  return gemm_epilogue_rt<Acc>(p.activation, acc, Acc(p.alpha), beta, c, bias, res);
}

/// Applies the epilogue to the accumulator of D[z][row][col] and stores it as Out. The caller
/// has checked row < m and col < n. C may be D itself (this thread reads the element before
/// writing it).
template <typename Out, typename Acc>
TS_DEVICE void gemm_store(const GemmParams& p, int z, int row, int col, Acc acc) {
  const Acc d = gemm_value<Out, Acc>(p, z, row, col, acc);
  Out* out = static_cast<Out*>(p.d) + z * p.stride_d + (long long)row * p.ldd + col;
  if constexpr (is_same_v<Acc, double>) *out = d;
  else *out = from_float<Out>(d);
}

}  // namespace ts
