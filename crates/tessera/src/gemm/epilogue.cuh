// epilogue.cuh: the fused GEMM epilogue shared by every GEMM kernel (the contract of issue 47).
//
// PLACEHOLDER of the Hopper worktree: an identical-signature copy of the core engineer's header
// (gemm-core owns gemm/epilogue.cuh); the lead replaces it with theirs at merge.
//
// Defines: ts::gemm_activate<kActivation>(x), ts::gemm_epilogue<kActivation, kHasBias, kHasC,
//          kHasResidual>(acc, alpha, beta, c, bias, residual)
//          = act(alpha * acc + beta * c + bias) + residual, in f32.
// Activation codes: 0 none, 1 relu, 2 gelu (erf), 3 gelu (tanh approximation), 4 silu.
#pragma once

#include "tessera/common.cuh"

namespace ts {

constexpr int kActNone = 0;
constexpr int kActRelu = 1;
constexpr int kActGeluErf = 2;
constexpr int kActGeluTanh = 3;
constexpr int kActSilu = 4;

/// The activation `kActivation` of x (f32). NaN propagates through every one of them.
template <int kActivation>
__device__ __forceinline__ float gemm_activate(float x) {
  if constexpr (kActivation == kActRelu) {
    return x > 0.0f ? x : (x != x ? x : 0.0f);
  } else if constexpr (kActivation == kActGeluErf) {
    return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
  } else if constexpr (kActivation == kActGeluTanh) {
    const float u = 0.79788456080286536f * (x + 0.044715f * x * x * x);  // sqrt(2/pi) (x + 0.044715 x^3)
    return 0.5f * x * (1.0f + tanhf(u));
  } else if constexpr (kActivation == kActSilu) {
    return x / (1.0f + expf(-x));
  } else {
    static_assert(kActivation == kActNone, "gemm_activate: code 0..4");
    return x;
  }
}

/// act(alpha * acc + beta * c + bias) + residual; the inputs a variant does not have are not read.
template <int kActivation, bool kHasBias, bool kHasC, bool kHasResidual>
__device__ __forceinline__ float gemm_epilogue(float acc, float alpha, float beta, float c, float bias,
                                               float residual) {
  float v = alpha * acc;
  if constexpr (kHasC) v = fmaf(beta, c, v);
  if constexpr (kHasBias) v += bias;
  v = gemm_activate<kActivation>(v);
  if constexpr (kHasResidual) v += residual;
  return v;
}

}  // namespace ts
