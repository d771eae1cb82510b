// tessera/gemm_epilogue.cuh: the fused GEMM epilogue shared by every GEMM kernel (sm_80
// mma.sync, SIMT, skinny, DMMA and the sm_90a wgmma kernel). Handed to NVRTC as the named header
// "tessera/gemm_epilogue.cuh" (gemm::DEVICE_HEADERS); header-free like src/cuda/.
//
// Defines (global namespace, every name prefixed gemm_/kGemm; also reachable as ts::gemm_epilogue,
//          ts::kActRelu, ...):
//          kGemmActNone .. kGemmActSilu (activation codes, = gemm::Activation::code() in Rust),
//          gemm_activate<kActivation>(x),
//          gemm_epilogue<kActivation, kHasBias, kHasC, kHasResidual>(acc, alpha, beta, c, bias,
//          residual).
//
// Order (cuBLASLt's, and the CPU reference's in gemm/reference.rs):
//     d = act(alpha * acc + beta * c + bias) + residual
// i.e. the bias is added before the activation and the residual after it; a term whose flag is
// false is absent (not added as zero, so -0 and NaN/Inf behave as if it did not exist). `acc` is
// the f32 accumulator of sum_k A[m,k] B[k,n]; `c` is C[m,n] and `residual` R[m,n] converted to
// f32, `bias` is bias[n] (one value per output column). The caller converts d to the output type.
//
// Activations, all in f32 and NaN-propagating (a NaN input gives a NaN output):
//   1 relu       x < 0 ? 0 : x                      (NaN < 0 is false, so NaN passes through)
//   2 gelu_erf   0.5 x (1 + erf(x / sqrt 2))        (torch gelu(approximate='none'))
//   3 gelu_tanh  0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))   (approximate='tanh')
//   4 silu       x / (1 + exp(-x))                  (x sigmoid(x); -0 for x -> -inf ... -88)
// erff/tanhf/expf are NVRTC's built-in device math (full precision, not the __ intrinsics).
#pragma once
#include "tessera/common.cuh"

constexpr int kGemmActNone = 0;
constexpr int kGemmActRelu = 1;
constexpr int kGemmActGeluErf = 2;
constexpr int kGemmActGeluTanh = 3;
constexpr int kGemmActSilu = 4;

/// sqrt(1/2) and sqrt(2/pi), rounded to f32.
constexpr float kGemmSqrtHalf = 0.70710678118654752f;
constexpr float kGemmSqrt2OverPi = 0.79788456080286536f;
constexpr float kGemmGeluTanhCubic = 0.044715f;

/// The activation with code kActivation applied to x (see the table above).
template <int kActivation>
__device__ __forceinline__ float gemm_activate(float x) {
  static_assert(kActivation >= kGemmActNone && kActivation <= kGemmActSilu, "gemm_activate: unknown activation code");
  if constexpr (kActivation == kGemmActNone) {
    return x;
  } else if constexpr (kActivation == kGemmActRelu) {
    return x < 0.0f ? 0.0f : x;
  } else if constexpr (kActivation == kGemmActGeluErf) {
    return 0.5f * x * (1.0f + erff(x * kGemmSqrtHalf));
  } else if constexpr (kActivation == kGemmActGeluTanh) {
    return 0.5f * x * (1.0f + tanhf(kGemmSqrt2OverPi * (x + kGemmGeluTanhCubic * x * x * x)));
  } else {
    return x / (1.0f + expf(-x));
  }
}

/// d = act(alpha * acc + beta * c + bias) + residual, terms absent when their flag is false.
template <int kActivation, bool kHasBias, bool kHasC, bool kHasResidual>
__device__ __forceinline__ float gemm_epilogue(float acc, float alpha, float beta, float c, float bias,
                                               float residual) {
  float x = alpha * acc;
  if constexpr (kHasC) x = fmaf(beta, c, x);
  if constexpr (kHasBias) x += bias;
  float d = gemm_activate<kActivation>(x);
  if constexpr (kHasResidual) d += residual;
  return d;
}

// The same names inside namespace ts, for kernels that spell them ts::gemm_epilogue or ts::kActRelu.
namespace ts {
using ::gemm_activate;
using ::gemm_epilogue;
constexpr int kActNone = kGemmActNone;
constexpr int kActRelu = kGemmActRelu;
constexpr int kActGeluErf = kGemmActGeluErf;
constexpr int kActGeluTanh = kGemmActGeluTanh;
constexpr int kActSilu = kGemmActSilu;
}  // namespace ts
